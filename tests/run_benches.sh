#!/usr/bin/env bash
# run_benches.sh - runs each benchmark binary given; they print their own tables.
set -u
rc=0
for b in "$@"; do
  [ -x "$b" ] || { echo "missing benchmark binary: $b" >&2; rc=1; continue; }
  echo "== $b"; "$b" || rc=1
done
exit $rc
