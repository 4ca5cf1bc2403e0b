/* gpu_plugin.c - the plugin ABI on a CUDA device: the example CUDA plugin
 * (build/plugins/attnreplay-example-cuda.so, which writes its own K/V and marks its write) replays
 * every sample trace with two layers and passes against the float64 reference; fp16 and an fp8
 * KV cache pass; the host's device tensors, stream and time marks reach the database ("write"
 * and "attn" per layer); --repeat 40's back-to-back forwards read one forward's time each; a
 * wrong-slot fault applied to the metadata is flagged.  MLA: the DeepSeek
 * sample through the plugin's latent attention, the host's W_UK / W_UV on the device around it,
 * passes in bf16, fp16 and with an fp8 latent cache, and the projection faults are flagged.  Skips
 * with the reason when there is no CUDA device or the build has no CUDA. */
#include "testutil.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../replay/plugin_dev.h"

static bool device_ready(void)
{
    char why[256];
    if (ar_pdev_probe(why, sizeof why) != 0) {
        print_message("skipping: %s\n", why);
        return false;
    }
    return true;
}

/* BUILD/plugins/attnreplay-example-cuda.so beside this binary's BUILD/tests. */
static const char *cuda_plugin(char *buf, size_t len)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    snprintf(buf, len, "%.3900s/plugins/attnreplay-example-cuda.so", exe);
    return buf;
}

static int replay(const char *trace_name, const char *db, const char *log, const char *extra)
{
    char plugin[PATH_MAX];
    cuda_plugin(plugin, sizeof plugin);
    int rc = tu_run(log, "'%s' replay '%s/traces/samples/%s.trace.jsonl.gz' --db '%s' --backend 'plugin:%s' %s",
                    tu_bin(), tu_src_dir(), trace_name, db, plugin, extra);
    if (rc != 0) {
        char *t = tu_slurp(log);
        print_message("%s %s: exit %d\n%s\n", trace_name, extra, rc, t ? t : "");
        free(t);
    }
    return rc;
}

static void test_example_cuda_passes_every_sample(void **state)
{
    (void)state;
    if (!device_ready()) { skip(); return; }
    static const char *const samples[] = {"mixed", "chunked", "prefix", "preempt"};
    char db[PATH_MAX], log[PATH_MAX], device[128];
    tu_tmp("cuda-plugin.db", db, sizeof db);
    tu_tmp("cuda-plugin.log", log, sizeof log);
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++)
        assert_int_equal(replay(samples[i], db, log, "--layers 2 --quiet"), 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs WHERE status='passed' AND "
                                      "backend='plugin:example-cuda'"), 4);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE pass IS NOT 1 OR guard_ok IS NOT 1"), 0);
    /* its own write, marked, and the attention after the mark; both layers */
    assert_true(tu_query_int(db, "SELECT count(*) FROM kernels WHERE name='write' AND layer=1 AND time_us > 0") > 0);
    assert_true(tu_query_int(db, "SELECT count(*) FROM kernels WHERE name='attn' AND time_us > 0") > 0);
    tu_query_text(db, "SELECT device FROM runs LIMIT 1", device, sizeof device);
    assert_true(strstr(device, "cpu") == NULL);
}

static void test_example_cuda_dtypes(void **state)
{
    (void)state;
    if (!device_ready()) { skip(); return; }
    char db[PATH_MAX], log[PATH_MAX];
    tu_tmp("cuda-dtypes.db", db, sizeof db);
    tu_tmp("cuda-dtypes.log", log, sizeof log);
    assert_int_equal(replay("mixed", db, log, "--dtype fp16 --quiet"), 0);
    assert_int_equal(replay("mixed", db, log, "--dtype fp32 --quiet"), 0);
    assert_int_equal(replay("chunked", db, log, "--kv-dtype fp8_e4m3 --kv-scale 0.05 --quiet"), 0);
    assert_int_equal(replay("mixed", db, log, "--repeat 3 --steps 3:9 --quiet"), 0);
}

/* --repeat 40 runs the forwards back to back on 640 events (the pool starts at 16) and waits
 * once: each step's "attn" still reads one forward's time, so its sum stays within a factor of 3
 * of a --repeat 1 run's (an event of the wrong repeat would read up to 40 times the forward), and
 * "write" reads no more than 3 times it (less is expected: one forward alone has the plugin's
 * launch inside its events).  The first step is left out of both sums: its first launch of each
 * kernel loads the module (2.5 ms on an H100), inside --repeat 1's one reading, outside --repeat
 * 40's median. */
static void test_example_cuda_repeats_back_to_back(void **state)
{
    (void)state;
    if (!device_ready()) { skip(); return; }
    char db1[PATH_MAX], db40[PATH_MAX], log[PATH_MAX];
    tu_tmp("cuda-rep1.db", db1, sizeof db1);
    tu_tmp("cuda-rep40.db", db40, sizeof db40);
    tu_tmp("cuda-rep.log", log, sizeof log);
    assert_int_equal(replay("mixed", db1, log, "--repeat 1 --steps 3:9 --layers 2 --quiet"), 0);
    assert_int_equal(replay("mixed", db40, log, "--repeat 40 --steps 3:9 --layers 2 --quiet"), 0);
    assert_int_equal(tu_query_int(db40, "SELECT count(*) FROM steps WHERE pass IS NOT 1 OR guard_ok IS NOT 1"), 0);
    static const char *const sums[] = {
        "SELECT CAST(sum(time_us) * 1000 AS INTEGER) FROM kernels WHERE name='attn' AND step > (SELECT min(step) FROM kernels)",
        "SELECT CAST(sum(time_us) * 1000 AS INTEGER) FROM kernels WHERE name='write' AND step > (SELECT min(step) FROM kernels)"};
    for (int i = 0; i < 2; i++) {
        const int64_t one = tu_query_int(db1, sums[i]), forty = tu_query_int(db40, sums[i]);
        print_message("%s after the first step: --repeat 1 %.1f us, --repeat 40 %.1f us\n", i ? "write" : "attn",
                      one / 1e3, forty / 1e3);
        assert_true(one > 0 && forty > 0);
        assert_true(forty < 3 * one);
        if (i == 0) assert_true(one < 3 * forty);
    }
    assert_int_equal(tu_query_int(db1, "SELECT count(*) FROM kernels"), tu_query_int(db40, "SELECT count(*) FROM kernels"));
}

static void test_example_cuda_fault_flagged(void **state)
{
    (void)state;
    if (!device_ready()) { skip(); return; }
    char db[PATH_MAX], log[PATH_MAX];
    tu_tmp("cuda-fault.db", db, sizeof db);
    tu_tmp("cuda-fault.log", log, sizeof log);
    assert_int_equal(replay("mixed", db, log, "--inject wrong-slot --quiet"), 1);
    assert_int_equal(replay("mixed", db, log, "--inject causal-off-by-one --quiet"), 2);
}

static void test_example_cuda_runs_mla(void **state)
{
    (void)state;
    if (!device_ready()) { skip(); return; }
    char db[PATH_MAX], log[PATH_MAX];
    tu_tmp("cuda-mla.db", db, sizeof db);
    tu_tmp("cuda-mla.log", log, sizeof log);
    /* the whole sample, both layers: prefills, the context fills, decodes */
    assert_int_equal(replay("deepseek-v3-tp16", db, log, "--layers 2 --quiet"), 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run = 1"), 36);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run = 1 AND (pass IS NOT 1 OR "
                                      "rows_checked <= 0 OR guard_ok IS NOT 1)"), 0);
    assert_true(tu_query_int(db, "SELECT count(*) FROM kernels WHERE run = 1 AND name = 'attn' AND layer = 1 "
                                 "AND time_us > 0") > 0);
    assert_int_equal(replay("deepseek-v3-tp16", db, log, "--dtype fp16 --steps 5:12 --quiet"), 0);
    assert_int_equal(replay("deepseek-v3-tp16", db, log, "--kv-dtype fp8_e4m3 --kv-scale 2 --steps 5:12 --quiet"), 0);
    /* the host's projection faults, and the metadata's */
    assert_int_equal(replay("deepseek-v3-tp16", db, log, "--inject wrong-kv-head --steps 6:8 --quiet"), 1);
    assert_int_equal(replay("deepseek-v3-tp16", db, log, "--inject mla-no-wuv --steps 6:8 --quiet"), 1);
    assert_int_equal(replay("deepseek-v3-tp16", db, log, "--inject wrong-slot --steps 6:8 --quiet"), 1);
}

int main(void)
{
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_cuda_passes_every_sample),
        cmocka_unit_test(test_example_cuda_dtypes),
        cmocka_unit_test(test_example_cuda_repeats_back_to_back),
        cmocka_unit_test(test_example_cuda_fault_flagged),
        cmocka_unit_test(test_example_cuda_runs_mla),
    };
    return tu_run_gpu_tests("gpu_plugin", tests, sizeof tests / sizeof tests[0]);
}
