/* example_cpu.c - an example attnreplay plugin: paged attention on the host, in plain C.
 *
 * Built by `make` as build/plugins/attnreplay-example-cpu.so and run with
 *     attnreplay replay TRACE --backend plugin:build/plugins/attnreplay-example-cpu.so --db DB
 * It includes only attnreplay_plugin.h and links nothing of attnreplay's: the shape a third-party
 * kernel takes.  What it shows:
 *   - init checks the host's ABI version and returns the descriptor;
 *   - check() refuses, with a reason, what it does not do (fp8 caches, planted kernel faults);
 *   - plan() reads vLLM's FlashAttentionMetadata (query_start_loc, seq_lens, block_table, and the
 *     cascade fields) and sizes its scratch;
 *   - forward() reads Q and the paged cache through their DLTensors and writes out and LSE.
 * The host writes the new K/V into the cache before forward (no ATTNREPLAY_PLUGIN_WRITES_KV).
 * It does cascade (ATTNREPLAY_PLUGIN_CASCADE): a prefix pass (every query against the P shared
 * keys, no mask), a suffix pass (each request against its own keys after P, causal) and the
 * LSE-weighted merge, as vLLM's cascade_attention.  Arithmetic: float32, two passes per row
 * (max, then exp-sum and the weighted values), output rounded to the run's dtype.
 * It also runs MLA models (ATTNREPLAY_PLUGIN_MLA): the same loop over the latent cache
 * [num_blocks, block_size, L + R], one KV head, keys the whole entries and values their first L
 * elements, as FlashMLA's decode kernel computes it; the host absorbs W_UK into q before and
 * applies W_UV to out after. */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attnreplay_plugin.h"

static const attnreplay_host_api *host;

/* Says why the current call fails (host->set_error takes a plain string) and returns 1. */
__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    host->set_error(msg);
    return 1;
}

/* ---- dtype conversions (IEEE bit patterns, round to nearest even) ---------------------- */

typedef enum { DT_F32, DT_F16, DT_BF16 } elem_type;

static int elem_type_of(DLDataType t, elem_type *out)
{
    if (t.lanes != 1) return -1;
    if (t.code == kDLFloat && t.bits == 32) *out = DT_F32;
    else if (t.code == kDLFloat && t.bits == 16) *out = DT_F16;
    else if (t.code == kDLBfloat && t.bits == 16) *out = DT_BF16;
    else return -1;
    return 0;
}

static float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static uint16_t f32_to_f16(float f)
{
    uint32_t u = f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        if (a < 0x33000000u) return (uint16_t)sign;
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a - 0x38000000u;
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float load(elem_type t, const void *base, int64_t i)
{
    switch (t) {
    case DT_F16: return f16_to_f32(((const uint16_t *)base)[i]);
    case DT_BF16: return bits_f32((uint32_t)((const uint16_t *)base)[i] << 16);
    default: return ((const float *)base)[i];
    }
}

static void store(elem_type t, void *base, int64_t i, float v)
{
    switch (t) {
    case DT_F16: ((uint16_t *)base)[i] = f32_to_f16(v); break;
    case DT_BF16: ((uint16_t *)base)[i] = f32_to_bf16(v); break;
    default: ((float *)base)[i] = v; break;
    }
}

/* ---- the backend ---------------------------------------------------------------------- */

typedef struct state {
    attnreplay_config cfg;
    elem_type dt, kvt;
    const attnreplay_metadata *md;
    float *scores;          /* [max_seq_len] */
    float *acc;             /* [head_size] x 3: one pass, the prefix pass, the suffix pass */
    int cap_scores;
} state;

static int ex_check(const attnreplay_config *cfg)
{
    elem_type t;
    if (elem_type_of(cfg->dtype, &t) != 0)
        return fail("dtype (code %d, %d bits) is not float32/float16/bfloat16", cfg->dtype.code, cfg->dtype.bits);
    if (cfg->kv_dtype.code != cfg->dtype.code || cfg->kv_dtype.bits != cfg->dtype.bits)
        return fail("the KV cache dtype (code %d) must be the model dtype: no fp8 cache in this example",
                    cfg->kv_dtype.code);
    if (strcmp(cfg->inject, "none") != 0)
        return fail("planted fault '%s' is not implemented by this example", cfg->inject);
    if (cfg->num_q_heads % cfg->num_kv_heads != 0) return fail("num_q_heads %d is not a multiple of num_kv_heads %d",
                                                               cfg->num_q_heads, cfg->num_kv_heads);
    return 0;
}

static int ex_open(const attnreplay_config *cfg, void **out)
{
    state *s = calloc(1, sizeof *s);
    if (!s) return fail("out of memory (%zu bytes)", sizeof *s);
    s->cfg = *cfg;
    elem_type_of(cfg->dtype, &s->dt);
    elem_type_of(cfg->kv_dtype, &s->kvt);
    s->acc = malloc(sizeof(float) * 3 * (size_t)cfg->head_size);
    if (!s->acc) {
        free(s);
        return fail("out of memory (%d floats)", 3 * cfg->head_size);
    }
    *out = s;
    return 0;
}

static void ex_close(void *st)
{
    state *s = st;
    if (!s) return;
    free(s->scores);
    free(s->acc);
    free(s);
}

static int ex_plan(void *st, const attnreplay_metadata *md)
{
    state *s = st;
    if (md->query_start_loc.dtype.code != kDLInt || md->query_start_loc.dtype.bits != 32 ||
        md->block_table.ndim != 2)
        return fail("unexpected metadata layout (block_table ndim %d)", (int)md->block_table.ndim);
    if (md->max_seq_len > s->cap_scores) {
        float *p = realloc(s->scores, sizeof(float) * (size_t)md->max_seq_len);
        if (!p) return fail("out of memory for %d scores", md->max_seq_len);
        s->scores = p;
        s->cap_scores = md->max_seq_len;
    }
    s->md = md;
    return 0;
}

static bool is_mla(const attnreplay_config *c) { return c->attention == ATTNREPLAY_ATTENTION_MLA; }

/* out's head dim: head_size, or the latent width L for MLA. */
static int value_dim(const attnreplay_config *c) { return is_mla(c) ? c->kv_lora_rank : c->head_size; }

/* Attention of one query row q (already in float) against keys [lo, hi) of block_table row
 * `row`, KV head kvh: acc[value_dim] = softmax-weighted values, *lse = log of the denominator
 * (-inf and acc 0 for an empty range).  MLA: a key is a whole cache entry, its value the entry's
 * first L elements. */
static void attend(state *s, const attnreplay_forward_args *a, const float *q, int row, int lo, int hi, int kvh,
                   float *acc, float *lse)
{
    const attnreplay_config *c = &s->cfg;
    const int D = c->head_size, DV = value_dim(c), B = c->block_size, Hkv = c->num_kv_heads;
    const int64_t stride = a->md->block_table.shape[1];
    const int32_t *table = (const int32_t *)a->md->block_table.data + (int64_t)row * stride;
    /* the V side: one of K, V further on; MLA: the entries themselves */
    const int64_t side = is_mla(c) ? 0 : a->kv_cache.shape[1] * a->kv_cache.shape[2] * Hkv * D;
    const void *cache = a->kv_cache.data;
    for (int d = 0; d < DV; d++) acc[d] = 0;
    if (hi <= lo) {
        *lse = -INFINITY;
        return;
    }
    float m = -INFINITY;
    for (int j = lo; j < hi; j++) {
        int64_t base = (((int64_t)table[j / B] * B + j % B) * Hkv + kvh) * D;
        float dot = 0;
        for (int d = 0; d < D; d++) dot += q[d] * load(s->kvt, cache, base + d);
        float sc = dot * c->scale;
        if (c->logits_soft_cap > 0) sc = c->logits_soft_cap * tanhf(sc / c->logits_soft_cap);
        s->scores[j] = sc;
        if (sc > m) m = sc;
    }
    float sum = 0;
    for (int j = lo; j < hi; j++) {
        float p = expf(s->scores[j] - m);
        sum += p;
        int64_t base = side + (((int64_t)table[j / B] * B + j % B) * Hkv + kvh) * D;
        for (int d = 0; d < DV; d++) acc[d] += p * load(s->kvt, cache, base + d);
    }
    for (int d = 0; d < DV; d++) acc[d] /= sum;
    *lse = m + logf(sum);
}

static int ex_forward(void *st, const attnreplay_forward_args *a)
{
    state *s = st;
    const attnreplay_config *c = &s->cfg;
    const attnreplay_metadata *md = a->md;
    const int Hq = c->num_q_heads, D = c->head_size, DV = value_dim(c), group = c->num_q_heads / c->num_kv_heads;
    const int T = md->num_actual_tokens, P = md->use_cascade ? md->common_prefix_len : 0;
    const int32_t *qsl = md->query_start_loc.data, *seq = md->seq_lens.data;
    float *out_acc = s->acc, *pre = s->acc + D, *suf = s->acc + 2 * D;
    float *lse = a->lse.data;
    float *q = malloc(sizeof(float) * (size_t)D);
    if (!q) return fail("out of memory (%d floats)", D);
    for (int r = 0; r < md->num_reqs; r++) {
        const int n = qsl[r + 1] - qsl[r], ctx = seq[r] - n;
        for (int i = 0; i < n; i++) {
            const int t = qsl[r] + i, p = ctx + i;
            int lo = 0;
            if (c->sliding_window > 0 && p + 1 - c->sliding_window > 0) lo = p + 1 - c->sliding_window;
            for (int h = 0; h < Hq; h++) {
                for (int d = 0; d < D; d++) q[d] = load(s->dt, a->q.data, ((int64_t)t * Hq + h) * D + d);
                float l;
                if (P == 0) {
                    attend(s, a, q, r, lo, p + 1, h / group, out_acc, &l);
                } else {
                    /* cascade: the shared prefix through request 0's row, then this request's rest */
                    float lp, ls;
                    attend(s, a, q, 0, 0, P, h / group, pre, &lp);
                    attend(s, a, q, r, P, p + 1, h / group, suf, &ls);
                    float m = lp > ls ? lp : ls;
                    if (m == -INFINITY) {
                        for (int d = 0; d < DV; d++) out_acc[d] = 0;
                        l = -INFINITY;
                    } else {
                        float wp = expf(lp - m), ws = expf(ls - m);
                        for (int d = 0; d < DV; d++) out_acc[d] = (wp * pre[d] + ws * suf[d]) / (wp + ws);
                        l = m + logf(wp + ws);
                    }
                }
                for (int d = 0; d < DV; d++) store(s->dt, a->out.data, ((int64_t)t * Hq + h) * DV + d, out_acc[d]);
                lse[(int64_t)h * T + t] = l;
            }
        }
    }
    free(q);
    return 0;
}

/* EXAMPLE_FLAT_ONLY builds the same kernel without the cascade flag (the tests' "example-cpu-flat":
 * the host then never asks for cascade). */
static const attnreplay_plugin example_cpu = {
    .abi_version = ATTNREPLAY_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(attnreplay_plugin),
#ifdef EXAMPLE_FLAT_ONLY
    .name = "example-cpu-flat",
    .flags = 0,
#else
    .name = "example-cpu",
    .flags = ATTNREPLAY_PLUGIN_CASCADE | ATTNREPLAY_PLUGIN_MLA,
#endif
    .summary = "example plugin: paged attention in plain C on the host (float32, two-pass softmax)",
    .capabilities = "dtypes fp32/fp16/bf16, KV cache in the same dtype; GQA/MQA; window; soft cap; cascade; "
                    "MLA (latent attention)",
    .device_type = kDLCPU,
    .check = ex_check,
    .open = ex_open,
    .plan = ex_plan,
    .forward = ex_forward,
    .close = ex_close,
};

ATTNREPLAY_PLUGIN_EXPORT const attnreplay_plugin *attnreplay_plugin_init(const attnreplay_host_api *h,
                                                                        int host_abi_version)
{
    host = h;
    if (host_abi_version != ATTNREPLAY_PLUGIN_ABI_VERSION) {
        h->set_error("example-cpu was built for plugin ABI version " ATTNREPLAY_PLUGIN_ABI_STRING);
        return NULL;
    }
    return &example_cpu;
}
