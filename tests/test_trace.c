/* test_trace.c - the trace reader: one test per validation rule (each writes a small bad trace
 * as text and checks the failing line and the rule named), the reader's memory bounds, damaged
 * gzip files, the live-request table (apply order, preempt/resume, no half-applied
 * steps), content keys, stats and `info` on the samples, and sample regeneration. */
#include "testutil.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "../reference/datagen.h"
#include "../traces/samples.h"
#include "../traces/trace.h"

/* block_size 4, 32 blocks, budget 64 tokens / 4 sequences. */
#define HDR "{\"format\":\"attnreplay-trace\",\"version\":1,\"model\":{\"name\":\"t\",\"attention\":\"mha\"," \
            "\"num_layers\":1,\"num_q_heads\":4,\"num_kv_heads\":2,\"head_size\":8}," \
            "\"cache\":{\"block_size\":4,\"num_blocks\":32,\"dtype\":\"bf16\",\"kv_cache_dtype\":\"auto\"}," \
            "\"scheduler\":{\"max_num_batched_tokens\":64,\"max_num_seqs\":4,\"prefix_caching\":true,\"cascade\":false}," \
            "\"source\":\"test\",\"seed\":7}\n"

/* Step 0: a (prompt 10, blocks 1-3) and b (prompt 6, blocks 4-5) prefill fully. */
#define S0 "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":10,\"num_computed_tokens\":0,\"block_ids\":[1,2,3]}," \
           "{\"req\":\"b\",\"prompt_len\":6,\"num_computed_tokens\":0,\"block_ids\":[4,5]}],\"cached\":[]," \
           "\"num_scheduled_tokens\":{\"a\":10,\"b\":6},\"num_common_prefix_blocks\":0,\"finished\":[],\"preempted\":[]}\n"
/* Step 1: both decode one token. */
#define S1 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,\"new_block_ids\":[]," \
           "\"resumed\":false},{\"req\":\"b\",\"num_computed_tokens\":6,\"new_block_ids\":[],\"resumed\":false}]," \
           "\"num_scheduled_tokens\":{\"a\":1,\"b\":1},\"num_common_prefix_blocks\":0,\"finished\":[],\"preempted\":[]}\n"

static char path_buf[4096];

/* Copies HDR into text with the first `from` replaced by `to`. */
static void patched_header(char *text, size_t cap, const char *from, const char *to)
{
    const char *at = strstr(HDR, from);
    assert_non_null(at);
    snprintf(text, cap, "%.*s%s%s", (int)(at - HDR), HDR, to, at + strlen(from));
}

static const char *write_trace(const char *name, const char *text)
{
    tu_tmp(name, path_buf, sizeof path_buf);
    assert_int_equal(tu_write(path_buf, text), 0);
    return path_buf;
}

/* Reads the trace until it fails; asserts that it fails at `line` (after line - 2 good steps,
 * or at open for line 1) with an error naming the file, the line and `rule`. */
static void expect_reject_at(const char *text, long line, const char *rule)
{
    const char *path = write_trace("bad.jsonl", text);
    char err[AR_ERR_MAX] = "";
    char where[4200];
    snprintf(where, sizeof where, "%s:%ld: ", path, line);
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    if (line <= 1) {
        assert_null(r);
    } else {
        assert_non_null(r);
        const ar_step *s = NULL;
        long good = 0;
        int rc;
        while ((rc = ar_trace_next(r, &s, err, sizeof err)) == 1) good++;
        assert_int_equal(rc, -1);
        assert_null(s);
        assert_int_equal(good, line - 2);
        ar_trace_close(r);
    }
    if (strncmp(err, where, strlen(where)) != 0 || !strstr(err, rule)) {
        print_error("error \"%s\" does not start with \"%s\" or lacks \"%s\"\n", err, where, rule);
        fail();
    }
}

/* HDR with `from` replaced by `to` must be rejected at line 1 naming `rule`. */
static void expect_header_reject(const char *from, const char *to, const char *rule)
{
    char text[2048];
    patched_header(text, sizeof text, from, to);
    expect_reject_at(text, 1, rule);
}

/* ---- header rules ---------------------------------------------------------------------------- */

static void test_header_not_a_trace(void **state)
{
    (void)state;
    expect_reject_at("{\"timestamp\":0,\"input_length\":10}\n", 1, "not an attnreplay trace");
}

static void test_header_version(void **state)
{
    (void)state;
    expect_reject_at("{\"format\":\"attnreplay-trace\",\"version\":2}\n", 1, "unsupported trace version 2");
}

static void test_header_missing_field(void **state)
{
    (void)state;
    expect_reject_at("{\"format\":\"attnreplay-trace\",\"version\":1,\"model\":{\"name\":\"t\",\"num_layers\":1,"
                     "\"num_q_heads\":4,\"num_kv_heads\":2},\"cache\":{},\"scheduler\":{}}\n",
                     1, "missing field 'model.head_size'");
}

static void test_header_heads_range(void **state)
{
    (void)state;
    expect_header_reject("\"num_q_heads\":4", "\"num_q_heads\":0", "header value out of range: model.num_q_heads = 0");
}

static void test_header_heads_divisible(void **state)
{
    (void)state;
    expect_header_reject("\"num_q_heads\":4", "\"num_q_heads\":5", "must be a multiple of model.num_kv_heads");
}

static void test_header_head_size_range(void **state)
{
    (void)state;
    expect_header_reject("\"head_size\":8", "\"head_size\":0", "model.head_size = 0");
}

static void test_header_block_size(void **state)
{
    (void)state;
    expect_header_reject("\"block_size\":4", "\"block_size\":0", "cache.block_size = 0");
}

static void test_header_num_blocks(void **state)
{
    (void)state;
    expect_header_reject("\"num_blocks\":32", "\"num_blocks\":01", "bad JSON");   /* not JSON: leading zero */
    expect_header_reject("\"num_blocks\":32", "\"num_blocks\":1", "cache.num_blocks = 1");
}

static void test_header_dtype(void **state)
{
    (void)state;
    expect_header_reject("\"dtype\":\"bf16\"", "\"dtype\":\"bf17\"", "unknown cache.dtype \"bf17\"");
}

static void test_header_wrong_type(void **state)
{
    (void)state;
    expect_header_reject("\"source\":\"test\"", "\"source\":17", "wrong-typed field 'source': expected a string");
    expect_header_reject("\"prefix_caching\":true", "\"prefix_caching\":1", "wrong-typed field 'scheduler.prefix_caching'");
    expect_header_reject("\"model\":{", "\"model\":[],\"x\":{", "wrong-typed field 'model': expected an object");
}

static void test_header_mla(void **state)
{
    (void)state;
    const char *mla = "{\"format\":\"attnreplay-trace\",\"version\":1,\"model\":{\"name\":\"ds\",\"attention\":\"mla\","
                      "\"num_layers\":1,\"num_q_heads\":16,\"kv_lora_rank\":512,\"qk_rope_head_dim\":64,"
                      "\"qk_nope_head_dim\":128,\"v_head_dim\":128},\"cache\":{\"block_size\":64,\"num_blocks\":8,"
                      "\"dtype\":\"bf16\",\"kv_cache_dtype\":\"fp8\"},\"scheduler\":{\"max_num_batched_tokens\":64,"
                      "\"max_num_seqs\":4,\"prefix_caching\":true,\"cascade\":false}}\n";
    const char *path = write_trace("mla.jsonl", mla);
    char err[AR_ERR_MAX];
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    assert_non_null(r);
    const ar_trace_header *h = ar_trace_header_of(r);
    assert_int_equal(h->model.attention, AR_ATTN_MLA);
    assert_int_equal(h->model.head_size, 576);
    assert_int_equal(h->model.num_kv_heads, 1);
    assert_int_equal(h->cache.kv_cache_dtype, AR_FP8_E4M3);
    assert_true(h->model.scale > 0.0721687 && h->model.scale < 0.0721689);   /* 1/sqrt(192) */
    ar_trace_close(r);
    char text[2048];
    const char *at = strstr(mla, "\"v_head_dim\":128}");
    snprintf(text, sizeof text, "%.*s\"v_head_dim\":128,\"head_size\":57}%s", (int)(at - mla), mla, at + 17);
    expect_reject_at(text, 1, "model.head_size = 57");
}

static void test_header_defaults(void **state)
{
    (void)state;
    const char *path = write_trace("def.jsonl", HDR);
    char err[AR_ERR_MAX];
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    assert_non_null(r);
    const ar_trace_header *h = ar_trace_header_of(r);
    assert_true(h->model.scale == 1.0 / sqrt(8.0));
    assert_int_equal(h->cache.kv_cache_dtype, AR_BF16);
    assert_int_equal(h->model.v_head_dim, 8);
    assert_int_equal((int)h->seed, 7);
    assert_string_equal(h->source, "test");
    const ar_step *s;
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 0);   /* header only: clean end */
    ar_trace_close(r);
}

static void test_empty_and_missing_file(void **state)
{
    (void)state;
    expect_reject_at("", 0, "empty file");
    char err[AR_ERR_MAX];
    char p[4096];
    assert_null(ar_trace_open(tu_tmp("does-not-exist.jsonl", p, sizeof p), err, sizeof err));
    assert_non_null(strstr(err, "cannot open"));
}

/* ---- step rules -------------------------------------------------------------------------------- */

static void test_step_bad_json(void **state)
{
    (void)state;
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\n", 3, "bad JSON");
    expect_reject_at(HDR S0 "[1,2]\n", 3, "bad JSON: a line must be one JSON object");
}

static void test_step_missing_field(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"cached\":[],\"num_scheduled_tokens\":{}}\n", 2,
                     "missing field 'new'");
    expect_reject_at(HDR "{\"step\":0,\"new\":[],\"cached\":[],\"num_scheduled_tokens\":{}}\n", 2, "missing field 'time'");
}

static void test_step_wrong_type(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":\"0\",\"time\":0.0,\"new\":[],\"cached\":[],\"num_scheduled_tokens\":{}}\n", 2,
                     "wrong-typed field 'step'");
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":\"10\",\"num_computed_tokens\":0,"
                     "\"block_ids\":[1,2,3]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":10}}\n",
                     2, "wrong-typed field 'new[0].prompt_len'");
}

static void test_step_consecutive(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":1,\"time\":0.0,\"new\":[],\"cached\":[],\"num_scheduled_tokens\":{}}\n", 2,
                     "step numbers must be consecutive from 0: expected 0, got 1");
    expect_reject_at(HDR S0 "{\"step\":2,\"time\":0.5,\"new\":[],\"cached\":[],\"num_scheduled_tokens\":{}}\n", 3,
                     "expected 1, got 2");
}

static void test_step_time(void **state)
{
    (void)state;
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":-0.5,\"new\":[],\"cached\":[],\"num_scheduled_tokens\":{}}\n", 3,
                     "time must not decrease");
    /* an overflowing number is not finite: jansson rejects it as JSON */
    expect_reject_at(HDR "{\"step\":0,\"time\":1e999,\"new\":[],\"cached\":[],\"num_scheduled_tokens\":{}}\n", 2,
                     "bad JSON");
}

static void test_new_already_live(void **state)
{
    (void)state;
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[{\"req\":\"a\",\"prompt_len\":4,\"num_computed_tokens\":0,"
                     "\"block_ids\":[9]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":4}}\n",
                     3, "new request id 'a' is already live");
}

static void test_cached_not_live(void **state)
{
    (void)state;
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"zz\",\"num_computed_tokens\":0,"
                     "\"new_block_ids\":[]}],\"num_scheduled_tokens\":{\"zz\":1}}\n",
                     3, "cached request 'zz' is not live");
    /* a finished request cannot come back as cached */
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"b\",\"num_computed_tokens\":6,"
                     "\"new_block_ids\":[]}],\"num_scheduled_tokens\":{\"b\":1},\"finished\":[\"a\"]}\n"
                     "{\"step\":2,\"time\":0.6,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,"
                     "\"new_block_ids\":[]}],\"num_scheduled_tokens\":{\"a\":1}}\n",
                     4, "cached request 'a' is not live");
}

static void test_resumed_not_preempted(void **state)
{
    (void)state;
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":0,"
                     "\"new_block_ids\":[7,8,9],\"resumed\":true}],\"num_scheduled_tokens\":{\"a\":11}}\n",
                     3, "has \"resumed\": true but was not preempted");
}

static void test_preempted_not_resumed(void **state)
{
    (void)state;
    expect_reject_at(HDR S0
                     "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,"
                     "\"new_block_ids\":[]}],\"num_scheduled_tokens\":{\"a\":1},\"preempted\":[\"b\"]}\n"
                     "{\"step\":2,\"time\":0.6,\"new\":[],\"cached\":[{\"req\":\"b\",\"num_computed_tokens\":0,"
                     "\"new_block_ids\":[4,5]}],\"num_scheduled_tokens\":{\"b\":7}}\n",
                     4, "was preempted and must have \"resumed\": true");
    /* nor may it come back as new */
    expect_reject_at(HDR S0
                     "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,"
                     "\"new_block_ids\":[]}],\"num_scheduled_tokens\":{\"a\":1},\"preempted\":[\"b\"]}\n"
                     "{\"step\":2,\"time\":0.6,\"new\":[{\"req\":\"b\",\"prompt_len\":6,\"num_computed_tokens\":0,"
                     "\"block_ids\":[4,5]}],\"cached\":[],\"num_scheduled_tokens\":{\"b\":6}}\n",
                     4, "new request 'b' was preempted");
}

static void test_duplicate_ids(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":4,\"num_computed_tokens\":0,"
                     "\"block_ids\":[1]},{\"req\":\"a\",\"prompt_len\":4,\"num_computed_tokens\":0,\"block_ids\":[2]}],"
                     "\"cached\":[],\"num_scheduled_tokens\":{\"a\":4}}\n",
                     2, "duplicate request id 'a' in new");
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[{\"req\":\"a\",\"prompt_len\":4,\"num_computed_tokens\":0,"
                     "\"block_ids\":[9]}],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,\"new_block_ids\":[]}],"
                     "\"num_scheduled_tokens\":{\"a\":1}}\n",
                     3, "duplicate request id 'a' in new/cached");
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[],\"num_scheduled_tokens\":{},"
                     "\"finished\":[\"a\",\"a\"]}\n",
                     3, "duplicate request id 'a' in finished");
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[],\"num_scheduled_tokens\":{},"
                     "\"preempted\":[\"b\",\"b\"]}\n",
                     3, "duplicate request id 'b' in preempted");
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":4,\"num_computed_tokens\":0,"
                     "\"block_ids\":[1]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":1,\"a\":2}}\n",
                     2, "duplicate key in a JSON object");
}

static void test_scheduled_not_in_new_or_cached(void **state)
{
    (void)state;
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,"
                     "\"new_block_ids\":[]}],\"num_scheduled_tokens\":{\"a\":1,\"b\":1}}\n",
                     3, "num_scheduled_tokens lists 'b', which is in neither new nor cached");
}

static void test_new_missing_from_scheduled(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":4,\"num_computed_tokens\":0,"
                     "\"block_ids\":[1]}],\"cached\":[],\"num_scheduled_tokens\":{}}\n",
                     2, "new request 'a' is missing from num_scheduled_tokens");
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,"
                     "\"new_block_ids\":[]}],\"num_scheduled_tokens\":{}}\n",
                     3, "cached request 'a' is missing from num_scheduled_tokens");
}

static void test_scheduled_at_least_one(void **state)
{
    (void)state;
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,"
                     "\"new_block_ids\":[]}],\"num_scheduled_tokens\":{\"a\":0}}\n",
                     3, "num_scheduled_tokens of 'a' is 0, must be >= 1");
}

static void test_budget_tokens(void **state)
{
    (void)state;
    /* 65 tokens > 64 */
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":65,\"num_computed_tokens\":0,"
                     "\"block_ids\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}],\"cached\":[],"
                     "\"num_scheduled_tokens\":{\"a\":65}}\n",
                     2, "sum of num_scheduled_tokens 65 exceeds max_num_batched_tokens 64");
}

static void test_budget_seqs(void **state)
{
    (void)state;
    char line[2048] = "{\"step\":0,\"time\":0.0,\"new\":[";
    char sched[512] = "";
    for (int i = 0; i < 5; i++) {
        char one[160];
        snprintf(one, sizeof one, "%s{\"req\":\"r%d\",\"prompt_len\":4,\"num_computed_tokens\":0,\"block_ids\":[%d]}",
                 i ? "," : "", i, i + 1);
        strcat(line, one);
        snprintf(one, sizeof one, "%s\"r%d\":4", i ? "," : "", i);
        strcat(sched, one);
    }
    char text[4096];
    snprintf(text, sizeof text, "%s%s],\"cached\":[],\"num_scheduled_tokens\":{%s}}\n", HDR, line, sched);
    expect_reject_at(text, 2, "5 scheduled requests exceed max_num_seqs 4");
}

static void test_block_id_range(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":4,\"num_computed_tokens\":0,"
                     "\"block_ids\":[0]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":4}}\n",
                     2, "block id 0 in new[0].block_ids out of range [1, 32) (0 is the null block)");
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,"
                     "\"new_block_ids\":[32]}],\"num_scheduled_tokens\":{\"a\":1}}\n",
                     3, "block id 32 in cached[0].new_block_ids out of range [1, 32)");
}

static void test_block_coverage(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":10,\"num_computed_tokens\":0,"
                     "\"block_ids\":[1,2]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":10}}\n",
                     2, "block list of 'a' does not cover num_computed_tokens + n = 10 tokens: 2 blocks of 4");
    /* a decodes into token 12: needs a 4th block (12 = 3 blocks + 1) */
    expect_reject_at(HDR S0 S1 "{\"step\":2,\"time\":0.6,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":11,"
                     "\"new_block_ids\":[]}],\"num_scheduled_tokens\":{\"a\":2}}\n",
                     4, "block list of 'a' does not cover num_computed_tokens + n = 13 tokens: 3 blocks of 4");
}

static void test_block_twice(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":8,\"num_computed_tokens\":0,"
                     "\"block_ids\":[3,3]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":8}}\n",
                     2, "block id 3 appears twice in the block list of 'a'");
    expect_reject_at(HDR S0 S1 "{\"step\":2,\"time\":0.6,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":11,"
                     "\"new_block_ids\":[2]}],\"num_scheduled_tokens\":{\"a\":1}}\n",
                     4, "block id 2 appears twice in the block list of 'a'");
}

static void test_computed_continuity(void **state)
{
    (void)state;
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":9,"
                     "\"new_block_ids\":[]}],\"num_scheduled_tokens\":{\"a\":1}}\n",
                     3, "num_computed_tokens of cached request 'a' is 9, expected 10");
}

static void test_new_computed_range(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":8,\"num_computed_tokens\":8,"
                     "\"block_ids\":[1,2,3]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":1}}\n",
                     2, "num_computed_tokens 8 of new request 'a' must be in [0, prompt_len 8)");
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":0,\"num_computed_tokens\":0,"
                     "\"block_ids\":[1]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":1}}\n",
                     2, "prompt_len 0 of new request 'a' must be in [1,");
}

/* A prompt longer than the whole cache (31 blocks of 4 here) is refused before its content keys
 * are made: one line with prompt_len 2^30 and block_size 1 once made 2^30 keys (16 GB). */
static void test_new_prompt_fits_the_cache(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":125,\"num_computed_tokens\":0,"
                     "\"block_ids\":[1]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":4}}\n",
                     2, "prompt_len 125 of new request 'a' exceeds the KV cache: 31 blocks of 4 tokens hold 124 tokens");
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":1073741824,"
                     "\"num_computed_tokens\":0,\"block_ids\":[1]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":4}}\n",
                     2, "prompt_len 1073741824 of new request 'a' exceeds the KV cache");
    /* the whole cache is fine */
    const char *path = write_trace("fits.jsonl", HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":124,"
                                   "\"num_computed_tokens\":0,\"block_ids\":[1]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":4}}\n");
    char err[AR_ERR_MAX] = "";
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    if (!r) fail_msg("%s", err);
    const ar_step *st;
    if (ar_trace_next(r, &st, err, sizeof err) != 1) fail_msg("%s", err);
    assert_int_equal(st->new_reqs[0].num_block_keys, 31);
    ar_trace_close(r);
}

/* A step's new requests are counted against max_num_seqs before any is parsed, and the content
 * keys they make together are bounded (AR_TRACE_MAX_STEP_KEYS) before they are made: a few
 * hundred bytes of trace once made 128 MiB of keys per request, 40 requests 5 GB. */
static void test_step_keys_bounded(void **state)
{
    (void)state;
    /* five new requests in a step of at most four (only four listed as scheduled) */
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":["
                     "{\"req\":\"a\",\"prompt_len\":4,\"num_computed_tokens\":0,\"block_ids\":[1]},"
                     "{\"req\":\"b\",\"prompt_len\":4,\"num_computed_tokens\":0,\"block_ids\":[2]},"
                     "{\"req\":\"c\",\"prompt_len\":4,\"num_computed_tokens\":0,\"block_ids\":[3]},"
                     "{\"req\":\"d\",\"prompt_len\":4,\"num_computed_tokens\":0,\"block_ids\":[4]},"
                     "{\"req\":\"e\",\"prompt_len\":4,\"num_computed_tokens\":0,\"block_ids\":[5]}],"
                     "\"cached\":[],\"num_scheduled_tokens\":{\"a\":4,\"b\":4,\"c\":4,\"d\":4}}\n",
                     2, "5 new and 0 cached requests exceed max_num_seqs 4 (each is scheduled in its step)");
    /* two prompts of 2^23 + 1 one-token blocks: 2^24 + 2 keys in one step */
    const char *big = "{\"format\":\"attnreplay-trace\",\"version\":1,\"model\":{\"name\":\"t\",\"num_layers\":1,"
                      "\"num_q_heads\":4,\"num_kv_heads\":2,\"head_size\":8},\"cache\":{\"block_size\":1,"
                      "\"num_blocks\":16777216,\"dtype\":\"bf16\"},\"scheduler\":{\"max_num_batched_tokens\":64,"
                      "\"max_num_seqs\":1048576}}\n";
    char text[2048];
    snprintf(text, sizeof text, "%s{\"step\":0,\"time\":0.0,\"new\":["
             "{\"req\":\"a\",\"prompt_len\":8388609,\"num_computed_tokens\":0,\"block_ids\":[1]},"
             "{\"req\":\"b\",\"prompt_len\":8388609,\"num_computed_tokens\":0,\"block_ids\":[2]}],"
             "\"cached\":[],\"num_scheduled_tokens\":{\"a\":1,\"b\":1}}\n", big);
    expect_reject_at(text, 2, "the prompts of new requests new[0..1] have 16777218 full blocks, more than the "
                     "16777216 content keys one step may make");
    /* the same two prompts in two steps read */
    snprintf(text, sizeof text, "%s{\"step\":0,\"time\":0.0,\"new\":["
             "{\"req\":\"a\",\"prompt_len\":8388609,\"num_computed_tokens\":0,\"block_ids\":[1]}],"
             "\"cached\":[],\"num_scheduled_tokens\":{\"a\":1}}\n"
             "{\"step\":1,\"time\":0.1,\"new\":["
             "{\"req\":\"b\",\"prompt_len\":8388609,\"num_computed_tokens\":0,\"block_ids\":[2]}],"
             "\"cached\":[],\"num_scheduled_tokens\":{\"b\":1},\"finished\":[\"a\"]}\n", big);
    const char *path = write_trace("two-big.jsonl", text);
    char err[AR_ERR_MAX] = "";
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    if (!r) fail_msg("%s", err);
    const ar_step *st;
    for (int i = 0; i < 2; i++)
        if (ar_trace_next(r, &st, err, sizeof err) != 1) fail_msg("%s", err);
    assert_int_equal(st->new_reqs[0].num_block_keys, 8388609);
    ar_trace_close(r);
}

/* Reads text with a bound of max_keys spelled-out keys; the steps read before the first error
 * (or all), and the error in err. */
static int read_with_given_limit(const char *text, int64_t max_keys, char *err, size_t err_len)
{
    const char *path = write_trace("given.jsonl", text);
    ar_trace_reader *r = ar_trace_open(path, err, err_len);
    if (!r) fail_msg("%s", err);
    ar_trace_set_given_key_limit(r, max_keys);
    const ar_step *st;
    int good = 0, rc;
    while ((rc = ar_trace_next(r, &st, err, err_len)) == 1) good++;
    ar_trace_close(r);
    return rc == 0 ? good : -1 - good;
}

/* Keys a trace spells out are held until their request finishes (the trace alone can make them
 * again), so together they are bounded (AR_TRACE_MAX_GIVEN_KEYS): live and preempted requests'
 * keys count, a finished request's stop counting in its step, request-private keys never. */
static void test_given_keys_bounded(void **state)
{
    (void)state;
    char err[AR_ERR_MAX] = "";
    /* a: 4 keys (block_keys) in step 0; b: 3 keys (prompt_token_ids) in step 1 -> 7 held */
    const char *a = "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":16,\"num_computed_tokens\":0,"
                    "\"block_ids\":[1],\"block_keys\":[\"0000000000000001\",\"0000000000000002\","
                    "\"0000000000000003\",\"0000000000000004\"]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":4}}\n";
#define STEP1_B(extra) "{\"step\":1,\"time\":0.1,\"new\":[{\"req\":\"b\",\"prompt_len\":12,\"num_computed_tokens\":0," \
                       "\"block_ids\":[2],\"prompt_token_ids\":[1,2,3,4,5,6,7,8,9,10,11,12]}],\"cached\":[]," \
                       "\"num_scheduled_tokens\":{\"b\":4}" extra "}\n"
    char text[4096];
    snprintf(text, sizeof text, HDR "%s" STEP1_B(""), a);
    assert_int_equal(read_with_given_limit(text, 7, err, sizeof err), 2);
    assert_int_equal(read_with_given_limit(text, 6, err, sizeof err), -2);
    if (!strstr(err, "given.jsonl:3: the live requests' prompts would hold 7 content keys the trace spells out"))
        fail_msg("%s", err);
    /* a finishes in b's step: 3 held */
    snprintf(text, sizeof text, HDR "%s" STEP1_B(",\"finished\":[\"a\"]"), a);
    assert_int_equal(read_with_given_limit(text, 4, err, sizeof err), 2);
    /* a preempted still holds its 4 (it must be remade from them when it resumes) */
    snprintf(text, sizeof text, HDR "%s" STEP1_B(",\"preempted\":[\"a\"]"), a);
    assert_int_equal(read_with_given_limit(text, 6, err, sizeof err), -2);
    if (!strstr(err, "given.jsonl:3: the live requests' prompts would hold 7 content keys")) fail_msg("%s", err);
    /* b request-private instead: only a's 4 count */
    snprintf(text, sizeof text, HDR "%s{\"step\":1,\"time\":0.1,\"new\":[{\"req\":\"b\",\"prompt_len\":12,"
             "\"num_computed_tokens\":0,\"block_ids\":[2]}],\"cached\":[],\"num_scheduled_tokens\":{\"b\":4}}\n", a);
    assert_int_equal(read_with_given_limit(text, 4, err, sizeof err), 2);
#undef STEP1_B
}

/* VmRSS or VmHWM (the field named) of this process in KiB; -1 when /proc cannot be read. */
static long proc_status_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            kb = strtol(line + n + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb;
}

/* Preempted and running requests keep no request-private content keys beyond the blocks they
 * hold: a trace that admits a 2^22-token prompt (block_size 1) a step and preempts it the next,
 * or leaves it running unscheduled, reads in one step's keys (32 MiB), not 32 MiB a step. */
static void test_live_keys_bounded(void **state)
{
    (void)state;
    enum { STEPS = 12, PROMPT = 1 << 22 };
    const char *hdr = "{\"format\":\"attnreplay-trace\",\"version\":1,\"model\":{\"name\":\"t\",\"num_layers\":1,"
                      "\"num_q_heads\":4,\"num_kv_heads\":2,\"head_size\":8},\"cache\":{\"block_size\":1,"
                      "\"num_blocks\":4194305,\"dtype\":\"bf16\"},\"scheduler\":{\"max_num_batched_tokens\":64,"
                      "\"max_num_seqs\":1}}\n";
    char text[8192];
    char err[AR_ERR_MAX] = "";
    for (int running = 0; running < 2; running++) {
        /* r<k> is admitted in step k with one token; preempted in step k + 1 (its block 1 handed
         * to r<k+1>), or left running in block k + 1 */
        int n = snprintf(text, sizeof text, "%s", hdr);
        for (int k = 0; k < STEPS; k++) {
            char pre[32] = "";
            if (!running && k > 0) snprintf(pre, sizeof pre, "\"r%d\"", k - 1);
            n += snprintf(text + n, sizeof text - (size_t)n,
                          "{\"step\":%d,\"time\":%d,\"new\":[{\"req\":\"r%d\",\"prompt_len\":%d,\"num_computed_tokens\":0,"
                          "\"block_ids\":[%d]}],\"cached\":[],\"num_scheduled_tokens\":{\"r%d\":1},\"preempted\":[%s]}\n",
                          k, k, k, PROMPT, running ? k + 1 : 1, k, pre);
        }
        assert_true(n < (int)sizeof text);
        const char *path = write_trace(running ? "keys-running.jsonl" : "keys-preempted.jsonl", text);
        /* the peak RSS from here: reset where the kernel allows it, else the old peak counts */
        FILE *cr = fopen("/proc/self/clear_refs", "w");
        if (cr) {
            fputs("5", cr);
            fclose(cr);
        }
        long base = proc_status_kb("VmRSS");
        ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
        if (!r) fail_msg("%s", err);
        const ar_step *st;
        int rc, steps = 0;
        while ((rc = ar_trace_next(r, &st, err, sizeof err)) == 1) steps++;
        if (rc != 0) fail_msg("%s", err);
        assert_int_equal(steps, STEPS);
        long peak = proc_status_kb("VmHWM");
        if (base > 0 && peak > 0) {
            long grown = peak - base;
            if (grown > 160 * 1024)
                fail_msg("reading %d steps of one %d-key prompt each grew the peak RSS by %ld KiB", STEPS, PROMPT, grown);
        }
        /* a live request keeps the keys of the blocks it holds: the same keys as before */
        char last[16];
        snprintf(last, sizeof last, "r%d", STEPS - 1);
        const ar_live_req *lr = ar_trace_find(r, running ? "r0" : last);
        assert_non_null(lr);
        assert_int_equal(lr->prompt_len, PROMPT);
        assert_int_equal(lr->num_blocks, 1);
        assert_int_equal(lr->num_prompt_keys, 1);
        assert_true(lr->prompt_keys[0] == ar_chain_key(AR_ROOT_KEY, ar_private_payload(lr->req_key, 0)));
        assert_int_equal(ar_trace_live_count(r), running ? STEPS : 1);
        ar_trace_close(r);
    }

    /* a preempted request's private keys are made again when it resumes: p's first block is a
     * prefix hit on the block q computed with p's key, and not on one with other content */
    char k0[17];
    snprintf(k0, sizeof k0, "%016" PRIx64, ar_chain_key(AR_ROOT_KEY, ar_private_payload(ar_req_key("p"), 0)));
#define STEPS01 \
        "{\"step\":0,\"time\":0,\"new\":[{\"req\":\"p\",\"prompt_len\":8,\"num_computed_tokens\":0,\"block_ids\":[1,2]}]," \
        "\"cached\":[],\"num_scheduled_tokens\":{\"p\":8}}\n" \
        "{\"step\":1,\"time\":1,\"new\":[{\"req\":\"q\",\"prompt_len\":8,\"num_computed_tokens\":0,\"block_ids\":[1,3]," \
        "\"block_keys\":[\"%s\",\"0000000000000001\"]}],\"cached\":[],\"num_scheduled_tokens\":{\"q\":8}," \
        "\"preempted\":[\"p\"]}\n"
#define RESUME "{\"step\":2,\"time\":2,\"new\":[],\"cached\":[{\"req\":\"p\",\"num_computed_tokens\":4," \
               "\"resumed\":true,\"new_block_ids\":[%d,4]}],\"num_scheduled_tokens\":{\"p\":4}}\n"
    int n = snprintf(text, sizeof text, "%s", HDR);
    n += snprintf(text + n, sizeof text - (size_t)n, STEPS01, k0);
    snprintf(text + n, sizeof text - (size_t)n, RESUME, 1);
    const char *path = write_trace("keys-resume.jsonl", text);
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    if (!r) fail_msg("%s", err);
    const ar_step *st;
    for (int i = 0; i < 3; i++)
        if (ar_trace_next(r, &st, err, sizeof err) != 1) fail_msg("%s", err);
    const ar_live_req *p = ar_trace_find(r, "p");
    assert_non_null(p);
    assert_int_equal(p->num_prompt_keys, 2);
    uint64_t p0 = ar_chain_key(AR_ROOT_KEY, ar_private_payload(p->req_key, 0));
    assert_true(p->prompt_keys[0] == p0);
    assert_true(p->prompt_keys[1] == ar_chain_key(p0, ar_private_payload(p->req_key, 1)));
    ar_trace_close(r);
    snprintf(text + n, sizeof text - (size_t)n, RESUME, 3);
    expect_reject_at(text, 4, "block 3 is a prefix hit of 'p' with different content than live request 'q'");
#undef STEPS01
#undef RESUME
}

static void test_new_past_prompt(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":8,\"num_computed_tokens\":0,"
                     "\"block_ids\":[1,2,3]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":9}}\n",
                     2, "new request 'a' schedules past its prompt");
}

static void test_new_computed_whole_blocks(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":8,\"num_computed_tokens\":3,"
                     "\"block_ids\":[1,2]}],\"cached\":[],\"num_scheduled_tokens\":{\"a\":5}}\n",
                     2, "must be a multiple of block_size 4");
}

static void test_block_keys_count(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":9,\"num_computed_tokens\":0,"
                     "\"block_ids\":[1,2,3],\"block_keys\":[\"0000000000000001\"]}],\"cached\":[],"
                     "\"num_scheduled_tokens\":{\"a\":9}}\n",
                     2, "block_keys of new request 'a' has 1 entries, must be prompt_len / block_size = 2");
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":4,\"num_computed_tokens\":0,"
                     "\"block_ids\":[1],\"block_keys\":[\"00000000000000zz\"]}],\"cached\":[],"
                     "\"num_scheduled_tokens\":{\"a\":4}}\n",
                     2, "block_keys[0] of new request 'a' must be a 16-hex-digit string");
}

static void test_prompt_token_ids_length(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"a\",\"prompt_len\":5,\"num_computed_tokens\":0,"
                     "\"block_ids\":[1,2],\"prompt_token_ids\":[1,2,3,4]}],\"cached\":[],"
                     "\"num_scheduled_tokens\":{\"a\":5}}\n",
                     2, "prompt_token_ids of new request 'a' has 4 entries, must equal prompt_len 5");
}

static void test_finished_rules(void **state)
{
    (void)state;
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[],\"num_scheduled_tokens\":{},"
                     "\"finished\":[\"x\"]}\n",
                     3, "finished request 'x' is not live");
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,"
                     "\"new_block_ids\":[]}],\"num_scheduled_tokens\":{\"a\":1},\"finished\":[\"a\"]}\n",
                     3, "finished request 'a' is also scheduled in this step");
}

static void test_preempted_rules(void **state)
{
    (void)state;
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[],\"num_scheduled_tokens\":{},"
                     "\"preempted\":[\"x\"]}\n",
                     3, "preempted request 'x' is not live");
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,"
                     "\"new_block_ids\":[]}],\"num_scheduled_tokens\":{\"a\":1},\"preempted\":[\"a\"]}\n",
                     3, "preempted request 'a' is also scheduled in this step");
}

static void test_common_prefix_rules(void **state)
{
    (void)state;
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[],\"cached\":[],\"num_scheduled_tokens\":{},"
                     "\"num_common_prefix_blocks\":-1}\n",
                     2, "num_common_prefix_blocks -1 must be >= 0");
    /* b holds 2 blocks */
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,"
                     "\"new_block_ids\":[]},{\"req\":\"b\",\"num_computed_tokens\":6,\"new_block_ids\":[]}],"
                     "\"num_scheduled_tokens\":{\"a\":1,\"b\":1},\"num_common_prefix_blocks\":3}\n",
                     3, "num_common_prefix_blocks 3 exceeds the 2 blocks held by a scheduled request");
}

/* Reads the whole trace and asserts every step is accepted; returns the number of steps. */
static int expect_accept(const char *text)
{
    const char *path = write_trace("good.jsonl", text);
    char err[AR_ERR_MAX] = "";
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    if (!r) {
        print_error("open failed: %s\n", err);
        fail();
    }
    const ar_step *s;
    int rc, steps = 0;
    while ((rc = ar_trace_next(r, &s, err, sizeof err)) == 1) steps++;
    if (rc != 0) {
        print_error("rejected: %s\n", err);
        fail();
    }
    ar_trace_close(r);
    return steps;
}

/* New request "ID" with prompt PROMPT, num_computed_tokens COMPUTED, blocks BLOCKS, keys KEYS. */
#define NEWREQ(ID, PROMPT, COMPUTED, BLOCKS, KEYS) \
    "{\"req\":\"" ID "\",\"prompt_len\":" #PROMPT ",\"num_computed_tokens\":" #COMPUTED ",\"block_ids\":[" BLOCKS "]" \
    ",\"block_keys\":[" KEYS "]}"
#define KEY_AA "\"00000000000000aa\""
#define KEY_BB "\"00000000000000bb\""
#define KEY_CC "\"00000000000000cc\""
#define KEY_DD "\"00000000000000dd\""
/* Step 0: x (prompt 8, keys aa bb) computes blocks 1 and 2. */
#define KS0 "{\"step\":0,\"time\":0.0,\"new\":[" NEWREQ("x", 8, 0, "1,2", KEY_AA "," KEY_BB) "],\"cached\":[]," \
            "\"num_scheduled_tokens\":{\"x\":8}}\n"

static void test_block_ownership_rejects(void **state)
{
    (void)state;
    /* a prefix hit on a block a live request holds with other content */
    expect_reject_at(HDR KS0 "{\"step\":1,\"time\":0.5,\"new\":[" NEWREQ("y", 9, 8, "1,2,3", KEY_AA "," KEY_CC) "],"
                     "\"cached\":[],\"num_scheduled_tokens\":{\"y\":1}}\n",
                     3, "block 2 is a prefix hit of 'y' with different content than live request 'x' holds in it");
    /* the same block handed out fresh (beyond y's 4 computed tokens) while x holds it */
    expect_reject_at(HDR KS0 "{\"step\":1,\"time\":0.5,\"new\":[" NEWREQ("y", 9, 4, "1,2,3", KEY_AA "," KEY_BB) "],"
                     "\"cached\":[],\"num_scheduled_tokens\":{\"y\":5}}\n",
                     3, "block 2 handed to 'y' as a new block while live request 'x' still holds it");
    /* a running request appends a block another live request holds */
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,"
                     "\"new_block_ids\":[4]}],\"num_scheduled_tokens\":{\"a\":1}}\n",
                     3, "block 4 handed to 'a' as a new block while live request 'b' still holds it");
    /* a resumed request's fresh list takes a live request's block */
    expect_reject_at(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,"
                     "\"new_block_ids\":[]}],\"num_scheduled_tokens\":{\"a\":1},\"preempted\":[\"b\"]}\n"
                     "{\"step\":2,\"time\":0.6,\"new\":[],\"cached\":[{\"req\":\"b\",\"num_computed_tokens\":0,"
                     "\"new_block_ids\":[3,4],\"resumed\":true}],\"num_scheduled_tokens\":{\"b\":6}}\n",
                     4, "block 3 handed to 'b' as a new block while live request 'a' still holds it");
    /* one step hands a free block to two requests */
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"p\",\"prompt_len\":4,\"num_computed_tokens\":0,"
                     "\"block_ids\":[7]},{\"req\":\"q\",\"prompt_len\":4,\"num_computed_tokens\":0,\"block_ids\":[7]}],"
                     "\"cached\":[],\"num_scheduled_tokens\":{\"p\":4,\"q\":4}}\n",
                     2, "block 7 handed to two requests as a new block in one step ('p' and 'q')");
    /* one step: q's hit on the block p computes, with other content */
    expect_reject_at(HDR "{\"step\":0,\"time\":0.0,\"new\":[" NEWREQ("p", 8, 0, "1,2", KEY_AA "," KEY_BB) ","
                     NEWREQ("q", 12, 8, "1,2,3", KEY_AA "," KEY_CC "," KEY_DD) "],\"cached\":[],"
                     "\"num_scheduled_tokens\":{\"p\":8,\"q\":4}}\n",
                     2, "block 2 is claimed in one step by 'p' and 'q' with different content");
}

static void test_block_ownership_sharing(void **state)
{
    (void)state;
    /* a prefix hit with equal content on blocks x holds */
    assert_int_equal(expect_accept(HDR KS0 "{\"step\":1,\"time\":0.5,\"new\":[" NEWREQ("y", 9, 8, "1,2,3", KEY_AA "," KEY_BB)
                                   "],\"cached\":[],\"num_scheduled_tokens\":{\"y\":1}}\n"), 2);
    /* blocks of a request preempted in this step, and of one finished before it, are free */
    assert_int_equal(expect_accept(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\","
                                   "\"num_computed_tokens\":10,\"new_block_ids\":[4]}],\"num_scheduled_tokens\":{\"a\":1},"
                                   "\"preempted\":[\"b\"]}\n"), 2);
    assert_int_equal(expect_accept(HDR S0 "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\","
                                   "\"num_computed_tokens\":10,\"new_block_ids\":[5]}],\"num_scheduled_tokens\":{\"a\":1},"
                                   "\"finished\":[\"b\"]}\n"), 2);
    /* in one step a request hits the blocks another computes, listed before it */
    assert_int_equal(expect_accept(HDR "{\"step\":0,\"time\":0.0,\"new\":[" NEWREQ("q", 9, 8, "1,2,3", KEY_AA "," KEY_BB)
                                   "," NEWREQ("p", 8, 0, "1,2", KEY_AA "," KEY_BB) "],\"cached\":[],"
                                   "\"num_scheduled_tokens\":{\"q\":1,\"p\":8}}\n"), 1);
}

static void test_block_ownership_rollback(void **state)
{
    (void)state;
    /* line 3 claims b's block 4 and is rejected; line 4, the same step done right, and line 5,
     * which hands block 4 out again once b finished, must both be accepted: the rejected
     * claim left no count behind */
    const char *text = HDR S0
        "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,\"new_block_ids\":[4]}],"
        "\"num_scheduled_tokens\":{\"a\":1}}\n"
        "{\"step\":1,\"time\":0.5,\"new\":[],\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,\"new_block_ids\":[6]}],"
        "\"num_scheduled_tokens\":{\"a\":1}}\n"
        "{\"step\":2,\"time\":0.6,\"new\":[{\"req\":\"z\",\"prompt_len\":4,\"num_computed_tokens\":0,\"block_ids\":[4]}],"
        "\"cached\":[],\"num_scheduled_tokens\":{\"z\":4},\"finished\":[\"b\"]}\n";
    const char *path = write_trace("rollback.jsonl", text);
    char err[AR_ERR_MAX];
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    assert_non_null(r);
    const ar_step *s;
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 1);
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), -1);
    assert_non_null(strstr(err, ":3: block 4 handed to 'a' as a new block while live request 'b' still holds it"));
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 1);
    assert_int_equal(s->line, 4);
    int rc = ar_trace_next(r, &s, err, sizeof err);
    if (rc != 1) print_error("%s\n", err);
    assert_int_equal(rc, 1);
    assert_int_equal(s->line, 5);
    ar_trace_close(r);
}

/* ---- reading: keys, live table, state on failure, odd files ----------------------------------- */

static void test_content_keys(void **state)
{
    (void)state;
    const char *text = HDR
        "{\"step\":0,\"time\":0.0,\"new\":[{\"req\":\"t\",\"prompt_len\":9,\"num_computed_tokens\":0,\"block_ids\":[1,2,3],"
        "\"prompt_token_ids\":[5,6,7,8,9,10,11,12,13]},"
        "{\"req\":\"p\",\"prompt_len\":8,\"num_computed_tokens\":0,\"block_ids\":[4,5]},"
        "{\"req\":\"k\",\"prompt_len\":5,\"num_computed_tokens\":0,\"block_ids\":[6,7],\"block_keys\":[\"00000000DEADbeef\"]}],"
        "\"cached\":[],\"num_scheduled_tokens\":{\"t\":9,\"p\":8,\"k\":5}}\n";
    const char *path = write_trace("keys.jsonl", text);
    char err[AR_ERR_MAX];
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    assert_non_null(r);
    const ar_step *s;
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 1);
    /* token ids: chained over the tokens of each full block */
    int32_t b0[4] = {5, 6, 7, 8}, b1[4] = {9, 10, 11, 12};
    uint64_t k0 = ar_chain_key(AR_ROOT_KEY, ar_tokens_payload(b0, 4));
    uint64_t k1 = ar_chain_key(k0, ar_tokens_payload(b1, 4));
    const ar_live_req *t = ar_trace_find(r, "t");
    assert_non_null(t);
    assert_int_equal(t->num_prompt_keys, 2);
    assert_true(t->prompt_keys[0] == k0 && t->prompt_keys[1] == k1);
    assert_true(s->new_reqs[0].block_keys[1] == k1);
    /* neither given: request-private chain */
    const ar_live_req *p = ar_trace_find(r, "p");
    uint64_t rk = ar_req_key("p");
    uint64_t p0 = ar_chain_key(AR_ROOT_KEY, ar_private_payload(rk, 0));
    assert_true(p->prompt_keys[0] == p0);
    assert_true(p->prompt_keys[1] == ar_chain_key(p0, ar_private_payload(rk, 1)));
    assert_true(p->req_key == rk);
    /* hex keys, any case */
    const ar_live_req *k = ar_trace_find(r, "k");
    assert_int_equal(k->num_prompt_keys, 1);
    assert_true(k->prompt_keys[0] == 0xdeadbeefull);
    /* block beyond the prompt keys: private, chained after the previous block */
    assert_true(ar_block_content_key(0, k->prompt_keys, 1, k->req_key, 0) == 0xdeadbeefull);
    assert_true(ar_block_content_key(0xdeadbeefull, k->prompt_keys, 1, k->req_key, 1) ==
                ar_chain_key(0xdeadbeefull, ar_private_payload(k->req_key, 1)));
    ar_trace_close(r);
}

/* Snapshot of the live table as text, to compare before and after a failed step. */
static void live_snapshot(const ar_trace_reader *r, char *out, size_t len)
{
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < ar_trace_live_count(r); i++) {
        const ar_live_req *q = ar_trace_live_at(r, i);
        used += (size_t)snprintf(out + used, len - used, "%s p%d c%d [", q->req, q->prompt_len, q->num_computed_tokens);
        for (int b = 0; b < q->num_blocks; b++) used += (size_t)snprintf(out + used, len - used, "%d,", q->block_ids[b]);
        used += (size_t)snprintf(out + used, len - used, "] ");
    }
}

static void test_live_table_semantics(void **state)
{
    (void)state;
    /* c's first prompt block holds what a's first block holds (a prefix hit must share content) */
    uint64_t shared = ar_chain_key(AR_ROOT_KEY, ar_private_payload(ar_req_key("a"), 0));
    char text[4096];
    snprintf(text, sizeof text, "%s",
        HDR S0 S1
        /* step 2: c arrives with a prefix hit on a's first block; b preempted; a grows a block */
        "{\"step\":2,\"time\":0.6,\"new\":[{\"req\":\"c\",\"prompt_len\":7,\"num_computed_tokens\":4,\"block_ids\":[1,9],"
        "\"block_keys\":[\"KEY_OF_A0_______\"]}],"
        "\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":11,\"new_block_ids\":[6]}],"
        "\"num_scheduled_tokens\":{\"a\":1,\"c\":3},\"num_common_prefix_blocks\":1,\"finished\":[],\"preempted\":[\"b\"]}\n"
        /* step 3: a finished (dropped first), b resumes with a replacing list */
        "{\"step\":3,\"time\":0.7,\"new\":[],\"cached\":[{\"req\":\"c\",\"num_computed_tokens\":7,\"new_block_ids\":[]},"
        "{\"req\":\"b\",\"num_computed_tokens\":0,\"new_block_ids\":[2,3],\"resumed\":true}],"
        "\"num_scheduled_tokens\":{\"c\":1,\"b\":8},\"num_common_prefix_blocks\":0,\"finished\":[\"a\"],\"preempted\":[]}\n");
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)shared);
    memcpy(strstr(text, "KEY_OF_A0_______"), hex, 16);
    const char *path = write_trace("live.jsonl", text);
    char err[AR_ERR_MAX], snap[1024];
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    assert_non_null(r);
    const ar_step *s;
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 1);
    assert_int_equal(s->line, 2);
    live_snapshot(r, snap, sizeof snap);
    assert_string_equal(snap, "a p10 c0 [1,2,3,] b p6 c0 [4,5,] ");
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 1);
    live_snapshot(r, snap, sizeof snap);
    assert_string_equal(snap, "a p10 c10 [1,2,3,] b p6 c6 [4,5,] ");
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 1);
    live_snapshot(r, snap, sizeof snap);
    assert_string_equal(snap, "a p10 c11 [1,2,3,6,] c p7 c4 [1,9,] ");
    assert_null(ar_trace_find(r, "b"));   /* preempted: not live */
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 1);
    live_snapshot(r, snap, sizeof snap);
    assert_string_equal(snap, "c p7 c7 [1,9,] b p6 c0 [2,3,] ");
    assert_null(ar_trace_find(r, "a"));
    assert_int_equal(ar_trace_find(r, "b")->prompt_len, 6);
    assert_null(ar_trace_live_at(r, 2));
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 0);
    ar_trace_close(r);
}

static void test_failed_step_leaves_state(void **state)
{
    (void)state;
    /* line 3 is bad only in its last request (b lacks a block), after a's append and a new
     * request were parsed; line 4 is the correct version and must still be accepted */
    const char *text = HDR S0
        "{\"step\":1,\"time\":0.5,\"new\":[{\"req\":\"d\",\"prompt_len\":4,\"num_computed_tokens\":0,\"block_ids\":[7]}],"
        "\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,\"new_block_ids\":[8]},"
        "{\"req\":\"b\",\"num_computed_tokens\":6,\"new_block_ids\":[]}],"
        "\"num_scheduled_tokens\":{\"d\":4,\"a\":1,\"b\":3},\"finished\":[],\"preempted\":[]}\n"
        "{\"step\":1,\"time\":0.5,\"new\":[{\"req\":\"d\",\"prompt_len\":4,\"num_computed_tokens\":0,\"block_ids\":[7]}],"
        "\"cached\":[{\"req\":\"a\",\"num_computed_tokens\":10,\"new_block_ids\":[8]},"
        "{\"req\":\"b\",\"num_computed_tokens\":6,\"new_block_ids\":[]}],"
        "\"num_scheduled_tokens\":{\"d\":4,\"a\":1,\"b\":1},\"finished\":[],\"preempted\":[]}\n";
    const char *path = write_trace("state.jsonl", text);
    char err[AR_ERR_MAX], before[1024], after[1024];
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    assert_non_null(r);
    const ar_step *s;
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 1);
    live_snapshot(r, before, sizeof before);
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), -1);
    assert_non_null(strstr(err, ":3: block list of 'b' does not cover"));
    live_snapshot(r, after, sizeof after);
    assert_string_equal(before, after);
    assert_null(ar_trace_find(r, "d"));
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 1);
    assert_int_equal(s->step, 1);
    assert_int_equal(s->line, 4);
    live_snapshot(r, after, sizeof after);
    assert_string_equal(after, "a p10 c10 [1,2,3,8,] b p6 c6 [4,5,] d p4 c0 [7,] ");
    ar_trace_close(r);
}

static void test_blank_lines_and_long_line(void **state)
{
    (void)state;
    /* 20,000 blocks of 4 tokens in one request: a line of about 120 KB */
    const int nb = 20000;
    size_t cap = (size_t)nb * 8 + 4096;
    char *text = malloc(cap);
    assert_non_null(text);
    /* a header with room for 30000 blocks and a large budget, then two blank lines */
    int n = snprintf(text, cap,
                 "{\"format\":\"attnreplay-trace\",\"version\":1,\"model\":{\"name\":\"t\",\"num_layers\":1,"
                 "\"num_q_heads\":1,\"num_kv_heads\":1,\"head_size\":8},\"cache\":{\"block_size\":4,\"num_blocks\":30000,"
                 "\"dtype\":\"fp16\"},\"scheduler\":{\"max_num_batched_tokens\":100000,\"max_num_seqs\":4}}\n\n  \n"
                 "{\"step\":0,\"time\":0,\"new\":[{\"req\":\"big\",\"prompt_len\":%d,\"num_computed_tokens\":0,\"block_ids\":[",
                 nb * 4);
    for (int i = 0; i < nb; i++) n += snprintf(text + n, cap - (size_t)n, i ? ",%d" : "%d", i + 1);
    n += snprintf(text + n, cap - (size_t)n, "]}],\"cached\":[],\"num_scheduled_tokens\":{\"big\":%d}}\n\n", nb * 4);
    const char *path = write_trace("long.jsonl", text);
    free(text);
    char err[AR_ERR_MAX];
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    assert_non_null(r);
    const ar_step *s;
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 1);
    assert_int_equal(s->line, 4);   /* two blank lines skipped but counted */
    assert_int_equal(s->new_reqs[0].num_block_ids, nb);
    assert_int_equal(s->new_reqs[0].block_ids[nb - 1], nb);
    assert_int_equal(ar_trace_find(r, "big")->num_prompt_keys, nb);
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 0);
    ar_trace_close(r);
}

/* ---- damaged gzip ------------------------------------------------------------------------------- */

static unsigned char *sample_bytes(const char *name, size_t *len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/traces/samples/%s", tu_src_dir(), name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = malloc(1 << 20);
    *len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

static int read_all(const char *path, char *err, size_t err_len, long *steps)
{
    ar_trace_reader *r = ar_trace_open(path, err, err_len);
    if (!r) return -1;
    const ar_step *s;
    int rc;
    *steps = 0;
    while ((rc = ar_trace_next(r, &s, err, err_len)) == 1) (*steps)++;
    ar_trace_close(r);
    return rc;
}

static void test_truncated_gzip(void **state)
{
    (void)state;
    size_t len = 0;
    unsigned char *buf = sample_bytes("prefix.trace.jsonl.gz", &len);
    assert_non_null(buf);
    char path[4096], err[AR_ERR_MAX];
    tu_tmp("trunc.trace.jsonl.gz", path, sizeof path);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len * 2 / 3, f), len * 2 / 3);
    fclose(f);
    long steps = 0;
    assert_int_equal(read_all(path, err, sizeof err, &steps), -1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "corrupt or truncated gzip"));
    if (!(steps > 0 && steps < 25)) print_error("steps %ld\n", steps);
    assert_true(steps > 0 && steps < 25);
    free(buf);
}

static void test_corrupt_gzip(void **state)
{
    (void)state;
    size_t len = 0;
    unsigned char *buf = sample_bytes("mixed.trace.jsonl.gz", &len);
    assert_non_null(buf);
    char path[4096], err[AR_ERR_MAX];
    long steps = 0;
    /* a wrong CRC in the trailer: every line decodes, then the check fails */
    buf[len - 8] ^= 0xff;
    tu_tmp("crc.trace.jsonl.gz", path, sizeof path);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
    assert_int_equal(read_all(path, err, sizeof err, &steps), -1);
    assert_non_null(strstr(err, "corrupt or truncated gzip"));
    buf[len - 8] ^= 0xff;
    /* garbage in the middle of the deflate stream: rejected cleanly, whatever the rule */
    for (size_t i = len / 2; i < len / 2 + 16; i++) buf[i] ^= 0x5a;
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    fclose(f);
    assert_int_equal(read_all(path, err, sizeof err, &steps), -1);
    assert_non_null(strstr(err, path));
    free(buf);
}

/* ---- samples ------------------------------------------------------------------------------------ */

static const char *sample_path(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/traces/samples/%s", tu_src_dir(), name);
    return buf;
}

static void test_stats_on_samples(void **state)
{
    (void)state;
    char path[4096], err[AR_ERR_MAX];
    ar_trace_stats st[AR_NUM_SAMPLES];
    ar_trace_header h;
    for (int i = 0; i < AR_NUM_SAMPLES; i++) {
        int rc = ar_trace_stats_compute(sample_path(ar_sample_name(i), path, sizeof path), &st[i], &h, err, sizeof err);
        if (rc != 0) print_error("%s\n", err);
        assert_int_equal(rc, 0);
        assert_string_equal(h.model.name, "tiny-gqa");
        assert_int_equal(h.model.num_q_heads, 8);
        assert_int_equal(h.model.num_kv_heads, 2);
        assert_int_equal(h.cache.block_size, 16);
        assert_int_equal(h.cache.dtype, AR_BF16);
        assert_true(st[i].tokens == st[i].prefill_tokens + st[i].decode_tokens);
        assert_true(st[i].steps >= st[i].prefill_only_steps + st[i].decode_only_steps + st[i].mixed_steps);
        assert_true(st[i].tokens < 4000);
        assert_true(st[i].max_context < 1000);
        assert_true(st[i].max_batch_tokens <= 256);
    }
    /* mixed, chunked, prefix, preempt */
    assert_true(st[0].mixed_steps > 0 && st[0].requests >= 6 && st[0].steps >= 20);
    assert_true(st[1].max_context >= 700 && st[1].mixed_steps > 0);
    assert_true(st[2].cascade_eligible_steps > 0 && st[2].prefix_hit_blocks >= 20 * 8 && st[2].requests >= 9);
    assert_int_equal(st[3].preemptions, 1);
    for (int i = 0; i < 3; i++) assert_int_equal(st[i].preemptions, 0);
}

/* Independently recounts tokens from the step records and checks the stats agree. */
static void test_stats_tokens_independent(void **state)
{
    (void)state;
    char path[4096], err[AR_ERR_MAX];
    sample_path("chunked.trace.jsonl.gz", path, sizeof path);
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    assert_non_null(r);
    const ar_step *s;
    int64_t tokens = 0, steps = 0, first_chunk = 0;
    while (ar_trace_next(r, &s, err, sizeof err) == 1) {
        steps++;
        for (int i = 0; i < s->num_scheduled; i++) tokens += s->scheduled[i].num_tokens;
        for (int i = 0; i < s->num_new; i++)
            if (s->new_reqs[i].prompt_len == 700) first_chunk = s->step;
    }
    ar_trace_close(r);
    ar_trace_stats st;
    assert_int_equal(ar_trace_stats_compute(path, &st, NULL, err, sizeof err), 0);
    assert_true(st.tokens == tokens);
    assert_true(st.steps == steps);
    assert_true(first_chunk > 0);
    /* the 700-token prompt alone is at least 700 prefill tokens */
    assert_true(st.prefill_tokens >= 700);
}

/* What print (ar_trace_print_info or ar_trace_print_steps) writes for trace; NULL with err set
 * when it fails. */
static char *printed(int (*print)(const char *, FILE *, char *, size_t), const char *trace, char *err, size_t err_len)
{
    char out[4096];
    tu_tmp("printed.txt", out, sizeof out);
    FILE *f = fopen(out, "w");
    assert_non_null(f);
    int rc = print(trace, f, err, err_len);
    fclose(f);
    return rc == 0 ? tu_slurp(out) : NULL;
}

static void test_info_output(void **state)
{
    (void)state;
    char path[4096], err[AR_ERR_MAX];
    sample_path("preempt.trace.jsonl.gz", path, sizeof path);
    char *text = printed(ar_trace_print_info, path, err, sizeof err);
    assert_non_null(text);
    assert_non_null(strstr(text, "tiny-gqa"));
    assert_non_null(strstr(text, "preempted  1 times"));
    assert_non_null(strstr(text, "132 SMs"));
    assert_non_null(strstr(text, "max_num_batched_tokens 256"));
    free(text);
    /* a broken trace: the error names the line */
    const char *bad = write_trace("info-bad.jsonl", HDR S0 "{\"step\":5}\n");
    assert_null(printed(ar_trace_print_info, bad, err, sizeof err));
    assert_non_null(strstr(err, ":3: "));
}

/* info --steps: one line per step whose numbers are the step's own (checked by hand on a
 * two-step trace) and add up to info's totals on a sample. */
static void test_info_steps(void **state)
{
    (void)state;
    char err[AR_ERR_MAX];
    const char *trace = write_trace("steps.jsonl", HDR S0 S1);
    char *text = printed(ar_trace_print_steps, trace, err, sizeof err);
    assert_non_null(text);
    /* step 0: a prefills 10 tokens (10 x 5.5 pairs), b 6 (6 x 3.5); step 1: both decode one
     * token after 10 and 6 (11 + 7 pairs, seq_lens 11 + 7) */
    assert_string_equal(text, "#step time_s requests tokens prefill_tokens max_seq_len kv_tokens qk_pairs "
                              "cascade_eligible\n"
                              "0 0.000000 2 16 16 10 16 76 0\n"
                              "1 0.500000 2 2 0 11 18 18 0\n");
    free(text);
    char path[4096];
    sample_path("chunked.trace.jsonl.gz", path, sizeof path);
    text = printed(ar_trace_print_steps, path, err, sizeof err);
    assert_non_null(text);
    ar_trace_stats st;
    assert_int_equal(ar_trace_stats_compute(path, &st, NULL, err, sizeof err), 0);
    long long rows = 0, tokens = 0, prefill = 0, max_seq = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        long long step, reqs, tok, pre, seq;
        double t;
        assert_int_equal(sscanf(line, "%lld %lf %lld %lld %lld %lld", &step, &t, &reqs, &tok, &pre, &seq), 6);
        assert_int_equal(step, rows);
        rows++;
        tokens += tok;
        prefill += pre;
        if (seq > max_seq) max_seq = seq;
    }
    free(text);
    assert_int_equal(rows, st.steps);
    assert_int_equal(tokens, st.tokens);
    assert_int_equal(prefill, st.prefill_tokens);
    assert_int_equal(max_seq, st.max_context);
    /* a broken trace: FILE:LINE: rule, as for the summary */
    const char *bad = write_trace("steps-bad.jsonl", HDR S0 "{\"step\":5}\n");
    assert_null(printed(ar_trace_print_steps, bad, err, sizeof err));
    assert_non_null(strstr(err, ":3: "));
}

/* Every block shared by two live requests holds the same content (equal keys), and the samples
 * reuse freed blocks for other content. */
static void test_samples_blocks_consistent(void **state)
{
    (void)state;
    int reused = 0;
    for (int i = 0; i < AR_NUM_SAMPLES; i++) {
        char path[4096], err[AR_ERR_MAX];
        ar_trace_reader *r = ar_trace_open(sample_path(ar_sample_name(i), path, sizeof path), err, sizeof err);
        assert_non_null(r);
        int nb = ar_trace_header_of(r)->cache.num_blocks;
        uint64_t *key_now = calloc((size_t)nb, sizeof *key_now), *key_ever = calloc((size_t)nb, sizeof *key_ever);
        int *stamp = calloc((size_t)nb, sizeof *stamp);
        const ar_step *s;
        int step = 0;
        while (ar_trace_next(r, &s, err, sizeof err) == 1) {
            step++;
            for (int q = 0; q < ar_trace_live_count(r); q++) {
                const ar_live_req *lr = ar_trace_live_at(r, q);
                uint64_t prev = AR_ROOT_KEY;
                for (int b = 0; b < lr->num_blocks; b++) {
                    uint64_t k = ar_block_content_key(prev, lr->prompt_keys, lr->num_prompt_keys, lr->req_key, b);
                    int id = lr->block_ids[b];
                    if (stamp[id] == step) {
                        assert_true(key_now[id] == k);   /* shared: same content */
                    } else {
                        stamp[id] = step;
                        key_now[id] = k;
                        if (key_ever[id] && key_ever[id] != k) reused++;
                        key_ever[id] = k;
                    }
                    prev = k;
                }
            }
        }
        free(key_now);
        free(key_ever);
        free(stamp);
        ar_trace_close(r);
    }
    assert_true(reused > 0);
}

static char *decoded(const char *path, size_t *len)
{
    gzFile gz = gzopen(path, "rb");
    if (!gz) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    int got;
    while ((got = gzread(gz, buf + n, (unsigned)(cap - n))) > 0) {
        n += (size_t)got;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    gzclose(gz);
    *len = n;
    return buf;
}

static void test_samples_regenerate(void **state)
{
    (void)state;
    char dir[4096], err[AR_ERR_MAX];
    tu_tmp("regen", dir, sizeof dir);
    assert_int_equal(tu_run(NULL, "mkdir -p '%s'", dir), 0);
    int rc = ar_samples_write(dir, err, sizeof err);
    if (rc != 0) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    for (int i = 0; i < AR_NUM_SAMPLES; i++) {
        char a[4096], b[8200];
        sample_path(ar_sample_name(i), a, sizeof a);
        snprintf(b, sizeof b, "%s/%s", dir, ar_sample_name(i));
        size_t la = 0, lb = 0;
        char *da = decoded(a, &la), *db = decoded(b, &lb);
        assert_non_null(da);
        assert_non_null(db);
        assert_true(la > 1000);
        assert_int_equal(la, lb);
        assert_memory_equal(da, db, la);
        free(da);
        free(db);
    }
    assert_null(ar_sample_name(AR_NUM_SAMPLES));
    char missing[4096];
    tu_tmp("no-dir/sub", missing, sizeof missing);
    assert_int_equal(ar_samples_write(missing, err, sizeof err), -1);
}

/* What `ls -A dir | filter` prints, as a number. */
static int count_lines(const char *dir, const char *filter)
{
    char out[4096];
    tu_tmp("count.out", out, sizeof out);
    tu_run(NULL, "ls -A '%s' | %s >'%s'", dir, filter, out);
    char *text = tu_slurp(out);
    int n = text ? atoi(text) : -1;
    free(text);
    return n;
}

static void assert_whole_samples_only(const char *dir)
{
    assert_int_equal(count_lines(dir, "grep -c tmp-"), 0);
    char log[4096];
    tu_tmp("whole.log", log, sizeof log);
    int rc = tu_run(log, "for f in '%s'/*; do [ -e \"$f\" ] || continue; '%s' info \"$f\" >/dev/null || exit 1; done", dir, tu_bin());
    if (rc != 0) {
        char *text = tu_slurp(log);
        fail_msg("%s holds a sample that is not whole: %s", dir, text ? text : "");
    }
}

/* `gen-samples DIR`: an empty DIR is refused (it named the root directory), a missing DIR is
 * created, and a run that fails part-way (a full disk) or is stopped leaves no part-written
 * sample: every file in DIR reads as a whole trace and no NAME.tmp-PID stays. */
static void test_gen_samples_dir_and_failures(void **state)
{
    (void)state;
    char dir[4096], log[4096], cmd_dir[4096];
    tu_tmp("gs-cwd", cmd_dir, sizeof cmd_dir);
    tu_tmp("gs.log", log, sizeof log);
    assert_int_equal(tu_run(NULL, "mkdir -p '%s'", cmd_dir), 0);
    assert_int_equal(tu_run(log, "cd '%s' && '%s' gen-samples ''", cmd_dir, tu_bin()), 2);
    assert_true(tu_file_has(log, "DIR is empty"));
    assert_int_equal(count_lines(cmd_dir, "wc -l"), 0);

    tu_tmp("gs-new", dir, sizeof dir);
    assert_int_equal(tu_run(log, "'%s' gen-samples '%s'", tu_bin(), dir), 0);
    assert_int_equal(count_lines(dir, "wc -l"), AR_NUM_SAMPLES + AR_NUM_SHAPE_SAMPLES);
    assert_whole_samples_only(dir);

    /* a file-size limit of 8 KiB: the first sample larger than that fails; an earlier sample of
     * that name (here an empty file a user put there) is left as it was */
    tu_tmp("gs-full", dir, sizeof dir);
    assert_int_equal(tu_run(NULL, "mkdir -p '%s' && : >'%s/llama-3.1-8b.trace.jsonl.gz'", dir, dir), 0);
    int rc = tu_run(log, "ulimit -f 8; trap '' XFSZ; '%s' gen-samples '%s'", tu_bin(), dir);
    assert_int_equal(rc, 2);
    assert_true(tu_file_has(log, "File too large"));
    assert_int_equal(count_lines(dir, "grep -c tmp-"), 0);
    char kept[4200];
    snprintf(kept, sizeof kept, "%s/llama-3.1-8b.trace.jsonl.gz", dir);
    char *empty = tu_slurp(kept);
    assert_non_null(empty);
    assert_string_equal(empty, "");
    free(empty);
    assert_int_equal(tu_run(NULL, "rm '%s'", kept), 0);
    assert_whole_samples_only(dir);

    /* SIGTERM at several points of the run */
    static const char *const delays[] = { "0.002", "0.005", "0.01", "0.015", "0.02", "0.03" };
    for (size_t i = 0; i < sizeof delays / sizeof delays[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "gs-term%zu", i);
        tu_tmp(name, dir, sizeof dir);
        tu_run(log, "mkdir -p '%s' && timeout -s TERM %s '%s' gen-samples '%s'", dir, delays[i], tu_bin(), dir);
        assert_whole_samples_only(dir);
    }
}

/* The public workload files are request lists, not attnreplay traces: rejected cleanly. */
static void test_public_files_are_not_traces(void **state)
{
    (void)state;
    char buf[4096], err[AR_ERR_MAX];
    const char *mooncake = tu_public_trace("mooncake-fast25/synthetic_trace.jsonl", buf, sizeof buf);
    if (!mooncake) {
        skip();
        return;
    }
    assert_null(ar_trace_open(mooncake, err, sizeof err));
    assert_non_null(strstr(err, ":1: not an attnreplay trace"));
    const char *azure = tu_public_trace("azure-llm-2023/AzureLLMInferenceTrace_code.csv", buf, sizeof buf);
    if (azure) {
        assert_null(ar_trace_open(azure, err, sizeof err));
        assert_non_null(strstr(err, ":1: bad JSON"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_not_a_trace),
        cmocka_unit_test(test_header_version),
        cmocka_unit_test(test_header_missing_field),
        cmocka_unit_test(test_header_heads_range),
        cmocka_unit_test(test_header_heads_divisible),
        cmocka_unit_test(test_header_head_size_range),
        cmocka_unit_test(test_header_block_size),
        cmocka_unit_test(test_header_num_blocks),
        cmocka_unit_test(test_header_dtype),
        cmocka_unit_test(test_header_wrong_type),
        cmocka_unit_test(test_header_mla),
        cmocka_unit_test(test_header_defaults),
        cmocka_unit_test(test_empty_and_missing_file),
        cmocka_unit_test(test_step_bad_json),
        cmocka_unit_test(test_step_missing_field),
        cmocka_unit_test(test_step_wrong_type),
        cmocka_unit_test(test_step_consecutive),
        cmocka_unit_test(test_step_time),
        cmocka_unit_test(test_new_already_live),
        cmocka_unit_test(test_cached_not_live),
        cmocka_unit_test(test_resumed_not_preempted),
        cmocka_unit_test(test_preempted_not_resumed),
        cmocka_unit_test(test_duplicate_ids),
        cmocka_unit_test(test_scheduled_not_in_new_or_cached),
        cmocka_unit_test(test_new_missing_from_scheduled),
        cmocka_unit_test(test_scheduled_at_least_one),
        cmocka_unit_test(test_budget_tokens),
        cmocka_unit_test(test_budget_seqs),
        cmocka_unit_test(test_block_id_range),
        cmocka_unit_test(test_block_coverage),
        cmocka_unit_test(test_block_twice),
        cmocka_unit_test(test_computed_continuity),
        cmocka_unit_test(test_new_computed_range),
        cmocka_unit_test(test_new_prompt_fits_the_cache),
        cmocka_unit_test(test_step_keys_bounded),
        cmocka_unit_test(test_given_keys_bounded),
        cmocka_unit_test(test_live_keys_bounded),
        cmocka_unit_test(test_new_past_prompt),
        cmocka_unit_test(test_new_computed_whole_blocks),
        cmocka_unit_test(test_block_keys_count),
        cmocka_unit_test(test_prompt_token_ids_length),
        cmocka_unit_test(test_finished_rules),
        cmocka_unit_test(test_preempted_rules),
        cmocka_unit_test(test_common_prefix_rules),
        cmocka_unit_test(test_block_ownership_rejects),
        cmocka_unit_test(test_block_ownership_sharing),
        cmocka_unit_test(test_block_ownership_rollback),
        cmocka_unit_test(test_content_keys),
        cmocka_unit_test(test_live_table_semantics),
        cmocka_unit_test(test_failed_step_leaves_state),
        cmocka_unit_test(test_blank_lines_and_long_line),
        cmocka_unit_test(test_truncated_gzip),
        cmocka_unit_test(test_corrupt_gzip),
        cmocka_unit_test(test_stats_on_samples),
        cmocka_unit_test(test_stats_tokens_independent),
        cmocka_unit_test(test_info_output),
        cmocka_unit_test(test_info_steps),
        cmocka_unit_test(test_samples_blocks_consistent),
        cmocka_unit_test(test_samples_regenerate),
        cmocka_unit_test(test_gen_samples_dir_and_failures),
        cmocka_unit_test(test_public_files_are_not_traces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
