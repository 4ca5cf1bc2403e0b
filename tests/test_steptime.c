/* test_steptime.c - the step-time model's terms (sim/steptime.c): CUDA-graph padding against vLLM's
 * capture-size list, async scheduling, the tensor-parallel all-reduce per interconnect, the
 * per-device efficiency tables, batch-shape-dependent attention, the parser's rules; and the
 * measured-profile path (sim/profile.c): the SQLite format, its validation, the interpolation, a
 * synthetic profile that must reproduce the roofline it was made from, and attention timed through
 * the CPU backend; and the step timings of a real run (sim/stepfit.c): exact step counts between
 * request stamps on hand-made, random and simulated runs, a preemption's disagreement detected,
 * the model's residuals on a simulated run, outlier rejection, the requests.jsonl rules. */
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../sim/sim.h"

static const ar_model_preset *l8(void) { return ar_model_preset_find("llama-3.1-8b"); }

static void parse_ok(const char *spec, ar_steptime *st)
{
    char err[1024];
    if (ar_steptime_parse(spec, l8(), st, err, sizeof err) != 0) fail_msg("%s: %s", spec, err);
}

/* vLLM's capture sizes for max_size: [1, 2, 4] + range(8, 256, 8) + range(256, max_size + 1, 16). */
static int vllm_sizes(int max_size, int *out)
{
    int n = 0;
    for (int s = 1; s <= 4; s *= 2) if (s <= max_size) out[n++] = s;
    for (int s = 8; s < 256; s += 8) if (s <= max_size) out[n++] = s;
    for (int s = 256; s <= max_size; s += 16) out[n++] = s;
    return n;
}

static void test_cudagraph_pad_matches_vllm_list(void **state)
{
    (void)state;
    int sizes[128];
    const int limits[] = {512, 256, 100, 8};
    for (size_t l = 0; l < sizeof limits / sizeof limits[0]; l++) {
        int n = vllm_sizes(limits[l], sizes);
        for (int t = 1; t <= 700; t++) {
            int want = t;   /* the smallest capture size >= t, or t itself (eager) */
            for (int i = 0; i < n; i++) if (sizes[i] >= t) { want = sizes[i]; break; }
            if (ar_cudagraph_pad(t, limits[l]) != want)
                fail_msg("pad(%d, max %d) = %d, vLLM's list gives %d", t, limits[l], ar_cudagraph_pad(t, limits[l]), want);
        }
    }
    assert_int_equal(ar_cudagraph_pad(3, 0), 3);   /* graphs off */
    /* the default limit follows vLLM: min(2 x max_num_seqs, 512) */
    ar_steptime st;
    parse_ok("roofline:h200", &st);
    assert_int_equal(st.cudagraph_max, -1);
    ar_steptime_set_engine(&st, 128);
    assert_int_equal(st.cudagraph_max, 256);
    parse_ok("roofline:h200", &st);
    ar_steptime_set_engine(&st, 1024);
    assert_int_equal(st.cudagraph_max, 512);
    parse_ok("roofline:h200,graph=0", &st);
    ar_steptime_set_engine(&st, 1024);
    assert_int_equal(st.cudagraph_max, 0);
}

/* A 3-token decode batch runs its GEMMs as 4 tokens under graphs, as 3 without. */
static void test_padding_reaches_the_gemms(void **state)
{
    (void)state;
    int q[3] = {1, 1, 1}, c[3] = {100, 200, 300};
    ar_batch_features f = {.num_reqs = 3, .num_tokens = 3, .num_decode_reqs = 3, .kv_tokens_read = 603,
                           .attn_pairs = 603, .query_lens = q, .context_lens = c};
    ar_steptime on, off;
    parse_ok("roofline:h200,gemm_eff=1,bw_eff=1", &on);
    parse_ok("roofline:h200,gemm_eff=1,bw_eff=1,graph=0", &off);
    ar_steptime_set_engine(&on, 256);
    ar_steptime_set_engine(&off, 256);
    ar_step_parts a, b;
    ar_steptime_parts(&on, &f, &a);
    ar_steptime_parts(&off, &f, &b);
    assert_int_equal(a.padded_tokens, 4);
    assert_int_equal(b.padded_tokens, 3);
    assert_true(a.linear_s > b.linear_s);       /* one more token's activations */
    assert_true(a.attn_s == b.attn_s);          /* attention sees the real requests */
}

/* Async: the CPU part hides under the GPU part (max); synchronous: they add. */
static void test_async_overlaps_cpu(void **state)
{
    (void)state;
    int q[1] = {1}, c[1] = {1000};
    ar_batch_features f = {.num_reqs = 1, .num_tokens = 1, .num_decode_reqs = 1, .kv_tokens_read = 1001,
                           .attn_pairs = 1001, .query_lens = q, .context_lens = c};
    ar_steptime as, sy;
    parse_ok("roofline:rtx4090,overhead=0.002,per_req=0.001", &as);
    parse_ok("roofline:rtx4090,overhead=0.002,per_req=0.001,async=0", &sy);
    assert_true(as.async_scheduling);
    assert_false(sy.async_scheduling);
    ar_step_parts p;
    ar_steptime_parts(&as, &f, &p);
    double gpu = p.linear_s + p.attn_s + p.allreduce_s;
    assert_true(fabs(p.cpu_s - 0.003) < 1e-12);
    assert_true(gpu > p.cpu_s);   /* a 4090 streams 15 GB of weights: ~19 ms */
    assert_true(fabs(ar_steptime_eval(&as, &f) - gpu) < 1e-12);
    assert_true(fabs(ar_steptime_eval(&sy, &f) - (gpu + 0.003)) < 1e-12);
    /* when the CPU part is the longer one, it is the step */
    parse_ok("roofline:rtx4090,overhead=0.5", &as);
    assert_true(fabs(ar_steptime_eval(&as, &f) - 0.5) < 1e-12);
}

/* kv_eff scales the decode attention's KV reads and nothing else; by default it is the device
 * table's measured KV-read rate, on a device without one bw_eff.  gap adds to the GPU part, so
 * async scheduling does not hide it. */
static void test_kv_eff_and_gap(void **state)
{
    (void)state;
    int q[4] = {1, 1, 1, 1}, c[4] = {4000, 4000, 4000, 4000};
    ar_batch_features f = {.num_reqs = 4, .num_tokens = 4, .num_decode_reqs = 4, .kv_tokens_read = 16004,
                           .attn_pairs = 16004, .query_lens = q, .context_lens = c};
    ar_steptime tied, table, half, gap, big_cpu;
    double table_kv = ar_device_find("rtx4090")->kv_eff;
    parse_ok("roofline:h200,bw_eff=0.8", &tied);                /* no measured KV rate: bw_eff */
    parse_ok("roofline:rtx4090,bw_eff=0.8", &table);             /* the table's, whatever bw_eff */
    parse_ok("roofline:rtx4090,bw_eff=0.8,kv_eff=0.4", &half);
    assert_true(tied.kv_efficiency == 0.8);
    assert_true(table.kv_efficiency == table_kv && table_kv != 0.8);
    assert_true(half.kv_efficiency == 0.4);
    ar_step_parts a, b;
    ar_steptime_parts(&table, &f, &a);
    ar_steptime_parts(&half, &f, &b);
    assert_true(a.linear_s == b.linear_s);                       /* weights keep bw_eff */
    assert_true(fabs(b.attn_s / a.attn_s - table_kv / 0.4) < 1e-9);   /* decodes are bound by their KV reads */
    /* the KV bytes at kv_eff: 4 x 4002 tokens x 32 layers x 2 x 8 heads x 128 x 2 bytes */
    double bytes = 4.0 * (4000 + 2) * 32 * 2 * 8 * 128 * 2;
    assert_true(fabs(b.attn_s - bytes / (1008e9 * 0.4)) < 1e-12);
    parse_ok("roofline:rtx4090,bw_eff=0.8,gap=0.002", &gap);
    assert_true(fabs(ar_steptime_eval(&gap, &f) - ar_steptime_eval(&table, &f) - 0.002) < 1e-12);
    /* a CPU part longer than GPU + gap is still the step (async), and the gap sits under it */
    parse_ok("roofline:rtx4090,gap=0.002,overhead=0.5", &big_cpu);
    assert_true(fabs(ar_steptime_eval(&big_cpu, &f) - 0.5) < 1e-12);
    ar_steptime bad;
    char err[256];
    assert_int_equal(ar_steptime_parse("roofline:rtx4090,kv_eff=0", ar_model_preset_find("llama-3.1-8b"), &bad, err,
                                       sizeof err), 2);
    assert_int_equal(ar_steptime_parse("roofline:rtx4090,kv_eff=1.5", ar_model_preset_find("llama-3.1-8b"), &bad, err,
                                       sizeof err), 2);
}

/* Two all-reduces per layer over the device's link; PCIe costs more than NVLink. */
static void test_tp_allreduce_per_interconnect(void **state)
{
    (void)state;
    int q[64], c[64];
    for (int i = 0; i < 64; i++) { q[i] = 1; c[i] = 2000; }
    ar_batch_features f = {.num_reqs = 64, .num_tokens = 64, .num_decode_reqs = 64, .kv_tokens_read = 64 * 2001,
                           .attn_pairs = 64 * 2001.0, .query_lens = q, .context_lens = c};
    const char *devs[2] = {"rtx4090", "h200"};
    for (int d = 0; d < 2; d++) {
        char spec[128];
        ar_steptime one, two;
        snprintf(spec, sizeof spec, "roofline:%s,overhead=0,graph=0", devs[d]);
        parse_ok(spec, &one);
        snprintf(spec, sizeof spec, "roofline:%s,overhead=0,graph=0,tp=2", devs[d]);
        parse_ok(spec, &two);
        ar_step_parts p1, p2;
        ar_steptime_parts(&one, &f, &p1);
        ar_steptime_parts(&two, &f, &p2);
        assert_true(p1.allreduce_s == 0);
        const ar_device_spec *dev = ar_device_find(devs[d]);
        double want = 2.0 * 32 * (dev->link_latency_s + 2.0 * 1 / 2 * 64 * 4096 * 2.0 / dev->link_bw);
        assert_true(fabs(p2.allreduce_s - want) < 1e-12 * want + 1e-15);
        double speedup = ar_steptime_eval(&one, &f) / ar_steptime_eval(&two, &f);
        assert_true(speedup > 1.0 && speedup < 2.0);
    }
    assert_string_equal(ar_device_find("rtx4090")->link, "pcie");
    assert_string_equal(ar_device_find("h200")->link, "nvlink");
    /* the same GPU scales worse over its PCIe link than it would over the H200's NVLink */
    const ar_device_spec *nv = ar_device_find("h200");
    char spec[160];
    ar_steptime one, pcie, nvlink;
    parse_ok("roofline:rtx4090,overhead=0,graph=0", &one);
    parse_ok("roofline:rtx4090,overhead=0,graph=0,tp=2", &pcie);
    snprintf(spec, sizeof spec, "roofline:rtx4090,overhead=0,graph=0,tp=2,link_bw=%g,link_lat=%g", nv->link_bw,
             nv->link_latency_s);
    parse_ok(spec, &nvlink);
    assert_true(ar_steptime_eval(&pcie, &f) > ar_steptime_eval(&nvlink, &f));
    assert_true(ar_steptime_eval(&one, &f) / ar_steptime_eval(&pcie, &f) < 1.9);
    /* link_bw / link_lat replace the preset's */
    ar_steptime st;
    parse_ok("roofline:rtx4090,graph=0,tp=2,link_bw=1e12,link_lat=0", &st);
    ar_step_parts p;
    ar_steptime_parts(&st, &f, &p);
    assert_true(fabs(p.allreduce_s - 2.0 * 32 * (64 * 4096 * 2.0 / 2 * 2 / 1e12)) < 1e-12);
}

/* The efficiency table of each device is the roofline's default; keys override it. */
static void test_device_efficiency_tables(void **state)
{
    (void)state;
    ar_steptime st;
    parse_ok("roofline:h200", &st);
    assert_true(st.gemm_efficiency == ar_device_find("h200")->gemm_eff);
    assert_true(st.bw_efficiency == ar_device_find("h200")->bw_eff);
    parse_ok("roofline:rtx4090", &st);
    assert_true(st.gemm_efficiency == ar_device_find("rtx4090")->gemm_eff);
    assert_true(ar_device_find("h200")->gemm_eff != ar_device_find("rtx4090")->gemm_eff);
    /* the RTX cards' bw_eff is each card's own published copy measurement and their kv_eff its own
     * published decode-attention measurement, the values the fidelity fit pins (tests/fidelity.c);
     * the H200 has no KV-read measurement, so its KV reads default to bw_eff */
    static const char *const rtx[2] = {"rtx4090", "rtxpro6000"};
    for (int i = 0; i < 2; i++) {
        const ar_device_spec *d = ar_device_find(rtx[i]);
        char spec[64];
        snprintf(spec, sizeof spec, "roofline:%s", rtx[i]);
        parse_ok(spec, &st);
        assert_true(st.bw_efficiency == d->bw_eff);
        assert_true(st.kv_efficiency == d->kv_eff);
        assert_true(d->kv_eff > 0 && d->kv_eff <= 1 && d->kv_eff != d->bw_eff);
        assert_non_null(strstr(d->eff_source, "bandwidth: published"));
        assert_non_null(strstr(d->eff_source, "KV reads: vLLM 0.19 decode attention"));
        /* the candidate table of vLLM's measured linear layers is carried, not the default */
        assert_true(d->linear_gemm_eff > 0 && d->linear_gemm_eff <= 1 && d->linear_bw_eff > 0 && d->linear_bw_eff <= 1);
        assert_true(st.gemm_efficiency == d->gemm_eff && d->gemm_eff != d->linear_gemm_eff);
        assert_true(fabs(d->linear_bw_eff / d->bw_eff - 1) < 0.02);   /* the weight stream agrees with the copy */
    }
    assert_true(ar_device_find("h200")->linear_gemm_eff == 0 && ar_device_find("h200")->linear_bw_eff == 0);
    parse_ok("roofline:h200", &st);
    assert_true(ar_device_find("h200")->kv_eff == 0 && st.kv_efficiency == st.bw_efficiency);
    assert_true(ar_device_find("rtx4090")->bw_eff != ar_device_find("rtxpro6000")->bw_eff);
    parse_ok("roofline:h200,gemm_eff=0.5", &st);
    assert_true(st.gemm_efficiency == 0.5);
    for (int i = 0; i < 4; i++) {
        const char *names[4] = {"rtx4090", "rtxpro6000", "h200", "h100"};
        const ar_device_spec *d = ar_device_find(names[i]);
        assert_non_null(d->eff_source);
        assert_non_null(d->link_source);
        assert_true(d->gemm_eff > 0 && d->gemm_eff <= 1 && d->bw_eff > 0 && d->bw_eff <= 1);
        assert_true(d->link_bw > 0 && d->link_latency_s > 0);
    }
    assert_ptr_equal(ar_device_match("NVIDIA H200"), ar_device_find("h200"));
    assert_ptr_equal(ar_device_match("NVIDIA GeForce RTX 4090"), ar_device_find("rtx4090"));
    assert_ptr_equal(ar_device_match("NVIDIA RTX PRO 6000 Blackwell Workstation Edition"), ar_device_find("rtxpro6000"));
    assert_null(ar_device_match("Tesla T4"));
}

/* Attention is bound request by request: the batch costs the sum of its requests alone, which
 * is more than the totals' roofline when a prefill (compute) and decodes (bytes) mix. */
static void test_attention_depends_on_shape(void **state)
{
    (void)state;
    int q[5] = {2000, 1, 1, 1, 1}, c[5] = {0, 8000, 8000, 8000, 8000};
    ar_batch_features f = {.num_reqs = 5, .num_tokens = 2004, .num_decode_reqs = 4};
    for (int r = 0; r < 5; r++) {
        f.kv_tokens_read += c[r] + q[r];
        f.attn_pairs += (double)q[r] * (c[r] + (q[r] + 1) * 0.5);
    }
    ar_steptime st;
    parse_ok("roofline:h200,graph=0", &st);
    ar_step_parts totals, shaped, alone;
    ar_steptime_parts(&st, &f, &totals);
    f.query_lens = q;
    f.context_lens = c;
    ar_steptime_parts(&st, &f, &shaped);
    double sum = 0;
    for (int r = 0; r < 5; r++) {
        ar_batch_features one = {.num_reqs = 1, .num_tokens = q[r], .query_lens = &q[r], .context_lens = &c[r]};
        ar_steptime_parts(&st, &one, &alone);
        sum += alone.attn_s;
    }
    assert_true(fabs(shaped.attn_s - sum) < 1e-12 * sum);
    assert_true(shaped.attn_s > totals.attn_s * 1.01);
}

static void test_parse_rules(void **state)
{
    (void)state;
    ar_steptime st;
    char err[1024];
    const char *bad[] = {"roofline:h200,async=2", "roofline:h200,graph=1.5", "roofline:h200,graph=-1",
                         "roofline:h200,link_bw=0", "roofline:h200,wobble=1", "profile:", "profile",
                         "roofline:tpu9", "roofline:h200,tp=3.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        if (ar_steptime_parse(bad[i], l8(), &st, err, sizeof err) != 2) fail_msg("%s was accepted", bad[i]);
        assert_true(err[0] != 0);
    }
    assert_int_equal(ar_steptime_parse("roofline:h200", NULL, &st, err, sizeof err), 2);
    assert_non_null(strstr(err, "--model"));
}

/* ---- profiles ------------------------------------------------------------------------------------ */

static void make_synthetic(const char *db, const char *device, int tp)
{
    char tp_arg[8];
    snprintf(tp_arg, sizeof tp_arg, "%d", tp);
    char *argv[] = {"profile", "--synthetic", (char *)device, "--model", "llama-3.1-8b", "--db", (char *)db,
                    "--tp", tp_arg, NULL};
    assert_int_equal(ar_profile_main(9, argv), 0);
}

/* profile --db replaces an earlier profile and nothing else: a results database (its runs would be
 * lost), another program's SQLite file, a text file and a directory are refused with exit 2 and
 * left as they were; the new profile is renamed into place, no temporary file stays behind. */
static void test_profile_db_replaces_only_a_profile(void **state)
{
    (void)state;
    char dir[1024], path[1200];
    tu_tmp("profile_replace", dir, sizeof dir);
    mkdir(dir, 0755);
    static const char *const kinds[] = {
        "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT); INSERT INTO meta VALUES('schema_version', '4');"
        "CREATE TABLE runs(id INTEGER PRIMARY KEY, trace TEXT); INSERT INTO runs VALUES(1, 'a.trace');"
        "CREATE TABLE steps(run INTEGER, step INTEGER, time_us REAL); INSERT INTO steps VALUES(1, 0, 12.5);",
        "CREATE TABLE notes(id INTEGER PRIMARY KEY, text TEXT); INSERT INTO notes VALUES(1, 'kept');",
    };
    for (int k = 0; k < 4; k++) {
        snprintf(path, sizeof path, "%s/not-a-profile-%d.db", dir, k);
        if (k < 2) {
            sqlite3 *h = NULL;
            assert_int_equal(sqlite3_open(path, &h), SQLITE_OK);
            assert_int_equal(sqlite3_exec(h, kinds[k], NULL, NULL, NULL), SQLITE_OK);
            sqlite3_close(h);
        } else if (k == 2) {
            assert_int_equal(tu_write(path, "run,step,time_us\n1,0,12.5\n"), 0);
        } else {
            assert_int_equal(mkdir(path, 0755), 0);
        }
        char *argv[] = {"profile", "--synthetic", "h200", "--model", "llama-3.1-8b", "--db", path, "--quick", NULL};
        assert_int_equal(ar_profile_main(8, argv), 2);
        char err[1024];
        assert_int_equal(ar_profile_check_replaceable(path, err, sizeof err), -1);
        assert_non_null(strstr(err, path));
        if (k == 0) {
            assert_non_null(strstr(err, "results database"));
            assert_int_equal(tu_query_int(path, "SELECT count(*) FROM runs"), 1);
            assert_int_equal(tu_query_int(path, "SELECT count(*) FROM steps"), 1);
        } else if (k == 1) {
            assert_int_equal(tu_query_int(path, "SELECT count(*) FROM notes"), 1);
        } else if (k == 2) {
            char *text = tu_slurp(path);
            assert_non_null(text);
            assert_string_equal(text, "run,step,time_us\n1,0,12.5\n");
            free(text);
        }
    }
    /* an earlier profile (and an empty file) is replaced */
    snprintf(path, sizeof path, "%s/profile.db", dir);
    make_synthetic(path, "h100", 1);
    make_synthetic(path, "h200", 1);
    ar_profile_table p;
    char err[1024];
    assert_int_equal(ar_profile_load(path, &p, err, sizeof err), 0);
    assert_string_equal(p.device, "h200");
    snprintf(path, sizeof path, "%s/empty.db", dir);
    assert_int_equal(tu_write(path, ""), 0);
    make_synthetic(path, "h200", 1);
    assert_int_equal(ar_profile_load(path, &p, err, sizeof err), 0);
    DIR *d = opendir(dir);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strstr(e->d_name, ".tmp-")) fail_msg("%s/%s left behind", dir, e->d_name);
    closedir(d);
}

/* A profile or results database another connection keeps locked (a rollback-journal file under
 * BEGIN EXCLUSIVE) is waited for (ATTNREPLAY_BUSY_TIMEOUT_MS) and then refused as bad input in the
 * words every command uses: profile --db over it (it was "exists and is not an attnreplay
 * profile"), --step-time profile:DB (it was "not a profile database (no table meta)") and
 * --step-time fitted:DB (it was "database is locked" at once), each exit 2, the file as it was. */
static void test_locked_database_refused(void **state)
{
    (void)state;
    char path[1024], fitdb[1024], spec[1200], err[2048];
    tu_tmp("locked-profile.db", path, sizeof path);
    tu_tmp("locked-fit.db", fitdb, sizeof fitdb);
    unlink(path);
    unlink(fitdb);
    make_synthetic(path, "h200", 1);
    sqlite3 *h = NULL, *f = NULL;
    assert_int_equal(sqlite3_open(fitdb, &f), SQLITE_OK);
    assert_int_equal(sqlite3_exec(f, "CREATE TABLE runs(id INTEGER PRIMARY KEY, layers INTEGER);"
                                     "CREATE TABLE steps(run INTEGER, step INTEGER, num_tokens INTEGER, num_reqs INTEGER,"
                                     " total_context INTEGER, time_us REAL); INSERT INTO runs VALUES(1, 1);"
                                     "BEGIN EXCLUSIVE; DELETE FROM steps WHERE 0", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_open(path, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "BEGIN EXCLUSIVE; DELETE FROM gemm WHERE 0", NULL, NULL, NULL), SQLITE_OK);
    setenv("ATTNREPLAY_BUSY_TIMEOUT_MS", "100", 1);
    const char *words = "the database is locked by another connection's write (waited 100 ms; "
                        "ATTNREPLAY_BUSY_TIMEOUT_MS sets the wait)";
    char *argv[] = {"profile", "--synthetic", "h200", "--model", "llama-3.1-8b", "--db", path, "--quick", NULL};
    assert_int_equal(ar_profile_main(8, argv), 2);
    assert_int_equal(ar_profile_check_replaceable(path, err, sizeof err), -1);
    if (!strstr(err, path) || !strstr(err, words)) fail_msg("%s", err);
    ar_steptime st;
    snprintf(spec, sizeof spec, "profile:%s", path);
    assert_int_equal(ar_steptime_parse(spec, l8(), &st, err, sizeof err), 2);
    if (!strstr(err, path) || !strstr(err, words)) fail_msg("%s", err);
    snprintf(spec, sizeof spec, "fitted:%s", fitdb);
    assert_int_equal(ar_steptime_parse(spec, l8(), &st, err, sizeof err), 2);
    if (!strstr(err, fitdb) || !strstr(err, words)) fail_msg("%s", err);
    unsetenv("ATTNREPLAY_BUSY_TIMEOUT_MS");
    sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(h);
    sqlite3_exec(f, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(f);
    ar_profile_table p;
    assert_int_equal(ar_profile_load(path, &p, err, sizeof err), 0);   /* as it was */
}

/* A synthetic profile holds the roofline's numbers; --step-time profile:DB gives back the
 * roofline's step times (the same terms, summed per GEMM instead of over the model). */
static void test_synthetic_profile_reproduces_roofline(void **state)
{
    (void)state;
    char db[512], spec[600];
    tu_tmp("syn.db", db, sizeof db);
    make_synthetic(db, "h200", 1);
    ar_profile_table p;
    char err[1024];
    assert_int_equal(ar_profile_load(db, &p, err, sizeof err), 0);
    assert_string_equal(p.model, "llama-3.1-8b");
    assert_string_equal(p.device, "h200");
    assert_int_equal(p.tp, 1);
    assert_int_equal(p.num_gemms, 5);
    assert_true(p.replay_ratio == 1.0);
    ar_steptime roof, prof;
    parse_ok("roofline:h200,overhead=0.001", &roof);
    snprintf(spec, sizeof spec, "profile:%s,overhead=0.001", db);
    parse_ok(spec, &prof);
    assert_int_equal(prof.kind, AR_STEPTIME_PROFILE);
    ar_steptime_set_engine(&roof, 256);
    ar_steptime_set_engine(&prof, 256);
    /* decodes at a grid context, a prefill at grid points, and a mix */
    int q1[64], c1[64];
    for (int i = 0; i < 64; i++) { q1[i] = 1; c1[i] = 2048; }
    int q2[1] = {2048}, c2[1] = {512};
    int q3[9] = {512, 1, 1, 1, 1, 1, 1, 1, 1}, c3[9] = {2048, 1024, 1024, 1024, 1024, 1024, 1024, 1024, 1024};
    struct { int *q, *c, n; } cases[3] = {{q1, c1, 64}, {q2, c2, 1}, {q3, c3, 9}};
    for (int k = 0; k < 3; k++) {
        ar_batch_features f = {.num_reqs = cases[k].n, .query_lens = cases[k].q, .context_lens = cases[k].c};
        for (int r = 0; r < cases[k].n; r++) {
            f.num_tokens += cases[k].q[r];
            f.kv_tokens_read += cases[k].q[r] + cases[k].c[r];
        }
        double a = ar_steptime_eval(&roof, &f), b = ar_steptime_eval(&prof, &f);
        if (fabs(b / a - 1) > 0.03) fail_msg("case %d: roofline %.6f s, synthetic profile %.6f s", k, a, b);
    }
}

static void test_interpolation(void **state)
{
    (void)state;
    char db[512], err[1024];
    tu_tmp("interp.db", db, sizeof db);
    make_synthetic(db, "rtx4090", 2);
    ar_profile_table p;
    assert_int_equal(ar_profile_load(db, &p, err, sizeof err), 0);
    assert_int_equal(p.tp, 2);
    assert_int_equal(p.gemm_n[0], (32 + 2 * 8) * 128 / 2);   /* qkv sharded over 2 ranks */
    for (int g = 0; g < p.num_gemms; g++) {
        for (int i = 0; i < p.num_m; i++) assert_true(ar_profile_gemm_us(&p, g, p.m[i]) == p.gemm_us[g][i]);
        for (int i = 0; i + 1 < p.num_m; i++) {
            double mid = 0.5 * (p.m[i] + p.m[i + 1]);
            double want = 0.5 * (p.gemm_us[g][i] + p.gemm_us[g][i + 1]);
            assert_true(fabs(ar_profile_gemm_us(&p, g, mid) - want) < 1e-9 * want);
        }
        int last = p.num_m - 1;
        assert_true(ar_profile_gemm_us(&p, g, 0.5) == p.gemm_us[g][0]);
        assert_true(ar_profile_gemm_us(&p, g, 2 * p.m[last]) >= p.gemm_us[g][last]);
    }
    /* decode grid: exact at its points, between the rows in between */
    int q[16], c[16];
    for (int i = 0; i < 16; i++) { q[i] = 1; c[i] = 1024; }
    int bi = 4, ci = 2;   /* 16 requests, context 1024 in the default grid */
    assert_true(p.dec_batch[bi] == 16 && p.dec_ctx[ci] == 1024);
    assert_true(fabs(ar_profile_attention_us(&p, q, c, 16) - p.dec_us[bi][ci]) < 1e-9);
    for (int i = 0; i < 16; i++) c[i] = 1536;   /* halfway to 2048 */
    double mid = ar_profile_attention_us(&p, q, c, 16);
    assert_true(fabs(mid - 0.5 * (p.dec_us[bi][ci] + p.dec_us[bi][ci + 1])) < 1e-9 * mid);
    /* a prefill and the decodes add */
    int qm[3] = {512, 1, 1}, cm[3] = {2048, 1024, 1024};
    double pre = p.pre_us[4][2];   /* q 512, ctx 2048 */
    assert_true(p.pre_q[4] == 512 && p.pre_ctx[2] == 2048);
    assert_true(fabs(ar_profile_attention_us(&p, qm, cm, 3) - (pre + p.dec_us[1][2])) < 1e-9 * pre);
    /* the profile fixes tp: asking for another is an error */
    ar_steptime st;
    char spec[600];
    snprintf(spec, sizeof spec, "profile:%s,tp=4", db);
    assert_int_equal(ar_steptime_parse(spec, l8(), &st, err, sizeof err), 2);
    assert_non_null(strstr(err, "tp=2"));
    snprintf(spec, sizeof spec, "profile:%s", db);
    assert_int_equal(ar_steptime_parse(spec, ar_model_preset_find("qwen3-32b"), &st, err, sizeof err), 2);
    assert_non_null(strstr(err, "llama-3.1-8b"));
}

/* Damaged databases are refused with the file and the rule. */
static void test_profile_validation(void **state)
{
    (void)state;
    const char *damage[] = {
        "DELETE FROM attn_decode WHERE batch = 16 AND ctx = 1024;",
        "UPDATE attn_prefill SET us = -1 WHERE q = 512 AND ctx = 0;",
        "DELETE FROM gemm WHERE name = 'o' AND m = 64;",
        "UPDATE meta SET value = 'something-else' WHERE key = 'format';",
        "UPDATE meta SET value = '0' WHERE key = 'tp';",
        "DROP TABLE attn_prefill;",
        "UPDATE meta SET value = 'x' WHERE key = 'replay_ratio';",
    };
    const char *rules[] = {"grid must be complete", "not positive", "every token count", "not an attnreplay-profile",
                           "tp >= 1", "attn_prefill", "replay_ratio"};
    char out[512];
    tu_tmp("damage.txt", out, sizeof out);
    if (tu_run(out, "sqlite3 -version") != 0) {
        fprintf(stderr, "skipping: no sqlite3 shell to damage databases with\n");
        skip();
    }
    for (size_t i = 0; i < sizeof damage / sizeof damage[0]; i++) {
        char db[512], err[1024];
        char name[32];
        snprintf(name, sizeof name, "bad%zu.db", i);
        tu_tmp(name, db, sizeof db);
        make_synthetic(db, "h200", 1);
        assert_int_equal(tu_run(out, "sqlite3 %s \"%s\"", db, damage[i]), 0);
        ar_profile_table p;
        err[0] = 0;
        assert_int_equal(ar_profile_load(db, &p, err, sizeof err), 2);
        if (!strstr(err, rules[i]) || !strstr(err, db)) fail_msg("damage %zu: '%s' lacks '%s' or the path", i, err, rules[i]);
    }
    ar_profile_table p;
    char err[1024];
    assert_int_equal(ar_profile_load("/nonexistent/profile.db", &p, err, sizeof err), 2);
    /* not a database at all */
    char junk[512];
    tu_tmp("junk.db", junk, sizeof junk);
    assert_int_equal(tu_write(junk, "this is not sqlite\n"), 0);
    assert_int_equal(ar_profile_load(junk, &p, err, sizeof err), 2);
}

/* Attention through the backend API on the CPU backend: a time, growing with the context. */
static void test_attention_timed_through_backend(void **state)
{
    (void)state;
    const ar_model *m = &l8()->model;
    double small = 0, large = 0;
    char err[1024];
    /* tp 8: 4 query heads, 1 KV head, keeps the CPU work small */
    if (ar_profile_time_attention("cpu", m, 8, 2, 1, 64, 3, &small, err, sizeof err) != 0) fail_msg("%s", err);
    if (ar_profile_time_attention("cpu", m, 8, 2, 1, 8192, 3, &large, err, sizeof err) != 0) fail_msg("%s", err);
    assert_true(small > 0);
    assert_true(large > small);
    double pre = 0;
    if (ar_profile_time_attention("cpu", m, 8, 1, 64, 128, 1, &pre, err, sizeof err) != 0) fail_msg("%s", err);
    assert_true(pre > 0);
    assert_int_equal(ar_profile_time_attention("nope", m, 8, 1, 1, 64, 1, &pre, err, sizeof err), 2);
}

/* The command: usage errors exit 2; without a GPU the measurement exits 3 and writes nothing;
 * sim runs with --step-time profile:DB. */
static void test_profile_command(void **state)
{
    (void)state;
    char out[512], db[512], trace[512], syn[512];
    tu_tmp("profile-cmd.txt", out, sizeof out);
    tu_tmp("gpu.db", db, sizeof db);
    tu_tmp("cmd-syn.db", syn, sizeof syn);
    tu_tmp("p.trace.jsonl", trace, sizeof trace);
    if (access(tu_bin(), X_OK) != 0) {
        fprintf(stderr, "skipping: no %s\n", tu_bin());
        skip();
    }
    assert_int_equal(tu_run(out, "%s profile --model llama-3.1-8b --db %s", tu_bin(), db), 2);
    assert_int_equal(tu_run(out, "%s profile --device h200 --model deepseek-v3 --db %s", tu_bin(), db), 2);
    assert_int_equal(tu_run(out, "%s profile --device h200 --model llama-3.1-8b --db %s --tp 3", tu_bin(), db), 2);
    int rc = tu_run(out, "%s profile --device h200 --model llama-3.1-8b --db %s --quick", tu_bin(), db);
    if (rc == 3) {   /* no GPU here: said so, nothing written */
        char *log = tu_slurp(out);
        assert_non_null(log);
        assert_non_null(strstr(log, "no CUDA device"));
        free(log);
        assert_int_not_equal(access(db, F_OK), 0);
    }
    assert_int_equal(tu_run(out, "%s profile --synthetic h200 --model llama-3.1-8b --db %s", tu_bin(), syn), 0);
    assert_int_equal(tu_run(out, "%s sim --workload synthetic:n=40,input=300,output=20,rate=50 --model llama-3.1-8b "
                                 "--step-time profile:%s --out %s", tu_bin(), syn, trace), 0);
    char *log = tu_slurp(out);
    assert_non_null(log);
    assert_non_null(strstr(log, "finished 40"));
    free(log);
    assert_int_equal(tu_run(out, "%s sim --workload synthetic:n=4,input=30,output=2 --model qwen3-32b "
                                 "--step-time profile:%s --out %s", tu_bin(), syn, trace), 2);
    /* --trace: replayed steps (CPU backend here) stored beside their interpolation; the median
     * ratio is kept and scales the attention */
    char rsyn[512];
    tu_tmp("replayed.db", rsyn, sizeof rsyn);
    assert_int_equal(tu_run(out, "%s sim --workload synthetic:n=6,input=64,output=4,rate=100 --model llama-3.1-8b "
                                 "--out %s --quiet", tu_bin(), trace), 0);
    rc = tu_run(out, "%s profile --synthetic h200 --model llama-3.1-8b --db %s --trace %s --trace-steps 5 --backend cpu "
                     "--repeat 1", tu_bin(), rsyn, trace);
    if (rc != 0) {
        log = tu_slurp(out);
        fail_msg("profile --trace failed (%d): %s", rc, log ? log : "");
    }
    assert_int_equal(tu_query_int(rsyn, "SELECT COUNT(*) FROM attn_steps WHERE measured_us > 0 AND predicted_us > 0"), 5);
    ar_profile_table p;
    char err[1024];
    assert_int_equal(ar_profile_load(rsyn, &p, err, sizeof err), 0);
    assert_int_equal(p.replay_steps, 5);
    assert_true(p.replay_ratio > 0 && p.replay_ratio != 1.0);
    char spec[600];
    ar_steptime st;
    snprintf(spec, sizeof spec, "profile:%s", rsyn);
    parse_ok(spec, &st);
    assert_true(fabs(st.attn_scale / p.replay_ratio - 1) < 1e-5);
    /* a trace of another model is refused */
    assert_int_equal(tu_run(out, "%s sim --workload synthetic:n=2,input=32,output=2 --model qwen3-32b --out %s --quiet",
                            tu_bin(), trace), 0);
    assert_int_equal(tu_run(out, "%s profile --synthetic h200 --model llama-3.1-8b --db %s --trace %s --backend cpu",
                            tu_bin(), rsyn, trace), 2);
    /* plan takes the same model through --step-time */
    char plan_dir[512];
    tu_tmp("plan-profile", plan_dir, sizeof plan_dir);
    assert_int_equal(tu_run(out, "%s plan --workload synthetic:n=30,input=300,output=10,rate=20 --model llama-3.1-8b "
                                 "--device h200 --step-time profile:%s --rates 1 --kv-blocks 2048 --out %s", tu_bin(),
                            syn, plan_dir), 0);
    log = tu_slurp(out);
    assert_non_null(log);
    assert_non_null(strstr(log, "measured profile of llama-3.1-8b"));
    free(log);
    assert_int_equal(tu_run(out, "%s plan --workload synthetic:n=30,input=300,output=10 --model llama-3.1-8b "
                                 "--device h200 --step-time profile:%s --db %s --out %s", tu_bin(), syn, syn, plan_dir), 2);
}

/* Files in dir whose names start with prefix, or -1 when dir cannot be read. */
static int count_named(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            print_message("  %s/%s\n", dir, e->d_name);
            n++;
        }
    closedir(d);
    return n;
}

/* What a profile cannot do is refused with exit 2 before anything is measured (here, before the
 * host build's "no CUDA device"), and no DB is made: a DB in a missing folder or under a file, a
 * --trace the profile could not replay (with --tp 2, missing, another model's, broken within the
 * steps it would replay, no steps), an unknown --backend, and options the kind of profile would
 * ignore (--synthetic with --device, --trace-steps without --trace, --synthetic with --repeat).
 * Before, the first six exited 3 after the measurement (here at once, "no CUDA device") and the
 * last three exited 0 having ignored the option. */
static void test_profile_refuses_before_measuring(void **state)
{
    (void)state;
    if (access(tu_bin(), X_OK) != 0) {
        fprintf(stderr, "skipping: no %s\n", tu_bin());
        skip();
    }
    char dir[512], db[700], out[512], trace[700], other[700], broken[700], header_only[700];
    tu_tmp("profile_refused", dir, sizeof dir);
    mkdir(dir, 0755);
    snprintf(db, sizeof db, "%s/p.db", dir);
    snprintf(trace, sizeof trace, "%s/l8.trace.jsonl", dir);
    snprintf(other, sizeof other, "%s/q32.trace.jsonl", dir);
    snprintf(broken, sizeof broken, "%s/broken.trace.jsonl", dir);
    snprintf(header_only, sizeof header_only, "%s/header.trace.jsonl", dir);
    tu_tmp("profile_refused.txt", out, sizeof out);
    assert_int_equal(tu_run(out, "%s sim --workload synthetic:n=6,input=64,output=4,rate=100 --model llama-3.1-8b "
                                 "--out %s --quiet", tu_bin(), trace), 0);
    assert_int_equal(tu_run(out, "%s sim --workload synthetic:n=2,input=32,output=2 --model qwen3-32b --out %s --quiet",
                            tu_bin(), other), 0);
    /* the header and two steps, then a step whose number is not an integer (line 4) */
    assert_int_equal(tu_run(out, "{ head -3 %s > %s && echo '{\"step\": \"x\"}' >> %s; }", trace, broken, broken), 0);
    assert_int_equal(tu_run(out, "{ head -1 %s > %s; }", trace, header_only), 0);
    const char *m = "--model llama-3.1-8b";
    struct { char args[1600]; const char *says; } cases[12];
    int n = 0;
    snprintf(cases[n].args, sizeof cases[n].args, "--device h200 %s --db %s/missing/p.db --quick", m, dir);
    cases[n++].says = "/missing: No such file or directory";   /* the reason, not only the path given */
    snprintf(cases[n].args, sizeof cases[n].args, "--synthetic h200 %s --db %s/p.db", m, trace);   /* under a file */
    cases[n++].says = "Not a directory";
    snprintf(cases[n].args, sizeof cases[n].args, "--device h200 %s --db %s --tp 2 --trace %s", m, db, trace);
    cases[n++].says = "--tp 1";
    snprintf(cases[n].args, sizeof cases[n].args, "--device h200 %s --db %s --trace %s/none.jsonl", m, db, dir);
    cases[n++].says = "none.jsonl:0: cannot open: No such file or directory";
    snprintf(cases[n].args, sizeof cases[n].args, "--device h200 %s --db %s --trace %s", m, db, other);
    cases[n++].says = "the trace is of model qwen3-32b";
    snprintf(cases[n].args, sizeof cases[n].args, "--device h200 %s --db %s --trace %s", m, db, broken);
    cases[n++].says = "broken.trace.jsonl:4:";
    snprintf(cases[n].args, sizeof cases[n].args, "--device h200 %s --db %s --trace %s", m, db, header_only);
    cases[n++].says = "no step to replay";
    snprintf(cases[n].args, sizeof cases[n].args, "--device h200 %s --db %s --backend nope", m, db);
    cases[n++].says = "unknown backend 'nope'";
    snprintf(cases[n].args, sizeof cases[n].args, "--synthetic h200 --device h100 %s --db %s", m, db);
    cases[n++].says = "give one of them";
    snprintf(cases[n].args, sizeof cases[n].args, "--synthetic h200 %s --db %s --trace-steps 5", m, db);
    cases[n++].says = "--trace-steps needs --trace";
    snprintf(cases[n].args, sizeof cases[n].args, "--synthetic h200 %s --db %s --repeat 3", m, db);
    cases[n++].says = "--synthetic alone";
    for (int i = 0; i < n; i++) {
        int rc = tu_run(out, "%s profile %s", tu_bin(), cases[i].args);
        char *log = tu_slurp(out);
        assert_non_null(log);
        print_message("profile %s: exit %d: %s", cases[i].args, rc, log);
        if (rc != 2 || !strstr(log, cases[i].says) || strstr(log, "no CUDA device"))
            fail_msg("case %d: exit %d, '%s' lacks '%s'", i, rc, log, cases[i].says);
        free(log);
        assert_int_equal(count_named(dir, "p.db"), 0);
    }
}

/* Starts `attnreplay profile --synthetic h200 --db DB --trace TRACE --trace-steps STEPS --backend
 * BACKEND --repeat 1 --quick` (llama-3.1-8b) with stdout and stderr to out and the faulty plugins'
 * ATTNREPLAY_FAULTY_STEP=1; its pid. */
static pid_t start_profile(const char *out, const char *db, const char *trace, const char *steps, const char *backend)
{
    pid_t pid = fork();
    if (pid != 0) return pid;
    if (!freopen(out, "w", stdout) || dup2(fileno(stdout), 2) < 0 || setenv("ATTNREPLAY_FAULTY_STEP", "1", 1) != 0)
        _exit(120);
    execl(tu_bin(), tu_bin(), "profile", "--synthetic", "h200", "--model", "llama-3.1-8b", "--db", db, "--trace",
          trace, "--trace-steps", steps, "--backend", backend, "--repeat", "1", "--quick", (char *)NULL);
    _exit(121);
}

/* Waits (up to 30 s) for the scratch database of profile pid's --trace replay of DB; 0 once it is
 * there. */
static int wait_for_scratch(const char *db, pid_t pid)
{
    char scratch[800];
    snprintf(scratch, sizeof scratch, "%s.tmp-%ld.replay-scratch.db", db, (long)pid);
    for (int i = 0; i < 600 && access(scratch, F_OK) != 0; i++) usleep(50 * 1000);
    return access(scratch, F_OK);
}

/* A profile whose --trace replay fails or is stopped leaves DB as it was and nothing beside it:
 * a backend whose forward fails at step 1 (exit 3), SIGTERM during the replay (exit 143, as
 * replay's own); and the files a killed profile left (PATH.tmp-PID and its replay's scratch
 * database) are removed by the next profile of PATH once their process is gone.  Before, the
 * scratch database stayed after a failed replay, SIGTERM was exit 3, and a killed profile's files
 * stayed for good.  The same holds where the replay's watchdog ends the process itself, which each
 * faulty plugin below makes certain: SIGTERM while the backend's close() hangs (the watchdog's
 * "stopped while the backend was closing", where a slow close under AddressSanitizer once left
 * the files of the SIGTERM case above) or while a forward hangs ("stopped inside a step"), both
 * exit 143 after the signal's grace; a forward that crashes (SIGSEGV, exit 3).  Before, each of
 * these left DB.tmp-PID and the scratch database. */
static void test_profile_trace_leaves_nothing_behind(void **state)
{
    (void)state;
    static const struct {
        const char *kind;   /* tests/plugins/faulty-KIND.so */
        int sigterm;        /* 0: none; 1: SIGTERM once the scratch database is there; 2: once step 0 is committed */
        int code;
        const char *says;   /* the watchdog's message */
    } ends[] = {
        {"closehang", 1, 143, "SIGTERM: stopped while the backend was closing"},
        {"hang", 2, 143, "SIGTERM: stopped inside a step"},
        {"segv", 0, 3, "backend's forward crashed with SIGSEGV"},
    };
    char plugin[600];
    snprintf(plugin, sizeof plugin, "%s/tests/plugins/faulty-error.so", tu_build_dir());
    bool have = access(tu_bin(), X_OK) == 0 && access(plugin, R_OK) == 0;
    for (size_t i = 0; i < sizeof ends / sizeof ends[0] && have; i++) {
        snprintf(plugin, sizeof plugin, "%s/tests/plugins/faulty-%s.so", tu_build_dir(), ends[i].kind);
        have = access(plugin, R_OK) == 0;
    }
    if (!have) {
        fprintf(stderr, "skipping: no %s or %s\n", tu_bin(), plugin);
        skip();
    }
    snprintf(plugin, sizeof plugin, "%s/tests/plugins/faulty-error.so", tu_build_dir());
    char dir[512], db[700], out[512], trace[700], longer[700], device[64];
    tu_tmp("profile_trace_fail", dir, sizeof dir);
    mkdir(dir, 0755);
    snprintf(db, sizeof db, "%s/p.db", dir);
    snprintf(trace, sizeof trace, "%s/l8.trace.jsonl", dir);
    snprintf(longer, sizeof longer, "%s/long.trace.jsonl", dir);
    tu_tmp("profile_trace_fail.txt", out, sizeof out);
    make_synthetic(db, "h100", 1);
    assert_int_equal(tu_run(out, "%s sim --workload synthetic:n=6,input=64,output=4,rate=100 --model llama-3.1-8b "
                                 "--out %s --quiet", tu_bin(), trace), 0);
    int rc = tu_run(out, "ATTNREPLAY_FAULTY_STEP=1 %s profile --synthetic h200 --model llama-3.1-8b --db %s --trace %s "
                         "--trace-steps 4 --backend plugin:%s --repeat 1", tu_bin(), db, trace, plugin);
    char *log = tu_slurp(out);
    print_message("failing replay: exit %d: %s", rc, log ? log : "");
    free(log);
    assert_int_equal(rc, 3);
    tu_query_text(db, "SELECT value FROM meta WHERE key = 'device'", device, sizeof device);
    assert_string_equal(device, "h100");
    assert_int_equal(count_named(dir, "p.db."), 0);

    /* SIGTERM while the replay runs (steps of milliseconds: the replay stops between two) */
    assert_int_equal(tu_run(out, "%s sim --workload synthetic:n=3000,input=16,output=40,rate=100 --model llama-3.1-8b "
                                 "--out %s --quiet", tu_bin(), longer), 0);
    pid_t pid = start_profile(out, db, longer, "3000", "cpu");
    assert_true(pid > 0);
    assert_int_equal(wait_for_scratch(db, pid), 0);
    usleep(300 * 1000);
    assert_int_equal(kill(pid, SIGTERM), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    log = tu_slurp(out);
    print_message("SIGTERM: status %d: %s", status, log ? log : "");
    free(log);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 143);
    tu_query_text(db, "SELECT value FROM meta WHERE key = 'device'", device, sizeof device);
    assert_string_equal(device, "h100");
    assert_int_equal(count_named(dir, "p.db."), 0);

    /* the watchdog ends the process: SIGTERM while close() or a forward (step 1) hangs, a crash */
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        char backend[700], scratch[800];
        snprintf(backend, sizeof backend, "plugin:%s/tests/plugins/faulty-%s.so", tu_build_dir(), ends[i].kind);
        pid = start_profile(out, db, trace, "4", backend);
        assert_true(pid > 0);
        if (ends[i].sigterm > 0) {   /* close() hangs however the run ends; a forward from step 1 on */
            assert_int_equal(wait_for_scratch(db, pid), 0);
            snprintf(scratch, sizeof scratch, "%s.tmp-%ld.replay-scratch.db", db, (long)pid);
            for (int t = 0; t < 600 && ends[i].sigterm == 2 && tu_query_int(scratch, "SELECT count(*) FROM steps") < 1;
                 t++)
                usleep(50 * 1000);
            assert_true(ends[i].sigterm == 1 || tu_query_int(scratch, "SELECT count(*) FROM steps") >= 1);
            assert_int_equal(kill(pid, SIGTERM), 0);
        }
        assert_int_equal(waitpid(pid, &status, 0), pid);
        log = tu_slurp(out);
        assert_non_null(log);
        print_message("faulty-%s: status %d: %s", ends[i].kind, status, log);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), ends[i].code);
        assert_non_null(strstr(log, ends[i].says));
        assert_int_equal(count_named(dir, "p.db."), 0);
        tu_query_text(db, "SELECT value FROM meta WHERE key = 'device'", device, sizeof device);
        assert_string_equal(device, "h100");
        assert_non_null(strstr(log, "profile: the --trace replay ended the process; nothing was written"));
        free(log);
    }

    /* a killed profile's files: those of a process that is gone are removed, the others stay */
    pid_t gone = fork();
    assert_true(gone >= 0);
    if (gone == 0) _exit(0);
    assert_int_equal(waitpid(gone, &status, 0), gone);
    static const char *const left[] = {"", ".replay-scratch.db", ".replay-scratch.db-wal", "-journal"};
    char name[800];
    for (size_t i = 0; i < sizeof left / sizeof left[0]; i++) {
        snprintf(name, sizeof name, "%s.tmp-%ld%s", db, (long)gone, left[i]);
        assert_int_equal(tu_write(name, "partial"), 0);
    }
    snprintf(name, sizeof name, "%s.tmp-%ld", db, (long)getppid());   /* a live process's */
    assert_int_equal(tu_write(name, "live"), 0);
    snprintf(name, sizeof name, "%s.tmp-notes.txt", db);   /* not a name profile makes */
    assert_int_equal(tu_write(name, "mine"), 0);
    make_synthetic(db, "h200", 1);
    assert_int_equal(count_named(dir, "p.db."), 2);
    snprintf(name, sizeof name, "%s.tmp-%ld", db, (long)getppid());
    assert_int_equal(access(name, F_OK), 0);
    unlink(name);
    snprintf(name, sizeof name, "%s.tmp-notes.txt", db);
    assert_int_equal(access(name, F_OK), 0);
    unlink(name);
}

/* A profile that cannot be written for want of space (`ulimit -f 8`, SIGXFSZ ignored) exits 3
 * saying why (the system's error, or "disk full or file size limit reached?" as replay says it), over an earlier profile (kept as it was) and at a new path (nothing made), and
 * leaves no temporary file.  Before, the message was "DB.tmp-PID: disk I/O error", no reason. */
static void test_profile_full_disk(void **state)
{
    (void)state;
    if (access(tu_bin(), X_OK) != 0) {
        fprintf(stderr, "skipping: no %s\n", tu_bin());
        skip();
    }
    char dir[512], db[700], out[512], device[64];
    tu_tmp("profile_full", dir, sizeof dir);
    mkdir(dir, 0755);
    tu_tmp("profile_full.txt", out, sizeof out);
    for (int earlier = 0; earlier < 2; earlier++) {
        snprintf(db, sizeof db, "%s/%s.db", dir, earlier ? "earlier" : "new");
        if (earlier) make_synthetic(db, "h100", 1);
        int rc = tu_run(out, "bash -c \"trap '' XFSZ; ulimit -f 8; exec '%s' profile --synthetic h200 --model "
                             "llama-3.1-8b --db '%s'\"", tu_bin(), db);
        char *log = tu_slurp(out);
        assert_non_null(log);
        print_message("full disk, %s: exit %d: %s", earlier ? "over a profile" : "new path", rc, log);
        assert_int_equal(rc, 3);
        assert_true(strstr(log, "File too large") || strstr(log, "file size limit"));
        free(log);
        if (earlier) {
            tu_query_text(db, "SELECT value FROM meta WHERE key = 'device'", device, sizeof device);
            assert_string_equal(device, "h100");
        } else {
            assert_int_not_equal(access(db, F_OK), 0);
        }
        assert_int_equal(count_named(dir, earlier ? "earlier.db." : "new.db"), 0);
    }
}

/* ---- step timings of a real run (sim/stepfit.c) --------------------------------------------- */

/* A hand-made run: step k ends at ends[k]; a request is (first step, output tokens, last step). */
static ar_run_req run_req(const double *ends, int prompt, int first_step, int output, int last_step)
{
    return (ar_run_req){prompt, output, ends[first_step] - 0.004, ends[first_step], ends[last_step]};
}

static void test_step_intervals_exact_counts(void **state)
{
    (void)state;
    double ends[40];
    for (int k = 0; k < 40; k++) ends[k] = 100.0 + 0.02 * k + 0.001 * (k * k % 7);   /* uneven steps */
    ar_run_req reqs[6] = {
        run_req(ends, 100, 0, 11, 10),   /* one component: steps 0, 5, 10, 12 */
        run_req(ends, 100, 0, 6, 5),
        run_req(ends, 100, 5, 8, 12),
        run_req(ends, 100, 20, 5, 24),   /* another: steps 20, 24 */
        run_req(ends, 100, 30, 1, 30),   /* one token: a lone stamp, no interval */
        run_req(ends, 100, 24, 1, 24),   /* a one-token request on a stamp already seen */
    };
    ar_step_interval *iv;
    ar_step_interval_stats st;
    assert_int_equal(ar_step_intervals(reqs, 6, &iv, &st), 4);
    assert_int_equal(st.num_nodes, 7);
    assert_int_equal(st.num_components, 3);
    assert_int_equal(st.num_bad_components, 0);
    const int want[4][2] = {{0, 5}, {5, 10}, {10, 12}, {20, 24}};
    for (int i = 0; i < 4; i++) {
        assert_true(fabs(iv[i].start - ends[want[i][0]]) < 1e-9);
        assert_true(fabs(iv[i].end - ends[want[i][1]]) < 1e-9);
        assert_int_equal(iv[i].steps, want[i][1] - want[i][0]);
    }
    free(iv);
    /* a preempted request: 3 tokens from step 5 but its last at step 12 (7 steps, not 2) - its
     * component's step counts disagree, so that component gives nothing; the other stays */
    ar_run_req more[7];
    memcpy(more, reqs, sizeof reqs);
    more[6] = run_req(ends, 100, 5, 3, 12);
    assert_int_equal(ar_step_intervals(more, 7, &iv, &st), 1);
    assert_int_equal(st.num_bad_components, 1);
    assert_int_equal(st.num_dropped, 3);
    assert_int_equal(iv[0].steps, 4);
    free(iv);
}

/* The same on a random run: every interval's count equals the true step difference. */
static void test_step_intervals_random_run(void **state)
{
    (void)state;
    enum { STEPS = 3000, REQS = 400 };
    static double ends[STEPS];
    static ar_run_req reqs[REQS];
    static int last_of[REQS];
    uint64_t x = 12345;
    double t = 5000;
    for (int k = 0; k < STEPS; k++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        t += 0.01 + 0.05 * (double)(x >> 40) / (double)(1ULL << 24);
        ends[k] = t;
    }
    for (int i = 0; i < REQS; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        int first = (int)((x >> 33) % (STEPS - 400)), out = 1 + (int)((x >> 13) % 300);
        last_of[i] = first + out - 1;
        reqs[i] = run_req(ends, 200, first, out, last_of[i]);
    }
    ar_step_interval *iv;
    ar_step_interval_stats st;
    int n = ar_step_intervals(reqs, REQS, &iv, &st);
    assert_true(n > 100);
    assert_int_equal(st.num_bad_components + st.num_inconsistent, 0);
    for (int i = 0; i < n; i++) {
        int a = -1, b = -1;
        for (int k = 0; k < STEPS; k++) {
            if (fabs(ends[k] - iv[i].start) < 1e-9) a = k;
            if (fabs(ends[k] - iv[i].end) < 1e-9) b = k;
        }
        assert_true(a >= 0 && b > a);
        if (iv[i].steps != b - a) fail_msg("interval %d: %d steps, the run had %d", i, iv[i].steps, b - a);
    }
    free(iv);
}

/* A run of the simulator with a known step time stands in for a real one: the intervals count
 * its steps exactly, the true model predicts them closely, and a model with half the weight
 * bandwidth predicts too few (negative residuals) at a clearly larger loss. */
static void test_stepfit_on_simulated_run(void **state)
{
    (void)state;
    char err[AR_ERR_MAX + 1024];
    const char *spec = "roofline:h200,gemm_eff=0.6,bw_eff=0.9,kv_eff=0.6,gap=0.001,overhead=0.0005";
    ar_workload wl;
    ar_workload_init(&wl, 16, "memory");
    uint64_t x = 77;
    for (int i = 0; i < 120; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        int prompt = 64 + (int)((x >> 33) % 1500), out = 8 + (int)((x >> 17) % 200);
        assert_int_equal(ar_workload_push(&wl, 0.02 * i, prompt, out, NULL, 0, i + 1, err, sizeof err), 0);
    }
    ar_sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    parse_ok(spec, &cfg.steptime);
    ar_steptime_set_engine(&cfg.steptime, 32);
    ar_trace_header *h = &cfg.header;
    h->version = AR_TRACE_VERSION;
    h->model = l8()->model;
    h->cache.block_size = 16;
    h->cache.num_blocks = 8192;
    h->cache.dtype = h->cache.kv_cache_dtype = AR_BF16;
    h->sched.max_num_batched_tokens = 512;
    h->sched.max_num_seqs = 32;
    h->sched.prefix_caching = true;
    ar_sim *s = ar_sim_create(&cfg, &wl, err, sizeof err);
    if (!s) fail_msg("%s", err);
    static double ends[100000];
    int num_steps = 0;
    const ar_step *step;
    int rc;
    while ((rc = ar_sim_step(s, &step, err, sizeof err)) == 1 && num_steps < 100000)   /* the scheduler's clock */
        ends[num_steps++] = round((step->time + ar_steptime_eval(&cfg.steptime, ar_sim_last_features(s))) * 1e6) / 1e6;
    assert_int_equal(rc, 0);
    int n = ar_sim_num_requests(s);
    ar_run_req *reqs = calloc((size_t)n, sizeof *reqs);
    for (int i = 0; i < n; i++) {
        ar_sim_req_info q;
        ar_sim_request(s, i, &q);
        assert_int_equal(q.status, AR_REQ_FINISHED);
        assert_int_equal(q.num_preemptions, 0);
        reqs[i] = (ar_run_req){ar_sim_workload_req(s, i)->prompt_len, ar_sim_workload_req(s, i)->output_len,
                               q.first_scheduled, q.first_token, q.last_token};
    }
    ar_sim_destroy(s);
    ar_stepfit_set set;
    assert_int_equal(ar_stepfit_build(reqs, n, 512, 8, &set, err, sizeof err), 0);
    assert_true(set.stats.num_intervals > 30);
    for (int k = 0; k < set.stats.num_intervals; k++) {
        int count = 0;
        for (int j = 0; j < num_steps; j++)
            count += ends[j] > set.intervals[k].start + 5e-7 && ends[j] <= set.intervals[k].end + 5e-7;
        if (count != set.intervals[k].steps)
            fail_msg("interval %d: %d steps, the simulator ran %d", k, set.intervals[k].steps, count);
    }
    ar_steptime truth, slow;
    parse_ok(spec, &truth);
    ar_steptime_set_engine(&truth, 32);
    parse_ok("roofline:h200,gemm_eff=0.6,bw_eff=0.45,kv_eff=0.6,gap=0.001,overhead=0.0005", &slow);
    ar_steptime_set_engine(&slow, 32);
    double loss_true = ar_stepfit_loss(&set, &truth), loss_slow = ar_stepfit_loss(&set, &slow);
    int below = 0;
    for (int k = 0; k < set.stats.num_intervals; k++) below += ar_stepfit_residual(&set, k, &slow) < 0;
    if (!(loss_true < 0.06 && loss_slow > 2 * loss_true && below > 0.9 * set.stats.num_intervals))
        fail_msg("loss %.4f at the true model, %.4f at half the bandwidth (%d of %d intervals below)", loss_true,
                 loss_slow, below, set.stats.num_intervals);
    /* the rejection keeps the bulk and drops the far residuals of a planted wrong interval */
    set.intervals[0].steps *= 3;
    int rejected = ar_stepfit_reject(&set, &truth, 3.0);
    assert_true(rejected >= 1 && rejected < set.stats.num_intervals / 4);
    assert_false(set.keep[0]);
    ar_stepfit_free(&set);
    free(reqs);
    ar_workload_free(&wl);
}

/* Three requests over steps 0..12, 20 ms apart, as stage 1 sees them (budget 512, 8 pieces an
 * interval): intervals (0, 5], (5, 10], (10, 12]; in k = (5, 10] (5 pieces from first) requests 0
 * and 2 decode and no prompt window overlaps.  st: an H200 roofline with a small gap; before: the
 * steps it predicts in k. */
typedef struct three_request_run {
    ar_stepfit_set set;
    ar_steptime st;
    int k, first;
    double before;
} three_request_run;

static void three_request_run_build(three_request_run *x)
{
    char err[AR_ERR_MAX + 1024];
    double ends[40];
    for (int k = 0; k < 40; k++) ends[k] = 100.0 + 0.02 * k;
    ar_run_req reqs[3] = {
        run_req(ends, 300, 0, 11, 10),
        run_req(ends, 300, 0, 6, 5),
        run_req(ends, 700, 5, 8, 12),
    };
    assert_int_equal(ar_stepfit_build(reqs, 3, 512, 8, &x->set, err, sizeof err), 0);
    assert_int_equal(x->set.stats.num_intervals, 3);
    x->k = 1;
    assert_true(fabs(x->set.intervals[x->k].start - ends[5]) < 1e-9);
    x->first = x->set.sample_start[x->k];
    assert_int_equal(x->set.sample_start[x->k + 1] - x->first, 5);
    parse_ok("roofline:h200,gemm_eff=0.6,bw_eff=0.9,kv_eff=0.6,gap=0.001,overhead=0.0005", &x->st);
    ar_steptime_set_engine(&x->st, 32);
    x->before = ar_stepfit_predicted_steps(&x->set, x->k, &x->st);
}

/* Hidden recompute prefill given to an interval of decodes only: each piece gets its share as a
 * recompute chunk (context 0) in one mixed step, so it predicts 1 + (length - tau(mixed)) /
 * tau(decode) steps; a share beyond the budget fills the piece with mixed steps at the budget;
 * setting 0 gives back the prediction without it. */
static void test_stepfit_recompute_tokens(void **state)
{
    (void)state;
    three_request_run x;
    three_request_run_build(&x);
    const int m = 5;
    for (int round = 0; round < 2; round++) {
        const double share = round == 0 ? 100 : 10000;   /* per piece: within the budget, then far beyond */
        ar_stepfit_set_recompute(&x.set, x.k, share * m);
        double want = 0;
        for (int j = x.first; j < x.first + m; j++) {
            ar_batch_features dec, mixed;
            ar_stepfit_features(&x.set, j, false, &dec);
            assert_int_equal(dec.num_reqs, 2);
            int chunk = (int)fmin(share, 512 - 2);
            int q[3] = {1, 1, chunk}, c[3] = {dec.context_lens[0], dec.context_lens[1], 0};
            mixed = (ar_batch_features){.num_reqs = 3, .num_tokens = 2 + chunk, .num_decode_reqs = 2,
                                        .num_prefill_tokens = chunk, .query_lens = q, .context_lens = c,
                                        .kv_tokens_read = c[0] + c[1] + 2 + chunk,
                                        .attn_pairs = c[0] + 1 + c[1] + 1 + chunk * (chunk + 1) / 2.0};
            double tau_mixed = ar_steptime_eval(&x.st, &mixed), tau_decode = ar_steptime_eval(&x.st, &dec);
            double len = x.set.samples[j].length_s, mixed_steps = share / chunk;
            want += mixed_steps * tau_mixed >= len ? len / tau_mixed
                                                   : mixed_steps + (len - mixed_steps * tau_mixed) / tau_decode;
        }
        double got = ar_stepfit_predicted_steps(&x.set, x.k, &x.st);
        if (fabs(got - want) > 1e-9 * want || !(got < x.before))
            fail_msg("share %.0f: predicted %.6f steps, want %.6f (without recompute %.6f)", share, got, want, x.before);
    }
    ar_stepfit_set_recompute(&x.set, x.k, 0);
    assert_true(ar_stepfit_predicted_steps(&x.set, x.k, &x.st) == x.before);
    ar_stepfit_free(&x.set);
}

/* A request the simulation has preempted (waiting) during a piece is not counted as decoding there:
 * the piece's decode step loses it, so the piece predicts length / tau(the other decodes) steps and
 * the interval more steps than before; a request not decoding in the piece changes nothing; the
 * piece keeps its recompute share (a chunk after the remaining decode); clearing gives back the
 * prediction without it. */
static void test_stepfit_waiting_not_decoding(void **state)
{
    (void)state;
    three_request_run x;
    three_request_run_build(&x);
    const int j = x.first + 1;
    ar_batch_features both;
    ar_stepfit_features(&x.set, j, false, &both);
    assert_int_equal(both.num_reqs, 2);
    assert_int_equal(x.set.entry_req[x.set.samples[j].offset], 0);
    assert_int_equal(x.set.entry_req[x.set.samples[j].offset + 1], 2);
    const double tau_both = ar_steptime_eval(&x.st, &both);
    int q1[1] = {1}, c1[1] = {both.context_lens[0]};
    ar_batch_features alone = {.num_reqs = 1, .num_tokens = 1, .num_decode_reqs = 1, .query_lens = q1,
                               .context_lens = c1, .kv_tokens_read = c1[0] + 1, .attn_pairs = c1[0] + 1};
    const double tau_alone = ar_steptime_eval(&x.st, &alone), len = x.set.samples[j].length_s;

    bool waiting[3] = {false, true, false};   /* request 1 has finished by then: nothing to leave out */
    assert_int_equal(ar_stepfit_set_waiting(&x.set, j, waiting), 0);
    assert_true(ar_stepfit_predicted_steps(&x.set, x.k, &x.st) == x.before);
    waiting[2] = true;                         /* request 2 waits preempted during piece j only */
    assert_int_equal(ar_stepfit_set_waiting(&x.set, j, waiting), 1);
    assert_int_equal(x.set.samples[j].num_decode, 1);
    assert_int_equal(x.set.samples[j].num_waiting, 1);
    ar_batch_features f;
    ar_stepfit_features(&x.set, j, false, &f);
    assert_int_equal(f.num_reqs, 1);
    assert_int_equal(f.context_lens[0], c1[0]);
    const double want = x.before - len / tau_both + len / tau_alone;
    const double got = ar_stepfit_predicted_steps(&x.set, x.k, &x.st);
    if (fabs(got - want) > 1e-9 * want || !(got > x.before))
        fail_msg("waiting: predicted %.6f steps, want %.6f (all decoding %.6f)", got, want, x.before);

    ar_stepfit_set_recompute(&x.set, x.k, 100.0 * 5);   /* 100 tokens a piece: a chunk after the one decode */
    ar_stepfit_features(&x.set, j, true, &f);
    assert_int_equal(f.num_reqs, 2);
    assert_int_equal(f.num_decode_reqs, 1);
    assert_true(f.num_prefill_tokens == 100 && f.query_lens[1] == 100 && f.context_lens[1] == 0);
    assert_int_equal(ar_stepfit_set_waiting(&x.set, j, waiting), 1);   /* set again: the share stays */
    ar_stepfit_features(&x.set, j, true, &f);
    assert_true(f.num_reqs == 2 && f.num_prefill_tokens == 100);
    ar_stepfit_set_recompute(&x.set, x.k, 0);

    assert_int_equal(ar_stepfit_set_waiting(&x.set, j, NULL), 0);
    assert_int_equal(x.set.samples[j].num_waiting, 0);
    assert_true(ar_stepfit_predicted_steps(&x.set, x.k, &x.st) == x.before);
    ar_stepfit_free(&x.set);
}

/* requests.jsonl rows: a missing stamp or stamps out of order name the file and line. */
static void test_run_load_rules(void **state)
{
    (void)state;
    char path[1024], err[2048];
    ar_run_req *reqs;
    int n;
    tu_tmp("run.jsonl", path, sizeof path);
    assert_int_equal(tu_write(path, "{\"input_toks\": 10, \"output_toks\": 3, \"scheduled_ts\": 1.0, "
                                    "\"first_token_ts\": 1.5, \"last_token_ts\": 2.0}\n\n"
                                    "{\"input_toks\": 12, \"output_toks\": 2, \"scheduled_ts\": 1.1, "
                                    "\"first_token_ts\": 1.5, \"last_token_ts\": 1.7}\n"), 0);
    assert_int_equal(ar_run_load(path, &reqs, &n, err, sizeof err), 0);
    assert_int_equal(n, 2);
    assert_int_equal(reqs[1].prompt_len, 12);
    assert_true(reqs[1].last_token == 1.7);
    free(reqs);
    assert_int_equal(tu_write(path, "{\"input_toks\": 10, \"output_toks\": 3, \"scheduled_ts\": 1.0, "
                                    "\"first_token_ts\": 1.5, \"last_token_ts\": 2.0}\n"
                                    "{\"input_toks\": 10, \"output_toks\": 3, \"first_token_ts\": 1.5, \"last_token_ts\": 2.0}\n"), 0);
    assert_int_equal(ar_run_load(path, &reqs, &n, err, sizeof err), 2);
    assert_non_null(strstr(err, "run.jsonl:2:"));
    assert_int_equal(tu_write(path, "{\"input_toks\": 10, \"output_toks\": 3, \"scheduled_ts\": 1.0, "
                                    "\"first_token_ts\": 2.5, \"last_token_ts\": 2.0}\n"), 0);
    assert_int_equal(ar_run_load(path, &reqs, &n, err, sizeof err), 2);
    assert_non_null(strstr(err, "run.jsonl:1:"));
    /* a field given twice is refused, not last-wins */
    assert_int_equal(tu_write(path, "{\"input_toks\": 10, \"output_toks\": 3, \"scheduled_ts\": 1.0, "
                                    "\"first_token_ts\": 1.5, \"last_token_ts\": 2.0, \"input_toks\": 90}\n"), 0);
    assert_int_equal(ar_run_load(path, &reqs, &n, err, sizeof err), 2);
    if (!strstr(err, "run.jsonl:1: duplicate key") || !strstr(err, "\"input_toks\""))
        fail_msg("error '%s' does not name the line and the duplicated key", err);
    /* a row longer than any fixed buffer (a recorded prompt of 20000 characters) is one row: it
     * loads, and the rows after it keep their line numbers */
    size_t pad = 20000;
    char *text = malloc(pad + 512);
    assert_non_null(text);
    int at = snprintf(text, 512, "{\"prompt\": \"");
    memset(text + at, 'x', pad);
    at += (int)pad;
    at += snprintf(text + at, 512, "\", \"input_toks\": 10, \"output_toks\": 3, \"scheduled_ts\": 1.0, "
                                     "\"first_token_ts\": 1.5, \"last_token_ts\": 2.0}\n");
    assert_int_equal(tu_write(path, text), 0);
    assert_int_equal(ar_run_load(path, &reqs, &n, err, sizeof err), 0);
    assert_int_equal(n, 1);
    assert_int_equal(reqs[0].prompt_len, 10);
    free(reqs);
    snprintf(text + at, 512, "{\"input_toks\": 10, \"output_toks\": 3, \"scheduled_ts\": 1.0, "
                             "\"first_token_ts\": 1.5, \"last_token_ts\": 2.0}\n{\"input_toks\": 0}\n");
    assert_int_equal(tu_write(path, text), 0);
    assert_int_equal(ar_run_load(path, &reqs, &n, err, sizeof err), 2);
    if (!strstr(err, "run.jsonl:3: row needs")) fail_msg("error '%s' does not name line 3", err);
    free(text);
    assert_int_equal(ar_run_load(tu_tmpdir(), &reqs, &n, err, sizeof err), 2);   /* a folder without requests.jsonl */
    assert_non_null(strstr(err, "requests.jsonl: cannot open"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cudagraph_pad_matches_vllm_list),
        cmocka_unit_test(test_padding_reaches_the_gemms),
        cmocka_unit_test(test_async_overlaps_cpu),
        cmocka_unit_test(test_kv_eff_and_gap),
        cmocka_unit_test(test_tp_allreduce_per_interconnect),
        cmocka_unit_test(test_device_efficiency_tables),
        cmocka_unit_test(test_attention_depends_on_shape),
        cmocka_unit_test(test_parse_rules),
        cmocka_unit_test(test_synthetic_profile_reproduces_roofline),
        cmocka_unit_test(test_interpolation),
        cmocka_unit_test(test_profile_validation),
        cmocka_unit_test(test_attention_timed_through_backend),
        cmocka_unit_test(test_profile_command),
        cmocka_unit_test(test_step_intervals_exact_counts),
        cmocka_unit_test(test_step_intervals_random_run),
        cmocka_unit_test(test_stepfit_on_simulated_run),
        cmocka_unit_test(test_stepfit_recompute_tokens),
        cmocka_unit_test(test_stepfit_waiting_not_decoding),
        cmocka_unit_test(test_run_load_rules),
        cmocka_unit_test(test_profile_db_replaces_only_a_profile),
        cmocka_unit_test(test_profile_refuses_before_measuring),
        cmocka_unit_test(test_profile_trace_leaves_nothing_behind),
        cmocka_unit_test(test_profile_full_disk),
        cmocka_unit_test(test_locked_database_refused),
    };
    return cmocka_run_group_tests_name("steptime", tests, NULL, NULL);
}
