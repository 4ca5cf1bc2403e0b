/* test_calibrate.c - tests of `attnreplay calibrate` (reports/calibrate.c) that need no GPU:
 * with no CUDA device it exits 3 saying "no CUDA device" and leaves the database untouched
 * (not created when new, unchanged when it exists); given numbers (--copy-gbps, --bf16-tflops,
 * --device) land in `ceilings` exactly, labelled "given", with a current timestamp, and the
 * report's ceilings lookup (reports/rundata.c) picks the newest row; usage errors exit 2
 * without touching the database; a --db that cannot be written or that replay --db would refuse
 * (a directory, a FIFO, not SQLite, another program's tables, a newer schema) exits 2 naming it,
 * before any measurement, the file untouched; a database another connection keeps locked past
 * ATTNREPLAY_BUSY_TIMEOUT_MS is bad input too (exit 2, naming it, nothing stored); and
 * cuBLAS, when this machine has it, loads through the same dlopen search the GPU run uses.
 *
 * The process hides every GPU (CUDA_VISIBLE_DEVICES=-1) so the no-device case holds on the
 * GPU machine too. */
#include "testutil.h"

#include <fcntl.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../kernels/common/cuda_calibrate.h"
#include "../reports/reports.h"
#include "../reports/rundata.h"

static int path_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs ar_calibrate_main on a NULL-terminated argument list with stdout and stderr sent to
 * files; returns its exit status and the captured stderr (malloc'd) in *err_text. */
static int run_calibrate(const char *const *args, char **err_text)
{
    char argv_store[16][1024];
    char *argv[17];
    int argc = 0;
    for (; args[argc]; argc++) {
        assert_true(argc < 16);
        snprintf(argv_store[argc], sizeof argv_store[argc], "%s", args[argc]);
        argv[argc] = argv_store[argc];
    }
    argv[argc] = NULL;

    char out_path[1024], err_path[1024];
    tu_tmp("calibrate.stdout", out_path, sizeof out_path);
    tu_tmp("calibrate.stderr", err_path, sizeof err_path);
    fflush(stdout);
    fflush(stderr);
    int saved_out = dup(1), saved_err = dup(2);
    int out_fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err_fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(saved_out >= 0 && saved_err >= 0 && out_fd >= 0 && err_fd >= 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    int rc = ar_calibrate_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(saved_out);
    close(saved_err);
    close(out_fd);
    close(err_fd);
    *err_text = tu_slurp(err_path);
    assert_non_null(*err_text);
    return rc;
}

/* Number of rows in ceilings, or -1 when the table or file cannot be read. */
static int count_ceilings(const char *path)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int count = -1;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(db, "SELECT count(*) FROM ceilings", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        count = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return count;
}

static void test_no_device_leaves_db_untouched(void **state)
{
    (void)state;
    char path[1024], reserve[1100];
    tu_tmp("nodev.db", path, sizeof path);
    snprintf(reserve, sizeof reserve, "%s-reserve", path);
    char *err_text = NULL;

    /* A new database is not created. */
    const char *args[] = { "calibrate", "--db", path, NULL };
    assert_int_equal(run_calibrate(args, &err_text), 3);
    assert_non_null(strstr(err_text, "no CUDA device"));
    free(err_text);
    assert_false(path_exists(path));
    assert_false(path_exists(reserve));

    /* An existing one keeps its rows and gains none. */
    char err[512];
    assert_int_equal(ar_calibrate_store(path, "NVIDIA H200", 1000.0, 4000.0, 700.0, "earlier",
                                        err, sizeof err), 0);
    assert_int_equal(count_ceilings(path), 1);
    assert_int_equal(run_calibrate(args, &err_text), 3);
    assert_non_null(strstr(err_text, "no CUDA device"));
    free(err_text);
    assert_int_equal(count_ceilings(path), 1);
    assert_false(path_exists(reserve));
}

static void test_given_numbers_stored(void **state)
{
    (void)state;
    char path[1024];
    tu_tmp("given.db", path, sizeof path);
    char *err_text = NULL;
    double before = wall_now();
    const char *args[] = { "calibrate", "--db", path, "--device", "NVIDIA H200",
                           "--copy-gbps", "4321.5", "--bf16-tflops", "777.25", NULL };
    assert_int_equal(run_calibrate(args, &err_text), 0);
    free(err_text);
    double after = wall_now();

    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT device, measured, copy_gbps, bf16_tflops, "
                                        "method FROM ceilings", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "NVIDIA H200");
    double measured = sqlite3_column_double(st, 1);
    assert_true(measured >= before - 1e-3 && measured <= after + 1e-3);
    assert_true(sqlite3_column_double(st, 2) == 4321.5);    /* exact in binary */
    assert_true(sqlite3_column_double(st, 3) == 777.25);
    assert_string_equal((const char *)sqlite3_column_text(st, 4), "given");
    assert_int_equal(sqlite3_step(st), SQLITE_DONE);        /* exactly one row */
    sqlite3_finalize(st);
    sqlite3_close(db);

    /* report and plan see them as the device's ceilings. */
    char err[512];
    void *handle = ar_rd_open(path, err, sizeof err);
    assert_non_null(handle);
    ar_ceilings c;
    ar_rd_ceilings(handle, "NVIDIA H200", "cuda", &c);
    assert_true(c.copy_gbps == 4321.5);
    assert_true(c.bf16_tflops == 777.25);
    assert_non_null(strstr(c.source, "given"));
    ar_rd_close(handle);
}

static void test_newest_row_wins(void **state)
{
    (void)state;
    char path[1024], err[512];
    tu_tmp("newest.db", path, sizeof path);
    /* Stored out of order: the later measurement must win, not the later insert. */
    assert_int_equal(ar_calibrate_store(path, "GPU X", 200.0, 3000.0, 600.0, "second", err,
                                        sizeof err), 0);
    assert_int_equal(ar_calibrate_store(path, "GPU X", 100.0, 2000.0, 500.0, "first", err,
                                        sizeof err), 0);
    assert_int_equal(ar_calibrate_store(path, "GPU Y", 300.0, 1000.0, 100.0, "other", err,
                                        sizeof err), 0);
    assert_int_equal(count_ceilings(path), 3);
    void *handle = ar_rd_open(path, err, sizeof err);
    assert_non_null(handle);
    ar_ceilings c;
    ar_rd_ceilings(handle, "GPU X", "cuda", &c);
    assert_true(c.copy_gbps == 3000.0 && c.bf16_tflops == 600.0);
    assert_non_null(strstr(c.source, "second"));
    ar_rd_close(handle);
}

static void test_usage_errors(void **state)
{
    (void)state;
    char path[1024];
    tu_tmp("usage.db", path, sizeof path);
    const char *cases[][12] = {
        { "calibrate", NULL },
        { "calibrate", "--copy-gbps", "100", "--bf16-tflops", "10", "--device", "G", NULL },
        { "calibrate", "--db", path, "--copy-gbps", "100", "--device", "G", NULL },
        { "calibrate", "--db", path, "--bf16-tflops", "10", "--device", "G", NULL },
        { "calibrate", "--db", path, "--copy-gbps", "100", "--bf16-tflops", "10", NULL },
        { "calibrate", "--db", path, "--copy-gbps", "abc", "--bf16-tflops", "10", "--device",
          "G", NULL },
        { "calibrate", "--db", path, "--copy-gbps", "-5", "--bf16-tflops", "10", "--device", "G",
          NULL },
        { "calibrate", "--db", path, "--copy-gbps", "inf", "--bf16-tflops", "10", "--device",
          "G", NULL },
        { "calibrate", "--db", path, "--copy-gbps", "100", "--bf16-tflops", "0", "--device", "G",
          NULL },
        { "calibrate", "--db", path, "--copy-gbps", "100", "--bf16-tflops", "10x", "--device",
          "G", NULL },
        { "calibrate", "--db", path, "--copy-gbps", "100", "--bf16-tflops", "10", "--device", "",
          NULL },
        { "calibrate", "--db", path, "--copy-gbps", "100", "--bf16-tflops", "10", "--device", "G",
          "--no-cublas", NULL },
        { "calibrate", "--db", path, "--device", "G", NULL },
        { "calibrate", "--db", path, "--gemm-n", "100", NULL },
        { "calibrate", "--db", path, "--gemm-n", "0", NULL },
        { "calibrate", "--db", path, "--copy-mib", "lots", NULL },
        { "calibrate", "--db", path, "--frobnicate", NULL },
        { "calibrate", "--db", NULL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *err_text = NULL;
        int rc = run_calibrate(cases[i], &err_text);
        if (rc != 2) fprintf(stderr, "case %zu: exit %d, stderr: %s\n", i, rc, err_text);
        assert_int_equal(rc, 2);
        assert_true(strlen(err_text) > 0);     /* says why */
        free(err_text);
        assert_false(path_exists(path));
    }
    char *err_text = NULL;
    const char *help[] = { "calibrate", "--help", NULL };
    assert_int_equal(run_calibrate(help, &err_text), 0);
    free(err_text);
}

/* A lock held past the busy timeout is bad input, exit 2 with the words every command uses (it
 * was exit 3 "database is locked"); a file that is not a results database is refused the same
 * way (exit 3 before).  Nothing is stored; once the lock is gone the same call stores its row. */
static void test_locked_or_foreign_db_refused(void **state)
{
    (void)state;
    char path[1024], err[512];
    tu_tmp("locked-cal.db", path, sizeof path);
    unlink(path);
    assert_int_equal(ar_calibrate_store(path, "GPU X", 100.0, 2000.0, 500.0, "first", err, sizeof err), 0);
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(path, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    setenv("ATTNREPLAY_BUSY_TIMEOUT_MS", "200", 1);
    const char *args[] = { "calibrate", "--db", path, "--device", "G", "--copy-gbps", "100", "--bf16-tflops", "10",
                           NULL };
    char *err_text = NULL;
    int rc = run_calibrate(args, &err_text);
    unsetenv("ATTNREPLAY_BUSY_TIMEOUT_MS");
    if (rc != 2 || !strstr(err_text, path) || !strstr(err_text, "locked by another connection's write (waited 200 ms; "
                                                                 "ATTNREPLAY_BUSY_TIMEOUT_MS sets the wait)"))
        fail_msg("exit %d: %s", rc, err_text);
    free(err_text);
    sqlite3_exec(h, "ROLLBACK", NULL, NULL, NULL);
    sqlite3_close(h);
    assert_int_equal(count_ceilings(path), 1);
    assert_int_equal(run_calibrate(args, &err_text), 0);
    free(err_text);
    assert_int_equal(count_ceilings(path), 2);

    char text[1024];
    tu_tmp("not-results.db", text, sizeof text);
    assert_int_equal(tu_write(text, "plain text, not a database\n"), 0);
    const char *foreign[] = { "calibrate", "--db", text, "--device", "G", "--copy-gbps", "100", "--bf16-tflops", "10",
                              NULL };
    rc = run_calibrate(foreign, &err_text);
    if (rc != 2 || !strstr(err_text, text)) fail_msg("exit %d: %s", rc, err_text);
    free(err_text);
}

static void test_unwritable_db(void **state)
{
    (void)state;
    char *err_text = NULL;
    const char *missing_dir = "/nonexistent-attnreplay-dir/cal.db";
    const char *args[] = { "calibrate", "--db", missing_dir, "--device", "G", "--copy-gbps",
                           "100", "--bf16-tflops", "10", NULL };
    assert_int_equal(run_calibrate(args, &err_text), 2);
    assert_non_null(strstr(err_text, missing_dir));
    free(err_text);

    /* A folder given as the database: writable, but not a database. */
    const char *folder_args[] = { "calibrate", "--db", tu_tmpdir(), "--device", "G",
                                  "--copy-gbps", "100", "--bf16-tflops", "10", NULL };
    assert_int_equal(run_calibrate(folder_args, &err_text), 2);
    assert_non_null(strstr(err_text, "directory"));
    free(err_text);

    /* The no-device check comes after the path check: a bad path costs no GPU time either. */
    const char *measure_args[] = { "calibrate", "--db", missing_dir, NULL };
    assert_int_equal(run_calibrate(measure_args, &err_text), 2);
    assert_non_null(strstr(err_text, missing_dir));
    free(err_text);
}

/* A --db that replay --db refuses is refused by calibrate the same way, exit 2 naming the file,
 * before any measurement and left byte for byte as it was (no -wal or -shm beside it either):
 * a FIFO, a text file, another program's SQLite file with a table named runs, a results
 * database of a newer schema, a path under a regular file.  Before, each exited 3 (after the
 * measurement on a GPU), and a FIFO or a text file was found only when the row was written. */
static void test_db_refused_before_measuring(void **state)
{
    (void)state;
    char good[1024], err[512];
    tu_tmp("cal-newer.db", good, sizeof good);
    unlink(good);
    assert_int_equal(ar_calibrate_store(good, "GPU X", 1.0, 2.0, 3.0, "earlier", err, sizeof err), 0);
    for (int kind = 0; kind < 5; kind++) {
        static const char *const names[] = {"fifo", "text", "foreign", "newer", "under a file"};
        static const char *const says[] = {"not a regular file", "not a readable SQLite database",
                                           "not an attnreplay results database",
                                           "schema version 99 is newer", "Not a directory"};
        char path[1100], side[1200];
        snprintf(side, sizeof side, "cal-bad-%d.db", kind);
        tu_tmp(side, path, sizeof path);
        unlink(path);
        if (kind == 0) {
            assert_int_equal(mkfifo(path, 0644), 0);
        } else if (kind == 1) {
            assert_int_equal(tu_write(path, "device,copy_gbps\nG,100\n"), 0);
        } else if (kind == 2 || kind == 3) {
            sqlite3 *h = NULL;
            if (kind == 3) snprintf(path, sizeof path, "%s", good);
            assert_int_equal(sqlite3_open(path, &h), SQLITE_OK);
            assert_int_equal(sqlite3_exec(h, kind == 2 ? "CREATE TABLE runs(id INTEGER PRIMARY KEY, name TEXT);"
                                                         "INSERT INTO runs VALUES(1, 'kept');"
                                                       : "UPDATE meta SET value = '99' WHERE key = 'schema_version'",
                                          NULL, NULL, NULL), SQLITE_OK);
            sqlite3_close(h);
        } else {
            char file[1024];
            tu_tmp("cal-plain-file", file, sizeof file);
            assert_int_equal(tu_write(file, "x"), 0);
            snprintf(path, sizeof path, "%s/cal.db", file);
        }
        struct stat before;
        memset(&before, 0, sizeof before);
        char *bytes = kind == 0 || kind == 4 ? NULL : tu_slurp(path);
        if (kind == 1 || kind == 2 || kind == 3) {
            assert_non_null(bytes);
            assert_int_equal(stat(path, &before), 0);
        }
        const char *given[] = { "calibrate", "--db", path, "--device", "G", "--copy-gbps", "100",
                                "--bf16-tflops", "10", NULL };
        const char *measure[] = { "calibrate", "--db", path, NULL };
        for (int mode = 0; mode < 2; mode++) {
            char *err_text = NULL;
            alarm(20);   /* a FIFO opened for reading waits for a writer */
            int rc = run_calibrate(mode ? measure : given, &err_text);
            alarm(0);
            print_message("%s, %s: exit %d: %s", names[kind], mode ? "measured" : "given", rc, err_text);
            assert_int_equal(rc, 2);
            assert_non_null(strstr(err_text, path));
            assert_non_null(strstr(err_text, says[kind]));
            assert_null(strstr(err_text, "no CUDA device"));
            free(err_text);
            if (bytes) {
                struct stat after;
                assert_int_equal(stat(path, &after), 0);
                assert_int_equal(after.st_size, before.st_size);
                char *now = tu_slurp(path);
                assert_non_null(now);
                assert_memory_equal(now, bytes, (size_t)before.st_size);
                free(now);
            }
            snprintf(side, sizeof side, "%s-wal", path);
            assert_false(path_exists(side));
            snprintf(side, sizeof side, "%s-shm", path);
            assert_false(path_exists(side));
        }
        free(bytes);
    }
}

static void test_cublas_probe(void **state)
{
    (void)state;
#ifndef AR_HAVE_CUDA
    skip();
#else
    if (!path_exists("/usr/local/cuda/lib64/libcublas.so.13") || getenv("AR_CUBLAS")) skip();
    char path[512], err[4096];
    int rc = ar_cuda_cublas_probe(path, sizeof path, err, sizeof err);
    if (rc != 0) fprintf(stderr, "probe: %s\n", err);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(path, "libcublas.so.13"));
    assert_true(path_exists(path));
#endif
}

int main(void)
{
    /* Hide every GPU before the first CUDA call in this process. */
    setenv("CUDA_VISIBLE_DEVICES", "-1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_device_leaves_db_untouched),
        cmocka_unit_test(test_given_numbers_stored),
        cmocka_unit_test(test_newest_row_wins),
        cmocka_unit_test(test_usage_errors),
        cmocka_unit_test(test_unwritable_db),
        cmocka_unit_test(test_db_refused_before_measuring),
        cmocka_unit_test(test_locked_or_foreign_db_refused),
        cmocka_unit_test(test_cublas_probe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
