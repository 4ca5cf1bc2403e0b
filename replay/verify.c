/* verify.c - per-step verification against the float64 reference (see verify.h for the rule).
 *
 * On the host: work is split by request across threads; each request regenerates its query rows
 * and its visible keys in logical order from the generator, runs the reference and the naive
 * same-dtype twin chunk by chunk (rows in blocks, the cancel flag looked at between them), and
 * compares.  Partial results are reduced at the end and the pass rule applied
 * (ar_verify_apply_rule).
 *
 * The run's verifier (ar_verifier, at the end of this file) sends a device backend's layers to
 * the device reference (reference/ref_gpu.h) with the same row choice and the same rule, and
 * hands one row of every step to a background thread that recomputes it with the C reference
 * (host_reference_mha / host_reference_mla_head, the very code the host path runs) and compares.
 * The thread takes one row at a time; a step whose turn comes while it is busy is counted
 * skipped, so its host cost stays below one core. */
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
#include <time.h>
#include <unistd.h>

#include "../reference/mla_ref.h"
#include "../reference/ref_gpu.h"
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
    int cancelled;            /* opts->cancel was raised before this request finished */
    char err[256];
} req_check;

void ar_verify_fixed_tolerance(ar_dtype t, double *atol, double *rtol)
{
    switch (t) {
    case AR_BF16: *atol = 1.5e-2; *rtol = 1e-2; break;
    case AR_FP16: *atol = 1e-3; *rtol = 1e-3; break;
    case AR_FP8_E4M3: *atol = 1.5e-1; *rtol = 1.5e-1; break;
    default: *atol = 1e-5; *rtol = 1e-5; break;
    }
}

static float q_value(const ar_run_config *c, int layer, uint64_t req_key, int pos, int h, int d)
{
    uint64_t row = ar_gen_row(c->seed, AR_STREAM_Q, (uint32_t)layer, req_key, (uint64_t)pos,
                              (uint32_t)h);
    return ar_gen(row, (uint32_t)d, c->data, c->dtype);
}

static bool cancelled(const volatile int *cancel)
{
    return cancel && *cancel;
}

/* K and V of positions [k0, k1) of a request (keys_row: its content key per logical block), KV
 * heads [g0, g0 + ng), logical order, as they read back from the cache.
 *   kd, vd [k1-k0, ng, D] double;  kf, vf the same in float. */
static void gather_kv(const ar_run_config *c, int layer, const uint64_t *keys_row, int k0, int k1,
                      int g0, int ng, double *kd, double *vd, float *kf, float *vf)
{
    const int dim = c->model.head_size, bs = c->block_size;
    const float scale = (float)c->kv_scale;
    for (int pos = k0; pos < k1; pos++) {
        uint64_t key = keys_row[pos / bs];
        int off = pos % bs;
        for (int h = 0; h < ng; h++) {
            uint64_t rk = ar_gen_row(c->seed, AR_STREAM_K, (uint32_t)layer, key, (uint64_t)off,
                                     (uint32_t)(g0 + h));
            uint64_t rv = ar_gen_row(c->seed, AR_STREAM_V, (uint32_t)layer, key, (uint64_t)off,
                                     (uint32_t)(g0 + h));
            size_t base = ((size_t)(pos - k0) * ng + h) * dim;
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

/* The row blocks of nrows rows: AR_VERIFY_ROW_BLOCK rows each, a short tail joined to the block
 * before it when it alone would have fewer than 16 query vectors (rows x group): the reference
 * then treats every block as it treated the whole (ar_ref_attend packs keys from 16 vectors on),
 * so blocking changes no value.  starts [nrows + 1]; returns the number of blocks. */
static int row_blocks(int nrows, int group, int *starts)
{
    int nb = 0;
    for (int i = 0; i < nrows; i += AR_VERIFY_ROW_BLOCK) starts[nb++] = i;
    if (nb > 1 && (nrows - starts[nb - 1]) * group < 16) nb--;
    starts[nb] = nrows;
    return nb;
}

/* The float64 reference and the naive same-dtype twin of nrows query rows (absolute positions
 * qpos, ascending) of one request (keys_row: content key per logical block; req_key: its Q key)
 * against its keys [kmin, kmax), for the query heads of KV heads [g0, g0 + ng), in key chunks of
 * AR_VERIFY_KEY_CHUNK from kmin merged by LSE, rows in blocks.
 *   ref_o, nv_o [nrows, heads, dv]; ref_l, nv_l [heads, nrows] (heads = ng x group); nv_o and
 *   nv_l may be NULL (reference only).
 * Returns 0, -1 (out of memory) or AR_VERIFY_CANCELLED. */
static int host_reference_mha(const ar_run_config *c, int layer, const uint64_t *keys_row,
                              uint64_t req_key, int nrows, const int *qpos, int kmin, int kmax,
                              int g0, int ng, const volatile int *cancel, double *ref_o,
                              double *ref_l, double *nv_o, double *nv_l)
{
    const int hq = c->model.num_q_heads, hkv = c->model.num_kv_heads, group = hq / hkv;
    const int heads = ng * group, dim = c->model.head_size, dv = c->model.head_size;
    const bool naive = nv_o && nv_l;
    ar_attn_params p = {heads, ng, dim, dv, c->model.scale, c->model.sliding_window,
                        c->model.logits_soft_cap, true};
    const int chunk = AR_VERIFY_KEY_CHUNK;
    size_t nq = (size_t)nrows * heads * dim, no = (size_t)nrows * heads * dv, nl = (size_t)heads * nrows;
    size_t nk = (size_t)chunk * ng * dim, bo = (size_t)2 * AR_VERIFY_ROW_BLOCK * heads * dv;
    size_t bl = (size_t)2 * AR_VERIFY_ROW_BLOCK * heads;
    int *starts = malloc(sizeof(int) * (size_t)(nrows / AR_VERIFY_ROW_BLOCK + 2));
    double *qd = malloc(nq * sizeof *qd), *kd = malloc(nk * sizeof *kd), *vd = malloc(nk * sizeof *vd);
    float *qf = malloc(nq * sizeof *qf), *kf = malloc(nk * sizeof *kf), *vf = malloc(nk * sizeof *vf);
    /* running LSEs block by block ([heads, rows of the block] per block), then [heads, nrows] */
    double *acc_l = malloc(nl * sizeof *acc_l), *acc_nl = malloc(nl * sizeof *acc_nl);
    double *c_o = malloc(bo * sizeof *c_o), *c_l = malloc(bl * sizeof *c_l);
    double *t_o = malloc(bo * sizeof *t_o), *t_l = malloc(bl * sizeof *t_l);
    float *cf_o = malloc(bo * sizeof *cf_o), *cf_l = malloc(bl * sizeof *cf_l);
    int rc = -1;
    if (!starts || !qd || !kd || !vd || !qf || !kf || !vf || !acc_l || !acc_nl || !c_o || !c_l || !t_o ||
        !t_l || !cf_o || !cf_l)
        goto done;
    const int nb = row_blocks(nrows, group, starts);
    for (int i = 0; i < nrows; i++)
        for (int h = 0; h < heads; h++)
            for (int d = 0; d < dim; d++) {
                float x = q_value(c, layer, req_key, qpos[i], g0 * group + h, d);
                size_t at = ((size_t)i * heads + h) * dim + d;
                qf[at] = x;
                qd[at] = x;
            }
    if (kmax <= kmin) { /* no visible key at all (cannot happen in a valid trace) */
        for (size_t i = 0; i < no; i++) {
            ref_o[i] = 0;
            if (naive) nv_o[i] = 0;
        }
        for (size_t i = 0; i < nl; i++) {
            acc_l[i] = -INFINITY;
            acc_nl[i] = -INFINITY;
        }
    }
    for (int k0 = kmin; k0 < kmax; k0 += chunk) {
        const int k1 = k0 + chunk < kmax ? k0 + chunk : kmax;
        const bool first = k0 == kmin;
        if (cancelled(cancel)) {
            rc = AR_VERIFY_CANCELLED;
            goto done;
        }
        gather_kv(c, layer, keys_row, k0, k1, g0, ng, kd, vd, kf, vf);
        for (int blk = 0; blk < nb; blk++) {
            const int i0 = starts[blk], rows = starts[blk + 1] - i0;
            const size_t oo = (size_t)i0 * heads * dv, ol = (size_t)i0 * heads;
            if (cancelled(cancel)) {
                rc = AR_VERIFY_CANCELLED;
                goto done;
            }
            ar_ref_attend(&p, rows, qd + (size_t)i0 * heads * dim, qpos + i0, k1 - k0, k0, kd, vd, c_o, c_l);
            fold(rows, heads, dv, first, ref_o + oo, acc_l + ol, c_o, c_l, t_o, t_l);
            if (!naive) continue;
            ar_naive_dtype_attend(&p, c->dtype, rows, qf + (size_t)i0 * heads * dim, qpos + i0, k1 - k0, k0, kf,
                                  vf, cf_o, cf_l);
            for (size_t i = 0; i < (size_t)rows * heads * dv; i++) c_o[i] = cf_o[i];
            for (size_t i = 0; i < (size_t)rows * heads; i++) c_l[i] = cf_l[i];
            fold(rows, heads, dv, first, nv_o + oo, acc_nl + ol, c_o, c_l, t_o, t_l);
        }
    }
    /* block-major LSEs -> [heads, nrows] */
    for (int blk = 0; blk < nb; blk++) {
        const int i0 = starts[blk], rows = starts[blk + 1] - i0;
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < rows; i++) {
                double a = kmax <= kmin ? -INFINITY : acc_l[(size_t)i0 * heads + (size_t)h * rows + i];
                ref_l[(size_t)h * nrows + i0 + i] = a;
                if (naive)
                    nv_l[(size_t)h * nrows + i0 + i] =
                        kmax <= kmin ? -INFINITY : acc_nl[(size_t)i0 * heads + (size_t)h * rows + i];
            }
    }
    rc = 0;
done:
    free(starts); free(qd); free(kd); free(vd); free(qf); free(kf); free(vf); free(acc_l); free(acc_nl);
    free(c_o); free(c_l); free(t_o); free(t_l); free(cf_o); free(cf_l);
    return rc;
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
    ar_verify_fixed_tolerance(dt, &atol, &rtol);
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

/* Keys [*kmin, *kmax) that rows at positions qpos [nrows] (ascending) of a request with seq_len s
 * can see. */
static void visible_keys(const ar_run_config *c, const int *qpos, int nrows, int s, int *kmin, int *kmax)
{
    const int win = c->model.attention == AR_ATTN_MLA ? 0 : c->model.sliding_window;
    *kmin = 0;
    *kmax = qpos[nrows - 1] + 1;
    if (win > 0 && qpos[0] - win + 1 > 0) *kmin = qpos[0] - win + 1;
    if (*kmax > s) *kmax = s;
}

static void check_request(req_check *w)
{
    const ar_run_config *c = w->cfg;
    const ar_batch *b = w->b;
    const int r = w->r;
    const int hq = c->model.num_q_heads, hkv = c->model.num_kv_heads, dv = c->model.head_size;
    const int q0 = b->query_start_loc[r], n = b->query_start_loc[r + 1] - q0;
    const int ctx = b->context_lens[r], s = b->seq_lens[r];
    if (n <= 0) return;

    int *rows = malloc((size_t)n * sizeof *rows);
    int *qpos = malloc((size_t)n * sizeof *qpos);
    double *ref_o = NULL, *ref_l = NULL, *nv_o = NULL, *nv_l = NULL;
    if (!rows || !qpos) goto oom;
    int nrows = ar_verify_choose_rows(w->opts, n, b->num_tokens, rows);
    for (int i = 0; i < nrows; i++) qpos[i] = ctx + rows[i];
    int kmin, kmax;
    visible_keys(c, qpos, nrows, s, &kmin, &kmax);
    size_t no = (size_t)nrows * hq * dv, nl = (size_t)hq * nrows;
    ref_o = malloc(no * sizeof *ref_o);
    ref_l = malloc(nl * sizeof *ref_l);
    nv_o = malloc(no * sizeof *nv_o);
    nv_l = malloc(nl * sizeof *nv_l);
    if (!ref_o || !ref_l || !nv_o || !nv_l) goto oom;
    int rc = host_reference_mha(c, w->layer, b->block_keys + (size_t)r * b->max_blocks_per_req, b->req_keys[r],
                                nrows, qpos, kmin, kmax, 0, hkv, w->opts->cancel, ref_o, ref_l, nv_o, nv_l);
    if (rc == AR_VERIFY_CANCELLED) {
        w->cancelled = 1;
        goto out;
    }
    if (rc != 0) goto oom;
    compare_rows(w, nrows, rows, hq, dv, ref_o, ref_l, nv_o, nv_l);
    if (w->opts->dump_dir && dump_request(w, n, s, rows, nrows, ref_o, ref_l) != 0) w->failed = 1;
out:
    free(rows); free(qpos); free(ref_o); free(ref_l); free(nv_o); free(nv_l);
    return;
oom:
    w->failed = 1;
    snprintf(w->err, sizeof w->err, "out of memory verifying request %d", r);
    goto out;
}


/* ---- MLA ------------------------------------------------------------------------------------ */

/* One layer's weights per head, W_UK_h [L, P] and W_UV_h [L, V] for every head (uk [N, L, P],
 * uv [N, L, V]: ar_mla_weight's values as doubles), generated once per (seed, layer, data, dtype,
 * dims) and kept for the run (filled before the worker threads start). */
#define MLA_WEIGHT_SLOTS 8
static struct mla_weights_slot {
    bool used;
    uint64_t seed;
    int layer, heads, rank, nope, vdim;
    ar_datadist dist;
    ar_dtype dtype;
    double *uk, *uv;
} mla_weights[MLA_WEIGHT_SLOTS];

/* W_UK_h [L, P] and W_UV_h [L, V] of head h (ar_mla_weight). */
static void mla_head_weights(const ar_run_config *c, int layer, int h, double *uk, double *uv)
{
    const ar_model *m = &c->model;
    const int L = m->kv_lora_rank, P = m->qk_nope_head_dim, V = m->v_head_dim;
    for (int l = 0; l < L; l++) {
        for (int k = 0; k < P; k++)
            uk[(size_t)l * P + k] = ar_mla_weight(c->seed, AR_STREAM_W_UK, (uint32_t)layer, L, l, h, k, c->data, c->dtype);
        for (int k = 0; k < V; k++)
            uv[(size_t)l * V + k] = ar_mla_weight(c->seed, AR_STREAM_W_UV, (uint32_t)layer, L, l, h, k, c->data, c->dtype);
    }
}

static const struct mla_weights_slot *mla_weights_for(const ar_run_config *c, int layer)
{
    const ar_model *m = &c->model;
    int free_slot = -1;
    for (int i = 0; i < MLA_WEIGHT_SLOTS; i++) {
        struct mla_weights_slot *w = &mla_weights[i];
        if (w->used && w->seed == c->seed && w->layer == layer && w->dist == c->data &&
            w->dtype == c->dtype && w->heads == m->num_q_heads && w->rank == m->kv_lora_rank &&
            w->nope == m->qk_nope_head_dim && w->vdim == m->v_head_dim)
            return w;
        if (!w->used && free_slot < 0) free_slot = i;
    }
    if (free_slot < 0) free_slot = layer % MLA_WEIGHT_SLOTS;
    struct mla_weights_slot *w = &mla_weights[free_slot];
    free(w->uk);
    free(w->uv);
    memset(w, 0, sizeof *w);
    const int N = m->num_q_heads, L = m->kv_lora_rank, P = m->qk_nope_head_dim, V = m->v_head_dim;
    w->uk = malloc((size_t)N * L * P * sizeof *w->uk);
    w->uv = malloc((size_t)N * L * V * sizeof *w->uv);
    if (!w->uk || !w->uv) {
        free(w->uk);
        free(w->uv);
        w->uk = w->uv = NULL;
        return NULL;
    }
    for (int h = 0; h < N; h++)
        mla_head_weights(c, layer, h, w->uk + (size_t)h * L * P, w->uv + (size_t)h * L * V);
    w->used = true;
    w->seed = c->seed;
    w->layer = layer;
    w->heads = N;
    w->rank = L;
    w->nope = P;
    w->vdim = V;
    w->dist = c->data;
    w->dtype = c->dtype;
    return w;
}

/* One step of a yardstick sum: in double, or for fp32 runs rounded to float after each add (a
 * float multiply-add: the product of two float values is exact in double). */
static inline double yard_add(bool f32, double acc, double x)
{
    return f32 ? (double)(float)(acc + x) : acc + x;
}

/* The MLA yardstick: the absorbed data path with the roundings any dtype implementation
 * makes - ql = W_UK q_nope rounded to dtype, softmax probabilities rounded to dtype before
 * P.V, the latent output rounded to dtype before W_UV, the output rounded to dtype.  Sums in
 * double for the 16-bit dtypes (their roundings dominate; the device twin in ref_gpu sums the
 * same way, so fp32 MLA is verified on the host: ar_verifier_open); in float for fp32, as a plain fp32 implementation (and the MHA twin,
 * ar_naive_dtype_attend) accumulates: with double sums the fp32 yardstick's error was ~1e-7,
 * and correct float kernels (cpu-mla, the example plugin) failed at 2-5e-6 over the DeepSeek
 * sample's 576-wide scores and 512-wide W_UV products.  Its error against the expanded float64
 * reference is the yardstick of the pass rule.
 *   q_nope [rows, N, P], q_pe [rows, N, R], latent [keys, L + R], out [rows, N, V], lse [N, rows] */
static int mla_naive_absorbed(const ar_mla_dims *d, ar_dtype t, int rows, const double *q_nope,
                              const double *q_pe, const int *q_pos, int num_keys,
                              const double *latent, const double *w_uk, const double *w_uv,
                              double *out, double *lse)
{
    const int N = d->num_heads, L = d->kv_lora_rank, R = d->qk_rope_head_dim;
    const int P = d->qk_nope_head_dim, V = d->v_head_dim, E = L + R;
    const bool f32 = t == AR_FP32;
    double *ql = malloc((size_t)L * sizeof *ql), *s = malloc((size_t)(num_keys + 1) * sizeof *s);
    double *olat = malloc((size_t)L * sizeof *olat);
    if (!ql || !s || !olat) {
        free(ql); free(s); free(olat);
        return -1;
    }
    for (int i = 0; i < rows; i++) {
        int visible = q_pos[i] + 1 < num_keys ? q_pos[i] + 1 : num_keys;
        if (visible < 0) visible = 0;
        for (int n = 0; n < N; n++) {
            const double *qn = q_nope + ((size_t)i * N + n) * P, *qp = q_pe + ((size_t)i * N + n) * R;
            for (int l = 0; l < L; l++) {
                double acc = 0;
                const double *wk = w_uk + ((size_t)l * N + n) * P;
                for (int c = 0; c < P; c++) acc = yard_add(f32, acc, wk[c] * qn[c]);
                ql[l] = ar_round_to(t, (float)acc);
            }
            double mx = -INFINITY;
            for (int j = 0; j < visible; j++) {
                const double *e = latent + (size_t)j * E;
                double acc = 0;
                for (int l = 0; l < L; l++) acc = yard_add(f32, acc, ql[l] * e[l]);
                for (int r = 0; r < R; r++) acc = yard_add(f32, acc, qp[r] * e[L + r]);
                s[j] = f32 ? (double)(float)(d->scale * acc) : d->scale * acc;
                if (s[j] > mx) mx = s[j];
            }
            double sum = 0;
            for (int j = 0; j < visible; j++) sum = yard_add(f32, sum, exp(s[j] - mx));
            for (int l = 0; l < L; l++) olat[l] = 0;
            for (int j = 0; j < visible; j++) {
                double p = ar_round_to(t, (float)(exp(s[j] - mx) / sum));
                const double *e = latent + (size_t)j * E;
                for (int l = 0; l < L; l++) olat[l] = yard_add(f32, olat[l], p * e[l]);
            }
            for (int l = 0; l < L; l++) olat[l] = ar_round_to(t, (float)olat[l]);
            for (int v = 0; v < V; v++) {
                double acc = 0;
                for (int l = 0; l < L; l++) acc = yard_add(f32, acc, olat[l] * w_uv[((size_t)l * N + n) * V + v]);
                out[((size_t)i * N + n) * V + v] = visible ? ar_round_to(t, (float)acc) : 0;
            }
            lse[(size_t)n * rows + i] = visible ? mx + log(sum) : -INFINITY;
        }
    }
    free(ql); free(s); free(olat);
    return 0;
}

/* Latent cache entries of positions [0, keys) of a request, as they read back from the cache.
 *   lat [keys, L + R] */
static void gather_latent(const ar_run_config *c, int layer, const uint64_t *keys_row, int keys, double *lat)
{
    const int E = c->model.kv_lora_rank + c->model.qk_rope_head_dim, bs = c->block_size;
    for (int pos = 0; pos < keys; pos++) {
        uint64_t rl = ar_gen_row(c->seed, AR_STREAM_LATENT, (uint32_t)layer, keys_row[pos / bs],
                                 (uint64_t)(pos % bs), 0);
        for (int k = 0; k < E; k++)
            lat[(size_t)pos * E + k] = ar_kv_roundtrip(c->kv_dtype, c->dtype, (float)c->kv_scale,
                                                       ar_gen(rl, (uint32_t)k, c->data, c->dtype));
    }
}

/* The expanded float64 reference (ar_mla_ref_attend) and the absorbed yardstick of one head h
 * for nrows rows (positions qpos) of a request over its keys [0, keys) (lat [keys, L + R]), with
 * that head's weights uk [L, P], uv [L, V], in key chunks of AR_VERIFY_KEY_CHUNK merged by LSE.
 *   ref_o, nv_o [nrows, V]; ref_l, nv_l [nrows]; nv_o / nv_l may be NULL.
 * One head at a time gives exactly the values of the all-heads call (each head's arithmetic is
 * its own).  Returns 0 or -1 (out of memory). */
static int host_reference_mla_head(const ar_run_config *c, int layer, uint64_t req_key, int nrows,
                                   const int *qpos, int keys, const double *lat, int h, const double *uk,
                                   const double *uv, double *ref_o, double *ref_l, double *nv_o, double *nv_l)
{
    const ar_model *m = &c->model;
    const int L = m->kv_lora_rank, R = m->qk_rope_head_dim, P = m->qk_nope_head_dim, V = m->v_head_dim;
    const int E = L + R, chunk = AR_VERIFY_KEY_CHUNK;
    const bool naive = nv_o && nv_l;
    ar_mla_dims d = {1, L, R, P, V, m->scale};
    double *qn = malloc((size_t)nrows * P * sizeof *qn), *qp = malloc(((size_t)nrows * R + 1) * sizeof *qp);
    int *rel = malloc((size_t)nrows * sizeof *rel);
    double *c_o = malloc((size_t)nrows * V * sizeof *c_o), *c_l = malloc((size_t)nrows * sizeof *c_l);
    double *t_o = malloc((size_t)nrows * V * sizeof *t_o), *t_l = malloc((size_t)nrows * sizeof *t_l);
    int rc = -1;
    if (!qn || !qp || !rel || !c_o || !c_l || !t_o || !t_l) goto done;
    for (int i = 0; i < nrows; i++) {
        uint64_t rn = ar_gen_row(c->seed, AR_STREAM_Q_NOPE, (uint32_t)layer, req_key, (uint64_t)qpos[i], (uint32_t)h);
        uint64_t rp = ar_gen_row(c->seed, AR_STREAM_Q_PE, (uint32_t)layer, req_key, (uint64_t)qpos[i], (uint32_t)h);
        for (int k = 0; k < P; k++) qn[(size_t)i * P + k] = ar_gen(rn, (uint32_t)k, c->data, c->dtype);
        for (int k = 0; k < R; k++) qp[(size_t)i * R + k] = ar_gen(rp, (uint32_t)k, c->data, c->dtype);
    }
    if (keys <= 0) {
        for (size_t i = 0; i < (size_t)nrows * V; i++) {
            ref_o[i] = 0;
            if (naive) nv_o[i] = 0;
        }
        for (int i = 0; i < nrows; i++) {
            ref_l[i] = -INFINITY;
            if (naive) nv_l[i] = -INFINITY;
        }
    }
    for (int k0 = 0; k0 < keys; k0 += chunk) {
        const int nk = keys - k0 < chunk ? keys - k0 : chunk;
        for (int i = 0; i < nrows; i++) rel[i] = qpos[i] - k0;   /* positions within the chunk */
        if (ar_mla_ref_attend(&d, nrows, qn, qp, rel, nk, lat + (size_t)k0 * E, uk, uv, c_o, c_l) != 0) goto done;
        fold(nrows, 1, V, k0 == 0, ref_o, ref_l, c_o, c_l, t_o, t_l);
        if (!naive) continue;
        if (mla_naive_absorbed(&d, c->dtype, nrows, qn, qp, rel, nk, lat + (size_t)k0 * E, uk, uv, c_o, c_l) != 0)
            goto done;
        fold(nrows, 1, V, k0 == 0, nv_o, nv_l, c_o, c_l, t_o, t_l);
    }
    rc = 0;
done:
    free(qn); free(qp); free(rel); free(c_o); free(c_l); free(t_o); free(t_l);
    return rc;
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
    const int ctx = b->context_lens[r], s = b->seq_lens[r];
    if (n <= 0) return;
    int *rows = malloc((size_t)n * sizeof *rows), *qpos = malloc((size_t)n * sizeof *qpos);
    double *lat = NULL, *ref_o = NULL, *ref_l = NULL, *nv_o = NULL, *nv_l = NULL;
    double *h_ro = NULL, *h_rl = NULL, *h_no = NULL, *h_nl = NULL;
    if (!rows || !qpos) goto oom;
    int nrows = ar_verify_choose_rows(w->opts, n, b->num_tokens, rows);
    for (int i = 0; i < nrows; i++) qpos[i] = ctx + rows[i];
    int kmin, keys;
    visible_keys(c, qpos, nrows, s, &kmin, &keys);
    lat = malloc(((size_t)(keys > 0 ? keys : 1)) * E * sizeof *lat);
    ref_o = malloc((size_t)nrows * N * V * sizeof *ref_o);
    nv_o = malloc((size_t)nrows * N * V * sizeof *nv_o);
    ref_l = malloc((size_t)N * nrows * sizeof *ref_l);
    nv_l = malloc((size_t)N * nrows * sizeof *nv_l);
    h_ro = malloc((size_t)nrows * V * sizeof *h_ro);
    h_no = malloc((size_t)nrows * V * sizeof *h_no);
    h_rl = malloc((size_t)nrows * sizeof *h_rl);
    h_nl = malloc((size_t)nrows * sizeof *h_nl);
    if (!lat || !ref_o || !nv_o || !ref_l || !nv_l || !h_ro || !h_no || !h_rl || !h_nl) goto oom;
    gather_latent(c, layer, b->block_keys + (size_t)r * b->max_blocks_per_req, keys, lat);
    for (int h = 0; h < N; h++) {
        if (cancelled(w->opts->cancel)) {
            w->cancelled = 1;
            goto out;
        }
        if (host_reference_mla_head(c, layer, b->req_keys[r], nrows, qpos, keys, lat, h, wts->uk + (size_t)h * L * P,
                                    wts->uv + (size_t)h * L * V, h_ro, h_rl, h_no, h_nl) != 0)
            goto oom;
        for (int i = 0; i < nrows; i++) {
            memcpy(ref_o + ((size_t)i * N + h) * V, h_ro + (size_t)i * V, (size_t)V * sizeof *ref_o);
            memcpy(nv_o + ((size_t)i * N + h) * V, h_no + (size_t)i * V, (size_t)V * sizeof *nv_o);
            ref_l[(size_t)h * nrows + i] = h_rl[i];
            nv_l[(size_t)h * nrows + i] = h_nl[i];
        }
    }
    compare_rows(w, nrows, rows, N, V, ref_o, ref_l, nv_o, nv_l);
out:
    free(rows); free(qpos); free(lat); free(ref_o); free(ref_l); free(nv_o); free(nv_l);
    free(h_ro); free(h_rl); free(h_no); free(h_nl);
    return;
oom:
    w->failed = 1;
    snprintf(w->err, sizeof w->err, "out of memory verifying MLA request %d", r);
    goto out;
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
    gather_kv(c, w->layer, b->block_keys + (size_t)r * b->max_blocks_per_req, 0, s, 0, hkv, kd, vd, k, v);
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
    const volatile int *cancel;
} pool_job;

static void *pool_worker(void *arg)
{
    pool_job *j = arg;
    for (;;) {
        int i = atomic_fetch_add(&j->next, 1);
        if (i >= j->count) break;
        if (cancelled(j->cancel)) {
            j->items[i].cancelled = 1;
            continue;
        }
        if (j->mla) check_request_mla(&j->items[i], j->mla);
        else check_request(&j->items[i]);
    }
    return NULL;
}

int ar_verify_choose_rows(const ar_verify_opts *o, int n, int total_tokens, int *rows)
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

void ar_verify_apply_rule(ar_dtype dtype, const ar_verify_sums *s, ar_verify_result *res)
{
    if (s->elems > 0) {
        res->mean_abs = s->sum_abs / (double)s->elems;
        res->naive_mean_abs = s->naive_sum_abs / (double)s->elems;
        res->nmse = s->sum_sq_ref > 0 ? s->sum_sq_err / s->sum_sq_ref : (s->sum_sq_err > 0 ? INFINITY : 0);
    }
    double floor_abs = ar_dtype_ulp_at_0p3(dtype);
    if (floor_abs < 1e-6) floor_abs = 1e-6;
    res->tol_max_abs = 3.0 * res->naive_max_abs + floor_abs;
    res->tol_mean_abs = 1.5 * res->naive_mean_abs + floor_abs / 4;
    res->tol_lse = 3.0 * res->naive_lse_max_abs + 1e-3;
    res->pass = true;
    res->reason[0] = '\0';
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
}

/* NaN / Inf anywhere in out or LSE: out [num_tokens, hq, dv], lse [hq, num_tokens]. */
static int64_t count_nan(const float *out, const float *lse, int num_tokens, int hq, int dv)
{
    int64_t n = 0;
    size_t total = (size_t)num_tokens * hq * dv;
    for (size_t i = 0; i < total; i++)
        if (!isfinite(out[i])) n++;
    for (size_t i = 0; i < (size_t)hq * num_tokens; i++)
        if (isnan(lse[i]) || lse[i] == INFINITY) n++;
    return n;
}

static void merge_worst(ar_verify_result *res, const ar_worst *x)
{
    if (res->num_worst == AR_VERIFY_WORST && !(x->err > res->worst[AR_VERIFY_WORST - 1].err)) return;
    int k = res->num_worst < AR_VERIFY_WORST ? res->num_worst++ : AR_VERIFY_WORST - 1;
    while (k > 0 && !(res->worst[k - 1].err >= x->err)) {
        res->worst[k] = res->worst[k - 1];
        k--;
    }
    res->worst[k] = *x;
}

int ar_verify_step(const ar_run_config *cfg, const ar_batch *b, int layer, const float *out,
                   const float *lse, const char *const *req_ids, const ar_verify_opts *opts,
                   ar_verify_result *res, char *err, size_t err_len)
{
    memset(res, 0, sizeof *res);
    const bool mla = cfg->model.attention == AR_ATTN_MLA;
    const int hq = cfg->model.num_q_heads, dv = mla ? cfg->model.v_head_dim : cfg->model.head_size;
    /* NaN / Inf anywhere in the output fails the step, checked rows or not. */
    res->nan_count = count_nan(out, lse, b->num_tokens, hq, dv);
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
    pool_job job = {items, b->num_reqs, 0, wts, opts->cancel};
    pthread_t tid[64];
    int started = 0;
    for (int t = 1; t < threads && t < 64; t++)
        if (pthread_create(&tid[started], NULL, pool_worker, &job) == 0) started++;
    pool_worker(&job);
    for (int t = 0; t < started; t++) pthread_join(tid[t], NULL);

    ar_verify_sums sums = {0, 0, 0, 0, 0};
    int rc = 0;
    for (int r = 0; r < b->num_reqs; r++) {
        req_check *w = &items[r];
        if (w->cancelled) rc = AR_VERIFY_CANCELLED;
        if (w->failed && rc != AR_VERIFY_CANCELLED) {
            snprintf(err, err_len, "%s", w->err[0] ? w->err : "dump write failed");
            rc = -1;
        }
        res->rows_checked += w->rows;
        sums.elems += w->elems;
        sums.sum_abs += w->sum_abs;
        sums.sum_sq_err += w->sum_sq_err;
        sums.sum_sq_ref += w->sum_sq_ref;
        sums.naive_sum_abs += w->naive_sum_abs;
        if (w->max_abs > res->max_abs || isnan(w->max_abs)) res->max_abs = w->max_abs;
        if (w->max_rel > res->max_rel) res->max_rel = w->max_rel;
        if (w->lse_max > res->lse_max_abs) res->lse_max_abs = w->lse_max;
        if (w->naive_max > res->naive_max_abs) res->naive_max_abs = w->naive_max;
        if (w->naive_lse_max > res->naive_lse_max_abs) res->naive_lse_max_abs = w->naive_lse_max;
        res->bad_count += w->bad;
        for (int i = 0; i < w->num_worst; i++) merge_worst(res, &w->worst[i]);
    }
    free(items);
    ar_verify_apply_rule(cfg->dtype, &sums, res);
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

int ar_verify_host_reference(const ar_run_config *cfg, const ar_batch *b, int layer, int r, int nrows,
                             const int *rows, int head0, int heads, double *ref_o, double *ref_l,
                             double *nv_o, double *nv_l)
{
    const ar_model *m = &cfg->model;
    const uint64_t *keys_row = b->block_keys + (size_t)r * b->max_blocks_per_req;
    if (nrows <= 0) return 0;
    int *qpos = malloc(sizeof(int) * (size_t)nrows);
    if (!qpos) return -1;
    for (int i = 0; i < nrows; i++) qpos[i] = b->context_lens[r] + rows[i];
    int kmin, kmax, rc = -1;
    visible_keys(cfg, qpos, nrows, b->seq_lens[r], &kmin, &kmax);
    if (m->attention != AR_ATTN_MLA) {
        const int group = m->num_q_heads / m->num_kv_heads;
        if (head0 % group == 0 && heads % group == 0 && head0 + heads <= m->num_q_heads)
            rc = host_reference_mha(cfg, layer, keys_row, b->req_keys[r], nrows, qpos, kmin, kmax, head0 / group,
                                    heads / group, NULL, ref_o, ref_l, nv_o, nv_l);
        free(qpos);
        return rc;
    }
    const int L = m->kv_lora_rank, E = L + m->qk_rope_head_dim, P = m->qk_nope_head_dim, V = m->v_head_dim;
    double *lat = malloc(((size_t)(kmax > 0 ? kmax : 1)) * E * sizeof *lat);
    double *uk = malloc((size_t)L * P * sizeof *uk), *uv = malloc((size_t)L * V * sizeof *uv);
    double *ho = malloc((size_t)nrows * V * sizeof *ho), *hl = malloc((size_t)nrows * sizeof *hl);
    double *no = malloc((size_t)nrows * V * sizeof *no), *nl = malloc((size_t)nrows * sizeof *nl);
    if (lat && uk && uv && ho && hl && no && nl) {
        gather_latent(cfg, layer, keys_row, kmax, lat);
        rc = 0;
        for (int h = 0; h < heads && rc == 0; h++) {
            mla_head_weights(cfg, layer, head0 + h, uk, uv);
            rc = host_reference_mla_head(cfg, layer, b->req_keys[r], nrows, qpos, kmax, lat, head0 + h, uk, uv, ho, hl,
                                         nv_o ? no : NULL, nv_l ? nl : NULL);
            for (int i = 0; rc == 0 && i < nrows; i++) {
                memcpy(ref_o + ((size_t)i * heads + h) * V, ho + (size_t)i * V, sizeof(double) * (size_t)V);
                ref_l[(size_t)h * nrows + i] = hl[i];
                if (nv_o) memcpy(nv_o + ((size_t)i * heads + h) * V, no + (size_t)i * V, sizeof(double) * (size_t)V);
                if (nv_l) nv_l[(size_t)h * nrows + i] = nl[i];
            }
        }
    }
    free(qpos); free(lat); free(uk); free(uv); free(ho); free(hl); free(no); free(nl);
    return rc;
}

/* ---- the cross-check against the C reference --------------------------------------------- */

double ar_crosscheck_diff(int heads, int dv, const double *dev_out, const double *dev_lse,
                          const double *host_out, const double *host_lse, int *worst_head)
{
    double worst = 0;
    int wh = 0;
    for (int h = 0; h < heads; h++) {
        const double *a = dev_out + (size_t)h * dv, *c = host_out + (size_t)h * dv;
        double scale = 1e-6;
        for (int e = 0; e < dv; e++)
            if (fabs(c[e]) > scale) scale = fabs(c[e]);
        double d = 0;
        for (int e = 0; e < dv; e++) {
            double x = fabs(a[e] - c[e]) / scale;
            if (isnan(x)) x = INFINITY;
            if (x > d) d = x;
        }
        double la = dev_lse[h], lc = host_lse[h];
        if (!(isinf(la) && isinf(lc) && (la < 0) == (lc < 0))) {
            double x = fabs(la - lc) / (fabs(lc) > 1 ? fabs(lc) : 1);
            if (isnan(x)) x = INFINITY;
            if (x > d) d = x;
        }
        if (d > worst || h == 0) {
            worst = d;
            wh = h;
        }
    }
    if (worst_head) *worst_head = wh;
    return worst;
}

/* One cross-check: the device reference's values of some heads of one row, and what the C
 * reference needs to recompute them (the batch itself is gone by the time it runs). */
typedef struct xjob {
    int64_t step;
    int layer, r, row, pos, seq, kmin;
    char req_id[96];
    uint64_t req_key;
    uint64_t *keys;           /* [pos / block_size + 1] content keys of the request's blocks */
    int head0, heads;         /* MHA: the query heads of one KV head; MLA: one head */
    double *dev_out, *dev_lse;   /* [heads, dv], [heads] */
} xjob;

static void xjob_free(xjob *j)
{
    if (!j) return;
    free(j->keys);
    free(j->dev_out);
    free(j->dev_lse);
    free(j);
}

/* The C reference of job j (host_out [heads, dv], host_lse [heads]).  0 or -1 (out of memory). */
static int crosscheck_host(const ar_run_config *c, const xjob *j, double *host_out, double *host_lse)
{
    const ar_model *m = &c->model;
    const int keys = j->pos + 1 < j->seq ? j->pos + 1 : j->seq;
    if (m->attention != AR_ATTN_MLA) {
        const int group = m->num_q_heads / m->num_kv_heads;
        return host_reference_mha(c, j->layer, j->keys, j->req_key, 1, &j->pos, j->kmin, keys, j->head0 / group, 1,
                                  NULL, host_out, host_lse, NULL, NULL);
    }
    const int L = m->kv_lora_rank, E = L + m->qk_rope_head_dim;
    double *lat = malloc(((size_t)(keys > 0 ? keys : 1)) * E * sizeof *lat);
    double *uk = malloc((size_t)L * m->qk_nope_head_dim * sizeof *uk);
    double *uv = malloc((size_t)L * m->v_head_dim * sizeof *uv);
    int rc = -1;
    if (lat && uk && uv) {
        gather_latent(c, j->layer, j->keys, keys, lat);
        mla_head_weights(c, j->layer, j->head0, uk, uv);
        rc = host_reference_mla_head(c, j->layer, j->req_key, 1, &j->pos, keys, lat, j->head0, uk, uv, host_out,
                                     host_lse, NULL, NULL);
    }
    free(lat);
    free(uk);
    free(uv);
    return rc;
}

/* ---- the run's verifier ----------------------------------------------------------------- */

struct ar_verifier {
    ar_run_config cfg;
    ar_verifier_options opt;
    ar_gpu_ref *gpu;          /* NULL: host */
    int dv;
    /* the step's checked rows (device path) */
    int *rows, *req_row0;
    int rows_cap, reqs_cap;
    double *probe_out, *probe_lse;
    /* cross-check worker */
    pthread_t thread;
    bool thread_started, stop, busy;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    xjob *pending;
    int64_t last_xstep, counter;
    ar_crosscheck_stats xs;
    double tol;
    bool fail_pending;
    char fail_msg[384];
    /* device totals for the summary line */
    int64_t checks;
    double device_s, plan_s;
};

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *crosscheck_worker(void *arg)
{
    ar_verifier *v = arg;
    pthread_mutex_lock(&v->mu);
    for (;;) {
        while (!v->pending && !v->stop) pthread_cond_wait(&v->cv, &v->mu);
        if (!v->pending) break;
        xjob *j = v->pending;
        v->pending = NULL;
        pthread_mutex_unlock(&v->mu);
        double t0 = wall_s();
        double *ho = malloc((size_t)j->heads * v->dv * sizeof *ho), *hl = malloc((size_t)j->heads * sizeof *hl);
        int rc = ho && hl ? crosscheck_host(&v->cfg, j, ho, hl) : -1;
        int wh = 0;
        double d = rc == 0 ? ar_crosscheck_diff(j->heads, v->dv, j->dev_out, j->dev_lse, ho, hl, &wh) : 0;
        double took = wall_s() - t0;
        pthread_mutex_lock(&v->mu);
        v->xs.host_s += took;
        if (rc != 0) {
            v->xs.skipped++;   /* out of host memory: not a verdict on the device */
        } else {
            v->xs.done++;
            if (d > v->xs.max_diff || isnan(d)) v->xs.max_diff = d;
            if (!(d <= v->tol)) {
                v->xs.failed++;
                if (!v->fail_pending) {
                    v->fail_pending = true;
                    snprintf(v->fail_msg, sizeof v->fail_msg,
                             "step %lld layer %d: the device reference disagrees with the C reference on request %s "
                             "(batch index %d), row %d, head %d: relative difference %.3g > %g",
                             (long long)j->step, j->layer, j->req_id, j->r, j->row, j->head0 + wh, d, v->tol);
                }
            }
        }
        v->busy = false;
        pthread_cond_broadcast(&v->cv);
        free(ho);
        free(hl);
        xjob_free(j);
    }
    pthread_mutex_unlock(&v->mu);
    return NULL;
}

/* Returns -1 with err set when a cross-check failure waits to be reported. */
static int take_failure(ar_verifier *v, char *err, size_t err_len)
{
    int rc = 0;
    pthread_mutex_lock(&v->mu);
    if (v->fail_pending) {
        snprintf(err, err_len, "%s", v->fail_msg);
        v->fail_pending = false;
        rc = -1;
    }
    pthread_mutex_unlock(&v->mu);
    return rc;
}

int ar_verifier_open_with(ar_verifier **out, const ar_run_config *cfg, const ar_backend *be,
                          const ar_verifier_options *o, char *err, size_t err_len)
{
    *out = NULL;
    ar_verifier *v = calloc(1, sizeof *v);
    if (!v) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    v->cfg = *cfg;
    if (o) v->opt = *o;
    v->last_xstep = INT64_MIN;
    const char *env = getenv("ATTNREPLAY_CROSSCHECK_WAIT");
    if (env && strcmp(env, "1") == 0) v->opt.crosscheck_wait = true;
    env = getenv("ATTNREPLAY_CROSSCHECK_TOL");
    if (env && *env && !(v->opt.crosscheck_tol > 0)) v->opt.crosscheck_tol = strtod(env, NULL);
    v->tol = v->opt.crosscheck_tol > 0 ? v->opt.crosscheck_tol : AR_CROSSCHECK_TOL;
    v->dv = cfg->model.attention == AR_ATTN_MLA ? cfg->model.v_head_dim : cfg->model.head_size;
    const char *where = v->opt.where ? v->opt.where : getenv("ATTNREPLAY_VERIFY_ON");
    if (!where || !*where) where = "auto";
    if (strcmp(where, "auto") != 0 && strcmp(where, "host") != 0 && strcmp(where, "device") != 0) {
        snprintf(err, err_len, "verification place '%s' unknown (auto, host, device)", where);
        free(v);
        return -1;
    }
    const bool want_device = strcmp(where, "device") == 0;
    if (strcmp(where, "host") != 0) {
        char why[256] = "";
        if (!be || !be->needs_gpu) {
            snprintf(why, sizeof why, "backend %s does not leave its output on a CUDA device", be ? be->name : "(none)");
        } else if (cfg->model.attention == AR_ATTN_MLA && cfg->dtype == AR_FP32) {
            /* mla_naive_absorbed sums in float for fp32; the device twin sums in double throughout */
            snprintf(why, sizeof why, "fp32 MLA: the device yardstick sums in double, the host's in float as an "
                     "fp32 kernel does");
        } else if (ar_gpu_ref_available(why, sizeof why) &&
                   ar_gpu_ref_open(&v->gpu, cfg, v->opt.device_mem, why, sizeof why) == 0) {
            why[0] = '\0';
        }
        if (!v->gpu && want_device) {
            snprintf(err, err_len, "cannot verify on the device: %s", why);
            free(v);
            return -1;
        }
        if (!v->gpu && be && be->needs_gpu)
            fprintf(stderr, "attnreplay: verifying on the host (%s)\n", why);
    }
    if (v->gpu) {
        pthread_mutex_init(&v->mu, NULL);
        pthread_cond_init(&v->cv, NULL);
        if (pthread_create(&v->thread, NULL, crosscheck_worker, v) != 0) {
            snprintf(err, err_len, "cannot start the cross-check thread");
            ar_gpu_ref_close(v->gpu);
            pthread_mutex_destroy(&v->mu);
            pthread_cond_destroy(&v->cv);
            free(v);
            return -1;
        }
        v->thread_started = true;
        v->probe_out = malloc((size_t)cfg->model.num_q_heads * v->dv * sizeof *v->probe_out);
        v->probe_lse = malloc((size_t)cfg->model.num_q_heads * sizeof *v->probe_lse);
        if (!v->probe_out || !v->probe_lse) {
            snprintf(err, err_len, "out of memory");
            ar_verifier_close(v);
            return -1;
        }
    }
    *out = v;
    return 0;
}

int ar_verifier_open(ar_verifier **v, const ar_run_config *cfg, const ar_backend *be,
                     char *err, size_t err_len)
{
    return ar_verifier_open_with(v, cfg, be, NULL, err, err_len);
}

bool ar_verifier_needs_host_output(const ar_verifier *v, const ar_verify_opts *opts)
{
    if (!v->gpu) return true;
    return opts && opts->dump_dir;
}

const char *ar_verifier_where(const ar_verifier *v)
{
    return v->gpu ? "device" : "host";
}

/* Hands the cross-check of this step to the worker (or counts it skipped when the previous one
 * still runs).  probe values are in v->probe_out / probe_lse. */
static void post_crosscheck(ar_verifier *v, const ar_batch *b, int layer, const char *const *req_ids, int r,
                            int row, int head0, int heads)
{
    const int bs = v->cfg.block_size, pos = b->context_lens[r] + row;
    pthread_mutex_lock(&v->mu);
    bool busy = v->busy;
    pthread_mutex_unlock(&v->mu);
    if (busy && !v->opt.crosscheck_wait) {
        pthread_mutex_lock(&v->mu);
        v->xs.skipped++;
        pthread_mutex_unlock(&v->mu);
        return;
    }
    if (busy) {   /* crosscheck_wait: the previous one first */
        pthread_mutex_lock(&v->mu);
        while (v->busy) pthread_cond_wait(&v->cv, &v->mu);
        pthread_mutex_unlock(&v->mu);
    }
    xjob *j = calloc(1, sizeof *j);
    int nblocks = pos / bs + 1;
    if (j) {
        j->keys = malloc(sizeof(uint64_t) * (size_t)nblocks);
        j->dev_out = malloc(sizeof(double) * (size_t)heads * v->dv);
        j->dev_lse = malloc(sizeof(double) * (size_t)heads);
    }
    if (!j || !j->keys || !j->dev_out || !j->dev_lse) {
        xjob_free(j);
        pthread_mutex_lock(&v->mu);
        v->xs.skipped++;
        pthread_mutex_unlock(&v->mu);
        return;
    }
    j->step = b->step;
    j->layer = layer;
    j->r = r;
    j->row = row;
    j->pos = pos;
    j->seq = b->seq_lens[r];
    j->req_key = b->req_keys[r];
    if (req_ids && req_ids[r]) snprintf(j->req_id, sizeof j->req_id, "%s", req_ids[r]);
    else snprintf(j->req_id, sizeof j->req_id, "#%d", r);
    memcpy(j->keys, b->block_keys + (size_t)r * b->max_blocks_per_req, sizeof(uint64_t) * (size_t)nblocks);
    /* the device planned this request's chunks from its first checked row's window start */
    const int win = v->cfg.model.attention == AR_ATTN_MLA ? 0 : v->cfg.model.sliding_window;
    const int first = b->context_lens[r] + v->rows[v->req_row0[r]];
    j->kmin = win > 0 && first - win + 1 > 0 ? first - win + 1 : 0;
    j->head0 = head0;
    j->heads = heads;
    memcpy(j->dev_out, v->probe_out, sizeof(double) * (size_t)heads * v->dv);
    memcpy(j->dev_lse, v->probe_lse, sizeof(double) * (size_t)heads);
    j->dev_out[0] += v->opt.crosscheck_tamper;
    pthread_mutex_lock(&v->mu);
    v->pending = j;
    v->busy = true;
    pthread_cond_broadcast(&v->cv);
    if (v->opt.crosscheck_wait)
        while (v->busy) pthread_cond_wait(&v->cv, &v->mu);
    pthread_mutex_unlock(&v->mu);
}

static int check_layer_device(ar_verifier *v, const ar_batch *b, int layer, const ar_forward_out *fo,
                              const char *const *req_ids, const ar_verify_opts *opts, ar_verify_result *res,
                              char *err, size_t err_len)
{
    const ar_run_config *cfg = &v->cfg;
    const int R = b->num_reqs, hq = cfg->model.num_q_heads;
    memset(res, 0, sizeof *res);
    if (!fo->dev_out || !fo->dev_lse) {
        snprintf(err, err_len, "device verification: the backend left no output on the device");
        return -1;
    }
    ar_gpu_ref_output go = {fo->dev_out, fo->dev_out_type, fo->dev_lse, fo->dev_stream};
    if (opts->mode == AR_VERIFY_OFF) {
        if (ar_gpu_ref_nan_count(v->gpu, b, &go, &res->nan_count, err, err_len) != 0) return -1;
        res->pass = res->nan_count == 0;
        if (!res->pass) snprintf(res->reason, sizeof res->reason, "NaN/Inf in output");
        return 0;
    }
    /* the rows: replay/verify.c's choice, request by request */
    if (R + 1 > v->reqs_cap) {
        int *p = realloc(v->req_row0, sizeof(int) * (size_t)(R + 1));
        if (!p) goto oom;
        v->req_row0 = p;
        v->reqs_cap = R + 1;
    }
    if (b->num_tokens > v->rows_cap) {
        int *p = realloc(v->rows, sizeof(int) * (size_t)b->num_tokens);
        if (!p) goto oom;
        v->rows = p;
        v->rows_cap = b->num_tokens;
    }
    int nrows = 0;
    for (int r = 0; r < R; r++) {
        v->req_row0[r] = nrows;
        int n = b->query_start_loc[r + 1] - b->query_start_loc[r];
        if (n > 0) nrows += ar_verify_choose_rows(opts, n, b->num_tokens, v->rows + nrows);
    }
    v->req_row0[R] = nrows;
    /* the cross-check probe: the first verified layer of a step, rotating over requests and heads */
    int xr = -1, xhead0 = 0, xheads = 0;
    if (b->step != v->last_xstep && nrows > 0) {
        v->last_xstep = b->step;
        int64_t c = v->counter++;
        for (int k = 0; k < R && xr < 0; k++) {
            int r = (int)((c + k) % R);
            if (v->req_row0[r + 1] > v->req_row0[r]) xr = r;
        }
        if (cfg->model.attention == AR_ATTN_MLA) {
            xhead0 = (int)((c + c / R) % hq);
            xheads = 1;
        } else {
            int hkv = cfg->model.num_kv_heads, group = hq / hkv;
            xhead0 = (int)((c + c / R) % hkv) * group;
            xheads = group;
        }
    }
    ar_gpu_ref_rows gr = {nrows, v->req_row0, v->rows};
    ar_gpu_ref_copy copy;
    memset(&copy, 0, sizeof copy);
    copy.probe_row = xr >= 0 ? v->req_row0[xr + 1] - 1 : -1;
    copy.probe_head0 = xhead0;
    copy.probe_heads = xr >= 0 ? xheads : 0;
    copy.probe_out = v->probe_out;
    copy.probe_lse = v->probe_lse;
    ar_gpu_ref_summary s;
    int rc = ar_gpu_ref_check(v->gpu, b, layer, &gr, &go, opts->cancel, &copy, &s, err, err_len);
    if (rc == AR_GPU_REF_CANCELLED) return AR_VERIFY_CANCELLED;
    if (rc != 0) return -1;
    v->checks++;
    v->device_s += s.device_s;
    v->plan_s += s.plan_s;
    res->rows_checked = nrows;
    res->max_abs = s.max_abs;
    res->max_rel = s.max_rel;
    res->lse_max_abs = s.lse_max;
    res->naive_max_abs = s.naive_max;
    res->naive_lse_max_abs = s.naive_lse_max;
    res->bad_count = s.bad;
    res->nan_count = s.nan_count;
    for (int k = 0; k < s.num_worst && k < AR_VERIFY_WORST; k++) {
        const ar_gpu_ref_worst *w = &s.worst[k];
        int lo = 0, hi = R - 1;   /* the request of checked row w->row */
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (v->req_row0[mid] <= w->row) lo = mid;
            else hi = mid - 1;
        }
        res->worst[res->num_worst++] = (ar_worst){lo, v->rows[w->row], w->head, w->dim, w->got, w->want, w->err};
    }
    ar_verify_sums sums = {s.elems, s.sum_abs, s.sum_sq_err, s.sum_sq_ref, s.naive_sum_abs};
    ar_verify_apply_rule(cfg->dtype, &sums, res);
    if (xr >= 0) post_crosscheck(v, b, layer, req_ids, xr, v->rows[v->req_row0[xr + 1] - 1], xhead0, xheads);
    return take_failure(v, err, err_len);
oom:
    snprintf(err, err_len, "out of memory");
    return -1;
}

int ar_verifier_check_layer(ar_verifier *v, const ar_batch *b, int layer, const ar_forward_out *fo,
                            const char *const *req_ids, const ar_verify_opts *opts,
                            ar_verify_result *res, char *err, size_t err_len)
{
    if (v->gpu && take_failure(v, err, err_len) != 0) return -1;
    if (v->gpu && !opts->dump_dir)
        return check_layer_device(v, b, layer, fo, req_ids, opts, res, err, err_len);
    if (!fo->out || !fo->lse) {
        snprintf(err, err_len, "host verification needs the output on the host");
        return -1;
    }
    return ar_verify_step(&v->cfg, b, layer, fo->out, fo->lse, req_ids, opts, res, err, err_len);
}

void ar_verifier_crosscheck_stats(const ar_verifier *v, ar_crosscheck_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!v || !v->gpu) return;
    pthread_mutex_lock((pthread_mutex_t *)&v->mu);
    *st = v->xs;
    pthread_mutex_unlock((pthread_mutex_t *)&v->mu);
}

int ar_verifier_finish(ar_verifier *v, char *line, size_t line_len, char *err, size_t err_len)
{
    if (line && line_len) line[0] = '\0';
    if (!v->gpu) return 0;
    pthread_mutex_lock(&v->mu);
    while (v->busy) pthread_cond_wait(&v->cv, &v->mu);
    ar_crosscheck_stats xs = v->xs;
    pthread_mutex_unlock(&v->mu);
    if (line && line_len) {
        ar_gpu_ref_stats gs;
        ar_gpu_ref_get_stats(v->gpu, &gs);
        int at = snprintf(line, line_len,
                          "verified on the device: %lld checks in %.1f s (planning %.1f s), %lld blocks made into a "
                          "cache of %d (%.1f GiB, scratch up to %.1f GiB); C reference cross-check: %lld rows (%lld "
                          "skipped while one ran), max relative difference %.2g, %.1f s of host time",
                          (long long)v->checks, v->device_s + v->plan_s, v->plan_s, (long long)gs.blocks_generated,
                          gs.cache_slots, gs.cache_gib, gs.scratch_gib, (long long)xs.done, (long long)xs.skipped,
                          xs.max_diff, xs.host_s);
        if (gs.gen_ms + gs.ref_ms + gs.naive_ms + gs.compare_ms > 0 && at > 0 && (size_t)at < line_len)
            snprintf(line + at, line_len - (size_t)at,
                     "; device phases (ATTNREPLAY_GPU_REF_PROFILE=1): blocks made %.1f s, reference %.1f s, "
                     "yardstick apart %.1f s, comparison %.1f s",
                     gs.gen_ms / 1e3, gs.ref_ms / 1e3, gs.naive_ms / 1e3, gs.compare_ms / 1e3);
    }
    return take_failure(v, err, err_len);
}

void ar_verifier_close(ar_verifier *v)
{
    if (!v) return;
    if (v->thread_started) {
        pthread_mutex_lock(&v->mu);
        v->stop = true;
        pthread_cond_broadcast(&v->cv);
        pthread_mutex_unlock(&v->mu);
        pthread_join(v->thread, NULL);
        if (v->fail_pending) fprintf(stderr, "attnreplay: %s\n", v->fail_msg);
        xjob_free(v->pending);
        pthread_mutex_destroy(&v->mu);
        pthread_cond_destroy(&v->cv);
    }
    ar_gpu_ref_close(v->gpu);
    free(v->rows);
    free(v->req_row0);
    free(v->probe_out);
    free(v->probe_lse);
    free(v);
}
