/* cuda_attn_wgmma.cuh - the Hopper (sm_90a) variant of the paged attention kernel: the same work
 * items, masks, faults and outputs as attn_kernel (cuda_attn.cuh), with the two matrix products
 * on wgmma (warpgroup MMA) instead of mma.sync.  Configs AR_CFG_PREFILL_WG, _PIPE, _PINGPONG,
 * _WS, _WS_OVERLAP, _TMA and _TMA_QREG (seven ways of feeding the same products, see WgStages
 * and attn_wgmma_kernel's MODE; the automatic plan runs _TMA_QREG, or _WS where the driver
 * cannot encode tensor maps, see cuda_backend.cu), head size 128 exactly.
 *
 * Geometry: one CTA = 2 warpgroups (256 threads) = 128 rows (64 per warpgroup), key tiles of 128
 * (the _WS configs add a producer warpgroup in front: 384 threads).
 * Shared memory holds Q [128 rows x 128 dims] and two (or three) stages of K and V [128 keys x
 * 128 dims], all in the 128-byte-swizzled K-major layout wgmma reads: each tile is two column
 * halves (dims 0-63, 64-127) of [rows][128 bytes], and the 16-byte chunk c of row r is stored at chunk
 * position c ^ (r & 7) (every half starts on a 1024-byte boundary, so the hardware's address
 * swizzle and ours agree).
 *   S = Q K^T : wgmma m64n128k16, A = Q and B = K from shared memory (both K-major), 8 steps of
 *               16 dims (_TMA_QREG: A = Q from registers).
 *   O += P V  : wgmma m64n128k16 with A = P from registers (the S accumulator converted in
 *               place: the accumulator layout of one product is the A-fragment layout of the
 *               next) and B = V from shared memory read transposed (dims are the N side and
 *               are contiguous: "MN-major"), 8 steps of 16 keys.
 * The online softmax is the one of attn_kernel (log2 domain, skip the rescale when no row max
 * moved).  Loads are cp.async by all 256 threads (one 256-byte K or V row = 16 threads), one
 * tile ahead (two with the mbarrier pipeline), or, in the _WS configs, by the producer
 * warpgroup alone (in the _TMA ones as bulk tensor copies for every whole tile).  The kernel body exists only in the sm_90a build; the host picks these
 * configs only on a compute-capability 9.0 device (cuda_backend.cu). */
#ifndef AR_CUDA_ATTN_WGMMA_CUH
#define AR_CUDA_ATTN_WGMMA_CUH

#include <string.h>

#include "cuda_host.cuh"
#include "cuda_wgmma.cuh"

namespace ar_attn {

struct WgGeom {
    static constexpr int HD = 128;
    static constexpr int ROWS = 128;            /* 2 warpgroups x 64 rows */
    static constexpr int BLOCK_N = 128;
    static constexpr int THREADS = 256;
    static constexpr int HALF_BYTES = 128 * 128; /* one column half of a 128-row tile: [128][128 B] */
    static constexpr int TILE_BYTES = 2 * HALF_BYTES;
};

/* PIPE = false: two K/V stages and one __syncthreads per tile (both warpgroups in lockstep).
 * PIPE = true (AR_CFG_PREFILL_WG_PIPE): three stages handed over by mbarriers - "full[s]"
 * completes when every thread's cp.async copies into stage s have landed
 * (cp.async.mbarrier.arrive.noinc), "empty[s]" when all 256 threads are done reading it - so a
 * warpgroup may run up to a tile ahead of the other and one's softmax overlaps the other's
 * matrix products.  MODE 3 (WS, AR_CFG_PREFILL_WG_WS) adds a producer warpgroup in front of the
 * two consumers: it alone issues the copies (K and V of a stage complete on separate barriers,
 * full[s] and full_v[s]), so a consumer never waits for the other one's progress to refill a
 * stage it is not about to read, and setmaxnreg moves registers from the producer (32; 40 with TMA, 24 with
 * the overlap) to the consumers (232; 240).  Its waits ask the hardware to suspend the waiting
 * warp (mbar_wait_suspend) rather than spin on the schedulers the consumers issue from.
 * MODE 5 (AR_CFG_PREFILL_WG_TMA) is MODE 3 with the copies of every tile that lies wholly inside
 * the sequence done by the tensor memory accelerator: lanes of producer warp 0 each issue one
 * bulk tensor copy of a cache page's 64-dim half (box [block_size rows][64 dims], TMA's 128-byte
 * swizzle = ours, as it is address based) onto the stage's barrier, whose expected byte count
 * lane 0 raised first.  The last, partial tile keeps the cp.async path: its rows past seq_len
 * must be zeros (V is multiplied by P = 0 there, and an unwritten cache slot holds NaN).  A
 * full / full_v phase then takes 129 arrivals: every producer thread's cp.async arrival (at
 * once when it issued none) and producer thread 0's (with the byte count, or plain).
 * MODE 6 (AR_CFG_PREFILL_WG_TMA_QREG) is MODE 5 with each consumer's Q fragments held in 32
 * registers (loaded once by ldmatrix) and S = Q K^T issued with A from registers, so the
 * tensor cores read only K from shared memory for S (32 of the 48 KB a warpgroup's S read per
 * tile).  The fragments are zeroed before the conditional load: left undefined on the path
 * without tiles, ptxas (13.0) treated them as dead across the key loop and gave their registers
 * to P (seen in the SASS on the H200: the softmax wrote them, S of the second tile was wrong).
 * (MODE 4's overlap fed by MODE 5's producer was measured too and dropped: 1417 us against
 * 1169 for MODE 5 on the causal prefill, BENCHMARKS.md.) */
template <int MODE> struct WgStages {
    static constexpr bool PIPE = MODE >= 1;
    static constexpr bool WS = MODE >= 3;
    static constexpr bool TMA = MODE == 5 || MODE == 6; /* AR_CFG_PREFILL_WG_TMA, _TMA_QREG */
    static constexpr bool OVERLAP = MODE == 4;          /* AR_CFG_PREFILL_WG_WS_OVERLAP */
    static constexpr bool QREG = MODE == 6;             /* AR_CFG_PREFILL_WG_TMA_QREG */
    static constexpr int THREADS = WS ? 384 : 256;     /* WS: + the producer warpgroup */
    static constexpr int STAGES = PIPE ? 3 : 2;
    static constexpr int NUM_BARS = WS ? 3 * STAGES : PIPE ? 2 * STAGES : 0;
    static constexpr size_t BAR_OFFSET = (size_t)WgGeom::TILE_BYTES * (1 + 2 * STAGES);
    static constexpr size_t SMEM = 1024 /* alignment slack */ + BAR_OFFSET + NUM_BARS * 8;
};

/* Ping-pong turns on named barriers 1 (warpgroup 0's turn) and 2 (warpgroup 1's): 256 threads
 * each, the 128 of the waiting warpgroup (bar.sync) and the 128 of the signalling one
 * (bar.arrive).  Per tile every warpgroup waits for its turn once and hands the turn over once,
 * active or not; warpgroup 1 signals once before the loop and skips its last hand-over, so
 * arrivals and waits pair up exactly on both barriers. */
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

/* Byte offset of (row, 16-byte chunk 0..15) in a swizzled 128-row tile. */
__device__ __forceinline__ uint32_t wg_swizzle(int row, int chunk)
{
    return (uint32_t)((chunk >> 3) * WgGeom::HALF_BYTES + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

/* d [64 rows x 128 cols of this warpgroup, accumulator layout] (+)= A (desc_a) B (desc_b). */
template <typename T> __device__ __forceinline__ void wgmma_ss(float d[64], uint64_t desc_a, uint64_t desc_b, int accumulate);
/* d += A (a: this thread's 4 registers of the 64 x 16 A tile) B (desc_b, read transposed). */
template <typename T> __device__ __forceinline__ void wgmma_rs(float d[64], const uint32_t a[4], uint64_t desc_b);
/* d [64 x 128] (+)= A (a: registers) B (desc_b, K-major like wgmma_ss's B): S = Q K^T with Q in
 * registers. */
template <typename T> __device__ __forceinline__ void wgmma_rs_kmajor(float d[64], const uint32_t a[4], uint64_t desc_b, int accumulate);

/* true for __nv_bfloat16, false for __half: which operand type a wrapper's instruction names */
template <typename T> struct wg_is_bf16 { static constexpr bool value = false; };
template <> struct wg_is_bf16<__nv_bfloat16> { static constexpr bool value = true; };

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The inline-assembly pieces of the two wrappers: the 64 accumulator operands ("+f"(d[0]) ..
 * "+f"(d[63])) and each instruction's text with the operand type (TY: ".bf16" or ".f16") left
 * open - the one difference between the bf16 and fp16 versions. */
#define WG_ACC64(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), \
    "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), \
    "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), \
    "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), \
    "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), \
    "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
    "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), \
    "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define WGMMA_SS_TEXT(TY) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32" TY TY " " \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
/* A from registers; TNSP "1": B read transposed (MN-major, V), "0": B K-major (K); the
 * accumulate flag is operand 69 */
#define WGMMA_RS_TEXT(TY, TNSP) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32" TY TY " " \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, " \
    "1, 1, " TNSP ";\n}\n"

template <typename T> __device__ __forceinline__ void wgmma_ss(float d[64], uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    if constexpr (wg_is_bf16<T>::value)
        asm volatile(WGMMA_SS_TEXT(".bf16") : WG_ACC64(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    else
        asm volatile(WGMMA_SS_TEXT(".f16") : WG_ACC64(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
template <typename T> __device__ __forceinline__ void wgmma_rs(float d[64], const uint32_t a[4], uint64_t desc_b)
{
    if constexpr (wg_is_bf16<T>::value)
        asm volatile(WGMMA_RS_TEXT(".bf16", "1") : WG_ACC64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
    else
        asm volatile(WGMMA_RS_TEXT(".f16", "1") : WG_ACC64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}
template <typename T> __device__ __forceinline__ void wgmma_rs_kmajor(float d[64], const uint32_t a[4], uint64_t desc_b, int accumulate)
{
    if constexpr (wg_is_bf16<T>::value)
        asm volatile(WGMMA_RS_TEXT(".bf16", "0") : WG_ACC64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
    else
        asm volatile(WGMMA_RS_TEXT(".f16", "0") : WG_ACC64(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
#undef WG_ACC64
#undef WGMMA_SS_TEXT
#undef WGMMA_RS_TEXT
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

#ifdef AR_WG_TRACE
/* Diagnostic build only (-DAR_WG_TRACE; see the trace comment in attn_wgmma_kernel): where the
 * kernel leaves its clock stamps - CTA 0's phase stamps per warpgroup and tile, and every
 * CTA's clock and global timer at the start and the end of its key loop - and the one-thread
 * launch that prints them after each wgmma launch ("WGC": cycles per CTA, the SM clock they
 * imply, first start to last end; "WGT": one line per tile; a tile CTA 0 did not reach prints
 * an earlier launch's values). */
constexpr int WG_TRACE_TILES = 24;
static __device__ long long wg_trace_buf[2][WG_TRACE_TILES][8];
static __device__ long long wg_trace_t0[2];
static __device__ long long wg_trace_cta[1024][4];   /* per CTA: clock and globaltimer at start and end */
__device__ __forceinline__ long long wg_globaltimer()
{
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
static __global__ void wg_trace_print(int mode, int n_tiles, int num_ctas)
{
    long long cmin = 1LL << 62, cmax = 0, csum = 0, t_first = 1LL << 62, t_last = 0;
    double ghz = 0.0;
    for (int c = 0; c < num_ctas && c < 1024; c++) {
        const long long cyc = wg_trace_cta[c][2] - wg_trace_cta[c][0], ns = wg_trace_cta[c][3] - wg_trace_cta[c][1];
        cmin = cyc < cmin ? cyc : cmin;
        cmax = cyc > cmax ? cyc : cmax;
        csum += cyc;
        ghz += ns > 0 ? (double)cyc / ns : 0.0;
        t_first = wg_trace_cta[c][1] < t_first ? wg_trace_cta[c][1] : t_first;
        t_last = wg_trace_cta[c][3] > t_last ? wg_trace_cta[c][3] : t_last;
    }
    if (num_ctas > 0)
        printf("WGC mode=%d ctas=%d cycles min=%lld avg=%lld max=%lld clock_ghz=%.3f span_us=%.1f\n", mode, num_ctas, cmin,
               csum / num_ctas, cmax, ghz / (num_ctas < 1024 ? num_ctas : 1024), (t_last - t_first) * 1e-3);
    for (int it = 0; it < n_tiles && it < WG_TRACE_TILES; it++)
        for (int wg = 0; wg < 2; wg++) {
            const long long *t = wg_trace_buf[wg][it];
            printf("WGT mode=%d wg=%d it=%d t0=%lld kw=%lld turn=%lld sis=%lld sw=%lld smx=%lld vw=%lld pv=%lld\n", mode, wg,
                   it, t[0] - wg_trace_t0[wg], t[1] - t[0], t[2] - t[1], t[3] - t[2], t[4] - t[3], t[5] - t[4], t[6] - t[5],
                   t[7] - t[6]);
        }
}
#endif

/* MODE 0: lockstep (AR_CFG_PREFILL_WG); 1: mbarrier pipeline (AR_CFG_PREFILL_WG_PIPE); 2: the
 * pipeline plus a ping-pong turn (AR_CFG_PREFILL_WG_PINGPONG, FlashAttention-3's warpgroup
 * scheduling): a warpgroup issues its S = Q K^T only in its turn (named barriers 1 and 2), so
 * the other one's softmax runs while its products occupy the tensor cores.  MODE 3
 * (AR_CFG_PREFILL_WG_WS): the ping-pong kernel fed by a producer warpgroup (see WgStages).
 * MODE 5 (AR_CFG_PREFILL_WG_TMA): MODE 3 with TMA copies; MODE 6 (AR_CFG_PREFILL_WG_TMA_QREG,
 * the automatic choice): MODE 5 with Q in registers (both in WgStages).
 * MODE 4 (AR_CFG_PREFILL_WG_WS_OVERLAP): MODE 3 plus
 * FlashAttention-3's intra-warpgroup overlap (S of tile t in flight with P V of tile t - 1); it
 * fits only with the consumers' 240 registers (without the producer split, at 255, an earlier
 * version spilled and ran at 225 TFLOP/s), and on the H200 it stays slower than MODE 3
 * (BENCHMARKS.md, "Warp specialisation"). */
template <typename T, int MODE>
__global__ void __launch_bounds__(WgStages<MODE>::THREADS, 1)
attn_wgmma_kernel(const ar_attn_args a,
                  const __grid_constant__ CUtensorMap tmap_k,  /* MODES 5, 6: K cache [num_slots][Hkv][128], box [bs][1][64] */
                  const __grid_constant__ CUtensorMap tmap_v)  /* the same for the V cache; unused by other modes */
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr bool PIPE = MODE >= 1, PINGPONG = MODE >= 2, WS = MODE >= 3, OVERLAP = WgStages<MODE>::OVERLAP;
    constexpr bool TMA = WgStages<MODE>::TMA, QREG = WgStages<MODE>::QREG;
    constexpr int HD = WgGeom::HD, BLOCK_N = WgGeom::BLOCK_N, ROWS = WgGeom::ROWS;
    constexpr int CHUNKS = HD / 8;                       /* 16-byte chunks per row */
    constexpr int LOADERS = WS ? 128 : WgGeom::THREADS;  /* threads that issue the copies */
    constexpr int LOADS = BLOCK_N * CHUNKS / LOADERS;    /* chunks per loader per K (or V) tile */
    extern __shared__ __align__(1024) unsigned char wg_smem_raw[];
    const uint32_t smem_base0 = (uint32_t)__cvta_generic_to_shared(wg_smem_raw);
    const uint32_t pad = (1024 - (smem_base0 & 1023)) & 1023;
    unsigned char *smem = wg_smem_raw + pad;
    const uint32_t sq_addr = smem_base0 + pad;          /* Q tile */
    const uint32_t skv_addr = sq_addr + WgGeom::TILE_BYTES; /* stage s: K at + 2s tiles, V at + 2s+1 */
    constexpr int STAGES = WgStages<MODE>::STAGES;
    /* PIPE: full[STAGES] (K and V of a stage landed; WS: K only), empty[STAGES] (both consumer
     * warpgroups are done with a stage); WS: full_v[STAGES] (V landed) */
    const uint32_t full_bar = sq_addr + (uint32_t)WgStages<MODE>::BAR_OFFSET;
    const uint32_t empty_bar = full_bar + STAGES * 8;
    const uint32_t full_v_bar = WS ? empty_bar + STAGES * 8 : full_bar;
    if (PIPE && threadIdx.x == 0) {
        for (int st = 0; st < STAGES; st++) {
            ar_wg::mbar_init(full_bar + st * 8, LOADERS + (TMA ? 1 : 0));
            ar_wg::mbar_init(empty_bar + st * 8, WgGeom::THREADS);
            if (WS) ar_wg::mbar_init(full_v_bar + st * 8, LOADERS + (TMA ? 1 : 0));
        }
    }

    const ar_attn_work w = a.work[blockIdx.x];
    /* WS: warpgroup 0 of the CTA is the producer (tid < 128, loads only); the consumer threads
     * are numbered from 0 after it, so everything below the loads reads as in the other modes */
    const bool producer = WS && threadIdx.x < 128;
    const int tid = WS && !producer ? (int)threadIdx.x - 128 : (int)threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2;                           /* warpgroup: rows 64 wg .. 64 wg + 63 */
    const int g = lane >> 2, tq = lane & 3;

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

    /* Q tile -> shared (rows past the request zero-filled), by the loaders */
    if (!WS || producer) {
#pragma unroll
        for (int k = 0; k < ROWS * CHUNKS / LOADERS; k++) {
            int i = tid + k * LOADERS, r = i / CHUNKS, c = i % CHUNKS;
            int pair = w.pair0 + r, tok = pair / grp, hq = w.kv_head * grp + pair % grp;
            bool ok = tok < q_len;
            const T *src = ok ? qg + ((int64_t)(qstart + tok) * a.num_q_heads + hq) * HD + c * 8 : qg;
            cp_async16(smem + wg_swizzle(r, c), src, ok);
        }
        cp_async_commit();
    }

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
    /* copies of tile it into its stage by the loaders: parts 3 = K and V, 1 = K, 2 = V */
    auto load_kv = [&](int it, int parts) {
        int t = w.tile_begin + it;
        uint32_t stage_off = (uint32_t)((it % STAGES) * 2 * WgGeom::TILE_BYTES);
        unsigned char *sk = smem + WgGeom::TILE_BYTES + stage_off;
        unsigned char *sv = sk + WgGeom::TILE_BYTES;
        int slots[LOADS];
#pragma unroll
        for (int k = 0; k < LOADS; k++) {
            int j = t * BLOCK_N + (tid + k * LOADERS) / CHUNKS;
            slots[k] = j < seq_len ? (__ldg(bt + (j >> bs_log2)) << bs_log2) + (j & bs_mask) : -1;
        }
#pragma unroll
        for (int k = 0; k < LOADS; k++) {
            int i = tid + k * LOADERS, key = i / CHUNKS, c = i % CHUNKS;
            bool ok = slots[k] >= 0;
            int64_t off = ok ? (int64_t)slots[k] * head_stride + c * 8 : 0;
            uint32_t at = wg_swizzle(key, c);
            if (parts & 1) cp_async16(sk + at, kg + off, ok);
            if (parts & 2) cp_async16(sv + at, vg + off, ok);
        }
    };

    /* The producer's copies.  Producer warp pw copies keys 32 pw .. 32 pw + 31 of a tile; lane
     * j first looks up the cache slot of key 32 pw + j (-1 past the sequence: zero fill), once
     * per tile for K and V; then lane l copies 16-byte chunk l % 16 of keys 32 pw + l / 16 + 2 m
     * (m = 0..15, two whole 256-byte rows per instruction), taking each slot from its owner lane
     * by a shuffle instead of a block-table load per copy. */
    auto producer_slot = [&](int it) {
        const int j = (w.tile_begin + it) * BLOCK_N + (tid & ~31) + (tid & 31);
        return j < seq_len ? (__ldg(bt + (j >> bs_log2)) << bs_log2) + (j & bs_mask) : -1;
    };
    auto produce = [&](int it, int v, int my_slot) {
        const int c = tid & 15, half_row = (tid >> 4) & 1, key_base = tid & ~31;
        const uint32_t dst0 = sq_addr + (uint32_t)((1 + 2 * (it % STAGES) + v) * WgGeom::TILE_BYTES +
                                                   (c >> 3) * WgGeom::HALF_BYTES);
        const T *src = (v ? vg : kg) + c * 8;
#pragma unroll 4
        for (int m = 0; m < 16; m++) {
            const int key = key_base + half_row + 2 * m;
            const int slot = __shfl_sync(0xffffffffu, my_slot, half_row + 2 * m);
            const uint32_t dst = dst0 + (uint32_t)(key * 128 + (((c & 7) ^ (key & 7)) << 4));
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
                         "l"(src + (int64_t)(slot < 0 ? 0 : slot) * head_stride), "r"(slot < 0 ? 0 : 16));
        }
    };

    /* MODES 5, 6: the cache block lane l of producer warp 0 copies for tile it.  The producer
     * reads it before it waits for the stage to empty, so the block-table latency is off the
     * refill's path (5% of the cascade prefix pass on the H200, BENCHMARKS.md). */
    auto tma_block = [&](int it) {
        const int pages = BLOCK_N >> bs_log2;
        if (lane >= 2 * pages) return 0;
        return __ldg(bt + (((w.tile_begin + it) * BLOCK_N) >> bs_log2) + (lane >= pages ? lane - pages : lane));
    };
    /* MODES 5, 6: tile it (wholly inside the sequence) into its stage by TMA; K (v = 0) or V (v = 1).
     * Run by producer warp 0: lane 0 raises the barrier's byte count by the whole tile, then
     * lane l < 2 x pages copies page l % pages (cache block `block`, from tma_block) of the
     * tile's column half l / pages. */
    auto produce_tma = [&](int it, int v, int block) {
        const int pages = BLOCK_N >> bs_log2;
        const uint32_t bar = (v ? full_v_bar : full_bar) + (uint32_t)((it % STAGES) * 8);
        const uint32_t dst0 = sq_addr + (uint32_t)((1 + 2 * (it % STAGES) + v) * WgGeom::TILE_BYTES);
#ifdef AR_WG_NOLOAD
        /* Diagnostic build only (wrong results): after the first STAGES tiles the producer
         * hands over its stages without copying, so the consumers run on stale tiles with no
         * TMA writes into shared memory beside their products. */
        if (it >= STAGES) {
            if (lane == 0) ar_wg::mbar_arrive(bar);
            return;
        }
#endif
        if (lane == 0) ar_wg::mbar_arrive_expect_tx(bar, WgGeom::TILE_BYTES);
        __syncwarp();
        if (lane < 2 * pages) {
            const int half = lane >= pages ? 1 : 0, page = lane - half * pages;
            ar_wg::tma_load_3d(dst0 + (uint32_t)(half * WgGeom::HALF_BYTES + (page << bs_log2) * 128),
                               v ? (const void *)&tmap_v : (const void *)&tmap_k, bar, half * 64, kvh_load,
                               block << bs_log2);
        }
    };

#ifdef AR_WG_TRACE
    /* Diagnostic build only (-DAR_WG_TRACE, e.g. NVCCFLAGS of a separate BUILD): lane 0 of each
     * consumer warpgroup's first warp in CTA 0 stamps the phases of its first WG_TRACE_TILES
     * tiles of the non-overlapped loop with the SM clock into wg_trace_buf; wg_trace_print, a
     * separate launch, prints one "WGT" line per tile (kw: K wait, turn: ping-pong wait, sis:
     * S issued, sw: S waited for, smx: softmax and rescale, vw: V wait, pv: P V issued and
     * waited for).  The stamps go to global memory, not to printf: a call in this kernel makes
     * ptxas serialise every wgmma (C7510), which is what session 5's trace measured. */
    const bool wg_trace = blockIdx.x == 0 && !producer && (tid & 127) == 0;
    if (wg_trace) wg_trace_t0[wg] = clock64();
    if (!producer && tid == 0 && blockIdx.x < 1024) {
        wg_trace_cta[blockIdx.x][0] = clock64();
        wg_trace_cta[blockIdx.x][1] = wg_globaltimer();
    }
#define WG_STAMP(it, k) do { if (wg_trace && (it) < WG_TRACE_TILES) wg_trace_buf[wg][it][k] = clock64(); } while (0)
#else
#define WG_STAMP(it, k) do { } while (0)
#endif
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;
    float row_m[2] = {-INFINITY, -INFINITY}, row_l[2] = {0.f, 0.f};
    /* V read transposed ("MN-major"): the leading byte offset steps between the two 64-dim
     * atoms along N (a column half apart), the stride byte offset between groups of 8 keys
     * (1024 bytes); checked against a CPU product on the H200 by a layout probe, 2026-11-30. */
    const uint32_t v_lbo = WgGeom::HALF_BYTES, v_sbo = 1024;

    /* S = Q K^T of the tile in stage sk_addr into sd (issued, not waited for) */
    /* QREG: this thread's A fragments of its warpgroup's 64 Q rows, 8 k-steps of 16 dims
     * (loaded once the Q tile has landed, below; zero until then, see WgStages) */
    uint32_t qa[QREG ? HD / 16 : 1][4];
#pragma unroll
    for (int kk = 0; kk < (QREG ? HD / 16 : 1); kk++) qa[kk][0] = qa[kk][1] = qa[kk][2] = qa[kk][3] = 0u;
    /* The k-steps' descriptors are the tile's plus the step's offset in 16-byte units: shared
     * addresses stay below 2^18, so the 14-bit address field never carries into the next. */
    auto issue_s = [&](float (&sd)[64], uint32_t sk_addr) {
        ar_wg::fence();
        const uint64_t db0 = ar_wg::desc_sw128(sk_addr, 16, 1024);
        const uint64_t da0 = ar_wg::desc_sw128(sq_addr + (uint32_t)wg_row0 * 128, 16, 1024);
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            const uint32_t koff16 = (uint32_t)((kk >> 2) * WgGeom::HALF_BYTES + (kk & 3) * 32) >> 4;
            if constexpr (QREG) {
                wgmma_rs_kmajor<T>(sd, qa[kk], db0 + koff16, kk > 0);
            } else {
                wgmma_ss<T>(sd, da0 + koff16, db0 + koff16, kk > 0);
            }
        }
    };
    /* P [64 x 128 of this warpgroup, accumulator layout] -> pa, the A fragments of the 8
     * k-steps of 16 keys (the accumulator layout of one product is the A layout of the next) */
    auto pack_p = [&](const float (&sc)[64], uint32_t (&pa)[8][4]) {
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            pa[kk][0] = pack2<T>(sc[8 * kk + 0], sc[8 * kk + 1]);
            pa[kk][1] = pack2<T>(sc[8 * kk + 2], sc[8 * kk + 3]);
            pa[kk][2] = pack2<T>(sc[8 * kk + 4], sc[8 * kk + 5]);
            pa[kk][3] = pack2<T>(sc[8 * kk + 6], sc[8 * kk + 7]);
        }
    };
    /* soft cap, mask, online softmax of the scores sc of tile t; P -> pa (A fragments of 8
     * k-steps of 16 keys) and each row's rescale factor for acc -> alpha (rescale_acc applies
     * it: right away, or in the overlapped mode once the P V in flight has landed in acc) */
    auto softmax_to_p = [&](float (&sc)[64], int t, uint32_t (&pa)[8][4], float (&alpha_out)[2]) {
        const int tile_first = t * BLOCK_N, tile_last = tile_first + BLOCK_N - 1;
#ifdef AR_WG_NOSMX
        /* Diagnostic build only (wrong results): P = S as it is, no mask or exponentials, so
         * the loop's time is the products and the K/V stream (the condition only keeps the
         * code below reachable for the compiler) */
        pack_p(sc, pa);
        alpha_out[0] = alpha_out[1] = 1.f;
        if (tile_first >= 0) return;
#endif
        if (a.soft_cap > 0.f) {
            const float scale = scale_log2 * 0.6931471805599453f;
            const float cap_over_scale = a.soft_cap / scale, inv_cap = scale / a.soft_cap;
#pragma unroll
            for (int i = 0; i < 64; i++) sc[i] = cap_over_scale * tanhf(sc[i] * inv_cap);
        }
        const bool need_mask = tile_last > wg_min_qpos + causal_extra || tile_last >= seq_len ||
                               (window > 0 && tile_first < wg_max_qpos - window + 1);
        if (need_mask) {
#pragma unroll
            for (int i = 0; i < 64; i++) {
                int j = tile_first + (i >> 2) * 8 + 2 * tq + (i & 1);
                int p = qpos[(i >> 1) & 1];
                bool vis = j < seq_len && j <= p + causal_extra && (window <= 0 || j >= p - window + 1);
                if (!vis) sc[i] = -INFINITY;
            }
        }
        /* online softmax (log2 domain); element i is row (i >> 1) & 1, column (i >> 2) * 8 + 2 tq + (i & 1) */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < 16; n++) mx = fmaxf(mx, fmaxf(sc[4 * n + 2 * r], sc[4 * n + 2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float m_new = fmaxf(row_m[r], mx);
            float m_scaled = m_new == -INFINITY ? 0.f : m_new * scale_log2;
            float alpha = exp2f(row_m[r] * scale_log2 - m_scaled);
            row_m[r] = m_new;
            float rs = 0.f;
#pragma unroll
            for (int n = 0; n < 16; n++) {
                float p0 = exp2f(fmaf(sc[4 * n + 2 * r], scale_log2, -m_scaled));
                float p1 = exp2f(fmaf(sc[4 * n + 2 * r + 1], scale_log2, -m_scaled));
                sc[4 * n + 2 * r] = p0;
                sc[4 * n + 2 * r + 1] = p1;
                rs += p0 + p1;
            }
            row_l[r] = row_l[r] * alpha + rs;
            alpha_out[r] = alpha;
        }
        pack_p(sc, pa);
    };
    auto rescale_acc = [&](const float (&alpha)[2]) {
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (!no_rescale && __any_sync(0xffffffffu, alpha[r] != 1.f)) {
#pragma unroll
                for (int n = 0; n < 16; n++) {
                    acc[4 * n + 2 * r] *= alpha[r];
                    acc[4 * n + 2 * r + 1] *= alpha[r];
                }
            }
    };
    /* O += P V of the tile in stage sv_addr (issued, not waited for); fenced = false when the
     * caller fenced acc and the warpgroup before an S issued just ahead in the same stage (a
     * register fence between the two would make ptxas serialise them) */
    auto issue_pv = [&](const uint32_t (&pa)[8][4], uint32_t sv_addr, bool fenced = true) {
        if (fenced) {
            ar_wg::fence_regs(acc);
            ar_wg::fence();
        }
        const uint64_t dv0 = ar_wg::desc_sw128(sv_addr, v_lbo, v_sbo);
#pragma unroll
        for (int kk = 0; kk < 8; kk++) wgmma_rs<T>(acc, pa[kk], dv0 + (uint64_t)(kk * 2048 >> 4));
    };

    if (PIPE) {
        __syncthreads();                                /* the barriers are initialised */
        if (WS) {
            if (producer) {
                /* the producer warpgroup: gives up registers, then fills stage it % STAGES with
                 * tile it as soon as both consumers released the tile it - STAGES in it; K and
                 * V complete on separate barriers so S = Q K^T starts before V has landed (the
                 * first K barrier also covers Q: its copies are older) */
                /* 168 at entry (384 threads, 64K registers); the TMA producer keeps 40
                 * (its cp.async tail path spills at 32), 128 x (168 - 40) = 2 x 128 x (232 - 168) */
                ar_wg::setmaxnreg_dec<OVERLAP ? 24 : TMA ? 40 : 32>();
                if (TMA && tid == 0) {
                    ar_wg::tma_prefetch_map(&tmap_k);
                    ar_wg::tma_prefetch_map(&tmap_v);
                }
                for (int it = 0; it < n_tiles; it++) {
                    const int stage = it % STAGES;
                    const bool by_tma = TMA && (w.tile_begin + it + 1) * BLOCK_N <= seq_len;
                    const int my_slot = by_tma ? (warp == 0 ? tma_block(it) : 0) : producer_slot(it);
                    if (it >= STAGES) ar_wg::mbar_wait_suspend(empty_bar + stage * 8, (uint32_t)((it / STAGES - 1) & 1));
                    if (by_tma) {
                        if (warp == 0) produce_tma(it, 0, my_slot);
                    } else {
                        produce(it, 0, my_slot);
                        if (TMA && tid == 0) ar_wg::mbar_arrive(full_bar + stage * 8);
                    }
                    ar_wg::mbar_arrive_cp_async(full_bar + stage * 8);
                    if (by_tma) {
                        if (warp == 0) produce_tma(it, 1, my_slot);
                    } else {
                        produce(it, 1, my_slot);
                        if (TMA && tid == 0) ar_wg::mbar_arrive(full_v_bar + stage * 8);
                    }
                    ar_wg::mbar_arrive_cp_async(full_v_bar + stage * 8);
                }
                cp_async_wait<0>();
                return;
            }
            ar_wg::setmaxnreg_inc<OVERLAP ? 240 : 232>();
            if (QREG && n_tiles > 0) {
                /* Q landed with the first stage's K (its copies are older); ldmatrix x4: lanes
                 * 0-15 address rows 0-15 of this warp's 16 at the k-step's first 8 dims, lanes
                 * 16-31 the same rows at its second 8 (the A-fragment order, checked against a
                 * CPU product on the H200) */
                ar_wg::mbar_wait_suspend(full_bar, 0);
                const int q_row = wg_row0 + (warp & 3) * 16 + (lane & 15);
#pragma unroll
                for (int kk = 0; kk < HD / 16; kk++) ldmatrix_x4(qa[kk], smem + wg_swizzle(q_row, 2 * kk + (lane >> 4)));
            }
        }
        if (PINGPONG && wg == 1 && n_tiles > 0) pingpong_signal(0);   /* warpgroup 0 goes first */
        for (int it = 0; !WS && it < STAGES - 1 && it < n_tiles; it++) {
            load_kv(it, 3);
            ar_wg::mbar_arrive_cp_async(full_bar + (it % STAGES) * 8);   /* (Q's copies are older: covered) */
        }
    } else {
        if (n_tiles > 0) load_kv(0, 3);
        cp_async_commit();
    }
    if constexpr (OVERLAP) {
        /* FlashAttention-3's intra-warpgroup overlap: in its turn a consumer issues S(it) and
         * then P V of tile it - 1; the softmax of tile it runs while that P V is on the tensor
         * cores, and acc is rescaled only once the P V has landed.  A warpgroup's active tiles
         * are one range [a0, a1) (the window cuts the front, causality the back), and every
         * wgmma is issued and waited for in straight-line code (a first tile, a steady loop, a
         * last P V): ptxas serialises the products of wgmma issued under a condition.  One turn
         * per tile as in _PINGPONG (the last P V takes none); every stage is released once this
         * warpgroup is done with it. */
        int a0 = n_tiles, a1 = n_tiles;
        for (int it = 0; it < n_tiles; it++) {
            const int tile_first = (w.tile_begin + it) * BLOCK_N, tile_last = tile_first + BLOCK_N - 1;
            const bool active = wg_has_rows && tile_first <= wg_max_qpos + causal_extra &&
                                !(window > 0 && tile_last < wg_min_qpos - window + 1);
            if (active && a0 == n_tiles) a0 = it;
            if (active) a1 = it + 1;
        }
        auto stage_k = [&](int it) { return skv_addr + (uint32_t)((it % STAGES) * 2 * WgGeom::TILE_BYTES); };
        auto wait_k = [&](int it) {
            ar_wg::mbar_wait_suspend(full_bar + (it % STAGES) * 8, (uint32_t)((it / STAGES) & 1));
            ar_wg::fence_proxy_async();
        };
        auto wait_v = [&](int it) {
            ar_wg::mbar_wait_suspend(full_v_bar + (it % STAGES) * 8, (uint32_t)((it / STAGES) & 1));
            ar_wg::fence_proxy_async();
        };
        auto release = [&](int it) { ar_wg::mbar_arrive(empty_bar + (it % STAGES) * 8); };
        int it = 0;
        for (; it < a0; it++) {                         /* inactive front */
            pingpong_turn(wg, it == n_tiles - 1);
            release(it);
        }
        if (a0 < a1) {
            uint32_t pa_prev[8][4];
            float alpha[2];
            {                                           /* the first active tile: S only */
                float s[64];
                wait_k(a0);
                pingpong_wait(wg);
                issue_s(s, stage_k(a0));
                ar_wg::commit();
                pingpong_turn_issued(wg, a0 == n_tiles - 1);
                ar_wg::wait<0>();
                ar_wg::fence_regs(s);
                softmax_to_p(s, w.tile_begin + a0, pa_prev, alpha);
                rescale_acc(alpha);
            }
            /* steady: S(it) with P V(it - 1); P alternates between two register sets (a copy
             * would let the register allocator merge them, and the softmax would then write
             * registers the P V in flight still reads) */
            uint32_t pa_next[8][4];
            auto steady = [&](int t_it, uint32_t (&p_in)[8][4], uint32_t (&p_out)[8][4]) {
                float s[64];
                wait_k(t_it);
                wait_v(t_it - 1);
                pingpong_wait(wg);
                ar_wg::fence_regs(acc);
                issue_s(s, stage_k(t_it));              /* (its wgmma.fence covers acc too) */
                ar_wg::commit();
                issue_pv(p_in, stage_k(t_it - 1) + WgGeom::TILE_BYTES, false);
                ar_wg::commit();
                pingpong_turn_issued(wg, t_it == n_tiles - 1);
                ar_wg::wait<1>();                       /* S(it) done, the P V may still run */
                ar_wg::fence_regs(s);
                softmax_to_p(s, w.tile_begin + t_it, p_out, alpha);
                ar_wg::wait<0>();
                ar_wg::fence_regs(acc);
#pragma unroll
                for (int kk = 0; kk < 8; kk++)          /* the P V read p_in until now */
                    asm volatile("" ::"r"(p_in[kk][0]), "r"(p_in[kk][1]), "r"(p_in[kk][2]), "r"(p_in[kk][3]));
                release(t_it - 1);
                rescale_acc(alpha);
            };
            it = a0 + 1;
            for (; it + 1 < a1; it += 2) {
                steady(it, pa_prev, pa_next);
                steady(it + 1, pa_next, pa_prev);
            }
            if (it < a1) {                              /* odd count: the last P is in pa_next */
                steady(it, pa_prev, pa_next);
#pragma unroll
                for (int kk = 0; kk < 8; kk++)
#pragma unroll
                    for (int e = 0; e < 4; e++) pa_prev[kk][e] = pa_next[kk][e];
            }
            wait_v(a1 - 1);                             /* the last active tile's P V */
            issue_pv(pa_prev, stage_k(a1 - 1) + WgGeom::TILE_BYTES);
            ar_wg::commit();
            ar_wg::wait<0>();
            ar_wg::fence_regs(acc);
            release(a1 - 1);
            it = a1;
        }
        for (; it < n_tiles; it++) {                    /* inactive back */
            pingpong_turn(wg, it == n_tiles - 1);
            release(it);
        }
    }
    for (int it = 0; !OVERLAP && it < n_tiles; it++) {
        const int stage = it % STAGES;
        if (PIPE) {
            /* refill the stage tile it - 1 used once both warpgroups are done with it (WS: the
             * producer does) */
            const int ahead = it + STAGES - 1;
            if (!WS && ahead < n_tiles) {
                if (it >= 1) ar_wg::mbar_wait(empty_bar + ((it - 1) % STAGES) * 8, (uint32_t)(((it - 1) / STAGES) & 1));
                load_kv(ahead, 3);
                ar_wg::mbar_arrive_cp_async(full_bar + (ahead % STAGES) * 8);
            }
        } else {
            cp_async_wait<0>();
            ar_wg::fence_proxy_async();                        /* cp.async writes -> the async proxy */
            __syncthreads();
            if (it + 1 < n_tiles) load_kv(it + 1, 3);
            cp_async_commit();
        }
        const int t = w.tile_begin + it;
        const int tile_first = t * BLOCK_N, tile_last = tile_first + BLOCK_N - 1;
        const bool active = wg_has_rows && tile_first <= wg_max_qpos + causal_extra &&
                            !(window > 0 && tile_last < wg_min_qpos - window + 1);
        if (!active) {                                  /* warpgroup-uniform */
            if (PINGPONG) pingpong_turn(wg, it == n_tiles - 1);
            if (PIPE) ar_wg::mbar_arrive(empty_bar + stage * 8);
            continue;
        }
        WG_STAMP(it, 0);
        if (PIPE) {
            if (WS) ar_wg::mbar_wait_suspend(full_bar + stage * 8, (uint32_t)((it / STAGES) & 1));
            else ar_wg::mbar_wait(full_bar + stage * 8, (uint32_t)((it / STAGES) & 1));
            ar_wg::fence_proxy_async();                        /* cp.async writes -> the async proxy */
        }
        WG_STAMP(it, 1);
        const uint32_t sk_addr = skv_addr + (uint32_t)(stage * 2 * WgGeom::TILE_BYTES);
        const uint32_t sv_addr = sk_addr + WgGeom::TILE_BYTES;

        float s[64];
        if (PINGPONG) pingpong_wait(wg);
        WG_STAMP(it, 2);
        issue_s(s, sk_addr);
        if (PINGPONG) pingpong_turn_issued(wg, it == n_tiles - 1);
        ar_wg::commit();
        WG_STAMP(it, 3);
        ar_wg::wait<0>();
        ar_wg::fence_regs(s);
        WG_STAMP(it, 4);
        uint32_t pa[8][4];
        float alpha[2];
        softmax_to_p(s, t, pa, alpha);
        rescale_acc(alpha);
        WG_STAMP(it, 5);
        if (WS) {
            ar_wg::mbar_wait_suspend(full_v_bar + stage * 8, (uint32_t)((it / STAGES) & 1));
            ar_wg::fence_proxy_async();
        }
        WG_STAMP(it, 6);
        issue_pv(pa, sv_addr);
        ar_wg::commit();
        ar_wg::wait<0>();
        ar_wg::fence_regs(acc);
        WG_STAMP(it, 7);
        if (PIPE) ar_wg::mbar_arrive(empty_bar + stage * 8);
    }

    if (!WS) cp_async_wait<0>();
#ifdef AR_WG_TRACE
    if (!producer && tid == 0 && blockIdx.x < 1024) {
        wg_trace_cta[blockIdx.x][2] = clock64();
        wg_trace_cta[blockIdx.x][3] = wg_globaltimer();
    }
#endif

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
        if (tok >= q_len && w.partial < 0) continue;
        float l = row_l[r];
        float inv = l > 0.f ? 1.f / l : 0.f;
        float lse2 = l > 0.f ? row_m[r] + __log2f(l) : -INFINITY;
#pragma unroll
        for (int n = 0; n < 16; n++)
            store_pair<T>(a, w, ROWS, HD, lr, qstart + tok, hq, n * 8 + 2 * tq, acc[4 * n + 2 * r] * inv,
                          acc[4 * n + 2 * r + 1] * inv, lse2);
        if (tq == 0) store_lse<T>(a, w, ROWS, lr, qstart + tok, hq, lse2);
    }
#undef WG_STAMP
#else
    __trap();   /* built without sm_90a: the host never launches this config there */
#endif
}

/* The TMA modes' tensor maps (zeros for the other modes): each cache as [num_slots][Hkv][128] 16-bit
 * elements, one copy = [block_size slots][1 head][64 dims], 128-byte swizzled.  The encoding is
 * host arithmetic (no device call), redone per launch.  cudaErrorNotSupported when the driver
 * cannot encode them (the backend checks this at open and then never plans them). */
template <int MODE>
static cudaError_t wgmma_tensor_maps(const ar_attn_args *a, CUtensorMap *mk, CUtensorMap *mv)
{
    memset(mk, 0, sizeof *mk);
    memset(mv, 0, sizeof *mv);
    if (!WgStages<MODE>::TMA) return cudaSuccess;
    const uint64_t dims[3] = {(uint64_t)WgGeom::HD, (uint64_t)a->num_kv_heads, (uint64_t)a->num_slots};
    const uint64_t strides[2] = {(uint64_t)WgGeom::HD * 2, (uint64_t)a->num_kv_heads * WgGeom::HD * 2};
    const uint32_t box[3] = {64, 1, 1u << a->block_size_log2};
    char err[256];
    if (ar_tma_encode(mk, a->k_cache, 3, dims, strides, box, "cuda", err, sizeof err) ||
        ar_tma_encode(mv, a->v_cache, 3, dims, strides, box, "cuda", err, sizeof err))
        return cudaErrorNotSupported;
    return cudaSuccess;
}

template <typename T, int MODE>
static cudaError_t launch_wgmma(const ar_attn_args *a, int num_work, cudaStream_t stream)
{
    if (num_work <= 0) return cudaSuccess;
    CUtensorMap mk, mv;
    cudaError_t e = wgmma_tensor_maps<MODE>(a, &mk, &mv);
    if (e != cudaSuccess) return e;
    attn_wgmma_kernel<T, MODE><<<num_work, WgStages<MODE>::THREADS, WgStages<MODE>::SMEM, stream>>>(*a, mk, mv);
#ifdef AR_WG_TRACE
    wg_trace_print<<<1, 1, 0, stream>>>(MODE, WG_TRACE_TILES, num_work);
#endif
    return cudaGetLastError();
}

template <typename T, int MODE>
static cudaError_t attributes_wgmma(int *ctas_per_sm)
{
    const int smem = (int)WgStages<MODE>::SMEM;
    cudaError_t e = cudaFuncSetAttribute(attn_wgmma_kernel<T, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, attn_wgmma_kernel<T, MODE>,
                                                         WgStages<MODE>::THREADS, smem);
}

} /* namespace ar_attn */

#endif
