/* ref_gpu.h - the float64 reference and the naive same-dtype yardstick on a CUDA device: the
 * twin of reference/reference.c, reference/mla_ref.c and the per-request arithmetic of
 * replay/verify.c, for verification that never moves a backend's output off the device.
 *
 * It computes from LOGICAL positions through the device data generator (block content keys and
 * request keys of the batch) and never reads a backend's paged cache.  Per step and layer the
 * caller gives the checked rows (replay/verify.c's choice); for each, every query head:
 *   reference  - float64: score = scale q.k (soft-capped), bottom-right causal, sliding window,
 *                softmax and LSE (natural log), out = softmax . V; MLA in the expanded form
 *                (k = [c W_UK | k_pe], v = c W_UV per head), as reference/mla_ref.c;
 *   yardstick  - the naive same-dtype twin with the roundings of ar_naive_dtype_attend (MHA)
 *                and of replay/verify.c's mla_naive_absorbed (MLA);
 * both over the keys in chunks of AR_VERIFY_KEY_CHUNK merged by LSE in float64, as the host
 * verifier does, then compares the backend's output with them on the device.  Only the summary
 * (error sums and maxima, counts, the worst elements) and, for the cross-check against the C
 * reference, one row's reference values come back to the host.
 *
 * Where the work goes: generated K/V (MHA) and up-projected k_nope / v (MLA) are kept in a device
 * block cache (ref_gpu_plan.h) that lives across steps, so a block shared by many requests, or
 * seen again at the next step, is made once.  MLA keys it by (layer, content key).  MHA keys it
 * by content key, a slot holding the block for each of the run's layers: the host plans a step
 * at its first check and its other layers reuse that plan (same batch and rows), and the device
 * makes a layer of a slot on first use (it keeps per slot the content key held and the layers
 * made).  Attention is
 * three passes per group of items: the scores into device scratch, a softmax pass, P.V; the
 * float64 passes run on the FP64 units, the yardstick's (MHA) on the FP32 units.  For MHA the
 * rows of a request with few checked rows (decodes, sampled rows) take fused kernels where the
 * reference and the yardstick share each pass (one read of K for both twins' scores, one read
 * of V for both P.V products, problems of a few rows x one KV head's query heads); a request
 * with many (a prefill chunk checked row by row) takes separate tiled GEMMs, as MLA does; both
 * give the same bits (ATTNREPLAY_GPU_REF_FUSED=0 at open: the GEMMs for every row, =1: the fused
 * kernels for every row, for A/B).  Everything runs on the verifier's own stream after the
 * backend's output is ready (an event on the backend's stream).  Results are deterministic: no floating-point
 * atomics, fixed reduction orders. */
#ifndef AR_REF_GPU_H
#define AR_REF_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../replay/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AR_GPU_REF_WORST 8
#define AR_GPU_REF_CANCELLED 4   /* ar_gpu_ref_check's return when *cancel was raised */

typedef struct ar_gpu_ref ar_gpu_ref;

/* The step's checked rows, in request order and ascending within a request. */
typedef struct ar_gpu_ref_rows {
    int num_rows;
    const int *req_row0;      /* [num_reqs + 1]: request r's checked rows are [req_row0[r], req_row0[r+1]) */
    const int *row;           /* [num_rows] query row within its request */
} ar_gpu_ref_rows;

/* The backend's output of one layer, on the device. */
typedef struct ar_gpu_ref_output {
    const void *out;          /* [num_tokens, num_q_heads, v_head_dim] of type out_type */
    ar_dtype out_type;        /* AR_FP32 (float values) or the run's 16-bit dtype (its bits) */
    const float *lse;         /* [num_q_heads, num_tokens] */
    void *stream;             /* cudaStream_t that wrote them */
} ar_gpu_ref_output;

/* Optional copies back (tests; NULL fields are skipped).  Checked row i, head h. */
typedef struct ar_gpu_ref_copy {
    double *ref_out;          /* [num_rows, num_q_heads, v_head_dim] */
    double *ref_lse;          /* [num_rows, num_q_heads] */
    double *naive_out;        /* [num_rows, num_q_heads, v_head_dim] the merged float64 value, unrounded */
    double *naive_lse;        /* [num_rows, num_q_heads] */
    /* the cross-check probe: heads [probe_head0, probe_head0 + probe_heads) of checked row probe_row */
    int probe_row, probe_head0, probe_heads;
    double *probe_out;        /* [probe_heads, v_head_dim] */
    double *probe_lse;        /* [probe_heads] */
} ar_gpu_ref_copy;

typedef struct ar_gpu_ref_worst {
    int row;                  /* checked-row index */
    int head, dim;
    double got, want, err;
} ar_gpu_ref_worst;

/* Per-step-layer sums and maxima, with the definitions of replay/verify.c's compare_rows. */
typedef struct ar_gpu_ref_summary {
    int64_t elems;
    double sum_abs, sum_sq_err, sum_sq_ref, naive_sum_abs;
    double max_abs, max_rel, lse_max, naive_max, naive_lse_max;
    int64_t bad;
    int64_t nan_count;        /* NaN/Inf anywhere in the output, +Inf/NaN anywhere in the LSE */
    int num_worst;
    ar_gpu_ref_worst worst[AR_GPU_REF_WORST];
    /* where the time went (host wall clock of this call, seconds) */
    double plan_s, device_s;
    int groups;
    int generated_blocks;     /* blocks made (MHA: blocks newly cached when the step was planned; the
                                 device then makes each layer of them at its first check) */
    int rows_fused;           /* MHA: checked rows of the requests on the fused kernels (those of few
                                 checked rows; the others take the tiled GEMMs) */
    /* device time per phase (CUDA events, milliseconds) when ATTNREPLAY_GPU_REF_PROFILE=1 was set at
     * open (each group is then waited for: for measurements, not for runs); for MHA, unless
     * ATTNREPLAY_GPU_REF_FUSED=0, ref_ms holds both twins' work and naive_ms stays 0 */
    double gen_ms, ref_ms, naive_ms, compare_ms;
} ar_gpu_ref_summary;

/* True when this build has the device reference and a CUDA device is present; else false with
 * the reason in why. */
bool ar_gpu_ref_available(char *why, size_t why_len);

/* Opens a device reference for a run on the current CUDA device.  mem_budget: device bytes it
 * may use for its block cache and scratch (0: a share of the memory free now).  0, or -1 with err
 * set (no device, unsupported shape, out of device memory). */
int ar_gpu_ref_open(ar_gpu_ref **g, const ar_run_config *cfg, size_t mem_budget, char *err, size_t err_len);
/* mem_budget for a run that checks nothing but NaN counts (--verify off) and perhaps a dumped
 * step: the least block cache that works and a small scratch */
#define AR_GPU_REF_LEAST ((size_t)1)

/* Counts NaN/Inf in the output (all rows) without checking anything else.  0 or -1. */
int ar_gpu_ref_nan_count(ar_gpu_ref *g, const ar_batch *b, const ar_gpu_ref_output *o, int64_t *nan_count,
                         char *err, size_t err_len);

/* Checks layer `layer` of step b on the rows given: 0 with sum filled; AR_GPU_REF_CANCELLED when
 * *cancel became non-zero (checked between groups of device work); -1 with err set on a device
 * error.  copy may be NULL. */
int ar_gpu_ref_check(ar_gpu_ref *g, const ar_batch *b, int layer, const ar_gpu_ref_rows *rows,
                     const ar_gpu_ref_output *o, const volatile int *cancel, ar_gpu_ref_copy *copy,
                     ar_gpu_ref_summary *sum, char *err, size_t err_len);

/* Block-cache counters since open (for the summary and the tests). */
typedef struct ar_gpu_ref_stats {
    int64_t checks, groups, blocks_used, blocks_generated;
    int cache_slots;
    double cache_gib, scratch_gib;   /* device memory of the block cache and of the scratch */
    double device_s;
    /* with ATTNREPLAY_GPU_REF_PROFILE=1: the summaries' per-phase times added up (milliseconds) */
    double gen_ms, ref_ms, naive_ms, compare_ms;
} ar_gpu_ref_stats;
void ar_gpu_ref_get_stats(const ar_gpu_ref *g, ar_gpu_ref_stats *st);

void ar_gpu_ref_close(ar_gpu_ref *g);

/* Test hook: copies bytes from host src to device address dst (e.g. a NaN into a backend's output).
 * 0 or -1. */
int ar_gpu_ref_test_write(void *dst, const void *src, size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
