#!/usr/bin/env bash
# run_tests.sh - runs the test binaries given, TEST_JOBS at a time (default: the number of cores;
# each binary works in its own temporary directory), prints each one's log in the order given,
# then one closing line "N passed, N failed, N skipped" counted over all cmocka tests.
# Exit 1 if any failed.
set -u
jobs=${TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
logs=$(mktemp -d "${TMPDIR:-/tmp}/ar_tests.XXXXXX")
trap 'rm -rf "$logs"' EXIT
i=0; running=0
for t in "$@"; do
  i=$((i+1))
  if [ -x "$t" ]; then
    ( "$t" >"$logs/$i.log" 2>&1; echo $? >"$logs/$i.rc" ) &
    running=$((running+1))
    if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running-1)); fi
  fi
done
wait
passed=0; failed=0; skipped=0; broken=""
i=0
for t in "$@"; do
  i=$((i+1))
  [ -x "$t" ] || { echo "missing test binary: $t" >&2; failed=$((failed+1)); broken="$broken $t"; continue; }
  log="$logs/$i.log"
  rc=$(cat "$logs/$i.rc" 2>/dev/null || echo 1)
  cat "$log"
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END{print s+0}')
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END{print s+0}')
  s=$(grep -c '^\[  SKIPPED \]' "$log")
  passed=$((passed+p)); failed=$((failed+f)); skipped=$((skipped+s))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then failed=$((failed+1)); broken="$broken $t(rc=$rc)"; fi
done
[ -n "$broken" ] && echo "broken:$broken"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
