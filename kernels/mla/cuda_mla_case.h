/* cuda_mla_case.h - the test hook of the cuda-mla backend: one FlashMLA-shaped latent-attention
 * case (b requests, s_q query tokens each, h_q heads, one latent KV head, d = 576, dv = 512, a
 * paged cache) run through the backend's decode launch (the decision function, the planner, the
 * kernels and the combine of kernels/mla/mla_decode.cu), optionally timed, optionally beside a
 * float64 device reference.  kernels/mla/cuda_mla_case.cu holds it (and the reference);
 * cuda_mla_case_stub.c stands in without nvcc.  Linked into the GPU tests, the benchmarks and
 * kernels/lab/, not into bin/attnreplay.  C linkage.
 *
 * Inputs follow FlashMLA's test (randn / 10 clamped to [-1, 1], tests/test_flash_mla_dense_
 * decoding.py) and are made on the device without weights: q[b, i, n, d] =
 * ar_cuda_mla_case_value(ar_gen(ar_gen_row(seed, AR_STREAM_Q, 0, b, i, n), d, AR_DATA_NORMAL,
 * dtype), dtype), d < 576 (times 2^(8 (n % 5) - 16) with q_spread); the cache entry of logical
 * token j of request b =
 * ar_kv_roundtrip(kv_dtype, dtype, kv_scale, ar_cuda_mla_case_value(ar_gen(ar_gen_row(seed,
 * AR_STREAM_LATENT, 0, 1000003 + b, j, 0), d, AR_DATA_NORMAL, dtype), dtype)), d < 576; logical
 * block k of request b lives in physical block ar_cuda_mla_case_block(b, k, blocks_per_req,
 * num_blocks) (a permutation; with contiguous_blocks 1 + b * blocks_per_req + k).  FlashMLA's
 * absolute tolerance (8e-4) is sized for that distribution: with N(0, 1) values the outputs are
 * 10x larger and the softmax far peakier, and rounding P to bf16 before P V (which FlashMLA does
 * too) alone gives ~2e-3. */
#ifndef AR_CUDA_MLA_CASE_H
#define AR_CUDA_MLA_CASE_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "cuda_mla.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ar_cuda_mla_case {
    int batch;
    int s_q;
    int h_q;
    const int *seqlens_k;     /* [batch], may be 0 */
    int block_size;           /* 16, 32 or 64 */
    bool causal;              /* bottom-right: query i sees keys < s_k - s_q + i + 1 */
    ar_dtype dtype;           /* bf16 or fp16 */
    ar_dtype kv_dtype;        /* dtype or fp8_e4m3 */
    double kv_scale;
    double scale;             /* softmax scale */
    uint64_t seed;
    ar_cuda_mla_kernel kernel;
    int num_splits;           /* 0 = heuristic, N = cut every row tile's keys into <= N pieces */
    int stages;               /* key-ring slots of the mma.sync kernels: 0 = the most that fit, 2 */
    int repeat;               /* timed samples (median); 0 = no timing */
    bool back_to_back_only;   /* time only the back-to-back samples (attn_us; the launches a sample
                                 from three single launches), not the single-launch ones */
    bool want_reference;      /* also compute the float64 device reference */
    const unsigned char *ref_requests;   /* [batch]: requests the reference covers (NULL: all) */
    bool wgmma_cpasync;       /* where the wgmma kernel runs: its cp.async key loads (what runs where
                                 the cache's tensor map cannot be made) instead of TMA */
    bool contiguous_blocks;   /* logical block k of request b in physical block 1 + b * blocks_per_req + k
                                 (FlashMLA's benchmark: block_table = arange) instead of the permutation */
    bool q_spread;            /* query head n scaled by 2^(8 (n % 5) - 16): rows 2^32 apart in magnitude
                                 (bf16 queries; an fp16 one would overflow) */
} ar_cuda_mla_case;

/* Results (host arrays allocated by the caller; any may be NULL).  LSE follows FlashMLA: a row
 * that sees no key gets out = 0 and LSE = +inf. */
typedef struct ar_cuda_mla_result {
    float *out;               /* [batch, s_q, h_q, 512] */
    float *lse;               /* [batch, h_q, s_q] */
    double *ref_out;          /* [batch, s_q, h_q, 512] float64 reference (want_reference) */
    double *ref_lse;          /* [batch, h_q, s_q] */
    double attn_us;           /* attention + combine (repeat > 0), as the peers are timed: the
                                 median over repeat samples of reps back-to-back launches */
    double attn_single_us;    /* the same, one launch a sample on an idle GPU (its host-side
                                 launch cost inside) */
    int reps;                 /* launches a sample of attn_us (about 2 ms of GPU work, 1-50) */
    double combine_us;        /* median time of the combine launch alone (inside attn_single_us) */
    int num_work, num_groups;
    int num_pieces;           /* the plan's pieces (work items): more than num_work where a
                                 persistent plan chains several pieces on one CTA */
    int stages;               /* key-ring slots used (0: the SIMT kernel ran) */
    const char *kernel_name;  /* the kernel that ran: "tc-wgmma", "tc-wgmma (cp.async)", "tc-narrow-bulk",
                                 "tc-narrow", "tc-split-qk" or "simt" (or the lab kernel's name) */
} ar_cuda_mla_result;

/* Runs one case.  0 ok; 3 no device / CUDA error; 2 bad case (also: kernel AR_MLA_KERNEL_TC_WGMMA
 * where it cannot run; err then starts "cuda-mla case: the wgmma kernel needs").  err says why.
 * Device buffers are kept for the next case (grow-only); ar_cuda_mla_release_case_buffers frees
 * them.  With ref_requests set, ref_out rows of the other requests are left untouched. */
int ar_cuda_mla_run_case(const ar_cuda_mla_case *c, ar_cuda_mla_result *res, char *err, size_t err_len);
void ar_cuda_mla_release_case_buffers(void);

/* A FlashMLA test input from a standard normal draw x: x / 10 clamped to [-1, 1], rounded to
 * dtype (division rounded to nearest on the device too, whatever the fast-math flags). */
AR_HOSTDEV float ar_cuda_mla_case_value(float x, ar_dtype dtype)
{
#ifdef __CUDA_ARCH__
    float y = __fdiv_rn(x, 10.0f);
#else
    float y = x / 10.0f;
#endif
    y = y < -1.0f ? -1.0f : y > 1.0f ? 1.0f : y;
    return ar_round_to(dtype, y);
}

/* Physical block of logical block k of request b in a test case: a fixed permutation of
 * [1, num_blocks) (block 0 stays the null block); num_blocks = batch * blocks_per_req + 1. */
AR_HOSTDEV int ar_cuda_mla_case_block(int b, int k, int blocks_per_req, int num_blocks)
{
    int64_t n = num_blocks - 1;
    int64_t stride = n % 7919 != 0 ? 7919 : 1;   /* 7919 is prime: a bijection on [0, n) */
    int64_t logical = (int64_t)b * blocks_per_req + k;
    return (int)(1 + (logical * stride) % n);
}

/* FlashMLA's benchmark case (its test's value recipe): batch requests of 1 query token, one
 * latent KV head, bf16 latents and cache, block size 64, causal, softmax scale 1/24, seed 7, the
 * wgmma kernel where AUTO runs it, 20 timed launches; h_q and seqlens_k [batch] are the caller's.
 * bench_mla and kernels/lab/ time it. */
static inline ar_cuda_mla_case ar_cuda_mla_bench_case(int batch, int h_q, const int *seqlens_k)
{
    ar_cuda_mla_case c;
    memset(&c, 0, sizeof c);
    c.batch = batch;
    c.s_q = 1;
    c.h_q = h_q;
    c.seqlens_k = seqlens_k;
    c.block_size = 64;
    c.causal = true;
    c.dtype = AR_BF16;
    c.kv_dtype = AR_BF16;
    c.kv_scale = 1.0;
    c.scale = 1.0 / 24.0;
    c.seed = 7;
    c.kernel = AR_MLA_KERNEL_AUTO;
    c.repeat = 20;
    return c;
}

/* Max |out - float64 reference| and max |LSE - reference| (equal infinities count as 0) over the
 * requests sel [batch] marks, of a result of s_q = 1 (out [batch, h_q, 512], lse [batch, h_q]);
 * a NaN sticks. */
static inline void ar_cuda_mla_ref_errors(const ar_cuda_mla_result *r, const unsigned char *sel, int batch, int h_q,
                                          double *err_out, double *err_lse)
{
    *err_out = *err_lse = 0;
    for (int b = 0; b < batch; b++) {
        if (!sel[b]) continue;
        for (size_t i = (size_t)b * h_q * 512; i < (size_t)(b + 1) * h_q * 512; i++) {
            double d = fabs((double)r->out[i] - r->ref_out[i]);
            if (!(d <= *err_out)) *err_out = d;
        }
        for (size_t i = (size_t)b * h_q; i < (size_t)(b + 1) * h_q; i++) {
            double d = isinf(r->lse[i]) && isinf(r->ref_lse[i]) ? 0 : fabs((double)r->lse[i] - r->ref_lse[i]);
            if (!(d <= *err_lse)) *err_lse = d;
        }
    }
}

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda.h>
namespace ar_mla {
struct attn_args;
}
/* For kernels/lab/: a kernel to time and check in place of the route's attention kernel.  It
 * runs on the plan and combine the decision function chose for the case (64-row work items and
 * the row-parallel combine where AUTO runs the wgmma kernel), with the same inputs and
 * reference; launch(a, num_ctas, tmap, stream) launches it (tmap: the cache's tensor map, NULL
 * with wgmma_cpasync or off the wgmma route) and returns the launch's error. */
typedef cudaError_t (*ar_cuda_mla_lab_launch)(const ar_mla::attn_args *a, int num_ctas, const CUtensorMap *tmap,
                                              cudaStream_t stream);
typedef struct ar_cuda_mla_lab_kernel {
    const char *name;
    ar_cuda_mla_lab_launch launch;
} ar_cuda_mla_lab_kernel;
int ar_cuda_mla_run_case_with(const ar_cuda_mla_case *c, const ar_cuda_mla_lab_kernel *k, ar_cuda_mla_result *res,
                              char *err, size_t err_len);
#endif

#endif
