/* cuda_calibrate.h - measures a GPU's two ceilings for `attnreplay calibrate` (issue 7 item 3):
 * device-to-device copy bandwidth and the bf16 matrix (GEMM) rate.  The method is documented at
 * the top of kernels/common/cuda_calibrate.cu and written into ar_calibration.method, which
 * reports/calibrate.c stores in the `ceilings` table (replay/db.h).
 *
 * The measurement is kernels/common/cuda_calibrate.cu; on a machine without nvcc,
 * kernels/common/cuda_calibrate_stub.c defines the same symbols and always answers "no CUDA device".
 * Everything here has C linkage. */
#ifndef AR_CUDA_CALIBRATE_H
#define AR_CUDA_CALIBRATE_H

#include <stddef.h>

#include "cuda_cublas.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What to measure.  Zero fields take the defaults in brackets. */
typedef struct ar_calibrate_options {
    size_t copy_bytes;        /* size of the copied buffer [4 GiB, halved until two fit] */
    int gemm_n;               /* M = N = K of the square GEMM, a multiple of 128 [8192] */
    int no_cublas;            /* 1: skip cuBLAS, time the built-in mma.sync kernel (lower bound) */
} ar_calibrate_options;

/* What was measured on device 0. */
typedef struct ar_calibration {
    char device[256];         /* cudaDeviceProp.name, the same string the cuda backends store */
    double copy_gbps;         /* 2 * copy_bytes / median time, in 1e9 bytes per second */
    size_t copy_bytes;        /* buffer size actually copied */
    double copy_median_ms, copy_min_ms, copy_max_ms;
    double bf16_tflops;       /* 2 * n^3 / median time, in 1e12 per second */
    int gemm_n;
    double gemm_median_ms, gemm_min_ms, gemm_max_ms;
    double gemm_check_worst;  /* worst |got - want| / tolerance of the 64 checked elements (<= 1) */
    int used_cublas;          /* 1: cuBLAS; 0: the built-in kernel, a lower bound */
    char gemm_engine[512];    /* "cuBLAS <version> (<path>)" or "built-in mma.sync kernel" */
    char method[1024];        /* the method in one line, stored in ceilings.method */
} ar_calibration;

/* Measures copy bandwidth and bf16 GEMM rate on device 0 (method in cuda_calibrate.cu).
 * Returns 0 and fills out; 3 with err set when there is no CUDA device (err then starts with
 * "no CUDA device"), on a CUDA error, when the buffers do not fit, or when the GEMM's spot check
 * fails; 2 on bad options.  Warnings (e.g. why cuBLAS could not be loaded) go to stderr. */
int ar_cuda_calibrate(const ar_calibrate_options *opt, ar_calibration *out, char *err,
                      size_t err_len);

/* ar_cuda_cublas_probe: kernels/common/cuda_cublas.h (the stub's answer on a host-only build is
 * in cuda_calibrate_stub.c). */

#ifdef __cplusplus
}
#endif
#endif
