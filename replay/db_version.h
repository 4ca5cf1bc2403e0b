/* db_version.h - the schema version of the results database (its tables are in replay/db.h)
 * and the one reader of a file's version, on their own so that a reader with row types of its
 * own (reports/rundata.c) can refuse a database written by a newer attnreplay without including
 * db.h. */
#ifndef AR_DB_VERSION_H
#define AR_DB_VERSION_H

#include <sqlite3.h>

#define AR_DB_SCHEMA_VERSION 4

/* The schema version recorded in the meta table of schema (NULL: main; "s" for a database
 * attached as s); 0 when there is none (no meta table, no version row: version 1's files). */
int ar_db_schema_version(sqlite3 *h, const char *schema);

#endif
