/* tmp_guard.h - an output written to a temporary file and renamed into place once whole, which
 * SIGINT, SIGTERM or SIGHUP removes before the signal ends the process, so a stopped run leaves
 * neither a part-written output nor the temporary file.  `sim --out` and `gen-samples` use it for
 * one file; `profile` for its temporary database, its --trace replay's scratch database and the
 * files SQLite keeps beside each, which it also removes when the replay's watchdog ends the
 * process (ar_tmp_guard_remove_now).  One guard at a time per process. */
#ifndef AR_TMP_GUARD_H
#define AR_TMP_GUARD_H

#include <signal.h>

#define AR_TMP_GUARD_MAX 8   /* the files one guard removes */

typedef struct ar_tmp_guard {
    struct sigaction saved[3];   /* the SIGINT, SIGTERM and SIGHUP handlers the guard replaced */
} ar_tmp_guard;

/* From now on those signals (unless ignored) remove path (copied) before ending the process. */
void ar_tmp_guard_arm(ar_tmp_guard *g, const char *path);
/* The same for n paths (at most AR_TMP_GUARD_MAX; copied), the first being the output. */
void ar_tmp_guard_arm_all(ar_tmp_guard *g, const char *const *paths, int n);
/* Removes the armed guard's files now (unlink only: async-signal-safe), for what ends the process
 * other than those signals. */
void ar_tmp_guard_remove_now(void);
/* Renames the (first) file to final, or removes the files when final is NULL or the rename fails,
 * and puts the handlers back.  Returns 0, or -1 with errno set when the rename failed. */
int ar_tmp_guard_finish(ar_tmp_guard *g, const char *final);
/* Puts the handlers back and forgets the files, which are the caller's again (renamed or removed
 * by it). */
void ar_tmp_guard_disarm(ar_tmp_guard *g);

#endif
