/* cuda_attn_decode_tma.cuh - AR_CFG_DECODE_TMA: a decode kernel for batches of many
 * single-token requests (the cascade suffix pass of a decode batch, and flat decode batches that
 * fill the machine), compute capability 9.0 only.  Same outputs, masks and fused cascade merge
 * as attn_kernel's DECODE geometry (cuda_attn.cuh); it is planned only where it applies (see
 * decode_tma_plan in attn_plan.c): head size 128, block size 16, at most 8 KV heads, a
 * group of at most 16 query heads, one query token per request, no planted fault.  By default
 * one work item is a whole request; a split plan (AR_CUDA_DECODE_TMA_SPLITS, AR_CUDA_DECODE_TMA=split
 * in cuda_backend.cu, flat launches only) cuts a request's key blocks into pieces, and each piece
 * writes, per KV head h, its fp32 partial and LSE into slot w.partial + h x w.partial_stride for
 * combine_kernel, exactly as a DECODE split piece does (the fused cascade merge then happens in
 * the combine; the folded prefix combine never meets a split piece).
 *
 * Why a separate kernel: DECODE runs one CTA per (request, KV head) and gathers 256-byte rows
 * through the block table with cp.async.  Here one CTA takes a whole request: a producer warp
 * reads the block table once (32 block ids at a time) and copies each cache block - every KV
 * head, K and V, 64 KB at 8 heads - with two TMA copies as soon as a stage is free, so each SM
 * keeps up to 192 KB in flight.  On the H200, 128 decodes with GQA 32/8: the cascade suffix
 * pass (128 keys, 67 MB from DRAM) 30.7 us against 36.0 for DECODE; flat decodes of 1k, 8k and
 * 32k keys (the shared prefix mostly from L2) 82 / 480 / 1846 us against 156 / 761 / 2889.
 * Copying the block as 4 x Hkv boxes of one head and dim half each instead (the wgmma kernel's
 * maps; what runs where the driver refuses the 5-D view) gave the same suffix pass but 3003 us
 * at 32k: the number of copies, not the bytes, held the L2-fed stream.
 *
 * Cascade: with the merge fused (a.merge_out), each finished row is mixed with the prefix
 * pass's row (read at the start, under the first copies); when the prefix pass was split
 * (a.merge_groups), its split partials are combined here instead, in fp32, and the prefix
 * pass's combine kernel does not run (fold_prefix_combine in cuda_backend.cu).
 *
 * Geometry: 32 x (Hkv + 1) threads.  Warp h < Hkv is the consumer of KV head h: the group's
 * query heads are the rows of one m16n8k16 tile (rows g and g + 8 of lane (g, tq), rows past
 * the group zero), S = Q K^T and O += P V on mma.sync per cache block of 16 keys, the online
 * softmax of attn_kernel.  Warp Hkv is the producer.  Shared memory holds STAGES (up to 8;
 * three at 8 KV heads; fewer with AR_CUDA_DECODE_TMA_STAGES, the shared memory reserved stays
 * the same) stages of one cache block, K then V, each side made of [16 keys][128
 * bytes] pieces, one per (dim half, head):
 *   whole-block boxes (the default): [2 dim halves][Hkv][16][128 B], the box of a 5-D view
 *     [blocks][halves][heads][16 slots][64 dims] of the cache;
 *   per-head boxes: [Hkv][2 dim halves][16][128 B], box [16 slots][1 head][64 dims];
 * with the 128-byte swizzle (16-byte chunk c of key r at c ^ (r & 7)) either way, so the
 * ldmatrix rows of 8 keys hit 8 different bank groups.  Barriers: full[s] (the producer's
 * expected bytes; completes when the block landed), empty[s] (one arrival per consumer warp).
 * Keys past seq_len in the last block: their scores are masked, and the consumer zeroes those
 * V rows in its stage before P V (an unwritten cache slot holds NaN, and 0 x NaN is NaN).
 *
 * fp8 e4m3 cache (KV8, cuda_attn_{bf16,fp16}_kv8.cu): a head's key row is 128 bytes, so a stage
 * side is [Hkv][16 keys][128 B] (one 4-D box [blocks][heads][16 slots][128 B] per side, or Hkv
 * boxes [16][1][128 B] where the driver refuses that view), half the bytes of a 16-bit block, and
 * twice the stages fit.  The MMAs run in fp16 (every e4m3 value is exact in fp16: the hardware's
 * e4m3x2 -> f16x2 conversion widens the bytes in registers, never through shared memory): K as
 * ldmatrix rows of 16 bytes, lane (g, tq) holding dims 4 tq .. 4 tq + 3 of a 16-dim chunk, which
 * become k slots (2 tq, 2 tq + 1) and (2 tq + 8, 2 tq + 9), Q's A fragments loaded in the same
 * order; V as 32-bit loads of 4 dims from keys 2 tq, 2 tq + 1, 2 tq + 8, 2 tq + 9, byte-permuted
 * into the B fragments of 4 n-tiles whose column c is dim 32 j + 4 c + e (so a lane's output row
 * holds dims 32 j + 8 tq .. + 7, see pair_dim).  A bf16 Q row is scaled by a power of two 2^s
 * into fp16's range (its largest element to [2^14, 2^15)), exactly, and 2^-s joins that row's
 * score scale; P is packed in fp16.  K's kv_scale is in scale_log2, V's (a.v_scale) multiplies
 * each finished row, as in the mma.sync kernels. */
#ifndef AR_CUDA_ATTN_DECODE_TMA_CUH
#define AR_CUDA_ATTN_DECODE_TMA_CUH

#include <stdlib.h>
#include <string.h>

#include "cuda_attn_wgmma.cuh"

namespace ar_attn {

struct DecodeTmaGeom {
    static constexpr int HD = 128;
    static constexpr int BLOCK = 16;                    /* keys per cache block = per stage */
    static constexpr int MAX_KV_HEADS = 8;
    static constexpr int MAX_STAGES = 12;               /* fp8; 8 for a 16-bit cache */
    static constexpr int STAGE_BUDGET = 192 * 1024;     /* bytes of stages: 1 CTA per SM */
    static constexpr size_t SMEM = 1024 /* alignment slack */ + STAGE_BUDGET + 2 * MAX_STAGES * 8;
    /* one head's K (or V) of a block: 4 KB, 2 KB for an fp8 cache */
    __host__ __device__ static constexpr int head_bytes(bool kv8) { return BLOCK * HD * (kv8 ? 1 : 2); }
    /* stages for num_kv_heads heads: as many as the budget holds, at most 8 (16-bit cache) or
     * MAX_STAGES (fp8); 8 KV heads: 3, or 6 for fp8 */
    __host__ __device__ static int stages(int num_kv_heads, bool kv8)
    {
        const int n = STAGE_BUDGET / (2 * num_kv_heads * head_bytes(kv8)), most = kv8 ? MAX_STAGES : 8;
        return n > most ? most : n;
    }
};

/* Byte offset of (key r, 16-byte chunk c of the 128 dims) from a head's first [16][128 B]
 * piece, the head's second dim half half_stride bytes on. */
__device__ __forceinline__ uint32_t dt_swizzle(int r, int c, uint32_t half_stride)
{
    return (uint32_t)((c >> 3) * half_stride + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* Two e4m3 values (the low 16 bits of two: byte 0 the low one) -> f16x2, exactly. */
__device__ __forceinline__ uint32_t dt_fp8x2_to_f16x2(uint32_t two)
{
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

/* T: the model dtype (Q, the output); KV8: the cache holds fp8 e4m3 (the MMAs then run in fp16) */
template <typename T, bool KV8>
__global__ void __launch_bounds__(32 * (DecodeTmaGeom::MAX_KV_HEADS + 1), 1)
attn_decode_tma_kernel(const ar_attn_args a,
                       const __grid_constant__ CUtensorMap tmap_k,  /* K cache, see whole_box */
                       const __grid_constant__ CUtensorMap tmap_v,  /* the same for the V cache */
                       int whole_box,  /* 1: the maps view a cache as [blocks][2 halves][Hkv][16 slots][64
                                          dims] and one box is a whole block (stage layout
                                          [half][head][16][128 B]); 0: as [num_slots][Hkv][128]
                                          with boxes [16][1][64] (layout [head][half][16][128 B]).
                                          fp8: [blocks][Hkv][16 slots][128 B] with whole-block
                                          boxes, or [num_slots][Hkv][128 B] with boxes [16][1][128
                                          B]; the stage layout is [head][16][128 B] either way */
                       int num_stages) /* stages of the ring: 1 .. DecodeTmaGeom::stages(Hkv, KV8) */
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using G = DecodeTmaGeom;
    using M = typename std::conditional<KV8, __half, T>::type;   /* what the MMAs multiply */
    constexpr int HD = G::HD, BLOCK = G::BLOCK;
    extern __shared__ __align__(1024) unsigned char dt_smem_raw[];
    const uint32_t base0 = (uint32_t)__cvta_generic_to_shared(dt_smem_raw);
    const uint32_t pad = (1024 - (base0 & 1023)) & 1023;
    unsigned char *smem = dt_smem_raw + pad;
    const uint32_t stage_addr0 = base0 + pad;
    const int hkv = a.num_kv_heads, grp = a.group;
    const uint32_t side_bytes = (uint32_t)(hkv * G::head_bytes(KV8));   /* K (or V) of one block */
    /* head h's first piece at h x head_bytes; its second dim half (16-bit cache) half_stride on */
    const uint32_t head_bytes = KV8 || !whole_box ? (uint32_t)G::head_bytes(KV8) : BLOCK * 128;
    const uint32_t half_stride = KV8 ? 0u : whole_box ? (uint32_t)hkv * BLOCK * 128 : BLOCK * 128;
    const uint32_t stage_bytes = 2 * side_bytes;
    const uint32_t full_bar = stage_addr0 + G::STAGE_BUDGET, empty_bar = full_bar + G::MAX_STAGES * 8;
    if (threadIdx.x == 0)
        for (int s = 0; s < num_stages; s++) {
            ar_wg::mbar_init(full_bar + s * 8, 1);
            ar_wg::mbar_init(empty_bar + s * 8, hkv);
        }
    __syncthreads();

    const ar_attn_work w = a.work[blockIdx.x];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_blocks = w.tile_end - w.tile_begin;
    const int *bt = a.block_table + (int64_t)w.req * a.max_blocks_per_req;

    if (warp == hkv) {
        /* the producer: block ids 32 at a time (lane j holds block it0 + j), then per block one
         * lane per TMA box.  16-bit cache: lanes 0 .. 2 hkv - 1 copy K (head lane / 2, dim half
         * lane % 2), lanes 2 hkv .. 4 hkv - 1 the same of V; fp8: lanes 0 .. hkv - 1 K (head
         * lane), hkv .. 2 hkv - 1 V.  Whole-block boxes: lane 0 K, lane 1 V. */
        if (lane == 0) {
            ar_wg::tma_prefetch_map(&tmap_k);
            ar_wg::tma_prefetch_map(&tmap_v);
        }
        const int per_side = KV8 ? hkv : 2 * hkv;
        const int side = lane >= per_side ? 1 : 0, box = lane - side * per_side;
        const int head = KV8 ? box : box >> 1, half = KV8 ? 0 : box & 1;
        const uint32_t dst_off = whole_box ? (uint32_t)lane * side_bytes
                                           : (uint32_t)side * side_bytes + (uint32_t)head * head_bytes + (uint32_t)half * half_stride;
        int my_block = 0;
        for (int it = 0; it < n_blocks; it++) {
            if ((it & 31) == 0) {
                const int i = it + lane;
                my_block = i < n_blocks ? __ldg(bt + w.tile_begin + i) : 0;
            }
            const int block = __shfl_sync(0xffffffffu, my_block, it & 31);
            const int st = it % num_stages;
            if (it >= num_stages) ar_wg::mbar_wait_suspend(empty_bar + st * 8, (uint32_t)((it / num_stages - 1) & 1));
            if (lane == 0) ar_wg::mbar_arrive_expect_tx(full_bar + st * 8, stage_bytes);
            __syncwarp();
            const uint32_t dst = stage_addr0 + (uint32_t)st * stage_bytes + dst_off;
            const void *map = side || (whole_box && lane == 1) ? (const void *)&tmap_v : (const void *)&tmap_k;
            if (whole_box) {
                if (lane < 2) {
                    if constexpr (KV8) ar_wg::tma_load_4d(dst, map, full_bar + st * 8, 0, 0, 0, block);
                    else ar_wg::tma_load_5d(dst, map, full_bar + st * 8, 0, 0, 0, 0, block);
                }
            } else if (lane < 2 * per_side) {
                ar_wg::tma_load_3d(dst, map, full_bar + st * 8, half * 64, head, block * BLOCK);
            }
        }
        return;
    }

    /* consumer warp h = warp: rows r = g (+ 8) are query heads h * grp + r of the request's
     * one token */
    const int h = warp, g = lane >> 2, tq = lane & 3;
    const int qstart = a.query_start_loc[w.req];
    const int seq_len = a.seq_lens[w.req];
    const int window = a.sliding_window;
    const T *qg = reinterpret_cast<const T *>(a.q);
    bool row_ok[2];
    int hq[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        row_ok[r] = g + 8 * r < grp;
        hq[r] = h * grp + g + 8 * r;
    }
    /* Q as the A fragments of the 8 k-steps (registers 0/2: row g, 1/3: row g + 8), straight
     * from global memory.  16-bit cache: dims 2 tq (+ 8) of each 16; fp8: dims 4 tq, + 1 (0/1)
     * and 4 tq + 2, + 3 (2/3), in fp16, a bf16 row scaled by 2^s first.  scale_log2[r]: row r's
     * score scale (scale x log2 e x kv_scale, x 2^-s). */
    uint32_t qa[HD / 16][4];
    float scale_log2[2] = {a.scale_log2, a.scale_log2};
    if constexpr (!KV8) {
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const T *src = qg + ((int64_t)qstart * a.num_q_heads + hq[r]) * HD + kk * 16 + 2 * tq;
                qa[kk][r] = row_ok[r] ? *reinterpret_cast<const uint32_t *>(src) : 0u;
                qa[kk][r + 2] = row_ok[r] ? *reinterpret_cast<const uint32_t *>(src + 8) : 0u;
            }
    } else {
        float qf[2][HD / 16][4];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                const T *src = qg + ((int64_t)qstart * a.num_q_heads + hq[r]) * HD + kk * 16 + 4 * tq;
                const uint2 raw = row_ok[r] ? *reinterpret_cast<const uint2 *>(src) : make_uint2(0u, 0u);
                const T *v = reinterpret_cast<const T *>(&raw);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    qf[r][kk][e] = (float)v[e];
                    mx = fmaxf(mx, fabsf(qf[r][kk][e]));
                }
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            /* bf16: 2^s brings the row's largest |q| to [2^14, 2^15) (fp16 holds up to 65504);
             * fp16 is already in range.  A zero (or non-finite) row is left as it is. */
            int sh = 0;
            if (std::is_same<T, __nv_bfloat16>::value && mx > 0.f && mx <= 3.0e38f) {
                sh = 14 - (int)((__float_as_uint(mx) >> 23) & 0xff) + 127;
                sh = sh > 100 ? 100 : sh < -100 ? -100 : sh;
            }
            const float up = __uint_as_float((uint32_t)(127 + sh) << 23);
            scale_log2[r] = a.scale_log2 * __uint_as_float((uint32_t)(127 - sh) << 23);
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                qa[kk][r] = pack2<__half>(qf[r][kk][0] * up, qf[r][kk][1] * up);
                qa[kk][r + 2] = pack2<__half>(qf[r][kk][2] * up, qf[r][kk][3] * up);
            }
        }
    }
    /* the output dims of this lane's pair n (0 .. 15) of a row: 16-bit cache 8 n + 2 tq, + 1;
     * fp8 32 (n / 4) + 8 tq + 2 (n % 4), + 1 (pair_o below reads them from acc) */
    auto pair_dim = [&](int n) { return KV8 ? 32 * (n >> 2) + 8 * tq + 2 * (n & 3) : 8 * n + 2 * tq; };
    /* fused cascade merge: the prefix pass's pairs and LSEs of this lane's rows, read now,
     * under the first copies (row r, pair n); with the prefix combine folded in
     * (merge_groups), its split partials are read at the end instead */
    /* a split piece (w.partial >= 0) writes its fp32 partial and LSE; combine_kernel then
     * combines the pieces (and does the fused merge) */
    const bool split = w.partial >= 0;
    const bool fused = a.merge_out != nullptr && !split, fold = a.merge_groups != nullptr && !split;
    uint32_t pre_pair[2][HD / 8];
    float pre_lse[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        pre_lse[r] = -INFINITY;
        const bool rd = fused && !fold && row_ok[r];
        const T *p_out = reinterpret_cast<const T *>(a.merge_out);
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            pre_pair[r][n] = rd ? *reinterpret_cast<const uint32_t *>(p_out + out_index(a, qstart, hq[r], pair_dim(n)))
                                : 0u;
        if (rd) pre_lse[r] = a.merge_lse[merge_lse_index(a, qstart, hq[r])];
    }

    float acc[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    float row_m[2] = {-INFINITY, -INFINITY}, row_l[2] = {0.f, 0.f};
    /* ldmatrix row addresses.  16-bit cache: K (S = Q K^T, B = K rows): key (lane & 7) + 8 (lane
     * >> 4), chunk 2 kk + ((lane >> 3) & 1); V (O += P V, read transposed): key (lane & 7) + 8
     * ((lane >> 3) & 1), chunk 2 dp + (lane >> 4).  fp8 K: key (lane & 7) + 8 ((lane >> 3) & 1),
     * chunk 2 p + (lane >> 4) (matrices: keys 0-7 / 8-15 of chunk 2 p, then of 2 p + 1). */
    const int k_row = KV8 ? (lane & 7) + (((lane >> 3) & 1) << 3) : (lane & 7) + ((lane >> 4) << 3);
    const int k_chunk = KV8 ? lane >> 4 : (lane >> 3) & 1;
    const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_chunk = lane >> 4;

    for (int it = 0; it < n_blocks; it++) {
        const int st = it % num_stages;
        ar_wg::mbar_wait(full_bar + st * 8, (uint32_t)((it / num_stages) & 1));
        unsigned char *sk = smem + (size_t)st * stage_bytes + (size_t)h * head_bytes;
        unsigned char *sv = sk + side_bytes;
        const int key0 = (w.tile_begin + it) * BLOCK;

        float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        if constexpr (!KV8) {
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                uint32_t kb[4];
                ldmatrix_x4(kb, sk + dt_swizzle(k_row, 2 * kk + k_chunk, half_stride));
                mma16816<M>(s[0], qa[kk], kb[0], kb[1]);
                mma16816<M>(s[1], qa[kk], kb[2], kb[3]);
            }
        } else {
            /* the odd chunks' products in their own accumulators: two chains of four MMAs per
             * n-tile instead of one of eight (H200, B 64 x 8k: 299.5-301.4 us against 304.2-305.0;
             * widening by shifts and masks instead of the conversion instruction: 367-369 us) */
            float s_odd[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
            for (int p = 0; p < HD / 32; p++) {
                uint32_t kb[4];   /* keys g / g + 8 of chunk 2 p, then of chunk 2 p + 1: dims 4 tq .. + 3 */
                ldmatrix_x4(kb, sk + dt_swizzle(k_row, 2 * p + k_chunk, 0));
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    float (&sc)[2][4] = c ? s_odd : s;
                    mma16816<M>(sc[0], qa[2 * p + c], dt_fp8x2_to_f16x2(kb[2 * c]), dt_fp8x2_to_f16x2(kb[2 * c] >> 16));
                    mma16816<M>(sc[1], qa[2 * p + c], dt_fp8x2_to_f16x2(kb[2 * c + 1]),
                                dt_fp8x2_to_f16x2(kb[2 * c + 1] >> 16));
                }
            }
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] += s_odd[nt][e];
        }
        if (a.soft_cap > 0.f) {
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float scale = scale_log2[e >> 1] * 0.6931471805599453f;
                    s[nt][e] = a.soft_cap / scale * tanhf(s[nt][e] * (scale / a.soft_cap));
                }
        }
        /* the one query sits at seq_len - 1: every key < seq_len is visible, from seq_len -
         * window on with a sliding window */
        const int visible_from = window > 0 ? seq_len - window : 0;
        const bool partial = key0 + BLOCK > seq_len;
        if (partial || key0 < visible_from) {
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = key0 + nt * 8 + 2 * tq + (e & 1);
                    if (j >= seq_len || j < visible_from) s[nt][e] = -INFINITY;
                }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(row_m[r], mx);
            const float m_scaled = m_new == -INFINITY ? 0.f : m_new * scale_log2[r];
            const float alpha = exp2f(row_m[r] * scale_log2[r] - m_scaled);
            row_m[r] = m_new;
            float rs = 0.f;
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const float p0 = exp2f(fmaf(s[nt][2 * r], scale_log2[r], -m_scaled));
                const float p1 = exp2f(fmaf(s[nt][2 * r + 1], scale_log2[r], -m_scaled));
                s[nt][2 * r] = p0;
                s[nt][2 * r + 1] = p1;
                rs += p0 + p1;
            }
            row_l[r] = row_l[r] * alpha + rs;
            if (__any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
                for (int n = 0; n < HD / 8; n++) {
                    acc[n][2 * r] *= alpha;
                    acc[n][2 * r + 1] *= alpha;
                }
            }
        }
        if (partial) {
            /* zero this head's V rows past seq_len (both dim halves): 16-byte stores, then make
             * them visible to the lanes' loads and order them before the next TMA write */
            const int valid = seq_len - key0;
            constexpr int ROW_CHUNKS = KV8 ? 8 : 16;   /* 16-byte chunks of a key's row of this head */
            for (int i = lane; i < BLOCK * ROW_CHUNKS; i += 32) {
                const int r = i / ROW_CHUNKS, c = i % ROW_CHUNKS;
                if (r >= valid)
                    *reinterpret_cast<uint4 *>(sv + dt_swizzle(r, c, half_stride)) = make_uint4(0u, 0u, 0u, 0u);
            }
            __syncwarp();
            ar_wg::fence_proxy_async();
        }
        uint32_t pa[4];
        pa[0] = pack2<M>(s[0][0], s[0][1]);
        pa[1] = pack2<M>(s[0][2], s[0][3]);
        pa[2] = pack2<M>(s[1][0], s[1][1]);
        pa[3] = pack2<M>(s[1][2], s[1][3]);
        if constexpr (!KV8) {
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t vb[4];
                ldmatrix_x4_trans(vb, sv + dt_swizzle(v_row, 2 * dp + v_chunk, half_stride));
                mma16816<M>(acc[2 * dp], pa, vb[0], vb[1]);
                mma16816<M>(acc[2 * dp + 1], pa, vb[2], vb[3]);
            }
        } else {
            /* per 32 dims j: dims 32 j + 4 g .. + 3 of keys 2 tq, 2 tq + 1, 2 tq + 8, 2 tq + 9; byte
             * e of each pair of keys is the B fragment of n-tile 4 j + e at column g */
#pragma unroll
            for (int j = 0; j < HD / 32; j++) {
                const uint32_t col = (uint32_t)(4 * (g & 3));
                const int chunk = 2 * j + (g >> 2);
                const uint32_t v0 = *reinterpret_cast<const uint32_t *>(sv + dt_swizzle(2 * tq, chunk, 0) + col);
                const uint32_t v1 = *reinterpret_cast<const uint32_t *>(sv + dt_swizzle(2 * tq + 1, chunk, 0) + col);
                const uint32_t v2 = *reinterpret_cast<const uint32_t *>(sv + dt_swizzle(2 * tq + 8, chunk, 0) + col);
                const uint32_t v3 = *reinterpret_cast<const uint32_t *>(sv + dt_swizzle(2 * tq + 9, chunk, 0) + col);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const uint32_t sel = (uint32_t)(e | ((4 + e) << 4));
                    mma16816<M>(acc[4 * j + e], pa, dt_fp8x2_to_f16x2(__byte_perm(v0, v1, sel)),
                                dt_fp8x2_to_f16x2(__byte_perm(v2, v3, sel)));
                }
            }
        }
        __syncwarp();
        if (lane == 0) ar_wg::mbar_arrive(empty_bar + st * 8);
    }

    /* this lane's pair n of row r (dims pair_dim(n), + 1): 16-bit cache acc[n]; fp8 acc[4 j + e]
     * holds dims 32 j + 8 tq + e and + 4 + e (all indices compile-time once unrolled) */
    auto pair_o = [&](int n, int r, float &o0, float &o1) {
        if constexpr (!KV8) {
            o0 = acc[n][2 * r];
            o1 = acc[n][2 * r + 1];
        } else {
            const int j = n >> 2, k0 = 2 * (n & 3), k1 = k0 + 1;
            o0 = k0 < 4 ? acc[4 * j + k0][2 * r] : acc[4 * j + k0 - 4][2 * r + 1];
            o1 = k1 < 4 ? acc[4 * j + k1][2 * r] : acc[4 * j + k1 - 4][2 * r + 1];
        }
    };
    /* the epilogue of attn_kernel's single-warp rows: row sums across the quad, out = acc / l
     * (x V's kv_scale for fp8), LSE (log2) = m + log2 l; mixed with the prefix pass's row when
     * the merge is fused */
    const ar_attn_work w_out = {w.req, h, 0, 0, 0, split ? w.partial + h * w.partial_stride : -1, 0};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = row_l[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (!row_ok[r]) continue;
        const float m2 = row_m[r] == -INFINITY ? -INFINITY : row_m[r] * scale_log2[r];
        const float inv = (l > 0.f ? 1.f / l : 0.f) * (KV8 ? a.v_scale : 1.f);
        const float lse2 = l > 0.f ? m2 + __log2f(l) : -INFINITY;
        float merged_lse = lse2;
        if (fold) {
            /* the prefix side of this row from its split partials, as combine_kernel computes
             * it (kept in fp32), then vLLM's merge with this row */
            const int pair = qstart * grp + g + 8 * r, rows = a.merge_rows;
            const ar_combine_group cg = a.merge_groups[h * a.merge_row_blocks + pair / rows];
            const int64_t row0 = (int64_t)cg.first_partial * rows + pair % rows;
            const float pm = partials_max_lse(a.merge_partial_lse + row0, rows, cg.count);
            const float pm_use = pm == -INFINITY ? 0.f : pm;
            float po[HD / 8][2], wsum = 0.f;
#pragma unroll
            for (int n = 0; n < HD / 8; n++) po[n][0] = po[n][1] = 0.f;
#pragma unroll 2
            for (int k = 0; k < cg.count; k++) {
                const int64_t pr = row0 + (int64_t)k * rows;
                const float wk = exp2f(a.merge_partial_lse[pr] - pm_use);
                const float *src = a.merge_partial_o + pr * HD;
#pragma unroll
                for (int n = 0; n < HD / 8; n++) {
                    const float2 v = *reinterpret_cast<const float2 *>(src + pair_dim(n));
                    po[n][0] += v.x * wk;
                    po[n][1] += v.y * wk;
                }
                wsum += wk;
            }
            float pinv;
            const float p_lse2 = partials_lse(pm, wsum, &pinv);
            const float p_lse = p_lse2 == -INFINITY ? -INFINITY : p_lse2 * 0.6931471805599453f;
            const float s_lse = lse2 == -INFINITY ? -INFINITY : lse2 * 0.6931471805599453f;
#pragma unroll
            for (int n = 0; n < HD / 8; n++) {
                float o0, o1;
                pair_o(n, r, o0, o1);
                o0 *= inv;
                o1 *= inv;
                merged_lse = merge_pair(p_lse, s_lse, false, po[n][0] * pinv, po[n][1] * pinv, o0, o1, &o0, &o1);
                *reinterpret_cast<uint32_t *>((T *)a.out + out_index(a, qstart, hq[r], pair_dim(n))) = pack2<T>(o0, o1);
            }
            if (a.merge_lse_base2) merged_lse *= 1.4426950408889634f;
            if (tq == 0) a.lse[merge_lse_index(a, qstart, hq[r])] = merged_lse;
            continue;
        }
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            float o0, o1;
            pair_o(n, r, o0, o1);
            o0 *= inv;
            o1 *= inv;
            if (fused) {
                merged_lse = fused_merge_with<T>(a, pre_pair[r][n], pre_lse[r], lse2, o0, o1);
                *reinterpret_cast<uint32_t *>((T *)a.out + out_index(a, qstart, hq[r], pair_dim(n))) = pack2<T>(o0, o1);
            } else {
                store_pair<T>(a, w_out, 16, HD, g + 8 * r, qstart, hq[r], pair_dim(n), o0, o1, lse2);
            }
        }
        if (tq == 0) {
            if (fused) a.lse[merge_lse_index(a, qstart, hq[r])] = merged_lse;
            else store_lse<T>(a, w_out, 16, g + 8 * r, qstart, hq[r], lse2);
        }
    }
#else
    __trap();   /* built without sm_90a: the host never launches this config there */
#endif
}

template <typename T, bool KV8>
static cudaError_t launch_decode_tma(const ar_attn_args *a, int num_work, cudaStream_t stream)
{
    if (num_work <= 0) return cudaSuccess;
    /* a->decode_tma_stages, or the most that fit when 0 or more */
    const int most = DecodeTmaGeom::stages(a->num_kv_heads, KV8);
    const int num_stages = a->decode_tma_stages > 0 && a->decode_tma_stages < most ? a->decode_tma_stages : most;
    if (a->head_size != DecodeTmaGeom::HD || a->num_kv_heads > DecodeTmaGeom::MAX_KV_HEADS ||
        a->block_size_log2 != 4 || a->group > 16)
        return cudaErrorInvalidValue;
    /* whole-block boxes (a 5-D view of each 16-bit cache, a 4-D one of an fp8 cache: two copies a
     * block), or, where the driver refuses that view, per-head boxes (16-bit: the wgmma kernel's
     * maps, box [16][1][64]: 4 x Hkv copies a block; fp8: box [16][1][128 B], 2 x Hkv) */
    CUtensorMap mk, mv;
    int whole = 0;
    {
        const uint64_t hkv = (uint64_t)a->num_kv_heads;
        char err[256];
        if (KV8) {
            /* 16-bit elements of a byte cache: [blocks][heads][16 slots][64 pairs] */
            const uint64_t dims[4] = {64, 16, hkv, (uint64_t)a->num_slots / 16};
            const uint64_t strides[3] = {hkv * 128, 128, 16 * hkv * 128};
            const uint32_t box[4] = {64, 16, (uint32_t)hkv, 1};
            whole = !ar_tma_encode(&mk, a->k_cache, 4, dims, strides, box, "cuda", err, sizeof err) &&
                    !ar_tma_encode(&mv, a->v_cache, 4, dims, strides, box, "cuda", err, sizeof err);
        } else {
            const uint64_t dims[5] = {64, 16, hkv, 2, (uint64_t)a->num_slots / 16};
            const uint64_t strides[4] = {hkv * 256, 256, 128, 16 * hkv * 256};
            const uint32_t box[5] = {64, 16, (uint32_t)hkv, 2, 1};
            whole = !ar_tma_encode(&mk, a->k_cache, 5, dims, strides, box, "cuda", err, sizeof err) &&
                    !ar_tma_encode(&mv, a->v_cache, 5, dims, strides, box, "cuda", err, sizeof err);
        }
    }
    if (!whole && KV8) {
        const uint64_t hkv = (uint64_t)a->num_kv_heads;
        const uint64_t dims[3] = {64, hkv, (uint64_t)a->num_slots}, strides[2] = {128, hkv * 128};
        const uint32_t box[3] = {64, 1, 16};
        char err[256];
        if (ar_tma_encode(&mk, a->k_cache, 3, dims, strides, box, "cuda", err, sizeof err) ||
            ar_tma_encode(&mv, a->v_cache, 3, dims, strides, box, "cuda", err, sizeof err))
            return cudaErrorNotSupported;
    } else if (!whole) {
        cudaError_t e = wgmma_tensor_maps(a, &mk, &mv);
        if (e != cudaSuccess) return e;
    }
    attn_decode_tma_kernel<T, KV8><<<num_work, 32 * (a->num_kv_heads + 1), DecodeTmaGeom::SMEM, stream>>>(
        *a, mk, mv, whole, num_stages);
    return cudaGetLastError();
}

template <typename T, bool KV8>
static cudaError_t attributes_decode_tma(int *ctas_per_sm)
{
    const int smem = (int)DecodeTmaGeom::SMEM;
    cudaError_t e = cudaFuncSetAttribute(attn_decode_tma_kernel<T, KV8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, attn_decode_tma_kernel<T, KV8>,
                                                         32 * (DecodeTmaGeom::MAX_KV_HEADS + 1), smem);
}

} /* namespace ar_attn */

#endif
