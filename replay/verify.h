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
 * Keys are processed in chunks of AR_VERIFY_KEY_CHUNK merged by LSE, which bounds memory for
 * long contexts; for the naive twin this merge is done in float (it is the yardstick only). */
#ifndef AR_VERIFY_H
#define AR_VERIFY_H

#include "backend.h"

#define AR_VERIFY_WORST 8
#define AR_VERIFY_KEY_CHUNK 8192

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
 * backend's.  req_ids [num_reqs] name the requests (for the dump index).  Returns 0, or -1 with
 * err set (out of memory, dump write failure). */
int ar_verify_step(const ar_run_config *cfg, const ar_batch *b, int layer, const float *out,
                   const float *lse, const char *const *req_ids, const ar_verify_opts *opts,
                   ar_verify_result *res, char *err, size_t err_len);

/* ---- the verifier the engine uses: host or device ----------------------------------------
 * One per run.  ar_verifier_open picks where verification runs: on the device when the
 * backend's output is on a CUDA device and the GPU reference is built in (the float64 CUDA
 * twin in reference/, cross-checked against the C reference on sampled rows), else on the host
 * (ar_verify_step).  The engine asks ar_verifier_needs_host_output before each forward and
 * passes host out/lse buffers only when it says true. */
typedef struct ar_verifier ar_verifier;

/* 0 ok; -1 with err set (out of memory, device error). */
int ar_verifier_open(ar_verifier **v, const ar_run_config *cfg, const ar_backend *be,
                     char *err, size_t err_len);
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
void ar_verifier_close(ar_verifier *v);

/* Merges per-layer results into one step result (worst of each metric, pass = all pass). */
void ar_verify_accumulate(ar_verify_result *acc, const ar_verify_result *layer_res, bool first);

/* Writes a float32 (or float64 when is_double) array as a .npy file. 0 ok, -1 error. */
int ar_write_npy(const char *path, const void *data, bool is_double, int ndim, const int64_t *shape);

#endif
