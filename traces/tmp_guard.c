/* tmp_guard.c - see tmp_guard.h. */
#include "tmp_guard.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The temporary files a signal must remove; set only while they may exist. */
static char tmp_paths[AR_TMP_GUARD_MAX][4200];
static int num_paths;
static volatile sig_atomic_t tmp_live;

static const int cleanup_signals[3] = { SIGINT, SIGTERM, SIGHUP };

void ar_tmp_guard_remove_now(void)
{
    if (!tmp_live) return;
    for (int i = 0; i < num_paths; i++) unlink(tmp_paths[i]);
}

static void remove_tmp_and_reraise(int sig)
{
    ar_tmp_guard_remove_now();
    signal(sig, SIG_DFL);
    raise(sig);
}

void ar_tmp_guard_arm(ar_tmp_guard *g, const char *path)
{
    ar_tmp_guard_arm_all(g, &path, 1);
}

void ar_tmp_guard_arm_all(ar_tmp_guard *g, const char *const *paths, int n)
{
    tmp_live = 0;
    num_paths = n < AR_TMP_GUARD_MAX ? n : AR_TMP_GUARD_MAX;
    for (int i = 0; i < num_paths; i++) snprintf(tmp_paths[i], sizeof tmp_paths[i], "%s", paths[i]);
    tmp_live = 1;
    for (int i = 0; i < 3; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = remove_tmp_and_reraise;
        sigemptyset(&sa.sa_mask);
        sigaction(cleanup_signals[i], NULL, &g->saved[i]);
        if (g->saved[i].sa_handler != SIG_IGN) sigaction(cleanup_signals[i], &sa, NULL);
    }
}

void ar_tmp_guard_disarm(ar_tmp_guard *g)
{
    tmp_live = 0;
    for (int i = 0; i < 3; i++) sigaction(cleanup_signals[i], &g->saved[i], NULL);
}

int ar_tmp_guard_finish(ar_tmp_guard *g, const char *final)
{
    int rc = 0, saved_errno = 0;
    if (final && rename(tmp_paths[0], final) != 0) {
        saved_errno = errno;
        rc = -1;
    }
    if (!final || rc != 0) ar_tmp_guard_remove_now();
    ar_tmp_guard_disarm(g);
    if (rc != 0) errno = saved_errno;
    return rc;
}
