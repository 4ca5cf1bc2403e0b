#!/usr/bin/env bash
# wgmma_guard_check.sh - kernels/nvcc_guard.sh still works: through the Makefile's .cu rule,
# tests/wgmma_guard/serialized.cu (a kernel ptxas must serialise) fails to build with the guard's
# message, and clean.cu (the same kernel without the fault) builds. A CUDA update that renamed
# ptxas's message would otherwise turn the guard off silently. Run by `make test`; without nvcc
# it says so and passes (a machine without the CUDA toolkit builds no kernels to guard).
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
# the clean twin first: an nvcc that cannot build sm_90a wgmma at all has nothing to guard
if ! build tests/wgmma_guard/clean.o; then
    if grep -q "ptxas serialised wgmma" "$tmp/log"; then
        echo "wgmma_guard_check: FAILED: the guard refused tests/wgmma_guard/clean.cu, which ptxas does not serialise"
        exit 1
    fi
    echo "wgmma_guard_check: skipped ($nvcc does not build sm_90a wgmma here:"
    tail -3 "$tmp/log"
    echo ")"
    exit 0
fi
if build tests/wgmma_guard/serialized.o; then
    echo "wgmma_guard_check: FAILED: tests/wgmma_guard/serialized.cu built; the guard let serialised wgmma through"
    exit 1
fi
if ! grep -q "ptxas serialised wgmma" "$tmp/log"; then
    echo "wgmma_guard_check: FAILED: serialized.cu failed to build, but not on the guard:"
    tail -5 "$tmp/log"
    exit 1
fi
if [ -e "$tmp/tests/wgmma_guard/serialized.o" ]; then
    echo "wgmma_guard_check: FAILED: the guard left serialized.o behind"
    exit 1
fi
echo "wgmma_guard_check: passed (serialized.cu refused by the guard, clean.cu built)"
