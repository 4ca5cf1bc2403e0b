/* cuda_backend.h - the CUDA paged attention backend "cuda" (vLLM FLASH_ATTN semantics on the
 * paged cache [2, num_blocks, block_size, num_kv_heads, head_size]) and a few hooks the GPU
 * tests and the benchmark use.
 *
 * The backend is kernels/paged/cuda_backend.cu (+ the kernels in cuda_attn.cuh); on a machine
 * without nvcc, kernels/paged/cuda_stub.c defines the same symbols and check() says why it cannot
 * run.  Everything here has C linkage. */
#ifndef AR_CUDA_BACKEND_H
#define AR_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include "../../replay/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const ar_backend ar_cuda_backend;

/* Plan overrides for tests and benchmarks (state from ar_cuda_backend.open): config -1 auto,
 * else one of cuda_attn.cuh's AR_CFG_*: 0 PREFILL (mma.sync, any head size), 1 DECODE (only legal
 * when every (request, KV head) fits in 16 rows; otherwise auto is used), 2 PREFILL_WG (the wgmma
 * kernel: head size 128 on a compute-capability 9.0 device with tensor maps, else PREFILL runs),
 * 3 DECODE_TMA (decode batches on that device; else auto); num_splits 0 = the heuristic, N >= 1 =
 * split every work item's key range into up to N pieces (DECODE_TMA: each request's, in flat
 * launches; its cascade suffix pass stays unsplit).  With an fp8 cache PREFILL_WG runs
 * PREFILL and DECODE_TMA runs DECODE (the fp8-KV kernels are the mma.sync ones). */
void ar_cuda_set_plan(void *state, int config, int num_splits);
/* The same override for the cascade prefix pass only (config -1 / num_splits 0: as
 * ar_cuda_set_plan says, else its own rule), for the prefix-plan sweep in bench_cascade. */
void ar_cuda_set_prefix_plan(void *state, int config, int num_splits);
/* Cascade merge: fused = 1 (the default; AR_CUDA_CASCADE_MERGE=separate in the environment
 * makes it 0) mixes each row with the prefix pass's inside the suffix pass's final write (its
 * last kernel, or its split combine) and times "merge" as 0; fused = 0 runs vLLM's separate
 * merge_attn_states kernel after the suffix pass. */
void ar_cuda_set_cascade_merge(void *state, int fused);
/* Cascade, fused merge, suffix pass on AR_CFG_DECODE_TMA, prefix pass split: fold = 1 (the
 * default; AR_CUDA_CASCADE_FOLD=0 in the environment makes it 0) lets the suffix pass combine
 * the prefix pass's split partials itself instead of a combine kernel after the prefix pass. */
void ar_cuda_set_cascade_fold(void *state, int fold);

/* What the last prepare() planned. */
typedef struct ar_cuda_plan_info {
    int config;          /* AR_CFG_*: 0 PREFILL, 1 DECODE, 2 PREFILL_WG (wgmma, sm_90), 3 DECODE_TMA (sm_90) */
    int template_hd;     /* 64, 128 or 256 */
    int num_work;        /* work items of the attention launch (a CTA each, but see num_ctas) */
    int num_ctas;        /* CTAs launched: num_work, or SMs x ctas_per_sm for a persistent
                            PREFILL_WG launch of more items (each CTA walks several) */
    int num_splits;      /* split count chosen (1 = none) */
    int num_groups;      /* split groups merged by the combine kernel */
    int combine_team;    /* the combine's threads per (row, dim pair) (AR_CUDA_COMBINE_TEAM) */
    int ctas_per_sm;
    int num_sms;
    int has_wgmma;       /* compute capability 9.0 */
    int has_tma;         /* ... and the driver encodes tensor maps: PREFILL_WG and DECODE_TMA can run */
    /* cascade (common_prefix_len > 0): the fields above describe the suffix pass */
    int cascade;           /* 1 when this step runs prefix + suffix + merge */
    int prefix_len;        /* P */
    int prefix_config;     /* geometry of the prefix pass */
    int prefix_num_work;   /* CTAs of the prefix pass */
    int prefix_num_splits; /* its split count */
    int prefix_combine_folded; /* 1: its split combine runs inside the suffix pass (no combine kernel) */
    /* 1: the cache is fp8 e4m3 and every pass above ran the fp8-KV variant of its kernel (config
     * PREFILL -> route "PREFILL fp8-KV", DECODE -> "DECODE fp8-KV"; PREFILL_WG and DECODE_TMA are
     * never planned for an fp8 cache, a forced one included) */
    int kv_fp8;
} ar_cuda_plan_info;
void ar_cuda_plan_of(void *state, ar_cuda_plan_info *info);

/* Runs the data generator on the device: out[i * dim + d] = ar_gen(ar_gen_row(seed, stream,
 * layer, key, pos0 + i, head), d, dist, dtype) for i < num_pos, d < dim, returned as floats.
 * For the bit-identity test.  0 ok; else err set (no device: returns 3). */
int ar_cuda_gen_values(uint64_t seed, uint32_t stream, uint32_t layer, uint64_t key,
                       uint64_t pos0, uint32_t head, int num_pos, int dim, ar_datadist dist,
                       ar_dtype dtype, float *out /* [num_pos, dim] */, char *err, size_t err_len);

/* Runs the cascade merge kernel (vLLM merge_attn_states semantics, see cuda_attn.cuh) once on
 * the device, for the merge tests.  Outputs are rounded to dtype (fp16/bf16) on the way in, as
 * the backend holds them; the merged out comes back as floats of dtype values.
 *   prefix_out, suffix_out, out [num_tokens, num_heads, head_size]
 *   prefix_lse, suffix_lse, lse [num_heads, num_tokens] natural log
 * no_weights: the MERGE_NO_WEIGHTS fault.  0 ok; no device: 3 with err set. */
int ar_cuda_merge_states(ar_dtype dtype, int num_tokens, int num_heads, int head_size,
                         const float *prefix_out, const float *prefix_lse, const float *suffix_out,
                         const float *suffix_lse, int no_weights, float *out, float *lse, char *err,
                         size_t err_len);

/* Overwrites one word inside the device guard region after the out buffer (test hook that
 * proves guard checking works); the next forward must report guard_violations > 0. */
int ar_cuda_poke_guard(void *state);

#ifdef __cplusplus
}
#endif
#endif
