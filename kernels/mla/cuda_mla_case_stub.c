/* cuda_mla_case_stub.c - the cuda-mla test hook (cuda_mla_case.h) on a machine without nvcc:
 * every case fails cleanly with the reason, so the GPU tests and benchmarks link and skip.  The
 * Makefile compiles this file only when nvcc is absent. */
#include "cuda_mla_case.h"

#include <stdio.h>

int ar_cuda_mla_run_case(const ar_cuda_mla_case *c, ar_cuda_mla_result *res, char *err, size_t err_len)
{
    (void)c;
    (void)res;
    snprintf(err, err_len, "built without CUDA (nvcc not found)");
    return 3;
}

void ar_cuda_mla_release_case_buffers(void) {}
