/* db.h - the results database (DESIGN section 9): SQLite, WAL, short batched transactions, a
 * schema version with migrations, crash-safe resume, and the writer that owns the database
 * during a replay.
 *
 * Schema (version 4; `meta` holds key 'schema_version'):
 *
 *   runs(id INTEGER PRIMARY KEY, trace TEXT, trace_hash TEXT, backend TEXT, device TEXT,
 *        dtype TEXT, kv_dtype TEXT, model TEXT, layers INTEGER, config TEXT (JSON of all
 *        options), code_rev TEXT, seed INTEGER, verify TEXT ('all' | 'sample:N' | 'off'),
 *        inject TEXT ('none' | fault name), cascade TEXT ('auto' | 'on' | 'off'),
 *        repeat INTEGER, status TEXT (see below), error TEXT (why the run did not pass: the
 *        error message, the signal that interrupted it, or why nothing was verified; NULL for
 *        'passed', 'failed' and 'unverified'), started REAL, finished REAL (unix seconds),
 *        steps_done INTEGER, steps_failed INTEGER, last_step INTEGER,
 *        -- version 2:
 *        verify_layers TEXT ('all' | 'first' | 'K': the first K layers), verify_where TEXT
 *        ('host' | 'device'), verified_steps INTEGER (steps with at least one verified layer),
 *        verified_layer_steps INTEGER (verified layers summed over steps), verified_rows
 *        INTEGER (query rows checked, summed over steps and layers), and where the replay's
 *        time went, in seconds, summed over every invocation of the run (resume adds to them):
 *        parse_s (reading and validating the trace), metadata_s (building the batch, block
 *        tables and fill lists; the backend's prepare), generation_s (untimed writes of missing
 *        context and the forward's time outside its timed kernels: data generation, warm-up,
 *        launches, waiting, copies), kernel_s (the wall time of the timed kernels: --repeat R
 *        times their median, summed over layers and steps, the flat comparison forward of
 *        cascade steps included), verify_s (verification), sqlite_s (database writes), wait_s
 *        (the step loop waiting for the trace reader or the writer), setup_s (before the first
 *        step: opening the trace, the backend with its caches, the verifier and the
 *        database), wall_s)
 *        -- parse_s, part of metadata_s and sqlite_s run on their own threads, overlapping the
 *        step loop; the others are the step loop's own.  NULL in runs of schema version 1.
 *        -- version 3 (replay/shard.h, replay/merge.c):
 *        shard_index INTEGER, shard_count INTEGER (this run is shard shard_index of
 *        shard_count; 0 and 1 for an unsharded run; a merged run has shard_index NULL),
 *        shard_by TEXT ('steps' | 'layers': what the shards split), shard_step_first,
 *        shard_step_last INTEGER (the steps this shard was given; an unsharded run: its --steps,
 *        -1 for "to the end"), shard_layer_first, shard_layer_last INTEGER (its layers),
 *        host TEXT, device_index INTEGER (the CUDA device ordinal it chose), launcher TEXT
 *        (where the shard came from: "--shard 1/4", "slurm SLURM_PROCID=1 ...", or "none"),
 *        merged_shards INTEGER (NULL for a replayed run; a merged run: the shards merged so far)
 *        -- the shard fields read NULL in runs of older versions: shard 0 of 1, all steps.
 *   status: 'running' | 'passed' | 'failed' | 'unverified' (--verify off) | 'error' |
 *        'interrupted' (SIGINT / SIGTERM) | 'empty' (no step was replayed) |
 *        'fault-not-fired' (--inject: no step failed, so the planted fault never showed)
 *   steps(run, step, time REAL (trace time, s), num_reqs, num_tokens, num_prefill_reqs,
 *        num_decode_reqs, max_query_len, max_seq_len, total_context (sum of seq_lens),
 *        cascade INTEGER (0/1), prefix_len INTEGER, time_us REAL (timed forward summed over
 *        layers, median of --repeat), bytes INTEGER, flops INTEGER, gbps REAL, tflops REAL,
 *        verified TEXT ('all' | 'sample' | 'off'), rows_checked INTEGER (over all verified
 *        layers), max_abs REAL, max_rel REAL, mean_abs REAL, nmse REAL, lse_max_abs REAL,
 *        nan_count INTEGER, bad_count INTEGER, naive_max_abs REAL, naive_mean_abs REAL,
 *        tol_max_abs REAL, tol_mean_abs REAL, guard_ok INTEGER, pass INTEGER (1, 0, NULL =
 *        not verified),
 *        -- version 2:
 *        layers_verified INTEGER, wall_us REAL (the step loop's wall time for the step: batch
 *        hand-over, prepare, fill, forward, verification),
 *        -- version 3:
 *        shard INTEGER (the shard that replayed the step; NULL in a merged run of shards that
 *        split layers, where every shard replayed part of every step),
 *        PRIMARY KEY(run, step))
 *   kernels(run, step, layer, name TEXT, time_us REAL, PRIMARY KEY(run, step, layer, name))
 *        -- names per backend ("write", "attn", "prefix", "suffix", "merge", "combine", ...);
 *        on cascade steps a row with layer -1, name 'flat_equivalent' holds the time the same
 *        step took without cascade (all layers), so reports can say what cascade saved
 *   mismatches(run, step, layer, req TEXT, token INTEGER, head INTEGER, dim INTEGER,
 *        got REAL, want REAL, abs_err REAL)          -- the worst elements of failing steps
 *   coverage(run, step, path TEXT, layers INTEGER, verified_layers INTEGER,
 *        PRIMARY KEY(run, step, path))                -- version 4: kernel-path coverage
 *        -- one row per kernel path a step ran (names in replay/backend.h, ar_forward_out):
 *        layers = the replayed layers of the step whose forward ran it, verified_layers = those
 *        of them checked against the reference (--verify-layers); the flat comparison forward
 *        of cascade steps is not counted
 *   ceilings(device TEXT, measured REAL, copy_gbps REAL, bf16_tflops REAL, method TEXT)
 *   shards(run, shard, source TEXT (the shard database merged), source_run INTEGER, started,
 *        finished REAL, host, device TEXT, device_index INTEGER, code_rev, launcher, status,
 *        error TEXT, step_first, step_last, layer_first, layer_last, steps_done, steps_failed,
 *        last_step INTEGER, parse_s .. wall_s REAL (as in runs), merged REAL (unix seconds),
 *        PRIMARY KEY(run, shard))   -- version 3: a merged run's manifest, one row per shard
 *   shard_steps   -- made by `attnreplay merge` when shards split layers: the steps table's
 *        columns; each shard's rows of each step until every shard of the step is merged
 *        (then steps holds their combination)
 *
 * A writable open migrates an older database in place (ALTER TABLE ADD COLUMN; the new
 * columns read NULL in old rows; version 4's coverage table starts empty, so steps replayed
 * before the migration have no coverage rows).  Readers that open a database read-only call
 * ar_db_compat_views so that queries naming later columns work on older files too.
 *
 * A step's rows (steps, kernels, mismatches, coverage) and the run's progress (steps_done, last_step,
 * the verified counts, the timings) are committed in the same transaction, so a killed replay
 * leaves every step either fully present or absent; --resume continues after runs.last_step.
 * Transactions are short (BEGIN IMMEDIATE, a batch of finished steps, COMMIT): no transaction
 * is open while a step computes, so several replays can write one database. */
#ifndef AR_DB_H
#define AR_DB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "db_lock.h"      /* ar_db_busy_timeout_ms, ar_db_lock_error */
#include "db_version.h"   /* AR_DB_SCHEMA_VERSION */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ar_db ar_db;

/* Checks, before opening, that a database can be created or written at path: its directory
 * exists, is a directory and is writable, and an existing file is a writable regular file.
 * 0, or -1 with err naming the path and the system's reason (strerror). */
int ar_db_check_writable(const char *path, char *err, size_t err_len);
/* Opens (creating and migrating) the database; busy timeout ar_db_busy_timeout_ms() so a second
 * writer waits, then fails clearly.  readonly for report/diff/plan. NULL + err on failure;
 * *input_error (NULL: not wanted) then says whether it is bad input (exit 2), refused before
 * anything is written - the file itself (not SQLite, damaged, another program's tables named
 * like ours, a newer schema) or another connection's lock held past the busy timeout - rather
 * than I/O or memory. */
ar_db *ar_db_open(const char *path, bool readonly, bool *input_error, char *err, size_t err_len);
/* For a command that measures before it writes (calibrate): checks, after ar_db_check_writable and
 * without writing to the file, that ar_db_open would take path - no file or an empty one (a new
 * database), or an SQLite file that holds no other program's tables of our names and no newer
 * schema - so that a file it would refuse costs no measurement.  0, or -1 with err and
 * *input_error as ar_db_open sets them. */
int ar_db_check_ours(const char *path, bool *input_error, char *err, size_t err_len);
void ar_db_close(ar_db *db);
/* The directory holding path, where a database's -wal / -shm files and temporaries go: "." for
 * a bare name, "/" for a file in the root, else path up to its last '/'. */
void ar_path_dir(const char *path, char *dir, size_t len);

/* Why an SQLite call on sqlite_handle (a sqlite3 *) failed, for a message: the system's error
 * for an I/O, full-disk or open failure when SQLite kept one, else the usual cause of a failed
 * write; "" when neither applies. */
const char *ar_db_io_reason(void *sqlite_handle);

/* Whether the last failure of a call on db (err set) was another connection's lock held past
 * the busy timeout (err then says so in db_lock.h's words): bad input, exit 2, where other
 * database errors are exit 3. */
bool ar_db_locked(const ar_db *db);
/* The raw handle (sqlite3 *) for readers in reports/ and sim/. */
void *ar_db_handle(ar_db *db);
/* For a read-only connection (sqlite3 *) to a database of an older schema version: TEMP views
 * named runs and steps that add the missing later columns as NULL, so the same queries
 * work on every version.  Nothing is written to the file.  0, or -1 with err set. */
int ar_db_compat_views(void *sqlite_handle, char *err, size_t err_len);

/* 1 when schema.table (schema "main", or an attached database's name) has column, 0 when not or
 * when there is no such table, -1 on error.  sqlite_handle is a sqlite3 *. */
int ar_db_has_column(void *sqlite_handle, const char *schema, const char *table, const char *column);

/* Which shard a run is (runs.shard_* columns); all zero reads as shard 0 of 1. */
typedef struct ar_run_shard {
    int index, count;         /* count 0 = unsharded (stored as 0 of 1) */
    const char *by;           /* "steps" | "layers"; NULL = "steps" */
    int64_t step_first, step_last;
    int layer_first, layer_last;
    const char *host;
    int device_index;
    const char *launcher;
} ar_run_shard;

typedef struct ar_run_row {
    const char *trace, *trace_hash, *backend, *device, *dtype, *kv_dtype, *model;
    int layers;
    const char *config;      /* JSON */
    const char *code_rev;
    uint64_t seed;
    const char *verify, *inject, *cascade;
    int repeat;
    const char *verify_layers, *verify_where;
    ar_run_shard shard;
} ar_run_row;

/* Where a replay's time goes (runs.*_s columns, in this order). */
typedef enum ar_phase {
    AR_PHASE_PARSE, AR_PHASE_METADATA, AR_PHASE_GENERATION, AR_PHASE_KERNEL, AR_PHASE_VERIFY,
    AR_PHASE_SQLITE, AR_PHASE_WAIT, AR_PHASE_SETUP, AR_PHASE_COUNT
} ar_phase;
/* "parse", "metadata", "generation", "kernel", "verify", "sqlite", "wait", "setup". */
const char *ar_phase_name(ar_phase p);

/* The run's counters as of its last committed step (runs columns). */
typedef struct ar_run_progress {
    int64_t steps_done, steps_failed, last_step;
    int64_t verified_steps, verified_layer_steps, verified_rows;
    double phase_s[AR_PHASE_COUNT];
    double wall_s;
} ar_run_progress;

typedef struct ar_step_row {
    int64_t run, step;
    double time;
    int num_reqs, num_tokens, num_prefill_reqs, num_decode_reqs, max_query_len, max_seq_len;
    int64_t total_context;
    int cascade, prefix_len;
    double time_us;
    int64_t bytes, flops;
    double gbps, tflops;
    const char *verified;    /* "all" | "sample" | "off" (a string literal) */
    int rows_checked;
    double max_abs, max_rel, mean_abs, nmse, lse_max_abs;
    int64_t nan_count, bad_count;
    double naive_max_abs, naive_mean_abs, tol_max_abs, tol_mean_abs;
    int guard_ok;
    int pass;                /* 1, 0, or -1 = not verified (stored as NULL) */
    int layers_verified;
    double wall_us;
    int shard;               /* the run's shard index (0 unsharded) */
} ar_step_row;

typedef struct ar_mismatch_row {
    int layer;
    const char *req;
    int token, head, dim;
    double got, want, abs_err;
} ar_mismatch_row;

/* New run with status 'running'; returns its id (> 0) or -1 with err set. */
int64_t ar_db_create_run(ar_db *db, const ar_run_row *r, double now, char *err, size_t err_len);
/* The newest run of this trace hash, config and shard (index, count, split and its step and
 * layer ranges) whose status is not final ('running', 'interrupted' or 'error'); returns 1,
 * sets it 'running' and fills id and progress (NULL columns of an older run read 0), 0 if
 * none, -1 on error.  Merged runs are never resumed. */
int ar_db_find_resumable(ar_db *db, const char *trace_hash, const char *config, const ar_run_shard *shard,
                         int64_t *run_id, ar_run_progress *progress, char *err, size_t err_len);
/* How many kernel rows of run carry one of the names (NULL-terminated list). -1 on error. */
int64_t ar_db_count_kernels(ar_db *db, int64_t run, const char *const *names, char *err, size_t err_len);
/* Transactions: rows between begin and commit land together. */
int ar_db_begin(ar_db *db, char *err, size_t err_len);
int ar_db_commit(ar_db *db, char *err, size_t err_len);
int ar_db_rollback(ar_db *db);
int ar_db_insert_step(ar_db *db, const ar_step_row *s, char *err, size_t err_len);
int ar_db_insert_kernel(ar_db *db, int64_t run, int64_t step, int layer, const char *name,
                        double time_us, char *err, size_t err_len);
int ar_db_insert_mismatch(ar_db *db, int64_t run, int64_t step, const ar_mismatch_row *m,
                          char *err, size_t err_len);
int ar_db_insert_coverage(ar_db *db, int64_t run, int64_t step, const char *path, int layers,
                          int verified_layers, char *err, size_t err_len);
int ar_db_update_progress(ar_db *db, int64_t run, const ar_run_progress *p, char *err, size_t err_len);
/* Final status and reason (runs.error; NULL for none). */
int ar_db_finish_run(ar_db *db, int64_t run, const char *status, const char *error, double now,
                     char *err, size_t err_len);

/* ---- the writer: one per replay, owns the database once the run exists ---------------------
 * The step loop hands each finished step over as a self-contained record; the writer inserts
 * records in batches (when AR_DB_COMMIT_STEPS steps wait or the oldest has waited
 * AR_DB_COMMIT_SECONDS), each transaction holding at most AR_DB_COMMIT_STEPS steps with the
 * run's progress as of its last one, so transactions stay short.
 * Threaded, it runs on its own thread; otherwise the batches are written inline by
 * ar_db_writer_push, at the same points, so both give the same rows.  Records are pooled and
 * reused (no allocation per step once the pool is warm); at most AR_DB_MAX_PENDING wait, after
 * which push blocks.  A failed batch (disk full, I/O error) is rolled back, the writer stops
 * taking records, and ar_db_writer_error says why. */
#define AR_DB_COMMIT_STEPS 32
#define AR_DB_COMMIT_SECONDS 1.0
#define AR_DB_MAX_PENDING 1024
#define AR_DB_RECORD_WORST 8

typedef struct ar_kernel_row {
    int layer;
    const char *name;        /* a backend's string literal (names live as long as the program) */
    double us;
} ar_kernel_row;

/* A kernel path of a step (the coverage table). */
typedef struct ar_path_row {
    const char *name;        /* a backend's path name (backend.h: lives as long as the program) */
    int layers, verified_layers;
} ar_path_row;

typedef struct ar_step_record {
    ar_step_row row;
    ar_kernel_row *kernels;  /* [num_kernels], capacity cap_kernels (kept across reuse) */
    int num_kernels, cap_kernels;
    ar_path_row *paths;      /* [num_paths], capacity cap_paths (kept across reuse) */
    int num_paths, cap_paths;
    ar_mismatch_row mismatches[AR_DB_RECORD_WORST];   /* req points into req_text */
    int num_mismatches;
    char *req_text;          /* the mismatches' request ids, NUL-separated */
    size_t req_len, req_cap;
    ar_run_progress progress;   /* the run as of this step (written with the batch it ends) */
    struct ar_step_record *next;
} ar_step_record;

/* Appends a kernel row / a mismatch (its request id copied).  0, or -1 out of memory. */
int ar_step_record_add_kernel(ar_step_record *r, int layer, const char *name, double us);
/* Counts one layer that ran kernel path name (verified: that layer was checked against the
 * reference); a path seen before in the step adds to its row.  0, or -1 out of memory. */
int ar_step_record_add_path(ar_step_record *r, const char *name, bool verified);
int ar_step_record_add_mismatch(ar_step_record *r, const ar_mismatch_row *m);

typedef struct ar_db_writer ar_db_writer;

/* Takes over db for run, whose last committed step is last_step (-1 for a new run; a resumed
 * run's runs.last_step); sqlite_base_s is the sqlite phase of earlier invocations (resume).
 * Every batch and the final status are written only while runs.last_step is still what this
 * writer committed last: when another process has written the run meanwhile (a --resume of a
 * run that was still running), the writer stops with an error and leaves the run's rows and
 * status to that process.  NULL + err on failure (out of memory, no thread). */
ar_db_writer *ar_db_writer_start(ar_db *db, int64_t run, int64_t last_step, bool threaded, double sqlite_base_s,
                                 char *err, size_t err_len);
/* A cleared record to fill (from the pool); NULL when out of memory or the writer has failed. */
ar_step_record *ar_db_writer_record(ar_db_writer *w);
/* Gives a record to the writer (it returns to the pool once written).  0, or -1 when the
 * writer has failed (ar_db_writer_error); the record is taken back either way. */
int ar_db_writer_push(ar_db_writer *w, ar_step_record *r);
/* Returns an unused record to the pool. */
void ar_db_writer_discard(ar_db_writer *w, ar_step_record *r);
/* NULL while all is well, else why the writer stopped. */
const char *ar_db_writer_error(ar_db_writer *w);
/* Whether the writer stopped on another connection's lock held past the busy timeout (its
 * error says so; the steps committed before stay whole and --resume continues the run). */
bool ar_db_writer_locked(ar_db_writer *w);
/* Seconds spent in SQLite so far, earlier invocations included (the sqlite phase, which the
 * writer also stores with each batch's progress). */
double ar_db_writer_seconds(ar_db_writer *w);
/* Writes every pending record and stops the writer thread: 0, or -1 when a batch failed
 * (ar_db_writer_error says why; the records after the last committed batch are lost). */
int ar_db_writer_drain(ar_db_writer *w);
/* Ends the run: writes every pending record (ar_db_writer_drain), then progress (final) and the status in one
 * transaction, and stops the writer thread.  If pending records cannot be written (the writer
 * failed), only the status is written, using the database's space reserve if need be.
 * 0, or -1 with err set (the run then stays 'running' and --resume continues it). */
int ar_db_writer_finish(ar_db_writer *w, const char *status, const char *error,
                        const ar_run_progress *final, double now, char *err, size_t err_len);
/* For a signal watchdog on another thread while the step loop is stuck in a long step: takes
 * the pending records, writes them, marks the run status/error (progress as of the last record
 * written), all within about wait_s seconds (lock and busy waits included); the writer takes
 * nothing after.  The caller then ends the process.  0 done, 1 the run was already finished,
 * -1 not done in time or failed (the database stays consistent: whole steps, run 'running'). */
int ar_db_writer_abort(ar_db_writer *w, const char *status, const char *error, double now,
                       double wait_s);
/* Stops the thread (if finish was not called, pending records are dropped) and frees the
 * writer; the database stays open (ar_db_close). */
void ar_db_writer_free(ar_db_writer *w);

/* Clocks of the writer and the replay engine: monotonic seconds, and the CLOCK_REALTIME
 * deadline s seconds from now that pthread's timed waits take. */
double ar_mono_seconds(void);
struct timespec ar_deadline_in(double s);

#ifdef __cplusplus
}
#endif
#endif
