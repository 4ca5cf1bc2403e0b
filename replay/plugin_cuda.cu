/* plugin_cuda.cu - the host's CUDA side for CUDA plugins (plugin_dev.h): stream, events, buffers,
 * the device generator of a step's inputs, the cache write (vLLM's reshape_and_cache), the
 * untimed fill, and for MLA the weights and the W_UK / W_UV projections around the plugin.
 * Deliberately simple kernels, one thread per element: they run outside the plugin's timed
 * region, except the cache write for a plugin that does not write K/V itself, which is timed as
 * "write" and is one coalesced copy per token row.
 *
 * Everything is enqueued on the one non-blocking stream a run owns; the plugin launches on the
 * same stream, so no synchronisation is needed between the host's work and the plugin's. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/common/cuda_host.cuh"
#include "../reference/mla_ref.h"
#include "plugin_dev.h"

struct ar_pdev {
    int device;
    cudaStream_t stream;
    ar_event_pool ev;                /* the timing events, grow-only (cuda_host.cuh) */
    char name[128];
};

static int cuda_fail(cudaError_t e, const char *what, char *err, size_t err_len)
{
    if (e == cudaSuccess) return 0;
    snprintf(err, err_len, "CUDA %s: %s", what, cudaGetErrorString(e));
    return 3;
}

extern "C" int ar_pdev_probe(char *why, size_t why_len)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        snprintf(why, why_len, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
        return 3;
    }
    return 0;
}

extern "C" int ar_pdev_count(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return count;
}

extern "C" int ar_pdev_open(ar_pdev **out, int device, char *err, size_t err_len)
{
    *out = NULL;
    if (ar_pdev_probe(err, err_len) != 0) return 3;
    ar_pdev *d = (ar_pdev *)calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, err_len, "out of memory");
        return 3;
    }
    d->device = device;
    cudaDeviceProp prop;
    int rc = cuda_fail(cudaSetDevice(d->device), "cudaSetDevice", err, err_len);
    if (!rc) rc = cuda_fail(cudaGetDeviceProperties(&prop, d->device), "cudaGetDeviceProperties", err, err_len);
    if (!rc) rc = cuda_fail(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking), "stream", err, err_len);
    if (!rc) rc = ar_pdev_reserve_events(d, AR_PDEV_EVENTS, err, err_len);
    if (rc) {
        ar_pdev_close(d);
        return rc;
    }
    snprintf(d->name, sizeof d->name, "%s", prop.name);
    *out = d;
    return 0;
}

extern "C" void ar_pdev_close(ar_pdev *d)
{
    if (!d) return;
    if (d->stream) cudaStreamSynchronize(d->stream);
    ar_event_pool_free(&d->ev);
    if (d->stream) cudaStreamDestroy(d->stream);
    free(d);
}

extern "C" void *ar_pdev_stream(ar_pdev *d) { return d ? (void *)d->stream : NULL; }
extern "C" int ar_pdev_device_id(const ar_pdev *d) { return d ? d->device : 0; }

extern "C" void ar_pdev_device_name(const ar_pdev *d, char *buf, size_t len)
{
    snprintf(buf, len, "%s", d ? d->name : "none");
}

extern "C" int ar_pdev_alloc(ar_pdev *d, void **p, size_t bytes, char *err, size_t err_len)
{
    (void)d;
    *p = NULL;
    /* Allocations happen when a run opens or a step outgrows the buffers, never per step. */
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        snprintf(err, err_len, "cudaMalloc of %zu bytes: %s", bytes, cudaGetErrorString(e));
        return 3;
    }
    return 0;
}

extern "C" void ar_pdev_free(ar_pdev *d, void *p)
{
    (void)d;
    if (p) cudaFree(p);
}

extern "C" int ar_pdev_memset(ar_pdev *d, void *p, int value, size_t bytes, char *err, size_t err_len)
{
    return cuda_fail(cudaMemsetAsync(p, value, bytes, d->stream), "cudaMemsetAsync", err, err_len);
}

extern "C" int ar_pdev_upload(ar_pdev *d, void *dst, const void *src, size_t bytes, char *err, size_t err_len)
{
    return cuda_fail(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, d->stream), "upload", err, err_len);
}

extern "C" int ar_pdev_download(ar_pdev *d, void *dst, const void *src, size_t bytes, char *err, size_t err_len)
{
    int rc = cuda_fail(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, d->stream), "download", err, err_len);
    if (!rc) rc = cuda_fail(cudaStreamSynchronize(d->stream), "download", err, err_len);
    return rc;
}

/* ---- kernels ------------------------------------------------------------------------------- */

/* One row (a token's head) of generated values, stored as dtype bits. */
__device__ void gen_row_store(const ar_pdev_gen g, uint32_t stream, uint64_t key, uint64_t pos, uint32_t head,
                              void *dst, int64_t first, int d)
{
    uint64_t row = ar_gen_row(g.seed, stream, g.layer, key, pos, head);
    ar_store(g.dtype, dst, first + d, ar_gen(row, (uint32_t)d, g.dist, g.dtype));
}

/* grid.x = tokens, grid.y = Hq + 2 Hkv rows, threads over D. */
__global__ void gen_inputs_kernel(ar_pdev_gen g, const uint64_t *qkey, const int32_t *pos, const uint64_t *kvkey,
                                  void *q, void *k_new, void *v_new)
{
    const int t = blockIdx.x, r = blockIdx.y;
    for (int d = threadIdx.x; d < g.head_size; d += blockDim.x) {
        if (r < g.num_q_heads) {
            gen_row_store(g, AR_STREAM_Q, qkey[t], (uint64_t)pos[t], (uint32_t)r, q,
                          ((int64_t)t * g.num_q_heads + r) * g.head_size, d);
        } else {
            int h = r - g.num_q_heads, side = h >= g.num_kv_heads;
            if (side) h -= g.num_kv_heads;
            gen_row_store(g, side ? AR_STREAM_V : AR_STREAM_K, kvkey[t], (uint64_t)(pos[t] % g.block_size),
                          (uint32_t)h, side ? v_new : k_new, ((int64_t)t * g.num_kv_heads + h) * g.head_size, d);
        }
    }
}

__device__ void cache_put(const ar_pdev_gen g, void *cache, int64_t i, float x)
{
    if (g.kv_dtype == g.dtype) ar_store(g.kv_dtype, cache, i, x);
    else ar_store(g.kv_dtype, cache, i, __fdiv_rn(x, g.kv_scale));
}

/* grid.x = tokens; threads over Hkv * D of both sides (MLA: the one side of entries). */
__global__ void write_kv_kernel(ar_pdev_gen g, const int64_t *slots, const void *k_new, const void *v_new, void *cache)
{
    const int t = blockIdx.x;
    const int64_t slot = slots[t];
    if (slot < 0) return;
    const int64_t row = (int64_t)g.num_kv_heads * g.head_size;
    const int64_t side = g.num_blocks * g.block_size * row;
    for (int64_t e = threadIdx.x; e < row; e += blockDim.x) {
        cache_put(g, cache, slot * row + e, ar_load(g.dtype, k_new, (int64_t)t * row + e));
        if (!g.latent) cache_put(g, cache, side + slot * row + e, ar_load(g.dtype, v_new, (int64_t)t * row + e));
    }
}

/* grid.x = fill entries, grid.y = 2 Hkv rows (MLA: 1, the entry); threads over D. */
__global__ void fill_kernel(ar_pdev_gen g, const int64_t *slots, const uint64_t *keys, const int32_t *offsets,
                            void *cache)
{
    const int i = blockIdx.x;
    int h = blockIdx.y, sd = h >= g.num_kv_heads;
    if (sd) h -= g.num_kv_heads;
    const int64_t row = (int64_t)g.num_kv_heads * g.head_size;
    const int64_t side = g.num_blocks * g.block_size * row;
    const uint32_t stream = g.latent ? AR_STREAM_LATENT : sd ? AR_STREAM_V : AR_STREAM_K;
    uint64_t gr = ar_gen_row(g.seed, stream, g.layer, keys[i], (uint64_t)offsets[i], (uint32_t)h);
    for (int d = threadIdx.x; d < g.head_size; d += blockDim.x) {
        float x = ar_gen(gr, (uint32_t)d, g.dist, g.dtype);
        cache_put(g, cache, (sd ? side : 0) + slots[i] * row + (int64_t)h * g.head_size + d, x);
    }
}

__global__ void guard_set_kernel(uint32_t *p)
{
    for (int i = threadIdx.x; i < AR_GUARD_WORDS; i += blockDim.x) p[i] = AR_GUARD_PATTERN;
}

static int threads_for(int n) { return n >= 128 ? 128 : n >= 64 ? 64 : 32; }

extern "C" int ar_pdev_gen_inputs(ar_pdev *d, const ar_pdev_gen *g, int num_tokens, const uint64_t *qkey,
                                  const int32_t *pos, const uint64_t *kvkey, void *q, void *k_new, void *v_new,
                                  char *err, size_t err_len)
{
    if (num_tokens <= 0) return 0;
    dim3 grid((unsigned)num_tokens, (unsigned)(g->num_q_heads + 2 * g->num_kv_heads));
    gen_inputs_kernel<<<grid, threads_for(g->head_size), 0, d->stream>>>(*g, qkey, pos, kvkey, q, k_new, v_new);
    return cuda_fail(cudaGetLastError(), "generator launch", err, err_len);
}

extern "C" int ar_pdev_write_kv(ar_pdev *d, const ar_pdev_gen *g, int num_tokens, const int64_t *slot_mapping,
                                const void *k_new, const void *v_new, void *cache, char *err, size_t err_len)
{
    if (num_tokens <= 0) return 0;
    write_kv_kernel<<<num_tokens, threads_for(g->num_kv_heads * g->head_size), 0, d->stream>>>(
        *g, slot_mapping, k_new, v_new, cache);
    return cuda_fail(cudaGetLastError(), "cache write launch", err, err_len);
}

extern "C" int ar_pdev_fill(ar_pdev *d, const ar_pdev_gen *g, int count, const int64_t *slots,
                            const uint64_t *keys, const int32_t *offsets, void *cache, char *err, size_t err_len)
{
    if (count <= 0) return 0;
    dim3 grid((unsigned)count, (unsigned)(g->latent ? 1 : 2 * g->num_kv_heads));
    fill_kernel<<<grid, threads_for(g->head_size), 0, d->stream>>>(*g, slots, keys, offsets, cache);
    return cuda_fail(cudaGetLastError(), "fill launch", err, err_len);
}

/* ---- MLA: the projections around a plugin's latent attention ------------------------------- */

/* grid.x = N heads, grid.y = L rows; threads over the P + V columns. */
__global__ void mla_weights_kernel(ar_pdev_gen g, ar_pdev_mla m, float *w_uk, float *w_uv)
{
    const int n = blockIdx.x, l = blockIdx.y, L = m.kv_lora_rank, P = m.qk_nope_head_dim, V = m.v_head_dim;
    for (int c = threadIdx.x; c < P + V; c += blockDim.x) {
        if (c < P)
            w_uk[((int64_t)n * L + l) * P + c] = ar_mla_weight(g.seed, AR_STREAM_W_UK, g.layer, L, l, n, c, g.dist, g.dtype);
        else
            w_uv[((int64_t)n * L + l) * V + c - P] =
                ar_mla_weight(g.seed, AR_STREAM_W_UV, g.layer, L, l, n, c - P, g.dist, g.dtype);
    }
}

/* Query head n's weights (the wrong-kv-head fault takes head n + 1's, as cpu-mla does). */
__device__ int mla_weight_head(const ar_pdev_gen &g, const ar_pdev_mla &m, int n)
{
    return m.shift_heads ? (n + 1) % g.num_q_heads : n;
}

/* grid.x = tokens, grid.y = N + 1: rows n < N the query of head n (q_nope staged in shared memory,
 * one thread per latent dim for the absorption), row N the token's new entry. */
__global__ void mla_gen_inputs_kernel(ar_pdev_gen g, ar_pdev_mla m, const uint64_t *qkey, const int32_t *pos,
                                      const uint64_t *kvkey, const float *w_uk, void *q, void *lat)
{
    extern __shared__ float qn[];   /* [P] */
    const int t = blockIdx.x, n = blockIdx.y, N = g.num_q_heads;
    const int L = m.kv_lora_rank, R = m.qk_rope_head_dim, P = m.qk_nope_head_dim, E = L + R;
    if (n == N) {
        uint64_t row = ar_gen_row(g.seed, AR_STREAM_LATENT, g.layer, kvkey[t], (uint64_t)(pos[t] % g.block_size), 0);
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            ar_store(g.dtype, lat, (int64_t)t * E + e, ar_gen(row, (uint32_t)e, g.dist, g.dtype));
        return;
    }
    const uint64_t rn = ar_gen_row(g.seed, AR_STREAM_Q_NOPE, g.layer, qkey[t], (uint64_t)pos[t], (uint32_t)n);
    const uint64_t rp = ar_gen_row(g.seed, AR_STREAM_Q_PE, g.layer, qkey[t], (uint64_t)pos[t], (uint32_t)n);
    for (int c = threadIdx.x; c < P; c += blockDim.x) qn[c] = ar_gen(rn, (uint32_t)c, g.dist, g.dtype);
    __syncthreads();
    const float *w = w_uk + (int64_t)mla_weight_head(g, m, n) * L * P;
    const int64_t first = ((int64_t)t * N + n) * E;
    for (int l = threadIdx.x; l < L; l += blockDim.x) {
        double acc = 0;
        for (int c = 0; c < P; c++) acc += (double)qn[c] * w[(int64_t)l * P + c];
        ar_store(g.dtype, q, first + l, ar_round_to(g.dtype, (float)acc));
    }
    for (int r = threadIdx.x; r < R; r += blockDim.x)
        ar_store(g.dtype, q, first + L + r, ar_gen(rp, (uint32_t)r, g.dist, g.dtype));
}

/* grid.x = tokens, grid.y = N heads; threads over V. */
__global__ void mla_vproj_kernel(ar_pdev_gen g, ar_pdev_mla m, const void *o_lat, const float *w_uv, float *out)
{
    const int t = blockIdx.x, n = blockIdx.y, N = g.num_q_heads, L = m.kv_lora_rank, V = m.v_head_dim;
    const int64_t lat = ((int64_t)t * N + n) * L;
    const float *w = w_uv + (int64_t)mla_weight_head(g, m, n) * L * V;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float x;
        if (m.no_wuv) {
            x = ar_load(g.dtype, o_lat, lat + v);
        } else {
            double acc = 0;
            for (int l = 0; l < L; l++) acc += (double)ar_load(g.dtype, o_lat, lat + l) * w[(int64_t)l * V + v];
            x = ar_round_to(g.dtype, (float)acc);
        }
        out[((int64_t)t * N + n) * V + v] = x;
    }
}

extern "C" int ar_pdev_mla_weights(ar_pdev *d, const ar_pdev_gen *g, const ar_pdev_mla *m, float *w_uk, float *w_uv,
                                   char *err, size_t err_len)
{
    dim3 grid((unsigned)g->num_q_heads, (unsigned)m->kv_lora_rank);
    mla_weights_kernel<<<grid, 128, 0, d->stream>>>(*g, *m, w_uk, w_uv);
    return cuda_fail(cudaGetLastError(), "MLA weights launch", err, err_len);
}

extern "C" int ar_pdev_mla_gen_inputs(ar_pdev *d, const ar_pdev_gen *g, const ar_pdev_mla *m, int num_tokens,
                                      const uint64_t *qkey, const int32_t *pos, const uint64_t *kvkey,
                                      const float *w_uk, void *q, void *lat, char *err, size_t err_len)
{
    if (num_tokens <= 0) return 0;
    dim3 grid((unsigned)num_tokens, (unsigned)(g->num_q_heads + 1));
    size_t smem = sizeof(float) * (size_t)m->qk_nope_head_dim;
    mla_gen_inputs_kernel<<<grid, 128, smem, d->stream>>>(*g, *m, qkey, pos, kvkey, w_uk, q, lat);
    return cuda_fail(cudaGetLastError(), "MLA generator launch", err, err_len);
}

extern "C" int ar_pdev_mla_vproj(ar_pdev *d, const ar_pdev_gen *g, const ar_pdev_mla *m, int num_tokens,
                                 const void *o_lat, const float *w_uv, float *out, char *err, size_t err_len)
{
    if (num_tokens <= 0) return 0;
    dim3 grid((unsigned)num_tokens, (unsigned)g->num_q_heads);
    mla_vproj_kernel<<<grid, threads_for(m->v_head_dim), 0, d->stream>>>(*g, *m, o_lat, w_uv, out);
    return cuda_fail(cudaGetLastError(), "MLA W_UV launch", err, err_len);
}

extern "C" int ar_pdev_reserve_events(ar_pdev *d, int n, char *err, size_t err_len)
{
    if (n > AR_PDEV_MAX_EVENTS) {
        snprintf(err, err_len, "%d timing events asked for, at most %d", n, AR_PDEV_MAX_EVENTS);
        return 3;
    }
    /* the pool keeps the events it had when one more cannot be made */
    return cuda_fail(ar_event_pool_reserve(&d->ev, n), "cudaEventCreate", err, err_len);
}

static int event_index_ok(const ar_pdev *d, int i, char *err, size_t err_len)
{
    if (i >= 0 && i < d->ev.n) return 1;
    snprintf(err, err_len, "timing event %d of %d", i, d->ev.n);
    return 0;
}

extern "C" int ar_pdev_record(ar_pdev *d, int i, char *err, size_t err_len)
{
    if (!event_index_ok(d, i, err, err_len)) return 3;
    return cuda_fail(cudaEventRecord(d->ev.ev[i], d->stream), "cudaEventRecord", err, err_len);
}

extern "C" int ar_pdev_elapsed_us(ar_pdev *d, int a, int b, double *us, char *err, size_t err_len)
{
    float ms = 0;
    *us = 0;
    if (!event_index_ok(d, a, err, err_len) || !event_index_ok(d, b, err, err_len)) return 3;
    int rc = cuda_fail(cudaEventSynchronize(d->ev.ev[b]), "cudaEventSynchronize", err, err_len);
    if (!rc)
        rc = cuda_fail(cudaEventElapsedTime(&ms, d->ev.ev[a], d->ev.ev[b]), "cudaEventElapsedTime", err, err_len);
    *us = rc ? 0 : (double)ms * 1e3;
    return rc;
}

extern "C" int ar_pdev_sync(ar_pdev *d, char *err, size_t err_len)
{
    int rc = cuda_fail(cudaStreamSynchronize(d->stream), "stream", err, err_len);
    if (!rc) rc = cuda_fail(cudaGetLastError(), "kernel", err, err_len);
    return rc;
}

extern "C" int ar_pdev_guard_set(ar_pdev *d, void *p, char *err, size_t err_len)
{
    guard_set_kernel<<<1, 64, 0, d->stream>>>((uint32_t *)p);
    return cuda_fail(cudaGetLastError(), "guard launch", err, err_len);
}

extern "C" int ar_pdev_guard_count(ar_pdev *d, const void *p, int *bad, char *err, size_t err_len)
{
    /* 256 bytes back per buffer and forward: small, and the check needs the values. */
    uint32_t words[AR_GUARD_WORDS];
    *bad = 0;
    int rc = ar_pdev_download(d, words, p, sizeof words, err, err_len);
    if (rc) return rc;
    for (int i = 0; i < AR_GUARD_WORDS; i++) *bad += words[i] != AR_GUARD_PATTERN;
    return 0;
}
