/* clean.cu - serialized.cu without the accumulator write, for tests/wgmma_guard_check.sh: the
 * Makefile's guard (kernels/nvcc_guard.sh) must let it build. */
#define WGMMA_GUARD_CLEAN 1
#include "serialized.cu"
