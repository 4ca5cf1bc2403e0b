/* calibrate.c - `attnreplay calibrate`: measures the device ceilings (copy bandwidth and bf16
 * matrix rate, method in kernels/common/cuda_calibrate.cu) on a GPU and appends them to the results
 * database's `ceilings` table (replay/db.h), which report and plan read (reports/rundata.c: the
 * newest row of the run's device wins).  Numbers taken elsewhere can be stored instead with
 * --copy-gbps and --bf16-tflops; their method is "given".
 *
 * The database is opened only after a measurement succeeded, so a machine without a GPU leaves
 * it untouched; whether it can be written, and whether it is a file replay --db would take, is
 * checked first (ar_db_check_writable, ar_db_check_ours), so a bad path costs no GPU time. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "../kernels/common/cuda_calibrate.h"
#include "../replay/db.h"
#include "reports.h"

static void calibrate_usage(FILE *f)
{
    fprintf(f,
        "usage: attnreplay calibrate --db DB [--no-cublas] [--gemm-n N] [--copy-mib N]\n"
        "       attnreplay calibrate --db DB --device NAME --copy-gbps X --bf16-tflops Y\n"
        "Measures device 0's copy bandwidth (cudaMemcpyAsync device to device of 4 GiB, bytes\n"
        "read + written, median of 20) and bf16 matrix rate (cuBLAS 8192^3 GEMM with fp32\n"
        "accumulation, median of 10; without cuBLAS a built-in kernel gives a lower bound) and\n"
        "appends them to the table `ceilings` of DB, which report and plan use.\n"
        "  --db DB            results database (created if missing)\n"
        "  --no-cublas        time the built-in mma.sync GEMM even when cuBLAS is there\n"
        "  --gemm-n N         GEMM size M = N = K (multiple of 128; default 8192)\n"
        "  --copy-mib N       copy buffer in MiB (at least 8x the L2; default 4096, halved to fit)\n"
        "  --copy-gbps X --bf16-tflops Y --device NAME\n"
        "                     store these numbers for device NAME (method 'given'); no GPU used\n"
        "$AR_CUBLAS names the cuBLAS library (file or folder) to load instead of searching.\n"
        "Exit status: 0 stored; 2 usage or bad input: a DB that cannot be written or is not an\n"
        "attnreplay results database (a directory, FIFO, not SQLite, another program's tables,\n"
        "a newer schema), refused before any measurement and left as it is, or one locked by\n"
        "another writer past ATTNREPLAY_BUSY_TIMEOUT_MS (default 30000); 3 no CUDA device, CUDA\n"
        "error, or I/O or a full disk while writing the database, or the numbers could not be\n"
        "written to stdout (they are stored in DB).\n");
}

static int parse_positive_double(const char *text, double *out)
{
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(value) || value <= 0) return -1;
    *out = value;
    return 0;
}

static int parse_positive_int(const char *text, long max, long *out)
{
    char *end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value <= 0 || value > max) return -1;
    *out = value;
    return 0;
}

static double unix_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ar_calibrate_store(const char *db_path, const char *device, double measured, double copy_gbps,
                       double bf16_tflops, const char *method, char *err, size_t err_len)
{
    bool bad_db = false;
    ar_db *db = ar_db_open(db_path, false, &bad_db, err, err_len);
    if (!db) return bad_db ? 2 : 3;
    sqlite3 *handle = ar_db_handle(db);
    sqlite3_stmt *insert = NULL;
    int rc = 3;
    if (sqlite3_prepare_v2(handle,
            "INSERT INTO ceilings(device, measured, copy_gbps, bf16_tflops, method) "
            "VALUES(?, ?, ?, ?, ?)", -1, &insert, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: cannot prepare the ceilings insert: %s", db_path,
                 sqlite3_errmsg(handle));
        goto done;
    }
    sqlite3_bind_text(insert, 1, device, -1, SQLITE_STATIC);
    sqlite3_bind_double(insert, 2, measured);
    sqlite3_bind_double(insert, 3, copy_gbps);
    sqlite3_bind_double(insert, 4, bf16_tflops);
    sqlite3_bind_text(insert, 5, method, -1, SQLITE_STATIC);
    if (sqlite3_step(insert) != SQLITE_DONE) {
        if (ar_db_lock_error(handle, db_path, "writing the ceilings row failed", err, err_len))
            rc = 2;
        else
            snprintf(err, err_len, "%s: writing the ceilings row failed: %s", db_path,
                     sqlite3_errmsg(handle));
        goto done;
    }
    rc = 0;
done:
    sqlite3_finalize(insert);
    ar_db_close(db);
    return rc;
}

static void print_measured(const ar_calibration *cal)
{
    printf("device            %s\n", cal->device);
    printf("copy bandwidth    %8.1f GB/s      %zu MiB device to device, median %.3f ms "
           "(min %.3f, max %.3f)\n", cal->copy_gbps, cal->copy_bytes >> 20, cal->copy_median_ms,
           cal->copy_min_ms, cal->copy_max_ms);
    printf("bf16 matrix rate  %8.1f TFLOP/s   %d^3 on %s, median %.3f ms (min %.3f, max %.3f); "
           "check at %.2f of tolerance%s\n", cal->bf16_tflops, cal->gemm_n, cal->gemm_engine,
           cal->gemm_median_ms, cal->gemm_min_ms, cal->gemm_max_ms, cal->gemm_check_worst,
           cal->used_cublas ? "" : " - A LOWER BOUND (no cuBLAS)");
    printf("method            %s\n", cal->method);
}

int ar_calibrate_main(int argc, char **argv)
{
    const char *db_path = NULL, *device = NULL;
    double given_copy = 0, given_tflops = 0;
    int have_copy = 0, have_tflops = 0;
    long copy_mib = 0, gemm_n = 0;
    ar_calibrate_options opt;
    memset(&opt, 0, sizeof opt);

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            calibrate_usage(stdout);
            return 0;
        } else if (strcmp(arg, "--no-cublas") == 0) {
            opt.no_cublas = 1;
            continue;
        }
        if (strcmp(arg, "--db") != 0 && strcmp(arg, "--device") != 0 &&
            strcmp(arg, "--copy-gbps") != 0 && strcmp(arg, "--bf16-tflops") != 0 &&
            strcmp(arg, "--gemm-n") != 0 && strcmp(arg, "--copy-mib") != 0) {
            fprintf(stderr, "attnreplay calibrate: unknown argument '%s'\n", arg);
            calibrate_usage(stderr);
            return 2;
        }
        if (!value) {
            fprintf(stderr, "attnreplay calibrate: %s needs a value\n", arg);
            return 2;
        }
        i++;
        if (strcmp(arg, "--db") == 0) {
            db_path = value;
        } else if (strcmp(arg, "--device") == 0) {
            if (!value[0]) {
                fprintf(stderr, "attnreplay calibrate: --device needs a non-empty name\n");
                return 2;
            }
            device = value;
        } else if (strcmp(arg, "--copy-gbps") == 0) {
            if (parse_positive_double(value, &given_copy) != 0) {
                fprintf(stderr, "attnreplay calibrate: --copy-gbps '%s' is not a positive "
                        "number\n", value);
                return 2;
            }
            have_copy = 1;
        } else if (strcmp(arg, "--bf16-tflops") == 0) {
            if (parse_positive_double(value, &given_tflops) != 0) {
                fprintf(stderr, "attnreplay calibrate: --bf16-tflops '%s' is not a positive "
                        "number\n", value);
                return 2;
            }
            have_tflops = 1;
        } else if (strcmp(arg, "--gemm-n") == 0) {
            if (parse_positive_int(value, 65536, &gemm_n) != 0 || gemm_n % 128 != 0) {
                fprintf(stderr, "attnreplay calibrate: --gemm-n '%s' is not a positive multiple "
                        "of 128 up to 65536\n", value);
                return 2;
            }
        } else {
            if (parse_positive_int(value, 1L << 20, &copy_mib) != 0) {
                fprintf(stderr, "attnreplay calibrate: --copy-mib '%s' is not a positive "
                        "number of MiB\n", value);
                return 2;
            }
        }
    }
    if (!db_path || !db_path[0]) {
        fprintf(stderr, "attnreplay calibrate: --db DB is required\n");
        calibrate_usage(stderr);
        return 2;
    }
    int given = have_copy || have_tflops;
    if (given && !(have_copy && have_tflops && device)) {
        fprintf(stderr, "attnreplay calibrate: given numbers need all of --copy-gbps, "
                "--bf16-tflops and --device\n");
        return 2;
    }
    if (!given && device) {
        fprintf(stderr, "attnreplay calibrate: --device names the device of given numbers only "
                "(a measurement stores the name the GPU reports)\n");
        return 2;
    }
    if (given && (opt.no_cublas || gemm_n || copy_mib)) {
        fprintf(stderr, "attnreplay calibrate: --no-cublas, --gemm-n and --copy-mib apply to a "
                "measurement, not to given numbers\n");
        return 2;
    }

    /* what replay --db refuses is refused here too, before a measurement */
    char err[3072];
    if (ar_db_check_writable(db_path, err, sizeof err) != 0) {
        fprintf(stderr, "attnreplay calibrate: --db %s\n", err);
        return 2;
    }
    bool not_ours = false;
    if (ar_db_check_ours(db_path, &not_ours, err, sizeof err) != 0) {
        fprintf(stderr, "attnreplay calibrate: %s\n", err);
        return not_ours ? 2 : 3;
    }

    if (given) {
        int stored = ar_calibrate_store(db_path, device, unix_now(), given_copy, given_tflops, "given", err,
                                        sizeof err);
        if (stored != 0) {
            fprintf(stderr, "attnreplay calibrate: %s\n", err);
            return stored;
        }
        printf("device            %s\n", device);
        printf("copy bandwidth    %8.1f GB/s      given\n", given_copy);
        printf("bf16 matrix rate  %8.1f TFLOP/s   given\n", given_tflops);
        printf("stored in %s (table ceilings, method 'given')\n", db_path);
        return 0;
    }

    opt.gemm_n = (int)gemm_n;
    opt.copy_bytes = (size_t)copy_mib << 20;
    ar_calibration cal;
    int rc = ar_cuda_calibrate(&opt, &cal, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "attnreplay calibrate: %s\n", err);
        return rc == 2 ? 2 : 3;
    }
    print_measured(&cal);
    int stored = ar_calibrate_store(db_path, cal.device, unix_now(), cal.copy_gbps, cal.bf16_tflops,
                                    cal.method, err, sizeof err);
    if (stored != 0) {   /* 2: the file changed under the measurement (or is locked); 3: I/O */
        fprintf(stderr, "attnreplay calibrate: %s\n", err);
        return stored;
    }
    printf("stored in %s (table ceilings)\n", db_path);
    return 0;
}
