/* mla_decode.h - the host side of the cuda-mla backend's decode launch (mla_decode.cu): what the
 * device can run (mla_probe) and the launch of a route's kernel.  The decision function that
 * picks the route (ar_mla_choose) and the plan a route takes (ar_mla_replan) are plain C in
 * mla_route.h, the planner itself in mla_plan.h.  Shared by the backend (cuda_mla.cu), the test
 * hook (cuda_mla_case.cu) and kernels/lab/; C++ (nvcc) only. */
#ifndef AR_MLA_DECODE_H
#define AR_MLA_DECODE_H

#include <stdlib.h>
#include <string.h>

#include "../common/cuda_host.cuh"
#include "cuda_mla.h"
#include "mla_common.cuh"
#include "mla_route.h"

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

typedef ar_mla_caps mla_caps;     /* mla_route.h */
typedef ar_mla_route mla_route;   /* mla_route.h: what ar_mla_choose picked for a launch */

/* Probes the device once (per process) and sets the kernels' shared-memory attributes. */
mla_caps mla_probe(int device);

/* ---- the plan: work items of 64 rows and a key range, split to fill the SMs (mla_plan.h) ---- */

typedef ar_mla_plan mla_plan;   /* mla_plan.h: ar_mla_build_plan, ar_mla_build_plan_persistent */

/* ---- the launch ---- */

/* The TMA view of the latent cache a.cache ([num_slots][576] 16-bit) that attn_wgmma_pairs_kernel
 * and attn_wgmma16_kernel read, in *map.  0 ok; 3 with "cuda-mla wgmma: tensor map: <why>" in
 * err when it cannot be made (no driver entry point, a block size below 16, more than 2^31
 * slots, the driver refused): the launch then runs attn_wgmma_cpasync_kernel. */
int mla_wgmma_tensor_map(const attn_args &a, size_t num_slots, CUtensorMap *map, char *err, size_t err_len);

/* The latent attention (+ the split combine) of a planned launch on stream st: the route's kernel
 * over num_ctas CTAs (the wgmma route: tmap NULL runs the cp.async kernel), or the SIMT kernel over
 * num_tokens x heads CTAs; ev_mid (optional) is recorded between attention and combine. */
cudaError_t mla_launch_decode(const attn_args &a, const mla_route &route, int num_ctas, int num_groups, int num_tokens,
                              const CUtensorMap *tmap, cudaStream_t st, cudaEvent_t ev_mid);

/* The combine alone (for kernels in kernels/lab/ that run on the route's plan). */
cudaError_t mla_launch_combine(const attn_args &a, const mla_route &route, int num_groups, cudaStream_t st);

} /* namespace ar_mla */

#endif
