/* test_replay.c - the replay engine end to end through bin/attnreplay: exit codes, every planted
 * fault flagged on every sample trace, the database's contents, kill -9 and --resume, --steps,
 * --dump-step, bad input, and the summary's cascade verdict. */
#include "testutil.h"

#include "../replay/replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const samples[] = {"mixed", "chunked", "prefix", "preempt"};
#define NUM_SAMPLES (sizeof samples / sizeof samples[0])

static const char *sample(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/traces/samples/%s.trace.jsonl.gz", tu_src_dir(), name);
    return buf;
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
    assert_string_equal(status, "1");
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
    tu_tmp("dump", dir, sizeof dir);
    sample("mixed", trace, sizeof trace);
    assert_int_equal(tu_run(NULL, "mkdir -p '%s'", dir), 0);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --steps 0:3 --dump-step 2 --dump-dir '%s' --quiet",
                            tu_bin(), trace, db, dir), 0);
    snprintf(path, sizeof path, "%s/index.json", dir);
    char *idx = tu_slurp(path);
    assert_non_null(idx);
    assert_non_null(strstr(idx, "\"step\": 2"));
    free(idx);
    snprintf(path, sizeof path, "%s/L0_r0_ref_out.npy", dir);
    char *npy = tu_slurp(path);
    assert_non_null(npy);
    assert_memory_equal(npy + 1, "NUMPY", 5);
    assert_non_null(strstr(npy + 10, "'descr': '<f8'"));
    free(npy);
    snprintf(path, sizeof path, "%s/L0_r0_k.npy", dir);
    assert_int_equal(access(path, R_OK), 0);
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
        cmocka_unit_test(test_dump_step_writes_npy),
        cmocka_unit_test(test_bad_input_exit_codes),
        cmocka_unit_test(test_backends_table_explains),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
