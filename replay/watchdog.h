/* watchdog.h - the replay's stop flag, the bracket around every backend call and the watchdog
 * thread that ends a run which cannot end itself: SIGINT / SIGTERM within 2 s (exit 130 / 143,
 * the run 'interrupted'), a backend call that faults or runs past its deadline (exit 3, the run
 * 'error'), in both cases with the writer's whole steps committed (replay.c's opening comment).
 * A plugin's own entry points outside the run are bracketed the same way and named by the
 * plugin's file: attnreplay_plugin_init and check() before a backend is chosen (a fault or hang
 * is a broken plugin: exit 2, nothing stored), close() after the run's outcome is stored (the
 * run stays as stored: exit 3 unless the run's own code already says it did not succeed).
 * A caller's exit hook removes its own files before the watchdog ends the process.
 * One run per process at a time: the state is the process's. */
#ifndef AR_WATCHDOG_H
#define AR_WATCHDOG_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "db.h"

/* What the backend call in flight is: the run's calls, then a plugin's own entry points. */
enum { AR_CALL_NONE, AR_CALL_OPEN, AR_CALL_PREPARE, AR_CALL_FILL, AR_CALL_FORWARD,
       AR_CALL_INIT, AR_CALL_CHECK, AR_CALL_CLOSE };

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
/* Brackets a plugin's attnreplay_plugin_init (AR_CALL_INIT), check() (AR_CALL_CHECK) or close()
 * (AR_CALL_CLOSE), source naming the plugin (its file) in messages, with the same deadline.  It
 * begins nothing while another call is in flight (check() and close() inside open are open's):
 * the return says whether it began one, and only then does the caller end it (ar_call_end).
 * Without a watchdog (the Python package's own use of the library) it only records the call. */
bool ar_call_begin_plugin(int kind, const char *source);

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
    bool closing;             /* the run's outcome is stored (or it never began): only close() is left */
    bool close_stored;        /* closing: a run row holds the outcome close_status */
    const char *close_status; /* closing: the stored status, for messages */
    int close_exit;           /* closing: the exit code the run ends with */
};

/* Starts the thread and installs the crash handler (ATTNREPLAY_CRASH_HANDLER=0 leaves faults to
 * the default action); the writer and the backend's name are given once they exist.
 * ar_watchdog_stop ends the thread (before the writer goes); ar_crash_handler_remove puts the
 * previous fault handlers back (after the backend is closed). */
void ar_watchdog_start(ar_watchdog *wd, bool quiet);
void ar_watchdog_set_writer(ar_watchdog *wd, ar_db_writer *w, int64_t run, const char *db_path);
void ar_watchdog_set_backend(ar_watchdog *wd, const char *name);
/* The run's outcome is stored (status NULL: no run row holds one) and the process will exit with
 * exit_code: the writer is no longer the watchdog's, and what it still watches is the backend's
 * close.  A fault or hang there then ends the process with a message saying the run stands as
 * stored, exit 3 when exit_code is 0, 1 or 4 (else exit_code); SIGINT / SIGTERM with exit
 * 128 + the signal when the close has not ended within the signal grace. */
void ar_watchdog_closing(ar_watchdog *wd, const char *status, int exit_code);
/* fn (NULL: none) is called just before the watchdog ends the process, whichever of the ways above
 * it does: a command that runs a replay inside itself removes its own files there (profile's
 * temporary profile and the replay's scratch database), which would otherwise stay behind.  It may
 * run on the watchdog's thread while the step loop is still inside a call, or in a signal handler
 * (the abort's alarm), so it must be async-signal-safe (unlink, write).  Process-wide; set it
 * before the replay starts and clear it after the replay returns. */
void ar_watchdog_set_exit_hook(void (*fn)(void));
void ar_watchdog_stop(ar_watchdog *wd);
void ar_crash_handler_remove(void);

#endif
