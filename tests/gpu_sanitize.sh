#!/usr/bin/env bash
# gpu_sanitize.sh - runs compute-sanitizer (memcheck, racecheck, initcheck, synccheck) over GPU
# test binaries with their small cases (AR_GPU_SMALL=1), every (binary, tool) pair at once, each
# under `timeout`, and writes one log per pair and a summary with one line per pair.
#
#   usage: [OUT=dir] [SUMMARY=file] tests/gpu_sanitize.sh BINARY...
#          (`make test-gpu-sanitize` calls it with the GPU test binaries)
#
# Environment (all optional):
#   OUT                 where logs and the summary go (default build/gpu-sanitize)
#   SUMMARY             the summary file (default $OUT/gpu-sanitize-summary.txt)
#   SANITIZE_TIMEOUT    seconds each pair may run before it is killed (default 400)
#   SANITIZE_TOOLS      tools to run (default "memcheck racecheck initcheck synccheck")
#   COMPUTE_SANITIZER   the sanitizer (default: compute-sanitizer on PATH, else
#                       /usr/local/cuda/bin/compute-sanitizer); any command taking the same
#                       arguments will do, e.g. a stub that just runs the binary, to test this
#   SANITIZE_BASE_PORT  first TCP port of the sanitizer/target link (default 49152; pair i
#                       uses base + 16 i when the sanitizer has --port)
#   SANITIZE_SHARDS     "BINARY:TOOL:N ..." splits those pairs over N processes each
#                       (AR_GPU_SHARD=K/N; summary lines "BINARY TOOL-K"); make test-gpu-sanitize
#                       sets "gpu_mla:racecheck:7" and the same for gpu_mla_backend and the
#                       two _handover builds (one process ran past 480 s on the H200)
#   AR_SRC, AR_BIN      passed to the tests (defaults: the repository root, its bin/attnreplay)
#
# Logs: $OUT/gpu-sanitize-BINARY-TOOL.log.  Summary line per pair:
#   BINARY TOOL rc=N Ss: <the tool's ERROR SUMMARY / RACECHECK SUMMARY line> | cmocka P passed, F failed, S skipped
# A pair killed by the timeout reads "timed out after Ns (K tests finished, last started: T)"
# instead of the tool's summary.  The script's
# exit status is 0 only when every pair exits 0 (the sanitizer runs with --error-exitcode 99, so a
# reported error or a failed test makes it non-zero).
set -u

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${OUT:-$repo/build/gpu-sanitize}
summary=${SUMMARY:-$out/gpu-sanitize-summary.txt}
limit=${SANITIZE_TIMEOUT:-400}
tools=${SANITIZE_TOOLS:-memcheck racecheck initcheck synccheck}
sanitizer=${COMPUTE_SANITIZER:-}
if [ -z "$sanitizer" ]; then
  sanitizer=$(command -v compute-sanitizer 2>/dev/null || true)
  [ -z "$sanitizer" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && sanitizer=/usr/local/cuda/bin/compute-sanitizer
fi
if [ -z "$sanitizer" ]; then
  echo "gpu_sanitize.sh: compute-sanitizer not found (CUDA toolkit bin/; or set COMPUTE_SANITIZER)" >&2
  exit 2
fi
if [ $# -eq 0 ]; then
  echo "usage: [OUT=dir] tests/gpu_sanitize.sh BINARY..." >&2
  exit 2
fi
case "$limit" in ''|*[!0-9]*) echo "gpu_sanitize.sh: SANITIZE_TIMEOUT must be whole seconds, got '$limit'" >&2; exit 2;; esac
mkdir -p "$out" "$(dirname "$summary")" || exit 2
: > "$summary" || exit 2

# compute-sanitizer talks to its target over local TCP ports, trying --max-connections (default
# 10) ports from --port (default 49152): with a dozen instances at once they could run out, so
# each pair gets its own base port, 16 apart.  --launch-timeout (default 10 s) is raised because
# a dozen targets start at once.  Both only when this sanitizer lists them in its --help.
sanitizer_help=$("$sanitizer" --help 2>&1 || true)
has_option() { case "$sanitizer_help" in *"$1"*) return 0;; esac; return 1; }
base_port=${SANITIZE_BASE_PORT:-49152}

export AR_GPU_SMALL=1
export AR_SRC=${AR_SRC:-$repo}
[ -z "${AR_BIN:-}" ] && [ -x "$repo/bin/attnreplay" ] && AR_BIN=$repo/bin/attnreplay
[ -n "${AR_BIN:-}" ] && export AR_BIN

# Shards: "BINARY:TOOL:N ..." runs that pair as N processes, each with AR_GPU_SHARD=K/N (the
# GPU test binaries then run the tests whose index % N == K, tests/testutil.h tu_gpu_shard), one
# summary line per shard.  Racecheck on gpu_mla needs more than 480 s in one process on the H200.
shards_of() {
  local want="$1:$2" entry
  for entry in ${SANITIZE_SHARDS:-}; do
    case "$entry" in "$want":*) echo "${entry##*:}"; return;; esac
  done
  echo 1
}

# Runs one pair (or one shard of it: shard "K/N", "" for all); writes its log and a one-line
# result file beside it.
run_pair() {
  local bin=$1 tool=$2 log=$3 result=$4 index=$5 shard=${6:-}
  local extra="" start rc
  [ "$tool" = memcheck ] && extra="--leak-check full"
  has_option --port && extra="$extra --port $((base_port + 16 * index))"
  has_option --launch-timeout && extra="$extra --launch-timeout 120"
  start=$(date +%s)
  # shellcheck disable=SC2086
  AR_GPU_SHARD=$shard timeout --kill-after=30 "$limit" "$sanitizer" --tool "$tool" $extra --error-exitcode 99 "$bin" >"$log" 2>&1
  rc=$?
  echo "$rc $(( $(date +%s) - start ))" > "$result"
}

status=0
pids=""
pairs=""
for bin in "$@"; do
  name=$(basename "$bin")
  if [ ! -x "$bin" ]; then
    echo "$name - missing binary $bin (make gpu-build on the development machine)" | tee -a "$summary"
    status=1
    continue
  fi
  for tool in $tools; do
    n=$(shards_of "$name" "$tool")
    case "$n" in ''|*[!0-9]*|0) n=1;; esac
    k=0
    while [ "$k" -lt "$n" ]; do
      if [ "$n" -gt 1 ]; then tag=$tool-$k; shard=$k/$n; else tag=$tool; shard=""; fi
      log=$out/gpu-sanitize-$name-$tag.log
      run_pair "$bin" "$tool" "$log" "$log.rc" "$(echo $pairs | wc -w)" "$shard" &
      pids="$pids $!"
      pairs="$pairs $name:$tag"
      k=$((k + 1))
    done
  done
done
echo "gpu_sanitize.sh: $(echo $pairs | wc -w) pairs running at once, ${limit}s limit each; logs in $out"
for pid in $pids; do wait "$pid"; done

# cmocka's closing lines: "[  PASSED  ] N test(s).", "[  FAILED  ] N test(s), ...",
# "[  SKIPPED ] N test(s), ..." (absent when zero).
cmocka_count() {
  sed -n "s/^\[  $1 *\] \([0-9][0-9]*\) test(s).*/\1/p" "$2" | awk '{s+=$1} END{print s+0}'
}

for pair in $pairs; do
  name=${pair%%:*}; tool=${pair##*:}
  log=$out/gpu-sanitize-$name-$tool.log
  rc=1; secs=0
  [ -f "$log.rc" ] && read -r rc secs < "$log.rc"
  rm -f "$log.rc"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    # how far it got: tests finished, and the one it was in
    done_tests=$(grep -c '^\[       OK \]' "$log")
    last_run=$(sed -n 's/^\[ RUN      \] //p' "$log" | tail -1)
    tool_line="timed out after ${limit}s ($done_tests tests finished, last started: ${last_run:-none})"
  else
    tool_line=$(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$log" | tail -1 | sed 's/^=* *//')
    tool_line=${tool_line:-no sanitizer summary line}
  fi
  tests="cmocka $(cmocka_count PASSED "$log") passed, $(cmocka_count FAILED "$log") failed, $(cmocka_count SKIPPED "$log") skipped"
  echo "$name $tool rc=$rc ${secs}s: $tool_line | $tests" | tee -a "$summary"
  [ "$rc" -eq 0 ] || status=1
done
echo "summary in $summary"
exit $status
