"""FlashInfer's paged wrappers as an attnreplay backend (when `import flashinfer` works).

The cache is handed to FlashInfer as it is: the tuple (k_cache, v_cache) of [num_pages,
page_size, Hkv, D] views ("NHD"), no copy.  plan() (untimed by the host, like FlashInfer's own
plan) turns vLLM's metadata into FlashInfer's CSR page lists and plans the wrapper for the step:
  - every request has one new token: BatchDecodeWithPagedKVCacheWrapper (tensor cores for GQA
    groups of 4 or more, as vLLM does);
  - otherwise: BatchPrefillWithPagedKVCacheWrapper, causal (bottom-right, FlashInfer's rule);
  - use_cascade: two BatchPrefill wrappers, the shared prefix (every query against request 0's
    first P/B pages, no mask) and each request's suffix pages (causal), merged by
    flashinfer.merge_state: the two-level cascade of MultiLevelCascadeAttentionWrapper, written
    out so the LSE comes back too.
FlashInfer's LSE is base 2 and [T, Hq]; forward converts it to the host's natural log [Hq, T].
The host writes the new K/V into the cache before forward.  FlashInfer JIT-compiles its kernels
on first use (nvcc and ninja must be there); the first step pays that inside its plan.
"""
import math

from ..backend import Backend

WORKSPACE_BYTES = 256 << 20


class FlashInferPaged(Backend):
    """FlashInfer's paged decode / prefill / cascade wrappers on the paged cache in place"""

    name = "flashinfer"
    summary = ("FlashInfer BatchDecode/BatchPrefillWithPagedKVCacheWrapper on the paged cache in place; cascade "
               "as two prefill wrappers merged by merge_state")
    capabilities = "fp16/bf16 (KV same or fp8_e4m3); GQA; sliding window; soft cap; cascade"
    device = "cuda"
    cascade = True

    def check(self, config):
        try:
            import torch
            import flashinfer  # noqa: F401
        except Exception as e:   # an ImportError, or a missing dependency failing its import
            return "flashinfer is not importable here (%s: %s)" % (type(e).__name__, e)
        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
        if config.dtype not in ("float16", "bfloat16"):
            return "dtype %s: FlashInfer runs float16/bfloat16" % config.dtype
        if config.kv_dtype not in (config.dtype, "float8_e4m3fn"):
            return "KV cache %s is not one FlashInfer reads" % config.kv_dtype
        if config.inject != "none":
            return "planted fault '%s' is not implemented by the FlashInfer adapter" % config.inject
        return None

    def open(self, config):
        import flashinfer
        import torch
        self.cfg = config
        self.torch = torch
        dev = torch.device(config.device)
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        self.workspace2 = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        group = config.num_q_heads // config.num_kv_heads
        self.decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD",
                                                                    use_tensor_cores=group >= 4)
        self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.suffix = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace2, "NHD")
        dt = {"float16": torch.float16, "bfloat16": torch.bfloat16}
        self.q_dtype = dt[config.dtype]
        self.kv_dtype = torch.float8_e4m3fn if config.kv_dtype == "float8_e4m3fn" else self.q_dtype
        self.k_scale = config.kv_scale if config.kv_dtype == "float8_e4m3fn" else None

    def _csr(self, seq_lens, block_table, first_page=0):
        """FlashInfer's page lists for keys [first_page * B, seq_len) of each row."""
        torch = self.torch
        B = self.cfg.block_size
        pages = (seq_lens.long() + B - 1) // B - first_page
        indptr = torch.zeros(pages.shape[0] + 1, dtype=torch.int32, device=seq_lens.device)
        indptr[1:] = torch.cumsum(pages, 0).to(torch.int32)
        cols = torch.arange(block_table.shape[1], device=seq_lens.device)[None, :]
        keep = (cols >= first_page) & (cols < first_page + pages[:, None])
        indices = block_table[keep].to(torch.int32)
        last = (seq_lens.long() - (first_page + pages - 1) * B).to(torch.int32)
        return indptr, indices, last

    def plan(self, step):
        torch = self.torch
        c = self.cfg
        common = dict(q_data_type=self.q_dtype, kv_data_type=self.kv_dtype, sm_scale=c.scale,
                      window_left=c.sliding_window - 1 if c.sliding_window > 0 else -1,
                      logits_soft_cap=c.logits_soft_cap if c.logits_soft_cap > 0 else None)
        self.step = step
        self.mode = "cascade" if step.use_cascade else ("decode" if step.max_query_len == 1 else "prefill")
        if self.mode == "decode":
            indptr, indices, last = self._csr(step.seq_lens, step.block_table)
            self.decode.plan(indptr, indices, last, c.num_q_heads, c.num_kv_heads, c.head_size, c.block_size,
                             pos_encoding_mode="NONE", **common)
        elif self.mode == "prefill":
            indptr, indices, last = self._csr(step.seq_lens, step.block_table)
            self.prefill.plan(step.query_start_loc, indptr, indices, last, c.num_q_heads, c.num_kv_heads,
                              c.head_size, c.block_size, causal=True, **common)
        else:
            P, B = step.common_prefix_len, c.block_size
            dev = step.seq_lens.device
            T = step.num_actual_tokens
            qo = torch.tensor([0, T], dtype=torch.int32, device=dev)
            pre_indptr = torch.tensor([0, P // B], dtype=torch.int32, device=dev)
            pre_indices = step.block_table[0, : P // B].to(torch.int32).contiguous()
            pre_last = torch.tensor([B], dtype=torch.int32, device=dev)
            self.prefill.plan(qo, pre_indptr, pre_indices, pre_last, c.num_q_heads, c.num_kv_heads, c.head_size,
                              B, causal=False, **common)
            indptr, indices, last = self._csr(step.seq_lens, step.block_table, first_page=P // B)
            self.suffix.plan(step.query_start_loc, indptr, indices, last, c.num_q_heads, c.num_kv_heads,
                             c.head_size, B, causal=True, **common)

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        import flashinfer
        cache = (kv_cache[0], kv_cache[1])
        scale = dict(k_scale=self.k_scale, v_scale=self.k_scale) if self.k_scale else {}
        if self.mode == "decode":
            o, l = self.decode.run(q, cache, return_lse=True, **scale)
        elif self.mode == "prefill":
            o, l = self.prefill.run(q, cache, return_lse=True, **scale)
        else:
            o1, l1 = self.prefill.run(q, cache, return_lse=True, **scale)
            o2, l2 = self.suffix.run(q, cache, return_lse=True, **scale)
            o, l = flashinfer.merge_state(o1, l1, o2, l2)
        out.copy_(o)
        lse.copy_(l.transpose(0, 1) * math.log(2.0))      # base 2 [T, Hq] -> natural log [Hq, T]
