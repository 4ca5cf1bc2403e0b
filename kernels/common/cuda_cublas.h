/* cuda_cublas.h - cuBLAS as attnreplay uses it, loaded at run time (kernels/common/cuda_cublas.cu):
 * the search for the library, its entry points, and a batched GEMM of 16-bit matrices given by
 * element strides.  Users: `calibrate` (its bf16 GEMM rate), `profile` (a model's GEMM times) and
 * the cuda-mla backend (its projection GEMMs, by default).  Nothing here needs cuBLAS's
 * headers: the values below are CUDA 13's (cublas_api.h, library_types.h).  C linkage. */
#ifndef AR_CUDA_CUBLAS_H
#define AR_CUDA_CUBLAS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cublasOperation_t, cudaDataType, cublasComputeType_t and cublasGemmAlgo_t values. */
enum {
    AR_CUBLAS_OP_N = 0,
    AR_CUBLAS_OP_T = 1,
    AR_CUDA_R_16F = 2,
    AR_CUDA_R_16BF = 14,
    AR_CUBLAS_COMPUTE_32F = 68,
    AR_CUBLAS_GEMM_DEFAULT = -1
};

/* Every function returns a cublasStatus_t; 0 is CUBLAS_STATUS_SUCCESS.  A stream is a
 * cudaStream_t. */
typedef int (*ar_cublas_create_fn)(void **handle);
typedef int (*ar_cublas_destroy_fn)(void *handle);
typedef int (*ar_cublas_set_stream_fn)(void *handle, void *stream);
typedef int (*ar_cublas_get_version_fn)(void *handle, int *version);
typedef int (*ar_cublas_gemm_ex_fn)(void *handle, int transa, int transb, int m, int n, int k, const void *alpha,
                                    const void *a, int a_type, int lda, const void *b, int b_type, int ldb,
                                    const void *beta, void *c, int c_type, int ldc, int compute_type, int algo);
typedef int (*ar_cublas_gemm_strided_batched_ex_fn)(void *handle, int transa, int transb, int m, int n, int k,
                                                    const void *alpha, const void *a, int a_type, int lda,
                                                    long long stride_a, const void *b, int b_type, int ldb,
                                                    long long stride_b, const void *beta, void *c, int c_type,
                                                    int ldc, long long stride_c, int batch_count, int compute_type,
                                                    int algo);

/* The loaded library (one per process). */
typedef struct ar_cublas_api {
    int tried;                        /* the search ran */
    int loaded;
    void *library;
    ar_cublas_create_fn create;
    ar_cublas_destroy_fn destroy;
    ar_cublas_set_stream_fn set_stream;
    ar_cublas_get_version_fn get_version;  /* optional */
    ar_cublas_gemm_ex_fn gemm_ex;
    ar_cublas_gemm_strided_batched_ex_fn gemm_strided_batched_ex;
    char path[512];                   /* the loaded file */
    char tried_text[2048];            /* every place tried and why it failed */
} ar_cublas_api;

/* Loads cuBLAS with dlopen, without touching a GPU: $AR_CUBLAS only when set (a file, or a
 * directory holding libcublas.so.13), else the loader's own search for libcublas.so.13, then
 * /usr/local/cuda/lib64, $CUDA_HOME/lib64 and the nvidia/cu13/lib and nvidia/cublas/lib folders
 * of torch's and the system's Python site-packages.  Returns the entry points, or NULL with
 * every place tried and why in err.  The library stays loaded. */
const ar_cublas_api *ar_cublas_load(char *err, size_t err_len);

/* ar_cublas_load's answer as a path: 0 and the loaded file in path, or -1 and err (the tests
 * ask it whether cuBLAS loads here; a host-only build's stub, cuda_calibrate_stub.c, answers -1). */
int ar_cuda_cublas_probe(char *path, size_t path_len, char *err, size_t err_len);

/* C[b][m][n] = sum_k A[b][m][k] * B[b][k][n] for b < batch, every matrix 16-bit (bf16 or fp16 by
 * bf16), fp32 accumulation, C rounded to the 16-bit type; strides in elements.  C's columns
 * must be contiguous (c_n = 1), and A and B each contiguous along one of their two dimensions
 * (a_k or a_m = 1; b_n or b_k = 1); a batch stride may be 0 (the same matrix for every b). */
typedef struct ar_cublas_gemm {
    int batch, M, N, K;
    const void *A;
    int64_t a_b, a_m, a_k;
    const void *B;
    int64_t b_b, b_k, b_n;
    void *C;
    int64_t c_b, c_m, c_n;
    int bf16;
} ar_cublas_gemm;

/* Runs g on handle's stream (cublasGemmStridedBatchedEx).  Returns cuBLAS's status, or -1 when
 * the library is not loaded or g's strides are outside what the call can express. */
int ar_cublas_gemm_16(void *handle, const ar_cublas_gemm *g);

#ifdef __cplusplus
}
#endif
#endif
