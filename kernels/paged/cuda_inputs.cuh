/* cuda_inputs.cuh - the "cuda" backend's small kernels: the device-side data generator (the
 * AR_HOSTDEV code of reference/datagen.h compiled by nvcc, so Q and the new K/V are
 * bit-identical to the CPU's), the paged-cache fill and the KV-cache write (vLLM
 * reshape_and_cache_flash).  Part of cuda_backend.cu's translation unit (included once). */
#ifndef AR_PAGED_INPUTS_CUH
#define AR_PAGED_INPUTS_CUH

static __device__ __forceinline__ uint16_t to_bits(ar_dtype t, float v)
{
    return t == AR_BF16 ? ar_f32_to_bf16(v) : ar_f32_to_fp16(v);
}

/* dst [num_tokens, num_heads, head_size]: Q (stream Q: key = request key, pos = position) or
 * new K/V (key = content key of the token's logical block, pos = offset in the block). */
__global__ void gen_rows_kernel(uint16_t *dst, int num_tokens, int num_heads, int head_size,
                                uint64_t seed, uint32_t stream, uint32_t layer,
                                const int *tok_req, const int *tok_pos, const uint64_t *req_keys,
                                const uint64_t *block_keys, int mbpr, int bs_log2,
                                ar_datadist dist, ar_dtype dtype)
{
    int chunks = head_size / 8;
    int64_t total = (int64_t)num_tokens * num_heads * chunks;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int c = (int)(idx % chunks);
        int64_t rh = idx / chunks;
        int h = (int)(rh % num_heads);
        int t = (int)(rh / num_heads);
        int r = tok_req[t], p = tok_pos[t];
        uint64_t key, pos;
        if (stream == AR_STREAM_Q) {
            key = req_keys[r];
            pos = (uint64_t)p;
        } else {
            key = block_keys[(int64_t)r * mbpr + (p >> bs_log2)];
            pos = (uint64_t)(p & ((1 << bs_log2) - 1));
        }
        uint64_t row = ar_gen_row(seed, stream, layer, key, pos, (uint32_t)h);
        uint16_t v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = to_bits(dtype, ar_gen(row, (uint32_t)(c * 8 + e), dist, dtype));
        uint4 packed;
        packed.x = v[0] | ((uint32_t)v[1] << 16);
        packed.y = v[2] | ((uint32_t)v[3] << 16);
        packed.z = v[4] | ((uint32_t)v[5] << 16);
        packed.w = v[6] | ((uint32_t)v[7] << 16);
        *reinterpret_cast<uint4 *>(dst + rh * head_size + c * 8) = packed;
    }
}

/* Untimed fill of missing context tokens straight from the generator into the cache. */
__global__ void fill_kernel(uint16_t *k_cache, uint16_t *v_cache, int count, const int64_t *slots,
                            const uint64_t *keys, const int *offsets, int hkv, int head_size,
                            uint64_t seed, uint32_t layer, ar_datadist dist, ar_dtype dtype)
{
    int chunks = head_size / 8;
    int64_t total = (int64_t)count * hkv * chunks;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int c = (int)(idx % chunks);
        int64_t ih = idx / chunks;
        int h = (int)(ih % hkv);
        int64_t i = ih / hkv;
        int64_t slot = slots[i];
        if (slot < 0) continue;
        int64_t base = (slot * hkv + h) * head_size + c * 8;
        for (int side = 0; side < 2; side++) {
            uint32_t stream = side == 0 ? AR_STREAM_K : AR_STREAM_V;
            uint64_t row = ar_gen_row(seed, stream, layer, keys[i], (uint64_t)offsets[i], (uint32_t)h);
            uint16_t *dst = side == 0 ? k_cache : v_cache;
#pragma unroll
            for (int e = 0; e < 8; e++) dst[base + e] = to_bits(dtype, ar_gen(row, (uint32_t)(c * 8 + e), dist, dtype));
        }
    }
}

/* reshape_and_cache_flash: token t's K/V rows [hkv * head_size] -> slot_mapping[t]; -1 skipped. */
__global__ void write_kv_kernel(const uint16_t *k_new, const uint16_t *v_new, const int64_t *slots,
                                uint16_t *k_cache, uint16_t *v_cache, int row_elems)
{
    int t = blockIdx.x;
    int64_t slot = slots[t];
    if (slot < 0) return;
    const uint4 *ks = reinterpret_cast<const uint4 *>(k_new + (int64_t)t * row_elems);
    const uint4 *vs = reinterpret_cast<const uint4 *>(v_new + (int64_t)t * row_elems);
    uint4 *kd = reinterpret_cast<uint4 *>(k_cache + slot * row_elems);
    uint4 *vd = reinterpret_cast<uint4 *>(v_cache + slot * row_elems);
    for (int i = threadIdx.x; i < row_elems / 8; i += blockDim.x) {
        kd[i] = ks[i];
        vd[i] = vs[i];
    }
}

__global__ void gen_values_kernel(float *out, uint64_t seed, uint32_t stream, uint32_t layer,
                                  uint64_t key, uint64_t pos0, uint32_t head, int num_pos, int dim,
                                  ar_datadist dist, ar_dtype dtype)
{
    int64_t total = (int64_t)num_pos * dim;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = idx / dim;
        int d = (int)(idx % dim);
        uint64_t row = ar_gen_row(seed, stream, layer, key, pos0 + (uint64_t)i, head);
        out[idx] = ar_gen(row, (uint32_t)d, dist, dtype);
    }
}

static int grid_for(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535 * 8) b = 65535 * 8;
    return (int)b;
}

#endif
