/* cuda_mla_wgmma.cuh - the Hopper (sm_90a) latent attention kernel of the cuda-mla backend
 * (attn_wgmma_kernel, tc_variant TC_WGMMA): the same work items (64 rows = (token, head) pairs
 * of one request, a key range), arguments, masks, faults and outputs (o_lat / lse, or a split
 * piece's partials for combine_kernel) as attn_tc_kernel in cuda_mla.cu, with both matrix
 * products on wgmma (warpgroup MMA) instead of mma.sync.  bf16 and fp16 caches (an fp8 cache
 * stays on attn_tc_kernel).  Included by cuda_mla.cu after its namespace ar_mla (reopened
 * here), so after the helpers it shares with attn_tc_kernel (row_limits, mask_scale_rowmax,
 * softmax_step, quad_sum, store_row, cp_async16, pack2); the Hopper primitives are ar_wg's
 * (cuda_wgmma.cuh).
 *
 * Geometry: one CTA = 256 threads = 2 warpgroups on the same 64 rows; key tiles of 64 keys.
 * Shared memory (1024-byte aligned, 231424 bytes with the alignment slack):
 *   Q     [64 rows x 576 dims]   9 column atoms of [64 rows][128 bytes] (64 dims each)
 *   K[2]  [64 keys x 576 dims]   a ring of 2 key tiles, the same layout
 *   P     [64 rows x 64 keys]    one atom
 *   red   float [2][64] row maxima, [2][64] row sums (one slot per warpgroup)
 * Every atom is 128-byte swizzled K-major: the 16-byte chunk c of row r is at r * 128 +
 * ((c ^ (r & 7)) << 4) (atoms start on 1024-byte boundaries, so the hardware's swizzle and ours
 * agree).  Per key tile t:
 *   S_w = Q K[32 w .. 32 w + 31]^T   warpgroup w, wgmma m64n32k16 SS, 36 steps of 16 dims;
 *   row maxima of both halves exchanged through red (one CTA barrier), the same running max in
 *   both warpgroups (identical arithmetic), P_w = 2^(S_w - m) rounded to the compute dtype into
 *   the P tile, O rescaled, row sums kept per warpgroup (added at the end);
 *   O_w += P V[:, 256 w .. 256 w + 255]   wgmma m64n256k16 SS, A = P (K-major), B = the key
 *   tile's first 512 dims read MN-major (dims are the N side and contiguous; leading byte
 *   offset = one atom, 8192 bytes, between 64-dim groups; stride byte offset 1024 between
 *   groups of 8 keys), 4 steps of 16 keys.  O_w is [64 x 256] fp32: 128 registers a thread.
 * Loads: cp.async of 16-byte chunks with the swizzled address by all 256 threads (18 a thread
 * per tile), one tile ahead, issued while S of the current tile runs on the tensor cores; three
 * CTA barriers per tile (tile landed / maxima / P).
 *
 * Count per key tile (64 rows x 64 keys): 64 x 64 x (576 + 512) x 2 = 8.91 MFLOP (FlashMLA's
 * count) from 64 x 1152 = 73.7 KB of latent cache: 121 FLOP per byte a CTA loads (the two
 * row tiles of h_q = 128 read each key tile once each, the second mostly from L2).  At the
 * H200's ~4096 dense bf16 FLOP/cycle/SM the tensor time is 2176 cycles a tile; 450 TFLOP/s on
 * 132 SMs at ~1.75 GHz allows ~4570 cycles a tile.  Shared-memory reads of the products
 * (128 B/cycle): S 2 x 36 x (2 KB A + 1 KB B) = 216 KB, P V 2 x 4 x (2 KB + 8 KB) = 80 KB,
 * plus 74 KB of cp.async writes: ~2900 cycles a tile, the binding resource of this design
 * (m64n32 SS re-reads Q for every 32 keys).  Both under the budget if the phases overlap
 * well; the serial phases here (S, exchange, P V per tile, in lockstep) leave the tensor pipe
 * idle during the softmax and the barriers.
 *
 * ptxas (nvcc 13.0, sm_90a): 250 registers a thread, no spills, 231424 bytes of dynamic shared
 * memory (an sm_90 block may have 232448): one CTA per SM.
 *
 * Round 2 adds three variants (the host picks one: AR_MLA_WG_VARIANT / ar_cuda_mla_case.wg_variant,
 * 0 = the kernel above, then the default): 1 attn_wgmma_s1_kernel (S by warpgroup 0 alone with
 * m64n64k16, 144 KB of shared reads a tile instead of 216, no max exchange: two CTA barriers a
 * tile), 2 and 3 attn_wgmma_ws_kernel (warp-specialised: warpgroup 1 loads and runs its half of
 * P V, warpgroup 0 runs S, the softmax and its half, named barriers instead of CTA barriers, so
 * the tensor pipe runs warpgroup 1's P V and warpgroup 0's next S back to back; 3 reads
 * warpgroup 0's P from shared memory instead of registers).  ptxas: s1 250 registers, ws 255,
 * no spills.  Round 2's H200 sweep (b = 128, h_q = 128, bf16): s1 357 - 383 TFLOP/s, base
 * 328 - 357, ws 320 - 351, ws-ss 325 - 354, so s1 (variant 1) is the host's default since.
 *
 * Round 3 adds variant 4, attn_wgmma_seesaw_kernel (FlashMLA's seesaw schedule: the two
 * warpgroups compute S of alternate key tiles with m64n64k16, exchange the row max and P through
 * shared memory, and each runs P V of both tiles on its 256 output columns, so each one's
 * softmax overlaps the other's tensor work; P goes into the rope atom of its key tile, which only
 * S reads), and variant 5, the same kernel with each warpgroup's own P taken from registers
 * (seesaw-rs).  ptxas: seesaw 225 registers, seesaw-rs 227, no spills.  H200 (2026-11-30,
 * 10:10 UTC, same run): seesaw 344 - 387 TFLOP/s, seesaw-rs 343 - 391, s1 353 - 384 (4k - 32k
 * keys): within 2% of s1, better at 16k - 32k and worse at 4k, so s1 stays the default.
 *
 * Round 4 adds the TMA variants 6 (attn_wgmma_s1_tma_kernel, "s1-tma") and 7
 * (attn_wgmma_seesaw_rs_tma_kernel, "seesaw-rs-tma"): s1 and seesaw-rs with every key tile that
 * lies wholly below the piece's key_end copied by the tensor memory accelerator instead of
 * cp.async (one thread issues a tile's boxes - 18 for blocks of 32 / 64 keys, 36 for 16 - onto
 * the full mbarrier of its ring slot; wg_tma_keys), so the compute threads no longer spend
 * issue slots on 18 (s1) or 36 (seesaw's loading warpgroup) cp.async a tile with swizzle and
 * block-table arithmetic.  A tile reaching past key_end keeps the cp.async path (its zero fill:
 * P = 0 times a NaN in a free cache slot would be NaN).  The tensor map (a kernel parameter,
 * const __grid_constant__) views the cache as [num_slots][576] with boxes of {64 dims,
 * min(block size, 32) keys} (32, not 64: a piece starts at a multiple of 32 keys, so a 64-key
 * tile may straddle two 64-key blocks); the host makes it per launch (wg_prepare_tma in
 * cuda_mla.cu) and runs the cp.async twin (1 / 5) if the driver refuses it.  Shared memory: the
 * same ring of 2 key tiles (a third, 72 KB, does not fit: Q 72 + 2 x 72 + P 8 KB + red is
 * already 226 KB of the 227 KB a block may have) plus two 8-byte mbarriers: 231440 bytes.
 * ptxas: s1-tma 248 registers, seesaw-rs-tma 220, no spills.  H200 (2026-11-30, 11:52 UTC,
 * same run, b = 128, h_q = 128): s1-tma 506 / 541 / 557 / 567 TFLOP/s at 4k / 8k / 16k / 32k
 * keys, seesaw-rs-tma 500 / 539 / 561 / 572, s1 354 / 367 / 378 / 383: s1-tma (6) is the
 * host's default since (both pass the forced test, 512 cases, and the FlashMLA dense grid as
 * the default).
 *
 * The kernel body exists only in the sm_90a build (__CUDA_ARCH_FEAT_SM90_ALL); elsewhere it
 * traps, and the host picks it only on a compute-capability 9.0 device with a bf16/fp16 cache
 * (choose_variant in cuda_mla.cu). */
#ifndef AR_CUDA_MLA_WGMMA_CUH
#define AR_CUDA_MLA_WGMMA_CUH

#include "cuda_wgmma.cuh"

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
/* TMA variants (6, 7): two 8-byte mbarriers (one per ring slot: "tile landed") after red */
constexpr int WG_OFF_BAR = WG_OFF_RED + 4 * ROWS * 4;
constexpr int WG_SMEM_TMA = WG_SMEM + 2 * 8;
constexpr int WG_TMA_THREAD = THREADS / 2;        /* issues the TMA copies: thread 0 of warpgroup 1 */
static_assert(WG_OFF_BAR % 8 == 0 && WG_SMEM_TMA <= 232448, "wgmma TMA variants: mbarriers fit");
/* Keys per TMA box of a cache with 2^bs_log2-key blocks: a page, at most 32 keys (a piece's
 * key_begin is a multiple of KEYS = 32, so a 64-key tile may start in the middle of a 64-key
 * block; 32-key runs never straddle a block).  At least 8 (1024 bytes: the swizzle's period);
 * the host takes the TMA variants only for blocks of >= 16 keys. */
__host__ __device__ constexpr int wg_tma_rows_log2(int bs_log2) { return bs_log2 < 5 ? bs_log2 : 5; }

/* Byte offset of (row, 16-byte chunk 0..71) in a swizzled 64-row tile. */
__device__ __forceinline__ uint32_t wg_swz(int row, int chunk)
{
    return (uint32_t)((chunk >> 3) * WG_ATOM + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
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

/* S [64 rows x 32 keys of this warpgroup, accumulator layout: element (nt, e) is row
 * 16 * (warp % 4) + lane / 4 + 8 * (e >> 1), key 8 nt + 2 (lane % 4) + (e & 1), the layout of
 * mma.sync m16n8 tiles] (+)= A (desc_a, K-major) B (desc_b, K-major). */
template <bool BF16> __device__ __forceinline__ void wgmma_qk(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b, int accumulate);
/* O [64 rows x 256 columns, same layout] += A (desc_a, K-major) B (desc_b, MN-major). */
template <bool BF16> __device__ __forceinline__ void wgmma_pv(float (&d)[32][4], uint64_t desc_a, uint64_t desc_b);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The inline-assembly pieces of the wgmma wrappers of this file: the accumulator operands of a
 * [N][4] float tile, row by row ("+f"(d[0][0]), "+f"(d[0][1]), ...), and each instruction's
 * text with the operand type (TY: ".bf16" or ".f16") left open - the one difference between
 * the bf16 and fp16 wrappers. */
#define WG_ACC4(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define WG_ACC_X4(d) \
    WG_ACC4(d, 0), WG_ACC4(d, 1), WG_ACC4(d, 2), WG_ACC4(d, 3)
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
#define WGMMA_QK_TEXT(TY) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n32k16.f32" TY TY " " \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
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

template <bool BF16> __device__ __forceinline__ void wgmma_qk(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    if constexpr (BF16)
        asm volatile(WGMMA_QK_TEXT(".bf16") : WG_ACC_X4(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    else
        asm volatile(WGMMA_QK_TEXT(".f16") : WG_ACC_X4(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
template <bool BF16> __device__ __forceinline__ void wgmma_pv(float (&d)[32][4], uint64_t desc_a, uint64_t desc_b)
{
    if constexpr (BF16)
        asm volatile(WGMMA_PV_TEXT(".bf16") : WG_ACC_X32(d) : "l"(desc_a), "l"(desc_b), "r"(1));
    else
        asm volatile(WGMMA_PV_TEXT(".f16") : WG_ACC_X32(d) : "l"(desc_a), "l"(desc_b), "r"(1));
}
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

/* Keeps the compiler from moving reads or writes of accumulators across an in-flight wgmma. */
template <int N> __device__ __forceinline__ void wg_fence_acc(float (&d)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[i][e])::"memory");
}

template <bool BF16>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma_kernel(attn_args a)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    uint32_t sq_addr;                                           /* the Q tile, at the aligned start */
    unsigned char *const smem = wg_smem_base(&sq_addr);
    const uint32_t sk_addr0 = sq_addr + WG_OFF_K;               /* key tile of slot s at + s * WG_TILE */
    const uint32_t sp_addr = sq_addr + WG_OFF_P;                /* P tile */
    float *const s_max = reinterpret_cast<float *>(smem + WG_OFF_RED);   /* [2][ROWS] */
    float *const s_sum = s_max + 2 * ROWS;                               /* [2][ROWS] */

    const work_item w = a.work[blockIdx.x];
    const int r = w.req, H = a.num_heads;
    const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
    const int nrows = ql * H;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2;                                   /* key half of S, column half of O */
    const int tig = lane & 3;
    const int lr[2] = {(warp & 3) * 16 + (lane >> 2), (warp & 3) * 16 + (lane >> 2) + 8};
    int lim[2];
    row_limits(a, w, sl, ql, nrows, lr, lim);

    /* Q tile: rows row0 .. row0 + 63 (zeros at and past nrows), one commit group */
    const uint16_t *const qg = (const uint16_t *)a.q;
#pragma unroll
    for (int k = 0; k < WG_LOADS; k++) {
        const int i = tid + k * THREADS, row = i / WG_CHUNKS, c = i % WG_CHUNKS;
        const int gr = w.row0 + row;
        const bool valid = gr < nrows;
        cp_async16(smem + wg_swz(row, c), qg + ((int64_t)q0 * H + (valid ? gr : 0)) * D + c * 8, valid);
    }
    cp_async_commit();

    /* key tile t -> ring slot t & 1 (zeros at and past key_end): the block-table entries of the
     * thread's 18 chunks first, then the copies */
    const int ntiles = w.key_end > w.key_begin ? (w.key_end - w.key_begin + WG_KEYS - 1) / WG_KEYS : 0;
    const int *const bt = a.block_table + (int64_t)r * a.mbpr;
    const uint16_t *const cache = (const uint16_t *)a.cache;
    const int bs_log2 = a.block_size_log2, bs_mask = a.block_size - 1;
    auto load_tile = [&](int t) {
        unsigned char *const sk = smem + WG_OFF_K + (t & 1) * WG_TILE;
        const int k0 = w.key_begin + t * WG_KEYS;
        int slot[WG_LOADS];
#pragma unroll
        for (int k = 0; k < WG_LOADS; k++) {
            const int j = k0 + (tid + k * THREADS) / WG_CHUNKS;
            slot[k] = j < w.key_end ? (__ldg(bt + (j >> bs_log2)) << bs_log2) + (j & bs_mask) : -1;
        }
#pragma unroll
        for (int k = 0; k < WG_LOADS; k++) {
            const int i = tid + k * THREADS, key = i / WG_CHUNKS, c = i % WG_CHUNKS;
            const bool valid = slot[k] >= 0;
            cp_async16(sk + wg_swz(key, c), cache + (valid ? (int64_t)slot[k] * D + c * 8 : 0), valid);
        }
    };

    float o[32][4];
#pragma unroll
    for (int nt = 0; nt < 32; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[nt][e] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    const float score_mul = a.scale_log2;
    /* descriptors of offset 0 (the start-address field is the low 14 bits in 16-byte units:
     * adding byte_offset >> 4 moves it, every address here is below 256 KB) */
    const uint64_t desc_q = ar_wg::desc_sw128(sq_addr, 16, 1024);
    const uint64_t desc_p = ar_wg::desc_sw128(sp_addr, 16, 1024);

    if (ntiles > 0) load_tile(0);
    cp_async_commit();
    for (int t = 0; t < ntiles; t++) {
        cp_async_wait<0>();               /* this thread's copies of Q and tile t */
        ar_wg::fence_proxy_async();       /* cp.async writes -> the async proxy (wgmma reads) */
        __syncthreads();                  /* tile t complete; both warpgroups done with tile t-1's
                                             slot, P tile and maxima */
        const uint32_t sk_addr = sk_addr0 + (uint32_t)((t & 1) * WG_TILE);
        const int k0 = w.key_begin + t * WG_KEYS;

        /* S_w = Q K[32 wg ..]^T over 576 dims */
        const uint64_t desc_k = ar_wg::desc_sw128(sk_addr + (uint32_t)(wg * 32 * 128), 16, 1024);
        float s[4][4];
        ar_wg::fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const uint32_t koff = (uint32_t)((kk >> 2) * WG_ATOM + (kk & 3) * 32) >> 4;
            wgmma_qk<BF16>(s, desc_q + koff, desc_k + koff, kk > 0);
        }
        ar_wg::commit();
        /* tile t + 1 into the slot tile t - 1 left, while S runs (S reads Q and slot t & 1) */
        if (t + 1 < ntiles) load_tile(t + 1);
        cp_async_commit();
        ar_wg::wait<0>();
        wg_fence_acc(s);

        /* mask, log2 domain, row maxima of both key halves, online softmax */
        float mx[2];
        mask_scale_rowmax<4>(s, k0 + 32 * wg, tig, lim, score_mul, mx);
        if (tig == 0) {
            s_max[wg * ROWS + lr[0]] = mx[0];
            s_max[wg * ROWS + lr[1]] = mx[1];
        }
        __syncthreads();
        mx[0] = fmaxf(mx[0], s_max[(1 - wg) * ROWS + lr[0]]);
        mx[1] = fmaxf(mx[1], s_max[(1 - wg) * ROWS + lr[1]]);
        /* P, running max and sums by softmax_step (its output rescale left out: NTO = 0); O
         * rescaled here by the same alpha, skipped when no row max of the warp moved (the common
         * case once a long context's maxima settle: 128 multiplies a thread a tile saved) */
        const float m_old[2] = {m_run[0], m_run[1]};
        softmax_step<4, 0>(s, mx, m_run, l_run, o, a.fault);
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; h++) alpha[h] = exp2f(m_old[h] - (m_run[h] == -INFINITY ? 0.f : m_run[h]));
        if (a.fault != AR_FAULT_NO_RESCALE && __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
            for (int nt = 0; nt < 32; nt++) {
                o[nt][0] *= alpha[0];
                o[nt][1] *= alpha[0];
                o[nt][2] *= alpha[1];
                o[nt][3] *= alpha[1];
            }
        }
        wg_fence_acc(o);                  /* the rescale before the P stores and the barrier */

        /* P_w -> keys 32 wg .. 32 wg + 31 of the P tile (swizzled K-major) */
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = lr[h], chunk = 4 * wg + nt;
                *reinterpret_cast<uint32_t *>(smem + WG_OFF_P + row * 128 + ((chunk ^ (row & 7)) << 4) + 4 * tig) =
                    pack2<BF16>(s[nt][2 * h], s[nt][2 * h + 1]);
            }
        ar_wg::fence_proxy_async();       /* P stores -> the async proxy */
        __syncthreads();

        /* O_w += P V[:, 256 wg ..]: 4 steps of 16 keys */
        wg_fence_acc(o);
        ar_wg::fence();
        const uint64_t desc_v = ar_wg::desc_sw128(sk_addr + (uint32_t)(4 * wg * WG_ATOM), WG_ATOM, 1024);
#pragma unroll
        for (int kk = 0; kk < WG_KEYS / 16; kk++)
            wgmma_pv<BF16>(o, desc_p + (uint32_t)((kk * 32) >> 4), desc_v + (uint32_t)((kk * 2048) >> 4));
        ar_wg::commit();
        ar_wg::wait<0>();
        wg_fence_acc(o);
    }
    cp_async_wait<0>();

    /* epilogue: row sums of both key halves (each warpgroup summed its own 32 keys of every
     * tile; added in the same order by both: l0 + l1 == l1 + l0), normalise, write */
    quad_sum(l_run);
    if (tig == 0) {
        s_sum[wg * ROWS + lr[0]] = l_run[0];
        s_sum[wg * ROWS + lr[1]] = l_run[1];
    }
    __syncthreads();
    l_run[0] += s_sum[(1 - wg) * ROWS + lr[0]];
    l_run[1] += s_sum[(1 - wg) * ROWS + lr[1]];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int gr = w.row0 + lr[h];
        if (gr >= nrows) continue;
        const float inv = l_run[h] > 0.f ? 1.f / l_run[h] : 0.f;
        const float lse2 = l_run[h] > 0.f ? m_run[h] + log2f(l_run[h]) : -INFINITY;
        store_row<32>(a, w, q0, lr[h], h, o, inv, lse2, wg * 256, tig, wg == 0 && tig == 0);
    }
#else
    __trap();   /* built without sm_90a: the host never launches this kernel there */
#endif
}


/* ---------------------------------------------------------------------------------------- */
/* Round-2 variants (AR_MLA_WG_VARIANT, see wg_variants in cuda_mla.cu).  Both compute S for  */
/* the whole 64-key tile in warpgroup 0 alone with wgmma m64n64k16 SS: per 16-dim step 2 KB   */
/* of Q + 2 KB of keys read from shared memory for 64 x 64 x 16 MACs, 144 KB a tile instead   */
/* of the two m64n32 halves' 216 KB (Q read twice), ~1150 cycles at 128 B/cycle, balanced     */
/* with the tensor time of S (~1150); the full rows stay in one warpgroup, so the row-max     */
/* exchange and its barrier go away and the row sums are warpgroup 0's alone.  Warpgroup 0    */
/* hands P (through the shared P tile) and the per-row rescale factors alpha (through red)    */
/* to warpgroup 1, which owns output columns 256 .. 511 as before.                            */
/* ---------------------------------------------------------------------------------------- */

/* S [64 rows x 64 keys, accumulator layout as wgmma_qk's with nt = 0..7] (+)= A B (both K-major). */
template <bool BF16> __device__ __forceinline__ void wgmma_qk64(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int accumulate);
/* O [64 rows x 256 columns] += P (A fragments in registers: rows 16 (warp % 4) + lane / 4 (+ 8),
 * keys 2 (lane % 4) (+ 1, + 8, + 9) of the 16-key step) V (desc_b, MN-major). */
template <bool BF16> __device__ __forceinline__ void wgmma_pv_rs(float (&d)[32][4], const uint32_t (&pa)[4], uint64_t desc_b);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_QK64_TEXT(TY) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32" TY TY " " \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
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

template <bool BF16> __device__ __forceinline__ void wgmma_qk64(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    if constexpr (BF16)
        asm volatile(WGMMA_QK64_TEXT(".bf16") : WG_ACC_X8(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    else
        asm volatile(WGMMA_QK64_TEXT(".f16") : WG_ACC_X8(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
template <bool BF16> __device__ __forceinline__ void wgmma_pv_rs(float (&d)[32][4], const uint32_t (&pa)[4], uint64_t desc_b)
{
    if constexpr (BF16)
        asm volatile(WGMMA_PV_RS_TEXT(".bf16") : WG_ACC_X32(d) : "r"(pa[0]), "r"(pa[1]), "r"(pa[2]), "r"(pa[3]), "l"(desc_b), "r"(1));
    else
        asm volatile(WGMMA_PV_RS_TEXT(".f16") : WG_ACC_X32(d) : "r"(pa[0]), "r"(pa[1]), "r"(pa[2]), "r"(pa[3]), "l"(desc_b), "r"(1));
}
#undef WG_ACC4
#undef WG_ACC_X4
#undef WG_ACC_X8
#undef WG_ACC_X32
#undef WGMMA_QK_TEXT
#undef WGMMA_PV_TEXT
#undef WGMMA_QK64_TEXT
#undef WGMMA_PV_RS_TEXT
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

/* Named barriers of the warp-specialised variant: 256 threads each, the 128 of the waiting
 * warpgroup (bar.sync) and the 128 of the signalling one (bar.arrive).  Id 0 is __syncthreads. */
enum {
    WG_BAR_FULL0 = 1,    /* key tile in slot 0 landed (warpgroup 1 -> 0); slot 1: + 1 */
    WG_BAR_EMPTY0 = 3,   /* warpgroup 0 done reading slot 0 (0 -> 1); slot 1: + 1 */
    WG_BAR_PREADY = 5,   /* P tile and alpha of this tile written (0 -> 1) */
    WG_BAR_PFREE = 6,    /* warpgroup 1 done with the P tile and alpha (1 -> 0) */
    WG_BAR_WG0 = 7       /* warpgroup 0 alone (128 threads): its P stores done (variant 3) */
};
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

/* The TMA variants' set-up, by the whole CTA: WG_TMA_THREAD initialises the two ring slots'
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

/* o *= alpha (per row), skipped when no row of the warp moved or with the NO_RESCALE fault. */
__device__ __forceinline__ void wg_rescale(float (&o)[32][4], const float alpha[2], int fault)
{
    if (fault == AR_FAULT_NO_RESCALE || !__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
    for (int nt = 0; nt < 32; nt++) {
        o[nt][0] *= alpha[0];
        o[nt][1] *= alpha[0];
        o[nt][2] *= alpha[1];
        o[nt][3] *= alpha[1];
    }
}

/* Warpgroup 0 writes P (s, full rows) into the swizzled P tile and (one thread a row) alpha. */
template <bool BF16>
__device__ __forceinline__ void wg_store_p(unsigned char *sp, float *s_alpha, const float (&s)[8][4], const int lr[2],
                                           int tig, const float alpha[2])
{
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = lr[h];
            *reinterpret_cast<uint32_t *>(sp + row * 128 + ((nt ^ (row & 7)) << 4) + 4 * tig) =
                pack2<BF16>(s[nt][2 * h], s[nt][2 * h + 1]);
        }
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

/* Epilogue of the variants whose row sums / maxima are warpgroup 0's: it publishes them through
 * red, both warpgroups normalise and write their 256 columns. */
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

/* The s1 schedule with a TMA switch: variant 1 (attn_wgmma_s1_kernel, TMA = false) and
 * variant 6 (attn_wgmma_s1_tma_kernel, TMA = true).  (Until session 4 variant 1 had its own copy
 * of this text; ptxas gives the body 254 registers instead of that copy's 250, no spills.)
 * TMA (variant 6, "s1-tma"): the key tiles that lie wholly below key_end come by TMA instead
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
__device__ __forceinline__ void wg_s1_body(attn_args a, const void *tmap)
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
            const uint64_t desc_k = ar_wg::desc_sw128(sk_addr, 16, 1024);
            ar_wg::fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const uint32_t koff = (uint32_t)((kk >> 2) * WG_ATOM + (kk & 3) * 32) >> 4;
                wgmma_qk64<BF16>(s, desc_q + koff, desc_k + koff, kk > 0);
            }
            ar_wg::commit();
            if (t + 1 < ntiles) load_tile(t + 1);
            cp_async_commit();
            ar_wg::wait<0>();
            wg_fence_acc(s);
            float alpha[2];
            wg_softmax_full(s, w.key_begin + t * WG_KEYS, tig, lim, a.scale_log2, m_run, l_run, alpha, a.fault);
            wg_rescale(o, alpha, a.fault);
            wg_fence_acc(o);
            wg_store_p<BF16>(smem + WG_OFF_P, s_alpha, s, lr, tig, alpha);
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
            wgmma_pv<BF16>(o, desc_p + (uint32_t)((kk * 32) >> 4), desc_v + (uint32_t)((kk * 2048) >> 4));
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

/* Variant 1 ("s1"): the round-1 kernel's lockstep (all 256 threads load, CTA barriers) with S
 * in warpgroup 0 alone (m64n64k16, full rows, see above): two CTA barriers a tile (tile landed,
 * P written) instead of three; warpgroup 1 only loads during S.  Both warpgroups then run
 * O_w += P V[:, 256 w ..] with P from the shared tile, as in the round-1 kernel.
 * The body is wg_s1_body's with TMA = false. */
template <bool BF16>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma_s1_kernel(attn_args a)
{
    wg_s1_body<BF16, false>(a, nullptr);
}

/* Variant 6 ("s1-tma"): s1 with the key tiles by TMA (see wg_s1_body); tmap = the latent cache
 * [num_slots, 576] 16-bit as a 2-D tensor, boxes of [WG_TMA_ROWS(block size) keys][64 dims]
 * with the 128-byte swizzle (wg_prepare_tma in cuda_mla.cu). */
template <bool BF16>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma_s1_tma_kernel(attn_args a, const __grid_constant__ CUtensorMap tmap)
{
    wg_s1_body<BF16, true>(a, &tmap);
}

/* Variants 2 ("ws") and 3 ("ws-ss"): warp-specialised, no CTA barrier in the key loop.
 *   warpgroup 1 (producer + half the P V): loads Q and every key tile (cp.async, 36 chunks a
 *     thread a tile, into the slot warpgroup 0 released: EMPTY), signals FULL when a tile landed,
 *     and per tile waits for PREADY, rescales its O half by alpha, runs O_1 += P V[:, 256 ..]
 *     from the P tile, then signals PFREE;
 *   warpgroup 0 (S + softmax + the other half): per tile waits FULL, runs S (m64n64k16), signals
 *     EMPTY for the previous tile's slot as soon as its previous P V finished (wait_group 1: the
 *     S of this tile may still run), softmax, waits PFREE, writes P and alpha, signals PREADY,
 *     and issues O_0 += P V[:, 0 .. 255] without waiting for it: the tensor pipe runs it, then
 *     the next tile's S, while warpgroup 1's half overlaps.  Variant 2 takes warpgroup 0's P
 *     from registers (RS: the S accumulators are the A fragments), variant 3 from the P tile (SS).
 * Every named barrier alternates arrive / sync phases (an arrival of phase k + 1 needs the
 * other side to have passed phase k), and arrivals with no matching wait are skipped at the
 * ends (EMPTY for the last two tiles, PFREE for the last). */
template <bool BF16, bool P_RS>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma_ws_kernel(attn_args a)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    uint32_t sq_addr;                                           /* the Q tile, at the aligned start */
    unsigned char *const smem = wg_smem_base(&sq_addr);
    const uint32_t sk_addr0 = sq_addr + WG_OFF_K, sp_addr = sq_addr + WG_OFF_P;
    float *const s_alpha = reinterpret_cast<float *>(smem + WG_OFF_RED);   /* [ROWS] */
    float *const s_sum = s_alpha + 2 * ROWS;                               /* [2][ROWS] sums, maxima */

    const work_item w = a.work[blockIdx.x];
    const int r = w.req;
    const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
    const int nrows = ql * a.num_heads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, tig = lane & 3;
    const int lr[2] = {(warp & 3) * 16 + (lane >> 2), (warp & 3) * 16 + (lane >> 2) + 8};
    int lim[2];
    row_limits(a, w, sl, ql, nrows, lr, lim);
    const int ntiles = w.key_end > w.key_begin ? (w.key_end - w.key_begin + WG_KEYS - 1) / WG_KEYS : 0;

    float o[32][4];
#pragma unroll
    for (int nt = 0; nt < 32; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[nt][e] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    const uint64_t desc_p = ar_wg::desc_sw128(sp_addr, 16, 1024);

    if (wg == 1) {
        const int i = tid - 128;
        wg_load_q<128>(a, w, q0, nrows, smem, i);
        if (ntiles > 0) wg_load_keys<128>(a, w, r, 0, smem + WG_OFF_K, i);
        cp_async_commit();                /* group: Q + tile 0 */
        if (ntiles > 1) wg_load_keys<128>(a, w, r, 1, smem + WG_OFF_K + WG_TILE, i);
        cp_async_commit();                /* group: tile 1 (maybe empty) */
        if (ntiles > 0) {
            cp_async_wait<1>();
            ar_wg::fence_proxy_async();
            wg_bar_arrive(WG_BAR_FULL0);
        }
        for (int t = 0; t < ntiles; t++) {
            wg_bar_sync(WG_BAR_PREADY);   /* P_t and alpha_t written (so tile t landed too) */
            const float alpha[2] = {s_alpha[lr[0]], s_alpha[lr[1]]};
            wg_rescale(o, alpha, a.fault);
            wg_fence_acc(o);
            ar_wg::fence();
            const uint32_t sk_addr = sk_addr0 + (uint32_t)((t & 1) * WG_TILE);
            const uint64_t desc_v = ar_wg::desc_sw128(sk_addr + (uint32_t)(4 * WG_ATOM), WG_ATOM, 1024);
#pragma unroll
            for (int kk = 0; kk < WG_KEYS / 16; kk++)
                wgmma_pv<BF16>(o, desc_p + (uint32_t)((kk * 32) >> 4), desc_v + (uint32_t)((kk * 2048) >> 4));
            ar_wg::commit();
            if (t + 1 < ntiles) {         /* tile t + 1 (the only group in flight) landed */
                cp_async_wait<0>();
                ar_wg::fence_proxy_async();
                wg_bar_arrive(WG_BAR_FULL0 + ((t + 1) & 1));
            }
            ar_wg::wait<0>();
            wg_fence_acc(o);
            if (t + 1 < ntiles) wg_bar_arrive(WG_BAR_PFREE);
            if (t + 2 < ntiles) {         /* tile t + 2 into tile t's slot once warpgroup 0 is done with it */
                wg_bar_sync(WG_BAR_EMPTY0 + (t & 1));
                wg_load_keys<128>(a, w, r, t + 2, smem + WG_OFF_K + (t & 1) * WG_TILE, i);
                cp_async_commit();
            }
        }
        cp_async_wait<0>();
    } else {
        const uint64_t desc_q = ar_wg::desc_sw128(sq_addr, 16, 1024);
        uint32_t pa[4][4];                /* P_t as A fragments of the 4 key steps (RS) */
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int e = 0; e < 4; e++) pa[kk][e] = 0u;
        for (int t = 0; t < ntiles; t++) {
            wg_bar_sync(WG_BAR_FULL0 + (t & 1));
            const uint32_t sk_addr = sk_addr0 + (uint32_t)((t & 1) * WG_TILE);
            float s[8][4];
            const uint64_t desc_k = ar_wg::desc_sw128(sk_addr, 16, 1024);
            ar_wg::fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const uint32_t koff = (uint32_t)((kk >> 2) * WG_ATOM + (kk & 3) * 32) >> 4;
                wgmma_qk64<BF16>(s, desc_q + koff, desc_k + koff, kk > 0);
            }
            ar_wg::commit();
            if (t > 0) {                  /* P V of tile t - 1 done: its slot is free */
                ar_wg::wait<1>();
                wg_fence_acc(o);
                wg_fence_frag(pa);
                if (t + 1 < ntiles) wg_bar_arrive(WG_BAR_EMPTY0 + ((t - 1) & 1));
            }
            ar_wg::wait<0>();
            wg_fence_acc(s);
            float alpha[2];
            wg_softmax_full(s, w.key_begin + t * WG_KEYS, tig, lim, a.scale_log2, m_run, l_run, alpha, a.fault);
            wg_rescale(o, alpha, a.fault);
            if (t > 0) wg_bar_sync(WG_BAR_PFREE);
            wg_store_p<BF16>(smem + WG_OFF_P, s_alpha, s, lr, tig, alpha);
            ar_wg::fence_proxy_async();
            wg_bar_arrive(WG_BAR_PREADY);
            if (!P_RS) asm volatile("bar.sync %0, 128;\n" :: "r"((int)WG_BAR_WG0) : "memory");
            if (P_RS) {
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    pa[kk][0] = pack2<BF16>(s[2 * kk][0], s[2 * kk][1]);
                    pa[kk][1] = pack2<BF16>(s[2 * kk][2], s[2 * kk][3]);
                    pa[kk][2] = pack2<BF16>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                    pa[kk][3] = pack2<BF16>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
                }
            }
            wg_fence_acc(o);
            wg_fence_frag(pa);
            ar_wg::fence();
            const uint64_t desc_v = ar_wg::desc_sw128(sk_addr, WG_ATOM, 1024);
#pragma unroll
            for (int kk = 0; kk < WG_KEYS / 16; kk++) {
                if (P_RS)
                    wgmma_pv_rs<BF16>(o, pa[kk], desc_v + (uint32_t)((kk * 2048) >> 4));
                else
                    wgmma_pv<BF16>(o, desc_p + (uint32_t)((kk * 32) >> 4), desc_v + (uint32_t)((kk * 2048) >> 4));
            }
            ar_wg::commit();
        }
        ar_wg::wait<0>();
        wg_fence_acc(o);
        wg_fence_frag(pa);
    }
    wg_finish_rows(a, w, q0, nrows, s_sum, o, m_run, l_run, lr, wg, tig);
#else
    __trap();   /* built without sm_90a: the host never launches this kernel there */
#endif
}

/* Variant 4 ("seesaw"): FlashMLA's seesaw schedule on s1's per-tile work.  Key tiles go in pairs
 * (t0 = 2 i in ring slot 0, t1 = 2 i + 1 in slot 1); warpgroup 0 computes S of t0 and warpgroup 1
 * S of t1 (each m64n64k16 over 576 dims, full rows, as s1), so both warpgroups issue tensor work
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
 * Shared memory: s1's layout (the P tile unused); red holds m_a [ROWS], m_b [ROWS], then the
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

/* The seesaw schedule (above) with a TMA switch: variants 4 and 5 (attn_wgmma_seesaw_kernel,
 * TMA = false, P_RS false / true) and 7 (attn_wgmma_seesaw_rs_tma_kernel, P_RS = TMA = true).
 * (Until session 4 variants 4 and 5 had their own copy of this text; ptxas gives the body 217 /
 * 218 registers instead of that copy's 227 / 225, no spills.)
 * TMA (variant 7, "seesaw-rs-tma", with P_RS): the key tiles wholly below key_end come by TMA
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
template <bool BF16, bool P_RS, bool TMA>
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
            float alpha0[2];
            wg_softmax_full(s, w.key_begin + t0 * WG_KEYS, tig, lim, a.scale_log2, m_run, l_run, alpha0, a.fault);
            wg_rescale(o, alpha0, a.fault);
            /* P0 into atom 8 of slot 0, m_a (now m_run) into s_ma */
            wg_store_p<BF16>(sk0 + 8 * WG_ATOM, s_ma, s, lr, tig, m_run);
            ar_wg::fence_proxy_async();
            wg_bar_arrive(SS_BAR_P0READY);
            uint32_t pa[4][4];            /* P0 as A fragments (P_RS) */
            if (P_RS) {
                wg_pack_p<BF16>(s, pa);
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
            float mx[2];
            mask_scale_rowmax<8>(s, w.key_begin + t1 * WG_KEYS, tig, lim, a.scale_log2, mx);
            softmax_step<8, 0>(s, mx, m_run, l_run, (float (*)[4])0, a.fault);
            float beta[2];
#pragma unroll
            for (int h = 0; h < 2; h++) beta[h] = wg_rescale_factor(m_a[h], m_run[h]);
            /* P1 into atom 8 of slot 1, m_b (now m_run) into s_mb */
            wg_store_p<BF16>(sk1 + 8 * WG_ATOM, s_mb, s, lr, tig, m_run);
            ar_wg::fence_proxy_async();
            wg_bar_arrive(SS_BAR_P1READY);
            uint32_t pa[4][4];            /* P1 as A fragments (P_RS) */
            if (P_RS)
                wg_pack_p<BF16>(s, pa);
            else
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

/* P_RS (variant 5, "seesaw-rs"): each warpgroup's P V of the tile whose S it computed takes P
 * from its registers (RS) instead of the shared copy it wrote for the other warpgroup: 16 KB
 * less shared-memory reads a pair and no 128-thread barrier before that product.
 * Variants 4 ("seesaw") and 5 (P_RS): the body is wg_seesaw_body's with TMA = false. */
template <bool BF16, bool P_RS>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma_seesaw_kernel(attn_args a)
{
    wg_seesaw_body<BF16, P_RS, false>(a, nullptr);
}

/* Variant 7 ("seesaw-rs-tma"): seesaw-rs with the key tiles by TMA (see wg_seesaw_body); tmap
 * as attn_wgmma_s1_tma_kernel's. */
template <bool BF16>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma_seesaw_rs_tma_kernel(attn_args a, const __grid_constant__ CUtensorMap tmap)
{
    wg_seesaw_body<BF16, true, true>(a, &tmap);
}

} /* namespace ar_mla */

#endif
