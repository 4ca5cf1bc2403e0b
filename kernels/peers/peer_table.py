#!/usr/bin/env python3
"""peer_table.py - the targets of the peer comparison in one table, from the outputs of one run
on the GPU machine: ours from tests/bench_cuda.c, tests/bench_cascade.c and tests/bench_mla.c,
the peers' PEER lines from kernels/peers/*.py.

For each target: our number, the peer it is measured against (the best of the listed
implementations when several count), the ratio ours / peer in the target's metric (GB/s for
decode, TFLOP/s for prefill and MLA at h_q 128, GB/s at h_q 16; for the cascade times, peer time /
our time), the target ratio and whether it is met.  A row whose side is missing says which.  Targets:
  paged decode              >= 1.00 x FA3 paged (page 16), >= 0.95 x cuDNN on contiguous K/V
  causal prefill hd128      >= 0.95 x the best of FA3 (contiguous or paged) and cuDNN
  causal prefill hd256      >= 0.85 x the same
  varlen, 16 sequences      >= 1.00 x FA3 (packed or paged)
  prefill and varlen        also against FA3 paged (page 16) alone: our cache's layout (no target)
  FlashInfer                decode, prefill, varlen and its two-level cascade, each beside ours
                            where its PEER lines are (no target)
  MLA decode h_q 128 / 16   >= 1.00 x FlashMLA at every s_k (ours: the default kernel choice)
  fp8 KV decode             >= 1.00 x FA3 e4m3 paged
  cascade (flat-path ratio) ours cascade step vs the peers' cascade / flat, and the prefix pass
                            against FA3's (no fixed target: the measure is the distance to the floor)

Usage: peer_table.py --bench bench.txt [--cascade cascade_bench.txt] [--mla mla_bench.txt]
       --peers peers.txt [--markdown]
Rounds: each option may be given N times (run_peers.sh ROUNDS=N: ours then the peers, N times in
one run, round k's files in round-k/); each side of a row is then the median of its N readings,
the ratio the ratio of the medians, and the verdict says "N rounds, ratios LO-HI" (the spread of
the per-round ratios: a peer whose reading moves 5% between rounds shows it here).
Exit codes: 0 table printed, 2 an input file missing or unreadable, or the options' counts differ."""
import argparse
import re
import sys

FP8_DECODE = "decode_b64_s8192_gqa32_8_hd128_fp8"
MLA_ROW = re.compile(r"^(\d+)\s+(\d+)\s+(bf16|fp8)\s+(\S+)\s+(-?\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+\|")


def kv(line):
    return {k: v.strip('"') for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', line)}


def read(path, what):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError as e:
        raise SystemExit(f"peer_table.py: {path} ({what}): {e.strerror}")


def one_round(args, k):
    """The k-th file of each option (options given once: that file)."""
    pick = lambda v: v if v is None or isinstance(v, str) else v[k]   # noqa: E731
    return argparse.Namespace(bench=pick(args.bench), cascade=pick(args.cascade), mla=pick(args.mla),
                              peers=pick(args.peers))


def parse(args):
    ours, peers, mla = {}, {}, {}
    for line in read(args.bench, "tests/bench_cuda.c output"):
        if line.startswith("RESULT "):
            d = kv(line)
            ours[d["name"]] = d
    if args.cascade:
        for line in read(args.cascade, "tests/bench_cascade.c output"):
            if line.startswith("RESULT name=cascade_"):
                d = kv(line)
                ours[d["name"]] = d
    if args.mla:
        for line in read(args.mla, "tests/bench_mla.c output"):
            m = MLA_ROW.match(line)
            if m and m.group(3) == "bf16":   # the first row of a (h_q, s_k) is the default kernel choice
                mla.setdefault((int(m.group(1)), int(m.group(2))), {"us": float(m.group(6)),
                                                                     "tflops": float(m.group(7)),
                                                                     "tbps": float(m.group(8)), "kernel": m.group(4)})
    for line in read(args.peers, "PEER lines"):
        if line.startswith("PEER ") and "error=" not in line:
            d = kv(line)
            peers.setdefault(d["name"], {})[d["impl"]] = d
    return ours, peers, mla


def best(peers, name, impls, metric):
    """(impl, value) of the best listed implementation with a number, or (None, None)."""
    have = [(float(peers[name][i][metric]), i) for i in impls if i in peers.get(name, {})]
    if not have:
        return None, None
    v, i = max(have) if metric != "us" else min(have)
    return i, v


def rows(ours, peers, mla):
    out = []

    def add(label, name, metric, ours_val, impls, target, ours_note=""):
        impl, pv = best(peers, name, impls, metric)
        if ours_val is None or pv is None:
            missing = "ours" if ours_val is None else "peer (" + " / ".join(impls) + ")"
            out.append((label, ours_val, impl or "-", pv, None, target, f"missing: {missing}", metric == "us", ours_note))
            return
        ratio = pv / ours_val if metric == "us" else ours_val / pv
        verdict = "-" if target is None else ("met" if ratio >= target else "NOT met")
        out.append((label, ours_val, impl, pv, ratio, target, (verdict + " " + ours_note).strip(), metric == "us", ours_note))

    def ours_metric(name, metric):
        return float(ours[name][metric]) if name in ours and metric in ours[name] else None

    dec = "decode_b64_s8192_gqa32_8_hd128"
    add("paged decode B64/8k GQA 32:8 (GB/s)", dec, "gbps", ours_metric(dec, "gbps"), ["fa3_paged16"], 1.0)
    add("paged decode vs cuDNN contiguous (GB/s)", dec, "gbps", ours_metric(dec, "gbps"), ["cudnn_sdpa_contiguous"], 0.95)
    add("paged decode vs FlashInfer (GB/s)", dec, "gbps", ours_metric(dec, "gbps"),
        ["fi_decode_paged16", "fi_decode_tc_paged16"], None)
    for hd, target in ((128, 0.95), (256, 0.85)):
        name = f"prefill_b2_s8192_causal_hd{hd}"
        add(f"causal prefill B2 S8k hd{hd} (TFLOP/s)", name, "tflops", ours_metric(name, "tflops"),
            ["fa3_contiguous", "fa3_paged16", "cudnn_sdpa"], target)
        # the same shape beside FA3 on our cache's layout (paged, block 16): a ratio, no target
        add(f"causal prefill hd{hd} vs FA3 paged 16 (TFLOP/s)", name, "tflops", ours_metric(name, "tflops"), ["fa3_paged16"], None)
        add(f"causal prefill hd{hd} vs FlashInfer (TFLOP/s)", name, "tflops", ours_metric(name, "tflops"),
            ["fi_prefill_paged16"], None)
    var = "varlen16_causal_hd128"
    add("varlen 16 sequences (TFLOP/s)", var, "tflops", ours_metric(var, "tflops"), ["fa3_varlen", "fa3_paged16"], 1.0)
    add("varlen 16 vs FA3 paged 16 (TFLOP/s)", var, "tflops", ours_metric(var, "tflops"), ["fa3_paged16"], None)
    add("varlen 16 vs FlashInfer (TFLOP/s)", var, "tflops", ours_metric(var, "tflops"), ["fi_prefill_paged16"], None)
    lop = "decode_lopsided_b18_s1280_135k"   # the Mooncake trace's lopsided decode step; no target of its own
    add("lopsided decode 135k among 17 x 1.3k (GB/s)", lop, "gbps", ours_metric(lop, "gbps"), ["fa3_paged16"], None)
    chunk = "chunk_q8192_ctx98304_gqa32_8_hd128"   # the Mooncake trace's long mixed step; no target of its own
    add("chunked prefill 8k over 98k GQA 32:8 (TFLOP/s)", chunk, "tflops", ours_metric(chunk, "tflops"), ["fa3_paged16"],
        None)
    add("fp8 KV decode (GB/s)", FP8_DECODE, "gbps", ours_metric(FP8_DECODE, "gbps"), ["fa3_fp8_paged16"], 1.0)
    for h, metric in ((128, "tflops"), (16, "tbps")):
        for sk in (4096, 8192, 16384, 32768):
            o = mla.get((h, sk))
            name = f"mla_decode_b128_hq{h}_sk{sk}"
            peer_metric = "tflops" if metric == "tflops" else "gbps"
            ov = None if o is None else (o[metric] if metric == "tflops" else o[metric] * 1000.0)
            add(f"MLA decode h_q {h} s_k {sk} ({'TFLOP/s' if h == 128 else 'GB/s'})", name, peer_metric, ov,
                ["flashmla_dense"], 1.0, o["kernel"] if o else "")
    for p in (1024, 8192, 32768):
        for s in (128, 256):
            name = f"cascade_b128_p{p}_s{s}"
            add(f"cascade step P {p} S {s} (us)", name, "us", ours_metric(name, "cascade_us"),
                ["fa3_cascade_paged16", "fa3_flat_paged16", "fi_cascade_paged16"], None)
            add(f"cascade step P {p} S {s} vs FlashInfer (us)", name, "us", ours_metric(name, "cascade_us"),
                ["fi_cascade_paged16"], None)
        pname = f"cascade_prefix_p{p}_t128_gqa32_8_hd128"
        cname = f"cascade_b128_p{p}_s128"
        add(f"cascade prefix pass P {p} (TFLOP/s)", pname, "tflops", ours_metric(cname, "prefix_tflops"),
            ["fa3_paged16_prefix"], None)
    return out


def median(values):
    v = sorted(values)
    n = len(v)
    return None if n == 0 else v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def merge_rounds(tables):
    """One table from the tables of N rounds (same rows, same order): the median of each side."""
    if len(tables) == 1:
        return tables[0]
    out = []
    for per_round in zip(*tables):
        label, target, inverse = per_round[0][0], per_round[0][5], per_round[0][7]
        ovs = [r[1] for r in per_round if r[1] is not None]
        pvs = [r[3] for r in per_round if r[3] is not None]
        impls = [r[2] for r in per_round if r[3] is not None]
        impl = max(set(impls), key=impls.count) if impls else "-"
        notes = [r[8] for r in per_round if r[8]]
        note = max(set(notes), key=notes.count) if notes else ""
        ov, pv = median(ovs), median(pvs)
        if ov is None or pv is None:
            missing = "ours" if ov is None else "peer"
            out.append((label, ov, impl, pv, None, target, f"missing: {missing} in every round", inverse, note))
            continue
        ratio = pv / ov if inverse else ov / pv
        ratios = [r[4] for r in per_round if r[4] is not None]
        spread = f"{len(tables)} rounds, ratios {min(ratios):.2f}-{max(ratios):.2f}" if ratios else ""
        if len(ratios) < len(tables):
            spread += f" ({len(tables) - len(ratios)} round(s) missing a side)"
        verdict = "-" if target is None else ("met" if ratio >= target else "NOT met")
        out.append((label, ov, impl, pv, ratio, target, " ".join(x for x in (verdict, note, spread) if x), inverse, note))
    return out


def fmt(v, nd=1):
    return "-" if v is None else f"{v:.{nd}f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description="ours against the peers, target by target")
    ap.add_argument("--bench", required=True, action="append")
    ap.add_argument("--cascade", action="append")
    ap.add_argument("--mla", action="append")
    ap.add_argument("--peers", required=True, action="append")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    n = len(args.bench)
    counts = {k: len(v) for k, v in vars(args).items() if isinstance(v, list)}
    if any(c != n for c in counts.values()):
        print("peer_table.py: each of --bench, --peers (and --cascade, --mla when given) once a round: got "
              + ", ".join(f"{k} {c}" for k, c in sorted(counts.items())), file=sys.stderr)
        return 2
    try:
        table = merge_rounds([rows(*parse(one_round(args, k))) for k in range(n)])
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    head = ("target", "ours", "peer", "peer value", "ours/peer", "target ratio", "verdict")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    for label, ov, impl, pv, ratio, target, verdict, _, _ in table:
        cells = (label, fmt(ov), impl, fmt(pv), fmt(ratio, 3), fmt(target, 2), verdict)
        print("| " + " | ".join(cells) + " |" if args.markdown else
              f"{cells[0]:42s} {cells[1]:>9s} {cells[2]:22s} {cells[3]:>9s} {cells[4]:>6s} {cells[5]:>6s} {cells[6]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
