/* tmp_guard.c - see tmp_guard.h. */
#include "tmp_guard.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The temporary file a signal must remove; set only while it exists. */
static char tmp_path[4200];
static volatile sig_atomic_t tmp_live;

static const int cleanup_signals[3] = { SIGINT, SIGTERM, SIGHUP };

static void remove_tmp_and_reraise(int sig)
{
    if (tmp_live) unlink(tmp_path);
    signal(sig, SIG_DFL);
    raise(sig);
}

void ar_tmp_guard_arm(ar_tmp_guard *g, const char *path)
{
    tmp_live = 0;
    snprintf(tmp_path, sizeof tmp_path, "%s", path);
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

int ar_tmp_guard_finish(ar_tmp_guard *g, const char *final)
{
    int rc = 0, saved_errno = 0;
    if (final && rename(tmp_path, final) != 0) {
        saved_errno = errno;
        rc = -1;
    }
    if (!final || rc != 0) unlink(tmp_path);
    tmp_live = 0;
    for (int i = 0; i < 3; i++) sigaction(cleanup_signals[i], &g->saved[i], NULL);
    if (rc != 0) errno = saved_errno;
    return rc;
}
