/* mla_decode_wgmma.cuh - the Hopper (sm_90a) MLA decode kernels' shared pieces (layout,
 * descriptors, Q and key loads, softmax forms, output stores) and attn_wgmma_cpasync_kernel, the
 * 64-row kernel with cp.async key loads that runs where attn_wgmma_pairs_kernel
 * (mla_decode_wgmma_pairs.cuh, the default for more than 32 rows a request) cannot: no tensor
 * map of the cache, or a block size of 16.  Its body, wg_kernel_body, also has a TMA form (the
 * default before the pairs kernel, 2026-12-04), which kernels/lab/mla_wgmma_seesaw.cu runs as its
 * s1-tma row.  The same work items (64 rows =
 * (token, head) pairs of one request, a key range), arguments, masks, faults and outputs (o_lat /
 * lse, or a split piece's partials for combine_rows_kernel) as attn_tc_kernel in
 * mla_decode_mma.cuh, with both matrix products on wgmma (warpgroup MMA) instead of mma.sync.
 * The Hopper primitives are ar_wg's (kernels/common/cuda_wgmma.cuh).
 *
 * Geometry: one CTA = 256 threads = 2 warpgroups on the same 64 rows; key tiles of 64 keys.
 * Shared memory (1024-byte aligned, 231440 bytes with the alignment slack and two mbarriers):
 *   Q     [64 rows x 576 dims]   9 column atoms of [64 rows][128 bytes] (64 dims each)
 *   K[2]  [64 keys x 576 dims]   a ring of 2 key tiles, the same layout (a third does not fit)
 *   P     [64 rows x 64 keys]    one atom
 *   red   float [ROWS] rescale factors, [2][ROWS] row sums and maxima
 * Every atom is 128-byte swizzled K-major: the 16-byte chunk c of row r is at r * 128 +
 * ((c ^ (r & 7)) << 4) (atoms start on 1024-byte boundaries, so the hardware's swizzle and ours
 * agree).  Per key tile t:
 *   S = Q K^T         warpgroup 0 alone, wgmma m64n64k16 SS, 36 steps of 16 dims (full rows: no
 *                     row-max exchange between warpgroups);
 *   softmax           warpgroup 0: P = 2^(S - m) rounded to the compute dtype into the P tile,
 *                     the per-row rescale factors into red; once every row of a warp has a
 *                     maximum, against the running maximum while each of a thread's row sums
 *                     of P stays within 2^8 (wg_softmax_running: no masks, maxima or rescale on
 *                     a tile wholly inside the rows' key limits; 1.04-1.06x at h_q = 128);
 *   O_w += P V[:, 256 w ..]   both warpgroups, wgmma m64n256k16 SS, A = P, B = the key tile's
 *                     first 512 dims read MN-major (leading byte offset one atom, 8192 bytes,
 *                     between 64-dim groups; stride byte offset 1024 between groups of 8 keys),
 *                     4 steps of 16 keys; O_w is [64 x 256] fp32, 128 registers a thread.
 * Two CTA barriers a tile (tile landed; P written).  Key tiles: every tile wholly below the
 * piece's key_end is copied by the tensor memory accelerator (one thread issues its boxes of
 * {64 dims, min(block size, 32) keys} onto the ring slot's mbarrier, wg_tma_keys); a tile reaching
 * past key_end keeps cp.async by all threads with its zero fill (P = 0 times the NaN a free cache
 * slot may hold would be NaN).
 *
 * Count per key tile: 64 x 64 x (576 + 512) x 2 = 8.91 MFLOP (FlashMLA's count) from 73.7 KB of
 * latent cache; at the H200's ~4096 dense bf16 FLOP/cycle/SM, 2176 cycles of tensor time.
 * ptxas (nvcc 13.0, sm_90a): 248 registers (TMA) / 255 (cp.async), no spills; one CTA per SM.
 * The kernel body exists only in the sm_90a build (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere it
 * traps, and the host picks it only on a compute-capability 9.0 device. */

#ifndef AR_MLA_DECODE_WGMMA_CUH
#define AR_MLA_DECODE_WGMMA_CUH

#include "../common/cuda_wgmma.cuh"
#include "mla_decode_mma.cuh"

namespace ar_mla {

constexpr int WG_KEYS = 64;                       /* keys per tile */
constexpr int WG_CHUNKS = D / 8;                  /* 72 chunks of 16 bytes per 576-dim row */
constexpr int WG_ATOM = 64 * 128;                 /* one 64-dim column atom of a 64-row tile */
constexpr int WG_TILE = 9 * WG_ATOM;              /* Q or a key tile: [64][576] 16-bit */
constexpr int WG_OFF_K = WG_TILE;                 /* the 2 key tiles */
constexpr int WG_OFF_P = 3 * WG_TILE;             /* P tile: one atom */
constexpr int WG_OFF_RED = WG_OFF_P + WG_ATOM;    /* float [2][64] maxima, then [2][64] sums */
constexpr int WG_SMEM = 1024 /* alignment slack */ + WG_OFF_RED + 4 * ROWS * 4;
constexpr int WG_LOADS = 64 * WG_CHUNKS / THREADS;   /* 18 chunks per thread per tile */
static_assert(64 * WG_CHUNKS % THREADS == 0, "wgmma kernel: whole chunks per thread");
static_assert(WG_SMEM <= 232448, "wgmma kernel: more shared memory than an sm_90 block gets");
/* With TMA key tiles: two 8-byte mbarriers (one per ring slot: "tile landed") after red */
constexpr int WG_OFF_BAR = WG_OFF_RED + 4 * ROWS * 4;
constexpr int WG_SMEM_TMA = WG_SMEM + 2 * 8;
constexpr int WG_TMA_THREAD = THREADS / 2;        /* issues the TMA copies: thread 0 of warpgroup 1 */
static_assert(WG_OFF_BAR % 8 == 0 && WG_SMEM_TMA <= 232448, "wgmma kernel with TMA: mbarriers fit");
/* Keys per TMA box of a cache with 2^bs_log2-key blocks: a page, at most 32 keys (a piece's
 * key_begin is a multiple of KEYS = 32, so a 64-key tile may start in the middle of a 64-key
 * block; 32-key runs never straddle a block).  At least 8 (1024 bytes: the swizzle's period);
 * the host makes the tensor map only for blocks of >= 16 keys. */
__host__ __device__ constexpr int wg_tma_rows_log2(int bs_log2) { return bs_log2 < 5 ? bs_log2 : 5; }

/* Byte offset of (row, 16-byte chunk 0..71) in a swizzled 64-row tile. */
__device__ __forceinline__ uint32_t wg_swz(int row, int chunk)
{
    return ar_wg::wg_swizzle<WG_ATOM>(row, chunk);
}

/* This CTA's dynamic shared memory from its first 1024-byte boundary (the 128-byte swizzle
 * repeats every 1024 bytes): the generic pointer, and its shared-window address (the Q tile's)
 * in *addr. */
__device__ __forceinline__ unsigned char *wg_smem_base(uint32_t *addr)
{
    extern __shared__ __align__(1024) unsigned char mla_wg_smem[];
    const uint32_t base0 = (uint32_t)__cvta_generic_to_shared(mla_wg_smem);
    const uint32_t pad = (1024u - (base0 & 1023u)) & 1023u;
    *addr = base0 + pad;
    return mla_wg_smem + pad;
}

/* O [64 rows x 256 columns, same layout] += A (desc_a, K-major) B (desc_b, MN-major). */
template <bool BF16> __device__ __forceinline__ void wgmma_pv(float (&d)[32][4], uint64_t desc_a, uint64_t desc_b);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The inline-assembly pieces of the wgmma wrappers: the accumulator operands of a [N][4] float
 * tile, row by row ("+f"(d[0][0]), "+f"(d[0][1]), ...), and each instruction's text with the
 * operand type (TY: ".bf16" or ".f16") left open - the one difference between the bf16 and fp16
 * wrappers.  The WG_ACC* operand lists stay defined for kernels/lab/. */
#define WG_ACC4(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define WG_ACC_X8(d) \
    WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), \
    WG_ACC4(d, 6), WG_ACC4(d, 7)
#define WG_ACC_X32(d) \
    WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3), WG_ACC4(d, 4), WG_ACC4(d, 5), \
    WG_ACC4(d, 6), WG_ACC4(d, 7), WG_ACC4(d, 8), WG_ACC4(d, 9), WG_ACC4(d, 10), WG_ACC4(d, 11), \
    WG_ACC4(d, 12), WG_ACC4(d, 13), WG_ACC4(d, 14), WG_ACC4(d, 15), WG_ACC4(d, 16), \
    WG_ACC4(d, 17), WG_ACC4(d, 18), WG_ACC4(d, 19), WG_ACC4(d, 20), WG_ACC4(d, 21), \
    WG_ACC4(d, 22), WG_ACC4(d, 23), WG_ACC4(d, 24), WG_ACC4(d, 25), WG_ACC4(d, 26), \
    WG_ACC4(d, 27), WG_ACC4(d, 28), WG_ACC4(d, 29), WG_ACC4(d, 30), WG_ACC4(d, 31)
#define WGMMA_PV_TEXT(TY) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n256k16.f32" TY TY " " \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
    "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, " \
    "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, " \
    "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, " \
    "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, " \
    "%101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, " \
    "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"

template <bool BF16> __device__ __forceinline__ void wgmma_pv(float (&d)[32][4], uint64_t desc_a, uint64_t desc_b)
{
    if constexpr (BF16)
        asm volatile(WGMMA_PV_TEXT(".bf16") : WG_ACC_X32(d) : "l"(desc_a), "l"(desc_b), "r"(1));
    else
        asm volatile(WGMMA_PV_TEXT(".f16") : WG_ACC_X32(d) : "l"(desc_a), "l"(desc_b), "r"(1));
}
#undef WGMMA_PV_TEXT
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

/* Keeps the compiler from moving reads or writes of accumulators across an in-flight wgmma. */
template <int N> __device__ __forceinline__ void wg_fence_acc(float (&d)[N][4])
{
    ar_wg::fence_regs(d);
}

/* S [64 rows x 64 keys, accumulator layout: element (nt, e) is row 16 * (warp % 4) + lane / 4 +
 * 8 * (e >> 1), key 8 nt + 2 (lane % 4) + (e & 1), the layout of mma.sync m16n8 tiles] (+)= A B
 * (both K-major; ar_wg::mma_ss_m64n64). */
template <bool BF16> __device__ __forceinline__ void wgmma_qk64(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    ar_wg::mma_ss_m64n64<BF16>(&d[0][0], desc_a, desc_b, accumulate);
}

/* cp.async of the Q tile (rows row0 .. row0 + 63 of request r's tokens, zeros at and past
 * nrows) into the swizzled tile at sq, by NTHR threads (this one is number i). */
template <int NTHR>
__device__ __forceinline__ void wg_load_q(const attn_args &a, const work_item &w, int q0, int nrows, unsigned char *sq, int i)
{
    const uint16_t *const qg = (const uint16_t *)a.q;
#pragma unroll 4
    for (int k = 0; k < 64 * WG_CHUNKS / NTHR; k++) {
        const int idx = i + k * NTHR, row = idx / WG_CHUNKS, c = idx % WG_CHUNKS;
        const int gr = w.row0 + row;
        const bool valid = gr < nrows;
        cp_async16(sq + wg_swz(row, c), qg + ((int64_t)q0 * a.num_heads + (valid ? gr : 0)) * D + c * 8, valid);
    }
}

/* cp.async of key tile t of the work item (keys key_begin + 64 t .., zeros at and past key_end)
 * of request r into the swizzled tile at sk, by NTHR threads (this one is number i): the
 * block-table entries of the thread's chunks first, then the copies. */
template <int NTHR>
__device__ __forceinline__ void wg_load_keys(const attn_args &a, const work_item &w, int r, int t, unsigned char *sk, int i)
{
    constexpr int LOADS = 64 * WG_CHUNKS / NTHR;
    static_assert(64 * WG_CHUNKS % NTHR == 0, "wgmma kernel: whole chunks per thread");
    const int *const bt = a.block_table + (int64_t)r * a.mbpr;
    const uint16_t *const cache = (const uint16_t *)a.cache;
    const int bs_log2 = a.block_size_log2, bs_mask = a.block_size - 1;
    const int k0 = w.key_begin + t * WG_KEYS;
    int slot[LOADS];
#pragma unroll
    for (int k = 0; k < LOADS; k++) {
        const int j = k0 + (i + k * NTHR) / WG_CHUNKS;
        slot[k] = j < w.key_end ? (__ldg(bt + (j >> bs_log2)) << bs_log2) + (j & bs_mask) : -1;
    }
#pragma unroll
    for (int k = 0; k < LOADS; k++) {
        const int idx = i + k * NTHR, key = idx / WG_CHUNKS, c = idx % WG_CHUNKS;
        const bool valid = slot[k] >= 0;
        cp_async16(sk + wg_swz(key, c), cache + (valid ? (int64_t)slot[k] * D + c * 8 : 0), valid);
    }
}

/* The TMA key tiles' set-up, by the whole CTA: WG_TMA_THREAD initialises the two ring slots'
 * "tile landed" mbarriers (one arrival each: its own, with the expected bytes) and prefetches
 * the tensor map; the barrier makes them initialised before anyone uses them. */
__device__ __forceinline__ void wg_tma_init(uint64_t *full, const void *tmap, int tid)
{
    if (tid == WG_TMA_THREAD) {
        mbar_init(&full[0], 1);
        mbar_init(&full[1], 1);
        mbar_init_fence();
        ar_wg::tma_prefetch_map(tmap);
    }
    __syncthreads();
}

/* TMA copies of the 64 keys k0 .. k0 + 63 of request r (all below the piece's key_end, so
 * every page is in the block table) into the swizzled tile at shared address sk_addr, by one
 * thread, completing on bar (its expected bytes raised by the whole tile first): 64 / rows runs
 * of rows = 2^wg_tma_rows_log2 keys (16 or 32; each inside one block), each as 9 boxes of
 * [rows keys][64 dims] (tmap: the cache as [num_slots][576], box {64, rows}, 128-byte swizzle)
 * onto the run's rows of the 9 column atoms.  TMA's swizzle depends on the shared address
 * (the atoms are 1024-byte aligned, a run starts at a multiple of 16 rows = 2048 bytes), so the
 * boxes land exactly where wg_swz puts the chunks. */
__device__ __forceinline__ void wg_tma_keys(const attn_args &a, const void *tmap, int r, int k0, uint32_t sk_addr,
                                            uint64_t *bar)
{
    const int rows_log2 = wg_tma_rows_log2(a.block_size_log2);
    const int runs = WG_KEYS >> rows_log2;        /* 2 or 4 */
    const int *const bt = a.block_table + (int64_t)r * a.mbpr;
    int slot[4];                                  /* cache slot of each run's first key */
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const int j = k0 + (p << rows_log2);
        slot[p] = p < runs ? (__ldg(bt + (j >> a.block_size_log2)) << a.block_size_log2) + (j & (a.block_size - 1)) : 0;
    }
    const uint32_t bar_addr = (uint32_t)__cvta_generic_to_shared(bar);
    ar_wg::mbar_arrive_expect_tx(bar_addr, (uint32_t)WG_TILE);
#pragma unroll
    for (int p = 0; p < 4; p++) {
        if (p >= runs) break;
        const uint32_t dst = sk_addr + (uint32_t)((p << rows_log2) * 128);
#pragma unroll
        for (int c = 0; c < 9; c++) ar_wg::tma_load_2d(dst + (uint32_t)(c * WG_ATOM), tmap, bar_addr, c * 64, slot[p]);
    }
}

/* Warpgroup 0's softmax of one tile: s [64 x 64] (scores, full rows) becomes P, m_run / l_run
 * updated, alpha (the factor the outputs of both warpgroups are rescaled by) returned. */
__device__ __forceinline__ void wg_softmax_full(float (&s)[8][4], int k0, int tig, const int lim[2], float score_mul,
                                                float m_run[2], float l_run[2], float alpha[2], int fault)
{
    float mx[2];
    mask_scale_rowmax<8>(s, k0, tig, lim, score_mul, mx);
    const float m_old[2] = {m_run[0], m_run[1]};
    softmax_step<8, 0>(s, mx, m_run, l_run, (float (*)[4])0, fault);
#pragma unroll
    for (int h = 0; h < 2; h++) alpha[h] = exp2f(m_old[h] - (m_run[h] == -INFINITY ? 0.f : m_run[h]));
}

/* The thread's pair of P (keys 8 nt + 2 tig and + 1) in row `row` of the swizzled P tile at sp. */
__device__ __forceinline__ uint32_t *wg_p_pair(unsigned char *sp, int row, int nt, int tig)
{
    return reinterpret_cast<uint32_t *>(sp + row * 128 + ((nt ^ (row & 7)) << 4) + 4 * tig);
}

/* The running softmax's tile of P, shared by warpgroup 0's form below and the pairs kernel's
 * (pairs_softmax_running): P = 2^(s x mul - m[h]) for the thread's two rows h, its parts of the
 * row sums in rs, P packed into pa as P V's A fragments (four key steps of 16; wg_pack_p's layout)
 * and, with STORE, written into the swizzled P tile at sp (rows lr) as it goes.  Returns whether
 * every row sum of the warp stays within 2^8 (a NaN fails too): a warp-wide vote. */
template <bool BF16, bool STORE>
__device__ __forceinline__ bool wg_running_p(const float (&s)[8][4], float mul, const float m[2], float rs[2],
                                             uint32_t (&pa)[4][4], unsigned char *sp, const int lr[2], int tig)
{
    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
        const float p0 = exp2f(fmaf(s[nt][0], mul, -m[0])), p1 = exp2f(fmaf(s[nt][1], mul, -m[0]));
        const float p2 = exp2f(fmaf(s[nt][2], mul, -m[1])), p3 = exp2f(fmaf(s[nt][3], mul, -m[1]));
        rs0 += p0 + p1;
        rs1 += p2 + p3;
        const uint32_t lo = pack2<BF16>(p0, p1), hi = pack2<BF16>(p2, p3);
        pa[nt >> 1][2 * (nt & 1)] = lo;
        pa[nt >> 1][2 * (nt & 1) + 1] = hi;
        if constexpr (STORE) {
            *wg_p_pair(sp, lr[0], nt, tig) = lo;
            *wg_p_pair(sp, lr[1], nt, tig) = hi;
        }
    }
    rs[0] = rs0;
    rs[1] = rs1;
    return !__any_sync(0xffffffffu, !(rs0 <= 256.f) || !(rs1 <= 256.f));
}

/* Warpgroup 0's softmax of one tile against the running maxima, fused with the P store: once
 * every row of the warp has a maximum (ready) and the tile lies wholly below both of the
 * thread's key limits, P = 2^(s x score_mul - m_run) goes straight into the swizzled P tile,
 * without masks, row maxima or their shuffles, and the rows' rescale factors stay 1.  Kept unless
 * one of the thread's row sums of P exceeds 2^8 (every P is at most its row sum, so P lies in
 * [0, 256]; a NaN fails too): then false, and the caller runs the exact form (wg_softmax_full,
 * wg_store_p), which rewrites the P tile from the scores s, left intact.  Not under the planted
 * NO_RESCALE fault, which must show on the exact path.  Same-run A/B on the H200 (2026-12-03,
 * BENCHMARKS.md), b = 128, h_q = 128, 4k / 8k / 16k / 32k keys: 1.057 / 1.055 / 1.036 / 1.044x.
 * On success one thread a row writes pub[h] into s_pub[row]: this kernel publishes the rescale
 * factor 1 (s_pub = the alpha array); the lab's seesaw publishes the unchanged maxima.  With FRAGS,
 * P also goes into *pa as the A fragments of P V's four key steps (the layout of the lab's
 * register-operand P V). */
template <bool BF16, bool FRAGS = false>
__device__ __forceinline__ bool wg_softmax_running(const float (&s)[8][4], int k0, int tig, const int lim[2],
                                                   float score_mul, const float m_run[2], float l_run[2],
                                                   unsigned char *sp, float *s_pub, const float pub[2],
                                                   const int lr[2], int fault, bool &ready,
                                                   uint32_t (*pa)[4] = nullptr)
{
    if (fault == AR_FAULT_NO_RESCALE) return false;
    if (!ready) ready = __all_sync(0xffffffffu, m_run[0] != -INFINITY && m_run[1] != -INFINITY);
    if (!ready || !__all_sync(0xffffffffu, k0 + WG_KEYS <= lim[0] && k0 + WG_KEYS <= lim[1])) return false;
    uint32_t frags[4][4];
    float rs[2];
    if (!wg_running_p<BF16, true>(s, score_mul, m_run, rs, frags, sp, lr, tig)) return false;
    if constexpr (FRAGS) {
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int e = 0; e < 4; e++) pa[k][e] = frags[k][e];
    }
    l_run[0] += rs[0];
    l_run[1] += rs[1];
    if (tig == 0) {
        s_pub[lr[0]] = pub[0];
        s_pub[lr[1]] = pub[1];
    }
    return true;
}

/* S [64 x 64] = Q K^T over 576 dims (36 steps of 16), Q at desc_q, K the key tile at sk_addr
 * (issued and committed, not waited). */
template <bool BF16>
__device__ __forceinline__ void wg_issue_s(float (&s)[8][4], uint64_t desc_q, uint32_t sk_addr)
{
    const uint64_t desc_k = ar_wg::desc_sw128(sk_addr, 16, 1024);
    ar_wg::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t koff = (uint32_t)((kk >> 2) * WG_ATOM + (kk & 3) * 32) >> 4;
        wgmma_qk64<BF16>(s, ar_wg::desc_advance(desc_q, koff), ar_wg::desc_advance(desc_k, koff), kk > 0);
    }
    ar_wg::commit();
}

/* x *= f (per row: f[0] for the thread's row lr[0], f[1] for lr[1]) on N accumulator n-tiles */
template <int N> __device__ __forceinline__ void wg_scale_rows(float (&x)[N][4], const float f[2])
{
#pragma unroll
    for (int nt = 0; nt < N; nt++) {
        x[nt][0] *= f[0];
        x[nt][1] *= f[0];
        x[nt][2] *= f[1];
        x[nt][3] *= f[1];
    }
}

/* o *= alpha (per row), skipped when no row of the warp moved or with the NO_RESCALE fault. */
__device__ __forceinline__ void wg_rescale(float (&o)[32][4], const float alpha[2], int fault)
{
    if (fault == AR_FAULT_NO_RESCALE || !__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
    wg_scale_rows(o, alpha);
}

/* Warpgroup 0 writes P (s, full rows) into the swizzled P tile and (one thread a row) alpha. */
template <bool BF16>
__device__ __forceinline__ void wg_store_p(unsigned char *sp, float *s_alpha, const float (&s)[8][4], const int lr[2],
                                           int tig, const float alpha[2])
{
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++) *wg_p_pair(sp, lr[h], nt, tig) = pack2<BF16>(s[nt][2 * h], s[nt][2 * h + 1]);
    if (tig == 0) {
        s_alpha[lr[0]] = alpha[0];
        s_alpha[lr[1]] = alpha[1];
    }
}

/* Normalises (1 / l_run) and writes the thread's rows of o (output columns 256 wg ..) and, from
 * warpgroup 0, their log-sum-exp (m_run + log2 l_run), given the final row sums and maxima. */
__device__ __forceinline__ void wg_store_rows(const attn_args &a, const work_item &w, int q0, int nrows,
                                              float (&o)[32][4], const float m_run[2], const float l_run[2],
                                              const int lr[2], int wg, int tig)
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int gr = w.row0 + lr[h];
        if (gr >= nrows) continue;
        const float inv = l_run[h] > 0.f ? 1.f / l_run[h] : 0.f;
        const float lse2 = l_run[h] > 0.f ? m_run[h] + log2f(l_run[h]) : -INFINITY;
        store_row<32>(a, w, q0, lr[h], h, o, inv, lse2, wg * 256, tig, wg == 0 && tig == 0);
    }
}

/* Epilogue: warpgroup 0 (whose rows the sums and maxima are) publishes them through red, both
 * warpgroups normalise and write their 256 columns. */
__device__ __forceinline__ void wg_finish_rows(const attn_args &a, const work_item &w, int q0, int nrows, float *s_sum,
                                               float (&o)[32][4], float m_run[2], float l_run[2], const int lr[2],
                                               int wg, int tig)
{
    if (wg == 0) {
        quad_sum(l_run);
        if (tig == 0)
            for (int h = 0; h < 2; h++) {
                s_sum[lr[h]] = l_run[h];
                s_sum[ROWS + lr[h]] = m_run[h];
            }
    }
    __syncthreads();
    if (wg == 1)
        for (int h = 0; h < 2; h++) {
            l_run[h] = s_sum[lr[h]];
            m_run[h] = s_sum[ROWS + lr[h]];
        }
    wg_store_rows(a, w, q0, nrows, o, m_run, l_run, lr, wg, tig);
}

/* The kernel body with a TMA switch: attn_wgmma_cpasync_kernel (TMA = false) and the lab's
 * attn_wgmma_tma_kernel (TMA = true; kernels/lab/mla_wgmma_seesaw.cu, its s1-tma row).  Per
 * tile: warpgroup 0 computes S and the softmax and writes P and the rescale factors (red); both
 * warpgroups then run their half of P V.
 * TMA: the key tiles that lie wholly below key_end come by TMA instead
 * (wg_tma_keys: one thread, WG_TMA_THREAD of warpgroup 1, issues tile t + 1's boxes right after
 * tile t's first barrier, onto the full mbarrier of its ring slot; every thread waits on that
 * mbarrier before the barrier of tile t + 1), so the compute threads no longer issue 18 cp.async
 * a tile with their address and block-table arithmetic.  A tile that reaches past key_end (the
 * last of a piece, at most) keeps the cp.async path by all threads with its zero fill: keys past
 * the sequence must read as zeros (P = 0 times the NaN a free cache slot may hold is NaN).  Slot
 * s's mbarrier completes once for each of its TMA tiles, t = s, s + 2, ... in order (only the
 * last tile can be a cp.async one), so tile t waits for parity (t >> 1) & 1.  A slot is refilled
 * only after the CTA barrier that follows both warpgroups' last reads of it (wgmma waited). */
template <bool BF16, bool TMA>
__device__ __forceinline__ void wg_kernel_body(attn_args a, const void *tmap)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    uint32_t sq_addr;                                           /* the Q tile, at the aligned start */
    unsigned char *const smem = wg_smem_base(&sq_addr);
    const uint32_t sk_addr0 = sq_addr + WG_OFF_K, sp_addr = sq_addr + WG_OFF_P;
    float *const s_alpha = reinterpret_cast<float *>(smem + WG_OFF_RED);   /* [ROWS] */
    float *const s_sum = s_alpha + 2 * ROWS;                               /* [2][ROWS] sums, maxima */
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
    /* TMA: whether tile t comes by TMA (wholly below key_end); loads tile t into slot t & 1 (the
     * TMA copies by WG_TMA_THREAD alone, the cp.async ones by every thread) */
    auto tma_tile = [&](int t) { return TMA && w.key_begin + (t + 1) * WG_KEYS <= w.key_end; };
    auto load_tile = [&](int t) {
        if (tma_tile(t)) {
            if (tid == WG_TMA_THREAD)
                wg_tma_keys(a, tmap, r, w.key_begin + t * WG_KEYS, sk_addr0 + (uint32_t)((t & 1) * WG_TILE), &full[t & 1]);
        } else {
            wg_load_keys<THREADS>(a, w, r, t, smem + WG_OFF_K + (t & 1) * WG_TILE, tid);
        }
    };
    if (TMA) wg_tma_init(full, tmap, tid);

    wg_load_q<THREADS>(a, w, q0, nrows, smem, tid);
    cp_async_commit();
    float o[32][4];
#pragma unroll
    for (int nt = 0; nt < 32; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[nt][e] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    bool m_ready = false;                                       /* warpgroup 0: every row of the warp has a maximum */
    const float score_mul = a.scale_log2;                       /* scores to the log2 domain (both softmax forms) */
    const float alpha_one[2] = {1.f, 1.f};                      /* the running form's rescale factors */
    const uint64_t desc_q = ar_wg::desc_sw128(sq_addr, 16, 1024);
    const uint64_t desc_p = ar_wg::desc_sw128(sp_addr, 16, 1024);

    if (ntiles > 0) load_tile(0);
    cp_async_commit();
    for (int t = 0; t < ntiles; t++) {
        if (TMA && tma_tile(t)) mbar_wait(&full[t & 1], (uint32_t)(t >> 1) & 1u);
        if (!TMA || t == 0 || !tma_tile(t)) {   /* Q and a cp.async tile */
            cp_async_wait<0>();
            ar_wg::fence_proxy_async();
        }
        __syncthreads();                  /* tile t complete; tile t - 1's slot, P and alpha free */
        const uint32_t sk_addr = sk_addr0 + (uint32_t)((t & 1) * WG_TILE);
        if (wg == 0) {
            float s[8][4];
            wg_issue_s<BF16>(s, desc_q, sk_addr);
            if (t + 1 < ntiles) load_tile(t + 1);
            cp_async_commit();
            ar_wg::wait<0>();
            wg_fence_acc(s);
            if (!wg_softmax_running<BF16>(s, w.key_begin + t * WG_KEYS, tig, lim, score_mul, m_run, l_run,
                                          smem + WG_OFF_P, s_alpha, alpha_one, lr, a.fault, m_ready)) {
                float alpha[2];
                wg_softmax_full(s, w.key_begin + t * WG_KEYS, tig, lim, score_mul, m_run, l_run, alpha, a.fault);
                wg_rescale(o, alpha, a.fault);
                wg_fence_acc(o);
                wg_store_p<BF16>(smem + WG_OFF_P, s_alpha, s, lr, tig, alpha);
            }
        } else {
            if (t + 1 < ntiles) load_tile(t + 1);
            cp_async_commit();
        }
        ar_wg::fence_proxy_async();       /* P stores -> the async proxy */
        __syncthreads();
        if (wg == 1) {
            const float alpha[2] = {s_alpha[lr[0]], s_alpha[lr[1]]};
            wg_rescale(o, alpha, a.fault);
        }
        wg_fence_acc(o);
        ar_wg::fence();
        const uint64_t desc_v = ar_wg::desc_sw128(sk_addr + (uint32_t)(4 * wg * WG_ATOM), WG_ATOM, 1024);
#pragma unroll
        for (int kk = 0; kk < WG_KEYS / 16; kk++)
            wgmma_pv<BF16>(o, ar_wg::desc_advance(desc_p, (uint32_t)((kk * 32) >> 4)), ar_wg::desc_advance(desc_v, (uint32_t)((kk * 2048) >> 4)));
        ar_wg::commit();
        ar_wg::wait<0>();
        wg_fence_acc(o);
    }
    cp_async_wait<0>();
    wg_finish_rows(a, w, q0, nrows, s_sum, o, m_run, l_run, lr, wg, tig);
#else
    (void)a;
    (void)tmap;
    __trap();   /* built without sm_90a: the host never launches this kernel there */
#endif
}

/* Where the cache's tensor map cannot be made: every key tile by cp.async (all 256 threads; the
 * tile is loaded while S of the current one runs on the tensor cores).  ptxas: 255 registers. */
template <bool BF16>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma_cpasync_kernel(attn_args a)
{
    wg_kernel_body<BF16, false>(a, nullptr);
}

} /* namespace ar_mla */

#endif
