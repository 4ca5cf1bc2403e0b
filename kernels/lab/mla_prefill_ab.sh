#!/usr/bin/env bash
# mla_prefill_ab.sh - on the GPU machine: the cuda-mla backend's switches for the prefill path and
# the projections' GEMMs, on a DeepSeek-V3 trace, each replayed and verified, in one run.
#
#   kernels/lab/mla_prefill_ab.sh            (OUT: where the logs go; LAB_BUDGET: seconds, 520;
#                                           LAB_GPU_MLA=0 skips stage 1, run by make test-gpu too)
#
# The trace is `sim --workload synthetic:n=128,input=4096,output=48 --model deepseek-v3
# --block-size 64 --max-num-batched-tokens 8192 --step-time roofline:h200` (112 steps: step 0 one
# 4,096-token prefill, 1-64 mixed, 65-111 decode-only), the one BENCHMARKS.md's "MLA on a
# DeepSeek-V3 trace" ran.  Stages, each under `timeout -s KILL`:
#   1. build/tests/gpu_mla_backend (the prefill attention and GEMM switch tests among them)
#                                                                                -> gpu_mla_backend.txt
#   2. steps 0-9 (the prefill and 9 mixed steps), one layer, every step verified (sample:8),
#      through the product's default (the pingpong prefill attention, cuBLAS projections),
#      AR_MLA_PREFILL=tc (the mma.sync attention), AR_MLA_GEMM=tc, AR_MLA_PREFILL=absorbed, and on steps 0-2 only
#      the SIMT kernels of before 2026-12-06 (AR_MLA_PREFILL=simt AR_MLA_GEMM=simt, about 1.5 s
#      a step), and each variant LAB_AB names (space-separated "label:VAR=value[,VAR=value]",
#      e.g. LAB_AB="pp64:AR_MLA_PP_KEYS=64"); then
#      `attnreplay-py ratios` against the default, whole steps and the prefill mark alone
#                                                                                -> mixed.txt
#   3. where the FlashMLA and FlashInfer adapters import (.peers/built carried, kernels/peers/
#      README.md), both on steps 0-9 beside the default                        -> peers.txt
#   4. steps 65-111 (decode-only): the default, AR_MLA_GEMM=tc and =simt         -> decode.txt
# Every run goes into $OUT/mla_ab.db, so `attnreplay report` / `diff` can be run on it later.
# Ratio = the other run's step time / the base run's; below 1, the other run is faster.
set -u
OUT=${OUT:-/tmp/ar_mla_ab}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.." || exit 2
export AR_SRC=$PWD AR_BIN=$PWD/bin/attnreplay PYTHONUNBUFFERED=1
export ATTNREPLAY_LIB=${ATTNREPLAY_LIB:-$PWD/build/libattnreplay.so}
export PYTHONPATH=$PWD/replay/python${PYTHONPATH:+:$PYTHONPATH}
BUDGET=${LAB_BUDGET:-520}
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
stage() { echo "== $1 ($(date -u +%H:%M:%S), $(left)s left)"; }
DB=$OUT/mla_ab.db
TRACE=/tmp/ar_mla_ab_dsv3.trace.jsonl.gz
last_run() { python3 -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT max(id) FROM runs').fetchone()[0])" "$DB" 2>/dev/null; }
# per-mark sums of one run (where its time went) and the kernel paths it ran
marks() {
  python3 - "$DB" "$1" <<'EOF'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT name, count(*), sum(time_us) FROM kernels WHERE run = ? GROUP BY name ORDER BY 3 DESC",
                  (int(sys.argv[2]),)).fetchall()
print("   run %s marks: %s" % (sys.argv[2], ", ".join("%s %.0f us (%d)" % (n, s or 0, c) for n, c, s in rows)))
paths = db.execute("SELECT path, count(*) FROM coverage WHERE run = ? GROUP BY path ORDER BY path",
                   (int(sys.argv[2]),)).fetchall()
print("   run %s kernel paths (steps): %s" % (sys.argv[2], ", ".join("%s (%d)" % (p, c) for p, c in paths)))
EOF
}
# replay STEPS LABEL [VAR=VALUE ...]: one verified cuda-mla run of the steps; prints its run id last
replay() {
  local steps=$1 label=$2
  shift 2
  local t=$(( $(left) - 20 )); [ "$t" -gt 150 ] && t=150
  if [ "$t" -lt 20 ]; then echo "$label: no time left" >&2; return 1; fi
  local t0=$SECONDS
  env "$@" timeout -s KILL "$t" "$AR_BIN" replay "$TRACE" --backend cuda-mla --db "$DB" --layers 1 \
    --verify sample:8 --repeat 3 --steps "$steps" --quiet >&2
  local rc=$?
  echo "$label ($*): exit $rc, $((SECONDS - t0)) s, run $(last_run)" >&2
  [ "$rc" -le 1 ] && last_run
}

stage "device"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee "$OUT/device.txt"
"$AR_BIN" version | tee -a "$OUT/device.txt"
"$AR_BIN" sim --workload synthetic:n=128,input=4096,output=48 --model deepseek-v3 --block-size 64 \
  --max-num-batched-tokens 8192 --step-time roofline:h200 --quiet --out "$TRACE" || exit 1

stage "gpu_mla_backend"
if [ "${LAB_GPU_MLA:-1}" = 1 ]; then
timeout -s KILL 240 build/tests/gpu_mla_backend >"$OUT/gpu_mla_backend.txt" 2>&1
echo "gpu_mla_backend rc=$?"
grep -E "^gemm [a-z]+, prefill [a-z]+:|tc prefill|decode runs|=cuBLAS|FAILED|PASSED|\[  FAILED|\[  ERROR" \
  "$OUT/gpu_mla_backend.txt" | tail -40
fi

stage "mixed steps 0-9"
{
  base=$(replay 0:9 default)
  tcp=$(replay 0:9 tc-prefill AR_MLA_PREFILL=tc)
  tcg=$(replay 0:9 tc-gemm AR_MLA_GEMM=tc)
  abs=$(replay 0:9 absorbed AR_MLA_PREFILL=absorbed)
  simt=$(replay 0:2 simt-before AR_MLA_PREFILL=simt AR_MLA_GEMM=simt)
  extra=
  for v in ${LAB_AB:-}; do
    # shellcheck disable=SC2046  # the variables, one word each
    extra="$extra $(replay 0:9 "${v%%:*}" $(echo "${v#*:}" | tr , ' '))"
  done
  runs=()
  for r in $extra $tcp $tcg $abs $simt; do runs+=(--run "$r"); done
  for r in $base $extra $tcp $tcg $abs $simt; do marks "$r"; done
  if [ -n "$base" ] && [ ${#runs[@]} -gt 0 ]; then
    python3 -m attnreplay.cli ratios "$DB" --base "$base" "${runs[@]}"
    python3 -m attnreplay.cli ratios "$DB" --base "$base" "${runs[@]}" --parts prefill
  fi
  echo "best=$base"
} >"$OUT/mixed.txt" 2>&1
cat "$OUT/mixed.txt"
best=$(sed -n 's/^best=//p' "$OUT/mixed.txt")

stage "peers"
{
  runs=()
  for a in flashmla flashinfer-mla; do
    t=$(( $(left) - 15 )); [ "$t" -gt 150 ] && t=150
    [ "$t" -lt 30 ] && { echo "$a: no time left"; continue; }
    timeout -s KILL "$t" python3 -m attnreplay.cli replay "$TRACE" --backend "$a" --db "$DB" --layers 1 \
      --verify sample:8 --repeat 3 --steps 0:9 --quiet
    rc=$?; echo "$a: exit $rc"
    [ "$rc" -le 1 ] && runs+=(--run "$(last_run)")
  done
  if [ -n "$best" ] && [ ${#runs[@]} -gt 0 ]; then
    python3 -m attnreplay.cli ratios "$DB" --base "$best" "${runs[@]}"
    python3 -m attnreplay.cli ratios "$DB" --base "$best" "${runs[@]}" --parts attn,combine,prefill
  fi
} >"$OUT/peers.txt" 2>&1
tail -30 "$OUT/peers.txt"
stage "decode-only steps 65-111"
{
  base=$(replay 65:111 default)
  g=$(replay 65:111 tc-gemm AR_MLA_GEMM=tc)
  b=$(replay 65:111 simt-gemm AR_MLA_GEMM=simt)
  runs=()
  for r in $g $b; do runs+=(--run "$r"); done
  for r in $base $g $b; do marks "$r"; done
  if [ -n "$base" ] && [ ${#runs[@]} -gt 0 ]; then
    python3 -m attnreplay.cli ratios "$DB" --base "$base" "${runs[@]}"
    python3 -m attnreplay.cli ratios "$DB" --base "$base" "${runs[@]}" --parts absorb,attn,combine,wuv
  fi
} >"$OUT/decode.txt" 2>&1
cat "$OUT/decode.txt"

stage "done"
