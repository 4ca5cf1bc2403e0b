#!/usr/bin/env bash
# gpu_shard_h200.sh - sharded replay on the GPU machines: the wall time of two shards against one
# process, the GPU each shard ran on (nvidia-smi, sampled during the run), and the merged run
# checked against the single-process run row by row (times aside).  Prebuilt binaries only
# (bin/ and out/ carried from the development machine); logs and a summary in $OUT.
# Stages (one run each; each under its own timeout):
#   plan        the shard plan of the trace for 2 shards (no GPU work)
#   one         the baseline: one process on GPU 0                                 (~5 min)
#   two-on-one  two shards at once on the one GPU (CUDA_VISIBLE_DEVICES=0), merged, compared
#               with the baseline, wall time against it
#   two-gpus    two shards on two GPUs, the GPU chosen by each shard's local rank (Slurm
#               variables set by hand as srun sets them), placement from nvidia-smi, merged,
#               compared with the baseline, the speedup (the goal is 1.8x or more)
#   two-mpirun  the same through mpirun -np 2, when Open MPI is installed
# The trace is the 1,546-step Mooncake slice of tests/gpu_verify_h200.sh (prepare it there:
# out/mooncake300.trace.jsonl.gz), its first 100 steps by default: the whole trace at
# --verify sample:64 --layers 32 takes about 50 min on one H200 (BENCHMARKS.md).  TRACE=... and
# OPTS=... override trace and replay options; OPTS="... --shard-by layers" splits the 32 layers
# instead of the steps (even by construction; every shard then reads every step).
# Then on the H200: tests/gpu_shard_h200.sh plan one, then tests/gpu_shard_h200.sh two-on-one,
# and on a machine with two H200s: tests/gpu_shard_h200.sh one two-gpus (one run each).
set -u
OUT=${OUT:-/tmp/ar_shard_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
BIN=$PWD/bin/attnreplay
TRACE=${TRACE:-out/mooncake300.trace.jsonl.gz}
OPTS=${OPTS:---layers 32 --verify sample:64 --steps 0:99 --quiet}
DB=${DB:-/tmp/ar_shard}
mkdir -p "$DB"
SUMMARY="$OUT/summary.txt"
: >>"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
unset SLURM_PROCID SLURM_NTASKS SLURM_STEP_NUM_TASKS SLURM_LOCALID SLURM_ARRAY_TASK_ID SLURM_ARRAY_TASK_COUNT \
      OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE RANK WORLD_SIZE LOCAL_RANK
[ -f "$TRACE" ] || { note "missing $TRACE (see the preparation steps of tests/gpu_verify_h200.sh)"; exit 2; }

now() { date +%s.%N; }
# Samples which GPU each attnreplay process holds, every second, until the file $1.stop appears.
watch_gpus() {
  local log=$1
  while [ ! -e "$log.stop" ]; do
    nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv,noheader >>"$log" 2>&1
    sleep 1
  done
}
# Merges the shard databases $2.. into $1 and compares the merged run with the baseline run
# (every step column but the times, the kernels run, the mismatches, the counters).
merge_and_compare() {
  local merged=$1
  shift
  rm -f "$merged" "$merged-wal" "$merged-shm"
  "$BIN" merge "$merged" "$@" | tee -a "$SUMMARY"
  python3 - "$DB/one.db" "$merged" <<'EOF' | tee -a "$SUMMARY"
import sqlite3, sys
cols = ("step, time, num_reqs, num_tokens, num_prefill_reqs, num_decode_reqs, max_query_len, max_seq_len,"
        " total_context, cascade, prefix_len, bytes, flops, verified, rows_checked, max_abs, max_rel, mean_abs,"
        " nmse, lse_max_abs, nan_count, bad_count, naive_max_abs, naive_mean_abs, tol_max_abs, tol_mean_abs,"
        " guard_ok, pass, layers_verified")
h = sqlite3.connect(sys.argv[1])
h.execute("ATTACH ? AS b", (sys.argv[2],))
diff = 0
for table, c in (("steps", cols), ("kernels", "step, layer, name"),
                 ("mismatches", "step, layer, req, token, head, dim, got, want, abs_err")):
    for x, y in (("main", "b"), ("b", "main")):
        diff += h.execute(f"SELECT count(*) FROM (SELECT {c} FROM {x}.{table} EXCEPT SELECT {c} FROM {y}.{table})").fetchone()[0]
a = h.execute("SELECT steps_done, steps_failed, verified_rows, status FROM main.runs").fetchall()
b = h.execute("SELECT steps_done, steps_failed, verified_rows, status FROM b.runs").fetchall()
print(f"compare with one process: {diff} differing rows; one process {a}, merged {b}:",
      "IDENTICAL" if diff == 0 and a == b else "DIFFERENT")
EOF
}
wall_of() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

for stage in "$@"; do
  echo "== $stage ($(date -u +%H:%M:%S))"
  case $stage in
    plan)
      "$BIN" replay "$TRACE" $OPTS --shard 0/2 --plan-only | tee -a "$SUMMARY"
      ;;
    one)
      rm -f "$DB"/one.db*
      t0=$(now)
      CUDA_VISIBLE_DEVICES=0 timeout 580 "$BIN" replay "$TRACE" --db "$DB/one.db" $OPTS >"$OUT/one.txt" 2>&1
      rc=$?
      t1=$(now)
      echo "$(wall_of "$t0" "$t1")" >"$DB/one.wall"
      note "one process, GPU 0: exit $rc, wall $(cat "$DB/one.wall") s"
      ;;
    two-on-one|two-gpus|two-mpirun)
      [ -f "$DB/one.db" ] || { note "$stage: run the stage 'one' first"; continue; }
      rm -f "$DB"/two-*.db* "$OUT/$stage.gpus" "$OUT/$stage.gpus.stop"
      watch_gpus "$OUT/$stage.gpus" &
      t0=$(now)
      watcher=$!
      pids=()
      if [ "$stage" = two-on-one ]; then
        for i in 0 1; do
          CUDA_VISIBLE_DEVICES=0 timeout 580 "$BIN" replay "$TRACE" --db "$DB/two-%r.db" --shard $i/2 $OPTS \
            >"$OUT/$stage-$i.txt" 2>&1 &
          pids+=($!)
        done
        wait "${pids[@]}"
      elif [ "$stage" = two-gpus ]; then
        for i in 0 1; do
          SLURM_PROCID=$i SLURM_NTASKS=2 SLURM_LOCALID=$i timeout 580 "$BIN" replay "$TRACE" --db "$DB/two-%r.db" \
            $OPTS >"$OUT/$stage-$i.txt" 2>&1 &
          pids+=($!)
        done
        wait "${pids[@]}"
      else
        if ! command -v mpirun >/dev/null; then
          note "two-mpirun: mpirun not installed"
          touch "$OUT/$stage.gpus.stop"
          wait "$watcher"
          continue
        fi
        [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
        timeout 580 mpirun -np 2 --mca orte_abort_on_non_zero_status 0 "$BIN" replay "$TRACE" --db "$DB/two-%r.db" \
          $OPTS >"$OUT/$stage.txt" 2>&1
      fi
      t1=$(now)
      touch "$OUT/$stage.gpus.stop"
      wait "$watcher"
      wall=$(wall_of "$t0" "$t1")
      note "$stage: wall $wall s against $(cat "$DB/one.wall") s for one process: speedup" \
           "$(awk -v a="$(cat "$DB/one.wall")" -v b="$wall" 'BEGIN { printf "%.2fx", a / b }')"
      note "  GPUs held (pid, bus id, memory; sampled each second):"
      sort -u "$OUT/$stage.gpus" | sed 's/^/    /' | tee -a "$SUMMARY"
      merge_and_compare "$DB/two.db" "$DB/two-0.db" "$DB/two-1.db"
      python3 -c "import sqlite3; print('  shards:', sqlite3.connect('$DB/two.db').execute(
        'SELECT group_concat(shard || \": device \" || device_index || \", steps \" || step_first || \"..\" || step_last || \", wall \" || round(wall_s, 1) || \" s\", \"; \") FROM shards').fetchone()[0])" \
        | tee -a "$SUMMARY"
      ;;
    *) note "unknown stage $stage" ;;
  esac
done
