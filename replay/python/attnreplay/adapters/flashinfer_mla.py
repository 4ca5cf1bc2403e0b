"""FlashInfer's MLA wrapper (flashinfer.mla.BatchMLAPagedAttentionWrapper) as an attnreplay backend
for MLA models, when `import flashinfer` works.

The plugin ABI's MLA contract (replay/attnreplay_plugin.h): q [T, Hq, L + R] is the absorbed query,
the cache [num_pages, page_size, L + R] holds each token's [kv_c | k_pe], and out [T, Hq, L] is the
latent output (the host applies W_UK before and W_UV after).  FlashInfer takes the two halves apart:
q_nope [T, Hq, L] and q_pe [T, Hq, R] (split out of q, timed apart as "split"), and the cache as
ckv [num_pages, page_size, L] and kpe [num_pages, page_size, R], the two column ranges of the
host's cache (views, no copy, as vLLM's FlashInfer MLA backend passes them).  plan() (untimed by
the host, like FlashInfer's own plan) turns vLLM's metadata into the wrapper's CSR lists: qo_indptr
= query_start_loc, kv_indptr / kv_indices the pages each request holds, kv_len_arr = seq_lens;
causal (bottom-right, FlashInfer's rule), every query length in one call.  The LSE comes back in
natural log (return_lse_base_on_e) as [T, Hq] and is written into the host's [Hq, T].  fp16 / bf16
with a cache of the same dtype; any page size.  FlashInfer JIT-compiles the MLA module on first
use (nvcc and ninja must be there); the first step pays that inside its plan.
"""
from ..backend import Backend, host
from . import half_dtype_reason

WORKSPACE_BYTES = 128 << 20   # FlashInfer's recommended float workspace for split-k


class FlashInferMLA(Backend):
    """FlashInfer's BatchMLAPagedAttentionWrapper on the latent cache in place"""

    name = "flashinfer-mla"
    summary = ("FlashInfer BatchMLAPagedAttentionWrapper on the latent cache in place (ckv / kpe views), one "
               "causal call per step for every query length")
    capabilities = "MLA only; fp16/bf16, cache in the same dtype; any page size"
    device = "cuda"
    writes_kv = False
    cascade = False
    mla = True

    def check(self, config):
        if config.attention != "mla":
            return "FlashInfer's MLA wrapper runs MLA models only (this one is %s)" % config.attention
        try:
            import torch
            import flashinfer.mla  # noqa: F401
        except Exception as e:   # an ImportError, or a missing dependency failing its import
            return "flashinfer.mla is not importable here (%s: %s)" % (type(e).__name__, e)
        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
        return half_dtype_reason(config, "FlashInfer MLA")

    def open(self, config):
        import flashinfer.mla
        import torch
        self.cfg = config
        self.torch = torch
        self.dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[config.dtype]
        dev = torch.device(config.device)
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        self.wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(self.workspace)

    def plan(self, step):
        torch = self.torch
        c = self.cfg
        B = c.block_size
        seq = step.seq_lens_cpu.tolist()
        table = step.block_table_cpu
        pages, indptr = [], [0]
        for r in range(step.num_reqs):
            n = (int(seq[r]) + B - 1) // B
            pages.extend(table[r, :n].tolist())
            indptr.append(indptr[-1] + n)
        dev = step.block_table.device
        i32 = torch.int32
        self.wrapper.plan(step.query_start_loc.to(i32), torch.tensor(indptr, dtype=i32, device=dev),
                          torch.tensor(pages, dtype=i32, device=dev), step.seq_lens.to(i32), c.num_q_heads,
                          c.kv_lora_rank, c.qk_rope_head_dim, B, True, c.scale, self.dtype, self.dtype)

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        L = self.cfg.kv_lora_rank
        q_nope = q[..., :L].contiguous()   # [T, Hq, L]
        q_pe = q[..., L:].contiguous()     # [T, Hq, R]
        host.time_mark("split")
        o, l = self.wrapper.run(q_nope, q_pe, kv_cache[..., :L], kv_cache[..., L:], return_lse=True,
                                return_lse_base_on_e=True)
        out.copy_(o)
        lse.copy_(l.t())   # [T, Hq] -> [Hq, T]
