/* dtype.c - names, sizes and tolerance floors of the element types (the rounding itself is
 * inline in dtype.h so the CPU and the GPU share it). */
#include "dtype.h"

#include <string.h>

const char *ar_dtype_name(ar_dtype t)
{
    switch (t) {
    case AR_FP32: return "fp32";
    case AR_FP16: return "fp16";
    case AR_BF16: return "bf16";
    case AR_FP8_E4M3: return "fp8_e4m3";
    default: return "unknown";
    }
}

int ar_dtype_parse(const char *name, ar_dtype fallback, ar_dtype *out)
{
    static const struct { const char *name; ar_dtype type; } names[] = {
        {"fp32", AR_FP32},     {"float32", AR_FP32}, {"float", AR_FP32},
        {"fp16", AR_FP16},     {"float16", AR_FP16}, {"half", AR_FP16},
        {"bf16", AR_BF16},     {"bfloat16", AR_BF16},
        {"fp8_e4m3", AR_FP8_E4M3}, {"fp8", AR_FP8_E4M3}, {"fp8_e4m3fn", AR_FP8_E4M3},
    };
    if (!name || !out) return -1;
    if (strcmp(name, "auto") == 0) {
        if ((int)fallback < 0 || fallback >= AR_DTYPE_COUNT) return -1;
        *out = fallback;
        return 0;
    }
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].type;
            return 0;
        }
    }
    return -1;
}

int ar_dtype_size(ar_dtype t)
{
    switch (t) {
    case AR_FP32: return 4;
    case AR_FP16: return 2;
    case AR_BF16: return 2;
    case AR_FP8_E4M3: return 1;
    default: return 0;
    }
}

/* 0.3 lies in [2^-2, 2^-1), so its ulp is 2^(-2 - stored mantissa bits).  FlashAttention's
 * fwd_atol is 2 x max|(x + 0.3 - 0.3) - x|, and the rounding error of x + 0.3 is at most half
 * an ulp, so the floor is one ulp. */
double ar_dtype_ulp_at_0p3(ar_dtype t)
{
    switch (t) {
    case AR_FP32: return 0x1p-25;      /* 23 mantissa bits */
    case AR_FP16: return 0x1p-12;      /* 10 */
    case AR_BF16: return 0x1p-9;       /* 7 */
    case AR_FP8_E4M3: return 0x1p-5;   /* 3 */
    default: return 0.0;
    }
}
