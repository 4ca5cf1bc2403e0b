/* cuda_mla.h - the CUDA MLA backend "cuda-mla" (DeepSeek-V2/V3 multi-head latent attention on
 * the latent paged cache [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]) and the
 * hooks its GPU test and benchmark use.
 *
 * The backend is kernels/cuda_mla.cu; on a machine without nvcc, kernels/cuda_mla_stub.c
 * defines the same symbols and check() says why it cannot run.  Everything has C linkage.
 *
 * Data recipe of the backend (bit-identical with the CPU, reference/datagen.h):
 *   latent entry of a token  ar_gen(ar_gen_row(seed, AR_STREAM_LATENT, layer, block key,
 *                            offset in block, head 0), d, dist, dtype), d < 576, then stored
 *                            through ar_kv_roundtrip (fp8 cache: quantize(x / kv_scale));
 *   q_nope [token, head, 128] ar_gen(row(seed, AR_STREAM_Q_NOPE, layer, request key, absolute
 *                            position, head), d, dist, dtype);
 *   q_pe   [token, head, 64]  the same with AR_STREAM_Q_PE;
 *   W_UK[l, head, p]          ar_mla_weight(seed, AR_STREAM_W_UK, layer, 512, l, head, p, dist, dtype)
 *                            (reference/mla_ref.h), l < 512, p < qk_nope_head_dim;
 *   W_UV[l, head, v]          the same with AR_STREAM_W_UV, v < v_head_dim.
 *
 * Latent-attention test cases (ar_cuda_mla_run_case) use their own recipe, FlashMLA's shapes and
 * value distribution (randn / 10 clamped to [-1, 1], tests/test_flash_mla_dense_decoding.py)
 * without weights: q[b, i, n, d] = ar_cuda_mla_case_value(ar_gen(ar_gen_row(seed, AR_STREAM_Q,
 * 0, b, i, n), d, AR_DATA_NORMAL, dtype), dtype), d < 576; the cache entry of logical token j of
 * request b = ar_kv_roundtrip(kv_dtype, dtype, kv_scale, ar_cuda_mla_case_value(ar_gen(
 * ar_gen_row(seed, AR_STREAM_LATENT, 0, 1000003 + b, j, 0), d, AR_DATA_NORMAL, dtype), dtype)),
 * d < 576; logical block k of request b lives in physical block ar_cuda_mla_case_block(b, k,
 * blocks_per_req, num_blocks) (a permutation; with contiguous_blocks 1 + b * blocks_per_req + k).
 * FlashMLA's absolute tolerance (8e-4) is sized
 * for that distribution: with N(0, 1) values the outputs are 10x larger and the softmax far
 * peakier, and rounding P to bf16 before P V (which FlashMLA does too) alone gives ~2e-3. */
#ifndef AR_CUDA_MLA_H
#define AR_CUDA_MLA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "../replay/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const ar_backend ar_cuda_mla_backend;

/* Query length up to which a request takes the absorbed (decode) path, FlashMLA's
 * reorder_batch_threshold; longer ones take the prefill path (semantics 7.3). */
#define AR_CUDA_MLA_DECODE_THRESHOLD 128

/* Latent-attention kernel choice: the tensor-core kernel (mma.sync, 64-row head tiles, split-KV
 * + combine), its variant in which the two column-half warps of a row group split the score
 * tile instead of both computing it (TC_SPLIT_QK: fewer MACs, more barriers), the Hopper kernel
 * on wgmma (TC_WGMMA, kernels/cuda_mla_wgmma.cuh: compute capability 9.0 and a bf16/fp16 cache
 * only), or the plain SIMT kernel kept as a simple fallback.  AUTO runs TC_WGMMA where it can
 * run and some absorbed request has q_len * h_q >= 16; else the narrow 16-row tensor-core kernel
 * (all 8 warps on one 16-row tile: key halves x column quarters) when every request has
 * q_len * h_q <= 16; else TC_SPLIT_QK.  (A case that names a narrow variant runs the narrow
 * kernel wherever it applies.)  The environment variable AR_MLA_KERNEL=simt|tc|
 * tc-split-qk|tc-wgmma selects one for the backend too (tc-wgmma where it cannot run: split-QK;
 * a test case asking for it there fails with code 2 instead); AR_MLA_STAGES=2 keeps the
 * mma.sync 64-row kernels at a 2-tile key ring (3 on Hopper otherwise). */
typedef enum ar_cuda_mla_kernel {
    AR_MLA_KERNEL_AUTO = 0,
    AR_MLA_KERNEL_TC = 1,
    AR_MLA_KERNEL_SIMT = 2,
    AR_MLA_KERNEL_TC_SPLIT_QK = 3,
    AR_MLA_KERNEL_TC_WGMMA = 4
} ar_cuda_mla_kernel;

/* Overrides for tests (state from ar_cuda_mla_backend.open): kernel, forced split count
 * (0 = the heuristic), and whether long queries take the chunked up-projected prefill path
 * (1, the default) or the absorbed path (0). */
void ar_cuda_mla_set_plan(void *state, ar_cuda_mla_kernel kernel, int num_splits, int use_prefill_path);

/* Workspace bound of the prefill path in tokens per context chunk (default 4096; tests use a
 * small one to get several chunks from short contexts).  Values < 16 are read as 16. */
void ar_cuda_mla_set_workspace(void *state, int tokens);

/* What the last forward did. */
typedef struct ar_cuda_mla_plan_info {
    int num_decode_reqs;      /* requests on the absorbed path */
    int num_prefill_reqs;     /* requests on the prefill path */
    int num_work;             /* CTAs of the latent-attention launch */
    int num_groups;           /* row tiles whose split pieces the combine kernel merged */
    int num_context_chunks;   /* prefill context chunks (workspace-bounded) */
    int num_sms;
} ar_cuda_mla_plan_info;
void ar_cuda_mla_plan_of(void *state, ar_cuda_mla_plan_info *info);

/* A FlashMLA-style latent attention case: b requests, s_q query tokens each, h_q heads, one
 * latent KV head, d = 576, dv = 512, paged cache with the given block size.  Inputs are made
 * on the device by the recipe in the file comment. */
typedef struct ar_cuda_mla_case {
    int batch;
    int s_q;
    int h_q;
    const int *seqlens_k;     /* [batch], may be 0 */
    int block_size;           /* 16 or 64 */
    bool causal;              /* bottom-right: query i sees keys < s_k - s_q + i + 1 */
    ar_dtype dtype;           /* bf16 or fp16 */
    ar_dtype kv_dtype;        /* dtype or fp8_e4m3 */
    double kv_scale;
    double scale;             /* softmax scale */
    uint64_t seed;
    ar_cuda_mla_kernel kernel;
    int num_splits;           /* 0 = heuristic, N = cut every row tile's keys into <= N pieces */
    int stages;               /* key-tile stages of the tensor-core kernel: 0 = the most that fit, 2 */
    int repeat;               /* timed launches (median); 0 = no timing */
    bool want_reference;      /* also compute the float64 device reference */
    const unsigned char *ref_requests;   /* [batch]: requests the reference covers (NULL: all) */
    int narrow_variant;       /* where the narrow kernel runs: 0 = AR_MLA_NARROW from the environment
                                 (else the default), v >= 1 = variant v (ar_cuda_mla_narrow_variant_name);
                                 v >= 1 also makes AUTO run the narrow kernel where every request has
                                 <= 16 rows (AUTO's own choice at 16 rows on Hopper is the wgmma kernel) */
    bool force_wg_variant;    /* run wgmma-kernel variant wg_variant (else AR_MLA_WG_VARIANT, else the default) */
    int wg_variant;           /* 0 .. AR_CUDA_MLA_WG_VARIANT_COUNT - 1 (0 = the round-1 kernel, 6 = s1-tma, the default) */
    bool contiguous_blocks;   /* logical block k of request b in physical block 1 + b * blocks_per_req + k
                                 (FlashMLA's benchmark: block_table = arange) instead of the permutation */
} ar_cuda_mla_case;

/* Results (host arrays allocated by the caller; any may be NULL).  LSE follows FlashMLA: a row
 * that sees no key gets out = 0 and LSE = +inf. */
typedef struct ar_cuda_mla_result {
    float *out;               /* [batch, s_q, h_q, 512] */
    float *lse;               /* [batch, h_q, s_q] */
    double *ref_out;          /* [batch, s_q, h_q, 512] float64 reference (want_reference) */
    double *ref_lse;          /* [batch, h_q, s_q] */
    double attn_us;           /* median time of attention + combine (repeat > 0) */
    int num_work, num_groups;
    int stages;               /* stages used (0: the SIMT kernel ran) */
    const char *kernel_name;  /* the kernel that ran: "tc", "tc-split-qk", "tc-wgmma", "tc-narrow" or "simt"
                                 ("tc-wgmma (no TMA map: cp.async twin)": see AR_CUDA_MLA_WG_VARIANT_COUNT) */
    double combine_us;        /* median time of the combine launch alone (inside attn_us) */
    int narrow_variant;       /* the narrow variant that ran (1 = the default), 0 if not narrow */
    const char *narrow_variant_name;
    int wg_variant;           /* the wgmma-kernel variant that ran, -1 if the wgmma kernel did not run */
    const char *wg_variant_name;
} ar_cuda_mla_result;

/* Runs one case.  0 ok; 3 no device / CUDA error; 2 bad case (also: kernel AR_MLA_KERNEL_TC_WGMMA
 * where it cannot run; err then starts "cuda-mla case: the wgmma kernel needs").  err says why.  Device buffers
 * are kept for the next case (grow-only); ar_cuda_mla_release_case_buffers frees them.  With
 * ref_requests set, ref_out rows of the other requests are left untouched. */
int ar_cuda_mla_run_case(const ar_cuda_mla_case *c, ar_cuda_mla_result *res, char *err, size_t err_len);
void ar_cuda_mla_release_case_buffers(void);

/* Variants of the narrow (s_q * h_q <= 16) kernel, numbered 1 .. count; 1 is the default.  A
 * case picks one by narrow_variant, the backend by AR_MLA_NARROW=<name or number>; a variant
 * runs only on sm_90+ with a bf16/fp16 cache and the full ring (else the default runs, and the
 * result says so).  Diagnostic variants compute wrong results by design (timing only).  The
 * names and descriptions are static strings; NULL / false outside 1 .. count. */
int ar_cuda_mla_narrow_variant_count(void);
const char *ar_cuda_mla_narrow_variant_name(int v);
const char *ar_cuda_mla_narrow_variant_about(int v);
bool ar_cuda_mla_narrow_variant_is_diagnostic(int v);

/* Variants of the Hopper wgmma kernel (tc-wgmma), numbered 0 .. AR_CUDA_MLA_WG_VARIANT_COUNT - 1
 * (names: ar_cuda_mla_result.wg_variant_name); 0 is the round-1 kernel, 1 (s1) round 2's, 4 and 5
 * (seesaw, seesaw-rs) round 3's, 6 and 7 (s1-tma, seesaw-rs-tma: s1 and seesaw-rs with the key
 * tiles by TMA) round 4's; 6 is the default since round 4's H200 sweep (bench_mla wgsweep).  A case picks one by force_wg_variant /
 * wg_variant, the backend by AR_MLA_WG_VARIANT=<number or name> (read once).  A TMA variant whose
 * tensor map cannot be made runs its cp.async twin (1 or 5) instead: the result's wg_variant is
 * then the twin and kernel_name "tc-wgmma (no TMA map: cp.async twin)".  A constant, not a
 * function, so that builds without CUDA (cuda_mla_stub.c) need nothing new. */
enum { AR_CUDA_MLA_WG_VARIANT_COUNT = 8 };

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

#ifdef __cplusplus
}
#endif
#endif
