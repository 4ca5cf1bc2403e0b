/* cpu_backend.c - the "cpu" attention backend: paged MHA/GQA/MQA attention on the host.
 *
 * It supports everything a run can ask for, so a replay works on any machine: fp32/fp16/bf16
 * activations, a KV cache in the same dtype or fp8 e4m3 with a per-tensor kv_scale, any head
 * size and block size, GQA/MQA, sliding window, soft cap, cascade attention and every kernel
 * fault.  The cache of each layer is [2, num_blocks, block_size, num_kv_heads, head_size]
 * in the KV dtype's bits (dtype.h), NaN before anything is written.
 *
 * forward(), per layer:
 *   untimed  Q [T, Hq, D] and the new K/V [T, Hkv, D] come from the data generator (datagen.h);
 *   timed    "write": K/V scattered into the cache through slot_mapping (slot -1 skipped),
 *            like vLLM's reshape_and_cache_flash;
 *            flat: "attn" - attention that reads K/V only from the cache through block_table;
 *            cascade (common_prefix_len P > 0): "prefix" (all T queries as one sequence,
 *            non-causal, keys 0..P-1 through block_table row 0), "suffix" (per request,
 *            causal, keys P..seq_len-1) and "merge" (vLLM merge_attn_states).
 * Attention math: float32 accumulation, flash-attention style online softmax over tiles of
 * KEY_TILE keys, bottom-right causal mask, optional window and soft cap, LSE as natural log
 * (empty row: out 0, lse -inf), output rounded to the run's dtype.  The prefix and suffix
 * outputs are rounded to the dtype too before the merge, as vLLM's cascade holds them in
 * activation-dtype tensors.
 *
 * Threading: a persistent pool (threadpool.h).  A work item is (segment of query tokens,
 * tile of up to AR_CPU_MAX_TILE_ROWS/group tokens, KV head); it handles every query head of
 * that KV head's group together, so each K/V row is loaded and converted once per item.
 * The kernel itself, the merge and the batch checks live in cpu_attn.c (shared with
 * cpu-mla); this file holds the backend: caches, data generation, the write, the passes. */
#include "cpu_backend.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../reference/datagen.h"
#include "../../reference/dtype.h"
#include "cpu_attn.h"
#include "threadpool.h"

#define WHO "cpu backend"

typedef struct cpu_state {
    ar_run_config cfg;
    int num_q_heads, num_kv_heads, group, head_size;
    int block_size, num_blocks;
    float scale;
    float kv_scale;          /* multiplier on load; 1 unless the cache is fp8 */
    void **k_cache;          /* [num_layers] -> [num_blocks, block_size, Hkv, D] */
    void **v_cache;          /* [num_layers] -> same shape, V side */
    unsigned char *cache_mem; /* num_layers x (K side, V side) */
    ar_threadpool *pool;
    int num_threads;
    int tile_tokens;
    ar_cpu_scratch *scratch; /* [num_threads] */

    /* Per-step metadata from prepare(). */
    ar_cpu_step step;
    int prepared;            /* prepare() succeeded for prepared_step */
    int64_t prepared_step;
    ar_cpu_segment *segs;    /* [num_reqs + 1] */
    int cap_segs;
    ar_cpu_item *items_main; /* flat: all requests; cascade: the suffix pass */
    int num_items_main, cap_items_main;
    ar_cpu_item *items_prefix; /* cascade prefix pass */
    int num_items_prefix, cap_items_prefix;

    /* Per-step buffers. */
    float *q;                /* [T, Hq, D] */
    float *k_new, *v_new;    /* [T, Hkv, D] */
    float *prefix_out, *suffix_out; /* [T, Hq, D] */
    float *prefix_lse, *suffix_lse; /* [Hq, T] */
} cpu_state;

/* ---- descriptor: check ---------------------------------------------------------------- */

static bool cpu_check(const ar_run_config *cfg, char *why, size_t why_len)
{
    const ar_model *m = &cfg->model;
    if (m->attention != AR_ATTN_MHA) {
        snprintf(why, why_len, "MLA model: the cpu backend runs MHA/GQA/MQA only (use cpu-mla)");
        return false;
    }
    if (m->num_q_heads <= 0 || m->num_kv_heads <= 0) {
        snprintf(why, why_len, "head counts must be positive (num_q_heads %d, num_kv_heads %d)",
                 m->num_q_heads, m->num_kv_heads);
        return false;
    }
    if (m->num_q_heads % m->num_kv_heads != 0) {
        snprintf(why, why_len, "num_q_heads %d is not a multiple of num_kv_heads %d",
                 m->num_q_heads, m->num_kv_heads);
        return false;
    }
    if (m->head_size <= 0) {
        snprintf(why, why_len, "head_size %d must be positive", m->head_size);
        return false;
    }
    if (m->v_head_dim != 0 && m->v_head_dim != m->head_size) {
        snprintf(why, why_len, "v_head_dim %d differs from head_size %d (an MHA cache holds K "
                 "and V with one head size)", m->v_head_dim, m->head_size);
        return false;
    }
    if (m->sliding_window < 0 || m->logits_soft_cap < 0 || !isfinite(m->logits_soft_cap)) {
        snprintf(why, why_len, "sliding_window %d and soft cap %g must not be negative",
                 m->sliding_window, m->logits_soft_cap);
        return false;
    }
    return ar_cpu_check_run(cfg, why, why_len);
}

/* ---- open / close --------------------------------------------------------------------- */

static void cpu_close(void *state)
{
    cpu_state *s = state;
    if (!s) return;
    if (s->pool) ar_threadpool_destroy(s->pool);
    ar_cpu_scratch_free(s->scratch, s->num_threads);
    free(s->cache_mem);
    free(s->k_cache);
    free(s->v_cache);
    ar_cpu_step_free(&s->step);
    free(s->segs);
    free(s->items_main);
    free(s->items_prefix);
    free(s->q); free(s->k_new); free(s->v_new);
    free(s->prefix_out); free(s->suffix_out); free(s->prefix_lse); free(s->suffix_lse);
    free(s);
}

static int cpu_open(const ar_run_config *cfg, void **state, char *err, size_t err_len)
{
    *state = NULL;
    char why[256];
    if (!cpu_check(cfg, why, sizeof why)) {
        snprintf(err, err_len, WHO ": %s", why);
        return 2;
    }
    cpu_state *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, err_len, WHO ": out of memory (%zu bytes)", sizeof *s); return 3; }
    s->cfg = *cfg;
    const ar_model *m = &cfg->model;
    s->num_q_heads = m->num_q_heads;
    s->num_kv_heads = m->num_kv_heads;
    s->group = m->num_q_heads / m->num_kv_heads;
    s->head_size = m->head_size;
    s->block_size = cfg->block_size;
    s->num_blocks = cfg->num_blocks;
    s->scale = (float)(m->scale > 0 ? m->scale : 1.0 / sqrt((double)m->head_size));
    s->kv_scale = cfg->kv_dtype == AR_FP8_E4M3 ? (float)cfg->kv_scale : 1.0f;

    /* The caches: one allocation, num_layers x (K side, V side). */
    int esize = ar_dtype_size(cfg->kv_dtype);
    int64_t slots = (int64_t)cfg->num_blocks * cfg->block_size;
    double want = (double)slots * s->num_kv_heads * s->head_size * esize * 2.0 * cfg->num_layers;
    if (want > (double)SIZE_MAX / 2) {
        snprintf(err, err_len, WHO ": KV cache of %.0f bytes does not fit in memory", want);
        cpu_close(s);
        return 3;
    }
    size_t side_elems = (size_t)slots * (size_t)s->num_kv_heads * (size_t)s->head_size;
    size_t side_bytes = side_elems * (size_t)esize;
    size_t total = side_bytes * 2 * (size_t)cfg->num_layers;
    if (ar_cpu_check_memory(total, WHO, err, err_len) != 0) {
        cpu_close(s);
        return 3;
    }
    s->cache_mem = malloc(total);
    s->k_cache = calloc((size_t)cfg->num_layers, sizeof *s->k_cache);
    s->v_cache = calloc((size_t)cfg->num_layers, sizeof *s->v_cache);
    if (!s->cache_mem || !s->k_cache || !s->v_cache ||
        ar_cpu_step_init(&s->step, cfg->num_blocks, cfg->block_size)) {
        snprintf(err, err_len, WHO ": cannot allocate the KV cache: %zu bytes (%d layers x "
                 "2 x %d blocks x %d tokens x %d kv heads x %d dims x %d bytes)", total,
                 cfg->num_layers, cfg->num_blocks, cfg->block_size, s->num_kv_heads,
                 s->head_size, esize);
        cpu_close(s);
        return 3;
    }
    ar_cpu_fill_nan(cfg->kv_dtype, s->cache_mem, total / (size_t)esize);
    for (int l = 0; l < cfg->num_layers; l++) {
        s->k_cache[l] = s->cache_mem + side_bytes * 2 * (size_t)l;
        s->v_cache[l] = s->cache_mem + side_bytes * (2 * (size_t)l + 1);
    }

    s->pool = ar_threadpool_create(cfg->threads);
    if (!s->pool) {
        snprintf(err, err_len, WHO ": cannot start %d threads", cfg->threads);
        cpu_close(s);
        return 3;
    }
    s->num_threads = ar_threadpool_size(s->pool);
    s->tile_tokens = ar_cpu_tile_tokens(s->group);
    s->scratch = ar_cpu_scratch_alloc(s->num_threads, s->head_size, s->head_size, s->group);
    if (!s->scratch) {
        snprintf(err, err_len, WHO ": out of memory for per-thread scratch");
        cpu_close(s);
        return 3;
    }
    *state = s;
    return 0;
}

static void cpu_device_name(void *state, char *buf, size_t len)
{
    cpu_state *s = state;
    ar_cpu_device_name(s ? s->num_threads : ar_cpu_count(), buf, len);
}

/* ---- prepare: validate the batch, derive segments and work items ----------------------- */

static int cpu_prepare(void *state, const ar_batch *b, char *err, size_t err_len)
{
    cpu_state *s = state;
    s->prepared = 0;
    int rc = ar_cpu_step_prepare(&s->step, b, s->block_size, s->num_blocks, WHO, err, err_len);
    if (rc != 0) return rc;
    const int T = b->num_tokens, P = b->common_prefix_len;
    if (b->num_reqs + 1 > s->cap_segs) {
        void *p = realloc(s->segs, sizeof *s->segs * (size_t)(b->num_reqs + 1));
        if (!p) goto oom;
        s->segs = p;
        s->cap_segs = b->num_reqs + 1;
    }
    s->num_items_main = 0;
    s->num_items_prefix = 0;
    /* Flat: each request vs its keys 0..seq_len-1.  Cascade suffix: keys P..seq_len-1. */
    for (int r = 0; r < b->num_reqs; r++) {
        ar_cpu_segment sg = {b->query_start_loc[r], b->query_start_loc[r + 1], r, 0, P,
                             b->seq_lens[r], 1};
        s->segs[r] = sg;
        if (ar_cpu_add_items(&s->segs[r], r, s->tile_tokens, s->num_kv_heads, &s->items_main,
                             &s->num_items_main, &s->cap_items_main))
            goto oom;
    }
    /* Cascade prefix: every query token as one sequence, non-causal, keys 0..P-1 of row 0. */
    if (P > 0) {
        int r = b->num_reqs;
        ar_cpu_segment sg = {0, T, 0, 0, 0, P, 0};
        s->segs[r] = sg;
        if (ar_cpu_add_items(&s->segs[r], r, s->tile_tokens, s->num_kv_heads, &s->items_prefix,
                             &s->num_items_prefix, &s->cap_items_prefix))
            goto oom;
    }
    s->prepared = 1;
    s->prepared_step = b->step;
    return 0;
oom:
    snprintf(err, err_len, WHO ": step %lld: out of memory for work items", (long long)b->step);
    return 3;
}

/* ---- fill: untimed writes of context tokens the run never wrote ----------------------- */

static int cpu_fill(void *state, int layer, const ar_fill *f, char *err, size_t err_len)
{
    cpu_state *s = state;
    int rc = ar_cpu_check_fill(f, layer, s->cfg.num_layers, s->step.slots, s->block_size, WHO,
                               err, err_len);
    if (rc != 0) return rc;
    const int Hkv = s->num_kv_heads, D = s->head_size;
    float *row = malloc(sizeof(float) * (size_t)D);
    if (!row) { snprintf(err, err_len, WHO ": fill: out of memory"); return 3; }
    for (int i = 0; i < f->count; i++) {
        int64_t slot = f->slots[i];
        int off = f->offsets[i];
        for (int h = 0; h < Hkv; h++) {
            for (int side = 0; side < 2; side++) {
                uint32_t stream = side == 0 ? AR_STREAM_K : AR_STREAM_V;
                uint64_t g = ar_gen_row(s->cfg.seed, stream, (uint32_t)layer, f->keys[i],
                                        (uint64_t)off, (uint32_t)h);
                for (int d = 0; d < D; d++)
                    row[d] = ar_gen(g, (uint32_t)d, s->cfg.data, s->cfg.dtype);
                void *cache = side == 0 ? s->k_cache[layer] : s->v_cache[layer];
                ar_cpu_store_row(s->cfg.kv_dtype, cache, (slot * Hkv + h) * D, D, s->kv_scale,
                                 row);
            }
        }
    }
    free(row);
    return 0;
}

/* ---- forward pieces ------------------------------------------------------------------- */

typedef struct gen_ctx {
    cpu_state *s;
    const ar_batch *b;
    int layer;
} gen_ctx;

/* Untimed: Q and new K/V of one tile of tokens. */
static void gen_task(void *ctx, int item, int worker)
{
    (void)worker;
    gen_ctx *g = ctx;
    cpu_state *s = g->s;
    const ar_batch *b = g->b;
    const int Hq = s->num_q_heads, Hkv = s->num_kv_heads, D = s->head_size, B = s->block_size;
    const ar_datadist dist = s->cfg.data;
    const ar_dtype dt = s->cfg.dtype;
    const uint32_t layer = (uint32_t)g->layer;
    int t0 = item * AR_CPU_TOKEN_TILE, t1 = ar_cpu_tile_end(t0, s->step.num_tokens);
    for (int t = t0; t < t1; t++) {
        int r = s->step.token_req[t], pos = s->step.token_pos[t];
        for (int h = 0; h < Hq; h++) {
            uint64_t row = ar_gen_row(s->cfg.seed, AR_STREAM_Q, layer, b->req_keys[r],
                                      (uint64_t)pos, (uint32_t)h);
            float *q = s->q + ((size_t)t * Hq + h) * D;
            for (int d = 0; d < D; d++) q[d] = ar_gen(row, (uint32_t)d, dist, dt);
        }
        uint64_t key = b->block_keys[(int64_t)r * b->max_blocks_per_req + pos / B];
        for (int h = 0; h < Hkv; h++) {
            uint64_t rk = ar_gen_row(s->cfg.seed, AR_STREAM_K, layer, key, (uint64_t)(pos % B),
                                     (uint32_t)h);
            uint64_t rv = ar_gen_row(s->cfg.seed, AR_STREAM_V, layer, key, (uint64_t)(pos % B),
                                     (uint32_t)h);
            float *k = s->k_new + ((size_t)t * Hkv + h) * D;
            float *v = s->v_new + ((size_t)t * Hkv + h) * D;
            for (int d = 0; d < D; d++) {
                k[d] = ar_gen(rk, (uint32_t)d, dist, dt);
                v[d] = ar_gen(rv, (uint32_t)d, dist, dt);
            }
        }
    }
}

/* Timed "write": reshape_and_cache_flash for one tile of tokens (all of them, in token order,
 * when two tokens share a slot). */
static void write_task(void *ctx, int item, int worker)
{
    (void)worker;
    gen_ctx *g = ctx;
    cpu_state *s = g->s;
    const int64_t *slot_mapping = g->b->slot_mapping;
    const int Hkv = s->num_kv_heads, D = s->head_size;
    int t0 = item * AR_CPU_TOKEN_TILE, t1 = ar_cpu_tile_end(t0, s->step.num_tokens);
    if (s->step.duplicate_slots) { t0 = 0; t1 = s->step.num_tokens; }
    for (int t = t0; t < t1; t++) {
        int64_t slot = slot_mapping[t];
        if (slot < 0) continue;
        int64_t first = slot * Hkv * D;
        ar_cpu_store_row(s->cfg.kv_dtype, s->k_cache[g->layer], first, Hkv * D, s->kv_scale,
                         s->k_new + (size_t)t * Hkv * D);
        ar_cpu_store_row(s->cfg.kv_dtype, s->v_cache[g->layer], first, Hkv * D, s->kv_scale,
                         s->v_new + (size_t)t * Hkv * D);
    }
}

/* The step's Q, new K/V and (cascade) partial outputs, sized for T tokens. */
static int alloc_step_buffers(cpu_state *s, int T, int cascade)
{
    size_t q_elems = (size_t)T * s->num_q_heads * s->head_size;
    size_t kv_elems = (size_t)T * s->num_kv_heads * s->head_size;
    size_t l_elems = (size_t)T * s->num_q_heads;
    if (ar_cpu_resize_floats(&s->q, q_elems) || ar_cpu_resize_floats(&s->k_new, kv_elems) ||
        ar_cpu_resize_floats(&s->v_new, kv_elems))
        return -1;
    if (cascade && (ar_cpu_resize_floats(&s->prefix_out, q_elems) || ar_cpu_resize_floats(&s->suffix_out, q_elems) ||
                    ar_cpu_resize_floats(&s->prefix_lse, l_elems) || ar_cpu_resize_floats(&s->suffix_lse, l_elems)))
        return -1;
    return 0;
}

/* The attention pass description common to flat, prefix and suffix. */
static ar_cpu_attn attn_pass(cpu_state *s, const ar_batch *b, int layer, const ar_cpu_item *items,
                             float *out, float *lse, int lse_base2)
{
    ar_cpu_attn a;
    memset(&a, 0, sizeof a);
    a.num_q_heads = s->num_q_heads;
    a.num_kv_heads = s->num_kv_heads;
    a.head_size = s->head_size;
    a.v_head_size = s->head_size;
    a.kv_stride = s->head_size;
    a.block_size = s->block_size;
    a.scale = s->scale;
    a.soft_cap = (float)s->cfg.model.logits_soft_cap;
    a.window = s->cfg.model.sliding_window;
    a.out_dtype = s->cfg.dtype;
    a.kv_dtype = s->cfg.kv_dtype;
    a.kv_scale = s->kv_scale;
    a.fault = s->cfg.fault;
    a.lse_base2 = lse_base2;
    a.k_cache = s->k_cache[layer];
    a.v_cache = s->v_cache[layer];
    a.block_table = b->block_table;
    a.block_table_stride = b->max_blocks_per_req;
    a.token_pos = s->step.token_pos;
    a.q = s->q;
    a.num_tokens = b->num_tokens;
    a.segs = s->segs;
    a.items = items;
    a.out = out;
    a.lse = lse;
    a.scratch = s->scratch;
    return a;
}

static int cpu_forward(void *state, int layer, const ar_batch *b, ar_forward_out *o,
                       char *err, size_t err_len)
{
    cpu_state *s = state;
    int rc = ar_cpu_check_forward(&s->step, s->prepared, s->prepared_step, b, layer,
                                  s->cfg.num_layers, WHO, err, err_len);
    if (rc != 0) return rc;
    const int T = b->num_tokens;
    const int cascade = b->common_prefix_len > 0;
    if (alloc_step_buffers(s, T, cascade)) {
        snprintf(err, err_len, WHO ": step %lld: out of memory for %d tokens of Q/K/V",
                 (long long)b->step, T);
        return 3;
    }
    int tiles = (T + AR_CPU_TOKEN_TILE - 1) / AR_CPU_TOKEN_TILE;
    gen_ctx g = {s, b, layer};
    ar_threadpool_run(s->pool, tiles, gen_task, &g);

    const int repeat = s->cfg.repeat < 1 ? 1 : s->cfg.repeat;
    const int nk = cascade ? 4 : 2;
    double *times = malloc(sizeof(double) * (size_t)repeat * (size_t)(nk + 1));
    if (!times) {
        snprintf(err, err_len, WHO ": out of memory for %d timings", repeat);
        return 3;
    }
    const int write_items = s->step.duplicate_slots ? (T > 0) : tiles;
    const int base2 = s->cfg.fault == AR_FAULT_LSE_BASE2;
    ar_cpu_attn flat = attn_pass(s, b, layer, s->items_main, o->out, o->lse, base2);
    ar_cpu_attn prefix = attn_pass(s, b, layer, s->items_prefix, s->prefix_out, s->prefix_lse, 0);
    ar_cpu_attn suffix = attn_pass(s, b, layer, s->items_main, s->suffix_out, s->suffix_lse, 0);
    ar_cpu_merge merge = {0, T, s->num_q_heads, s->head_size, T, s->prefix_out, s->prefix_lse,
                          s->suffix_out, s->suffix_lse, o->out, o->lse, s->cfg.dtype,
                          s->cfg.fault == AR_FAULT_MERGE_NO_WEIGHTS, base2};
    for (int rep = 0; rep < repeat; rep++) {
        double *tr = times + (size_t)rep * (nk + 1);
        double t0 = ar_cpu_now_us();
        ar_threadpool_run(s->pool, write_items, write_task, &g);
        double t1 = ar_cpu_now_us();
        tr[0] = t1 - t0;
        if (!cascade) {
            ar_threadpool_run(s->pool, s->num_items_main, ar_cpu_attn_task, &flat);
            double t2 = ar_cpu_now_us();
            tr[1] = t2 - t1;
            tr[2] = t2 - t0;
        } else {
            ar_threadpool_run(s->pool, s->num_items_prefix, ar_cpu_attn_task, &prefix);
            double t2 = ar_cpu_now_us();
            ar_threadpool_run(s->pool, s->num_items_main, ar_cpu_attn_task, &suffix);
            double t3 = ar_cpu_now_us();
            ar_threadpool_run(s->pool, ar_cpu_merge_items(&merge), ar_cpu_merge_task, &merge);
            double t4 = ar_cpu_now_us();
            tr[1] = t2 - t1;
            tr[2] = t3 - t2;
            tr[3] = t4 - t3;
            tr[4] = t4 - t0;
        }
    }
    static const char *const flat_names[] = {"write", "attn"};
    static const char *const cascade_names[] = {"write", "prefix", "suffix", "merge"};
    static const int all_used[] = {1, 1, 1, 1};
    ar_cpu_report_times(times, repeat, nk, cascade ? cascade_names : flat_names, all_used, o);
    free(times);
    o->num_paths = 0;
    if (cascade) {
        ar_forward_add_path(o, "cascade-prefix");
        ar_forward_add_path(o, "cascade-suffix");
        ar_forward_add_path(o, "cascade-merge");
    } else {
        ar_forward_add_path(o, "flat");
    }
    if (s->cfg.kv_dtype == AR_FP8_E4M3) ar_forward_add_path(o, "kv-fp8");
    return 0;
}

const ar_backend ar_cpu_backend = {
    .name = "cpu",
    .summary = "host attention: float32 accumulate, online softmax, pthreads; supports everything",
    .capabilities = "dtypes fp32/fp16/bf16; KV same or fp8_e4m3 (kv_scale); any head size and "
                    "block size; GQA/MQA; sliding window; soft cap; cascade; all faults",
    .needs_gpu = false,
    .check = cpu_check,
    .open = cpu_open,
    .prepare = cpu_prepare,
    .fill = cpu_fill,
    .forward = cpu_forward,
    .device_name = cpu_device_name,
    .close = cpu_close,
};
