/* mla_decode.h - the host side of the cuda-mla backend's decode launch (mla_decode.cu): what the
 * device can run, the decision function that picks the kernel, the plan of its route (the
 * planner itself: mla_plan.h, plain C), and the launch.  Shared by the backend (cuda_mla.cu), the test hook
 * (cuda_mla_case.cu) and kernels/lab/; C++ (nvcc) only.
 *
 * The decision (mla_choose), by rows a request (query tokens x heads) and the device:
 *   compute capability 9.0, 16-bit latent cache:
 *     some request with > 32 rows      attn_wgmma_pairs_kernel (the default; attn_wgmma_cpasync_kernel
 *                                      where the cache's tensor map cannot be made or the block
 *                                      size is 16)
 *     every request with <= 32 rows    attn_wgmma16_kernel<., 16 or 32> (the same products
 *                                      transposed: the rows are the instructions' N side; the
 *                                      64-row cp.async kernel where the tensor map cannot be made)
 *   compute capability 9 or more without the wgmma kernels, 16-bit cache:
 *     every request under 16 rows      attn_narrow_bulk_kernel
 *   compute capability 9.0, fp8 e4m3 cache:
 *     every request with <= 16 rows    attn_wgmma16_kernel<., 16, fp8> (tiles staged, widened in
 *                                      shared memory)
 *   other devices, or an fp8 cache otherwise (the fallback):
 *     every request with <= 16 rows    attn_narrow_kernel
 *     else                             attn_tc_kernel
 *   the tensor-core kernels' shared memory does not fit (under ~150 KB a block): attn_simt_kernel.
 * AR_MLA_KERNEL (read by the backend) and the test hook can force a kernel; the result names
 * the kernel that ran. */
#ifndef AR_MLA_DECODE_H
#define AR_MLA_DECODE_H

#include <stdlib.h>
#include <string.h>

#include "../common/cuda_host.cuh"
#include "cuda_mla.h"
#include "mla_common.cuh"

namespace ar_mla {

/* ---- small host helpers of the backend and the test hook ---- */

static inline int mla_fail(cudaError_t e, const char *what, char *err, size_t err_len)
{
    return ar_cuda_fail(e, "cuda-mla backend", what, err, err_len);
}

static inline int mla_ensure(dev_buf *b, size_t need, const char *what, char *err, size_t err_len)
{
    return ar_cuda_ensure_dev(b, need, "cuda-mla backend", what, err, err_len);
}

static inline int mla_grid(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535 * 8) b = 65535 * 8;
    return (int)b;
}

static inline int mla_cmp_double(const void *pa, const void *pb)
{
    double a = *(const double *)pa, b = *(const double *)pb;
    return a < b ? -1 : a > b;
}

/* Median of v[0 .. n) (sorts v). */
static inline double median_of(double *v, int n)
{
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, mla_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- what the device can run, and the decision ---- */

typedef struct mla_caps {
    int tc_stages;      /* key-ring depth of attn_tc_kernel: 3 (Hopper), 2 (an A100's 163 KB), 0 when
                           even 2 do not fit (the SIMT kernel then) */
    bool wgmma;         /* compute capability 9.0 and the wgmma kernel's shared memory granted */
    bool narrow_bulk;   /* attn_narrow_bulk_kernel can run: sm_90, its shared memory at 2 CTAs per SM */
    bool wgmma16;       /* attn_wgmma16_kernel's shared memory granted, both row counts (with wgmma) */
    bool wgmma16_fp8;   /* its fp8-cache instance (16 rows) granted too */
} mla_caps;

/* Probes the device once (per process) and sets the kernels' shared-memory attributes. */
mla_caps mla_probe(int device);

typedef enum mla_kernel_kind { MLA_SIMT, MLA_TC, MLA_NARROW, MLA_NARROW_BULK, MLA_WGMMA } mla_kernel_kind;

/* The transposed wgmma kernel runs the persistent plan (chains of pieces over all SMs, the cut
 * requests combined) from this many 64-key tiles an SM on; below it one piece a CTA.  At
 * FlashMLA's h_q 16 shape (128 requests) that is from 8k keys on: runs of 125 tiles an SM
 * against 128 (4 of 132 SMs idle), the combine ~1% of the step; at 4k the runs' rounding (63
 * against 64) would not pay for the combine. */
#define W16_CHAIN_MIN_TILES 96

/* What the decision function picked for a launch. */
typedef struct mla_route {
    mla_kernel_kind kind;
    int stages;         /* key-ring slots: attn_tc_kernel 2 or 3, attn_narrow_kernel 2 or 4, 2 for
                           the bulk and wgmma kernels, 0 for SIMT */
    int ctas_per_sm;    /* the planner aims at this many CTAs per SM */
    bool persistent;    /* the persistent plan (ar_mla_build_plan_persistent); for the transposed kernel
                           only where the keys come to W16_CHAIN_MIN_TILES tiles an SM or more */
    bool chain_all;     /* the transposed kernel's persistent plan at every length (AR_MLA_W16_CHAIN=all) */
    bool combine_rows;  /* split pieces merged by combine_rows_kernel (else combine_kernel) */
    int rows_t;         /* MLA_WGMMA with at most 16 (or 32) rows a request: 16 (32), the transposed
                           attn_wgmma16_kernel<., rows_t> where the tensor map is made; else 0 */
    bool tensor_map;    /* the launch reads the cache through a tensor map (mla_wgmma_tensor_map):
                           MLA_WGMMA with a 16-bit cache; without one the 64-row kernel runs its
                           cp.async key loads (an fp8 cache stages its tiles by bulk copies) */
    const char *name;   /* "tc-wgmma", "tc-wgmma16", "tc-wgmma32", "tc-narrow-bulk", "tc-narrow",
                           "tc-split-qk" or "simt" */
} mla_route;

/* Whether a launch on the wgmma route runs the 64-row cp.async kernel (attn_wgmma_cpasync_kernel)
 * instead of the pairs kernel or the transposed one: no tensor map of the cache (have_tmap false),
 * or 64-row tiles on blocks of fewer than PAIRS_MIN_BLOCK keys.  The launch and the coverage path
 * (tc-wgmma-cpasync) both ask this. */
static inline bool mla_wgmma_cpasync(const mla_route &r, int block_size, bool have_tmap)
{
    return r.kind == MLA_WGMMA && r.tensor_map && (!have_tmap || (r.rows_t == 0 && block_size < PAIRS_MIN_BLOCK));
}

/* The decision function (see the file comment).  forced: AR_MLA_KERNEL_AUTO, or a kernel to run
 * where it can (ar_cuda_mla_kernel in cuda_mla.h: TC_WGMMA where the wgmma kernel cannot run runs
 * TC_SPLIT_QK; TC_NARROW is attn_narrow_kernel where every request has at most 16 rows); max_rows:
 * the most rows of a request in the launch; stages_cap: 2 keeps the mma.sync kernels at a 2-tile
 * ring (tests), 0 no cap. */
mla_route mla_choose(const mla_caps &caps, ar_cuda_mla_kernel forced, int max_rows, bool fp8_cache, int stages_cap);

/* ---- the plan: work items of 64 rows and a key range, split to fill the SMs (mla_plan.h) ---- */

typedef ar_mla_plan mla_plan;   /* mla_plan.h: ar_mla_build_plan, ar_mla_build_plan_persistent */

/* The plan of a route in place of p (built by ar_mla_build_plan with num_sms): the persistent
 * plan over ctas_per_sm x SMs CTAs, or ar_mla_build_plan aiming at that many CTAs; p unchanged
 * when the route needs neither or the split count is forced.  Same arguments as
 * ar_mla_build_plan; 0 ok, -1 out of memory. */
int mla_replan(mla_plan *p, const mla_route &route, int R, const int *qsl, const int *seq_lens,
               const unsigned char *include, int H, int causal, int extra, int num_sms, int force_splits);

/* ---- the launch ---- */

/* The TMA view of the latent cache a.cache ([num_slots][576] 16-bit) that attn_wgmma_pairs_kernel
 * and attn_wgmma16_kernel read, in *map.  0 ok; 3 with "cuda-mla wgmma: tensor map: <why>" in
 * err when it cannot be made (no driver entry point, a block size below 16, more than 2^31
 * slots, the driver refused): the launch then runs attn_wgmma_cpasync_kernel. */
int mla_wgmma_tensor_map(const attn_args &a, size_t num_slots, CUtensorMap *map, char *err, size_t err_len);

/* The latent attention (+ the split combine) of a planned launch on stream st: the route's kernel
 * over num_ctas CTAs (MLA_WGMMA: tmap NULL runs the cp.async kernel), or the SIMT kernel over
 * num_tokens x heads CTAs; ev_mid (optional) is recorded between attention and combine. */
cudaError_t mla_launch_decode(const attn_args &a, const mla_route &route, int num_ctas, int num_groups, int num_tokens,
                              const CUtensorMap *tmap, cudaStream_t st, cudaEvent_t ev_mid);

/* The combine alone (for kernels in kernels/lab/ that run on the route's plan). */
cudaError_t mla_launch_combine(const attn_args &a, const mla_route &route, int num_groups, cudaStream_t st);

} /* namespace ar_mla */

#endif
