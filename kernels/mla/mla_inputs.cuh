/* mla_inputs.cuh - the cuda-mla backend's inputs on the device: q_nope / q_pe, the new tokens'
 * latent entries and the per-layer W_UK / W_UV from the counter-based generator
 * (reference/datagen.h and reference/mla_ref.h compiled by nvcc: bit-identical with the CPU),
 * the latent-cache write (vLLM concat_and_cache_mla: slot -1 skipped; fp8 e4m3 with a
 * per-tensor scale as an option) and the untimed fill of context tokens.  Included by
 * cuda_mla.cu. */
#ifndef AR_MLA_INPUTS_CUH
#define AR_MLA_INPUTS_CUH

#include "mla_common.cuh"

namespace ar_mla {

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

} /* namespace ar_mla */

#endif
