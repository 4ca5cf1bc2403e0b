"""FlashAttention 3 (hopper/, the kernel vLLM runs on an H100 / H200) as an attnreplay backend,
when its Python interface `flash_attn_interface` imports (a build of flash-attention's hopper/
directory; kernels/peers/build_peers.sh makes one in .peers/built/fa3: put that folder on
PYTHONPATH, or set AR_PEERS_BUILT to the folder holding fa3/).

The cache is handed over as it is: k_cache and v_cache are the [num_blocks, block_size, Hkv, D]
halves of the host's [2, num_blocks, block_size, Hkv, D] cache, and vLLM's metadata maps one to
one onto flash_attn_with_kvcache's paged varlen call, as in vLLM's FlashAttention backend:
  q [T, Hq, D] packed, cu_seqlens_q = query_start_loc, max_seqlen_q = max_query_len,
  cache_seqlens = seq_lens (each request's keys, the new ones included: the host writes the new
  K/V into the cache first), page_table = block_table, causal (bottom-right aligned, FA's rule),
  window_size = (sliding_window - 1, 0), softcap = the logits soft cap.
plan() (untimed by the host, as vLLM's metadata builder) asks FA3 for its scheduler metadata once
per step, as vLLM does, when the build offers get_scheduler_metadata; forward then makes one call
per layer.  The LSE comes back [Hq, T] in natural log, the host's layout.  Flat only; an fp8 cache
is refused (FA3 wants Q, K and V in one dtype); a build without some feature (FA3 can be built
without sliding windows, soft caps, fp16 or some head sizes) fails the first forward with FA3's
own message.
"""
from ..backend import Backend
from . import half_dtype_reason, hopper_reason, import_built

HEAD_SIZES = (64, 96, 128, 192, 256)   # the head sizes FA3's hopper kernels are written for


def _import_fa3():
    """flash_attn_interface, from the path or from $AR_PEERS_BUILT/fa3; raises ImportError."""
    return import_built("flash_attn_interface", "fa3")


class FA3Paged(Backend):
    """FlashAttention 3's paged varlen kernel on the paged cache in place"""

    name = "fa3"
    summary = ("FlashAttention 3 (hopper/) flash_attn_with_kvcache on the paged cache in place: packed queries, "
               "cu_seqlens_q, page_table = block_table, scheduler metadata planned per step")
    capabilities = "fp16/bf16; GQA; sliding window; soft cap (where the build has them); flat only"
    device = "cuda"
    writes_kv = False
    cascade = False

    def check(self, config):
        reason = hopper_reason(_import_fa3, "FlashAttention 3", "FlashAttention 3's hopper kernels")
        if reason:
            return reason
        if config.head_size not in HEAD_SIZES:
            return "head size %d: FA3 has kernels for %s" % (config.head_size, ", ".join(map(str, HEAD_SIZES)))
        return half_dtype_reason(config, "FA3")   # FA3 takes Q, K and V in one dtype

    def open(self, config):
        import torch
        self.torch = torch
        self.fa3 = _import_fa3()
        self.cfg = config
        self.dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[config.dtype]
        w = config.sliding_window
        self.window = (w - 1, 0) if w > 0 else (-1, -1)
        self.softcap = config.logits_soft_cap if config.logits_soft_cap > 0 else 0.0
        self.has_sched = hasattr(self.fa3, "get_scheduler_metadata")

    def plan(self, step):
        torch = self.torch
        c = self.cfg
        self.cu_q = step.query_start_loc.to(torch.int32)
        self.seq_lens = step.seq_lens.to(torch.int32)
        self.table = step.block_table.to(torch.int32)
        self.max_q = int(step.max_query_len)
        self.sched = {}
        if self.has_sched:
            try:
                md = self.fa3.get_scheduler_metadata(
                    step.num_reqs, self.max_q, int(step.max_seq_len), c.num_q_heads, c.num_kv_heads, c.head_size,
                    self.seq_lens, qkv_dtype=self.dtype, cu_seqlens_q=self.cu_q, page_size=c.block_size, causal=True,
                    window_size=self.window, has_softcap=self.softcap > 0)
                self.sched = {"scheduler_metadata": md}
            except Exception:   # a build or version without it: FA3 schedules in the call
                self.has_sched = False

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        o, l, *_ = self.fa3.flash_attn_with_kvcache(
            q, kv_cache[0], kv_cache[1], cache_seqlens=self.seq_lens, page_table=self.table, cu_seqlens_q=self.cu_q,
            max_seqlen_q=self.max_q, softmax_scale=self.cfg.scale, causal=True, window_size=self.window,
            softcap=self.softcap, num_splits=0, return_softmax_lse=True, **self.sched)
        out.copy_(o)
        lse.copy_(l.reshape(lse.shape))   # varlen: [Hq, T], natural log
