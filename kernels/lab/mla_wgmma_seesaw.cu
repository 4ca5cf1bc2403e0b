/* mla_wgmma_seesaw.cu - lab: variants of the Hopper MLA decode kernel for 64-row tiles beside
 * the product's (attn_wgmma_pairs_kernel, kernels/mla/mla_decode_wgmma_pairs.cuh: FlashMLA's own
 * order of the "seesaw"), with their benchmark.  Four kernels:
 *   s1-tma           the product's default until 2026-12-04: warpgroup 0 computes S and the
 *                    softmax of every 64-key tile and hands P to warpgroup 1, key tiles by TMA
 *                    (wg_kernel_body's TMA form, kernels/mla/mla_decode_wgmma.cuh);
 *   seesaw-rs-tma    an earlier seesaw: the two warpgroups compute S of alternate tiles, exchange
 *                    the row max and P, and each runs P V of both tiles on its 256 output
 *                    columns, its own P from registers (RS wgmma), whole key tiles refilled by TMA
 *                    once both warpgroups are done with them;
 *   seesaw-fast-tma  the same with each warpgroup's softmax against the running maximum (the
 *                    product's wg_softmax_running keeping P's A fragments and publishing the
 *                    unchanged maxima);
 *   seesaw-rs        seesaw-rs-tma with cp.async key loads.
 * Measured on the H200 (2026-12-04 19:13 UTC, b = 128, h_q = 128, TFLOP/s at 4k / 8k / 16k / 32k
 * keys): s1-tma 532.1 / 569.9 / 586.5 / 593.3, seesaw-fast-tma 540.1 / 576.2 / 590.6 / 594.9, the
 * pairs kernel (then a lab row) 540.0 / 585.0 / 607.0 / 619.1 (BENCHMARKS.md).
 *
 * The benchmark (main): FlashMLA's shapes (b = 128, s_q = 1, bf16, block 64, h_q = 128; argv[1]
 * = 16 for h_q = 16; argv[2] .. = the names of the lab kernels to run, all without), s_k = 4k
 * .. 32k, the product's kernel first and then each lab kernel on the same case through the test
 * hook (kernels/mla/cuda_mla_case.h: same inputs, plan and combine), one line each: time of
 * attention + combine (median of 20), TFLOP/s, effective TB/s, the max error of out and LSE
 * against the float64 device reference on 3 requests, and the max difference from the product
 * kernel's output.  Exit status 1 when a lab kernel's error exceeds FlashMLA's tolerance (8e-4)
 * or a case fails; 0 with a line saying why when there is no compute-capability 9.0 device.
 *
 * Build and run: `make lab`, then `build/lab/mla_wgmma_seesaw [16|128 [NAME ...]]` on the H200. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mla/cuda_mla_case.h"
#include "../mla/mla_decode_wgmma_pairs.cuh"

namespace ar_mla {




/* FlashMLA's seesaw schedule on the product kernel's per-tile work.  Key tiles go in pairs
 * (t0 = 2 i in ring slot 0, t1 = 2 i + 1 in slot 1); warpgroup 0 computes S of t0 and warpgroup 1
 * S of t1 (each m64n64k16 over 576 dims, full rows, as the product kernel), so both warpgroups issue tensor work
 * and each one's softmax overlaps the other's products.  Output columns stay split (warpgroup w
 * owns O[:, 256 w ..]), so each warpgroup runs P V of BOTH tiles on its columns:
 *   wg 0: S0; m_a = max(m, rowmax S0), P0 = 2^(S0 - m_a), alpha0 = 2^(m - m_a), O_0 *= alpha0,
 *         l_0 = l_0 alpha0 + sum P0; publishes P0 (into atom 8 of slot 0: the rope dims that
 *         only S reads, free once S0 finished) and m_a; O_0 += P0 V0; then, given m_b and P1:
 *         beta = 2^(m_a - m_b), O_0 *= beta, l_0 *= beta, O_0 += P1 V1; m = m_b.
 *   wg 1: S1 (issued at once); given m_a: alpha0 from the same m and m_a (identical arithmetic),
 *         O_1 *= alpha0, l_1 *= alpha0, O_1 += P0 V0 issued, then (while it runs) m_b = max(m_a,
 *         rowmax S1), P1 = 2^(S1 - m_b), l_1 = l_1 beta + sum P1; publishes P1 (atom 8 of slot 1)
 *         and m_b; after P0 V0 landed O_1 *= beta, O_1 += P1 V1; m = m_b.
 * Both warpgroups hold the same running max m after every pair; l = l_0 + l_1 at the end (both
 * relative to the final m).  Loads: warpgroup 0 loads tile t0 + 2 into slot 0 once warpgroup 1's
 * P0 V0 finished (while its own P1 V1 runs), warpgroup 1 loads t1 + 2 into slot 1 once
 * warpgroup 0's P1 V1 finished; each waits for its own copies with a 128-thread barrier.
 * Named barriers (256 threads: one warpgroup arrives, the other syncs; once a pair each, and
 * every arrival of pair i + 1 comes after the matching sync of pair i):
 *   SS_P0READY (0 -> 1, every pair), SS_P1READY (1 -> 0, when t1 exists), SS_S0FREE (1 -> 0,
 *   when t0 + 2 exists), SS_S1FREE (0 -> 1, when t1 + 2 exists).
 * Shared memory: the product kernel's layout (the P tile unused); red holds m_a [ROWS], m_b [ROWS], then the
 * row sums [2][ROWS] of the epilogue. */
enum {
    SS_BAR_P0READY = 1,  /* P0 (slot 0 atom 8) and m_a written (warpgroup 0 -> 1) */
    SS_BAR_P1READY = 2,  /* P1 (slot 1 atom 8) and m_b written (1 -> 0) */
    SS_BAR_S0FREE = 3,   /* warpgroup 1's P0 V0 finished: slot 0 may be reloaded (1 -> 0) */
    SS_BAR_S1FREE = 4,   /* warpgroup 0's P1 V1 finished: slot 1 may be reloaded (0 -> 1) */
    SS_BAR_WG0 = 5,      /* warpgroup 0 alone (128 threads): its copies / P stores done */
    SS_BAR_WG1 = 6       /* warpgroup 1 alone */
};

/* The factor 2^(m_old - m_new) (m_new == -inf counts as 0), softmax_step's alpha. */
__device__ __forceinline__ float wg_rescale_factor(float m_old, float m_new)
{
    return exp2f(m_old - (m_new == -INFINITY ? 0.f : m_new));
}


/* O [64 x 256] += P V[:, 256 wg ..] of the key tile at sk_addr, P in its atom 8 (issued and
 * committed, not waited). */
template <bool BF16>
__device__ __forceinline__ void wg_issue_pv_slot(float (&o)[32][4], uint32_t sk_addr, int wg)
{
    const uint64_t desc_p = ar_wg::desc_sw128(sk_addr + (uint32_t)(8 * WG_ATOM), 16, 1024);
    const uint64_t desc_v = ar_wg::desc_sw128(sk_addr + (uint32_t)(4 * wg * WG_ATOM), WG_ATOM, 1024);
    wg_fence_acc(o);
    ar_wg::fence();
#pragma unroll
    for (int kk = 0; kk < WG_KEYS / 16; kk++)
        wgmma_pv<BF16>(o, desc_p + (uint32_t)((kk * 32) >> 4), desc_v + (uint32_t)((kk * 2048) >> 4));
    ar_wg::commit();
}

/* cp.async of key tile t (as wg_load_keys) by the 128 threads of one warpgroup (this one is
 * number i), two a key: thread i copies the odd or even 16-byte chunks of key i / 2, so it
 * needs one block-table entry (wg_load_keys<128> keeps 36 live, which spills while the
 * 128 accumulator registers of an in-flight P V are held). */
__device__ __forceinline__ void wg_load_keys_by_key(const attn_args &a, const work_item &w, int r, int t,
                                                    unsigned char *sk, int i)
{
    const int key = i >> 1, half = i & 1;
    const int j = w.key_begin + t * WG_KEYS + key;
    const bool valid = j < w.key_end;
    const int64_t slot =
        valid ? ((int64_t)__ldg(a.block_table + (int64_t)r * a.mbpr + (j >> a.block_size_log2)) << a.block_size_log2) +
                    (j & (a.block_size - 1))
              : 0;
    const uint16_t *const src = (const uint16_t *)a.cache + (int64_t)slot * D;
#pragma unroll 4
    for (int k = 0; k < WG_CHUNKS / 2; k++) {
        const int c = 2 * k + half;
        cp_async16(sk + wg_swz(key, c), src + c * 8, valid);
    }
}

/* Warpgroup 1's side of m_a: reads it (s_ma [ROWS]), alpha0 = 2^(m - m_a) from its own m
 * (the same arithmetic as warpgroup 0's), o and l rescaled by alpha0, m = m_a. */
__device__ __forceinline__ void wg_take_max(float (&o)[32][4], const float *s_ma, const int lr[2], float m_run[2],
                                            float l_run[2], float m_a[2], int fault)
{
    float alpha0[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        m_a[h] = s_ma[lr[h]];
        alpha0[h] = wg_rescale_factor(m_run[h], m_a[h]);
        l_run[h] *= alpha0[h];
        m_run[h] = m_a[h];
    }
    wg_rescale(o, alpha0, fault);
}


/* The seesaw schedule (above) with a TMA switch: attn_wgmma_seesaw_kernel (TMA = false) and
 * attn_wgmma_seesaw_rs_tma_kernel (P_RS = TMA = true).
 * ptxas: 217 / 218 registers, no spills.
 * TMA (with P_RS): the key tiles wholly below key_end come by TMA
 * (wg_tma_keys) onto the full mbarrier of their slot: the first pair issued by WG_TMA_THREAD
 * in the prologue, tile t0 + 2 by thread 0 (warpgroup 0) after SS_S0FREE, t1 + 2 by thread
 * WG_TMA_THREAD (warpgroup 1) after SS_S1FREE - where the cp.async version's warpgroup issued
 * its 36 copies a thread.  The warpgroup that computes S of a tile waits on its mbarrier
 * (parity (t >> 1) & 1: slot s's mbarrier completes once per TMA tile s, s + 2, ..., and only
 * the last tile can be a cp.async one); the other one also waits on it (already complete, so
 * at once) before its P V of that tile reads the values.  P0 / P1 are written into atom 8 of
 * their slot by generic stores: each writer fenced them to the async proxy before the named
 * barrier after which the slot's next TMA tile is issued.  A tile that reaches past key_end
 * keeps the cp.async path with its zero fill. */
template <bool BF16, bool P_RS, bool TMA, bool FAST = false>
__device__ __forceinline__ void wg_seesaw_body(attn_args a, const void *tmap)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    uint32_t sq_addr;                                           /* the Q tile, at the aligned start */
    unsigned char *const smem = wg_smem_base(&sq_addr);
    const uint32_t sk_addr0 = sq_addr + WG_OFF_K, sk_addr1 = sk_addr0 + WG_TILE;
    unsigned char *const sk0 = smem + WG_OFF_K, *const sk1 = sk0 + WG_TILE;
    float *const s_ma = reinterpret_cast<float *>(smem + WG_OFF_RED);   /* [ROWS] m_a of the pair */
    float *const s_mb = s_ma + ROWS;                                    /* [ROWS] m_b of the pair */
    float *const s_sum = s_ma + 2 * ROWS;                               /* [2][ROWS] row sums */
    uint64_t *const full = reinterpret_cast<uint64_t *>(smem + WG_OFF_BAR);   /* [2] TMA: slot landed */

    const work_item w = a.work[blockIdx.x];
    const int r = w.req;
    const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
    const int nrows = ql * a.num_heads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, tig = lane & 3;
    const int lr[2] = {(warp & 3) * 16 + (lane >> 2), (warp & 3) * 16 + (lane >> 2) + 8};
    int lim[2];
    row_limits(a, w, sl, ql, nrows, lr, lim);
    const int ntiles = w.key_end > w.key_begin ? (w.key_end - w.key_begin + WG_KEYS - 1) / WG_KEYS : 0;
    /* TMA: whether tile t comes by TMA (wholly below key_end) */
    auto tma_tile = [&](int t) { return TMA && w.key_begin + (t + 1) * WG_KEYS <= w.key_end; };
    /* warpgroup wg's wait for its tile t in ring slot `slot`: the TMA copies' mbarrier, or its own
     * cp.async copies and then the warpgroup's named barrier bar_id */
    auto wait_slot = [&](int t, int slot, int bar_id) {
        if (tma_tile(t)) {
            mbar_wait(&full[slot], (uint32_t)(t >> 1) & 1u);
        } else {
            cp_async_wait<0>();           /* tile t (this warpgroup's copies) landed */
            ar_wg::fence_proxy_async();
            wg_bar_sync128(bar_id);
        }
    };
    if (TMA) wg_tma_init(full, tmap, tid);

    /* Q and the first pair by all 256 threads (TMA tiles by WG_TMA_THREAD) */
    wg_load_q<THREADS>(a, w, q0, nrows, smem, tid);
    for (int t = 0; t < 2 && t < ntiles; t++) {
        if (!tma_tile(t))
            wg_load_keys<THREADS>(a, w, r, t, t ? sk1 : sk0, tid);
        else if (tid == WG_TMA_THREAD)
            wg_tma_keys(a, tmap, r, w.key_begin + t * WG_KEYS, t ? sk_addr1 : sk_addr0, &full[t]);
    }
    cp_async_commit();
    float o[32][4];
#pragma unroll
    for (int nt = 0; nt < 32; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[nt][e] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    bool m_ready = false;                                       /* FAST: every row of the warp has a maximum */
    const uint64_t desc_q = ar_wg::desc_sw128(sq_addr, 16, 1024);
    cp_async_wait<0>();
    ar_wg::fence_proxy_async();
    __syncthreads();

    for (int t0 = 0; t0 < ntiles; t0 += 2) {
        const int t1 = t0 + 1;
        const bool has1 = t1 < ntiles;
        if (wg == 0) {
            wait_slot(t0, 0, SS_BAR_WG0);
            float s[8][4];
            wg_issue_s<BF16>(s, desc_q, sk_addr0);
            ar_wg::wait<0>();
            wg_fence_acc(s);
            uint32_t pa[4][4];            /* P0 as A fragments (P_RS) */
            const bool fast = FAST && P_RS &&
                              wg_softmax_running<BF16, true>(s, w.key_begin + t0 * WG_KEYS, tig, lim, a.scale_log2, m_run,
                                                             l_run, sk0 + 8 * WG_ATOM, s_ma, m_run, lr, a.fault, m_ready, pa);
            if (!fast) {
                float alpha0[2];
                wg_softmax_full(s, w.key_begin + t0 * WG_KEYS, tig, lim, a.scale_log2, m_run, l_run, alpha0, a.fault);
                wg_rescale(o, alpha0, a.fault);
                /* P0 into atom 8 of slot 0, m_a (now m_run) into s_ma */
                wg_store_p<BF16>(sk0 + 8 * WG_ATOM, s_ma, s, lr, tig, m_run);
            }
            ar_wg::fence_proxy_async();
            wg_bar_arrive(SS_BAR_P0READY);
            if (P_RS) {
                if (!fast) wg_pack_p<BF16>(s, pa);
                wg_issue_pv_rs<BF16>(o, pa, sk_addr0, 0);
            } else {
                wg_bar_sync128(SS_BAR_WG0);   /* all of P0 written before this warpgroup reads it */
                wg_issue_pv_slot<BF16>(o, sk_addr0, 0);
            }
            if (has1) {
                wg_bar_sync(SS_BAR_P1READY);
                const float m_b[2] = {s_mb[lr[0]], s_mb[lr[1]]};
                float beta[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    beta[h] = wg_rescale_factor(m_run[h], m_b[h]);
                    l_run[h] *= beta[h];
                    m_run[h] = m_b[h];
                }
                ar_wg::wait<0>();         /* P0 V0 landed */
                wg_fence_acc(o);
                if (P_RS) wg_fence_frag(pa);
                wg_rescale(o, beta, a.fault);
                if (tma_tile(t1)) mbar_wait(&full[1], (uint32_t)(t1 >> 1) & 1u);   /* complete: V1 visible here */
                wg_issue_pv_slot<BF16>(o, sk_addr1, 0);
                if (t0 + 2 < ntiles) {    /* tile t0 + 2 into slot 0 once warpgroup 1's P0 V0 is done */
                    wg_bar_sync(SS_BAR_S0FREE);
                    if (!tma_tile(t0 + 2)) {
                        wg_load_keys_by_key(a, w, r, t0 + 2, sk0, tid);
                        cp_async_commit();
                    } else if (tid == 0) {
                        wg_tma_keys(a, tmap, r, w.key_begin + (t0 + 2) * WG_KEYS, sk_addr0, &full[0]);
                    }
                    __syncwarp();         /* warp 0 converged again before the wgmma wait */
                }
                ar_wg::wait<0>();
                wg_fence_acc(o);
                if (t1 + 2 < ntiles) wg_bar_arrive(SS_BAR_S1FREE);
            } else {                      /* the last pair has no t1 */
                ar_wg::wait<0>();
                wg_fence_acc(o);
                if (P_RS) wg_fence_frag(pa);
            }
        } else if (has1) {
            wait_slot(t1, 1, SS_BAR_WG1);
            float s[8][4];
            wg_issue_s<BF16>(s, desc_q, sk_addr1);
            wg_bar_sync(SS_BAR_P0READY);
            float m_a[2];
            wg_take_max(o, s_ma, lr, m_run, l_run, m_a, a.fault);
            if (tma_tile(t0)) mbar_wait(&full[0], (uint32_t)(t0 >> 1) & 1u);   /* complete: V0 visible here */
            wg_issue_pv_slot<BF16>(o, sk_addr0, 1);
            ar_wg::wait<1>();             /* S1 landed (P0 V0 may still run) */
            wg_fence_acc(s);
            uint32_t pa[4][4];            /* P1 as A fragments (P_RS) */
            float beta[2] = {1.f, 1.f};
            const bool fast = FAST && P_RS &&
                              wg_softmax_running<BF16, true>(s, w.key_begin + t1 * WG_KEYS, tig, lim, a.scale_log2, m_run,
                                                             l_run, sk1 + 8 * WG_ATOM, s_mb, m_run, lr, a.fault, m_ready, pa);
            if (!fast) {
                float mx[2];
                mask_scale_rowmax<8>(s, w.key_begin + t1 * WG_KEYS, tig, lim, a.scale_log2, mx);
                softmax_step<8, 0>(s, mx, m_run, l_run, (float (*)[4])0, a.fault);
#pragma unroll
                for (int h = 0; h < 2; h++) beta[h] = wg_rescale_factor(m_a[h], m_run[h]);
                /* P1 into atom 8 of slot 1, m_b (now m_run) into s_mb */
                wg_store_p<BF16>(sk1 + 8 * WG_ATOM, s_mb, s, lr, tig, m_run);
            }
            ar_wg::fence_proxy_async();
            wg_bar_arrive(SS_BAR_P1READY);
            if (P_RS) {
                if (!fast) wg_pack_p<BF16>(s, pa);
            } else
                wg_bar_sync128(SS_BAR_WG1);   /* all of P1 written before this warpgroup reads it */
            ar_wg::wait<0>();             /* P0 V0 landed: slot 0 free on this side */
            wg_fence_acc(o);
            if (t0 + 2 < ntiles) wg_bar_arrive(SS_BAR_S0FREE);
            wg_rescale(o, beta, a.fault);
            if (P_RS)
                wg_issue_pv_rs<BF16>(o, pa, sk_addr1, 1);
            else
                wg_issue_pv_slot<BF16>(o, sk_addr1, 1);
            ar_wg::wait<0>();
            wg_fence_acc(o);
            if (P_RS) wg_fence_frag(pa);
            if (t1 + 2 < ntiles) {        /* tile t1 + 2 into slot 1 once warpgroup 0's P1 V1 is done */
                wg_bar_sync(SS_BAR_S1FREE);
                if (!tma_tile(t1 + 2)) {
                    wg_load_keys_by_key(a, w, r, t1 + 2, sk1, tid - 128);
                    cp_async_commit();
                } else if (tid == WG_TMA_THREAD) {
                    wg_tma_keys(a, tmap, r, w.key_begin + (t1 + 2) * WG_KEYS, sk_addr1, &full[1]);
                }
                __syncwarp();             /* warp 4 converged again before the next wgmma */
            }
        } else {                          /* the last pair has no t1: P0 V0 only */
            wg_bar_sync(SS_BAR_P0READY);
            float m_a[2];
            wg_take_max(o, s_ma, lr, m_run, l_run, m_a, a.fault);
            if (tma_tile(t0)) mbar_wait(&full[0], (uint32_t)(t0 >> 1) & 1u);   /* complete: V0 visible here */
            wg_issue_pv_slot<BF16>(o, sk_addr0, 1);
            ar_wg::wait<0>();
            wg_fence_acc(o);
        }
    }
    cp_async_wait<0>();

    /* epilogue: l = l_0 + l_1 (both relative to the common final max), normalise, write */
    quad_sum(l_run);
    if (tig == 0) {
        s_sum[wg * ROWS + lr[0]] = l_run[0];
        s_sum[wg * ROWS + lr[1]] = l_run[1];
    }
    __syncthreads();
    for (int h = 0; h < 2; h++) l_run[h] = s_sum[lr[h]] + s_sum[ROWS + lr[h]];
    wg_store_rows(a, w, q0, nrows, o, m_run, l_run, lr, wg, tig);
#else
    (void)a;
    (void)tmap;
    __trap();   /* built without sm_90a: the host never launches this kernel there */
#endif
}

/* P_RS ("seesaw-rs"): each warpgroup's P V of the tile whose S it computed takes P
 * from its registers (RS) instead of the shared copy it wrote for the other warpgroup: 16 KB
 * less shared-memory reads a pair and no 128-thread barrier before that product.
 * The body is wg_seesaw_body's with TMA = false. */
template <bool BF16, bool P_RS>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma_seesaw_kernel(attn_args a)
{
    wg_seesaw_body<BF16, P_RS, false>(a, nullptr);
}

/* "seesaw-rs-tma": seesaw-rs with the key tiles by TMA (see wg_seesaw_body); tmap as
 * attn_wgmma_tma_kernel's. */
template <bool BF16, bool FAST = false>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma_seesaw_rs_tma_kernel(attn_args a, const __grid_constant__ CUtensorMap tmap)
{
    wg_seesaw_body<BF16, true, true, FAST>(a, &tmap);
}

/* "s1-tma": the product's default until 2026-12-04 (before attn_wgmma_pairs_kernel): warpgroup 0
 * computes S and the softmax of every tile, both warpgroups their half of P V, key tiles by TMA
 * (wg_kernel_body's TMA form); tmap as mla_wgmma_tensor_map makes it. */
template <bool BF16>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma_tma_kernel(attn_args a, const __grid_constant__ CUtensorMap tmap)
{
    wg_kernel_body<BF16, true>(a, &tmap);
}

/* ---------------------------------------------------------------------------------------- */
/* "early-s-tma": the product's schedule (warpgroup 0 computes S and the softmax, both run P V  */
/* on their columns) with S of the next tile issued right behind this tile's P V, so the      */
/* tensor cores see P V(t) and S(t + 1) back to back instead of two CTA barriers between them. */
/* Key tiles land atom by atom (one mbarrier per 64-dim atom and slot, 18 in all; FlashMLA's   */
/* per-atom barriers), so S(t + 1) starts on its first atoms while the rest still arrive: the  */
/* next tile is issued only once both warpgroups' P V of the slot's previous tile is done.     */
/* Named barriers (256 threads, one warpgroup arrives, the other syncs; counts matched):       */
/*   EB_PREADY  0 -> 1  P(t) and alpha(t) written, S(t) done (every tile);                     */
/*   EB_PFREE   1 -> 0  warpgroup 1's P V(t) done: P and alpha may be rewritten (t + 1 < n);   */
/*   EB_SFREE   0 -> 1  warpgroup 0's P V(t) done: slot t & 1 may take tile t + 2 (t + 2 < n). */
/* Lab restriction: every tile whole (pieces of whole 64-key tiles, as the benchmark's); a     */
/* partial tile traps.                                                                         */
enum { EB_PREADY = 1, EB_PFREE = 2, EB_SFREE = 3 };
constexpr int EB_OFF_BARS = WG_OFF_RED + 4 * ROWS * 4;   /* [2 slots][9 atoms] mbarriers */
constexpr int EB_SMEM = WG_SMEM + 18 * 8;
static_assert(EB_OFF_BARS % 8 == 0 && EB_SMEM <= 232448, "early-s: the per-atom mbarriers fit");

/* mbar_wait with a warp-uniform exit (the warp leaves on a vote): a per-thread exit between the
 * wgmma of one product makes ptxas serialize every wgmma of the kernel (its C7520), which is what
 * the first measurement of this kernel (2026-12-04 16:01 UTC, 0.57x) ran into. */
__device__ __forceinline__ void eb_wait_warp(uint64_t *bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"((uint32_t)__cvta_generic_to_shared(bar)), "r"(parity) : "memory");
    } while (!__all_sync(0xffffffffu, done));
}

/* TMA copies of the 64 keys k0 .. of request r into the tile at sk_addr, atom by atom, each atom
 * onto its own mbarrier (bars [9]: 8192 bytes each), the first atoms first. */
__device__ __forceinline__ void eb_tma_keys(const attn_args &a, const void *tmap, int r, int k0, uint32_t sk_addr,
                                            uint64_t *bars)
{
    const int rows_log2 = wg_tma_rows_log2(a.block_size_log2);
    const int runs = WG_KEYS >> rows_log2;
    const int *const bt = a.block_table + (int64_t)r * a.mbpr;
    int slot[4];
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const int j = k0 + (p << rows_log2);
        slot[p] = p < runs ? (__ldg(bt + (j >> a.block_size_log2)) << a.block_size_log2) + (j & (a.block_size - 1)) : 0;
    }
#pragma unroll
    for (int c = 0; c < 9; c++) {
        const uint32_t bar_addr = (uint32_t)__cvta_generic_to_shared(&bars[c]);
        ar_wg::mbar_arrive_expect_tx(bar_addr, (uint32_t)WG_ATOM);
#pragma unroll
        for (int p = 0; p < 4; p++) {
            if (p >= runs) break;
            ar_wg::tma_load_2d(sk_addr + (uint32_t)(c * WG_ATOM + (p << rows_log2) * 128), tmap, bar_addr, c * 64, slot[p]);
        }
    }
}

template <bool BF16>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma_early_s_kernel(attn_args a, const __grid_constant__ CUtensorMap tmap)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    uint32_t sq_addr;
    unsigned char *const smem = wg_smem_base(&sq_addr);
    const uint32_t sk_addr0 = sq_addr + WG_OFF_K, sp_addr = sq_addr + WG_OFF_P;
    float *const s_alpha = reinterpret_cast<float *>(smem + WG_OFF_RED);
    float *const s_sum = s_alpha + 2 * ROWS;
    uint64_t *const bars = reinterpret_cast<uint64_t *>(smem + EB_OFF_BARS);   /* [2][9] */

    const work_item w = a.work[blockIdx.x];
    const int r = w.req;
    const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
    const int nrows = ql * a.num_heads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, tig = lane & 3;
    const int lr[2] = {(warp & 3) * 16 + (lane >> 2), (warp & 3) * 16 + (lane >> 2) + 8};
    int lim[2];
    row_limits(a, w, sl, ql, nrows, lr, lim);
    const int n = w.key_end > w.key_begin ? (w.key_end - w.key_begin + WG_KEYS - 1) / WG_KEYS : 0;
    if ((w.key_end - w.key_begin) % WG_KEYS != 0) __trap();   /* lab restriction: whole tiles */
    if (tid == WG_TMA_THREAD) {
        for (int i = 0; i < 18; i++) mbar_init(&bars[i], 1);
        mbar_init_fence();
        ar_wg::tma_prefetch_map(&tmap);
    }
    __syncthreads();
    if (tid == WG_TMA_THREAD)
        for (int t = 0; t < 2 && t < n; t++)
            eb_tma_keys(a, &tmap, r, w.key_begin + t * WG_KEYS, sk_addr0 + (uint32_t)(t * WG_TILE), &bars[9 * t]);
    wg_load_q<THREADS>(a, w, q0, nrows, smem, tid);
    cp_async_commit();
    float o[32][4];
#pragma unroll
    for (int nt = 0; nt < 32; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[nt][e] = 0.f;
    wg_fence_acc(o);   /* the zeros written here, not inside S(0)'s wgmma (ptxas then serializes them: C7515) */
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    bool m_ready = false;
    const float alpha_one[2] = {1.f, 1.f};   /* the running form's rescale factors */
    const float score_mul = a.scale_log2;
    const uint64_t desc_q = ar_wg::desc_sw128(sq_addr, 16, 1024);
    const uint64_t desc_p = ar_wg::desc_sw128(sp_addr, 16, 1024);
    cp_async_wait<0>();
    ar_wg::fence_proxy_async();
    __syncthreads();                      /* Q landed */

    /* S(t) into s: per atom, wait for it and issue its 4 steps (warpgroup 0) */
    auto issue_s = [&](int t, float (&s)[8][4]) {
        const uint32_t slot = (uint32_t)(t & 1), par = (uint32_t)(t >> 1) & 1u;
        const uint64_t desc_k = ar_wg::desc_sw128(sk_addr0 + slot * (uint32_t)WG_TILE, 16, 1024);
        ar_wg::fence();
#pragma unroll
        for (int c = 0; c < 9; c++) {
            eb_wait_warp(&bars[9 * slot + c], par);
#pragma unroll
            for (int k4 = 0; k4 < 4; k4++) {
                const int kk = 4 * c + k4;
                const uint32_t koff = (uint32_t)(c * WG_ATOM + k4 * 32) >> 4;
                wgmma_qk64<BF16>(s, ar_wg::desc_advance(desc_q, koff), ar_wg::desc_advance(desc_k, koff), kk > 0);
            }
        }
        ar_wg::commit();
    };
    auto issue_pv = [&](int t) {
        const uint32_t slot = (uint32_t)(t & 1);
        const uint64_t desc_v = ar_wg::desc_sw128(sk_addr0 + slot * (uint32_t)WG_TILE + (uint32_t)(4 * wg * WG_ATOM), WG_ATOM, 1024);
        wg_fence_acc(o);
        ar_wg::fence();
#pragma unroll
        for (int kk = 0; kk < WG_KEYS / 16; kk++)
            wgmma_pv<BF16>(o, ar_wg::desc_advance(desc_p, (uint32_t)((kk * 32) >> 4)), ar_wg::desc_advance(desc_v, (uint32_t)((kk * 2048) >> 4)));
        ar_wg::commit();
    };

    if (wg == 0) {
        float s[8][4];
        if (n > 0) issue_s(0, s);
        for (int t = 0; t < n; t++) {
            if (t > 0) {
                ar_wg::wait<1>();         /* P V(t - 1) done; S(t) may still run */
                wg_fence_acc(o);
                if (t + 1 < n) wg_bar_arrive(EB_SFREE);
            }
            ar_wg::wait<0>();             /* S(t) done */
            wg_fence_acc(s);
            wg_fence_acc(o);
            if (t > 0) wg_bar_sync(EB_PFREE);   /* warpgroup 1 is done with P(t - 1) and alpha(t - 1) */
            if (!wg_softmax_running<BF16>(s, w.key_begin + t * WG_KEYS, tig, lim, score_mul, m_run, l_run,
                                          smem + WG_OFF_P, s_alpha, alpha_one, lr, a.fault, m_ready)) {
                float alpha[2];
                wg_softmax_full(s, w.key_begin + t * WG_KEYS, tig, lim, score_mul, m_run, l_run, alpha, a.fault);
                wg_rescale(o, alpha, a.fault);
                wg_fence_acc(o);
                wg_store_p<BF16>(smem + WG_OFF_P, s_alpha, s, lr, tig, alpha);
            }
            ar_wg::fence_proxy_async();   /* P stores -> the async proxy */
            wg_bar_arrive(EB_PREADY);
            issue_pv(t);
            if (t + 1 < n) issue_s(t + 1, s);
        }
        ar_wg::wait<0>();
        wg_fence_acc(o);
    } else {
        for (int t = 0; t < n; t++) {
            wg_bar_sync(EB_PREADY);
            const float alpha[2] = {s_alpha[lr[0]], s_alpha[lr[1]]};
            wg_rescale(o, alpha, a.fault);
            const uint32_t slot = (uint32_t)(t & 1), par = (uint32_t)(t >> 1) & 1u;
#pragma unroll 1
            for (int c = 0; c < 8; c++) eb_wait_warp(&bars[9 * slot + c], par);   /* complete: V(t) visible here */
            issue_pv(t);
            ar_wg::wait<0>();
            wg_fence_acc(o);
            if (t + 1 < n) wg_bar_arrive(EB_PFREE);
            if (t + 2 < n) {
                wg_bar_sync(EB_SFREE);
                if (tid == WG_TMA_THREAD)
                    eb_tma_keys(a, &tmap, r, w.key_begin + (t + 2) * WG_KEYS, sk_addr0 + slot * (uint32_t)WG_TILE, &bars[9 * slot]);
                __syncwarp();
            }
        }
    }
    wg_finish_rows(a, w, q0, nrows, s_sum, o, m_run, l_run, lr, wg, tig);
#else
    (void)a;
    (void)tmap;
    __trap();
#endif
}

} /* namespace ar_mla */

/* ---------------------------------------------------------------------------------------- */
/* The benchmark                                                                              */

using namespace ar_mla;

static cudaError_t launch_s1_tma(const attn_args *a, int num_ctas, const CUtensorMap *tmap, cudaStream_t st)
{
    if (!tmap) return cudaErrorInvalidValue;
    if (a->bf16) attn_wgmma_tma_kernel<true><<<num_ctas, THREADS, WG_SMEM_TMA, st>>>(*a, *tmap);
    else attn_wgmma_tma_kernel<false><<<num_ctas, THREADS, WG_SMEM_TMA, st>>>(*a, *tmap);
    return cudaGetLastError();
}

/* "pairs-exact": the product's pairs kernel with the exact softmax only (FAST off) */
static cudaError_t launch_pairs_exact(const attn_args *a, int num_ctas, const CUtensorMap *tmap, cudaStream_t st)
{
    if (!tmap || a->block_size < PAIRS_MIN_BLOCK) return cudaErrorInvalidValue;
    if (a->bf16) attn_wgmma_pairs_kernel<true, false><<<num_ctas, THREADS, PAIRS_SMEM, st>>>(*a, *tmap);
    else attn_wgmma_pairs_kernel<false, false><<<num_ctas, THREADS, PAIRS_SMEM, st>>>(*a, *tmap);
    return cudaGetLastError();
}

static cudaError_t launch_seesaw_rs_tma(const attn_args *a, int num_ctas, const CUtensorMap *tmap, cudaStream_t st)
{
    if (!tmap) return cudaErrorInvalidValue;   /* the hook made no tensor map: not on the wgmma route */
    if (a->bf16) attn_wgmma_seesaw_rs_tma_kernel<true><<<num_ctas, THREADS, WG_SMEM_TMA, st>>>(*a, *tmap);
    else attn_wgmma_seesaw_rs_tma_kernel<false><<<num_ctas, THREADS, WG_SMEM_TMA, st>>>(*a, *tmap);
    return cudaGetLastError();
}

/* "seesaw-fast-tma": seesaw-rs-tma with each warpgroup's softmax against the running maximum
 * (wg_softmax_running<BF16, true>) */
static cudaError_t launch_seesaw_fast_tma(const attn_args *a, int num_ctas, const CUtensorMap *tmap, cudaStream_t st)
{
    if (!tmap) return cudaErrorInvalidValue;
    if (a->bf16) attn_wgmma_seesaw_rs_tma_kernel<true, true><<<num_ctas, THREADS, WG_SMEM_TMA, st>>>(*a, *tmap);
    else attn_wgmma_seesaw_rs_tma_kernel<false, true><<<num_ctas, THREADS, WG_SMEM_TMA, st>>>(*a, *tmap);
    return cudaGetLastError();
}

/* "early-s-tma": attn_wgmma_early_s_kernel (whole 64-key tiles only) */
static cudaError_t launch_early_s_tma(const attn_args *a, int num_ctas, const CUtensorMap *tmap, cudaStream_t st)
{
    if (!tmap) return cudaErrorInvalidValue;
    if (a->bf16) attn_wgmma_early_s_kernel<true><<<num_ctas, THREADS, EB_SMEM, st>>>(*a, *tmap);
    else attn_wgmma_early_s_kernel<false><<<num_ctas, THREADS, EB_SMEM, st>>>(*a, *tmap);
    return cudaGetLastError();
}

static cudaError_t launch_seesaw_rs(const attn_args *a, int num_ctas, const CUtensorMap *tmap, cudaStream_t st)
{
    (void)tmap;
    if (a->bf16) attn_wgmma_seesaw_kernel<true, true><<<num_ctas, THREADS, WG_SMEM, st>>>(*a);
    else attn_wgmma_seesaw_kernel<false, true><<<num_ctas, THREADS, WG_SMEM, st>>>(*a);
    return cudaGetLastError();
}

static bool set_attributes(void)
{
    const void *fns[10] = {(const void *)attn_wgmma_tma_kernel<true>,
                           (const void *)attn_wgmma_tma_kernel<false>,
                           (const void *)attn_wgmma_seesaw_rs_tma_kernel<true>,
                           (const void *)attn_wgmma_seesaw_rs_tma_kernel<false>,
                           (const void *)attn_wgmma_seesaw_rs_tma_kernel<true, true>,
                           (const void *)attn_wgmma_seesaw_rs_tma_kernel<false, true>,
                           (const void *)attn_wgmma_seesaw_kernel<true, true>,
                           (const void *)attn_wgmma_seesaw_kernel<false, true>,
                           (const void *)attn_wgmma_pairs_kernel<true, false>,
                           (const void *)attn_wgmma_pairs_kernel<false, false>};
    for (int i = 0; i < 10; i++)
        if (cudaFuncSetAttribute(fns[i], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 i < 6 ? WG_SMEM_TMA : i < 8 ? WG_SMEM : PAIRS_SMEM) != cudaSuccess)
            return false;
    return cudaFuncSetAttribute((const void *)attn_wgmma_early_s_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                EB_SMEM) == cudaSuccess &&
           cudaFuncSetAttribute((const void *)attn_wgmma_early_s_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                EB_SMEM) == cudaSuccess;
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d;   /* a NaN sticks */
    }
    return m;
}

int main(int argc, char **argv)
{
    const int B = 128, H = argc > 1 && atoi(argv[1]) == 16 ? 16 : 128;
    static const int sks[] = {4096, 8192, 16384, 32768};
    const size_t n_out = (size_t)B * H * 512, n_lse = (size_t)B * H;
    static const ar_cuda_mla_lab_kernel lab[] = {{"s1-tma", launch_s1_tma},
                                                 {"pairs-exact", launch_pairs_exact},
                                                 {"seesaw-rs-tma", launch_seesaw_rs_tma},
                                                 {"seesaw-fast-tma", launch_seesaw_fast_tma},
                                                 {"early-s-tma", launch_early_s_tma},
                                                 {"seesaw-rs", launch_seesaw_rs}};
    /* argv[2] ..: the lab rows to run (all without) */
    auto wanted = [&](const char *name) {
        if (argc <= 2) return true;
        for (int i = 2; i < argc; i++)
            if (strcmp(argv[i], name) == 0) return true;
        return false;
    };
    if (argc > 1 && strcmp(argv[1], "16") != 0 && strcmp(argv[1], "128") != 0) {
        fprintf(stderr, "mla_wgmma_seesaw: h_q is 16 or 128, not '%s' (usage: mla_wgmma_seesaw [16|128] [ROW ...])\n", argv[1]);
        return 2;
    }
    /* every name asked for must be a row, before anything runs (a typo is not a row "skipped") */
    for (int i = 2; i < argc; i++) {
        bool known = false;
        for (const ar_cuda_mla_lab_kernel &k : lab) known |= strcmp(argv[i], k.name) == 0;
        if (!known) {
            fprintf(stderr, "mla_wgmma_seesaw: no lab row '%s'; the rows:", argv[i]);
            for (const ar_cuda_mla_lab_kernel &k : lab) fprintf(stderr, " %s", k.name);
            fprintf(stderr, "\n");
            return 2;
        }
    }
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess || major != 9 ||
        minor != 0) {
        printf("mla_wgmma_seesaw: skipped: needs a compute-capability 9.0 device\n");
        return 0;
    }
    if (!set_attributes()) {
        printf("mla_wgmma_seesaw: the kernels' shared memory was refused\n");
        return 1;
    }
    int *seqlens = (int *)malloc(sizeof(int) * B);
    unsigned char *sel = (unsigned char *)calloc((size_t)B, 1);
    float *base_out = (float *)malloc(n_out * sizeof(float));
    ar_cuda_mla_result r;
    memset(&r, 0, sizeof r);
    r.out = (float *)malloc(n_out * sizeof(float));
    r.lse = (float *)malloc(n_lse * sizeof(float));
    r.ref_out = (double *)malloc(n_out * sizeof(double));
    r.ref_lse = (double *)malloc(n_lse * sizeof(double));
    if (!seqlens || !sel || !base_out || !r.out || !r.lse || !r.ref_out || !r.ref_lse) {
        printf("mla_wgmma_seesaw: out of host memory\n");
        return 1;
    }
    sel[0] = sel[B / 2] = sel[B - 1] = 1;
    ar_cuda_mla_case c = ar_cuda_mla_bench_case(B, H, seqlens);
    c.kernel = AR_MLA_KERNEL_TC_WGMMA;
    c.want_reference = true;
    c.ref_requests = sel;
    printf("lab: the seesaw schedule against the product's wgmma kernel, b=%d s_q=1 h_q=%d bf16 block 64, "
           "median of %d\n", B, H, c.repeat);
    printf("%-18s %6s %9s %8s %7s %9s %9s %10s\n", "kernel", "s_k", "us", "TFLOP/s", "TB/s", "err out", "err lse",
           "vs product");
    int rc = 0;
    for (size_t ik = 0; ik < sizeof sks / sizeof sks[0]; ik++) {
        for (int b = 0; b < B; b++) seqlens[b] = sks[ik];
        for (int k = -1; k < (int)(sizeof lab / sizeof lab[0]); k++) {
            if (k >= 0 && !wanted(lab[k].name)) continue;
            char err[512] = "";
            c.wgmma_cpasync = k >= 0 && strcmp(lab[k].name, "seesaw-rs") == 0;
            int crc = k < 0 ? ar_cuda_mla_run_case(&c, &r, err, sizeof err)
                            : ar_cuda_mla_run_case_with(&c, &lab[k], &r, err, sizeof err);
            if (crc != 0) {
                printf("%-18s %6d error: %.200s\n", k < 0 ? "product" : lab[k].name, sks[ik], err);
                rc = 1;
                continue;
            }
            double err_out, err_lse;
            ar_cuda_mla_ref_errors(&r, sel, B, H, &err_out, &err_lse);
            if (k < 0) memcpy(base_out, r.out, n_out * sizeof(float));
            const double keys = (double)B * sks[ik];
            const double flops = 2.0 * H * keys * (576 + 512), bytes = (keys * 576 + (double)B * H * 1088) * 2.0;
            const bool bad = !(err_out <= 8e-4);
            printf("%-18s %6d %9.1f %8.1f %7.2f %9.2e %9.2e %10.2e%s\n", k < 0 ? r.kernel_name : lab[k].name, sks[ik],
                   r.attn_us, flops / r.attn_us / 1e6, bytes / r.attn_us / 1e6, err_out, err_lse,
                   max_abs_diff(r.out, base_out, n_out), bad ? "  ERROR > 8e-4" : "");
            if (bad) rc = 1;
            fflush(stdout);
        }
    }
    free(seqlens);
    free(sel);
    free(base_out);
    free(r.out);
    free(r.lse);
    free(r.ref_out);
    free(r.ref_lse);
    ar_cuda_mla_release_case_buffers();
    return rc;
}
