/* watchdog.c - what keeps a replay's promises when the step loop cannot (replay.c's opening
 * comment tells the whole story): SIGINT / SIGTERM set a flag the loop and the verifier watch,
 * and a watchdog thread ends the run within 2 s if the loop does not; every call into the
 * backend is bracketed with its kind, step, layer and deadline, so that a fault inside it (the
 * crash handler parks the faulting thread) or a call past --forward-timeout has the watchdog
 * commit the whole steps, mark the run 'error' and exit 3.  A plugin's attnreplay_plugin_init
 * and check(), called before a backend is chosen, are bracketed the same way with the plugin's
 * file: a fault or hang there is a broken plugin, exit 2 with nothing stored.  Its close(),
 * called once the run's outcome is stored, too: the run stays as stored and the exit says the
 * close failed.  Nothing is written from a signal handler.  Whichever way the watchdog ends the
 * process, a command that runs the replay inside itself first removes its own files through the
 * exit hook (profile: its temporary profile and the replay's scratch database). */
#include "watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define AR_SIGNAL_GRACE_S 1.2    /* the step loop's time to stop by itself after a signal */
#define AR_SIGNAL_ABORT_S 0.5    /* then the watchdog's time to commit and mark the run */

static double now_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The signal that asked the run to stop (SIGINT / SIGTERM), 0 while none did.  An int (what
 * sig_atomic_t is here) so that verification can watch it through ar_verify_opts.cancel. */
static volatile sig_atomic_t stop_signal;
static sem_t signal_sem;
static pthread_once_t signal_sem_once = PTHREAD_ONCE_INIT;

static void signal_sem_init(void)
{
    sem_init(&signal_sem, 0, 0);
}

/* Threads read the flag through this (atomic: the handler may run on any thread); the verifier
 * polls it through ar_verify_opts.cancel. */
int ar_stop_signalled(void)
{
    return __atomic_load_n(&stop_signal, __ATOMIC_RELAXED);
}

static void on_signal(int sig)
{
    const int saved_errno = errno;
    int none = 0;
    __atomic_compare_exchange_n(&stop_signal, &none, sig, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    sem_post(&signal_sem);   /* async-signal-safe: wakes the watchdog */
    errno = saved_errno;
}

/* The backend call in flight (open, prepare, fill or a forward): what it is, which step and
 * layer, and by when it must return (monotonic ns; 0 = no limit).  Set by the step loop around
 * every call into the backend, read by the watchdog (a call past its deadline) and the crash
 * handler (a fault inside the call). */
static int call_kind;
static int64_t call_step;
static int call_layer;
static int64_t call_deadline_ns;
static double call_timeout_s;
static char call_source[512];   /* a plugin's own entry point (init, check, close): its file */

/* A fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) inside a backend call: the signal and
 * address. */
static volatile sig_atomic_t crash_signal;
static void *volatile crash_addr;
static const int crash_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define NUM_CRASH_SIGNALS (int)(sizeof crash_signals / sizeof crash_signals[0])
static struct sigaction crash_old[NUM_CRASH_SIGNALS];
static bool crash_installed;

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void ar_call_begin(int kind, int64_t step, int layer)
{
    __atomic_store_n(&call_step, step, __ATOMIC_RELAXED);
    __atomic_store_n(&call_layer, layer, __ATOMIC_RELAXED);
    int64_t deadline = call_timeout_s > 0 ? mono_ns() + (int64_t)(call_timeout_s * 1e9) : 0;
    __atomic_store_n(&call_deadline_ns, deadline, __ATOMIC_RELAXED);
    __atomic_store_n(&call_kind, kind, __ATOMIC_RELEASE);
}

void ar_call_end(void)
{
    __atomic_store_n(&call_kind, AR_CALL_NONE, __ATOMIC_RELEASE);
    __atomic_store_n(&call_deadline_ns, 0, __ATOMIC_RELAXED);
}

bool ar_call_begin_plugin(int kind, const char *source)
{
    if (__atomic_load_n(&call_kind, __ATOMIC_ACQUIRE) != AR_CALL_NONE) return false;
    snprintf(call_source, sizeof call_source, "%s", source && *source ? source : "(unnamed)");
    ar_call_begin(kind, -1, -1);
    return true;
}

/* A fault inside a backend call: the thread that faulted records it, wakes the watchdog and waits
 * for the watchdog to end the process (returning would fault again).  A fault outside any backend
 * call is attnreplay's own: the previous disposition is restored and the fault happens again
 * there (a core dump, the sanitizer's report; abort() raises SIGABRT again itself). */
static void on_crash(int sig, siginfo_t *info, void *context)
{
    (void)context;
    if (__atomic_load_n(&call_kind, __ATOMIC_ACQUIRE) == AR_CALL_NONE || crash_signal) {
        for (int i = 0; i < NUM_CRASH_SIGNALS; i++)
            if (crash_signals[i] == sig) sigaction(sig, &crash_old[i], NULL);
        if (crash_signal) for (;;) pause();   /* a second fault while the first is handled */
        return;
    }
    crash_addr = info ? info->si_addr : NULL;
    crash_signal = sig;
    sem_post(&signal_sem);
    for (;;) pause();
}

/* Installs on_crash (ATTNREPLAY_CRASH_HANDLER=0 leaves faults to the default action, for a core
 * dump of a backend under development). */
static void crash_handler_install(void)
{
    const char *env = getenv("ATTNREPLAY_CRASH_HANDLER");
    if (env && strcmp(env, "0") == 0) return;
    static char alt_stack[1 << 16];   /* the step loop's thread: a stack overflow can still be reported */
    stack_t ss = {.ss_sp = alt_stack, .ss_size = sizeof alt_stack, .ss_flags = 0};
    sigaltstack(&ss, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_crash;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < NUM_CRASH_SIGNALS; i++) sigaction(crash_signals[i], &sa, &crash_old[i]);
    crash_installed = true;
}

void ar_crash_handler_remove(void)
{
    if (!crash_installed) return;
    for (int i = 0; i < NUM_CRASH_SIGNALS; i++) sigaction(crash_signals[i], &crash_old[i], NULL);
    stack_t ss = {.ss_sp = NULL, .ss_size = 0, .ss_flags = SS_DISABLE};
    sigaltstack(&ss, NULL);
    crash_installed = false;
}

static const char *call_name(int kind)
{
    switch (kind) {
    case AR_CALL_OPEN: return "open";
    case AR_CALL_PREPARE: return "prepare";
    case AR_CALL_FILL: return "fill";
    case AR_CALL_INIT: return "attnreplay_plugin_init";
    case AR_CALL_CHECK: return "check()";
    case AR_CALL_CLOSE: return "close()";
    default: return "forward";
    }
}

static bool plugin_entry(int kind)
{
    return kind == AR_CALL_INIT || kind == AR_CALL_CHECK || kind == AR_CALL_CLOSE;
}

static const char *crash_signal_name(int sig)
{
    return sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE"
         : sig == SIGILL ? "SIGILL" : "SIGABRT";
}

/* " (address 0x...)" for a fault with one; SIGABRT (abort(), a failed assert) has none. */
static void crash_where(char *buf, size_t len)
{
    if (crash_signal == SIGABRT) buf[0] = '\0';
    else snprintf(buf, len, " (address %p)", crash_addr);
}

/* Writes text to stderr without stdio (whose lock a faulted thread may hold). */
static void say(const char *text)
{
    size_t n = strlen(text);
    while (n > 0) {
        ssize_t w = write(2, text, n);
        if (w <= 0) break;
        text += w;
        n -= (size_t)w;
    }
}

/* The exit hook (ar_watchdog_set_exit_hook), called just before the watchdog ends the process. */
static void (*volatile exit_hook)(void);

void ar_watchdog_set_exit_hook(void (*fn)(void))
{
    exit_hook = fn;
}

/* Ends the process with code: the exit hook first, if one is set.  Async-signal-safe (the alarm's
 * handler ends the process this way too), as the hook must be. */
static void end_process(int code)
{
    void (*fn)(void) = exit_hook;
    if (fn) fn();
    _exit(code);
}

/* The last resort of a watchdog that is ending a broken run: if committing and marking the run
 * takes longer than this (a faulted backend may hold a lock the writer needs), the process ends
 * anyway; the database then holds whole steps and the run stays 'running'. */
#define AR_BROKEN_ABORT_S 5
static void on_alarm(int sig)
{
    (void)sig;
    say("attnreplay replay: the database could not be updated in time after the backend failed; the run stays "
        "'running' with its committed steps (--resume continues it)\n");
    end_process(3);
}

/* A backend call faulted or ran past its deadline: commit the whole steps the writer holds, mark
 * the run 'error' with why, and end the process with exit code 3.  The call's own step is not
 * recorded (it has no result). */
static void watchdog_end_broken(ar_watchdog *wd, const char *why)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    alarm(AR_BROKEN_ABORT_S);
    int rc = wd->writer ? ar_db_writer_abort(wd->writer, "error", why, now_wall(), AR_BROKEN_ABORT_S - 1) : 0;
    char msg[1400];
    if (wd->writer && rc == 0)
        snprintf(msg, sizeof msg, "attnreplay replay: %s; the run stops here (a failed backend's state cannot be "
                 "trusted): committed steps kept, run %lld in %s marked 'error' (--resume continues it)\n", why,
                 (long long)wd->run_id, wd->db_path);
    else if (wd->writer && rc < 0)
        snprintf(msg, sizeof msg, "attnreplay replay: %s; the run stops here: the database was busy, so run %lld in "
                 "%s stays 'running' with its committed steps (--resume continues it)\n", why,
                 (long long)wd->run_id, wd->db_path);
    else
        snprintf(msg, sizeof msg, "attnreplay replay: %s; the run stops here\n", why);
    if (isatty(2)) say("\n");   /* after the progress line */
    say(msg);
    end_process(3);
}

/* A plugin's init, check() or close() faulted or hung (what: "crashed (SIGSEGV) ..." or "did not
 * return ...").  init and check(): a broken plugin, nothing stored, exit 2.  close(): the run's
 * outcome is stored already and stays; exit 3 unless the run's own code says more. */
static void watchdog_end_plugin(ar_watchdog *wd, int kind, const char *what)
{
    char msg[1400];
    int code = 2;
    if (kind == AR_CALL_CLOSE) {
        code = wd->close_exit == 0 || wd->close_exit == 1 || wd->close_exit == 4 ? 3 : wd->close_exit;
        if (wd->close_stored)
            snprintf(msg, sizeof msg, "attnreplay replay: plugin %s %s after run %lld in %s was stored: the run keeps "
                     "its status '%s' and its steps; exit %d for the failed close\n", call_source, what,
                     (long long)wd->run_id, wd->db_path, wd->close_status, code);
        else
            snprintf(msg, sizeof msg, "attnreplay replay: plugin %s %s; exit %d for the failed close\n", call_source,
                     what, code);
    } else {
        snprintf(msg, sizeof msg, "attnreplay replay: plugin %s %s: a broken plugin; nothing was replayed\n",
                 call_source, what);
    }
    say(msg);
    end_process(code);
}

static void *watchdog_main(void *arg)
{
    ar_watchdog *wd = arg;
    for (;;) {
        struct timespec ts = ar_deadline_in(0.25);   /* a call's deadline is looked at 4 times a second */
        int woke = sem_timedwait(&signal_sem, &ts) == 0;
        pthread_mutex_lock(&wd->mu);
        if (wd->quit) {
            pthread_mutex_unlock(&wd->mu);
            return NULL;
        }
        const int kind = __atomic_load_n(&call_kind, __ATOMIC_ACQUIRE);
        const int64_t deadline = __atomic_load_n(&call_deadline_ns, __ATOMIC_RELAXED);
        char why[600], where[64];
        const int64_t step = __atomic_load_n(&call_step, __ATOMIC_RELAXED);
        const int layer = __atomic_load_n(&call_layer, __ATOMIC_RELAXED);
        if (kind == AR_CALL_OPEN) snprintf(where, sizeof where, "setup");
        else if (layer < 0) snprintf(where, sizeof where, "step %lld", (long long)step);
        else snprintf(where, sizeof where, "step %lld, layer %d", (long long)step, layer);
        char addr[48] = "";
        if (crash_signal) crash_where(addr, sizeof addr);
        if (crash_signal && plugin_entry(kind)) {
            snprintf(why, sizeof why, "crashed (%s) in %s%s", crash_signal_name(crash_signal), call_name(kind), addr);
            watchdog_end_plugin(wd, kind, why);
        }
        if (plugin_entry(kind) && deadline > 0 && mono_ns() > deadline) {
            snprintf(why, sizeof why, "did not return within %g s in %s (--forward-timeout)", call_timeout_s,
                     call_name(kind));
            watchdog_end_plugin(wd, kind, why);
        }
        if (crash_signal) {
            snprintf(why, sizeof why, "%s: the %s backend's %s crashed with %s%s", where,
                     wd->backend ? wd->backend : "?", call_name(kind), crash_signal_name(crash_signal), addr);
            watchdog_end_broken(wd, why);
        }
        if (kind != AR_CALL_NONE && deadline > 0 && mono_ns() > deadline) {
            snprintf(why, sizeof why, "%s: the %s backend's %s did not return within %g s (--forward-timeout)", where,
                     wd->backend ? wd->backend : "?", call_name(kind), call_timeout_s);
            watchdog_end_broken(wd, why);
        }
        if (!woke || !ar_stop_signalled()) {
            pthread_mutex_unlock(&wd->mu);
            continue;
        }
        /* SIGINT / SIGTERM: the step loop has AR_SIGNAL_GRACE_S to stop by itself */
        ts = ar_deadline_in(AR_SIGNAL_GRACE_S);
        while (!wd->quit && pthread_cond_timedwait(&wd->cv, &wd->mu, &ts) != ETIMEDOUT) {}
        if (wd->quit) {
            pthread_mutex_unlock(&wd->mu);
            return NULL;
        }
        const int sig = ar_stop_signalled() ? ar_stop_signalled() : SIGTERM;
        const char *name = sig == SIGINT ? "SIGINT" : "SIGTERM";
        if (wd->closing) {   /* the outcome is stored; the backend's close has not ended */
            snprintf(why, sizeof why, "\nattnreplay replay: %s: stopped while the backend was closing; %s\n", name,
                     wd->close_stored ? "the run stays as stored" : "no run was stored");
            say(why);
            end_process(128 + sig);
        }
        /* The step loop is still inside a step: commit what is whole, mark the run, end here. */
        snprintf(why, sizeof why, "interrupted by %s (the step in flight was abandoned)", name);
        int rc = wd->writer ? ar_db_writer_abort(wd->writer, "interrupted", why, now_wall(), AR_SIGNAL_ABORT_S) : 0;
        if (wd->writer && rc == 0)
            fprintf(stderr, "\nattnreplay replay: %s: stopped inside a step; committed steps kept, run %lld in %s "
                            "marked interrupted (--resume continues it)\n", name, (long long)wd->run_id, wd->db_path);
        else if (wd->writer && rc < 0)
            fprintf(stderr, "\nattnreplay replay: %s: stopped inside a step; the database was busy, so run %lld "
                            "in %s stays 'running' with its committed steps (--resume continues it)\n", name,
                    (long long)wd->run_id, wd->db_path);
        else if (!wd->writer)
            fprintf(stderr, "\nattnreplay replay: %s: stopped before the run started\n", name);
        fflush(stderr);
        end_process(128 + sig);
    }
}

static void watchdog_thread_start(ar_watchdog *wd)
{
    pthread_mutex_init(&wd->mu, NULL);
    pthread_cond_init(&wd->cv, NULL);
    wd->started = pthread_create(&wd->tid, NULL, watchdog_main, wd) == 0;
}

void ar_watchdog_set_writer(ar_watchdog *wd, ar_db_writer *w, int64_t run, const char *db_path)
{
    pthread_mutex_lock(&wd->mu);
    wd->writer = w;
    wd->run_id = run;
    wd->db_path = db_path;
    pthread_mutex_unlock(&wd->mu);
}

void ar_watchdog_set_backend(ar_watchdog *wd, const char *name)
{
    pthread_mutex_lock(&wd->mu);
    wd->backend = name;
    pthread_mutex_unlock(&wd->mu);
}

void ar_watchdog_closing(ar_watchdog *wd, const char *status, int exit_code)
{
    pthread_mutex_lock(&wd->mu);
    wd->closing = true;
    wd->close_stored = wd->writer && status;
    wd->close_status = status;
    wd->close_exit = exit_code;
    wd->writer = NULL;
    pthread_mutex_unlock(&wd->mu);
}

void ar_watchdog_stop(ar_watchdog *wd)
{
    pthread_mutex_lock(&wd->mu);
    wd->quit = true;
    pthread_cond_broadcast(&wd->cv);
    pthread_mutex_unlock(&wd->mu);
    if (wd->started) {
        sem_post(&signal_sem);   /* wakes it if it still waits for a signal */
        pthread_join(wd->tid, NULL);
        wd->started = false;
        while (sem_trywait(&signal_sem) == 0) {}
    }
    pthread_mutex_destroy(&wd->mu);
    pthread_cond_destroy(&wd->cv);
}

/* ---- what the step loop calls ----------------------------------------------------------------- */

void ar_stop_signals_install(struct sigaction *old_int, struct sigaction *old_term)
{
    pthread_once(&signal_sem_once, signal_sem_init);
    __atomic_store_n(&stop_signal, 0, __ATOMIC_RELAXED);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, old_int);
    sigaction(SIGTERM, &sa, old_term);
}

void ar_stop_signals_restore(const struct sigaction *old_int, const struct sigaction *old_term)
{
    sigaction(SIGINT, old_int, NULL);
    sigaction(SIGTERM, old_term, NULL);
}

const volatile int *ar_stop_flag(void)
{
    return &stop_signal;
}

void ar_call_set_timeout(double seconds)
{
    call_timeout_s = seconds;
}

void ar_watchdog_start(ar_watchdog *wd, bool quiet)
{
    memset(wd, 0, sizeof *wd);
    wd->quiet = quiet;
    crash_signal = 0;
    ar_call_end();
    watchdog_thread_start(wd);
    crash_handler_install();
}
