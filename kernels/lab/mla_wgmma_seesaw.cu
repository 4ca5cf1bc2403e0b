/* mla_wgmma_seesaw.cu - lab: FlashMLA's "seesaw" schedule for the Hopper MLA decode kernel, the
 * runner-up to the product's kernel (kernels/mla/mla_decode_wgmma.cuh), with its benchmark.
 *
 * The product kernel computes S of every 64-key tile in warpgroup 0 and hands P to warpgroup 1.
 * Here the two warpgroups compute S of alternate tiles (seesaw), exchange the row max and P, and
 * each runs P V of both tiles on its 256 output columns, so one's softmax overlaps the other's
 * tensor work; each warpgroup's own P is read from registers (RS wgmma).  Five kernels:
 *   seesaw-rs-tma    key tiles by TMA, as the product's default;
 *   seesaw-fast-tma  the same with each warpgroup's softmax against the running maximum, the
 *                    product's wg_softmax_running keeping P's A fragments and publishing the
 *                    unchanged maxima: 0.3-1.9% ahead of the product at 4k-32k keys on 2026-12-04
 *                    (kernels/lab/README.md);
 *   seesaw-rs        the same as seesaw-rs-tma with cp.async key loads;
 *   flashmla-order-tma  FlashMLA's own order of the seesaw, step for step: the running maximum
 *                    and the pair's two rescale factors in shared memory, P0 rescaled and handed
 *                    over after warpgroup 1's softmax, S of the next tiles issued atom by atom
 *                    behind the P V products, each key slot refilled in two parts (atoms 0-3 by
 *                    warpgroup 0, 4-8 by warpgroup 1) as soon as each part's last product is
 *                    done, one mbarrier an atom, Q's atom 8 in registers and P1 in its place
 *                    (attn_wgmma_fmorder_kernel; written, not yet run on a GPU);
 *   flashmla-order-fast-tma  the same order with each warpgroup's softmax against the running
 *                    maximum where it holds, as seesaw-fast-tma's: the maximum left as it is and
 *                    the factor 1 published (attn_wgmma_fmorder_kernel<BF16, true>; written, not
 *                    yet run on a GPU).
 * Measured on the H200 (2026-11-30, BENCHMARKS.md): seesaw-rs-tma 500 / 539 / 561 / 572
 * TFLOP/s at 4k / 8k / 16k / 32k keys against the product's 506 / 541 / 557 / 567 in the same
 * run (b = 128, h_q = 128): within 1%, ahead from 16k on, behind below.
 *
 * The benchmark (main): FlashMLA's shapes (b = 128, s_q = 1, bf16, block 64, h_q = 128; argv[1]
 * = 16 for h_q = 16; argv[2] .. = the names of the lab kernels to run, all without), s_k = 4k
 * .. 32k, the product's kernel first and then each lab kernel on the same case through the test
 * hook (kernels/mla/cuda_mla_case.h: same inputs, plan and combine), one line each: time of attention + combine (median of 20), TFLOP/s, effective TB/s, the max
 * error of out and LSE against the float64 device reference on 3 requests, and the max
 * difference from the product kernel's output.  Exit status 1 when a lab kernel's error exceeds
 * FlashMLA's tolerance (8e-4) or a case fails; 0 with a line saying why when there is no
 * compute-capability 9.0 device.
 *
 * Build and run: `make lab`, then `build/lab/mla_wgmma_seesaw [16|128 [NAME ...]]` on the H200
 * (e.g. `build/lab/mla_wgmma_seesaw 128 flashmla-order-tma seesaw-fast-tma`). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../mla/cuda_mla_case.h"
#include "../mla/mla_decode_wgmma.cuh"

namespace ar_mla {

/* O [64 rows x 256 columns] += P (A fragments in registers: rows 16 (warp % 4) + lane / 4 (+ 8),
 * keys 2 (lane % 4) (+ 1, + 8, + 9) of the 16-key step) V (desc_b, MN-major). */
template <bool BF16> __device__ __forceinline__ void wgmma_pv_rs(float (&d)[32][4], const uint32_t (&pa)[4], uint64_t desc_b);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_PV_RS_TEXT(TY) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n256k16.f32" TY TY " " \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, " \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, " \
    "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, " \
    "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, " \
    "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, " \
    "%108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, " \
    "%123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
template <bool BF16> __device__ __forceinline__ void wgmma_pv_rs(float (&d)[32][4], const uint32_t (&pa)[4], uint64_t desc_b)
{
    if constexpr (BF16)
        asm volatile(WGMMA_PV_RS_TEXT(".bf16") : WG_ACC_X32(d) : "r"(pa[0]), "r"(pa[1]), "r"(pa[2]), "r"(pa[3]), "l"(desc_b), "r"(1));
    else
        asm volatile(WGMMA_PV_RS_TEXT(".f16") : WG_ACC_X32(d) : "r"(pa[0]), "r"(pa[1]), "r"(pa[2]), "r"(pa[3]), "l"(desc_b), "r"(1));
}
#undef WGMMA_PV_RS_TEXT
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

/* Named barriers of 256 threads: the 128 of the waiting warpgroup (bar.sync) and the 128 of the
 * signalling one (bar.arrive).  Id 0 is __syncthreads. */
__device__ __forceinline__ void wg_bar_sync(int id) { asm volatile("bar.sync %0, 256;\n" :: "r"(id) : "memory"); }
__device__ __forceinline__ void wg_bar_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" :: "r"(id) : "memory"); }

/* Keeps the A-fragment registers of an in-flight RS wgmma alive (unchanged) up to this point. */
__device__ __forceinline__ void wg_fence_frag(uint32_t (&pa)[4][4])
{
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(pa[i][e])::"memory");
}


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
__device__ __forceinline__ void wg_bar_sync128(int id) { asm volatile("bar.sync %0, 128;\n" :: "r"(id) : "memory"); }

/* The factor 2^(m_old - m_new) (m_new == -inf counts as 0), softmax_step's alpha. */
__device__ __forceinline__ float wg_rescale_factor(float m_old, float m_new)
{
    return exp2f(m_old - (m_new == -INFINITY ? 0.f : m_new));
}

/* S [64 x 64] = Q K^T over 576 dims, K the key tile at sk_addr (issued and committed, not waited). */
template <bool BF16>
__device__ __forceinline__ void wg_issue_s(float (&s)[8][4], uint64_t desc_q, uint32_t sk_addr)
{
    const uint64_t desc_k = ar_wg::desc_sw128(sk_addr, 16, 1024);
    ar_wg::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t koff = (uint32_t)((kk >> 2) * WG_ATOM + (kk & 3) * 32) >> 4;
        wgmma_qk64<BF16>(s, desc_q + koff, desc_k + koff, kk > 0);
    }
    ar_wg::commit();
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

/* P [64 rows x 64 keys, the S accumulator layout] as the A fragments of P V's 4 key steps
 * (wgmma_pv_rs: rows 16 (warp % 4) + lane / 4 (+ 8), keys 2 (lane % 4) (+ 1, + 8, + 9)). */
template <bool BF16>
__device__ __forceinline__ void wg_pack_p(const float (&s)[8][4], uint32_t (&pa)[4][4])
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            pa[kk][2 * half] = pack2<BF16>(s[2 * kk + half][0], s[2 * kk + half][1]);
            pa[kk][2 * half + 1] = pack2<BF16>(s[2 * kk + half][2], s[2 * kk + half][3]);
        }
}

/* O [64 x 256] += P (pa, registers) V[:, 256 wg ..] of the key tile at sk_addr (issued and
 * committed, not waited: pa must stay unchanged until the wait). */
template <bool BF16>
__device__ __forceinline__ void wg_issue_pv_rs(float (&o)[32][4], uint32_t (&pa)[4][4], uint32_t sk_addr, int wg)
{
    const uint64_t desc_v = ar_wg::desc_sw128(sk_addr + (uint32_t)(4 * wg * WG_ATOM), WG_ATOM, 1024);
    wg_fence_acc(o);
    wg_fence_frag(pa);
    ar_wg::fence();
#pragma unroll
    for (int kk = 0; kk < WG_KEYS / 16; kk++) wgmma_pv_rs<BF16>(o, pa[kk], desc_v + (uint32_t)((kk * 2048) >> 4));
    ar_wg::commit();
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


/* ---------------------------------------------------------------------------------------- */
/* "flashmla-order-tma": FlashMLA's own order of the seesaw, step for step as its Hopper dense
 * decode kernel runs it (deepseek-ai/FlashMLA 9241ae3, csrc/sm90/decode/dense/splitkv_mla.cuh,
 * and the schedule in its docs/20250422-new-kernel-deep-dive.md), on this file's building blocks.
 *
 * Between pairs, warpgroup 0 holds S0 of the pair's even tile t0 (ring slot 0) and warpgroup 1
 * S1 of its odd tile t1 (slot 1), both complete; the running maximum m [ROWS] lives in shared
 * memory (fm m), read and written by the two warpgroups in turn.  Warpgroup w owns output columns
 * 256 w .. (O_w), i.e. V_w = atoms 4 w .. 4 w + 3 of a key tile.  Per pair:
 *   wg 0: softmax of S0 against m: m0 = max(m, rowmax S0), f0 = 2^(m - m0), both into shared
 *         memory (f0, m); O_0 *= f0, l_0 = l_0 f0 + sum P0; arrive SCALE0; O_0 += P0 V0_0 (RS,
 *         P0 from registers); wait<0>; sync SCALE1; TMA of tile t0 + 2, atoms 0-3, into slot 0;
 *         P0 *= f1 and stored to the P0 atom (stmatrix); arrive P0; sync P1; O_0 *= f1,
 *         l_0 *= f1; O_0 += P1 V1_0 (SS); S0 of t0 + 2 atoms 0-3 (a commit group an atom, each
 *         after its atom's mbarrier); wait<4> (P1 V1_0 done); TMA of t1 + 2, atoms 0-3, into
 *         slot 1; S0 of t0 + 2 atoms 4-8 (atom 8 RS: Q's last atom is held in registers);
 *         wait<0>.
 *   wg 1: sync SCALE0; softmax of S1 against m (now m0): m1, f1 = 2^(m0 - m1) into shared
 *         memory; O_1 *= f0 f1, l_1 = l_1 f0 f1 + sum P1; arrive SCALE1; P1 stored (stmatrix)
 *         into Q's atom 8; O_1 += P1 V1_1 (RS); sync P0; O_1 += P0 V0_1 (SS); arrive P1;
 *         wait<1> (P1 V1_1 done): TMA of t1 + 2, atoms 4-8, into slot 1; wait<0> (P0 V0_1 done):
 *         TMA of t0 + 2, atoms 4-8, into slot 0; S1 of t1 + 2, atoms 4-8 then 0-3; wait<0>.
 * So each slot is refilled in two parts, each as soon as its last reader is done: atoms 0-3
 * (V_0) by warpgroup 0, atoms 4-8 (V_1 and the rope dims) by warpgroup 1, one mbarrier per atom
 * and slot, S waiting atom by atom.  On the tensor cores a pair runs P0 V0_0, P1 V1_1, P0 V0_1,
 * P1 V1_0, S0, S1 in about that order; warpgroup 0's softmax overlaps warpgroup 1's S, warpgroup
 * 1's softmax warpgroup 0's P0 V0_0.  Q's atom 8 is copied into registers once (rq8) so that its
 * shared copy can hold P1: three 72 KB tiles, the P0 atom, m, f0, f1, the row sums and 18
 * mbarriers take 231824 bytes.  Named barriers of 256 threads (one warpgroup arrives, the other
 * syncs, once a pair each): SCALE0 (0 -> 1), SCALE1 (1 -> 0), P0 (0 -> 1), P1 (1 -> 0, in pairs
 * with a t1).  The last pairs are separate instances (FlashMLA's IS_BLK*_LAST) so that no wgmma
 * sits behind a tile-count test.
 *
 * What differs from FlashMLA: Q by cp.async, not TMA; key atoms in boxes of 32 keys (two an
 * atom: a tile may start in the middle of a 64-key block), their bytes announced by the copying
 * thread rather than by the waiting warpgroup's first thread; masks wherever a tile is not
 * wholly inside a row's key limit (FlashMLA: the last pair's tiles), and a partial last tile by
 * TMA with its V rows past key_end zeroed (FlashMLA's fill_oob_V; the runs past key_end re-read
 * the first run's rows); O and P0 rescaled only where a factor of the warp is not 1; the
 * warpgroup that reads the other one's key tile for P V waits on that tile's mbarriers too (they
 * are complete); the product's plan (one row tile and key range a CTA, the row-parallel
 * combine), not FlashMLA's persistent tile scheduler with PDL; O stored as the product's.
 * Blocks of >= 32 keys only (the launcher refuses 16).
 *
 * FAST ("flashmla-order-fast-tma"): each warpgroup first tries its softmax against the running
 * maximum (fm_softmax_running, the product's wg_softmax_running): a warp whose rows all have a
 * maximum in m, on a tile wholly inside its rows' key limits, takes P = 2^(S mul - m) with no
 * row maxima, shuffles or rescale, and keeps it unless a thread's row sum of P passes 2^8 (then
 * the exact form, from the intact scores).  Kept, it leaves m as it is and publishes its factor
 * (f0 or f1) as 1, at the same place and between the same barriers as the exact form's, so the
 * exchange is unchanged: m has one copy, in shared memory, written only by the warpgroup whose
 * softmax step it is, and the other one reads it and the factor after the barrier; rows are a
 * warp's (warp w of warpgroup 0 and warp w of warpgroup 1 the same 16), the decision is a vote
 * of the warp, so a row never mixes the two forms within a step.  Warpgroup 0 keeps the scores
 * of a kept tile rather than P0 (no registers more: the exact form keeps P0 in the same array);
 * where warpgroup 1 then moved a row's maximum (f1 != 1), it recomputes P0 f1 = 2^(S0 mul - m1)
 * from m1 in shared memory rather than scaling P0.  No branch on the choice holds a wgmma. */
constexpr int FM_OFF_M = WG_OFF_RED;                     /* float [ROWS] running maximum (log2 domain) */
constexpr int FM_OFF_F0 = FM_OFF_M + ROWS * 4;           /* float [ROWS] warpgroup 0's factor f0 of the pair */
constexpr int FM_OFF_F1 = FM_OFF_F0 + ROWS * 4;          /* float [ROWS] warpgroup 1's factor f1 */
constexpr int FM_OFF_SUM = FM_OFF_F1 + ROWS * 4;         /* float [2][ROWS] row sums (epilogue) */
constexpr int FM_OFF_BARS = FM_OFF_SUM + 2 * ROWS * 4;   /* uint64 [2 slots][9 atoms]: atom landed */
constexpr int FM_SMEM = 1024 /* alignment slack */ + FM_OFF_BARS + 18 * 8;
static_assert(FM_OFF_BARS % 8 == 0 && FM_SMEM <= 232448, "flashmla-order: shared memory fits");

enum {
    FM_BAR_SCALE0 = 1,   /* m0 and f0 written (warpgroup 0 -> 1) */
    FM_BAR_SCALE1 = 2,   /* m1 and f1 written (1 -> 0) */
    FM_BAR_P0 = 3,       /* P0 f1 in the P0 atom (0 -> 1) */
    FM_BAR_P1 = 4,       /* P1 in Q's atom 8, and P0 V0_1 issued (1 -> 0) */
    FM_BAR_WG0 = 5,      /* warpgroup 0 alone (128 threads): its zeroed V rows written */
    FM_BAR_WG1 = 6       /* warpgroup 1 alone */
};

/* S [64 x 64] (+)= A B over 16 dims, A = 16 dims of Q from registers (rows 16 (warp % 4) +
 * lane / 4 (+ 8), dims 2 (lane % 4) (+ 1, + 8, + 9)), B (desc_b) K-major. */
template <bool BF16>
__device__ __forceinline__ void wgmma_qk64_rs(float (&d)[8][4], const uint32_t (&qa)[4], uint64_t desc_b, int accumulate);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_QK64_RS_TEXT(TY) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32" TY TY " " \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
template <bool BF16>
__device__ __forceinline__ void wgmma_qk64_rs(float (&d)[8][4], const uint32_t (&qa)[4], uint64_t desc_b, int accumulate)
{
    if constexpr (BF16)
        asm volatile(WGMMA_QK64_RS_TEXT(".bf16") : WG_ACC_X8(d)
                     : "r"(qa[0]), "r"(qa[1]), "r"(qa[2]), "r"(qa[3]), "l"(desc_b), "r"(accumulate));
    else
        asm volatile(WGMMA_QK64_RS_TEXT(".f16") : WG_ACC_X8(d)
                     : "r"(qa[0]), "r"(qa[1]), "r"(qa[2]), "r"(qa[3]), "l"(desc_b), "r"(accumulate));
}
#undef WGMMA_QK64_RS_TEXT
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

/* The lane's row address for ldmatrix / stmatrix .x4 of 16-column step kk of a warp's 16 rows
 * of a swizzled [64 rows][64 columns] atom at shared address atom: matrix lane / 8 = rows 0-7 /
 * 8-15 (bit 0) x columns 0-7 / 8-15 (bit 1), i.e. registers 0-3 in the A-fragment order. */
__device__ __forceinline__ uint32_t fm_frag_addr(uint32_t atom, int warp4, int lane, int kk)
{
    const int mi = lane >> 3, row = 16 * warp4 + (lane & 7) + 8 * (mi & 1), ch = 2 * kk + (mi >> 1);
    return atom + (uint32_t)(row * 128 + ((ch ^ (row & 7)) << 4));
}
__device__ __forceinline__ void fm_ldsm_x4(uint32_t addr, uint32_t (&r)[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void fm_stsm_x4(uint32_t addr, const uint32_t (&r)[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}

/* One CTA's fixed state, shared by the two warpgroups' pair steps. */
struct fm_ctx {
    const void *tmap;                 /* the latent cache's tensor map */
    const int *bt;                    /* the request's block-table row */
    unsigned char *smem;              /* the aligned start (the Q tile) */
    float *m, *f0, *f1;               /* [ROWS] each, shared */
    uint32_t sq, sk0, sk1, sp0, bars; /* shared addresses: Q, slots 0 and 1, the P0 atom, mbarrier [0][0] */
    int key_begin, key_end, ntiles, bs_log2;
    int tiw, warp4, lane, tig;        /* thread in warpgroup, warp in warpgroup, lane, lane % 4 */
    int lr[2], lim[2];                /* the thread's two tile rows and their key limits */
    float mul;                        /* scores to the log2 domain */
    int fault;
};

/* Cache slots of the two 32-key runs of key tile t: the rows the TMA boxes start at (a run at or
 * past key_end repeats the first run's; a tile that does not exist gets 0s, unused). */
__device__ __forceinline__ void fm_tile_runs(const fm_ctx &c, int t, int (&run)[2])
{
    const int k0 = c.key_begin + t * WG_KEYS, k1 = k0 + 32, mask = (1 << c.bs_log2) - 1;
    run[0] = k0 < c.key_end ? (__ldg(c.bt + (k0 >> c.bs_log2)) << c.bs_log2) + (k0 & mask) : 0;
    run[1] = k1 < c.key_end ? (__ldg(c.bt + (k1 >> c.bs_log2)) << c.bs_log2) + (k1 & mask) : run[0];
}

/* TMA copies of atoms C0 .. C1 - 1 of a key tile (runs: fm_tile_runs) into the slot at shared
 * address sk, each atom onto its own mbarrier (bars: the slot's atom-0 mbarrier) with its 8192
 * bytes announced first; evict-first in L2, as FlashMLA's.  One thread. */
template <int C0, int C1>
__device__ __forceinline__ void fm_tma_atoms(const void *tmap, uint32_t sk, uint32_t bars, const int (&run)[2])
{
    const uint64_t pol = ar_wg::l2_evict_first_policy();
#pragma unroll
    for (int c = C0; c < C1; c++) {
        const uint32_t bar = bars + 8u * (uint32_t)c, dst = sk + (uint32_t)(c * WG_ATOM);
        ar_wg::mbar_arrive_expect_tx(bar, (uint32_t)WG_ATOM);
        ar_wg::tma_load_2d_hint(dst, tmap, bar, c * 64, run[0], pol);
        ar_wg::tma_load_2d_hint(dst + 32 * 128, tmap, bar, c * 64, run[1], pol);
    }
}

/* S (+)= Q K^T over atoms C .. C1 - 1 (64 dims each) of the key tile of descriptor desc_k, one
 * commit group an atom, each issued once its mbarrier (bars + 8 C) shows the phase `parity`:
 * atoms 0-7 SS (Q from shared memory), atom 8 RS (Q from rq8).  ZERO: the first product
 * overwrites S. */
template <bool BF16, int C, int C1, bool ZERO>
__device__ __forceinline__ void fm_s_atoms(float (&s)[8][4], uint64_t desc_q, uint64_t desc_k, const uint32_t (&rq8)[4][4],
                                           uint32_t bars, uint32_t parity)
{
    ar_wg::mbar_wait(bars + 8u * C, parity);
    wg_fence_acc(s);
    ar_wg::fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint32_t koff = (uint32_t)(C * WG_ATOM + kk * 32) >> 4;
        if constexpr (C == 8)
            wgmma_qk64_rs<BF16>(s, rq8[kk], ar_wg::desc_advance(desc_k, koff), ZERO && kk == 0 ? 0 : 1);
        else
            wgmma_qk64<BF16>(s, ar_wg::desc_advance(desc_q, koff), ar_wg::desc_advance(desc_k, koff), ZERO && kk == 0 ? 0 : 1);
    }
    ar_wg::commit();
    wg_fence_acc(s);
    if constexpr (C + 1 < C1) fm_s_atoms<BF16, C + 1, C1, false>(s, desc_q, desc_k, rq8, bars, parity);
}

/* A warpgroup's softmax of its tile (scores s of keys k0 ..) against the running maximum in
 * shared memory, FlashMLA's: masked (-inf) only where the tile is not wholly inside both of the
 * thread's key limits; m_new = max(m, rowmax(s) mul), f = 2^(m - m_new) (m_new = -inf counts as
 * 0), written (f into f_out, m_new into m) by one thread a row after the warp's reads; s becomes
 * P = 2^(s mul - m_new), psum the thread's part of its row sums, pa P as P V's A fragments. */
template <bool BF16>
__device__ __forceinline__ void fm_softmax(const fm_ctx &c, float (&s)[8][4], int k0, float *f_out, float f[2],
                                           float psum[2], uint32_t (&pa)[4][4])
{
    if (!__all_sync(0xffffffffu, k0 + WG_KEYS <= c.lim[0] && k0 + WG_KEYS <= c.lim[1])) {
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (k0 + nt * 8 + 2 * c.tig + (e & 1) >= c.lim[e >> 1]) s[nt][e] = -INFINITY;
    }
    float m_new[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 8; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_old = c.m[c.lr[h]];
        m_new[h] = fmaxf(m_old, mx * c.mul);
        m_use[h] = m_new[h] == -INFINITY ? 0.f : m_new[h];
        f[h] = exp2f(m_old - m_use[h]);
    }
    __syncwarp();                         /* the quad's reads of m before its first thread's write */
    if (c.tig == 0)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            f_out[c.lr[h]] = f[h];
            c.m[c.lr[h]] = m_new[h];
        }
    psum[0] = psum[1] = 0.f;
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float p = exp2f(fmaf(s[nt][e], c.mul, -m_use[e >> 1]));
            s[nt][e] = p;
            psum[e >> 1] += p;
        }
    wg_pack_p<BF16>(s, pa);
}

/* FAST ("flashmla-order-fast-tma"): a warpgroup's softmax of its tile against the running
 * maximum without moving it, the product's wg_softmax_running in this order's terms.  Once every
 * row of the warp has a maximum in m and the tile (keys k0 ..) lies wholly inside both of the
 * thread's key limits, P = 2^(s mul - m) goes straight into pa (P V's A fragments; no shared
 * store here: the caller stores P as in the exact form), without masks, row maxima or their
 * shuffles.  Kept unless one of the thread's row sums of P exceeds 2^8 (every P is at most its
 * row sum; a NaN fails too): then false with s, m and f_out untouched, and the caller runs
 * fm_softmax on the intact scores.  On success m stays as it is, f = 1, and one thread a row
 * writes the factor 1 into f_out, so the other warpgroup reads the same m and a factor 1 (its
 * O and P rescale skipped on those rows); psum the thread's part of its row sums.  The decision
 * is warp-wide (a vote), so both softmax forms cover whole rows.  Not under the planted
 * NO_RESCALE fault, which must show on the exact path. */
template <bool BF16>
__device__ __forceinline__ bool fm_softmax_running(const fm_ctx &c, const float (&s)[8][4], int k0, float *f_out,
                                                   float f[2], float psum[2], uint32_t (&pa)[4][4])
{
    if (c.fault == AR_FAULT_NO_RESCALE) return false;
    const float m_old[2] = {c.m[c.lr[0]], c.m[c.lr[1]]};
    if (!__all_sync(0xffffffffu, m_old[0] != -INFINITY && m_old[1] != -INFINITY && k0 + WG_KEYS <= c.lim[0] &&
                                     k0 + WG_KEYS <= c.lim[1]))
        return false;
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
        const float p0 = exp2f(fmaf(s[nt][0], c.mul, -m_old[0])), p1 = exp2f(fmaf(s[nt][1], c.mul, -m_old[0]));
        const float p2 = exp2f(fmaf(s[nt][2], c.mul, -m_old[1])), p3 = exp2f(fmaf(s[nt][3], c.mul, -m_old[1]));
        rs0 += p0 + p1;
        rs1 += p2 + p3;
        pa[nt >> 1][2 * (nt & 1)] = pack2<BF16>(p0, p1);        /* wg_pack_p's layout */
        pa[nt >> 1][2 * (nt & 1) + 1] = pack2<BF16>(p2, p3);
    }
    if (__any_sync(0xffffffffu, !(rs0 <= 256.f) || !(rs1 <= 256.f))) return false;
    f[0] = f[1] = 1.f;
    psum[0] = rs0;
    psum[1] = rs1;
    if (c.tig == 0) {
        f_out[c.lr[0]] = 1.f;
        f_out[c.lr[1]] = 1.f;
    }
    return true;
}

/* The softmax of a pair step: with FAST the running form first (fm_softmax_running), the exact
 * fm_softmax where that declines.  Returns whether the running form was kept (warp-uniform): s
 * then still holds the scores, otherwise P. */
template <bool BF16, bool FAST>
__device__ __forceinline__ bool fm_softmax_step(const fm_ctx &c, float (&s)[8][4], int k0, float *f_out, float f[2],
                                                float psum[2], uint32_t (&pa)[4][4])
{
    if (FAST && fm_softmax_running<BF16>(c, s, k0, f_out, f, psum, pa)) return true;
    fm_softmax<BF16>(c, s, k0, f_out, f, psum, pa);
    return false;
}

/* P (A fragments pa) into the swizzled [64 rows][64 keys] atom at shared address atom: four
 * stmatrix .x4 a thread. */
__device__ __forceinline__ void fm_store_p(const fm_ctx &c, uint32_t atom, const uint32_t (&pa)[4][4])
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++) fm_stsm_x4(fm_frag_addr(atom, c.warp4, c.lane, kk), pa[kk]);
}

/* Before warpgroup WG's P V of key tile t (slot t & 1) reads its V columns (atoms 4 WG ..
 * 4 WG + 3): WAIT, waits for their mbarriers (phase (t >> 1) & 1; complete already where the
 * other warpgroup waited before its S, and makes the copies visible here as well); TAIL (t is
 * the piece's last tile), where the tile is partial, sets its V rows at and past key_end to zero
 * (P = 0 times the NaN a free cache slot may hold is NaN) and makes them visible to this
 * warpgroup's wgmma. */
template <int WG, bool WAIT, bool TAIL>
__device__ __forceinline__ void fm_v_ready(const fm_ctx &c, int t)
{
    const uint32_t bars = c.bars + 72u * (uint32_t)(t & 1) + 32u * WG;
    if (WAIT || TAIL)
#pragma unroll
        for (int i = 0; i < 4; i++) ar_wg::mbar_wait(bars + 8u * i, (uint32_t)(t >> 1) & 1u);
    if (TAIL) {
        const int valid = c.key_end - c.key_begin - t * WG_KEYS;
        if (valid < WG_KEYS) {
            unsigned char *const sk = c.smem + WG_OFF_K + (t & 1) * WG_TILE;
            for (int i = c.tiw; i < (WG_KEYS - valid) * 32; i += 128) {   /* 16-byte chunks: 4 atoms x 8 a row */
                const int row = valid + (i >> 5), atom = 4 * WG + ((i >> 3) & 3);
                *reinterpret_cast<uint4 *>(sk + atom * WG_ATOM + row * 128 + (i & 7) * 16) = make_uint4(0u, 0u, 0u, 0u);
            }
            ar_wg::fence_proxy_async();
            wg_bar_sync128(WG ? FM_BAR_WG1 : FM_BAR_WG0);
        }
    }
}

/* O [64 x 256] += P (the swizzled atom at shared address p_atom) V[:, 256 WG ..] of the slot at
 * sk (SS; issued and committed, not waited). */
template <bool BF16, int WG>
__device__ __forceinline__ void fm_issue_pv_ss(float (&o)[32][4], uint32_t p_atom, uint32_t sk)
{
    const uint64_t desc_p = ar_wg::desc_sw128(p_atom, 16, 1024);
    const uint64_t desc_v = ar_wg::desc_sw128(sk + (uint32_t)(4 * WG * WG_ATOM), WG_ATOM, 1024);
    wg_fence_acc(o);
    ar_wg::fence();
#pragma unroll
    for (int kk = 0; kk < WG_KEYS / 16; kk++)
        wgmma_pv<BF16>(o, ar_wg::desc_advance(desc_p, (uint32_t)(kk * 2)), ar_wg::desc_advance(desc_v, (uint32_t)(kk * 128)));
    ar_wg::commit();
}

/* Warpgroup 0's steps of the pair (t0, t0 + 1) (FlashMLA's wg0_subroutine).  s: S0 of t0 on
 * entry, S0 of t0 + 2 on exit (LAST = 0).  LAST: 0, tile t0 + 2 exists; 1, t0 + 1 is the
 * piece's last tile; 2, t0 is (no t1).  FAST: the softmax against the running maximum where it
 * holds (fm_softmax_step); a warp that kept it has the scores in s, so where warpgroup 1 moved
 * the maximum of one of its rows (f1 != 1) it recomputes P0 f1 as 2^(s mul - m1) from m1 in
 * shared memory instead of scaling P. */
template <bool BF16, int LAST, bool FAST>
__device__ __forceinline__ void fm_wg0_pair(const fm_ctx &c, float (&s)[8][4], float (&o)[32][4], float l[2],
                                            const uint32_t (&rq8)[4][4], int t0)
{
    const int t1 = t0 + 1;
    const uint32_t par = (uint32_t)(t0 >> 1) & 1u;   /* the phase of slot 0's t0 and slot 1's t1 */
    const uint32_t bars0 = c.bars, bars1 = c.bars + 72u;
    int nx0[2], nx1[2];                  /* the next tiles' runs, read ahead of their copies */
    if (LAST == 0) {
        fm_tile_runs(c, t0 + 2, nx0);
        fm_tile_runs(c, t1 + 2, nx1);
    }
    uint32_t pa[4][4];
    float f0[2], psum[2];
    const bool fast = fm_softmax_step<BF16, FAST>(c, s, c.key_begin + t0 * WG_KEYS, c.f0, f0, psum, pa);
    wg_rescale(o, f0, c.fault);
#pragma unroll
    for (int h = 0; h < 2; h++) l[h] = l[h] * f0[h] + psum[h];
    wg_bar_arrive(FM_BAR_SCALE0);
    if (LAST == 2) fm_v_ready<0, false, true>(c, t0);
    wg_issue_pv_rs<BF16>(o, pa, c.sk0, 0);                  /* O_0 += P0 V0_0 */
    ar_wg::wait<0>();
    wg_fence_acc(o);
    wg_fence_frag(pa);
    wg_bar_sync(FM_BAR_SCALE1);                             /* f1 and m1 written */
    if (LAST == 0) {                                        /* slot 0's atoms 0-3 are free */
        if (c.tiw == 0) fm_tma_atoms<0, 4>(c.tmap, c.sk0, bars0, nx0);
        __syncwarp();
    }
    const float f1[2] = {c.f1[c.lr[0]], c.f1[c.lr[1]]};
    if (__any_sync(0xffffffffu, f1[0] != 1.f || f1[1] != 1.f)) {   /* P0 relative to m1 */
        if (FAST && fast) {                                 /* s: the scores; m (= m1) finite */
            const float m1[2] = {c.m[c.lr[0]], c.m[c.lr[1]]};
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] = exp2f(fmaf(s[nt][e], c.mul, -m1[e >> 1]));
        } else {
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                s[nt][0] *= f1[0];
                s[nt][1] *= f1[0];
                s[nt][2] *= f1[1];
                s[nt][3] *= f1[1];
            }
        }
        wg_pack_p<BF16>(s, pa);
    }
    fm_store_p(c, c.sp0, pa);
    ar_wg::fence_proxy_async();                             /* the P0 stores -> the async proxy */
    wg_bar_arrive(FM_BAR_P0);
    if (LAST != 2) {
        fm_v_ready<0, true, LAST == 1>(c, t1);
        wg_bar_sync(FM_BAR_P1);                             /* P1 stored */
        wg_rescale(o, f1, c.fault);
#pragma unroll
        for (int h = 0; h < 2; h++) l[h] *= f1[h];
        fm_issue_pv_ss<BF16, 0>(o, c.sq + 8u * WG_ATOM, c.sk1);   /* O_0 += P1 V1_0 */
    }
    if (LAST == 0) {
        const uint64_t desc_q = ar_wg::desc_sw128(c.sq, 16, 1024), desc_k = ar_wg::desc_sw128(c.sk0, 16, 1024);
        fm_s_atoms<BF16, 0, 4, true>(s, desc_q, desc_k, rq8, bars0, par ^ 1u);   /* S0 of t0 + 2, atoms 0-3 */
        if (t1 + 2 < c.ntiles) {
            ar_wg::wait<4>();                               /* P1 V1_0 done: slot 1's atoms 0-3 free */
            if (c.tiw == 0) fm_tma_atoms<0, 4>(c.tmap, c.sk1, bars1, nx1);
            __syncwarp();
        }
        fm_s_atoms<BF16, 4, 9, false>(s, desc_q, desc_k, rq8, bars0, par ^ 1u);  /* atoms 4-8 */
    }
    ar_wg::wait<0>();
    wg_fence_acc(o);
    wg_fence_acc(s);
}

/* Warpgroup 1's steps of the pair (t0, t0 + 1) (FlashMLA's wg1_subroutine).  s: S1 of t0 + 1 on
 * entry (unless L0), S1 of t0 + 3 on exit (all false).  L0: t0 is the piece's last tile (no t1);
 * L1: t0 + 1 is; L2: t0 + 2 is.  FAST: the softmax against the running maximum where it holds
 * (fm_softmax_step: f1 = 1 published, m left at m0). */
template <bool BF16, bool L0, bool L1, bool L2, bool FAST>
__device__ __forceinline__ void fm_wg1_pair(const fm_ctx &c, float (&s)[8][4], float (&o)[32][4], float l[2],
                                            const uint32_t (&rq8)[4][4], int t0)
{
    constexpr bool NEXT0 = !L0 && !L1, NEXT1 = !L0 && !L1 && !L2;   /* tiles t0 + 2, t0 + 3 exist */
    const int t1 = t0 + 1;
    const uint32_t par = (uint32_t)(t0 >> 1) & 1u;
    const uint32_t bars0 = c.bars, bars1 = c.bars + 72u;
    int nx0[2], nx1[2];
    if (NEXT0) fm_tile_runs(c, t0 + 2, nx0);
    if (NEXT1) fm_tile_runs(c, t1 + 2, nx1);
    wg_bar_sync(FM_BAR_SCALE0);                             /* f0 and m0 written */
    uint32_t pa[4][4];
    float g[2];                                             /* O_1's factor f0 f1 */
    if (!L0) {
        float f1[2], psum[2];
        fm_softmax_step<BF16, FAST>(c, s, c.key_begin + t1 * WG_KEYS, c.f1, f1, psum, pa);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            g[h] = f1[h] * c.f0[c.lr[h]];
            l[h] = l[h] * g[h] + psum[h];
        }
    } else {                                                /* no t1: m stays, f1 = 1 */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            g[h] = c.f0[c.lr[h]];
            l[h] *= g[h];
        }
        if (c.tig == 0) {
            c.f1[c.lr[0]] = 1.f;
            c.f1[c.lr[1]] = 1.f;
        }
    }
    wg_rescale(o, g, c.fault);
    wg_bar_arrive(FM_BAR_SCALE1);
    if (!L0) {
        fm_store_p(c, c.sq + 8u * WG_ATOM, pa);             /* P1 into Q's atom 8 */
        if (L1) fm_v_ready<1, false, true>(c, t1);
        wg_issue_pv_rs<BF16>(o, pa, c.sk1, 1);              /* O_1 += P1 V1_1 */
        ar_wg::fence_proxy_async();                         /* the P1 stores -> the async proxy */
    }
    wg_bar_sync(FM_BAR_P0);                                 /* P0 f1 stored */
    fm_v_ready<1, true, L0>(c, t0);
    fm_issue_pv_ss<BF16, 1>(o, c.sp0, c.sk0);               /* O_1 += P0 V0_1 */
    if (!L0) wg_bar_arrive(FM_BAR_P1);
    if (NEXT1) {
        ar_wg::wait<1>();                                   /* P1 V1_1 done: slot 1's atoms 4-8 free */
        wg_fence_frag(pa);
        if (c.tiw == 0) fm_tma_atoms<4, 9>(c.tmap, c.sk1, bars1, nx1);
        __syncwarp();
    }
    if (NEXT0) {
        ar_wg::wait<0>();                                   /* P0 V0_1 done: slot 0's atoms 4-8 free */
        wg_fence_acc(o);
        if (c.tiw == 0) fm_tma_atoms<4, 9>(c.tmap, c.sk0, bars0, nx0);
        __syncwarp();
    }
    if (NEXT1) {                                            /* S1 of t1 + 2: atoms 4-8, then 0-3 */
        const uint64_t desc_q = ar_wg::desc_sw128(c.sq, 16, 1024), desc_k = ar_wg::desc_sw128(c.sk1, 16, 1024);
        fm_s_atoms<BF16, 4, 9, true>(s, desc_q, desc_k, rq8, bars1, par ^ 1u);
        fm_s_atoms<BF16, 0, 4, false>(s, desc_q, desc_k, rq8, bars1, par ^ 1u);
    }
    ar_wg::wait<0>();
    wg_fence_acc(o);
    wg_fence_acc(s);
    if (!L0) wg_fence_frag(pa);
}

/* "flashmla-order-tma" (above); tmap as attn_wgmma_tma_kernel's, blocks of >= 32 keys.  FAST
 * ("flashmla-order-fast-tma"): each warpgroup's softmax against the running maximum where it
 * holds (fm_softmax_running). */
template <bool BF16, bool FAST = false>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma_fmorder_kernel(attn_args a, const __grid_constant__ CUtensorMap tmap)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    uint32_t sq_addr;
    unsigned char *const smem = wg_smem_base(&sq_addr);
    const work_item w = a.work[blockIdx.x];
    const int r = w.req;
    const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
    const int nrows = ql * a.num_heads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, tig = lane & 3;
    fm_ctx c;
    c.tmap = &tmap;
    c.bt = a.block_table + (int64_t)r * a.mbpr;
    c.smem = smem;
    c.m = reinterpret_cast<float *>(smem + FM_OFF_M);
    c.f0 = reinterpret_cast<float *>(smem + FM_OFF_F0);
    c.f1 = reinterpret_cast<float *>(smem + FM_OFF_F1);
    c.sq = sq_addr;
    c.sk0 = sq_addr + WG_OFF_K;
    c.sk1 = c.sk0 + WG_TILE;
    c.sp0 = sq_addr + WG_OFF_P;
    c.bars = sq_addr + FM_OFF_BARS;
    c.key_begin = w.key_begin;
    c.key_end = w.key_end;
    c.ntiles = w.key_end > w.key_begin ? (w.key_end - w.key_begin + WG_KEYS - 1) / WG_KEYS : 0;
    c.bs_log2 = a.block_size_log2;
    c.tiw = tid & 127;
    c.warp4 = warp & 3;
    c.lane = lane;
    c.tig = tig;
    c.lr[0] = (warp & 3) * 16 + (lane >> 2);
    c.lr[1] = c.lr[0] + 8;
    row_limits(a, w, sl, ql, nrows, c.lr, c.lim);
    c.mul = a.scale_log2;
    c.fault = a.fault;
    const int n = c.ntiles;

    if (tid == 0) {
        for (int i = 0; i < 18; i++) ar_wg::mbar_init(c.bars + 8u * (uint32_t)i, 1);
        mbar_init_fence();
        ar_wg::tma_prefetch_map(&tmap);
    }
    __syncthreads();
    if (tid == 0) {                       /* tile 0 into slot 0; tile 1 into slot 1, atoms 4-8 first */
        int run[2];
        if (n > 0) {
            fm_tile_runs(c, 0, run);
            fm_tma_atoms<0, 9>(c.tmap, c.sk0, c.bars, run);
        }
        if (n > 1) {
            fm_tile_runs(c, 1, run);
            fm_tma_atoms<4, 9>(c.tmap, c.sk1, c.bars + 72u, run);
            fm_tma_atoms<0, 4>(c.tmap, c.sk1, c.bars + 72u, run);
        }
    }
    wg_load_q<THREADS>(a, w, q0, nrows, smem, tid);
    cp_async_commit();
    if (tid < ROWS) c.m[tid] = -INFINITY;
    float o[32][4];
#pragma unroll
    for (int nt = 0; nt < 32; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[nt][e] = 0.f;
    float l[2] = {0.f, 0.f};
    cp_async_wait<0>();
    ar_wg::fence_proxy_async();
    __syncthreads();                      /* Q and m in place */
    uint32_t rq8[4][4];                   /* Q's atom 8 as A fragments: its shared copy becomes P1's */
#pragma unroll
    for (int kk = 0; kk < 4; kk++) fm_ldsm_x4(fm_frag_addr(c.sq + 8u * WG_ATOM, c.warp4, lane, kk), rq8[kk]);
    const uint64_t desc_q = ar_wg::desc_sw128(c.sq, 16, 1024);
    float s[8][4];
    if (wg == 0) {
        if (n > 0) {                      /* S0 of tile 0: the whole tile, then 36 products */
            for (int i = 0; i < 9; i++) ar_wg::mbar_wait(c.bars + 8u * (uint32_t)i, 0u);
            wg_issue_s<BF16>(s, desc_q, c.sk0);
        }
        ar_wg::wait<0>();
        wg_fence_acc(s);
        int t0 = 0;
#pragma unroll 1
        for (; t0 + 2 < n; t0 += 2) fm_wg0_pair<BF16, 0, FAST>(c, s, o, l, rq8, t0);
        if (t0 + 1 < n)
            fm_wg0_pair<BF16, 1, FAST>(c, s, o, l, rq8, t0);
        else if (t0 < n)
            fm_wg0_pair<BF16, 2, FAST>(c, s, o, l, rq8, t0);
    } else {
        if (n > 1) {                      /* S1 of tile 1, atom by atom: 4-8, then 0-3 */
            const uint64_t desc_k = ar_wg::desc_sw128(c.sk1, 16, 1024);
            fm_s_atoms<BF16, 4, 9, true>(s, desc_q, desc_k, rq8, c.bars + 72u, 0u);
            fm_s_atoms<BF16, 0, 4, false>(s, desc_q, desc_k, rq8, c.bars + 72u, 0u);
        }
        ar_wg::wait<0>();
        wg_fence_acc(s);
        int t0 = 0;
#pragma unroll 1
        for (; t0 + 3 < n; t0 += 2) fm_wg1_pair<BF16, false, false, false, FAST>(c, s, o, l, rq8, t0);
        if (t0 + 2 < n) {
            fm_wg1_pair<BF16, false, false, true, FAST>(c, s, o, l, rq8, t0);
            fm_wg1_pair<BF16, true, false, false, FAST>(c, s, o, l, rq8, t0 + 2);
        } else if (t0 + 1 < n) {
            fm_wg1_pair<BF16, false, true, false, FAST>(c, s, o, l, rq8, t0);
        } else if (t0 < n) {
            fm_wg1_pair<BF16, true, false, false, FAST>(c, s, o, l, rq8, t0);
        }
    }

    /* epilogue: l = l_0 + l_1 (both relative to the final m), normalise, write */
    float *const s_sum = reinterpret_cast<float *>(smem + FM_OFF_SUM);
    quad_sum(l);
    if (tig == 0) {
        s_sum[wg * ROWS + c.lr[0]] = l[0];
        s_sum[wg * ROWS + c.lr[1]] = l[1];
    }
    __syncthreads();
    float m_fin[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] = s_sum[c.lr[h]] + s_sum[ROWS + c.lr[h]];
        m_fin[h] = c.m[c.lr[h]];
    }
    wg_store_rows(a, w, q0, nrows, o, m_fin, l, c.lr, wg, tig);
#else
    (void)a;
    (void)tmap;
    __trap();   /* built without sm_90a: the host never launches this kernel there */
#endif
}

} /* namespace ar_mla */

/* ---------------------------------------------------------------------------------------- */
/* The benchmark                                                                              */

using namespace ar_mla;

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

static cudaError_t launch_seesaw_rs(const attn_args *a, int num_ctas, const CUtensorMap *tmap, cudaStream_t st)
{
    (void)tmap;
    if (a->bf16) attn_wgmma_seesaw_kernel<true, true><<<num_ctas, THREADS, WG_SMEM, st>>>(*a);
    else attn_wgmma_seesaw_kernel<false, true><<<num_ctas, THREADS, WG_SMEM, st>>>(*a);
    return cudaGetLastError();
}

/* "flashmla-order-tma": attn_wgmma_fmorder_kernel (blocks of >= 32 keys: two 32-key boxes an atom) */
static cudaError_t launch_flashmla_order_tma(const attn_args *a, int num_ctas, const CUtensorMap *tmap, cudaStream_t st)
{
    if (!tmap || a->block_size < 32) return cudaErrorInvalidValue;
    if (a->bf16) attn_wgmma_fmorder_kernel<true><<<num_ctas, THREADS, FM_SMEM, st>>>(*a, *tmap);
    else attn_wgmma_fmorder_kernel<false><<<num_ctas, THREADS, FM_SMEM, st>>>(*a, *tmap);
    return cudaGetLastError();
}

/* "flashmla-order-fast-tma": attn_wgmma_fmorder_kernel<BF16, true>, the same order with each
 * warpgroup's softmax against the running maximum (fm_softmax_running) */
static cudaError_t launch_flashmla_order_fast_tma(const attn_args *a, int num_ctas, const CUtensorMap *tmap, cudaStream_t st)
{
    if (!tmap || a->block_size < 32) return cudaErrorInvalidValue;
    if (a->bf16) attn_wgmma_fmorder_kernel<true, true><<<num_ctas, THREADS, FM_SMEM, st>>>(*a, *tmap);
    else attn_wgmma_fmorder_kernel<false, true><<<num_ctas, THREADS, FM_SMEM, st>>>(*a, *tmap);
    return cudaGetLastError();
}

static bool set_attributes(void)
{
    const void *fns[10] = {(const void *)attn_wgmma_seesaw_rs_tma_kernel<true>,
                           (const void *)attn_wgmma_seesaw_rs_tma_kernel<false>,
                           (const void *)attn_wgmma_seesaw_rs_tma_kernel<true, true>,
                           (const void *)attn_wgmma_seesaw_rs_tma_kernel<false, true>,
                           (const void *)attn_wgmma_seesaw_kernel<true, true>,
                           (const void *)attn_wgmma_seesaw_kernel<false, true>,
                           (const void *)attn_wgmma_fmorder_kernel<true>,
                           (const void *)attn_wgmma_fmorder_kernel<false>,
                           (const void *)attn_wgmma_fmorder_kernel<true, true>,
                           (const void *)attn_wgmma_fmorder_kernel<false, true>};
    for (int i = 0; i < 10; i++)
        if (cudaFuncSetAttribute(fns[i], cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 i < 4 ? WG_SMEM_TMA : i < 6 ? WG_SMEM : FM_SMEM) != cudaSuccess)
            return false;
    return true;
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
    static const ar_cuda_mla_lab_kernel lab[] = {{"seesaw-rs-tma", launch_seesaw_rs_tma},
                                                 {"seesaw-fast-tma", launch_seesaw_fast_tma},
                                                 {"seesaw-rs", launch_seesaw_rs},
                                                 {"flashmla-order-tma", launch_flashmla_order_tma},
                                                 {"flashmla-order-fast-tma", launch_flashmla_order_fast_tma}};
    /* argv[2] ..: the lab rows to run (all without) */
    auto wanted = [&](const char *name) {
        if (argc <= 2) return true;
        for (int i = 2; i < argc; i++)
            if (strcmp(argv[i], name) == 0) return true;
        return false;
    };
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
    printf("%-23s %6s %9s %8s %7s %9s %9s %10s\n", "kernel", "s_k", "us", "TFLOP/s", "TB/s", "err out", "err lse",
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
                printf("%-23s %6d error: %.200s\n", k < 0 ? "product" : lab[k].name, sks[ik], err);
                rc = 1;
                continue;
            }
            double err_out, err_lse;
            ar_cuda_mla_ref_errors(&r, sel, B, H, &err_out, &err_lse);
            if (k < 0) memcpy(base_out, r.out, n_out * sizeof(float));
            const double keys = (double)B * sks[ik];
            const double flops = 2.0 * H * keys * (576 + 512), bytes = (keys * 576 + (double)B * H * 1088) * 2.0;
            const bool bad = !(err_out <= 8e-4);
            printf("%-23s %6d %9.1f %8.1f %7.2f %9.2e %9.2e %10.2e%s\n", k < 0 ? r.kernel_name : lab[k].name, sks[ik],
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
