/* test_shard.c - sharded replay and merge (replay/shard.c, replay/merge.c): which shard a
 * process is from --shard or each launcher's variables (and the usage errors of partial or
 * inconsistent ones), the GPU a local rank takes under CUDA_VISIBLE_DEVICES, per-shard file names,
 * the cost-balanced split and the plan's choice of steps or layers; then, through bin/attnreplay,
 * that 1, 2 and 3 shards (by --shard, by simulated Slurm tasks and job arrays, by mpirun -np 2,
 * by layers) merged give exactly the step rows, kernels, mismatches and counters of one
 * unsharded replay (times aside), that a killed shard resumes and the merge then completes,
 * that merge refuses mismatched shards naming the difference, adds nothing the second time and
 * leaves whole shards when killed midway, that report and diff read the merged run, and that
 * plan sweeps and sim --sweep rows spread over shards give what one process gives. */
#include "testutil.h"

#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../replay/shard.h"

/* No launcher variable of the test's own environment reaches a replay unless a test sets it. */
#define CLEAN_ENV                                                                                            \
    "env -u SLURM_PROCID -u SLURM_NTASKS -u SLURM_STEP_NUM_TASKS -u SLURM_LOCALID -u SLURM_ARRAY_TASK_ID "    \
    "-u SLURM_ARRAY_TASK_COUNT -u SLURM_ARRAY_TASK_MIN -u SLURM_ARRAY_TASK_STEP -u OMPI_COMM_WORLD_RANK "     \
    "-u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_LOCAL_RANK -u PMI_RANK -u PMI_SIZE -u RANK -u WORLD_SIZE "     \
    "-u LOCAL_RANK -u CUDA_VISIBLE_DEVICES "
#define REPLAY_OPTS "--backend cpu --threads 2 --quiet"

static const char *sample(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/traces/samples/%s.trace.jsonl.gz", tu_src_dir(), name);
    return buf;
}

static void show(const char *path)
{
    char *t = tu_slurp(path);
    print_message("--- %s:\n%s\n", path, t ? t : "(missing)");
    free(t);
}

static bool file_has(const char *path, const char *needle)
{
    char *t = tu_slurp(path);
    bool yes = t && strstr(t, needle);
    if (!yes) print_message("--- %s (no '%s'):\n%s\n", path, needle, t ? t : "(missing)");
    free(t);
    return yes;
}

/* ---- launchers ------------------------------------------------------------------------------ */

static int detect(const char *shard, char **env, ar_launch *l)
{
    char err[512];
    int rc = ar_launch_detect(shard, env, l, err, sizeof err);
    if (rc != 0) print_message("(usage error: %s)\n", err);
    return rc;
}

/* The usage error's text, or "" when there was none. */
static const char *detect_error(const char *shard, char **env)
{
    static char err[512];
    ar_launch l;
    err[0] = '\0';
    if (ar_launch_detect(shard, env, &l, err, sizeof err) == 0) err[0] = '\0';
    return err;
}

/* Asserts what detection makes of env (and --shard): shard, count, local rank (-2: any) and
 * source; returns the detail text. */
static const char *expect_launch(const char *shard_opt, char **env, int shard, int count, int local,
                                 const char *source)
{
    static ar_launch l;
    assert_int_equal(detect(shard_opt, env, &l), 0);
    if (l.shard != shard || l.count != count || (local != -2 && l.local_rank != local) || strcmp(l.source, source))
        fail_msg("got shard %d/%d, local rank %d, source %s (%s); expected %d/%d, %d, %s", l.shard, l.count,
                 l.local_rank, l.source, l.detail, shard, count, local, source);
    return l.detail;
}

static void test_launcher_detection(void **state)
{
    (void)state;
    char *none[] = {"HOME=/root", "PATH=/bin", NULL};
    expect_launch(NULL, none, 0, 1, -1, "none");
    expect_launch("2/5", none, 2, 5, -1, "--shard");
    char *slurm[] = {"SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_LOCALID=1", NULL};
    assert_non_null(strstr(expect_launch(NULL, slurm, 1, 4, 1, "slurm"), "SLURM_PROCID=1"));
    /* srun inside a larger allocation: the step's task count */
    char *step[] = {"SLURM_PROCID=1", "SLURM_NTASKS=8", "SLURM_STEP_NUM_TASKS=2", NULL};
    expect_launch(NULL, step, 1, 2, -1, "slurm");
    /* a batch script without -n, an salloc shell: one process */
    char *batch[] = {"SLURM_PROCID=0", "SLURM_JOB_ID=7", NULL};
    expect_launch(NULL, batch, 0, 1, -1, "slurm");
    char *salloc[] = {"SLURM_NTASKS=4", "SLURM_JOB_ID=7", NULL};
    expect_launch(NULL, salloc, 0, 1, -1, "none");
    /* job arrays: the index counts from SLURM_ARRAY_TASK_MIN in steps of SLURM_ARRAY_TASK_STEP */
    char *array[] = {"SLURM_ARRAY_TASK_ID=3", "SLURM_ARRAY_TASK_COUNT=4", "SLURM_ARRAY_TASK_MIN=0", NULL};
    expect_launch(NULL, array, 3, 4, -1, "slurm-array");
    char *array_from1[] = {"SLURM_ARRAY_TASK_ID=3", "SLURM_ARRAY_TASK_COUNT=4", "SLURM_ARRAY_TASK_MIN=1", NULL};
    expect_launch(NULL, array_from1, 2, 4, -1, "slurm-array");
    char *array_step[] = {"SLURM_ARRAY_TASK_ID=8", "SLURM_ARRAY_TASK_COUNT=4", "SLURM_ARRAY_TASK_MIN=2",
                          "SLURM_ARRAY_TASK_STEP=3", NULL};
    expect_launch(NULL, array_step, 2, 4, -1, "slurm-array");
    /* an array task running srun tasks: both combine */
    char *array_tasks[] = {"SLURM_ARRAY_TASK_ID=1", "SLURM_ARRAY_TASK_COUNT=2", "SLURM_ARRAY_TASK_MIN=0",
                           "SLURM_PROCID=2", "SLURM_NTASKS=3", "SLURM_LOCALID=0", NULL};
    expect_launch(NULL, array_tasks, 1 * 3 + 2, 6, 0, "slurm-array");
    char *ompi[] = {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=1",
                    "PMIX_RANK=1", NULL};
    expect_launch(NULL, ompi, 1, 2, 1, "openmpi");
    char *pmi[] = {"PMI_RANK=3", "PMI_SIZE=8", "MPI_LOCALRANKID=3", NULL};
    expect_launch(NULL, pmi, 3, 8, 3, "pmi");
    char *torch[] = {"RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1", NULL};
    expect_launch(NULL, torch, 5, 8, 1, "torchrun");
    /* mpirun inside a Slurm batch job: the ranks inherit the job's SLURM_* and Open MPI's win */
    char *nested[] = {"SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=0", "OMPI_COMM_WORLD_RANK=3",
                      "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=1", NULL};
    assert_non_null(strstr(expect_launch(NULL, nested, 3, 4, 1, "openmpi"), "Slurm job"));
    /* srun --mpi=pmi2 sets both, in agreement: Slurm's */
    char *agree[] = {"SLURM_PROCID=2", "SLURM_NTASKS=4", "PMI_RANK=2", "PMI_SIZE=4", NULL};
    expect_launch(NULL, agree, 2, 4, -2, "slurm");
    /* --shard wins, and still takes the local rank from the launcher */
    expect_launch("0/3", ompi, 0, 3, 1, "--shard");
}

static void test_launcher_errors(void **state)
{
    (void)state;
    char *none[] = {NULL};
    static const char *const bad_shard[] = {"5/5", "1", "a/2", "-1/2", "1/0", "1/2/3", "/2", "1/"};
    for (size_t i = 0; i < sizeof bad_shard / sizeof bad_shard[0]; i++)
        assert_non_null(strstr(detect_error(bad_shard[i], none), "--shard takes i/N"));
    char *procid_only[] = {"SLURM_PROCID=2", NULL};
    assert_non_null(strstr(detect_error(NULL, procid_only), "SLURM_NTASKS"));
    char *array_id_only[] = {"SLURM_ARRAY_TASK_ID=2", NULL};
    assert_non_null(strstr(detect_error(NULL, array_id_only), "SLURM_ARRAY_TASK_COUNT"));
    char *array_gap[] = {"SLURM_ARRAY_TASK_ID=5", "SLURM_ARRAY_TASK_COUNT=3", "SLURM_ARRAY_TASK_MIN=1",
                         "SLURM_ARRAY_TASK_STEP=3", NULL};
    assert_non_null(strstr(detect_error(NULL, array_gap), "evenly spaced"));
    char *ompi_half[] = {"OMPI_COMM_WORLD_RANK=1", NULL};
    assert_non_null(strstr(detect_error(NULL, ompi_half), "OMPI_COMM_WORLD_SIZE"));
    char *pmi_half[] = {"PMI_SIZE=4", NULL};
    assert_non_null(strstr(detect_error(NULL, pmi_half), "PMI_RANK"));
    char *torch_half[] = {"RANK=1", "LOCAL_RANK=1", NULL};
    assert_non_null(strstr(detect_error(NULL, torch_half), "WORLD_SIZE"));
    char *outside[] = {"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=2", NULL};
    assert_non_null(strstr(detect_error(NULL, outside), "outside"));
    char *not_number[] = {"SLURM_PROCID=one", "SLURM_NTASKS=2", NULL};
    assert_non_null(strstr(detect_error(NULL, not_number), "not a non-negative integer"));
    char *clash[] = {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "RANK=0", "WORLD_SIZE=2", NULL};
    const char *e = detect_error(NULL, clash);
    assert_non_null(strstr(e, "inconsistent"));
    assert_non_null(strstr(e, "openmpi"));
    assert_non_null(strstr(e, "torchrun"));
    /* with --shard given, a stray variable does not matter */
    ar_launch l;
    assert_int_equal(detect("1/2", ompi_half, &l), 0);
    assert_int_equal(l.shard, 1);
}

static void test_device_choice(void **state)
{
    (void)state;
    char why[256];
    assert_int_equal(ar_launch_device(-1, "3,4", 8, why, sizeof why), 0);
    assert_int_equal(ar_launch_device(1, "2,3", 8, why, sizeof why), 1);
    assert_non_null(strstr(why, "CUDA_VISIBLE_DEVICES=2,3"));
    assert_int_equal(ar_launch_device(3, "2,3", 8, why, sizeof why), 1);   /* 4 local ranks share 2 GPUs */
    assert_non_null(strstr(why, "shared"));
    /* srun --gpus-per-task=1: one GPU visible per task, whatever its local rank */
    assert_int_equal(ar_launch_device(3, "5", 8, why, sizeof why), 0);
    assert_int_equal(ar_launch_device(6, NULL, 4, why, sizeof why), 2);
    assert_int_equal(ar_launch_device(6, NULL, 0, why, sizeof why), 0);
    assert_int_equal(ar_launch_device(2, "", 8, why, sizeof why), 0);
    assert_non_null(strstr(why, "lists no device"));
    assert_int_equal(ar_launch_visible_count("0,1,-1,2"), 2);
    assert_int_equal(ar_launch_visible_count("GPU-8d7a,GPU-11ab,MIG-3f"), 3);
    assert_int_equal(ar_launch_visible_count(NULL), -1);
    assert_int_equal(ar_launch_device(4, "GPU-8d7a,GPU-11ab,MIG-3f", 0, why, sizeof why), 1);
}

static void test_shard_path(void **state)
{
    (void)state;
    char out[64], err[256];
    assert_int_equal(ar_shard_path("runs-%r-of-%n.db", 1, 4, "node7", out, sizeof out, err, sizeof err), 0);
    assert_string_equal(out, "runs-1-of-4.db");
    assert_int_equal(ar_shard_path("/scratch/%h/r%r.db", 12, 16, "node7", out, sizeof out, err, sizeof err), 0);
    assert_string_equal(out, "/scratch/node7/r12.db");
    assert_int_equal(ar_shard_path("100%%-%r.db", 0, 1, NULL, out, sizeof out, err, sizeof err), 0);
    assert_string_equal(out, "100%-0.db");
    assert_int_equal(ar_shard_path("runs.db", 3, 4, NULL, out, sizeof out, err, sizeof err), 0);
    assert_string_equal(out, "runs.db");
    assert_int_equal(ar_shard_path("runs-%x.db", 0, 1, NULL, out, sizeof out, err, sizeof err), -1);
    assert_non_null(strstr(err, "unknown %x"));
    assert_int_equal(ar_shard_path("a-very-long-name-that-does-not-fit-%r-%r-%r.db", 0, 1, NULL, out, 16, err,
                                   sizeof err), -1);
}

/* ---- the split ---------------------------------------------------------------------------- */

static void check_split(const double *costs, size_t n, int count)
{
    size_t bounds[65];
    ar_shard_split(costs, n, count, bounds);
    double total = 0, biggest = 0;
    for (size_t i = 0; i < n; i++) {
        total += costs[i];
        if (costs[i] > biggest) biggest = costs[i];
    }
    assert_int_equal(bounds[0], 0);
    assert_int_equal(bounds[count], n);
    for (int k = 0; k < count; k++) {
        assert_true(bounds[k] <= bounds[k + 1]);
        if (n >= (size_t)count) assert_true(bounds[k] < bounds[k + 1]);   /* no empty part */
        double c = 0;
        for (size_t i = bounds[k]; i < bounds[k + 1]; i++) c += costs[i];
        if (c > total / count + biggest + 1e-9)
            fail_msg("part %d of %d costs %g: more than the ideal %g plus the largest item %g", k, count, c,
                     total / count, biggest);
    }
}

static void test_split_balance(void **state)
{
    (void)state;
    size_t bounds[5];
    const double even[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    ar_shard_split(even, 8, 4, bounds);
    for (int k = 0; k <= 4; k++) assert_int_equal(bounds[k], (size_t)(2 * k));
    /* one heavy step first: it is a shard of its own */
    const double heavy[6] = {10, 1, 1, 1, 1, 1};
    ar_shard_split(heavy, 6, 2, bounds);
    assert_int_equal(bounds[1], 1);
    /* more shards than steps: some parts empty, the rest one step each */
    const double two[2] = {5, 5};
    ar_shard_split(two, 2, 3, bounds);
    assert_int_equal(bounds[1], 1);
    assert_int_equal(bounds[2], 2);
    assert_int_equal(bounds[3], 2);
    check_split(two, 2, 3);
    /* random costs, shard counts 1..64: contiguous, complete, never more than one item over ideal */
    unsigned seed = 12345;
    double costs[500];
    for (int round = 0; round < 200; round++) {
        size_t n = 1 + (size_t)(round * 7 % 500);
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            costs[i] = (seed >> 16) % 7 == 0 ? 0 : (double)((seed >> 8) % 100000);
        }
        check_split(costs, n, 1 + round % 64);
    }
}

static void test_plan_choice(void **state)
{
    (void)state;
    char err[512];
    ar_shard_plan p;
    int64_t steps[6] = {10, 11, 12, 13, 14, 15};
    double costs[6] = {100, 100, 100, 100, 100, 100}, fixed[6] = {1, 1, 1, 1, 1, 1}, none[6] = {0};
    ar_shard_costs even = {steps, costs, none, fixed, 6};
    /* many even steps: step ranges */
    assert_int_equal(ar_shard_plan_make(&even, 4, 0, 3, AR_SHARD_BY_AUTO, &p, err, sizeof err), 0);
    assert_int_equal(p.by, AR_SHARD_BY_STEPS);
    assert_int_equal(p.parts[0].step_first, 10);
    assert_int_equal(p.parts[2].step_last, 15);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(p.parts[k].steps, 2);
        assert_int_equal(p.parts[k].layer_first, 0);
        assert_int_equal(p.parts[k].layer_last, 3);
        assert_true(p.parts[k].cost == 2 * (4 * 100 + 1));
        if (k) assert_int_equal(p.parts[k].step_first, p.parts[k - 1].step_last + 1);
    }
    ar_shard_plan_free(&p);
    /* one step carries nearly all the work: layers, when there are enough */
    double skewed[6] = {5000, 10, 10, 10, 10, 10};
    ar_shard_costs heavy = {steps, skewed, none, fixed, 6};
    assert_int_equal(ar_shard_plan_make(&heavy, 4, 0, 4, AR_SHARD_BY_AUTO, &p, err, sizeof err), 0);
    assert_int_equal(p.by, AR_SHARD_BY_LAYERS);
    for (int k = 0; k < 4; k++) {
        assert_int_equal(p.parts[k].layer_first, k);
        assert_int_equal(p.parts[k].layer_last, k);
        assert_int_equal(p.parts[k].step_first, 10);
        assert_int_equal(p.parts[k].step_last, 15);
    }
    assert_non_null(strstr(p.why, "auto"));
    ar_shard_plan_free(&p);
    /* ... but not with fewer layers than shards */
    assert_int_equal(ar_shard_plan_make(&heavy, 2, 0, 4, AR_SHARD_BY_AUTO, &p, err, sizeof err), 0);
    assert_int_equal(p.by, AR_SHARD_BY_STEPS);
    ar_shard_plan_free(&p);
    assert_int_equal(ar_shard_plan_make(&even, 2, 0, 4, AR_SHARD_BY_LAYERS, &p, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot be split"));
    /* a shard count past AR_SHARD_MAX_COUNT is refused saying so (--shard 0/2147483647 was "out
     * of memory" from its plan's arrays); the bound itself plans */
    assert_int_equal(ar_shard_plan_make(&even, 2, 0, INT32_MAX, AR_SHARD_BY_AUTO, &p, err, sizeof err), -1);
    assert_non_null(strstr(err, "2147483647 shards: more than the 1048576 one plan may have"));
    assert_int_equal(ar_shard_plan_make(&even, 2, 0, AR_SHARD_MAX_COUNT, AR_SHARD_BY_STEPS, &p, err, sizeof err), 0);
    assert_int_equal(p.count, AR_SHARD_MAX_COUNT);
    ar_shard_plan_free(&p);
    /* layers dealt out unevenly still cover each layer once */
    assert_int_equal(ar_shard_plan_make(&even, 7, 0, 3, AR_SHARD_BY_LAYERS, &p, err, sizeof err), 0);
    assert_int_equal(p.parts[0].layer_first, 0);
    for (int k = 1; k < 3; k++) assert_int_equal(p.parts[k].layer_first, p.parts[k - 1].layer_last + 1);
    assert_int_equal(p.parts[2].layer_last, 6);
    ar_shard_plan_free(&p);
    /* verification moves the boundary: the first steps are heavy kernels, the last have the long
     * contexts a sampled verification reads */
    double kernel[6] = {300, 300, 300, 10, 10, 10}, sampled[6] = {10, 10, 10, 1000, 1000, 1000};
    ar_shard_costs mix = {steps, kernel, sampled, fixed, 6};
    assert_int_equal(ar_shard_plan_make(&mix, 1, 0, 2, AR_SHARD_BY_STEPS, &p, err, sizeof err), 0);
    assert_int_equal(p.parts[0].step_last, 11);   /* unverified: the kernels decide */
    ar_shard_plan_free(&p);
    assert_int_equal(ar_shard_plan_make(&mix, 1, 1, 2, AR_SHARD_BY_STEPS, &p, err, sizeof err), 0);
    assert_int_equal(p.parts[0].step_last, 13);   /* verified: the contexts do */
    ar_shard_plan_free(&p);
    /* a layer shard past --verify-layers K pays no verification */
    assert_true(ar_shard_cost(&mix, 0, 6, 0, 0, 1) == ar_shard_cost(&mix, 0, 6, 1, 1, 1) + 3030);
}

/* ---- end to end --------------------------------------------------------------------------- */

#define STEP_COLS                                                                                          \
    "step, time, num_reqs, num_tokens, num_prefill_reqs, num_decode_reqs, max_query_len, max_seq_len,"      \
    " total_context, cascade, prefix_len, bytes, flops, verified, rows_checked, max_abs, max_rel, mean_abs," \
    " nmse, lse_max_abs, nan_count, bad_count, naive_max_abs, naive_mean_abs, tol_max_abs, tol_mean_abs,"   \
    " guard_ok, pass, layers_verified"

/* Rows of what in run ra of a that run rb of b lacks, and the reverse (SQL EXCEPT both ways). */
static int64_t except_both(sqlite3 *h, const char *cols, const char *table, const char *key, int64_t ra, int64_t rb)
{
    char sql[2048];
    int64_t total = 0;
    for (int dir = 0; dir < 2; dir++) {
        snprintf(sql, sizeof sql, "SELECT count(*) FROM (SELECT %s FROM %s.%s WHERE %s = %lld EXCEPT SELECT %s FROM %s.%s"
                 " WHERE %s = %lld)", cols, dir ? "b" : "main", table, key, (long long)(dir ? rb : ra), cols,
                 dir ? "main" : "b", table, key, (long long)(dir ? ra : rb));
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h, sql, -1, &st, NULL) != SQLITE_OK || sqlite3_step(st) != SQLITE_ROW) {
            print_message("%s: %s\n", sql, sqlite3_errmsg(h));
            sqlite3_finalize(st);
            return -1;
        }
        int64_t n = sqlite3_column_int64(st, 0);
        if (n) print_message("%lld %s rows of run %lld not in run %lld\n", (long long)n, table,
                             (long long)(dir ? rb : ra), (long long)(dir ? ra : rb));
        total += n;
        sqlite3_finalize(st);
    }
    return total;
}

/* Rows in which run rb of database b differs from run ra of database a, times aside: every
 * step column, the kernels run (names and layers), the mismatches, the run's counters and
 * status, the kernel-path coverage. */
static int64_t run_differences(const char *a, int64_t ra, const char *b, int64_t rb)
{
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open_v2(a, &h, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL), SQLITE_OK);
    char sql[1200];
    snprintf(sql, sizeof sql, "ATTACH 'file:%s?mode=ro' AS b", b);
    assert_int_equal(sqlite3_exec(h, sql, NULL, NULL, NULL), SQLITE_OK);
    int64_t parts[5] = {except_both(h, STEP_COLS, "steps", "run", ra, rb),
                        except_both(h, "step, layer, name", "kernels", "run", ra, rb),
                        except_both(h, "step, layer, req, token, head, dim, got, want, abs_err", "mismatches", "run",
                                    ra, rb),
                        except_both(h, "steps_done, steps_failed, last_step, verified_steps, verified_layer_steps,"
                                       " verified_rows, status, layers", "runs", "id", ra, rb),
                        except_both(h, "step, path, layers, verified_layers", "coverage", "run", ra, rb)};
    sqlite3_close(h);
    int64_t diff = 0;
    for (int i = 0; i < 5; i++) {
        assert_true(parts[i] >= 0);
        diff += parts[i];
    }
    return diff;
}

/* Asserts run rb of database b is run ra of database a (run_differences finds nothing), each
 * step once. */
static void assert_same_run(const char *a, int64_t ra, const char *b, int64_t rb)
{
    char sql[200];
    int64_t diff = run_differences(a, ra, b, rb);
    if (diff != 0) fail_msg("run %lld of %s and run %lld of %s differ (%lld rows)", (long long)ra, a, (long long)rb, b,
                            (long long)diff);
    /* and nothing is there twice */
    snprintf(sql, sizeof sql, "SELECT count(*) - count(DISTINCT step) FROM steps WHERE run = %lld", (long long)rb);
    assert_int_equal(tu_query_int(b, sql), 0);
}

/* A fresh directory for one test. */
static const char *test_dir(const char *name, char *buf, size_t len)
{
    tu_tmp(name, buf, len);
    assert_int_equal(tu_run(NULL, "rm -rf '%s' && mkdir -p '%s'", buf, buf), 0);
    return buf;
}

/* Replays trace unsharded into DIR/full.db. */
static void replay_full(const char *dir, const char *trace, const char *opts)
{
    char log[600];
    snprintf(log, sizeof log, "%s/full.log", dir);
    int rc = tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/full.db' " REPLAY_OPTS " %s", tu_bin(), trace, dir, opts);
    if (rc != 0 && rc != 1) show(log);
    assert_true(rc == 0 || rc == 1);
}

/* Replays count shards with --shard into DIR/NAME-%r.db and merges them into DIR/NAME.db. */
static void replay_shards(const char *dir, const char *name, const char *trace, int count, const char *opts)
{
    char log[600];
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    for (int i = 0; i < count; i++) {
        int rc = tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/%s-%%r.db' --shard %d/%d " REPLAY_OPTS " %s", tu_bin(),
                        trace, dir, name, i, count, opts);
        if (rc != 0 && rc != 1 && rc != 4) show(log);
        assert_true(rc == 0 || rc == 1 || rc == 4);
    }
    int rc = tu_run(log, "cd '%s' && '%s' merge %s.db %s-[0-9]*.db", dir, tu_bin(), name, name);
    if (rc != 0) show(log);
    assert_int_equal(rc, 0);
}

static void test_shards_equal_unsharded(void **state)
{
    (void)state;
    char dir[512], trace[512], merged[600], full[600];
    static const struct { const char *trace, *opts; } cases[] = {
        {"prefix", "--layers 2 --cascade on"},                     /* cascade steps, shared prefixes */
        {"preempt", "--verify sample:8"},                         /* preemption, sampled rows */
        {"mixed", "--inject causal-off-by-one --layers 2"},       /* failing steps with mismatches */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        test_dir("equal", dir, sizeof dir);
        sample(cases[c].trace, trace, sizeof trace);
        replay_full(dir, trace, cases[c].opts);
        snprintf(full, sizeof full, "%s/full.db", dir);
        for (int count = 1; count <= 3; count++) {
            char name[32];
            snprintf(name, sizeof name, "s%d", count);
            replay_shards(dir, name, trace, count, cases[c].opts);
            snprintf(merged, sizeof merged, "%s/%s.db", dir, name);
            assert_same_run(full, 1, merged, 1);
            char sql[160];
            snprintf(sql, sizeof sql, "SELECT merged_shards = %d AND shard_count = %d FROM runs", count, count);
            assert_int_equal(tu_query_int(merged, sql), 1);
            /* every step names its shard, and a shard's steps are one contiguous range */
            assert_int_equal(tu_query_int(merged, "SELECT count(*) FROM steps WHERE shard IS NULL"), 0);
            assert_int_equal(tu_query_int(merged, "SELECT count(*) FROM steps a JOIN steps b ON b.step = a.step + 1"
                                                  " WHERE b.shard < a.shard"), 0);
            snprintf(sql, sizeof sql, "SELECT count(DISTINCT shard) = %d FROM steps", count);
            assert_int_equal(tu_query_int(merged, sql), 1);
        }
        if (c == 2) assert_true(tu_query_int(full, "SELECT count(*) FROM mismatches") > 0);
        /* every step has its kernel paths, so the comparison above covered them */
        assert_int_equal(tu_query_int(full, "SELECT count(*) FROM steps WHERE step NOT IN (SELECT step FROM coverage)"), 0);
    }
    /* The comparison sees a difference where there is one: a planted wrong-slot write corrupts
     * the cache an unsharded run carries on with, while a shard starts with a clean one. */
    test_dir("differ", dir, sizeof dir);
    sample("mixed", trace, sizeof trace);
    replay_full(dir, trace, "--inject wrong-slot");
    replay_shards(dir, "w", trace, 2, "--inject wrong-slot");
    snprintf(full, sizeof full, "%s/full.db", dir);
    snprintf(merged, sizeof merged, "%s/w.db", dir);
    assert_true(run_differences(full, 1, merged, 1) > 0);
}

/* Slurm tasks and a Slurm job array, set by hand as srun and sbatch would; the GPU each shard
 * would take is recorded even on the CPU backend. */
static void test_slurm_environment(void **state)
{
    (void)state;
    char dir[512], trace[512], log[600], full[600], merged[600];
    test_dir("slurm", dir, sizeof dir);
    sample("chunked", trace, sizeof trace);
    replay_full(dir, trace, "--layers 2");
    snprintf(full, sizeof full, "%s/full.db", dir);
    snprintf(log, sizeof log, "%s/slurm.log", dir);
    for (int count = 1; count <= 3; count++) {
        for (int i = 0; i < count; i++)
            assert_int_equal(tu_run(log, CLEAN_ENV "SLURM_PROCID=%d SLURM_NTASKS=%d SLURM_LOCALID=%d "
                                    "CUDA_VISIBLE_DEVICES=4,5 '%s' replay '%s' --db '%s/t%d-%%r.db' " REPLAY_OPTS
                                    " --layers 2", i, count, i, tu_bin(), trace, dir, count), 0);
        assert_int_equal(tu_run(log, "cd '%s' && '%s' merge t%d.db t%d-[0-9]*.db --quiet", dir, tu_bin(), count, count), 0);
        snprintf(merged, sizeof merged, "%s/t%d.db", dir, count);
        assert_same_run(full, 1, merged, 1);
        /* local rank i of 2 visible devices: device i % 2 */
        char sql[200];
        snprintf(sql, sizeof sql, "SELECT count(*) FROM shards WHERE device_index != shard %% 2 OR launcher NOT LIKE "
                 "'slurm: SLURM_PROCID=%%'");
        assert_int_equal(tu_query_int(merged, sql), 0);
    }
    /* a job array of 3 tasks numbered from 1 */
    for (int id = 1; id <= 3; id++)
        assert_int_equal(tu_run(log, CLEAN_ENV "SLURM_ARRAY_TASK_ID=%d SLURM_ARRAY_TASK_COUNT=3 SLURM_ARRAY_TASK_MIN=1 "
                                "'%s' replay '%s' --db '%s/a-%%r.db' " REPLAY_OPTS " --layers 2", id, tu_bin(), trace,
                                dir), 0);
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge a.db a-0.db a-1.db a-2.db --quiet", dir, tu_bin()), 0);
    snprintf(merged, sizeof merged, "%s/a.db", dir);
    assert_same_run(full, 1, merged, 1);
    assert_int_equal(tu_query_int(merged, "SELECT count(*) FROM shards WHERE launcher LIKE 'slurm-array:%'"), 3);
    /* the first shard prints the plan; each shard says what it replays */
    assert_int_equal(tu_run(log, CLEAN_ENV "SLURM_PROCID=0 SLURM_NTASKS=2 '%s' replay '%s' --db '%s/p-%%r.db' "
                            "--backend cpu --threads 2", tu_bin(), trace, dir), 0);
    assert_true(file_has(log, "shard plan: 2 shards"));
    assert_true(file_has(log, "shard 0/2 on "));
    assert_true(file_has(log, "est. cost"));
}

static void test_layer_split_equal_unsharded(void **state)
{
    (void)state;
    char dir[512], trace[512], full[600], merged[600];
    static const char *const opts[] = {"--layers 2", "--layers 2 --verify-layers 1 --cascade on",
                                       "--layers 2 --inject causal-off-by-one"};
    for (size_t c = 0; c < sizeof opts / sizeof opts[0]; c++) {
        test_dir("layers", dir, sizeof dir);
        sample(c == 1 ? "prefix" : "mixed", trace, sizeof trace);
        replay_full(dir, trace, opts[c]);
        char shard_opts[200];
        snprintf(shard_opts, sizeof shard_opts, "%s --shard-by layers", opts[c]);
        replay_shards(dir, "l", trace, 2, shard_opts);
        snprintf(full, sizeof full, "%s/full.db", dir);
        snprintf(merged, sizeof merged, "%s/l.db", dir);
        assert_same_run(full, 1, merged, 1);
        assert_int_equal(tu_query_int(merged, "SELECT count(*) FROM runs WHERE shard_by = 'layers' AND layers = 2"), 1);
        assert_int_equal(tu_query_int(merged, "SELECT count(*) FROM steps WHERE shard IS NOT NULL"), 0);
        /* each shard replayed one layer of every step */
        assert_int_equal(tu_query_int(merged, "SELECT count(*) FROM shards WHERE layer_first != layer_last"), 0);
        if (c == 2) assert_true(tu_query_int(merged, "SELECT count(*) FROM mismatches") > 0);
        /* each step's kernel paths count the layers of both shards */
        assert_int_equal(tu_query_int(merged, "SELECT count(*) FROM coverage WHERE layers != 2"), 0);
        assert_true(tu_query_int(merged, "SELECT count(*) FROM coverage") > 0);
    }
}

static void test_killed_shard_resumes(void **state)
{
    (void)state;
    char dir[512], trace[512], log[600], full[600], merged[600], status[64];
    test_dir("kill", dir, sizeof dir);
    sample("mixed", trace, sizeof trace);
    replay_full(dir, trace, "");
    snprintf(full, sizeof full, "%s/full.db", dir);
    snprintf(merged, sizeof merged, "%s/k.db", dir);
    snprintf(log, sizeof log, "%s/kill.log", dir);
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/k-%%r.db' --shard 0/2 " REPLAY_OPTS, tu_bin(),
                            trace, dir), 0);
    /* shard 1 is killed (SIGKILL inside a transaction) after its 4th step */
    char shard1[600];
    snprintf(shard1, sizeof shard1, "%s/k-1.db", dir);
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/k-%%r.db' --shard 1/2 --plan-only", tu_bin(),
                            trace, dir), 0);
    char *plan = tu_slurp(log);
    assert_non_null(plan);
    const char *line = strstr(plan, "> 1/2");
    long first = -1, last = -1;
    assert_non_null(line);
    assert_int_equal(sscanf(line, "> 1/2 %ld..%ld", &first, &last), 2);
    free(plan);
    assert_true(first > 0 && last > first + 4);
    int rc = tu_run(log, CLEAN_ENV "ATTNREPLAY_TEST_KILL_AFTER_STEP=%ld '%s' replay '%s' --db '%s/k-%%r.db' --shard 1/2 "
                    REPLAY_OPTS, first + 3, tu_bin(), trace, dir);
    assert_int_equal(rc, 128 + 9);
    tu_query_text(shard1, "SELECT status FROM runs", status, sizeof status);
    assert_string_equal(status, "running");
    /* merged now: incomplete, with the steps shard 1 committed */
    assert_int_equal(tu_run(log, "'%s' merge '%s' '%s/k-0.db' '%s'", tu_bin(), merged, dir, shard1), 0);
    tu_query_text(merged, "SELECT status FROM runs", status, sizeof status);
    assert_string_equal(status, "incomplete");
    assert_true(file_has(log, "incomplete"));
    int64_t partial = tu_query_int(merged, "SELECT steps_done FROM runs");
    assert_true(partial < tu_query_int(full, "SELECT steps_done FROM runs"));
    assert_int_equal(partial, tu_query_int(merged, "SELECT count(*) FROM steps"));
    /* diff refuses it unless told, report lists it as unfinished */
    assert_int_equal(tu_run(log, "'%s' diff '%s' 1 1", tu_bin(), merged), 2);
    assert_true(file_has(log, "incomplete"));
    /* shard 1 resumes and the second merge completes the run */
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/k-%%r.db' --shard 1/2 --resume " REPLAY_OPTS,
                            tu_bin(), trace, dir), 0);
    assert_int_equal(tu_query_int(shard1, "SELECT count(*) FROM runs"), 1);
    /* --resume looks for this shard's run: shard 0's is finished, so it finds nothing */
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/k-1.db' --shard 0/2 --resume " REPLAY_OPTS,
                            tu_bin(), trace, dir), 2);
    assert_true(file_has(log, "as shard 0/2"));
    assert_int_equal(tu_run(log, "'%s' merge '%s' '%s/k-0.db' '%s'", tu_bin(), merged, dir, shard1), 0);
    tu_query_text(merged, "SELECT status FROM runs", status, sizeof status);
    assert_string_equal(status, "passed");
    assert_same_run(full, 1, merged, 1);
}

static void test_merge_refuses_and_is_idempotent(void **state)
{
    (void)state;
    char dir[512], trace[512], other[512], log[600], out[600];
    test_dir("refuse", dir, sizeof dir);
    sample("mixed", trace, sizeof trace);
    sample("chunked", other, sizeof other);
    snprintf(log, sizeof log, "%s/refuse.log", dir);
    replay_shards(dir, "m", trace, 2, "");
    snprintf(out, sizeof out, "%s/m.db", dir);
    int64_t steps = tu_query_int(out, "SELECT count(*) FROM steps"), kernels = tu_query_int(out, "SELECT count(*) FROM kernels");
    assert_true(steps > 0);
    /* the same shards again, in another order, one of them twice: nothing added */
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge m.db m-1.db m-0.db ./m-1.db", dir, tu_bin()), 0);
    assert_int_equal(tu_query_int(out, "SELECT count(*) FROM steps"), steps);
    assert_int_equal(tu_query_int(out, "SELECT count(*) FROM kernels"), kernels);
    assert_int_equal(tu_query_int(out, "SELECT count(*) FROM runs"), 1);
    assert_int_equal(tu_query_int(out, "SELECT count(*) FROM shards"), 2);
    assert_true(file_has(log, "0 steps new"));
    /* a shard of another trace */
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/o-%%r.db' --shard 1/2 " REPLAY_OPTS, tu_bin(),
                            other, dir), 0);
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge x.db m-0.db o-1.db", dir, tu_bin()), 2);
    assert_true(file_has(log, "different traces"));
    assert_int_equal(tu_run(NULL, "test -e '%s/x.db'", dir), 1);   /* a refused merge writes nothing */
    /* other options: named */
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/v-%%r.db' --shard 1/2 --verify sample:4 "
                            REPLAY_OPTS, tu_bin(), trace, dir), 0);
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge y.db m-0.db v-1.db", dir, tu_bin()), 2);
    assert_true(file_has(log, "different options"));
    assert_true(file_has(log, "verify \"all\" vs \"sample\""));
    /* another shard count */
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/c-%%r.db' --shard 2/3 " REPLAY_OPTS, tu_bin(),
                            trace, dir), 0);
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge z.db m-0.db c-2.db", dir, tu_bin()), 2);
    assert_true(file_has(log, "different shard counts: 2 vs 3"));
    /* OUT among the shards, a missing shard, no shard at all */
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge m.db m-0.db m.db", dir, tu_bin()), 2);
    assert_true(file_has(log, "is OUT itself"));
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge m.db m-7.db", dir, tu_bin()), 2);
    assert_true(file_has(log, "m-7.db"));
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge m.db", dir, tu_bin()), 2);
    /* shard 0 replayed again from scratch cannot join the steps merged from the first */
    assert_int_equal(tu_run(log, "rm -f '%s'/m-0.db*", dir), 0);
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/m-%%r.db' --shard 0/2 " REPLAY_OPTS, tu_bin(),
                            trace, dir), 0);
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge m.db m-0.db", dir, tu_bin()), 2);
    assert_true(file_has(log, "replayed again from scratch"));
    assert_int_equal(tu_query_int(out, "SELECT count(*) FROM steps"), steps);
    /* shards whose ranges do not tile were planned differently */
    char copy[600];
    snprintf(copy, sizeof copy, "%s/t-1.db", dir);
    assert_int_equal(tu_run(NULL, "cp '%s/m-1.db' '%s'", dir, copy), 0);
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(copy, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "UPDATE runs SET shard_step_first = shard_step_first + 2", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(h);
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge p.db m-0.db t-1.db", dir, tu_bin()), 2);
    assert_true(file_has(log, "planned differently"));
    /* a merged database is not a shard */
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge mm.db m.db", dir, tu_bin()), 2);
    assert_true(file_has(log, "is itself a merge"));
}

/* A merge test's fresh directory (dir[512]), the mixed sample (trace[512]) and its log (log[600]). */
static void merge_case(const char *name, char *dir, char *trace, char *log)
{
    test_dir(name, dir, 512);
    sample("mixed", trace, 512);
    snprintf(log, 600, "%s/%s.log", dir, name);
}

/* A shard whose pages or schema are damaged is bad input naming the shard (exit 2), found before
 * OUT is touched: a b-tree page overwritten, a column of mismatches renamed in its schema. */
static void test_merge_refuses_damaged_shard(void **state)
{
    (void)state;
    char dir[512], trace[512], log[600], shard[600], out[600];
    merge_case("damaged", dir, trace, log);
    snprintf(out, sizeof out, "%s/o.db", dir);
    for (int i = 0; i < 2; i++)
        assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/d-%%r.db' --shard %d/2 " REPLAY_OPTS, tu_bin(),
                                trace, dir, i), 0);
    snprintf(shard, sizeof shard, "%s/d-1.db", dir);
    int64_t page = tu_query_int(shard, "PRAGMA page_size");
    int64_t root = tu_query_int(shard, "SELECT rootpage FROM sqlite_master WHERE name = 'steps'");
    assert_true(page > 0 && root > 1);
    /* the steps table's root page: its header bytes overwritten */
    assert_int_equal(tu_run(NULL, "cp '%s' '%s/p-1.db' && printf '\\377\\377\\377\\377\\377\\377\\377\\377' | dd "
                            "of='%s/p-1.db' bs=1 seek=%lld conv=notrunc status=none", shard, dir, dir,
                            (long long)((root - 1) * page)), 0);
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge o.db d-0.db p-1.db --quiet", dir, tu_bin()), 2);
    assert_true(file_has(log, "p-1.db: damaged"));
    assert_int_equal(tu_run(NULL, "test -e '%s'", out), 1);   /* refused before OUT was made */
    /* a column the merge copies, renamed in the shard's schema */
    char renamed[600];
    snprintf(renamed, sizeof renamed, "%s/r-1.db", dir);
    assert_int_equal(tu_run(NULL, "cp '%s' '%s'", shard, renamed), 0);
    sqlite3 *h = NULL;
    assert_int_equal(sqlite3_open(renamed, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "PRAGMA writable_schema = ON; UPDATE sqlite_master SET sql = replace(sql, "
                                     "'abs_err', 'abs_erx') WHERE name = 'mismatches'", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(h);
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge o.db d-0.db r-1.db --quiet", dir, tu_bin()), 2);
    assert_true(file_has(log, "r-1.db: not an attnreplay results database: its table mismatches has no column abs_err"));
    assert_int_equal(tu_run(NULL, "test -e '%s'", out), 1);
    /* the whole shards still merge */
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge o.db d-0.db d-1.db --quiet", dir, tu_bin()), 0);
}

/* A shard that cannot be opened for want of disk space (its -shm file, which SQLite makes beside
 * a WAL database, cannot grow) is an I/O error, exit 3, not bad input. */
static void test_merge_shard_io_error(void **state)
{
    (void)state;
    char dir[512], trace[512], log[600];
    merge_case("shardio", dir, trace, log);
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/w-%%r.db' --shard 0/2 " REPLAY_OPTS, tu_bin(),
                            trace, dir), 0);
    assert_int_equal(tu_run(NULL, "rm -f '%s/w-0.db-shm' '%s/w-0.db-wal'", dir, dir), 0);
    /* 8 KiB per file: the 32 KiB -shm cannot be made (SIGXFSZ ignored, so the write fails) */
    assert_int_equal(tu_run(log, "cd '%s' && bash -c \"trap '' XFSZ; ulimit -f 8; exec '%s' merge o.db w-0.db --quiet\"",
                            dir, tu_bin()), 3);
    assert_true(file_has(log, "w-0.db: cannot open the shard database read-only: disk I/O error"));
}

/* A merge killed inside a shard's transaction keeps the shards before it whole, and merging
 * again completes it. */
static void test_merge_killed_midway(void **state)
{
    (void)state;
    char dir[512], trace[512], log[600], out[600], full[600], check[64];
    test_dir("mergekill", dir, sizeof dir);
    sample("prefix", trace, sizeof trace);
    replay_full(dir, trace, "");
    snprintf(full, sizeof full, "%s/full.db", dir);
    for (int i = 0; i < 3; i++)
        assert_int_equal(tu_run(NULL, CLEAN_ENV "'%s' replay '%s' --db '%s/q-%%r.db' --shard %d/3 " REPLAY_OPTS,
                                tu_bin(), trace, dir, i), 0);
    snprintf(out, sizeof out, "%s/q.db", dir);
    snprintf(log, sizeof log, "%s/q.log", dir);
    int rc = tu_run(log, "cd '%s' && ATTNREPLAY_TEST_MERGE_KILL_AT_SHARD=2 '%s' merge q.db q-0.db q-1.db q-2.db", dir,
                    tu_bin());
    assert_int_equal(rc, 128 + 9);
    tu_query_text(out, "PRAGMA integrity_check", check, sizeof check);
    assert_string_equal(check, "ok");
    assert_int_equal(tu_query_int(out, "SELECT count(*) FROM shards"), 2);
    assert_int_equal(tu_query_int(out, "SELECT count(*) FROM steps WHERE shard = 2"), 0);
    assert_int_equal(tu_query_int(out, "SELECT steps_done FROM runs"), tu_query_int(out, "SELECT count(*) FROM steps"));
    assert_int_equal(tu_run(log, "cd '%s' && '%s' merge q.db q-0.db q-1.db q-2.db", dir, tu_bin()), 0);
    assert_same_run(full, 1, out, 1);
}

/* report, diff and plan on a database holding an unsharded run and a merged run of the same
 * replay, with failing steps. */
static void test_reports_read_merged_run(void **state)
{
    (void)state;
    char dir[512], trace[512], log[600], all[600], report[600], summary[700], csv[700];
    test_dir("reports", dir, sizeof dir);
    sample("mixed", trace, sizeof trace);
    replay_full(dir, trace, "--inject causal-off-by-one");
    replay_shards(dir, "f", trace, 3, "--inject causal-off-by-one");
    snprintf(all, sizeof all, "%s/all.db", dir);
    snprintf(log, sizeof log, "%s/r.log", dir);
    /* an unsharded database merges as a run of one shard, beside the sharded one */
    assert_int_equal(tu_run(log, "(cd '%s' && '%s' merge all.db full.db && '%s' merge all.db f-0.db f-1.db f-2.db)",
                            dir, tu_bin(), tu_bin()), 0);
    assert_int_equal(tu_query_int(all, "SELECT count(*) FROM runs WHERE status = 'failed'"), 2);
    assert_same_run(all, 1, all, 2);
    /* diff: same steps, same failures; times may differ (threshold out of the way) */
    assert_int_equal(tu_run(log, "'%s' diff '%s' 1 2 --threshold 100", tu_bin(), all), 0);
    assert_true(file_has(log, "0 newly failing"));
    assert_true(file_has(log, "0 only in run 1, 0 only in run 2"));
    /* report: one row per run, the shards, the failing steps with their shard */
    snprintf(report, sizeof report, "%s/report", dir);
    int rc = tu_run(log, "'%s' report '%s' --out '%s'", tu_bin(), all, report);
    assert_true(rc == 0 || rc == 1);
    snprintf(summary, sizeof summary, "%s/summary.md", report);
    assert_true(file_has(summary, "## Shards of merged runs"));
    assert_true(file_has(summary, "3 of 3 merged (split by steps)"));
    assert_true(file_has(summary, "## Failing steps"));
    int64_t first_fail = tu_query_int(all, "SELECT min(step) FROM steps WHERE run = 2 AND pass = 0");
    int64_t its_shard = tu_query_int(all, "SELECT shard FROM steps WHERE run = 2 AND pass = 0 ORDER BY step LIMIT 1");
    char row[160];
    snprintf(row, sizeof row, "| 2 | %lld | %lld/3 | causal-off-by-one |", (long long)first_fail, (long long)its_shard);
    assert_true(file_has(summary, row));
    /* the merged run's kernel-path coverage is that of all its shards */
    assert_true(file_has(summary, "## Kernel-path coverage"));
    assert_false(file_has(summary, "no kernel paths recorded"));
    snprintf(csv, sizeof csv, "%s/data/run2.csv", report);
    assert_true(file_has(csv, ",prefix_len,shard"));
    /* plan fits its step-time model from the merged run like from any run */
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' plan --workload synthetic:n=20,input=200,output=16,rate=20 --model "
                            "llama-3.1-8b --device h200 --rates 1 --kv-blocks 2000 --db '%s' --run 2 --out '%s/plan'",
                            tu_bin(), all, dir), 0);
    assert_true(file_has(log, "fitting steps"));
}

static void test_usage_errors_through_replay(void **state)
{
    (void)state;
    char dir[512], trace[512], log[600];
    test_dir("usage", dir, sizeof dir);
    sample("mixed", trace, sizeof trace);
    snprintf(log, sizeof log, "%s/u.log", dir);
    assert_int_equal(tu_run(log, CLEAN_ENV "RANK=1 '%s' replay '%s' --db '%s/u.db' " REPLAY_OPTS, tu_bin(), trace, dir), 2);
    assert_true(file_has(log, "WORLD_SIZE"));
    assert_int_equal(tu_run(log, CLEAN_ENV "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 RANK=1 WORLD_SIZE=2 '%s' replay "
                            "'%s' --db '%s/u.db' " REPLAY_OPTS, tu_bin(), trace, dir), 2);
    assert_true(file_has(log, "inconsistent launcher variables"));
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/u.db' --shard 2/2 " REPLAY_OPTS, tu_bin(), trace,
                            dir), 2);
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/u.db' --shard 0/2 --shard-by layers " REPLAY_OPTS,
                            tu_bin(), trace, dir), 2);
    assert_true(file_has(log, "cannot be split over 2 shards"));
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/u-%%q.db' --shard 0/2 " REPLAY_OPTS, tu_bin(), trace,
                            dir), 2);
    assert_true(file_has(log, "unknown %q"));
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/u.db' --shard 0/2 --dump-step 3 --dump-dir '%s/d' "
                            REPLAY_OPTS, tu_bin(), trace, dir, dir), 2);
    assert_true(file_has(log, "--dump-step"));
    assert_int_equal(tu_run(NULL, "test -e '%s/u.db'", dir), 1);   /* usage errors come before the database */
    /* more shards than steps with work: the planned-empty shards end 'empty' with exit 0 */
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' replay '%s' --db '%s/e-%%r.db' --steps 0:1 --shard 3/4 " REPLAY_OPTS,
                            tu_bin(), trace, dir), 0);
    char db[600], status[64];
    snprintf(db, sizeof db, "%s/e-3.db", dir);
    tu_query_text(db, "SELECT status FROM runs", status, sizeof status);
    assert_string_equal(status, "empty");
}

static void test_plan_sweep_shards(void **state)
{
    (void)state;
    char dir[512], log[600], one[700], three[700];
    test_dir("plansweep", dir, sizeof dir);
    snprintf(log, sizeof log, "%s/p.log", dir);
    const char *plan = "plan --workload synthetic:n=40,input=500,output=64,rate=40 --model llama-3.1-8b --device h200 "
                       "--rates 0.5,1,2 --kv-blocks 200,2000";
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' %s --out '%s/one'", tu_bin(), plan, dir), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(tu_run(log, CLEAN_ENV "SLURM_ARRAY_TASK_ID=%d SLURM_ARRAY_TASK_COUNT=3 '%s' %s --out '%s/three'", i,
                                tu_bin(), plan, dir), 0);
    assert_true(file_has(log, "completes the set of 3"));
    snprintf(one, sizeof one, "%s/one/plan.csv", dir);
    snprintf(three, sizeof three, "%s/three/plan.csv", dir);
    char *a = tu_slurp(one), *b = tu_slurp(three);
    assert_non_null(a);
    assert_non_null(b);
    assert_string_equal(a, b);
    free(a);
    free(b);
    /* a run without shards reuses the complete set ... */
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' %s --out '%s/three'", tu_bin(), plan, dir), 0);
    assert_true(file_has(log, "the sweep points of 3 shards"));
    /* ... but not for another sweep */
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' %s --max-num-seqs 16 --out '%s/three'", tu_bin(), plan, dir), 0);
    char *text = tu_slurp(log);
    assert_non_null(text);
    assert_null(strstr(text, "the sweep points of 3 shards"));
    free(text);
}

static void test_sim_sweep_rows(void **state)
{
    (void)state;
    char dir[512], log[600], rows[600];
    test_dir("simsweep", dir, sizeof dir);
    snprintf(log, sizeof log, "%s/s.log", dir);
    snprintf(rows, sizeof rows, "%s/rows.txt", dir);
    assert_int_equal(tu_write(rows, "# one simulation per line\n--max-num-seqs 8\n--max-num-seqs 16 --num-blocks 400\n\n"
                                    "--time-scale 2   # slower arrivals\n"), 0);
    const char *sim = "sim --workload synthetic:n=20,input=200,output=16,rate=20 --model llama-3.1-8b --quiet";
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' %s --sweep '%s' --out '%s/one-%%i.jsonl'", tu_bin(), sim, rows, dir), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(tu_run(log, CLEAN_ENV "OMPI_COMM_WORLD_RANK=%d OMPI_COMM_WORLD_SIZE=2 '%s' %s --sweep '%s' "
                                "--out '%s/two-%%i.jsonl'", i, tu_bin(), sim, rows, dir), 0);
    assert_true(file_has(log, "ran 1 of the 3 rows"));
    for (int r = 0; r < 3; r++)
        assert_int_equal(tu_run(NULL, "cmp -s '%s/one-%d.jsonl' '%s/two-%d.jsonl'", dir, r, dir, r), 0);
    /* the rows differ from each other, so the comparison above means something */
    assert_int_equal(tu_run(NULL, "cmp -s '%s/one-0.jsonl' '%s/one-1.jsonl'", dir, dir), 1);
    /* several rows need a %i */
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' %s --sweep '%s' --out '%s/same.jsonl'", tu_bin(), sim, rows, dir), 2);
    assert_true(file_has(log, "%i"));
    /* a line longer than any buffer is one row, its options all applied (it once became two) */
    char *long_row = malloc(12000);
    assert_non_null(long_row);
    int at = snprintf(long_row, 12000, "--max-num-seqs 8");
    memset(long_row + at, ' ', 9000);
    snprintf(long_row + at + 9000, 12000 - (size_t)at - 9000, "--num-blocks 400\n");
    assert_int_equal(tu_write(rows, long_row), 0);
    free(long_row);
    assert_int_equal(tu_run(log, CLEAN_ENV "'%s' %s --sweep '%s' --out '%s/long.jsonl'", tu_bin(), sim, rows, dir), 0);
    char trace[700];
    snprintf(trace, sizeof trace, "%s/long.jsonl", dir);
    assert_true(file_has(trace, "\"num_blocks\":400"));
    assert_true(file_has(trace, "\"max_num_seqs\":8,"));
}

static void test_mpirun(void **state)
{
    (void)state;
    char dir[512], trace[512], log[600], full[600], merged[600];
    test_dir("mpirun", dir, sizeof dir);
    sample("prefix", trace, sizeof trace);
    replay_full(dir, trace, "--layers 2");
    snprintf(log, sizeof log, "%s/mpi.log", dir);
    int rc = tu_run(log, CLEAN_ENV "CUDA_VISIBLE_DEVICES=0,1 '%s/tests/shard_mpirun.sh' '%s' '%s' '%s' 2 " REPLAY_OPTS
                    " --layers 2", tu_src_dir(), tu_bin(), trace, dir);
    if (rc == 77) {
        char *why = tu_slurp(log);
        print_message("skipped: %s\n", why ? why : "mpirun missing");
        free(why);
        skip();
    }
    if (rc != 0) show(log);
    assert_int_equal(rc, 0);
    snprintf(full, sizeof full, "%s/full.db", dir);
    snprintf(merged, sizeof merged, "%s/mpi-merged.db", dir);
    assert_same_run(full, 1, merged, 1);
    /* each rank took the GPU of its local rank */
    assert_int_equal(tu_query_int(merged, "SELECT count(*) FROM shards WHERE device_index = shard AND launcher LIKE "
                                          "'openmpi: OMPI_COMM_WORLD_RANK=%'"), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launcher_detection),
        cmocka_unit_test(test_launcher_errors),
        cmocka_unit_test(test_device_choice),
        cmocka_unit_test(test_shard_path),
        cmocka_unit_test(test_split_balance),
        cmocka_unit_test(test_plan_choice),
        cmocka_unit_test(test_shards_equal_unsharded),
        cmocka_unit_test(test_slurm_environment),
        cmocka_unit_test(test_layer_split_equal_unsharded),
        cmocka_unit_test(test_killed_shard_resumes),
        cmocka_unit_test(test_merge_refuses_and_is_idempotent),
        cmocka_unit_test(test_merge_refuses_damaged_shard),
        cmocka_unit_test(test_merge_shard_io_error),
        cmocka_unit_test(test_merge_killed_midway),
        cmocka_unit_test(test_reports_read_merged_run),
        cmocka_unit_test(test_usage_errors_through_replay),
        cmocka_unit_test(test_plan_sweep_shards),
        cmocka_unit_test(test_sim_sweep_rows),
        cmocka_unit_test(test_mpirun),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
