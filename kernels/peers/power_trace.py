#!/usr/bin/env python3
"""power_trace.py - runs labelled commands one after another on the GPU machine while
nvidia-smi samples the SM clock, the power draw and the clock-event reasons, then prints, per
command, what the GPU did during it: how many samples, the SM clock (median and lowest), the
instantaneous power (mean and highest), the hottest reading, and the share of samples with
each limiting reason set (software power cap, hardware slowdown, thermal), and the same clock and
power over the busy samples alone (--busy-watts).  It answers whether a kernel timed back to back
runs at a lower clock than its peer, and why (BENCHMARKS.md "Why the 128-head MLA kernel misses,
measured": ours and FlashMLA both at the power cap, at the same clocks).

Usage (repository root, on the GPU machine):
    python3 kernels/peers/power_trace.py [--interval-ms 20] [--csv FILE] LABEL=COMMAND ...
e.g.
    python3 kernels/peers/power_trace.py \\
      "ours=AR_MLA_BENCH_REPEAT=1000 AR_MLA_BENCH_TIMING=b2b build/tests/bench_mla --only 128 32768" \\
      "flashmla=AR_PEER_ITERS=1000 python3 kernels/peers/flashmla_peer.py --h 128 --sk 32768"
Each command runs through the shell; its output goes to our stdout.  nvidia-smi's own power
reading refreshes about every 100 ms whatever the interval, so a command should keep the GPU
busy for seconds (the two environment variables above make the benchmarks do that).  Exit 2 on
bad arguments, 3 when nvidia-smi cannot be started; otherwise the worst exit code of the
commands."""
import argparse
import statistics
import subprocess
import sys
import tempfile
import time

QUERY = "timestamp,clocks.sm,power.draw.instant,temperature.gpu,clocks_event_reasons.active"
# nvidia-smi's clocks_event_reasons bits (nvml.h: nvmlClocksEventReason*)
REASONS = (("sw_power_cap", 0x4), ("hw_slowdown", 0x8 | 0x40 | 0x80), ("sw_thermal", 0x20))


def parse_sample(line):
    """(epoch seconds, SM MHz, watts, deg C, reasons) of one CSV line written with
    --format=csv,noheader,nounits, or None when the line is not one (a header, [N/A] fields)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 5:
        return None
    try:
        t = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S"))
        frac = float("0." + parts[0].split(".")[1]) if "." in parts[0] else 0.0
        return t + frac, float(parts[1]), float(parts[2]), float(parts[3]), int(parts[4], 16)
    except (ValueError, IndexError):
        return None


def summarize(samples, windows, busy_watts=300.0):
    """One row a window: (label, n, clock median, clock min, watts mean, watts max, hottest,
    {reason: share}, busy) over the samples whose time lies in [start, end]; busy is (n, clock
    median, watts mean) over those of them drawing at least busy_watts (the kernels' part of a
    command that also starts Python or allocates; None when there are none).  A window without
    samples gets n = 0 and None elsewhere."""
    rows = []
    for label, start, end in windows:
        inside = [s for s in samples if start <= s[0] <= end]
        if not inside:
            rows.append((label, 0, None, None, None, None, None, {}, None))
            continue
        clocks = [s[1] for s in inside]
        watts = [s[2] for s in inside]
        shares = {name: sum(1 for s in inside if s[4] & bits) / len(inside) for name, bits in REASONS}
        hot = [s for s in inside if s[2] >= busy_watts]
        busy = (len(hot), statistics.median(s[1] for s in hot), statistics.fmean(s[2] for s in hot)) if hot else None
        rows.append((label, len(inside), statistics.median(clocks), min(clocks), statistics.fmean(watts),
                     max(watts), max(s[3] for s in inside), shares, busy))
    return rows


def format_rows(rows):
    out = ["| command | samples | SM MHz median (lowest) | W mean (highest) | deg C max | "
           + " | ".join(name for name, _ in REASONS) + " | busy samples | busy SM MHz median | busy W mean |",
           "|---|---:|---:|---:|---:|" + "---:|" * len(REASONS) + "---:|---:|---:|"]
    for label, n, cmed, cmin, wmean, wmax, hot, shares, busy in rows:
        if n == 0:
            out.append(f"| {label} | 0 | - | - | - |" + " - |" * len(REASONS) + " 0 | - | - |")
            continue
        tail = f" {busy[0]} | {busy[1]:.0f} | {busy[2]:.0f} |" if busy else " 0 | - | - |"
        out.append(f"| {label} | {n} | {cmed:.0f} ({cmin:.0f}) | {wmean:.0f} ({wmax:.0f}) | {hot:.0f} | "
                   + " | ".join(f"{shares[name]:.0%}" for name, _ in REASONS) + " |" + tail)
    return "\n".join(out)


def parse_commands(specs):
    """[(label, command)] from LABEL=COMMAND arguments; ValueError names a malformed one."""
    out = []
    for spec in specs:
        label, eq, cmd = spec.partition("=")
        if not eq or not label or not cmd.strip() or " " in label:
            raise ValueError(f"not LABEL=COMMAND: {spec!r}")
        out.append((label, cmd))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval-ms", type=int, default=20)
    ap.add_argument("--csv", help="also keep nvidia-smi's samples in this file")
    ap.add_argument("--busy-watts", type=float, default=300.0,
                    help="the busy columns count samples drawing at least this (default 300 W)")
    ap.add_argument("commands", nargs="+", metavar="LABEL=COMMAND")
    args = ap.parse_args(argv)
    try:
        commands = parse_commands(args.commands)
    except ValueError as e:
        print(f"power_trace: {e}", file=sys.stderr)
        return 2
    # nvidia-smi writes into a file, not a pipe: nothing reads a pipe until the end, and one
    # full pipe (64 KB, about 20 s of samples) would stop the sampling for the commands after.
    log = tempfile.TemporaryFile(mode="w+")
    try:
        smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                "-lms", str(max(args.interval_ms, 10))], stdout=log, text=True)
    except OSError as e:
        print(f"power_trace: cannot start nvidia-smi: {e}", file=sys.stderr)
        return 3
    time.sleep(0.5)
    windows, worst = [], 0
    for label, cmd in commands:
        print(f"== {label}: {cmd}", flush=True)
        start = time.time()
        rc = subprocess.call(cmd, shell=True)
        windows.append((label, start, time.time()))
        print(f"== {label}: exit {rc}", flush=True)
        worst = max(worst, rc if rc >= 0 else 128 - rc)
    time.sleep(0.3)
    smi.terminate()
    smi.wait(timeout=10)
    log.seek(0)
    text = log.read()
    log.close()
    if args.csv:
        with open(args.csv, "w") as f:
            f.write(text)
    samples = [s for s in (parse_sample(line) for line in text.splitlines()) if s]
    print(format_rows(summarize(samples, windows, args.busy_watts)))
    return worst


if __name__ == "__main__":
    sys.exit(main())
