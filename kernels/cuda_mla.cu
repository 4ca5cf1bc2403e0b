/* cuda_mla.cu - the "cuda-mla" backend: DeepSeek-V2/V3 multi-head latent attention (MLA) on an
 * NVIDIA GPU (sm_80+, built for sm_80 and sm_90a), with vLLM's MLA semantics (semantics
 * section 7).  It holds
 *   - the backend descriptor (check / open / prepare / fill / forward / close);
 *   - device-side data generation (reference/datagen.h compiled by nvcc: bit-identical with
 *     the CPU) of q_nope, q_pe, the 576-wide latent cache entries and per-layer W_UK / W_UV;
 *   - the latent-cache write (vLLM concat_and_cache_mla: slot -1 skipped; fp8 e4m3 with a
 *     per-tensor scale as an option);
 *   - a batched GEMM (SIMT, fp32 accumulate) for the absorption q_nope x W_UK -> 512-wide latent
 *     query and the up-projection o_lat x W_UV -> v_head_dim;
 *   - the latent attention kernel, FlashMLA's structure on mma.sync tensor cores: one CTA per
 *     (request, tile of 64 rows, key range), a row being a (query token, head) pair numbered
 *     token-major, so every latent block is read once for 64 heads; keys are gathered through
 *     the block table in tiles of 32 (cp.async into a ring of 3 tiles on Hopper, 2 on an A100),
 *     S = Q K^T over 576 dims and O += P V over the first 512 dims of the SAME shared-memory
 *     tile (values = the latent);
 *     online softmax in the log2 domain; bottom-right causal for query lengths > 1;
 *   - split-KV across SMs (a FlashMLA-like planner cuts long key ranges into pieces so that the
 *     launch fills the GPU) and a combine kernel that merges the pieces by LSE;
 *   - a plain SIMT latent-attention kernel (one CTA per row), kept as a simple fallback
 *     (AR_MLA_KERNEL=simt) and, instantiated with double accumulation, as the float64 device
 *     reference of the FlashMLA-grid test hook (ar_cuda_mla_run_case);
 *   - the prefill path for requests with query_len > AR_CUDA_MLA_DECODE_THRESHOLD: the new
 *     tokens' keys/values are up-projected (k_nope = c W_UK, v = c W_UV, k = [k_nope | k_pe],
 *     QK dim 192, V dim 128), attention among the new tokens is causal; the context is
 *     up-projected in chunks bounded by a workspace and attended non-causally; the chunk
 *     results and the new-token result are merged by LSE (vLLM merge_attn_states).
 *
 * Warp layout of the tensor-core kernel (8 warps): warp w owns rows 16*(w%4) .. +16 and output
 * columns 256*(w/4) .. +256 of the 64 x 512 latent output (128 fp32 accumulators per thread).
 * Both column halves compute the same 16 x 32 score tile (the QK product is done twice) so
 * that the softmax needs no exchange between warps; the split-QK variant splits it instead and
 * exchanges row maxima, P and sums through shared memory.  A narrow kernel serves launches in
 * which every request has at most 16 rows (s_q * h_q <= 16, e.g. 16 heads at TP8): its 8 warps
 * are 2 key halves x 4 output-column quarters of one 16-row tile (see attn_narrow_kernel).
 * AUTO runs the narrow kernel where it applies, else split-QK (faster on the H200 run of
 * 2026-11-30: 160 vs 135 TFLOP/s at h_q = 128).  Variants of the narrow kernel for the h_q = 16
 * bandwidth sweep (attn_narrow1_kernel: one barrier per tile, Q in registers, key rows by the
 * bulk copy engine onto mbarriers, 2 CTAs per SM, a persistent plan, a row-parallel combine,
 * diagnostics) are picked by number or name (ar_cuda_mla_case.narrow_variant, AR_MLA_NARROW);
 * on sm_90 with a bf16/fp16 cache the default is the measured best, bulk-s2x2-cp (key rows by
 * the bulk copy engine, a ring of 2 at 2 CTAs per SM, the row-parallel combine, a persistent
 * plan), see NARROW_DEFAULT_NAME.  On a compute-capability 9.0 device with a bf16/fp16 cache
 * AUTO runs launches in which some request has 16 rows or more (s_q * h_q >= 16) on the wgmma kernel
 * (kernels/cuda_mla_wgmma.cuh: the same work items and outputs, both products on wgmma, key
 * tiles of 64, 2 warpgroups splitting O by columns); AR_MLA_KERNEL=tc-wgmma /
 * AR_MLA_KERNEL_TC_WGMMA force it, tc-split-qk the mma.sync kernel.  Its variant (wg_variants:
 * AR_MLA_WG_VARIANT, ar_cuda_mla_case.wg_variant) defaults to 6, s1-tma (S by warpgroup 0
 * alone, key tiles by TMA through a tensor map of the cache made per launch: wg_prepare_tma;
 * refused: its cp.async twin s1 (1) runs and the result says so), the fastest of round 4's H200
 * sweep; 4 (seesaw) and 5 (seesaw-rs) are round 3's candidates, 7 (seesaw-rs-tma) round 4's
 * other one.
 *
 * Timed part of forward (CUDA events, one warm-up, then the median of cfg->repeat): "write"
 * (latent cache write), "absorb" (q_nope x W_UK), "attn" (latent attention), "combine" (split
 * merge), "wuv" (o_lat x W_UV), and for prefill requests "prefill" (up-projection, chunked
 * attention and merges).  Inputs and weights are generated untimed.  Output buffers carry
 * guard regions checked after every forward; out/LSE are NaN-poisoned before each forward.
 *
 * LSE convention: [Hq, T], natural log, -inf for a row that sees no key (backend contract);
 * the test hook converts to FlashMLA's +inf. */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_mla.h"
#include "../reference/mla_ref.h"
#include "cuda_host.cuh"

#define MLA_GUARD_BYTES 4096
#define MLA_GUARD_BYTE 0xA5

namespace ar_mla {

constexpr int D = 576;          /* latent cache entry: kv_lora_rank + rope dim */
constexpr int DL = 512;         /* kv_lora_rank: latent part, = values of the latent attention */
constexpr int DR = 64;          /* qk_rope_head_dim */
constexpr int ROWS = 64;        /* rows of one CTA tile (query token, head) */
constexpr int KEYS = 32;        /* keys per shared-memory tile */
constexpr int STRIDE = D + 8;   /* shared row stride in 16-bit elements (conflict-free fragments) */
constexpr int THREADS = 256;    /* 8 warps */
constexpr int SMEM_Q = ROWS * STRIDE * 2;
constexpr int SMEM_K = KEYS * STRIDE * 2;
/* shared memory of the tensor-core kernel with a ring of `stages` key tiles: 149504 bytes for 2
 * (fits an A100's 163 KB), 186880 for 3 (Hopper: up to 227 KB) */
constexpr int PSTRIDE = 40;     /* row stride (16-bit elements) of the shared P tile (split QK) */
constexpr int SMEM_SPLIT = ROWS * PSTRIDE * 2 + 2 * ROWS * 4;   /* P tile + row max / sum exchange */
constexpr int smem_total(int stages, bool split_qk = false)
{
    return SMEM_Q + stages * SMEM_K + (split_qk ? SMEM_SPLIT : 0);
}
constexpr int SIMT_THREADS = 128;
constexpr int SIMT_CHUNK = 128;

/* One CTA of the latent attention: rows row0 .. row0 + 63 of request req (row = i * H + n),
 * keys [key_begin, key_end) (key_begin a multiple of KEYS). */
struct work_item {
    int req;
    int row0;
    int key_begin;
    int key_end;
    int partial;        /* -1: write o_lat / lse; else the partial slot of this piece */
    int next;           /* persistent plans: the CTA's next piece, -1 none (else unused) */
    int pad1, pad2;
};

/* Pieces first_partial .. + count - 1 of one row tile, merged by the combine kernel. */
struct combine_group {
    int req;
    int row0;
    int first_partial;
    int count;
};

struct attn_args {
    const void *q;              /* [T, H, 576] compute dtype bits: [ql_nope (512) | q_pe (64)] */
    const void *cache;          /* [num_blocks, block_size, 576] cache dtype */
    float *o_lat;               /* [T, H, 512] normalised latent output */
    float *lse;                 /* [H, T] natural log (log2 with the LSE_BASE2 fault) */
    float *part_o;              /* [num_partials, ROWS, 512] normalised */
    float *part_lse;            /* [num_partials, ROWS] log2 domain */
    const int *qsl;             /* [R + 1] query_start_loc */
    const int *seq_lens;        /* [R] */
    const int *block_table;     /* [R, mbpr] */
    const int *tok_req;         /* [T] request of each token */
    const work_item *work;
    const combine_group *groups;
    int num_tokens, num_heads, mbpr, block_size, causal, fault;
    int block_size_log2;        /* block_size is 16, 32 or 64 */
    int bf16;                   /* compute dtype: 1 bf16, 0 fp16 */
    int fp8_cache;              /* cache holds fp8 e4m3 (scaled by kv_scale) */
    float scale;                /* softmax scale (natural) */
    double scale_ref;           /* the same in double, for the float64 reference */
    float scale_log2;           /* scale * log2(e) */
    float kv_scale;
    int wg_variant;             /* attn_wgmma kernel variant (wg_variants, host side); 0 = round 1, 1 = s1 (default) */
};

/* ---------------------------------------------------------------------------------------- */
/* Small device helpers                                                                      */

__device__ __forceinline__ uint16_t to_bits(int bf16, float v)
{
    return bf16 ? ar_f32_to_bf16(v) : ar_f32_to_fp16(v);
}

__device__ __forceinline__ float from_bits(int bf16, uint16_t b)
{
    return bf16 ? ar_bf16_to_f32(b) : ar_fp16_to_f32(b);
}

/* Key limit of query token i of a request (keys [0, limit) visible). */
__device__ __forceinline__ int key_limit(int causal, int seq_len, int q_len, int i, int extra)
{
    if (!causal) return seq_len;
    int lim = seq_len - q_len + i + 1 + extra;
    if (lim > seq_len) lim = seq_len;
    return lim < 0 ? 0 : lim;
}

__device__ __forceinline__ int64_t key_slot(const attn_args &a, int r, int j)
{
    int blk = a.block_table[(int64_t)r * a.mbpr + (j >> a.block_size_log2)];
    return ((int64_t)blk << a.block_size_log2) + (j & (a.block_size - 1));
}

__device__ __forceinline__ void cp_async16(void *smem_dst, const void *gmem_src, bool pred)
{
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem_dst);
    int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem_src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *smem_src)
{
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem_src);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *smem_src)
{
    uint32_t s = (uint32_t)__cvta_generic_to_shared(smem_src);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/* c += a (16x16, row) * b (16x8, col), fp32 accumulate. */
template <bool BF16>
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    if (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats as one register of 16-bit values (lo in the low half). */
template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi)
{
    if (BF16) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&v);
    }
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* ---------------------------------------------------------------------------------------- */
/* Tensor-core latent attention                                                               */

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

/* SPLIT_QK: the two column-half warps of a row group each compute half of the 16 x 32 score tile
 * (16 keys) instead of both computing all of it; the row maxima, P (through a shared 64 x 32 tile)
 * and the final row sums are exchanged through shared memory (two more barriers per tile). */
template <bool BF16, bool FP8, int STAGES, bool SPLIT_QK>
__global__ void __launch_bounds__(THREADS, 1) attn_tc_kernel(attn_args a)
{
    extern __shared__ uint4 smem_raw[];
    uint16_t *sq = reinterpret_cast<uint16_t *>(smem_raw);
    uint16_t *const sk_base = sq + ROWS * STRIDE;   /* STAGES key tiles: buffer b at b * KEYS * STRIDE */
    uint16_t *const sp = sk_base + STAGES * KEYS * STRIDE;                 /* [ROWS, PSTRIDE] (SPLIT_QK) */
    float *const s_red = reinterpret_cast<float *>(sp + ROWS * PSTRIDE);   /* [2, ROWS] (SPLIT_QK) */

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
        constexpr int NT = SPLIT_QK ? 2 : 4;
        const int key_off = SPLIT_QK ? colh * 16 : 0;
        float s[NT][4];
        float mx[2] = {-INFINITY, -INFINITY};
        if (active) {
            /* S = Q K^T: 16 rows x 32 keys per warp (16 keys with SPLIT_QK) */
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] = 0.f;
            const uint16_t *qlane, *klane;
            qk_lane_rows(sq, sk, rg * 16, key_off, lane, &qlane, &klane);
            qk_tile<BF16, NT>(s, qlane, klane, 0, D / 16);

            /* mask, scale to the log2 domain, online softmax */
            mask_scale_rowmax<NT>(s, k0 + key_off, tig, lim, score_mul, mx);
            if (SPLIT_QK && tig == 0) {   /* the other column half needs these maxima */
                s_red[colh * ROWS + lr[0]] = mx[0];
                s_red[colh * ROWS + lr[1]] = mx[1];
            }
        }
        if (SPLIT_QK) __syncthreads();
        if (active) {
            if (SPLIT_QK) {   /* the other column half's maxima over its 16 keys */
                mx[0] = fmaxf(mx[0], s_red[(1 - colh) * ROWS + lr[0]]);
                mx[1] = fmaxf(mx[1], s_red[(1 - colh) * ROWS + lr[1]]);
            }
            softmax_step<NT, 32>(s, mx, m_run, l_run, o, a.fault);
            /* SPLIT_QK: both halves write their part of P (16 x 32) to the shared P tile */
            if (SPLIT_QK) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        *reinterpret_cast<uint32_t *>(sp + lr[h] * PSTRIDE + key_off + nt * 8 + 2 * tig) =
                            pack2<BF16>(s[nt][2 * h], s[nt][2 * h + 1]);
            }
        }
        if (SPLIT_QK) __syncthreads();
        if (active) {
            /* O += P V: P from registers (or, SPLIT_QK, from the shared P tile), V = first 512
             * columns of the key tile */
#pragma unroll
            for (int ks = 0; ks < 2; ks++) {
                uint32_t pf[4];
                if (SPLIT_QK) {
                    const uint16_t *p0 = sp + lr[0] * PSTRIDE + ks * 16 + 2 * tig, *p1 = sp + lr[1] * PSTRIDE + ks * 16 + 2 * tig;
                    pf[0] = *reinterpret_cast<const uint32_t *>(p0);
                    pf[1] = *reinterpret_cast<const uint32_t *>(p1);
                    pf[2] = *reinterpret_cast<const uint32_t *>(p0 + 8);
                    pf[3] = *reinterpret_cast<const uint32_t *>(p1 + 8);
                } else {
                    pf[0] = pack2<BF16>(s[(2 * ks) % NT][0], s[(2 * ks) % NT][1]);
                    pf[1] = pack2<BF16>(s[(2 * ks) % NT][2], s[(2 * ks) % NT][3]);
                    pf[2] = pack2<BF16>(s[(2 * ks + 1) % NT][0], s[(2 * ks + 1) % NT][1]);
                    pf[3] = pack2<BF16>(s[(2 * ks + 1) % NT][2], s[(2 * ks + 1) % NT][3]);
                }
                pv_step<BF16, 16>(o, pf, sk, ks * 16, colh * 256, lane);
            }
        }
        __syncthreads();   /* the slot is refilled at the start of the next tile */
    }
    cp_async_wait<0>();

    /* epilogue: full row sums, normalise, write */
    quad_sum(l_run);
    if (SPLIT_QK) {   /* each half summed its own 16 keys of every tile */
        if (active && tig == 0) {
            s_red[colh * ROWS + lr[0]] = l_run[0];
            s_red[colh * ROWS + lr[1]] = l_run[1];
        }
        __syncthreads();
        if (active) {
            l_run[0] += s_red[(1 - colh) * ROWS + lr[0]];
            l_run[1] += s_red[(1 - colh) * ROWS + lr[1]];
        }
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

constexpr int NROWS = 16;                                   /* rows of a narrow tile */
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

template <bool BF16, bool FP8, int STAGES, int MINB = 1>
__global__ void __launch_bounds__(THREADS, MINB) attn_narrow_kernel(attn_args a)
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

/* ---------------------------------------------------------------------------------------- */
/* Narrow-kernel variants (issue 6 item 7: h_q = 16 towards 3.6 TB/s), picked per launch by    */
/* number (ar_cuda_mla_narrow_variant_name) for the bench sweep; the default stays             */
/* attn_narrow_kernel.  attn_narrow1_kernel keeps its warp layout and arithmetic (the same     */
/* partial-score order, so on the same plan its outputs equal attn_narrow_kernel's bit for     */
/* bit) with ONE CTA barrier per key tile instead of three:                                     */
/*   tile t:  QK partials -> s_part[t & 1];  (cp.async ring: wait until tile t+1 has landed)     */
/*            __syncthreads: partials visible, tile t+1 visible, every warp past PV(t-1);        */
/*            load tile t + STAGES - 1 into the slot of tile t-1; sum partials, softmax, PV(t).  */
/* MODE bits: NV_BULK key rows by the bulk copy engine (cp.async.bulk, one 1152-byte copy per   */
/* key row, issued by the 32 lanes of warp 0, completing on one mbarrier per ring slot that    */
/* every thread waits on: no per-thread copies, no LSU traffic for the loads); NV_QREG the      */
/* warp's Q fragments (16 rows x 144 dims) held in 36 registers instead of re-read by ldmatrix  */
/* every tile (a third of the shared-memory reads).  Diagnostics (wrong results, timing only): */
/* NV_NOMMA loads only (no QK / softmax / PV), NV_NOLOAD computes on the ring's first tiles     */
/* again and again (no loads after them).  Built for sm_90 only (a trap elsewhere: the host    */
/* runs attn_narrow_kernel on older devices); bf16 / fp16 caches (fp8 runs the default).        */

constexpr int NV_BULK = 1, NV_QREG = 2, NV_NOMMA = 4, NV_NOLOAD = 8, NV_PERSIST = 16;
constexpr int SMEM_SPART2 = 2 * SMEM_SPART;   /* double-buffered partial scores */
constexpr int narrow1_smem_total(int stages)
{
    return SMEM_QN + stages * SMEM_K + SMEM_SPART2 + SMEM_XML + stages * 8;   /* + one mbarrier per slot */
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MLA_SM90 1
#else
#define MLA_SM90 0
#endif

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count)
{
#if MLA_SM90
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#else
    (void)bar;
    (void)count;
#endif
}

__device__ __forceinline__ void mbar_init_fence(void)
{
#if MLA_SM90
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/* One arrival on bar that also announces `bytes` of bulk copies to come. */
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes)
{
#if MLA_SM90
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
#else
    (void)bar;
    (void)bytes;
#endif
}

/* Waits until the phase of bar with the given parity has completed.  A wait of more than 2^32
 * cycles (~2 s; a tile takes microseconds) traps instead of hanging: a launch error the caller
 * reports, not a stuck device call. */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity)
{
#if MLA_SM90
    uint32_t done = 0;
    const long long start = clock64();
    for (;;) {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}\n"
                     : "=r"(done)
                     : "r"(smem_addr(bar)), "r"(parity)
                     : "memory");
        if (done) break;
        if (clock64() - start > (1LL << 32)) __trap();
    }
#else
    (void)bar;
    (void)parity;
#endif
}

/* Orders this thread's earlier generic-proxy shared-memory accesses before later bulk copies. */
__device__ __forceinline__ void fence_proxy_async(void)
{
#if MLA_SM90
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* `bytes` (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst by
 * the bulk copy engine, completing on bar. */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
#if MLA_SM90
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
#else
    (void)dst;
    (void)src;
    (void)bytes;
    (void)bar;
#endif
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

template <bool BF16, int STAGES, int MODE, int MINB>
__global__ void __launch_bounds__(THREADS, MINB) attn_narrow1_kernel(attn_args a)
{
#if MLA_SM90
    constexpr bool BULK = (MODE & NV_BULK) != 0, QREG = (MODE & NV_QREG) != 0;
    constexpr bool NOMMA = (MODE & NV_NOMMA) != 0, NOLOAD = (MODE & NV_NOLOAD) != 0;
    constexpr bool PERSIST = (MODE & NV_PERSIST) != 0;
    static_assert(BULK ? STAGES >= 2 : STAGES >= 3, "one barrier per tile: cp.async needs 3 slots, bulk 2");
    static_assert(!(BULK && NOLOAD), "NOLOAD is a cp.async diagnostic");
    extern __shared__ uint4 smem_raw[];
    uint16_t *sq = reinterpret_cast<uint16_t *>(smem_raw);
    uint16_t *const sk_base = sq + NROWS * STRIDE;                                      /* STAGES key tiles */
    float *const s_part = reinterpret_cast<float *>(sk_base + STAGES * KEYS * STRIDE);  /* [2][2][4][16][16] */
    float *const x_ml = s_part + 2 * 2 * 4 * NROWS * 16;                                /* [2][16]: m, l */
    uint64_t *const bars = reinterpret_cast<uint64_t *>(x_ml + 2 * NROWS);              /* [STAGES] (BULK) */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kh = warp >> 2, cq = warp & 3;
    const int tig = lane & 3;
    const int lr[2] = {lane >> 2, (lane >> 2) + 8};
    if (BULK && threadIdx.x == 0) {
        for (int st = 0; st < STAGES; st++) mbar_init(&bars[st], 1);
        mbar_init_fence();
    }
    const uint16_t *qlane, *klane;
    qk_lane_rows(sq, sk_base, 0, kh * 16, lane, &qlane, &klane);
    const int64_t klane_off = klane - sk_base;   /* the lane's key row / dim offset inside a slot */

    /* PERSIST: this CTA's pieces are work[blockIdx.x], then the chain of work[].next (always to a
     * later index: anything else ends the chain, so a plan without chains cannot loop); gtile
     * counts the key tiles of the CTA's earlier pieces, so ring slot and mbarrier phase run on */
    int gtile = 0;
    for (int wi = blockIdx.x; wi >= 0; wi = PERSIST && a.work[wi].next > wi ? a.work[wi].next : -1) {
        const work_item w = a.work[wi];
        const int r = w.req, H = a.num_heads;
        const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
        const int nrows = ql * H;   /* <= NROWS (the launcher checks); w.row0 == 0 */
        int lim[2];
        row_limits(a, w, sl, ql, nrows, lr, lim);

        load_q_tile<NROWS>(a, sq, q0, w.row0, nrows);   /* one commit group */
        const int ntiles = w.key_end > w.key_begin ? (w.key_end - w.key_begin + KEYS - 1) / KEYS : 0;
        int2 next_blocks = make_int2(0, 0);
        if (BULK) {
            __syncthreads();   /* the mbarriers are initialised before warp 0 arms them */
            if (warp == 0)
                for (int st = 0; st < STAGES - 1 && st < ntiles; st++) {
                    const int k0 = w.key_begin + st * KEYS, sl_st = (gtile + st) % STAGES;
                    bulk_key_tile(a, sk_base + sl_st * KEYS * STRIDE, &bars[sl_st], tile_blocks(a, r, k0, w.key_end),
                                  k0, w.key_end, lane);
                }
            if (STAGES - 1 < ntiles) next_blocks = tile_blocks(a, r, w.key_begin + (STAGES - 1) * KEYS, w.key_end);
            cp_async_wait<0>();   /* Q */
        } else {
            /* the cp.async ring restarts at slot 0 for every piece (it was drained) */
            ring_start<BF16, false, STAGES>(a, sk_base, r, w, ntiles, next_blocks);
            cp_async_wait<STAGES - 2>();   /* Q and tile 0 */
        }
        __syncthreads();

        float o[16][4];
#pragma unroll
        for (int nt = 0; nt < 16; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[nt][e] = 0.f;
        float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
        const float score_mul = a.scale_log2;
        uint32_t qf[9][4];   /* QREG: A fragments of dims cq*144 + 16*ks */
        if (QREG) {
#pragma unroll
            for (int ks = 0; ks < 9; ks++) ldmatrix_x4(qf[ks], qlane + cq * 144 + ks * 16);
        }

        for (int t = 0; t < ntiles; t++) {
            const int k0 = w.key_begin + t * KEYS;
            const int slot = ((BULK ? gtile : 0) + t) % STAGES;
            const uint16_t *sk = sk_base + slot * KEYS * STRIDE;
            if (BULK) mbar_wait(&bars[slot], (uint32_t)((gtile + t) / STAGES) & 1u);
            float *const part = s_part + (t & 1) * (2 * 4 * NROWS * 16);
            if (!NOMMA) {
                /* partial S over dims cq*144 .. +144: 16 rows x 16 keys (two n-tiles of 8) */
                float s[2][4];
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[nt][e] = 0.f;
                if (QREG) {
                    const uint16_t *kl = sk + klane_off + cq * 144;
#pragma unroll
                    for (int ks = 0; ks < 9; ks++) {
                        uint32_t bf[4];
                        ldmatrix_x4(bf, kl + ks * 16);
                        mma16816<BF16>(s[0], qf[ks], bf[0], bf[1]);
                        mma16816<BF16>(s[1], qf[ks], bf[2], bf[3]);
                    }
                } else {
                    qk_tile<BF16, 2>(s, qlane, sk + klane_off, cq * 144, 9);
                }
                narrow_store_partial(part, kh, cq, lr, tig, s);
            }
            if (!BULK) cp_async_wait<(STAGES >= 3 ? STAGES - 3 : 0)>();   /* tile t + 1 (this thread's copies) */
            __syncthreads();
            /* every warp is past PV(t-1): tile t + STAGES - 1 goes into the slot of tile t-1 */
            const int nxt = t + STAGES - 1;
            const int nxt_slot = ((BULK ? gtile : 0) + nxt) % STAGES;
            if (BULK) {
                if (nxt < ntiles) {
                    if (warp == 0)
                        bulk_key_tile(a, sk_base + nxt_slot * KEYS * STRIDE, &bars[nxt_slot], next_blocks,
                                      w.key_begin + nxt * KEYS, w.key_end, lane);
                    if (nxt + 1 < ntiles) next_blocks = tile_blocks(a, r, w.key_begin + (nxt + 1) * KEYS, w.key_end);
                }
            } else {
                if (nxt < ntiles && (!NOLOAD || nxt < STAGES)) {
                    load_key_tile<BF16, false>(a, sk_base + nxt_slot * KEYS * STRIDE, next_blocks,
                                               w.key_begin + nxt * KEYS, w.key_end);
                    if (nxt + 1 < ntiles) next_blocks = tile_blocks(a, r, w.key_begin + (nxt + 1) * KEYS, w.key_end);
                }
                cp_async_commit();
            }
            if (!NOMMA) narrow_softmax_pv<BF16>(a, part, sk, k0, kh, cq, lane, lr, lim, score_mul, m_run, l_run, o);
        }
        if (!BULK) cp_async_wait<0>();
        __syncthreads();   /* the key ring is free: it carries key half 1's output to half 0 */
        narrow_epilogue(a, w, q0, nrows, kh, cq, tig, lr, o, m_run, l_run, sk_base, x_ml, 1.f);
        gtile += ntiles;
        if (PERSIST) {
            /* the next piece's Q and key copies overwrite what the epilogue read and wrote
             * (generic proxy; bulk copies are the async proxy) */
            if (BULK) fence_proxy_async();
            __syncthreads();
        }
    }
#else
    (void)a;
    __trap();
#endif
}

/* The LSE maximum m and the weight sum of row lr of a combine group's pieces (log2 domain). */
__device__ __forceinline__ void combine_row_stats(const attn_args &a, const combine_group &gp, int lr, float *m_out,
                                                  float *wsum_out)
{
    float m = -INFINITY;
    for (int p = 0; p < gp.count; p++) m = fmaxf(m, a.part_lse[(int64_t)(gp.first_partial + p) * ROWS + lr]);
    float wsum = 0.f;
    for (int p = 0; p < gp.count; p++) {
        float l = a.part_lse[(int64_t)(gp.first_partial + p) * ROWS + lr];
        wsum += m == -INFINITY ? 0.f : exp2f(l - m);
    }
    *m_out = m;
    *wsum_out = wsum;
}

/* Weight of a piece with LSE l (the MERGE_NO_WEIGHTS fault: 1). */
__device__ __forceinline__ float combine_weight(const attn_args &a, float m, float wsum, float l)
{
    if (a.fault == AR_FAULT_MERGE_NO_WEIGHTS) return 1.f;
    return (m == -INFINITY || wsum <= 0.f) ? 0.f : exp2f(l - m) / wsum;
}

/* The merged LSE of row gr of the request starting at token q0: natural into lse [H, T]. */
__device__ __forceinline__ void combine_write_lse(const attn_args &a, int q0, int gr, float m, float wsum)
{
    const int H = a.num_heads;
    float lse2 = (m == -INFINITY || wsum <= 0.f) ? -INFINITY : m + log2f(wsum);
    int i = gr / H, n = gr % H;
    a.lse[(int64_t)n * a.num_tokens + q0 + i] = a.fault == AR_FAULT_LSE_BASE2 ? lse2 : lse2 * 0.6931471805599453f;
}

/* combine_kernel with one CTA per (group, row): grid (num_groups, rows per group), 128 threads
 * x 4 columns; the rows of a group are merged side by side instead of one after another.  The
 * same arithmetic in the same order as combine_kernel. */
__global__ void __launch_bounds__(128) combine_rows_kernel(attn_args a)
{
    const combine_group gp = a.groups[blockIdx.x];
    const int H = a.num_heads, lr = blockIdx.y;
    const int q0 = a.qsl[gp.req], ql = a.qsl[gp.req + 1] - q0;
    const int gr = gp.row0 + lr;
    if (gr >= ql * H) return;
    float m, wsum;
    combine_row_stats(a, gp, lr, &m, &wsum);
    const int col = threadIdx.x * 4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int p = 0; p < gp.count; p++) {
        int64_t pi = gp.first_partial + p;
        float wgt = combine_weight(a, m, wsum, a.part_lse[pi * ROWS + lr]);
        float4 v = *reinterpret_cast<const float4 *>(a.part_o + (pi * ROWS + lr) * DL + col);
        acc.x += wgt * v.x;
        acc.y += wgt * v.y;
        acc.z += wgt * v.z;
        acc.w += wgt * v.w;
    }
    *reinterpret_cast<float4 *>(a.o_lat + ((int64_t)q0 * H + gr) * DL + col) = acc;
    if (threadIdx.x == 0) combine_write_lse(a, q0, gr, m, wsum);
}

/* Merges the split pieces of each row tile by their LSE (vLLM merge_attn_states on N pieces). */
__global__ void combine_kernel(attn_args a)
{
    const combine_group gp = a.groups[blockIdx.x];
    const int H = a.num_heads;
    const int q0 = a.qsl[gp.req], ql = a.qsl[gp.req + 1] - q0;
    const int nrows = ql * H;
    for (int lr = 0; lr < ROWS; lr++) {
        int gr = gp.row0 + lr;
        if (gr >= nrows) break;
        float m, wsum;
        combine_row_stats(a, gp, lr, &m, &wsum);
        float *dst = a.o_lat + ((int64_t)q0 * H + gr) * DL;
        for (int col = threadIdx.x; col < DL; col += blockDim.x) {
            float acc = 0.f;
            for (int p = 0; p < gp.count; p++) {
                int64_t pi = gp.first_partial + p;
                acc += combine_weight(a, m, wsum, a.part_lse[pi * ROWS + lr]) * a.part_o[(pi * ROWS + lr) * DL + col];
            }
            dst[col] = acc;
        }
        if (threadIdx.x == 0) combine_write_lse(a, q0, gr, m, wsum);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* SIMT latent attention: one CTA per (token, head).  With Acc = float it is the fallback
 * kernel (writes o_lat / lse like the tensor-core path); with Acc = double it is the float64
 * device reference (cache values read as ar_kv_roundtrip gives them, exp/log in double).    */

template <typename Acc>
__device__ Acc block_reduce(Acc v, bool is_max, Acc *red)
{
    for (int off = 16; off > 0; off >>= 1) {
        Acc o = __shfl_xor_sync(0xffffffffu, v, off);
        v = is_max ? (o > v ? o : v) : v + o;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    Acc r = red[0];
    for (int i = 1; i < nw; i++) r = is_max ? (red[i] > r ? red[i] : r) : r + red[i];
    return r;
}

template <typename Acc>
__device__ __forceinline__ Acc cache_value(const attn_args &a, int64_t idx)
{
    if (a.fp8_cache) {
        float x = ar_fp8e4m3_to_f32(((const uint8_t *)a.cache)[idx]);
        /* the float64 reference reads the round-trip value; the float kernel scales later */
        return sizeof(Acc) == 8 ? (Acc)__fmul_rn(x, a.kv_scale) : (Acc)x;
    }
    return (Acc)from_bits(a.bf16, ((const uint16_t *)a.cache)[idx]);
}

template <typename Acc>
__global__ void __launch_bounds__(SIMT_THREADS) attn_simt_kernel(attn_args a, Acc *out, Acc *lse_out)
{
    __shared__ Acc qs[D];
    __shared__ Acc ps[SIMT_CHUNK];
    __shared__ Acc red[SIMT_THREADS / 32];
    const int H = a.num_heads;
    const int t = blockIdx.x / H, n = blockIdx.x % H;
    const int r = a.tok_req[t];
    const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
    const int i = t - q0;
    const int extra = a.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0;
    const int limit = key_limit(a.causal, sl, ql, i, extra);
    const bool dbl = sizeof(Acc) == 8;
    const Acc smul = (Acc)a.scale * ((a.fp8_cache && !dbl) ? (Acc)a.kv_scale : (Acc)1);
    for (int d = threadIdx.x; d < D; d += blockDim.x)
        qs[d] = (Acc)from_bits(a.bf16, ((const uint16_t *)a.q)[((int64_t)t * H + n) * D + d]);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    Acc m = -INFINITY, l = 0;
    Acc acc[DL / SIMT_THREADS];
    for (int c = 0; c < DL / SIMT_THREADS; c++) acc[c] = 0;
    for (int c0 = 0; c0 < limit; c0 += SIMT_CHUNK) {
        int cnt = limit - c0 < SIMT_CHUNK ? limit - c0 : SIMT_CHUNK;
        for (int kk = warp; kk < cnt; kk += nw) {
            int64_t base = key_slot(a, r, c0 + kk) * D;
            Acc dot = 0;
            for (int d = lane; d < D; d += 32) dot += qs[d] * cache_value<Acc>(a, base + d);
            for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
            if (lane == 0) ps[kk] = dot * smul;
        }
        __syncthreads();
        Acc mine = threadIdx.x < cnt ? ps[threadIdx.x] : (Acc)-INFINITY;
        Acc mc = block_reduce<Acc>(mine, true, red);
        Acc m_new = m > mc ? m : mc;
        Acc alpha = m == -INFINITY ? (Acc)0 : exp(m - m_new);
        Acc p = threadIdx.x < cnt ? exp(mine - m_new) : (Acc)0;
        Acc lsum = block_reduce<Acc>(p, false, red);
        if (threadIdx.x < cnt) ps[threadIdx.x] = p;
        __syncthreads();
        if (a.fault == AR_FAULT_NO_RESCALE) alpha = 1;
        l = l * alpha + lsum;
        for (int c = 0; c < DL / SIMT_THREADS; c++) {
            int col = threadIdx.x + c * SIMT_THREADS;
            Acc sum = 0;
            for (int kk = 0; kk < cnt; kk++) sum += ps[kk] * cache_value<Acc>(a, key_slot(a, r, c0 + kk) * D + col);
            acc[c] = acc[c] * alpha + sum;
        }
        m = m_new;
        __syncthreads();
    }
    const Acc omul = (a.fp8_cache && !dbl) ? (Acc)a.kv_scale : (Acc)1;
    for (int c = 0; c < DL / SIMT_THREADS; c++) {
        int col = threadIdx.x + c * SIMT_THREADS;
        out[((int64_t)t * H + n) * DL + col] = l > 0 ? acc[c] * omul / l : (Acc)0;
    }
    if (threadIdx.x == 0) {
        Acc lse = l > 0 ? m + log(l) : (Acc)-INFINITY;
        if (a.fault == AR_FAULT_LSE_BASE2 && lse != (Acc)-INFINITY) lse = lse * (Acc)1.4426950408889634;
        lse_out[(int64_t)n * a.num_tokens + t] = lse;
    }
}

/* The float64 device reference of the test hook: one CTA per (token, group of up to 16 heads),
 * so each key row is read once for 16 heads; products and sums in double, the cache read as
 * ar_kv_roundtrip gives it, exact exp/log.  Only requests with req_mask[r] != 0 are computed. */
constexpr int REF_HEADS = 16;
constexpr int REF_KEYS = 64;
constexpr int REF_THREADS = 256;

__global__ void __launch_bounds__(REF_THREADS) ref_kernel(attn_args a, const unsigned char *req_mask, double *out,
                                                          double *lse_out)
{
    __shared__ float qs[REF_HEADS][D];
    __shared__ double sc[REF_HEADS][REF_KEYS];
    __shared__ double alpha_s[REF_HEADS];
    __shared__ double m_s[REF_HEADS], l_s[REF_HEADS];
    const int H = a.num_heads, groups = (H + REF_HEADS - 1) / REF_HEADS;
    const int t = blockIdx.x / groups, h0 = (blockIdx.x % groups) * REF_HEADS;
    const int nh = H - h0 < REF_HEADS ? H - h0 : REF_HEADS;
    const int r = a.tok_req[t];
    if (req_mask && !req_mask[r]) return;
    const int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, sl = a.seq_lens[r];
    const int limit = key_limit(a.causal, sl, ql, t - q0, 0);
    for (int idx = threadIdx.x; idx < REF_HEADS * D; idx += blockDim.x) {
        int h = idx / D, d = idx % D;
        qs[h][d] = h < nh ? from_bits(a.bf16, ((const uint16_t *)a.q)[((int64_t)t * H + h0 + h) * D + d]) : 0.f;
    }
    if (threadIdx.x < REF_HEADS) {
        m_s[threadIdx.x] = -INFINITY;
        l_s[threadIdx.x] = 0.0;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    double acc[REF_HEADS][2];
    for (int h = 0; h < REF_HEADS; h++) acc[h][0] = acc[h][1] = 0.0;
    const int col0 = threadIdx.x * 2;   /* 256 threads x 2 columns = 512 */
    for (int c0 = 0; c0 < limit; c0 += REF_KEYS) {
        int cnt = limit - c0 < REF_KEYS ? limit - c0 : REF_KEYS;
        for (int kk = warp; kk < cnt; kk += nw) {
            int64_t base = key_slot(a, r, c0 + kk) * D;
            double kv[D / 32];
            for (int x = 0; x < D / 32; x++) kv[x] = cache_value<double>(a, base + lane + 32 * x);
            for (int h = 0; h < nh; h++) {
                double dot = 0.0;
                for (int x = 0; x < D / 32; x++) dot += (double)qs[h][lane + 32 * x] * kv[x];
                for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
                if (lane == 0) sc[h][kk] = dot * a.scale_ref;
            }
        }
        __syncthreads();
        for (int h = warp; h < nh; h += nw) {
            double mx = -INFINITY;
            for (int kk = lane; kk < cnt; kk += 32) mx = sc[h][kk] > mx ? sc[h][kk] : mx;
            for (int off = 16; off > 0; off >>= 1) {
                double o = __shfl_xor_sync(0xffffffffu, mx, off);
                mx = o > mx ? o : mx;
            }
            double m_old = m_s[h];
            double m_new = m_old > mx ? m_old : mx;
            double sum = 0.0;
            for (int kk = lane; kk < cnt; kk += 32) {
                double p = exp(sc[h][kk] - m_new);
                sc[h][kk] = p;
                sum += p;
            }
            for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            __syncwarp();
            if (lane == 0) {
                double alpha = m_old == -INFINITY ? 0.0 : exp(m_old - m_new);
                alpha_s[h] = alpha;
                l_s[h] = l_s[h] * alpha + sum;
                m_s[h] = m_new;
            }
        }
        __syncthreads();
        for (int h = 0; h < nh; h++) {
            acc[h][0] *= alpha_s[h];
            acc[h][1] *= alpha_s[h];
        }
        for (int kk = 0; kk < cnt; kk++) {
            int64_t base = key_slot(a, r, c0 + kk) * D;
            double v0 = cache_value<double>(a, base + col0), v1 = cache_value<double>(a, base + col0 + 1);
            for (int h = 0; h < nh; h++) {
                acc[h][0] += sc[h][kk] * v0;
                acc[h][1] += sc[h][kk] * v1;
            }
        }
        __syncthreads();
    }
    for (int h = 0; h < nh; h++) {
        double l = l_s[h];
        double *dst = out + ((int64_t)t * H + h0 + h) * DL + col0;
        dst[0] = l > 0 ? acc[h][0] / l : 0.0;
        dst[1] = l > 0 ? acc[h][1] / l : 0.0;
    }
    if (threadIdx.x < nh) {
        double l = l_s[threadIdx.x];
        lse_out[(int64_t)(h0 + threadIdx.x) * a.num_tokens + t] = l > 0 ? m_s[threadIdx.x] + log(l) : -INFINITY;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Batched GEMM (SIMT, 64 x 64 tiles, fp32 accumulate):                                     */
/*   C[b][m][n] = sum_k A[b][m][k] * B[(b + b_shift) % batch][k][n]                           */
/* with element strides; A is float or 16-bit dtype bits, B 16-bit dtype bits, C float        */
/* (rounded to round_dtype) or 16-bit bits.                                                   */

struct gemm_args {
    int batch, M, N, K;
    const void *A;
    int a_bits16;               /* 1: A holds dtype bits, 0: float */
    int64_t a_b, a_m, a_k;
    const uint16_t *B;
    int64_t b_b, b_k, b_n;
    int b_shift;
    void *C;
    int c_bits16;               /* 1: store dtype bits, 0: float rounded to dtype */
    int64_t c_b, c_m, c_n;
    int bf16;                   /* the dtype of 16-bit data and of the rounding */
};

__global__ void __launch_bounds__(256) gemm_kernel(gemm_args g)
{
    __shared__ float As[16][64 + 4];
    __shared__ float Bs[16][64 + 4];
    const int bz = blockIdx.z;
    const int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int bb = (bz + g.b_shift) % g.batch;
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
    for (int k0 = 0; k0 < g.K; k0 += 16) {
        for (int e = threadIdx.x; e < 64 * 16; e += 256) {
            int kk = e % 16, mm = e / 16;
            int m = m0 + mm, k = k0 + kk;
            float v = 0.f;
            if (m < g.M && k < g.K) {
                int64_t idx = bz * g.a_b + m * g.a_m + k * g.a_k;
                v = g.a_bits16 ? from_bits(g.bf16, ((const uint16_t *)g.A)[idx]) : ((const float *)g.A)[idx];
            }
            As[kk][mm] = v;
            int nn = e % 64, kb = e / 64;
            int n = n0 + nn, k2 = k0 + kb;
            float u = 0.f;
            if (n < g.N && k2 < g.K) u = from_bits(g.bf16, g.B[bb * g.b_b + k2 * g.b_k + n * g.b_n]);
            Bs[kb][nn] = u;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            float av[4], bv[4];
            for (int i = 0; i < 4; i++) av[i] = As[kk][ty * 4 + i];
            for (int j = 0; j < 4; j++) bv[j] = Bs[kk][tx * 4 + j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            int m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
            if (m >= g.M || n >= g.N) continue;
            int64_t idx = bz * g.c_b + m * g.c_m + n * g.c_n;
            if (g.c_bits16)
                ((uint16_t *)g.C)[idx] = to_bits(g.bf16, acc[i][j]);
            else
                ((float *)g.C)[idx] = g.bf16 ? ar_round_to(AR_BF16, acc[i][j]) : ar_round_to(AR_FP16, acc[i][j]);
        }
}

/* ---------------------------------------------------------------------------------------- */
/* Data generation and the cache write                                                       */

/* q_nope [T, H, P] bits and q_pe into qlat [T, H, 576] columns 512..575. */
__global__ void gen_q_kernel(uint16_t *q_nope, uint16_t *qlat, int T, int H, int P, uint64_t seed, uint32_t layer,
                             const int *tok_req, const int *tok_pos, const uint64_t *req_keys, ar_datadist dist,
                             ar_dtype dtype)
{
    const int width = P + DR;
    int64_t total = (int64_t)T * H * width;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int d = (int)(idx % width);
        int64_t th = idx / width;
        int n = (int)(th % H);
        int t = (int)(th / H);
        uint64_t key = req_keys[tok_req[t]];
        int bf16 = dtype == AR_BF16;
        if (d < P) {
            uint64_t row = ar_gen_row(seed, AR_STREAM_Q_NOPE, layer, key, (uint64_t)tok_pos[t], (uint32_t)n);
            q_nope[th * P + d] = to_bits(bf16, ar_gen(row, (uint32_t)d, dist, dtype));
        } else {
            uint64_t row = ar_gen_row(seed, AR_STREAM_Q_PE, layer, key, (uint64_t)tok_pos[t], (uint32_t)n);
            qlat[th * D + DL + (d - P)] = to_bits(bf16, ar_gen(row, (uint32_t)(d - P), dist, dtype));
        }
    }
}

/* The stored form of a latent value: dtype bits, or fp8 bits of x / kv_scale. */
__device__ __forceinline__ void store_latent(void *cache, int64_t idx, float x, ar_dtype dtype, ar_dtype kv_dtype,
                                             float kv_scale)
{
    if (kv_dtype == dtype)
        ((uint16_t *)cache)[idx] = to_bits(dtype == AR_BF16, x);
    else
        ((uint8_t *)cache)[idx] = ar_f32_to_fp8e4m3(__fdiv_rn(x, kv_scale));
}

/* new latents [T, 576] dtype bits: key = content key of the token's block, pos = offset. */
__global__ void gen_latent_kernel(uint16_t *lat, int T, uint64_t seed, uint32_t layer, const int *tok_req,
                                  const int *tok_pos, const uint64_t *block_keys, int mbpr, int block_size,
                                  ar_datadist dist, ar_dtype dtype)
{
    int64_t total = (int64_t)T * D;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int d = (int)(idx % D);
        int t = (int)(idx / D);
        int p = tok_pos[t];
        uint64_t key = block_keys[(int64_t)tok_req[t] * mbpr + p / block_size];
        uint64_t row = ar_gen_row(seed, AR_STREAM_LATENT, layer, key, (uint64_t)(p % block_size), 0);
        lat[idx] = to_bits(dtype == AR_BF16, ar_gen(row, (uint32_t)d, dist, dtype));
    }
}

/* concat_and_cache_mla: token t's entry -> slot_mapping[t] (skipped when -1). */
__global__ void write_latent_kernel(const uint16_t *lat, const int64_t *slots, void *cache, int T, ar_dtype dtype,
                                    ar_dtype kv_dtype, float kv_scale, int wrong_slot)
{
    int t = blockIdx.x;
    if (t >= T) return;
    int64_t slot = slots[t];
    if (slot < 0) return;
    (void)wrong_slot;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float x = from_bits(dtype == AR_BF16, lat[(int64_t)t * D + d]);
        store_latent(cache, slot * D + d, x, dtype, kv_dtype, kv_scale);
    }
}

/* Untimed fill of context tokens straight from the generator. */
__global__ void fill_latent_kernel(void *cache, int count, const int64_t *slots, const uint64_t *keys,
                                   const int *offsets, uint64_t seed, uint32_t layer, ar_datadist dist,
                                   ar_dtype dtype, ar_dtype kv_dtype, float kv_scale)
{
    int64_t total = (int64_t)count * D;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int d = (int)(idx % D);
        int64_t i = idx / D;
        int64_t slot = slots[i];
        if (slot < 0) continue;
        uint64_t row = ar_gen_row(seed, AR_STREAM_LATENT, layer, keys[i], (uint64_t)offsets[i], 0);
        store_latent(cache, slot * D + d, ar_gen(row, (uint32_t)d, dist, dtype), dtype, kv_dtype, kv_scale);
    }
}

/* W [H, 512, width] dtype bits: element (n, l, c) = ar_mla_weight(stream, layer, l, n, c)
 * (reference/mla_ref.h: generated, times 1/sqrt(kv_lora_rank) in float, rounded). */
__global__ void gen_weight_kernel(uint16_t *w, int H, int width, uint32_t stream, uint64_t seed, uint32_t layer,
                                  ar_datadist dist, ar_dtype dtype, int kv_lora_rank)
{
    int64_t total = (int64_t)H * DL * width;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int c = (int)(idx % width);
        int64_t nl = idx / width;
        int l = (int)(nl % DL);
        int n = (int)(nl / DL);
        w[idx] = to_bits(dtype == AR_BF16, ar_mla_weight(seed, stream, layer, kv_lora_rank, l, n, c, dist, dtype));
    }
}

/* Test-case inputs (FlashMLA's distribution, ar_cuda_mla_case_value): q [T, H, 576] and the
 * cache entries of every request's tokens; one thread per 16 elements of a row, so the row hash
 * is computed once per 16 values. */
__global__ void case_q_kernel(uint16_t *q, int batch, int s_q, int H, uint64_t seed, ar_dtype dtype)
{
    const int pieces = D / 16;
    int64_t total = (int64_t)batch * s_q * H * pieces;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int d0 = (int)(idx % pieces) * 16;
        int64_t rest = idx / pieces;
        int n = (int)(rest % H);
        int64_t t = rest / H;
        int i = (int)(t % s_q), b = (int)(t / s_q);
        uint64_t row = ar_gen_row(seed, AR_STREAM_Q, 0, (uint64_t)b, (uint64_t)i, (uint32_t)n);
        for (int d = d0; d < d0 + 16; d++)
            q[rest * D + d] = to_bits(dtype == AR_BF16,
                                      ar_cuda_mla_case_value(ar_gen(row, (uint32_t)d, AR_DATA_NORMAL, dtype), dtype));
    }
}

__global__ void case_cache_kernel(void *cache, int batch, const int *seqlens, int max_sk, int block_size, int bpr, int contiguous,
                                  int num_blocks, uint64_t seed, ar_dtype dtype, ar_dtype kv_dtype, float kv_scale)
{
    const int pieces = D / 16;
    int64_t total = (int64_t)batch * max_sk * pieces;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int d0 = (int)(idx % pieces) * 16;
        int64_t rest = idx / pieces;
        int j = (int)(rest % max_sk), b = (int)(rest / max_sk);
        if (j >= seqlens[b]) continue;
        int blk = contiguous ? 1 + b * bpr + j / block_size : ar_cuda_mla_case_block(b, j / block_size, bpr, num_blocks);
        int64_t slot = (int64_t)blk * block_size + j % block_size;
        uint64_t row = ar_gen_row(seed, AR_STREAM_LATENT, 0, 1000003ull + (uint64_t)b, (uint64_t)j, 0);
        for (int d = d0; d < d0 + 16; d++)
            store_latent(cache, slot * D + d, ar_cuda_mla_case_value(ar_gen(row, (uint32_t)d, AR_DATA_NORMAL, dtype), dtype),
                         dtype, kv_dtype, kv_scale);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Prefill path (query_len > threshold): up-projected keys/values in a workspace               */

/* Workspace latent rows: row w = (request row_req[w], position row_pos[w]); a context position
 * comes from the cache (fp8 dequantised to the dtype), a new token's from the new latents. */
__global__ void gather_latent_kernel(uint16_t *ws_lat, int n_rows, const int *row_req, const int *row_pos,
                                     const attn_args a, const uint16_t *lat_new)
{
    int64_t total = (int64_t)n_rows * D;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int d = (int)(idx % D);
        int w = (int)(idx / D);
        int r = row_req[w], p = row_pos[w];
        int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, ctx = a.seq_lens[r] - ql;
        uint16_t v;
        if (p >= ctx) {
            /* the verifier (and the CPU backend) read every key through the cache, so an fp8
             * cache's new tokens take the same quantise / dequantise trip (ar_kv_roundtrip) */
            v = lat_new[((int64_t)q0 + p - ctx) * D + d];
            if (a.fp8_cache)
                v = to_bits(a.bf16, ar_kv_roundtrip(AR_FP8_E4M3, a.bf16 ? AR_BF16 : AR_FP16, a.kv_scale,
                                                    from_bits(a.bf16, v)));
        } else {
            int64_t src = key_slot(a, r, p) * D + d;
            if (a.fp8_cache)
                v = to_bits(a.bf16, __fmul_rn(ar_fp8e4m3_to_f32(((const uint8_t *)a.cache)[src]), a.kv_scale));
            else
                v = ((const uint16_t *)a.cache)[src];
        }
        ws_lat[idx] = v;
    }
}

/* k_pe (latent columns 512..575) broadcast to every head: ws_k[w, n, P + d]. */
__global__ void rope_key_kernel(uint16_t *ws_k, const uint16_t *ws_lat, int n_rows, int H, int P)
{
    const int QK = P + DR;
    int64_t total = (int64_t)n_rows * H * DR;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int d = (int)(idx % DR);
        int64_t wn = idx / DR;
        int64_t w = wn / H;
        ws_k[wn * QK + P + d] = ws_lat[w * D + DL + d];
    }
}

/* AR_FAULT_MLA_NO_WUV on the prefill path: values left in latent space (first V columns). */
__global__ void latent_as_value_kernel(uint16_t *ws_v, const uint16_t *ws_lat, int n_rows, int H, int V)
{
    int64_t total = (int64_t)n_rows * H * V;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int c = (int)(idx % V);
        int64_t w = idx / V / H;
        ws_v[idx] = ws_lat[w * D + c];
    }
}

/* Attention of prefill token pf_tok[blockIdx.x / H], head blockIdx.x % H over workspace rows
 * [kb[r], ke[r]) of its request; key row w visible iff row_pos[w] <= the query position
 * (+1 with the off-by-one fault).  q = [q_nope | q_pe] (QK = P + 64), k = ws_k, v = ws_v.
 * Writes pass_o [T, H, V] (float) and pass_lse [H, T] (natural; -inf when nothing visible). */
__global__ void __launch_bounds__(SIMT_THREADS) prefill_attn_kernel(
    const attn_args a, const int *pf_tok, const int *tok_pos, const uint16_t *q_nope, const uint16_t *ws_k,
    const uint16_t *ws_v, const int *row_pos, const int *kb, const int *ke, int P, int V, float *pass_o,
    float *pass_lse)
{
    __shared__ float qs[256 + DR];
    __shared__ float ps[SIMT_CHUNK];
    __shared__ float red[SIMT_THREADS / 32];
    const int H = a.num_heads, QK = P + DR;
    const int t = pf_tok[blockIdx.x / H], n = blockIdx.x % H;
    const int r = a.tok_req[t];
    const int qpos = tok_pos[t] + (a.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0);
    for (int d = threadIdx.x; d < QK; d += blockDim.x)
        qs[d] = d < P ? from_bits(a.bf16, q_nope[((int64_t)t * H + n) * P + d])
                      : from_bits(a.bf16, ((const uint16_t *)a.q)[((int64_t)t * H + n) * D + DL + (d - P)]);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float m = -INFINITY, l = 0.f, acc[2] = {0.f, 0.f};
    const int k_begin = kb[r], k_end = ke[r];
    for (int c0 = k_begin; c0 < k_end; c0 += SIMT_CHUNK) {
        int cnt = k_end - c0 < SIMT_CHUNK ? k_end - c0 : SIMT_CHUNK;
        for (int kk = warp; kk < cnt; kk += nw) {
            int w = c0 + kk;
            const uint16_t *kr = ws_k + ((int64_t)w * H + n) * QK;
            float dot = 0.f;
            for (int d = lane; d < QK; d += 32) dot += qs[d] * from_bits(a.bf16, kr[d]);
            for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
            if (lane == 0) ps[kk] = row_pos[w] <= qpos ? dot * a.scale_log2 : -INFINITY;
        }
        __syncthreads();
        float mine = threadIdx.x < cnt ? ps[threadIdx.x] : -INFINITY;
        float mc = block_reduce<float>(mine, true, red);
        float m_new = fmaxf(m, mc);
        float m_use = m_new == -INFINITY ? 0.f : m_new;
        float alpha = exp2f(m - m_use);
        float p = threadIdx.x < cnt ? exp2f(mine - m_use) : 0.f;
        float lsum = block_reduce<float>(p, false, red);
        if (threadIdx.x < cnt) ps[threadIdx.x] = p;
        __syncthreads();
        if (a.fault == AR_FAULT_NO_RESCALE) alpha = 1.f;
        l = l * alpha + lsum;
        for (int c = 0; c < 2; c++) {
            int col = threadIdx.x + c * SIMT_THREADS;
            if (col >= V) break;
            float sum = 0.f;
            for (int kk = 0; kk < cnt; kk++) {
                if (ps[kk] == 0.f) continue;
                sum += ps[kk] * from_bits(a.bf16, ws_v[((int64_t)(c0 + kk) * H + n) * V + col]);
            }
            acc[c] = acc[c] * alpha + sum;
        }
        m = m_new;
        __syncthreads();
    }
    for (int c = 0; c < 2; c++) {
        int col = threadIdx.x + c * SIMT_THREADS;
        if (col < V) pass_o[((int64_t)t * H + n) * V + col] = l > 0.f ? acc[c] / l : 0.f;
    }
    if (threadIdx.x == 0)
        pass_lse[(int64_t)n * a.num_tokens + t] = l > 0.f ? (m + log2f(l)) * 0.6931471805599453f : -INFINITY;
}

/* acc (out, lse) <- merge(acc, pass) for every prefill token and head (vLLM merge_attn_states);
 * first: acc <- pass. */
__global__ void prefill_merge_kernel(const attn_args a, const int *pf_tok, int n_pf, int V, float *acc_o,
                                     float *acc_lse, const float *pass_o, const float *pass_lse, int first)
{
    const int H = a.num_heads;
    int64_t total = (int64_t)n_pf * H * V;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int c = (int)(idx % V);
        int64_t rest = idx / V;
        int n = (int)(rest % H);
        int t = pf_tok[rest / H];
        int64_t o = ((int64_t)t * H + n) * V + c, li = (int64_t)n * a.num_tokens + t;
        float pl = pass_lse[li];
        if (first) {
            acc_o[o] = pass_o[o];
        } else {
            float al = acc_lse[li];
            float m = fmaxf(al, pl);
            if (m == -INFINITY) continue;   /* both empty: keep acc (zeros) */
            float wa = expf(al - m), wp = expf(pl - m);
            if (a.fault == AR_FAULT_MERGE_NO_WEIGHTS)
                acc_o[o] = acc_o[o] + pass_o[o];
            else
                acc_o[o] = acc_o[o] * (wa / (wa + wp)) + pass_o[o] * (wp / (wa + wp));
        }
    }
}

/* The LSE half of the merge (one thread per token and head, after prefill_merge_kernel). */
__global__ void prefill_merge_lse_kernel(const attn_args a, const int *pf_tok, int n_pf, float *acc_lse,
                                         const float *pass_lse, int first)
{
    const int H = a.num_heads;
    int64_t total = (int64_t)n_pf * H;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int n = (int)(idx % H);
        int t = pf_tok[idx / H];
        int64_t li = (int64_t)n * a.num_tokens + t;
        float pl = pass_lse[li];
        if (first) {
            acc_lse[li] = pl;
            continue;
        }
        float al = acc_lse[li];
        float m = fmaxf(al, pl);
        acc_lse[li] = m == -INFINITY ? -INFINITY : m + logf(expf(al - m) + expf(pl - m));
    }
}

/* Final prefill rows: out (rounded to dtype) and lse (log2 with the LSE_BASE2 fault). */
__global__ void prefill_finish_kernel(const attn_args a, const int *pf_tok, int n_pf, int V, const float *acc_o,
                                      const float *acc_lse, float *out, float *lse)
{
    const int H = a.num_heads;
    int64_t total = (int64_t)n_pf * H * V;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int c = (int)(idx % V);
        int64_t rest = idx / V;
        int n = (int)(rest % H);
        int t = pf_tok[rest / H];
        int64_t o = ((int64_t)t * H + n) * V + c;
        out[o] = a.bf16 ? ar_round_to(AR_BF16, acc_o[o]) : ar_round_to(AR_FP16, acc_o[o]);
        if (c == 0) {
            float v = acc_lse[(int64_t)n * a.num_tokens + t];
            if (a.fault == AR_FAULT_LSE_BASE2 && v != -INFINITY) v *= 1.4426950408889634f;
            lse[(int64_t)n * a.num_tokens + t] = v;
        }
    }
}

/* AR_FAULT_MLA_NO_WUV on the absorbed path: out = the first V latent columns, rounded. */
__global__ void latent_as_output_kernel(const float *o_lat, float *out, int T, int H, int V, int bf16)
{
    int64_t total = (int64_t)T * H * V;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int c = (int)(idx % V);
        int64_t th = idx / V;
        float v = o_lat[th * DL + c];
        out[idx] = bf16 ? ar_round_to(AR_BF16, v) : ar_round_to(AR_FP16, v);
    }
}

} /* namespace ar_mla */

#include "cuda_mla_wgmma.cuh"   /* attn_wgmma_kernel (sm_90a), in namespace ar_mla */

using namespace ar_mla;

/* ---------------------------------------------------------------------------------------- */
/* Host helpers                                                                              */

/* dev_buf: kernels/cuda_host.cuh */
static int mla_fail(cudaError_t e, const char *what, char *err, size_t err_len)
{
    return ar_cuda_fail(e, "cuda-mla backend", what, err, err_len);
}

static size_t mla_round_up(size_t x, size_t a) { return ar_round_up(x, a); }

static int mla_ensure(dev_buf *b, size_t need, const char *what, char *err, size_t err_len)
{
    return ar_cuda_ensure_dev(b, need, "cuda-mla backend", what, err, err_len);
}

static int mla_ensure_host(void **p, size_t *cap, size_t need, char *err, size_t err_len)
{
    return ar_cuda_ensure_host(p, cap, need, "cuda-mla backend", err, err_len);
}

static int mla_grid(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535 * 8) b = 65535 * 8;
    return (int)b;
}

static size_t meta_take(size_t *off, size_t bytes)
{
    size_t at = mla_round_up(*off, 16);
    *off = at + bytes;
    return at;
}

/* Key-tile stages the tensor-core kernel can use on this device (3 on Hopper, 2 on an A100, 0
 * when even 2 do not fit); sets the shared-memory attribute of every instantiation that fits.
 * AR_MLA_STAGES=2 caps it at 2. */
template <int STAGES, bool SPLIT_QK>
static bool set_tc_attributes_one(void)
{
    const int bytes = smem_total(STAGES, SPLIT_QK);
    cudaError_t e1 = cudaFuncSetAttribute(attn_tc_kernel<true, false, STAGES, SPLIT_QK>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    cudaError_t e2 = cudaFuncSetAttribute(attn_tc_kernel<false, false, STAGES, SPLIT_QK>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    cudaError_t e3 = cudaFuncSetAttribute(attn_tc_kernel<true, true, STAGES, SPLIT_QK>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    cudaError_t e4 = cudaFuncSetAttribute(attn_tc_kernel<false, true, STAGES, SPLIT_QK>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e1 != cudaSuccess || e2 != cudaSuccess || e3 != cudaSuccess || e4 != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return true;
}

template <int STAGES>
static bool set_narrow_attributes(void)
{
    const int bytes = narrow_smem_total(STAGES);
    cudaError_t e1 = cudaFuncSetAttribute(attn_narrow_kernel<true, false, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    cudaError_t e2 = cudaFuncSetAttribute(attn_narrow_kernel<false, false, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    cudaError_t e3 = cudaFuncSetAttribute(attn_narrow_kernel<true, true, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    cudaError_t e4 = cudaFuncSetAttribute(attn_narrow_kernel<false, true, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e1 != cudaSuccess || e2 != cudaSuccess || e3 != cudaSuccess || e4 != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return true;
}

/* 3 stages of the 64-row kernels come with 4 of the narrow one (176 KB), 2 with 2 (100 KB). */
template <int STAGES>
static bool set_tc_attributes(void)
{
    return set_tc_attributes_one<STAGES, false>() && set_tc_attributes_one<STAGES, true>() &&
           set_narrow_attributes<STAGES == 3 ? 4 : 2>();
}

static int tc_kernel_stages(int device)
{
    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    const char *e = getenv("AR_MLA_STAGES");
    int cap = (e && strcmp(e, "2") == 0) ? 2 : 3;
    if (cap >= 3 && optin >= smem_total(3, true) && optin >= narrow_smem_total(4) && set_tc_attributes<3>() &&
        set_tc_attributes<2>())
        return 3;
    if (optin >= smem_total(2, true) && set_tc_attributes<2>()) return 2;
    return 0;
}

static ar_cuda_mla_kernel env_kernel(void)
{
    const char *e = getenv("AR_MLA_KERNEL");
    if (e && strcmp(e, "simt") == 0) return AR_MLA_KERNEL_SIMT;
    if (e && strcmp(e, "tc") == 0) return AR_MLA_KERNEL_TC;
    if (e && strcmp(e, "tc-split-qk") == 0) return AR_MLA_KERNEL_TC_SPLIT_QK;
    if (e && strcmp(e, "tc-wgmma") == 0) return AR_MLA_KERNEL_TC_WGMMA;
    return AR_MLA_KERNEL_AUTO;
}

/* ---------------------------------------------------------------------------------------- */
/* The planner: row tiles of 64 (token, head) rows per request, cut into key pieces so that   */
/* the launch fills the SMs (FlashMLA-like: payload per SM = total / SMs, pieces of at least   */
/* 4 key tiles), then sorted longest first.                                                   */

typedef struct mla_plan {
    work_item *work;
    combine_group *groups;
    int num_work, num_groups, num_partials;
    int num_ctas;           /* CTAs of the launch: num_work, or fewer for a persistent plan */
    int max_rows;           /* most rows (q_len * H) of a planned request */
} mla_plan;

static void plan_free(mla_plan *p)
{
    free(p->work);
    free(p->groups);
    memset(p, 0, sizeof *p);
}

static int cmp_work_len(const void *pa, const void *pb)
{
    const work_item *a = (const work_item *)pa, *b = (const work_item *)pb;
    int la = a->key_end - a->key_begin, lb = b->key_end - b->key_begin;
    if (la != lb) return lb - la;
    if (a->req != b->req) return a->req - b->req;
    if (a->row0 != b->row0) return a->row0 - b->row0;
    return a->key_begin - b->key_begin;
}

static int host_key_limit(int causal, int sl, int ql, int i, int extra)
{
    if (!causal) return sl;
    int lim = sl - ql + i + 1 + extra;
    if (lim > sl) lim = sl;
    return lim < 0 ? 0 : lim;
}

/* Key limit of the row tile at row0 of a request (its last row's limit: rows are token-major). */
static int row_tile_key_end(int causal, int sl, int ql, int H, int row0, int nrows, int extra)
{
    int last = row0 + ROWS - 1 < nrows - 1 ? row0 + ROWS - 1 : nrows - 1;
    return host_key_limit(causal, sl, ql, last / H, extra);
}

/* Key tiles and row tiles of the planned requests, and their most rows. */
static void plan_totals(int R, const int *qsl, const int *seq_lens, const unsigned char *include, int H, int causal,
                        int extra, int64_t *total_tiles, int64_t *n_rowtiles, int *max_rows)
{
    *total_tiles = *n_rowtiles = 0;
    *max_rows = 0;
    for (int r = 0; r < R; r++) {
        if (include && !include[r]) continue;
        int ql = qsl[r + 1] - qsl[r], nrows = ql * H;
        if (nrows > *max_rows) *max_rows = nrows;
        for (int row0 = 0; row0 < nrows; row0 += ROWS) {
            *total_tiles += (row_tile_key_end(causal, seq_lens[r], ql, H, row0, nrows, extra) + KEYS - 1) / KEYS;
            (*n_rowtiles)++;
        }
    }
}

/* include[r] != 0 selects the requests to plan (NULL: all). 0 ok, -1 out of memory. */
static int build_plan(mla_plan *p, int R, const int *qsl, const int *seq_lens, const unsigned char *include, int H,
                      int causal, int extra, int num_sms, int force_splits)
{
    memset(p, 0, sizeof *p);
    int64_t n_items = 0, total_tiles = 0;
    int max_rows = 0;
    plan_totals(R, qsl, seq_lens, include, H, causal, extra, &total_tiles, &n_items, &max_rows);
    int64_t chunk = num_sms > 0 ? (total_tiles + num_sms - 1) / num_sms : total_tiles;
    if (chunk < 4) chunk = 4;
    /* count pieces */
    int64_t n_work = 0, n_groups = 0, n_partials = 0;
    for (int pass = 0; pass < 2; pass++) {
        int64_t wi = 0, gi = 0, pi = 0;
        for (int r = 0; r < R; r++) {
            if (include && !include[r]) continue;
            int ql = qsl[r + 1] - qsl[r], nrows = ql * H;
            for (int row0 = 0; row0 < nrows; row0 += ROWS) {
                int kend = row_tile_key_end(causal, seq_lens[r], ql, H, row0, nrows, extra);
                int64_t ntiles = (kend + KEYS - 1) / KEYS;
                int64_t my_chunk = chunk;
                if (force_splits > 0) my_chunk = ntiles > 0 ? (ntiles + force_splits - 1) / force_splits : 1;
                int64_t pieces = ntiles > 0 ? (ntiles + my_chunk - 1) / my_chunk : 1;
                if (pass == 1) {
                    if (pieces > 1) {
                        combine_group *g = &p->groups[gi];
                        g->req = r;
                        g->row0 = row0;
                        g->first_partial = (int)pi;
                        g->count = (int)pieces;
                    }
                    for (int64_t k = 0; k < pieces; k++) {
                        work_item *w = &p->work[wi + k];
                        memset(w, 0, sizeof *w);
                        w->req = r;
                        w->row0 = row0;
                        w->key_begin = (int)(k * my_chunk * KEYS);
                        int64_t e = (k + 1) * my_chunk * KEYS;
                        w->key_end = (int)(e < kend ? e : kend);
                        if (ntiles == 0) w->key_begin = w->key_end = 0;
                        w->partial = pieces > 1 ? (int)(pi + k) : -1;
                        w->next = -1;   /* one piece per CTA (a persistent kernel stops after it) */
                    }
                }
                wi += pieces;
                if (pieces > 1) {
                    gi++;
                    pi += pieces;
                }
            }
        }
        if (pass == 0) {
            n_work = wi;
            n_groups = gi;
            n_partials = pi;
            p->work = (work_item *)malloc((size_t)(n_work > 0 ? n_work : 1) * sizeof(work_item));
            p->groups = (combine_group *)malloc((size_t)(n_groups > 0 ? n_groups : 1) * sizeof(combine_group));
            if (!p->work || !p->groups) {
                plan_free(p);
                return -1;
            }
        }
    }
    (void)n_items;
    qsort(p->work, (size_t)n_work, sizeof(work_item), cmp_work_len);
    p->num_work = (int)n_work;
    p->num_ctas = (int)n_work;
    p->num_groups = (int)n_groups;
    p->num_partials = (int)n_partials;
    p->max_rows = max_rows;
    return 0;
}

/* The persistent plan of the narrow variants with persistent = 1 (FlashMLA's tile scheduler in
 * spirit): the row tiles' key tiles, concatenated in request order, are cut into num_ctas runs
 * of ceil(total / num_ctas) tiles; CTA c runs the pieces of run c one after another (work[c],
 * then the chain of work[].next), so every CTA gets the same number of key tiles (a request cut
 * at a run boundary becomes two pieces merged by the combine kernel).  Empty row tiles (no
 * visible key) ride with the CTA of the run being filled.  num_ctas of the result may be
 * smaller than asked (rounding).  Same arguments and return as build_plan. */
static int build_plan_persistent(mla_plan *p, int R, const int *qsl, const int *seq_lens, const unsigned char *include,
                                 int H, int causal, int extra, int num_ctas)
{
    memset(p, 0, sizeof *p);
    int64_t total_tiles = 0, n_rowtiles = 0;
    int max_rows = 0;
    plan_totals(R, qsl, seq_lens, include, H, causal, extra, &total_tiles, &n_rowtiles, &max_rows);
    if (num_ctas < 1) num_ctas = 1;
    const int64_t target = total_tiles > 0 ? (total_tiles + num_ctas - 1) / num_ctas : 1;
    /* at most one cut per run boundary: n_rowtiles + num_ctas pieces */
    const int64_t cap = n_rowtiles + num_ctas + 1;
    work_item *tmp = (work_item *)malloc((size_t)cap * sizeof(work_item));
    int *cta_of = (int *)malloc((size_t)cap * sizeof(int));
    p->groups = (combine_group *)malloc((size_t)(n_rowtiles > 0 ? n_rowtiles : 1) * sizeof(combine_group));
    p->work = (work_item *)malloc((size_t)cap * sizeof(work_item));
    int *first = (int *)malloc((size_t)num_ctas * sizeof(int)), *last_of = (int *)malloc((size_t)num_ctas * sizeof(int));
    if (!tmp || !cta_of || !p->groups || !p->work || !first || !last_of) {
        free(tmp);
        free(cta_of);
        free(first);
        free(last_of);
        plan_free(p);
        return -1;
    }
    int64_t n = 0, used = 0;
    int cta = 0, n_groups = 0, n_partials = 0;
    for (int r = 0; r < R; r++) {
        if (include && !include[r]) continue;
        int ql = qsl[r + 1] - qsl[r], nrows = ql * H;
        for (int row0 = 0; row0 < nrows; row0 += ROWS) {
            int kend = row_tile_key_end(causal, seq_lens[r], ql, H, row0, nrows, extra);
            int64_t ntiles = (kend + KEYS - 1) / KEYS;
            int64_t begin_n = n, start = 0;
            if (ntiles == 0) {
                memset(&tmp[n], 0, sizeof tmp[n]);
                tmp[n].req = r;
                tmp[n].row0 = row0;
                cta_of[n++] = cta;
            }
            while (start < ntiles) {
                if (used >= target && cta < num_ctas - 1) {
                    cta++;
                    used = 0;
                }
                int64_t take = cta == num_ctas - 1 ? ntiles - start : target - used;
                if (take > ntiles - start) take = ntiles - start;
                memset(&tmp[n], 0, sizeof tmp[n]);
                tmp[n].req = r;
                tmp[n].row0 = row0;
                tmp[n].key_begin = (int)(start * KEYS);
                int64_t e = (start + take) * KEYS;
                tmp[n].key_end = (int)(e < kend ? e : kend);
                cta_of[n++] = cta;
                start += take;
                used += take;
            }
            int64_t pieces = n - begin_n;
            if (pieces > 1) {
                combine_group *g = &p->groups[n_groups++];
                g->req = r;
                g->row0 = row0;
                g->first_partial = n_partials;
                g->count = (int)pieces;
            }
            for (int64_t k = 0; k < pieces; k++) tmp[begin_n + k].partial = pieces > 1 ? n_partials + (int)k : -1;
            if (pieces > 1) n_partials += (int)pieces;
        }
    }
    /* CTA c's first piece at index c, the others after the last CTA, chained by next */
    const int ctas = n > 0 ? cta_of[n - 1] + 1 : 0;
    for (int c = 0; c < ctas; c++) first[c] = last_of[c] = -1;
    int64_t next_free = ctas;
    for (int64_t i = 0; i < n; i++) {
        int c = cta_of[i];
        int64_t at = first[c] < 0 ? c : next_free++;
        p->work[at] = tmp[i];
        p->work[at].next = -1;
        if (first[c] < 0)
            first[c] = (int)at;
        else
            p->work[last_of[c]].next = (int)at;
        last_of[c] = (int)at;
    }
    free(tmp);
    free(cta_of);
    free(first);
    free(last_of);
    p->num_work = (int)n;
    p->num_ctas = ctas;
    p->num_groups = n_groups;
    p->num_partials = n_partials;
    p->max_rows = max_rows;
    return 0;
}

/* Which tensor-core kernel runs a launch: the 64-row kernel, its split-score variant, the
 * narrow 16-row kernel (only when every planned request has at most 16 rows), or the Hopper
 * wgmma 64-row kernel (cuda_mla_wgmma.cuh). */
enum tc_variant { TC_FULL = 0, TC_SPLIT_QK = 1, TC_NARROW = 2, TC_WGMMA = 3 };

/* Whether attn_wgmma_kernel can run on this device: compute capability 9.0 (the sm_90a code of
 * the fat binary) and its shared memory granted; sets that attribute of both instantiations. */
static bool wgmma_kernel_usable(int device)
{
    int major = 0, minor = 0, optin = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    if (major != 9 || minor != 0 || optin < WG_SMEM) return false;
    const void *const fns[12] = {(const void *)attn_wgmma_kernel<true>, (const void *)attn_wgmma_kernel<false>,
                                (const void *)attn_wgmma_s1_kernel<true>, (const void *)attn_wgmma_s1_kernel<false>,
                                (const void *)attn_wgmma_ws_kernel<true, true>, (const void *)attn_wgmma_ws_kernel<false, true>,
                                (const void *)attn_wgmma_ws_kernel<true, false>, (const void *)attn_wgmma_ws_kernel<false, false>,
                                (const void *)attn_wgmma_seesaw_kernel<true, false>, (const void *)attn_wgmma_seesaw_kernel<false, false>,
                                (const void *)attn_wgmma_seesaw_kernel<true, true>, (const void *)attn_wgmma_seesaw_kernel<false, true>};
    for (int i = 0; i < 12; i++)
        if (cudaFuncSetAttribute(fns[i], cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM) != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
    /* the TMA variants (6, 7): + their two mbarriers */
    const void *const tma_fns[4] = {(const void *)attn_wgmma_s1_tma_kernel<true>, (const void *)attn_wgmma_s1_tma_kernel<false>,
                                    (const void *)attn_wgmma_seesaw_rs_tma_kernel<true>,
                                    (const void *)attn_wgmma_seesaw_rs_tma_kernel<false>};
    for (int i = 0; i < 4; i++)
        if (cudaFuncSetAttribute(tma_fns[i], cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM_TMA) != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
    return true;
}

/* ---- Variants of the wgmma kernel (rounds 2 and 3; bench_mla wgsweep compares them) ---- */

typedef struct wg_variant_info {
    const char *name;
    const char *about;
} wg_variant_info;

/* Variant v (0-based, as AR_MLA_WG_VARIANT and ar_cuda_mla_case.wg_variant take it). */
static const wg_variant_info wg_variants[] = {
    {"base", "round 1: S split by keys (2 x m64n32k16), 3 CTA barriers a tile, all threads load"},
    {"s1", "S by warpgroup 0 alone (m64n64k16, full rows: no max exchange), 2 CTA barriers a tile"},
    {"ws", "warp-specialised: wg 1 loads + P V half, wg 0 S + softmax + P V half (P from registers), named barriers"},
    {"ws-ss", "as ws with warpgroup 0's P read from the shared P tile (SS) instead of registers"},
    {"seesaw", "FlashMLA's seesaw: wg 0 S of even tiles, wg 1 of odd ones (m64n64k16), max and P exchanged, "
               "each wg P V of both tiles on its 256 columns"},
    {"seesaw-rs", "as seesaw with each warpgroup's own P (of the tile whose S it computed) from registers (RS)"},
    {"s1-tma", "s1 with the key tiles by TMA (one thread issues tile t + 1's boxes onto a full mbarrier per ring "
               "slot); a tile reaching past key_end by cp.async (zero fill)"},
    {"seesaw-rs-tma", "seesaw-rs with the key tiles by TMA (the loading warpgroup's first thread issues the boxes, "
                      "the S warpgroup waits on the slot's mbarrier); a tile reaching past key_end by cp.async"},
};
static const int NUM_WG_VARIANTS = (int)(sizeof wg_variants / sizeof wg_variants[0]);
static_assert(sizeof wg_variants / sizeof wg_variants[0] == AR_CUDA_MLA_WG_VARIANT_COUNT,
              "cuda_mla.h's variant count names every wgmma variant");

/* The cp.async variant a TMA variant is built on (what runs instead when its tensor map cannot
 * be made), or -1 for a variant without TMA. */
static int wg_tma_twin(int v)
{
    return v == 6 ? 1 : v == 7 ? 5 : -1;
}

/* For a TMA variant (a->wg_variant, see wg_tma_twin) on a 16-bit cache: encodes in *map the
 * TMA view of the latent cache a->cache, [num_slots][576] 16-bit (rows 1152 bytes apart), with
 * boxes of {64 dims, min(block size, 32) keys} and the 128-byte swizzle (the kernels' tile
 * layout; wg_tma_keys).  0: ready (or nothing to do: not a TMA variant, an fp8 cache); 3 with
 * "cuda-mla wgmma: tensor map: <why>" in err when the map cannot be made (no driver entry point,
 * a block size below 16, more than 2^31 slots, the driver refused): a->wg_variant is then the
 * cp.async twin, so the launch still runs a correct kernel. */
static int wg_prepare_tma(attn_args *a, size_t num_slots, CUtensorMap *map, char *err, size_t err_len)
{
    const int twin = wg_tma_twin(a->wg_variant);
    if (twin < 0 || a->fp8_cache) return 0;
    memset(map, 0, sizeof *map);
    if (a->block_size < 16 || num_slots < 1 || num_slots > (size_t)INT32_MAX) {
        snprintf(err, err_len, "cuda-mla wgmma: tensor map: block size %d, %zu cache slots (rules: block >= 16 keys, "
                 "1 .. 2^31 - 1 slots)", a->block_size, num_slots);
        a->wg_variant = twin;
        return 3;
    }
    const uint64_t dims[2] = {(uint64_t)D, (uint64_t)num_slots};
    const uint64_t stride_bytes[1] = {(uint64_t)D * 2};
    const uint32_t box[2] = {64, 1u << wg_tma_rows_log2(a->block_size_log2)};
    if (ar_tma_encode(map, a->cache, 2, dims, stride_bytes, box, "cuda-mla wgmma", err, err_len) != 0) {
        a->wg_variant = twin;
        return 3;
    }
    return 0;
}

/* What runs when neither the case nor AR_MLA_WG_VARIANT names a variant: s1-tma (6), the
 * fastest at 4k-8k of round 4's H200 sweep (b = 128, h_q = 128, bf16, 2026-11-30 11:52 UTC:
 * 506 / 541 / 557 / 567 TFLOP/s at s_k 4k / 8k / 16k / 32k against seesaw-rs-tma's 500 / 539 /
 * 561 / 572 and s1's 354 / 367 / 378 / 383; same error against the reference).  Where its
 * tensor map is refused it runs as s1 (1), the default before. */
static const int WG_DEFAULT_VARIANT = 6;

/* The variant AR_MLA_WG_VARIANT names (a number or a name; read once), else the default. */
static int env_wg_variant(void)
{
    static int cached = -1;
    if (cached >= 0) return cached;
    int v = WG_DEFAULT_VARIANT;
    const char *e = getenv("AR_MLA_WG_VARIANT");
    if (e && *e) {
        for (int i = 0; i < NUM_WG_VARIANTS; i++)
            if (strcmp(e, wg_variants[i].name) == 0) v = i;
        if (e[0] >= '0' && e[0] <= '9' && atoi(e) < NUM_WG_VARIANTS) v = atoi(e);
    }
    cached = v;
    return v;
}


/* AUTO: where the wgmma kernel can run (wgmma_ok: a compute-capability 9.0 device and a
 * bf16/fp16 cache) and some request has 16 rows or more (s_q * h_q), the wgmma kernel - at
 * h_q = 16 its default variant s1-tma streams the cache at 3.37 / 3.74 / 3.87 / 3.94 TB/s (4k -
 * 32k keys, H200, 2026-11-30 12:20 UTC, with the row-parallel combine) against the narrow
 * kernel's 3.09 / - / 3.65 / 3.72, a quarter of each 64-row tile used; else the narrow kernel
 * when every request has <= 16 rows; else the split-score variant (fewer MACs: 160 vs 135
 * TFLOP/s at h_q = 128 on the H200).  prefer_narrow (a test or bench case that names a narrow
 * variant) runs the narrow kernel wherever every request has <= 16 rows.  TC and TC_SPLIT_QK
 * force a 64-row kernel, TC_WGMMA the wgmma kernel where wgmma_ok (else split-QK; the case hook
 * refuses it instead). */
static tc_variant choose_variant(ar_cuda_mla_kernel k, int max_rows, bool wgmma_ok, bool prefer_narrow)
{
    if (k == AR_MLA_KERNEL_TC) return TC_FULL;
    if (k == AR_MLA_KERNEL_TC_SPLIT_QK) return TC_SPLIT_QK;
    if (k == AR_MLA_KERNEL_TC_WGMMA) return wgmma_ok ? TC_WGMMA : TC_SPLIT_QK;
    if (max_rows <= NROWS && (prefer_narrow || !wgmma_ok || max_rows < NROWS)) return TC_NARROW;
    return wgmma_ok ? TC_WGMMA : TC_SPLIT_QK;
}

/* Key-tile stages of a variant given the 64-row kernels' stages (3 on Hopper, 2 forced / A100);
 * the wgmma kernel has a ring of 2 key tiles of 64 keys. */
static int variant_stages(tc_variant v, int tc_stages)
{
    if (tc_stages <= 0) return 0;
    if (v == TC_WGMMA) return 2;
    return v == TC_NARROW ? (tc_stages >= 3 ? 4 : 2) : tc_stages;
}

/* ---- Narrow-kernel variants (the h_q = 16 sweep of bench_mla; see attn_narrow1_kernel) ---- */

typedef void (*narrow_kernel_fn)(attn_args);

typedef struct narrow_variant {
    const char *name;
    const char *about;
    int stages;             /* key-ring slots of 32 keys */
    int ctas_per_sm;        /* the kernel's __launch_bounds__ minimum; the planner aims at this many per SM */
    int combine_rows;       /* 1: combine_rows_kernel, 0: combine_kernel */
    int diagnostic;         /* 1: wrong results by design, timing only */
    int smem;               /* dynamic shared memory per CTA, bytes */
    narrow_kernel_fn bf16, fp16;
    int persistent;         /* 1: build_plan_persistent (NV_PERSIST kernels), 0: build_plan */
} narrow_variant;

/* Variant number v (1-based, as ar_cuda_mla_case.narrow_variant and AR_MLA_NARROW take it) is
 * narrow_variants[v - 1]; the first is the default kernel.  The bulk-copy variants come last:
 * should one fail on the device (a trapped mbarrier wait poisons the CUDA context), the sweep
 * has already measured the others. */
static const narrow_variant narrow_variants[] = {
    {"base", "attn_narrow_kernel: cp.async ring of 4 tiles, 3 CTA barriers per tile, 1 CTA/SM (the default before the sweep)",
     4, 1, 0, 0, narrow_smem_total(4), attn_narrow_kernel<true, false, 4>, attn_narrow_kernel<false, false, 4>, 0},
    {"base-s2x2", "attn_narrow_kernel with a ring of 2 at 2 CTAs/SM (128 registers), planner 2 x SMs CTAs",
     2, 2, 0, 0, narrow_smem_total(2), attn_narrow_kernel<true, false, 2, 2>, attn_narrow_kernel<false, false, 2, 2>, 0},
    {"b1-s4", "1 CTA barrier per tile, cp.async ring of 4", 4, 1, 0, 0, narrow1_smem_total(4),
     attn_narrow1_kernel<true, 4, 0, 1>, attn_narrow1_kernel<false, 4, 0, 1>, 0},
    {"b1-s5", "1 CTA barrier per tile, cp.async ring of 5", 5, 1, 0, 0, narrow1_smem_total(5),
     attn_narrow1_kernel<true, 5, 0, 1>, attn_narrow1_kernel<false, 5, 0, 1>, 0},
    {"b1-s4-q", "b1-s4 with the Q fragments in registers", 4, 1, 0, 0, narrow1_smem_total(4),
     attn_narrow1_kernel<true, 4, NV_QREG, 1>, attn_narrow1_kernel<false, 4, NV_QREG, 1>, 0},
    {"b1-s4-c", "b1-s4 with the row-parallel combine", 4, 1, 1, 0, narrow1_smem_total(4),
     attn_narrow1_kernel<true, 4, 0, 1>, attn_narrow1_kernel<false, 4, 0, 1>, 0},
    {"b1-s4-qp", "b1-s4-q on the persistent plan: one CTA per SM, each the same number of key tiles", 4, 1, 0, 0,
     narrow1_smem_total(4), attn_narrow1_kernel<true, 4, NV_QREG | NV_PERSIST, 1>,
     attn_narrow1_kernel<false, 4, NV_QREG | NV_PERSIST, 1>, 1},
    {"diag-load", "DIAGNOSTIC: b1-s4's cp.async ring without QK / softmax / PV (the load path alone)", 4, 1, 0, 1,
     narrow1_smem_total(4), attn_narrow1_kernel<true, 4, NV_NOMMA, 1>, attn_narrow1_kernel<false, 4, NV_NOMMA, 1>, 0},
    {"diag-noload", "DIAGNOSTIC: b1-s4 computing on its first 4 tiles over and over (the compute path alone)", 4, 1,
     0, 1, narrow1_smem_total(4), attn_narrow1_kernel<true, 4, NV_NOLOAD, 1>,
     attn_narrow1_kernel<false, 4, NV_NOLOAD, 1>, 0},
    {"diag-skeleton", "DIAGNOSTIC: b1-s4's loop with neither loads (after the first 4 tiles) nor compute: barriers only",
     4, 1, 0, 1, narrow1_smem_total(4), attn_narrow1_kernel<true, 4, NV_NOLOAD | NV_NOMMA, 1>,
     attn_narrow1_kernel<false, 4, NV_NOLOAD | NV_NOMMA, 1>, 0},
    {"bulk-s4", "1 barrier per tile, key rows by cp.async.bulk onto mbarriers, ring of 4", 4, 1, 0, 0,
     narrow1_smem_total(4), attn_narrow1_kernel<true, 4, NV_BULK, 1>, attn_narrow1_kernel<false, 4, NV_BULK, 1>, 0},
    {"bulk-s4-q", "bulk-s4 with the Q fragments in registers", 4, 1, 0, 0, narrow1_smem_total(4),
     attn_narrow1_kernel<true, 4, NV_BULK | NV_QREG, 1>, attn_narrow1_kernel<false, 4, NV_BULK | NV_QREG, 1>, 0},
    {"bulk-s5-q", "bulk, ring of 5, Q in registers", 5, 1, 0, 0, narrow1_smem_total(5),
     attn_narrow1_kernel<true, 5, NV_BULK | NV_QREG, 1>, attn_narrow1_kernel<false, 5, NV_BULK | NV_QREG, 1>, 0},
    {"bulk-s2x2", "bulk, ring of 2 at 2 CTAs/SM (128 registers), planner 2 x SMs CTAs", 2, 2, 0, 0,
     narrow1_smem_total(2), attn_narrow1_kernel<true, 2, NV_BULK, 2>, attn_narrow1_kernel<false, 2, NV_BULK, 2>, 0},
    {"bulk-s4-qc", "bulk-s4-q with the row-parallel combine", 4, 1, 1, 0, narrow1_smem_total(4),
     attn_narrow1_kernel<true, 4, NV_BULK | NV_QREG, 1>, attn_narrow1_kernel<false, 4, NV_BULK | NV_QREG, 1>, 0},
    {"bulk-s4-qp", "bulk-s4-q on the persistent plan", 4, 1, 0, 0, narrow1_smem_total(4),
     attn_narrow1_kernel<true, 4, NV_BULK | NV_QREG | NV_PERSIST, 1>,
     attn_narrow1_kernel<false, 4, NV_BULK | NV_QREG | NV_PERSIST, 1>, 1},
    {"bulk-s2x2-c", "bulk-s2x2 with the row-parallel combine", 2, 2, 1, 0, narrow1_smem_total(2),
     attn_narrow1_kernel<true, 2, NV_BULK, 2>, attn_narrow1_kernel<false, 2, NV_BULK, 2>, 0},
    {"diag-load-bulk", "DIAGNOSTIC: bulk-s4's ring without QK / softmax / PV", 4, 1, 0, 1, narrow1_smem_total(4),
     attn_narrow1_kernel<true, 4, NV_BULK | NV_NOMMA, 1>, attn_narrow1_kernel<false, 4, NV_BULK | NV_NOMMA, 1>, 0},
    /* (round 4) the default bulk-s2x2-c on the persistent plan, for the h_q = 16 loss at 4k keys
     * (b = 128: 16384 tiles of 32 keys): build_plan cuts each request's 128 tiles into 63 + 63 + 2
     * (chunk ceil(16384 / 264)), 384 CTAs for 264 slots: 256 long pieces, and 8 slots run the 128
     * two-tile pieces (16 each, each paying a CTA's Q load, ring fill and epilogue) beside them.
     * The persistent plan gives each of the 2 x 132 CTAs 62 - 63 consecutive tiles (1 - 2 pieces;
     * the ring and its mbarrier phases run on across them): the longest CTA carries 62.06 tiles
     * instead of 63 and no CTA starts late; expected +0-3% at 4k, = at 32k (the rest of the 4k
     * loss is per-launch / per-piece fixed cost and the combine, which this does not remove) */
    {"bulk-s2x2-cp", "bulk-s2x2-c on the persistent plan: 2 x SMs CTAs, each the same number of key tiles", 2, 2, 1,
     0, narrow1_smem_total(2), attn_narrow1_kernel<true, 2, NV_BULK | NV_PERSIST, 2>,
     attn_narrow1_kernel<false, 2, NV_BULK | NV_PERSIST, 2>, 1},
};
static const int NUM_NARROW_VARIANTS = (int)(sizeof narrow_variants / sizeof narrow_variants[0]);

/* Per variant (0-based): 1 usable on this device, -1 not (before sm_90, shared memory refused),
 * 0 not yet looked at.  Attributes are set once per process (one device). */
static int narrow_usable[sizeof narrow_variants / sizeof narrow_variants[0]];

static bool narrow_variant_usable(int vi)
{
    if (narrow_usable[vi] != 0) return narrow_usable[vi] > 0;
    int dev = 0, major = 0, optin = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    const narrow_variant &v = narrow_variants[vi];
    bool ok = (vi == 0 || major >= 9) && optin >= v.smem;
    for (int k = 0; ok && k < 2; k++) {
        const void *fn = (const void *)(k == 0 ? v.bf16 : v.fp16);
        ok = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem) == cudaSuccess;
        if (ok && v.ctas_per_sm > 1)
            ok = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, 100) == cudaSuccess;
    }
    if (!ok) cudaGetLastError();
    narrow_usable[vi] = ok ? 1 : -1;
    return ok;
}

/* The variant number AR_MLA_NARROW names (a name or a number), 0 when unset or unknown. */
static int env_narrow_variant(void)
{
    const char *e = getenv("AR_MLA_NARROW");
    if (!e || !*e) return 0;
    for (int i = 0; i < NUM_NARROW_VARIANTS; i++)
        if (strcmp(e, narrow_variants[i].name) == 0) return i + 1;
    int v = atoi(e);
    return v >= 1 && v <= NUM_NARROW_VARIANTS ? v : 0;
}

/* The variant a narrow launch runs when neither the case nor AR_MLA_NARROW names one.  The H200
 * sweep of 2026-11-30 (b = 128, h_q = 16, bf16; BENCHMARKS.md) measured at 32k keys: base 2.37
 * TB/s, bulk-s2x2 3.50 (the best; at 16k 3.32, at 4k 2.61), and the row-parallel combine 8 us
 * instead of 34-42; bulk-s2x2-c is the two together (sm_90, bf16/fp16 cache; base elsewhere).
 * Since round 4 (H200, 12:00 UTC, same run): bulk-s2x2-cp, the same on the persistent plan, 3.08 /
 * 3.65 / 3.69 TB/s at 4k / 16k / 32k (3.80 on a contiguous block table) against bulk-s2x2-c's
 * 2.99 / 3.44 / 3.52 (3.53); the same outputs within 1e-5. */
static const char *const NARROW_DEFAULT_NAME = "bulk-s2x2-cp";

static int narrow_default_variant(void)
{
    for (int i = 0; i < NUM_NARROW_VARIANTS; i++)
        if (strcmp(narrow_variants[i].name, NARROW_DEFAULT_NAME) == 0) return i + 1;
    return 1;
}

/* Index into narrow_variants of what a narrow launch runs: the requested number (0: the
 * environment's, else the default above), base where the variant does not apply (fp8
 * cache, a 2-slot ring forced, a device before sm_90 or short of shared memory). */
static int resolve_narrow_variant(int requested, bool fp8, int stages)
{
    int v = requested > 0 ? requested : env_narrow_variant();
    if (v == 0) v = narrow_default_variant();
    if (v < 1 || v > NUM_NARROW_VARIANTS || fp8 || stages < 4) return 0;
    return narrow_variant_usable(v - 1) ? v - 1 : 0;
}

/* The plan of narrow variant vi (0-based) in place of the default plan p (built with num_sms):
 * the persistent plan, or build_plan aiming at ctas_per_sm x SMs CTAs; p unchanged for the
 * others and when the split count is forced.  0 ok, -1 out of memory. */
static int replan_for_narrow(mla_plan *p, int vi, int R, const int *qsl, const int *seq_lens,
                             const unsigned char *include, int H, int causal, int extra, int num_sms, int force_splits)
{
    const narrow_variant &v = narrow_variants[vi];
    if (force_splits > 0 || (!v.persistent && v.ctas_per_sm <= 1)) return 0;
    plan_free(p);
    if (v.persistent) return build_plan_persistent(p, R, qsl, seq_lens, include, H, causal, extra, num_sms * v.ctas_per_sm);
    return build_plan(p, R, qsl, seq_lens, include, H, causal, extra, num_sms * v.ctas_per_sm, force_splits);
}

extern "C" int ar_cuda_mla_narrow_variant_count(void) { return NUM_NARROW_VARIANTS; }

extern "C" const char *ar_cuda_mla_narrow_variant_name(int v)
{
    return v >= 1 && v <= NUM_NARROW_VARIANTS ? narrow_variants[v - 1].name : NULL;
}

extern "C" const char *ar_cuda_mla_narrow_variant_about(int v)
{
    return v >= 1 && v <= NUM_NARROW_VARIANTS ? narrow_variants[v - 1].about : NULL;
}

extern "C" bool ar_cuda_mla_narrow_variant_is_diagnostic(int v)
{
    return v >= 1 && v <= NUM_NARROW_VARIANTS && narrow_variants[v - 1].diagnostic;
}

/* Launches the latent attention (+ combine) for a planned step: the tensor-core kernel of the
 * variant with `stages` key-tile stages (64-row kernels 2 or 3, narrow 2 or 4), or the SIMT
 * kernel when stages is 0. */
template <bool BF16, bool FP8>
static void launch_tc(const attn_args &a, int stages, tc_variant variant, int narrow_vi, int num_work,
                      const CUtensorMap *tmap, cudaStream_t st)
{
    const bool split_qk = variant == TC_SPLIT_QK;
    if (variant == TC_WGMMA && !FP8) {   /* the planner never picks it with an fp8 cache */
        if (a.wg_variant == 1)
            attn_wgmma_s1_kernel<BF16><<<num_work, THREADS, WG_SMEM, st>>>(a);
        else if (a.wg_variant == 2)
            attn_wgmma_ws_kernel<BF16, true><<<num_work, THREADS, WG_SMEM, st>>>(a);
        else if (a.wg_variant == 3)
            attn_wgmma_ws_kernel<BF16, false><<<num_work, THREADS, WG_SMEM, st>>>(a);
        else if (a.wg_variant == 4)
            attn_wgmma_seesaw_kernel<BF16, false><<<num_work, THREADS, WG_SMEM, st>>>(a);
        else if (a.wg_variant == 5)
            attn_wgmma_seesaw_kernel<BF16, true><<<num_work, THREADS, WG_SMEM, st>>>(a);
        else if (a.wg_variant == 6 && tmap)
            attn_wgmma_s1_tma_kernel<BF16><<<num_work, THREADS, WG_SMEM_TMA, st>>>(a, *tmap);
        else if (a.wg_variant == 6)   /* no tensor map (wg_prepare_tma not called): its cp.async twin */
            attn_wgmma_s1_kernel<BF16><<<num_work, THREADS, WG_SMEM, st>>>(a);
        else if (a.wg_variant == 7 && tmap)
            attn_wgmma_seesaw_rs_tma_kernel<BF16><<<num_work, THREADS, WG_SMEM_TMA, st>>>(a, *tmap);
        else if (a.wg_variant == 7)
            attn_wgmma_seesaw_kernel<BF16, true><<<num_work, THREADS, WG_SMEM, st>>>(a);
        else
            attn_wgmma_kernel<BF16><<<num_work, THREADS, WG_SMEM, st>>>(a);
        return;
    }
    if (variant == TC_NARROW && stages >= 4 && narrow_vi > 0 && !FP8) {
        const narrow_variant &v = narrow_variants[narrow_vi];
        (BF16 ? v.bf16 : v.fp16)<<<num_work, THREADS, v.smem, st>>>(a);
    } else if (variant == TC_NARROW && stages >= 4)
        attn_narrow_kernel<BF16, FP8, 4><<<num_work, THREADS, narrow_smem_total(4), st>>>(a);
    else if (variant == TC_NARROW)
        attn_narrow_kernel<BF16, FP8, 2><<<num_work, THREADS, narrow_smem_total(2), st>>>(a);
    else if (stages >= 3 && split_qk)
        attn_tc_kernel<BF16, FP8, 3, true><<<num_work, THREADS, smem_total(3, true), st>>>(a);
    else if (stages >= 3)
        attn_tc_kernel<BF16, FP8, 3, false><<<num_work, THREADS, smem_total(3, false), st>>>(a);
    else if (split_qk)
        attn_tc_kernel<BF16, FP8, 2, true><<<num_work, THREADS, smem_total(2, true), st>>>(a);
    else
        attn_tc_kernel<BF16, FP8, 2, false><<<num_work, THREADS, smem_total(2, false), st>>>(a);
}

static cudaError_t launch_attention(const attn_args &a, int stages, tc_variant variant, int narrow_vi, int num_work,
                                    int num_groups, int num_tokens, const CUtensorMap *tmap, cudaStream_t st,
                                    cudaEvent_t ev_mid)
{
    if (stages > 0) {
        if (num_work > 0) {
            if (a.bf16 && !a.fp8_cache) launch_tc<true, false>(a, stages, variant, narrow_vi, num_work, tmap, st);
            else if (a.bf16) launch_tc<true, true>(a, stages, variant, narrow_vi, num_work, tmap, st);
            else if (!a.fp8_cache) launch_tc<false, false>(a, stages, variant, narrow_vi, num_work, tmap, st);
            else launch_tc<false, true>(a, stages, variant, narrow_vi, num_work, tmap, st);
        }
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
        if (ev_mid) cudaEventRecord(ev_mid, st);
        /* the row-parallel combine for the wgmma kernel (64-row groups) and the narrow variants
         * that ask for it (16-row groups); the same arithmetic as combine_kernel */
        if (num_groups > 0 && variant == TC_WGMMA)
            combine_rows_kernel<<<dim3((unsigned)num_groups, ROWS), 128, 0, st>>>(a);
        else if (num_groups > 0 && variant == TC_NARROW && narrow_variants[narrow_vi].combine_rows)
            combine_rows_kernel<<<dim3((unsigned)num_groups, NROWS), 128, 0, st>>>(a);
        else if (num_groups > 0)
            combine_kernel<<<num_groups, 256, 0, st>>>(a);
        return cudaGetLastError();
    }
    if (num_tokens > 0 && a.num_heads > 0)
        attn_simt_kernel<float><<<num_tokens * a.num_heads, SIMT_THREADS, 0, st>>>(a, a.o_lat, a.lse);
    cudaError_t e = cudaGetLastError();
    if (ev_mid) cudaEventRecord(ev_mid, st);
    return e;
}

static int cmp_double(const void *pa, const void *pb)
{
    double a = *(const double *)pa, b = *(const double *)pb;
    return a < b ? -1 : a > b;
}

static double median_of(double *v, int n)
{
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static bool have_device(char *why, size_t why_len) { return ar_cuda_have_device(why, why_len); }

/* ---------------------------------------------------------------------------------------- */
/* The FlashMLA-grid test hook                                                                */

/* Device buffers and events of the test hook, kept between cases. */
static dev_buf case_bufs[9];
static cudaEvent_t case_ev[3];

extern "C" void ar_cuda_mla_release_case_buffers(void)
{
    for (size_t i = 0; i < sizeof case_bufs / sizeof case_bufs[0]; i++) {
        if (case_bufs[i].ptr) cudaFree(case_bufs[i].ptr);
        case_bufs[i].ptr = NULL;
        case_bufs[i].cap = 0;
    }
    for (int i = 0; i < 3; i++) {
        if (case_ev[i]) cudaEventDestroy(case_ev[i]);
        case_ev[i] = NULL;
    }
}

extern "C" int ar_cuda_mla_run_case(const ar_cuda_mla_case *c, ar_cuda_mla_result *res, char *err, size_t err_len)
{
    res->attn_us = 0;
    res->combine_us = 0;
    res->narrow_variant = 0;
    res->narrow_variant_name = NULL;
    res->wg_variant = -1;
    res->wg_variant_name = NULL;
    res->num_work = res->num_groups = 0;
    if (c->batch < 1 || c->s_q < 1 || c->h_q < 1 ||
        (c->block_size != 16 && c->block_size != 32 && c->block_size != 64) ||
        (c->dtype != AR_BF16 && c->dtype != AR_FP16) ||
        (c->kv_dtype != c->dtype && c->kv_dtype != AR_FP8_E4M3) || !(c->kv_scale > 0)) {
        snprintf(err, err_len, "cuda-mla case: batch %d, s_q %d, h_q %d, block %d, dtype %s, kv %s, kv_scale %g "
                 "(rules: >= 1, block 16/32/64, bf16/fp16, kv = dtype or fp8_e4m3, kv_scale > 0)",
                 c->batch, c->s_q, c->h_q, c->block_size, ar_dtype_name(c->dtype), ar_dtype_name(c->kv_dtype),
                 c->kv_scale);
        return 2;
    }
    int max_sk = 0;
    for (int b = 0; b < c->batch; b++) {
        if (c->seqlens_k[b] < 0) {
            snprintf(err, err_len, "cuda-mla case: seqlens_k[%d] = %d is negative", b, c->seqlens_k[b]);
            return 2;
        }
        if (c->seqlens_k[b] > max_sk) max_sk = c->seqlens_k[b];
    }
    if (!have_device(err, err_len)) return 3;
    int dev = 0, num_sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev);
    int tc_stages = tc_kernel_stages(dev);
    if ((c->kernel == AR_MLA_KERNEL_TC || c->kernel == AR_MLA_KERNEL_TC_SPLIT_QK) && tc_stages == 0) {
        snprintf(err, err_len, "cuda-mla case: the tensor-core kernel needs %d bytes of shared memory per block",
                 smem_total(2, true));
        return 2;
    }
    if (c->stages == 2 && tc_stages > 2) tc_stages = 2;
    bool use_tc = c->kernel != AR_MLA_KERNEL_SIMT && tc_stages > 0;
    const bool wgmma_ok = use_tc && c->kv_dtype != AR_FP8_E4M3 && wgmma_kernel_usable(dev);
    if (c->force_wg_variant && (c->wg_variant < 0 || c->wg_variant >= NUM_WG_VARIANTS)) {
        snprintf(err, err_len, "cuda-mla case: wg_variant %d is not one of the wgmma kernel's 0 .. %d", c->wg_variant,
                 NUM_WG_VARIANTS - 1);
        return 2;
    }
    if (c->kernel == AR_MLA_KERNEL_TC_WGMMA && !wgmma_ok) {
        int major = 0, minor = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
        snprintf(err, err_len, "cuda-mla case: the wgmma kernel needs compute capability 9.0 and a bf16/fp16 cache "
                 "(device %d.%d, cache %s)", major, minor, ar_dtype_name(c->kv_dtype));
        return 2;
    }

    const int B = c->batch, SQ = c->s_q, H = c->h_q, bs = c->block_size;
    const int T = B * SQ;
    const int bpr = max_sk > 0 ? (max_sk + bs - 1) / bs : 1;
    const int num_blocks = B * bpr + 1;
    const bool fp8 = c->kv_dtype == AR_FP8_E4M3;
    int *h_qsl = (int *)malloc(sizeof(int) * (size_t)(B + 1));
    int *h_bt = (int *)malloc(sizeof(int) * (size_t)B * bpr);
    int *h_treq = (int *)malloc(sizeof(int) * (size_t)T);
    mla_plan plan;
    memset(&plan, 0, sizeof plan);
    if (!h_qsl || !h_bt || !h_treq) {
        free(h_qsl);
        free(h_bt);
        free(h_treq);
        snprintf(err, err_len, "cuda-mla case: out of host memory");
        return 3;
    }
    for (int b = 0; b <= B; b++) h_qsl[b] = b * SQ;
    for (int b = 0; b < B; b++)
        for (int k = 0; k < bpr; k++)
            h_bt[(int64_t)b * bpr + k] = c->contiguous_blocks ? 1 + b * bpr + k : ar_cuda_mla_case_block(b, k, bpr, num_blocks);
    for (int t = 0; t < T; t++) h_treq[t] = t / SQ;
    int rc = 0;
    if (build_plan(&plan, B, h_qsl, c->seqlens_k, NULL, H, c->causal ? 1 : 0, 0, num_sms, c->num_splits)) {
        snprintf(err, err_len, "cuda-mla case: out of host memory");
        rc = 3;
    }
    const tc_variant variant = choose_variant(c->kernel, plan.max_rows, wgmma_ok, c->narrow_variant > 0);
    const int stages = use_tc ? variant_stages(variant, tc_stages) : 0;
    /* a narrow variant at k CTAs per SM: the planner aims at k x SMs CTAs */
    const int narrow_vi =
        use_tc && variant == TC_NARROW ? resolve_narrow_variant(c->narrow_variant, fp8, stages) : 0;
    if (!rc && replan_for_narrow(&plan, narrow_vi, B, h_qsl, c->seqlens_k, NULL, H, c->causal ? 1 : 0, 0, num_sms,
                                 c->num_splits)) {
        snprintf(err, err_len, "cuda-mla case: out of host memory");
        rc = 3;
    }

    /* device memory: one allocation per array, freed at the end */
    void *d_meta = NULL, *d_q = NULL, *d_cache = NULL, *d_olat = NULL, *d_lse = NULL, *d_po = NULL, *d_pl = NULL;
    void *d_ref_o = NULL, *d_ref_l = NULL;
    size_t off = 0;
    size_t o_qsl = meta_take(&off, sizeof(int) * (size_t)(B + 1));
    size_t o_seq = meta_take(&off, sizeof(int) * (size_t)B);
    size_t o_bt = meta_take(&off, sizeof(int) * (size_t)B * bpr);
    size_t o_treq = meta_take(&off, sizeof(int) * (size_t)T);
    size_t o_work = meta_take(&off, sizeof(work_item) * (size_t)(plan.num_work + 1));
    size_t o_grp = meta_take(&off, sizeof(combine_group) * (size_t)(plan.num_groups + 1));
    size_t meta_bytes = mla_round_up(off, 16);
    size_t cache_bytes = (size_t)num_blocks * bs * D * (fp8 ? 1 : 2);
    size_t olat_elems = (size_t)T * H * DL, lse_elems = (size_t)H * T;
    cudaStream_t st = 0;
    cudaEvent_t ev0 = NULL, ev1 = NULL;
    /* device buffers are kept between cases (grow-only, ar_cuda_mla_release_case_buffers frees
     * them): a grid of 1000 cases no longer pays 9 cudaMalloc / cudaFree pairs per case */
    dev_buf *cb = case_bufs;
    if (!rc &&
        ((rc = mla_ensure(&cb[0], meta_bytes + (size_t)B, "case metadata", err, err_len)) ||
         (rc = mla_ensure(&cb[1], (size_t)T * H * D * 2, "case q", err, err_len)) ||
         (rc = mla_ensure(&cb[2], cache_bytes, "case cache", err, err_len)) ||
         (rc = mla_ensure(&cb[3], olat_elems * 4, "case out", err, err_len)) ||
         (rc = mla_ensure(&cb[4], lse_elems * 4, "case lse", err, err_len)) ||
         (rc = mla_ensure(&cb[5], (size_t)(plan.num_partials + 1) * ROWS * DL * 4, "case partials", err, err_len)) ||
         (rc = mla_ensure(&cb[6], (size_t)(plan.num_partials + 1) * ROWS * 4, "case partial LSE", err, err_len)) ||
         (c->want_reference &&
          ((rc = mla_ensure(&cb[7], olat_elems * 8, "case reference", err, err_len)) ||
           (rc = mla_ensure(&cb[8], lse_elems * 8, "case reference LSE", err, err_len)))) ||
         (!case_ev[0] && (rc = mla_fail(cudaEventCreate(&case_ev[0]), "event", err, err_len))) ||
         (!case_ev[1] && (rc = mla_fail(cudaEventCreate(&case_ev[1]), "event", err, err_len))) ||
         (!case_ev[2] && (rc = mla_fail(cudaEventCreate(&case_ev[2]), "event", err, err_len))))) {
        /* fall through to the clean-up */
    }
    if (!rc) {
        d_meta = cb[0].ptr;
        d_q = cb[1].ptr;
        d_cache = cb[2].ptr;
        d_olat = cb[3].ptr;
        d_lse = cb[4].ptr;
        d_po = cb[5].ptr;
        d_pl = cb[6].ptr;
        d_ref_o = cb[7].ptr;
        d_ref_l = cb[8].ptr;
        ev0 = case_ev[0];
        ev1 = case_ev[1];
    }
    if (!rc) {
        unsigned char *d = (unsigned char *)d_meta;
        cudaMemcpy(d + o_qsl, h_qsl, sizeof(int) * (size_t)(B + 1), cudaMemcpyHostToDevice);
        cudaMemcpy(d + o_seq, c->seqlens_k, sizeof(int) * (size_t)B, cudaMemcpyHostToDevice);
        cudaMemcpy(d + o_bt, h_bt, sizeof(int) * (size_t)B * bpr, cudaMemcpyHostToDevice);
        cudaMemcpy(d + o_treq, h_treq, sizeof(int) * (size_t)T, cudaMemcpyHostToDevice);
        cudaMemcpy(d + o_work, plan.work, sizeof(work_item) * (size_t)plan.num_work, cudaMemcpyHostToDevice);
        cudaMemcpy(d + o_grp, plan.groups, sizeof(combine_group) * (size_t)plan.num_groups, cudaMemcpyHostToDevice);
        cudaMemset(d_cache, 0xFF, cache_bytes);   /* NaN in bf16, fp16 and fp8 e4m3 */
        cudaMemset(d_olat, 0xFF, olat_elems * 4);
        cudaMemset(d_lse, 0xFF, lse_elems * 4);
        case_q_kernel<<<mla_grid((int64_t)T * H * (D / 16), 256), 256>>>((uint16_t *)d_q, B, SQ, H, c->seed, c->dtype);
        if (max_sk > 0)
            case_cache_kernel<<<mla_grid((int64_t)B * max_sk * (D / 16), 256), 256>>>(
                d_cache, B, (const int *)(d + o_seq), max_sk, bs, bpr, c->contiguous_blocks ? 1 : 0, num_blocks, c->seed,
                c->dtype, c->kv_dtype,
                (float)c->kv_scale);
        rc = mla_fail(cudaGetLastError(), "case input kernels", err, err_len);
        attn_args a;
        memset(&a, 0, sizeof a);
        a.q = d_q;
        a.cache = d_cache;
        a.o_lat = (float *)d_olat;
        a.lse = (float *)d_lse;
        a.part_o = (float *)d_po;
        a.part_lse = (float *)d_pl;
        a.qsl = (const int *)(d + o_qsl);
        a.seq_lens = (const int *)(d + o_seq);
        a.block_table = (const int *)(d + o_bt);
        a.tok_req = (const int *)(d + o_treq);
        a.work = (const work_item *)(d + o_work);
        a.groups = (const combine_group *)(d + o_grp);
        a.num_tokens = T;
        a.num_heads = H;
        a.mbpr = bpr;
        a.block_size = bs;
        a.block_size_log2 = bs == 16 ? 4 : bs == 32 ? 5 : 6;
        a.causal = c->causal ? 1 : 0;
        a.fault = AR_FAULT_NONE;
        a.bf16 = c->dtype == AR_BF16;
        a.fp8_cache = fp8;
        a.scale = (float)c->scale;
        a.scale_ref = c->scale;
        a.scale_log2 = (float)(c->scale * 1.4426950408889634);
        a.kv_scale = (float)c->kv_scale;
        a.wg_variant = c->force_wg_variant ? c->wg_variant : env_wg_variant();
        /* a TMA variant: the cache's tensor map (else its cp.async twin runs, and the result's
         * kernel name and variant say so) */
        CUtensorMap tmap;
        bool tma_refused = false;
        if (use_tc && variant == TC_WGMMA && wg_tma_twin(a.wg_variant) >= 0) {
            char why[256] = "";
            const int asked = a.wg_variant;
            if (wg_prepare_tma(&a, (size_t)num_blocks * bs, &tmap, why, sizeof why) != 0) {
                fprintf(stderr, "%s: wgmma variant %s runs as its cp.async twin %s\n", why, wg_variants[asked].name,
                        wg_variants[a.wg_variant].name);
                tma_refused = true;
            }
        }
        const CUtensorMap *const tmap_arg = wg_tma_twin(a.wg_variant) >= 0 ? &tmap : NULL;
        if (!rc) rc = mla_fail(launch_attention(a, stages, variant, narrow_vi, plan.num_ctas, plan.num_groups, T, tmap_arg, st, NULL), "attention", err, err_len);
        if (!rc) rc = mla_fail(cudaDeviceSynchronize(), "attention", err, err_len);
        if (!rc && c->repeat > 0) {
            /* times[i]: attention + combine; times[repeat + i]: the combine alone */
            double *times = (double *)malloc(sizeof(double) * 2 * (size_t)c->repeat);
            if (!times) {
                snprintf(err, err_len, "cuda-mla case: out of host memory");
                rc = 3;
            }
            for (int i = 0; !rc && i < c->repeat; i++) {
                cudaEventRecord(ev0, st);
                rc = mla_fail(launch_attention(a, stages, variant, narrow_vi, plan.num_ctas, plan.num_groups, T, tmap_arg, st, case_ev[2]), "attention", err, err_len);
                cudaEventRecord(ev1, st);
                if (!rc) rc = mla_fail(cudaEventSynchronize(ev1), "attention", err, err_len);
                float ms = 0, ms_comb = 0;
                cudaEventElapsedTime(&ms, ev0, ev1);
                cudaEventElapsedTime(&ms_comb, case_ev[2], ev1);
                times[i] = ms * 1e3;
                times[c->repeat + i] = ms_comb * 1e3;
            }
            if (!rc) {
                res->attn_us = median_of(times, c->repeat);
                res->combine_us = median_of(times + c->repeat, c->repeat);
            }
            free(times);
        }
        if (!rc && c->want_reference) {
            unsigned char *d_mask = NULL;
            if (c->ref_requests) {   /* after the metadata in the same buffer */
                d_mask = (unsigned char *)d_meta + meta_bytes;
                cudaMemcpy(d_mask, c->ref_requests, (size_t)B, cudaMemcpyHostToDevice);
            }
            if (!rc) {
                cudaMemset(d_ref_o, 0xFF, olat_elems * 8);
                cudaMemset(d_ref_l, 0xFF, lse_elems * 8);
                int groups = (H + REF_HEADS - 1) / REF_HEADS;
                ref_kernel<<<T * groups, REF_THREADS>>>(a, d_mask, (double *)d_ref_o, (double *)d_ref_l);
            }
            if (!rc) rc = mla_fail(cudaGetLastError(), "reference kernel", err, err_len);
            if (!rc) rc = mla_fail(cudaDeviceSynchronize(), "reference kernel", err, err_len);
        }
        /* results, converted to FlashMLA's layouts: out [b, s_q, h, 512] is o_lat as is;
         * lse [H, T] -> [b, h, s_q] with -inf -> +inf */
        if (!rc && res->out) rc = mla_fail(cudaMemcpy(res->out, d_olat, olat_elems * 4, cudaMemcpyDeviceToHost), "copy", err, err_len);
        /* the reference rows of the covered requests only (each request's rows are contiguous) */
        const size_t req_elems = (size_t)SQ * H * DL;
        for (int b = 0; !rc && res->ref_out && c->want_reference && b < B; b++)
            if (!c->ref_requests || c->ref_requests[b])
                rc = mla_fail(cudaMemcpy(res->ref_out + b * req_elems, (const double *)d_ref_o + b * req_elems,
                                         req_elems * 8, cudaMemcpyDeviceToHost),
                              "copy", err, err_len);
        float *lse_f = (float *)malloc(lse_elems * 4 + 4);
        double *lse_d = (double *)malloc(lse_elems * 8 + 8);
        if (!lse_f || !lse_d) {
            if (!rc) snprintf(err, err_len, "cuda-mla case: out of host memory");
            if (!rc) rc = 3;
        }
        if (!rc && res->lse) {
            rc = mla_fail(cudaMemcpy(lse_f, d_lse, lse_elems * 4, cudaMemcpyDeviceToHost), "copy", err, err_len);
            for (int n = 0; !rc && n < H; n++)
                for (int t = 0; t < T; t++) {
                    float v = lse_f[(size_t)n * T + t];
                    res->lse[((size_t)(t / SQ) * H + n) * SQ + t % SQ] = v == -INFINITY ? INFINITY : v;
                }
        }
        if (!rc && res->ref_lse && c->want_reference) {
            rc = mla_fail(cudaMemcpy(lse_d, d_ref_l, lse_elems * 8, cudaMemcpyDeviceToHost), "copy", err, err_len);
            for (int n = 0; !rc && n < H; n++)
                for (int t = 0; t < T; t++) {
                    double v = lse_d[(size_t)n * T + t];
                    res->ref_lse[((size_t)(t / SQ) * H + n) * SQ + t % SQ] = v == -INFINITY ? INFINITY : v;
                }
        }
        free(lse_f);
        free(lse_d);
        res->num_work = use_tc ? plan.num_ctas : T * H;
        res->num_groups = use_tc ? plan.num_groups : 0;
        res->stages = stages;
        res->kernel_name = !use_tc                 ? "simt"
                           : variant == TC_NARROW   ? "tc-narrow"
                           : variant == TC_SPLIT_QK ? "tc-split-qk"
                           : variant == TC_WGMMA    ? (tma_refused ? "tc-wgmma (no TMA map: cp.async twin)" : "tc-wgmma")
                                                    : "tc";
        if (use_tc && variant == TC_NARROW) {
            res->narrow_variant = narrow_vi + 1;
            res->narrow_variant_name = narrow_variants[narrow_vi].name;
        }
        if (use_tc && variant == TC_WGMMA) {
            res->wg_variant = a.wg_variant;   /* the TMA variant's twin if its map was refused */
            res->wg_variant_name = wg_variants[res->wg_variant].name;
        }
    }
    plan_free(&plan);
    free(h_qsl);
    free(h_bt);
    free(h_treq);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* The backend                                                                                */

/* Workspace bound of the prefill path, in tokens per context chunk (vLLM: up to 65536; smaller
 * here so that the up-projected chunk, tokens x heads x (192 + 128) values, stays modest). */
#define MLA_WORKSPACE_TOKENS 4096

typedef struct mla_state {
    ar_run_config cfg;
    int device;
    char device_name[256];
    int num_sms;
    int tc_stages;                  /* 0: no tensor-core kernel on this device */
    bool wgmma_ok;                  /* attn_wgmma_kernel can run: cc 9.0 and a bf16/fp16 cache */
    int H, P, V, bs, num_layers;
    bool bf16, fp8;
    size_t cache_bytes;             /* per layer */
    void **cache;                   /* [num_layers] -> [num_blocks, block_size, 576] */
    uint16_t **w_uk, **w_uv;        /* [num_layers] -> [H, 512, P] and [H, 512, V], made lazily */
    cudaStream_t stream;
    cudaEvent_t ev[8];              /* ev[0..6]: timing; ev[7]: the end of a forward's work */
    int *d_guard, *h_guard;         /* guard words found overwritten: device counter, pinned copy */

    /* the step (prepare) */
    int step_ready;
    int R, T, mbpr;
    int num_work, num_groups, num_partials;
    int num_ctas;                   /* CTAs of the latent-attention launch (num_work unless persistent) */
    int max_rows;                   /* most rows (q_len * H) of an absorbed request */
    int n_dec_reqs, n_pf_reqs, n_pf_tok, n_passes, ws_rows_max;
    int *pass_rows;                 /* [n_passes] rows of each pass (host) */
    size_t *pass_meta_off;          /* [n_passes] offset of the pass's arrays in meta */
    int *d_qsl, *d_seq, *d_bt, *d_treq, *d_tpos, *d_pf_tok;
    int64_t *d_slots;
    uint64_t *d_rkeys, *d_bkeys;
    work_item *d_work;
    combine_group *d_groups;

    dev_buf meta, qlat, qnope, lat, olat, out, lse, part_o, part_lse, fill;
    dev_buf ws_lat, ws_k, ws_v, pass_o, pass_lse, acc_o, acc_lse;
    void *h_meta;
    size_t h_meta_cap;
    void *h_out;                    /* pinned: out payload, then lse payload (host copies only) */
    size_t h_out_cap;
    size_t out_bytes, lse_bytes;
    ar_cuda_mla_kernel force_kernel;
    int narrow_vi;                  /* narrow_variants index of this step's narrow launch (AR_MLA_NARROW) */
    int force_splits;
    int use_prefill;
    int workspace_tokens;
    ar_cuda_mla_plan_info info;
} mla_state;

static bool mla_check(const ar_run_config *cfg, char *why, size_t why_len)
{
    const ar_model *m = &cfg->model;
    if (m->attention != AR_ATTN_MLA) {
        snprintf(why, why_len, "not an MLA model (cuda-mla runs model attention \"mla\" only)");
        return false;
    }
    if (m->kv_lora_rank != DL || m->qk_rope_head_dim != DR || m->head_size != D) {
        snprintf(why, why_len, "MLA dims kv_lora_rank %d, qk_rope_head_dim %d, head_size %d not supported "
                 "(512, 64, 576 as DeepSeek-V2/V3)", m->kv_lora_rank, m->qk_rope_head_dim, m->head_size);
        return false;
    }
    if (m->qk_nope_head_dim < 8 || m->qk_nope_head_dim > 256 || m->v_head_dim < 8 || m->v_head_dim > 256) {
        snprintf(why, why_len, "qk_nope_head_dim %d / v_head_dim %d not supported (8..256)", m->qk_nope_head_dim,
                 m->v_head_dim);
        return false;
    }
    if (m->num_kv_heads != 1 || m->num_q_heads < 1) {
        snprintf(why, why_len, "MLA needs num_kv_heads 1 and num_q_heads >= 1 (got %d, %d)", m->num_kv_heads,
                 m->num_q_heads);
        return false;
    }
    if (m->sliding_window != 0 || m->logits_soft_cap != 0) {
        snprintf(why, why_len, "sliding window / soft cap are not part of MLA");
        return false;
    }
    if (cfg->dtype != AR_FP16 && cfg->dtype != AR_BF16) {
        snprintf(why, why_len, "dtype %s not supported (fp16, bf16)", ar_dtype_name(cfg->dtype));
        return false;
    }
    if (cfg->kv_dtype != cfg->dtype && cfg->kv_dtype != AR_FP8_E4M3) {
        snprintf(why, why_len, "KV dtype %s not supported (the model dtype or fp8_e4m3)", ar_dtype_name(cfg->kv_dtype));
        return false;
    }
    if (cfg->kv_dtype == AR_FP8_E4M3 && !(cfg->kv_scale > 0)) {
        snprintf(why, why_len, "fp8 KV needs kv_scale > 0 (got %g)", cfg->kv_scale);
        return false;
    }
    if (cfg->block_size != 16 && cfg->block_size != 32 && cfg->block_size != 64) {
        snprintf(why, why_len, "block size %d not supported (16, 32, 64)", cfg->block_size);
        return false;
    }
    return ar_cuda_device_ok(why, why_len);
}

static void mla_close(void *state);
static int ensure_weights(mla_state *s, int layer, char *err, size_t err_len);

static int mla_open(const ar_run_config *cfg, void **state_out, char *err, size_t err_len)
{
    *state_out = NULL;
    char why[256];
    if (!mla_check(cfg, why, sizeof why)) {
        snprintf(err, err_len, "cuda-mla backend: %s", why);
        return strncmp(why, "no CUDA device", 14) == 0 ? 3 : 2;
    }
    mla_state *s = (mla_state *)calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_len, "cuda-mla backend: out of host memory");
        return 3;
    }
    s->cfg = *cfg;
    s->device = cfg->device_index;   /* chosen by the engine from the local rank (replay/shard.h) */
    s->H = cfg->model.num_q_heads;
    s->P = cfg->model.qk_nope_head_dim;
    s->V = cfg->model.v_head_dim;
    s->bs = cfg->block_size;
    s->bf16 = cfg->dtype == AR_BF16;
    s->fp8 = cfg->kv_dtype == AR_FP8_E4M3;
    s->num_layers = cfg->num_layers > 0 ? cfg->num_layers : 1;
    s->use_prefill = 1;
    s->workspace_tokens = MLA_WORKSPACE_TOKENS;
    s->force_kernel = env_kernel();
    int rc;
    cudaDeviceProp prop;
    if ((rc = mla_fail(cudaSetDevice(s->device), "cudaSetDevice", err, err_len)) ||
        (rc = mla_fail(cudaGetDeviceProperties(&prop, s->device), "cudaGetDeviceProperties", err, err_len))) {
        free(s);
        return rc;
    }
    snprintf(s->device_name, sizeof s->device_name, "%s", prop.name);
    s->num_sms = prop.multiProcessorCount;
    s->tc_stages = tc_kernel_stages(s->device);
    s->wgmma_ok = s->tc_stages > 0 && !s->fp8 && wgmma_kernel_usable(s->device);
    if ((rc = mla_fail(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "stream", err, err_len))) {
        free(s);
        return rc;
    }
    for (int i = 0; i < 8; i++)
        if ((rc = mla_fail(cudaEventCreate(&s->ev[i]), "event", err, err_len))) {
            mla_close(s);
            return rc;
        }
    if ((rc = mla_fail(cudaMalloc((void **)&s->d_guard, sizeof(int)), "guard counter", err, err_len)) ||
        (rc = mla_fail(cudaMallocHost((void **)&s->h_guard, sizeof(int)), "guard counter", err, err_len))) {
        mla_close(s);
        return rc;
    }
    s->cache_bytes = (size_t)cfg->num_blocks * cfg->block_size * D * (s->fp8 ? 1 : 2);
    size_t weight_bytes = (size_t)s->H * DL * (s->P + s->V) * 2;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    if ((double)(s->cache_bytes + weight_bytes) * s->num_layers > 0.85 * (double)free_b) {
        snprintf(err, err_len,
                 "cuda-mla backend: the latent caches and weights need %.2f GiB (%d layers x %.3f GiB) but the "
                 "device has %.2f GiB free; replay fewer layers or fewer blocks",
                 (double)(s->cache_bytes + weight_bytes) * s->num_layers / 1073741824.0, s->num_layers,
                 (double)(s->cache_bytes + weight_bytes) / 1073741824.0, free_b / 1073741824.0);
        mla_close(s);
        return 2;
    }
    s->cache = (void **)calloc((size_t)s->num_layers, sizeof(void *));
    s->w_uk = (uint16_t **)calloc((size_t)s->num_layers, sizeof(uint16_t *));
    s->w_uv = (uint16_t **)calloc((size_t)s->num_layers, sizeof(uint16_t *));
    if (!s->cache || !s->w_uk || !s->w_uv) {
        snprintf(err, err_len, "cuda-mla backend: out of host memory");
        mla_close(s);
        return 3;
    }
    for (int l = 0; l < s->num_layers; l++) {
        if ((rc = mla_fail(cudaMalloc(&s->cache[l], s->cache_bytes), "latent cache allocation", err, err_len)) ||
            (rc = mla_fail(cudaMemsetAsync(s->cache[l], 0xFF, s->cache_bytes, s->stream), "NaN fill", err, err_len)) ||
            (rc = ensure_weights(s, l, err, err_len))) {   /* here, not in the first step's forward */
            mla_close(s);
            return rc;
        }
    }
    if ((rc = mla_fail(cudaStreamSynchronize(s->stream), "open", err, err_len))) {
        mla_close(s);
        return rc;
    }
    *state_out = s;
    return 0;
}

static void mla_close(void *state)
{
    mla_state *s = (mla_state *)state;
    if (!s) return;
    if (s->stream) cudaStreamSynchronize(s->stream);
    for (int l = 0; l < s->num_layers; l++) {
        if (s->cache && s->cache[l]) cudaFree(s->cache[l]);
        if (s->w_uk && s->w_uk[l]) cudaFree(s->w_uk[l]);
        if (s->w_uv && s->w_uv[l]) cudaFree(s->w_uv[l]);
    }
    free(s->cache);
    free(s->w_uk);
    free(s->w_uv);
    dev_buf *bufs[] = {&s->meta, &s->qlat, &s->qnope, &s->lat, &s->olat, &s->out, &s->lse, &s->part_o,
                       &s->part_lse, &s->fill, &s->ws_lat, &s->ws_k, &s->ws_v, &s->pass_o, &s->pass_lse,
                       &s->acc_o, &s->acc_lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->ptr) cudaFree(bufs[i]->ptr);
    if (s->h_meta) cudaFreeHost(s->h_meta);
    if (s->h_out) cudaFreeHost(s->h_out);
    if (s->d_guard) cudaFree(s->d_guard);
    if (s->h_guard) cudaFreeHost(s->h_guard);
    for (int i = 0; i < 8; i++)
        if (s->ev[i]) cudaEventDestroy(s->ev[i]);
    if (s->stream) cudaStreamDestroy(s->stream);
    free(s->pass_rows);
    free(s->pass_meta_off);
    free(s);
}

static void mla_device_name(void *state, char *buf, size_t len)
{
    mla_state *s = (mla_state *)state;
    snprintf(buf, len, "%s", s ? s->device_name : "none");
}

static int mla_prepare(void *state, const ar_batch *b, char *err, size_t err_len)
{
    mla_state *s = (mla_state *)state;
    s->step_ready = 0;
    const int R = b->num_reqs, T = b->num_tokens, mbpr = b->max_blocks_per_req;
    const int bs = s->bs, nb = s->cfg.num_blocks, H = s->H;
    if (R < 0 || T < 0 || (R > 0 && mbpr <= 0)) {
        snprintf(err, err_len, "step %lld: batch has num_reqs %d, num_tokens %d, max_blocks_per_req %d",
                 (long long)b->step, R, T, mbpr);
        return 2;
    }
    if (R > 0 && (b->query_start_loc[0] != 0 || b->query_start_loc[R] != T)) {
        snprintf(err, err_len, "step %lld: query_start_loc must run from 0 to num_tokens %d", (long long)b->step, T);
        return 2;
    }
    for (int r = 0; r < R; r++) {
        int ql = b->query_start_loc[r + 1] - b->query_start_loc[r], sl = b->seq_lens[r];
        if (ql < 0 || sl < ql || sl > mbpr * bs) {
            snprintf(err, err_len,
                     "step %lld: request %d has query_len %d, seq_len %d (rule: 0 <= query_len <= seq_len <= "
                     "max_blocks_per_req * block_size = %d)", (long long)b->step, r, ql, sl, mbpr * bs);
            return 2;
        }
        for (int i = 0; i < (sl + bs - 1) / bs; i++) {
            int blk = b->block_table[(int64_t)r * mbpr + i];
            if (blk < 0 || blk >= nb) {
                snprintf(err, err_len, "step %lld: request %d block_table[%d] = %d outside [0, %d)",
                         (long long)b->step, r, i, blk, nb);
                return 2;
            }
        }
    }
    for (int t = 0; t < T; t++) {
        int64_t sl = b->slot_mapping[t];
        if (sl < -1 || sl >= (int64_t)nb * bs) {
            snprintf(err, err_len, "step %lld: slot_mapping[%d] = %lld outside [-1, %lld)", (long long)b->step, t,
                     (long long)sl, (long long)nb * bs);
            return 2;
        }
    }

    /* decode / prefill split (semantics 7.3) */
    unsigned char *is_pf = (unsigned char *)calloc((size_t)(R > 0 ? R : 1), 1);
    unsigned char *is_dec = (unsigned char *)calloc((size_t)(R > 0 ? R : 1), 1);
    if (!is_pf || !is_dec) {
        free(is_pf);
        free(is_dec);
        snprintf(err, err_len, "cuda-mla backend: out of host memory");
        return 3;
    }
    int n_pf_reqs = 0, n_pf_tok = 0, n_pf_ctx = 0;
    for (int r = 0; r < R; r++) {
        int ql = b->query_start_loc[r + 1] - b->query_start_loc[r];
        is_pf[r] = s->use_prefill && ql > AR_CUDA_MLA_DECODE_THRESHOLD;
        is_dec[r] = !is_pf[r];
        if (is_pf[r]) {
            n_pf_reqs++;
            n_pf_tok += ql;
            if (b->seq_lens[r] - ql > 0) n_pf_ctx++;
        }
    }
    const int extra = s->cfg.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0;
    mla_plan plan;
    int plan_rc = build_plan(&plan, R, b->query_start_loc, b->seq_lens, is_dec, H, 1, extra, s->num_sms, s->force_splits);
    /* AR_MLA_NARROW: a narrow variant (bench sweep) where the narrow kernel runs; at k CTAs per
     * SM the planner aims at k x SMs CTAs */
    const tc_variant tv = choose_variant(s->force_kernel, plan.max_rows, s->wgmma_ok, false);
    s->narrow_vi = 0;
    if (!plan_rc && s->force_kernel != AR_MLA_KERNEL_SIMT && tv == TC_NARROW)
        s->narrow_vi = resolve_narrow_variant(0, s->fp8, variant_stages(tv, s->tc_stages));
    if (!plan_rc)
        plan_rc = replan_for_narrow(&plan, s->narrow_vi, R, b->query_start_loc, b->seq_lens, is_dec, H, 1, extra,
                                    s->num_sms, s->force_splits);
    if (plan_rc) {
        free(is_pf);
        free(is_dec);
        snprintf(err, err_len, "cuda-mla backend: out of host memory");
        return 3;
    }

    /* prefill passes: context chunks of at most M tokens per request (workspace-bounded,
     * block-aligned as in vLLM), then one pass over the new tokens */
    int max_ctx = 0;
    for (int r = 0; r < R; r++)
        if (is_pf[r]) {
            int c = b->seq_lens[r] - (b->query_start_loc[r + 1] - b->query_start_loc[r]);
            if (c > max_ctx) max_ctx = c;
        }
    int chunk_m = n_pf_ctx > 0 ? s->workspace_tokens / n_pf_ctx : s->workspace_tokens;
    chunk_m = chunk_m / bs * bs;
    if (chunk_m < bs) chunk_m = bs;
    int n_ctx_chunks = max_ctx > 0 ? (max_ctx + chunk_m - 1) / chunk_m : 0;
    int n_passes = n_pf_reqs > 0 ? n_ctx_chunks + 1 : 0;
    free(s->pass_rows);
    free(s->pass_meta_off);
    s->pass_rows = (int *)calloc((size_t)(n_passes + 1), sizeof(int));
    s->pass_meta_off = (size_t *)calloc((size_t)(n_passes + 1) * 4, sizeof(size_t));
    if (!s->pass_rows || !s->pass_meta_off) {
        free(is_pf);
        free(is_dec);
        plan_free(&plan);
        snprintf(err, err_len, "cuda-mla backend: out of host memory");
        return 3;
    }
    int ws_rows_max = 0;
    for (int p = 0; p < n_passes; p++) {
        int rows = 0;
        for (int r = 0; r < R; r++) {
            if (!is_pf[r]) continue;
            int ql = b->query_start_loc[r + 1] - b->query_start_loc[r], ctx = b->seq_lens[r] - ql;
            if (p < n_ctx_chunks) {
                int lo = p * chunk_m, hi = (p + 1) * chunk_m < ctx ? (p + 1) * chunk_m : ctx;
                if (hi > lo) rows += hi - lo;
            } else {
                rows += ql;
            }
        }
        s->pass_rows[p] = rows;
        if (rows > ws_rows_max) ws_rows_max = rows;
    }

    /* metadata layout */
    size_t off = 0;
    size_t o_qsl = meta_take(&off, (size_t)(R + 1) * 4);
    size_t o_seq = meta_take(&off, (size_t)R * 4);
    size_t o_bt = meta_take(&off, (size_t)R * mbpr * 4);
    size_t o_treq = meta_take(&off, (size_t)T * 4);
    size_t o_tpos = meta_take(&off, (size_t)T * 4);
    size_t o_slots = meta_take(&off, (size_t)T * 8);
    size_t o_rkeys = meta_take(&off, (size_t)R * 8);
    size_t o_bkeys = meta_take(&off, (size_t)R * mbpr * 8);
    size_t o_work = meta_take(&off, (size_t)plan.num_work * sizeof(work_item));
    size_t o_groups = meta_take(&off, (size_t)plan.num_groups * sizeof(combine_group));
    size_t o_pftok = meta_take(&off, (size_t)n_pf_tok * 4);
    for (int p = 0; p < n_passes; p++) {
        s->pass_meta_off[4 * p + 0] = meta_take(&off, (size_t)s->pass_rows[p] * 4);   /* row_req */
        s->pass_meta_off[4 * p + 1] = meta_take(&off, (size_t)s->pass_rows[p] * 4);   /* row_pos */
        s->pass_meta_off[4 * p + 2] = meta_take(&off, (size_t)R * 4);                 /* kb */
        s->pass_meta_off[4 * p + 3] = meta_take(&off, (size_t)R * 4);                 /* ke */
    }
    size_t meta_bytes = mla_round_up(off, 16) + 16;
    int rc;
    if ((rc = mla_ensure_host(&s->h_meta, &s->h_meta_cap, meta_bytes, err, err_len)) ||
        (rc = mla_ensure(&s->meta, meta_bytes, "metadata buffer", err, err_len))) {
        free(is_pf);
        free(is_dec);
        plan_free(&plan);
        return rc;
    }
    unsigned char *h = (unsigned char *)s->h_meta;
    memcpy(h + o_qsl, b->query_start_loc, (size_t)(R + 1) * 4);
    memcpy(h + o_seq, b->seq_lens, (size_t)R * 4);
    memcpy(h + o_bt, b->block_table, (size_t)R * mbpr * 4);
    int *treq = (int *)(h + o_treq), *tpos = (int *)(h + o_tpos), *pftok = (int *)(h + o_pftok);
    int npf = 0;
    for (int r = 0; r < R; r++) {
        int q0 = b->query_start_loc[r], ql = b->query_start_loc[r + 1] - q0, ctx = b->seq_lens[r] - ql;
        for (int i = 0; i < ql; i++) {
            treq[q0 + i] = r;
            tpos[q0 + i] = ctx + i;
            if (is_pf[r]) pftok[npf++] = q0 + i;
        }
    }
    memcpy(h + o_slots, b->slot_mapping, (size_t)T * 8);
    memcpy(h + o_rkeys, b->req_keys, (size_t)R * 8);
    memcpy(h + o_bkeys, b->block_keys, (size_t)R * mbpr * 8);
    memcpy(h + o_work, plan.work, (size_t)plan.num_work * sizeof(work_item));
    memcpy(h + o_groups, plan.groups, (size_t)plan.num_groups * sizeof(combine_group));
    for (int p = 0; p < n_passes; p++) {
        int *row_req = (int *)(h + s->pass_meta_off[4 * p + 0]);
        int *row_pos = (int *)(h + s->pass_meta_off[4 * p + 1]);
        int *kb = (int *)(h + s->pass_meta_off[4 * p + 2]);
        int *ke = (int *)(h + s->pass_meta_off[4 * p + 3]);
        int w = 0;
        for (int r = 0; r < R; r++) {
            kb[r] = ke[r] = w;
            if (!is_pf[r]) continue;
            int ql = b->query_start_loc[r + 1] - b->query_start_loc[r], ctx = b->seq_lens[r] - ql;
            int lo, hi;
            if (p < n_ctx_chunks) {
                lo = p * chunk_m;
                hi = (p + 1) * chunk_m < ctx ? (p + 1) * chunk_m : ctx;
            } else {
                lo = ctx;
                hi = ctx + ql;
            }
            for (int pos = lo; pos < hi; pos++) {
                row_req[w] = r;
                row_pos[w] = pos;
                w++;
            }
            ke[r] = w;
        }
    }
    if ((rc = mla_fail(cudaMemcpyAsync(s->meta.ptr, s->h_meta, meta_bytes, cudaMemcpyHostToDevice, s->stream),
                       "metadata upload", err, err_len))) {
        free(is_pf);
        free(is_dec);
        plan_free(&plan);
        return rc;
    }
    unsigned char *d = (unsigned char *)s->meta.ptr;
    s->d_qsl = (int *)(d + o_qsl);
    s->d_seq = (int *)(d + o_seq);
    s->d_bt = (int *)(d + o_bt);
    s->d_treq = (int *)(d + o_treq);
    s->d_tpos = (int *)(d + o_tpos);
    s->d_slots = (int64_t *)(d + o_slots);
    s->d_rkeys = (uint64_t *)(d + o_rkeys);
    s->d_bkeys = (uint64_t *)(d + o_bkeys);
    s->d_work = (work_item *)(d + o_work);
    s->d_groups = (combine_group *)(d + o_groups);
    s->d_pf_tok = (int *)(d + o_pftok);

    /* per-step buffers */
    const int P = s->P, V = s->V, QK = P + DR;
    size_t out_payload = mla_round_up((size_t)T * H * V * 4 + 16, 256);
    size_t lse_payload = mla_round_up((size_t)H * T * 4 + 16, 256);
    size_t out_need = 2 * MLA_GUARD_BYTES + out_payload, lse_need = 2 * MLA_GUARD_BYTES + lse_payload;
    bool out_new = out_need > s->out.cap, lse_new = lse_need > s->lse.cap;
    size_t ws = (size_t)(ws_rows_max > 0 ? ws_rows_max : 1);
    size_t tpf = (size_t)(n_pf_tok > 0 ? T : 1);
    if ((rc = mla_ensure(&s->qlat, (size_t)T * H * D * 2 + 16, "latent query buffer", err, err_len)) ||
        (rc = mla_ensure(&s->qnope, (size_t)T * H * P * 2 + 16, "q_nope buffer", err, err_len)) ||
        (rc = mla_ensure(&s->lat, (size_t)T * D * 2 + 16, "new latent buffer", err, err_len)) ||
        (rc = mla_ensure(&s->olat, (size_t)T * H * DL * 4 + 16, "latent output buffer", err, err_len)) ||
        (rc = mla_ensure(&s->out, out_need, "out buffer", err, err_len)) ||
        (rc = mla_ensure(&s->lse, lse_need, "LSE buffer", err, err_len)) ||
        (rc = mla_ensure(&s->part_o, (size_t)(plan.num_partials + 1) * ROWS * DL * 4, "split partials", err, err_len)) ||
        (rc = mla_ensure(&s->part_lse, (size_t)(plan.num_partials + 1) * ROWS * 4, "split LSE", err, err_len)) ||
        (n_pf_reqs > 0 &&
         ((rc = mla_ensure(&s->ws_lat, ws * D * 2, "prefill latent workspace", err, err_len)) ||
          (rc = mla_ensure(&s->ws_k, ws * H * QK * 2, "prefill key workspace", err, err_len)) ||
          (rc = mla_ensure(&s->ws_v, ws * H * V * 2, "prefill value workspace", err, err_len)) ||
          (rc = mla_ensure(&s->pass_o, tpf * H * V * 4, "prefill pass output", err, err_len)) ||
          (rc = mla_ensure(&s->pass_lse, tpf * H * 4, "prefill pass LSE", err, err_len)) ||
          (rc = mla_ensure(&s->acc_o, tpf * H * V * 4, "prefill output", err, err_len)) ||
          (rc = mla_ensure(&s->acc_lse, tpf * H * 4, "prefill LSE", err, err_len)))) ||
        (rc = mla_ensure_host(&s->h_out, &s->h_out_cap, out_need + lse_need, err, err_len))) {
        free(is_pf);
        free(is_dec);
        plan_free(&plan);
        return rc;
    }
    s->out_bytes = out_payload;
    s->lse_bytes = lse_payload;
    /* prefill tokens' latent rows are never written by the absorbed path, but the W_UV GEMM
     * reads every row (its prefill rows are overwritten later): keep them defined */
    if (n_pf_reqs > 0) cudaMemsetAsync(s->olat.ptr, 0, (size_t)T * H * DL * 4, s->stream);
    if (out_new) cudaMemsetAsync(s->out.ptr, MLA_GUARD_BYTE, s->out.cap, s->stream);
    if (lse_new) cudaMemsetAsync(s->lse.ptr, MLA_GUARD_BYTE, s->lse.cap, s->stream);
    /* the payload moves with T: re-stamp the area after it */
    cudaMemsetAsync((char *)s->out.ptr + MLA_GUARD_BYTES + s->out_bytes, MLA_GUARD_BYTE,
                    s->out.cap - MLA_GUARD_BYTES - s->out_bytes, s->stream);
    cudaMemsetAsync((char *)s->lse.ptr + MLA_GUARD_BYTES + s->lse_bytes, MLA_GUARD_BYTE,
                    s->lse.cap - MLA_GUARD_BYTES - s->lse_bytes, s->stream);
    if ((rc = mla_fail(cudaGetLastError(), "guard set-up", err, err_len))) {
        free(is_pf);
        free(is_dec);
        plan_free(&plan);
        return rc;
    }
    s->R = R;
    s->T = T;
    s->mbpr = mbpr;
    s->num_work = plan.num_work;
    s->num_ctas = plan.num_ctas;
    s->num_groups = plan.num_groups;
    s->num_partials = plan.num_partials;
    s->max_rows = plan.max_rows;
    s->n_pf_reqs = n_pf_reqs;
    s->n_dec_reqs = R - n_pf_reqs;
    s->n_pf_tok = n_pf_tok;
    s->n_passes = n_passes;
    s->ws_rows_max = ws_rows_max;
    s->info.num_decode_reqs = R - n_pf_reqs;
    s->info.num_prefill_reqs = n_pf_reqs;
    s->info.num_work = plan.num_ctas;
    s->info.num_groups = plan.num_groups;
    s->info.num_context_chunks = n_ctx_chunks;
    s->info.num_sms = s->num_sms;
    s->step_ready = 1;
    free(is_pf);
    free(is_dec);
    plan_free(&plan);
    return 0;
}

static int mla_fill(void *state, int layer, const ar_fill *f, char *err, size_t err_len)
{
    mla_state *s = (mla_state *)state;
    if (layer < 0 || layer >= s->num_layers) {
        snprintf(err, err_len, "cuda-mla backend: fill: layer %d outside [0, %d)", layer, s->num_layers);
        return 2;
    }
    if (f->count <= 0) return 0;
    int64_t nslots = (int64_t)s->cfg.num_blocks * s->bs;
    for (int i = 0; i < f->count; i++)
        if (f->slots[i] < -1 || f->slots[i] >= nslots || f->offsets[i] < 0 || f->offsets[i] >= s->bs) {
            snprintf(err, err_len, "cuda-mla backend: fill: entry %d has slot %lld, offset %d (slots [-1, %lld), "
                     "offsets [0, %d))", i, (long long)f->slots[i], f->offsets[i], (long long)nslots, s->bs);
            return 2;
        }
    size_t o_keys = mla_round_up((size_t)f->count * 8, 16), o_off = o_keys + mla_round_up((size_t)f->count * 8, 16);
    int rc;
    if ((rc = mla_ensure(&s->fill, o_off + (size_t)f->count * 4 + 64, "fill buffer", err, err_len))) return rc;
    unsigned char *d = (unsigned char *)s->fill.ptr;
    if ((rc = mla_fail(cudaMemcpyAsync(d, f->slots, (size_t)f->count * 8, cudaMemcpyHostToDevice, s->stream), "fill upload", err, err_len)) ||
        (rc = mla_fail(cudaMemcpyAsync(d + o_keys, f->keys, (size_t)f->count * 8, cudaMemcpyHostToDevice, s->stream), "fill upload", err, err_len)) ||
        (rc = mla_fail(cudaMemcpyAsync(d + o_off, f->offsets, (size_t)f->count * 4, cudaMemcpyHostToDevice, s->stream), "fill upload", err, err_len)))
        return rc;
    fill_latent_kernel<<<mla_grid((int64_t)f->count * D, 256), 256, 0, s->stream>>>(
        s->cache[layer], f->count, (const int64_t *)d, (const uint64_t *)(d + o_keys), (const int *)(d + o_off),
        s->cfg.seed, (uint32_t)layer, s->cfg.data, s->cfg.dtype, s->cfg.kv_dtype, (float)s->cfg.kv_scale);
    if ((rc = mla_fail(cudaGetLastError(), "fill kernel", err, err_len))) return rc;
    /* the host arrays are only valid during this call: wait for the copies */
    return mla_fail(cudaStreamSynchronize(s->stream), "fill", err, err_len);
}

static void fill_attn_args(mla_state *s, int layer, attn_args *a)
{
    memset(a, 0, sizeof *a);
    a->wg_variant = env_wg_variant();
    a->q = s->qlat.ptr;
    a->cache = s->cache[layer];
    a->o_lat = (float *)s->olat.ptr;
    a->lse = (float *)((char *)s->lse.ptr + MLA_GUARD_BYTES);
    a->part_o = (float *)s->part_o.ptr;
    a->part_lse = (float *)s->part_lse.ptr;
    a->qsl = s->d_qsl;
    a->seq_lens = s->d_seq;
    a->block_table = s->d_bt;
    a->tok_req = s->d_treq;
    a->work = s->d_work;
    a->groups = s->d_groups;
    a->num_tokens = s->T;
    a->num_heads = s->H;
    a->mbpr = s->mbpr;
    a->block_size = s->bs;
    a->block_size_log2 = s->bs == 16 ? 4 : s->bs == 32 ? 5 : 6;
    a->causal = 1;
    a->fault = (int)s->cfg.fault;
    a->bf16 = s->bf16;
    a->fp8_cache = s->fp8;
    a->scale = (float)s->cfg.model.scale;
    a->scale_log2 = (float)(s->cfg.model.scale * 1.4426950408889634);
    a->scale_ref = s->cfg.model.scale;
    a->kv_scale = (float)s->cfg.kv_scale;
}

/* A GEMM description (see gemm_args): C = A B per batch entry, with element strides. */
static gemm_args gemm_of(int batch, int M, int N, int K, const void *A, int a_bits16, int64_t a_b, int64_t a_m,
                         int64_t a_k, const uint16_t *B, int64_t b_b, int64_t b_k, int64_t b_n, int b_shift, void *C,
                         int c_bits16, int64_t c_b, int64_t c_m, int64_t c_n, int bf16)
{
    gemm_args g;
    g.batch = batch;
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = A;
    g.a_bits16 = a_bits16;
    g.a_b = a_b;
    g.a_m = a_m;
    g.a_k = a_k;
    g.B = B;
    g.b_b = b_b;
    g.b_k = b_k;
    g.b_n = b_n;
    g.b_shift = b_shift;
    g.C = C;
    g.c_bits16 = c_bits16;
    g.c_b = c_b;
    g.c_m = c_m;
    g.c_n = c_n;
    g.bf16 = bf16;
    return g;
}

static cudaError_t launch_gemm(const gemm_args &g, cudaStream_t st)
{
    if (g.M <= 0 || g.N <= 0 || g.batch <= 0) return cudaSuccess;
    dim3 grid((unsigned)((g.N + 63) / 64), (unsigned)((g.M + 63) / 64), (unsigned)g.batch);
    gemm_kernel<<<grid, 256, 0, st>>>(g);
    return cudaGetLastError();
}

/* The prefill path for this step's long requests (see the file comment). */
static cudaError_t run_prefill(mla_state *s, const attn_args &a, int layer)
{
    const int H = s->H, P = s->P, V = s->V, QK = P + DR, T = s->T;
    const int wrong_head = s->cfg.fault == AR_FAULT_WRONG_KV_HEAD ? 1 : 0;
    float *out = (float *)((char *)s->out.ptr + MLA_GUARD_BYTES);
    cudaError_t e;
    for (int p = 0; p < s->n_passes; p++) {
        int rows = s->pass_rows[p];
        const unsigned char *d = (const unsigned char *)s->meta.ptr;
        const int *row_req = (const int *)(d + s->pass_meta_off[4 * p + 0]);
        const int *row_pos = (const int *)(d + s->pass_meta_off[4 * p + 1]);
        const int *kb = (const int *)(d + s->pass_meta_off[4 * p + 2]);
        const int *ke = (const int *)(d + s->pass_meta_off[4 * p + 3]);
        if (rows > 0) {
            gather_latent_kernel<<<mla_grid((int64_t)rows * D, 256), 256, 0, s->stream>>>(
                (uint16_t *)s->ws_lat.ptr, rows, row_req, row_pos, a, (const uint16_t *)s->lat.ptr);
            /* k_nope[w, n, :] = c_w W_UK[n] ; v[w, n, :] = c_w W_UV[n] */
            gemm_args g = gemm_of(H, rows, P, DL, s->ws_lat.ptr, 1, 0, D, 1, s->w_uk[layer], (int64_t)DL * P, P, 1,
                                  wrong_head, s->ws_k.ptr, 1, QK, (int64_t)H * QK, 1, s->bf16);
            if ((e = launch_gemm(g, s->stream)) != cudaSuccess) return e;
            rope_key_kernel<<<mla_grid((int64_t)rows * H * DR, 256), 256, 0, s->stream>>>(
                (uint16_t *)s->ws_k.ptr, (const uint16_t *)s->ws_lat.ptr, rows, H, P);
            if (s->cfg.fault == AR_FAULT_MLA_NO_WUV) {
                latent_as_value_kernel<<<mla_grid((int64_t)rows * H * V, 256), 256, 0, s->stream>>>(
                    (uint16_t *)s->ws_v.ptr, (const uint16_t *)s->ws_lat.ptr, rows, H, V);
            } else {
                g = gemm_of(H, rows, V, DL, s->ws_lat.ptr, 1, 0, D, 1, s->w_uv[layer], (int64_t)DL * V, V, 1, 0,
                            s->ws_v.ptr, 1, V, (int64_t)H * V, 1, s->bf16);
                if ((e = launch_gemm(g, s->stream)) != cudaSuccess) return e;
            }
        }
        prefill_attn_kernel<<<s->n_pf_tok * H, SIMT_THREADS, 0, s->stream>>>(
            a, s->d_pf_tok, s->d_tpos, (const uint16_t *)s->qnope.ptr, (const uint16_t *)s->ws_k.ptr,
            (const uint16_t *)s->ws_v.ptr, row_pos, kb, ke, P, V, (float *)s->pass_o.ptr, (float *)s->pass_lse.ptr);
        prefill_merge_kernel<<<mla_grid((int64_t)s->n_pf_tok * H * V, 256), 256, 0, s->stream>>>(
            a, s->d_pf_tok, s->n_pf_tok, V, (float *)s->acc_o.ptr, (float *)s->acc_lse.ptr,
            (const float *)s->pass_o.ptr, (const float *)s->pass_lse.ptr, p == 0);
        prefill_merge_lse_kernel<<<mla_grid((int64_t)s->n_pf_tok * H, 256), 256, 0, s->stream>>>(
            a, s->d_pf_tok, s->n_pf_tok, (float *)s->acc_lse.ptr, (const float *)s->pass_lse.ptr, p == 0);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    (void)T;
    prefill_finish_kernel<<<mla_grid((int64_t)s->n_pf_tok * H * V, 256), 256, 0, s->stream>>>(
        a, s->d_pf_tok, s->n_pf_tok, V, (const float *)s->acc_o.ptr, (const float *)s->acc_lse.ptr, out, a.lse);
    return cudaGetLastError();
}

/* One pass: write, absorb, attention, combine, W_UV, prefill.  Events ev[0..6] when timed. */
static cudaError_t run_pass(mla_state *s, const attn_args &a, const CUtensorMap *tmap, int layer, bool use_tc, bool timed)
{
    const int H = s->H, P = s->P, V = s->V, T = s->T;
    cudaError_t e;
    if (timed) cudaEventRecord(s->ev[0], s->stream);
    if (T > 0)
        write_latent_kernel<<<T, 128, 0, s->stream>>>((const uint16_t *)s->lat.ptr, s->d_slots, s->cache[layer], T,
                                                      s->cfg.dtype, s->cfg.kv_dtype, (float)s->cfg.kv_scale, 0);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if (timed) cudaEventRecord(s->ev[1], s->stream);
    bool any_dec = s->n_dec_reqs > 0 && T > s->n_pf_tok;
    if (any_dec) {
        /* absorption: ql[t, n, :] = q_nope[t, n, :] W_UK[n]^T -> columns 0..511 of the latent query */
        gemm_args g = gemm_of(H, T, DL, P, s->qnope.ptr, 1, P, (int64_t)H * P, 1, s->w_uk[layer], (int64_t)DL * P, 1, P,
                              s->cfg.fault == AR_FAULT_WRONG_KV_HEAD ? 1 : 0, s->qlat.ptr, 1, D, (int64_t)H * D, 1,
                              s->bf16);
        if ((e = launch_gemm(g, s->stream)) != cudaSuccess) return e;
    }
    if (timed) cudaEventRecord(s->ev[2], s->stream);
    if (any_dec) {
        const tc_variant variant = choose_variant(s->force_kernel, s->max_rows, s->wgmma_ok, false);
        e = launch_attention(a, use_tc ? variant_stages(variant, s->tc_stages) : 0, variant, s->narrow_vi, s->num_ctas,
                             s->num_groups, T, tmap, s->stream, timed ? s->ev[3] : NULL);
        if (e != cudaSuccess) return e;
    } else if (timed) {
        cudaEventRecord(s->ev[3], s->stream);
    }
    if (timed) cudaEventRecord(s->ev[4], s->stream);
    float *out = (float *)((char *)s->out.ptr + MLA_GUARD_BYTES);
    if (any_dec) {
        if (s->cfg.fault == AR_FAULT_MLA_NO_WUV) {
            latent_as_output_kernel<<<mla_grid((int64_t)T * H * V, 256), 256, 0, s->stream>>>(
                (const float *)s->olat.ptr, out, T, H, V, s->bf16);
            if ((e = cudaGetLastError()) != cudaSuccess) return e;
        } else {
            /* out[t, n, :] = o_lat[t, n, :] W_UV[n] */
            gemm_args g = gemm_of(H, T, V, DL, s->olat.ptr, 0, DL, (int64_t)H * DL, 1, s->w_uv[layer], (int64_t)DL * V,
                                  V, 1, 0, out, 0, V, (int64_t)H * V, 1, s->bf16);
            if ((e = launch_gemm(g, s->stream)) != cudaSuccess) return e;
        }
    }
    if (timed) cudaEventRecord(s->ev[5], s->stream);
    if (s->n_pf_reqs > 0 && (e = run_prefill(s, a, layer)) != cudaSuccess) return e;
    if (timed) cudaEventRecord(s->ev[6], s->stream);
    return cudaSuccess;
}

static int ensure_weights(mla_state *s, int layer, char *err, size_t err_len)
{
    if (s->w_uk[layer]) return 0;
    const int H = s->H, P = s->P, V = s->V;
    int rc;
    if ((rc = mla_fail(cudaMalloc(&s->w_uk[layer], (size_t)H * DL * P * 2), "W_UK allocation", err, err_len)) ||
        (rc = mla_fail(cudaMalloc(&s->w_uv[layer], (size_t)H * DL * V * 2), "W_UV allocation", err, err_len))) {
        if (s->w_uk[layer]) cudaFree(s->w_uk[layer]);
        s->w_uk[layer] = NULL;
        s->w_uv[layer] = NULL;
        return rc;
    }
    const int rank = s->cfg.model.kv_lora_rank;
    gen_weight_kernel<<<mla_grid((int64_t)H * DL * P, 256), 256, 0, s->stream>>>(
        s->w_uk[layer], H, P, AR_STREAM_W_UK, s->cfg.seed, (uint32_t)layer, s->cfg.data, s->cfg.dtype, rank);
    gen_weight_kernel<<<mla_grid((int64_t)H * DL * V, 256), 256, 0, s->stream>>>(
        s->w_uv[layer], H, V, AR_STREAM_W_UV, s->cfg.seed, (uint32_t)layer, s->cfg.data, s->cfg.dtype, rank);
    return mla_fail(cudaGetLastError(), "weight generator", err, err_len);
}

static int mla_forward(void *state, int layer, const ar_batch *b, ar_forward_out *o, char *err, size_t err_len)
{
    mla_state *s = (mla_state *)state;
    (void)b;
    if (!s->step_ready) {
        snprintf(err, err_len, "cuda-mla backend: forward before a successful prepare");
        return 2;
    }
    if (layer < 0 || layer >= s->num_layers) {
        snprintf(err, err_len, "cuda-mla backend: forward: layer %d outside [0, %d)", layer, s->num_layers);
        return 2;
    }
    const int T = s->T, H = s->H, P = s->P, V = s->V;
    int rc;
    o->num_kernels = 0;
    o->total_us = 0;
    o->guard_violations = 0;
    if ((rc = ensure_weights(s, layer, err, err_len))) return rc;
    if (T > 0) {
        gen_q_kernel<<<mla_grid((int64_t)T * H * (P + DR), 256), 256, 0, s->stream>>>(
            (uint16_t *)s->qnope.ptr, (uint16_t *)s->qlat.ptr, T, H, P, s->cfg.seed, (uint32_t)layer, s->d_treq,
            s->d_tpos, s->d_rkeys, s->cfg.data, s->cfg.dtype);
        gen_latent_kernel<<<mla_grid((int64_t)T * D, 256), 256, 0, s->stream>>>(
            (uint16_t *)s->lat.ptr, T, s->cfg.seed, (uint32_t)layer, s->d_treq, s->d_tpos, s->d_bkeys, s->mbpr, s->bs,
            s->cfg.data, s->cfg.dtype);
        if ((rc = mla_fail(cudaGetLastError(), "generator kernels", err, err_len))) return rc;
    }
    if ((rc = mla_fail(cudaMemsetAsync((char *)s->out.ptr + MLA_GUARD_BYTES, 0xFF, s->out_bytes, s->stream), "poison", err, err_len)) ||
        (rc = mla_fail(cudaMemsetAsync((char *)s->lse.ptr + MLA_GUARD_BYTES, 0xFF, s->lse_bytes, s->stream), "poison", err, err_len)))
        return rc;
    attn_args a;
    fill_attn_args(s, layer, &a);
    bool use_tc = s->force_kernel != AR_MLA_KERNEL_SIMT && s->tc_stages > 0;
    /* a TMA variant of the wgmma kernel (AR_MLA_WG_VARIANT): this layer's cache as a tensor map,
     * else its cp.async twin runs (said once on stderr) */
    CUtensorMap tmap;
    const CUtensorMap *tmap_arg = NULL;
    if (s->wgmma_ok && wg_tma_twin(a.wg_variant) >= 0) {
        char why[256] = "";
        static bool told = false;
        if (wg_prepare_tma(&a, s->cache_bytes / (D * 2), &tmap, why, sizeof why) == 0)
            tmap_arg = &tmap;
        else if (!told) {
            fprintf(stderr, "%s: the wgmma kernel runs its cp.async variant %s\n", why, wg_variants[a.wg_variant].name);
            told = true;
        }
    }
    int repeat = s->cfg.repeat > 0 ? s->cfg.repeat : 1;
    double *times = (double *)malloc(sizeof(double) * 7 * (size_t)repeat);
    if (!times) {
        snprintf(err, err_len, "cuda-mla backend: out of host memory");
        return 3;
    }
    if ((rc = mla_fail(run_pass(s, a, tmap_arg, layer, use_tc, false), "MLA launch (warm-up)", err, err_len))) {
        free(times);
        return rc;
    }
    const bool host_copy = o->out && o->lse;
    const size_t out_payload = (size_t)T * H * V * 4, lse_payload = (size_t)H * T * 4;
    for (int i = 0; i < repeat; i++) {
        if ((rc = mla_fail(run_pass(s, a, tmap_arg, layer, use_tc, true), "MLA launch", err, err_len))) {
            free(times);
            return rc;
        }
        cudaEvent_t wait_on = s->ev[6];
        if (i == repeat - 1) {
            /* after the last repeat, in the same stream: the guard regions checked on the device
             * and, only when the engine asked for them, host copies of out and LSE */
            const ar_cuda_outbufs ob = {s->out.ptr, s->lse.ptr, s->out_bytes, s->lse_bytes, MLA_GUARD_BYTES};
            if ((rc = mla_fail(ar_cuda_forward_tail(s->stream, &ob, s->d_guard, s->h_guard, host_copy ? s->h_out : NULL,
                                                   out_payload, lse_payload, s->ev[7]), "forward results", err, err_len))) {
                free(times);
                return rc;
            }
            wait_on = s->ev[7];
        }
        /* the kernel times are this call's result: wait for the repeat's events (the last repeat
         * also waits for the guard count and the host copies, one wait in all) */
        if ((rc = mla_fail(cudaEventSynchronize(wait_on), "MLA kernels", err, err_len))) {
            free(times);
            return rc;
        }
        float total = 0;
        for (int k = 0; k < 6; k++) {
            float ms = 0;
            cudaEventElapsedTime(&ms, s->ev[k], s->ev[k + 1]);
            times[k * repeat + i] = ms * 1e3;
            total += ms;
        }
        times[6 * repeat + i] = total * 1e3;
    }
    static const char *const names[6] = {"write", "absorb", "attn", "combine", "wuv", "prefill"};
    bool present[6] = {true, s->n_dec_reqs > 0, s->n_dec_reqs > 0, s->n_dec_reqs > 0 && use_tc && s->num_groups > 0,
                       s->n_dec_reqs > 0, s->n_pf_reqs > 0};
    for (int k = 0; k < 6; k++) {
        double med = median_of(times + k * repeat, repeat);
        if (!present[k]) continue;
        o->kernels[o->num_kernels].name = names[k];
        o->kernels[o->num_kernels].us = med;
        o->num_kernels++;
    }
    o->total_us = median_of(times + 6 * repeat, repeat);
    free(times);

    o->dev_out = (const char *)s->out.ptr + MLA_GUARD_BYTES;
    o->dev_out_type = AR_FP32;   /* float values rounded to the dtype */
    o->dev_lse = (const float *)((const char *)s->lse.ptr + MLA_GUARD_BYTES);
    o->dev_stream = s->stream;
    int bad = *s->h_guard;
    o->guard_violations = bad;
    if (bad) {   /* re-stamp for the next forward */
        const ar_cuda_outbufs ob = {s->out.ptr, s->lse.ptr, s->out_bytes, s->lse_bytes, MLA_GUARD_BYTES};
        ar_cuda_restamp_guards(s->stream, &ob);
    }
    if (host_copy) {
        memcpy(o->out, s->h_out, out_payload);
        memcpy(o->lse, (const unsigned char *)s->h_out + out_payload, lse_payload);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Hooks and the descriptor                                                                   */

extern "C" void ar_cuda_mla_set_plan(void *state, ar_cuda_mla_kernel kernel, int num_splits, int use_prefill_path)
{
    mla_state *s = (mla_state *)state;
    if (!s) return;
    s->force_kernel = kernel;
    s->force_splits = num_splits;
    s->use_prefill = use_prefill_path ? 1 : 0;
}

extern "C" void ar_cuda_mla_set_workspace(void *state, int tokens)
{
    mla_state *s = (mla_state *)state;
    if (s) s->workspace_tokens = tokens < 16 ? 16 : tokens;
}

extern "C" void ar_cuda_mla_plan_of(void *state, ar_cuda_mla_plan_info *info)
{
    mla_state *s = (mla_state *)state;
    memset(info, 0, sizeof *info);
    if (s) *info = s->info;
}

extern "C" const ar_backend ar_cuda_mla_backend = {
    "cuda-mla",
    "CUDA MLA: absorbed latent decode (mma.sync, or wgmma on sm_90; 64-row head tiles, split-KV + combine), chunked "
    "up-projected prefill merged by LSE",
    "MLA models (kv_lora_rank 512, rope 64), fp16/bf16, latent cache = dtype or fp8_e4m3 (per-tensor "
    "scale), block sizes 16/32/64, decode threshold 128; sm_80+",
    true,
    mla_check,
    mla_open,
    mla_prepare,
    mla_fill,
    mla_forward,
    mla_device_name,
    mla_close,
};
