/* gpu_coverage.c - kernel-path coverage on the H200: the shape samples of traces/samples/
 * (head sizes 64, 128 and 256; GQA 1, 4 and 8; block sizes 16, 32 and 64; a shared-prefix trace
 * replayed with --cascade on; a DeepSeek-V3 MLA trace) replayed through bin/attnreplay on the
 * "cuda" and "cuda-mla" backends with their default settings, verified against the reference,
 * must together run every default path of the two decision functions (build_plan in
 * kernels/paged/cuda_plan.cuh, ar_mla_choose and the MLA planner in kernels/mla/mla_route.c and mla_plan.c), as
 * the coverage table records them (path names in replay/backend.h).  Both ways: every expected
 * path ran (a trace that stopped reaching one fails), and every path that ran is in the list (a
 * new path, or a default that changed, fails until the list and a trace cover it).
 *
 * The expected list is the H200's (132 SMs, compute capability 9.0 with tensor maps): on another
 * device the decisions differ, and the test skips saying so.  The environment overrides of the
 * defaults (AR_CUDA_WGMMA, AR_CUDA_DECODE_TMA, AR_CUDA_CASCADE_FOLD, AR_CUDA_CASCADE_MERGE,
 * AR_MLA_KERNEL, AR_MLA_PREFILL, AR_MLA_GEMM) are cleared for the replays.  A second test replays with an fp8 KV cache (the MLA
 * backend, and the paged backend once its check takes fp8 KV): every such run must pass and
 * record an fp8 path.  Skips with the reason when there is no device. */
#include "testutil.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/paged/cuda_backend.h"

/* The default paths of the H200's decision functions, each reached by a shape sample (the
 * sample's README entry says which). */
static const char *const expected_paths[] = {
    /* cuda, flat steps: the kernel of the launch, and whether it was split and combined */
    "attn:prefill", "attn:prefill+split",                /* mma.sync prefill: head size 64 */
    "attn:prefill-wg", "attn:prefill-wg+split",          /* wgmma prefill: head sizes 128, 256 */
    "attn:decode", "attn:decode+split",                  /* mma.sync decode */
    "attn:decode-tma+split",                             /* >= 64 decodes, head 128, block 16, one
                                                          * request over twice its even share: cut */
    /* cuda, cascade steps (llama-3.1-8b-cascade, --cascade on) */
    "cascade-prefix:prefill-wg", "cascade-prefix:prefill-wg+split", "cascade-prefix:decode+split",
    "cascade-suffix:prefill-wg", "cascade-suffix:prefill-wg+split", "cascade-suffix:decode",
    "cascade-suffix:decode+split",
    "cascade-suffix:decode-tma", "cascade-prefix-combine:folded", "cascade-merge:fused",
    /* cuda-mla (deepseek-v3-tp16): the decode kernel by rows a request, and the prefill path
     * with its pingpong attention (the Hopper default) */
    "mla-decode:tc-wgmma", "mla-decode:tc-wgmma+split", "mla-decode:tc-wgmma16",
    "mla-decode:tc-wgmma16+split", "mla-prefill:new", "mla-prefill:context", "mla-prefill-attn:pingpong",
};
#define NUM_EXPECTED (sizeof expected_paths / sizeof expected_paths[0])

typedef struct shape_trace {
    const char *name;
    const char *backend;
    const char *extra;
} shape_trace;

static const shape_trace traces[] = {
    {"llama-3.1-8b", "cuda", ""},
    {"llama-3.1-8b-cascade", "cuda", "--cascade on"},
    {"llama-3.1-70b-tp8", "cuda", ""},
    {"gemma-7b", "cuda", ""},
    {"llama-3.2-1b", "cuda", ""},
    {"deepseek-v3-tp16", "cuda-mla", ""},
};
#define NUM_TRACES (sizeof traces / sizeof traces[0])

/* A small Llama-shaped layer (32 query heads, 8 KV heads, head size 128, bf16, block size 16)
 * with the given KV cache dtype, for asking the cuda backend what it takes and decides. */
static void probe_config(ar_run_config *cfg, ar_dtype kv_dtype, double kv_scale)
{
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->model.name, sizeof cfg->model.name, "probe");
    cfg->model.attention = AR_ATTN_MHA;
    cfg->model.num_layers = 1;
    cfg->model.num_q_heads = 32;
    cfg->model.num_kv_heads = 8;
    cfg->model.head_size = 128;
    cfg->model.v_head_dim = 128;
    cfg->model.scale = 0.08838834764831845;
    cfg->block_size = 16;
    cfg->num_blocks = 64;
    cfg->dtype = AR_BF16;
    cfg->kv_dtype = kv_dtype;
    cfg->kv_scale = kv_scale;
    cfg->num_layers = 1;
    cfg->repeat = 1;
}

/* True on an H200-like device (the expected list's): 132 SMs, wgmma and tensor maps. */
static bool h200_ready(void)
{
    ar_run_config cfg;
    probe_config(&cfg, AR_BF16, 1.0);
    char why[256] = "";
    if (!ar_cuda_backend.check(&cfg, why, sizeof why)) {
        print_message("skipping: %s\n", why);
        return false;
    }
    void *state = NULL;
    char err[512] = "";
    if (ar_cuda_backend.open(&cfg, &state, err, sizeof err) != 0) {
        print_message("skipping: the cuda backend does not open: %s\n", err);
        return false;
    }
    ar_cuda_plan_info info;
    ar_cuda_plan_of(state, &info);
    ar_cuda_backend.close(state);
    if (info.num_sms != 132 || !info.has_tma) {
        print_message("skipping: the expected paths are an H200's decisions (132 SMs, compute capability 9.0 with "
                      "tensor maps); this device has %d SMs, tensor maps %s\n", info.num_sms,
                      info.has_tma ? "yes" : "no");
        return false;
    }
    return true;
}

static bool listed(const char *path)
{
    for (size_t i = 0; i < NUM_EXPECTED; i++)
        if (strcmp(expected_paths[i], path) == 0) return true;
    return false;
}

static void test_shape_samples_cover_every_default_path(void **state)
{
    (void)state;
    if (!h200_ready()) {
        skip();
        return;
    }
    char db[512], log[512], trace[1024];
    tu_tmp("coverage.db", db, sizeof db);
    tu_tmp("coverage.log", log, sizeof log);
    for (size_t i = 0; i < NUM_TRACES; i++) {
        snprintf(trace, sizeof trace, "%s/traces/samples/%s.trace.jsonl.gz", tu_src_dir(), traces[i].name);
        int rc = tu_run(log, "env -u AR_CUDA_WGMMA -u AR_CUDA_DECODE_TMA -u AR_CUDA_CASCADE_FOLD "
                             "-u AR_CUDA_CASCADE_MERGE -u AR_MLA_KERNEL -u AR_MLA_PREFILL -u AR_MLA_GEMM '%s' replay '%s' --db '%s' --backend %s %s",
                        tu_bin(), trace, db, traces[i].backend, traces[i].extra);
        char *text = tu_slurp(log);
        const char *paths = text ? strstr(text, "  paths ") : NULL;
        const char *end = paths ? strchr(paths, '\n') : NULL;
        print_message("%s (%s): exit %d; %.*s\n", traces[i].name, traces[i].backend, rc,
                      paths && end ? (int)(end - paths) : 0, paths ? paths : "");
        if (rc != 0) print_message("%s\n", text ? text : "(no output)");
        free(text);
        assert_int_equal(rc, 0);
    }
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs WHERE status = 'passed'"), (int64_t)NUM_TRACES);
    /* every path that ran is listed, and every listed path ran (on a verified step) */
    int failures = 0;
    for (size_t i = 0; i < NUM_EXPECTED; i++) {
        char sql[256];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM coverage WHERE path = '%s' AND verified_layers > 0",
                 expected_paths[i]);
        int64_t steps = tu_query_int(db, sql);
        print_message("  %-36s %lld verified steps\n", expected_paths[i], (long long)steps);
        if (steps <= 0) {
            print_message("  ^ expected default path not run: a shape sample no longer reaches it\n");
            failures++;
        }
    }
    for (int64_t k = 0;; k++) {
        char sql[160], path[128];
        snprintf(sql, sizeof sql, "SELECT path FROM (SELECT DISTINCT path FROM coverage ORDER BY path) LIMIT 1 "
                 "OFFSET %lld", (long long)k);
        tu_query_text(db, sql, path, sizeof path);
        if (!path[0]) break;
        if (!listed(path)) {
            print_message("  path %s ran but is not in the expected list: add it (and the trace that reaches it)\n",
                          path);
            failures++;
        }
    }
    assert_int_equal(failures, 0);
}

/* True when the paged backend takes an fp8 KV cache for the probe's shape (check only: no device
 * work), so its fp8 paths are part of what must be covered. */
static bool paged_takes_fp8(void)
{
    ar_run_config cfg;
    probe_config(&cfg, AR_FP8_E4M3, 2.0);
    char why[256] = "";
    bool ok = ar_cuda_backend.check(&cfg, why, sizeof why);
    if (!ok) print_message("the cuda backend takes no fp8 KV cache (%s): its fp8 replays are left out\n", why);
    return ok;
}

/* The fp8 KV paths: each fp8 replay (the MLA backend's always, the paged backend's once it takes
 * fp8 KV) must pass and record, on verified steps, a path that names fp8 (the backends name their
 * fp8 routes so: "kv-fp8" and the plan's route strings).  Their other paths are printed, not
 * listed: the bf16 test above owns the list of default paths. */
static void test_fp8_replays_record_their_fp8_paths(void **state)
{
    (void)state;
    if (!h200_ready()) {
        skip();
        return;
    }
    static const shape_trace fp8_traces[] = {
        {"deepseek-v3-tp16", "cuda-mla", "--kv-dtype fp8_e4m3 --kv-scale 2"},
        {"llama-3.1-8b", "cuda", "--kv-dtype fp8_e4m3 --kv-scale 2"},
        {"llama-3.1-8b-cascade", "cuda", "--kv-dtype fp8_e4m3 --kv-scale 2 --cascade on"},
        {"gemma-7b", "cuda", "--kv-dtype fp8_e4m3 --kv-scale 2"},
    };
    const bool paged = paged_takes_fp8();
    char db[512], log[512], trace[1024];
    tu_tmp("coverage-fp8.db", db, sizeof db);
    tu_tmp("coverage-fp8.log", log, sizeof log);
    int64_t run = 0;
    for (size_t i = 0; i < sizeof fp8_traces / sizeof fp8_traces[0]; i++) {
        if (strcmp(fp8_traces[i].backend, "cuda") == 0 && !paged) continue;
        snprintf(trace, sizeof trace, "%s/traces/samples/%s.trace.jsonl.gz", tu_src_dir(), fp8_traces[i].name);
        int rc = tu_run(log, "env -u AR_CUDA_WGMMA -u AR_CUDA_DECODE_TMA -u AR_CUDA_CASCADE_FOLD "
                             "-u AR_CUDA_CASCADE_MERGE -u AR_MLA_KERNEL -u AR_MLA_PREFILL -u AR_MLA_GEMM '%s' replay '%s' --db '%s' --backend %s %s",
                        tu_bin(), trace, db, fp8_traces[i].backend, fp8_traces[i].extra);
        char *text = tu_slurp(log);
        const char *paths = text ? strstr(text, "  paths ") : NULL;
        const char *end = paths ? strchr(paths, '\n') : NULL;
        print_message("%s (%s, fp8 KV): exit %d; %.*s\n", fp8_traces[i].name, fp8_traces[i].backend, rc,
                      paths && end ? (int)(end - paths) : 0, paths ? paths : "");
        if (rc != 0) print_message("%s\n", text ? text : "(no output)");
        free(text);
        assert_int_equal(rc, 0);
        run++;
        char sql[200];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM coverage WHERE run = %lld AND path LIKE '%%fp8%%' "
                 "AND verified_layers > 0", (long long)run);
        if (tu_query_int(db, sql) <= 0) print_message("  ^ no verified step recorded an fp8 path\n");
        assert_true(tu_query_int(db, sql) > 0);
    }
}

int main(void)
{
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape_samples_cover_every_default_path),
        cmocka_unit_test(test_fp8_replays_record_their_fp8_paths),
    };
    return tu_run_gpu_tests("gpu_coverage", tests, sizeof tests / sizeof tests[0]);
}
