/* reports.h - the commands that read a results database (schema in replay/db.h) and answer
 * questions people want to show: `report` (plots through gnuplot, index.html, summary.md)
 * and `diff` (two runs of one trace compared step by step; exit status gates CI).
 * Both open the database read-only, so they may run while a replay is still writing. */
#ifndef AR_REPORTS_H
#define AR_REPORTS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* attnreplay report DB [--run ID ...] --out DIR
 * argv[0] = "report".  Returns 0 on success, 1 when rendering failed (gnuplot missing or
 * failing), 2 on usage errors or bad input (missing database, unknown run). */
int ar_report_main(int argc, char **argv);

/* attnreplay diff DB RUN_A RUN_B [--threshold 5%] [--error-growth 2] [--allow-unfinished]
 * argv[0] = "diff".  RUN_A is the baseline, RUN_B the candidate.  Returns 0 when there is
 * no regression, 1 on a regression, 2 on usage errors or bad input - a run that did not
 * finish (status running, interrupted, error, or a merge still 'incomplete') among them unless
 * --allow-unfinished.  A merged run (attnreplay merge) is one run. */
int ar_diff_main(int argc, char **argv);

/* What diff decides with. */
typedef struct {
    double threshold;         /* relative slowdown counted as a regression, e.g. 0.05 */
    double error_growth;      /* max_abs (and sqrt NMSE) growth factor counted as a regression */
    int allow_unfinished;     /* compare runs that stopped early (else refused) */
} ar_diff_options;

/* What diff found (all ratios are candidate / baseline). */
typedef struct {
    size_t common_steps;      /* steps present in both runs */
    size_t only_in_a;         /* steps only the baseline has */
    size_t only_in_b;         /* steps only the candidate has */
    size_t timed_steps;       /* common steps with a positive time in both */
    double ratio_median;      /* median of per-step time ratios */
    double ratio_p90;         /* 90th percentile of per-step time ratios */
    double total_ratio;       /* sum of candidate times / sum of baseline times */
    size_t slower_steps;      /* steps whose ratio exceeds 1 + threshold */
    size_t newly_failing;     /* verified passing in A, failing in B */
    size_t newly_passing;     /* failing in A, passing in B */
    size_t coverage_changed;  /* verified in one run, not in the other */
    double max_abs_a, max_abs_b;  /* worst max_abs over verified common steps */
    double nmse_a, nmse_b;        /* worst NMSE over verified common steps */
    size_t error_grown_steps; /* steps whose max_abs grew beyond error_growth */
    int time_regression;      /* 1 when median or total ratio exceeds 1 + threshold */
    int accuracy_regression;  /* 1 on newly failing steps or worst-error growth */
} ar_diff_result;

/* Compares run_b against run_a in the database at db_path without printing.  Returns 0 and
 * fills out, or -1 with a message (unknown run, different traces, unreadable database, a run
 * that did not finish without opt->allow_unfinished). */
int ar_diff_runs(const char *db_path, int64_t run_a, int64_t run_b, const ar_diff_options *opt,
                 ar_diff_result *out, char *err, size_t err_len);

/* Parses a threshold: "5%" -> 0.05, "0.05" -> 0.05.  Returns 0, or -1 when malformed. */
int ar_parse_threshold(const char *text, double *out);

/* attnreplay plan --workload SPEC --model PRESET --device DEV [--db DB [--run ID ...]]
 *                 [--rates 0.5,1,2,4] [--kv-blocks N,... | --kv-mem SIZE,...]
 *                 [--slo ttft_p90=2s,tpot_p90=50ms] --out DIR [...]
 * argv[0] = "plan".  Fits the attention part of the step-time model from measured replay
 * steps, runs the simulator over a sweep of arrival-rate scales and KV-cache sizes, and
 * reports latency percentiles, throughput, preemptions and the largest load meeting the SLO.
 * Returns 0, 1 on a simulation or rendering failure, 2 on usage errors or bad input. */
int ar_plan_main(int argc, char **argv);

/* The attention model fitted from a database, per layer and step:
 *   t = launch + max(bytes / (bw_eff * copy ceiling), flops / (attn_eff * bf16 ceiling))
 * fitted on 4 of every 5 steps (in step order) and evaluated on the fifth. */
typedef struct {
    double bw_eff, attn_eff;      /* fractions of the database's device ceilings */
    double launch_s;              /* fixed time per layer and step */
    double copy_gbps, bf16_tflops;/* the ceilings the efficiencies refer to */
    char ceilings_source[160];
    char device[128];             /* the device the runs were measured on */
    size_t runs, train_steps, test_steps;
    double train_mape;            /* mean |pred - measured| / measured on the fitting steps */
    double test_mape, test_median_ape, test_p90_ape;   /* the same on the held-out steps */
} ar_plan_fit;

/* Fits from the given runs (num_runs 0: every run without a planted fault whose device
 * contains device_hint, case-insensitive; all runs when device_hint is NULL or matches
 * none and the database holds one device).  Returns 0, or -1 with a message. */
int ar_plan_fit_db(const char *db_path, const int64_t *runs /* [num_runs] */, size_t num_runs,
                   const char *device_hint, ar_plan_fit *out, char *err, size_t err_len);

/* attnreplay calibrate --db DB [--no-cublas] [--gemm-n N] [--copy-mib N]
 * attnreplay calibrate --db DB --device NAME --copy-gbps X --bf16-tflops Y
 * argv[0] = "calibrate".  Measures device 0's copy bandwidth and bf16 matrix rate (method in
 * kernels/common/cuda_calibrate.cu) and appends a `ceilings` row; or stores the given numbers with
 * method 'given'.  Returns 0 when stored, 2 on usage errors and on a DB that cannot be written or
 * that replay --db would refuse (checked before the measurement) or that another connection keeps
 * locked past the busy timeout, 3 when there is no CUDA device (the database is then untouched),
 * on a CUDA error, or on I/O while writing. */
int ar_calibrate_main(int argc, char **argv);

/* Appends one row to the `ceilings` table of db_path (created and migrated if needed):
 * measured in unix seconds, copy_gbps in 1e9 B/s, bf16_tflops in 1e12 FLOP/s.  Returns 0, or
 * calibrate's exit code with a message naming the file: 2 for bad input (not an attnreplay
 * results database, or another connection's lock held past the busy timeout), 3 for I/O. */
int ar_calibrate_store(const char *db_path, const char *device, double measured, double copy_gbps,
                       double bf16_tflops, const char *method, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
