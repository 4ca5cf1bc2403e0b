/* verify.c - per-step verification against the float64 reference (see verify.h for the rule).
 *
 * Work is split by request across threads; each request regenerates its query rows and its
 * visible keys in logical order from the generator, runs the reference and the naive same-dtype
 * twin chunk by chunk, and compares.  Partial results are reduced at the end. */
#include "verify.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../reference/mla_ref.h"
#include "../reference/reference.h"

typedef struct req_check {
    /* inputs */
    const ar_run_config *cfg;
    const ar_batch *b;
    const ar_verify_opts *opts;
    const char *const *req_ids;
    int layer, r;
    const float *out, *lse;
    /* outputs */
    int rows;
    int64_t elems;
    double max_abs, max_rel, sum_abs, sum_sq_err, sum_sq_ref, lse_max;
    double naive_max, naive_sum_abs, naive_lse_max;
    int64_t bad;
    int num_worst;
    ar_worst worst[AR_VERIFY_WORST];
    int failed;               /* out of memory or I/O */
    char err[256];
} req_check;

static void fixed_tolerance(ar_dtype t, double *atol, double *rtol)
{
    switch (t) {
    case AR_BF16: *atol = 1.5e-2; *rtol = 1e-2; break;
    case AR_FP16: *atol = 1e-3; *rtol = 1e-3; break;
    case AR_FP8_E4M3: *atol = 1.5e-1; *rtol = 1.5e-1; break;
    default: *atol = 1e-5; *rtol = 1e-5; break;
    }
}

/* Rows of request r to check: all, or an even spread that always includes the last row. */
static int choose_rows(const ar_verify_opts *o, int n, int total_tokens, int *rows)
{
    if (o->mode == AR_VERIFY_ALL || o->sample_rows <= 0) {
        for (int i = 0; i < n; i++) rows[i] = i;
        return n;
    }
    long want = (long)o->sample_rows * n / (total_tokens > 0 ? total_tokens : 1);
    if (want < 1) want = 1;
    if (want > n) want = n;
    int count = 0;
    for (long j = 0; j < want; j++) {
        /* evenly spaced from the end: n-1, ... */
        int row = (int)(n - 1 - (j * n) / want);
        if (count == 0 || rows[count - 1] != row) rows[count++] = row;
    }
    /* ascending order */
    for (int i = 0; i < count / 2; i++) {
        int t = rows[i];
        rows[i] = rows[count - 1 - i];
        rows[count - 1 - i] = t;
    }
    return count;
}

static float q_value(const ar_run_config *c, int layer, uint64_t req_key, int pos, int h, int d)
{
    uint64_t row = ar_gen_row(c->seed, AR_STREAM_Q, (uint32_t)layer, req_key, (uint64_t)pos,
                              (uint32_t)h);
    return ar_gen(row, (uint32_t)d, c->data, c->dtype);
}

/* K and V of positions [k0, k1) of request r, logical order, as they read back from the cache.
 *   kd, vd [k1-k0, Hkv, D] double;  kf, vf the same in float. */
static void gather_kv(const ar_run_config *c, const ar_batch *b, int layer, int r, int k0, int k1,
                      double *kd, double *vd, float *kf, float *vf)
{
    const int hkv = c->model.num_kv_heads, dim = c->model.head_size, bs = c->block_size;
    const float scale = (float)c->kv_scale;
    for (int pos = k0; pos < k1; pos++) {
        uint64_t key = b->block_keys[(size_t)r * b->max_blocks_per_req + pos / bs];
        int off = pos % bs;
        for (int h = 0; h < hkv; h++) {
            uint64_t rk = ar_gen_row(c->seed, AR_STREAM_K, (uint32_t)layer, key, (uint64_t)off,
                                     (uint32_t)h);
            uint64_t rv = ar_gen_row(c->seed, AR_STREAM_V, (uint32_t)layer, key, (uint64_t)off,
                                     (uint32_t)h);
            size_t base = ((size_t)(pos - k0) * hkv + h) * dim;
            for (int d = 0; d < dim; d++) {
                float kx = ar_kv_roundtrip(c->kv_dtype, c->dtype, scale,
                                           ar_gen(rk, (uint32_t)d, c->data, c->dtype));
                float vx = ar_kv_roundtrip(c->kv_dtype, c->dtype, scale,
                                           ar_gen(rv, (uint32_t)d, c->data, c->dtype));
                kf[base + d] = kx;
                vf[base + d] = vx;
                kd[base + d] = kx;
                vd[base + d] = vx;
            }
        }
    }
}

static void note_worst(req_check *w, int token, int head, int dim, double got, double want,
                       double err)
{
    if (w->num_worst == AR_VERIFY_WORST && !(err > w->worst[AR_VERIFY_WORST - 1].err)) return;
    int i = w->num_worst < AR_VERIFY_WORST ? w->num_worst++ : AR_VERIFY_WORST - 1;
    while (i > 0 && !(w->worst[i - 1].err >= err)) {
        w->worst[i] = w->worst[i - 1];
        i--;
    }
    w->worst[i] = (ar_worst){w->r, token, head, dim, got, want, err};
}

static double lse_diff(double a, double b)
{
    if (isinf(a) && isinf(b) && (a < 0) == (b < 0)) return 0;
    double d = fabs(a - b);
    return isnan(d) ? INFINITY : d;
}

/* Folds chunk results (c_out, c_lse) into the running (acc_out, acc_lse). */
static void fold(int rows, int heads, int dv, bool first, double *acc_out, double *acc_lse,
                 const double *c_out, const double *c_lse, double *tmp_out, double *tmp_lse)
{
    size_t no = (size_t)rows * heads * dv, nl = (size_t)heads * rows;
    if (first) {
        memcpy(acc_out, c_out, no * sizeof *acc_out);
        memcpy(acc_lse, c_lse, nl * sizeof *acc_lse);
        return;
    }
    ar_ref_merge(rows, heads, dv, acc_out, acc_lse, c_out, c_lse, tmp_out, tmp_lse);
    memcpy(acc_out, tmp_out, no * sizeof *acc_out);
    memcpy(acc_lse, tmp_lse, nl * sizeof *acc_lse);
}

static int dump_request(const req_check *w, int n, int s, const int *rows, int nrows,
                        const double *ref_out, const double *ref_lse);

/* Compares the backend's rows of request w->r with the reference and the naive twin.
 *   rows [nrows] query rows within the request; ref_o, nv_o [nrows, heads, dv];
 *   ref_l, nv_l [heads, nrows]. */
static void compare_rows(req_check *w, int nrows, const int *rows, int heads, int dv,
                         const double *ref_o, const double *ref_l, const double *nv_o,
                         const double *nv_l)
{
    const ar_dtype dt = w->cfg->dtype;
    const int q0 = w->b->query_start_loc[w->r], num_tokens = w->b->num_tokens;
    double atol, rtol;
    fixed_tolerance(dt, &atol, &rtol);
    for (int i = 0; i < nrows; i++) {
        int t = q0 + rows[i];
        for (int h = 0; h < heads; h++) {
            for (int d = 0; d < dv; d++) {
                double got = w->out[((size_t)t * heads + h) * dv + d];
                double want = ref_o[((size_t)i * heads + h) * dv + d];
                double naive = ar_round_to(dt, (float)nv_o[((size_t)i * heads + h) * dv + d]);
                double e = fabs(got - want);
                if (isnan(e)) e = INFINITY;
                double ne = fabs(naive - want);
                w->elems++;
                w->sum_abs += e;
                w->sum_sq_err += e * e;
                w->sum_sq_ref += want * want;
                w->naive_sum_abs += ne;
                if (ne > w->naive_max) w->naive_max = ne;
                double rel = e / (fabs(want) > 1e-3 ? fabs(want) : 1e-3);
                if (rel > w->max_rel) w->max_rel = rel;
                if (e > atol + rtol * fabs(want)) w->bad++;
                if (e > w->max_abs) w->max_abs = e;
                note_worst(w, rows[i], h, d, got, want, e);
            }
            double gl = w->lse[(size_t)h * num_tokens + t];
            double rl = ref_l[(size_t)h * nrows + i];
            double le = lse_diff(gl, rl), nle = lse_diff(nv_l[(size_t)h * nrows + i], rl);
            if (le > w->lse_max) w->lse_max = le;
            if (nle > w->naive_lse_max) w->naive_lse_max = nle;
        }
    }
    w->rows = nrows;
}

static void check_request(req_check *w)
{
    const ar_run_config *c = w->cfg;
    const ar_batch *b = w->b;
    const int r = w->r, layer = w->layer;
    const int hq = c->model.num_q_heads, hkv = c->model.num_kv_heads;
    const int dim = c->model.head_size, dv = c->model.head_size;
    const int q0 = b->query_start_loc[r], n = b->query_start_loc[r + 1] - q0;
    const int ctx = b->context_lens[r], s = b->seq_lens[r];
    const int win = c->model.sliding_window;
    if (n <= 0) return;

    int *rows = malloc((size_t)n * sizeof *rows);
    int *qpos = malloc((size_t)n * sizeof *qpos);
    if (!rows || !qpos) goto oom;
    int nrows = choose_rows(w->opts, n, b->num_tokens, rows);
    for (int i = 0; i < nrows; i++) qpos[i] = ctx + rows[i];
    int kmin = 0, kmax = qpos[nrows - 1] + 1;   /* keys [kmin, kmax) are visible to some row */
    if (win > 0 && qpos[0] - win + 1 > 0) kmin = qpos[0] - win + 1;
    if (kmax > s) kmax = s;

    ar_attn_params p = {hq, hkv, dim, dv, c->model.scale, win, c->model.logits_soft_cap, true};
    size_t nq = (size_t)nrows * hq * dim, no = (size_t)nrows * hq * dv, nl = (size_t)hq * nrows;
    int chunk = AR_VERIFY_KEY_CHUNK;
    size_t nk = (size_t)chunk * hkv * dim;
    double *qd = malloc(nq * sizeof *qd), *kd = malloc(nk * sizeof *kd), *vd = malloc(nk * sizeof *vd);
    float *qf = malloc(nq * sizeof *qf), *kf = malloc(nk * sizeof *kf), *vf = malloc(nk * sizeof *vf);
    double *ref_o = malloc(no * sizeof *ref_o), *ref_l = malloc(nl * sizeof *ref_l);
    double *nv_o = malloc(no * sizeof *nv_o), *nv_l = malloc(nl * sizeof *nv_l);
    double *c_o = malloc(no * sizeof *c_o), *c_l = malloc(nl * sizeof *c_l);
    double *t_o = malloc(no * sizeof *t_o), *t_l = malloc(nl * sizeof *t_l);
    float *cf_o = malloc(no * sizeof *cf_o), *cf_l = malloc(nl * sizeof *cf_l);
    if (!qd || !kd || !vd || !qf || !kf || !vf || !ref_o || !ref_l || !nv_o || !nv_l || !c_o ||
        !c_l || !t_o || !t_l || !cf_o || !cf_l) {
        free(qd); free(kd); free(vd); free(qf); free(kf); free(vf); free(ref_o); free(ref_l);
        free(nv_o); free(nv_l); free(c_o); free(c_l); free(t_o); free(t_l); free(cf_o); free(cf_l);
        goto oom;
    }
    for (int i = 0; i < nrows; i++)
        for (int h = 0; h < hq; h++)
            for (int d = 0; d < dim; d++) {
                float x = q_value(c, layer, b->req_keys[r], qpos[i], h, d);
                size_t at = ((size_t)i * hq + h) * dim + d;
                qf[at] = x;
                qd[at] = x;
            }

    bool first = true;
    if (kmax <= kmin) { /* no visible key at all (cannot happen in a valid trace) */
        for (size_t i = 0; i < no; i++) ref_o[i] = nv_o[i] = 0;
        for (size_t i = 0; i < nl; i++) ref_l[i] = nv_l[i] = -INFINITY;
    }
    for (int k0 = kmin; k0 < kmax; k0 += chunk) {
        int k1 = k0 + chunk < kmax ? k0 + chunk : kmax;
        gather_kv(c, b, layer, r, k0, k1, kd, vd, kf, vf);
        ar_ref_attend(&p, nrows, qd, qpos, k1 - k0, k0, kd, vd, c_o, c_l);
        fold(nrows, hq, dv, first, ref_o, ref_l, c_o, c_l, t_o, t_l);
        ar_naive_dtype_attend(&p, c->dtype, nrows, qf, qpos, k1 - k0, k0, kf, vf, cf_o, cf_l);
        for (size_t i = 0; i < no; i++) c_o[i] = cf_o[i];
        for (size_t i = 0; i < nl; i++) c_l[i] = cf_l[i];
        fold(nrows, hq, dv, first, nv_o, nv_l, c_o, c_l, t_o, t_l);
        first = false;
    }

    compare_rows(w, nrows, rows, hq, dv, ref_o, ref_l, nv_o, nv_l);
    if (w->opts->dump_dir && dump_request(w, n, s, rows, nrows, ref_o, ref_l) != 0) w->failed = 1;

    free(qd); free(kd); free(vd); free(qf); free(kf); free(vf); free(ref_o); free(ref_l);
    free(nv_o); free(nv_l); free(c_o); free(c_l); free(t_o); free(t_l); free(cf_o); free(cf_l);
    free(rows);
    free(qpos);
    return;
oom:
    free(rows);
    free(qpos);
    w->failed = 1;
    snprintf(w->err, sizeof w->err, "out of memory verifying request %d", r);
}


/* ---- MLA ------------------------------------------------------------------------------------ */

/* One layer's W_UK [L, N, P] and W_UV [L, N, V] as doubles, generated once per (seed, layer,
 * data, dtype) and kept for the run (filled before the worker threads start). */
#define MLA_WEIGHT_SLOTS 8
static struct mla_weights_slot {
    bool used;
    uint64_t seed;
    int layer, heads;
    ar_datadist dist;
    ar_dtype dtype;
    double *uk, *uv;
} mla_weights[MLA_WEIGHT_SLOTS];

static const struct mla_weights_slot *mla_weights_for(const ar_run_config *c, int layer)
{
    int free_slot = -1;
    for (int i = 0; i < MLA_WEIGHT_SLOTS; i++) {
        struct mla_weights_slot *w = &mla_weights[i];
        if (w->used && w->seed == c->seed && w->layer == layer && w->dist == c->data &&
            w->dtype == c->dtype && w->heads == c->model.num_q_heads)
            return w;
        if (!w->used && free_slot < 0) free_slot = i;
    }
    if (free_slot < 0) free_slot = layer % MLA_WEIGHT_SLOTS;
    struct mla_weights_slot *w = &mla_weights[free_slot];
    free(w->uk);
    free(w->uv);
    memset(w, 0, sizeof *w);
    const ar_model *m = &c->model;
    size_t nuk = (size_t)m->kv_lora_rank * m->num_q_heads * m->qk_nope_head_dim;
    size_t nuv = (size_t)m->kv_lora_rank * m->num_q_heads * m->v_head_dim;
    w->uk = malloc(nuk * sizeof *w->uk);
    w->uv = malloc(nuv * sizeof *w->uv);
    if (!w->uk || !w->uv) {
        free(w->uk);
        free(w->uv);
        w->uk = w->uv = NULL;
        return NULL;
    }
    ar_mla_dims d = {m->num_q_heads, m->kv_lora_rank, m->qk_rope_head_dim, m->qk_nope_head_dim,
                     m->v_head_dim, m->scale};
    ar_mla_gen_weights(&d, c->seed, (uint32_t)layer, c->data, c->dtype, w->uk, w->uv);
    w->used = true;
    w->seed = c->seed;
    w->layer = layer;
    w->heads = m->num_q_heads;
    w->dist = c->data;
    w->dtype = c->dtype;
    return w;
}

/* The MLA yardstick: the absorbed data path with the roundings any dtype implementation
 * makes - ql = W_UK q_nope rounded to dtype, softmax probabilities rounded to dtype before
 * P.V, the latent output rounded to dtype before W_UV, the output rounded to dtype; sums in
 * double.  Its error against the expanded float64 reference is the yardstick of the pass rule.
 *   q_nope [rows, N, P], q_pe [rows, N, R], latent [keys, L + R], out [rows, N, V], lse [N, rows] */
static int mla_naive_absorbed(const ar_mla_dims *d, ar_dtype t, int rows, const double *q_nope,
                              const double *q_pe, const int *q_pos, int num_keys,
                              const double *latent, const double *w_uk, const double *w_uv,
                              double *out, double *lse)
{
    const int N = d->num_heads, L = d->kv_lora_rank, R = d->qk_rope_head_dim;
    const int P = d->qk_nope_head_dim, V = d->v_head_dim, E = L + R;
    double *ql = malloc((size_t)L * sizeof *ql), *s = malloc((size_t)(num_keys + 1) * sizeof *s);
    double *olat = malloc((size_t)L * sizeof *olat);
    if (!ql || !s || !olat) {
        free(ql); free(s); free(olat);
        return -1;
    }
    for (int i = 0; i < rows; i++) {
        int visible = q_pos[i] + 1 < num_keys ? q_pos[i] + 1 : num_keys;
        for (int n = 0; n < N; n++) {
            const double *qn = q_nope + ((size_t)i * N + n) * P, *qp = q_pe + ((size_t)i * N + n) * R;
            for (int l = 0; l < L; l++) {
                double acc = 0;
                const double *wk = w_uk + ((size_t)l * N + n) * P;
                for (int c = 0; c < P; c++) acc += wk[c] * qn[c];
                ql[l] = ar_round_to(t, (float)acc);
            }
            double mx = -INFINITY;
            for (int j = 0; j < visible; j++) {
                const double *e = latent + (size_t)j * E;
                double acc = 0;
                for (int l = 0; l < L; l++) acc += ql[l] * e[l];
                for (int r = 0; r < R; r++) acc += qp[r] * e[L + r];
                s[j] = d->scale * acc;
                if (s[j] > mx) mx = s[j];
            }
            double sum = 0;
            for (int j = 0; j < visible; j++) sum += exp(s[j] - mx);
            for (int l = 0; l < L; l++) olat[l] = 0;
            for (int j = 0; j < visible; j++) {
                double p = ar_round_to(t, (float)(exp(s[j] - mx) / sum));
                const double *e = latent + (size_t)j * E;
                for (int l = 0; l < L; l++) olat[l] += p * e[l];
            }
            for (int l = 0; l < L; l++) olat[l] = ar_round_to(t, (float)olat[l]);
            for (int v = 0; v < V; v++) {
                double acc = 0;
                for (int l = 0; l < L; l++) acc += olat[l] * w_uv[((size_t)l * N + n) * V + v];
                out[((size_t)i * N + n) * V + v] = visible ? ar_round_to(t, (float)acc) : 0;
            }
            lse[(size_t)n * rows + i] = visible ? mx + log(sum) : -INFINITY;
        }
    }
    free(ql); free(s); free(olat);
    return 0;
}

static void check_request_mla(req_check *w, const struct mla_weights_slot *wts)
{
    const ar_run_config *c = w->cfg;
    const ar_batch *b = w->b;
    const ar_model *m = &c->model;
    const int r = w->r, layer = w->layer;
    const int N = m->num_q_heads, L = m->kv_lora_rank, R = m->qk_rope_head_dim;
    const int P = m->qk_nope_head_dim, V = m->v_head_dim, E = L + R;
    const int q0 = b->query_start_loc[r], n = b->query_start_loc[r + 1] - q0;
    const int ctx = b->context_lens[r], s = b->seq_lens[r], bs = c->block_size;
    ar_mla_dims d = {N, L, R, P, V, m->scale};
    int *rows = malloc((size_t)n * sizeof *rows), *qpos = malloc((size_t)n * sizeof *qpos);
    double *qn = NULL, *qp = NULL, *lat = NULL, *ref_o = NULL, *ref_l = NULL, *nv_o = NULL, *nv_l = NULL;
    if (!rows || !qpos) goto oom;
    int nrows = choose_rows(w->opts, n, b->num_tokens, rows);
    for (int i = 0; i < nrows; i++) qpos[i] = ctx + rows[i];
    int keys = qpos[nrows - 1] + 1 < s ? qpos[nrows - 1] + 1 : s;
    qn = malloc((size_t)nrows * N * P * sizeof *qn);
    qp = malloc((size_t)nrows * N * R * sizeof *qp);
    lat = malloc((size_t)keys * E * sizeof *lat);
    ref_o = malloc((size_t)nrows * N * V * sizeof *ref_o);
    nv_o = malloc((size_t)nrows * N * V * sizeof *nv_o);
    ref_l = malloc((size_t)N * nrows * sizeof *ref_l);
    nv_l = malloc((size_t)N * nrows * sizeof *nv_l);
    if (!qn || !qp || !lat || !ref_o || !nv_o || !ref_l || !nv_l) goto oom;
    for (int i = 0; i < nrows; i++)
        for (int h = 0; h < N; h++) {
            uint64_t rn = ar_gen_row(c->seed, AR_STREAM_Q_NOPE, (uint32_t)layer, b->req_keys[r],
                                     (uint64_t)qpos[i], (uint32_t)h);
            uint64_t rp = ar_gen_row(c->seed, AR_STREAM_Q_PE, (uint32_t)layer, b->req_keys[r],
                                     (uint64_t)qpos[i], (uint32_t)h);
            for (int k = 0; k < P; k++) qn[((size_t)i * N + h) * P + k] = ar_gen(rn, (uint32_t)k, c->data, c->dtype);
            for (int k = 0; k < R; k++) qp[((size_t)i * N + h) * R + k] = ar_gen(rp, (uint32_t)k, c->data, c->dtype);
        }
    for (int pos = 0; pos < keys; pos++) {
        uint64_t key = b->block_keys[(size_t)r * b->max_blocks_per_req + pos / bs];
        uint64_t rl = ar_gen_row(c->seed, AR_STREAM_LATENT, (uint32_t)layer, key, (uint64_t)(pos % bs), 0);
        for (int k = 0; k < E; k++)
            lat[(size_t)pos * E + k] = ar_kv_roundtrip(c->kv_dtype, c->dtype, (float)c->kv_scale,
                                                       ar_gen(rl, (uint32_t)k, c->data, c->dtype));
    }
    if (ar_mla_ref_attend(&d, nrows, qn, qp, qpos, keys, lat, wts->uk, wts->uv, ref_o, ref_l) != 0 ||
        mla_naive_absorbed(&d, c->dtype, nrows, qn, qp, qpos, keys, lat, wts->uk, wts->uv, nv_o, nv_l) != 0)
        goto oom;
    compare_rows(w, nrows, rows, N, V, ref_o, ref_l, nv_o, nv_l);
    free(rows); free(qpos); free(qn); free(qp); free(lat); free(ref_o); free(ref_l); free(nv_o); free(nv_l);
    return;
oom:
    free(rows); free(qpos); free(qn); free(qp); free(lat); free(ref_o); free(ref_l); free(nv_o); free(nv_l);
    w->failed = 1;
    snprintf(w->err, sizeof w->err, "out of memory verifying MLA request %d", r);
}

/* ---- dumping a step as .npy ------------------------------------------------------------- */

int ar_write_npy(const char *path, const void *data, bool is_double, int ndim, const int64_t *shape)
{
    char dict[256], shp[128] = "";
    size_t used = 0;
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        used += (size_t)snprintf(shp + used, sizeof shp - used, "%lld,%s", (long long)shape[i],
                                 i + 1 < ndim ? " " : "");
        count *= shape[i];
    }
    int len = snprintf(dict, sizeof dict, "{'descr': '<%s', 'fortran_order': False, 'shape': (%s), }",
                       is_double ? "f8" : "f4", shp);
    int total = 10 + len + 1;
    int pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    unsigned char magic[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, 0, 0};
    int hlen = len + pad + 1;
    magic[8] = (unsigned char)(hlen & 0xff);
    magic[9] = (unsigned char)(hlen >> 8);
    bool ok = fwrite(magic, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)len, f) == (size_t)len;
    for (int i = 0; i < pad && ok; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    size_t es = is_double ? 8 : 4;
    ok = ok && fwrite(data, es, (size_t)count, f) == (size_t)count;
    if (fclose(f) != 0) ok = false;
    return ok ? 0 : -1;
}

static int dump_request(const req_check *w, int n, int s, const int *rows, int nrows,
                        const double *ref_out, const double *ref_lse)
{
    const ar_run_config *c = w->cfg;
    const ar_batch *b = w->b;
    const int hq = c->model.num_q_heads, hkv = c->model.num_kv_heads, dim = c->model.head_size;
    const int r = w->r, q0 = b->query_start_loc[r], ctx = b->context_lens[r];
    (void)rows;
    if (nrows != n) return -1;   /* the dump step is verified in full */
    char path[1200];
    size_t nq = (size_t)n * hq * dim, nk = (size_t)s * hkv * dim;
    float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
    double *kd = malloc(nk * sizeof *kd), *vd = malloc(nk * sizeof *vd);
    float *lse = malloc((size_t)hq * n * sizeof *lse);
    int rc = -1;
    if (!q || !k || !v || !kd || !vd || !lse) goto done;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < hq; h++)
            for (int d = 0; d < dim; d++)
                q[((size_t)i * hq + h) * dim + d] = q_value(c, w->layer, b->req_keys[r], ctx + i, h, d);
    gather_kv(c, b, w->layer, r, 0, s, kd, vd, k, v);
    for (int h = 0; h < hq; h++)
        for (int i = 0; i < n; i++) lse[(size_t)h * n + i] = w->lse[(size_t)h * b->num_tokens + q0 + i];
    int64_t sq[3] = {n, hq, dim}, sk[3] = {s, hkv, dim}, sl[2] = {hq, n};
    const float *out = w->out + (size_t)q0 * hq * dim;
    const char *dir = w->opts->dump_dir;
#define DUMP(name, data, dbl, nd, shape)                                                   \
    do {                                                                                   \
        snprintf(path, sizeof path, "%s/L%d_r%d_%s.npy", dir, w->layer, r, name);          \
        if (ar_write_npy(path, data, dbl, nd, shape) != 0) goto done;                      \
    } while (0)
    DUMP("q", q, false, 3, sq);
    DUMP("k", k, false, 3, sk);
    DUMP("v", v, false, 3, sk);
    DUMP("out", out, false, 3, sq);
    DUMP("lse", lse, false, 2, sl);
    DUMP("ref_out", ref_out, true, 3, sq);
    DUMP("ref_lse", ref_lse, true, 2, sl);
#undef DUMP
    rc = 0;
done:
    free(q); free(k); free(v); free(kd); free(vd); free(lse);
    return rc;
}

/* index.json: one JSON document for the dumped step (shapes, dtypes, file names, requests) with
 * the list of layers dumped so far; layer 0 writes it, every later layer adds itself. */
static int write_dump_index(const ar_run_config *c, const ar_batch *b, int layer,
                            const char *const *ids, const char *dir, char *err, size_t err_len)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/index.json", dir);
    json_t *doc = NULL;
    if (layer > 0) {
        json_error_t jerr;
        doc = json_load_file(path, 0, &jerr);
        if (!doc || !json_is_array(json_object_get(doc, "layers"))) {
            snprintf(err, err_len, "%s: cannot read back the dump index: %s", path, doc ? "no layers" : jerr.text);
            json_decref(doc);
            return -1;
        }
    } else {
        doc = json_object();
        json_object_set_new(doc, "step", json_integer((json_int_t)b->step));
        json_object_set_new(doc, "num_q_heads", json_integer(c->model.num_q_heads));
        json_object_set_new(doc, "num_kv_heads", json_integer(c->model.num_kv_heads));
        json_object_set_new(doc, "head_size", json_integer(c->model.head_size));
        json_object_set_new(doc, "scale", json_real(c->model.scale));
        json_object_set_new(doc, "sliding_window", json_integer(c->model.sliding_window));
        json_object_set_new(doc, "soft_cap", json_real(c->model.logits_soft_cap));
        json_object_set_new(doc, "dtype", json_string(ar_dtype_name(c->dtype)));
        json_object_set_new(doc, "kv_dtype", json_string(ar_dtype_name(c->kv_dtype)));
        json_object_set_new(doc, "files", json_string("L<layer>_r<i>_{q,k,v,out,lse,ref_out,ref_lse}.npy"));
        json_t *layout = json_object();
        json_object_set_new(layout, "q", json_string("[n, Hq, D]"));
        json_object_set_new(layout, "k", json_string("[seq_len, Hkv, D] logical order"));
        json_object_set_new(layout, "out", json_string("[n, Hq, D] backend"));
        json_object_set_new(layout, "lse", json_string("[Hq, n] natural log"));
        json_object_set_new(doc, "layout", layout);
        json_t *reqs = json_array();
        for (int r = 0; r < b->num_reqs; r++) {
            json_t *q = json_object();
            json_object_set_new(q, "i", json_integer(r));
            json_object_set_new(q, "req", json_string(ids[r]));
            json_object_set_new(q, "context", json_integer(b->context_lens[r]));
            json_object_set_new(q, "new", json_integer(b->query_start_loc[r + 1] - b->query_start_loc[r]));
            json_object_set_new(q, "seq_len", json_integer(b->seq_lens[r]));
            json_array_append_new(reqs, q);
        }
        json_object_set_new(doc, "requests", reqs);
        json_object_set_new(doc, "layers", json_array());
    }
    json_array_append_new(json_object_get(doc, "layers"), json_integer(layer));
    int rc = json_dump_file(doc, path, JSON_INDENT(2));
    json_decref(doc);
    if (rc != 0) {
        snprintf(err, err_len, "%s: write failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- driver ------------------------------------------------------------------------------ */

typedef struct pool_job {
    req_check *items;
    int count;
    atomic_int next;
    const struct mla_weights_slot *mla;   /* non-NULL for MLA models */
} pool_job;

static void *pool_worker(void *arg)
{
    pool_job *j = arg;
    for (;;) {
        int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->count) break;
        if (j->mla) check_request_mla(&j->items[i], j->mla);
        else check_request(&j->items[i]);
    }
    return NULL;
}

int ar_verify_step(const ar_run_config *cfg, const ar_batch *b, int layer, const float *out,
                   const float *lse, const char *const *req_ids, const ar_verify_opts *opts,
                   ar_verify_result *res, char *err, size_t err_len)
{
    memset(res, 0, sizeof *res);
    const bool mla = cfg->model.attention == AR_ATTN_MLA;
    const int hq = cfg->model.num_q_heads, dv = mla ? cfg->model.v_head_dim : cfg->model.head_size;
    /* NaN / Inf anywhere in the output fails the step, checked rows or not. */
    size_t total = (size_t)b->num_tokens * hq * dv;
    for (size_t i = 0; i < total; i++)
        if (!isfinite(out[i])) res->nan_count++;
    for (size_t i = 0; i < (size_t)hq * b->num_tokens; i++)
        if (isnan(lse[i]) || lse[i] == INFINITY) res->nan_count++;
    if (opts->mode == AR_VERIFY_OFF) {
        res->pass = res->nan_count == 0;
        if (!res->pass) snprintf(res->reason, sizeof res->reason, "NaN/Inf in output");
        return 0;
    }
    const struct mla_weights_slot *wts = NULL;
    if (mla && !(wts = mla_weights_for(cfg, layer))) {
        snprintf(err, err_len, "out of memory generating the MLA weights of layer %d", layer);
        return -1;
    }
    if (opts->dump_dir && mla) {
        snprintf(err, err_len, "--dump-step is not available for MLA traces yet");
        return -1;
    }
    if (opts->dump_dir && write_dump_index(cfg, b, layer, req_ids, opts->dump_dir, err, err_len) != 0)
        return -1;

    req_check *items = calloc((size_t)b->num_reqs, sizeof *items);
    if (!items) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    for (int r = 0; r < b->num_reqs; r++)
        items[r] = (req_check){.cfg = cfg, .b = b, .opts = opts, .req_ids = req_ids,
                               .layer = layer, .r = r, .out = out, .lse = lse};
    int threads = opts->threads > 0 ? opts->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1) threads = 1;
    if (threads > b->num_reqs) threads = b->num_reqs;
    pool_job job = {items, b->num_reqs, 0, wts};
    pthread_t tid[64];
    int started = 0;
    for (int t = 1; t < threads && t < 64; t++)
        if (pthread_create(&tid[started], NULL, pool_worker, &job) == 0) started++;
    pool_worker(&job);
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);

    double sum_abs = 0, sum_sq_err = 0, sum_sq_ref = 0, naive_sum = 0;
    int64_t elems = 0;
    int rc = 0;
    for (int r = 0; r < b->num_reqs; r++) {
        req_check *w = &items[r];
        if (w->failed) {
            snprintf(err, err_len, "%s", w->err[0] ? w->err : "dump write failed");
            rc = -1;
        }
        res->rows_checked += w->rows;
        elems += w->elems;
        sum_abs += w->sum_abs;
        sum_sq_err += w->sum_sq_err;
        sum_sq_ref += w->sum_sq_ref;
        naive_sum += w->naive_sum_abs;
        if (w->max_abs > res->max_abs || isnan(w->max_abs)) res->max_abs = w->max_abs;
        if (w->max_rel > res->max_rel) res->max_rel = w->max_rel;
        if (w->lse_max > res->lse_max_abs) res->lse_max_abs = w->lse_max;
        if (w->naive_max > res->naive_max_abs) res->naive_max_abs = w->naive_max;
        if (w->naive_lse_max > res->naive_lse_max_abs) res->naive_lse_max_abs = w->naive_lse_max;
        res->bad_count += w->bad;
        for (int i = 0; i < w->num_worst; i++) {
            /* merge into the global worst list */
            ar_worst x = w->worst[i];
            if (res->num_worst == AR_VERIFY_WORST && !(x.err > res->worst[AR_VERIFY_WORST - 1].err)) continue;
            int k = res->num_worst < AR_VERIFY_WORST ? res->num_worst++ : AR_VERIFY_WORST - 1;
            while (k > 0 && !(res->worst[k - 1].err >= x.err)) {
                res->worst[k] = res->worst[k - 1];
                k--;
            }
            res->worst[k] = x;
        }
    }
    free(items);
    if (elems > 0) {
        res->mean_abs = sum_abs / (double)elems;
        res->naive_mean_abs = naive_sum / (double)elems;
        res->nmse = sum_sq_ref > 0 ? sum_sq_err / sum_sq_ref : (sum_sq_err > 0 ? INFINITY : 0);
    }
    double floor_abs = ar_dtype_ulp_at_0p3(cfg->dtype);
    if (floor_abs < 1e-6) floor_abs = 1e-6;
    res->tol_max_abs = 3.0 * res->naive_max_abs + floor_abs;
    res->tol_mean_abs = 1.5 * res->naive_mean_abs + floor_abs / 4;
    res->tol_lse = 3.0 * res->naive_lse_max_abs + 1e-3;
    res->pass = true;
    if (res->nan_count > 0) {
        res->pass = false;
        snprintf(res->reason, sizeof res->reason, "%lld NaN/Inf values in the output",
                 (long long)res->nan_count);
    } else if (!(res->max_abs <= res->tol_max_abs)) {
        res->pass = false;
        snprintf(res->reason, sizeof res->reason, "max abs error %.3g > %.3g (3 x naive %.3g + %.2g)",
                 res->max_abs, res->tol_max_abs, res->naive_max_abs, floor_abs);
    } else if (!(res->mean_abs <= res->tol_mean_abs)) {
        res->pass = false;
        snprintf(res->reason, sizeof res->reason, "mean abs error %.3g > %.3g (1.5 x naive %.3g)",
                 res->mean_abs, res->tol_mean_abs, res->naive_mean_abs);
    } else if (!(res->lse_max_abs <= res->tol_lse)) {
        res->pass = false;
        snprintf(res->reason, sizeof res->reason, "LSE error %.3g > %.3g", res->lse_max_abs,
                 res->tol_lse);
    }
    return rc;
}

void ar_verify_accumulate(ar_verify_result *acc, const ar_verify_result *x, bool first)
{
    if (first) {
        *acc = *x;
        return;
    }
    acc->rows_checked += x->rows_checked;
#define TAKE_MAX(f) if (x->f > acc->f || isnan(x->f)) acc->f = x->f
    TAKE_MAX(max_abs); TAKE_MAX(max_rel); TAKE_MAX(mean_abs); TAKE_MAX(nmse);
    TAKE_MAX(lse_max_abs); TAKE_MAX(naive_max_abs); TAKE_MAX(naive_mean_abs);
    TAKE_MAX(naive_lse_max_abs); TAKE_MAX(tol_max_abs); TAKE_MAX(tol_mean_abs); TAKE_MAX(tol_lse);
#undef TAKE_MAX
    acc->nan_count += x->nan_count;
    acc->bad_count += x->bad_count;
    if (acc->pass && !x->pass) {
        acc->pass = false;
        memcpy(acc->reason, x->reason, sizeof acc->reason);
        acc->num_worst = x->num_worst;
        memcpy(acc->worst, x->worst, sizeof acc->worst);
    }
}

/* ---- the run's verifier ----------------------------------------------------------------- */

struct ar_verifier {
    ar_run_config cfg;
};

int ar_verifier_open(ar_verifier **v, const ar_run_config *cfg, const ar_backend *be,
                     char *err, size_t err_len)
{
    (void)be;
    *v = calloc(1, sizeof **v);
    if (!*v) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    (*v)->cfg = *cfg;
    return 0;
}

bool ar_verifier_needs_host_output(const ar_verifier *v, const ar_verify_opts *opts)
{
    (void)v;
    (void)opts;
    return true;
}

const char *ar_verifier_where(const ar_verifier *v)
{
    (void)v;
    return "host";
}

int ar_verifier_check_layer(ar_verifier *v, const ar_batch *b, int layer, const ar_forward_out *fo,
                            const char *const *req_ids, const ar_verify_opts *opts,
                            ar_verify_result *res, char *err, size_t err_len)
{
    if (!fo->out || !fo->lse) {
        snprintf(err, err_len, "host verification needs the output on the host");
        return -1;
    }
    return ar_verify_step(&v->cfg, b, layer, fo->out, fo->lse, req_ids, opts, res, err, err_len);
}

void ar_verifier_close(ar_verifier *v)
{
    free(v);
}
