"""flex_attention over the paged cache, read in place (PyTorch's PagedAttention idea).

No gather: the cache [2, num_blocks, block_size, Hkv, D] is viewed, without a copy, as flex's
[1, Hkv, num_blocks * block_size, D] "physical" key/value sequence (a permuted view; the head
dim stays contiguous).  All T query tokens of the step form one query sequence [1, Hq, T, D].
What makes it paged is the block mask, built in plan() from the block tables (untimed, like
vLLM's metadata builder):
  - kv_indices list, per 128-query block, the 128-slot physical chunks that hold any page of the
    requests whose tokens are in that block (BlockMask.from_kv_blocks; no dense mask is ever
    materialised over the whole cache);
  - mask_mod maps a physical slot back to the request's logical position through an inverse
    page table [num_reqs, num_blocks] (-1 where the page is not the request's) and keeps the
    key when it is one of the token's own request's, at or before its position (and inside the
    sliding window).
flex_attention is compiled once (dynamic shapes): the first step of a run pays the compile in
its timed forward (use --repeat, whose median drops it, or ignore the first steps).  The query
sequence is padded with zero rows to whole 128-query blocks (the padding rows see no key and are
dropped): with fewer than 128 queries (a decode step of few requests) torch's lowering takes its
flex-decoding template, which on torch 2.11 found no valid kernel for a 524,288-slot cache
(InductorError NoValidChoicesError at the first all-decode step of a Mooncake trace); whole
blocks keep every step on the one template.  LSE comes
from return_lse.  Flat only; the host writes the new K/V into the cache first.

flex computes whole 128-slot chunks: a masked slot's probability is 0, but it still enters P.V
as 0 x V, so a slot that holds NaN turns the row into NaN.  attnreplay's cache holds NaN in every
slot until it is written (the canary that shows reads of unwritten memory); vLLM's cache starts
zeroed.  So plan() sets the NaN slots of the chunks a step reads to 0 (untimed, like the block
mask; a cache first seen in forward is cleaned there once, in the first step's timed call): the
values of written slots are finite and stay untouched.
"""
from ..backend import Backend

CHUNK = 128   # flex's default block size, queries and keys


class FlexPaged(Backend):
    """flex_attention over the paged cache in place (block mask from the block tables)"""

    name = "flex-paged"
    summary = ("torch flex_attention reading the paged cache in place (a permuted view), block mask from "
               "the block tables, mask_mod through an inverse page table; compiled once")
    capabilities = "fp16/bf16/fp32; GQA (enable_gqa); sliding window; soft cap; flat only"
    device = "cuda"

    def check(self, config):
        try:
            import torch
            from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
        except ImportError as e:
            return "torch with flex_attention is not installed (%s)" % e
        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
        if config.kv_dtype != config.dtype:
            return "KV cache %s: flex reads a cache in the model dtype only" % config.kv_dtype
        if config.inject != "none":
            return "planted fault '%s' is not implemented by flex-paged" % config.inject
        return None

    def open(self, config):
        import torch
        from torch.nn.attention.flex_attention import flex_attention
        self.cfg = config
        self.flex = torch.compile(flex_attention, dynamic=True)
        self.caches = {}          # layer -> the kv_cache tensor forward received
        self.slots = None         # the slots of the chunks this step reads (a device index)

    def _zero_unwritten(self, kv_cache):
        """The NaN (never written) slots of this step's chunks set to 0 (see the module text)."""
        import torch
        c = self.cfg
        flat = kv_cache.view(2, c.num_blocks * c.block_size, c.num_kv_heads, c.head_size)
        sub = flat.index_select(1, self.slots)
        flat.index_copy_(1, self.slots, torch.where(torch.isnan(sub), torch.zeros_like(sub), sub))

    def plan(self, step):
        import numpy as np
        import torch
        from torch.nn.attention.flex_attention import BlockMask
        c = self.cfg
        B, NB = c.block_size, c.num_blocks
        n, T = step.num_reqs, step.num_actual_tokens
        dev = step.block_table.device
        qsl = np.asarray(step.query_start_loc_cpu.numpy(), dtype=np.int64)
        seq = np.asarray(step.seq_lens_cpu.numpy(), dtype=np.int64)
        table = np.asarray(step.block_table_cpu.numpy(), dtype=np.int64)
        pages = (seq + B - 1) // B
        # per token: its request and absolute position
        token_req = np.repeat(np.arange(n), qsl[1:] - qsl[:-1])
        token_pos = np.arange(T) - qsl[token_req] + (seq - (qsl[1:] - qsl[:-1]))[token_req]
        kv_chunks = (NB * B + CHUNK - 1) // CHUNK     # 128-slot chunks of the physical sequence
        # the inverse page table: physical block -> logical block index, per request (over whole
        # chunks, so the padding slots of a last partial chunk index a -1)
        p2l = np.full((n, kv_chunks * CHUNK // B), -1, dtype=np.int32)
        for r in range(n):
            p2l[r, table[r, : pages[r]]] = np.arange(pages[r], dtype=np.int32)
        # per 128-query block: the 128-slot chunks holding any page of its requests
        q_blocks = (T + CHUNK - 1) // CHUNK
        lists = []
        for qb in range(q_blocks):
            reqs = np.unique(token_req[qb * CHUNK: min(T, (qb + 1) * CHUNK)])
            chunks = np.unique(np.concatenate([table[r, : pages[r]] * B // CHUNK for r in reqs]))
            lists.append(chunks)
        # the index array spans every key chunk of the cache: flex takes its last dimension as the
        # block mask's key extent, which must cover the whole physical sequence
        kv_indices = np.zeros((1, 1, q_blocks, kv_chunks), dtype=np.int32)
        kv_num = np.zeros((1, 1, q_blocks), dtype=np.int32)
        for qb, chunks in enumerate(lists):
            kv_num[0, 0, qb] = len(chunks)
            kv_indices[0, 0, qb, : len(chunks)] = chunks
        # the compiled kernel evaluates mask_mod on the padding rows of the last query block too:
        # they belong to request 0 at position -1, so they see no key and index nothing out of range
        pad = q_blocks * CHUNK - T
        t_req = torch.from_numpy(np.concatenate([token_req, np.zeros(pad, np.int64)])).to(dev)
        t_pos = torch.from_numpy(np.concatenate([token_pos, np.full(pad, -1, np.int64)])).to(dev)
        t_p2l = torch.from_numpy(p2l).to(dev)
        read = np.unique(np.concatenate(lists)) if lists else np.zeros(0, np.int64)
        slots = (read[:, None] * CHUNK + np.arange(CHUNK)[None, :]).reshape(-1)
        self.slots = torch.from_numpy(slots[slots < NB * B].astype(np.int64)).to(dev)
        for cache in self.caches.values():
            self._zero_unwritten(cache)
        window = c.sliding_window

        def mask_mod(b, h, q_idx, kv_idx):
            r = t_req[q_idx]
            logical = t_p2l[r, kv_idx // B] * B + kv_idx % B
            keep = (t_p2l[r, kv_idx // B] >= 0) & (logical <= t_pos[q_idx])
            if window > 0:
                keep = keep & (logical > t_pos[q_idx] - window)
            return keep

        self.q_rows = q_blocks * CHUNK   # the query sequence, padded to whole blocks (module text)
        # the padded query buffer [q_rows, Hq, D], its padding rows zero, made here (untimed) so
        # that forward only copies the step's T rows in
        dt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[c.dtype]
        self.q_pad = torch.zeros((self.q_rows, c.num_q_heads, c.head_size), dtype=dt, device=dev) if pad else None
        self.block_mask = BlockMask.from_kv_blocks(
            torch.from_numpy(kv_num).to(dev), torch.from_numpy(kv_indices).to(dev), BLOCK_SIZE=CHUNK,
            mask_mod=mask_mod, seq_lengths=(self.q_rows, NB * B))
        self.score_mod = None
        if c.logits_soft_cap > 0:
            cap = c.logits_soft_cap

            def score_mod(score, b, h, q_idx, kv_idx):
                return cap * torch.tanh(score / cap)
            self.score_mod = score_mod

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        c = self.cfg
        if layer not in self.caches:
            self.caches[layer] = kv_cache
            self._zero_unwritten(kv_cache)
        S = c.num_blocks * c.block_size
        k = kv_cache[0].reshape(S, c.num_kv_heads, c.head_size).permute(1, 0, 2).unsqueeze(0)
        v = kv_cache[1].reshape(S, c.num_kv_heads, c.head_size).permute(1, 0, 2).unsqueeze(0)
        T = q.shape[0]
        if self.q_pad is not None:   # q [T, Hq, D] into the zero-padded [q_rows, Hq, D]
            self.q_pad[:T].copy_(q)
            q = self.q_pad
        o, l = self.flex(q.transpose(0, 1).unsqueeze(0), k, v, score_mod=self.score_mod,
                         block_mask=self.block_mask, scale=c.scale, enable_gqa=c.num_q_heads != c.num_kv_heads,
                         return_lse=True)
        out.copy_(o[0, :, :T].transpose(0, 1))
        lse.copy_(l[0, :, :T])
