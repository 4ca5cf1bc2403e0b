/* test_testutil.c - tests of the shared test helpers that carry logic of their own: the
 * AR_GPU_SHARD split of a GPU test binary's tests (tu_gpu_shard), which tests/gpu_sanitize.sh
 * relies on to spread one slow (binary, tool) pair over several processes without losing a test. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void dummy_test(void **unused) { (void)unused; }

/* Seven named tests, as a GPU binary's array. */
static void make_tests(struct CMUnitTest tests[7], const char *names[7])
{
    for (int i = 0; i < 7; i++) {
        memset(&tests[i], 0, sizeof tests[i]);
        tests[i].name = names[i];
        tests[i].test_func = dummy_test;
    }
}

static void test_shard_unset_keeps_all(void **unused)
{
    (void)unused;
    static const char *names[7] = {"a", "b", "c", "d", "e", "f", "g"};
    struct CMUnitTest tests[7];
    make_tests(tests, names);
    unsetenv("AR_GPU_SHARD");
    assert_int_equal(tu_gpu_shard(tests, 7), 7);
    for (int i = 0; i < 7; i++) assert_string_equal(tests[i].name, names[i]);
    setenv("AR_GPU_SHARD", "3/3", 1);   /* K out of range: ignored */
    assert_int_equal(tu_gpu_shard(tests, 7), 7);
    setenv("AR_GPU_SHARD", "x", 1);
    assert_int_equal(tu_gpu_shard(tests, 7), 7);
    unsetenv("AR_GPU_SHARD");
}

/* Every test lands in exactly one of the N shards, in its original order. */
static void test_shards_partition(void **unused)
{
    (void)unused;
    static const char *names[7] = {"a", "b", "c", "d", "e", "f", "g"};
    for (int parts = 1; parts <= 8; parts++) {
        int seen[7] = {0};
        for (int k = 0; k < parts; k++) {
            struct CMUnitTest tests[7];
            make_tests(tests, names);
            char spec[16];
            snprintf(spec, sizeof spec, "%d/%d", k, parts);
            setenv("AR_GPU_SHARD", spec, 1);
            size_t kept = tu_gpu_shard(tests, 7);
            int prev = -1;
            for (size_t j = 0; j < kept; j++) {
                int idx = tests[j].name[0] - 'a';
                assert_int_equal(idx % parts, k);
                assert_true(idx > prev);
                prev = idx;
                seen[idx]++;
            }
        }
        for (int i = 0; i < 7; i++) assert_int_equal(seen[i], 1);
    }
    unsetenv("AR_GPU_SHARD");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_unset_keeps_all),
        cmocka_unit_test(test_shards_partition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
