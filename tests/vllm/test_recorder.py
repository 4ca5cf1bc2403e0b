"""test_recorder.py - the vLLM recorder on vLLM's real V1 scheduler, driven headless: every
recorded trace passes `attnreplay info` and replays on the CPU backend with every verified step
passing; the trace holds what the engine decided; configurations trace v1 cannot express are
refused at start."""

import gzip
import json
import os
import types
import unittest

import common
from vllm_recorder import headless, recorder

TINY = dict(model_dir=common.TINY_MODEL)


def read(path):
    with gzip.open(path, "rt") as f:
        header = json.loads(f.readline())
        return header, [json.loads(line) for line in f if line.strip()]


def shared_prefix_workload(name, groups=3, prompts=6, system=512, question=100, output=24, rate=40, seed=2):
    """Mooncake-format rows; prompts share whole 512-token hash blocks, so `system` is a multiple of 512."""
    path = common.tmp(name + ".jsonl")
    headless.write_mooncake(path, headless.shared_prefix_rows(groups, prompts, system, question, output, rate, seed))
    return path


class RecordedTraceTests(unittest.TestCase):
    def check_trace(self, trace):
        rc, out = common.info(trace)
        self.assertEqual(rc, 0, out)
        rc, out, verified, failed = common.replay_cpu(trace)
        self.assertEqual(rc, 0, out)
        self.assertEqual(failed, 0, out)
        header, steps = read(trace)
        # every step that runs anything verified, and passed (a step may only list finished ids)
        self.assertEqual(verified, sum(1 for s in steps if s["num_scheduled_tokens"]), out)
        return header, steps

    def test_synthetic_shared_prefix(self):
        wl = shared_prefix_workload("sp")
        trace = common.tmp("sp.trace.jsonl.gz")
        stats = headless.record(wl, trace, num_blocks=1024, max_num_batched_tokens=512, **TINY)
        header, steps = self.check_trace(trace)
        self.assertEqual(len(steps), stats.steps)
        self.assertTrue(header["source"].startswith("vllm-0.33"))
        self.assertEqual(header["engine"]["scheduler_cls"], "RecordingScheduler")
        self.assertEqual(header["cache"]["num_blocks"], 1024)
        self.assertEqual(header["scheduler"]["max_num_batched_tokens"], 512)
        # prefix hits were recorded, and the shared system prompt has equal keys in every group
        hits = [n["num_computed_tokens"] for s in steps for n in s["new"]]
        self.assertEqual(len(hits), 18)
        self.assertGreater(sum(1 for h in hits if h == 512), 10)
        keys = {}
        for s in steps:
            for n in s["new"]:
                keys.setdefault(tuple(n["block_keys"][:32]), []).append(n["req"])
        self.assertEqual(sorted(len(v) for v in keys.values()), [6, 6, 6])
        # num_common_prefix_blocks recomputed as older vLLM did (vLLM 0.33 gives none): some step
        # runs with all requests of one group sharing their system prompt
        self.assertTrue(any(s["num_common_prefix_blocks"] > 0 for s in steps))
        self.assertTrue(all(s["duration"] == 0.02 for s in steps))

    def test_kv_starved_preempts_and_resumes(self):
        wl = shared_prefix_workload("starved", groups=2, prompts=8, system=512, question=16, output=200, rate=100)
        trace = common.tmp("starved.trace.jsonl.gz")
        stats = headless.record(wl, trace, num_blocks=120, max_num_batched_tokens=256, **TINY)
        _, steps = self.check_trace(trace)
        preempted = [r for s in steps for r in s["preempted"]]
        resumed = [c["req"] for s in steps for c in s["cached"] if c["resumed"]]
        self.assertGreater(len(preempted), 0)
        self.assertEqual(len(preempted), stats.preemptions)
        self.assertEqual(sorted(preempted), sorted(resumed))
        # a resumed request hits its own blocks that were still cached
        self.assertTrue(any(c["num_computed_tokens"] > 0 for s in steps for c in s["cached"] if c["resumed"]))
        finished = [r for s in steps for r in s["finished"]]
        self.assertEqual(len(finished), len(set(finished)))

    @unittest.skipUnless(common.have_mooncake(), "public Mooncake trace not found (AR_TRACES_PUBLIC or ../shared)")
    def test_mooncake_slice(self):
        wl = common.tmp("mc.jsonl")
        rows = headless.mooncake_slice(common.MOONCAKE, wl, 0, 24, 16, 600, 8192, max_input=6000)
        trace = common.tmp("mc.trace.jsonl.gz")
        headless.record(wl, trace, num_blocks=600, max_model_len=8192, **TINY)
        _, steps = self.check_trace(trace)
        self.assertEqual(len({n["req"] for s in steps for n in s["new"]}), len(rows))
        # every request but those finishing in the last step is listed finished, once
        finished = [r for s in steps for r in s["finished"]]
        self.assertEqual(len(finished), len(set(finished)))
        self.assertGreaterEqual(len(finished), len(rows) - len(steps[-1]["num_scheduled_tokens"]))

    def test_async_scheduler(self):
        wl = shared_prefix_workload("async", groups=2, prompts=6, system=512, question=60, output=30, rate=50)
        trace = common.tmp("async.trace.jsonl.gz")
        headless.record(wl, trace, async_scheduling=True, num_blocks=60, max_num_batched_tokens=256, **TINY)
        header, steps = self.check_trace(trace)
        self.assertEqual(header["engine"]["scheduler_cls"], "RecordingAsyncScheduler")
        self.assertTrue(header["engine"]["async_scheduling"])
        self.assertEqual(len({n["req"] for s in steps for n in s["new"]}), 12)
        # async: a decode is scheduled again before the previous step's token is processed
        decodes = [n for s in steps for c in s["cached"] for r, n in s["num_scheduled_tokens"].items() if r == c["req"]]
        self.assertGreater(len(decodes), 12 * 20)

    def test_prompt_token_ids_content(self):
        wl = shared_prefix_workload("tokens", groups=2, prompts=3, output=4)
        trace = common.tmp("tokens.trace.jsonl.gz")
        os.environ[recorder.CONTENT_ENV] = "tokens"
        try:
            headless.record(wl, trace, num_blocks=256, **TINY)
        finally:
            del os.environ[recorder.CONTENT_ENV]
        header, steps = self.check_trace(trace)
        new = [n for s in steps for n in s["new"]]
        self.assertTrue(all(len(n["prompt_token_ids"]) == n["prompt_len"] and "block_keys" not in n for n in new))
        self.assertEqual(header["engine"]["content"], "prompt_token_ids")


class RefusalTests(unittest.TestCase):
    """Configurations trace v1 cannot express are refused at start, each named."""

    def setUp(self):
        self.config, self.kv = headless.build_config(num_blocks=64, **TINY)

    def problems(self, config=None, kv=None, block_size=16, hash_block_size=16):
        return recorder.unsupported_configuration(config or self.config, kv or self.kv, block_size, hash_block_size)

    def test_plain_engine_is_accepted(self):
        self.assertEqual(self.problems(), [])

    def test_hybrid_groups_and_sliding_window(self):
        import torch
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
        swa = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16, sliding_window=128)
        kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                           kv_cache_groups=[self.kv.kv_cache_groups[0], KVCacheGroupSpec(["l1"], swa)])
        text = "; ".join(self.problems(kv=kv))
        self.assertIn("several KV-cache groups (2", text)
        self.assertIn("SlidingWindowSpec", text)

    def test_mamba_group(self):
        import torch
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec
        mamba = MambaSpec(block_size=16, shapes=((4, 4),), dtypes=(torch.bfloat16,))
        kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["m"], mamba)])
        self.assertIn("MambaSpec", "; ".join(self.problems(kv=kv)))

    def test_partial_block_hits(self):
        self.assertIn("partial-block prefix-cache hits", "; ".join(self.problems(hash_block_size=8)))

    def test_speculative_connectors_multimodal(self):
        fake = types.SimpleNamespace(**{k: getattr(self.config, k) for k in
                                        ("model_config", "cache_config", "parallel_config", "scheduler_config")})
        fake.speculative_config = object()
        fake.kv_transfer_config = object()
        fake.ec_transfer_config = object()
        fake.model_config = types.SimpleNamespace(is_multimodal_model=True, is_encoder_decoder=True,
                                                  enable_prompt_embeds=False, dtype=self.config.model_config.dtype)
        text = "; ".join(self.problems(config=fake))
        for phrase in ("speculative decoding", "a KV connector", "encoder-cache connector", "multimodal inputs",
                       "encoder inputs"):
            self.assertIn(phrase, text)

    def test_plugs_in_as_engine_core_builds_it(self):
        """--scheduler-cls resolves to the recorder, built with EngineCore's keyword arguments."""
        from vllm.v1.structured_output import StructuredOutputManager
        config, kv = headless.build_config(num_blocks=64, async_scheduling=True,
                                           scheduler_cls="vllm_recorder.RecordingAsyncScheduler", **TINY)
        cls = config.scheduler_config.get_scheduler_cls()
        self.assertIs(cls, recorder.RecordingAsyncScheduler)
        os.environ[recorder.TRACE_ENV] = common.tmp("engine.{rank}.trace.jsonl.gz")
        try:
            sched = cls(vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config),
                        include_finished_set=False, log_stats=True, block_size=16, hash_block_size=16)
        finally:
            del os.environ[recorder.TRACE_ENV]
        self.assertEqual(sched.ar_trace_path, common.tmp("engine.0.trace.jsonl.gz"))
        sched.shutdown()
        header, steps = read(sched.ar_trace_path)
        self.assertEqual((header["engine"]["scheduler_cls"], steps), ("RecordingAsyncScheduler", []))

    def test_refused_when_the_scheduler_is_built(self):
        config, kv = headless.build_config(num_blocks=64, **TINY)
        os.environ[recorder.TRACE_ENV] = common.tmp("never.trace.jsonl.gz")
        try:
            with self.assertRaises(ValueError) as cm:
                recorder.RecordingScheduler(vllm_config=config, kv_cache_config=kv, structured_output_manager=None,
                                            block_size=16, hash_block_size=8)
        finally:
            del os.environ[recorder.TRACE_ENV]
        self.assertIn("cannot record this engine in trace v1: partial-block", str(cm.exception))
        self.assertFalse(os.path.exists(common.tmp("never.trace.jsonl.gz")))


if __name__ == "__main__":
    unittest.main()
