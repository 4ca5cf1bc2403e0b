/* mla_decode_wgmma16.cuh - the Hopper (sm_90a) MLA decode kernel for work items of at most 16
 * rows (h_q x s_q <= 16: DeepSeek's 128 heads at tensor parallelism 8, one query token):
 * attn_wgmma16_kernel.  The same work items, arguments, masks, faults and outputs (o_lat / lse,
 * or a split piece's partials for combine_rows_kernel) as attn_wgmma_tma_kernel
 * (mla_decode_wgmma.cuh), whose 64-row products spend three quarters of their tensor time on
 * empty rows here.  Both products are transposed so that the 16 query rows are the small N side
 * of the instruction and the keys (or the latent dims) its M side:
 *   S^T = K Q^T     [64 x 16 rows, of which the tile's 32 keys are the first 32]: wgmma
 *                   m64n16k16, A = the key tile (K-major, as it lands; M rows 32-63 read the next
 *                   32 rows of shared memory and are masked), B = the Q tile [16 rows x 576]
 *                   (K-major), 36 steps of 16 dims;
 *   O^T += V^T P^T  [512 dims x 16 rows]: 8 x wgmma m64n16k16 a step, A = the key tile's first
 *                   512 dims read transposed (MN-major: the dims are contiguous), B = P^T stored
 *                   [16 rows x 32 keys] (K-major), 2 steps of 16 keys.
 * The key tiles are 32 keys in a ring of 5 slots (180 KB), so that while one tile is computed
 * four are being copied: the kernel streams the latent cache, and what it has in flight sets its
 * rate (with 2 slots of 64 keys: 4.11-4.13 TB/s at 32k keys, 2026-12-02).
 * Geometry: 256 threads, two warpgroups with their own jobs, so that one's softmax runs under the
 * other's products:
 *   warpgroup 0: S^T of tile t, the online softmax (the row maxima across its warps through
 *                shared memory), P^T(t) and the rescale factors into the P buffer t & 1;
 *   warpgroup 1: O^T of the tile from P buffer t & 1 (64 fp32 registers a thread), then the TMA
 *                copies of tile t + 5 into the slot it has just finished with.
 * Shared memory (1024-byte aligned, 209,000 bytes with the slack): Q [16 x 576] as 9 atoms of
 * [16 rows][128 B] (18 KB), 5 key slots [32 keys x 576] as 9 atoms of [32][128 B] (36 KB each),
 * 2 P^T buffers [16 rows][128 B] (also what the last slot's masked M rows read), the reduction
 * floats and the mbarriers:
 *   landed[s]  the tile in slot s has landed (the TMA bytes);
 *   p_full[b]  P^T and the rescale factors in P buffer b are written (warpgroup 0's 128 threads);
 *   p_empty[b] warpgroup 1 is done with P buffer b and its tile's slot (128 threads).
 * Every tile comes by TMA (boxes of {64 dims, 16 or 32 keys}, each inside one cache block); in a
 * tile that reaches past key_end the runs past it re-read the last valid key's page, and
 * warpgroup 0 zeroes the V rows past key_end after its S^T (P = 0 times the NaN a free cache slot
 * may hold would be NaN), before P^T is published.  Atoms are 128-byte swizzled: the 16-byte
 * chunk c of row r at r * 128 + ((c ^ (r & 7)) << 4) (every atom starts on a 1024-byte boundary).
 *
 * Count per 32-key tile: 32 x 16 x (576 + 512) x 2 = 1.1 MFLOP; the operands are read from shared
 * memory once per instruction (2.5 KB per m64n16k16, 52 a tile), about 1,000 cycles of
 * shared-memory bandwidth, under the ~2,000 cycles its 36.9 KB take at the H200's HBM rate shared
 * by 132 SMs.  The kernel body exists only in the sm_90a build; the host picks it only on a
 * compute-capability 9.0 device. */

#ifndef AR_MLA_DECODE_WGMMA16_CUH
#define AR_MLA_DECODE_WGMMA16_CUH

#include "mla_decode_wgmma.cuh"

namespace ar_mla {

constexpr int W16_ROWS = 16;                                /* query rows of a work item */
constexpr int W16_KEYS = 32;                                /* keys a tile */
constexpr int W16_SLOTS = 5;                                /* the key ring */
constexpr int W16_QATOM = W16_ROWS * 128;                   /* one 64-dim atom of Q or P^T: [16][128 B] */
constexpr int W16_KATOM = W16_KEYS * 128;                   /* one 64-dim atom of a key tile: [32][128 B] */
constexpr int W16_TILE = 9 * W16_KATOM;                     /* a key tile: [32 keys x 576] 16-bit */
constexpr int W16_OFF_K = 9 * W16_QATOM;                    /* the key slots, after Q */
constexpr int W16_OFF_P = W16_OFF_K + W16_SLOTS * W16_TILE; /* P^T [2][16 rows][128 B] */
constexpr int W16_OFF_RED = W16_OFF_P + 2 * W16_QATOM;
/* floats at W16_OFF_RED: alpha [2][16], tile maxima [2][4 warps][16], final m and l [2][16],
 * row-sum parts [4 warps][16] */
constexpr int W16_RED_ALPHA = 0, W16_RED_WMAX = 32, W16_RED_FIN = 160, W16_RED_LSUM = 192, W16_RED_FLOATS = 256;
constexpr int W16_OFF_BAR = W16_OFF_RED + W16_RED_FLOATS * 4;
constexpr int W16_BARS = W16_SLOTS + 4;                     /* landed [5], p_full [2], p_empty [2] */
constexpr int W16_SMEM = 1024 /* alignment slack */ + W16_OFF_BAR + W16_BARS * 8;
static_assert(W16_OFF_K % 1024 == 0 && W16_TILE % 1024 == 0 && W16_OFF_P % 1024 == 0, "wgmma16: alignment");
static_assert(W16_OFF_RED - W16_OFF_P >= W16_KATOM, "wgmma16: the last slot's masked M rows stay inside the block");
static_assert(W16_SMEM <= 232448, "wgmma16: more shared memory than an sm_90 block gets");

/* d [64 x 16, accumulator layout: element (nt, e) is M row 16 (warp % 4) + lane / 4 + 8 (e >> 1),
 * N column 8 nt + 2 (lane % 4) + (e & 1)] (+)= A B, both from shared memory; B K-major; A K-major
 * (TRANS_A 0) or MN-major (TRANS_A 1). */
template <bool BF16, int TRANS_A>
__device__ __forceinline__ void wgmma_m64n16(float (&d)[2][4], uint64_t desc_a, uint64_t desc_b, int accumulate);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define W16_ACC8(d) "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), \
                    "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
#define W16_TEXT(TY, TA) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n16k16.f32" TY TY " " \
    "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, " TA ", 0;\n}\n"
template <bool BF16, int TRANS_A>
__device__ __forceinline__ void wgmma_m64n16(float (&d)[2][4], uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    if constexpr (BF16 && TRANS_A)
        asm volatile(W16_TEXT(".bf16", "1") : W16_ACC8(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    else if constexpr (BF16)
        asm volatile(W16_TEXT(".bf16", "0") : W16_ACC8(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    else if constexpr (TRANS_A)
        asm volatile(W16_TEXT(".f16", "1") : W16_ACC8(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    else
        asm volatile(W16_TEXT(".f16", "0") : W16_ACC8(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
#undef W16_ACC8
#undef W16_TEXT
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

/* Barrier among the 128 threads of one warpgroup (named barrier id 1 + wg; 0 is __syncthreads). */
__device__ __forceinline__ void w16_wg_sync(int wg)
{
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
}

/* TMA copies of the 32 keys k0 .. k0 + 31 of request r into the slot at sk_addr, by one thread,
 * completing on bar (its expected bytes raised by the whole tile first): 32 / rows runs of rows =
 * 2^wg_tma_rows_log2 keys (a run never leaves its cache block), each as 9 boxes [rows keys][64
 * dims].  A run that starts at or past key_end copies from the last valid key's slot instead
 * (its rows are zeroed before use), so the block table is read only inside the request's blocks
 * and the byte count stays whole.  The lines are marked evict-first in L2 (each is read once). */
__device__ __forceinline__ void w16_tma_tile(const attn_args &a, const void *tmap, int r, int k0, int key_end,
                                             uint32_t sk_addr, uint32_t bar)
{
    const int rows_log2 = wg_tma_rows_log2(a.block_size_log2);
    const int runs = W16_KEYS >> rows_log2;       /* 1 or 2 */
    const int *const bt = a.block_table + (int64_t)r * a.mbpr;
    const uint64_t policy = ar_wg::l2_evict_first_policy();
    ar_wg::mbar_arrive_expect_tx(bar, (uint32_t)W16_TILE);
    for (int p = 0; p < runs; p++) {
        int j = k0 + (p << rows_log2);
        if (j >= key_end) j = key_end - 1;
        const int slot = (__ldg(bt + (j >> a.block_size_log2)) << a.block_size_log2) + (j & (a.block_size - 1));
        const uint32_t dst = sk_addr + (uint32_t)((p << rows_log2) * 128);
#pragma unroll
        for (int c = 0; c < 9; c++) ar_wg::tma_load_2d_hint(dst + (uint32_t)(c * W16_KATOM), tmap, bar, c * 64, slot, policy);
    }
}

/* The kernel (see the file comment).  tmap: the latent cache as attn_wgmma_tma_kernel's. */
template <bool BF16>
__global__ void __launch_bounds__(THREADS, 1) attn_wgmma16_kernel(attn_args a, const __grid_constant__ CUtensorMap tmap)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    uint32_t sq_addr;                                           /* the Q tile, at the aligned start */
    unsigned char *const smem = wg_smem_base(&sq_addr);
    const uint32_t sk_addr0 = sq_addr + W16_OFF_K, sp_addr0 = sq_addr + W16_OFF_P;
    float *const red = reinterpret_cast<float *>(smem + W16_OFF_RED);
    const uint32_t bar0 = sq_addr + W16_OFF_BAR;
    auto landed_bar = [&](int s) { return bar0 + (uint32_t)(8 * s); };
    auto p_full_bar = [&](int b) { return bar0 + (uint32_t)(8 * (W16_SLOTS + b)); };
    auto p_empty_bar = [&](int b) { return bar0 + (uint32_t)(8 * (W16_SLOTS + 2 + b)); };
    auto slot_addr = [&](int t) { return sk_addr0 + (uint32_t)((t % W16_SLOTS) * W16_TILE); };

    const work_item w = a.work[blockIdx.x];
    const int r = w.req;
    const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
    const int H = a.num_heads, nrows = ql * H;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
    const int g = lane >> 2, tq = lane & 3;
    const int ntiles = w.key_end > w.key_begin ? (w.key_end - w.key_begin + W16_KEYS - 1) / W16_KEYS : 0;
    /* this thread's 4 query rows in both accumulator layouts: index i = 2 nt + (e & 1) is row
     * 8 nt + 2 tq + (e & 1) */
    int qrow[4];
#pragma unroll
    for (int i = 0; i < 4; i++) qrow[i] = 8 * (i >> 1) + 2 * tq + (i & 1);

    if (tid == 0) {
        for (int s = 0; s < W16_SLOTS; s++) ar_wg::mbar_init(landed_bar(s), 1);
        for (int b = 0; b < 2; b++) {
            ar_wg::mbar_init(p_full_bar(b), 128);
            ar_wg::mbar_init(p_empty_bar(b), 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        ar_wg::tma_prefetch_map(&tmap);
    }
    __syncthreads();
    if (tid == 0)
        for (int t = 0; t < W16_SLOTS && t < ntiles; t++)
            w16_tma_tile(a, &tmap, r, w.key_begin + t * W16_KEYS, w.key_end, slot_addr(t), landed_bar(t));

    if (wg == 0) {
        /* ---- warpgroup 0: Q, then S^T and the softmax of every tile ---- */
        const uint16_t *const qg = (const uint16_t *)a.q;
#pragma unroll
        for (int k = 0; k < W16_ROWS * WG_CHUNKS / 128; k++) {
            const int idx = tid + k * 128, row = idx / WG_CHUNKS, c = idx % WG_CHUNKS;
            const int gr = w.row0 + row;
            const bool valid = gr < nrows;
            cp_async16(smem + (c >> 3) * W16_QATOM + row * 128 + (((c & 7) ^ (row & 7)) << 4),
                       qg + ((int64_t)q0 * H + (valid ? gr : 0)) * D + c * 8, valid);
        }
        cp_async_commit();
        cp_async_wait<0>();
        ar_wg::fence_proxy_async();
        w16_wg_sync(0);

        const int extra = a.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0;
        int lim[4];
        float m_run[4], l_part[4];   /* l_part: this thread's share of the row sums (its keys) */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int gr = w.row0 + qrow[i];
            lim[i] = gr < nrows ? key_limit(a.causal, sl, ql, gr / H, extra) : 0;
            if (lim[i] > w.key_end) lim[i] = w.key_end;
            m_run[i] = -INFINITY;
            l_part[i] = 0.f;
        }
        const uint64_t desc_q = ar_wg::desc_sw128(sq_addr, 16, 1024);
        float *const s_alpha = red + W16_RED_ALPHA, *const s_wmax = red + W16_RED_WMAX;
        for (int t = 0; t < ntiles; t++) {
            const int b = t & 1;
            const uint32_t sk_addr = slot_addr(t);
            ar_wg::mbar_wait(landed_bar(t % W16_SLOTS), (uint32_t)(t / W16_SLOTS) & 1u);
            float acc[2][4];
            const uint64_t desc_k = ar_wg::desc_sw128(sk_addr, 16, 1024);
            ar_wg::fence();
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
                const uint32_t koff = (uint32_t)((kk >> 2) * W16_KATOM + (kk & 3) * 32) >> 4;
                const uint32_t qoff = (uint32_t)((kk >> 2) * W16_QATOM + (kk & 3) * 32) >> 4;
                wgmma_m64n16<BF16, 0>(acc, desc_k + koff, desc_q + qoff, kk > 0);
            }
            ar_wg::commit();
            ar_wg::wait<0>();
            wg_fence_acc(acc);
            const int k0 = w.key_begin + t * W16_KEYS;
            const int valid_keys = w.key_end - k0;
            if (valid_keys < W16_KEYS) {   /* the V rows past key_end -> zeros (dims 0-511) */
                for (int idx = tid; idx < (W16_KEYS - valid_keys) * 64; idx += 128) {
                    const int row = valid_keys + (idx >> 6), c = idx & 63;
                    *reinterpret_cast<uint4 *>(smem + (sk_addr - sq_addr) + (c >> 3) * W16_KATOM + row * 128 +
                                               (((c & 7) ^ (row & 7)) << 4)) = make_uint4(0, 0, 0, 0);
                }
                ar_wg::fence_proxy_async();
            }
            /* mask (M rows 32-63 are not keys of the tile) and scale (log2 domain); the tile's row
             * maxima: this thread's 2 keys, the 8 lanes of its column, then the warps through
             * shared memory */
            float mx[4];
#pragma unroll
            for (int i = 0; i < 4; i++) mx[i] = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = 2 * nt + (e & 1), kt = 16 * wq + g + 8 * (e >> 1);
                    const float x = kt < W16_KEYS && k0 + kt < lim[i] ? acc[nt][e] * a.scale_log2 : -INFINITY;
                    acc[nt][e] = x;
                    mx[i] = fmaxf(mx[i], x);
                }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 4));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 8));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 16));
            }
            if (g == 0 && wq < 2)
#pragma unroll
                for (int i = 0; i < 4; i++) s_wmax[(b * 4 + wq) * 16 + qrow[i]] = mx[i];
            w16_wg_sync(0);
            float alpha[4], m_use[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float *wm = s_wmax + b * 64 + qrow[i];
                const float m_new = fmaxf(m_run[i], fmaxf(wm[0], wm[16]));
                m_use[i] = m_new == -INFINITY ? 0.f : m_new;
                alpha[i] = exp2f(m_run[i] - m_use[i]);
                m_run[i] = m_new;
                l_part[i] *= alpha[i];
            }
            /* P^T [16 rows][32 keys] into buffer b once warpgroup 1 is done with tile t - 2 */
            if (t >= 2) ar_wg::mbar_wait(p_empty_bar(b), (uint32_t)((t >> 1) - 1) & 1u);
            unsigned char *const sp = smem + W16_OFF_P + b * W16_QATOM;
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = 2 * nt + (e & 1), row = qrow[i], kt = 16 * wq + g + 8 * (e >> 1);
                    const float p = exp2f(acc[nt][e] - m_use[i]);
                    l_part[i] += p;
                    if (wq < 2)
                        *reinterpret_cast<uint16_t *>(sp + row * 128 + (((kt >> 3) ^ (row & 7)) << 4) + (kt & 7) * 2) =
                            to_bits(BF16, p);
                }
            if (wq == 0 && g == 0)
#pragma unroll
                for (int i = 0; i < 4; i++) s_alpha[b * 16 + qrow[i]] = alpha[i];
            ar_wg::fence_proxy_async();   /* P^T stores -> wgmma's reads */
            ar_wg::mbar_arrive(p_full_bar(b));
        }
        /* the row sums: the 8 lanes of a column, then the warps */
        float *const s_lsum = red + W16_RED_LSUM, *const s_fin = red + W16_RED_FIN;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float l = l_part[i];
            l += __shfl_xor_sync(0xffffffffu, l, 4);
            l += __shfl_xor_sync(0xffffffffu, l, 8);
            l += __shfl_xor_sync(0xffffffffu, l, 16);
            if (g == 0) s_lsum[wq * 16 + qrow[i]] = l;
        }
        w16_wg_sync(0);
        if (wq == 0 && g == 0)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int c = qrow[i];
                s_fin[c] = m_run[i];
                s_fin[16 + c] = s_lsum[c] + s_lsum[16 + c] + s_lsum[32 + c] + s_lsum[48 + c];
            }
        __syncthreads();   /* the final maxima and sums -> warpgroup 1 */
        if (tid < W16_ROWS) {   /* the LSE of row tid */
            const int gr = w.row0 + tid;
            const float m = s_fin[tid], l = s_fin[16 + tid];
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
    float o[8][2][4];   /* dims 64 mt + 16 wq + g + 8 (e >> 1), query row qrow[2 nt + (e & 1)] */
#pragma unroll
    for (int mt = 0; mt < 8; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[mt][nt][e] = 0.f;
    const float *const s_alpha = red + W16_RED_ALPHA;
    for (int t = 0; t < ntiles; t++) {
        const int b = t & 1;
        ar_wg::mbar_wait(p_full_bar(b), (uint32_t)(t >> 1) & 1u);
        float al[4];
#pragma unroll
        for (int i = 0; i < 4; i++) al[i] = s_alpha[b * 16 + qrow[i]];
        if (a.fault != AR_FAULT_NO_RESCALE &&
            __any_sync(0xffffffffu, al[0] != 1.f || al[1] != 1.f || al[2] != 1.f || al[3] != 1.f)) {
#pragma unroll
            for (int mt = 0; mt < 8; mt++)
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) o[mt][nt][e] *= al[2 * nt + (e & 1)];
        }
#pragma unroll
        for (int mt = 0; mt < 8; mt++) wg_fence_acc(o[mt]);
        ar_wg::fence();
        const uint32_t sk_addr = slot_addr(t);
        const uint64_t desc_p = ar_wg::desc_sw128(sp_addr0 + (uint32_t)(b * W16_QATOM), 16, 1024);
#pragma unroll
        for (int kk = 0; kk < W16_KEYS / 16; kk++)
#pragma unroll
            for (int mt = 0; mt < 8; mt++) {
                const uint64_t desc_v = ar_wg::desc_sw128(sk_addr + (uint32_t)(mt * W16_KATOM + kk * 2048), W16_KATOM, 1024);
                wgmma_m64n16<BF16, 1>(o[mt], desc_v, desc_p + (uint32_t)((kk * 32) >> 4), 1);
            }
        ar_wg::commit();
        ar_wg::wait<0>();
#pragma unroll
        for (int mt = 0; mt < 8; mt++) wg_fence_acc(o[mt]);
        ar_wg::mbar_arrive(p_empty_bar(b));
        if (t + W16_SLOTS < ntiles) {   /* the slot is free (S^T of tile t completed before P^T(t) was published) */
            w16_wg_sync(1);
            if (tid == 128)
                w16_tma_tile(a, &tmap, r, w.key_begin + (t + W16_SLOTS) * W16_KEYS, w.key_end, sk_addr,
                             landed_bar(t % W16_SLOTS));
        }
    }
    __syncthreads();   /* warpgroup 0's final maxima and sums */
    const float *const s_fin = red + W16_RED_FIN;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int c = qrow[i], gr = w.row0 + c;
        if (gr >= nrows) continue;
        const float l = s_fin[16 + c];
        const float inv = l > 0.f ? 1.f / l : 0.f;
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
