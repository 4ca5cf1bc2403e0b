/* mla_ref.c - the float64 MLA reference (see mla_ref.h): expanded and absorbed forms, both
 * built on ar_ref_attend so the masking and softmax rules are the ones every other path is
 * checked against.
 *
 * Expanded: keys/values are up-projected per head (k = [c W_UK_n | k_pe], v = c W_UV_n) and
 * attended as MHA with N KV heads of head size P + R and V dim V.
 * Absorbed: the query is moved into latent space (ql_n = W_UK_n q_nope_n), attended as MQA
 * over the 576-wide entries with values = the latent (first L), then out_n = o_lat W_UV_n. */
#include "mla_ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../traces/trace.h"
#include "reference.h"

ar_mla_dims ar_mla_deepseek_dims(int num_heads)
{
    ar_mla_dims d = {num_heads, 512, 64, 128, 128, AR_MLA_DEEPSEEK_SCALE};
    return d;
}

ar_mla_dims ar_mla_model_dims(const ar_model *m)
{
    ar_mla_dims d = ar_mla_deepseek_dims(m->num_q_heads);
    if (m->kv_lora_rank > 0) d.kv_lora_rank = m->kv_lora_rank;
    if (m->qk_rope_head_dim > 0) d.qk_rope_head_dim = m->qk_rope_head_dim;
    if (m->qk_nope_head_dim > 0) d.qk_nope_head_dim = m->qk_nope_head_dim;
    if (m->v_head_dim > 0) d.v_head_dim = m->v_head_dim;
    if (m->scale > 0) d.scale = m->scale;
    return d;
}

void ar_mla_gen_weights(const ar_mla_dims *d, uint64_t seed, uint32_t layer, ar_datadist dist,
                        ar_dtype dtype, double *w_uk, double *w_uv)
{
    const int N = d->num_heads, L = d->kv_lora_rank, P = d->qk_nope_head_dim;
    const int V = d->v_head_dim;
    for (int l = 0; l < L; l++)
        for (int n = 0; n < N; n++) {
            for (int c = 0; c < P; c++)
                w_uk[((size_t)l * N + n) * P + c] =
                    ar_mla_weight(seed, AR_STREAM_W_UK, layer, L, l, n, c, dist, dtype);
            for (int c = 0; c < V; c++)
                w_uv[((size_t)l * N + n) * V + c] =
                    ar_mla_weight(seed, AR_STREAM_W_UV, layer, L, l, n, c, dist, dtype);
        }
}

/* Checks dims; on failure prints why and fills out/lse with NaN. */
static int check_dims(const ar_mla_dims *d, const char *fn, int num_rows, int num_keys,
                      double *out, double *lse)
{
    const char *why = NULL;
    if (!d) why = "dims is NULL";
    else if (d->num_heads <= 0 || d->kv_lora_rank <= 0 || d->qk_rope_head_dim < 0 ||
             d->qk_nope_head_dim <= 0 || d->v_head_dim <= 0)
        why = "dimensions must be positive (rope dim >= 0)";
    else if (num_rows < 0 || num_keys < 0) why = "num_rows and num_keys must be >= 0";
    if (!why) return 0;
    fprintf(stderr, "reference/mla_ref.c: %s: invalid parameters: %s\n", fn, why);
    if (d && d->num_heads > 0 && d->v_head_dim > 0 && num_rows > 0) {
        for (size_t i = 0; out && i < (size_t)num_rows * d->num_heads * d->v_head_dim; i++)
            out[i] = NAN;
        for (size_t i = 0; lse && i < (size_t)num_rows * d->num_heads; i++) lse[i] = NAN;
    }
    return -1;
}

static void fail_nan(const ar_mla_dims *d, const char *fn, int num_rows, double *out,
                     double *lse)
{
    fprintf(stderr, "reference/mla_ref.c: %s: out of memory\n", fn);
    for (size_t i = 0; i < (size_t)num_rows * d->num_heads * d->v_head_dim; i++) out[i] = NAN;
    for (size_t i = 0; i < (size_t)num_rows * d->num_heads; i++) lse[i] = NAN;
}

/* y[i] += a * x[i] for i < n. */
static void axpy(double *restrict y, const double *restrict x, double a, size_t n)
{
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        y[i] += a * x[i];
        y[i + 1] += a * x[i + 1];
        y[i + 2] += a * x[i + 2];
        y[i + 3] += a * x[i + 3];
    }
    for (; i < n; i++) y[i] += a * x[i];
}

int ar_mla_ref_attend(const ar_mla_dims *d, int num_rows, const double *q_nope,
                      const double *q_pe, const int *q_pos, int num_keys, const double *latent,
                      const double *w_uk, const double *w_uv, double *out, double *lse)
{
    if (check_dims(d, "ar_mla_ref_attend", num_rows, num_keys, out, lse)) return -1;
    const int N = d->num_heads, L = d->kv_lora_rank, R = d->qk_rope_head_dim;
    const int P = d->qk_nope_head_dim, V = d->v_head_dim, E = L + R, QK = P + R;
    double *q = malloc(sizeof(double) * ((size_t)num_rows * N * QK + 1));
    double *k = malloc(sizeof(double) * ((size_t)num_keys * N * QK + 1));
    double *v = malloc(sizeof(double) * ((size_t)num_keys * N * V + 1));
    double *k_nope = malloc(sizeof(double) * ((size_t)N * P + 1));
    if (!q || !k || !v || !k_nope) {
        free(q); free(k); free(v); free(k_nope);
        fail_nan(d, "ar_mla_ref_attend", num_rows, out, lse);
        return -1;
    }
    for (int i = 0; i < num_rows; i++)
        for (int n = 0; n < N; n++) {
            double *qr = q + ((size_t)i * N + n) * QK;
            memcpy(qr, q_nope + ((size_t)i * N + n) * P, sizeof(double) * (size_t)P);
            memcpy(qr + P, q_pe + ((size_t)i * N + n) * R, sizeof(double) * (size_t)R);
        }
    for (int j = 0; j < num_keys; j++) {
        const double *c = latent + (size_t)j * E;
        double *vj = v + (size_t)j * N * V;
        memset(k_nope, 0, sizeof(double) * (size_t)N * P);
        memset(vj, 0, sizeof(double) * (size_t)N * V);
        for (int l = 0; l < L; l++) {            /* rows of W are [N, P] / [N, V] contiguous */
            axpy(k_nope, w_uk + (size_t)l * N * P, c[l], (size_t)N * P);
            axpy(vj, w_uv + (size_t)l * N * V, c[l], (size_t)N * V);
        }
        for (int n = 0; n < N; n++) {
            double *kr = k + ((size_t)j * N + n) * QK;
            memcpy(kr, k_nope + (size_t)n * P, sizeof(double) * (size_t)P);
            memcpy(kr + P, c + L, sizeof(double) * (size_t)R);
        }
    }
    ar_attn_params p = {N, N, QK, V, d->scale, 0, 0.0, true};
    ar_ref_attend(&p, num_rows, q, q_pos, num_keys, 0, k, v, out, lse);
    free(q); free(k); free(v); free(k_nope);
    return 0;
}

int ar_mla_ref_attend_absorbed(const ar_mla_dims *d, int num_rows, const double *q_nope,
                               const double *q_pe, const int *q_pos, int num_keys,
                               const double *latent, const double *w_uk, const double *w_uv,
                               double *out, double *lse)
{
    if (check_dims(d, "ar_mla_ref_attend_absorbed", num_rows, num_keys, out, lse)) return -1;
    const int N = d->num_heads, L = d->kv_lora_rank, R = d->qk_rope_head_dim;
    const int P = d->qk_nope_head_dim, V = d->v_head_dim, E = L + R;
    double *q = calloc((size_t)num_rows * N * E + 1, sizeof(double));
    double *vals = malloc(sizeof(double) * ((size_t)num_keys * L + 1));
    double *o_lat = malloc(sizeof(double) * ((size_t)num_rows * N * L + 1));
    if (!q || !vals || !o_lat) {
        free(q); free(vals); free(o_lat);
        fail_nan(d, "ar_mla_ref_attend_absorbed", num_rows, out, lse);
        return -1;
    }
    /* ql[i,n,l] = sum_p q_nope[i,n,p] W_UK[l,n,p]; then q_pe. */
    for (int i = 0; i < num_rows; i++)
        for (int n = 0; n < N; n++) {
            double *qr = q + ((size_t)i * N + n) * E;
            const double *qn = q_nope + ((size_t)i * N + n) * P;
            for (int l = 0; l < L; l++) {
                const double *w = w_uk + ((size_t)l * N + n) * P;
                double s = 0;
                for (int c = 0; c < P; c++) s += qn[c] * w[c];
                qr[l] = s;
            }
            memcpy(qr + L, q_pe + ((size_t)i * N + n) * R, sizeof(double) * (size_t)R);
        }
    for (int j = 0; j < num_keys; j++)
        memcpy(vals + (size_t)j * L, latent + (size_t)j * E, sizeof(double) * (size_t)L);
    ar_attn_params p = {N, 1, E, L, d->scale, 0, 0.0, true};
    ar_ref_attend(&p, num_rows, q, q_pos, num_keys, 0, latent, vals, o_lat, lse);
    /* out[i,n,:] = sum_l o_lat[i,n,l] W_UV[l,n,:]. */
    memset(out, 0, sizeof(double) * (size_t)num_rows * N * V);
    for (int i = 0; i < num_rows; i++)
        for (int n = 0; n < N; n++) {
            double *o = out + ((size_t)i * N + n) * V;
            const double *ol = o_lat + ((size_t)i * N + n) * L;
            for (int l = 0; l < L; l++) axpy(o, w_uv + ((size_t)l * N + n) * V, ol[l], (size_t)V);
        }
    free(q); free(vals); free(o_lat);
    return 0;
}
