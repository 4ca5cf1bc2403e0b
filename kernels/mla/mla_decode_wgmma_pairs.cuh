/* mla_decode_wgmma_pairs.cuh - the default Hopper (sm_90a) MLA decode kernel for 64-row tiles:
 * attn_wgmma_pairs_kernel, chosen by ar_mla_choose (mla_route.c) for launches with more than 32
 * rows a request on a compute-capability 9.0 device with a 16-bit latent cache whose tensor map
 * can be made (else attn_wgmma_cpasync_kernel of mla_decode_wgmma.cuh runs).  The same work
 * items (64 rows = (token, head) pairs of one request, a key range), arguments, masks, faults and
 * outputs (o_lat / lse, or a split piece's partials for combine_rows_kernel) as the other MLA
 * kernels; the shared pieces (layout, descriptors, loads of Q, the output stores) are
 * mla_decode_wgmma.cuh's.
 *
 * Schedule: key tiles of 64 go in pairs through a ring of two slots, and the two warpgroups see-saw
 * over them in FlashMLA's order (its Hopper dense decode kernel, deepseek-ai/FlashMLA 9241ae3,
 * and the schedule its 2025-04-22 deep-dive describes; facts only, our own code): warpgroup 0
 * computes S of the even tile, warpgroup 1 S of the odd one, each warpgroup owns 256 of the 512
 * output columns and runs P V of both tiles on them, the running maximum and the pair's two
 * rescale factors pass through shared memory, S of the next tiles is issued atom by atom (64 of
 * the 576 dims at a time, each on its own mbarrier) behind the P V products, and each key slot is
 * refilled in two parts as soon as each part's last reader is done.  Measured on the H200
 * (2026-12-04, b = 128, h_q = 128, BENCHMARKS.md), TFLOP/s at 4k / 8k / 16k / 32k keys against
 * the default before (wg_kernel_body's one-warpgroup-S schedule with TMA key tiles, the lab's
 * s1-tma row) in the same run: 540 / 585 / 607 / 619 against 532 / 570 / 587 / 593 (19:13 UTC)
 * and 528 / 562 / 579 / 586 against 529 / 561 / 573 / 576 (19:21 UTC): 0-4%, most at long keys. */
#ifndef AR_MLA_DECODE_WGMMA_PAIRS_CUH
#define AR_MLA_DECODE_WGMMA_PAIRS_CUH

#include "mla_decode_wgmma.cuh"

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

/* A named barrier of one warpgroup's 128 threads. */
__device__ __forceinline__ void wg_bar_sync128(int id) { asm volatile("bar.sync %0, 128;\n" :: "r"(id) : "memory"); }

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

/* attn_wgmma_pairs_kernel: FlashMLA's own order of the seesaw, step for step as its Hopper dense
 * decode kernel runs it (deepseek-ai/FlashMLA 9241ae3, csrc/sm90/decode/dense/splitkv_mla.cuh,
 * and the schedule in its docs/20250422-new-kernel-deep-dive.md), on this file's building blocks.
 *
 * Between pairs, warpgroup 0 holds S0 of the pair's even tile t0 (ring slot 0) and warpgroup 1
 * S1 of its odd tile t1 (slot 1), both complete; the running maximum m [ROWS] lives in shared
 * memory (pairs_ctx::m), read and written by the two warpgroups in turn.  Warpgroup w owns output columns
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
 * are complete); mla_decode.cu's plan (one row tile and key range a CTA, the row-parallel
 * combine), not FlashMLA's persistent tile scheduler with PDL; O stored by wg_store_rows.
 * Blocks of >= 32 keys only (PAIRS_MIN_BLOCK; with 16-key blocks mla_launch_decode runs
 * attn_wgmma_cpasync_kernel).
 *
 * FAST (the product's instance): each warpgroup first tries its softmax against the running
 * maximum (pairs_softmax_running, wg_softmax_running's form): a warp whose rows all have a
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
constexpr int PAIRS_OFF_M = WG_OFF_RED;                    /* float [ROWS] running maximum (log2 domain) */
constexpr int PAIRS_OFF_F0 = PAIRS_OFF_M + ROWS * 4;       /* float [ROWS] warpgroup 0's factor f0 of the pair */
constexpr int PAIRS_OFF_F1 = PAIRS_OFF_F0 + ROWS * 4;      /* float [ROWS] warpgroup 1's factor f1 */
constexpr int PAIRS_OFF_SUM = PAIRS_OFF_F1 + ROWS * 4;     /* float [2][ROWS] row sums (epilogue) */
constexpr int PAIRS_OFF_BARS = PAIRS_OFF_SUM + 2 * ROWS * 4; /* uint64 [2 slots][9 atoms]: atom landed */
/* AR_PAIRS_HANDOVER_MBAR=1 (a compute-sanitizer build, never the product's): the four hand-overs
 * between the warpgroups on mbarriers (4 more after the 18) instead of named barriers, so that
 * racecheck, which does not take a named barrier's arrive as ordering the arriving threads'
 * writes, can check the kernel's shared-memory traffic; everything else the same. */
#ifndef AR_PAIRS_HANDOVER_MBAR
#define AR_PAIRS_HANDOVER_MBAR 0
#endif
constexpr int PAIRS_SMEM = 1024 /* alignment slack */ + PAIRS_OFF_BARS + (18 + 4 * AR_PAIRS_HANDOVER_MBAR) * 8;
static_assert(PAIRS_OFF_BARS % 8 == 0 && PAIRS_SMEM <= 232448, "pairs kernel: shared memory fits");

enum {
    PAIRS_BAR_SCALE0 = 1,   /* m0 and f0 written (warpgroup 0 -> 1) */
    PAIRS_BAR_SCALE1 = 2,   /* m1 and f1 written (1 -> 0) */
    PAIRS_BAR_P0 = 3,       /* P0 f1 in the P0 atom (0 -> 1) */
    PAIRS_BAR_P1 = 4,       /* P1 in Q's atom 8, and P0 V0_1 issued (1 -> 0) */
    PAIRS_BAR_WG0 = 5,      /* warpgroup 0 alone (128 threads): its zeroed V rows written */
    PAIRS_BAR_WG1 = 6       /* warpgroup 1 alone */
};

/* The hand-over id (PAIRS_BAR_SCALE0 .. P1) of pair t0 / 2: the arriving warpgroup's side and the
 * waiting one's.  Named barriers of 256 threads (one warpgroup arrives, the other syncs), or
 * under AR_PAIRS_HANDOVER_MBAR mbarrier id - 1 after the 18 of the key slots (128 arrivals, one
 * phase a pair: neither side gets a pair ahead of the other), the waiting warpgroup's 128
 * threads then meeting on their own barrier as bar.sync 256 made them meet. */
__device__ __forceinline__ void pairs_hand_arrive(uint32_t bars, int id)
{
    if (AR_PAIRS_HANDOVER_MBAR)
        ar_wg::mbar_arrive(bars + 8u * (uint32_t)(17 + id));
    else
        wg_bar_arrive(id);
}
__device__ __forceinline__ void pairs_hand_sync(uint32_t bars, int id, int t0)
{
    if (AR_PAIRS_HANDOVER_MBAR) {
        ar_wg::mbar_wait(bars + 8u * (uint32_t)(17 + id), (uint32_t)(t0 >> 1) & 1u);
        wg_bar_sync128(id == PAIRS_BAR_SCALE0 || id == PAIRS_BAR_P0 ? PAIRS_BAR_WG1 : PAIRS_BAR_WG0);
    } else
        wg_bar_sync(id);
}

/* S [64 x 64] (+)= A B over 16 dims, A = 16 dims of Q from registers (rows 16 (warp % 4) +
 * lane / 4 (+ 8), dims 2 (lane % 4) (+ 1, + 8, + 9)), B (desc_b) K-major (ar_wg::mma_rs_m64n64). */
template <bool BF16>
__device__ __forceinline__ void wgmma_qk64_rs(float (&d)[8][4], const uint32_t (&qa)[4], uint64_t desc_b, int accumulate)
{
    ar_wg::mma_rs_m64n64<BF16>(&d[0][0], qa, desc_b, accumulate);
}

/* The lane's row address for ldmatrix / stmatrix .x4 of 16-column step kk of a warp's 16 rows
 * of a swizzled [64 rows][64 columns] atom at shared address atom: matrix lane / 8 = rows 0-7 /
 * 8-15 (bit 0) x columns 0-7 / 8-15 (bit 1), i.e. registers 0-3 in the A-fragment order. */
__device__ __forceinline__ uint32_t pairs_frag_addr(uint32_t atom, int warp4, int lane, int kk)
{
    const int mi = lane >> 3, row = 16 * warp4 + (lane & 7) + 8 * (mi & 1), ch = 2 * kk + (mi >> 1);
    return atom + (uint32_t)(row * 128 + ((ch ^ (row & 7)) << 4));
}
__device__ __forceinline__ void pairs_ldsm_x4(uint32_t addr, uint32_t (&r)[4])
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void pairs_stsm_x4(uint32_t addr, const uint32_t (&r)[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}

/* One CTA's fixed state, shared by the two warpgroups' pair steps. */
struct pairs_ctx {
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
__device__ __forceinline__ void pairs_tile_runs(const pairs_ctx &c, int t, int (&run)[2])
{
    const int k0 = c.key_begin + t * WG_KEYS, k1 = k0 + 32, mask = (1 << c.bs_log2) - 1;
    run[0] = k0 < c.key_end ? (__ldg(c.bt + (k0 >> c.bs_log2)) << c.bs_log2) + (k0 & mask) : 0;
    run[1] = k1 < c.key_end ? (__ldg(c.bt + (k1 >> c.bs_log2)) << c.bs_log2) + (k1 & mask) : run[0];
}

/* TMA copies of atoms C0 .. C1 - 1 of a key tile (runs: pairs_tile_runs) into the slot at shared
 * address sk, each atom onto its own mbarrier (bars: the slot's atom-0 mbarrier) with its 8192
 * bytes announced first; evict-first in L2, as FlashMLA's.  One thread. */
template <int C0, int C1>
__device__ __forceinline__ void pairs_tma_atoms(const void *tmap, uint32_t sk, uint32_t bars, const int (&run)[2])
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
__device__ __forceinline__ void pairs_s_atoms(float (&s)[8][4], uint64_t desc_q, uint64_t desc_k, const uint32_t (&rq8)[4][4],
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
    if constexpr (C + 1 < C1) pairs_s_atoms<BF16, C + 1, C1, false>(s, desc_q, desc_k, rq8, bars, parity);
}

/* A warpgroup's softmax of its tile (scores s of keys k0 ..) against the running maximum in
 * shared memory, FlashMLA's: masked (-inf) only where the tile is not wholly inside both of the
 * thread's key limits; m_new = max(m, rowmax(s) mul), f = 2^(m - m_new) (m_new = -inf counts as
 * 0), written (f into f_out, m_new into m) by one thread a row after the warp's reads; s becomes
 * P = 2^(s mul - m_new), psum the thread's part of its row sums, pa P as P V's A fragments. */
template <bool BF16>
__device__ __forceinline__ void pairs_softmax(const pairs_ctx &c, float (&s)[8][4], int k0, float *f_out, float f[2],
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

/* FAST: a warpgroup's softmax of its tile against the running maximum without moving it,
 * wg_softmax_running's form in this order's terms.  Once every row of the warp has a maximum in
 * m and the tile (keys k0 ..) lies wholly inside both of the thread's key limits, P = 2^(s mul -
 * m) goes straight into pa (P V's A fragments, by wg_running_p; no shared store here: the caller
 * stores P as in the exact form), without masks, row maxima or their shuffles.  Kept unless one
 * of the thread's row sums of P exceeds 2^8 (every P is at most its row sum; a NaN fails too):
 * then false with s, m and f_out untouched, and the caller runs pairs_softmax on the intact
 * scores.  On success m stays as it is, f = 1, and one thread a row writes the factor 1 into
 * f_out, so the other warpgroup reads the same m and a factor 1 (its O and P rescale skipped on
 * those rows); psum the thread's part of its row sums.  The decision is warp-wide (a vote), so
 * both softmax forms cover whole rows.  Not under the planted NO_RESCALE fault, which must show
 * on the exact path. */
template <bool BF16>
__device__ __forceinline__ bool pairs_softmax_running(const pairs_ctx &c, const float (&s)[8][4], int k0, float *f_out,
                                                   float f[2], float psum[2], uint32_t (&pa)[4][4])
{
    if (c.fault == AR_FAULT_NO_RESCALE) return false;
    const float m_old[2] = {c.m[c.lr[0]], c.m[c.lr[1]]};
    if (!__all_sync(0xffffffffu, m_old[0] != -INFINITY && m_old[1] != -INFINITY && k0 + WG_KEYS <= c.lim[0] &&
                                     k0 + WG_KEYS <= c.lim[1]))
        return false;
    float rs[2];
    if (!wg_running_p<BF16, false>(s, c.mul, m_old, rs, pa, nullptr, c.lr, c.tig)) return false;
    f[0] = f[1] = 1.f;
    psum[0] = rs[0];
    psum[1] = rs[1];
    if (c.tig == 0) {
        f_out[c.lr[0]] = 1.f;
        f_out[c.lr[1]] = 1.f;
    }
    return true;
}

/* The softmax of a pair step: with FAST the running form first (pairs_softmax_running), the exact
 * pairs_softmax where that declines.  Returns whether the running form was kept (warp-uniform): s
 * then still holds the scores, otherwise P. */
template <bool BF16, bool FAST>
__device__ __forceinline__ bool pairs_softmax_step(const pairs_ctx &c, float (&s)[8][4], int k0, float *f_out, float f[2],
                                                float psum[2], uint32_t (&pa)[4][4])
{
    if (FAST && pairs_softmax_running<BF16>(c, s, k0, f_out, f, psum, pa)) return true;
    pairs_softmax<BF16>(c, s, k0, f_out, f, psum, pa);
    return false;
}

/* P (A fragments pa) into the swizzled [64 rows][64 keys] atom at shared address atom: four
 * stmatrix .x4 a thread. */
__device__ __forceinline__ void pairs_store_p(const pairs_ctx &c, uint32_t atom, const uint32_t (&pa)[4][4])
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++) pairs_stsm_x4(pairs_frag_addr(atom, c.warp4, c.lane, kk), pa[kk]);
}

/* Before warpgroup WG's P V of key tile t (slot t & 1) reads its V columns (atoms 4 WG ..
 * 4 WG + 3): WAIT, waits for their mbarriers (phase (t >> 1) & 1; complete already where the
 * other warpgroup waited before its S, and makes the copies visible here as well); TAIL (t is
 * the piece's last tile), where the tile is partial, sets its V rows at and past key_end to zero
 * (P = 0 times the NaN a free cache slot may hold is NaN) and makes them visible to this
 * warpgroup's wgmma. */
template <int WG, bool WAIT, bool TAIL>
__device__ __forceinline__ void pairs_v_ready(const pairs_ctx &c, int t)
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
            wg_bar_sync128(WG ? PAIRS_BAR_WG1 : PAIRS_BAR_WG0);
        }
    }
}

/* O [64 x 256] += P (the swizzled atom at shared address p_atom) V[:, 256 WG ..] of the slot at
 * sk (SS; issued and committed, not waited). */
template <bool BF16, int WG>
__device__ __forceinline__ void pairs_issue_pv_ss(float (&o)[32][4], uint32_t p_atom, uint32_t sk)
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
 * holds (pairs_softmax_step); a warp that kept it has the scores in s, so where warpgroup 1 moved
 * the maximum of one of its rows (f1 != 1) it recomputes P0 f1 as 2^(s mul - m1) from m1 in
 * shared memory instead of scaling P. */
template <bool BF16, int LAST, bool FAST>
__device__ __forceinline__ void pairs_wg0_pair(const pairs_ctx &c, float (&s)[8][4], float (&o)[32][4], float l[2],
                                            const uint32_t (&rq8)[4][4], int t0)
{
    const int t1 = t0 + 1;
    const uint32_t par = (uint32_t)(t0 >> 1) & 1u;   /* the phase of slot 0's t0 and slot 1's t1 */
    const uint32_t bars0 = c.bars, bars1 = c.bars + 72u;
    int nx0[2], nx1[2];                  /* the next tiles' runs, read ahead of their copies */
    if (LAST == 0) {
        pairs_tile_runs(c, t0 + 2, nx0);
        pairs_tile_runs(c, t1 + 2, nx1);
    }
    uint32_t pa[4][4];
    float f0[2], psum[2];
    const bool fast = pairs_softmax_step<BF16, FAST>(c, s, c.key_begin + t0 * WG_KEYS, c.f0, f0, psum, pa);
    wg_rescale(o, f0, c.fault);
#pragma unroll
    for (int h = 0; h < 2; h++) l[h] = l[h] * f0[h] + psum[h];
    pairs_hand_arrive(c.bars, PAIRS_BAR_SCALE0);
    if (LAST == 2) pairs_v_ready<0, false, true>(c, t0);
    wg_issue_pv_rs<BF16>(o, pa, c.sk0, 0);                  /* O_0 += P0 V0_0 */
    ar_wg::wait<0>();
    wg_fence_acc(o);
    wg_fence_frag(pa);
    pairs_hand_sync(c.bars, PAIRS_BAR_SCALE1, t0);                             /* f1 and m1 written */
    if (LAST == 0) {                                        /* slot 0's atoms 0-3 are free */
        if (c.tiw == 0) pairs_tma_atoms<0, 4>(c.tmap, c.sk0, bars0, nx0);
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
            wg_scale_rows(s, f1);
        }
        wg_pack_p<BF16>(s, pa);
    }
    pairs_store_p(c, c.sp0, pa);
    ar_wg::fence_proxy_async();                             /* the P0 stores -> the async proxy */
    pairs_hand_arrive(c.bars, PAIRS_BAR_P0);
    if (LAST != 2) {
        pairs_v_ready<0, true, LAST == 1>(c, t1);
        pairs_hand_sync(c.bars, PAIRS_BAR_P1, t0);                             /* P1 stored */
        wg_rescale(o, f1, c.fault);
#pragma unroll
        for (int h = 0; h < 2; h++) l[h] *= f1[h];
        pairs_issue_pv_ss<BF16, 0>(o, c.sq + 8u * WG_ATOM, c.sk1);   /* O_0 += P1 V1_0 */
    }
    if (LAST == 0) {
        const uint64_t desc_q = ar_wg::desc_sw128(c.sq, 16, 1024), desc_k = ar_wg::desc_sw128(c.sk0, 16, 1024);
        pairs_s_atoms<BF16, 0, 4, true>(s, desc_q, desc_k, rq8, bars0, par ^ 1u);   /* S0 of t0 + 2, atoms 0-3 */
        if (t1 + 2 < c.ntiles) {
            ar_wg::wait<4>();                               /* P1 V1_0 done: slot 1's atoms 0-3 free */
            if (c.tiw == 0) pairs_tma_atoms<0, 4>(c.tmap, c.sk1, bars1, nx1);
            __syncwarp();
        }
        pairs_s_atoms<BF16, 4, 9, false>(s, desc_q, desc_k, rq8, bars0, par ^ 1u);  /* atoms 4-8 */
    }
    ar_wg::wait<0>();
    wg_fence_acc(o);
    wg_fence_acc(s);
}

/* Warpgroup 1's steps of the pair (t0, t0 + 1) (FlashMLA's wg1_subroutine).  s: S1 of t0 + 1 on
 * entry (unless L0), S1 of t0 + 3 on exit (all false).  L0: t0 is the piece's last tile (no t1);
 * L1: t0 + 1 is; L2: t0 + 2 is.  FAST: the softmax against the running maximum where it holds
 * (pairs_softmax_step: f1 = 1 published, m left at m0). */
template <bool BF16, bool L0, bool L1, bool L2, bool FAST>
__device__ __forceinline__ void pairs_wg1_pair(const pairs_ctx &c, float (&s)[8][4], float (&o)[32][4], float l[2],
                                            const uint32_t (&rq8)[4][4], int t0)
{
    constexpr bool NEXT0 = !L0 && !L1, NEXT1 = !L0 && !L1 && !L2;   /* tiles t0 + 2, t0 + 3 exist */
    const int t1 = t0 + 1;
    const uint32_t par = (uint32_t)(t0 >> 1) & 1u;
    const uint32_t bars0 = c.bars, bars1 = c.bars + 72u;
    int nx0[2], nx1[2];
    if (NEXT0) pairs_tile_runs(c, t0 + 2, nx0);
    if (NEXT1) pairs_tile_runs(c, t1 + 2, nx1);
    pairs_hand_sync(c.bars, PAIRS_BAR_SCALE0, t0);                             /* f0 and m0 written */
    uint32_t pa[4][4];
    float g[2];                                             /* O_1's factor f0 f1 */
    if (!L0) {
        float f1[2], psum[2];
        pairs_softmax_step<BF16, FAST>(c, s, c.key_begin + t1 * WG_KEYS, c.f1, f1, psum, pa);
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
    pairs_hand_arrive(c.bars, PAIRS_BAR_SCALE1);
    if (!L0) {
        pairs_store_p(c, c.sq + 8u * WG_ATOM, pa);             /* P1 into Q's atom 8 */
        if (L1) pairs_v_ready<1, false, true>(c, t1);
        wg_issue_pv_rs<BF16>(o, pa, c.sk1, 1);              /* O_1 += P1 V1_1 */
        ar_wg::fence_proxy_async();                         /* the P1 stores -> the async proxy */
    }
    pairs_hand_sync(c.bars, PAIRS_BAR_P0, t0);                                 /* P0 f1 stored */
    pairs_v_ready<1, true, L0>(c, t0);
    pairs_issue_pv_ss<BF16, 1>(o, c.sp0, c.sk0);               /* O_1 += P0 V0_1 */
    if (!L0) pairs_hand_arrive(c.bars, PAIRS_BAR_P1);
    if (NEXT1) {
        ar_wg::wait<1>();                                   /* P1 V1_1 done: slot 1's atoms 4-8 free */
        wg_fence_frag(pa);
        if (c.tiw == 0) pairs_tma_atoms<4, 9>(c.tmap, c.sk1, bars1, nx1);
        __syncwarp();
    }
    if (NEXT0) {
        ar_wg::wait<0>();                                   /* P0 V0_1 done: slot 0's atoms 4-8 free */
        wg_fence_acc(o);
        if (c.tiw == 0) pairs_tma_atoms<4, 9>(c.tmap, c.sk0, bars0, nx0);
        __syncwarp();
    }
    if (NEXT1) {                                            /* S1 of t1 + 2: atoms 4-8, then 0-3 */
        const uint64_t desc_q = ar_wg::desc_sw128(c.sq, 16, 1024), desc_k = ar_wg::desc_sw128(c.sk1, 16, 1024);
        pairs_s_atoms<BF16, 4, 9, true>(s, desc_q, desc_k, rq8, bars1, par ^ 1u);
        pairs_s_atoms<BF16, 0, 4, false>(s, desc_q, desc_k, rq8, bars1, par ^ 1u);
    }
    ar_wg::wait<0>();
    wg_fence_acc(o);
    wg_fence_acc(s);
    if (!L0) wg_fence_frag(pa);
}

/* The kernel (above).  tmap: the latent cache [num_slots, 576] 16-bit as a 2-D tensor, boxes of
 * [32 keys][64 dims] with the 128-byte swizzle (mla_wgmma_tensor_map in mla_decode.cu); blocks of
 * at least PAIRS_MIN_BLOCK keys.  FAST: the softmax against the running maximum where it holds
 * (the product launches that instance; the exact form alone is the lab's pairs-exact row).
 * ptxas (nvcc 13.0, sm_90a): 237 registers with FAST, 245 without; no spills. */
template <bool BF16, bool FAST>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma_pairs_kernel(attn_args a, const __grid_constant__ CUtensorMap tmap)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    uint32_t sq_addr;
    unsigned char *const smem = wg_smem_base(&sq_addr);
    const work_item w = a.work[blockIdx.x];
    const int r = w.req;
    const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
    const int nrows = ql * a.num_heads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, tig = lane & 3;
    pairs_ctx c;
    c.tmap = &tmap;
    c.bt = a.block_table + (int64_t)r * a.mbpr;
    c.smem = smem;
    c.m = reinterpret_cast<float *>(smem + PAIRS_OFF_M);
    c.f0 = reinterpret_cast<float *>(smem + PAIRS_OFF_F0);
    c.f1 = reinterpret_cast<float *>(smem + PAIRS_OFF_F1);
    c.sq = sq_addr;
    c.sk0 = sq_addr + WG_OFF_K;
    c.sk1 = c.sk0 + WG_TILE;
    c.sp0 = sq_addr + WG_OFF_P;
    c.bars = sq_addr + PAIRS_OFF_BARS;
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
        for (int i = 18; i < 18 + 4 * AR_PAIRS_HANDOVER_MBAR; i++) ar_wg::mbar_init(c.bars + 8u * (uint32_t)i, 128);
        mbar_init_fence();
        ar_wg::tma_prefetch_map(&tmap);
    }
    __syncthreads();
    if (tid == 0) {                       /* tile 0 into slot 0; tile 1 into slot 1, atoms 4-8 first */
        int run[2];
        if (n > 0) {
            pairs_tile_runs(c, 0, run);
            pairs_tma_atoms<0, 9>(c.tmap, c.sk0, c.bars, run);
        }
        if (n > 1) {
            pairs_tile_runs(c, 1, run);
            pairs_tma_atoms<4, 9>(c.tmap, c.sk1, c.bars + 72u, run);
            pairs_tma_atoms<0, 4>(c.tmap, c.sk1, c.bars + 72u, run);
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
    for (int kk = 0; kk < 4; kk++) pairs_ldsm_x4(pairs_frag_addr(c.sq + 8u * WG_ATOM, c.warp4, lane, kk), rq8[kk]);
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
        for (; t0 + 2 < n; t0 += 2) pairs_wg0_pair<BF16, 0, FAST>(c, s, o, l, rq8, t0);
        if (t0 + 1 < n)
            pairs_wg0_pair<BF16, 1, FAST>(c, s, o, l, rq8, t0);
        else if (t0 < n)
            pairs_wg0_pair<BF16, 2, FAST>(c, s, o, l, rq8, t0);
    } else {
        if (n > 1) {                      /* S1 of tile 1, atom by atom: 4-8, then 0-3 */
            const uint64_t desc_k = ar_wg::desc_sw128(c.sk1, 16, 1024);
            pairs_s_atoms<BF16, 4, 9, true>(s, desc_q, desc_k, rq8, c.bars + 72u, 0u);
            pairs_s_atoms<BF16, 0, 4, false>(s, desc_q, desc_k, rq8, c.bars + 72u, 0u);
        }
        ar_wg::wait<0>();
        wg_fence_acc(s);
        int t0 = 0;
#pragma unroll 1
        for (; t0 + 3 < n; t0 += 2) pairs_wg1_pair<BF16, false, false, false, FAST>(c, s, o, l, rq8, t0);
        if (t0 + 2 < n) {
            pairs_wg1_pair<BF16, false, false, true, FAST>(c, s, o, l, rq8, t0);
            pairs_wg1_pair<BF16, true, false, false, FAST>(c, s, o, l, rq8, t0 + 2);
        } else if (t0 + 1 < n) {
            pairs_wg1_pair<BF16, false, true, false, FAST>(c, s, o, l, rq8, t0);
        } else if (t0 < n) {
            pairs_wg1_pair<BF16, true, false, false, FAST>(c, s, o, l, rq8, t0);
        }
    }

    /* epilogue: l = l_0 + l_1 (both relative to the final m), normalise, write */
    float *const s_sum = reinterpret_cast<float *>(smem + PAIRS_OFF_SUM);
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

#endif
