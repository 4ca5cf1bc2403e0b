/* test_sim.c - the scheduler simulator: invariants checked every step (block conservation,
 * shared blocks only with equal content keys, non-negative reference counts, budget and
 * max_num_seqs, exact output lengths, monotone computed tokens), vLLM V1 edge cases each on
 * its own (hit cap, full-prompt recompute, LRU eviction, tail-first freeing, preemption of the
 * last running request, resume with a fresh lookup, no admissions in a preempting step,
 * chunked prefill and the long-prefill threshold, num_common_prefix_blocks), vLLM 0.33's
 * behaviours next to the older ones their compat options select (admission reserving the whole
 * prompt, the free order of unkeyed blocks, a resumed request hitting its own generated
 * blocks), the skip messages, the step-time models, and the command end to end (its traces
 * pass the trace reader's validation; replay through the CPU backend when available). */
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../sim/sim.h"

/* ---- helpers ------------------------------------------------------------------------------------ */

static ar_sim_config make_cfg(int block_size, int num_blocks, int budget, int max_seqs, bool prefix)
{
    ar_sim_config c;
    memset(&c, 0, sizeof c);
    c.header.version = AR_TRACE_VERSION;
    c.header.model = ar_model_preset_find("llama-3.1-8b")->model;
    c.header.cache.block_size = block_size;
    c.header.cache.num_blocks = num_blocks;
    c.header.cache.dtype = AR_BF16;
    c.header.cache.kv_cache_dtype = AR_BF16;
    c.header.sched.max_num_batched_tokens = budget;
    c.header.sched.max_num_seqs = max_seqs;
    c.header.sched.prefix_caching = prefix;
    c.steptime.kind = AR_STEPTIME_CONSTANT;
    c.steptime.constant_s = 0.01;
    c.num_sms = 132;
    return c;
}

static void push(ar_workload *wl, double arrival, int prompt, int output, const uint64_t *payloads, int n)
{
    char err[256];
    assert_int_equal(ar_workload_push(wl, arrival, prompt, output, payloads, n, 0, err, sizeof err), 0);
}

/* The invariants, each checked on its own (a test names the ones it checks). */
enum {
    CHK_CONSERVATION = 1,   /* free + held + null = total, the null block never held */
    CHK_SHARED_KEYS = 2,    /* a block held by two requests only when their content keys agree */
    CHK_REFS = 4,           /* reference counts never negative and equal to the holders */
    CHK_BUDGET = 8,         /* token budget and max_num_seqs never exceeded */
    CHK_MONOTONE = 16,      /* computed tokens monotone except at preemption */
    CHK_OUTPUT = 32,        /* every request finishes with exactly its output length */
    CHK_PREEMPT_STEP = 64   /* no admissions in a step that preempts */
};

/* Checks the selected invariants after a step; prev arrays carry each request's previous
 * num_computed_tokens and preemption count. */
static void check_invariants(const ar_sim *s, const ar_step *st, const ar_sim_config *cfg, int checks,
                             int *prev_computed, int *prev_preemptions)
{
    int nb = ar_sim_num_blocks(s);
    int *holders = calloc((size_t)nb, sizeof(int));
    int *owner = malloc((size_t)nb * sizeof(int));
    uint64_t *owner_key = calloc((size_t)nb, sizeof(uint64_t));
    assert_non_null(holders);
    assert_non_null(owner);
    assert_non_null(owner_key);
    for (int b = 0; b < nb; b++) owner[b] = -1;
    for (int i = 0; i < ar_sim_num_requests(s); i++) {
        ar_sim_req_info r;
        ar_sim_request(s, i, &r);
        for (int j = 0; j < r.num_blocks; j++) {
            int b = r.block_ids[j];
            if (checks & CHK_CONSERVATION) assert_true(b >= 1 && b < nb);   /* never the null block */
            holders[b]++;
            uint64_t key = ar_sim_logical_key(s, i, j);
            if ((checks & CHK_SHARED_KEYS) && owner[b] >= 0) assert_true(owner_key[b] == key);
            owner[b] = i;
            owner_key[b] = key;
        }
        if ((checks & CHK_CONSERVATION) && r.status == AR_REQ_RUNNING)
            assert_true(r.num_blocks * cfg->header.cache.block_size >= r.num_computed_tokens);
        if ((checks & CHK_MONOTONE) && r.num_preemptions == prev_preemptions[i])
            assert_true(r.num_computed_tokens >= prev_computed[i]);
        if ((checks & CHK_MONOTONE) && r.num_preemptions > prev_preemptions[i])
            assert_int_equal(r.status == AR_REQ_PREEMPTED ? r.num_computed_tokens : 0, 0);
        prev_computed[i] = r.num_computed_tokens;
        prev_preemptions[i] = r.num_preemptions;
        if (checks & CHK_OUTPUT) assert_true(r.num_output_tokens <= r.output_len);
    }
    int used = 0;
    for (int b = 0; b < nb; b++) {
        int ref = ar_sim_block_ref(s, b);
        if (checks & CHK_REFS) {
            assert_true(ref >= 0);
            assert_int_equal(ref, holders[b]);
        }
        used += ref > 0;
    }
    if (checks & CHK_CONSERVATION) {
        assert_int_equal(ar_sim_block_ref(s, 0), 0);
        assert_int_equal(ar_sim_free_blocks(s) + used + 1, nb);   /* free + held + null = total */
    }
    if (checks & CHK_BUDGET) {
        int total = 0;
        for (int k = 0; k < st->num_scheduled; k++) {
            assert_true(st->scheduled[k].num_tokens > 0);
            total += st->scheduled[k].num_tokens;
        }
        assert_true(total <= cfg->header.sched.max_num_batched_tokens);
        assert_true(st->num_scheduled <= cfg->header.sched.max_num_seqs);
        assert_true(ar_sim_num_running(s) <= cfg->header.sched.max_num_seqs);
    }
    if ((checks & CHK_PREEMPT_STEP) && st->num_preempted > 0) {
        assert_int_equal(st->num_new, 0);
        for (int k = 0; k < st->num_cached; k++) assert_false(st->cached[k].resumed);
    }
    free(holders);
    free(owner);
    free(owner_key);
}

/* Runs a workload to the end checking the selected invariants every step; returns the summary. */
static ar_sim_summary run_checked(const ar_workload *wl, const ar_sim_config *cfg, int checks)
{
    char err[512];
    ar_sim *s = ar_sim_create(cfg, wl, err, sizeof err);
    assert_non_null(s);
    int n = wl->num_reqs;
    int *prev_computed = calloc((size_t)n, sizeof(int));
    int *prev_preempt = calloc((size_t)n, sizeof(int));
    const ar_step *st;
    int rc;
    int64_t steps = 0;
    while ((rc = ar_sim_step(s, &st, err, sizeof err)) == 1) {
        check_invariants(s, st, cfg, checks, prev_computed, prev_preempt);
        steps++;
        assert_true(steps < 2000000);
    }
    assert_int_equal(rc, 0);
    for (int i = 0; i < n; i++) {
        ar_sim_req_info r;
        ar_sim_request(s, i, &r);
        if (r.status == AR_REQ_SKIPPED) continue;
        assert_int_equal(r.status, AR_REQ_FINISHED);
        if (checks & CHK_OUTPUT) assert_int_equal(r.num_output_tokens, r.output_len);
        if (checks & CHK_CONSERVATION) assert_int_equal(r.num_blocks, 0);
    }
    ar_sim_summary sum;
    ar_sim_summarize(s, &sum);
    if (checks & CHK_CONSERVATION) assert_int_equal(ar_sim_free_blocks(s), ar_sim_num_blocks(s) - 1);
    free(prev_computed);
    free(prev_preempt);
    ar_sim_destroy(s);
    return sum;
}

/* Steps until a step satisfying pred appears; returns it (NULL at the end). */
static const ar_step *step_until(ar_sim *s, int (*pred)(const ar_step *))
{
    char err[512];
    const ar_step *st;
    while (ar_sim_step(s, &st, err, sizeof err) == 1)
        if (pred(st)) return st;
    return NULL;
}

static const ar_new_req *find_new(const ar_step *st, const char *id)
{
    for (int i = 0; i < st->num_new; i++)
        if (strcmp(st->new_reqs[i].req, id) == 0) return &st->new_reqs[i];
    return NULL;
}

static int tokens_of(const ar_step *st, const char *id)
{
    for (int i = 0; i < st->num_scheduled; i++)
        if (strcmp(st->scheduled[i].req, id) == 0) return st->scheduled[i].num_tokens;
    return 0;
}

/* ---- invariants under pressure --------------------------------------------------------------------- */

/* Two workloads under pressure, checked every step: 64 requests in 4 shared-prefix groups
 * arriving within ~0.3 s into a cache that holds only a few of them (preemption, eviction and
 * prefix hits all happen), and 40 requests of mixed lengths with a long-prefill threshold. */
static void run_pressure(int checks)
{
    ar_workload wl;
    char err[512];
    assert_int_equal(ar_workload_synthetic("groups=4,prompts=16,system=200,question=40,output=60,rate=200,seed=3", 16,
                                           &wl, err, sizeof err), 0);
    ar_sim_config cfg = make_cfg(16, 120, 256, 16, true);
    ar_sim_summary sum = run_checked(&wl, &cfg, checks);
    assert_int_equal(sum.num_finished, 64);
    assert_true(sum.preemptions > 0);           /* the workload really exercises preemption */
    assert_true(sum.prefix_hit_tokens > 0);     /* and sharing */
    assert_int_equal(sum.output_tokens, 64 * 60);
    ar_workload_free(&wl);
    ar_workload_init(&wl, 16, "memory");
    uint64_t shared[8] = {11, 12, 13, 14, 15, 16, 17, 18};
    for (int i = 0; i < 40; i++)
        push(&wl, 0.003 * i, 17 + (i * 37) % 300, 1 + (i * 13) % 50, shared, i % 3 == 0 ? 8 : 0);
    cfg = make_cfg(16, 64, 128, 8, true);
    cfg.long_prefill_token_threshold = 48;
    sum = run_checked(&wl, &cfg, checks);
    assert_int_equal(sum.num_finished, 40);
    assert_true(sum.preemptions > 0);
    ar_workload_free(&wl);
}

static void test_invariant_block_conservation(void **state) { (void)state; run_pressure(CHK_CONSERVATION); }
static void test_invariant_shared_blocks_have_equal_keys(void **state) { (void)state; run_pressure(CHK_SHARED_KEYS); }
static void test_invariant_refcounts_never_negative(void **state) { (void)state; run_pressure(CHK_REFS); }
static void test_invariant_budget_and_max_num_seqs(void **state) { (void)state; run_pressure(CHK_BUDGET); }
static void test_invariant_computed_monotone_except_preemption(void **state) { (void)state; run_pressure(CHK_MONOTONE); }
static void test_invariant_exact_output_lengths(void **state) { (void)state; run_pressure(CHK_OUTPUT); }
/* Also a case built so the victim could be re-admitted at once: it shares its prefix with the
 * request that preempts it (those hits are not evictable) and a small long-prefill threshold
 * keeps its first recompute chunk to one block, so only vLLM's rule keeps it waiting. */
static void test_no_admissions_in_a_preempting_step(void **state)
{
    (void)state;
    run_pressure(CHK_PREEMPT_STEP);
    uint64_t shared[4] = {71, 72, 73, 74};
    int preempting_configs = 0;
    for (int nb = 8; nb <= 20; nb++) {
        ar_workload wl;
        ar_workload_init(&wl, 16, "memory");
        push(&wl, 0, 80, 60, shared, 4);
        push(&wl, 0, 112, 60, shared, 4);
        ar_sim_config cfg = make_cfg(16, nb, 2048, 8, true);
        cfg.long_prefill_token_threshold = 16;
        ar_sim_summary sum = run_checked(&wl, &cfg, CHK_PREEMPT_STEP | CHK_CONSERVATION);
        preempting_configs += sum.preemptions > 0;
        ar_workload_free(&wl);
    }
    assert_true(preempting_configs > 0);
}

static void test_no_prefix_caching_never_shares(void **state)
{
    (void)state;
    ar_workload wl;
    ar_workload_init(&wl, 16, "memory");
    uint64_t shared[4] = {1, 2, 3, 4};
    for (int i = 0; i < 6; i++) push(&wl, 0, 80, 3, shared, 4);
    ar_sim_config cfg = make_cfg(16, 200, 2048, 16, false);
    char err[256];
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    const ar_step *st;
    while (ar_sim_step(s, &st, err, sizeof err) == 1) {
        assert_int_equal(st->num_common_prefix_blocks, 0);
        for (int i = 0; i < st->num_new; i++) assert_int_equal(st->new_reqs[i].num_computed_tokens, 0);
        for (int b = 1; b < ar_sim_num_blocks(s); b++) assert_true(ar_sim_block_ref(s, b) <= 1);
    }
    ar_sim_destroy(s);
    ar_workload_free(&wl);
}

/* ---- vLLM edge cases ---------------------------------------------------------------------------- */

static int has_new(const ar_step *st) { return st->num_new > 0; }

/* A second request with the same block-aligned prompt hits all but its last block. */
static void test_full_cached_prompt_recomputes_last_block(void **state)
{
    (void)state;
    ar_workload wl;
    ar_workload_init(&wl, 16, "memory");
    uint64_t p[4] = {7, 8, 9, 10};
    push(&wl, 0, 64, 1, p, 4);
    push(&wl, 1.0, 64, 1, p, 4);
    ar_sim_config cfg = make_cfg(16, 32, 2048, 8, true);
    char err[256];
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    const ar_step *st = step_until(s, has_new);
    assert_int_equal(st->new_reqs[0].num_computed_tokens, 0);
    st = step_until(s, has_new);
    assert_non_null(st);
    const ar_new_req *r1 = find_new(st, "r1");
    assert_non_null(r1);
    assert_int_equal(r1->num_computed_tokens, 48);   /* 3 of 4 blocks: at least one token computed */
    assert_int_equal(tokens_of(st, "r1"), 16);
    assert_int_equal(r1->num_block_keys, 4);
    ar_sim_destroy(s);
    ar_workload_free(&wl);
}

/* An unaligned prompt hits every full block; the partial tail is computed. */
static void test_unaligned_prompt_hits_all_full_blocks(void **state)
{
    (void)state;
    ar_workload wl;
    ar_workload_init(&wl, 16, "memory");
    uint64_t p[4] = {7, 8, 9, 10};
    push(&wl, 0, 70, 1, p, 4);
    push(&wl, 1.0, 70, 1, p, 4);
    push(&wl, 2.0, 70, 1, p, 2);    /* shares only the first two blocks */
    ar_sim_config cfg = make_cfg(16, 32, 2048, 8, true);
    char err[256];
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    step_until(s, has_new);
    const ar_step *st = step_until(s, has_new);
    assert_int_equal(find_new(st, "r1")->num_computed_tokens, 64);
    assert_int_equal(tokens_of(st, "r1"), 6);
    st = step_until(s, has_new);
    assert_int_equal(find_new(st, "r2")->num_computed_tokens, 32);
    assert_int_equal(tokens_of(st, "r2"), 38);
    ar_sim_destroy(s);
    ar_workload_free(&wl);
}

/* Freed blocks go to the free queue's tail, last block first; allocation takes the head, so
 * the least recently used cached blocks are evicted first and a prefix survives longest. */
static void test_lru_eviction_and_tail_first_free(void **state)
{
    (void)state;
    ar_workload wl;
    ar_workload_init(&wl, 16, "memory");
    uint64_t pa[3] = {101, 102, 103};
    push(&wl, 0, 48, 1, pa, 3);      /* r0: blocks 1,2,3; freed -> queue 4..7,3,2,1 */
    push(&wl, 1.0, 32, 1, NULL, 0);  /* r1: takes 4,5 */
    push(&wl, 2.0, 48, 1, NULL, 0);  /* r2: takes 6,7 and evicts 3 (r0's last block) */
    push(&wl, 3.0, 48, 1, pa, 3);    /* r3: r0's prompt: blocks 1,2 are still cached */
    ar_sim_config cfg = make_cfg(16, 8, 2048, 8, true);
    char err[256];
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    const ar_step *st = step_until(s, has_new);
    const ar_new_req *r = find_new(st, "r0");
    assert_int_equal(r->num_block_ids, 3);
    assert_int_equal(r->block_ids[0], 1);
    assert_int_equal(r->block_ids[2], 3);
    st = step_until(s, has_new);
    r = find_new(st, "r1");
    assert_int_equal(r->block_ids[0], 4);
    assert_int_equal(r->block_ids[1], 5);
    st = step_until(s, has_new);
    r = find_new(st, "r2");
    assert_int_equal(r->block_ids[0], 6);
    assert_int_equal(r->block_ids[1], 7);
    assert_int_equal(r->block_ids[2], 3);
    st = step_until(s, has_new);
    r = find_new(st, "r3");
    assert_int_equal(r->num_computed_tokens, 32);
    assert_int_equal(r->block_ids[0], 1);
    assert_int_equal(r->block_ids[1], 2);
    ar_sim_destroy(s);
    ar_workload_free(&wl);
}

static int has_preempted(const ar_step *st) { return st->num_preempted > 0; }

static int has_resumed(const ar_step *st)
{
    for (int i = 0; i < st->num_cached; i++)
        if (st->cached[i].resumed) return 1;
    return 0;
}

/* Out of blocks while decoding: the LAST running request is preempted (blocks freed, listed
 * in preempted, not scheduled); it comes back resumed with a replacing block list after a
 * fresh prefix lookup. */
static void test_preempt_last_running_and_resume(void **state)
{
    (void)state;
    ar_workload wl;
    ar_workload_init(&wl, 16, "memory");
    for (int i = 0; i < 3; i++) push(&wl, 0, 16, 20, NULL, 0);
    ar_sim_config cfg = make_cfg(16, 5, 2048, 8, true);   /* 4 usable blocks */
    char err[256];
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    const ar_step *st = step_until(s, has_preempted);
    assert_non_null(st);
    assert_int_equal(st->num_preempted, 1);
    assert_string_equal(st->preempted[0], "r2");
    assert_int_equal(tokens_of(st, "r2"), 0);
    assert_int_equal(tokens_of(st, "r0"), 1);
    assert_int_equal(tokens_of(st, "r1"), 1);
    ar_sim_req_info info;
    ar_sim_request(s, 2, &info);
    assert_int_equal(info.num_blocks, 0);
    assert_int_equal(info.num_preemptions, 1);
    assert_int_equal(info.num_output_tokens, 1);
    st = step_until(s, has_resumed);
    assert_non_null(st);
    const ar_cached_req *c = NULL;
    for (int i = 0; i < st->num_cached; i++)
        if (st->cached[i].resumed) c = &st->cached[i];
    int n = tokens_of(st, c->req);
    assert_true(n > 0);
    assert_int_equal(c->num_computed_tokens % 16, 0);
    /* the full list replaces the old one and covers computed + n */
    assert_int_equal(c->num_new_block_ids, (c->num_computed_tokens + n + 15) / 16);
    ar_sim_destroy(s);
    ar_workload_free(&wl);
}

/* A resumed request recomputes prompt + generated tokens minus its prefix hit. */
static void test_resume_recomputes_generated_tokens(void **state)
{
    (void)state;
    ar_workload wl;
    ar_workload_init(&wl, 16, "memory");
    push(&wl, 0, 40, 30, NULL, 0);
    push(&wl, 0, 40, 30, NULL, 0);
    ar_sim_config cfg = make_cfg(16, 7, 2048, 8, true);   /* 6 usable blocks: both need 5 at the end */
    char err[256];
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    const ar_step *st = step_until(s, has_preempted);
    assert_non_null(st);
    assert_string_equal(st->preempted[0], "r1");
    ar_sim_req_info info;
    ar_sim_request(s, 1, &info);
    int generated = info.num_output_tokens;
    assert_true(generated > 0);
    st = step_until(s, has_resumed);
    assert_non_null(st);
    const ar_cached_req *c = &st->cached[st->num_cached - 1];
    assert_true(c->resumed);
    assert_int_equal(c->num_computed_tokens + tokens_of(st, "r1"), 40 + generated);
    ar_sim_destroy(s);
    ar_workload_free(&wl);
}

static void test_chunked_prefill_budget_and_threshold(void **state)
{
    (void)state;
    ar_workload wl;
    ar_workload_init(&wl, 16, "memory");
    push(&wl, 0, 5000, 2, NULL, 0);
    ar_sim_config cfg = make_cfg(16, 1000, 2048, 8, true);
    char err[256];
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    const ar_step *st;
    int expect[] = {2048, 2048, 904, 1};
    for (int k = 0; k < 4; k++) {
        assert_int_equal(ar_sim_step(s, &st, err, sizeof err), 1);
        assert_int_equal(st->scheduled[0].num_tokens, expect[k]);
        if (k > 0) assert_int_equal(st->num_cached, 1);
    }
    ar_sim_destroy(s);
    /* vLLM 0.33 lifts the threshold for a request that is alone (nobody to starve); older vLLM
     * (compat.threshold_when_alone) chunked it all the same */
    cfg.long_prefill_token_threshold = 32;
    ar_workload_free(&wl);
    ar_workload_init(&wl, 16, "memory");
    push(&wl, 0, 100, 2, NULL, 0);
    for (int old = 0; old < 2; old++) {
        cfg.compat.threshold_when_alone = old;
        s = ar_sim_create(&cfg, &wl, err, sizeof err);
        int expect_now[] = {100, 1}, expect_old[] = {32, 32, 32, 4, 1};
        int n = old ? 5 : 2;
        for (int k = 0; k < n; k++) {
            assert_int_equal(ar_sim_step(s, &st, err, sizeof err), 1);
            assert_int_equal(st->scheduled[0].num_tokens, old ? expect_old[k] : expect_now[k]);
        }
        assert_int_equal(ar_sim_step(s, &st, err, sizeof err), 0);
        ar_sim_destroy(s);
    }
    /* two requests waiting: the threshold applies to both */
    cfg.compat.threshold_when_alone = false;
    push(&wl, 0, 100, 2, NULL, 0);
    s = ar_sim_create(&cfg, &wl, err, sizeof err);
    assert_int_equal(ar_sim_step(s, &st, err, sizeof err), 1);
    assert_int_equal(st->num_scheduled, 2);
    assert_int_equal(st->scheduled[0].num_tokens, 32);
    assert_int_equal(st->scheduled[1].num_tokens, 32);
    ar_sim_destroy(s);
    ar_workload_free(&wl);
}

/* Steps until a step admits `req` as new; returns that entry (valid until the next step). */
static const ar_new_req *step_until_new(ar_sim *s, const char *req)
{
    char err[256];
    const ar_step *st;
    while (ar_sim_step(s, &st, err, sizeof err) == 1)
        for (int i = 0; i < st->num_new; i++)
            if (strcmp(st->new_reqs[i].req, req) == 0) return &st->new_reqs[i];
    fail_msg("%s never admitted", req);
    return NULL;
}

/* Freed blocks without a key go to the head of the free queue (the request's last block first),
 * keyed ones to its tail; --fifo-free puts them all at the tail. */
static void test_free_order(void **state)
{
    (void)state;
    for (int prefix = 0; prefix < 2; prefix++)
        for (int fifo = 0; fifo < 2; fifo++) {
            ar_workload wl;
            ar_workload_init(&wl, 16, "memory");
            push(&wl, 0, 40, 1, NULL, 0);     /* r0: blocks 1, 2 full, 3 partial */
            push(&wl, 1.0, 48, 1, NULL, 0);   /* r1: 3 blocks, after r0 is freed */
            ar_sim_config cfg = make_cfg(16, 8, 2048, 8, prefix);
            cfg.compat.fifo_free = fifo;
            char err[256];
            ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
            assert_non_null(s);
            const ar_new_req *r = step_until_new(s, "r0");
            assert_int_equal(r->block_ids[2], 3);
            r = step_until_new(s, "r1");
            /* free queue after r0: fifo 4 5 6 7 3 2 1; 0.33 without prefix caching 3 2 1 4 5 6 7,
             * with it (1 and 2 are keyed) 3 4 5 6 7 2 1 */
            int want[3][3] = {{4, 5, 6}, {3, 2, 1}, {3, 4, 5}};
            int *w = fifo ? want[0] : prefix ? want[2] : want[1];
            for (int k = 0; k < 3; k++) assert_int_equal(r->block_ids[k], w[k]);
            ar_sim_destroy(s);
            ar_workload_free(&wl);
        }
}

/* A waiting request is admitted only when its whole prompt fits (scheduler_reserve_full_isl);
 * --no-reserve-full-isl admits it as soon as its first chunk fits. */
static void test_admission_reserves_the_whole_prompt(void **state)
{
    (void)state;
    for (int old = 0; old < 2; old++) {
        ar_workload wl;
        ar_workload_init(&wl, 16, "memory");
        push(&wl, 0, 64, 20, NULL, 0);   /* r0: 4 blocks, a 5th at its first decode */
        push(&wl, 0, 64, 20, NULL, 0);   /* r1: 4 blocks; 2 are free while r0 decodes */
        ar_sim_config cfg = make_cfg(16, 8, 32, 8, true);   /* 7 usable blocks, 32 tokens a step */
        cfg.compat.no_reserve_full_isl = old;
        char err[256];
        ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
        const ar_step *st;
        for (int k = 0; k < 2; k++) {   /* r0's prompt in two chunks of 32: r1 gets no budget */
            assert_int_equal(ar_sim_step(s, &st, err, sizeof err), 1);
            assert_int_equal(st->num_scheduled, 1);
            assert_int_equal(st->scheduled[0].num_tokens, 32);
        }
        assert_int_equal(ar_sim_step(s, &st, err, sizeof err), 1);   /* r0 decodes into block 5 */
        assert_int_equal(st->scheduled[0].num_tokens, 1);
        if (old) {
            assert_int_equal(st->num_new, 1);   /* r1's first chunk of 31 tokens fits 2 blocks */
            assert_int_equal(st->scheduled[1].num_tokens, 31);
        } else {
            assert_int_equal(st->num_new, 0);   /* r1's 4 blocks do not fit the 2 free */
            assert_int_equal(st->num_scheduled, 1);
        }
        ar_sim_destroy(s);
        ar_workload_free(&wl);
    }
}

/* Generated tokens' full blocks are cached too: a preempted request re-admitted while they are
 * still cached hits them, past its prompt. */
static void test_resume_hits_own_generated_blocks(void **state)
{
    (void)state;
    ar_workload wl;
    ar_workload_init(&wl, 16, "memory");
    push(&wl, 0, 16, 60, NULL, 0);   /* each grows to 5 blocks; 7 are usable: r1 is preempted */
    push(&wl, 0, 16, 60, NULL, 0);
    ar_sim_config cfg = make_cfg(16, 8, 2048, 8, true);
    char err[256];
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    const ar_step *st;
    int preempted = 0, resumed_hit = -1;
    while (ar_sim_step(s, &st, err, sizeof err) == 1) {
        preempted += st->num_preempted;
        for (int i = 0; i < st->num_cached; i++)
            if (st->cached[i].resumed) resumed_hit = st->cached[i].num_computed_tokens;
    }
    assert_int_equal(preempted, 1);
    assert_true(resumed_hit > 16);   /* beyond its one prompt block */
    assert_int_equal(resumed_hit % 16, 0);
    ar_sim_destroy(s);
    ar_workload_free(&wl);
}

/* A skipped request's message names the rule: max_model_len with its value, or the cache size. */
static void test_skip_messages_name_the_rule(void **state)
{
    (void)state;
    char out[512], log[512], workload[512];
    tu_tmp("skip.trace.jsonl", out, sizeof out);
    tu_tmp("skip.log", log, sizeof log);
    tu_tmp("skip.jsonl", workload, sizeof workload);   /* a short request runs: no run of none (exit 2) */
    assert_int_equal(tu_write(workload, "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 50, \"hash_ids\": [1]}\n"
                                        "{\"timestamp\": 5, \"input_length\": 10, \"output_length\": 2, \"hash_ids\": [2]}\n"), 0);
    int rc = tu_run(log, "'%s' sim --workload mooncake:'%s' --model llama-3.1-8b "
                    "--max-model-len 120 --out '%s' --quiet", tu_bin(), workload, out);
    char *text = tu_slurp(log);
    assert_non_null(text);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(text, "100 prompt + 50 output tokens exceed max_model_len 120"));
    assert_null(strstr(text, "blocks of"));
    free(text);
    rc = tu_run(log, "'%s' sim --workload mooncake:'%s' --model llama-3.1-8b "
                "--num-blocks 5 --out '%s' --quiet", tu_bin(), workload, out);
    text = tu_slurp(log);
    assert_non_null(text);
    assert_non_null(strstr(text, "100 prompt + 50 output tokens can never fit the KV cache (4 blocks of 16)"));
    assert_null(strstr(text, "max_model_len"));
    free(text);
}

static void test_max_num_seqs_and_finished_next_step(void **state)
{
    (void)state;
    ar_workload wl;
    ar_workload_init(&wl, 16, "memory");
    for (int i = 0; i < 5; i++) push(&wl, 0, 20, 2, NULL, 0);
    ar_sim_config cfg = make_cfg(16, 100, 2048, 2, true);
    char err[256];
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    const ar_step *st;
    assert_int_equal(ar_sim_step(s, &st, err, sizeof err), 1);
    assert_int_equal(st->num_scheduled, 2);
    assert_int_equal(st->num_finished, 0);
    assert_int_equal(ar_sim_step(s, &st, err, sizeof err), 1);   /* r0, r1 decode their 2nd token: done */
    assert_int_equal(st->num_scheduled, 2);
    assert_int_equal(st->num_finished, 0);
    assert_int_equal(ar_sim_step(s, &st, err, sizeof err), 1);   /* listed the step after */
    assert_int_equal(st->num_finished, 2);
    assert_string_equal(st->finished[0], "r0");
    assert_non_null(find_new(st, "r2"));
    ar_sim_destroy(s);
    ar_workload_free(&wl);
}

/* num_common_prefix_blocks: running[0]'s leading blocks whose ref count equals the number of
 * requests holding blocks; one request that does not share the prefix makes it 0. */
static void test_num_common_prefix_blocks(void **state)
{
    (void)state;
    ar_workload wl;
    ar_workload_init(&wl, 16, "memory");
    uint64_t p[4] = {31, 32, 33, 34};
    push(&wl, 0, 80, 5, p, 4);
    push(&wl, 0, 80, 5, p, 4);     /* hits r0's blocks registered earlier in the same step */
    push(&wl, 0.015, 80, 5, NULL, 0);   /* joins while r0 and r1 still decode */
    push(&wl, 5.0, 80, 5, NULL, 0);     /* runs alone: all its blocks are common */
    ar_sim_config cfg = make_cfg(16, 100, 2048, 8, true);
    char err[256];
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    const ar_step *st;
    assert_int_equal(ar_sim_step(s, &st, err, sizeof err), 1);
    assert_int_equal(find_new(st, "r1")->num_computed_tokens, 64);
    assert_int_equal(st->num_common_prefix_blocks, 4);
    assert_int_equal(ar_sim_step(s, &st, err, sizeof err), 1);
    assert_int_equal(st->num_common_prefix_blocks, 4);
    st = step_until(s, has_new);
    assert_non_null(find_new(st, "r2"));
    assert_int_equal(st->num_common_prefix_blocks, 0);
    st = step_until(s, has_new);
    assert_non_null(find_new(st, "r3"));
    assert_int_equal(st->num_common_prefix_blocks, 5);
    ar_sim_destroy(s);
    ar_workload_free(&wl);
}

static void test_request_that_never_fits_is_skipped(void **state)
{
    (void)state;
    ar_workload wl;
    ar_workload_init(&wl, 16, "memory");
    push(&wl, 0, 30, 5, NULL, 0);
    push(&wl, 0, 1000, 5, NULL, 0);    /* needs 63 blocks; 9 usable */
    push(&wl, 0.5, 30, 5, NULL, 0);
    ar_sim_config cfg = make_cfg(16, 10, 2048, 8, true);
    ar_sim_summary sum = run_checked(&wl, &cfg, CHK_CONSERVATION | CHK_REFS | CHK_OUTPUT);
    assert_int_equal(sum.num_skipped, 1);
    assert_int_equal(sum.num_finished, 2);
    ar_workload_free(&wl);
}

/* A configuration under which no request of the workload can run (a KV cache too small for
 * any of them, or --max-model-len below every one) is refused, exit 2 naming the smallest
 * request and what it needs, the trace not written; before, every request was skipped and sim
 * wrote a trace of no steps with exit 0. One request that fits is enough to run. */
static void test_no_request_fits_is_refused(void **state)
{
    (void)state;
    char trace[512], workload[512], out[512];
    tu_tmp("nofit.trace.jsonl", trace, sizeof trace);
    tu_tmp("nofit_err.txt", out, sizeof out);
    tu_tmp("nofit.jsonl", workload, sizeof workload);
    assert_int_equal(tu_write(workload, "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 10, \"hash_ids\": [1]}\n"
                                        "{\"timestamp\": 5, \"input_length\": 40, \"output_length\": 2, \"hash_ids\": [2]}\n"), 0);
    struct { const char *args, *words; int rc; } cases[] = {
        { "--num-blocks 3", "nofit.jsonl:2 (40 prompt + 2 output tokens), needs 3 blocks", 2 },
        { "--max-model-len 20", "every one exceeds max_model_len 20", 2 },
        { "--num-blocks 4", "skipping request r0", 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unlink(trace);
        int rc = tu_run(out, "%s sim --workload mooncake:%s --model llama-3.1-8b %s --out %s --quiet 2>&1", tu_bin(),
                        workload, cases[i].args, trace);
        char *msg = tu_slurp(out);
        assert_non_null(msg);
        if (rc != cases[i].rc || !strstr(msg, cases[i].words)) fail_msg("%s: rc %d, output '%s'", cases[i].args, rc, msg);
        free(msg);
        assert_int_equal(access(trace, F_OK) == 0, cases[i].rc == 0);
    }
}

/* ---- presets and step time ---------------------------------------------------------------------- */

static void test_kv_sizing_and_step_time(void **state)
{
    (void)state;
    const ar_model_preset *l8 = ar_model_preset_find("llama-3.1-8b"), *ds = ar_model_preset_find("deepseek-v3");
    assert_non_null(l8);
    assert_non_null(ds);
    assert_non_null(ar_model_preset_find("llama-3.1-70b"));
    assert_non_null(ar_model_preset_find("qwen3-32b"));
    assert_null(ar_model_preset_find("gpt-2"));
    /* 32 layers x 16 tokens x (K+V) x 8 heads x 128 dims x 2 bytes = 2 MiB */
    assert_int_equal(ar_kv_bytes_per_block(&l8->model, 16, AR_BF16), 2097152);
    /* MLA: 61 layers x 16 tokens x 576 x 2 bytes */
    assert_int_equal(ar_kv_bytes_per_block(&ds->model, 16, AR_BF16), 61 * 16 * 576 * 2);
    assert_int_equal(ar_kv_bytes_per_block(&ds->model, 16, AR_FP8_E4M3), 61 * 16 * 576);
    /* Llama-3.1-8B has about 8.03 B parameters; DeepSeek-V3 671 B total, 37 B active */
    assert_true(fabs(ar_preset_total_params(l8) / 8.03e9 - 1) < 0.02);
    assert_true(fabs(ar_preset_total_params(ds) / 671e9 - 1) < 0.03);
    assert_true(fabs((ar_preset_active_params(ds) + 2.0 * 7168 * 129280) / 37e9 - 1) < 0.1);
    char err[256];
    ar_steptime st;
    assert_int_equal(ar_steptime_parse("constant:0.05", l8, &st, err, sizeof err), 0);
    ar_batch_features f = {.num_reqs = 1, .num_tokens = 1, .num_decode_reqs = 1, .kv_tokens_read = 100, .attn_pairs = 100};
    assert_true(ar_steptime_eval(&st, &f) == 0.05);
    assert_int_equal(ar_steptime_parse("linear:0.01,0.001,0.002,0.0001", l8, &st, err, sizeof err), 0);
    assert_true(fabs(ar_steptime_eval(&st, &f) - (0.01 + 0.001 + 0.002 + 0.01)) < 1e-12);
    assert_int_equal(ar_steptime_parse("roofline:rtx4090,overhead=0", l8, &st, err, sizeof err), 0);
    double t1 = ar_steptime_eval(&st, &f);
    /* one decode token streams all weights but the embedding: >= 7.5 GB x 2 bytes / 1008 GB/s */
    assert_true(t1 >= 7.5e9 * 2 / 1008e9);
    assert_true(t1 < 0.05);
    ar_batch_features big = {.num_reqs = 1, .num_tokens = 2048, .kv_tokens_read = 2048, .attn_pairs = 2048.0 * 1024.5};
    double t2 = ar_steptime_eval(&st, &big);
    /* a 2048-token prefill is compute bound: 2 x 7 G x 2048 FLOPs at the device table's share of 165 TFLOP/s */
    assert_true(t2 > 2.0 * 6.9e9 * 2048 / (165.2e12 * ar_device_find("rtx4090")->gemm_eff));
    assert_true(t2 > t1);
    assert_int_equal(ar_steptime_parse("roofline:tpu9", l8, &st, err, sizeof err), 2);
    assert_int_equal(ar_steptime_parse("roofline:h200,gemm_eff=2", l8, &st, err, sizeof err), 2);
    assert_int_equal(ar_steptime_parse("wobbly", l8, &st, err, sizeof err), 2);
    assert_int_equal(ar_steptime_parse("constant:-1", l8, &st, err, sizeof err), 2);
}

/* The fitted model recovers known coefficients from a replay database (schema of db.h). */
static void test_steptime_fitted_from_db(void **state)
{
    (void)state;
    char path[512], out[512], err[512];
    tu_tmp("fit.db", path, sizeof path);
    tu_tmp("fit.txt", out, sizeof out);
    char sql[16384];
    int len = snprintf(sql, sizeof sql,
                       "CREATE TABLE runs(id INTEGER PRIMARY KEY, layers INTEGER);"
                       "CREATE TABLE steps(run INTEGER, step INTEGER, num_tokens INTEGER, num_reqs INTEGER,"
                       " total_context INTEGER, time_us REAL);"
                       "INSERT INTO runs VALUES(1, 2);");
    /* per replayed layer (2 of 32): 20 us + 0.01 us/token + 0.5 us/request + 0.002 us/context token */
    for (int i = 0; i < 40; i++) {
        int tokens = 1 + (i * 37) % 500, reqs = 1 + (i * 7) % 30, ctx = 100 + (i * 911) % 9000;
        double us = 2 * (20 + 0.01 * tokens + 0.5 * reqs + 0.002 * ctx);
        len += snprintf(sql + len, sizeof sql - (size_t)len, "INSERT INTO steps VALUES(1,%d,%d,%d,%d,%.9f);", i, tokens,
                        reqs, ctx, us);
    }
    char cmd[17000];
    snprintf(cmd, sizeof cmd, "sqlite3 %s \"%s\"", path, sql);
    if (tu_run(out, "%s", cmd) != 0) skip();   /* no sqlite3 shell */
    double c[4];
    assert_int_equal(ar_steptime_fit_db(path, 0, 32, c, err, sizeof err), 40);
    double want[4] = {20e-6 * 32, 0.01e-6 * 32, 0.5e-6 * 32, 0.002e-6 * 32};
    for (int k = 0; k < 4; k++) assert_true(fabs(c[k] - want[k]) < 1e-6 * fabs(want[k]) + 1e-12);
    ar_steptime st;
    char spec[600];
    snprintf(spec, sizeof spec, "fitted:%s,run=1,device=h200,overhead=0", path);
    assert_int_equal(ar_steptime_parse(spec, ar_model_preset_find("llama-3.1-8b"), &st, err, sizeof err), 0);
    assert_int_equal(st.kind, AR_STEPTIME_FITTED);
    ar_batch_features f = {.num_reqs = 4, .num_tokens = 4, .num_decode_reqs = 4, .kv_tokens_read = 4000};
    ar_steptime roof;
    assert_int_equal(ar_steptime_parse("roofline:h200,overhead=0", ar_model_preset_find("llama-3.1-8b"), &roof, err,
                                       sizeof err), 0);
    /* same GEMM term as the roofline, attention from the fit */
    double attn = want[0] + want[1] * 4 + want[2] * 4 + want[3] * 4000;
    assert_true(ar_steptime_eval(&st, &f) > attn);
    assert_true(ar_steptime_eval(&st, &f) < ar_steptime_eval(&roof, &f) + attn);
    assert_int_equal(ar_steptime_fit_db(path, 7, 32, c, err, sizeof err), -1);
    snprintf(spec, sizeof spec, "fitted:%s.missing", path);
    assert_int_equal(ar_steptime_parse(spec, ar_model_preset_find("llama-3.1-8b"), &st, err, sizeof err), 2);
}

/* ---- the command end to end ------------------------------------------------------------------------ */

static int run_main(const char *line)
{
    char buf[2048];
    snprintf(buf, sizeof buf, "%s", line);
    char *argv[64];
    int argc = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, " ", &save); t && argc < 63; t = strtok_r(NULL, " ", &save)) argv[argc++] = t;
    argv[argc] = NULL;
    return ar_sim_main(argc, argv);
}

static void expect_valid_trace(const char *trace, int64_t requests)
{
    ar_trace_stats st;
    ar_trace_header h;
    char err[AR_ERR_MAX];
    if (ar_trace_stats_compute(trace, &st, &h, err, sizeof err) != 0) fail_msg("invalid trace: %s", err);
    assert_int_equal(st.requests, requests);
    assert_string_equal(h.source, "sim:synthetic");
}

static void test_cli_usage_errors(void **state)
{
    (void)state;
    assert_int_equal(run_main("sim"), 2);
    assert_int_equal(run_main("sim --workload synthetic:n=2,input=5,output=5 --model nosuch --out /tmp/x"), 2);
    assert_int_equal(run_main("sim --workload synthetic:n=2,input=5,output=5 --model llama-3.1-8b"), 2);
    assert_int_equal(run_main("sim --workload synthetic:n=2,input=5,output=5 --model llama-3.1-8b --out /tmp/x --num-blocks -4"), 2);
    assert_int_equal(run_main("sim --workload synthetic:n=2,input=5,output=5 --model llama-3.1-8b --out /tmp/x --kv-mem 12XB"), 2);
    assert_int_equal(run_main("sim --workload synthetic:n=2,input=5,output=5 --model llama-3.1-8b --out /tmp/x --num-blocks 9 --kv-mem 1GB"), 2);
    assert_int_equal(run_main("sim --workload azure:/nonexistent.csv --model llama-3.1-8b --out /tmp/x"), 2);
    assert_int_equal(run_main("sim --frobnicate"), 2);
}

/* A simulated clock that overflows (an absurd step time, arrivals scaled or spread past the
 * largest double, or past 2^53 us where whole microseconds stop being exact) is bad input: exit 2 with the reason, never a trace line holding "inf" that
 * no reader takes, and never a non-finite step time quietly replaced by a microsecond. */
static void test_clock_overflow_is_refused(void **state)
{
    (void)state;
    char trace[512], workload[512], out[512], line[2048];
    tu_tmp("overflow.trace.jsonl", trace, sizeof trace);
    tu_tmp("overflow_err.txt", out, sizeof out);
    tu_tmp("overflow.jsonl", workload, sizeof workload);
    assert_int_equal(tu_write(workload, "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [1]}\n"
                                        "{\"timestamp\": 5e9, \"input_length\": 40, \"output_length\": 2, \"hash_ids\": [2]}\n"), 0);
    struct { const char *args, *words; } cases[] = {
        { "--workload synthetic:n=5,input=10,output=3 --step-time constant:1e308", "simulated clock overflows" },
        { "--workload synthetic:n=5,input=10,output=3 --step-time linear:1e308,1e308,0,0", "not a finite number" },
        { "--workload synthetic:n=5,input=10,output=3 --step-time roofline:h200,gap=1e308", "simulated clock overflows" },
        { "--workload synthetic:n=5,input=10,output=2,rate=5e-324", "not a finite number of seconds" },
        { "--workload mooncake:@W --time-scale 1e308", "overflow.jsonl:2: arrival" },
        /* finite but past 2^53 us, where a step no longer moves the clock by its length
         * (constant:1e300 ran to exit 0 with every step after the first at one time) */
        { "--workload synthetic:n=5,input=10,output=3 --step-time constant:1e10", "past the clock's range of 2^53 us" },
        { "--workload synthetic:n=5,input=10,output=3 --step-time constant:1e300", "past the clock's range of 2^53 us" },
        { "--workload mooncake:@W --time-scale 2e6", "overflow.jsonl:2: arrival" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024];
        const char *at = strstr(cases[i].args, "@W");
        if (at) snprintf(args, sizeof args, "%.*s%s%s", (int)(at - cases[i].args), cases[i].args, workload, at + 2);
        else snprintf(args, sizeof args, "%s", cases[i].args);
        unlink(trace);
        snprintf(line, sizeof line, "%s sim %s --model llama-3.1-8b --out %s --quiet 2>&1", tu_bin(), args, trace);
        int rc = tu_run(out, "%s", line);
        char *msg = tu_slurp(out);
        assert_non_null(msg);
        if (rc != 2 || !strstr(msg, cases[i].words)) fail_msg("%s: rc %d, output '%s'", args, rc, msg);
        free(msg);
        /* whatever was written reads back: no line with a time JSON cannot hold */
        char *text = tu_slurp(trace);
        if (text) {
            if (strstr(text, "inf") || strstr(text, "nan")) fail_msg("%s: the trace holds a non-finite time", args);
            free(text);
        }
    }
}

/* True when the test directory holds a file whose name starts with prefix and has ".tmp-". */
static bool tmp_file_left(const char *prefix)
{
    DIR *d = opendir(tu_tmpdir());
    assert_non_null(d);
    bool found = false;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && strstr(e->d_name, ".tmp-")) found = true;
    closedir(d);
    return found;
}

/* A sim that stops part-way leaves TRACE as it was (missing, or the earlier file) and no
 * temporary file: the trace is written beside TRACE and renamed once the run succeeded.  A
 * success replaces TRACE keeping its mode; /dev/stdout is still written in place; SIGTERM
 * removes the temporary file. */
static void test_failed_sim_leaves_no_trace(void **state)
{
    (void)state;
    char trace[512], log[512];
    tu_tmp("keep_log.txt", log, sizeof log);
    const char *names[] = { "keep.trace.jsonl", "keep.trace.jsonl.gz" };
    for (int i = 0; i < 2; i++) {
        tu_tmp(names[i], trace, sizeof trace);
        unlink(trace);
        const char *fail = "--workload synthetic:n=50,input=100,output=30 --step-time constant:1e308";
        assert_int_equal(tu_run(log, "%s sim %s --model llama-3.1-8b --out %s --quiet", tu_bin(), fail, trace), 2);
        if (access(trace, F_OK) == 0) fail_msg("a failed sim left %s", trace);
        assert_false(tmp_file_left("keep.trace"));
        assert_int_equal(tu_write(trace, "the earlier file\n"), 0);
        assert_int_equal(chmod(trace, 0640), 0);
        assert_int_equal(tu_run(log, "%s sim %s --model llama-3.1-8b --out %s --quiet", tu_bin(), fail, trace), 2);
        char *text = tu_slurp(trace);
        assert_non_null(text);
        if (strcmp(text, "the earlier file\n") != 0) fail_msg("a failed sim changed %s: '%.80s'", trace, text);
        free(text);
        assert_false(tmp_file_left("keep.trace"));
        /* a run that succeeds replaces it, mode kept, and the trace reads back */
        assert_int_equal(tu_run(log, "%s sim --workload synthetic:n=50,input=100,output=30 --model llama-3.1-8b "
                                     "--out %s --quiet", tu_bin(), trace), 0);
        struct stat st;
        assert_int_equal(stat(trace, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0640);
        assert_false(tmp_file_left("keep.trace"));
        char err[AR_ERR_MAX];
        ar_trace_reader *r = ar_trace_open(trace, err, sizeof err);
        if (!r) fail_msg("%s", err);
        const ar_step *step;
        int rc, steps = 0;
        while ((rc = ar_trace_next(r, &step, err, sizeof err)) == 1) steps++;
        if (rc != 0 || steps < 10) fail_msg("rc %d after %d steps: %s", rc, steps, err);
        ar_trace_close(r);
    }
    /* a pipe through /dev/stdout is written in place */
    tu_tmp("keep_piped.jsonl", trace, sizeof trace);
    assert_int_equal(tu_run(NULL, "%s sim --workload synthetic:n=50,input=100,output=30 --model llama-3.1-8b "
                                  "--out /dev/stdout --quiet | cat > %s", tu_bin(), trace), 0);
    char *text = tu_slurp(trace);
    assert_non_null(text);
    assert_true(strncmp(text, "{\"format\":\"attnreplay-trace\",", 29) == 0);
    free(text);
    /* SIGTERM part-way (the run stopped as soon as its temporary file exists) */
    tu_tmp("keep_signal.trace.jsonl.gz", trace, sizeof trace);
    unlink(trace);
    assert_int_equal(tu_run(log, "%s sim --workload synthetic:n=50000,input=100,output=100 --model llama-3.1-8b "
                                 "--out %s --quiet & p=$!; for i in $(seq 1000); do ls %s.tmp-* >/dev/null 2>&1 && break; "
                                 "sleep 0.01; done; kill -STOP $p; kill -TERM $p; kill -CONT $p; wait $p; echo rc=$?",
                            tu_bin(), trace, trace), 0);
    text = tu_slurp(log);
    assert_non_null(text);
    if (!strstr(text, "rc=143")) fail_msg("sim was not ended by SIGTERM: %s", text);
    free(text);
    if (access(trace, F_OK) == 0) fail_msg("SIGTERM left %s", trace);
    assert_false(tmp_file_left("keep_signal"));
}

/* The engine options stop where the trace reader's header ranges stop (traces/trace.h): a
 * value past them is a usage error, not a trace that `info` and `replay` then refuse; the
 * largest accepted values give a trace that reads back. */
static void test_cli_limits_match_the_reader(void **state)
{
    (void)state;
    char trace[512], line[1024];
    tu_tmp("limits.trace.jsonl.gz", trace, sizeof trace);
    static const char *const too_big[] = { "--block-size 4097", "--num-blocks 16777217", "--max-num-seqs 1048577",
                                           "--max-num-batched-tokens 1073741825", "--kv-mem 1PB" };
    for (size_t i = 0; i < sizeof too_big / sizeof too_big[0]; i++) {
        unlink(trace);
        snprintf(line, sizeof line, "sim --workload synthetic:n=3,input=100,output=2 --model llama-3.1-8b --out %s --quiet %s",
                 trace, too_big[i]);
        if (run_main(line) != 2) fail_msg("%s was accepted", too_big[i]);
        assert_int_equal(access(trace, F_OK), -1);
    }
    static const char *const largest[] = { "--block-size 4096", "--max-num-seqs 1048576",
                                           "--max-num-batched-tokens 1073741824" };
    for (size_t i = 0; i < sizeof largest / sizeof largest[0]; i++) {
        snprintf(line, sizeof line, "sim --workload synthetic:n=3,input=100,output=2 --model llama-3.1-8b --out %s --quiet %s",
                 trace, largest[i]);
        if (run_main(line) != 0) fail_msg("%s was refused", largest[i]);
        expect_valid_trace(trace, 3);
    }
}

/* Output paths are checked before the workload is read: never the workload itself, never
 * one file twice, and an unwritable one stops the run with the system's reason and exit 2. */
static void test_cli_output_paths(void **state)
{
    (void)state;
    char workload[512], copy[512], trace[512], line[2048], out[512], blocker[512];
    tu_tmp("own.jsonl", workload, sizeof workload);
    const char *rows = "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [1]}\n"
                       "{\"timestamp\": 5, \"input_length\": 40, \"output_length\": 2, \"hash_ids\": [2]}\n";
    assert_int_equal(tu_write(workload, rows), 0);
    snprintf(line, sizeof line, "sim --workload mooncake:%s --model llama-3.1-8b --out %s --quiet", workload, workload);
    assert_int_equal(run_main(line), 2);
    char *after = tu_slurp(workload);
    assert_non_null(after);
    assert_string_equal(after, rows);
    free(after);
    /* the same file by another spelling, as the metrics table */
    tu_tmp("t.jsonl", trace, sizeof trace);
    snprintf(copy, sizeof copy, "%s/./own.jsonl", tu_tmpdir());
    snprintf(line, sizeof line, "sim --workload mooncake:%s --model llama-3.1-8b --out %s --metrics %s --quiet",
             workload, trace, copy);
    assert_int_equal(run_main(line), 2);
    /* --out and --metrics naming one file that does not exist yet */
    snprintf(copy, sizeof copy, "%s/./t.jsonl", tu_tmpdir());
    snprintf(line, sizeof line, "sim --workload mooncake:%s --model llama-3.1-8b --out %s --metrics %s --quiet",
             workload, trace, copy);
    assert_int_equal(run_main(line), 2);
    assert_int_equal(access(trace, F_OK), -1);
    /* --metrics where no file can be: stopped before the trace is written, with the reason */
    tu_tmp("plainfile", blocker, sizeof blocker);
    assert_int_equal(tu_write(blocker, "x"), 0);
    tu_tmp("metrics_err.txt", out, sizeof out);
    int rc = tu_run(out, "%s sim --workload mooncake:%s --model llama-3.1-8b --out %s --metrics %s/m.csv --quiet 2>&1",
                    tu_bin(), workload, trace, blocker);
    char *msg = tu_slurp(out);
    assert_non_null(msg);
    if (rc != 2 || !strstr(msg, "--metrics") || !strstr(msg, "Not a directory"))
        fail_msg("rc %d, output '%s'", rc, msg);
    free(msg);
    assert_int_equal(access(trace, F_OK), -1);
    rc = tu_run(out, "%s sim --workload mooncake:%s --model llama-3.1-8b --out %s/t.jsonl --quiet 2>&1", tu_bin(),
                workload, blocker);
    msg = tu_slurp(out);
    assert_non_null(msg);
    if (rc != 2 || !strstr(msg, "Not a directory")) fail_msg("rc %d, output '%s'", rc, msg);
    free(msg);
}

/* A --metrics database: a file that is not SQLite is refused before anything runs (exit 2,
 * naming it; it said "sim: sqlite: file is not a database", exit 1, after the simulation), and
 * another process's write lock is waited for as replay waits (ATTNREPLAY_BUSY_TIMEOUT_MS; it
 * failed at once with "sim: sqlite: database is locked", no file named), then refused as bad
 * input, exit 2 with the words every command uses (exit 1 before): before the simulation when
 * the lock keeps it from being read, at the write when it is a WAL database (readable, not
 * writable), TRACE left as it was either way. */
#define MDB_CMD "%s%s sim --workload mooncake:%s --model llama-3.1-8b --out %s --metrics %s --quiet 2>&1"

/* sim --metrics DB with ATTNREPLAY_BUSY_TIMEOUT_MS=wait_ms while another connection holds a lock on
 * DB: exit 2 naming DB, in the words every command uses for a lock that outlasted the wait. */
static void expect_metrics_locked(const char *out, const char *workload, const char *trace, const char *db_path,
                                  int wait_ms)
{
    char env[64], words[160];
    snprintf(env, sizeof env, "ATTNREPLAY_BUSY_TIMEOUT_MS=%d ", wait_ms);
    snprintf(words, sizeof words, "locked by another connection's write (waited %d ms; ATTNREPLAY_BUSY_TIMEOUT_MS "
             "sets the wait)", wait_ms);
    int rc = tu_run(out, MDB_CMD, env, tu_bin(), workload, trace, db_path);
    char *msg = tu_slurp(out);
    assert_non_null(msg);
    if (rc != 2 || !strstr(msg, db_path) || !strstr(msg, words)) fail_msg("rc %d: %s", rc, msg);
    free(msg);
}

static void test_metrics_database_refused_or_waited_for(void **state)
{
    (void)state;
    char workload[512], trace[512], db_path[512], out[512];
    tu_tmp("mdb.jsonl", workload, sizeof workload);
    tu_tmp("mdb.trace.jsonl", trace, sizeof trace);
    tu_tmp("mdb.db", db_path, sizeof db_path);
    tu_tmp("mdb_err.txt", out, sizeof out);
    assert_int_equal(tu_write(workload, "{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 3, \"hash_ids\": [1]}\n"), 0);
    assert_int_equal(tu_write(db_path, "these are not the tables you are looking for\n"), 0);
    int rc = tu_run(out, MDB_CMD, "", tu_bin(), workload, trace, db_path);
    char *msg = tu_slurp(out);
    assert_non_null(msg);
    if (rc != 2 || !strstr(msg, db_path) || !strstr(msg, "not an SQLite database")) fail_msg("rc %d: %s", rc, msg);
    free(msg);
    assert_int_equal(access(trace, F_OK), -1);
    unlink(db_path);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(db_path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "CREATE TABLE other(x); BEGIN EXCLUSIVE; INSERT INTO other VALUES(1)", NULL, NULL,
                                  NULL), SQLITE_OK);
    expect_metrics_locked(out, workload, trace, db_path, 0);   /* no wait */
    assert_int_equal(access(trace, F_OK), -1);
    /* let go 1.5 s into the next run, however long the first one took */
    pthread_t holder;
    assert_int_equal(pthread_create(&holder, NULL, tu_commit_later, db), 0);
    rc = tu_run(out, MDB_CMD, "ATTNREPLAY_BUSY_TIMEOUT_MS=20000 ", tu_bin(), workload, trace, db_path);
    msg = tu_slurp(out);
    assert_non_null(msg);
    if (rc != 0) fail_msg("rc %d: %s", rc, msg);
    free(msg);
    pthread_join(holder, NULL);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT count(*) FROM sim_requests", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(st, 0), 1);
    sqlite3_finalize(st);
    /* a WAL database under another writer's BEGIN IMMEDIATE: read, simulated, then refused at the write */
    assert_int_equal(sqlite3_exec(db, "PRAGMA journal_mode=WAL; BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    struct stat before, after;
    assert_int_equal(stat(trace, &before), 0);   /* the last run's TRACE */
    expect_metrics_locked(out, workload, trace, db_path, 300);
    assert_int_equal(stat(trace, &after), 0);    /* not replaced: the run's temporary trace was removed */
    assert_true(after.st_ino == before.st_ino && after.st_mtime == before.st_mtime);
    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(db);
}
#undef MDB_CMD

static void test_cli_writes_valid_trace_and_metrics(void **state)
{
    (void)state;
    char trace[512], csv[512], db[512], line[2048];
    tu_tmp("gsp.trace.jsonl", trace, sizeof trace);
    tu_tmp("gsp.csv", csv, sizeof csv);
    tu_tmp("gsp.db", db, sizeof db);
    /* tight KV (5.4 GiB / 2 MiB = 2764 blocks is plenty; 300 blocks forces preemption) */
    snprintf(line, sizeof line,
             "sim --workload synthetic:groups=3,prompts=10,system=700,question=60,output=40,rate=100 --model llama-3.1-8b "
             "--num-blocks 300 --max-num-batched-tokens 512 --max-num-seqs 16 --out %s --metrics %s --quiet",
             trace, csv);
    assert_int_equal(run_main(line), 0);
    expect_valid_trace(trace, 30);
    char *text = tu_slurp(csv);
    assert_non_null(text);
    int lines = 0;
    for (char *p = text; *p; p++) lines += *p == '\n';
    assert_int_equal(lines, 31);
    assert_non_null(strstr(text, "req,arrival,prompt_len,output_len,status,queueing,ttft,tpot,e2e,preemptions"));
    /* per-request prefix hits (last column) add up to the per-step admitted hits of the KV file */
    long hits_by_request = 0, prompts_by_request = 0;
    for (char *p = strchr(text, '\n'); p && p[1]; p = strchr(p + 1, '\n')) {
        char *eol = strchr(p + 1, '\n'), *last = p + 1, *third = p + 1;
        for (int col = 0; col < 2; col++) third = strchr(third, ',') + 1;
        for (char *q = p + 1; q < eol; q++) if (*q == ',') last = q + 1;
        hits_by_request += strtol(last, NULL, 10);
        prompts_by_request += strtol(third, NULL, 10);
    }
    free(text);
    char kv[600];
    snprintf(kv, sizeof kv, "%s.kv.csv", csv);
    text = tu_slurp(kv);
    assert_non_null(text);
    assert_non_null(strstr(text, "time,used_blocks,usable_blocks,running,waiting,num_tokens,admitted_prompt_tokens,admitted_hit_tokens"));
    long hits_by_step = 0, prompts_by_step = 0;
    for (char *p = strchr(text, '\n'); p && p[1]; p = strchr(p + 1, '\n')) {
        char *q = p + 1;
        for (int col = 0; col < 6; col++) q = strchr(q, ',') + 1;
        prompts_by_step += strtol(q, &q, 10);
        hits_by_step += strtol(q + 1, NULL, 10);
        assert_true(strtol(strchr(p + 1, ',') + 1, NULL, 10) <= 299);   /* used blocks <= usable */
    }
    free(text);
    assert_true(hits_by_request > 0);
    assert_int_equal(hits_by_step, hits_by_request);
    assert_int_equal(prompts_by_step, prompts_by_request);
    snprintf(line, sizeof line,
             "sim --workload synthetic:n=20,input=300,output=8,rate=50 --model deepseek-v3 --kv-mem 1GiB "
             "--step-time roofline:h200 --out %s.gz --metrics %s --quiet",
             trace, db);
    assert_int_equal(run_main(line), 0);
    char gz[600];
    snprintf(gz, sizeof gz, "%s.gz", trace);
    expect_valid_trace(gz, 20);
    char out[512];
    tu_tmp("q.txt", out, sizeof out);
    if (tu_run(out, "sqlite3 %s 'select count(*), sum(finished) from sim_requests' 2>&1", db) == 0) {
        char *res = tu_slurp(out);
        assert_non_null(strstr(res, "20|20"));
        free(res);
    }
}

/* Offered load against served capacity: 256 tokens per 10 ms step serve at most 25,600 tok/s,
 * so 100 req/s of 549 tokens of work each overload the engine and 5 req/s do not. */
static void run_load(const char *spec, ar_sim_load *load)
{
    char err[AR_ERR_MAX];
    ar_workload wl;
    assert_int_equal(ar_workload_synthetic(spec, 16, &wl, err, sizeof err), 0);
    ar_sim_config cfg = make_cfg(16, 8000, 256, 128, true);
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    assert_non_null(s);
    const ar_step *st;
    while (ar_sim_step(s, &st, err, sizeof err) == 1) {}
    ar_sim_load_check(s, load);
    ar_sim_destroy(s);
    ar_workload_free(&wl);
}

static void test_overload_is_named(void **state)
{
    (void)state;
    ar_sim_load over, under;
    run_load("n=300,input=500,output=50,rate=100", &over);
    run_load("n=300,input=500,output=50,rate=5", &under);
    /* work: 500 prompt + 49 decode tokens a request, no prefix sharing */
    assert_true(fabs(over.offered_tokens_per_s * over.arrival_span_s - 300.0 * 549) < 1e-6 * 300 * 549);
    assert_true(over.served_tokens_per_s <= 25600.0 * (1 + 1e-9));
    assert_true(over.served_tokens_per_s > 0.9 * 25600.0);
    assert_true(over.load > 1.5);
    assert_true(over.overloaded);
    assert_true(over.waiting_at_last_arrival > 0);
    assert_true(over.queueing_last_tenth_s > 10 * over.queueing_first_tenth_s);
    assert_false(under.overloaded);
    assert_true(under.load < 1.0);
    /* the command says so on stderr, even with --quiet, and still succeeds */
    char out[512], trace[512];
    tu_tmp("load.txt", out, sizeof out);
    tu_tmp("load.trace.jsonl", trace, sizeof trace);
    static const char *const rates[2] = { "100", "5" };
    for (int i = 0; i < 2; i++) {
        int rc = tu_run(out, "%s sim --workload synthetic:n=300,input=500,output=50,rate=%s --model llama-3.1-8b "
                        "--num-blocks 8000 --max-num-batched-tokens 256 --step-time constant:0.01 --out %s --quiet",
                        tu_bin(), rates[i], trace);
        char *text = tu_slurp(out);
        assert_non_null(text);
        bool warned = strstr(text, "sim: warning: the offered load exceeds what this engine serves") != NULL;
        if (rc != 0 || warned != (i == 0)) fail_msg("rate %s: rc %d, output '%s'", rates[i], rc, text);
        free(text);
    }
}

/* The simulator's own statistics agree with the trace reader's independent ones: prefix-hit
 * blocks, preemptions and cascade-eligible steps (both with 132 SMs). */
static void test_summary_agrees_with_trace_stats(void **state)
{
    (void)state;
    char trace[512], err[AR_ERR_MAX];
    tu_tmp("one-group.trace.jsonl", trace, sizeof trace);
    ar_workload wl;
    assert_int_equal(ar_workload_synthetic("groups=1,prompts=48,system=1024,question=40,output=60,rate=80", 16, &wl, err,
                                           sizeof err), 0);
    ar_sim_config cfg = make_cfg(16, 200, 2048, 64, true);
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    ar_trace_writer *w = ar_trace_create(trace, &cfg.header, err, sizeof err);
    assert_non_null(w);
    const ar_step *st;
    while (ar_sim_step(s, &st, err, sizeof err) == 1) assert_int_equal(ar_trace_write_step(w, st, err, sizeof err), 0);
    assert_int_equal(ar_trace_finish(w, err, sizeof err), 0);
    ar_sim_summary sum;
    ar_sim_summarize(s, &sum);
    ar_trace_stats stats;
    ar_trace_header h;
    if (ar_trace_stats_compute(trace, &stats, &h, err, sizeof err) != 0) fail_msg("invalid trace: %s", err);
    assert_true(sum.cascade_eligible_steps > 0);
    assert_true(sum.preemptions > 0);
    assert_int_equal(stats.cascade_eligible_steps, sum.cascade_eligible_steps);
    assert_int_equal(stats.preemptions, sum.preemptions);
    assert_int_equal(stats.prefix_hit_blocks * 16, sum.prefix_hit_tokens);
    assert_int_equal(stats.steps, sum.steps);
    assert_int_equal(stats.tokens, sum.scheduled_tokens);
    ar_sim_destroy(s);
    ar_workload_free(&wl);
}

/* Replays a trace on the CPU backend (one layer, sampled verification); fails with its log. */
static void replay_or_fail(const char *trace, const char *db_name, const char *out)
{
    char db[512];
    tu_tmp(db_name, db, sizeof db);
    int rc = tu_run(out, "%s replay %s --db %s --backend cpu --layers 1 --verify sample:4 --quiet", tu_bin(), trace, db);
    if (rc != 0) {
        char *log = tu_slurp(out);
        fail_msg("replay of %s failed (rc %d): %s", trace, rc, log ? log : "");
    }
}

/* Item 7: every trace the simulator writes replays through the CPU backend with all verified
 * steps passing; needs bin/attnreplay with the replay command. */
static void test_sim_trace_replays_on_cpu(void **state)
{
    (void)state;
    char out[512], trace[512], line[2048];
    tu_tmp("replay-help.txt", out, sizeof out);
    if (access(tu_bin(), X_OK) != 0 || tu_run(out, "%s replay --help", tu_bin()) != 0) {
        fprintf(stderr, "skipping: %s replay is not available\n", tu_bin());
        skip();
    }
    tu_tmp("rp.trace.jsonl", trace, sizeof trace);
    snprintf(line, sizeof line,
             "sim --workload synthetic:groups=2,prompts=6,system=96,question=20,output=30,rate=200 --model llama-3.1-8b "
             "--num-blocks 24 --max-num-batched-tokens 128 --max-num-seqs 8 --out %s --quiet",
             trace);
    assert_int_equal(run_main(line), 0);
    ar_trace_stats stats;
    ar_trace_header h;
    char err[AR_ERR_MAX];
    assert_int_equal(ar_trace_stats_compute(trace, &stats, &h, err, sizeof err), 0);
    assert_true(stats.preemptions > 0);        /* resumed block lists are replayed too */
    assert_true(stats.prefix_hit_blocks > 0);  /* and shared prefix blocks */
    replay_or_fail(trace, "rp.db", out);
    /* a Mooncake-format workload: shared 512-token hash blocks expanded to pages */
    char src[512];
    tu_tmp("mini_mc.jsonl", src, sizeof src);
    assert_int_equal(tu_write(src,
                              "{\"timestamp\": 0, \"input_length\": 560, \"output_length\": 6, \"hash_ids\": [1, 2]}\n"
                              "{\"timestamp\": 10, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 3]}\n"
                              "{\"timestamp\": 20, \"input_length\": 530, \"output_length\": 7, \"hash_ids\": [1, 4]}\n"
                              "{\"timestamp\": 30, \"input_length\": 300, \"output_length\": 4, \"hash_ids\": [5]}\n"
                              "{\"timestamp\": 200, \"input_length\": 512, \"output_length\": 3, \"hash_ids\": [1]}\n"),
                     0);
    tu_tmp("mc.trace.jsonl", trace, sizeof trace);
    snprintf(line, sizeof line, "sim --workload mooncake:%s --model llama-3.1-8b --num-blocks 200 --max-num-batched-tokens 256 --out %s --quiet",
             src, trace);
    assert_int_equal(run_main(line), 0);
    replay_or_fail(trace, "mc.db", out);
    /* an Azure-format workload in a cache small enough to preempt */
    tu_tmp("mini_az.csv", src, sizeof src);
    assert_int_equal(tu_write(src, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0000000,200,20\n"
                                   "2023-11-16 18:15:46.0100000,150,30\n2023-11-16 18:15:46.0200000,300,10\n"
                                   "2023-11-16 18:15:46.0300000,120,25\n2023-11-16 18:15:46.0400000,260,15\n"),
                     0);
    tu_tmp("az.trace.jsonl", trace, sizeof trace);
    snprintf(line, sizeof line, "sim --workload azure:%s --model llama-3.1-8b --num-blocks 40 --max-num-batched-tokens 256 --out %s --quiet",
             src, trace);
    assert_int_equal(run_main(line), 0);
    assert_int_equal(ar_trace_stats_compute(trace, &stats, &h, err, sizeof err), 0);
    assert_true(stats.preemptions > 0);
    replay_or_fail(trace, "az.db", out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invariant_block_conservation),
        cmocka_unit_test(test_invariant_shared_blocks_have_equal_keys),
        cmocka_unit_test(test_invariant_refcounts_never_negative),
        cmocka_unit_test(test_invariant_budget_and_max_num_seqs),
        cmocka_unit_test(test_invariant_computed_monotone_except_preemption),
        cmocka_unit_test(test_invariant_exact_output_lengths),
        cmocka_unit_test(test_no_admissions_in_a_preempting_step),
        cmocka_unit_test(test_no_prefix_caching_never_shares),
        cmocka_unit_test(test_full_cached_prompt_recomputes_last_block),
        cmocka_unit_test(test_unaligned_prompt_hits_all_full_blocks),
        cmocka_unit_test(test_lru_eviction_and_tail_first_free),
        cmocka_unit_test(test_preempt_last_running_and_resume),
        cmocka_unit_test(test_resume_recomputes_generated_tokens),
        cmocka_unit_test(test_chunked_prefill_budget_and_threshold),
        cmocka_unit_test(test_free_order),
        cmocka_unit_test(test_admission_reserves_the_whole_prompt),
        cmocka_unit_test(test_resume_hits_own_generated_blocks),
        cmocka_unit_test(test_skip_messages_name_the_rule),
        cmocka_unit_test(test_max_num_seqs_and_finished_next_step),
        cmocka_unit_test(test_num_common_prefix_blocks),
        cmocka_unit_test(test_request_that_never_fits_is_skipped),
        cmocka_unit_test(test_no_request_fits_is_refused),
        cmocka_unit_test(test_kv_sizing_and_step_time),
        cmocka_unit_test(test_steptime_fitted_from_db),
        cmocka_unit_test(test_cli_usage_errors),
        cmocka_unit_test(test_cli_output_paths),
        cmocka_unit_test(test_cli_limits_match_the_reader),
        cmocka_unit_test(test_clock_overflow_is_refused),
        cmocka_unit_test(test_failed_sim_leaves_no_trace),
        cmocka_unit_test(test_overload_is_named),
        cmocka_unit_test(test_cli_writes_valid_trace_and_metrics),
        cmocka_unit_test(test_metrics_database_refused_or_waited_for),
        cmocka_unit_test(test_summary_agrees_with_trace_stats),
        cmocka_unit_test(test_sim_trace_replays_on_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
