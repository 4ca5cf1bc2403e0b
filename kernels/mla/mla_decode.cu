/* mla_decode.cu - the cuda-mla backend's decode launch: the kernels of mla_decode_mma.cuh,
 * mla_decode_wgmma.cuh, mla_decode_wgmma_pairs.cuh and mla_decode_wgmma16.cuh compiled in one
 * place with the split combines and the SIMT fallback, what the device can run (mla_probe) and
 * the launch (mla_launch_decode).  The interface is in mla_decode.h; the decision function that
 * picks a launch's kernel and the plan of its route are plain C (mla_route.c, mla_plan.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mla_decode.h"
#include "mla_decode_mma.cuh"
#include "mla_decode_wgmma.cuh"
#include "mla_decode_wgmma16.cuh"
#include "mla_decode_wgmma_pairs.cuh"

namespace ar_mla {

/* ---------------------------------------------------------------------------------------- */
/* The split combines                                                                         */

/* The LSE maximum m and the weight sum of row lr of a combine group's pieces (log2 domain). */
__device__ __forceinline__ void combine_row_stats(const attn_args &a, const combine_group &gp, int lr, float *m_out,
                                                  float *wsum_out)
{
    float m = -INFINITY;
    for (int p = 0; p < gp.count; p++) m = fmaxf(m, a.part_lse[(int64_t)(gp.first_partial + p) * ROWS + lr]);
    float wsum = 0.f;
    for (int p = 0; p < gp.count; p++) {
        float l = a.part_lse[(int64_t)(gp.first_partial + p) * ROWS + lr];
        wsum += m == -INFINITY ? 0.f : exp2f(l - m);
    }
    *m_out = m;
    *wsum_out = wsum;
}

/* Weight of a piece with LSE l (the MERGE_NO_WEIGHTS fault: 1). */
__device__ __forceinline__ float combine_weight(const attn_args &a, float m, float wsum, float l)
{
    if (a.fault == AR_FAULT_MERGE_NO_WEIGHTS) return 1.f;
    return (m == -INFINITY || wsum <= 0.f) ? 0.f : exp2f(l - m) / wsum;
}

/* The merged LSE of row gr of the request starting at token q0: natural into lse [H, T]. */
__device__ __forceinline__ void combine_write_lse(const attn_args &a, int q0, int gr, float m, float wsum)
{
    const int H = a.num_heads;
    float lse2 = (m == -INFINITY || wsum <= 0.f) ? -INFINITY : m + log2f(wsum);
    int i = gr / H, n = gr % H;
    a.lse[(int64_t)n * a.num_tokens + q0 + i] = a.fault == AR_FAULT_LSE_BASE2 ? lse2 : lse2 * 0.6931471805599453f;
}

/* combine_kernel with one CTA per (group, row): grid (num_groups, rows per group), 128 threads
 * x 4 columns; the rows of a group are merged side by side instead of one after another.  The
 * same arithmetic in the same order as combine_kernel. */
__global__ void __launch_bounds__(128) combine_rows_kernel(attn_args a)
{
    const combine_group gp = a.groups[blockIdx.x];
    const int H = a.num_heads, lr = blockIdx.y;
    const int q0 = a.qsl[gp.req], ql = a.qsl[gp.req + 1] - q0;
    const int gr = gp.row0 + lr;
    if (gr >= ql * H) return;
    float m, wsum;
    combine_row_stats(a, gp, lr, &m, &wsum);
    const int col = threadIdx.x * 4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int p = 0; p < gp.count; p++) {
        int64_t pi = gp.first_partial + p;
        float wgt = combine_weight(a, m, wsum, a.part_lse[pi * ROWS + lr]);
        float4 v = *reinterpret_cast<const float4 *>(a.part_o + (pi * ROWS + lr) * DL + col);
        acc.x += wgt * v.x;
        acc.y += wgt * v.y;
        acc.z += wgt * v.z;
        acc.w += wgt * v.w;
    }
    *reinterpret_cast<float4 *>(a.o_lat + ((int64_t)q0 * H + gr) * DL + col) = acc;
    if (threadIdx.x == 0) combine_write_lse(a, q0, gr, m, wsum);
}

/* Merges the split pieces of each row tile by their LSE (vLLM merge_attn_states on N pieces). */
__global__ void combine_kernel(attn_args a)
{
    const combine_group gp = a.groups[blockIdx.x];
    const int H = a.num_heads;
    const int q0 = a.qsl[gp.req], ql = a.qsl[gp.req + 1] - q0;
    const int nrows = ql * H;
    for (int lr = 0; lr < ROWS; lr++) {
        int gr = gp.row0 + lr;
        if (gr >= nrows) break;
        float m, wsum;
        combine_row_stats(a, gp, lr, &m, &wsum);
        float *dst = a.o_lat + ((int64_t)q0 * H + gr) * DL;
        for (int col = threadIdx.x; col < DL; col += blockDim.x) {
            float acc = 0.f;
            for (int p = 0; p < gp.count; p++) {
                int64_t pi = gp.first_partial + p;
                acc += combine_weight(a, m, wsum, a.part_lse[pi * ROWS + lr]) * a.part_o[(pi * ROWS + lr) * DL + col];
            }
            dst[col] = acc;
        }
        if (threadIdx.x == 0) combine_write_lse(a, q0, gr, m, wsum);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* SIMT latent attention, the fallback where the tensor-core kernels' shared memory does not   */
/* fit (or AR_MLA_KERNEL=simt): one CTA per (token, head); writes o_lat / lse like the         */
/* tensor-core kernels.                                                                         */

__global__ void __launch_bounds__(SIMT_THREADS) attn_simt_kernel(attn_args a, float *out, float *lse_out)
{
    __shared__ float qs[D];
    __shared__ float ps[SIMT_CHUNK];
    __shared__ float red[SIMT_THREADS / 32];
    const int H = a.num_heads;
    const int t = blockIdx.x / H, n = blockIdx.x % H;
    const int r = a.tok_req[t];
    const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
    const int i = t - q0;
    const int extra = a.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0;
    const int limit = key_limit(a.causal, sl, ql, i, extra);
    const float smul = a.scale * (a.fp8_cache ? a.kv_scale : 1.f);
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        qs[d] = from_bits(a.bf16, ((const uint16_t *)a.q)[((int64_t)t * H + n) * D + d]);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float m = -INFINITY, l = 0;
    float acc[DL / SIMT_THREADS];
    for (int c = 0; c < DL / SIMT_THREADS; c++) acc[c] = 0;
    for (int c0 = 0; c0 < limit; c0 += SIMT_CHUNK) {
        int cnt = limit - c0 < SIMT_CHUNK ? limit - c0 : SIMT_CHUNK;
        for (int kk = warp; kk < cnt; kk += nw) {
            int64_t base = key_slot(a, r, c0 + kk) * D;
            float dot = 0;
            for (int d = lane; d < D; d += 32) dot += qs[d] * cache_value<float>(a, base + d);
            for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
            if (lane == 0) ps[kk] = dot * smul;
        }
        __syncthreads();
        float mine = threadIdx.x < cnt ? ps[threadIdx.x] : -INFINITY;
        float mc = block_reduce<float>(mine, true, red);
        float m_new = m > mc ? m : mc;
        float alpha = m == -INFINITY ? 0.f : exp(m - m_new);
        float p = threadIdx.x < cnt ? exp(mine - m_new) : 0.f;
        float lsum = block_reduce<float>(p, false, red);
        if (threadIdx.x < cnt) ps[threadIdx.x] = p;
        __syncthreads();
        if (a.fault == AR_FAULT_NO_RESCALE) alpha = 1;
        l = l * alpha + lsum;
        for (int c = 0; c < DL / SIMT_THREADS; c++) {
            int col = threadIdx.x + c * SIMT_THREADS;
            float sum = 0;
            for (int kk = 0; kk < cnt; kk++) sum += ps[kk] * cache_value<float>(a, key_slot(a, r, c0 + kk) * D + col);
            acc[c] = acc[c] * alpha + sum;
        }
        m = m_new;
        __syncthreads();
    }
    const float omul = a.fp8_cache ? a.kv_scale : 1.f;
    for (int c = 0; c < DL / SIMT_THREADS; c++) {
        int col = threadIdx.x + c * SIMT_THREADS;
        out[((int64_t)t * H + n) * DL + col] = l > 0 ? acc[c] * omul / l : 0.f;
    }
    if (threadIdx.x == 0) {
        float lse = l > 0 ? m + log(l) : -INFINITY;
        if (a.fault == AR_FAULT_LSE_BASE2 && lse != -INFINITY) lse = lse * 1.4426950408889634f;
        lse_out[(int64_t)n * a.num_tokens + t] = lse;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* What the device can run                                                                    */

/* Raises the dynamic shared-memory limit of fn to bytes (and, for kernels that run 2 CTAs an
 * SM, asks for the whole carveout); false when the device refuses. */
static bool set_smem(const void *fn, int bytes, bool two_per_sm)
{
    bool ok = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) == cudaSuccess;
    if (ok && two_per_sm) ok = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, 100) == cudaSuccess;
    if (!ok) cudaGetLastError();
    return ok;
}

/* The 64-row kernel with a ring of STAGES and the narrow kernel with the ring that goes with it
 * (3 with 4: 188 KB at most, 2 with 2: 152 KB at most), in all four dtype pairs. */
template <int STAGES>
static bool set_mma_attributes(void)
{
    constexpr int NSTAGES = STAGES == 3 ? 4 : 2;
    const int tc = smem_total(STAGES), nw = narrow_smem_total(NSTAGES);
    return set_smem((const void *)attn_tc_kernel<true, false, STAGES>, tc, false) &&
           set_smem((const void *)attn_tc_kernel<false, false, STAGES>, tc, false) &&
           set_smem((const void *)attn_tc_kernel<true, true, STAGES>, tc, false) &&
           set_smem((const void *)attn_tc_kernel<false, true, STAGES>, tc, false) &&
           set_smem((const void *)attn_narrow_kernel<true, false, NSTAGES>, nw, false) &&
           set_smem((const void *)attn_narrow_kernel<false, false, NSTAGES>, nw, false) &&
           set_smem((const void *)attn_narrow_kernel<true, true, NSTAGES>, nw, false) &&
           set_smem((const void *)attn_narrow_kernel<false, true, NSTAGES>, nw, false);
}

mla_caps mla_probe(int device)
{
    static int probed = -1;
    static mla_caps caps;
    if (probed == device) return caps;
    memset(&caps, 0, sizeof caps);
    int major = 0, minor = 0, optin = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        cudaGetLastError();
        return caps;
    }
    if (optin >= smem_total(3) && optin >= narrow_smem_total(4) && set_mma_attributes<3>() && set_mma_attributes<2>())
        caps.tc_stages = 3;
    else if (optin >= smem_total(2) && set_mma_attributes<2>())
        caps.tc_stages = 2;
    caps.narrow_bulk = major >= 9 && optin >= narrow_bulk_smem_total() &&
                       set_smem((const void *)attn_narrow_bulk_kernel<true>, narrow_bulk_smem_total(), true) &&
                       set_smem((const void *)attn_narrow_bulk_kernel<false>, narrow_bulk_smem_total(), true);
    /* the wgmma kernels: the sm_90a code of the fat binary, compute capability 9.0 exactly */
    caps.wgmma = major == 9 && minor == 0 && optin >= PAIRS_SMEM &&
                 set_smem((const void *)attn_wgmma_cpasync_kernel<true>, WG_SMEM, false) &&
                 set_smem((const void *)attn_wgmma_cpasync_kernel<false>, WG_SMEM, false) &&
                 set_smem((const void *)attn_wgmma_pairs_kernel<true, true>, PAIRS_SMEM, false) &&
                 set_smem((const void *)attn_wgmma_pairs_kernel<false, true>, PAIRS_SMEM, false);
    caps.wgmma16 = caps.wgmma && set_smem((const void *)attn_wgmma16_kernel<true, 16>, W16Geom<16>::SMEM, false) &&
                   set_smem((const void *)attn_wgmma16_kernel<false, 16>, W16Geom<16>::SMEM, false) &&
                   set_smem((const void *)attn_wgmma16_kernel<true, 32>, W16Geom<32>::SMEM, false) &&
                   set_smem((const void *)attn_wgmma16_kernel<false, 32>, W16Geom<32>::SMEM, false);
    caps.wgmma16_fp8 = caps.wgmma16 &&   /* one instance: fp16 products for either query dtype */
                       set_smem((const void *)attn_wgmma16_kernel<false, 16, true>, W16Geom<16, true>::SMEM, false);
    probed = device;
    return caps;
}

/* ---------------------------------------------------------------------------------------- */
/* The launch                                                                                 */

int mla_wgmma_tensor_map(const attn_args &a, size_t num_slots, CUtensorMap *map, char *err, size_t err_len)
{
    memset(map, 0, sizeof *map);
    if (a.block_size < 16 || num_slots < 1 || num_slots > (size_t)INT32_MAX) {
        snprintf(err, err_len, "cuda-mla wgmma: tensor map: block size %d, %zu cache slots (rules: block >= 16 keys, "
                 "1 .. 2^31 - 1 slots)", a.block_size, num_slots);
        return 3;
    }
    const uint64_t dims[2] = {(uint64_t)D, (uint64_t)num_slots};
    const uint64_t stride_bytes[1] = {(uint64_t)D * 2};
    const uint32_t box[2] = {64, 1u << wg_tma_rows_log2(a.block_size_log2)};
    return ar_tma_encode(map, a.cache, 2, dims, stride_bytes, box, "cuda-mla wgmma", err, err_len) != 0 ? 3 : 0;
}

template <bool BF16, bool FP8>
static void launch_kernel(const attn_args &a, const mla_route &route, int n, const CUtensorMap *tmap, cudaStream_t st)
{
    if constexpr (FP8) {   /* with an fp8 cache ar_mla_choose picks the wgmma kinds only as this one */
        if (route.kind == AR_MLA_ROUTE_WGMMA) {
            const CUtensorMap none = {};   /* unused: the fp8 tiles come by bulk copies */
            /* fp16 products whatever the query dtype: e4m3 widens to fp16 by one instruction a
             * pair, bf16 queries are scaled into fp16 in the kernel (a.bf16) */
            attn_wgmma16_kernel<false, 16, true><<<n, THREADS, W16Geom<16, true>::SMEM, st>>>(a, none);
            return;
        }
    }
    if constexpr (!FP8) {   /* ar_mla_choose never picks these with an fp8 cache */
        if (route.kind == AR_MLA_ROUTE_WGMMA) {
            if (ar_mla_wgmma_cpasync(&route, a.block_size, tmap != nullptr))
                attn_wgmma_cpasync_kernel<BF16><<<n, THREADS, WG_SMEM, st>>>(a);
            else if (route.rows_t == W16_ROWS)
                attn_wgmma16_kernel<BF16, 16><<<n, THREADS, W16Geom<16>::SMEM, st>>>(a, *tmap);
            else if (route.rows_t == W32_ROWS)
                attn_wgmma16_kernel<BF16, 32><<<n, THREADS, W16Geom<32>::SMEM, st>>>(a, *tmap);
            else
                attn_wgmma_pairs_kernel<BF16, true><<<n, THREADS, PAIRS_SMEM, st>>>(a, *tmap);
            return;
        }
        if (route.kind == AR_MLA_ROUTE_NARROW_BULK) {
            attn_narrow_bulk_kernel<BF16><<<n, THREADS, narrow_bulk_smem_total(), st>>>(a);
            return;
        }
    }
    if (route.kind == AR_MLA_ROUTE_NARROW && route.stages >= 4)
        attn_narrow_kernel<BF16, FP8, 4><<<n, THREADS, narrow_smem_total(4), st>>>(a);
    else if (route.kind == AR_MLA_ROUTE_NARROW)
        attn_narrow_kernel<BF16, FP8, 2><<<n, THREADS, narrow_smem_total(2), st>>>(a);
    else if (route.stages >= 3)
        attn_tc_kernel<BF16, FP8, 3><<<n, THREADS, smem_total(3), st>>>(a);
    else
        attn_tc_kernel<BF16, FP8, 2><<<n, THREADS, smem_total(2), st>>>(a);
}

cudaError_t mla_launch_combine(const attn_args &a, const mla_route &route, int num_groups, cudaStream_t st)
{
    /* combine_rows_kernel: one CTA per group row (64-row groups of the wgmma kernel, 16-row ones
     * of the bulk narrow kernel); combine_kernel: one CTA per group; the same arithmetic */
    if (num_groups > 0 && route.kind == AR_MLA_ROUTE_WGMMA)
        combine_rows_kernel<<<dim3((unsigned)num_groups, ROWS), 128, 0, st>>>(a);
    else if (num_groups > 0 && route.combine_rows)
        combine_rows_kernel<<<dim3((unsigned)num_groups, NROWS), 128, 0, st>>>(a);
    else if (num_groups > 0)
        combine_kernel<<<num_groups, 256, 0, st>>>(a);
    return cudaGetLastError();
}

cudaError_t mla_launch_decode(const attn_args &a, const mla_route &route, int num_ctas, int num_groups, int num_tokens,
                              const CUtensorMap *tmap, cudaStream_t st, cudaEvent_t ev_mid)
{
    if (route.kind != AR_MLA_ROUTE_SIMT) {
        if (num_ctas > 0) {
            if (a.bf16 && !a.fp8_cache) launch_kernel<true, false>(a, route, num_ctas, tmap, st);
            else if (a.bf16) launch_kernel<true, true>(a, route, num_ctas, tmap, st);
            else if (!a.fp8_cache) launch_kernel<false, false>(a, route, num_ctas, tmap, st);
            else launch_kernel<false, true>(a, route, num_ctas, tmap, st);
        }
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
        if (ev_mid) cudaEventRecord(ev_mid, st);
        return mla_launch_combine(a, route, num_groups, st);
    }
    if (num_tokens > 0 && a.num_heads > 0)
        attn_simt_kernel<<<num_tokens * a.num_heads, SIMT_THREADS, 0, st>>>(a, a.o_lat, a.lse);
    cudaError_t e = cudaGetLastError();
    if (ev_mid) cudaEventRecord(ev_mid, st);
    return e;
}

} /* namespace ar_mla */
