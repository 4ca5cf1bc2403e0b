"""test_parity.py - `attnreplay sim` decides as vLLM 0.33's V1 scheduler does: both run the same
workload, configuration and clock (constant 20 ms steps, arrivals from the workload), and at
least 99.5% of steps must agree on num_scheduled_tokens per request, prefix hits, preemptions,
resumptions and finished requests (vllm_recorder/parity.py).  A failure prints the first
divergence with both sides' decisions.  Each KV-starved case asserts that it really preempts, the
threshold case that it really chunks, so agreement is not reached on an easy path."""

import unittest

import common
from vllm_recorder import headless, parity

MIN_AGREEMENT = 0.995


def shared_prefix(name, **kw):
    path = common.tmp(name + ".jsonl")
    headless.write_mooncake(path, headless.shared_prefix_rows(**kw))
    return path


class ParityTests(unittest.TestCase):
    def check(self, name, workload, **cfg):
        res, vllm_trace, sim_trace, _ = parity.compare(common.BIN, workload, common.tmpdir(), name, **cfg)
        print(res.report(name).split("\n")[0], flush=True)
        self.assertGreaterEqual(res.fraction, MIN_AGREEMENT, "\n" + res.report(name))
        self.assertGreater(res.steps, 100)
        return res, parity.read_trace(vllm_trace)[1], parity.read_trace(sim_trace)[1]

    def test_synthetic_shared_prefix(self):
        wl = shared_prefix("p_sp", groups=6, prompts=10, system=700, question=300, output=120, rate=30, seed=5)
        res, a, b = self.check("p_sp", wl, num_blocks=4096)
        self.assertGreater(sum(n["num_computed_tokens"] for s in a for n in s["new"]), 10000)
        # num_common_prefix_blocks: the recorder's (older vLLM's rule) equals the sim's
        self.assertEqual([s["num_common_prefix_blocks"] for s in a], [s["num_common_prefix_blocks"] for s in b])

    def test_synthetic_kv_starved(self):
        wl = shared_prefix("p_starved", groups=6, prompts=10, system=700, question=300, output=120, rate=30, seed=5)
        res, _, _ = self.check("p_starved", wl, num_blocks=260)
        self.assertGreater(res.preemptions[0], 5)

    def test_long_prefill_token_threshold(self):
        wl = shared_prefix("p_thr", groups=6, prompts=10, system=700, question=300, output=120, rate=30, seed=5)
        res, a, _ = self.check("p_thr", wl, num_blocks=260, long_prefill_token_threshold=128,
                               max_num_batched_tokens=512)
        self.assertGreater(res.preemptions[0], 5)
        chunks = [n for s in a for n in s["num_scheduled_tokens"].values() if n == 128]
        self.assertGreater(len(chunks), 100)

    @unittest.skipUnless(common.have_mooncake(), "public Mooncake trace not found (AR_TRACES_PUBLIC or ../shared)")
    def test_mooncake_slice(self):
        wl = common.tmp("p_mc.jsonl")
        headless.mooncake_slice(common.MOONCAKE, wl, 0, 150, 16, 20000, 32768)
        res, a, _ = self.check("p_mc", wl, num_blocks=20000)
        self.assertGreater(sum(n["num_computed_tokens"] for s in a for n in s["new"]), 20000)

    @unittest.skipUnless(common.have_mooncake(), "public Mooncake trace not found (AR_TRACES_PUBLIC or ../shared)")
    def test_mooncake_kv_starved_threshold(self):
        wl = common.tmp("p_mc_starved.jsonl")
        headless.mooncake_slice(common.MOONCAKE, wl, 300, 100, 16, 1200, 32768)
        res, _, _ = self.check("p_mc_starved", wl, num_blocks=1200, long_prefill_token_threshold=512)
        self.assertGreater(res.preemptions[0], 0)

    def test_older_admission_rule(self):
        """vLLM run with scheduler_reserve_full_isl=False against the sim's --no-reserve-full-isl."""
        wl = shared_prefix("p_old", groups=6, prompts=10, system=700, question=300, output=120, rate=30, seed=5)
        res, _, _ = self.check("p_old", wl, num_blocks=260, reserve_full_isl=False)
        self.assertGreater(res.preemptions[0], 5)

    def test_a_divergence_is_reported(self):
        """The comparison can fail: the sim with all three older behaviours against vLLM 0.33."""
        wl = shared_prefix("p_div", groups=6, prompts=10, system=700, question=300, output=120, rate=30, seed=5)
        res, _, _, _ = parity.compare(common.BIN, wl, common.tmpdir(), "p_div", num_blocks=260,
                                      long_prefill_token_threshold=128, max_num_batched_tokens=512,
                                      sim_extra=("--threshold-when-alone", "--fifo-free", "--no-reserve-full-isl"))
        self.assertLess(res.fraction, 0.9)
        report = res.report("p_div")
        # the first request arrives alone: vLLM 0.33 gives it the whole budget, the older rule 128
        self.assertIn("first divergence at step 0:", report)
        self.assertIn("vLLM: scheduled {r", report)
        self.assertIn("sim : scheduled {r", report)
        self.assertIn("differs in scheduled", report)


if __name__ == "__main__":
    unittest.main()
