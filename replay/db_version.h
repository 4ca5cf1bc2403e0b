/* db_version.h - the schema version of the results database (its tables are in replay/db.h),
 * on its own so that a reader with row types of its own (reports/rundata.c) can refuse a
 * database written by a newer attnreplay without including db.h. */
#ifndef AR_DB_VERSION_H
#define AR_DB_VERSION_H

#define AR_DB_SCHEMA_VERSION 4

#endif
