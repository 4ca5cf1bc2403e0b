/* db.h - the results database (DESIGN section 9): SQLite, WAL, one transaction per batch of
 * steps, a schema version, and crash-safe resume.
 *
 * Schema (version 1; `meta` holds key 'schema_version'):
 *
 *   runs(id INTEGER PRIMARY KEY, trace TEXT, trace_hash TEXT, backend TEXT, device TEXT,
 *        dtype TEXT, kv_dtype TEXT, model TEXT, layers INTEGER, config TEXT (JSON of all
 *        options), code_rev TEXT, seed INTEGER, verify TEXT ('all' | 'sample:N' | 'off'),
 *        inject TEXT ('none' | fault name), cascade TEXT ('auto' | 'on' | 'off'),
 *        repeat INTEGER, status TEXT ('running' | 'passed' | 'failed' | 'unverified' | 'error'
 *        | 'interrupted'), error TEXT, started REAL, finished REAL (unix seconds),
 *        steps_done INTEGER, steps_failed INTEGER, last_step INTEGER)
 *   steps(run, step, time REAL (trace time, s), num_reqs, num_tokens, num_prefill_reqs,
 *        num_decode_reqs, max_query_len, max_seq_len, total_context (sum of seq_lens),
 *        cascade INTEGER (0/1), prefix_len INTEGER, time_us REAL (timed forward summed over
 *        layers, median of --repeat), bytes INTEGER, flops INTEGER, gbps REAL, tflops REAL,
 *        verified TEXT ('all' | 'sample' | 'off'), rows_checked INTEGER, max_abs REAL,
 *        max_rel REAL, mean_abs REAL, nmse REAL, lse_max_abs REAL, nan_count INTEGER,
 *        bad_count INTEGER, naive_max_abs REAL, naive_mean_abs REAL, tol_max_abs REAL,
 *        tol_mean_abs REAL, guard_ok INTEGER, pass INTEGER (1, 0, NULL = not verified),
 *        PRIMARY KEY(run, step))
 *   kernels(run, step, layer, name TEXT, time_us REAL, PRIMARY KEY(run, step, layer, name))
 *        -- names per backend ("write", "attn", "prefix", "suffix", "merge", "combine", ...);
 *        on cascade steps a row with layer -1, name 'flat_equivalent' holds the time the same
 *        step took without cascade (all layers), so reports can say what cascade saved
 *   mismatches(run, step, layer, req TEXT, token INTEGER, head INTEGER, dim INTEGER,
 *        got REAL, want REAL, abs_err REAL)          -- the worst elements of failing steps
 *   ceilings(device TEXT, measured REAL, copy_gbps REAL, bf16_tflops REAL, method TEXT)
 *
 * A step's rows (steps, kernels, mismatches) and the run's progress (steps_done, last_step)
 * are committed in the same transaction, so a killed replay leaves every step either fully
 * present or absent; --resume continues after runs.last_step. */
#ifndef AR_DB_H
#define AR_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AR_DB_SCHEMA_VERSION 1

typedef struct ar_db ar_db;

/* Opens (creating and migrating) the database; busy timeout 5 s so a second writer waits,
 * then fails clearly.  readonly for report/diff/plan. NULL + err on failure. */
ar_db *ar_db_open(const char *path, bool readonly, char *err, size_t err_len);
void ar_db_close(ar_db *db);
/* The raw handle (sqlite3 *) for readers in reports/ and sim/. */
void *ar_db_handle(ar_db *db);

typedef struct ar_run_row {
    const char *trace, *trace_hash, *backend, *device, *dtype, *kv_dtype, *model;
    int layers;
    const char *config;      /* JSON */
    const char *code_rev;
    uint64_t seed;
    const char *verify, *inject, *cascade;
    int repeat;
} ar_run_row;

typedef struct ar_step_row {
    int64_t run, step;
    double time;
    int num_reqs, num_tokens, num_prefill_reqs, num_decode_reqs, max_query_len, max_seq_len;
    int64_t total_context;
    int cascade, prefix_len;
    double time_us;
    int64_t bytes, flops;
    double gbps, tflops;
    const char *verified;    /* "all" | "sample" | "off" */
    int rows_checked;
    double max_abs, max_rel, mean_abs, nmse, lse_max_abs;
    int64_t nan_count, bad_count;
    double naive_max_abs, naive_mean_abs, tol_max_abs, tol_mean_abs;
    int guard_ok;
    int pass;                /* 1, 0, or -1 = not verified (stored as NULL) */
} ar_step_row;

typedef struct ar_mismatch_row {
    int layer;
    const char *req;
    int token, head, dim;
    double got, want, abs_err;
} ar_mismatch_row;

/* New run with status 'running'; returns its id (> 0) or -1 with err set. */
int64_t ar_db_create_run(ar_db *db, const ar_run_row *r, double now, char *err, size_t err_len);
/* The newest run of this trace hash and config whose status is not final ('running',
 * 'interrupted' or 'error'); returns 1 and fills id/last_step/steps_done/steps_failed, 0 if none,
 * -1 on error. */
int ar_db_find_resumable(ar_db *db, const char *trace_hash, const char *config, int64_t *run_id,
                         int64_t *last_step, int64_t *steps_done, int64_t *steps_failed,
                         char *err, size_t err_len);
/* Transactions: steps between begin and commit land together. */
int ar_db_begin(ar_db *db, char *err, size_t err_len);
int ar_db_commit(ar_db *db, char *err, size_t err_len);
int ar_db_rollback(ar_db *db);
int ar_db_insert_step(ar_db *db, const ar_step_row *s, char *err, size_t err_len);
int ar_db_insert_kernel(ar_db *db, int64_t run, int64_t step, int layer, const char *name,
                        double time_us, char *err, size_t err_len);
int ar_db_insert_mismatch(ar_db *db, int64_t run, int64_t step, const ar_mismatch_row *m,
                          char *err, size_t err_len);
int ar_db_update_progress(ar_db *db, int64_t run, int64_t steps_done, int64_t steps_failed,
                          int64_t last_step, char *err, size_t err_len);
/* Final status ('passed', 'failed', 'unverified', 'error', 'interrupted') and error text. */
int ar_db_finish_run(ar_db *db, int64_t run, const char *status, const char *error, double now,
                     char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
