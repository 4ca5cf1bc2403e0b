/* mla_decode_wgmma16.cuh - the Hopper (sm_90a) MLA decode kernel for work items of at most 16
 * rows (h_q x s_q <= 16: DeepSeek's 128 heads at tensor parallelism 8, one query token), and its
 * 32-row instance (tensor parallelism 4, or two query tokens of multi-token prediction at 8):
 * attn_wgmma16_kernel<BF16, NR, FP8>.  Described below for NR = 16 and a 16-bit cache; at 32 every
 * "16 rows" is 32, the products are m64n32k16 and Q takes 36 KB.  With an fp8 e4m3 cache (FP8, 16
 * rows): the tiles come as halves of 32 keys [32][576 B], one bulk copy a key (one warp), into a
 * ring of three staging buffers (so up to 96 keys are in flight), and warpgroup 1 widens each
 * half into the key slot (the hardware's e4m3x2 -> f16x2, one instruction a pair: exact) while
 * the previous tile's products run, restaging the buffer at once; the products are fp16 whatever
 * the query dtype (one instance, <false, 16, true>): bf16 queries are scaled into fp16 row by
 * row in shared memory (w16_q_bf16_to_f16) and each row's scores multiplied back; kv_scale
 * multiplies the score scale and the output.  The same
 * work items, arguments, masks, faults and outputs (o_lat / lse, or a split piece's partials for
 * combine_rows_kernel) as the 64-row kernels
 * (mla_decode_wgmma_pairs.cuh, mla_decode_wgmma.cuh), whose 64-row products spend three quarters of their tensor time on
 * empty rows here.  Both products are transposed so that the 16 query rows are the small N side
 * of the instruction and the 64 keys (or 64 latent dims) its M side:
 *   S^T = K Q^T     [64 keys x 16 rows]: wgmma m64n16k16, A = the key tile (K-major, as it lands),
 *                   B = the Q tile [16 rows x 576] (K-major), 36 steps of 16 dims;
 *   O^T += V^T P^T  [512 dims x 16 rows]: 8 x wgmma m64n16k16 a step, A = the key tile's first
 *                   512 dims read transposed (MN-major: the dims are contiguous), B = P^T stored
 *                   [16 rows x 64 keys] (K-major), 4 steps of 16 keys.
 * Geometry: 256 threads, two warpgroups with their own jobs, so that one's softmax runs under the
 * other's products:
 *   warpgroup 0: S^T of tile t, the online softmax (the row maxima across its 4 warps through
 *                shared memory), P^T(t) and the rescale factors into the P buffer t & 1;
 *   warpgroup 1: O^T of the tile from P buffer t & 1 (64 fp32 registers a thread) in two
 *                groups, dims 0-255 then 256-511; as soon as the first has completed, the TMA
 *                copies of tile t + 2 into that part of the slot and its rope atom (S^T of tile
 *                t is done), then into the rest once the second has.
 * Shared memory (1024-byte aligned, 172,208 bytes with the slack): Q [16 x 576] as 9 atoms of
 * [16 rows][128 B] (18 KB), 2 key slots [64 keys x 576] as 9 atoms of [64][128 B] (72 KB each),
 * 2 P^T buffers [16 rows][128 B], the reduction floats and the mbarriers:
 *   landed[s][c] atom c of the tile in slot s has landed (its TMA bytes): S^T waits atom by atom,
 *                so it starts on the first 64 dims;
 *   p_full[b]    P^T and the rescale factors in P buffer b (tile t, b = t & 1) are written
 *                (warpgroup 0's 128 threads);
 *   p_empty[b]   warpgroup 1 is done with P buffer b (128 threads).
 * Every tile comes by TMA (boxes of {64 dims, 16 or 32 keys}, wg_tma_rows_log2), marked
 * evict-first in L2 (each line is read once); in a tile that reaches past key_end the runs past
 * it re-read the last valid key's page, and warpgroup 0 zeroes the V rows past key_end after its
 * S^T (P = 0 times the NaN a free cache slot may hold would be NaN), before P^T is published.  Atoms are 128-byte swizzled: the 16-byte chunk c of row r at
 * r * 128 + ((c ^ (r & 7)) << 4) (every atom starts on a 1024-byte boundary).
 *
 * Count per key tile: 64 x 16 x (576 + 512) x 2 = 2.2 MFLOP (a quarter of the 64-row kernel's);
 * the operands are read from shared memory once per instruction (2.5 KB per m64n16k16), so the
 * tile costs about 1,400 cycles of shared-memory bandwidth, under the ~4,000 cycles its 73.7 KB
 * take at the H200's HBM rate shared by 132 SMs.  Measured (BENCHMARKS.md): 3.90-4.26 TB/s at
 * h_q = 16, 0.98-1.01x FlashMLA in the same run; a ring of 5 slots of 32 keys was 3-4% slower.
 * The kernel body exists only in the sm_90a build; the host picks it only on a
 * compute-capability 9.0 device. */

#ifndef AR_MLA_DECODE_WGMMA16_CUH
#define AR_MLA_DECODE_WGMMA16_CUH

#include <cuda_fp8.h>

#include "mla_decode_wgmma.cuh"

namespace ar_mla {

/* FP8: keys a staging buffer holds (half a key tile), and the ring's buffers */
constexpr int W16_HALF = WG_KEYS / 2;
constexpr int W16_STAGES = 3;

/* The shared-memory plan of the kernel for NR = 16 or 32 query rows a work item; FP8: the
 * latent cache holds fp8 e4m3, staged [32 keys][576 B] a buffer by bulk copies and widened into the key
 * slots by warpgroup 1. */
template <int NR, bool FP8 = false> struct W16Geom {
    static constexpr int ROWS = NR;                             /* query rows of a work item */
    static constexpr int NT = NR / 8;                           /* 8-row column tiles of an accumulator */
    static constexpr int QATOM = NR * 128;                      /* one 64-dim atom of Q or P^T: [NR][128 B] */
    static constexpr int OFF_K = 9 * QATOM;                     /* the 2 key slots, after Q */
    static constexpr int OFF_P = OFF_K + 2 * WG_TILE;           /* P^T [2][NR rows][64 keys] */
    static constexpr int OFF_STG = OFF_P + 2 * QATOM;           /* FP8: the staging ring */
    static constexpr int STG_BYTES = FP8 ? W16_STAGES * W16_HALF * D : 0;
    static constexpr int OFF_RED = OFF_STG + STG_BYTES;
    /* floats at OFF_RED: alpha [2][NR], tile maxima [2][4 warps][NR], final m and l [2][NR],
     * row-sum parts [4 warps][NR], the query rows' largest magnitudes, then their scales [NR] */
    static constexpr int RED_ALPHA = 0, RED_WMAX = 2 * NR, RED_FIN = 10 * NR, RED_LSUM = 12 * NR, RED_QMAX = 16 * NR,
                         RED_FLOATS = 18 * NR;
    static constexpr int OFF_BAR = OFF_RED + RED_FLOATS * 4;
    /* mbarriers (byte offsets from OFF_BAR): landed [2 slots][9 atoms], p_full [2], p_empty [2],
     * final, staged [W16_STAGES] (FP8 only) */
    static constexpr int BAR_LANDED = 0, BAR_P_FULL = BAR_LANDED + 2 * 9 * 8, BAR_P_EMPTY = BAR_P_FULL + 2 * 8,
                         BAR_FINAL = BAR_P_EMPTY + 2 * 8, BAR_STAGED = BAR_FINAL + 8,
                         BARS = (BAR_STAGED + W16_STAGES * 8) / 8;
    static constexpr int SMEM = 1024 /* alignment slack */ + OFF_BAR + BARS * 8;
    static_assert(NR == 16 || NR == 32, "wgmma16: 16 or 32 rows");
    static_assert(!FP8 || NR == 16, "wgmma16: the fp8 staging ring fits next to 16 rows only");
    static_assert(OFF_K % 1024 == 0 && OFF_P % 1024 == 0 && OFF_BAR % 8 == 0, "wgmma16: alignment");
    static_assert(SMEM <= 232448, "wgmma16: more shared memory than an sm_90 block gets");
};
constexpr int W16_ROWS = AR_MLA_W16_ROWS, W32_ROWS = AR_MLA_W32_ROWS; /* the two instances */

/* d [64 x 8 NT, accumulator layout: element (nt, e) is M row 16 (warp % 4) + lane / 4 + 8 (e >> 1),
 * N column 8 nt + 2 (lane % 4) + (e & 1)] (+)= A B, both from shared memory; B K-major; A K-major
 * (TRANS_A 0) or MN-major (TRANS_A 1); NT = 2 (m64n16k16) or 4 (m64n32k16). */
template <bool BF16, int TRANS_A, int NT>
__device__ __forceinline__ void wgmma_m64n(float (&d)[NT][4], uint64_t desc_a, uint64_t desc_b, int accumulate);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define W16_ACC4(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define W16_TEXT16(TY, TA) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n16k16.f32" TY TY " " \
    "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, " TA ", 0;\n}\n"
#define W16_TEXT32(TY, TA) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n32k16.f32" TY TY " " \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, " TA ", 0;\n}\n"
#define W16_ASM(TEXT, ...) \
    do { \
        if constexpr (BF16 && TRANS_A) \
            asm volatile(TEXT(".bf16", "1") : __VA_ARGS__ : "l"(desc_a), "l"(desc_b), "r"(accumulate)); \
        else if constexpr (BF16) \
            asm volatile(TEXT(".bf16", "0") : __VA_ARGS__ : "l"(desc_a), "l"(desc_b), "r"(accumulate)); \
        else if constexpr (TRANS_A) \
            asm volatile(TEXT(".f16", "1") : __VA_ARGS__ : "l"(desc_a), "l"(desc_b), "r"(accumulate)); \
        else \
            asm volatile(TEXT(".f16", "0") : __VA_ARGS__ : "l"(desc_a), "l"(desc_b), "r"(accumulate)); \
    } while (0)
template <bool BF16, int TRANS_A, int NT>
__device__ __forceinline__ void wgmma_m64n(float (&d)[NT][4], uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    if constexpr (NT == 2)
        W16_ASM(W16_TEXT16, W16_ACC4(d, 0), W16_ACC4(d, 1));
    else
        W16_ASM(W16_TEXT32, W16_ACC4(d, 0), W16_ACC4(d, 1), W16_ACC4(d, 2), W16_ACC4(d, 3));
}
#undef W16_ASM
#undef W16_ACC4
#undef W16_TEXT16
#undef W16_TEXT32
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

/* Barrier among the 128 threads of one warpgroup (named barrier id 1 + wg; 0 is __syncthreads). */
__device__ __forceinline__ void w16_wg_sync(int wg)
{
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
}
/* TMA copies of atoms [c_lo, c_hi) of the 64 keys k0 .. k0 + 63 of request r into the slot at
 * sk_addr, by one thread: atom c completes on bar + 8 c (its expected bytes, 8 KB, raised first),
 * as 64 / rows runs of rows = 2^wg_tma_rows_log2 keys, one box [rows keys][64 dims] each.  A run
 * that starts at or past key_end copies from the last valid key's slot instead (its rows are
 * zeroed before use), so the block table is read only inside the request's blocks and the byte
 * count stays whole.  The lines are marked evict-first in L2 (each is read once). */
__device__ __forceinline__ void w16_tma_atoms(const attn_args &a, const void *tmap, int r, int k0, int key_end,
                                              uint32_t sk_addr, uint32_t bar, int c_lo, int c_hi)
{
    const int rows_log2 = wg_tma_rows_log2(a.block_size_log2);
    const int runs = WG_KEYS >> rows_log2;        /* 2 or 4 */
    const int *const bt = a.block_table + (int64_t)r * a.mbpr;
    int slot[4];
#pragma unroll
    for (int p = 0; p < 4; p++) {
        int j = k0 + (p << rows_log2);
        if (j >= key_end) j = key_end - 1;
        slot[p] = p < runs ? (__ldg(bt + (j >> a.block_size_log2)) << a.block_size_log2) + (j & (a.block_size - 1)) : 0;
    }
    const uint64_t policy = ar_wg::l2_evict_first_policy();
    for (int c = c_lo; c < c_hi; c++) {
        ar_wg::mbar_arrive_expect_tx(bar + (uint32_t)(8 * c), (uint32_t)WG_ATOM);
#pragma unroll
        for (int p = 0; p < 4; p++) {
            if (p >= runs) break;
            ar_wg::tma_load_2d_hint(sk_addr + (uint32_t)(c * WG_ATOM + (p << rows_log2) * 128), tmap, bar + (uint32_t)(8 * c),
                                    c * 64, slot[p], policy);
        }
    }
}

/* FP8: the 32 keys k0 .. k0 + 31 of request r (rows past key_end re-read the last valid key,
 * masked before use) as 32 bulk copies of a whole 576-byte row into the staging buffer stg
 * ([32][576 B]), by one warp (lane l: key k0 + l, its block-table entry), completing on bar. */
__device__ __forceinline__ void w16_stage_fp8(const attn_args &a, int r, int k0, int key_end, unsigned char *stg,
                                              uint64_t *bar, int lane)
{
    const int *const bt = a.block_table + (int64_t)r * a.mbpr;
    const uint8_t *const cache = (const uint8_t *)a.cache;
    const int key = k0 + lane < key_end ? k0 + lane : key_end - 1;
    const int64_t slot = ((int64_t)__ldg(bt + (key >> a.block_size_log2)) << a.block_size_log2) + (key & (a.block_size - 1));
    fence_proxy_async();   /* the buffer's earlier reads (widening) before the copies' writes */
    if (lane == 0) mbar_expect_tx(bar, (uint32_t)(W16_HALF * D));
    __syncwarp();
    bulk_copy(stg + lane * D, cache + slot * D, (uint32_t)D, bar);
}

/* Two e4m3 values (byte 0 the first) -> two fp16 values, exactly (every e4m3 value is an fp16
 * one): the hardware's e4m3x2 -> f16x2, one instruction. */
__device__ __forceinline__ uint32_t w16_fp8x2(uint32_t two)
{
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

/* FP8: warpgroup 1's 128 threads (i = its thread number) widen a staging buffer (32 keys) into
 * rows row0 .. row0 + 31 of the key slot at sk (swizzled 16-bit atoms, as a TMA tile lands): 16
 * bytes (16 dims) a step, 9 steps a thread, the two 16-byte chunks of 8 dims each to their
 * swizzled places. */
__device__ __forceinline__ void w16_widen_fp8(const unsigned char *stg, unsigned char *sk, int row0, int i)
{
#pragma unroll 3
    for (int k = 0; k < W16_HALF * (D / 16) / 128; k++) {
        const int idx = i + 128 * k, row = row0 + idx / (D / 16), p = idx % (D / 16);
        const uint4 raw = *reinterpret_cast<const uint4 *>(stg + (row - row0) * D + p * 16);
        uint4 lo, hi;
        lo.x = w16_fp8x2(raw.x & 0xffffu);
        lo.y = w16_fp8x2(raw.x >> 16);
        lo.z = w16_fp8x2(raw.y & 0xffffu);
        lo.w = w16_fp8x2(raw.y >> 16);
        hi.x = w16_fp8x2(raw.z & 0xffffu);
        hi.y = w16_fp8x2(raw.z >> 16);
        hi.z = w16_fp8x2(raw.w & 0xffffu);
        hi.w = w16_fp8x2(raw.w >> 16);
        unsigned char *const dst = sk + (p >> 2) * WG_ATOM + row * 128;
        const int c = 2 * (p & 3);
        *reinterpret_cast<uint4 *>(dst + ((c ^ (row & 7)) << 4)) = lo;
        *reinterpret_cast<uint4 *>(dst + (((c + 1) ^ (row & 7)) << 4)) = hi;
    }
}

/* FP8 with bf16 queries: warpgroup 0 (thread i of 128) turns the bf16 Q tile in shared memory
 * (as the cp.async loop put it: chunk c of row idx / 72 for idx = i + 128 k) into fp16, each row
 * multiplied by a power of two 2^e_r that brings its largest magnitude into [2^14, 2^15): exact
 * for every element within 2^28 of its row's largest (fp16 keeps bf16's 8 mantissa bits, 11 of
 * its own).  2^-e_r -> qscale[r], by which the row's scores are multiplied back.  qmax: NR
 * floats of scratch.  Ends with the tile in place for wgmma (proxy fence, warpgroup barrier). */
template <int NR>
__device__ __forceinline__ void w16_q_bf16_to_f16(unsigned char *smem, float *qmax, float *qscale, int i)
{
    constexpr int QATOM = NR * 128, STEPS = NR * WG_CHUNKS / 128;
    auto chunk = [&](int k) {
        const int idx = i + 128 * k, row = idx / WG_CHUNKS, c = idx % WG_CHUNKS;
        return reinterpret_cast<uint4 *>(smem + (c >> 3) * QATOM + row * 128 + (((c & 7) ^ (row & 7)) << 4));
    };
    if (i < NR) qmax[i] = 0.f;
    w16_wg_sync(0);
#pragma unroll
    for (int k = 0; k < STEPS; k++) {
        const uint4 v = *chunk(k);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        uint32_t m = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) m = max(m, max((w[j] & 0x7fffu) << 16, w[j] & 0x7fff0000u));
        atomicMax(reinterpret_cast<unsigned int *>(qmax) + (i + 128 * k) / WG_CHUNKS, m);   /* |x| as bits: monotonic */
    }
    w16_wg_sync(0);
    if (i < NR) {
        const uint32_t mb = __float_as_uint(qmax[i]);
        int e = mb == 0u ? 0 : 14 - ((int)(mb >> 23) - 127);   /* 2^e x the largest in [2^14, 2^15) */
        e = e < -120 ? -120 : e > 120 ? 120 : e;
        qmax[i] = exp2f((float)e);
        qscale[i] = exp2f((float)-e);
    }
    w16_wg_sync(0);
#pragma unroll
    for (int k = 0; k < STEPS; k++) {
        uint4 *const pc = chunk(k);
        const float f = qmax[(i + 128 * k) / WG_CHUNKS];
        uint4 v = *pc;
        uint32_t *const w = reinterpret_cast<uint32_t *>(&v);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float lo = __uint_as_float(w[j] << 16) * f, hi = __uint_as_float(w[j] & 0xffff0000u) * f;
            const __half2 h = __floats2half2_rn(lo, hi);
            w[j] = *reinterpret_cast<const uint32_t *>(&h);
        }
        *pc = v;
    }
    ar_wg::fence_proxy_async();   /* the converted tile -> wgmma's reads */
    w16_wg_sync(0);
}

/* The kernel (see the file comment) for work items of at most NR = 16 or 32 rows.  tmap: the
 * latent cache as mla_wgmma_tensor_map makes it (FP8: unused; the staging tile comes by bulk copies). */
template <bool BF16, int NR, bool FP8 = false>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma16_kernel(attn_args a, const __grid_constant__ CUtensorMap tmap)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using G = W16Geom<NR, FP8>;
    static_assert(!(FP8 && BF16), "wgmma16: the fp8 form runs fp16 products (bf16 queries are scaled into fp16)");
    constexpr int NT = G::NT, NI = 2 * G::NT;   /* column tiles; query rows a thread holds */
    uint32_t sq_addr;                                           /* the Q tile, at the aligned start */
    unsigned char *const smem = wg_smem_base(&sq_addr);
    const uint32_t sk_addr0 = sq_addr + G::OFF_K, sp_addr0 = sq_addr + G::OFF_P;
    float *const red = reinterpret_cast<float *>(smem + G::OFF_RED);
    const uint32_t bar0 = sq_addr + G::OFF_BAR;
    auto landed_bar = [&](int s) { return bar0 + (uint32_t)(G::BAR_LANDED + 72 * s); };   /* + 8 c: atom c of slot s */
    auto p_full_bar = [&](int s) { return bar0 + (uint32_t)(G::BAR_P_FULL + 8 * s); };
    auto p_empty_bar = [&](int s) { return bar0 + (uint32_t)(G::BAR_P_EMPTY + 8 * s); };
    /* warpgroup 0's final maxima and sums are in shared memory (its 128 arrivals; an mbarrier
     * rather than a named barrier, so that racecheck sees the hand-over) */
    const uint32_t final_bar = bar0 + G::BAR_FINAL;
    /* FP8: staged[b] completes when staging buffer b has landed (half h of the item in buffer
     * h % 3, its (h / 3)-th phase) */
    uint64_t *const staged = reinterpret_cast<uint64_t *>(smem + G::OFF_BAR + G::BAR_STAGED);
    unsigned char *const stg = smem + G::OFF_STG;

    const work_item w = a.work[blockIdx.x];
    const int r = w.req;
    const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
    const int H = a.num_heads, nrows = ql * H;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
    const int g = lane >> 2, tq = lane & 3;
    const int ntiles = w.key_end > w.key_begin ? (w.key_end - w.key_begin + WG_KEYS - 1) / WG_KEYS : 0;
    /* this thread's NI query rows in both accumulator layouts: index i = 2 nt + (e & 1) is row
     * 8 nt + 2 tq + (e & 1) */
    int qrow[NI];
#pragma unroll
    for (int i = 0; i < NI; i++) qrow[i] = 8 * (i >> 1) + 2 * tq + (i & 1);

    if (tid == 0) {
        for (int s = 0; s < 2; s++) {
            /* FP8: atom 0's barrier stands for the whole slot, arrived at by warpgroup 1's 128
             * threads when they have widened it */
            for (int c = 0; c < 9; c++) ar_wg::mbar_init(landed_bar(s) + (uint32_t)(8 * c), FP8 ? 128 : 1);
            ar_wg::mbar_init(p_full_bar(s), 128);
            ar_wg::mbar_init(p_empty_bar(s), 128);
        }
        if (FP8)
            for (int b = 0; b < W16_STAGES; b++) ar_wg::mbar_init(bar0 + (uint32_t)(G::BAR_STAGED + 8 * b), 1);
        ar_wg::mbar_init(final_bar, 128);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        if (!FP8) ar_wg::tma_prefetch_map(&tmap);
    }
    __syncthreads();
    if (FP8 && warp == 0)
        for (int h = 0; h < W16_STAGES && h < 2 * ntiles; h++)
            w16_stage_fp8(a, r, w.key_begin + h * W16_HALF, w.key_end, stg + h * W16_HALF * D, staged + h, lane);
    if (!FP8 && tid == 0)
        for (int t = 0; t < 2 && t < ntiles; t++)
            w16_tma_atoms(a, &tmap, r, w.key_begin + t * WG_KEYS, w.key_end, sk_addr0 + (uint32_t)(t * WG_TILE),
                          landed_bar(t), 0, 9);

    if (wg == 0) {
        /* ---- warpgroup 0: Q, then S^T and the softmax of every tile ---- */
        const uint16_t *const qg = (const uint16_t *)a.q;
#pragma unroll
        for (int k = 0; k < NR * WG_CHUNKS / 128; k++) {
            const int idx = tid + k * 128, row = idx / WG_CHUNKS, c = idx % WG_CHUNKS;
            const int gr = w.row0 + row;
            const bool valid = gr < nrows;
            cp_async16(smem + (c >> 3) * G::QATOM + row * 128 + (((c & 7) ^ (row & 7)) << 4),
                       qg + ((int64_t)q0 * H + (valid ? gr : 0)) * D + c * 8, valid);
        }
        cp_async_commit();
        cp_async_wait<0>();
        ar_wg::fence_proxy_async();
        w16_wg_sync(0);
        /* FP8 runs in fp16 (one conversion an e4m3 pair, see widen_and_stage): bf16 queries are
         * scaled into fp16 row by row, and each row's scores multiplied back (qscale) */
        float *const s_qscale = red + G::RED_QMAX + NR;   /* [NR] after the scratch */
        const bool q_scaled = FP8 && !BF16 && a.bf16;
        if (q_scaled) w16_q_bf16_to_f16<NR>(smem, red + G::RED_QMAX, s_qscale, tid);

        const int extra = a.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0;
        int lim[NI];
        float m_run[NI], l_part[NI];   /* l_part: this thread's share of the row sums (its 2 keys a tile) */
#pragma unroll
        for (int i = 0; i < NI; i++) {
            const int gr = w.row0 + qrow[i];
            lim[i] = gr < nrows ? key_limit(a.causal, sl, ql, gr / H, extra) : 0;
            if (lim[i] > w.key_end) lim[i] = w.key_end;
            m_run[i] = -INFINITY;
            l_part[i] = 0.f;
        }
        const uint64_t desc_q = ar_wg::desc_sw128(sq_addr, 16, 1024);
        float *const s_alpha = red + G::RED_ALPHA, *const s_wmax = red + G::RED_WMAX;
        const float score_mul = FP8 ? a.scale_log2 * a.kv_scale : a.scale_log2;   /* K = kv_scale x its e4m3 */
        float row_mul[NI];   /* score_mul, times each row's query scale where Q was scaled */
#pragma unroll
        for (int i = 0; i < NI; i++) row_mul[i] = q_scaled ? score_mul * s_qscale[qrow[i]] : score_mul;
        for (int t = 0; t < ntiles; t++) {
            const int s = t & 1;
            const uint32_t sk_addr = sk_addr0 + (uint32_t)(s * WG_TILE);
            float acc[NT][4];
            const uint64_t desc_k = ar_wg::desc_sw128(sk_addr, 16, 1024);
            ar_wg::fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                /* each atom's products start as soon as that atom has landed */
                if ((kk & 3) == 0 && (!FP8 || kk == 0))
                    ar_wg::mbar_wait(landed_bar(s) + (uint32_t)(FP8 ? 0 : 8 * (kk >> 2)), (uint32_t)(t >> 1) & 1u);
                const uint32_t koff = (uint32_t)((kk >> 2) * WG_ATOM + (kk & 3) * 32) >> 4;
                const uint32_t qoff = (uint32_t)((kk >> 2) * G::QATOM + (kk & 3) * 32) >> 4;
                wgmma_m64n<BF16, 0, NT>(acc, ar_wg::desc_advance(desc_k, koff), ar_wg::desc_advance(desc_q, qoff), kk > 0);
            }
            ar_wg::commit();
            ar_wg::wait<0>();
            wg_fence_acc(acc);
            const int k0 = w.key_begin + t * WG_KEYS;
            const int valid_keys = w.key_end - k0;
            if (valid_keys < WG_KEYS) {   /* the V rows past key_end -> zeros (dims 0-511) */
                for (int idx = tid; idx < (WG_KEYS - valid_keys) * 64; idx += 128) {
                    const int row = valid_keys + (idx >> 6), c = idx & 63;
                    *reinterpret_cast<uint4 *>(smem + G::OFF_K + s * WG_TILE + wg_swz(row, c)) = make_uint4(0, 0, 0, 0);
                }
                ar_wg::fence_proxy_async();
            }
            /* mask and scale (log2 domain); the tile's row maxima: this thread's 2 keys, the 8
             * lanes of its column, then the 4 warps through shared memory */
            float mx[NI];
#pragma unroll
            for (int i = 0; i < NI; i++) mx[i] = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = 2 * nt + (e & 1), key = k0 + 16 * wq + g + 8 * (e >> 1);
                    const float x = key < lim[i] ? acc[nt][e] * row_mul[i] : -INFINITY;
                    acc[nt][e] = x;
                    mx[i] = fmaxf(mx[i], x);
                }
#pragma unroll
            for (int i = 0; i < NI; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 4));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 8));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 16));
            }
            if (g == 0)
#pragma unroll
                for (int i = 0; i < NI; i++) s_wmax[(s * 4 + wq) * NR + qrow[i]] = mx[i];
            w16_wg_sync(0);
            float alpha[NI], m_use[NI];
#pragma unroll
            for (int i = 0; i < NI; i++) {
                const float *wm = s_wmax + s * 4 * NR + qrow[i];
                const float m_tile = fmaxf(fmaxf(wm[0], wm[NR]), fmaxf(wm[2 * NR], wm[3 * NR]));
                const float m_new = fmaxf(m_run[i], m_tile);
                m_use[i] = m_new == -INFINITY ? 0.f : m_new;
                alpha[i] = exp2f(m_run[i] - m_use[i]);
                m_run[i] = m_new;
                l_part[i] *= alpha[i];
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = 2 * nt + (e & 1);
                    const float p = exp2f(acc[nt][e] - m_use[i]);
                    acc[nt][e] = p;
                    l_part[i] += p;
                }
            /* P^T [NR rows][64 keys] into buffer s once warpgroup 1 is done with tile t - 2 */
            if (t >= 2) ar_wg::mbar_wait(p_empty_bar(s), (uint32_t)((t >> 1) - 1) & 1u);
            unsigned char *const sp = smem + G::OFF_P + s * G::QATOM;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = qrow[2 * nt + (e & 1)], key = 16 * wq + g + 8 * (e >> 1);
                    *reinterpret_cast<uint16_t *>(sp + row * 128 + ((((key >> 3) ^ (row & 7))) << 4) + (key & 7) * 2) =
                        to_bits(BF16, acc[nt][e]);
                }
            if (wq == 0 && g == 0)
#pragma unroll
                for (int i = 0; i < NI; i++) s_alpha[s * NR + qrow[i]] = alpha[i];
            ar_wg::fence_proxy_async();   /* P^T stores -> wgmma's reads */
            ar_wg::mbar_arrive(p_full_bar(s));
        }
        /* the row sums: the 8 lanes of a column, then the 4 warps */
        float *const s_lsum = red + G::RED_LSUM, *const s_fin = red + G::RED_FIN;
#pragma unroll
        for (int i = 0; i < NI; i++) {
            float l = l_part[i];
            l += __shfl_xor_sync(0xffffffffu, l, 4);
            l += __shfl_xor_sync(0xffffffffu, l, 8);
            l += __shfl_xor_sync(0xffffffffu, l, 16);
            if (g == 0) s_lsum[wq * NR + qrow[i]] = l;
        }
        w16_wg_sync(0);
        if (wq == 0 && g == 0)
#pragma unroll
            for (int i = 0; i < NI; i++) {
                const int c = qrow[i];
                s_fin[c] = m_run[i];
                s_fin[NR + c] = s_lsum[c] + s_lsum[NR + c] + s_lsum[2 * NR + c] + s_lsum[3 * NR + c];
            }
        ar_wg::mbar_arrive(final_bar);   /* the final maxima and sums -> warpgroup 1 */
        w16_wg_sync(0);                  /* ... and to warpgroup 0's own threads */
        if (tid < NR) {   /* the LSE of row tid */
            const int gr = w.row0 + tid;
            const float m = s_fin[tid], l = s_fin[NR + tid];
            const float lse2 = l > 0.f ? m + log2f(l) : -INFINITY;
            if (gr < nrows) {
                if (w.partial < 0) {
                    const float lse = a.fault == AR_FAULT_LSE_BASE2 ? lse2 : lse2 * 0.6931471805599453f;
                    a.lse[(int64_t)(gr % H) * a.num_tokens + q0 + gr / H] = lse;
                } else {
                    a.part_lse[(int64_t)w.partial * ROWS + tid] = lse2;
                }
            }
        }
        return;
    }

    /* ---- warpgroup 1: O^T += V^T P^T of every tile, and the refills ---- */
    float o[8][NT][4];   /* dims 64 mt + 16 wq + g + 8 (e >> 1), query row qrow[2 nt + (e & 1)] */
#pragma unroll
    for (int mt = 0; mt < 8; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[mt][nt][e] = 0.f;
    const float *const s_alpha = red + G::RED_ALPHA;
    /* FP8: widens the two staged halves of tile u into slot u & 1 (free: its tile u - 2 is done)
     * and publishes it to warpgroup 0; each buffer is restaged with the half three on as soon as
     * all 128 threads have widened it */
    auto widen_and_stage = [&](int u) {
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            const int h = 2 * u + hh, b = h % W16_STAGES;
            unsigned char *const buf = stg + b * W16_HALF * D;
            mbar_wait(staged + b, (uint32_t)(h / W16_STAGES) & 1u);
            w16_widen_fp8(buf, smem + G::OFF_K + (u & 1) * WG_TILE, hh * W16_HALF, tid - 128);
            if (hh == 1) {
                ar_wg::fence_proxy_async();   /* the widened tile -> wgmma's reads */
                ar_wg::mbar_arrive(landed_bar(u & 1));
            }
            w16_wg_sync(1);
            if (warp == 4 && h + W16_STAGES < 2 * ntiles)
                w16_stage_fp8(a, r, w.key_begin + (h + W16_STAGES) * W16_HALF, w.key_end, buf, staged + b, lane);
        }
    };
    if (FP8 && ntiles > 0) widen_and_stage(0);
    for (int t = 0; t < ntiles; t++) {
        const int s = t & 1;
        ar_wg::mbar_wait(p_full_bar(s), (uint32_t)(t >> 1) & 1u);
        float al[NI];
        bool moved = false;
#pragma unroll
        for (int i = 0; i < NI; i++) {
            al[i] = s_alpha[s * NR + qrow[i]];
            moved |= al[i] != 1.f;
        }
        if (a.fault != AR_FAULT_NO_RESCALE && __any_sync(0xffffffffu, moved)) {
#pragma unroll
            for (int mt = 0; mt < 8; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) o[mt][nt][e] *= al[2 * nt + (e & 1)];
        }
#pragma unroll
        for (int mt = 0; mt < 8; mt++) wg_fence_acc(o[mt]);
        ar_wg::fence();
        const uint32_t sk_addr = sk_addr0 + (uint32_t)(s * WG_TILE);
        const uint64_t desc_p = ar_wg::desc_sw128(sp_addr0 + (uint32_t)(s * G::QATOM), 16, 1024);
        /* two groups: dims 0-255 (atoms 0-3), then 256-511 (atoms 4-7); each part of the slot is
         * refilled with tile t + 2 as soon as its group has completed (atom 8, the rope dims, with
         * the first: S^T of tile t completed before P^T(t) was published) */
#pragma unroll
        for (int half = 0; half < 2; half++) {
#pragma unroll
            for (int kk = 0; kk < WG_KEYS / 16; kk++)
#pragma unroll
                for (int m4 = 0; m4 < 4; m4++) {
                    const int mt = 4 * half + m4;
                    const uint64_t desc_v =
                        ar_wg::desc_sw128(sk_addr + (uint32_t)(mt * WG_ATOM + kk * 2048), WG_ATOM, 1024);
                    wgmma_m64n<BF16, 1, NT>(o[mt], desc_v, ar_wg::desc_advance(desc_p, (uint32_t)((kk * 32) >> 4)), 1);
                }
            ar_wg::commit();
        }
        if (FP8 && t + 1 < ntiles) widen_and_stage(t + 1);   /* under this tile's products */
        const bool refill = !FP8 && t + 2 < ntiles;
        const int k2 = w.key_begin + (t + 2) * WG_KEYS;
        ar_wg::wait<1>();
        if (refill) {
            w16_wg_sync(1);
            if (tid == 128) {
                w16_tma_atoms(a, &tmap, r, k2, w.key_end, sk_addr, landed_bar(s), 0, 4);
                w16_tma_atoms(a, &tmap, r, k2, w.key_end, sk_addr, landed_bar(s), 8, 9);
            }
        }
        ar_wg::wait<0>();
#pragma unroll
        for (int mt = 0; mt < 8; mt++) wg_fence_acc(o[mt]);
        ar_wg::mbar_arrive(p_empty_bar(s));
        if (refill) {
            w16_wg_sync(1);
            if (tid == 128) w16_tma_atoms(a, &tmap, r, k2, w.key_end, sk_addr, landed_bar(s), 4, 8);
        }
    }
    ar_wg::mbar_wait(final_bar, 0u);   /* warpgroup 0's final maxima and sums */
    const float *const s_fin = red + G::RED_FIN;
#pragma unroll
    for (int i = 0; i < NI; i++) {
        const int c = qrow[i], gr = w.row0 + c;
        if (gr >= nrows) continue;
        const float l = s_fin[NR + c];
        const float inv = l > 0.f ? (FP8 ? a.kv_scale : 1.f) / l : 0.f;   /* V = kv_scale x its e4m3 */
        float *const dst = w.partial < 0 ? a.o_lat + ((int64_t)q0 * H + gr) * DL
                                         : a.part_o + ((int64_t)w.partial * ROWS + c) * DL;
        const int nt = i >> 1, e0 = i & 1;
#pragma unroll
        for (int mt = 0; mt < 8; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) dst[64 * mt + 16 * wq + g + 8 * h] = o[mt][nt][2 * h + e0] * inv;
    }
#else
    (void)a;
    (void)tmap;
    __trap();   /* built without sm_90a: the host never launches this kernel there */
#endif
}

} /* namespace ar_mla */

#endif
