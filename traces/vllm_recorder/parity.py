"""parity.py - step-by-step comparison of `attnreplay sim` against vLLM's real V1 scheduler on one
workload, configuration and clock.

vLLM's side is recorded headless (headless.py, RecordingScheduler); the sim writes its trace with
the same block size, cache size, budget, max_num_seqs, threshold, max_model_len and a constant
step time.  Both traces are read back and, step by step, these decisions must agree:
  scheduled   num_scheduled_tokens per request;
  hits        num_computed_tokens of every new request (its prefix-cache hit) and of every
              resumed one (the hit on re-admission);
  resumed     which requests come back from preemption;
  preempted   which requests are preempted;
  finished    which requests are listed as finished (so the finish order agrees step by step).
A step agrees when all five agree; a step present on one side only disagrees.  Block ids are
compared too, but only reported (they agree when the block pool's free order is modelled too).

  python -m vllm_recorder.parity --attnreplay bin/attnreplay --workload FILE [config options]
exits 0 when at least --min-agreement of the steps agree, printing the first divergence with
both sides' decisions otherwise (and always when --verbose)."""

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile

from vllm_recorder import headless


def read_trace(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        header = json.loads(f.readline())
        return header, [json.loads(line) for line in f if line.strip()]


def decisions(step):
    """The compared decisions of one trace step."""
    return {
        "scheduled": dict(step.get("num_scheduled_tokens", {})),
        "hits": {**{n["req"]: n["num_computed_tokens"] for n in step.get("new", [])},
                 **{c["req"]: c["num_computed_tokens"] for c in step.get("cached", []) if c.get("resumed")}},
        "resumed": sorted(c["req"] for c in step.get("cached", []) if c.get("resumed")),
        "preempted": sorted(step.get("preempted", [])),
        "finished": sorted(step.get("finished", [])),
    }


def blocks(step):
    out = {n["req"]: n["block_ids"] for n in step.get("new", [])}
    out.update({c["req"]: c.get("new_block_ids", []) for c in step.get("cached", [])})
    return out


def _short(d, limit=12):
    items = sorted(d.items(), key=lambda kv: int(kv[0][1:]) if kv[0][1:].isdigit() else 0)
    text = ", ".join(f"{k}:{v}" for k, v in items[:limit])
    return "{" + text + (f", ... {len(items) - limit} more" if len(items) > limit else "") + "}"


def describe(dec):
    return (f"scheduled {_short(dec['scheduled'])} hits {_short(dec['hits'])} resumed {dec['resumed']} "
            f"preempted {dec['preempted']} finished {dec['finished']}")


class Result:
    def __init__(self, vllm_steps, sim_steps):
        n = max(len(vllm_steps), len(sim_steps))
        self.steps = n
        self.agree = 0
        self.blocks_agree = 0
        self.first = None
        self.preemptions = (sum(len(s.get("preempted", [])) for s in vllm_steps),
                            sum(len(s.get("preempted", [])) for s in sim_steps))
        for i in range(n):
            a = decisions(vllm_steps[i]) if i < len(vllm_steps) else None
            b = decisions(sim_steps[i]) if i < len(sim_steps) else None
            if a is not None and a == b:
                self.agree += 1
                if blocks(vllm_steps[i]) == blocks(sim_steps[i]):
                    self.blocks_agree += 1
            elif self.first is None:
                self.first = (i, a, b)

    @property
    def fraction(self):
        return self.agree / self.steps if self.steps else 1.0

    def report(self, name):
        lines = [f"parity {name}: {self.agree}/{self.steps} steps agree ({100 * self.fraction:.2f}%), "
                 f"block ids agree on {self.blocks_agree}; preemptions vLLM {self.preemptions[0]}, "
                 f"sim {self.preemptions[1]}"]
        if self.first is not None:
            i, a, b = self.first
            lines.append(f"  first divergence at step {i}:")
            for side, d in (("vLLM", a), ("sim ", b)):
                lines.append(f"    {side}: " + ("(no step)" if d is None else describe(d)))
            if a is not None and b is not None:
                for key in a:
                    if a[key] != b[key]:
                        if isinstance(a[key], dict):
                            diff = sorted(set(a[key].items()) ^ set(b[key].items()))
                            lines.append(f"    differs in {key}: vLLM {dict((k, v) for k, v in diff if a[key].get(k) == v)}"
                                         f" sim {dict((k, v) for k, v in diff if b[key].get(k) == v)}")
                        else:
                            lines.append(f"    differs in {key}: vLLM {a[key]} sim {b[key]}")
        return "\n".join(lines)


def run_sim(attnreplay, workload_path, out_path, cfg, step_time, extra=()):
    """`attnreplay sim` with the configuration of build_config's keyword arguments cfg."""
    if not cfg.get("enable_prefix_caching", True):
        extra = (*extra, "--no-prefix-caching")
    if not cfg.get("reserve_full_isl", True):
        extra = (*extra, "--no-reserve-full-isl")
    cmd = [attnreplay, "sim", "--workload", f"mooncake:{workload_path}", "--model", "llama-3.1-8b",
           "--num-blocks", str(cfg["num_blocks"]), "--block-size", str(cfg["block_size"]),
           "--max-num-batched-tokens", str(cfg["max_num_batched_tokens"]),
           "--max-num-seqs", str(cfg["max_num_seqs"]),
           "--long-prefill-token-threshold", str(cfg["long_prefill_token_threshold"]),
           "--max-model-len", str(cfg["max_model_len"]), "--step-time", f"constant:{step_time!r}",
           "--out", out_path, "--quiet", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")


def compare(attnreplay, workload_path, workdir, name, step_time=0.02, sim_extra=(), **cfg):
    """Runs both sides; returns (Result, vLLM trace path, sim trace path, headless RunStats)."""
    full = dict(block_size=16, num_blocks=4096, max_num_batched_tokens=2048, max_num_seqs=128,
                max_model_len=32768, long_prefill_token_threshold=0, enable_prefix_caching=True,
                reserve_full_isl=True)
    full.update(cfg)
    vllm_trace = os.path.join(workdir, f"{name}.vllm.trace.jsonl.gz")
    sim_trace = os.path.join(workdir, f"{name}.sim.trace.jsonl.gz")
    stats = headless.record(workload_path, vllm_trace, step_time=step_time, **full)
    run_sim(attnreplay, workload_path, sim_trace, full, step_time, sim_extra)
    _, a = read_trace(vllm_trace)
    _, b = read_trace(sim_trace)
    return Result(a, b), vllm_trace, sim_trace, stats


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--attnreplay", default="bin/attnreplay")
    p.add_argument("--name", default="parity")
    headless.add_engine_args(p)
    p.add_argument("--min-agreement", type=float, default=0.995)
    p.add_argument("--keep", help="directory to keep both traces in")
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    workdir = a.keep or tempfile.mkdtemp(prefix="parity.")
    os.makedirs(workdir, exist_ok=True)
    res, _, _, _ = compare(a.attnreplay, headless.workload_file(a.workload, workdir), workdir, a.name, step_time=a.step_time,
                           **headless.engine_kwargs(a))
    ok = res.fraction >= a.min_agreement
    print(res.report(a.name) if (a.verbose or not ok) else res.report(a.name).split("\n")[0])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
