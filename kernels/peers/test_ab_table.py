"""test_ab_table.py - ab_table.py's parsing, medians and ratios, without a GPU:
python3 kernels/peers/test_ab_table.py (make test runs it with the other kernels/peers tests)."""
import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ab_table  # noqa: E402

LOG = """\
== round 1
AB variant=main RESULT name=varlen16_causal_hd128 us=240.1 gbps=0.0 tflops=426.0 config=2
AB variant=exp RESULT name=varlen16_causal_hd128 us=280.0 gbps=0.0 tflops=366.0 config=2
AB variant=main RESULT name=decode_b64_s8192_gqa32_8_hd128 us=510.0 gbps=4100.0 tflops=0.0
AB variant=exp RESULT name=decode_b64_s8192_gqa32_8_hd128 us=500.0 gbps=4182.0 tflops=0.0
AB variant=main RESULT name=cascade_b128_p32768_s128 flat_us=1900 cascade_us=160.0 prefix_tflops=530
AB variant=exp RESULT name=cascade_b128_p32768_s128 flat_us=1900 cascade_us=180.0 prefix_tflops=460
AB variant=main RESULT name=mla_h128_sk4096 us=289.0 tflops=505.4 gbps=0.0 kernel="tc-wgmma (cp.async)" ctas=256
AB variant=exp RESULT name=mla_h128_sk4096 us=274.0 tflops=533.1 gbps=0.0 kernel="tc-wgmma (cp.async)" ctas=256
AB variant=main RESULT name=mla_h16_sk4096 us=80.0 tflops=0.0 gbps=3900.0 kernel="tc-wgmma16" ctas=128
AB variant=exp RESULT name=mla_h16_sk4096 us=78.0 tflops=0.0 gbps=4000.0 kernel="tc-wgmma16" ctas=128
== round 2
AB variant=main RESULT name=varlen16_causal_hd128 us=240.1 gbps=0.0 tflops=428.0 config=2
AB variant=exp RESULT name=varlen16_causal_hd128 us=280.0 gbps=0.0 tflops=367.0 config=2
AB variant=main RESULT name=varlen16_causal_hd128 us=240.1 gbps=0.0 tflops=500.0 config=2
SKIP something: no CUDA device
"""


class AbTableTest(unittest.TestCase):
    def rows(self, text=LOG):
        return ab_table.parse(io.StringIO(text), "log")

    def test_metric_per_line(self):
        rows = self.rows()
        self.assertEqual(len(rows), 13)
        kinds = {(case, key) for _v, case, key, _u, _h, _x in rows}
        self.assertIn(("mla_h128_sk4096", "tflops"), kinds)                # bench_mla: 128 heads
        self.assertIn(("mla_h16_sk4096", "gbps"), kinds)                    # 16 heads: tflops=0.0
        self.assertIn(("varlen16_causal_hd128", "tflops"), kinds)
        self.assertIn(("decode_b64_s8192_gqa32_8_hd128", "gbps"), kinds)   # tflops=0.0 is absent
        self.assertIn(("cascade_b128_p32768_s128", "cascade_us"), kinds)

    def test_medians_and_ratios(self):
        result = {case: cells for case, _unit, cells in ab_table.table(self.rows())}
        main, exp = result["varlen16_causal_hd128"]
        self.assertEqual(main[0], "main")
        self.assertEqual(main[2], 3)
        self.assertAlmostEqual(main[1], 428.0)              # median of 426, 428, 500
        self.assertAlmostEqual(main[3], 1.0)
        self.assertAlmostEqual(exp[1], 366.5)
        self.assertAlmostEqual(exp[3], 366.5 / 428.0)
        _m, e = result["decode_b64_s8192_gqa32_8_hd128"]
        self.assertAlmostEqual(e[3], 4182.0 / 4100.0)
        _m, e = result["cascade_b128_p32768_s128"]      # time: reference / build, below 1 slower
        self.assertAlmostEqual(e[3], 160.0 / 180.0)
        _m, e = result["mla_h128_sk4096"]               # a quoted kernel name with a space parses
        self.assertAlmostEqual(e[3], 533.1 / 505.4)
        _m, e = result["mla_h16_sk4096"]
        self.assertAlmostEqual(e[3], 4000.0 / 3900.0)

    def test_reference_missing_for_a_case(self):
        text = "AB variant=a RESULT name=x tflops=10\nAB variant=b RESULT name=y tflops=20\n"
        result = ab_table.table(self.rows(text))
        self.assertIsNone(dict((c, cells) for c, _u, cells in result)["y"][0][3])

    def test_bad_lines_are_named(self):
        for text, word in (("AB variant=a RESULT tflops=1\n", "without name="),
                           ("AB variant=a RESULT name=x us=3\n", "without tflops="),
                           ("\nAB variant=a RESULT name=x tflops=fast\n", "is not a number")):
            with self.assertRaises(ValueError) as ctx:
                self.rows(text)
            self.assertIn(word, str(ctx.exception))
        with self.assertRaises(ValueError) as ctx:
            self.rows("\nAB variant=a RESULT name=x tflops=fast\n")
        self.assertIn("log:2", str(ctx.exception))

    def test_main_exit_codes(self):
        with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()) as out, \
                tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "ab.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(LOG)
            self.assertEqual(ab_table.main([path, "--markdown"]), 0)
            with open(path, "w", encoding="utf-8") as f:
                f.write("SKIP x: no CUDA device\n")
            self.assertEqual(ab_table.main([path]), 1)
            with open(path, "w", encoding="utf-8") as f:
                f.write("AB variant=a RESULT name=x\n")
            self.assertEqual(ab_table.main([path]), 2)
            self.assertEqual(ab_table.main([path + ".missing"]), 2)
        self.assertIn("| varlen16_causal_hd128 | exp | 366.5 TFLOP/s | 2 | 0.856 |", out.getvalue())


if __name__ == "__main__":
    unittest.main()
