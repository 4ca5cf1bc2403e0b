/* mla_common.cuh - what every piece of the cuda-mla backend shares: the latent-cache geometry
 * (576 = 512 latent + 64 rope dims), the decode launch's work items and arguments, and the small
 * device helpers (16-bit conversions, key limits and cache slots, cp.async, ldmatrix, mma.sync,
 * mbarriers and bulk copies, the latent store).  Included by the decode kernels
 * (mla_decode.cu), the backend (cuda_mla.cu) and the test hook (cuda_mla_case.cu). */
#ifndef AR_MLA_COMMON_CUH
#define AR_MLA_COMMON_CUH

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "../../reference/mla_ref.h"
#include "../../replay/backend.h"
#include "mla_plan.h"
#include "mla_route.h"

namespace ar_mla {

constexpr int D = 576;          /* latent cache entry: kv_lora_rank + rope dim */
constexpr int DL = 512;         /* kv_lora_rank: latent part, = values of the latent attention */
constexpr int DR = 64;          /* qk_rope_head_dim */
constexpr int ROWS = AR_MLA_PLAN_ROWS; /* rows of one CTA tile (query token, head) */
constexpr int KEYS = AR_MLA_PLAN_KEYS; /* keys per shared-memory tile (and the planner's key tile) */
constexpr int STRIDE = D + 8;   /* shared row stride in 16-bit elements (conflict-free fragments) */
constexpr int THREADS = 256;    /* 8 warps */
constexpr int SIMT_THREADS = 128; /* the SIMT kernels (decode fallback, prefill attention) */
constexpr int SIMT_CHUNK = 128;   /* keys a SIMT CTA scores at once */
constexpr int PAIRS_MIN_BLOCK = AR_MLA_PAIRS_MIN_BLOCK; /* attn_wgmma_pairs_kernel: two 32-key TMA boxes a 64-dim atom */

/* The planner's items as the kernels read them (mla_plan.h: plain C, so that the plans are
 * tested without a GPU). */
typedef ar_mla_work_item work_item;
typedef ar_mla_combine_group combine_group;

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
    int pad_;                   /* unused: keeps the argument block at 160 bytes, the layout every
                                   decode kernel was measured and checked with */
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

/* x rounded to the 16-bit dtype by the hardware's round-to-nearest-even conversion: the value
 * ar_round_to gives (a NaN may carry another payload), in two instructions. */
__device__ __forceinline__ float round16(int bf16, float x)
{
    return bf16 ? __bfloat162float(__float2bfloat16_rn(x)) : __half2float(__float2half_rn(x));
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

/* A value reduced over the CTA (max or sum; red: one slot per warp in shared memory). */
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

/* Cache element idx as Acc: 16-bit values widened; fp8 e4m3 decoded (times kv_scale for the float64
 * reference, which reads the round-trip value; the float kernels scale later). */
template <typename Acc>
__device__ __forceinline__ Acc cache_value(const attn_args &a, int64_t idx)
{
    if (a.fp8_cache) {
        float x = ar_fp8e4m3_to_f32(((const uint8_t *)a.cache)[idx]);
        return sizeof(Acc) == 8 ? (Acc)__fmul_rn(x, a.kv_scale) : (Acc)x;
    }
    return (Acc)from_bits(a.bf16, ((const uint16_t *)a.cache)[idx]);
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
 * reports, not a hung launch. */
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

} /* namespace ar_mla */

#endif
