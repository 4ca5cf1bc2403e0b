#!/usr/bin/env python3
"""test_step_ratio.py - tests of kernels/peers/step_ratio.py on real attnreplay databases: the CPU
backend replays the sample traces (bin/attnreplay, or $AR_BIN), a copy of the database plays the
peer with its step times changed by known factors, and the table must show exactly those ratios,
the right step kinds, and exit code 2 with the file named for bad input.
Skips (exit 0, saying why) when bin/attnreplay has not been built.  Run: python3 test_step_ratio.py"""
import contextlib
import io
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import step_ratio  # noqa: E402

BIN = os.environ.get("AR_BIN") or os.path.join(ROOT, "bin", "attnreplay")


def replay(trace, db, *extra):
    subprocess.run([BIN, "replay", os.path.join(ROOT, "traces", "samples", trace), "--backend", "cpu", "--db", db,
                    "--layers", "1", *extra], check=True, capture_output=True, timeout=300)


def run_main(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = step_ratio.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


@unittest.skipUnless(os.access(BIN, os.X_OK), f"{BIN} not built (make)")
class StepRatioTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ar_step_ratio_")
        cls.mixed = os.path.join(cls.tmp, "mixed.db")
        cls.prefix = os.path.join(cls.tmp, "prefix.db")
        replay("mixed.trace.jsonl.gz", cls.mixed)
        replay("prefix.trace.jsonl.gz", cls.prefix, "--cascade", "on")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def peer_copy(self, src, sql):
        dst = os.path.join(self.tmp, f"peer_{self._testMethodName}.db")
        shutil.copy(src, dst)
        db = sqlite3.connect(dst)
        db.executescript(sql)
        db.commit()
        db.close()
        return dst

    def rows(self, a, b):
        return {r[0]: r for r in step_ratio.ratio_table(
            step_ratio.load_steps(sqlite3.connect(a), 1), step_ratio.load_steps(sqlite3.connect(b), 1))}

    def test_known_ratios_by_kind(self):
        # the peer is 2x slower on decode-only steps and 4x slower on every other step
        peer = self.peer_copy(self.mixed, "update steps set time_us = time_us * "
                                          "(case when num_prefill_reqs = 0 then 2 else 4 end);")
        rows = self.rows(self.mixed, peer)
        db = sqlite3.connect(self.mixed)
        n, n_decode, n_prefill = db.execute(
            "select count(*), sum(num_prefill_reqs = 0), sum(num_decode_reqs = 0 and num_prefill_reqs > 0) "
            "from steps where time_us > 0").fetchone()
        self.assertGreater(n_decode, 0)
        self.assertEqual(rows["all"][1], n)
        self.assertEqual(rows["decode-only"][1], n_decode)
        for q in range(2, 6):
            self.assertAlmostEqual(rows["decode-only"][q], 2.0, places=9)
        if n_prefill:
            self.assertAlmostEqual(rows["prefill-only"][3], 4.0, places=9)
        self.assertEqual(sum(r[1] for k, r in rows.items() if k != "all"), n)
        self.assertNotIn("cascade", rows)
        self.assertTrue(2.0 <= rows["all"][2] <= 4.0)

    def test_cascade_steps_and_percentiles(self):
        # step i of the peer takes (1 + i) times ours: ratios 1..n, so median and p10/p90 are known
        peer = self.peer_copy(self.prefix, "update steps set time_us = time_us * (1 + step);")
        rows = self.rows(self.prefix, peer)
        n_casc = sqlite3.connect(self.prefix).execute("select sum(cascade) from steps").fetchone()[0]
        self.assertGreater(n_casc, 0)
        self.assertEqual(rows["cascade"][1], n_casc)
        ratios = sorted(1.0 + s for (s,) in sqlite3.connect(self.prefix).execute(
            "select step from steps where time_us > 0"))
        self.assertAlmostEqual(rows["all"][3], step_ratio.quantile(ratios, 0.5))
        self.assertAlmostEqual(step_ratio.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.1), 1.4)
        self.assertAlmostEqual(step_ratio.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.9), 4.6)

    def test_failed_steps_counted(self):
        peer = self.peer_copy(self.mixed, "update steps set pass = 0 where step < 3;")
        rows = self.rows(self.mixed, peer)
        self.assertEqual(rows["all"][7], 3)
        self.assertEqual(rows["all"][6], 0)

    def test_table_printed(self):
        rc, out, _ = run_main(self.mixed, self.mixed, "--markdown")
        self.assertEqual(rc, 0)
        self.assertIn("| all |", out)
        self.assertIn("| 1.00 | 1.00 | 1.00 |", out)

    def test_bad_input_exit_2(self):
        rc, _, err = run_main(self.mixed, os.path.join(self.tmp, "absent.db"))
        self.assertEqual(rc, 2)
        self.assertIn("absent.db: no such file", err)
        rc, _, err = run_main(self.mixed, self.prefix)
        self.assertEqual(rc, 2)
        self.assertIn("different traces", err)
        rc, _, err = run_main(self.mixed, self.mixed, "--run-b", "7")
        self.assertEqual(rc, 2)
        self.assertIn("no run 7", err)
        layers = self.peer_copy(self.mixed, "update runs set layers = layers + 1;")
        rc, _, err = run_main(self.mixed, layers)
        self.assertEqual(rc, 2)
        self.assertIn("not comparable", err)
        not_db = os.path.join(self.tmp, "not.db")
        with open(not_db, "w") as f:
            f.write("plain text\n")
        rc, _, err = run_main(not_db, self.mixed)
        self.assertEqual(rc, 2)
        self.assertIn("not an attnreplay database", err)


if __name__ == "__main__":
    unittest.main()
