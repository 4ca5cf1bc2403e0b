/* test_plugin.c - the plugin ABI (replay/attnreplay_plugin.h) end to end: the example CPU plugin
 * replays every sample trace and passes, with cascade and with more layers, repeats and dtypes;
 * a plugin without the cascade flag is never asked for cascade; the host's cache write and the
 * metadata faults reach a plugin (the verifier flags them); and each broken plugin (ABI
 * mismatch, missing symbol, init refusing, unknown flags, check refusing, open refusing, forward
 * failing) gives its clear message and exit code.  Plugins come from the build directory
 * (build/plugins, build/tests/plugins: the Makefile builds them before this test). */
#include "testutil.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../replay/plugin.h"
#include "../replay/registry.h"

static char build_dir[PATH_MAX];

/* The build directory: this binary is BUILD/tests/test_plugin. */
static const char *build_root(void)
{
    if (build_dir[0]) return build_dir;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return ".";
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';         /* BUILD/tests */
    slash = strrchr(exe, '/');
    if (slash) *slash = '\0';         /* BUILD */
    snprintf(build_dir, sizeof build_dir, "%s", exe);
    return build_dir;
}

static const char *plugin_path(const char *rel, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s", build_root(), rel);
    return buf;
}

static const char *sample(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/traces/samples/%s.trace.jsonl.gz", tu_src_dir(), name);
    return buf;
}

static void show_log(const char *log)
{
    char *t = tu_slurp(log);
    print_message("%s\n", t ? t : "(no log)");
    free(t);
}

/* Runs a replay through a plugin; returns the exit code, the output in log. */
static int replay_with(const char *plugin_rel, const char *trace_name, const char *db, const char *log,
                       const char *extra)
{
    char plugin[PATH_MAX], trace[PATH_MAX];
    plugin_path(plugin_rel, plugin, sizeof plugin);
    sample(trace_name, trace, sizeof trace);
    return tu_run(log, "'%s' replay '%s' --db '%s' --backend 'plugin:%s' %s", tu_bin(), trace, db, plugin,
                  extra ? extra : "");
}

static bool log_has(const char *log, const char *needle)
{
    char *t = tu_slurp(log);
    bool found = t && strstr(t, needle);
    if (!found) print_message("expected '%s' in:\n%s\n", needle, t ? t : "(no log)");
    free(t);
    return found;
}

static void test_example_cpu_passes_every_sample(void **state)
{
    (void)state;
    static const char *const samples[] = {"mixed", "chunked", "prefix", "preempt"};
    char db[PATH_MAX], log[PATH_MAX], name[128];
    tu_tmp("example.db", db, sizeof db);
    tu_tmp("example.log", log, sizeof log);
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++) {
        int rc = replay_with("plugins/attnreplay-example-cpu.so", samples[i], db, log, "--layers 2 --quiet");
        if (rc != 0) show_log(log);
        assert_int_equal(rc, 0);
    }
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs WHERE status='passed'"), 4);
    tu_query_text(db, "SELECT DISTINCT backend FROM runs", name, sizeof name);
    assert_string_equal(name, "plugin:example-cpu");
    tu_query_text(db, "SELECT DISTINCT device FROM runs", name, sizeof name);
    assert_string_equal(name, "cpu (plugin)");
    assert_true(tu_query_int(db, "SELECT count(*) FROM steps") > 40);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE pass IS NOT 1 OR rows_checked <= 0"), 0);
    /* the host writes K/V for this plugin ("write"), the plugin's part is "attn"; both layers */
    assert_true(tu_query_int(db, "SELECT count(*) FROM kernels WHERE name='write' AND layer=1") > 0);
    assert_true(tu_query_int(db, "SELECT count(*) FROM kernels WHERE name='attn' AND time_us > 0") > 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE guard_ok IS NOT 1"), 0);
}

static void test_example_cpu_dtypes_and_repeat(void **state)
{
    (void)state;
    char db[PATH_MAX], log[PATH_MAX];
    tu_tmp("dtypes.db", db, sizeof db);
    tu_tmp("dtypes.log", log, sizeof log);
    static const char *const extra[] = {"--dtype fp32 --quiet", "--dtype fp16 --quiet", "--repeat 3 --quiet",
                                        "--data outlier --quiet", "--steps 5:12 --quiet"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        int rc = replay_with("plugins/attnreplay-example-cpu.so", "mixed", db, log, extra[i]);
        if (rc != 0) show_log(log);
        assert_int_equal(rc, 0);
    }
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs WHERE status != 'passed'"), 0);
}

static void test_cascade_only_for_plugins_that_have_it(void **state)
{
    (void)state;
    char db[PATH_MAX], log[PATH_MAX];
    tu_tmp("cascade.db", db, sizeof db);
    tu_tmp("cascade.log", log, sizeof log);
    int rc = replay_with("plugins/attnreplay-example-cpu.so", "prefix", db, log, "--cascade on");
    if (rc != 0) show_log(log);
    assert_int_equal(rc, 0);
    assert_true(log_has(log, "steps used it"));
    int64_t cascade_steps = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1 AND cascade=1");
    assert_true(cascade_steps > 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1 AND pass IS NOT 1"), 0);
    /* the same trace through the same kernel built without ATTNREPLAY_PLUGIN_CASCADE: all flat */
    rc = replay_with("tests/plugins/example-flat.so", "prefix", db, log, "--cascade on --quiet");
    if (rc != 0) show_log(log);
    assert_int_equal(rc, 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=2 AND cascade=1"), 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=2"),
                     tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1"));
}

static void test_faults_reach_the_plugin(void **state)
{
    (void)state;
    char db[PATH_MAX], log[PATH_MAX];
    tu_tmp("faults.db", db, sizeof db);
    tu_tmp("faults.log", log, sizeof log);
    /* metadata faults are the host's: the plugin reads the faulty metadata, the verifier flags it */
    assert_int_equal(replay_with("plugins/attnreplay-example-cpu.so", "mixed", db, log,
                                 "--inject wrong-slot --quiet"), 1);
    assert_int_equal(replay_with("plugins/attnreplay-example-cpu.so", "chunked", db, log,
                                 "--inject stale-block-table --quiet"), 1);
    /* a kernel fault the plugin does not implement: refused with its reason */
    assert_int_equal(replay_with("plugins/attnreplay-example-cpu.so", "mixed", db, log,
                                 "--inject no-rescale --quiet"), 2);
    assert_true(log_has(log, "planted fault 'no-rescale' is not implemented"));
    /* an fp8 cache it does not support: refused with its reason */
    assert_int_equal(replay_with("plugins/attnreplay-example-cpu.so", "mixed", db, log,
                                 "--kv-dtype fp8_e4m3 --quiet"), 2);
    assert_true(log_has(log, "no fp8 cache"));
}

typedef struct broken_case {
    const char *rel;
    int exit_code;
    const char *message;
} broken_case;

static void test_broken_plugins_fail_clearly(void **state)
{
    (void)state;
    static const broken_case cases[] = {
        {"tests/plugins/broken-abi.so", 2, "plugin ABI version 99, but this attnreplay speaks version 1"},
        {"tests/plugins/broken-nosym.so", 2, "does not export attnreplay_plugin_init"},
        {"tests/plugins/broken-initnull.so", 2, "refused to initialise: broken-initnull needs a GPU driver"},
        {"tests/plugins/broken-badflags.so", 2, "unknown capability flags 0x80"},
        {"tests/plugins/broken-refuse.so", 2, "cannot run this trace: the plugin refuses this config: "
                                              "broken-refuse does not run any config"},
        {"tests/plugins/broken-openfail.so", 2, "refused to open this config: broken-openfail cannot allocate"},
        {"tests/plugins/broken-forward.so", 3, "forward failed at step 1, layer 0: broken-forward: kernel launch"},
        {"tests/plugins/no-such-plugin.so", 2, "cannot load plugin"},
    };
    char db[PATH_MAX], log[PATH_MAX];
    tu_tmp("broken.db", db, sizeof db);
    tu_tmp("broken.log", log, sizeof log);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = replay_with(cases[i].rel, "mixed", db, log, "--quiet");
        if (rc != cases[i].exit_code) {
            print_message("%s: exit %d, want %d\n", cases[i].rel, rc, cases[i].exit_code);
            show_log(log);
        }
        assert_int_equal(rc, cases[i].exit_code);
        assert_true(log_has(log, cases[i].message));
    }
    /* the runtime failure leaves a consistent database: the run is marked 'error', step 0 kept */
    char status[64];
    tu_query_text(db, "SELECT status FROM runs ORDER BY id DESC LIMIT 1", status, sizeof status);
    assert_string_equal(status, "error");
    char trace[PATH_MAX];
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend plugin: --quiet", tu_bin(),
                            sample("mixed", trace, sizeof trace), db), 2);
    assert_true(log_has(log, "needs the path of a plugin"));
}

/* The loader in-process: registration, lookup by name, the same path twice, ABI layout. */
static void test_loader_in_process(void **state)
{
    (void)state;
    char path[PATH_MAX], err[1024];
    plugin_path("plugins/attnreplay-example-cpu.so", path, sizeof path);
    const ar_backend *b = ar_plugin_load(path, err, sizeof err);
    if (!b) print_message("%s\n", err);
    assert_non_null(b);
    assert_string_equal(b->name, "plugin:example-cpu");
    assert_false(b->needs_gpu);
    assert_ptr_equal(ar_plugin_load(path, err, sizeof err), b);
    assert_ptr_equal(ar_backend_find("plugin:example-cpu"), b);
    assert_true(ar_backend_runs_cascade(b));
    plugin_path("tests/plugins/example-flat.so", path, sizeof path);
    const ar_backend *flat = ar_plugin_load(path, err, sizeof err);
    assert_non_null(flat);
    assert_false(ar_backend_runs_cascade(flat));
    assert_true(ar_backend_runs_cascade(ar_backend_find("cpu")));
    /* "auto" never picks a plugin */
    ar_run_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.model.attention = AR_ATTN_MHA;
    cfg.model.num_q_heads = 8;
    cfg.model.num_kv_heads = 2;
    cfg.model.head_size = 64;
    cfg.block_size = 16;
    cfg.num_blocks = 64;
    cfg.num_layers = 1;
    cfg.dtype = cfg.kv_dtype = AR_BF16;
    cfg.kv_scale = 1;
    ar_selection sel;
    const ar_backend *chosen = ar_backend_select(&cfg, "auto", &sel);
    assert_non_null(chosen);
    assert_true(strncmp(chosen->name, "plugin:", 7) != 0);
    assert_ptr_equal(ar_backend_select(&cfg, "plugin:example-cpu", &sel), b);
    assert_int_equal(sel.count, 1);
    /* an MLA model is outside ABI v1, whatever the plugin says */
    cfg.model.attention = AR_ATTN_MLA;
    assert_null(ar_backend_select(&cfg, "plugin:example-cpu", &sel));
    assert_non_null(sel.failed);
    assert_non_null(strstr(sel.failed->why, "covers MHA/GQA/MQA"));
    /* layouts the Python binding mirrors */
    assert_int_equal(ar_plugin_abi_version(), ATTNREPLAY_PLUGIN_ABI_VERSION);
    assert_int_equal(ar_plugin_abi_sizeof(0), (long)sizeof(DLTensor));
    assert_int_equal(ar_plugin_abi_offsetof(4, "out"), (long)offsetof(attnreplay_forward_args, out));
    assert_int_equal(ar_plugin_abi_offsetof(4, "no_such_field"), -1);
    assert_int_equal(ar_plugin_abi_sizeof(9), -1);
}

/* The DLPack wrappers Python's __dlpack__ hands out copy shape and strides and own nothing else. */
static void test_dlpack_wrap(void **state)
{
    (void)state;
    float data[6] = {1, 2, 3, 4, 5, 6};
    int64_t shape[2] = {2, 3};
    DLTensor t = {data, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, NULL, 0};
    struct legacy { DLTensor dl_tensor; void *ctx; void (*deleter)(void *); } *m = ar_dlpack_wrap(&t, 0);
    assert_non_null(m);
    shape[0] = 99;
    assert_int_equal(m->dl_tensor.shape[0], 2);
    assert_int_equal(m->dl_tensor.strides[0], 3);
    assert_int_equal(m->dl_tensor.strides[1], 1);
    assert_ptr_equal(m->dl_tensor.data, data);
    m->deleter(m);
    struct versioned { uint32_t major, minor; void *ctx; void (*deleter)(void *); uint64_t flags;
                       DLTensor dl_tensor; } *v = ar_dlpack_wrap(&t, 1);
    assert_non_null(v);
    assert_int_equal(v->major, 1);
    assert_int_equal(v->dl_tensor.ndim, 2);
    assert_int_equal(v->dl_tensor.shape[1], 3);
    v->deleter(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_example_cpu_passes_every_sample),
        cmocka_unit_test(test_example_cpu_dtypes_and_repeat),
        cmocka_unit_test(test_cascade_only_for_plugins_that_have_it),
        cmocka_unit_test(test_faults_reach_the_plugin),
        cmocka_unit_test(test_broken_plugins_fail_clearly),
        cmocka_unit_test(test_loader_in_process),
        cmocka_unit_test(test_dlpack_wrap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
