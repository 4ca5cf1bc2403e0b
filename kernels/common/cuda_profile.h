/* cuda_profile.h - the GPU half of `attnreplay profile` (sim/profile.c): times the model's GEMMs
 * through cuBLAS on device 0.  Attention is timed by sim/profile.c itself, through the backend
 * API (replay/backend.h), so the same kernels replay runs are the ones profiled.
 *
 * The measurement is kernels/common/cuda_profile.cu; on a machine without nvcc,
 * kernels/common/cuda_profile_stub.c defines the same symbols and answers "no CUDA device".
 * Everything here has C linkage. */
#ifndef AR_CUDA_PROFILE_H
#define AR_CUDA_PROFILE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Name of device 0 (cudaDeviceProp.name).  0, or 3 with err set (no device, CUDA error). */
int ar_cuda_profile_device(char *name, size_t len, char *err, size_t err_len);

/* Times out[M, N] = act[M, K] x W[N, K]^T in bf16 with fp32 accumulation (cublasGemmEx,
 * CUBLAS_COMPUTE_32F, the layout of a linear layer's weight) for every M in ms: 3 warm-up calls,
 * then us[i] = the median of `repeat` calls, each bracketed by CUDA events.  Inputs are random
 * bf16 (not zeros); one buffer of the largest shape is reused.  engine gets "cuBLAS (PATH)".
 * Returns 0, or 3 with err set (no device, no cuBLAS, CUDA or cuBLAS error, out of memory). */
int ar_cuda_profile_gemm(int k, int n, const int *ms /* [num_m] */, int num_m, int repeat,
                         double *us /* [num_m] */, char *engine, size_t engine_len, char *err,
                         size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
