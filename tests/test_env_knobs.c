/* test_env_knobs.c - the GPU backends' environment switches without a GPU: the "cuda" backend's
 * (kernels/paged/cuda_knobs.c) and the cuda-mla backend's decode switches (kernels/mla/
 * mla_knobs.c), both through kernels/common/env_knobs.c.  Unset and empty are the defaults, each
 * switch's words and each knob's range ends set what they name, and a misspelt word, a number
 * out of range or trailing text is refused with exit 2 and a message naming the backend, the
 * variable and its value. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/mla/mla_knobs.h"
#include "../kernels/paged/attn_plan.h"
#include "../kernels/paged/cuda_knobs.h"

static const char *const all_knobs[] = {
    "AR_CUDA_WGMMA", "AR_CUDA_WG_PERSIST", "AR_CUDA_WG_SECTION_MB", "AR_CUDA_DECODE_TMA", "AR_CUDA_DECODE_TMA_MANY",
    "AR_CUDA_DECODE_TMA_SPLITS", "AR_CUDA_DECODE_TMA_PIECES", "AR_CUDA_DECODE_TMA_STAGES", "AR_CUDA_DECODE_SPLITS", "AR_CUDA_SPLIT_PATH_RATIO",
    "AR_CUDA_SPLIT_PATH_LARGE", "AR_CUDA_SPLIT_LIVE_ROWS", "AR_CUDA_CASCADE_FOLD", "AR_CUDA_CASCADE_MERGE", "AR_CUDA_COMBINE_TEAM",
    "AR_MLA_KERNEL", "AR_MLA_TMA", "AR_MLA_SPLITS",
};

static int clear_knobs(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof all_knobs / sizeof all_knobs[0]; i++) unsetenv(all_knobs[i]);
    return 0;
}

/* Reads the knobs with NAME=VALUE set alone; the return code, and k and err filled. */
static int read_with(const char *name, const char *value, ar_cuda_knobs *k, char *err, size_t err_len)
{
    clear_knobs(NULL);
    if (name) setenv(name, value, 1);
    err[0] = '\0';
    const int rc = ar_cuda_knobs_read(k, 12, err, err_len);
    clear_knobs(NULL);
    return rc;
}

static void test_defaults(void **state)
{
    (void)state;
    ar_cuda_knobs k;
    char err[256];
    assert_int_equal(read_with(NULL, NULL, &k, err, sizeof err), 0);
    assert_false(k.wgmma_off || k.wg_persist_off || k.decode_tma_off || k.decode_tma_rule || k.decode_tma_split ||
                 k.decode_tma_uneven || k.split_live_rows || k.cascade_fold_off || k.cascade_merge_separate ||
                 k.decode_tma_many_off);
    assert_int_equal(k.wg_section_mb, -1);
    assert_int_equal(k.decode_tma_splits, 0);
    assert_int_equal(k.decode_tma_stages, 0);
    assert_int_equal(k.decode_splits, 0);
    assert_int_equal(k.split_path_ratio, 0);
    assert_int_equal(k.split_path_large, 0);
    assert_int_equal(k.combine_team, AR_COMBINE_TEAM_RULE);
    /* empty is unset, for every knob */
    for (size_t i = 0; i < sizeof all_knobs / sizeof all_knobs[0]; i++) {
        assert_int_equal(read_with(all_knobs[i], "", &k, err, sizeof err), 0);
        assert_int_equal(k.wg_section_mb, -1);
        assert_int_equal(k.split_path_ratio, 0);
    }
}

static void test_words(void **state)
{
    (void)state;
    ar_cuda_knobs k;
    char err[256];
    assert_int_equal(read_with("AR_CUDA_WGMMA", "0", &k, err, sizeof err), 0);
    assert_true(k.wgmma_off);
    assert_int_equal(read_with("AR_CUDA_WGMMA", "1", &k, err, sizeof err), 0);
    assert_false(k.wgmma_off);
    assert_int_equal(read_with("AR_CUDA_WG_PERSIST", "0", &k, err, sizeof err), 0);
    assert_true(k.wg_persist_off);
    assert_int_equal(read_with("AR_CUDA_CASCADE_FOLD", "0", &k, err, sizeof err), 0);
    assert_true(k.cascade_fold_off);
    assert_int_equal(read_with("AR_CUDA_SPLIT_LIVE_ROWS", "1", &k, err, sizeof err), 0);
    assert_true(k.split_live_rows);
    assert_int_equal(read_with("AR_CUDA_SPLIT_LIVE_ROWS", "0", &k, err, sizeof err), 0);
    assert_false(k.split_live_rows);
    assert_int_equal(read_with("AR_CUDA_CASCADE_MERGE", "separate", &k, err, sizeof err), 0);
    assert_true(k.cascade_merge_separate);
    assert_int_equal(read_with("AR_CUDA_CASCADE_MERGE", "fused", &k, err, sizeof err), 0);
    assert_false(k.cascade_merge_separate);
    assert_int_equal(read_with("AR_CUDA_DECODE_TMA", "0", &k, err, sizeof err), 0);
    assert_true(k.decode_tma_off);
    assert_int_equal(read_with("AR_CUDA_DECODE_TMA", "1", &k, err, sizeof err), 0);
    assert_false(k.decode_tma_off || k.decode_tma_rule || k.decode_tma_split || k.decode_tma_uneven);
    assert_int_equal(read_with("AR_CUDA_DECODE_TMA", "rule", &k, err, sizeof err), 0);
    assert_true(k.decode_tma_rule);
    assert_int_equal(read_with("AR_CUDA_DECODE_TMA", "split", &k, err, sizeof err), 0);
    assert_true(k.decode_tma_split);
    assert_false(k.decode_tma_uneven);
    assert_int_equal(read_with("AR_CUDA_DECODE_TMA", "uneven", &k, err, sizeof err), 0);
    assert_true(k.decode_tma_uneven);
    assert_false(k.decode_tma_split || k.decode_tma_off);
    assert_int_equal(read_with("AR_CUDA_SPLIT_PATH_RATIO", "off", &k, err, sizeof err), 0);
    assert_int_equal(k.split_path_ratio, -1);
    assert_int_equal(read_with("AR_CUDA_DECODE_TMA_MANY", "0", &k, err, sizeof err), 0);
    assert_true(k.decode_tma_many_off);
    assert_int_equal(read_with("AR_CUDA_DECODE_TMA_MANY", "1", &k, err, sizeof err), 0);
    assert_false(k.decode_tma_many_off);
}

static void test_ranges(void **state)
{
    (void)state;
    ar_cuda_knobs k;
    char err[256];
    assert_int_equal(read_with("AR_CUDA_WG_SECTION_MB", "0", &k, err, sizeof err), 0);
    assert_int_equal(k.wg_section_mb, 0);
    assert_int_equal(read_with("AR_CUDA_WG_SECTION_MB", "4096", &k, err, sizeof err), 0);
    assert_int_equal(k.wg_section_mb, 4096);
    assert_int_equal(read_with("AR_CUDA_DECODE_TMA_SPLITS", "1", &k, err, sizeof err), 0);
    assert_int_equal(k.decode_tma_splits, 1);
    assert_int_equal(read_with("AR_CUDA_DECODE_TMA_SPLITS", "64", &k, err, sizeof err), 0);
    assert_int_equal(k.decode_tma_splits, 64);
    assert_int_equal(read_with("AR_CUDA_DECODE_TMA_PIECES", "1024", &k, err, sizeof err), 0);
    assert_int_equal(k.decode_tma_pieces, 1024);
    assert_int_equal(read_with("AR_CUDA_DECODE_TMA_STAGES", "12", &k, err, sizeof err), 0);
    assert_int_equal(k.decode_tma_stages, 12);
    assert_int_equal(read_with("AR_CUDA_DECODE_SPLITS", "3", &k, err, sizeof err), 0);
    assert_int_equal(k.decode_splits, 3);
    assert_int_equal(read_with("AR_CUDA_SPLIT_PATH_RATIO", "1", &k, err, sizeof err), 0);
    assert_int_equal(k.split_path_ratio, 1);
    assert_int_equal(read_with("AR_CUDA_SPLIT_PATH_RATIO", "64", &k, err, sizeof err), 0);
    assert_int_equal(k.split_path_ratio, 64);
    assert_int_equal(read_with("AR_CUDA_SPLIT_PATH_LARGE", "1", &k, err, sizeof err), 0);
    assert_int_equal(k.split_path_large, 1);
    assert_int_equal(read_with("AR_CUDA_SPLIT_PATH_LARGE", "off", &k, err, sizeof err), 0);
    assert_int_equal(k.split_path_large, -1);
    /* rule, asked for or unset, is the setting that ar_attn_combine_team turns into the rule's
     * team (8 for a group of 64 partials), and "1" one thread */
    ar_combine_group g64;
    memset(&g64, 0, sizeof g64);
    g64.count = 64;
    assert_int_equal(read_with("AR_CUDA_COMBINE_TEAM", "rule", &k, err, sizeof err), 0);
    assert_int_equal(k.combine_team, AR_COMBINE_TEAM_RULE);
    assert_int_equal(ar_attn_combine_team(&g64, 1, 256, 270336, k.combine_team), 8);
    assert_int_equal(read_with(NULL, NULL, &k, err, sizeof err), 0);
    assert_int_equal(ar_attn_combine_team(&g64, 1, 256, 270336, k.combine_team), 8);
    assert_int_equal(read_with("AR_CUDA_COMBINE_TEAM", "1", &k, err, sizeof err), 0);
    assert_int_equal(ar_attn_combine_team(&g64, 1, 256, 270336, k.combine_team), 1);
    /* fill: one group of 64 partials, 256 threads a member, widens to a warp (8,192 threads,
     * within a quarter of the 270,336) */
    assert_int_equal(read_with("AR_CUDA_COMBINE_TEAM", "fill", &k, err, sizeof err), 0);
    assert_int_equal(k.combine_team, AR_COMBINE_TEAM_FILL);
    assert_int_equal(ar_attn_combine_team(&g64, 1, 256, 270336, k.combine_team), 32);
    static const int teams[] = {1, 2, 4, 8, 16, 32};
    for (size_t i = 0; i < sizeof teams / sizeof teams[0]; i++) {
        char v[8];
        snprintf(v, sizeof v, "%d", teams[i]);
        assert_int_equal(read_with("AR_CUDA_COMBINE_TEAM", v, &k, err, sizeof err), 0);
        assert_int_equal(k.combine_team, teams[i]);
    }
}

static void test_refused(void **state)
{
    (void)state;
    static const char *const bad[][2] = {
        {"AR_CUDA_DECODE_TMA", "unevn"},        {"AR_CUDA_DECODE_TMA", "Uneven"},
        {"AR_CUDA_DECODE_TMA", "2"},            {"AR_CUDA_WGMMA", "off"},
        {"AR_CUDA_WG_PERSIST", "no"},           {"AR_CUDA_CASCADE_FOLD", "false"},
        {"AR_CUDA_SPLIT_LIVE_ROWS", "yes"},     {"AR_CUDA_CASCADE_MERGE", "seperate"},
        {"AR_CUDA_DECODE_TMA_MANY", "off"},     {"AR_CUDA_DECODE_TMA_PIECES", "1025"},
        {"AR_CUDA_WG_SECTION_MB", "-1"},        {"AR_CUDA_WG_SECTION_MB", "4097"},
        {"AR_CUDA_WG_SECTION_MB", "16MB"},      {"AR_CUDA_DECODE_TMA_SPLITS", "0"},
        {"AR_CUDA_DECODE_TMA_SPLITS", "65"},    {"AR_CUDA_DECODE_TMA_STAGES", "13"},
        {"AR_CUDA_DECODE_SPLITS", "three"},     {"AR_CUDA_DECODE_SPLITS", "3 "},
        {"AR_CUDA_SPLIT_PATH_RATIO", "0"},      {"AR_CUDA_SPLIT_PATH_RATIO", "65"},
        {"AR_CUDA_SPLIT_PATH_RATIO", "Off"},    {"AR_CUDA_SPLIT_PATH_LARGE", "0"},
        {"AR_CUDA_SPLIT_PATH_LARGE", "OFF"},    {"AR_CUDA_SPLIT_PATH_LARGE", "65"},
        {"AR_CUDA_COMBINE_TEAM", "0"},          {"AR_CUDA_COMBINE_TEAM", "3"},
        {"AR_CUDA_COMBINE_TEAM", "64"},         {"AR_CUDA_COMBINE_TEAM", "Rule"},
        {"AR_CUDA_COMBINE_TEAM", "-8"},         {"AR_CUDA_COMBINE_TEAM", "8x"},
    };
    ar_cuda_knobs k;
    char err[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(read_with(bad[i][0], bad[i][1], &k, err, sizeof err), 2);
        char expect[128];
        snprintf(expect, sizeof expect, "cuda backend: %s=%s: not ", bad[i][0], bad[i][1]);
        if (strncmp(err, expect, strlen(expect)) != 0) fail_msg("%s=%s: message '%s'", bad[i][0], bad[i][1], err);
    }
    /* the message says what the variable takes */
    assert_int_equal(read_with("AR_CUDA_DECODE_TMA", "unevn", &k, err, sizeof err), 2);
    assert_non_null(strstr(err, "0, 1, rule, split, uneven"));
    assert_int_equal(read_with("AR_CUDA_DECODE_TMA_STAGES", "0", &k, err, sizeof err), 2);
    assert_non_null(strstr(err, "from 1 to 12"));
    assert_int_equal(read_with("AR_CUDA_SPLIT_PATH_RATIO", "x", &k, err, sizeof err), 2);
    assert_non_null(strstr(err, "not off or an integer from 1 to 64"));
    assert_int_equal(read_with("AR_CUDA_SPLIT_PATH_LARGE", "2x", &k, err, sizeof err), 2);
    assert_non_null(strstr(err, "AR_CUDA_SPLIT_PATH_LARGE=2x: not off or an integer from 1 to 64"));
    assert_int_equal(read_with("AR_CUDA_COMBINE_TEAM", "12", &k, err, sizeof err), 2);
    assert_non_null(strstr(err, "AR_CUDA_COMBINE_TEAM=12: not rule, fill or a power of two from 1 to 32"));
}

/* Reads the cuda-mla switches with NAME=VALUE set alone. */
static int mla_read_with(const char *name, const char *value, ar_mla_knobs *k, char *err, size_t err_len)
{
    clear_knobs(NULL);
    if (name) setenv(name, value, 1);
    err[0] = '\0';
    const int rc = ar_mla_knobs_read(k, err, err_len);
    clear_knobs(NULL);
    return rc;
}

static void test_mla_switches(void **state)
{
    (void)state;
    ar_mla_knobs k;
    char err[256];
    assert_int_equal(mla_read_with(NULL, NULL, &k, err, sizeof err), 0);
    assert_int_equal(k.kernel, AR_MLA_KERNEL_AUTO);
    assert_false(k.no_tensor_map);
    assert_int_equal(k.splits, 0);
    static const struct { const char *word; ar_cuda_mla_kernel kernel; } kernels[] = {
        {"simt", AR_MLA_KERNEL_SIMT},           {"tc-split-qk", AR_MLA_KERNEL_TC_SPLIT_QK},
        {"tc-wgmma", AR_MLA_KERNEL_TC_WGMMA},   {"tc-narrow", AR_MLA_KERNEL_TC_NARROW},
        {"tc-narrow-bulk", AR_MLA_KERNEL_TC_NARROW_BULK}, {"", AR_MLA_KERNEL_AUTO},
    };
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
        assert_int_equal(mla_read_with("AR_MLA_KERNEL", kernels[i].word, &k, err, sizeof err), 0);
        assert_int_equal(k.kernel, kernels[i].kernel);
    }
    assert_int_equal(mla_read_with("AR_MLA_TMA", "0", &k, err, sizeof err), 0);
    assert_true(k.no_tensor_map);
    assert_int_equal(mla_read_with("AR_MLA_TMA", "1", &k, err, sizeof err), 0);
    assert_false(k.no_tensor_map);
    assert_int_equal(mla_read_with("AR_MLA_SPLITS", "1", &k, err, sizeof err), 0);
    assert_int_equal(k.splits, 1);
    assert_int_equal(mla_read_with("AR_MLA_SPLITS", "1024", &k, err, sizeof err), 0);
    assert_int_equal(k.splits, 1024);
    static const char *const bad[][2] = {
        {"AR_MLA_KERNEL", "tc-wgmma16"}, {"AR_MLA_KERNEL", "tc"}, {"AR_MLA_KERNEL", "auto"},
        {"AR_MLA_TMA", "off"},           {"AR_MLA_SPLITS", "0"}, {"AR_MLA_SPLITS", "1025"},
        {"AR_MLA_SPLITS", "1k"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(mla_read_with(bad[i][0], bad[i][1], &k, err, sizeof err), 2);
        char expect[128];
        snprintf(expect, sizeof expect, "cuda-mla backend: %s=%s: not ", bad[i][0], bad[i][1]);
        if (strncmp(err, expect, strlen(expect)) != 0) fail_msg("%s=%s: message '%s'", bad[i][0], bad[i][1], err);
    }
    assert_int_equal(mla_read_with("AR_MLA_KERNEL", "wgmma", &k, err, sizeof err), 2);
    assert_non_null(strstr(err, "simt, tc-split-qk, tc-wgmma, tc-narrow, tc-narrow-bulk"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults, clear_knobs),
        cmocka_unit_test_setup(test_words, clear_knobs),
        cmocka_unit_test_setup(test_ranges, clear_knobs),
        cmocka_unit_test_setup(test_refused, clear_knobs),
        cmocka_unit_test_setup(test_mla_switches, clear_knobs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
