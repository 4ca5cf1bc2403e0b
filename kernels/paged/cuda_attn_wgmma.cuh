/* cuda_attn_wgmma.cuh - the Hopper (sm_90a) prefill kernel of the paged backend
 * (AR_CFG_PREFILL_WG): the same work items, masks, faults and outputs as attn_kernel
 * (cuda_attn.cuh), with the two matrix products on wgmma (warpgroup MMA) instead of mma.sync.
 * Head size 128 or 256 exactly (one template instance each), on a compute-capability 9.0 device
 * whose driver encodes tensor maps (build_plan in cuda_plan.cuh; elsewhere the mma.sync PREFILL
 * kernel runs).
 *
 * Geometry: one CTA = a producer warpgroup and two consumer warpgroups (384 threads); the
 * consumers own 128 rows (64 each).  Key tiles of 128 at head size 128, of 64 at 256 (the
 * 64 x 256 output accumulator takes 128 registers a thread).  Shared memory holds the Q tile
 * [128 rows x HD dims] and the K/V stages [BLOCK_N keys x HD dims] (three at head size 128, two
 * at 256), all in the 128-byte-swizzled K-major layout wgmma reads: each tile is HD / 64 column
 * parts (dims 0-63, 64-127, ...) of [rows][128 bytes], and the 16-byte chunk c of row r is
 * stored at chunk position c ^ (r & 7) (every part starts on a 1024-byte boundary, so the
 * hardware's address swizzle and ours agree).
 *   S = Q K^T : head size 128: wgmma m64n128k16, A = Q from registers (each consumer's Q
 *               fragments, loaded once by ldmatrix), B = K from shared memory (K-major), 8
 *               steps of 16 dims.  Head size 256: wgmma m64n64k16 with A = Q and B = K both
 *               from shared memory, 16 steps.
 *   O += P V  : wgmma m64n128k16 with A = P from registers (the S accumulator converted in
 *               place: the accumulator layout of one product is the A-fragment layout of the
 *               next) and B = V from shared memory read transposed (dims are the N side and
 *               are contiguous: "MN-major"), BLOCK_N / 16 steps of 16 keys; at head size 256
 *               once for dims 0-127 and once for 128-255.
 * The online softmax is the one of attn_kernel (log2 domain, skip the rescale when no row max
 * moved); once every row of a warp has a maximum, P is taken against the running maximum while
 * each of a thread's row sums of P stays within 2^8 (softmax_to_p: no row maximum on that path),
 * and the exact form runs only when one does not.  Feeding (FlashAttention-3's structure): the
 * producer warpgroup alone fills the stages - every tile that lies wholly inside the sequence by
 * TMA bulk tensor copies (one per cache page and 64-dim part, K by two of its warps and V by the
 * other two), the last, partial tile by cp.async with zero fill, and each item's Q tile by TMA
 * where the GQA group divides 128 (else by cp.async) - and the two consumers take
 * ping-pong turns, so one's softmax runs while the other's products occupy the tensor cores.  At
 * head size 128 a turn issues the previous tile's P V and this tile's S together
 * (FlashAttention-3's order); at 256 a turn holds S alone.  The kernel body exists only in the sm_90a build. */
#ifndef AR_CUDA_ATTN_WGMMA_CUH
#define AR_CUDA_ATTN_WGMMA_CUH

#include <string.h>

#include <type_traits>

#include "../common/cuda_host.cuh"
#include "../common/cuda_wgmma.cuh"

namespace ar_attn {

template <int HD_> struct WgGeom {
    static constexpr int HD = HD_;
    static constexpr int ROWS = 128;                    /* 2 warpgroups x 64 rows */
    static constexpr int BLOCK_N = HD_ == 128 ? 128 : 64; /* keys per tile */
    static constexpr int THREADS = 256;                 /* the two consumer warpgroups */
    static constexpr int PARTS = HD_ / 64;              /* 64-dim (128-byte) column parts of a row */
    static constexpr int Q_PART_BYTES = ROWS * 128;     /* one column part of the Q tile: [128][128 B] */
    static constexpr int KV_PART_BYTES = BLOCK_N * 128; /* one column part of a K or V tile */
    static constexpr int Q_BYTES = PARTS * Q_PART_BYTES;
    static constexpr int KV_BYTES = PARTS * KV_PART_BYTES;
    static constexpr bool Q_IN_REGS = HD_ == 128;       /* else S = Q K^T reads Q from shared memory */
};

/* The pipeline: K/V stages handed over by mbarriers (three at head size 128, two at 256, as
 * shared memory allows: 32 + 6 x 32 KiB and 64 + 4 x 32 KiB).  "full[s]" completes when K of
 * stage s has landed, "full_v[s]" when its V has (separate, so S = Q K^T can start before V
 * lands), "empty[s]" when all 256 consumer threads are done reading it.  A full / full_v phase
 * takes 129 arrivals: every producer thread's cp.async arrival (at once when it issued none) and
 * producer thread 0's (with the byte count of the TMA copies, or plain).  "q_full" completes when
 * the Q tile of the CTA's current work item has landed (128 producer arrivals: thread 0's with the
 * TMA byte count and plain ones, or one per thread after its cp.async copies), "q_empty" when
 * both consumers are done with it (the next item's Q may then come).  setmaxnreg moves registers
 * from the producer (40: its cp.async tail path spills at 32; at 40 its cp.async Q copies in the
 * item loop spill 48-60 bytes) to the consumers (232; ptxas 13.0: in the key loop
 * one 2-byte flag, row_m_ready, stored and reloaded once a tile at head size 128, the rest of
 * the 24-54 spilled bytes at an item's start and end).  Waits ask the hardware to suspend the
 * waiting warp (mbar_wait_suspend) rather than spin on the schedulers the consumers issue from.
 * At head size 128 each consumer's Q fragments sit in 32 registers; they are zeroed before the
 * conditional load: left undefined on the path without tiles, ptxas (13.0) treated them as dead
 * across the key loop and gave their registers to P (seen in the SASS on the H200).  At head
 * size 256 the output accumulator alone takes 128 registers, so Q stays in shared memory and S is
 * a shared-by-shared product. */
template <int HD> struct WgPipe {
    static constexpr int THREADS = 384;                 /* producer + 2 consumer warpgroups */
    static constexpr int STAGES = HD == 128 ? 3 : 2;
    static constexpr int ITEM_SLOTS = 2;                /* work-item indices posted ahead (the item queue) */
    /* full, empty, full_v; q_full, q_empty; item_full, item_empty */
    static constexpr int NUM_BARS = 3 * STAGES + 2 + 2 * ITEM_SLOTS;
    static constexpr size_t BAR_OFFSET = (size_t)WgGeom<HD>::Q_BYTES + (size_t)2 * STAGES * WgGeom<HD>::KV_BYTES;
    static constexpr size_t ITEM_OFFSET = BAR_OFFSET + NUM_BARS * 8;   /* int [ITEM_SLOTS] */
    static constexpr size_t SMEM = 1024 /* alignment slack */ + ITEM_OFFSET + ITEM_SLOTS * 4;
};

/* Ping-pong turns on named barriers 1 (warpgroup 0's turn) and 2 (warpgroup 1's): 256 threads
 * each, the 128 of the waiting warpgroup (bar.sync) and the 128 of the signalling one
 * (bar.arrive).  Per tile every warpgroup waits for its turn once and hands the turn over once,
 * active or not (at head size 128 once more after the last tile, for its P V); warpgroup 1
 * signals once before the loop and skips its last hand-over, so arrivals and waits pair up
 * exactly on both barriers. */
__device__ __forceinline__ void pingpong_signal(int to_wg)
{
    asm volatile("bar.arrive %0, 256;\n" :: "r"(1 + to_wg) : "memory");
}
__device__ __forceinline__ void pingpong_wait(int wg)
{
    asm volatile("bar.sync %0, 256;\n" :: "r"(1 + wg) : "memory");
}
__device__ __forceinline__ void pingpong_turn_issued(int wg, bool last)
{
    if (wg == 0 || !last) pingpong_signal(1 - wg);
}
__device__ __forceinline__ void pingpong_turn(int wg, bool last)
{
    pingpong_wait(wg);
    pingpong_turn_issued(wg, last);
}

/* the swizzled tile layout (ar_wg::wg_swizzle, kernels/common/cuda_wgmma.cuh) */
using ar_wg::wg_swizzle;

/* true for __nv_bfloat16, false for __half: which operand type a wrapper's instruction names */
template <typename T> struct wg_is_bf16 { static constexpr bool value = false; };
template <> struct wg_is_bf16<__nv_bfloat16> { static constexpr bool value = true; };

/* The products of the kernel, by element type, on ar_wg's (kernels/common/cuda_wgmma.cuh). */
/* d += A (a: this thread's 4 registers of the 64 x 16 A tile) B (desc_b, read transposed). */
template <typename T> __device__ __forceinline__ void wgmma_rs(float d[64], const uint32_t a[4], uint64_t desc_b)
{
    ar_wg::mma_rs_m64n128<wg_is_bf16<T>::value, true>(d, a, desc_b, 1);
}
/* d [64 x 128] (+)= A (a: registers) B (desc_b, K-major like wgmma_ss's B): S = Q K^T with Q in
 * registers. */
template <typename T> __device__ __forceinline__ void wgmma_rs_kmajor(float d[64], const uint32_t a[4], uint64_t desc_b, int accumulate)
{
    ar_wg::mma_rs_m64n128<wg_is_bf16<T>::value, false>(d, a, desc_b, accumulate);
}
/* d [64 x 64] (+)= A B with both operands in shared memory and K-major (desc_a: 64 rows of A,
 * desc_b: 64 rows of B): S = Q K^T at head size 256, Q read from its shared tile. */
template <typename T> __device__ __forceinline__ void wgmma_ss_n64(float d[32], uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    ar_wg::mma_ss_m64n64<wg_is_bf16<T>::value>(d, desc_a, desc_b, accumulate);
}

/* The kernel (see the file comment).  Consumer warpgroup w owns rows 64 w .. 64 w + 63 of the
 * CTA's 128; the producer's threads are numbered from 0 too, so the code below reads the same
 * for both. */
template <typename T, int HD_>
__global__ void __launch_bounds__(WgPipe<HD_>::THREADS, 1)
attn_wgmma_kernel(const ar_attn_args a,
                  const __grid_constant__ CUtensorMap tmap_k,  /* K cache [num_slots][Hkv][HD], box [bs][1][64] */
                  const __grid_constant__ CUtensorMap tmap_v,  /* the same for the V cache */
                  const __grid_constant__ CUtensorMap tmap_q,  /* Q [num_tokens][Hq][HD], box [ROWS / group][group][64]
                                                                  (q_by_tma only) */
                  int q_by_tma,                                /* the Q tile comes by TMA (ROWS % group == 0) */
                  int num_work)                                /* items in a.work */
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using G = WgGeom<HD_>;
    constexpr int HD = G::HD, BLOCK_N = G::BLOCK_N, ROWS = G::ROWS, PARTS = G::PARTS;
    constexpr int CHUNKS = HD / 8;                       /* 16-byte chunks per row */
    constexpr int LOADERS = 128;                         /* the producer warpgroup issues the copies */
    constexpr int NS = BLOCK_N / 2;                      /* S accumulator registers: 64 x BLOCK_N / 128 */
    constexpr int NACC = HD / 2;                         /* output accumulator registers: 64 x HD / 128 */
    constexpr int PV_STEPS = BLOCK_N / 16;               /* k-steps of P V */
    extern __shared__ __align__(1024) unsigned char wg_smem_raw[];
    const uint32_t smem_base0 = (uint32_t)__cvta_generic_to_shared(wg_smem_raw);
    const uint32_t pad = (1024 - (smem_base0 & 1023)) & 1023;
    unsigned char *smem = wg_smem_raw + pad;
    const uint32_t sq_addr = smem_base0 + pad;          /* Q tile */
    const uint32_t skv_addr = sq_addr + G::Q_BYTES;     /* stage s: K at + 2s tiles, V at + 2s+1 */
    constexpr int STAGES = WgPipe<HD_>::STAGES;
    /* full[STAGES] (K of a stage landed), empty[STAGES] (both consumer warpgroups are done with
     * a stage), full_v[STAGES] (V landed) */
    const uint32_t full_bar = sq_addr + (uint32_t)WgPipe<HD_>::BAR_OFFSET;
    const uint32_t empty_bar = full_bar + STAGES * 8;
    const uint32_t full_v_bar = empty_bar + STAGES * 8;
    /* q_full: the Q tile of the CTA's current item has landed (the producer's 128 cp.async
     * arrivals); q_empty: both consumers are done reading it (head size 128: loaded into
     * registers; 256: the item's last S issued and completed), so the next item's Q may come */
    const uint32_t q_full_bar = full_v_bar + STAGES * 8;
    const uint32_t q_empty_bar = q_full_bar + 8;
    /* the item queue: item_full[j] completes when slot j holds the CTA's next item index (one
     * arrival, producer thread 0's), item_empty[j] when every warp has read it (12 arrivals) */
    constexpr int ITEM_SLOTS = WgPipe<HD_>::ITEM_SLOTS;
    const uint32_t item_full_bar = q_empty_bar + 8;
    const uint32_t item_empty_bar = item_full_bar + ITEM_SLOTS * 8;
    const uint32_t item_slot = sq_addr + (uint32_t)WgPipe<HD_>::ITEM_OFFSET;   /* int [ITEM_SLOTS] */
    if (threadIdx.x == 0) {
        for (int st = 0; st < STAGES; st++) {
            ar_wg::mbar_init(full_bar + st * 8, LOADERS + 1);
            ar_wg::mbar_init(empty_bar + st * 8, G::THREADS);
            ar_wg::mbar_init(full_v_bar + st * 8, LOADERS + 1);
        }
        ar_wg::mbar_init(q_full_bar, LOADERS);
        ar_wg::mbar_init(q_empty_bar, G::THREADS);
        for (int j = 0; j < ITEM_SLOTS; j++) {
            ar_wg::mbar_init(item_full_bar + j * 8, 1);
            ar_wg::mbar_init(item_empty_bar + j * 8, WgPipe<HD_>::THREADS / 32);
        }
    }
    /* warpgroup 0 of the CTA is the producer (tid < 128, loads only); the consumer threads are
     * numbered from 0 after it */
    const bool producer = threadIdx.x < 128;
    const int tid = !producer ? (int)threadIdx.x - 128 : (int)threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2;                           /* warpgroup: rows 64 wg .. 64 wg + 63 */
    const int g = lane >> 2, tq = lane & 3;

    __syncthreads();                                    /* the barriers are initialised */
    /* The CTA's work items come from the launch's queue: a.wg_next_item counts the items taken,
     * in the plan's order (cuda_plan.cuh: longest first within sections of (request, KV head)
     * groups whose K/V fit in the L2), so a CTA takes its next item when it is free, whatever
     * the lengths of the items before.  Producer thread 0 takes the CTA's k-th item (atomicAdd)
     * and posts its index in slot k % ITEM_SLOTS; every warp reads it there.  The producer takes
     * an item when it starts filling it, up to the pipeline's depth ahead of the consumers.  An
     * index of num_work or more ends the loop: every CTA takes exactly one such index, its last,
     * so the CTA that takes num_work + gridDim.x - 1 is the launch's last taker and sets the
     * counter back to 0 for the next launch (launches of one backend run in stream order).
     * The pipeline's stages and barrier phases run on across items: tiles_before and
     * q_items_before count the tiles and the Q tiles the CTA took before this item.  The loop
     * is written once and instantiated twice (role: the producer's or the consumers'), each
     * copy after its own register reallocation, so ptxas allocates each with its own budget. */
    auto run_items = [&](auto role) {
        constexpr bool PRODUCER_ROLE = decltype(role)::value;
        auto next_item = [&](uint32_t k) {
            const uint32_t j = k % ITEM_SLOTS, use = k / ITEM_SLOTS;
            if (PRODUCER_ROLE && tid == 0) {
                if (use > 0) ar_wg::mbar_wait_suspend(item_empty_bar + j * 8, (use - 1) & 1);
                const int taken = atomicAdd(a.wg_next_item, 1);
                if (taken == num_work + (int)gridDim.x - 1) atomicExch(a.wg_next_item, 0);
                ar_wg::st_shared_s32(item_slot + j * 4, taken);
                ar_wg::mbar_arrive(item_full_bar + j * 8);   /* release: the slot's store first */
            }
            ar_wg::mbar_wait_suspend(item_full_bar + j * 8, use & 1);
            const int item = ar_wg::ld_shared_s32(item_slot + j * 4);
            __syncwarp();
            if (lane == 0) ar_wg::mbar_arrive(item_empty_bar + j * 8);
            return item;
        };
        uint32_t tiles_before = 0, q_items_before = 0;
        for (uint32_t k = 0;; k++) {
            const int item = next_item(k);
            if (item >= num_work) break;
            const ar_attn_work w = a.work[item];

            const int qstart = a.query_start_loc[w.req];
            const int q_len = a.query_start_loc[w.req + 1] - qstart;
            const int seq_len = a.seq_lens[w.req];
            const int ctx = seq_len - q_len;
            const int grp = a.group;
            const int kvh_load = a.fault == AR_FAULT_WRONG_KV_HEAD ? (w.kv_head + 1) % a.num_kv_heads : w.kv_head;
            const int causal_extra = a.non_causal ? (1 << 30) : a.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0;
            const bool no_rescale = a.fault == AR_FAULT_NO_RESCALE;
            const int window = a.sliding_window;
            const float scale_log2 = a.scale_log2;
            const int *bt = a.block_table + (int64_t)w.req * a.max_blocks_per_req;
            const int bs_log2 = a.block_size_log2, bs_mask = (1 << bs_log2) - 1;
            const int64_t head_stride = (int64_t)a.num_kv_heads * HD;
            const T *qg = reinterpret_cast<const T *>(a.q);
            const T *kg = reinterpret_cast<const T *>(a.k_cache) + (int64_t)kvh_load * HD;
            const T *vg = reinterpret_cast<const T *>(a.v_cache) + (int64_t)kvh_load * HD;

            /* Q tile -> shared, by the producer; completes on q_full.  By TMA where the group
             * divides 128 (a tile's rows are then 128 / group whole tokens, each the group's
             * adjacent heads: one box [128 / group tokens][group heads][64 dims] per 64-dim part,
             * landing in the swizzled layout row by row; rows past the request hold the next
             * tokens' queries, or zeros past the last token, and their outputs are never
             * stored): producer thread 0 issues the copies, the other threads arrive.  Else by
             * cp.async, rows past the request zero-filled.  The cp.async form took the producer
             * about 6,000 cycles an item to issue (integer divisions per chunk at 40 registers),
             * so that the consumers waited for Q at most item starts (H200, BENCHMARKS.md). */
            auto produce_q = [&]() {
                /* build_plan starts every item at a multiple of ROWS rows, so with the group
                 * dividing ROWS an item starts on a token; the test keeps an item that did not
                 * on the cp.async copies */
                if (q_by_tma && w.pair0 % grp == 0) {
                    if (tid == 0) {
                        ar_wg::mbar_arrive_expect_tx(q_full_bar, G::Q_BYTES);
#pragma unroll
                        for (int part = 0; part < PARTS; part++)
                            ar_wg::tma_load_3d(sq_addr + (uint32_t)(part * G::Q_PART_BYTES), &tmap_q, q_full_bar, part * 64,
                                               w.kv_head * grp, qstart + w.pair0 / grp);
                    } else {
                        ar_wg::mbar_arrive(q_full_bar);
                    }
                    return;
                }
#pragma unroll 2
                for (int k = 0; k < ROWS * CHUNKS / LOADERS; k++) {
                    int i = tid + k * LOADERS, r = i / CHUNKS, c = i % CHUNKS;
                    int pair = w.pair0 + r, tok = pair / grp, hq = w.kv_head * grp + pair % grp;
                    bool ok = tok < q_len;
                    const T *src = ok ? qg + ((int64_t)(qstart + tok) * a.num_q_heads + hq) * HD + c * 8 : qg;
                    cp_async16(smem + wg_swizzle<G::Q_PART_BYTES>(r, c), src, ok);
                }
                ar_wg::mbar_arrive_cp_async(q_full_bar);
            };

            /* this warpgroup's rows, and this thread's two rows (lo = r, hi = r + 8) */
            const int wg_row0 = wg * 64;
            const int tok_first = (w.pair0 + wg_row0) / grp;
            const int tok_last_raw = (w.pair0 + wg_row0 + 63) / grp;
            const bool wg_has_rows = tok_first < q_len;
            const int tok_last = tok_last_raw < q_len ? tok_last_raw : q_len - 1;
            const int wg_min_qpos = ctx + tok_first, wg_max_qpos = ctx + tok_last;
            const int my_row = wg_row0 + (warp & 3) * 16 + g;   /* local row of lo; hi = + 8 */
            int qpos[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                int tok = (w.pair0 + my_row + 8 * r) / grp;
                qpos[r] = tok < q_len ? ctx + tok : -2;
            }

            const int n_tiles = w.tile_end - w.tile_begin;
            /* The producer's copies of a partial tile.  Producer warp pw copies keys KPW pw .. KPW pw +
             * KPW - 1 of a tile (KPW = BLOCK_N / 4); lane j first looks up the cache slot of key KPW pw +
             * j (-1 past the sequence: zero fill), once per tile for K and V; then lane l copies 16-byte
             * chunk l % CHUNKS of keys KPW pw + l / CHUNKS + RPI m (RPI = 32 / CHUNKS whole rows per
             * instruction, m = 0 .. KPW / RPI - 1), taking each slot from its owner lane by a shuffle
             * instead of a block-table load per copy. */
            constexpr int KPW = BLOCK_N / 4, RPI = 32 / CHUNKS;
            auto producer_slot = [&](int it) {
                const int j = (w.tile_begin + it) * BLOCK_N + warp * KPW + lane;
                return j < seq_len ? (__ldg(bt + (j >> bs_log2)) << bs_log2) + (j & bs_mask) : -1;
            };
            auto produce = [&](int it, int v, int my_slot, int stage) {
                const int c = lane % CHUNKS, sub_row = lane / CHUNKS, key_base = warp * KPW;
                const uint32_t dst0 = sq_addr + (uint32_t)(G::Q_BYTES + (2 * stage + v) * G::KV_BYTES +
                                                           (c >> 3) * G::KV_PART_BYTES);
                const T *src = (v ? vg : kg) + c * 8;
#pragma unroll 4
                for (int m = 0; m < KPW / RPI; m++) {
                    const int key = key_base + sub_row + RPI * m;
                    const int slot = __shfl_sync(0xffffffffu, my_slot, sub_row + RPI * m);
                    const uint32_t dst = dst0 + (uint32_t)(key * 128 + (((c & 7) ^ (key & 7)) << 4));
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
                                 "l"(src + (int64_t)(slot < 0 ? 0 : slot) * head_stride), "r"(slot < 0 ? 0 : 16));
                }
            };

            /* The cache block lane l of each producer warp copies for tile it (page l % pages of the
             * tile; pages = BLOCK_N / block size, a power of two; lanes past (PARTS / 2) x pages none).
             * The producer reads it before it waits for the stage to empty, so the block-table latency is
             * off the refill's path (5% of the cascade prefix pass on the H200, BENCHMARKS.md). */
            auto tma_block = [&](int it) {
                const int pages = BLOCK_N >> bs_log2;
                if (lane >= (PARTS / 2) * pages) return 0;
                return __ldg(bt + (((w.tile_begin + it) * BLOCK_N) >> bs_log2) + (lane & (pages - 1)));
            };
            /* A tile wholly inside the sequence into its stage by TMA, issued by all four producer
             * warps: warp w copies K (w < 2) or V (w >= 2), column parts (w & 1) x PARTS / 2 .. + PARTS
             * / 2 - 1, lane l one cache page (l % pages) of part l / pages.  A warp issues its copies
             * one after another at about 19 bytes a cycle (2 KB pages and 8 KB pages alike, H200): with
             * one warp issuing all 32 copies of a K + V tile the producer took as long as the consumers
             * (BENCHMARKS.md, 2026-12-03).  Warps 0 and 2 raise their barrier's byte count by the whole
             * tile; the other warp's copies may complete first (the count goes below zero meanwhile;
             * the phase still waits for the arrival). */
            auto produce_tma_quarter = [&](int block, int stage) {
                const int pages = BLOCK_N >> bs_log2;
                const int v = warp >> 1, half = warp & 1;
                const uint32_t bar = (v ? full_v_bar : full_bar) + (uint32_t)(stage * 8);
                const uint32_t dst0 = sq_addr + (uint32_t)(G::Q_BYTES + (2 * stage + v) * G::KV_BYTES);
                if (half == 0 && lane == 0) ar_wg::mbar_arrive_expect_tx(bar, G::KV_BYTES);
                if (lane < (PARTS / 2) * pages) {
                    const int part = half * (PARTS / 2) + lane / pages, page = lane & (pages - 1);
                    ar_wg::tma_load_3d(dst0 + (uint32_t)(part * G::KV_PART_BYTES + (page << bs_log2) * 128),
                                       v ? (const void *)&tmap_v : (const void *)&tmap_k, bar, part * 64, kvh_load,
                                       block << bs_log2);
                }
            };

            float acc[NACC];
#pragma unroll
            for (int i = 0; i < NACC; i++) acc[i] = 0.f;
            float row_m[2] = {-INFINITY, -INFINITY}, row_l[2] = {0.f, 0.f};
            bool row_m_ready = false;                    /* every row of the warp has a maximum */
            /* V read transposed ("MN-major"): its descriptor's LBO steps between the two 64-dim
             * atoms along N (a column part apart), the stride byte offset between groups of 8 keys
             * (1024 bytes); checked against a CPU product on the H200 by a layout probe, 2026-11-30.
             * One P V instruction covers 128 dims (N = 128): at head size 256 two of them, on the V
             * tile's parts 0-1 and 2-3, into acc[0..63] and acc[64..127]. */
            const uint32_t v_lbo = G::KV_PART_BYTES, v_sbo = 1024;

            /* head size 128: this thread's A fragments of its warpgroup's 64 Q rows, 8 k-steps of 16
             * dims (loaded once the Q tile has landed, below; zero until then, see WgPipe) */
            uint32_t qa[G::Q_IN_REGS ? HD / 16 : 1][4];
#pragma unroll
            for (int kk = 0; kk < (G::Q_IN_REGS ? HD / 16 : 1); kk++)
                qa[kk][0] = qa[kk][1] = qa[kk][2] = qa[kk][3] = 0u;
            /* S = Q K^T of the tile in stage sk_addr into sd (issued, not waited for) */
            /* The k-steps' descriptors are the tile's plus the step's offset in 16-byte units
             * (ar_wg::desc_advance). */
            auto issue_s = [&](float (&sd)[NS], uint32_t sk_addr) {
                ar_wg::fence();
                const uint64_t db0 = ar_wg::desc_sw128(sk_addr, 16, 1024);
                if constexpr (G::Q_IN_REGS) {
#pragma unroll
                    for (int kk = 0; kk < HD / 16; kk++) {
                        const uint32_t koff16 = (uint32_t)((kk >> 2) * G::KV_PART_BYTES + (kk & 3) * 32) >> 4;
                        wgmma_rs_kmajor<T>(sd, qa[kk], ar_wg::desc_advance(db0, koff16), kk > 0);
                    }
                } else {
                    /* this warpgroup's 64 Q rows start 64 x 128 bytes into each column part */
                    const uint64_t da0 = ar_wg::desc_sw128(sq_addr + (uint32_t)(wg * 64 * 128), 16, 1024);
#pragma unroll
                    for (int kk = 0; kk < HD / 16; kk++) {
                        const uint32_t qoff16 = (uint32_t)((kk >> 2) * G::Q_PART_BYTES + (kk & 3) * 32) >> 4;
                        const uint32_t koff16 = (uint32_t)((kk >> 2) * G::KV_PART_BYTES + (kk & 3) * 32) >> 4;
                        wgmma_ss_n64<T>(sd, ar_wg::desc_advance(da0, qoff16), ar_wg::desc_advance(db0, koff16), kk > 0);
                    }
                }
            };
            /* P [64 x BLOCK_N of this warpgroup, accumulator layout] -> pa, the A fragments of the
             * k-steps of 16 keys (the accumulator layout of one product is the A layout of the next) */
            auto pack_p = [&](const float (&sc)[NS], uint32_t (&pa)[PV_STEPS][4]) {
#pragma unroll
                for (int kk = 0; kk < PV_STEPS; kk++) {
                    pa[kk][0] = pack2<T>(sc[8 * kk + 0], sc[8 * kk + 1]);
                    pa[kk][1] = pack2<T>(sc[8 * kk + 2], sc[8 * kk + 3]);
                    pa[kk][2] = pack2<T>(sc[8 * kk + 4], sc[8 * kk + 5]);
                    pa[kk][3] = pack2<T>(sc[8 * kk + 6], sc[8 * kk + 7]);
                }
            };
            /* the soft cap and the mask of tile t, in place on the scores sc */
            auto cap_and_mask = [&](float (&sc)[NS], int t) {
                const int tile_first = t * BLOCK_N, tile_last = tile_first + BLOCK_N - 1;
                if (__builtin_expect(a.soft_cap > 0.f, 0)) {
                    const float scale = scale_log2 * 0.6931471805599453f;
                    const float cap_over_scale = a.soft_cap / scale, inv_cap = scale / a.soft_cap;
#pragma unroll
                    for (int i = 0; i < NS; i++) sc[i] = cap_over_scale * tanhf(sc[i] * inv_cap);
                }
                const bool need_mask = tile_last > wg_min_qpos + causal_extra || tile_last >= seq_len ||
                                       (window > 0 && tile_first < wg_max_qpos - window + 1);
                if (__builtin_expect(need_mask, 0)) {
#pragma unroll
                    for (int i = 0; i < NS; i++) {
                        int j = tile_first + (i >> 2) * 8 + 2 * tq + (i & 1);
                        int p = qpos[(i >> 1) & 1];
                        bool vis = j < seq_len && j <= p + causal_extra && (window <= 0 || j >= p - window + 1);
                        if (!vis) sc[i] = -INFINITY;
                    }
                }
            };
            /* online softmax of capped and masked scores (log2 domain).  Both rows' maxima first,
             * each on four chains of the thread's pairs (element i is row (i >> 1) & 1, column
             * (i >> 2) * 8 + 2 tq + (i & 1)), then the quad's shuffles, then the exponentials with
             * two sum chains a row.  Beside the running-maximum path below (which leaves this form
             * to an item's first tile and to grown maxima) 1.00x causal and 1.01x chunked against
             * one chain a row, row by row; without that path 0.99x (BENCHMARKS.md, 2026-12-03) */
            auto softmax_exact = [&](float (&sc)[NS], float (&alpha_out)[2]) {
                float part_max[2][4];
#pragma unroll
                for (int r = 0; r < 2; r++)
#pragma unroll
                    for (int c = 0; c < 4; c++) part_max[r][c] = -INFINITY;
#pragma unroll
                for (int n = 0; n < NS / 4; n++) {
                    part_max[0][n & 3] = fmaxf(part_max[0][n & 3], fmaxf(sc[4 * n], sc[4 * n + 1]));
                    part_max[1][n & 3] = fmaxf(part_max[1][n & 3], fmaxf(sc[4 * n + 2], sc[4 * n + 3]));
                }
                float mx[2], m_scaled[2], rs[2][2];
#pragma unroll
                for (int r = 0; r < 2; r++)
                    mx[r] = fmaxf(fmaxf(part_max[r][0], part_max[r][1]), fmaxf(part_max[r][2], part_max[r][3]));
#pragma unroll
                for (int r = 0; r < 2; r++) mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
#pragma unroll
                for (int r = 0; r < 2; r++) mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const float m_new = fmaxf(row_m[r], mx[r]);
                    m_scaled[r] = m_new == -INFINITY ? 0.f : m_new * scale_log2;
                    alpha_out[r] = exp2f(row_m[r] * scale_log2 - m_scaled[r]);
                    row_m[r] = m_new;
                    rs[r][0] = rs[r][1] = 0.f;
                }
#pragma unroll
                for (int n = 0; n < NS / 4; n++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) sc[4 * n + e] = exp2f(fmaf(sc[4 * n + e], scale_log2, -m_scaled[e >> 1]));
                    rs[0][n & 1] += sc[4 * n] + sc[4 * n + 1];
                    rs[1][n & 1] += sc[4 * n + 2] + sc[4 * n + 3];
                }
#pragma unroll
                for (int r = 0; r < 2; r++) row_l[r] = row_l[r] * alpha_out[r] + (rs[r][0] + rs[r][1]);
            };
            /* soft cap, mask, online softmax of the scores sc of tile t; P -> pa (A fragments of the
             * k-steps of 16 keys) and each row's rescale factor for acc -> alpha (rescale_acc applies
             * it).  Returns false when P was taken against the running maximum (alpha 1, nothing to
             * rescale: the turns then skip rescale_acc and its votes), true from the exact form.  The
             * mask, soft-cap and growth branches are marked cold so that the common path runs
             * straight.  Those trims and the vote kept once true (below) together: 1.02x causal and
             * chunked at head size 128; the skipped rescale at head size 256 1.02x (BENCHMARKS.md,
             * 2026-12-03). */
            auto softmax_to_p = [&](float (&sc)[NS], int t, uint32_t (&pa)[PV_STEPS][4], float (&alpha_out)[2]) -> bool {
                cap_and_mask(sc, t);
                /* Once every row of the warp has a running maximum, P against it straight away (no
                 * reduction or shuffle before the exponentials), packed into pa with the scores
                 * left intact; kept unless one of the thread's row sums of P exceeds 2^8 (every P
                 * is at most its row sum, so P then lies in [0, 256], exact in bf16's range; a
                 * NaN fails the test too), else the exact form below from the scores.  The sums
                 * stand in for a row maximum of the scores, so this path has no FMNMX at all:
                 * against a row maximum test on the thread's scores (head size 128) or beside the
                 * exponentials (256), 1.035x causal and 1.031x chunked at head size 128, 1.017x
                 * causal at 256 (BENCHMARKS.md, 2026-12-03).  Neither form runs under the planted
                 * no-rescale fault, which must show on the exact path.  Once every row of the warp
                 * has a maximum it keeps one for the item, so the vote stops. */
                if (!no_rescale && (row_m_ready || (row_m_ready = __all_sync(0xffffffffu, row_m[0] != -INFINITY && row_m[1] != -INFINITY)))) {
                    const float ms0 = row_m[0] * scale_log2, ms1 = row_m[1] * scale_log2;
                    float rs0 = 0.f, rs1 = 0.f;
#pragma unroll
                    for (int kk = 0; kk < PV_STEPS; kk++) {
                        const float *e = sc + 8 * kk;
                        const float p0 = exp2f(fmaf(e[0], scale_log2, -ms0)), p1 = exp2f(fmaf(e[1], scale_log2, -ms0));
                        const float p2 = exp2f(fmaf(e[2], scale_log2, -ms1)), p3 = exp2f(fmaf(e[3], scale_log2, -ms1));
                        const float p4 = exp2f(fmaf(e[4], scale_log2, -ms0)), p5 = exp2f(fmaf(e[5], scale_log2, -ms0));
                        const float p6 = exp2f(fmaf(e[6], scale_log2, -ms1)), p7 = exp2f(fmaf(e[7], scale_log2, -ms1));
                        rs0 += (p0 + p1) + (p4 + p5);
                        rs1 += (p2 + p3) + (p6 + p7);
                        pa[kk][0] = pack2<T>(p0, p1);
                        pa[kk][1] = pack2<T>(p2, p3);
                        pa[kk][2] = pack2<T>(p4, p5);
                        pa[kk][3] = pack2<T>(p6, p7);
                    }
                    const bool grew = !(rs0 <= 256.f) || !(rs1 <= 256.f);
                    if (__builtin_expect(!__any_sync(0xffffffffu, grew), 1)) {
                        row_l[0] += rs0;
                        row_l[1] += rs1;
                        alpha_out[0] = alpha_out[1] = 1.f;
                        return false;
                    }
                }
                softmax_exact(sc, alpha_out);
                pack_p(sc, pa);
                return true;
            };
            auto rescale_acc = [&](const float (&alpha)[2]) {
#pragma unroll
                for (int r = 0; r < 2; r++)
                    if (!no_rescale && __any_sync(0xffffffffu, alpha[r] != 1.f)) {
#pragma unroll
                        for (int n = 0; n < NACC / 4; n++) {
                            acc[4 * n + 2 * r] *= alpha[r];
                            acc[4 * n + 2 * r + 1] *= alpha[r];
                        }
                    }
            };
            /* O += P V of the tile in stage sv_addr (issued, not waited for) */
            auto issue_pv = [&](const uint32_t (&pa)[PV_STEPS][4], uint32_t sv_addr) {
                ar_wg::fence_regs(acc);
                ar_wg::fence();
#pragma unroll
                for (int h = 0; h < HD / 128; h++) {
                    const uint32_t sv_half = sv_addr + (uint32_t)(h * 2 * G::KV_PART_BYTES);
                    const uint64_t dv0 = ar_wg::desc_sw128(sv_half, v_lbo, v_sbo);
#pragma unroll
                    for (int kk = 0; kk < PV_STEPS; kk++)
                        wgmma_rs<T>(acc + 64 * h, pa[kk], ar_wg::desc_advance(dv0, (uint32_t)(kk * 2048 >> 4)));
                }
            };

            if constexpr (PRODUCER_ROLE) {
                /* the producer warpgroup: fills stage (tiles_before + it) % STAGES with tile it as soon as
                 * both consumers released the tile STAGES before it in that stage; K and V complete on
                 * separate barriers so S = Q K^T starts before V has landed.  The item's Q tile comes
                 * after its first K/V tile, once the consumers are done with the previous item's Q. */
                for (int it = 0; it < n_tiles; it++) {
                    const uint32_t gt = tiles_before + (uint32_t)it;   /* the CTA's tile count */
                    const int stage = (int)(gt % STAGES);
                    const bool by_tma = (w.tile_begin + it + 1) * BLOCK_N <= seq_len;
                    const int my_slot = by_tma ? tma_block(it) : producer_slot(it);
                    if (gt >= STAGES) ar_wg::mbar_wait_suspend(empty_bar + stage * 8, (gt / STAGES - 1) & 1);
                    if (by_tma) {
                        produce_tma_quarter(my_slot, stage);
                    } else {
                        produce(it, 0, my_slot, stage);
                        if (tid == 0) ar_wg::mbar_arrive(full_bar + stage * 8);
                    }
                    ar_wg::mbar_arrive_cp_async(full_bar + stage * 8);
                    if (!by_tma) {
                        produce(it, 1, my_slot, stage);
                        if (tid == 0) ar_wg::mbar_arrive(full_v_bar + stage * 8);
                    }
                    ar_wg::mbar_arrive_cp_async(full_v_bar + stage * 8);
                    if (it == 0) {
                        if (q_items_before > 0) ar_wg::mbar_wait_suspend(q_empty_bar, (q_items_before - 1) & 1);
                        produce_q();
                    }
                }
                if (n_tiles > 0) q_items_before++;
                tiles_before += (uint32_t)n_tiles;
                continue;
            }
            if (n_tiles > 0) {
                ar_wg::mbar_wait_suspend(q_full_bar, q_items_before & 1);
                if constexpr (G::Q_IN_REGS) {
                    /* ldmatrix x4: lanes 0-15 address rows 0-15 of this warp's 16 at the k-step's first 8
                     * dims, lanes 16-31 the same rows at its second 8 (the A-fragment order, checked
                     * against a CPU product on the H200); then the Q tile is free for the next item */
                    const int q_row = wg_row0 + (warp & 3) * 16 + (lane & 15);
#pragma unroll
                    for (int kk = 0; kk < HD / 16; kk++)
                        ldmatrix_x4(qa[kk], smem + wg_swizzle<G::Q_PART_BYTES>(q_row, 2 * kk + (lane >> 4)));
                    ar_wg::mbar_arrive(q_empty_bar);
                } else {
                    ar_wg::fence_proxy_async();                 /* cp.async writes -> wgmma's reads */
                }
            }
            if (wg == 1 && n_tiles > 0) pingpong_signal(0);   /* warpgroup 0 goes first */
            if constexpr (HD == 128) {
            /* FlashAttention-3's turn order: a warpgroup's turn issues P V of its previous active tile
             * and S of this one together, so its softmax runs while the other warpgroup's turn holds
             * the tensor cores.  Turns per item: n_tiles + 1 for both warpgroups (one per tile, active
             * or not, and a last one for the last P V).  The active tiles of a warpgroup are one run
             * [a0, a1) (causal: a suffix is inactive; a window: a prefix). */
            if (n_tiles > 0) {
                auto tile_active = [&](int it) {
                    const int tf = (w.tile_begin + it) * BLOCK_N, tl = tf + BLOCK_N - 1;
                    return wg_has_rows && tf <= wg_max_qpos + causal_extra && !(window > 0 && tl < wg_min_qpos - window + 1);
                };
                auto stage_of = [&](int it) { return (int)((tiles_before + (uint32_t)it) % STAGES); };
                auto parity_of = [&](int it) { return ((tiles_before + (uint32_t)it) / STAGES) & 1; };
                auto sk_of = [&](int it) { return skv_addr + (uint32_t)(stage_of(it) * 2 * G::KV_BYTES); };
                auto plain_turn = [&](int it) {                 /* no product: tile it inactive (or it == n_tiles) */
                    pingpong_turn(wg, it == n_tiles);
                    if (it < n_tiles) ar_wg::mbar_arrive(empty_bar + stage_of(it) * 8);
                };
                int a0 = 0;
                while (a0 < n_tiles && !tile_active(a0)) a0++;
                int a1 = a0;
                while (a1 < n_tiles && tile_active(a1)) a1++;
                for (int it = 0; it < a0; it++) plain_turn(it);
                if (a0 < a1) {
                    uint32_t pa[PV_STEPS][4];
                    float alpha[2];
                    {   /* the first active tile: S alone */
                        float sc[NS];
                        ar_wg::mbar_wait_suspend(full_bar + stage_of(a0) * 8, parity_of(a0));
                        ar_wg::fence_proxy_async();
                        pingpong_wait(wg);
                        issue_s(sc, sk_of(a0));
                        ar_wg::commit();
                        pingpong_turn_issued(wg, false);
                        ar_wg::wait<0>();
                        ar_wg::fence_regs(sc);
                        softmax_to_p(sc, w.tile_begin + a0, pa, alpha);   /* acc is still 0: no rescale */
                    }
                    for (int it = a0 + 1; it < a1; it++) {      /* P V of it - 1 and S of it in one turn */
                        float sc[NS];
                        ar_wg::mbar_wait_suspend(full_v_bar + stage_of(it - 1) * 8, parity_of(it - 1));
                        ar_wg::mbar_wait_suspend(full_bar + stage_of(it) * 8, parity_of(it));
                        ar_wg::fence_proxy_async();
                        pingpong_wait(wg);
                        issue_pv(pa, sk_of(it - 1) + G::KV_BYTES);
                        ar_wg::commit();
                        issue_s(sc, sk_of(it));
                        ar_wg::commit();
                        pingpong_turn_issued(wg, false);
                        ar_wg::wait<0>();
                        ar_wg::fence_regs(acc);
                        ar_wg::fence_regs(sc);
                        ar_wg::mbar_arrive(empty_bar + stage_of(it - 1) * 8);
                        if (softmax_to_p(sc, w.tile_begin + it, pa, alpha)) rescale_acc(alpha);   /* nothing to rescale otherwise */
                    }
                    /* turn a1 (an inactive tile's, or the last one): P V of a1 - 1 */
                    ar_wg::mbar_wait_suspend(full_v_bar + stage_of(a1 - 1) * 8, parity_of(a1 - 1));
                    ar_wg::fence_proxy_async();
                    pingpong_wait(wg);
                    issue_pv(pa, sk_of(a1 - 1) + G::KV_BYTES);
                    ar_wg::commit();
                    pingpong_turn_issued(wg, a1 == n_tiles);
                    ar_wg::wait<0>();
                    ar_wg::fence_regs(acc);
                    ar_wg::mbar_arrive(empty_bar + stage_of(a1 - 1) * 8);
                    if (a1 < n_tiles) ar_wg::mbar_arrive(empty_bar + stage_of(a1) * 8);
                    for (int it = a1 + 1; it <= n_tiles; it++) plain_turn(it);
                } else {
                    for (int it = a0; it <= n_tiles; it++) plain_turn(it);
                }
            }
            } else {
            /* head size 256: a turn holds S alone (the turn order above spills at this size) */
            for (int it = 0; it < n_tiles; it++) {
                const uint32_t gt = tiles_before + (uint32_t)it;
                const int stage = (int)(gt % STAGES);
                const int t = w.tile_begin + it;
                const int tile_first = t * BLOCK_N, tile_last = tile_first + BLOCK_N - 1;
                const bool active = wg_has_rows && tile_first <= wg_max_qpos + causal_extra &&
                                    !(window > 0 && tile_last < wg_min_qpos - window + 1);
                if (!active) {                                  /* warpgroup-uniform */
                    pingpong_turn(wg, it == n_tiles - 1);
                    ar_wg::mbar_arrive(empty_bar + stage * 8);
                    continue;
                }
                ar_wg::mbar_wait_suspend(full_bar + stage * 8, (gt / STAGES) & 1);
                ar_wg::fence_proxy_async();                            /* TMA / cp.async writes -> the async proxy */
                const uint32_t sk_addr = skv_addr + (uint32_t)(stage * 2 * G::KV_BYTES);
                const uint32_t sv_addr = sk_addr + G::KV_BYTES;

                float s[NS];
                pingpong_wait(wg);
                issue_s(s, sk_addr);
                pingpong_turn_issued(wg, it == n_tiles - 1);
                ar_wg::commit();
                ar_wg::wait<0>();
                ar_wg::fence_regs(s);
                uint32_t pa[PV_STEPS][4];
                float alpha[2];
                if (softmax_to_p(s, t, pa, alpha)) rescale_acc(alpha);   /* nothing to rescale otherwise */
                ar_wg::mbar_wait_suspend(full_v_bar + stage * 8, (gt / STAGES) & 1);
                ar_wg::fence_proxy_async();
                issue_pv(pa, sv_addr);
                ar_wg::commit();
                ar_wg::wait<0>();
                ar_wg::fence_regs(acc);
                ar_wg::mbar_arrive(empty_bar + stage * 8);
            }
            }
            if (n_tiles > 0) {
                if constexpr (!G::Q_IN_REGS) ar_wg::mbar_arrive(q_empty_bar);   /* every S of the item has completed */
                q_items_before++;
            }
            tiles_before += (uint32_t)n_tiles;


#pragma unroll
            for (int r = 0; r < 2; r++) {
                float l = row_l[r];
                l += __shfl_xor_sync(0xffffffffu, l, 1);
                l += __shfl_xor_sync(0xffffffffu, l, 2);
                row_l[r] = l;
                row_m[r] = row_m[r] == -INFINITY ? -INFINITY : row_m[r] * scale_log2;
            }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                int lr = my_row + 8 * r;
                int pair = w.pair0 + lr, tok = pair / grp, hq = w.kv_head * grp + pair % grp;
                float l = row_l[r];
                float inv = l > 0.f ? 1.f / l : 0.f;
                float lse2 = l > 0.f ? row_m[r] + __log2f(l) : -INFINITY;
                if (w.partial < 0 && !a.merge_out) {
                    /* the plain output as 8-byte stores: the quad's four threads hold row lr's dims
                     * in pairs (thread tq: dims 8n + 2tq, 8n + 2tq + 1 of each 8-dim block n).  One
                     * exchange with the neighbour (tq ^ 1) gives each thread two adjacent pairs of
                     * two blocks of each 32-dim group: an even thread keeps blocks 0 and 2 of the
                     * group and takes its odd neighbour's pairs of them (dims 2tq .. 2tq + 3), an
                     * odd thread blocks 1 and 3, after its even neighbour's pairs.  The four threads'
                     * stores of one instruction fill whole 32-byte sectors.  Against the earlier
                     * 4 x 4 exchange with one 16-byte store (three shuffles and some twenty selects
                     * a group): 376 fewer instructions at head size 128, no spills there, varlen
                     * 1.04x, causal 1.01x at both head sizes (H200, BENCHMARKS.md).  Rows are
                     * quad-uniform, so every lane runs the shuffles. */
                    T *orow = (T *)a.out + out_index(a, qstart + tok, hq, 0);
                    const bool row_ok = tok < q_len;
                    const bool odd = tq & 1;
                    const int dim0 = 2 * (tq & 2);             /* the thread's first dim in its blocks */
#pragma unroll
                    for (int k = 0; k < HD / 32; k++) {
                        uint32_t mine[4];                      /* mine[j]: my pair of block 4k + j */
#pragma unroll
                        for (int j = 0; j < 4; j++)
                            mine[j] = pack2<T>(acc[4 * (4 * k + j) + 2 * r] * inv, acc[4 * (4 * k + j) + 2 * r + 1] * inv);
                        const uint32_t send0 = odd ? mine[0] : mine[1], send1 = odd ? mine[2] : mine[3];
                        const uint32_t keep0 = odd ? mine[1] : mine[0], keep1 = odd ? mine[3] : mine[2];
                        const uint32_t got0 = __shfl_xor_sync(0xffffffffu, send0, 1);
                        const uint32_t got1 = __shfl_xor_sync(0xffffffffu, send1, 1);
                        uint2 v0, v1;                          /* the lower thread's pair first */
                        v0.x = odd ? got0 : keep0;
                        v0.y = odd ? keep0 : got0;
                        v1.x = odd ? got1 : keep1;
                        v1.y = odd ? keep1 : got1;
                        const int block0 = 4 * k + (odd ? 1 : 0);
                        if (row_ok) {
                            *reinterpret_cast<uint2 *>(orow + block0 * 8 + dim0) = v0;
                            *reinterpret_cast<uint2 *>(orow + (block0 + 2) * 8 + dim0) = v1;
                        }
                    }
                    if (tq == 0 && row_ok) store_lse<T>(a, w, ROWS, lr, qstart + tok, hq, lse2);
                    continue;
                }
                if (tok >= q_len && w.partial < 0) continue;   /* fused merge: rows past the request */
#pragma unroll
                for (int n = 0; n < NACC / 4; n++)
                    store_pair<T>(a, w, ROWS, HD, lr, qstart + tok, hq, n * 8 + 2 * tq, acc[4 * n + 2 * r] * inv,
                                  acc[4 * n + 2 * r + 1] * inv, lse2);
                if (tq == 0) store_lse<T>(a, w, ROWS, lr, qstart + tok, hq, lse2);
            }
        } /* the item loop */
        if constexpr (PRODUCER_ROLE) cp_async_wait<0>();
    };
    /* 168 registers at entry (384 threads, 64K registers); the producer keeps 40, 128 x (168 -
     * 40) = 2 x 128 x (232 - 168) */
    if (producer) {
        ar_wg::setmaxnreg_dec<40>();
        if (tid == 0) {
            ar_wg::tma_prefetch_map(&tmap_k);
            ar_wg::tma_prefetch_map(&tmap_v);
            if (q_by_tma) ar_wg::tma_prefetch_map(&tmap_q);
        }
        run_items(std::true_type{});
    } else {
        ar_wg::setmaxnreg_inc<232>();
        run_items(std::false_type{});
    }
#else
    __trap();   /* built without sm_90a: the host never launches this config there */
#endif
}

/* The kernel's tensor maps: each cache as [num_slots][Hkv][head size] 16-bit elements, one copy =
 * [block_size slots][1 head][64 dims], 128-byte swizzled (DECODE_TMA uses them too, where the
 * driver refuses its 5-D view).  The encoding is host arithmetic (no device work), redone per
 * launch.  cudaErrorNotSupported when the driver cannot encode them (the backend checks this at
 * open and then never plans the kernel). */
static cudaError_t wgmma_tensor_maps(const ar_attn_args *a, CUtensorMap *mk, CUtensorMap *mv)
{
    memset(mk, 0, sizeof *mk);
    memset(mv, 0, sizeof *mv);
    const uint64_t hd = (uint64_t)a->head_size;
    const uint64_t dims[3] = {hd, (uint64_t)a->num_kv_heads, (uint64_t)a->num_slots};
    const uint64_t strides[2] = {hd * 2, (uint64_t)a->num_kv_heads * hd * 2};
    const uint32_t box[3] = {64, 1, 1u << a->block_size_log2};
    char err[256];
    if (ar_tma_encode(mk, a->k_cache, 3, dims, strides, box, "cuda", err, sizeof err) ||
        ar_tma_encode(mv, a->v_cache, 3, dims, strides, box, "cuda", err, sizeof err))
        return cudaErrorNotSupported;
    return cudaSuccess;
}

/* The Q tensor map of the kernel: Q as [num_tokens][Hq][head size] 16-bit elements, one copy =
 * [ROWS / group tokens][group heads][64 dims] (ROWS = 128, a tile's rows at either head size),
 * 128-byte swizzled.  1 when encoded (the group divides ROWS and the driver took the shape), else
 * 0 (the kernel copies Q by cp.async). */
static int wgmma_q_map(const ar_attn_args *a, CUtensorMap *mq)
{
    constexpr int ROWS = WgGeom<128>::ROWS;
    static_assert(WgGeom<256>::ROWS == ROWS, "one Q box for both head sizes");
    memset(mq, 0, sizeof *mq);
    const int grp = a->group;
    if (grp < 1 || grp > ROWS || ROWS % grp != 0 || a->num_tokens < 1) return 0;
    const uint64_t hd = (uint64_t)a->head_size;
    const uint64_t dims[3] = {hd, (uint64_t)a->num_q_heads, (uint64_t)a->num_tokens};
    const uint64_t strides[2] = {hd * 2, (uint64_t)a->num_q_heads * hd * 2};
    const uint32_t box[3] = {64, (uint32_t)grp, (uint32_t)(ROWS / grp)};
    char err[256];
    return ar_tma_encode(mq, a->q, 3, dims, strides, box, "cuda", err, sizeof err) == 0;
}

/* HD: 128 or 256, the launch's exact head size */
template <typename T, int HD>
static cudaError_t launch_wgmma(const ar_attn_args *a, int num_work, cudaStream_t stream)
{
    if (num_work <= 0) return cudaSuccess;
    if (!a->wg_next_item) return cudaErrorInvalidValue;
    CUtensorMap mk, mv;
    cudaError_t e = wgmma_tensor_maps(a, &mk, &mv);
    if (e != cudaSuccess) return e;
    /* Q by TMA where a tile's ROWS rows are whole tokens' head groups (wgmma_q_map) */
    CUtensorMap mq;
    const int q_by_tma = wgmma_q_map(a, &mq);
    const int ctas = ar_attn_wg_ctas(a->persistent_ctas, num_work);
    attn_wgmma_kernel<T, HD><<<ctas, WgPipe<HD>::THREADS, WgPipe<HD>::SMEM, stream>>>(*a, mk, mv, mq, q_by_tma, num_work);
    return cudaGetLastError();
}

template <typename T, int HD>
static cudaError_t attributes_wgmma(int *ctas_per_sm)
{
    const int smem = (int)WgPipe<HD>::SMEM;
    cudaError_t e = cudaFuncSetAttribute(attn_wgmma_kernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, attn_wgmma_kernel<T, HD>, WgPipe<HD>::THREADS,
                                                         smem);
}

} /* namespace ar_attn */

#endif
