/* replay.c - the replay engine and the `replay` command (DESIGN sections 2, 7-9).
 *
 * Three threads share a run, so that reading the trace and writing SQLite overlap the steps:
 *   reader  (batch_reader.c) reads and validates the trace, applies each step record to the live table and
 *           builds a self-contained batch (query_start_loc, seq_lens, block table, content
 *           keys, slot_mapping, the cascade prefix, the fill list of context tokens this run
 *           never wrote, the planted metadata faults) into a ring of AR_BATCH_SLOTS slots;
 *   steps   (the calling thread) runs the backend per layer on the next batch, verifies the
 *           layers the policy names against the float64 reference, and hands the step's rows
 *           to the writer as one record;
 *   writer  (replay/db.c) commits records in short batched transactions.
 * --no-overlap does the same work on the calling thread in the same order (the reader fills
 * a slot when the step loop asks, the writer flushes inline at the same points), so both give
 * identical rows.  Slots and records are reused: no allocation per step once they have grown
 * to the largest step.
 *
 * Signals: SIGINT and SIGTERM set a flag; the step loop checks it between layers and steps and
 * verification gives up when it sees it (ar_verify_opts.cancel).  The step in flight is
 * abandoned, committed steps are kept, the run is marked 'interrupted' and the process exits
 * 130 (SIGINT) or 143 (SIGTERM).  A watchdog thread (watchdog.c) makes that hold within 2 s
 * wherever the loop is: if the loop has not finished the run AR_SIGNAL_GRACE_S after the signal
 * (a long forward on the CPU, say), the watchdog has the writer commit the whole steps it holds, marks
 * the run 'interrupted' and ends the process with the same code.
 *
 * Broken backends: every call into the backend (open, prepare, fill, a layer's forward) is marked
 * in flight with a deadline (--forward-timeout; 300 s for a GPU backend, 3600 s on the host).  A
 * call that faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT on any thread while it is in flight) parks
 * the faulting thread and wakes the watchdog; a call past its deadline is found by the watchdog
 * (it looks 4 times a second).  Either way the watchdog has the writer commit the whole steps it
 * holds, marks the run 'error' with the step, layer and cause, and ends the process with exit 3
 * (the call's own step has no result and is not recorded); --resume continues the run.  Nothing
 * is written from the signal handler.  The process does not go on after such a call: the
 * backend's state (and, for a fault, possibly the process's memory) cannot be trusted, and a
 * hung thread cannot be stopped.  If the writer cannot finish within AR_BROKEN_ABORT_S (a
 * faulted thread may hold a lock it needs), the process ends anyway and the run stays 'running'
 * with its committed steps.  A fault outside any backend call is attnreplay's own bug and takes
 * its normal course (a core dump).  A CUDA error (an illegal address: sticky, the context is
 * lost) is returned by the backend as an error: the step fails the same way, exit 3.
 *
 * A plugin's own entry points are watched the same way (plugin.c brackets them): its
 * attnreplay_plugin_init and check(), which run while the backend is chosen, under the given
 * timeout or else AR_FORWARD_TIMEOUT_GPU_S (the plugin's kind is not known yet) - a fault or hang
 * there is a broken plugin, exit 2 with a message naming its file, before anything is stored;
 * and its close(), which runs last, after the run's outcome is stored and the database closed -
 * a fault or hang there leaves the run as stored and exits 3 (when the run's own code was 0, 1
 * or 4; otherwise that code), saying so.
 *
 * Exit codes: 0 every verified step passed (or --verify off: 'unverified'), 1 a step failed
 * verification, 2 bad input or usage, 3 a device or runtime error (including a database write
 * failure; a plugin's close() that faults or hangs after the run is stored; a summary that
 * could not be written to stdout, the run stored whole), 4 nothing was verified (no step
 * replayed: 'empty'; a planted fault never showed: 'fault-not-fired'), 130 SIGINT, 143 SIGTERM.
 * A lost summary does not hide the run's own verdict: with 1, 2, 4 or a signal's code that code
 * stays, the lost summary said on stderr too. */
#include "replay.h"

#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "../reference/cascade.h"
#include "../reference/ref_gpu.h"
#include "../sim/sim.h"
#include "batch_reader.h"
#include "db.h"
#include "plugin_dev.h"
#include "registry.h"
#include "replay_opts.h"
#include "shard.h"
#include "stdout_check.h"
#include "verify.h"
#include "watchdog.h"

extern char **environ;

#ifndef AR_CODE_REV
#define AR_CODE_REV "unknown"
#endif

#define AR_PROGRESS_TTY_S 0.2
#define AR_PROGRESS_LOG_S 10.0
#define AR_EXIT_NOTHING_VERIFIED 4
#define AR_STEP_CANCELLED (-2)   /* run_step: a signal came; the step was abandoned */
#define AR_SUMMARY_PATHS 32      /* kernel paths the summary line names */

static double now_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- options (replay_opts.c) ------------------------------------------------------------ */

/* Seconds a backend call may take as the user gave them: --forward-timeout, else
 * ATTNREPLAY_FORWARD_TIMEOUT; -1 when neither did (0 = no limit). */
static double given_timeout(const replay_opts *o)
{
    if (o->forward_timeout >= 0) return o->forward_timeout;
    const char *env = getenv("ATTNREPLAY_FORWARD_TIMEOUT");
    if (env && *env) {
        char *end;
        double v = strtod(env, &end);
        if (!*end && v >= 0 && isfinite(v)) return v;
        fprintf(stderr, "attnreplay replay: ATTNREPLAY_FORWARD_TIMEOUT='%s' is not a number of seconds >= 0; "
                        "using the default\n", env);
    }
    return -1;
}

/* Seconds a call into the chosen backend may take: the given timeout, else the default for the
 * backend's kind.  Before a backend is chosen (a plugin's init and check) its kind is unknown:
 * the given timeout, else the shorter default, AR_FORWARD_TIMEOUT_GPU_S (be NULL). */
static double call_timeout(double given, const ar_backend *be)
{
    if (given >= 0) return given;
    return !be || be->needs_gpu ? AR_FORWARD_TIMEOUT_GPU_S : AR_FORWARD_TIMEOUT_HOST_S;
}

/* ---- config -------------------------------------------------------------------------------- */

int ar_run_config_from_header(const ar_trace_header *h, const char *dtype, const char *kv_dtype,
                              double kv_scale, ar_run_config *cfg, char *err, size_t err_len)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->model = h->model;
    cfg->block_size = h->cache.block_size;
    cfg->num_blocks = h->cache.num_blocks;
    cfg->dtype = h->cache.dtype;
    cfg->kv_dtype = h->cache.kv_cache_dtype;
    cfg->kv_scale = kv_scale > 0 ? kv_scale : 1.0;
    cfg->seed = h->seed;
    cfg->num_layers = 1;
    cfg->repeat = 1;
    cfg->cascade_mode = 1;
    if (dtype) {
        ar_dtype d;
        if (ar_dtype_parse(dtype, cfg->dtype, &d) != 0 || d == AR_FP8_E4M3) {
            snprintf(err, err_len, "--dtype: '%s' is not one of bf16, fp16, fp32", dtype);
            return -1;
        }
        bool kv_followed = cfg->kv_dtype == cfg->dtype;
        cfg->dtype = d;
        if (kv_followed) cfg->kv_dtype = d;
    }
    if (kv_dtype) {
        ar_dtype d;
        if (ar_dtype_parse(kv_dtype, cfg->dtype, &d) != 0) {
            snprintf(err, err_len, "--kv-dtype: unknown dtype '%s'", kv_dtype);
            return -1;
        }
        cfg->kv_dtype = d;
    }
    if (cfg->kv_dtype == cfg->dtype) cfg->kv_scale = 1.0;   /* a scale only means something for fp8 */
    return 0;
}

/* ---- the run ------------------------------------------------------------------------------- */

typedef struct engine {
    replay_opts o;
    ar_run_config cfg;
    const ar_backend *be;
    void *state;
    ar_verifier *verifier;
    ar_trace_reader *rd;
    ar_db *db;
    ar_db_writer *writer;
    ar_batch_reader rdr;
    bool reader_started;
    ar_step_counter counter;
    int64_t run_id;
    char device[128];
    int verify_k;                 /* layers verified per step (0 when --verify off) */
    char verify_layers_label[16];
    /* host output buffers (host verification, dumps), grown to the largest step */
    float *out, *lse;
    size_t cap_out, cap_lse;
    /* the run so far (earlier invocations of a resumed run included) */
    ar_run_progress prog;
    double wall_base;             /* wall_s of earlier invocations */
    double t_start;
    int64_t session_steps;
    int64_t cascade_steps, merge_steps;
    double time_us_total, cascade_time_us, cascade_flat_us;
    double worst_max_abs, worst_nmse;
    int64_t worst_step;
    int64_t bytes_total, flops_total;
    bool dumped;
    /* kernel paths of this invocation's steps (the summary's paths line) */
    const char *path_names[AR_SUMMARY_PATHS];
    int64_t path_steps[AR_SUMMARY_PATHS];
    int num_path_names;
    /* progress line */
    bool progress_tty, progress_log;
    double progress_last;
    int64_t planned;              /* steps this invocation will replay; -1 unknown */
    /* sharding (shard.h) */
    ar_launch launch;
    ar_shard_plan plan;           /* parts == NULL when not sharded */
    int layer_first, layer_last;  /* the layers this run replays, of --layers */
    int64_t user_first, user_last;   /* --steps as given (the shard's range is in o) */
    char db_path[4096];           /* --db with its pattern expanded */
    char host[256];
    char launcher_text[400];
    char device_why[200];
} engine;

/* Layers this run replays. */
static int replayed_layers(const engine *e)
{
    return e->layer_last - e->layer_first + 1;
}

/* Of those, the ones verified (layer < verify_k). */
static int verified_layers(const engine *e, int verify_k)
{
    int last = verify_k - 1 < e->layer_last ? verify_k - 1 : e->layer_last;
    return last >= e->layer_first ? last - e->layer_first + 1 : 0;
}

static const char *verify_label(const replay_opts *o)
{
    return o->verify == AR_VERIFY_ALL ? "all" : o->verify == AR_VERIFY_SAMPLE ? "sample" : "off";
}

static int ensure_host_out(engine *e, int tokens)
{
    const ar_model *m = &e->cfg.model;
    size_t dv = (size_t)(m->attention == AR_ATTN_MLA ? m->v_head_dim : m->head_size);
    size_t need_out = (size_t)tokens * m->num_q_heads * dv + 1, need_lse = (size_t)tokens * m->num_q_heads + 1;
    if (ar_grow((void **)&e->out, &e->cap_out, need_out, sizeof(float))) return -1;
    if (ar_grow((void **)&e->lse, &e->cap_lse, need_lse, sizeof(float))) return -1;
    return 0;
}

/* A cleared forward result, with host out/lse buffers when the verifier needs them for opts
 * (a device backend then copies its output back).  0, or -1 with err set. */
static int clear_forward_out(engine *e, const ar_batch *b, const ar_verify_opts *opts, ar_forward_out *fo,
                             char *err, size_t err_len)
{
    memset(fo, 0, sizeof *fo);
    if (!ar_verifier_needs_host_output(e->verifier, opts)) return 0;
    if (ensure_host_out(e, b->num_tokens) != 0) {
        snprintf(err, err_len, "out of memory for the step's output");
        return -1;
    }
    fo->out = e->out;
    fo->lse = e->lse;
    return 0;
}

static void snapshot(engine *e, ar_run_progress *p)
{
    *p = e->prog;
    p->phase_s[AR_PHASE_SQLITE] = e->writer ? ar_db_writer_seconds(e->writer) : e->prog.phase_s[AR_PHASE_SQLITE];
    p->wall_s = e->wall_base + (ar_mono_seconds() - e->t_start);
}

/* Counts a step that ran kernel path name, for the summary. */
static void note_path(engine *e, const char *name)
{
    for (int i = 0; i < e->num_path_names; i++)
        if (strcmp(e->path_names[i], name) == 0) {
            e->path_steps[i]++;
            return;
        }
    if (e->num_path_names == AR_SUMMARY_PATHS) return;
    e->path_names[e->num_path_names] = name;
    e->path_steps[e->num_path_names++] = 1;
}

static bool is_merge_kernel(const char *name)
{
    return strcmp(name, "merge") == 0 || strcmp(name, "combine") == 0;
}

/* One forward of layer `layer`: times it into the phases.  0, or 3 with err set. */
static int timed_forward(engine *e, int layer, const ar_batch *kb, ar_forward_out *fo, char *err, size_t err_len)
{
    double t0 = ar_mono_seconds();
    ar_call_begin(AR_CALL_FORWARD, kb->step, layer);
    int rc = e->be->forward(e->state, layer, kb, fo, err, err_len);
    ar_call_end();
    if (rc != 0) {
        char inner[AR_ERR_MAX];
        snprintf(inner, sizeof inner, "%s", err);
        snprintf(err, err_len, "the forward of layer %d failed: %s", layer, inner);
        return 3;
    }
    double wall = ar_mono_seconds() - t0;
    /* the timed kernels occupy R x their median of the wall; the rest is generation, launches
     * and copies */
    double kernel = fo->total_us * 1e-6 * e->cfg.repeat;
    if (kernel > wall) kernel = wall;
    e->prog.phase_s[AR_PHASE_KERNEL] += kernel;
    e->prog.phase_s[AR_PHASE_GENERATION] += wall - kernel;
    return 0;
}

/* Runs, verifies and records one step (slot s).  Returns 0; AR_STEP_CANCELLED when a signal
 * came (the step is abandoned); or an exit code (3) with err set. */
static int run_step(engine *e, ar_batch_slot *s, char *err, size_t err_len)
{
    const double t_step = ar_mono_seconds();
    const ar_batch *b = &s->b, *kb = &s->kb;
    ar_step_record *rec = ar_db_writer_record(e->writer);
    if (!rec) {
        const char *why = ar_db_writer_error(e->writer);
        snprintf(err, err_len, "%s", why ? why : "out of memory");
        return 3;
    }
    int rc = 0;
    double t0 = ar_mono_seconds();
    ar_call_begin(AR_CALL_PREPARE, s->step, -1);
    rc = e->be->prepare(e->state, kb, err, err_len);
    ar_call_end();
    if (rc != 0) {
        rc = 3;
        goto out;
    }
    e->prog.phase_s[AR_PHASE_METADATA] += ar_mono_seconds() - t0;
    ar_fill fill = {s->fill_count, s->fill_slots, s->fill_keys, s->fill_offsets};
    const bool dumping = e->o.dump_step == s->step;
    ar_verify_opts vo = {e->o.verify, e->o.sample_rows, e->o.threads, NULL, ar_stop_flag()};
    int verify_k = e->verify_k;
    if (dumping) {
        vo.mode = AR_VERIFY_ALL;
        vo.dump_dir = e->o.dump_dir;
        verify_k = e->layer_last + 1;
    }
    ar_verify_opts vo_off = vo;
    vo_off.mode = AR_VERIFY_OFF;
    vo_off.dump_dir = NULL;
    ar_verify_result step_res, layer_res;
    memset(&step_res, 0, sizeof step_res);
    double time_us = 0;
    int guard_violations = 0, fail_layer = -1;
    bool merged = kb->common_prefix_len > 0;
    ar_forward_out fo;
    for (int layer = e->layer_first; layer <= e->layer_last; layer++) {
        if (ar_stop_signalled()) {
            rc = AR_STEP_CANCELLED;
            goto out;
        }
        const ar_verify_opts *lvo = layer < verify_k ? &vo : &vo_off;
        if (s->fill_count) {
            t0 = ar_mono_seconds();
            ar_call_begin(AR_CALL_FILL, s->step, layer);
            rc = e->be->fill(e->state, layer, &fill, err, err_len);
            ar_call_end();
            if (rc != 0) {
                rc = 3;
                goto out;
            }
            e->prog.phase_s[AR_PHASE_GENERATION] += ar_mono_seconds() - t0;
        }
        if (clear_forward_out(e, b, lvo, &fo, err, err_len) != 0) {
            rc = 3;
            goto out;
        }
        if ((rc = timed_forward(e, layer, kb, &fo, err, err_len)) != 0) goto out;
        time_us += fo.total_us;
        guard_violations += fo.guard_violations;
        for (int k = 0; k < fo.num_kernels; k++) {
            if (ar_step_record_add_kernel(rec, layer, fo.kernels[k].name, fo.kernels[k].us) != 0) {
                snprintf(err, err_len, "out of memory");
                rc = 3;
                goto out;
            }
            if (is_merge_kernel(fo.kernels[k].name)) merged = true;
        }
        for (int k = 0; k < fo.num_paths && k < AR_MAX_PATHS; k++) {
            if (ar_step_record_add_path(rec, fo.paths[k], lvo->mode != AR_VERIFY_OFF) != 0) {
                snprintf(err, err_len, "out of memory");
                rc = 3;
                goto out;
            }
        }
        t0 = ar_mono_seconds();
        int vrc = ar_verifier_check_layer(e->verifier, b, layer, &fo, s->ids, lvo, &layer_res, err, err_len);
        e->prog.phase_s[AR_PHASE_VERIFY] += ar_mono_seconds() - t0;
        if (vrc == AR_VERIFY_CANCELLED || (vrc == 0 && ar_stop_signalled() && layer < e->layer_last)) {
            rc = AR_STEP_CANCELLED;
            goto out;
        }
        if (vrc != 0) {
            rc = 3;
            goto out;
        }
        if (!layer_res.pass && fail_layer < 0) fail_layer = layer;
        ar_verify_accumulate(&step_res, &layer_res, layer == e->layer_first);
    }
    /* What cascade bought: the same step run flat (the first replayed layer, timed the same way),
     * so a replay reports the attention time cascade saved.  The flat run rewrites the same K/V. */
    double flat_us = 0;
    if (kb->common_prefix_len > 0) {
        ar_batch flat = *kb;
        flat.common_prefix_len = 0;
        if (clear_forward_out(e, b, &vo_off, &fo, err, err_len) != 0) {
            rc = 3;
            goto out;
        }
        t0 = ar_mono_seconds();
        ar_call_begin(AR_CALL_PREPARE, s->step, -1);
        rc = e->be->prepare(e->state, &flat, err, err_len);
        ar_call_end();
        if (rc != 0) {
            rc = 3;
            goto out;
        }
        e->prog.phase_s[AR_PHASE_METADATA] += ar_mono_seconds() - t0;
        if ((rc = timed_forward(e, e->layer_first, &flat, &fo, err, err_len)) != 0) goto out;
        flat_us = fo.total_us * replayed_layers(e);
        if (ar_step_record_add_kernel(rec, -1, "flat_equivalent", flat_us) != 0) {
            snprintf(err, err_len, "out of memory");
            rc = 3;
            goto out;
        }
    }
    if (guard_violations > 0) {
        step_res.pass = false;
        snprintf(step_res.reason, sizeof step_res.reason, "%d guard words overwritten", guard_violations);
    }

    /* a shard of layers all past --verify-layers K verified nothing of the step */
    const int layers_verified = vo.mode != AR_VERIFY_OFF ? verified_layers(e, verify_k) : 0;
    const bool verified = layers_verified > 0;
    const int64_t bytes = s->bytes * replayed_layers(e), flops = s->flops * replayed_layers(e);
    rec->row = (ar_step_row){
        .run = e->run_id, .step = s->step, .time = s->time, .num_reqs = b->num_reqs,
        .num_tokens = b->num_tokens, .num_prefill_reqs = s->num_prefill,
        .num_decode_reqs = b->num_reqs - s->num_prefill, .max_query_len = b->max_query_len,
        .max_seq_len = b->max_seq_len, .total_context = s->total_context,
        .cascade = b->common_prefix_len > 0, .prefix_len = b->common_prefix_len,
        .time_us = time_us, .bytes = bytes, .flops = flops,
        .gbps = time_us > 0 ? bytes / (time_us * 1e3) : 0,
        .tflops = time_us > 0 ? flops / (time_us * 1e6) : 0,
        .verified = dumping ? "all" : verified ? verify_label(&e->o) : "off", .rows_checked = step_res.rows_checked,
        .max_abs = step_res.max_abs, .max_rel = step_res.max_rel, .mean_abs = step_res.mean_abs,
        .nmse = step_res.nmse, .lse_max_abs = step_res.lse_max_abs,
        .nan_count = step_res.nan_count, .bad_count = step_res.bad_count,
        .naive_max_abs = step_res.naive_max_abs, .naive_mean_abs = step_res.naive_mean_abs,
        .tol_max_abs = step_res.tol_max_abs, .tol_mean_abs = step_res.tol_mean_abs,
        .guard_ok = guard_violations == 0,
        .pass = verified ? (step_res.pass ? 1 : 0) : (step_res.pass ? -1 : 0),
        .layers_verified = layers_verified, .shard = e->launch.shard};
    if (!step_res.pass) {
        for (int i = 0; i < step_res.num_worst; i++) {
            const ar_worst *w = &step_res.worst[i];
            ar_mismatch_row m = {fail_layer < 0 ? 0 : fail_layer, s->ids[w->req], w->token, w->head, w->dim,
                                 w->got, w->want, w->err};
            if (ar_step_record_add_mismatch(rec, &m) != 0) {
                snprintf(err, err_len, "out of memory");
                rc = 3;
                goto out;
            }
        }
        if (!e->prog.steps_failed && !e->o.quiet)
            fprintf(stderr, "%sstep %lld FAILED: %s%s%s\n", e->progress_tty ? "\n" : "", (long long)s->step,
                    step_res.reason, step_res.num_worst ? "; worst at request " : "",
                    step_res.num_worst ? s->ids[step_res.worst[0].req] : "");
        e->prog.steps_failed++;
    }
    e->prog.steps_done++;
    e->session_steps++;
    e->prog.last_step = s->step;
    if (verified) {
        e->prog.verified_steps++;
        e->prog.verified_layer_steps += layers_verified;
        e->prog.verified_rows += step_res.rows_checked;
    }
    if (dumping) e->dumped = true;
    if (merged) e->merge_steps++;
    e->time_us_total += time_us;
    e->bytes_total += bytes;
    e->flops_total += flops;
    if (b->common_prefix_len > 0) {
        e->cascade_steps++;
        e->cascade_time_us += time_us;
        e->cascade_flat_us += flat_us;
    }
    if (verified && (step_res.max_abs > e->worst_max_abs || e->worst_step < 0)) {
        e->worst_max_abs = step_res.max_abs;
        e->worst_nmse = step_res.nmse;
        e->worst_step = s->step;
    }
    for (int k = 0; k < rec->num_paths; k++) note_path(e, rec->paths[k].name);
    rec->row.wall_us = (ar_mono_seconds() - t_step) * 1e6;
    snapshot(e, &rec->progress);
    t0 = ar_mono_seconds();
    int prc = ar_db_writer_push(e->writer, rec);
    e->prog.phase_s[AR_PHASE_WAIT] += ar_mono_seconds() - t0;
    if (prc != 0) {
        const char *why = ar_db_writer_error(e->writer);
        snprintf(err, err_len, "%s", why ? why : "the database writer stopped");
        return 3;
    }
    return 0;
out:
    ar_db_writer_discard(e->writer, rec);
    return rc;
}

/* ---- progress ----------------------------------------------------------------------------- */

static void format_duration(double s, char *buf, size_t len)
{
    if (!(s >= 0) || s > 1e8) snprintf(buf, len, "?");
    else if (s < 60) snprintf(buf, len, "%.0fs", s);
    else if (s < 3600) snprintf(buf, len, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else snprintf(buf, len, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
}

/* A time in microseconds with the unit that keeps the number short: "840 ns", "12.3 us",
 * "4.56 ms", "123.8 s" (a CPU replay's step takes seconds, a GPU decode step microseconds). */
static void format_time_us(double us, char *buf, size_t len)
{
    const double a = fabs(us);
    if (a < 1) snprintf(buf, len, "%.0f ns", us * 1e3);
    else if (a < 1e3) snprintf(buf, len, "%.3g us", us);
    else if (a < 1e6) snprintf(buf, len, "%.3g ms", us / 1e3);
    else snprintf(buf, len, "%.4g s", us / 1e6);
}

/* Steps this invocation replays: the trace's step count clipped to --steps and the resume point
 * (steps that schedule nothing are counted too; they are skipped quickly). */
static int64_t planned_steps(const engine *e, long long trace_steps, int64_t resume_after)
{
    if (trace_steps < 0) return -1;
    int64_t first = e->o.step_first > resume_after + 1 ? e->o.step_first : resume_after + 1;
    int64_t last = e->o.step_last < trace_steps - 1 ? e->o.step_last : trace_steps - 1;
    return last >= first ? last - first + 1 : 0;
}

static void progress(engine *e, int64_t step, int64_t resume_after, bool final)
{
    if (!e->progress_tty && !e->progress_log) return;
    double t = ar_mono_seconds();
    if (!final && t - e->progress_last < (e->progress_tty ? AR_PROGRESS_TTY_S : AR_PROGRESS_LOG_S)) return;
    e->progress_last = t;
    if (e->planned < 0) {
        long long n = atomic_load(&e->counter.steps);
        if (n >= 0) e->planned = planned_steps(e, n, resume_after);
    }
    double el = t - e->t_start, rate = el > 1e-9 ? e->session_steps / el : 0;
    char total[32] = "?", eta[32] = "?", pct[16] = "";
    if (e->planned >= 0) {
        snprintf(total, sizeof total, "%lld", (long long)e->planned);
        if (e->planned > 0)
            snprintf(pct, sizeof pct, " (%.0f%%)", 100.0 * (double)e->session_steps / (double)e->planned);
        int64_t left = e->planned - e->session_steps;
        if (rate > 0) format_duration(left > 0 ? left / rate : 0, eta, sizeof eta);
    }
    if (e->progress_tty)
        fprintf(stderr, "\r  %lld / %s steps%s  %.2f steps/s  ETA %s  (trace step %lld, %lld failed)   ",
                (long long)e->session_steps, total, pct, rate, eta, (long long)step, (long long)e->prog.steps_failed);
    else
        fprintf(stderr, "attnreplay replay: %lld / %s steps%s, %.2f steps/s, ETA %s, trace step %lld, %lld failed\n",
                (long long)e->session_steps, total, pct, rate, eta, (long long)step, (long long)e->prog.steps_failed);
    fflush(stderr);
}

/* ---- run record, summary ------------------------------------------------------------------ */

static char *config_json(const engine *e)
{
    json_t *j = json_object();
    char steps[64];
    snprintf(steps, sizeof steps, "%lld:%lld", (long long)e->user_first,
             e->user_last == INT64_MAX ? -1LL : (long long)e->user_last);
    json_object_set_new(j, "backend", json_string(e->be->name));
    json_object_set_new(j, "dtype", json_string(ar_dtype_name(e->cfg.dtype)));
    json_object_set_new(j, "kv_dtype", json_string(ar_dtype_name(e->cfg.kv_dtype)));
    json_object_set_new(j, "kv_scale", json_real(e->cfg.kv_scale));
    json_object_set_new(j, "layers", json_integer(e->o.layers));   /* all shards: the same options */
    json_object_set_new(j, "seed", json_integer((json_int_t)e->cfg.seed));
    json_object_set_new(j, "data", json_integer(e->cfg.data));
    json_object_set_new(j, "verify", json_string(verify_label(&e->o)));
    json_object_set_new(j, "sample_rows", json_integer(e->o.sample_rows));
    json_object_set_new(j, "inject", json_string(ar_fault_name(e->cfg.fault)));
    json_object_set_new(j, "cascade", json_integer(e->o.cascade_mode));
    json_object_set_new(j, "repeat", json_integer(e->cfg.repeat));
    json_object_set_new(j, "steps", json_string(steps));
    /* only when not the default, so runs recorded before the option existed still resume */
    if (e->o.verify_layers > 0) json_object_set_new(j, "verify_layers", json_string(e->verify_layers_label));
    char *s = json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(j);
    return s;
}

void ar_cascade_verdict(double cascade_us, double flat_us, char *buf, size_t len)
{
    if (!(flat_us > 0)) {
        if (len > 0) buf[0] = '\0';
        return;
    }
    const double saved = 100.0 * (1 - cascade_us / flat_us);
    if (saved >= 0) snprintf(buf, len, "(saved %.1f%%)", saved);
    else snprintf(buf, len, "(cost %.1f%% more: flat was faster on these steps)", -saved);
}

static void print_summary(const engine *e, const ar_selection *sel, const char *status, const char *reason,
                          const ar_run_progress *p)
{
    const ar_model *m = &e->cfg.model;
    printf("attnreplay replay: %s\n", e->o.trace);
    char layers[64];
    if (e->layer_first > 0) snprintf(layers, sizeof layers, "layers %d..%d of %d", e->layer_first, e->layer_last,
                                     m->num_layers);
    else snprintf(layers, sizeof layers, "%d of %d layers", e->layer_last + 1, m->num_layers);
    printf("  model     %s (%s, %d q / %d kv heads, head %d, %s)\n", m->name,
           m->attention == AR_ATTN_MLA ? "mla" : "mha", m->num_q_heads, m->num_kv_heads,
           m->head_size, layers);
    if (e->launch.count > 1)
        printf("  shard     %d/%d (%s), split by %s\n", e->launch.shard, e->launch.count, e->launcher_text,
               ar_shard_by_name(e->plan.by));
    printf("  backend   %s on %s, dtype %s, kv %s%s%s\n", e->be->name, e->device,
           ar_dtype_name(e->cfg.dtype), ar_dtype_name(e->cfg.kv_dtype),
           e->cfg.fault ? ", injected fault " : "", e->cfg.fault ? ar_fault_name(e->cfg.fault) : "");
    for (int i = 0; i < sel->count; i++)
        if (!sel->entries[i].chosen)
            printf("            passed over %s: %s\n", sel->entries[i].backend->name, sel->entries[i].why);
    printf("  steps     %lld replayed, %lld failed, %lld unverified (verify %s)\n",
           (long long)p->steps_done, (long long)p->steps_failed, (long long)(p->steps_done - p->verified_steps),
           verify_label(&e->o));
    if (e->o.verify != AR_VERIFY_OFF || p->verified_steps > 0) {
        char what[96];
        if (e->o.verify == AR_VERIFY_SAMPLE)
            snprintf(what, sizeof what, "up to %d rows a step + each request's last", e->o.sample_rows);
        else
            snprintf(what, sizeof what, "every row");
        printf("  verified  %lld steps x %d of %d layers (%lld layer-steps), %lld rows (%s), on the %s\n",
               (long long)p->verified_steps, verified_layers(e, e->verify_k), replayed_layers(e),
               (long long)p->verified_layer_steps,
               (long long)p->verified_rows, what, ar_verifier_where(e->verifier));
    }
    if (e->num_path_names > 0) {
        printf("  paths    ");
        for (int i = 0; i < e->num_path_names; i++)
            printf("%s %s %lld step%s", i ? "," : "", e->path_names[i], (long long)e->path_steps[i],
                   e->path_steps[i] == 1 ? "" : "s");
        printf("%s\n", e->o.resume ? " (this invocation)" : "");
    }
    if (e->worst_step >= 0)
        printf("  accuracy  worst step %lld: max abs err %.3g, NMSE %.3g\n", (long long)e->worst_step,
               e->worst_max_abs, e->worst_nmse);
    if (e->session_steps > 0) {
        char total[32], mean[32];
        format_time_us(e->time_us_total, total, sizeof total);
        format_time_us(e->time_us_total / e->session_steps, mean, sizeof mean);
        printf("  time      attention %s total, %s/step mean; %.2f GB/s, %.3g TFLOP/s\n", total, mean,
               e->time_us_total > 0 ? e->bytes_total / (e->time_us_total * 1e3) : 0,
               e->time_us_total > 0 ? e->flops_total / (e->time_us_total * 1e6) : 0);
    }
    if (e->cascade_steps > 0) {
        char verdict[96];
        ar_cascade_verdict(e->cascade_time_us, e->cascade_flat_us, verdict, sizeof verdict);
        printf("  cascade   %lld steps used it: %.3f ms of attention vs %.3f ms flat on the same steps %s\n",
               (long long)e->cascade_steps, e->cascade_time_us / 1e3, e->cascade_flat_us / 1e3, verdict);
    }
    const double wall = p->wall_s > 0 ? p->wall_s : 1e-9, *ph = p->phase_s;
    const double loop = ph[AR_PHASE_KERNEL] + ph[AR_PHASE_VERIFY] + ph[AR_PHASE_GENERATION] +
                        ph[AR_PHASE_METADATA] + ph[AR_PHASE_WAIT] + ph[AR_PHASE_SETUP];
    printf("  phases    wall %.2f s: kernel %.2f, verify %.2f, generation %.2f, metadata %.2f, wait %.2f, "
           "setup %.2f, other %.2f s\n", p->wall_s, ph[AR_PHASE_KERNEL], ph[AR_PHASE_VERIFY],
           ph[AR_PHASE_GENERATION], ph[AR_PHASE_METADATA], ph[AR_PHASE_WAIT], ph[AR_PHASE_SETUP],
           wall - loop > 0 ? wall - loop : 0);
    printf("            outside the kernels %.1f%% of the wall (%.3f ms a step, setup aside); on other "
           "threads: parse %.2f s, sqlite %.2f s\n", 100.0 * (wall - ph[AR_PHASE_KERNEL]) / wall,
           p->steps_done > 0 ? 1e3 * (wall - ph[AR_PHASE_KERNEL] - ph[AR_PHASE_SETUP]) / (double)p->steps_done : 0.0,
           ph[AR_PHASE_PARSE], ph[AR_PHASE_SQLITE]);
    printf("  result    %s  (run %lld in %s)\n", status, (long long)e->run_id, e->db_path);
    if (reason) printf("            %s\n", reason);
}

/* Releases the engine; the backend is closed last, once the database is closed, so that a
 * plugin whose close() faults or hangs (the watchdog ends the process) leaves nothing half done. */
static void engine_free(engine *e)
{
    ar_step_counter_stop(&e->counter);
    if (e->reader_started) ar_reader_finish(&e->rdr);
    else free(e->rdr.written);
    if (e->writer) ar_db_writer_free(e->writer);
    if (e->verifier) ar_verifier_close(e->verifier);
    if (e->rd) ar_trace_close(e->rd);
    if (e->db) ar_db_close(e->db);
    ar_shard_plan_free(&e->plan);
    free(e->out);
    free(e->lse);
    if (e->state) e->be->close(e->state);
}

/* Creates dir and its missing parents; checks it is a writable directory.  0 or -1 + err. */
static int make_dump_dir(const char *dir, char *err, size_t err_len)
{
    char path[512];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path) {
        snprintf(err, err_len, "--dump-dir %s: path too long", dir);
        return -1;
    }
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST) {
            snprintf(err, err_len, "--dump-dir: cannot create the directory %s: %s", path, strerror(errno));
            return -1;
        }
        *p = c;
        if (!c) break;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        snprintf(err, err_len, "--dump-dir %s: %s", dir, errno ? strerror(errno) : "not a directory");
        return -1;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(err, err_len, "--dump-dir %s: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* Checks the options against the trace and the chosen backend before anything is written.
 * 0, or -1 with err set (a usage error). */
static int check_options(engine *e, char *err, size_t err_len)
{
    const ar_model *m = &e->cfg.model;
    if (e->o.kv_scale_given && e->cfg.kv_dtype != AR_FP8_E4M3) {
        snprintf(err, err_len, "--kv-scale applies to an fp8 KV cache only; this run's KV cache is %s "
                 "(add --kv-dtype fp8_e4m3)", ar_dtype_name(e->cfg.kv_dtype));
        return -1;
    }
    if (e->o.fault == AR_FAULT_MLA_NO_WUV && m->attention != AR_ATTN_MLA) {
        snprintf(err, err_len, "--inject mla-no-wuv needs an MLA model; %s is MHA, so the fault could never fire",
                 m->name);
        return -1;
    }
    if (e->o.verify_layers > e->cfg.num_layers) {
        snprintf(err, err_len, "--verify-layers %d but only %d layer%s replayed (--layers)", e->o.verify_layers,
                 e->cfg.num_layers, e->cfg.num_layers == 1 ? " is" : "s are");
        return -1;
    }
    if (e->o.dump_step >= 0 && m->attention == AR_ATTN_MLA) {
        snprintf(err, err_len, "--dump-step is not available for MLA traces yet");
        return -1;
    }
    if (e->o.dump_step >= 0) {
        long long steps = ar_count_trace_steps(e->o.trace, NULL);
        if (steps >= 0 && e->o.dump_step >= steps) {
            snprintf(err, err_len, "--dump-step %lld: the trace has %lld steps (0..%lld), so nothing would be "
                     "dumped", (long long)e->o.dump_step, steps, steps - 1);
            return -1;
        }
        if (make_dump_dir(e->o.dump_dir, err, err_len) != 0) return -1;
    }
    return 0;
}

/* This process's shard (shard.h): the launcher or --shard, the plan and this shard's part of it
 * (its steps become the reader's range, its layers the loop's), the database path and the
 * device.  Without sharding the run replays --steps and every layer, as always.  0, or -1 with
 * err set (a usage error). */
static int setup_shard(engine *e, char *err, size_t err_len)
{
    e->user_first = e->o.step_first;
    e->user_last = e->o.step_last;
    e->layer_first = 0;
    e->layer_last = e->cfg.num_layers - 1;
    if (gethostname(e->host, sizeof e->host) != 0) snprintf(e->host, sizeof e->host, "localhost");
    e->host[sizeof e->host - 1] = '\0';
    if (ar_launch_detect(e->o.shard_text, environ, &e->launch, err, err_len) != 0) return -1;
    if (e->launch.count > 1 && e->o.dump_step >= 0) {
        snprintf(err, err_len, "--dump-step writes one step's tensors: replay it unsharded (this process is shard "
                 "%d/%d from %s)", e->launch.shard, e->launch.count, e->launch.detail);
        return -1;
    }
    if (e->launch.count > 1 || e->o.plan_only) {
        const ar_shard_verify verify = e->o.verify == AR_VERIFY_OFF ? AR_SHARD_VERIFY_OFF
                                       : e->o.verify == AR_VERIFY_SAMPLE ? AR_SHARD_VERIFY_SAMPLE : AR_SHARD_VERIFY_ALL;
        if (ar_shard_plan_trace(e->o.trace, e->o.step_first, e->o.step_last, e->cfg.num_layers, e->verify_k, verify,
                                e->launch.count, e->o.shard_by, &e->plan, err, err_len) != 0)
            return -1;
        const ar_shard_part *part = &e->plan.parts[e->launch.shard];
        e->o.step_first = part->step_first;
        e->o.step_last = part->step_last;
        e->layer_first = part->layer_first;
        e->layer_last = part->layer_last;
        /* backends index caches by layer and generate a layer's data from its index, so a shard
         * of layers a..b opens b + 1 of them and runs a..b */
        e->cfg.num_layers = e->layer_last + 1;
    }
    if (e->o.plan_only) return 0;
    if (ar_shard_path(e->o.db, e->launch.shard, e->launch.count, e->host, e->db_path, sizeof e->db_path, err,
                      err_len) != 0)
        return -1;
    if (e->o.device >= 0) {
        e->cfg.device_index = e->o.device;
        snprintf(e->device_why, sizeof e->device_why, "device %d (--device)", e->o.device);
    } else {
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        /* counting devices starts CUDA: only when the local rank needs it */
        int count = e->launch.local_rank > 0 && !visible ? ar_pdev_count() : 0;
        e->cfg.device_index = ar_launch_device(e->launch.local_rank, visible, count, e->device_why,
                                               sizeof e->device_why);
    }
    if (strcmp(e->launch.source, "--shard") == 0)
        snprintf(e->launcher_text, sizeof e->launcher_text, "%s", e->launch.detail);
    else if (strcmp(e->launch.source, "none") != 0)
        snprintf(e->launcher_text, sizeof e->launcher_text, "%s: %s", e->launch.source, e->launch.detail);
    else
        snprintf(e->launcher_text, sizeof e->launcher_text, "none");
    return 0;
}

/* The shard fields of the run row. */
static ar_run_shard run_shard(const engine *e)
{
    ar_run_shard r = {e->launch.shard, e->launch.count, ar_shard_by_name(e->plan.parts ? e->plan.by : AR_SHARD_BY_STEPS),
                      e->o.step_first, e->o.step_last == INT64_MAX ? -1 : e->o.step_last, e->layer_first,
                      e->layer_last, e->host, e->cfg.device_index, e->launcher_text};
    return r;
}

/* Which shard this is, and the whole plan from shard 0 (each shard prints the same plan). */
static void print_shard(const engine *e)
{
    if (e->launch.count <= 1) return;
    if (e->launch.shard == 0) ar_shard_plan_print(stderr, &e->plan, e->o.trace, 0);
    const ar_shard_part *part = &e->plan.parts[e->launch.shard];
    char steps[64];
    if (part->step_first <= part->step_last)
        snprintf(steps, sizeof steps, "steps %lld..%lld", (long long)part->step_first, (long long)part->step_last);
    else
        snprintf(steps, sizeof steps, "no steps");
    fprintf(stderr, "attnreplay replay: shard %d/%d on %s (%s): %s, layers %d..%d, %s, database %s\n",
            e->launch.shard, e->launch.count, e->host, e->launcher_text, steps, part->layer_first, part->layer_last,
            e->device_why, e->db_path);
    if (!strstr(e->o.db, "%r"))
        fprintf(stderr, "attnreplay replay: note: --db %s has no %%r, so all %d shards write one database: fine on "
                "one host's local disk; on a shared file system give each shard its own (runs-%%r.db)\n",
                e->o.db, e->launch.count);
}

/* The exit code of a run ended by its database (err set by the failed call): 2 when another
 * connection's lock outlasted the busy timeout (a busy database is bad input, as for report and
 * diff), else 3.  A writer stopped because another process wrote the run is not a lock: 3. */
static int db_failure_exit(const engine *e)
{
    const bool writer_failed = e->writer && ar_db_writer_error(e->writer);
    return (writer_failed ? ar_db_writer_locked(e->writer) : ar_db_locked(e->db)) ? 2 : 3;
}

/* Why nothing was replayed, for the 'empty' outcome. */
static void empty_reason(const engine *e, int64_t resume_after, char *buf, size_t len)
{
    const int64_t seen = e->rdr.last_step_seen;
    if (seen < 0)
        snprintf(buf, len, "no step was replayed: the trace has no steps");
    else if (e->o.step_first > seen)
        snprintf(buf, len, "no step was replayed: the trace's steps are 0..%lld and --steps starts at %lld",
                 (long long)seen, (long long)e->o.step_first);
    else if (resume_after >= seen || resume_after >= e->o.step_last)
        snprintf(buf, len, "no step was replayed: every step was committed before this resume");
    else
        snprintf(buf, len, "no step was replayed: the steps in range schedule no request");
}

int ar_replay_main(int argc, char **argv)
{
    engine E, *e = &E;
    memset(e, 0, sizeof *e);
    e->worst_step = -1;
    e->prog.last_step = -1;
    e->planned = -1;
    ar_step_counter_init(&e->counter);
    char err[AR_ERR_MAX + 256] = "";
    int parsed = ar_replay_parse_opts(argc, argv, &e->o);
    if (parsed == 1) return 0;   /* --help */
    if (parsed != 0) {
        ar_replay_usage(stderr);
        return 2;
    }
    e->t_start = ar_mono_seconds();

    /* Signals from here on: the handler only sets the flag; the watchdog enforces the 2 s. */
    struct sigaction old_int, old_term;
    ar_stop_signals_install(&old_int, &old_term);
    ar_watchdog wd;
    ar_watchdog_start(&wd, e->o.quiet);

    int exit_code = 0;
    const char *status = NULL, *stored_status = NULL;   /* stored: the outcome a run row holds */
    char fail_msg[AR_ERR_MAX + 512] = "", reason[AR_ERR_MAX + 512] = "";
    ar_selection sel;
    memset(&sel, 0, sizeof sel);
    char *cfg_json = NULL;
    int64_t resume_after = -1, at_step = -1;
    bool run_exists = false;   /* a run row exists: its status says how it ended */
#define SETUP_FAIL(code, ...)                                                                    \
    do {                                                                                         \
        fprintf(stderr, "attnreplay replay: " __VA_ARGS__);                                      \
        fputc('\n', stderr);                                                                     \
        exit_code = (code);                                                                      \
        goto done;                                                                               \
    } while (0)

    e->rd = ar_trace_open(e->o.trace, err, sizeof err);
    if (!e->rd) SETUP_FAIL(2, "%s", err);
    const ar_trace_header *h = ar_trace_header_of(e->rd);
    if (ar_run_config_from_header(h, e->o.dtype, e->o.kv_dtype, e->o.kv_scale, &e->cfg, err, sizeof err) != 0)
        SETUP_FAIL(2, "%s", err);
    e->cfg.num_layers = e->o.layers;
    if (e->cfg.num_layers > h->model.num_layers)
        SETUP_FAIL(2, "--layers %d but the model has %d layers", e->cfg.num_layers, h->model.num_layers);
    if (e->o.seed_given) e->cfg.seed = e->o.seed;
    e->cfg.data = e->o.data;
    e->cfg.fault = e->o.fault;
    e->cfg.cascade_mode = e->o.cascade_mode;
    e->cfg.repeat = e->o.repeat;
    e->cfg.threads = e->o.threads;
    e->verify_k = e->o.verify == AR_VERIFY_OFF ? 0 : e->o.verify_layers > 0 ? e->o.verify_layers : e->cfg.num_layers;
    if (e->o.verify_layers_first) snprintf(e->verify_layers_label, sizeof e->verify_layers_label, "first");
    else if (e->o.verify_layers > 0) snprintf(e->verify_layers_label, sizeof e->verify_layers_label, "%d", e->o.verify_layers);
    else snprintf(e->verify_layers_label, sizeof e->verify_layers_label, "all");
    if (check_options(e, err, sizeof err) != 0) SETUP_FAIL(2, "%s", err);
    if (setup_shard(e, err, sizeof err) != 0) SETUP_FAIL(2, "%s", err);
    if (e->o.plan_only) {
        ar_shard_plan_print(stdout, &e->plan, e->o.trace, e->launch.count > 1 ? e->launch.shard : -1);
        goto done;
    }
    if (ar_db_check_writable(e->db_path, err, sizeof err) != 0) SETUP_FAIL(2, "--db %s", err);
    if (!e->o.quiet) print_shard(e);

    /* a plugin's init and check run here, under the watchdog (a fault or hang: exit 2) */
    const double timeout_given = given_timeout(&e->o);
    ar_call_set_timeout(call_timeout(timeout_given, NULL));
    e->be = ar_backend_select(&e->cfg, e->o.backend, &sel);
    if (!e->be) {
        if (sel.failed) {
            int code = sel.failed->backend->needs_gpu && (strstr(sel.failed->why, "no CUDA device") ||
                                                          strstr(sel.failed->why, "without CUDA")) ? 3 : 2;
            SETUP_FAIL(code, "backend %s cannot run this trace: %s", sel.failed->backend->name, sel.failed->why);
        }
        if (strcmp(e->o.backend, "auto") != 0 && !ar_backend_find(e->o.backend))
            SETUP_FAIL(2, "unknown backend '%s'; `attnreplay backends` lists them", e->o.backend);
        fprintf(stderr, "attnreplay replay: no backend supports this trace:\n");
        for (int i = 0; i < sel.count; i++)
            fprintf(stderr, "  %s: %s\n", sel.entries[i].backend->name, sel.entries[i].why);
        exit_code = 2;
        goto done;
    }
    ar_call_set_timeout(call_timeout(timeout_given, e->be));
    ar_watchdog_set_backend(&wd, e->be->name);
    ar_call_begin(AR_CALL_OPEN, -1, -1);
    int code = e->be->open(&e->cfg, &e->state, err, sizeof err);
    ar_call_end();
    if (code != 0) {
        e->state = NULL;
        SETUP_FAIL(code == 2 ? 2 : 3, "backend %s: %s", e->be->name, err);
    }
    e->be->device_name(e->state, e->device, sizeof e->device);
    /* a run that verifies nothing (NaN and guard checks, a dumped step) keeps the device's memory */
    const ar_verifier_options vopen = {.device_mem = e->o.verify == AR_VERIFY_OFF ? AR_GPU_REF_LEAST : e->o.verify_mem};
    if (ar_verifier_open_with(&e->verifier, &e->cfg, e->be, &vopen, err, sizeof err) != 0)
        SETUP_FAIL(3, "verifier: %s", err);
    e->rdr.written = calloc((size_t)e->cfg.num_blocks, sizeof *e->rdr.written);
    if (!e->rdr.written) SETUP_FAIL(3, "out of memory");
    if (ar_stop_signalled()) goto done;

    bool bad_db = false;
    e->db = ar_db_open(e->db_path, false, &bad_db, err, sizeof err);
    if (!e->db) SETUP_FAIL(bad_db ? 2 : 3, "%s", err);
    char hash[17];
    if (ar_trace_file_hash(e->o.trace, hash) != 0) SETUP_FAIL(2, "%s: cannot read: %s", e->o.trace, strerror(errno));
    cfg_json = config_json(e);
    if (!cfg_json) SETUP_FAIL(3, "out of memory");
    ar_run_shard shard_row = run_shard(e);
    if (e->o.resume) {
        int found = ar_db_find_resumable(e->db, hash, cfg_json, &shard_row, &e->run_id, &e->prog, err, sizeof err);
        if (found < 0) SETUP_FAIL(db_failure_exit(e), "%s", err);
        if (found == 0 && e->launch.count > 1)
            SETUP_FAIL(2, "--resume: no unfinished run of %s with these options as shard %d/%d (steps %lld..%lld, "
                       "layers %d..%d) in %s", e->o.trace, e->launch.shard, e->launch.count,
                       (long long)e->o.step_first, (long long)e->o.step_last, e->layer_first, e->layer_last,
                       e->db_path);
        if (found == 0)
            SETUP_FAIL(2, "--resume: no unfinished run of %s with these options in %s", e->o.trace, e->db_path);
        resume_after = e->prog.last_step;
        e->wall_base = e->prog.wall_s;
        if (e->o.fault == AR_FAULT_MERGE_NO_WEIGHTS) {
            static const char *const merge_names[] = {"merge", "combine", NULL};
            int64_t n = ar_db_count_kernels(e->db, e->run_id, merge_names, err, sizeof err);
            if (n < 0) SETUP_FAIL(db_failure_exit(e), "%s", err);
            e->merge_steps = n;
        }
    } else {
        ar_run_row rr = {e->o.trace, hash, e->be->name, e->device, ar_dtype_name(e->cfg.dtype),
                         ar_dtype_name(e->cfg.kv_dtype), h->model.name, replayed_layers(e), cfg_json,
                         AR_CODE_REV, e->cfg.seed, verify_label(&e->o), ar_fault_name(e->cfg.fault),
                         e->o.cascade_mode == 0 ? "off" : e->o.cascade_mode == 1 ? "auto" : "on",
                         e->cfg.repeat, e->verify_layers_label, ar_verifier_where(e->verifier), shard_row};
        e->run_id = ar_db_create_run(e->db, &rr, now_wall(), err, sizeof err);
        if (e->run_id < 0) SETUP_FAIL(db_failure_exit(e), "%s", err);
    }
    free(cfg_json);
    cfg_json = NULL;
    run_exists = true;

    /* The pipeline: writer, reader, step counter (for the progress line). */
    const bool overlap = !e->o.no_overlap;
    e->writer = ar_db_writer_start(e->db, e->run_id, e->prog.last_step, overlap, e->prog.phase_s[AR_PHASE_SQLITE],
                                   err, sizeof err);
    if (!e->writer) SETUP_FAIL(3, "%s", err);
    ar_watchdog_set_writer(&wd, e->writer, e->run_id, e->db_path);
    ar_batch_reader *r = &e->rdr;
    r->rd = e->rd;
    r->cfg = &e->cfg;
    r->cascade_mode = ar_backend_runs_cascade(e->be) ? e->o.cascade_mode : 0;   /* a flat-only plugin: never */
    r->step_first = e->o.step_first;
    r->step_last = e->o.step_last;
    r->resume_after = resume_after;
    r->last_step_seen = -1;
    if (ar_reader_start(r, overlap, err, sizeof err) != 0) {
        e->reader_started = true;   /* the slots and written[] are freed by reader_finish */
        snprintf(fail_msg, sizeof fail_msg, "%s", err);
        exit_code = 3;
        goto finish;
    }
    e->reader_started = true;
    e->progress_tty = !e->o.quiet && isatty(2);
    e->progress_log = !e->o.quiet && !e->progress_tty;
    e->progress_last = ar_mono_seconds();
    if (!e->o.quiet) {
        ar_step_counter_start(&e->counter, e->o.trace);
    }

    e->prog.phase_s[AR_PHASE_SETUP] += ar_mono_seconds() - e->t_start;
    at_step = resume_after;
    for (;;) {
        ar_batch_slot *s = ar_reader_take(r, &e->prog.phase_s[AR_PHASE_WAIT]);
        e->prog.phase_s[AR_PHASE_PARSE] += s->parse_s;
        e->prog.phase_s[AR_PHASE_METADATA] += s->build_s;
        if (s->kind == SLOT_END) {
            if (s->end_rc > 0) {
                snprintf(fail_msg, sizeof fail_msg, "%s", s->end_msg);
                exit_code = s->end_rc;
            }
            ar_reader_release(r, s);
            break;
        }
        if (ar_stop_signalled()) {
            ar_reader_release(r, s);
            break;
        }
        int rc = run_step(e, s, err, sizeof err);
        int64_t step = s->step;
        ar_reader_release(r, s);
        if (rc == AR_STEP_CANCELLED) break;
        if (rc != 0) {
            if (ar_db_writer_error(e->writer)) {   /* the database, not this step */
                snprintf(fail_msg, sizeof fail_msg, "%s", ar_db_writer_error(e->writer));
                rc = db_failure_exit(e);
            } else {
                snprintf(fail_msg, sizeof fail_msg, "step %lld: %s", (long long)step, err);
            }
            exit_code = rc;
            break;
        }
        at_step = step;
        progress(e, step, resume_after, false);
        if (ar_stop_signalled()) break;
    }
    if (e->progress_tty && e->session_steps > 0) {
        progress(e, at_step, resume_after, true);
        fputc('\n', stderr);
    }
    char vline[1024];   /* the device verifier: its last cross-check, and what it did */
    if (ar_verifier_finish(e->verifier, vline, sizeof vline, err, sizeof err) != 0 && exit_code == 0) {
        snprintf(fail_msg, sizeof fail_msg, "%s", err);
        exit_code = 3;
    }
    if (vline[0] && !e->o.quiet) {
        fprintf(stderr, "  %s\n", vline);
    }

finish:;
    /* The outcome.  A signal wins over everything but an error that came first. */
    const int sig = ar_stop_signalled();
    if (e->writer && ar_db_writer_drain(e->writer) != 0 && exit_code == 0) {
        /* the last steps could not be committed (disk full, I/O error, a lock) */
        snprintf(fail_msg, sizeof fail_msg, "%s", ar_db_writer_error(e->writer));
        exit_code = db_failure_exit(e);
    }
    ar_run_progress final;
    snapshot(e, &final);
    if (exit_code != 0) {
        status = "error";
    } else if (sig) {
        status = "interrupted";
        exit_code = 128 + sig;
        snprintf(reason, sizeof reason, "interrupted by %s after step %lld", sig == SIGINT ? "SIGINT" : "SIGTERM",
                 (long long)at_step);
    } else if (final.steps_done == 0 && e->plan.parts && e->plan.parts[e->launch.shard].steps == 0) {
        /* planned: more shards than steps with work; the merge counts this shard as done */
        status = "empty";
        snprintf(reason, sizeof reason, "shard %d/%d: the plan gives it no step with work (%lld among %d shards)",
                 e->launch.shard, e->launch.count, (long long)e->plan.work_steps, e->launch.count);
    } else if (final.steps_done == 0) {
        status = "empty";
        exit_code = AR_EXIT_NOTHING_VERIFIED;
        empty_reason(e, resume_after, reason, sizeof reason);
    } else if (final.steps_failed > 0) {
        status = "failed";
        exit_code = 1;
    } else if (e->o.fault != AR_FAULT_NONE && e->o.verify != AR_VERIFY_OFF) {
        status = "fault-not-fired";
        exit_code = AR_EXIT_NOTHING_VERIFIED;
        if (e->o.fault == AR_FAULT_MERGE_NO_WEIGHTS && e->merge_steps == 0)
            snprintf(reason, sizeof reason, "the planted fault merge-no-weights never fired: no step ran a cascade "
                     "or split-KV merge%s", e->o.cascade_mode == 0 ? " (--cascade off)" : "");
        else
            snprintf(reason, sizeof reason, "the planted fault %s never showed: no step failed verification",
                     ar_fault_name(e->o.fault));
    } else if (e->o.verify == AR_VERIFY_OFF) {
        status = "unverified";
    } else {
        status = "passed";
    }
    const char *stored_reason = fail_msg[0] ? fail_msg : reason[0] ? reason : NULL;
    if (e->writer && ar_db_writer_finish(e->writer, status, stored_reason, &final, now_wall(), err, sizeof err) != 0) {
        fprintf(stderr, "attnreplay replay: %s (the run stays 'running'; --resume continues it)\n", err);
        if (exit_code == 0 || exit_code == 1 || exit_code == AR_EXIT_NOTHING_VERIFIED) exit_code = db_failure_exit(e);
    } else if (e->writer) {
        stored_status = status;
    }
    snapshot(e, &final);
    if (fail_msg[0]) fprintf(stderr, "attnreplay replay: %s\n", fail_msg);
    if (exit_code == AR_EXIT_NOTHING_VERIFIED) fprintf(stderr, "attnreplay replay: %s\n", reason);
    if (!e->o.quiet) print_summary(e, &sel, status, stored_reason, &final);
    if (exit_code == 0 && e->o.dump_step >= 0 && !e->dumped) {
        fprintf(stderr, "attnreplay replay: --dump-step %lld: the step was not replayed (it schedules no request "
                "or was committed before this resume), so nothing was dumped\n", (long long)e->o.dump_step);
        exit_code = 2;
    }

done:
    free(cfg_json);
    /* stdout flushed before the backend's close, which may end the process: a summary that
     * could not be written is exit 3 when nothing else failed (the run is stored as it ended) */
    if (ar_stdout_check("replay") != 0 && exit_code == 0) exit_code = 3;
    /* The outcome is stored (or no run holds one): the writer is no longer the watchdog's, which
     * watches the backend's close to the end (a fault or hang there: a message, the run as
     * stored, exit 3 unless exit_code says more). */
    ar_watchdog_closing(&wd, stored_status, exit_code);
    engine_free(e);
    ar_watchdog_stop(&wd);
    ar_crash_handler_remove();
    ar_stop_signals_restore(&old_int, &old_term);
    if (exit_code == 0 && ar_stop_signalled() && !run_exists) exit_code = 128 + ar_stop_signalled();   /* during setup */
    return exit_code;
#undef SETUP_FAIL
}
