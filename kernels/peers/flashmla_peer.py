"""flashmla_peer.py - FlashMLA's sm90 dense decode (bf16), built offline by
kernels/peers/build_peers.py into .peers/built/flashmla, timed on the shapes of tests/bench_mla.c
in the same run: b = 128 requests, s_q = 1, one latent KV head, d = 576 (512 latent + 64 rope),
dv = 512, paged cache with FlashMLA's block size 64 and a random block table, every request with
s_k = 4096, 8192, 16384, 32768 keys, h_q = 128 and h_q = 16, scale 1/sqrt(576).  Inputs: standard
normal draws (--data randn, the default), or FlashMLA's own test recipe that tests/bench_mla.c
uses (--data test: the draws / 10, clamped to [-1, 1]); the tensor cores' power, and so the
clocks under a power cap, depend on the values.

Each shape is checked against a float32 torch reference on a sample of requests (relerr = ||out -
ref|| / ||ref|| and maxdiff printed; over 2e-2 the line is an error line), then timed with FlashMLA's
scheduler metadata made once per shape (get_mla_metadata, as the engine does once per step):
CUDA events, 3 warm-ups, median of 20 samples of back-to-back calls (split-KV kernel + combine,
FlashMLA's definition).  One line per shape, in peer_attention.py's format:
    PEER name=mla_decode_b128_hq<h>_sk<s_k> impl=flashmla_dense us=... gbps=... tflops=...
with FlashMLA's counts: FLOPs 2 h_q s_q keys (576 + 512), bytes (keys 576 + b s_q h_q (576 + 512)) x 2,
keys = b s_k (bench_mla.c uses the same).  Without the built extension: one error line per h_q.

Usage: python3 flashmla_peer.py [--h 128 16] [--sk 4096 8192 16384 32768] [--b 128]"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fa3_peer import checked, load_built  # noqa: E402
from peer_attention import DEV, DT, guard, no_tf32  # noqa: E402

D_QK, D_V, BLOCK = 576, 512, 64
TOL = 2e-2


def mla_reference(q, cache, table, seqlens, rows, scale):
    """float32 MLA decode of the requests `rows`: q [b, s_q, h, 576], cache [blocks, 64, 1, 576]
    (V = the first 512 of each key) -> [len(rows), s_q, h, 512]"""
    outs = []
    with no_tf32():
        for r in rows:
            n = int(seqlens[r])
            kv = cache[table[r, :(n + BLOCK - 1) // BLOCK].long()].reshape(-1, D_QK)[:n].float()   # [n, 576]
            s = torch.matmul(q[r].float(), kv.t()) * scale                                        # [s_q, h, n]
            outs.append(torch.matmul(torch.softmax(s, dim=-1), kv[:, :D_V]))
    return torch.stack(outs)


def draw(shape, data):
    """bf16 inputs: standard normal (data "randn"), or FlashMLA's test recipe (data "test")."""
    if data == "randn":
        return torch.randn(*shape, dtype=DT, device=DEV)
    return (torch.randn(*shape, dtype=torch.float32, device=DEV) / 10).clamp(-1, 1).to(DT)


def run_shape(mla, b, h, sk, data="randn"):
    name = f"mla_decode_b{b}_hq{h}_sk{sk}"
    bpr = sk // BLOCK
    cache = draw((b * bpr, BLOCK, 1, D_QK), data)
    table = torch.randperm(b * bpr, device=DEV).view(b, bpr).to(torch.int32)
    seqlens = torch.full((b,), sk, dtype=torch.int32, device=DEV)
    q = draw((b, 1, h, D_QK), data)
    scale = D_QK ** -0.5
    meta = mla.get_mla_metadata()[0]

    def fn():
        return mla.flash_mla_with_kvcache(q, cache, table, seqlens, D_V, meta, None, softmax_scale=scale,
                                          causal=False)[0]

    rows = [0, b // 2, b - 1]
    ref = mla_reference(q, cache, table, seqlens, rows, scale)
    keys = b * sk
    flops = 2.0 * h * 1 * keys * (D_QK + D_V)
    nbytes = (keys * D_QK + b * 1 * h * (D_QK + D_V)) * 2.0
    checked(name, "flashmla_dense", fn, fn()[rows], ref, TOL, nbytes=nbytes, flops=flops)
    del cache, q


def main():
    ap = argparse.ArgumentParser(description="FlashMLA dense decode peer of tests/bench_mla.c")
    ap.add_argument("--b", type=int, default=128)
    ap.add_argument("--h", type=int, nargs="+", default=[128, 16])
    ap.add_argument("--sk", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    ap.add_argument("--data", choices=("randn", "test"), default="randn")
    args = ap.parse_args()
    mla, why = load_built("flashmla", os.path.join("flash_mla", "__init__.py"), "flash_mla")
    if mla is None:
        for h in args.h:
            print(f"PEER name=mla_decode_b{args.b}_hq{h} impl=flashmla_dense error=\"{why}\"", flush=True)
        return 0
    for h in args.h:
        for sk in args.sk:
            guard(f"mla_decode_b{args.b}_hq{h}_sk{sk}", "flashmla_dense", lambda: run_shape(mla, args.b, h, sk, args.data))
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
