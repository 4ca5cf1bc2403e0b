#!/usr/bin/env python3
"""step_ratio.py - per-step speed of our kernels against a peer's on the same trace, from two
attnreplay databases (replay/db.h schema): ours (e.g. --backend cuda) and the peer's (a plugin
adapter's run of the same trace, same layers).

Steps are joined on their step number; a step counts when both runs timed it (time_us > 0).
The ratio of a step is peer time_us / our time_us (above 1: we are faster).  Steps are grouped
by kind: decode-only (no prefill request), prefill-only (no decode request), mixed, and cascade
(either run took the cascade path on that step, whatever its requests).  Printed per kind and in
total: steps, the total-time ratio (sum of peer times / sum of ours), the median, p10 and p90 of
the per-step ratios, and how many steps failed verification on each side.

Usage: step_ratio.py OURS.db PEER.db [--run-a ID] [--run-b ID] [--markdown]
The run defaults to the newest run of each database; both must be of the same trace (same
trace_hash) and the same number of layers.  Two runs of one database: pass it twice with
--run-a / --run-b (`attnreplay diff DB A B` is the regression gate for that case).
Exit codes: 0 table printed, 2 bad input (a missing or unreadable file, no such run, different
traces or layer counts, no step timed by both)."""
import argparse
import os
import sqlite3
import sys

KINDS = ("decode-only", "prefill-only", "mixed", "cascade")


class InputError(Exception):
    pass


def open_db(path):
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        db.execute("select count(*) from steps").fetchone()
    except sqlite3.Error as e:
        raise InputError(f"{path}: not an attnreplay database ({e})")
    return db


def pick_run(db, path, run_id):
    cols = "id, trace, trace_hash, backend, device, layers, status"
    if run_id is None:
        row = db.execute(f"select {cols} from runs order by id desc limit 1").fetchone()
    else:
        row = db.execute(f"select {cols} from runs where id = ?", (run_id,)).fetchone()
    if row is None:
        raise InputError(f"{path}: {'no runs' if run_id is None else f'no run {run_id}'}")
    return dict(zip(("id", "trace", "trace_hash", "backend", "device", "layers", "status"), row))


def load_steps(db, run):
    """{step: (num_prefill_reqs, num_decode_reqs, cascade, time_us, pass)}"""
    return {r[0]: r[1:] for r in db.execute(
        "select step, num_prefill_reqs, num_decode_reqs, cascade, time_us, pass from steps where run = ?",
        (run,))}


def step_kind(prefill_a, decode_a, cascade_a, cascade_b):
    if cascade_a or cascade_b:
        return "cascade"
    if not prefill_a:
        return "decode-only"
    if not decode_a:
        return "prefill-only"
    return "mixed"


def quantile(sorted_vals, q):
    """Linear-interpolated quantile of an ascending list (q in [0, 1])."""
    if not sorted_vals:
        return float("nan")
    pos = q * (len(sorted_vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def ratio_table(steps_a, steps_b):
    """Rows (kind, n, total_ratio, median, p10, p90, failed_a, failed_b) for each kind with
    steps, then 'all'."""
    groups = {k: [] for k in KINDS}
    for step, a in steps_a.items():
        b = steps_b.get(step)
        if b is None:
            continue
        ta, tb = a[3], b[3]
        if not (ta and tb and ta > 0 and tb > 0):
            continue
        groups[step_kind(a[0], a[1], a[2], b[2])].append((tb / ta, ta, tb, a[4] == 0, b[4] == 0))
    rows = []
    everything = [x for k in KINDS for x in groups[k]]
    for kind, items in list(groups.items()) + [("all", everything)]:
        if not items:
            continue
        ratios = sorted(x[0] for x in items)
        rows.append((kind, len(items), sum(x[2] for x in items) / sum(x[1] for x in items),
                     quantile(ratios, 0.5), quantile(ratios, 0.1), quantile(ratios, 0.9),
                     sum(x[3] for x in items), sum(x[4] for x in items)))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description="per-step peer/ours time ratios of two attnreplay databases")
    ap.add_argument("ours")
    ap.add_argument("peer")
    ap.add_argument("--run-a", type=int, default=None, help="run id in OURS (default: newest)")
    ap.add_argument("--run-b", type=int, default=None, help="run id in PEER (default: newest)")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    try:
        db_a, db_b = open_db(args.ours), open_db(args.peer)
        run_a, run_b = pick_run(db_a, args.ours, args.run_a), pick_run(db_b, args.peer, args.run_b)
        if run_a["trace_hash"] != run_b["trace_hash"]:
            raise InputError(f"{args.ours} run {run_a['id']} ({run_a['trace']}) and {args.peer} run {run_b['id']} "
                             f"({run_b['trace']}) replayed different traces (trace_hash differs)")
        if run_a["layers"] != run_b["layers"]:
            raise InputError(f"{args.ours} run {run_a['id']} timed {run_a['layers']} layers, {args.peer} run "
                             f"{run_b['id']} {run_b['layers']}: per-step times are not comparable")
        rows = ratio_table(load_steps(db_a, run_a["id"]), load_steps(db_b, run_b["id"]))
        if not rows:
            raise InputError(f"{args.ours} run {run_a['id']} and {args.peer} run {run_b['id']}: no step timed by both")
    except InputError as e:
        print(f"step_ratio.py: {e}", file=sys.stderr)
        return 2
    print(f"trace {run_a['trace']}, {run_a['layers']} layers; ours: {run_a['backend']} run {run_a['id']} "
          f"({run_a['status']}), peer: {run_b['backend']} run {run_b['id']} ({run_b['status']}), {run_a['device']}")
    print("ratio = peer time / our time per step (above 1: ours faster)")
    head = ("kind", "steps", "total", "median", "p10", "p90", "failed ours", "failed peer")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.2f} | {r[4]:.2f} | {r[5]:.2f} | {r[6]} | {r[7]} |")
    else:
        print(f"{head[0]:13s} {head[1]:>6s} {head[2]:>7s} {head[3]:>7s} {head[4]:>7s} {head[5]:>7s} "
              f"{head[6]:>12s} {head[7]:>12s}")
        for r in rows:
            print(f"{r[0]:13s} {r[1]:6d} {r[2]:7.2f} {r[3]:7.2f} {r[4]:7.2f} {r[5]:7.2f} {r[6]:12d} {r[7]:12d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
