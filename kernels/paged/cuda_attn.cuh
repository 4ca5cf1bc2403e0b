/* cuda_attn.cuh - the paged varlen attention kernel (FlashAttention-2 style, mma.sync) and the
 * small kernels around it: split-KV combine, KV-cache write, device-side data generation.
 *
 * One launch covers a whole mixed batch of prefill chunks and decodes.  The host (prepare())
 * flattens the step into a work list; one CTA runs one work item:
 *
 *   (request, KV head, tile of ROWS "rows", a range of key tiles[, which split])
 *
 * A row is a (query token, query head of the KV group) pair, numbered token-major inside the
 * request and KV head, so the Hq/Hkv query heads that share one KV head are packed into the
 * same tile (GQA packing): K/V of a group are read once per tile, not once per query head.
 *
 * Per key tile of BLOCK_N keys: K and V rows are gathered through the block table with
 * cp.async (16-byte chunks, double-buffered), S = Q K^T and O += P V run on tensor cores with
 * mma.sync.m16n8k16 (bf16/fp16 in, fp32 accumulate), the softmax is online in registers in the
 * log2 domain (x = score * scale * log2 e, exp2).  Masking: bottom-right causal (key j visible
 * from query position p iff j <= p), sliding window W (iff j >= p - W + 1), keys >= seq_len
 * never loaded (cp.async zero-fills them, so NaN-filled unused slots are never read).
 *
 * The kernels ("configs"; build_plan in cuda_plan.cuh decides which one runs a launch):
 *   PREFILL    : this file's kernel, WARPS_M warps stacked over the rows (16*MT rows each), all
 *                reading one K/V tile (hd 64/128: 4 warps x 32 rows, hd 256: 8 warps x 16 rows;
 *                128 rows per CTA).  The fallback for every launch the wgmma kernel cannot run.
 *   DECODE     : this file's kernel with one warp of 16 rows x WARPS_N=4 warps that walk
 *                interleaved key tiles with their own online-softmax state and merge through
 *                shared memory at the end (split-KV inside the CTA).  Chosen when every
 *                (request, KV head) fits in 16 rows; the fallback of DECODE_TMA.
 *   PREFILL_WG : head size exactly 128 or 256 on a compute-capability 9.0 device with tensor
 *                maps: the Hopper kernel of cuda_attn_wgmma.cuh (wgmma, a TMA producer
 *                warpgroup, two ping-pong consumers); the default for every non-decode launch
 *                there.
 *   DECODE_TMA : compute capability 9.0, decode batches of many requests (decode_tma_plan in
 *                attn_plan.c): cuda_attn_decode_tma.cuh, one CTA per request over every KV
 *                head, whole cache blocks copied by TMA; unsplit unless a sweep knob or a
 *                forced split asks (attn_plan.c: decode_tma_splits).
 * Across CTAs, split-KV (a work item covers part of the key range) writes normalised fp32
 * partials + log2 LSE, and ar_attn::combine_kernel merges them (see the split heuristic in
 * cuda_plan.cuh).
 *
 * Outputs: out [num_tokens, Hq, head_size] in the run dtype, lse [Hq, num_tokens] fp32, natural
 * log.  A row that sees no key gets out = 0 and lse = -inf (FA3's convention; vLLM's merge
 * reads +inf and -inf alike).
 *
 * fp8 KV cache (e4m3, one per-tensor kv_scale; the KV8 instantiations of PREFILL, DECODE and
 * DECODE_TMA in cuda_attn_{bf16,fp16}_kv8.cu): PREFILL and DECODE copy tiles at 1 byte per
 * element into an fp8 staging ring and widen them exactly to the model dtype in shared memory
 * before the MMAs; DECODE_TMA copies whole fp8 blocks by TMA and widens them to fp16 in
 * registers (cuda_attn_decode_tma.cuh); kv_scale multiplies the score scale (K) and each
 * finished row (V, args.v_scale).  PREFILL_WG has no fp8 variant (the plan never picks it for an
 * fp8 cache).
 *
 * Head sizes: templates for 64, 128, 256; any other multiple of 8 up to 256 runs the next
 * larger template with predicated, zero-filled loads and skips the dims past head_size (the
 * generic path).  Faults (ar_fault) are honoured here through the run-time flag args.fault. */
#ifndef AR_CUDA_ATTN_CUH
#define AR_CUDA_ATTN_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <type_traits>

#include "../../replay/backend.h"
#include "attn_plan.h"

/* The configs (AR_CFG_*), their geometry (ar_attn_geom), AR_MAX_SPLITS, ar_attn_work (one CTA's
 * job) and ar_combine_group (a split-KV group of the combine kernel): attn_plan.h, plain C, so
 * that the planner is tested without a GPU. */

typedef struct ar_attn_args {
    const void *q;              /* [num_tokens, Hq, head_size] dtype */
    const void *k_cache;        /* [num_blocks, block_size, Hkv, head_size] dtype, or fp8 e4m3
                                   (the _kv8 launchers) */
    const void *v_cache;        /* [num_blocks, block_size, Hkv, head_size] as k_cache */
    void *out;                  /* [num_tokens, Hq, head_size] dtype */
    float *lse;                 /* [Hq, num_tokens] natural log */
    float *partial_o;           /* [num_partials, ROWS, HD] fp32, normalised */
    float *partial_lse;         /* [num_partials, ROWS] log2 domain */
    const int *query_start_loc; /* [num_reqs + 1] */
    const int *seq_lens;        /* [num_reqs] */
    const int *block_table;     /* [num_reqs, max_blocks_per_req] */
    const ar_attn_work *work;   /* [num_work] */
    const ar_combine_group *groups; /* [num_groups] */
    int num_tokens;
    int num_q_heads;
    int num_kv_heads;
    int head_size;
    int group;                  /* Hq / Hkv */
    int block_size_log2;
    int max_blocks_per_req;
    int sliding_window;         /* 0 = none */
    float scale_log2;           /* scale * log2(e); fp8 cache: times kv_scale (K's dequant scale
                                   folded into the score scale) */
    float v_scale;              /* multiplier on every finished output row: kv_scale for an fp8
                                   cache (V's dequant scale), else 1 */
    float soft_cap;             /* 0 = none */
    int fault;                  /* ar_fault */
    int non_causal;             /* 1: every query sees every key < seq_len (cascade prefix pass) */
    int num_slots;              /* num_blocks x block_size: the rows of each cache (the extent of
                                   the TMA kernels' tensor maps) */
    int partial_live_only;      /* 1: split partials are written only for rows that hold a query
                                   token (the rows combine_kernel reads; AR_CUDA_SPLIT_LIVE_ROWS=1),
                                   0: for every row of the tile (the mma.sync kernels) */
    int persistent_ctas;        /* PREFILL_WG: > 0 launches at most this many CTAs, each walking
                                   several work items (AR_CUDA_WG_PERSIST); 0: a CTA per item */
    int *wg_next_item;          /* PREFILL_WG: the launch's item counter (device, one int): 0
                                   before the launch, left 0 after it (cuda_attn_wgmma.cuh) */
    int decode_tma_stages;      /* DECODE_TMA's ring depth (AR_CUDA_DECODE_TMA_STAGES); 0 or more than
                                   fit: the most that fit (3 stages at 8 KV heads) */
    /* cascade suffix pass with the merge fused into its final writes (else merge_out NULL):
     * each finished row is mixed with the prefix pass's row as merge_kernel does */
    const void *merge_out;      /* [num_tokens, Hq, head_size] dtype: the prefix pass's out */
    const float *merge_lse;     /* [Hq, num_tokens] natural log: its LSE */
    int merge_lse_base2;        /* the step's AR_FAULT_LSE_BASE2: the merged LSE reported as log2 */
    /* cascade suffix pass on AR_CFG_DECODE_TMA with the merge fused and the prefix pass split
     * (else merge_groups NULL): the prefix side of each row is combined from the prefix pass's
     * split partials here, and its combine kernel does not run (merge_out is then unused) */
    const ar_combine_group *merge_groups; /* the prefix pass's groups: [Hkv][merge_row_blocks] */
    const float *merge_partial_o;         /* [partials, merge_rows, head_size] fp32, normalised */
    const float *merge_partial_lse;       /* [partials, merge_rows] log2 */
    int merge_rows;                       /* rows per prefix-pass CTA */
    int merge_row_blocks;                 /* row blocks per KV head: ceil(T x group / merge_rows) */
} ar_attn_args;


/* The CTAs of a PREFILL_WG launch of num_work items: persistent_ctas (ar_attn_args) when that is
 * set and smaller, else one a work item.  The launcher and the backend's plan report share it. */
static inline int ar_attn_wg_ctas(int persistent_ctas, int num_work)
{
    return persistent_ctas > 0 && persistent_ctas < num_work ? persistent_ctas : num_work;
}


/* Template head dim that runs head_size (64, 128 or 256), or 0 when unsupported. */
static inline int ar_attn_template_hd(int head_size)
{
    if (head_size <= 0 || head_size % 8 != 0 || head_size > 256) return 0;
    return head_size <= 64 ? 64 : head_size <= 128 ? 128 : 256;
}

/* Launchers, one per dtype (cuda_attn_bf16.cu / cuda_attn_fp16.cu, so the two compile in
 * parallel); each returns the launch's cudaError_t.  The attributes call raises the dynamic
 * shared-memory limit and reports how many CTAs fit on one SM.  ar_attn_geometry is in
 * cuda_plan.cuh. */
ar_attn_geom ar_attn_geometry(int config, int hd);
cudaError_t ar_attn_launch_bf16(int config, int hd, const ar_attn_args *a, int num_work,
                                cudaStream_t stream);
cudaError_t ar_attn_launch_fp16(int config, int hd, const ar_attn_args *a, int num_work,
                                cudaStream_t stream);
cudaError_t ar_attn_attributes_bf16(int config, int hd, int *ctas_per_sm);
cudaError_t ar_attn_attributes_fp16(int config, int hd, int *ctas_per_sm);
/* The same for an fp8 e4m3 cache (cuda_attn_bf16_kv8.cu / cuda_attn_fp16_kv8.cu): the mma.sync
 * kernels only (AR_CFG_PREFILL, AR_CFG_DECODE); the others return cudaErrorInvalidValue. */
cudaError_t ar_attn_launch_bf16_kv8(int config, int hd, const ar_attn_args *a, int num_work,
                                    cudaStream_t stream);
cudaError_t ar_attn_launch_fp16_kv8(int config, int hd, const ar_attn_args *a, int num_work,
                                    cudaStream_t stream);
cudaError_t ar_attn_attributes_bf16_kv8(int config, int hd, int *ctas_per_sm);
cudaError_t ar_attn_attributes_fp16_kv8(int config, int hd, int *ctas_per_sm);

/* ---------------------------------------------------------------------------------------- */
/* Device helpers                                                                            */

#ifdef AR_ATTN_KERNEL_BODY

namespace ar_attn {

__device__ __forceinline__ void cp_async16(void *smem_dst, const void *gmem_src, bool pred)
{
    unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    int src_bytes = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(gmem_src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *smem_src)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(smem_src);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *smem_src)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(smem_src);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

/* c[4] += a (16x16, row) * b (16x8, col); fp32 accumulate. */
template <typename T> __device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4],
                                                               uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma16816<__nv_bfloat16>(float c[4], const uint32_t a[4],
                                                                    uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<__half>(float c[4], const uint32_t a[4],
                                                             uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats -> one 32-bit register of two T (lo in the low half). */
template <typename T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi)
{
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Eight fp8 e4m3 values (raw: byte e of the 8 is element e) -> eight T, exactly (every e4m3
 * value, NaN included, is representable in fp16 and bf16): the hardware's e4m3x2 -> f16x2
 * conversion, widened through float for bf16. */
template <typename T> __device__ __forceinline__ uint32_t fp8x2_to(uint32_t two);
template <> __device__ __forceinline__ uint32_t fp8x2_to<__half>(uint32_t two)
{
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
template <> __device__ __forceinline__ uint32_t fp8x2_to<__nv_bfloat16>(uint32_t two)
{
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
    return pack2<__nv_bfloat16>(f.x, f.y);
}
template <typename T> __device__ __forceinline__ uint4 fp8x8_to(uint2 raw)
{
    uint4 r;
    r.x = fp8x2_to<T>(raw.x & 0xffffu);
    r.y = fp8x2_to<T>(raw.x >> 16);
    r.z = fp8x2_to<T>(raw.y & 0xffffu);
    r.w = fp8x2_to<T>(raw.y >> 16);
    return r;
}

/* Compile-time geometry of one kernel instantiation. */
template <int HD_, int MT_, int WARPS_M_, int WARPS_N_, int BLOCK_N_>
struct Geom {
    static constexpr int HD = HD_;
    static constexpr int MT = MT_;               /* 16-row m-tiles per warp */
    static constexpr int WARPS_M = WARPS_M_;
    static constexpr int WARPS_N = WARPS_N_;
    static constexpr int BLOCK_N = BLOCK_N_;
    static constexpr int ROWS_W = 16 * MT;
    static constexpr int ROWS = ROWS_W * WARPS_M;
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    static constexpr int LD = HD + 8;            /* smem row stride (elements): 16 B pad, no bank conflicts */
    static constexpr int STAGES = 2;
    static constexpr size_t Q_BYTES = (size_t)ROWS * LD * 2;
    static constexpr size_t TILE_BYTES = (size_t)BLOCK_N * LD * 2;
    static constexpr size_t KV_BYTES = (size_t)WARPS_N * STAGES * 2 * TILE_BYTES;
    static constexpr size_t MERGE_BYTES = WARPS_N > 1 ? (size_t)WARPS_N * ROWS * (HD + 2) * 4 : 0;
    static constexpr size_t SMEM = Q_BYTES + (KV_BYTES > MERGE_BYTES ? KV_BYTES : MERGE_BYTES);
    /* fp8 cache (KV8): per warp column one 16-bit tile (what the MMAs read: K, then V, of the
     * current key tile) and STAGES8 fp8 staging pairs the copies land in ([BLOCK_N][HD] bytes
     * each, unpadded), two tiles ahead: as many bytes in flight as the 16-bit pipeline's */
    static constexpr int STAGES8 = 3;
    static constexpr size_t TILE8_BYTES = (size_t)BLOCK_N * HD;
    static constexpr size_t KV8_BYTES = (size_t)WARPS_N * (TILE_BYTES + STAGES8 * 2 * TILE8_BYTES);
    static constexpr size_t SMEM8 = Q_BYTES + (KV8_BYTES > MERGE_BYTES ? KV8_BYTES : MERGE_BYTES);
};
template <typename G, bool KV8> constexpr size_t smem_bytes() { return KV8 ? G::SMEM8 : G::SMEM; }

/* The cascade merge of one pair of dims (vLLM merge_attn_states): (a0, a1) of the prefix side
 * with natural-log LSE pl and (b0, b1) of the suffix side with LSE sl into (*o0, *o1); returns
 * the merged LSE.  A +inf LSE is read as -inf (an empty side); both sides empty -> the prefix
 * pair, LSE -inf; a NaN LSE on either side -> a NaN pair and LSE.  no_weights
 * (AR_FAULT_MERGE_NO_WEIGHTS) adds the two sides unweighted. */
__device__ __forceinline__ float merge_pair(float pl, float sl, bool no_weights, float a0, float a1, float b0,
                                            float b1, float *o0, float *o1)
{
    if (pl == INFINITY) pl = -INFINITY;
    if (sl == INFINITY) sl = -INFINITY;
    float m = fmaxf(pl, sl);
    if (isnan(pl) || isnan(sl)) {
        *o0 = *o1 = NAN;
        return NAN;
    }
    if (no_weights) {
        *o0 = a0 + b0;
        *o1 = a1 + b1;
        return m == -INFINITY ? -INFINITY : m + logf(expf(pl - m) + expf(sl - m));
    }
    if (m == -INFINITY) {
        *o0 = a0;
        *o1 = a1;
        return -INFINITY;
    }
    float wp = expf(pl - m), ws = expf(sl - m), sum = wp + ws;
    float sp = wp / sum, ss = ws / sum;
    *o0 = a0 * sp + b0 * ss;
    *o1 = a1 * sp + b1 * ss;
    return logf(sum) + m;
}

/* The fused merge of one finished suffix-pass pair (o0, o1) of (token_abs, q_head), whose row
 * has LSE lse2 (log2), with the prefix pass's pair (a.merge_out / a.merge_lse): the mixed pair in
 * place and the merged LSE (natural log, or log2 under a.merge_lse_base2) returned.  As
 * merge_kernel, except that the suffix side is not rounded to T before the mix.  fused_merge
 * reads the prefix side itself; fused_merge_with takes it already read (p_pair: its two dims as
 * T, p_lse: its LSE), as DECODE's epilogue does. */
template <typename T>
__device__ __forceinline__ float fused_merge_with(const ar_attn_args &a, uint32_t p_pair, float p_lse, float lse2,
                                                  float &o0, float &o1)
{
    const T *pp = reinterpret_cast<const T *>(&p_pair);   /* the prefix pass's two dims */
    const float sl = lse2 == -INFINITY ? -INFINITY : lse2 * 0.6931471805599453f;
    const float l = merge_pair(p_lse, sl, a.fault == AR_FAULT_MERGE_NO_WEIGHTS, (float)pp[0], (float)pp[1], o0, o1,
                               &o0, &o1);
    return a.merge_lse_base2 ? l * 1.4426950408889634f : l;
}
/* Indices of (token_abs, q_head) in lse / merge_lse and of its dims d, d + 1 in out / merge_out
 * (the step's [Hq, T] LSE and [T, Hq, head_size] output layouts). */
__device__ __forceinline__ int64_t merge_lse_index(const ar_attn_args &a, int token_abs, int q_head)
{
    return (int64_t)q_head * a.num_tokens + token_abs;
}
__device__ __forceinline__ int64_t out_index(const ar_attn_args &a, int token_abs, int q_head, int d)
{
    return ((int64_t)token_abs * a.num_q_heads + q_head) * a.head_size + d;
}
template <typename T>
__device__ __forceinline__ float fused_merge(const ar_attn_args &a, int token_abs, int q_head, int d, float lse2,
                                             float &o0, float &o1)
{
    const T *p_out = reinterpret_cast<const T *>(a.merge_out);
    const uint32_t p_pair = *reinterpret_cast<const uint32_t *>(p_out + out_index(a, token_abs, q_head, d));
    return fused_merge_with<T>(a, p_pair, a.merge_lse[merge_lse_index(a, token_abs, q_head)], lse2, o0, o1);
}

/* Writes one finished row pair (dims d, d+1) either to out (dtype; mixed with the prefix pass's
 * row first when the merge is fused) or to the fp32 partial.  lse2: the row's LSE (log2). */
template <typename T>
__device__ __forceinline__ void store_pair(const ar_attn_args &a, const ar_attn_work &w, int rows,
                                           int hd, int local_row, int token_abs, int q_head, int d,
                                           float o0, float o1, float lse2)
{
    if (d >= a.head_size) return;
    if (w.partial < 0) {
        T *out = (T *)a.out;
        int64_t idx = out_index(a, token_abs, q_head, d);
        if (a.merge_out) (void)fused_merge<T>(a, token_abs, q_head, d, lse2, o0, o1);
        *reinterpret_cast<uint32_t *>(out + idx) = pack2<T>(o0, o1);
    } else {
        float2 v = make_float2(o0, o1);
        *reinterpret_cast<float2 *>(a.partial_o + ((int64_t)w.partial * rows + local_row) * hd + d) = v;
    }
}

/* The row's LSE (log2 in) to lse (natural log; merged when the merge is fused) or the partial. */
template <typename T>
__device__ __forceinline__ void store_lse(const ar_attn_args &a, const ar_attn_work &w, int rows,
                                          int local_row, int token_abs, int q_head, float lse2)
{
    if (w.partial < 0) {
        float v = lse2;
        if (a.merge_out) {                          /* the merged LSE needs the two LSEs only */
            float o0 = 0.f, o1 = 0.f;
            v = fused_merge_with<T>(a, 0u, a.merge_lse[merge_lse_index(a, token_abs, q_head)], lse2, o0, o1);
        } else if (a.fault != AR_FAULT_LSE_BASE2 && lse2 != -INFINITY) {
            v = lse2 * 0.6931471805599453f;
        }
        a.lse[merge_lse_index(a, token_abs, q_head)] = v;
    } else {
        a.partial_lse[(int64_t)w.partial * rows + local_row] = lse2;
    }
}

/* EXACT: head_size == HD (no per-dim predicates in the hot loops); else the generic path.
 * KV8: the cache holds fp8 e4m3 (1 byte per element, head_size a multiple of 16): each K/V tile
 * is copied by cp.async into an fp8 staging ring (three pairs, two tiles ahead), then K and,
 * after S, V are widened exactly to T into the one 16-bit tile the MMAs read (three barriers
 * per tile, warp barriers for DECODE); kv_scale is folded into scale_log2 (K) and v_scale (V),
 * so the tensor cores see the stored e4m3 values themselves. */
template <typename T, typename G, bool EXACT, bool KV8>
__global__ void __launch_bounds__(G::THREADS, G::WARPS_N > 1 ? (G::HD > 128 ? 1 : 4) : (G::HD > 128 || G::THREADS > 128 ? 1 : 2))
attn_kernel(const ar_attn_args a)
{
    constexpr int HD = G::HD, MT = G::MT, BLOCK_N = G::BLOCK_N, LD = G::LD;
    constexpr int CHUNKS = HD / 8;                 /* 16-byte chunks per row */
    constexpr int NT = BLOCK_N / 8;                /* n8 tiles of S */
    constexpr int DT = HD / 8;                     /* n8 tiles of O */
    constexpr int COL_THREADS = 32 * G::WARPS_M;   /* threads that load one warp column's tiles */
    constexpr int LOAD_ITERS = BLOCK_N * CHUNKS / COL_THREADS;
    constexpr int CHUNKS8 = HD / 16;               /* 16-byte chunks per fp8 row */
    constexpr int LOAD_ITERS8 = BLOCK_N * CHUNKS8 / COL_THREADS;
    static_assert(BLOCK_N * CHUNKS % COL_THREADS == 0, "tile chunks must divide evenly");
    static_assert(!KV8 || (BLOCK_N * CHUNKS8 % COL_THREADS == 0 && LOAD_ITERS8 > 0), "fp8 tile chunks");
    static_assert(COL_THREADS % CHUNKS == 0 || CHUNKS % COL_THREADS == 0, "chunk mapping");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *sq = reinterpret_cast<T *>(smem_raw);
    T *skv = reinterpret_cast<T *>(smem_raw + G::Q_BYTES);

    const ar_attn_work w = a.work[blockIdx.x];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % G::WARPS_M, wn = warp / G::WARPS_M;
    const int g = lane >> 2, tq = lane & 3;

    const int qstart = a.query_start_loc[w.req];
    const int q_len = a.query_start_loc[w.req + 1] - qstart;
    const int seq_len = a.seq_lens[w.req];
    const int ctx = seq_len - q_len;
    const int grp = a.group;
    const int head_size = EXACT ? HD : a.head_size;
    const int kvh_load = a.fault == AR_FAULT_WRONG_KV_HEAD ? (w.kv_head + 1) % a.num_kv_heads : w.kv_head;
    /* non-causal (cascade prefix pass): a huge allowance makes every key < seq_len visible;
     * positions stay far below 2^30, so p + causal_extra cannot overflow. */
    const int causal_extra = a.non_causal ? (1 << 30) : a.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0;
    const bool no_rescale = a.fault == AR_FAULT_NO_RESCALE;
    const int window = a.sliding_window;
    const float scale_log2 = a.scale_log2;
    const int *bt = a.block_table + (int64_t)w.req * a.max_blocks_per_req;
    const int bs_log2 = a.block_size_log2, bs_mask = (1 << bs_log2) - 1;   /* slots < 2^31 (open checks) */
    const int64_t head_stride = (int64_t)a.num_kv_heads * head_size;
    const T *qg = reinterpret_cast<const T *>(a.q);
    /* this KV head's first row in the caches (bytes: 2 per element, 1 for fp8) */
    const int64_t head_off = (int64_t)kvh_load * head_size * (KV8 ? 1 : 2);
    const unsigned char *kg = reinterpret_cast<const unsigned char *>(a.k_cache) + head_off;
    const unsigned char *vg = reinterpret_cast<const unsigned char *>(a.v_cache) + head_off;

    /* Q tile -> smem (invalid rows and dims past head_size zero-filled). */
    for (int i = tid; i < G::ROWS * CHUNKS; i += G::THREADS) {
        int r = i / CHUNKS, c = i % CHUNKS;
        int pair = w.pair0 + r, tok = pair / grp, hq = w.kv_head * grp + pair % grp;
        bool ok = tok < q_len && (EXACT || c * 8 < head_size);
        const T *src = ok ? qg + ((int64_t)(qstart + tok) * a.num_q_heads + hq) * head_size + c * 8 : qg;
        cp_async16(sq + r * LD + c * 8, src, ok);
    }
    cp_async_commit();

    /* This warp's rows: tokens are monotonic in the row index, so the range is closed-form. */
    const int warp_row0 = wm * G::ROWS_W;
    const int tok_first = (w.pair0 + warp_row0) / grp;
    const int tok_last_raw = (w.pair0 + warp_row0 + G::ROWS_W - 1) / grp;
    const bool warp_has_rows = tok_first < q_len;
    const int tok_last = tok_last_raw < q_len ? tok_last_raw : q_len - 1;
    const int warp_min_qpos = ctx + tok_first, warp_max_qpos = ctx + tok_last;
    int qpos[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int tok = (w.pair0 + warp_row0 + mt * 16 + g + 8 * r) / grp;
            qpos[mt][r] = tok < q_len ? ctx + tok : -2;
        }

    const int n_tiles = w.tile_end - w.tile_begin;
    const int n_iter = (n_tiles + G::WARPS_N - 1) / G::WARPS_N;
    const int ctid = wm * 32 + lane;               /* thread index inside this warp column */
    /* DECODE with the cascade merge fused, on a short item (a warp walks at most two tiles: the
     * suffix pass of a decode batch): the prefix pass's pairs and LSEs of this thread's first PRE
     * epilogue items (below) are read now, under the K/V loads, instead of after them - one
     * memory round trip less at the end of the CTA (38.2 -> 35.3 us for the suffix pass of 128
     * decodes x 128 keys on the H200; on 256 keys it cost 3.5 us, hence the gate). */
    constexpr int PRE = G::WARPS_N > 1 ? 2 : 1;     /* (at most 2: the epilogue selects between them) */
    const bool pre_on = G::WARPS_N > 1 && a.merge_out != nullptr && w.partial < 0 && n_iter <= 2;
    uint32_t pre_pair[PRE];
    float pre_lse[PRE];
#pragma unroll
    for (int k = 0; k < PRE; k++) {
        pre_pair[k] = 0u;
        pre_lse[k] = -INFINITY;
        const int i = tid + k * G::THREADS, lr = i / (HD / 2), d = (i % (HD / 2)) * 2;
        const int pair = w.pair0 + lr, tok = pair / grp, hq = w.kv_head * grp + pair % grp;
        if (pre_on && i < G::ROWS * (HD / 2) && tok < q_len && (EXACT || d < head_size)) {
            const T *p_out = reinterpret_cast<const T *>(a.merge_out);
            pre_pair[k] = *reinterpret_cast<const uint32_t *>(p_out + out_index(a, qstart + tok, hq, d));
            pre_lse[k] = a.merge_lse[merge_lse_index(a, qstart + tok, hq)];
        }
    }

    /* 16-bit cache: this warp column's STAGES K/V tile pairs; fp8 cache: its one 16-bit tile,
     * and its STAGES8 fp8 staging pairs after every column's 16-bit tile */
    T *col_base = skv + (size_t)wn * (KV8 ? 1 : G::STAGES * 2) * BLOCK_N * LD;
    uint8_t *col8 = reinterpret_cast<uint8_t *>(skv + (size_t)G::WARPS_N * BLOCK_N * LD) +
                    (size_t)wn * G::STAGES8 * 2 * G::TILE8_BYTES;

    /* K/V tile t -> stage (it & 1) (fp8 cache: staging pair it % STAGES8): each thread owns fixed
     * 16-byte chunks; the block-table reads of all its keys are issued together (unrolled)
     * before the copies. */
    auto load_kv = [&](int it) {
        int t = w.tile_begin + it * G::WARPS_N + wn;
        if (t >= w.tile_end) return;
        constexpr int EB = KV8 ? 1 : 2;                       /* bytes per cache element */
        constexpr int ROW_CHUNKS = KV8 ? CHUNKS8 : CHUNKS;    /* 16-byte chunks per row */
        constexpr int ITERS = KV8 ? LOAD_ITERS8 : LOAD_ITERS;
        constexpr int SROW = KV8 ? HD : LD * 2;               /* shared row stride, bytes */
        const size_t stage = (size_t)((KV8 ? it % G::STAGES8 : it & 1) * 2);
        unsigned char *sk = KV8 ? col8 + stage * G::TILE8_BYTES
                                : reinterpret_cast<unsigned char *>(col_base + stage * BLOCK_N * LD);
        unsigned char *sv = sk + (KV8 ? G::TILE8_BYTES : G::TILE_BYTES);
        int slots[ITERS];                          /* physical slot, -1 = past seq_len */
#pragma unroll
        for (int k = 0; k < ITERS; k++) {
            int j = t * BLOCK_N + (ctid + k * COL_THREADS) / ROW_CHUNKS;
            slots[k] = j < seq_len ? (__ldg(bt + (j >> bs_log2)) << bs_log2) + (j & bs_mask) : -1;
        }
#pragma unroll
        for (int k = 0; k < ITERS; k++) {
            int i = ctid + k * COL_THREADS;
            int kk = i / ROW_CHUNKS, c = i % ROW_CHUNKS;
            bool ok = slots[k] >= 0 && (EXACT || c * (16 / EB) < head_size);
            int64_t off = ok ? ((int64_t)slots[k] * head_stride + c * (16 / EB)) * EB : 0;
            cp_async16(sk + kk * SROW + c * 16, kg + off, ok);
            cp_async16(sv + kk * SROW + c * 16, vg + off, ok);
        }
    };

    /* fp8 cache: one side (0 K, 1 V) of tile it's landed staging pair -> this column's 16-bit
     * tile, 8 elements per step */
    auto widen_kv = [&](int it, int side) {
        if (w.tile_begin + it * G::WARPS_N + wn >= w.tile_end) return;
        const uint8_t *src = col8 + (size_t)((it % G::STAGES8) * 2 + side) * G::TILE8_BYTES;
        constexpr int PIECES = BLOCK_N * (HD / 8);
        static_assert(PIECES % COL_THREADS == 0, "fp8 widening: whole pieces per thread");
#pragma unroll
        for (int k = 0; k < PIECES / COL_THREADS; k++) {
            const int i = ctid + k * COL_THREADS, row = i / (HD / 8), c = i % (HD / 8);
            const uint2 raw = *reinterpret_cast<const uint2 *>(src + row * HD + c * 8);
            *reinterpret_cast<uint4 *>(col_base + row * LD + c * 8) = fp8x8_to<T>(raw);
        }
    };

    float acc[MT][DT][4];
    float row_m[MT][2], row_l[MT][2];              /* row_m in raw score units (before scale) */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][dt][e] = 0.f;
        row_m[mt][0] = row_m[mt][1] = -INFINITY;
        row_l[mt][0] = row_l[mt][1] = 0.f;
    }

    /* Pipeline, one barrier per tile: wait for tile it, barrier, then start tile it + 1 into
     * the other stage (every thread has passed this barrier, so nobody still reads it from
     * iteration it - 1), then compute tile it while that copy flies.
     * DECODE (one warp per column): a warp reads only the tiles it loaded itself, so after the
     * first iteration (which publishes Q to every warp) a warp barrier is enough.
     * fp8 cache: copies run STAGES8 - 1 tiles ahead (one commit group per tile, empty ones
     * included, so wait<STAGES8 - 2> means "tile it has landed"); tile it + 2 goes to the staging
     * pair tile it - 1 was widened from; K of tile it is widened into the 16-bit tile (free: every
     * thread is past tile it - 1's MMAs), published, used for S; then, after a barrier, V takes
     * its place for P V. */
    auto col_sync = [&]() {
        if (G::WARPS_M == 1) __syncwarp(); else __syncthreads();
    };
    if constexpr (KV8) {
        for (int st = 0; st < G::STAGES8 - 1; st++) {
            if (st < n_iter) load_kv(st);
            cp_async_commit();
        }
    } else {
        if (n_iter > 0) load_kv(0);
        cp_async_commit();
    }
    for (int it = 0; it < n_iter; it++) {
        if constexpr (KV8) cp_async_wait<G::STAGES8 - 2>(); else cp_async_wait<0>();
        if (G::WARPS_M == 1 && it > 0) __syncwarp(); else __syncthreads();
        const int ahead = KV8 ? G::STAGES8 - 1 : 1;
        if (it + ahead < n_iter) load_kv(it + ahead);
        cp_async_commit();
        if constexpr (KV8) {
            widen_kv(it, 0);
            col_sync();
        }
        const int t = w.tile_begin + it * G::WARPS_N + wn;
        const int tile_first = t * BLOCK_N, tile_last = tile_first + BLOCK_N - 1;
        bool active = t < w.tile_end && warp_has_rows && tile_first <= warp_max_qpos + causal_extra &&
                      !(window > 0 && tile_last < warp_min_qpos - window + 1);
        const T *sk = col_base + (size_t)(KV8 ? 0 : (it & 1) * 2) * BLOCK_N * LD;
        const T *sv = KV8 ? sk : sk + (size_t)BLOCK_N * LD;
        float s[MT][NT][4];
        /* O += P V (s holds P) */
        auto pv = [&]() {
#pragma unroll
            for (int kk = 0; kk < BLOCK_N / 16; kk++) {
                uint32_t pa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                    pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                    pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                    pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < HD / 16; dp++) {
                    if (!EXACT && dp * 16 >= head_size) break;
                    uint32_t vb[4];
                    ldmatrix_x4_trans(vb, sv + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + dp * 16 +
                                              (lane >> 4) * 8);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816<T>(acc[mt][2 * dp], pa[mt], vb[0], vb[1]);
                        mma16816<T>(acc[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
                    }
                }
            }
        };
        if (active) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[mt][nt][e] = 0.f;
            /* S = Q K^T */
#pragma unroll
            for (int kd = 0; kd < HD / 16; kd++) {
                if (!EXACT && kd * 16 >= head_size) break;
                uint32_t qa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
                    ldmatrix_x4(qa[mt], sq + (warp_row0 + mt * 16 + (lane & 15)) * LD + kd * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int nb = 0; nb < BLOCK_N / 16; nb++) {
                    uint32_t kb[4];
                    ldmatrix_x4(kb, sk + (nb * 16 + (lane & 7) + ((lane >> 4) << 3)) * LD + kd * 16 +
                                        ((lane >> 3) & 1) * 8);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma16816<T>(s[mt][2 * nb], qa[mt], kb[0], kb[1]);
                        mma16816<T>(s[mt][2 * nb + 1], qa[mt], kb[2], kb[3]);
                    }
                }
            }
            /* soft cap (kept in raw units: cap * tanh(scale s / cap) / scale), then the mask;
             * both are warp-uniform branches around whole loops. */
            if (a.soft_cap > 0.f) {
                const float scale = scale_log2 * 0.6931471805599453f;
                const float cap_over_scale = a.soft_cap / scale, inv_cap = scale / a.soft_cap;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) s[mt][nt][e] = cap_over_scale * tanhf(s[mt][nt][e] * inv_cap);
            }
            const bool need_mask = tile_last > warp_min_qpos + causal_extra || tile_last >= seq_len ||
                                   (window > 0 && tile_first < warp_max_qpos - window + 1);
            if (need_mask) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            int j = tile_first + nt * 8 + 2 * tq + (e & 1);
                            int p = qpos[mt][e >> 1];
                            bool vis = j < seq_len && j <= p + causal_extra && (window <= 0 || j >= p - window + 1);
                            if (!vis) s[mt][nt][e] = -INFINITY;
                        }
            }
            /* online softmax: p = 2^(s * scale_log2 - m * scale_log2), one FFMA + EX2 */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    float mx = -INFINITY;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    float m_new = fmaxf(row_m[mt][r], mx);
                    float m_scaled = m_new == -INFINITY ? 0.f : m_new * scale_log2;
                    float alpha = exp2f(row_m[mt][r] * scale_log2 - m_scaled);
                    row_m[mt][r] = m_new;
                    float rs = 0.f;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        float p0 = exp2f(fmaf(s[mt][nt][2 * r], scale_log2, -m_scaled));
                        float p1 = exp2f(fmaf(s[mt][nt][2 * r + 1], scale_log2, -m_scaled));
                        s[mt][nt][2 * r] = p0;
                        s[mt][nt][2 * r + 1] = p1;
                        rs += p0 + p1;
                    }
                    row_l[mt][r] = row_l[mt][r] * alpha + rs;
                    /* alpha == 1 (the row max did not move: most tiles of a long context)
                     * leaves acc as it is, bit for bit, so the warp skips the multiplies when
                     * no lane needs them (active is warp-uniform, so all 32 lanes vote) */
                    if (!no_rescale && __any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll
                        for (int dt = 0; dt < DT; dt++) {
                            acc[mt][dt][2 * r] *= alpha;
                            acc[mt][dt][2 * r + 1] *= alpha;
                        }
                    }
                }
            if constexpr (!KV8) pv();
        }
        if constexpr (KV8) {   /* V of tile it replaces K (every thread of the column is past S) */
            col_sync();
            widen_kv(it, 1);
            col_sync();
            if (active) pv();
        }
    }
    cp_async_wait<0>();

    /* row sums across the quad; maxima to the log2 domain */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float l = row_l[mt][r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            row_l[mt][r] = l;
            row_m[mt][r] = row_m[mt][r] == -INFINITY ? -INFINITY : row_m[mt][r] * scale_log2;
        }

    if (G::WARPS_N == 1) {
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                int lr = warp_row0 + mt * 16 + g + 8 * r;
                int pair = w.pair0 + lr, tok = pair / grp, hq = w.kv_head * grp + pair % grp;
                if (tok >= q_len && (w.partial < 0 || a.partial_live_only)) continue;
                float l = row_l[mt][r];
                float inv = (l > 0.f ? 1.f / l : 0.f) * (KV8 ? a.v_scale : 1.f);
                float lse2 = l > 0.f ? row_m[mt][r] + __log2f(l) : -INFINITY;
#pragma unroll
                for (int dt = 0; dt < DT; dt++)
                    store_pair<T>(a, w, G::ROWS, HD, lr, qstart + tok, hq, dt * 8 + 2 * tq,
                                  acc[mt][dt][2 * r] * inv, acc[mt][dt][2 * r + 1] * inv, lse2);
                if (tq == 0) store_lse<T>(a, w, G::ROWS, lr, qstart + tok, hq, lse2);
            }
        return;
    }

    /* DECODE: merge the WARPS_N warps' states through shared memory (reusing the K/V area). */
    float *red_o = reinterpret_cast<float *>(smem_raw + G::Q_BYTES);      /* [WARPS_N][ROWS][HD] */
    float *red_m = red_o + (size_t)G::WARPS_N * G::ROWS * HD;            /* [WARPS_N][ROWS] */
    float *red_l = red_m + G::WARPS_N * G::ROWS;                          /* [WARPS_N][ROWS] */
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int lr = g + 8 * r;
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            float2 v = make_float2(acc[0][dt][2 * r], acc[0][dt][2 * r + 1]);
            *reinterpret_cast<float2 *>(red_o + ((size_t)wn * G::ROWS + lr) * HD + dt * 8 + 2 * tq) = v;
        }
        if (tq == 0) {
            red_m[wn * G::ROWS + lr] = row_m[0][r];
            red_l[wn * G::ROWS + lr] = row_l[0][r];
        }
    }
    __syncthreads();
    for (int i = tid; i < G::ROWS * (HD / 2); i += G::THREADS) {
        int lr = i / (HD / 2), d = (i % (HD / 2)) * 2;
        int pair = w.pair0 + lr, tok = pair / grp, hq = w.kv_head * grp + pair % grp;
        if (tok >= q_len && (w.partial < 0 || a.partial_live_only)) continue;
        if (!EXACT && d >= head_size) continue;
        float mmax = -INFINITY;
#pragma unroll
        for (int k = 0; k < G::WARPS_N; k++) mmax = fmaxf(mmax, red_m[k * G::ROWS + lr]);
        float m_use = mmax == -INFINITY ? 0.f : mmax;
        float lsum = 0.f, o0 = 0.f, o1 = 0.f;
#pragma unroll
        for (int k = 0; k < G::WARPS_N; k++) {
            float lk = red_l[k * G::ROWS + lr];
            float wgt = exp2f(red_m[k * G::ROWS + lr] - m_use);
            const float *src = red_o + ((size_t)k * G::ROWS + lr) * HD + d;
            if (a.fault == AR_FAULT_MERGE_NO_WEIGHTS) {
                if (lk > 0.f) { o0 += src[0] / lk; o1 += src[1] / lk; }
            } else {
                o0 += src[0] * wgt;
                o1 += src[1] * wgt;
            }
            lsum += lk * wgt;
        }
        float inv = lsum > 0.f ? 1.f / lsum : 0.f;
        if (a.fault != AR_FAULT_MERGE_NO_WEIGHTS) { o0 *= inv; o1 *= inv; }
        else if (lsum <= 0.f) { o0 = 0.f; o1 = 0.f; }
        if (KV8) {
            o0 *= a.v_scale;
            o1 *= a.v_scale;
        }
        const float lse2 = lsum > 0.f ? mmax + __log2f(lsum) : -INFINITY;
        const int k = (i - tid) / G::THREADS;
        if (pre_on && k < PRE) {                   /* the fused merge with the pair read up front */
            /* (selects, not an index: the arrays stay in registers) */
            const uint32_t pp = k == 0 ? pre_pair[0] : pre_pair[PRE - 1];
            const float pl = k == 0 ? pre_lse[0] : pre_lse[PRE - 1];
            const float l = fused_merge_with<T>(a, pp, pl, lse2, o0, o1);
            *reinterpret_cast<uint32_t *>((T *)a.out + out_index(a, qstart + tok, hq, d)) = pack2<T>(o0, o1);
            if (d == 0) a.lse[merge_lse_index(a, qstart + tok, hq)] = l;
            continue;
        }
        store_pair<T>(a, w, G::ROWS, HD, lr, qstart + tok, hq, d, o0, o1, lse2);
        if (d == 0) store_lse<T>(a, w, G::ROWS, lr, qstart + tok, hq, lse2);
    }
}

/* The split-KV combine of one row, shared by combine_kernel and DECODE_TMA's folded prefix
 * combine: the largest of its count partial LSEs (log2, lse[k x stride]; -inf when no partial
 * saw a key) - partial k then weighs exp2(lse_k - m), m read as 0 when -inf - and, from that
 * maximum and the sum of the weights, the factor that normalises the weighted sum (*inv) and
 * the combined LSE (log2). */
__device__ __forceinline__ float partials_max_lse(const float *lse, int64_t stride, int count)
{
    float m = -INFINITY;
    for (int k = 0; k < count; k++) m = fmaxf(m, lse[(int64_t)k * stride]);
    return m;
}
__device__ __forceinline__ float partials_lse(float mmax, float wsum, float *inv)
{
    *inv = wsum > 0.f && mmax != -INFINITY ? 1.f / wsum : 0.f;
    return mmax == -INFINITY ? -INFINITY : mmax + __log2f(wsum);
}

/* Split-KV combine: blockIdx.x = the group, blockIdx.y = a slice of its rows x dim pairs (the
 * launch gives team threads per (row, dim pair): a 128-row prefix-pass group is 32 CTAs, not one
 * CTA walking 32 latency-bound iterations); LSE-weighted merge of the normalised partials.
 * rows: the rows of one partial (its stride); live_rows <= rows: the rows covered, from the
 * first (rows past the last query token of every group are skipped either way).  team (a power
 * of two up to 32, attn_plan.h ar_attn_combine_team): the neighbouring lanes that share one
 * (row, dim pair), member m walking partials m, m + team, ...; their maxima and sums are joined
 * by shuffles within the team, and member 0 writes.  A team lies inside one warp and takes one
 * path (its lanes share the row and the dim pair), so the shuffles name the team's lanes only. */
template <typename T>
__global__ void combine_kernel(const ar_attn_args a, int rows, int live_rows, int hd, int team)
{
    const ar_combine_group cg = a.groups[blockIdx.x];
    const int qstart = a.query_start_loc[cg.req];
    const int q_len = a.query_start_loc[cg.req + 1] - qstart;
    const int grp = a.group;
    T *out = reinterpret_cast<T *>(a.out);
    const int lane = threadIdx.x & 31, member = lane & (team - 1), team_shift = __ffs(team) - 1;
    const unsigned team_lanes = team == 32 ? 0xffffffffu : ((1u << team) - 1u) << (lane & ~(team - 1));
    const int64_t total = (int64_t)live_rows * (hd / 2) * team;
    for (int64_t t = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; t < total; t += (int64_t)blockDim.x * gridDim.y) {
        const int i = (int)(t >> team_shift);
        int lr = i / (hd / 2), d = (i % (hd / 2)) * 2;
        int pair = cg.pair0 + lr, tok = pair / grp, hq = cg.kv_head * grp + pair % grp;
        if (tok >= q_len || d >= a.head_size) continue;
        const int64_t row0 = (int64_t)cg.first_partial * rows + lr;
        float mmax = -INFINITY;
        for (int k = member; k < cg.count; k += team) mmax = fmaxf(mmax, a.partial_lse[row0 + (int64_t)k * rows]);
        for (int off = team >> 1; off > 0; off >>= 1) mmax = fmaxf(mmax, __shfl_xor_sync(team_lanes, mmax, off));
        const float m_use = mmax == -INFINITY ? 0.f : mmax;
        float wsum = 0.f, o0 = 0.f, o1 = 0.f;
        for (int k = member; k < cg.count; k += team) {
            int64_t pr = row0 + (int64_t)k * rows;
            float lk = a.partial_lse[pr];
            float wgt = exp2f(lk - m_use);
            const float *src = a.partial_o + pr * hd + d;
            if (a.fault == AR_FAULT_MERGE_NO_WEIGHTS) {
                if (lk != -INFINITY) { o0 += src[0]; o1 += src[1]; }
            } else {
                o0 += src[0] * wgt;
                o1 += src[1] * wgt;
            }
            wsum += wgt;
        }
        for (int off = team >> 1; off > 0; off >>= 1) {
            wsum += __shfl_xor_sync(team_lanes, wsum, off);
            o0 += __shfl_xor_sync(team_lanes, o0, off);
            o1 += __shfl_xor_sync(team_lanes, o1, off);
        }
        if (member != 0) continue;
        float inv;
        const float lse2 = partials_lse(mmax, wsum, &inv);
        if (a.fault != AR_FAULT_MERGE_NO_WEIGHTS) {
            o0 *= inv;
            o1 *= inv;
        }
        int64_t idx = out_index(a, qstart + tok, hq, d);
        float merged_lse = 0.f;
        if (a.merge_out) merged_lse = fused_merge<T>(a, qstart + tok, hq, d, lse2, o0, o1);
        *reinterpret_cast<uint32_t *>(out + idx) = pack2<T>(o0, o1);
        if (d == 0) {
            float v = lse2;
            if (a.merge_out) v = merged_lse;
            else if (a.fault != AR_FAULT_LSE_BASE2 && lse2 != -INFINITY) v = lse2 * 0.6931471805599453f;
            a.lse[merge_lse_index(a, qstart + tok, hq)] = v;
        }
    }
}

/* Cascade merge (vLLM merge_attn_states): out = the LSE-weighted mix of the prefix and suffix
 * partial outputs.  A +inf LSE is read as -inf (an empty side); both sides empty -> out = the
 * prefix output, lse = -inf; a NaN LSE on either side gives a NaN row.  Partials arrive in the
 * run dtype (as vLLM holds them), the mix is computed in fp32 and rounded once.
 *   p_out, s_out, out [num_tokens, num_heads, head_size] dtype; p_lse, s_lse, lse
 *   [num_heads, num_tokens] natural log.  One thread per pair of dims, grid-stride.
 * no_weights (AR_FAULT_MERGE_NO_WEIGHTS) adds the two sides unweighted; lse_base2
 * (AR_FAULT_LSE_BASE2) reports the merged LSE as log2. */
template <typename T>
__global__ void merge_kernel(const T *p_out, const float *p_lse, const T *s_out, const float *s_lse, T *out,
                             float *lse, int num_tokens, int num_heads, int head_size, int no_weights,
                             int lse_base2)
{
    const int half = head_size / 2;
    const int64_t total = (int64_t)num_tokens * num_heads * half;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int d = (int)(idx % half) * 2;
        int64_t th = idx / half;
        int h = (int)(th % num_heads);
        int t = (int)(th / num_heads);
        int64_t li = (int64_t)h * num_tokens + t;
        int64_t oi = th * head_size + d;
        float o0, o1;
        const float l = merge_pair(p_lse[li], s_lse[li], no_weights != 0, (float)p_out[oi], (float)p_out[oi + 1],
                                   (float)s_out[oi], (float)s_out[oi + 1], &o0, &o1);
        *reinterpret_cast<uint32_t *>(out + oi) = pack2<T>(o0, o1);
        if (d == 0) lse[li] = lse_base2 ? l * 1.4426950408889634f : l;
    }
}

/* The instantiated geometries: (config, hd) -> Geom. */
typedef Geom<64, 2, 4, 1, 64> PrefillG64;
typedef Geom<128, 2, 4, 1, 32> PrefillG128;      /* no register spills (FA2's 128 x 64 tile spills) */
typedef Geom<256, 1, 8, 1, 32> PrefillG256;
typedef Geom<64, 1, 1, 4, 32> DecodeG64;
typedef Geom<128, 1, 1, 4, 16> DecodeG128;
typedef Geom<256, 1, 1, 4, 16> DecodeG256;

template <typename G> static ar_attn_geom geom_of()
{
    ar_attn_geom r;
    r.rows = G::ROWS;
    r.block_n = G::BLOCK_N;
    r.warps_n = G::WARPS_N;
    r.threads = G::THREADS;
    r.smem = G::SMEM;
    return r;
}

template <typename T, typename G, bool KV8>
static cudaError_t launch_one(const ar_attn_args *a, int num_work, cudaStream_t stream)
{
    if (num_work <= 0) return cudaSuccess;
    constexpr size_t smem = smem_bytes<G, KV8>();
    if (a->head_size == G::HD)
        attn_kernel<T, G, true, KV8><<<num_work, G::THREADS, smem, stream>>>(*a);
    else
        attn_kernel<T, G, false, KV8><<<num_work, G::THREADS, smem, stream>>>(*a);
    return cudaGetLastError();
}

template <typename T, typename G, bool EXACT, bool KV8>
static cudaError_t attributes_variant(int *ctas_per_sm)
{
    constexpr size_t smem = smem_bytes<G, KV8>();
    cudaError_t e = cudaFuncSetAttribute(attn_kernel<T, G, EXACT, KV8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(attn_kernel<T, G, EXACT, KV8>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(ctas_per_sm, attn_kernel<T, G, EXACT, KV8>, G::THREADS, smem);
}

/* Sets both variants' attributes; reports the CTAs per SM of the exact (fast) one. */
template <typename T, typename G, bool KV8>
static cudaError_t attributes_one(int *ctas_per_sm)
{
    int generic = 0;
    cudaError_t e = attributes_variant<T, G, false, KV8>(&generic);
    if (e != cudaSuccess) return e;
    return attributes_variant<T, G, true, KV8>(ctas_per_sm);
}

} /* namespace ar_attn */

#include "cuda_attn_wgmma.cuh"
#include "cuda_attn_decode_tma.cuh"

namespace ar_attn {

/* The per-dtype launchers; cuda_attn_bf16.cu and cuda_attn_fp16.cu each instantiate one with
 * KV8 false, cuda_attn_{bf16,fp16}_kv8.cu with KV8 true (an fp8 cache: PREFILL, DECODE and
 * DECODE_TMA; the wgmma kernel copies 16-bit tiles and is never planned for it). */
template <typename T, bool KV8>
cudaError_t launch_typed(int config, int hd, const ar_attn_args *a, int num_work, cudaStream_t stream)
{
    if (config == AR_CFG_DECODE_TMA) return hd == 128 ? launch_decode_tma<T, KV8>(a, num_work, stream) : cudaErrorInvalidValue;
    if constexpr (!KV8) {
        if (config == AR_CFG_PREFILL_WG)
            return hd == 128 && a->head_size == 128   ? launch_wgmma<T, 128>(a, num_work, stream)
                   : hd == 256 && a->head_size == 256 ? launch_wgmma<T, 256>(a, num_work, stream)
                                                      : cudaErrorInvalidValue;
    } else if (config != AR_CFG_PREFILL && config != AR_CFG_DECODE) {
        return cudaErrorInvalidValue;
    }
    if (config != AR_CFG_DECODE) {
        if (hd == 64) return launch_one<T, PrefillG64, KV8>(a, num_work, stream);
        if (hd == 128) return launch_one<T, PrefillG128, KV8>(a, num_work, stream);
        if (hd == 256) return launch_one<T, PrefillG256, KV8>(a, num_work, stream);
    } else {
        if (hd == 64) return launch_one<T, DecodeG64, KV8>(a, num_work, stream);
        if (hd == 128) return launch_one<T, DecodeG128, KV8>(a, num_work, stream);
        if (hd == 256) return launch_one<T, DecodeG256, KV8>(a, num_work, stream);
    }
    return cudaErrorInvalidValue;
}

template <typename T, bool KV8>
cudaError_t attributes_typed(int config, int hd, int *ctas_per_sm)
{
    if (config == AR_CFG_DECODE_TMA) return attributes_decode_tma<T, KV8>(ctas_per_sm);
    if constexpr (!KV8) {
        if (config == AR_CFG_PREFILL_WG)
            return hd == 256 ? attributes_wgmma<T, 256>(ctas_per_sm) : attributes_wgmma<T, 128>(ctas_per_sm);
    } else if (config != AR_CFG_PREFILL && config != AR_CFG_DECODE) {
        return cudaErrorInvalidValue;
    }
    if (config != AR_CFG_DECODE) {
        if (hd == 64) return attributes_one<T, PrefillG64, KV8>(ctas_per_sm);
        if (hd == 128) return attributes_one<T, PrefillG128, KV8>(ctas_per_sm);
        if (hd == 256) return attributes_one<T, PrefillG256, KV8>(ctas_per_sm);
    } else {
        if (hd == 64) return attributes_one<T, DecodeG64, KV8>(ctas_per_sm);
        if (hd == 128) return attributes_one<T, DecodeG128, KV8>(ctas_per_sm);
        if (hd == 256) return attributes_one<T, DecodeG256, KV8>(ctas_per_sm);
    }
    return cudaErrorInvalidValue;
}

} /* namespace ar_attn */

#endif /* AR_ATTN_KERNEL_BODY */
#endif
