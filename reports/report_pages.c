/* report_pages.c - the pages of `attnreplay report` (report.c collects the runs, report_ctx.h):
 * DIR/index.html (the plots and every table, no network needed) and DIR/summary.md (the same
 * tables as Markdown): runs, faults, errors, device ceilings, shards, failing steps, cascade
 * speedups, per-run coverage, and what an unfinished run still lacks. */
#include "report_ctx.h"
#include "../sim/sim.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void html_text(FILE *f, const char *text)
{
    for (const char *p = text; *p; p++) {
        switch (*p) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*p, f);
        }
    }
}

static void md_text(FILE *f, const char *text)
{
    for (const char *p = text; *p; p++) {
        if (*p == '|') fputs("\\|", f);
        else if (*p == '\n') fputc(' ', f);
        else fputc(*p, f);
    }
}

/* Formats a number for a table cell; "-" for a missing one. */
static const char *num(char *buf, size_t len, double v, char style, int precision)
{
    if (!isfinite(v)) snprintf(buf, len, "-");
    else if (style == 'f') snprintf(buf, len, "%.*f", precision, v);
    else snprintf(buf, len, "%.*g", precision, v);
    return buf;
}

/* Three significant digits without an exponent for everyday sizes: 3870, 45.2, 0.00421. */
static const char *sig3(char *buf, size_t len, double v)
{
    if (!isfinite(v)) snprintf(buf, len, "-");
    else if (fabs(v) >= 100) snprintf(buf, len, "%.0f", v);
    else if (fabs(v) >= 10) snprintf(buf, len, "%.1f", v);
    else snprintf(buf, len, "%.3g", v);
    return buf;
}

/* A duration given in microseconds, in the unit that reads best: 850.2 µs, 12.40 ms, 123.78 s. */
static const char *duration_us(char *buf, size_t len, double us)
{
    if (!isfinite(us)) snprintf(buf, len, "-");
    else if (us < 1e3) snprintf(buf, len, "%.1f µs", us);
    else if (us < 1e6) snprintf(buf, len, "%.2f ms", us / 1e3);
    else snprintf(buf, len, "%.2f s", us / 1e6);
    return buf;
}

/* "value (percent of ceiling)" with the significant digits each needs. */
static void with_fraction(char *buf, size_t len, double value, double ceiling)
{
    char a[32], b[32];
    if (!isfinite(value)) {
        snprintf(buf, len, "-");
        return;
    }
    double pct = ceiling > 0 ? 100.0 * value / ceiling : NAN;
    if (pct >= 10 || !isfinite(pct)) snprintf(b, sizeof b, "%.0f", pct);
    else snprintf(b, sizeof b, "%.2g", pct);
    snprintf(buf, len, "%s (%s%%)", sig3(a, sizeof a, value), b);
}

enum { TABLE_RUNS, TABLE_ERRORS, TABLE_CEILINGS, TABLE_CASCADE, TABLE_FAULTS, TABLE_SHARDS, TABLE_FAILING, NUM_TABLES };

/* Writes one table as HTML (html true) or Markdown.  Cells come from table_cell. */
typedef struct {
    const char *title;
    const char *const *headers;
    int num_cols;
    size_t num_rows;
} table_shape;

static void table_cell(const report_ctx *ctx, int table, size_t row, int col, char *buf, size_t len)
{
    char a[64];
    buf[0] = 0;
    if (table == TABLE_RUNS) {
        const ar_run_data *run = &ctx->runs[row];
        const run_summary *s = &ctx->summaries[row];
        switch (col) {
        case 0: snprintf(buf, len, "%lld", (long long)run->id); break;
        case 1: snprintf(buf, len, "%s", run->trace); break;
        case 2: snprintf(buf, len, "%s", run->backend); break;
        case 3: snprintf(buf, len, "%s", run->device); break;
        case 4: snprintf(buf, len, "%s / %s", run->dtype, run->kv_dtype); break;
        case 5: snprintf(buf, len, "%s", run->cascade_mode); break;
        case 6: snprintf(buf, len, "%s", report_injected(run) ? run->inject : "none"); break;
        case 7: snprintf(buf, len, "%s", run->verify[0] ? run->verify : "-"); break;
        case 8:
            if (run->error[0]) snprintf(buf, len, "%s: %.160s%s", run->status, run->error,
                                        strlen(run->error) > 160 ? "..." : "");
            else snprintf(buf, len, "%s", run->status);
            break;
        case 9: snprintf(buf, len, "%zu", run->num_steps); break;
        case 10:
            if (run->merged_shards >= 0)
                snprintf(buf, len, "%lld of %lld merged (split by %s)", (long long)run->merged_shards,
                         (long long)run->shard_count, run->shard_by);
            else if (run->shard_count > 1)
                snprintf(buf, len, "shard %lld/%lld", (long long)run->shard_index, (long long)run->shard_count);
            else
                snprintf(buf, len, "-");
            break;
        case 11: snprintf(buf, len, "%zu / %zu", s->verified - s->failed, s->verified); break;
        case 12: snprintf(buf, len, "%s", duration_us(a, sizeof a, s->time_median)); break;
        case 13: snprintf(buf, len, "%s", duration_us(a, sizeof a, s->time_p90)); break;
        case 14: snprintf(buf, len, "%s", duration_us(a, sizeof a, s->time_p99)); break;
        case 15: snprintf(buf, len, "%s", duration_us(a, sizeof a, s->time_total_ms * 1e3)); break;
        case 16: with_fraction(buf, len, s->gbps_median, s->ceilings.copy_gbps); break;
        case 17: with_fraction(buf, len, s->tflops_median, s->ceilings.bf16_tflops); break;
        case 18: snprintf(buf, len, "%s", num(a, sizeof a, s->nmse_max, 'g', 3)); break;
        case 19: snprintf(buf, len, "%s", num(a, sizeof a, s->max_abs_max, 'g', 3)); break;
        }
    } else if (table == TABLE_ERRORS) {
        const error_group *g = &ctx->groups[row];
        switch (col) {
        case 0: snprintf(buf, len, "%s", g->label); break;
        case 1: snprintf(buf, len, "%zu", g->num_runs); break;
        case 2: snprintf(buf, len, "%zu", g->verified); break;
        case 3: snprintf(buf, len, "%zu", g->failed); break;
        case 4: snprintf(buf, len, "%s", num(a, sizeof a, g->nmse_median, 'g', 3)); break;
        case 5: snprintf(buf, len, "%s", num(a, sizeof a, g->nmse_p99, 'g', 3)); break;
        case 6: snprintf(buf, len, "%s", num(a, sizeof a, g->nmse_max, 'g', 3)); break;
        case 7: snprintf(buf, len, "%s", num(a, sizeof a, g->abs_median, 'g', 3)); break;
        case 8: snprintf(buf, len, "%s", num(a, sizeof a, g->abs_max, 'g', 3)); break;
        }
    } else if (table == TABLE_CEILINGS) {
        const ar_run_data *run = &ctx->runs[ctx->device_rows[row]];
        const ar_ceilings *c = &ctx->summaries[ctx->device_rows[row]].ceilings;
        switch (col) {
        case 0: snprintf(buf, len, "%s", run->device); break;
        case 1: snprintf(buf, len, "%.0f", c->copy_gbps); break;
        case 2: snprintf(buf, len, "%.0f", c->bf16_tflops); break;
        case 3: snprintf(buf, len, "%s", c->source); break;
        }
    } else if (table == TABLE_FAULTS) {
        size_t r = ctx->fault_rows[row];
        const ar_run_data *run = &ctx->runs[r];
        const run_summary *s = &ctx->summaries[r];
        char trace[128];
        report_trace_short_name(run->trace, trace, sizeof trace);
        switch (col) {
        case 0: snprintf(buf, len, "%lld", (long long)run->id); break;
        case 1: snprintf(buf, len, "%s", run->inject); break;
        case 2: snprintf(buf, len, "%s", run->backend); break;
        case 3: snprintf(buf, len, "%s", trace); break;
        case 4: snprintf(buf, len, "%zu", s->verified); break;
        case 5: snprintf(buf, len, "%zu", s->failed); break;
        case 6:
            if (s->verified == 0) snprintf(buf, len, "not checked: no step verified");
            else if (s->failed) snprintf(buf, len, "caught");
            else snprintf(buf, len, "NOT caught: every verified step passed");
            break;
        }
    } else if (table == TABLE_SHARDS) {
        const shard_row *r = &ctx->shards[row];
        const ar_run_data *run = &ctx->runs[r->run_row];
        switch (col) {
        case 0: snprintf(buf, len, "%lld", (long long)run->id); break;
        case 1: snprintf(buf, len, "%lld/%lld", (long long)r->shard, (long long)run->shard_count); break;
        case 2: snprintf(buf, len, "%s", r->host); break;
        case 3: snprintf(buf, len, "%s", r->device); break;
        case 4: snprintf(buf, len, "%s", r->launcher); break;
        case 5: snprintf(buf, len, "%s", r->steps); break;
        case 6: snprintf(buf, len, "%s", r->layers); break;
        case 7: snprintf(buf, len, "%s", r->status); break;
        case 8: snprintf(buf, len, "%lld", (long long)r->steps_done); break;
        case 9: snprintf(buf, len, "%lld", (long long)r->steps_failed); break;
        case 10: snprintf(buf, len, "%s", r->failing[0] ? r->failing : "-"); break;
        case 11: snprintf(buf, len, "%s", num(a, sizeof a, r->wall_s, 'f', 2)); break;
        }
    } else if (table == TABLE_FAILING) {
        const failing_step *f = &ctx->failing[row];
        const ar_run_data *run = &ctx->runs[f->run_row];
        switch (col) {
        case 0: snprintf(buf, len, "%lld", (long long)run->id); break;
        case 1: snprintf(buf, len, "%lld", (long long)f->step->step); break;
        case 2:
            if (run->shard_count <= 1) snprintf(buf, len, "-");
            else if (f->step->shard < 0) snprintf(buf, len, "all (layer split)");
            else snprintf(buf, len, "%d/%lld", f->step->shard, (long long)run->shard_count);
            break;
        case 3: snprintf(buf, len, "%s", report_injected(run) ? run->inject : "none"); break;
        case 4: snprintf(buf, len, "%s", num(a, sizeof a, f->step->max_abs, 'g', 3)); break;
        case 5: snprintf(buf, len, "%s", num(a, sizeof a, f->step->nmse, 'g', 3)); break;
        }
    } else if (table == TABLE_CASCADE) {
        const cascade_pair *p = &ctx->cascades[row];
        switch (col) {
        case 0: snprintf(buf, len, "%lld", (long long)p->cascade_run); break;
        case 1: snprintf(buf, len, "%lld", (long long)p->baseline_run); break;
        case 2: snprintf(buf, len, "%zu", p->steps); break;
        case 3: snprintf(buf, len, "%lld - %lld", (long long)p->prefix_min, (long long)p->prefix_max); break;
        case 4: snprintf(buf, len, "%.2f", p->speedup_median); break;
        case 5: snprintf(buf, len, "%.2f - %.2f", p->speedup_min, p->speedup_max); break;
        }
    }
}

static const char *const runs_headers[] = {
    "run", "trace", "backend", "device", "dtype / kv", "cascade", "inject", "verify", "status", "steps",
    "shards", "passed / verified", "median time/step", "p90 time/step", "p99 time/step", "total time",
    "median GB/s (% copy)", "median TFLOP/s (% bf16)", "max NMSE", "max abs err" };
static const char *const faults_headers[] = {
    "run", "planted fault", "backend", "trace", "verified steps", "failing steps", "verdict" };
static const char *const errors_headers[] = {
    "backend dtype", "runs", "verified steps", "failed", "median NMSE", "p99 NMSE", "max NMSE",
    "median max abs", "max max abs" };
static const char *const ceilings_headers[] = {
    "device", "copy GB/s", "bf16 TFLOP/s", "source" };
static const char *const shards_headers[] = {
    "run", "shard", "host", "device", "launcher", "steps", "layers", "status", "steps stored", "failed",
    "failing steps", "wall s" };
static const char *const failing_headers[] = {
    "run", "step", "shard", "planted fault", "max abs err", "NMSE" };
static const char *const cascade_headers[] = {
    "cascade run", "baseline run", "steps compared", "prefix tokens", "median speedup",
    "speedup range" };

static table_shape shape_of(const report_ctx *ctx, int table)
{
    table_shape t = { 0, NULL, 0, 0 };
    switch (table) {
    case TABLE_RUNS:
        t = (table_shape){ "Runs", runs_headers, 20, ctx->num_runs }; break;
    case TABLE_SHARDS:
        t = (table_shape){ "Shards of merged runs", shards_headers, 12, ctx->num_shards }; break;
    case TABLE_FAILING:
        t = (table_shape){ "Failing steps", failing_headers, 6, ctx->num_failing }; break;
    case TABLE_FAULTS:
        t = (table_shape){ "Planted faults (left out of the error charts and the errors table)", faults_headers, 7,
                           ctx->num_faults }; break;
    case TABLE_ERRORS:
        t = (table_shape){ "Errors per backend and dtype", errors_headers, 9, ctx->num_groups }; break;
    case TABLE_CEILINGS:
        t = (table_shape){ "Device ceilings used", ceilings_headers, 4, ctx->num_devices }; break;
    case TABLE_CASCADE:
        t = (table_shape){ "Cascade speedup", cascade_headers, 6, ctx->num_cascades }; break;
    }
    return t;
}

/* How a table row is spelled in HTML or Markdown. */
typedef struct {
    const char *row_open, *header_open, *header_close, *cell_open, *cell_close, *row_close;
    void (*escape)(FILE *f, const char *text);
} table_markup;

static const table_markup html_markup = { "<tr>", "<th>", "</th>", "<td>", "</td>", "</tr>\n", html_text };
static const table_markup md_markup = { "|", " ", " |", " ", " |", "\n", md_text };

#define TABLE_MAX_COLS 24

static void write_row(FILE *f, const table_markup *m, bool header, char cells[][512], int num_cols)
{
    fputs(m->row_open, f);
    for (int c = 0; c < num_cols; c++) {
        fputs(header ? m->header_open : m->cell_open, f);
        m->escape(f, cells[c]);
        fputs(header ? m->header_close : m->cell_close, f);
    }
    fputs(m->row_close, f);
}

static void write_table(FILE *f, const report_ctx *ctx, int table, bool html)
{
    table_shape t = shape_of(ctx, table);
    if (t.num_rows == 0 || t.num_cols > TABLE_MAX_COLS) return;
    const table_markup *m = html ? &html_markup : &md_markup;
    char cells[TABLE_MAX_COLS][512];
    static const char *const ids[NUM_TABLES] = { "runs", "errors", "ceilings", "cascade", "faults", "shards",
                                                 "failing" };
    if (html) fprintf(f, "<h2>%s</h2>\n<div class=\"scroll\"><table id=\"%s\">\n", t.title, ids[table]);
    else fprintf(f, "## %s\n\n", t.title);
    for (int c = 0; c < t.num_cols; c++) snprintf(cells[c], sizeof cells[c], "%s", t.headers[c]);
    write_row(f, m, true, cells, t.num_cols);
    if (!html) {
        fputc('|', f);
        for (int c = 0; c < t.num_cols; c++) fputs(c ? " ---: |" : " --- |", f);
        fputc('\n', f);
    }
    for (size_t r = 0; r < t.num_rows; r++) {
        for (int c = 0; c < t.num_cols; c++) table_cell(ctx, table, r, c, cells[c], sizeof cells[c]);
        write_row(f, m, false, cells, t.num_cols);
    }
    fputs(html ? "</table></div>\n" : "\n", f);
}

/* The runs that stopped before their last step, with the reason each stopped, as a list. */
static void write_unfinished(FILE *f, const report_ctx *ctx, bool html)
{
    size_t count = 0;
    for (size_t r = 0; r < ctx->num_runs; r++) count += ar_rd_unfinished(&ctx->runs[r]) != 0;
    if (!count) return;
    fputs(html ? "<p>Runs that did not finish (their tables and charts hold only the steps they stored):</p>\n<ul>\n"
               : "Runs that did not finish (their tables and charts hold only the steps they stored):\n\n", f);
    for (size_t r = 0; r < ctx->num_runs; r++) {
        const ar_run_data *run = &ctx->runs[r];
        if (!ar_rd_unfinished(run)) continue;
        char text[1200];
        snprintf(text, sizeof text, "run %lld, status %s after %zu stored steps: %.1000s", (long long)run->id,
                 run->status, run->num_steps,
                 run->error[0] ? run->error
                 : !strcmp(run->status, "running") ? "no reason recorded (still running, or killed)"
                                                   : "no reason recorded");
        fputs(html ? "<li>" : "- ", f);
        if (html) html_text(f, text);
        else md_text(f, text);
        fputs(html ? "</li>\n" : "\n", f);
    }
    fputs(html ? "</ul>\n" : "\n", f);
}

/* A paragraph (html: <p>, with class cls when given) or a heading (html: <h3>; Markdown ###). */
static void write_text_block(FILE *f, bool html, const char *kind, const char *cls, const char *text)
{
    bool heading = strcmp(kind, "h3") == 0;
    if (html) {
        fprintf(f, "<%s%s%s%s>", kind, cls ? " class=\"" : "", cls ? cls : "", cls ? "\"" : "");
        html_text(f, text);
        fprintf(f, "</%s>\n", kind);
    } else {
        if (heading) fputs("### ", f);
        md_text(f, text);
        fputs("\n\n", f);
    }
}

/* The kernel-path coverage: one small table per run (path, steps, layer-steps, verified steps,
 * failing steps), or why a run has none. */
static void write_coverage(FILE *f, const report_ctx *ctx, bool html)
{
    const table_markup *m = html ? &html_markup : &md_markup;
    static const char *const headers[] = {"kernel path", "steps", "layer-steps", "verified steps", "failing steps"};
    char cells[5][512];
    fputs(html ? "<h2>Kernel-path coverage</h2>\n" : "## Kernel-path coverage\n\n", f);
    write_text_block(f, html, "p", NULL,
                     "The kernel paths each run's steps took (the backend's decision function: kernel, split, "
                     "cascade pass, merge). A path that no verified step ran is not checked by the run; a bug "
                     "there cannot show.");
    if (!ctx->have_coverage) {
        write_text_block(f, html, "p", "missing",
                         "Not recorded: the database predates kernel-path coverage (schema version 4).");
        return;
    }
    size_t at = 0;
    for (size_t r = 0; r < ctx->num_runs; r++) {
        const ar_run_data *run = &ctx->runs[r];
        char title[512], trace[128];
        report_trace_short_name(run->trace, trace, sizeof trace);
        snprintf(title, sizeof title, "run %lld: %s on %s, %s", (long long)run->id, run->backend, trace, run->dtype);
        size_t first = at;
        while (at < ctx->num_coverage && ctx->coverage[at].run == run->id) at++;
        write_text_block(f, html, "h3", NULL, title);
        if (at == first) {
            write_text_block(f, html, "p", "missing",
                             run->num_steps ? "no kernel paths recorded for its steps (replayed before the database "
                                              "had the coverage table)"
                                            : "no steps stored");
            continue;
        }
        if (html) fputs("<div class=\"scroll\"><table class=\"coverage\">\n", f);
        for (int c = 0; c < 5; c++) snprintf(cells[c], sizeof cells[c], "%s", headers[c]);
        write_row(f, m, true, cells, 5);
        if (!html) fputs("| --- | ---: | ---: | ---: | ---: |\n", f);
        for (size_t i = first; i < at; i++) {
            const coverage_row *c = &ctx->coverage[i];
            snprintf(cells[0], sizeof cells[0], "%s", c->path);
            snprintf(cells[1], sizeof cells[1], "%lld", (long long)c->steps);
            snprintf(cells[2], sizeof cells[2], "%lld", (long long)c->layer_steps);
            snprintf(cells[3], sizeof cells[3], "%lld", (long long)c->verified_steps);
            snprintf(cells[4], sizeof cells[4], "%lld", (long long)c->failed_steps);
            write_row(f, m, false, cells, 5);
        }
        fputs(html ? "</table></div>\n" : "\n", f);
    }
}

/* Says how many failing steps the table left out. */
static void write_failing_note(FILE *f, const report_ctx *ctx, bool html)
{
    if (!ctx->failing_left_out) return;
    fprintf(f, html ? "<p>%zu more failing steps are not listed (at most %d a run); the per-step CSV files in "
                      "<code>data/</code> hold every step.</p>\n"
                    : "%zu more failing steps are not listed (at most %d a run); the per-step CSV files in "
                      "`data/` hold every step.\n\n", ctx->failing_left_out, REPORT_MAX_FAILING_PER_RUN);
}

static void now_text(char *buf, size_t len)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, len, "%Y-%m-%d %H:%M:%S UTC", &tm);
}

int report_write_html(const report_ctx *ctx, char *err, size_t err_len)
{
    FILE *f = report_open_out(ctx, "index.html", err, err_len);
    if (!f) return -1;
    char when[64];
    now_text(when, sizeof when);
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
          "<title>attnreplay report</title>\n<style>\n"
          "body{font-family:sans-serif;margin:2em;max-width:1600px;color:#222}\n"
          "table{border-collapse:collapse;margin:0.5em 0 1.5em 0;font-size:0.85em}\n"
          "th,td{border:1px solid #bbb;padding:3px 8px;text-align:right;white-space:nowrap}\n"
          "th{white-space:normal}.scroll{overflow-x:auto}\n"
          "#runs td:nth-child(2){white-space:normal;min-width:10em}\n"
          "#runs td:nth-child(9),#faults td:nth-child(7),#shards td:nth-child(5),#shards td:nth-child(11)"
          "{white-space:normal;min-width:16em;text-align:left}\n"
          "th{background:#eee}td:first-child,th:first-child{text-align:left}\n"
          "figure{margin:1.5em 0}img{max-width:100%;border:1px solid #ddd}\n"
          "figcaption{color:#555;font-size:0.9em}.missing{color:#a00}\n"
          "</style>\n</head>\n<body>\n<h1>attnreplay report</h1>\n<p>Database <code>", f);
    html_text(f, ctx->db_path);
    fprintf(f, "</code>, %zu run(s), generated %s. Times are the timed forward summed over "
               "layers (median of --repeat). Percentiles interpolate between order statistics.</p>\n",
            ctx->num_runs, when);
    write_table(f, ctx, TABLE_RUNS, true);
    write_unfinished(f, ctx, true);
    write_table(f, ctx, TABLE_SHARDS, true);
    write_table(f, ctx, TABLE_FAILING, true);
    write_failing_note(f, ctx, true);
    fputs("<h2>Plots</h2>\n", f);
    for (size_t i = 0; i < ctx->num_plots; i++) {
        const plot_result *p = &ctx->plots[i];
        if (p->drawn) {
            fprintf(f, "<figure id=\"%s\"><a href=\"%s.svg\"><img src=\"%s.png\" alt=\"", p->name,
                    p->name, p->name);
            html_text(f, p->title);
            fputs("\"></a><figcaption>", f);
            html_text(f, p->title);
            if (p->note[0]) { fputs(". ", f); html_text(f, p->note); }
            fprintf(f, " (<a href=\"%s.svg\">SVG</a>, data in <code>data/</code>)</figcaption></figure>\n",
                    p->name);
        } else {
            fputs("<p class=\"missing\">", f);
            html_text(f, p->title);
            fputs(": ", f);
            html_text(f, p->note);
            fputs("</p>\n", f);
        }
    }
    write_table(f, ctx, TABLE_ERRORS, true);
    write_coverage(f, ctx, true);
    write_table(f, ctx, TABLE_FAULTS, true);
    write_table(f, ctx, TABLE_CASCADE, true);
    write_table(f, ctx, TABLE_CEILINGS, true);
    fputs("</body>\n</html>\n", f);
    if (fclose(f) != 0) {
        snprintf(err, err_len, "%s/index.html: write failed", ctx->out_dir);
        return -1;
    }
    return 0;
}

int report_write_markdown(const report_ctx *ctx, char *err, size_t err_len)
{
    FILE *f = report_open_out(ctx, "summary.md", err, err_len);
    if (!f) return -1;
    char when[64];
    now_text(when, sizeof when);
    fputs("# attnreplay report\n\nDatabase `", f);
    md_text(f, ctx->db_path);
    fprintf(f, "`, %zu run(s), generated %s. Times are the timed forward summed over layers "
               "(median of --repeat).\n\n", ctx->num_runs, when);
    write_table(f, ctx, TABLE_RUNS, false);
    write_unfinished(f, ctx, false);
    write_table(f, ctx, TABLE_SHARDS, false);
    write_table(f, ctx, TABLE_FAILING, false);
    write_failing_note(f, ctx, false);
    write_table(f, ctx, TABLE_ERRORS, false);
    write_coverage(f, ctx, false);
    write_table(f, ctx, TABLE_FAULTS, false);
    write_table(f, ctx, TABLE_CASCADE, false);
    write_table(f, ctx, TABLE_CEILINGS, false);
    fputs("## Plots\n\n", f);
    for (size_t i = 0; i < ctx->num_plots; i++) {
        const plot_result *p = &ctx->plots[i];
        if (p->drawn) {
            fprintf(f, "![%s](%s.png)\n\n", p->title, p->name);
            if (p->note[0]) { md_text(f, p->note); fputs("\n\n", f); }
        } else {
            fprintf(f, "- %s: ", p->title);
            md_text(f, p->note);
            fputs("\n\n", f);
        }
    }
    if (fclose(f) != 0) {
        snprintf(err, err_len, "%s/summary.md: write failed", ctx->out_dir);
        return -1;
    }
    return 0;
}

