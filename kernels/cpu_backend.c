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
 * tile of up to MAX_TILE_ROWS/group tokens, KV head); it handles every query head of that
 * KV head's group together, so each K/V row is loaded and converted once per item. */
#include "cpu_backend.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../reference/datagen.h"
#include "../reference/dtype.h"
#include "threadpool.h"

#define KEY_TILE 32          /* keys per online-softmax step */
#define MAX_TILE_ROWS 128    /* query rows (tokens x heads of a group) per work item */
#define WRITE_TILE 16        /* tokens per cache-write / generation work item */

/* A run of consecutive query tokens that read one block-table row over one key range. */
typedef struct segment {
    int tok0, tok1;          /* query tokens [tok0, tok1) of the step */
    int block_row;           /* row of block_table used to find keys */
    int key_lo, key_hi;      /* logical key positions [key_lo, key_hi) of the cache view */
    int causal;              /* 1: bottom-right causal against token positions */
} segment;

typedef struct work_item {
    int seg;
    int tok0, tok1;          /* tokens of this item, inside the segment */
    int kv_head;
} work_item;

/* Per-thread scratch of one attention work item. */
typedef struct scratch {
    float *k_tile;           /* [D, KEY_TILE] keys transposed */
    float *k_row;            /* [D] one key row before transposing */
    float *v_tile;           /* [KEY_TILE, Dv] */
    float *scores;           /* [KEY_TILE] */
    float *acc;              /* [max_rows, Dv] */
    float *row_max;          /* [max_rows] */
    float *row_sum;          /* [max_rows] */
    int *tok_lo, *tok_hi;    /* [tile_tokens] visible key range per token */
} scratch;

typedef struct cpu_state {
    ar_run_config cfg;
    int num_q_heads, num_kv_heads, group, head_size, v_head_size;
    int block_size, num_blocks;
    float scale, soft_cap;
    int window;
    float kv_scale;          /* multiplier on load; 1 unless the cache is fp8 */
    int64_t slots;           /* num_blocks * block_size */
    size_t side_elems;       /* elements of one of K or V in one layer */
    void **k_cache;          /* [num_layers] -> [num_blocks, block_size, Hkv, D] */
    void **v_cache;          /* [num_layers] -> same shape, V side */
    unsigned char *cache_mem; /* [num_layers] blocks of both sides */
    ar_threadpool *pool;
    int num_threads;
    int tile_tokens;
    scratch *scr;            /* [num_threads] */
    unsigned char *slot_seen; /* [slots / 8 + 1] bitmap for duplicate-slot detection */

    /* Per-step metadata from prepare(). */
    int prepared;            /* prepare() succeeded for prepared_step */
    int64_t prepared_step;
    int num_tokens;
    int cap_tokens, cap_items_main, cap_items_prefix;
    int *token_req;          /* [T] */
    int *token_pos;          /* [T] absolute position */
    segment *segs;           /* [num_reqs + 1] */
    int num_segs;
    work_item *items_main;   /* flat: all requests; cascade: suffix pass */
    int num_items_main;
    work_item *items_prefix; /* cascade prefix pass */
    int num_items_prefix;
    int duplicate_slots;     /* two tokens write one slot: write serially in token order */

    /* Per-step buffers. */
    float *q;                /* [T, Hq, D] */
    float *k_new, *v_new;    /* [T, Hkv, D] */
    float *prefix_out, *suffix_out; /* [T, Hq, Dv] */
    float *prefix_lse, *suffix_lse; /* [Hq, T] */
} cpu_state;

/* ---- small helpers -------------------------------------------------------------------- */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Grows *p to hold n elements of size elem; 0 ok, -1 out of memory. */
static int grow(void **p, int *cap, int n, size_t elem)
{
    if (n <= *cap && *p) return 0;
    int want = n < 16 ? 16 : n;
    void *q = realloc(*p, (size_t)want * elem);
    if (!q) return -1;
    *p = q;
    *cap = want;
    return 0;
}

/* Scores of one query row against a tile of keys held transposed (kT [D, KEY_TILE]):
 * sc[jj] = q . k_jj.  The inner loop runs over the tile's keys, a constant trip count with no
 * reduction, so the compiler vectorises it at -O2. */
static void tile_scores(const float *restrict q /* [D] */, const float *restrict kT, int D,
                        float *restrict sc /* [KEY_TILE] */)
{
    float acc[KEY_TILE];
    for (int jj = 0; jj < KEY_TILE; jj++) acc[jj] = 0.0f;
    for (int d = 0; d < D; d++) {
        float qd = q[d];
        const float *restrict krow = kT + (size_t)d * KEY_TILE;
        for (int jj = 0; jj < KEY_TILE; jj++) acc[jj] += qd * krow[jj];
    }
    for (int jj = 0; jj < KEY_TILE; jj++) sc[jj] = acc[jj];
}

/* acc[d] += p * v[d] for d < n, in blocks of 8 (vectorised) plus a scalar tail. */
static void add_scaled(float *restrict acc /* [n] */, const float *restrict v /* [n] */, float p,
                       int n)
{
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int u = 0; u < 8; u++) acc[d + u] += p * v[d + u];
    for (; d < n; d++) acc[d] += p * v[d];
}

/* acc[d] *= alpha for d < n. */
static void scale_row(float *restrict acc /* [n] */, float alpha, int n)
{
    int d = 0;
    for (; d + 8 <= n; d += 8)
        for (int u = 0; u < 8; u++) acc[d + u] *= alpha;
    for (; d < n; d++) acc[d] *= alpha;
}

/* Converts n cache elements starting at element index `first` to float, times mult. */
static void load_row(ar_dtype t, const void *base, int64_t first, int n, float mult, float *dst)
{
    switch (t) {
    case AR_FP16: {
        const uint16_t *s = (const uint16_t *)base + first;
        for (int i = 0; i < n; i++) dst[i] = ar_fp16_to_f32(s[i]) * mult;
        break;
    }
    case AR_BF16: {
        const uint16_t *s = (const uint16_t *)base + first;
        for (int i = 0; i < n; i++) dst[i] = ar_bf16_to_f32(s[i]) * mult;
        break;
    }
    case AR_FP8_E4M3: {
        const uint8_t *s = (const uint8_t *)base + first;
        for (int i = 0; i < n; i++) dst[i] = ar_fp8e4m3_to_f32(s[i]) * mult;
        break;
    }
    default: {
        const float *s = (const float *)base + first;
        for (int i = 0; i < n; i++) dst[i] = s[i] * mult;
        break;
    }
    }
}

/* Stores n floats (each divided by div when div != 1) as t's bits at element index first. */
static void store_row(ar_dtype t, void *base, int64_t first, int n, float div, const float *src)
{
    if (div != 1.0f) {
        for (int i = 0; i < n; i++) ar_store(t, base, first + i, src[i] / div);
        return;
    }
    switch (t) {
    case AR_FP16: {
        uint16_t *d = (uint16_t *)base + first;
        for (int i = 0; i < n; i++) d[i] = ar_f32_to_fp16(src[i]);
        break;
    }
    case AR_BF16: {
        uint16_t *d = (uint16_t *)base + first;
        for (int i = 0; i < n; i++) d[i] = ar_f32_to_bf16(src[i]);
        break;
    }
    case AR_FP8_E4M3: {
        uint8_t *d = (uint8_t *)base + first;
        for (int i = 0; i < n; i++) d[i] = ar_f32_to_fp8e4m3(src[i]);
        break;
    }
    default:
        memcpy((float *)base + first, src, (size_t)n * sizeof(float));
        break;
    }
}

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
    if (cfg->block_size <= 0 || cfg->num_blocks <= 0) {
        snprintf(why, why_len, "block_size %d and num_blocks %d must be positive",
                 cfg->block_size, cfg->num_blocks);
        return false;
    }
    if ((int64_t)cfg->block_size * cfg->num_blocks > INT32_MAX) {
        snprintf(why, why_len, "num_blocks x block_size exceeds 2^31 slots");
        return false;
    }
    if ((int)cfg->dtype < 0 || cfg->dtype >= AR_FP8_E4M3) {
        snprintf(why, why_len, "activation dtype must be fp32, fp16 or bf16 (fp8 is a KV-cache "
                 "dtype only)");
        return false;
    }
    if ((int)cfg->kv_dtype < 0 || cfg->kv_dtype >= AR_DTYPE_COUNT) {
        snprintf(why, why_len, "unknown KV-cache dtype %d", (int)cfg->kv_dtype);
        return false;
    }
    if (cfg->kv_dtype == AR_FP8_E4M3 && !(cfg->kv_scale > 0 && isfinite(cfg->kv_scale))) {
        snprintf(why, why_len, "fp8 KV cache needs a positive finite kv_scale (got %g)",
                 cfg->kv_scale);
        return false;
    }
    if (cfg->num_layers <= 0) {
        snprintf(why, why_len, "num_layers %d must be positive", cfg->num_layers);
        return false;
    }
    if (m->sliding_window < 0 || m->logits_soft_cap < 0 || !isfinite(m->logits_soft_cap)) {
        snprintf(why, why_len, "sliding_window %d and soft cap %g must not be negative",
                 m->sliding_window, m->logits_soft_cap);
        return false;
    }
    snprintf(why, why_len, "supported");
    return true;
}

/* ---- open / close --------------------------------------------------------------------- */

static void cpu_close(void *state)
{
    cpu_state *s = state;
    if (!s) return;
    if (s->pool) ar_threadpool_destroy(s->pool);
    if (s->scr) {
        for (int i = 0; i < s->num_threads; i++) {
            scratch *c = &s->scr[i];
            free(c->k_tile); free(c->k_row); free(c->v_tile); free(c->scores); free(c->acc);
            free(c->row_max); free(c->row_sum); free(c->tok_lo); free(c->tok_hi);
        }
        free(s->scr);
    }
    free(s->cache_mem);
    free(s->k_cache);
    free(s->v_cache);
    free(s->slot_seen);
    free(s->token_req); free(s->token_pos); free(s->segs);
    free(s->items_main); free(s->items_prefix);
    free(s->q); free(s->k_new); free(s->v_new);
    free(s->prefix_out); free(s->suffix_out); free(s->prefix_lse); free(s->suffix_lse);
    free(s);
}

/* Fills n elements of type t at base with its NaN pattern. */
static void fill_nan(ar_dtype t, void *base, size_t n)
{
    int size = ar_dtype_size(t);
    unsigned char pattern[4];
    switch (t) {
    case AR_FP16: { uint16_t v = 0x7e00u; memcpy(pattern, &v, 2); break; }
    case AR_BF16: { uint16_t v = 0x7fc0u; memcpy(pattern, &v, 2); break; }
    case AR_FP8_E4M3: pattern[0] = 0x7fu; break;
    default: { uint32_t v = 0x7fc00000u; memcpy(pattern, &v, 4); break; }
    }
    size_t bytes = n * (size_t)size;
    unsigned char *p = base;
    if (bytes == 0) return;
    memcpy(p, pattern, (size_t)size);
    size_t done = (size_t)size;
    while (done < bytes) {             /* doubling copy */
        size_t chunk = done < bytes - done ? done : bytes - done;
        memcpy(p + done, p, chunk);
        done += chunk;
    }
}

static int cpu_open(const ar_run_config *cfg, void **state, char *err, size_t err_len)
{
    *state = NULL;
    char why[256];
    if (!cpu_check(cfg, why, sizeof why)) {
        snprintf(err, err_len, "cpu backend: %s", why);
        return 2;
    }
    cpu_state *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, err_len, "cpu backend: out of memory (%zu bytes)", sizeof *s); return 3; }
    s->cfg = *cfg;
    const ar_model *m = &cfg->model;
    s->num_q_heads = m->num_q_heads;
    s->num_kv_heads = m->num_kv_heads;
    s->group = m->num_q_heads / m->num_kv_heads;
    s->head_size = m->head_size;
    s->v_head_size = m->head_size;
    s->block_size = cfg->block_size;
    s->num_blocks = cfg->num_blocks;
    s->scale = (float)(m->scale > 0 ? m->scale : 1.0 / sqrt((double)m->head_size));
    s->soft_cap = (float)m->logits_soft_cap;
    s->window = m->sliding_window;
    s->kv_scale = cfg->kv_dtype == AR_FP8_E4M3 ? (float)cfg->kv_scale : 1.0f;
    s->slots = (int64_t)cfg->num_blocks * cfg->block_size;

    /* The caches: one allocation, num_layers x (K side, V side). */
    int esize = ar_dtype_size(cfg->kv_dtype);
    double want = (double)s->slots * s->num_kv_heads * s->head_size * esize * 2.0 * cfg->num_layers;
    if (want > (double)SIZE_MAX / 2) {
        snprintf(err, err_len, "cpu backend: KV cache of %.0f bytes does not fit in memory", want);
        cpu_close(s);
        return 3;
    }
    s->side_elems = (size_t)s->slots * (size_t)s->num_kv_heads * (size_t)s->head_size;
    size_t side_bytes = s->side_elems * (size_t)esize;
    size_t total = side_bytes * 2 * (size_t)cfg->num_layers;
    s->cache_mem = malloc(total);
    s->k_cache = calloc((size_t)cfg->num_layers, sizeof *s->k_cache);
    s->v_cache = calloc((size_t)cfg->num_layers, sizeof *s->v_cache);
    s->slot_seen = calloc((size_t)(s->slots / 8 + 1), 1);
    if (!s->cache_mem || !s->k_cache || !s->v_cache || !s->slot_seen) {
        snprintf(err, err_len, "cpu backend: cannot allocate the KV cache: %zu bytes (%d layers x "
                 "2 x %d blocks x %d tokens x %d kv heads x %d dims x %d bytes)", total,
                 cfg->num_layers, cfg->num_blocks, cfg->block_size, s->num_kv_heads,
                 s->head_size, esize);
        cpu_close(s);
        return 3;
    }
    fill_nan(cfg->kv_dtype, s->cache_mem, total / (size_t)esize);
    for (int l = 0; l < cfg->num_layers; l++) {
        s->k_cache[l] = s->cache_mem + side_bytes * 2 * (size_t)l;
        s->v_cache[l] = s->cache_mem + side_bytes * (2 * (size_t)l + 1);
    }

    s->pool = ar_threadpool_create(cfg->threads);
    if (!s->pool) {
        snprintf(err, err_len, "cpu backend: cannot start %d threads", cfg->threads);
        cpu_close(s);
        return 3;
    }
    s->num_threads = ar_threadpool_size(s->pool);
    s->tile_tokens = MAX_TILE_ROWS / s->group;
    if (s->tile_tokens < 1) s->tile_tokens = 1;
    size_t max_rows = (size_t)s->tile_tokens * (size_t)s->group;
    s->scr = calloc((size_t)s->num_threads, sizeof *s->scr);
    int ok = s->scr != NULL;
    for (int i = 0; ok && i < s->num_threads; i++) {
        scratch *c = &s->scr[i];
        c->k_tile = malloc(sizeof(float) * KEY_TILE * (size_t)s->head_size);
        c->k_row = malloc(sizeof(float) * (size_t)s->head_size);
        c->v_tile = malloc(sizeof(float) * KEY_TILE * (size_t)s->v_head_size);
        c->scores = malloc(sizeof(float) * KEY_TILE);
        c->acc = malloc(sizeof(float) * max_rows * (size_t)s->v_head_size);
        c->row_max = malloc(sizeof(float) * max_rows);
        c->row_sum = malloc(sizeof(float) * max_rows);
        c->tok_lo = malloc(sizeof(int) * (size_t)s->tile_tokens);
        c->tok_hi = malloc(sizeof(int) * (size_t)s->tile_tokens);
        ok = c->k_tile && c->k_row && c->v_tile && c->scores && c->acc && c->row_max && c->row_sum &&
             c->tok_lo && c->tok_hi;
    }
    if (!ok) {
        snprintf(err, err_len, "cpu backend: out of memory for per-thread scratch");
        cpu_close(s);
        return 3;
    }
    *state = s;
    return 0;
}

static void cpu_device_name(void *state, char *buf, size_t len)
{
    cpu_state *s = state;
    int n = s ? s->num_threads : ar_cpu_count();
    snprintf(buf, len, "cpu (%d thread%s)", n, n == 1 ? "" : "s");
}

/* ---- prepare: validate the batch, derive token positions, segments and work items ------ */

static int add_items(cpu_state *s, work_item **items, int *num, int *cap, int seg_index)
{
    const segment *sg = &s->segs[seg_index];
    for (int t0 = sg->tok0; t0 < sg->tok1; t0 += s->tile_tokens) {
        int t1 = t0 + s->tile_tokens < sg->tok1 ? t0 + s->tile_tokens : sg->tok1;
        for (int h = 0; h < s->num_kv_heads; h++) {
            if (grow((void **)items, cap, *num + 1, sizeof **items)) return -1;
            (*items)[*num] = (work_item){seg_index, t0, t1, h};
            (*num)++;
        }
    }
    return 0;
}

static int cpu_prepare(void *state, const ar_batch *b, char *err, size_t err_len)
{
    cpu_state *s = state;
    const int B = s->block_size;
    s->prepared = 0;
    if (b->num_reqs < 0 || b->num_tokens < 0) {
        snprintf(err, err_len, "cpu backend: step %lld: negative num_reqs %d or num_tokens %d",
                 (long long)b->step, b->num_reqs, b->num_tokens);
        return 2;
    }
    if (b->num_reqs > 0 && (b->max_blocks_per_req <= 0 || !b->query_start_loc || !b->seq_lens ||
                            !b->context_lens || !b->block_table || !b->block_keys || !b->req_keys)) {
        snprintf(err, err_len, "cpu backend: step %lld: batch arrays missing or "
                 "max_blocks_per_req %d <= 0", (long long)b->step, b->max_blocks_per_req);
        return 2;
    }
    if (b->num_tokens > 0 && !b->slot_mapping) {
        snprintf(err, err_len, "cpu backend: step %lld: slot_mapping missing", (long long)b->step);
        return 2;
    }
    if (b->num_reqs > 0 && (b->query_start_loc[0] != 0 ||
                            b->query_start_loc[b->num_reqs] != b->num_tokens)) {
        snprintf(err, err_len, "cpu backend: step %lld: query_start_loc must run from 0 to "
                 "num_tokens %d", (long long)b->step, b->num_tokens);
        return 2;
    }
    if (b->num_reqs == 0 && b->num_tokens != 0) {
        snprintf(err, err_len, "cpu backend: step %lld: %d tokens but no requests",
                 (long long)b->step, b->num_tokens);
        return 2;
    }
    int T = b->num_tokens;
    if (T > s->cap_tokens) {
        int *req = realloc(s->token_req, sizeof(int) * (size_t)T);
        if (req) s->token_req = req;
        int *pos = realloc(s->token_pos, sizeof(int) * (size_t)T);
        if (pos) s->token_pos = pos;
        if (!req || !pos) goto oom;
        s->cap_tokens = T;
    }
    int min_context = INT_MAX;
    for (int r = 0; r < b->num_reqs; r++) {
        int q0 = b->query_start_loc[r], q1 = b->query_start_loc[r + 1];
        int seq = b->seq_lens[r], ctx = b->context_lens[r];
        if (q1 < q0 || q1 > T) {
            snprintf(err, err_len, "cpu backend: step %lld: request %d: query_start_loc not "
                     "non-decreasing within [0, %d]", (long long)b->step, r, T);
            return 2;
        }
        if (ctx < 0 || seq != ctx + (q1 - q0)) {
            snprintf(err, err_len, "cpu backend: step %lld: request %d: seq_len %d != context "
                     "%d + query_len %d", (long long)b->step, r, seq, ctx, q1 - q0);
            return 2;
        }
        if ((int64_t)seq > (int64_t)b->max_blocks_per_req * B) {
            snprintf(err, err_len, "cpu backend: step %lld: request %d: seq_len %d needs more "
                     "than max_blocks_per_req %d blocks of %d", (long long)b->step, r, seq,
                     b->max_blocks_per_req, B);
            return 2;
        }
        int used_blocks = (seq + B - 1) / B;
        for (int i = 0; i < used_blocks; i++) {
            int blk = b->block_table[(int64_t)r * b->max_blocks_per_req + i];
            if (blk < 0 || blk >= s->num_blocks) {
                snprintf(err, err_len, "cpu backend: step %lld: request %d: block_table[%d] = %d "
                         "outside [0, %d)", (long long)b->step, r, i, blk, s->num_blocks);
                return 2;
            }
        }
        for (int t = q0; t < q1; t++) {
            s->token_req[t] = r;
            s->token_pos[t] = ctx + (t - q0);
        }
        if (ctx < min_context) min_context = ctx;
    }
    /* Slots: in range, and note whether two tokens write the same one. */
    s->duplicate_slots = 0;
    for (int t = 0; t < T; t++) {
        int64_t slot = b->slot_mapping[t];
        if (slot == -1) continue;
        if (slot < 0 || slot >= s->slots) {
            snprintf(err, err_len, "cpu backend: step %lld: slot_mapping[%d] = %lld outside "
                     "[0, %lld) and not -1", (long long)b->step, t, (long long)slot,
                     (long long)s->slots);
            for (int u = 0; u < t; u++)        /* leave the bitmap clean */
                if (b->slot_mapping[u] >= 0)
                    s->slot_seen[b->slot_mapping[u] >> 3] = 0;
            return 2;
        }
        unsigned char bit = (unsigned char)(1u << (slot & 7));
        if (s->slot_seen[slot >> 3] & bit) s->duplicate_slots = 1;
        s->slot_seen[slot >> 3] |= bit;
    }
    for (int t = 0; t < T; t++)
        if (b->slot_mapping[t] >= 0) s->slot_seen[b->slot_mapping[t] >> 3] = 0;

    int P = b->common_prefix_len;
    if (P < 0 || (P > 0 && (P % B != 0 || b->num_reqs == 0 || P > min_context))) {
        snprintf(err, err_len, "cpu backend: step %lld: common_prefix_len %d must be a multiple "
                 "of block_size %d and at most the smallest context %d",
                 (long long)b->step, P, B, b->num_reqs ? min_context : 0);
        return 2;
    }

    /* Segments and work items. */
    {
        void *p = realloc(s->segs, sizeof(segment) * (size_t)(b->num_reqs + 1));
        if (!p) goto oom;
        s->segs = p;
    }
    s->num_segs = 0;
    s->num_items_main = 0;
    s->num_items_prefix = 0;
    for (int r = 0; r < b->num_reqs; r++) {
        segment sg = {b->query_start_loc[r], b->query_start_loc[r + 1], r, P, b->seq_lens[r], 1};
        s->segs[s->num_segs] = sg;
        if (add_items(s, &s->items_main, &s->num_items_main, &s->cap_items_main, s->num_segs))
            goto oom;
        s->num_segs++;
    }
    if (P > 0) {
        segment sg = {0, T, 0, 0, P, 0};
        s->segs[s->num_segs] = sg;
        if (add_items(s, &s->items_prefix, &s->num_items_prefix, &s->cap_items_prefix,
                      s->num_segs))
            goto oom;
        s->num_segs++;
    }
    s->num_tokens = T;
    s->prepared = 1;
    s->prepared_step = b->step;
    return 0;
oom:
    snprintf(err, err_len, "cpu backend: step %lld: out of memory for step metadata (%d tokens)",
             (long long)b->step, b->num_tokens);
    return 3;
}

/* ---- fill: untimed writes of context tokens the run never wrote ----------------------- */

static int cpu_fill(void *state, int layer, const ar_fill *f, char *err, size_t err_len)
{
    cpu_state *s = state;
    if (layer < 0 || layer >= s->cfg.num_layers) {
        snprintf(err, err_len, "cpu backend: fill: layer %d outside [0, %d)", layer,
                 s->cfg.num_layers);
        return 2;
    }
    const int Hkv = s->num_kv_heads, D = s->head_size;
    float *row = malloc(sizeof(float) * (size_t)D);
    if (!row) { snprintf(err, err_len, "cpu backend: fill: out of memory"); return 3; }
    for (int i = 0; i < f->count; i++) {
        int64_t slot = f->slots[i];
        int off = f->offsets[i];
        if (slot < 0 || slot >= s->slots || off < 0 || off >= s->block_size) {
            snprintf(err, err_len, "cpu backend: fill: entry %d: slot %lld outside [0, %lld) or "
                     "offset %d outside [0, %d)", i, (long long)slot, (long long)s->slots, off,
                     s->block_size);
            free(row);
            return 2;
        }
        for (int h = 0; h < Hkv; h++) {
            for (int side = 0; side < 2; side++) {
                uint32_t stream = side == 0 ? AR_STREAM_K : AR_STREAM_V;
                uint64_t g = ar_gen_row(s->cfg.seed, stream, (uint32_t)layer, f->keys[i],
                                        (uint64_t)off, (uint32_t)h);
                for (int d = 0; d < D; d++)
                    row[d] = ar_gen(g, (uint32_t)d, s->cfg.data, s->cfg.dtype);
                void *cache = side == 0 ? s->k_cache[layer] : s->v_cache[layer];
                store_row(s->cfg.kv_dtype, cache, (slot * Hkv + h) * D, D, s->kv_scale, row);
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

/* Untimed: Q and new K/V of tokens [item*WRITE_TILE, ...). */
static void gen_task(void *ctx, int item, int worker)
{
    (void)worker;
    gen_ctx *g = ctx;
    cpu_state *s = g->s;
    const ar_batch *b = g->b;
    const int Hq = s->num_q_heads, Hkv = s->num_kv_heads, D = s->head_size, B = s->block_size;
    const ar_datadist dist = s->cfg.data;
    const ar_dtype dt = s->cfg.dtype;
    int t0 = item * WRITE_TILE, t1 = t0 + WRITE_TILE < s->num_tokens ? t0 + WRITE_TILE : s->num_tokens;
    for (int t = t0; t < t1; t++) {
        int r = s->token_req[t], pos = s->token_pos[t];
        for (int h = 0; h < Hq; h++) {
            uint64_t row = ar_gen_row(s->cfg.seed, AR_STREAM_Q, (uint32_t)g->layer, b->req_keys[r],
                                      (uint64_t)pos, (uint32_t)h);
            float *q = s->q + ((size_t)t * Hq + h) * D;
            for (int d = 0; d < D; d++) q[d] = ar_gen(row, (uint32_t)d, dist, dt);
        }
        uint64_t key = b->block_keys[(int64_t)r * b->max_blocks_per_req + pos / B];
        for (int h = 0; h < Hkv; h++) {
            uint64_t rk = ar_gen_row(s->cfg.seed, AR_STREAM_K, (uint32_t)g->layer, key,
                                     (uint64_t)(pos % B), (uint32_t)h);
            uint64_t rv = ar_gen_row(s->cfg.seed, AR_STREAM_V, (uint32_t)g->layer, key,
                                     (uint64_t)(pos % B), (uint32_t)h);
            float *k = s->k_new + ((size_t)t * Hkv + h) * D;
            float *v = s->v_new + ((size_t)t * Hkv + h) * D;
            for (int d = 0; d < D; d++) {
                k[d] = ar_gen(rk, (uint32_t)d, dist, dt);
                v[d] = ar_gen(rv, (uint32_t)d, dist, dt);
            }
        }
    }
}

/* Timed "write": reshape_and_cache_flash for tokens [item*WRITE_TILE, ...). */
static void write_task(void *ctx, int item, int worker)
{
    (void)worker;
    gen_ctx *g = ctx;
    cpu_state *s = g->s;
    const int64_t *slot_mapping = g->b->slot_mapping;
    const int Hkv = s->num_kv_heads, D = s->head_size;
    int t0 = item * WRITE_TILE, t1 = t0 + WRITE_TILE < s->num_tokens ? t0 + WRITE_TILE : s->num_tokens;
    if (s->duplicate_slots) { t0 = 0; t1 = s->num_tokens; }   /* one item, token order */
    for (int t = t0; t < t1; t++) {
        int64_t slot = slot_mapping[t];
        if (slot < 0) continue;
        int64_t first = slot * Hkv * D;
        store_row(s->cfg.kv_dtype, s->k_cache[g->layer], first, Hkv * D, s->kv_scale,
                  s->k_new + (size_t)t * Hkv * D);
        store_row(s->cfg.kv_dtype, s->v_cache[g->layer], first, Hkv * D, s->kv_scale,
                  s->v_new + (size_t)t * Hkv * D);
    }
}

typedef struct attn_ctx {
    cpu_state *s;
    const ar_batch *b;
    int layer;
    const work_item *items;
    float *out;              /* [T, Hq, Dv] */
    float *lse;              /* [Hq, T] */
    int lse_base2;           /* report log2 (fault) */
} attn_ctx;

/* One work item: all query heads of one KV head for a tile of tokens of one segment. */
static void attn_task(void *ctx, int item, int worker)
{
    attn_ctx *a = ctx;
    cpu_state *s = a->s;
    const ar_batch *b = a->b;
    const work_item *it = &a->items[item];
    const segment *sg = &s->segs[it->seg];
    scratch *c = &s->scr[worker];
    const int Hq = s->num_q_heads, Hkv = s->num_kv_heads, G = s->group;
    const int D = s->head_size, Dv = s->v_head_size, B = s->block_size, T = s->num_tokens;
    const ar_fault fault = s->cfg.fault;
    const float scale = s->scale, cap = s->soft_cap;
    const int *block_row = b->block_table + (int64_t)sg->block_row * b->max_blocks_per_req;
    const void *kc = s->k_cache[a->layer], *vc = s->v_cache[a->layer];
    int kv_read = it->kv_head;
    if (fault == AR_FAULT_WRONG_KV_HEAD) kv_read = (it->kv_head + 1) % Hkv;
    const int ntok = it->tok1 - it->tok0, rows = ntok * G;

    /* Visible key range of every token of the tile, and their union. */
    int kmin = INT_MAX, kmax = INT_MIN;
    for (int i = 0; i < ntok; i++) {
        int pos = s->token_pos[it->tok0 + i];
        int lo = sg->key_lo, hi = sg->key_hi;
        if (sg->causal) {
            int last = pos + 1 + (fault == AR_FAULT_CAUSAL_OFF_BY_ONE);
            if (last < hi) hi = last;
        }
        if (s->window > 0 && pos - s->window + 1 > lo) lo = pos - s->window + 1;
        c->tok_lo[i] = lo;
        c->tok_hi[i] = hi;
        if (lo < hi) {
            if (lo < kmin) kmin = lo;
            if (hi > kmax) kmax = hi;
        }
    }
    for (int row = 0; row < rows; row++) { c->row_max[row] = -INFINITY; c->row_sum[row] = 0.0f; }
    memset(c->acc, 0, sizeof(float) * (size_t)rows * Dv);

    for (int j0 = kmin; j0 < kmax; j0 += KEY_TILE) {
        int j1 = j0 + KEY_TILE < kmax ? j0 + KEY_TILE : kmax;
        for (int j = j0; j < j1; j++) {
            int64_t slot = (int64_t)block_row[j / B] * B + j % B;
            int64_t first = (slot * Hkv + kv_read) * D;
            load_row(s->cfg.kv_dtype, kc, first, D, s->kv_scale, c->k_row);
            for (int d = 0; d < D; d++) c->k_tile[(size_t)d * KEY_TILE + (j - j0)] = c->k_row[d];
            load_row(s->cfg.kv_dtype, vc, first, Dv, s->kv_scale, c->v_tile + (size_t)(j - j0) * Dv);
        }
        for (int jj = j1 - j0; jj < KEY_TILE; jj++)      /* a short last tile: unused columns */
            for (int d = 0; d < D; d++) c->k_tile[(size_t)d * KEY_TILE + jj] = 0.0f;
        for (int i = 0; i < ntok; i++) {
            int lo = c->tok_lo[i] > j0 ? c->tok_lo[i] : j0;
            int hi = c->tok_hi[i] < j1 ? c->tok_hi[i] : j1;
            if (lo >= hi) continue;
            int t = it->tok0 + i;
            for (int gh = 0; gh < G; gh++) {
                int h = it->kv_head * G + gh, row = i * G + gh;
                const float *q = s->q + ((size_t)t * Hq + h) * D;
                float *acc = c->acc + (size_t)row * Dv;
                float tile_max = -INFINITY;
                tile_scores(q, c->k_tile, D, c->scores);
                for (int j = lo; j < hi; j++) {
                    float sc = c->scores[j - j0] * scale;
                    if (cap > 0) sc = cap * tanhf(sc / cap);
                    c->scores[j - j0] = sc;
                    if (sc > tile_max) tile_max = sc;
                }
                float m = c->row_max[row];
                if (tile_max > m) {
                    float alpha = expf(m - tile_max);     /* 0 when m is -inf */
                    c->row_sum[row] *= alpha;
                    if (fault != AR_FAULT_NO_RESCALE) scale_row(acc, alpha, Dv);
                    m = tile_max;
                    c->row_max[row] = m;
                }
                float sum = 0.0f;
                for (int j = lo; j < hi; j++) {
                    float p = expf(c->scores[j - j0] - m);
                    const float *v = c->v_tile + (size_t)(j - j0) * Dv;
                    sum += p;
                    add_scaled(acc, v, p, Dv);
                }
                c->row_sum[row] += sum;
            }
        }
    }

    /* Normalise, round to dtype, write out and LSE. */
    for (int i = 0; i < ntok; i++) {
        int t = it->tok0 + i;
        for (int gh = 0; gh < G; gh++) {
            int h = it->kv_head * G + gh, row = i * G + gh;
            float *out = a->out + ((size_t)t * Hq + h) * Dv;
            const float *acc = c->acc + (size_t)row * Dv;
            float l = c->row_sum[row];
            if (l == 0.0f) {             /* no visible key; a NaN sum stays NaN below */
                memset(out, 0, sizeof(float) * (size_t)Dv);
                a->lse[(size_t)h * T + t] = -INFINITY;
                continue;
            }
            float inv = 1.0f / l;
            for (int d = 0; d < Dv; d++) out[d] = ar_round_to(s->cfg.dtype, acc[d] * inv);
            float lse = c->row_max[row] + logf(l);
            if (a->lse_base2) lse *= (float)M_LOG2E;
            a->lse[(size_t)h * T + t] = lse;
        }
    }
}

typedef struct merge_ctx {
    cpu_state *s;
    float *out;              /* [T, Hq, Dv] */
    float *lse;              /* [Hq, T] */
} merge_ctx;

/* vLLM merge_attn_states for tokens [item*WRITE_TILE, ...), all heads. */
static void merge_task(void *ctx, int item, int worker)
{
    (void)worker;
    merge_ctx *mc = ctx;
    cpu_state *s = mc->s;
    const int Hq = s->num_q_heads, Dv = s->v_head_size, T = s->num_tokens;
    const ar_fault fault = s->cfg.fault;
    int t0 = item * WRITE_TILE, t1 = t0 + WRITE_TILE < T ? t0 + WRITE_TILE : T;
    for (int t = t0; t < t1; t++) {
        for (int h = 0; h < Hq; h++) {
            size_t li = (size_t)h * T + t;
            float p = s->prefix_lse[li], q = s->suffix_lse[li];
            if (p == INFINITY) p = -INFINITY;
            if (q == INFINITY) q = -INFINITY;
            float m = p > q ? p : q;
            const float *po = s->prefix_out + ((size_t)t * Hq + h) * Dv;
            const float *so = s->suffix_out + ((size_t)t * Hq + h) * Dv;
            float *out = mc->out + ((size_t)t * Hq + h) * Dv;
            float lse;
            if (fault == AR_FAULT_MERGE_NO_WEIGHTS) {
                for (int d = 0; d < Dv; d++) out[d] = ar_round_to(s->cfg.dtype, po[d] + so[d]);
                lse = m == -INFINITY ? -INFINITY : m + logf(expf(p - m) + expf(q - m));
            } else if (m == -INFINITY || isnan(m)) {
                memcpy(out, po, sizeof(float) * (size_t)Dv);
                lse = m;
            } else {
                float wp = expf(p - m), ws = expf(q - m), S = wp + ws;
                float sp = wp / S, ss = ws / S;
                for (int d = 0; d < Dv; d++)
                    out[d] = ar_round_to(s->cfg.dtype, po[d] * sp + so[d] * ss);
                lse = logf(S) + m;
            }
            if (fault == AR_FAULT_LSE_BASE2) lse *= (float)M_LOG2E;
            mc->lse[li] = lse;
        }
    }
}

/* Resizes *p to n floats (at least 1); 0 ok, -1 out of memory (old buffer kept). */
static int resize_floats(float **p, size_t n)
{
    float *q = realloc(*p, sizeof(float) * (n ? n : 1));
    if (!q) return -1;
    *p = q;
    return 0;
}

/* The step's Q, new K/V and (cascade) partial outputs, sized for T tokens.  Reallocated every
 * step: simple, and cheap next to generation and attention. */
static int alloc_step_buffers(cpu_state *s, int T, int cascade)
{
    size_t q_elems = (size_t)T * s->num_q_heads * s->head_size;
    size_t kv_elems = (size_t)T * s->num_kv_heads * s->head_size;
    size_t o_elems = (size_t)T * s->num_q_heads * s->v_head_size;
    size_t l_elems = (size_t)T * s->num_q_heads;
    if (resize_floats(&s->q, q_elems) || resize_floats(&s->k_new, kv_elems) ||
        resize_floats(&s->v_new, kv_elems))
        return -1;
    if (cascade && (resize_floats(&s->prefix_out, o_elems) || resize_floats(&s->suffix_out, o_elems) ||
                    resize_floats(&s->prefix_lse, l_elems) || resize_floats(&s->suffix_lse, l_elems)))
        return -1;
    return 0;
}

static int cpu_forward(void *state, int layer, const ar_batch *b, ar_forward_out *o,
                       char *err, size_t err_len)
{
    cpu_state *s = state;
    if (!s->prepared || s->prepared_step != b->step || s->num_tokens != b->num_tokens) {
        snprintf(err, err_len, "cpu backend: step %lld: forward without prepare() of this batch",
                 (long long)b->step);
        return 2;
    }
    if (layer < 0 || layer >= s->cfg.num_layers) {
        snprintf(err, err_len, "cpu backend: step %lld: layer %d outside [0, %d)",
                 (long long)b->step, layer, s->cfg.num_layers);
        return 2;
    }
    const int T = b->num_tokens;
    const int cascade = b->common_prefix_len > 0;
    if (alloc_step_buffers(s, T, cascade)) {
        snprintf(err, err_len, "cpu backend: step %lld: out of memory for %d tokens of Q/K/V",
                 (long long)b->step, T);
        return 3;
    }
    int tiles = (T + WRITE_TILE - 1) / WRITE_TILE;
    gen_ctx g = {s, b, layer};
    ar_threadpool_run(s->pool, tiles, gen_task, &g);

    int repeat = s->cfg.repeat < 1 ? 1 : s->cfg.repeat;
    int nk = cascade ? 4 : 2;
    double *times = malloc(sizeof(double) * (size_t)repeat * (size_t)(nk + 1));
    if (!times) {
        snprintf(err, err_len, "cpu backend: out of memory for %d timings", repeat);
        return 3;
    }
    int write_items = s->duplicate_slots ? (T > 0) : tiles;
    int lse_base2 = s->cfg.fault == AR_FAULT_LSE_BASE2;
    for (int rep = 0; rep < repeat; rep++) {
        double t0 = now_us();
        ar_threadpool_run(s->pool, write_items, write_task, &g);
        double t1 = now_us();
        times[rep * (nk + 1) + 0] = t1 - t0;
        if (!cascade) {
            attn_ctx a = {s, b, layer, s->items_main, o->out, o->lse, lse_base2};
            ar_threadpool_run(s->pool, s->num_items_main, attn_task, &a);
            double t2 = now_us();
            times[rep * (nk + 1) + 1] = t2 - t1;
            times[rep * (nk + 1) + 2] = t2 - t0;
        } else {
            attn_ctx pre = {s, b, layer, s->items_prefix, s->prefix_out, s->prefix_lse, 0};
            ar_threadpool_run(s->pool, s->num_items_prefix, attn_task, &pre);
            double t2 = now_us();
            attn_ctx suf = {s, b, layer, s->items_main, s->suffix_out, s->suffix_lse, 0};
            ar_threadpool_run(s->pool, s->num_items_main, attn_task, &suf);
            double t3 = now_us();
            merge_ctx mc = {s, o->out, o->lse};
            ar_threadpool_run(s->pool, tiles, merge_task, &mc);
            double t4 = now_us();
            times[rep * (nk + 1) + 1] = t2 - t1;
            times[rep * (nk + 1) + 2] = t3 - t2;
            times[rep * (nk + 1) + 3] = t4 - t3;
            times[rep * (nk + 1) + 4] = t4 - t0;
        }
    }
    static const char *flat_names[] = {"write", "attn"};
    static const char *cascade_names[] = {"write", "prefix", "suffix", "merge"};
    double *col = malloc(sizeof(double) * (size_t)repeat);
    if (!col) {
        free(times);
        snprintf(err, err_len, "cpu backend: out of memory for %d timings", repeat);
        return 3;
    }
    o->num_kernels = nk;
    for (int k = 0; k <= nk; k++) {
        for (int rep = 0; rep < repeat; rep++) col[rep] = times[rep * (nk + 1) + k];
        double med = median(col, repeat);
        if (k < nk) {
            o->kernels[k].name = cascade ? cascade_names[k] : flat_names[k];
            o->kernels[k].us = med;
        } else {
            o->total_us = med;
        }
    }
    o->guard_violations = 0;
    free(col);
    free(times);
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
