/* test_tracewrite.c - the trace writer: a simulated trace written as .jsonl and as .jsonl.gz
 * (several gzip members, compressed on worker threads) holds the same bytes, reads back through
 * the validating reader step for step, and keeps step times exact (the whole-microsecond fast
 * path and the general one); write errors (a full disk) are reported, never lost; hand-made
 * headers and steps (MLA, cascade, preemption) and the samples round-trip field for field, plain
 * and gzip, and the writer's own errors are named. */
#include "testutil.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "../sim/sim.h"
#include "../traces/trace.h"

static ar_sim_config make_cfg(void)
{
    ar_sim_config c;
    memset(&c, 0, sizeof c);
    c.header.version = AR_TRACE_VERSION;
    c.header.model = ar_model_preset_find("llama-3.1-8b")->model;
    c.header.cache.block_size = 16;
    c.header.cache.num_blocks = 32768;
    c.header.cache.dtype = AR_BF16;
    c.header.cache.kv_cache_dtype = AR_BF16;
    c.header.sched.max_num_batched_tokens = 4096;
    c.header.sched.max_num_seqs = 256;
    c.header.sched.prefix_caching = true;
    c.steptime.kind = AR_STEPTIME_CONSTANT;
    c.steptime.constant_s = 0.013;
    c.num_sms = 132;
    return c;
}

/* Simulates a shared-prefix workload into each path; returns the number of steps. */
static int64_t simulate_into(const char *const *paths, int num_paths)
{
    char err[AR_ERR_MAX];
    ar_workload wl;
    assert_int_equal(ar_workload_synthetic("groups=4,prompts=60,system=1024,question=512,output=150,rate=60", 16, &wl,
                                           err, sizeof err), 0);
    ar_sim_config cfg = make_cfg();
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    assert_non_null(s);
    ar_trace_writer *w[4];
    for (int i = 0; i < num_paths; i++) {
        w[i] = ar_trace_create(paths[i], &cfg.header, err, sizeof err);
        if (!w[i]) fail_msg("%s", err);
    }
    const ar_step *st;
    int64_t steps = 0;
    while (ar_sim_step(s, &st, err, sizeof err) == 1) {
        for (int i = 0; i < num_paths; i++) assert_int_equal(ar_trace_write_step(w[i], st, err, sizeof err), 0);
        steps++;
    }
    for (int i = 0; i < num_paths; i++) assert_int_equal(ar_trace_finish(w[i], err, sizeof err), 0);
    ar_sim_destroy(s);
    ar_workload_free(&wl);
    return steps;
}

/* The whole decompressed content of a gzip file (all members), or NULL. */
static char *gunzip_all(const char *path, size_t *len)
{
    gzFile gz = gzopen(path, "rb");
    if (!gz) return NULL;
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 65536 > cap) buf = realloc(buf, cap *= 2);
        int got = gzread(gz, buf + n, 65536);
        if (got <= 0) {
            int zerr = 0;
            gzerror(gz, &zerr);
            gzclose(gz);
            if (got < 0 || zerr != Z_OK) { free(buf); return NULL; }
            break;
        }
        n += (size_t)got;
    }
    *len = n;
    return buf;
}

/* Counts gzip members by walking them with zlib's inflate (each member ends its own stream). */
static int count_members(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    unsigned char *in = malloc((size_t)size), out[65536];
    assert_int_equal(fread(in, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    int members = 0;
    size_t pos = 0;
    while (pos < (size_t)size) {
        z_stream z;
        memset(&z, 0, sizeof z);
        assert_int_equal(inflateInit2(&z, 16 + 15), Z_OK);
        z.next_in = in + pos;
        z.avail_in = (uInt)((size_t)size - pos);
        int rc;
        do {
            z.next_out = out;
            z.avail_out = sizeof out;
            rc = inflate(&z, Z_NO_FLUSH);
        } while (rc == Z_OK);
        assert_int_equal(rc, Z_STREAM_END);
        pos += z.total_in;
        inflateEnd(&z);
        members++;
    }
    free(in);
    return members;
}

/* .jsonl and .jsonl.gz of one simulation: the same bytes, several members, and the gzip one
 * reads back through the validating reader to the last step. */
static void test_gzip_matches_plain_and_reads_back(void **state)
{
    (void)state;
    char plain[512], gz[512], err[AR_ERR_MAX];
    tu_tmp("w.trace.jsonl", plain, sizeof plain);
    tu_tmp("w.trace.jsonl.gz", gz, sizeof gz);
    const char *paths[2] = {plain, gz};
    int64_t steps = simulate_into(paths, 2);
    assert_true(steps > 100);
    char *text = tu_slurp(plain);
    assert_non_null(text);
    size_t len = 0;
    char *unzipped = gunzip_all(gz, &len);
    assert_non_null(unzipped);
    assert_int_equal(len, strlen(text));
    assert_true(len > (3u << 20));            /* several 1 MiB chunks: several members */
    assert_memory_equal(unzipped, text, len);
    assert_true(count_members(gz) >= 3);
    ar_trace_reader *r = ar_trace_open(gz, err, sizeof err);
    if (!r) fail_msg("%s", err);
    const ar_step *st;
    int64_t read = 0;
    int rc;
    while ((rc = ar_trace_next(r, &st, err, sizeof err)) == 1) read++;
    if (rc != 0) fail_msg("%s", err);
    assert_int_equal(read, steps);
    ar_trace_close(r);
    free(text);
    free(unzipped);
}

/* Step times survive the writer exactly: whole microseconds (fast path) and others. */
static void test_step_times_exact(void **state)
{
    (void)state;
    /* non-decreasing, as the reader wants */
    static const double times[] = {0.0, 1e-7, 0.0001, 0.000123, 0.1 + 0.2, 1.0 / 3.0, 0.5, 1.0, 3.000001, 12.5,
                                   123456.789012, 987654321.5, 2e9 + 0.25};
    const int n = (int)(sizeof times / sizeof times[0]);
    char path[512], err[AR_ERR_MAX];
    tu_tmp("times.trace.jsonl.gz", path, sizeof path);
    ar_sim_config cfg = make_cfg();
    ar_trace_writer *w = ar_trace_create(path, &cfg.header, err, sizeof err);
    assert_non_null(w);
    for (int i = 0; i < n; i++) {
        ar_step st;
        memset(&st, 0, sizeof st);
        st.step = i;
        st.time = times[i];
        assert_int_equal(ar_trace_write_step(w, &st, err, sizeof err), 0);
    }
    assert_int_equal(ar_trace_finish(w, err, sizeof err), 0);
    size_t len = 0;
    char *text = gunzip_all(path, &len);
    assert_non_null(text);
    /* the decimal forms %.15g gives */
    assert_non_null(strstr(text, "\"time\":0.000123,"));
    assert_non_null(strstr(text, "\"time\":12.5,"));
    assert_non_null(strstr(text, "\"time\":1.0,"));
    assert_non_null(strstr(text, "\"time\":1e-07,"));
    free(text);
    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    if (!r) fail_msg("%s", err);
    const ar_step *st;
    for (int i = 0; i < n; i++) {
        if (ar_trace_next(r, &st, err, sizeof err) != 1) fail_msg("step %d: %s", i, err);
        if (st->time != times[i]) fail_msg("step %d: wrote %.17g, read %.17g", i, times[i], st->time);
    }
    ar_trace_close(r);
}

/* A step time JSON cannot hold (inf, nan) is refused with the path and step, never written as
 * a line no reader takes; the steps before it read back. */
static void test_non_finite_time_is_refused(void **state)
{
    (void)state;
    char path[512], err[AR_ERR_MAX] = "";
    tu_tmp("inf.trace.jsonl", path, sizeof path);
    ar_sim_config cfg = make_cfg();
    ar_trace_writer *w = ar_trace_create(path, &cfg.header, err, sizeof err);
    assert_non_null(w);
    ar_step st;
    memset(&st, 0, sizeof st);
    st.time = 1.5;
    assert_int_equal(ar_trace_write_step(w, &st, err, sizeof err), 0);
    st.step = 1;
    st.time = INFINITY;
    assert_int_equal(ar_trace_write_step(w, &st, err, sizeof err), -1);
    if (!strstr(err, path) || !strstr(err, "step 1") || !strstr(err, "not a finite number")) fail_msg("%s", err);
    st.time = NAN;
    assert_int_equal(ar_trace_write_step(w, &st, err, sizeof err), -1);
    assert_int_equal(ar_trace_finish(w, err, sizeof err), 0);
    char *text = tu_slurp(path);
    assert_non_null(text);
    assert_null(strstr(text, "inf"));
    assert_null(strstr(text, "nan"));
    free(text);
}

/* A full disk (/dev/full behind a .gz or a plain name) is reported by a write or the finish. */
static void test_full_disk_is_reported(void **state)
{
    (void)state;
    if (access("/dev/full", W_OK) != 0) {
        fprintf(stderr, "skipping: no /dev/full\n");
        skip();
    }
    const char *names[2] = {"full.trace.jsonl.gz", "full.trace.jsonl"};
    for (int k = 0; k < 2; k++) {
        char path[512], err[AR_ERR_MAX] = "";
        tu_tmp(names[k], path, sizeof path);
        unlink(path);
        assert_int_equal(symlink("/dev/full", path), 0);
        ar_sim_config cfg = make_cfg();
        ar_trace_writer *w = ar_trace_create(path, &cfg.header, err, sizeof err);
        assert_non_null(w);
        ar_step st;
        memset(&st, 0, sizeof st);
        int failed_at = -1;
        for (int i = 0; i < 200000 && failed_at < 0; i++) {
            st.step = i;
            st.time = i * 0.01;
            if (ar_trace_write_step(w, &st, err, sizeof err) != 0) failed_at = i;
        }
        /* the first error names the cause; the finish then says an earlier write failed */
        char fin_err[AR_ERR_MAX] = "";
        assert_int_equal(ar_trace_finish(w, fin_err, sizeof fin_err), -1);
        if (failed_at < 0) snprintf(err, sizeof err, "%s", fin_err);
        else assert_non_null(strstr(fin_err, "an earlier write failed"));
        assert_non_null(strstr(err, path));
        if (!strstr(err, strerror(ENOSPC))) fail_msg("%s: %s", names[k], err);
    }
}

/* ---- writer round trips ------------------------------------------------------------------------- */

static ar_trace_header sample_header(void)
{
    ar_trace_header h;
    memset(&h, 0, sizeof h);
    h.version = 1;
    snprintf(h.model.name, sizeof h.model.name, "round \"trip\"\\model");
    h.model.attention = AR_ATTN_MHA;
    h.model.num_layers = 3;
    h.model.num_q_heads = 6;
    h.model.num_kv_heads = 3;
    h.model.head_size = 32;
    h.model.v_head_dim = 32;
    h.model.scale = 0.1;
    h.model.sliding_window = 128;
    h.model.logits_soft_cap = 30.0;
    h.cache.block_size = 4;
    h.cache.num_blocks = 64;
    h.cache.dtype = AR_FP16;
    h.cache.kv_cache_dtype = AR_FP8_E4M3;
    h.sched.max_num_batched_tokens = 32;
    h.sched.max_num_seqs = 8;
    h.sched.prefix_caching = false;
    h.sched.cascade = true;
    snprintf(h.source, sizeof h.source, "unit\ttest");
    h.seed = 18446744073709551615ull;
    return h;
}

static void assert_headers_equal(const ar_trace_header *a, const ar_trace_header *b)
{
    assert_string_equal(a->model.name, b->model.name);
    assert_int_equal(a->model.attention, b->model.attention);
    assert_int_equal(a->model.num_layers, b->model.num_layers);
    assert_int_equal(a->model.num_q_heads, b->model.num_q_heads);
    assert_int_equal(a->model.num_kv_heads, b->model.num_kv_heads);
    assert_int_equal(a->model.head_size, b->model.head_size);
    assert_int_equal(a->model.v_head_dim, b->model.v_head_dim);
    assert_true(a->model.scale == b->model.scale);
    assert_int_equal(a->model.sliding_window, b->model.sliding_window);
    assert_true(a->model.logits_soft_cap == b->model.logits_soft_cap);
    assert_int_equal(a->cache.block_size, b->cache.block_size);
    assert_int_equal(a->cache.num_blocks, b->cache.num_blocks);
    assert_int_equal(a->cache.dtype, b->cache.dtype);
    assert_int_equal(a->cache.kv_cache_dtype, b->cache.kv_cache_dtype);
    assert_int_equal(a->sched.max_num_batched_tokens, b->sched.max_num_batched_tokens);
    assert_int_equal(a->sched.max_num_seqs, b->sched.max_num_seqs);
    assert_int_equal(a->sched.prefix_caching, b->sched.prefix_caching);
    assert_int_equal(a->sched.cascade, b->sched.cascade);
    assert_string_equal(a->source, b->source);
    assert_true(a->seed == b->seed);
}

static void assert_steps_equal(const ar_step *a, const ar_step *b)
{
    assert_true(a->step == b->step);
    assert_true(a->time == b->time);
    assert_int_equal(a->num_new, b->num_new);
    for (int i = 0; i < a->num_new; i++) {
        const ar_new_req *x = &a->new_reqs[i], *y = &b->new_reqs[i];
        assert_string_equal(x->req, y->req);
        assert_int_equal(x->prompt_len, y->prompt_len);
        assert_int_equal(x->num_computed_tokens, y->num_computed_tokens);
        assert_int_equal(x->num_block_ids, y->num_block_ids);
        assert_memory_equal(x->block_ids, y->block_ids, (size_t)x->num_block_ids * sizeof(int));
        assert_int_equal(x->num_block_keys, y->num_block_keys);
        assert_memory_equal(x->block_keys, y->block_keys, (size_t)x->num_block_keys * sizeof(uint64_t));
    }
    assert_int_equal(a->num_cached, b->num_cached);
    for (int i = 0; i < a->num_cached; i++) {
        const ar_cached_req *x = &a->cached[i], *y = &b->cached[i];
        assert_string_equal(x->req, y->req);
        assert_int_equal(x->num_computed_tokens, y->num_computed_tokens);
        assert_int_equal(x->resumed, y->resumed);
        assert_int_equal(x->num_new_block_ids, y->num_new_block_ids);
        if (x->num_new_block_ids)
            assert_memory_equal(x->new_block_ids, y->new_block_ids, (size_t)x->num_new_block_ids * sizeof(int));
    }
    assert_int_equal(a->num_scheduled, b->num_scheduled);
    for (int i = 0; i < a->num_scheduled; i++) {
        assert_string_equal(a->scheduled[i].req, b->scheduled[i].req);
        assert_int_equal(a->scheduled[i].num_tokens, b->scheduled[i].num_tokens);
    }
    assert_int_equal(a->num_common_prefix_blocks, b->num_common_prefix_blocks);
    assert_int_equal(a->num_finished, b->num_finished);
    for (int i = 0; i < a->num_finished; i++) assert_string_equal(a->finished[i], b->finished[i]);
    assert_int_equal(a->num_preempted, b->num_preempted);
    for (int i = 0; i < a->num_preempted; i++) assert_string_equal(a->preempted[i], b->preempted[i]);
}

static void round_trip(const char *name)
{
    ar_trace_header h = sample_header();
    int a_blocks[] = {1, 2, 3}, q_blocks[] = {1, 4}, a_more[] = {5}, q_new[] = {6, 7, 8};
    uint64_t a_keys[] = {0x0123456789abcdefull, 0xfedcba9876543210ull}, q_keys[] = {0x0123456789abcdefull};
    ar_new_req n0[] = {{"a\"1", 10, 0, a_blocks, 3, a_keys, 2}, {"q\\2", 6, 4, q_blocks, 2, q_keys, 1}};
    ar_sched_entry s0[] = {{"a\"1", 10}, {"q\\2", 2}};
    ar_cached_req c1[] = {{"a\"1", 10, a_more, 1, false}, {"q\\2", 6, NULL, 0, false}};
    ar_sched_entry s1[] = {{"a\"1", 3}, {"q\\2", 1}};
    char *pre[] = {"a\"1"};
    ar_cached_req c2[] = {{"q\\2", 7, NULL, 0, false}};
    ar_sched_entry s2[] = {{"q\\2", 1}};
    ar_cached_req c3[] = {{"a\"1", 0, q_new, 3, true}};
    ar_sched_entry s3[] = {{"a\"1", 12}};
    char *fin[] = {"q\\2"};
    ar_step steps[4];
    memset(steps, 0, sizeof steps);
    steps[0] = (ar_step){.step = 0, .time = 0.0, .new_reqs = n0, .num_new = 2, .scheduled = s0, .num_scheduled = 2,
                         .num_common_prefix_blocks = 1};
    steps[1] = (ar_step){.step = 1, .time = 0.1, .cached = c1, .num_cached = 2, .scheduled = s1, .num_scheduled = 2};
    steps[2] = (ar_step){.step = 2, .time = 1.0 / 3.0, .cached = c2, .num_cached = 1, .scheduled = s2,
                         .num_scheduled = 1, .preempted = pre, .num_preempted = 1};
    steps[3] = (ar_step){.step = 3, .time = 1e6 + 0.5, .cached = c3, .num_cached = 1, .scheduled = s3,
                         .num_scheduled = 1, .finished = fin, .num_finished = 1};
    char path[4096], err[AR_ERR_MAX];
    tu_tmp(name, path, sizeof path);
    ar_trace_writer *w = ar_trace_create(path, &h, err, sizeof err);
    assert_non_null(w);
    for (int i = 0; i < 4; i++) assert_int_equal(ar_trace_write_step(w, &steps[i], err, sizeof err), 0);
    assert_int_equal(ar_trace_finish(w, err, sizeof err), 0);

    ar_trace_reader *r = ar_trace_open(path, err, sizeof err);
    if (!r) print_error("%s\n", err);
    assert_non_null(r);
    assert_headers_equal(&h, ar_trace_header_of(r));
    const ar_step *s;
    for (int i = 0; i < 4; i++) {
        int rc = ar_trace_next(r, &s, err, sizeof err);
        if (rc != 1) print_error("%s\n", err);
        assert_int_equal(rc, 1);
        assert_steps_equal(&steps[i], s);
    }
    assert_int_equal(ar_trace_next(r, &s, err, sizeof err), 0);
    ar_trace_close(r);

    /* gzip exactly when the name ends in .gz */
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char magic[2] = {0, 0};
    assert_int_equal(fread(magic, 1, 2, f), 2);
    fclose(f);
    bool is_gz = strstr(name, ".gz") != NULL;
    assert_int_equal(magic[0] == 0x1f && magic[1] == 0x8b, is_gz);
}

static void test_round_trip_plain(void **state)
{
    (void)state;
    round_trip("rt.trace.jsonl");
}

static void test_round_trip_gz(void **state)
{
    (void)state;
    round_trip("rt.trace.jsonl.gz");
}

static void test_write_errors(void **state)
{
    (void)state;
    char err[AR_ERR_MAX];
    ar_trace_header h = sample_header();
    char dir[4096];
    tu_tmp("no-such-dir/x.jsonl", dir, sizeof dir);
    assert_null(ar_trace_create(dir, &h, err, sizeof err));
    assert_non_null(strstr(err, "cannot create"));
    if (access("/dev/full", W_OK) != 0) {
        skip();
        return;
    }
    /* a full disk: /dev/full, plain and (through a .gz link) gzip */
    char gzlink[4096];
    tu_tmp("full-writer.trace.jsonl.gz", gzlink, sizeof gzlink);
    assert_int_equal(symlink("/dev/full", gzlink), 0);
    const char *targets[] = {"/dev/full", gzlink};
    for (int t = 0; t < 2; t++) {
        ar_trace_writer *w = ar_trace_create(targets[t], &h, err, sizeof err);
        int failed = w == NULL;
        int blocks[] = {1};
        ar_new_req nr = {"r", 4, 0, blocks, 1, NULL, 0};
        ar_sched_entry se = {"r", 4};
        ar_step s = {.new_reqs = &nr, .num_new = 1, .scheduled = &se, .num_scheduled = 1};
        for (int i = 0; w && i < 20000 && !failed; i++) {
            s.step = i;
            failed = ar_trace_write_step(w, &s, err, sizeof err) != 0;
        }
        if (w) failed = (ar_trace_finish(w, err, sizeof err) != 0) || failed;
        assert_true(failed);
        assert_true(strstr(err, "failed") != NULL || strstr(err, "cannot create") != NULL);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gzip_matches_plain_and_reads_back),
        cmocka_unit_test(test_step_times_exact),
        cmocka_unit_test(test_non_finite_time_is_refused),
        cmocka_unit_test(test_full_disk_is_reported),
        cmocka_unit_test(test_round_trip_plain),
        cmocka_unit_test(test_round_trip_gz),
        cmocka_unit_test(test_write_errors),
    };
    return cmocka_run_group_tests_name("tracewrite", tests, NULL, NULL);
}
