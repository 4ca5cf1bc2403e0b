#!/usr/bin/env bash
# run_tests.sh - runs each test binary given, then prints one closing line
# "N passed, N failed, N skipped" counted over all cmocka tests.  Exit 1 if any failed.
set -u
passed=0; failed=0; skipped=0; broken=""
for t in "$@"; do
  [ -x "$t" ] || { echo "missing test binary: $t" >&2; failed=$((failed+1)); broken="$broken $t"; continue; }
  log=$(mktemp)
  "$t" >"$log" 2>&1; rc=$?
  cat "$log"
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END{print s+0}')
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END{print s+0}')
  s=$(grep -c '^\[  SKIPPED \]' "$log")
  rm -f "$log"
  passed=$((passed+p)); failed=$((failed+f)); skipped=$((skipped+s))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then failed=$((failed+1)); broken="$broken $t(rc=$rc)"; fi
done
[ -n "$broken" ] && echo "broken:$broken"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
