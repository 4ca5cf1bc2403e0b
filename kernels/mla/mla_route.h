/* mla_route.h - the cuda-mla backend's decision function: which decode kernel runs a launch (the
 * route), from what the device can run and the most rows (query tokens x heads) of a request,
 * the plan that route takes (mla_plan.h) and the kernel path it records.  Plain C, host only, so
 * that tests/test_mla_route.c checks every decision without a GPU; mla_decode.cu probes the
 * device (mla_probe) and launches the route's kernel.
 *
 * The decision (ar_mla_choose):
 *   compute capability 9.0, 16-bit latent cache:
 *     some request with > 32 rows      the wgmma route: attn_wgmma_pairs_kernel (the default;
 *                                      attn_wgmma_cpasync_kernel where the cache's tensor map
 *                                      cannot be made or the block size is 16)
 *     every request with <= 32 rows    attn_wgmma16_kernel<., 16 or 32> (the same products
 *                                      transposed: the rows are the instructions' N side; the
 *                                      64-row cp.async kernel where the tensor map cannot be made)
 *   compute capability 9 or more without the wgmma kernels, 16-bit cache:
 *     every request under 16 rows      attn_narrow_bulk_kernel (2 CTAs an SM, persistent plan)
 *   compute capability 9.0, fp8 e4m3 cache:
 *     every request with <= 16 rows    attn_wgmma16_kernel<., 16, fp8> (tiles staged, widened in
 *                                      shared memory)
 *   other devices, or an fp8 cache otherwise (the fallback):
 *     every request with <= 16 rows    attn_narrow_kernel
 *     else                             attn_tc_kernel (mma.sync, the score tile split between
 *                                      the column halves)
 *   the tensor-core kernels' shared memory does not fit (under ~150 KB a block): attn_simt_kernel.
 * AR_MLA_KERNEL (read by the backend) and the test hook can force a kernel; the route names the
 * kernel that runs.
 *
 * Measured on the H200 (BENCHMARKS.md): at h_q = 128 the wgmma kernels with TMA key tiles run at
 * 505-619 TFLOP/s (4k-32k keys; attn_wgmma_pairs_kernel 528-619) against 156-160 for
 * attn_tc_kernel; up to 32 rows a request the transposed attn_wgmma16_kernel streams the latent
 * cache at 3.93-4.24 TB/s (h_q = 16, 2026-12-02) against the 64-row kernel's 3.39-3.96 (16 of each
 * tile's 64 rows used) and the bulk narrow kernel's 3.16-3.74 (h_q = 8); at h_q = 32 the 32-row
 * instance 3.76-4.18 against the 64-row kernel's 3.61-3.85.  The bulk narrow kernel stays the
 * choice for at most 16 rows on a device of compute capability 9 or more without the wgmma
 * kernels (it beats attn_narrow_kernel, 3.72 against 2.37 TB/s at 32k).  Off Hopper, splitting the
 * score tile between the column halves measured 160 against 135 TFLOP/s for both halves
 * computing it. */
#ifndef AR_MLA_ROUTE_H
#define AR_MLA_ROUTE_H

#include <stdbool.h>

#include "cuda_mla.h"
#include "mla_plan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AR_MLA_NARROW_ROWS 16      /* rows of a narrow kernel's tile (attn_narrow*_kernel) */
#define AR_MLA_NB_STAGES 2         /* key-ring slots of attn_narrow_bulk_kernel */
#define AR_MLA_W16_ROWS 16         /* the transposed kernel's two instances: 16 ... */
#define AR_MLA_W32_ROWS 32         /* ... and 32 rows wide */
#define AR_MLA_PAIRS_MIN_BLOCK 32  /* attn_wgmma_pairs_kernel: two 32-key TMA boxes a 64-dim atom */

/* What the device can run (mla_probe in mla_decode.h fills it). */
typedef struct ar_mla_caps {
    int tc_stages;      /* key-ring depth of attn_tc_kernel: 3 (Hopper), 2 (an A100's 163 KB), 0 when
                           even 2 do not fit (the SIMT kernel then) */
    bool wgmma;         /* compute capability 9.0 and the wgmma kernel's shared memory granted */
    bool narrow_bulk;   /* attn_narrow_bulk_kernel can run: sm_90, its shared memory at 2 CTAs per SM */
    bool wgmma16;       /* attn_wgmma16_kernel's shared memory granted, both row counts (with wgmma) */
    bool wgmma16_fp8;   /* its fp8-cache instance (16 rows) granted too */
} ar_mla_caps;

typedef enum ar_mla_kernel_kind {
    AR_MLA_ROUTE_SIMT,          /* attn_simt_kernel */
    AR_MLA_ROUTE_TC,            /* attn_tc_kernel */
    AR_MLA_ROUTE_NARROW,        /* attn_narrow_kernel */
    AR_MLA_ROUTE_NARROW_BULK,   /* attn_narrow_bulk_kernel */
    AR_MLA_ROUTE_WGMMA          /* the pairs, transposed or cp.async wgmma kernel */
} ar_mla_kernel_kind;

/* What the decision function picked for a launch. */
typedef struct ar_mla_route {
    ar_mla_kernel_kind kind;
    int stages;         /* key-ring slots: attn_tc_kernel 2 or 3, attn_narrow_kernel 2 or 4, 2 for
                           the bulk and wgmma kernels, 0 for SIMT */
    int ctas_per_sm;    /* the planner aims at this many CTAs per SM */
    bool persistent;    /* the persistent plan (ar_mla_build_plan_persistent) */
    bool combine_rows;  /* split pieces merged by combine_rows_kernel (else combine_kernel) */
    int rows_t;         /* the wgmma route with at most 16 (or 32) rows a request: 16 (32), the
                           transposed attn_wgmma16_kernel<., rows_t> where the tensor map is made;
                           else 0 */
    bool tensor_map;    /* the launch reads the cache through a tensor map: the wgmma route with a
                           16-bit cache; without one the 64-row kernel runs its cp.async key loads
                           (an fp8 cache stages its tiles by bulk copies) */
    const char *name;   /* "tc-wgmma", "tc-wgmma16", "tc-wgmma32", "tc-narrow-bulk", "tc-narrow",
                           "tc-split-qk" or "simt" */
} ar_mla_route;

/* The decision function (see the file comment).  forced: AR_MLA_KERNEL_AUTO, or a kernel to run
 * where it can (ar_cuda_mla_kernel in cuda_mla.h: TC_WGMMA where the wgmma kernel cannot run runs
 * TC_SPLIT_QK; TC_NARROW is attn_narrow_kernel where every request has at most 16 rows); max_rows:
 * the most rows of a request in the launch; stages_cap: 2 keeps the mma.sync kernels at a 2-tile
 * ring (tests), 0 no cap. */
ar_mla_route ar_mla_choose(const ar_mla_caps *caps, ar_cuda_mla_kernel forced, int max_rows, bool fp8_cache,
                           int stages_cap);

/* Whether a launch on the wgmma route runs the 64-row cp.async kernel (attn_wgmma_cpasync_kernel)
 * instead of the pairs kernel or the transposed one: no tensor map of the cache (have_tmap false),
 * or 64-row tiles on blocks of fewer than AR_MLA_PAIRS_MIN_BLOCK keys.  The launch and the
 * coverage path (tc-wgmma-cpasync) both ask this. */
bool ar_mla_wgmma_cpasync(const ar_mla_route *r, int block_size, bool have_tmap);

/* The decode launch's kernel path (replay/backend.h, the coverage table): "mla-decode:" and the
 * route's name, "-cpasync" where the wgmma route ran its cp.async kernel (cpasync: what
 * ar_mla_wgmma_cpasync said), "+split" where a combine merged split pieces. */
const char *ar_mla_route_path(const ar_mla_route *route, bool cpasync, bool split);

/* The plan of a route in place of p (built by ar_mla_build_plan with num_sms): the persistent
 * plan over ctas_per_sm x SMs CTAs, or ar_mla_build_plan aiming at that many CTAs; p unchanged
 * when the route needs neither or the split count is forced.  Same arguments as
 * ar_mla_build_plan; 0 ok, -1 out of memory. */
int ar_mla_replan(ar_mla_plan *p, const ar_mla_route *route, int R, const int *qsl, const int *seq_lens,
                  const unsigned char *include, int H, int causal, int extra, int num_sms, int force_splits);

#ifdef __cplusplus
}
#endif

#endif
