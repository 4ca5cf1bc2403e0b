"""torch's own attention kernels (FlashAttention-2 and cuDNN) as attnreplay backends.

Neither reads a paged cache: both take contiguous K/V.  So forward first GATHERS each request's
keys and values out of the paged cache through its block table into one contiguous varlen
buffer, marks that part "gather" (host.time_mark), and only then runs the kernel ("attn").  The
backend names say so ("...-gathered"), and the gather's time is stored apart in the kernels
table: a paged kernel does not pay it.  The gather index (the physical slot of every logical
key) is computed in plan(), which the host does not time, as vLLM's metadata builder would.

  TorchFlashVarlen   torch.ops.aten._flash_attention_forward: FlashAttention-2 varlen, one
                     launch per step, GQA native, causal bottom-right aligned, sliding window;
                     softmax LSE [Hq, T] in natural log.
  TorchCudnnSDPA     torch.ops.aten._scaled_dot_product_cudnn_attention (cuDNN's fused SDPA,
                     with compute_log_sumexp): dense [1, H, L, D] calls, one request at a time
                     (two for a chunk after context: the context keys unmasked and the chunk's
                     own keys causal, merged by LSE, so the mask is bottom-right as vLLM's);
                     KV heads expanded to the query heads during the gather.  The per-request
                     Python loop is part of its time: that is what dense SDPA costs on a batch.

Both run on the host's CUDA stream (the package makes it torch's current stream), flat only
(no cascade), with the host writing the new K/V into the cache before forward.
"""
from ..backend import Backend, host


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("torch is not installed (%s)" % e) from e
    return torch


class _Gathered(Backend):
    device = "cuda"
    writes_kv = False
    cascade = False
    expand_heads = False

    def check(self, config):
        try:
            torch = _torch()
        except ImportError as e:
            return str(e)
        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
        if config.dtype not in ("float16", "bfloat16"):
            return "dtype %s: %s runs float16/bfloat16" % (config.dtype, self.name)
        if config.kv_dtype != config.dtype:
            return "KV cache %s: %s reads a cache in the model dtype only" % (config.kv_dtype, self.name)
        if config.logits_soft_cap > 0:
            return "logits soft cap: %s has none" % self.name
        if config.inject != "none":
            return "planted fault '%s' is not implemented by %s" % (config.inject, self.name)
        return None

    def open(self, config):
        self.cfg = config

    def plan(self, step):
        torch = _torch()
        c = self.cfg
        B = c.block_size
        dev = step.seq_lens.device
        seq = step.seq_lens.long()
        n = step.num_reqs
        self.seq_cpu = [int(x) for x in step.seq_lens_cpu.tolist()]
        self.qsl_cpu = [int(x) for x in step.query_start_loc_cpu.tolist()]
        total_kv = sum(self.seq_cpu)
        cu_k = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        cu_k[1:] = torch.cumsum(seq, 0).to(torch.int32)
        req_of_key = torch.repeat_interleave(torch.arange(n, device=dev), seq, output_size=total_kv)
        pos = torch.arange(total_kv, device=dev) - cu_k[req_of_key].long()
        self.slots = step.block_table[req_of_key, pos // B].long() * B + pos % B   # [total_kv]
        self.cu_q = step.query_start_loc
        self.cu_k = cu_k
        self.cu_k_cpu = [0]
        for s in self.seq_cpu:
            self.cu_k_cpu.append(self.cu_k_cpu[-1] + s)
        self.max_q, self.max_k = step.max_query_len, step.max_seq_len
        self.step = step

    def gather(self, kv_cache):
        c = self.cfg
        k = kv_cache[0].reshape(-1, c.num_kv_heads, c.head_size).index_select(0, self.slots)
        v = kv_cache[1].reshape(-1, c.num_kv_heads, c.head_size).index_select(0, self.slots)
        if self.expand_heads and c.num_q_heads != c.num_kv_heads:
            g = c.num_q_heads // c.num_kv_heads
            k = k.repeat_interleave(g, dim=1)
            v = v.repeat_interleave(g, dim=1)
        return k, v


class TorchFlashVarlen(_Gathered):
    """FlashAttention-2 (torch's) varlen over K/V gathered from the paged cache"""

    name = "torch-fa2-gathered"
    summary = ("torch's FlashAttention-2 varlen (aten._flash_attention_forward) on K/V gathered from the "
               "paged cache; the gather timed apart as 'gather'")
    capabilities = "fp16/bf16; GQA; sliding window; flat only; K/V copied out of the paged cache every layer"

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        torch = _torch()
        c = self.cfg
        k, v = self.gather(kv_cache)
        host.time_mark("gather")
        window = c.sliding_window - 1 if c.sliding_window > 0 else -1
        res = torch.ops.aten._flash_attention_forward(
            q, k, v, self.cu_q, self.cu_k, self.max_q, self.max_k, 0.0, True, False,
            scale=c.scale, window_size_left=window, window_size_right=0 if window >= 0 else -1)
        o, l = res[0], res[1]
        out.copy_(o)
        if l.dim() == 2:                                   # [Hq, total_q]: unpadded varlen LSE
            lse.copy_(l)
        else:                                              # [batch, Hq, max_q]: padded per request
            for r in range(self.step.num_reqs):
                t0, t1 = self.qsl_cpu[r], self.qsl_cpu[r + 1]
                lse[:, t0:t1].copy_(l[r, :, : t1 - t0])


class TorchCudnnSDPA(_Gathered):
    """cuDNN's fused SDPA (torch's) per request, over K/V gathered from the paged cache"""

    name = "torch-cudnn-gathered"
    summary = ("torch's cuDNN SDPA (aten._scaled_dot_product_cudnn_attention) per request on K/V gathered "
               "from the paged cache, heads expanded; the gather timed apart as 'gather'")
    capabilities = "fp16/bf16; GQA by expanded heads; no window; flat only; one launch or two per request"
    expand_heads = True

    def check(self, config):
        reason = super().check(config)
        if reason:
            return reason
        if config.sliding_window > 0:
            return "sliding window: cuDNN SDPA through torch has no window here"
        return None

    def _sdpa(self, q, k, v, causal):
        torch = _torch()
        # [1, H, L, D] views; cuDNN wants the head dim contiguous
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q.transpose(0, 1).unsqueeze(0).contiguous(), k.transpose(0, 1).unsqueeze(0).contiguous(),
            v.transpose(0, 1).unsqueeze(0).contiguous(), None, True, 0.0, causal, False, scale=self.cfg.scale)
        o = res[0][0].transpose(0, 1)                      # [L, H, D]
        l = res[1].reshape(self.cfg.num_q_heads, -1).float()   # [H, L], natural log
        return o, l

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        torch = _torch()
        k, v = self.gather(kv_cache)
        host.time_mark("gather")
        for r in range(self.step.num_reqs):
            t0, t1 = self.qsl_cpu[r], self.qsl_cpu[r + 1]
            k0, k1 = self.cu_k_cpu[r], self.cu_k_cpu[r + 1]
            n, s = t1 - t0, k1 - k0
            qr = q[t0:t1]
            if n == s or n == 1:                          # a whole prompt, or a decode: one call
                o, l = self._sdpa(qr, k[k0:k1], v[k0:k1], n > 1)
            else:                                         # context unmasked + the chunk causal, merged
                o1, l1 = self._sdpa(qr, k[k0:k1 - n], v[k0:k1 - n], False)
                o2, l2 = self._sdpa(qr, k[k1 - n:k1], v[k1 - n:k1], True)
                m = torch.maximum(l1, l2)
                w1, w2 = torch.exp(l1 - m), torch.exp(l2 - m)
                den = w1 + w2
                o = (o1.float() * (w1 / den).t().unsqueeze(-1) + o2.float() * (w2 / den).t().unsqueeze(-1))
                l = m + torch.log(den)
            out[t0:t1].copy_(o)
            lse[:, t0:t1].copy_(l)
