"""attnreplay-py ratios: each backend against a base run on the same trace, per step, by step kind.

    attnreplay-py ratios DB --base RUN [--run RUN ...]

For every run (all other runs of the base's trace by default) the steps both runs replayed and
verified as passing are paired by step number; ratio = time_us(run) / time_us(base), so below 1
means the run was faster on that step.  Steps are grouped by the base's step kind: decode (no
request in its prompt), prefill (no decoding request), mixed, and cascade (the base ran the
shared prefix as cascade).  Printed as a Markdown table: steps paired, median and p90 ratio,
the share of steps the run won, and for adapters that gather K/V first, the gather's share of
their time.  The database is only read.
"""
import argparse
import sqlite3
import sys

KINDS = ("decode", "prefill", "mixed", "cascade", "all")


def _kind(prefill, decode, cascade):
    if cascade:
        return "cascade"
    if prefill == 0:
        return "decode"
    if decode == 0:
        return "prefill"
    return "mixed"


def _quantile(sorted_vals, q):
    if not sorted_vals:
        return float("nan")
    pos = q * (len(sorted_vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def table(con, base, runs):
    """Rows (run, backend, kind, steps, median, p90, wins, gather share) for the Markdown table."""
    rows = []
    base_steps = {s: (p, d, c, t) for s, p, d, c, t in con.execute(
        "SELECT step, num_prefill_reqs, num_decode_reqs, cascade, time_us FROM steps "
        "WHERE run=? AND pass=1 AND time_us > 0", (base,))}
    for run in runs:
        backend = con.execute("SELECT backend FROM runs WHERE id=?", (run,)).fetchone()[0]
        ratios = {k: [] for k in KINDS}
        for s, t in con.execute("SELECT step, time_us FROM steps WHERE run=? AND pass=1 AND time_us > 0", (run,)):
            if s not in base_steps:
                continue
            p, d, c, tb = base_steps[s]
            r = t / tb
            ratios[_kind(p, d, c)].append(r)
            ratios["all"].append(r)
        total, gather = con.execute(
            "SELECT sum(time_us), sum(CASE WHEN name='gather' THEN time_us ELSE 0 END) FROM kernels "
            "WHERE run=? AND layer >= 0", (run,)).fetchone()
        share = (gather / total) if total and gather else None
        for k in KINDS:
            v = sorted(ratios[k])
            if not v:
                continue
            wins = sum(1 for x in v if x < 1.0) / len(v)
            rows.append((run, backend, k, len(v), _quantile(v, 0.5), _quantile(v, 0.9), wins, share))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="attnreplay-py ratios", description=__doc__.split("\n\n")[0])
    ap.add_argument("db")
    ap.add_argument("--base", type=int, required=True, help="run id everything is compared with")
    ap.add_argument("--run", type=int, action="append", help="run ids (default: every other run of the trace)")
    a = ap.parse_args(argv)
    con = sqlite3.connect("file:%s?mode=ro" % a.db, uri=True)
    base = con.execute("SELECT backend, trace_hash, device FROM runs WHERE id=?", (a.base,)).fetchone()
    if not base:
        print("attnreplay-py ratios: %s has no run %d" % (a.db, a.base), file=sys.stderr)
        return 2
    runs = a.run or [r for (r,) in con.execute("SELECT id FROM runs WHERE trace_hash=? AND id != ? ORDER BY id",
                                               (base[1], a.base))]
    for r in runs:
        row = con.execute("SELECT trace_hash FROM runs WHERE id=?", (r,)).fetchone()
        if not row or row[0] != base[1]:
            print("attnreplay-py ratios: run %d is not of the base's trace" % r, file=sys.stderr)
            return 2
    print("Base: run %d, %s on %s. Ratio = time(run) / time(base) per verified step; < 1 is faster.\n"
          % (a.base, base[0], base[2]))
    print("| run | backend | steps | paired | median | p90 | wins | gather share |")
    print("|---|---|---|---|---|---|---|---|")
    for run, backend, kind, n, med, p90, wins, share in table(con, a.base, runs):
        print("| %d | %s | %s | %d | %.3f | %.3f | %.0f%% | %s |" % (
            run, backend, kind, n, med, p90, 100 * wins, "%.1f%%" % (100 * share) if share else "-"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
