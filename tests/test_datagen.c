/* test_datagen.c - the counter-based data generator (datagen.h, datagen.c): published SplitMix64
 * and FNV-1a test vectors, the documented integer recipe re-implemented here from its text,
 * determinism, sensitivity to every coordinate, the moments of the distributions, and the
 * content-key chaining. */
#include "testutil.h"

#include <math.h>
#include <string.h>

#include "../reference/datagen.h"

/* ---- the recipe of datagen.h, written out again from its comment --------------------------- */

static uint64_t recipe_mix(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t recipe_row(uint64_t seed, uint64_t stream, uint64_t layer, uint64_t key,
                           uint64_t pos, uint64_t head)
{
    uint64_t golden = 0x9e3779b97f4a7c15ull;
    return recipe_mix(recipe_mix(recipe_mix(recipe_mix(recipe_mix(seed + golden) ^ stream) ^
                                            (layer * 4294967296ull + head)) ^ key) ^ pos);
}

static float recipe_value(uint64_t row, uint64_t d)
{
    uint64_t bits = recipe_mix(row + (d + 1) * 0x9e3779b97f4a7c15ull);
    long sum = 0;
    for (int field = 0; field < 4; field++) sum += (long)((bits >> (16 * field)) & 0xffff);
    float inv_std = (float)(1.0 / sqrt(4.0 * (65536.0 * 65536.0 - 1.0) / 12.0));
    return (float)(sum - 131070) * inv_std;
}

static uint64_t fnv1a_bytes(const unsigned char *bytes, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) {
        h ^= bytes[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* ---- tests ----------------------------------------------------------------------------------- */

static void test_published_vectors(void **state)
{
    (void)state;
    /* SplitMix64 seeded with 0: its first two outputs are mix(golden), mix(2 golden). */
    assert_true(ar_mix64(AR_GEN_GOLDEN) == 0xe220a8397b1dcdafull);
    assert_true(ar_mix64(2 * AR_GEN_GOLDEN) == 0x6e789e6aa1b965f4ull);
    assert_true(ar_mix64(0) == 0);
    /* FNV-1a 64: "" -> offset basis, "a" -> 0xaf63dc4c8601ec8c, "foobar" -> 0x85944171f73967e8. */
    assert_true(ar_req_key("") == ar_mix64(0xcbf29ce484222325ull));
    assert_true(ar_req_key("a") == ar_mix64(0xaf63dc4c8601ec8cull));
    assert_true(ar_req_key("foobar") == ar_mix64(0x85944171f73967e8ull));
    /* the recipe's 1/std constant */
    assert_true(AR_GEN_INV_STD == (float)(1.0 / sqrt(4.0 * (65536.0 * 65536.0 - 1.0) / 12.0)));
}

static void test_matches_written_out_recipe(void **state)
{
    (void)state;
    const uint64_t seeds[3] = {0, 42, 0xfedcba9876543210ull};
    for (int si = 0; si < 3; si++) {
        for (uint32_t stream = AR_STREAM_K; stream <= AR_STREAM_W_UV; stream++) {
            uint64_t row = ar_gen_row(seeds[si], stream, 3, 0x1234567890abcdefull, 77, 5);
            assert_true(row == recipe_row(seeds[si], stream, 3, 0x1234567890abcdefull, 77, 5));
            for (uint32_t d = 0; d < 40; d++) {
                float want = recipe_value(row, d);
                assert_true(ar_gen_value(row, d, AR_DATA_NORMAL) == want);
                assert_true(ar_gen_value(row, d, AR_DATA_LARGE) == want * 64.0f);
                float outlier = ar_gen_value(row, d, AR_DATA_OUTLIER);
                assert_true(outlier == want || outlier == want * 8.0f);
                assert_true(ar_gen(row, d, AR_DATA_NORMAL, AR_BF16) == ar_round_to(AR_BF16, want));
                assert_true(ar_gen(row, d, AR_DATA_NORMAL, AR_FP32) == want);
            }
        }
    }
    /* one value computed by hand from the recipe: all-zero bits give the minimum, -131070/std */
    assert_true((float)-131070 * AR_GEN_INV_STD < -3.46f && (float)-131070 * AR_GEN_INV_STD > -3.47f);
}

static void test_deterministic_and_sensitive(void **state)
{
    (void)state;
    const uint64_t base[6] = {7, AR_STREAM_K, 2, 0xabcdef, 17, 3};   /* seed stream layer key pos head */
    uint64_t row = ar_gen_row(base[0], (uint32_t)base[1], (uint32_t)base[2], base[3], base[4],
                              (uint32_t)base[5]);
    assert_true(row == ar_gen_row(7, AR_STREAM_K, 2, 0xabcdef, 17, 3));
    float first[8];
    for (uint32_t d = 0; d < 8; d++) first[d] = ar_gen_value(row, d, AR_DATA_NORMAL);
    for (uint32_t d = 0; d < 8; d++) assert_true(ar_gen_value(row, d, AR_DATA_NORMAL) == first[d]);
    for (int coord = 0; coord < 6; coord++) {
        uint64_t c[6];
        memcpy(c, base, sizeof c);
        c[coord] += 1;
        uint64_t other = ar_gen_row(c[0], (uint32_t)c[1], (uint32_t)c[2], c[3], c[4], (uint32_t)c[5]);
        assert_true(other != row);
        int same = 0;
        for (uint32_t d = 0; d < 8; d++) same += ar_gen_value(other, d, AR_DATA_NORMAL) == first[d];
        assert_true(same < 2);
    }
    /* layer and head do not alias each other, nor swap */
    assert_true(ar_gen_row(1, 1, 1, 0, 0, 0) != ar_gen_row(1, 1, 0, 0, 0, 1));
    assert_true(ar_gen_row(1, 1, 0, 5, 6, 0) != ar_gen_row(1, 1, 0, 6, 5, 0));
    /* different dims differ */
    int same_dims = 0;
    for (uint32_t d = 1; d < 64; d++) same_dims += ar_gen_value(row, d, AR_DATA_NORMAL) == first[0];
    assert_true(same_dims < 2);
}

static void test_moments(void **state)
{
    (void)state;
    const int n = 100000;
    double sum = 0, sum2 = 0, out_sum = 0, out_sum2 = 0, lo = 0, hi = 0;
    int spikes = 0;
    for (int i = 0; i < n; i++) {
        uint64_t row = ar_gen_row(11, AR_STREAM_Q, 0, 99, (uint64_t)(i / 128), 0);
        float v = ar_gen_value(row, (uint32_t)(i % 128), AR_DATA_NORMAL);
        float w = ar_gen_value(row, (uint32_t)(i % 128), AR_DATA_OUTLIER);
        sum += v; sum2 += (double)v * v;
        out_sum += w; out_sum2 += (double)w * w;
        if (v < lo) lo = v;
        if (v > hi) hi = v;
        spikes += w != v;
    }
    double mean = sum / n, std = sqrt(sum2 / n - mean * mean);
    assert_true(fabs(mean) < 0.02);           /* standard error 0.003 */
    assert_true(fabs(std - 1.0) < 0.02);
    assert_true(lo > -3.47 && hi < 3.47);     /* Irwin-Hall(4) support */
    assert_true(lo < -2.5 && hi > 2.5);
    /* outliers: one in 16 (sd of the count 77), scaled by 8, and not one-signed */
    assert_true(spikes > 6250 - 500 && spikes < 6250 + 500);
    double out_mean = out_sum / n;
    double out_std = sqrt(out_sum2 / n - out_mean * out_mean);
    assert_true(fabs(out_mean) < 0.05);       /* standard error 0.007 */
    assert_true(fabs(out_std - sqrt(15.0 / 16 + 64.0 / 16)) < 0.1);
}

static void test_keys_and_payloads(void **state)
{
    (void)state;
    /* ar_req_key is stable (a fixed function of the string) and separates ids */
    assert_true(ar_req_key("req-17") == ar_req_key("req-17"));
    assert_true(ar_req_key("req-17") != ar_req_key("req-71"));
    assert_true(ar_req_key("req-1") != ar_req_key("req-10"));
    char id[32];
    strcpy(id, "chatcmpl-0");
    uint64_t k1 = ar_req_key(id);
    assert_true(k1 == ar_mix64(fnv1a_bytes((const unsigned char *)id, strlen(id))));

    /* tokens payload: FNV-1a over the int32 ids as little-endian bytes */
    const int32_t tokens[3] = {1, 0x01020304, -2};
    const unsigned char bytes[12] = {1, 0, 0, 0, 4, 3, 2, 1, 0xfe, 0xff, 0xff, 0xff};
    assert_true(ar_tokens_payload(tokens, 3) == fnv1a_bytes(bytes, 12));
    assert_true(ar_tokens_payload(tokens, 0) == 14695981039346656037ull);
    assert_true(ar_tokens_payload(tokens, 2) != ar_tokens_payload(tokens, 3));

    /* private payload: req_key ^ (block index * golden) ^ 1 */
    assert_true(ar_private_payload(0x1111, 0) == (0x1111ull ^ 1));
    assert_true(ar_private_payload(0x1111, 3) == (0x1111ull ^ (3 * 0x9e3779b97f4a7c15ull) ^ 1));
    assert_true(ar_private_payload(k1, 1) != ar_private_payload(k1, 2));
    assert_true(ar_private_payload(k1, 1) != ar_private_payload(ar_req_key("x"), 1));

    /* chaining: key(i) = mix(key(i-1) * 31 + payload + golden) */
    uint64_t a0 = ar_chain_key(AR_ROOT_KEY, ar_tokens_payload(tokens, 3));
    assert_true(a0 == recipe_mix(AR_ROOT_KEY * 31 + ar_tokens_payload(tokens, 3) + AR_GEN_GOLDEN));
    uint64_t b0 = ar_chain_key(AR_ROOT_KEY, ar_tokens_payload(tokens, 2));
    assert_true(a0 != b0);                                    /* payload differs */
    uint64_t a1 = ar_chain_key(a0, 777), b1 = ar_chain_key(b0, 777);
    assert_true(a1 != b1);                                    /* same payload, other parent */
    assert_true(a1 == ar_chain_key(a0, 777));                 /* deterministic */
    assert_true(ar_chain_key(a0, 777) != ar_chain_key(a0, 778));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_vectors),
        cmocka_unit_test(test_matches_written_out_recipe),
        cmocka_unit_test(test_deterministic_and_sensitive),
        cmocka_unit_test(test_moments),
        cmocka_unit_test(test_keys_and_payloads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
