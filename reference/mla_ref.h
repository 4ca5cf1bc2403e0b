/* mla_ref.h - MLA (DeepSeek-V2/V3 multi-head latent attention): dimensions, the generator
 * recipe of its weights, and the float64 reference (semantics section 7).
 *
 * Per token the cache holds one 576-wide entry [kv_c (kv_lora_rank) | k_pe (rope dim)]
 * (stream AR_STREAM_LATENT, head 0, rounded to dtype).  Query head n has q_nope (nope dim,
 * AR_STREAM_Q_NOPE) and q_pe (rope dim, AR_STREAM_Q_PE).  Weights W_UK [L, N, P] and
 * W_UV [L, N, V] come from AR_STREAM_W_UK / W_UV with key 0, pos = latent row l, head = n,
 * element = column, scaled by 1/sqrt(kv_lora_rank) in float and rounded to dtype.
 *
 * The reference computes the EXPANDED form (what the model means):
 *   k_nope[j,n] = c_j W_UK[:,n,:]   v[j,n] = c_j W_UV[:,n,:]
 *   s_j = scale * (q_nope[n] . k_nope[j,n] + q_pe[n] . k_pe[j])   (bottom-right causal)
 *   out[n] = softmax(s) . v[:,n]  (V dim), lse[n] = ln sum exp(s)
 * ar_mla_ref_attend_absorbed computes the same function in the absorbed order
 * (ql = W_UK q_nope, scores over the latent, then W_UV) so a test can show both agree. */
#ifndef AR_MLA_REF_H
#define AR_MLA_REF_H

#include <math.h>
#include "datagen.h"
#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ar_mla_dims {
    int num_heads;           /* N (DeepSeek-V3: 128) */
    int kv_lora_rank;        /* L (512) */
    int qk_rope_head_dim;    /* R (64) */
    int qk_nope_head_dim;    /* P (128) */
    int v_head_dim;          /* V (128) */
    double scale;            /* softmax scale (DeepSeek-V3 with YaRN mscale: 0.1352338) */
} ar_mla_dims;

#define AR_MLA_DEEPSEEK_SCALE 0.1352338

/* DeepSeek-V3 dims with num_heads heads. */
ar_mla_dims ar_mla_deepseek_dims(int num_heads);

/* An MLA model's dims (traces/trace.h's ar_model): its own where set, DeepSeek-V3's where zero. */
struct ar_model;
ar_mla_dims ar_mla_model_dims(const struct ar_model *m);

/* Element (row l, head n, column c) of W_UK or W_UV (stream AR_STREAM_W_UK / AR_STREAM_W_UV)
 * as the backends and the reference use it: generated, times 1/sqrt(kv_lora_rank) in float,
 * rounded to dtype t. */
AR_HOSTDEV float ar_mla_weight(uint64_t seed, uint32_t stream, uint32_t layer, int kv_lora_rank,
                               int l, int n, int c, ar_datadist dist, ar_dtype t)
{
    float inv = (float)(1.0 / sqrt((double)kv_lora_rank));
    uint64_t row = ar_gen_row(seed, stream, layer, 0, (uint64_t)l, (uint32_t)n);
    return ar_round_to(t, ar_gen_value(row, (uint32_t)c, dist) * inv);
}

/* Every element of one layer's weights (ar_mla_weight), as doubles in the layouts the
 * reference takes: w_uk [L, N, P], w_uv [L, N, V]. */
void ar_mla_gen_weights(const ar_mla_dims *d, uint64_t seed, uint32_t layer, ar_datadist dist,
                        ar_dtype dtype, double *w_uk, double *w_uv);

/* Float64 MLA attention of one request, expanded form.
 *   q_nope [num_rows, N, P], q_pe [num_rows, N, R], q_pos [num_rows] absolute positions
 *   latent [num_keys, L + R]  entries of keys at positions 0 .. num_keys-1
 *   w_uk   [L, N, P], w_uv [L, N, V]
 *   out    [num_rows, N, V],  lse [N, num_rows]  (empty row: out 0, lse -inf)
 * Returns 0, or -1 (message on stderr, out/lse NaN) for bad dimensions or no memory. */
int ar_mla_ref_attend(const ar_mla_dims *d, int num_rows, const double *q_nope,
                      const double *q_pe, const int *q_pos, int num_keys, const double *latent,
                      const double *w_uk, const double *w_uv, double *out, double *lse);

/* The same function in the absorbed order (same arguments, same result up to rounding). */
int ar_mla_ref_attend_absorbed(const ar_mla_dims *d, int num_rows, const double *q_nope,
                               const double *q_pe, const int *q_pos, int num_keys,
                               const double *latent, const double *w_uk, const double *w_uv,
                               double *out, double *lse);

#ifdef __cplusplus
}
#endif
#endif
