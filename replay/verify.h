/* verify.h - checking one step's backend output against the float64 reference (DESIGN 7).
 *
 * For every checked query row the verifier regenerates the request's inputs in LOGICAL order
 * from the data generator (never from the backend's paged cache), runs the float64 reference
 * and the naive same-dtype implementation on them, and compares.  The pass rule follows
 * FlashAttention's tests:
 *   max |out - ref|  <= 3 x max |naive - ref| + floor      (3x: paged / split-KV paths)
 *   mean |out - ref| <= 1.5 x mean |naive - ref| + floor/4
 *   max |lse - ref_lse| <= 3 x max |naive_lse - ref_lse| + 1e-3
 *   no NaN or Inf anywhere in the output, guard regions intact,
 * where floor = ulp of 0.3 in the run's dtype (FA3's fwd_atol: twice the rounding noise near
 * 0.3), at least 1e-6.  Fixed per-dtype tolerances (vLLM's: bf16 1.5e-2 + 1e-2 |ref|, fp16 1e-3
 * + 1e-3 |ref|, fp32 1e-5 + 1e-5 |ref|) are counted beside it as bad_count, for reports.
 * Keys are processed in chunks of AR_VERIFY_KEY_CHUNK merged by LSE (the chunk results of the
 * naive twin, rounded to the dtype, are merged in float64 like the reference's), which bounds
 * memory for long contexts; MLA chunks its keys the same way.  Rows are processed in blocks of
 * AR_VERIFY_ROW_BLOCK, which changes no value and lets a raised cancel flag stop the work within
 * about a second.
 *
 * Where it runs (ar_verifier): on the host (ar_verify_step, threads over requests), or, when the
 * backend's output is on a CUDA device, on that device (reference/ref_gpu.h: the same rows, the
 * same rule, the same metrics; only the summary comes back).  A device verifier cross-checks its
 * reference against the C reference on one row of every step (the first verified layer of the
 * step, rotating over requests and KV heads / MLA heads) on a background thread; a disagreement
 * beyond AR_CROSSCHECK_TOL relative is a run error, never a pass. */
#ifndef AR_VERIFY_H
#define AR_VERIFY_H

#include "backend.h"

#define AR_VERIFY_WORST 8
#define AR_VERIFY_KEY_CHUNK 8192
#define AR_VERIFY_ROW_BLOCK 16
#define AR_CROSSCHECK_TOL 1e-9

typedef enum ar_verify_mode { AR_VERIFY_OFF = 0, AR_VERIFY_ALL = 1, AR_VERIFY_SAMPLE = 2 } ar_verify_mode;

typedef struct ar_verify_opts {
    ar_verify_mode mode;
    int sample_rows;          /* rows per step for AR_VERIFY_SAMPLE (each request's last always) */
    int threads;              /* 0 = all cores */
    const char *dump_dir;     /* non-NULL: also write this step's .npy files and index.json */
    const volatile int *cancel; /* non-NULL: verification gives up (returns AR_VERIFY_CANCELLED)
                                   soon after *cancel becomes non-zero (SIGINT/SIGTERM) */
} ar_verify_opts;

#define AR_VERIFY_CANCELLED 4   /* ar_verifier_check_layer's return when *opts->cancel was set */

typedef struct ar_worst {
    int req;                  /* index in the batch */
    int token;                /* query row within the request */
    int head, dim;
    double got, want, err;
} ar_worst;

typedef struct ar_verify_result {
    int rows_checked;
    double max_abs, max_rel, mean_abs, nmse, lse_max_abs;
    int64_t nan_count;        /* NaN or Inf anywhere in out/LSE (all rows, not only checked) */
    int64_t bad_count;        /* elements outside the fixed per-dtype tolerance */
    double naive_max_abs, naive_mean_abs, naive_lse_max_abs;
    double tol_max_abs, tol_mean_abs, tol_lse;
    bool pass;
    char reason[160];         /* why it failed, "" when it passed */
    int num_worst;
    ar_worst worst[AR_VERIFY_WORST];
} ar_verify_result;

/* Verifies layer `layer` of step b.  out [num_tokens, Hq, Dv] and lse [Hq, num_tokens] are the
 * backend's.  req_ids [num_reqs] name the requests (for the dump index).  Returns 0,
 * AR_VERIFY_CANCELLED when opts->cancel was raised, or -1 with err set (out of memory, dump write
 * failure). */
int ar_verify_step(const ar_run_config *cfg, const ar_batch *b, int layer, const float *out,
                   const float *lse, const char *const *req_ids, const ar_verify_opts *opts,
                   ar_verify_result *res, char *err, size_t err_len);

/* The query rows of a request with n rows that opts checks (a step of total_tokens tokens): all,
 * or an even spread that always includes the last row.  rows [n] receives them ascending;
 * returns how many. */
int ar_verify_choose_rows(const ar_verify_opts *opts, int n, int total_tokens, int *rows);

/* vLLM's fixed per-dtype tolerance (bad_count counts elements with |err| > atol + rtol |ref|). */
void ar_verify_fixed_tolerance(ar_dtype dtype, double *atol, double *rtol);

/* Sums over the compared elements, as both verifiers collect them. */
typedef struct ar_verify_sums {
    int64_t elems;
    double sum_abs, sum_sq_err, sum_sq_ref, naive_sum_abs;
} ar_verify_sums;

/* The pass rule: from the sums and the maxima already in res (max_abs, lse_max_abs, naive_max_abs,
 * naive_lse_max_abs, nan_count), sets mean_abs, naive_mean_abs, nmse, the tolerances, pass and
 * reason. */
void ar_verify_apply_rule(ar_dtype dtype, const ar_verify_sums *s, ar_verify_result *res);

/* The host's float64 reference and naive twin, as the host verifier computes them, for the
 * checked rows rows [nrows] (ascending) of request r of step b, query heads [head0, head0 +
 * heads) (MHA: whole KV-head groups).  ref_o, nv_o [nrows, heads, dv]; ref_l, nv_l [heads,
 * nrows]; nv_o / nv_l may be NULL.  0, or -1 (out of memory, heads not whole groups). */
int ar_verify_host_reference(const ar_run_config *cfg, const ar_batch *b, int layer, int r, int nrows,
                             const int *rows, int head0, int heads, double *ref_o, double *ref_l,
                             double *nv_o, double *nv_l);

/* The cross-check comparison of a device reference with the C reference on `heads` heads of one
 * row: out values relative to the largest |value| of their head (at least 1e-6), LSE relative to
 * max(|lse|, 1); equal infinities agree, NaN never does.  out [heads, dv], lse [heads].  Returns the
 * largest relative difference; *worst_head (may be NULL) receives its head (0-based). */
double ar_crosscheck_diff(int heads, int dv, const double *dev_out, const double *dev_lse,
                          const double *host_out, const double *host_lse, int *worst_head);

/* ---- the verifier the engine uses: host or device ----------------------------------------
 * One per run.  ar_verifier_open picks where verification runs: on the device when the
 * backend's output is on a CUDA device and the GPU reference is built in (the float64 CUDA
 * twin in reference/, cross-checked against the C reference on sampled rows), else on the host
 * (ar_verify_step).  The engine asks ar_verifier_needs_host_output before each forward and
 * passes host out/lse buffers only when it says true. */
typedef struct ar_verifier ar_verifier;

/* 0 ok; -1 with err set (out of memory, device error).  Environment: ATTNREPLAY_VERIFY_ON=host|device
 * overrides the choice (device: fail when it cannot); for tests, ATTNREPLAY_CROSSCHECK_WAIT=1 runs
 * every step's cross-check before its check returns (none skipped) and ATTNREPLAY_CROSSCHECK_TOL=X
 * tightens the tolerance. */
int ar_verifier_open(ar_verifier **v, const ar_run_config *cfg, const ar_backend *be,
                     char *err, size_t err_len);

typedef struct ar_verifier_options {
    const char *where;        /* NULL or "auto", "host", "device" */
    size_t device_mem;        /* device bytes for the device reference; 0: a share of what is free */
    bool crosscheck_wait;     /* run each cross-check before check_layer returns (tests) */
    double crosscheck_tol;    /* 0: AR_CROSSCHECK_TOL */
    double crosscheck_tamper; /* test hook: added to the device probe before the comparison */
} ar_verifier_options;
int ar_verifier_open_with(ar_verifier **v, const ar_run_config *cfg, const ar_backend *be,
                          const ar_verifier_options *o, char *err, size_t err_len);
/* True when the next ar_verifier_check_layer with these opts needs fo->out / fo->lse on the host
 * (a host verifier, or a dump step). */
bool ar_verifier_needs_host_output(const ar_verifier *v, const ar_verify_opts *opts);
/* "host" or "device": where this verifier checks (for the runs table and the summary). */
const char *ar_verifier_where(const ar_verifier *v);
/* Verifies layer `layer` of step b from forward's result fo (host buffers or device pointers).
 * Returns 0; AR_VERIFY_CANCELLED when opts->cancel was raised; -1 with err set (out of memory,
 * device error, dump write failure, or the device reference disagreeing with the C reference:
 * a run error, never a pass). */
int ar_verifier_check_layer(ar_verifier *v, const ar_batch *b, int layer, const ar_forward_out *fo,
                            const char *const *req_ids, const ar_verify_opts *opts,
                            ar_verify_result *res, char *err, size_t err_len);
/* Waits for the cross-check in flight.  Returns 0, or -1 with err naming step, request, row and
 * head when a cross-check disagreed and no check_layer has reported it yet.  line (may be NULL)
 * receives one line for the run's summary ("" for a host verifier). */
int ar_verifier_finish(ar_verifier *v, char *line, size_t line_len, char *err, size_t err_len);

typedef struct ar_crosscheck_stats {
    int64_t done, skipped, failed;
    double max_diff;          /* largest relative difference seen */
    double host_s;            /* host time spent in the C reference */
} ar_crosscheck_stats;
void ar_verifier_crosscheck_stats(const ar_verifier *v, ar_crosscheck_stats *st);

void ar_verifier_close(ar_verifier *v);

/* Merges per-layer results into one step result (worst of each metric, pass = all pass). */
void ar_verify_accumulate(ar_verify_result *acc, const ar_verify_result *layer_res, bool first);

/* Writes a float32 (or float64 when is_double) array as a .npy file. 0 ok, -1 error. */
int ar_write_npy(const char *path, const void *data, bool is_double, int ndim, const int64_t *shape);

#endif
