/* mla_prefill_pingpong.cuh - the cuda-mla backend's Hopper (sm_90a) prefill attention in
 * FlashAttention-3's form (AR_MLA_PREFILL=pingpong, the default on compute capability 9.0): the
 * pass prefill_attn_tc_kernel computes (mla_prefill.cuh: DeepSeek's QK 192 / V 128, the same
 * 64-row query tiles, 64-key tiles, masks, faults, softmax and stores), with the products on wgmma
 * (warpgroup MMA; S on m64n64k16 with Q from registers and K from shared memory, P V on
 * m64n128k16 with P from registers) and with three changes to how the work is fed (against the
 * one-warpgroup wgmma kernel that was the default before it, in git at 02d823d):
 *   - one CTA holds two query tiles of one request (a pair, ar_mla_pair_prefill_tiles), each on
 *     its own consumer warpgroup, so every key tile is loaded once for 128 query rows;
 *   - a producer warpgroup fills a ring of four K/V stages by TMA (one box a 64-dim column part
 *     of the key workspace, landing in the 128-byte swizzle wgmma reads), handed over by
 *     mbarriers, instead of every thread's cp.async;
 *   - the two consumers take ping-pong turns on the tensor cores, and a turn issues this tile's
 *     S and the previous tile's P V together, so one warpgroup's softmax runs while the other's
 *     products do (FlashAttention-3's order, as the paged kernel at head size 128,
 *     kernels/paged/cuda_attn_wgmma.cuh); S goes first and the softmax starts once it is done,
 *     beside the same warpgroup's P V.
 * A full key tile that every row of a warpgroup sees skips the mask.  The 128-key tile (two 80 KiB
 * stages) lost to the 64-key one (kernels/lab/README.md).  Included by cuda_mla.cu. */
#ifndef AR_MLA_PREFILL_PINGPONG_CUH
#define AR_MLA_PREFILL_PINGPONG_CUH

#include "../common/cuda_wgmma.cuh"
#include "mla_prefill.cuh"

namespace ar_mla {

/* The tiles as wgmma reads them: each stored as 64-dim column parts of [64 rows][128 bytes]
 * (ar_wg::wg_swizzle: 128-byte swizzle, parts 8 KiB apart, every part on a 1024-byte boundary),
 * the layout the TMA boxes land in. */
constexpr int PF_WG_PART = 64 * 128;                     /* one column part of a 64-row tile */
constexpr int PF_WG_Q = (PF_TC_QK / 64) * PF_WG_PART;    /* a Q tile: 3 parts, 24 KiB */
constexpr int PF_WG_K = (PF_TC_QK / 64) * PF_WG_PART;    /* a stage's K: 3 parts */
constexpr int PF_WG_V = (PF_TC_V / 64) * PF_WG_PART;     /* a stage's V: 2 parts */
constexpr int PF_WG_STAGE = PF_WG_K + PF_WG_V;           /* 40 KiB */
static_assert(PF_TC_QK % 64 == 0 && PF_TC_V == 128 && PF_TC_KEYS == 64 && PF_TC_ROWS == 64,
              "pingpong prefill: warpgroups of 64 rows, 64-key tiles, m64n128 P V");

/* Shared memory: two Q tiles (one a consumer warpgroup, each [64 rows][192 dims] as 3 column
 * parts, PF_WG_Q bytes) and PP_STAGES stages of K [64 keys][192] and V [64 keys][128] (PF_WG_STAGE
 * bytes each, K's 3 parts then V's 2), every part 1024-byte aligned. */
constexpr int PP_STAGES = 4;
constexpr int PP_THREADS = 384;                          /* producer + 2 consumer warpgroups */
constexpr int PP_Q = 2 * PF_WG_Q;                        /* 48 KiB */
constexpr int PP_SMEM = 1024 /* alignment slack */ + PP_Q + PP_STAGES * PF_WG_STAGE;   /* 209 KiB */

/* Ping-pong turns on named barriers 1 (warpgroup 0's turn) and 2 (warpgroup 1's), 256 threads
 * each: the waiting warpgroup's 128 (bar.sync) and the signalling one's 128 (bar.arrive).  Every
 * warpgroup takes n_tiles + 1 turns a CTA (one a key tile, active or not, and one for the last
 * P V), waiting once and handing over once a turn; warpgroup 1 signals once before its first
 * turn and skips its last hand-over, so arrivals and waits pair up on both barriers. */
__device__ __forceinline__ void pp_signal(int to_wg) { asm volatile("bar.arrive %0, 256;\n" :: "r"(1 + to_wg) : "memory"); }
__device__ __forceinline__ void pp_wait(int wg) { asm volatile("bar.sync %0, 256;\n" :: "r"(1 + wg) : "memory"); }
__device__ __forceinline__ void pp_handed(int wg, bool last)
{
    if (wg == 0 || !last) pp_signal(1 - wg);
}

/* Two-warpgroup prefill attention.  Per key tile and consumer warpgroup:
 *   S = Q K^T : wgmma m64n64k16, A = Q from registers (the warp's 16 rows as 12 A fragments, 48
 *               registers, read once from the staged tile), B = K from shared memory (K-major),
 *               12 steps of 16 dims (S: 32 floats a thread);
 *   mask and online softmax on the accumulator (pf_softmax_scores, while the previous tile's
 *   P V still runs), then the output's rescale (pf_rescale_o) and P rounded to the dtype as
 *   register A fragments;
 *   O += P V  : wgmma m64n128k16, A = P from registers, B = V from shared memory read
 *               transposed (MN-major: the descriptor's leading byte offset steps between V's two
 *               64-dim parts, the stride byte offset between groups of 8 keys), 4 steps of 16
 *               keys (O: 64 floats a thread).
 * Warp w of a warpgroup holds rows 16 w .. 16 w + 15 of its tile in the wgmma accumulator layout,
 * which is the mma.sync one of prefill_attn_tc_kernel, so the masks, the online softmax
 * (pf_softmax_scores and pf_rescale_o), the rounding of P and the stores (pf_store_rows) are that
 * kernel's.
 * CTA (blockIdx.x, blockIdx.y) = pair blockIdx.x of query tiles and head blockIdx.y; consumer
 * warpgroup w takes tile pf_pairs[2 x + w] (-1: none).  The
 * key rows are the request's k_begin .. k_end - 1 of this pass's workspace, k_end the end the
 * pair's later tile sees (pf_key_end); a warpgroup's active key tiles are those up to its own
 * tile's end, the rest are turns without products.  A request's workspace rows hold consecutive
 * positions (mla_prepare writes them so; pf_key_end relies on it too), so key j of the tile
 * starting at row k0 has position row_pos[k_begin] + k0 - k_begin + j; keys past the
 * warpgroup's own end are masked (they may be the next request's rows).
 *   tmap_k: ws_k [rows][H][192] 16-bit, box [64 rows][1 head][64 dims]; tmap_v: ws_v
 *   [rows][H][128], the same box;
 *   pf_tiles [n_tiles][3]: first pf_tok index, token count (1..64), request; pf_pairs
 *   [n_pairs][2]: tile indices (the second -1 or a later tile of the same request);
 *   q_nope [T, H, 128], a.q [T, H, 576] (q_pe at 512..575); pass_o [T, H, 128] float, pass_lse
 *   [H, T] natural; final_out != 0 (a step of one pass: no context chunks): pass_o / pass_lse
 *   are the step's out / lse, written as prefill_finish_kernel would (pf_store_rows).
 * Barriers: full[s] (one arrival, the producer's, with the stage's byte count; the TMA copies
 * complete it), empty[s] (256 arrivals: every consumer thread once it is done with the stage, or
 * at its turn where the tile is not active for it).  Each consumer stages its own Q tile by
 * cp.async (rows past its count zero-filled), syncs its warpgroup on named barrier 3 + w and
 * reads its fragments into registers.
 * setmaxnreg gives the producer 40 registers and the consumers 232.
 * The kernel body exists only in the sm_90a build (__CUDA_ARCH_FEAT_SM90_ALL); the backend
 * launches it on compute capability 9.0 only. */
template <bool BF16>
__global__ void __launch_bounds__(PP_THREADS, 1) prefill_attn_pingpong_kernel(
    const attn_args a, const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v,
    const int *pf_tok, const int *pf_tiles, const int *pf_pairs, const int *tok_pos, const uint16_t *q_nope,
    const int *row_pos, const int *kb, const int *ke, float *pass_o, float *pass_lse, int final_out)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int QK = PF_TC_QK, KEYS = PF_TC_KEYS;
    extern __shared__ __align__(1024) unsigned char pp_smem[];
    __shared__ __align__(8) uint64_t pp_bars[2 * PP_STAGES];
    const uint32_t base0 = (uint32_t)__cvta_generic_to_shared(pp_smem);
    const uint32_t pad = (1024u - (base0 & 1023u)) & 1023u;
    unsigned char *const smem = pp_smem + pad;
    const uint32_t sq_addr = base0 + pad;                  /* Q tiles, then the stages */
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(pp_bars);
    auto full_bar = [&](int st) { return bar0 + (uint32_t)(st * 8); };
    auto empty_bar = [&](int st) { return bar0 + (uint32_t)((PP_STAGES + st) * 8); };
    auto stage_k = [&](int it) { return sq_addr + (uint32_t)(PP_Q + (it % PP_STAGES) * PF_WG_STAGE); };

    const int H = a.num_heads, n = blockIdx.y;
    const int tile0 = pf_pairs[2 * blockIdx.x], tile1 = pf_pairs[2 * blockIdx.x + 1];
    const int r = pf_tiles[3 * tile0 + 2];
    const int extra = a.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0;
    const int k_begin = kb[r];
    const int last_tile = tile1 >= 0 ? tile1 : tile0;
    const int k_end = pf_key_end(row_pos, k_begin, ke[r],
                                 tok_pos[pf_tok[pf_tiles[3 * last_tile] + pf_tiles[3 * last_tile + 1] - 1]] + extra);
    const int n_tiles = (k_end - k_begin + KEYS - 1) / KEYS;

    if (threadIdx.x == 0) {
        for (int st = 0; st < PP_STAGES; st++) {
            ar_wg::mbar_init(full_bar(st), 1);
            ar_wg::mbar_init(empty_bar(st), 256);
        }
    }
    __syncthreads();

    if (threadIdx.x < 128) {
        /* the producer: thread 0 fills stage it % PP_STAGES with key tile it once both consumers
         * released the tile PP_STAGES before it */
        ar_wg::setmaxnreg_dec<40>();
        if (threadIdx.x == 0 && n_tiles > 0) {
            ar_wg::tma_prefetch_map(&tmap_k);
            ar_wg::tma_prefetch_map(&tmap_v);
            for (int it = 0; it < n_tiles; it++) {
                const int st = it % PP_STAGES;
                if (it >= PP_STAGES) ar_wg::mbar_wait_suspend(empty_bar(st), (uint32_t)((it / PP_STAGES - 1) & 1));
                ar_wg::mbar_arrive_expect_tx(full_bar(st), PF_WG_STAGE);
                const uint32_t sk = stage_k(it), k0 = (uint32_t)(k_begin + it * KEYS);
#pragma unroll
                for (int part = 0; part < QK / 64; part++)
                    ar_wg::tma_load_3d(sk + (uint32_t)(part * PF_WG_PART), &tmap_k, full_bar(st), part * 64, n, (int)k0);
#pragma unroll
                for (int part = 0; part < PF_TC_V / 64; part++)
                    ar_wg::tma_load_3d(sk + (uint32_t)(PF_WG_K + part * PF_WG_PART), &tmap_v, full_bar(st), part * 64, n,
                                       (int)k0);
            }
        }
        return;
    }

    ar_wg::setmaxnreg_inc<232>();
    const int ctid = (int)threadIdx.x - 128;
    const int wg = ctid / 128, t128 = ctid % 128;
    const int warp = t128 / 32, lane = t128 % 32, grp = lane / 4, tig = lane % 4;
    const int wrow = warp * 16;
    const int tile = wg == 0 ? tile0 : tile1;
    const int first = tile >= 0 ? pf_tiles[3 * tile] : 0, count = tile >= 0 ? pf_tiles[3 * tile + 1] : 0;
    int qpos[2];
    for (int h = 0; h < 2; h++) {
        const int i = wrow + grp + 8 * h;
        qpos[h] = i < count ? tok_pos[pf_tok[first + i]] + extra : -1;   /* -1: sees no key */
    }
    /* this warpgroup's own key end and active tiles [0, n_active) */
    const int wg_k_end =
        count > 0 ? pf_key_end(row_pos, k_begin, ke[r], tok_pos[pf_tok[first + count - 1]] + extra) : k_begin;
    /* never past the CTA's tiles (the pair's later tile sees at least as many keys; a plan that
     * broke that would leave a warpgroup waiting for tiles never loaded) */
    const int n_active = min((wg_k_end - k_begin + KEYS - 1) / KEYS, n_tiles);
    const int wg_keys = wg_k_end - k_begin;                /* keys this warpgroup may see */
    const int wg_min_qpos = count > 0 ? tok_pos[pf_tok[first]] + extra : -1;
    const int pos0 = n_active > 0 ? row_pos[k_begin] : 0;

    if (n_active > 0) {
        /* this warpgroup's Q tile: row i = [q_nope | q_pe] of token pf_tok[first + i], zeros past count */
        unsigned char *const sq = smem + wg * PF_WG_Q;
        for (int e = t128; e < PF_TC_ROWS * (QK / 8); e += 128) {
            const int i = e / (QK / 8), c = e % (QK / 8);
            const bool in = i < count;
            cp_async16(sq + ar_wg::wg_swizzle<PF_WG_PART>(i, c),
                       in ? pf_q_chunk(a, q_nope, (int64_t)pf_tok[first + i] * H + n, c * 8) : q_nope, in);
        }
        cp_async_commit();
        cp_async_wait<0>();
        ar_wg::fence_proxy_async();   /* this thread's cp.async writes -> wgmma's reads */
        asm volatile("bar.sync %0, 128;\n" :: "r"(3 + wg) : "memory");
    }

    float o[PF_TC_V / 8][4];
#pragma unroll
    for (int dt = 0; dt < PF_TC_V / 8; dt++)
        for (int j = 0; j < 4; j++) o[dt][j] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    /* the warp's 16 rows of Q as the A fragments of S's 12 steps (48 registers), read once from
     * the staged tile (staged above where n_active > 0; unused elsewhere) */
    uint32_t qa[QK / 16][4];
    {
        const unsigned char *const sq = smem + wg * PF_WG_Q;
#pragma unroll
        for (int kk = 0; kk < QK / 16; kk++)
#pragma unroll
            for (int j = 0; j < 4; j++)   /* rows grp / grp + 8, dims 16 kk + 2 tig (+ 8) */
                qa[kk][j] = *reinterpret_cast<const uint32_t *>(
                    sq + ar_wg::wg_swizzle<PF_WG_PART>(wrow + grp + 8 * (j & 1), 2 * kk + (j >> 1)) + 4 * tig);
    }

    /* S = Q K^T of key tile it into s (issued, not waited for); s[nt][2h + j]: query row wrow + grp
     * + 8h, key nt * 8 + 2 tig + j */
    auto issue_s = [&](float (&s)[KEYS / 8][4], int it) {
        const uint64_t desc_k = ar_wg::desc_sw128(stage_k(it), 16, 1024);
        ar_wg::fence();
#pragma unroll
        for (int kk = 0; kk < QK / 16; kk++) {
            const uint32_t off16 = (uint32_t)((kk >> 2) * PF_WG_PART + (kk & 3) * 32) >> 4;
            ar_wg::mma_rs_m64n64<BF16>(&s[0][0], qa[kk], ar_wg::desc_advance(desc_k, off16), kk > 0);
        }
    };
    /* O += P V of key tile it (issued, not waited for) */
    auto issue_pv = [&](const uint32_t (&pa)[KEYS / 16][4], int it) {
        const uint64_t desc_v = ar_wg::desc_sw128(stage_k(it) + (uint32_t)PF_WG_K, PF_WG_PART, 1024);
        ar_wg::fence_regs(o);
        ar_wg::fence();
#pragma unroll
        for (int kt = 0; kt < KEYS / 16; kt++)
            ar_wg::mma_rs_m64n128<BF16, true>(&o[0][0], pa[kt], ar_wg::desc_advance(desc_v, (uint32_t)(kt * 16 * 128) >> 4), 1);
    };
    /* mask (where some key of the tile is hidden from some row of the warpgroup) and online
     * softmax of tile it, the output's factors into alpha (o untouched) */
    auto softmax_scores = [&](float (&s)[KEYS / 8][4], int it, float (&alpha)[2]) {
        const int j0 = it * KEYS;
        if (j0 + KEYS <= wg_keys && pos0 + j0 + KEYS - 1 <= wg_min_qpos)
            pf_softmax_scores(a, s, [](int, int) { return true; }, tig, m, l, alpha);
        else
            pf_softmax_scores(a, s, [&](int key, int h) { return j0 + key < wg_keys && pos0 + j0 + key <= qpos[h]; },
                              tig, m, l, alpha);
    };
    /* o rescaled, P -> pa */
    auto rescale_to_p = [&](const float (&s)[KEYS / 8][4], const float (&alpha)[2], uint32_t (&pa)[KEYS / 16][4]) {
        pf_rescale_o(o, alpha);
#pragma unroll
        for (int kt = 0; kt < KEYS / 16; kt++) pf_p_frag<BF16>(s, kt, pa[kt]);
    };
    auto parity = [&](int it) { return (uint32_t)((it / PP_STAGES) & 1); };
    auto plain_turn = [&](int it) {   /* no product: tile it not active here (or it == n_tiles) */
        pp_wait(wg);
        pp_handed(wg, it == n_tiles);
        if (it < n_tiles) ar_wg::mbar_arrive(empty_bar(it % PP_STAGES));
    };

    if (n_tiles > 0) {
        if (wg == 1) pp_signal(0);   /* warpgroup 0 goes first */
        if (n_active == 0) {
            for (int it = 0; it <= n_tiles; it++) plain_turn(it);
        } else {
            uint32_t pa[KEYS / 16][4];
            {   /* turn 0: S of tile 0 alone */
                float s[KEYS / 8][4];
                ar_wg::mbar_wait_suspend(full_bar(0), 0);
                pp_wait(wg);
                issue_s(s, 0);
                ar_wg::commit();
                pp_handed(wg, false);
                ar_wg::wait<0>();
                ar_wg::fence_regs(s);
                float alpha[2];
                softmax_scores(s, 0, alpha);
                rescale_to_p(s, alpha, pa);
            }
            for (int it = 1; it < n_active; it++) {   /* turn it: P V of it - 1 and S of it */
                float s[KEYS / 8][4], alpha[2];
                ar_wg::mbar_wait_suspend(full_bar(it % PP_STAGES), parity(it));
                pp_wait(wg);
                /* S first, so its softmax runs while this warpgroup's P V still does */
                issue_s(s, it);
                ar_wg::commit();
                issue_pv(pa, it - 1);
                ar_wg::commit();
                pp_handed(wg, false);
                ar_wg::wait<1>();
                ar_wg::fence_regs(s);
                softmax_scores(s, it, alpha);
                ar_wg::wait<0>();
                ar_wg::fence_regs(o);
                ar_wg::mbar_arrive(empty_bar((it - 1) % PP_STAGES));
                rescale_to_p(s, alpha, pa);
            }
            /* turn n_active: P V of the last active tile */
            pp_wait(wg);
            issue_pv(pa, n_active - 1);
            ar_wg::commit();
            pp_handed(wg, n_active == n_tiles);
            ar_wg::wait<0>();
            ar_wg::fence_regs(o);
            ar_wg::mbar_arrive(empty_bar((n_active - 1) % PP_STAGES));
            if (n_active < n_tiles) ar_wg::mbar_arrive(empty_bar(n_active % PP_STAGES));
            for (int it = n_active + 1; it <= n_tiles; it++) plain_turn(it);
        }
    }
    if (count > 0) pf_store_rows(a, pf_tok, first, count, n, wrow, grp, tig, m, l, o, pass_o, pass_lse, final_out != 0);
#else
    (void)a;
    (void)tmap_k;
    (void)tmap_v;
    (void)pf_tok;
    (void)pf_tiles;
    (void)pf_pairs;
    (void)tok_pos;
    (void)q_nope;
    (void)row_pos;
    (void)kb;
    (void)ke;
    (void)pass_o;
    (void)pass_lse;
    (void)final_out;
    __trap();   /* built without sm_90a: the backend never launches this kernel there */
#endif
}

} /* namespace ar_mla */

#endif
