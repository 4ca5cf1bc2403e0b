"""flashinfer_peer.py - FlashInfer's paged attention wrappers (the FlashInfer backend of vLLM) on
the shapes of our benchmarks, in the same run as them:

  decode   decode_b64_s8192_gqa32_8_hd128: BatchDecodeWithPagedKVCacheWrapper, page 16, NHD,
           CUDA-core kernel (fi_decode_paged16) and tensor-core kernel (fi_decode_tc_paged16,
           what vLLM picks for GQA groups of 4 and more)
  prefill  prefill_b2_s8192_causal_hd128 / _hd256: BatchPrefillWithPagedKVCacheWrapper (backend
           auto: the FA3 template on sm90), page 16 (fi_prefill_paged16)
  varlen   varlen16_causal_hd128: the same wrapper with the 16 sequences (fi_prefill_paged16)
  cascade  cascade_b128_p<P>_s<S>: MultiLevelCascadeAttentionWrapper, two levels (the shared
           prefix, then each request's suffix), page 16 (fi_cascade_paged16)

FlashInfer compiles its kernels when a wrapper is planned (JIT, nvcc and ninja, no network).
The first run does that (minutes) with its workspace in $FLASHINFER_WORKSPACE_BASE (default
/tmp/ar_flashinfer_ws); `--keep-modules DIR` then copies each compiled module to DIR/<name>/<name>.so
and writes DIR/../flashinfer_jit_cache (a module that points FlashInfer at DIR), so that a later
run with that folder on PYTHONPATH loads them instead of compiling (kernels/peers/build_peers.sh
does this into .peers/built/flashinfer).  `--plan-only` compiles and checks without timing.

Checks and timing as fa3_peer.py (float32 reference, relerr <= 2e-2, median of 20 samples of
back-to-back calls, the plan made once outside the timing as the engine makes it once per step).
Without an importable flashinfer: one error line per part saying why, exit 0.

Usage: python3 flashinfer_peer.py [decode|prefill|varlen|cascade ...] [--plan-only] [--keep-modules DIR]"""
import argparse
import glob
import os
import shutil
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", "/tmp/ar_flashinfer_ws")
import fa3_peer  # noqa: E402
from fa3_peer import PAGE, TOL_BF16, checked, ref_rows  # noqa: E402
from peer_attention import CASC_D, CASC_HKV, CASC_HQ, CASC_R, DEV, DT, attention_f32, causal_flops, guard  # noqa: E402

PLAN_ONLY = False
WORKSPACE_BYTES = 512 << 20


def workspace():
    return torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=DEV)


def paged_layout(table):
    """FlashInfer's CSR page layout of full pages: (indptr [B + 1], indices, last_page_len [B])."""
    B, ppr = table.shape
    indptr = torch.arange(B + 1, dtype=torch.int32, device=DEV) * ppr
    return indptr, table.reshape(-1).contiguous(), torch.full((B,), PAGE, dtype=torch.int32, device=DEV)


def run_checked(name, impl, fn, pick, ref, **kw):
    if PLAN_ONLY:
        rel, mx = fa3_peer.compare(pick(fn()), ref)
        print(f"# {name} {impl}: compiled and ran, relerr={rel:.2e} maxdiff={mx:.3g}", flush=True)
        return
    checked(name, impl, fn, pick(fn()), ref, TOL_BF16, **kw)


def decode(fi):
    B, Hq, Hkv, S, D = fa3_peer.DECODE_SHAPE
    name = f"decode_b{B}_s{S}_gqa{Hq}_{Hkv}_hd{D}"
    ppr = S // PAGE
    kc = torch.randn(B * ppr, PAGE, Hkv, D, dtype=DT, device=DEV)
    vc = torch.randn_like(kc)
    q = torch.randn(B, Hq, D, dtype=DT, device=DEV)
    table = torch.randperm(B * ppr, device=DEV).view(B, ppr).to(torch.int32)
    sample = [0, B // 2, B - 1]
    refs = []
    for b in sample:
        kb = kc[table[b].long()].reshape(1, S, Hkv, D).transpose(1, 2)
        vb = vc[table[b].long()].reshape(1, S, Hkv, D).transpose(1, 2)
        refs.append(attention_f32(q[b:b + 1].unsqueeze(2), kb, vb)[:, :, 0])
    ref = torch.cat(refs)
    nbytes = B * S * Hkv * D * 2 * 2 + 2 * B * Hq * D * 2
    for tc in (False, True):
        impl = "fi_decode_tc_paged16" if tc else "fi_decode_paged16"

        def one():
            w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", use_tensor_cores=tc)
            w.plan(*paged_layout(table), Hq, Hkv, D, PAGE, q_data_type=DT, kv_data_type=DT)
            run_checked(name, impl, lambda: w.run(q, (kc, vc)), lambda o: o[sample], ref, nbytes=nbytes)
        guard(name, impl, one)


def prefill_wrapper(fi, qo_indptr, table, lens, H, hd, causal):
    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")
    indptr, indices, _ = paged_layout(table)
    if lens is not None:   # pages per request and entries in the last page from the lengths
        pages = [(n + PAGE - 1) // PAGE for n in lens]
        indptr = torch.tensor([0] + torch.tensor(pages).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
        indices = torch.cat([table[i, :p] for i, p in enumerate(pages)]).contiguous()
        last = torch.tensor([n - (p - 1) * PAGE for n, p in zip(lens, pages)], dtype=torch.int32, device=DEV)
    else:
        last = torch.full((table.shape[0],), PAGE, dtype=torch.int32, device=DEV)
    w.plan(qo_indptr, indptr, indices, last, H, H, hd, PAGE, causal=causal, q_data_type=DT, kv_data_type=DT)
    return w


def prefill(fi):
    B, S = fa3_peer.PREFILL_B, fa3_peer.PREFILL_S
    for hd, H in fa3_peer.PREFILL_HEADS:
        name = f"prefill_b{B}_s{S}_causal_hd{hd}"
        q, k, v = (torch.randn(B, S, H, hd, dtype=DT, device=DEV) for _ in range(3))
        rows = sorted(set(range(0, 128)) | set(range(S - 128, S)))
        ref = ref_rows(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), rows, True).transpose(1, 2)

        def one():
            kc, vc, table = fa3_peer.paged_from_contiguous(k, v, PAGE)
            qo = torch.arange(B + 1, dtype=torch.int32, device=DEV) * S
            w = prefill_wrapper(fi, qo, table, None, H, hd, True)
            qf = q.reshape(B * S, H, hd)
            run_checked(name, "fi_prefill_paged16", lambda: w.run(qf, (kc, vc)),
                        lambda o: o.view(B, S, H, hd)[:, rows], ref, flops=B * causal_flops(H, S, S, hd))
        guard(name, "fi_prefill_paged16", one)
        del q, k, v, ref
        torch.cuda.empty_cache()


def varlen(fi):
    name, lens, cu, q, k, v, ref = fa3_peer.varlen_inputs()
    H, D = fa3_peer.VARLEN_HEADS, fa3_peer.VARLEN_D

    def one():
        pages = [(s + PAGE - 1) // PAGE for s in lens]
        perm = torch.randperm(sum(pages), device=DEV)
        kc = torch.zeros(sum(pages), PAGE, H, D, dtype=DT, device=DEV)
        vc = torch.zeros_like(kc)
        table = torch.zeros(len(lens), max(pages), dtype=torch.int32, device=DEV)
        first = 0
        for i, (s, p) in enumerate(zip(lens, pages)):
            ids = perm[first:first + p]
            a = int(cu[i])
            kc.view(-1, H, D)[(ids[:, None] * PAGE + torch.arange(PAGE, device=DEV)).reshape(-1)[:s]] = k[a:a + s]
            vc.view(-1, H, D)[(ids[:, None] * PAGE + torch.arange(PAGE, device=DEV)).reshape(-1)[:s]] = v[a:a + s]
            table[i, :p] = ids.to(torch.int32)
            first += p
        w = prefill_wrapper(fi, cu, table, lens, H, D, True)
        run_checked(name, "fi_prefill_paged16", lambda: w.run(q, (kc, vc)), lambda o: o, ref,
                    flops=sum(causal_flops(H, s, s, D) for s in lens))
    guard(name, "fi_prefill_paged16", one)


def cascade(fi):
    B, Hq, Hkv, D = CASC_R, CASC_HQ, CASC_HKV, CASC_D
    for P in fa3_peer.CASC_PREFIXES:
        for S in fa3_peer.CASC_SUFFIXES:
            name = f"cascade_b{B}_p{P}_s{S}"
            guard(name, "fi_cascade_paged16", lambda: cascade_case(fi, name, B, Hq, Hkv, D, P, S))
            torch.cuda.empty_cache()


def cascade_case(fi, name, B, Hq, Hkv, D, P, S):
    pp, sp = P // PAGE, S // PAGE
    kc = torch.randn(pp + B * sp, PAGE, Hkv, D, dtype=DT, device=DEV)
    vc = torch.randn_like(kc)
    perm = torch.randperm(pp + B * sp, device=DEV).to(torch.int32)
    prefix_ids, suffix_ids = perm[:pp].contiguous(), perm[pp:].view(B, sp).contiguous()
    q = torch.randn(B, Hq, D, dtype=DT, device=DEV)
    sample = [0, B // 2, B - 1]
    refs = []
    for b in sample:
        ids = torch.cat([prefix_ids, suffix_ids[b]]).long()
        kb = kc[ids].reshape(1, P + S, Hkv, D).transpose(1, 2)
        vb = vc[ids].reshape(1, P + S, Hkv, D).transpose(1, 2)
        refs.append(attention_f32(q[b:b + 1].unsqueeze(2), kb, vb)[:, :, 0])
    i32 = dict(dtype=torch.int32, device=DEV)
    w = fi.MultiLevelCascadeAttentionWrapper(2, workspace(), "NHD")
    w.plan([torch.tensor([0, B], **i32), torch.arange(B + 1, **i32)],
           [torch.tensor([0, pp], **i32), torch.arange(B + 1, **i32) * sp],
           [prefix_ids, suffix_ids.reshape(-1)],
           [torch.tensor([PAGE], **i32), torch.full((B,), PAGE, **i32)],
           Hq, Hkv, D, PAGE, causal=False, q_data_type=DT, kv_data_type=DT)
    run_checked(name, "fi_cascade_paged16", lambda: w.run(q, (kc, vc)), lambda o: o[sample], torch.cat(refs),
                nbytes=B * (P + S) * Hkv * D * 2 * 2)


def keep_modules(dest):
    """Copies the compiled modules to dest/<name>/<name>.so and writes the flashinfer_jit_cache
    module beside dest that makes FlashInfer load them as its ahead-of-time cache."""
    from flashinfer.jit import env as jit_env
    import flashinfer
    n = 0
    for so in glob.glob(str(jit_env.FLASHINFER_JIT_DIR / "*" / "*.so")):
        mod = os.path.basename(os.path.dirname(so))
        if os.path.basename(so) != f"{mod}.so":
            continue
        os.makedirs(os.path.join(dest, mod), exist_ok=True)
        target = os.path.join(dest, mod, f"{mod}.so")
        shutil.copy(so, target)
        subprocess.run(["strip", "--strip-unneeded", target], check=False)
        n += 1
    write_jit_cache_shim(dest)
    print(f"# kept {n} compiled FlashInfer modules in {dest}", flush=True)


def write_jit_cache_shim(dest):
    """Writes the flashinfer_jit_cache module beside dest (the folder of <name>/<name>.so
    modules), which FlashInfer imports at its own import to find its ahead-of-time cache: with
    it on the path, FlashInfer loads dest's modules instead of compiling them."""
    import flashinfer
    pkg = os.path.join(os.path.dirname(os.path.abspath(dest)), "flashinfer_jit_cache")
    os.makedirs(pkg, exist_ok=True)
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write('"""FlashInfer modules compiled by attnreplay\'s kernels/peers/flashinfer_peer.py, loaded\n'
                'by FlashInfer as its ahead-of-time cache."""\n'
                "import os\n"
                f"__version__ = {flashinfer.__version__ + '+attnreplay'!r}\n\n\n"
                "def get_jit_cache_dir():\n"
                f"    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "
                f"{os.path.basename(os.path.abspath(dest))!r})\n")


def main():
    global PLAN_ONLY
    parts = {"decode": decode, "prefill": prefill, "varlen": varlen, "cascade": cascade}
    ap = argparse.ArgumentParser(description="FlashInfer peers of our benchmarks")
    # no `choices` with nargs="*": argparse checks a list default against them as one value
    ap.add_argument("parts", nargs="*", help="any of: " + " ".join(parts) + " (default: all)")
    ap.add_argument("--plan-only", action="store_true")
    ap.add_argument("--keep-modules", default=None)
    args = ap.parse_args()
    args.parts = args.parts or list(parts)
    bad = [w for w in args.parts if w not in parts]
    if bad:
        ap.error(f"unknown part(s) {' '.join(bad)}; choose from {' '.join(parts)}")
    PLAN_ONLY = args.plan_only
    try:
        import flashinfer
    except Exception as e:  # noqa: BLE001 - reported as the reason
        why = f"import failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        for w in args.parts:
            print(f"PEER name={w} impl=flashinfer error=\"{why}\"", flush=True)
        return 0
    from flashinfer.jit import env as jit_env
    print(f"# flashinfer {flashinfer.__version__} from {os.path.dirname(flashinfer.__file__)}, "
          f"ahead-of-time modules {jit_env.FLASHINFER_AOT_DIR}, JIT {jit_env.FLASHINFER_JIT_DIR}", flush=True)
    for w in args.parts:
        guard(w, "flashinfer", lambda: parts[w](flashinfer))
        torch.cuda.empty_cache()
        if args.keep_modules:   # after each part, so a run stopped later keeps what it compiled
            keep_modules(args.keep_modules)
    return 0


if __name__ == "__main__":
    sys.exit(main())
