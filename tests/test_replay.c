/* test_replay.c - the replay engine end to end through bin/attnreplay: exit codes, every planted
 * fault flagged on every sample trace, the database's contents, kill -9 and --resume, --steps,
 * --dump-step (the directory made at the start, index.json one JSON document), bad input,
 * the summary's cascade verdict, identical rows with and without --no-overlap, the
 * --verify-layers policy and what the runs table says was verified, the "nothing verified"
 * outcomes (exit 4: 'empty', 'fault-not-fired') and the usage errors that replace them where
 * the options alone decide (exit 2), --db paths that cannot work, and -h. */
#include "testutil.h"

#include "../replay/db.h"
#include "../replay/replay.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const samples[] = {"mixed", "chunked", "prefix", "preempt"};
#define NUM_SAMPLES (sizeof samples / sizeof samples[0])

static const char *sample(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/traces/samples/%s.trace.jsonl.gz", tu_src_dir(), name);
    return buf;
}

static bool file_has(const char *path, const char *needle)
{
    char *text = tu_slurp(path);
    bool yes = text && strstr(text, needle);
    if (!yes) print_message("--- %s (no '%s'):\n%s\n", path, needle, text ? text : "(missing)");
    free(text);
    return yes;
}

static int64_t trace_steps(const char *trace)
{
    char out[512], cmd_out[4096];
    tu_tmp("info.txt", out, sizeof out);
    if (tu_run(out, "'%s' info '%s'", tu_bin(), trace) != 0) return -1;
    char *text = tu_slurp(out);
    if (!text) return -1;
    snprintf(cmd_out, sizeof cmd_out, "%s", text);
    free(text);
    const char *p = strstr(cmd_out, "steps");
    return p ? strtoll(p + strspn(p, "steps: \t"), NULL, 10) : -1;
}

static void test_clean_replay_passes_and_is_stored(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], status[64];
    tu_tmp("clean.db", db, sizeof db);
    tu_tmp("clean.log", log, sizeof log);
    for (size_t i = 0; i < NUM_SAMPLES; i++) {
        sample(samples[i], trace, sizeof trace);
        int rc = tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --quiet", tu_bin(), trace, db);
        if (rc != 0) {
            char *t = tu_slurp(log);
            print_message("%s\n", t ? t : "");
            free(t);
        }
        assert_int_equal(rc, 0);
    }
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs"), (int64_t)NUM_SAMPLES);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs WHERE status='passed'"), (int64_t)NUM_SAMPLES);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE pass IS NOT 1"), 0);
    assert_true(tu_query_int(db, "SELECT count(*) FROM steps") > 20);
    assert_true(tu_query_int(db, "SELECT count(*) FROM kernels WHERE name='attn' AND time_us > 0") > 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE bytes <= 0 OR flops <= 0"), 0);
    tu_query_text(db, "SELECT value FROM meta WHERE key='schema_version'", status, sizeof status);
    assert_int_equal(atoi(status), AR_DB_SCHEMA_VERSION);
    /* what was verified, and where the time went */
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs WHERE verified_steps != steps_done "
                                      "OR verified_layer_steps != steps_done * layers OR verify_layers != 'all'"
                                      " OR verify_where != 'host' OR error IS NOT NULL"), 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs r WHERE verified_rows != "
                                      "(SELECT sum(rows_checked) FROM steps s WHERE s.run = r.id)"), 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs WHERE NOT (wall_s > 0 AND kernel_s > 0 AND "
                                      "verify_s > 0 AND parse_s > 0 AND metadata_s > 0 AND sqlite_s > 0 AND setup_s > 0 AND "
                                      "kernel_s + verify_s <= wall_s)"), 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE NOT (wall_us > 0 AND "
                                      "layers_verified = (SELECT layers FROM runs WHERE id = run))"), 0);
    /* each run has exactly as many steps as its trace */
    sample("mixed", trace, sizeof trace);
    int64_t n = trace_steps(trace);
    assert_true(n > 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1"), n);
}

static const char *const mha_faults[] = {"causal-off-by-one", "wrong-slot", "stale-block-table",
                                         "wrong-kv-head", "no-rescale", "lse-base2"};

static void test_every_fault_flagged_on_every_sample(void **state)
{
    (void)state;
    char trace[512], db[512], log[512];
    tu_tmp("faults.db", db, sizeof db);
    tu_tmp("faults.log", log, sizeof log);
    for (size_t f = 0; f < sizeof mha_faults / sizeof mha_faults[0]; f++) {
        for (size_t i = 0; i < NUM_SAMPLES; i++) {
            sample(samples[i], trace, sizeof trace);
            int rc = tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --inject %s --quiet",
                            tu_bin(), trace, db, mha_faults[f]);
            if (rc != 1) print_message("fault %s on %s: exit %d\n", mha_faults[f], samples[i], rc);
            assert_int_equal(rc, 1);
        }
    }
    /* failing steps carry their worst elements */
    assert_true(tu_query_int(db, "SELECT count(*) FROM mismatches") > 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs WHERE status != 'failed'"), 0);
}

static void test_merge_fault_flagged_when_cascade_runs(void **state)
{
    (void)state;
    char trace[512], db[512], log[512];
    tu_tmp("merge.db", db, sizeof db);
    tu_tmp("merge.log", log, sizeof log);
    sample("prefix", trace, sizeof trace);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --cascade on",
                            tu_bin(), trace, db), 0);
    assert_true(tu_query_int(db, "SELECT count(*) FROM steps WHERE cascade=1 AND prefix_len > 0") > 0);
    char *text = tu_slurp(log);   /* the summary has its cascade line, with one of the verdicts */
    assert_non_null(text);
    const char *line = strstr(text, "steps used it: ");
    assert_non_null(line);
    assert_true(strstr(line, "(saved ") != NULL || strstr(line, "(cost ") != NULL);
    free(text);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --cascade on "
                                 "--inject merge-no-weights --quiet", tu_bin(), trace, db), 1);
}

/* The summary's cascade verdict on both sides of break-even (a CPU run's timing cannot pick
 * the side). */
static void test_cascade_verdict_wording(void **state)
{
    (void)state;
    char buf[96];
    ar_cascade_verdict(75.0, 100.0, buf, sizeof buf);
    assert_string_equal(buf, "(saved 25.0%)");
    ar_cascade_verdict(100.0, 100.0, buf, sizeof buf);
    assert_string_equal(buf, "(saved 0.0%)");
    ar_cascade_verdict(157.1, 100.0, buf, sizeof buf);
    assert_string_equal(buf, "(cost 57.1% more: flat was faster on these steps)");
    ar_cascade_verdict(10.0, 0.0, buf, sizeof buf);
    assert_string_equal(buf, "");
}

static void test_kill_and_resume(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], status[64];
    tu_tmp("kill.db", db, sizeof db);
    tu_tmp("kill.log", log, sizeof log);
    sample("mixed", trace, sizeof trace);
    int64_t total = trace_steps(trace);
    assert_true(total > 12);
    /* SIGKILL right after step 10 is inserted, inside an open transaction */
    int rc = tu_run(log, "ATTNREPLAY_TEST_KILL_AFTER_STEP=10 '%s' replay '%s' --db '%s' --backend cpu --quiet",
                    tu_bin(), trace, db);
    assert_int_equal(rc, 128 + 9);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", status, sizeof status);
    assert_string_equal(status, "running");
    int64_t kept = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1");
    assert_true(kept >= 0 && kept <= 10);
    assert_int_equal(tu_query_int(db, "SELECT last_step FROM runs WHERE id=1") + 1, kept);
    rc = tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --resume --quiet", tu_bin(), trace, db);
    assert_int_equal(rc, 0);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", status, sizeof status);
    assert_string_equal(status, "passed");
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1"), total);
    assert_int_equal(tu_query_int(db, "SELECT count(DISTINCT step) FROM steps WHERE run=1"), total);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs"), 1);
    /* nothing left to resume */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --resume --quiet", tu_bin(),
                            trace, db), 2);
}

static void test_steps_range_fills_missing_context(void **state)
{
    (void)state;
    char trace[512], db[512], log[512];
    tu_tmp("range.db", db, sizeof db);
    tu_tmp("range.log", log, sizeof log);
    for (size_t i = 0; i < NUM_SAMPLES; i++) {
        sample(samples[i], trace, sizeof trace);
        assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --steps 7: --quiet",
                                tu_bin(), trace, db), 0);
    }
    assert_int_equal(tu_query_int(db, "SELECT min(step) FROM steps"), 7);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE pass != 1"), 0);
}

/* The summary's time line picks a unit per number: at most three digits before the point, whether
 * a step takes microseconds (GPU) or seconds (CPU) - never "123784018.4 us/step". */
static void test_summary_times_have_short_units(void **state)
{
    (void)state;
    char trace[512], db[512], log[512];
    tu_tmp("units.db", db, sizeof db);
    tu_tmp("units.log", log, sizeof log);
    sample("chunked", trace, sizeof trace);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --verify off", tu_bin(), trace, db), 0);
    char *text = tu_slurp(log);
    assert_non_null(text);
    const char *line = strstr(text, "time      attention ");
    if (line) line += strlen("time      ");
    if (!line) print_message("--- no time line:\n%s\n", text);
    assert_non_null(line);
    double total = 0, mean = 0;
    char unit_total[8] = "", unit_mean[8] = "";
    int got = sscanf(line, "attention %lf %7s total, %lf %7[a-z]/step mean", &total, unit_total, &mean, unit_mean);
    if (got != 4) print_message("--- time line not parsed (%d fields): %.120s\n", got, line);
    assert_int_equal(got, 4);
    const char *const units[] = {"ns", "us", "ms", "s"};
    bool total_ok = false, mean_ok = false;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        total_ok |= strcmp(unit_total, units[i]) == 0;
        mean_ok |= strcmp(unit_mean, units[i]) == 0;
    }
    assert_true(total_ok && mean_ok);
    assert_true(mean > 0 && mean < 1000);
    assert_true(total > 0 && (total < 1000 || strcmp(unit_total, "s") == 0));
    free(text);
}

static void test_verify_off_and_sample_are_labelled(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], status[64];
    tu_tmp("labels.db", db, sizeof db);
    tu_tmp("labels.log", log, sizeof log);
    sample("chunked", trace, sizeof trace);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --verify off --quiet", tu_bin(), trace, db), 0);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", status, sizeof status);
    assert_string_equal(status, "unverified");
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1 AND pass IS NOT NULL"), 0);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --verify sample:8 --quiet", tu_bin(), trace, db), 0);
    tu_query_text(db, "SELECT verified FROM steps WHERE run=2 LIMIT 1", status, sizeof status);
    assert_string_equal(status, "sample");
    assert_true(tu_query_int(db, "SELECT max(rows_checked) FROM steps WHERE run=2") <
                tu_query_int(db, "SELECT max(num_tokens) FROM steps WHERE run=2"));
}

static void test_dump_step_writes_npy(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], dir[512], path[600];
    tu_tmp("dump.db", db, sizeof db);
    tu_tmp("dump.log", log, sizeof log);
    tu_tmp("dump/nested/dir", dir, sizeof dir);   /* missing: made at the start */
    sample("mixed", trace, sizeof trace);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --steps 0:3 --layers 2 --dump-step 2 --dump-dir '%s' "
                                 "--quiet", tu_bin(), trace, db, dir), 0);
    snprintf(path, sizeof path, "%s/index.json", dir);
    /* one JSON document: the step, its requests, the layers dumped */
    json_error_t jerr;
    json_t *idx = json_load_file(path, 0, &jerr);
    if (!idx) print_message("index.json: %s (line %d)\n", jerr.text, jerr.line);
    assert_non_null(idx);
    assert_int_equal(json_integer_value(json_object_get(idx, "step")), 2);
    json_t *layers = json_object_get(idx, "layers");
    assert_true(json_is_array(layers));
    assert_int_equal(json_array_size(layers), 2);
    assert_int_equal(json_integer_value(json_array_get(layers, 1)), 1);
    assert_true(json_array_size(json_object_get(idx, "requests")) > 0);
    json_decref(idx);
    snprintf(path, sizeof path, "%s/L0_r0_ref_out.npy", dir);
    char *npy = tu_slurp(path);
    assert_non_null(npy);
    assert_memory_equal(npy + 1, "NUMPY", 5);
    assert_non_null(strstr(npy + 10, "'descr': '<f8'"));
    free(npy);
    snprintf(path, sizeof path, "%s/L1_r0_k.npy", dir);
    assert_int_equal(access(path, R_OK), 0);
    /* a directory that cannot be made fails at the start, before any run exists */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --steps 0:3 --dump-step 2 --dump-dir /dev/null/dump",
                            tu_bin(), trace, db), 2);
    assert_true(file_has(log, "/dev/null"));
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs"), 1);
}

static void test_bad_input_exit_codes(void **state)
{
    (void)state;
    char bad[512], db[512], log[512];
    tu_tmp("bad.jsonl", bad, sizeof bad);
    tu_tmp("bad.db", db, sizeof db);
    tu_tmp("bad.log", log, sizeof log);
    /* a valid header, then a step with block id beyond num_blocks on line 2 */
    tu_write(bad,
             "{\"format\":\"attnreplay-trace\",\"version\":1,\"model\":{\"name\":\"t\",\"attention\":\"mha\","
             "\"num_layers\":1,\"num_q_heads\":2,\"num_kv_heads\":1,\"head_size\":64},\"cache\":{\"block_size\":16,"
             "\"num_blocks\":8,\"dtype\":\"bf16\",\"kv_cache_dtype\":\"auto\"},\"scheduler\":{\"max_num_batched_tokens\":64,"
             "\"max_num_seqs\":4,\"prefix_caching\":true,\"cascade\":false},\"source\":\"test\",\"seed\":1}\n"
             "{\"step\":0,\"time\":0,\"new\":[{\"req\":\"a\",\"prompt_len\":4,\"num_computed_tokens\":0,"
             "\"block_ids\":[9]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":4},\"num_common_prefix_blocks\":0,"
             "\"finished\":[],\"preempted\":[]}\n");
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s'", tu_bin(), bad, db), 2);
    char *text = tu_slurp(log);
    assert_non_null(text);
    char want[600];
    snprintf(want, sizeof want, "%s:2:", bad);
    assert_non_null(strstr(text, want));
    free(text);
    assert_int_equal(tu_run(log, "'%s' replay /nonexistent.jsonl --db '%s'", tu_bin(), db), 2);
    assert_int_equal(tu_run(log, "'%s' replay '%s'", tu_bin(), bad), 2);              /* no --db */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --verify maybe", tu_bin(), bad, db), 2);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --inject nonsense", tu_bin(), bad, db), 2);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend nosuch", tu_bin(), bad, db), 2);
    assert_int_equal(tu_run(log, "'%s' frobnicate", tu_bin()), 2);
}

/* Every column a replay computes (not the timings) of runs a and b, and their mismatches and
 * kernel rows, agree. */
static void assert_same_rows(const char *db, int a, int b)
{
    static const char *const step_cols =
        "step, time, num_reqs, num_tokens, num_prefill_reqs, num_decode_reqs, max_query_len, max_seq_len,"
        " total_context, cascade, prefix_len, bytes, flops, verified, rows_checked, max_abs, max_rel,"
        " mean_abs, nmse, lse_max_abs, nan_count, bad_count, naive_max_abs, naive_mean_abs, tol_max_abs,"
        " tol_mean_abs, guard_ok, pass, layers_verified";
    static const char *const mism_cols = "step, layer, req, token, head, dim, got, want, abs_err";
    static const char *const kern_cols = "step, layer, name";
    const char *const tables[3][2] = {{"steps", step_cols}, {"mismatches", mism_cols}, {"kernels", kern_cols}};
    char sql[2048];
    for (int t = 0; t < 3; t++) {
        for (int dir = 0; dir < 2; dir++) {
            int x = dir ? b : a, y = dir ? a : b;
            snprintf(sql, sizeof sql, "SELECT count(*) FROM (SELECT %s FROM %s WHERE run=%d EXCEPT SELECT %s FROM %s "
                     "WHERE run=%d)", tables[t][1], tables[t][0], x, tables[t][1], tables[t][0], y);
            int64_t differ = tu_query_int(db, sql);
            if (differ != 0) print_message("%s: %lld rows of run %d not in run %d\n", tables[t][0], (long long)differ, x, y);
            assert_int_equal(differ, 0);
        }
        snprintf(sql, sizeof sql, "SELECT (SELECT count(*) FROM %s WHERE run=%d) - (SELECT count(*) FROM %s WHERE run=%d)",
                 tables[t][0], a, tables[t][0], b);
        assert_int_equal(tu_query_int(db, sql), 0);
    }
    snprintf(sql, sizeof sql, "SELECT count(*) FROM runs x, runs y WHERE x.id=%d AND y.id=%d AND x.status=y.status AND "
             "x.steps_done=y.steps_done AND x.steps_failed=y.steps_failed AND x.last_step=y.last_step AND "
             "x.verified_steps=y.verified_steps AND x.verified_rows=y.verified_rows", a, b);
    assert_int_equal(tu_query_int(db, sql), 1);
}

/* The reader and writer threads change when work happens, never what it gives: step rows,
 * errors, mismatches and kernel rows match --no-overlap's, on a failing fault that keeps state
 * across steps (stale block table), cascade steps, and a range that starts mid-trace (fill). */
static void test_overlap_gives_the_same_rows(void **state)
{
    (void)state;
    char trace[512], db[512], log[512];
    tu_tmp("overlap.db", db, sizeof db);
    tu_tmp("overlap.log", log, sizeof log);
    const struct { const char *sample, *args; int rc; } cases[] = {
        {"mixed", "--layers 2 --inject stale-block-table", 1},
        {"prefix", "--layers 2 --cascade on", 0},
        {"chunked", "--steps 7: --inject wrong-slot --verify sample:3", 1},
        {"preempt", "--inject causal-off-by-one --verify-layers first --layers 2", 1},
    };
    int run = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        sample(cases[i].sample, trace, sizeof trace);
        for (int no_overlap = 0; no_overlap < 2; no_overlap++) {
            int rc = tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 2 %s %s --quiet", tu_bin(), trace,
                            db, cases[i].args, no_overlap ? "--no-overlap" : "");
            assert_int_equal(rc, cases[i].rc);
            run++;
        }
        assert_same_rows(db, run - 1, run);
    }
    assert_true(tu_query_int(db, "SELECT count(*) FROM mismatches") > 0);
    assert_true(tu_query_int(db, "SELECT count(*) FROM kernels WHERE name='flat_equivalent'") > 0);
}

/* --verify-layers: which layers are checked, and the runs table says so exactly. */
static void test_verify_layers_policy(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], text[64];
    tu_tmp("vlayers.db", db, sizeof db);
    tu_tmp("vlayers.log", log, sizeof log);
    sample("mixed", trace, sizeof trace);
    const char *policies[3] = {"all", "first", "1"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --layers 2 --verify-layers %s",
                                tu_bin(), trace, db, policies[i]), 0);
    int64_t steps = tu_query_int(db, "SELECT steps_done FROM runs WHERE id=1");
    assert_true(steps > 0);
    tu_query_text(db, "SELECT verify_layers FROM runs WHERE id=2", text, sizeof text);
    assert_string_equal(text, "first");
    tu_query_text(db, "SELECT verify_layers FROM runs WHERE id=3", text, sizeof text);
    assert_string_equal(text, "1");
    assert_int_equal(tu_query_int(db, "SELECT verified_layer_steps FROM runs WHERE id=1"), 2 * steps);
    assert_int_equal(tu_query_int(db, "SELECT verified_layer_steps FROM runs WHERE id=2"), steps);
    assert_int_equal(tu_query_int(db, "SELECT verified_steps FROM runs WHERE id=2"), steps);
    /* layer 1 was not checked: half the rows */
    assert_int_equal(tu_query_int(db, "SELECT verified_rows FROM runs WHERE id=1"),
                     2 * tu_query_int(db, "SELECT verified_rows FROM runs WHERE id=2"));
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=2 AND layers_verified != 1"), 0);
    /* the summary says what was verified */
    char *text2 = tu_slurp(log);
    assert_non_null(text2);
    assert_non_null(strstr(text2, "verified  "));
    assert_non_null(strstr(text2, "x 1 of 2 layers"));
    free(text2);
    /* a fault is still flagged on the layers checked; bad policies are usage errors */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --layers 2 --verify-layers first "
                                 "--inject wrong-kv-head --quiet", tu_bin(), trace, db), 1);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --layers 2 --verify-layers 3", tu_bin(), trace, db), 2);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --verify-layers 0", tu_bin(), trace, db), 2);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --verify-layers some", tu_bin(), trace, db), 2);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs"), 4);
}

/* Outcomes that check nothing never say "passed": exit 4 with status 'empty' or
 * 'fault-not-fired' and the reason in runs.error, or a usage error (exit 2) before any run
 * exists when the options alone decide. */
static void test_nothing_verified_is_not_passed(void **state)
{
    (void)state;
    char trace[512], prefix[512], db[512], log[512], hdr[512], text[512];
    tu_tmp("nothing.db", db, sizeof db);
    tu_tmp("nothing.log", log, sizeof log);
    tu_tmp("header-only.jsonl", hdr, sizeof hdr);
    sample("mixed", trace, sizeof trace);
    sample("prefix", prefix, sizeof prefix);
    /* run 1: a range past the end of a 26-step trace */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --steps 100:200 --quiet", tu_bin(), trace, db), 4);
    tu_query_text(db, "SELECT status || ': ' || error FROM runs WHERE id=1", text, sizeof text);
    assert_non_null(strstr(text, "empty: no step was replayed"));
    assert_non_null(strstr(text, "0..25"));
    assert_true(file_has(log, "no step was replayed"));
    /* run 2: a header and no steps */
    assert_int_equal(tu_run(NULL, "gzip -dc '%s' | head -1 > '%s'", trace, hdr), 0);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --quiet", tu_bin(), hdr, db), 4);
    tu_query_text(db, "SELECT status || ': ' || error FROM runs WHERE id=2", text, sizeof text);
    assert_string_equal(text, "empty: no step was replayed: the trace has no steps");
    /* run 3, 4: merge-no-weights where no merge runs: --cascade off, and a trace with no cascade */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --inject merge-no-weights --cascade off "
                                 "--quiet", tu_bin(), prefix, db), 4);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --inject merge-no-weights --quiet",
                            tu_bin(), trace, db), 4);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs WHERE id IN (3, 4) AND status='fault-not-fired' "
                                      "AND error LIKE '%never fired%'"), 2);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run IN (3, 4) AND cascade != 0"), 0);
    /* usage errors, no run created: mla-no-wuv on MHA, a dump step past the end, --kv-scale
     * without an fp8 cache */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --inject mla-no-wuv", tu_bin(), trace, db), 2);
    assert_true(file_has(log, "needs an MLA model"));
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --dump-step 999 --dump-dir '%s/never'", tu_bin(), trace,
                            db, tu_tmpdir()), 2);
    assert_true(file_has(log, "the trace has 26 steps"));
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --steps 0:5 --dump-step 9 --dump-dir '%s/never'",
                            tu_bin(), trace, db, tu_tmpdir()), 2);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --kv-scale 2", tu_bin(), trace, db), 2);
    assert_true(file_has(log, "fp8 KV cache only"));
    /* a scale the backends' float cannot hold (0 or inf there) is refused, not replayed into
     * a verification failure that blames the kernel */
    static const char *const bad_scales[] = { "1e39", "1e-45", "1e-300", "0", "-2", "nan", "inf", "" };
    for (size_t i = 0; i < sizeof bad_scales / sizeof bad_scales[0]; i++) {
        assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --kv-dtype fp8_e4m3 --kv-scale '%s' "
                                     "--steps 0:1 --quiet", tu_bin(), trace, db, bad_scales[i]), 2);
        assert_true(file_has(log, "--kv-scale must be a positive number"));
    }
    /* a negative seed is refused, not wrapped to 2^64 - 1 */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --seed -1 --steps 0:1 --quiet", tu_bin(),
                            trace, db), 2);
    assert_true(file_has(log, "--seed must be an unsigned integer"));
    /* a seed is decimal, as in a trace header: no hex, no sign, no blanks (010 is ten, below) */
    static const char *const bad_seeds[] = { "0x10", "+5", " 5", "18446744073709551616", "" };
    for (size_t i = 0; i < sizeof bad_seeds / sizeof bad_seeds[0]; i++) {
        assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --seed '%s' --steps 0:1 --quiet",
                                tu_bin(), trace, db, bad_seeds[i]), 2);
        assert_true(file_has(log, "--seed must be an unsigned integer in decimal"));
    }
    /* the device verifier's memory: a size, at least 64 MiB */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --verify-mem lots", tu_bin(), trace, db), 2);
    assert_true(file_has(log, "--verify-mem takes a size"));
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --verify-mem 1MiB", tu_bin(), trace, db), 2);
    assert_true(file_has(log, "at least 64MiB"));
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs"), 4);
    /* ... and on a host backend it changes nothing */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --verify-mem 2GiB --steps 0:3 --quiet",
                            tu_bin(), trace, db), 0);
    /* --kv-scale with an fp8 cache is fine */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --kv-dtype fp8_e4m3 --kv-scale 2 "
                                 "--steps 0:3 --quiet", tu_bin(), trace, db), 0);
    /* the fault does fire where cascade runs */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --inject merge-no-weights --cascade on "
                                 "--quiet", tu_bin(), prefix, db), 1);
    /* a leading zero does not make the seed octal: --seed 010 is ten, not eight */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --seed 010 --steps 0:1 --quiet", tu_bin(),
                            trace, db), 0);
    assert_int_equal(tu_query_int(db, "SELECT seed FROM runs ORDER BY id DESC LIMIT 1"), 10);
}

/* --db where no database can be: the system's reason, exit 2, nothing written. */
static void test_db_path_errors(void **state)
{
    (void)state;
    char trace[512], log[512], dir[512];
    tu_tmp("dbpath.log", log, sizeof log);
    sample("mixed", trace, sizeof trace);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db /nonexistent-dir-ar/x.db", tu_bin(), trace), 2);
    assert_true(file_has(log, "/nonexistent-dir-ar: No such file or directory"));
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db /dev/null/x.db", tu_bin(), trace), 2);
    assert_true(file_has(log, "Not a directory"));
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s'", tu_bin(), trace, tu_tmpdir()), 2);
    assert_true(file_has(log, "Is a directory"));
    /* a FIFO or a device: refused before anything runs (it was exit 3, "disk I/O error (Illegal
     * seek)"), for merge's OUT too */
    char fifo[512];
    tu_tmp("results-fifo.db", fifo, sizeof fifo);
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(tu_run(log, "timeout 20 '%s' replay '%s' --db '%s' --backend cpu --steps 0:1", tu_bin(), trace, fifo), 2);
    assert_true(file_has(log, "not a regular file"));
    assert_int_equal(tu_run(log, "timeout 20 '%s' merge '%s' '%s'", tu_bin(), fifo, trace), 2);
    assert_true(file_has(log, "not a regular file"));
    unlink(fifo);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db /dev/null --backend cpu --steps 0:1", tu_bin(), trace), 2);
    assert_true(file_has(log, "not a regular file"));
    tu_tmp("readonly-dir", dir, sizeof dir);
    assert_int_equal(tu_run(NULL, "mkdir -p '%s' && chmod 0500 '%s'", dir, dir), 0);
    if (geteuid() != 0) {   /* root may write anywhere */
        assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s/x.db'", tu_bin(), trace, dir), 2);
        assert_true(file_has(log, "Permission denied"));
    } else {
        print_message("running as root: the unwritable-directory case is skipped\n");
    }
    tu_run(NULL, "chmod 0700 '%s'", dir);
}

static void test_help_flags(void **state)
{
    (void)state;
    char out[512];
    tu_tmp("help.txt", out, sizeof out);
    const char *flags[2] = {"-h", "--help"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(tu_run(NULL, "'%s' replay %s >'%s' 2>/dev/null", tu_bin(), flags[i], out), 0);
        assert_true(file_has(out, "usage: attnreplay replay"));
        assert_true(file_has(out, "--verify-layers"));
        assert_true(file_has(out, "143 SIGTERM"));
    }
}

/* On a terminal a live progress line: steps done / total (counted from the trace), steps/s and
 * an ETA; --quiet silences it.  The terminal is script(1)'s pseudo-terminal. */
static void test_progress_line_on_a_terminal(void **state)
{
    (void)state;
    char trace[512], db[512], log[512];
    if (tu_run(NULL, "command -v script >/dev/null 2>&1") != 0) {
        print_message("script(1) not found: no pseudo-terminal to test on; skipped\n");
        skip();
    }
    tu_tmp("progress.db", db, sizeof db);
    tu_tmp("progress.log", log, sizeof log);
    sample("prefix", trace, sizeof trace);
    int64_t total = trace_steps(trace);
    assert_int_equal(tu_run(NULL, "script -qec \"'%s' replay '%s' --db '%s' --backend cpu\" /dev/null > '%s' 2>&1",
                            tu_bin(), trace, db, log), 0);
    char want[64];
    snprintf(want, sizeof want, "%lld / %lld steps (100%%)", (long long)total, (long long)total);
    assert_true(file_has(log, want));
    assert_true(file_has(log, "steps/s  ETA "));
    assert_true(file_has(log, "result    passed"));
    assert_int_equal(tu_run(NULL, "script -qec \"'%s' replay '%s' --db '%s' --backend cpu --quiet\" /dev/null > '%s' 2>&1",
                            tu_bin(), trace, db, log), 0);
    char *text = tu_slurp(log);
    assert_non_null(text);
    assert_null(strstr(text, "steps/s"));
    assert_null(strstr(text, "result"));
    free(text);
}

static void test_backends_table_explains(void **state)
{
    (void)state;
    char trace[512], log[512];
    tu_tmp("backends.log", log, sizeof log);
    sample("mixed", trace, sizeof trace);
    assert_int_equal(tu_run(log, "'%s' backends --trace '%s'", tu_bin(), trace), 0);
    char *text = tu_slurp(log);
    assert_non_null(text);
    assert_non_null(strstr(text, "cpu"));
    assert_non_null(strstr(text, "cuda"));
    assert_non_null(strstr(text, "CHOSEN"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean_replay_passes_and_is_stored),
        cmocka_unit_test(test_every_fault_flagged_on_every_sample),
        cmocka_unit_test(test_merge_fault_flagged_when_cascade_runs),
        cmocka_unit_test(test_cascade_verdict_wording),
        cmocka_unit_test(test_kill_and_resume),
        cmocka_unit_test(test_steps_range_fills_missing_context),
        cmocka_unit_test(test_verify_off_and_sample_are_labelled),
        cmocka_unit_test(test_summary_times_have_short_units),
        cmocka_unit_test(test_dump_step_writes_npy),
        cmocka_unit_test(test_bad_input_exit_codes),
        cmocka_unit_test(test_backends_table_explains),
        cmocka_unit_test(test_overlap_gives_the_same_rows),
        cmocka_unit_test(test_verify_layers_policy),
        cmocka_unit_test(test_nothing_verified_is_not_passed),
        cmocka_unit_test(test_db_path_errors),
        cmocka_unit_test(test_help_flags),
        cmocka_unit_test(test_progress_line_on_a_terminal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
