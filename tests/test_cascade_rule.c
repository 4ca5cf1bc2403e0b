/* test_cascade_rule.c - vLLM's cascade decision (cascade.c): the common prefix length (cap at
 * the smallest context, rounding down to a block) and use_cascade_attention's early exits and
 * FlashDecoding cost model, including the worked example of semantics section 5.4. */
#include "testutil.h"

#include <stdbool.h>

#include "../reference/cascade.h"

static void test_common_prefix_len(void **state)
{
    (void)state;
    const int contexts[3] = {1000, 700, 2000};
    /* 40 blocks x 16 = 640 <= min context 700: kept */
    assert_int_equal(ar_common_prefix_len(40, 16, contexts, 3), 640);
    /* 50 x 16 = 800 > 700: capped at 700, rounded down to 688 */
    assert_int_equal(ar_common_prefix_len(50, 16, contexts, 3), 688);
    /* no common blocks, or nothing scheduled */
    assert_int_equal(ar_common_prefix_len(0, 16, contexts, 3), 0);
    assert_int_equal(ar_common_prefix_len(50, 16, contexts, 0), 0);
    /* a request with no context (a fresh prefill) makes P 0 */
    const int with_fresh[2] = {4096, 0};
    assert_int_equal(ar_common_prefix_len(100, 16, with_fresh, 2), 0);
    /* capping without +1: context exactly one block keeps one block */
    const int one_block[2] = {16, 64};
    assert_int_equal(ar_common_prefix_len(4, 16, one_block, 2), 16);
    /* context just below a block boundary drops the partial block */
    const int partial[1] = {31};
    assert_int_equal(ar_common_prefix_len(4, 16, partial, 1), 16);
    /* bad block size */
    assert_int_equal(ar_common_prefix_len(4, 0, partial, 1), 0);
}

static void fill(int *a, int n, int value)
{
    for (int i = 0; i < n; i++) a[i] = value;
}

static void test_use_cascade(void **state)
{
    (void)state;
    int q[256];
    /* worked example: 64 decodes, 32/8 heads, P=1024, 132 SMs: cascade 8 < FD 32 */
    fill(q, 64, 1);
    assert_true(ar_use_cascade(1024, q, 64, 32, 8, false, 132));
    /* prefix too short */
    assert_false(ar_use_cascade(255, q, 64, 32, 8, false, 132));
    assert_true(ar_use_cascade(256, q, 64, 32, 8, false, 132));
    /* fewer than 8 requests (a chunked prefill in the batch, so the cost model is not asked) */
    q[0] = 5;
    assert_false(ar_use_cascade(1024, q, 7, 32, 8, false, 132));
    assert_true(ar_use_cascade(1024, q, 8, 32, 8, false, 132));
    q[0] = 1;
    /* 8 decodes, same heads: cascade = ceil(32/132)*8 = 8, FD = ceil(8*8*8/132) = 4 -> FD */
    assert_false(ar_use_cascade(1024, q, 8, 32, 8, false, 132));
    /* sliding window */
    assert_false(ar_use_cascade(1024, q, 64, 32, 8, true, 132));
    /* a batch that is not all decodes: FlashDecoding would not run -> cascade */
    q[5] = 17;
    assert_true(ar_use_cascade(1024, q, 64, 32, 8, false, 132));
    q[5] = 1;
    /* MHA (one query head per KV head): no FlashDecoding -> cascade */
    assert_true(ar_use_cascade(1024, q, 64, 8, 8, false, 132));
    /* few decodes with large GQA on many SMs: 8 reqs, 32/8 heads, P=256:
     * cascade = ceil(32*1/132)*2 = 2, FD = ceil(8*8*1*2/132) = 1 -> no cascade */
    assert_false(ar_use_cascade(256, q, 8, 32, 8, false, 132));
    /* many decodes: 128 reqs, 32/8 heads, P=256, 132 SMs: cascade = ceil(32/132)*2 = 2,
     * FD = ceil(128*8*2/132) = 16 -> cascade */
    fill(q, 256, 1);
    assert_true(ar_use_cascade(256, q, 128, 32, 8, false, 132));
    /* few SMs: 8 reqs, 16/8 heads, P=256, 8 SMs: cascade = ceil(16/8)*2 = 4,
     * FD = ceil(8*8*2/8) = 16 -> cascade */
    assert_true(ar_use_cascade(256, q, 8, 16, 8, false, 8));
    /* MQA: 8 reqs, 64/1 heads, P=256, 64 SMs: cascade = ceil(64/64)*2 = 2,
     * FD = ceil(8*1*2/64) = 1 -> FlashDecoding */
    assert_false(ar_use_cascade(256, q, 8, 64, 1, false, 64));
    /* exact tie: 8 reqs, 16/2 heads, P=256, 16 SMs: cascade = ceil(16/16)*2 = 2,
     * FD = ceil(8*2*1*2/16) = 2 -> not strictly cheaper */
    assert_false(ar_use_cascade(256, q, 8, 16, 2, false, 16));
    /* 129 decodes need two q tiles per head: 32 heads, 132 SMs, P=512:
     * cascade = ceil(64/132)*4 = 4, FD = ceil(129*8*4/132) = 32 */
    assert_true(ar_use_cascade(512, q, 129, 32, 8, false, 132));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_common_prefix_len),
        cmocka_unit_test(test_use_cascade),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
