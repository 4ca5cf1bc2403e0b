/* mla_decode_mma.cuh - the MLA decode kernels on mma.sync tensor cores (sm_80+) and the SIMT
 * fallback: the absorbed latent attention of the cuda-mla backend (weight-absorbed queries of
 * 576 dims against the latent cache; values = the first 512 dims of the same key rows), the
 * split-KV combines, and what they share.  Included by mla_decode.cu; which kernel runs a launch
 * is decided by ar_mla_choose (mla_route.c).
 *
 * A row is a (query token, head) pair numbered token-major inside a request, so every latent
 * block is read once for all heads of a tile.  Keys are gathered through the block table in
 * tiles of 32 (cp.async into a ring of tiles), S = Q K^T over 576 dims and O += P V over the
 * first 512 dims of the SAME shared-memory tile; the online softmax runs in the log2 domain;
 * queries longer than 1 are bottom-right causal.  A launch's work items may cut a row tile's
 * keys into pieces (split-KV, mla_decode.cu's planner); the pieces write normalised partials
 * and log2 LSEs that combine_kernel / combine_rows_kernel merge.
 *
 *   attn_tc_kernel          64-row tiles, 8 warps: 4 row groups x 2 column halves that split
 *                           each 16 x 32 score tile between them (rings of 3 tiles on Hopper,
 *                           2 on an A100);
 *   attn_narrow_kernel      launches in which every request has at most 16 rows (s_q x h_q,
 *                           e.g. 16 heads at TP8): the 8 warps on one 16-row tile as 2 key
 *                           halves x 4 output-column quarters (rings of 4 or 2);
 *   attn_narrow_bulk_kernel the same on Hopper with key rows by the bulk copy engine, one CTA
 *                           barrier a tile, 2 CTAs per SM and a persistent plan;
 * The SIMT fallback (attn_simt_kernel) and the combines that merge split pieces by LSE
 * (combine_kernel, combine_rows_kernel) are plain kernels: they live in mla_decode.cu, the one
 * file that launches them.  Faults (ar_fault) are honoured here through the run-time flag
 * args.fault. */
#ifndef AR_MLA_DECODE_MMA_CUH
#define AR_MLA_DECODE_MMA_CUH

#include "mla_common.cuh"

namespace ar_mla {

/* shared memory of attn_tc_kernel with a ring of `stages` key tiles: 155136 bytes for 2 (fits an
 * A100's 163 KB), 192512 for 3 (Hopper: up to 227 KB) */
constexpr int SMEM_Q = ROWS * STRIDE * 2;
constexpr int SMEM_K = KEYS * STRIDE * 2;
constexpr int PSTRIDE = 40;     /* row stride (16-bit elements) of the shared P tile */
constexpr int SMEM_SPLIT = ROWS * PSTRIDE * 2 + 2 * ROWS * 4;   /* P tile + row max / sum exchange */
constexpr int smem_total(int stages)
{
    return SMEM_Q + stages * SMEM_K + SMEM_SPLIT;
}

/* ---------------------------------------------------------------------------------------- */
/* The key-tile ring and the pieces the tensor-core kernels share                             */

/* Physical blocks of the two 16-key halves of the key tile at k0 (k0 is a multiple of KEYS, so
 * a tile lies in one block of >= 32 keys or in two of 16); 0 for a half with no key < key_end. */
__device__ __forceinline__ int2 tile_blocks(const attn_args &a, int r, int k0, int key_end)
{
    const int *bt = a.block_table + (int64_t)r * a.mbpr;
    int b0 = k0 < key_end ? bt[k0 >> a.block_size_log2] : 0;
    int b1 = k0 + 16 < key_end ? bt[(k0 + 16) >> a.block_size_log2] : b0;
    return make_int2(b0, b1);
}

/* Loads keys [k0, k0 + KEYS) (in the blocks tile_blocks gave) into a shared tile (zeros at and
 * past key_end).  The 16-bit cache goes by cp.async; an fp8 cache is read into registers (all 9
 * loads of a thread issued before the first is used, so a tile costs one memory latency, not
 * nine), widened to the compute dtype (exact) and stored. */
template <bool BF16, bool FP8>
__device__ __forceinline__ void load_key_tile(const attn_args &a, uint16_t *sk, int2 blocks, int k0, int key_end)
{
    constexpr int chunks = D / 8;   /* 72 chunks of 8 elements per key row */
    if (!FP8) {
        for (int idx = threadIdx.x; idx < KEYS * chunks; idx += THREADS) {
            int key = idx / chunks, ch = idx % chunks;
            int j = k0 + key;
            bool valid = j < key_end;
            int64_t blk = key < 16 ? blocks.x : blocks.y;
            int64_t slot = valid ? (blk << a.block_size_log2) + (j & (a.block_size - 1)) : 0;
            const uint16_t *src = (const uint16_t *)a.cache + slot * D + ch * 8;
            cp_async16(sk + key * STRIDE + ch * 8, src, valid);
        }
        return;
    }
    constexpr int PER_THREAD = KEYS * chunks / THREADS;
    static_assert(KEYS * chunks % THREADS == 0, "fp8 key tile: whole chunks per thread");
    uint2 raw[PER_THREAD];
#pragma unroll
    for (int i = 0; i < PER_THREAD; i++) {
        int idx = threadIdx.x + i * THREADS;
        int key = idx / chunks, ch = idx % chunks;
        int j = k0 + key;
        int64_t blk = key < 16 ? blocks.x : blocks.y;
        int64_t slot = (blk << a.block_size_log2) + (j & (a.block_size - 1));
        raw[i] = make_uint2(0, 0);
        if (j < key_end) raw[i] = *reinterpret_cast<const uint2 *>((const uint8_t *)a.cache + slot * D + ch * 8);
    }
#pragma unroll
    for (int i = 0; i < PER_THREAD; i++) {
        int idx = threadIdx.x + i * THREADS;
        int key = idx / chunks, ch = idx % chunks;
        uint16_t v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            uint32_t word = e < 4 ? raw[i].x : raw[i].y;
            uint8_t byte = (uint8_t)(word >> (8 * (e & 3)));
            v[e] = to_bits(BF16, ar_fp8e4m3_to_f32(byte));   /* exact in bf16 and fp16; 0 -> +0 */
        }
        uint4 packed;
        packed.x = v[0] | ((uint32_t)v[1] << 16);
        packed.y = v[2] | ((uint32_t)v[3] << 16);
        packed.z = v[4] | ((uint32_t)v[5] << 16);
        packed.w = v[6] | ((uint32_t)v[7] << 16);
        *reinterpret_cast<uint4 *>(sk + key * STRIDE + ch * 8) = packed;
    }
}

/* The ring of STAGES key tiles of a CTA's piece: tiles t+1 .. t+STAGES-1 are in flight while tile
 * t is used.  One commit group per tile slot, empty ones included, so that wait<STAGES-1> at
 * tile t always means "Q and tiles 0..t have landed".  The block-table entries of the next tile
 * to load are read one tile ahead (next_blocks), which keeps the table's latency off the loop. */
template <bool BF16, bool FP8, int STAGES>
__device__ __forceinline__ void ring_start(const attn_args &a, uint16_t *sk_base, int r, const work_item &w, int ntiles,
                                           int2 &next_blocks)
{
    for (int st = 0; st < STAGES - 1; st++) {
        const int k0 = w.key_begin + st * KEYS;
        if (st < ntiles)
            load_key_tile<BF16, FP8>(a, sk_base + st * KEYS * STRIDE, tile_blocks(a, r, k0, w.key_end), k0, w.key_end);
        cp_async_commit();
    }
    next_blocks = STAGES - 1 < ntiles ? tile_blocks(a, r, w.key_begin + (STAGES - 1) * KEYS, w.key_end) : make_int2(0, 0);
}

/* Before tile t: starts loading tile t + STAGES - 1 (into the slot tile t-1 used, freed by the
 * barrier that ended tile t-1) and waits for tile t; returns tile t's slot.  The caller then
 * synchronises the CTA. */
template <bool BF16, bool FP8, int STAGES>
__device__ __forceinline__ const uint16_t *ring_next(const attn_args &a, uint16_t *sk_base, int r, const work_item &w,
                                                     int t, int ntiles, int2 &next_blocks)
{
    const int nxt = t + STAGES - 1;
    if (nxt < ntiles) {
        load_key_tile<BF16, FP8>(a, sk_base + (nxt % STAGES) * KEYS * STRIDE, next_blocks, w.key_begin + nxt * KEYS,
                                 w.key_end);
        if (nxt + 1 < ntiles) next_blocks = tile_blocks(a, r, w.key_begin + (nxt + 1) * KEYS, w.key_end);
    }
    cp_async_commit();
    cp_async_wait<STAGES - 1>();
    return sk_base + (t % STAGES) * KEYS * STRIDE;
}

/* ---- pieces shared by the 64-row and the narrow tensor-core kernels ---- */

/* Q tile: rows row0 .. row0 + TILE_ROWS - 1 of a request (zeros at and past nrows) into sq
 * [TILE_ROWS, STRIDE], as one cp.async commit group. */
template <int TILE_ROWS>
__device__ __forceinline__ void load_q_tile(const attn_args &a, uint16_t *sq, int q0, int row0, int nrows)
{
    const int chunks = D / 8;
    for (int idx = threadIdx.x; idx < TILE_ROWS * chunks; idx += THREADS) {
        int row = idx / chunks, ch = idx % chunks;
        int gr = row0 + row;
        bool valid = gr < nrows;
        const uint16_t *src = (const uint16_t *)a.q + ((int64_t)q0 * a.num_heads + (valid ? gr : 0)) * D + ch * 8;
        cp_async16(sq + row * STRIDE + ch * 8, src, valid);
    }
    cp_async_commit();
}

/* Key limits of a thread's two rows (tile rows lr[0], lr[1]): 0 past the request's rows, capped
 * at the piece's key_end. */
__device__ __forceinline__ void row_limits(const attn_args &a, const work_item &w, int sl, int ql, int nrows,
                                           const int lr[2], int lim[2])
{
    const int extra = a.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0;
    for (int h = 0; h < 2; h++) {
        int gr = w.row0 + lr[h];
        lim[h] = gr < nrows ? key_limit(a.causal, sl, ql, gr / a.num_heads, extra) : 0;
        if (lim[h] > w.key_end) lim[h] = w.key_end;
    }
}

/* Masks (key >= lim: -inf) and scales to the log2 domain a thread's score fragments s[NT][4]
 * (key of element e of n-tile nt: kbase + nt*8 + 2*tig + (e&1)); mx = the row maxima over the
 * quad of threads that share the rows. */
template <int NT>
__device__ __forceinline__ void mask_scale_rowmax(float (*s)[4], int kbase, int tig, const int lim[2], float score_mul,
                                                  float mx[2])
{
    mx[0] = mx[1] = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int h = e >> 1;
            int j = kbase + nt * 8 + 2 * tig + (e & 1);
            float x = j < lim[h] ? s[nt][e] * score_mul : -INFINITY;
            s[nt][e] = x;
            mx[h] = fmaxf(mx[h], x);
        }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    }
}

/* One online-softmax step given this tile's row maxima mx: s becomes P = 2^(s - m), the
 * running max / sum are updated and the output accumulators o[NTO][4] rescaled (unless the
 * NO_RESCALE fault is planted). */
template <int NT, int NTO>
__device__ __forceinline__ void softmax_step(float (*s)[4], const float mx[2], float m_run[2], float l_run[2],
                                             float (*o)[4], int fault)
{
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float m_new = fmaxf(m_run[h], mx[h]);
        m_use[h] = m_new == -INFINITY ? 0.f : m_new;
        alpha[h] = exp2f(m_run[h] - m_use[h]);
        m_run[h] = m_new;
    }
    float psum[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float p = exp2f(s[nt][e] - m_use[e >> 1]);
            s[nt][e] = p;
            psum[e >> 1] += p;
        }
    for (int h = 0; h < 2; h++) l_run[h] = l_run[h] * alpha[h] + psum[h];
    if (fault != AR_FAULT_NO_RESCALE) {
#pragma unroll
        for (int nt = 0; nt < NTO; nt++) {
            o[nt][0] *= alpha[0];
            o[nt][1] *= alpha[0];
            o[nt][2] *= alpha[1];
            o[nt][3] *= alpha[1];
        }
    }
}

/* S[16 rows, NT*8 keys] += Q K^T over the dims [kk0, kk0 + 16 * ksteps): A fragments (Q rows,
 * row-major [row, STRIDE] in shared memory) and B fragments (keys, row-major [key, STRIDE]) by
 * ldmatrix.x4, one instruction per fragment quad instead of four 32-bit loads.  qlane / klane are
 * the lane's row addresses (qk_lane_rows). */
template <bool BF16, int NT>
__device__ __forceinline__ void qk_tile(float (*s)[4], const uint16_t *qlane, const uint16_t *klane, int kk0, int ksteps)
{
#pragma unroll 4
    for (int ks = 0; ks < ksteps; ks++) {
        const int kk = kk0 + ks * 16;
        uint32_t af[4];
        ldmatrix_x4(af, qlane + kk);   /* a0..a3: rows 0-7 / 8-15 x dims 0-7 / 8-15 */
#pragma unroll
        for (int p = 0; p < NT / 2; p++) {
            uint32_t bf[4];         /* b0, b1 of n-tile 2p, then of n-tile 2p + 1 */
            ldmatrix_x4(bf, klane + p * 16 * STRIDE + kk);
            mma16816<BF16>(s[2 * p], af, bf[0], bf[1]);
            mma16816<BF16>(s[2 * p + 1], af, bf[2], bf[3]);
        }
    }
}

/* The lane's ldmatrix row addresses for qk_tile: Q row row0 + (lane & 7) + 8 * bit 3 of the
 * lane, dim offset 8 * bit 4; key key0 + (lane & 7) + 8 * bit 4, dim offset 8 * bit 3. */
__device__ __forceinline__ void qk_lane_rows(const uint16_t *sq, const uint16_t *sk, int row0, int key0, int lane,
                                             const uint16_t **qlane, const uint16_t **klane)
{
    *qlane = sq + (row0 + (lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE + (lane >> 4) * 8;
    *klane = sk + (key0 + (lane & 7) + (lane >> 4) * 8) * STRIDE + ((lane >> 3) & 1) * 8;
}

/* O[16 rows, NP*16 columns from col0] += P (16 x 16, A fragments pf) x V (16 keys from key0 of
 * the shared key tile sk, its first 512 columns), V fragments by ldmatrix.trans. */
template <bool BF16, int NP>
__device__ __forceinline__ void pv_step(float (*o)[4], const uint32_t pf[4], const uint16_t *sk, int key0, int col0,
                                        int lane)
{
    const int mi = lane >> 3, rr = lane & 7;
    const uint16_t *vbase = sk + (key0 + rr + (mi & 1) * 8) * STRIDE + col0 + (mi >> 1) * 8;
#pragma unroll
    for (int np = 0; np < NP; np++) {
        uint32_t vf[4];
        ldmatrix_x4_trans(vf, vbase + np * 16);
        mma16816<BF16>(o[2 * np], pf, vf[0], vf[1]);
        mma16816<BF16>(o[2 * np + 1], pf, vf[2], vf[3]);
    }
}

/* Sums of a thread's two row values over the quad of threads that share the rows. */
__device__ __forceinline__ void quad_sum(float v[2])
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        v[h] += __shfl_xor_sync(0xffffffffu, v[h], 1);
        v[h] += __shfl_xor_sync(0xffffffffu, v[h], 2);
    }
}

/* Writes row h of a thread's accumulators o[NTO][4] (columns col0 + nt*8 + 2*tig) times inv, to
 * o_lat (whole row tile) or the piece's partial slot, and (one thread per row: write_lse) the
 * LSE: natural to lse [H, T] (log2 with the LSE_BASE2 fault), log2 to part_lse. */
template <int NTO>
__device__ __forceinline__ void store_row(const attn_args &a, const work_item &w, int q0, int lrow, int h,
                                          const float (*o)[4], float inv, float lse2, int col0, int tig, bool write_lse)
{
    const int H = a.num_heads, gr = w.row0 + lrow;
    float *dst;
    if (w.partial < 0)
        dst = a.o_lat + ((int64_t)q0 * H + gr) * DL;
    else
        dst = a.part_o + ((int64_t)w.partial * ROWS + lrow) * DL;
#pragma unroll
    for (int nt = 0; nt < NTO; nt++) {
        int col = col0 + nt * 8 + 2 * tig;
        *reinterpret_cast<float2 *>(dst + col) = make_float2(o[nt][2 * h] * inv, o[nt][2 * h + 1] * inv);
    }
    if (!write_lse) return;
    if (w.partial < 0) {
        int i = gr / H, n = gr % H;
        float lse = a.fault == AR_FAULT_LSE_BASE2 ? lse2 : lse2 * 0.6931471805599453f;
        a.lse[(int64_t)n * a.num_tokens + q0 + i] = lse;
    } else {
        a.part_lse[(int64_t)w.partial * ROWS + lrow] = lse2;
    }
}

/* The 64-row kernel: one CTA = 8 warps on a tile of 64 rows; warp w owns rows 16 (w % 4) ..
 * + 16 and output columns 256 (w / 4) .. + 256 of the 64 x 512 latent output (128 fp32
 * accumulators a thread).  The two column-half warps of a row group each compute half of the
 * 16 x 32 score tile (16 keys); the row maxima, P (through a shared 64 x 32 tile) and the final
 * row sums are exchanged through shared memory (three CTA barriers a tile). */
template <bool BF16, bool FP8, int STAGES>
__global__ void __launch_bounds__(THREADS, 1) attn_tc_kernel(attn_args a)
{
    extern __shared__ uint4 smem_raw[];
    uint16_t *sq = reinterpret_cast<uint16_t *>(smem_raw);
    uint16_t *const sk_base = sq + ROWS * STRIDE;   /* STAGES key tiles: buffer b at b * KEYS * STRIDE */
    uint16_t *const sp = sk_base + STAGES * KEYS * STRIDE;                 /* [ROWS, PSTRIDE] */
    float *const s_red = reinterpret_cast<float *>(sp + ROWS * PSTRIDE);   /* [2, ROWS] */

    const work_item w = a.work[blockIdx.x];
    const int r = w.req, H = a.num_heads;
    const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
    const int nrows = ql * H;
    load_q_tile<ROWS>(a, sq, q0, w.row0, nrows);   /* rows row0 .. row0 + 63 */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rg = warp & 3, colh = warp >> 2;
    const int g = lane >> 2, tig = lane & 3;
    const int lr[2] = {rg * 16 + g, rg * 16 + g + 8};
    int lim[2];
    row_limits(a, w, sl, ql, nrows, lr, lim);

    float o[32][4];
#pragma unroll
    for (int nt = 0; nt < 32; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[nt][e] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    const float score_mul = a.scale_log2 * (FP8 ? a.kv_scale : 1.f);

    /* a warp whose 16 rows are all past the request's rows (few heads: h_q = 16 fills one of
     * the four row groups) only helps with the loads */
    const bool active = w.row0 + rg * 16 < nrows;
    const int ntiles = w.key_end > w.key_begin ? (w.key_end - w.key_begin + KEYS - 1) / KEYS : 0;
    int2 next_blocks;
    ring_start<BF16, FP8, STAGES>(a, sk_base, r, w, ntiles, next_blocks);
    for (int t = 0; t < ntiles; t++) {
        const int k0 = w.key_begin + t * KEYS;
        const uint16_t *sk = ring_next<BF16, FP8, STAGES>(a, sk_base, r, w, t, ntiles, next_blocks);
        __syncthreads();
        /* Every warp reaches the same barrier instructions (compute-sanitizer's synccheck
         * flags warps that wait at different ones); an inactive warp skips the work between. */
        constexpr int NT = 2;
        const int key_off = colh * 16;
        float s[NT][4];
        float mx[2] = {-INFINITY, -INFINITY};
        if (active) {
            /* S = Q K^T: 16 rows x 16 keys per warp */
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] = 0.f;
            const uint16_t *qlane, *klane;
            qk_lane_rows(sq, sk, rg * 16, key_off, lane, &qlane, &klane);
            qk_tile<BF16, NT>(s, qlane, klane, 0, D / 16);

            /* mask, scale to the log2 domain, online softmax */
            mask_scale_rowmax<NT>(s, k0 + key_off, tig, lim, score_mul, mx);
            if (tig == 0) {   /* the other column half needs these maxima */
                s_red[colh * ROWS + lr[0]] = mx[0];
                s_red[colh * ROWS + lr[1]] = mx[1];
            }
        }
        __syncthreads();
        if (active) {
            /* the other column half's maxima over its 16 keys */
            mx[0] = fmaxf(mx[0], s_red[(1 - colh) * ROWS + lr[0]]);
            mx[1] = fmaxf(mx[1], s_red[(1 - colh) * ROWS + lr[1]]);
            softmax_step<NT, 32>(s, mx, m_run, l_run, o, a.fault);
            /* both halves write their part of P (16 x 32) to the shared P tile */
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    *reinterpret_cast<uint32_t *>(sp + lr[h] * PSTRIDE + key_off + nt * 8 + 2 * tig) =
                        pack2<BF16>(s[nt][2 * h], s[nt][2 * h + 1]);
        }
        __syncthreads();
        if (active) {
            /* O += P V: P from the shared P tile, V = first 512 columns of the key tile */
#pragma unroll
            for (int ks = 0; ks < 2; ks++) {
                uint32_t pf[4];
                const uint16_t *p0 = sp + lr[0] * PSTRIDE + ks * 16 + 2 * tig, *p1 = sp + lr[1] * PSTRIDE + ks * 16 + 2 * tig;
                pf[0] = *reinterpret_cast<const uint32_t *>(p0);
                pf[1] = *reinterpret_cast<const uint32_t *>(p1);
                pf[2] = *reinterpret_cast<const uint32_t *>(p0 + 8);
                pf[3] = *reinterpret_cast<const uint32_t *>(p1 + 8);
                pv_step<BF16, 16>(o, pf, sk, ks * 16, colh * 256, lane);
            }
        }
        __syncthreads();   /* the slot is refilled at the start of the next tile */
    }
    cp_async_wait<0>();

    /* epilogue: full row sums (each half summed its own 16 keys of every tile), normalise, write */
    quad_sum(l_run);
    if (active && tig == 0) {
        s_red[colh * ROWS + lr[0]] = l_run[0];
        s_red[colh * ROWS + lr[1]] = l_run[1];
    }
    __syncthreads();
    if (active) {
        l_run[0] += s_red[(1 - colh) * ROWS + lr[0]];
        l_run[1] += s_red[(1 - colh) * ROWS + lr[1]];
    }
    const float out_mul = FP8 ? a.kv_scale : 1.f;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int gr = w.row0 + lr[h];
        if (gr >= nrows) continue;
        float inv = l_run[h] > 0.f ? out_mul / l_run[h] : 0.f;
        float lse2 = l_run[h] > 0.f ? m_run[h] + log2f(l_run[h]) : -INFINITY;
        store_row<32>(a, w, q0, lr[h], h, o, inv, lse2, colh * 256, tig, colh == 0 && tig == 0);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Narrow tensor-core latent attention: row tiles of at most 16 rows (s_q * h_q <= 16, e.g.   */
/* DeepSeek decode at TP8 with 16 heads), where the 64-row kernel would leave 6 of its 8      */
/* warps idle (and both working warps on one SM sub-partition).  Here the 8 warps are 2 key   */
/* halves (kh) x 4 column quarters (cq): warp (kh, cq) owns keys kh*16 .. +16 of every        */
/* 32-key tile and output columns cq*128 .. +128.  The 16 x 16 score tile of a key half is    */
/* split over its 4 cq warps by the 576 dims (9 k-steps each) and the partial sums are added  */
/* through shared memory in a fixed order, so the 4 warps hold identical scores.  Each key    */
/* half keeps its own online softmax over its (disjoint) keys; the two halves are merged by   */
/* their maxima and sums at the end, like two split-KV pieces.                                 */

constexpr int NROWS = AR_MLA_NARROW_ROWS;                    /* rows of a narrow tile */
constexpr int SMEM_QN = NROWS * STRIDE * 2;                 /* Q tile */
constexpr int SMEM_SPART = 2 * 4 * NROWS * 16 * 4;          /* partial scores [kh][cq][row][16 keys] */
constexpr int SMEM_XML = 2 * NROWS * 4;                     /* key half 1's row max and sum */
constexpr int narrow_smem_total(int stages)
{
    return SMEM_QN + stages * SMEM_K + SMEM_SPART + SMEM_XML;
}

/* One key half's scores of a tile from the four column warps' partials part [2][4][16][16]
 * (added in the order cq = 0..3, so the four warps of the half hold identical scores), then
 * mask, scale to the log2 domain, online softmax, and O += P V: P 16 rows x the half's 16 keys
 * (one k-step), V = those keys' columns cq*128 .. +128 of the shared key tile sk. */
template <bool BF16>
__device__ __forceinline__ void narrow_softmax_pv(const attn_args &a, const float *part, const uint16_t *sk, int k0,
                                                  int kh, int cq, int lane, const int lr[2], const int lim[2],
                                                  float score_mul, float m_run[2], float l_run[2], float (*o)[4])
{
    const int tig = lane & 3;
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float2 acc = make_float2(0.f, 0.f);
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float2 v = *reinterpret_cast<const float2 *>(part + ((kh * 4 + c) * NROWS + lr[h]) * 16 + nt * 8 + 2 * tig);
                acc.x += v.x;
                acc.y += v.y;
            }
            s[nt][2 * h] = acc.x;
            s[nt][2 * h + 1] = acc.y;
        }
    float mx[2];
    mask_scale_rowmax<2>(s, k0 + kh * 16, tig, lim, score_mul, mx);
    softmax_step<2, 16>(s, mx, m_run, l_run, o, a.fault);
    uint32_t pf[4];
    pf[0] = pack2<BF16>(s[0][0], s[0][1]);
    pf[1] = pack2<BF16>(s[0][2], s[0][3]);
    pf[2] = pack2<BF16>(s[1][0], s[1][1]);
    pf[3] = pack2<BF16>(s[1][2], s[1][3]);
    pv_step<BF16, 8>(o, pf, sk, kh * 16, cq * 128, lane);
}

/* A warp's partial scores s[2][4] (16 rows x 16 keys) into its slot of part [2][4][16][16]. */
__device__ __forceinline__ void narrow_store_partial(float *part, int kh, int cq, const int lr[2], int tig,
                                                     const float (*s)[4])
{
    float *const my_part = part + ((kh * 4 + cq) * NROWS) * 16;
#pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        *reinterpret_cast<float2 *>(my_part + lr[0] * 16 + nt * 8 + 2 * tig) = make_float2(s[nt][0], s[nt][1]);
        *reinterpret_cast<float2 *>(my_part + lr[1] * 16 + nt * 8 + 2 * tig) = make_float2(s[nt][2], s[nt][3]);
    }
}

/* End of a narrow CTA, after the last tile and a CTA barrier (the key ring sk_base is free):
 * key half 1 hands its unnormalised output, maxima and sums to half 0 through shared memory
 * (x_o = the ring, x_ml [2][16]); half 0 merges the two like two split pieces and writes. */
__device__ __forceinline__ void narrow_epilogue(const attn_args &a, const work_item &w, int q0, int nrows, int kh,
                                                int cq, int tig, const int lr[2], float (*o)[4], float m_run[2],
                                                float l_run[2], uint16_t *sk_base, float *x_ml, float out_mul)
{
    quad_sum(l_run);
    float *const x_o = reinterpret_cast<float *>(sk_base);   /* [16][512] key half 1's unnormalised output */
    if (kh == 1) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int nt = 0; nt < 16; nt++) {
                int col = cq * 128 + nt * 8 + 2 * tig;
                *reinterpret_cast<float2 *>(x_o + lr[h] * DL + col) = make_float2(o[nt][2 * h], o[nt][2 * h + 1]);
            }
            if (cq == 0 && tig == 0) {
                x_ml[lr[h]] = m_run[h];
                x_ml[NROWS + lr[h]] = l_run[h];
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int gr = w.row0 + lr[h];
        if (kh == 1 || gr >= nrows) continue;   /* key half 0 writes */
        float m1 = x_ml[lr[h]], l1 = x_ml[NROWS + lr[h]];
        float m = fmaxf(m_run[h], m1);
        float a0 = m == -INFINITY ? 0.f : exp2f(m_run[h] - m);
        float a1 = m == -INFINITY ? 0.f : exp2f(m1 - m);
        float l = l_run[h] * a0 + l1 * a1;
        float inv = l > 0.f ? out_mul / l : 0.f;
        float lse2 = l > 0.f ? m + log2f(l) : -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 16; nt++) {   /* this half's output merged with key half 1's */
            float2 x1 = *reinterpret_cast<const float2 *>(x_o + lr[h] * DL + cq * 128 + nt * 8 + 2 * tig);
            o[nt][2 * h] = o[nt][2 * h] * a0 + x1.x * a1;
            o[nt][2 * h + 1] = o[nt][2 * h + 1] * a0 + x1.y * a1;
        }
        store_row<16>(a, w, q0, lr[h], h, o, inv, lse2, cq * 128, tig, cq == 0 && tig == 0);
    }
}

template <bool BF16, bool FP8, int STAGES>
__global__ void __launch_bounds__(THREADS, 1) attn_narrow_kernel(attn_args a)
{
    extern __shared__ uint4 smem_raw[];
    uint16_t *sq = reinterpret_cast<uint16_t *>(smem_raw);
    uint16_t *const sk_base = sq + NROWS * STRIDE;                                   /* STAGES key tiles */
    float *const s_part = reinterpret_cast<float *>(sk_base + STAGES * KEYS * STRIDE); /* [2][4][16][16] */
    float *const x_ml = s_part + 2 * 4 * NROWS * 16;                                 /* [2][16]: m, l */

    const work_item w = a.work[blockIdx.x];
    const int r = w.req, H = a.num_heads;
    const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
    const int nrows = ql * H;   /* <= NROWS (the launcher checks); w.row0 == 0 */
    load_q_tile<NROWS>(a, sq, q0, w.row0, nrows);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kh = warp >> 2, cq = warp & 3;
    const int tig = lane & 3;
    const int lr[2] = {lane >> 2, (lane >> 2) + 8};
    int lim[2];
    row_limits(a, w, sl, ql, nrows, lr, lim);

    float o[16][4];
#pragma unroll
    for (int nt = 0; nt < 16; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[nt][e] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    const float score_mul = a.scale_log2 * (FP8 ? a.kv_scale : 1.f);

    const int ntiles = w.key_end > w.key_begin ? (w.key_end - w.key_begin + KEYS - 1) / KEYS : 0;
    int2 next_blocks;
    ring_start<BF16, FP8, STAGES>(a, sk_base, r, w, ntiles, next_blocks);
    for (int t = 0; t < ntiles; t++) {
        const int k0 = w.key_begin + t * KEYS;
        const uint16_t *sk = ring_next<BF16, FP8, STAGES>(a, sk_base, r, w, t, ntiles, next_blocks);
        __syncthreads();

        /* partial S over dims cq*144 .. +144: 16 rows x 16 keys (two n-tiles of 8) */
        float s[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = 0.f;
        const uint16_t *qlane, *klane;
        qk_lane_rows(sq, sk, 0, kh * 16, lane, &qlane, &klane);
        qk_tile<BF16, 2>(s, qlane, klane, cq * 144, 9);
        narrow_store_partial(s_part, kh, cq, lr, tig, s);
        __syncthreads();
        narrow_softmax_pv<BF16>(a, s_part, sk, k0, kh, cq, lane, lr, lim, score_mul, m_run, l_run, o);
        __syncthreads();   /* the slot is refilled and s_part rewritten in the next tile */
    }
    cp_async_wait<0>();
    __syncthreads();   /* the key ring is free: it carries key half 1's output to half 0 */
    narrow_epilogue(a, w, q0, nrows, kh, cq, tig, lr, o, m_run, l_run, sk_base, x_ml, FP8 ? a.kv_scale : 1.f);
}

/* The narrow kernel on Hopper with a 16-bit cache: the same warp layout and arithmetic as
 * attn_narrow_kernel (the same partial-score order, so on the same plan its outputs equal
 * attn_narrow_kernel's bit for bit), with
 *   - ONE CTA barrier per key tile instead of three: the QK partials of tile t go into
 *     s_part[t & 1]; the barrier makes them visible, and every warp is past P V(t - 1), so the
 *     slot of tile t - 1 is refilled right after it;
 *   - key rows copied by the bulk copy engine (one 1152-byte cp.async.bulk per key row, issued
 *     by the 32 lanes of warp 0, completing on one mbarrier per ring slot that every thread
 *     waits on): no per-thread copies;
 *   - a ring of 2 slots at 2 CTAs per SM (128 registers), so one CTA's loads overlap the other's
 *     compute;
 *   - a persistent plan (ar_mla_build_plan_persistent): the CTA runs work[blockIdx.x] and then the
 *     chain of work[].next (always to a later index: anything else ends the chain, so a plan
 *     without chains cannot loop); gtile counts the key tiles of the CTA's earlier pieces, so
 *     ring slot and mbarrier phase run on across pieces.
 * Built for sm_90 only (a trap elsewhere: the decision function runs attn_narrow_kernel on
 * older devices and with an fp8 cache). */
constexpr int NB_STAGES = AR_MLA_NB_STAGES;
constexpr int SMEM_SPART2 = 2 * SMEM_SPART;   /* double-buffered partial scores */
constexpr int narrow_bulk_smem_total(void)
{
    return SMEM_QN + NB_STAGES * SMEM_K + SMEM_SPART2 + SMEM_XML + NB_STAGES * 8;   /* + one mbarrier per slot */
}

/* Called by warp 0: keys [k0, k0 + KEYS) (in the blocks tile_blocks gave) into the shared tile
 * sk [KEYS, STRIDE], one bulk copy of a 576-element key row per lane, all counted on bar.  A
 * key at or past key_end gets a copy of key k0 instead of zeros: its score is masked to -inf,
 * so it enters P V as 0 times a finite value. */
__device__ __forceinline__ void bulk_key_tile(const attn_args &a, uint16_t *sk, uint64_t *bar, int2 blocks, int k0,
                                              int key_end, int lane)
{
    static_assert(KEYS == 32, "bulk key tiles: one key row per lane");
    if (lane == 0) {
        fence_proxy_async();
        mbar_expect_tx(bar, KEYS * D * 2);
    }
    __syncwarp();
    const int j = k0 + lane < key_end ? k0 + lane : k0;
    const int64_t blk = j - k0 < 16 ? blocks.x : blocks.y;
    const int64_t slot = (blk << a.block_size_log2) + (j & (a.block_size - 1));
    bulk_copy(sk + lane * STRIDE, (const uint16_t *)a.cache + slot * D, D * 2, bar);
}

template <bool BF16>
__global__ void __launch_bounds__(THREADS, 2) attn_narrow_bulk_kernel(attn_args a)
{
#if MLA_SM90
    constexpr int STAGES = NB_STAGES;
    extern __shared__ uint4 smem_raw[];
    uint16_t *sq = reinterpret_cast<uint16_t *>(smem_raw);
    uint16_t *const sk_base = sq + NROWS * STRIDE;                                      /* STAGES key tiles */
    float *const s_part = reinterpret_cast<float *>(sk_base + STAGES * KEYS * STRIDE);  /* [2][2][4][16][16] */
    float *const x_ml = s_part + 2 * 2 * 4 * NROWS * 16;                                /* [2][16]: m, l */
    uint64_t *const bars = reinterpret_cast<uint64_t *>(x_ml + 2 * NROWS);              /* [STAGES] */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kh = warp >> 2, cq = warp & 3;
    const int tig = lane & 3;
    const int lr[2] = {lane >> 2, (lane >> 2) + 8};
    if (threadIdx.x == 0) {
        for (int st = 0; st < STAGES; st++) mbar_init(&bars[st], 1);
        mbar_init_fence();
    }
    const uint16_t *qlane, *klane;
    qk_lane_rows(sq, sk_base, 0, kh * 16, lane, &qlane, &klane);
    const int64_t klane_off = klane - sk_base;   /* the lane's key row / dim offset inside a slot */

    int gtile = 0;
    for (int wi = blockIdx.x; wi >= 0; wi = a.work[wi].next > wi ? a.work[wi].next : -1) {
        const work_item w = a.work[wi];
        const int r = w.req, H = a.num_heads;
        const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
        const int nrows = ql * H;   /* <= NROWS (the decision function checks); w.row0 == 0 */
        int lim[2];
        row_limits(a, w, sl, ql, nrows, lr, lim);

        load_q_tile<NROWS>(a, sq, q0, w.row0, nrows);   /* one commit group */
        const int ntiles = w.key_end > w.key_begin ? (w.key_end - w.key_begin + KEYS - 1) / KEYS : 0;
        int2 next_blocks = make_int2(0, 0);
        __syncthreads();   /* the mbarriers are initialised before warp 0 arms them */
        if (warp == 0)
            for (int st = 0; st < STAGES - 1 && st < ntiles; st++) {
                const int k0 = w.key_begin + st * KEYS, sl_st = (gtile + st) % STAGES;
                bulk_key_tile(a, sk_base + sl_st * KEYS * STRIDE, &bars[sl_st], tile_blocks(a, r, k0, w.key_end),
                              k0, w.key_end, lane);
            }
        if (STAGES - 1 < ntiles) next_blocks = tile_blocks(a, r, w.key_begin + (STAGES - 1) * KEYS, w.key_end);
        cp_async_wait<0>();   /* Q */
        __syncthreads();

        float o[16][4];
#pragma unroll
        for (int nt = 0; nt < 16; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[nt][e] = 0.f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
        const float score_mul = a.scale_log2;

        for (int t = 0; t < ntiles; t++) {
            const int k0 = w.key_begin + t * KEYS;
            const int slot = (gtile + t) % STAGES;
            const uint16_t *sk = sk_base + slot * KEYS * STRIDE;
            mbar_wait(&bars[slot], (uint32_t)((gtile + t) / STAGES) & 1u);
            float *const part = s_part + (t & 1) * (2 * 4 * NROWS * 16);
            {
                /* partial S over dims cq*144 .. +144: 16 rows x 16 keys (two n-tiles of 8) */
                float s[2][4];
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[nt][e] = 0.f;
                qk_tile<BF16, 2>(s, qlane, sk + klane_off, cq * 144, 9);
                narrow_store_partial(part, kh, cq, lr, tig, s);
            }
            __syncthreads();
            /* every warp is past PV(t-1): tile t + STAGES - 1 goes into the slot of tile t-1 */
            const int nxt = t + STAGES - 1;
            const int nxt_slot = (gtile + nxt) % STAGES;
            if (nxt < ntiles) {
                if (warp == 0)
                    bulk_key_tile(a, sk_base + nxt_slot * KEYS * STRIDE, &bars[nxt_slot], next_blocks,
                                  w.key_begin + nxt * KEYS, w.key_end, lane);
                if (nxt + 1 < ntiles) next_blocks = tile_blocks(a, r, w.key_begin + (nxt + 1) * KEYS, w.key_end);
            }
            narrow_softmax_pv<BF16>(a, part, sk, k0, kh, cq, lane, lr, lim, score_mul, m_run, l_run, o);
        }
        __syncthreads();   /* the key ring is free: it carries key half 1's output to half 0 */
        narrow_epilogue(a, w, q0, nrows, kh, cq, tig, lr, o, m_run, l_run, sk_base, x_ml, 1.f);
        gtile += ntiles;
        /* the next piece's Q and key copies overwrite what the epilogue read and wrote
         * (generic proxy; bulk copies are the async proxy) */
        fence_proxy_async();
        __syncthreads();
    }
#else
    (void)a;
    __trap();
#endif
}


} /* namespace ar_mla */

#endif
