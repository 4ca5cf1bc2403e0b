/* test_coverage.c - kernel-path coverage on the CPU: the `coverage` table (schema version 4)
 * holds, for every replayed step, exactly the paths the CPU backends ran - recomputed here from
 * the trace independently of the backends (flat or the cascade trio by the step's cascade flag;
 * cpu-mla's absorbed / prefill / context paths from each request's query and context lengths) -
 * with the layer counts --layers and --verify-layers give; fp8 KV and plugins add their paths;
 * a killed and resumed run keeps coverage rows and steps together; `report` prints a coverage
 * table per run (and says when an older database has none); the shape samples regenerate
 * byte for byte and span the grid the GPU coverage test needs (head sizes 64/128/256, GQA 1/4/8,
 * block sizes 16/32/64, a cascade trace, an MLA trace). */
#include "testutil.h"

#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../traces/samples.h"
#include "../traces/trace.h"

static void replay_ok(const char *log, const char *fmt_args, const char *trace, const char *db)
{
    int rc = tu_run(log, "'%s' replay '%s' --db '%s' --quiet %s", tu_bin(), trace, db, fmt_args);
    if (rc != 0) {
        char *t = tu_slurp(log);
        print_message("replay %s %s: exit %d\n%s\n", trace, fmt_args, rc, t ? t : "");
        free(t);
    }
    assert_int_equal(rc, 0);
}

/* Rows of run whose path set differs from flat / the cascade trio by the step's cascade flag. */
static void assert_mha_paths_exact(const char *db, int run, int layers, int verified)
{
    char sql[1024];
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM steps s WHERE s.run=%d AND ("
             " (SELECT group_concat(path, ',') FROM (SELECT path FROM coverage c WHERE c.run=s.run AND c.step=s.step"
             "  ORDER BY path)) IS NOT"
             " (CASE WHEN s.cascade THEN 'cascade-merge,cascade-prefix,cascade-suffix' ELSE 'flat' END))",
             run);
    assert_int_equal(tu_query_int(db, sql), 0);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM coverage WHERE run=%d AND (layers != %d OR verified_layers != %d)",
             run, layers, verified);
    assert_int_equal(tu_query_int(db, sql), 0);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM coverage c WHERE run=%d AND NOT EXISTS"
             " (SELECT 1 FROM steps s WHERE s.run=c.run AND s.step=c.step)", run);
    assert_int_equal(tu_query_int(db, sql), 0);
}

static void test_cpu_paths_per_step(void **state)
{
    (void)state;
    char trace[512], db[512], log[512];
    tu_tmp("paths.db", db, sizeof db);
    tu_tmp("paths.log", log, sizeof log);
    replay_ok(log, "--backend cpu --layers 2 --verify-layers first", tu_sample("mixed", trace, sizeof trace), db);
    replay_ok(log, "--backend cpu --cascade on --layers 2", tu_sample("prefix", trace, sizeof trace), db);
    replay_ok(log, "--backend cpu --verify off", tu_sample("chunked", trace, sizeof trace), db);
    assert_mha_paths_exact(db, 1, 2, 1);
    assert_mha_paths_exact(db, 2, 2, 2);
    assert_mha_paths_exact(db, 3, 1, 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1 AND cascade"), 0);
    /* the prefix sample has cascade steps and a flat one; both kinds were checked above */
    assert_true(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=2 AND cascade") >= 20);
    assert_true(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=2 AND NOT cascade") >= 1);
    /* the summary names the paths */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --cascade on --steps 0:12", tu_bin(),
                            tu_sample("prefix", trace, sizeof trace), db), 0);
    assert_true(tu_file_has(log, "paths     flat 1 step, cascade-prefix "));
}

/* The cpu-mla backend's paths, recomputed from the trace: absorbed when some request has a query
 * of at most 128 tokens, prefill:new when some has more, prefill:context when such a request has
 * context.  Every step of the run is compared. */
static void test_cpu_mla_paths_from_trace(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], err[AR_ERR_MAX];
    tu_tmp("mla.db", db, sizeof db);
    tu_tmp("mla.log", log, sizeof log);
    tu_sample("deepseek-v3-tp16", trace, sizeof trace);
    replay_ok(log, "--backend cpu-mla --steps 0:9 --verify sample:2", trace, db);
    ar_trace_reader *r = ar_trace_open(trace, err, sizeof err);
    assert_non_null(r);
    const ar_step *st;
    int checked = 0, seen[3] = {0, 0, 0};
    static const char *const names[3] = {"mla-decode:absorbed", "mla-prefill:new", "mla-prefill:context"};
    while (ar_trace_next(r, &st, err, sizeof err) == 1 && st->step <= 9) {
        if (st->num_scheduled == 0) continue;
        bool want[3] = {false, false, false};
        for (int i = 0; i < st->num_scheduled; i++) {
            const ar_live_req *lr = ar_trace_find(r, st->scheduled[i].req);
            assert_non_null(lr);
            int ql = st->scheduled[i].num_tokens;
            if (ql <= 128) want[0] = true;
            else {
                want[1] = true;
                if (lr->num_computed_tokens > 0) want[2] = true;
            }
        }
        for (int k = 0; k < 3; k++) {
            char sql[256];
            snprintf(sql, sizeof sql, "SELECT count(*) FROM coverage WHERE run=1 AND step=%lld AND path='%s'",
                     (long long)st->step, names[k]);
            if (tu_query_int(db, sql) != (want[k] ? 1 : 0))
                print_message("step %lld: path %s expected %d\n", (long long)st->step, names[k], want[k]);
            assert_int_equal(tu_query_int(db, sql), want[k] ? 1 : 0);
            seen[k] += want[k];
        }
        checked++;
    }
    ar_trace_close(r);
    assert_int_equal(checked, tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1"));
    for (int k = 0; k < 3; k++) assert_true(seen[k] > 0);   /* the slice runs all three */
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM coverage WHERE run=1 AND path NOT IN"
                                      " ('mla-decode:absorbed','mla-prefill:new','mla-prefill:context')"), 0);
}

static void test_fp8_and_plugin_paths(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], args[4200];
    tu_tmp("fp8.db", db, sizeof db);
    tu_tmp("fp8.log", log, sizeof log);
    tu_sample("mixed", trace, sizeof trace);
    replay_ok(log, "--backend cpu --kv-dtype fp8_e4m3 --steps 0:5", trace, db);
    int64_t steps = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1");
    assert_true(steps > 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM coverage WHERE run=1 AND path='kv-fp8'"), steps);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM coverage WHERE run=1 AND path='flat'"), steps);
    /* a plugin reports one path, its name */
    snprintf(args, sizeof args, "--backend 'plugin:%s/plugins/attnreplay-example-cpu.so' --steps 0:3", tu_build_dir());
    replay_ok(log, args, trace, db);
    steps = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=2");
    assert_true(steps > 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM coverage WHERE run=2 AND path='plugin:example-cpu'"),
                     steps);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM coverage WHERE run=2"), steps);
}

/* A run killed by SIGKILL inside the transaction that writes step 40 (its first batch, steps 0-31,
 * committed), then resumed: every stored step has its coverage rows, and no coverage row lacks its
 * step. */
static void test_kill_and_resume_keep_coverage_whole(void **state)
{
    (void)state;
    char trace[512], db[512], log[512];
    tu_tmp("kill.db", db, sizeof db);
    tu_tmp("kill.log", log, sizeof log);
    tu_sample("llama-3.1-70b-tp8", trace, sizeof trace);
    int rc = tu_run(log, "ATTNREPLAY_TEST_KILL_AFTER_STEP=40 '%s' replay '%s' --db '%s' --backend cpu "
                         "--no-overlap --quiet", tu_bin(), trace, db);
    assert_int_equal(rc, 128 + 9);
    int64_t before = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1");
    assert_true(before > 0);
    assert_int_equal(tu_query_int(db, "SELECT count(DISTINCT step) FROM coverage WHERE run=1"), before);
    replay_ok(log, "--backend cpu --no-overlap --resume", trace, db);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs"), 1);
    int64_t after = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1");
    assert_true(after > before);
    assert_int_equal(tu_query_int(db, "SELECT count(DISTINCT step) FROM coverage WHERE run=1"), after);
    assert_mha_paths_exact(db, 1, 1, 1);
}

static void test_report_shows_coverage_per_run(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], out[512], md[600], html[600];
    tu_tmp("rep.db", db, sizeof db);
    tu_tmp("rep.log", log, sizeof log);
    tu_tmp("rep-out", out, sizeof out);
    replay_ok(log, "--backend cpu --steps 0:6", tu_sample("mixed", trace, sizeof trace), db);
    replay_ok(log, "--backend cpu --cascade on --steps 0:10", tu_sample("prefix", trace, sizeof trace), db);
    int rc = tu_run(log, "'%s' report '%s' --out '%s'", tu_bin(), db, out);
    assert_true(rc == 0 || rc == 1);   /* 1: a plot failed to render (no gnuplot); tables are written */
    snprintf(md, sizeof md, "%s/summary.md", out);
    snprintf(html, sizeof html, "%s/index.html", out);
    assert_true(tu_file_has(md, "## Kernel-path coverage"));
    assert_true(tu_file_has(md, "### run 1: cpu on mixed, bf16"));
    assert_true(tu_file_has(md, "| flat | 7 | 7 | 7 | 0 |"));
    assert_true(tu_file_has(md, "### run 2: cpu on prefix, bf16"));
    assert_true(tu_file_has(md, "| cascade-merge |"));
    assert_true(tu_file_has(html, "<h2>Kernel-path coverage</h2>"));
    assert_true(tu_file_has(html, "<td>cascade-suffix</td>"));
    /* failing steps are counted per path */
    replay_ok(log, "--backend cpu --steps 0:6", tu_sample("mixed", trace, sizeof trace), db);   /* run 3 */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --steps 0:6 --inject no-rescale --quiet",
                            tu_bin(), trace, db), 1);
    int64_t failed = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=4 AND pass=0");
    assert_true(failed > 0);
    rc = tu_run(log, "'%s' report '%s' --run 4 --out '%s'", tu_bin(), db, out);
    assert_true(rc == 0 || rc == 1);
    char want[64];
    snprintf(want, sizeof want, "| flat | 7 | 7 | 7 | %lld |", (long long)failed);
    assert_true(tu_file_has(md, want));
    /* a database from before coverage: the report says so */
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "DROP TABLE coverage; UPDATE meta SET value='2' WHERE key='schema_version'",
                                  NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(h);
    rc = tu_run(log, "'%s' report '%s' --out '%s'", tu_bin(), db, out);
    assert_true(rc == 0 || rc == 1);
    assert_true(tu_file_has(md, "Not recorded: the database predates kernel-path coverage"));
    /* and a replay migrates it: the table is back, the old runs have no rows, the new one has */
    replay_ok(log, "--backend cpu --steps 0:2", trace, db);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM coverage WHERE run < 5"), 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM coverage WHERE run = 5"), 3);
    rc = tu_run(log, "'%s' report '%s' --out '%s'", tu_bin(), db, out);
    assert_true(rc == 0 || rc == 1);
    assert_true(tu_file_has(md, "no kernel paths recorded for its steps"));
}

/* ---- the shape samples ------------------------------------------------------------------- */

static void test_shape_samples_regenerate_and_span_the_grid(void **state)
{
    (void)state;
    char dir[4096], err[AR_ERR_MAX];
    tu_tmp("regen", dir, sizeof dir);
    assert_int_equal(tu_run(NULL, "mkdir -p '%s'", dir), 0);
    int rc = ar_samples_write(dir, err, sizeof err);
    if (rc != 0) print_message("%s\n", err);
    assert_int_equal(rc, 0);
    bool head[3] = {false, false, false}, gqa[3] = {false, false, false}, block[3] = {false, false, false};
    bool mla = false, cascade = false;
    for (int i = 0; i < AR_NUM_SHAPE_SAMPLES; i++) {
        char a[4096], b[8200];
        snprintf(a, sizeof a, "%s/traces/samples/%s", tu_src_dir(), ar_shape_sample_name(i));
        snprintf(b, sizeof b, "%s/%s", dir, ar_shape_sample_name(i));
        size_t la = 0, lb = 0;
        char *da = tu_slurp_gz(a, &la), *db = tu_slurp_gz(b, &lb);
        assert_non_null(da);
        assert_non_null(db);
        if (la != lb || memcmp(da, db, la) != 0) print_message("%s differs from what gen-samples writes\n", a);
        assert_int_equal(la, lb);
        assert_memory_equal(da, db, la);
        free(da);
        free(db);
        ar_trace_stats st;
        ar_trace_header h;
        assert_int_equal(ar_trace_stats_compute(a, &st, &h, err, sizeof err), 0);
        assert_true(st.steps >= 20 && st.steps <= 200);   /* small: a GPU replays them in seconds */
        if (h.model.attention == AR_ATTN_MLA) {
            mla = true;
            assert_int_equal(h.model.kv_lora_rank, 512);
            assert_int_equal(h.model.qk_rope_head_dim, 64);
            continue;
        }
        int g = h.model.num_q_heads / h.model.num_kv_heads;
        head[0] |= h.model.head_size == 64, head[1] |= h.model.head_size == 128, head[2] |= h.model.head_size == 256;
        gqa[0] |= g == 1, gqa[1] |= g == 4, gqa[2] |= g == 8;
        block[0] |= h.cache.block_size == 16, block[1] |= h.cache.block_size == 32, block[2] |= h.cache.block_size == 64;
        cascade |= st.cascade_eligible_steps > 0;
    }
    assert_null(ar_shape_sample_name(AR_NUM_SHAPE_SAMPLES));
    for (int k = 0; k < 3; k++) assert_true(head[k] && gqa[k] && block[k]);
    assert_true(mla && cascade);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shape_samples_regenerate_and_span_the_grid),
        cmocka_unit_test(test_cpu_paths_per_step),
        cmocka_unit_test(test_cpu_mla_paths_from_trace),
        cmocka_unit_test(test_fp8_and_plugin_paths),
        cmocka_unit_test(test_kill_and_resume_keep_coverage_whole),
        cmocka_unit_test(test_report_shows_coverage_per_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
