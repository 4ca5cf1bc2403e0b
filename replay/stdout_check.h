/* stdout_check.h - whether what a command printed reached its stdout.  stdio keeps a command's
 * lines in a buffer that the exit flushes, and nothing looks at that flush, so a full disk,
 * /dev/full or a closed stdout lost the output with exit 0.  Every command of replay/main.c
 * flushes stdout before it exits and checks the stream's error flag here; `replay` does
 * it before its backend is closed, since a plugin's close may end the process. */
#ifndef AR_STDOUT_CHECK_H
#define AR_STDOUT_CHECK_H

/* Flushes stdout.  0 when everything printed so far was written; otherwise -1 with the reason in
 * *why (the system's words, or "an earlier write failed" when that write's errno is gone), what
 * is still buffered dropped and the error cleared, so the exit's flush does not try again. */
int ar_stdout_flush(const char **why);

/* For a command whose product is a file, a directory or a database and whose stdout only
 * summarises it (report, plan, sim, export, replay, merge, calibrate, profile): 0 when the summary was
 * written, else 3 after one line on stderr, "attnreplay CMD: cannot write the output to stdout
 * (REASON)".  The caller keeps a failure code of its own. */
int ar_stdout_check(const char *cmd);

#endif
