/* db_lock.h - another connection's lock on a database, as every command meets it: how long a
 * connection waits for the lock (ATTNREPLAY_BUSY_TIMEOUT_MS), and how a command that waited in
 * vain says so.  A database locked past the wait is bad input, exit 2, like one that is not
 * ours (README "Commands").  On its own so that readers with row types of their own
 * (reports/rundata.c) share it without including db.h; the functions are in replay/db.c. */
#ifndef AR_DB_LOCK_H
#define AR_DB_LOCK_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How long a connection waits for another connection's lock (ms); ATTNREPLAY_BUSY_TIMEOUT_MS
 * overrides it. */
#define AR_DB_BUSY_TIMEOUT_MS 30000
/* The wait every connection to a database sets (sqlite3_busy_timeout), writers and readers:
 * ATTNREPLAY_BUSY_TIMEOUT_MS when it is an integer 0..86400000, else AR_DB_BUSY_TIMEOUT_MS. */
int ar_db_busy_timeout_ms(void);

/* When the last failure on sqlite_handle (a sqlite3 *; NULL: none) was another connection's
 * lock - SQLITE_BUSY or SQLITE_LOCKED, which SQLite returns once the busy timeout has run out:
 * err = "PATH: [WHAT: ]the database is locked by another connection's write (waited N ms;
 * ATTNREPLAY_BUSY_TIMEOUT_MS sets the wait)" and true (what may be NULL; N is
 * ar_db_busy_timeout_ms()).  Otherwise false, err untouched. */
bool ar_db_lock_error(void *sqlite_handle, const char *path, const char *what, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
