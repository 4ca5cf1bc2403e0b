#!/usr/bin/env python3
"""test_power_trace.py - tests of kernels/peers/power_trace.py without a GPU: nvidia-smi's CSV
lines parsed (hex reasons, fractions of a second, [N/A] and header lines skipped), samples
summarised per command window (clock median and lowest, power mean and highest, the share of
samples with each limiting reason, the busy samples' clock and power), an empty window,
LABEL=COMMAND arguments (exit 2 on a bad one), and runs with a stand-in nvidia-smi on PATH, one
of them writing more than a pipe holds before the last command starts.
Run: python3 test_power_trace.py"""
import contextlib
import io
import os
import stat
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import power_trace  # noqa: E402


class PowerTraceTest(unittest.TestCase):
    def test_parse_sample(self):
        s = power_trace.parse_sample("2026/12/06 09:35:38.139, 1710, 806.03, 47, 0x0000000000000004")
        self.assertIsNotNone(s)
        self.assertAlmostEqual(s[0] % 1, 0.139, places=3)
        self.assertEqual(s[1:], (1710.0, 806.03, 47.0, 4))
        self.assertIsNone(power_trace.parse_sample("timestamp, clocks.sm [MHz], power.draw.instant [W], a, b"))
        self.assertIsNone(power_trace.parse_sample("2026/12/06 09:35:38.139, [N/A], 806.03, 47, 0x0"))
        self.assertIsNone(power_trace.parse_sample("garbage"))

    def test_summarize_windows(self):
        t0 = 1000.0
        samples = [(t0 + 0.1, 1980.0, 120.0, 35.0, 0x0), (t0 + 0.2, 1710.0, 806.0, 47.0, 0x4),
                   (t0 + 0.3, 1860.0, 300.0, 40.0, 0x4), (t0 + 1.1, 1980.0, 200.0, 34.0, 0x0),
                   (t0 + 1.2, 1965.0, 220.0, 36.0, 0x20)]
        rows = power_trace.summarize(samples, [("ours", t0, t0 + 0.5), ("peer", t0 + 1.0, t0 + 1.5),
                                               ("idle", t0 + 2.0, t0 + 3.0)])
        label, n, cmed, cmin, wmean, wmax, hot, shares, busy = rows[0]
        self.assertEqual((label, n, cmed, cmin, wmax, hot), ("ours", 3, 1860.0, 1710.0, 806.0, 47.0))
        self.assertEqual(busy[:2], (2, (1710.0 + 1860.0) / 2))
        self.assertAlmostEqual(busy[2], (806 + 300) / 2)
        self.assertIsNone(rows[1][8])
        self.assertAlmostEqual(wmean, (120 + 806 + 300) / 3)
        self.assertAlmostEqual(shares["sw_power_cap"], 2 / 3)
        self.assertEqual(shares["sw_thermal"], 0)
        self.assertEqual(rows[1][1], 2)
        self.assertEqual(rows[1][7]["sw_power_cap"], 0)
        self.assertEqual(rows[1][7]["sw_thermal"], 0.5)
        self.assertEqual(rows[2][1], 0)
        table = power_trace.format_rows(rows)
        self.assertIn("| ours | 3 | 1860 (1710) | 409 (806) | 47 | 67% | 0% | 0% | 2 | 1785 | 553 |", table)
        self.assertIn("| peer | 2 | 1972 (1965) | 210 (220) | 36 | 0% | 0% | 50% | 0 | - | - |", table)
        self.assertIn("| idle | 0 | - | - | - | - | - | - | 0 | - | - |", table)

    def test_commands(self):
        self.assertEqual(power_trace.parse_commands(["a=echo x=1"]), [("a", "echo x=1")])
        for bad in (["noequals"], ["=cmd"], ["a b=cmd"], ["a=  "]):
            with self.assertRaises(ValueError):
                power_trace.parse_commands(bad)
        with contextlib.redirect_stderr(io.StringIO()) as e:
            self.assertEqual(power_trace.main(["nolabel"]), 2)
        self.assertIn("not LABEL=COMMAND", e.getvalue())

    @staticmethod
    def run_with_smi(d, flood_lines, argv):
        """power_trace.main(argv) with a stand-in nvidia-smi in d that first writes flood_lines
        samples at once, then one every 20 ms; (exit code, printed text)."""
        smi = os.path.join(d, "nvidia-smi")
        with open(smi, "w") as f:
            f.write("#!/usr/bin/env python3\nimport time, sys\n"
                    "def line():\n"
                    "    t = time.time()\n"
                    "    return (time.strftime('%Y/%m/%d %H:%M:%S', time.localtime(int(t))) + "
                    "'.%03d, 1700, 650.5, 44, 0x0000000000000004' % int((t % 1) * 1000))\n"
                    f"for _ in range({flood_lines}):\n"
                    "    print(line())\n"
                    "sys.stdout.flush()\n"
                    "while True:\n"
                    "    print(line(), flush=True)\n"
                    "    time.sleep(0.02)\n")
        os.chmod(smi, os.stat(smi).st_mode | stat.S_IEXEC)
        old = os.environ["PATH"]
        os.environ["PATH"] = d + os.pathsep + old
        try:
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = power_trace.main(argv)
        finally:
            os.environ["PATH"] = old
        return rc, out.getvalue()

    def test_run_with_stand_in_smi(self):
        with tempfile.TemporaryDirectory() as d:
            rc, text = self.run_with_smi(d, 0, ["--csv", os.path.join(d, "s.csv"), "busy=sleep 0.4", "fails=exit 3"])
            self.assertEqual(rc, 3)
            self.assertIn("== busy: exit 0", text)
            self.assertIn("== fails: exit 3", text)
            busy = [line for line in text.splitlines() if line.startswith("| busy |")]
            self.assertEqual(len(busy), 1)
            self.assertIn("| 1700 (1700) | 650 (650) | 44 | 100% |", busy[0])
            self.assertTrue(os.path.getsize(os.path.join(d, "s.csv")) > 0)

    def test_sampling_goes_on_past_a_pipe_full(self):
        # 2,000 lines (about 120 KB) before the first command: more than a pipe holds, so a
        # sampler that nobody reads until the end would stop writing before "late" ran.
        with tempfile.TemporaryDirectory() as d:
            rc, text = self.run_with_smi(d, 2000, ["early=sleep 0.3", "late=sleep 0.4"])
            self.assertEqual(rc, 0)
            late = [line for line in text.splitlines() if line.startswith("| late |")]
            self.assertEqual(len(late), 1)
            self.assertGreaterEqual(int(late[0].split("|")[2]), 5, late[0])


if __name__ == "__main__":
    unittest.main()
