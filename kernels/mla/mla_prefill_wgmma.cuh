/* mla_prefill_wgmma.cuh - the cuda-mla backend's Hopper (sm_90a) prefill attention (the
 * default for QK 192 / V 128 on compute capability 9.0; AR_MLA_PREFILL=wgmma): the pass prefill_attn_tc_kernel computes (mla_prefill.cuh; the same
 * tiles, masks, faults and outputs, DeepSeek's QK 192 / V 128 only), with the two products on
 * wgmma (warpgroup MMA) instead of mma.sync.  The mma.sync kernel's four warps each re-read every
 * K and V fragment from shared memory for their 16 rows; a wgmma reads its shared operands once
 * for the warpgroup's 64.  Included by cuda_mla.cu. */
#ifndef AR_MLA_PREFILL_WGMMA_CUH
#define AR_MLA_PREFILL_WGMMA_CUH

#include "../common/cuda_wgmma.cuh"
#include "mla_prefill.cuh"

namespace ar_mla {

/* Shared memory: the Q tile [64 rows][192 dims] and two stages of K [64 keys][192] and V
 * [64 keys][128], each tile stored as 64-dim column parts of [64 rows][128 bytes]
 * (ar_wg::wg_swizzle: 128-byte swizzle, parts 8 KiB apart, every part on a 1024-byte boundary). */
constexpr int PF_WG_PART = 64 * 128;                     /* one column part of a 64-row tile */
constexpr int PF_WG_Q = (PF_TC_QK / 64) * PF_WG_PART;    /* Q tile: 3 parts, 24 KiB */
constexpr int PF_WG_K = (PF_TC_QK / 64) * PF_WG_PART;    /* a stage's K: 3 parts */
constexpr int PF_WG_V = (PF_TC_V / 64) * PF_WG_PART;     /* a stage's V: 2 parts */
constexpr int PF_WG_STAGE = PF_WG_K + PF_WG_V;           /* 40 KiB */
constexpr int PF_WG_SMEM = 1024 /* alignment slack */ + PF_WG_Q + 2 * PF_WG_STAGE;   /* 105 KiB: 2 CTAs an SM */
static_assert(PF_TC_QK % 64 == 0 && PF_TC_V == 128 && PF_TC_KEYS == 64 && PF_TC_ROWS == 64,
              "wgmma prefill: one warpgroup of 64 rows, 64-key tiles, m64n128 P V");

/* Tensor-core prefill attention on wgmma.  One CTA = one warpgroup (128 threads) = one tile of at
 * most 64 prefill tokens of one request (pf_tiles) and one head (blockIdx.y), as
 * prefill_attn_tc_kernel: warp w holds rows 16 w .. 16 w + 15 of the tile in the wgmma
 * accumulator layout, which is the mma.sync one of that kernel, so the masks, the online softmax
 * (pf_softmax_tile), the rounding of P and the stores are its own.  The Q tile is staged once
 * by cp.async (rows past the tile's count zero-filled); key tiles of 64 workspace rows (up to
 * pf_key_end: the rows past the tile's last visible position are skipped) go through a two-stage
 * cp.async ring, the next tile loading while this one is computed.  Per key tile:
 *   S = Q K^T : wgmma m64n64k16, A = Q and B = K both from shared memory (K-major), 12 steps of
 *               16 dims (S: 32 floats a thread);
 *   mask and online softmax on the accumulator, P rounded to the dtype as register A fragments;
 *   O += P V  : wgmma m64n128k16, A = P from registers, B = V from shared memory read
 *               transposed (MN-major: the descriptor's leading byte offset steps between V's two
 *               64-dim parts, the stride byte offset between groups of 8 keys), 4 steps of 16
 *               keys (O: 64 floats a thread).
 * The products are waited for before the accumulators are touched; the planted fault
 * AR_FAULT_NO_RESCALE skips the rescale at every 64-key tile, as in the mma.sync kernel.
 *   pf_tiles [n_tiles][3]: first pf_tok index, token count (1..64), request
 *   q_nope [T, H, 128], a.q [T, H, 576] (q_pe at 512..575), ws_k [rows, H, 192],
 *   ws_v [rows, H, 128]; pass_o [T, H, 128] float, pass_lse [H, T] natural.
 * Dynamic shared memory: PF_WG_SMEM bytes (2 CTAs an SM); ptxas (CUDA 13.0): 131 registers, no
 * spills, no serialised wgmma.  The shared layouts and descriptors are those of the paged
 * prefill kernel at head size 256 (cuda_attn_wgmma.cuh: 64-key tiles, S shared by shared, P V
 * on 8 KiB V parts).
 * The kernel body exists only in the sm_90a build
 * (__CUDA_ARCH_FEAT_SM90_ALL); the backend launches it on compute capability 9.0 only. */
template <bool BF16>
__global__ void __launch_bounds__(128) prefill_attn_wgmma_kernel(
    const attn_args a, const int *pf_tok, const int *pf_tiles, const int *tok_pos, const uint16_t *q_nope,
    const uint16_t *ws_k, const uint16_t *ws_v, const int *row_pos, const int *kb, const int *ke, float *pass_o,
    float *pass_lse)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int QK = PF_TC_QK, KEYS = PF_TC_KEYS;
    extern __shared__ __align__(1024) unsigned char pf_wg_smem[];
    __shared__ int kpos[2][KEYS];
    const uint32_t base0 = (uint32_t)__cvta_generic_to_shared(pf_wg_smem);
    const uint32_t pad = (1024u - (base0 & 1023u)) & 1023u;
    unsigned char *const smem = pf_wg_smem + pad;         /* the Q tile, then stages 0 and 1 */
    const uint32_t sq_addr = base0 + pad;
    const int H = a.num_heads, n = blockIdx.y;
    const int first = pf_tiles[3 * blockIdx.x], count = pf_tiles[3 * blockIdx.x + 1], r = pf_tiles[3 * blockIdx.x + 2];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4, tig = lane % 4;
    const int wrow = warp * 16;
    const int extra = a.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0;
    int qpos[2];
    for (int h = 0; h < 2; h++) {
        const int i = wrow + grp + 8 * h;
        qpos[h] = i < count ? tok_pos[pf_tok[first + i]] + extra : -1;   /* -1: sees no key */
    }
    const int k_begin = kb[r];
    const int k_end = pf_key_end(row_pos, k_begin, ke[r], tok_pos[pf_tok[first + count - 1]] + extra);
    const int n_tiles = (k_end - k_begin + KEYS - 1) / KEYS;

    /* key tile it into stage it & 1 (one cp.async group) */
    auto load_tile = [&](int it) {
        const int k0 = k_begin + it * KEYS;
        unsigned char *const sk = smem + PF_WG_Q + (it & 1) * PF_WG_STAGE, *const sv = sk + PF_WG_K;
        pf_load_keys([=](int j, int c8) { return sk + ar_wg::wg_swizzle<PF_WG_PART>(j, c8 / 8); },
                     [=](int j, int c8) { return sv + ar_wg::wg_swizzle<PF_WG_PART>(j, c8 / 8); }, kpos[it & 1],
                     ws_k, ws_v, row_pos, k0, k_end - k0 < KEYS ? k_end - k0 : KEYS, H, n);
    };
    if (n_tiles > 0) {
        /* the Q tile: row i = [q_nope | q_pe] of token pf_tok[first + i], zeros past count; its
         * copies join the first key tile's group */
        for (int e = threadIdx.x; e < PF_TC_ROWS * (QK / 8); e += blockDim.x) {
            const int i = e / (QK / 8), c = e % (QK / 8);
            const bool in = i < count;
            cp_async16(smem + ar_wg::wg_swizzle<PF_WG_PART>(i, c),
                       in ? pf_q_chunk(a, q_nope, (int64_t)pf_tok[first + i] * H + n, c * 8) : q_nope, in);
        }
        load_tile(0);
    }

    float o[PF_TC_V / 8][4];
#pragma unroll
    for (int dt = 0; dt < PF_TC_V / 8; dt++)
        for (int j = 0; j < 4; j++) o[dt][j] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const uint64_t desc_q = ar_wg::desc_sw128(sq_addr, 16, 1024);
    for (int it = 0; it < n_tiles; it++) {
        if (it + 1 < n_tiles) {
            load_tile(it + 1);
            cp_async_wait<1>();   /* this tile's group (and Q's) is done; the next one may still fly */
        } else {
            cp_async_wait<0>();
        }
        ar_wg::fence_proxy_async();   /* this thread's cp.async writes -> wgmma's reads */
        __syncthreads();
        const uint32_t sk_addr = sq_addr + (uint32_t)(PF_WG_Q + (it & 1) * PF_WG_STAGE);
        const uint32_t sv_addr = sk_addr + (uint32_t)PF_WG_K;

        /* S = Q K^T; step kk: dims 16 kk .. 16 kk + 15, in column part kk / 4 at byte 32 (kk % 4)
         * of the (swizzled) row; s[nt][2h + j]: query row wrow + grp + 8h, key nt * 8 + 2 tig + j */
        float s[KEYS / 8][4];
        const uint64_t desc_k = ar_wg::desc_sw128(sk_addr, 16, 1024);
        ar_wg::fence();
#pragma unroll
        for (int kk = 0; kk < QK / 16; kk++) {
            const uint32_t off16 = (uint32_t)((kk >> 2) * PF_WG_PART + (kk & 3) * 32) >> 4;
            ar_wg::mma_ss_m64n64<BF16>(&s[0][0], ar_wg::desc_advance(desc_q, off16), ar_wg::desc_advance(desc_k, off16),
                                       kk > 0);
        }
        ar_wg::commit();
        ar_wg::wait<0>();
        ar_wg::fence_regs(s);
        pf_softmax_tile(a, s, kpos[it & 1], qpos, tig, m, l, o);

        /* O += P V; step kt: keys 16 kt .. 16 kt + 15, 16 rows of 128 bytes into V's parts */
        uint32_t pa[KEYS / 16][4];
#pragma unroll
        for (int kt = 0; kt < KEYS / 16; kt++) pf_p_frag<BF16>(s, kt, pa[kt]);
        const uint64_t desc_v = ar_wg::desc_sw128(sv_addr, PF_WG_PART, 1024);
        ar_wg::fence_regs(o);
        ar_wg::fence();
#pragma unroll
        for (int kt = 0; kt < KEYS / 16; kt++)
            ar_wg::mma_rs_m64n128<BF16, true>(&o[0][0], pa[kt], ar_wg::desc_advance(desc_v, (uint32_t)(kt * 16 * 128) >> 4), 1);
        ar_wg::commit();
        ar_wg::wait<0>();
        ar_wg::fence_regs(o);
        __syncthreads();   /* the stage is refilled by the next iteration's load */
    }
    pf_store_rows(a, pf_tok, first, count, n, wrow, grp, tig, m, l, o, pass_o, pass_lse);
#else
    (void)a;
    (void)pf_tok;
    (void)pf_tiles;
    (void)tok_pos;
    (void)q_nope;
    (void)ws_k;
    (void)ws_v;
    (void)row_pos;
    (void)kb;
    (void)ke;
    (void)pass_o;
    (void)pass_lse;
    __trap();   /* built without sm_90a: the backend never launches this kernel there */
#endif
}

} /* namespace ar_mla */

#endif
