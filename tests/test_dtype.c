/* test_dtype.c - the dtype rounding of dtype.h against independently known IEEE / OCP bit
 * patterns, an exhaustive decode->encode round trip of every 16-bit and 8-bit pattern, and a
 * brute-force nearest-value oracle (round to nearest, ties to even) over a sweep of floats;
 * plus the names, sizes and tolerance floors of dtype.c. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../reference/dtype.h"

static float from_bits(uint32_t u) { return ar_bits_f32(u); }

static void test_fp16_known_patterns(void **state)
{
    (void)state;
    assert_int_equal(ar_f32_to_fp16(1.0f), 0x3c00);
    assert_int_equal(ar_f32_to_fp16(-2.0f), 0xc000);
    assert_int_equal(ar_f32_to_fp16(0.0f), 0x0000);
    assert_int_equal(ar_f32_to_fp16(-0.0f), 0x8000);
    assert_int_equal(ar_f32_to_fp16(65504.0f), 0x7bff);                 /* max finite */
    assert_int_equal(ar_f32_to_fp16(65519.99f), 0x7bff);                /* below the tie */
    assert_int_equal(ar_f32_to_fp16(65520.0f), 0x7c00);                 /* tie -> even = inf */
    assert_int_equal(ar_f32_to_fp16(-1e9f), 0xfc00);
    assert_int_equal(ar_f32_to_fp16(INFINITY), 0x7c00);
    assert_int_equal(ar_f32_to_fp16(ldexpf(1.0f, -14)), 0x0400);        /* min normal */
    assert_int_equal(ar_f32_to_fp16(ldexpf(1.0f, -24)), 0x0001);        /* min subnormal */
    assert_int_equal(ar_f32_to_fp16(ldexpf(1023.0f, -24)), 0x03ff);     /* max subnormal */
    assert_int_equal(ar_f32_to_fp16(ldexpf(1.0f, -25)), 0x0000);        /* tie -> even 0 */
    assert_int_equal(ar_f32_to_fp16(ldexpf(1.5f, -25)), 0x0001);
    assert_int_equal(ar_f32_to_fp16(ldexpf(3.0f, -25)), 0x0002);        /* tie 1|2 -> 2 */
    assert_int_equal(ar_f32_to_fp16(ldexpf(5.0f, -25)), 0x0002);        /* tie 2|3 -> 2 */
    assert_int_equal(ar_f32_to_fp16(ldexpf(-1.0f, -26)), 0x8000);
    assert_int_equal(ar_f32_to_fp16(1.0f + ldexpf(1.0f, -11)), 0x3c00); /* tie -> even */
    assert_int_equal(ar_f32_to_fp16(1.0f + ldexpf(3.0f, -11)), 0x3c02); /* tie -> even (up) */
    assert_int_equal(ar_f32_to_fp16(1.0f + ldexpf(1.0f, -11) + ldexpf(1.0f, -20)), 0x3c01);
    assert_int_equal(ar_f32_to_fp16(0.333333343f), 0x3555);
    uint16_t nan_bits = ar_f32_to_fp16(NAN);
    assert_int_equal(nan_bits & 0x7c00, 0x7c00);
    assert_true((nan_bits & 0x03ff) != 0);
    assert_true(isnan(ar_fp16_to_f32(0x7e00)));
    assert_true(isinf(ar_fp16_to_f32(0xfc00)) && ar_fp16_to_f32(0xfc00) < 0);
    assert_true(ar_fp16_to_f32(0x0001) == ldexpf(1.0f, -24));
    assert_true(ar_fp16_to_f32(0xc000) == -2.0f);
}

static void test_bf16_known_patterns(void **state)
{
    (void)state;
    assert_int_equal(ar_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(ar_f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(ar_f32_to_bf16(-0.0f), 0x8000);
    assert_int_equal(ar_f32_to_bf16(1.0f + ldexpf(1.0f, -8)), 0x3f80);  /* tie -> even */
    assert_int_equal(ar_f32_to_bf16(1.0f + ldexpf(3.0f, -8)), 0x3f82);  /* tie -> even (up) */
    assert_int_equal(ar_f32_to_bf16(1.0f + ldexpf(1.0f, -8) + ldexpf(1.0f, -20)), 0x3f81);
    assert_int_equal(ar_f32_to_bf16(from_bits(0x7f7fffffu)), 0x7f80);   /* FLT_MAX -> inf */
    assert_int_equal(ar_f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);   /* below the tie */
    assert_int_equal(ar_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(ar_f32_to_bf16(from_bits(0x00010000u)), 0x0001);   /* min subnormal */
    assert_int_equal(ar_f32_to_bf16(from_bits(0x00008000u)), 0x0000);   /* tie -> even 0 */
    assert_int_equal(ar_f32_to_bf16(from_bits(0x00018000u)), 0x0002);   /* tie 1|2 -> 2 */
    assert_int_equal(ar_f32_to_bf16(3.140625f), 0x4049);
    uint16_t nan_bits = ar_f32_to_bf16(NAN);
    assert_int_equal(nan_bits & 0x7f80, 0x7f80);
    assert_true((nan_bits & 0x007f) != 0);
    /* a signalling NaN whose payload sits only in the low 16 bits must stay NaN */
    assert_true(isnan(ar_bf16_to_f32(ar_f32_to_bf16(from_bits(0x7f800001u)))));
    assert_true(ar_bf16_to_f32(0x3f80) == 1.0f);
}

static void test_fp8_e4m3_known_patterns(void **state)
{
    (void)state;
    assert_int_equal(ar_f32_to_fp8e4m3(1.0f), 0x38);
    assert_int_equal(ar_f32_to_fp8e4m3(-2.0f), 0xc0);
    assert_int_equal(ar_f32_to_fp8e4m3(-0.0f), 0x80);
    assert_int_equal(ar_f32_to_fp8e4m3(448.0f), 0x7e);                  /* max finite */
    assert_int_equal(ar_f32_to_fp8e4m3(-448.0f), 0xfe);
    assert_int_equal(ar_f32_to_fp8e4m3(464.0f), 0x7e);                  /* saturates */
    assert_int_equal(ar_f32_to_fp8e4m3(500.0f), 0x7e);
    assert_int_equal(ar_f32_to_fp8e4m3(-1e30f), 0xfe);
    assert_int_equal(ar_f32_to_fp8e4m3(432.0f), 0x7e);                  /* tie 416|448 -> even */
    assert_int_equal(ar_f32_to_fp8e4m3(424.0f), 0x7d);                  /* 416 + a quarter ulp */
    assert_int_equal(ar_f32_to_fp8e4m3(240.0f), 0x77);
    assert_int_equal(ar_f32_to_fp8e4m3(256.0f), 0x78);
    assert_int_equal(ar_f32_to_fp8e4m3(ldexpf(1.0f, -6)), 0x08);        /* min normal */
    assert_int_equal(ar_f32_to_fp8e4m3(ldexpf(1.0f, -9)), 0x01);        /* min subnormal */
    assert_int_equal(ar_f32_to_fp8e4m3(ldexpf(7.0f, -9)), 0x07);        /* max subnormal */
    assert_int_equal(ar_f32_to_fp8e4m3(ldexpf(1.0f, -10)), 0x00);       /* tie -> even 0 */
    assert_int_equal(ar_f32_to_fp8e4m3(ldexpf(1.5f, -10)), 0x01);
    assert_int_equal(ar_f32_to_fp8e4m3(ldexpf(3.0f, -10)), 0x02);       /* tie 1|2 -> 2 */
    assert_int_equal(ar_f32_to_fp8e4m3(ldexpf(15.0f, -10)), 0x08);      /* tie 7|8 -> 8 */
    assert_int_equal(ar_f32_to_fp8e4m3(1.0f + ldexpf(1.0f, -4)), 0x38); /* tie -> even */
    assert_int_equal(ar_f32_to_fp8e4m3(1.0f + ldexpf(3.0f, -4)), 0x3a); /* tie -> even (up) */
    assert_int_equal(ar_f32_to_fp8e4m3(NAN) & 0x7f, 0x7f);
    assert_int_equal(ar_f32_to_fp8e4m3(INFINITY) & 0x7f, 0x7f);       /* no inf in e4m3fn */
    assert_true(isnan(ar_fp8e4m3_to_f32(0x7f)));
    assert_true(isnan(ar_fp8e4m3_to_f32(0xff)));
    assert_true(ar_fp8e4m3_to_f32(0x7e) == 448.0f);
    assert_true(ar_fp8e4m3_to_f32(0x78) == 256.0f);     /* e=15 is finite in the FN variant */
    assert_true(ar_fp8e4m3_to_f32(0x01) == ldexpf(1.0f, -9));
    assert_true(ar_fp8e4m3_to_f32(0xb8) == -1.0f);
}

static void test_roundtrip_every_pattern(void **state)
{
    (void)state;
    int checked = 0;
    for (uint32_t b = 0; b < 0x10000u; b++) {
        uint16_t h = (uint16_t)b;
        float f16 = ar_fp16_to_f32(h);
        if (!isnan(f16)) {
            assert_int_equal(ar_f32_to_fp16(f16), h);
            checked++;
        } else {
            assert_true(isnan(ar_fp16_to_f32(ar_f32_to_fp16(f16))));
        }
        float bf = ar_bf16_to_f32(h);
        if (!isnan(bf)) {
            assert_int_equal(ar_f32_to_bf16(bf), h);
            checked++;
        } else {
            assert_true(isnan(ar_bf16_to_f32(ar_f32_to_bf16(bf))));
        }
    }
    for (uint32_t b = 0; b < 0x100u; b++) {
        float f8 = ar_fp8e4m3_to_f32((uint8_t)b);
        if (!isnan(f8)) {
            assert_int_equal(ar_f32_to_fp8e4m3(f8), b);
            checked++;
        }
    }
    /* NaN patterns skipped: 2 x 1023 for fp16, 2 x 127 for bf16, 2 for fp8 */
    assert_int_equal(checked, (65536 - 2046) + (65536 - 254) + (256 - 2));
}

/* ---- brute-force oracle: nearest value in the sorted table of a format's finite values ---- */

typedef struct format_table {
    int count;          /* finite non-negative values */
    float *values;      /* [count] ascending */
    uint32_t *bits;     /* [count] their bit patterns */
} format_table;

static format_table make_table(ar_dtype t)
{
    format_table tab = {0, NULL, NULL};
    int patterns = t == AR_FP8_E4M3 ? 128 : 32768;   /* non-negative patterns, ascending */
    tab.values = malloc(sizeof(float) * (size_t)patterns);
    tab.bits = malloc(sizeof(uint32_t) * (size_t)patterns);
    for (int b = 0; b < patterns; b++) {
        float f = t == AR_FP8_E4M3 ? ar_fp8e4m3_to_f32((uint8_t)b)
                  : t == AR_FP16   ? ar_fp16_to_f32((uint16_t)b)
                                   : ar_bf16_to_f32((uint16_t)b);
        if (!isfinite(f)) continue;
        tab.values[tab.count] = f;
        tab.bits[tab.count] = (uint32_t)b;
        tab.count++;
    }
    return tab;
}

/* Expected rounding of a non-negative finite x: nearest table value, ties to the even pattern;
 * beyond the top: fp16/bf16 go to inf at max + half an ulp (ties to even = inf), fp8 saturates. */
static float oracle_round(const format_table *tab, ar_dtype t, float x)
{
    int n = tab->count;
    float top = tab->values[n - 1];
    if (x >= top) {
        if (t == AR_FP8_E4M3) return top;
        float gap = top - tab->values[n - 2];
        return (double)x >= (double)top + 0.5 * gap ? INFINITY : top;
    }
    int lo = 0, hi = n - 1;   /* values[lo] <= x < values[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (tab->values[mid] <= x) lo = mid; else hi = mid;
    }
    double dlo = (double)x - tab->values[lo], dhi = (double)tab->values[hi] - x;
    if (dlo < dhi) return tab->values[lo];
    if (dhi < dlo) return tab->values[hi];
    return (tab->bits[lo] & 1u) == 0 ? tab->values[lo] : tab->values[hi];
}

static void test_rounding_matches_oracle_and_is_monotone(void **state)
{
    (void)state;
    const ar_dtype types[3] = {AR_FP16, AR_BF16, AR_FP8_E4M3};
    for (int ti = 0; ti < 3; ti++) {
        ar_dtype t = types[ti];
        format_table tab = make_table(t);
        float previous = 0;
        /* every 251st positive float up to +inf (bf16 reaches FLT_MAX), plus exact ties */
        for (uint64_t u = 0; u < 0x7f800000u; u += 251) {
            float x = from_bits((uint32_t)u);
            float got = ar_round_to(t, x);
            float want = oracle_round(&tab, t, x);
            if (!(got == want)) fail_msg("%s: x=%a got %a want %a", ar_dtype_name(t), x, got, want);
            assert_true(got >= previous);                         /* monotone */
            previous = got;
            assert_true(ar_round_to(t, -x) == -got);              /* symmetric */
        }
        for (int i = 0; i + 1 < tab.count; i++) {                 /* midpoints: the ties */
            double mid = 0.5 * ((double)tab.values[i] + tab.values[i + 1]);
            float x = (float)mid;
            if ((double)x != mid) continue;                       /* not exact in float */
            float got = ar_round_to(t, x);
            float want = oracle_round(&tab, t, x);
            if (!(got == want)) fail_msg("%s tie: x=%a got %a want %a", ar_dtype_name(t), x, got, want);
        }
        free(tab.values);
        free(tab.bits);
    }
}

static void test_store_load(void **state)
{
    (void)state;
    unsigned char buf[64];
    const ar_dtype types[4] = {AR_FP32, AR_FP16, AR_BF16, AR_FP8_E4M3};
    for (int ti = 0; ti < 4; ti++) {
        memset(buf, 0xa5, sizeof buf);
        ar_store(types[ti], buf, 3, 0.3f);
        assert_true(ar_load(types[ti], buf, 3) == ar_round_to(types[ti], 0.3f));
        /* neighbours untouched */
        int size = ar_dtype_size(types[ti]);
        assert_int_equal(buf[2 * size + size - 1], 0xa5);
        assert_int_equal(buf[4 * size], 0xa5);
    }
}

static void test_names_sizes_ulp(void **state)
{
    (void)state;
    ar_dtype t = AR_FP32;
    assert_string_equal(ar_dtype_name(AR_FP32), "fp32");
    assert_string_equal(ar_dtype_name(AR_FP16), "fp16");
    assert_string_equal(ar_dtype_name(AR_BF16), "bf16");
    assert_string_equal(ar_dtype_name(AR_FP8_E4M3), "fp8_e4m3");
    for (int i = 0; i < AR_DTYPE_COUNT; i++) {
        assert_int_equal(ar_dtype_parse(ar_dtype_name((ar_dtype)i), AR_FP32, &t), 0);
        assert_int_equal(t, i);
    }
    assert_int_equal(ar_dtype_parse("bfloat16", AR_FP32, &t), 0);
    assert_int_equal(t, AR_BF16);
    assert_int_equal(ar_dtype_parse("float16", AR_FP32, &t), 0);
    assert_int_equal(t, AR_FP16);
    assert_int_equal(ar_dtype_parse("float32", AR_FP16, &t), 0);
    assert_int_equal(t, AR_FP32);
    assert_int_equal(ar_dtype_parse("fp8", AR_FP32, &t), 0);
    assert_int_equal(t, AR_FP8_E4M3);
    assert_int_equal(ar_dtype_parse("auto", AR_BF16, &t), 0);
    assert_int_equal(t, AR_BF16);
    t = AR_FP16;
    assert_int_equal(ar_dtype_parse("int8", AR_FP32, &t), -1);
    assert_int_equal(ar_dtype_parse("", AR_FP32, &t), -1);
    assert_int_equal(ar_dtype_parse(NULL, AR_FP32, &t), -1);
    assert_int_equal(t, AR_FP16);   /* untouched on failure */
    assert_int_equal(ar_dtype_size(AR_FP32), 4);
    assert_int_equal(ar_dtype_size(AR_FP16), 2);
    assert_int_equal(ar_dtype_size(AR_BF16), 2);
    assert_int_equal(ar_dtype_size(AR_FP8_E4M3), 1);
    /* the ulp at 0.3 is the gap between 0.3's rounded value and its upper neighbour */
    assert_true(ar_dtype_ulp_at_0p3(AR_FP32) == (double)nextafterf(0.3f, 1.0f) - (double)0.3f);
    assert_true(ar_dtype_ulp_at_0p3(AR_FP16) ==
                (double)ar_fp16_to_f32((uint16_t)(ar_f32_to_fp16(0.3f) + 1)) -
                    ar_fp16_to_f32(ar_f32_to_fp16(0.3f)));
    assert_true(ar_dtype_ulp_at_0p3(AR_BF16) ==
                (double)ar_bf16_to_f32((uint16_t)(ar_f32_to_bf16(0.3f) + 1)) -
                    ar_bf16_to_f32(ar_f32_to_bf16(0.3f)));
    assert_true(ar_dtype_ulp_at_0p3(AR_FP8_E4M3) ==
                (double)ar_fp8e4m3_to_f32((uint8_t)(ar_f32_to_fp8e4m3(0.3f) + 1)) -
                    ar_fp8e4m3_to_f32(ar_f32_to_fp8e4m3(0.3f)));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_known_patterns),
        cmocka_unit_test(test_bf16_known_patterns),
        cmocka_unit_test(test_fp8_e4m3_known_patterns),
        cmocka_unit_test(test_roundtrip_every_pattern),
        cmocka_unit_test(test_rounding_matches_oracle_and_is_monotone),
        cmocka_unit_test(test_store_load),
        cmocka_unit_test(test_names_sizes_ulp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
