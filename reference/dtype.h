/* dtype.h - element types of a run and their exact rounding.
 *
 * Everything here is `static inline` and compiles both as C11 (gcc) and as CUDA C++ (nvcc,
 * marked AR_HOSTDEV), so the CPU and the GPU round bit-identically: the rounding is integer
 * arithmetic on the IEEE bit pattern, round-to-nearest-even, never a library call.
 *
 * Conventions: a value "in dtype D" is held in memory as D's bits (2 bytes for fp16/bf16,
 * 1 for fp8 e4m3, 4 for fp32) or, on the host side of the verifier, as the float that those
 * bits decode to.  fp8 e4m3 is the OCP "FN" variant (no infinities, max 448, one NaN
 * pattern S.1111.111), saturating on overflow like vLLM's scaled_convert. */
#ifndef AR_DTYPE_H
#define AR_DTYPE_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define AR_HOSTDEV __host__ __device__ __forceinline__
#else
#define AR_HOSTDEV static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ar_dtype {
    AR_FP32 = 0,
    AR_FP16 = 1,
    AR_BF16 = 2,
    AR_FP8_E4M3 = 3,
    AR_DTYPE_COUNT
} ar_dtype;

/* "fp32", "fp16", "bf16", "fp8_e4m3". */
const char *ar_dtype_name(ar_dtype t);
/* Accepts the names above plus "float32", "float16", "bfloat16", "fp8", "auto" (-> fallback).
 * Returns 0 on success, -1 for an unknown name. */
int ar_dtype_parse(const char *name, ar_dtype fallback, ar_dtype *out);
/* Bytes per element: 4, 2, 2, 1. */
int ar_dtype_size(ar_dtype t);
/* Unit in the last place of 0.3 in this dtype: FlashAttention's fwd_atol floor
 * (2 x the rounding noise of the dtype near 0.3). */
double ar_dtype_ulp_at_0p3(ar_dtype t);

AR_HOSTDEV uint32_t ar_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
AR_HOSTDEV float ar_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---- bf16: top 16 bits of the float, round to nearest even; NaN stays NaN (quiet). */
AR_HOSTDEV uint16_t ar_f32_to_bf16(float f)
{
    uint32_t u = ar_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
AR_HOSTDEV float ar_bf16_to_f32(uint16_t h) { return ar_bits_f32((uint32_t)h << 16); }

/* ---- fp16 (IEEE binary16), round to nearest even, overflow to inf, subnormals kept. */
AR_HOSTDEV uint16_t ar_f32_to_fp16(float f)
{
    uint32_t u = ar_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);          /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);         /* >= 65520 -> inf */
    if (a < 0x38800000u) {                                           /* below 2^-14: subnormal */
        if (a < 0x33000000u) return (uint16_t)sign;                  /* < 2^-25 rounds to 0 */
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;                                   /* 14..24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a - 0x38000000u;                                    /* rebias 127 -> 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}
AR_HOSTDEV float ar_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return ar_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        if (m == 0) return ar_bits_f32(sign);
        /* subnormal: m * 2^-24, exact in float */
        float v = (float)m * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return ar_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

/* ---- fp8 e4m3 (FN): bias 7, max normal 448 = 0x7e, NaN = 0x7f/0xff, min subnormal 2^-9.
 * Saturates finite overflow to +-448; NaN and inf input become NaN. */
AR_HOSTDEV uint8_t ar_f32_to_fp8e4m3(float f)
{
    uint32_t u = ar_f32_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint8_t)(sign | 0x7fu);
    if (a >= 0x43e80000u) return (uint8_t)(sign | 0x7eu);            /* >= 464: saturate 448 */
    if (a < 0x3c800000u) {                                           /* below 2^-6: subnormal */
        if (a <= 0x3a800000u) return sign;                           /* <= 2^-10 rounds to 0 (tie->even 0) */
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 141u - e;                                   /* 21..24 for 2^-10 < |x| < 2^-6 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint8_t)(sign | q);
    }
    uint32_t r = a - 0x3c000000u;                                    /* rebias 127 -> 7 */
    r += 0x7ffffu + ((r >> 20) & 1u);
    uint32_t q = r >> 20;
    if (q > 0x7eu) q = 0x7eu;                                        /* 448 < |x| < 464 rounds to 448 */
    return (uint8_t)(sign | q);
}
AR_HOSTDEV float ar_fp8e4m3_to_f32(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t e = (b >> 3) & 0xfu, m = b & 0x7u;
    if (e == 0xfu && m == 0x7u) return ar_bits_f32(0x7fc00000u | sign);
    if (e == 0) {
        float v = (float)m * 0.001953125f;                           /* m * 2^-9 */
        return sign ? -v : v;
    }
    return ar_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

/* Round a float to the nearest value representable in t (the float the stored bits decode to). */
AR_HOSTDEV float ar_round_to(ar_dtype t, float f)
{
    switch (t) {
    case AR_FP16: return ar_fp16_to_f32(ar_f32_to_fp16(f));
    case AR_BF16: return ar_bf16_to_f32(ar_f32_to_bf16(f));
    case AR_FP8_E4M3: return ar_fp8e4m3_to_f32(ar_f32_to_fp8e4m3(f));
    default: return f;
    }
}

/* Store f, rounded, as t's bits at element i of an untyped array; load it back as float. */
AR_HOSTDEV void ar_store(ar_dtype t, void *base, int64_t i, float f)
{
    switch (t) {
    case AR_FP16: ((uint16_t *)base)[i] = ar_f32_to_fp16(f); break;
    case AR_BF16: ((uint16_t *)base)[i] = ar_f32_to_bf16(f); break;
    case AR_FP8_E4M3: ((uint8_t *)base)[i] = ar_f32_to_fp8e4m3(f); break;
    default: ((float *)base)[i] = f; break;
    }
}
AR_HOSTDEV float ar_load(ar_dtype t, const void *base, int64_t i)
{
    switch (t) {
    case AR_FP16: return ar_fp16_to_f32(((const uint16_t *)base)[i]);
    case AR_BF16: return ar_bf16_to_f32(((const uint16_t *)base)[i]);
    case AR_FP8_E4M3: return ar_fp8e4m3_to_f32(((const uint8_t *)base)[i]);
    default: return ((const float *)base)[i];
    }
}

#ifdef __cplusplus
}
#endif
#endif
