/* replay.c - the replay engine and the `replay` command (DESIGN sections 2, 7-9).
 *
 * Per step: the trace reader validates and applies the step record (block lists, computed
 * tokens); the engine turns it into a backend-independent ar_batch (query_start_loc, seq_lens,
 * block table, content keys, slot_mapping, the cascade prefix), writes any context tokens this
 * run never wrote (a replay that starts mid-trace), runs the backend per layer, verifies each
 * layer against the float64 reference, and stores the step in SQLite.
 *
 * Steps are committed in batches (AR_COMMIT_EVERY steps or one second), each batch together
 * with the run's progress, so a killed replay leaves whole steps only and --resume continues
 * after the last committed one.  SIGINT finishes the current step, commits, and marks the run
 * 'interrupted'.
 *
 * Exit codes: 0 every verified step passed, 1 a step failed verification, 2 bad input or
 * usage, 3 a device or runtime error (including a database write failure). */
#include "replay.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../reference/cascade.h"
#include "db.h"
#include "registry.h"
#include "verify.h"

#ifndef AR_CODE_REV
#define AR_CODE_REV "unknown"
#endif

#define AR_COMMIT_EVERY 32
#define AR_NUM_SMS_DEFAULT 132   /* cascade cost model: an H200's SM count (vLLM uses the device's) */

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static double now_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- options ------------------------------------------------------------------------------ */

typedef struct replay_opts {
    const char *trace;
    const char *db;
    const char *backend;         /* "auto" or a name */
    const char *dtype;           /* NULL = the trace's */
    const char *kv_dtype;        /* NULL = the trace's */
    double kv_scale;
    int layers;                  /* 0 = 1 */
    int64_t step_first, step_last;
    ar_verify_mode verify;
    int sample_rows;
    bool seed_given;
    uint64_t seed;
    ar_fault fault;
    bool resume;
    int cascade_mode;            /* 0 off, 1 auto, 2 on */
    int repeat;
    int threads;
    ar_datadist data;
    int64_t dump_step;           /* -1 = none */
    const char *dump_dir;
    bool quiet;
} replay_opts;

static void replay_usage(FILE *f)
{
    fprintf(f,
        "usage: attnreplay replay TRACE --db FILE [options]\n"
        "  --backend auto|NAME      backend (default auto: first that supports the trace)\n"
        "  --dtype bf16|fp16|fp32   model dtype (default: the trace's)\n"
        "  --kv-dtype auto|fp8_e4m3 KV-cache dtype (default: the trace's); --kv-scale X for fp8\n"
        "  --layers N               layers to replay (default 1; each has its own cache and data)\n"
        "  --steps A:B              replay steps A..B inclusive (either side may be empty)\n"
        "  --verify all|sample:N|off  check every row, N rows per step (+ each request's last), or none\n"
        "  --seed S                 data seed (default: the trace's)\n"
        "  --data normal|outlier|large  input distribution (default normal)\n"
        "  --inject FAULT           plant a fault: causal-off-by-one, wrong-slot, stale-block-table,\n"
        "                           wrong-kv-head, no-rescale, lse-base2, merge-no-weights, mla-no-wuv\n"
        "  --cascade auto|on|off    cascade attention: vLLM's heuristic, whenever legal, or never\n"
        "  --repeat R               timed repetitions per launch, median stored (default 1)\n"
        "  --threads N              CPU threads (default: all cores)\n"
        "  --resume                 continue the newest unfinished run of this trace and config\n"
        "  --dump-step N --dump-dir DIR  write step N's inputs/outputs/reference as .npy\n"
        "  --quiet                  no summary\n"
        "exit: 0 all verified steps pass, 1 a step failed, 2 bad input/usage, 3 device/runtime error\n");
}

static int parse_steps(const char *s, int64_t *a, int64_t *b)
{
    const char *colon = strchr(s, ':');
    char *end;
    if (!colon) return -1;
    *a = 0;
    *b = INT64_MAX;
    if (colon != s) {
        *a = strtoll(s, &end, 10);
        if (end != colon || *a < 0) return -1;
    }
    if (colon[1]) {
        *b = strtoll(colon + 1, &end, 10);
        if (*end || *b < *a) return -1;
    }
    return 0;
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Returns 0, 1 after printing --help, or -1 on a bad option (message printed). */
static int parse_replay_opts(int argc, char **argv, replay_opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "auto";
    o->kv_scale = 1.0;
    o->step_last = INT64_MAX;
    o->verify = AR_VERIFY_ALL;
    o->cascade_mode = 1;
    o->repeat = 1;
    o->dump_step = -1;
    o->layers = 1;
    enum { O_DB = 256, O_BACKEND, O_DTYPE, O_KVDTYPE, O_KVSCALE, O_LAYERS, O_STEPS, O_VERIFY,
           O_SEED, O_INJECT, O_RESUME, O_CASCADE, O_REPEAT, O_THREADS, O_DATA, O_DUMPSTEP,
           O_DUMPDIR, O_QUIET, O_HELP };
    static const struct option longopts[] = {
        {"db", required_argument, 0, O_DB}, {"backend", required_argument, 0, O_BACKEND},
        {"dtype", required_argument, 0, O_DTYPE}, {"kv-dtype", required_argument, 0, O_KVDTYPE},
        {"kv-scale", required_argument, 0, O_KVSCALE}, {"layers", required_argument, 0, O_LAYERS},
        {"steps", required_argument, 0, O_STEPS}, {"verify", required_argument, 0, O_VERIFY},
        {"seed", required_argument, 0, O_SEED}, {"inject", required_argument, 0, O_INJECT},
        {"resume", no_argument, 0, O_RESUME}, {"cascade", required_argument, 0, O_CASCADE},
        {"repeat", required_argument, 0, O_REPEAT}, {"threads", required_argument, 0, O_THREADS},
        {"data", required_argument, 0, O_DATA}, {"dump-step", required_argument, 0, O_DUMPSTEP},
        {"dump-dir", required_argument, 0, O_DUMPDIR}, {"quiet", no_argument, 0, O_QUIET},
        {"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};
    optind = 0;   /* 0, not 1: glibc then also resets its scan state left by an earlier call */
    opterr = 0;
    int c;
    long v;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case O_DB: o->db = optarg; break;
        case O_BACKEND: o->backend = optarg; break;
        case O_DTYPE: o->dtype = optarg; break;
        case O_KVDTYPE: o->kv_dtype = optarg; break;
        case O_KVSCALE: {
            char *end;
            o->kv_scale = strtod(optarg, &end);
            if (*end || !(o->kv_scale > 0) || !isfinite(o->kv_scale)) {
                fprintf(stderr, "attnreplay replay: --kv-scale must be a positive number\n");
                return -1;
            }
            break;
        }
        case O_LAYERS:
            if (parse_int(optarg, 1, 4096, &v)) {
                fprintf(stderr, "attnreplay replay: --layers must be 1..4096\n");
                return -1;
            }
            o->layers = (int)v;
            break;
        case O_STEPS:
            if (parse_steps(optarg, &o->step_first, &o->step_last)) {
                fprintf(stderr, "attnreplay replay: --steps takes A:B with 0 <= A <= B (got '%s')\n", optarg);
                return -1;
            }
            break;
        case O_VERIFY:
            if (strcmp(optarg, "all") == 0) o->verify = AR_VERIFY_ALL;
            else if (strcmp(optarg, "off") == 0) o->verify = AR_VERIFY_OFF;
            else if (strncmp(optarg, "sample:", 7) == 0 && parse_int(optarg + 7, 1, 1 << 30, &v) == 0) {
                o->verify = AR_VERIFY_SAMPLE;
                o->sample_rows = (int)v;
            } else {
                fprintf(stderr, "attnreplay replay: --verify takes all, sample:N or off (got '%s')\n", optarg);
                return -1;
            }
            break;
        case O_SEED: {
            char *end;
            errno = 0;
            o->seed = strtoull(optarg, &end, 0);
            if (errno || *end || end == optarg) {
                fprintf(stderr, "attnreplay replay: --seed must be an unsigned integer\n");
                return -1;
            }
            o->seed_given = true;
            break;
        }
        case O_INJECT:
            if (ar_fault_parse(optarg, &o->fault) != 0 || o->fault == AR_FAULT_NONE) {
                fprintf(stderr, "attnreplay replay: unknown fault '%s'; one of:", optarg);
                for (int i = 1; i < AR_FAULT_COUNT; i++) fprintf(stderr, " %s", ar_fault_name((ar_fault)i));
                fprintf(stderr, "\n");
                return -1;
            }
            break;
        case O_RESUME: o->resume = true; break;
        case O_CASCADE:
            if (strcmp(optarg, "off") == 0) o->cascade_mode = 0;
            else if (strcmp(optarg, "auto") == 0) o->cascade_mode = 1;
            else if (strcmp(optarg, "on") == 0) o->cascade_mode = 2;
            else {
                fprintf(stderr, "attnreplay replay: --cascade takes auto, on or off\n");
                return -1;
            }
            break;
        case O_REPEAT:
            if (parse_int(optarg, 1, 1000, &v)) {
                fprintf(stderr, "attnreplay replay: --repeat must be 1..1000\n");
                return -1;
            }
            o->repeat = (int)v;
            break;
        case O_THREADS:
            if (parse_int(optarg, 0, 1024, &v)) {
                fprintf(stderr, "attnreplay replay: --threads must be 0..1024\n");
                return -1;
            }
            o->threads = (int)v;
            break;
        case O_DATA:
            if (strcmp(optarg, "normal") == 0) o->data = AR_DATA_NORMAL;
            else if (strcmp(optarg, "outlier") == 0) o->data = AR_DATA_OUTLIER;
            else if (strcmp(optarg, "large") == 0) o->data = AR_DATA_LARGE;
            else {
                fprintf(stderr, "attnreplay replay: --data takes normal, outlier or large\n");
                return -1;
            }
            break;
        case O_DUMPSTEP:
            if (parse_int(optarg, 0, 1L << 40, &v)) {
                fprintf(stderr, "attnreplay replay: --dump-step must be a step number\n");
                return -1;
            }
            o->dump_step = v;
            break;
        case O_DUMPDIR: o->dump_dir = optarg; break;
        case O_QUIET: o->quiet = true; break;
        case O_HELP: replay_usage(stdout); return 1;   /* the caller exits 0 (no exit(): library code) */
        default:
            fprintf(stderr, "attnreplay replay: unknown or incomplete option '%s'\n", argv[optind - 1]);
            return -1;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "attnreplay replay: exactly one TRACE argument is needed\n");
        return -1;
    }
    o->trace = argv[optind];
    if (!o->db) {
        fprintf(stderr, "attnreplay replay: --db FILE is required\n");
        return -1;
    }
    if ((o->dump_step >= 0) != (o->dump_dir != NULL)) {
        fprintf(stderr, "attnreplay replay: --dump-step and --dump-dir go together\n");
        return -1;
    }
    return 0;
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

/* ---- per-step state ---------------------------------------------------------------------- */

typedef struct engine {
    replay_opts o;
    ar_run_config cfg;
    const ar_backend *be;
    void *state;
    ar_verifier *verifier;
    ar_trace_reader *rd;
    ar_db *db;
    int64_t run_id;
    char device[128];
    /* batch buffers, grown as needed */
    int cap_reqs, cap_tokens;
    size_t cap_table;
    int *qsl, *seq, *ctx, *table, *stale_table;
    uint64_t *keys, *req_keys;
    int64_t *slots;
    const char **ids;
    float *out, *lse;
    size_t cap_out;
    /* fill list */
    int cap_fill;
    int64_t *fill_slots;
    uint64_t *fill_keys;
    int *fill_offsets;
    /* per physical block: how many leading offsets this run has written */
    uint16_t *written;
    /* previous step's rows (for the stale-block-table fault) */
    int prev_count, prev_stride;
    char **prev_ids;
    int *prev_table;
    /* totals */
    int64_t steps_done, steps_failed, steps_unverified, cascade_steps;
    double time_us_total, cascade_time_us, cascade_flat_us;
    double worst_max_abs, worst_nmse;
    int64_t worst_step;
    int64_t bytes_total, flops_total;
    int64_t last_step;
} engine;

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

static int ensure_batch(engine *e, int reqs, int tokens, int stride)
{
    size_t cr = (size_t)e->cap_reqs, ct = (size_t)e->cap_tokens;
    if ((size_t)reqs + 1 > cr) {
        size_t n = (size_t)reqs + 1, c1 = cr, c2 = cr, c3 = cr, c4 = cr, c5 = cr;
        if (grow((void **)&e->qsl, &c1, n, sizeof(int)) || grow((void **)&e->seq, &c2, n, sizeof(int)) ||
            grow((void **)&e->ctx, &c3, n, sizeof(int)) ||
            grow((void **)&e->req_keys, &c4, n, sizeof(uint64_t)) ||
            grow((void **)&e->ids, &c5, n, sizeof(char *)))
            return -1;
        e->cap_reqs = (int)c1;
    }
    if ((size_t)tokens > ct) {
        size_t c1 = ct;
        if (grow((void **)&e->slots, &c1, (size_t)tokens, sizeof(int64_t))) return -1;
        e->cap_tokens = (int)c1;
    }
    size_t tneed = (size_t)reqs * (size_t)stride;
    if (tneed > e->cap_table) {
        size_t c1 = e->cap_table, c2 = e->cap_table, c3 = e->cap_table;
        if (grow((void **)&e->table, &c1, tneed, sizeof(int)) ||
            grow((void **)&e->keys, &c2, tneed, sizeof(uint64_t)) ||
            grow((void **)&e->stale_table, &c3, tneed, sizeof(int)))
            return -1;
        e->cap_table = c1;
    }
    size_t oneed = (size_t)tokens * e->cfg.model.num_q_heads *
                   (size_t)(e->cfg.model.attention == AR_ATTN_MLA ? e->cfg.model.v_head_dim
                                                                  : e->cfg.model.head_size);
    if (oneed > e->cap_out) {
        float *o = realloc(e->out, oneed * sizeof(float));
        if (!o) return -1;
        e->out = o;
        float *l = realloc(e->lse, (size_t)tokens * e->cfg.model.num_q_heads * sizeof(float) + 1);
        if (!l) return -1;
        e->lse = l;
        e->cap_out = oneed;
    }
    return 0;
}

/* Context tokens of the batch that no step of this run wrote: collected from the TRUE table. */
static int collect_fill(engine *e, const ar_batch *b, int *count)
{
    const int bs = e->cfg.block_size;
    int n = 0;
    for (int r = 0; r < b->num_reqs; r++) {
        int ctx = b->context_lens[r];
        for (int i = 0; i * bs < ctx; i++) {
            int blk = e->table[(size_t)r * b->max_blocks_per_req + i];
            int need = ctx - i * bs < bs ? ctx - i * bs : bs;
            if (e->written[blk] >= need) continue;
            for (int off = e->written[blk]; off < need; off++) {
                if (n >= e->cap_fill) {
                    size_t c1 = (size_t)e->cap_fill, c2 = c1, c3 = c1;
                    if (grow((void **)&e->fill_slots, &c1, (size_t)n + 1, sizeof(int64_t)) ||
                        grow((void **)&e->fill_keys, &c2, (size_t)n + 1, sizeof(uint64_t)) ||
                        grow((void **)&e->fill_offsets, &c3, (size_t)n + 1, sizeof(int)))
                        return -1;
                    e->cap_fill = (int)c1;
                }
                e->fill_slots[n] = (int64_t)blk * bs + off;
                e->fill_keys[n] = e->keys[(size_t)r * b->max_blocks_per_req + i];
                e->fill_offsets[n] = off;
                n++;
            }
            e->written[blk] = (uint16_t)need;
        }
    }
    *count = n;
    return 0;
}

static void mark_written(engine *e, const ar_batch *b)
{
    const int bs = e->cfg.block_size;
    for (int r = 0; r < b->num_reqs; r++) {
        for (int p = b->context_lens[r]; p < b->seq_lens[r]; p++) {
            int blk = e->table[(size_t)r * b->max_blocks_per_req + p / bs];
            if (e->written[blk] < p % bs + 1) e->written[blk] = (uint16_t)(p % bs + 1);
        }
    }
}

static int remember_table(engine *e, const ar_batch *b)
{
    for (int i = 0; i < e->prev_count; i++) free(e->prev_ids[i]);
    free(e->prev_ids);
    free(e->prev_table);
    e->prev_ids = calloc((size_t)b->num_reqs + 1, sizeof(char *));
    e->prev_table = malloc(((size_t)b->num_reqs * b->max_blocks_per_req + 1) * sizeof(int));
    if (!e->prev_ids || !e->prev_table) return -1;
    for (int r = 0; r < b->num_reqs; r++) {
        e->prev_ids[r] = strdup(e->ids[r]);
        if (!e->prev_ids[r]) return -1;
    }
    memcpy(e->prev_table, e->table, (size_t)b->num_reqs * b->max_blocks_per_req * sizeof(int));
    e->prev_count = b->num_reqs;
    e->prev_stride = b->max_blocks_per_req;
    return 0;
}

/* The stale-block-table fault: each request's row as of the previous step; blocks it did not
 * hold then read as the null block 0. */
static const int *stale_rows(engine *e, const ar_batch *b)
{
    memset(e->stale_table, 0, (size_t)b->num_reqs * b->max_blocks_per_req * sizeof(int));
    for (int r = 0; r < b->num_reqs; r++) {
        for (int j = 0; j < e->prev_count; j++) {
            if (strcmp(e->prev_ids[j], e->ids[r]) != 0) continue;
            int cols = e->prev_stride < b->max_blocks_per_req ? e->prev_stride : b->max_blocks_per_req;
            memcpy(e->stale_table + (size_t)r * b->max_blocks_per_req,
                   e->prev_table + (size_t)j * e->prev_stride, (size_t)cols * sizeof(int));
            break;
        }
    }
    return e->stale_table;
}

/* Bytes and FLOPs of one layer of the step (DESIGN section 8). */
static void account(const ar_run_config *c, const ar_batch *b, int64_t *bytes, int64_t *flops)
{
    const ar_model *m = &c->model;
    int64_t kvs = ar_dtype_size(c->kv_dtype), ds = ar_dtype_size(c->dtype);
    int64_t by = 0, fl = 0;
    for (int r = 0; r < b->num_reqs; r++) {
        int n = b->query_start_loc[r + 1] - b->query_start_loc[r];
        int s = b->seq_lens[r], ctx = b->context_lens[r];
        int64_t keys_read = s;
        if (m->sliding_window > 0 && keys_read > m->sliding_window + n - 1)
            keys_read = m->sliding_window + n - 1;
        for (int i = 0; i < n; i++) {
            int64_t vis = ctx + i + 1;
            if (m->sliding_window > 0 && vis > m->sliding_window) vis = m->sliding_window;
            if (m->attention == AR_ATTN_MLA)
                fl += 2 * vis * m->num_q_heads * (int64_t)(m->kv_lora_rank + m->qk_rope_head_dim + m->kv_lora_rank);
            else
                fl += 4 * vis * m->num_q_heads * (int64_t)m->head_size;
        }
        if (m->attention == AR_ATTN_MLA) {
            by += keys_read * (int64_t)m->head_size * kvs;                       /* latent cache */
            by += (int64_t)n * m->num_q_heads * (m->qk_nope_head_dim + m->qk_rope_head_dim + m->v_head_dim) * ds;
            by += (int64_t)n * m->head_size * kvs;                               /* new latents */
        } else {
            by += keys_read * m->num_kv_heads * (int64_t)m->head_size * 2 * kvs;  /* K and V read once */
            by += (int64_t)n * m->num_q_heads * m->head_size * 2 * ds;            /* Q in, O out */
            by += (int64_t)n * m->num_kv_heads * m->head_size * 2 * kvs;          /* new K/V written */
        }
    }
    *bytes = by;
    *flops = fl;
}

/* Builds the batch for step st from the reader's live table.  Returns 0, or -1 (out of memory). */
static int build_batch(engine *e, const ar_step *st, ar_batch *b, int *num_prefill)
{
    const int bs = e->cfg.block_size;
    int stride = 1, tokens = 0;
    for (int i = 0; i < st->num_scheduled; i++) {
        const ar_live_req *lr = ar_trace_find(e->rd, st->scheduled[i].req);
        if (lr && lr->num_blocks > stride) stride = lr->num_blocks;
        tokens += st->scheduled[i].num_tokens;
    }
    if (ensure_batch(e, st->num_scheduled, tokens, stride) != 0) return -1;
    memset(e->table, 0, (size_t)st->num_scheduled * stride * sizeof(int));
    memset(e->keys, 0, (size_t)st->num_scheduled * stride * sizeof(uint64_t));
    int t = 0, max_q = 0, max_s = 0, prefill = 0;
    e->qsl[0] = 0;
    for (int r = 0; r < st->num_scheduled; r++) {
        const ar_live_req *lr = ar_trace_find(e->rd, st->scheduled[r].req);
        int n = st->scheduled[r].num_tokens;
        e->ids[r] = lr->req;
        e->req_keys[r] = lr->req_key;
        e->ctx[r] = lr->num_computed_tokens;
        e->seq[r] = lr->num_computed_tokens + n;
        e->qsl[r + 1] = e->qsl[r] + n;
        if (n > max_q) max_q = n;
        if (e->seq[r] > max_s) max_s = e->seq[r];
        if (lr->num_computed_tokens < lr->prompt_len) prefill++;
        uint64_t prev = AR_ROOT_KEY;
        for (int i = 0; i < lr->num_blocks; i++) {
            e->table[(size_t)r * stride + i] = lr->block_ids[i];
            prev = ar_block_content_key(prev, lr->prompt_keys, lr->num_prompt_keys, lr->req_key, i);
            e->keys[(size_t)r * stride + i] = prev;
        }
        for (int i = 0; i < n; i++, t++) {
            int p = lr->num_computed_tokens + i;
            e->slots[t] = (int64_t)lr->block_ids[p / bs] * bs + p % bs;
        }
    }
    memset(b, 0, sizeof *b);
    b->step = st->step;
    b->num_reqs = st->num_scheduled;
    b->num_tokens = tokens;
    b->query_start_loc = e->qsl;
    b->seq_lens = e->seq;
    b->context_lens = e->ctx;
    b->max_query_len = max_q;
    b->max_seq_len = max_s;
    b->max_blocks_per_req = stride;
    b->block_table = e->table;
    b->block_keys = e->keys;
    b->req_keys = e->req_keys;
    b->slot_mapping = e->slots;
    *num_prefill = prefill;

    /* Cascade: P as vLLM derives it, then the mode. MLA never cascades (as in vLLM). */
    int P = ar_common_prefix_len(st->num_common_prefix_blocks, bs, e->ctx, b->num_reqs);
    bool use = false;
    if (P > 0 && ar_backend_runs_cascade(e->be) && e->cfg.model.attention == AR_ATTN_MHA &&
        e->cfg.model.sliding_window == 0) {
        if (e->o.cascade_mode == 2) use = true;
        else if (e->o.cascade_mode == 1) {
            int *qlens = malloc((size_t)b->num_reqs * sizeof *qlens);
            if (!qlens) return -1;
            for (int r = 0; r < b->num_reqs; r++) qlens[r] = e->qsl[r + 1] - e->qsl[r];
            use = ar_use_cascade(P, qlens, b->num_reqs, e->cfg.model.num_q_heads,
                                 e->cfg.model.num_kv_heads, false, AR_NUM_SMS_DEFAULT);
            free(qlens);
        }
    }
    b->common_prefix_len = use ? P : 0;
    return 0;
}

static const char *verify_label(const replay_opts *o)
{
    return o->verify == AR_VERIFY_ALL ? "all" : o->verify == AR_VERIFY_SAMPLE ? "sample" : "off";
}

static void progress(const engine *e, int64_t step, double t0, bool force)
{
    static double last;
    double t = now_mono();
    if (!force && t - last < 0.2) return;
    last = t;
    fprintf(stderr, "\r  step %lld  done %lld  failed %lld  %.1f steps/s   ", (long long)step,
            (long long)e->steps_done, (long long)e->steps_failed,
            e->steps_done / (t - t0 > 1e-9 ? t - t0 : 1e-9));
    fflush(stderr);
}

/* Runs, verifies and records one step.  Returns 0, or an exit code (2 or 3) with err set. */
static int run_step(engine *e, const ar_step *st, char *err, size_t err_len)
{
    ar_batch b;
    int num_prefill = 0;
    if (build_batch(e, st, &b, &num_prefill) != 0) {
        snprintf(err, err_len, "step %lld: out of memory building the batch", (long long)st->step);
        return 3;
    }
    if (b.num_reqs == 0) return 0;
    int fill_count = 0;
    if (collect_fill(e, &b, &fill_count) != 0) {
        snprintf(err, err_len, "out of memory");
        return 3;
    }
    /* Metadata faults: what the kernels see differs from the truth the fill and verify use. */
    ar_batch kb = b;
    int64_t *bad_slots = NULL;
    if (e->cfg.fault == AR_FAULT_WRONG_SLOT) {
        bad_slots = malloc((size_t)b.num_tokens * sizeof *bad_slots + 1);
        if (!bad_slots) {
            snprintf(err, err_len, "out of memory");
            return 3;
        }
        for (int i = 0; i < b.num_tokens; i++) bad_slots[i] = b.slot_mapping[i] < 0 ? -1 : (b.slot_mapping[i] ^ 1);
        kb.slot_mapping = bad_slots;
    }
    if (e->cfg.fault == AR_FAULT_STALE_BLOCK_TABLE) kb.block_table = stale_rows(e, &b);

    int rc = 0;
    if (e->be->prepare(e->state, &kb, err, err_len) != 0) {
        rc = 3;
        goto out;
    }
    ar_fill fill = {fill_count, e->fill_slots, e->fill_keys, e->fill_offsets};
    ar_verify_opts vo = {e->o.verify, e->o.sample_rows, e->o.threads, NULL, NULL};
    bool dumping = e->o.dump_step == st->step;
    if (dumping) {
        vo.mode = AR_VERIFY_ALL;
        vo.dump_dir = e->o.dump_dir;
    }
    ar_verify_result step_res, layer_res;
    memset(&step_res, 0, sizeof step_res);
    double time_us = 0;
    int guard_violations = 0;
    ar_forward_out fo;
    for (int layer = 0; layer < e->cfg.num_layers; layer++) {
        if (fill_count && e->be->fill(e->state, layer, &fill, err, err_len) != 0) {
            rc = 3;
            goto out;
        }
        memset(&fo, 0, sizeof fo);
        if (ar_verifier_needs_host_output(e->verifier, &vo)) {
            fo.out = e->out;
            fo.lse = e->lse;
        }
        if (e->be->forward(e->state, layer, &kb, &fo, err, err_len) != 0) {
            rc = 3;
            goto out;
        }
        time_us += fo.total_us;
        guard_violations += fo.guard_violations;
        for (int k = 0; k < fo.num_kernels; k++)
            if (ar_db_insert_kernel(e->db, e->run_id, st->step, layer, fo.kernels[k].name,
                                    fo.kernels[k].us, err, err_len) != 0) {
                rc = 3;
                goto out;
            }
        int vrc = ar_verifier_check_layer(e->verifier, &b, layer, &fo, e->ids, &vo, &layer_res, err,
                                          err_len);
        if (vrc != 0) {
            rc = 3;
            goto out;
        }
        ar_verify_accumulate(&step_res, &layer_res, layer == 0);
    }
    /* What cascade bought: the same step run flat (layer 0, timed the same way), so a replay
     * reports the attention time cascade saved.  The flat run rewrites the same K/V. */
    double flat_us = 0;
    if (kb.common_prefix_len > 0) {
        ar_batch flat = kb;
        flat.common_prefix_len = 0;
        memset(&fo, 0, sizeof fo);
        bool host_out = ar_verifier_needs_host_output(e->verifier, &vo);
        fo.out = host_out ? e->out : NULL;
        fo.lse = host_out ? e->lse : NULL;
        if (e->be->prepare(e->state, &flat, err, err_len) != 0 ||
            e->be->forward(e->state, 0, &flat, &fo, err, err_len) != 0) {
            rc = 3;
            goto out;
        }
        flat_us = fo.total_us * e->cfg.num_layers;
        if (ar_db_insert_kernel(e->db, e->run_id, st->step, -1, "flat_equivalent", flat_us, err,
                                err_len) != 0) {
            rc = 3;
            goto out;
        }
    }
    mark_written(e, &b);
    if (e->cfg.fault == AR_FAULT_STALE_BLOCK_TABLE && remember_table(e, &b) != 0) {
        snprintf(err, err_len, "out of memory");
        rc = 3;
        goto out;
    }
    if (guard_violations > 0) {
        step_res.pass = false;
        snprintf(step_res.reason, sizeof step_res.reason, "%d guard words overwritten", guard_violations);
    }

    int64_t bytes, flops;
    account(&e->cfg, &b, &bytes, &flops);
    bytes *= e->cfg.num_layers;
    flops *= e->cfg.num_layers;
    int64_t total_ctx = 0;
    for (int r = 0; r < b.num_reqs; r++) total_ctx += b.seq_lens[r];
    bool verified = vo.mode != AR_VERIFY_OFF;
    ar_step_row row = {
        .run = e->run_id, .step = st->step, .time = st->time, .num_reqs = b.num_reqs,
        .num_tokens = b.num_tokens, .num_prefill_reqs = num_prefill,
        .num_decode_reqs = b.num_reqs - num_prefill, .max_query_len = b.max_query_len,
        .max_seq_len = b.max_seq_len, .total_context = total_ctx,
        .cascade = b.common_prefix_len > 0, .prefix_len = b.common_prefix_len,
        .time_us = time_us, .bytes = bytes, .flops = flops,
        .gbps = time_us > 0 ? bytes / (time_us * 1e3) : 0,
        .tflops = time_us > 0 ? flops / (time_us * 1e6) : 0,
        .verified = dumping ? "all" : verify_label(&e->o), .rows_checked = step_res.rows_checked,
        .max_abs = step_res.max_abs, .max_rel = step_res.max_rel, .mean_abs = step_res.mean_abs,
        .nmse = step_res.nmse, .lse_max_abs = step_res.lse_max_abs,
        .nan_count = step_res.nan_count, .bad_count = step_res.bad_count,
        .naive_max_abs = step_res.naive_max_abs, .naive_mean_abs = step_res.naive_mean_abs,
        .tol_max_abs = step_res.tol_max_abs, .tol_mean_abs = step_res.tol_mean_abs,
        .guard_ok = guard_violations == 0,
        .pass = verified ? (step_res.pass ? 1 : 0) : (step_res.pass ? -1 : 0)};
    if (ar_db_insert_step(e->db, &row, err, err_len) != 0) {
        rc = 3;
        goto out;
    }
    if (!step_res.pass) {
        for (int i = 0; i < step_res.num_worst; i++) {
            const ar_worst *w = &step_res.worst[i];
            ar_mismatch_row m = {0, e->ids[w->req], w->token, w->head, w->dim, w->got, w->want, w->err};
            if (ar_db_insert_mismatch(e->db, e->run_id, st->step, &m, err, err_len) != 0) {
                rc = 3;
                goto out;
            }
        }
        if (!e->steps_failed && !e->o.quiet)
            fprintf(stderr, "%sstep %lld FAILED: %s%s%s\n", isatty(2) ? "\n" : "", (long long)st->step,
                    step_res.reason, step_res.num_worst ? "; worst at request " : "",
                    step_res.num_worst ? e->ids[step_res.worst[0].req] : "");
        e->steps_failed++;
    }
    if (!verified) e->steps_unverified++;
    e->steps_done++;
    e->last_step = st->step;
    e->time_us_total += time_us;
    e->bytes_total += bytes;
    e->flops_total += flops;
    if (b.common_prefix_len > 0) {
        e->cascade_steps++;
        e->cascade_time_us += time_us;
        e->cascade_flat_us += flat_us;
    }
    if (verified && (step_res.max_abs > e->worst_max_abs || e->worst_step < 0)) {
        e->worst_max_abs = step_res.max_abs;
        e->worst_nmse = step_res.nmse;
        e->worst_step = st->step;
    }
out:
    free(bad_slots);
    return rc;
}

/* 64-bit FNV-1a over the trace file's bytes, as 16 hex digits. */
static int hash_file(const char *path, char out[17])
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint64_t h = 1469598103934665603ull;
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        for (size_t i = 0; i < n; i++) h = (h ^ buf[i]) * 1099511628211ull;
    int bad = ferror(f);
    fclose(f);
    if (bad) return -1;
    snprintf(out, 17, "%016llx", (unsigned long long)h);
    return 0;
}

static char *config_json(const engine *e)
{
    json_t *j = json_object();
    char steps[64];
    snprintf(steps, sizeof steps, "%lld:%lld", (long long)e->o.step_first,
             e->o.step_last == INT64_MAX ? -1LL : (long long)e->o.step_last);
    json_object_set_new(j, "backend", json_string(e->be->name));
    json_object_set_new(j, "dtype", json_string(ar_dtype_name(e->cfg.dtype)));
    json_object_set_new(j, "kv_dtype", json_string(ar_dtype_name(e->cfg.kv_dtype)));
    json_object_set_new(j, "kv_scale", json_real(e->cfg.kv_scale));
    json_object_set_new(j, "layers", json_integer(e->cfg.num_layers));
    json_object_set_new(j, "seed", json_integer((json_int_t)e->cfg.seed));
    json_object_set_new(j, "data", json_integer(e->cfg.data));
    json_object_set_new(j, "verify", json_string(verify_label(&e->o)));
    json_object_set_new(j, "sample_rows", json_integer(e->o.sample_rows));
    json_object_set_new(j, "inject", json_string(ar_fault_name(e->cfg.fault)));
    json_object_set_new(j, "cascade", json_integer(e->o.cascade_mode));
    json_object_set_new(j, "repeat", json_integer(e->cfg.repeat));
    json_object_set_new(j, "steps", json_string(steps));
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

static void print_summary(const engine *e, const ar_selection *sel, const char *status, double wall)
{
    const ar_model *m = &e->cfg.model;
    printf("attnreplay replay: %s\n", e->o.trace);
    printf("  model     %s (%s, %d q / %d kv heads, head %d, %d of %d layers)\n", m->name,
           m->attention == AR_ATTN_MLA ? "mla" : "mha", m->num_q_heads, m->num_kv_heads,
           m->head_size, e->cfg.num_layers, m->num_layers);
    printf("  backend   %s on %s, dtype %s, kv %s%s%s\n", e->be->name, e->device,
           ar_dtype_name(e->cfg.dtype), ar_dtype_name(e->cfg.kv_dtype),
           e->cfg.fault ? ", injected fault " : "", e->cfg.fault ? ar_fault_name(e->cfg.fault) : "");
    for (int i = 0; i < sel->count; i++)
        if (!sel->entries[i].chosen)
            printf("            passed over %s: %s\n", sel->entries[i].backend->name, sel->entries[i].why);
    printf("  steps     %lld replayed, %lld failed, %lld unverified (verify %s)\n",
           (long long)e->steps_done, (long long)e->steps_failed, (long long)e->steps_unverified,
           verify_label(&e->o));
    if (e->worst_step >= 0)
        printf("  accuracy  worst step %lld: max abs err %.3g, NMSE %.3g\n", (long long)e->worst_step,
               e->worst_max_abs, e->worst_nmse);
    if (e->steps_done > 0)
        printf("  time      attention %.3f ms total, %.1f us/step mean; %.2f GB/s, %.3f TFLOP/s\n",
               e->time_us_total / 1e3, e->time_us_total / e->steps_done,
               e->time_us_total > 0 ? e->bytes_total / (e->time_us_total * 1e3) : 0,
               e->time_us_total > 0 ? e->flops_total / (e->time_us_total * 1e6) : 0);
    if (e->cascade_steps > 0) {
        char verdict[96];
        ar_cascade_verdict(e->cascade_time_us, e->cascade_flat_us, verdict, sizeof verdict);
        printf("  cascade   %lld steps used it: %.3f ms of attention vs %.3f ms flat on the same steps %s\n",
               (long long)e->cascade_steps, e->cascade_time_us / 1e3, e->cascade_flat_us / 1e3, verdict);
    }
    printf("  result    %s  (run %lld in %s, %.1f s wall)\n", status, (long long)e->run_id, e->o.db, wall);
}

static void engine_free(engine *e)
{
    if (e->verifier) ar_verifier_close(e->verifier);
    if (e->state) e->be->close(e->state);
    if (e->rd) ar_trace_close(e->rd);
    if (e->db) ar_db_close(e->db);
    free(e->qsl); free(e->seq); free(e->ctx); free(e->table); free(e->stale_table);
    free(e->keys); free(e->req_keys); free(e->slots); free(e->ids); free(e->out); free(e->lse);
    free(e->fill_slots); free(e->fill_keys); free(e->fill_offsets); free(e->written);
    for (int i = 0; i < e->prev_count; i++) free(e->prev_ids[i]);
    free(e->prev_ids);
    free(e->prev_table);
}

int ar_replay_main(int argc, char **argv)
{
    engine E, *e = &E;
    memset(e, 0, sizeof *e);
    e->worst_step = -1;
    e->last_step = -1;
    char err[AR_ERR_MAX + 256] = "";
    int parsed = parse_replay_opts(argc, argv, &e->o);
    if (parsed == 1) return 0;   /* --help */
    if (parsed != 0) {
        replay_usage(stderr);
        return 2;
    }
    double t_start = now_mono();
    e->rd = ar_trace_open(e->o.trace, err, sizeof err);
    if (!e->rd) {
        fprintf(stderr, "attnreplay replay: %s\n", err);
        return 2;
    }
    const ar_trace_header *h = ar_trace_header_of(e->rd);
    if (ar_run_config_from_header(h, e->o.dtype, e->o.kv_dtype, e->o.kv_scale, &e->cfg, err, sizeof err) != 0) {
        fprintf(stderr, "attnreplay replay: %s\n", err);
        engine_free(e);
        return 2;
    }
    e->cfg.num_layers = e->o.layers;
    if (e->cfg.num_layers > h->model.num_layers) {
        fprintf(stderr, "attnreplay replay: --layers %d but the model has %d layers\n",
                e->cfg.num_layers, h->model.num_layers);
        engine_free(e);
        return 2;
    }
    if (e->o.seed_given) e->cfg.seed = e->o.seed;
    e->cfg.data = e->o.data;
    e->cfg.fault = e->o.fault;
    e->cfg.cascade_mode = e->o.cascade_mode;
    e->cfg.repeat = e->o.repeat;
    e->cfg.threads = e->o.threads;

    ar_selection sel;
    e->be = ar_backend_select(&e->cfg, e->o.backend, &sel);
    if (!e->be) {
        if (sel.failed) {
            fprintf(stderr, "attnreplay replay: backend %s cannot run this trace: %s\n",
                    sel.failed->backend->name, sel.failed->why);
            int code = sel.failed->backend->needs_gpu && (strstr(sel.failed->why, "no CUDA device") ||
                                                          strstr(sel.failed->why, "without CUDA")) ? 3 : 2;
            engine_free(e);
            return code;
        }
        if (strcmp(e->o.backend, "auto") != 0 && !ar_backend_find(e->o.backend)) {
            fprintf(stderr, "attnreplay replay: unknown backend '%s'; `attnreplay backends` lists them\n",
                    e->o.backend);
        } else {
            fprintf(stderr, "attnreplay replay: no backend supports this trace:\n");
            for (int i = 0; i < sel.count; i++)
                fprintf(stderr, "  %s: %s\n", sel.entries[i].backend->name, sel.entries[i].why);
        }
        engine_free(e);
        return 2;
    }
    int code = e->be->open(&e->cfg, &e->state, err, sizeof err);
    if (code != 0) {
        e->state = NULL;
        fprintf(stderr, "attnreplay replay: backend %s: %s\n", e->be->name, err);
        engine_free(e);
        return code == 2 ? 2 : 3;
    }
    e->be->device_name(e->state, e->device, sizeof e->device);
    if (ar_verifier_open(&e->verifier, &e->cfg, e->be, err, sizeof err) != 0) {
        fprintf(stderr, "attnreplay replay: verifier: %s\n", err);
        engine_free(e);
        return 3;
    }
    e->written = calloc((size_t)e->cfg.num_blocks, sizeof *e->written);
    if (!e->written) {
        fprintf(stderr, "attnreplay replay: out of memory\n");
        engine_free(e);
        return 3;
    }

    e->db = ar_db_open(e->o.db, false, err, sizeof err);
    if (!e->db) {
        fprintf(stderr, "attnreplay replay: %s\n", err);
        engine_free(e);
        return 3;
    }
    char hash[17];
    if (hash_file(e->o.trace, hash) != 0) {
        fprintf(stderr, "attnreplay replay: %s: cannot read: %s\n", e->o.trace, strerror(errno));
        engine_free(e);
        return 2;
    }
    char *cfg_json = config_json(e);
    int64_t resume_after = -1;
    if (e->o.resume) {
        int64_t done = 0, failed = 0;
        int found = ar_db_find_resumable(e->db, hash, cfg_json, &e->run_id, &resume_after, &done,
                                         &failed, err, sizeof err);
        if (found < 0) {
            fprintf(stderr, "attnreplay replay: %s\n", err);
            free(cfg_json);
            engine_free(e);
            return 3;
        }
        if (found == 0) {
            fprintf(stderr, "attnreplay replay: --resume: no unfinished run of %s with these options in %s\n",
                    e->o.trace, e->o.db);
            free(cfg_json);
            engine_free(e);
            return 2;
        }
        e->steps_done = done;
        e->steps_failed = failed;
        e->last_step = resume_after;
    } else {
        ar_run_row rr = {e->o.trace, hash, e->be->name, e->device, ar_dtype_name(e->cfg.dtype),
                         ar_dtype_name(e->cfg.kv_dtype), h->model.name, e->cfg.num_layers, cfg_json,
                         AR_CODE_REV, e->cfg.seed, verify_label(&e->o), ar_fault_name(e->cfg.fault),
                         e->o.cascade_mode == 0 ? "off" : e->o.cascade_mode == 1 ? "auto" : "on",
                         e->cfg.repeat};
        e->run_id = ar_db_create_run(e->db, &rr, now_wall(), err, sizeof err);
        if (e->run_id < 0) {
            fprintf(stderr, "attnreplay replay: %s\n", err);
            free(cfg_json);
            engine_free(e);
            return 3;
        }
    }
    free(cfg_json);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    const char *kill_env = getenv("ATTNREPLAY_TEST_KILL_AFTER_STEP");
    int64_t kill_after = kill_env ? strtoll(kill_env, NULL, 10) : -1;
    bool tty = isatty(2) && !e->o.quiet;

    int exit_code = 0;
    const char *status = NULL;
    char fail_msg[AR_ERR_MAX + 512] = "";
    bool in_tx = false;
    int in_batch = 0;
    double last_commit = now_mono();
    for (;;) {
        const ar_step *st = NULL;
        int r = ar_trace_next(e->rd, &st, err, sizeof err);
        if (r == 0) break;
        if (r < 0) {
            snprintf(fail_msg, sizeof fail_msg, "%s", err);
            exit_code = 2;
            break;
        }
        if (st->step < e->o.step_first || st->step <= resume_after) continue;
        if (st->step > e->o.step_last) break;
        if (!in_tx) {
            if (ar_db_begin(e->db, err, sizeof err) != 0) {
                snprintf(fail_msg, sizeof fail_msg, "%s", err);
                exit_code = 3;
                break;
            }
            in_tx = true;
        }
        int rc = run_step(e, st, err, sizeof err);
        if (rc != 0) {
            snprintf(fail_msg, sizeof fail_msg, "step %lld: %s", (long long)st->step, err);
            exit_code = rc;
            break;
        }
        in_batch++;
        if (kill_after >= 0 && st->step >= kill_after) raise(SIGKILL);   /* kill-and-resume test */
        if (in_batch >= AR_COMMIT_EVERY || now_mono() - last_commit > 1.0 || interrupted) {
            if (ar_db_update_progress(e->db, e->run_id, e->steps_done, e->steps_failed, e->last_step,
                                      err, sizeof err) != 0 ||
                ar_db_commit(e->db, err, sizeof err) != 0) {
                snprintf(fail_msg, sizeof fail_msg, "%s", err);
                in_tx = false;
                exit_code = 3;
                break;
            }
            in_tx = false;
            in_batch = 0;
            last_commit = now_mono();
        }
        if (tty) progress(e, st->step, t_start, false);
        if (interrupted) break;
    }
    if (tty) fputc('\n', stderr);
    char vline[512];   /* the device verifier: its last cross-check, and what it did */
    if (ar_verifier_finish(e->verifier, vline, sizeof vline, err, sizeof err) != 0 && exit_code == 0) {
        snprintf(fail_msg, sizeof fail_msg, "%s", err);
        exit_code = 3;
    }
    if (vline[0] && !e->o.quiet) fprintf(stderr, "  %s\n", vline);
    if (in_tx) {
        if (exit_code == 0 || exit_code == 1 || exit_code == 2) {
            if (ar_db_update_progress(e->db, e->run_id, e->steps_done, e->steps_failed, e->last_step,
                                      err, sizeof err) != 0 ||
                ar_db_commit(e->db, err, sizeof err) != 0) {
                snprintf(fail_msg, sizeof fail_msg, "%s", err);
                exit_code = 3;
            }
        } else {
            ar_db_rollback(e->db);   /* keep whole steps only */
        }
    }
    if (interrupted && exit_code == 0) status = "interrupted";
    else if (exit_code != 0) status = "error";
    else if (e->steps_failed > 0) status = "failed";
    else if (e->o.verify == AR_VERIFY_OFF) status = "unverified";
    else status = "passed";
    if (ar_db_finish_run(e->db, e->run_id, status, fail_msg[0] ? fail_msg : NULL, now_wall(), err,
                         sizeof err) != 0) {
        fprintf(stderr, "attnreplay replay: %s (the run stays 'running'; --resume continues it)\n", err);
        if (exit_code == 0) exit_code = 3;
    }
    if (fail_msg[0]) fprintf(stderr, "attnreplay replay: %s\n", fail_msg);
    if (!e->o.quiet) print_summary(e, &sel, status, now_mono() - t_start);
    if (exit_code == 0 && e->steps_failed > 0) exit_code = 1;
    if (exit_code == 0 && interrupted) exit_code = 130;
    engine_free(e);
    return exit_code;
}
