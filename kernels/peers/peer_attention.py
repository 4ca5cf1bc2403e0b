"""peer_attention.py - torch peers for the CUDA backend's benchmarks (tests/bench_cuda.c,
tests/bench_cascade.c), on the same shapes, in the same run: cuDNN SDPA (contiguous K/V,
the FA3-class reference), flex_attention + PagedAttention (the only paged peer torch 2.11 has
offline), FA2 varlen_attn, and for the cascade benchmark the prefix pass's math on cuDNN and FA2
plus the device's dense bf16 GEMM rate (the floor for any kernel doing that math).

Usage: python3 peer_attention.py [decode|prefill|varlen|cascade ...] (default: all of them).

Prints one line per measurement:
    PEER name=<bench case> impl=<peer> us=<median> gbps=<effective> tflops=<FA3 formula>
plus CEILING copy_gbps=<device-to-device copy, bytes read + written>.
Timing: CUDA events around each call, 3 warm-ups, median of 20 (METHOD.md).  Each peer runs
inside try/except so a missing API costs one line ("PEER ... error=...") and not the run."""
import contextlib
import math
import sys
import traceback

import torch
import torch.nn.functional as F

DEV = "cuda"
DT = torch.bfloat16
VARLEN_LENS = [256, 384, 512, 640, 768, 896, 1024, 1152, 1280, 1408, 1536, 1664, 1792, 1920, 2048, 128]


def timed(fn, iters=20, warm=3, reps=1):
    """Median over iters samples of the microseconds per call; a sample is one event pair around
    reps back-to-back calls (reps > 1 hides the Python dispatch of all but the first call behind
    the GPU work, as a C caller's launches are hidden)."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    times.sort()
    return times[len(times) // 2]


def emit(name, impl, us, nbytes=None, flops=None, extra=""):
    gbps = nbytes / us * 1e-3 if nbytes else 0.0
    tflops = flops / us * 1e-6 if flops else 0.0
    print(f"PEER name={name} impl={impl} us={us:.2f} gbps={gbps:.1f} tflops={tflops:.1f} {extra}".rstrip(),
          flush=True)


def guard(name, impl, fn):
    try:
        fn()
    except Exception as e:  # a peer that cannot run is reported, not fatal
        msg = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        print(f"PEER name={name} impl={impl} error=\"{msg}\"", flush=True)
        traceback.print_exc(file=sys.stderr)


def causal_flops(h, sq, sk, d):
    avg = (max(0, sk - sq) + sk) / 2.0
    return 2.0 * h * sq * avg * (2 * d)


def ceiling():
    n = 1 << 30  # 2 GiB of bf16
    a = torch.empty(n, dtype=DT, device=DEV).normal_()
    b = torch.empty_like(a)
    us = timed(lambda: b.copy_(a))
    print(f"CEILING copy_gbps={2 * a.numel() * 2 / us * 1e-3:.1f}", flush=True)
    del a, b


def decode_peers():
    name = "decode_b64_s8192_gqa32_8_hd128"
    B, Hq, Hkv, S, D = 64, 32, 8, 8192, 128
    nbytes = B * S * Hkv * D * 2 * 2 + 2 * B * Hq * D * 2
    q = torch.randn(B, Hq, 1, D, dtype=DT, device=DEV)
    k = torch.randn(B, Hkv, S, D, dtype=DT, device=DEV)
    v = torch.randn(B, Hkv, S, D, dtype=DT, device=DEV)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            us = timed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        emit(name, "cudnn_sdpa_contiguous", us, nbytes=nbytes)

    def flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            us = timed(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        emit(name, "fa2_sdpa_contiguous", us, nbytes=nbytes)

    guard(name, "cudnn_sdpa_contiguous", cudnn)
    guard(name, "fa2_sdpa_contiguous", flash)
    del k, v

    def flex_paged(page):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        from torch.nn.attention.experimental._paged_attention import PagedAttention

        n_pages = B * S // page
        pa = PagedAttention(n_pages, page, B, device=DEV)
        for b in range(B):
            pa.reserve(torch.tensor(b, device=DEV), torch.tensor(S, device=DEV))
        kc = torch.randn(1, Hkv, n_pages * page, D, dtype=DT, device=DEV)
        vc = torch.randn(1, Hkv, n_pages * page, D, dtype=DT, device=DEV)

        def full(b, h, qi, kv):
            return kv >= 0

        bm = create_block_mask(full, B, None, 1, S, device=DEV, BLOCK_SIZE=page)
        pbm = pa.convert_logical_block_mask(bm)
        flex = torch.compile(flex_attention)
        us = timed(lambda: flex(q, kc, vc, block_mask=pbm, enable_gqa=True))
        emit(name, f"flex_paged_page{page}", us, nbytes=nbytes)
        del kc, vc

    for page in (16, 128):
        guard(name, f"flex_paged_page{page}", lambda: flex_paged(page))


def prefill_peers():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for hd, H in ((128, 16), (256, 8)):
        name = f"prefill_b2_s8192_causal_hd{hd}"
        B, S = 2, 8192
        q = torch.randn(B, H, S, hd, dtype=DT, device=DEV)
        k = torch.randn(B, H, S, hd, dtype=DT, device=DEV)
        v = torch.randn(B, H, S, hd, dtype=DT, device=DEV)
        flops = B * causal_flops(H, S, S, hd)

        def run(backend, label):
            with sdpa_kernel(backend):
                us = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            emit(name, label, us, flops=flops)

        guard(name, "cudnn_sdpa", lambda: run(SDPBackend.CUDNN_ATTENTION, "cudnn_sdpa"))
        guard(name, "fa2_sdpa", lambda: run(SDPBackend.FLASH_ATTENTION, "fa2_sdpa"))
        del q, k, v


def varlen_peers():
    name = "varlen16_causal_hd128"
    H, D = 16, 128
    lens = VARLEN_LENS
    T = sum(lens)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=DEV)
    q = torch.randn(T, H, D, dtype=DT, device=DEV)
    k = torch.randn(T, H, D, dtype=DT, device=DEV)
    v = torch.randn(T, H, D, dtype=DT, device=DEV)
    flops = sum(causal_flops(H, s, s, D) for s in lens)
    mx = max(lens)
    ref = {}

    def fa2():
        from torch.nn.attention.varlen import varlen_attn
        fn = lambda: varlen_attn(q, k, v, cu, cu, mx, mx, window_size=(-1, 0))
        ref["out"] = fn()
        emit(name, "fa2_varlen_attn", timed(fn), flops=flops)

    def cudnn_varlen():
        scale = 1.0 / math.sqrt(D)
        fn = lambda: torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, mx, mx, False, 0.0, True,
                                                             False, scale=scale)
        out = fn()[0]
        diff = (out.float() - ref["out"].float()).abs().max().item() if "out" in ref else float("nan")
        emit(name, "cudnn_varlen", timed(fn), flops=flops, extra=f"maxdiff_vs_fa2={diff:.3g}")

    def cudnn_per_seq():
        from torch.nn.attention import SDPBackend, sdpa_kernel
        chunks = []
        for i, s in enumerate(lens):
            a, b = int(cu[i]), int(cu[i + 1])
            chunks.append((q[a:b].transpose(0, 1).unsqueeze(0).contiguous(),
                           k[a:b].transpose(0, 1).unsqueeze(0).contiguous(),
                           v[a:b].transpose(0, 1).unsqueeze(0).contiguous()))

        def fn():
            for qq, kk, vv in chunks:
                F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            emit(name, "cudnn_sdpa_per_sequence", timed(fn), flops=flops)

    guard(name, "fa2_varlen_attn", fa2)
    guard(name, "cudnn_varlen", cudnn_varlen)
    guard(name, "cudnn_sdpa_per_sequence", cudnn_per_seq)


CASC_R, CASC_HQ, CASC_HKV, CASC_D, CASC_P = 128, 32, 8, 128, 32768   # tests/bench_cascade.c, P 32k
CASC_PREFIX_FLOPS = 4.0 * CASC_R * CASC_HQ * CASC_P * CASC_D           # the prefix pass's two products


def gemm_peak():
    """The dense bf16 GEMM rate now (cuBLAS, 8192^3): prefix FLOPs / this = the floor below
    which no kernel computes the prefix pass's two products, softmax aside."""
    n = 8192
    a = torch.randn(n, n, dtype=DT, device=DEV)
    b = torch.randn(n, n, dtype=DT, device=DEV)
    us = timed(lambda: torch.matmul(a, b))
    tflops = 2.0 * n * n * n / us * 1e-6
    print(f"CEILING gemm_bf16_tflops={tflops:.1f} cascade_prefix_floor_us={CASC_PREFIX_FLOPS / tflops * 1e-6:.1f}",
          flush=True)
    del a, b


def attention_f32(q, k, v):
    """softmax(q k^T / sqrt(d)) v in float32 (no TF32), K/V heads repeated for GQA: the yardstick
    the cascade peers' outputs are compared with (maxdiff=)."""
    rep_heads = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(rep_heads, dim=1)
    vf = v.float().repeat_interleave(rep_heads, dim=1)
    with no_tf32():
        s = torch.matmul(q.float(), kf.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return torch.matmul(torch.softmax(s, dim=-1), vf)


@contextlib.contextmanager
def no_tf32():
    """float32 matrix products in full float32 (no TF32) inside the block: for references."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32


def cascade_peers():
    """The cascade prefix pass's math at P 32k: 128 query tokens x 32 heads, non-causal, over the
    P shared keys of 8 KV heads; as vLLM's cascade_attention hands it to FlashAttention (32 heads,
    GQA) and GQA-packed (each KV head's 4 query heads as 512 rows of one head, as our prefix pass
    tiles it); cuDNN and FA2 SDPA.  Then flat decode over the shared prefix without cascade: 128
    requests x 1 token on FA2/cuDNN SDPA with the prefix's K/V broadcast over the batch (stride
    0: one copy in memory, as the prefix cache shares it; no unique suffix)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    name = f"cascade_prefix_p{CASC_P}_t{CASC_R}_gqa{CASC_HQ}_{CASC_HKV}_hd{CASC_D}"
    flops = CASC_PREFIX_FLOPS
    k = torch.randn(1, CASC_HKV, CASC_P, CASC_D, dtype=DT, device=DEV)
    v = torch.randn(1, CASC_HKV, CASC_P, CASC_D, dtype=DT, device=DEV)
    q_gqa = torch.randn(1, CASC_HQ, CASC_R, CASC_D, dtype=DT, device=DEV)
    grp = CASC_HQ // CASC_HKV
    # [1, Hq, T, D] -> [1, Hkv, T * grp, D]: row (t, j) of KV head h is query head h * grp + j
    q_packed = q_gqa.view(1, CASC_HKV, grp, CASC_R, CASC_D).transpose(2, 3).reshape(1, CASC_HKV, CASC_R * grp, CASC_D)
    ref_prefix = attention_f32(q_gqa, k, v)

    def run(backend, label, q, gqa):
        with sdpa_kernel(backend):
            fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
            out = fn()
            if not gqa:   # back to [1, Hq, T, D]
                out = out.view(1, CASC_HKV, CASC_R, grp, CASC_D).transpose(2, 3).reshape(1, CASC_HQ, CASC_R, CASC_D)
            diff = (out.float() - ref_prefix).abs().max().item()
            emit(name, label, timed(fn), flops=flops, extra=f"maxdiff={diff:.3g}")

    guard(name, "cudnn_sdpa_gqa", lambda: run(SDPBackend.CUDNN_ATTENTION, "cudnn_sdpa_gqa", q_gqa, True))
    guard(name, "fa2_sdpa_gqa", lambda: run(SDPBackend.FLASH_ATTENTION, "fa2_sdpa_gqa", q_gqa, True))
    guard(name, "cudnn_sdpa_packed", lambda: run(SDPBackend.CUDNN_ATTENTION, "cudnn_sdpa_packed", q_packed, False))
    guard(name, "fa2_sdpa_packed", lambda: run(SDPBackend.FLASH_ATTENTION, "fa2_sdpa_packed", q_packed, False))

    fname = f"flat_decode_shared_p{CASC_P}_b{CASC_R}_gqa{CASC_HQ}_{CASC_HKV}_hd{CASC_D}"
    qd = torch.randn(CASC_R, CASC_HQ, 1, CASC_D, dtype=DT, device=DEV)
    kb, vb = k.expand(CASC_R, -1, -1, -1), v.expand(CASC_R, -1, -1, -1)
    nbytes = CASC_R * CASC_P * CASC_HKV * CASC_D * 2 * 2   # as if each request read its K/V
    del ref_prefix
    ref_flat = attention_f32(qd, k, v)   # broadcasts over the 128 requests

    def flat(backend, label):
        with sdpa_kernel(backend):
            fn = lambda: F.scaled_dot_product_attention(qd, kb, vb, enable_gqa=True)
            diff = (fn().float() - ref_flat).abs().max().item()
            emit(fname, label, timed(fn), nbytes=nbytes, flops=flops, extra=f"maxdiff={diff:.3g}")

    guard(fname, "fa2_sdpa_broadcast", lambda: flat(SDPBackend.FLASH_ATTENTION, "fa2_sdpa_broadcast"))
    guard(fname, "cudnn_sdpa_broadcast", lambda: flat(SDPBackend.CUDNN_ATTENTION, "cudnn_sdpa_broadcast"))
    del k, v, q_gqa, q_packed, qd, ref_flat


def main():
    print(f"torch {torch.__version__} cudnn {torch.backends.cudnn.version()} device {torch.cuda.get_device_name()}",
          flush=True)
    parts = {"decode": decode_peers, "prefill": prefill_peers, "varlen": varlen_peers, "cascade": cascade_peers}
    wanted = sys.argv[1:] or list(parts)
    for w in wanted:
        if w not in parts:
            print(f"peer_attention.py: unknown part '{w}' (one of: {' '.join(parts)})", file=sys.stderr)
            sys.exit(2)
    guard("ceiling", "copy", ceiling)
    if "cascade" in wanted:
        guard("ceiling", "gemm", gemm_peak)
    for w in wanted:
        torch.cuda.empty_cache()
        guard(w, "all", parts[w])


if __name__ == "__main__":
    main()
