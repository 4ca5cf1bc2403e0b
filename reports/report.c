/* report.c - `attnreplay report DB [--run ID ...] --out DIR`: reads runs from a results
 * database (read-only), writes the data behind each chart as CSV under DIR/data, renders the
 * charts through gnuplot (PNG and SVG, see plot.c) and writes DIR/index.html (plots and
 * tables, no network needed) and DIR/summary.md (report_pages.c).
 *
 * Charts: per-step kernel time over the run; time against batch tokens and against total
 * context; error distributions (empirical CDFs of NMSE and max abs error) per backend and
 * dtype; achieved TFLOP/s against arithmetic intensity under each device's roofline; and,
 * when a run took the cascade path, its speedup over a non-cascade run of the same trace
 * against the shared prefix length.  A chart with no data is left out and the report says
 * why.
 *
 * A run merged from shards (attnreplay merge) reads as one run; the table "Shards" lists where
 * each shard ran and what it stored, "Failing steps" names each failing step's shard, and the
 * per-step CSV has a shard column.  A coverage table per run lists the kernel paths its steps ran
 * (the coverage table of schema version 4, replay/db.h): steps, verified steps and failing steps
 * per path; a merged run's coverage is that of all its shards. */
#include "report_ctx.h"
#include "../sim/sim.h"

#include <errno.h>
#include <math.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

FILE *report_open_out(const report_ctx *ctx, const char *rel, char *err, size_t err_len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", ctx->out_dir, rel);
    FILE *f = fopen(path, "w");
    if (!f) snprintf(err, err_len, "%.900s: cannot write: %s", path, strerror(errno));
    return f;
}

bool report_injected(const ar_run_data *run)
{
    return run->inject[0] && strcmp(run->inject, "none") != 0;
}

/* The trace's file name without directories and without ".trace.jsonl[.gz]". */
void report_trace_short_name(const char *trace, char *buf, size_t len)
{
    const char *base = strrchr(trace, '/');
    snprintf(buf, len, "%s", base ? base + 1 : trace);
    char *dot = strstr(buf, ".trace");
    if (dot && dot != buf) *dot = 0;
}

/* Legend text for a run: id, backend, dtypes, and what sets it apart (cascade forced, planted
 * fault).  Charts hold one trace each, so the trace is in the chart's title, not here. */
static void run_label(const ar_run_data *run, char *buf, size_t len)
{
    bool kv_differs = run->kv_dtype[0] && strcmp(run->kv_dtype, run->dtype) != 0;
    bool cascade_forced = strcmp(run->cascade_mode, "on") == 0 || strcmp(run->cascade_mode, "off") == 0;
    snprintf(buf, len, "run %lld: %s %s%s%s%s%s%s%s", (long long)run->id, run->backend, run->dtype,
             kv_differs ? " kv " : "", kv_differs ? run->kv_dtype : "",
             cascade_forced ? " cascade " : "", cascade_forced ? run->cascade_mode : "",
             report_injected(run) ? " inject " : "", report_injected(run) ? run->inject : "");
}

/* Name and title of a chart drawn once per trace: NAME and TITLE for a single trace, else
 * NAME_traceK and "TITLE - trace NAME". */
static void per_trace_names(const report_ctx *ctx, size_t t, const char *name, const char *title, char *name_out,
                            size_t name_len, char *title_out, size_t title_len)
{
    if (ctx->num_traces <= 1) {
        snprintf(name_out, name_len, "%s", name);
        snprintf(title_out, title_len, "%s", title);
        return;
    }
    char trace[128];
    report_trace_short_name(ctx->runs[ctx->trace_rows[t]].trace, trace, sizeof trace);
    snprintf(name_out, name_len, "%s_trace%zu", name, t + 1);
    snprintf(title_out, title_len, "%s - trace %s", title, trace);
}

static bool positive(double v)
{
    return isfinite(v) && v > 0;
}

/* ---- per-run statistics ------------------------------------------------------------------ */

/* Loads the kernel-path coverage of the report's runs: per (run, path) the steps that ran it,
 * the layer-steps, the steps where it ran on a verified layer, and the failing steps among
 * them.  A database without the coverage table (schema version < 3) leaves have_coverage
 * false.  0, or -1 with err set. */
static int load_coverage(report_ctx *ctx, char *err, size_t err_len)
{
    sqlite3 *db = ctx->db;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master WHERE type='table' AND name='coverage'", -1,
                           &st, NULL) != SQLITE_OK || sqlite3_step(st) != SQLITE_ROW) {
        snprintf(err, err_len, "reading the schema: %s", sqlite3_errmsg(db));
        sqlite3_finalize(st);
        return -1;
    }
    ctx->have_coverage = sqlite3_column_int(st, 0) > 0;
    sqlite3_finalize(st);
    if (!ctx->have_coverage) return 0;
    const char *sql = "SELECT c.path, count(*), sum(c.layers), sum(c.verified_layers > 0),"
                      " sum(c.verified_layers > 0 AND s.pass = 0)"
                      " FROM coverage c LEFT JOIN steps s ON s.run = c.run AND s.step = c.step"
                      " WHERE c.run = ? GROUP BY c.path ORDER BY c.path";
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "reading coverage: %s", sqlite3_errmsg(db));
        return -1;
    }
    size_t cap = 0;
    int rc = SQLITE_DONE;
    for (size_t r = 0; r < ctx->num_runs && rc == SQLITE_DONE; r++) {
        sqlite3_reset(st);
        sqlite3_bind_int64(st, 1, ctx->runs[r].id);
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            if (ctx->num_coverage == cap) {
                cap = cap ? 2 * cap : 32;
                coverage_row *grown = realloc(ctx->coverage, cap * sizeof *grown);
                if (!grown) {
                    snprintf(err, err_len, "out of memory");
                    sqlite3_finalize(st);
                    return -1;
                }
                ctx->coverage = grown;
            }
            coverage_row *c = &ctx->coverage[ctx->num_coverage++];
            const unsigned char *path = sqlite3_column_text(st, 0);
            c->run = ctx->runs[r].id;
            snprintf(c->path, sizeof c->path, "%s", path ? (const char *)path : "?");
            c->steps = sqlite3_column_int64(st, 1);
            c->layer_steps = sqlite3_column_int64(st, 2);
            c->verified_steps = sqlite3_column_int64(st, 3);
            c->failed_steps = sqlite3_column_int64(st, 4);
        }
    }
    if (rc != SQLITE_DONE) snprintf(err, err_len, "reading coverage: %s", sqlite3_errmsg(db));
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : -1;
}

static void summarize_run(report_ctx *ctx, size_t r)
{
    const ar_run_data *run = &ctx->runs[r];
    run_summary *s = &ctx->summaries[r];
    memset(s, 0, sizeof *s);
    size_t n = run->num_steps ? run->num_steps : 1;
    double *times = malloc(n * sizeof *times), *gbps = malloc(n * sizeof *gbps),
           *tflops = malloc(n * sizeof *tflops);
    size_t nt = 0, ng = 0, nf = 0;
    double total = 0;
    s->nmse_max = s->max_abs_max = NAN;
    for (size_t i = 0; times && gbps && tflops && i < run->num_steps; i++) {
        const ar_step_row *st = &run->steps[i];
        if (positive(st->time_us)) { times[nt++] = st->time_us; total += st->time_us; }
        if (positive(st->gbps)) gbps[ng++] = st->gbps;
        if (positive(st->tflops)) tflops[nf++] = st->tflops;
        if (st->pass != -1) {
            s->verified++;
            if (st->pass == 0) s->failed++;
            if (isfinite(st->nmse) && !(st->nmse <= s->nmse_max)) s->nmse_max = st->nmse;
            if (isfinite(st->max_abs) && !(st->max_abs <= s->max_abs_max)) s->max_abs_max = st->max_abs;
        }
    }
    s->time_median = ar_rd_quantile(times, nt, 0.5);
    s->time_p90 = ar_rd_quantile(times, nt, 0.9);
    s->time_p99 = ar_rd_quantile(times, nt, 0.99);
    s->time_total_ms = nt ? total / 1000.0 : NAN;
    s->gbps_median = ar_rd_quantile(gbps, ng, 0.5);
    s->tflops_median = ar_rd_quantile(tflops, nf, 0.5);
    ar_rd_ceilings(ctx->db, run->device, run->backend, &s->ceilings);
    free(times);
    free(gbps);
    free(tflops);
}

static plot_result *new_plot_result(report_ctx *ctx, const char *name, const char *title)
{
    plot_result *p = &ctx->plots[ctx->num_plots++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->title, sizeof p->title, "%s", title);
    return p;
}

static void render(report_ctx *ctx, plot_result *result, ar_plot *plot)
{
    char err[1024];
    snprintf(plot->name, sizeof plot->name, "%s", result->name);
    snprintf(plot->title, sizeof plot->title, "%s", result->title);
    if (ar_plot_render(ctx->out_dir, plot, err, sizeof err) == 0) {
        result->drawn = true;
    } else {
        fprintf(stderr, "report: %s\n", err);
        snprintf(result->note, sizeof result->note, "rendering failed: %.480s", err);
        ctx->render_failures++;
    }
}

/* Log scale pays off when positive values span more than two decades. */
static bool wide_range(double lo, double hi)
{
    return lo > 0 && hi / lo > 100.0;
}

/* ---- charts from per-step rows -------------------------------------------------------------- */

/* Per-run CSV data/run<ID>.csv: step,num_tokens,total_context,time_us,arith_intensity,tflops. */
static int write_run_csvs(report_ctx *ctx, char *err, size_t err_len)
{
    for (size_t r = 0; r < ctx->num_runs; r++) {
        const ar_run_data *run = &ctx->runs[r];
        char rel[96];
        snprintf(rel, sizeof rel, "data/run%lld.csv", (long long)run->id);
        FILE *f = report_open_out(ctx, rel, err, err_len);
        if (!f) return -1;
        fprintf(f, "# step,num_tokens,total_context,time_us,arith_intensity_flop_per_byte,tflops,"
                   "gbps,nmse,max_abs,pass,cascade,prefix_len,shard\n");
        for (size_t i = 0; i < run->num_steps; i++) {
            const ar_step_row *s = &run->steps[i];
            double intensity = positive(s->flops) && positive(s->bytes) ? s->flops / s->bytes : NAN;
            fprintf(f, "%lld,%lld,%lld,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%d,%d,%lld,%d\n",
                    (long long)s->step, (long long)s->num_tokens, (long long)s->total_context,
                    positive(s->time_us) ? s->time_us : NAN, intensity,
                    positive(s->tflops) ? s->tflops : NAN, positive(s->gbps) ? s->gbps : NAN,
                    s->nmse, s->max_abs, s->pass, s->cascade, (long long)s->prefix_len, s->shard);
        }
        if (fclose(f) != 0) {
            snprintf(err, err_len, "%s/%s: write failed", ctx->out_dir, rel);
            return -1;
        }
    }
    return 0;
}

/* Charts of time_us against a step column for the runs of trace t: x_col is 1 (step),
 * 2 (tokens) or 3 (context). */
static void plot_time_against(report_ctx *ctx, size_t t, const char *name, const char *title,
                              const char *xlabel, int x_col, const char *style)
{
    char chart_name[64], chart_title[200];
    per_trace_names(ctx, t, name, title, chart_name, sizeof chart_name, chart_title, sizeof chart_title);
    plot_result *result = new_plot_result(ctx, chart_name, chart_title);
    ar_plot plot;
    memset(&plot, 0, sizeof plot);
    snprintf(plot.xlabel, sizeof plot.xlabel, "%s", xlabel);
    double xlo = INFINITY, xhi = 0, ylo = INFINITY, yhi = 0;
    for (size_t r = 0; r < ctx->num_runs; r++) {
        const ar_run_data *run = &ctx->runs[r];
        if (ctx->trace_of[r] != (int)t) continue;
        size_t points = 0;
        for (size_t i = 0; i < run->num_steps; i++) {
            const ar_step_row *s = &run->steps[i];
            double x = x_col == 1 ? (double)s->step : x_col == 2 ? (double)s->num_tokens
                                                               : (double)s->total_context;
            if (!positive(s->time_us)) continue;
            points++;
            if (x > 0 && x < xlo) xlo = x;
            if (x > xhi) xhi = x;
            if (s->time_us < ylo) ylo = s->time_us;
            if (s->time_us > yhi) yhi = s->time_us;
        }
        if (!points) continue;
        char label[160], csv[96], cols[16];
        run_label(run, label, sizeof label);
        snprintf(csv, sizeof csv, "data/run%lld.csv", (long long)run->id);
        snprintf(cols, sizeof cols, "%d:4", x_col);
        ar_plot_add(&plot, label, csv, cols, style);
    }
    if (plot.num_series == 0) {
        snprintf(result->note, sizeof result->note, "not drawn: no step has a recorded time");
        return;
    }
    plot.logx = x_col != 1 && wide_range(xlo, xhi);
    plot.logy = wide_range(ylo, yhi);
    /* Times in the unit that reads best: on a log axis seconds with SI prefixes on the tics
     * (100 µs, 10 ms, 1 s), else one unit for the whole axis. */
    double divisor = 1.0;
    const char *unit = "µs";
    if (plot.logy) {
        divisor = 1e6;
        snprintf(plot.yformat, sizeof plot.yformat, "%%.0s %%cs");
        snprintf(plot.ylabel, sizeof plot.ylabel, "kernel time per step, all layers (log scale)");
    } else {
        if (yhi >= 1e6) { divisor = 1e6; unit = "s"; }
        else if (yhi >= 1e3) { divisor = 1e3; unit = "ms"; }
        snprintf(plot.ylabel, sizeof plot.ylabel, "kernel time per step, all layers (%s)", unit);
    }
    for (int i = 0; i < plot.num_series; i++)
        snprintf(plot.series[i].using_cols, sizeof plot.series[i].using_cols, "%d:($4/%g)", x_col, divisor);
    render(ctx, result, &plot);
}

static void group_key(const ar_run_data *run, char *buf, size_t len)
{
    snprintf(buf, len, "%s %s%s%s", run->backend, run->dtype,
             strcmp(run->kv_dtype, run->dtype) && run->kv_dtype[0] ? " kv " : "",
             strcmp(run->kv_dtype, run->dtype) && run->kv_dtype[0] ? run->kv_dtype : "");
}

/* Error ECDFs per backend/dtype group, and the group table. */
static void plot_errors(report_ctx *ctx)
{
    /* Group the runs. */
    int *group_of = calloc(ctx->num_runs ? ctx->num_runs : 1, sizeof *group_of);
    if (!group_of) return;
    for (size_t r = 0; r < ctx->num_runs; r++) {
        char key[128];
        if (report_injected(&ctx->runs[r])) { group_of[r] = -1; continue; }   /* in the faults table */
        group_key(&ctx->runs[r], key, sizeof key);
        size_t g = 0;
        while (g < ctx->num_groups && strcmp(ctx->groups[g].label, key)) g++;
        if (g == ctx->num_groups) {
            if (ctx->num_groups == REPORT_MAX_GROUPS) { group_of[r] = -1; continue; }
            memset(&ctx->groups[g], 0, sizeof ctx->groups[g]);
            snprintf(ctx->groups[g].label, sizeof ctx->groups[g].label, "%s", key);
            ctx->num_groups++;
        }
        group_of[r] = (int)g;
        ctx->groups[g].num_runs++;
    }
    static const char *const metric_names[2] = { "nmse", "max_abs" };
    static const char *const metric_titles[2] = {
        "NMSE distribution per backend and dtype (verified steps)",
        "Max abs error distribution per backend and dtype (verified steps)" };
    static const char *const metric_xlabels[2] = {
        "NMSE = ||out - ref||² / ||ref||² (dimensionless, log scale)",
        "max |out - ref| over the step (output units, log scale)" };
    for (int m = 0; m < 2; m++) {
        char name[64];
        snprintf(name, sizeof name, "errors_%s", metric_names[m]);
        plot_result *result = new_plot_result(ctx, name, metric_titles[m]);
        ar_plot plot;
        memset(&plot, 0, sizeof plot);
        snprintf(plot.xlabel, sizeof plot.xlabel, "%s", metric_xlabels[m]);
        snprintf(plot.ylabel, sizeof plot.ylabel, "fraction of verified steps ≤ x (ECDF)");
        plot.logx = true;
        snprintf(plot.xformat, sizeof plot.xformat, "%%.0te%%T");   /* 1e-6, not 0.0000010 */
        plot.ymin = 0;
        plot.ymax = 1.02;
        size_t zero_total = 0;
        for (size_t g = 0; g < ctx->num_groups; g++) {
            error_group *grp = &ctx->groups[g];
            size_t cap = 0;
            for (size_t r = 0; r < ctx->num_runs; r++)
                if (group_of[r] == (int)g) cap += ctx->runs[r].num_steps;
            double *values = malloc((cap ? cap : 1) * sizeof *values);
            if (!values) continue;
            size_t n = 0, zeros = 0, verified = 0, failed = 0;
            for (size_t r = 0; r < ctx->num_runs; r++) {
                if (group_of[r] != (int)g) continue;
                for (size_t i = 0; i < ctx->runs[r].num_steps; i++) {
                    const ar_step_row *s = &ctx->runs[r].steps[i];
                    if (s->pass == -1) continue;
                    verified++;
                    failed += s->pass == 0;
                    double v = m == 0 ? s->nmse : s->max_abs;
                    if (!isfinite(v)) continue;
                    if (v <= 0) { zeros++; continue; }
                    values[n++] = v;
                }
            }
            double vmax = n ? 0 : NAN;
            for (size_t i = 0; i < n; i++) if (values[i] > vmax) vmax = values[i];
            if (m == 0) {
                grp->verified = verified;
                grp->failed = failed;
                grp->exact_zero = zeros;
                grp->nmse_median = ar_rd_quantile(values, n, 0.5);
                grp->nmse_p99 = ar_rd_quantile(values, n, 0.99);
                grp->nmse_max = vmax;
            } else {
                grp->abs_median = ar_rd_quantile(values, n, 0.5);
                grp->abs_max = vmax;
            }
            zero_total += zeros;
            if (n) {
                ar_rd_quantile(values, n, 0.5); /* sorts */
                char rel[96];
                snprintf(rel, sizeof rel, "data/%s_group%zu.csv", metric_names[m], g);
                char err[512];
                FILE *f = report_open_out(ctx, rel, err, sizeof err);
                if (f) {
                    fprintf(f, "# %s,fraction_of_verified_steps\n", metric_names[m]);
                    /* Zeros sit left of the log axis; the fraction still counts them. */
                    for (size_t i = 0; i < n; i++)
                        fprintf(f, "%.6g,%.6g\n", values[i],
                                (double)(zeros + i + 1) / (double)(n + zeros));
                    if (fclose(f) == 0) {
                        char label[200];
                        snprintf(label, sizeof label, "%s (%zu steps)", grp->label, n + zeros);
                        ar_plot_add(&plot, label, rel, "1:2", "steps lw 2");
                    }
                } else {
                    fprintf(stderr, "report: %s\n", err);
                }
            }
            free(values);
        }
        char faults[160] = "";
        if (ctx->num_faults)
            snprintf(faults, sizeof faults, "%s%zu run(s) with a planted fault are left out (table \"Planted faults\")",
                     zero_total ? "; " : "", ctx->num_faults);
        if (plot.num_series == 0) {
            snprintf(result->note, sizeof result->note,
                     "not drawn: no verified step with a positive %s%s%s", metric_names[m],
                     ctx->num_faults ? " outside the runs with a planted fault" : "", "");
            continue;
        }
        if (zero_total)
            snprintf(result->note, sizeof result->note,
                     "%zu verified steps with exactly zero error sit left of the log axis "
                     "(each curve starts at their fraction)", zero_total);
        size_t used = strlen(result->note);
        snprintf(result->note + used, sizeof result->note - used, "%s", faults);
        render(ctx, result, &plot);
    }
    free(group_of);
}

/* Achieved TFLOP/s against arithmetic intensity under each device's roofline, runs of trace t. */
static void plot_roofline(report_ctx *ctx, size_t t)
{
    char chart_name[64], chart_title[200];
    per_trace_names(ctx, t, "roofline", "Roofline: achieved TFLOP/s against arithmetic intensity", chart_name,
                    sizeof chart_name, chart_title, sizeof chart_title);
    plot_result *result = new_plot_result(ctx, chart_name, chart_title);
    ar_plot plot;
    memset(&plot, 0, sizeof plot);
    snprintf(plot.xlabel, sizeof plot.xlabel, "arithmetic intensity (FLOP/byte)");
    snprintf(plot.ylabel, sizeof plot.ylabel, "achieved TFLOP/s");
    plot.logx = plot.logy = true;
    double xlo = INFINITY, xhi = 0, ylo = INFINITY, yhi = 0;
    for (size_t r = 0; r < ctx->num_runs; r++) {
        const ar_run_data *run = &ctx->runs[r];
        if (ctx->trace_of[r] != (int)t) continue;
        size_t points = 0;
        for (size_t i = 0; i < run->num_steps; i++) {
            const ar_step_row *s = &run->steps[i];
            if (!positive(s->flops) || !positive(s->bytes) || !positive(s->tflops)) continue;
            double x = s->flops / s->bytes;
            points++;
            if (x < xlo) xlo = x;
            if (x > xhi) xhi = x;
            if (s->tflops < ylo) ylo = s->tflops;
            if (s->tflops > yhi) yhi = s->tflops;
        }
        if (!points) continue;
        char label[160], csv[96];
        run_label(run, label, sizeof label);
        snprintf(csv, sizeof csv, "data/run%lld.csv", (long long)run->id);
        ar_plot_add(&plot, label, csv, "5:6", "points pt 7 ps 0.6");
    }
    if (plot.num_series == 0) {
        snprintf(result->note, sizeof result->note,
                 "not drawn: no step records FLOPs, bytes and TFLOP/s");
        return;
    }
    /* One roof per distinct ceiling among the runs drawn. */
    ar_ceilings seen[REPORT_MAX_DEVICES];
    double roof_low[REPORT_MAX_DEVICES];
    size_t num_seen = 0;
    for (size_t r = 0; r < ctx->num_runs && num_seen < REPORT_MAX_DEVICES; r++) {
        if (ctx->trace_of[r] != (int)t) continue;
        const ar_ceilings *c = &ctx->summaries[r].ceilings;
        bool dup = false;
        for (size_t k = 0; k < num_seen; k++)
            dup |= seen[k].copy_gbps == c->copy_gbps && seen[k].bf16_tflops == c->bf16_tflops;
        if (dup) continue;
        seen[num_seen++] = *c;
        char function[256], title[200];
        double tflops_per_intensity = c->copy_gbps / 1000.0;
        snprintf(function, sizeof function, "(x*%.9g < %.9g ? x*%.9g : %.9g)",
                 tflops_per_intensity, c->bf16_tflops, tflops_per_intensity, c->bf16_tflops);
        snprintf(title, sizeof title, "roof %s: %.4g TB/s, %.4g TFLOP/s (%s)",
                 ctx->runs[r].device, c->copy_gbps / 1000.0, c->bf16_tflops,
                 strstr(c->source, "measured by") ? "calibrated"
                 : strstr(c->source, "guess") ? "guess" : "default");
        static const char *const roof_colors[] = { "#222222", "#b22222", "#1f4e9c", "#2e7d32" };
        char style[96];
        snprintf(style, sizeof style, "lines lw 2 dt 2 lc rgb '%s'", roof_colors[(num_seen - 1) % 4]);
        ar_plot_add_function(&plot, title, function, style);
        double ridge = c->bf16_tflops / tflops_per_intensity;
        if (ridge * 4 > xhi) xhi = ridge * 4;
        if (c->bf16_tflops > yhi) yhi = c->bf16_tflops;
        roof_low[num_seen - 1] = tflops_per_intensity;   /* the roof at intensity 1 */
    }
    plot.xmin = xlo / 3;
    plot.xmax = xhi * 3;
    /* Show every roof where the data starts, so a slow device's roof is not cut off. */
    for (size_t k = 0; k < num_seen; k++) {
        double at_left = roof_low[k] * plot.xmin;
        if (at_left < seen[k].bf16_tflops && at_left < ylo) ylo = at_left;
    }
    plot.ymin = ylo / 3;
    plot.ymax = yhi * 3;
    snprintf(result->note, sizeof result->note,
             "dashed lines: min(intensity x copy bandwidth, bf16 matrix rate) per device; "
             "ceilings and their source are in the table \"Device ceilings used\"");
    render(ctx, result, &plot);
}

/* ---- cascade speedup ------------------------------------------------------------------------ */

/* Counts steps where cascade ran in c and not in b, at the same step number. */
static size_t cascade_overlap(const ar_run_data *c, const ar_run_data *b)
{
    size_t n = 0, ib = 0;
    for (size_t ic = 0; ic < c->num_steps; ic++) {
        const ar_step_row *sc = &c->steps[ic];
        while (ib < b->num_steps && b->steps[ib].step < sc->step) ib++;
        if (ib < b->num_steps && b->steps[ib].step == sc->step && sc->cascade &&
            !b->steps[ib].cascade && positive(sc->time_us) && positive(b->steps[ib].time_us))
            n++;
    }
    return n;
}

/* Finds the best non-cascade partner of run c among all runs of the database: same trace,
 * dtypes, device and layers; most comparable steps, then same backend, then lowest id. */
static int find_cascade_baseline(report_ctx *ctx, const ar_run_data *c, ar_run_data *best)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2((sqlite3 *)ctx->db,
            "SELECT id FROM runs WHERE id != ? AND (trace_hash = ? OR (trace_hash = '' AND trace = ?)) "
            "AND dtype = ? AND kv_dtype = ? AND device = ? AND layers = ? ORDER BY id",
            -1, &st, NULL) != SQLITE_OK)
        return -1;
    sqlite3_bind_int64(st, 1, c->id);
    sqlite3_bind_text(st, 2, c->trace_hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, c->trace, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, c->dtype, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 5, c->kv_dtype, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, c->device, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 7, c->layers);
    size_t best_count = 0;
    bool best_same_backend = false;
    memset(best, 0, sizeof *best);
    while (sqlite3_step(st) == SQLITE_ROW) {
        ar_run_data candidate;
        char err[256];
        if (ar_rd_load_run(ctx->db, sqlite3_column_int64(st, 0), &candidate, err, sizeof err) != 0)
            continue;
        size_t count = cascade_overlap(c, &candidate);
        bool same_backend = strcmp(candidate.backend, c->backend) == 0;
        if (count > best_count || (count == best_count && count && same_backend && !best_same_backend)) {
            ar_rd_free_run(best);
            *best = candidate;
            best_count = count;
            best_same_backend = same_backend;
        } else {
            ar_rd_free_run(&candidate);
        }
    }
    sqlite3_finalize(st);
    return best_count ? 0 : -1;
}

static void plot_cascade(report_ctx *ctx)
{
    plot_result *result = new_plot_result(ctx, "cascade_speedup",
        "Cascade speedup against shared prefix length");
    size_t cascade_runs = 0;
    for (size_t r = 0; r < ctx->num_runs; r++)
        for (size_t i = 0; i < ctx->runs[r].num_steps; i++)
            if (ctx->runs[r].steps[i].cascade) { cascade_runs++; break; }
    if (!cascade_runs) {
        snprintf(result->note, sizeof result->note,
                 "not drawn: no selected run took the cascade path");
        return;
    }
    ctx->cascades = calloc(cascade_runs, sizeof *ctx->cascades);
    if (!ctx->cascades) return;
    ar_plot plot;
    memset(&plot, 0, sizeof plot);
    snprintf(plot.xlabel, sizeof plot.xlabel, "shared prefix length (tokens)");
    snprintf(plot.ylabel, sizeof plot.ylabel, "speedup = non-cascade time / cascade time (x)");
    double xlo = INFINITY, xhi = 0;
    for (size_t r = 0; r < ctx->num_runs; r++) {
        const ar_run_data *c = &ctx->runs[r];
        bool has_cascade = false;
        for (size_t i = 0; i < c->num_steps && !has_cascade; i++) has_cascade = c->steps[i].cascade;
        if (!has_cascade) continue;
        ar_run_data base;
        if (find_cascade_baseline(ctx, c, &base) != 0) continue;
        cascade_pair *pair = &ctx->cascades[ctx->num_cascades];
        memset(pair, 0, sizeof *pair);
        pair->cascade_run = c->id;
        pair->baseline_run = base.id;
        char rel[96], err[512];
        snprintf(rel, sizeof rel, "data/cascade_run%lld.csv", (long long)c->id);
        FILE *f = report_open_out(ctx, rel, err, sizeof err);
        double *speedups = malloc((c->num_steps ? c->num_steps : 1) * sizeof *speedups);
        if (f && speedups) {
            fprintf(f, "# prefix_len,speedup,step,cascade_time_us,baseline_time_us\n");
            size_t ib = 0;
            pair->prefix_min = INT64_MAX;
            for (size_t ic = 0; ic < c->num_steps; ic++) {
                const ar_step_row *sc = &c->steps[ic];
                while (ib < base.num_steps && base.steps[ib].step < sc->step) ib++;
                if (ib >= base.num_steps || base.steps[ib].step != sc->step) continue;
                const ar_step_row *sb = &base.steps[ib];
                if (!sc->cascade || sb->cascade || !positive(sc->time_us) || !positive(sb->time_us))
                    continue;
                double speedup = sb->time_us / sc->time_us;
                speedups[pair->steps++] = speedup;
                if (sc->prefix_len < pair->prefix_min) pair->prefix_min = sc->prefix_len;
                if (sc->prefix_len > pair->prefix_max) pair->prefix_max = sc->prefix_len;
                if (sc->prefix_len > 0 && (double)sc->prefix_len < xlo) xlo = (double)sc->prefix_len;
                if ((double)sc->prefix_len > xhi) xhi = (double)sc->prefix_len;
                fprintf(f, "%lld,%.6g,%lld,%.6g,%.6g\n", (long long)sc->prefix_len, speedup,
                        (long long)sc->step, sc->time_us, sb->time_us);
            }
        }
        if (f && fclose(f) == 0 && speedups && pair->steps) {
            pair->speedup_median = ar_rd_quantile(speedups, pair->steps, 0.5);
            pair->speedup_min = speedups[0];
            pair->speedup_max = speedups[pair->steps - 1];
            char label[200];
            snprintf(label, sizeof label, "run %lld (%s) vs run %lld (%s)", (long long)c->id,
                     c->backend, (long long)base.id, base.backend);
            ar_plot_add(&plot, label, rel, "1:2", "points pt 7 ps 0.8");
            ctx->num_cascades++;
        } else if (!f) {
            fprintf(stderr, "report: %s\n", err);
        }
        free(speedups);
        ar_rd_free_run(&base);
    }
    if (plot.num_series == 0) {
        snprintf(result->note, sizeof result->note,
                 "not drawn: cascade ran, but no non-cascade run of the same trace, dtype and "
                 "device is in the database to compare against (replay again with --cascade off)");
        return;
    }
    ar_plot_add_function(&plot, "no speedup (1x)", "1", "lines lw 1 dt 3 lc rgb '#777777'");
    plot.logx = wide_range(xlo, xhi);
    /* From zero, so the 1x line and slowdowns below it show. */
    double top = 1.0;
    for (size_t k = 0; k < ctx->num_cascades; k++)
        if (ctx->cascades[k].speedup_max > top) top = ctx->cascades[k].speedup_max;
    plot.ymin = 0;
    plot.ymax = top * 1.15;
    render(ctx, result, &plot);
}

/* The failing steps of every run (at most REPORT_MAX_FAILING_PER_RUN each) and the shards of the
 * merged runs, from the database's shards table. */
static void collect_shards_and_failures(report_ctx *ctx)
{
    ctx->failing = calloc(REPORT_MAX_FAILING, sizeof *ctx->failing);
    ctx->shards = calloc(REPORT_MAX_SHARD_ROWS, sizeof *ctx->shards);
    for (size_t r = 0; r < ctx->num_runs; r++) {
        const ar_run_data *run = &ctx->runs[r];
        size_t listed = 0;
        for (size_t i = 0; ctx->failing && i < run->num_steps; i++) {
            if (run->steps[i].pass != 0) continue;
            if (listed < REPORT_MAX_FAILING_PER_RUN && ctx->num_failing < REPORT_MAX_FAILING) {
                ctx->failing[ctx->num_failing++] = (failing_step){ r, &run->steps[i] };
                listed++;
            } else {
                ctx->failing_left_out++;
            }
        }
        if (!ctx->shards || run->merged_shards < 0) continue;
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2((sqlite3 *)ctx->db,
                "SELECT shard, host, device, launcher, status, step_first, step_last, layer_first, layer_last,"
                " steps_done, steps_failed, wall_s FROM shards WHERE run = ? ORDER BY shard", -1, &st, NULL) != SQLITE_OK)
            continue;   /* no manifest in this database */
        sqlite3_bind_int64(st, 1, run->id);
        while (sqlite3_step(st) == SQLITE_ROW && ctx->num_shards < REPORT_MAX_SHARD_ROWS) {
            shard_row *row = &ctx->shards[ctx->num_shards++];
            row->run_row = r;
            row->shard = sqlite3_column_int64(st, 0);
            const char *texts[4];
            for (int k = 0; k < 4; k++) {
                const unsigned char *t = sqlite3_column_text(st, 1 + k);
                texts[k] = t ? (const char *)t : "";
            }
            snprintf(row->host, sizeof row->host, "%s", texts[0]);
            snprintf(row->device, sizeof row->device, "%s", texts[1]);
            snprintf(row->launcher, sizeof row->launcher, "%s", texts[2]);
            snprintf(row->status, sizeof row->status, "%s", texts[3]);
            long long first = sqlite3_column_int64(st, 5), last = sqlite3_column_int64(st, 6);
            if (last < 0 && run->shard_count == 1) snprintf(row->steps, sizeof row->steps, "%lld..end", first);
            else if (first <= last) snprintf(row->steps, sizeof row->steps, "%lld..%lld", first, last);
            else snprintf(row->steps, sizeof row->steps, "none");
            snprintf(row->layers, sizeof row->layers, "%lld..%lld", (long long)sqlite3_column_int64(st, 7),
                     (long long)sqlite3_column_int64(st, 8));
            row->steps_done = sqlite3_column_int64(st, 9);
            row->steps_failed = sqlite3_column_int64(st, 10);
            row->wall_s = sqlite3_column_type(st, 11) == SQLITE_NULL ? NAN : sqlite3_column_double(st, 11);
            size_t at = 0, named = 0, more = 0;
            for (size_t i = 0; i < run->num_steps; i++) {
                const ar_step_row *step = &run->steps[i];
                if (step->pass != 0 || step->shard != row->shard) continue;
                if (named < 8 && at < sizeof row->failing)
                    at += (size_t)snprintf(row->failing + at, sizeof row->failing - at, "%s%lld", named ? ", " : "",
                                           (long long)step->step);
                else more++;
                named++;
            }
            if (more && at < sizeof row->failing)
                snprintf(row->failing + at, sizeof row->failing - at, " (+%zu more)", more);
        }
        sqlite3_finalize(st);
    }
}

/* ---- command line ------------------------------------------------------------------------------ */

static void report_usage(FILE *f)
{
    fputs("usage: attnreplay report DB [--run ID ...] --out DIR\n"
          "  Renders plots (PNG + SVG through gnuplot), index.html and summary.md into DIR from\n"
          "  the runs in DB (all runs unless --run is given; --run may repeat or take 1,2,3).\n"
          "  Exit status: 0 done, 1 a plot failed to render, 2 usage error or bad input (DB missing, a\n"
          "  directory, not an attnreplay results database, of a newer schema version, or locked by\n"
          "  another writer past ATTNREPLAY_BUSY_TIMEOUT_MS, default 30000), 3 the summary line could\n"
          "  not be written to stdout (DIR is written; a 1 or 2 stays, said on stderr too).\n", f);
}

static void free_ctx(report_ctx *ctx)
{
    for (size_t r = 0; r < ctx->num_runs; r++) ar_rd_free_run(&ctx->runs[r]);
    free(ctx->runs);
    free(ctx->summaries);
    free(ctx->cascades);
    free(ctx->trace_of);
    free(ctx->fault_rows);
    free(ctx->coverage);
    free(ctx->shards);
    free(ctx->failing);
    if (ctx->db) ar_rd_close(ctx->db);
}

/* Appends the ids in "1,2,3" to ids. */
static int add_run_ids(const char *text, int64_t **ids, size_t *count)
{
    char *copy = strdup(text);
    if (!copy) return -1;
    int rc = 0;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int64_t id;
        int64_t *grown = realloc(*ids, (*count + 1) * sizeof **ids);
        if (ar_rd_parse_run_id(tok, &id) != 0 || !grown) {
            if (grown) *ids = grown;
            rc = -1;
            break;
        }
        *ids = grown;
        (*ids)[(*count)++] = id;
    }
    if (*count == 0) rc = -1;
    free(copy);
    return rc;
}

int ar_report_main(int argc, char **argv)
{
    char out_dir[4096];
    report_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    int64_t *ids = NULL;
    size_t num_ids = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            report_usage(stdout);
            free(ids);
            return 0;
        } else if (!strcmp(arg, "--run") || !strcmp(arg, "--out")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "report: %s needs a value\n", arg);
                free(ids);
                return 2;
            }
            const char *value = argv[++i];
            if (!strcmp(arg, "--out")) {
                ar_rd_dir_name(value, out_dir, sizeof out_dir);
                ctx.out_dir = out_dir;
            } else if (add_run_ids(value, &ids, &num_ids) != 0) {
                fprintf(stderr, "report: --run '%s': expected run ids like 3 or 1,2\n", value);
                free(ids);
                return 2;
            }
        } else if (arg[0] == '-' && arg[1]) {
            fprintf(stderr, "report: unknown option '%s'\n", arg);
            report_usage(stderr);
            free(ids);
            return 2;
        } else if (!ctx.db_path) {
            ctx.db_path = arg;
        } else {
            fprintf(stderr, "report: unexpected argument '%s'\n", arg);
            report_usage(stderr);
            free(ids);
            return 2;
        }
    }
    if (!ctx.db_path || !ctx.out_dir || !*ctx.out_dir) {
        report_usage(stderr);
        free(ids);
        return 2;
    }
    char err[1024];
    ctx.db = ar_rd_open(ctx.db_path, err, sizeof err);
    if (!ctx.db) {
        fprintf(stderr, "report: %s\n", err);
        free(ids);
        return 2;
    }
    if (num_ids == 0 && ar_rd_list_runs(ctx.db, &ids, &num_ids, err, sizeof err) != 0) {
        fprintf(stderr, "report: %s: %s\n", ctx.db_path, err);
        free_ctx(&ctx);
        return 2;
    }
    if (num_ids == 0) {
        fprintf(stderr, "report: %s: the database holds no runs\n", ctx.db_path);
        free_ctx(&ctx);
        free(ids);
        return 2;
    }
    ctx.runs = calloc(num_ids, sizeof *ctx.runs);
    ctx.summaries = calloc(num_ids, sizeof *ctx.summaries);
    ctx.trace_of = calloc(num_ids, sizeof *ctx.trace_of);
    ctx.fault_rows = calloc(num_ids, sizeof *ctx.fault_rows);
    if (!ctx.runs || !ctx.summaries || !ctx.trace_of || !ctx.fault_rows) {
        fprintf(stderr, "report: out of memory\n");
        free_ctx(&ctx);
        free(ids);
        return 2;
    }
    for (size_t i = 0; i < num_ids; i++) {
        bool repeated = false;
        for (size_t k = 0; k < ctx.num_runs; k++) repeated |= ctx.runs[k].id == ids[i];
        if (repeated) continue;
        if (ar_rd_load_run(ctx.db, ids[i], &ctx.runs[ctx.num_runs], err, sizeof err) != 0) {
            fprintf(stderr, "report: %s: %s\n", ctx.db_path, err);
            free_ctx(&ctx);
            free(ids);
            return 2;
        }
        ctx.num_runs++;
    }
    free(ids);

    char data_dir[4200];
    snprintf(data_dir, sizeof data_dir, "%s/data", ctx.out_dir);
    if (ar_output_dir_prepare(ctx.out_dir, err, sizeof err) != 0 ||
        ar_output_dir_prepare(data_dir, err, sizeof err) != 0 || write_run_csvs(&ctx, err, sizeof err) != 0 ||
        load_coverage(&ctx, err, sizeof err) != 0) {
        fprintf(stderr, "report: %s\n", err);
        free_ctx(&ctx);
        return 2;
    }
    for (size_t r = 0; r < ctx.num_runs; r++) {
        /* one set of per-run charts per trace (same hash, or the same path without one) */
        const ar_run_data *run = &ctx.runs[r];
        ctx.trace_of[r] = -1;
        for (size_t t = 0; t < ctx.num_traces && ctx.trace_of[r] < 0; t++) {
            const ar_run_data *first = &ctx.runs[ctx.trace_rows[t]];
            bool same = run->trace_hash[0] && first->trace_hash[0] ? !strcmp(run->trace_hash, first->trace_hash)
                                                                   : !strcmp(run->trace, first->trace);
            if (same) ctx.trace_of[r] = (int)t;
        }
        if (ctx.trace_of[r] < 0) {
            if (ctx.num_traces < REPORT_MAX_TRACES) {
                ctx.trace_rows[ctx.num_traces] = r;
                ctx.trace_of[r] = (int)ctx.num_traces++;
            } else {
                ctx.traces_left_out++;
            }
        }
        if (report_injected(run)) ctx.fault_rows[ctx.num_faults++] = r;
        summarize_run(&ctx, r);
        bool known = false;
        for (size_t k = 0; k < ctx.num_devices; k++)
            known |= strcmp(ctx.runs[ctx.device_rows[k]].device, ctx.runs[r].device) == 0;
        if (!known && ctx.num_devices < REPORT_MAX_DEVICES) ctx.device_rows[ctx.num_devices++] = r;
    }

    collect_shards_and_failures(&ctx);
    if (!ar_plot_have_gnuplot())
        fprintf(stderr, "report: gnuplot is not on PATH (install gnuplot-nox); tables only\n");
    for (size_t t = 0; t < ctx.num_traces; t++) {
        plot_time_against(&ctx, t, "step_time", "Per-step kernel time over the run", "step (index in the trace)",
                          1, "linespoints lw 1.5 pt 7 ps 0.4");
        plot_time_against(&ctx, t, "time_vs_tokens", "Kernel time against batch tokens",
                          "batch tokens scheduled in the step (tokens)", 2, "points pt 7 ps 0.6");
        plot_time_against(&ctx, t, "time_vs_context", "Kernel time against total context",
                          "total context = sum of sequence lengths in the batch (tokens)", 3,
                          "points pt 7 ps 0.6");
    }
    plot_errors(&ctx);
    for (size_t t = 0; t < ctx.num_traces; t++) plot_roofline(&ctx, t);
    plot_cascade(&ctx);
    if (ctx.traces_left_out) {
        plot_result *p = new_plot_result(&ctx, "more_traces", "Charts of further traces");
        snprintf(p->note, sizeof p->note, "not drawn: the runs replay %zu more traces than the %d a report charts; "
                 "select runs with --run", ctx.traces_left_out, REPORT_MAX_TRACES);
    }

    if (report_write_html(&ctx, err, sizeof err) != 0 || report_write_markdown(&ctx, err, sizeof err) != 0) {
        fprintf(stderr, "report: %s\n", err);
        free_ctx(&ctx);
        return 2;
    }
    size_t drawn = 0;
    for (size_t i = 0; i < ctx.num_plots; i++) drawn += ctx.plots[i].drawn;
    printf("report: %zu run(s), %zu plot(s) drawn, %zu left out -> %s/index.html, %s/summary.md\n",
           ctx.num_runs, drawn, ctx.num_plots - drawn, ctx.out_dir, ctx.out_dir);
    int failures = ctx.render_failures;
    free_ctx(&ctx);
    return failures ? 1 : 0;
}
