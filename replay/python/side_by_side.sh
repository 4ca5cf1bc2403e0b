#!/usr/bin/env bash
# side_by_side.sh - each backend on real traces, on a CUDA machine (README "Bring your own kernel").
#
#   replay/python/side_by_side.sh DB TRACE [TRACE ...]
#
# For every trace: replays it through our cuda backend, the example CUDA plugin, and each Python
# adapter that can run here (torch-fa2, torch-cudnn, flex, flashinfer, fa3), every step verified
# (VERIFY, default sample:8: each step's sampled rows plus each request's last row against the
# float64 reference), all into DB; then `attnreplay diff` of each run against the cuda run, and
# `attnreplay-py ratios` (per-step median / p90 time ratios by step kind, then by kind and the
# steps' total context).  A backend that
# cannot run here (flashinfer not importable, say) is reported and skipped; a failing step
# shows in diff and in the run's status.
#
# Environment: AR_BIN (default bin/attnreplay), BUILD (default build), LAYERS (default 1),
# VERIFY (default sample:8), REPEAT (default 3), STEPS (default all, e.g. 0:600), ADAPTERS
# (default "torch-fa2 torch-cudnn flex flashinfer fa3"), PYTHON (default python3), BASE_BACKEND
# (default cuda), PLUGIN (default $BUILD/plugins/attnreplay-example-cuda.so, "none" leaves it out;
# on a machine without a GPU, BASE_BACKEND=cpu PLUGIN=$BUILD/plugins/attnreplay-example-cpu.so
# ADAPTERS=numpy runs the same script) and PER_RUN_S (default none: each backend's replay is sent
# SIGTERM after that many seconds; it ends `interrupted` with exit 143 and its committed steps
# whole, and those steps still enter the diff and the ratios, the run's status saying so) and
# PARTS (timed marks, e.g. attn,combine: the ratios again with each step timed by those marks
# alone, `ratios --parts`; default attn,combine,prefill with BASE_BACKEND=cuda-mla, else none)
# and CASCADE (auto, on or off: every replay's --cascade, default the replay's own, auto; a
# backend without cascade runs a cascade step flat, as vLLM runs FA3, so with CASCADE=on a
# shared-prefix trace compares our cascade step with each peer's step as it would run).
# AR_PEERS_BUILT (default .peers/built, where kernels/peers/build_peers.sh leaves its build) is
# where the fa3 and flashmla adapters find FlashAttention 3 and FlashMLA when they are not
# importable (the script prints the folder first).  FlashInfer that is not importable is taken
# from kernels/peers/'s build where one is carried (.whl's wheels and $AR_PEERS_BUILT/flashinfer;
# JIT off).
# Exit status: 0, or 1 when the base backend could not replay one of the traces (that trace is
# skipped: the others have nothing to be compared with).
set -u
DB=${1:?usage: side_by_side.sh DB TRACE [TRACE ...]}
shift
AR_BIN=${AR_BIN:-bin/attnreplay}
BUILD=${BUILD:-build}
LAYERS=${LAYERS:-1}
VERIFY=${VERIFY:-sample:8}
REPEAT=${REPEAT:-3}
STEPS=${STEPS:-}
ADAPTERS=${ADAPTERS:-torch-fa2 torch-cudnn flex flashinfer fa3}
PYTHON=${PYTHON:-python3}
BASE_BACKEND=${BASE_BACKEND:-cuda}
PLUGIN=${PLUGIN:-$BUILD/plugins/attnreplay-example-cuda.so}
export ATTNREPLAY_LIB=${ATTNREPLAY_LIB:-$PWD/$BUILD/libattnreplay.so}
export PYTHONPATH=$PWD/replay/python${PYTHONPATH:+:$PYTHONPATH}
PER_RUN_S=${PER_RUN_S:-}
export AR_PEERS_BUILT=${AR_PEERS_BUILT:-$PWD/.peers/built}
echo "peers: AR_PEERS_BUILT=$AR_PEERS_BUILT$([ -d "$AR_PEERS_BUILT" ] || echo ' (not a folder: only importable peers run)')"
CASCADE=${CASCADE:-}
# cuda-mla's step holds the absorption (q_nope W_UK) and W_UV products and the cache write, which
# an MLA adapter's host does untimed: its ratios are shown again on the attention marks alone
if [ "$BASE_BACKEND" = cuda-mla ]; then PARTS=${PARTS-attn,combine,prefill}; else PARTS=${PARTS-}; fi
limit=()
[ -n "$PER_RUN_S" ] && limit=(timeout --preserve-status -s TERM "$PER_RUN_S")
common=(--db "$DB" --layers "$LAYERS" --verify "$VERIFY" --repeat "$REPEAT" --quiet)
[ -n "$STEPS" ] && common+=(--steps "$STEPS")
[ -n "$CASCADE" ] && common+=(--cascade "$CASCADE")

# FlashInfer as kernels/peers/ carries it (its wheels in .whl, its modules compiled ahead of time in
# $AR_PEERS_BUILT/flashinfer by build_flashinfer_offline.sh), where it is not importable already:
# installed by kernels/peers/install_flashinfer.sh (which prints the path) and run with its JIT
# off, as native_peers.sh runs it, so a module the build lacks fails that adapter's replay (exit 2,
# the reason printed) instead of compiling for minutes inside PER_RUN_S
case " $ADAPTERS " in *" flashinfer"*)
  fi_built=$AR_PEERS_BUILT/flashinfer
  if ! "$PYTHON" -c "import flashinfer" 2>/dev/null && [ -d "$fi_built/flashinfer_jit_cache" ]; then
    if fi_path=$(bash kernels/peers/install_flashinfer.sh "$fi_built" 2>/dev/null); then
      export PYTHONPATH=$fi_path FLASHINFER_DISABLE_JIT=1
      echo "flashinfer: the carried wheels and the modules in $fi_built, JIT off (PYTHONPATH $fi_path)"
    else
      echo "flashinfer: $fi_built has modules but installing .whl's wheels failed (kernels/peers/install_flashinfer.sh)"
    fi
  fi;;
esac

# a finished run (0 passed, 1 a step failed) or an interrupted one (143) has steps to compare
comparable() { [ "$1" -le 1 ] || [ "$1" -eq 143 ]; }
last_run() { "$PYTHON" -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT max(id) FROM runs').fetchone()[0])" "$DB"; }

status=0
for trace in "$@"; do
  echo "== $trace"
  "$AR_BIN" info "$trace" | head -12
  t0=$(date +%s)
  "${limit[@]}" "$AR_BIN" replay "$trace" --backend "$BASE_BACKEND" "${common[@]}"
  rc=$?; echo "$BASE_BACKEND: exit $rc ($(( $(date +%s) - t0 )) s)"
  if ! comparable $rc; then   # no base run of this trace: nothing to compare with (not an older run)
    echo "$BASE_BACKEND did not replay $trace: nothing to compare the others with; next trace"
    status=1
    continue
  fi
  base=$(last_run)
  runs=()
  if [ "$PLUGIN" != none ]; then
    t0=$(date +%s)
    "${limit[@]}" "$AR_BIN" replay "$trace" --backend "plugin:$PLUGIN" "${common[@]}"
    rc=$?; echo "plugin:$PLUGIN: exit $rc ($(( $(date +%s) - t0 )) s)"
    comparable $rc && runs+=("$(last_run)")
  fi
  for a in $ADAPTERS; do
    t0=$(date +%s)
    "${limit[@]}" "$PYTHON" -m attnreplay.cli replay "$trace" --backend "$a" "${common[@]}"
    rc=$?; echo "$a: exit $rc ($(( $(date +%s) - t0 )) s)"
    comparable $rc && runs+=("$(last_run)")
  done
  if [ ${#runs[@]} -eq 0 ]; then
    echo "no other backend replayed $trace: nothing to compare"
    continue
  fi
  for r in "${runs[@]}"; do
    echo "-- attnreplay diff $DB $base $r"
    "$AR_BIN" diff "$DB" "$base" "$r" --threshold 5% ${PER_RUN_S:+--allow-unfinished} | tail -15
  done
  echo "-- ratios against run $base ($BASE_BACKEND)"
  rargs=()
  for r in "${runs[@]}"; do rargs+=(--run "$r"); done
  "$PYTHON" -m attnreplay.cli ratios "$DB" --base "$base" "${rargs[@]}"
  echo "-- ratios against run $base ($BASE_BACKEND) by the steps' total context"
  "$PYTHON" -m attnreplay.cli ratios "$DB" --base "$base" "${rargs[@]}" --by-context
  if [ -n "$PARTS" ]; then
    echo "-- ratios against run $base ($BASE_BACKEND), the marks $PARTS alone"
    "$PYTHON" -m attnreplay.cli ratios "$DB" --base "$base" "${rargs[@]}" --parts "$PARTS"
  fi
done
exit $status
