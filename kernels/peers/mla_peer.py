#!/usr/bin/env python3
"""mla_peer.py - plain-torch MLA decode (einsum), the peer of tests/bench_mla.c.

Same shapes as the benchmark: b requests, s_q query tokens each, h_q heads, one latent KV head,
d = 576 (512 latent + 64 rope), dv = 512, bf16, contiguous (unpaged) cache [b, s_k, 576]:
    scores = einsum(q, kv) * scale      (bf16 in, fp32 softmax)
    p      = softmax(scores)            -> bf16
    out    = einsum(p, kv[..., :512])
Timed with CUDA events after a warm-up, median of --repeat runs.  Prints one line per shape:
    PEER <h_q> <s_k> <microseconds>
or one line "ERROR <reason>" (no torch, no GPU, out of memory) and exits 0, so the benchmark
can print the reason beside its own numbers.
"""
import argparse
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--b", type=int, default=128)
    ap.add_argument("--sq", type=int, default=1)
    ap.add_argument("--h", type=int, nargs="+", default=[128, 16])
    ap.add_argument("--sk", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure is a reason to print
        print(f"ERROR torch not available ({type(e).__name__}: {e})")
        return 0
    if not torch.cuda.is_available():
        print("ERROR torch sees no CUDA device")
        return 0
    dev = torch.device("cuda")
    scale = 1.0 / 576 ** 0.5
    for h in args.h:
        for sk in args.sk:
            try:
                q = torch.randn(args.b, args.sq, h, 576, dtype=torch.bfloat16, device=dev)
                kv = torch.randn(args.b, sk, 576, dtype=torch.bfloat16, device=dev)

                def run():
                    s = torch.einsum("bqhd,bkd->bhqk", q, kv).float() * scale
                    p = torch.softmax(s, dim=-1).to(torch.bfloat16)
                    return torch.einsum("bhqk,bkd->bqhd", p, kv[..., :512])

                run()
                torch.cuda.synchronize()
                times = []
                for _ in range(args.repeat):
                    a = torch.cuda.Event(enable_timing=True)
                    z = torch.cuda.Event(enable_timing=True)
                    a.record()
                    run()
                    z.record()
                    z.synchronize()
                    times.append(a.elapsed_time(z) * 1e3)
                times.sort()
                print(f"PEER {h} {sk} {times[len(times) // 2]:.3f}")
                del q, kv
                torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001
                print(f"ERROR h={h} s_k={sk}: {type(e).__name__}: {str(e).splitlines()[0]}")
                torch.cuda.empty_cache()
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
