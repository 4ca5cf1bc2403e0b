/* rundata.h - read-only access to a results database for report and diff: loads the rows of
 * `runs` and `steps` (schema in replay/db.h) into plain arrays, looks up the device ceilings
 * (the `ceilings` table, else documented defaults), and small statistics helpers
 * (percentiles, sorting) shared by reports/report.c and reports/diff.c.
 *
 * Missing numbers (SQL NULL) load as NAN; a step's verification outcome loads as 1 (passed),
 * 0 (failed) or -1 (not verified). */
#ifndef AR_RUNDATA_H
#define AR_RUNDATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One row of `steps`, the columns report and diff use. */
typedef struct {
    int64_t step;
    double trace_time;        /* s, the step's time in the trace */
    int64_t num_reqs;
    int64_t num_tokens;       /* batch tokens (query tokens scheduled this step) */
    int64_t total_context;    /* sum of seq_lens */
    int cascade;              /* 1 when the step ran the cascade path */
    int64_t prefix_len;       /* shared prefix length in tokens (cascade steps) */
    double time_us;           /* timed forward summed over layers, median of --repeat */
    double bytes;             /* bytes moved (stored as INTEGER, kept as double) */
    double flops;             /* FLOPs */
    double gbps;              /* achieved GB/s */
    double tflops;            /* achieved TFLOP/s */
    double max_abs;           /* max abs error against the float64 reference */
    double nmse;              /* ||out-ref||^2 / ||ref||^2 */
    int pass;                 /* 1 passed, 0 failed, -1 not verified */
    int shard;                /* the shard that replayed it; -1 unknown or every shard (a layer split) */
} ar_step_row;

/* One row of `runs` plus its steps ordered by step. */
typedef struct {
    int64_t id;
    char *trace, *trace_hash, *backend, *device, *dtype, *kv_dtype, *model, *status, *cascade_mode;
    char *inject;             /* 'none' or the planted fault */
    char *verify;             /* 'all', 'sample:N' or 'off' */
    char *error;              /* why the run stopped ('' when none is recorded; runs.error) */
    int64_t layers;
    int64_t steps_done, steps_failed;
    int64_t shard_count;      /* 1 for a run replayed whole */
    int64_t shard_index;      /* this run's shard; -1 for a merged run */
    int64_t merged_shards;    /* a merged run: shards merged so far; -1 for a replayed run */
    char *shard_by;           /* 'steps' or 'layers' */
    ar_step_row *steps;       /* [num_steps] ordered by step */
    size_t num_steps;
} ar_run_data;

/* Device ceilings used for roofline plots and fractions of peak. */
typedef struct {
    double copy_gbps;         /* GB/s */
    double bf16_tflops;       /* TFLOP/s */
    char source[160];         /* where the numbers came from, shown beside them */
} ar_ceilings;

/* Opens path read-only (SQLITE_OPEN_READONLY) and checks it holds a `runs` and a `steps`
 * table and is not of a newer schema version than AR_DB_SCHEMA_VERSION (replay/db.h); a
 * directory is named as such.  Returns the sqlite3 handle (as void *) or NULL with a message in
 * err. */
void *ar_rd_open(const char *path, char *err, size_t err_len);
void ar_rd_close(void *handle);

/* Lists every run id in the database in ascending order.  *ids is malloc'd [*count]. */
int ar_rd_list_runs(void *handle, int64_t **ids, size_t *count, char *err, size_t err_len);

/* True when a run of this status stopped before its last step: 'running' (still going, or
 * killed), 'interrupted', 'error', and 'incomplete' (a merged run missing shards or steps). */
int ar_rd_unfinished(const ar_run_data *run);

/* Loads one run and its steps.  Returns 0, or -1 with a message (unknown run, bad schema).
 * The reason a run stopped comes from runs.error when the database has that column; the shard
 * fields read as one whole run in databases older than schema version 3. */
int ar_rd_load_run(void *handle, int64_t run_id, ar_run_data *out, char *err, size_t err_len);
void ar_rd_free_run(ar_run_data *run);

/* Ceilings for a device: the newest `ceilings` row whose device matches, else the H200
 * numbers measured for this project (shared/reference/kernel-performance-anchors.md:
 * ~4.3 TB/s copy, ~790 TFLOP/s bf16 GEMM) for a GPU, or a stated guess for a CPU
 * (50 GB/s, 1 TFLOP/s).  backend helps tell a CPU run from a GPU run. */
void ar_rd_ceilings(void *handle, const char *device, const char *backend, ar_ceilings *out);

/* The q-quantile (0..1) of values[n] by linear interpolation between order statistics
 * (numpy's default); sorts values in place.  NAN when n == 0. */
double ar_rd_quantile(double *values, size_t n, double q);

/* "step 12" or, for a run made of shards, "step 12 (shard 1/3)" into buf. */
void ar_rd_step_name(const ar_run_data *run, const ar_step_row *s, char *buf, size_t len);

/* A directory argument without its trailing slashes ("out/" -> "out", "/" stays), so paths
 * built from it print as out/index.html. */
void ar_rd_dir_name(const char *path, char *out, size_t len);

/* Parses a run id: decimal digits only ("12"; not " 12", "+12" or "-0"), within int64.
 * Returns 0 on success, -1 otherwise. */
int ar_rd_parse_run_id(const char *text, int64_t *id);

#ifdef __cplusplus
}
#endif
#endif
