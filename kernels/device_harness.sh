#!/usr/bin/env bash
# device_harness.sh - the ONE script for the GPU machine (H200): checks the prebuilt binaries
# start, then times and checks the CUDA backend in a single run and prints a short table
# last.  Build everything first on the development machine (`make gpu-build`), then run this
# there with the build outputs carried (bin, build/tests).  Stages, each under its own timeout:
#   1. nvidia-smi + `attnreplay backends` (the binary starts; the cuda backend sees the GPU)
#   2. tests/bench_cuda.c  (our kernel: decode GB/s, prefill TFLOP/s)       -> bench.txt
#   2b. cascade: tests/bench_cascade.c (cascade vs flat), tests/gpu_cascade.c, a prefix trace
#       replayed with --cascade on -> cascade_bench.txt, cascade_test.txt, cascade_replay.txt
#   3. kernels/peers/peer_attention.py (cuDNN SDPA, flex+PagedAttention, FA2; the cascade
#      shapes' prefix-pass math and flat decode, the GEMM rate) -> peers.txt; then FA3,
#      FlashMLA and FlashInfer (kernels/peers/fa3_peer.py, flashmla_peer.py, flashinfer_peer.py)
#      when .peers/built has them
#   4. make test-gpu (tests/gpu_cuda.c: vLLM grids vs the float64 reference) -> gpu_test.txt
#   5. attnreplay replay of the sample traces with --backend cuda into SQLite -> replay.txt
#   6. ncu (--clock-control none) on the prefill kernel, if time is left     -> ncu.txt
#   7. tests/bench_replay.c, if time is left (whole simulated traces end to end: wall, kernel,
#      verify, host overhead and its breakdown)                                -> replay_bench.txt
# `device_harness.sh replay-bench` runs stage 7 alone, with the whole budget (HARNESS_BUDGET):
# issue 18's four runs (BENCH_REPLAY_ONLY picks some; each stops at its target or at
# BENCH_REPLAY_MAX_S, default budget / 4).  Its traces come from out/ when simulated there on the
# development machine (mooncake300.trace.jsonl.gz, dsv3.trace.jsonl.gz; see bench_replay.c).
# `device_harness.sh mla` runs the MLA stages instead (tests, GPU mutants, the peers' build, the MLA
# lab with the peers; its comment below says what), with a budget of 570 s; `device_harness.sh
# power` the tests and the power and clock trace of the MLA decode kernels, and `device_harness.sh
# mla-ncu` Nsight Compute on ours and FlashMLA's at 128 heads, `device_harness.sh real-traces` the
# tests and the Mooncake trace under the decode split settings and against FA3's adapter (their
# comments below).
# Logs go to $OUT (the device tool brings them back); the table goes to stdout and summary.txt.
set -u
OUT=${OUT:-/tmp/ar_harness_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 2
export AR_SRC=$PWD AR_BIN=$PWD/bin/attnreplay PYTHONUNBUFFERED=1
BUDGET=${HARNESS_BUDGET:-$([ "${1:-}" = mla ] && echo 570 || echo 450)}
# The device tool brings back at most 8 files from $OUT, 2 folders down: pack_out keeps the logs
# named in its arguments and the peers' build archive (moved to the top) as they are and packs
# everything else under $OUT (databases, per-mutant logs, the lab's tables) into logs.tar.xz.
pack_out() {
  local keep=() f
  for f in "$OUT"/peers/peers-built.tar.xz*; do [ -f "$f" ] && mv "$f" "$OUT/" && keep+=("${f##*/}"); done
  for f in "$@"; do [ -f "$OUT/$f" ] && keep+=("$f"); done
  local ex=(--exclude=./logs.tar.xz) spare=(! -name logs.tar.xz) k
  for k in "${keep[@]}"; do ex+=(--exclude="./$k"); spare+=(! -name "$k"); done
  ( cd "$OUT" && tar cf - "${ex[@]}" . | xz -T0 -1 >/tmp/ar_logs.tar.xz &&
      find . -mindepth 1 -maxdepth 1 "${spare[@]}" -exec rm -rf {} + && mv /tmp/ar_logs.tar.xz logs.tar.xz )
  echo "back from \$OUT: ${keep[*]} logs.tar.xz"
}
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
stage() { echo "== $1 ($(date -u +%H:%M:%S), $(left)s left)"; }
replay_bench() {
  stage "replay bench"
  local t=$(( $(left) - 15 )); [ "$t" -lt 60 ] && t=60
  BENCH_REPLAY_TRACES=$PWD/out BENCH_REPLAY_MAX_S=${BENCH_REPLAY_MAX_S:-$(( t / 4 ))} \
    timeout "$t" build/tests/bench_replay >"$OUT/replay_bench.txt" 2>&1
  echo "bench_replay rc=$?"; grep -v "^RESULT" "$OUT/replay_bench.txt" | tail -16
}
if [ "${1:-}" = "replay-bench" ]; then
  replay_bench
  pack_out replay_bench.txt
  exit 0
fi
# `device_harness.sh power`: the clocks and power of our 128-head MLA decode kernel and FlashMLA's
# under back-to-back launches (BENCHMARKS.md "Why the 128-head MLA kernel misses, measured": both
# at the power cap, at the same clocks): `make test-gpu`, then
# kernels/peers/power_trace.py over bench_mla at h_q 128 / 32k keys (back to back alone, then one
# launch at a time and back to back) and FlashMLA on its own inputs and on ours, each for a few
# seconds (POWER_SAMPLES samples, default 1000): power.txt holds the clocks, watts and limiting
# reasons per command, power_samples.csv nvidia-smi's samples.  Needs .peers/built/flashmla.
# POWER_TESTS=0 leaves out `make test-gpu`.
if [ "${1:-}" = "power" ]; then
  stage "device"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv | tee "$OUT/device.txt"
  cat build/code-rev.txt 2>/dev/null
  if [ "${POWER_TESTS:-1}" != 0 ]; then
    stage "test-gpu"
    timeout -s KILL "$(( $(left) > 300 ? 220 : $(left) / 2 ))" make --no-print-directory test-gpu \
      >"$OUT/test-gpu.txt" 2>&1
    echo "test-gpu rc=$?"; grep -E "passed, [0-9]+ failed|FAILED|\[  ERROR" "$OUT/test-gpu.txt" | tail -12
  fi
  stage "power"
  n=${POWER_SAMPLES:-1000}
  AR_PEERS_BUILT=${AR_PEERS_BUILT:-$PWD/.peers/built} timeout -s KILL "$(( $(left) - 5 ))" \
    python3 kernels/peers/power_trace.py --csv "$OUT/power_samples.csv" \
    "ours-b2b=AR_MLA_BENCH_REPEAT=$n AR_MLA_BENCH_TIMING=b2b build/tests/bench_mla --only 128 32768" \
    "ours-single-then-b2b=AR_MLA_BENCH_REPEAT=$n build/tests/bench_mla --only 128 32768" \
    "flashmla-randn=AR_PEER_ITERS=$n python3 kernels/peers/flashmla_peer.py --h 128 --sk 32768" \
    "flashmla-test-inputs=AR_PEER_ITERS=$n python3 kernels/peers/flashmla_peer.py --h 128 --sk 32768 --data test" \
    >"$OUT/power.txt" 2>&1
  echo "power_trace rc=$?"; grep -E "^RESULT|^PEER|^\|" "$OUT/power.txt" | cut -c1-200
  pack_out test-gpu.txt power.txt power_samples.csv
  exit 0
fi
# `device_harness.sh real-traces`: `make test-gpu`, gpu_cuda's cases under
# AR_CUDA_DECODE_TMA=uneven (uneven-gpu_cuda.txt), and gpu_cuda's and gpu_cascade's under a
# combine team of 4 (team-tests.txt; REAL_TESTS=0 leaves these out); bench_cuda's two lopsided decode
# cases, its B 64 decode (2 pieces a request) and its B 128 with one long request, each under the
# default plan (the combine team's rule), with one combine thread (AR_CUDA_COMBINE_TEAM=1) and
# under AR_CUDA_COMBINE_TEAM=fill, twice each in turn (decode_bench.txt); then the
# Mooncake trace (out/mooncake300.trace.jsonl.gz, simulated on the development machine as in
# tests/gpu_verify_h200.sh's comment, and carried) through kernels/paged/trace_sweep.sh under the
# default plan, DECODE for the many-request uneven decodes (AR_CUDA_DECODE_TMA_MANY=0), the
# split combine with one thread, with teams of 8 everywhere and under fill, and the default
# again last: the run's own noise floor (the same binary replayed twice in one run read 0.976
# and 1.006 on the trace's decodes under 16k keys, H100, 2026-12-07) (sweep.txt), and
# replay/python/side_by_side.sh with FA3's adapter (fa3.txt), both sides' repeats back to back
# (REPEAT=3), every step verified; both databases (xz) in logs.tar.xz.  Needs .peers/built/fa3
# for the last part.
if [ "${1:-}" = "real-traces" ]; then
  trace=${REAL_TRACE:-out/mooncake300.trace.jsonl.gz}
  [ -f "$trace" ] || { echo "real-traces: $trace missing (simulate it here first and carry out/)"; exit 2; }
  if [ "${REAL_TESTS:-1}" != 0 ]; then
    stage "test-gpu"
    timeout -s KILL 230 make --no-print-directory test-gpu >"$OUT/test-gpu.txt" 2>&1
    echo "test-gpu rc=$?"; grep -E "passed, [0-9]+ failed|FAILED|\[  ERROR" "$OUT/test-gpu.txt" | tail -12
    stage "gpu_cuda under AR_CUDA_DECODE_TMA=uneven"
    AR_CUDA_DECODE_TMA=uneven timeout -s KILL 90 build/tests/gpu_cuda >"$OUT/uneven-gpu_cuda.txt" 2>&1
    echo "gpu_cuda (=uneven) rc=$?"; grep -E "PASSED|FAILED|\[  ERROR" "$OUT/uneven-gpu_cuda.txt" | tail -6
    stage "gpu_cuda and gpu_cascade under AR_CUDA_COMBINE_TEAM=4"
    for t in gpu_cuda gpu_cascade; do
      AR_CUDA_COMBINE_TEAM=4 timeout -s KILL 90 build/tests/$t; echo "$t (team 4) rc=$?"
    done >"$OUT/team-tests.txt" 2>&1
    grep -E "rc=|PASSED|FAILED|\[  ERROR" "$OUT/team-tests.txt" | tail -8
  fi
  stage "decode benches"
  for round in 1 2; do
    for team in 1 "" fill; do
      for c in decode_lopsided_b121_s2048_135k decode_lopsided_b18_s1280_135k decode_b64_s8192_gqa32_8_hd128 \
               decode_b128_s8192_one16k; do
        AR_CUDA_COMBINE_TEAM=$team timeout -s KILL 60 build/tests/bench_cuda 20 "$c" |
          sed "s/^RESULT/RESULT combine=${team:-rule}/"
      done
    done
  done >"$OUT/decode_bench.txt" 2>&1
  grep RESULT "$OUT/decode_bench.txt" | cut -c1-170
  stage "trace sweep"
  rm -f /tmp/ar_sweep.db /tmp/ar_fa3.db
  PER_RUN_S=60 timeout -s KILL "$(( $(left) / 2 ))" kernels/paged/trace_sweep.sh /tmp/ar_sweep.db "$trace" \
    "" "AR_CUDA_DECODE_TMA_MANY=0" "AR_CUDA_COMBINE_TEAM=1" "AR_CUDA_COMBINE_TEAM=8" "AR_CUDA_COMBINE_TEAM=fill" "" \
    >"$OUT/sweep.txt" 2>&1
  echo "trace_sweep rc=$?"; grep -E "^\[|^\|" "$OUT/sweep.txt" | cut -c1-160
  stage "FA3 on the trace"
  AR_PEERS_BUILT=${AR_PEERS_BUILT:-$PWD/.peers/built} ADAPTERS=fa3 PLUGIN=none REPEAT=3 PER_RUN_S=100 \
    timeout -s KILL "$(( $(left) - 20 ))" replay/python/side_by_side.sh /tmp/ar_fa3.db "$trace" >"$OUT/fa3.txt" 2>&1
  echo "side_by_side rc=$?"; grep -E "exit|^\| [0-9]" "$OUT/fa3.txt" | cut -c1-160
  for db in /tmp/ar_sweep.db /tmp/ar_fa3.db; do [ -f "$db" ] && xz -T0 -1 -c "$db" >"$OUT/${db##*/}.xz"; done
  pack_out test-gpu.txt uneven-gpu_cuda.txt team-tests.txt decode_bench.txt sweep.txt fa3.txt
  exit 0
fi
# `device_harness.sh mla-ncu`: Nsight Compute (--clock-control none, so at the clocks the card
# chooses) on our 128-head MLA decode kernel and on FlashMLA's, b = 128, at each of MLA_NCU_SK
# (default 4096 32768) keys: one launch each after three, with the throughput, compute,
# instruction, warp-state and launch sections and the warp instructions and cycles, so that the
# two kernels' instructions, stalls and pipe use for the same work stand side by side; FlashMLA's
# combine kernel too.  ncu_mla.txt.  Needs .peers/built/flashmla.  MLA_NCU_STALLS=1 profiles the
# two main kernels alone (no combine) with the warp-stall reasons and the stall samples per SASS
# instruction instead: ncu_mla.txt gets the stall ratios, ncu_<ours|flashmla>_<s_k>_sass.csv the
# source page (`ncu -i report --page source --print-source sass --csv`; in logs.tar.xz).
if [ "${1:-}" = "mla-ncu" ]; then
  stage "ncu"
  sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats
            --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis
            --metrics smsp__inst_executed.sum,sm__cycles_elapsed.avg,smsp__cycles_active.avg)
  peer_kernels=("flash_fwd_splitkv_mla|combine" 6 2)
  if [ "${MLA_NCU_STALLS:-0}" = 1 ]; then
    sections=(--section WarpStateStats --section SourceCounters --import-source yes
              --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__cycles_elapsed.avg")
    peer_kernels=("flash_fwd_splitkv_mla" 3 1)
  fi
  for sk in ${MLA_NCU_SK:-4096 32768}; do
    [ "$(left)" -lt 40 ] && { echo "ncu: out of time before s_k $sk"; break; }
    echo "=== ours h_q 128 s_k $sk" >>"$OUT/ncu_mla.txt"
    AR_MLA_BENCH_REPEAT=3 timeout -s KILL 90 ncu --clock-control none -k regex:attn_wgmma_pairs -s 3 -c 1 \
      "${sections[@]}" -o "/tmp/ncu_ours_$sk" -f build/tests/bench_mla --only 128 "$sk" >>"$OUT/ncu_mla.txt" 2>&1
    echo "ncu ours s_k $sk rc=$?"
    echo "=== FlashMLA h_q 128 s_k $sk" >>"$OUT/ncu_mla.txt"
    AR_PEER_ITERS=3 AR_PEERS_BUILT=${AR_PEERS_BUILT:-$PWD/.peers/built} timeout -s KILL 120 ncu --clock-control none \
      -k regex:"${peer_kernels[0]}" -s "${peer_kernels[1]}" -c "${peer_kernels[2]}" "${sections[@]}" \
      -o "/tmp/ncu_flashmla_$sk" -f python3 kernels/peers/flashmla_peer.py --h 128 --sk "$sk" --data test \
      >>"$OUT/ncu_mla.txt" 2>&1
    echo "ncu FlashMLA s_k $sk rc=$?"
    for who in ours flashmla; do
      [ -f "/tmp/ncu_${who}_$sk.ncu-rep" ] || continue
      echo "=== report $who s_k $sk" >>"$OUT/ncu_mla.txt"
      ncu -i "/tmp/ncu_${who}_$sk.ncu-rep" --print-details all >>"$OUT/ncu_mla.txt" 2>&1
      [ "${MLA_NCU_STALLS:-0}" = 1 ] && timeout 60 ncu -i "/tmp/ncu_${who}_$sk.ncu-rep" --page source \
        --print-source sass --csv >"$OUT/ncu_${who}_${sk}_sass.csv" 2>&1
    done
  done
  grep -E "^===|^  [a-z_]+.*\(|Duration|Executed Instructions  |Registers Per|smsp__inst_executed.sum|sm__cycles_elapsed.avg|Issue Slots Busy|Compute \(SM\) Throughput" \
    "$OUT/ncu_mla.txt" | cut -c1-150 | head -80
  pack_out ncu_mla.txt
  exit 0
fi
# `device_harness.sh mla`: the MLA work of one run, with `make gpu-carry`'s archive unpacked
# (and .peers/src, .whl carried for the peers): kernels/peers/build_peers.sh in the background
# (logs and peers-built.tar.xz in $OUT/peers; with .peers/built carried it compiles only what is
# missing there, FlashInfer's modules; PEERS_BUILD=0 skips it and installs FlashInfer's carried
# wheels alone) beside `make test-gpu` and `make mutate-gpu` (when the archive held GPU mutants), then
# kernels/lab/mla_prefill_ab.sh with FlashMLA and FlashInfer's MLA wrapper beside the default in
# the time left (its gpu_mla_backend stage left to make test-gpu), after Nsight Compute on the
# prefill attention of one mixed step (ncu_prefill.txt; LAB_AB's variants, as the lab takes them,
# each in ncu_prefill_LABEL.txt and in the lab's stage 2).  On the H200 on 2026-12-06 the first
# three took 315 s (FA3's part of the peers build was cut at 300 s with ten compile jobs beside
# the tests; a second build_peers.sh on the still-warm machine finished it in 123 s).
if [ "${1:-}" = "mla" ]; then
  stage "device"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/device.txt"
  cat build/code-rev.txt 2>/dev/null
  pb=
  if [ "${PEERS_BUILD:-1}" != 0 ]; then
    ( export OUT=$OUT/peers FA3_JOBS=${FA3_JOBS:-12} MLA_JOBS=${MLA_JOBS:-2} FI_JOBS=${FI_JOBS:-2} \
        FA3_TIMEOUT=${FA3_TIMEOUT:-330} MLA_TIMEOUT=${MLA_TIMEOUT:-300} FI_TIMEOUT=${FI_TIMEOUT:-330}
      nice -n 5 bash kernels/peers/build_peers.sh ) >"$OUT/build_peers.txt" 2>&1 &
    pb=$!
  fi
  stage "test-gpu"
  timeout -s KILL "$(( $(left) > 240 ? 210 : $(left) / 2 ))" make --no-print-directory test-gpu \
    >"$OUT/test-gpu.txt" 2>&1
  echo "test-gpu rc=$?"; grep -E "passed, [0-9]+ failed|FAILED|\[  ERROR" "$OUT/test-gpu.txt" | tail -12
  if ls build/mutants/gpu-mutants.tar.xz >/dev/null 2>&1; then
    stage "mutate-gpu"
    MUTANT_OUT=$OUT/mut timeout -s KILL 120 make --no-print-directory mutate-gpu >"$OUT/mut.txt" 2>&1
    echo "mutate-gpu rc=$?"; grep -E "mutation score|survived|error" "$OUT/mut.txt" | tail -8
  fi
  if [ -n "$pb" ]; then
    stage "peers build (waiting)"
    wait "$pb"; grep -E "^BUILD|rc=" "$OUT/build_peers.txt" | tail -6
  fi
  # FlashInfer's Python package from the carried wheels, for the MLA lab below (installed again, a
  # few seconds, where build_peers.sh installed it; the path comes from the installer)
  fi_path=$(bash kernels/peers/install_flashinfer.sh "$PWD/.peers/built/flashinfer" 2>"$OUT/flashinfer_install.txt")
  echo "FlashInfer wheels: rc=$? (PYTHONPATH ${fi_path:-unchanged})"
  # the prefill attention under Nsight Compute: step 3 of the lab's trace (two ~4,096-token
  # prefills, 1.372 TFLOP of causal attention), one launch
  if command -v ncu >/dev/null 2>&1; then
    stage "ncu"
    nt=/tmp/ar_ncu_dsv3.trace.jsonl.gz
    bin/attnreplay sim --workload synthetic:n=128,input=4096,output=48 --model deepseek-v3 --block-size 64 \
      --max-num-batched-tokens 8192 --step-time roofline:h200 --quiet --out "$nt" 2>/dev/null &&
      for v in default ${LAB_AB:-}; do   # the default, then each of the lab's variants (below)
        f=$OUT/ncu_prefill.txt
        [ "$v" = default ] || f=$OUT/ncu_prefill_${v%%:*}.txt
        # shellcheck disable=SC2046  # the variables, one word each
        env $([ "$v" = default ] || echo "${v#*:}" | tr , ' ') \
          timeout -s KILL 60 ncu --clock-control none -k regex:prefill_attn -c 1 --section SpeedOfLight \
          --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
          bin/attnreplay replay "$nt" --backend cuda-mla --layers 1 --steps 3:3 --verify off --repeat 1 \
          --db /tmp/ar_ncu.db >"$f" 2>&1
        echo "ncu $v rc=$?"; grep -E "prefill_attn|Duration|Compute \(SM\) Throughput|Registers Per" "$f" | head -6
      done
  fi
  stage "MLA lab"
  AR_PEERS_BUILT=$PWD/.peers/built \
    PYTHONPATH=${fi_path:-${PYTHONPATH:-}} \
    OUT=$OUT/lab LAB_GPU_MLA=0 LAB_BUDGET=$(( $(left) - 10 )) timeout -s KILL "$(left)" \
    kernels/lab/mla_prefill_ab.sh >"$OUT/lab.txt" 2>&1
  grep -E "^\| [0-9]+ \||^best=|exit [0-9]|^== " "$OUT/lab.txt" | tail -40
  pack_out test-gpu.txt mut.txt build_peers.txt ncu_prefill.txt lab.txt
  exit 0
fi

stage "device"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv;
  bin/attnreplay version; bin/attnreplay backends; } >"$OUT/device.txt" 2>&1
cat "$OUT/device.txt"

stage "bench"
timeout 100 build/tests/bench_cuda 20 >"$OUT/bench.txt" 2>&1
echo "bench rc=$?"; cat "$OUT/bench.txt"

stage "cascade"
# issue 5: cascade vs flat on 128-request decode batches sharing a prefix (table last), the
# cascade GPU tests, and a prefix-sharing sample trace replayed with --cascade on
timeout 60 build/tests/bench_cascade 20 >"$OUT/cascade_bench.txt" 2>&1
echo "bench_cascade rc=$?"; grep -v "^RESULT" "$OUT/cascade_bench.txt" | tail -12
timeout 120 build/tests/gpu_cascade >"$OUT/cascade_test.txt" 2>&1
echo "gpu_cascade rc=$?"; grep -E "FAIL|PASSED|FAILED|SKIPPED|failed|fault " "$OUT/cascade_test.txt" | tail -20
CDB=/tmp/ar_cascade.db
rm -f "$CDB" "$CDB-wal" "$CDB-shm"
timeout 30 bin/attnreplay replay traces/samples/prefix.trace.jsonl.gz --backend cuda --db "$CDB" --cascade on \
  --repeat 3 >"$OUT/cascade_replay.txt" 2>&1
echo "cascade replay rc=$?" | tee -a "$OUT/cascade_replay.txt"
python3 - "$CDB" >>"$OUT/cascade_replay.txt" 2>&1 <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
try:
    print("steps(n, cascade, passed, avg prefix_len)", db.execute(
        "select count(*), sum(cascade), sum(pass), avg(prefix_len) from steps").fetchone())
    for r in db.execute("select name, count(*), round(avg(time_us),2) from kernels group by name"):
        print("kernel", r)
except Exception as e:
    print("cascade db query failed:", e)
PY
tail -8 "$OUT/cascade_replay.txt"

stage "peers"
timeout 200 python3 kernels/peers/peer_attention.py >"$OUT/peers.txt" 2>"$OUT/peers_err.txt"
echo "peers rc=$?"; cat "$OUT/peers.txt"; tail -5 "$OUT/peers_err.txt"
# FlashAttention 3, FlashMLA and FlashInfer as built by kernels/peers/build_peers.sh into
# .peers/built (carried in, or built earlier on this machine): their PEER lines join peers.txt, so
# the summary puts them beside ours, then the target table.  HARNESS_NATIVE_PEERS=0 leaves them out.
if [ "${HARNESS_NATIVE_PEERS:-1}" != 0 ]; then
  OUT="$OUT" bash kernels/peers/native_peers.sh
fi

stage "test-gpu"
t=$(( $(left) - 80 )); [ "$t" -lt 30 ] && t=30
# gpu_cascade ran in the cascade stage
timeout "$t" make -s test-gpu GPU_TESTS="$(ls build/tests/gpu_* | grep -v -e '\.d$' -e gpu_cascade | tr '\n' ' ')" \
  >"$OUT/gpu_test.txt" 2>&1
echo "test-gpu rc=$?"; grep -E "FAIL|PASSED|FAILED|SKIPPED|passed|fail" "$OUT/gpu_test.txt" | tail -25

stage "replay"
: >"$OUT/replay.txt"
DB=/tmp/ar_replay.db
rm -f "$DB" "$DB-wal" "$DB-shm"
for tr in traces/samples/*.trace.jsonl.gz; do
  n=$(basename "$tr" .trace.jsonl.gz)
  timeout 40 bin/attnreplay replay "$tr" --backend cuda --db "$DB" --repeat 5 --layers 2 \
    >>"$OUT/replay.txt" 2>&1
  echo "replay $n rc=$?" | tee -a "$OUT/replay.txt"
done
# a realistic trace (simulated from the public Azure conversation trace, Llama-3.1-8B shapes,
# built on the development machine into out/, carried to the GPU machine): as many steps
# as fit in 60 s, each verified (every decode row is a request's last row, so all are checked)
if [ -f out/azure_conv_llama8b.trace.jsonl.gz ]; then
  timeout 60 bin/attnreplay replay out/azure_conv_llama8b.trace.jsonl.gz --backend cuda --db "$DB" \
    --repeat 3 --verify sample:64 >>"$OUT/replay.txt" 2>&1
  echo "replay azure_conv_llama8b rc=$? (124 = stopped by the 60 s budget; committed steps stay)" | tee -a "$OUT/replay.txt"
fi
python3 - "$DB" >>"$OUT/replay.txt" 2>&1 <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
for r in db.execute("select id, trace, backend, device, status, steps_done, steps_failed from runs"):
    print("run", r)
for r in db.execute("select run, count(*), sum(pass), round(avg(time_us),1), round(max(gbps),1), "
                    "round(max(tflops),2), sum(guard_ok) from steps group by run"):
    print("steps(run, n, passed, avg_us, max_gbps, max_tflops, guard_ok)", r)
for r in db.execute("select name, count(*), round(avg(time_us),2) from kernels group by name"):
    print("kernel", r)
for r in db.execute("select run, step, num_reqs, num_tokens, max_seq_len, round(time_us,1), round(gbps,1), "
                    "round(tflops,2), pass from steps where run = (select max(id) from runs) "
                    "order by time_us desc limit 5"):
    print("slowest steps of the last run (run, step, reqs, tokens, max_seq, us, GB/s, TFLOP/s, pass)", r)
PY
tail -12 "$OUT/replay.txt"

if [ "$(left)" -gt 50 ] && command -v ncu >/dev/null 2>&1; then
  stage "ncu"
  timeout $(( $(left) - 10 )) ncu --clock-control none -k regex:attn_kernel -c 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis \
    build/tests/bench_cuda 1 prefill_b2_s8192_causal_hd128 >"$OUT/ncu.txt" 2>&1
  echo "ncu rc=$?"; grep -E "Throughput|Duration|Registers|Achieved Occupancy|Theoretical Occupancy|Stall|Warp Cycles" "$OUT/ncu.txt" | head -20
fi
if [ "$(left)" -gt 40 ] && command -v ncu >/dev/null 2>&1; then
  stage "ncu decode"
  timeout $(( $(left) - 15 )) ncu --clock-control none -k regex:attn_kernel -c 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    build/tests/bench_cuda 1 decode_b64_s8192_gqa32_8_hd128 >>"$OUT/ncu.txt" 2>&1
  echo "ncu decode rc=$?"; tail -60 "$OUT/ncu.txt" | grep -E "DRAM Throughput|Duration|Achieved Occupancy|Theoretical Occupancy"
fi
if command -v cuobjdump >/dev/null 2>&1; then
  stage "sass mix"
  cuobjdump -sass build/tests/bench_cuda 2>/dev/null | python3 -c '
import re, sys, collections
txt = sys.stdin.read()
for f in re.split(r"\n\s+Function : ", txt)[1:]:
    name = f.split("\n")[0]
    if "attn_kernel" not in name or "Lb1E" not in name:
        continue
    ops = re.findall(r"/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", f)
    c = collections.Counter(o[1].split(".")[0] for o in ops)
    print(name[:100], "instructions", len(ops), "predicated", sum(1 for o in ops if o[0]))
    print("   ", c.most_common(18))
' >>"$OUT/ncu.txt" 2>&1
  tail -4 "$OUT/ncu.txt"
fi

if [ "$(left)" -gt 120 ] && [ -x build/tests/bench_replay ]; then
  replay_bench
fi

stage "summary"
python3 - "$OUT/bench.txt" "$OUT/peers.txt" <<'PY' | tee "$OUT/summary.txt"
import re, sys
def kv(line):
    return dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line))
ours, peers, ceil = {}, {}, None
for l in open(sys.argv[1]):
    if l.startswith("RESULT"):
        d = kv(l); ours[d["name"]] = d
for l in open(sys.argv[2]):
    if l.startswith("PEER") and "error=" not in l:
        d = kv(l); peers.setdefault(d["name"], []).append(d)
    if l.startswith("CEILING"):
        ceil = kv(l)["copy_gbps"]
print(f"copy ceiling: {ceil} GB/s")
print(f"{'case':44s} {'impl':26s} {'us':>9s} {'GB/s':>8s} {'TFLOP/s':>8s} {'ours/peer':>9s}")
for name, d in ours.items():
    metric = "gbps" if name.startswith("decode") else "tflops"
    o = float(d[metric])
    base = name.replace("_nosplit", "").replace("_split4", "").replace("_mma", "")
    cud = [p for p in peers.get(base, []) if p["impl"].startswith("cudnn")]
    vs = f"{o / float(cud[0][metric]):9.2f}" if cud and float(cud[0][metric]) > 0 else ""
    print(f"{name:44s} {'ours (splits=' + d['splits'] + ')':26s} {float(d['us']):9.1f} {float(d['gbps']):8.1f} {float(d['tflops']):8.1f} {vs}")
    if name != base:
        continue
    for p in peers.get(base, []):
        pv = float(p[metric])
        ratio = o / pv if pv > 0 else float("nan")
        print(f"{'':44s} {p['impl']:26s} {float(p['us']):9.1f} {float(p['gbps']):8.1f} {float(p['tflops']):8.1f} {ratio:9.2f}")
PY
echo
echo "cascade vs flat (tests/bench_cascade.c):"
grep -E "^\|" "$OUT/cascade_bench.txt" | tee -a "$OUT/summary.txt"
grep -E "^target" "$OUT/cascade_bench.txt" | tee -a "$OUT/summary.txt"
grep -E "^(prefix plan sweep|SWEEP)" "$OUT/cascade_bench.txt" | tee -a "$OUT/summary.txt"
grep -E "^\[  (PASSED|FAILED)" "$OUT/cascade_test.txt" | sed 's/^/gpu_cascade: /' | tee -a "$OUT/summary.txt"
pack_out summary.txt bench.txt gpu_test.txt peers.txt replay_bench.txt
