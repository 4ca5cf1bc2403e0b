/* stdout_check.c - flushing stdout at a command's end and saying when what it printed was lost
 * (see stdout_check.h). */
#include "stdout_check.h"

#include <errno.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <string.h>

int ar_stdout_flush(const char **why)
{
    errno = 0;
    const int failed = fflush(stdout) != 0;
    const int saved = errno;
    if (!failed && !ferror(stdout)) return 0;
    *why = failed && saved ? strerror(saved) : "an earlier write failed";
    __fpurge(stdout);   /* said: what is still buffered is dropped */
    clearerr(stdout);
    return -1;
}

int ar_stdout_check(const char *cmd)
{
    const char *why = NULL;
    if (ar_stdout_flush(&why) == 0) return 0;
    fprintf(stderr, "attnreplay %s: cannot write the output to stdout (%s)\n", cmd, why);
    return 3;
}
