/* testutil.h - helpers shared by the cmocka test binaries: where things are, temporary
 * directories, running the attnreplay binary, and the cmocka includes in the right order. */
#ifndef AR_TESTUTIL_H
#define AR_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Repository root (AR_SRC from make, else "."). */
const char *tu_src_dir(void);
/* Path of bin/attnreplay (AR_BIN from make, else "bin/attnreplay"). */
const char *tu_bin(void);
/* The build directory a test binary BUILD/tests/NAME belongs to (plugins, mutants live there). */
const char *tu_build_dir(void);
/* ../shared/traces-public/<rel> beside the checkout, or NULL when absent. */
const char *tu_public_trace(const char *rel, char *buf, size_t len);
/* A fresh temporary directory (removed at exit); returns its path. */
const char *tu_tmpdir(void);
/* Joins tu_tmpdir() and name into buf. */
const char *tu_tmp(const char *name, char *buf, size_t len);
/* Runs a shell command; returns its exit status (or -1).  Output goes to out_path if given. */
int tu_run(const char *out_path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reads a whole file into a malloc'd NUL-terminated buffer (NULL if missing). */
char *tu_slurp(const char *path);
/* A gzip (or plain) file decompressed into a malloc'd NUL-terminated buffer; *len its length.
 * NULL when it cannot be read. */
char *tu_slurp_gz(const char *path, size_t *len);
/* True when the file holds needle; otherwise prints the file (for the failure) and says false. */
bool tu_file_has(const char *path, const char *needle);
/* The path of the shipped sample trace traces/samples/NAME.trace.jsonl.gz in buf. */
const char *tu_sample(const char *name, char *buf, size_t len);
/* Writes text to path; returns 0 on success. */
int tu_write(const char *path, const char *text);
/* A thread body (pthread_create) that commits the transaction its SQLite connection (sqlite3 *)
 * holds after about 1.5 s: a write lock that another process's command must wait out. */
void *tu_commit_later(void *db);
/* One integer from a read-only SQLite connection (2 s busy timeout); -1 when the query fails. */
int64_t tu_query_int(const char *db, const char *sql);
/* The first column of the first row as text ("" when none). */
void tu_query_text(const char *db, const char *sql, char *out, size_t len);

/* A number in 0 .. n - 1 from the xorshift generator *state (a fixed seed gives the same
 * sequence on every machine: the tests' random cases are reproducible). */
int tu_rnd(uint64_t *state, int n);
/* The next 64 random bits of the seeded generator *state (a 64-bit LCG step, its state mixed by
 * a MurmurHash3-style finaliser): the batch builders' keys, shuffles and normal samples. */
uint64_t tu_rng64(uint64_t *state);

/* DeepSeek-V3's MLA attention (one latent KV head of 576 = 512 + 64 rope dims, nope 128, v 128,
 * its softmax scale) with `heads` query heads and `layers` layers, named `name`, in *m (an
 * ar_model of traces/trace.h; the test's config holds it). */
struct ar_model;
void tu_mla_model(struct ar_model *m, const char *name, int heads, int layers);

/* Keeps only this process's share of tests [n] when AR_GPU_SHARD=K/N is set (the tests whose
 * index i has i % N == K, in order; compacted in place) and returns how many remain; n when
 * unset or malformed.  Lets tests/gpu_sanitize.sh split a slow (binary, tool) pair over N
 * processes. */
size_t tu_gpu_shard(struct CMUnitTest *tests /* [n] */, size_t n);
/* Runs a GPU test binary's group: AR_GPU_ONLY=PATTERN keeps the tests whose names match
 * (cmocka's * and ? wildcards), then AR_GPU_SHARD (tu_gpu_shard); cmocka's exit status. */
int tu_run_gpu_tests(const char *group, struct CMUnitTest *tests /* [n] */, size_t n);

#endif
