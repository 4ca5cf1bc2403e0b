/* test_faults.c - what a replay does when things go wrong around it (issue 8, item 5 and 6):
 *
 *   full disk      a replay under `ulimit -f` (SIGXFSZ ignored, so writes fail with EFBIG the
 *                  way a full disk fails them with ENOSPC) exits 3 with a message naming the
 *                  database; the database opens, passes integrity_check, the run is 'error',
 *                  every committed step is whole (0..last_step, nothing after), and --resume
 *                  completes it; a new database whose schema could not be written is
 *                  removed (file, -wal, -shm), an existing one kept as it was
 *   SIGINT         commits, marks the run 'interrupted', exits 130; the committed steps are
 *                  intact and --resume completes the run
 *   SIGTERM        inside a long step (an 8k-token prefill on the CPU, --repeat 5) the run ends
 *                  within 2 s with 143 through the watchdog, the step in flight abandoned, the
 *                  committed steps whole, the run 'interrupted'; --resume takes up the same run
 *                  at that step (and is stopped the same way)
 *   SIGKILL        inside a write transaction (ATTNREPLAY_TEST_KILL_AFTER_STEP) after earlier
 *                  batches committed: the committed batches stay whole, --resume completes
 *   space reserve  each writer holds its own (a deleted file it keeps open, seen through
 *                  /proc/PID/fd) until it closes, two replays on one database included; a
 *                  replay killed with SIGKILL leaves no reserve file; a PATH-reserve an earlier
 *                  version left is removed by the next writer, another file of that name kept
 *   readers        while a replay writes (WAL), a read-only connection counts its committed
 *                  steps and `attnreplay report` renders from the same database
 *   second writer  no write lock is held while a step computes (another connection takes the
 *                  lock at any moment within 200 ms); a lock held elsewhere makes a replay, new
 *                  or --resume, wait (ATTNREPLAY_BUSY_TIMEOUT_MS) and then refuse it as bad
 *                  input (exit 2, the file, "locked by another connection's write", the wait)
 *                  without touching the database; a replay starved of the lock mid-run stops
 *                  the same way, its committed steps whole, and --resume completes it; merge
 *                  waits the same timeout for a lock on OUT or on a shard (exit 2, OUT as it
 *                  was); two replays started together on one database both finish; every run
 *                  whole
 *   errors         a trace that breaks mid-run ends the run 'error' with the reason (FILE:LINE:
 *                  rule) in runs.error
 *   migration      a schema-version-1 database: report reads it, the compatibility views give
 *                  version-2 columns as NULL, a replay migrates it in place and keeps its runs;
 *                  a newer schema is refused (exit 2)
 *   two resumes    a replay that resumed a run another process then resumed and finished
 *                  stops at its first commit (exit 3, "another process has written run N")
 *                  and leaves that run's rows and status as they were
 *   not ours       a --db or merge OUT that is text, a truncated SQLite file or another
 *                  program's database with tables named runs and steps: exit 2 naming the
 *                  file, the file byte for byte as it was
 *   NaN / Inf      anywhere in a step's output (checked row or not, out or LSE, verify all,
 *                  sample or off) fails the step through the library's verifier
 *   --verify off   is labelled 'unverified' in the summary, the database and the report
 *
 * The traces are made here with the simulator over a tiny model (1 layer, 4 query heads, 2 KV
 * heads, head size 32) so replays are quick on the CPU backend.  SIGKILL + --resume is in
 * test_replay.c (ATTNREPLAY_TEST_KILL_AFTER_STEP). */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../replay/backend.h"
#include "../replay/db.h"
#include "../replay/verify.h"
#include "../sim/sim.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static ar_model tiny_model(void)
{
    ar_model m;
    memset(&m, 0, sizeof m);
    snprintf(m.name, sizeof m.name, "tiny-faults");
    m.attention = AR_ATTN_MHA;
    m.num_layers = 1;
    m.num_q_heads = 4;
    m.num_kv_heads = 2;
    m.head_size = 32;
    m.v_head_dim = 32;
    m.scale = 1.0 / sqrt(32.0);
    return m;
}

/* Simulates the workload wl on the tiny model (batches of up to max_tokens tokens, a cache of
 * num_blocks blocks) and writes the trace to path; returns the number of steps. */
static int64_t simulate_to(const char *path, const ar_workload *wl, int max_tokens, int num_blocks)
{
    char err[AR_ERR_MAX + 1024];
    ar_sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.steptime.kind = AR_STEPTIME_CONSTANT;
    cfg.steptime.constant_s = 0.01;
    cfg.num_sms = 132;
    ar_trace_header *h = &cfg.header;
    h->version = AR_TRACE_VERSION;
    h->model = tiny_model();
    h->cache.block_size = 16;
    h->cache.num_blocks = num_blocks;
    h->cache.dtype = AR_BF16;
    h->cache.kv_cache_dtype = AR_BF16;
    h->sched.max_num_batched_tokens = max_tokens;
    h->sched.max_num_seqs = 8;
    h->sched.prefix_caching = true;
    snprintf(h->source, sizeof h->source, "test_faults");
    h->seed = 7;
    ar_sim *s = ar_sim_create(&cfg, wl, err, sizeof err);
    assert_non_null(s);
    ar_trace_writer *w = ar_trace_create(path, h, err, sizeof err);
    assert_non_null(w);
    int64_t steps = 0;
    const ar_step *st;
    int rc;
    while ((rc = ar_sim_step(s, &st, err, sizeof err)) == 1) {
        assert_int_equal(ar_trace_write_step(w, st, err, sizeof err), 0);
        steps++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(ar_trace_finish(w, err, sizeof err), 0);
    ar_sim_destroy(s);
    return steps;
}

/* Simulates spec (a synthetic workload) on the tiny model and writes the trace to path;
 * returns the number of steps. */
static int64_t make_trace(const char *path, const char *spec)
{
    char err[AR_ERR_MAX + 1024];
    ar_workload wl;
    if (ar_workload_load(spec, 16, 1.0, 0, &wl, err, sizeof err) != 0) {
        fprintf(stderr, "workload %s: %s\n", spec, err);
        return -1;
    }
    int64_t steps = simulate_to(path, &wl, 256, 1024);
    ar_workload_free(&wl);
    return steps;
}

/* The committed steps of run are exactly 0..last_step, once each, and match steps_done. */
static void assert_run_whole(const char *db, int run)
{
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM steps WHERE run=%d", run);
    int64_t count = tu_query_int(db, sql);
    snprintf(sql, sizeof sql, "SELECT count(DISTINCT step) FROM steps WHERE run=%d", run);
    assert_int_equal(tu_query_int(db, sql), count);
    snprintf(sql, sizeof sql, "SELECT steps_done FROM runs WHERE id=%d", run);
    assert_int_equal(tu_query_int(db, sql), count);
    snprintf(sql, sizeof sql, "SELECT last_step FROM runs WHERE id=%d", run);
    assert_int_equal(tu_query_int(db, sql) + 1, count);
    snprintf(sql, sizeof sql, "SELECT coalesce(max(step), -1) FROM steps WHERE run=%d", run);
    assert_int_equal(tu_query_int(db, sql) + 1, count);
}

static void assert_integrity_ok(const char *db)
{
    char text[256];
    tu_query_text(db, "PRAGMA integrity_check", text, sizeof text);
    assert_string_equal(text, "ok");
}

/* Starts `attnreplay replay TRACE --db DB --backend cpu --threads 1 EXTRA...` (EXTRA
 * NULL-terminated, at most ten) with stdout/stderr to log; returns its pid. */
static pid_t spawn_replay(const char *trace, const char *db, const char *log, const char *const *extra)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        if (!f || dup2(fileno(stdout), 2) < 0) _exit(126);
        const char *argv[20] = {tu_bin(), "replay", trace, "--db", db, "--backend", "cpu", "--threads", "1"};
        int n = 9;
        for (int i = 0; extra[i] && n < 19; i++) argv[n++] = extra[i];
        argv[n] = NULL;
        execv(tu_bin(), (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static int wait_exit(pid_t pid)
{
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static bool file_contains(const char *path, const char *needle)
{
    char *text = tu_slurp(path);
    bool yes = text && strstr(text, needle);
    if (!yes && text) fprintf(stderr, "--- %s (no '%s'):\n%s\n", path, needle, text);
    free(text);
    return yes;
}

static const char *long_trace(char *buf, size_t len, int64_t *steps)
{
    static int64_t cached_steps = -1;
    tu_tmp("long.trace.jsonl", buf, len);
    if (cached_steps < 0) cached_steps = make_trace(buf, "synthetic:n=32,input=150,output=40,rate=20,seed=5");
    *steps = cached_steps;
    return buf;
}

/* ---- full disk --------------------------------------------------------------------------- */

static void test_full_disk_marks_error_and_keeps_committed_steps(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], text[1024];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    assert_true(total > 150);
    tu_tmp("full.db", db, sizeof db);
    tu_tmp("full.log", log, sizeof log);
    /* 160 KiB per file: the schema and a few batches fit, the rest does not.  SIGXFSZ is
     * ignored so an oversized write fails with EFBIG instead of killing the process. */
    int rc = tu_run(log, "bash -c \"trap '' XFSZ; ulimit -f 160; exec '%s' replay '%s' --db '%s' --backend cpu "
                         "--threads 1 --verify sample:1 --quiet\"", tu_bin(), trace, db);
    assert_int_equal(rc, 3);
    assert_true(file_contains(log, db));
    assert_true(file_contains(log, "disk"));
    assert_integrity_ok(db);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "error");
    tu_query_text(db, "SELECT error FROM runs WHERE id=1", text, sizeof text);
    assert_non_null(strstr(text, "disk"));
    int64_t kept = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1");
    assert_true(kept > 0 && kept < total);   /* some batches committed, not all */
    assert_run_whole(db, 1);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1 AND pass != 1"), 0);
    print_message("full disk: %lld of %lld steps committed, run 'error': %s\n", (long long)kept,
                  (long long)total, text);

    /* room again: --resume finishes the same run */
    tu_tmp("full-resume.log", log, sizeof log);
    rc = tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --verify sample:1 --resume --quiet",
                tu_bin(), trace, db);
    assert_int_equal(rc, 0);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "passed");
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1"), total);
    assert_run_whole(db, 1);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs"), 1);
}

/* A full disk before the schema is written (1 and 8 KiB a file): a new database is not left
 * behind (no file, no -wal or -shm), so the next replay starts clean; an existing database
 * under the same limit is kept as it was. */
static void test_full_disk_at_set_up_leaves_no_new_database(void **state)
{
    (void)state;
    char trace[512], dir[512], db[700], log[512], side[720];
    tu_sample("mixed", trace, sizeof trace);
    tu_tmp("setup-full", dir, sizeof dir);
    assert_int_equal(tu_run(NULL, "mkdir -p '%s'", dir), 0);
    tu_tmp("setup-full.log", log, sizeof log);
    static const int limits[] = {1, 8};
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        snprintf(db, sizeof db, "%s/new-%d.db", dir, limits[i]);
        int rc = tu_run(log, "bash -c \"trap '' XFSZ; ulimit -f %d; exec '%s' replay '%s' --db '%s' --backend cpu "
                             "--quiet\"", limits[i], tu_bin(), trace, db);
        assert_int_equal(rc, 3);
        assert_true(file_contains(log, db));
        assert_int_equal(access(db, F_OK), -1);
        snprintf(side, sizeof side, "%s-wal", db);
        assert_int_equal(access(side, F_OK), -1);
        snprintf(side, sizeof side, "%s-shm", db);
        assert_int_equal(access(side, F_OK), -1);
    }
    /* an existing database: kept, its run whole */
    snprintf(db, sizeof db, "%s/kept.db", dir);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --quiet", tu_bin(), trace, db), 0);
    int rc = tu_run(log, "bash -c \"trap '' XFSZ; ulimit -f 1; exec '%s' replay '%s' --db '%s' --backend cpu "
                         "--quiet\"", tu_bin(), trace, db);
    assert_int_equal(rc, 3);
    assert_int_equal(access(db, F_OK), 0);
    assert_integrity_ok(db);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs WHERE status = 'passed'"), 1);
}

/* A real full disk: a 400 KiB tmpfs, when this user may mount one (root); skipped otherwise. */
static void test_full_tmpfs_marks_error(void **state)
{
    (void)state;
    char trace[512], dir[512], db[600], log[512], text[1024];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    tu_tmp("small-fs", dir, sizeof dir);
    tu_tmp("tmpfs.log", log, sizeof log);
    mkdir(dir, 0700);
    if (geteuid() != 0 || tu_run(log, "mount -t tmpfs -o size=400k tmpfs '%s'", dir) != 0) {
        print_message("no tmpfs (needs root and mount rights): skipped\n");
        skip();
    }
    snprintf(db, sizeof db, "%s/results.db", dir);
    int rc = tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --verify off --quiet", tu_bin(),
                    trace, db);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    int64_t kept = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1");
    bool whole = tu_query_int(db, "SELECT steps_done FROM runs WHERE id=1") == kept &&
                 tu_query_int(db, "SELECT last_step FROM runs WHERE id=1") + 1 == kept;
    char check[64];
    tu_query_text(db, "PRAGMA integrity_check", check, sizeof check);
    bool said_full = file_contains(log, "disk is full");
    print_message("tmpfs full: exit %d, %lld of %lld steps committed, run '%s'\n", rc, (long long)kept,
                  (long long)total, text);
    tu_run(NULL, "umount '%s'", dir);
    assert_int_equal(rc, 3);
    assert_true(said_full);
    assert_string_equal(text, "error");
    assert_true(kept > 0 && kept < total);
    assert_true(whole);
    assert_string_equal(check, "ok");
}

/* ---- SIGINT, readers during a replay ------------------------------------------------------- */

static void test_sigint_commits_and_resume_completes(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], out[512], rlog[512], text[256];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    tu_tmp("sigint.db", db, sizeof db);
    tu_tmp("sigint.log", log, sizeof log);
    tu_tmp("sigint-report", out, sizeof out);
    tu_tmp("sigint-report.log", rlog, sizeof rlog);
    /* --repeat slows every step down so the run is still going when we look */
    pid_t pid = spawn_replay(trace, db, log, (const char *const[]){"--repeat", "20", NULL});
    int64_t seen = 0;
    for (int i = 0; i < 400 && seen < 1; i++) {   /* up to 20 s */
        sleep_ms(50);
        seen = tu_query_int(db, "SELECT steps_done FROM runs WHERE id=1");
    }
    assert_true(seen >= 1);   /* a read-only connection sees committed steps during the replay */
    /* report reads the same database while the replay writes (gnuplot may be absent: 0 or 1) */
    int rrc = tu_run(rlog, "'%s' report '%s' --out '%s'", tu_bin(), db, out);
    assert_true(rrc == 0 || rrc == 1);
    char summary[600];
    snprintf(summary, sizeof summary, "%s/summary.md", out);
    assert_true(file_contains(summary, "running"));
    assert_int_equal(waitpid(pid, NULL, WNOHANG), 0);   /* still replaying */
    assert_int_equal(kill(pid, SIGINT), 0);
    assert_int_equal(wait_exit(pid), 130);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "interrupted");
    int64_t kept = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1");
    assert_true(kept >= seen && kept < total);
    assert_run_whole(db, 1);
    assert_integrity_ok(db);
    print_message("SIGINT: %lld of %lld steps committed, run 'interrupted'; report read it at %lld\n",
                  (long long)kept, (long long)total, (long long)seen);
    tu_tmp("sigint-resume.log", log, sizeof log);

    int rc = tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --repeat 20 --resume --quiet",
                    tu_bin(), trace, db);
    assert_int_equal(rc, 0);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "passed");
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1"), total);
    assert_run_whole(db, 1);
}

/* ---- a second writer -------------------------------------------------------------------- */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The words every command uses for a lock that outlasted the wait (replay/db_lock.h). */
static void assert_says_locked(const char *log, const char *db, const char *waited)
{
    assert_true(file_contains(log, db));
    assert_true(file_contains(log, "the database is locked by another connection's write"));
    assert_true(file_contains(log, waited));
    assert_true(file_contains(log, "ATTNREPLAY_BUSY_TIMEOUT_MS sets the wait"));
}

/* A lock held elsewhere is waited for (ATTNREPLAY_BUSY_TIMEOUT_MS), then refused as bad input:
 * exit 2 naming the database, for a new run and for --resume alike (both exited 3 before). */
static void test_second_writer_waits_then_fails_clearly(void **state)
{
    (void)state;
    char trace[512], db[512], log[512];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    tu_tmp("locked.db", db, sizeof db);
    tu_tmp("locked.log", log, sizeof log);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --steps 0:5 --quiet",
                            tu_bin(), trace, db), 0);
    /* hold the write lock from here, as another writer would */
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    double t0 = mono_s();
    int rc = tu_run(log, "ATTNREPLAY_BUSY_TIMEOUT_MS=2000 '%s' replay '%s' --db '%s' --backend cpu --threads 1 "
                         "--steps 0:5 --quiet", tu_bin(), trace, db);
    double waited = mono_s() - t0;
    assert_int_equal(rc, 2);
    assert_true(waited >= 1.9);              /* it waited for the busy timeout (2 s) ... */
    assert_says_locked(log, db, "waited 2000 ms");   /* ... then said why */
    assert_true(file_contains(log, "cannot create the run"));
    print_message("second writer: waited %.1f s, then exit 2\n", waited);
    rc = tu_run(log, "ATTNREPLAY_BUSY_TIMEOUT_MS=500 '%s' replay '%s' --db '%s' --backend cpu --threads 1 "
                     "--steps 0:5 --resume --quiet", tu_bin(), trace, db);
    assert_int_equal(rc, 2);                 /* --resume: its look-up takes the write lock first */
    assert_says_locked(log, db, "waited 500 ms");
    sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(h);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs"), 1);   /* untouched */
    assert_run_whole(db, 1);
    assert_integrity_ok(db);
}

/* `ATTNREPLAY_BUSY_TIMEOUT_MS=1000 attnreplay merge OUT SHARD` (output to log) while another
 * connection to locked (OUT or SHARD) holds the lock lock_sql takes, let go after: the merge
 * waits the 1 s, then exits 2 naming locked in the words every command uses, OUT's one run as it
 * was.  Returns the seconds it took. */
static double merge_refused_while_locked(const char *locked, const char *lock_sql, const char *out, const char *shard,
                                         const char *log)
{
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(locked, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, lock_sql, NULL, NULL, NULL), SQLITE_OK);
    double t0 = mono_s();
    int rc = tu_run(log, "ATTNREPLAY_BUSY_TIMEOUT_MS=1000 '%s' merge '%s' '%s' --quiet", tu_bin(), out, shard);
    double waited = mono_s() - t0;
    sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(h);
    print_message("merge with %s locked: waited %.1f s, exit %d\n", locked == out ? "OUT" : "a shard", waited, rc);
    assert_int_equal(rc, 2);
    assert_says_locked(log, locked, "waited 1000 ms");
    assert_true(waited >= 0.9);     /* it waited for the busy timeout (1 s) */
    assert_int_equal(tu_query_int(out, "SELECT count(*) FROM runs"), 1);   /* untouched */
    assert_run_whole(out, 1);
    return waited;
}

/* merge waits for a lock on OUT as long as replay does: ATTNREPLAY_BUSY_TIMEOUT_MS (it waited a
 * fixed 30 s whatever the variable said), then refuses it as bad input, exit 2 (3 before), with
 * OUT untouched; a shard another process keeps locked is waited for the same way and refused by
 * name (it was called "not a readable SQLite database" at once). */
static void test_merge_waits_the_busy_timeout(void **state)
{
    (void)state;
    char trace[512], shard[512], out[512], log[512];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    tu_tmp("merge-locked-shard.db", shard, sizeof shard);
    tu_tmp("merge-locked-out.db", out, sizeof out);
    tu_tmp("merge-locked.log", log, sizeof log);
    unlink(shard);
    unlink(out);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --steps 0:3 --quiet",
                            tu_bin(), trace, shard), 0);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --steps 0:3 --quiet",
                            tu_bin(), trace, out), 0);
    assert_true(merge_refused_while_locked(out, "BEGIN IMMEDIATE", out, shard, log) < 15);   /* not the 30 s default */
    /* a shard locked for its write (a rollback-journal database under BEGIN EXCLUSIVE) */
    merge_refused_while_locked(shard, "PRAGMA journal_mode=DELETE; BEGIN EXCLUSIVE; DELETE FROM steps WHERE 0", out,
                               shard, log);
    /* once the locks are gone the same merge goes through */
    assert_int_equal(tu_run(log, "'%s' merge '%s' '%s' --quiet", tu_bin(), out, shard), 0);
    assert_int_equal(tu_query_int(out, "SELECT count(*) FROM runs"), 2);
}

/* A replay starved of the write lock mid-run (another connection holds it past the busy timeout
 * when a batch is due) stops as bad input, exit 2 naming the database and the wait (it was exit
 * 3 "database is locked"), its committed steps whole; --resume then completes the run. */
static void test_writer_starved_mid_run_exits_2(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], text[1024];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    tu_tmp("starved.db", db, sizeof db);
    tu_tmp("starved.log", log, sizeof log);
    unlink(db);
    setenv("ATTNREPLAY_BUSY_TIMEOUT_MS", "1000", 1);   /* the child's wait */
    pid_t pid = spawn_replay(trace, db, log, (const char *const[]){"--repeat", "20", "--quiet", NULL});
    unsetenv("ATTNREPLAY_BUSY_TIMEOUT_MS");
    int64_t seen = 0;
    for (int i = 0; i < 400 && seen < 1; i++) {   /* the first batch committed: the run is going */
        sleep_ms(50);
        seen = tu_query_int(db, "SELECT steps_done FROM runs WHERE id=1");
    }
    assert_true(seen >= 1);
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    sqlite3_busy_timeout(h, 5000);
    assert_int_equal(sqlite3_exec(h, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    int rc = -1;
    for (int i = 0; i < 1200 && rc < 0; i++) {   /* held until the replay gives up (60 s at most) */
        sleep_ms(50);
        int st = 0;
        if (waitpid(pid, &st, WNOHANG) == pid) rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(h);
    if (rc < 0) {
        kill(pid, SIGKILL);
        wait_exit(pid);
        fail_msg("the replay still ran 60 s into the lock");
    }
    assert_int_equal(rc, 2);
    assert_says_locked(log, db, "waited 1000 ms");
    assert_true(file_contains(log, "--resume continues it"));
    int64_t kept = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1");
    assert_true(kept >= seen && kept < total);
    assert_run_whole(db, 1);
    assert_integrity_ok(db);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "running");   /* the status write met the lock too */
    print_message("starved mid-run: exit 2, %lld of %lld steps committed\n", (long long)kept, (long long)total);
    rc = tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --repeat 20 --resume --quiet", tu_bin(),
                trace, db);
    assert_int_equal(rc, 0);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "passed");
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1"), total);
    assert_run_whole(db, 1);
}

/* While a replay computes its steps, no write lock is held: the replay holds it only to commit a
 * batch (milliseconds), so another connection asking at random moments finds it free nearly
 * every time.  A replay that held the lock while steps compute would keep it nearly all the time,
 * and nearly every attempt would wait.  The check counts the attempts that got the lock at once
 * (within 100 ms) and needs three in four of them, with every attempt served within 2 s: a batch
 * commit that a loaded machine stretches past 100 ms (CI has two cores) costs one attempt, not
 * the test. */
static void test_no_write_lock_while_steps_compute(void **state)
{
    (void)state;
    char trace[512], db[512], log[512];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    tu_tmp("nolock.db", db, sizeof db);
    tu_tmp("nolock.log", log, sizeof log);
    pid_t pid = spawn_replay(trace, db, log, (const char *const[]){"--repeat", "20", NULL});
    int64_t seen = 0;
    for (int i = 0; i < 400 && seen < 1; i++) {   /* the first batch committed: the run is going */
        sleep_ms(50);
        seen = tu_query_int(db, "SELECT steps_done FROM runs WHERE id=1");
    }
    assert_true(seen >= 1);
    int got = 0, at_once = 0, tries = 0;
    double slowest = 0;
    for (; tries < 48 && waitpid(pid, NULL, WNOHANG) == 0; tries++) {
        sqlite3 *h = NULL;
        assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
        sqlite3_busy_timeout(h, 2000);
        double t0 = mono_s();
        if (sqlite3_exec(h, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK) {
            double waited = mono_s() - t0;
            got++;
            at_once += waited < 0.1;
            if (waited > slowest) slowest = waited;
        } else {
            print_message("BEGIN IMMEDIATE: %s\n", sqlite3_errmsg(h));
        }
        sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL);
        sqlite3_close(h);
        sleep_ms(47);
    }
    print_message("write lock taken %d of %d times during the replay, %d within 100 ms (slowest %.0f ms)\n",
                  got, tries, at_once, slowest * 1e3);
    assert_true(tries >= 5);
    assert_int_equal(got, tries);
    assert_true(4 * at_once >= 3 * tries);
    kill(pid, SIGINT);
    int rc = wait_exit(pid);
    assert_true(rc == 130 || rc == 0);
    assert_run_whole(db, 1);
}

/* For two replays of the long trace into one database NAME.db (logs NAME-1.log, NAME-2.log):
 * the database made first, with one short run, so that both open an existing WAL database. */
static void two_replays_setup(const char *name, char trace[512], int64_t *total, char db[512], char log1[512],
                              char log2[512])
{
    char file[64];
    long_trace(trace, 512, total);
    snprintf(file, sizeof file, "%s.db", name);
    tu_tmp(file, db, 512);
    snprintf(file, sizeof file, "%s-1.log", name);
    tu_tmp(file, log1, 512);
    snprintf(file, sizeof file, "%s-2.log", name);
    tu_tmp(file, log2, 512);
    assert_int_equal(tu_run(log1, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --steps 0:0 --quiet",
                            tu_bin(), trace, db), 0);
}

static void test_two_replays_share_a_database(void **state)
{
    (void)state;
    char trace[512], db[512], log1[512], log2[512], text[64];
    int64_t total;
    two_replays_setup("shared", trace, &total, db, log1, log2);
    const char *verify[2] = {"sample:1", "off"};
    const char *logs[2] = {log1, log2};
    pid_t pids[2];
    for (int i = 0; i < 2; i++)
        pids[i] = spawn_replay(trace, db, logs[i], (const char *const[]){"--verify", verify[i], NULL});
    for (int i = 0; i < 2; i++) {
        int rc = wait_exit(pids[i]);
        /* short transactions: neither waits long for the other, both finish */
        print_message("concurrent replay %d (verify %s): exit %d\n", i + 1, verify[i], rc);
        if (rc != 0) file_contains(logs[i], "(show the log)");
        assert_int_equal(rc, 0);
    }
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs"), 3);
    for (int run = 2; run <= 3; run++) {
        char sql[128];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM steps WHERE run=%d", run);
        assert_int_equal(tu_query_int(db, sql), total);
        assert_run_whole(db, run);
    }
    tu_query_text(db, "SELECT group_concat(status, ',') FROM (SELECT status FROM runs WHERE id>1 ORDER BY id)",
               text, sizeof text);
    assert_true(strcmp(text, "passed,unverified") == 0 || strcmp(text, "unverified,passed") == 0);
    assert_integrity_ok(db);
}

/* ---- SIGTERM inside a long step, SIGKILL inside a transaction ------------------------------ */

/* Six short requests at t=0 (64-token prompts, 60 output tokens), then one 8192-token prompt at
 * t=0.45 s, all in 8k-token batches: about 45 quick steps (the first 32 commit as soon as they
 * are done), then one long step (an 8k-token prefill: seconds on one CPU thread) while the
 * short requests decode.  Returns the number of steps. */
static int64_t big_step_trace(char *buf, size_t len)
{
    static int64_t cached = -1;
    tu_tmp("bigstep.trace.jsonl", buf, len);
    if (cached >= 0) return cached;
    char err[512];
    ar_workload wl;
    ar_workload_init(&wl, 16, "memory");
    for (int i = 0; i < 6; i++)
        assert_int_equal(ar_workload_push(&wl, 0.0, 64, 60, NULL, 0, 0, err, sizeof err), 0);
    assert_int_equal(ar_workload_push(&wl, 0.45, 8192, 4, NULL, 0, 0, err, sizeof err), 0);
    cached = simulate_to(buf, &wl, 8192 + 64, 2048);
    ar_workload_free(&wl);
    return cached;
}

/* The index of the long step in big_step_trace (the 8192-token request r6's prefill). */
static int64_t long_step_index(const char *trace)
{
    char *text = tu_slurp(trace);
    assert_non_null(text);
    const char *hit = strstr(text, "\"r6\":8192");
    assert_non_null(hit);
    int64_t lines = 0;
    for (const char *p = text; p < hit; p++) lines += *p == '\n';
    free(text);
    return lines - 1;   /* line 0 is the header */
}

/* SIGTERM to a replay (pid) busy in the long step: it ends within 2 s with 143 through the
 * watchdog, keeping the quick steps before it (all committed) and not the long one. */
static void sigterm_in_long_step(pid_t pid, const char *db, const char *log, int64_t long_step, int64_t total)
{
    assert_int_equal(waitpid(pid, NULL, WNOHANG), 0);   /* still inside the long step */
    double t0 = mono_s();
    assert_int_equal(kill(pid, SIGTERM), 0);
    int rc = wait_exit(pid);
    double took = mono_s() - t0;
    print_message("SIGTERM: exit %d after %.2f s; %lld of %lld steps committed\n", rc, took,
                  (long long)tu_query_int(db, "SELECT steps_done FROM runs WHERE id=1"), (long long)total);
    assert_int_equal(rc, 143);
    assert_true(took < 2.0);
    assert_true(file_contains(log, "SIGTERM: stopped inside a step"));
    char text[256];
    tu_query_text(db, "SELECT status || ': ' || coalesce(error, '') FROM runs WHERE id=1", text, sizeof text);
    assert_non_null(strstr(text, "interrupted: interrupted by SIGTERM"));
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1"), long_step);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs"), 1);
    assert_run_whole(db, 1);
    assert_integrity_ok(db);
}

static void test_sigterm_inside_a_long_step(void **state)
{
    (void)state;
    char trace[512], db[512], log[512];
    int64_t total = big_step_trace(trace, sizeof trace), long_step = long_step_index(trace);
    assert_true(long_step >= 40 && long_step < total);
    tu_tmp("sigterm.db", db, sizeof db);
    tu_tmp("sigterm.log", log, sizeof log);
    /* --repeat 5 makes the long step last several seconds even on a fast CPU */
    pid_t pid = spawn_replay(trace, db, log, (const char *const[]){"--verify", "sample:1", "--repeat", "5", NULL});
    /* every quick step committed (the last batch within a second): the long step is in flight */
    int64_t seen = 0;
    for (int i = 0; i < 600 && seen < long_step; i++) {
        sleep_ms(50);
        seen = tu_query_int(db, "SELECT steps_done FROM runs WHERE id=1");
    }
    assert_int_equal(seen, long_step);
    sigterm_in_long_step(pid, db, log, long_step, total);

    /* resumable: --resume takes up the same run at the long step (and is stopped there again) */
    pid = spawn_replay(trace, db, log, (const char *const[]){"--verify", "sample:1", "--repeat", "5", "--resume", NULL});
    sleep_ms(1000);
    sigterm_in_long_step(pid, db, log, long_step, total);
}

static void test_sigkill_inside_a_transaction(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], text[64];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    tu_tmp("kill.db", db, sizeof db);
    tu_tmp("kill.log", log, sizeof log);
    /* batches of 32 steps commit; step 100 is inserted inside an open transaction, then -9 */
    int rc = tu_run(log, "ATTNREPLAY_TEST_KILL_AFTER_STEP=100 '%s' replay '%s' --db '%s' --backend cpu --threads 1 "
                         "--verify off --quiet", tu_bin(), trace, db);
    assert_int_equal(rc, 128 + 9);
    int64_t kept = tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1");
    print_message("SIGKILL at step 100: %lld steps committed\n", (long long)kept);
    assert_true(kept > 0 && kept <= 100);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "running");
    assert_run_whole(db, 1);
    assert_integrity_ok(db);
    rc = tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --verify off --resume --quiet", tu_bin(),
                trace, db);
    assert_int_equal(rc, 0);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1"), total);
    assert_run_whole(db, 1);
}

/* ---- the space reserve beside a writable database ------------------------------------------ */

/* Names in the directory of db that start with its file name and "-reserve" (a reserve file
 * left beside the database), written to names (space separated); returns how many. */
static int reserve_files_beside(const char *db, char *names, size_t len)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s", db);
    char *slash = strrchr(dir, '/');
    assert_non_null(slash);
    *slash = '\0';
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s-reserve", slash + 1);
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    size_t used = 0;
    if (len) names[0] = '\0';
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        n++;
        if (used < len) used += (size_t)snprintf(names + used, len - used, "%s ", e->d_name);
    }
    closedir(d);
    return n;
}

/* Bytes allocated to the files process pid holds open that were deleted from the directory of
 * db (its space reserve; 0 when it holds none). */
static long long reserve_bytes_held(pid_t pid, const char *db)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s", db);
    *strrchr(dir, '/') = '\0';
    char fds[64];
    snprintf(fds, sizeof fds, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(fds);
    if (!d) return 0;
    long long held = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char link[600], target[1024];
        snprintf(link, sizeof link, "%s/%s", fds, e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = '\0';
        size_t dl = strlen(dir);
        if (strncmp(target, dir, dl) != 0 || target[dl] != '/' || !strstr(target, " (deleted)")) continue;
        struct stat st;
        if (stat(link, &st) == 0 && S_ISREG(st.st_mode)) held += (long long)st.st_blocks * 512;
    }
    closedir(d);
    return held;
}

/* A replay killed with SIGKILL leaves no reserve file beside its database: the reserve is a file
 * with no name, whose space the system gives back when the process ends however it ends.  A
 * PATH-reserve that an earlier version left behind (128 KiB) is removed by the next writer, which
 * opens the database as usual; a file of that name that is not such a reserve is left alone. */
static void test_sigkill_leaves_no_reserve_file(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], legacy[600], names[512], text[64];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    tu_tmp("kill-reserve.db", db, sizeof db);
    tu_tmp("kill-reserve.log", log, sizeof log);
    int rc = tu_run(log, "ATTNREPLAY_TEST_KILL_AFTER_STEP=40 '%s' replay '%s' --db '%s' --backend cpu --threads 1 "
                         "--verify off --quiet", tu_bin(), trace, db);
    assert_int_equal(rc, 128 + 9);
    int left = reserve_files_beside(db, names, sizeof names);
    print_message("after SIGKILL: %d reserve file(s) beside the database: %s\n", left, names);
    assert_int_equal(left, 0);

    /* an earlier version's reserve, left by a killed run: the next writer removes it */
    snprintf(legacy, sizeof legacy, "%s-reserve", db);
    assert_int_equal(tu_run(NULL, "head -c 131072 /dev/zero > '%s'", legacy), 0);
    rc = tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --verify off --resume --quiet",
                tu_bin(), trace, db);
    assert_int_equal(rc, 0);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "unverified");
    assert_run_whole(db, 1);
    assert_int_equal(reserve_files_beside(db, names, sizeof names), 0);

    /* a file of that name that is not a reserve (another size) is not ours to remove */
    assert_int_equal(tu_run(NULL, "printf 'notes\\n' > '%s'", legacy), 0);
    rc = tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --verify off --steps 0:3 --quiet",
                tu_bin(), trace, db);
    assert_int_equal(rc, 0);
    struct stat st;
    assert_int_equal(stat(legacy, &st), 0);
    assert_int_equal(st.st_size, 6);
    unlink(legacy);
}

/* Two replays writing one database each hold a reserve of their own until they close (a deleted
 * file of 128 KiB in the database's directory that the process keeps open): the first to close
 * does not take the other's away, and neither leaves a file behind. */
static void test_two_replays_keep_their_own_reserve(void **state)
{
    (void)state;
    char trace[512], db[512], log1[512], log2[512], names[512];
    int64_t total;
    two_replays_setup("reserve2", trace, &total, db, log1, log2);
    /* --repeat 500 makes each replay last many seconds; both are stopped with SIGINT, A first */
    pid_t a = spawn_replay(trace, db, log1, (const char *const[]){"--repeat", "500", NULL});
    pid_t b = spawn_replay(trace, db, log2, (const char *const[]){"--repeat", "500", NULL});
    long long held_a = 0, held_b = 0;
    for (int i = 0; i < 400 && (held_a < 131072 || held_b < 131072); i++) {   /* up to 20 s */
        sleep_ms(50);
        held_a = reserve_bytes_held(a, db);
        held_b = reserve_bytes_held(b, db);
    }
    print_message("two replays on one database: A holds %lld bytes of reserve, B %lld\n", held_a, held_b);
    if (held_a < 131072 || held_b < 131072) {   /* failing: no replay outlives the test */
        kill(a, SIGKILL);
        kill(b, SIGKILL);
        wait_exit(a);
        wait_exit(b);
    }
    assert_true(held_a >= 131072);
    assert_true(held_b >= 131072);
    assert_int_equal(kill(a, SIGINT), 0);
    assert_int_equal(wait_exit(a), 130);              /* A closed the database ... */
    assert_int_equal(waitpid(b, NULL, WNOHANG), 0);   /* ... while B still replays ... */
    held_b = reserve_bytes_held(b, db);
    int left = reserve_files_beside(db, names, sizeof names);
    print_message("A closed: B holds %lld bytes of reserve; files beside the database: %s\n", held_b, names);
    assert_int_equal(kill(b, SIGINT), 0);
    assert_int_equal(wait_exit(b), 130);
    assert_true(held_b >= 131072);                    /* ... with its reserve */
    assert_int_equal(left, 0);
    assert_int_equal(reserve_files_beside(db, names, sizeof names), 0);
    assert_run_whole(db, 2);
    assert_run_whole(db, 3);
    assert_integrity_ok(db);
}

/* ---- an error mid-run keeps its reason --------------------------------------------------- */

static void test_error_reason_is_stored(void **state)
{
    (void)state;
    char trace[512], broken[512], db[512], log[512], text[1024], want[600];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    tu_tmp("broken.trace.jsonl", broken, sizeof broken);
    tu_tmp("broken.db", db, sizeof db);
    tu_tmp("broken.log", log, sizeof log);
    /* the first 41 lines (header + steps 0..39), then a step that breaks a rule */
    assert_int_equal(tu_run(NULL, "head -41 '%s' > '%s' && echo '{\"step\":40,\"time\":9}' >> '%s'", trace, broken,
                            broken), 0);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --verify off --quiet",
                            tu_bin(), broken, db), 2);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "error");
    tu_query_text(db, "SELECT error FROM runs WHERE id=1", text, sizeof text);
    snprintf(want, sizeof want, "%s:42:", broken);
    print_message("runs.error: %s\n", text);
    assert_non_null(strstr(text, want));
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1"), 40);   /* whole steps kept */
    assert_run_whole(db, 1);
}

/* ---- a database of schema version 1 ------------------------------------------------------ */

static const char *const schema_v1 =
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "INSERT INTO meta VALUES('schema_version', '1');"
    "CREATE TABLE runs(id INTEGER PRIMARY KEY, trace TEXT NOT NULL, trace_hash TEXT NOT NULL,"
    " backend TEXT NOT NULL, device TEXT NOT NULL, dtype TEXT NOT NULL, kv_dtype TEXT NOT NULL,"
    " model TEXT NOT NULL, layers INTEGER NOT NULL, config TEXT NOT NULL, code_rev TEXT NOT NULL,"
    " seed INTEGER NOT NULL, verify TEXT NOT NULL, inject TEXT NOT NULL, cascade TEXT NOT NULL,"
    " repeat INTEGER NOT NULL, status TEXT NOT NULL, error TEXT, started REAL NOT NULL,"
    " finished REAL, steps_done INTEGER NOT NULL DEFAULT 0,"
    " steps_failed INTEGER NOT NULL DEFAULT 0, last_step INTEGER NOT NULL DEFAULT -1);"
    "CREATE TABLE steps(run INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, time REAL,"
    " num_reqs INTEGER, num_tokens INTEGER, num_prefill_reqs INTEGER, num_decode_reqs INTEGER,"
    " max_query_len INTEGER, max_seq_len INTEGER, total_context INTEGER,"
    " cascade INTEGER, prefix_len INTEGER, time_us REAL, bytes INTEGER, flops INTEGER,"
    " gbps REAL, tflops REAL, verified TEXT, rows_checked INTEGER, max_abs REAL, max_rel REAL,"
    " mean_abs REAL, nmse REAL, lse_max_abs REAL, nan_count INTEGER, bad_count INTEGER,"
    " naive_max_abs REAL, naive_mean_abs REAL, tol_max_abs REAL, tol_mean_abs REAL,"
    " guard_ok INTEGER, pass INTEGER, PRIMARY KEY(run, step));"
    "CREATE TABLE kernels(run INTEGER NOT NULL, step INTEGER NOT NULL, layer INTEGER NOT NULL,"
    " name TEXT NOT NULL, time_us REAL, PRIMARY KEY(run, step, layer, name));"
    "CREATE TABLE mismatches(run INTEGER NOT NULL, step INTEGER NOT NULL, layer INTEGER NOT NULL,"
    " req TEXT, token INTEGER, head INTEGER, dim INTEGER, got REAL, want REAL, abs_err REAL);"
    "CREATE TABLE ceilings(device TEXT NOT NULL, measured REAL NOT NULL, copy_gbps REAL,"
    " bf16_tflops REAL, method TEXT);"
    "INSERT INTO runs VALUES(1, 't.jsonl', 'abc', 'cpu', 'cpu', 'bf16', 'bf16', 'tiny', 1, '{}', 'old', 7,"
    " 'all', 'none', 'auto', 1, 'passed', NULL, 1.0, 2.0, 2, 0, 1);"
    "INSERT INTO steps(run, step, time, num_reqs, num_tokens, total_context, cascade, prefix_len, time_us,"
    " bytes, flops, gbps, tflops, verified, rows_checked, max_abs, nmse, pass)"
    " VALUES(1, 0, 0.0, 1, 16, 16, 0, 0, 10.0, 1000, 2000, 0.1, 0.2, 'all', 16, 1e-3, 1e-6, 1),"
    "       (1, 1, 0.01, 1, 1, 17, 0, 0, 5.0, 500, 100, 0.1, 0.02, 'all', 1, 2e-3, 2e-6, 1);";

static void test_schema_v1_database_is_read_and_migrated(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], out[512], summary[600], text[64];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    tu_tmp("v1.db", db, sizeof db);
    tu_tmp("v1.log", log, sizeof log);
    tu_tmp("v1-report", out, sizeof out);
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, schema_v1, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(h);
    /* report reads it as it is */
    int rrc = tu_run(log, "'%s' report '%s' --out '%s'", tu_bin(), db, out);
    assert_true(rrc == 0 || rrc == 1);
    snprintf(summary, sizeof summary, "%s/summary.md", out);
    assert_true(file_contains(summary, "passed"));
    /* a read-only reader sees version-2 columns as NULL through the compatibility views */
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    char err[256];
    assert_int_equal(ar_db_compat_views(h, err, sizeof err), 0);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(h, "SELECT verified_rows IS NULL, wall_s IS NULL, steps_done,"
                                           " (SELECT count(*) FROM steps WHERE wall_us IS NULL) FROM runs", -1, &st,
                                        NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int(st, 0), 1);
    assert_int_equal(sqlite3_column_int(st, 1), 1);
    assert_int_equal(sqlite3_column_int(st, 2), 2);
    assert_int_equal(sqlite3_column_int(st, 3), 2);
    sqlite3_finalize(st);
    sqlite3_close(h);
    tu_query_text(db, "SELECT value FROM meta WHERE key='schema_version'", text, sizeof text);
    assert_string_equal(text, "1");   /* reading changed nothing */
    /* a replay migrates it in place and keeps the old run */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --steps 0:9 --quiet", tu_bin(),
                            trace, db), 0);
    tu_query_text(db, "SELECT value FROM meta WHERE key='schema_version'", text, sizeof text);
    assert_int_equal(atoi(text), AR_DB_SCHEMA_VERSION);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1"), 2);
    /* version 4: the new run's steps carry kernel-path coverage, the old run's none */
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM coverage WHERE run=1"), 0);
    assert_int_equal(tu_query_int(db, "SELECT count(DISTINCT step) FROM coverage WHERE run=2"), 10);
    assert_int_equal(tu_query_int(db, "SELECT verified_steps IS NULL FROM runs WHERE id=1"), 1);
    assert_int_equal(tu_query_int(db, "SELECT verified_steps FROM runs WHERE id=2"), 10);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=2 AND wall_us > 0"), 10);
    assert_integrity_ok(db);
    rrc = tu_run(log, "'%s' report '%s' --out '%s'", tu_bin(), db, out);
    assert_true(rrc == 0 || rrc == 1);
    /* and a newer writer's database is refused, not damaged */
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "UPDATE meta SET value='99' WHERE key='schema_version'", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(h);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --steps 0:1 --quiet", tu_bin(), trace, db), 2);
    assert_true(file_contains(log, "newer"));
}

/* --resume takes the newest unfinished run, and 'running' is what a killed run and a live one
 * both read, so a second replay may resume a run another process is still writing.  Made
 * deterministic here: B resumes a run and is stopped (SIGSTOP) before its first commit; C
 * resumes the same run and finishes it ('passed'); then B goes on.  B must stop with exit 3
 * saying another process wrote the run, and leave C's run as C left it: before, B's first
 * batch failed "UNIQUE constraint failed: steps.run, steps.step" and B then marked the finished
 * run 'error'. */
static void test_resume_of_a_run_another_process_took(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], logb[512], text[64];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    tu_tmp("taken.db", db, sizeof db);
    tu_tmp("taken.log", log, sizeof log);
    tu_tmp("taken-b.log", logb, sizeof logb);
    unlink(db);
    /* a run killed inside its first batch: 'running', nothing committed */
    int rc = tu_run(log, "ATTNREPLAY_TEST_KILL_AFTER_STEP=0 '%s' replay '%s' --db '%s' --backend cpu --threads 1 "
                         "--steps 0:20 --repeat 200 --quiet", tu_bin(), trace, db);
    assert_int_not_equal(rc, 0);
    assert_int_equal(tu_query_int(db, "SELECT last_step FROM runs WHERE id=1"), -1);
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "UPDATE runs SET status='interrupted', error='test' WHERE id=1", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(h);
    /* B claims it (status back to 'running', error cleared), then stops before committing */
    const char *extra[] = {"--steps", "0:20", "--repeat", "200", "--resume", "--quiet", NULL};
    double t0 = mono_s();
    pid_t b = spawn_replay(trace, db, logb, extra);
    bool claimed = false;
    while (!claimed && mono_s() - t0 < 20) {
        claimed = tu_query_int(db, "SELECT count(*) FROM runs WHERE id=1 AND status='running' AND error IS NULL") == 1;
        if (!claimed) sleep_ms(2);
    }
    assert_true(claimed);
    assert_int_equal(kill(b, SIGSTOP), 0);
    print_message("B claimed the run after %.3f s and was stopped\n", mono_s() - t0);
    assert_int_equal(tu_query_int(db, "SELECT last_step FROM runs WHERE id=1"), -1);   /* nothing of B's yet */
    /* C resumes the same run and finishes it */
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --steps 0:20 --repeat 200 "
                                 "--resume --quiet", tu_bin(), trace, db), 0);
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "passed");
    assert_int_equal(tu_query_int(db, "SELECT steps_done FROM runs WHERE id=1"), 21);
    /* B goes on: it must stop at its first commit and leave the run to C */
    assert_int_equal(kill(b, SIGCONT), 0);
    int brc = wait_exit(b);
    print_message("B: exit %d\n", brc);
    assert_int_equal(brc, 3);
    assert_true(file_contains(logb, "another process has written run 1"));
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "passed");
    assert_int_equal(tu_query_int(db, "SELECT error IS NULL FROM runs WHERE id=1"), 1);
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM runs"), 1);
    assert_run_whole(db, 1);
    assert_integrity_ok(db);
}

/* The bytes of a file, or NULL; *len its size. */
static unsigned char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *buf = malloc(1 << 20);
    *len = buf ? fread(buf, 1, 1 << 20, f) : 0;
    fclose(f);
    return buf;
}

/* A --db (or merge's OUT) that is not an attnreplay results database is bad input: a text file,
 * a truncated SQLite file, another program's database with tables named runs and steps.  Each is
 * refused with exit 2 naming the file, and left byte for byte as it was (before, the last was
 * migrated - 27 columns added to its tables, ours created beside them - and then refused with
 * exit 3; the first two exited 3). */
static void test_foreign_or_damaged_database_refused_untouched(void **state)
{
    (void)state;
    char trace[512], good[512], db[512], log[512], out[512];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    tu_tmp("foreign.log", log, sizeof log);
    tu_tmp("foreign-good.db", good, sizeof good);
    unlink(good);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --steps 0:3 --quiet",
                            tu_bin(), trace, good), 0);
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(good, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(h);
    for (int kind = 0; kind < 3; kind++) {
        static const char *const names[] = {"text", "truncated", "another program's"};
        snprintf(out, sizeof out, "foreign-%d.db", kind);
        tu_tmp(out, db, sizeof db);
        unlink(db);
        if (kind == 0) {
            assert_int_equal(tu_write(db, "run,step,time_us\n1,0,12.5\n"), 0);
        } else if (kind == 1) {
            size_t n = 0;
            unsigned char *bytes = read_all(good, &n);
            assert_non_null(bytes);
            assert_true(n > 8192);
            FILE *f = fopen(db, "wb");
            assert_non_null(f);
            assert_int_equal(fwrite(bytes, 1, 6000, f), 6000);
            fclose(f);
            free(bytes);
        } else {
            assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
            assert_int_equal(sqlite3_exec(h, "CREATE TABLE runs(id INTEGER PRIMARY KEY, name TEXT);"
                                             "INSERT INTO runs VALUES(1, 'kept');"
                                             "CREATE TABLE steps(run INTEGER, step INTEGER, note TEXT);",
                                          NULL, NULL, NULL), SQLITE_OK);
            sqlite3_close(h);
        }
        size_t before_len = 0, after_len = 0;
        unsigned char *before = read_all(db, &before_len);
        assert_non_null(before);
        for (int cmd = 0; cmd < 2; cmd++) {
            int rc = cmd == 0 ? tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --steps 0:1 --quiet",
                                       tu_bin(), trace, db)
                              : tu_run(log, "'%s' merge '%s' '%s' --quiet", tu_bin(), db, good);
            print_message("%s file, %s: exit %d\n", names[kind], cmd == 0 ? "replay --db" : "merge OUT", rc);
            assert_int_equal(rc, 2);
            assert_true(file_contains(log, db));
            assert_true(file_contains(log, kind == 2 ? "not an attnreplay results database"
                                                     : "not a readable SQLite database"));
            unsigned char *after = read_all(db, &after_len);
            assert_non_null(after);
            assert_int_equal(after_len, before_len);
            assert_memory_equal(after, before, before_len);
            free(after);
        }
        free(before);
    }
}

/* ---- --verify off is labelled ------------------------------------------------------------- */

static void test_verify_off_labelled_in_summary_db_and_report(void **state)
{
    (void)state;
    char trace[512], db[512], log[512], out[512], rlog[512], summary[600], text[64];
    int64_t total;
    long_trace(trace, sizeof trace, &total);
    tu_tmp("off.db", db, sizeof db);
    tu_tmp("off.log", log, sizeof log);
    tu_tmp("off-report", out, sizeof out);
    tu_tmp("off-report.log", rlog, sizeof rlog);
    assert_int_equal(tu_run(log, "'%s' replay '%s' --db '%s' --backend cpu --threads 1 --steps 0:20 --verify off",
                            tu_bin(), trace, db), 0);
    assert_true(file_contains(log, "unverified"));
    assert_true(file_contains(log, "verify off"));
    tu_query_text(db, "SELECT status FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "unverified");
    tu_query_text(db, "SELECT verify FROM runs WHERE id=1", text, sizeof text);
    assert_string_equal(text, "off");
    assert_int_equal(tu_query_int(db, "SELECT count(*) FROM steps WHERE run=1 AND verified='off' AND pass IS NULL"), 21);
    int rrc = tu_run(rlog, "'%s' report '%s' --out '%s'", tu_bin(), db, out);
    assert_true(rrc == 0 || rrc == 1);
    snprintf(summary, sizeof summary, "%s/summary.md", out);
    assert_true(file_contains(summary, "unverified"));
}

/* ---- NaN / Inf in an output ---------------------------------------------------------------- */

typedef struct nan_case {
    ar_run_config cfg;
    const ar_backend *be;
    void *state;
    int qsl[2], seq[1], ctx[1], table[2];
    uint64_t keys[2], req_keys[1];
    int64_t slots[20];
    ar_batch b;
    float out[20 * 4 * 32], lse[4 * 20];
    float good_out[20 * 4 * 32], good_lse[4 * 20];
} nan_case;

/* One request, 20 prompt tokens in blocks 1 and 2, run through the CPU backend. */
static void nan_case_setup(nan_case *c)
{
    memset(c, 0, sizeof *c);
    c->cfg.model = tiny_model();
    c->cfg.block_size = 16;
    c->cfg.num_blocks = 8;
    c->cfg.dtype = AR_BF16;
    c->cfg.kv_dtype = AR_BF16;
    c->cfg.kv_scale = 1.0;
    c->cfg.num_layers = 1;
    c->cfg.seed = 11;
    c->cfg.cascade_mode = 1;
    c->cfg.repeat = 1;
    c->cfg.threads = 1;
    c->be = ar_backend_find("cpu");
    assert_non_null(c->be);
    char err[512];
    assert_int_equal(c->be->open(&c->cfg, &c->state, err, sizeof err), 0);
    c->qsl[1] = 20;
    c->seq[0] = 20;
    c->table[0] = 1;
    c->table[1] = 2;
    c->req_keys[0] = ar_req_key("nan-req");
    uint64_t prev = AR_ROOT_KEY;
    for (int i = 0; i < 2; i++) {
        prev = ar_block_content_key(prev, NULL, 0, c->req_keys[0], i);
        c->keys[i] = prev;
    }
    for (int p = 0; p < 20; p++) c->slots[p] = (int64_t)c->table[p / 16] * 16 + p % 16;
    c->b = (ar_batch){.step = 0, .num_reqs = 1, .num_tokens = 20, .query_start_loc = c->qsl,
                      .seq_lens = c->seq, .context_lens = c->ctx, .max_query_len = 20,
                      .max_seq_len = 20, .max_blocks_per_req = 2, .block_table = c->table,
                      .block_keys = c->keys, .req_keys = c->req_keys, .slot_mapping = c->slots};
    assert_int_equal(c->be->prepare(c->state, &c->b, err, sizeof err), 0);
    ar_forward_out fo;
    memset(&fo, 0, sizeof fo);
    fo.out = c->good_out;
    fo.lse = c->good_lse;
    assert_int_equal(c->be->forward(c->state, 0, &c->b, &fo, err, sizeof err), 0);
}

/* Verifies c->out/lse (a copy of the good output with one value changed) in mode. */
static ar_verify_result verify_doctored(nan_case *c, ar_verify_mode mode, bool in_out, size_t index, float value)
{
    memcpy(c->out, c->good_out, sizeof c->out);
    memcpy(c->lse, c->good_lse, sizeof c->lse);
    if (in_out) c->out[index] = value;
    else c->lse[index] = value;
    const char *ids[1] = {"nan-req"};
    ar_verify_opts vo = {mode, 1, 1, NULL, NULL};
    ar_verify_result res;
    char err[512];
    assert_int_equal(ar_verify_step(&c->cfg, &c->b, 0, c->out, c->lse, ids, &vo, &res, err, sizeof err), 0);
    return res;
}

static void test_nan_or_inf_anywhere_fails_the_step(void **state)
{
    (void)state;
    static nan_case c;
    nan_case_setup(&c);
    const ar_verify_mode modes[3] = {AR_VERIFY_ALL, AR_VERIFY_SAMPLE, AR_VERIFY_OFF};
    for (int m = 0; m < 3; m++) {
        /* the untouched output passes (index 0 rewritten with its own value) */
        ar_verify_result res = verify_doctored(&c, modes[m], true, 0, c.good_out[0]);
        assert_true(res.pass);
        assert_int_equal(res.nan_count, 0);
        /* out: first element, an element of row 0 (never checked by sample:1 -- only the last
         * row is), the last element; NaN, +Inf, -Inf */
        const size_t where[3] = {0, 5 * 32 + 7, sizeof c.out / sizeof c.out[0] - 1};
        const float bad[3] = {NAN, INFINITY, -INFINITY};
        for (int w = 0; w < 3; w++)
            for (int v = 0; v < 3; v++) {
                res = verify_doctored(&c, modes[m], true, where[w], bad[v]);
                assert_false(res.pass);
                assert_int_equal(res.nan_count, 1);
                assert_non_null(strstr(res.reason, "NaN"));
            }
        /* LSE: NaN and +Inf fail (-Inf is the LSE of an empty row, legal) */
        res = verify_doctored(&c, modes[m], false, 3, NAN);
        assert_false(res.pass);
        res = verify_doctored(&c, modes[m], false, 4 * 20 - 1, INFINITY);
        assert_false(res.pass);
    }
    c.be->close(c.state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nan_or_inf_anywhere_fails_the_step),
        cmocka_unit_test(test_verify_off_labelled_in_summary_db_and_report),
        cmocka_unit_test(test_full_disk_marks_error_and_keeps_committed_steps),
        cmocka_unit_test(test_full_disk_at_set_up_leaves_no_new_database),
        cmocka_unit_test(test_full_tmpfs_marks_error),
        cmocka_unit_test(test_sigint_commits_and_resume_completes),
        cmocka_unit_test(test_second_writer_waits_then_fails_clearly),
        cmocka_unit_test(test_merge_waits_the_busy_timeout),
        cmocka_unit_test(test_writer_starved_mid_run_exits_2),
        cmocka_unit_test(test_two_replays_share_a_database),
        cmocka_unit_test(test_no_write_lock_while_steps_compute),
        cmocka_unit_test(test_sigterm_inside_a_long_step),
        cmocka_unit_test(test_sigkill_inside_a_transaction),
        cmocka_unit_test(test_sigkill_leaves_no_reserve_file),
        cmocka_unit_test(test_two_replays_keep_their_own_reserve),
        cmocka_unit_test(test_error_reason_is_stored),
        cmocka_unit_test(test_schema_v1_database_is_read_and_migrated),
        cmocka_unit_test(test_foreign_or_damaged_database_refused_untouched),
        cmocka_unit_test(test_resume_of_a_run_another_process_took),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
