/* test_reports.c - tests of reports/: `report` renders every chart (gnuplot's exit status,
 * PNG signature and size, the SVG's title parsed out of its <text> elements), index.html
 * and summary.md from a small database built here with the schema of replay/db.h; `diff`
 * exit codes on identical runs, a planted slowdown, a planted verification failure and a
 * planted error growth; bad input gives exit status 2, never a crash.
 *
 * The database is synthetic: a "mixed" trace of 40 steps replayed 9 ways (baseline, an
 * identical rerun, 30% slower, one step failing, 10x error, cascade on, 3% slower, a planted
 * fault failing every step, a run that stopped with an error after 25 steps) and two CPU fp32
 * runs of another trace (one slow enough to show seconds per step and a tiny TFLOP/s).
 * Expected numbers come from what was planted. */
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../reports/plot.h"
#include "../reports/reports.h"
#include "../reports/rundata.h"

#define NUM_STEPS 40
#define FAILING_STEP 7

static char db_path[1024];

static const char *const schema_sql =
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);"
    "INSERT INTO meta VALUES('schema_version','1');"
    "CREATE TABLE runs(id INTEGER PRIMARY KEY, trace TEXT, trace_hash TEXT, backend TEXT,"
    " device TEXT, dtype TEXT, kv_dtype TEXT, model TEXT, layers INTEGER, config TEXT,"
    " code_rev TEXT, seed INTEGER, verify TEXT, inject TEXT, cascade TEXT, repeat INTEGER,"
    " status TEXT, error TEXT, started REAL, finished REAL, steps_done INTEGER,"
    " steps_failed INTEGER, last_step INTEGER);"
    "CREATE TABLE steps(run, step, time REAL, num_reqs, num_tokens, num_prefill_reqs,"
    " num_decode_reqs, max_query_len, max_seq_len, total_context, cascade INTEGER,"
    " prefix_len INTEGER, time_us REAL, bytes INTEGER, flops INTEGER, gbps REAL, tflops REAL,"
    " verified TEXT, rows_checked INTEGER, max_abs REAL, max_rel REAL, mean_abs REAL,"
    " nmse REAL, lse_max_abs REAL, nan_count INTEGER, bad_count INTEGER, naive_max_abs REAL,"
    " naive_mean_abs REAL, tol_max_abs REAL, tol_mean_abs REAL, guard_ok INTEGER,"
    " pass INTEGER, PRIMARY KEY(run, step));"
    "CREATE TABLE kernels(run, step, layer, name TEXT, time_us REAL,"
    " PRIMARY KEY(run, step, layer, name));"
    "CREATE TABLE mismatches(run, step, layer, req TEXT, token INTEGER, head INTEGER,"
    " dim INTEGER, got REAL, want REAL, abs_err REAL);"
    "CREATE TABLE ceilings(device TEXT, measured REAL, copy_gbps REAL, bf16_tflops REAL,"
    " method TEXT);";

/* How each planted run differs from the baseline. */
typedef struct {
    int id;
    const char *trace, *hash, *backend, *device, *dtype, *cascade_mode;
    double time_scale;        /* every step's time multiplied by this */
    double error_scale;       /* every step's max_abs multiplied by this */
    int fail_step;            /* this step fails (max_abs x50), -1 for none, -2 for every step */
    int cascade;              /* even steps take the cascade path */
    int cpu;                  /* CPU flavour: small errors, some steps unverified, one exact */
    const char *inject;       /* planted fault (NULL: none) */
    const char *error;        /* the run stopped with this error after stored_steps (NULL: finished) */
    int stored_steps;         /* steps in the database (0: all NUM_STEPS) */
} planted_run;

static const planted_run planted[] = {
    { 1, "mixed.trace.jsonl.gz", "abc123", "cuda_paged", "NVIDIA H200", "bf16", "off",
      1.0, 1, -1, 0, 0, NULL, NULL, 0 },
    { 2, "mixed.trace.jsonl.gz", "abc123", "cuda_paged", "NVIDIA H200", "bf16", "off",
      1.0, 1, -1, 0, 0, NULL, NULL, 0 },
    { 3, "mixed.trace.jsonl.gz", "abc123", "cuda_paged", "NVIDIA H200", "bf16", "off",
      1.3, 1, -1, 0, 0, NULL, NULL, 0 },
    { 4, "mixed.trace.jsonl.gz", "abc123", "cuda_paged", "NVIDIA H200", "bf16", "off",
      1.0, 1, FAILING_STEP, 0, 0, NULL, NULL, 0 },
    { 5, "mixed.trace.jsonl.gz", "abc123", "cuda_paged", "NVIDIA H200", "bf16", "off",
      1.0, 10, -1, 0, 0, NULL, NULL, 0 },
    { 6, "mixed.trace.jsonl.gz", "abc123", "cuda_paged", "NVIDIA H200", "bf16", "on",
      1.0, 1, -1, 1, 0, NULL, NULL, 0 },
    { 7, "other.trace.jsonl.gz", "def456", "cpu", "cpu (2 cores)", "fp32", "off",
      150.0, 1, -1, 0, 1, NULL, NULL, 0 },
    { 8, "mixed.trace.jsonl.gz", "abc123", "cuda_paged", "NVIDIA H200", "bf16", "off",
      1.03, 1, -1, 0, 0, NULL, NULL, 0 },
    { 9, "mixed.trace.jsonl.gz", "abc123", "cuda_paged", "NVIDIA H200", "bf16", "off", 1.0, 1, -2, 0, 0,
      "causal-off-by-one", NULL, 0 },
    { 10, "mixed.trace.jsonl.gz", "abc123", "cuda_paged", "NVIDIA H200", "bf16", "off", 1.0, 1, -1, 0, 0,
      NULL, "COMMIT: disk I/O error (a write failed: disk full?)", 25 },
    { 11, "other.trace.jsonl.gz", "def456", "cpu", "cpu (2 cores)", "fp32", "off",
      2e5, 1, -1, 0, 1, NULL, NULL, 0 },
};
#define ERROR_RUN_REASON "COMMIT: disk I/O error (a write failed: disk full?)"

static int insert_run(sqlite3 *db, const planted_run *p)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
            "INSERT INTO runs(id, trace, trace_hash, backend, device, dtype, kv_dtype, model, layers,"
            " config, code_rev, seed, verify, inject, cascade, repeat, status, started, finished,"
            " steps_done, steps_failed, last_step, error) VALUES(?,?,?,?,?,?,?,'llama-8b',2,'{}','test',1,"
            "'all',?,?,3,?,1000,1010,?,?,?,?)", -1, &st, NULL) != SQLITE_OK)
        return -1;
    int steps = p->stored_steps ? p->stored_steps : NUM_STEPS;
    sqlite3_bind_int(st, 1, p->id);
    sqlite3_bind_text(st, 2, p->trace, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, p->hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, p->backend, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, p->device, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, p->dtype, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 7, p->dtype, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 8, p->inject ? p->inject : "none", -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 9, p->cascade_mode, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 10, p->error ? "error" : p->fail_step != -1 ? "failed" : "passed", -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 11, steps);
    sqlite3_bind_int(st, 12, p->fail_step == -2 ? steps : p->fail_step >= 0);
    sqlite3_bind_int(st, 13, steps - 1);
    if (p->error) sqlite3_bind_text(st, 14, p->error, -1, SQLITE_STATIC);
    else sqlite3_bind_null(st, 14);
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
    sqlite3_finalize(st);
    if (rc) return rc;

    if (sqlite3_prepare_v2(db,
            "INSERT INTO steps(run, step, time, num_reqs, num_tokens, num_prefill_reqs,"
            " num_decode_reqs, max_query_len, max_seq_len, total_context, cascade, prefix_len,"
            " time_us, bytes, flops, gbps, tflops, verified, rows_checked, max_abs, max_rel,"
            " mean_abs, nmse, lse_max_abs, nan_count, bad_count, guard_ok, pass)"
            " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,0,?,1,?)", -1, &st, NULL) != SQLITE_OK)
        return -1;
    for (int s = 0; s < steps && rc == 0; s++) {
        int prefill = s % 8 == 0;
        int reqs = 4 + s % 13;
        long long tokens = prefill ? 1024 + 64LL * s : reqs;
        long long context = 2000 + 300LL * s;
        /* Llama-8B-like shapes over 2 layers: 32 query heads, 8 KV heads, head size 128, bf16.
         * Bytes: K and V of the whole context read once; FLOPs: FA3's 4 x keys x Hq x d per
         * query token (decode: each token sees its own sequence; prefill: causal chunk). */
        double bytes = 2.0 * (double)context * 8 * 128 * 2 * 2;
        double keys = prefill ? (double)tokens * ((double)tokens / 2.0 + 1000.0) : (double)context;
        double flops = 4.0 * keys * 32 * 128 * 2;
        /* Time from a roofline at 3.6 TB/s and 500 TFLOP/s plus a 10 us launch cost. */
        double memory_us = bytes / 3.6e6, compute_us = flops / 5e8;
        double time_us = (10.0 + (memory_us > compute_us ? memory_us : compute_us)) *
                         (1.0 + 0.02 * (s % 3)) * p->time_scale;
        int cascade = p->cascade && s % 2 == 0;
        long long prefix = cascade ? 512 + 64LL * s : 0;
        if (cascade) time_us /= 1.0 + (double)prefix / 2000.0;
        double max_abs = (p->cpu ? 2e-6 : 3e-3) * (1.0 + 0.1 * (s % 5)) * p->error_scale;
        int pass = 1;
        if (s == p->fail_step || p->fail_step == -2) { max_abs *= 50; pass = 0; }
        double nmse = max_abs * max_abs * 1e-1;
        int verified = !(p->cpu && s % 4 == 3);
        if (p->cpu && s == 2) { max_abs = 0; nmse = 0; }
        int c = 1;
        sqlite3_reset(st);
        sqlite3_bind_int(st, c++, p->id);
        sqlite3_bind_int(st, c++, s);
        sqlite3_bind_double(st, c++, 0.05 * s);
        sqlite3_bind_int(st, c++, reqs);
        sqlite3_bind_int64(st, c++, tokens);
        sqlite3_bind_int(st, c++, prefill);
        sqlite3_bind_int(st, c++, reqs - prefill);
        sqlite3_bind_int64(st, c++, prefill ? tokens : 1);
        sqlite3_bind_int64(st, c++, 4000 + 300LL * s);
        sqlite3_bind_int64(st, c++, context);
        sqlite3_bind_int(st, c++, cascade);
        sqlite3_bind_int64(st, c++, prefix);
        sqlite3_bind_double(st, c++, time_us);
        sqlite3_bind_int64(st, c++, (long long)bytes);
        sqlite3_bind_int64(st, c++, (long long)flops);
        sqlite3_bind_double(st, c++, bytes / time_us / 1e3);
        sqlite3_bind_double(st, c++, flops / time_us / 1e6);
        sqlite3_bind_text(st, c++, verified ? "all" : "off", -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, c++, verified ? tokens : 0);
        if (verified) {
            sqlite3_bind_double(st, c++, max_abs);
            sqlite3_bind_double(st, c++, max_abs * 10);
            sqlite3_bind_double(st, c++, max_abs / 8);
            sqlite3_bind_double(st, c++, nmse);
            sqlite3_bind_double(st, c++, max_abs / 4);
            sqlite3_bind_int(st, c++, pass ? 0 : 12);
            sqlite3_bind_int(st, c++, pass);
        } else {
            for (int k = 0; k < 7; k++) sqlite3_bind_null(st, c++);
        }
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
    }
    sqlite3_finalize(st);
    return rc;
}

static int make_db(const char *path, int with_runs)
{
    sqlite3 *db = NULL;
    remove(path);
    if (sqlite3_open(path, &db) != SQLITE_OK) return -1;
    int rc = sqlite3_exec(db, "BEGIN", NULL, NULL, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_exec(db, schema_sql, NULL, NULL, NULL);
    for (size_t i = 0; with_runs && rc == SQLITE_OK && i < sizeof planted / sizeof planted[0]; i++)
        rc = insert_run(db, &planted[i]) == 0 ? SQLITE_OK : SQLITE_ERROR;
    if (rc == SQLITE_OK) rc = sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) fprintf(stderr, "make_db: %s\n", sqlite3_errmsg(db));
    sqlite3_close(db);
    return rc == SQLITE_OK ? 0 : -1;
}

static int setup_db(void **state)
{
    (void)state;
    tu_tmp("results.db", db_path, sizeof db_path);
    return make_db(db_path, 1);
}

/* ---- helpers -------------------------------------------------------------------------------- */

static int run_report(const char *out_dir, const char *extra1, const char *extra2,
                      const char *extra3, const char *extra4)
{
    char *argv[10];
    int argc = 0;
    argv[argc++] = (char *)"report";
    argv[argc++] = db_path;
    const char *extras[4] = { extra1, extra2, extra3, extra4 };
    for (int i = 0; i < 4; i++) if (extras[i]) argv[argc++] = (char *)extras[i];
    argv[argc++] = (char *)"--out";
    argv[argc++] = (char *)out_dir;
    argv[argc] = NULL;
    return ar_report_main(argc, argv);
}

static int run_diff(const char *a, const char *b, const char *opt, const char *value)
{
    char *argv[8];
    int argc = 0;
    argv[argc++] = (char *)"diff";
    argv[argc++] = db_path;
    argv[argc++] = (char *)a;
    argv[argc++] = (char *)b;
    if (opt) argv[argc++] = (char *)opt;
    if (value) argv[argc++] = (char *)value;
    argv[argc] = NULL;
    return ar_diff_main(argc, argv);
}

static long size_of(const char *dir, const char *name)
{
    char path[2048];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* True when the SVG has a <text> element whose text (nested tags stripped, &amp; decoded)
 * equals want. */
static int svg_has_text(const char *svg, const char *want)
{
    for (const char *p = strstr(svg, "<text"); p; p = strstr(p + 5, "<text")) {
        const char *open_end = strchr(p, '>');
        const char *close = open_end ? strstr(open_end, "</text>") : NULL;
        if (!close) return 0;
        char text[512];
        size_t n = 0;
        int in_tag = 0;
        for (const char *q = open_end + 1; q < close && n + 1 < sizeof text; q++) {
            if (*q == '<') in_tag = 1;
            else if (*q == '>') in_tag = 0;
            else if (!in_tag) {
                if (!strncmp(q, "&amp;", 5)) { text[n++] = '&'; q += 4; }
                else text[n++] = *q;
            }
        }
        text[n] = 0;
        /* Trim whitespace gnuplot puts around the text. */
        char *start = text;
        while (*start == ' ' || *start == '\n' || *start == '\t') start++;
        char *end = start + strlen(start);
        while (end > start && (end[-1] == ' ' || end[-1] == '\n' || end[-1] == '\t')) *--end = 0;
        if (!strcmp(start, want)) return 1;
    }
    return 0;
}

static void check_plot(const char *dir, const char *name, const char *title)
{
    char file[256], path[2048];
    snprintf(file, sizeof file, "%s.png", name);
    long png = size_of(dir, file);
    assert_true(png > 2000);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *bytes = tu_slurp(path);
    assert_non_null(bytes);
    assert_memory_equal(bytes, "\x89PNG\r\n\x1a\n", 8);
    free(bytes);
    snprintf(file, sizeof file, "%s.svg", name);
    assert_true(size_of(dir, file) > 2000);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *svg = tu_slurp(path);
    assert_non_null(svg);
    assert_non_null(strstr(svg, "<svg"));
    if (!svg_has_text(svg, title)) fail_msg("%s has no <text> titled '%s'", path, title);
    free(svg);
}

/* The runs replay two traces, so each per-run chart is drawn once per trace. */
static const char *const all_plots[][2] = {
    { "step_time_trace1", "Per-step kernel time over the run - trace mixed" },
    { "step_time_trace2", "Per-step kernel time over the run - trace other" },
    { "time_vs_tokens_trace1", "Kernel time against batch tokens - trace mixed" },
    { "time_vs_tokens_trace2", "Kernel time against batch tokens - trace other" },
    { "time_vs_context_trace1", "Kernel time against total context - trace mixed" },
    { "time_vs_context_trace2", "Kernel time against total context - trace other" },
    { "errors_nmse", "NMSE distribution per backend and dtype (verified steps)" },
    { "errors_max_abs", "Max abs error distribution per backend and dtype (verified steps)" },
    { "roofline_trace1", "Roofline: achieved TFLOP/s against arithmetic intensity - trace mixed" },
    { "roofline_trace2", "Roofline: achieved TFLOP/s against arithmetic intensity - trace other" },
    { "cascade_speedup", "Cascade speedup against shared prefix length" },
};
#define NUM_PLOTS (sizeof all_plots / sizeof all_plots[0])

/* dir/name holds `present` (unless NULL) and not `absent` (unless NULL). */
static void expect_in_file(const char *dir, const char *name, const char *present, const char *absent)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = tu_slurp(path);
    if (!text) fail_msg("%s is missing", path);
    if (present && !strstr(text, present)) fail_msg("%s lacks '%s'", path, present);
    if (absent && strstr(text, absent)) fail_msg("%s holds '%s'", path, absent);
    free(text);
}

/* The number in the cell after `<td>label</td>` of an HTML table row, or -1. */
static long cell_after(const char *html, const char *label)
{
    char key[256];
    snprintf(key, sizeof key, "<td>%s</td><td>", label);
    const char *p = strstr(html, key);
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

/* ---- report --------------------------------------------------------------------------------- */

static void test_report_writes_every_file(void **state)
{
    (void)state;
    if (!ar_plot_have_gnuplot()) skip();
    char out[1024];
    tu_tmp("report_all", out, sizeof out);
    assert_int_equal(run_report(out, NULL, NULL, NULL, NULL), 0);
    for (size_t i = 0; i < NUM_PLOTS; i++) check_plot(out, all_plots[i][0], all_plots[i][1]);

    char path[2048];
    snprintf(path, sizeof path, "%s/index.html", out);
    char *html = tu_slurp(path);
    assert_non_null(html);
    for (size_t i = 0; i < NUM_PLOTS; i++) {
        char img[128];
        snprintf(img, sizeof img, "<img src=\"%s.png\"", all_plots[i][0]);
        if (!strstr(html, img)) fail_msg("index.html lacks %s", img);
    }
    /* Opens offline: nothing fetched from the network. */
    assert_null(strstr(html, "http://"));
    assert_null(strstr(html, "https://"));
    assert_null(strstr(html, "<script"));
    /* The planted failing step shows in the run table: 39 of 40 verified steps passed. */
    assert_non_null(strstr(html, "<td>39 / 40</td>"));
    /* H200 default ceilings (no calibrate row) are named as such. */
    assert_non_null(strstr(html, "H200 default"));
    assert_non_null(strstr(html, "guess for a CPU"));
    /* The runs table says how each run was made. */
    assert_non_null(strstr(html, "<th>cascade</th><th>inject</th><th>verify</th><th>status</th>"));
    /* The planted fault (run 9) is in its own table, caught, and out of the accuracy summary:
     * the cuda_paged bf16 group holds runs 1-6, 8 and 10. */
    assert_non_null(strstr(html, "Planted faults"));
    assert_non_null(strstr(html, "<td>9</td><td>causal-off-by-one</td>"));
    assert_non_null(strstr(html, "<td>caught</td>"));
    assert_int_equal(cell_after(html, "cuda_paged bf16"), 8);
    /* The run that stopped says why, in its row and in the list of unfinished runs. */
    assert_non_null(strstr(html, "<td>error: " ERROR_RUN_REASON "</td>"));
    assert_non_null(strstr(html, "run 10, status error after 25 stored steps: " ERROR_RUN_REASON));
    /* Times carry the unit that reads best (run 11's steps take seconds), TFLOP/s keeps its
     * significant digits (run 11: about 0.003), and no cell shows thousands of µs. */
    assert_non_null(strstr(html, " s</td>"));
    assert_null(strstr(html, ">0.00 ("));
    for (const char *p = strstr(html, " µs</td>"); p; p = strstr(p + 1, " µs</td>")) {
        const char *start = p;
        while (start > html && start[-1] != '>') start--;
        if (strtod(start, NULL) >= 1000.0) fail_msg("a time cell reads %.20s", start);
    }
    free(html);
    /* Charts of one trace hold only its runs; error ticks read 1e-6, not 0.000001; the legend
     * sits under the plot */
    expect_in_file(out, "step_time_trace1.gp", "data/run1.csv", "data/run7.csv");
    expect_in_file(out, "step_time_trace1.gp", "set key below", "outside right");
    expect_in_file(out, "errors_nmse.gp", "data/nmse_group", "data/run9");
    snprintf(path, sizeof path, "%s/errors_nmse.svg", out);
    char *svg = tu_slurp(path);
    assert_non_null(svg);
    assert_true(svg_has_text(svg, "1e-6"));
    assert_false(svg_has_text(svg, "0.000001"));
    free(svg);

    snprintf(path, sizeof path, "%s/summary.md", out);
    char *md = tu_slurp(path);
    assert_non_null(md);
    assert_non_null(strstr(md, "| run | trace |"));
    assert_non_null(strstr(md, "![Roofline"));
    assert_non_null(strstr(md, "## Cascade speedup"));
    free(md);

    /* Cascade run 6 pairs with a non-cascade run of the same trace; the planted speedup at
     * step 0 is 1 + 512/2000 = 1.256. */
    snprintf(path, sizeof path, "%s/data/cascade_run6.csv", out);
    char *csv = tu_slurp(path);
    assert_non_null(csv);
    assert_non_null(strstr(csv, "\n512,1.256,0,"));
    free(csv);
}

static void test_report_selected_runs(void **state)
{
    (void)state;
    if (!ar_plot_have_gnuplot()) skip();
    char out[1024];
    tu_tmp("report_some", out, sizeof out);
    assert_int_equal(run_report(out, "--run", "1", "--run", "7"), 0);
    for (size_t i = 0; i + 1 < NUM_PLOTS; i++) check_plot(out, all_plots[i][0], all_plots[i][1]);
    /* one run of each trace: run 7 alone in the second trace's charts */
    expect_in_file(out, "time_vs_tokens_trace2.gp", "data/run7.csv", "data/run1.csv");
    /* No selected run used cascade: no chart, and the report says why. */
    assert_int_equal(size_of(out, "cascade_speedup.png"), -1);
    char path[2048];
    snprintf(path, sizeof path, "%s/index.html", out);
    char *html = tu_slurp(path);
    assert_non_null(html);
    assert_non_null(strstr(html, "no selected run took the cascade path"));
    free(html);
}

static void test_report_bad_input(void **state)
{
    (void)state;
    char out[1024], path[1024], empty_db[1024];
    tu_tmp("report_bad", out, sizeof out);
    /* Missing database, a text file, an unknown run, missing --out, bad --run, no runs. */
    char *argv_missing[] = { (char *)"report", (char *)"/nonexistent/x.db", (char *)"--out", out, NULL };
    assert_int_equal(ar_report_main(4, argv_missing), 2);
    tu_tmp("not_a_db.db", path, sizeof path);
    assert_int_equal(tu_write(path, "this is not sqlite\n"), 0);
    char *argv_text[] = { (char *)"report", path, (char *)"--out", out, NULL };
    assert_int_equal(ar_report_main(4, argv_text), 2);
    assert_int_equal(run_report(out, "--run", "99", NULL, NULL), 2);
    char *argv_no_out[] = { (char *)"report", db_path, NULL };
    assert_int_equal(ar_report_main(2, argv_no_out), 2);
    assert_int_equal(run_report(out, "--run", "x1", NULL, NULL), 2);
    assert_int_equal(run_report(out, "--bogus", NULL, NULL, NULL), 2);
    tu_tmp("empty.db", empty_db, sizeof empty_db);
    assert_int_equal(make_db(empty_db, 0), 0);
    char *argv_empty[] = { (char *)"report", empty_db, (char *)"--out", out, NULL };
    assert_int_equal(ar_report_main(4, argv_empty), 2);
}

/* A directory given as the database is named as one (SQLite says "disk I/O error"), and a
 * database of a newer schema version is refused as replay --db refuses it: exit 2 from report,
 * diff and plan, the file untouched. */
static void test_directory_and_newer_schema_refused(void **state)
{
    (void)state;
    char out[1024], dir[1024], newer[1024], err[1024];
    tu_tmp("report_dir_out", out, sizeof out);
    tu_tmp("a_directory.db", dir, sizeof dir);
    mkdir(dir, 0755);
    err[0] = 0;
    void *h = ar_rd_open(dir, err, sizeof err);
    assert_null(h);
    if (!strstr(err, "is a directory") || !strstr(err, dir)) fail_msg("%s", err);
    char *argv_dir[] = { (char *)"report", dir, (char *)"--out", out, NULL };
    assert_int_equal(ar_report_main(4, argv_dir), 2);
    char *argv_diff_dir[] = { (char *)"diff", dir, (char *)"1", (char *)"2", NULL };
    assert_int_equal(ar_diff_main(4, argv_diff_dir), 2);

    tu_tmp("newer_schema.db", newer, sizeof newer);
    assert_int_equal(make_db(newer, 1), 0);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(newer, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "UPDATE meta SET value='99' WHERE key='schema_version'", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
    err[0] = 0;
    h = ar_rd_open(newer, err, sizeof err);
    if (h) ar_rd_close(h);
    assert_null(h);
    if (!strstr(err, "schema version 99 is newer than this attnreplay's")) fail_msg("%s", err);
    char *argv_newer[] = { (char *)"report", newer, (char *)"--out", out, NULL };
    assert_int_equal(ar_report_main(4, argv_newer), 2);
    char *argv_diff_newer[] = { (char *)"diff", newer, (char *)"1", (char *)"2", NULL };
    assert_int_equal(ar_diff_main(4, argv_diff_newer), 2);
    assert_int_equal(tu_query_int(newer, "SELECT value FROM meta WHERE key='schema_version'"), 99);
    /* the same database at the current version still reads */
    assert_int_equal(make_db(newer, 1), 0);
    h = ar_rd_open(newer, err, sizeof err);
    assert_non_null(h);
    ar_rd_close(h);
}

/* ---- diff ----------------------------------------------------------------------------------- */

static const ar_diff_options default_options = { .threshold = 0.05, .error_growth = 2.0 };

static void test_diff_identical_runs(void **state)
{
    (void)state;
    assert_int_equal(run_diff("1", "2", NULL, NULL), 0);
    ar_diff_result r;
    char err[512];
    assert_int_equal(ar_diff_runs(db_path, 1, 2, &default_options, &r, err, sizeof err), 0);
    assert_int_equal(r.common_steps, NUM_STEPS);
    assert_int_equal(r.timed_steps, NUM_STEPS);
    assert_true(fabs(r.ratio_median - 1.0) < 1e-12);
    assert_int_equal(r.slower_steps, 0);
    assert_int_equal(r.newly_failing, 0);
    assert_int_equal(r.time_regression, 0);
    assert_int_equal(r.accuracy_regression, 0);
}

static void test_diff_planted_slowdown(void **state)
{
    (void)state;
    assert_int_equal(run_diff("1", "3", NULL, NULL), 1);
    /* Faster is not a regression. */
    assert_int_equal(run_diff("3", "1", NULL, NULL), 0);
    ar_diff_result r;
    char err[512];
    assert_int_equal(ar_diff_runs(db_path, 1, 3, &default_options, &r, err, sizeof err), 0);
    assert_true(fabs(r.ratio_median - 1.3) < 1e-9);
    assert_true(fabs(r.ratio_p90 - 1.3) < 1e-9);
    assert_true(fabs(r.total_ratio - 1.3) < 1e-9);
    assert_int_equal(r.slower_steps, NUM_STEPS);
    assert_int_equal(r.time_regression, 1);
    assert_int_equal(r.accuracy_regression, 0);
    /* 3% slower: below the default 5% threshold, above a 1% one. */
    assert_int_equal(run_diff("1", "8", NULL, NULL), 0);
    assert_int_equal(run_diff("1", "8", "--threshold", "1%"), 1);
    assert_int_equal(run_diff("1", "8", "--threshold", "0.02"), 1);
    assert_int_equal(run_diff("1", "3", "--threshold", "40%"), 0);
}

static void test_diff_planted_accuracy_change(void **state)
{
    (void)state;
    assert_int_equal(run_diff("1", "4", NULL, NULL), 1);
    ar_diff_result r;
    char err[512];
    assert_int_equal(ar_diff_runs(db_path, 1, 4, &default_options, &r, err, sizeof err), 0);
    assert_int_equal(r.newly_failing, 1);
    assert_int_equal(r.newly_passing, 0);
    assert_int_equal(r.error_grown_steps, 1);
    assert_int_equal(r.time_regression, 0);
    assert_int_equal(r.accuracy_regression, 1);
    /* The other direction: a step that starts passing is reported, not a regression. */
    assert_int_equal(ar_diff_runs(db_path, 4, 1, &default_options, &r, err, sizeof err), 0);
    assert_int_equal(r.newly_passing, 1);
    assert_int_equal(r.accuracy_regression, 0);
}

static void test_diff_error_growth(void **state)
{
    (void)state;
    /* Run 5: every step still passes but max_abs is 10x (NMSE 100x). */
    assert_int_equal(run_diff("1", "5", NULL, NULL), 1);
    ar_diff_result r;
    char err[512];
    assert_int_equal(ar_diff_runs(db_path, 1, 5, &default_options, &r, err, sizeof err), 0);
    assert_int_equal(r.newly_failing, 0);
    assert_int_equal(r.error_grown_steps, NUM_STEPS);
    assert_true(fabs(r.max_abs_b / r.max_abs_a - 10.0) < 1e-9);
    assert_int_equal(r.accuracy_regression, 1);
    /* A looser limit lets it through. */
    assert_int_equal(run_diff("1", "5", "--error-growth", "20"), 0);
}

/* A run that stopped early is refused, with its status and reason, unless asked for. */
static void test_diff_unfinished_run(void **state)
{
    (void)state;
    ar_diff_result r;
    char err[1024];
    assert_int_equal(ar_diff_runs(db_path, 1, 10, &default_options, &r, err, sizeof err), -1);
    if (!strstr(err, "run 10 did not finish (status 'error': " ERROR_RUN_REASON "; 25 steps stored)") ||
        !strstr(err, "--allow-unfinished"))
        fail_msg("message '%s'", err);
    assert_int_equal(ar_diff_runs(db_path, 10, 1, &default_options, &r, err, sizeof err), -1);
    ar_diff_options allow = default_options;
    allow.allow_unfinished = 1;
    assert_int_equal(ar_diff_runs(db_path, 1, 10, &allow, &r, err, sizeof err), 0);
    assert_int_equal(r.common_steps, 25);
    assert_int_equal(r.only_in_a, 15);
    /* the command: exit 2 with the reason on stderr; with the flag a warning heads the output */
    char log[1024];
    tu_tmp("diff_unfinished.txt", log, sizeof log);
    int rc = tu_run(log, "%s diff %s 1 10", tu_bin(), db_path);
    char *text = tu_slurp(log);
    assert_non_null(text);
    if (rc != 2 || !strstr(text, ERROR_RUN_REASON)) fail_msg("rc %d: %s", rc, text);
    free(text);
    rc = tu_run(log, "%s diff %s 1 10 --allow-unfinished", tu_bin(), db_path);
    text = tu_slurp(log);
    assert_non_null(text);
    if (rc != 0 || !strstr(text, "warning: run 10 did not finish")) fail_msg("rc %d: %s", rc, text);
    free(text);
}

static void test_diff_bad_input(void **state)
{
    (void)state;
    assert_int_equal(run_diff("1", "7", NULL, NULL), 2);       /* different traces */
    assert_int_equal(run_diff("1", "99", NULL, NULL), 2);      /* unknown run */
    assert_int_equal(run_diff("1", "abc", NULL, NULL), 2);     /* not a run id */
    assert_int_equal(run_diff("1", "2", "--threshold", "fast"), 2);
    assert_int_equal(run_diff("1", "2", "--threshold", NULL), 2);
    assert_int_equal(run_diff("1", "2", "--error-growth", "0.5"), 2);
    assert_int_equal(run_diff("1", "2", "--what", "1"), 2);
    char *argv_short[] = { (char *)"diff", db_path, (char *)"1", NULL };
    assert_int_equal(ar_diff_main(3, argv_short), 2);
    char *argv_nodb[] = { (char *)"diff", (char *)"/nonexistent/x.db", (char *)"1", (char *)"2", NULL };
    assert_int_equal(ar_diff_main(4, argv_nodb), 2);
}

/* One run given twice always "passed" the gate (a script's $BASE twice, a replay that added no
 * run); out-of-range, negative and malformed values are refused naming the rule; a comparison
 * that cannot be written (stdout on /dev/full) is exit 3, not the gate's 0 or 1. */
static void test_diff_options_and_output(void **state)
{
    (void)state;
    static const struct { const char *args, *says; } refused[] = {
        { "1 1", "RUN_A and RUN_B are both run 1; diff compares a baseline with another run" },
        { "2 02", "both run 2" },
        { "-1 2", "run ids must be non-negative integers (got '-1' and '2')" },
        { "1 99999999999999999999", "run ids must be non-negative integers" },
        { "1 2 --threshold 5%%", "--threshold '5%%': expected a percentage" },
        { "1 2 --threshold -1", "from 0 to 10000% (100)" },
        { "1 2 --threshold abc", "--threshold 'abc'" },
        { "1 2 --threshold 1e999", "--threshold '1e999'" },
        { "1 2 --threshold 101", "--threshold '101'" },
        { "1 2 --threshold 0x1p-4", "--threshold '0x1p-4'" },
        { "1 2 --threshold ' 5%'", "--threshold ' 5%'" },
        { "1 2 --error-growth 0x2", "--error-growth '0x2': expected a factor >= 1" },
    };
    char log[1024];
    tu_tmp("diff_options.txt", log, sizeof log);
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int rc = tu_run(log, "'%s' diff '%s' %s", tu_bin(), db_path, refused[i].args);
        char *text = tu_slurp(log);
        assert_non_null(text);
        if (rc != 2 || !strstr(text, refused[i].says))
            fail_msg("diff %s: rc %d, '%s'", refused[i].args, rc, text);
        free(text);
    }
    char err[512];
    ar_diff_result r;
    assert_int_equal(ar_diff_runs(db_path, 3, 3, &default_options, &r, err, sizeof err), -1);
    assert_non_null(strstr(err, "both run 3"));
    if (access("/dev/full", W_OK) == 0) {
        for (int k = 0; k < 2; k++) {   /* no regression, then one */
            int rc = tu_run(NULL, "'%s' diff '%s' 1 %s >/dev/full 2>'%s'", tu_bin(), db_path, k ? "3" : "2", log);
            char *text = tu_slurp(log);
            assert_non_null(text);
            if (rc != 3 || !strstr(text, "attnreplay diff: cannot write the output (No space left on device)"))
                fail_msg("diff to /dev/full: rc %d, '%s'", rc, text);
            free(text);
        }
    }
}

/* A FIFO (or another file that is not a regular one) given as the database is refused at once
 * naming it: SQLite's open of a FIFO blocked forever waiting for a writer. */
static void test_fifo_is_not_a_database(void **state)
{
    (void)state;
    char path[512], err[1024];
    tu_tmp("results.fifo", path, sizeof path);
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(20);   /* a blocked open ends the test instead of the suite hanging */
    void *rd = ar_rd_open(path, err, sizeof err);
    alarm(0);
    unlink(path);
    if (rd || !strstr(err, path) || !strstr(err, "not a regular file")) fail_msg("%s", rd ? "opened a FIFO" : err);
}

/* A results database another process is writing (a rollback-journal one under BEGIN
 * EXCLUSIVE) is waited for as long as a writer waits (ATTNREPLAY_BUSY_TIMEOUT_MS), and past
 * that named as locked; it was read for 5 s and then called "not a readable SQLite database". */
static void test_locked_database_waited_for(void **state)
{
    (void)state;
    char path[512], err[1024];
    tu_tmp("locked.db", path, sizeof path);
    assert_int_equal(make_db(path, 1), 0);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "PRAGMA journal_mode=DELETE; BEGIN EXCLUSIVE; DELETE FROM steps WHERE 0", NULL,
                                  NULL, NULL), SQLITE_OK);
    pthread_t holder;
    assert_int_equal(pthread_create(&holder, NULL, tu_commit_later, db), 0);
    setenv("ATTNREPLAY_BUSY_TIMEOUT_MS", "0", 1);
    void *rd = ar_rd_open(path, err, sizeof err);
    if (rd || !strstr(err, path) || !strstr(err, "locked by another connection") || strstr(err, "not a"))
        fail_msg("%s", rd ? "opened under a write lock" : err);
    setenv("ATTNREPLAY_BUSY_TIMEOUT_MS", "20000", 1);
    rd = ar_rd_open(path, err, sizeof err);
    unsetenv("ATTNREPLAY_BUSY_TIMEOUT_MS");
    if (!rd) fail_msg("%s", err);
    ar_rd_close(rd);
    pthread_join(holder, NULL);
    sqlite3_close(db);
}

/* ---- end to end through bin/attnreplay (skips when the binary has not been built) ------------ */

static void test_end_to_end_with_replay(void **state)
{
    (void)state;
    char trace[1024], e2e_db[1024], out[1024], log[1024];
    snprintf(trace, sizeof trace, "%s/traces/samples/prefix.trace.jsonl.gz", tu_src_dir());
    if (access(tu_bin(), X_OK) != 0 || access(trace, R_OK) != 0 || !ar_plot_have_gnuplot()) skip();
    tu_tmp("e2e.db", e2e_db, sizeof e2e_db);
    tu_tmp("e2e_report", out, sizeof out);
    tu_tmp("e2e.log", log, sizeof log);
    const char *common = "--threads 1 --steps 0:8 --quiet";
    /* Run 1: cascade off; run 2: cascade on; run 3: a planted fault (replay exits 1). */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --cascade off %s", tu_bin(), trace,
                            e2e_db, common), 0);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --cascade on %s", tu_bin(), trace,
                            e2e_db, common), 0);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --cascade off --inject no-rescale %s",
                            tu_bin(), trace, e2e_db, common), 1);
    assert_int_equal(tu_run(log, "'%s' report '%s' --out '%s'", tu_bin(), e2e_db, out), 0);
    assert_true(size_of(out, "step_time.png") > 2000);
    assert_true(size_of(out, "roofline.svg") > 2000);
    assert_true(size_of(out, "cascade_speedup.png") > 2000);
    assert_true(size_of(out, "index.html") > 500);
    assert_int_equal(tu_run(log, "'%s' diff '%s' 1 1", tu_bin(), e2e_db), 2);   /* one run twice */
    assert_int_equal(tu_run(log, "'%s' diff '%s' 1 3", tu_bin(), e2e_db), 1);
    /* Timing on a shared CPU is noisy, so only the accuracy verdict is certain here. */
    char *text = tu_slurp(log);
    assert_non_null(text);
    int flagged = strstr(text, "REGRESSION") && strstr(text, "(accuracy)") &&
                  strstr(text, "9 newly failing");
    free(text);
    assert_true(flagged);
}

/* ---- plan ------------------------------------------------------------------------------------ */

static void test_plan_fit_recovers_planted_model(void **state)
{
    (void)state;
    /* Run 1 was planted per layer as 5 us + max(bytes / 3.6 TB/s, FLOPs / 500 TFLOP/s), times
     * 1.00-1.04; against the H200 default ceilings (4300 GB/s, 790 TFLOP/s) the fit should find
     * bw_eff = 3.6/4.3 and attn_eff = 500/790. */
    ar_plan_fit fit;
    char err[512];
    int64_t run = 1;
    assert_int_equal(ar_plan_fit_db(db_path, &run, 1, NULL, &fit, err, sizeof err), 0);
    assert_true(fabs(fit.bw_eff / (3.6 / 4.3) - 1.0) < 0.08);
    assert_true(fabs(fit.attn_eff / (500.0 / 790.0) - 1.0) < 0.10);
    assert_true(fit.launch_s > 2e-6 && fit.launch_s < 8e-6);
    assert_int_equal(fit.train_steps + fit.test_steps, NUM_STEPS);
    assert_int_equal(fit.test_steps, NUM_STEPS / 5);
    assert_true(fit.test_mape < 0.05);
    assert_non_null(strstr(fit.device, "H200"));
    /* Default selection: runs on a device matching the hint, none with a planted fault. */
    assert_int_equal(ar_plan_fit_db(db_path, NULL, 0, "h200", &fit, err, sizeof err), 0);
    assert_int_equal(fit.runs, 8);
    /* Runs of two devices cannot be fitted together. */
    int64_t mixed[2] = { 1, 7 };
    assert_int_equal(ar_plan_fit_db(db_path, mixed, 2, NULL, &fit, err, sizeof err), -1);
    assert_non_null(strstr(err, "different devices"));
}

/* Reads plan.csv rows: rate, kv_blocks, preemptions per request, ttft p90. */
static int read_plan_csv(const char *path, double rows[][4], int max_rows)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[1024];
    int n = 0;
    if (!fgets(line, sizeof line, f)) { fclose(f); return -1; }
    while (n < max_rows && fgets(line, sizeof line, f)) {
        double v[14];
        char *p = line;
        for (int i = 0; i < 14; i++) {
            v[i] = strtod(p, &p);
            if (*p == ',') p++;
        }
        rows[n][0] = v[0];
        rows[n][1] = v[1];
        rows[n][2] = v[11];
        rows[n][3] = v[5];
        n++;
    }
    fclose(f);
    return n;
}

static void test_plan_small_workload(void **state)
{
    (void)state;
    char out[1024], path[2048];
    tu_tmp("plan", out, sizeof out);
    char *argv[] = { (char *)"plan", (char *)"--workload", (char *)"synthetic:n=40,input=500,output=64,rate=40",
                     (char *)"--model", (char *)"llama-3.1-8b", (char *)"--device", (char *)"h200",
                     (char *)"--db", db_path, (char *)"--run", (char *)"1",
                     (char *)"--rates", (char *)"0.25,1,8", (char *)"--kv-blocks", (char *)"100,8000",
                     (char *)"--slo", (char *)"ttft_p90=100ms,tpot_p90=50ms", (char *)"--out", out, NULL };
    int argc = (int)(sizeof argv / sizeof argv[0]) - 1;
    int rc = ar_plan_main(argc, argv);
    assert_int_equal(rc, ar_plot_have_gnuplot() ? 0 : 1);
    snprintf(path, sizeof path, "%s/plan.csv", out);
    double rows[8][4];
    assert_int_equal(read_plan_csv(path, rows, 8), 6);
    /* Rows: KV size major, rate minor. */
    assert_true(rows[0][0] == 0.25 && rows[2][0] == 8 && rows[0][1] == 100 && rows[3][1] == 8000);
    /* More load never lowers the TTFT tail. */
    assert_true(rows[2][3] >= rows[0][3]);
    assert_true(rows[5][3] >= rows[3][3]);
    /* 100 blocks (99 usable) admit three 500-token prompts (32 blocks each) at once, and their
     * growth to 564 tokens (36 blocks each) must preempt; 8000 blocks hold all 40 requests. */
    assert_true(rows[2][2] > 0);
    assert_true(rows[5][2] == 0);
    snprintf(path, sizeof path, "%s/plan.md", out);
    char *md = tu_slurp(path);
    assert_non_null(md);
    int ok = strstr(md, "## Sweep") && strstr(md, "held-out steps") &&
             strstr(md, "100 KV blocks: even the smallest tested rate scale x0.25 misses") &&
             strstr(md, "rate scale x0.25: smallest tested KV size meeting ttft_p90=100ms,tpot_p90=50ms: 8000 blocks");
    /* 8000 blocks meet the SLO at x1 and miss it at x8 (TTFT p90 grows past 100 ms with the
     * queue), so the bisected answer lies between them. */
    const char *refined = strstr(md, "8000 KV blocks: largest rate scale meeting ttft_p90=100ms,tpot_p90=50ms: about x");
    double scale = refined ? strtod(strstr(refined, "about x") + 7, NULL) : 0;
    free(md);
    assert_true(ok);
    assert_true(scale >= 1.0 && scale < 8.0);
    if (ar_plot_have_gnuplot()) {
        check_plot(out, "plan_ttft", "Simulated TTFT p90 against arrival rate (llama-3.1-8b, h200)");
        check_plot(out, "plan_fit", "Attention step-time model: predicted against measured");
    }
    /* TTFT on a log axis; the bisected answer drawn as a vertical at its rate; the TPOT SLO
     * line below the top of the chart, not on its border */
    snprintf(path, sizeof path, "%s/plan_ttft.gp", out);
    char *gp = tu_slurp(path);
    assert_non_null(gp);
    assert_non_null(strstr(gp, "set logscale y"));
    const char *arrow = strstr(gp, "set arrow 1 from ");
    assert_non_null(arrow);
    assert_true(fabs(strtod(arrow + strlen("set arrow 1 from "), NULL) - scale) < 0.01 * scale);
    assert_non_null(strstr(gp, "largest rate meeting the SLO, 8000 KV blocks"));
    free(gp);
    snprintf(path, sizeof path, "%s/plan_tpot.gp", out);
    gp = tu_slurp(path);
    assert_non_null(gp);
    const char *yrange = strstr(gp, "set yrange [");
    assert_non_null(yrange);
    const char *colon = strchr(yrange, ':');
    assert_non_null(colon);
    assert_true(strtod(colon + 1, NULL) > 50.0 * 1.1);
    free(gp);
    /* the table on stdout names its units */
    char log[1024];
    tu_tmp("plan_stdout.txt", log, sizeof log);
    assert_int_equal(tu_run(log, "%s plan --workload synthetic:n=40,input=500,output=64,rate=40 --model llama-3.1-8b "
                            "--device h200 --rates 1 --kv-blocks 8000 --out %s_stdout", tu_bin(), out),
                     ar_plot_have_gnuplot() ? 0 : 1);
    char *text = tu_slurp(log);
    assert_non_null(text);
    if (!strstr(text, "(blocks)") || !strstr(text, "(ms)") || !strstr(text, "(tok/s)")) fail_msg("table: %s", text);
    free(text);
}

static void test_plan_fit_from_other_device_not_applied(void **state)
{
    (void)state;
    char out[1024], path[2048];
    tu_tmp("plan_h100", out, sizeof out);
    /* The database's runs were measured on an H200; planning an H100 reports the fit but
     * simulates with the roofline defaults. */
    char *argv[] = { (char *)"plan", (char *)"--workload", (char *)"synthetic:n=8,input=64,output=8",
                     (char *)"--model", (char *)"llama-3.1-8b", (char *)"--device", (char *)"h100",
                     (char *)"--db", db_path, (char *)"--run", (char *)"1", (char *)"--rates", (char *)"1",
                     (char *)"--kv-blocks", (char *)"4000", (char *)"--out", out, NULL };
    int rc = ar_plan_main((int)(sizeof argv / sizeof argv[0]) - 1, argv);
    assert_int_equal(rc, ar_plot_have_gnuplot() ? 0 : 1);
    snprintf(path, sizeof path, "%s/plan.md", out);
    char *md = tu_slurp(path);
    assert_non_null(md);
    int ok = strstr(md, "not measured on h100") && strstr(md, "roofline defaults: attn_eff 0.5, bw_eff 0.8");
    free(md);
    assert_true(ok);
}

static void test_plan_bad_input(void **state)
{
    (void)state;
    char *no_device[] = { (char *)"plan", (char *)"--workload", (char *)"synthetic:n=4,input=16,output=4",
                          (char *)"--model", (char *)"llama-3.1-8b", NULL };
    assert_int_equal(ar_plan_main(5, no_device), 2);
    char *bad_model[] = { (char *)"plan", (char *)"--workload", (char *)"synthetic:n=4,input=16,output=4",
                          (char *)"--model", (char *)"gpt-9", (char *)"--device", (char *)"h200", NULL };
    assert_int_equal(ar_plan_main(7, bad_model), 2);
    char *bad_slo[] = { (char *)"plan", (char *)"--workload", (char *)"synthetic:n=4,input=16,output=4",
                        (char *)"--model", (char *)"llama-3.1-8b", (char *)"--device", (char *)"h200",
                        (char *)"--slo", (char *)"ttft_p95=2s", NULL };
    assert_int_equal(ar_plan_main(9, bad_slo), 2);
    char *bad_rates[] = { (char *)"plan", (char *)"--workload", (char *)"synthetic:n=4,input=16,output=4",
                          (char *)"--model", (char *)"llama-3.1-8b", (char *)"--device", (char *)"h200",
                          (char *)"--rates", (char *)"1,-2", NULL };
    assert_int_equal(ar_plan_main(9, bad_rates), 2);
    char *run_no_db[] = { (char *)"plan", (char *)"--workload", (char *)"synthetic:n=4,input=16,output=4",
                          (char *)"--model", (char *)"llama-3.1-8b", (char *)"--device", (char *)"h200",
                          (char *)"--run", (char *)"1", NULL };
    assert_int_equal(ar_plan_main(9, run_no_db), 2);
    char out[1024];
    tu_tmp("plan_bad", out, sizeof out);
    char *bad_workload[] = { (char *)"plan", (char *)"--workload", (char *)"mooncake:/nonexistent.jsonl",
                             (char *)"--model", (char *)"llama-3.1-8b", (char *)"--device", (char *)"h200",
                             (char *)"--out", out, NULL };
    assert_int_equal(ar_plan_main(9, bad_workload), 2);
    /* a step-time model the simulator cannot run (its clock overflows: ar_sim_step's -2) is bad
     * input, exit 2 as in sim, not a failed simulation (exit 1) */
    char log[1024];
    tu_tmp("plan_overflow.log", log, sizeof log);
    tu_tmp("plan_overflow", out, sizeof out);
    int rc = tu_run(log, "%s plan --workload synthetic:n=5,input=10,output=3 --model llama-3.1-8b --device h200 "
                         "--step-time constant:1e308 --rates 1 --kv-blocks 400 --out %s 2>&1", tu_bin(), out);
    char *text = tu_slurp(log);
    assert_non_null(text);
    if (rc != 2 || !strstr(text, "the simulated clock overflows")) fail_msg("rc %d: %s", rc, text);
    free(text);
    /* a KV size that holds no request of the workload is an impossible configuration, exit 2
     * naming it, not a sweep of "0/N finished" rows with nan throughput and plots that gnuplot
     * refuses (exit 1) */
    tu_tmp("plan_tiny_kv", out, sizeof out);
    rc = tu_run(log, "%s plan --workload synthetic:n=5,input=100,output=3 --model llama-3.1-8b --device h200 "
                     "--rates 1 --kv-blocks 3,400 --out %s 2>&1", tu_bin(), out);
    text = tu_slurp(log);
    assert_non_null(text);
    if (rc != 2 || !strstr(text, "a KV cache of 3 blocks (2 usable) of 16 tokens holds none of them") ||
        !strstr(text, "needs 7 blocks") || strstr(text, "simulation failed"))
        fail_msg("rc %d: %s", rc, text);
    free(text);
    /* a --db that is no results database, and one without the run asked for: exit 2, the file
     * named once (it was "plan: DB: DB: ..." for the first) */
    char db[1024], runs_db[1024];
    tu_tmp("plan_not_results.db", db, sizeof db);
    tu_tmp("plan_runs.db", runs_db, sizeof runs_db);
    assert_int_equal(make_db(runs_db, 1), 0);
    unlink(db);
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "CREATE TABLE other(x)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(h);
    for (int with_run = 0; with_run < 2; with_run++) {
        rc = tu_run(log, "%s plan --workload synthetic:n=5,input=100,output=3 --model llama-3.1-8b --device h200 "
                         "--rates 1 --out %s --db %s %s 2>&1", tu_bin(), out, with_run ? runs_db : db,
                    with_run ? "--run 99" : "");
        text = tu_slurp(log);
        assert_non_null(text);
        const char *named = with_run ? runs_db : db;
        const char *first = strstr(text, named);
        if (rc != 2 || !first || strstr(first + strlen(named), named) ||
            !strstr(text, with_run ? "run 99 is not in the database" : "not an attnreplay results database"))
            fail_msg("rc %d: %s", rc, text);
        free(text);
    }
}

/* The "Step-time model" paragraph (stdout and plan.md) states the model --step-time gave, not
 * the roofline's efficiencies, which a constant or linear model does not have. */
static void test_plan_states_step_time_model(void **state)
{
    (void)state;
    struct { const char *model, *want; } cases[] = {
        { "constant:0.02", "Step-time model: constant, every step takes 0.02 s whatever it runs (--step-time constant:0.02)" },
        { "linear:0.01,1e-5,1e-4,1e-7", "Step-time model: linear, t = 0.01 s + 1e-05 s x tokens + 0.0001 s x requests "
                                        "+ 1e-07 s x KV tokens" },
        { "roofline:h200,attn_eff=0.3", "Step-time model: the simulator's roofline on h200 (--step-time "
                                        "roofline:h200,attn_eff=0.3): attn_eff 0.3," },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char log[1024], out[1024], md[1100];
        tu_tmp("plan_model.log", log, sizeof log);
        snprintf(md, sizeof md, "plan_model_%zu", i);
        tu_tmp(md, out, sizeof out);
        int rc = tu_run(log, "%s plan --workload synthetic:n=5,input=10,output=3 --model llama-3.1-8b --device h200 "
                             "--step-time %s --rates 1 --kv-blocks 400 --out %s 2>&1", tu_bin(), cases[i].model, out);
        char *text = tu_slurp(log);
        assert_non_null(text);
        if (rc != 0 || !strstr(text, cases[i].want) || strstr(text, "default efficiencies"))
            fail_msg("rc %d, want '%s': %s", rc, cases[i].want, text);
        free(text);
        snprintf(md, sizeof md, "%s/plan.md", out);
        text = tu_slurp(md);
        assert_non_null(text);
        if (!strstr(text, cases[i].want)) fail_msg("plan.md lacks '%s': %s", cases[i].want, text);
        free(text);
    }
}

/* Every output path of report and plan: checked before the work, the system's reason in the
 * message, exit 2; a plan with nowhere to write is refused; paths print without "//". */
static void test_output_paths(void **state)
{
    (void)state;
    char blocker[1024], log[1024], out[1024];
    tu_tmp("a_file", blocker, sizeof blocker);
    assert_int_equal(tu_write(blocker, "x"), 0);
    tu_tmp("paths.log", log, sizeof log);
    const char *plan = "plan --workload synthetic:n=30,input=300,output=20,rate=20 --model llama-3.1-8b "
                       "--device h200 --rates 1 --kv-blocks 4000";
    assert_int_equal(tu_run(log, "%s %s >/dev/null 2>&1", tu_bin(), plan), 2);
    /* an output directory under a file: refused before the sweep prints anything */
    int rc = tu_run(log, "%s %s --out %s/plan 2>&1", tu_bin(), plan, blocker);
    char *text = tu_slurp(log);
    assert_non_null(text);
    if (rc != 2 || !strstr(text, "Not a directory") || strstr(text, "rate x")) fail_msg("rc %d: %s", rc, text);
    free(text);
    rc = tu_run(log, "%s report %s --out %s/report 2>&1", tu_bin(), db_path, blocker);
    text = tu_slurp(log);
    assert_non_null(text);
    if (rc != 2 || !strstr(text, "Not a directory")) fail_msg("rc %d: %s", rc, text);
    free(text);
    /* a trailing slash is not doubled in what report prints */
    tu_tmp("slash_report", out, sizeof out);
    rc = tu_run(log, "PATH= %s report %s --run 1 --out %s/ 2>&1", tu_bin(), db_path, out);
    text = tu_slurp(log);
    assert_non_null(text);
    if (strstr(text, "//") || !strstr(text, "slash_report/index.html")) fail_msg("rc %d: %s", rc, text);
    free(text);
}

/* ---- helpers of rundata.c and diff.c --------------------------------------------------------- */

/* Run ids are decimal digits: a sign or a blank before them was read as the number. */
static void test_parse_run_id(void **state)
{
    (void)state;
    int64_t id = -5;
    assert_int_equal(ar_rd_parse_run_id("12", &id), 0);
    assert_int_equal(id, 12);
    assert_int_equal(ar_rd_parse_run_id("0", &id), 0);
    assert_int_equal(id, 0);
    assert_int_equal(ar_rd_parse_run_id("9223372036854775807", &id), 0);
    static const char *const bad[] = {"", " 1", "+1", "-0", "-1", "1 ", "1x", "0x10", "9223372036854775808", "1.0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        id = -5;
        assert_int_equal(ar_rd_parse_run_id(bad[i], &id), -1);
        assert_int_equal(id, -5);
    }
    assert_int_equal(ar_rd_parse_run_id(NULL, &id), -1);
}

static void test_parse_threshold(void **state)
{
    (void)state;
    double t = 0;
    assert_int_equal(ar_parse_threshold("5%", &t), 0);
    assert_true(fabs(t - 0.05) < 1e-15);
    assert_int_equal(ar_parse_threshold("0.1", &t), 0);
    assert_true(fabs(t - 0.1) < 1e-15);
    assert_int_equal(ar_parse_threshold("12.5%", &t), 0);
    assert_true(fabs(t - 0.125) < 1e-15);
    assert_int_equal(ar_parse_threshold("", &t), -1);
    assert_int_equal(ar_parse_threshold("5%%", &t), -1);
    assert_int_equal(ar_parse_threshold("-5%", &t), -1);
    assert_int_equal(ar_parse_threshold("five", &t), -1);
    assert_int_equal(ar_parse_threshold("0x1p-4", &t), -1);
    assert_int_equal(ar_parse_threshold(" 5%", &t), -1);
    assert_int_equal(ar_parse_threshold("infinity", &t), -1);
    assert_int_equal(ar_parse_threshold("1e-2", &t), 0);
    assert_true(fabs(t - 0.01) < 1e-15);
}

static void test_quantile(void **state)
{
    (void)state;
    double v[5] = { 5, 1, 4, 2, 3 };
    assert_true(ar_rd_quantile(v, 5, 0.5) == 3.0);
    assert_true(fabs(ar_rd_quantile(v, 5, 0.9) - 4.6) < 1e-12);   /* 4 + 0.6 * (5 - 4) */
    assert_true(ar_rd_quantile(v, 5, 0.0) == 1.0);
    assert_true(ar_rd_quantile(v, 5, 1.0) == 5.0);
    double one = 7;
    assert_true(ar_rd_quantile(&one, 1, 0.9) == 7.0);
    assert_true(isnan(ar_rd_quantile(v, 0, 0.5)));
}

static void test_ceilings_lookup(void **state)
{
    (void)state;
    char path[1024], err[512];
    tu_tmp("ceilings.db", path, sizeof path);
    assert_int_equal(make_db(path, 0), 0);
    sqlite3 *raw = NULL;
    assert_int_equal(sqlite3_open(path, &raw), SQLITE_OK);
    assert_int_equal(sqlite3_exec(raw,
        "INSERT INTO ceilings VALUES('NVIDIA H200', 100, 4000, 700, 'old');"
        "INSERT INTO ceilings VALUES('NVIDIA H200', 200, 4250, 780, 'copy kernel + gemm');",
        NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(raw);
    void *db = ar_rd_open(path, err, sizeof err);
    assert_non_null(db);
    ar_ceilings c;
    ar_rd_ceilings(db, "NVIDIA H200", "cuda_paged", &c);   /* the newest row wins */
    assert_true(c.copy_gbps == 4250 && c.bf16_tflops == 780);
    assert_non_null(strstr(c.source, "copy kernel + gemm"));
    ar_rd_ceilings(db, "NVIDIA H100", "cuda_paged", &c);   /* no row: stated default */
    assert_true(c.copy_gbps == 4300 && c.bf16_tflops == 790);
    assert_non_null(strstr(c.source, "unknown device"));
    ar_rd_ceilings(db, "x86", "cpu", &c);
    assert_non_null(strstr(c.source, "guess"));
    ar_rd_close(db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_report_writes_every_file),
        cmocka_unit_test(test_report_selected_runs),
        cmocka_unit_test(test_report_bad_input),
        cmocka_unit_test(test_directory_and_newer_schema_refused),
        cmocka_unit_test(test_locked_database_waited_for),
        cmocka_unit_test(test_diff_identical_runs),
        cmocka_unit_test(test_diff_planted_slowdown),
        cmocka_unit_test(test_diff_planted_accuracy_change),
        cmocka_unit_test(test_diff_error_growth),
        cmocka_unit_test(test_diff_unfinished_run),
        cmocka_unit_test(test_diff_bad_input),
        cmocka_unit_test(test_diff_options_and_output),
        cmocka_unit_test(test_end_to_end_with_replay),
        cmocka_unit_test(test_plan_fit_recovers_planted_model),
        cmocka_unit_test(test_plan_small_workload),
        cmocka_unit_test(test_plan_fit_from_other_device_not_applied),
        cmocka_unit_test(test_plan_bad_input),
        cmocka_unit_test(test_fifo_is_not_a_database),
        cmocka_unit_test(test_plan_states_step_time_model),
        cmocka_unit_test(test_output_paths),
        cmocka_unit_test(test_parse_run_id),
        cmocka_unit_test(test_parse_threshold),
        cmocka_unit_test(test_quantile),
        cmocka_unit_test(test_ceilings_lookup),
    };
    return cmocka_run_group_tests(tests, setup_db, NULL);
}
