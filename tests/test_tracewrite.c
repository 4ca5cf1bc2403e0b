/* test_tracewrite.c - the trace writer: a simulated trace written as .jsonl and as .jsonl.gz
 * (several gzip members, compressed on worker threads) holds the same bytes, reads back through
 * the validating reader step for step, and keeps step times exact (the whole-microsecond fast
 * path and the general one); write errors (a full disk) are reported, never lost. */
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gzip_matches_plain_and_reads_back),
        cmocka_unit_test(test_step_times_exact),
        cmocka_unit_test(test_non_finite_time_is_refused),
        cmocka_unit_test(test_full_disk_is_reported),
    };
    return cmocka_run_group_tests_name("tracewrite", tests, NULL, NULL);
}
