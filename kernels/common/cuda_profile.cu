/* cuda_profile.cu - times the GEMMs of a model's layers for `attnreplay profile` (sim/profile.c).
 *
 * Method: for one linear layer's shape (K inputs, N outputs, per tensor-parallel rank), random
 * bf16 weights W[N, K] and activations act[M_max, K] uniform in [-1, 1) are made on the device
 * once; for every token count M, out[M, N] = act[M, K] x W^T runs through cublasGemmEx (bf16 in
 * and out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT; cuBLAS "TN": both operands K-major), 3
 * warm-up calls, then `repeat` timed calls each between two CUDA events on one stream; the median
 * is kept.  The weights of one layer's GEMM (tens of MB) exceed what one call leaves in L2 only
 * for the larger shapes, as in a real forward pass where the layers' weights follow each other.
 *
 * cuBLAS is found and loaded as `attnreplay calibrate` does (kernels/common/cuda_cublas.h,
 * dlopen), so the build needs no cuBLAS headers and the binary no cuBLAS at link time. */
#include "cuda_profile.h"
#include "cuda_cublas.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROF_WARMUP 3

static int prof_cuda_failed(cudaError_t e, const char *what, char *err, size_t err_len)
{
    if (e == cudaSuccess) return 0;
    snprintf(err, err_len, "%s: %s", what, cudaGetErrorString(e));
    return 3;
}

int ar_cuda_profile_device(char *name, size_t len, char *err, size_t err_len)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(err, err_len, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
        return 3;
    }
    cudaDeviceProp prop;
    if (prof_cuda_failed(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties", err, err_len)) return 3;
    snprintf(name, len, "%s", prop.name);
    return 0;
}

/* Uniform [-1, 1) bf16 from a counter hash (no RNG state). */
static __global__ void prof_fill(__nv_bfloat16 *x, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        x[i] = __float2bfloat16((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

static int prof_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int ar_cuda_profile_gemm(int k, int n, const int *ms, int num_m, int repeat, double *us, char *engine,
                         size_t engine_len, char *err, size_t err_len)
{
    char dev[256];
    if (ar_cuda_profile_device(dev, sizeof dev, err, err_len) != 0) return 3;
    const ar_cublas_api *cublas = ar_cublas_load(err, err_len);
    if (!cublas) return 3;
    snprintf(engine, engine_len, "cuBLAS (%s)", cublas->path);
    if (repeat < 1) repeat = 1;
    int max_m = 1;
    for (int i = 0; i < num_m; i++) max_m = ms[i] > max_m ? ms[i] : max_m;
    __nv_bfloat16 *w = NULL, *act = NULL, *out = NULL;
    cudaStream_t stream = NULL;
    cudaEvent_t start = NULL, stop = NULL;
    void *handle = NULL;
    double *times = (double *)malloc((size_t)repeat * sizeof(double));
    int rc = 3;
    if (!times) { snprintf(err, err_len, "out of memory"); goto done; }
    if (prof_cuda_failed(cudaMalloc(&w, (size_t)n * k * sizeof *w), "cudaMalloc weights", err, err_len) ||
        prof_cuda_failed(cudaMalloc(&act, (size_t)max_m * k * sizeof *act), "cudaMalloc activations", err, err_len) ||
        prof_cuda_failed(cudaMalloc(&out, (size_t)max_m * n * sizeof *out), "cudaMalloc output", err, err_len) ||
        prof_cuda_failed(cudaStreamCreate(&stream), "cudaStreamCreate", err, err_len) ||
        prof_cuda_failed(cudaEventCreate(&start), "cudaEventCreate", err, err_len) ||
        prof_cuda_failed(cudaEventCreate(&stop), "cudaEventCreate", err, err_len))
        goto done;
    prof_fill<<<1024, 256, 0, stream>>>(w, (size_t)n * k, 12345u);
    prof_fill<<<1024, 256, 0, stream>>>(act, (size_t)max_m * k, 777u);
    if (prof_cuda_failed(cudaStreamSynchronize(stream), "filling the inputs", err, err_len)) goto done;
    if (cublas->create(&handle) != 0 || cublas->set_stream(handle, stream) != 0) {
        snprintf(err, err_len, "cublasCreate/cublasSetStream failed");
        goto done;
    }
    for (int i = 0; i < num_m; i++) {
        const float alpha = 1.0f, beta = 0.0f;
        for (int r = 0; r < PROF_WARMUP + repeat; r++) {
            if (r >= PROF_WARMUP && prof_cuda_failed(cudaEventRecord(start, stream), "cudaEventRecord", err, err_len))
                goto done;
            /* column-major: C[n x m] = W^T' x act': W stored [N, K] row-major = K x N column-major */
            int status = cublas->gemm_ex(handle, AR_CUBLAS_OP_T, AR_CUBLAS_OP_N, n, ms[i], k, &alpha, w, AR_CUDA_R_16BF,
                                         k, act, AR_CUDA_R_16BF, k, &beta, out, AR_CUDA_R_16BF, n,
                                         AR_CUBLAS_COMPUTE_32F, AR_CUBLAS_GEMM_DEFAULT);
            if (status != 0) {
                snprintf(err, err_len, "cublasGemmEx(M=%d, N=%d, K=%d) returned status %d", ms[i], n, k, status);
                goto done;
            }
            if (r < PROF_WARMUP) continue;
            float ms_elapsed = 0;
            if (prof_cuda_failed(cudaEventRecord(stop, stream), "cudaEventRecord", err, err_len) ||
                prof_cuda_failed(cudaEventSynchronize(stop), "cudaEventSynchronize", err, err_len) ||
                prof_cuda_failed(cudaEventElapsedTime(&ms_elapsed, start, stop), "cudaEventElapsedTime", err, err_len))
                goto done;
            times[r - PROF_WARMUP] = 1000.0 * ms_elapsed;
        }
        qsort(times, (size_t)repeat, sizeof *times, prof_cmp);
        us[i] = repeat % 2 ? times[repeat / 2] : 0.5 * (times[repeat / 2 - 1] + times[repeat / 2]);
    }
    rc = 0;
done:
    if (handle) cublas->destroy(handle);
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    if (stream) cudaStreamDestroy(stream);
    cudaFree(w);
    cudaFree(act);
    cudaFree(out);
    free(times);
    return rc;
}
