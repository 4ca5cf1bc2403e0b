/* reference.h - the float64 reference attention, the naive same-dtype twin, and the LSE merge.
 *
 * The reference works on logical positions only: callers gather a request's keys/values in
 * logical order (position 0..s-1) straight from the data generator; it never sees the paged
 * cache, so a backend that reads the wrong slot disagrees with it.
 *
 * Semantics (DESIGN section 5): query row i has absolute position q_pos[i]; key j has absolute
 * position key_pos0 + j.  With causal, key j is visible iff key_pos <= q_pos; with a sliding
 * window W > 0 additionally key_pos >= q_pos - W + 1 (the window applies only with causal).  score = scale * q.k, soft-capped as
 * cap * tanh(score / cap) when cap > 0; out = softmax(score) . V; lse = natural log of the
 * softmax denominator (sum of exp(score)).  A row that sees no key gets out = 0, lse = -inf.
 * GQA: query head h reads KV head h / (num_q_heads / num_kv_heads). */
#ifndef AR_REFERENCE_H
#define AR_REFERENCE_H

#include <stdbool.h>
#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ar_attn_params {
    int num_q_heads;
    int num_kv_heads;
    int head_size;        /* QK dim */
    int v_head_size;      /* V dim (= head_size for MHA) */
    double scale;
    int sliding_window;   /* 0 = none */
    double soft_cap;      /* 0 = none */
    bool causal;
} ar_attn_params;

/* Float64 attention of one request (or one pass of a cascade).
 *   q     [num_rows, num_q_heads, head_size]     query rows
 *   q_pos [num_rows]                             absolute positions (ignored when !causal)
 *   k     [num_keys, num_kv_heads, head_size]    keys at positions key_pos0 ..
 *   v     [num_keys, num_kv_heads, v_head_size]
 *   out   [num_rows, num_q_heads, v_head_size]
 *   lse   [num_q_heads, num_rows]
 * All query rows that share a KV head are processed together over tiles of keys, so each K/V
 * row is read once per group, not once per query row. */
void ar_ref_attend(const ar_attn_params *p, int num_rows, const double *q, const int *q_pos,
                   int num_keys, int key_pos0, const double *k, const double *v,
                   double *out, double *lse);

/* The same function computed the naive way - one query row and one head at a time, a double
 * loop over keys.  Used only by the benchmark that shows ar_ref_attend is faster, and by tests
 * as an independent second implementation. */
void ar_ref_attend_naive(const ar_attn_params *p, int num_rows, const double *q, const int *q_pos,
                         int num_keys, int key_pos0, const double *k, const double *v,
                         double *out, double *lse);

/* FlashAttention's "out_pt" (attention_ref(upcast=False, reorder_ops=True)): the same math done
 * in the run's dtype the way a plain framework does it - K scaled by `scale` and rounded to
 * dtype, q.k_scaled accumulated in float then rounded to dtype, soft cap as three rounded dtype
 * ops, softmax in float rounded to dtype, P.V accumulated in float and rounded to dtype.  For
 * fp8 the math runs in bf16 and P is also rounded through fp8 (FA3's fp8 tests).  Its error against
 * ar_ref_attend is the yardstick of the pass rule (DESIGN section 7).  Inputs already rounded. */
void ar_naive_dtype_attend(const ar_attn_params *p, ar_dtype dtype, int num_rows, const float *q,
                           const int *q_pos, int num_keys, int key_pos0, const float *k,
                           const float *v, float *out, float *lse);

/* LSE-weighted merge of two partial attentions (vLLM merge_attn_states, section 6):
 * +inf LSEs are read as -inf (empty side); both empty -> out = a's out, lse = -inf.
 *   a_out, b_out, out [num_rows, num_heads, head_size]; a_lse, b_lse, lse [num_heads, num_rows]. */
void ar_ref_merge(int num_rows, int num_heads, int head_size,
                  const double *a_out, const double *a_lse,
                  const double *b_out, const double *b_lse, double *out, double *lse);

#ifdef __cplusplus
}
#endif
#endif
