/* cpu_attn.c - the attention core shared by the CPU backends (see cpu_attn.h): the paged /
 * contiguous online-softmax kernel, the LSE merge, cache element conversion and small helpers.
 *
 * The inner loops are written so that gcc vectorises them at -O2 without -ffast-math: scores
 * are computed against a transposed key tile (a constant-length loop over keys, no
 * reduction) and P.V / rescaling run in blocks of eight. */
#include "cpu_attn.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

double ar_cpu_now_us(void)
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

double ar_cpu_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Scores of one query row against a tile of keys held transposed (kT [D, AR_CPU_KEY_TILE]):
 * sc[jj] = q . k_jj.  The inner loop runs over the tile's keys, a constant trip count with no
 * reduction, so the compiler vectorises it at -O2. */
static void tile_scores(const float *restrict q /* [D] */, const float *restrict kT, int D,
                        float *restrict sc /* [AR_CPU_KEY_TILE] */)
{
    float acc[AR_CPU_KEY_TILE];
    for (int jj = 0; jj < AR_CPU_KEY_TILE; jj++) acc[jj] = 0.0f;
    for (int d = 0; d < D; d++) {
        float qd = q[d];
        const float *restrict krow = kT + (size_t)d * AR_CPU_KEY_TILE;
        for (int jj = 0; jj < AR_CPU_KEY_TILE; jj++) acc[jj] += qd * krow[jj];
    }
    for (int jj = 0; jj < AR_CPU_KEY_TILE; jj++) sc[jj] = acc[jj];
}

/* acc[d] += p * v[d] for d < n, in blocks of 8 (vectorised) plus a scalar tail. */
void ar_cpu_add_scaled(float *restrict acc /* [n] */, const float *restrict v /* [n] */, float p,
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

/* Converts n cache elements starting at element index `first` to float, times mult.  The
 * bf16 and fp32 cases run in blocks of eight so that gcc vectorises them at -O2. */
void ar_cpu_load_row(ar_dtype t, const void *base, int64_t first, int n, float mult, float *dst)
{
    int i = 0;
    switch (t) {
    case AR_FP16: {
        const uint16_t *s = (const uint16_t *)base + first;
        for (; i < n; i++) dst[i] = ar_fp16_to_f32(s[i]);
        break;
    }
    case AR_BF16: {
        const uint16_t *s = (const uint16_t *)base + first;
        for (; i + 8 <= n; i += 8) {
            uint32_t bits[8];
            for (int u = 0; u < 8; u++) bits[u] = (uint32_t)s[i + u] << 16;
            memcpy(dst + i, bits, sizeof bits);
        }
        for (; i < n; i++) dst[i] = ar_bf16_to_f32(s[i]);
        break;
    }
    case AR_FP8_E4M3: {
        const uint8_t *s = (const uint8_t *)base + first;
        for (; i < n; i++) dst[i] = ar_fp8e4m3_to_f32(s[i]);
        break;
    }
    default:
        memcpy(dst, (const float *)base + first, sizeof(float) * (size_t)n);
        break;
    }
    if (mult != 1.0f) scale_row(dst, mult, n);
}

/* Stores n floats (each divided by div when div != 1) as t's bits at element index first. */
void ar_cpu_store_row(ar_dtype t, void *base, int64_t first, int n, float div, const float *src)
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

float ar_cpu_dot(const float *a, const float *b, int n)
{
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++) part[u] += a[i + u] * b[i + u];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return ((part[0] + part[1]) + (part[2] + part[3])) +
           ((part[4] + part[5]) + (part[6] + part[7])) + tail;
}

/* Fills n elements of type t at base with its NaN pattern. */
void ar_cpu_fill_nan(ar_dtype t, void *base, size_t n)
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


/* ---- work items and scratch ------------------------------------------------------------ */

int ar_cpu_tile_tokens(int group)
{
    int t = AR_CPU_MAX_TILE_ROWS / (group > 0 ? group : 1);
    return t < 1 ? 1 : t;
}

void ar_cpu_scratch_free(ar_cpu_scratch *scratch, int threads)
{
    if (!scratch) return;
    for (int i = 0; i < threads; i++) {
        ar_cpu_scratch *c = &scratch[i];
        free(c->k_tile); free(c->k_row); free(c->v_tile); free(c->scores); free(c->acc);
        free(c->row_max); free(c->row_sum); free(c->tok_lo); free(c->tok_hi);
    }
    free(scratch);
}

ar_cpu_scratch *ar_cpu_scratch_alloc(int threads, int head_size, int v_head_size, int group)
{
    ar_cpu_scratch *scratch = calloc((size_t)threads, sizeof *scratch);
    if (!scratch) return NULL;
    int tile_tokens = ar_cpu_tile_tokens(group);
    size_t max_rows = (size_t)tile_tokens * (size_t)group;
    for (int i = 0; i < threads; i++) {
        ar_cpu_scratch *c = &scratch[i];
        c->k_tile = malloc(sizeof(float) * AR_CPU_KEY_TILE * (size_t)head_size);
        c->k_row = malloc(sizeof(float) * (size_t)head_size);
        c->v_tile = malloc(sizeof(float) * AR_CPU_KEY_TILE * (size_t)v_head_size);
        c->scores = malloc(sizeof(float) * AR_CPU_KEY_TILE);
        c->acc = malloc(sizeof(float) * max_rows * (size_t)v_head_size);
        c->row_max = malloc(sizeof(float) * max_rows);
        c->row_sum = malloc(sizeof(float) * max_rows);
        c->tok_lo = malloc(sizeof(int) * (size_t)tile_tokens);
        c->tok_hi = malloc(sizeof(int) * (size_t)tile_tokens);
        if (!c->k_tile || !c->k_row || !c->v_tile || !c->scores || !c->acc || !c->row_max ||
            !c->row_sum || !c->tok_lo || !c->tok_hi) {
            ar_cpu_scratch_free(scratch, threads);
            return NULL;
        }
    }
    return scratch;
}

int ar_cpu_add_items(const ar_cpu_segment *seg, int seg_index, int tile_tokens, int num_kv_heads,
                     ar_cpu_item **items, int *num, int *cap)
{
    for (int t0 = seg->tok0; t0 < seg->tok1; t0 += tile_tokens) {
        int t1 = t0 + tile_tokens < seg->tok1 ? t0 + tile_tokens : seg->tok1;
        for (int h = 0; h < num_kv_heads; h++) {
            if (grow((void **)items, cap, *num + 1, sizeof **items)) return -1;
            (*items)[*num] = (ar_cpu_item){seg_index, t0, t1, h};
            (*num)++;
        }
    }
    return 0;
}

/* ---- the kernel ------------------------------------------------------------------------ */

/* One work item: all query heads of one KV head for a tile of tokens of one segment. */
void ar_cpu_attn_task(void *ctx, int item, int worker)
{
    const ar_cpu_attn *a = ctx;
    const ar_cpu_item *it = &a->items[item];
    const ar_cpu_segment *sg = &a->segs[it->seg];
    ar_cpu_scratch *c = &a->scratch[worker];
    const int Hq = a->num_q_heads, Hkv = a->num_kv_heads, G = Hq / Hkv;
    const int D = a->head_size, Dv = a->v_head_size, B = a->block_size, T = a->num_tokens;
    const int stride = a->kv_stride, v_stride = a->v_stride > 0 ? a->v_stride : a->kv_stride;
    const ar_fault fault = a->fault;
    const float scale = a->scale, cap = a->soft_cap;
    const int *block_row = B > 0 ? a->block_table + (int64_t)sg->block_row * a->block_table_stride
                                 : NULL;
    int kv_read = it->kv_head;
    if (fault == AR_FAULT_WRONG_KV_HEAD) kv_read = (it->kv_head + 1) % Hkv;
    const int ntok = it->tok1 - it->tok0, rows = ntok * G;

    /* Visible key range of every token of the tile, and their union. */
    int kmin = INT_MAX, kmax = INT_MIN;
    for (int i = 0; i < ntok; i++) {
        int pos = a->token_pos[it->tok0 + i];
        int lo = sg->key_lo, hi = sg->key_hi;
        if (sg->causal) {
            int last = pos + 1 + (fault == AR_FAULT_CAUSAL_OFF_BY_ONE);
            if (last < hi) hi = last;
        }
        if (a->window > 0 && pos - a->window + 1 > lo) lo = pos - a->window + 1;
        c->tok_lo[i] = lo;
        c->tok_hi[i] = hi;
        if (lo < hi) {
            if (lo < kmin) kmin = lo;
            if (hi > kmax) kmax = hi;
        }
    }
    for (int row = 0; row < rows; row++) { c->row_max[row] = -INFINITY; c->row_sum[row] = 0.0f; }
    memset(c->acc, 0, sizeof(float) * (size_t)rows * Dv);

    for (int j0 = kmin; j0 < kmax; j0 += AR_CPU_KEY_TILE) {
        int j1 = j0 + AR_CPU_KEY_TILE < kmax ? j0 + AR_CPU_KEY_TILE : kmax;
        for (int j = j0; j < j1; j++) {
            int64_t slot = B > 0 ? (int64_t)block_row[j / B] * B + j % B
                                 : (int64_t)sg->row0 + (j - sg->key_lo);
            int64_t first = (slot * Hkv + kv_read) * stride;
            int64_t v_first = (slot * Hkv + kv_read) * v_stride;
            ar_cpu_load_row(a->kv_dtype, a->k_cache, first, D, a->kv_scale, c->k_row);
            for (int d = 0; d < D; d++) c->k_tile[(size_t)d * AR_CPU_KEY_TILE + (j - j0)] = c->k_row[d];
            ar_cpu_load_row(a->kv_dtype, a->v_cache, v_first, Dv, a->kv_scale,
                            c->v_tile + (size_t)(j - j0) * Dv);
        }
        for (int jj = j1 - j0; jj < AR_CPU_KEY_TILE; jj++)   /* a short last tile */
            for (int d = 0; d < D; d++) c->k_tile[(size_t)d * AR_CPU_KEY_TILE + jj] = 0.0f;
        for (int i = 0; i < ntok; i++) {
            int lo = c->tok_lo[i] > j0 ? c->tok_lo[i] : j0;
            int hi = c->tok_hi[i] < j1 ? c->tok_hi[i] : j1;
            if (lo >= hi) continue;
            int t = it->tok0 + i;
            for (int gh = 0; gh < G; gh++) {
                int h = it->kv_head * G + gh, row = i * G + gh;
                const float *q = a->q + ((size_t)t * Hq + h) * D;
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
                    sum += p;
                    ar_cpu_add_scaled(acc, c->v_tile + (size_t)(j - j0) * Dv, p, Dv);
                }
                c->row_sum[row] += sum;
            }
        }
    }

    /* Normalise, round, write out and LSE. */
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
            for (int d = 0; d < Dv; d++) out[d] = ar_round_to(a->out_dtype, acc[d] * inv);
            float lse = c->row_max[row] + logf(l);
            if (a->lse_base2) lse *= (float)M_LOG2E;
            a->lse[(size_t)h * T + t] = lse;
        }
    }
}

/* ---- merge ----------------------------------------------------------------------------- */

int ar_cpu_merge_items(const ar_cpu_merge *m)
{
    int n = m->tok1 - m->tok0;
    return n <= 0 ? 0 : (n + AR_CPU_TOKEN_TILE - 1) / AR_CPU_TOKEN_TILE;
}

void ar_cpu_merge_task(void *ctx, int item, int worker)
{
    (void)worker;
    const ar_cpu_merge *mc = ctx;
    const int H = mc->num_heads, Dv = mc->head_size, T = mc->lse_stride;
    int t0 = mc->tok0 + item * AR_CPU_TOKEN_TILE;
    int t1 = t0 + AR_CPU_TOKEN_TILE < mc->tok1 ? t0 + AR_CPU_TOKEN_TILE : mc->tok1;
    for (int t = t0; t < t1; t++) {
        for (int h = 0; h < H; h++) {
            size_t li = (size_t)h * T + t;
            float p = mc->a_lse[li], q = mc->b_lse[li];
            if (p == INFINITY) p = -INFINITY;
            if (q == INFINITY) q = -INFINITY;
            float m = p > q ? p : q;
            const float *ao = mc->a_out + ((size_t)t * H + h) * Dv;
            const float *bo = mc->b_out + ((size_t)t * H + h) * Dv;
            float *out = mc->out + ((size_t)t * H + h) * Dv;
            float lse;
            if (isnan(p) || isnan(q)) {
                for (int d = 0; d < Dv; d++) out[d] = NAN;
                lse = NAN;
            } else if (mc->no_weights) {
                for (int d = 0; d < Dv; d++) out[d] = ar_round_to(mc->out_dtype, ao[d] + bo[d]);
                lse = m == -INFINITY ? -INFINITY : m + logf(expf(p - m) + expf(q - m));
            } else if (m == -INFINITY) {
                if (out != ao) memcpy(out, ao, sizeof(float) * (size_t)Dv);
                lse = -INFINITY;
            } else {
                float wp = expf(p - m), ws = expf(q - m), S = wp + ws;
                float sp = wp / S, ss = ws / S;
                for (int d = 0; d < Dv; d++)
                    out[d] = ar_round_to(mc->out_dtype, ao[d] * sp + bo[d] * ss);
                lse = logf(S) + m;
            }
            if (mc->lse_base2) lse *= (float)M_LOG2E;
            mc->lse[li] = lse;
        }
    }
}

/* ---- per-step metadata ------------------------------------------------------------------ */

int ar_cpu_step_init(ar_cpu_step *st, int num_blocks, int block_size)
{
    memset(st, 0, sizeof *st);
    st->slots = (int64_t)num_blocks * block_size;
    st->slot_seen = calloc((size_t)(st->slots / 8 + 1), 1);
    return st->slot_seen ? 0 : -1;
}

void ar_cpu_step_free(ar_cpu_step *st)
{
    free(st->token_req);
    free(st->token_pos);
    free(st->slot_seen);
    memset(st, 0, sizeof *st);
}

int ar_cpu_step_prepare(ar_cpu_step *st, const ar_batch *b, int block_size, int num_blocks,
                        const char *who, char *err, size_t err_len)
{
    const int B = block_size;
    st->num_tokens = 0;
    if (b->num_reqs < 0 || b->num_tokens < 0) {
        snprintf(err, err_len, "%s: step %lld: negative num_reqs %d or num_tokens %d", who,
                 (long long)b->step, b->num_reqs, b->num_tokens);
        return 2;
    }
    if (b->num_reqs > 0 && (b->max_blocks_per_req <= 0 || !b->query_start_loc || !b->seq_lens ||
                            !b->context_lens || !b->block_table || !b->block_keys || !b->req_keys)) {
        snprintf(err, err_len, "%s: step %lld: batch arrays missing or "
                 "max_blocks_per_req %d <= 0", who, (long long)b->step, b->max_blocks_per_req);
        return 2;
    }
    if (b->num_tokens > 0 && !b->slot_mapping) {
        snprintf(err, err_len, "%s: step %lld: slot_mapping missing", who, (long long)b->step);
        return 2;
    }
    if (b->num_reqs > 0 && (b->query_start_loc[0] != 0 ||
                            b->query_start_loc[b->num_reqs] != b->num_tokens)) {
        snprintf(err, err_len, "%s: step %lld: query_start_loc must run from 0 to "
                 "num_tokens %d", who, (long long)b->step, b->num_tokens);
        return 2;
    }
    if (b->num_reqs == 0 && b->num_tokens != 0) {
        snprintf(err, err_len, "%s: step %lld: %d tokens but no requests", who,
                 (long long)b->step, b->num_tokens);
        return 2;
    }
    int T = b->num_tokens;
    if (T > st->cap_tokens) {
        int *req = realloc(st->token_req, sizeof(int) * (size_t)T);
        if (req) st->token_req = req;
        int *pos = realloc(st->token_pos, sizeof(int) * (size_t)T);
        if (pos) st->token_pos = pos;
        if (!req || !pos) goto oom;
        st->cap_tokens = T;
    }
    int min_context = INT_MAX;
    for (int r = 0; r < b->num_reqs; r++) {
        int q0 = b->query_start_loc[r], q1 = b->query_start_loc[r + 1];
        int seq = b->seq_lens[r], ctx = b->context_lens[r];
        if (q1 < q0 || q1 > T) {
            snprintf(err, err_len, "%s: step %lld: request %d: query_start_loc not "
                     "non-decreasing within [0, %d]", who, (long long)b->step, r, T);
            return 2;
        }
        if (ctx < 0 || seq != ctx + (q1 - q0)) {
            snprintf(err, err_len, "%s: step %lld: request %d: seq_len %d != context "
                     "%d + query_len %d", who, (long long)b->step, r, seq, ctx, q1 - q0);
            return 2;
        }
        if ((int64_t)seq > (int64_t)b->max_blocks_per_req * B) {
            snprintf(err, err_len, "%s: step %lld: request %d: seq_len %d needs more "
                     "than max_blocks_per_req %d blocks of %d", who, (long long)b->step, r, seq,
                     b->max_blocks_per_req, B);
            return 2;
        }
        int used_blocks = (seq + B - 1) / B;
        for (int i = 0; i < used_blocks; i++) {
            int blk = b->block_table[(int64_t)r * b->max_blocks_per_req + i];
            if (blk < 0 || blk >= num_blocks) {
                snprintf(err, err_len, "%s: step %lld: request %d: block_table[%d] = %d "
                         "outside [0, %d)", who, (long long)b->step, r, i, blk, num_blocks);
                return 2;
            }
        }
        for (int t = q0; t < q1; t++) {
            st->token_req[t] = r;
            st->token_pos[t] = ctx + (t - q0);
        }
        if (ctx < min_context) min_context = ctx;
    }
    /* Slots: in range, and note whether two tokens write the same one. */
    st->duplicate_slots = 0;
    for (int t = 0; t < T; t++) {
        int64_t slot = b->slot_mapping[t];
        if (slot == -1) continue;
        if (slot < 0 || slot >= st->slots) {
            snprintf(err, err_len, "%s: step %lld: slot_mapping[%d] = %lld outside "
                     "[0, %lld) and not -1", who, (long long)b->step, t, (long long)slot,
                     (long long)st->slots);
            for (int u = 0; u < t; u++)        /* leave the bitmap clean */
                if (b->slot_mapping[u] >= 0)
                    st->slot_seen[b->slot_mapping[u] >> 3] = 0;
            return 2;
        }
        unsigned char bit = (unsigned char)(1u << (slot & 7));
        if (st->slot_seen[slot >> 3] & bit) st->duplicate_slots = 1;
        st->slot_seen[slot >> 3] |= bit;
    }
    for (int t = 0; t < T; t++)
        if (b->slot_mapping[t] >= 0) st->slot_seen[b->slot_mapping[t] >> 3] = 0;

    st->min_context = min_context;
    int P = b->common_prefix_len;
    if (P < 0 || (P > 0 && (P % B != 0 || b->num_reqs == 0 || P > min_context))) {
        snprintf(err, err_len, "%s: step %lld: common_prefix_len %d must be a multiple "
                 "of block_size %d and at most the smallest context %d", who,
                 (long long)b->step, P, B, b->num_reqs ? min_context : 0);
        return 2;
    }
    st->num_tokens = T;
    return 0;
oom:
    snprintf(err, err_len, "%s: step %lld: out of memory for step metadata (%d tokens)", who,
             (long long)b->step, b->num_tokens);
    return 3;
}


/* ---- helpers both CPU backends use ------------------------------------------------------ */

bool ar_cpu_check_run(const ar_run_config *cfg, char *why, size_t why_len)
{
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
    snprintf(why, why_len, "supported");
    return true;
}

int ar_cpu_check_forward(const ar_cpu_step *st, int prepared, int64_t prepared_step,
                         const ar_batch *b, int layer, int num_layers, const char *who,
                         char *err, size_t err_len)
{
    if (!prepared || prepared_step != b->step || st->num_tokens != b->num_tokens) {
        snprintf(err, err_len, "%s: step %lld: forward without prepare() of this batch", who,
                 (long long)b->step);
        return 2;
    }
    if (layer < 0 || layer >= num_layers) {
        snprintf(err, err_len, "%s: step %lld: layer %d outside [0, %d)", who,
                 (long long)b->step, layer, num_layers);
        return 2;
    }
    return 0;
}

int ar_cpu_check_fill(const ar_fill *f, int layer, int num_layers, int64_t slots, int block_size,
                      const char *who, char *err, size_t err_len)
{
    if (layer < 0 || layer >= num_layers) {
        snprintf(err, err_len, "%s: fill: layer %d outside [0, %d)", who, layer, num_layers);
        return 2;
    }
    if (f->count > 0 && (!f->slots || !f->keys || !f->offsets)) {
        snprintf(err, err_len, "%s: fill: %d entries but arrays missing", who, f->count);
        return 2;
    }
    for (int i = 0; i < f->count; i++) {
        if (f->slots[i] < 0 || f->slots[i] >= slots || f->offsets[i] < 0 ||
            f->offsets[i] >= block_size) {
            snprintf(err, err_len, "%s: fill: entry %d: slot %lld outside [0, %lld) or offset "
                     "%d outside [0, %d)", who, i, (long long)f->slots[i], (long long)slots,
                     f->offsets[i], block_size);
            return 2;
        }
    }
    return 0;
}

void ar_cpu_device_name(int threads, char *buf, size_t len)
{
    snprintf(buf, len, "cpu (%d thread%s)", threads, threads == 1 ? "" : "s");
}

int ar_cpu_tile_end(int t0, int n)
{
    return t0 + AR_CPU_TOKEN_TILE < n ? t0 + AR_CPU_TOKEN_TILE : n;
}

int ar_cpu_resize_floats(float **p, size_t n)
{
    float *q = realloc(*p, sizeof(float) * (n ? n : 1));
    if (!q) return -1;
    *p = q;
    return 0;
}

void ar_cpu_report_times(const double *times, int repeat, int num_kernels,
                         const char *const *names, const int *used, ar_forward_out *o)
{
    double small[64];
    double *col = repeat <= 64 ? small : malloc(sizeof(double) * (size_t)repeat);
    int n = repeat;
    if (!col) { col = small; n = 64; }      /* no memory: the median of the first 64 */
    o->num_kernels = 0;
    for (int k = 0; k <= num_kernels; k++) {
        if (k < num_kernels && !used[k]) continue;
        for (int rep = 0; rep < n; rep++) col[rep] = times[(size_t)rep * (num_kernels + 1) + k];
        double med = ar_cpu_median(col, n);
        if (k == num_kernels) {
            o->total_us = med;
        } else if (o->num_kernels < AR_MAX_KERNELS) {
            o->kernels[o->num_kernels].name = names[k];
            o->kernels[o->num_kernels].us = med;
            o->num_kernels++;
        }
    }
    o->guard_violations = 0;
    if (col != small) free(col);
}

int ar_cpu_check_memory(size_t bytes, const char *who, char *err, size_t err_len)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    fclose(f);
    if (kib == 0 || bytes / 1024 <= kib) return 0;
    snprintf(err, err_len, "%s: the KV cache needs %zu bytes but only %llu bytes of memory are "
             "available (lower num_blocks or --layers)", who, bytes, kib * 1024ull);
    return 3;
}
