/* watchdog.h - the replay's stop flag, the bracket around every backend call and the watchdog
 * thread that ends a run which cannot end itself: SIGINT / SIGTERM within 2 s (exit 130 / 143,
 * the run 'interrupted'), a backend call that faults or runs past its deadline (exit 3, the run
 * 'error'), in both cases with the writer's whole steps committed (replay.c's opening comment).
 * One run per process at a time: the state is the process's. */
#ifndef AR_WATCHDOG_H
#define AR_WATCHDOG_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "db.h"

/* What the backend call in flight is. */
enum { AR_CALL_NONE, AR_CALL_OPEN, AR_CALL_PREPARE, AR_CALL_FILL, AR_CALL_FORWARD };

/* SIGINT / SIGTERM set the stop flag (the previous handlers are saved, and restored by
 * ar_stop_signals_restore); ar_stop_signalled() is the signal that asked to stop, 0 while none
 * did; ar_stop_flag() is the flag itself, for ar_verify_opts.cancel. */
void ar_stop_signals_install(struct sigaction *old_int, struct sigaction *old_term);
void ar_stop_signals_restore(const struct sigaction *old_int, const struct sigaction *old_term);
int ar_stop_signalled(void);
const volatile int *ar_stop_flag(void);

/* Brackets a call into the backend: kind, step (-1: none), layer (-1: none); the deadline is
 * the begin time plus the timeout (0: no limit). */
void ar_call_set_timeout(double seconds);
void ar_call_begin(int kind, int64_t step, int layer);
void ar_call_end(void);

typedef struct ar_watchdog ar_watchdog;
struct ar_watchdog {
    pthread_t tid;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool quit;                /* the run is over (set by the step loop) */
    ar_db_writer *writer;     /* set once the run exists */
    int64_t run_id;
    const char *db_path;
    const char *backend;      /* the backend's name, for messages */
    bool quiet;
};

/* Starts the thread and installs the crash handler (ATTNREPLAY_CRASH_HANDLER=0 leaves faults to
 * the default action); the writer and the backend's name are given once they exist.
 * ar_watchdog_stop ends the thread (before the writer goes); ar_crash_handler_remove puts the
 * previous fault handlers back (after the backend is closed). */
void ar_watchdog_start(ar_watchdog *wd, bool quiet);
void ar_watchdog_set_writer(ar_watchdog *wd, ar_db_writer *w, int64_t run, const char *db_path);
void ar_watchdog_set_backend(ar_watchdog *wd, const char *name);
void ar_watchdog_stop(ar_watchdog *wd);
void ar_crash_handler_remove(void);

#endif
