/* metrics.c - per-request serving metrics and the run summary of a simulation.
 *
 * Per request: queueing = first scheduled - arrival; TTFT = first token - arrival;
 * TPOT = (last token - first token) / (output tokens - 1) (requests with one output token have
 * none); E2E = last token - arrival; number of preemptions; prefix-hit tokens at admission.
 * A token's time is the end of the step that sampled it.  Written as CSV or as SQLite tables;
 * the summary (p50/p90/p99, throughput, KV usage, prefix-hit rate, preemptions,
 * cascade-eligible steps) is printed as text.  Fidelity (vllm-run workloads): mean, p50 and p90
 * of TTFT and TPOT, simulated and real, over the same finished requests (ar_sim_fidelity). */
#include "sim.h"
#include "../replay/db.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double ar_quantile(double *values, int n, double q)
{
    if (n <= 0) return 0;
    qsort(values, (size_t)n, sizeof *values, cmp_double);
    double pos = q * (n - 1);
    int lo = (int)pos;
    if (lo >= n - 1) return values[n - 1];
    double frac = pos - lo;
    return values[lo] * (1 - frac) + values[lo + 1] * frac;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static double tpot_of(const ar_sim_req_info *r)
{
    return r->num_output_tokens > 1 ? (r->last_token - r->first_token) / (r->num_output_tokens - 1) : -1;
}

static int write_csv(const ar_sim *s, const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "w");
    if (!f) { snprintf(err, err_len, "%s: cannot create: %s", path, strerror(errno)); return -1; }
    fprintf(f, "req,arrival,prompt_len,output_len,status,queueing,ttft,tpot,e2e,preemptions,prefix_hit_tokens\n");
    static const char *status_names[] = {"pending", "waiting", "running", "preempted", "finished", "skipped"};
    for (int i = 0; i < ar_sim_num_requests(s); i++) {
        ar_sim_req_info r;
        ar_sim_request(s, i, &r);
        bool done = r.status == AR_REQ_FINISHED;
        fprintf(f, "%s,%.6f,%d,%d,%s,", r.id, r.arrival, r.prompt_len, r.output_len, status_names[r.status]);
        if (done) {
            fprintf(f, "%.6f,%.6f,", r.first_scheduled - r.arrival, r.first_token - r.arrival);
            double tpot = tpot_of(&r);
            if (tpot >= 0) fprintf(f, "%.6f,", tpot); else fprintf(f, ",");
            fprintf(f, "%.6f,", r.last_token - r.arrival);
        } else {
            fprintf(f, ",,,,");
        }
        fprintf(f, "%d,%d\n", r.num_preemptions, r.prefix_hit_tokens);
    }
    if (fclose(f) != 0) { snprintf(err, err_len, "%s: write failed", path); return -1; }
    char kv_path[4096];
    snprintf(kv_path, sizeof kv_path, "%s.kv.csv", path);
    f = fopen(kv_path, "w");
    if (!f) { snprintf(err, err_len, "%s: cannot create: %s", kv_path, strerror(errno)); return -1; }
    fprintf(f, "time,used_blocks,usable_blocks,running,waiting,num_tokens,admitted_prompt_tokens,admitted_hit_tokens\n");
    int64_t n;
    const ar_sim_kv_sample *k = ar_sim_kv_samples(s, &n);
    for (int64_t i = 0; i < n; i++)
        fprintf(f, "%.6f,%d,%d,%d,%d,%d,%d,%d\n", k[i].time, k[i].used_blocks, ar_sim_num_blocks(s) - 1,
                k[i].running, k[i].waiting, k[i].num_tokens, k[i].admitted_prompt_tokens, k[i].admitted_hit_tokens);
    if (fclose(f) != 0) { snprintf(err, err_len, "%s: write failed", kv_path); return -1; }
    return 0;
}

/* A statement on the metrics database failed: 2 with err in db_lock.h's words when another
 * connection's lock outlasted the busy timeout (bad input), else -1 with SQLite's (msg, else the
 * connection's). */
static int sql_failed(sqlite3 *db, const char *path, const char *msg, char *err, size_t err_len)
{
    if (ar_db_lock_error(db, path, NULL, err, err_len)) return 2;
    snprintf(err, err_len, "%s: sqlite: %s", path, msg ? msg : sqlite3_errmsg(db));
    return -1;
}

static int sql_exec(sqlite3 *db, const char *path, const char *sql, char *err, size_t err_len)
{
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg) == SQLITE_OK ? 0 : sql_failed(db, path, msg, err, err_len);
    sqlite3_free(msg);
    return rc;
}

static int write_sqlite(const ar_sim *s, const char *path, char *err, size_t err_len)
{
    sqlite3 *db = NULL;
    if (sqlite3_open(path, &db) != SQLITE_OK) {
        snprintf(err, err_len, "%s: %s", path, db ? sqlite3_errmsg(db) : "cannot open");
        sqlite3_close(db);
        return -1;
    }
    sqlite3_busy_timeout(db, ar_db_busy_timeout_ms());   /* another writer's lock: wait as replay does */
    int rc;
    sqlite3_stmt *st = NULL;
    if ((rc = sql_exec(db, path,
                 "BEGIN IMMEDIATE;"
                 "DROP TABLE IF EXISTS sim_requests; DROP TABLE IF EXISTS sim_steps_kv; DROP TABLE IF EXISTS sim_summary;"
                 "CREATE TABLE sim_requests(req TEXT PRIMARY KEY, arrival REAL, prompt_len INTEGER, output_len INTEGER,"
                 " finished INTEGER, queueing REAL, ttft REAL, tpot REAL, e2e REAL, preemptions INTEGER, prefix_hit_tokens INTEGER);"
                 "CREATE TABLE sim_steps_kv(time REAL, used_blocks INTEGER, usable_blocks INTEGER, running INTEGER,"
                 " waiting INTEGER, num_tokens INTEGER, admitted_prompt_tokens INTEGER, admitted_hit_tokens INTEGER);"
                 "CREATE TABLE sim_summary(key TEXT PRIMARY KEY, value REAL);",
                 err, err_len)) != 0)
        goto done;
    if (sqlite3_prepare_v2(db, "INSERT INTO sim_requests VALUES(?,?,?,?,?,?,?,?,?,?,?)", -1, &st, NULL) != SQLITE_OK) goto sqlerr;
    for (int i = 0; i < ar_sim_num_requests(s); i++) {
        ar_sim_req_info r;
        ar_sim_request(s, i, &r);
        bool done_req = r.status == AR_REQ_FINISHED;
        sqlite3_reset(st);
        sqlite3_bind_text(st, 1, r.id, -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(st, 2, r.arrival);
        sqlite3_bind_int(st, 3, r.prompt_len);
        sqlite3_bind_int(st, 4, r.output_len);
        sqlite3_bind_int(st, 5, done_req);
        if (done_req) {
            sqlite3_bind_double(st, 6, r.first_scheduled - r.arrival);
            sqlite3_bind_double(st, 7, r.first_token - r.arrival);
            double tpot = tpot_of(&r);
            if (tpot >= 0) sqlite3_bind_double(st, 8, tpot); else sqlite3_bind_null(st, 8);
            sqlite3_bind_double(st, 9, r.last_token - r.arrival);
        } else {
            for (int c = 6; c <= 9; c++) sqlite3_bind_null(st, c);
        }
        sqlite3_bind_int(st, 10, r.num_preemptions);
        sqlite3_bind_int(st, 11, r.prefix_hit_tokens);
        if (sqlite3_step(st) != SQLITE_DONE) goto sqlerr;
    }
    sqlite3_finalize(st);
    st = NULL;
    if (sqlite3_prepare_v2(db, "INSERT INTO sim_steps_kv VALUES(?,?,?,?,?,?,?,?)", -1, &st, NULL) != SQLITE_OK) goto sqlerr;
    int64_t n;
    const ar_sim_kv_sample *k = ar_sim_kv_samples(s, &n);
    for (int64_t i = 0; i < n; i++) {
        sqlite3_reset(st);
        sqlite3_bind_double(st, 1, k[i].time);
        sqlite3_bind_int(st, 2, k[i].used_blocks);
        sqlite3_bind_int(st, 3, ar_sim_num_blocks(s) - 1);
        sqlite3_bind_int(st, 4, k[i].running);
        sqlite3_bind_int(st, 5, k[i].waiting);
        sqlite3_bind_int(st, 6, k[i].num_tokens);
        sqlite3_bind_int(st, 7, k[i].admitted_prompt_tokens);
        sqlite3_bind_int(st, 8, k[i].admitted_hit_tokens);
        if (sqlite3_step(st) != SQLITE_DONE) goto sqlerr;
    }
    sqlite3_finalize(st);
    st = NULL;
    ar_sim_summary sum;
    ar_sim_summarize(s, &sum);
    if (sqlite3_prepare_v2(db, "INSERT INTO sim_summary VALUES(?,?)", -1, &st, NULL) != SQLITE_OK) goto sqlerr;
    struct { const char *key; double value; } rows[] = {
        {"requests", sum.num_requests}, {"finished", sum.num_finished}, {"skipped", sum.num_skipped},
        {"steps", (double)sum.steps}, {"preemptions", (double)sum.preemptions},
        {"cascade_eligible_steps", (double)sum.cascade_eligible_steps},
        {"prompt_tokens", (double)sum.prompt_tokens}, {"prefix_hit_tokens", (double)sum.prefix_hit_tokens},
        {"output_tokens", (double)sum.output_tokens}, {"duration_s", sum.duration},
        {"kv_usage_mean", sum.kv_usage_mean}, {"kv_usage_max", sum.kv_usage_max},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        sqlite3_reset(st);
        sqlite3_bind_text(st, 1, rows[i].key, -1, SQLITE_STATIC);
        sqlite3_bind_double(st, 2, rows[i].value);
        if (sqlite3_step(st) != SQLITE_DONE) goto sqlerr;
    }
    sqlite3_finalize(st);
    st = NULL;
    rc = sql_exec(db, path, "COMMIT;", err, err_len);
    goto done;
sqlerr:
    rc = sql_failed(db, path, NULL, err, err_len);
done:
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rc;
}

int ar_sim_metrics_check(const char *path, char *err, size_t err_len)
{
    struct stat st;
    if (!ar_sim_metrics_is_sqlite(path) || stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) return 0;
    sqlite3 *db = NULL;
    int rc = 0;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(db, ar_db_busy_timeout_ms());
        int e = sqlite3_exec(db, "SELECT count(*) FROM sqlite_master", NULL, NULL, NULL);
        if (e == SQLITE_NOTADB || e == SQLITE_CORRUPT) {
            snprintf(err, err_len, "%s: not an SQLite database (%s); --metrics adds its sim_* tables to an SQLite "
                     "file or makes a new one", path, sqlite3_errmsg(db));
            rc = 2;
        } else if (ar_db_lock_error(db, path, NULL, err, err_len)) {   /* waited as the writer would: refused */
            rc = 2;
        }
    }
    sqlite3_close(db);
    return rc;
}

bool ar_sim_metrics_is_sqlite(const char *path)
{
    return ends_with(path, ".db") || ends_with(path, ".sqlite") || ends_with(path, ".sqlite3");
}

int ar_sim_write_metrics(const ar_sim *s, const char *path, char *err, size_t err_len)
{
    if (ar_sim_metrics_is_sqlite(path))
        return write_sqlite(s, path, err, err_len);
    return write_csv(s, path, err, err_len);
}

int ar_output_file_check(const char *path, char *err, size_t err_len)
{
    struct stat st;
    if (!path || !*path) {
        snprintf(err, err_len, "(empty path): no file name");
        return -1;
    }
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(err, err_len, "%s: is a directory", path);
        return -1;
    }
    bool existed = access(path, F_OK) == 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot write: %s", path, strerror(errno));
        return -1;
    }
    close(fd);
    if (!existed) unlink(path);
    return 0;
}

int ar_output_dir_prepare(const char *path, char *err, size_t err_len)
{
    struct stat st;
    if (!path || !*path) {
        snprintf(err, err_len, "(empty path): no directory name");
        return -1;
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        snprintf(err, err_len, "%s: cannot create directory: %s", path, strerror(errno));
        return -1;
    }
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, err_len, "%s: exists and is not a directory", path);
        return -1;
    }
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.attnreplay-write-check-XXXXXX", path);
    int fd = mkstemp(probe);
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot write into the directory: %s", path, strerror(errno));
        return -1;
    }
    close(fd);
    unlink(probe);
    return 0;
}

/* path with its directory resolved (realpath) and its last component kept, so two spellings of
 * a file that does not exist yet compare equal; the path as given when its directory does not
 * resolve. */
static void canonical_path(const char *path, char *buf, size_t len)
{
    const char *slash = strrchr(path, '/');
    char dir[4096], resolved[PATH_MAX];
    ar_path_dir(path, dir, sizeof dir);
    if (realpath(dir, resolved)) snprintf(buf, len, "%s/%s", resolved, slash ? slash + 1 : path);
    else snprintf(buf, len, "%s", path);
}

bool ar_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    if (!a || !b) return false;
    bool a_exists = stat(a, &sa) == 0, b_exists = stat(b, &sb) == 0;
    if (a_exists && b_exists) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (a_exists != b_exists) return false;
    char ca[PATH_MAX + 256], cb[PATH_MAX + 256];
    canonical_path(a, ca, sizeof ca);
    canonical_path(b, cb, sizeof cb);
    return strcmp(ca, cb) == 0;
}

/* One line "name mean p50 p90 p99" over values. */
static void print_dist(FILE *f, const char *name, double *v, int n, double unit, const char *unit_name)
{
    double mean = 0;
    for (int i = 0; i < n; i++) mean += v[i];
    mean = n ? mean / n : 0;
    double p50 = ar_quantile(v, n, 0.5), p90 = ar_quantile(v, n, 0.9), p99 = ar_quantile(v, n, 0.99);
    fprintf(f, "  %-10s mean %10.3f  p50 %10.3f  p90 %10.3f  p99 %10.3f %s  (n=%d)\n", name, mean * unit,
            p50 * unit, p90 * unit, p99 * unit, unit_name, n);
}

static double mean_of(const double *v, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++) m += v[i];
    return n ? m / n : 0;
}

/* mean, p50, p90 of v[n] (sorted in place) */
static void three_stats(double *v, int n, double out[3])
{
    out[0] = mean_of(v, n);
    out[1] = ar_quantile(v, n, 0.5);
    out[2] = ar_quantile(v, n, 0.9);
}

int ar_sim_fidelity(const ar_sim *s, ar_fidelity *out)
{
    memset(out, 0, sizeof *out);
    int nr = ar_sim_num_requests(s);
    double *buf = malloc((size_t)(4 * nr + 4) * sizeof(double));
    if (!buf) return -1;
    double *sim_ttft = buf, *real_ttft = buf + nr + 1, *sim_tpot = buf + 2 * nr + 2, *real_tpot = buf + 3 * nr + 3;
    int n = 0, nt = 0;
    for (int i = 0; i < nr; i++) {
        const ar_workload_req *w = ar_sim_workload_req(s, i);
        ar_sim_req_info r;
        ar_sim_request(s, i, &r);
        if (r.status != AR_REQ_FINISHED) continue;
        if (w->real_ttft >= 0) {
            sim_ttft[n] = r.first_token - r.arrival;
            real_ttft[n++] = w->real_ttft;
        }
        double tpot = tpot_of(&r);
        if (w->real_tpot >= 0 && tpot >= 0) {
            sim_tpot[nt] = tpot;
            real_tpot[nt++] = w->real_tpot;
        }
    }
    out->num_ttft = n;
    out->num_tpot = nt;
    three_stats(sim_ttft, n, out->sim_ttft);
    three_stats(real_ttft, n, out->real_ttft);
    three_stats(sim_tpot, nt, out->sim_tpot);
    three_stats(real_tpot, nt, out->real_tpot);
    for (int k = 0; k < 3; k++) {
        out->gap_ttft[k] = out->real_ttft[k] > 0 ? out->sim_ttft[k] / out->real_ttft[k] - 1 : 0;
        out->gap_tpot[k] = out->real_tpot[k] > 0 ? out->sim_tpot[k] / out->real_tpot[k] - 1 : 0;
    }
    free(buf);
    return n > 0 ? 0 : -1;
}

/* For vllm-run workloads: the real engine's TTFT/TPOT next to the simulated ones, over the same
 * finished requests. */
static void print_real_engine(const ar_sim *s, FILE *f)
{
    ar_fidelity fid;
    if (ar_sim_fidelity(s, &fid) != 0) return;
    fprintf(f, "  real engine (from the workload file), simulated vs real over %d finished requests:\n", fid.num_ttft);
    const char *names[3] = {"mean", "p50", "p90"};
    for (int m = 0; m < 2; m++) {
        const double *sim = m ? fid.sim_tpot : fid.sim_ttft, *real = m ? fid.real_tpot : fid.real_ttft;
        const double *gap = m ? fid.gap_tpot : fid.gap_ttft;
        double unit = m ? 1000.0 : 1.0;
        fprintf(f, "    %-5s", m ? "TPOT" : "TTFT");
        for (int k = 0; k < 3; k++)
            fprintf(f, "  %s %.3f vs %.3f %s (%+.1f%%)", names[k], sim[k] * unit, real[k] * unit, m ? "ms" : "s",
                    100.0 * gap[k]);
        fprintf(f, "\n");
    }
}

void ar_sim_load_check(const ar_sim *s, ar_sim_load *out)
{
    memset(out, 0, sizeof *out);
    int nr = ar_sim_num_requests(s);
    double first = -1, last = -1, work = 0;
    int *admitted = malloc((size_t)(nr + 1) * sizeof *admitted);
    if (!admitted) return;
    for (int i = 0; i < nr; i++) {
        ar_sim_req_info r;
        ar_sim_request(s, i, &r);
        if (r.status == AR_REQ_SKIPPED) continue;
        admitted[out->requests++] = i;
        if (first < 0 || r.arrival < first) first = r.arrival;
        if (r.arrival > last) last = r.arrival;
        work += (double)(r.prompt_len - r.prefix_hit_tokens + r.output_len - 1);
    }
    if (out->requests == 0) {
        free(admitted);
        return;
    }
    out->arrival_span_s = last - first;
    int64_t n;
    const ar_sim_kv_sample *k = ar_sim_kv_samples(s, &n);
    ar_sim_summary sum;
    ar_sim_summarize(s, &sum);
    double backlog_tokens = 0;
    for (int64_t i = 0; i < n; i++) {
        double end = i + 1 < n ? k[i + 1].time : sum.duration;
        if (k[i].waiting > 0) {
            out->backlogged_s += end - k[i].time;
            backlog_tokens += k[i].num_tokens;
        }
        if (k[i].time <= last) out->waiting_at_last_arrival = k[i].waiting;
    }
    if (out->arrival_span_s > 0) out->offered_tokens_per_s = work / out->arrival_span_s;
    if (out->backlogged_s > 0) out->served_tokens_per_s = backlog_tokens / out->backlogged_s;
    if (out->served_tokens_per_s > 0) out->load = out->offered_tokens_per_s / out->served_tokens_per_s;
    /* queueing of the first and last tenth of the requests in arrival order (workload order) */
    int tenth = out->requests / 10 > 0 ? out->requests / 10 : 1;
    int counted[2] = { 0, 0 };
    for (int part = 0; part < 2; part++) {
        double total = 0;
        for (int j = 0; j < tenth; j++) {
            ar_sim_req_info r;
            ar_sim_request(s, admitted[part ? out->requests - tenth + j : j], &r);
            if (r.first_scheduled < 0) continue;
            total += r.first_scheduled - r.arrival;
            counted[part]++;
        }
        double mean = counted[part] ? total / counted[part] : 0;
        if (part) out->queueing_last_tenth_s = mean;
        else out->queueing_first_tenth_s = mean;
    }
    free(admitted);
    out->overloaded = out->requests >= 10 && out->load > AR_SIM_OVERLOAD && out->waiting_at_last_arrival > 0;
}

void ar_sim_load_warning(const ar_sim_load *load, char *buf, size_t len)
{
    snprintf(buf, len,
             "the offered load exceeds what this engine serves: the requests bring %.0f tokens/s of work over "
             "%.1f s of arrivals, the engine served %.0f tokens/s while requests waited (load %.2fx), and %d were "
             "still waiting at the last arrival. Queueing grows without bound: the first tenth of the requests "
             "waited %.3g s on average, the last tenth %.3g s, so TTFT and E2E measure the queue and the length "
             "of the workload, not the engine. Lower the rate (--time-scale above 1, --limit) or add capacity "
             "(--num-blocks or --kv-mem, --max-num-seqs, --max-num-batched-tokens, a faster --step-time, tp=N)",
             load->offered_tokens_per_s, load->arrival_span_s, load->served_tokens_per_s, load->load,
             load->waiting_at_last_arrival, load->queueing_first_tenth_s, load->queueing_last_tenth_s);
}

void ar_sim_print_summary(const ar_sim *s, FILE *f)
{
    ar_sim_summary sum;
    ar_sim_summarize(s, &sum);
    int nr = ar_sim_num_requests(s);
    double *ttft = malloc((size_t)(nr + 1) * sizeof(double));
    double *tpot = malloc((size_t)(nr + 1) * sizeof(double));
    double *e2e = malloc((size_t)(nr + 1) * sizeof(double));
    double *queue = malloc((size_t)(nr + 1) * sizeof(double));
    if (!ttft || !tpot || !e2e || !queue) {
        fprintf(f, "summary: out of memory\n");
        free(ttft); free(tpot); free(e2e); free(queue);
        return;
    }
    int n = 0, nt = 0, preempted_reqs = 0;
    for (int i = 0; i < nr; i++) {
        ar_sim_req_info r;
        ar_sim_request(s, i, &r);
        if (r.num_preemptions > 0) preempted_reqs++;
        if (r.status != AR_REQ_FINISHED) continue;
        ttft[n] = r.first_token - r.arrival;
        e2e[n] = r.last_token - r.arrival;
        queue[n] = r.first_scheduled - r.arrival;
        n++;
        double t = tpot_of(&r);
        if (t >= 0) tpot[nt++] = t;
    }
    fprintf(f, "requests %d, finished %d, skipped %d; steps %lld; simulated %.3f s\n", sum.num_requests,
            sum.num_finished, sum.num_skipped, (long long)sum.steps, sum.duration);
    print_dist(f, "TTFT", ttft, n, 1.0, "s");
    print_dist(f, "TPOT", tpot, nt, 1000.0, "ms");
    print_dist(f, "E2E", e2e, n, 1.0, "s");
    print_dist(f, "queueing", queue, n, 1.0, "s");
    double dur = sum.duration > 0 ? sum.duration : 1;
    fprintf(f, "  throughput %.2f req/s, %.1f output tok/s, %.1f scheduled tok/s\n", sum.num_finished / dur,
            (double)sum.output_tokens / dur, (double)sum.scheduled_tokens / dur);
    fprintf(f, "  KV cache usage: mean %.1f%%, max %.1f%% of %d usable blocks\n", 100 * sum.kv_usage_mean,
            100 * sum.kv_usage_max, ar_sim_num_blocks(s) - 1);
    fprintf(f, "  prefix hits: %lld of %lld prompt tokens (%.1f%%)\n", (long long)sum.prefix_hit_tokens,
            (long long)sum.prompt_tokens,
            sum.prompt_tokens ? 100.0 * (double)sum.prefix_hit_tokens / (double)sum.prompt_tokens : 0.0);
    fprintf(f, "  preemptions: %lld (%d requests); cascade-eligible steps: %lld\n", (long long)sum.preemptions,
            preempted_reqs, (long long)sum.cascade_eligible_steps);
    ar_sim_load load;
    ar_sim_load_check(s, &load);
    if (load.served_tokens_per_s > 0)
        fprintf(f, "  load: offered %.0f tok/s over %.1f s of arrivals; served %.0f tok/s while requests waited "
                   "(%.1f s); %.2fx%s\n", load.offered_tokens_per_s, load.arrival_span_s, load.served_tokens_per_s,
                load.backlogged_s, load.load, load.overloaded ? ": OVERLOADED, queueing grows without bound" : "");
    else
        fprintf(f, "  load: offered %.0f tok/s over %.1f s of arrivals; no request ever waited\n",
                load.offered_tokens_per_s, load.arrival_span_s);
    print_real_engine(s, f);
    free(ttft);
    free(tpot);
    free(e2e);
    free(queue);
}
