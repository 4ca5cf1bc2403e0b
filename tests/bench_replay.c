/* bench_replay.c - whole traces replayed end to end: wall time, kernel time, verification time,
 * the host-overhead fraction ((wall - kernel) / wall) and where the rest goes (parse, metadata,
 * generation, kernel, verify, SQLite, wait), as the engine measures and stores them per run
 * (runs.*_s in replay/db.h).  Traces come from `attnreplay sim`; every replay is a child
 * process whose exit, wall time and peak RSS are taken with wait4.
 *
 * With a CUDA device (the cuda backend chosen for the Mooncake trace), issue 18's four runs and
 * their targets:
 *   mc-off-L32     Mooncake 300 requests, llama-3.1-8b (1,537 steps), --verify off --layers 32:
 *                  wall <= 1.15 x kernel time
 *   mc-s64-L32     the same, --verify sample:64 --layers 32: the whole trace in <= 300 s
 *   mc-all-L1      the same, --verify all --layers 1: the whole trace in <= 300 s
 *   dsv3-all       DeepSeek-V3 synthetic (41 steps) on cuda-mla, --verify all: <= 60 s
 * Without one (the cpu backend), a small configuration: a decode-heavy llama-3.1-8b trace
 * (--layers 1) with --verify off, again with --no-overlap, and its first 60 steps with
 * --verify sample:8 on 2 layers (the first verified); the Mooncake trace's parse and
 * validation alone (`attnreplay info`); and a memory check: the peak RSS of 2,000 and of
 * 20,000 steps of a long decode trace must agree within 10%.
 *
 * A run is stopped with SIGTERM at its time limit (the target, or BENCH_REPLAY_MAX_S if
 * smaller); it then ends 'interrupted' with its committed steps and its timings stored, and the
 * table shows the steps done and the whole-trace time projected from them, by steps, by
 * query-key pairs and by KV tokens (`attnreplay info --steps`; the Mooncake slice's early steps
 * are its heaviest, so the projection by steps overstates).  Under each device
 * run the device verifier's closing line (checks, cache and scratch, the C cross-check; with
 * ATTNREPLAY_GPU_REF_PROFILE=1 its phases) is copied from the run's log.
 * Environment: BENCH_REPLAY_ONLY=name[,name...] runs a subset; BENCH_REPLAY_MAX_S caps each run;
 * BENCH_REPLAY_TRACES names a directory with traces simulated elsewhere (mooncake300, dsv3,
 * decode, long .trace.jsonl.gz: the device harness carries them); AR_PUBLIC_TRACES names the
 * public trace directory when it is not ../shared/traces-public beside the checkout.  Exit 1 when a run fails (a step fails verification, an error) or the
 * memory check fails; missed speed targets are reported, not failed (a benchmark measures). */
#include "testutil.h"

#include <errno.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct child_result {
    int rc;                   /* exit code, or 128 + signal */
    double wall_s;
    long max_rss_kib;
    bool stopped;             /* we sent SIGTERM at the time limit */
} child_result;

/* Runs `sh -c "exec CMD"` with stdout/stderr to log; SIGTERM after limit_s (<= 0: none). */
static child_result run_child(const char *cmd, const char *log, double limit_s)
{
    child_result r = {-1, 0, 0, false};
    double t0 = now_s();
    fflush(NULL);   /* or the child's freopen writes our buffered table a second time */
    pid_t pid = fork();
    if (pid < 0) return r;
    if (pid == 0) {
        if (!freopen(log, "w", stdout) || dup2(fileno(stdout), 2) < 0) _exit(126);
        char full[8192];
        snprintf(full, sizeof full, "exec %s", cmd);
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    for (;;) {
        pid_t w = wait4(pid, &st, WNOHANG, &ru);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) return r;
        if (limit_s > 0 && !r.stopped && now_s() - t0 > limit_s) {
            kill(pid, SIGTERM);
            r.stopped = true;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    r.wall_s = now_s() - t0;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.max_rss_kib = ru.ru_maxrss;
    return r;
}

static const char *public_trace(const char *rel, char *buf, size_t len)
{
    const char *dir = getenv("AR_PUBLIC_TRACES");
    if (dir && *dir) {
        snprintf(buf, len, "%s/%s", dir, rel);
        return access(buf, R_OK) == 0 ? buf : NULL;
    }
    return tu_public_trace(rel, buf, len);
}

static bool selected(const char *name)
{
    const char *only = getenv("BENCH_REPLAY_ONLY");
    if (!only || !*only) return true;
    size_t n = strlen(name);
    for (const char *p = only; (p = strstr(p, name)); p += n)
        if ((p == only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return true;
    return false;
}

static double limit_for(double target_s)
{
    const char *cap = getenv("BENCH_REPLAY_MAX_S");
    double lim = target_s;
    if (cap && *cap && atof(cap) > 0 && atof(cap) < lim) lim = atof(cap);
    return lim;
}

/* The stored row of the newest run in db. */
typedef struct run_row {
    bool found;
    char status[32], backend[32], error[256];
    long long steps_done, steps_failed, verified_rows;
    double wall, kernel, verify, parse, metadata, generation, sqlite, wait, setup;
} run_row;

static run_row newest_run(const char *db)
{
    run_row r;
    memset(&r, 0, sizeof r);
    sqlite3 *h = NULL;
    if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        sqlite3_close(h);
        return r;
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(h, "SELECT status, backend, coalesce(error, ''), steps_done, steps_failed, verified_rows,"
                              " wall_s, kernel_s, verify_s, parse_s, metadata_s, generation_s, sqlite_s, wait_s, setup_s"
                              " FROM runs ORDER BY id DESC LIMIT 1", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW) {
        r.found = true;
        snprintf(r.status, sizeof r.status, "%s", (const char *)sqlite3_column_text(st, 0));
        snprintf(r.backend, sizeof r.backend, "%s", (const char *)sqlite3_column_text(st, 1));
        snprintf(r.error, sizeof r.error, "%s", (const char *)sqlite3_column_text(st, 2));
        r.steps_done = sqlite3_column_int64(st, 3);
        r.steps_failed = sqlite3_column_int64(st, 4);
        r.verified_rows = sqlite3_column_int64(st, 5);
        double *d[] = {&r.wall, &r.kernel, &r.verify, &r.parse, &r.metadata, &r.generation, &r.sqlite, &r.wait,
                       &r.setup};
        for (int i = 0; i < 9; i++) *d[i] = sqlite3_column_double(st, 6 + i);
    }
    sqlite3_finalize(st);
    sqlite3_close(h);
    return r;
}

/* Steps of a trace (lines after the header). */
static long long trace_steps(const char *trace)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "gzip -dcf '%s' | wc -l", trace);
    FILE *p = popen(cmd, "r");
    long long n = -1;
    if (p) {
        if (fscanf(p, "%lld", &n) != 1) n = -1;
        pclose(p);
    }
    return n > 0 ? n - 1 : n;
}

/* The share of the trace's query-key pairs and of its KV tokens (summed over steps) in its first
 * `done` steps, from `attnreplay info --steps`; false when it cannot be read. */
static bool work_done(const char *trace, long long done, double *pairs_share, double *kv_share)
{
    char cmd[1200], line[512];
    snprintf(cmd, sizeof cmd, "'%s' info '%s' --steps 2>/dev/null", tu_bin(), trace);
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    double pairs[2] = {0, 0}, kv[2] = {0, 0};   /* [0] the first `done` steps, [1] all */
    long long rows = 0;
    while (fgets(line, sizeof line, p)) {
        long long step, reqs, tokens, prefill, max_seq, kv_tokens, qk;
        double t;
        if (line[0] == '#' || sscanf(line, "%lld %lf %lld %lld %lld %lld %lld %lld", &step, &t, &reqs, &tokens,
                                     &prefill, &max_seq, &kv_tokens, &qk) != 8)
            continue;
        for (int k = rows < done ? 0 : 1; k < 2; k++) {
            pairs[k] += (double)qk;
            kv[k] += (double)kv_tokens;
        }
        rows++;
    }
    pclose(p);
    if (rows == 0 || !(pairs[1] > 0) || !(kv[1] > 0)) return false;
    *pairs_share = pairs[0] / pairs[1];
    *kv_share = kv[0] / kv[1];
    return true;
}

static int failures;

/* BENCH_REPLAY_TRACES/NAME.trace.jsonl.gz when present (simulated elsewhere), else simulates it
 * into the temporary directory; false (with a note) when it cannot be made. */
static bool make_trace(const char *name, const char *sim_args, char *trace, size_t len)
{
    char log[600], cmd[4096];
    const char *made = getenv("BENCH_REPLAY_TRACES");
    if (made && *made) {
        snprintf(trace, len, "%s/%s.trace.jsonl.gz", made, name);
        if (access(trace, R_OK) == 0) return true;
    }
    snprintf(trace, len, "%s/%s.trace.jsonl.gz", tu_tmpdir(), name);
    if (access(trace, R_OK) == 0) return true;
    if (strstr(sim_args, "(missing)")) {
        printf("%-14s skipped: its workload is not here (../shared/traces-public, AR_PUBLIC_TRACES) and "
               "BENCH_REPLAY_TRACES has no %s.trace.jsonl.gz\n", name, name);
        return false;
    }
    snprintf(log, sizeof log, "%s/%s.sim.log", tu_tmpdir(), name);
    snprintf(cmd, sizeof cmd, "'%s' sim %s --out '%s' --quiet", tu_bin(), sim_args, trace);
    child_result c = run_child(cmd, log, 0);
    if (c.rc != 0) {
        char *text = tu_slurp(log);
        printf("%-14s cannot simulate the trace (exit %d): %s\n", name, c.rc, text ? text : "");
        free(text);
        failures++;
        return false;
    }
    return true;
}

static bool device_runs;   /* the CUDA runs (else the CPU configuration) */

/* One replay: prints a table row; returns the child's result. */
static child_result bench_run(const char *name, const char *trace, const char *args, double target_s,
                              bool target_is_ratio, long long *steps_out)
{
    char db[600], log[600], cmd[4096];
    snprintf(db, sizeof db, "%s/%s.db", tu_tmpdir(), name);
    snprintf(log, sizeof log, "%s/%s.log", tu_tmpdir(), name);
    /* device runs log their progress (a line every 10 s) and the device verifier's closing line,
     * shown below the row */
    snprintf(cmd, sizeof cmd, "'%s' replay '%s' --db '%s'%s %s", tu_bin(), trace, db, device_runs ? "" : " --quiet",
             args);
    double limit = target_is_ratio ? limit_for(600) : limit_for(target_s);
    child_result c = run_child(cmd, log, limit);
    run_row r = newest_run(db);
    long long total = trace_steps(trace);
    if (steps_out) *steps_out = r.steps_done;
    const bool whole = r.found && total > 0 && r.steps_done >= total;
    const double host = r.wall > 0 ? 100.0 * (r.wall - r.kernel) / r.wall : 0;
    const double projected = r.steps_done > 0 && total > 0 ? r.wall * (double)total / (double)r.steps_done : 0;
    char verdict[160] = "";
    if (target_is_ratio)
        snprintf(verdict, sizeof verdict, "wall/kernel %.2f (target <= %.2f)%s", r.kernel > 0 ? r.wall / r.kernel : 0,
                 target_s, whole ? "" : ", partial");
    else if (target_s > 0 && whole)
        snprintf(verdict, sizeof verdict, "took %.0f s (target <= %.0f s)", r.wall, target_s);
    else if (target_s > 0) {
        /* by steps, and by the work done: the query-key pairs (every-row checks, prefill
         * kernels) and the KV tokens read (decodes, sampled checks); the truth lies between */
        double ps = 0, ks = 0;
        if (r.steps_done > 0 && work_done(trace, r.steps_done, &ps, &ks) && ps > 0 && ks > 0)
            snprintf(verdict, sizeof verdict, "projected %.0f s by steps, %.0f by qk pairs, %.0f by KV tokens "
                     "(target <= %.0f s)", projected, r.wall / ps, r.wall / ks, target_s);
        else
            snprintf(verdict, sizeof verdict, "projected %.0f s (target <= %.0f s)", projected, target_s);
    }
    const double per_step = r.steps_done > 0 ? 1e3 * (r.wall - r.kernel - r.verify - r.setup) / (double)r.steps_done : 0;
    printf("%-14s %-8s %6lld/%-6lld %8.2f %8.2f %8.2f %6.1f%% | %6.2f %7.2f %7.2f %6.2f %6.2f %6.2f | %7.3f | %s%s\n",
           name, r.found ? r.backend : "-", r.steps_done, total, r.wall, r.kernel, r.verify, host, r.parse,
           r.metadata, r.generation, r.wait, r.sqlite, r.setup, per_step, verdict,
           c.stopped ? " [stopped at the time limit]" : "");
    printf("RESULT bench_replay %s steps=%lld total=%lld wall_s=%.3f kernel_s=%.3f verify_s=%.3f parse_s=%.3f "
           "metadata_s=%.3f generation_s=%.3f wait_s=%.3f sqlite_s=%.3f setup_s=%.3f host_ms_per_step=%.3f "
           "rss_kib=%ld status=%s\n", name, r.steps_done, total, r.wall, r.kernel, r.verify, r.parse, r.metadata,
           r.generation, r.wait, r.sqlite, r.setup, per_step, c.max_rss_kib, r.found ? r.status : "none");
    char *logged = device_runs ? tu_slurp(log) : NULL;
    const char *vline = logged ? strstr(logged, "verified on the device:") : NULL;
    if (vline) {
        const char *eol = strchr(vline, '\n');
        printf("%-14s %.*s\n", "", eol ? (int)(eol - vline) : (int)strlen(vline), vline);
    }
    free(logged);
    /* a planted-fault-free run must not fail; a stop at the limit is expected (143) */
    if (!(c.rc == 0 || (c.stopped && c.rc == 143)) || r.steps_failed > 0) {
        char *text = tu_slurp(log);
        printf("%-14s FAILED: exit %d, %lld failed steps, status %s %s\n%s\n", name, c.rc, r.steps_failed, r.status,
               r.error, text ? text : "");
        free(text);
        failures++;
    }
    return c;
}

static void header(void)
{
    printf("%-14s %-8s %13s %8s %8s %8s %7s | %6s %7s %7s %6s %6s %6s | %7s | %s\n", "run", "backend", "steps",
           "wall s", "kernel", "verify", "host", "parse", "meta", "gen", "wait", "sqlite", "setup", "host ms",
           "target");
    printf("%-14s %-8s %13s %8s %8s %8s %7s | %-44s | %7s |\n", "", "", "done/total", "", "", "", "1-k/w",
           "s; parse and sqlite run on other threads", "/step*");
}

/* The cuda backend would run the default llama-3.1-8b configuration here. */
static bool cuda_present(void)
{
    char log[600], cmd[1200];
    snprintf(log, sizeof log, "%s/backends.log", tu_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' backends", tu_bin());
    run_child(cmd, log, 60);
    char *text = tu_slurp(log);
    bool yes = false;
    /* the cuda row of the table: "N   cuda       yes  CHOSEN   supported" */
    const char *line = text ? strstr(text, "   cuda ") : NULL;
    const char *eol = line ? strchr(line, '\n') : NULL;
    if (line && eol) {
        char buf[256];
        size_t n = (size_t)(eol - line) < sizeof buf - 1 ? (size_t)(eol - line) : sizeof buf - 1;
        memcpy(buf, line, n);
        buf[n] = '\0';
        yes = strstr(buf, "CHOSEN") != NULL;
    }
    free(text);
    return yes;
}

int main(void)
{
    char mooncake[1024], mc_trace[1024], dsv3_trace[1024], decode_trace[1024], long_trace[1024], args[2048];
    const char *mc = public_trace("mooncake-fast25/synthetic_trace.jsonl", mooncake, sizeof mooncake);
    snprintf(args, sizeof args, "--workload mooncake:%s --model llama-3.1-8b --num-blocks 32768 "
             "--max-num-batched-tokens 8192 --max-num-seqs 256 --step-time roofline:h200 --limit 300",
             mc ? mc : "(missing)");
    const bool have_mc = make_trace("mooncake300", args, mc_trace, sizeof mc_trace);
    const bool gpu = device_runs = cuda_present();
    printf("bench_replay: %s\n\n", gpu ? "CUDA device: issue 18's four runs" : "no CUDA device: the CPU configuration");
    header();
    if (gpu) {
        if (have_mc && selected("mc-off-L32")) bench_run("mc-off-L32", mc_trace, "--backend cuda --verify off --layers 32", 1.15, true, NULL);
        if (have_mc && selected("mc-s64-L32"))
            bench_run("mc-s64-L32", mc_trace, "--backend cuda --verify sample:64 --layers 32", 300, false, NULL);
        if (have_mc && selected("mc-all-L1")) bench_run("mc-all-L1", mc_trace, "--backend cuda --verify all --layers 1", 300, false, NULL);
        if (selected("dsv3-all") &&
            make_trace("dsv3", "--workload synthetic:groups=2,prompts=32,system=1024,question=256,output=32,rate=20 "
                               "--model deepseek-v3 --kv-mem 60GiB --step-time roofline:h200", dsv3_trace, sizeof dsv3_trace))
            bench_run("dsv3-all", dsv3_trace, "--backend cuda-mla --verify all", 60, false, NULL);
    } else {
        /* decode-heavy llama-3.1-8b: per-step host work against small kernels */
        if (make_trace("decode", "--workload synthetic:n=64,input=256,output=64,rate=50,seed=3 --model llama-3.1-8b "
                                 "--num-blocks 8192 --step-time roofline:h200", decode_trace, sizeof decode_trace)) {
            if (selected("cpu-off")) bench_run("cpu-off", decode_trace, "--backend cpu --verify off", 0, false, NULL);
            if (selected("cpu-off-serial"))
                bench_run("cpu-off-serial", decode_trace, "--backend cpu --verify off --no-overlap", 0, false, NULL);
            if (selected("cpu-s8"))
                bench_run("cpu-s8", decode_trace,
                          "--backend cpu --verify sample:8 --layers 2 --verify-layers first --steps 0:59", 0, false, NULL);
        }
        if (have_mc && selected("mc-parse")) {
            char log[600], cmd[1200];
            snprintf(log, sizeof log, "%s/mc-info.log", tu_tmpdir());
            snprintf(cmd, sizeof cmd, "'%s' info '%s'", tu_bin(), mc_trace);
            child_result c = run_child(cmd, log, 120);
            long long n = trace_steps(mc_trace);
            printf("\nmc-parse: `attnreplay info` reads and validates the Mooncake trace (%lld steps) in %.2f s: "
                   "%.3f ms a step (exit %d)\n", n, c.wall_s, n > 0 ? 1e3 * c.wall_s / (double)n : 0, c.rc);
            printf("RESULT bench_replay mc-parse steps=%lld wall_s=%.3f\n", n, c.wall_s);
            if (c.rc != 0) failures++;
        }
        if (selected("memory") &&
            make_trace("long", "--workload synthetic:n=400,input=32,output=100,rate=1 --model llama-3.1-8b "
                               "--num-blocks 4096 --step-time constant:0.01", long_trace, sizeof long_trace)) {
            printf("\n");
            child_result small = bench_run("mem-2k", long_trace, "--backend cpu --verify off --steps 0:1999", 0, false, NULL);
            child_result large = bench_run("mem-20k", long_trace, "--backend cpu --verify off --steps 0:19999", 0, false, NULL);
            double growth = small.max_rss_kib > 0 ? (double)large.max_rss_kib / (double)small.max_rss_kib - 1 : 1;
            printf("memory: peak RSS %ld KiB after 2,000 steps, %ld KiB after 20,000 (%+.1f%%; limit +10%%)\n",
                   small.max_rss_kib, large.max_rss_kib, 100 * growth);
            if (growth > 0.10) {
                printf("memory: FAILED: the replay grows with the trace\n");
                failures++;
            }
        }
    }
    printf("\n* host ms/step: (wall - kernel - verify - setup) / steps: the per-step host work the step loop did not "
           "hide (metadata, generation, waiting for the reader or the writer, hand-over)\n");
    return failures ? 1 : 0;
}
