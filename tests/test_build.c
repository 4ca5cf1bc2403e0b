/* test_build.c - the first ten minutes of a newcomer: the Makefile (dry runs in a scratch BUILD
 * directory, nothing compiled) uses every core unless told otherwise, builds the demo without
 * CUDA where no GPU could run it, and has `make test` build the GPU binaries; traces/demo.sh
 * simulates a public workload, replays a few verified steps and writes the report, or says it
 * falls back to a shipped sample when the public traces are absent. */
#include "testutil.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Output of `make ARGS` run in the checkout as a fresh process (no jobserver and no NVCC= or
 * HAVE_CUDA= inherited from the make running these tests); malloc'd, NULL when make could not
 * run. */
static char *make_output(const char *args)
{
    char out[1024];
    tu_tmp("make.txt", out, sizeof out);
    tu_run(out, "cd '%s' && env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS -u NVCC -u HAVE_CUDA -u NVCCFLAGS make %s", tu_src_dir(), args);
    return tu_slurp(out);
}

static bool have_nvcc(void)
{
    return tu_run(NULL, "command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]") == 0;
}

static bool have_gpu(void)
{
    return tu_run(NULL, "nvidia-smi -L >/dev/null 2>&1") == 0;
}

static void test_parallel_unless_told(void **state)
{
    (void)state;
    char args[2048], want[32];
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(want, sizeof want, " -j%ld", cores > 0 ? cores : 1);
    snprintf(args, sizeof args, "-pn BUILD='%s/b' no-such-target", tu_tmpdir());
    char *text = make_output(args);
    assert_non_null(text);
    const char *flags = strstr(text, "\nMAKEFLAGS = ");
    if (!flags || !strstr(flags, want) || strchr(flags + 1, '\n') < strstr(flags, want))
        fail_msg("MAKEFLAGS without%s: %.200s", want, flags ? flags : "(none)");
    free(text);
    /* a -j on the command line wins */
    snprintf(args, sizeof args, "-j1 -pn BUILD='%s/b' no-such-target", tu_tmpdir());
    text = make_output(args);
    assert_non_null(text);
    flags = strstr(text, "\nMAKEFLAGS = ");
    assert_non_null(flags);
    const char *eol = strchr(flags + 1, '\n');
    const char *j = strstr(flags, " -j");
    if (!j || j > eol || strncmp(j, " -j1", 4) != 0) fail_msg("-j1 not kept: %.200s", flags);
    free(text);
}

static void test_demo_builds_no_cuda_without_gpu(void **state)
{
    (void)state;
    if (!have_nvcc() || have_gpu()) skip();   /* the case of a machine with nvcc and no GPU */
    char args[2048];
    snprintf(args, sizeof args, "-n demo BUILD='%s/b' BIN='%s/b/attnreplay'", tu_tmpdir(), tu_tmpdir());
    char *text = make_output(args);
    assert_non_null(text);
    if (strstr(text, "nvcc ") || !strstr(text, "cuda_stub.c") || !strstr(text, "traces/demo.sh"))
        fail_msg("make -n demo: %.2000s", text);
    free(text);
}

static void test_make_test_builds_gpu_binaries(void **state)
{
    (void)state;
    if (!have_nvcc()) skip();
    char args[2048];
    snprintf(args, sizeof args, "-n test BUILD='%s/b' BIN='%s/b/attnreplay'", tu_tmpdir(), tu_tmpdir());
    char *text = make_output(args);
    assert_non_null(text);
    /* the CUDA kernels for sm_90a (the carried H200 binaries) or the GPU here, and the GPU
     * test and benchmark binaries linked against them */
    if (!strstr(text, "nvcc ") || !strstr(text, "kernels/mla/cuda_mla.cu") || !strstr(text, "tests/gpu_cuda") ||
        !strstr(text, "tests/bench_cuda") || (!have_gpu() && !strstr(text, "code=sm_90a")))
        fail_msg("make -n test: %.3000s", text);
    free(text);
}

/* traces/demo.sh into dir with the given public-trace directory; returns its exit status and
 * leaves its output in *text. */
static int run_demo(const char *dir, const char *public_dir, char **text)
{
    char log[1024];
    tu_tmp("demo.txt", log, sizeof log);
    int rc = tu_run(log, "cd '%s' && AR_BIN='%s' AR_PUBLIC='%s' traces/demo.sh '%s'", tu_src_dir(),
                    tu_bin(), public_dir, dir);
    *text = tu_slurp(log);
    assert_non_null(*text);
    return rc;
}

static void test_demo_on_a_public_workload(void **state)
{
    (void)state;
    char pub[1024], dir[1024], db[1200], path[1200];
    if (!tu_public_trace("azure-llm-2023/AzureLLMInferenceTrace_conv.csv", pub, sizeof pub)) skip();
    snprintf(pub, sizeof pub, "%s/../shared/traces-public", tu_src_dir());
    tu_tmp("demo_public", dir, sizeof dir);
    char *text;
    int rc = run_demo(dir, pub, &text);
    if (rc != 0 || !strstr(text, "== 1/4 simulate") || !strstr(text, "== 4/4 report") ||
        !strstr(text, "Where to look") || !strstr(text, "llama-3.1-8b: MHA, 32 layers, 32 q heads, 8 kv heads"))
        fail_msg("rc %d: %s", rc, text);
    free(text);
    /* 8 steps of the simulated trace, each verified and passed, with at least one prefill */
    snprintf(db, sizeof db, "%s/demo.db", dir);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE pass = 1"), 8);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs WHERE status = 'passed'"), 1);
    assert_true(tu_query_int(db, "SELECT count(*) FROM steps WHERE num_prefill_reqs > 0") >= 1);
    snprintf(path, sizeof path, "%s/report/index.html", dir);
    assert_int_equal(access(path, R_OK), 0);
}

static void test_demo_falls_back_to_a_sample(void **state)
{
    (void)state;
    char dir[1024], db[1200];
    tu_tmp("demo_sample", dir, sizeof dir);
    char *text;
    int rc = run_demo(dir, "/nonexistent/traces-public", &text);
    if (rc != 0 || !strstr(text, "is not there") || !strstr(text, "traces/samples/mixed.trace.jsonl.gz"))
        fail_msg("rc %d: %s", rc, text);
    free(text);
    snprintf(db, sizeof db, "%s/demo.db", dir);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE pass = 0"), 0);
    assert_true(tu_query_int(db, "SELECT count(*) FROM steps WHERE pass = 1") >= 8);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parallel_unless_told),
        cmocka_unit_test(test_demo_builds_no_cuda_without_gpu),
        cmocka_unit_test(test_make_test_builds_gpu_binaries),
        cmocka_unit_test(test_demo_on_a_public_workload),
        cmocka_unit_test(test_demo_falls_back_to_a_sample),
    };
    return cmocka_run_group_tests_name("build", tests, NULL, NULL);
}
