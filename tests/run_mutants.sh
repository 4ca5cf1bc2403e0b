#!/usr/bin/env bash
# run_mutants.sh - runs the GPU mutants that `make mutate-gpu-build` packed (tests/mutate.py) on
# the GPU machine, in one go, and prints the mutation score.
#
#   tests/run_mutants.sh ARCHIVE [ID ...]        (make mutate-gpu runs it on MUTATE_OUT's archive)
#
# ARCHIVE is gpu-mutants.tar.xz: per mutant ID/attnreplay, and mutants.tsv (id, file, line, kernel
# path, expect, what, kill replays).  First the pristine binary ($AR_BIN, default bin/attnreplay)
# must pass every kill replay (else a "kill" would mean nothing); then each mutant runs its kill
# replays in order until one fails.  A mutant is killed by exit 1 (a step failed verification),
# 3 (a run error), a signal or the time limit; exit 0 is a survival; exit 2 or 4 means the kill
# replay itself is wrong.  A mutant marked "expect exit3" (a fault that writes out of bounds or
# never finishes) is killed only by exit 3, and then the pristine binary must --resume its run
# from the database the mutant left (exit 0): the run's committed steps were whole.
# Environment: AR_SRC (the checkout, for traces/samples; default .), MUTANT_TIMEOUT (seconds a
# kill replay may run, default 300), MUTANT_OUT (where results, logs and databases go; default a
# new directory under /tmp, printed; the unpacked binaries go to a scratch directory removed at
# the end).  Exit 0 when every mutant run was killed, 1 when one survived,
# 2 when the pristine binary fails a kill replay or the archive is unusable.
set -u
archive=${1:?usage: run_mutants.sh ARCHIVE [ID ...]}
shift
src=${AR_SRC:-.}
bin=${AR_BIN:-$src/bin/attnreplay}
limit=${MUTANT_TIMEOUT:-300}
out=${MUTANT_OUT:-$(mktemp -d /tmp/mutants.XXXXXX)}
mkdir -p "$out"
[ -f "$archive" ] || { echo "run_mutants: $archive: no such archive (make mutate-gpu-build makes it)" >&2; exit 2; }
[ -x "$bin" ] || { echo "run_mutants: $bin: no pristine attnreplay binary" >&2; exit 2; }
t0=$(date +%s)
# the binaries (tens of MB each) go to a scratch directory removed at the end; $out keeps the logs,
# databases and results
work=$(mktemp -d "${TMPDIR:-/tmp}/mutant-bins.XXXXXX")
trap 'rm -rf "$work"' EXIT
xz -dc "$archive" | tar -C "$work" -xf - || { echo "run_mutants: cannot unpack $archive" >&2; exit 2; }
dir="$work/gpu-mutants"
manifest="$dir/mutants.tsv"
[ -f "$manifest" ] || { echo "run_mutants: $archive holds no mutants.tsv" >&2; exit 2; }
echo "run_mutants: unpacked $(($(wc -l <"$manifest") - 1)) mutants into $dir in $(($(date +%s) - t0)) s; logs, databases and results go to $out"

# run_kill BINARY DB KILL [EXTRA]: one kill replay ("[VAR=V ...] SAMPLE [options]"); sets rc, log.
run_kill() {
  local binary=$1 db=$2 kill=$3 extra=${4:-}
  local -a words env=()
  read -r -a words <<<"$kill"
  while [ ${#words[@]} -gt 0 ] && [[ ${words[0]} =~ ^[A-Z_][A-Z0-9_]*= ]]; do env+=("${words[0]}"); words=("${words[@]:1}"); done
  local trace=${words[0]}
  [[ $trace == */* ]] || trace="$src/traces/samples/$trace.trace.jsonl.gz"
  log="$db.log"
  env "${env[@]}" timeout -k 10 "$limit" "$binary" replay "$trace" --db "$db" "${words[@]:1}" $extra >"$log" 2>&1
  rc=$?
}

first_failure() {   # the replay's first failing step or its error line
  grep -m1 -E "FAILED|attnreplay replay: [^/]" "$1" | cut -c1-160
}

# the pristine binary on every kill replay
declare -A seen=()
broken=0
while IFS=$'\t' read -r id file line path expect what kills; do
  [ "$id" = id ] && continue
  IFS=$'\t' read -r -a kl <<<"$kills"
  for k in "${kl[@]}"; do
    [ -n "${seen[$k]:-}" ] && continue
    seen[$k]=1
    db="$out/pristine-${#seen[@]}.db"
    rm -f "$db" "$db-wal" "$db-shm"
    run_kill "$bin" "$db" "$k"
    if [ "$rc" -ne 0 ]; then echo "  pristine FAILS $k: exit $rc: $(first_failure "$log")"; broken=$((broken + 1)); fi
  done
done <"$manifest"
if [ "$broken" -gt 0 ]; then echo "run_mutants: $broken kill replays fail without any mutation: no score"; exit 2; fi
echo "run_mutants: the pristine $bin passes all ${#seen[@]} kill replays"

results="$out/gpu-results.tsv"
printf 'id\tfile\tline\tpath\toutcome\tby\tseconds\n' >"$results"
total=0; killed=0; survived=""
while IFS=$'\t' read -r id file line path expect what kills; do
  [ "$id" = id ] && continue
  if [ $# -gt 0 ]; then want=0; for w in "$@"; do [ "$w" = "$id" ] && want=1; done; [ $want = 1 ] || continue; fi
  total=$((total + 1))
  s0=$(date +%s)
  IFS=$'\t' read -r -a kl <<<"$kills"
  outcome=survived; by="every kill replay passed"
  for k in "${kl[@]}"; do
    db="$out/$id.db"
    rm -f "$db" "$db-wal" "$db-shm"
    run_kill "$dir/$id/attnreplay" "$db" "$k"
    if [ "$expect" = exit3 ]; then
      if [ "$rc" -eq 3 ]; then
        mrc=$rc; mlog=$(first_failure "$log"); cp "$log" "$db.mutant.log"   # the resume writes $log
        run_kill "$bin" "$db" "$k" --resume
        if [ "$rc" -eq 0 ]; then outcome=killed; by="$k: run error (exit 3) as expected, then --resume passed; $mlog"
        else outcome=survived; by="$k: exit $mrc, but the pristine --resume exited $rc: $(first_failure "$log")"; fi
      else
        outcome=survived; by="$k: exit $rc, expected a run error (exit 3): $(first_failure "$log")"
      fi
      break
    fi
    case $rc in
      0) continue ;;
      1) outcome=killed; by="$k: verifier (exit 1); $(first_failure "$log")" ;;
      3) outcome=killed; by="$k: run error (exit 3); $(first_failure "$log")" ;;
      2|4) outcome=broken; by="$k: exit $rc: the kill replay itself is wrong; $(first_failure "$log")" ;;
      124|137) outcome=killed; by="$k: time limit ($limit s)" ;;
      *) outcome=killed; by="$k: exit $rc" ;;
    esac
    break
  done
  secs=$(($(date +%s) - s0))
  [ "$outcome" = killed ] && killed=$((killed + 1)) || survived="$survived $id"
  printf '  %-30s %-8s %4d s  %s\n' "$id" "$outcome" "$secs" "$by"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$id" "$file" "$line" "$path" "$outcome" "$by" "$secs" >>"$results"
done <"$manifest"
echo "mutation score (gpu): $killed / $total killed in $(($(date +%s) - t0)) s; results in $results"
[ -n "$survived" ] && echo "  not killed:$survived"
[ "$killed" -eq "$total" ]
