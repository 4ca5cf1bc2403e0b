/* example_cuda.cu - an example attnreplay plugin on a CUDA device: paged attention in plain CUDA C.
 *
 * Built by `make` when nvcc is present, as build/plugins/attnreplay-example-cuda.so:
 *     attnreplay replay TRACE --backend plugin:build/plugins/attnreplay-example-cuda.so --db DB
 * It includes only attnreplay_plugin.h and CUDA's own headers, links nothing of attnreplay's, and
 * shows the other half of the ABI from example_cpu.c:
 *   - ATTNREPLAY_PLUGIN_WRITES_KV: forward writes the new K/V into the paged cache itself
 *     (FlashAttention style), then calls host->time_mark("write") so the host times the write
 *     and the attention separately;
 *   - everything is launched on args->stream (the host's), nothing synchronises;
 *   - a KV cache in float8 e4m3 is read back times kv_scale, as vLLM does;
 *   - no ATTNREPLAY_PLUGIN_CASCADE: the host runs every step flat;
 *   - ATTNREPLAY_PLUGIN_MLA: MLA models' latent attention, FlashMLA's part (the host absorbs W_UK
 *     into q and applies W_UV to out): the same kernel over the latent cache [num_blocks,
 *     block_size, L + R], one KV head, keys the whole entries, values their first L elements.
 * The kernel: one block per (query token, query head), four warps; each warp takes every fourth
 * key, its lanes split the head dim, the dot product is a warp reduction and each warp keeps an
 * online softmax; the warps merge at the end.  Simple, not fast. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attnreplay_plugin.h"

#define WARPS 4
#define MAX_D 256        /* MHA head size */
#define MAX_D_MLA 576    /* MLA entry width L + R (DeepSeek: 512 + 64) */

static const attnreplay_host_api *host;

static int fail(const char *msg)
{
    host->set_error(msg);
    return 1;
}

enum { T_F32 = 0, T_F16 = 1, T_BF16 = 2, T_FP8 = 3 };

static int type_of(DLDataType t)
{
    if (t.code == kDLFloat && t.bits == 32) return T_F32;
    if (t.code == kDLFloat && t.bits == 16) return T_F16;
    if (t.code == kDLBfloat && t.bits == 16) return T_BF16;
    if (t.code == kDLFloat8_e4m3fn && t.bits == 8) return T_FP8;
    return -1;
}

__device__ __forceinline__ float load(int t, const void *p, long long i)
{
    switch (t) {
    case T_F16: return __half2float(((const __half *)p)[i]);
    case T_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case T_FP8: return float(((const __nv_fp8_e4m3 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

__device__ __forceinline__ void store(int t, void *p, long long i, float v)
{
    switch (t) {
    case T_F16: ((__half *)p)[i] = __float2half_rn(v); break;
    case T_BF16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    case T_FP8: ((__nv_fp8_e4m3 *)p)[i] = __nv_fp8_e4m3(v); break;
    default: ((float *)p)[i] = v; break;
    }
}

struct params {
    int hq, hkv, d, bs, window, dt, kvt, stride;
    int dv;     /* the value / output head dim: d, or L for MLA */
    int mla;    /* the cache is one side of latent entries; values are their first dv elements */
    long long num_blocks;
    float scale, soft_cap, kv_scale;
};

/* K/V of each new token into the cache at its slot (slot -1 skipped); fp8: x / kv_scale. */
__global__ void write_kv(params p, const long long *slots, const void *k, const void *v, void *cache)
{
    const int t = blockIdx.x;
    const long long slot = slots[t];
    if (slot < 0) return;
    const long long row = (long long)p.hkv * p.d, side = p.num_blocks * p.bs * row;
    /* fp8: stored = quantize(x / kv_scale), an IEEE division (not x * (1 / kv_scale), and not
     * --use_fast_math's approximate one), as vLLM's scaled_convert and the host's reference do */
    const float div = p.kvt == p.dt ? 1.0f : p.kv_scale;
    for (long long e = threadIdx.x; e < row; e += blockDim.x) {
        store(p.kvt, cache, slot * row + e, __fdiv_rn(load(p.dt, k, t * row + e), div));
        if (!p.mla) store(p.kvt, cache, side + slot * row + e, __fdiv_rn(load(p.dt, v, t * row + e), div));
    }
}

/* D_MAX: the largest head size the instance holds in registers (32 lanes x D_MAX / 32). */
template <int D_MAX>
__global__ void attention(params p, const int *qsl, const int *seq_lens, const int *table, const void *q,
                          const void *cache, void *out, float *lse, int num_reqs, int num_tokens)
{
    constexpr int PER_LANE = D_MAX / 32;
    const int t = blockIdx.x, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    /* the request of token t: a binary search over query_start_loc */
    int lo = 0, hi = num_reqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (qsl[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    const int r = lo, n = qsl[r + 1] - qsl[r], pos = seq_lens[r] - n + (t - qsl[r]);
    const int first = p.window > 0 && pos + 1 - p.window > 0 ? pos + 1 - p.window : 0;
    const int kvh = h / (p.hq / p.hkv);
    const long long row = (long long)p.hkv * p.d, side = p.mla ? 0 : p.num_blocks * p.bs * row;
    const float kvs = p.kvt == p.dt ? 1.0f : p.kv_scale;
    float qr[PER_LANE], acc[PER_LANE];
    for (int i = 0; i < PER_LANE; i++) {
        int d = lane + 32 * i;
        qr[i] = d < p.d ? load(p.dt, q, ((long long)t * p.hq + h) * p.d + d) : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int j = first + warp; j <= pos; j += WARPS) {
        const long long base = ((long long)table[(long long)r * p.stride + j / p.bs] * p.bs + j % p.bs) * row +
                               (long long)kvh * p.d;
        float dot = 0.0f;
        for (int i = 0; i < PER_LANE; i++) {
            int d = lane + 32 * i;
            if (d < p.d) dot += qr[i] * load(p.kvt, cache, base + d) * kvs;
        }
        for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        float s = dot * p.scale;
        if (p.soft_cap > 0) s = p.soft_cap * tanhf(s / p.soft_cap);
        float m_new = fmaxf(m, s), corr = __expf(m - m_new), w = __expf(s - m_new);
        l = l * corr + w;
        for (int i = 0; i < PER_LANE; i++) {
            int d = lane + 32 * i;
            float vv = d < p.dv ? load(p.kvt, cache, side + base + d) * kvs : 0.0f;
            acc[i] = acc[i] * corr + w * vv;
        }
        m = m_new;
    }
    __shared__ float sm[WARPS], sl[WARPS], sacc[WARPS][D_MAX];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    for (int i = 0; i < PER_LANE; i++) {
        int d = lane + 32 * i;
        if (d < p.dv) sacc[warp][d] = acc[i];
    }
    __syncthreads();
    if (warp != 0) return;
    float mt = -INFINITY;
    for (int w = 0; w < WARPS; w++) mt = fmaxf(mt, sm[w]);
    float lt = 0.0f;
    for (int w = 0; w < WARPS; w++) lt += sm[w] == -INFINITY ? 0.0f : sl[w] * __expf(sm[w] - mt);
    for (int i = 0; i < PER_LANE; i++) {
        int d = lane + 32 * i;
        if (d >= p.dv) continue;
        float o = 0.0f;
        for (int w = 0; w < WARPS; w++)
            if (sm[w] != -INFINITY) o += sacc[w][d] * __expf(sm[w] - mt);
        store(p.dt, out, ((long long)t * p.hq + h) * p.dv + d, lt > 0 ? o / lt : 0.0f);
    }
    if (lane == 0) lse[(long long)h * num_tokens + t] = lt > 0 ? mt + logf(lt) : -INFINITY;
}

struct state {
    attnreplay_config cfg;
    params p;
    const attnreplay_metadata *md;
};

static int ex_check(const attnreplay_config *cfg)
{
    static char why[200];
    int dt = type_of(cfg->dtype), kvt = type_of(cfg->kv_dtype);
    if (dt < 0 || dt == T_FP8 || kvt < 0 || (kvt != dt && kvt != T_FP8))
        return fail("dtypes: model float32/float16/bfloat16, cache the same or float8_e4m3fn");
    const bool mla = cfg->attention == ATTNREPLAY_ATTENTION_MLA;
    if (cfg->head_size > (mla ? MAX_D_MLA : MAX_D)) {
        snprintf(why, sizeof why, "head size %d > %d", cfg->head_size, mla ? MAX_D_MLA : MAX_D);
        return fail(why);
    }
    if (strcmp(cfg->inject, "none") != 0) {
        snprintf(why, sizeof why, "planted fault '%s' is not implemented by this example", cfg->inject);
        return fail(why);
    }
    return 0;
}

static int ex_open(const attnreplay_config *cfg, void **out)
{
    state *s = (state *)calloc(1, sizeof *s);
    if (!s) return fail("out of memory");
    s->cfg = *cfg;
    params &p = s->p;
    p.hq = cfg->num_q_heads;
    p.hkv = cfg->num_kv_heads;
    p.d = cfg->head_size;
    p.mla = cfg->attention == ATTNREPLAY_ATTENTION_MLA;
    p.dv = p.mla ? cfg->kv_lora_rank : cfg->head_size;
    p.bs = cfg->block_size;
    p.window = cfg->sliding_window;
    p.dt = type_of(cfg->dtype);
    p.kvt = type_of(cfg->kv_dtype);
    p.num_blocks = cfg->num_blocks;
    p.scale = cfg->scale;
    p.soft_cap = cfg->logits_soft_cap;
    p.kv_scale = cfg->kv_scale;
    *out = s;
    return 0;
}

static void ex_close(void *st) { free(st); }

static int ex_plan(void *st, const attnreplay_metadata *md)
{
    state *s = (state *)st;
    if (md->query_start_loc.device.device_type != kDLCUDA) return fail("metadata is not on the device");
    s->md = md;
    s->p.stride = (int)md->block_table.shape[1];
    return 0;
}

static int ex_forward(void *st, const attnreplay_forward_args *a)
{
    state *s = (state *)st;
    const attnreplay_metadata *md = a->md;
    cudaStream_t stream = (cudaStream_t)a->stream;
    const int T = md->num_actual_tokens;
    if (T == 0) return 0;
    write_kv<<<T, 128, 0, stream>>>(s->p, (const long long *)md->slot_mapping.data, a->k_new.data, a->v_new.data,
                                    a->kv_cache.data);
    host->time_mark("write");
    const dim3 grid((unsigned)T, (unsigned)s->p.hq);
    if (s->p.d > MAX_D)
        attention<MAX_D_MLA><<<grid, 32 * WARPS, 0, stream>>>(
            s->p, (const int *)md->query_start_loc.data, (const int *)md->seq_lens.data,
            (const int *)md->block_table.data, a->q.data, a->kv_cache.data, a->out.data, (float *)a->lse.data,
            md->num_reqs, T);
    else
        attention<MAX_D><<<grid, 32 * WARPS, 0, stream>>>(
            s->p, (const int *)md->query_start_loc.data, (const int *)md->seq_lens.data,
            (const int *)md->block_table.data, a->q.data, a->kv_cache.data, a->out.data, (float *)a->lse.data,
            md->num_reqs, T);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        static char why[200];
        snprintf(why, sizeof why, "kernel launch: %s", cudaGetErrorString(e));
        return fail(why);
    }
    return 0;
}

static const attnreplay_plugin example_cuda = {
    ATTNREPLAY_PLUGIN_ABI_VERSION,
    (int32_t)sizeof(attnreplay_plugin),
    "example-cuda",
    "example plugin: paged attention in plain CUDA C (a block per token and head, online softmax)",
    "dtypes fp32/fp16/bf16; KV same or fp8_e4m3; head size <= 256; GQA/MQA; window; soft cap; "
    "writes its own K/V; MLA (latent attention, entries <= 576)",
    kDLCUDA,
    ATTNREPLAY_PLUGIN_WRITES_KV | ATTNREPLAY_PLUGIN_MLA,
    ex_check,
    ex_open,
    ex_plan,
    ex_forward,
    ex_close,
};

extern "C" ATTNREPLAY_PLUGIN_EXPORT const attnreplay_plugin *attnreplay_plugin_init(const attnreplay_host_api *h,
                                                                                   int host_abi_version)
{
    host = h;
    if (host_abi_version != ATTNREPLAY_PLUGIN_ABI_VERSION) {
        h->set_error("example-cuda was built for plugin ABI version " ATTNREPLAY_PLUGIN_ABI_STRING);
        return NULL;
    }
    return &example_cuda;
}
