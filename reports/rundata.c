/* rundata.c - loads runs and steps from a results database opened read-only, looks up
 * device ceilings and computes quantiles for the report and diff commands (see rundata.h). */
#include "rundata.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../replay/db_lock.h"
#include "../replay/db_version.h"

void *ar_rd_open(const char *path, char *err, size_t err_len)
{
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        if (S_ISDIR(sb.st_mode))   /* SQLite would say "disk I/O error" */
            snprintf(err, err_len, "%s: is a directory, not a results database", path);
        else   /* a FIFO would block the open forever */
            snprintf(err, err_len, "%s: not a regular file (a FIFO, socket or device), not a results database", path);
        return NULL;
    }
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: cannot open the database read-only: %s", path,
                 db ? sqlite3_errmsg(db) : "out of memory");
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db, ar_db_busy_timeout_ms());   /* another process writing: wait as writers wait */
    /* The database must hold the tables we read; a missing file or a non-database fails
     * here with SQLite's own words. */
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db,
        "SELECT count(*) FROM sqlite_master WHERE type='table' AND name IN ('runs','steps')",
        -1, &st, NULL);
    int tables = 0;
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        tables = sqlite3_column_int(st, 0);
        rc = SQLITE_OK;
    } else if (!ar_db_lock_error(db, path, NULL, err, err_len)) {
        snprintf(err, err_len, "%s: not a readable SQLite database: %s", path, sqlite3_errmsg(db));
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK || tables != 2) {
        if (rc == SQLITE_OK)
            snprintf(err, err_len, "%s: not an attnreplay results database (tables 'runs' and "
                     "'steps' missing; schema in replay/db.h)", path);
        sqlite3_close(db);
        return NULL;
    }
    /* A newer schema may have changed what the columns read here mean: refused, as replay
     * --db refuses it (replay/db.c).  No meta table, or no version in it: version 1. */
    int version = ar_db_schema_version(db, NULL);
    if (version > AR_DB_SCHEMA_VERSION) {
        snprintf(err, err_len, "%s: schema version %d is newer than this attnreplay's %d", path, version,
                 AR_DB_SCHEMA_VERSION);
        sqlite3_close(db);
        return NULL;
    }
    return db;
}

void ar_rd_close(void *handle)
{
    sqlite3_close((sqlite3 *)handle);
}

int ar_rd_list_runs(void *handle, int64_t **ids, size_t *count, char *err, size_t err_len)
{
    sqlite3 *db = handle;
    sqlite3_stmt *st = NULL;
    *ids = NULL;
    *count = 0;
    if (sqlite3_prepare_v2(db, "SELECT id FROM runs ORDER BY id", -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "reading runs: %s", sqlite3_errmsg(db));
        return -1;
    }
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (*count == cap) {
            cap = cap ? cap * 2 : 16;
            int64_t *grown = realloc(*ids, cap * sizeof **ids);
            if (!grown) { snprintf(err, err_len, "out of memory"); rc = SQLITE_NOMEM; break; }
            *ids = grown;
        }
        (*ids)[(*count)++] = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        if (rc != SQLITE_NOMEM) snprintf(err, err_len, "reading runs: %s", sqlite3_errmsg(db));
        free(*ids);
        *ids = NULL;
        *count = 0;
        return -1;
    }
    return 0;
}

static char *column_text_dup(sqlite3_stmt *st, int col)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    return strdup(t ? (const char *)t : "");
}

static double column_double_or_nan(sqlite3_stmt *st, int col)
{
    return sqlite3_column_type(st, col) == SQLITE_NULL ? NAN : sqlite3_column_double(st, col);
}

/* True when table has a column of this name (older databases may lack one). */
static int has_column(sqlite3 *db, const char *table, const char *name)
{
    sqlite3_stmt *st = NULL;
    int found = 0;
    if (sqlite3_prepare_v2(db, "SELECT name FROM pragma_table_info(?)", -1, &st, NULL) != SQLITE_OK) return 0;
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    while (!found && sqlite3_step(st) == SQLITE_ROW) {
        const unsigned char *column = sqlite3_column_text(st, 0);
        found = column && strcmp((const char *)column, name) == 0;
    }
    sqlite3_finalize(st);
    return found;
}

static int runs_has_column(sqlite3 *db, const char *name)
{
    return has_column(db, "runs", name);
}

int ar_rd_unfinished(const ar_run_data *run)
{
    return !strcmp(run->status, "running") || !strcmp(run->status, "interrupted") || !strcmp(run->status, "error") ||
           !strcmp(run->status, "incomplete");
}

void ar_rd_step_name(const ar_run_data *run, const ar_step_row *s, char *buf, size_t len)
{
    if (run->shard_count > 1 && s->shard >= 0)
        snprintf(buf, len, "step %lld (shard %d/%lld)", (long long)s->step, s->shard, (long long)run->shard_count);
    else
        snprintf(buf, len, "step %lld", (long long)s->step);
}

int ar_rd_load_run(void *handle, int64_t run_id, ar_run_data *out, char *err, size_t err_len)
{
    sqlite3 *db = handle;
    sqlite3_stmt *st = NULL;
    memset(out, 0, sizeof *out);
    char sql[768];
    const int sharded = runs_has_column(db, "shard_count");
    snprintf(sql, sizeof sql,
             "SELECT id, trace, trace_hash, backend, device, dtype, kv_dtype, model, status, "
             "cascade, layers, steps_done, steps_failed, inject, %s, %s, %s FROM runs WHERE id = ?",
             runs_has_column(db, "verify") ? "verify" : "''", runs_has_column(db, "error") ? "error" : "''",
             sharded ? "coalesce(shard_count, 1), coalesce(shard_index, CASE WHEN merged_shards IS NULL THEN 0 "
                       "ELSE -1 END), coalesce(merged_shards, -1), coalesce(shard_by, 'steps')"
                     : "1, 0, -1, 'steps'");
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "reading run %lld: %s (schema in replay/db.h)",
                 (long long)run_id, sqlite3_errmsg(db));
        return -1;
    }
    sqlite3_bind_int64(st, 1, run_id);
    if (sqlite3_step(st) != SQLITE_ROW) {
        snprintf(err, err_len, "run %lld is not in the database", (long long)run_id);
        sqlite3_finalize(st);
        return -1;
    }
    out->id = sqlite3_column_int64(st, 0);
    out->trace = column_text_dup(st, 1);
    out->trace_hash = column_text_dup(st, 2);
    out->backend = column_text_dup(st, 3);
    out->device = column_text_dup(st, 4);
    out->dtype = column_text_dup(st, 5);
    out->kv_dtype = column_text_dup(st, 6);
    out->model = column_text_dup(st, 7);
    out->status = column_text_dup(st, 8);
    out->cascade_mode = column_text_dup(st, 9);
    out->layers = sqlite3_column_int64(st, 10);
    out->steps_done = sqlite3_column_int64(st, 11);
    out->steps_failed = sqlite3_column_int64(st, 12);
    out->inject = column_text_dup(st, 13);
    out->verify = column_text_dup(st, 14);
    out->error = column_text_dup(st, 15);
    out->shard_count = sqlite3_column_int64(st, 16);
    out->shard_index = sqlite3_column_int64(st, 17);
    out->merged_shards = sqlite3_column_int64(st, 18);
    out->shard_by = column_text_dup(st, 19);
    sqlite3_finalize(st);
    if (!out->trace || !out->trace_hash || !out->backend || !out->device || !out->dtype ||
        !out->kv_dtype || !out->model || !out->status || !out->cascade_mode || !out->inject ||
        !out->verify || !out->error || !out->shard_by) {
        snprintf(err, err_len, "out of memory");
        ar_rd_free_run(out);
        return -1;
    }

    snprintf(sql, sizeof sql,
             "SELECT step, time, num_reqs, num_tokens, total_context, cascade, prefix_len, "
             "time_us, bytes, flops, gbps, tflops, max_abs, nmse, pass, %s "
             "FROM steps WHERE run = ? ORDER BY step", has_column(db, "steps", "shard") ? "shard" : "NULL");
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "reading steps of run %lld: %s (schema in replay/db.h)",
                 (long long)run_id, sqlite3_errmsg(db));
        ar_rd_free_run(out);
        return -1;
    }
    sqlite3_bind_int64(st, 1, run_id);
    size_t cap = 0;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (out->num_steps == cap) {
            cap = cap ? cap * 2 : 256;
            ar_step_row *grown = realloc(out->steps, cap * sizeof *grown);
            if (!grown) { rc = SQLITE_NOMEM; break; }
            out->steps = grown;
        }
        ar_step_row *s = &out->steps[out->num_steps++];
        s->step = sqlite3_column_int64(st, 0);
        s->trace_time = column_double_or_nan(st, 1);
        s->num_reqs = sqlite3_column_int64(st, 2);
        s->num_tokens = sqlite3_column_int64(st, 3);
        s->total_context = sqlite3_column_int64(st, 4);
        s->cascade = sqlite3_column_int(st, 5) != 0;
        s->prefix_len = sqlite3_column_int64(st, 6);
        s->time_us = column_double_or_nan(st, 7);
        s->bytes = column_double_or_nan(st, 8);
        s->flops = column_double_or_nan(st, 9);
        s->gbps = column_double_or_nan(st, 10);
        s->tflops = column_double_or_nan(st, 11);
        s->max_abs = column_double_or_nan(st, 12);
        s->nmse = column_double_or_nan(st, 13);
        s->pass = sqlite3_column_type(st, 14) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 14) != 0;
        s->shard = sqlite3_column_type(st, 15) == SQLITE_NULL ? -1 : sqlite3_column_int(st, 15);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        snprintf(err, err_len, "reading steps of run %lld: %s", (long long)run_id,
                 rc == SQLITE_NOMEM ? "out of memory" : sqlite3_errmsg(db));
        ar_rd_free_run(out);
        return -1;
    }
    return 0;
}

void ar_rd_free_run(ar_run_data *run)
{
    free(run->trace);
    free(run->trace_hash);
    free(run->backend);
    free(run->device);
    free(run->dtype);
    free(run->kv_dtype);
    free(run->model);
    free(run->status);
    free(run->cascade_mode);
    free(run->inject);
    free(run->verify);
    free(run->error);
    free(run->shard_by);
    free(run->steps);
    memset(run, 0, sizeof *run);
}

static int contains_nocase(const char *haystack, const char *needle)
{
    return haystack && strcasestr(haystack, needle) != NULL;
}

void ar_rd_ceilings(void *handle, const char *device, const char *backend, ar_ceilings *out)
{
    sqlite3 *db = handle;
    sqlite3_stmt *st = NULL;
    memset(out, 0, sizeof *out);
    /* An older database may lack the table: then prepare fails and defaults apply. */
    if (sqlite3_prepare_v2(db,
            "SELECT copy_gbps, bf16_tflops, method, measured FROM ceilings "
            "WHERE device = ? AND copy_gbps > 0 AND bf16_tflops > 0 "
            "ORDER BY measured DESC LIMIT 1", -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, device ? device : "", -1, SQLITE_STATIC);
        if (sqlite3_step(st) == SQLITE_ROW) {
            const unsigned char *method = sqlite3_column_text(st, 2);
            out->copy_gbps = sqlite3_column_double(st, 0);
            out->bf16_tflops = sqlite3_column_double(st, 1);
            snprintf(out->source, sizeof out->source, "measured by calibrate (%s)",
                     method ? (const char *)method : "method not recorded");
        }
        sqlite3_finalize(st);
        if (out->copy_gbps > 0) return;
    }
    if (contains_nocase(backend, "cpu") || contains_nocase(device, "cpu")) {
        out->copy_gbps = 50.0;
        out->bf16_tflops = 1.0;
        snprintf(out->source, sizeof out->source,
                 "guess for a CPU (no calibrate row): 50 GB/s, 1 TFLOP/s");
    } else if (contains_nocase(device, "H200")) {
        out->copy_gbps = 4300.0;
        out->bf16_tflops = 790.0;
        snprintf(out->source, sizeof out->source,
                 "H200 default (measured for this project, kernel-performance-anchors.md)");
    } else {
        out->copy_gbps = 4300.0;
        out->bf16_tflops = 790.0;
        snprintf(out->source, sizeof out->source,
                 "H200 default assumed for an unknown device (run calibrate)");
    }
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double ar_rd_quantile(double *values, size_t n, double q)
{
    if (n == 0) return NAN;
    qsort(values, n, sizeof *values, compare_doubles);
    if (q <= 0) return values[0];
    if (q >= 1) return values[n - 1];
    double pos = q * (double)(n - 1);
    size_t lo = (size_t)pos;
    double frac = pos - (double)lo;
    if (lo + 1 >= n) return values[n - 1];
    return values[lo] + frac * (values[lo + 1] - values[lo]);
}

int ar_rd_parse_run_id(const char *text, int64_t *id)
{
    /* decimal digits only: strtoll alone also takes " 1", "+1" and "-0" */
    if (!text || !isdigit((unsigned char)text[0])) return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || *end || v < 0) return -1;
    *id = v;
    return 0;
}

void ar_rd_dir_name(const char *path, char *out, size_t len)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    snprintf(out, len, "%.*s", (int)n, path);
}
