#!/usr/bin/env bash
# run_peers.sh - our benchmarks and every peer on the same shapes, in one run on the GPU machine,
# then the target table: tests/bench_cuda.c (decode, prefill, varlen), tests/bench_cascade.c
# (without its plan sweeps), tests/bench_mla.c (with its plain-torch peer), the torch peers
# (peer_attention.py) and the compiled ones (native_peers.sh: FA3, FlashMLA, FlashInfer).
# Needs the prebuilt binaries (bin, build/tests) and .peers/built (and .whl for FlashInfer).
# Writes $OUT/bench.txt, cascade_bench.txt, mla_bench.txt, peers.txt, peers_err.txt; prints the
# table last.  Each step has a timeout; the whole stays inside BUDGET seconds (default 570).
# ROUNDS=N (default 1): all of it N times in turn (ours, then the peers), round k's files in
# $OUT/round-k/, then one table of the medians with each row's spread of ratios
# ($OUT/peers_table.txt): a peer that reads 5% apart from one minute to the next shows it.
set -u
OUT=${OUT:-/tmp/ar_peers_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export AR_SRC=$PWD AR_BIN=$PWD/bin/attnreplay PYTHONUNBUFFERED=1 OUT
BUDGET=${BUDGET:-570}
cap() {   # cap SECONDS: the step's timeout, at most what is left of the budget less 20 s
  local left=$(( BUDGET - SECONDS - 20 ))
  [ "$left" -lt "$1" ] && echo $(( left > 10 ? left : 10 )) || echo "$1"
}
LB=$(command -v stdbuf >/dev/null 2>&1 && echo "stdbuf -oL")   # line-buffered, so a timeout keeps the lines
ROUNDS=${ROUNDS:-1}
one_round() {   # one_round DIR: ours, then the peers, into DIR
  local dir=$1
  mkdir -p "$dir"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
  echo "== ours: bench_cuda, bench_cascade, bench_mla ($(date -u +%H:%M:%S))"
  timeout "$(cap 110)" $LB build/tests/bench_cuda 20 >"$dir/bench.txt" 2>&1
  echo "bench_cuda rc=$?"
  AR_CASC_SWEEPS=0 timeout "$(cap 80)" $LB build/tests/bench_cascade 20 >"$dir/cascade_bench.txt" 2>&1
  echo "bench_cascade rc=$?"
  timeout "$(cap 120)" $LB build/tests/bench_mla >"$dir/mla_bench.txt" 2>&1
  echo "bench_mla rc=$?"
  echo "== torch peers ($(date -u +%H:%M:%S))"
  timeout "$(cap 150)" python3 kernels/peers/peer_attention.py >"$dir/peers.txt" 2>"$dir/peers_err.txt"
  echo "peer_attention rc=$?"
  echo "== compiled peers ($(date -u +%H:%M:%S))"
  OUT=$dir PEERS_DEADLINE=$(( $(date +%s) + BUDGET - SECONDS )) FA3_RUN=200 MLA_RUN=120 FI_RUN=120 \
    bash kernels/peers/native_peers.sh
}
if [ "$ROUNDS" -le 1 ]; then
  one_round "$OUT"
  exit 0
fi
args=()
for k in $(seq 1 "$ROUNDS"); do
  if [ $(( BUDGET - SECONDS )) -lt 60 ]; then echo "== round $k not run: $(( BUDGET - SECONDS )) s of BUDGET left"; break; fi
  echo "== round $k of $ROUNDS ($(date -u +%H:%M:%S))"
  one_round "$OUT/round-$k"
  d=$OUT/round-$k
  [ -f "$d/bench.txt" ] && [ -f "$d/peers.txt" ] || continue
  args+=(--bench "$d/bench.txt" --cascade "$d/cascade_bench.txt" --mla "$d/mla_bench.txt" --peers "$d/peers.txt")
done
[ ${#args[@]} -gt 0 ] || { echo "== no round finished: no table"; exit 1; }
echo "== the medians of $(( ${#args[@]} / 8 )) rounds ($(date -u +%H:%M:%S))"
python3 kernels/peers/peer_table.py ${args[@]+"${args[@]}"} | tee "$OUT/peers_table.txt"
