#!/usr/bin/env bash
# shard_mpirun.sh - a sharded replay launched by Open MPI's mpirun, the way a cluster user runs
# it: every rank reads its shard from OMPI_COMM_WORLD_*, writes OUT/mpi-RANK.db, then the shard
# databases are merged into OUT/mpi-merged.db.  tests/test_shard.c compares the merge with an
# unsharded replay.
#
# usage: shard_mpirun.sh BIN TRACE OUT NP [replay options...]
# Exit status: 77 when mpirun is not installed (the test skips and says why), else mpirun's
# status, then merge's.
set -u
bin=$1 trace=$2 out=$3 np=$4
shift 4
if ! command -v mpirun >/dev/null 2>&1; then
  echo "mpirun not found: install Open MPI (apt-get install openmpi-bin; make test installs it)"
  exit 77
fi
# Open MPI refuses to start processes as root unless told that it is meant (containers, CI).
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Only Open MPI's variables should reach the ranks: none of another launcher's.
unset SLURM_PROCID SLURM_NTASKS SLURM_STEP_NUM_TASKS SLURM_LOCALID SLURM_ARRAY_TASK_ID SLURM_ARRAY_TASK_COUNT \
      PMI_RANK PMI_SIZE RANK WORLD_SIZE LOCAL_RANK
limit=""
command -v timeout >/dev/null 2>&1 && limit="timeout 300"
# --oversubscribe: more ranks than cores is fine for a test machine with few cores.
$limit mpirun --oversubscribe -np "$np" "$bin" replay "$trace" --db "$out/mpi-%r.db" "$@" || exit $?
shards=()
for ((i = 0; i < np; i++)); do shards+=("$out/mpi-$i.db"); done
"$bin" merge "$out/mpi-merged.db" "${shards[@]}" --quiet
