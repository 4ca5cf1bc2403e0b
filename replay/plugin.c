/* plugin.c - plugins as backends: the loader (dlopen, attnreplay_plugin_init, the ABI checks), the
 * host services of attnreplay_plugin.h, and the adapter that turns an attnreplay_plugin into an
 * ar_backend (replay/backend.h).
 *
 * The adapter does the host's half of the contract:
 *   check    the ABI covers the model (MHA/GQA/MQA paged attention; MLA for a CPU plugin with
 *            ATTNREPLAY_PLUGIN_MLA); then the plugin's own check;
 *   open     allocates each layer's cache [2, num_blocks, block_size, Hkv, D] in the KV dtype on
 *            the plugin's device, every byte 0xff (NaN in every supported dtype), then the
 *            plugin's open;
 *   prepare  the step's metadata as vLLM's FlashAttentionMetadata (host arrays, and device
 *            copies for a CUDA plugin), the per-token generator keys, then the plugin's plan;
 *   fill     the untimed context writes, generated on the plugin's device;
 *   forward  Q and new K/V generated on the device (untimed); out and LSE filled with NaN and
 *            guard words set; then per --repeat: the host's cache write when the plugin does not
 *            write K/V ("write"), and the plugin's forward, split at the plugin's time marks
 *            ("attn" after the last), a CUDA plugin's repeats back to back on their own events
 *            and waited for once; guard words counted; the output handed to the verifier
 *            (host floats when asked for, the device pointers for a CUDA plugin).
 * MLA: the cache is [num_blocks, block_size, L + R]; forward generates q_nope, q_pe and the new
 * latents as the cpu-mla backend does, absorbs q_nope through W_UK into the plugin's query
 * (untimed), and after the plugin's latent attention multiplies its out by W_UV (untimed) into
 * the output the verifier sees: on the host for a CPU plugin, on the device (plugin_dev.h) for a
 * CUDA one.  The projection faults (wrong-kv-head: head n's weights from head n + 1; mla-no-wuv)
 * are applied there, by the host.
 * The CPU path is here (spread over the run's --threads cores); the CUDA one goes through plugin_dev.h.
 *
 * The plugin's attnreplay_plugin_init, check() and close() are bracketed for the watchdog
 * (watchdog.h, ar_call_begin_plugin) with the plugin's file, as the run's calls are, so that a
 * fault or hang in them ends a replay with a message naming the plugin instead of a bare signal.
 *
 * ar_backend's check and open carry no context, so each registered plugin gets one of
 * AR_PLUGIN_SLOTS slots with its own pair of small trampolines. */
#include "plugin.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/cpu/threadpool.h"
#include "../reference/datagen.h"
#include "../reference/dtype.h"
#include "../reference/mla_ref.h"
#include "plugin_dev.h"
#include "registry.h"
#include "watchdog.h"

#define WHO_MAX 160

/* ---- host services ------------------------------------------------------------------------ */

typedef struct plugin_run plugin_run;

static char call_error[1024];          /* the text of the failing call (one thread calls plugins) */
static plugin_run *active_run;         /* the run whose forward is in progress (time marks) */

static void host_set_error(const char *message)
{
    snprintf(call_error, sizeof call_error, "%s", message ? message : "(no text)");
}

static int log_threshold(void)
{
    const char *s = getenv("ATTNREPLAY_PLUGIN_LOG");
    return s && *s ? atoi(s) : ATTNREPLAY_LOG_WARN;
}

static void host_log(int level, const char *message)
{
    static const char *const names[] = {"error", "warning", "info", "debug"};
    if (level > log_threshold()) return;
    fprintf(stderr, "attnreplay plugin %s: %s\n", level >= 0 && level <= 3 ? names[level] : "log",
            message ? message : "");
}

static void *host_cuda_stream(void);
static void host_time_mark(const char *name);

static const attnreplay_host_api host_api = {
    .abi_version = ATTNREPLAY_PLUGIN_ABI_VERSION,
    .struct_size = (int32_t)sizeof(attnreplay_host_api),
    .set_error = host_set_error,
    .log = host_log,
    .cuda_stream = host_cuda_stream,
    .time_mark = host_time_mark,
};

/* Takes the plugin's error text, or says it gave none. */
static const char *take_error(void)
{
    static char text[sizeof call_error];
    snprintf(text, sizeof text, "%s", call_error[0] ? call_error : "it gave no reason (set_error not called)");
    call_error[0] = '\0';
    return text;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* ---- DLPack helpers --------------------------------------------------------------------- */

static DLDataType dl_dtype(ar_dtype t)
{
    DLDataType d = {kDLFloat, 32, 1};
    if (t == AR_FP16) d.bits = 16;
    if (t == AR_BF16) { d.code = kDLBfloat; d.bits = 16; }
    if (t == AR_FP8_E4M3) { d.code = kDLFloat8_e4m3fn; d.bits = 8; }
    return d;
}

/* A DLTensor with its shape and strides stored beside it (the struct must not move once set). */
typedef struct ar_tensor {
    DLTensor t;
    int64_t shape[5];
    int64_t strides[5];
} ar_tensor;

static void tensor_set(ar_tensor *a, void *data, DLDevice dev, DLDataType dt, int ndim, const int64_t *shape)
{
    memset(a, 0, sizeof *a);
    a->t.data = data;
    a->t.device = dev;
    a->t.ndim = ndim;
    a->t.dtype = dt;
    a->t.shape = a->shape;
    a->t.strides = a->strides;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        a->shape[i] = shape[i];
        a->strides[i] = stride;
        stride *= shape[i] > 0 ? shape[i] : 1;
    }
}

/* ---- slots: one registered plugin each ----------------------------------------------------- */

typedef struct plugin_slot {
    int used;
    ar_backend be;
    const attnreplay_plugin *p;
    char name[96];           /* prefix + plugin name: the backend's name */
    char path[80];           /* "plugin:" + plugin name: its one kernel path (backend.h) */
    char source[512];        /* path or a description, for messages */
    char summary[256];
    char capabilities[256];
} plugin_slot;

static plugin_slot slots[AR_PLUGIN_SLOTS];

static bool slot_check(int i, const ar_run_config *cfg, char *why, size_t why_len);
static int slot_open(int i, const ar_run_config *cfg, void **state, char *err, size_t err_len);

#define TRAMPOLINES(i)                                                                             \
    static bool check_##i(const ar_run_config *c, char *w, size_t n) { return slot_check(i, c, w, n); } \
    static int open_##i(const ar_run_config *c, void **s, char *e, size_t n) { return slot_open(i, c, s, e, n); }
TRAMPOLINES(0) TRAMPOLINES(1) TRAMPOLINES(2) TRAMPOLINES(3) TRAMPOLINES(4) TRAMPOLINES(5)
TRAMPOLINES(6) TRAMPOLINES(7) TRAMPOLINES(8) TRAMPOLINES(9) TRAMPOLINES(10) TRAMPOLINES(11)
TRAMPOLINES(12) TRAMPOLINES(13) TRAMPOLINES(14) TRAMPOLINES(15)
#undef TRAMPOLINES

static bool (*const check_fns[AR_PLUGIN_SLOTS])(const ar_run_config *, char *, size_t) = {
    check_0, check_1, check_2, check_3, check_4, check_5, check_6, check_7,
    check_8, check_9, check_10, check_11, check_12, check_13, check_14, check_15};
static int (*const open_fns[AR_PLUGIN_SLOTS])(const ar_run_config *, void **, char *, size_t) = {
    open_0, open_1, open_2, open_3, open_4, open_5, open_6, open_7,
    open_8, open_9, open_10, open_11, open_12, open_13, open_14, open_15};

/* ---- the run (one per open) ------------------------------------------------------------- */

#define MAX_SEGMENTS (ATTNREPLAY_MAX_MARKS + 1)

struct plugin_run {
    plugin_slot *slot;
    void *ps;                        /* the plugin's state */
    ar_run_config cfg;
    attnreplay_config pc;
    char inject[48];
    bool cuda;
    ar_pdev *dev;
    DLDevice device;
    int hq, hkv, d, bs;
    int dout;                        /* out's head dim: d, or L for MLA */
    /* MLA (mla true): hkv 1, d = E = L + R; the host's projections around the plugin */
    bool mla;
    ar_mla_dims mdims;               /* N, L, R, P, V and the scale */
    float *q_nope, *q_pe;            /* [T, N, P], [T, N, R] this layer's, before absorption */
    float **w_uk, **w_uv;            /* CPU: [num_layers] -> [N, L, P] / [N, L, V], generated on first use */
    int keep_all_weights, weights_layer;
    ar_threadpool *pool;             /* CPU: the host's MLA generation and projections on --threads cores */
    ar_pdev_mla pm;                  /* CUDA: the projections' dims and faults */
    float *d_w_uk, *d_w_uv;          /* CUDA: [N, L, P] / [N, L, V] of layer d_w_layer */
    int d_w_layer;
    float *d_out_v;                  /* CUDA: [T, N, V] the output after W_UV, float values rounded to dtype */
    size_t cache_bytes;              /* one layer's cache */
    void **cache;                    /* [num_layers] host or device */
    /* step capacity and host arrays */
    int cap_reqs, cap_tokens;
    size_t cap_table;
    int32_t *qsl, *seq, *ctx, *table, *suffix, cu_prefix[2], prefix_kv[1];
    int64_t *slots;
    uint64_t *qkey, *kvkey;
    int32_t *pos;
    /* device twins (CUDA) */
    int32_t *d_qsl, *d_seq, *d_table, *d_suffix, *d_cu_prefix, *d_prefix_kv, *d_pos;
    int64_t *d_slots;
    uint64_t *d_qkey, *d_kvkey;
    /* fill lists on the device */
    int cap_fill;
    int64_t *d_fill_slots;
    uint64_t *d_fill_keys;
    int32_t *d_fill_offsets;
    /* per-step buffers (host or device): q, k_new, v_new, out (+ guard), lse (+ guard) */
    void *q, *k_new, *v_new, *out;
    float *lse;
    size_t out_bytes, lse_bytes;     /* without the guards */
    void *stage;                     /* CUDA: host staging for the output bits */
    int T, num_reqs, stride;
    int prepared;
    int64_t prepared_step;
    /* the ABI views */
    attnreplay_metadata md;
    ar_tensor t_qsl, t_seq, t_table, t_slots, t_cu_prefix, t_prefix_kv, t_suffix;
    ar_tensor c_qsl, c_seq, c_table, c_slots, c_ctx;
    ar_tensor t_q, t_k, t_v, t_cache, t_out, t_lse;
    attnreplay_forward_args fa;
    /* time marks of the forward in progress; ev0: its first timing event (CUDA) */
    int num_marks, ev0;
    char mark_names[ATTNREPLAY_MAX_MARKS][16];
    double mark_us[ATTNREPLAY_MAX_MARKS];
};

static void *host_cuda_stream(void)
{
    return active_run && active_run->cuda ? ar_pdev_stream(active_run->dev) : NULL;
}

static void host_time_mark(const char *name)
{
    plugin_run *r = active_run;
    if (!r || r->num_marks >= ATTNREPLAY_MAX_MARKS) return;
    int i = r->num_marks;
    if (r->cuda) {
        char err[128];
        if (ar_pdev_record(r->dev, r->ev0 + 2 + i, err, sizeof err) != 0) return;   /* 0 start, 1 write end */
    } else {
        r->mark_us[i] = now_us();
    }
    snprintf(r->mark_names[i], sizeof r->mark_names[i], "%s", name && *name ? name : "part");
    r->num_marks++;
}

/* ---- check --------------------------------------------------------------------------------- */

static const char *kernel_fault_name(ar_fault f, bool mla)
{
    /* Metadata faults are the host's to apply (to slot_mapping and block_table), and with MLA the
     * projection faults too (W_UK / W_UV are the host's); the plugin sees only the kernel faults it
     * must reproduce. */
    if (f == AR_FAULT_NONE || f == AR_FAULT_WRONG_SLOT || f == AR_FAULT_STALE_BLOCK_TABLE) return "none";
    if (mla && (f == AR_FAULT_WRONG_KV_HEAD || f == AR_FAULT_MLA_NO_WUV)) return "none";
    return ar_fault_name(f);
}

static void fill_config(const plugin_slot *s, const ar_run_config *cfg, attnreplay_config *pc,
                        int device_id)
{
    const ar_model *m = &cfg->model;
    const bool mla = m->attention == AR_ATTN_MLA;
    memset(pc, 0, sizeof *pc);
    pc->struct_size = (int32_t)sizeof *pc;
    pc->model_name = m->name;
    pc->num_q_heads = m->num_q_heads;
    pc->num_kv_heads = m->num_kv_heads;
    pc->head_size = m->head_size;
    pc->scale = (float)(m->scale > 0 ? m->scale : 1.0 / sqrt((double)(m->head_size > 0 ? m->head_size : 1)));
    if (mla) {
        ar_mla_dims d = ar_mla_model_dims(m);
        pc->attention = ATTNREPLAY_ATTENTION_MLA;
        pc->kv_lora_rank = d.kv_lora_rank;
        pc->qk_rope_head_dim = d.qk_rope_head_dim;
        pc->num_kv_heads = 1;
        pc->head_size = d.kv_lora_rank + d.qk_rope_head_dim;
        pc->scale = (float)d.scale;
    }
    pc->sliding_window = m->sliding_window;
    pc->logits_soft_cap = (float)m->logits_soft_cap;
    pc->block_size = cfg->block_size;
    pc->num_blocks = cfg->num_blocks;
    pc->num_layers = cfg->num_layers;
    pc->dtype = dl_dtype(cfg->dtype);
    pc->kv_dtype = dl_dtype(cfg->kv_dtype);
    pc->kv_scale = cfg->kv_dtype == AR_FP8_E4M3 ? (float)cfg->kv_scale : 1.0f;
    pc->cascade = (s->p->flags & ATTNREPLAY_PLUGIN_CASCADE) && !mla ? cfg->cascade_mode : 0;
    pc->inject = kernel_fault_name(cfg->fault, mla);
    pc->repeat = cfg->repeat < 1 ? 1 : cfg->repeat;
    pc->device.device_type = s->p->device_type == kDLCUDA ? kDLCUDA : kDLCPU;
    pc->device.device_id = device_id;
}

/* What the ABI itself cannot carry for plugin s, whatever the plugin says. */
static bool abi_covers(const plugin_slot *s, const ar_run_config *cfg, char *why, size_t why_len)
{
    const ar_model *m = &cfg->model;
    if (m->attention == AR_ATTN_MLA) {
        if (s->p->abi_version < 2 || !(s->p->flags & ATTNREPLAY_PLUGIN_MLA)) {
            snprintf(why, why_len, "MLA model: the plugin does not run MLA (no ATTNREPLAY_PLUGIN_MLA flag%s)",
                     s->p->abi_version < 2 ? "; plugin ABI v1 has none" : "");
            return false;
        }
        ar_mla_dims d = ar_mla_model_dims(m);
        if (m->num_q_heads <= 0 || m->num_kv_heads > 1) {
            snprintf(why, why_len, "MLA model with %d q heads and %d KV heads: need positive q heads and one "
                     "latent KV head", m->num_q_heads, m->num_kv_heads);
            return false;
        }
        if (m->head_size > 0 && m->head_size != d.kv_lora_rank + d.qk_rope_head_dim) {
            snprintf(why, why_len, "MLA head_size %d != kv_lora_rank %d + qk_rope_head_dim %d", m->head_size,
                     d.kv_lora_rank, d.qk_rope_head_dim);
            return false;
        }
        if (d.v_head_dim > d.kv_lora_rank || d.qk_nope_head_dim <= 0 || d.v_head_dim <= 0) {
            snprintf(why, why_len, "MLA dims: nope %d, v %d, kv_lora_rank %d: need positive nope and v, v <= "
                     "kv_lora_rank", d.qk_nope_head_dim, d.v_head_dim, d.kv_lora_rank);
            return false;
        }
        if (m->sliding_window != 0 || m->logits_soft_cap != 0) {
            snprintf(why, why_len, "MLA runs without sliding window and soft cap (as in vLLM)");
            return false;
        }
        return true;
    }
    if (m->num_q_heads <= 0 || m->num_kv_heads <= 0 || m->num_q_heads % m->num_kv_heads != 0 ||
        m->head_size <= 0) {
        snprintf(why, why_len, "head counts %d q / %d kv, head size %d: need positive counts, q a multiple of kv",
                 m->num_q_heads, m->num_kv_heads, m->head_size);
        return false;
    }
    if (m->v_head_dim != 0 && m->v_head_dim != m->head_size) {
        snprintf(why, why_len, "v_head_dim %d differs from head_size %d", m->v_head_dim, m->head_size);
        return false;
    }
    return true;
}

static bool slot_check(int i, const ar_run_config *cfg, char *why, size_t why_len)
{
    plugin_slot *s = &slots[i];
    if (!abi_covers(s, cfg, why, why_len)) return false;
    if (s->p->device_type == kDLCUDA && ar_pdev_probe(why, why_len) != 0) return false;
    attnreplay_config pc;
    fill_config(s, cfg, &pc, 0);
    call_error[0] = '\0';
    const bool bracketed = ar_call_begin_plugin(AR_CALL_CHECK, s->source);
    const int rc = s->p->check(&pc);
    if (bracketed) ar_call_end();
    if (rc != 0) {
        snprintf(why, why_len, "the plugin refuses this config: %s", take_error());
        return false;
    }
    return true;
}

/* ---- open / close ---------------------------------------------------------------------- */

static void run_free_buffers(plugin_run *r)
{
    if (r->cuda) {
        void *dev_ptrs[] = {r->d_qsl, r->d_seq, r->d_table, r->d_suffix, r->d_cu_prefix, r->d_prefix_kv,
                            r->d_pos, r->d_slots, r->d_qkey, r->d_kvkey, r->d_fill_slots, r->d_fill_keys,
                            r->d_fill_offsets, r->q, r->k_new, r->v_new, r->out, r->lse, r->d_w_uk, r->d_w_uv,
                            r->d_out_v};
        for (size_t i = 0; i < sizeof dev_ptrs / sizeof dev_ptrs[0]; i++)
            if (dev_ptrs[i]) ar_pdev_free(r->dev, dev_ptrs[i]);
    } else {
        free(r->q); free(r->k_new); free(r->v_new); free(r->out); free(r->lse);
    }
    free(r->qsl); free(r->seq); free(r->ctx); free(r->table); free(r->suffix); free(r->slots);
    free(r->qkey); free(r->kvkey); free(r->pos); free(r->stage); free(r->q_nope); free(r->q_pe);
}

/* MLA: the weights of one layer, [N, L, P] and [N, L, V]. */
static void free_layer_weights(plugin_run *r, int layer)
{
    free(r->w_uk[layer]);
    free(r->w_uv[layer]);
    r->w_uk[layer] = r->w_uv[layer] = NULL;
}

/* fn(ctx, item, worker) for items 0..n-1: on the run's pool when it has one, else in turn. */
static void host_tasks(plugin_run *r, int n, ar_task_fn fn, void *ctx)
{
    if (r->pool) {
        ar_threadpool_run(r->pool, n, fn, ctx);
        return;
    }
    for (int i = 0; i < n; i++) fn(ctx, i, 0);
}

typedef struct weights_ctx {
    plugin_run *r;
    int layer;
} weights_ctx;

/* One query head's rows of W_UK [L, P] and W_UV [L, V]. */
static void weights_task(void *ctx, int n, int worker)
{
    (void)worker;
    const weights_ctx *wc = ctx;
    plugin_run *r = wc->r;
    const int layer = wc->layer, L = r->mdims.kv_lora_rank, P = r->mdims.qk_nope_head_dim, V = r->mdims.v_head_dim;
    for (int l = 0; l < L; l++) {
        float *uk = r->w_uk[layer] + ((size_t)n * L + l) * P, *uv = r->w_uv[layer] + ((size_t)n * L + l) * V;
        for (int c = 0; c < P; c++)
            uk[c] = ar_mla_weight(r->cfg.seed, AR_STREAM_W_UK, (uint32_t)layer, L, l, n, c, r->cfg.data, r->cfg.dtype);
        for (int c = 0; c < V; c++)
            uv[c] = ar_mla_weight(r->cfg.seed, AR_STREAM_W_UV, (uint32_t)layer, L, l, n, c, r->cfg.data, r->cfg.dtype);
    }
}

#define MLA_WEIGHT_BUDGET ((size_t)1 << 30)   /* bytes of weights kept across layers, as cpu-mla */

/* MLA: layer's W_UK and W_UV (ar_mla_weight), generated on first use; all layers are kept when
 * they fit in MLA_WEIGHT_BUDGET, otherwise only the layer in use.  0 ok, -1 out of memory. */
static int layer_weights(plugin_run *r, int layer)
{
    if (r->w_uk[layer]) return 0;
    if (!r->keep_all_weights && r->weights_layer >= 0) free_layer_weights(r, r->weights_layer);
    const ar_mla_dims *d = &r->mdims;
    const int N = d->num_heads, L = d->kv_lora_rank, P = d->qk_nope_head_dim, V = d->v_head_dim;
    r->w_uk[layer] = malloc(sizeof(float) * (size_t)N * L * P);
    r->w_uv[layer] = malloc(sizeof(float) * (size_t)N * L * V);
    if (!r->w_uk[layer] || !r->w_uv[layer]) {
        free_layer_weights(r, layer);
        return -1;
    }
    weights_ctx wc = {r, layer};
    host_tasks(r, N, weights_task, &wc);
    r->weights_layer = layer;
    return 0;
}

/* What the device generator, cache write and fill need for layer. */
static ar_pdev_gen pdev_gen(const plugin_run *r, int layer)
{
    ar_pdev_gen g = {r->cfg.seed, (uint32_t)layer, r->cfg.data, r->cfg.dtype, r->cfg.kv_dtype, (float)r->cfg.kv_scale,
                     r->hq, r->hkv, r->d, r->bs, r->cfg.num_blocks, r->mla};
    return g;
}

static void plugin_close(void *state)
{
    plugin_run *r = state;
    if (!r) return;
    if (r->ps) {
        const bool bracketed = ar_call_begin_plugin(AR_CALL_CLOSE, r->slot->source);
        r->slot->p->close(r->ps);
        if (bracketed) ar_call_end();
    }
    if (r->cache) {
        for (int l = 0; l < r->cfg.num_layers; l++) {
            if (!r->cache[l]) continue;
            if (r->cuda) ar_pdev_free(r->dev, r->cache[l]);
            else free(r->cache[l]);
        }
        free(r->cache);
    }
    run_free_buffers(r);
    if (r->w_uk)
        for (int l = 0; l < r->cfg.num_layers; l++) free_layer_weights(r, l);
    free(r->w_uk);
    free(r->w_uv);
    if (r->pool) ar_threadpool_destroy(r->pool);
    if (r->dev) ar_pdev_close(r->dev);
    if (active_run == r) active_run = NULL;
    free(r);
}

static int slot_open(int i, const ar_run_config *cfg, void **state, char *err, size_t err_len)
{
    plugin_slot *s = &slots[i];
    *state = NULL;
    char why[256];
    if (!slot_check(i, cfg, why, sizeof why)) {
        snprintf(err, err_len, "%s", why);
        return 2;
    }
    plugin_run *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, err_len, "out of memory");
        return 3;
    }
    r->slot = s;
    r->cfg = *cfg;
    r->cuda = s->p->device_type == kDLCUDA;
    r->hq = cfg->model.num_q_heads;
    r->hkv = cfg->model.num_kv_heads;
    r->d = r->dout = cfg->model.head_size;
    r->bs = cfg->block_size;
    r->mla = cfg->model.attention == AR_ATTN_MLA;
    r->weights_layer = -1;
    if (r->mla) {
        r->mdims = ar_mla_model_dims(&cfg->model);
        r->hkv = 1;
        r->d = r->mdims.kv_lora_rank + r->mdims.qk_rope_head_dim;
        r->dout = r->mdims.kv_lora_rank;
        size_t per_layer = sizeof(float) * (size_t)r->hq * r->mdims.kv_lora_rank *
                           (size_t)(r->mdims.qk_nope_head_dim + r->mdims.v_head_dim);
        r->keep_all_weights = per_layer * (size_t)cfg->num_layers <= MLA_WEIGHT_BUDGET;
        r->w_uk = calloc((size_t)cfg->num_layers, sizeof *r->w_uk);
        r->w_uv = calloc((size_t)cfg->num_layers, sizeof *r->w_uv);
        if (!r->w_uk || !r->w_uv) {
            snprintf(err, err_len, "out of memory");
            plugin_close(r);
            return 3;
        }
        r->pm = (ar_pdev_mla){r->mdims.kv_lora_rank, r->mdims.qk_rope_head_dim, r->mdims.qk_nope_head_dim,
                              r->mdims.v_head_dim, cfg->fault == AR_FAULT_WRONG_KV_HEAD,
                              cfg->fault == AR_FAULT_MLA_NO_WUV};
        r->d_w_layer = -1;
        /* a CPU plugin's host projections on the run's cores; without threads they run in turn */
        if (!r->cuda) r->pool = ar_threadpool_create(cfg->threads);
    }
    if (r->cuda && ar_pdev_open(&r->dev, cfg->device_index, err, err_len) != 0) {
        plugin_close(r);
        return 3;
    }
    if (r->cuda && r->mla) {
        const size_t rows = (size_t)r->hq * (size_t)r->mdims.kv_lora_rank;
        if (ar_pdev_alloc(r->dev, (void **)&r->d_w_uk, sizeof(float) * rows * r->mdims.qk_nope_head_dim, err, err_len) ||
            ar_pdev_alloc(r->dev, (void **)&r->d_w_uv, sizeof(float) * rows * r->mdims.v_head_dim, err, err_len)) {
            plugin_close(r);
            return 3;
        }
    }
    r->device.device_type = r->cuda ? kDLCUDA : kDLCPU;
    r->device.device_id = r->cuda ? ar_pdev_device_id(r->dev) : 0;
    fill_config(s, cfg, &r->pc, r->device.device_id);
    snprintf(r->inject, sizeof r->inject, "%s", r->pc.inject);
    r->pc.inject = r->inject;

    /* The caches, NaN everywhere (0xff bytes) until written; MLA has one side, the entries. */
    r->cache_bytes = (size_t)(r->mla ? 1 : 2) * (size_t)cfg->num_blocks * (size_t)r->bs * (size_t)r->hkv *
                     (size_t)r->d * (size_t)ar_dtype_size(cfg->kv_dtype);
    r->cache = calloc((size_t)cfg->num_layers, sizeof *r->cache);
    if (!r->cache) {
        snprintf(err, err_len, "out of memory");
        plugin_close(r);
        return 3;
    }
    for (int l = 0; l < cfg->num_layers; l++) {
        if (r->cuda) {
            if (ar_pdev_alloc(r->dev, &r->cache[l], r->cache_bytes, err, err_len) != 0 ||
                ar_pdev_memset(r->dev, r->cache[l], 0xff, r->cache_bytes, err, err_len) != 0) {
                plugin_close(r);
                return 3;
            }
        } else {
            r->cache[l] = malloc(r->cache_bytes);
            if (!r->cache[l]) {
                snprintf(err, err_len, "cannot allocate the KV cache of layer %d (%zu bytes)", l, r->cache_bytes);
                plugin_close(r);
                return 3;
            }
            memset(r->cache[l], 0xff, r->cache_bytes);
        }
    }
    int64_t cache_shape[5] = {2, cfg->num_blocks, r->bs, r->hkv, r->d};
    if (r->mla) {
        int64_t mla_shape[3] = {cfg->num_blocks, r->bs, r->d};
        tensor_set(&r->t_cache, NULL, r->device, dl_dtype(cfg->kv_dtype), 3, mla_shape);
    } else {
        tensor_set(&r->t_cache, NULL, r->device, dl_dtype(cfg->kv_dtype), 5, cache_shape);
    }

    call_error[0] = '\0';
    active_run = r;
    int rc = s->p->open(&r->pc, &r->ps);
    active_run = NULL;
    if (rc != 0) {
        snprintf(err, err_len, "the plugin refused to open this config: %s", take_error());
        r->ps = NULL;
        plugin_close(r);
        return 2;
    }
    *state = r;
    return 0;
}

static void plugin_device_name(void *state, char *buf, size_t len)
{
    plugin_run *r = state;
    if (r && r->cuda) ar_pdev_device_name(r->dev, buf, len);
    else snprintf(buf, len, "cpu (plugin)");
}

/* ---- prepare ----------------------------------------------------------------------------- */

static int grow_bytes(void **p, size_t bytes)
{
    void *q = realloc(*p, bytes ? bytes : 1);
    if (!q) return -1;
    *p = q;
    return 0;
}

/* Host and device arrays for num_reqs requests, T tokens, num_reqs x stride table entries. */
static int ensure_step(plugin_run *r, int num_reqs, int T, int stride, char *err, size_t err_len)
{
    const plugin_slot *s = r->slot;
    if (num_reqs + 1 > r->cap_reqs) {
        int n = num_reqs + 1 > 2 * r->cap_reqs ? num_reqs + 1 : 2 * r->cap_reqs;
        size_t b32 = sizeof(int32_t) * (size_t)n;
        if (grow_bytes((void **)&r->qsl, b32) || grow_bytes((void **)&r->seq, b32) ||
            grow_bytes((void **)&r->ctx, b32) || grow_bytes((void **)&r->suffix, b32))
            goto oom;
        if (r->cuda) {
            ar_pdev_free(r->dev, r->d_qsl);
            ar_pdev_free(r->dev, r->d_seq);
            ar_pdev_free(r->dev, r->d_suffix);
            r->d_qsl = r->d_seq = r->d_suffix = NULL;
            if (ar_pdev_alloc(r->dev, (void **)&r->d_qsl, b32, err, err_len) ||
                ar_pdev_alloc(r->dev, (void **)&r->d_seq, b32, err, err_len) ||
                ar_pdev_alloc(r->dev, (void **)&r->d_suffix, b32, err, err_len))
                return 3;
            if (!r->d_cu_prefix &&
                (ar_pdev_alloc(r->dev, (void **)&r->d_cu_prefix, 2 * sizeof(int32_t), err, err_len) ||
                 ar_pdev_alloc(r->dev, (void **)&r->d_prefix_kv, sizeof(int32_t), err, err_len)))
                return 3;
        }
        r->cap_reqs = n;
    }
    size_t tneed = (size_t)num_reqs * (size_t)stride;
    if (tneed > r->cap_table) {
        size_t n = tneed > 2 * r->cap_table ? tneed : 2 * r->cap_table;
        if (grow_bytes((void **)&r->table, sizeof(int32_t) * n)) goto oom;
        if (r->cuda) {
            ar_pdev_free(r->dev, r->d_table);
            r->d_table = NULL;
            if (ar_pdev_alloc(r->dev, (void **)&r->d_table, sizeof(int32_t) * n, err, err_len)) return 3;
        }
        r->cap_table = n;
    }
    if (T > r->cap_tokens) {
        int n = T > 2 * r->cap_tokens ? T : 2 * r->cap_tokens;
        size_t nt = (size_t)n;
        size_t esize = (size_t)ar_dtype_size(r->cfg.dtype);
        size_t q_bytes = nt * (size_t)r->hq * (size_t)r->d * esize;
        size_t kv_bytes = nt * (size_t)r->hkv * (size_t)r->d * esize;
        size_t out_bytes = nt * (size_t)r->hq * (size_t)r->dout * esize;
        size_t guard = sizeof(uint32_t) * AR_GUARD_WORDS + 16;
        size_t lse_bytes = sizeof(float) * nt * (size_t)r->hq;
        if (grow_bytes((void **)&r->slots, sizeof(int64_t) * nt) ||
            grow_bytes((void **)&r->qkey, sizeof(uint64_t) * nt) ||
            grow_bytes((void **)&r->kvkey, sizeof(uint64_t) * nt) ||
            grow_bytes((void **)&r->pos, sizeof(int32_t) * nt))
            goto oom;
        if (r->mla && (grow_bytes((void **)&r->q_nope, sizeof(float) * nt * r->hq * r->mdims.qk_nope_head_dim) ||
                       grow_bytes((void **)&r->q_pe, sizeof(float) * nt * r->hq * r->mdims.qk_rope_head_dim)))
            goto oom;
        if (r->cuda) {
            /* MLA: the output after W_UV, [T, N, V] floats (the host's, not the plugin's) */
            size_t out_v_bytes = r->mla ? sizeof(float) * nt * (size_t)r->hq * (size_t)r->mdims.v_head_dim : 0;
            void **bufs[] = {(void **)&r->d_slots, (void **)&r->d_qkey, (void **)&r->d_kvkey, (void **)&r->d_pos,
                             &r->q, &r->k_new, &r->v_new, &r->out, (void **)&r->lse, (void **)&r->d_out_v};
            size_t sizes[] = {sizeof(int64_t) * nt, sizeof(uint64_t) * nt, sizeof(uint64_t) * nt,
                              sizeof(int32_t) * nt, q_bytes, kv_bytes, kv_bytes, out_bytes + guard,
                              lse_bytes + guard, out_v_bytes};
            for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
                ar_pdev_free(r->dev, *bufs[i]);
                *bufs[i] = NULL;
                if (ar_pdev_alloc(r->dev, bufs[i], sizes[i], err, err_len)) return 3;
            }
            if (grow_bytes(&r->stage, out_bytes > lse_bytes ? out_bytes : lse_bytes)) goto oom;
        } else {
            if (grow_bytes(&r->q, q_bytes) || grow_bytes(&r->k_new, kv_bytes) || grow_bytes(&r->v_new, kv_bytes) ||
                grow_bytes(&r->out, out_bytes + guard) || grow_bytes((void **)&r->lse, lse_bytes + guard))
                goto oom;
        }
        r->cap_tokens = n;
    }
    return 0;
oom:
    snprintf(err, err_len, "%s: out of memory for a step of %d requests, %d tokens", s->name, num_reqs, T);
    return 3;
}

static int plugin_prepare(void *state, const ar_batch *b, char *err, size_t err_len)
{
    plugin_run *r = state;
    const plugin_slot *s = r->slot;
    r->prepared = 0;
    const int n = b->num_reqs, T = b->num_tokens, stride = b->max_blocks_per_req > 0 ? b->max_blocks_per_req : 1;
    int rc = ensure_step(r, n, T, stride, err, err_len);
    if (rc) return rc;
    const int P = b->common_prefix_len;
    for (int i = 0; i <= n; i++) r->qsl[i] = b->query_start_loc[i];
    for (int i = 0; i < n; i++) {
        r->seq[i] = b->seq_lens[i];
        r->ctx[i] = b->context_lens[i];
        r->suffix[i] = b->seq_lens[i] - P;
    }
    for (size_t i = 0; i < (size_t)n * stride; i++) r->table[i] = b->block_table[i];
    for (int t = 0; t < T; t++) r->slots[t] = b->slot_mapping[t];
    r->cu_prefix[0] = 0;
    r->cu_prefix[1] = T;
    r->prefix_kv[0] = P;
    /* The generator's keys per token (from the true content keys, whatever a fault did to the
     * block table). */
    for (int q = 0; q < n; q++) {
        for (int t = b->query_start_loc[q]; t < b->query_start_loc[q + 1]; t++) {
            int p = b->context_lens[q] + (t - b->query_start_loc[q]);
            r->pos[t] = p;
            r->qkey[t] = b->req_keys[q];
            r->kvkey[t] = b->block_keys[(size_t)q * b->max_blocks_per_req + p / r->bs];
        }
    }
    if (r->cuda) {
        struct { void *dst; const void *src; size_t bytes; } up[] = {
            {r->d_qsl, r->qsl, sizeof(int32_t) * (size_t)(n + 1)},
            {r->d_seq, r->seq, sizeof(int32_t) * (size_t)n},
            {r->d_suffix, r->suffix, sizeof(int32_t) * (size_t)n},
            {r->d_table, r->table, sizeof(int32_t) * (size_t)n * stride},
            {r->d_slots, r->slots, sizeof(int64_t) * (size_t)T},
            {r->d_pos, r->pos, sizeof(int32_t) * (size_t)T},
            {r->d_qkey, r->qkey, sizeof(uint64_t) * (size_t)T},
            {r->d_kvkey, r->kvkey, sizeof(uint64_t) * (size_t)T},
            {r->d_cu_prefix, r->cu_prefix, sizeof r->cu_prefix},
            {r->d_prefix_kv, r->prefix_kv, sizeof r->prefix_kv}};
        for (size_t i = 0; i < sizeof up / sizeof up[0]; i++)
            if (up[i].bytes && ar_pdev_upload(r->dev, up[i].dst, up[i].src, up[i].bytes, err, err_len)) return 3;
    }
    DLDevice cpu = {kDLCPU, 0};
    DLDataType i32 = {kDLInt, 32, 1}, i64 = {kDLInt, 64, 1};
    int64_t s_n1[1] = {n + 1}, s_n[1] = {n}, s_tab[2] = {n, stride}, s_t[1] = {T}, s_2[1] = {2}, s_1[1] = {1};
    tensor_set(&r->c_qsl, r->qsl, cpu, i32, 1, s_n1);
    tensor_set(&r->c_seq, r->seq, cpu, i32, 1, s_n);
    tensor_set(&r->c_ctx, r->ctx, cpu, i32, 1, s_n);
    tensor_set(&r->c_table, r->table, cpu, i32, 2, s_tab);
    tensor_set(&r->c_slots, r->slots, cpu, i64, 1, s_t);
    tensor_set(&r->t_qsl, r->cuda ? (void *)r->d_qsl : r->qsl, r->device, i32, 1, s_n1);
    tensor_set(&r->t_seq, r->cuda ? (void *)r->d_seq : r->seq, r->device, i32, 1, s_n);
    tensor_set(&r->t_table, r->cuda ? (void *)r->d_table : r->table, r->device, i32, 2, s_tab);
    tensor_set(&r->t_slots, r->cuda ? (void *)r->d_slots : r->slots, r->device, i64, 1, s_t);
    const bool cascade = P > 0;
    void *cu_prefix = r->cuda ? (void *)r->d_cu_prefix : r->cu_prefix;
    void *prefix_kv = r->cuda ? (void *)r->d_prefix_kv : r->prefix_kv;
    tensor_set(&r->t_cu_prefix, cascade ? cu_prefix : NULL, r->device, i32, 1, s_2);
    tensor_set(&r->t_prefix_kv, cascade ? prefix_kv : NULL, r->device, i32, 1, s_1);
    tensor_set(&r->t_suffix, cascade ? (r->cuda ? (void *)r->d_suffix : r->suffix) : NULL, r->device, i32, 1, s_n);

    attnreplay_metadata *md = &r->md;
    memset(md, 0, sizeof *md);
    md->struct_size = (int32_t)sizeof *md;
    md->step = b->step;
    md->num_reqs = n;
    md->num_actual_tokens = T;
    md->max_query_len = b->max_query_len;
    md->max_seq_len = b->max_seq_len;
    md->query_start_loc = r->t_qsl.t;
    md->seq_lens = r->t_seq.t;
    md->block_table = r->t_table.t;
    md->slot_mapping = r->t_slots.t;
    md->use_cascade = cascade;
    md->common_prefix_len = P;
    md->cu_prefix_query_lens = r->t_cu_prefix.t;
    md->prefix_kv_lens = r->t_prefix_kv.t;
    md->suffix_kv_lens = r->t_suffix.t;
    md->query_start_loc_cpu = r->c_qsl.t;
    md->seq_lens_cpu = r->c_seq.t;
    md->block_table_cpu = r->c_table.t;
    md->slot_mapping_cpu = r->c_slots.t;
    md->context_lens_cpu = r->c_ctx.t;

    /* The per-layer views that do not change between layers. */
    int64_t s_q[3] = {T, r->hq, r->d}, s_kv[3] = {T, r->hkv, r->d}, s_lse[2] = {r->hq, T};
    int64_t s_out[3] = {T, r->hq, r->dout};
    DLDataType dt = dl_dtype(r->cfg.dtype), f32 = {kDLFloat, 32, 1};
    tensor_set(&r->t_q, r->q, r->device, dt, 3, s_q);
    tensor_set(&r->t_k, r->k_new, r->device, dt, 3, s_kv);
    tensor_set(&r->t_v, r->mla ? NULL : r->v_new, r->device, dt, 3, s_kv);   /* MLA: absent */
    tensor_set(&r->t_out, r->out, r->device, dt, 3, s_out);
    tensor_set(&r->t_lse, r->lse, r->device, f32, 2, s_lse);
    r->out_bytes = (size_t)T * r->hq * r->dout * (size_t)ar_dtype_size(r->cfg.dtype);
    r->lse_bytes = sizeof(float) * (size_t)T * r->hq;
    r->T = T;
    r->num_reqs = n;
    r->stride = stride;

    call_error[0] = '\0';
    active_run = r;
    rc = s->p->plan(r->ps, md);
    active_run = NULL;
    if (rc != 0) {
        snprintf(err, err_len, "%s: plan failed at step %lld: %s", s->name, (long long)b->step, take_error());
        return 3;
    }
    r->prepared = 1;
    r->prepared_step = b->step;
    return 0;
}

/* ---- the host's K/V generation and cache writes (CPU path) ------------------------------ */

/* One generated row (D values) stored as dtype bits at element first of dst. */
static void gen_row(const plugin_run *r, uint32_t stream, uint32_t layer, uint64_t key, uint64_t pos,
                    uint32_t head, void *dst, int64_t first)
{
    uint64_t row = ar_gen_row(r->cfg.seed, stream, layer, key, pos, head);
    for (int d = 0; d < r->d; d++)
        ar_store(r->cfg.dtype, dst, first + d, ar_gen(row, (uint32_t)d, r->cfg.data, r->cfg.dtype));
}

/* value x (a dtype value) into the cache at element i of the given side. */
static void cache_store(const plugin_run *r, void *cache, int64_t i, float x)
{
    if (r->cfg.kv_dtype == r->cfg.dtype) ar_store(r->cfg.kv_dtype, cache, i, x);
    else ar_store(r->cfg.kv_dtype, cache, i, x / (float)r->cfg.kv_scale);
}

static void host_write_kv(plugin_run *r, int layer)
{
    const int64_t side = (int64_t)r->cfg.num_blocks * r->bs * r->hkv * r->d;
    const int64_t row = (int64_t)r->hkv * r->d;
    void *cache = r->cache[layer];
    for (int t = 0; t < r->T; t++) {
        int64_t slot = r->slots[t];
        if (slot < 0) continue;
        if (r->mla) {   /* concat_and_cache_mla: the entry, one side */
            for (int64_t e = 0; e < row; e++)
                cache_store(r, cache, slot * row + e, ar_load(r->cfg.dtype, r->k_new, (int64_t)t * row + e));
            continue;
        }
        for (int64_t e = 0; e < row; e++) {
            cache_store(r, cache, slot * row + e, ar_load(r->cfg.dtype, r->k_new, (int64_t)t * row + e));
            cache_store(r, cache, side + slot * row + e, ar_load(r->cfg.dtype, r->v_new, (int64_t)t * row + e));
        }
    }
}

static int plugin_fill(void *state, int layer, const ar_fill *f, char *err, size_t err_len)
{
    plugin_run *r = state;
    const plugin_slot *s = r->slot;
    if (layer < 0 || layer >= r->cfg.num_layers) {
        snprintf(err, err_len, "%s: fill of layer %d of %d", s->name, layer, r->cfg.num_layers);
        return 3;
    }
    const int64_t nslots = (int64_t)r->cfg.num_blocks * r->bs;
    for (int i = 0; i < f->count; i++) {
        if (f->slots[i] < 0 || f->slots[i] >= nslots) {
            snprintf(err, err_len, "%s: fill slot %lld outside the cache (%lld slots)", s->name,
                     (long long)f->slots[i], (long long)nslots);
            return 3;
        }
    }
    if (f->count == 0) return 0;
    if (r->cuda) {
        if (f->count > r->cap_fill) {
            ar_pdev_free(r->dev, r->d_fill_slots);
            ar_pdev_free(r->dev, r->d_fill_keys);
            ar_pdev_free(r->dev, r->d_fill_offsets);
            r->d_fill_slots = NULL;
            r->d_fill_keys = NULL;
            r->d_fill_offsets = NULL;
            r->cap_fill = 0;
            size_t c = (size_t)f->count;
            if (ar_pdev_alloc(r->dev, (void **)&r->d_fill_slots, sizeof(int64_t) * c, err, err_len) ||
                ar_pdev_alloc(r->dev, (void **)&r->d_fill_keys, sizeof(uint64_t) * c, err, err_len) ||
                ar_pdev_alloc(r->dev, (void **)&r->d_fill_offsets, sizeof(int32_t) * c, err, err_len))
                return 3;
            r->cap_fill = f->count;
        }
        int32_t *offs = malloc(sizeof(int32_t) * (size_t)f->count);
        if (!offs) {
            snprintf(err, err_len, "%s: out of memory", s->name);
            return 3;
        }
        for (int i = 0; i < f->count; i++) offs[i] = f->offsets[i];
        ar_pdev_gen g = pdev_gen(r, layer);
        int rc = ar_pdev_upload(r->dev, r->d_fill_slots, f->slots, sizeof(int64_t) * (size_t)f->count, err, err_len) ||
                 ar_pdev_upload(r->dev, r->d_fill_keys, f->keys, sizeof(uint64_t) * (size_t)f->count, err, err_len) ||
                 ar_pdev_upload(r->dev, r->d_fill_offsets, offs, sizeof(int32_t) * (size_t)f->count, err, err_len) ||
                 ar_pdev_fill(r->dev, &g, f->count, r->d_fill_slots, r->d_fill_keys, r->d_fill_offsets,
                              r->cache[layer], err, err_len);
        free(offs);
        return rc ? 3 : 0;
    }
    const int64_t side = (int64_t)r->cfg.num_blocks * r->bs * r->hkv * r->d;
    float *row = malloc(sizeof(float) * (size_t)r->d);
    if (!row) {
        snprintf(err, err_len, "%s: out of memory", s->name);
        return 3;
    }
    for (int i = 0; r->mla && i < f->count; i++) {   /* MLA: the latent entry (head 0) */
        uint64_t g = ar_gen_row(r->cfg.seed, AR_STREAM_LATENT, (uint32_t)layer, f->keys[i], (uint64_t)f->offsets[i], 0);
        for (int d = 0; d < r->d; d++) cache_store(r, r->cache[layer], f->slots[i] * r->d + d,
                                                   ar_gen(g, (uint32_t)d, r->cfg.data, r->cfg.dtype));
    }
    for (int i = 0; !r->mla && i < f->count; i++) {
        for (int h = 0; h < r->hkv; h++) {
            for (int sd = 0; sd < 2; sd++) {
                uint64_t g = ar_gen_row(r->cfg.seed, sd == 0 ? AR_STREAM_K : AR_STREAM_V, (uint32_t)layer,
                                        f->keys[i], (uint64_t)f->offsets[i], (uint32_t)h);
                for (int d = 0; d < r->d; d++) row[d] = ar_gen(g, (uint32_t)d, r->cfg.data, r->cfg.dtype);
                int64_t first = (sd ? side : 0) + (f->slots[i] * r->hkv + h) * r->d;
                for (int d = 0; d < r->d; d++) cache_store(r, r->cache[layer], first + d, row[d]);
            }
        }
    }
    free(row);
    return 0;
}

/* ---- forward ------------------------------------------------------------------------------- */

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

/* Query head n's weights (the wrong-kv-head fault takes head n + 1's, as cpu-mla does). */
static int mla_weight_head(const plugin_run *r, int n)
{
    return r->cfg.fault == AR_FAULT_WRONG_KV_HEAD ? (n + 1) % r->hq : n;
}

typedef struct mla_host_ctx {
    plugin_run *r;
    int layer;
    float *out;                      /* vproj: [T, N, V] */
} mla_host_ctx;

/* MLA, untimed, token t: q_nope, q_pe and the new entry of this layer (the cpu-mla backend's
 * streams), then the plugin's query [q_nope W_UK (rounded to dtype) | q_pe]. */
static void gen_mla_token_task(void *ctx, int t, int worker)
{
    (void)worker;
    const mla_host_ctx *mc = ctx;
    plugin_run *r = mc->r;
    const int layer = mc->layer;
    const ar_mla_dims *md = &r->mdims;
    const int N = r->hq, L = md->kv_lora_rank, R = md->qk_rope_head_dim, P = md->qk_nope_head_dim, E = r->d;
    const float *w_uk = r->w_uk[layer];
    for (int n = 0; n < N; n++) {
        uint64_t rn = ar_gen_row(r->cfg.seed, AR_STREAM_Q_NOPE, (uint32_t)layer, r->qkey[t], (uint64_t)r->pos[t],
                                 (uint32_t)n);
        uint64_t rp = ar_gen_row(r->cfg.seed, AR_STREAM_Q_PE, (uint32_t)layer, r->qkey[t], (uint64_t)r->pos[t],
                                 (uint32_t)n);
        float *qn = r->q_nope + ((size_t)t * N + n) * P, *qp = r->q_pe + ((size_t)t * N + n) * R;
        for (int d = 0; d < P; d++) qn[d] = ar_gen(rn, (uint32_t)d, r->cfg.data, r->cfg.dtype);
        for (int d = 0; d < R; d++) qp[d] = ar_gen(rp, (uint32_t)d, r->cfg.data, r->cfg.dtype);
        const float *w = w_uk + (size_t)mla_weight_head(r, n) * L * P;
        const int64_t first = ((int64_t)t * N + n) * E;
        for (int l = 0; l < L; l++) {
            double acc = 0;
            for (int c = 0; c < P; c++) acc += (double)qn[c] * w[(size_t)l * P + c];
            ar_store(r->cfg.dtype, r->q, first + l, ar_round_to(r->cfg.dtype, (float)acc));
        }
        for (int d = 0; d < R; d++) ar_store(r->cfg.dtype, r->q, first + L + d, qp[d]);
    }
    gen_row(r, AR_STREAM_LATENT, (uint32_t)layer, r->kvkey[t], (uint64_t)(r->pos[t] % r->bs), 0, r->k_new,
            (int64_t)t * E);
}

/* MLA, untimed, token t: out[t, n] = the plugin's latent output . W_UV_n, rounded to dtype;
 * with mla-no-wuv the first V latent values instead. */
static void vproj_mla_token_task(void *ctx, int t, int worker)
{
    (void)worker;
    const mla_host_ctx *mc = ctx;
    const plugin_run *r = mc->r;
    const ar_mla_dims *md = &r->mdims;
    const int N = r->hq, L = md->kv_lora_rank, V = md->v_head_dim;
    const float *w_uv = r->w_uv[mc->layer];
    double acc[1024];
    for (int n = 0; n < N; n++) {
        const int64_t lat = ((int64_t)t * N + n) * L;
        float *o = mc->out + ((size_t)t * N + n) * V;
        if (r->cfg.fault == AR_FAULT_MLA_NO_WUV) {
            for (int v = 0; v < V; v++) o[v] = ar_load(r->cfg.dtype, r->out, lat + v);
            continue;
        }
        const float *w = w_uv + (size_t)mla_weight_head(r, n) * L * V;
        for (int v0 = 0; v0 < V; v0 += 1024) {
            const int nv = V - v0 < 1024 ? V - v0 : 1024;
            for (int v = 0; v < nv; v++) acc[v] = 0;
            for (int l = 0; l < L; l++) {
                const double x = ar_load(r->cfg.dtype, r->out, lat + l);
                const float *wl = w + (size_t)l * V + v0;
                for (int v = 0; v < nv; v++) acc[v] += x * wl[v];
            }
            for (int v = 0; v < nv; v++) o[v0 + v] = ar_round_to(r->cfg.dtype, (float)acc[v]);
        }
    }
}

/* MLA, untimed: every token's inputs (gen_mla_token_task), a token per task. */
static void gen_inputs_mla_cpu(plugin_run *r, int layer)
{
    mla_host_ctx mc = {r, layer, NULL};
    host_tasks(r, r->T, gen_mla_token_task, &mc);
}

/* MLA, untimed: out [T, N, V] from the plugin's latent output (vproj_mla_token_task). */
static void vproj_mla_cpu(plugin_run *r, int layer, float *out)
{
    mla_host_ctx mc = {r, layer, out};
    host_tasks(r, r->T, vproj_mla_token_task, &mc);
}

static void gen_inputs_cpu(plugin_run *r, int layer)
{
    if (r->mla) {
        gen_inputs_mla_cpu(r, layer);
        return;
    }
    for (int t = 0; t < r->T; t++) {
        for (int h = 0; h < r->hq; h++)
            gen_row(r, AR_STREAM_Q, (uint32_t)layer, r->qkey[t], (uint64_t)r->pos[t], (uint32_t)h, r->q,
                    ((int64_t)t * r->hq + h) * r->d);
        for (int h = 0; h < r->hkv; h++) {
            uint64_t off = (uint64_t)(r->pos[t] % r->bs);
            gen_row(r, AR_STREAM_K, (uint32_t)layer, r->kvkey[t], off, (uint32_t)h, r->k_new,
                    ((int64_t)t * r->hkv + h) * r->d);
            gen_row(r, AR_STREAM_V, (uint32_t)layer, r->kvkey[t], off, (uint32_t)h, r->v_new,
                    ((int64_t)t * r->hkv + h) * r->d);
        }
    }
}

/* Where a buffer's guard words start: after its bytes, 16-byte aligned. */
static size_t guard_at(size_t bytes) { return (bytes + 15) & ~(size_t)15; }

static void guard_set_host(void *p)
{
    uint32_t *g = p;
    for (int i = 0; i < AR_GUARD_WORDS; i++) g[i] = AR_GUARD_PATTERN;
}

static int guard_count_host(const void *p)
{
    const uint32_t *g = p;
    int bad = 0;
    for (int i = 0; i < AR_GUARD_WORDS; i++) bad += g[i] != AR_GUARD_PATTERN;
    return bad;
}

/* One timed repetition: [host write] + the plugin's forward, its parts named in part_names.  A
 * CPU plugin's times are read here (write_us, part_us).  A CUDA plugin's are only recorded, on
 * events ev0 + 0 (start), + 1 (write end), + 2 + i (mark i), + 2 + marks (end): the repeats run
 * back to back and forward_times reads them after the run's one wait. */
static int forward_once(plugin_run *r, bool host_writes, int layer, int ev0, double *write_us, double *part_us,
                        int *num_parts, char (*part_names)[16], char *err, size_t err_len)
{
    const plugin_slot *s = r->slot;
    /* Untimed: poison the outputs so a forward that leaves rows unwritten shows NaN. */
    if (r->cuda) {
        if (ar_pdev_memset(r->dev, r->out, 0xff, r->out_bytes, err, err_len) ||
            ar_pdev_memset(r->dev, r->lse, 0xff, r->lse_bytes, err, err_len))
            return 3;
    } else {
        memset(r->out, 0xff, r->out_bytes);
        memset(r->lse, 0xff, r->lse_bytes);
    }
    double t0 = 0, t1 = 0;
    *write_us = 0;
    if (r->cuda) {
        if (ar_pdev_record(r->dev, ev0, err, err_len)) return 3;
        if (host_writes) {
            ar_pdev_gen g = pdev_gen(r, layer);
            if (ar_pdev_write_kv(r->dev, &g, r->T, r->d_slots, r->k_new, r->v_new, r->cache[layer], err, err_len))
                return 3;
        }
        if (ar_pdev_record(r->dev, ev0 + 1, err, err_len)) return 3;
    } else {
        t0 = now_us();
        if (host_writes) host_write_kv(r, layer);
        t1 = now_us();
        *write_us = t1 - t0;
    }
    r->num_marks = 0;
    r->ev0 = ev0;
    call_error[0] = '\0';
    active_run = r;
    int rc = s->p->forward(r->ps, &r->fa);
    active_run = NULL;
    double t_end = now_us();
    if (rc != 0) {
        snprintf(err, err_len, "%s: forward failed at step %lld, layer %d: %s", s->name,
                 (long long)r->prepared_step, layer, take_error());
        return 3;
    }
    int marks = r->num_marks;
    if (marks < 0 || marks > ATTNREPLAY_MAX_MARKS) marks = 0;
    if (r->cuda) {
        if (ar_pdev_record(r->dev, ev0 + 2 + marks, err, err_len)) return 3;
    } else {
        double prev = t1;
        for (int i = 0; i < marks; i++) {
            part_us[i] = r->mark_us[i] - prev;
            prev = r->mark_us[i];
        }
        part_us[marks] = t_end - prev;
    }
    for (int i = 0; i < marks; i++) snprintf(part_names[i], 16, "%s", r->mark_names[i]);
    snprintf(part_names[marks], 16, "attn");
    *num_parts = marks + 1;
    return 0;
}

/* A CUDA plugin's repeat (forward_once's events from ev0, num_parts parts) read back, once the
 * stream has been waited for. */
static int forward_times(plugin_run *r, int ev0, int num_parts, double *write_us, double *part_us, char *err,
                         size_t err_len)
{
    if (ar_pdev_elapsed_us(r->dev, ev0, ev0 + 1, write_us, err, err_len)) return 3;
    for (int i = 0; i < num_parts; i++)
        if (ar_pdev_elapsed_us(r->dev, ev0 + 1 + i, ev0 + 2 + i, &part_us[i], err, err_len)) return 3;
    return 0;
}

static int plugin_forward(void *state, int layer, const ar_batch *b, ar_forward_out *o, char *err, size_t err_len)
{
    plugin_run *r = state;
    const plugin_slot *s = r->slot;
    if (!r->prepared || r->prepared_step != b->step || b->num_tokens != r->T) {
        snprintf(err, err_len, "%s: forward of step %lld without its prepare", s->name, (long long)b->step);
        return 3;
    }
    if (layer < 0 || layer >= r->cfg.num_layers) {
        snprintf(err, err_len, "%s: layer %d outside 0..%d", s->name, layer, r->cfg.num_layers - 1);
        return 3;
    }
    /* Untimed: this layer's inputs on the plugin's device; guard words after out and lse. */
    if (r->cuda) {
        ar_pdev_gen g = pdev_gen(r, layer);
        if (r->mla && r->d_w_layer != layer) {
            if (ar_pdev_mla_weights(r->dev, &g, &r->pm, r->d_w_uk, r->d_w_uv, err, err_len)) return 3;
            r->d_w_layer = layer;
        }
        if ((r->mla ? ar_pdev_mla_gen_inputs(r->dev, &g, &r->pm, r->T, r->d_qkey, r->d_pos, r->d_kvkey, r->d_w_uk,
                                             r->q, r->k_new, err, err_len)
                    : ar_pdev_gen_inputs(r->dev, &g, r->T, r->d_qkey, r->d_pos, r->d_kvkey, r->q, r->k_new,
                                         r->v_new, err, err_len)) ||
            ar_pdev_guard_set(r->dev, (char *)r->out + guard_at(r->out_bytes), err, err_len) ||
            ar_pdev_guard_set(r->dev, (char *)r->lse + guard_at(r->lse_bytes), err, err_len))
            return 3;
    } else {
        if (r->mla && layer_weights(r, layer) != 0) {
            snprintf(err, err_len, "%s: out of memory for the MLA weights of layer %d", s->name, layer);
            return 3;
        }
        gen_inputs_cpu(r, layer);
        guard_set_host((char *)r->out + guard_at(r->out_bytes));
        guard_set_host((char *)r->lse + guard_at(r->lse_bytes));
    }
    r->t_cache.t.data = r->cache[layer];
    attnreplay_forward_args *fa = &r->fa;
    memset(fa, 0, sizeof *fa);
    fa->struct_size = (int32_t)sizeof *fa;
    fa->layer = layer;
    fa->md = &r->md;
    fa->q = r->t_q.t;
    fa->k_new = r->t_k.t;
    fa->v_new = r->t_v.t;
    fa->kv_cache = r->t_cache.t;
    fa->out = r->t_out.t;
    fa->lse = r->t_lse.t;
    fa->stream = r->cuda ? ar_pdev_stream(r->dev) : NULL;

    const bool host_writes = !(s->p->flags & ATTNREPLAY_PLUGIN_WRITES_KV);
    const int repeat = r->cfg.repeat < 1 ? 1 : r->cfg.repeat;
    /* [repeat] rows of: write, total, parts; then each repeat's part count */
    double *times = malloc((sizeof(double) * (MAX_SEGMENTS + 2) + sizeof(int)) * (size_t)repeat);
    if (!times) {
        snprintf(err, err_len, "%s: out of memory", s->name);
        return 3;
    }
    int *parts_of = (int *)(times + (size_t)repeat * (MAX_SEGMENTS + 2));
    char names[MAX_SEGMENTS][16];
    int parts = MAX_SEGMENTS;
    int rc = r->cuda ? ar_pdev_reserve_events(r->dev, repeat * AR_PDEV_EVENTS, err, err_len) : 0;
    /* The repeats back to back: a CUDA plugin's are waited for once, after the last (as the
     * built-in CUDA backends and the peers' scripts time theirs), so a kernel fault of an early
     * repeat may surface at a later repeat's launch; the step fails the same way. */
    for (int rep = 0; rep < repeat && rc == 0; rep++) {
        double *tr = times + (size_t)rep * (MAX_SEGMENTS + 2);
        rc = forward_once(r, host_writes, layer, rep * AR_PDEV_EVENTS, &tr[0], tr + 2, &parts_of[rep], names, err,
                          err_len);
        if (rc && r->cuda && rep > 0 && strncmp(err, s->name, strlen(s->name)) != 0) {
            char inner[512];   /* a launch's error: the fault may be an earlier repeat's kernel */
            snprintf(inner, sizeof inner, "%s", err);
            snprintf(err, err_len, "%s: a kernel failed at step %lld, layer %d (seen at repeat %d's launch): %s",
                     s->name, (long long)r->prepared_step, layer, rep + 1, inner);
        }
        if (rc == 0 && parts_of[rep] < parts) parts = parts_of[rep];   /* marks that vary: the common prefix */
    }
    if (rc == 0 && r->cuda && ar_pdev_sync(r->dev, err, err_len) != 0) {
        char inner[512];
        snprintf(inner, sizeof inner, "%s", err);
        snprintf(err, err_len, "%s: a kernel failed at step %lld, layer %d: %s", s->name,
                 (long long)r->prepared_step, layer, inner);
        rc = 3;
    }
    for (int rep = 0; rep < repeat && rc == 0; rep++) {
        double *tr = times + (size_t)rep * (MAX_SEGMENTS + 2);
        if (r->cuda) rc = forward_times(r, rep * AR_PDEV_EVENTS, parts_of[rep], &tr[0], tr + 2, err, err_len);
        double total = tr[0];
        for (int i = 0; i < parts_of[rep]; i++) total += tr[2 + i];
        tr[1] = total;
    }
    if (rc) {
        free(times);
        return rc;
    }
    /* Guards, then the output for the verifier. */
    int bad_out = 0, bad_lse = 0;
    if (r->cuda) {
        if (ar_pdev_guard_count(r->dev, (char *)r->out + guard_at(r->out_bytes), &bad_out, err, err_len) ||
            ar_pdev_guard_count(r->dev, (char *)r->lse + guard_at(r->lse_bytes), &bad_lse, err, err_len)) {
            free(times);
            return 3;
        }
    } else {
        bad_out = guard_count_host((char *)r->out + guard_at(r->out_bytes));
        bad_lse = guard_count_host((char *)r->lse + guard_at(r->lse_bytes));
    }
    o->guard_violations = bad_out + bad_lse;
    const size_t n_out = (size_t)r->T * r->hq * r->dout, n_lse = (size_t)r->T * r->hq;
    if (r->cuda && r->mla) {   /* W_UV on the device: the output the verifier sees, [T, N, V] floats */
        ar_pdev_gen g = pdev_gen(r, layer);
        const size_t n_v = (size_t)r->T * r->hq * r->mdims.v_head_dim;
        if (ar_pdev_mla_vproj(r->dev, &g, &r->pm, r->T, r->out, r->d_w_uv, r->d_out_v, err, err_len) ||
            (o->out && ar_pdev_download(r->dev, o->out, r->d_out_v, sizeof(float) * n_v, err, err_len)) ||
            (o->lse && ar_pdev_download(r->dev, o->lse, r->lse, r->lse_bytes, err, err_len))) {
            free(times);
            return 3;
        }
        o->dev_out = r->d_out_v;
        o->dev_out_type = AR_FP32;   /* float values rounded to the dtype */
        o->dev_lse = r->lse;
        o->dev_stream = ar_pdev_stream(r->dev);
    } else if (r->cuda) {
        o->dev_out = r->out;
        o->dev_out_type = r->cfg.dtype;   /* the run's dtype: 16-bit bits, or float for fp32 */
        o->dev_lse = r->lse;
        o->dev_stream = ar_pdev_stream(r->dev);
        if (o->out) {
            if (ar_pdev_download(r->dev, r->stage, r->out, r->out_bytes, err, err_len)) {
                free(times);
                return 3;
            }
            for (size_t i = 0; i < n_out; i++) o->out[i] = ar_load(r->cfg.dtype, r->stage, (int64_t)i);
        }
        if (o->lse && ar_pdev_download(r->dev, o->lse, r->lse, r->lse_bytes, err, err_len)) {
            free(times);
            return 3;
        }
    } else {
        if (o->out && r->mla) vproj_mla_cpu(r, layer, o->out);
        else if (o->out)
            for (size_t i = 0; i < n_out; i++) o->out[i] = ar_load(r->cfg.dtype, r->out, (int64_t)i);
        if (o->lse) memcpy(o->lse, r->lse, sizeof(float) * n_lse);
    }
    /* Kernel times: medians over the repeats. */
    double *col = malloc(sizeof(double) * (size_t)repeat);
    if (!col) {
        free(times);
        snprintf(err, err_len, "%s: out of memory", s->name);
        return 3;
    }
    o->num_kernels = 0;
    for (int k = -1; k < parts && o->num_kernels < AR_MAX_KERNELS; k++) {
        if (k < 0 && !host_writes) continue;
        for (int rep = 0; rep < repeat; rep++) col[rep] = times[(size_t)rep * (MAX_SEGMENTS + 2) + (k < 0 ? 0 : 2 + k)];
        /* names live as long as the backend: interned in the slot's table */
        static char name_store[AR_PLUGIN_SLOTS][MAX_SEGMENTS][16];
        const char *nm = "write";
        if (k >= 0) {
            int si = (int)(s - slots);
            snprintf(name_store[si][k], 16, "%s", names[k]);
            nm = name_store[si][k];
        }
        o->kernels[o->num_kernels].name = nm;
        o->kernels[o->num_kernels].us = median(col, repeat);
        o->num_kernels++;
    }
    for (int rep = 0; rep < repeat; rep++) col[rep] = times[(size_t)rep * (MAX_SEGMENTS + 2) + 1];
    o->total_us = median(col, repeat);
    free(col);
    free(times);
    o->num_paths = 0;
    ar_forward_add_path(o, s->path);
    return 0;
}

/* ---- registration ------------------------------------------------------------------------ */

static bool name_ok(const char *n)
{
    if (!n || !*n || strlen(n) > 64) return false;
    for (const char *c = n; *c; c++)
        if (*c <= ' ' || *c == '"' || *c == '\'' || *c == '\\') return false;
    return true;
}

const ar_backend *ar_plugin_register_init(attnreplay_plugin_init_fn init, const char *prefix,
                                          const char *source, char *err, size_t err_len)
{
    if (!init) {
        snprintf(err, err_len, "%s: no init function", source);
        return NULL;
    }
    call_error[0] = '\0';
    const bool bracketed = ar_call_begin_plugin(AR_CALL_INIT, source);
    const attnreplay_plugin *p = init(&host_api, ATTNREPLAY_PLUGIN_ABI_VERSION);
    if (bracketed) ar_call_end();
    if (!p) {
        snprintf(err, err_len, "%s: attnreplay_plugin_init refused to initialise: %s", source, take_error());
        return NULL;
    }
    if (p->abi_version < ATTNREPLAY_PLUGIN_ABI_OLDEST || p->abi_version > ATTNREPLAY_PLUGIN_ABI_VERSION) {
        snprintf(err, err_len, "%s: plugin ABI version %d, but this attnreplay speaks versions %d to %d: rebuild "
                 "the plugin against this attnreplay's replay/attnreplay_plugin.h", source, (int)p->abi_version,
                 ATTNREPLAY_PLUGIN_ABI_OLDEST, ATTNREPLAY_PLUGIN_ABI_VERSION);
        return NULL;
    }
    if (p->struct_size != (int32_t)sizeof(attnreplay_plugin)) {
        snprintf(err, err_len, "%s: attnreplay_plugin.struct_size is %d, this host's is %zu (built against "
                 "another copy of attnreplay_plugin.h?)", source, (int)p->struct_size, sizeof(attnreplay_plugin));
        return NULL;
    }
    const char *missing = !p->check ? "check" : !p->open ? "open" : !p->plan ? "plan" : !p->forward ? "forward"
                        : !p->close ? "close" : NULL;
    if (missing) {
        snprintf(err, err_len, "%s: the plugin's descriptor has no %s function", source, missing);
        return NULL;
    }
    if (!name_ok(p->name)) {
        snprintf(err, err_len, "%s: the plugin's name must be 1-64 characters without spaces or quotes", source);
        return NULL;
    }
    if (p->device_type != kDLCPU && p->device_type != kDLCUDA) {
        snprintf(err, err_len, "%s: device_type %d: a plugin runs on kDLCPU (1) or kDLCUDA (2)", source,
                 (int)p->device_type);
        return NULL;
    }
    const uint32_t known = ATTNREPLAY_PLUGIN_WRITES_KV | ATTNREPLAY_PLUGIN_CASCADE |
                           (p->abi_version >= 2 ? ATTNREPLAY_PLUGIN_MLA : 0u);
    if (p->flags & ~known) {
        snprintf(err, err_len, "%s: unknown capability flags 0x%x (this host knows 0x%x)", source,
                 (unsigned)(p->flags & ~known), (unsigned)known);
        return NULL;
    }
    char full[96];
    snprintf(full, sizeof full, "%s%s", prefix ? prefix : "", p->name);
    int free_slot = -1;
    for (int i = 0; i < AR_PLUGIN_SLOTS; i++) {
        if (!slots[i].used) {
            if (free_slot < 0) free_slot = i;
            continue;
        }
        if (strcmp(slots[i].name, full) == 0) {
            if (slots[i].p == p) return &slots[i].be;
            snprintf(err, err_len, "%s: a backend named %s is already registered (from %s)", source, full,
                     slots[i].source);
            return NULL;
        }
    }
    if (free_slot < 0) {
        snprintf(err, err_len, "%s: %d plugins are registered already (the most one process holds)", source,
                 AR_PLUGIN_SLOTS);
        return NULL;
    }
    plugin_slot *s = &slots[free_slot];
    memset(s, 0, sizeof *s);
    s->p = p;
    snprintf(s->name, sizeof s->name, "%s", full);
    snprintf(s->path, sizeof s->path, "plugin:%s", p->name);
    snprintf(s->source, sizeof s->source, "%s", source);
    snprintf(s->summary, sizeof s->summary, "%s", p->summary ? p->summary : "(plugin)");
    snprintf(s->capabilities, sizeof s->capabilities, "%s%s", p->capabilities ? p->capabilities : "",
             (p->flags & ATTNREPLAY_PLUGIN_CASCADE) ? "" : " (flat only: no cascade)");
    s->be.name = s->name;
    s->be.summary = s->summary;
    s->be.capabilities = s->capabilities;
    s->be.needs_gpu = p->device_type == kDLCUDA;
    s->be.check = check_fns[free_slot];
    s->be.open = open_fns[free_slot];
    s->be.prepare = plugin_prepare;
    s->be.fill = plugin_fill;
    s->be.forward = plugin_forward;
    s->be.device_name = plugin_device_name;
    s->be.close = plugin_close;
    if (ar_backend_register(&s->be) != 0) {
        snprintf(err, err_len, "%s: the backend registry is full", source);
        return NULL;
    }
    s->used = 1;
    return &s->be;
}

bool ar_plugin_runs_cascade(const ar_backend *b)
{
    for (int i = 0; i < AR_PLUGIN_SLOTS; i++)
        if (slots[i].used && &slots[i].be == b) return (slots[i].p->flags & ATTNREPLAY_PLUGIN_CASCADE) != 0;
    return true;
}

const ar_backend *ar_plugin_load(const char *path, char *err, size_t err_len)
{
    if (!path || !*path) {
        snprintf(err, err_len, "--backend plugin:PATH needs the path of a plugin (.so)");
        return NULL;
    }
    char full[512];
    /* dlopen searches the library path for a bare name; a plugin is a file. */
    snprintf(full, sizeof full, "%s%s", strchr(path, '/') ? "" : "./", path);
    for (int i = 0; i < AR_PLUGIN_SLOTS; i++)
        if (slots[i].used && strcmp(slots[i].source, full) == 0) return &slots[i].be;
    dlerror();
    void *h = dlopen(full, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        snprintf(err, err_len, "cannot load plugin %s: %s", full, why ? why : "dlopen failed");
        return NULL;
    }
    /* From here the handle is never closed: a plugin may have started threads or registered
     * CUDA state (and a failed one costs a few pages). */
    union { void *obj; attnreplay_plugin_init_fn fn; } sym;
    dlerror();
    sym.obj = dlsym(h, "attnreplay_plugin_init");
    if (!sym.obj) {
        snprintf(err, err_len, "%s does not export attnreplay_plugin_init: not an attnreplay plugin (build it "
                 "with ATTNREPLAY_PLUGIN_EXPORT, extern \"C\" in C++)", full);
        return NULL;
    }
    return ar_plugin_register_init(sym.fn, AR_PLUGIN_PREFIX, full, err, err_len);
}
