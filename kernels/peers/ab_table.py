#!/usr/bin/env python3
"""ab_table.py - the table of an A/B run of kernel builds (kernels/peers/ab.sh run): per benchmark
case, each build's median over its rounds and its ratio to the first build (the reference).

Input: lines "AB variant=<name> RESULT name=<case> ..." as ab.sh writes them, from the files given
or stdin; other lines are skipped.  The metric of a line is its first present of tflops=, gbps=
(higher is better; ratio = build / reference) or, for bench_cascade's lines, cascade_us= (lower is
better; ratio = reference / build, so above 1 is faster there too).  Values of 0 count as absent
(bench_cuda prints gbps=0 for prefill cases).

    python3 kernels/peers/ab_table.py ab.txt [--markdown]

Exit 0 with the table; 1 when no result line was read; 2 on a result line without a case name or
a metric (the line is named).
"""
import argparse
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_table import kv  # noqa: E402  (a result line's key=value fields)

LINE = re.compile(r"^AB variant=(\S+) RESULT (.*)$")
METRICS = (("tflops", True, "TFLOP/s"), ("gbps", True, "GB/s"), ("cascade_us", False, "us"))


def parse(lines, source="<stdin>"):
    """[(variant, case, metric, unit, higher_is_better, value)] of the A/B lines; ValueError names
    the first malformed one."""
    out = []
    for lineno, line in enumerate(lines, 1):
        m = LINE.match(line.strip())
        if not m:
            continue
        fields = kv(m.group(2))
        case = fields.get("name")
        if not case:
            raise ValueError(f"{source}:{lineno}: result line without name=")
        for key, higher, unit in METRICS:
            try:
                value = float(fields.get(key, "0"))
            except ValueError:
                raise ValueError(f"{source}:{lineno}: {key}={fields[key]} is not a number")
            if value > 0:
                out.append((m.group(1), case, key, unit, higher, value))
                break
        else:
            raise ValueError(f"{source}:{lineno}: result line of {case} without tflops=, gbps= or cascade_us=")
    return out


def table(rows):
    """[(case, unit, [(variant, median, n, ratio)])] in first-seen order; the first variant seen is
    the reference (ratio 1)."""
    variants, cases = [], []
    values, meta = {}, {}
    for variant, case, _key, unit, higher, value in rows:
        if variant not in variants:
            variants.append(variant)
        if case not in cases:
            cases.append(case)
        meta[case] = (unit, higher)
        values.setdefault((case, variant), []).append(value)
    result = []
    for case in cases:
        unit, higher = meta[case]
        ref = values.get((case, variants[0]))
        ref_median = statistics.median(ref) if ref else None
        cells = []
        for variant in variants:
            vals = values.get((case, variant))
            if not vals:
                continue
            med = statistics.median(vals)
            ratio = None
            if ref_median:
                ratio = med / ref_median if higher else ref_median / med
            cells.append((variant, med, len(vals), ratio))
        result.append((case, unit, cells))
    return result


def render(result, markdown=False):
    lines = []
    if markdown:
        lines += ["| case | build | median | runs | ratio to the first |", "| --- | --- | ---: | ---: | ---: |"]
    for case, unit, cells in result:
        for variant, med, n, ratio in cells:
            r = "-" if ratio is None else f"{ratio:.3f}"
            if markdown:
                lines.append(f"| {case} | {variant} | {med:.1f} {unit} | {n} | {r} |")
            else:
                lines.append(f"{case:44s} {variant:16s} {med:10.1f} {unit:8s} n={n:<3d} ratio {r}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="A/B logs (default: stdin)")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = ap.parse_args(argv)
    rows = []
    try:
        if args.files:
            for path in args.files:
                with open(path, encoding="utf-8", errors="replace") as f:
                    rows += parse(f, path)
        else:
            rows = parse(sys.stdin)
    except (OSError, ValueError) as e:
        print(f"ab_table: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("ab_table: no A/B result lines (AB variant=... RESULT name=...) were read", file=sys.stderr)
        return 1
    print(render(table(rows), args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
