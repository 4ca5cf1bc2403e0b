/* tmp_guard.h - an output written to a temporary file and renamed into place once whole, which
 * SIGINT, SIGTERM or SIGHUP removes before the signal ends the process, so a stopped run leaves
 * neither a part-written output nor the temporary file.  `sim --out` and `gen-samples` use it.
 * One temporary file at a time per process. */
#ifndef AR_TMP_GUARD_H
#define AR_TMP_GUARD_H

#include <signal.h>

typedef struct ar_tmp_guard {
    struct sigaction saved[3];   /* the SIGINT, SIGTERM and SIGHUP handlers the guard replaced */
} ar_tmp_guard;

/* From now on those signals (unless ignored) remove path (copied) before ending the process. */
void ar_tmp_guard_arm(ar_tmp_guard *g, const char *path);
/* Renames the file to final, or removes it when final is NULL or the rename fails, and puts the
 * handlers back.  Returns 0, or -1 with errno set when the rename failed. */
int ar_tmp_guard_finish(ar_tmp_guard *g, const char *final);

#endif
