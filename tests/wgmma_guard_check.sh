#!/usr/bin/env bash
# wgmma_guard_check.sh - the Makefile's NVCC_WGMMA_GUARD still works: through the .cu rule,
# tests/wgmma_guard/serialized.cu (a kernel ptxas must serialize) fails to build with the guard's
# message, and clean.cu (the same kernel without the fault) builds. A CUDA update that renamed
# ptxas's message would otherwise turn the guard off silently. Run by `make test`; without nvcc
# it says so and passes (CI has no CUDA toolkit).
set -u
cd "$(dirname "$0")/.."
nvcc=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
if [ -z "$nvcc" ]; then
    echo "wgmma_guard_check: skipped (no nvcc here; the guard only runs where CUDA kernels are built)"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build() {   # build OBJ: the Makefile's own rule, into a scratch build directory
    make -s --no-print-directory NVCC="$nvcc" CUDA_ARCHS=90a BUILD="$tmp" "$tmp/$1" > "$tmp/log" 2>&1
}
fail=0
if build tests/wgmma_guard/serialized.o; then
    echo "wgmma_guard_check: FAILED: tests/wgmma_guard/serialized.cu built; the guard let serialized wgmma through"
    fail=1
elif ! grep -q "ptxas serialized wgmma" "$tmp/log"; then
    echo "wgmma_guard_check: FAILED: serialized.cu failed to build, but not on the guard:"
    tail -5 "$tmp/log"
    fail=1
elif [ -e "$tmp/tests/wgmma_guard/serialized.o" ]; then
    echo "wgmma_guard_check: FAILED: the guard left serialized.o behind"
    fail=1
fi
if ! build tests/wgmma_guard/clean.o; then
    echo "wgmma_guard_check: FAILED: tests/wgmma_guard/clean.cu did not build:"
    tail -5 "$tmp/log"
    fail=1
fi
[ $fail = 0 ] && echo "wgmma_guard_check: passed (serialized.cu refused by the guard, clean.cu built)"
exit $fail
