#!/usr/bin/env bash
# gpu_verify_h200.sh - the GPU machine's part of device verification (reference/ref_gpu.cu):
# its tests, its benchmark, and the replay timings of issue 18's traces.  Prebuilt binaries only
# (bin/, build/tests/, out/ carried from the development machine), each stage under its own
# timeout, logs in $OUT, a short table last.  Stages (run several per call, as time allows):
#   tests      build/tests/gpu_verify (device reference vs the C reference at 1e-12, yardstick,
#              verdicts, plan invariance, NaN/guards/cross-check, traces, planted faults)
#              and build/tests/gpu_cuda + gpu_mla_backend (the backends' result path)  ~4 min
#   bench      build/tests/bench_ref_gpu: phases and the FP64 rate on step shapes      ~1 min
#              (the default: fused kernels for requests of few checked rows, GEMMs for many)
#   bench-gemm the same with ATTNREPLAY_GPU_REF_FUSED=0 (the GEMM template for every row)  ~2 min
#   bench-fused the same with ATTNREPLAY_GPU_REF_FUSED=1 (the fused kernels for every row)  ~1 min
#   ds         DeepSeek-V3 on cuda-mla, --verify all, the 41-step trace (target <= 60 s)
#   mc-all     the 1,537-step Mooncake trace, --verify all --layers 1 (target <= 5 min)
#   mc-sample  the same trace, --verify sample:64 --layers 32 (target <= 5 min)
#   mc-off     the same trace, --verify off --layers 1 (the baseline the others add to)
# Prepare on the development machine:
#   make -j2 gpu-build
#   mkdir -p out
#   bin/attnreplay sim --workload mooncake:../shared/traces-public/mooncake-fast25/synthetic_trace.jsonl \
#     --model llama-3.1-8b --num-blocks 32768 --max-num-batched-tokens 8192 --max-num-seqs 256 \
#     --step-time roofline:h200 --limit 300 --out out/mooncake300.trace.jsonl.gz --quiet
#   bin/attnreplay sim --workload synthetic:groups=2,prompts=32,system=1024,question=256,output=32,rate=20 \
#     --model deepseek-v3 --kv-mem 60GiB --step-time roofline:h200 --out out/ds41.trace.jsonl.gz --quiet
# Then on the H200: tests/gpu_verify_h200.sh tests bench ds   (one run), and
#                   tests/gpu_verify_h200.sh mc-all            (one run each for the long ones)
set -u
OUT=${OUT:-/tmp/ar_verify_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export AR_SRC=$PWD AR_BIN=$PWD/bin/attnreplay
SUMMARY="$OUT/summary.txt"
: >>"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

# Replays a trace with the given options into its own database; notes wall time, exit code and
# the lines of the summary that say where the time went.
replay_timed() {
  local name=$1 limit=$2 trace=$3; shift 3
  local db=/tmp/ar_$name.db log="$OUT/$name.txt"
  rm -f "$db" "$db-wal" "$db-shm"
  [ -f "$trace" ] || { note "$name: missing $trace (see the preparation steps at the top)"; return; }
  local t0=$SECONDS
  timeout "$limit" bin/attnreplay replay "$trace" --db "$db" "$@" >"$log" 2>&1
  local rc=$? wall=$((SECONDS - t0))
  note "$name: exit $rc, wall ${wall} s ($*)"
  grep -E "steps |attention|verified on the device|cross-check|kernel|passed|failed|time" "$log" | head -12 | sed 's/^/    /' | tee -a "$SUMMARY"
}

for stage in "$@"; do
  echo "== $stage ($(date -u +%H:%M:%S))"
  case $stage in
    tests)
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/device.txt" 2>&1
      timeout 420 build/tests/gpu_verify >"$OUT/gpu_verify.txt" 2>&1
      note "gpu_verify: exit $?"
      grep -E "PASSED|FAILED|SKIPPED|rows .* ref |cross-checked|fault|groups|ERROR|LINE" "$OUT/gpu_verify.txt" | tail -60
      timeout 240 build/tests/gpu_cuda >"$OUT/gpu_cuda.txt" 2>&1
      note "gpu_cuda: exit $?"
      timeout 300 build/tests/gpu_mla_backend >"$OUT/gpu_mla_backend.txt" 2>&1
      note "gpu_mla_backend: exit $?"
      grep -hE "^\[  (PASSED|FAILED) |ERROR|LINE" "$OUT/gpu_cuda.txt" "$OUT/gpu_mla_backend.txt" | tail -20
      ;;
    bench)
      timeout 240 build/tests/bench_ref_gpu >"$OUT/bench_ref_gpu.txt" 2>&1
      note "bench_ref_gpu: exit $?"
      cat "$OUT/bench_ref_gpu.txt" | tee -a "$SUMMARY"
      ;;
    bench-gemm)
      # the same cases on the GEMM template for every row (A/B baseline, same results)
      ATTNREPLAY_GPU_REF_FUSED=0 timeout 300 build/tests/bench_ref_gpu >"$OUT/bench_ref_gpu_gemm.txt" 2>&1
      note "bench_ref_gpu (ATTNREPLAY_GPU_REF_FUSED=0): exit $?"
      cat "$OUT/bench_ref_gpu_gemm.txt" | tee -a "$SUMMARY"
      ;;
    bench-fused)
      # the same cases on the fused kernels for every row (A/B, same results)
      ATTNREPLAY_GPU_REF_FUSED=1 timeout 300 build/tests/bench_ref_gpu >"$OUT/bench_ref_gpu_fused.txt" 2>&1
      note "bench_ref_gpu (ATTNREPLAY_GPU_REF_FUSED=1): exit $?"
      cat "$OUT/bench_ref_gpu_fused.txt" | tee -a "$SUMMARY"
      ;;
    ds)
      replay_timed ds_all 120 out/ds41.trace.jsonl.gz --backend cuda-mla --verify all
      ;;
    mc-all)
      replay_timed mc_all 560 out/mooncake300.trace.jsonl.gz --backend cuda --verify all --layers 1
      ;;
    mc-sample)
      replay_timed mc_sample 560 out/mooncake300.trace.jsonl.gz --backend cuda --verify sample:64 --layers 32
      ;;
    mc-off)
      replay_timed mc_off 300 out/mooncake300.trace.jsonl.gz --backend cuda --verify off --layers 1
      ;;
    *) note "unknown stage $stage (tests bench bench-gemm bench-fused ds mc-all mc-sample mc-off)" ;;
  esac
done
echo "== summary"
cat "$SUMMARY"
