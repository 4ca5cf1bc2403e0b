/* merge.c - `attnreplay merge OUT.db SHARD.db...`: the runs of a sharded replay (replay/shard.h),
 * one database per shard, made into one run of OUT.db that report, diff and plan read like any
 * other: every step exactly once, with the shard that replayed it (steps.shard), its kernels,
 * mismatches and kernel-path coverage, and the run's counters and status recomputed from what
 * was merged.
 *
 * How:
 *   1. Every shard database is ATTACHed read-only, one at a time, and its runs read.  They must
 *      be shards of one replay: the same trace (hash), the same options (runs.config), the same
 *      shard count and split; a difference is refused naming it, before anything is written.
 *      Two runs of one shard index: the newest (started) is taken, the other named.
 *   2. OUT.db (created and migrated if needed) gets one merged run per replay: runs.merged_shards
 *      counts its shards, runs.shard_index is NULL.  A later merge of the same replay adds to
 *      it; the manifest (table shards) remembers which run each shard came from, and a shard
 *      index merged from another run (a shard replayed again from scratch) is refused.
 *   3. Each shard is merged in its own transaction (BEGIN IMMEDIATE .. COMMIT): its steps not
 *      yet in the merged run, with their kernels, mismatches and coverage, its manifest row, and the
 *      merged run's counters.  So merging twice adds nothing, a shard merged while it ran (or
 *      after it was killed) gains its later steps when merged again after --resume, and a merge
 *      killed midway leaves whole shards.
 *   Shards that split layers each hold part of every step: their rows wait in shard_steps until
 *   every shard of a step is merged, then steps gets their combination, as one process replaying
 *   all layers would have written it: times, bytes, FLOPs, rows, counts summed; errors and
 *   tolerances the largest; pass 0 when any shard failed; mismatches of the first failing layer.
 *
 * The merged run's status: 'incomplete' while a shard is missing or did not finish (runs.error
 * says which), else what the engine would have said of the merged steps: 'failed', 'empty',
 * 'fault-not-fired', 'unverified' or 'passed'.  Phase times add up over the shards; wall_s is
 * the longest shard's.  Exit: 0 merged (the run's status says how complete it is), 2 bad input
 * (unreadable or mismatched shards, an OUT that is not an attnreplay database: ar_db_open; OUT
 * or a shard locked by another writer past the busy timeout), 3 a database error. */
#include "replay.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "db.h"

#define MERGE_PHASES 9   /* parse_s .. setup_s, wall_s */
static const char *const phase_cols[MERGE_PHASES] = {"parse_s", "metadata_s", "generation_s", "kernel_s", "verify_s",
                                                     "sqlite_s", "wait_s", "setup_s", "wall_s"};

/* One run found in a shard database. */
typedef struct shard_run {
    const char *path;            /* the shard database */
    int file;                    /* its index among the arguments */
    int64_t id;
    char *trace, *trace_hash, *backend, *device, *dtype, *kv_dtype, *model, *config, *code_rev;
    char *verify, *inject, *cascade, *verify_layers, *verify_where, *status, *error;
    char *shard_by, *host, *launcher;
    int64_t layers, seed, repeat;
    int64_t shard_index, shard_count, step_first, step_last, layer_first, layer_last, device_index;
    int64_t steps_done, steps_failed, last_step;
    bool merged;                 /* a merged run (merged_shards not NULL): not a shard */
    double started, finished;    /* finished NAN when NULL */
    double phases[MERGE_PHASES];
    bool dropped;                /* another run of the same shard index is newer */
} shard_run;

typedef struct merge_ctx {
    const char *out_path;
    sqlite3 *h;
    bool quiet;
    shard_run *runs;
    size_t num_runs;
    int64_t dst;                 /* the merged run, 0 until it exists */
    bool locked;                 /* a statement on OUT met another connection's lock past the busy timeout */
} merge_ctx;

static char *dup_text(sqlite3_stmt *st, int col)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    return strdup(t ? (const char *)t : "");
}

static void free_run(shard_run *r)
{
    char **texts[] = {&r->trace, &r->trace_hash, &r->backend, &r->device, &r->dtype, &r->kv_dtype, &r->model,
                      &r->config, &r->code_rev, &r->verify, &r->inject, &r->cascade, &r->verify_layers,
                      &r->verify_where, &r->status, &r->error, &r->shard_by, &r->host, &r->launcher};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) free(*texts[i]);
}

/* A statement on OUT failed: err in SQLite's words (msg, else the connection's), or for another
 * connection's lock past the busy timeout in db_lock.h's (m->locked: exit 2).  -1. */
static int out_failed(merge_ctx *m, const char *msg, char *err, size_t err_len)
{
    m->locked = ar_db_lock_error(m->h, m->out_path, NULL, err, err_len);
    if (!m->locked) snprintf(err, err_len, "%s: %s", m->out_path, msg ? msg : sqlite3_errmsg(m->h));
    return -1;
}

static int exec(merge_ctx *m, const char *sql, char *err, size_t err_len)
{
    char *msg = NULL;
    int rc = sqlite3_exec(m->h, sql, NULL, NULL, &msg) == SQLITE_OK ? 0 : out_failed(m, msg, err, err_len);
    sqlite3_free(msg);
    return rc;
}

/* Attaches the shard read-only as s.  0; 2 with err set when the file is refused (not SQLite,
 * damaged, unreadable, locked by another writer past the busy timeout); 3 on an I/O error or a
 * full disk (SQLite makes a WAL database's -shm file beside it even to read it). */
static int attach(merge_ctx *m, const char *path, char *err, size_t err_len)
{
    char *uri = sqlite3_mprintf("file:%s?mode=ro", path);
    char *sql = uri ? sqlite3_mprintf("ATTACH %Q AS s", uri) : NULL;
    int rc = sql ? sqlite3_exec(m->h, sql, NULL, NULL, NULL) : SQLITE_NOMEM;
    sqlite3_free(sql);
    sqlite3_free(uri);
    if (rc != SQLITE_OK) {
        if (ar_db_lock_error(m->h, path, "cannot open the shard database read-only", err, err_len)) return 2;
        int code = sqlite3_errcode(m->h) & 0xff;
        bool io = rc == SQLITE_NOMEM || code == SQLITE_IOERR || code == SQLITE_FULL || code == SQLITE_NOMEM;
        snprintf(err, err_len, "%s: cannot open the shard database read-only: %s%s", path, sqlite3_errmsg(m->h),
                 io ? " (a full disk or a file size limit?)" : "");
        return io ? 3 : 2;
    }
    return 0;
}

static void detach(merge_ctx *m)
{
    sqlite3_exec(m->h, "DETACH s", NULL, NULL, NULL);
}

/* An expression for a runs column of the attached shard: the column, or NULL when its schema
 * predates it. */
static const char *col(sqlite3 *h, const char *table, const char *name)
{
    return ar_db_has_column(h, "s", table, name) == 1 ? name : "NULL";
}

/* The columns the merge copies from a shard's tables (db.c's schema; coverage only where the shard
 * has it, version 4), NULL-ended, each list after its table. */
static const char *const copied_cols[] = {
    "steps", "run", "step", NULL,
    "kernels", "run", "step", "layer", "name", "time_us", NULL,
    "mismatches", "run", "step", "layer", "req", "token", "head", "dim", "got", "want", "abs_err", NULL,
    NULL,
};

/* Before anything is written to OUT: the attached shard's pages are whole (SQLite's quick_check)
 * and the tables the merge copies have their columns, so that a damaged shard is refused by name
 * instead of failing midway as an error of OUT.  0, or -1 with err set (bad input). */
static int check_shard_file(merge_ctx *m, const char *path, char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    char verdict[512] = "";
    int rc = sqlite3_prepare_v2(m->h, "PRAGMA s.quick_check(1)", -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const unsigned char *t = sqlite3_column_text(st, 0);
        snprintf(verdict, sizeof verdict, "%s", t ? (const char *)t : "?");
    } else {
        snprintf(verdict, sizeof verdict, "%s", sqlite3_errmsg(m->h));
    }
    sqlite3_finalize(st);
    if (strcmp(verdict, "ok") != 0) {
        snprintf(err, err_len, "%s: damaged database (SQLite's quick_check: %s); replay the shard again or give an "
                 "undamaged copy", path, verdict);
        return -1;
    }
    for (size_t i = 0; copied_cols[i]; i++) {
        const char *table = copied_cols[i++];
        for (; copied_cols[i]; i++) {
            int has = ar_db_has_column(m->h, "s", table, copied_cols[i]);
            if (has != 1) {
                snprintf(err, err_len, "%s: not an attnreplay results database: its table %s has no column %s "
                         "(schema in replay/db.h)", path, table, copied_cols[i]);
                return -1;
            }
        }
    }
    return 0;
}

/* Reads every run of the attached shard database (file index f) into m->runs. */
static int read_runs(merge_ctx *m, const char *path, int f, char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    int tables = -1;
    if (sqlite3_prepare_v2(m->h, "SELECT count(*) FROM s.sqlite_master WHERE type='table' AND name IN ('runs','steps')",
                           -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        tables = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    if (tables < 0 && ar_db_lock_error(m->h, path, NULL, err, err_len)) return -1;
    if (tables != 2) {
        snprintf(err, err_len, "%s: %s", path, tables < 0 ? "not a readable SQLite database"
                 : "not an attnreplay results database (tables 'runs' and 'steps' missing)");
        return -1;
    }
    int version = ar_db_schema_version(m->h, "s");
    if (version > AR_DB_SCHEMA_VERSION) {
        snprintf(err, err_len, "%s: schema version %d is newer than this attnreplay's %d", path, version,
                 AR_DB_SCHEMA_VERSION);
        return -1;
    }
    if (check_shard_file(m, path, err, err_len) != 0) return -1;
    char *sql = sqlite3_mprintf(
        "SELECT id, trace, trace_hash, backend, device, dtype, kv_dtype, model, config, code_rev, verify, inject,"
        " cascade, %s, %s, status, error, %s, %s, %s, layers, seed, repeat, %s, %s, %s, %s, %s, %s, %s, %s,"
        " steps_done, steps_failed, last_step, started, finished, %s, %s, %s, %s, %s, %s, %s, %s, %s"
        " FROM s.runs ORDER BY id",
        col(m->h, "runs", "verify_layers"), col(m->h, "runs", "verify_where"), col(m->h, "runs", "shard_by"),
        col(m->h, "runs", "host"), col(m->h, "runs", "launcher"), col(m->h, "runs", "shard_index"),
        col(m->h, "runs", "shard_count"), col(m->h, "runs", "shard_step_first"), col(m->h, "runs", "shard_step_last"),
        col(m->h, "runs", "shard_layer_first"), col(m->h, "runs", "shard_layer_last"),
        col(m->h, "runs", "device_index"), col(m->h, "runs", "merged_shards"),
        col(m->h, "runs", phase_cols[0]), col(m->h, "runs", phase_cols[1]), col(m->h, "runs", phase_cols[2]),
        col(m->h, "runs", phase_cols[3]), col(m->h, "runs", phase_cols[4]), col(m->h, "runs", phase_cols[5]),
        col(m->h, "runs", phase_cols[6]), col(m->h, "runs", phase_cols[7]), col(m->h, "runs", phase_cols[8]));
    int rc = sql ? sqlite3_prepare_v2(m->h, sql, -1, &st, NULL) : SQLITE_NOMEM;
    sqlite3_free(sql);
    if (rc != SQLITE_OK) {
        snprintf(err, err_len, "%s: cannot read its runs: %s", path, sqlite3_errmsg(m->h));
        return -1;
    }
    size_t before = m->num_runs;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        shard_run *grown = realloc(m->runs, (m->num_runs + 1) * sizeof *grown);
        if (!grown) {
            rc = SQLITE_NOMEM;
            break;
        }
        m->runs = grown;
        shard_run *r = &m->runs[m->num_runs++];
        memset(r, 0, sizeof *r);
        r->path = path;
        r->file = f;
        int c = 0;
        r->id = sqlite3_column_int64(st, c++);
        char **texts[] = {&r->trace, &r->trace_hash, &r->backend, &r->device, &r->dtype, &r->kv_dtype, &r->model,
                          &r->config, &r->code_rev, &r->verify, &r->inject, &r->cascade, &r->verify_layers,
                          &r->verify_where, &r->status, &r->error, &r->shard_by, &r->host, &r->launcher};
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) *texts[i] = dup_text(st, c++);
        if (!*r->verify_layers) {
            free(r->verify_layers);
            r->verify_layers = strdup("all");
        }
        if (!*r->verify_where) {
            free(r->verify_where);
            r->verify_where = strdup("host");
        }
        if (!*r->shard_by) {
            free(r->shard_by);
            r->shard_by = strdup("steps");
        }
        r->layers = sqlite3_column_int64(st, c++);
        r->seed = sqlite3_column_int64(st, c++);
        r->repeat = sqlite3_column_int64(st, c++);
        bool old = sqlite3_column_type(st, c + 1) == SQLITE_NULL;   /* no shard fields: shard 0 of 1 */
        r->shard_index = old ? 0 : sqlite3_column_int64(st, c);
        c++;
        r->shard_count = old ? 1 : sqlite3_column_int64(st, c);
        c++;
        r->step_first = sqlite3_column_type(st, c) == SQLITE_NULL ? 0 : sqlite3_column_int64(st, c);
        c++;
        r->step_last = sqlite3_column_type(st, c) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, c);
        c++;
        r->layer_first = sqlite3_column_type(st, c) == SQLITE_NULL ? 0 : sqlite3_column_int64(st, c);
        c++;
        r->layer_last = sqlite3_column_type(st, c) == SQLITE_NULL ? r->layers - 1 : sqlite3_column_int64(st, c);
        c++;
        r->device_index = sqlite3_column_int64(st, c++);
        r->merged = sqlite3_column_type(st, c++) != SQLITE_NULL;
        r->steps_done = sqlite3_column_int64(st, c++);
        r->steps_failed = sqlite3_column_int64(st, c++);
        r->last_step = sqlite3_column_int64(st, c++);
        r->started = sqlite3_column_double(st, c++);
        r->finished = sqlite3_column_type(st, c) == SQLITE_NULL ? NAN : sqlite3_column_double(st, c);
        c++;
        for (int k = 0; k < MERGE_PHASES; k++) r->phases[k] = sqlite3_column_double(st, c++);
        bool oom = false;
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) oom |= !*texts[i];
        if (oom) {
            rc = SQLITE_NOMEM;
            break;
        }
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        snprintf(err, err_len, "%s: cannot read its runs: %s", path,
                 rc == SQLITE_NOMEM ? "out of memory" : sqlite3_errmsg(m->h));
        return -1;
    }
    if (m->num_runs == before) {
        snprintf(err, err_len, "%s: the database holds no runs", path);
        return -1;
    }
    for (size_t i = before; i < m->num_runs; i++) {
        if (m->runs[i].merged) {
            snprintf(err, err_len, "%s: run %lld is itself a merge of %lld shards; give the shard databases", path,
                     (long long)m->runs[i].id, (long long)m->runs[i].shard_count);
            return -1;
        }
    }
    return 0;
}

/* The options that differ between two runs' config JSON, as "key A vs B; ..." in buf. */
static void config_difference(const char *a, const char *b, char *buf, size_t len)
{
    json_t *ja = json_loads(a, 0, NULL), *jb = json_loads(b, 0, NULL);
    buf[0] = '\0';
    if (!json_is_object(ja) || !json_is_object(jb)) {
        snprintf(buf, len, "%s vs %s", a, b);
        json_decref(ja);
        json_decref(jb);
        return;
    }
    size_t at = 0;
    int listed = 0;
    for (int pass = 0; pass < 2; pass++) {
        json_t *x = pass ? jb : ja, *y = pass ? ja : jb;
        const char *key;
        json_t *vx;
        json_object_foreach(x, key, vx) {
            json_t *vy = json_object_get(y, key);
            if (pass == 1 && vy) continue;   /* keys in both were compared in the first pass */
            if (vy && json_equal(vx, vy)) continue;
            char *sx = json_dumps(vx, JSON_ENCODE_ANY | JSON_COMPACT), *sy = vy ? json_dumps(vy, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
            const char *first = pass ? (sy ? sy : "(unset)") : sx, *second = pass ? sx : (sy ? sy : "(unset)");
            if (at < len && listed < 6)
                at += (size_t)snprintf(buf + at, len - at, "%s%s %s vs %s", listed ? "; " : "", key,
                                       first ? first : "?", second ? second : "?");
            listed++;
            free(sx);
            free(sy);
        }
    }
    if (!listed) snprintf(buf, len, "(equal as JSON, different as text)");
    json_decref(ja);
    json_decref(jb);
}

/* Refuses runs that are not shards of one replay (names the difference), takes the newest run
 * of each shard index.  0, or -1 with err set. */
static int check_group(merge_ctx *m, char *err, size_t err_len)
{
    const shard_run *a = &m->runs[0];
    for (size_t i = 1; i < m->num_runs; i++) {
        const shard_run *b = &m->runs[i];
        char what[1024] = "";
        if (strcmp(a->trace_hash, b->trace_hash) != 0)
            snprintf(what, sizeof what, "they replay different traces: %s (hash %s) vs %s (hash %s)", a->trace,
                     a->trace_hash, b->trace, b->trace_hash);
        else if (strcmp(a->config, b->config) != 0) {
            char diff[800];
            config_difference(a->config, b->config, diff, sizeof diff);
            snprintf(what, sizeof what, "they were replayed with different options: %s", diff);
        } else if (a->shard_count != b->shard_count)
            snprintf(what, sizeof what, "different shard counts: %lld vs %lld", (long long)a->shard_count,
                     (long long)b->shard_count);
        else if (strcmp(a->shard_by, b->shard_by) != 0)
            snprintf(what, sizeof what, "different splits: shard by %s vs by %s", a->shard_by, b->shard_by);
        if (what[0]) {
            snprintf(err, err_len, "run %lld of %s (shard %lld/%lld) and run %lld of %s (shard %lld/%lld) are not shards "
                     "of one replay: %s", (long long)a->id, a->path, (long long)a->shard_index,
                     (long long)a->shard_count, (long long)b->id, b->path, (long long)b->shard_index,
                     (long long)b->shard_count, what);
            return -1;
        }
    }
    for (size_t i = 0; i < m->num_runs; i++) {
        shard_run *r = &m->runs[i];
        if (r->shard_index < 0 || r->shard_index >= r->shard_count) {
            snprintf(err, err_len, "%s: run %lld says it is shard %lld of %lld", r->path, (long long)r->id,
                     (long long)r->shard_index, (long long)r->shard_count);
            return -1;
        }
        for (size_t j = 0; j < i; j++) {
            shard_run *q = &m->runs[j];
            if (q->dropped || q->shard_index != r->shard_index) continue;
            shard_run *older = q->started <= r->started ? q : r, *newer = older == q ? r : q;
            older->dropped = true;
            if (!m->quiet)
                fprintf(stderr, "merge: shard %lld/%lld: run %lld of %s is newer than run %lld of %s; the older is "
                        "left out\n", (long long)r->shard_index, (long long)r->shard_count, (long long)newer->id,
                        newer->path, (long long)older->id, older->path);
            if (older == r) break;
        }
    }
    /* Every shard computes the same plan from the trace, the options and the count; ranges that
     * overlap, or leave a gap between neighbours, mean the shards planned differently. */
    if (strcmp(a->shard_by, "steps") == 0 && a->shard_count > 1) {
        const shard_run *prev = NULL;
        for (int64_t k = 0; k < a->shard_count; k++) {
            const shard_run *r = NULL;
            for (size_t i = 0; i < m->num_runs && !r; i++)
                if (!m->runs[i].dropped && m->runs[i].shard_index == k) r = &m->runs[i];
            if (!r || r->step_first > r->step_last) continue;
            if (prev && (r->step_first <= prev->step_last ||
                         (prev->shard_index == k - 1 && r->step_first != prev->step_last + 1))) {
                snprintf(err, err_len, "shard %lld/%lld (%s: steps %lld..%lld) and shard %lld (%s: steps %lld..%lld) were "
                         "planned differently (a different attnreplay or trace?): replay every shard with the same "
                         "build and options", (long long)prev->shard_index, (long long)a->shard_count, prev->path,
                         (long long)prev->step_first, (long long)prev->step_last, (long long)k, r->path,
                         (long long)r->step_first, (long long)r->step_last);
                return -1;
            }
            prev = r;
        }
    }
    return 0;
}

/* The merged run of this replay in OUT (0 when none yet); refuses a shard index merged before
 * from another run.  0, or -1 with err set (2) or a database error (3: *code; a lock: m->locked). */
static int find_merged_run(merge_ctx *m, int *code, char *err, size_t err_len)
{
    const shard_run *a = &m->runs[0];
    sqlite3_stmt *st = NULL;
    *code = 3;
    if (sqlite3_prepare_v2(m->h, "SELECT id FROM runs WHERE merged_shards IS NOT NULL AND trace_hash = ? AND config = ?"
                           " AND shard_count = ? AND shard_by = ? ORDER BY id DESC LIMIT 1", -1, &st, NULL) != SQLITE_OK)
        return out_failed(m, NULL, err, err_len);
    sqlite3_bind_text(st, 1, a->trace_hash, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, a->config, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 3, a->shard_count);
    sqlite3_bind_text(st, 4, a->shard_by, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    m->dst = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    sqlite3_finalize(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return out_failed(m, NULL, err, err_len);
    if (!m->dst) return 0;
    if (sqlite3_prepare_v2(m->h, "SELECT source, source_run, started, host FROM shards WHERE run = ? AND shard = ?", -1,
                           &st, NULL) != SQLITE_OK)
        return out_failed(m, NULL, err, err_len);
    for (size_t i = 0; i < m->num_runs; i++) {
        const shard_run *r = &m->runs[i];
        if (r->dropped) continue;
        sqlite3_bind_int64(st, 1, m->dst);
        sqlite3_bind_int64(st, 2, r->shard_index);
        if (sqlite3_step(st) == SQLITE_ROW) {
            const char *host = (const char *)sqlite3_column_text(st, 3);
            if (sqlite3_column_double(st, 2) != r->started || strcmp(host ? host : "", r->host) != 0) {
                const char *source = (const char *)sqlite3_column_text(st, 0);
                time_t then = (time_t)sqlite3_column_double(st, 2), now = (time_t)r->started;
                char a_when[32], b_when[32];
                strftime(a_when, sizeof a_when, "%Y-%m-%d %H:%M:%S", localtime(&then));
                strftime(b_when, sizeof b_when, "%Y-%m-%d %H:%M:%S", localtime(&now));
                snprintf(err, err_len, "shard %lld/%lld of run %lld in %s was merged from run %lld of %s (started %s), "
                         "not from run %lld of %s (started %s): a shard replayed again from scratch cannot join the "
                         "steps of the first; merge all shards into a new database", (long long)r->shard_index,
                         (long long)r->shard_count, (long long)m->dst, m->out_path,
                         (long long)sqlite3_column_int64(st, 1), source ? source : "?", a_when, (long long)r->id,
                         r->path, b_when);
                sqlite3_finalize(st);
                *code = 2;
                return -1;
            }
        }
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    return 0;
}

/* The layers of the replay: the config's "layers" (a layer shard's runs.layers counts its own). */
static int64_t group_layers(const shard_run *r)
{
    json_t *j = json_loads(r->config, 0, NULL);
    json_t *v = j ? json_object_get(j, "layers") : NULL;
    int64_t layers = json_is_integer(v) ? (int64_t)json_integer_value(v) : r->layers;
    json_decref(j);
    return layers;
}

static int create_merged_run(merge_ctx *m, const shard_run *a, char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    const char *sql =
        "INSERT INTO runs(trace, trace_hash, backend, device, dtype, kv_dtype, model, layers, config, code_rev,"
        " seed, verify, inject, cascade, repeat, verify_layers, verify_where, status, started, shard_index,"
        " shard_count, shard_by, merged_shards, host, launcher)"
        " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,'incomplete',?,NULL,?,?,0,?,'merge')";
    if (sqlite3_prepare_v2(m->h, sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: cannot create the merged run: %s", m->out_path, sqlite3_errmsg(m->h));
        return -1;
    }
    int i = 1;
    const char *texts[] = {a->trace, a->trace_hash, a->backend, a->device, a->dtype, a->kv_dtype, a->model};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) sqlite3_bind_text(st, i++, texts[k], -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, i++, group_layers(a));
    sqlite3_bind_text(st, i++, a->config, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, i++, a->code_rev, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, i++, a->seed);
    sqlite3_bind_text(st, i++, a->verify, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, i++, a->inject, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, i++, a->cascade, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, i++, a->repeat);
    sqlite3_bind_text(st, i++, a->verify_layers, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, i++, a->verify_where, -1, SQLITE_STATIC);
    sqlite3_bind_double(st, i++, a->started);
    sqlite3_bind_int64(st, i++, a->shard_count);
    sqlite3_bind_text(st, i++, a->shard_by, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, i++, a->host, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        snprintf(err, err_len, "%s: cannot create the merged run: %s", m->out_path, sqlite3_errmsg(m->h));
        return -1;
    }
    m->dst = sqlite3_last_insert_rowid(m->h);
    return 0;
}

/* The steps columns of OUT other than run and shard, each as the attached shard has it (or NULL
 * when its schema predates the column): names into cols, expressions into src.  0 or -1. */
static int step_columns(merge_ctx *m, char *cols, size_t cols_len, char *src, size_t src_len, char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(m->h, "PRAGMA main.table_info(steps)", -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: %s", m->out_path, sqlite3_errmsg(m->h));
        return -1;
    }
    const int name_col = 1;
    size_t a = 0, b = 0;
    cols[0] = src[0] = '\0';
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, name_col);
        if (!name || !strcmp(name, "run") || !strcmp(name, "shard")) continue;
        const char *expr = ar_db_has_column(m->h, "s", "steps", name) == 1 ? name : "NULL";
        a += (size_t)snprintf(cols + a, a < cols_len ? cols_len - a : 0, ", %s", name);
        b += (size_t)snprintf(src + b, b < src_len ? src_len - b : 0, ", %s", expr);
    }
    sqlite3_finalize(st);
    if (a >= cols_len || b >= src_len) {
        snprintf(err, err_len, "too many step columns");
        return -1;
    }
    return 0;
}

/* Binds ?1 = dst, ?2 = source run, ?3 = shard and runs sql (a statement with those parameters).
 * Returns the rows changed, or -1 with err set. */
static int64_t run_sql(merge_ctx *m, const char *sql, int64_t src, int64_t shard, char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(m->h, sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: %s (in: %.200s)", m->out_path, sqlite3_errmsg(m->h), sql);
        return -1;
    }
    int n = sqlite3_bind_parameter_count(st);
    if (n >= 1) sqlite3_bind_int64(st, 1, m->dst);
    if (n >= 2) sqlite3_bind_int64(st, 2, src);
    if (n >= 3) sqlite3_bind_int64(st, 3, shard);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        snprintf(err, err_len, "%s: %s", m->out_path, sqlite3_errmsg(m->h));
        return -1;
    }
    return sqlite3_changes64(m->h);
}

/* How one layer-split step is combined from its shards' rows (see the file comment). */
static const char *const combine_sql =
    "INSERT OR REPLACE INTO main.steps(run, step, time, num_reqs, num_tokens, num_prefill_reqs, num_decode_reqs,"
    " max_query_len, max_seq_len, total_context, cascade, prefix_len, time_us, bytes, flops, gbps, tflops, verified,"
    " rows_checked, max_abs, max_rel, mean_abs, nmse, lse_max_abs, nan_count, bad_count, naive_max_abs,"
    " naive_mean_abs, tol_max_abs, tol_mean_abs, guard_ok, pass, layers_verified, wall_us, shard)"
    " SELECT ?1, step, min(time), min(num_reqs), min(num_tokens), min(num_prefill_reqs), min(num_decode_reqs),"
    " min(max_query_len), min(max_seq_len), min(total_context), max(cascade), max(prefix_len), sum(time_us),"
    " sum(bytes), sum(flops),"
    " CASE WHEN sum(time_us) > 0 THEN sum(bytes) / (sum(time_us) * 1e3) ELSE 0 END,"
    " CASE WHEN sum(time_us) > 0 THEN sum(flops) / (sum(time_us) * 1e6) ELSE 0 END,"
    " coalesce(max(CASE WHEN verified != 'off' THEN verified END), 'off'), sum(rows_checked),"
    /* a verified row stores NaN errors as NULL: the step's error is then NaN (NULL) too */
    " CASE WHEN sum(verified != 'off' AND max_abs IS NULL) > 0 THEN NULL ELSE max(max_abs) END,"
    " CASE WHEN sum(verified != 'off' AND max_rel IS NULL) > 0 THEN NULL ELSE max(max_rel) END,"
    " CASE WHEN sum(verified != 'off' AND mean_abs IS NULL) > 0 THEN NULL ELSE max(mean_abs) END,"
    " CASE WHEN sum(verified != 'off' AND nmse IS NULL) > 0 THEN NULL ELSE max(nmse) END,"
    " CASE WHEN sum(verified != 'off' AND lse_max_abs IS NULL) > 0 THEN NULL ELSE max(lse_max_abs) END,"
    " sum(nan_count), sum(bad_count), max(naive_max_abs), max(naive_mean_abs), max(tol_max_abs), max(tol_mean_abs),"
    " min(guard_ok), CASE WHEN min(pass) = 0 THEN 0 WHEN max(pass) = 1 THEN 1 ELSE NULL END, sum(layers_verified),"
    " sum(wall_us), NULL"
    " FROM main.shard_steps WHERE run = ?1 AND step IN (SELECT step FROM temp.merge_new)"
    " GROUP BY step HAVING count(*) = ?2";

/* Merges the attached shard run r into m->dst (inside the caller's transaction).  added gets the
 * steps new to the merged run (for layer splits: the shard's rows new to shard_steps). */
static int merge_rows(merge_ctx *m, const shard_run *r, int64_t *added, int64_t *completed, char *err, size_t err_len)
{
    const bool layers = strcmp(r->shard_by, "layers") == 0;
    char cols[2048], src[2048], sql[8192];
    if (step_columns(m, cols, sizeof cols, src, sizeof src, err, err_len) != 0) return -1;
    if (exec(m, "CREATE TEMP TABLE IF NOT EXISTS merge_new(step INTEGER PRIMARY KEY); DELETE FROM temp.merge_new;",
             err, err_len) != 0)
        return -1;
    if (layers &&
        exec(m, "CREATE TABLE IF NOT EXISTS main.shard_steps AS SELECT * FROM main.steps WHERE 0;"
                "CREATE UNIQUE INDEX IF NOT EXISTS main.shard_steps_key ON shard_steps(run, step, shard);",
             err, err_len) != 0)
        return -1;
    const char *table = layers ? "main.shard_steps" : "main.steps";
    snprintf(sql, sizeof sql, "INSERT INTO temp.merge_new SELECT step FROM s.steps WHERE run = ?2 AND step NOT IN"
             " (SELECT step FROM %s WHERE run = ?1%s)", table, layers ? " AND shard = ?3" : "");
    if ((*added = run_sql(m, sql, r->id, r->shard_index, err, err_len)) < 0) return -1;
    snprintf(sql, sizeof sql, "INSERT INTO %s(run%s, shard) SELECT ?1%s, ?3 FROM s.steps WHERE run = ?2 AND step IN"
             " (SELECT step FROM temp.merge_new)", table, cols, src);
    if (run_sql(m, sql, r->id, r->shard_index, err, err_len) < 0) return -1;
    /* kernels: a layer split's flat_equivalent rows (layer -1, per shard for its layers) add up */
    if (run_sql(m, "INSERT INTO main.kernels(run, step, layer, name, time_us) SELECT ?1, step, layer, name, time_us"
                   " FROM s.kernels WHERE run = ?2 AND step IN (SELECT step FROM temp.merge_new)"
                   " ON CONFLICT(run, step, layer, name) DO UPDATE SET time_us = time_us + excluded.time_us",
                r->id, r->shard_index, err, err_len) < 0)
        return -1;
    if (run_sql(m, "INSERT INTO main.mismatches(run, step, layer, req, token, head, dim, got, want, abs_err)"
                   " SELECT ?1, step, layer, req, token, head, dim, got, want, abs_err FROM s.mismatches"
                   " WHERE run = ?2 AND step IN (SELECT step FROM temp.merge_new)",
                r->id, r->shard_index, err, err_len) < 0)
        return -1;
    /* coverage (schema version 4; a shard of an older schema has none): a layer split's rows of one
     * step and path add up over the shards, as their layers do */
    if (ar_db_has_column(m->h, "s", "coverage", "verified_layers") == 1 &&
        run_sql(m, "INSERT INTO main.coverage(run, step, path, layers, verified_layers)"
                   " SELECT ?1, step, path, layers, verified_layers FROM s.coverage"
                   " WHERE run = ?2 AND step IN (SELECT step FROM temp.merge_new)"
                   " ON CONFLICT(run, step, path) DO UPDATE SET layers = layers + excluded.layers,"
                   " verified_layers = verified_layers + excluded.verified_layers",
                r->id, r->shard_index, err, err_len) < 0)
        return -1;
    *completed = *added;
    if (layers) {
        /* the steps every shard has now: their combination, and the first failing layer's mismatches */
        if ((*completed = run_sql(m, combine_sql, r->shard_count, 0, err, err_len)) < 0) return -1;
        if (run_sql(m, "DELETE FROM main.mismatches WHERE run = ?1 AND step IN (SELECT step FROM temp.merge_new)"
                       " AND step IN (SELECT step FROM main.steps WHERE run = ?1)"
                       " AND layer > (SELECT min(layer) FROM main.mismatches m2 WHERE m2.run = ?1"
                       " AND m2.step = mismatches.step)", 0, 0, err, err_len) < 0)
            return -1;
    }
    return 0;
}

static int upsert_manifest(merge_ctx *m, const shard_run *r, char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    const char *sql =
        "INSERT OR REPLACE INTO shards(run, shard, source, source_run, started, finished, host, device, device_index,"
        " code_rev, launcher, status, error, step_first, step_last, layer_first, layer_last, steps_done, steps_failed,"
        " last_step, parse_s, metadata_s, generation_s, kernel_s, verify_s, sqlite_s, wait_s, setup_s, wall_s, merged)"
        " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
    if (sqlite3_prepare_v2(m->h, sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: %s", m->out_path, sqlite3_errmsg(m->h));
        return -1;
    }
    int i = 1;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    sqlite3_bind_int64(st, i++, m->dst);
    sqlite3_bind_int64(st, i++, r->shard_index);
    sqlite3_bind_text(st, i++, r->path, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, i++, r->id);
    sqlite3_bind_double(st, i++, r->started);
    if (isnan(r->finished)) sqlite3_bind_null(st, i++);
    else sqlite3_bind_double(st, i++, r->finished);
    sqlite3_bind_text(st, i++, r->host, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, i++, r->device, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, i++, r->device_index);
    sqlite3_bind_text(st, i++, r->code_rev, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, i++, r->launcher, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, i++, r->status, -1, SQLITE_STATIC);
    if (r->error[0]) sqlite3_bind_text(st, i++, r->error, -1, SQLITE_STATIC);
    else sqlite3_bind_null(st, i++);
    sqlite3_bind_int64(st, i++, r->step_first);
    sqlite3_bind_int64(st, i++, r->step_last);
    sqlite3_bind_int64(st, i++, r->layer_first);
    sqlite3_bind_int64(st, i++, r->layer_last);
    sqlite3_bind_int64(st, i++, r->steps_done);
    sqlite3_bind_int64(st, i++, r->steps_failed);
    sqlite3_bind_int64(st, i++, r->last_step);
    for (int k = 0; k < MERGE_PHASES; k++) sqlite3_bind_double(st, i++, r->phases[k]);
    sqlite3_bind_double(st, i++, (double)now.tv_sec + now.tv_nsec * 1e-9);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        snprintf(err, err_len, "%s: cannot write the shard manifest: %s", m->out_path, sqlite3_errmsg(m->h));
        return -1;
    }
    return 0;
}

static bool unfinished(const char *status)
{
    return !strcmp(status, "running") || !strcmp(status, "interrupted") || !strcmp(status, "error");
}

/* Recomputes the merged run's row from its steps and manifest; status into status_out. */
static int update_run(merge_ctx *m, const shard_run *a, char *status_out, size_t status_len, char *err, size_t err_len)
{
    if (run_sql(m, "UPDATE runs SET"
                   " steps_done = (SELECT count(*) FROM steps WHERE run = ?1),"
                   " steps_failed = (SELECT count(*) FROM steps WHERE run = ?1 AND pass = 0),"
                   " last_step = (SELECT coalesce(max(step), -1) FROM steps WHERE run = ?1),"
                   " verified_steps = (SELECT count(*) FROM steps WHERE run = ?1 AND verified != 'off'),"
                   " verified_layer_steps = (SELECT coalesce(sum(layers_verified), 0) FROM steps WHERE run = ?1),"
                   " verified_rows = (SELECT coalesce(sum(rows_checked), 0) FROM steps WHERE run = ?1),"
                   " parse_s = (SELECT sum(parse_s) FROM shards WHERE run = ?1),"
                   " metadata_s = (SELECT sum(metadata_s) FROM shards WHERE run = ?1),"
                   " generation_s = (SELECT sum(generation_s) FROM shards WHERE run = ?1),"
                   " kernel_s = (SELECT sum(kernel_s) FROM shards WHERE run = ?1),"
                   " verify_s = (SELECT sum(verify_s) FROM shards WHERE run = ?1),"
                   " sqlite_s = (SELECT sum(sqlite_s) FROM shards WHERE run = ?1),"
                   " wait_s = (SELECT sum(wait_s) FROM shards WHERE run = ?1),"
                   " setup_s = (SELECT sum(setup_s) FROM shards WHERE run = ?1),"
                   " wall_s = (SELECT max(wall_s) FROM shards WHERE run = ?1),"
                   " merged_shards = (SELECT count(*) FROM shards WHERE run = ?1),"
                   " started = (SELECT min(started) FROM shards WHERE run = ?1),"
                   " device = (SELECT group_concat(device, ' + ') FROM (SELECT DISTINCT device FROM shards"
                   "   WHERE run = ?1 ORDER BY device)),"
                   " host = (SELECT group_concat(host, ', ') FROM (SELECT DISTINCT host FROM shards"
                   "   WHERE run = ?1 ORDER BY host)),"
                   " code_rev = (SELECT group_concat(code_rev, ' + ') FROM (SELECT DISTINCT code_rev FROM shards"
                   "   WHERE run = ?1 ORDER BY code_rev)),"
                   " shard_step_first = (SELECT min(step_first) FROM shards WHERE run = ?1"
                   "   AND (step_first <= step_last OR step_last < 0)),"
                   " shard_step_last = (SELECT max(step_last) FROM shards WHERE run = ?1),"
                   " shard_layer_first = (SELECT min(layer_first) FROM shards WHERE run = ?1),"
                   " shard_layer_last = (SELECT max(layer_last) FROM shards WHERE run = ?1)"
                   " WHERE id = ?1", 0, 0, err, err_len) < 0)
        return -1;
    /* the status, as the engine would say it of these steps, unless a shard is missing or unfinished */
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(m->h, "SELECT shard, status, error, last_step FROM shards WHERE run = ? ORDER BY shard", -1,
                           &st, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: %s", m->out_path, sqlite3_errmsg(m->h));
        return -1;
    }
    sqlite3_bind_int64(st, 1, m->dst);
    char why[2048] = "";
    size_t at = 0;
    int64_t expect = 0, missing = 0;
    bool incomplete = false;
    while (sqlite3_step(st) == SQLITE_ROW) {
        int64_t shard = sqlite3_column_int64(st, 0);
        const char *status = (const char *)sqlite3_column_text(st, 1);
        const char *error = (const char *)sqlite3_column_text(st, 2);
        for (; expect < shard; expect++) missing++;
        expect = shard + 1;
        if (status && unfinished(status)) {
            incomplete = true;
            if (at < sizeof why)
                at += (size_t)snprintf(why + at, sizeof why - at, "%sshard %lld/%lld %s after step %lld%s%.200s",
                                       at ? "; " : "", (long long)shard, (long long)a->shard_count, status,
                                       (long long)sqlite3_column_int64(st, 3), error ? ": " : "", error ? error : "");
        }
    }
    sqlite3_finalize(st);
    missing += a->shard_count - expect;
    if (missing > 0) {
        incomplete = true;
        if (at < sizeof why)
            at += (size_t)snprintf(why + at, sizeof why - at, "%s%lld of %lld shards not merged yet", at ? "; " : "",
                                   (long long)missing, (long long)a->shard_count);
    }
    int64_t done = 0, failed = 0;
    if (sqlite3_prepare_v2(m->h, "SELECT steps_done, steps_failed FROM runs WHERE id = ?", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, m->dst);
        if (sqlite3_step(st) == SQLITE_ROW) {
            done = sqlite3_column_int64(st, 0);
            failed = sqlite3_column_int64(st, 1);
        }
    }
    sqlite3_finalize(st);
    const bool verify_off = strcmp(a->verify, "off") == 0, injected = strcmp(a->inject, "none") != 0;
    const char *status = incomplete ? "incomplete" : done == 0 ? "empty" : failed > 0 ? "failed"
                         : injected && !verify_off ? "fault-not-fired" : verify_off ? "unverified" : "passed";
    if (!incomplete && done == 0) snprintf(why, sizeof why, "no step was replayed by any shard");
    else if (!incomplete && !strcmp(status, "fault-not-fired"))
        snprintf(why, sizeof why, "the planted fault %s never showed: no step failed verification", a->inject);
    else if (!incomplete) why[0] = '\0';
    snprintf(status_out, status_len, "%s", status);
    if (sqlite3_prepare_v2(m->h, "UPDATE runs SET status = ?, error = ?, finished = CASE WHEN ? THEN NULL ELSE"
                           " (SELECT max(finished) FROM shards WHERE run = ?4) END WHERE id = ?4", -1, &st,
                           NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: %s", m->out_path, sqlite3_errmsg(m->h));
        return -1;
    }
    sqlite3_bind_text(st, 1, status, -1, SQLITE_STATIC);
    if (why[0]) sqlite3_bind_text(st, 2, why, -1, SQLITE_TRANSIENT);
    else sqlite3_bind_null(st, 2);
    sqlite3_bind_int(st, 3, incomplete);
    sqlite3_bind_int64(st, 4, m->dst);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        snprintf(err, err_len, "%s: %s", m->out_path, sqlite3_errmsg(m->h));
        return -1;
    }
    return 0;
}

/* Checks that a steps-split shard holds only steps of its range (so shards cannot overlap). */
static int check_range(merge_ctx *m, const shard_run *r, char *err, size_t err_len)
{
    if (strcmp(r->shard_by, "steps") != 0 || r->shard_count <= 1) return 0;
    sqlite3_stmt *st = NULL;
    int64_t outside = -1;
    if (sqlite3_prepare_v2(m->h, "SELECT count(*) FROM s.steps WHERE run = ? AND (step < ? OR step > ?)", -1, &st,
                           NULL) == SQLITE_OK) {
        sqlite3_bind_int64(st, 1, r->id);
        sqlite3_bind_int64(st, 2, r->step_first);
        sqlite3_bind_int64(st, 3, r->step_last);
        if (sqlite3_step(st) == SQLITE_ROW) outside = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    if (outside != 0) {
        snprintf(err, err_len, "%s: run %lld (shard %lld/%lld) %s", r->path, (long long)r->id, (long long)r->shard_index,
                 (long long)r->shard_count, outside < 0 ? "cannot be read" : "holds steps outside its planned range");
        return -1;
    }
    return 0;
}

static void merge_usage(FILE *f)
{
    fputs("usage: attnreplay merge OUT.db SHARD.db... [--quiet]\n"
          "  Makes the runs of a sharded replay (one database per shard: replay --db runs-%r.db) into one\n"
          "  run of OUT.db, created if missing, that report, diff and plan read as one run: every step\n"
          "  once, with the shard that replayed it.  Shards of different traces, options, shard counts\n"
          "  or splits are refused, naming the difference.  Merging again adds only what is new: the\n"
          "  steps a shard committed since (after --resume, say); a shard replayed again from scratch\n"
          "  needs a new OUT.  Each shard is merged in one transaction.\n"
          "  The merged run's status is 'incomplete' while a shard is missing or unfinished, else what\n"
          "  a single replay of those steps would say (passed, failed, ...).\n"
          "  Exit status: 0 merged, 2 bad input (a shard unreadable or not of this replay, an OUT that is\n"
          "  not an attnreplay results database, OUT or a shard locked by another writer past\n"
          "  ATTNREPLAY_BUSY_TIMEOUT_MS: OUT as it was), 3 a database error (I/O), or the summary could\n"
          "  not be written to stdout (OUT is merged; a 2 stays, said on stderr too).\n"
          "environment: ATTNREPLAY_BUSY_TIMEOUT_MS  how long to wait for another writer's lock on OUT\n"
          "  or a shard (default 30000), as replay waits\n", f);
}

int ar_merge_main(int argc, char **argv)
{
    merge_ctx M, *m = &M;
    memset(m, 0, sizeof *m);
    const char **paths = calloc((size_t)argc, sizeof *paths);
    if (!paths) return 3;
    int num_paths = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            merge_usage(stdout);
            free(paths);
            return 0;
        }
        if (!strcmp(argv[i], "--quiet")) m->quiet = true;
        else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "attnreplay merge: unknown option '%s'\n", argv[i]);
            merge_usage(stderr);
            free(paths);
            return 2;
        } else if (!m->out_path) m->out_path = argv[i];
        else paths[num_paths++] = argv[i];
    }
    if (!m->out_path || num_paths == 0) {
        merge_usage(stderr);
        free(paths);
        return 2;
    }
    int code = 0;
    char err[4096] = "";
    struct stat out_st;
    bool out_exists = stat(m->out_path, &out_st) == 0;
    /* the shard files: readable, not OUT, each once */
    struct stat *seen = calloc((size_t)num_paths, sizeof *seen);
    int kept = 0;
    for (int i = 0; seen && i < num_paths; i++) {
        struct stat sb;
        errno = 0;
        if (stat(paths[i], &sb) != 0 || !S_ISREG(sb.st_mode)) {
            snprintf(err, sizeof err, "%s: cannot read the shard database: %s", paths[i],
                     errno ? strerror(errno) : "not a regular file");
            code = 2;
            goto out;
        }
        if (out_exists && sb.st_dev == out_st.st_dev && sb.st_ino == out_st.st_ino) {
            snprintf(err, sizeof err, "%s is OUT itself: give the shard databases after OUT", paths[i]);
            code = 2;
            goto out;
        }
        bool dup = false;
        for (int k = 0; k < kept; k++) dup |= seen[k].st_dev == sb.st_dev && seen[k].st_ino == sb.st_ino;
        if (dup) continue;
        seen[kept] = sb;
        paths[kept++] = paths[i];
    }
    if (!seen) {
        snprintf(err, sizeof err, "out of memory");
        code = 3;
        goto out;
    }
    num_paths = kept;
    if (ar_db_check_writable(m->out_path, err, sizeof err) != 0) {
        code = 2;
        goto out;
    }
    /* 1. read every shard's runs, one database attached at a time (to a connection of its own,
     * so that a refused merge leaves OUT as it was) */
    if (sqlite3_open_v2(":memory:", &m->h, SQLITE_OPEN_READWRITE | SQLITE_OPEN_URI, NULL) != SQLITE_OK) {
        snprintf(err, sizeof err, "out of memory");
        code = 3;
        goto out;
    }
    sqlite3_busy_timeout(m->h, ar_db_busy_timeout_ms());   /* a shard another process writes: wait as for OUT */
    for (int f = 0; f < num_paths; f++) {
        if ((code = attach(m, paths[f], err, sizeof err)) != 0) goto out;
        int rc = read_runs(m, paths[f], f, err, sizeof err);
        detach(m);
        if (rc != 0) {
            code = 2;
            goto out;
        }
    }
    if (check_group(m, err, sizeof err) != 0) {
        code = 2;
        goto out;
    }
    sqlite3_close(m->h);
    m->h = NULL;
    {   /* create or migrate OUT with the schema of this version */
        bool bad_out = false;
        ar_db *db = ar_db_open(m->out_path, false, &bad_out, err, sizeof err);
        if (!db) {
            code = bad_out ? 2 : 3;
            goto out;
        }
        ar_db_close(db);
    }
    if (sqlite3_open_v2(m->out_path, &m->h, SQLITE_OPEN_READWRITE | SQLITE_OPEN_URI, NULL) != SQLITE_OK) {
        snprintf(err, sizeof err, "%s: cannot open: %s", m->out_path, m->h ? sqlite3_errmsg(m->h) : "out of memory");
        code = 3;
        goto out;
    }
    sqlite3_busy_timeout(m->h, ar_db_busy_timeout_ms());
    if (find_merged_run(m, &code, err, sizeof err) != 0) goto out;
    code = 0;
    /* 2. merge, one shard per transaction, in shard order */
    const shard_run *first = NULL;
    for (size_t i = 0; i < m->num_runs; i++)
        if (!m->runs[i].dropped && (!first || m->runs[i].shard_index < first->shard_index)) first = &m->runs[i];
    char status[32] = "";
    /* tests: ATTNREPLAY_TEST_MERGE_KILL_AT_SHARD=K kills the merge inside shard K's transaction */
    const char *kill_env = getenv("ATTNREPLAY_TEST_MERGE_KILL_AT_SHARD");
    const long long kill_at = kill_env ? strtoll(kill_env, NULL, 10) : -1;
    for (int64_t k = 0; k < first->shard_count; k++) {
        for (size_t i = 0; i < m->num_runs; i++) {
            const shard_run *r = &m->runs[i];
            if (r->dropped || r->shard_index != k) continue;
            if ((code = attach(m, r->path, err, sizeof err)) != 0) goto out;
            int64_t added = 0, completed = 0;
            bool created = false;
            int rc = check_range(m, r, err, sizeof err);
            if (rc != 0) code = 2;
            if (rc == 0 && (rc = exec(m, "BEGIN IMMEDIATE", err, sizeof err)) == 0) {
                if (!m->dst) {
                    rc = create_merged_run(m, first, err, sizeof err);
                    created = rc == 0;
                }
                if (rc == 0) rc = merge_rows(m, r, &added, &completed, err, sizeof err);
                if (rc == 0 && kill_at >= 0 && r->shard_index == kill_at) raise(SIGKILL);   /* the kill test */
                if (rc == 0) rc = upsert_manifest(m, r, err, sizeof err);
                if (rc == 0) rc = update_run(m, first, status, sizeof status, err, sizeof err);
                if (rc == 0) rc = exec(m, "COMMIT", err, sizeof err);
                if (rc != 0) {
                    sqlite3_exec(m->h, "ROLLBACK", NULL, NULL, NULL);
                    if (created) m->dst = 0;
                    code = 3;
                }
            } else if (rc != 0 && !code) {
                code = 3;
            }
            detach(m);
            if (rc != 0) goto out;
            if (!m->quiet) {
                char range[64];
                if (r->step_last < 0 && r->shard_count == 1)
                    snprintf(range, sizeof range, "steps %lld..end", (long long)r->step_first);
                else if (r->step_first <= r->step_last)
                    snprintf(range, sizeof range, "steps %lld..%lld", (long long)r->step_first, (long long)r->step_last);
                else
                    snprintf(range, sizeof range, "no steps");
                printf("merge: shard %lld/%lld from run %lld of %s (%s, %s): %s, layers %lld..%lld, status %s; %lld "
                       "%s new%s\n", (long long)r->shard_index, (long long)r->shard_count, (long long)r->id, r->path,
                       r->host[0] ? r->host : "host not recorded", r->device, range, (long long)r->layer_first,
                       (long long)r->layer_last, r->status, (long long)added,
                       strcmp(r->shard_by, "layers") == 0 ? "shard rows" : "steps",
                       strcmp(r->shard_by, "layers") == 0 && completed ? ", steps completed" : "");
            }
        }
    }
    if (!m->quiet) {
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(m->h, "SELECT merged_shards, shard_count, steps_done, steps_failed, verified_steps,"
                               " error FROM runs WHERE id = ?", -1, &st, NULL) == SQLITE_OK) {
            sqlite3_bind_int64(st, 1, m->dst);
            if (sqlite3_step(st) == SQLITE_ROW) {
                const char *why = (const char *)sqlite3_column_text(st, 5);
                printf("merge: run %lld in %s: %lld of %lld shards, %lld steps (%lld failed, %lld verified), status %s%s%s\n",
                       (long long)m->dst, m->out_path, (long long)sqlite3_column_int64(st, 0),
                       (long long)sqlite3_column_int64(st, 1), (long long)sqlite3_column_int64(st, 2),
                       (long long)sqlite3_column_int64(st, 3), (long long)sqlite3_column_int64(st, 4), status,
                       why ? ": " : "", why ? why : "");
            }
        }
        sqlite3_finalize(st);
    }
out:
    if (code == 3 && m->locked) code = 2;   /* OUT locked by another writer past the busy timeout: bad input */
    if (code != 0) fprintf(stderr, "attnreplay merge: %s\n", err);
    for (size_t i = 0; i < m->num_runs; i++) free_run(&m->runs[i]);
    free(m->runs);
    free(seen);
    free(paths);
    if (m->h) sqlite3_close(m->h);
    return code;
}
