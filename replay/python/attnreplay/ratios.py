"""attnreplay-py ratios: other runs of a trace against a base run, per step, by step kind.

    attnreplay-py ratios DB [--base RUN] [--run RUN ...] [--runs-in DB2] [--parts NAMES] [--by-context] [--text]

The base is a run of DB (default: its newest run); the compared runs are read from DB2 when it
is given (a peer's database of the same trace), from DB otherwise, by default every run of the
base's trace there.  Each must have replayed the same trace (trace_hash) with the same number of
layers.  Steps are paired by step number when both runs timed them (time_us > 0) and neither
failed verification (pass = 0; steps that were never verified are kept); ratio = time_us(run) /
time_us(base), so below 1 means the run was faster on that step.  --parts attn,combine (names of
the timed marks in the kernels table, comma-separated) times each step by the sum of those marks
over its layers instead, on both sides, so that a backend whose step holds more than the attention
(cuda-mla's absorption and W_UV products, a cache write) is compared on the same work as an adapter
that times its kernel alone; a step with none of the marks is not paired.  Steps are grouped by the
base's step kind: decode (no request in its prompt), prefill (no decoding request), mixed, and
cascade (either run took the cascade path on that step), then all; --by-context splits each kind
by the base step's total context (the keys its requests attend to: under 16k, 16k-128k, 128k-256k,
256k-512k, 512k and up), where a real trace's steps of one kind differ most (a decode step of one
long request among short ones against one of sixty medium ones).  Printed as a Markdown table
(--text: aligned columns): steps paired, the total-time ratio, median, p10 and p90 of the
per-step ratios, the share of steps the run won, the steps both timed that failed verification
on each side, and for adapters that gather K/V first the gather's share of their time.  The
databases are only read.  Exit codes: 0 table printed; 2 bad input (a missing or unreadable
database, a directory, one of a newer schema version, one another process keeps locked past
ATTNREPLAY_BUSY_TIMEOUT_MS - default 30000 ms, as the attnreplay commands wait -, no such run,
another trace or layer count, no step to pair); 3 the table could not be written (stdout full
or closed).
"""
import argparse
import os
import re
import sqlite3
import sys
import urllib.parse

KINDS = ("decode", "prefill", "mixed", "cascade")
# --by-context: (upper bound in keys, exclusive; label) of each band of a step's total context
CONTEXT_BANDS = ((16384, "<16k"), (131072, "16k-128k"), (262144, "128k-256k"), (524288, "256k-512k"),
                 (None, ">=512k"))


def context_band(total_context):
    """The --by-context label of a step's total context (keys; none recorded counts as 0)."""
    for limit, label in CONTEXT_BANDS[:-1]:
        if (total_context or 0) < limit:
            return label
    return CONTEXT_BANDS[-1][1]


PROG = "attnreplay-py ratios"


class InputError(Exception):
    pass


def step_kind(prefill, decode, cascade):
    """The kind of a step from its request counts and whether cascade ran it."""
    if cascade:
        return "cascade"
    if prefill == 0:
        return "decode"
    if decode == 0:
        return "prefill"
    return "mixed"


def quantile(sorted_vals, q):
    """Linear-interpolated quantile of an ascending list (q in [0, 1])."""
    if not sorted_vals:
        return float("nan")
    pos = q * (len(sorted_vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


# the results database's schema version this package reads (AR_DB_SCHEMA_VERSION, replay/db_version.h)
SCHEMA_VERSION = 4


class Rows(list):
    """A query's rows, read whole (so that an error reading them is the query's)."""

    def fetchone(self):
        return self[0] if self else None

    def fetchall(self):
        return list(self)


def busy_timeout_ms():
    """How long a connection waits for another connection's lock, in ms, as the attnreplay commands
    wait (replay/db_lock.h): ATTNREPLAY_BUSY_TIMEOUT_MS when it is an integer 0..86400000, else 30000."""
    text = os.environ.get("ATTNREPLAY_BUSY_TIMEOUT_MS", "")
    if re.fullmatch(r"[ \t\n\v\f\r]*[+-]?[0-9]+", text) and 0 <= int(text) <= 86400000:
        return int(text)
    return 30000


def lock_error(path, e):
    """For an sqlite3.Error that is another connection's lock held past the busy timeout
    (SQLITE_BUSY 5 or SQLITE_LOCKED 6), an InputError in the attnreplay commands' words; else None."""
    code = getattr(e, "sqlite_errorcode", None)   # Python 3.11 on; before it, SQLite's words
    if not ((code & 0xff) in (5, 6) if code is not None else "database is locked" in str(e)):
        return None
    return InputError("%s: the database is locked by another connection's write (waited %d ms; "
                      "ATTNREPLAY_BUSY_TIMEOUT_MS sets the wait)" % (path, busy_timeout_ms()))


class Database(sqlite3.Connection):
    """A connection whose queries raise InputError naming the file instead of sqlite3.Error (a
    table or column missing, a damaged page, a lock held past the busy timeout)."""
    path = None

    def execute(self, sql, params=()):
        try:
            return Rows(super().execute(sql, params).fetchall())
        except sqlite3.Error as e:
            raise lock_error(self.path, e) or InputError("%s: cannot be read as an attnreplay database (%s)"
                                                         % (self.path, e)) from None


def _connect(path, immutable):
    """A read-only connection to path, the tables ratios reads checked (sqlite3.Error if not)."""
    # through a URI, the path percent-encoded: '?', '#' and '%' are part of the name
    uri = "file:%s?mode=ro%s" % (urllib.parse.quote(os.path.abspath(path)), "&immutable=1" if immutable else "")
    con = sqlite3.connect(uri, uri=True, factory=Database, timeout=busy_timeout_ms() / 1000)
    con.path = path
    check = sqlite3.Connection.execute   # sqlite3.Error here: not ours at all
    check(con, "SELECT count(*) FROM steps").fetchone()
    check(con, "SELECT id, trace, trace_hash, backend, device, layers, status FROM runs LIMIT 1").fetchall()
    return con


def open_db(path):
    """A read-only connection to the attnreplay results database at path, or InputError naming it:
    missing, a directory or another file that is not a regular one, not SQLite or not ours, or of
    a newer schema version."""
    if os.path.isdir(path):
        raise InputError("%s: a directory, not an attnreplay database" % path)
    if not os.path.exists(path):
        raise InputError("%s: no such file" % path)
    if not os.path.isfile(path):   # a FIFO would hold the open until a writer came
        raise InputError("%s: not a regular file, not an attnreplay database" % path)
    try:
        con = _connect(path, immutable=False)
    except sqlite3.Error as e:
        locked = lock_error(path, e)
        if locked:
            raise locked from None
        # SQLite reads a database in WAL mode (ours) only where it can make the -shm file beside
        # it; in a directory this process cannot write, a database without a write-ahead log
        # left beside it (a finished run's) is read as immutable
        wal = path + "-wal"
        if "unable to open" not in str(e) or not os.access(path, os.R_OK):
            raise InputError("%s: not an attnreplay database (%s)" % (path, e))
        if os.path.exists(wal) and os.path.getsize(wal) > 0:
            raise InputError("%s: cannot be read where it is: its write-ahead log %s is beside it and SQLite "
                             "cannot make %s-shm there (%s); copy both to a writable directory"
                             % (path, os.path.basename(wal), os.path.basename(path), e))
        try:
            con = _connect(path, immutable=True)
        except sqlite3.Error:
            raise InputError("%s: not an attnreplay database (%s)" % (path, e))
    check = sqlite3.Connection.execute   # the plain query, raising sqlite3.Error
    try:   # no meta table, or no version in it: version 1
        row = check(con, "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0]) if row else 1
    except (sqlite3.Error, ValueError, TypeError):
        version = 1
    if version > SCHEMA_VERSION:
        raise InputError("%s: schema version %d is newer than this attnreplay's %d" % (path, version, SCHEMA_VERSION))
    return con


RUN_COLS = ("id", "trace", "trace_hash", "backend", "device", "layers", "status")


def get_run(con, path, run_id):
    """The run `run_id` of the database (None: its newest) as a dict of RUN_COLS."""
    cols = ", ".join(RUN_COLS)
    if run_id is None:
        row = con.execute("SELECT %s FROM runs ORDER BY id DESC LIMIT 1" % cols).fetchone()
    else:
        row = con.execute("SELECT %s FROM runs WHERE id = ?" % cols, (run_id,)).fetchone()
    if row is None:
        raise InputError("%s: %s" % (path, "no runs" if run_id is None else "no run %d" % run_id))
    return dict(zip(RUN_COLS, row))


def load_steps(con, run, parts=None):
    """{step: (num_prefill_reqs, num_decode_reqs, cascade, time_us, pass, total_context)} of the
    run's timed steps; with parts (mark names), time_us is the sum of those marks over the step's
    layers."""
    if not parts:
        return {r[0]: r[1:] for r in con.execute(
            "SELECT step, num_prefill_reqs, num_decode_reqs, cascade, time_us, pass, total_context FROM steps "
            "WHERE run = ? AND time_us > 0", (run,))}
    marks = ", ".join("?" * len(parts))
    return {r[0]: r[1:] for r in con.execute(
        "SELECT s.step, s.num_prefill_reqs, s.num_decode_reqs, s.cascade, k.t, s.pass, s.total_context FROM steps s "
        "JOIN (SELECT step, sum(time_us) AS t FROM kernels WHERE run = ? AND layer >= 0 AND name IN (%s) "
        "GROUP BY step) k ON k.step = s.step WHERE s.run = ? AND s.time_us > 0 AND k.t > 0" % marks,
        (run, *parts, run))}


def ratio_rows(base_steps, run_steps, by_context=False):
    """Rows (kind, paired, total, median, p10, p90, wins, failed_base, failed_run) for each kind with
    steps (by_context: each kind and band of the base step's total context, "decode <16k"), then
    'all'.  total = sum of the run's times / sum of the base's over the paired steps."""
    bands = [label for _, label in CONTEXT_BANDS] if by_context else [None]
    groups_of = [k if b is None else "%s %s" % (k, b) for k in KINDS for b in bands]
    groups = {g: [] for g in groups_of}
    failed = {g: [0, 0] for g in groups_of}
    for step, b in base_steps.items():
        r = run_steps.get(step)
        if r is None:
            continue
        kind = step_kind(b[0], b[1], b[2] or r[2])
        if by_context:
            kind = "%s %s" % (kind, context_band(b[5]))
        if b[4] == 0 or r[4] == 0:
            failed[kind][0] += b[4] == 0
            failed[kind][1] += r[4] == 0
            continue
        groups[kind].append((r[3] / b[3], b[3], r[3]))
    rows = []
    for kind in groups_of + ["all"]:
        items = [x for g in groups_of for x in groups[g]] if kind == "all" else groups[kind]
        fb = sum(failed[g][0] for g in groups_of) if kind == "all" else failed[kind][0]
        fr = sum(failed[g][1] for g in groups_of) if kind == "all" else failed[kind][1]
        if not items and not (fb or fr):
            continue
        v = sorted(x[0] for x in items)
        total = sum(x[2] for x in items) / sum(x[1] for x in items) if items else float("nan")
        wins = sum(1 for x in v if x < 1.0) / len(v) if v else float("nan")
        rows.append((kind, len(v), total, quantile(v, 0.5), quantile(v, 0.1), quantile(v, 0.9), wins, fb, fr))
    return rows


def gather_share(con, run):
    """The share of the run's timed marks that went to a 'gather' (K/V copied out of the paged
    cache by an adapter before its kernel), or None."""
    total, gather = con.execute(
        "SELECT sum(time_us), sum(CASE WHEN name='gather' THEN time_us ELSE 0 END) FROM kernels "
        "WHERE run=? AND layer >= 0", (run,)).fetchone()
    return (gather / total) if total and gather else None


def compare(db, base_id=None, run_ids=None, runs_db=None, parts=None, by_context=False):
    """(base run, [(run, rows, gather share)]) or InputError; parts: the marks a step's time sums
    (None: the step's whole time); by_context: the rows by kind and context band."""
    con = open_db(db)
    base = get_run(con, db, base_id)
    other_path = runs_db or db
    other = open_db(runs_db) if runs_db else con
    if run_ids:
        runs = [get_run(other, other_path, r) for r in run_ids]
    else:
        ids = [r for (r,) in other.execute("SELECT id FROM runs WHERE trace_hash = ? ORDER BY id",
                                           (base["trace_hash"],))
               if runs_db or r != base["id"]]
        if not ids:
            raise InputError("%s: no other run of the base's trace (%s)" % (other_path, base["trace"]))
        runs = [get_run(other, other_path, r) for r in ids]
    base_steps = load_steps(con, base["id"], parts)
    if parts and not base_steps:
        raise InputError("%s run %d: no timed step has any of the marks %s" % (db, base["id"], ",".join(parts)))
    out = []
    for run in runs:
        where = "%s run %d" % (other_path, run["id"])
        if run["trace_hash"] != base["trace_hash"]:
            raise InputError("%s (%s) replayed another trace than the base, %s run %d (%s): trace_hash differs"
                             % (where, run["trace"], db, base["id"], base["trace"]))
        if run["layers"] != base["layers"]:
            raise InputError("%s timed %s layers, the base (%s run %d) %s: per-step times are not comparable"
                             % (where, run["layers"], db, base["id"], base["layers"]))
        rows = ratio_rows(base_steps, load_steps(other, run["id"], parts), by_context)
        if not rows:
            raise InputError("%s and the base (%s run %d): no step timed by both%s" % (
                where, db, base["id"], " with the marks " + ",".join(parts) if parts else ""))
        out.append((run, rows, gather_share(other, run["id"])))
    return base, out


def run_id(text):
    """A run id from the command line: SQLite's rowids are 1 to 2^63 - 1."""
    # digits only, as the C commands read them: int() also takes " 1", "+1" and "1_0"
    value = int(text) if re.fullmatch(r"[0-9]+", text) else 0
    if not 1 <= value < 2 ** 63:
        raise argparse.ArgumentTypeError("%r: not a run id (a whole number from 1 to 2^63 - 1)" % text)
    return value


def mark_names(text):
    """--parts: comma-separated mark names (the kernels table's), none empty."""
    names = text.split(",")
    if not all(n.strip() == n and n for n in names):
        raise argparse.ArgumentTypeError("%r: mark names separated by commas, e.g. attn,combine" % text)
    return names


def main(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("db")
    ap.add_argument("--base", type=run_id, help="run id of DB everything is compared with (default: its newest run)")
    ap.add_argument("--run", type=run_id, action="append",
                    help="run ids to compare (default: every other run of the base's trace)")
    ap.add_argument("--runs-in", metavar="DB2", help="read the compared runs from DB2 (default: DB)")
    ap.add_argument("--parts", type=mark_names, metavar="NAMES",
                    help="time each step by the sum of these timed marks (kernels table), e.g. attn,combine")
    ap.add_argument("--by-context", action="store_true",
                    help="each kind split by the base step's total context (<16k ... >=512k keys)")
    ap.add_argument("--text", action="store_true", help="aligned columns instead of a Markdown table")
    a = ap.parse_args(argv)
    try:
        base, results = compare(a.db, a.base, a.run, a.runs_in, a.parts, a.by_context)
    except InputError as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 2
    timed = ("the marks %s summed over its layers" % ",".join(a.parts)) if a.parts else "its whole time"
    print("Base: %s run %d, %s on %s (%s layers, %s), trace %s. Ratio = time(run) / time(base) per step, a "
          "step timed by %s; < 1 is faster. Steps failed on either side are not paired.\n"
          % (a.db, base["id"], base["backend"], base["device"], base["layers"], base["status"], base["trace"], timed))
    head = ("run", "backend", "kind", "paired", "total", "median", "p10", "p90", "wins", "failed base / run",
            "gather share")
    if a.text:
        print("%5s %-22s %-18s %6s %7s %7s %7s %7s %5s %9s %7s" % (head[:9] + ("failed b/r", "gather")))
    else:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for run, rows, share in results:
        share_s = "%.1f%%" % (100 * share) if share else "-"
        for kind, n, total, med, p10, p90, wins, fb, fr in rows:
            nums = ["%.3f" % x if n else "-" for x in (total, med, p10, p90)]
            wins_s = "%.0f%%" % (100 * wins) if n else "-"
            if a.text:
                print("%5d %-22s %-18s %6d %7s %7s %7s %7s %5s %9s %7s" % (
                    run["id"], run["backend"][:22], kind, n, *nums, wins_s, "%d/%d" % (fb, fr), share_s))
            else:
                print("| %d | %s | %s | %d | %s | %s | %s | %s | %s | %d / %d | %s |" % (
                    # a '|' in the name escaped, so that the row keeps its columns
                    run["id"], run["backend"].replace("|", "\\|"), kind, n, *nums, wins_s, fb, fr, share_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
