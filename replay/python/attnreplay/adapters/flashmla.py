"""FlashMLA (deepseek-ai/FlashMLA, the MLA decode kernel vLLM runs for DeepSeek on Hopper) as an
attnreplay backend for MLA models, when its Python package `flash_mla` imports (a build of
FlashMLA; kernels/peers/build_peers.py makes one in .peers/built/flashmla: put that folder on
PYTHONPATH, or set AR_PEERS_BUILT to the folder holding flashmla/).

The plugin ABI's MLA contract (replay/attnreplay_plugin.h) is FlashMLA's dense decode interface:
the host absorbs W_UK into q [T, Hq, 576] and applies W_UV to the latent output [T, Hq, 512]
after; the latent cache [num_blocks, 64, 576] is FlashMLA's k_cache with one KV head, values the
first 512 elements of each entry.  flash_mla_with_kvcache takes a batch of requests with one
query length each, q [b, s_q, Hq, 576], so plan() groups the step's requests by query length and
makes one scheduler metadata per group (get_mla_metadata, as vLLM makes it once per step; a group's
shapes and seq_lens are the same for every layer of the step), and forward() makes one call per
group: decodes (s_q 1) in one call, each prefill chunk length in its own, causal (FlashMLA's mask
is bottom-right aligned, vLLM's rule) when s_q > 1.  vLLM itself sends prefills through
FlashAttention's varlen kernel in the expanded form; here FlashMLA computes them too, so a step's
time is FlashMLA's on the whole step.  The LSE comes back [b, Hq, s_q] in natural log and is
scattered into the host's [Hq, T].  bf16 / fp16 with a cache of the same dtype (FlashMLA's fp8
cache is its own 656-byte format), block size 64, kv_lora_rank 512 and rope dim 64 only.
"""
from ..backend import Backend
from . import half_dtype_reason, hopper_reason, import_built


def _import_flashmla():
    """flash_mla, from the path or from $AR_PEERS_BUILT/flashmla; raises ImportError."""
    return import_built("flash_mla", "flashmla")


class FlashMLADense(Backend):
    """FlashMLA's dense decode kernel on the latent cache in place, one call per query length"""

    name = "flashmla"
    summary = ("FlashMLA flash_mla_with_kvcache (dense, sm90) on the latent cache in place: requests grouped by "
               "query length, one scheduler metadata per group and step")
    capabilities = "MLA only (kv_lora_rank 512, rope 64); fp16/bf16, cache in the same dtype; block size 64"
    device = "cuda"
    writes_kv = False
    cascade = False
    mla = True

    def check(self, config):
        if config.attention != "mla":
            return "FlashMLA runs MLA models only (this one is %s)" % config.attention
        reason = hopper_reason(_import_flashmla, "FlashMLA", "FlashMLA's dense decode kernels")
        if reason:
            return reason
        if config.kv_lora_rank != 512 or config.qk_rope_head_dim != 64:
            return "kv_lora_rank %d, rope %d: FlashMLA has kernels for 512 + 64" % (config.kv_lora_rank,
                                                                                 config.qk_rope_head_dim)
        if config.block_size != 64:
            return "block size %d: FlashMLA's paged cache has blocks of 64" % config.block_size
        return half_dtype_reason(config, "FlashMLA")   # its fp8 cache is a format of its own

    def open(self, config):
        import torch
        self.torch = torch
        self.mla = _import_flashmla()
        self.cfg = config

    def plan(self, step):
        torch = self.torch
        qsl = step.query_start_loc_cpu.tolist()
        lens = [qsl[r + 1] - qsl[r] for r in range(step.num_reqs)]
        dev = step.block_table.device
        self.groups = []
        for s_q in sorted(set(lens)):
            reqs = [r for r in range(step.num_reqs) if lens[r] == s_q]
            rows = torch.tensor([qsl[r] + i for r in reqs for i in range(s_q)], dtype=torch.long, device=dev)
            idx = torch.tensor(reqs, dtype=torch.long, device=dev)
            self.groups.append({
                "b": len(reqs), "s_q": s_q, "rows": rows,
                "table": step.block_table.index_select(0, idx).to(torch.int32).contiguous(),
                "seq_lens": step.seq_lens.index_select(0, idx).to(torch.int32).contiguous(),
                "meta": None,   # made on the first layer's call, reused by the step's other layers
            })

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        c = self.cfg
        L = c.kv_lora_rank
        cache = kv_cache.unsqueeze(2)   # [num_blocks, 64, 1, 576]
        for g in self.groups:
            if g["meta"] is None:
                g["meta"] = self.mla.get_mla_metadata()[0]
            qg = q.index_select(0, g["rows"]).view(g["b"], g["s_q"], c.num_q_heads, c.head_size)
            o, l = self.mla.flash_mla_with_kvcache(qg, cache, g["table"], g["seq_lens"], L, g["meta"], None,
                                                   softmax_scale=c.scale, causal=g["s_q"] > 1)
            out.index_copy_(0, g["rows"], o.reshape(-1, c.num_q_heads, L))
            # [b, Hq, s_q] -> [Hq, b * s_q], the rows' order
            lse.index_copy_(1, g["rows"], l.permute(1, 0, 2).reshape(c.num_q_heads, -1))
