#!/bin/sh
# nvcc_guard.sh NVCC ARG... - runs nvcc and fails when ptxas reports that it serialised a kernel's
# wgmma ("wgmma.mma_async instructions are serialized", C7511-C7520: every wgmma waited on before
# the next, typically after a wait or branch between the wgmma of one product that ptxas cannot
# prove warp-uniform, or an accumulator written while its wgmma is in flight). Such a kernel is
# correct and slower, so no test would notice; the Makefile compiles the product's and the lab's
# CUDA files through this script, and tests/wgmma_guard_check.sh checks that it still catches one.
# nvcc's own messages pass through; on a serialised kernel the -o output is removed, exit 1.
out=""
prev=""
for a in "$@"; do
    [ "$prev" = "-o" ] && out=$a
    prev=$a
done
log=$(mktemp)
"$@" 2>"$log"
status=$?
cat "$log" >&2
if grep -q 'wgmma.mma_async instructions are serialized' "$log"; then
    echo "${out:-nvcc}: ptxas serialised wgmma (above): make the waits and branches between one product's wgmma warp-uniform, and leave its accumulators alone while it runs" >&2
    [ -n "$out" ] && rm -f "$out"
    status=1
fi
rm -f "$log"
exit $status
