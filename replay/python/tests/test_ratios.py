"""attnreplay-py ratios on real databases: the CPU backend replays sample traces, a copy of the
database plays a peer with its step times scaled by known factors, and the table must show
exactly those ratios, the right step kinds and failure counts; bad input exits 2 naming the file."""
import os
import re
import shutil
import sqlite3
import sys
import unittest
from unittest import mock

from helpers import BIN, SRC, cli, run, sample, tmpdb

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from attnreplay import ratios  # noqa: E402


def replay(db, name, *extra):
    rc, out = run(["replay", sample(name), "--backend", "cpu", "--db", db, "--layers", "1", "--quiet"] + list(extra),
                  cmd=[BIN])
    assert rc == 0, out


def table_rows(out):
    """{(run, kind): [cells]} of a Markdown table printed by ratios."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 11 and cells[0].isdigit():
            rows[(int(cells[0]), cells[2])] = cells
    return rows


@unittest.skipUnless(os.access(BIN, os.X_OK), "%s not built (make)" % BIN)
class Ratios(unittest.TestCase):
    def setUp(self):
        self.mixed = tmpdb(self, "mixed.db")
        replay(self.mixed, "mixed")

    def peer(self, src, sql):
        dst = os.path.join(os.path.dirname(src), "peer.db")
        shutil.copy(src, dst)
        con = sqlite3.connect(dst)
        con.executescript(sql)
        con.commit()
        con.close()
        return dst

    def test_known_ratios_by_kind(self):
        # the peer is 2x slower on decode steps and 4x slower on every other step
        peer = self.peer(self.mixed, "UPDATE steps SET time_us = time_us * "
                                     "(CASE WHEN num_prefill_reqs = 0 THEN 2 ELSE 4 END);")
        base, results = ratios.compare(self.mixed, runs_db=peer)
        self.assertEqual(len(results), 1)
        rows = {r[0]: r for r in results[0][1]}
        con = sqlite3.connect(self.mixed)
        n, n_decode = con.execute("SELECT count(*), sum(num_prefill_reqs = 0) FROM steps WHERE time_us > 0").fetchone()
        self.assertGreater(n_decode, 0)
        self.assertEqual(rows["all"][1], n)
        self.assertEqual(rows["decode"][1], n_decode)
        for q in (2, 3, 4, 5):                      # total, median, p10, p90
            self.assertAlmostEqual(rows["decode"][q], 2.0, places=9)
            self.assertAlmostEqual(rows["mixed"][q], 4.0, places=9)
        self.assertEqual(rows["decode"][6], 0.0)    # the peer won no step
        self.assertEqual(sum(r[1] for k, r in rows.items() if k != "all"), n)
        self.assertNotIn("cascade", rows)
        self.assertTrue(2.0 < rows["all"][2] < 4.0)

    def test_parts_time_the_named_marks_alone(self):
        # the peer's attention 3x the base's, its cache write 100x: over the whole step the ratio
        # is anything; over the mark 'attn' alone it is 3 on every step
        peer = self.peer(self.mixed, "UPDATE kernels SET time_us = time_us * (CASE WHEN name = 'attn' THEN 3 ELSE 100 END);"
                                     "UPDATE steps SET time_us = (SELECT sum(time_us) FROM kernels k WHERE "
                                     "k.run = steps.run AND k.step = steps.step AND k.layer >= 0);")
        con = sqlite3.connect(self.mixed)
        names = {n for (n,) in con.execute("SELECT DISTINCT name FROM kernels")}
        self.assertEqual(names, {"attn", "write"})
        n = con.execute("SELECT count(*) FROM steps WHERE time_us > 0").fetchone()[0]
        rows = {r[0]: r for r in ratios.compare(self.mixed, runs_db=peer, parts=["attn"])[1][0][1]}
        self.assertEqual(rows["all"][1], n)
        for q in (2, 3, 4, 5):
            self.assertAlmostEqual(rows["all"][q], 3.0, places=6)
        whole = {r[0]: r for r in ratios.compare(self.mixed, runs_db=peer)[1][0][1]}
        self.assertGreater(whole["all"][2], 3.5)
        # both marks: the steps' whole time again
        both = {r[0]: r for r in ratios.compare(self.mixed, runs_db=peer, parts=["attn", "write"])[1][0][1]}
        self.assertAlmostEqual(both["all"][2], whole["all"][2], places=6)
        # a mark no step has, and a malformed list: exit 2 naming them
        rc, out = run(["ratios", self.mixed, "--runs-in", peer, "--parts", "combine"])
        self.assertEqual(rc, 2, out)
        self.assertIn("no timed step has any of the marks combine", out)
        rc, out = run(["ratios", self.mixed, "--runs-in", peer, "--parts", "attn,,write"])
        self.assertEqual(rc, 2, out)
        self.assertIn("mark names separated by commas", out)
        rc, out = run(["ratios", self.mixed, "--runs-in", peer, "--parts", "attn"])
        self.assertEqual(rc, 0, out)
        self.assertIn("a step timed by the marks attn summed over its layers", out)
        self.assertEqual(table_rows(out)[(1, "all")][4], "3.000")

    def test_cascade_steps_and_percentiles(self):
        prefix = tmpdb(self, "prefix.db")
        replay(prefix, "prefix", "--cascade", "on")
        # step i of the peer takes (1 + i) times the base's: ratios 1..n, so the quantiles are known
        peer = self.peer(prefix, "UPDATE steps SET time_us = time_us * (1 + step);")
        rows = {r[0]: r for r in ratios.compare(prefix, runs_db=peer)[1][0][1]}
        con = sqlite3.connect(prefix)
        self.assertGreater(con.execute("SELECT sum(cascade) FROM steps").fetchone()[0], 0)
        self.assertEqual(rows["cascade"][1], con.execute("SELECT sum(cascade) FROM steps").fetchone()[0])
        want = sorted(1.0 + s for (s,) in con.execute("SELECT step FROM steps WHERE time_us > 0"))
        self.assertAlmostEqual(rows["all"][3], ratios.quantile(want, 0.5))
        self.assertAlmostEqual(ratios.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.1), 1.4)
        self.assertAlmostEqual(ratios.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.9), 4.6)

    def test_failed_steps_not_paired_but_counted(self):
        peer = self.peer(self.mixed, "UPDATE steps SET pass = 0 WHERE step < 3;")
        rows = {r[0]: r for r in ratios.compare(self.mixed, runs_db=peer)[1][0][1]}
        n = sqlite3.connect(self.mixed).execute("SELECT count(*) FROM steps WHERE time_us > 0").fetchone()[0]
        self.assertEqual(rows["all"][1], n - 3)
        self.assertEqual((rows["all"][7], rows["all"][8]), (0, 3))

    def test_by_context_splits_each_kind(self):
        # the base's steps spread over the context bands (total_context rewritten to 70,000 keys a
        # step number), the peer 2x slower under 128k keys and 5x from there: each row of
        # --by-context holds its kind's steps of one band and reads exactly its factor
        con = sqlite3.connect(self.mixed)
        con.execute("UPDATE steps SET total_context = step * 70000")
        con.commit()
        steps = con.execute("SELECT num_prefill_reqs, num_decode_reqs, cascade, total_context FROM steps "
                            "WHERE time_us > 0").fetchall()
        con.close()
        peer = self.peer(self.mixed, "UPDATE steps SET time_us = time_us * "
                                     "(CASE WHEN total_context < 131072 THEN 2 ELSE 5 END);")
        want = {}
        for p, d, c, ctx in steps:
            key = "%s %s" % (ratios.step_kind(p, d, c), ratios.context_band(ctx))
            want[key] = want.get(key, 0) + 1
        self.assertGreater(len({k.split()[1] for k in want}), 2)   # the steps do span several bands
        rows = {r[0]: r for r in ratios.compare(self.mixed, runs_db=peer, by_context=True)[1][0][1]}
        self.assertEqual({k: r[1] for k, r in rows.items() if k != "all"}, want)
        self.assertEqual(rows["all"][1], len(steps))
        for key, r in rows.items():
            if key == "all":
                continue
            factor = 2.0 if key.split()[1] in ("<16k", "16k-128k") else 5.0
            for q in (2, 3, 4, 5):
                self.assertAlmostEqual(r[q], factor, places=9, msg=key)
        rc, out = run(["ratios", self.mixed, "--runs-in", peer, "--by-context"])
        self.assertEqual(rc, 0, out)
        printed = {kind for (_, kind) in table_rows(out)}
        self.assertEqual(printed, set(want) | {"all"})
        self.assertEqual(ratios.context_band(16383), "<16k")
        self.assertEqual(ratios.context_band(16384), "16k-128k")
        self.assertEqual(ratios.context_band(524288), ">=512k")

    def test_one_database_and_the_printed_table(self):
        replay(self.mixed, "mixed")                 # run 2 of the same trace
        rc, out = run(["ratios", self.mixed, "--base", "1"])
        self.assertEqual(rc, 0, out)
        rows = table_rows(out)
        steps = sqlite3.connect(self.mixed).execute("SELECT count(*) FROM steps WHERE run = 1").fetchone()[0]
        self.assertEqual(int(rows[(2, "all")][3]), steps)
        self.assertNotIn((1, "all"), rows)          # the base is not compared with itself
        rc, out = run(["ratios", self.mixed, "--runs-in", self.mixed, "--base", "1", "--run", "1", "--text"])
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"\n\s+1 cpu\s+all\s+%d\s+1\.000\s+1\.000\s+1\.000\s+1\.000\s+0%%" % steps)

    def test_file_names_with_uri_characters(self):
        # '?', '#' and '%' are plain characters of a file name, not a URI's query or fragment
        replay(self.mixed, "mixed")
        d = os.path.join(os.path.dirname(self.mixed), "q?x")
        os.mkdir(d)
        db = os.path.join(d, "r#1%41.db")
        shutil.copy(self.mixed, db)
        def files():   # a read of a WAL database may leave its -wal and -shm beside it
            return [sorted(f for f in os.listdir(x) if not f.endswith(("-wal", "-shm")))
                    for x in (os.path.dirname(self.mixed), d)]
        before = files()
        rc, out = run(["ratios", db, "--base", "1", "--runs-in", db, "--run", "2"])
        self.assertEqual(rc, 0, out)
        self.assertIn((2, "all"), table_rows(out))
        self.assertEqual(files(), before)             # nothing made at 'q' or 'q?x/r'

    def read_only_dir(self, d):
        """d made read-only for this process: a read-only bind mount over it as root (root
        writes through permissions), else its mode; skips when neither can be done."""
        if os.geteuid() != 0:
            os.chmod(d, 0o555)
            self.addCleanup(os.chmod, d, 0o755)
            return d
        import subprocess
        ro = d + "-ro"
        os.mkdir(ro)
        if subprocess.run(["mount", "--bind", d, ro], stderr=subprocess.DEVNULL).returncode != 0:
            self.skipTest("cannot bind-mount here")
        self.addCleanup(subprocess.run, ["umount", ro])
        if subprocess.run(["mount", "-o", "remount,bind,ro", ro], stderr=subprocess.DEVNULL).returncode != 0:
            self.skipTest("cannot remount read-only here")
        return ro

    def test_database_in_a_read_only_directory(self):
        # a finished run's database on read-only storage is read; one whose write-ahead log is
        # still beside it cannot be read without it, and says so
        replay(self.mixed, "mixed")
        d = os.path.join(os.path.dirname(self.mixed), "archive")
        os.mkdir(d)
        shutil.copy(self.mixed, os.path.join(d, "done.db"))
        shutil.copy(self.mixed, os.path.join(d, "live.db"))
        with open(os.path.join(d, "live.db-wal"), "wb") as f:
            f.write(b"\0" * 4096)
        ro = self.read_only_dir(d)
        rc, out = run(["ratios", os.path.join(ro, "done.db"), "--base", "1"])
        self.assertEqual(rc, 0, out)
        self.assertIn((2, "all"), table_rows(out))
        rc, out = run(["ratios", os.path.join(ro, "live.db"), "--base", "1"])
        self.assertEqual(rc, 2, out)
        self.assertIn("live.db: cannot be read where it is: its write-ahead log live.db-wal is beside it", out)

    def test_markdown_cells_escaped(self):
        # a backend's name may hold '|' (the library refuses only blanks, quotes and '\\'):
        # escaped, the row keeps its columns
        peer = self.peer(self.mixed, "UPDATE runs SET backend = 'py:fast|paged';")
        rc, out = run(["ratios", self.mixed, "--runs-in", peer])
        self.assertEqual(rc, 0, out)
        rows = [line for line in out.splitlines() if line.startswith("| 1 |")]
        self.assertTrue(rows, out)
        for line in rows:
            self.assertIn("| py:fast\\|paged |", line)
            self.assertEqual(len(re.split(r"(?<!\\)\|", line)), 13, line)   # 11 cells between 12 bars

    def test_fifo_is_not_a_database(self):
        # opening a FIFO waits for a writer: it must be refused, not waited on
        import subprocess
        fifo = os.path.join(os.path.dirname(self.mixed), "results.db")
        os.mkfifo(fifo)
        for args in ([fifo], [self.mixed, "--runs-in", fifo]):
            try:
                p = subprocess.run(cli() + ["ratios"] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   timeout=60)
            except subprocess.TimeoutExpired:
                self.fail("ratios %s: still waiting after 60 s" % args)
            out = p.stdout.decode(errors="replace")
            self.assertEqual(p.returncode, 2, out)
            self.assertIn("results.db: not a regular file, not an attnreplay database", out)

    def test_locked_database_waited_for_then_refused(self):
        # another process's write lock (a rollback-journal copy under BEGIN EXCLUSIVE) is waited for
        # ATTNREPLAY_BUSY_TIMEOUT_MS, as the attnreplay commands wait, then refused in their words
        # (it waited Python's 5 s and said "not an attnreplay database (database is locked)")
        locked = self.peer(self.mixed, "PRAGMA journal_mode=DELETE;")
        con = sqlite3.connect(locked, isolation_level=None)
        con.executescript("BEGIN EXCLUSIVE; DELETE FROM steps WHERE 0;")
        try:
            for args in ([locked], [self.mixed, "--runs-in", locked]):
                rc, out = run(["ratios"] + args, env={"ATTNREPLAY_BUSY_TIMEOUT_MS": "300"})
                self.assertEqual(rc, 2, "%s: %s" % (args, out))
                self.assertIn("peer.db: the database is locked by another connection's write (waited 300 ms; "
                              "ATTNREPLAY_BUSY_TIMEOUT_MS sets the wait)", out)
                self.assertNotIn("Traceback", out)
        finally:
            con.execute("ROLLBACK")
            con.close()
        # the variable read as replay/db.c reads it: an integer 0..86400000, else the 30000 default
        for text, ms in (("1500", 1500), (" +7", 7), ("0", 0), ("", 30000), ("-1", 30000), ("86400001", 30000),
                         ("1_000", 30000), ("2s", 30000)):
            with mock.patch.dict(os.environ, {"ATTNREPLAY_BUSY_TIMEOUT_MS": text}):
                self.assertEqual(ratios.busy_timeout_ms(), ms, text)

    def test_bad_input_exit_2(self):
        d = os.path.dirname(self.mixed)
        other = tmpdb(self, "other.db")
        replay(other, "chunked")
        newer = os.path.join(d, "newer.db")
        shutil.copy(self.peer(self.mixed, "UPDATE meta SET value = '%d' WHERE key = 'schema_version';"
                                          % (ratios.SCHEMA_VERSION + 1)), newer)
        nokernels = os.path.join(d, "nokernels.db")      # another program's, or damaged, past the open
        shutil.copy(self.peer(self.mixed, "DROP TABLE kernels;"), nokernels)
        nocascade = os.path.join(d, "nocascade.db")
        shutil.copy(self.peer(self.mixed, "ALTER TABLE steps DROP COLUMN cascade;"), nocascade)
        layers = self.peer(self.mixed, "UPDATE runs SET layers = layers + 1;")
        not_db = os.path.join(d, "not.db")
        with open(not_db, "w") as f:
            f.write("plain text\n")
        for args, message in (
                ([os.path.join(d, "absent.db")], "absent.db: no such file"),
                ([not_db], "not.db: not an attnreplay database"),
                ([d], "%s: a directory, not an attnreplay database" % d),
                ([newer], "newer.db: schema version %d is newer than this attnreplay's %d"
                          % (ratios.SCHEMA_VERSION + 1, ratios.SCHEMA_VERSION)),
                ([self.mixed, "--runs-in", newer], "newer.db: schema version"),
                ([self.mixed, "--runs-in", nokernels],
                 "nokernels.db: cannot be read as an attnreplay database (no such table: kernels)"),
                ([self.mixed, "--runs-in", nocascade],
                 "nocascade.db: cannot be read as an attnreplay database (no such column: cascade)"),
                ([self.mixed, "--base", "9"], "mixed.db: no run 9"),
                ([self.mixed, "--runs-in", self.mixed, "--run", "7"], "mixed.db: no run 7"),
                ([self.mixed, "--base", "99999999999999999999"], "--base: '99999999999999999999': not a run id"),
                ([self.mixed, "--run", "1", "--run", "-9223372036854775809"], "--run: '-9223372036854775809': not a run id"),
                ([self.mixed, "--base", " 1"], "--base: ' 1': not a run id"),
                ([self.mixed, "--base", "+1"], "--base: '+1': not a run id"),
                ([self.mixed, "--run", "1_0"], "--run: '1_0': not a run id"),
                ([self.mixed], "no other run of the base's trace"),
                ([self.mixed, "--runs-in", other, "--run", "1"], "replayed another trace than the base"),
                ([self.mixed, "--runs-in", layers], "per-step times are not comparable")):
            rc, out = run(["ratios"] + args)
            self.assertEqual(rc, 2, "%s: %s" % (args, out))
            self.assertIn(message, out, args)
            self.assertNotIn("Traceback", out)


class Schema(unittest.TestCase):
    def test_schema_version_is_the_libraries(self):
        header = os.path.join(SRC, "replay", "db_version.h")
        if not os.path.exists(header):
            self.skipTest("%s absent (not a checkout)" % header)
        with open(header) as f:
            self.assertIn("#define AR_DB_SCHEMA_VERSION %d\n" % ratios.SCHEMA_VERSION, f.read())


if __name__ == "__main__":
    unittest.main()
