"""headless.py - drives vLLM's real V1 scheduler without a model or a GPU, on the same workload
and clock as `attnreplay sim`, and records what it decides.

The engine: a VllmConfig built from a local Llama-shaped config.json (models/llama-3.1-8b) with
skip_tokenizer_init and DeviceConfig("cpu"), one full-attention KV-cache group of num_blocks
blocks (block 0 is vLLM's null block, as in the sim), and the scheduler class asked for (plain,
recording, async).  The model runner is fabricated: every scheduled request whose step reaches
its token count (a finished prompt or a decode) samples one token; a partial prefill samples
none.  Sampled tokens are a function of (request, position), so generated blocks never match
another request's blocks in vLLM's prefix cache, as in the sim, where they are request-private.

The workload: a Mooncake-format JSON Lines file (timestamp in ms, input_length, output_length,
hash_ids of 512-token blocks), the same file `attnreplay sim --workload mooncake:FILE` reads.
Token ids are a function of (hash id, offset inside its 512-token block), so two prompts share
a 16-token block exactly when the sim gives them equal content keys.  The synthetic and KV-starved
workloads of the tests are written in this format too.

The clock (the one the sim uses, in the same floating-point arithmetic): arrivals are the
workload's timestamps; every step takes a constant step time; the clock ticks in whole
microseconds (t_end = round((now + step) * 1e6) / 1e6); when nothing is running or waiting it
jumps to the next arrival rounded up to a microsecond; a request joins the waiting queue before
the first step that starts at or after its arrival.

Synchronous engines run schedule -> fabricated output -> update_from_output per step, as vLLM's
EngineCore.step does; async ones keep a batch queue of two as EngineCore.step_with_batch_queue
does (schedule the next step before the previous one's output is processed).

  python -m vllm_recorder.headless --workload FILE --out TRACE [--num-blocks N] [--async] ...
"""

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(HERE, "models", "llama-3.1-8b")
MOONCAKE_BLOCK = 512
VOCAB = 128256
_MASK = (1 << 64) - 1


def _mix64(x):
    """splitmix64's finaliser (a bijection of 64-bit integers)."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


# ---- workloads --------------------------------------------------------------------------------

class Request:
    __slots__ = ("index", "arrival", "prompt_len", "output_len", "hash_ids")

    def __init__(self, index, arrival, prompt_len, output_len, hash_ids):
        self.index, self.arrival, self.prompt_len, self.output_len, self.hash_ids = \
            index, arrival, prompt_len, output_len, hash_ids

    @property
    def id(self):
        return f"r{self.index}"   # the sim's request ids

    def prompt_token_ids(self):
        """Token t is a function of (hash id of its 512-token block, t mod 512)."""
        import numpy as np
        t = np.arange(self.prompt_len, dtype=np.uint64)
        h = np.asarray(self.hash_ids, dtype=np.uint64)[t // MOONCAKE_BLOCK]
        x = (h << np.uint64(10)) + (t % np.uint64(MOONCAKE_BLOCK)) + np.uint64(0x544F4B00000000)
        with np.errstate(over="ignore"):
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            x = x ^ (x >> np.uint64(31))
        return (x % np.uint64(VOCAB)).astype(np.int64).tolist()

    def sampled_token(self, position):
        return _mix64((self.index + 1) << 32 ^ position ^ 0x53414D5000000000) % VOCAB


def read_mooncake(path):
    """Rows of a Mooncake-format file as Requests, arrival = timestamp / 1000.0 seconds shifted so
    the first is 0 (what the sim's loader does)."""
    reqs = []
    first = None
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            ts = float(row["timestamp"])
            if first is None:
                first = ts / 1000.0
            arrival = ts / 1000.0 - first
            reqs.append(Request(len(reqs), arrival, int(row["input_length"]), int(row["output_length"]),
                                [int(h) for h in row["hash_ids"]]))
    return reqs


def workload_file(spec, scratch_dir):
    """A Mooncake-format file for `spec`: a path, or "shared-prefix:groups=G,prompts=P,system=S,
    question=Q,output=O[,rate=R][,seed=X]" written into scratch_dir."""
    if not spec.startswith("shared-prefix:"):
        return spec
    kw = {"rate": 10.0, "seed": 1}
    for item in spec.split(":", 1)[1].split(","):
        key, _, value = item.partition("=")
        if key not in ("groups", "prompts", "system", "question", "output", "rate", "seed"):
            raise ValueError(f"{spec}: unknown key {key!r}")
        kw[key] = float(value) if key == "rate" else int(value)
    path = os.path.join(scratch_dir, "shared-prefix.jsonl")
    write_mooncake(path, shared_prefix_rows(**kw))
    return path


def write_mooncake(path, rows):
    """rows: (timestamp_ms, input_length, output_length, hash_ids)."""
    with open(path, "w") as f:
        for ts, n_in, n_out, hashes in rows:
            f.write(json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out,
                                "hash_ids": list(hashes)}) + "\n")


def mooncake_slice(src, dst, start, count, block_size, num_blocks, max_model_len, max_input=None):
    """Copies `count` rows of a Mooncake file from row `start` into dst with timestamps shifted to
    start at 0, keeping only requests that can ever run (prompt + output within max_model_len and
    within the cache; input at most max_input).  Returns the rows kept."""
    rows = []
    with open(src) as f:
        for i, line in enumerate(f):
            if i < start or not line.strip():
                continue
            row = json.loads(line)
            n_in, n_out = int(row["input_length"]), int(row["output_length"])
            if max_input and n_in > max_input:
                continue
            if n_in + n_out > max_model_len or -(-(n_in + n_out - 1) // block_size) > num_blocks - 1:
                continue
            rows.append((int(row["timestamp"]), n_in, n_out, row["hash_ids"]))
            if len(rows) == count:
                break
    t0 = rows[0][0] if rows else 0
    rows = [(ts - t0, a, b, h) for ts, a, b, h in rows]
    write_mooncake(dst, rows)
    return rows


def shared_prefix_rows(groups, prompts, system, question, output, rate, seed=1):
    """SGLang generated-shared-prefix style rows: groups x prompts requests, each the group's
    `system`-token prompt then a unique `question`-token one, shuffled, Poisson arrivals."""
    import random
    rng = random.Random(seed)
    n_sys = -(-system // MOONCAKE_BLOCK)
    reqs = []
    next_hash = 1000000
    for g in range(groups):
        sys_hashes = [g * 1000 + k for k in range(n_sys)]
        for _ in range(prompts):
            n_in = system + question
            total = -(-n_in // MOONCAKE_BLOCK)
            # the system prompt's last (partial) 512-block is shared only up to `system` tokens:
            # give the question its own hash ids from that block on
            shared = system // MOONCAKE_BLOCK
            hashes = sys_hashes[:shared] + list(range(next_hash, next_hash + total - shared))
            next_hash += total - shared
            reqs.append((n_in, output, hashes))
    rng.shuffle(reqs)
    rows, t = [], 0.0
    for n_in, n_out, hashes in reqs:
        rows.append((int(round(t * 1000)), n_in, n_out, hashes))
        t += rng.expovariate(rate)
    return rows


# ---- the engine -------------------------------------------------------------------------------

def build_config(model_dir=DEFAULT_MODEL, block_size=16, num_blocks=4096, max_num_batched_tokens=2048,
                 max_num_seqs=128, max_model_len=32768, long_prefill_token_threshold=0,
                 enable_prefix_caching=True, async_scheduling=False, reserve_full_isl=True, scheduler_cls=None):
    """(VllmConfig, KVCacheConfig) for a headless scheduler; num_blocks includes the null block."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    model = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=max_model_len,
                        dtype="bfloat16", seed=0)
    sched = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                            max_model_len=max_model_len, is_encoder_decoder=False, enable_chunked_prefill=True,
                            long_prefill_token_threshold=long_prefill_token_threshold,
                            async_scheduling=async_scheduling, scheduler_reserve_full_isl=reserve_full_isl,
                            scheduler_cls=scheduler_cls)
    cache = CacheConfig(block_size=block_size, cache_dtype="auto", enable_prefix_caching=enable_prefix_caching)
    config = VllmConfig(scheduler_config=sched, model_config=model, cache_config=cache,
                        device_config=DeviceConfig(device="cpu"))
    config.cache_config.num_gpu_blocks = num_blocks
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=model.get_num_kv_heads(config.parallel_config),
                             head_size=model.get_head_size(), dtype=torch.bfloat16)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)])
    return config, kv


def make_scheduler(cls, config, kv_cache_config):
    from vllm.v1.structured_output import StructuredOutputManager
    block_size = config.cache_config.block_size
    return cls(vllm_config=config, kv_cache_config=kv_cache_config,
               structured_output_manager=StructuredOutputManager(config), block_size=block_size,
               hash_block_size=block_size, log_stats=False)


def _c_round(x):
    """C's round() (half away from zero) for x >= 0."""
    f = math.floor(x)
    return f + 1.0 if x - f >= 0.5 else f


class RunStats:
    def __init__(self):
        self.steps = 0
        self.schedule_s = 0.0      # wall time inside schedule()
        self.update_s = 0.0        # wall time inside update_from_output()
        self.preemptions = 0


def drive(scheduler, workload, step_time=0.02, async_batches=False, max_steps=10 ** 7, on_step=None):
    """Runs the workload to completion through scheduler (see the module doc for the clock).
    on_step(scheduler_output) is called after every schedule().  Returns RunStats."""
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request as VllmRequest

    init_none_hash(sha256)
    hasher = get_request_block_hasher(scheduler.block_size, sha256)
    by_id = {r.id: r for r in workload}
    stats = RunStats()
    clock = {"now": 0.0}
    if hasattr(scheduler, "ar_clock"):
        scheduler.ar_clock = lambda: clock["now"]
    nxt = 0
    inflight = []   # (SchedulerOutput, {req: samples?}) not yet processed, oldest first

    def unfinished():
        running, waiting = scheduler.get_request_counts()
        return running + waiting

    def arrive(now):
        nonlocal nxt
        while nxt < len(workload) and workload[nxt].arrival <= now + 5e-7:
            r = workload[nxt]
            scheduler.add_request(VllmRequest(
                r.id, r.prompt_token_ids(), SamplingParams(max_tokens=r.output_len, ignore_eos=True), None,
                arrival_time=r.arrival, block_hasher=hasher))
            nxt += 1

    def process(so, samples):
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            if samples[rid]:
                req = scheduler.requests.get(rid)
                pos = req.num_tokens if req is not None else 0
                sampled.append([by_id[rid].sampled_token(pos)])
            else:
                sampled.append([])
        out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=sampled)
        t = time.perf_counter()
        scheduler.update_from_output(so, out)
        stats.update_s += time.perf_counter() - t

    idle = 0   # schedule() calls in a row that scheduled nothing
    while stats.steps < max_steps:
        if unfinished() == 0:
            if inflight:   # outputs still to process: the step would be empty
                process(*inflight.pop(0))
                continue
            if nxt >= len(workload):
                break
            a = workload[nxt].arrival
            t = math.ceil(a * 1e6) / 1e6
            if t < a:
                t = a
            if t > clock["now"]:
                clock["now"] = t
        arrive(clock["now"])
        t = time.perf_counter()
        so = scheduler.schedule()
        stats.schedule_s += time.perf_counter() - t
        if on_step is not None:
            on_step(so)
        stats.preemptions += len(so.preempted_req_ids or ())
        idle = idle + 1 if so.total_num_scheduled_tokens == 0 else 0
        if idle > len(inflight) + 1:
            raise RuntimeError(f"step {stats.steps}: vLLM scheduled nothing with {unfinished()} requests "
                               "unfinished (a request that can never fit?)")
        # a step samples for a request iff it is not a partial prefill (vLLM's is_prefill_chunk)
        samples = {rid: not scheduler.requests[rid].is_prefill_chunk for rid in so.num_scheduled_tokens}
        inflight.append((so, samples))
        if so.total_num_scheduled_tokens > 0:
            stats.steps += 1
            end = _c_round((clock["now"] + step_time) * 1e6) / 1e6
            clock["now"] = end if end > clock["now"] else clock["now"] + 1e-6
        if async_batches and len(inflight) < 2 and so.total_num_scheduled_tokens > 0:
            continue
        while inflight:
            process(*inflight.pop(0))
            if async_batches:
                break
    while inflight:
        process(*inflight.pop(0))
    return stats


def scheduler_class(kind):
    """'plain', 'async', 'record', 'record-async' -> a scheduler class."""
    if kind == "plain":
        from vllm.v1.core.sched.scheduler import Scheduler
        return Scheduler
    if kind == "async":
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        return AsyncScheduler
    from vllm_recorder.recorder import RecordingAsyncScheduler, RecordingScheduler
    return RecordingAsyncScheduler if kind == "record-async" else RecordingScheduler


def record(workload_path, out_path, step_time=0.02, async_scheduling=False, **config_kwargs):
    """Records the workload through vLLM's (async) scheduler into out_path; returns RunStats."""
    workload = read_mooncake(workload_path)
    kind = "record-async" if async_scheduling else "record"
    config, kv = build_config(async_scheduling=async_scheduling, **config_kwargs)
    saved = os.environ.get("ATTNREPLAY_TRACE")
    os.environ["ATTNREPLAY_TRACE"] = out_path
    try:
        scheduler = make_scheduler(scheduler_class(kind), config, kv)
    finally:
        if saved is None:
            del os.environ["ATTNREPLAY_TRACE"]
        else:
            os.environ["ATTNREPLAY_TRACE"] = saved
    try:
        stats = drive(scheduler, workload, step_time=step_time, async_batches=async_scheduling)
    finally:
        scheduler.ar_close()
    if scheduler._ar_writer.error is not None:
        raise RuntimeError(f"writing {out_path} failed: {scheduler._ar_writer.error}")
    return stats


def add_engine_args(p):
    """The workload, engine configuration and clock options shared by the command lines."""
    p.add_argument("--workload", required=True,
                   help="Mooncake-format JSON Lines file, or shared-prefix:groups=G,prompts=P,system=S,question=Q,"
                        "output=O[,rate=R][,seed=X]")
    p.add_argument("--model-dir", default=DEFAULT_MODEL, help="directory with a Llama-shaped config.json")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=4096, help="KV blocks including the null block")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--long-prefill-token-threshold", type=int, default=0)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--no-reserve-full-isl", action="store_true", help="scheduler_reserve_full_isl=False")
    p.add_argument("--step-time", type=float, default=0.02, help="seconds per step (constant clock)")


def engine_kwargs(a):
    """build_config keyword arguments from add_engine_args options."""
    return dict(model_dir=a.model_dir, block_size=a.block_size, num_blocks=a.num_blocks, max_num_batched_tokens=a.max_num_batched_tokens,
                max_num_seqs=a.max_num_seqs, max_model_len=a.max_model_len,
                long_prefill_token_threshold=a.long_prefill_token_threshold,
                enable_prefix_caching=not a.no_prefix_caching, reserve_full_isl=not a.no_reserve_full_isl)


def main(argv=None):
    p = argparse.ArgumentParser(description="Drive vLLM's V1 scheduler headless over a Mooncake-format "
                                "workload and record an attnreplay trace.")
    p.add_argument("--out", required=True, help="trace to write (.jsonl or .jsonl.gz)")
    p.add_argument("--async", dest="async_scheduling", action="store_true", help="AsyncScheduler, batch queue 2")
    add_engine_args(p)
    a = p.parse_args(argv)
    import tempfile
    stats = record(workload_file(a.workload, tempfile.mkdtemp(prefix="headless.")), a.out, step_time=a.step_time, async_scheduling=a.async_scheduling,
                   **engine_kwargs(a))
    print(f"headless: {stats.steps} steps, {stats.preemptions} preemptions, schedule() "
          f"{1e6 * stats.schedule_s / max(stats.steps, 1):.0f} us/step -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
