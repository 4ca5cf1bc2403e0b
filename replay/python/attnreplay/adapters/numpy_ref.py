"""numpy: paged attention in numpy on the host, the Python package's CPU backend (and its tests').

What it does per layer: gathers each request's keys and values from the paged cache through
its block table into contiguous arrays (timed apart as "gather" through host.time_mark), then
computes bottom-right causal attention per request in float64 (GQA by head groups, sliding
window, soft cap) and writes out rounded to the run's dtype and the natural-log LSE.  Flat
only (no cascade flag): the host runs every step flat.  bfloat16 arrives as uint16 bit
patterns (numpy has no bfloat16) and is converted here; an fp8 cache is refused.  MLA models
too (mla = True): the same per-request loop over the latent cache [num_blocks, block_size,
L + R] with one KV head, the whole entries as keys and their first L elements as values; the
host absorbs W_UK into q before and applies W_UV to out after.
"""
import numpy as np

from ..backend import Backend, host


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """Round to nearest even, as the host does (NaN stays NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7fffffff) > 0x7f800000
    r = ((u + 0x7fff + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


class NumpyPaged(Backend):
    """paged attention in numpy (float64 math, K/V gathered per request)"""

    name = "numpy"
    summary = "numpy on the host: K/V gathered from the paged cache per request, float64 softmax"
    capabilities = "dtypes fp32/fp16/bf16, cache in the same dtype; GQA/MQA; window; soft cap; MLA; flat only"
    device = "cpu"
    mla = True

    def check(self, config):
        if config.dtype not in ("float32", "float16", "bfloat16"):
            return "dtype %s: numpy adapter runs float32/float16/bfloat16" % config.dtype
        if config.kv_dtype != config.dtype:
            return "KV cache %s: the numpy adapter reads a cache in the model dtype only" % config.kv_dtype
        if config.inject != "none":
            return "planted fault '%s' is not implemented by the numpy adapter" % config.inject
        return None

    def open(self, config):
        self.cfg = config
        self.bf16 = config.dtype == "bfloat16"

    def plan(self, step):
        self.step = step

    def _load(self, a):
        return bf16_to_f32(a) if self.bf16 else a.astype(np.float32)

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        c, s = self.cfg, self.step
        B, Hq, Hkv, D = c.block_size, c.num_q_heads, c.num_kv_heads, c.head_size
        qsl, seq, table = s.query_start_loc_cpu, s.seq_lens_cpu, s.block_table_cpu
        if c.attention == "mla":
            flat_k = kv_cache.reshape(-1, 1, D)              # [num_blocks * block_size, 1, L + R]
            flat_v = flat_k[:, :, :c.kv_lora_rank]           # values: the latent part of each entry
        else:
            flat_k = kv_cache[0].reshape(-1, Hkv, D)     # [num_blocks * block_size, Hkv, D]
            flat_v = kv_cache[1].reshape(-1, Hkv, D)
        gathered = []
        for r in range(s.num_reqs):
            n_keys = int(seq[r])
            pos = np.arange(n_keys)
            slots = table[r, pos // B].astype(np.int64) * B + pos % B
            gathered.append((flat_k[slots], flat_v[slots]))
        host.time_mark("gather")
        group = Hq // Hkv
        T = s.num_actual_tokens
        for r in range(s.num_reqs):
            t0, t1 = int(qsl[r]), int(qsl[r + 1])
            n, n_keys = t1 - t0, int(seq[r])
            ctx = n_keys - n
            K = np.repeat(self._load(gathered[r][0]).astype(np.float64), group, axis=1)   # [S, Hq, D]
            V = np.repeat(self._load(gathered[r][1]).astype(np.float64), group, axis=1)
            Q = self._load(q[t0:t1]).astype(np.float64)                                   # [n, Hq, D]
            scores = np.matmul(Q.transpose(1, 0, 2), K.transpose(1, 2, 0)) * c.scale      # [Hq, n, S]
            if c.logits_soft_cap > 0:
                scores = c.logits_soft_cap * np.tanh(scores / c.logits_soft_cap)
            qpos = ctx + np.arange(n)[:, None]
            kpos = np.arange(n_keys)[None, :]
            visible = kpos <= qpos
            if c.sliding_window > 0:
                visible &= kpos > qpos - c.sliding_window
            scores = np.where(visible[None], scores, -np.inf)
            m = scores.max(axis=2, keepdims=True)
            p = np.exp(scores - m)
            denom = p.sum(axis=2, keepdims=True)
            o = np.matmul(p / denom, V.transpose(1, 0, 2)).transpose(1, 0, 2)             # [n, Hq, Dv]
            if self.bf16:
                out[t0:t1] = f32_to_bf16(o.astype(np.float32))
            else:
                out[t0:t1] = o.astype(out.dtype)
            lse[:, t0:t1] = (m[..., 0] + np.log(denom[..., 0])).astype(np.float32)
        assert lse.shape == (Hq, T)
