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

#ifdef __cplusplus
}
#endif
#endif
