/* datagen.h - the deterministic, counter-based data generator (DESIGN section 4).
 *
 * Every input value of a replay (query, key, value, MLA latent, rope key, W_UK, W_UV) is a pure
 * function of integers: no RNG state, so any step can be regenerated alone and the CPU and the
 * GPU produce bit-identical values.  The recipe, exactly:
 *
 *   mix(x)      = SplitMix64's finaliser: x ^= x>>30; x *= 0xbf58476d1ce4e5b9;
 *                 x ^= x>>27; x *= 0x94d049bb133111eb; x ^= x>>31
 *   row(seed, stream, layer, key, pos, head)
 *               = mix(mix(mix(mix(seed + 0x9e3779b97f4a7c15) ^ stream) ^ (layer*2^32 + head))
 *                     ^ key) ^ pos)   [all uint64, wrapping]
 *   bits(row,d) = mix(row + (d + 1) * 0x9e3779b97f4a7c15)
 *   the value   = Irwin-Hall(4): s = sum of the four 16-bit fields of bits, minus 131070
 *                 (an integer in [-131070, 131070], exact in float), then
 *                 v = (float)s * AR_GEN_INV_STD  (one IEEE single multiply, correctly rounded
 *                 on every platform; nvcc must not fuse it, so it is written __fmul_rn there)
 *                 which has mean 0 and standard deviation 1 (range +-3.46).
 *   distribution "outlier" multiplies v by 8 when (mix(bits) >> 60) == 0 (one element in 16):
 *                 keys with such spikes make the softmax nearly one-hot.  (The test re-mixes
 *                 the bits: testing bits >> 60 itself would pick only elements whose fourth
 *                 16-bit field is small, i.e. spikes that are almost always negative.)
 *   distribution "large" multiplies v by 64 (checks range handling near fp16's limits).
 *   then the value is rounded to the run's dtype (dtype.h) and, for W_UK/W_UV, scaled first by
 *   1/sqrt(kv_lora_rank) in float (a second correctly rounded multiply).
 *
 * Keys: K and V of a token use key = the content key of its logical block and pos = its offset
 * inside the block, so blocks that two requests share (prefix-cache hits) hold identical data.
 * Q uses key = ar_req_key(request id) and pos = the token's absolute position.
 * MLA: stream AR_STREAM_LATENT with head 0 gives the 576-wide cache entry (512 latent + 64
 * rope key); Q_NOPE/Q_PE per head; W_UK/W_UV use key = 0, pos = latent row, head = head. */
#ifndef AR_DATAGEN_H
#define AR_DATAGEN_H

#include <stdint.h>
#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

enum ar_stream {
    AR_STREAM_K = 1,
    AR_STREAM_V = 2,
    AR_STREAM_Q = 3,
    AR_STREAM_LATENT = 4,   /* MLA cache entry: [kv_c (kv_lora_rank) | k_pe (rope dim)] */
    AR_STREAM_Q_NOPE = 5,
    AR_STREAM_Q_PE = 6,
    AR_STREAM_W_UK = 7,
    AR_STREAM_W_UV = 8
};

typedef enum ar_datadist {
    AR_DATA_NORMAL = 0,
    AR_DATA_OUTLIER = 1,
    AR_DATA_LARGE = 2
} ar_datadist;

#define AR_GEN_GOLDEN 0x9e3779b97f4a7c15ull
/* 1 / sqrt(4 * (65536^2 - 1) / 12), rounded to float. */
#define AR_GEN_INV_STD 2.6428998e-05f

AR_HOSTDEV uint64_t ar_mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

AR_HOSTDEV uint64_t ar_gen_row(uint64_t seed, uint32_t stream, uint32_t layer, uint64_t key,
                               uint64_t pos, uint32_t head)
{
    uint64_t h = ar_mix64(seed + AR_GEN_GOLDEN);
    h = ar_mix64(h ^ (uint64_t)stream);
    h = ar_mix64(h ^ (((uint64_t)layer << 32) + (uint64_t)head));
    h = ar_mix64(h ^ key);
    h = ar_mix64(h ^ pos);
    return h;
}

/* Unrounded float value of element d of a row. */
AR_HOSTDEV float ar_gen_value(uint64_t row, uint32_t d, ar_datadist dist)
{
    uint64_t b = ar_mix64(row + ((uint64_t)d + 1u) * AR_GEN_GOLDEN);
    int32_t s = (int32_t)(b & 0xffffu) + (int32_t)((b >> 16) & 0xffffu) +
                (int32_t)((b >> 32) & 0xffffu) + (int32_t)((b >> 48) & 0xffffu) - 131070;
#ifdef __CUDA_ARCH__
    float v = __fmul_rn((float)s, AR_GEN_INV_STD);
    if (dist == AR_DATA_OUTLIER && (ar_mix64(b) >> 60) == 0) v = __fmul_rn(v, 8.0f);
    if (dist == AR_DATA_LARGE) v = __fmul_rn(v, 64.0f);
#else
    float v = (float)s * AR_GEN_INV_STD;
    if (dist == AR_DATA_OUTLIER && (ar_mix64(b) >> 60) == 0) v = v * 8.0f;
    if (dist == AR_DATA_LARGE) v = v * 64.0f;
#endif
    return v;
}

/* The value rounded to dtype t (what both the backend and the reference consume). */
AR_HOSTDEV float ar_gen(uint64_t row, uint32_t d, ar_datadist dist, ar_dtype t)
{
    return ar_round_to(t, ar_gen_value(row, d, dist));
}

/* 64-bit FNV-1a of a request id string, then mixed: the Q key of a request. */
uint64_t ar_req_key(const char *req_id);

/* Content-key chaining (like vLLM's prefix-cache hash, but 64-bit and reproducible):
 * key(i) = mix(key(i-1) * 31 + payload_i + GOLDEN), key(-1) = AR_ROOT_KEY.
 * payload for a block of prompt tokens = FNV-1a-64 over the token ids (int32 little endian);
 * payload for a Mooncake hash id h = h; payload for a request-private block (partial prompt
 * block or generated tokens) = ar_req_key(id) ^ (block index * GOLDEN) ^ 1. */
#define AR_ROOT_KEY 0x5eed5eed5eed5eedull
AR_HOSTDEV uint64_t ar_chain_key(uint64_t prev, uint64_t payload)
{
    return ar_mix64(prev * 31u + payload + AR_GEN_GOLDEN);
}
uint64_t ar_tokens_payload(const int32_t *tokens, int n);
uint64_t ar_private_payload(uint64_t req_key, int block_index);

#ifdef __cplusplus
}
#endif
#endif
