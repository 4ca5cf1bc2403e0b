/* report_ctx.h - what the `report` command (report.c) collects about its runs and the pages it
 * writes from it (report_pages.c: index.html and summary.md, their tables and notes).  Internal
 * to reports/. */
#ifndef AR_REPORT_CTX_H
#define AR_REPORT_CTX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "plot.h"
#include "reports.h"
#include "rundata.h"

#define REPORT_MAX_TRACES 12       /* per-trace charts for the first 12 traces; the rest are named */
#define REPORT_MAX_PLOTS (4 * REPORT_MAX_TRACES + 8)
#define REPORT_MAX_GROUPS 24
#define REPORT_MAX_DEVICES 8
#define REPORT_MAX_FAILING_PER_RUN 20
#define REPORT_MAX_FAILING 200
#define REPORT_MAX_SHARD_ROWS 512

/* Per-run numbers for the tables. */
typedef struct {
    size_t verified, failed;
    double time_median, time_p90, time_p99, time_total_ms;
    double gbps_median, tflops_median;
    double nmse_max, max_abs_max;
    ar_ceilings ceilings;
} run_summary;

/* Runs sharing a backend and dtype, for the error charts. */
typedef struct {
    char label[128];
    size_t num_runs, verified, failed, exact_zero;
    double nmse_median, nmse_p99, nmse_max, abs_median, abs_max;
} error_group;

/* A cascade run paired with a non-cascade run of the same trace. */
typedef struct {
    int64_t cascade_run, baseline_run;
    size_t steps;
    double speedup_median, speedup_min, speedup_max;
    int64_t prefix_min, prefix_max;
} cascade_pair;

/* One kernel path of one run (the coverage table). */
typedef struct {
    int64_t run;
    char path[96];
    int64_t steps, layer_steps, verified_steps, failed_steps;
} coverage_row;
/* One shard of a merged run (the shards table of the database). */
typedef struct {
    size_t run_row;           /* index of the merged run in runs */
    int64_t shard;
    char host[128], device[128], status[32], steps[48], layers[32], launcher[160];
    int64_t steps_done, steps_failed;
    double wall_s;            /* the shard's wall time: how even the split was */
    char failing[200];        /* the failing steps it replayed, from the merged run's rows */
} shard_row;

/* A failing step of a run. */
typedef struct {
    size_t run_row;
    const ar_step_row *step;
} failing_step;

/* What became of each chart. */
typedef struct {
    char name[64];
    char title[200];
    char note[512];           /* why it is missing, or a caveat */
    bool drawn;
} plot_result;

typedef struct {
    const char *db_path;
    const char *out_dir;
    void *db;
    ar_run_data *runs;
    run_summary *summaries;
    size_t num_runs;
    error_group groups[REPORT_MAX_GROUPS];
    size_t num_groups;
    cascade_pair *cascades;
    size_t num_cascades;
    size_t device_rows[REPORT_MAX_DEVICES];   /* first run of each distinct device */
    size_t num_devices;
    int *trace_of;                             /* [num_runs] index of the run's trace */
    size_t trace_rows[REPORT_MAX_TRACES];      /* first run of each distinct trace */
    size_t num_traces;
    size_t traces_left_out;                    /* distinct traces beyond REPORT_MAX_TRACES */
    size_t num_faults;                         /* runs with a planted fault */
    size_t *fault_rows;                        /* [num_faults] their indices in runs */
    plot_result plots[REPORT_MAX_PLOTS];
    size_t num_plots;
    int render_failures;
    bool have_coverage;                        /* the database has the coverage table (version 4) */
    coverage_row *coverage;                    /* [num_coverage] ordered by run, path */
    size_t num_coverage;
    shard_row *shards;                         /* [num_shards] shards of the merged runs */
    size_t num_shards;
    failing_step *failing;                     /* [num_failing] */
    size_t num_failing, failing_left_out;
} report_ctx;

/* DIR/rel opened for writing, or NULL with err set. */
FILE *report_open_out(const report_ctx *ctx, const char *rel, char *err, size_t err_len);
/* The run ran with a planted fault. */
bool report_injected(const ar_run_data *run);
/* The trace's file name without its folder. */
void report_trace_short_name(const char *trace, char *buf, size_t len);

/* DIR/index.html and DIR/summary.md; 0 ok, else err set. */
int report_write_html(const report_ctx *ctx, char *err, size_t err_len);
int report_write_markdown(const report_ctx *ctx, char *err, size_t err_len);

#endif
