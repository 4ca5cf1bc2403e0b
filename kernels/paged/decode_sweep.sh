#!/usr/bin/env bash
# decode_sweep.sh - the paged decode benchmark (B 64, context 8192, GQA 32:8, hd 128, bf16,
# block 16: tests/bench_cuda.c's decode_b64_s8192_gqa32_8_hd128) under each setting of the
# "cuda" backend's environment knobs (kernels/paged/cuda_backend.cu's opening comment), one
# process per setting, then a table of the attention time (split combine included), the combine's
# part, effective GB/s, the plan (config 1 DECODE, 3 DECODE_TMA; splits; CTAs) and the ratio to
# the first (default) row.  The default runs first and last, to show the drift over the sweep.
#
# Usage (repository root, after `make`): kernels/paged/decode_sweep.sh ['VAR=V ...' ...]
#   no arguments: the built-in settings below; else each argument is one setting ("" = default).
#   CASE (default decode_b64_s8192_gqa32_8_hd128; also decode_b32_/decode_b48_s8192_gqa32_8_hd128);
#   REPEAT (default 50): bench_cuda's repeats (median); BENCH (default build/tests/bench_cuda);
#   PER_RUN_S (default 15): each run is killed (timeout -s KILL) after this; TOTAL_S (default
#   70): no run starts after this many seconds, so the sweep ends within ~TOTAL_S + PER_RUN_S
#   (85 s; one run takes a few seconds: CUDA start, the 2.1 GB cache filled, REPEAT + 1 steps).
# A run that fails, times out or writes NaN shows its exit code instead of numbers.
set -u
cd "$(dirname "$0")/../.." || exit 2
BENCH=${BENCH:-build/tests/bench_cuda}
REPEAT=${REPEAT:-50}
PER_RUN_S=${PER_RUN_S:-15}
TOTAL_S=${TOTAL_S:-70}
CASE=${CASE:-decode_b64_s8192_gqa32_8_hd128}
[ -x "$BENCH" ] || { echo "decode_sweep: $BENCH not built (make first)" >&2; exit 2; }

if [ $# -gt 0 ]; then
  settings=("$@")
else
  settings=(
    ""
    "AR_CUDA_DECODE_TMA=rule"
    "AR_CUDA_DECODE_TMA=rule AR_CUDA_SPLIT_LIVE_ROWS=1"
    "AR_CUDA_DECODE_SPLITS=1"
    "AR_CUDA_DECODE_SPLITS=2"
    "AR_CUDA_DECODE_SPLITS=4"
    "AR_CUDA_DECODE_SPLITS=6"
    "AR_CUDA_DECODE_TMA=rule AR_CUDA_DECODE_SPLITS=4 AR_CUDA_SPLIT_LIVE_ROWS=1"
    "AR_CUDA_DECODE_TMA=split"
    "AR_CUDA_DECODE_TMA=split AR_CUDA_DECODE_TMA_SPLITS=1"
    "AR_CUDA_DECODE_TMA=split AR_CUDA_DECODE_TMA_SPLITS=3"
    "AR_CUDA_DECODE_TMA=split AR_CUDA_DECODE_TMA_SPLITS=4"
    "AR_CUDA_DECODE_TMA=split AR_CUDA_DECODE_TMA_STAGES=2"
    "AR_CUDA_DECODE_TMA=split AR_CUDA_DECODE_TMA_STAGES=1"
    "AR_CUDA_DECODE_TMA=split AR_CUDA_SPLIT_LIVE_ROWS=1"
    ""
  )
fi

start=$SECONDS
rows=()
base_us=""
device=""
for setting in "${settings[@]}"; do
  label=${setting:-default}
  if [ $((SECONDS - start)) -ge "$TOTAL_S" ]; then
    rows+=("$label|-|-|-|-|-|-|not run: past ${TOTAL_S} s")
    continue
  fi
  # shellcheck disable=SC2086  # the setting is a list of VAR=V words
  out=$(env $setting timeout -s KILL "$PER_RUN_S" "$BENCH" "$REPEAT" "$CASE" 2>&1)
  rc=$?
  line=$(printf '%s\n' "$out" | grep "^RESULT name=$CASE " | head -1)
  if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
    why=$(printf '%s\n' "$out" | grep -E "^(SKIP|ERROR)" | head -1)
    rows+=("$label|-|-|-|-|-|-|rc $rc${why:+: $why}")
    continue
  fi
  field() { printf '%s\n' "$line" | sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
  us=$(field us); comb=$(field combine_us); gbps=$(field gbps)
  [ -z "$base_us" ] && base_us=$us
  device=$(printf '%s\n' "$line" | sed -n 's/.*device="\([^"]*\)".*/\1/p')
  ratio=$(awk -v b="$base_us" -v u="$us" 'BEGIN { printf "%.3f", b / u }')
  rows+=("$label|$us|$comb|$gbps|$(field config)|$(field splits)|$(field work)|$ratio")
done

printf '%s, REPEAT %s, %s\n' "$CASE" "$REPEAT" "${device:-no device}"
printf '%-58s %9s %8s %8s %6s %6s %6s %s\n' setting us comb_us GB/s config splits CTAs "speed vs first"
for r in "${rows[@]}"; do
  IFS='|' read -r l u c g cf sp w x <<<"$r"
  printf '%-58s %9s %8s %8s %6s %6s %6s %s\n' "$l" "$u" "$c" "$g" "$cf" "$sp" "$w" "$x"
done
echo "sweep took $((SECONDS - start)) s"
