/* fidelity.c - `make fidelity`: the simulator against the two real vLLM runs of
 * ../shared/traces-public/vllm-runs-llmservingsim, calibrated on one run, evaluated on the other.
 *
 * Protocol (both directions): the shared parameters of `roofline:DEVICE` are fitted on the
 * calibration run alone, in two stages.  Each device's bw_eff (the weight stream's fraction of the
 * data-sheet bandwidth) is not fitted: it is the device table's published copy measurement
 * (sim/presets.c), since one run's step timings cannot split a step's fixed cost between the weight
 * stream and gap (the ridge below).  Nor is kv_eff (attention's KV reads): it is the device table's
 * published measurement of vLLM's decode attention on that card, since the RTX 4090 run, its KV
 * cache full, cannot split its KV reads from gap either.  Stage 1, without simulation: gemm_scale
 * and gap (serial per-step GPU time) by Nelder-Mead against the run's own step timings (sim/stepfit.c: the step ends its requests' first and last tokens reveal,
 * the exact step counts between them, the batches rebuilt from the requests), least absolute
 * deviations of log(predicted / observed steps), then again without the intervals beyond 3 scaled
 * MADs of that fit.  What no stamp shows can be given to stage 1 from a simulation of the
 * calibration run (calibrate(), sim/README.md; default_hidden, FIDELITY_STAGE1 in the environment):
 * each interval's recompute prefill after preemptions, and each piece's requests held preempted
 * (waiting, so not decoding); both stages then refit until no term moves by 1% (at most
 * FID_MAX_REFITS refits).  The modes the full model does not use are reported at the end.
 * Stage 2, by simulation: attn_eff, overhead and per_req by coordinate descent,
 * minimising the per-request errors (RMS of the TTFT errors over the mean real TTFT plus RMS of
 * log TPOT ratios).  gemm_scale multiplies each device's measured GEMM efficiency (its preset's
 * table, sim/presets.c), so the GEMM rate transfers relative to what the device is measured to
 * reach, not to its data-sheet peak.  The other run is then simulated once with those
 * parameters on its own device's numbers.  Nothing from the evaluation run enters the fit.  Each
 * run keeps its engine configuration (meta.json: budget 2048, max_num_seqs, KV blocks: 2588 for
 * the RTX 4090; the RTX PRO 6000 run records no KV size, so 68 GB is taken - its simulated use
 * stays far below).  Then the KV-block sensitivity (the RTX 4090 run with 90..110% of its 2588
 * blocks), stage 1 along bw_eff (the calibration device's held at 0.6..1.0, the other stage-1 terms
 * refitted: on one device the weight stream and gap are both a constant per step), stage 1 along
 * gap (0..5 ms, the others refitted), and each term switched off (bw_eff fitted, and kv_eff
 * fitted as a fraction of the device's bw_eff, among them), recalibrated and evaluated; two rows
 * take the linear term from the candidate table of vLLM's measured linear layers (sim/presets.c),
 * pinned (stage 1 then fits gap alone) and with gemm_scale fitted over it.
 *
 * FIDELITY_STEPTIME=profile (`make fidelity-profiles`) runs the same protocol with each RTX card's
 * step time from its measured per-layer profile (profile:DB of LLMServingSim's profiles, converted
 * into sim/profiles/; FIDELITY_PROFILES names another folder) in place of the roofline: stage 1 fits
 * gap alone, stage 2 overhead and per_req; then stage 1 along gap and the per-step terms switched
 * off.  FIDELITY_PROFILE_ATTN chooses how the profiles' attention is looked up (llmservingsim,
 * separate, skew or prompts; below).
 *
 * Prints one table; exit 0 (the numbers are a report, not a pass/fail test), 2 when the public
 * runs are missing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../sim/sim.h"

typedef struct fid_run {
    const char *label, *dir, *device;
    int num_blocks, max_seqs;
    ar_workload wl;
    ar_stepfit_set steps;      /* the run's step timings (stage 1) */
    double origin;             /* the engine clock at the simulation's time 0 (the first row's queued_ts) */
} fid_run;

typedef struct fid_params {
    double gemm_scale;     /* the GEMMs' rate as a fraction of the device's measured GEMM ceiling */
    double bw_scale;       /* the weight stream's rate as a fraction of the device's measured copy bandwidth
                              (its table's bw_eff); 1 = pinned to the table; only the ridge below moves it */
    double bw_eff;         /* with bw_free only: one fitted bw_eff for both devices (a fraction of the data sheet) */
    double kv_eff;         /* with kv_fitted, KV reads: a fraction of the device's weight-stream rate (kv_eff x
                              bw_eff); with kv_absolute or bw_free, a fraction of the data-sheet bandwidth shared by
                              both devices; otherwise unused (the device table's measured kv_eff) */
    double attn_eff, overhead, per_req;
    double gap;            /* per-step serial GPU time (the step-time key gap) */
    const char *variant;   /* extra step-time keys ("" = the full model) */
    bool datasheet_gemm;   /* gemm_scale multiplies the data-sheet peak, not the measured ceiling */
    bool kv_tied;          /* kv_eff = bw_eff (one bandwidth efficiency for weights and KV) */
    bool no_gap;           /* gap stays 0 */
    bool gap_fixed;        /* gap stays at its start value (the second ridge below) */
    bool bw_free;          /* bw_eff fitted and shared by both devices (free along the ridge), not the tables' */
    bool kv_absolute;      /* kv_eff a fraction of the data sheet, shared, not of the device's bw_eff */
    bool kv_fitted;        /* kv_eff fitted in stage 1 rather than the device table's measured value */
    bool gemm_pinned;      /* gemm_scale stays 1 (the device table's measured GEMM rate as it is) */
    bool profiled_linear;  /* gemm_eff and bw_eff from the device's candidate table of vLLM's measured linear
                              layers (linear_gemm_eff, linear_bw_eff in sim/presets.c) */
    int hidden;            /* what stage 1 is told of the work no stamp shows (calibrate()): FID_STAMPS nothing,
                              FID_RECOMPUTE the simulated recompute prefill, FID_RECOMPUTE_WAITING that and the
                              requests the simulation holds preempted */
} fid_params;

enum { FID_STAMPS = 0, FID_RECOMPUTE = 1, FID_RECOMPUTE_WAITING = 2 };
static const char *const hidden_names[] = {"stamps", "recompute", "recompute+waiting"};
/* The full model's stage 1 (FIDELITY_STAGE1 in the environment replaces it for every calibration:
 * stamps, recompute or recompute+waiting). */
static int default_hidden = FID_RECOMPUTE_WAITING;

/* FIDELITY_STEPTIME=profile (`make fidelity-profiles`): each device's step time is profile:DB of its
 * card's measured per-layer profile (LLMServingSim's, converted: sim/profiles/), in place of the
 * roofline's efficiencies; only gap (stage 1), overhead and per_req (stage 2) are fitted.  The
 * databases are looked for in FIDELITY_PROFILES (default sim/profiles). */
static bool profile_mode = false;
static const char *profile_dir = "sim/profiles";
/* FIDELITY_PROFILE_ATTN: how the profile mode looks attention up (sim/profile.c): separate (the
 * default: each prompt alone, the largest with the decodes, no skew correction), llmservingsim
 * (the profiles' own, LLMServingSim's: a step's prompts as one lookup, the skew correction for
 * decodes of unequal contexts; measured and not adopted by its rule, sim/README.md), skew (the
 * correction alone), prompts (the prompts together alone). */
static const char *const profile_attn_names[] = {"llmservingsim", "separate", "skew", "prompts"};
static const char *const profile_attn_keys[] = {"", ",prompts_together=0,skew=0", ",prompts_together=0",
                                                ",skew=0"};
static int profile_attn = 1;

/* The gemm_eff one device runs with: the shared scale times the device's measured GEMM
 * efficiency (its preset's table), at most 1. */
static double device_gemm_eff(const fid_params *p, const char *device)
{
    const ar_device_spec *d = ar_device_find(device);
    double table = p->datasheet_gemm ? 1.0 : p->profiled_linear ? d->linear_gemm_eff : d->gemm_eff;
    return fmin(1.0, p->gemm_scale * table);
}

/* The bw_eff one device runs with: its table's measured copy fraction (times bw_scale, 1 unless on
 * the ridge), or with bw_free the one fitted value. */
static double device_bw_eff(const fid_params *p, const char *device)
{
    const ar_device_spec *d = ar_device_find(device);
    double table = p->profiled_linear ? d->linear_bw_eff : d->bw_eff;
    return p->bw_free ? p->bw_eff : fmin(1.0, p->bw_scale * table);
}

/* The kv_eff one device runs with: the device table's measured decode-attention rate; when fitted,
 * kv_eff times the device's bw_eff (the KV gather's rate relative to what a dense stream reaches on
 * that device, as gemm_scale is for the GEMMs), or the shared absolute value. */
static double device_kv_eff(const fid_params *p, const char *device)
{
    if (p->kv_tied) return device_bw_eff(p, device);
    if (!p->kv_fitted) return ar_device_find(device)->kv_eff;
    if (p->kv_absolute || p->bw_free) return p->kv_eff;
    return fmin(1.0, p->kv_eff * device_bw_eff(p, device));
}

/* Where a fit starts on a device: GEMMs at the measured ceiling, the device's bandwidth table,
 * KV reads at the weight stream's rate, no gap, the roofline's default CPU overhead. */
static fid_params start_params(const char *device, const char *variant)
{
    const ar_device_spec *d = ar_device_find(device);
    /* profile mode: the linear layers and attention are measured, so stage 1 fits gap alone */
    return (fid_params){.gemm_scale = 1.0, .bw_scale = 1.0, .bw_eff = d->bw_eff, .kv_eff = 1.0,
                        .attn_eff = d->attn_eff, .overhead = 0.003, .variant = variant, .hidden = default_hidden,
                        .gemm_pinned = profile_mode};
}

static int make_steptime(const fid_run *r, const fid_params *p, ar_steptime *st);

/* Request by request, simulated against real: the RMS of the TTFT errors over the run's mean
 * real TTFT, and the RMS of log(simulated / real TPOT).  Each request's TTFT is where the engine
 * had got to when it was first served, each TPOT the step time while it ran, so the two follow
 * the run's whole timeline rather than its two averages. */
typedef struct fid_per_req {
    double ttft_rms, tpot_rms;
} fid_per_req;

static void per_request_errors(const ar_sim *s, fid_per_req *out)
{
    double real_sum = 0, ttft_sq = 0, tpot_sq = 0;
    int n = 0, nt = 0;
    for (int i = 0; i < ar_sim_num_requests(s); i++) {
        const ar_workload_req *w = ar_sim_workload_req(s, i);
        ar_sim_req_info q;
        ar_sim_request(s, i, &q);
        if (q.status != AR_REQ_FINISHED || w->real_ttft < 0) continue;
        double e = (q.first_token - q.arrival) - w->real_ttft;
        real_sum += w->real_ttft;
        ttft_sq += e * e;
        n++;
        if (w->real_tpot > 0 && w->output_len > 1 && q.last_token > q.first_token) {
            double l = log((q.last_token - q.first_token) / (w->output_len - 1) / w->real_tpot);
            tpot_sq += l * l;
            nt++;
        }
    }
    out->ttft_rms = n && real_sum > 0 ? sqrt(ttft_sq / n) / (real_sum / n) : INFINITY;
    out->tpot_rms = nt ? sqrt(tpot_sq / nt) : INFINITY;
}

/* profile mode: the device's profile step time with the variant's keys, parsed once (a profile is
 * read from its database, ~130 KB), then given p's CPU terms and gap. */
static int make_profile_steptime(const fid_run *r, const fid_params *p, ar_steptime *st)
{
    static struct { char key[96]; ar_steptime st; } cache[8];
    static int cached = 0;
    char key[96], spec[1400], err[AR_ERR_MAX + 2048];
    snprintf(key, sizeof key, "%s%s", r->device, p->variant);
    int i = 0;
    while (i < cached && strcmp(cache[i].key, key) != 0) i++;
    if (i == cached) {
        if (cached == 8) { fprintf(stderr, "fidelity: too many profile step times\n"); return -1; }
        snprintf(spec, sizeof spec, "profile:%s/llama-3.1-8b.%s.llmservingsim.profile.db,device=%s%s%s", profile_dir,
                 r->device, r->device, profile_attn_keys[profile_attn], p->variant);
        if (ar_steptime_parse(spec, ar_model_preset_find("llama-3.1-8b"), &cache[i].st, err, sizeof err) != 0) {
            fprintf(stderr, "fidelity: %s\n", err);
            return -1;
        }
        snprintf(cache[i].key, sizeof cache[i].key, "%s", key);
        cached++;
    }
    *st = cache[i].st;
    st->overhead_s = p->overhead;
    st->per_req_overhead_s = p->per_req;
    st->gpu_gap_s = p->no_gap ? 0 : p->gap;
    ar_steptime_set_engine(st, r->max_seqs);
    return 0;
}

static int make_steptime(const fid_run *r, const fid_params *p, ar_steptime *st)
{
    if (profile_mode) return make_profile_steptime(r, p, st);
    const ar_model_preset *preset = ar_model_preset_find("llama-3.1-8b");
    char spec[256], err[AR_ERR_MAX + 2048];
    snprintf(spec, sizeof spec, "roofline:%s,gemm_eff=%g,attn_eff=%g,bw_eff=%g,kv_eff=%g,overhead=%g,per_req=%g,gap=%g%s",
             r->device, device_gemm_eff(p, r->device), p->attn_eff, device_bw_eff(p, r->device),
             device_kv_eff(p, r->device), p->overhead, p->per_req, p->gap, p->variant);
    if (ar_steptime_parse(spec, preset, st, err, sizeof err) != 0) {
        fprintf(stderr, "fidelity: %s\n", err);
        return -1;
    }
    ar_steptime_set_engine(st, r->max_seqs);
    return 0;
}

/* The recompute prefill of one simulated step: each scheduled request's tokens that lie below the
 * furthest it had computed before (recomputation after a preemption; prefix-cache hits on
 * resumption are not computed, so not counted).  furthest[] holds each request's furthest computed
 * token, indexed like ids (sorted request ids of the simulation). */
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static double step_recompute(const ar_step *st, const char **ids, int n, int *furthest)
{
    double tokens = 0;
    for (int e = 0; e < st->num_scheduled; e++) {
        const char *id = st->scheduled[e].req;
        int before = -1;
        for (int k = 0; k < st->num_new && before < 0; k++)
            if (strcmp(st->new_reqs[k].req, id) == 0) before = st->new_reqs[k].num_computed_tokens;
        for (int k = 0; k < st->num_cached && before < 0; k++)
            if (strcmp(st->cached[k].req, id) == 0) before = st->cached[k].num_computed_tokens;
        const char **hit = bsearch(&id, ids, (size_t)n, sizeof *ids, cmp_str);
        if (before < 0 || !hit) continue;
        int *far = &furthest[hit - ids], after = before + st->scheduled[e].num_tokens;
        if (*far > before) tokens += (after < *far ? after : *far) - before;
        if (after > *far) *far = after;
    }
    return tokens;
}

/* Stage-1 pieces in the order of their middles (the run's clock), for simulate_recording. */
typedef struct fid_piece {
    double middle;
    int sample;
} fid_piece;

static int cmp_piece(const void *a, const void *b)
{
    double x = ((const fid_piece *)a)->middle, y = ((const fid_piece *)b)->middle;
    return x < y ? -1 : x > y;
}

/* recompute: when not NULL, each stage-1 interval of r gets the recompute prefill of the simulated
 * steps that end in it (start, end] (the simulation's clock taken as the run's), [num_intervals],
 * and recompute[num_intervals] the run's total.  waiting: when not NULL, [stage-1 pieces x
 * requests]: for each piece, which requests the simulation holds preempted (waiting) in the step
 * that runs at the piece's middle (the first step to end after it; the same clock), the rows
 * indexed like the run's requests (the simulation's requests are the file's rows in order). */
static int simulate_recording(fid_run *r, const fid_params *p, int num_blocks, ar_fidelity *fid, ar_sim_summary *sum,
                              fid_per_req *per_req, double *recompute, bool *waiting)
{
    const ar_model_preset *preset = ar_model_preset_find("llama-3.1-8b");
    char err[AR_ERR_MAX + 2048];
    ar_sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (make_steptime(r, p, &cfg.steptime) != 0) return -1;
    ar_trace_header *h = &cfg.header;
    h->version = AR_TRACE_VERSION;
    h->model = preset->model;
    h->cache.block_size = 16;
    h->cache.num_blocks = num_blocks;
    h->cache.dtype = h->cache.kv_cache_dtype = AR_BF16;
    h->sched.max_num_batched_tokens = 2048;
    h->sched.max_num_seqs = r->max_seqs;
    h->sched.prefix_caching = true;
    cfg.num_sms = cfg.steptime.device.num_sms;
    ar_sim *s = ar_sim_create(&cfg, &r->wl, err, sizeof err);
    if (!s) {
        fprintf(stderr, "fidelity: %s\n", err);
        return -1;
    }
    const ar_step *st;
    int rc, n = ar_sim_num_requests(s), ni = r->steps.stats.num_intervals;
    const char **ids = recompute ? malloc((size_t)(n + 1) * sizeof *ids) : NULL;
    int *furthest = recompute ? calloc((size_t)n + 1, sizeof *furthest) : NULL;
    if (recompute) {
        if (!ids || !furthest) { free(ids); free(furthest); ar_sim_destroy(s); return -1; }
        for (int i = 0; i < n; i++) {
            ar_sim_req_info q;
            ar_sim_request(s, i, &q);
            ids[i] = q.id;
        }
        qsort(ids, (size_t)n, sizeof *ids, cmp_str);
        for (int k = 0; k <= ni; k++) recompute[k] = 0;
    }
    int num_pieces = r->steps.sample_start[ni], next_piece = 0;
    fid_piece *pieces = waiting ? malloc((size_t)(num_pieces + 1) * sizeof *pieces) : NULL;
    if (waiting) {
        bool same = n == r->steps.num_reqs;
        for (int i = 0; same && i < n; i++) same = ar_sim_workload_req(s, i)->prompt_len == r->steps.reqs[i].prompt_len;
        if (!pieces || !same) {
            if (pieces) fprintf(stderr, "fidelity: %s: the simulated requests (%d) are not the run's rows (%d) in order\n",
                                r->label, n, r->steps.num_reqs);
            free(ids); free(furthest); free(pieces); ar_sim_destroy(s);
            return -1;
        }
        for (int j = 0; j < num_pieces; j++) {
            const ar_stepfit_sample *sp = &r->steps.samples[j];
            pieces[j] = (fid_piece){sp->start_s + 0.5 * sp->length_s, j};
        }
        qsort(pieces, (size_t)num_pieces, sizeof *pieces, cmp_piece);
        memset(waiting, 0, (size_t)num_pieces * (size_t)n * sizeof *waiting);
    }
    while ((rc = ar_sim_step(s, &st, err, sizeof err)) == 1) {
        if (!recompute && !waiting) continue;
        double end = r->origin + st->time + ar_steptime_eval(&cfg.steptime, ar_sim_last_features(s));
        for (; waiting && next_piece < num_pieces && pieces[next_piece].middle < end; next_piece++) {
            bool *row = waiting + (size_t)pieces[next_piece].sample * (size_t)n;
            for (int i = 0; i < n; i++) {
                ar_sim_req_info q;
                ar_sim_request(s, i, &q);
                row[i] = q.status == AR_REQ_PREEMPTED;
            }
        }
        if (!recompute) continue;
        double tokens = step_recompute(st, ids, n, furthest);
        if (tokens <= 0) continue;
        recompute[ni] += tokens;
        for (int k = 0; k < ni; k++)
            if (end > r->steps.intervals[k].start && end <= r->steps.intervals[k].end) recompute[k] += tokens;
    }
    free(ids);
    free(furthest);
    free(pieces);
    if (rc == 0) rc = ar_sim_fidelity(s, fid);
    if (sum) ar_sim_summarize(s, sum);
    if (per_req) per_request_errors(s, per_req);
    ar_sim_destroy(s);
    return rc;
}

static int simulate(fid_run *r, const fid_params *p, int num_blocks, ar_fidelity *fid, ar_sim_summary *sum,
                    fid_per_req *per_req)
{
    return simulate_recording(r, p, num_blocks, fid, sum, per_req, NULL, NULL);
}

static double objective(const ar_fidelity *f, const fid_per_req *pr)
{
    (void)f;
    return pr->ttft_rms + pr->tpot_rms;
}

/* Every point the calibration tried, with its objective: the near-best ones show how well one
 * run determines the parameters. */
#define FID_MAX_TRIED 512
typedef struct fid_tried {
    fid_params p[FID_MAX_TRIED];
    double obj[FID_MAX_TRIED];
    int n;
} fid_tried;

static void remember(fid_tried *t, const fid_params *p, double obj)
{
    if (t && t->n < FID_MAX_TRIED) {
        t->p[t->n] = *p;
        t->obj[t->n++] = obj;
    }
}

#define FID_MAX_REFITS 6

/* What stage 1 found: its loss (mean |log(predicted / observed steps)|) over the kept intervals,
 * and how many of the run's intervals it kept. */
typedef struct fid_stage1 {
    double loss;
    int kept, rejected;
    int rounds;                /* calibrations run (1 + refits with the simulated hidden work) */
    bool converged;            /* the last refit moved no term by 1% (or the run hides nothing) */
    double recompute_tokens;   /* the simulated recompute prefill given to stage 1 in the last round */
    fid_params round_params[FID_MAX_REFITS + 1];   /* each calibration's result, [rounds] */
    double round_recompute[FID_MAX_REFITS + 1];    /* the recompute prefill each calibration was given */
    long round_waiting[FID_MAX_REFITS + 1];        /* the decodes each was told are waiting (piece entries) */
    double round_change[FID_MAX_REFITS + 1];       /* the largest relative move of a term from the round before */
} fid_stage1;

static double step_timing_loss(const fid_run *r, const fid_params *p)
{
    ar_steptime st;
    if (make_steptime(r, p, &st) != 0) return INFINITY;
    return ar_stepfit_loss(&r->steps, &st);
}

/* Stage 1's free terms as a vector: gemm_scale, bw_eff (with bw_free only: otherwise each device's
 * table pins it), kv_eff (with kv_fitted only, likewise), gap in ms; each kept within its bounds (a point outside is evaluated at the
 * bound plus a penalty, so the search turns back).  kv_eff relative to the device's bw_eff may exceed 1
 * (KV reads a little faster than the copy benchmark); the rate it gives is capped at the data sheet. */
static const double fit_lo[4] = {0.2, 0.2, 0.2, 0}, fit_hi[4] = {1.5, 1.0, 1.2, 10};

static double vector_loss(fid_run *r, const fid_params *base, const double *x, fid_params *out)
{
    double v[4], penalty = 0;
    for (int i = 0; i < 4; i++) {
        double hi = i == 2 && (base->kv_absolute || base->bw_free) ? 1.0 : fit_hi[i];
        v[i] = fmin(hi, fmax(fit_lo[i], x[i]));
        penalty += fabs(x[i] - v[i]);
    }
    fid_params p = *base;
    p.gemm_scale = v[0];
    if (base->bw_free) p.bw_eff = v[1];
    p.kv_eff = v[2];
    p.gap = base->no_gap ? 0 : base->gap_fixed ? base->gap : 1e-3 * v[3];
    if (out) *out = p;
    return step_timing_loss(r, &p) + penalty;
}

/* Nelder-Mead over the free terms (those the variant does not hold), from the start point, then
 * once more from the best point with a fresh simplex: the LAD loss has narrow diagonal valleys
 * (a slower weight stream traded for faster KV reads) that a search along one term at a time
 * stalls in. */
static fid_params nelder_mead(fid_run *r, const fid_params *base, double *loss_out)
{
    int dims[4], nd = 0;
    for (int i = 0; i < 4; i++)
        if (!((i == 0 && base->gemm_pinned && !base->datasheet_gemm) || (i == 1 && !base->bw_free) ||
              (i == 2 && (base->kv_tied || !base->kv_fitted)) ||
              (i == 3 && (base->no_gap || base->gap_fixed))))
            dims[nd++] = i;
    double x0[4] = {base->gemm_scale, base->bw_eff, base->kv_eff, 1e3 * base->gap};
    double simplex[5][4], f[5];
    for (int restart = 0; restart < 2; restart++) {
        for (int j = 0; j <= nd; j++) {
            memcpy(simplex[j], x0, sizeof x0);
            if (j > 0) simplex[j][dims[j - 1]] += dims[j - 1] == 3 ? 1.0 : 0.1;
            f[j] = vector_loss(r, base, simplex[j], NULL);
        }
        for (int iter = 0; iter < 300; iter++) {
            for (int a = 1; a <= nd; a++)   /* sort: f[0] best */
                for (int b = a; b > 0 && f[b] < f[b - 1]; b--) {
                    double t = f[b]; f[b] = f[b - 1]; f[b - 1] = t;
                    for (int i = 0; i < 4; i++) { t = simplex[b][i]; simplex[b][i] = simplex[b - 1][i]; simplex[b - 1][i] = t; }
                }
            if (f[nd] - f[0] < 1e-7) break;
            double c[4] = {0}, xr[4], xe[4], xc[4];
            for (int j = 0; j < nd; j++)
                for (int i = 0; i < 4; i++) c[i] += simplex[j][i] / nd;
            for (int i = 0; i < 4; i++) xr[i] = c[i] + (c[i] - simplex[nd][i]);
            double fr = vector_loss(r, base, xr, NULL);
            if (fr < f[0]) {
                for (int i = 0; i < 4; i++) xe[i] = c[i] + 2 * (c[i] - simplex[nd][i]);
                double fe = vector_loss(r, base, xe, NULL);
                memcpy(simplex[nd], fe < fr ? xe : xr, sizeof xe);
                f[nd] = fmin(fe, fr);
            } else if (fr < f[nd - 1]) {
                memcpy(simplex[nd], xr, sizeof xr);
                f[nd] = fr;
            } else {
                bool outside = fr < f[nd];
                for (int i = 0; i < 4; i++) xc[i] = c[i] + (outside ? 0.5 : -0.5) * (c[i] - simplex[nd][i]);
                double fc = vector_loss(r, base, xc, NULL);
                if (fc < fmin(fr, f[nd])) {
                    memcpy(simplex[nd], xc, sizeof xc);
                    f[nd] = fc;
                } else {   /* shrink towards the best */
                    for (int j = 1; j <= nd; j++) {
                        for (int i = 0; i < 4; i++) simplex[j][i] = simplex[0][i] + 0.5 * (simplex[j][i] - simplex[0][i]);
                        f[j] = vector_loss(r, base, simplex[j], NULL);
                    }
                }
            }
        }
        int best = 0;
        for (int j = 1; j <= nd; j++) if (f[j] < f[best]) best = j;
        memcpy(x0, simplex[best], sizeof x0);
    }
    fid_params p;
    *loss_out = vector_loss(r, base, x0, &p);
    return p;
}

/* Stage 1: Nelder-Mead to the least absolute log deviation from the run's step timings over all
 * its intervals; then the intervals beyond 3 scaled MADs of that fit are dropped and the search
 * repeated from there.  keep_set: leave the run's kept intervals as they are (no rejection). */
static fid_params fit_step_timings(fid_run *r, fid_params start, bool keep_set, fid_stage1 *out)
{
    fid_params best = start;
    int rejected = 0;
    double loss = INFINITY;
    if (keep_set) {
        best = nelder_mead(r, &start, &loss);
        for (int k = 0; k < r->steps.stats.num_intervals; k++) rejected += !r->steps.keep[k];
    } else {
        for (int k = 0; k < r->steps.stats.num_intervals; k++) r->steps.keep[k] = true;
        best = nelder_mead(r, &start, &loss);
        ar_steptime st;
        if (make_steptime(r, &best, &st) == 0) {
            rejected = ar_stepfit_reject(&r->steps, &st, 3.0);
            best = nelder_mead(r, &best, &loss);
        }
    }
    if (out) {
        out->loss = loss;
        out->rejected = rejected;
        out->kept = r->steps.stats.num_intervals - rejected;
    }
    return best;
}

/* Coordinate descent over each stage-2 parameter's grid, from stage 1's result, three rounds. */
static fid_params calibrate_once(fid_run *r, fid_params start, int *sims, fid_tried *tried, fid_stage1 *stage1)
{
    static const double effs[] = {0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0};
    static const double scales[] = {0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.3};
    static const double overheads[] = {0, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.008, 0.012};
    static const double per_reqs[] = {0, 1e-5, 2.5e-5, 5e-5, 1e-4, 2e-4};
    /* stage 1: the GPU terms from the run's step timings, no simulation */
    fid_params best = fit_step_timings(r, start, false, stage1);
    /* stage 2: the rest from the requests, by simulation */
    ar_fidelity f;
    fid_per_req pr;
    double best_obj = simulate(r, &best, r->num_blocks, &f, NULL, &pr) == 0 ? objective(&f, &pr) : INFINITY;
    (*sims)++;
    remember(tried, &best, best_obj);
    for (int round = 0; round < 3; round++)
        for (int k = 0; k < 6; k++) {
            if (k == 0 || k == 2 || k == 3) continue;   /* fixed by stage 1 */
            if (k == 1 && profile_mode) continue;        /* attention is measured: no attn_eff */
            const double *grid = k == 0 ? scales : k < 4 ? effs : k == 4 ? overheads : per_reqs;
            int n = k == 0 ? (int)(sizeof scales / sizeof scales[0]) : k < 4 ? (int)(sizeof effs / sizeof effs[0])
                  : k == 4 ? (int)(sizeof overheads / sizeof overheads[0]) : (int)(sizeof per_reqs / sizeof per_reqs[0]);
            for (int i = 0; i < n; i++) {
                fid_params p = best;
                double *slot = k == 0 ? &p.gemm_scale : k == 1 ? &p.attn_eff : k == 2 ? &p.bw_eff : k == 3 ? &p.kv_eff
                             : k == 4 ? &p.overhead : &p.per_req;
                if (*slot == grid[i]) continue;
                *slot = grid[i];
                (*sims)++;
                if (simulate(r, &p, r->num_blocks, &f, NULL, &pr) != 0) continue;
                double o = objective(&f, &pr);
                remember(tried, &p, o);
                if (o < best_obj - 1e-12) { best_obj = o; best = p; }
            }
        }
    return best;
}

/* Largest relative change of the fitted terms between two calibrations (absolute below 1e-9). */
static double params_change(const fid_params *a, const fid_params *b)
{
    const double x[6] = {a->gemm_scale, a->kv_eff, a->gap, a->attn_eff, a->overhead, a->per_req};
    const double y[6] = {b->gemm_scale, b->kv_eff, b->gap, b->attn_eff, b->overhead, b->per_req};
    double worst = 0;
    for (int i = 0; i < 6; i++) {
        double scale = fmax(fabs(x[i]), fabs(y[i]));
        if (scale > 1e-9) worst = fmax(worst, fabs(x[i] - y[i]) / scale);
    }
    return worst;
}

/* Gives stage 1 of r the hidden work a simulation shows (recompute: [num_intervals], NULL = none;
 * waiting: [pieces x requests], NULL = none); returns the decodes left out over all pieces. */
static long set_hidden(fid_run *r, const double *recompute, const bool *waiting)
{
    int ni = r->steps.stats.num_intervals, n = r->steps.num_reqs;
    long left_out = 0;
    for (int k = 0; k < ni; k++) ar_stepfit_set_recompute(&r->steps, k, recompute ? recompute[k] : 0);
    for (int j = 0; j < r->steps.sample_start[ni]; j++)
        left_out += ar_stepfit_set_waiting(&r->steps, j, waiting ? waiting + (size_t)j * (size_t)n : NULL);
    return left_out;
}

/* Calibration with the work no stamp shows (start.hidden).  Stage 1 cannot see the prompt tokens
 * an engine recomputes after a preemption, so in a run that preempts they pass for slower steps,
 * and the simulation then recomputes them again on top; nor can it see that a preempted request
 * waits for a while between its first and last token, so it counts it as decoding there (the
 * other way: faster steps).  So: calibrate; simulate the calibration run with the result and give
 * each stage-1 interval the recompute prefill of the simulated steps that end in it, as extra
 * prompt tokens (FID_RECOMPUTE), and (FID_RECOMPUTE_WAITING) each piece's requests the simulation
 * holds preempted at its middle, not counted as decoding there; calibrate again (both stages, from
 * the same start); repeat until no term moves by 1% or more, at most FID_MAX_REFITS refits.  A run
 * the simulation never preempts gets nothing and its first calibration stands.  FID_STAMPS: one
 * calibration on the stamps alone. */
static fid_params calibrate(fid_run *r, fid_params start, int *sims, fid_tried *tried, fid_stage1 *stage1)
{
    int ni = r->steps.stats.num_intervals, n = r->steps.num_reqs, num_pieces = r->steps.sample_start[ni];
    set_hidden(r, NULL, NULL);
    fid_stage1 s1 = {0};
    fid_params p = calibrate_once(r, start, sims, tried, &s1);
    s1.rounds = 1;
    s1.converged = true;
    s1.round_params[0] = p;
    if (start.hidden == FID_STAMPS) {
        if (stage1) *stage1 = s1;
        return p;
    }
    double *recompute = malloc((size_t)(ni + 1) * sizeof *recompute);
    bool *waiting = start.hidden == FID_RECOMPUTE_WAITING
                        ? malloc(((size_t)num_pieces * (size_t)n + 1) * sizeof *waiting) : NULL;
    bool ready = recompute && (start.hidden != FID_RECOMPUTE_WAITING || waiting);
    if (!ready) s1.converged = false;
    for (int round = 0; ready && round < FID_MAX_REFITS; round++) {
        ar_fidelity f;
        if (simulate_recording(r, &p, r->num_blocks, &f, NULL, NULL, recompute, waiting) != 0) {
            s1.converged = false;
            break;
        }
        (*sims)++;
        double total = recompute[ni];
        if (total <= 0 && s1.rounds == 1) break;   /* no preemption: nothing hidden */
        long left_out = set_hidden(r, recompute, waiting);
        if (tried) tried->n = 0;
        fid_stage1 next = {0};
        fid_params q = calibrate_once(r, start, sims, tried, &next);
        next.rounds = s1.rounds + 1;
        next.recompute_tokens = total;
        memcpy(next.round_params, s1.round_params, sizeof s1.round_params);
        memcpy(next.round_recompute, s1.round_recompute, sizeof s1.round_recompute);
        memcpy(next.round_waiting, s1.round_waiting, sizeof s1.round_waiting);
        memcpy(next.round_change, s1.round_change, sizeof s1.round_change);
        next.round_params[s1.rounds] = q;
        next.round_recompute[s1.rounds] = total;
        next.round_waiting[s1.rounds] = left_out;
        next.round_change[s1.rounds] = params_change(&p, &q);
        next.converged = next.round_change[s1.rounds] < 0.01;
        p = q;
        s1 = next;
        if (s1.converged) break;
    }
    free(recompute);
    free(waiting);
    if (stage1) *stage1 = s1;
    return p;
}

/* One point of a ridge: stage 1 refitted on the calibration run from start (its held term held,
 * the kept intervals kept), stage 2's terms as they are; both runs simulated with the result. */
static int ridge_point(fid_run *cal, fid_run *eval, fid_params start, fid_params *p, fid_stage1 *s1, ar_fidelity *fc,
                       ar_fidelity *fe)
{
    *p = fit_step_timings(cal, start, true, s1);
    return simulate(cal, p, cal->num_blocks, fc, NULL, NULL) != 0 || simulate(eval, p, eval->num_blocks, fe, NULL, NULL) != 0
               ? -1 : 0;
}

static void print_row(const char *run, const char *role, const ar_fidelity *f)
{
    printf("| %s | %s | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f | %+.1f / %+.1f / %+.1f %% | %.1f / %.1f / %.1f | "
           "%.1f / %.1f / %.1f | %+.1f / %+.1f / %+.1f %% |\n", run, role,
           f->sim_ttft[0], f->sim_ttft[1], f->sim_ttft[2], f->real_ttft[0], f->real_ttft[1], f->real_ttft[2],
           100 * f->gap_ttft[0], 100 * f->gap_ttft[1], 100 * f->gap_ttft[2],
           1e3 * f->sim_tpot[0], 1e3 * f->sim_tpot[1], 1e3 * f->sim_tpot[2],
           1e3 * f->real_tpot[0], 1e3 * f->real_tpot[1], 1e3 * f->real_tpot[2],
           100 * f->gap_tpot[0], 100 * f->gap_tpot[1], 100 * f->gap_tpot[2]);
}

/* How stage 1 was told of the work no stamp shows, and with hidden work each calibration round:
 * what it was given (simulated with the round before's parameters), its result and self-fit. */
/* Calibrates on cal from start (calibrate()), then simulates the calibration run and the evaluation
 * run with the result: fc, fe (se: the evaluation's summary, may be NULL).  0 ok, 2 a run could not
 * be simulated. */
static int calibrate_and_evaluate(fid_run *cal, fid_run *eval, fid_params start, int *sims, fid_tried *tried,
                                  fid_stage1 *s1, fid_params *p, ar_fidelity *fc, ar_fidelity *fe, ar_sim_summary *se)
{
    *p = calibrate(cal, start, sims, tried, s1);
    if (simulate(cal, p, cal->num_blocks, fc, NULL, NULL) != 0 || simulate(eval, p, eval->num_blocks, fe, se, NULL) != 0)
        return 2;
    return 0;
}

static int print_rounds(fid_run *cal, const fid_params *p, const fid_stage1 *s1)
{
    if (p->hidden == FID_STAMPS) {
        printf("stage 1 on the stamps alone (no simulated recompute or waiting)\n\n");
        return 0;
    }
    printf("stage 1 told of the simulated %s: %d calibration%s", hidden_names[p->hidden], s1->rounds,
           s1->rounds == 1 ? " (the simulated run does not preempt: nothing hidden)\n\n" : "s, ");
    if (s1->rounds == 1) return 0;
    printf("%s after %d refit%s; each round's hidden work (simulated with the round before's parameters), result, "
           "largest move of a term and self-fit:\n\n", s1->converged ? "converged (no term moved 1%)" : "NOT converged",
           s1->rounds - 1, s1->rounds == 2 ? "" : "s");
    printf("| round | recompute tokens | decodes left out (piece entries) | gemm_scale | gap (ms) | attn_eff | overhead "
           "| per_req | largest move | calibration TTFT / TPOT gap |\n"
           "| ---: | ---: | ---: | --- | --- | --- | --- | --- | ---: | --- |\n");
    for (int k = 0; k < s1->rounds; k++) {
        const fid_params *q = &s1->round_params[k];
        ar_fidelity fr;
        if (simulate(cal, q, cal->num_blocks, &fr, NULL, NULL) != 0) return -1;
        printf("| %d | %.0f | %ld | %.3g | %.3g | %.3g | %.3g | %.3g | %.1f %% | %+.1f / %+.1f %% |\n", k,
               s1->round_recompute[k], s1->round_waiting[k], q->gemm_scale, 1e3 * q->gap, q->attn_eff, q->overhead,
               q->per_req, 100 * s1->round_change[k], 100 * fr.gap_ttft[0], 100 * fr.gap_tpot[0]);
    }
    printf("\n");
    return 0;
}

static const char *verdict(const ar_fidelity *f)
{
    bool mean_ok = fabs(f->gap_ttft[0]) <= 0.05 && fabs(f->gap_tpot[0]) <= 0.05;
    bool p90_ok = fabs(f->gap_ttft[2]) <= 0.10 && fabs(f->gap_tpot[2]) <= 0.10;
    return mean_ok && p90_ok ? "met" : mean_ok ? "means met, p90 missed" : "missed";
}

/* A model variant for terms_off: extra step-time keys and the fid_params flags it sets. */
typedef struct fid_variant {
    const char *keys, *what;
    bool datasheet_gemm, kv_tied, no_gap, bw_free, kv_absolute, kv_fitted, gemm_pinned, profiled_linear;
} fid_variant;

/* Each variant recalibrated on each run and evaluated on the other: one table row of evaluation
 * gaps each, then the calibrated parameters.  Printed, never used to choose. */
static int terms_off(fid_run *runs, const fid_variant *variants, size_t num)
{
    printf("### Each term off, recalibrated: evaluation gaps (mean TTFT / mean TPOT)\n\n");
    static char fitted[16][2][640];
    printf("| model | calibrated on RTXPRO6000 -> RTX4090 | calibrated on RTX4090 -> RTXPRO6000 |\n");
    printf("| --- | --- | --- |\n");
    for (size_t v = 0; v < num && v < 16; v++) {
        printf("| %s |", variants[v].what);
        for (int dir = 0; dir < 2; dir++) {
            fid_run *cal = &runs[dir], *eval = &runs[1 - dir];
            fid_params start = start_params(cal->device, variants[v].keys);
            start.datasheet_gemm = variants[v].datasheet_gemm;
            start.kv_tied = variants[v].kv_tied;
            start.no_gap = variants[v].no_gap;
            start.bw_free = variants[v].bw_free;
            start.kv_absolute = variants[v].kv_absolute;
            start.kv_fitted = variants[v].kv_fitted;
            start.gemm_pinned = variants[v].gemm_pinned || profile_mode;
            start.profiled_linear = variants[v].profiled_linear;
            if (start.bw_free) start.bw_eff = 0.8;   /* the generic value the RTX tables held before measuring */
            if (start.kv_absolute) start.kv_eff = start.bw_free ? start.bw_eff : device_bw_eff(&start, cal->device);
            int sims = 0;
            fid_stage1 vs1;
            fid_params p;
            ar_fidelity fc, fe;
            if (calibrate_and_evaluate(cal, eval, start, &sims, NULL, &vs1, &p, &fc, &fe, NULL) != 0) return 2;
            printf(" %+.1f / %+.1f %% |", 100 * fe.gap_ttft[0], 100 * fe.gap_tpot[0]);
            char terms[200];
            if (profile_mode)
                snprintf(terms, sizeof terms, "the profiles");
            else
                snprintf(terms, sizeof terms, "gemm_eff=%.3g (gemm_scale %.3g),attn_eff=%.3g,bw_eff=%.3g,kv_eff=%.3g%s",
                         device_gemm_eff(&p, cal->device), p.gemm_scale, p.attn_eff, device_bw_eff(&p, cal->device),
                         p.kv_fitted ? p.kv_eff : device_kv_eff(&p, cal->device),
                         p.kv_tied ? " (= bw_eff)" : !p.kv_fitted ? " (table)" : p.kv_absolute || p.bw_free ? "" : " x bw_eff");
            snprintf(fitted[v][dir], sizeof fitted[v][dir], "%s,gap=%.3g,overhead=%.3g,per_req=%.3g (stage-1 loss %.4f; "
                     "%d refit%s%s; self-fit %+.1f / %+.1f %%)", terms, p.gap, p.overhead, p.per_req, vs1.loss,
                     vs1.rounds - 1, vs1.rounds == 2 ? "" : "s", vs1.converged ? "" : ", not converged",
                     100 * fc.gap_ttft[0], 100 * fc.gap_tpot[0]);
        }
        printf("\n");
    }
    printf("\nCalibrated parameters of each row (on RTXPRO6000 / on RTX4090):\n\n");
    for (size_t v = 0; v < num && v < 16; v++) printf("- %s: %s / %s\n", variants[v].what, fitted[v][0], fitted[v][1]);
    return 0;
}

/* The second ridge: gap held at each value, the other stage-1 terms refitted (with the roofline:
 * gemm_scale, bw_eff and kv_eff from the tables; with the profiles none).  In the RTX 4090 run the
 * KV cache stays full, so a step's KV reads are nearly a constant too and would trade against gap
 * if kv_eff were fitted; with it pinned the rows show how sharply each run's step timings decide
 * gap.  Printed, never used to choose. */
static int gap_ridge(fid_run *runs, const fid_params *calibrated)
{
    printf("### Stage 1 along gap (%s; stage 2 as calibrated)\n\n",
           profile_mode ? "the measured profiles" : "bw_eff and kv_eff from the tables; gemm_scale refitted");
    printf("| calibrated on | gap (ms) | fitted gemm_scale | stage-1 loss (kept) | calibration TTFT / TPOT gap "
           "| evaluation TTFT / TPOT gap |\n| --- | ---: | --- | --- | --- | --- |\n");
    for (int dir = 0; dir < 2; dir++) {
        fid_run *cal = &runs[dir], *eval = &runs[1 - dir];
        for (int g = 0; g < 6; g++) {
            fid_params start = calibrated[dir];
            start.gap = 1e-3 * g;
            start.gap_fixed = true;
            fid_stage1 s1;
            fid_params p;
            ar_fidelity fc, fe;
            if (ridge_point(cal, eval, start, &p, &s1, &fc, &fe) != 0) return 2;
            char scale[32];
            snprintf(scale, sizeof scale, profile_mode ? "-" : "%.3g", p.gemm_scale);
            printf("| %s | %d | %s | %.4f (%d) | %+.1f / %+.1f %% | %+.1f / %+.1f %% |\n", cal->label, g, scale,
                   s1.loss, s1.kept, 100 * fc.gap_ttft[0], 100 * fc.gap_tpot[0], 100 * fe.gap_ttft[0],
                   100 * fe.gap_tpot[0]);
        }
    }
    printf("\n");
    return 0;
}

/* The rest of the profile mode's report: stage 1 along gap, and the per-step terms switched off
 * (each recalibrated, evaluated).  Printed, never used to choose. */
static int profile_report(fid_run *runs, const fid_params *calibrated)
{
    if (gap_ridge(runs, calibrated) != 0) return 2;
    static const fid_variant variants[] = {
        {"", "profiles, full model", .no_gap = false},
        {"", "no serial per-step GPU time (gap = 0)", .no_gap = true},
        {",async=0", "no async scheduling (CPU time adds to the GPU's)", .no_gap = false},
        {",graph=0", "no CUDA-graph padding", .no_gap = false},
    };
    if (terms_off(runs, variants, sizeof variants / sizeof variants[0]) != 0) return 2;
    for (int i = 0; i < 2; i++) {
        ar_workload_free(&runs[i].wl);
        ar_stepfit_free(&runs[i].steps);
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *root = argc > 1 ? argv[1] : "../shared/traces-public/vllm-runs-llmservingsim";
    const char *mode = getenv("FIDELITY_STAGE1");
    if (mode && *mode) {
        int m = 0;
        while (m < 3 && strcmp(mode, hidden_names[m]) != 0) m++;
        if (m == 3) {
            fprintf(stderr, "fidelity: FIDELITY_STAGE1=%s: must be stamps, recompute or recompute+waiting\n", mode);
            return 2;
        }
        default_hidden = m;
    }
    const char *steptime_mode = getenv("FIDELITY_STEPTIME");
    if (steptime_mode && *steptime_mode) {
        if (strcmp(steptime_mode, "profile") != 0 && strcmp(steptime_mode, "roofline") != 0) {
            fprintf(stderr, "fidelity: FIDELITY_STEPTIME=%s: must be roofline or profile\n", steptime_mode);
            return 2;
        }
        profile_mode = strcmp(steptime_mode, "profile") == 0;
    }
    const char *attn_env = getenv("FIDELITY_PROFILE_ATTN");
    if (attn_env && *attn_env) {
        int a = 0;
        while (a < 4 && strcmp(attn_env, profile_attn_names[a]) != 0) a++;
        if (a == 4) {
            fprintf(stderr, "fidelity: FIDELITY_PROFILE_ATTN=%s: must be llmservingsim, separate, skew or prompts\n",
                    attn_env);
            return 2;
        }
        profile_attn = a;
    }
    const char *dir_env = getenv("FIDELITY_PROFILES");
    if (dir_env && *dir_env) profile_dir = dir_env;
    fid_run runs[2] = {
        {.label = "RTXPRO6000", .dir = "RTXPRO6000-Llama-3.1-8B", .device = "rtxpro6000", .max_seqs = 128},
        {.label = "RTX4090", .dir = "RTX4090-Llama-3.1-8B", .device = "rtx4090", .num_blocks = 2588, .max_seqs = 256},
    };
    /* 68 GB of KV for the RTX PRO 6000: 96 GB x 0.9 - 16 GB of weights - ~2 GB of activations */
    runs[0].num_blocks = (int)(68e9 / (double)ar_kv_bytes_per_block(&ar_model_preset_find("llama-3.1-8b")->model, 16,
                                                                     AR_BF16));
    char err[AR_ERR_MAX + 2048], spec[1200];
    for (int i = 0; i < 2; i++) {
        snprintf(spec, sizeof spec, "vllm-run:%s/%s", root, runs[i].dir);
        if (ar_workload_load(spec, 16, 1.0, 0, &runs[i].wl, err, sizeof err) != 0) {
            fprintf(stderr, "fidelity: %s\n", err);
            return 2;
        }
        snprintf(spec, sizeof spec, "%s/%s", root, runs[i].dir);
        ar_run_req *reqs;
        int num_reqs;
        if (ar_run_load(spec, &reqs, &num_reqs, err, sizeof err) != 0 ||
            ar_stepfit_build(reqs, num_reqs, 2048, 8, &runs[i].steps, err, sizeof err) != 0) {
            fprintf(stderr, "fidelity: %s\n", err);
            return 2;
        }
        /* both readers keep the file's order; the workload's times start at the first row's queued_ts */
        runs[i].origin = reqs[0].first_token - runs[i].wl.reqs[0].real_ttft;
        free(reqs);
    }
    printf("Simulator fidelity against real vLLM 0.19 runs (Llama-3.1-8B, TP 1, budget 2048, block 16).\n"
           "TTFT in s, TPOT in ms, each mean / p50 / p90; gap = sim / real - 1.  Goal: means within 5%%, p90 within 10%%.\n\n");
    if (profile_mode)
        printf("Step time: profile:%s/llama-3.1-8b.DEVICE.llmservingsim.profile.db, each card's measured per-layer "
               "profile (LLMServingSim, converted); attention looked up %s (FIDELITY_PROFILE_ATTN=%s); fitted: gap "
               "(stage 1), overhead and per_req (stage 2).\n\n",
               profile_dir,
               profile_attn == 0   ? "as LLMServingSim does (a step's prompts together, the skew correction)"
               : profile_attn == 1 ? "with each prompt alone and no skew correction"
               : profile_attn == 2 ? "with each prompt alone and the skew correction"
                                   : "with a step's prompts together and no skew correction",
               profile_attn_names[profile_attn]);
    fid_params calibrated[2];
    for (int dir = 0; dir < 2; dir++) {
        fid_run *cal = &runs[dir], *eval = &runs[1 - dir];
        fid_params start = start_params(cal->device, "");
        int sims = 0;
        static fid_tried tried;
        tried.n = 0;
        fid_stage1 s1;
        fid_params p;
        ar_fidelity fc, fe;
        ar_sim_summary se;
        if (calibrate_and_evaluate(cal, eval, start, &sims, &tried, &s1, &p, &fc, &fe, &se) != 0) return 2;
        calibrated[dir] = p;
        printf("### Calibrated on %s (%d simulations), evaluated on %s\n\n", cal->label, sims, eval->label);
        if (profile_mode)
            printf("parameters: the measured profiles (linear layers, LM head and sampler, attention), gap=%.4g, "
                   "overhead=%.3g, per_req=%.3g (async on, CUDA-graph padding)\n\n", p.gap, p.overhead, p.per_req);
        else printf("parameters: gemm_scale=%.3g (gemm_eff %s %.3g, %s %.3g), bw_eff from the device tables (%s %.3g, "
               "%s %.3g), kv_eff from the device tables (%s %.3g, %s %.3g), attn_eff=%.3g, gap=%.3g, overhead=%.3g, "
               "per_req=%.3g (async on, CUDA-graph padding)\n\n", p.gemm_scale, cal->device, device_gemm_eff(&p, cal->device),
               eval->device, device_gemm_eff(&p, eval->device), cal->device, device_bw_eff(&p, cal->device),
               eval->device, device_bw_eff(&p, eval->device), cal->device, device_kv_eff(&p, cal->device),
               eval->device, device_kv_eff(&p, eval->device), p.attn_eff, p.gap, p.overhead, p.per_req);
        const ar_step_interval_stats *is = &cal->steps.stats;
        printf("stage 1 on %s: %d step ends seen in %d components (%d with disagreeing step counts, %d intervals "
               "left out; %d inconsistent), %d intervals, %d kept after rejection, mean |log(model / observed "
               "steps)| %.5f\n\n", cal->label, is->num_nodes, is->num_components, is->num_bad_components,
               is->num_dropped, is->num_inconsistent, is->num_intervals, s1.kept, s1.loss);
        if (print_rounds(cal, &p, &s1) != 0) return 2;
        printf("| run | role | TTFT sim | TTFT real | TTFT gap | TPOT sim | TPOT real | TPOT gap |\n");
        printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
        print_row(cal->label, "calibration", &fc);
        print_row(eval->label, "**evaluation**", &fe);
        printf("\nevaluation: %s; %lld preemptions in the simulated %s run\n\n", verdict(&fe), (long long)se.preemptions,
               eval->label);
        /* how well the calibration run pins the parameters down: every tried point within one
         * percentage point of the best objective, evaluated on the other run */
        double best_obj = INFINITY, lo[2] = {INFINITY, INFINITY}, hi[2] = {-INFINITY, -INFINITY};
        for (int i = 0; i < tried.n; i++) best_obj = fmin(best_obj, tried.obj[i]);
        int near = 0;
        for (int i = 0; i < tried.n; i++) {
            ar_fidelity fn;
            if (tried.obj[i] > best_obj + 0.01 || simulate(eval, &tried.p[i], eval->num_blocks, &fn, NULL, NULL) != 0) continue;
            near++;
            lo[0] = fmin(lo[0], fn.gap_ttft[0]); hi[0] = fmax(hi[0], fn.gap_ttft[0]);
            lo[1] = fmin(lo[1], fn.gap_tpot[0]); hi[1] = fmax(hi[1], fn.gap_tpot[0]);
        }
        printf("calibration spread: %d tried points within 1 point of the best objective (%.1f%%) on %s give %s mean "
               "TTFT %+.1f..%+.1f%%, mean TPOT %+.1f..%+.1f%%\n\n", near, 100 * best_obj, cal->label, eval->label,
               100 * lo[0], 100 * hi[0], 100 * lo[1], 100 * hi[1]);
        if (eval->num_blocks == 2588) {
            printf("KV-block sensitivity of the evaluation (%s, same parameters):\n\n", eval->label);
            printf("| KV blocks | TTFT mean gap | TTFT p90 gap | TPOT mean gap | TPOT p90 gap | preemptions |\n");
            printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
            static const double scales[] = {0.9, 0.95, 1.0, 1.05, 1.1};
            for (int k = 0; k < 5; k++) {
                int nb = (int)lround(2588 * scales[k]);
                ar_fidelity fk;
                ar_sim_summary sk;
                if (simulate(eval, &p, nb, &fk, &sk, NULL) != 0) continue;
                printf("| %d | %+.1f %% | %+.1f %% | %+.1f %% | %+.1f %% | %lld |\n", nb, 100 * fk.gap_ttft[0],
                       100 * fk.gap_ttft[2], 100 * fk.gap_tpot[0], 100 * fk.gap_tpot[2], (long long)sk.preemptions);
            }
            printf("\n");
        }
    }
    if (profile_mode) return profile_report(runs, calibrated);
    /* The ridge of stage 1: the calibration device's bw_eff held at each value (and the evaluation
     * device's moved by the same factor from its table), the other stage-1 terms refitted to the
     * calibration run's step timings; stage 2's terms stay as calibrated.  On one device the weight
     * stream (weight bytes / (bw x bw_eff)) and gap are both a constant per step, so the step
     * timings of one run cannot tell them apart: that is why the device tables pin bw_eff.  The
     * rows show where the tables' values sit on the ridge and what the freedom would do to the
     * transfer.  They are printed, never used to choose. */
    printf("### Stage 1 along bw_eff (the other stage-1 terms refitted; stage 2 as calibrated)\n\n");
    printf("| calibrated on | bw_eff (calibration / evaluation device) | fitted gemm_scale / gap, kv_eff (table) "
           "| stage-1 loss (kept) | calibration TTFT / TPOT gap | evaluation TTFT / TPOT gap |\n"
           "| --- | --- | --- | --- | --- | --- |\n");
    for (int dir = 0; dir < 2; dir++) {
        fid_run *cal = &runs[dir], *eval = &runs[1 - dir];
        double table = ar_device_find(cal->device)->bw_eff;
        for (int b = 0; b < 6; b++) {
            fid_params start = calibrated[dir];
            start.bw_scale = b < 5 ? (0.6 + 0.1 * b) / table : 1.0;   /* the last row: the table's own value */
            fid_stage1 s1;
            fid_params p;
            ar_fidelity fc, fe;
            if (ridge_point(cal, eval, start, &p, &s1, &fc, &fe) != 0) return 2;
            printf("| %s | %.3g / %.3g%s | %.3g / %.2g, %.3g | %.4f (%d) | %+.1f / %+.1f %% | %+.1f / %+.1f %% |\n",
                   cal->label, device_bw_eff(&p, cal->device), device_bw_eff(&p, eval->device), b < 5 ? "" : " (tables)",
                   p.gemm_scale, p.gap, device_kv_eff(&p, cal->device), s1.loss, s1.kept, 100 * fc.gap_ttft[0],
                   100 * fc.gap_tpot[0],
                   100 * fe.gap_ttft[0], 100 * fe.gap_tpot[0]);
        }
    }
    printf("\n");
    if (gap_ridge(runs, calibrated) != 0) return 2;
    /* each term switched off in turn, recalibrated, evaluated: what the term does to the transfer */
    static const fid_variant variants[] = {
        {"", "full model", false, false, false, false, false, false, false, false},
        {"", "linear term from vLLM's measured linear layers (candidate table), pinned: stage 1 fits gap alone", false,
         false, false, false, false, false, true, true},
        {"", "linear term from the candidate table, gemm_scale fitted over it", false, false, false, false, false, false,
         false, true},
        {"", "kv_eff fitted, a fraction of the device's bw_eff (no measured KV-read rate)", false, false, false, false,
         false, true, false, false},
        {"", "bw_eff fitted, one value for both devices (free along the ridge; kv_eff absolute)", false, false, false, true,
         true, true, false, false},
        {"", "kv_eff fitted, a fraction of the data sheet, shared (not of the device's bw_eff)", false, false, false, false,
         true, true, false, false},
        {"", "GEMMs on the data-sheet peak (no measured GEMM ceiling)", true, false, false, false, false, false, false,
         false},
        {"", "one bandwidth efficiency for weights and KV reads (kv_eff = bw_eff)", false, true, false, false, false, false,
         false, false},
        {"", "no serial per-step GPU time (gap = 0)", false, false, true, false, false, false, false, false},
        {"", "none of these (one fitted bandwidth and GEMM efficiency: the first model)", true, true, true, true, true,
         false, false, false},
        {",async=0", "no async scheduling (CPU time adds to the GPU's)", false, false, false, false, false, false, false, false},
        {",graph=0", "no CUDA-graph padding", false, false, false, false, false, false, false, false},
    };
    if (terms_off(runs, variants, sizeof variants / sizeof variants[0]) != 0) return 2;
    /* Stage 1 in each mode the full model does not use (the stamps alone, or told of the simulated
     * recompute, or of the recompute and the waiting): each direction recalibrated so, its rounds,
     * its parameters, its self-fit and its evaluation. */
    printf("\n### Stage 1's other modes (calibrate()): the stamps alone or the simulated hidden work, as the full "
           "model does not use them\n\n");
    for (int m = FID_STAMPS; m <= FID_RECOMPUTE_WAITING; m++) {
        if (m == default_hidden) continue;
        for (int dir = 0; dir < 2; dir++) {
            fid_run *cal = &runs[dir], *eval = &runs[1 - dir];
            fid_params start = start_params(cal->device, "");
            start.hidden = m;
            int sims = 0;
            fid_stage1 s1;
            fid_params p;
            ar_fidelity fc, fe;
            if (calibrate_and_evaluate(cal, eval, start, &sims, NULL, &s1, &p, &fc, &fe, NULL) != 0) return 2;
            printf("#### %s, calibrated on %s (%d simulations), evaluated on %s\n\n", hidden_names[m], cal->label, sims,
                   eval->label);
            printf("parameters: gemm_scale=%.3g (gemm_eff %s %.3g, %s %.3g), attn_eff=%.3g, gap=%.3g, overhead=%.3g, "
                   "per_req=%.3g; stage-1 loss %.4f over %d kept intervals\n\n", p.gemm_scale, cal->device,
                   device_gemm_eff(&p, cal->device), eval->device, device_gemm_eff(&p, eval->device), p.attn_eff, p.gap,
                   p.overhead, p.per_req, s1.loss, s1.kept);
            if (print_rounds(cal, &p, &s1) != 0) return 2;
            printf("| run | role | TTFT sim | TTFT real | TTFT gap | TPOT sim | TPOT real | TPOT gap |\n");
            printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
            print_row(cal->label, "calibration", &fc);
            print_row(eval->label, "**evaluation**", &fe);
            printf("\nevaluation: %s\n\n", verdict(&fe));
        }
    }
    for (int i = 0; i < 2; i++) {
        ar_workload_free(&runs[i].wl);
        ar_stepfit_free(&runs[i].steps);
    }
    return 0;
}
