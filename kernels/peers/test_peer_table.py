#!/usr/bin/env python3
"""test_peer_table.py - tests of kernels/peers/peer_table.py on made-up benchmark and peer outputs in
the formats of tests/bench_cuda.c, bench_cascade.c, bench_mla.c and kernels/peers/*.py: ratios,
the best-of choice, FlashInfer's own rows, error lines ignored, missing sides named, exit 2 for a
missing file.
Run: python3 test_peer_table.py"""
import contextlib
import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_table  # noqa: E402

BENCH = """RESULT name=decode_b64_s8192_gqa32_8_hd128 us=545.0 write_us=1.0 gbps=3940.0 tflops=0.0 splits=1 device="H200"
RESULT name=prefill_b2_s8192_causal_hd128 us=2200.0 write_us=1.0 gbps=0 tflops=500.0 splits=1 device="H200"
RESULT name=prefill_b2_s8192_causal_hd256 us=5200.0 write_us=1.0 gbps=0 tflops=200.0 splits=1 device="H200"
RESULT name=chunk_q8192_ctx98304_gqa32_8_hd128 us=25000.0 write_us=1.0 gbps=0 tflops=500.0 splits=1 device="H200"
"""
CASCADE = """RESULT name=cascade_b128_p32768_s128 flat_us=500.0 cascade_us=200.0 speedup=2.5 prefix_tflops=500.0 max_diff=0.001
"""
MLA = """h_q   s_k      kv     kernel      stages cuda-mla us   TFLOP/s     TB/s   CTAs |     torch us   TFLOP/s     TB/s
128   4096     bf16   wgmma            2      200.0     600.0     0.70    132 |       1000.0     100.0     0.10
128   4096     bf16   splitqk          2      300.0     400.0     0.50    132 |            -
16    4096     bf16   narrow           2      170.0      50.0     4.00    132 |        500.0      20.0     1.00
"""
PEERS = """PEER name=decode_b64_s8192_gqa32_8_hd128 impl=cudnn_sdpa_contiguous us=490.0 gbps=4000.0 tflops=0.0
PEER name=decode_b64_s8192_gqa32_8_hd128 impl=fa3_paged16 us=520.0 gbps=3940.0 tflops=0.0 relerr=1e-3 sched=precomputed
PEER name=prefill_b2_s8192_causal_hd128 impl=cudnn_sdpa us=1900.0 gbps=0.0 tflops=400.0
PEER name=prefill_b2_s8192_causal_hd128 impl=fa3_contiguous us=1800.0 gbps=0.0 tflops=625.0 relerr=1e-3
PEER name=prefill_b2_s8192_causal_hd256 impl=fa3_contiguous error="check failed: relerr=1"
PEER name=mla_decode_b128_hq128_sk4096 impl=flashmla_dense us=190.0 gbps=700.0 tflops=500.0
PEER name=mla_decode_b128_hq16_sk4096 impl=flashmla_dense us=160.0 gbps=5000.0 tflops=60.0
PEER name=cascade_b128_p32768_s128 impl=fa3_cascade_paged16 us=100.0 gbps=1.0 tflops=0.0
PEER name=cascade_b128_p32768_s128 impl=fa3_flat_paged16 us=400.0 gbps=1.0 tflops=0.0
PEER name=chunk_q8192_ctx98304_gqa32_8_hd128 impl=fa3_paged16 us=22000.0 gbps=0.0 tflops=575.0 relerr=2e-3
PEER name=prefill_b2_s8192_causal_hd128 impl=fa3_paged16 us=2000.0 gbps=0.0 tflops=450.0 relerr=1e-3 sched=precomputed
PEER name=prefill_b2_s8192_causal_hd128 impl=fi_prefill_paged16 us=2500.0 gbps=0.0 tflops=400.0 relerr=2e-3
PEER name=cascade_b128_p32768_s128 impl=fi_cascade_paged16 us=800.0 gbps=1.0 tflops=0.0 relerr=3e-3
"""


class PeerTableTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ar_peer_table_")
        self.files = {}
        for n, text in (("bench", BENCH), ("cascade", CASCADE), ("mla", MLA), ("peers", PEERS)):
            self.files[n] = os.path.join(self.tmp, n + ".txt")
            with open(self.files[n], "w") as f:
                f.write(text)

    def table(self):
        args = type("A", (), {k: v for k, v in self.files.items()})
        return {r[0]: r for r in peer_table.rows(*peer_table.parse(args))}

    def test_ratios_and_verdicts(self):
        t = self.table()
        r = t["paged decode B64/8k GQA 32:8 (GB/s)"]
        self.assertEqual(r[2], "fa3_paged16")
        self.assertAlmostEqual(r[4], 1.0)
        self.assertTrue(r[6].startswith("met"))
        r = t["paged decode vs cuDNN contiguous (GB/s)"]
        self.assertAlmostEqual(r[4], 0.985)
        self.assertTrue(r[6].startswith("met"))          # 0.985 >= 0.95
        r = t["causal prefill B2 S8k hd128 (TFLOP/s)"]    # the better of FA3 and cuDNN
        self.assertEqual((r[2], r[3]), ("fa3_contiguous", 625.0))
        self.assertAlmostEqual(r[4], 0.8)
        self.assertTrue(r[6].startswith("NOT met"))

    def test_chunk_row_has_no_target(self):
        r = self.table()["chunked prefill 8k over 98k GQA 32:8 (TFLOP/s)"]
        self.assertEqual((r[2], r[3]), ("fa3_paged16", 575.0))
        self.assertAlmostEqual(r[4], 500.0 / 575.0)
        self.assertIsNone(r[5])
        self.assertEqual(r[6], "-")                       # a ratio, no verdict

    def test_paged_rows_beside_the_best(self):
        t = self.table()
        r = t["causal prefill B2 S8k hd128 (TFLOP/s)"]     # the paged peer is slower: the best stays contiguous
        self.assertEqual((r[2], r[3]), ("fa3_contiguous", 625.0))
        r = t["causal prefill hd128 vs FA3 paged 16 (TFLOP/s)"]
        self.assertEqual((r[2], r[3]), ("fa3_paged16", 450.0))
        self.assertAlmostEqual(r[4], 500.0 / 450.0)
        self.assertIsNone(r[5])
        self.assertEqual(r[6], "-")
        self.assertIn("missing: peer", t["causal prefill hd256 vs FA3 paged 16 (TFLOP/s)"][6])
        self.assertIn("missing: ours", t["varlen 16 vs FA3 paged 16 (TFLOP/s)"][6])

    def test_error_lines_and_missing_sides(self):
        t = self.table()
        self.assertIn("missing: peer", t["causal prefill B2 S8k hd256 (TFLOP/s)"][6])
        self.assertIn("missing: ours", t["fp8 KV decode (GB/s)"][6])
        self.assertIn("missing: ours", t["MLA decode h_q 128 s_k 8192 (TFLOP/s)"][6])

    def test_mla_default_kernel_row_and_units(self):
        t = self.table()
        r = t["MLA decode h_q 128 s_k 4096 (TFLOP/s)"]     # the first bf16 row (the default), not the best
        self.assertAlmostEqual(r[1], 600.0)
        self.assertAlmostEqual(r[4], 1.2)
        r = t["MLA decode h_q 16 s_k 4096 (GB/s)"]         # TB/s of bench_mla as GB/s
        self.assertAlmostEqual(r[1], 4000.0)
        self.assertAlmostEqual(r[4], 0.8)

    def test_cascade_is_a_time_ratio(self):
        t = self.table()
        r = t["cascade step P 32768 S 128 (us)"]
        self.assertEqual(r[2], "fa3_cascade_paged16")      # the fastest peer
        self.assertAlmostEqual(r[4], 0.5)                  # peer time / our time
        self.assertIn("missing: peer", t["cascade prefix pass P 32768 (TFLOP/s)"][6])

    def test_flashinfer_rows_beside_the_best(self):
        t = self.table()
        r = t["causal prefill B2 S8k hd128 (TFLOP/s)"]      # FlashInfer is no target peer there
        self.assertEqual(r[2], "fa3_contiguous")
        r = t["causal prefill hd128 vs FlashInfer (TFLOP/s)"]
        self.assertEqual((r[2], r[3]), ("fi_prefill_paged16", 400.0))
        self.assertAlmostEqual(r[4], 1.25)
        self.assertEqual(r[6], "-")
        r = t["cascade step P 32768 S 128 (us)"]              # the fastest peer hides FlashInfer's 800 us
        self.assertEqual(r[2], "fa3_cascade_paged16")
        r = t["cascade step P 32768 S 128 vs FlashInfer (us)"]
        self.assertEqual((r[2], r[3]), ("fi_cascade_paged16", 800.0))
        self.assertAlmostEqual(r[4], 4.0)                     # its time / ours
        self.assertIn("missing: peer", t["causal prefill hd256 vs FlashInfer (TFLOP/s)"][6])
        self.assertIn("missing: ours", t["varlen 16 vs FlashInfer (TFLOP/s)"][6])

    def rounds(self, n, peer_scale):
        """n rounds: round k's FA3 decode peer scaled by peer_scale[k], ours as in BENCH."""
        args = {"bench": [], "cascade": [], "mla": [], "peers": []}
        for k in range(n):
            for name in args:
                text = self.files[name]
                if name == "peers":
                    with open(text) as f:
                        body = f.read().replace("gbps=3940.0", f"gbps={3940.0 * peer_scale[k]:.1f}")
                    text = os.path.join(self.tmp, f"peers{k}.txt")
                    with open(text, "w") as f:
                        f.write(body)
                args[name] += ["--" + name, text]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = peer_table.main(sum(args.values(), []))
        return rc, {line[:42].strip(): line for line in out.getvalue().splitlines()}

    def test_rounds_take_the_median_and_show_the_spread(self):
        rc, t = self.rounds(3, [1.10, 0.95, 1.00])      # peer 4334, 3743, 3940: median 3940
        self.assertEqual(rc, 0)
        line = t["paged decode B64/8k GQA 32:8 (GB/s)"]
        self.assertIn("3940.0", line)
        self.assertIn(" 1.000 ", line)                   # ours 3940 / the median 3940
        self.assertIn("met", line)
        self.assertIn("3 rounds, ratios 0.91-1.05", line)  # 3940/4334 .. 3940/3743
        line = t["causal prefill B2 S8k hd256 (TFLOP/s)"]
        self.assertIn("missing: peer in every round", line)

    def test_rounds_median_of_even_count_is_the_mean_of_the_middle_two(self):
        self.assertEqual(peer_table.median([4.0, 1.0, 3.0, 2.0]), 2.5)
        self.assertIsNone(peer_table.median([]))

    def test_rounds_counts_must_match(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = peer_table.main(["--bench", self.files["bench"], "--bench", self.files["bench"],
                                  "--peers", self.files["peers"]])
        self.assertEqual(rc, 2)
        self.assertIn("once a round", err.getvalue())

    def test_missing_file_exit_2(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = peer_table.main(["--bench", os.path.join(self.tmp, "absent.txt"), "--peers", self.files["peers"]])
        self.assertEqual(rc, 2)
        self.assertIn("absent.txt", err.getvalue())


if __name__ == "__main__":
    unittest.main()
