/* cuda_profile_stub.c - the GPU half of `attnreplay profile` on a machine without nvcc: the same
 * symbols as kernels/common/cuda_profile.cu, answering that there is no CUDA device.  The Makefile
 * compiles this file only when nvcc is absent (like kernels/common/cuda_calibrate_stub.c). */
#include "cuda_profile.h"

#include <stdio.h>

int ar_cuda_profile_device(char *name, size_t len, char *err, size_t err_len)
{
    if (len) name[0] = '\0';
    snprintf(err, err_len, "no CUDA device (built without CUDA: nvcc not found)");
    return 3;
}

int ar_cuda_profile_gemm(int k, int n, const int *ms, int num_m, int repeat, double *us, char *engine,
                         size_t engine_len, char *err, size_t err_len)
{
    (void)k; (void)n; (void)ms; (void)num_m; (void)repeat; (void)us;
    if (engine_len) engine[0] = '\0';
    snprintf(err, err_len, "no CUDA device (built without CUDA: nvcc not found)");
    return 3;
}
