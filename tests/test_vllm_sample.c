/* test_vllm_sample.c - the trace recorded from vLLM 0.33's real V1 scheduler
 * (traces/samples/vllm.trace.jsonl.gz, README "Recording a trace from vLLM"): the reader accepts
 * every step and sees what vLLM decided (prefix hits, preemptions each followed by a resumption,
 * common prefixes, finished requests), `attnreplay info` summarises it and it replays on the CPU
 * backend with every step passing.  Step-by-step parity of the simulator with vLLM itself is
 * `make test-vllm` (tests/vllm). */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../traces/trace.h"

/* ---- the trace recorded from vLLM 0.33's scheduler ------------------------------------------ */

static const char *sample_path(char *buf, size_t len)
{
    snprintf(buf, len, "%s/traces/samples/vllm.trace.jsonl.gz", tu_src_dir());
    return buf;
}

static void test_vllm_sample_reads(void **state)
{
    (void)state;
    char path[1024], err[AR_ERR_MAX];
    ar_trace_reader *r = ar_trace_open(sample_path(path, sizeof path), err, sizeof err);
    if (!r) fail_msg("%s", err);
    const ar_trace_header *h = ar_trace_header_of(r);
    assert_int_equal(strncmp(h->source, "vllm-0.33.0", 11), 0);
    assert_int_equal(h->cache.block_size, 16);
    const ar_step *st;
    int rc, steps = 0, hits = 0, resumed = 0, resumed_hit = 0, preempted = 0, finished = 0, common = 0;
    while ((rc = ar_trace_next(r, &st, err, sizeof err)) == 1) {
        steps++;
        for (int i = 0; i < st->num_new; i++) hits += st->new_reqs[i].num_computed_tokens > 0;
        for (int i = 0; i < st->num_cached; i++)
            if (st->cached[i].resumed) {
                resumed++;
                resumed_hit += st->cached[i].num_computed_tokens > 0;
            }
        preempted += st->num_preempted;
        finished += st->num_finished;
        common += st->num_common_prefix_blocks > 0;
    }
    if (rc < 0) fail_msg("%s", err);
    ar_trace_close(r);
    /* what vLLM decided: prefix hits, preemptions each followed by a resumption (some hitting
     * their own blocks), common prefixes, and every request but those still running at the end
     * listed as finished */
    assert_true(steps > 100);
    assert_true(hits > 5);
    assert_true(preempted > 0);
    assert_int_equal(resumed, preempted);
    assert_true(resumed_hit > 0);
    assert_true(common > 0);
    assert_true(finished >= 10);
}

static void test_vllm_sample_info_and_replay(void **state)
{
    (void)state;
    char path[1024], log[512], db[512];
    sample_path(path, sizeof path);
    tu_tmp("vllm-info.log", log, sizeof log);
    assert_int_equal(tu_run(log, "'%s' info '%s'", tu_bin(), path), 0);
    char *text = tu_slurp(log);
    assert_non_null(strstr(text, "source \"vllm-0.33.0\""));
    free(text);
    tu_tmp("vllm.db", db, sizeof db);
    tu_tmp("vllm-replay.log", log, sizeof log);
    int rc = tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 2", tu_bin(), path, db);
    text = tu_slurp(log);
    if (rc != 0) fail_msg("replay exited %d:\n%s", rc, text);
    assert_non_null(strstr(text, " 0 failed, 0 unverified"));
    assert_non_null(strstr(text, "result    passed"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vllm_sample_reads),
        cmocka_unit_test(test_vllm_sample_info_and_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
