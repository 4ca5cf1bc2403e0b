/* diff.c - `attnreplay diff DB RUN_A RUN_B [--threshold 5%] [--error-growth 2]`: compares
 * two runs of the same trace step by step and exits 1 on a regression, so it can gate CI.
 *
 * Rules (RUN_A is the baseline, RUN_B the candidate; ratios are B / A):
 *  - time: per-step ratio of time_us over steps both runs timed; the run regresses when the
 *    median ratio or the total-time ratio exceeds 1 + threshold.  Steps slower than
 *    1 + threshold are listed (worst first) but one noisy step alone does not fail the gate.
 *  - verification: a step that passed in A and fails in B is a regression; the reverse and
 *    changes in coverage (verified in one run only) are reported.
 *  - error growth: over steps verified in both, the worst max_abs of B above error_growth
 *    times A's (floor 1e-9), or the worst NMSE above error_growth^2 times A's (floor 1e-18),
 *    is a regression.  Per-step growth beyond the same factor is counted and listed.
 *  - a run that did not finish (status running, interrupted or error, or a merged run still
 *    'incomplete') is refused, naming its status and the reason it stopped, unless
 *    --allow-unfinished; then it is compared on the steps it has, with a warning.
 *  - a run merged from shards (attnreplay merge) is one run; listed steps name the candidate's
 *    shard when it has shards.
 *  - RUN_A and RUN_B must be two runs: one run compared with itself always "passes" the gate. */
#include "reports.h"
#include "rundata.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>

#define DIFF_MAX_ABS_FLOOR 1e-9
#define DIFF_NMSE_FLOOR 1e-18
#define DIFF_LIST_LIMIT 10

/* True when text is a decimal number as people write one (digits, '.', an exponent, a sign,
 * a trailing '%'): strtod alone also takes " 5", "0x10", "0x1p-4" and "infinity". */
static int decimal_text(const char *text)
{
    return *text && (isdigit((unsigned char)*text) || *text == '.') &&
           text[strspn(text, "0123456789.eE+-%")] == '\0';
}

int ar_parse_threshold(const char *text, double *out)
{
    if (!text || !decimal_text(text)) return -1;
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text) return -1;
    if (*end == '%') { v /= 100.0; end++; }
    if (*end || !isfinite(v) || v < 0 || v > 100) return -1;
    *out = v;
    return 0;
}

static int finite_positive(double v)
{
    return isfinite(v) && v > 0;
}

/* One step in both runs, kept for the listings. */
typedef struct {
    int64_t step;
    const ar_step_row *b_row;   /* the candidate's row (its shard) */
    double ratio;
    double time_a, time_b;
    double err_a, err_b;
    int pass_a, pass_b;
} step_pair;

static int compare_ratio_desc(const void *x, const void *y)
{
    double a = ((const step_pair *)x)->ratio, b = ((const step_pair *)y)->ratio;
    return (a < b) - (a > b);
}

/* "run 5 did not finish (status 'error': why; 64 steps stored)" into buf. */
static void unfinished_text(const ar_run_data *r, char *buf, size_t len)
{
    snprintf(buf, len, "run %lld did not finish (status '%s'%s%.300s; %zu steps stored)", (long long)r->id, r->status,
             r->error[0] ? ": " : "", r->error, r->num_steps);
}

/* Compares b against a; when report is not NULL also prints the details there. */
static int diff_compute(const ar_run_data *a, const ar_run_data *b, const ar_diff_options *opt,
                        ar_diff_result *out, FILE *report, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    out->ratio_median = out->ratio_p90 = out->total_ratio = NAN;
    size_t cap = a->num_steps < b->num_steps ? a->num_steps : b->num_steps;
    step_pair *pairs = calloc(cap ? cap : 1, sizeof *pairs);
    double *ratios = calloc(cap ? cap : 1, sizeof *ratios);
    if (!pairs || !ratios) {
        free(pairs);
        free(ratios);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    double sum_a = 0, sum_b = 0;
    size_t num_pairs = 0, ia = 0, ib = 0;
    while (ia < a->num_steps || ib < b->num_steps) {
        if (ib >= b->num_steps || (ia < a->num_steps && a->steps[ia].step < b->steps[ib].step)) {
            out->only_in_a++;
            ia++;
            continue;
        }
        if (ia >= a->num_steps || b->steps[ib].step < a->steps[ia].step) {
            out->only_in_b++;
            ib++;
            continue;
        }
        const ar_step_row *sa = &a->steps[ia++], *sb = &b->steps[ib++];
        out->common_steps++;
        step_pair *p = &pairs[num_pairs++];
        p->step = sa->step;
        p->b_row = sb;
        p->time_a = sa->time_us;
        p->time_b = sb->time_us;
        p->err_a = sa->max_abs;
        p->err_b = sb->max_abs;
        p->pass_a = sa->pass;
        p->pass_b = sb->pass;
        p->ratio = NAN;
        if (finite_positive(sa->time_us) && finite_positive(sb->time_us)) {
            p->ratio = sb->time_us / sa->time_us;
            ratios[out->timed_steps++] = p->ratio;
            sum_a += sa->time_us;
            sum_b += sb->time_us;
            if (p->ratio > 1.0 + opt->threshold) out->slower_steps++;
        }
        if (sa->pass == 1 && sb->pass == 0) out->newly_failing++;
        else if (sa->pass == 0 && sb->pass == 1) out->newly_passing++;
        else if ((sa->pass == -1) != (sb->pass == -1)) out->coverage_changed++;
        if (sa->pass != -1 && sb->pass != -1) {
            if (isfinite(sa->max_abs) && sa->max_abs > out->max_abs_a) out->max_abs_a = sa->max_abs;
            if (!isfinite(sb->max_abs) || sb->max_abs > out->max_abs_b)
                out->max_abs_b = isfinite(sb->max_abs) ? sb->max_abs : INFINITY;
            if (isfinite(sa->nmse) && sa->nmse > out->nmse_a) out->nmse_a = sa->nmse;
            if (!isfinite(sb->nmse) || sb->nmse > out->nmse_b)
                out->nmse_b = isfinite(sb->nmse) ? sb->nmse : INFINITY;
            double base = isfinite(sa->max_abs) && sa->max_abs > DIFF_MAX_ABS_FLOOR
                              ? sa->max_abs : DIFF_MAX_ABS_FLOOR;
            if (!isfinite(sb->max_abs) || sb->max_abs > opt->error_growth * base)
                out->error_grown_steps++;
        }
    }
    if (out->timed_steps) {
        out->ratio_median = ar_rd_quantile(ratios, out->timed_steps, 0.5);
        out->ratio_p90 = ar_rd_quantile(ratios, out->timed_steps, 0.9);
        out->total_ratio = sum_b / sum_a;
    }
    out->time_regression = out->timed_steps &&
        (out->ratio_median > 1.0 + opt->threshold || out->total_ratio > 1.0 + opt->threshold);
    double abs_base = out->max_abs_a > DIFF_MAX_ABS_FLOOR ? out->max_abs_a : DIFF_MAX_ABS_FLOOR;
    double nmse_base = out->nmse_a > DIFF_NMSE_FLOOR ? out->nmse_a : DIFF_NMSE_FLOOR;
    out->accuracy_regression = out->newly_failing > 0 ||
        out->max_abs_b > opt->error_growth * abs_base ||
        out->nmse_b > opt->error_growth * opt->error_growth * nmse_base;

    if (report) {
        fprintf(report, "diff: run %lld (baseline: %s %s, kv %s, on %s) -> run %lld (candidate: %s %s, "
                "kv %s, on %s)\n",
                (long long)a->id, a->backend, a->dtype, a->kv_dtype, a->device,
                (long long)b->id, b->backend, b->dtype, b->kv_dtype, b->device);
        fprintf(report, "trace: %s\n", b->trace);
        fprintf(report, "steps: %zu in both, %zu only in run %lld, %zu only in run %lld\n",
                out->common_steps, out->only_in_a, (long long)a->id, out->only_in_b,
                (long long)b->id);
        for (int k = 0; k < 2; k++) {
            const ar_run_data *r = k ? b : a;
            if (!ar_rd_unfinished(r)) continue;
            char what[512];
            unfinished_text(r, what, sizeof what);
            fprintf(report, "warning: %s; compared anyway (--allow-unfinished)\n", what);
        }
        if (out->only_in_a)
            fprintf(report, "warning: run %lld (status '%s') lacks %zu of the baseline's steps; "
                    "they are not compared\n", (long long)b->id, b->status, out->only_in_a);
        if (strcmp(a->dtype, b->dtype) || strcmp(a->kv_dtype, b->kv_dtype))
            fprintf(report, "warning: the runs use different dtypes; error growth compares "
                    "unlike things\n");
        fprintf(report, "\ntime (candidate / baseline, %zu timed steps, threshold %.3g%%):\n",
                out->timed_steps, opt->threshold * 100.0);
        fprintf(report, "  median ratio %.4f, p90 ratio %.4f, total-time ratio %.4f\n",
                out->ratio_median, out->ratio_p90, out->total_ratio);
        fprintf(report, "  steps slower than %.4gx: %zu\n", 1.0 + opt->threshold, out->slower_steps);
        if (out->slower_steps) {
            step_pair *sorted = malloc(num_pairs * sizeof *sorted);
            if (sorted) {
                size_t n = 0;
                for (size_t i = 0; i < num_pairs; i++)
                    if (isfinite(pairs[i].ratio)) sorted[n++] = pairs[i];
                qsort(sorted, n, sizeof *sorted, compare_ratio_desc);
                fprintf(report, "  %-22s %12s %12s %8s\n", "step", "A time_us", "B time_us", "ratio");
                for (size_t i = 0; i < n && i < DIFF_LIST_LIMIT &&
                                   sorted[i].ratio > 1.0 + opt->threshold; i++) {
                    char name[64];
                    ar_rd_step_name(b, sorted[i].b_row, name, sizeof name);
                    fprintf(report, "  %-22s %12.2f %12.2f %8.3f\n", name + 5 /* without "step " */,
                            sorted[i].time_a, sorted[i].time_b, sorted[i].ratio);
                }
                free(sorted);
            }
        }
        fprintf(report, "\nverification: %zu newly failing, %zu newly passing, %zu with changed "
                "coverage\n", out->newly_failing, out->newly_passing, out->coverage_changed);
        size_t listed = 0;
        for (size_t i = 0; i < num_pairs && listed < DIFF_LIST_LIMIT; i++) {
            if (pairs[i].pass_a == 1 && pairs[i].pass_b == 0) {
                char name[64];
                ar_rd_step_name(b, pairs[i].b_row, name, sizeof name);
                fprintf(report, "  %s: passed -> FAILED (max_abs %.3g -> %.3g)\n", name, pairs[i].err_a,
                        pairs[i].err_b);
                listed++;
            }
        }
        fprintf(report, "\nerrors over steps verified in both: worst max_abs %.3g -> %.3g, "
                "worst NMSE %.3g -> %.3g (growth limit %.3gx); %zu steps grew beyond it\n",
                out->max_abs_a, out->max_abs_b, out->nmse_a, out->nmse_b, opt->error_growth,
                out->error_grown_steps);
        fprintf(report, "\nresult: %s%s%s\n",
                out->time_regression || out->accuracy_regression ? "REGRESSION" : "no regression",
                out->time_regression ? " (time)" : "",
                out->accuracy_regression ? " (accuracy)" : "");
    }
    free(pairs);
    free(ratios);
    return 0;
}

/* Loads both runs and checks they replay the same trace and, unless allowed, that both ran to
 * their end. */
static int load_pair(void *db, int64_t run_a, int64_t run_b, const ar_diff_options *opt, ar_run_data *a,
                     ar_run_data *b, char *err, size_t err_len)
{
    if (ar_rd_load_run(db, run_a, a, err, err_len) != 0) return -1;
    if (ar_rd_load_run(db, run_b, b, err, err_len) != 0) {
        ar_rd_free_run(a);
        return -1;
    }
    const ar_run_data *unfinished = ar_rd_unfinished(a) ? a : ar_rd_unfinished(b) ? b : NULL;
    if (unfinished && !opt->allow_unfinished) {
        char what[512];
        unfinished_text(unfinished, what, sizeof what);
        snprintf(err, err_len, "%s; its missing steps would not be compared. Replay it to the end "
                 "(--resume) or pass --allow-unfinished to compare the steps it has", what);
        ar_rd_free_run(a);
        ar_rd_free_run(b);
        return -1;
    }
    if (run_a == run_b) {   /* after the checks of the run itself, which say more */
        snprintf(err, err_len, "RUN_A and RUN_B are both run %lld; diff compares a baseline with another "
                 "run", (long long)run_a);
        ar_rd_free_run(a);
        ar_rd_free_run(b);
        return -1;
    }
    int same = a->trace_hash[0] && b->trace_hash[0] ? strcmp(a->trace_hash, b->trace_hash) == 0
                                                     : strcmp(a->trace, b->trace) == 0;
    if (!same) {
        snprintf(err, err_len, "runs %lld and %lld replay different traces (%s [%s] vs %s [%s]); "
                 "diff compares runs of the same trace", (long long)run_a, (long long)run_b,
                 a->trace, a->trace_hash, b->trace, b->trace_hash);
        ar_rd_free_run(a);
        ar_rd_free_run(b);
        return -1;
    }
    return 0;
}

int ar_diff_runs(const char *db_path, int64_t run_a, int64_t run_b, const ar_diff_options *opt,
                 ar_diff_result *out, char *err, size_t err_len)
{
    void *db = ar_rd_open(db_path, err, err_len);
    if (!db) return -1;
    ar_run_data a, b;
    int rc = load_pair(db, run_a, run_b, opt, &a, &b, err, err_len);
    ar_rd_close(db);
    if (rc != 0) return -1;
    rc = diff_compute(&a, &b, opt, out, NULL, err, err_len);
    ar_rd_free_run(&a);
    ar_rd_free_run(&b);
    return rc;
}

static void diff_usage(FILE *f)
{
    fputs("usage: attnreplay diff DB RUN_A RUN_B [--threshold 5%] [--error-growth 2] [--allow-unfinished]\n"
          "  Compares run RUN_B (candidate) with RUN_A (baseline) of the same trace step by step.\n"
          "  --threshold T       relative slowdown that counts (\"5%\" or \"0.05\"; default 5%)\n"
          "  --error-growth F    growth factor of the worst max_abs that counts (default 2)\n"
          "  --allow-unfinished  compare a run that did not finish (status running, interrupted,\n"
          "                      error, or a merge still incomplete) on the steps it has; without it\n"
          "                      such a run is refused\n"
          "  Exit status: 0 no regression, 1 regression, 2 usage error or bad input (an unfinished\n"
          "  run without --allow-unfinished, the same run twice; DB unreadable, not ours, or locked by\n"
          "  another writer past ATTNREPLAY_BUSY_TIMEOUT_MS, default 30000), 3 the comparison could\n"
          "  not be written to stdout.\n", f);
}

int ar_diff_main(int argc, char **argv)
{
    ar_diff_options opt = { .threshold = 0.05, .error_growth = 2.0 };
    const char *positional[3] = { NULL, NULL, NULL };
    int num_positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            diff_usage(stdout);
            return 0;
        } else if (!strcmp(arg, "--allow-unfinished")) {
            opt.allow_unfinished = 1;
        } else if (!strcmp(arg, "--threshold") || !strcmp(arg, "--error-growth")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "diff: %s needs a value\n", arg);
                diff_usage(stderr);
                return 2;
            }
            const char *value = argv[++i];
            if (!strcmp(arg, "--threshold")) {
                if (ar_parse_threshold(value, &opt.threshold) != 0) {
                    fprintf(stderr, "diff: --threshold '%s': expected a percentage like 5%% or a "
                            "fraction like 0.05, from 0 to 10000%% (100)\n", value);
                    return 2;
                }
            } else {
                char *end = NULL;
                opt.error_growth = strtod(value, &end);
                if (!decimal_text(value) || end == value || *end || !(opt.error_growth >= 1.0) ||
                    !isfinite(opt.error_growth)) {
                    fprintf(stderr, "diff: --error-growth '%s': expected a factor >= 1\n", value);
                    return 2;
                }
            }
        } else if (arg[0] == '-' && arg[1] && !isdigit((unsigned char)arg[1])) {   /* "-1": a run id */
            fprintf(stderr, "diff: unknown option '%s'\n", arg);
            diff_usage(stderr);
            return 2;
        } else if (num_positional < 3) {
            positional[num_positional++] = arg;
        } else {
            fprintf(stderr, "diff: unexpected argument '%s'\n", arg);
            diff_usage(stderr);
            return 2;
        }
    }
    if (num_positional != 3) {
        diff_usage(stderr);
        return 2;
    }
    int64_t run_a, run_b;
    if (ar_rd_parse_run_id(positional[1], &run_a) != 0 ||
        ar_rd_parse_run_id(positional[2], &run_b) != 0) {
        fprintf(stderr, "diff: run ids must be non-negative integers (got '%s' and '%s')\n",
                positional[1], positional[2]);
        return 2;
    }
    char err[1024];
    void *db = ar_rd_open(positional[0], err, sizeof err);
    if (!db) {
        fprintf(stderr, "diff: %s\n", err);
        return 2;
    }
    ar_run_data a, b;
    if (load_pair(db, run_a, run_b, &opt, &a, &b, err, sizeof err) != 0) {
        ar_rd_close(db);
        fprintf(stderr, "diff: %s: %s\n", positional[0], err);
        return 2;
    }
    ar_rd_close(db);
    ar_diff_result result;
    int rc = diff_compute(&a, &b, &opt, &result, stdout, err, sizeof err);
    int out_errno = ferror(stdout) ? errno : 0;   /* the failed write's */
    ar_rd_free_run(&a);
    ar_rd_free_run(&b);
    if (rc != 0) {
        fprintf(stderr, "diff: %s\n", err);
        return 2;
    }
    if (fflush(stdout) != 0) out_errno = errno;
    if (ferror(stdout)) {   /* the comparison is lost: neither the gate's 0 nor its 1 */
        fprintf(stderr, "attnreplay diff: cannot write the output (%s)\n",
                out_errno ? strerror(out_errno) : "a write failed");
        __fpurge(stdout);
        clearerr(stdout);
        return 3;
    }
    return result.time_regression || result.accuracy_regression ? 1 : 0;
}
