/* db.c - the SQLite results database: schema, WAL, prepared statements, batched transactions.
 *
 * Crash safety comes from SQLite itself: every batch of steps and the run's progress counters
 * commit in one transaction, and WAL mode keeps readers (report, diff) working during a replay.
 * A disk-full or I/O error inside a batch rolls the batch back, so the database always holds
 * whole steps only; the caller then marks the run 'error'.  That needs a little space, so a
 * writable database keeps PATH-reserve (AR_DB_RESERVE_BYTES, deleted on close) and gives it back
 * when the final status write fails for want of space; if even that fails the run stays
 * 'running' and --resume picks it up.  Error messages name the kind of I/O failure. */
#include "db.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    ST_INSERT_STEP,
    ST_INSERT_KERNEL,
    ST_INSERT_MISMATCH,
    ST_PROGRESS,
    ST_COUNT
};

/* Bytes set aside beside a writable database (PATH-reserve) and given back when a write fails
 * for want of space, so the run can still be marked 'error' on a full disk.  A few WAL frames
 * are all that needs. */
#define AR_DB_RESERVE_BYTES (128 * 1024)

struct ar_db {
    sqlite3 *h;
    sqlite3_stmt *st[ST_COUNT];
    char path[1024];
    char reserve_path[1040];
    bool have_reserve;
};

/* Best effort: no reserve (no space even for it, odd file system) only loses the fallback. */
static void reserve_create(ar_db *db)
{
    snprintf(db->reserve_path, sizeof db->reserve_path, "%s-reserve", db->path);
    int fd = open(db->reserve_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    int rc = posix_fallocate(fd, 0, AR_DB_RESERVE_BYTES);
    close(fd);
    if (rc != 0) {
        unlink(db->reserve_path);
        return;
    }
    db->have_reserve = true;
}

/* Deletes the reserve file; true when there was one to give back. */
static bool reserve_release(ar_db *db)
{
    if (!db->have_reserve) return false;
    unlink(db->reserve_path);
    db->have_reserve = false;
    return true;
}

static const char *const schema_sql =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS runs("
    " id INTEGER PRIMARY KEY, trace TEXT NOT NULL, trace_hash TEXT NOT NULL,"
    " backend TEXT NOT NULL, device TEXT NOT NULL, dtype TEXT NOT NULL, kv_dtype TEXT NOT NULL,"
    " model TEXT NOT NULL, layers INTEGER NOT NULL, config TEXT NOT NULL, code_rev TEXT NOT NULL,"
    " seed INTEGER NOT NULL, verify TEXT NOT NULL, inject TEXT NOT NULL, cascade TEXT NOT NULL,"
    " repeat INTEGER NOT NULL, status TEXT NOT NULL, error TEXT, started REAL NOT NULL,"
    " finished REAL, steps_done INTEGER NOT NULL DEFAULT 0,"
    " steps_failed INTEGER NOT NULL DEFAULT 0, last_step INTEGER NOT NULL DEFAULT -1);"
    "CREATE TABLE IF NOT EXISTS steps("
    " run INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, time REAL,"
    " num_reqs INTEGER, num_tokens INTEGER, num_prefill_reqs INTEGER, num_decode_reqs INTEGER,"
    " max_query_len INTEGER, max_seq_len INTEGER, total_context INTEGER,"
    " cascade INTEGER, prefix_len INTEGER, time_us REAL, bytes INTEGER, flops INTEGER,"
    " gbps REAL, tflops REAL, verified TEXT, rows_checked INTEGER, max_abs REAL, max_rel REAL,"
    " mean_abs REAL, nmse REAL, lse_max_abs REAL, nan_count INTEGER, bad_count INTEGER,"
    " naive_max_abs REAL, naive_mean_abs REAL, tol_max_abs REAL, tol_mean_abs REAL,"
    " guard_ok INTEGER, pass INTEGER, PRIMARY KEY(run, step));"
    "CREATE TABLE IF NOT EXISTS kernels("
    " run INTEGER NOT NULL, step INTEGER NOT NULL, layer INTEGER NOT NULL, name TEXT NOT NULL,"
    " time_us REAL, PRIMARY KEY(run, step, layer, name));"
    "CREATE TABLE IF NOT EXISTS mismatches("
    " run INTEGER NOT NULL, step INTEGER NOT NULL, layer INTEGER NOT NULL, req TEXT,"
    " token INTEGER, head INTEGER, dim INTEGER, got REAL, want REAL, abs_err REAL);"
    "CREATE INDEX IF NOT EXISTS mismatches_run_step ON mismatches(run, step);"
    "CREATE TABLE IF NOT EXISTS ceilings("
    " device TEXT NOT NULL, measured REAL NOT NULL, copy_gbps REAL, bf16_tflops REAL,"
    " method TEXT);";

static const char *const stmt_sql[ST_COUNT] = {
    [ST_INSERT_STEP] =
        "INSERT INTO steps(run, step, time, num_reqs, num_tokens, num_prefill_reqs,"
        " num_decode_reqs, max_query_len, max_seq_len, total_context, cascade, prefix_len,"
        " time_us, bytes, flops, gbps, tflops, verified, rows_checked, max_abs, max_rel,"
        " mean_abs, nmse, lse_max_abs, nan_count, bad_count, naive_max_abs, naive_mean_abs,"
        " tol_max_abs, tol_mean_abs, guard_ok, pass) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,"
        "?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    [ST_INSERT_KERNEL] = "INSERT OR REPLACE INTO kernels(run, step, layer, name, time_us)"
                         " VALUES(?,?,?,?,?)",
    [ST_INSERT_MISMATCH] = "INSERT INTO mismatches(run, step, layer, req, token, head, dim,"
                           " got, want, abs_err) VALUES(?,?,?,?,?,?,?,?,?,?)",
    [ST_PROGRESS] = "UPDATE runs SET steps_done = ?, steps_failed = ?, last_step = ? WHERE id = ?",
};

static int fail(ar_db *db, char *err, size_t err_len, const char *what)
{
    /* Say what kind of I/O failure it was: the OS error when SQLite kept it, else the cause a
     * failed write (SQLITE_IOERR_WRITE, SQLITE_FULL) nearly always has. */
    int sys = db->h ? sqlite3_system_errno(db->h) : 0;
    int ext = db->h ? sqlite3_extended_errcode(db->h) : 0;
    const char *why = "";
    if (sys && ((ext & 0xff) == SQLITE_IOERR || (ext & 0xff) == SQLITE_FULL || (ext & 0xff) == SQLITE_CANTOPEN))
        why = strerror(sys);
    else if (ext == SQLITE_IOERR_WRITE || ext == SQLITE_FULL)
        why = "a write failed: disk full or file size limit reached?";
    snprintf(err, err_len, "%s: %s: %s%s%s%s", db->path, what, db->h ? sqlite3_errmsg(db->h) : "?",
             *why ? " (" : "", why, *why ? ")" : "");
    return -1;
}

ar_db *ar_db_open(const char *path, bool readonly, char *err, size_t err_len)
{
    ar_db *db = calloc(1, sizeof *db);
    if (!db) {
        snprintf(err, err_len, "%s: out of memory", path);
        return NULL;
    }
    snprintf(db->path, sizeof db->path, "%s", path);
    int flags = readonly ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    if (sqlite3_open_v2(path, &db->h, flags, NULL) != SQLITE_OK) {
        fail(db, err, err_len, "cannot open database");
        ar_db_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db->h, 5000);
    if (readonly) return db;
    reserve_create(db);

    char *msg = NULL;
    if (sqlite3_exec(db->h, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", NULL, NULL,
                     &msg) != SQLITE_OK ||
        sqlite3_exec(db->h, schema_sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, err_len, "%s: cannot set up the schema: %s", path, msg ? msg : "?");
        sqlite3_free(msg);
        ar_db_close(db);
        return NULL;
    }
    /* Schema version: record it, or refuse a database written by a newer schema. */
    sqlite3_stmt *q = NULL;
    int version = 0;
    if (sqlite3_prepare_v2(db->h, "SELECT value FROM meta WHERE key='schema_version'", -1, &q,
                           NULL) == SQLITE_OK &&
        sqlite3_step(q) == SQLITE_ROW)
        version = atoi((const char *)sqlite3_column_text(q, 0));
    sqlite3_finalize(q);
    if (version > AR_DB_SCHEMA_VERSION) {
        snprintf(err, err_len, "%s: schema version %d is newer than this attnreplay's %d", path,
                 version, AR_DB_SCHEMA_VERSION);
        ar_db_close(db);
        return NULL;
    }
    if (version == 0) {
        char sql[128];
        snprintf(sql, sizeof sql,
                 "INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', '%d')",
                 AR_DB_SCHEMA_VERSION);
        if (sqlite3_exec(db->h, sql, NULL, NULL, NULL) != SQLITE_OK) {
            fail(db, err, err_len, "cannot write the schema version");
            ar_db_close(db);
            return NULL;
        }
    }
    for (int i = 0; i < ST_COUNT; i++) {
        if (sqlite3_prepare_v2(db->h, stmt_sql[i], -1, &db->st[i], NULL) != SQLITE_OK) {
            fail(db, err, err_len, "cannot prepare a statement");
            ar_db_close(db);
            return NULL;
        }
    }
    return db;
}

void ar_db_close(ar_db *db)
{
    if (!db) return;
    for (int i = 0; i < ST_COUNT; i++) sqlite3_finalize(db->st[i]);
    if (db->h) sqlite3_close(db->h);
    reserve_release(db);
    free(db);
}

void *ar_db_handle(ar_db *db) { return db->h; }

static int exec_simple(ar_db *db, const char *sql, char *err, size_t err_len)
{
    if (sqlite3_exec(db->h, sql, NULL, NULL, NULL) != SQLITE_OK) return fail(db, err, err_len, sql);
    return 0;
}

int ar_db_begin(ar_db *db, char *err, size_t err_len)
{
    return exec_simple(db, "BEGIN IMMEDIATE", err, err_len);
}

int ar_db_commit(ar_db *db, char *err, size_t err_len)
{
    if (exec_simple(db, "COMMIT", err, err_len) != 0) {
        ar_db_rollback(db);
        return -1;
    }
    return 0;
}

int ar_db_rollback(ar_db *db)
{
    if (sqlite3_get_autocommit(db->h)) return 0;
    return sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
}

static int step_done(ar_db *db, sqlite3_stmt *st, char *err, size_t err_len, const char *what)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (rc != SQLITE_DONE) return fail(db, err, err_len, what);
    return 0;
}

int64_t ar_db_create_run(ar_db *db, const ar_run_row *r, double now, char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    const char *sql =
        "INSERT INTO runs(trace, trace_hash, backend, device, dtype, kv_dtype, model, layers,"
        " config, code_rev, seed, verify, inject, cascade, repeat, status, started)"
        " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,'running',?)";
    if (sqlite3_prepare_v2(db->h, sql, -1, &st, NULL) != SQLITE_OK)
        return fail(db, err, err_len, "cannot prepare run insert");
    int i = 1;
    sqlite3_bind_text(st, i++, r->trace, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, i++, r->trace_hash, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, i++, r->backend, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, i++, r->device, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, i++, r->dtype, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, i++, r->kv_dtype, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, i++, r->model, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, i++, r->layers);
    sqlite3_bind_text(st, i++, r->config, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, i++, r->code_rev, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, i++, (sqlite3_int64)r->seed);
    sqlite3_bind_text(st, i++, r->verify, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, i++, r->inject, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, i++, r->cascade, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, i++, r->repeat);
    sqlite3_bind_double(st, i++, now);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return fail(db, err, err_len, "cannot create the run");
    return (int64_t)sqlite3_last_insert_rowid(db->h);
}

int ar_db_find_resumable(ar_db *db, const char *trace_hash, const char *config, int64_t *run_id,
                         int64_t *last_step, int64_t *steps_done, int64_t *steps_failed,
                         char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    const char *sql = "SELECT id, last_step, steps_done, steps_failed FROM runs"
                      " WHERE trace_hash = ? AND config = ?"
                      " AND status IN ('running', 'interrupted', 'error')"
                      " ORDER BY id DESC LIMIT 1";
    if (sqlite3_prepare_v2(db->h, sql, -1, &st, NULL) != SQLITE_OK)
        return fail(db, err, err_len, "cannot look for a run to resume");
    sqlite3_bind_text(st, 1, trace_hash, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, config, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st), found = 0;
    if (rc == SQLITE_ROW) {
        *run_id = sqlite3_column_int64(st, 0);
        *last_step = sqlite3_column_int64(st, 1);
        *steps_done = sqlite3_column_int64(st, 2);
        *steps_failed = sqlite3_column_int64(st, 3);
        found = 1;
    } else if (rc != SQLITE_DONE) {
        sqlite3_finalize(st);
        return fail(db, err, err_len, "cannot look for a run to resume");
    }
    sqlite3_finalize(st);
    if (found) {
        /* Steps past last_step cannot exist (same transaction), but clear any to be sure. */
        char sql2[160];
        snprintf(sql2, sizeof sql2, "UPDATE runs SET status='running', error=NULL WHERE id=%lld",
                 (long long)*run_id);
        if (exec_simple(db, sql2, err, err_len) != 0) return -1;
    }
    return found;
}

int ar_db_insert_step(ar_db *db, const ar_step_row *s, char *err, size_t err_len)
{
    sqlite3_stmt *st = db->st[ST_INSERT_STEP];
    int i = 1;
    sqlite3_bind_int64(st, i++, s->run);
    sqlite3_bind_int64(st, i++, s->step);
    sqlite3_bind_double(st, i++, s->time);
    sqlite3_bind_int(st, i++, s->num_reqs);
    sqlite3_bind_int(st, i++, s->num_tokens);
    sqlite3_bind_int(st, i++, s->num_prefill_reqs);
    sqlite3_bind_int(st, i++, s->num_decode_reqs);
    sqlite3_bind_int(st, i++, s->max_query_len);
    sqlite3_bind_int(st, i++, s->max_seq_len);
    sqlite3_bind_int64(st, i++, s->total_context);
    sqlite3_bind_int(st, i++, s->cascade);
    sqlite3_bind_int(st, i++, s->prefix_len);
    sqlite3_bind_double(st, i++, s->time_us);
    sqlite3_bind_int64(st, i++, s->bytes);
    sqlite3_bind_int64(st, i++, s->flops);
    sqlite3_bind_double(st, i++, s->gbps);
    sqlite3_bind_double(st, i++, s->tflops);
    sqlite3_bind_text(st, i++, s->verified, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, i++, s->rows_checked);
    bool v = s->pass >= 0;
    const double reals[] = {s->max_abs, s->max_rel, s->mean_abs, s->nmse, s->lse_max_abs};
    for (size_t k = 0; k < sizeof reals / sizeof reals[0]; k++) {
        if (v) sqlite3_bind_double(st, i, reals[k]);
        else sqlite3_bind_null(st, i);
        i++;
    }
    sqlite3_bind_int64(st, i++, s->nan_count);
    if (v) sqlite3_bind_int64(st, i, s->bad_count);
    else sqlite3_bind_null(st, i);
    i++;
    const double tols[] = {s->naive_max_abs, s->naive_mean_abs, s->tol_max_abs, s->tol_mean_abs};
    for (size_t k = 0; k < sizeof tols / sizeof tols[0]; k++) {
        if (v) sqlite3_bind_double(st, i, tols[k]);
        else sqlite3_bind_null(st, i);
        i++;
    }
    sqlite3_bind_int(st, i++, s->guard_ok);
    if (v) sqlite3_bind_int(st, i++, s->pass);
    else sqlite3_bind_null(st, i++);
    return step_done(db, st, err, err_len, "cannot insert a step");
}

int ar_db_insert_kernel(ar_db *db, int64_t run, int64_t step, int layer, const char *name,
                        double time_us, char *err, size_t err_len)
{
    sqlite3_stmt *st = db->st[ST_INSERT_KERNEL];
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int64(st, 2, step);
    sqlite3_bind_int(st, 3, layer);
    sqlite3_bind_text(st, 4, name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_double(st, 5, time_us);
    return step_done(db, st, err, err_len, "cannot insert a kernel time");
}

int ar_db_insert_mismatch(ar_db *db, int64_t run, int64_t step, const ar_mismatch_row *m,
                          char *err, size_t err_len)
{
    sqlite3_stmt *st = db->st[ST_INSERT_MISMATCH];
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int64(st, 2, step);
    sqlite3_bind_int(st, 3, m->layer);
    sqlite3_bind_text(st, 4, m->req, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 5, m->token);
    sqlite3_bind_int(st, 6, m->head);
    sqlite3_bind_int(st, 7, m->dim);
    sqlite3_bind_double(st, 8, m->got);
    sqlite3_bind_double(st, 9, m->want);
    sqlite3_bind_double(st, 10, m->abs_err);
    return step_done(db, st, err, err_len, "cannot insert a mismatch");
}

int ar_db_update_progress(ar_db *db, int64_t run, int64_t steps_done, int64_t steps_failed,
                          int64_t last_step, char *err, size_t err_len)
{
    sqlite3_stmt *st = db->st[ST_PROGRESS];
    sqlite3_bind_int64(st, 1, steps_done);
    sqlite3_bind_int64(st, 2, steps_failed);
    sqlite3_bind_int64(st, 3, last_step);
    sqlite3_bind_int64(st, 4, run);
    return step_done(db, st, err, err_len, "cannot update the run's progress");
}

int ar_db_finish_run(ar_db *db, int64_t run, const char *status, const char *error, double now,
                     char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db->h, "UPDATE runs SET status=?, error=?, finished=? WHERE id=?", -1,
                           &st, NULL) != SQLITE_OK)
        return fail(db, err, err_len, "cannot prepare run update");
    sqlite3_bind_text(st, 1, status, -1, SQLITE_TRANSIENT);
    if (error) sqlite3_bind_text(st, 2, error, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 2);
    sqlite3_bind_double(st, 3, now);
    sqlite3_bind_int64(st, 4, run);
    int rc = sqlite3_step(st);
    if ((rc == SQLITE_FULL || rc == SQLITE_IOERR) && reserve_release(db)) {
        /* out of space: give back the reserve and try once more */
        sqlite3_reset(st);
        rc = sqlite3_step(st);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return fail(db, err, err_len, "cannot finish the run");
    return 0;
}
