"""recorder.py - recording subclasses of vLLM's V1 Scheduler and AsyncScheduler that write an
attnreplay trace v1 (DESIGN section 3, .jsonl or .jsonl.gz) from a running engine.

Plug in with `--scheduler-cls vllm_recorder.RecordingAsyncScheduler` (or RecordingScheduler when
async scheduling is off), with this directory's parent on PYTHONPATH; the trace goes to
$ATTNREPLAY_TRACE (default ./vllm-PID.trace.jsonl.gz; "{rank}" in it, or a ".dpN" suffix when
data-parallel, names the rank).  $ATTNREPLAY_TRACE_CONTENT=tokens writes the prompt token ids of
new requests instead of block keys (any other value but empty is refused).  The trace is written
as PATH.tmp-PID and renamed to PATH when the engine shuts down (or at exit): a write that fails
(a full disk) leaves no trace but says so in the log, and an engine killed with SIGKILL leaves
only PATH.tmp-PID (TraceWriter).

Per step the scheduling thread only copies what the step decided (SchedulerOutput lists, new
requests' prompt block hashes) and computes num_common_prefix_blocks; a writer thread turns it
into JSON and compresses it.  What a step line holds:
  new     request id, prompt_len, num_computed_tokens (the prefix hit), the whole block list, and
          block_keys: the first 8 bytes of vLLM's own chained block hash of every full prompt
          block (equal keys exactly where vLLM's prefix cache can share), or prompt_token_ids;
  cached  num_computed_tokens, new_block_ids appended, or the whole list with "resumed": true
          (a resumed request that a V2 model runner receives as new is written as resumed);
  num_scheduled_tokens, finished (ids this trace has scheduled), preempted;
  num_common_prefix_blocks: the engine's value when it gives one, else computed as vLLM up to
          0.2x did: running[0]'s leading blocks whose ref_cnt equals the number of requests
          holding blocks (FullAttentionManager.get_num_common_prefix_blocks);
  time    seconds since the first recorded step started; duration: until update_from_output
          returned for it.
The header carries the model, cache and scheduler blocks of the format and an "engine" block
with the resolved vLLM configuration.

Configurations the format cannot express are refused when the scheduler is built (ValueError
naming each): several KV-cache groups (hybrid sliding-window, Mamba), any KV-cache spec but full
attention (sliding window, chunked local, Mamba, cross-attention), speculative decoding,
partial-block prefix hits (hash_block_size < block_size), KV and encoder-cache connectors,
multimodal, encoder-decoder and prompt-embedding inputs, decode/prefill context parallelism, and
KV-cache dtypes the trace has no name for."""

import atexit
import gzip
import json
import logging
import os
import queue
import threading
import time

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

logger = logging.getLogger("vllm_recorder")

TRACE_ENV = "ATTNREPLAY_TRACE"
CONTENT_ENV = "ATTNREPLAY_TRACE_CONTENT"
# Steps the writer holds back waiting for update_from_output (their duration) before writing
# them without one.
MAX_PENDING_STEPS = 16

_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
_KV_DTYPE_NAMES = {"auto": "auto", "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
                   "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3"}


def _torch_dtype_name(dtype):
    name = str(dtype).replace("torch.", "")
    return _DTYPE_NAMES.get(name)


def unsupported_configuration(vllm_config, kv_cache_config, block_size, hash_block_size):
    """The reasons trace v1 cannot describe this engine, as a list of phrases (empty = fine)."""
    from vllm.v1 import kv_cache_interface as kvi
    full = kvi.FullAttentionSpec
    other = tuple(getattr(kvi, n) for n in ("SlidingWindowSpec", "ChunkedLocalAttentionSpec", "MambaSpec")
                  if hasattr(kvi, n))
    problems = []
    groups = kv_cache_config.kv_cache_groups
    if not groups:
        problems.append("no KV-cache group (an attention-free or encoder-only model)")
    elif len(groups) > 1:
        kinds = sorted({type(g.kv_cache_spec).__name__ for g in groups})
        problems.append(f"several KV-cache groups ({len(groups)}: {', '.join(kinds)}; hybrid "
                        "sliding-window or Mamba models)")
    for g in groups:
        spec = g.kv_cache_spec
        name = type(spec).__name__
        if isinstance(spec, other) or not isinstance(spec, full):
            problems.append(f"KV-cache spec {name} (only full attention; sliding-window, chunked-local, "
                            "Mamba and cross-attention blocks are not append-only block lists)")
        elif getattr(spec, "sliding_window", None) or getattr(spec, "attention_chunk_size", None):
            problems.append(f"{name} with a sliding window or attention chunks")
        if type(spec).__name__ not in ("FullAttentionSpec", "MLAAttentionSpec"):
            if not any(name in p for p in problems):
                problems.append(f"KV-cache spec {name} (only FullAttentionSpec and MLAAttentionSpec)")
    if vllm_config.speculative_config is not None:
        problems.append("speculative decoding (speculative_config)")
    if hash_block_size is not None and hash_block_size != block_size:
        problems.append(f"partial-block prefix-cache hits (hash_block_size {hash_block_size} < "
                        f"block_size {block_size})")
    if vllm_config.kv_transfer_config is not None:
        problems.append("a KV connector (kv_transfer_config)")
    if getattr(vllm_config, "ec_transfer_config", None) is not None:
        problems.append("an encoder-cache connector (ec_transfer_config)")
    mc = vllm_config.model_config
    if getattr(mc, "is_multimodal_model", False) or getattr(mc, "supports_multimodal_inputs", False):
        problems.append("multimodal inputs (a multimodal model)")
    if getattr(mc, "is_encoder_decoder", False):
        problems.append("encoder inputs (an encoder-decoder model)")
    if getattr(mc, "enable_prompt_embeds", False):
        problems.append("prompt embeddings (enable_prompt_embeds)")
    pc = vllm_config.parallel_config
    if getattr(pc, "decode_context_parallel_size", 1) > 1 or getattr(pc, "prefill_context_parallel_size", 1) > 1:
        problems.append("decode/prefill context parallelism (blocks interleaved over ranks)")
    kv = str(vllm_config.cache_config.cache_dtype)
    if kv not in _KV_DTYPE_NAMES:
        problems.append(f"kv_cache_dtype {kv} (the trace names auto, bf16, fp16, fp32, fp8_e4m3)")
    if _torch_dtype_name(mc.dtype) is None:
        problems.append(f"model dtype {mc.dtype} (the trace names bf16, fp16, fp32)")
    return problems


def _model_block(vllm_config):
    mc = vllm_config.model_config
    pc = vllm_config.parallel_config
    served = mc.served_model_name
    if isinstance(served, (list, tuple)):
        served = served[0] if served else None
    name = os.path.basename(str(served or mc.model).rstrip("/")) or "model"
    hf = mc.hf_text_config
    m = {"name": name[:63], "num_layers": mc.get_num_layers(pc), "num_q_heads": mc.get_num_attention_heads(pc)}
    if getattr(mc, "use_mla", False):
        m.update(attention="mla", kv_lora_rank=hf.kv_lora_rank, qk_rope_head_dim=hf.qk_rope_head_dim,
                 qk_nope_head_dim=hf.qk_nope_head_dim, v_head_dim=hf.v_head_dim)
    else:
        head_size = mc.get_head_size()
        m.update(attention="mha", num_kv_heads=mc.get_num_kv_heads(pc), head_size=head_size,
                 scale=head_size ** -0.5)
        cap = getattr(hf, "attn_logit_softcapping", None)
        if cap:
            m["logits_soft_cap"] = float(cap)
    return m


def _engine_block(scheduler, vllm_config, kv_cache_config, content):
    import vllm
    mc, sc, cc, pc = (vllm_config.model_config, vllm_config.scheduler_config, vllm_config.cache_config,
                      vllm_config.parallel_config)
    backend = None
    attn = getattr(vllm_config, "attention_config", None)
    if attn is not None:
        backend = getattr(attn, "backend", None)
    return {
        "vllm_version": vllm.__version__,
        "scheduler_cls": type(scheduler).__name__,
        "async_scheduling": bool(getattr(sc, "async_scheduling", False)),
        "max_model_len": mc.max_model_len,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "max_num_scheduled_tokens": scheduler.max_num_scheduled_tokens,
        "max_num_seqs": sc.max_num_seqs,
        "max_num_active_seqs": getattr(sc, "max_num_active_seqs", None),
        "enable_chunked_prefill": bool(sc.enable_chunked_prefill),
        "long_prefill_token_threshold": sc.long_prefill_token_threshold,
        "long_prefill_token_threshold_adaptive": bool(getattr(sc, "long_prefill_token_threshold_adaptive", False)),
        "policy": str(sc.policy),
        "scheduler_reserve_full_isl": bool(getattr(sc, "scheduler_reserve_full_isl", False)),
        "watermark": float(getattr(sc, "watermark", 0.0)),
        "prefill_schedule_interval": int(getattr(sc, "prefill_schedule_interval", 1)),
        "enable_prefix_caching": bool(cc.enable_prefix_caching),
        "prefix_caching_hash_algo": str(getattr(cc, "prefix_caching_hash_algo", "")),
        "block_size": cc.block_size,
        "num_gpu_blocks": kv_cache_config.num_blocks,
        "kv_cache_dtype": str(cc.cache_dtype),
        "dtype": str(mc.dtype).replace("torch.", ""),
        "attention_backend": None if backend is None else str(backend),
        "disable_cascade_attn": bool(getattr(mc, "disable_cascade_attn", True)),
        "tensor_parallel_size": pc.tensor_parallel_size,
        "pipeline_parallel_size": pc.pipeline_parallel_size,
        "data_parallel_size": pc.data_parallel_size,
        "data_parallel_rank": getattr(pc, "data_parallel_rank", 0),
        "content": content,
        "start_unix": time.time(),
    }


def _trace_path(vllm_config):
    pc = vllm_config.parallel_config
    rank = getattr(pc, "data_parallel_rank", 0) or 0
    path = os.environ.get(TRACE_ENV) or f"vllm-{os.getpid()}.trace.jsonl.gz"
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    if pc.data_parallel_size > 1:
        stem, dot, ext = path.partition(".trace")
        return f"{stem}.dp{rank}{dot}{ext}" if dot else f"{path}.dp{rank}"
    return path


def content_mode():
    """What new requests' content is written as, from $ATTNREPLAY_TRACE_CONTENT: "tokens" (prompt
    token ids) or None (unset or empty: vLLM's block hashes).  Any other value is refused."""
    value = os.environ.get(CONTENT_ENV, "")
    if value not in ("", "tokens"):
        raise ValueError(f"attnreplay vllm_recorder: {CONTENT_ENV}={value!r}: expected 'tokens' (prompt "
                         "token ids) or unset (vLLM's block hashes)")
    return value or None


class TraceWriter:
    """Writes a trace from a background thread.  put() hands over plain Python data; the thread
    builds the JSON lines and compresses them, so the caller pays only for a queue put.

    A regular file (or a new one) is written as PATH.tmp-PID beside it and renamed to PATH by
    close() once whole, so PATH is either the whole trace or what was there before: a write that
    fails (a full disk) removes the temporary file, and an engine killed outright leaves only it.
    A symlink, pipe or device (/dev/stdout) is written in place.  A PATH that cannot be created
    is an OSError naming it and $ATTNREPLAY_TRACE, raised when the engine starts."""

    def __init__(self, path, header):
        self.path = path
        self.tmp_path = None
        if os.path.isdir(path):
            raise OSError(f"attnreplay recorder: cannot write the trace {path} (${TRACE_ENV}): it is a directory")
        if not os.path.lexists(path) or (os.path.isfile(path) and not os.path.islink(path)):
            self.tmp_path = f"{path}.tmp-{os.getpid()}"
        target = self.tmp_path or path
        self._queue = queue.SimpleQueue()
        try:
            self._file = gzip.open(target, "wt", encoding="utf-8", compresslevel=6) if path.endswith(".gz") \
                else open(target, "w", encoding="utf-8")
            self._file.write(json.dumps(header, separators=(",", ":")) + "\n")
        except OSError as e:
            self._remove_tmp()
            raise OSError(f"attnreplay recorder: cannot write the trace {path} (${TRACE_ENV}): "
                          f"{e.strerror or e}") from e
        self._closed = False
        self.error = None
        self._thread = threading.Thread(target=self._run, name="attnreplay-trace-writer", daemon=True)
        self._thread.start()

    def put(self, item):
        if not self._closed:
            self._queue.put(item)

    def close(self):
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        if self.tmp_path is None:
            return
        if self.error is None:
            try:
                os.replace(self.tmp_path, self.path)
                return
            except OSError as e:
                self.error = e
                logger.error("attnreplay recorder: cannot rename %s to %s (%s)", self.tmp_path, self.path, e)
        self._remove_tmp()
        logger.error("attnreplay recorder: no trace written to %s (%s)", self.path, self.error)

    def _remove_tmp(self):
        if self.tmp_path is not None:
            try:
                os.unlink(self.tmp_path)
            except OSError:
                pass

    def _run(self):
        pending = {}   # step number -> line dict waiting for its duration
        while True:
            item = self._queue.get()
            if item is None:
                break
            if self.error is not None:
                continue
            try:
                kind = item[0]
                if kind == "step":
                    pending[item[1]] = _step_line(item)
                    while len(pending) > MAX_PENDING_STEPS:
                        self._write(pending.pop(min(pending)))
                elif kind == "done":
                    line = pending.get(item[1])
                    if line is not None:
                        line["duration"] = round(item[2] - item[3], 6)
                    for n in sorted(k for k in pending if k <= item[1]):
                        self._write(pending.pop(n))
            except Exception as e:   # disk full, ...: keep the engine serving, say so once
                self.error = e
                logger.error("attnreplay recorder: writing %s failed (%s); recording stops", self.path, e)
        try:
            if self.error is None:
                for n in sorted(pending):
                    self._write(pending[n])
            self._file.close()
        except Exception as e:
            self.error = self.error or e
            logger.error("attnreplay recorder: closing %s failed (%s)", self.path, e)

    def _write(self, line):
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")


def _hash_key(h):
    """A vLLM block hash (bytes, or an int for old versions) as 16 hex digits."""
    if isinstance(h, int):
        return f"{h & 0xFFFFFFFFFFFFFFFF:016x}"
    b = bytes(h)[:8]
    return b.rjust(8, b"\0").hex()


def _step_line(item):
    _, number, t, new, cached, scheduled, cpb, finished, preempted = item
    new_list = []
    for rid, prompt_len, computed, blocks, keys, tokens in new:
        entry = {"req": rid, "prompt_len": prompt_len, "num_computed_tokens": computed, "block_ids": blocks}
        if tokens is not None:
            entry["prompt_token_ids"] = tokens
        else:
            entry["block_keys"] = [_hash_key(h) for h in keys]
        new_list.append(entry)
    return {
        "step": number,
        "time": round(t, 6),
        "new": new_list,
        "cached": [{"req": rid, "num_computed_tokens": computed, "new_block_ids": blocks, "resumed": resumed}
                   for rid, computed, blocks, resumed in cached],
        "num_scheduled_tokens": scheduled,
        "num_common_prefix_blocks": cpb,
        "finished": finished,
        "preempted": preempted,
    }


class _RecordingMixin:
    """Wraps schedule() and update_from_output() of a vLLM scheduler class (see module doc)."""

    def __init__(self, *args, **kwargs):
        # Scheduler(vllm_config, kv_cache_config, structured_output_manager, block_size,
        #           hash_block_size=None, ...): refuse before vLLM builds anything
        names = ("vllm_config", "kv_cache_config", "structured_output_manager", "block_size", "hash_block_size")
        given = dict(zip(names, args))
        given.update((k, v) for k, v in kwargs.items() if k in names)
        block_size = given.get("block_size")
        hash_block_size = given.get("hash_block_size") or block_size
        problems = unsupported_configuration(given["vllm_config"], given["kv_cache_config"], block_size,
                                             hash_block_size)
        if problems:
            raise ValueError("attnreplay vllm_recorder cannot record this engine in trace v1: "
                             + "; ".join(problems))
        tokens = content_mode() == "tokens"
        super().__init__(*args, **kwargs)
        self._ar_tokens = tokens
        # the clock the trace times come from; the headless driver sets its simulated clock
        self.ar_clock = time.monotonic
        self._ar_t0 = None
        self._ar_step = 0
        self._ar_known = set()      # request ids written as new and not finished since
        self._ar_open = {}          # id(SchedulerOutput) -> (step number, start time)
        self.ar_header = {
            "format": "attnreplay-trace",
            "version": 1,
            "model": _model_block(self.vllm_config),
            "cache": {"block_size": self.block_size, "num_blocks": self.kv_cache_config.num_blocks,
                      "dtype": _torch_dtype_name(self.vllm_config.model_config.dtype),
                      "kv_cache_dtype": _KV_DTYPE_NAMES[str(self.cache_config.cache_dtype)]},
            "scheduler": {"max_num_batched_tokens": self.max_num_scheduled_tokens,
                          "max_num_seqs": self.scheduler_config.max_num_seqs,
                          "prefix_caching": bool(self.cache_config.enable_prefix_caching),
                          "cascade": not bool(getattr(self.vllm_config.model_config, "disable_cascade_attn", True))},
            "source": "vllm",
            "seed": int(self.vllm_config.model_config.seed or 0),
            "engine": _engine_block(self, self.vllm_config, self.kv_cache_config,
                                    "prompt_token_ids" if self._ar_tokens else "vllm block hashes"),
        }
        self.ar_header["source"] = f"vllm-{self.ar_header['engine']['vllm_version']}"
        self.ar_trace_path = _trace_path(self.vllm_config)
        self._ar_writer = TraceWriter(self.ar_trace_path, self.ar_header)
        atexit.register(self._ar_writer.close)
        logger.info("attnreplay recorder: writing %s", self.ar_trace_path)

    # -- the hooks -------------------------------------------------------------------------

    def schedule(self, *args, **kwargs):
        start = self.ar_clock()
        out = super().schedule(*args, **kwargs)
        self._ar_record(out, start)
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        result = super().update_from_output(scheduler_output, model_runner_output)
        opened = self._ar_open.pop(id(scheduler_output), None)
        if opened is not None:
            self._ar_writer.put(("done", opened[0], self.ar_clock(), opened[1]))
        return result

    def shutdown(self):
        try:
            super().shutdown()
        finally:
            self.ar_close()

    def ar_close(self):
        """Flushes and closes the trace (also done at shutdown and at exit)."""
        self._ar_writer.close()

    # -- one step ------------------------------------------------------------------------------

    def _ar_common_prefix_blocks(self, out):
        given = getattr(out, "num_common_prefix_blocks", None)
        if given:
            return int(given[0])
        if not self.cache_config.enable_prefix_caching or not self.running:
            return 0
        manager = self.kv_cache_manager.coordinator.single_type_managers[0]
        blocks = manager.req_to_blocks.get(self.running[0].request_id, ())
        holders = len(manager.req_to_blocks)
        n = 0
        for block in blocks:
            if block.ref_cnt != holders:
                break
            n += 1
        return n

    def _ar_record(self, out, start):
        known = self._ar_known
        new, cached = [], []
        for nr in out.scheduled_new_reqs:
            rid = nr.req_id
            blocks = list(nr.block_ids[0])
            if rid in known:   # a V2 model runner receives resumed requests as new
                cached.append((rid, nr.num_computed_tokens, blocks, True))
                continue
            request = self.requests[rid]
            prompt_len = request.num_prompt_tokens
            tokens = keys = None
            if self._ar_tokens or len(request.block_hashes) < prompt_len // self.block_size:
                tokens = list(request.prompt_token_ids)
            else:
                keys = request.block_hashes[:prompt_len // self.block_size]
            new.append((rid, prompt_len, nr.num_computed_tokens, blocks, keys, tokens))
        c = out.scheduled_cached_reqs
        resumed_ids = c.resumed_req_ids
        for i, rid in enumerate(c.req_ids):
            nb = c.new_block_ids[i]
            cached.append((rid, c.num_computed_tokens[i], list(nb[0]) if nb else [], rid in resumed_ids))
        finished = sorted(r for r in out.finished_req_ids if r in known)
        preempted = sorted(out.preempted_req_ids or ())
        scheduled = dict(out.num_scheduled_tokens)
        if not scheduled and not finished and not preempted:
            return
        known.difference_update(finished)
        known.update(entry[0] for entry in new)
        if self._ar_t0 is None:
            self._ar_t0 = start
        number = self._ar_step
        self._ar_step += 1
        self._ar_open[id(out)] = (number, start)
        self._ar_writer.put(("step", number, start - self._ar_t0, new, cached, scheduled,
                             self._ar_common_prefix_blocks(out), finished, preempted))


class RecordingScheduler(_RecordingMixin, Scheduler):
    """vLLM's Scheduler, recording every step into an attnreplay trace."""


class RecordingAsyncScheduler(_RecordingMixin, AsyncScheduler):
    """vLLM's AsyncScheduler (the default with async scheduling), recording every step."""
