#!/usr/bin/env bash
# build_rev_check.sh - an incremental build records the revision the tree is at: with a new
# revision (REV=..., as after a commit or a pull) `make -n` must recompile the objects that
# compile AR_CODE_REV in (a run's code_rev in the database, `attnreplay --version`), not keep the
# revision of the build that last compiled them.  Leaves the build's revision stamp as it was
# (content and time), so nothing is rebuilt because of this check.
# Usage: tests/build_rev_check.sh [BUILD]   (from the source tree; BUILD defaults to build)
# Exit status: 0 passed, 1 failed.
set -u
cd "$(dirname "$0")/.." || exit 1
build=${1:-build}
stamp="$build/code-rev.txt"
[ -f "$stamp" ] || { echo "build_rev_check: FAILED: $stamp missing after a build (the Makefile writes it)"; exit 1; }
keep=$(mktemp)
trap 'cp -p "$keep" "$stamp"; rm -f "$keep"' EXIT
cp -p "$stamp" "$keep"
out=$(make -n BUILD="$build" REV=ar-rev-check bin/attnreplay 2>&1)
for obj in "$build/replay/replay.o" "$build/sim/profile.o"; do
  grep -qF -- "-o $obj" <<<"$out" || {
    echo "build_rev_check: FAILED: a new revision does not rebuild $obj (its code_rev would stay stale)"; exit 1; }
done
grep -q 'AR_CODE_REV=\\"ar-rev-check\\"' <<<"$out" || {
  echo "build_rev_check: FAILED: the rebuild does not compile the new revision in"; exit 1; }
echo "build_rev_check: passed (a new revision rebuilds replay.o and profile.o with it)"
