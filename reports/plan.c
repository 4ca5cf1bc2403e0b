/* plan.c - `attnreplay plan`: capacity answers from a workload.
 *
 * The step-time model is the simulator's roofline (sim/steptime.c):
 *   t_step = max(GEMM FLOPs / (peak * gemm_eff), weight bytes / (bw * bw_eff))
 *          + max(attention FLOPs / (peak * attn_eff), KV bytes / (bw * bw_eff))
 *          + overhead + per_req * requests
 * with the attention part fitted from measured replay steps: per layer and step,
 *   t_attn = launch + max(bytes / (bw_eff * copy ceiling), flops / (attn_eff * bf16 ceiling))
 * where bytes, flops and the time come from the `steps` table (divided by runs.layers) and
 * the ceilings from `ceilings` (or the documented defaults, see rundata.h).  The fit searches
 * bw_eff and attn_eff on a logarithmic grid (coarse, then fine around the best point), takes
 * launch as the median residual, and minimises the mean absolute relative error.  Steps are
 * split in step order: four of every five fit the model, the fifth measures its error, and
 * both errors are reported.  The fitted efficiencies are converted to the planning device's
 * datasheet numbers (sim presets) and `launch x layers` is added to the step overhead; GEMMs
 * keep the roofline's default efficiency.  A fit measured on another device than --device
 * (e.g. CPU runs when planning an H200) is reported but not applied unless --force-fit.  The simulator shares bw_eff between KV reads and
 * weight streaming, so the fitted value governs both (stated in the output).  --step-time MODEL
 * replaces the roofline with any of the simulator's models (constant, linear, roofline with
 * other keys, fitted, profile); the output's "Step-time model" paragraph states the one used.
 *
 * The sweep runs the simulator for every arrival-rate scale (arrival times divided by the
 * scale) and KV-cache size, and reports TTFT/TPOT percentiles, output-token throughput,
 * preemptions per request, and for each KV size the largest tested scale that meets the
 * SLO with every request finished.
 *
 * Spread over ranks (--shard i/N or a launcher's environment, replay/shard.h): shard i simulates
 * the sweep points p (p = kv index x rates + rate index) with p % N == i and writes them to
 * DIR/data/sweep-shard-i-of-N.csv under a fingerprint of everything the points depend on (the
 * workload file's bytes, the model, the step-time model with its fit, the sweep and the engine
 * limits).  The shard that finds all N files present with its fingerprint takes the lock file
 * DIR/data/sweep-assemble.lock and writes the plan (the bisection for the largest load runs
 * there); the others stop after their points.  A plan run without shards over a DIR that holds
 * a complete set with its fingerprint uses those points instead of simulating them again. */
#include "reports.h"
#include "plot.h"
#include "rundata.h"
#include "../replay/shard.h"
#include "../sim/sim.h"

extern char **environ;

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PLAN_MAX_POINTS 32          /* rates, and KV sizes, each */
#define PLAN_MAX_SLO 8
#define PLAN_FIT_MAX_TRAIN 1500     /* fitting steps used (evenly subsampled beyond) */
#define PLAN_GRID 41

/* ---- the fit ------------------------------------------------------------------------------- */

/* One measured step, per layer. */
typedef struct {
    double bytes, flops, time_s;
    double predicted_s;
    bool train;
} fit_sample;

static double predict_no_launch(const fit_sample *s, double bw, double peak)
{
    double memory = s->bytes / bw, compute = s->flops / peak;
    return memory > compute ? memory : compute;
}

/* Mean relative error of (bw_eff, attn_eff) on the samples, launch set to the median residual. */
static double score(const fit_sample *samples, size_t n, double bw, double peak, double *residuals,
                    double *launch_out)
{
    for (size_t i = 0; i < n; i++) residuals[i] = samples[i].time_s - predict_no_launch(&samples[i], bw, peak);
    double launch = ar_rd_quantile(residuals, n, 0.5);
    if (!(launch > 0)) launch = 0;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += fabs(predict_no_launch(&samples[i], bw, peak) + launch - samples[i].time_s) / samples[i].time_s;
    *launch_out = launch;
    return sum / (double)n;
}

/* Grid search over log10 efficiencies in [lo, hi] x [lo, hi]. */
static double grid_search(const fit_sample *samples, size_t n, double copy_bw, double peak_flops,
                          double lo_bw, double hi_bw, double lo_at, double hi_at, double *residuals,
                          double *best_bw, double *best_at, double *best_launch)
{
    double best = INFINITY;
    for (int i = 0; i < PLAN_GRID; i++) {
        double bw_eff = pow(10.0, lo_bw + (hi_bw - lo_bw) * i / (PLAN_GRID - 1));
        for (int j = 0; j < PLAN_GRID; j++) {
            double attn_eff = pow(10.0, lo_at + (hi_at - lo_at) * j / (PLAN_GRID - 1));
            double launch;
            double err = score(samples, n, bw_eff * copy_bw, attn_eff * peak_flops, residuals, &launch);
            if (err < best) {
                best = err;
                *best_bw = bw_eff;
                *best_at = attn_eff;
                *best_launch = launch;
            }
        }
    }
    return best;
}

/* Picks runs: the given ones, or those matching the device hint (see reports.h). */
static int pick_runs(void *db, const int64_t *runs, size_t num_runs, const char *device_hint,
                     int64_t **picked, size_t *num_picked, char *err, size_t err_len)
{
    *picked = NULL;
    *num_picked = 0;
    if (num_runs) {
        *picked = malloc(num_runs * sizeof **picked);
        if (!*picked) { snprintf(err, err_len, "out of memory"); return -1; }
        memcpy(*picked, runs, num_runs * sizeof **picked);
        *num_picked = num_runs;
        return 0;
    }
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2((sqlite3 *)db,
            "SELECT id, device, (SELECT count(DISTINCT device) FROM runs WHERE inject = 'none') "
            "FROM runs WHERE inject = 'none' ORDER BY id", -1, &st, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "reading runs: %s", sqlite3_errmsg((sqlite3 *)db));
        return -1;
    }
    size_t cap = 0, all = 0;
    int devices = 0;
    int64_t *every = NULL;
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *device = (const char *)sqlite3_column_text(st, 1);
        devices = sqlite3_column_int(st, 2);
        bool match = device_hint && device && strcasestr(device, device_hint);
        int64_t *grown = realloc(every, (all + 1) * sizeof *every);
        int64_t *grown_pick = match ? realloc(*picked, (cap + 1) * sizeof **picked) : *picked;
        if (!grown || (match && !grown_pick)) {
            free(grown ? grown : every);
            free(grown_pick ? grown_pick : *picked);
            *picked = NULL;
            sqlite3_finalize(st);
            snprintf(err, err_len, "out of memory");
            return -1;
        }
        every = grown;
        every[all++] = sqlite3_column_int64(st, 0);
        *picked = grown_pick;
        if (match) (*picked)[cap++] = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    if (cap) {
        free(every);
        *num_picked = cap;
        return 0;
    }
    if (devices == 1) {
        free(*picked);
        *picked = every;
        *num_picked = all;
        return 0;
    }
    free(every);
    if (all)
        snprintf(err, err_len, "no run was measured on a device matching '%s' and the database "
                 "holds %d devices; choose runs with --run", device_hint ? device_hint : "", devices);
    else
        snprintf(err, err_len, "the database holds no run without a planted fault");
    return -1;
}

/* Loads the per-layer samples of the runs; all runs must share one device. */
static int load_samples(void *db, const int64_t *ids, size_t num_ids, ar_plan_fit *out,
                        fit_sample **samples, size_t *num_samples, char *err, size_t err_len)
{
    size_t cap = 0;
    *samples = NULL;
    *num_samples = 0;
    for (size_t r = 0; r < num_ids; r++) {
        ar_run_data run;
        if (ar_rd_load_run(db, ids[r], &run, err, err_len) != 0) return -1;
        if (r == 0) {
            ar_ceilings c;
            ar_rd_ceilings(db, run.device, run.backend, &c);
            out->copy_gbps = c.copy_gbps;
            out->bf16_tflops = c.bf16_tflops;
            snprintf(out->ceilings_source, sizeof out->ceilings_source, "%s", c.source);
            snprintf(out->device, sizeof out->device, "%s", run.device);
        } else if (strcmp(run.device, out->device) != 0) {
            snprintf(err, err_len, "runs %lld and %lld were measured on different devices (%s, %s); "
                     "fit one device at a time", (long long)ids[0], (long long)ids[r], out->device,
                     run.device);
            ar_rd_free_run(&run);
            return -1;
        }
        double layers = run.layers > 0 ? (double)run.layers : 1.0;
        for (size_t i = 0; i < run.num_steps; i++) {
            const ar_step_row *s = &run.steps[i];
            if (!(s->time_us > 0) || !(s->bytes > 0) || !(s->flops > 0)) continue;
            if (*num_samples == cap) {
                cap = cap ? cap * 2 : 1024;
                fit_sample *grown = realloc(*samples, cap * sizeof *grown);
                if (!grown) {
                    ar_rd_free_run(&run);
                    snprintf(err, err_len, "out of memory");
                    return -1;
                }
                *samples = grown;
            }
            fit_sample *f = &(*samples)[(*num_samples)++];
            f->bytes = s->bytes / layers;
            f->flops = s->flops / layers;
            f->time_s = s->time_us * 1e-6 / layers;
            f->train = (*num_samples) % 5 != 0;
            f->predicted_s = NAN;
        }
        ar_rd_free_run(&run);
    }
    out->runs = num_ids;
    return 0;
}

static int fit_samples(fit_sample *samples, size_t n, ar_plan_fit *out, char *err, size_t err_len)
{
    size_t train = 0, test = 0;
    for (size_t i = 0; i < n; i++) { train += samples[i].train; test += !samples[i].train; }
    if (train < 4 || test < 1) {
        snprintf(err, err_len, "only %zu timed steps with bytes and FLOPs; the fit needs at least 5", n);
        return -1;
    }
    /* The fitting set, evenly subsampled to bound the search's cost. */
    size_t stride = train > PLAN_FIT_MAX_TRAIN ? (train + PLAN_FIT_MAX_TRAIN - 1) / PLAN_FIT_MAX_TRAIN : 1;
    fit_sample *fitting = malloc(train * sizeof *fitting);
    double *residuals = malloc((n > train ? n : train) * sizeof *residuals);
    if (!fitting || !residuals) {
        free(fitting);
        free(residuals);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    size_t nf = 0, k = 0;
    for (size_t i = 0; i < n; i++)
        if (samples[i].train && k++ % stride == 0) fitting[nf++] = samples[i];
    double copy_bw = out->copy_gbps * 1e9, peak = out->bf16_tflops * 1e12;
    double bw_eff = 0.5, attn_eff = 0.5, launch = 0;
    /* Coarse: 1e-4 .. 10^0.5 (ceilings may be guesses); fine: +-1 coarse step. */
    const double lo = -4.0, hi = 0.5, step = (hi - lo) / (PLAN_GRID - 1);
    grid_search(fitting, nf, copy_bw, peak, lo, hi, lo, hi, residuals, &bw_eff, &attn_eff, &launch);
    double lb = log10(bw_eff), la = log10(attn_eff);
    out->train_mape = grid_search(fitting, nf, copy_bw, peak, lb - step, lb + step, la - step,
                                  la + step, residuals, &bw_eff, &attn_eff, &launch);
    out->bw_eff = bw_eff;
    out->attn_eff = attn_eff;
    out->launch_s = launch;
    out->train_steps = train;
    out->test_steps = test;
    size_t nt = 0;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        fit_sample *s = &samples[i];
        s->predicted_s = predict_no_launch(s, bw_eff * copy_bw, attn_eff * peak) + launch;
        if (!s->train) {
            residuals[nt] = fabs(s->predicted_s - s->time_s) / s->time_s;
            sum += residuals[nt++];
        }
    }
    out->test_mape = sum / (double)nt;
    out->test_median_ape = ar_rd_quantile(residuals, nt, 0.5);
    out->test_p90_ape = ar_rd_quantile(residuals, nt, 0.9);
    free(fitting);
    free(residuals);
    return 0;
}

/* Fits and, when samples_out is given, hands back the samples with their predictions. */
static int fit_db(const char *db_path, const int64_t *runs, size_t num_runs, const char *device_hint,
                  ar_plan_fit *out, fit_sample **samples_out, size_t *num_out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    void *db = ar_rd_open(db_path, err, err_len);
    if (!db) return -1;
    int64_t *ids = NULL;
    size_t num_ids = 0;
    fit_sample *samples = NULL;
    size_t n = 0;
    char why[AR_ERR_MAX] = "";
    int rc = pick_runs(db, runs, num_runs, device_hint, &ids, &num_ids, why, sizeof why);
    if (rc == 0) rc = load_samples(db, ids, num_ids, out, &samples, &n, why, sizeof why);
    if (rc == 0) rc = fit_samples(samples, n, out, why, sizeof why);
    if (rc != 0) snprintf(err, err_len, "%s: %s", db_path, why);   /* ar_rd_open's errors name it already */
    ar_rd_close(db);
    free(ids);
    if (rc == 0 && samples_out) {
        *samples_out = samples;
        *num_out = n;
    } else {
        free(samples);
    }
    return rc;
}

int ar_plan_fit_db(const char *db_path, const int64_t *runs, size_t num_runs,
                   const char *device_hint, ar_plan_fit *out, char *err, size_t err_len)
{
    return fit_db(db_path, runs, num_runs, device_hint, out, NULL, NULL, err, err_len);
}

/* ---- command-line values --------------------------------------------------------------------- */

typedef enum { SLO_TTFT, SLO_TPOT, SLO_E2E } slo_metric;

typedef struct {
    slo_metric metric;
    double quantile;          /* 0.5, 0.9 or 0.99 */
    double limit_s;
    char text[48];            /* as given, e.g. "ttft_p90=2s" */
} slo_term;

/* "2s", "50ms", "800us", "1.5" (seconds) -> seconds; -1 when malformed. */
static double parse_duration(const char *text)
{
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text || !(v > 0) || !isfinite(v)) return -1;
    if (!strcmp(end, "") || !strcmp(end, "s")) return v;
    if (!strcmp(end, "ms")) return v * 1e-3;
    if (!strcmp(end, "us")) return v * 1e-6;
    return -1;
}

static int parse_slo(const char *text, slo_term *terms, int *num_terms, char *err, size_t err_len)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    *num_terms = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*num_terms == PLAN_MAX_SLO) { snprintf(err, err_len, "--slo: at most %d terms", PLAN_MAX_SLO); return -1; }
        slo_term *t = &terms[*num_terms];
        char *eq = strchr(tok, '=');
        if (!eq) { snprintf(err, err_len, "--slo '%s': expected METRIC_pQ=VALUE, e.g. ttft_p90=2s", tok); return -1; }
        *eq = 0;
        snprintf(t->text, sizeof t->text, "%s=%s", tok, eq + 1);
        const char *q = strstr(tok, "_p");
        if (!q) { snprintf(err, err_len, "--slo '%s': metric must be ttft|tpot|e2e with _p50, _p90 or _p99", t->text); return -1; }
        size_t name_len = (size_t)(q - tok);
        if (name_len == 4 && !strncmp(tok, "ttft", 4)) t->metric = SLO_TTFT;
        else if (name_len == 4 && !strncmp(tok, "tpot", 4)) t->metric = SLO_TPOT;
        else if (name_len == 3 && !strncmp(tok, "e2e", 3)) t->metric = SLO_E2E;
        else { snprintf(err, err_len, "--slo '%s': metric must be ttft, tpot or e2e", t->text); return -1; }
        if (!strcmp(q, "_p50")) t->quantile = 0.5;
        else if (!strcmp(q, "_p90")) t->quantile = 0.9;
        else if (!strcmp(q, "_p99")) t->quantile = 0.99;
        else { snprintf(err, err_len, "--slo '%s': percentile must be p50, p90 or p99", t->text); return -1; }
        t->limit_s = parse_duration(eq + 1);
        if (t->limit_s < 0) { snprintf(err, err_len, "--slo '%s': value like 2s, 50ms or 800us", t->text); return -1; }
        (*num_terms)++;
    }
    if (*num_terms == 0) { snprintf(err, err_len, "--slo: no terms"); return -1; }
    return 0;
}

/* "0.5,1,2" -> values (positive). */
static int parse_list(const char *text, double *values, int *count, bool sizes)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    *count = 0;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*count == PLAN_MAX_POINTS) return -1;
        char *end = NULL;
        double v = strtod(tok, &end);
        double mult = 1;
        if (sizes && *end) {
            static const char *const suffixes[] = { "K", "KiB", "M", "MiB", "G", "GiB", "T", "TiB" };
            static const double mults[] = { 1e3, 1024.0, 1e6, 1048576.0, 1e9, 1073741824.0, 1e12,
                                            1099511627776.0 };
            mult = 0;
            for (size_t i = 0; i < sizeof mults / sizeof mults[0]; i++)
                if (!strcmp(end, suffixes[i])) mult = mults[i];
            end += strlen(end);
        }
        if (end == tok || *end || !(v > 0) || !isfinite(v) || !(mult > 0)) return -1;
        values[(*count)++] = v * mult;
    }
    return *count ? 0 : -1;
}

/* ---- the sweep ------------------------------------------------------------------------------- */

typedef struct {
    double rate;
    int kv_blocks;
    int requests, finished, skipped;
    double ttft[3], tpot[3], e2e[3];     /* p50, p90, p99 in seconds */
    double throughput;                  /* output tokens per second */
    double preemptions_per_req;
    double kv_usage_mean;
    double duration;
    bool slo_ok;
} sweep_point;

typedef struct {
    const char *workload, *model, *device, *db, *slo_text;
    char out_dir[3072];       /* --out without trailing slashes */
    int64_t runs[PLAN_MAX_POINTS];
    size_t num_runs;
    double rates[PLAN_MAX_POINTS];
    int num_rates;
    double kv_values[PLAN_MAX_POINTS];  /* blocks, or bytes when kv_is_mem */
    int num_kv;
    bool kv_is_mem;
    int block_size, max_batched, max_seqs, limit;
    slo_term slo[PLAN_MAX_SLO];
    int num_slo;
    bool force_fit;           /* apply the fit even when measured on another device */
    int refine;               /* bisection steps for the largest load meeting the SLO */
    const char *step_time;    /* --step-time MODEL (e.g. profile:DB) instead of roofline:DEVICE */
    const char *shard_text;   /* --shard i/N, or NULL: the launcher's environment */
} plan_args;

static void percentiles(double *values, size_t n, double out[3])
{
    out[0] = ar_rd_quantile(values, n, 0.5);
    out[1] = ar_rd_quantile(values, n, 0.9);
    out[2] = ar_rd_quantile(values, n, 0.99);
}

/* Simulates one sweep point: 0, -2 when the inputs cannot be simulated (bad input: a step time
 * or clock that is not finite), -1 on another failure; err says why. */
static int simulate(const plan_args *a, const ar_model_preset *preset, const ar_steptime *steptime,
                    const ar_workload *wl, int num_blocks, sweep_point *pt, char *err, size_t err_len)
{
    ar_sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.steptime = *steptime;
    ar_trace_header *h = &cfg.header;
    h->version = AR_TRACE_VERSION;
    h->model = preset->model;
    h->cache.block_size = a->block_size;
    h->cache.num_blocks = num_blocks;
    h->cache.dtype = AR_BF16;
    h->cache.kv_cache_dtype = AR_BF16;
    h->sched.max_num_batched_tokens = a->max_batched;
    h->sched.max_num_seqs = a->max_seqs;
    h->sched.prefix_caching = true;
    snprintf(h->source, sizeof h->source, "plan:%s", wl->source);
    h->seed = 1;
    cfg.num_sms = steptime->device.num_sms;
    if (ar_sim_check_any_fits(wl, num_blocks, a->block_size, 0, err, err_len) != 0) return -2;   /* bad input */
    ar_sim *s = ar_sim_create(&cfg, wl, err, err_len);
    if (!s) return -1;
    int rc;
    const ar_step *step;
    while ((rc = ar_sim_step(s, &step, err, err_len)) == 1) {}
    if (rc < 0) {
        ar_sim_destroy(s);
        return rc;   /* -2: inputs that cannot be simulated (bad input, exit 2 as in sim) */
    }
    int n = ar_sim_num_requests(s);
    double *ttft = malloc((size_t)(n ? n : 1) * sizeof *ttft);
    double *tpot = malloc((size_t)(n ? n : 1) * sizeof *tpot);
    double *e2e = malloc((size_t)(n ? n : 1) * sizeof *e2e);
    if (!ttft || !tpot || !e2e) {
        free(ttft); free(tpot); free(e2e);
        ar_sim_destroy(s);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    size_t nt = 0, np = 0;
    pt->requests = n;
    pt->finished = pt->skipped = 0;
    for (int i = 0; i < n; i++) {
        ar_sim_req_info r;
        ar_sim_request(s, i, &r);
        if (r.status == AR_REQ_SKIPPED) pt->skipped++;
        if (r.status != AR_REQ_FINISHED) continue;
        pt->finished++;
        ttft[nt] = r.first_token - r.arrival;
        e2e[nt++] = r.last_token - r.arrival;
        if (r.num_output_tokens > 1)
            tpot[np++] = (r.last_token - r.first_token) / (r.num_output_tokens - 1);
    }
    percentiles(ttft, nt, pt->ttft);
    percentiles(tpot, np, pt->tpot);
    percentiles(e2e, nt, pt->e2e);
    free(ttft); free(tpot); free(e2e);
    ar_sim_summary sum;
    ar_sim_summarize(s, &sum);
    pt->duration = sum.duration;
    pt->throughput = sum.duration > 0 ? (double)sum.output_tokens / sum.duration : NAN;
    pt->preemptions_per_req = n ? (double)sum.preemptions / n : 0;
    pt->kv_usage_mean = sum.kv_usage_mean;
    ar_sim_destroy(s);
    pt->slo_ok = pt->finished == n && n > 0;
    for (int t = 0; t < a->num_slo; t++) {
        const slo_term *term = &a->slo[t];
        const double *v = term->metric == SLO_TTFT ? pt->ttft : term->metric == SLO_TPOT ? pt->tpot : pt->e2e;
        double got = v[term->quantile < 0.6 ? 0 : term->quantile < 0.95 ? 1 : 2];
        if (!(got <= term->limit_s)) pt->slo_ok = false;
    }
    return 0;
}

/* Bisects the rate scale between lo (meets the SLO) and hi (misses it), geometrically; 0, or
 * simulate()'s -2 (bad input, as is a workload that no longer loads at a scale) or -1. */
static int refine_rate(const plan_args *a, const ar_model_preset *preset, const ar_steptime *st,
                       int kv_blocks, double lo, double hi, double *best, char *err, size_t err_len)
{
    *best = lo;
    for (int i = 0; i < a->refine; i++) {
        double mid = sqrt(lo * hi);
        ar_workload wl;
        if (ar_workload_load(a->workload, a->block_size, 1.0 / mid, a->limit, &wl, err, err_len) != 0)
            return -2;
        sweep_point p;
        memset(&p, 0, sizeof p);
        int rc = simulate(a, preset, st, &wl, kv_blocks, &p, err, err_len);
        ar_workload_free(&wl);
        if (rc != 0) return rc;
        if (p.slo_ok) { lo = mid; *best = mid; }
        else hi = mid;
    }
    return 0;
}

/* ---- output ---------------------------------------------------------------------------------- */

static void plan_usage(FILE *f)
{
    fprintf(f,
        "usage: attnreplay plan --workload SPEC --model PRESET --device DEVICE --out DIR [options]\n"
        "  --workload SPEC       as for sim: mooncake:PATH | azure:PATH | vllm-run:PATH | synthetic:SPEC\n"
        "  --model PRESET        %s\n"
        "  --device DEVICE       %s (datasheet numbers from the sim presets)\n"
        "  --db DB [--run ID]    fit attention time from these replay steps (default: runs on DEVICE)\n"
        "  --force-fit           use the fit even when the runs were measured on another device\n"
        "  --step-time MODEL     the simulator's step-time model instead of roofline:DEVICE, e.g.\n"
        "                        profile:DB (measured by attnreplay profile) or constant:SECONDS; not with\n"
        "                        --db; the output's \"Step-time model\" paragraph states the model used\n"
        "  --rates LIST          arrival-rate scales (default 0.5,1,2,4); arrivals are divided by each\n"
        "  --kv-blocks LIST      KV-cache sizes in blocks (default 8192,32768), or\n"
        "  --kv-mem LIST         KV-cache sizes in bytes (e.g. 20GiB,40GiB)\n"
        "  --slo TERMS           e.g. ttft_p90=2s,tpot_p90=50ms (metrics ttft, tpot, e2e; p50, p90, p99)\n"
        "  --refine N            bisection steps for the largest load meeting the SLO (default 4)\n"
        "  --block-size B --max-num-batched-tokens N --max-num-seqs N --limit N (first N requests)\n"
        "  --out DIR             where plan.md, plan.csv and the plots (PNG, SVG) go (required)\n"
        "  --shard i/N           simulate every N-th sweep point from i into DIR/data (default: the\n"
        "                        launcher's environment, as replay); the shard that completes the set\n"
        "                        writes the plan; a run without shards reuses a complete set\n"
        "  Exit status: 0 done (a shard: its points written), 1 a simulation or plot failed, 2 usage\n"
        "  error or bad input (a --db or profile:DB locked by another writer past\n"
        "  ATTNREPLAY_BUSY_TIMEOUT_MS, default 30000, included), 3 the summary could not be written\n"
        "  to stdout (DIR is written; a 1 or 2 stays, said on stderr too).\n",
        ar_model_preset_names(), ar_device_names());
}

static const char *fmt_ms(char *buf, size_t len, double seconds)
{
    if (!isfinite(seconds)) snprintf(buf, len, "-");
    else snprintf(buf, len, "%.1f", seconds * 1e3);
    return buf;
}

static void write_points_table(FILE *f, const sweep_point *points, int count, bool markdown)
{
    char a[32], b[32], c[32], d[32], e[32], g[32];
    if (markdown)
        fputs("| rate x | KV blocks | finished | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | TPOT p50 ms | "
              "TPOT p90 ms | TPOT p99 ms | out tok/s | preempt/req | KV use | SLO |\n"
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n", f);
    else {
        fprintf(f, "%7s %9s %9s %9s %9s %9s %9s %9s %9s %10s %8s %6s %s\n", "rate", "KV", "finished",
                "TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50", "TPOT p90", "TPOT p99", "output", "preempt", "KV use",
                "SLO");
        fprintf(f, "%7s %9s %9s %9s %9s %9s %9s %9s %9s %10s %8s %6s\n", "(x)", "(blocks)", "(of reqs)", "(ms)",
                "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(tok/s)", "(/req)", "(%)");
    }
    for (int i = 0; i < count; i++) {
        const sweep_point *p = &points[i];
        char fin[32];
        snprintf(fin, sizeof fin, "%d/%d", p->finished, p->requests);
        if (markdown)
            fprintf(f, "| %.3g | %d | %s | %s | %s | %s | %s | %s | %s | %.0f | %.3f | %.0f%% | %s |\n",
                    p->rate, p->kv_blocks, fin, fmt_ms(a, sizeof a, p->ttft[0]), fmt_ms(b, sizeof b, p->ttft[1]),
                    fmt_ms(c, sizeof c, p->ttft[2]), fmt_ms(d, sizeof d, p->tpot[0]), fmt_ms(e, sizeof e, p->tpot[1]),
                    fmt_ms(g, sizeof g, p->tpot[2]), p->throughput, p->preemptions_per_req,
                    100.0 * p->kv_usage_mean, p->slo_ok ? "met" : "missed");
        else
            fprintf(f, "%7.3g %9d %9s %9s %9s %9s %9s %9s %9s %10.0f %8.3f %5.0f%% %s\n", p->rate,
                    p->kv_blocks, fin, fmt_ms(a, sizeof a, p->ttft[0]), fmt_ms(b, sizeof b, p->ttft[1]),
                    fmt_ms(c, sizeof c, p->ttft[2]), fmt_ms(d, sizeof d, p->tpot[0]), fmt_ms(e, sizeof e, p->tpot[1]),
                    fmt_ms(g, sizeof g, p->tpot[2]), p->throughput, p->preemptions_per_req,
                    100.0 * p->kv_usage_mean, p->slo_ok ? "met" : "missed");
    }
}

/* Writes data/plan_kv<N>.csv per KV size and renders the sweep charts; returns failures. */
/* answers[k]: the largest rate scale meeting the SLO at kv_blocks[k] (bisected), NAN when
 * there is none within the sweep; drawn as dashed verticals on the latency charts. */
static int render_plan_plots(const plan_args *a, const sweep_point *points, const int *kv_blocks,
                             const double *answers, const fit_sample *samples, size_t num_samples,
                             char notes[][256])
{
    char err[1024], path[4096];
    int failures = 0;
    for (int k = 0; k < a->num_kv; k++) {
        snprintf(path, sizeof path, "%s/data/plan_kv%d.csv", a->out_dir, kv_blocks[k]);
        FILE *f = fopen(path, "w");
        if (!f) { fprintf(stderr, "plan: %s: cannot write: %s\n", path, strerror(errno)); return 1; }
        fprintf(f, "# rate_scale,ttft_p50_s,ttft_p90_s,ttft_p99_s,tpot_p50_ms,tpot_p90_ms,tpot_p99_ms,"
                   "output_tokens_per_s,preemptions_per_request,finished_fraction\n");
        for (int r = 0; r < a->num_rates; r++) {
            const sweep_point *p = &points[k * a->num_rates + r];
            fprintf(f, "%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g\n", p->rate, p->ttft[0],
                    p->ttft[1], p->ttft[2], p->tpot[0] * 1e3, p->tpot[1] * 1e3, p->tpot[2] * 1e3,
                    p->throughput, p->preemptions_per_req,
                    p->requests ? (double)p->finished / p->requests : 0.0);
        }
        if (fclose(f) != 0) return 1;
    }
    static const struct { const char *name, *title, *ylabel; int col; int slo_metric; double slo_scale; } charts[] = {
        { "plan_ttft", "Simulated TTFT p90 against arrival rate", "TTFT p90 (s)", 3, SLO_TTFT, 1.0 },
        { "plan_tpot", "Simulated TPOT p90 against arrival rate", "TPOT p90 (ms)", 6, SLO_TPOT, 1e3 },
        { "plan_throughput", "Simulated output throughput against arrival rate", "output tokens per second (tok/s)", 8, -1, 0 },
        { "plan_preemptions", "Simulated preemptions against arrival rate", "preemptions per request", 9, -1, 0 },
    };
    for (size_t c = 0; c < sizeof charts / sizeof charts[0]; c++) {
        ar_plot plot;
        memset(&plot, 0, sizeof plot);
        snprintf(plot.name, sizeof plot.name, "%s", charts[c].name);
        snprintf(plot.title, sizeof plot.title, "%s (%s, %s)", charts[c].title, a->model, a->device);
        snprintf(plot.xlabel, sizeof plot.xlabel, "arrival-rate scale (x the workload's rate)");
        snprintf(plot.ylabel, sizeof plot.ylabel, "%s", charts[c].ylabel);
        plot.logx = a->num_rates > 1 && a->rates[a->num_rates - 1] / a->rates[0] > 8;
        plot.xmin = plot.logx ? a->rates[0] / 1.3 : 0;
        plot.xmax = a->rates[a->num_rates - 1] * (plot.logx ? 1.3 : 1.1);
        size_t used = (size_t)snprintf(plot.xtics, sizeof plot.xtics, "(");   /* a tic at every tested rate */
        for (int r = 0; r < a->num_rates && used + 24 < sizeof plot.xtics; r++)
            used += (size_t)snprintf(plot.xtics + used, sizeof plot.xtics - used, "%s%g", r ? ", " : "", a->rates[r]);
        snprintf(plot.xtics + used, sizeof plot.xtics - used, ")");
        /* TTFT spans decades once the queue builds: a log axis keeps the part under the SLO
         * readable.  The range holds the data and every SLO line with room above. */
        plot.logy = charts[c].slo_metric == SLO_TTFT;
        double lo = INFINITY, hi = 0;
        for (int i = 0; i < a->num_rates * a->num_kv; i++) {
            const sweep_point *p = &points[i];
            double v = charts[c].col == 3 ? p->ttft[1] : charts[c].col == 6 ? p->tpot[1] * 1e3
                     : charts[c].col == 8 ? p->throughput : p->preemptions_per_req;
            if (isfinite(v) && v > 0 && v < lo) lo = v;
            if (isfinite(v) && v > hi) hi = v;
        }
        for (int k = 0; k < a->num_kv; k++) {
            char csv[96], label[96], cols[16];
            snprintf(csv, sizeof csv, "data/plan_kv%d.csv", kv_blocks[k]);
            snprintf(label, sizeof label, "%d KV blocks", kv_blocks[k]);
            snprintf(cols, sizeof cols, "1:%d", charts[c].col);
            ar_plot_add(&plot, label, csv, cols, "linespoints lw 2 pt 7");
        }
        for (int t = 0; t < a->num_slo; t++) {
            if ((int)a->slo[t].metric != charts[c].slo_metric || a->slo[t].quantile != 0.9) continue;
            char function[64], label[96];
            double limit = a->slo[t].limit_s * charts[c].slo_scale;
            snprintf(function, sizeof function, "%.9g", limit);
            snprintf(label, sizeof label, "SLO %s", a->slo[t].text);
            ar_plot_add_function(&plot, label, function, "lines lw 2 dt 2 lc rgb '#cc0000'");
            if (limit > hi) hi = limit;
            if (limit < lo) lo = limit;
        }
        if (hi > 0) {
            plot.ymin = plot.logy ? lo / 2 : 0;
            plot.ymax = plot.logy ? hi * 2 : hi * 1.15;
        }
        /* the answers: the largest load meeting the SLO, per KV size */
        for (int k = 0; charts[c].slo_metric >= 0 && k < a->num_kv; k++) {
            if (!isfinite(answers[k])) continue;
            char label[160];
            snprintf(label, sizeof label, "largest rate meeting the SLO, %d KV blocks: x%.3g", kv_blocks[k],
                     answers[k]);
            ar_plot_add_vline(&plot, answers[k], k + 1, label);
        }
        if (ar_plot_render(a->out_dir, &plot, err, sizeof err) != 0) {
            fprintf(stderr, "plan: %s\n", err);
            snprintf(notes[c], 256, "not drawn: %.200s", err);
            failures++;
        }
    }
    if (samples && num_samples) {
        snprintf(path, sizeof path, "%s/data/plan_fit.csv", a->out_dir);
        FILE *f = fopen(path, "w");
        if (!f) {
            fprintf(stderr, "plan: %s: cannot write: %s\n", path, strerror(errno));
            return failures + 1;
        }
        fprintf(f, "# measured_us_per_layer,predicted_us_per_layer,held_out\n");
        double lo = INFINITY, hi = 0;
        for (size_t i = 0; i < num_samples; i++) {
            const fit_sample *s = &samples[i];
            fprintf(f, "%.6g,%.6g,%d\n", s->time_s * 1e6, s->predicted_s * 1e6, !s->train);
            double m = fmin(s->time_s, s->predicted_s) * 1e6, x = fmax(s->time_s, s->predicted_s) * 1e6;
            if (m > 0 && m < lo) lo = m;
            if (x > hi) hi = x;
        }
        if (fclose(f) != 0) return failures + 1;
        ar_plot plot;
        memset(&plot, 0, sizeof plot);
        snprintf(plot.name, sizeof plot.name, "plan_fit");
        snprintf(plot.title, sizeof plot.title, "Attention step-time model: predicted against measured");
        snprintf(plot.xlabel, sizeof plot.xlabel, "measured attention time per layer (µs)");
        snprintf(plot.ylabel, sizeof plot.ylabel, "predicted attention time per layer (µs)");
        plot.logx = plot.logy = true;
        plot.xmin = plot.ymin = lo / 1.5;
        plot.xmax = plot.ymax = hi * 1.5;
        ar_plot_add(&plot, "fitting steps", "data/plan_fit.csv", "1:($3 == 0 ? $2 : NaN)", "points pt 7 ps 0.6");
        ar_plot_add(&plot, "held-out steps", "data/plan_fit.csv", "1:($3 == 1 ? $2 : NaN)", "points pt 5 ps 0.8");
        ar_plot_add_function(&plot, "perfect prediction", "x", "lines lw 1 dt 2 lc rgb '#777777'");
        if (ar_plot_render(a->out_dir, &plot, err, sizeof err) != 0) {
            fprintf(stderr, "plan: %s\n", err);
            snprintf(notes[4], 256, "not drawn: %.200s", err);
            failures++;
        }
    }
    return failures;
}

/* The step-time model the simulation uses, as one paragraph; step_time is --step-time's MODEL
 * (NULL when plan uses roofline:DEVICE). */
static void write_fit_text(FILE *f, const ar_plan_fit *fit, const ar_steptime *st, bool have_fit,
                           bool applied, const char *db, const char *step_time)
{
    if (st->kind == AR_STEPTIME_PROFILE) {
        fprintf(f, "Step-time model: measured profile of %s on '%s' (tp %d): GEMMs and attention interpolated "
                   "(attention x %.3f from %d replayed steps), overhead %.3g ms.\n", st->profile.model,
                st->profile.device, st->profile.tp, st->attn_scale, st->profile.replay_steps, st->overhead_s * 1e3);
        return;
    }
    if (st->kind == AR_STEPTIME_CONSTANT) {
        fprintf(f, "Step-time model: constant, every step takes %.6g s whatever it runs (--step-time %s).\n",
                st->constant_s, step_time ? step_time : "");
        return;
    }
    if (st->kind == AR_STEPTIME_LINEAR) {
        fprintf(f, "Step-time model: linear, t = %.6g s + %.6g s x tokens + %.6g s x requests + %.6g s x KV tokens "
                   "(--step-time %s).\n", st->lin_base_s, st->lin_per_token_s, st->lin_per_req_s,
                st->lin_per_kv_token_s, step_time ? step_time : "");
        return;
    }
    if (st->kind == AR_STEPTIME_FITTED) {
        fprintf(f, "Step-time model: the simulator's roofline on %s with its attention term fitted on %d replayed "
                   "steps, %.3g s + %.3g s x tokens + %.3g s x requests + %.3g s x KV tokens over all layers "
                   "(--step-time %s): bw_eff %.3g, gemm_eff %.3g, overhead %.3g ms.\n", st->device.name,
                st->fit_steps, st->fit_coef[0], st->fit_coef[1], st->fit_coef[2], st->fit_coef[3],
                step_time ? step_time : "", st->bw_efficiency, st->gemm_efficiency, st->overhead_s * 1e3);
        return;
    }
    if (!have_fit && step_time) {
        fprintf(f, "Step-time model: the simulator's roofline on %s (--step-time %s): attn_eff %.3g, bw_eff %.3g, "
                   "gemm_eff %.3g, overhead %.3g ms.\n", st->device.name, step_time, st->attn_efficiency,
                st->bw_efficiency, st->gemm_efficiency, st->overhead_s * 1e3);
        return;
    }
    if (!have_fit) {
        fprintf(f, "Step-time model: the simulator's roofline with its default efficiencies "
                   "(no --db given): attn_eff %.3g, bw_eff %.3g, gemm_eff %.3g, overhead %.3g ms.\n",
                st->attn_efficiency, st->bw_efficiency, st->gemm_efficiency, st->overhead_s * 1e3);
        return;
    }
    fprintf(f, "Attention model fitted from %zu run(s) in %s measured on %s, per layer and step:\n"
               "  t = %.3g us + max(bytes / (%.3g x %.0f GB/s), FLOPs / (%.3g x %.0f TFLOP/s))\n"
               "  (ceilings: %s)\n"
               "  error: fitting steps %zu, mean abs error %.1f%%; held-out steps %zu (every 5th), "
               "mean %.1f%%, median %.1f%%, p90 %.1f%%\n",
            fit->runs, db, fit->device, fit->launch_s * 1e6, fit->bw_eff, fit->copy_gbps,
            fit->attn_eff, fit->bf16_tflops, fit->ceilings_source, fit->train_steps,
            100.0 * fit->train_mape, fit->test_steps, 100.0 * fit->test_mape,
            100.0 * fit->test_median_ape, 100.0 * fit->test_p90_ape);
    if (!applied) {
        fprintf(f, "The runs were not measured on %s, so the simulation uses the roofline defaults: "
                   "attn_eff %.3g, bw_eff %.3g, gemm_eff %.3g, overhead %.3g ms.\n", st->device.name,
                st->attn_efficiency, st->bw_efficiency, st->gemm_efficiency, st->overhead_s * 1e3);
        return;
    }
    fprintf(f, "Simulator roofline on %s: attn_eff %.3g, bw_eff %.3g (of datasheet %.0f TFLOP/s, "
               "%.0f GB/s; bw_eff also applies to weight streaming), gemm_eff %.3g (default), "
               "overhead %.3g ms per step (3 ms default + launch x layers).\n",
            st->device.name, st->attn_efficiency, st->bw_efficiency, st->device.peak_flops / 1e12,
            st->device.mem_bw / 1e9, st->gemm_efficiency, st->overhead_s * 1e3);
}

/* ---- the sweep over shards ------------------------------------------------------------------- */

static uint64_t fnv_bytes(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* What the sweep points depend on, hashed: the arguments that shape them, the workload file's
 * bytes, the step-time model as write_fit_text states it (the fit included). */
static uint64_t sweep_fingerprint(const plan_args *a, const int *kv_blocks, const char *fit_text)
{
    uint64_t h = 1469598103934665603ull;
    char buf[8192];
    int n = snprintf(buf, sizeof buf, "workload=%s model=%s device=%s step_time=%s block=%d batched=%d seqs=%d "
                     "limit=%d slo=%s fit=%s rates=", a->workload, a->model, a->device, a->step_time ? a->step_time : "",
                     a->block_size, a->max_batched, a->max_seqs, a->limit, a->slo_text ? a->slo_text : "", fit_text);
    h = fnv_bytes(h, buf, n > 0 && (size_t)n < sizeof buf ? (size_t)n : sizeof buf);
    for (int r = 0; r < a->num_rates; r++) {
        n = snprintf(buf, sizeof buf, "%.17g,", a->rates[r]);
        h = fnv_bytes(h, buf, (size_t)n);
    }
    for (int k = 0; k < a->num_kv; k++) {
        n = snprintf(buf, sizeof buf, "kv%d,", kv_blocks[k]);
        h = fnv_bytes(h, buf, (size_t)n);
    }
    const char *colon = strchr(a->workload, ':');
    FILE *f = colon && strncmp(a->workload, "synthetic:", 10) != 0 ? fopen(colon + 1, "rb") : NULL;
    size_t got;
    while (f && (got = fread(buf, 1, sizeof buf, f)) > 0) h = fnv_bytes(h, buf, got);
    if (f) fclose(f);
    return h;
}

static void shard_file(const plan_args *a, int shard, int count, char *path, size_t len)
{
    snprintf(path, len, "%s/data/sweep-shard-%d-of-%d.csv", a->out_dir, shard, count);
}

/* Writes this shard's points (p % count == shard) with the fingerprint; 0 or -1 with err. */
static int write_shard_points(const plan_args *a, uint64_t fp, int shard, int count, const sweep_point *points,
                              size_t n, char *err, size_t err_len)
{
    char path[4200], tmp[4300];
    shard_file(a, shard, count, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, err_len, "%.2000s: cannot write: %s", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "# attnreplay plan sweep points, shard %d of %d, fingerprint %016llx\n", shard, count,
            (unsigned long long)fp);
    fprintf(f, "# point,rate,kv_blocks,requests,finished,skipped,ttft_p50,ttft_p90,ttft_p99,tpot_p50,tpot_p90,"
               "tpot_p99,e2e_p50,e2e_p90,e2e_p99,throughput,preemptions_per_req,kv_usage_mean,duration,slo_ok\n");
    for (size_t i = 0; i < n; i++) {
        if (!ar_shard_owns(i, shard, count)) continue;
        const sweep_point *p = &points[i];
        fprintf(f, "%zu,%.17g,%d,%d,%d,%d", i, p->rate, p->kv_blocks, p->requests, p->finished, p->skipped);
        const double *v[3] = {p->ttft, p->tpot, p->e2e};
        for (int m = 0; m < 3; m++)
            for (int q = 0; q < 3; q++) fprintf(f, ",%.17g", v[m][q]);
        fprintf(f, ",%.17g,%.17g,%.17g,%.17g,%d\n", p->throughput, p->preemptions_per_req, p->kv_usage_mean,
                p->duration, p->slo_ok);
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        snprintf(err, err_len, "%.2000s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Loads shard's file into points when it carries fingerprint fp and holds each of its points;
 * true when it did. */
static bool load_shard_file(const plan_args *a, uint64_t fp, int shard, int count, sweep_point *points, size_t n)
{
    char path[4200], line[2048];
    shard_file(a, shard, count, path, sizeof path);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    unsigned long long got_fp = 0;
    bool ok = fgets(line, sizeof line, f) && sscanf(line, "# attnreplay plan sweep points, shard %*d of %*d, "
                                                          "fingerprint %llx", &got_fp) == 1 && got_fp == fp;
    size_t expected = 0, seen = 0;
    for (size_t i = 0; i < n; i++) expected += ar_shard_owns(i, shard, count);
    while (ok && fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        sweep_point p;
        memset(&p, 0, sizeof p);
        size_t idx;
        int slo = 0, used = 0;
        int fields = sscanf(line, "%zu,%lf,%d,%d,%d,%d,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%d%n", &idx,
                            &p.rate, &p.kv_blocks, &p.requests, &p.finished, &p.skipped, &p.ttft[0], &p.ttft[1],
                            &p.ttft[2], &p.tpot[0], &p.tpot[1], &p.tpot[2], &p.e2e[0], &p.e2e[1], &p.e2e[2],
                            &p.throughput, &p.preemptions_per_req, &p.kv_usage_mean, &p.duration, &slo, &used);
        if (fields != 20 || idx >= n || !ar_shard_owns(idx, shard, count)) {
            ok = false;
            break;
        }
        p.slo_ok = slo != 0;
        points[idx] = p;
        seen++;
    }
    fclose(f);
    return ok && seen == expected;
}

/* Loads every shard's points of a count-shard sweep; true when all are there. */
static bool load_shard_set(const plan_args *a, uint64_t fp, int count, sweep_point *points, size_t n)
{
    for (int k = 0; k < count; k++)
        if (!load_shard_file(a, fp, k, count, points, n)) return false;
    return true;
}

/* A complete set of shard files in DIR/data for this sweep, of any shard count: its count, or 0. */
static int find_shard_set(const plan_args *a, uint64_t fp, sweep_point *points, size_t n)
{
    for (int count = 2; count <= 1024; count++) {
        char path[4200];
        shard_file(a, 0, count, path, sizeof path);
        if (access(path, R_OK) != 0) continue;
        if (load_shard_set(a, fp, count, points, n)) return count;
    }
    return 0;
}

/* ---- the command ----------------------------------------------------------------------------- */

static int parse_plan_args(int argc, char **argv, plan_args *a)
{
    memset(a, 0, sizeof *a);
    a->max_batched = 2048;
    a->max_seqs = 128;
    a->refine = 4;
    const char *rates = "0.5,1,2,4", *kv_blocks = NULL, *kv_mem = NULL;
    char err[512];
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) { plan_usage(stdout); return 1; }
        if (!strcmp(arg, "--force-fit")) { a->force_fit = true; continue; }
        if (arg[0] != '-' || i + 1 >= argc) {
            fprintf(stderr, "plan: %s '%s'\n", arg[0] == '-' ? "option needs a value:" : "unexpected argument", arg);
            plan_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        int *int_target = NULL;
        if (!strcmp(arg, "--workload")) a->workload = v;
        else if (!strcmp(arg, "--model")) a->model = v;
        else if (!strcmp(arg, "--device")) a->device = v;
        else if (!strcmp(arg, "--db")) a->db = v;
        else if (!strcmp(arg, "--out")) ar_rd_dir_name(v, a->out_dir, sizeof a->out_dir);
        else if (!strcmp(arg, "--rates")) rates = v;
        else if (!strcmp(arg, "--kv-blocks")) kv_blocks = v;
        else if (!strcmp(arg, "--kv-mem")) kv_mem = v;
        else if (!strcmp(arg, "--slo")) a->slo_text = v;
        else if (!strcmp(arg, "--step-time")) a->step_time = v;
        else if (!strcmp(arg, "--shard")) a->shard_text = v;
        else if (!strcmp(arg, "--block-size")) int_target = &a->block_size;
        else if (!strcmp(arg, "--max-num-batched-tokens")) int_target = &a->max_batched;
        else if (!strcmp(arg, "--max-num-seqs")) int_target = &a->max_seqs;
        else if (!strcmp(arg, "--limit")) int_target = &a->limit;
        else if (!strcmp(arg, "--refine")) int_target = &a->refine;
        else if (!strcmp(arg, "--run")) {
            if (a->num_runs == PLAN_MAX_POINTS || ar_rd_parse_run_id(v, &a->runs[a->num_runs]) != 0) {
                fprintf(stderr, "plan: --run '%s': expected a run id\n", v);
                return 2;
            }
            a->num_runs++;
        } else {
            fprintf(stderr, "plan: unknown option '%s'\n", arg);
            plan_usage(stderr);
            return 2;
        }
        if (int_target) {
            char *end = NULL;
            long n = strtol(v, &end, 10);
            if (end == v || *end || n < (int_target == &a->refine ? 0 : 1) || n > (1L << 30)) {
                fprintf(stderr, "plan: %s '%s': expected a positive integer\n", arg, v);
                return 2;
            }
            *int_target = (int)n;
        }
    }
    if (!a->workload || !a->model || !a->device) {
        fprintf(stderr, "plan: --workload, --model and --device are required\n");
        plan_usage(stderr);
        return 2;
    }
    if (!a->out_dir[0]) {
        fprintf(stderr, "plan: --out DIR is required (plan.md, plan.csv and the plots go there)\n");
        plan_usage(stderr);
        return 2;
    }
    if (kv_blocks && kv_mem) {
        fprintf(stderr, "plan: give --kv-blocks or --kv-mem, not both\n");
        return 2;
    }
    if (parse_list(rates, a->rates, &a->num_rates, false) != 0) {
        fprintf(stderr, "plan: --rates '%s': expected positive numbers like 0.5,1,2\n", rates);
        return 2;
    }
    a->kv_is_mem = kv_mem != NULL;
    const char *kv = kv_mem ? kv_mem : kv_blocks ? kv_blocks : "8192,32768";
    if (parse_list(kv, a->kv_values, &a->num_kv, a->kv_is_mem) != 0) {
        fprintf(stderr, "plan: --kv-%s '%s': expected positive %s\n", kv_mem ? "mem" : "blocks", kv,
                kv_mem ? "sizes like 20GiB,40GiB" : "block counts like 8192,32768");
        return 2;
    }
    if (a->num_runs && !a->db) {
        fprintf(stderr, "plan: --run needs --db\n");
        return 2;
    }
    if (a->slo_text && parse_slo(a->slo_text, a->slo, &a->num_slo, err, sizeof err) != 0) {
        fprintf(stderr, "plan: %s\n", err);
        return 2;
    }
    return 0;
}

/* Sorts rates ascending so "largest scale meeting the SLO" reads along the sweep. */
static int compare_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int ar_plan_main(int argc, char **argv)
{
    plan_args a;
    int rc = parse_plan_args(argc, argv, &a);
    if (rc) return rc == 1 ? 0 : rc;
    qsort(a.rates, (size_t)a.num_rates, sizeof a.rates[0], compare_double);
    const ar_model_preset *preset = ar_model_preset_find(a.model);
    if (!preset) {
        fprintf(stderr, "plan: unknown --model '%s' (%s)\n", a.model, ar_model_preset_names());
        return 2;
    }
    const ar_device_spec *device = ar_device_find(a.device);
    if (!device) {
        fprintf(stderr, "plan: unknown --device '%s' (%s)\n", a.device, ar_device_names());
        return 2;
    }
    {   /* the output directory before any work: a bad one costs nothing */
        char data_dir[4200], err[4400];
        snprintf(data_dir, sizeof data_dir, "%s/data", a.out_dir);
        if (ar_output_dir_prepare(a.out_dir, err, sizeof err) != 0 ||
            ar_output_dir_prepare(data_dir, err, sizeof err) != 0) {
            fprintf(stderr, "plan: --out %s\n", err);
            return 2;
        }
    }
    if (a.block_size == 0) a.block_size = preset->default_block_size;
    int kv_blocks[PLAN_MAX_POINTS];
    for (int k = 0; k < a.num_kv; k++) {
        double blocks = a.kv_values[k];
        if (a.kv_is_mem)
            blocks = floor(blocks / (double)ar_kv_bytes_per_block(&preset->model, a.block_size, AR_BF16));
        if (blocks < 2 || blocks > (double)(1 << 30)) {
            fprintf(stderr, "plan: KV size %g gives %.0f blocks; need 2 .. 2^30\n", a.kv_values[k], blocks);
            return 2;
        }
        kv_blocks[k] = (int)blocks;
    }

    char err[AR_ERR_MAX + 2048];
    ar_steptime steptime;
    char spec[1024];
    snprintf(spec, sizeof spec, "roofline:%s", a.device);
    if (a.step_time && a.db) {
        fprintf(stderr, "plan: give --db (an attention fit) or --step-time, not both\n");
        return 2;
    }
    if (ar_steptime_parse(a.step_time ? a.step_time : spec, preset, &steptime, err, sizeof err) != 0) {
        fprintf(stderr, "plan: %s\n", err);
        return 2;
    }
    ar_steptime_set_engine(&steptime, a.max_seqs);
    ar_plan_fit fit;
    memset(&fit, 0, sizeof fit);
    fit_sample *samples = NULL;
    size_t num_samples = 0;
    bool fit_applied = false;
    if (a.db) {
        if (fit_db(a.db, a.runs, a.num_runs, a.device, &fit, &samples, &num_samples, err, sizeof err) != 0) {
            fprintf(stderr, "plan: %s\n", err);
            return 2;
        }
        fit_applied = strcasestr(fit.device, a.device) != NULL || a.force_fit;
        if (!fit_applied)
            fprintf(stderr, "plan: warning: the runs were measured on '%s', not on '%s'; the fit "
                    "and its error are reported but the simulation keeps the roofline defaults "
                    "(--force-fit applies it anyway)\n", fit.device, a.device);
        if (fit_applied) {
            steptime.bw_efficiency = fit.bw_eff * fit.copy_gbps * 1e9 / device->mem_bw;
            steptime.attn_efficiency = fit.attn_eff * fit.bf16_tflops * 1e12 / device->peak_flops;
            steptime.overhead_s += fit.launch_s * preset->model.num_layers;
        }
    }
    write_fit_text(stdout, &fit, &steptime, a.db != NULL, fit_applied, a.db ? a.db : "", a.step_time);

    ar_launch launch;
    if (ar_launch_detect(a.shard_text, environ, &launch, err, sizeof err) != 0) {
        fprintf(stderr, "plan: %s\n", err);
        free(samples);
        return 2;
    }
    char *fit_text = NULL;
    size_t fit_len = 0;
    FILE *mem = open_memstream(&fit_text, &fit_len);
    if (mem) {
        write_fit_text(mem, &fit, &steptime, a.db != NULL, fit_applied, a.db ? a.db : "", a.step_time);
        fclose(mem);
    }
    const uint64_t fingerprint = sweep_fingerprint(&a, kv_blocks, fit_text ? fit_text : "");
    free(fit_text);

    size_t num_points = (size_t)a.num_rates * (size_t)a.num_kv;
    sweep_point *points = calloc(num_points, sizeof *points);
    if (!points) {
        free(samples);
        fprintf(stderr, "plan: out of memory\n");
        return 2;
    }
    bool progress = isatty(STDERR_FILENO);
    int failures = 0;
    bool bad_input = false;   /* a simulation refused its inputs (ar_sim_step -2): exit 2, as sim */
    size_t done = 0, mine = 0;
    for (size_t i = 0; i < num_points; i++) mine += ar_shard_owns(i, launch.shard, launch.count);
    const int reused = launch.count == 1 ? find_shard_set(&a, fingerprint, points, num_points) : 0;
    if (reused)
        printf("plan: the sweep points of %d shards in %s/data match this plan (fingerprint %016llx): no simulation\n",
               reused, a.out_dir, (unsigned long long)fingerprint);
    for (int r = 0; r < a.num_rates && !failures && !reused; r++) {
        bool needed = false;
        for (int k = 0; k < a.num_kv; k++)
            needed |= ar_shard_owns((size_t)k * a.num_rates + r, launch.shard, launch.count);
        if (!needed) continue;
        ar_workload wl;
        if (ar_workload_load(a.workload, a.block_size, 1.0 / a.rates[r], a.limit, &wl, err, sizeof err) != 0) {
            fprintf(stderr, "plan: %s\n", err);
            free(points);
            free(samples);
            return 2;
        }
        for (int k = 0; k < a.num_kv; k++) {
            if (!ar_shard_owns((size_t)k * a.num_rates + r, launch.shard, launch.count)) continue;
            sweep_point *p = &points[k * a.num_rates + r];
            p->rate = a.rates[r];
            p->kv_blocks = kv_blocks[k];
            if (progress)
                fprintf(stderr, "\rplan: simulating %zu/%zu (rate x%g, %d KV blocks, %d requests)   ",
                        done + 1, mine, a.rates[r], kv_blocks[k], wl.num_reqs);
            const int sim_rc = simulate(&a, preset, &steptime, &wl, kv_blocks[k], p, err, sizeof err);
            if (sim_rc != 0) {
                fprintf(stderr, "%splan: %s%s\n", progress ? "\n" : "", sim_rc == -2 ? "" : "simulation failed: ", err);
                failures++;
                bad_input |= sim_rc == -2;
                break;
            }
            done++;
        }
        ar_workload_free(&wl);
    }
    if (progress) fputs("\r\033[K", stderr);
    if (failures) {
        free(points);
        free(samples);
        return bad_input ? 2 : 1;
    }
    /* A shard: its points to DIR/data; the one that completes the set writes the plan. */
    char lock[4200] = "";
    if (launch.count > 1) {
        char path[4200];
        shard_file(&a, launch.shard, launch.count, path, sizeof path);
        if (write_shard_points(&a, fingerprint, launch.shard, launch.count, points, num_points, err, sizeof err) != 0) {
            fprintf(stderr, "plan: %s\n", err);
            free(points);
            free(samples);
            return 1;
        }
        printf("plan: shard %d/%d (%s): %zu of %zu sweep points -> %s\n", launch.shard, launch.count, launch.detail,
               mine, num_points, path);
        if (!load_shard_set(&a, fingerprint, launch.count, points, num_points)) {
            printf("plan: not every shard's points are in %s/data yet: the shard that completes the set writes the "
                   "plan (or run plan again without shards once all are there)\n", a.out_dir);
            free(points);
            free(samples);
            return 0;
        }
        snprintf(lock, sizeof lock, "%s/data/sweep-assemble.lock", a.out_dir);
        int fd = open(lock, O_CREAT | O_EXCL | O_WRONLY, 0644);
        if (fd < 0) {
            printf("plan: every shard's points are there and another shard is writing the plan (%s)\n", lock);
            free(points);
            free(samples);
            return 0;
        }
        close(fd);
        printf("plan: shard %d/%d completes the set of %d: writing the plan\n", launch.shard, launch.count,
               launch.count);
    }

    printf("\n%s on %s, workload %s, %d rate scale(s) x %d KV size(s):\n", a.model, a.device,
           a.workload, a.num_rates, a.num_kv);
    write_points_table(stdout, points, (int)num_points, false);
    /* The largest load meeting the SLO per KV size (refined by bisection between the last
     * tested scale that meets it and the next that does not), and the smallest tested KV size
     * meeting it per rate scale. */
    const char *target = a.num_slo ? a.slo_text : "completion of every request";
    char answers[2 * PLAN_MAX_POINTS][256];
    double best_rate[PLAN_MAX_POINTS];
    int num_answers = 0;
    for (int k = 0; k < a.num_kv; k++) {
        best_rate[k] = NAN;
        int last_ok = -1;
        for (int r = 0; r < a.num_rates && points[k * a.num_rates + r].slo_ok; r++) last_ok = r;
        char *answer = answers[num_answers++];
        if (last_ok < 0) {
            snprintf(answer, 256, "%d KV blocks: even the smallest tested rate scale x%g misses %s",
                     kv_blocks[k], a.rates[0], target);
        } else if (last_ok == a.num_rates - 1) {
            snprintf(answer, 256, "%d KV blocks: every tested rate scale meets %s; the largest "
                     "load is at least x%g (extend --rates)", kv_blocks[k], target, a.rates[last_ok]);
        } else {
            double best = a.rates[last_ok];
            const int refine_rc = refine_rate(&a, preset, &steptime, kv_blocks[k], a.rates[last_ok],
                                              a.rates[last_ok + 1], &best, err, sizeof err);
            if (refine_rc != 0) {
                fprintf(stderr, "plan: refining the rate: %s\n", err);
                failures++;
                bad_input |= refine_rc == -2;
            }
            snprintf(answer, 256, "%d KV blocks: largest rate scale meeting %s: about x%.3g "
                     "(x%g met, x%g missed; %d bisection steps)", kv_blocks[k], target, best,
                     a.rates[last_ok], a.rates[last_ok + 1], a.refine);
            best_rate[k] = best;
        }
    }
    double block_bytes = (double)ar_kv_bytes_per_block(&preset->model, a.block_size, AR_BF16);
    for (int r = 0; r < a.num_rates && a.num_kv > 1; r++) {
        int smallest = -1;
        for (int k = 0; k < a.num_kv; k++)
            if (points[k * a.num_rates + r].slo_ok && (smallest < 0 || kv_blocks[k] < kv_blocks[smallest]))
                smallest = k;
        char *answer = answers[num_answers++];
        if (smallest < 0)
            snprintf(answer, 256, "rate scale x%g: no tested KV size meets %s", a.rates[r], target);
        else
            snprintf(answer, 256, "rate scale x%g: smallest tested KV size meeting %s: %d blocks "
                     "(%.1f GiB of bf16 KV cache)", a.rates[r], target, kv_blocks[smallest],
                     kv_blocks[smallest] * block_bytes / 1073741824.0);
    }
    for (int i = 0; i < num_answers; i++) printf("%s\n", answers[i]);

    {
        char notes[5][256];
        memset(notes, 0, sizeof notes);
        failures += render_plan_plots(&a, points, kv_blocks, best_rate, samples, num_samples, notes);
        char path[4096];
        snprintf(path, sizeof path, "%s/plan.md", a.out_dir);
        FILE *f = fopen(path, "w");
        if (!f) {
            fprintf(stderr, "plan: %s: cannot write: %s\n", path, strerror(errno));
            failures++;
        } else {
            fprintf(f, "# Capacity plan: %s on %s\n\nWorkload `%s`; rate scales divide the arrival "
                       "times; KV sizes in blocks of %d tokens; token budget %d, max_num_seqs %d, "
                       "prefix caching on.\n\n## Step-time model\n\n```\n", a.model, a.device,
                    a.workload, a.block_size, a.max_batched, a.max_seqs);
            write_fit_text(f, &fit, &steptime, a.db != NULL, fit_applied, a.db ? a.db : "", a.step_time);
            fputs("```\n\n## Sweep\n\n", f);
            write_points_table(f, points, (int)num_points, true);
            fputs("\n## Answers\n\n", f);
            for (int i = 0; i < num_answers; i++) fprintf(f, "- %s\n", answers[i]);
            static const char *const plot_names[5] = { "plan_ttft", "plan_tpot", "plan_throughput",
                                                        "plan_preemptions", "plan_fit" };
            fputs("\n## Plots\n\n", f);
            for (int i = 0; i < 5; i++) {
                if (i == 4 && !num_samples) continue;
                if (notes[i][0]) fprintf(f, "- %s: %s\n", plot_names[i], notes[i]);
                else fprintf(f, "![%s](%s.png)\n\n", plot_names[i], plot_names[i]);
            }
            if (fclose(f) != 0) failures++;
        }
        snprintf(path, sizeof path, "%s/plan.csv", a.out_dir);
        f = fopen(path, "w");
        if (!f) fprintf(stderr, "plan: %s: cannot write: %s\n", path, strerror(errno));
        if (f) {
            fputs("rate_scale,kv_blocks,requests,finished,ttft_p50_s,ttft_p90_s,ttft_p99_s,tpot_p50_s,"
                  "tpot_p90_s,tpot_p99_s,output_tokens_per_s,preemptions_per_request,kv_usage_mean,slo_met\n", f);
            for (size_t i = 0; i < num_points; i++) {
                const sweep_point *p = &points[i];
                fprintf(f, "%.6g,%d,%d,%d,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%d\n", p->rate,
                        p->kv_blocks, p->requests, p->finished, p->ttft[0], p->ttft[1], p->ttft[2],
                        p->tpot[0], p->tpot[1], p->tpot[2], p->throughput, p->preemptions_per_req,
                        p->kv_usage_mean, p->slo_ok);
            }
            if (fclose(f) != 0) failures++;
        } else {
            failures++;
        }
        printf("plan: wrote %s/plan.md, plan.csv and plots\n", a.out_dir);
    }
    if (lock[0]) unlink(lock);
    free(points);
    free(samples);
    return bad_input ? 2 : failures ? 1 : 0;
}
