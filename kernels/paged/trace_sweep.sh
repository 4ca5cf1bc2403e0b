#!/usr/bin/env bash
# trace_sweep.sh - one real trace replayed on the "cuda" backend under each setting of its
# environment knobs (kernels/paged/cuda_backend.cu's opening comment), one process per setting,
# every step verified, all into one database; then `attnreplay diff` of each run against the
# first (default) one and the per-step time ratios by step kind (`attnreplay.cli ratios`: median,
# p10, p90 and total of time(setting) / time(default), < 1 faster), then the same by the steps'
# total context (`ratios --by-context`: a lopsided decode step apart from a long even one).
# decode_sweep.sh does the same for one synthetic shape; this is for plans that only real batches
# exercise (the uneven decode split of 133e9c2: one long context among short ones).
#
# Usage (repository root, on the GPU machine, after `make gpu-build`):
#   kernels/paged/trace_sweep.sh DB TRACE ['VAR=V ...' ...]
#   no settings: the built-in ones below; "" is the default (given again last, it measures the
#   run's noise floor: the default against itself).  Environment: AR_BIN (default
#   bin/attnreplay), BACKEND (default cuda), VERIFY (default sample:8), REPEAT (default 3),
#   LAYERS (default 1), STEPS (default all), PER_RUN_S (default none: each replay is sent SIGTERM
#   after that many seconds and keeps its committed steps), PYTHON (default python3).
# Exit 0, or 1 when the default run could not replay the trace (nothing to compare with).
set -u
cd "$(dirname "$0")/../.." || exit 2
DB=${1:?usage: trace_sweep.sh DB TRACE ['VAR=V ...' ...]}
TRACE=${2:?usage: trace_sweep.sh DB TRACE ['VAR=V ...' ...]}
shift 2
AR_BIN=${AR_BIN:-bin/attnreplay}
BACKEND=${BACKEND:-cuda}
PYTHON=${PYTHON:-python3}
export PYTHONPATH=$PWD/replay/python${PYTHONPATH:+:$PYTHONPATH}
export ATTNREPLAY_LIB=${ATTNREPLAY_LIB:-$PWD/build/libattnreplay.so}
if [ $# -gt 0 ]; then
  settings=("$@")
else
  settings=("" "AR_CUDA_SPLIT_PATH_RATIO=off" "AR_CUDA_SPLIT_PATH_RATIO=1" "AR_CUDA_SPLIT_PATH_RATIO=4"
            "AR_CUDA_SPLIT_PATH_LARGE=off" "AR_CUDA_DECODE_TMA_MANY=0" "AR_CUDA_DECODE_TMA_SPLITS=1" "AR_CUDA_DECODE_TMA=uneven"
            "AR_CUDA_DECODE_TMA=split")
fi
common=(--db "$DB" --backend "$BACKEND" --layers "${LAYERS:-1}" --verify "${VERIFY:-sample:8}"
        --repeat "${REPEAT:-3}" --quiet)
[ -n "${STEPS:-}" ] && common+=(--steps "$STEPS")
limit=()
[ -n "${PER_RUN_S:-}" ] && limit=(timeout --preserve-status -s TERM "$PER_RUN_S")
last_run() { "$PYTHON" -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT max(id) FROM runs').fetchone()[0])" "$DB"; }

base=""
runs=()
for setting in "${settings[@]}"; do
  t0=$(date +%s)
  # shellcheck disable=SC2086 # a setting is a list of VAR=V words
  env $setting "${limit[@]}" "$AR_BIN" replay "$TRACE" "${common[@]}"
  rc=$?
  echo "[${setting:-default}]: exit $rc ($(( $(date +%s) - t0 )) s), run $([ "$rc" -le 1 ] || [ "$rc" -eq 143 ] && last_run || echo none)"
  if [ "$rc" -gt 1 ] && [ "$rc" -ne 143 ]; then
    [ -z "$base" ] && { echo "trace_sweep: the first setting did not replay $TRACE: nothing to compare with"; exit 1; }
    continue
  fi
  if [ -z "$base" ]; then base=$(last_run); else runs+=("$(last_run)"); fi
done
[ ${#runs[@]} -eq 0 ] && { echo "trace_sweep: no other setting replayed $TRACE"; exit 0; }
for r in "${runs[@]}"; do
  echo "-- attnreplay diff $DB $base $r"
  "$AR_BIN" diff "$DB" "$base" "$r" --threshold 5% ${PER_RUN_S:+--allow-unfinished} | tail -6
done
rargs=()
for r in "${runs[@]}"; do rargs+=(--run "$r"); done
echo "-- ratios against run $base (the first setting: ${settings[0]:-default})"
"$PYTHON" -m attnreplay.cli ratios "$DB" --base "$base" "${rargs[@]}"
echo "-- the same by the steps' total context"
"$PYTHON" -m attnreplay.cli ratios "$DB" --base "$base" "${rargs[@]}" --by-context
exit 0
