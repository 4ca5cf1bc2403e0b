/* test_fuzz_regressions.c - replays every input the fuzzers once crashed on (and a few made by
 * hand for the same bugs), kept in tests/fuzz/regressions/{trace,workload,cli}/, through the
 * very harness code libFuzzer ran (tests/fuzz/fuzz_*.c, compiled in here without their
 * LLVMFuzzerTestOneInput).  A harness abort()s when a property fails; under `make asan` the
 * sanitizers also catch the memory errors the inputs once triggered.
 *
 * The cli regressions run last: that harness chdir()s into its scratch directory and empties
 * PATH (no gnuplot) for the rest of the process. */
#define AR_FUZZ_NO_ENTRY 1
#include "fuzz/fuzz_common.c"
#include "fuzz/fuzz_trace.c"
#include "fuzz/fuzz_workload.c"
#include "fuzz/fuzz_cli.c"

#include <dirent.h>

#include "testutil.h"

/* Runs every file in tests/fuzz/regressions/<name> through one_input; returns how many. */
static int replay_dir(const char *name, int (*one_input)(const uint8_t *, size_t))
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.3000s/tests/fuzz/regressions/%s", tu_src_dir(), name);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int count = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (ent->d_name[0] == '.') continue;
        char path[PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        uint8_t *buf = malloc(1 << 20);
        assert_non_null(buf);
        size_t n = fread(buf, 1, 1 << 20, f);
        fclose(f);
        fprintf(stderr, "  %s/%s (%zu bytes)\n", name, ent->d_name, n);
        assert_int_equal(one_input(buf, n), 0);
        free(buf);
        count++;
    }
    closedir(d);
    return count;
}

static void test_trace_regressions(void **state)
{
    (void)state;
    replay_dir("trace", ar_fuzz_trace_one);
}

static void test_workload_regressions(void **state)
{
    (void)state;
    assert_true(replay_dir("workload", ar_fuzz_workload_one) >= 1);
}

/* The harness itself must accept the seed-like inputs: a sample trace read plain and gzip. */
static void test_trace_harness_on_sample(void **state)
{
    (void)state;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%.3000s/traces/samples/prefix.trace.jsonl.gz", tu_src_dir());
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t *buf = malloc(1 << 20);
    size_t n = fread(buf, 1, 1 << 20, f);
    fclose(f);
    assert_true(n > 100);
    assert_int_equal(ar_fuzz_trace_one(buf, n), 0);
    free(buf);
}

static void test_cli_regressions(void **state)
{
    (void)state;
    /* the cli harness resolves the sample traces from AR_SRC; make it absolute before it chdir()s */
    char abs[PATH_MAX];
    if (realpath(tu_src_dir(), abs)) setenv("AR_SRC", abs, 1);
    assert_true(replay_dir("cli", ar_fuzz_cli_one) >= 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trace_harness_on_sample),
        cmocka_unit_test(test_trace_regressions),
        cmocka_unit_test(test_workload_regressions),
        cmocka_unit_test(test_cli_regressions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
