"""fa3_peer.py - FlashAttention 3 (the hopper/ kernels vLLM runs on an H200), built offline by
kernels/peers/build_peers.py into .peers/built/fa3, timed on the shapes of our benchmarks in the
same run as them:

  decode   tests/bench_cuda.c decode_b64_s8192_gqa32_8_hd128: paged KV, page size 16, random
           block table (fa3_paged16); the same with an e4m3 KV cache and e4m3 queries, per-tensor
           scales (name ..._fp8, fa3_fp8_paged16; FA3 needs Q, K and V in one dtype)
  prefill  prefill_b2_s8192_causal_hd128 / _hd256: contiguous K/V (fa3_contiguous) and paged,
           page size 16 (fa3_paged16)
  varlen   varlen16_causal_hd128: flash_attn_varlen_func on packed K/V (fa3_varlen) and the same
           sequences over a paged cache (fa3_paged16)
  lopsided tests/bench_cuda.c decode_lopsided_b18_s1280_135k: the Mooncake trace's lopsided decode
           step, one request of 135,168 keys among 17 of 1,280, GQA 32:8, paged (fa3_paged16)
  chunk    chunk_q8192_ctx98304_gqa32_8_hd128: one chunked-prefill step, 8,192 new tokens over a
           98,304-token paged cache, causal bottom-right, GQA 32:8 (fa3_paged16), as vLLM calls
           it on the Mooncake trace's long mixed steps
  cascade  tests/bench_cascade.c (128 requests sharing a prefix of 1k / 8k / 32k tokens, unique
           suffixes of 128 / 256, GQA 32:8, hd128, page 16): flat decode over the shared blocks
           (fa3_flat_paged16); vLLM's cascade recipe on FA3 (all 128 queries as one sequence over
           the prefix, the suffixes as decode, merged by LSE in torch: fa3_cascade_paged16), and
           the prefix pass alone under the cascade_prefix_... name peer_attention.py uses.

Every measurement is first checked against a float32 torch reference (no TF32) on a sample of
requests / query rows: relerr = ||out - ref|| / ||ref|| and maxdiff = max |out - ref| are printed;
over the tolerance (2e-2 bf16, 0.1 e4m3) the line is an error line and carries no timing into
the summary.  Timing: CUDA events, 3 warm-ups, median of 20 samples, each sample a run of
back-to-back calls (peer_attention.timed reps) so the Python dispatch of the interface is hidden
as a C caller's launches are.  Paged calls pass FA3's scheduler metadata computed once per shape
(get_scheduler_metadata), as vLLM does once per step, when the build accepts it (sched= on the line).

Usage: python3 fa3_peer.py [decode|fp8|lopsided|prefill|varlen|chunk|cascade ...] (default: all).  FA3_PAGE=32
or 64 gives the paged calls that page size (impl names fa3_paged32 / fa3_paged64), beside
bench_cuda's AR_BENCH_BLOCK_SIZE; any other value exits 2 with a message.
Output: the PEER lines of peer_attention.py.  Without the built extension every part prints one
"PEER name=<part> impl=fa3 error=..." line saying what is missing, and the script exits 0."""
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from peer_attention import (CASC_D, CASC_HKV, CASC_HQ, CASC_R, DEV, DT, VARLEN_LENS,  # noqa: E402
                            attention_f32, causal_flops, emit, guard, no_tf32, timed)

PAGE = 16                                         # the benchmarks' page size (flashinfer_peer.py's too)
PAGE_SIZES = (16, 32, 64)                         # FA3_PAGE's choices, bench_cuda's block sizes
PAGE_FA3 = PAGE                                   # FA3's paged calls: main() takes FA3_PAGE
PAGED = f"paged{PAGE_FA3}"                        # in the impl names: fa3_paged16 at the default


def page_size(env):
    """The page size FA3_PAGE in env asks for (16 when unset); ValueError naming the rule
    otherwise."""
    text = env.get("FA3_PAGE", "") or str(PAGE)
    if not text.isdigit() or int(text) not in PAGE_SIZES:
        raise ValueError(f"FA3_PAGE={text}: must be one of {', '.join(map(str, PAGE_SIZES))}")
    return int(text)
TOL_BF16, TOL_FP8 = 2e-2, 1e-1
# the benchmarks' shapes (the case names below are built from them)
DECODE_SHAPE = (64, 32, 8, 8192, 128)             # requests, query heads, KV heads, context, head size
PREFILL_B, PREFILL_S = 2, 8192
PREFILL_HEADS = ((128, 16), (256, 8))             # (head size, heads)
VARLEN_HEADS, VARLEN_D = 16, 128
CASC_PREFIXES, CASC_SUFFIXES = (1024, 8192, 32768), (128, 256)
CHUNK_SHAPE = (8192, 98304, 32, 8, 128)           # new tokens, keys in the cache, query heads, KV heads, head size
LOPSIDED_SHAPE = (18, 135168, 1280, 32, 8, 128)   # requests, the long one's keys, the others', query heads, KV heads, head size


def built_dir(peer):
    root = os.environ.get("AR_PEERS_BUILT") or os.path.join(HERE, "..", "..", ".peers", "built")
    return os.path.normpath(os.path.join(root, peer))


def load_built(peer, probe, module):
    """Imports `module` from .peers/built/<peer> (probe: a file that must be there); returns
    (module, None) or (None, the reason)."""
    d = built_dir(peer)
    if not os.path.exists(os.path.join(d, probe)):
        return None, f"not built: {d}/{probe} missing (kernels/peers/build_peers.sh builds it)"
    sys.path.insert(0, d)
    try:
        return __import__(module), None
    except Exception as e:  # noqa: BLE001 - reported as the reason
        return None, f"import failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def bench(fn):
    """timed() with enough back-to-back calls per sample for about 2 ms of GPU work; AR_PEER_ITERS
    samples (default 20; kernels/peers/power_trace.py asks for many, to keep the GPU busy)."""
    est = timed(fn, iters=3, warm=2)
    iters = os.environ.get("AR_PEER_ITERS", "")
    iters = int(iters) if iters.isdigit() and int(iters) > 0 else 20
    return timed(fn, iters=iters, reps=max(1, min(50, math.ceil(2000.0 / max(est, 1.0)))))


def compare(out, ref):
    """(relerr, maxdiff) of out against the float32 reference."""
    o, r = out.float().reshape(-1), ref.float().reshape(-1)
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item(), (o - r).abs().max().item()


def checked(name, impl, fn, out, ref, tol, nbytes=None, flops=None, extra="", report=True):
    """Compares out with ref, then times fn and prints the PEER line; when out is wrong prints an
    error line instead (if report) and returns False."""
    rel, mx = compare(out, ref)
    if not rel <= tol:   # NaN fails too
        msg = f"check failed: relerr={rel:.3g} maxdiff={mx:.3g} (tolerance relerr {tol}) {extra}".strip()
        print(f"PEER name={name} impl={impl} error=\"{msg}\"" if report else f"# {name} {impl}: {msg}", flush=True)
        return False
    emit(name, impl, bench(fn), nbytes=nbytes, flops=flops, extra=f"relerr={rel:.2e} maxdiff={mx:.3g} {extra}".strip())
    return True


def checked_sched(name, impl, make_fn, has_sched, pick, ref, tol, **kw):
    """checked() for a paged call: first with FA3's precomputed scheduler metadata
    (make_fn(True)), and if that is refused or wrong, with per-call scheduling (make_fn(False))."""
    for use in ([True, False] if has_sched else [False]):
        fn = make_fn(use)
        extra = f"sched={'precomputed' if use else 'per_call'}"
        try:
            if checked(name, impl, fn, pick(fn()), ref, tol, extra=extra, report=not use, **kw):
                return
        except Exception as e:  # noqa: BLE001 - the per-call attempt reports through guard()
            if not use:
                raise
            print(f"# {name} {impl}: with precomputed scheduler metadata: {type(e).__name__}: {str(e)[:160]}",
                  flush=True)


def ref_rows(q, k, v, rows, causal):
    """float32 attention of the query rows `rows` of q [B, Hq, Sq, D] over k, v [B, Hkv, Sk, D];
    causal is bottom-right aligned (row i sees keys <= i + Sk - Sq).  -> [B, Hq, len(rows), D]"""
    rows_t = torch.as_tensor(rows, device=q.device)
    qs = q[:, :, rows_t].float()
    rep = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(rep, dim=1)
    vf = v.float().repeat_interleave(rep, dim=1)
    with no_tf32():
        s = torch.matmul(qs, kf.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if causal:
            off = k.shape[2] - q.shape[2]
            keys = torch.arange(k.shape[2], device=q.device)
            s = s.masked_fill(keys[None, :] > (rows_t[:, None] + off), float("-inf"))
        return torch.matmul(torch.softmax(s, dim=-1), vf)


def paged_from_contiguous(k, v, page):
    """k, v [B, S, H, D] -> (k cache, v cache [B*S/page, page, H, D] in one random page order,
    table [B, S/page] int32)."""
    B, S, H, D = k.shape
    ppr = S // page
    perm = torch.randperm(B * ppr, device=k.device)
    kc = torch.empty(B * ppr, page, H, D, dtype=k.dtype, device=k.device)
    vc = torch.empty_like(kc)
    kc[perm] = k.reshape(B * ppr, page, H, D)
    vc[perm] = v.reshape(B * ppr, page, H, D)
    return kc, vc, perm.view(B, ppr).to(torch.int32)


def sched_kwargs(fa3, B, sq, sk, hq, hkv, d, seqlens, dtype, causal, cu_seqlens_q=None):
    """FA3's scheduler metadata for a paged call, computed once; {} when the build refuses it."""
    try:
        md = fa3.get_scheduler_metadata(B, sq, sk, hq, hkv, d, seqlens, qkv_dtype=dtype, page_size=PAGE_FA3,
                                        causal=causal, cu_seqlens_q=cu_seqlens_q)
        return {"scheduler_metadata": md}
    except Exception as e:  # noqa: BLE001 - falls back to per-call metadata
        print(f"# fa3 get_scheduler_metadata refused ({type(e).__name__}: {str(e)[:120]}): per-call scheduling",
              flush=True)
        return {}


def decode(fa3, fp8=False):
    B, Hq, Hkv, S, D = DECODE_SHAPE
    name = f"decode_b{B}_s{S}_gqa{Hq}_{Hkv}_hd{D}" + ("_fp8" if fp8 else "")
    ppr = S // PAGE_FA3
    kc = torch.randn(B * ppr, PAGE_FA3, Hkv, D, dtype=DT, device=DEV)
    vc = torch.randn_like(kc)
    q = torch.randn(B, 1, Hq, D, dtype=DT, device=DEV)
    table = torch.randperm(B * ppr, device=DEV).view(B, ppr).to(torch.int32)
    seqlens = torch.full((B,), S, dtype=torch.int32, device=DEV)
    kw, impl, tol = {}, "fa3_"+PAGED, TOL_BF16
    kv_bytes = 2
    if fp8:   # e4m3 with one scale per tensor (vLLM's kv_cache_dtype=fp8), descales per (request, KV head)
        f8 = torch.float8_e4m3fn
        scales = {n: (t.abs().max().float() / 448.0) for n, t in (("q", q), ("k", kc), ("v", vc))}
        q, kc, vc = ((t.float() / scales[n]).to(f8) for n, t in (("q", q), ("k", kc), ("v", vc)))
        kw = {f"{n}_descale": torch.full((B, Hkv), scales[n].item(), dtype=torch.float32, device=DEV)
              for n in ("q", "k", "v")}
        deq = {n: scales[n].item() for n in scales}
        impl, tol, kv_bytes = "fa3_fp8_"+PAGED, TOL_FP8, 1
    else:
        deq = {"q": 1.0, "k": 1.0, "v": 1.0}
    sched = sched_kwargs(fa3, B, 1, S, Hq, Hkv, D, seqlens, q.dtype, False)

    def make(use):
        args = dict(kw, **(sched if use else {}))
        return lambda: fa3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=table, num_splits=0,
                                                   **args)

    sample = [0, 1, B // 2, B - 1]
    refs = []
    for b in sample:
        kb = (kc[table[b].long()].reshape(1, S, Hkv, D).float() * deq["k"]).transpose(1, 2)
        vb = (vc[table[b].long()].reshape(1, S, Hkv, D).float() * deq["v"]).transpose(1, 2)
        refs.append(attention_f32((q[b:b + 1].float() * deq["q"]).transpose(1, 2), kb, vb).transpose(1, 2))
    nbytes = B * S * Hkv * D * 2 * kv_bytes + 2 * B * Hq * D * 2
    checked_sched(name, impl, make, bool(sched), lambda o: o[sample], torch.cat(refs), tol, nbytes=nbytes)


def lopsided_name():
    """tests/bench_cuda.c's name of LOPSIDED_SHAPE (keys in thousands, as its other lopsided case)."""
    B, LONG, SHORT = LOPSIDED_SHAPE[:3]
    return f"decode_lopsided_b{B}_s{SHORT}_{LONG // 1000}k"


def lopsided(fa3):
    """One decode step of requests of unequal length on a paged cache: the first request holds
    LONG keys, the others SHORT (tests/bench_cuda.c's case of the same name)."""
    B, LONG, SHORT, Hq, Hkv, D = LOPSIDED_SHAPE
    name = lopsided_name()
    lens = [LONG] + [SHORT] * (B - 1)
    pages = [(n + PAGE_FA3 - 1) // PAGE_FA3 for n in lens]
    kc = torch.randn(sum(pages), PAGE_FA3, Hkv, D, dtype=DT, device=DEV)
    vc = torch.randn_like(kc)
    q = torch.randn(B, 1, Hq, D, dtype=DT, device=DEV)
    perm = torch.randperm(sum(pages), device=DEV).to(torch.int32)
    table = torch.zeros(B, max(pages), dtype=torch.int32, device=DEV)
    first = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[first:first + n]
        first += n
    seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    sched = sched_kwargs(fa3, B, 1, LONG, Hq, Hkv, D, seqlens, DT, False)
    make = lambda use: lambda: fa3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=table,
                                                           num_splits=0, **(sched if use else {}))
    sample = [0, 1, B - 1]
    refs = []
    for b in sample:
        kb = kc[table[b, :pages[b]].long()].reshape(1, -1, Hkv, D)[:, :lens[b]].transpose(1, 2)
        vb = vc[table[b, :pages[b]].long()].reshape(1, -1, Hkv, D)[:, :lens[b]].transpose(1, 2)
        refs.append(attention_f32(q[b:b + 1].transpose(1, 2), kb, vb).transpose(1, 2))
    nbytes = sum(lens) * Hkv * D * 2 * 2 + 2 * B * Hq * D * 2
    checked_sched(name, "fa3_"+PAGED, make, bool(sched), lambda o: o[sample], torch.cat(refs), TOL_BF16, nbytes=nbytes)


def prefill(fa3):
    B, S = PREFILL_B, PREFILL_S
    for hd, H in PREFILL_HEADS:
        name = f"prefill_b{B}_s{S}_causal_hd{hd}"
        q, k, v = (torch.randn(B, S, H, hd, dtype=DT, device=DEV) for _ in range(3))
        flops = B * causal_flops(H, S, S, hd)
        rows = sorted(set(range(0, 128)) | set(range(S // 2, S // 2 + 64)) | set(range(S - 128, S)))
        ref = ref_rows(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), rows, True).transpose(1, 2)

        def contiguous():
            fn = lambda: fa3.flash_attn_func(q, k, v, causal=True)
            checked(name, "fa3_contiguous", fn, fn()[:, rows], ref, TOL_BF16, flops=flops)

        def paged():
            kc, vc, table = paged_from_contiguous(k, v, PAGE_FA3)
            seqlens = torch.full((B,), S, dtype=torch.int32, device=DEV)
            sched = sched_kwargs(fa3, B, S, S, H, H, hd, seqlens, DT, True)
            make = lambda use: lambda: fa3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=table,
                                                                   causal=True, num_splits=0, **(sched if use else {}))
            checked_sched(name, "fa3_"+PAGED, make, bool(sched), lambda o: o[:, rows], ref, TOL_BF16, flops=flops)

        guard(name, "fa3_contiguous", contiguous)
        guard(name, "fa3_"+PAGED, paged)
        del q, k, v, ref
        torch.cuda.empty_cache()


def chunk(fa3):
    Sq, Sk, Hq, Hkv, D = CHUNK_SHAPE
    name = f"chunk_q{Sq}_ctx{Sk}_gqa{Hq}_{Hkv}_hd{D}"
    q = torch.randn(1, Sq, Hq, D, dtype=DT, device=DEV)
    k, v = (torch.randn(1, Sk, Hkv, D, dtype=DT, device=DEV) for _ in range(2))
    rows = sorted(set(range(0, 64)) | set(range(Sq // 2, Sq // 2 + 32)) | set(range(Sq - 64, Sq)))
    ref = ref_rows(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), rows, True).transpose(1, 2)
    kc, vc, table = paged_from_contiguous(k, v, PAGE_FA3)
    del k, v
    seqlens = torch.full((1,), Sk, dtype=torch.int32, device=DEV)
    sched = sched_kwargs(fa3, 1, Sq, Sk, Hq, Hkv, D, seqlens, DT, True)
    make = lambda use: lambda: fa3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=table,
                                                           causal=True, num_splits=0, **(sched if use else {}))
    checked_sched(name, "fa3_"+PAGED, make, bool(sched), lambda o: o[:, rows], ref, TOL_BF16,
                  flops=causal_flops(Hq, Sq, Sk, D))


def varlen_inputs():
    """The varlen case: (name, lengths, cu_seqlens [n + 1] int32, q, k, v [tokens, heads, hd],
    the float32 causal reference of every sequence [tokens, heads, hd])."""
    H, D = VARLEN_HEADS, VARLEN_D
    lens = VARLEN_LENS
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    q, k, v = (torch.randn(sum(lens), H, D, dtype=DT, device=DEV) for _ in range(3))
    refs = []
    for i, s in enumerate(lens):
        a = int(cu[i])
        seg = [t[a:a + s].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
        refs.append(ref_rows(*seg, list(range(s)), True)[0].transpose(0, 1))
    return f"varlen{len(lens)}_causal_hd{D}", lens, cu, q, k, v, torch.cat(refs)


def varlen(fa3):
    name, lens, cu, q, k, v, ref = varlen_inputs()
    H, D = VARLEN_HEADS, VARLEN_D
    mx = max(lens)
    flops = sum(causal_flops(H, s, s, D) for s in lens)

    def packed():
        fn = lambda: fa3.flash_attn_varlen_func(q, k, v, cu, cu, mx, mx, causal=True)
        checked(name, "fa3_varlen", fn, fn(), ref, TOL_BF16, flops=flops)

    def paged():
        # each sequence's K/V in its own pages of one cache, in a random page order
        pages = [s // PAGE_FA3 for s in lens]
        perm = torch.randperm(sum(pages), device=DEV)
        kc = torch.empty(sum(pages), PAGE_FA3, H, D, dtype=DT, device=DEV)
        vc = torch.empty_like(kc)
        kc[perm] = k.view(-1, PAGE_FA3, H, D)
        vc[perm] = v.view(-1, PAGE_FA3, H, D)
        table = torch.zeros(len(lens), max(pages), dtype=torch.int32, device=DEV)
        first = 0
        for i, p in enumerate(pages):
            table[i, :p] = perm[first:first + p].to(torch.int32)
            first += p
        seqlens = torch.tensor(lens, dtype=torch.int32, device=DEV)
        sched = sched_kwargs(fa3, len(lens), mx, mx, H, H, D, seqlens, DT, True, cu_seqlens_q=cu)
        make = lambda use: lambda: fa3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, page_table=table,
                                                               cu_seqlens_q=cu, max_seqlen_q=mx, causal=True,
                                                               num_splits=0, **(sched if use else {}))
        checked_sched(name, "fa3_"+PAGED, make, bool(sched), lambda o: o, ref, TOL_BF16, flops=flops)

    guard(name, "fa3_varlen", packed)
    guard(name, "fa3_"+PAGED, paged)


def merge_states(o_a, lse_a, o_b, lse_b):
    """Two partial attention results (o [N, H, D], natural-log LSE [N, H]) -> the result over the
    union of their keys, in float32 (vLLM's merge_attn_states, unfused)."""
    lse = torch.stack([lse_a, lse_b]).float()
    w = torch.softmax(lse, dim=0).unsqueeze(-1)
    return (o_a.float() * w[0] + o_b.float() * w[1]).to(o_a.dtype)


def cascade(fa3):
    B, Hq, Hkv, D = CASC_R, CASC_HQ, CASC_HKV, CASC_D
    for P in CASC_PREFIXES:
        for S in CASC_SUFFIXES:
            name = f"cascade_b{B}_p{P}_s{S}"
            guard(name, "fa3", lambda: cascade_case(fa3, B, Hq, Hkv, D, P, S))
            torch.cuda.empty_cache()


def cascade_case(fa3, B, Hq, Hkv, D, P, S):
    name = f"cascade_b{B}_p{P}_s{S}"
    pp, sp = P // PAGE_FA3, S // PAGE_FA3
    kc = torch.randn(pp + B * sp, PAGE_FA3, Hkv, D, dtype=DT, device=DEV)
    vc = torch.randn_like(kc)
    perm = torch.randperm(pp + B * sp, device=DEV).to(torch.int32)
    prefix_ids, suffix_ids = perm[:pp], perm[pp:].view(B, sp)
    flat_table = torch.cat([prefix_ids.expand(B, pp), suffix_ids], dim=1).contiguous()
    q = torch.randn(B, 1, Hq, D, dtype=DT, device=DEV)
    sample = [0, B // 2, B - 1]
    refs = []
    for b in sample:
        kb = kc[flat_table[b].long()].reshape(1, P + S, Hkv, D).transpose(1, 2)
        vb = vc[flat_table[b].long()].reshape(1, P + S, Hkv, D).transpose(1, 2)
        refs.append(attention_f32(q[b:b + 1].transpose(1, 2), kb, vb).transpose(1, 2))
    ref = torch.cat(refs)
    nbytes = B * (P + S) * Hkv * D * 2 * 2   # as if each request read its K/V (bench_cascade's flat)

    flat_len = torch.full((B,), P + S, dtype=torch.int32, device=DEV)
    sched_flat = sched_kwargs(fa3, B, 1, P + S, Hq, Hkv, D, flat_len, DT, False)
    make_flat = lambda use: lambda: fa3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=flat_len, page_table=flat_table,
                                                                num_splits=0, **(sched_flat if use else {}))
    checked_sched(name, "fa3_flat_"+PAGED, make_flat, bool(sched_flat), lambda o: o[sample], ref, TOL_BF16,
                  nbytes=nbytes)

    # vLLM's cascade: the B query tokens as one sequence over the prefix (non-causal), each
    # request's token over its suffix, merged by LSE
    qp = q.view(1, B, Hq, D)
    p_len = torch.full((1,), P, dtype=torch.int32, device=DEV)
    p_table = prefix_ids.view(1, pp).contiguous()
    s_len = torch.full((B,), S, dtype=torch.int32, device=DEV)
    sched_p = sched_kwargs(fa3, 1, B, P, Hq, Hkv, D, p_len, DT, False)
    sched_s = sched_kwargs(fa3, B, 1, S, Hq, Hkv, D, s_len, DT, False)

    def make_prefix(use):
        return lambda: fa3.flash_attn_with_kvcache(qp, kc, vc, cache_seqlens=p_len, page_table=p_table, num_splits=0,
                                                   return_softmax_lse=True, **(sched_p if use else {}))

    def make_cascade(use):
        prefix_pass = make_prefix(use)

        def suffix_pass():
            return fa3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=s_len, page_table=suffix_ids, num_splits=0,
                                               return_softmax_lse=True, **(sched_s if use else {}))

        def casc():
            op, lp = prefix_pass()[:2]     # [1, B, Hq, D], [1, Hq, B]
            os_, ls = suffix_pass()[:2]    # [B, 1, Hq, D], [B, Hq, 1]
            return merge_states(op[0], lp[0].transpose(0, 1), os_[:, 0], ls[:, :, 0]).unsqueeze(1)
        return casc

    has_sched = bool(sched_p) and bool(sched_s)
    checked_sched(name, "fa3_cascade_"+PAGED, make_cascade, has_sched, lambda o: o[sample], ref, TOL_BF16,
                  nbytes=nbytes)
    # the prefix pass alone (its own reference: the prefix keys only), under peer_attention's name
    pref = []
    for b in sample:
        kb = kc[prefix_ids.long()].reshape(1, P, Hkv, D).transpose(1, 2)
        vb = vc[prefix_ids.long()].reshape(1, P, Hkv, D).transpose(1, 2)
        pref.append(attention_f32(q[b:b + 1].transpose(1, 2), kb, vb).transpose(1, 2))
    checked_sched(f"cascade_prefix_p{P}_t{B}_gqa{Hq}_{Hkv}_hd{D}", "fa3_"+PAGED+"_prefix", make_prefix, bool(sched_p),
                  lambda o: o[0][0, sample].unsqueeze(1), torch.cat(pref), TOL_BF16, flops=4.0 * B * Hq * P * D)


def main():
    parts = {"decode": lambda m: decode(m), "fp8": lambda m: decode(m, fp8=True), "lopsided": lopsided, "prefill": prefill,
             "varlen": varlen, "chunk": chunk, "cascade": cascade}
    global PAGE_FA3, PAGED
    try:
        PAGE_FA3 = page_size(os.environ)
    except ValueError as e:
        print(f"fa3_peer.py: {e}", file=sys.stderr)
        return 2
    PAGED = f"paged{PAGE_FA3}"
    wanted = sys.argv[1:] or list(parts)
    for w in wanted:
        if w not in parts:
            print(f"fa3_peer.py: unknown part '{w}' (one of: {' '.join(parts)})", file=sys.stderr)
            return 2
    fa3, why = load_built("fa3", "flash_attn_interface.py", "flash_attn_interface")
    if fa3 is None:
        for w in wanted:
            print(f"PEER name={w} impl=fa3 error=\"{why}\"", flush=True)
        return 0
    print(f"# fa3 from {os.path.dirname(fa3.__file__)}: "
          + open(os.path.join(os.path.dirname(fa3.__file__), "BUILD.txt")).read().splitlines()[1], flush=True)
    for w in wanted:
        guard(w, "fa3", lambda: parts[w](fa3))
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
