/* db.c - the SQLite results database: schema and its migrations, WAL, prepared statements,
 * short batched transactions, and the writer that owns the database during a replay.
 *
 * Crash safety comes from SQLite itself: every batch of steps and the run's progress counters
 * commit in one transaction, and WAL mode keeps readers (report, diff) working during a replay.
 * A disk-full or I/O error inside a batch rolls the batch back, so the database always holds
 * whole steps only; the caller then marks the run 'error'.  That needs a little space, so each
 * process that opens a database for writing holds AR_DB_RESERVE_BYTES in a file with no name in
 * the database's directory and gives it back when the final status write fails for want of
 * space; if even that fails the run stays 'running' and --resume picks it up.  Having no name,
 * the reserve is the process's own (two writers of one database hold one each) and the system
 * frees it when the process ends, however it ends.  Error messages name the kind of I/O
 * failure.
 *
 * Locks: the writer's db_mu guards every use of the connection once the writer exists; q_mu
 * guards the queue of finished records and the pool.  Whoever writes takes db_mu, then q_mu,
 * and takes ALL pending records, so the steps committed are always a prefix of the steps
 * handed over (no gap), whether the writer thread, an inline flush or a signal watchdog
 * (ar_db_writer_abort) writes them. */
#include "db.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum {
    ST_INSERT_STEP,
    ST_INSERT_KERNEL,
    ST_INSERT_MISMATCH,
    ST_PROGRESS,
    ST_INSERT_COVERAGE,
    ST_COUNT
};

/* Bytes set aside beside a writable database and given back when a write fails for want of
 * space, so the run can still be marked 'error' on a full disk.  A few WAL frames are all that
 * needs. */
#define AR_DB_RESERVE_BYTES (128 * 1024)

struct ar_db {
    sqlite3 *h;
    sqlite3_stmt *st[ST_COUNT];
    char path[1024];
    int reserve_fd;   /* the reserve, a deleted file held open; valid while have_reserve */
    bool have_reserve;
    bool locked;      /* the last failure (fail()) was another connection's lock */
};

static const char *const phase_names[AR_PHASE_COUNT] = {
    "parse", "metadata", "generation", "kernel", "verify", "sqlite", "wait", "setup"};

const char *ar_phase_name(ar_phase p)
{
    return p >= 0 && p < AR_PHASE_COUNT ? phase_names[p] : "?";
}

/* An open file in the directory of the database (the directory its symlinks lead to: the file
 * system SQLite writes), with no name: O_TMPFILE where the file system has it, else a unique
 * name deleted at once.  -1 when neither works. */
static int reserve_open_unnamed(const char *db_path)
{
    char *real = realpath(db_path, NULL);
    const char *path = real ? real : db_path;
    char dir[1040];
    ar_path_dir(path, dir, sizeof dir);
    int fd = -1;
#ifdef O_TMPFILE
    fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
#endif
    if (fd < 0) {
        char tmpl[1100];
        if (snprintf(tmpl, sizeof tmpl, "%s-reserve-XXXXXX", path) < (int)sizeof tmpl) {
            fd = mkostemp(tmpl, O_CLOEXEC);
            if (fd >= 0) unlink(tmpl);
        }
    }
    free(real);
    return fd;
}

/* PATH-reserve, the named reserve earlier versions kept beside a database and deleted on close,
 * stays behind when such a process was killed: it is removed here when it is still exactly
 * what they made (a regular file of AR_DB_RESERVE_BYTES); any other file of that name is left
 * alone. */
static void reserve_remove_named(const char *db_path)
{
    char named[1040];
    if (snprintf(named, sizeof named, "%s-reserve", db_path) >= (int)sizeof named) return;
    struct stat st;
    if (lstat(named, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == AR_DB_RESERVE_BYTES) unlink(named);
}

/* Best effort: no reserve (no space even for it, odd file system) only loses the fallback. */
static void reserve_create(ar_db *db)
{
    reserve_remove_named(db->path);
    int fd = reserve_open_unnamed(db->path);
    if (fd < 0) return;
    if (posix_fallocate(fd, 0, AR_DB_RESERVE_BYTES) != 0) {
        close(fd);
        return;
    }
    db->reserve_fd = fd;
    db->have_reserve = true;
}

/* Gives the reserve's space back (truncated first, so the blocks are free at once even where a
 * forked child still holds the file); true when there was one to give back. */
static bool reserve_release(ar_db *db)
{
    if (!db->have_reserve) return false;
    if (ftruncate(db->reserve_fd, 0) != 0) {}   /* then the close frees it (once no child holds it) */
    close(db->reserve_fd);
    db->have_reserve = false;
    return true;
}

/* Version 1's tables and version 3's shards table; the columns later versions added to runs
 * and steps are added by migrate() (the same way for a new file and an old one, so both end
 * with the same schema). */
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
    " method TEXT);"
    "CREATE TABLE IF NOT EXISTS shards("
    " run INTEGER NOT NULL, shard INTEGER NOT NULL, source TEXT, source_run INTEGER,"
    " started REAL, finished REAL, host TEXT, device TEXT, device_index INTEGER, code_rev TEXT,"
    " launcher TEXT, status TEXT, error TEXT, step_first INTEGER, step_last INTEGER,"
    " layer_first INTEGER, layer_last INTEGER, steps_done INTEGER, steps_failed INTEGER,"
    " last_step INTEGER, parse_s REAL, metadata_s REAL, generation_s REAL, kernel_s REAL,"
    " verify_s REAL, sqlite_s REAL, wait_s REAL, setup_s REAL, wall_s REAL, merged REAL,"
    " PRIMARY KEY(run, shard));";

/* Columns added after version 1, by the version that added them: table, column, SQL type. */
static const char *const added_columns[][3] = {
    /* version 2 */
    {"runs", "verify_layers", "TEXT"},
    {"runs", "verify_where", "TEXT"},
    {"runs", "verified_steps", "INTEGER"},
    {"runs", "verified_layer_steps", "INTEGER"},
    {"runs", "verified_rows", "INTEGER"},
    {"runs", "parse_s", "REAL"},
    {"runs", "metadata_s", "REAL"},
    {"runs", "generation_s", "REAL"},
    {"runs", "kernel_s", "REAL"},
    {"runs", "verify_s", "REAL"},
    {"runs", "sqlite_s", "REAL"},
    {"runs", "wait_s", "REAL"},
    {"runs", "setup_s", "REAL"},
    {"runs", "wall_s", "REAL"},
    {"steps", "layers_verified", "INTEGER"},
    {"steps", "wall_us", "REAL"},
    /* version 3: sharded runs and merges */
    {"runs", "shard_index", "INTEGER"},
    {"runs", "shard_count", "INTEGER"},
    {"runs", "shard_by", "TEXT"},
    {"runs", "shard_step_first", "INTEGER"},
    {"runs", "shard_step_last", "INTEGER"},
    {"runs", "shard_layer_first", "INTEGER"},
    {"runs", "shard_layer_last", "INTEGER"},
    {"runs", "host", "TEXT"},
    {"runs", "device_index", "INTEGER"},
    {"runs", "launcher", "TEXT"},
    {"runs", "merged_shards", "INTEGER"},
    {"steps", "shard", "INTEGER"},
};
#define NUM_ADDED_COLUMNS (sizeof added_columns / sizeof added_columns[0])

/* Tables added by schema version 4 (created the same way in a new file and an old one). */
static const char *const v4_sql =
    "CREATE TABLE IF NOT EXISTS coverage("
    " run INTEGER NOT NULL, step INTEGER NOT NULL, path TEXT NOT NULL, layers INTEGER NOT NULL,"
    " verified_layers INTEGER NOT NULL, PRIMARY KEY(run, step, path));";

static const char *const stmt_sql[ST_COUNT] = {
    [ST_INSERT_STEP] =
        "INSERT INTO steps(run, step, time, num_reqs, num_tokens, num_prefill_reqs,"
        " num_decode_reqs, max_query_len, max_seq_len, total_context, cascade, prefix_len,"
        " time_us, bytes, flops, gbps, tflops, verified, rows_checked, max_abs, max_rel,"
        " mean_abs, nmse, lse_max_abs, nan_count, bad_count, naive_max_abs, naive_mean_abs,"
        " tol_max_abs, tol_mean_abs, guard_ok, pass, layers_verified, wall_us, shard)"
        " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    [ST_INSERT_KERNEL] = "INSERT OR REPLACE INTO kernels(run, step, layer, name, time_us)"
                         " VALUES(?,?,?,?,?)",
    [ST_INSERT_MISMATCH] = "INSERT INTO mismatches(run, step, layer, req, token, head, dim,"
                           " got, want, abs_err) VALUES(?,?,?,?,?,?,?,?,?,?)",
    [ST_PROGRESS] = "UPDATE runs SET steps_done = ?, steps_failed = ?, last_step = ?,"
                    " verified_steps = ?, verified_layer_steps = ?, verified_rows = ?,"
                    " parse_s = ?, metadata_s = ?, generation_s = ?, kernel_s = ?, verify_s = ?,"
                    " sqlite_s = ?, wait_s = ?, setup_s = ?, wall_s = ? WHERE id = ?",
    [ST_INSERT_COVERAGE] = "INSERT INTO coverage(run, step, path, layers, verified_layers) VALUES(?,?,?,?,?)",
};

void ar_path_dir(const char *path, char *dir, size_t len)
{
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, len, ".");
    else if (slash == path) snprintf(dir, len, "/");
    else snprintf(dir, len, "%.*s", (int)(slash - path), path);
}

const char *ar_db_io_reason(void *sqlite_handle)
{
    /* the OS error when SQLite kept it, else the cause a failed write (SQLITE_IOERR_WRITE,
     * SQLITE_FULL) nearly always has */
    sqlite3 *h = sqlite_handle;
    int sys = h ? sqlite3_system_errno(h) : 0;
    int ext = h ? sqlite3_extended_errcode(h) : 0;
    if (sys && ((ext & 0xff) == SQLITE_IOERR || (ext & 0xff) == SQLITE_FULL || (ext & 0xff) == SQLITE_CANTOPEN))
        return strerror(sys);
    if (ext == SQLITE_IOERR_WRITE || ext == SQLITE_FULL) return "a write failed: disk full or file size limit reached?";
    return "";
}

static int fail(ar_db *db, char *err, size_t err_len, const char *what)
{
    /* Another connection's lock past the busy timeout is said as every command says it
     * (db_lock.h) and remembered (ar_db_locked: exit 2); else what kind of I/O failure it was. */
    db->locked = ar_db_lock_error(db->h, db->path, what, err, err_len);
    if (db->locked) return -1;
    const char *why = ar_db_io_reason(db->h);
    snprintf(err, err_len, "%s: %s: %s%s%s%s", db->path, what, db->h ? sqlite3_errmsg(db->h) : "?",
             *why ? " (" : "", why, *why ? ")" : "");
    return -1;
}

int ar_db_check_writable(const char *path, char *err, size_t err_len)
{
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) {
            snprintf(err, err_len, "%s: cannot use as a database: %s", path, strerror(EISDIR));
            return -1;
        }
        if (!S_ISREG(sb.st_mode)) {   /* SQLite fails on it later with "disk I/O error (Illegal seek)" */
            snprintf(err, err_len, "%s: cannot use as a database: not a regular file (a FIFO, socket or device)", path);
            return -1;
        }
        if (access(path, R_OK | W_OK) != 0) {
            snprintf(err, err_len, "%s: cannot write the database: %s", path, strerror(errno));
            return -1;
        }
    } else if (errno != ENOENT) {
        snprintf(err, err_len, "%s: cannot use as a database: %s", path, strerror(errno));
        return -1;
    }
    /* The directory must take new files: the database itself, its -wal and -shm files. */
    char dir[1024];
    ar_path_dir(path, dir, sizeof dir);
    if (stat(dir, &sb) != 0) {
        snprintf(err, err_len, "%s: cannot create the database in %s: %s", path, dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(err, err_len, "%s: cannot create the database in %s: %s", path, dir, strerror(ENOTDIR));
        return -1;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(err, err_len, "%s: cannot create files in %s: %s", path, dir, strerror(errno));
        return -1;
    }
    return 0;
}

int ar_db_busy_timeout_ms(void)
{
    const char *s = getenv("ATTNREPLAY_BUSY_TIMEOUT_MS");
    if (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (!*end && v >= 0 && v <= 24L * 3600 * 1000) return (int)v;
    }
    return AR_DB_BUSY_TIMEOUT_MS;
}

bool ar_db_lock_error(void *sqlite_handle, const char *path, const char *what, char *err, size_t err_len)
{
    const int code = sqlite_handle ? sqlite3_errcode(sqlite_handle) & 0xff : SQLITE_OK;   /* BUSY_SNAPSHOT too */
    if (code != SQLITE_BUSY && code != SQLITE_LOCKED) return false;
    snprintf(err, err_len, "%s: %s%sthe database is locked by another connection's write (waited %d ms; "
             "ATTNREPLAY_BUSY_TIMEOUT_MS sets the wait)", path, what ? what : "", what ? ": " : "",
             ar_db_busy_timeout_ms());
    return true;
}

bool ar_db_locked(const ar_db *db)
{
    return db && db->locked;
}

int ar_db_has_column(void *sqlite_handle, const char *schema, const char *table, const char *column)
{
    sqlite3 *h = sqlite_handle;
    char sql[160];
    snprintf(sql, sizeof sql, "PRAGMA %s.table_info(%s)", schema, table);
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(h, sql, -1, &q, NULL) != SQLITE_OK) return -1;
    int found = 0, rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        const unsigned char *name = sqlite3_column_text(q, 1);
        if (name && strcmp((const char *)name, column) == 0) found = 1;
    }
    sqlite3_finalize(q);
    return rc == SQLITE_DONE ? found : -1;
}

int ar_db_schema_version(sqlite3 *h, const char *schema)
{
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT value FROM %s%smeta WHERE key='schema_version'", schema ? schema : "",
             schema ? "." : "");
    sqlite3_stmt *q = NULL;
    int version = 0;
    if (sqlite3_prepare_v2(h, sql, -1, &q, NULL) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW)
        version = sqlite3_column_int(q, 0);
    sqlite3_finalize(q);
    return version;
}

/* Brings the schema to AR_DB_SCHEMA_VERSION in one write transaction: version 1's tables (and
 * version 3's shards table), the missing later columns, version 4's coverage table, the version
 * number.  Nothing is written when all is in place. */
static int migrate(ar_db *db, char *err, size_t err_len)
{
    int missing = 0;
    for (size_t i = 0; i < NUM_ADDED_COLUMNS; i++) {
        int has = ar_db_has_column(db->h, "main", added_columns[i][0], added_columns[i][1]);
        if (has <= 0) missing = 1;   /* also when the table does not exist yet */
    }
    if (!missing && ar_db_schema_version(db->h, NULL) == AR_DB_SCHEMA_VERSION) return 0;
    char *msg = NULL;
    if (sqlite3_exec(db->h, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        return fail(db, err, err_len, "cannot set up the schema");
    if (sqlite3_exec(db->h, schema_sql, NULL, NULL, &msg) != SQLITE_OK ||
        sqlite3_exec(db->h, v4_sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, err_len, "%s: cannot set up the schema: %s", db->path, msg ? msg : "?");
        sqlite3_free(msg);
        ar_db_rollback(db);
        return -1;
    }
    for (size_t i = 0; i < NUM_ADDED_COLUMNS; i++) {
        int has = ar_db_has_column(db->h, "main", added_columns[i][0], added_columns[i][1]);
        if (has < 0) {
            ar_db_rollback(db);
            return fail(db, err, err_len, "cannot read the schema");
        }
        if (has) continue;
        char sql[200];
        snprintf(sql, sizeof sql, "ALTER TABLE %s ADD COLUMN %s %s", added_columns[i][0], added_columns[i][1],
                 added_columns[i][2]);
        if (sqlite3_exec(db->h, sql, NULL, NULL, NULL) != SQLITE_OK) {
            fail(db, err, err_len, "cannot migrate the schema");
            ar_db_rollback(db);
            return -1;
        }
    }
    char sql[128];
    snprintf(sql, sizeof sql, "INSERT OR REPLACE INTO meta(key, value) VALUES('schema_version', '%d')",
             AR_DB_SCHEMA_VERSION);
    if (sqlite3_exec(db->h, sql, NULL, NULL, NULL) != SQLITE_OK) {
        fail(db, err, err_len, "cannot write the schema version");
        ar_db_rollback(db);
        return -1;
    }
    return ar_db_commit(db, err, err_len);
}

/* SQLite's verdict on the file itself: not a database, or a damaged one (bad input, not I/O). */
static bool not_a_database(sqlite3 *h)
{
    int code = h ? sqlite3_errcode(h) & 0xff : 0;
    return code == SQLITE_NOTADB || code == SQLITE_CORRUPT;
}

/* Before anything is written: every table of this schema that the file already holds must have
 * the columns version 1 gave it (the tables schema_sql and v4_sql make in a scratch database
 * are the reference), so that another program's 'runs' or 'steps' is refused rather than
 * altered.  0; -1 with err (*input_error set for a foreign or damaged file). */
static int check_tables(ar_db *db, bool *input_error, char *err, size_t err_len)
{
    sqlite3 *ref = NULL;
    sqlite3_stmt *tables = NULL, *kind = NULL, *cols = NULL;
    int rc = -1;
    if (sqlite3_open_v2(":memory:", &ref, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK ||
        sqlite3_exec(ref, schema_sql, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(ref, v4_sql, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(ref, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name", -1, &tables,
                           NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: cannot check the schema: %s", db->path, ref ? sqlite3_errmsg(ref) : "out of memory");
        goto done;
    }
    if (sqlite3_prepare_v2(db->h, "SELECT type FROM main.sqlite_master WHERE name = ?", -1, &kind, NULL) != SQLITE_OK) {
        if (input_error) *input_error = not_a_database(db->h);
        fail(db, err, err_len, not_a_database(db->h) ? "not a readable SQLite database" : "cannot read the schema");
        goto done;
    }
    while (sqlite3_step(tables) == SQLITE_ROW) {
        const char *table = (const char *)sqlite3_column_text(tables, 0);
        sqlite3_reset(kind);
        sqlite3_bind_text(kind, 1, table, -1, SQLITE_TRANSIENT);
        int step = sqlite3_step(kind);
        if (step == SQLITE_DONE) continue;   /* not there yet: migrate() makes it */
        if (step != SQLITE_ROW) {
            if (input_error) *input_error = not_a_database(db->h);
            fail(db, err, err_len, "cannot read the schema");
            goto done;
        }
        const char *type = (const char *)sqlite3_column_text(kind, 0);
        if (!type || strcmp(type, "table") != 0) {
            snprintf(err, err_len, "%s: not an attnreplay results database: %s is a %s, not a table (another "
                     "program's? schema in replay/db.h); nothing was written", db->path, table, type ? type : "?");
            if (input_error) *input_error = true;
            goto done;
        }
        char sql[160];
        snprintf(sql, sizeof sql, "PRAGMA main.table_info(%s)", table);
        if (sqlite3_prepare_v2(ref, sql, -1, &cols, NULL) != SQLITE_OK) {
            snprintf(err, err_len, "%s: cannot check the schema: %s", db->path, sqlite3_errmsg(ref));
            goto done;
        }
        while (sqlite3_step(cols) == SQLITE_ROW) {
            const char *col = (const char *)sqlite3_column_text(cols, 1);
            int has = ar_db_has_column(db->h, "main", table, col);
            if (has < 0) {
                if (input_error) *input_error = not_a_database(db->h);
                fail(db, err, err_len, not_a_database(db->h) ? "not a readable SQLite database" : "cannot read the schema");
                goto done;
            }
            if (!has) {
                snprintf(err, err_len, "%s: not an attnreplay results database: its table %s has no column %s "
                         "(another program's table of that name? schema in replay/db.h); nothing was written",
                         db->path, table, col);
                if (input_error) *input_error = true;
                goto done;
            }
        }
        sqlite3_finalize(cols);
        cols = NULL;
    }
    rc = 0;
done:
    sqlite3_finalize(cols);
    sqlite3_finalize(kind);
    sqlite3_finalize(tables);
    sqlite3_close(ref);
    return rc;
}

/* ar_db_open's way out after a failure (err set): a lock held past the busy timeout is bad input
 * too; the database is closed.  NULL. */
static ar_db *open_failed(ar_db *db, bool *input_error)
{
    if (input_error && db->locked) *input_error = true;
    ar_db_close(db);
    return NULL;
}

/* What a writable open refuses before it writes: a file that is not SQLite or is damaged, another
 * program's tables of our names (check_tables), a newer schema.  0; -1 with err (*input_error
 * set for those, and for a lock held past the busy timeout, not for I/O). */
static int check_ours(ar_db *db, bool *input_error, char *err, size_t err_len)
{
    int rc = check_tables(db, input_error, err, err_len);
    if (rc == 0) {
        int version = ar_db_schema_version(db->h, NULL);
        if (version > AR_DB_SCHEMA_VERSION) {
            snprintf(err, err_len, "%s: schema version %d is newer than this attnreplay's %d", db->path, version,
                     AR_DB_SCHEMA_VERSION);
            if (input_error) *input_error = true;
            rc = -1;
        }
    }
    if (rc != 0 && input_error && db->locked) *input_error = true;
    return rc;
}

/* A connection to path with SQLite's open flags and the writers' busy timeout; NULL + err
 * (*input_error set for a lock). */
static ar_db *db_connect(const char *path, int flags, bool *input_error, char *err, size_t err_len)
{
    ar_db *db = calloc(1, sizeof *db);
    if (!db) {
        snprintf(err, err_len, "%s: out of memory", path);
        return NULL;
    }
    snprintf(db->path, sizeof db->path, "%s", path);
    if (sqlite3_open_v2(path, &db->h, flags | SQLITE_OPEN_FULLMUTEX, NULL) != SQLITE_OK) {
        fail(db, err, err_len, "cannot open database");
        return open_failed(db, input_error);
    }
    sqlite3_busy_timeout(db->h, ar_db_busy_timeout_ms());
    return db;
}

int ar_db_check_ours(const char *path, bool *input_error, char *err, size_t err_len)
{
    if (input_error) *input_error = false;
    struct stat sb;
    if (stat(path, &sb) != 0 || sb.st_size == 0) return 0;   /* a new database */
    /* read-write, not read-only: the last connection's close removes the -wal and -shm files a
     * WAL database's reader makes, so the directory is left as it was */
    ar_db *db = db_connect(path, SQLITE_OPEN_READWRITE, input_error, err, err_len);
    if (!db) return -1;
    int rc = check_ours(db, input_error, err, err_len);
    ar_db_close(db);
    return rc;
}

/* open_failed for a database this open created: the file it left (empty, or the first page
 * of a schema that could not be written: a full disk) and its -wal / -shm / -journal go too,
 * so a failed set-up leaves the directory as it was.  A file grown past one page meanwhile is
 * another writer's and is kept. */
static ar_db *open_failed_new(ar_db *db, const char *path, bool *input_error, bool created)
{
    open_failed(db, input_error);
    struct stat sb;
    if (!created || stat(path, &sb) != 0 || sb.st_size > 4096) return NULL;
    static const char *const sides[] = {"-wal", "-shm", "-journal"};
    for (size_t i = 0; i < sizeof sides / sizeof sides[0]; i++) {
        char side[PATH_MAX + 16];
        if (snprintf(side, sizeof side, "%s%s", path, sides[i]) < (int)sizeof side) unlink(side);
    }
    unlink(path);
    return NULL;
}

ar_db *ar_db_open(const char *path, bool readonly, bool *input_error, char *err, size_t err_len)
{
    if (input_error) *input_error = false;
    int flags = readonly ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    struct stat before;
    const bool created = !readonly && stat(path, &before) != 0 && errno == ENOENT;
    ar_db *db = db_connect(path, flags, input_error, err, err_len);
    if (!db || readonly) return db;

    /* Whose file it is, before anything is written to it (the WAL switch included): a file that
     * is not SQLite, a damaged one, another program's tables of our names and a newer schema
     * are refused as they are; an older schema is migrated below. */
    if (check_ours(db, input_error, err, err_len) != 0) return open_failed_new(db, path, input_error, created);
    reserve_create(db);
    if (sqlite3_exec(db->h, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", NULL, NULL, NULL) != SQLITE_OK) {
        fail(db, err, err_len, "cannot set up the database");
        if (input_error) *input_error = not_a_database(db->h);
        return open_failed_new(db, path, input_error, created);
    }
    if (migrate(db, err, err_len) != 0) return open_failed_new(db, path, input_error, created);
    for (int i = 0; i < ST_COUNT; i++) {
        if (sqlite3_prepare_v2(db->h, stmt_sql[i], -1, &db->st[i], NULL) != SQLITE_OK) {
            fail(db, err, err_len, "cannot prepare a statement");
            return open_failed_new(db, path, input_error, created);
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

int ar_db_compat_views(void *sqlite_handle, char *err, size_t err_len)
{
    sqlite3 *h = sqlite_handle;
    const char *const tables[2] = {"runs", "steps"};
    for (int t = 0; t < 2; t++) {
        char sql[2048];
        int n = snprintf(sql, sizeof sql, "CREATE TEMP VIEW %s AS SELECT *", tables[t]);
        int added = 0;
        for (size_t i = 0; i < NUM_ADDED_COLUMNS; i++) {
            if (strcmp(added_columns[i][0], tables[t]) != 0) continue;
            int has = ar_db_has_column(h, "main", tables[t], added_columns[i][1]);
            if (has < 0) {
                snprintf(err, err_len, "cannot read the schema of %s: %s", tables[t], sqlite3_errmsg(h));
                return -1;
            }
            if (has) continue;
            n += snprintf(sql + n, sizeof sql - (size_t)n, ", NULL AS %s", added_columns[i][1]);
            added++;
        }
        if (!added) continue;
        snprintf(sql + n, sizeof sql - (size_t)n, " FROM main.%s", tables[t]);
        if (sqlite3_exec(h, sql, NULL, NULL, NULL) != SQLITE_OK) {
            snprintf(err, err_len, "cannot make the compatibility view of %s: %s", tables[t], sqlite3_errmsg(h));
            return -1;
        }
    }
    return 0;
}

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
        " config, code_rev, seed, verify, inject, cascade, repeat, verify_layers, verify_where,"
        " shard_index, shard_count, shard_by, shard_step_first, shard_step_last, shard_layer_first,"
        " shard_layer_last, host, device_index, launcher,"
        " status, started, verified_steps, verified_layer_steps, verified_rows, parse_s, metadata_s,"
        " generation_s, kernel_s, verify_s, sqlite_s, wait_s, setup_s, wall_s)"
        " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,'running',?,0,0,0,0,0,0,0,0,0,0,0,0)";
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
    sqlite3_bind_text(st, i++, r->verify_layers ? r->verify_layers : "all", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, i++, r->verify_where ? r->verify_where : "host", -1, SQLITE_TRANSIENT);
    const ar_run_shard *sh = &r->shard;
    sqlite3_bind_int(st, i++, sh->count > 0 ? sh->index : 0);
    sqlite3_bind_int(st, i++, sh->count > 0 ? sh->count : 1);
    sqlite3_bind_text(st, i++, sh->by ? sh->by : "steps", -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, i++, sh->step_first);
    sqlite3_bind_int64(st, i++, sh->step_last);
    sqlite3_bind_int(st, i++, sh->layer_first);
    sqlite3_bind_int(st, i++, sh->layer_last);
    if (sh->host) sqlite3_bind_text(st, i++, sh->host, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, i++);
    sqlite3_bind_int(st, i++, sh->device_index);
    if (sh->launcher) sqlite3_bind_text(st, i++, sh->launcher, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, i++);
    sqlite3_bind_double(st, i++, now);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return fail(db, err, err_len, "cannot create the run");
    return (int64_t)sqlite3_last_insert_rowid(db->h);
}

int ar_db_find_resumable(ar_db *db, const char *trace_hash, const char *config, const ar_run_shard *shard,
                         int64_t *run_id, ar_run_progress *p, char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    /* the look-up and the claim in one write transaction: no other writer between them */
    if (ar_db_begin(db, err, err_len) != 0) return -1;
    /* runs of older schemas (no shard columns filled) are unsharded: shard 0 of 1, all steps */
    const char *sql = "SELECT id, last_step, steps_done, steps_failed, verified_steps,"
                      " verified_layer_steps, verified_rows, parse_s, metadata_s, generation_s,"
                      " kernel_s, verify_s, sqlite_s, wait_s, setup_s, wall_s FROM runs"
                      " WHERE trace_hash = ? AND config = ? AND merged_shards IS NULL"
                      " AND coalesce(shard_index, 0) = ? AND coalesce(shard_count, 1) = ?"
                      " AND coalesce(shard_by, 'steps') = ? AND coalesce(shard_step_first, ?6) = ?6"
                      " AND coalesce(shard_step_last, ?7) = ?7 AND coalesce(shard_layer_first, ?8) = ?8"
                      " AND coalesce(shard_layer_last, ?9) = ?9"
                      " AND status IN ('running', 'interrupted', 'error')"
                      " ORDER BY id DESC LIMIT 1";
    if (sqlite3_prepare_v2(db->h, sql, -1, &st, NULL) != SQLITE_OK) {
        fail(db, err, err_len, "cannot look for a run to resume");
        ar_db_rollback(db);
        return -1;
    }
    sqlite3_bind_text(st, 1, trace_hash, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, config, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 3, shard->count > 0 ? shard->index : 0);
    sqlite3_bind_int(st, 4, shard->count > 0 ? shard->count : 1);
    sqlite3_bind_text(st, 5, shard->by ? shard->by : "steps", -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 6, shard->step_first);
    sqlite3_bind_int64(st, 7, shard->step_last);
    sqlite3_bind_int(st, 8, shard->layer_first);
    sqlite3_bind_int(st, 9, shard->layer_last);
    int rc = sqlite3_step(st), found = 0;
    if (rc == SQLITE_ROW) {
        memset(p, 0, sizeof *p);
        *run_id = sqlite3_column_int64(st, 0);
        p->last_step = sqlite3_column_int64(st, 1);
        p->steps_done = sqlite3_column_int64(st, 2);
        p->steps_failed = sqlite3_column_int64(st, 3);
        p->verified_steps = sqlite3_column_int64(st, 4);        /* NULL (version 1) reads 0 */
        p->verified_layer_steps = sqlite3_column_int64(st, 5);
        p->verified_rows = sqlite3_column_int64(st, 6);
        for (int k = 0; k < AR_PHASE_COUNT; k++) p->phase_s[k] = sqlite3_column_double(st, 7 + k);
        p->wall_s = sqlite3_column_double(st, 7 + AR_PHASE_COUNT);
        found = 1;
    } else if (rc != SQLITE_DONE) {
        sqlite3_finalize(st);
        fail(db, err, err_len, "cannot look for a run to resume");
        ar_db_rollback(db);
        return -1;
    }
    sqlite3_finalize(st);
    if (found) {
        /* Steps past last_step cannot exist (same transaction). */
        char sql2[160];
        snprintf(sql2, sizeof sql2, "UPDATE runs SET status='running', error=NULL WHERE id=%lld",
                 (long long)*run_id);
        if (exec_simple(db, sql2, err, err_len) != 0) {
            ar_db_rollback(db);
            return -1;
        }
    }
    return ar_db_commit(db, err, err_len) == 0 ? found : -1;
}

int64_t ar_db_count_kernels(ar_db *db, int64_t run, const char *const *names, char *err, size_t err_len)
{
    int64_t total = 0;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db->h, "SELECT count(*) FROM kernels WHERE run = ? AND name = ?", -1, &st,
                           NULL) != SQLITE_OK)
        return fail(db, err, err_len, "cannot count kernel rows");
    for (int i = 0; names[i]; i++) {
        sqlite3_bind_int64(st, 1, run);
        sqlite3_bind_text(st, 2, names[i], -1, SQLITE_STATIC);
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) total += sqlite3_column_int64(st, 0);
        sqlite3_reset(st);
        if (rc != SQLITE_ROW) {
            sqlite3_finalize(st);
            return fail(db, err, err_len, "cannot count kernel rows");
        }
    }
    sqlite3_finalize(st);
    return total;
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
    sqlite3_bind_int(st, i++, s->layers_verified);
    sqlite3_bind_double(st, i++, s->wall_us);
    sqlite3_bind_int(st, i++, s->shard);
    return step_done(db, st, err, err_len, "cannot insert a step");
}

int ar_db_insert_kernel(ar_db *db, int64_t run, int64_t step, int layer, const char *name,
                        double time_us, char *err, size_t err_len)
{
    sqlite3_stmt *st = db->st[ST_INSERT_KERNEL];
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int64(st, 2, step);
    sqlite3_bind_int(st, 3, layer);
    sqlite3_bind_text(st, 4, name, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, 5, time_us);
    return step_done(db, st, err, err_len, "cannot insert a kernel time");
}

int ar_db_insert_coverage(ar_db *db, int64_t run, int64_t step, const char *path, int layers,
                          int verified_layers, char *err, size_t err_len)
{
    sqlite3_stmt *st = db->st[ST_INSERT_COVERAGE];
    sqlite3_bind_int64(st, 1, run);
    sqlite3_bind_int64(st, 2, step);
    sqlite3_bind_text(st, 3, path, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 4, layers);
    sqlite3_bind_int(st, 5, verified_layers);
    return step_done(db, st, err, err_len, "cannot insert a coverage row");
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

int ar_db_update_progress(ar_db *db, int64_t run, const ar_run_progress *p, char *err, size_t err_len)
{
    sqlite3_stmt *st = db->st[ST_PROGRESS];
    int i = 1;
    sqlite3_bind_int64(st, i++, p->steps_done);
    sqlite3_bind_int64(st, i++, p->steps_failed);
    sqlite3_bind_int64(st, i++, p->last_step);
    sqlite3_bind_int64(st, i++, p->verified_steps);
    sqlite3_bind_int64(st, i++, p->verified_layer_steps);
    sqlite3_bind_int64(st, i++, p->verified_rows);
    for (int k = 0; k < AR_PHASE_COUNT; k++) sqlite3_bind_double(st, i++, p->phase_s[k]);
    sqlite3_bind_double(st, i++, p->wall_s);
    sqlite3_bind_int64(st, i++, run);
    return step_done(db, st, err, err_len, "cannot update the run's progress");
}

/* The status write; with owned_last (not NULL) only while runs.last_step is still *owned_last,
 * in the same statement: 1 when it was not (another process wrote the run), else 0 or -1. */
static int finish_run_if(ar_db *db, int64_t run, const int64_t *owned_last, const char *status, const char *error,
                         double now, char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db->h, owned_last ? "UPDATE runs SET status=?, error=?, finished=? WHERE id=? AND last_step=?"
                                             : "UPDATE runs SET status=?, error=?, finished=? WHERE id=?", -1,
                           &st, NULL) != SQLITE_OK)
        return fail(db, err, err_len, "cannot prepare run update");
    sqlite3_bind_text(st, 1, status, -1, SQLITE_TRANSIENT);
    if (error) sqlite3_bind_text(st, 2, error, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 2);
    sqlite3_bind_double(st, 3, now);
    sqlite3_bind_int64(st, 4, run);
    if (owned_last) sqlite3_bind_int64(st, 5, *owned_last);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_FULL || rc == SQLITE_IOERR) {
        /* Out of space (or over a file size limit): give back the reserve, move the WAL's
         * committed pages into the database and empty the WAL, and try once more. */
        reserve_release(db);
        sqlite3_reset(st);
        sqlite3_wal_checkpoint_v2(db->h, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
        rc = sqlite3_step(st);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return fail(db, err, err_len, "cannot finish the run");
    return owned_last && sqlite3_changes(db->h) == 0 ? 1 : 0;
}

int ar_db_finish_run(ar_db *db, int64_t run, const char *status, const char *error, double now,
                     char *err, size_t err_len)
{
    return finish_run_if(db, run, NULL, status, error, now, err, err_len);
}

/* ---- step records ------------------------------------------------------------------------- */

int ar_step_record_add_kernel(ar_step_record *r, int layer, const char *name, double us)
{
    if (r->num_kernels == r->cap_kernels) {
        int cap = r->cap_kernels ? 2 * r->cap_kernels : 16;
        ar_kernel_row *k = realloc(r->kernels, (size_t)cap * sizeof *k);
        if (!k) return -1;
        r->kernels = k;
        r->cap_kernels = cap;
    }
    r->kernels[r->num_kernels++] = (ar_kernel_row){layer, name, us};
    return 0;
}

int ar_step_record_add_path(ar_step_record *r, const char *name, bool verified)
{
    for (int i = 0; i < r->num_paths; i++) {
        if (r->paths[i].name != name && strcmp(r->paths[i].name, name) != 0) continue;
        r->paths[i].layers++;
        r->paths[i].verified_layers += verified;
        return 0;
    }
    if (r->num_paths == r->cap_paths) {
        int cap = r->cap_paths ? 2 * r->cap_paths : 8;
        ar_path_row *p = realloc(r->paths, (size_t)cap * sizeof *p);
        if (!p) return -1;
        r->paths = p;
        r->cap_paths = cap;
    }
    r->paths[r->num_paths++] = (ar_path_row){name, 1, verified ? 1 : 0};
    return 0;
}

int ar_step_record_add_mismatch(ar_step_record *r, const ar_mismatch_row *m)
{
    if (r->num_mismatches >= AR_DB_RECORD_WORST) return 0;
    size_t len = strlen(m->req) + 1;
    if (r->req_len + len > r->req_cap) {
        size_t cap = r->req_cap ? r->req_cap : 256;
        while (cap < r->req_len + len) cap *= 2;
        char *t = realloc(r->req_text, cap);
        if (!t) return -1;
        r->req_text = t;
        r->req_cap = cap;
    }
    memcpy(r->req_text + r->req_len, m->req, len);
    ar_mismatch_row *dst = &r->mismatches[r->num_mismatches++];
    *dst = *m;
    dst->req = NULL;   /* resolved from req_text when written (the buffer may move until then) */
    r->req_len += len;
    return 0;
}

static void record_clear(ar_step_record *r)
{
    ar_kernel_row *k = r->kernels;
    int cap = r->cap_kernels;
    ar_path_row *p = r->paths;
    int pcap = r->cap_paths;
    char *t = r->req_text;
    size_t tcap = r->req_cap;
    memset(r, 0, sizeof *r);
    r->kernels = k;
    r->cap_kernels = cap;
    r->paths = p;
    r->cap_paths = pcap;
    r->req_text = t;
    r->req_cap = tcap;
}

static void record_free(ar_step_record *r)
{
    free(r->kernels);
    free(r->paths);
    free(r->req_text);
    free(r);
}

/* ---- the writer -------------------------------------------------------------------------- */

struct ar_db_writer {
    ar_db *db;
    int64_t run;
    bool threaded;
    pthread_t tid;
    bool thread_started;
    pthread_mutex_t db_mu;        /* the connection */
    pthread_mutex_t q_mu;         /* everything below */
    pthread_cond_t work_cv;       /* pending records are due, or stopping */
    pthread_cond_t space_cv;      /* pending fell below AR_DB_MAX_PENDING, or failed */
    ar_step_record *head, *tail;  /* pending, in step order */
    int pending;
    double first_pending_t;       /* monotonic time the oldest pending record arrived */
    ar_step_record *pool;         /* free records */
    bool stopping;                /* finish: write what is pending, then the thread ends */
    bool closed;                  /* abort took over: write nothing more */
    bool finished;                /* the run's status is written */
    bool failed;
    bool locked;                  /* ... on another connection's lock past the busy timeout */
    char error[1024];
    double sqlite_s;              /* time in SQLite this invocation (written under both locks) */
    double sqlite_base;           /* ... and in earlier invocations of a resumed run */
    int64_t kill_after;           /* ATTNREPLAY_TEST_KILL_AFTER_STEP (tests), -1 = off */
    int64_t owned_last;           /* runs.last_step as this writer last committed it (or found it) */
    bool lost;                    /* another process wrote the run meanwhile: write nothing more */
};

double ar_mono_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct timespec ar_deadline_in(double s)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ns = ts.tv_nsec + (long long)(s * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    return ts;
}

static bool due(const ar_db_writer *w)
{
    return w->pending >= AR_DB_COMMIT_STEPS ||
           (w->pending > 0 && ar_mono_seconds() - w->first_pending_t >= AR_DB_COMMIT_SECONDS);
}

/* Takes the whole pending list (under q_mu). */
static ar_step_record *take_pending(ar_db_writer *w)
{
    ar_step_record *list = w->head;
    w->head = w->tail = NULL;
    w->pending = 0;
    pthread_cond_broadcast(&w->space_cv);
    return list;
}

/* Returns a list of records to the pool (under q_mu). */
static void give_back(ar_db_writer *w, ar_step_record *list)
{
    while (list) {
        ar_step_record *next = list->next;
        record_clear(list);
        list->next = w->pool;
        w->pool = list;
        list = next;
    }
}

/* sqlite_s changes under db_mu and q_mu both, so either lock reads it. */
static void add_sqlite_time(ar_db_writer *w, double s)
{
    pthread_mutex_lock(&w->q_mu);
    w->sqlite_s += s;
    pthread_mutex_unlock(&w->q_mu);
}

/* Inside a write transaction (under db_mu): is the run still as this writer left it?  Another
 * process may have taken it meanwhile - a --resume of a run that was still running finds it
 * 'running' like a killed one - and committed steps of its own; then this writer stops without
 * touching the run (w->lost), so the two never mix their rows or overwrite each other's status.
 * 0, or -1 with err. */
static int check_owner(ar_db_writer *w, char *err, size_t err_len)
{
    ar_db *db = w->db;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db->h, "SELECT last_step, status FROM runs WHERE id = ?", -1, &st, NULL) != SQLITE_OK)
        return fail(db, err, err_len, "cannot read the run's progress");
    sqlite3_bind_int64(st, 1, w->run);
    int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        sqlite3_finalize(st);
        return fail(db, err, err_len, "cannot read the run's progress");
    }
    int64_t last = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    char status[32] = "";
    if (rc == SQLITE_ROW) snprintf(status, sizeof status, "%s", (const char *)sqlite3_column_text(st, 1));
    sqlite3_finalize(st);
    if (rc == SQLITE_ROW && last == w->owned_last) return 0;
    w->lost = true;
    if (rc != SQLITE_ROW)
        snprintf(err, err_len, "%s: run %lld is no longer in the database (deleted by another program?); this replay "
                 "stops", db->path, (long long)w->run);
    else
        snprintf(err, err_len, "%s: another process has written run %lld meanwhile (its last committed step is now "
                 "%lld, status '%s'; this replay's was %lld): two replays were writing one run (a --resume while it "
                 "still ran?); this one stops and leaves the run to the other", db->path, (long long)w->run,
                 (long long)last, status, (long long)w->owned_last);
    return -1;
}

/* Writes list in one transaction with the progress of its last record (under db_mu). */
static int write_batch(ar_db_writer *w, ar_step_record *list, char *err, size_t err_len)
{
    if (!list) return 0;
    double t0 = ar_mono_seconds();
    ar_db *db = w->db;
    const ar_step_record *last = NULL;
    if (ar_db_begin(db, err, err_len) != 0) goto fail;
    if (check_owner(w, err, err_len) != 0) goto fail;
    for (ar_step_record *r = list; r; r = r->next) {
        if (ar_db_insert_step(db, &r->row, err, err_len) != 0) goto fail;
        for (int k = 0; k < r->num_kernels; k++)
            if (ar_db_insert_kernel(db, r->row.run, r->row.step, r->kernels[k].layer, r->kernels[k].name,
                                    r->kernels[k].us, err, err_len) != 0)
                goto fail;
        for (int k = 0; k < r->num_paths; k++)
            if (ar_db_insert_coverage(db, r->row.run, r->row.step, r->paths[k].name, r->paths[k].layers,
                                      r->paths[k].verified_layers, err, err_len) != 0)
                goto fail;
        const char *req = r->req_text;
        for (int m = 0; m < r->num_mismatches; m++) {
            ar_mismatch_row row = r->mismatches[m];
            row.req = req;
            req += strlen(req) + 1;
            if (ar_db_insert_mismatch(db, r->row.run, r->row.step, &row, err, err_len) != 0) goto fail;
        }
        if (w->kill_after >= 0 && r->row.step >= w->kill_after) raise(SIGKILL);   /* kill test */
        last = r;
    }
    ar_run_progress p = last->progress;
    p.phase_s[AR_PHASE_SQLITE] = w->sqlite_base + w->sqlite_s + (ar_mono_seconds() - t0);
    if (ar_db_update_progress(db, w->run, &p, err, err_len) != 0) goto fail;
    if (ar_db_commit(db, err, err_len) != 0) goto fail;   /* commit rolls back on failure */
    w->owned_last = p.last_step;
    add_sqlite_time(w, ar_mono_seconds() - t0);
    return 0;
fail:
    ar_db_rollback(db);
    add_sqlite_time(w, ar_mono_seconds() - t0);
    return -1;
}

/* Writes list in order, in transactions of at most AR_DB_COMMIT_STEPS records (short, and the
 * same batches however far the step loop ran ahead); stops at the first that fails.  0 or -1;
 * the list stays whole for give_back. */
static int write_chunks(ar_db_writer *w, ar_step_record *list, char *err, size_t err_len)
{
    while (list) {
        ar_step_record *tail = list;
        for (int n = 1; n < AR_DB_COMMIT_STEPS && tail->next; n++) tail = tail->next;
        ar_step_record *rest = tail->next;
        tail->next = NULL;
        int rc = write_batch(w, list, err, err_len);
        tail->next = rest;
        if (rc != 0) return -1;
        list = rest;
    }
    return 0;
}

/* Takes and writes everything pending (db_mu then q_mu, see the file comment). */
static void flush(ar_db_writer *w)
{
    char err[1024];
    pthread_mutex_lock(&w->db_mu);
    pthread_mutex_lock(&w->q_mu);
    if (w->closed || w->failed) {
        pthread_mutex_unlock(&w->q_mu);
        pthread_mutex_unlock(&w->db_mu);
        return;
    }
    ar_step_record *list = take_pending(w);
    pthread_mutex_unlock(&w->q_mu);
    int rc = write_chunks(w, list, err, sizeof err);
    pthread_mutex_lock(&w->q_mu);
    if (rc != 0 && !w->failed) {
        w->failed = true;
        w->locked = w->db->locked && !w->lost;
        snprintf(w->error, sizeof w->error, "%s", err);
        give_back(w, take_pending(w));   /* later steps cannot follow a lost batch */
    }
    give_back(w, list);
    pthread_mutex_unlock(&w->q_mu);
    pthread_mutex_unlock(&w->db_mu);
}

static void *writer_main(void *arg)
{
    ar_db_writer *w = arg;
    pthread_mutex_lock(&w->q_mu);
    for (;;) {
        while (!w->stopping && !w->closed && !due(w)) {
            if (w->pending > 0) {
                double left = w->first_pending_t + AR_DB_COMMIT_SECONDS - ar_mono_seconds();
                struct timespec ts = ar_deadline_in(left > 0 ? left : 0);
                pthread_cond_timedwait(&w->work_cv, &w->q_mu, &ts);
            } else {
                pthread_cond_wait(&w->work_cv, &w->q_mu);
            }
        }
        if (w->closed || w->failed || (w->stopping && w->pending == 0)) break;
        pthread_mutex_unlock(&w->q_mu);
        flush(w);
        pthread_mutex_lock(&w->q_mu);
    }
    pthread_mutex_unlock(&w->q_mu);
    return NULL;
}

ar_db_writer *ar_db_writer_start(ar_db *db, int64_t run, int64_t last_step, bool threaded, double sqlite_base_s,
                                 char *err, size_t err_len)
{
    ar_db_writer *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    w->db = db;
    w->run = run;
    w->threaded = threaded;
    w->sqlite_base = sqlite_base_s;
    w->owned_last = last_step;
    const char *kill_env = getenv("ATTNREPLAY_TEST_KILL_AFTER_STEP");
    w->kill_after = kill_env ? strtoll(kill_env, NULL, 10) : -1;
    pthread_mutex_init(&w->db_mu, NULL);
    pthread_mutex_init(&w->q_mu, NULL);
    pthread_cond_init(&w->work_cv, NULL);
    pthread_cond_init(&w->space_cv, NULL);
    if (threaded) {
        int rc = pthread_create(&w->tid, NULL, writer_main, w);
        if (rc != 0) {
            snprintf(err, err_len, "cannot start the database writer thread: %s", strerror(rc));
            ar_db_writer_free(w);
            return NULL;
        }
        w->thread_started = true;
    }
    return w;
}

ar_step_record *ar_db_writer_record(ar_db_writer *w)
{
    pthread_mutex_lock(&w->q_mu);
    ar_step_record *r = w->pool;
    if (r) w->pool = r->next;
    pthread_mutex_unlock(&w->q_mu);
    if (!r) r = calloc(1, sizeof *r);
    if (r) r->next = NULL;
    return r;
}

void ar_db_writer_discard(ar_db_writer *w, ar_step_record *r)
{
    if (!r) return;
    r->next = NULL;
    pthread_mutex_lock(&w->q_mu);
    give_back(w, r);
    pthread_mutex_unlock(&w->q_mu);
}

int ar_db_writer_push(ar_db_writer *w, ar_step_record *r)
{
    pthread_mutex_lock(&w->q_mu);
    while (w->threaded && w->pending >= AR_DB_MAX_PENDING && !w->failed && !w->closed)
        pthread_cond_wait(&w->space_cv, &w->q_mu);
    if (w->failed || w->closed) {
        r->next = NULL;
        give_back(w, r);
        int rc = w->failed ? -1 : 0;
        pthread_mutex_unlock(&w->q_mu);
        return rc;
    }
    r->next = NULL;
    if (w->tail) w->tail->next = r;
    else {
        w->head = r;
        w->first_pending_t = ar_mono_seconds();
    }
    w->tail = r;
    w->pending++;
    bool now_due = due(w);
    /* the first pending record starts the writer's commit clock */
    if (w->threaded && (now_due || w->pending == 1)) pthread_cond_signal(&w->work_cv);
    pthread_mutex_unlock(&w->q_mu);
    if (now_due && !w->threaded) flush(w);
    pthread_mutex_lock(&w->q_mu);
    int rc = w->failed ? -1 : 0;
    pthread_mutex_unlock(&w->q_mu);
    return rc;
}

const char *ar_db_writer_error(ar_db_writer *w)
{
    pthread_mutex_lock(&w->q_mu);
    const char *e = w->failed ? w->error : NULL;
    pthread_mutex_unlock(&w->q_mu);
    return e;
}

bool ar_db_writer_locked(ar_db_writer *w)
{
    pthread_mutex_lock(&w->q_mu);
    bool locked = w->failed && w->locked;
    pthread_mutex_unlock(&w->q_mu);
    return locked;
}

double ar_db_writer_seconds(ar_db_writer *w)
{
    pthread_mutex_lock(&w->q_mu);
    double s = w->sqlite_base + w->sqlite_s;
    pthread_mutex_unlock(&w->q_mu);
    return s;
}

static void stop_thread(ar_db_writer *w)
{
    pthread_mutex_lock(&w->q_mu);
    w->stopping = true;
    pthread_cond_broadcast(&w->work_cv);
    pthread_mutex_unlock(&w->q_mu);
    if (w->thread_started) {
        pthread_join(w->tid, NULL);
        w->thread_started = false;
    }
}

int ar_db_writer_drain(ar_db_writer *w)
{
    stop_thread(w);   /* the thread writes what is pending before it ends */
    flush(w);         /* inline mode, or records pushed while it stopped */
    pthread_mutex_lock(&w->q_mu);
    int rc = w->failed ? -1 : 0;
    pthread_mutex_unlock(&w->q_mu);
    return rc;
}

int ar_db_writer_finish(ar_db_writer *w, const char *status, const char *error,
                        const ar_run_progress *final, double now, char *err, size_t err_len)
{
    ar_db_writer_drain(w);
    pthread_mutex_lock(&w->db_mu);
    pthread_mutex_lock(&w->q_mu);
    bool closed = w->closed, failed = w->failed;
    pthread_mutex_unlock(&w->q_mu);
    if (closed) {     /* an abort wrote the status already */
        pthread_mutex_unlock(&w->db_mu);
        return 0;
    }
    int rc = -1;
    double t0 = ar_mono_seconds();
    if (!failed) {
        ar_run_progress p = *final;
        p.phase_s[AR_PHASE_SQLITE] = w->sqlite_base + w->sqlite_s;
        if (ar_db_begin(w->db, err, err_len) == 0 && check_owner(w, err, err_len) == 0 &&
            ar_db_update_progress(w->db, w->run, &p, err, err_len) == 0 &&
            ar_db_finish_run(w->db, w->run, status, error, now, err, err_len) == 0 &&
            ar_db_commit(w->db, err, err_len) == 0)
            rc = 0;
        else
            ar_db_rollback(w->db);
    }
    /* After a failed batch, the progress of the last committed batch stands; only the status
     * is written (with the space reserve if the disk is full), and only while the run is still
     * this writer's.  A run another process took is left to it: nothing to write here. */
    if (rc != 0 && !w->lost) {
        rc = finish_run_if(w->db, w->run, &w->owned_last, status, error, now, err, err_len);
        if (rc == 1) w->lost = true;
    }
    if (w->lost) rc = 0;
    add_sqlite_time(w, ar_mono_seconds() - t0);
    pthread_mutex_lock(&w->q_mu);
    if (rc == 0) w->finished = true;
    pthread_mutex_unlock(&w->q_mu);
    pthread_mutex_unlock(&w->db_mu);
    return rc;
}

int ar_db_writer_abort(ar_db_writer *w, const char *status, const char *error, double now,
                       double wait_s)
{
    double t_end = ar_mono_seconds() + wait_s;
    struct timespec ts = ar_deadline_in(wait_s);
    if (pthread_mutex_timedlock(&w->db_mu, &ts) != 0) return -1;
    pthread_mutex_lock(&w->q_mu);
    if (w->finished) {
        pthread_mutex_unlock(&w->q_mu);
        pthread_mutex_unlock(&w->db_mu);
        return 1;
    }
    w->closed = true;
    ar_step_record *list = w->failed ? NULL : take_pending(w);
    pthread_cond_broadcast(&w->work_cv);
    pthread_cond_broadcast(&w->space_cv);
    pthread_mutex_unlock(&w->q_mu);
    double left = t_end - ar_mono_seconds();
    sqlite3_busy_timeout(w->db->h, left > 0.05 ? (int)(left * 1000) : 50);
    char err[1024];
    int rc = -1;
    if (write_chunks(w, list, err, sizeof err) == 0) {   /* the status only while the run is this writer's */
        int fin = finish_run_if(w->db, w->run, &w->owned_last, status, error, now, err, sizeof err);
        if (fin == 1) w->lost = true;
        rc = fin == 0 ? 0 : -1;
    }
    pthread_mutex_lock(&w->q_mu);
    give_back(w, list);
    if (rc == 0) w->finished = true;
    pthread_mutex_unlock(&w->q_mu);
    /* db_mu stays held: the caller ends the process, and nothing else may write. */
    return rc;
}

void ar_db_writer_free(ar_db_writer *w)
{
    if (!w) return;
    stop_thread(w);
    pthread_mutex_lock(&w->q_mu);
    give_back(w, take_pending(w));
    ar_step_record *r = w->pool;
    while (r) {
        ar_step_record *next = r->next;
        record_free(r);
        r = next;
    }
    pthread_mutex_unlock(&w->q_mu);
    pthread_mutex_destroy(&w->db_mu);
    pthread_mutex_destroy(&w->q_mu);
    pthread_cond_destroy(&w->work_cv);
    pthread_cond_destroy(&w->space_cv);
    free(w);
}
