/* test_plugin.c - the plugin ABI (replay/attnreplay_plugin.h) end to end: the example CPU plugin
 * replays every sample trace and passes, with cascade and with more layers, repeats and dtypes,
 * and the DeepSeek sample through its MLA path (the host's projections around its latent
 * attention, their faults caught; MLA offered only to plugins of ABI v2 with the flag);
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
#include "../replay/plugin_dev.h"
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
        {"tests/plugins/broken-abi.so", 2, "plugin ABI version 99, but this attnreplay speaks versions 1 to 2"},
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

/* MLA through the example plugin: the host absorbs W_UK into q, the plugin attends over the latent
 * cache, the host applies W_UV and verifies every row against the float64 expanded form. */
static void test_example_cpu_runs_mla(void **state)
{
    (void)state;
    char db[PATH_MAX], log[PATH_MAX], name[128];
    tu_tmp("mla.db", db, sizeof db);
    tu_tmp("mla.log", log, sizeof log);
    /* both layers (each its own weights); the context before step 7 filled, a mixed step, decodes */
    int rc = replay_with("plugins/attnreplay-example-cpu.so", "deepseek-v3-tp16", db, log, "--steps 7:9 --layers 2");
    if (rc != 0) show_log(log);
    assert_int_equal(rc, 0);
    assert_true(log_has(log, "mla, 8 q / 1 kv heads, head 576"));
    tu_query_text(db, "SELECT status FROM runs WHERE id = 1", name, sizeof name);
    assert_string_equal(name, "passed");
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run = 1"), 3);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run = 1 AND (pass IS NOT 1 OR "
                                      "rows_checked <= 0 OR guard_ok IS NOT 1)"), 0);
    assert_true(tu_query_int(db, "SELECT count(*) FROM kernels WHERE run = 1 AND name = 'attn' AND layer = 1") > 0);
    assert_true(tu_query_int(db, "SELECT count(*) FROM kernels WHERE run = 1 AND name = 'write'") > 0);
    /* fp16, fp32, and --repeat */
    rc = replay_with("plugins/attnreplay-example-cpu.so", "deepseek-v3-tp16", db, log,
                     "--steps 20:23 --layers 1 --dtype fp16 --quiet");
    if (rc != 0) show_log(log);
    assert_int_equal(rc, 0);
    rc = replay_with("plugins/attnreplay-example-cpu.so", "deepseek-v3-tp16", db, log,
                     "--steps 20:22 --layers 1 --dtype fp32 --quiet");
    if (rc != 0) show_log(log);
    assert_int_equal(rc, 0);
    rc = replay_with("plugins/attnreplay-example-cpu.so", "deepseek-v3-tp16", db, log,
                     "--steps 20:22 --layers 1 --repeat 2 --quiet");
    if (rc != 0) show_log(log);
    assert_int_equal(rc, 0);
    /* the host's generation, absorption and W_UV spread over threads: one thread and two give
     * the same output, so the same errors to the bit (runs 5 and 6) */
    for (int threads = 1; threads <= 2; threads++) {
        char extra[96];
        snprintf(extra, sizeof extra, "--steps 7:9 --layers 1 --threads %d --quiet", threads);
        rc = replay_with("plugins/attnreplay-example-cpu.so", "deepseek-v3-tp16", db, log, extra);
        if (rc != 0) show_log(log);
        assert_int_equal(rc, 0);
    }
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps a JOIN steps b ON a.step = b.step "
                                      "WHERE a.run = 5 AND b.run = 6 AND a.max_abs = b.max_abs AND "
                                      "a.mean_abs = b.mean_abs AND a.lse_max_abs = b.lse_max_abs AND a.rows_checked > 0"),
                     3);
}

/* The projection faults are the host's with MLA (W_UK, W_UV), the metadata faults as ever: the
 * verifier flags each in the plugin's run; a kernel fault the example lacks is refused. */
static void test_mla_faults_through_the_plugin(void **state)
{
    (void)state;
    static const char *const caught[] = {"wrong-kv-head", "mla-no-wuv", "wrong-slot"};
    char db[PATH_MAX], log[PATH_MAX], extra[128];
    tu_tmp("mlafault.db", db, sizeof db);
    tu_tmp("mlafault.log", log, sizeof log);
    for (size_t i = 0; i < sizeof caught / sizeof caught[0]; i++) {
        snprintf(extra, sizeof extra, "--steps 6:8 --layers 1 --inject %s --quiet", caught[i]);
        int rc = replay_with("plugins/attnreplay-example-cpu.so", "deepseek-v3-tp16", db, log, extra);
        if (rc != 1) {
            print_message("--inject %s: exit %d, want 1\n", caught[i], rc);
            show_log(log);
        }
        assert_int_equal(rc, 1);
    }
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs WHERE status = 'failed'"), 3);
    assert_int_equal(replay_with("plugins/attnreplay-example-cpu.so", "deepseek-v3-tp16", db, log,
                                 "--steps 0:3 --layers 1 --inject causal-off-by-one --quiet"), 2);
    assert_true(log_has(log, "planted fault 'causal-off-by-one' is not implemented"));
    /* a plugin without the MLA flag is not offered the model */
    assert_int_equal(replay_with("tests/plugins/example-flat.so", "deepseek-v3-tp16", db, log, "--quiet"), 2);
    assert_true(log_has(log, "the plugin does not run MLA (no ATTNREPLAY_PLUGIN_MLA flag)"));
}

/* In-process descriptors for the version and device rules. */
static const attnreplay_host_api *fake_host;
static int fake_check(const attnreplay_config *c) { (void)c; return 0; }
static int fake_open(const attnreplay_config *c, void **st) { (void)c; *st = NULL; return 0; }
static int fake_plan(void *st, const attnreplay_metadata *md) { (void)st; (void)md; return 0; }
static int fake_forward(void *st, const attnreplay_forward_args *a) { (void)st; (void)a; return 1; }
static void fake_close(void *st) { (void)st; }
/* One descriptor per registration (the host keeps the pointer): version, flags, device. */
static attnreplay_plugin fakes[4] = {
    {1, sizeof(attnreplay_plugin), "fake-v1-mla", "fake", "fake", kDLCPU, ATTNREPLAY_PLUGIN_MLA,
     fake_check, fake_open, fake_plan, fake_forward, fake_close},
    {1, sizeof(attnreplay_plugin), "fake-v1", "fake", "fake", kDLCPU, 0,
     fake_check, fake_open, fake_plan, fake_forward, fake_close},
    {ATTNREPLAY_PLUGIN_ABI_VERSION, sizeof(attnreplay_plugin), "fake-cuda-mla", "fake", "fake", kDLCUDA,
     ATTNREPLAY_PLUGIN_MLA, fake_check, fake_open, fake_plan, fake_forward, fake_close},
    {ATTNREPLAY_PLUGIN_ABI_VERSION, sizeof(attnreplay_plugin), "fake-cpu-mla", "fake", "fake", kDLCPU,
     ATTNREPLAY_PLUGIN_MLA, fake_check, fake_open, fake_plan, fake_forward, fake_close},
};
static int next_fake;
static const attnreplay_plugin *fake_init(const attnreplay_host_api *h, int v)
{
    (void)v;
    fake_host = h;
    return &fakes[next_fake];
}

static void test_mla_offered_by_version_flag_and_device(void **state)
{
    (void)state;
    char err[1024];
    ar_run_config cfg;
    memset(&cfg, 0, sizeof cfg);
    tu_mla_model(&cfg.model, "deepseek-v3-test", 16, 1);
    cfg.block_size = 64;
    cfg.num_blocks = 16;
    cfg.num_layers = 1;
    cfg.dtype = cfg.kv_dtype = AR_BF16;
    cfg.kv_scale = 1;
    char why[512];
    /* version 1 with the MLA bit: a flag version 1 does not have */
    next_fake = 0;
    assert_null(ar_plugin_register_init(fake_init, "plugin:", "fake-v1-mla", err, sizeof err));
    assert_non_null(strstr(err, "unknown capability flags 0x4"));
    /* version 1 without it: loads, and is never offered MLA */
    next_fake = 1;
    const ar_backend *v1 = ar_plugin_register_init(fake_init, "plugin:", "fake-v1", err, sizeof err);
    if (!v1) print_message("%s\n", err);
    assert_non_null(v1);
    assert_false(v1->check(&cfg, why, sizeof why));
    assert_non_null(strstr(why, "plugin ABI v1 has none"));
    /* version 2, MLA flag, on the GPU: offered (here, without a device, refused for that alone) */
    next_fake = 2;
    const ar_backend *gpu = ar_plugin_register_init(fake_init, "plugin:", "fake-cuda-mla", err, sizeof err);
    assert_non_null(gpu);
    char probe[256];
    if (ar_pdev_probe(probe, sizeof probe) != 0) {
        assert_false(gpu->check(&cfg, why, sizeof why));
        assert_string_equal(why, probe);
    } else {
        assert_true(gpu->check(&cfg, why, sizeof why));
    }
    /* on the host: offered; MLA dims it cannot carry are refused by the host first */
    next_fake = 3;
    const ar_backend *cpu = ar_plugin_register_init(fake_init, "plugin:", "fake-cpu-mla", err, sizeof err);
    assert_non_null(cpu);
    if (!cpu->check(&cfg, why, sizeof why)) print_message("%s\n", why);
    assert_true(cpu->check(&cfg, why, sizeof why));
    cfg.model.head_size = 500;
    assert_false(cpu->check(&cfg, why, sizeof why));
    assert_non_null(strstr(why, "head_size 500 != kv_lora_rank 512 + qk_rope_head_dim 64"));
    cfg.model.head_size = 576;
    cfg.model.sliding_window = 128;
    assert_false(cpu->check(&cfg, why, sizeof why));
    assert_non_null(strstr(why, "without sliding window"));
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
    /* an MLA model: the flat build has no MLA flag */
    cfg.model.attention = AR_ATTN_MLA;
    assert_null(ar_backend_select(&cfg, "plugin:example-cpu-flat", &sel));
    assert_non_null(sel.failed);
    assert_non_null(strstr(sel.failed->why, "does not run MLA"));
    /* layouts the Python binding mirrors */
    assert_int_equal(ar_plugin_abi_version(), ATTNREPLAY_PLUGIN_ABI_VERSION);
    assert_int_equal(ar_plugin_abi_sizeof(0), (long)sizeof(DLTensor));
    assert_int_equal(ar_plugin_abi_offsetof(4, "out"), (long)offsetof(attnreplay_forward_args, out));
    assert_int_equal(ar_plugin_abi_offsetof(2, "qk_rope_head_dim"), (long)offsetof(attnreplay_config, qk_rope_head_dim));
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
        cmocka_unit_test(test_example_cpu_runs_mla),
        cmocka_unit_test(test_mla_faults_through_the_plugin),
        cmocka_unit_test(test_mla_offered_by_version_flag_and_device),
        cmocka_unit_test(test_broken_plugins_fail_clearly),
        cmocka_unit_test(test_loader_in_process),
        cmocka_unit_test(test_dlpack_wrap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
