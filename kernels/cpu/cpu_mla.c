/* cpu_mla.c - the "cpu-mla" backend: DeepSeek MLA attention on the host (semantics section 7).
 *
 * Cache: per layer [num_blocks, block_size, L + R] (576 for DeepSeek) in the KV dtype, NaN
 * before anything is written; entry = [kv_c | k_pe] from AR_STREAM_LATENT (head 0).
 * Weights: W_UK [N][L][P] and W_UV [N][L][V] per layer, float, generated on first use
 * (ar_mla_weight); all layers are kept when they fit in AR_MLA_WEIGHT_BUDGET bytes, otherwise
 * only the layer in use.
 *
 * forward(), per layer, mirrors vLLM's MLACommonImpl with the FLASHMLA split:
 *   untimed  q_nope [T, N, P], q_pe [T, N, R] and the new latents [T, L + R];
 *   "write"  concat_and_cache_mla: latents into the cache through slot_mapping (-1 skipped);
 *   requests with query_len <= 128 take the ABSORBED decode path:
 *   "absorb" ql = q_nope W_UK_n (-> L, rounded to dtype), query = [ql | q_pe];
 *   "mqa"    attention over the 576-wide entries (one KV head), values = kv_c, causal
 *            bottom-right, o_lat [T, N, L] rounded to dtype (the shared kernel, cpu_attn.c);
 *   "vproj"  out = o_lat W_UV_n (-> V, rounded to dtype);
 *   longer requests take the PREFILL path (forward_mha): keys are gathered from the cache in
 *   chunks bounded by a workspace (context chunks first, then the new tokens), up-projected
 *   ("upproj": k = [c W_UK_n | k_pe], v = c W_UV_n, rounded to dtype), attended with 192-d
 *   dot products per head ("mha", causal) and folded together by the LSE merge ("merge").
 *   The new tokens' latents are read back from the cache too (vLLM uses the unquantised
 *   activations there; they differ only for an fp8 cache), so every key goes through
 *   slot_mapping and block_table.
 * Workspace: AR_CPU_MLA_WORKSPACE tokens in the environment, else as many tokens as fit in
 * 256 MiB of up-projected K/V (vLLM: up to 65536), divided among the prefills like vLLM's
 * max_context_chunk and rounded down to the block size.
 * Faults: CAUSAL_OFF_BY_ONE and NO_RESCALE in the kernel; WRONG_KV_HEAD (MLA has one KV head)
 * makes query head n use head (n + 1) % N's W_UK/W_UV; LSE_BASE2 on the reported LSE;
 * MERGE_NO_WEIGHTS in the chunk merges; MLA_NO_WUV leaves the output in latent space (the
 * first V latent dims, W_UV skipped). */
#include "cpu_backend.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../reference/datagen.h"
#include "../../reference/dtype.h"
#include "../../reference/mla_ref.h"
#include "cpu_attn.h"
#include "threadpool.h"

#define WHO "cpu-mla backend"
#define AR_MLA_DECODE_MAX_QUERY 128                 /* vLLM FLASHMLA reorder threshold */
#define AR_MLA_WEIGHT_BUDGET ((size_t)1 << 30)      /* bytes of weights kept across layers */
#define AR_MLA_WORKSPACE_BYTES ((size_t)256 << 20)  /* default up-projected workspace */

enum { K_WRITE, K_ABSORB, K_MQA, K_VPROJ, K_UPPROJ, K_MHA, K_MERGE, K_COUNT };
static const char *const kernel_names[K_COUNT] = {"write", "absorb", "mqa", "vproj",
                                                  "upproj", "mha", "merge"};

typedef struct mla_weights {
    float *w_uk;             /* [N, L, P] */
    float *w_uv;             /* [N, L, V] */
} mla_weights;

typedef struct mla_state {
    ar_run_config cfg;
    ar_mla_dims dims;
    int N, L, R, P, V, E, QK; /* heads, latent, rope, nope, v dim, entry L+R, P+R */
    int block_size, num_blocks;
    float scale, kv_scale;
    void **cache;            /* [num_layers] -> [num_blocks, block_size, E] */
    unsigned char *cache_mem;
    mla_weights *weights;    /* [num_layers], generated on first use */
    int keep_all_weights;
    int weights_layer;       /* the one layer kept when not all are */
    ar_threadpool *pool;
    int num_threads;
    ar_cpu_scratch *scratch_mqa;  /* head E, value L, group N */
    ar_cpu_scratch *scratch_mha;  /* head P+R, value V, group 1 */
    int workspace_tokens;

    /* Per-step metadata. */
    ar_cpu_step step;
    int prepared;
    int64_t prepared_step;
    int num_reqs;
    unsigned char *req_decode; /* [num_reqs] 1: absorbed path */
    int cap_reqs;
    ar_cpu_segment *segs;    /* [num_reqs]: decode segments / prefill chunk segments */
    ar_cpu_item *items;
    int num_items, cap_items;
    int num_decode_tokens, num_prefill_reqs, max_prefill_ctx, max_prefill_query;

    /* Per-step buffers. */
    float *q_nope, *q_pe;    /* [T, N, P], [T, N, R] */
    float *latent_new;       /* [T, E] */
    float *q_abs;            /* [T, N, E]  decode query [ql | q_pe] */
    float *o_lat;            /* [T, N, L] */
    float *q_mha;            /* [T, N, QK] prefill query [q_nope | q_pe] */
    float *chunk_out;        /* [T, N, V] */
    float *chunk_lse;        /* [N, T] */
    float *ws_k, *ws_v;      /* [ws_rows, N, QK], [ws_rows, N, V] up-projected keys/values */
    int ws_rows;             /* rows allocated (grown on demand) */
    int *ws_req;             /* [workspace rows] request of each row */
    int *ws_pos;             /* [workspace rows] key position of each row */
} mla_state;

static bool mla_check(const ar_run_config *cfg, char *why, size_t why_len)
{
    const ar_model *m = &cfg->model;
    if (m->attention != AR_ATTN_MLA) {
        snprintf(why, why_len, "not an MLA model (use cpu for MHA/GQA/MQA)");
        return false;
    }
    ar_mla_dims d = ar_mla_model_dims(m);
    if (m->num_q_heads <= 0) {
        snprintf(why, why_len, "num_q_heads %d must be positive", m->num_q_heads);
        return false;
    }
    if (m->num_kv_heads > 1) {
        snprintf(why, why_len, "MLA has one latent KV head (num_kv_heads %d)", m->num_kv_heads);
        return false;
    }
    if (m->head_size > 0 && m->head_size != d.kv_lora_rank + d.qk_rope_head_dim) {
        snprintf(why, why_len, "head_size %d != kv_lora_rank %d + qk_rope_head_dim %d",
                 m->head_size, d.kv_lora_rank, d.qk_rope_head_dim);
        return false;
    }
    if (d.v_head_dim > d.kv_lora_rank) {
        snprintf(why, why_len, "v_head_dim %d exceeds kv_lora_rank %d", d.v_head_dim,
                 d.kv_lora_rank);
        return false;
    }
    if (m->sliding_window != 0 || m->logits_soft_cap != 0) {
        snprintf(why, why_len, "MLA runs without sliding window and soft cap (as in vLLM)");
        return false;
    }
    return ar_cpu_check_run(cfg, why, why_len);
}

static void free_weights(mla_weights *w)
{
    free(w->w_uk);
    free(w->w_uv);
    w->w_uk = w->w_uv = NULL;
}

static void mla_close(void *state)
{
    mla_state *s = state;
    if (!s) return;
    if (s->pool) ar_threadpool_destroy(s->pool);
    ar_cpu_scratch_free(s->scratch_mqa, s->num_threads);
    ar_cpu_scratch_free(s->scratch_mha, s->num_threads);
    if (s->weights)
        for (int l = 0; l < s->cfg.num_layers; l++) free_weights(&s->weights[l]);
    free(s->weights);
    free(s->cache);
    free(s->cache_mem);
    ar_cpu_step_free(&s->step);
    free(s->req_decode); free(s->segs); free(s->items);
    free(s->q_nope); free(s->q_pe); free(s->latent_new); free(s->q_abs); free(s->o_lat);
    free(s->q_mha); free(s->chunk_out); free(s->chunk_lse); free(s->ws_k); free(s->ws_v);
    free(s->ws_req); free(s->ws_pos);
    free(s);
}

static int mla_open(const ar_run_config *cfg, void **state, char *err, size_t err_len)
{
    *state = NULL;
    char why[256];
    if (!mla_check(cfg, why, sizeof why)) {
        snprintf(err, err_len, WHO ": %s", why);
        return 2;
    }
    mla_state *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, err_len, WHO ": out of memory"); return 3; }
    s->cfg = *cfg;
    s->dims = ar_mla_model_dims(&cfg->model);
    s->N = s->dims.num_heads;
    s->L = s->dims.kv_lora_rank;
    s->R = s->dims.qk_rope_head_dim;
    s->P = s->dims.qk_nope_head_dim;
    s->V = s->dims.v_head_dim;
    s->E = s->L + s->R;
    s->QK = s->P + s->R;
    s->block_size = cfg->block_size;
    s->num_blocks = cfg->num_blocks;
    s->scale = (float)s->dims.scale;
    s->kv_scale = cfg->kv_dtype == AR_FP8_E4M3 ? (float)cfg->kv_scale : 1.0f;

    int esize = ar_dtype_size(cfg->kv_dtype);
    size_t layer_bytes = (size_t)cfg->num_blocks * (size_t)cfg->block_size * (size_t)s->E *
                         (size_t)esize;
    size_t total = layer_bytes * (size_t)cfg->num_layers;
    if (ar_cpu_check_memory(total, WHO, err, err_len) != 0) {
        mla_close(s);
        return 3;
    }
    s->cache_mem = malloc(total);
    s->cache = calloc((size_t)cfg->num_layers, sizeof *s->cache);
    s->weights = calloc((size_t)cfg->num_layers, sizeof *s->weights);
    if (!s->cache_mem || !s->cache || !s->weights ||
        ar_cpu_step_init(&s->step, cfg->num_blocks, cfg->block_size)) {
        snprintf(err, err_len, WHO ": cannot allocate the latent cache: %zu bytes (%d layers x "
                 "%d blocks x %d tokens x %d dims x %d bytes)", total, cfg->num_layers,
                 cfg->num_blocks, cfg->block_size, s->E, esize);
        mla_close(s);
        return 3;
    }
    ar_cpu_fill_nan(cfg->kv_dtype, s->cache_mem, total / (size_t)esize);
    for (int l = 0; l < cfg->num_layers; l++) s->cache[l] = s->cache_mem + layer_bytes * (size_t)l;
    size_t weight_bytes = sizeof(float) * (size_t)s->N * s->L * (size_t)(s->P + s->V);
    s->keep_all_weights = weight_bytes * (size_t)cfg->num_layers <= AR_MLA_WEIGHT_BUDGET;
    s->weights_layer = -1;

    size_t row_bytes = sizeof(float) * (size_t)s->N * (size_t)(s->QK + s->V);
    long ws = (long)(AR_MLA_WORKSPACE_BYTES / row_bytes);
    const char *env = getenv("AR_CPU_MLA_WORKSPACE");
    if (env && atol(env) > 0) ws = atol(env);
    if (ws > 65536) ws = 65536;
    if (ws < cfg->block_size) ws = cfg->block_size;
    s->workspace_tokens = (int)ws;

    s->pool = ar_threadpool_create(cfg->threads);
    if (!s->pool) {
        snprintf(err, err_len, WHO ": cannot start %d threads", cfg->threads);
        mla_close(s);
        return 3;
    }
    s->num_threads = ar_threadpool_size(s->pool);
    s->scratch_mqa = ar_cpu_scratch_alloc(s->num_threads, s->E, s->L, s->N);
    s->scratch_mha = ar_cpu_scratch_alloc(s->num_threads, s->QK, s->V, 1);
    if (!s->scratch_mqa || !s->scratch_mha) {
        snprintf(err, err_len, WHO ": out of memory for per-thread scratch");
        mla_close(s);
        return 3;
    }
    *state = s;
    return 0;
}

static void mla_device_name(void *state, char *buf, size_t len)
{
    mla_state *s = state;
    ar_cpu_device_name(s ? s->num_threads : ar_cpu_count(), buf, len);
}

/* ---- weights ---------------------------------------------------------------------------- */

typedef struct weight_ctx {
    mla_state *s;
    int layer;
    mla_weights *w;
} weight_ctx;

/* One head's W_UK and W_UV, stored head-major ([L, P] and [L, V] per head). */
static void weight_task(void *ctx, int n, int worker)
{
    (void)worker;
    weight_ctx *wc = ctx;
    mla_state *s = wc->s;
    const uint32_t layer = (uint32_t)wc->layer;
    for (int l = 0; l < s->L; l++) {
        float *uk = wc->w->w_uk + ((size_t)n * s->L + l) * s->P;
        float *uv = wc->w->w_uv + ((size_t)n * s->L + l) * s->V;
        for (int c = 0; c < s->P; c++)
            uk[c] = ar_mla_weight(s->cfg.seed, AR_STREAM_W_UK, layer, s->L, l, n, c, s->cfg.data,
                                  s->cfg.dtype);
        for (int c = 0; c < s->V; c++)
            uv[c] = ar_mla_weight(s->cfg.seed, AR_STREAM_W_UV, layer, s->L, l, n, c, s->cfg.data,
                                  s->cfg.dtype);
    }
}

static const mla_weights *layer_weights(mla_state *s, int layer)
{
    mla_weights *w = &s->weights[layer];
    if (w->w_uk) return w;
    if (!s->keep_all_weights && s->weights_layer >= 0) free_weights(&s->weights[s->weights_layer]);
    w->w_uk = malloc(sizeof(float) * (size_t)s->N * s->L * s->P);
    w->w_uv = malloc(sizeof(float) * (size_t)s->N * s->L * s->V);
    if (!w->w_uk || !w->w_uv) { free_weights(w); return NULL; }
    weight_ctx wc = {s, layer, w};
    ar_threadpool_run(s->pool, s->N, weight_task, &wc);
    s->weights_layer = layer;
    return w;
}

/* Head whose weights query head n uses (the WRONG_KV_HEAD fault shifts it by one). */
static int weight_head(const mla_state *s, int n)
{
    return s->cfg.fault == AR_FAULT_WRONG_KV_HEAD ? (n + 1) % s->N : n;
}

/* ---- prepare ------------------------------------------------------------------------------ */

static int mla_prepare(void *state, const ar_batch *b, char *err, size_t err_len)
{
    mla_state *s = state;
    s->prepared = 0;
    int rc = ar_cpu_step_prepare(&s->step, b, s->block_size, s->num_blocks, WHO, err, err_len);
    if (rc != 0) return rc;
    if (b->common_prefix_len != 0) {
        snprintf(err, err_len, WHO ": step %lld: cascade (common_prefix_len %d) is not used "
                 "with MLA", (long long)b->step, b->common_prefix_len);
        return 2;
    }
    if (b->num_reqs > s->cap_reqs) {
        unsigned char *d = realloc(s->req_decode, (size_t)b->num_reqs);
        if (d) s->req_decode = d;
        ar_cpu_segment *g = realloc(s->segs, sizeof *g * (size_t)b->num_reqs);
        if (g) s->segs = g;
        if (!d || !g) goto oom;
        s->cap_reqs = b->num_reqs;
    }
    s->num_reqs = b->num_reqs;
    s->num_decode_tokens = s->num_prefill_reqs = s->max_prefill_ctx = s->max_prefill_query = 0;
    for (int r = 0; r < b->num_reqs; r++) {
        int n = b->query_start_loc[r + 1] - b->query_start_loc[r];
        s->req_decode[r] = n <= AR_MLA_DECODE_MAX_QUERY;
        if (s->req_decode[r]) {
            s->num_decode_tokens += n;
        } else {
            s->num_prefill_reqs++;
            if (b->context_lens[r] > s->max_prefill_ctx) s->max_prefill_ctx = b->context_lens[r];
            if (n > s->max_prefill_query) s->max_prefill_query = n;
        }
    }
    s->prepared = 1;
    s->prepared_step = b->step;
    return 0;
oom:
    snprintf(err, err_len, WHO ": step %lld: out of memory for metadata", (long long)b->step);
    return 3;
}

/* ---- fill ----------------------------------------------------------------------------------- */

static int mla_fill(void *state, int layer, const ar_fill *f, char *err, size_t err_len)
{
    mla_state *s = state;
    int rc = ar_cpu_check_fill(f, layer, s->cfg.num_layers, s->step.slots, s->block_size, WHO,
                               err, err_len);
    if (rc != 0) return rc;
    float *row = malloc(sizeof(float) * (size_t)s->E);
    if (!row) { snprintf(err, err_len, WHO ": fill: out of memory"); return 3; }
    for (int i = 0; i < f->count; i++) {
        int64_t slot = f->slots[i];
        int off = f->offsets[i];
        uint64_t g = ar_gen_row(s->cfg.seed, AR_STREAM_LATENT, (uint32_t)layer, f->keys[i],
                                (uint64_t)off, 0);
        for (int d = 0; d < s->E; d++) row[d] = ar_gen(g, (uint32_t)d, s->cfg.data, s->cfg.dtype);
        ar_cpu_store_row(s->cfg.kv_dtype, s->cache[layer], slot * s->E, s->E, s->kv_scale, row);
    }
    free(row);
    return 0;
}

/* ---- forward pieces ------------------------------------------------------------------------- */

typedef struct mla_ctx {
    mla_state *s;
    const ar_batch *b;
    int layer;
    const mla_weights *w;
    ar_forward_out *o;
    int gathered_rows;            /* rows gathered into the workspace this chunk */
} mla_ctx;

/* Untimed: q_nope, q_pe and the new latent of one tile of tokens. */
static void gen_task(void *ctx, int item, int worker)
{
    (void)worker;
    mla_ctx *m = ctx;
    mla_state *s = m->s;
    const ar_batch *b = m->b;
    const uint32_t layer = (uint32_t)m->layer;
    const ar_datadist dist = s->cfg.data;
    const ar_dtype dt = s->cfg.dtype;
    int t0 = item * AR_CPU_TOKEN_TILE, t1 = ar_cpu_tile_end(t0, s->step.num_tokens);
    for (int t = t0; t < t1; t++) {
        int r = s->step.token_req[t], pos = s->step.token_pos[t];
        for (int n = 0; n < s->N; n++) {
            uint64_t rn = ar_gen_row(s->cfg.seed, AR_STREAM_Q_NOPE, layer, b->req_keys[r],
                                     (uint64_t)pos, (uint32_t)n);
            uint64_t rp = ar_gen_row(s->cfg.seed, AR_STREAM_Q_PE, layer, b->req_keys[r],
                                     (uint64_t)pos, (uint32_t)n);
            float *qn = s->q_nope + ((size_t)t * s->N + n) * s->P;
            float *qp = s->q_pe + ((size_t)t * s->N + n) * s->R;
            for (int d = 0; d < s->P; d++) qn[d] = ar_gen(rn, (uint32_t)d, dist, dt);
            for (int d = 0; d < s->R; d++) qp[d] = ar_gen(rp, (uint32_t)d, dist, dt);
        }
        uint64_t key = b->block_keys[(int64_t)r * b->max_blocks_per_req + pos / s->block_size];
        uint64_t rl = ar_gen_row(s->cfg.seed, AR_STREAM_LATENT, layer, key,
                                 (uint64_t)(pos % s->block_size), 0);
        float *lat = s->latent_new + (size_t)t * s->E;
        for (int d = 0; d < s->E; d++) lat[d] = ar_gen(rl, (uint32_t)d, dist, dt);
    }
}

/* "write": concat_and_cache_mla for one tile of tokens (all, in order, on duplicate slots). */
static void write_task(void *ctx, int item, int worker)
{
    (void)worker;
    mla_ctx *m = ctx;
    mla_state *s = m->s;
    int t0 = item * AR_CPU_TOKEN_TILE, t1 = ar_cpu_tile_end(t0, s->step.num_tokens);
    if (s->step.duplicate_slots) { t0 = 0; t1 = s->step.num_tokens; }
    for (int t = t0; t < t1; t++) {
        int64_t slot = m->b->slot_mapping[t];
        if (slot < 0) continue;
        ar_cpu_store_row(s->cfg.kv_dtype, s->cache[m->layer], slot * s->E, s->E, s->kv_scale,
                         s->latent_new + (size_t)t * s->E);
    }
}

/* "absorb": ql[t, n] = q_nope[t, n] W_UK_n (L values, rounded), then q_pe, for the decode
 * tokens of one tile. */
static void absorb_task(void *ctx, int item, int worker)
{
    (void)worker;
    mla_ctx *m = ctx;
    mla_state *s = m->s;
    int t0 = item * AR_CPU_TOKEN_TILE, t1 = ar_cpu_tile_end(t0, s->step.num_tokens);
    for (int t = t0; t < t1; t++) {
        if (!s->req_decode[s->step.token_req[t]]) continue;
        for (int n = 0; n < s->N; n++) {
            const float *qn = s->q_nope + ((size_t)t * s->N + n) * s->P;
            const float *w = m->w->w_uk + (size_t)weight_head(s, n) * s->L * s->P;
            float *qa = s->q_abs + ((size_t)t * s->N + n) * s->E;
            for (int l = 0; l < s->L; l++)
                qa[l] = ar_round_to(s->cfg.dtype, ar_cpu_dot(qn, w + (size_t)l * s->P, s->P));
            memcpy(qa + s->L, s->q_pe + ((size_t)t * s->N + n) * s->R, sizeof(float) * (size_t)s->R);
        }
    }
}

/* "vproj": out[t, n] = o_lat[t, n] W_UV_n (rounded) for the decode tokens of one tile; with
 * MLA_NO_WUV the first V latent values instead. */
static void vproj_task(void *ctx, int item, int worker)
{
    (void)worker;
    mla_ctx *m = ctx;
    mla_state *s = m->s;
    float *acc = s->scratch_mqa[worker].v_tile;     /* [>= V] free during this kernel */
    int t0 = item * AR_CPU_TOKEN_TILE, t1 = ar_cpu_tile_end(t0, s->step.num_tokens);
    for (int t = t0; t < t1; t++) {
        if (!s->req_decode[s->step.token_req[t]]) continue;
        for (int n = 0; n < s->N; n++) {
            const float *ol = s->o_lat + ((size_t)t * s->N + n) * s->L;
            float *out = m->o->out + ((size_t)t * s->N + n) * s->V;
            if (s->cfg.fault == AR_FAULT_MLA_NO_WUV) {
                memcpy(out, ol, sizeof(float) * (size_t)s->V);
                continue;
            }
            const float *w = m->w->w_uv + (size_t)weight_head(s, n) * s->L * s->V;
            memset(acc, 0, sizeof(float) * (size_t)s->V);
            for (int l = 0; l < s->L; l++) ar_cpu_add_scaled(acc, w + (size_t)l * s->V, ol[l], s->V);
            for (int v = 0; v < s->V; v++) out[v] = ar_round_to(s->cfg.dtype, acc[v]);
        }
    }
}

/* "upproj": workspace rows of one tile: gather the latent from the cache (paged, through the
 * row's request's block table), k = [c W_UK_n | k_pe], v = c W_UV_n, rounded to dtype. */
static void upproj_task(void *ctx, int item, int worker)
{
    mla_ctx *m = ctx;
    mla_state *s = m->s;
    const ar_batch *b = m->b;
    const int B = s->block_size;
    float *c = s->scratch_mqa[worker].k_row;        /* [E] free during this kernel */
    int r0 = item * AR_CPU_TOKEN_TILE, r1 = ar_cpu_tile_end(r0, m->gathered_rows);
    for (int row = r0; row < r1; row++) {
        int r = s->ws_req[row], pos = s->ws_pos[row];
        int64_t slot = (int64_t)b->block_table[(int64_t)r * b->max_blocks_per_req + pos / B] * B +
                       pos % B;
        ar_cpu_load_row(s->cfg.kv_dtype, s->cache[m->layer], slot * s->E, s->E, s->kv_scale, c);
        for (int d = 0; d < s->E; d++) c[d] = ar_round_to(s->cfg.dtype, c[d]);
        for (int n = 0; n < s->N; n++) {
            int wn = weight_head(s, n);
            float *k = s->ws_k + ((size_t)row * s->N + n) * s->QK;
            float *v = s->ws_v + ((size_t)row * s->N + n) * s->V;
            memset(k, 0, sizeof(float) * (size_t)s->P);
            memset(v, 0, sizeof(float) * (size_t)s->V);
            const float *wk = m->w->w_uk + (size_t)wn * s->L * s->P;
            const float *wv = m->w->w_uv + (size_t)wn * s->L * s->V;
            for (int l = 0; l < s->L; l++) {
                ar_cpu_add_scaled(k, wk + (size_t)l * s->P, c[l], s->P);
                ar_cpu_add_scaled(v, wv + (size_t)l * s->V, c[l], s->V);
            }
            for (int d = 0; d < s->P; d++) k[d] = ar_round_to(s->cfg.dtype, k[d]);
            memcpy(k + s->P, c + s->L, sizeof(float) * (size_t)s->R);
            if (s->cfg.fault == AR_FAULT_MLA_NO_WUV) memcpy(v, c, sizeof(float) * (size_t)s->V);
            else
                for (int d = 0; d < s->V; d++) v[d] = ar_round_to(s->cfg.dtype, v[d]);
        }
    }
}

/* Untimed: the prefill query [q_nope | q_pe] of one tile, and the running prefill output and
 * LSE set to "empty" (0, -inf) so that the first chunk merge just takes the chunk. */
static void prefill_init_task(void *ctx, int item, int worker)
{
    (void)worker;
    mla_ctx *m = ctx;
    mla_state *s = m->s;
    const int T = s->step.num_tokens;
    int t0 = item * AR_CPU_TOKEN_TILE, t1 = ar_cpu_tile_end(t0, T);
    for (int t = t0; t < t1; t++) {
        if (s->req_decode[s->step.token_req[t]]) continue;
        for (int n = 0; n < s->N; n++) {
            float *q = s->q_mha + ((size_t)t * s->N + n) * s->QK;
            memcpy(q, s->q_nope + ((size_t)t * s->N + n) * s->P, sizeof(float) * (size_t)s->P);
            memcpy(q + s->P, s->q_pe + ((size_t)t * s->N + n) * s->R, sizeof(float) * (size_t)s->R);
            memset(m->o->out + ((size_t)t * s->N + n) * s->V, 0, sizeof(float) * (size_t)s->V);
            m->o->lse[(size_t)n * T + t] = -INFINITY;
        }
    }
}

static ar_cpu_attn attn_base(mla_state *s, const ar_batch *b)
{
    ar_cpu_attn a;
    memset(&a, 0, sizeof a);
    a.num_q_heads = s->N;
    a.scale = s->scale;
    a.out_dtype = s->cfg.dtype;
    a.fault = s->cfg.fault == AR_FAULT_WRONG_KV_HEAD ? AR_FAULT_NONE : s->cfg.fault;
    a.token_pos = s->step.token_pos;
    a.num_tokens = b->num_tokens;
    a.segs = s->segs;
    a.block_table = b->block_table;
    a.block_table_stride = b->max_blocks_per_req;
    return a;
}

/* Grows the workspace to hold `rows` key rows; 0 ok, -1 out of memory. */
static int ensure_workspace(mla_state *s, int rows)
{
    if (rows <= s->ws_rows) return 0;
    if (ar_cpu_resize_floats(&s->ws_k, (size_t)rows * s->N * s->QK) ||
        ar_cpu_resize_floats(&s->ws_v, (size_t)rows * s->N * s->V))
        return -1;
    int *req = realloc(s->ws_req, sizeof(int) * (size_t)rows);
    if (req) s->ws_req = req;
    int *pos = realloc(s->ws_pos, sizeof(int) * (size_t)rows);
    if (pos) s->ws_pos = pos;
    if (!req || !pos) return -1;
    s->ws_rows = rows;
    return 0;
}

/* Keys per request and chunk on the prefill path (vLLM's max_context_chunk). */
static int prefill_chunk_len(const mla_state *s)
{
    int chunk_len = s->workspace_tokens / (s->num_prefill_reqs > 0 ? s->num_prefill_reqs : 1);
    if (chunk_len >= s->block_size) chunk_len -= chunk_len % s->block_size;
    return chunk_len < 1 ? 1 : chunk_len;
}

static int alloc_step_buffers(mla_state *s, int T)
{
    size_t tn = (size_t)T * s->N;
    if (ar_cpu_resize_floats(&s->q_nope, tn * s->P) || ar_cpu_resize_floats(&s->q_pe, tn * s->R) ||
        ar_cpu_resize_floats(&s->latent_new, (size_t)T * s->E))
        return -1;
    if (s->num_decode_tokens > 0 &&
        (ar_cpu_resize_floats(&s->q_abs, tn * s->E) || ar_cpu_resize_floats(&s->o_lat, tn * s->L)))
        return -1;
    if (s->num_prefill_reqs > 0 &&
        (ar_cpu_resize_floats(&s->q_mha, tn * s->QK) || ar_cpu_resize_floats(&s->chunk_out, tn * s->V) ||
         ar_cpu_resize_floats(&s->chunk_lse, tn) ||
         ensure_workspace(s, prefill_chunk_len(s) * s->num_prefill_reqs)))
        return -1;
    return 0;
}

/* One chunk of the prefill path: for every prefill request the keys [lo_r, hi_r) given by
 * range_of(phase, chunk): gathered, up-projected, attended, merged into the running output.
 * times[] accumulates upproj / mha / merge microseconds.  Returns -1 when out of memory. */
static int prefill_chunk(mla_ctx *m, int phase, int chunk, int chunk_len, double *times)
{
    mla_state *s = m->s;
    const ar_batch *b = m->b;
    int rows = 0;
    s->num_items = 0;
    for (int r = 0; r < b->num_reqs; r++) {
        ar_cpu_segment sg = {b->query_start_loc[r], b->query_start_loc[r + 1], r, rows, 0, 0, 1};
        if (!s->req_decode[r]) {
            int base = phase == 0 ? 0 : b->context_lens[r];
            int end = phase == 0 ? b->context_lens[r] : b->seq_lens[r];
            int lo = base + chunk * chunk_len;
            int hi = lo + chunk_len < end ? lo + chunk_len : end;
            if (hi < lo) hi = lo;
            sg.key_lo = lo;
            sg.key_hi = hi;
            for (int p = lo; p < hi; p++, rows++) {
                s->ws_req[rows] = r;
                s->ws_pos[rows] = p;
            }
            s->segs[r] = sg;
            if (ar_cpu_add_items(&s->segs[r], r, ar_cpu_tile_tokens(1), s->N, &s->items,
                                 &s->num_items, &s->cap_items))
                return -1;
        }
    }
    m->gathered_rows = rows;
    double t0 = ar_cpu_now_us();
    ar_threadpool_run(s->pool, (rows + AR_CPU_TOKEN_TILE - 1) / AR_CPU_TOKEN_TILE, upproj_task, m);
    double t1 = ar_cpu_now_us();
    ar_cpu_attn a = attn_base(s, b);
    a.num_kv_heads = s->N;
    a.head_size = s->QK;
    a.v_head_size = s->V;
    a.kv_stride = s->QK;
    a.v_stride = s->V;
    a.block_size = 0;
    a.kv_dtype = AR_FP32;
    a.kv_scale = 1.0f;
    a.k_cache = s->ws_k;
    a.v_cache = s->ws_v;
    a.q = s->q_mha;
    a.items = s->items;
    a.out = s->chunk_out;
    a.lse = s->chunk_lse;
    a.scratch = s->scratch_mha;
    ar_threadpool_run(s->pool, s->num_items, ar_cpu_attn_task, &a);
    double t2 = ar_cpu_now_us();
    for (int r = 0; r < b->num_reqs; r++) {
        if (s->req_decode[r]) continue;
        ar_cpu_merge mg = {b->query_start_loc[r], b->query_start_loc[r + 1], s->N, s->V,
                           b->num_tokens, m->o->out, m->o->lse, s->chunk_out, s->chunk_lse,
                           m->o->out, m->o->lse, s->cfg.dtype,
                           s->cfg.fault == AR_FAULT_MERGE_NO_WEIGHTS, 0};
        ar_threadpool_run(s->pool, ar_cpu_merge_items(&mg), ar_cpu_merge_task, &mg);
    }
    double t3 = ar_cpu_now_us();
    times[K_UPPROJ] += t1 - t0;
    times[K_MHA] += t2 - t1;
    times[K_MERGE] += t3 - t2;
    return 0;
}

/* The timed part once; times[K_*] receives the kernel microseconds. */
static int forward_once(mla_ctx *m, double *times)
{
    mla_state *s = m->s;
    const ar_batch *b = m->b;
    const int T = b->num_tokens;
    const int tiles = (T + AR_CPU_TOKEN_TILE - 1) / AR_CPU_TOKEN_TILE;
    for (int k = 0; k < K_COUNT; k++) times[k] = 0;

    double t0 = ar_cpu_now_us();
    ar_threadpool_run(s->pool, s->step.duplicate_slots ? (T > 0) : tiles, write_task, m);
    double t1 = ar_cpu_now_us();
    times[K_WRITE] = t1 - t0;

    if (s->num_decode_tokens > 0) {
        ar_threadpool_run(s->pool, tiles, absorb_task, m);
        double t2 = ar_cpu_now_us();
        s->num_items = 0;
        for (int r = 0; r < b->num_reqs; r++) {
            if (!s->req_decode[r]) continue;
            ar_cpu_segment sg = {b->query_start_loc[r], b->query_start_loc[r + 1], r, 0, 0,
                                 b->seq_lens[r], 1};
            s->segs[r] = sg;
            if (ar_cpu_add_items(&s->segs[r], r, ar_cpu_tile_tokens(s->N), 1, &s->items,
                                 &s->num_items, &s->cap_items))
                return -1;
        }
        ar_cpu_attn a = attn_base(s, b);
        a.num_kv_heads = 1;
        a.head_size = s->E;
        a.v_head_size = s->L;
        a.kv_stride = s->E;
        a.block_size = s->block_size;
        a.kv_dtype = s->cfg.kv_dtype;
        a.kv_scale = s->kv_scale;
        a.k_cache = s->cache[m->layer];
        a.v_cache = s->cache[m->layer];
        a.q = s->q_abs;
        a.items = s->items;
        a.out = s->o_lat;
        a.lse = m->o->lse;
        a.scratch = s->scratch_mqa;
        ar_threadpool_run(s->pool, s->num_items, ar_cpu_attn_task, &a);
        double t3 = ar_cpu_now_us();
        ar_threadpool_run(s->pool, tiles, vproj_task, m);
        double t4 = ar_cpu_now_us();
        times[K_ABSORB] = t2 - t1;
        times[K_MQA] = t3 - t2;
        times[K_VPROJ] = t4 - t3;
    }

    if (s->num_prefill_reqs > 0) {
        ar_threadpool_run(s->pool, tiles, prefill_init_task, m);
        int chunk_len = prefill_chunk_len(s);
        int ctx_chunks = (s->max_prefill_ctx + chunk_len - 1) / chunk_len;
        int new_chunks = (s->max_prefill_query + chunk_len - 1) / chunk_len;
        for (int c = 0; c < ctx_chunks; c++)
            if (prefill_chunk(m, 0, c, chunk_len, times)) return -1;
        for (int c = 0; c < new_chunks; c++)
            if (prefill_chunk(m, 1, c, chunk_len, times)) return -1;
    }
    if (s->cfg.fault == AR_FAULT_LSE_BASE2)
        for (size_t i = 0; i < (size_t)T * s->N; i++) m->o->lse[i] *= (float)M_LOG2E;
    return 0;
}

static int mla_forward(void *state, int layer, const ar_batch *b, ar_forward_out *o, char *err,
                       size_t err_len)
{
    mla_state *s = state;
    int rc = ar_cpu_check_forward(&s->step, s->prepared, s->prepared_step, b, layer,
                                  s->cfg.num_layers, WHO, err, err_len);
    if (rc != 0) return rc;
    const int T = b->num_tokens;
    const mla_weights *w = layer_weights(s, layer);
    if (!w || alloc_step_buffers(s, T)) {
        snprintf(err, err_len, WHO ": step %lld: out of memory for weights or %d tokens",
                 (long long)b->step, T);
        return 3;
    }
    mla_ctx m = {s, b, layer, w, o, 0};
    ar_threadpool_run(s->pool, (T + AR_CPU_TOKEN_TILE - 1) / AR_CPU_TOKEN_TILE, gen_task, &m);

    const int repeat = s->cfg.repeat < 1 ? 1 : s->cfg.repeat;
    double *times = malloc(sizeof(double) * (size_t)repeat * (K_COUNT + 1));
    if (!times) {
        snprintf(err, err_len, WHO ": out of memory for %d timings", repeat);
        return 3;
    }
    for (int rep = 0; rep < repeat; rep++) {
        double *tr = times + (size_t)rep * (K_COUNT + 1);
        double t0 = ar_cpu_now_us();
        if (forward_once(&m, tr)) {
            free(times);
            snprintf(err, err_len, WHO ": step %lld: out of memory for work items",
                     (long long)b->step);
            return 3;
        }
        tr[K_COUNT] = ar_cpu_now_us() - t0;
    }
    /* Kernels that had work this step, in a fixed order. */
    int used[K_COUNT] = {1, s->num_decode_tokens > 0, s->num_decode_tokens > 0,
                         s->num_decode_tokens > 0, s->num_prefill_reqs > 0,
                         s->num_prefill_reqs > 0, s->num_prefill_reqs > 0};
    ar_cpu_report_times(times, repeat, K_COUNT, kernel_names, used, o);
    free(times);
    o->num_paths = 0;
    if (s->num_decode_tokens > 0) ar_forward_add_path(o, "mla-decode:absorbed");
    if (s->num_prefill_reqs > 0) ar_forward_add_path(o, "mla-prefill:new");
    if (s->num_prefill_reqs > 0 && s->max_prefill_ctx > 0) ar_forward_add_path(o, "mla-prefill:context");
    if (s->cfg.kv_dtype == AR_FP8_E4M3) ar_forward_add_path(o, "kv-fp8");
    return 0;
}

const ar_backend ar_cpu_mla_backend = {
    .name = "cpu-mla",
    .summary = "host MLA: absorbed decode (query <= 128) and chunked up-projected prefill, "
               "float32 accumulate, pthreads",
    .capabilities = "MLA models (any head count; DeepSeek-V3 dims by default); dtypes "
                    "fp32/fp16/bf16; KV same or fp8_e4m3 (kv_scale); any block size; all faults",
    .needs_gpu = false,
    .check = mla_check,
    .open = mla_open,
    .prepare = mla_prepare,
    .fill = mla_fill,
    .forward = mla_forward,
    .device_name = mla_device_name,
    .close = mla_close,
};
