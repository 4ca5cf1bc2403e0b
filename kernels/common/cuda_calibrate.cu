/* cuda_calibrate.cu - measures the two device ceilings that `attnreplay calibrate` stores in the
 * results database (table `ceilings`, replay/db.h) and that report/plan divide by.
 *
 * Method (the same words go into ceilings.method, so a stored number says how it was taken):
 *
 *   Copy bandwidth.  cudaMemcpyAsync device-to-device of one buffer of 4 GiB into another (halved
 *   until both fit in free memory, never below 8x the L2 so the cache cannot serve it), source
 *   filled with random bf16 values.  Each copy is bracketed by two CUDA events on its own stream;
 *   3 warm-up copies, then the median of 20 timed ones.  Bytes counted: read + written, i.e.
 *   2 x size, the convention of the project's device notes (KINDS.md quotes about 4.3 TB/s for an
 *   H200 this way).  GB/s = 1e9 bytes per second.
 *
 *   bf16 matrix rate.  A square GEMM C = A * B with M = N = K = 8192: bf16 inputs and output,
 *   fp32 accumulation, random inputs uniform in [-1, 1) (not zeros: tensor cores draw less power
 *   on zeros and run faster).  Through cuBLAS when it can be loaded at run time with dlopen
 *   (cublasGemmEx, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT, "TN" layout: both operands K-major),
 *   searched as ar_cuda_cublas_probe says; otherwise through the simple mma.sync kernel below,
 *   whose rate is only a lower bound of the device's (the method says so).  3 warm-up products,
 *   then the median of 10 timed ones, each bracketed by CUDA events.  TFLOP/s = 2*M*N*K / time.
 *   64 elements of C are checked against a float64 dot product on the host, so a wrongly called
 *   or wrongly written GEMM cannot report a rate.
 *
 * cuBLAS is not linked: it is loaded at run time by kernels/common/cuda_cublas.cu, so the binary
 * runs on machines without cuBLAS and the build needs no cuBLAS headers. */
#include "cuda_calibrate.h"
#include "cuda_cublas.h"
#include "../../reference/datagen.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAL_WARMUP 3
#define CAL_COPY_ITERS 20
#define CAL_GEMM_ITERS 10
#define CAL_CHECKS 64
#define CAL_DEFAULT_COPY_BYTES ((size_t)4 << 30)
#define CAL_DEFAULT_GEMM_N 8192
#define CAL_MIB ((size_t)1 << 20)

/* ---- device code ------------------------------------------------------------------------------ */

/* x[i] = a bf16 value uniform in [-1, 1), a pure function of (seed, i) through the project's
 * 64-bit mixer (reference/datagen.h). */
__global__ void cal_fill_uniform_bf16(__nv_bfloat16 *x /* [n] */, size_t n, uint32_t seed)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint64_t h = ar_mix64(((uint64_t)seed << 40) ^ i);
        float u = (float)(h >> 40) * (1.0f / 16777216.0f);
        x[i] = __float2bfloat16_rn(2.0f * u - 1.0f);
    }
}

/* The fallback GEMM: C(m, n) = sum_k A[m][k] * B[n][k] with fp32 accumulation through
 * mma.sync.m16n8k16 (bf16 in, fp32 out), stored as bf16 column-major C[n * M + m] - the same
 * layout as the cuBLAS call.  A CTA of 8 warps computes a 128 x 128 tile of C, stepping K by 32;
 * warp (wm, wn) of the 2 x 4 grid owns rows wm*64.. and columns wn*32.., i.e. 4 x 4 mma tiles.
 * Tiles are staged in shared memory K-major with 8 elements of padding per row (80-byte rows:
 * the 8 rows a fragment load touches fall in distinct banks); the next K step is fetched into
 * registers while the current one is multiplied.  Simple on purpose: its rate is a lower bound.
 * Needs M, N multiples of 128 and K a multiple of 32. */
#define CAL_BM 128
#define CAL_BN 128
#define CAL_BK 32
#define CAL_LDS (CAL_BK + 8)
#define CAL_THREADS 256

static __device__ __forceinline__ void cal_mma_bf16(float *d /* [4] */, const uint32_t *a /* [4] */,
                                                    const uint32_t *b /* [2] */)
{
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__global__ void __launch_bounds__(CAL_THREADS)
cal_gemm_bf16_tn(const __nv_bfloat16 *a /* [M, K] */, const __nv_bfloat16 *b /* [N, K] */,
                 __nv_bfloat16 *c /* [N, M] (column-major M x N) */, int m_size, int n_size,
                 int k_size)
{
    __shared__ __align__(16) __nv_bfloat16 a_tile[CAL_BM * CAL_LDS];   /* [128 rows][40] */
    __shared__ __align__(16) __nv_bfloat16 b_tile[CAL_BN * CAL_LDS];   /* [128 cols][40] */
    (void)n_size;
    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const int group = lane >> 2, tig = lane & 3;
    const int warp_m = warp >> 2, warp_n = warp & 3;
    const int m0 = blockIdx.y * CAL_BM, n0 = blockIdx.x * CAL_BN;

    float acc[4][4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    /* A 128 x 32 tile is 512 chunks of 16 bytes: chunk q = tid + 256 * i covers row q / 4,
     * elements (q % 4) * 8 .. +7. */
    uint4 a_next[2], b_next[2];
    const int num_k_tiles = k_size / CAL_BK;
    for (int i = 0; i < 2; i++) {
        int q = tid + CAL_THREADS * i, row = q >> 2, col = (q & 3) * 8;
        a_next[i] = *(const uint4 *)(a + (size_t)(m0 + row) * k_size + col);
        b_next[i] = *(const uint4 *)(b + (size_t)(n0 + row) * k_size + col);
    }
    for (int kt = 0; kt < num_k_tiles; kt++) {
        for (int i = 0; i < 2; i++) {
            int q = tid + CAL_THREADS * i, row = q >> 2, col = (q & 3) * 8;
            *(uint4 *)(a_tile + row * CAL_LDS + col) = a_next[i];
            *(uint4 *)(b_tile + row * CAL_LDS + col) = b_next[i];
        }
        __syncthreads();
        if (kt + 1 < num_k_tiles) {
            size_t k0 = (size_t)(kt + 1) * CAL_BK;
            for (int i = 0; i < 2; i++) {
                int q = tid + CAL_THREADS * i, row = q >> 2, col = (q & 3) * 8;
                a_next[i] = *(const uint4 *)(a + (size_t)(m0 + row) * k_size + k0 + col);
                b_next[i] = *(const uint4 *)(b + (size_t)(n0 + row) * k_size + k0 + col);
            }
        }
        for (int kk = 0; kk < CAL_BK; kk += 16) {
            /* Fragments (PTX ISA, m16n8k16 .bf16): A a0 = (row g, k 2t..2t+1), a1 = row g+8,
             * a2 = k + 8, a3 = row g+8 and k + 8; B b0 = (k 2t..2t+1, col g), b1 = k + 8. */
            uint32_t a_frag[4][4], b_frag[4][2];
            for (int mi = 0; mi < 4; mi++) {
                const __nv_bfloat16 *p =
                    a_tile + (warp_m * 64 + mi * 16 + group) * CAL_LDS + kk + tig * 2;
                a_frag[mi][0] = *(const uint32_t *)p;
                a_frag[mi][1] = *(const uint32_t *)(p + 8 * CAL_LDS);
                a_frag[mi][2] = *(const uint32_t *)(p + 8);
                a_frag[mi][3] = *(const uint32_t *)(p + 8 * CAL_LDS + 8);
            }
            for (int ni = 0; ni < 4; ni++) {
                const __nv_bfloat16 *p =
                    b_tile + (warp_n * 32 + ni * 8 + group) * CAL_LDS + kk + tig * 2;
                b_frag[ni][0] = *(const uint32_t *)p;
                b_frag[ni][1] = *(const uint32_t *)(p + 8);
            }
            for (int mi = 0; mi < 4; mi++)
                for (int ni = 0; ni < 4; ni++) cal_mma_bf16(acc[mi][ni], a_frag[mi], b_frag[ni]);
        }
        __syncthreads();
    }
    /* Accumulators: d0, d1 = (row g, cols 2t, 2t+1); d2, d3 = row g+8. */
    for (int mi = 0; mi < 4; mi++) {
        for (int ni = 0; ni < 4; ni++) {
            size_t row = (size_t)m0 + warp_m * 64 + mi * 16 + group;
            size_t col = (size_t)n0 + warp_n * 32 + ni * 8 + tig * 2;
            c[col * m_size + row] = __float2bfloat16_rn(acc[mi][ni][0]);
            c[(col + 1) * m_size + row] = __float2bfloat16_rn(acc[mi][ni][1]);
            c[col * m_size + row + 8] = __float2bfloat16_rn(acc[mi][ni][2]);
            c[(col + 1) * m_size + row + 8] = __float2bfloat16_rn(acc[mi][ni][3]);
        }
    }
}

/* ---- host side -------------------------------------------------------------------------------- */

/* 0 when e is cudaSuccess; otherwise -1 with "what: CUDA error" in err. */
static int cuda_failed(cudaError_t e, const char *what, char *err, size_t err_len)
{
    if (e == cudaSuccess) return 0;
    snprintf(err, err_len, "%s: %s", what, cudaGetErrorString(e));
    return -1;
}

static int compare_doubles(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Median, min and max of times[n] (sorted in place). */
static void summarize_times(double *times /* [n] */, int n, double *median, double *min,
                            double *max)
{
    qsort(times, (size_t)n, sizeof *times, compare_doubles);
    *median = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    *min = times[0];
    *max = times[n - 1];
}

static float bf16_bits_to_float(uint16_t bits)
{
    uint32_t word = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &word, sizeof f);
    return f;
}

static int fill_random(__nv_bfloat16 *x, size_t n, uint32_t seed, cudaStream_t stream, char *err,
                       size_t err_len)
{
    cal_fill_uniform_bf16<<<1024, 256, 0, stream>>>(x, n, seed);
    return cuda_failed(cudaGetLastError(), "launching the fill kernel", err, err_len);
}

/* Times CAL_WARMUP untimed then `iters` timed runs of one operation, each bracketed by events.
 * kind 0: copy; 1: cuBLAS GEMM; 2: built-in GEMM. */
typedef struct {
    int kind;
    cudaStream_t stream;
    void *dst;
    const void *src;
    size_t bytes;
    void *cublas_handle;
    const ar_cublas_api *cublas;
    const __nv_bfloat16 *a, *b;
    __nv_bfloat16 *c;
    int n;
} timed_op;

static int run_op(const timed_op *op, char *err, size_t err_len)
{
    if (op->kind == 0)
        return cuda_failed(cudaMemcpyAsync(op->dst, op->src, op->bytes, cudaMemcpyDeviceToDevice,
                                           op->stream), "cudaMemcpyAsync", err, err_len);
    if (op->kind == 1) {
        const float alpha = 1.0f, beta = 0.0f;
        int status = op->cublas->gemm_ex(op->cublas_handle, AR_CUBLAS_OP_T, AR_CUBLAS_OP_N, op->n, op->n,
                                         op->n, &alpha, op->a, AR_CUDA_R_16BF, op->n, op->b, AR_CUDA_R_16BF,
                                         op->n, &beta, op->c, AR_CUDA_R_16BF, op->n, AR_CUBLAS_COMPUTE_32F,
                                         AR_CUBLAS_GEMM_DEFAULT);
        if (status != 0) {
            snprintf(err, err_len, "cublasGemmEx returned status %d", status);
            return -1;
        }
        return cuda_failed(cudaGetLastError(), "cublasGemmEx", err, err_len);
    }
    dim3 grid((unsigned)(op->n / CAL_BN), (unsigned)(op->n / CAL_BM));
    cal_gemm_bf16_tn<<<grid, CAL_THREADS, 0, op->stream>>>(op->a, op->b, op->c, op->n, op->n,
                                                           op->n);
    return cuda_failed(cudaGetLastError(), "launching the built-in GEMM", err, err_len);
}

static int time_op(const timed_op *op, int iters, double *times_ms /* [iters] */, char *err,
                   size_t err_len)
{
    cudaEvent_t start = NULL, stop = NULL;
    int rc = -1;
    if (cuda_failed(cudaEventCreate(&start), "cudaEventCreate", err, err_len) ||
        cuda_failed(cudaEventCreate(&stop), "cudaEventCreate", err, err_len))
        goto done;
    for (int i = 0; i < CAL_WARMUP; i++)
        if (run_op(op, err, err_len)) goto done;
    if (cuda_failed(cudaStreamSynchronize(op->stream), "warm-up", err, err_len)) goto done;
    for (int i = 0; i < iters; i++) {
        float ms = 0.0f;
        if (cuda_failed(cudaEventRecord(start, op->stream), "cudaEventRecord", err, err_len) ||
            run_op(op, err, err_len) ||
            cuda_failed(cudaEventRecord(stop, op->stream), "cudaEventRecord", err, err_len) ||
            cuda_failed(cudaEventSynchronize(stop), "timed run", err, err_len) ||
            cuda_failed(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime", err,
                        err_len))
            goto done;
        times_ms[i] = ms;
    }
    rc = 0;
done:
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    return rc;
}

static int measure_copy(const ar_calibrate_options *opt, const cudaDeviceProp *prop,
                        cudaStream_t stream, ar_calibration *out, char *err, size_t err_len)
{
    size_t l2_bytes = prop->l2CacheSize > 0 ? (size_t)prop->l2CacheSize : 0;
    size_t floor_bytes = 8 * l2_bytes;
    size_t free_bytes = 0, total_bytes = 0;
    if (cuda_failed(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo", err, err_len))
        return 3;
    size_t bytes = opt->copy_bytes ? opt->copy_bytes : CAL_DEFAULT_COPY_BYTES;
    if (!opt->copy_bytes) {
        /* Two buffers plus 256 MiB of slack for the GEMM library and the context. */
        while (bytes / 2 >= floor_bytes && bytes > 64 * CAL_MIB && 2 * bytes + 256 * CAL_MIB > free_bytes) bytes /= 2;
    }
    if (bytes < floor_bytes) {
        snprintf(err, err_len, "copy buffer of %zu MiB is under 8x the %zu MiB L2; the cache "
                 "would inflate the bandwidth", bytes / CAL_MIB, l2_bytes / CAL_MIB);
        return 2;
    }
    if (2 * bytes > free_bytes) {
        snprintf(err, err_len, "two copy buffers of %zu MiB do not fit in the %zu MiB free "
                 "(need at least 8x the %zu MiB L2 each)", bytes / CAL_MIB,
                 free_bytes / CAL_MIB, l2_bytes / CAL_MIB);
        return 3;
    }
    void *src = NULL, *dst = NULL;
    double times[CAL_COPY_ITERS];
    int rc = 3;
    timed_op op;
    memset(&op, 0, sizeof op);
    if (cuda_failed(cudaMalloc(&src, bytes), "cudaMalloc (copy source)", err, err_len) ||
        cuda_failed(cudaMalloc(&dst, bytes), "cudaMalloc (copy destination)", err, err_len) ||
        fill_random((__nv_bfloat16 *)src, bytes / 2, 0x5eed0001u, stream, err, err_len))
        goto done;
    op.kind = 0;
    op.stream = stream;
    op.dst = dst;
    op.src = src;
    op.bytes = bytes;
    if (time_op(&op, CAL_COPY_ITERS, times, err, err_len)) goto done;
    summarize_times(times, CAL_COPY_ITERS, &out->copy_median_ms, &out->copy_min_ms,
                    &out->copy_max_ms);
    out->copy_bytes = bytes;
    out->copy_gbps = 2.0 * (double)bytes / (out->copy_median_ms * 1e-3) / 1e9;
    rc = 0;
done:
    if (src) cudaFree(src);
    if (dst) cudaFree(dst);
    return rc;
}

/* Checks CAL_CHECKS elements of C (bf16, column-major) against float64 dot products of the
 * operand rows copied back.  Tolerance per element: 2^-7 |want| (bf16 output rounding, with
 * margin) + 1e-5 sum |a*b| (fp32 accumulation); a wrong element of this random product is off by
 * about sqrt(K)/3, far above it.  Returns 0 when all pass; the worst error / tolerance in *worst. */
static int check_gemm(const __nv_bfloat16 *a, const __nv_bfloat16 *b, const __nv_bfloat16 *c,
                      int n, double *worst, char *err, size_t err_len)
{
    uint16_t *row_a = (uint16_t *)malloc((size_t)n * sizeof *row_a);
    uint16_t *row_b = (uint16_t *)malloc((size_t)n * sizeof *row_b);
    int rc = -1;
    uint64_t state = 0x9e3779b97f4a7c15ull;
    *worst = 0.0;
    if (!row_a || !row_b) {
        snprintf(err, err_len, "out of host memory for the GEMM check");
        goto done;
    }
    for (int t = 0; t < CAL_CHECKS; t++) {
        int m_index, n_index;
        if (t == 0) {
            m_index = 0;
            n_index = 0;
        } else if (t == 1) {
            m_index = n - 1;
            n_index = n - 1;
        } else {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            m_index = (int)((state >> 33) % (uint64_t)n);
            n_index = (int)((state >> 13) % (uint64_t)n);
        }
        uint16_t got_bits = 0;
        if (cuda_failed(cudaMemcpy(row_a, a + (size_t)m_index * n, (size_t)n * 2,
                                   cudaMemcpyDeviceToHost), "reading A for the check", err, err_len) ||
            cuda_failed(cudaMemcpy(row_b, b + (size_t)n_index * n, (size_t)n * 2,
                                   cudaMemcpyDeviceToHost), "reading B for the check", err, err_len) ||
            cuda_failed(cudaMemcpy(&got_bits, c + (size_t)n_index * n + m_index, 2,
                                   cudaMemcpyDeviceToHost), "reading C for the check", err, err_len))
            goto done;
        double want = 0.0, magnitude = 0.0;
        for (int k = 0; k < n; k++) {
            double p = (double)bf16_bits_to_float(row_a[k]) * (double)bf16_bits_to_float(row_b[k]);
            want += p;
            magnitude += p < 0 ? -p : p;
        }
        double got = bf16_bits_to_float(got_bits);
        double tolerance = 0.0078125 * (want < 0 ? -want : want) + 1e-5 * magnitude + 1e-6;
        double diff = got - want;
        double ratio = (diff < 0 ? -diff : diff) / tolerance;
        if (!(ratio <= 1.0)) {
            snprintf(err, err_len, "GEMM check failed at C[%d][%d]: got %.6g, want %.6g "
                     "(tolerance %.3g)", m_index, n_index, got, want, tolerance);
            *worst = ratio;
            goto done;
        }
        if (ratio > *worst) *worst = ratio;
    }
    rc = 0;
done:
    free(row_a);
    free(row_b);
    return rc;
}

static int measure_gemm(const ar_calibrate_options *opt, cudaStream_t stream, ar_calibration *out,
                        char *reason, size_t reason_len, char *err, size_t err_len)
{
    int n = opt->gemm_n ? opt->gemm_n : CAL_DEFAULT_GEMM_N;
    size_t elems = (size_t)n * (size_t)n;
    __nv_bfloat16 *a = NULL, *b = NULL, *c = NULL;
    void *handle = NULL;
    double times[CAL_GEMM_ITERS];
    int rc = 3;
    timed_op op;
    memset(&op, 0, sizeof op);
    out->gemm_n = n;

    if (cuda_failed(cudaMalloc((void **)&a, elems * 2), "cudaMalloc (GEMM A)", err, err_len) ||
        cuda_failed(cudaMalloc((void **)&b, elems * 2), "cudaMalloc (GEMM B)", err, err_len) ||
        cuda_failed(cudaMalloc((void **)&c, elems * 2), "cudaMalloc (GEMM C)", err, err_len) ||
        fill_random(a, elems, 0x5eed0002u, stream, err, err_len) ||
        fill_random(b, elems, 0x5eed0003u, stream, err, err_len) ||
        cuda_failed(cudaMemsetAsync(c, 0, elems * 2, stream), "cudaMemsetAsync", err, err_len) ||
        cuda_failed(cudaStreamSynchronize(stream), "filling the GEMM operands", err, err_len))
        goto done;

    op.stream = stream;
    op.a = a;
    op.b = b;
    op.c = c;
    op.n = n;
    op.kind = 2;
    if (opt->no_cublas) {
        snprintf(reason, reason_len, "--no-cublas");
    } else {
        char why[2600];
        const ar_cublas_api *cublas = ar_cublas_load(why, sizeof why);
        const char *path = cublas ? cublas->path : "";
        if (!cublas) {
            fprintf(stderr, "calibrate: %s; timing the built-in kernel instead (a lower bound)\n",
                    why);
            snprintf(reason, reason_len, "cuBLAS not found");
        } else {
            int status = cublas->create(&handle);
            if (status != 0) {
                handle = NULL;
                fprintf(stderr, "calibrate: cublasCreate_v2 (%s) returned status %d; timing the "
                        "built-in kernel instead (a lower bound)\n", path, status);
                snprintf(reason, reason_len, "cublasCreate failed with status %d", status);
            } else if ((status = cublas->set_stream(handle, stream)) != 0) {
                snprintf(err, err_len, "cublasSetStream_v2 returned status %d", status);
                goto done;
            } else {
                int version = 0;
                if (cublas->get_version) cublas->get_version(handle, &version);
                snprintf(out->gemm_engine, sizeof out->gemm_engine, "cuBLAS %d (%.480s)", version,
                         path);
                op.kind = 1;
                op.cublas_handle = handle;
                op.cublas = cublas;
            }
        }
    }
    if (op.kind == 2)
        snprintf(out->gemm_engine, sizeof out->gemm_engine,
                 "built-in mma.sync m16n8k16 kernel, 128x128x32 tiles");
    if (op.kind == 2 && (n % CAL_BM != 0 || n % CAL_BK != 0)) {
        snprintf(err, err_len, "the built-in GEMM needs n a multiple of 128 (got %d)", n);
        rc = 2;
        goto done;
    }
    out->used_cublas = op.kind == 1;
    if (time_op(&op, CAL_GEMM_ITERS, times, err, err_len)) goto done;
    if (check_gemm(a, b, c, n, &out->gemm_check_worst, err, err_len)) goto done;
    summarize_times(times, CAL_GEMM_ITERS, &out->gemm_median_ms, &out->gemm_min_ms,
                    &out->gemm_max_ms);
    out->bf16_tflops = 2.0 * (double)n * (double)n * (double)n / (out->gemm_median_ms * 1e-3) /
                       1e12;
    rc = 0;
done:
    if (handle) ar_cublas_load(NULL, 0)->destroy(handle);   /* loaded: a handle exists */
    if (a) cudaFree(a);
    if (b) cudaFree(b);
    if (c) cudaFree(c);
    return rc;
}

int ar_cuda_calibrate(const ar_calibrate_options *opt, ar_calibration *out, char *err,
                      size_t err_len)
{
    ar_calibrate_options defaults;
    memset(&defaults, 0, sizeof defaults);
    if (!opt) opt = &defaults;
    memset(out, 0, sizeof *out);
    if (opt->gemm_n < 0 || opt->gemm_n % 128 != 0) {
        snprintf(err, err_len, "GEMM size %d is not a positive multiple of 128", opt->gemm_n);
        return 2;
    }

    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(err, err_len, "no CUDA device (%s)", cudaGetErrorString(e));
        cudaGetLastError();
        return 3;
    }
    if (count == 0) {
        snprintf(err, err_len, "no CUDA device (cudaGetDeviceCount found 0)");
        return 3;
    }
    cudaDeviceProp prop;
    if (cuda_failed(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties", err, err_len) ||
        cuda_failed(cudaSetDevice(0), "cudaSetDevice", err, err_len))
        return 3;
    if (prop.major < 8) {
        snprintf(err, err_len, "%s has compute capability %d.%d; calibrate needs 8.0 or newer",
                 prop.name, prop.major, prop.minor);
        return 3;
    }
    snprintf(out->device, sizeof out->device, "%s", prop.name);

    cudaStream_t stream = NULL;
    if (cuda_failed(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                    "cudaStreamCreate", err, err_len))
        return 3;
    char reason[128] = "";
    int rc = measure_copy(opt, &prop, stream, out, err, err_len);
    if (rc == 0) rc = measure_gemm(opt, stream, out, reason, sizeof reason, err, err_len);
    cudaStreamDestroy(stream);
    if (rc != 0) return rc;

    int l2_mib = prop.l2CacheSize / (1 << 20);
    char copy_part[300], gemm_part[700];
    snprintf(copy_part, sizeof copy_part,
             "copy: cudaMemcpyAsync device-to-device of %zu MiB (L2 %d MiB), CUDA events, "
             "%d warm-up + median of %d, bytes read + written (2 x size)",
             out->copy_bytes / CAL_MIB, l2_mib, CAL_WARMUP, CAL_COPY_ITERS);
    if (out->used_cublas)
        snprintf(gemm_part, sizeof gemm_part,
                 "bf16: %.400s cublasGemmEx %d^3 TN, bf16 in/out, fp32 accumulate "
                 "(CUBLAS_COMPUTE_32F), random [-1,1), %d warm-up + median of %d, "
                 "2*M*N*K/time, %d elements checked", out->gemm_engine, out->gemm_n,
                 CAL_WARMUP, CAL_GEMM_ITERS, CAL_CHECKS);
    else
        snprintf(gemm_part, sizeof gemm_part,
                 "bf16: LOWER BOUND (%.100s): %.400s %d^3, bf16 in/out, fp32 accumulate, "
                 "random [-1,1), %d warm-up + median of %d, 2*M*N*K/time, %d elements checked",
                 reason, out->gemm_engine, out->gemm_n, CAL_WARMUP, CAL_GEMM_ITERS, CAL_CHECKS);
    snprintf(out->method, sizeof out->method, "%.300s; %.700s", copy_part, gemm_part);
    return 0;
}
