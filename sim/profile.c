/* profile.c - measured step-time profiles: `attnreplay profile` and their SQLite format (written
 * and loaded); `--step-time profile:DB` (sim/steptime.c) reads them through profile_lookup.c.
 *
 * What is measured (one tensor-parallel rank: heads and the sharded GEMM dimension divided by tp):
 *   GEMMs  every linear layer of a layer - qkv (K = hidden, N = (q + 2 kv heads) x head),
 *          o (K = q heads x head, N = hidden), gate_up (K = hidden, N = 2 x MLP),
 *          down (K = MLP, N = hidden) - and the LM head (K = hidden, N = vocab), through cuBLAS
 *          (kernels/common/cuda_profile.cu) over a grid of token counts M;
 *   attention  one layer through the backend API (replay/backend.h: open, prepare, forward with
 *          the run's repeat count, the forward's median total time, KV write included) over a
 *          grid of decode batches (B requests of one new token after C context tokens) and single
 *          prefills (Q new tokens after C), on the backend replay would use (default cuda);
 *   replayed steps  with --trace, the first N steps of a real trace replayed by `attnreplay
 *          replay` (one layer, verification off), each step's measured attention time beside the
 *          profile's interpolation for its exact shape; the median ratio is stored and scales the
 *          interpolated attention.
 * The cache of the attention grid is never filled (its slots hold NaN): timing only.
 *
 * Format (SQLite, a few tens of KB): meta(key, value) with format "attnreplay-profile", version 1,
 * device, model, tp, command, code_rev, created, gemm_engine, attn_backend, replay_steps,
 * replay_ratio; gemm(name, per_layer, k, n, m, us); attn_decode(batch, ctx, us);
 * attn_prefill(q, ctx, us); attn_steps(trace, step, num_reqs, num_tokens, measured_us,
 * predicted_us).  Times are microseconds per call (GEMM) or per layer (attention).  Version 2
 * (profiles imported from LLMServingSim, sim/profile_import.c; a few hundred KB) adds: gemm rows
 * of operations that are not GEMMs (k = n = 0), gemm.per_layer as calls per layer (2: a layer's
 * two norms), 0 once per step at the requests, -1 once per step at the tokens; an operation at
 * the requests timed on a first part of the token grid only; and attn_mixed(q, ctx, batch, dctx,
 * us), one prefill with a decode batch in one kernel.  Version 3 (the same, with LLMServingSim's
 * attention lookup) adds meta attn_prompts ("together": a step's prompts are one lookup at their
 * summed tokens and contexts; "alone" otherwise) and skew_alpha_default, attn_skew_axis(axis, bin,
 * upper) (axes 0..3: decodes, skew rate, largest decode context, prompt context; a bin holds the
 * values up to its bound, the last also those beyond) and attn_skew(pc, n, rate, largest, kp,
 * alpha), LLMServingSim's per-bucket alpha (pc: the prompt tokens, matched exactly; the others bin
 * numbers).  Profiles without them are written as version 1 or 2, as before.
 *
 * The interpolation of a profile's tables: sim/profile_lookup.c.
 *
 * --synthetic DEVICE writes the same tables from the roofline of a device preset instead of a
 * measurement (no GPU): a profile whose every number is known, for tests of the format and the
 * interpolation. */
#include "sim.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../kernels/common/cuda_profile.h"
#include "../replay/backend.h"
#include "../replay/db.h"
#include "../replay/db_lock.h"
#include "../replay/replay.h"
#include "../replay/watchdog.h"
#include "../traces/tmp_guard.h"

#define PROFILE_FORMAT "attnreplay-profile"
#define PROFILE_VERSION 3   /* read: 1 to 3; written: the lowest the profile needs (profile_version) */

/* ---- the database --------------------------------------------------------------------------------- */

/* The token counts operation g is timed at (a prefix of p->m). */
static int gemm_points(const ar_profile_table *p, int g)
{
    return p->gemm_num_m[g] > 0 && p->gemm_num_m[g] <= p->num_m ? p->gemm_num_m[g] : p->num_m;
}

/* Version 2 adds what version 1 readers would misread: operations other than once per layer or
 * once at the requests (gemm.per_layer not 0 or 1), an operation timed on part of the token grid,
 * and the attn_mixed table.  Version 3 adds LLMServingSim's attention lookup (meta attn_prompts
 * "together", the attn_skew tables).  A profile without them is written as version 1 or 2. */
static int profile_version(const ar_profile_table *p)
{
    bool v2 = p->num_mix_q > 0;
    for (int g = 0; g < p->num_gemms; g++)
        v2 = v2 || (p->gemm_per_layer[g] != 0 && p->gemm_per_layer[g] != 1) || gemm_points(p, g) != p->num_m;
    return p->prompts_together || p->num_skew_pc > 0 ? 3 : v2 ? 2 : 1;
}

static int sql_fail(sqlite3 *db, const char *path, char *err, size_t err_len)
{
    const char *why = ar_db_io_reason(db);   /* a full disk, a file size limit, ... */
    snprintf(err, err_len, "%s: %s%s%s%s", path, db ? sqlite3_errmsg(db) : "cannot open", *why ? " (" : "", why,
             *why ? ")" : "");
    return -1;
}

int ar_profile_check_replaceable(const char *path, char *err, size_t err_len)
{
    if (strlen(path) > 900) {   /* room for the names made from it (temporary, replay scratch) */
        snprintf(err, err_len, "%.64s...: a path of more than 900 characters", path);
        return -1;
    }
    struct stat sb;
    bool exists = stat(path, &sb) == 0;
    if (exists && !S_ISREG(sb.st_mode)) {
        snprintf(err, err_len, "%s: %s, not a profile database", path, S_ISDIR(sb.st_mode) ? "is a directory" : "not a regular file");
        return -1;
    }
    /* the directory must take the temporary file and the rename (a missing or read-only one) */
    if (ar_db_check_writable(path, err, err_len) != 0) return -1;
    if (!exists || sb.st_size == 0) return 0;   /* a new file */
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    bool ours = false, results = false, locked = false;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(db, ar_db_busy_timeout_ms());   /* another process writing it: wait, then say so */
        if (sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = 'format'", -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW)
            ours = sqlite3_column_text(st, 0) && strcmp((const char *)sqlite3_column_text(st, 0), PROFILE_FORMAT) == 0;
        sqlite3_finalize(st);
        st = NULL;
        locked = !ours && ar_db_lock_error(db, path, NULL, err, err_len);
        if (!ours && !locked && sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND "
                                                       "name IN ('runs', 'steps')", -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW)
            results = sqlite3_column_int(st, 0) == 2;
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    if (ours) return 0;
    if (locked) return -1;
    snprintf(err, err_len, "%s: exists and is not an attnreplay profile (%s); it is left as it is: give --db a new "
             "path, or an earlier profile to replace", path,
             results ? "it is an attnreplay results database, whose runs would be lost"
                     : "another file, not written by attnreplay profile");
    return -1;
}

/* Writes p into a new database at path (which must not hold a database yet). */
static int write_profile(const char *path, const ar_profile_table *p, const char *command, char *err, size_t err_len)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int rc = -1;
    if (sqlite3_open(path, &db) != SQLITE_OK) goto fail;
    if (sqlite3_exec(db,
                     "BEGIN;"
                     "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                     "CREATE TABLE gemm(name TEXT NOT NULL, per_layer INTEGER NOT NULL, k INTEGER NOT NULL,"
                     " n INTEGER NOT NULL, m INTEGER NOT NULL, us REAL NOT NULL, PRIMARY KEY(name, m));"
                     "CREATE TABLE attn_decode(batch INTEGER NOT NULL, ctx INTEGER NOT NULL, us REAL NOT NULL,"
                     " PRIMARY KEY(batch, ctx));"
                     "CREATE TABLE attn_prefill(q INTEGER NOT NULL, ctx INTEGER NOT NULL, us REAL NOT NULL,"
                     " PRIMARY KEY(q, ctx));"
                     "CREATE TABLE attn_steps(trace TEXT, step INTEGER, num_reqs INTEGER, num_tokens INTEGER,"
                     " measured_us REAL, predicted_us REAL);",
                     NULL, NULL, NULL) != SQLITE_OK)
        goto fail;
    if (p->num_mix_q > 0 &&
        sqlite3_exec(db, "CREATE TABLE attn_mixed(q INTEGER NOT NULL, ctx INTEGER NOT NULL, batch INTEGER NOT NULL,"
                         " dctx INTEGER NOT NULL, us REAL NOT NULL, PRIMARY KEY(q, ctx, batch, dctx)) WITHOUT ROWID;",
                     NULL, NULL, NULL) != SQLITE_OK)
        goto fail;
    char tp[16], steps[32], ratio[32], created[32], version[16], alpha[32];
    snprintf(tp, sizeof tp, "%d", p->tp);
    snprintf(steps, sizeof steps, "%d", p->replay_steps);
    snprintf(ratio, sizeof ratio, "%.6f", p->replay_ratio > 0 ? p->replay_ratio : 1.0);
    snprintf(created, sizeof created, "%lld", (long long)time(NULL));
    snprintf(version, sizeof version, "%d", profile_version(p));
    snprintf(alpha, sizeof alpha, "%.17g", p->skew_alpha_default);
    const char *meta[][2] = {
        {"format", PROFILE_FORMAT}, {"version", version}, {"device", p->device}, {"model", p->model},
        {"tp", tp}, {"command", command ? command : ""}, {"code_rev", AR_CODE_REV}, {"created", created},
        {"replay_steps", steps}, {"replay_ratio", ratio},
        {"attn_prompts", p->prompts_together ? "together" : "alone"}, {"skew_alpha_default", alpha},
    };
    if (sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO meta VALUES(?, ?)", -1, &st, NULL) != SQLITE_OK) goto fail;
    size_t num_meta = sizeof meta / sizeof meta[0] - (profile_version(p) < 3 ? 2 : 0);   /* v1/v2 files as before */
    for (size_t i = 0; i < num_meta; i++) {
        sqlite3_reset(st);
        sqlite3_bind_text(st, 1, meta[i][0], -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, meta[i][1], -1, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_DONE) goto fail;
    }
    sqlite3_finalize(st);
    if (sqlite3_prepare_v2(db, "INSERT INTO gemm VALUES(?, ?, ?, ?, ?, ?)", -1, &st, NULL) != SQLITE_OK) goto fail;
    for (int g = 0; g < p->num_gemms; g++)
        for (int i = 0; i < gemm_points(p, g); i++) {
            sqlite3_reset(st);
            sqlite3_bind_text(st, 1, p->gemm_name[g], -1, SQLITE_STATIC);
            sqlite3_bind_int(st, 2, p->gemm_per_layer[g]);
            sqlite3_bind_int(st, 3, p->gemm_k[g]);
            sqlite3_bind_int(st, 4, p->gemm_n[g]);
            sqlite3_bind_int64(st, 5, (sqlite3_int64)p->m[i]);
            sqlite3_bind_double(st, 6, p->gemm_us[g][i]);
            if (sqlite3_step(st) != SQLITE_DONE) goto fail;
        }
    sqlite3_finalize(st);
    for (int t = 0; t < 2; t++) {
        const char *sql = t ? "INSERT INTO attn_prefill VALUES(?, ?, ?)" : "INSERT INTO attn_decode VALUES(?, ?, ?)";
        int na = t ? p->num_pre_q : p->num_dec_batch, nb = t ? p->num_pre_ctx : p->num_dec_ctx;
        if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) goto fail;
        for (int i = 0; i < na; i++)
            for (int j = 0; j < nb; j++) {
                sqlite3_reset(st);
                sqlite3_bind_int64(st, 1, (sqlite3_int64)(t ? p->pre_q[i] : p->dec_batch[i]));
                sqlite3_bind_int64(st, 2, (sqlite3_int64)(t ? p->pre_ctx[j] : p->dec_ctx[j]));
                sqlite3_bind_double(st, 3, t ? p->pre_us[i][j] : p->dec_us[i][j]);
                if (sqlite3_step(st) != SQLITE_DONE) goto fail;
            }
        sqlite3_finalize(st);
    }
    st = NULL;
    if (p->num_mix_q > 0) {
        if (sqlite3_prepare_v2(db, "INSERT INTO attn_mixed VALUES(?, ?, ?, ?, ?)", -1, &st, NULL) != SQLITE_OK) goto fail;
        size_t cell = 0;
        for (int i = 0; i < p->num_mix_q; i++)
            for (int j = 0; j < p->num_mix_ctx; j++)
                for (int k = 0; k < p->num_mix_batch; k++)
                    for (int l = 0; l < p->num_mix_dctx; l++, cell++) {
                        sqlite3_reset(st);
                        sqlite3_bind_int64(st, 1, (sqlite3_int64)p->mix_q[i]);
                        sqlite3_bind_int64(st, 2, (sqlite3_int64)p->mix_ctx[j]);
                        sqlite3_bind_int64(st, 3, (sqlite3_int64)p->mix_batch[k]);
                        sqlite3_bind_int64(st, 4, (sqlite3_int64)p->mix_dctx[l]);
                        sqlite3_bind_double(st, 5, p->mix_us[cell]);
                        if (sqlite3_step(st) != SQLITE_DONE) goto fail;
                    }
        sqlite3_finalize(st);
        st = NULL;
    }
    if (p->num_skew_pc > 0) {
        if (sqlite3_exec(db,
                         "CREATE TABLE attn_skew_axis(axis INTEGER NOT NULL, bin INTEGER NOT NULL, upper REAL NOT NULL,"
                         " PRIMARY KEY(axis, bin));"
                         "CREATE TABLE attn_skew(pc INTEGER NOT NULL, n INTEGER NOT NULL, rate INTEGER NOT NULL,"
                         " largest INTEGER NOT NULL, kp INTEGER NOT NULL, alpha REAL NOT NULL,"
                         " PRIMARY KEY(pc, n, rate, largest, kp)) WITHOUT ROWID;",
                         NULL, NULL, NULL) != SQLITE_OK ||
            sqlite3_prepare_v2(db, "INSERT INTO attn_skew_axis VALUES(?, ?, ?)", -1, &st, NULL) != SQLITE_OK)
            goto fail;
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < p->skew_bins[a]; b++) {
                sqlite3_reset(st);
                sqlite3_bind_int(st, 1, a);
                sqlite3_bind_int(st, 2, b);
                sqlite3_bind_double(st, 3, p->skew_upper[a][b]);
                if (sqlite3_step(st) != SQLITE_DONE) goto fail;
            }
        sqlite3_finalize(st);
        st = NULL;
        if (sqlite3_prepare_v2(db, "INSERT INTO attn_skew VALUES(?, ?, ?, ?, ?, ?)", -1, &st, NULL) != SQLITE_OK)
            goto fail;
        size_t cells = (size_t)p->num_skew_pc * p->skew_bins[0] * p->skew_bins[1] * p->skew_bins[2] * p->skew_bins[3];
        for (size_t c = 0; c < cells; c++) {
            if (isnan(p->skew_alpha[c])) continue;
            size_t rest = c;
            int idx[4];
            for (int a = 3; a >= 0; a--) {
                idx[a] = (int)(rest % (size_t)p->skew_bins[a]);
                rest /= (size_t)p->skew_bins[a];
            }
            sqlite3_reset(st);
            sqlite3_bind_int64(st, 1, (sqlite3_int64)p->skew_pc[rest]);
            for (int a = 0; a < 4; a++) sqlite3_bind_int(st, 2 + a, idx[a]);
            sqlite3_bind_double(st, 6, p->skew_alpha[c]);
            if (sqlite3_step(st) != SQLITE_DONE) goto fail;
        }
        sqlite3_finalize(st);
        st = NULL;
    }
    if (sqlite3_exec(db, "COMMIT;", NULL, NULL, NULL) != SQLITE_OK) goto fail;
    rc = 0;
    goto done;
fail:
    sql_fail(db, path, err, err_len);
done:
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rc;
}

/* The file a profile for path is written to first: in path's directory, so that the rename into
 * place is atomic. */
static void temp_path_of(const char *path, char *buf, size_t len)
{
    snprintf(buf, len, "%s.tmp-%ld", path, (long)getpid());
}

/* The scratch database a --trace replay writes beside the temporary profile tmp. */
static void scratch_path_of(const char *tmp, char *buf, size_t len)
{
    snprintf(buf, len, "%s.replay-scratch.db", tmp);
}

/* The files SQLite keeps beside a database, after the database itself. */
static const char *const sqlite_sides[] = {"", "-journal", "-wal", "-shm"};
#define NUM_SIDES (int)(sizeof sqlite_sides / sizeof sqlite_sides[0])

/* Removes a database written here (the temporary profile, a --trace replay's scratch database)
 * and the files SQLite keeps beside one. */
static void remove_temp(const char *tmp)
{
    char side[1200];
    for (int i = 0; i < NUM_SIDES; i++) {
        snprintf(side, sizeof side, "%s%s", tmp, sqlite_sides[i]);
        unlink(side);
    }
}

/* The temporary files of the profile this process writes (DB.tmp-PID, its --trace replay's scratch
 * database, the files SQLite keeps beside each) are removed by what ends the process at once:
 * SIGINT, SIGTERM or SIGHUP outside the replay (traces/tmp_guard.c: the handler removes them,
 * then the signal takes its course), and the replay's watchdog, which ends the process from its
 * own thread when the step loop cannot end the run itself - a signal not answered within its
 * grace (inside a step, while the backend closes), a backend that faulted or hung - through its
 * exit hook, which also says so after the watchdog's own message (that names the scratch database
 * as if it stayed).  Inside the replay SIGINT and SIGTERM are the replay's: it returns 130 / 143
 * and the profile removes the files itself. */
static ar_tmp_guard temps_guard;
static char temps_note[2600];
static size_t temps_note_len;

static void remove_temps_at_replay_exit(void)
{
    ar_tmp_guard_remove_now();
    for (size_t done = 0; done < temps_note_len;) {
        ssize_t w = write(2, temps_note + done, temps_note_len - done);
        if (w <= 0) break;
        done += (size_t)w;
    }
}

/* From here until unguard_temps the temporary files of a profile of path are removed by whatever
 * ends the process at once (above). */
static void guard_temps(const char *path)
{
    char tmp[1000], scratch[1100], names[2 * NUM_SIDES][1200];
    const char *list[2 * NUM_SIDES];
    _Static_assert(2 * NUM_SIDES <= AR_TMP_GUARD_MAX, "the guard holds every temporary file");
    temp_path_of(path, tmp, sizeof tmp);
    scratch_path_of(tmp, scratch, sizeof scratch);
    for (int i = 0; i < NUM_SIDES; i++) {
        snprintf(names[i], sizeof names[0], "%s%s", tmp, sqlite_sides[i]);
        snprintf(names[NUM_SIDES + i], sizeof names[0], "%s%s", scratch, sqlite_sides[i]);
    }
    for (int i = 0; i < 2 * NUM_SIDES; i++) list[i] = names[i];
    snprintf(temps_note, sizeof temps_note, "profile: the --trace replay ended the process; nothing was written: %s "
             "stays as it was, and %s and the replay's scratch database are removed\n", path, tmp);
    temps_note_len = strlen(temps_note);
    ar_tmp_guard_arm_all(&temps_guard, list, 2 * NUM_SIDES);
    ar_watchdog_set_exit_hook(remove_temps_at_replay_exit);
}

/* The files are the caller's again (removed, or renamed into place); the handlers are put back. */
static void unguard_temps(void)
{
    ar_watchdog_set_exit_hook(NULL);
    ar_tmp_guard_disarm(&temps_guard);
}

/* A profile killed before its rename by what it cannot answer (SIGKILL, a crash) leaves PATH.tmp-PID
 * and its replay's scratch database beside path.  They are removed here when their process is
 * gone; those of a live process (another profile of path still running) stay. */
static void remove_stale_temps(const char *path)
{
    char dir[1024], prefix[1100], scratch[64];
    const char *slash = strrchr(path, '/');
    ar_path_dir(path, dir, sizeof dir);
    snprintf(prefix, sizeof prefix, "%s.tmp-", slash ? slash + 1 : path);
    scratch_path_of("", scratch, sizeof scratch);
    size_t plen = strlen(prefix), slen = strlen(scratch);
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, prefix, plen) != 0 || !isdigit((unsigned char)e->d_name[plen])) continue;
        char *rest = NULL;
        errno = 0;
        long pid = strtol(e->d_name + plen, &rest, 10);
        if (strncmp(rest, scratch, slen) == 0) rest += slen;   /* the scratch database's files */
        bool ours = false;
        for (int i = 0; i < NUM_SIDES; i++) ours = ours || strcmp(rest, sqlite_sides[i]) == 0;
        if (!ours || errno != 0 || pid <= 0 || pid > INT_MAX || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;   /* alive, or not ours to ask */
        char full[2400];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        unlink(full);
    }
    closedir(d);
}

/* Renames the finished profile tmp over path, which is checked again (minutes may have passed);
 * tmp is removed when that fails.  0, -1 (I/O) or -2 (path is not a profile any more). */
static int move_into_place(const char *tmp, const char *path, char *err, size_t err_len)
{
    if (ar_profile_check_replaceable(path, err, err_len) != 0) {
        remove_temp(tmp);
        return -2;
    }
    if (rename(tmp, path) != 0) {
        snprintf(err, err_len, "%s: cannot move the new profile %s into place: %s", path, tmp, strerror(errno));
        remove_temp(tmp);
        return -1;
    }
    return 0;
}

int ar_profile_save(const char *path, const ar_profile_table *p, const char *command, char *err, size_t err_len)
{
    if (ar_profile_check_replaceable(path, err, err_len) != 0) return -2;
    char tmp[1000];
    temp_path_of(path, tmp, sizeof tmp);
    remove_temp(tmp);
    if (write_profile(tmp, p, command, err, err_len) != 0) {
        remove_temp(tmp);
        return -1;
    }
    return move_into_place(tmp, path, err, err_len);
}

/* Sorted distinct values of one integer column, into out (at most cap). -1 when more. */
static int distinct_values(sqlite3 *db, const char *sql, double *out, int cap)
{
    sqlite3_stmt *st = NULL;
    int n = 0;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) return -1;
    while (sqlite3_step(st) == SQLITE_ROW) {
        if (n >= cap) { n = -1; break; }
        out[n++] = sqlite3_column_double(st, 0);
    }
    sqlite3_finalize(st);
    return n;
}

static int load_meta(sqlite3 *db, const char *path, ar_profile_table *p, char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT key, value FROM meta", -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: not a profile database (no table meta)", path);
        return 2;
    }
    bool format_ok = false;
    int version = 0;
    char prompts[16] = "alone", alpha[48] = "0";
    p->tp = 0;
    p->replay_ratio = 1.0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *k = (const char *)sqlite3_column_text(st, 0), *v = (const char *)sqlite3_column_text(st, 1);
        if (!k || !v) continue;
        if (strcmp(k, "format") == 0) format_ok = strcmp(v, PROFILE_FORMAT) == 0;
        else if (strcmp(k, "version") == 0) version = atoi(v);
        else if (strcmp(k, "device") == 0) snprintf(p->device, sizeof p->device, "%s", v);
        else if (strcmp(k, "model") == 0) snprintf(p->model, sizeof p->model, "%s", v);
        else if (strcmp(k, "tp") == 0) p->tp = atoi(v);
        else if (strcmp(k, "replay_steps") == 0) p->replay_steps = atoi(v);
        else if (strcmp(k, "replay_ratio") == 0) p->replay_ratio = atof(v);
        else if (strcmp(k, "attn_prompts") == 0) snprintf(prompts, sizeof prompts, "%.15s", v);
        else if (strcmp(k, "skew_alpha_default") == 0) snprintf(alpha, sizeof alpha, "%.47s", v);
    }
    sqlite3_finalize(st);
    if (!format_ok || version < 1 || version > PROFILE_VERSION) {
        snprintf(err, err_len, "%s: meta says this is not an %s database of version 1 to %d", path, PROFILE_FORMAT,
                 PROFILE_VERSION);
        return 2;
    }
    if (p->tp < 1 || !p->model[0] || !p->device[0]) {
        snprintf(err, err_len, "%s: meta needs device, model and tp >= 1", path);
        return 2;
    }
    if (!(p->replay_ratio > 0) || !isfinite(p->replay_ratio)) {
        snprintf(err, err_len, "%s: meta replay_ratio must be a positive number", path);
        return 2;
    }
    char *end;
    p->skew_alpha_default = strtod(alpha, &end);
    p->prompts_together = strcmp(prompts, "together") == 0;
    if ((!p->prompts_together && strcmp(prompts, "alone") != 0) || end == alpha || *end ||
        !isfinite(p->skew_alpha_default)) {
        snprintf(err, err_len, "%s: meta attn_prompts must be 'together' or 'alone' and skew_alpha_default a number",
                 path);
        return 2;
    }
    return 0;
}

/* Fills table[i][j] from "SELECT a, b, us" rows; every (xa[i], xb[j]) must appear once. */
static int load_grid(sqlite3 *db, const char *path, const char *table, const char *cols, const double *xa, int na,
                     const double *xb, int nb, double out[AR_PROF_MAX_AXIS][AR_PROF_MAX_AXIS], char *err,
                     size_t err_len)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT %s, us FROM %s", cols, table);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: %s", path, sqlite3_errmsg(db));
        return 2;
    }
    bool seen[AR_PROF_MAX_AXIS][AR_PROF_MAX_AXIS];
    memset(seen, 0, sizeof seen);
    int rc = 0;
    while (rc == 0 && sqlite3_step(st) == SQLITE_ROW) {
        double a = sqlite3_column_double(st, 0), b = sqlite3_column_double(st, 1), us = sqlite3_column_double(st, 2);
        int i = 0, j = 0;
        while (i < na && xa[i] != a) i++;
        while (j < nb && xb[j] != b) j++;
        if (i == na || j == nb || seen[i][j] || !(us > 0) || !isfinite(us)) {
            snprintf(err, err_len, "%s: table %s: row (%s) = (%g, %g) has a time that is not positive or repeats",
                     path, table, cols, a, b);
            rc = 2;
        } else {
            seen[i][j] = true;
            out[i][j] = us;
        }
    }
    sqlite3_finalize(st);
    for (int i = 0; i < na && rc == 0; i++)
        for (int j = 0; j < nb && rc == 0; j++)
            if (!seen[i][j]) {
                snprintf(err, err_len, "%s: table %s lacks (%s) = (%g, %g): the grid must be complete", path, table,
                         cols, xa[i], xb[j]);
                rc = 2;
            }
    return rc;
}

/* Index of v in xs[n] (exact), -1 when absent. */
static int axis_index(const double *xs, int n, double v)
{
    for (int i = 0; i < n; i++)
        if (xs[i] == v) return i;
    return -1;
}

/* Whether the database has a table of that name. */
static bool has_table(sqlite3 *db, const char *name)
{
    sqlite3_stmt *st = NULL;
    bool present = sqlite3_prepare_v2(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", -1, &st,
                                      NULL) == SQLITE_OK && sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC) == SQLITE_OK &&
                   sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    return present;
}

/* The optional attn_mixed table: complete over its four axes, positive times, at most
 * AR_PROF_MAX_MIX cells. */
static int load_mixed(sqlite3 *db, const char *path, ar_profile_table *p, char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    if (!has_table(db, "attn_mixed")) return 0;
    p->num_mix_q = distinct_values(db, "SELECT DISTINCT q FROM attn_mixed ORDER BY q", p->mix_q, AR_PROF_MAX_AXIS);
    p->num_mix_ctx = distinct_values(db, "SELECT DISTINCT ctx FROM attn_mixed ORDER BY ctx", p->mix_ctx, AR_PROF_MAX_AXIS);
    p->num_mix_batch = distinct_values(db, "SELECT DISTINCT batch FROM attn_mixed ORDER BY batch", p->mix_batch,
                                       AR_PROF_MAX_AXIS);
    p->num_mix_dctx = distinct_values(db, "SELECT DISTINCT dctx FROM attn_mixed ORDER BY dctx", p->mix_dctx,
                                      AR_PROF_MAX_AXIS);
    if (p->num_mix_q < 1 || p->num_mix_ctx < 1 || p->num_mix_batch < 1 || p->num_mix_dctx < 1 || p->mix_q[0] < 2 ||
        p->mix_batch[0] < 1 ||
        (double)p->num_mix_q * p->num_mix_ctx * p->num_mix_batch * p->num_mix_dctx > AR_PROF_MAX_MIX) {
        snprintf(err, err_len, "%s: table attn_mixed empty, with q < 2 or batch < 1, over %d values on an axis or over "
                 "%d cells", path, AR_PROF_MAX_AXIS, AR_PROF_MAX_MIX);
        p->num_mix_q = 0;
        return 2;
    }
    size_t cells = (size_t)p->num_mix_q * p->num_mix_ctx * p->num_mix_batch * p->num_mix_dctx;
    for (size_t c = 0; c < cells; c++) p->mix_us[c] = NAN;
    int rc = 0;
    if (sqlite3_prepare_v2(db, "SELECT q, ctx, batch, dctx, us FROM attn_mixed", -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: %s", path, sqlite3_errmsg(db));
        rc = 2;
    }
    while (rc == 0 && sqlite3_step(st) == SQLITE_ROW) {
        double x[4], us = sqlite3_column_double(st, 4);
        for (int a = 0; a < 4; a++) x[a] = sqlite3_column_double(st, a);
        int i = axis_index(p->mix_q, p->num_mix_q, x[0]), j = axis_index(p->mix_ctx, p->num_mix_ctx, x[1]);
        int k = axis_index(p->mix_batch, p->num_mix_batch, x[2]), l = axis_index(p->mix_dctx, p->num_mix_dctx, x[3]);
        size_t c = (((size_t)i * p->num_mix_ctx + j) * p->num_mix_batch + k) * p->num_mix_dctx + l;
        if (i < 0 || j < 0 || k < 0 || l < 0 || !isnan(p->mix_us[c]) || !(us > 0) || !isfinite(us)) {
            snprintf(err, err_len, "%s: table attn_mixed: row (q, ctx, batch, dctx) = (%g, %g, %g, %g) has a time that "
                     "is not positive or repeats", path, x[0], x[1], x[2], x[3]);
            rc = 2;
        } else {
            p->mix_us[c] = us;
        }
    }
    sqlite3_finalize(st);
    for (size_t c = 0; c < cells && rc == 0; c++)
        if (isnan(p->mix_us[c])) {
            size_t l = c % p->num_mix_dctx, k = c / p->num_mix_dctx % p->num_mix_batch;
            size_t j = c / p->num_mix_dctx / p->num_mix_batch % p->num_mix_ctx;
            size_t i = c / p->num_mix_dctx / p->num_mix_batch / p->num_mix_ctx;
            snprintf(err, err_len, "%s: table attn_mixed lacks (q, ctx, batch, dctx) = (%g, %g, %g, %g): the grid must be "
                     "complete", path, p->mix_q[i], p->mix_ctx[j], p->mix_batch[k], p->mix_dctx[l]);
            rc = 2;
        }
    if (rc) p->num_mix_q = 0;
    return rc;
}

/* The optional attn_skew tables (version 3): every axis 1 to AR_PROF_SKEW_AXIS bins with bounds
 * ascending, every row's bins on them, its pc one of at most AR_PROF_SKEW_AXIS values, one row a
 * cell, a finite alpha. */
static int load_skew(sqlite3 *db, const char *path, ar_profile_table *p, char *err, size_t err_len)
{
    sqlite3_stmt *st = NULL;
    if (!has_table(db, "attn_skew")) return 0;
    int rc = 0;
    for (int a = 0; a < 4 && rc == 0; a++) {
        char sql[96];
        snprintf(sql, sizeof sql, "SELECT upper FROM attn_skew_axis WHERE axis = %d ORDER BY bin", a);
        int k = distinct_values(db, sql, p->skew_upper[a], AR_PROF_SKEW_AXIS);
        bool ascending = k >= 1;
        for (int b = 1; ascending && b < k; b++) ascending = p->skew_upper[a][b] > p->skew_upper[a][b - 1];
        if (!ascending) {
            snprintf(err, err_len, "%s: table attn_skew_axis: axis %d needs 1 to %d bins with ascending bounds", path, a,
                     AR_PROF_SKEW_AXIS);
            rc = 2;
        }
        p->skew_bins[a] = k;
    }
    if (rc == 0) {
        p->num_skew_pc = distinct_values(db, "SELECT DISTINCT pc FROM attn_skew ORDER BY pc", p->skew_pc,
                                         AR_PROF_SKEW_AXIS);
        size_t cells = (size_t)(p->num_skew_pc > 0 ? p->num_skew_pc : 0);
        for (int a = 0; a < 4; a++) cells *= (size_t)p->skew_bins[a];
        if (p->num_skew_pc < 1 || cells > AR_PROF_MAX_SKEW) {
            snprintf(err, err_len, "%s: table attn_skew empty, over %d prompt-token values or over %d cells", path,
                     AR_PROF_SKEW_AXIS, AR_PROF_MAX_SKEW);
            rc = 2;
        }
        for (size_t c = 0; c < cells && rc == 0; c++) p->skew_alpha[c] = NAN;
    }
    if (rc == 0 && sqlite3_prepare_v2(db, "SELECT pc, n, rate, largest, kp, alpha FROM attn_skew", -1, &st, NULL) !=
                       SQLITE_OK) {
        snprintf(err, err_len, "%s: %s", path, sqlite3_errmsg(db));
        rc = 2;
    }
    while (rc == 0 && sqlite3_step(st) == SQLITE_ROW) {
        int ip = axis_index(p->skew_pc, p->num_skew_pc, sqlite3_column_double(st, 0));
        size_t c = (size_t)(ip < 0 ? 0 : ip);
        bool ok = ip >= 0;
        for (int a = 0; a < 4; a++) {
            int b = sqlite3_column_int(st, 1 + a);
            ok = ok && b >= 0 && b < p->skew_bins[a];
            c = c * (size_t)p->skew_bins[a] + (size_t)(ok ? b : 0);
        }
        double alpha = sqlite3_column_double(st, 5);
        if (!ok || !isnan(p->skew_alpha[c]) || !isfinite(alpha)) {
            snprintf(err, err_len, "%s: table attn_skew: row (pc %g) has a bin off its axis, repeats a cell or has no "
                     "finite alpha", path, sqlite3_column_double(st, 0));
            rc = 2;
        } else {
            p->skew_alpha[c] = alpha;
        }
    }
    sqlite3_finalize(st);
    if (rc != 0) p->num_skew_pc = 0;
    return rc;
}

int ar_profile_load(const char *path, ar_profile_table *p, char *err, size_t err_len)
{
    memset(p, 0, sizeof *p);
    sqlite3 *db = NULL;
    if (access(path, R_OK) != 0 || sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: cannot open the profile database", path);
        sqlite3_close(db);
        return 2;
    }
    sqlite3_busy_timeout(db, ar_db_busy_timeout_ms());   /* another process writing it: wait, then say so */
    int rc = load_meta(db, path, p, err, err_len);
    sqlite3_stmt *st = NULL;
    if (rc == 0) {
        p->num_m = distinct_values(db, "SELECT DISTINCT m FROM gemm ORDER BY m", p->m, AR_PROF_MAX_M);
        if (sqlite3_prepare_v2(db, "SELECT DISTINCT name, per_layer, k, n FROM gemm ORDER BY rowid", -1, &st, NULL) !=
            SQLITE_OK || p->num_m < 1 || p->m[0] < 1) {
            snprintf(err, err_len, "%s: table gemm missing, empty, with M < 1 or over %d token counts", path,
                     AR_PROF_MAX_M);
            rc = 2;
        }
    }
    while (rc == 0 && sqlite3_step(st) == SQLITE_ROW) {
        int g = p->num_gemms;
        const char *name = (const char *)sqlite3_column_text(st, 0);
        if (g >= AR_PROF_MAX_GEMMS || !name) {
            snprintf(err, err_len, "%s: table gemm has more than %d shapes or a shape without a name", path,
                     AR_PROF_MAX_GEMMS);
            rc = 2;
            break;
        }
        for (int h = 0; h < g; h++)
            if (strcmp(p->gemm_name[h], name) == 0) {
                snprintf(err, err_len, "%s: table gemm: shape %s has two different k/n/per_layer", path, name);
                rc = 2;
            }
        snprintf(p->gemm_name[g], sizeof p->gemm_name[g], "%s", name);
        p->gemm_per_layer[g] = sqlite3_column_int(st, 1);
        if (p->gemm_per_layer[g] < -1 || p->gemm_per_layer[g] > 64) {
            snprintf(err, err_len, "%s: table gemm: shape %s has per_layer %d (calls per layer, 0 once at the requests, "
                     "-1 once at the tokens)", path, name, p->gemm_per_layer[g]);
            rc = 2;
        }
        p->gemm_k[g] = sqlite3_column_int(st, 2);
        p->gemm_n[g] = sqlite3_column_int(st, 3);
        p->num_gemms++;
    }
    sqlite3_finalize(st);
    st = NULL;
    for (int g = 0; g < p->num_gemms && rc == 0; g++) {
        double grid[AR_PROF_MAX_M];
        char sql[160];
        snprintf(sql, sizeof sql, "SELECT us FROM gemm WHERE name = '%s' ORDER BY m", p->gemm_name[g]);
        char msql[160];
        snprintf(msql, sizeof msql, "SELECT m FROM gemm WHERE name = '%s' ORDER BY m", p->gemm_name[g]);
        double ms[AR_PROF_MAX_M];
        int n = strchr(p->gemm_name[g], '\'') ? -1 : distinct_values(db, sql, grid, AR_PROF_MAX_M);
        bool prefix = n >= 1 && distinct_values(db, msql, ms, AR_PROF_MAX_M) == n;
        for (int i = 0; prefix && i < n; i++) prefix = ms[i] == p->m[i];
        /* an operation run at the number of requests may stop early (a prefix of the grid) */
        if (n != p->num_m && !(p->gemm_per_layer[g] == 0 && prefix)) {
            snprintf(err, err_len, "%s: table gemm: shape %s is not timed at every token count of the grid%s", path,
                     p->gemm_name[g], p->gemm_per_layer[g] == 0 ? " (or at a first part of it)" : "");
            rc = 2;
        }
        p->gemm_num_m[g] = n;
        for (int i = 0; i < n && rc == 0; i++) {
            if (!(grid[i] > 0) || !isfinite(grid[i])) {
                snprintf(err, err_len, "%s: table gemm: shape %s at M = %g has a time that is not positive", path,
                         p->gemm_name[g], p->m[i]);
                rc = 2;
            }
            p->gemm_us[g][i] = grid[i];
        }
    }
    if (rc == 0) {
        p->num_dec_batch = distinct_values(db, "SELECT DISTINCT batch FROM attn_decode ORDER BY batch", p->dec_batch,
                                           AR_PROF_MAX_AXIS);
        p->num_dec_ctx = distinct_values(db, "SELECT DISTINCT ctx FROM attn_decode ORDER BY ctx", p->dec_ctx,
                                         AR_PROF_MAX_AXIS);
        p->num_pre_q = distinct_values(db, "SELECT DISTINCT q FROM attn_prefill ORDER BY q", p->pre_q,
                                       AR_PROF_MAX_AXIS);
        p->num_pre_ctx = distinct_values(db, "SELECT DISTINCT ctx FROM attn_prefill ORDER BY ctx", p->pre_ctx,
                                         AR_PROF_MAX_AXIS);
        if (p->num_dec_batch < 1 || p->num_dec_ctx < 1 || p->num_pre_q < 1 || p->num_pre_ctx < 1 ||
            p->dec_batch[0] < 1 || p->pre_q[0] < 1) {
            snprintf(err, err_len, "%s: tables attn_decode / attn_prefill missing, empty, or over %d values on an "
                     "axis", path, AR_PROF_MAX_AXIS);
            rc = 2;
        }
    }
    if (rc == 0)
        rc = load_grid(db, path, "attn_decode", "batch, ctx", p->dec_batch, p->num_dec_batch, p->dec_ctx,
                       p->num_dec_ctx, p->dec_us, err, err_len);
    if (rc == 0)
        rc = load_grid(db, path, "attn_prefill", "q, ctx", p->pre_q, p->num_pre_q, p->pre_ctx, p->num_pre_ctx,
                       p->pre_us, err, err_len);
    if (rc == 0) rc = load_mixed(db, path, p, err, err_len);
    if (rc == 0) rc = load_skew(db, path, p, err, err_len);
    if (rc != 0) ar_db_lock_error(db, path, NULL, err, err_len);   /* a lock said as such, not as a missing table */
    sqlite3_close(db);
    return rc;
}

/* ---- what to measure --------------------------------------------------------------------------------- */

typedef struct profile_grid {
    int num_m, num_dec_batch, num_dec_ctx, num_pre_q, num_pre_ctx;
    const int *m, *dec_batch, *dec_ctx, *pre_q, *pre_ctx;
} profile_grid;

static const int full_m[] = {1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
                             3072, 4096, 6144, 8192, 16384};
static const int full_dec_batch[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
static const int full_dec_ctx[] = {64, 256, 1024, 2048, 4096, 8192, 16384};
static const int full_pre_q[] = {16, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
static const int full_pre_ctx[] = {0, 512, 2048, 8192, 16384};
static const int quick_m[] = {1, 16, 256, 2048};
static const int quick_dec_batch[] = {1, 8, 64};
static const int quick_dec_ctx[] = {256, 2048};
static const int quick_pre_q[] = {64, 512};
static const int quick_pre_ctx[] = {0, 1024};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

static profile_grid grid_of(bool quick)
{
    profile_grid g;
    if (quick) {
        g = (profile_grid){COUNT(quick_m), COUNT(quick_dec_batch), COUNT(quick_dec_ctx), COUNT(quick_pre_q),
                           COUNT(quick_pre_ctx), quick_m, quick_dec_batch, quick_dec_ctx, quick_pre_q, quick_pre_ctx};
    } else {
        g = (profile_grid){COUNT(full_m), COUNT(full_dec_batch), COUNT(full_dec_ctx), COUNT(full_pre_q),
                           COUNT(full_pre_ctx), full_m, full_dec_batch, full_dec_ctx, full_pre_q, full_pre_ctx};
    }
    return g;
}

/* The layer's GEMM shapes for one rank and the table's axes. */
static void setup_table(ar_profile_table *p, const ar_model_preset *preset, int tp, const profile_grid *g)
{
    const ar_model *m = &preset->model;
    int hd = m->head_size, h = preset->hidden;
    struct { const char *name; int k, n, per_layer; } shapes[] = {
        {"qkv", h, (m->num_q_heads + 2 * m->num_kv_heads) * hd / tp, 1},
        {"o", m->num_q_heads * hd / tp, h, 1},
        {"gate_up", h, 2 * preset->intermediate / tp, 1},
        {"down", preset->intermediate / tp, h, 1},
        {"lm_head", h, preset->vocab / tp, 0},
    };
    p->num_gemms = COUNT(shapes);
    for (int i = 0; i < p->num_gemms; i++) {
        snprintf(p->gemm_name[i], sizeof p->gemm_name[i], "%s", shapes[i].name);
        p->gemm_k[i] = shapes[i].k;
        p->gemm_n[i] = shapes[i].n;
        p->gemm_per_layer[i] = shapes[i].per_layer;
    }
    snprintf(p->model, sizeof p->model, "%s", preset->name);
    p->tp = tp;
    p->replay_ratio = 1.0;
    p->num_m = g->num_m;
    for (int i = 0; i < g->num_m; i++) p->m[i] = g->m[i];
    for (int i = 0; i < p->num_gemms; i++) p->gemm_num_m[i] = g->num_m;
    p->num_dec_batch = g->num_dec_batch;
    p->num_dec_ctx = g->num_dec_ctx;
    p->num_pre_q = g->num_pre_q;
    p->num_pre_ctx = g->num_pre_ctx;
    for (int i = 0; i < g->num_dec_batch; i++) p->dec_batch[i] = g->dec_batch[i];
    for (int i = 0; i < g->num_dec_ctx; i++) p->dec_ctx[i] = g->dec_ctx[i];
    for (int i = 0; i < g->num_pre_q; i++) p->pre_q[i] = g->pre_q[i];
    for (int i = 0; i < g->num_pre_ctx; i++) p->pre_ctx[i] = g->pre_ctx[i];
}

/* --synthetic: the roofline's own numbers for every grid point (graphs off, one rank). */
static void fill_synthetic(ar_profile_table *p, const ar_steptime *roof)
{
    const ar_device_spec *d = &roof->device;
    double peak = d->peak_flops * roof->gemm_efficiency, bw = d->mem_bw * roof->bw_efficiency;
    for (int g = 0; g < p->num_gemms; g++)
        for (int i = 0; i < p->num_m; i++) {
            double mm = p->m[i], k = p->gemm_k[g], n = p->gemm_n[g];
            p->gemm_us[g][i] = 1e6 * fmax(2 * mm * k * n / peak, 2 * (k * n + mm * (k + n)) / bw);
        }
    ar_steptime one = *roof;   /* one layer, one rank: attention from the roofline's per-request term */
    one.overhead_s = one.per_req_overhead_s = 0;
    one.tensor_parallel = 1;
    one.cudagraph_max = 0;
    one.async_scheduling = false;
    ar_model_preset layer = *roof->preset;
    layer.model.num_layers = 1;
    layer.model.num_q_heads /= p->tp;
    layer.model.num_kv_heads /= p->tp;
    one.preset = &layer;
    for (int t = 0; t < 2; t++) {
        int na = t ? p->num_pre_q : p->num_dec_batch, nb = t ? p->num_pre_ctx : p->num_dec_ctx;
        for (int i = 0; i < na; i++)
            for (int j = 0; j < nb; j++) {
                int reqs = t ? 1 : (int)p->dec_batch[i], q = t ? (int)p->pre_q[i] : 1;
                int c = (int)(t ? p->pre_ctx[j] : p->dec_ctx[j]);
                int *ql = malloc((size_t)reqs * sizeof(int)), *cl = malloc((size_t)reqs * sizeof(int));
                if (!ql || !cl) { free(ql); free(cl); continue; }
                for (int r = 0; r < reqs; r++) { ql[r] = q; cl[r] = c; }
                ar_batch_features f = {.num_reqs = reqs, .num_tokens = reqs * q, .query_lens = ql, .context_lens = cl};
                ar_step_parts parts;
                ar_steptime_parts(&one, &f, &parts);
                (t ? p->pre_us : p->dec_us)[i][j] = 1e6 * parts.attn_s;
                free(ql);
                free(cl);
            }
    }
}

int ar_profile_time_attention(const char *backend_name, const ar_model *model, int tp, int batch, int q, int ctx,
                              int repeat, double *us, char *err, size_t err_len)
{
    const ar_backend *be = ar_backend_find(backend_name);
    if (!be) {
        snprintf(err, err_len, "unknown backend '%s'", backend_name);
        return 2;
    }
    const int block = 16;
    int seq = ctx + q, blocks_per_req = (seq + block - 1) / block;
    ar_run_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.model = *model;
    cfg.model.num_q_heads /= tp;
    cfg.model.num_kv_heads /= tp;
    cfg.block_size = block;
    cfg.num_blocks = batch * blocks_per_req + 1;
    cfg.dtype = cfg.kv_dtype = AR_BF16;
    cfg.kv_scale = 1.0;
    cfg.num_layers = 1;
    cfg.seed = 1;
    cfg.data = AR_DATA_NORMAL;
    cfg.fault = AR_FAULT_NONE;
    cfg.repeat = repeat > 0 ? repeat : 1;
    char why[512];
    if (!be->check(&cfg, why, sizeof why)) {
        snprintf(err, err_len, "backend %s cannot run this shape: %s", be->name, why);
        return 2;
    }
    int tokens = batch * q;
    int *qsl = malloc((size_t)(batch + 1) * sizeof(int)), *seq_lens = malloc((size_t)batch * sizeof(int));
    int *ctx_lens = malloc((size_t)batch * sizeof(int));
    int *table = malloc((size_t)batch * blocks_per_req * sizeof(int));
    uint64_t *keys = malloc((size_t)batch * blocks_per_req * sizeof(uint64_t));
    uint64_t *req_keys = malloc((size_t)batch * sizeof(uint64_t));
    int64_t *slots = malloc((size_t)tokens * sizeof(int64_t));
    size_t out_elems = (size_t)tokens * cfg.model.num_q_heads * (size_t)(model->v_head_dim ? model->v_head_dim : model->head_size);
    float *out = be->needs_gpu ? NULL : malloc(out_elems * sizeof(float));
    float *lse = be->needs_gpu ? NULL : malloc((size_t)tokens * cfg.model.num_q_heads * sizeof(float));
    void *state = NULL;
    int rc = 3;
    if (!qsl || !seq_lens || !ctx_lens || !table || !keys || !req_keys || !slots || (!be->needs_gpu && (!out || !lse))) {
        snprintf(err, err_len, "out of memory");
        goto done;
    }
    qsl[0] = 0;
    for (int r = 0; r < batch; r++) {
        qsl[r + 1] = qsl[r] + q;
        seq_lens[r] = seq;
        ctx_lens[r] = ctx;
        req_keys[r] = (uint64_t)r + 1;
        for (int b = 0; b < blocks_per_req; b++) {
            table[r * blocks_per_req + b] = 1 + r * blocks_per_req + b;
            keys[r * blocks_per_req + b] = ((uint64_t)r << 32) + (uint64_t)b + 1;
        }
        for (int t = 0; t < q; t++) {
            int pos = ctx + t;
            slots[qsl[r] + t] = (int64_t)table[r * blocks_per_req + pos / block] * block + pos % block;
        }
    }
    ar_batch b = {.step = 0, .num_reqs = batch, .num_tokens = tokens, .query_start_loc = qsl, .seq_lens = seq_lens,
                  .context_lens = ctx_lens, .max_query_len = q, .max_seq_len = seq,
                  .max_blocks_per_req = blocks_per_req, .block_table = table, .block_keys = keys,
                  .req_keys = req_keys, .slot_mapping = slots, .common_prefix_len = 0};
    int orc = be->open(&cfg, &state, err, err_len);
    if (orc != 0) { rc = orc; state = NULL; goto done; }
    ar_forward_out o;
    memset(&o, 0, sizeof o);
    o.out = out;
    o.lse = lse;
    if (be->prepare(state, &b, err, err_len) != 0 || be->forward(state, 0, &b, &o, err, err_len) != 0) goto done;
    *us = o.total_us;
    rc = *us > 0 ? 0 : 3;
    if (rc) snprintf(err, err_len, "backend %s reported no time", be->name);
done:
    if (state) be->close(state);
    free(qsl); free(seq_lens); free(ctx_lens); free(table); free(keys); free(req_keys); free(slots);
    free(out); free(lse);
    return rc;
}

static double median_of(double *v, int n)
{
    return ar_quantile(v, n, 0.5);
}

/* The --trace of a profile of model: its reader, or NULL with err (the trace's FILE:LINE rule, or
 * the two models). */
static ar_trace_reader *open_trace_of(const char *trace, const char *model, char *err, size_t err_len)
{
    ar_trace_reader *r = ar_trace_open(trace, err, err_len);
    if (r && strcmp(ar_trace_header_of(r)->model.name, model) != 0) {
        snprintf(err, err_len, "%s: the trace is of model %s, the profile of %s", trace, ar_trace_header_of(r)->model.name,
                 model);
        ar_trace_close(r);
        r = NULL;
    }
    return r;
}

/* --trace: replays the first steps of a trace (one layer, no verification) into a scratch
 * database, then sets p->replay_ratio to the median of measured / interpolated attention time over
 * them and records each step in the profile database. */
static int measure_replayed_steps(ar_profile_table *p, const char *db_path, const char *trace, int max_steps,
                                  const char *backend, int repeat, char *err, size_t err_len)
{
    char scratch[1100], steps_arg[32], repeat_arg[16];
    ar_trace_reader *r = open_trace_of(trace, p->model, err, err_len);
    if (!r) return 2;
    scratch_path_of(db_path, scratch, sizeof scratch);
    remove_temp(scratch);
    snprintf(steps_arg, sizeof steps_arg, "0:%d", max_steps - 1);
    snprintf(repeat_arg, sizeof repeat_arg, "%d", repeat);
    char *argv[] = {"replay", (char *)trace, "--db", scratch, "--backend", (char *)backend, "--layers", "1",
                    "--verify", "off", "--steps", steps_arg, "--repeat", repeat_arg, "--quiet", NULL};
    int rrc = ar_replay_main(COUNT(argv) - 1, argv);
    if (rrc != 0 && rrc != 1) {
        /* an interrupted replay (SIGINT, SIGTERM: 130, 143) keeps its exit code */
        if (rrc == 130 || rrc == 143)
            snprintf(err, err_len, "replaying %s was interrupted (%s); nothing was written", trace,
                     rrc == 130 ? "SIGINT" : "SIGTERM");
        else
            snprintf(err, err_len, "replaying %s failed (exit %d)", trace, rrc);
        ar_trace_close(r);
        remove_temp(scratch);
        return rrc == 2 || rrc == 130 || rrc == 143 ? rrc : 3;
    }
    sqlite3 *sdb = NULL, *pdb = NULL;
    sqlite3_stmt *sel = NULL, *ins = NULL;
    double *ratios = malloc((size_t)max_steps * sizeof(double));
    int *ql = NULL, *cl = NULL, n_ratio = 0, rc = 3;
    if (!ratios || sqlite3_open_v2(scratch, &sdb, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK ||
        sqlite3_open(db_path, &pdb) != SQLITE_OK || sqlite3_exec(pdb, "BEGIN", NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(sdb, "SELECT time_us FROM steps WHERE run = (SELECT MAX(id) FROM runs) AND step = ?",
                           -1, &sel, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(pdb, "INSERT INTO attn_steps VALUES(?, ?, ?, ?, ?, ?)", -1, &ins, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: reading the replayed steps: %s", scratch, sdb ? sqlite3_errmsg(sdb) : "open failed");
        goto done;
    }
    int cap = ar_trace_header_of(r)->sched.max_num_seqs + 1;
    ql = malloc((size_t)cap * sizeof(int));
    cl = malloc((size_t)cap * sizeof(int));
    const ar_step *st;
    while (ql && cl && n_ratio < max_steps && ar_trace_next(r, &st, err, err_len) == 1) {
        int n = 0;
        for (int k = 0; k < st->num_scheduled && n < cap; k++, n++) {
            ql[n] = st->scheduled[k].num_tokens;
            cl[n] = 0;
            for (int i = 0; i < st->num_new; i++)
                if (strcmp(st->new_reqs[i].req, st->scheduled[k].req) == 0) cl[n] = st->new_reqs[i].num_computed_tokens;
            for (int i = 0; i < st->num_cached; i++)
                if (strcmp(st->cached[i].req, st->scheduled[k].req) == 0) cl[n] = st->cached[i].num_computed_tokens;
        }
        sqlite3_reset(sel);
        sqlite3_bind_int64(sel, 1, st->step);
        if (sqlite3_step(sel) != SQLITE_ROW) break;
        double measured = sqlite3_column_double(sel, 0), predicted = ar_profile_attention_us(p, ql, cl, n);
        sqlite3_reset(ins);
        sqlite3_bind_text(ins, 1, trace, -1, SQLITE_STATIC);
        sqlite3_bind_int64(ins, 2, st->step);
        sqlite3_bind_int(ins, 3, n);
        int tokens = 0;
        for (int i = 0; i < n; i++) tokens += ql[i];
        sqlite3_bind_int(ins, 4, tokens);
        sqlite3_bind_double(ins, 5, measured);
        sqlite3_bind_double(ins, 6, predicted);
        if (sqlite3_step(ins) != SQLITE_DONE) break;
        if (measured > 0 && predicted > 0) ratios[n_ratio++] = measured / predicted;
    }
    if (n_ratio == 0) {
        snprintf(err, err_len, "%s: no replayed step with a measured time", trace);
        goto done;
    }
    if (sqlite3_exec(pdb, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: %s", db_path, sqlite3_errmsg(pdb));
        goto done;
    }
    p->replay_steps = n_ratio;
    p->replay_ratio = median_of(ratios, n_ratio);
    rc = 0;
done:
    ar_trace_close(r);
    sqlite3_finalize(sel);
    sqlite3_finalize(ins);
    sqlite3_close(sdb);
    sqlite3_close(pdb);
    remove_temp(scratch);
    free(ratios);
    free(ql);
    free(cl);
    return rc;
}

/* Writes the replay_ratio into an already saved profile. */
static int store_ratio(const char *db_path, const ar_profile_table *p, char *err, size_t err_len)
{
    sqlite3 *db = NULL;
    char sql[256];
    snprintf(sql, sizeof sql,
             "UPDATE meta SET value = '%d' WHERE key = 'replay_steps'; UPDATE meta SET value = '%.6f' WHERE key = "
             "'replay_ratio';", p->replay_steps, p->replay_ratio);
    int rc = sqlite3_open(db_path, &db) == SQLITE_OK && sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
    if (rc) sql_fail(db, db_path, err, err_len);
    sqlite3_close(db);
    return rc;
}

/* ---- the command ---------------------------------------------------------------------------------------- */

static void profile_usage(FILE *f)
{
    fprintf(f,
            "usage: attnreplay profile --device DEVICE --model PRESET --db DB [options]\n"
            "       attnreplay profile --synthetic DEVICE --model PRESET --db DB [--tp N] [--quick]\n"
            "       attnreplay profile --from-llmservingsim DIR --device DEVICE --model PRESET --db DB [--tp N]\n"
            "Measures on GPU 0 the model's GEMMs (cuBLAS, every layer's shapes over %d token counts) and one\n"
            "layer's attention through a backend (decode batches x contexts, prefills x contexts; with\n"
            "--trace also real replayed steps), and writes a profile database for --step-time profile:DB.\n"
            "  --device DEVICE   the preset the GPU must be (%s)\n"
            "  --model PRESET    dense models: llama-3.1-8b, llama-3.1-70b, qwen3-32b\n"
            "  --db DB           the profile database to write; an earlier profile there is replaced\n"
            "                    (atomically, at the end), any other file refused\n"
            "  --tp N            tensor-parallel degree: per-rank shapes (default 1)\n"
            "  --backend NAME    attention backend (default cuda)\n"
            "  --repeat R        timed repetitions per point, median kept (default 20)\n"
            "  --trace TRACE     also replay its first --trace-steps steps (default 200) and scale the\n"
            "                    interpolated attention by the median measured / interpolated ratio\n"
            "  --quick           a small grid (for smoke tests)\n"
            "  --synthetic DEVICE  no measurement: the roofline's numbers of a device preset (tests)\n"
            "  --from-llmservingsim DIR  no measurement: convert LLMServingSim's per-layer profiles of --model on\n"
            "                    --device (DIR = profiler/perf/<card>/<model>/<variant>/tp<N>, with --tp N)\n"
            "Exit status: 0 written; 2 usage or bad input (DB a results database or another file that is\n"
            "not a profile, locked by another writer past ATTNREPLAY_BUSY_TIMEOUT_MS (default 30000), or\n"
            "in a folder that is missing or cannot be written; an option the kind of profile does not use;\n"
            "--trace a bad trace or another model's), checked before anything is measured; 3 no GPU, CUDA\n"
            "or backend error, the profile could not be written, or (DB written) the summary could not be\n"
            "written to stdout; 130 / 143 the --trace replay was interrupted (SIGINT / SIGTERM). DB is\n"
            "written only when all of it is; a profile that fails or is stopped leaves DB as it was and no\n"
            "file beside it.\n",
            COUNT(full_m), ar_device_names());
}

/* --from-llmservingsim DIR: the bundle's folder for one tp (sim/profile_import.c).  The GPU it was
 * measured on is the `gpu:` line of DIR/../meta.yaml when there is one (it must be --device's
 * card), else --device's preset name. */
static int import_main(const char *dir, const ar_model_preset *preset, int tp, const char *device, const char *db_path,
                       const char *command)
{
    const ar_device_spec *dev = device ? ar_device_find(device) : NULL;
    if (!dev) {
        fprintf(stderr, "profile: --from-llmservingsim needs --device, one of %s\n", ar_device_names());
        return 2;
    }
    char gpu[128], meta[1200], line[512];
    snprintf(gpu, sizeof gpu, "%s", dev->name);
    snprintf(meta, sizeof meta, "%s/../meta.yaml", dir);
    FILE *f = fopen(meta, "r");
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "gpu:", 4) != 0) continue;
        char *v = line + 4;
        while (*v == ' ' || *v == '\'' || *v == '"') v++;
        size_t len = strlen(v);
        while (len > 0 && strchr(" \r\n'\"", v[len - 1])) v[--len] = 0;
        if (len >= sizeof gpu) {
            fprintf(stderr, "profile: %s: the gpu name is longer than %zu characters\n", meta, sizeof gpu - 1);
            fclose(f);
            return 2;
        }
        memcpy(gpu, v, len + 1);
        break;
    }
    if (f) fclose(f);
    if (ar_device_match(gpu) != dev) {
        fprintf(stderr, "profile: %s says gpu '%s', which is not --device %s\n", meta, gpu, device);
        return 2;
    }
    ar_profile_table *p = calloc(1, sizeof *p);
    char err[AR_ERR_MAX + 2048], note[512], full[2048 + 512 + 64];
    if (!p) { fprintf(stderr, "profile: out of memory\n"); return 3; }
    int rc = ar_profile_import_llmservingsim(dir, preset, tp, gpu, p, note, sizeof note, err, sizeof err);
    if (rc == 0) {
        snprintf(full, sizeof full, "%s (LLMServingSim profile bundle; attention grids kept: %s)", command, note);
        guard_temps(db_path);
        int saved = ar_profile_save(db_path, p, full, err, sizeof err);
        unguard_temps();
        if (saved != 0) rc = saved == -2 ? 2 : 3;
    }
    if (rc != 0) {
        fprintf(stderr, "profile: %s\n", err);
        free(p);
        return rc;
    }
    printf("imported %s: %s (tp %d) on %s: %d operations x up to %d token counts; attention grids kept: %s -> %s\n", dir,
           p->model, p->tp, p->device, p->num_gemms, p->num_m, note, db_path);
    free(p);
    return 0;
}

int ar_profile_main(int argc, char **argv)
{
    const char *device = NULL, *model = NULL, *db_path = NULL, *backend = "cuda", *trace = NULL, *synthetic = NULL,
               *import_dir = NULL;
    int tp = 1, repeat = 20, trace_steps = 200;
    bool quick = false, backend_given = false, repeat_given = false, trace_steps_given = false;
    char command[2048] = "attnreplay";
    size_t used = strlen(command);
    for (int i = 0; i < argc && used + 2 < sizeof command; i++)
        used += (size_t)snprintf(command + used, sizeof command - used, " %s", argv[i]);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { profile_usage(stdout); return 0; }
        if (strcmp(a, "--quick") == 0) { quick = true; continue; }
        if (!v) {
            fprintf(stderr, "profile: %s needs a value (or is unknown)\n", a);
            profile_usage(stderr);
            return 2;
        }
        i++;
        char *end = NULL;
        long n = strtol(v, &end, 10);
        bool num_ok = end != v && *end == 0;
        if (strcmp(a, "--device") == 0) device = v;
        else if (strcmp(a, "--model") == 0) model = v;
        else if (strcmp(a, "--db") == 0) db_path = v;
        else if (strcmp(a, "--backend") == 0) backend = v, backend_given = true;
        else if (strcmp(a, "--trace") == 0) trace = v;
        else if (strcmp(a, "--synthetic") == 0) synthetic = v;
        else if (strcmp(a, "--from-llmservingsim") == 0) import_dir = v;
        else if (strcmp(a, "--tp") == 0 && num_ok && n >= 1 && n <= 64) tp = (int)n;
        else if (strcmp(a, "--repeat") == 0 && num_ok && n >= 1 && n <= 1000) repeat = (int)n, repeat_given = true;
        else if (strcmp(a, "--trace-steps") == 0 && num_ok && n >= 1 && n <= 100000)
            trace_steps = (int)n, trace_steps_given = true;
        else {
            fprintf(stderr, "profile: unknown option or bad value: %s %s\n", a, v);
            profile_usage(stderr);
            return 2;
        }
    }
    if (!model || !db_path || (!device && !synthetic && !import_dir)) {
        fprintf(stderr, "profile: --model, --db and --device (or --synthetic) are required\n");
        profile_usage(stderr);
        return 2;
    }
    /* options the chosen kind of profile would ignore */
    if (import_dir && (synthetic || trace || trace_steps_given || backend_given || repeat_given || quick)) {
        fprintf(stderr, "profile: --synthetic, --trace, --trace-steps, --backend, --repeat and --quick do not apply to "
                        "--from-llmservingsim, which converts the bundle's numbers\n");
        return 2;
    }
    if (synthetic && device) {
        fprintf(stderr, "profile: --synthetic %s names the device of the roofline's numbers and --device %s the GPU a "
                        "measurement must run on: give one of them\n", synthetic, device);
        return 2;
    }
    if (trace_steps_given && !trace) {
        fprintf(stderr, "profile: --trace-steps needs --trace\n");
        return 2;
    }
    if (synthetic && !trace && (backend_given || repeat_given)) {
        fprintf(stderr, "profile: --backend and --repeat apply to a measurement or a --trace replay; --synthetic "
                        "alone times nothing\n");
        return 2;
    }
    const ar_model_preset *preset = ar_model_preset_find(model);
    if (!preset) {
        fprintf(stderr, "profile: unknown --model %s (%s)\n", model, ar_model_preset_names());
        return 2;
    }
    if (preset->model.attention != AR_ATTN_MHA || preset->num_experts > 0) {
        fprintf(stderr, "profile: %s: only dense MHA/GQA models are profiled (MLA and MoE shapes are not)\n", model);
        return 2;
    }
    char err[AR_ERR_MAX + 2048];
    if (ar_profile_check_replaceable(db_path, err, sizeof err) != 0) {   /* before minutes of measuring */
        fprintf(stderr, "profile: %s\n", err);
        return 2;
    }
    remove_stale_temps(db_path);
    if (import_dir) return import_main(import_dir, preset, tp, device, db_path, command);
    const ar_model *m = &preset->model;
    if (m->num_kv_heads % tp != 0 || preset->intermediate % tp != 0 || preset->vocab % tp != 0) {
        fprintf(stderr, "profile: --tp %d does not divide %s's KV heads, MLP or vocabulary\n", tp, model);
        return 2;
    }
    const char *device_preset = synthetic ? synthetic : device;
    if (!ar_device_find(device_preset)) {
        fprintf(stderr, "profile: unknown device '%s' (%s)\n", device_preset, ar_device_names());
        return 2;
    }
    /* what the measurement and the --trace replay use, checked before minutes of measuring */
    if (!synthetic && !ar_backend_find(backend)) {   /* a --synthetic profile's --trace replay checks its own */
        fprintf(stderr, "profile: unknown backend '%s'; `attnreplay backends` lists them\n", backend);
        return 2;
    }
    if (trace && tp != 1) {
        fprintf(stderr, "profile: --trace needs --tp 1 (a trace replays every head)\n");
        return 2;
    }
    if (trace) {   /* the steps the replay will take, read and validated as replay reads them */
        ar_trace_reader *r = open_trace_of(trace, preset->name, err, sizeof err);
        int got = r ? 1 : -1, steps = 0;
        const ar_step *st;
        while (got == 1 && steps < trace_steps && (got = ar_trace_next(r, &st, err, sizeof err)) == 1) steps++;
        if (r) ar_trace_close(r);
        if (got >= 0 && steps == 0) snprintf(err, sizeof err, "%s: no step to replay", trace);
        if (got < 0 || steps == 0) {
            fprintf(stderr, "profile: %s\n", err);
            return 2;
        }
    }
    profile_grid grid = grid_of(quick);
    ar_profile_table *p = calloc(1, sizeof *p);
    if (!p) { fprintf(stderr, "profile: out of memory\n"); return 3; }
    setup_table(p, preset, tp, &grid);
    int rc = 0;
    if (synthetic) {
        ar_steptime roof;
        char spec[64];
        snprintf(spec, sizeof spec, "roofline:%s", synthetic);
        if (ar_steptime_parse(spec, preset, &roof, err, sizeof err) != 0) {
            fprintf(stderr, "profile: %s\n", err);
            free(p);
            return 2;
        }
        snprintf(p->device, sizeof p->device, "%s", synthetic);
        fill_synthetic(p, &roof);
    } else {
        if (ar_cuda_profile_device(p->device, sizeof p->device, err, sizeof err) != 0) {
            fprintf(stderr, "profile: %s\n", err);
            free(p);
            return 3;
        }
        const ar_device_spec *found = ar_device_match(p->device);
        if (!found || strcmp(found->name, device) != 0) {
            fprintf(stderr, "profile: --device %s but GPU 0 is '%s'\n", device, p->device);
            free(p);
            return 2;
        }
        char engine[1200] = "";
        for (int g = 0; g < p->num_gemms && rc == 0; g++) {
            rc = ar_cuda_profile_gemm(p->gemm_k[g], p->gemm_n[g], grid.m, grid.num_m, repeat, p->gemm_us[g], engine,
                                      sizeof engine, err, sizeof err);
            if (rc == 0)
                printf("gemm %-8s K %5d N %6d: M=1 %.1f us, M=%d %.1f us (%s)\n", p->gemm_name[g], p->gemm_k[g],
                       p->gemm_n[g], p->gemm_us[g][0], grid.m[grid.num_m - 1], p->gemm_us[g][grid.num_m - 1], engine);
        }
        for (int t = 0; t < 2 && rc == 0; t++) {
            int na = t ? grid.num_pre_q : grid.num_dec_batch, nb = t ? grid.num_pre_ctx : grid.num_dec_ctx;
            for (int i = 0; i < na && rc == 0; i++)
                for (int j = 0; j < nb && rc == 0; j++) {
                    int batch = t ? 1 : grid.dec_batch[i], q = t ? grid.pre_q[i] : 1;
                    int ctx = t ? grid.pre_ctx[j] : grid.dec_ctx[j];
                    double *slot = t ? &p->pre_us[i][j] : &p->dec_us[i][j];
                    rc = ar_profile_time_attention(backend, m, tp, batch, q, ctx, repeat, slot, err, sizeof err);
                    if (rc == 0)
                        printf("attention %s batch %3d q %5d ctx %6d: %9.1f us\n", t ? "prefill" : "decode ", batch, q,
                               ctx, *slot);
                }
        }
        if (rc != 0) {
            fprintf(stderr, "profile: %s\n", err);
            free(p);
            return rc == 2 ? 2 : 3;
        }
    }
    /* the whole profile (with --trace, its replayed steps too) goes to a file beside DB, renamed
     * over DB at the end: an interrupted or failed run leaves the earlier profile as it was */
    char tmp[1000];
    temp_path_of(db_path, tmp, sizeof tmp);
    guard_temps(db_path);
    remove_temp(tmp);
    if (write_profile(tmp, p, command, err, sizeof err) != 0) {
        fprintf(stderr, "profile: %s\n", err);
        remove_temp(tmp);
        unguard_temps();
        free(p);
        return 3;
    }
    if (trace) {
        rc = measure_replayed_steps(p, tmp, trace, trace_steps, backend, repeat, err, sizeof err);
        if (rc == 0) rc = store_ratio(tmp, p, err, sizeof err) ? 3 : 0;
        if (rc != 0) {
            fprintf(stderr, "profile: %s\n", err);
            remove_temp(tmp);
            unguard_temps();
            free(p);
            return rc;
        }
        printf("replayed %d steps of %s: measured / interpolated attention, median %.3f (scales the profile)\n",
               p->replay_steps, trace, p->replay_ratio);
    }
    rc = move_into_place(tmp, db_path, err, sizeof err);
    unguard_temps();
    if (rc != 0) {
        fprintf(stderr, "profile: %s\n", err);
        free(p);
        return rc == -2 ? 2 : 3;
    }
    printf("profile of %s (tp %d) on %s: %d GEMM shapes x %d token counts, %d decode and %d prefill points -> %s\n",
           p->model, p->tp, p->device, p->num_gemms, p->num_m, p->num_dec_batch * p->num_dec_ctx,
           p->num_pre_q * p->num_pre_ctx, db_path);
    free(p);
    return 0;
}
