/* cuda_inputs.cuh - the "cuda" backend's small kernels: the device-side data generator (the
 * AR_HOSTDEV code of reference/datagen.h compiled by nvcc, so Q and the new K/V are
 * bit-identical to the CPU's), the paged-cache fill and the KV-cache write (vLLM
 * reshape_and_cache_flash; with an fp8 e4m3 cache both store quantize(x / kv_scale), vLLM's
 * scaled_convert, rounded as reference/dtype.h and ar_kv_roundtrip round it).  Part of
 * cuda_backend.cu's translation unit (included once). */
#ifndef AR_PAGED_INPUTS_CUH
#define AR_PAGED_INPUTS_CUH

static __device__ __forceinline__ uint16_t to_bits(ar_dtype t, float v)
{
    return t == AR_BF16 ? ar_f32_to_bf16(v) : ar_f32_to_fp16(v);
}
static __device__ __forceinline__ float from_bits(ar_dtype t, uint16_t b)
{
    return t == AR_BF16 ? ar_bf16_to_f32(b) : ar_fp16_to_f32(b);
}
/* The fp8 e4m3 bits a K/V value x is stored as: quantize(x / kv_scale), the division correctly
 * rounded whatever the compiler flags (as ar_kv_roundtrip on the device). */
static __device__ __forceinline__ uint8_t to_fp8_scaled(float x, float kv_scale)
{
    return ar_f32_to_fp8e4m3(__fdiv_rn(x, kv_scale));
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

/* Untimed fill of missing context tokens straight from the generator into the cache (caches
 * [num_slots, hkv, head_size] of dtype, or fp8 e4m3 of x / kv_scale when kv_fp8). */
__global__ void fill_kernel(void *k_cache, void *v_cache, int count, const int64_t *slots,
                            const uint64_t *keys, const int *offsets, int hkv, int head_size,
                            uint64_t seed, uint32_t layer, ar_datadist dist, ar_dtype dtype, bool kv_fp8,
                            float kv_scale)
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
            void *dst = side == 0 ? k_cache : v_cache;
            if (kv_fp8) {
#pragma unroll
                for (int e = 0; e < 8; e++)
                    ((uint8_t *)dst)[base + e] = to_fp8_scaled(ar_gen(row, (uint32_t)(c * 8 + e), dist, dtype), kv_scale);
                continue;
            }
#pragma unroll
            for (int e = 0; e < 8; e++)
                ((uint16_t *)dst)[base + e] = to_bits(dtype, ar_gen(row, (uint32_t)(c * 8 + e), dist, dtype));
        }
    }
}

/* reshape_and_cache_flash: token t's K/V rows [hkv * head_size] (dtype bits) -> slot_mapping[t];
 * -1 skipped.  8 elements per step: copied, or (fp8) each value x stored as the e4m3 bits of
 * x / kv_scale (row_elems is then a multiple of 16). */
__global__ void write_kv_kernel(const uint16_t *k_new, const uint16_t *v_new, const int64_t *slots,
                                void *k_cache, void *v_cache, int row_elems, bool fp8, ar_dtype dtype,
                                float kv_scale)
{
    int t = blockIdx.x;
    int64_t slot = slots[t];
    if (slot < 0) return;
    const uint4 *ks = reinterpret_cast<const uint4 *>(k_new + (int64_t)t * row_elems);
    const uint4 *vs = reinterpret_cast<const uint4 *>(v_new + (int64_t)t * row_elems);
    for (int i = threadIdx.x; i < row_elems / 8; i += blockDim.x) {
        if (!fp8) {
            reinterpret_cast<uint4 *>((uint16_t *)k_cache + slot * row_elems)[i] = ks[i];
            reinterpret_cast<uint4 *>((uint16_t *)v_cache + slot * row_elems)[i] = vs[i];
            continue;
        }
        for (int side = 0; side < 2; side++) {
            const uint4 in = side == 0 ? ks[i] : vs[i];
            const uint32_t words[4] = {in.x, in.y, in.z, in.w};
            uint32_t packed[2] = {0u, 0u};
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const uint16_t bits = (uint16_t)(words[e / 2] >> (16 * (e & 1)));
                packed[e / 4] |= (uint32_t)to_fp8_scaled(from_bits(dtype, bits), kv_scale) << (8 * (e & 3));
            }
            uint8_t *dst = (uint8_t *)(side == 0 ? k_cache : v_cache) + slot * row_elems;
            reinterpret_cast<uint2 *>(dst)[i] = make_uint2(packed[0], packed[1]);
        }
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
