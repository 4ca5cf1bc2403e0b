/* cuda_calibrate_stub.c - `attnreplay calibrate`'s measurement on a machine without nvcc: the
 * same symbols as kernels/common/cuda_calibrate.cu, answering that there is no CUDA device.  The
 * Makefile compiles this file only when nvcc is absent (like kernels/paged/cuda_stub.c). */
#include "cuda_calibrate.h"

#include <stdio.h>
#include <string.h>

int ar_cuda_calibrate(const ar_calibrate_options *opt, ar_calibration *out, char *err,
                      size_t err_len)
{
    (void)opt;
    memset(out, 0, sizeof *out);
    snprintf(err, err_len, "no CUDA device (built without CUDA: a host-only build)");
    return 3;
}

int ar_cuda_cublas_probe(char *path, size_t path_len, char *err, size_t err_len)
{
    if (path_len) path[0] = '\0';
    snprintf(err, err_len, "built without CUDA (a host-only build): cuBLAS is not used");
    return -1;
}
