/* reference.c - the float64 reference attention (fast, grouped), its naive twin, the naive
 * same-dtype "out_pt" yardstick, and the LSE-weighted merge (semantics in reference.h).
 *
 * ar_ref_attend is the one the verifier runs on every step, so it is written for speed while
 * staying plain C: for each KV head it packs that head's keys (transposed, a tile of keys per
 * block) and values once, then takes the query rows x query heads of the group in blocks of
 * vectors and sweeps key tiles.  A score tile (vectors x keys) is computed with eight
 * independent accumulators per vector, while the tile (head_size x 32 keys) stays in L1; an
 * online softmax in double rescales the running output when the running max grows.  Key tiles
 * that no vector of the block can see (causal / sliding window) are skipped.
 *
 * The visible keys of a query row always form one contiguous range [lo, hi) of key indices,
 * which is what makes tile skipping exact.  With !causal every key is visible and q_pos is not
 * read (so it may be NULL); the sliding window applies only together with causal, as in vLLM. */
#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AR_REF_MAX_KEY_TILE 32   /* keys per tile (a multiple of 8) */
#define AR_REF_VEC_BLOCK 16      /* query vectors (row, head) processed together */

/* Checks the shape parameters; on failure prints why and fills out/lse with NaN so that a
 * verifier comparing against them fails loudly instead of crashing. */
static int check_params(const ar_attn_params *p, const char *fn, int num_rows, int num_keys,
                        void *out, void *lse, int elem_size)
{
    const char *why = NULL;
    if (!p) why = "params is NULL";
    else if (p->num_q_heads <= 0 || p->num_kv_heads <= 0) why = "head counts must be > 0";
    else if (p->num_q_heads % p->num_kv_heads != 0)
        why = "num_q_heads must be a multiple of num_kv_heads";
    else if (p->head_size <= 0 || p->v_head_size <= 0) why = "head sizes must be > 0";
    else if (num_rows < 0 || num_keys < 0) why = "num_rows and num_keys must be >= 0";
    if (!why) return 0;
    fprintf(stderr, "reference/reference.c: %s: invalid parameters: %s\n", fn, why);
    if (p && num_rows > 0 && p->num_q_heads > 0 && p->v_head_size > 0) {
        size_t n_out = (size_t)num_rows * (size_t)p->num_q_heads * (size_t)p->v_head_size;
        size_t n_lse = (size_t)num_rows * (size_t)p->num_q_heads;
        for (size_t i = 0; out && i < n_out; i++) {
            if (elem_size == 8) ((double *)out)[i] = NAN;
            else ((float *)out)[i] = NAN;
        }
        for (size_t i = 0; lse && i < n_lse; i++) {
            if (elem_size == 8) ((double *)lse)[i] = NAN;
            else ((float *)lse)[i] = NAN;
        }
    }
    return -1;
}

/* The visible key range [*lo, *hi) (key indices) of a query at absolute position q_pos. */
static void visible_range(const ar_attn_params *p, const int *q_pos, int row, int num_keys,
                          int key_pos0, int *lo, int *hi)
{
    long long first = 0, last = num_keys;   /* [first, last) */
    if (p->causal && q_pos) {
        long long qp = q_pos[row];
        long long limit = qp - (long long)key_pos0 + 1;
        if (limit < last) last = limit;
        if (p->sliding_window > 0) {
            long long start = qp - (long long)p->sliding_window + 1 - key_pos0;
            if (start > first) first = start;
        }
    }
    if (last < 0) last = 0;
    if (first > last) first = last;
    *lo = (int)first;
    *hi = (int)last;
}

static double cap_score(double score, double soft_cap)
{
    return soft_cap > 0 ? soft_cap * tanh(score / soft_cap) : score;
}

/* ---- the fast grouped reference ------------------------------------------------------------ */

/* Score tile: s[i][j] = q_i . k_j for nvec query vectors and key_tile keys.
 *   qb    [nvec, head_size]
 *   ktile [head_size, key_tile]  (keys of the tile transposed; tail keys zero)
 *   s     [nvec, key_tile] */
static void score_tile(int nvec, int head_size, int key_tile, const double *restrict qb,
                       const double *restrict ktile, double *restrict s)
{
    for (int i = 0; i < nvec; i++) {
        const double *restrict qrow = qb + (size_t)i * head_size;
        for (int jc = 0; jc < key_tile; jc += 8) {
            double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
            const double *restrict kcol = ktile + jc;
            for (int d = 0; d < head_size; d++) {
                double qd = qrow[d];
                const double *restrict kr = kcol + (size_t)d * key_tile;
                a0 += qd * kr[0];
                a1 += qd * kr[1];
                a2 += qd * kr[2];
                a3 += qd * kr[3];
                a4 += qd * kr[4];
                a5 += qd * kr[5];
                a6 += qd * kr[6];
                a7 += qd * kr[7];
            }
            double *srow = s + (size_t)i * key_tile + jc;
            srow[0] = a0; srow[1] = a1; srow[2] = a2; srow[3] = a3;
            srow[4] = a4; srow[5] = a5; srow[6] = a6; srow[7] = a7;
        }
    }
}

/* o += sum_j prob[j] * v[j] over n keys, four keys at a time.  No key is skipped for a zero
 * probability, so a NaN value shows in the output as it would in a kernel.
 *   prob [n], v [n, v_head_size], o [v_head_size] */
static void accumulate_pv(int n, int v_head_size, const double *restrict prob,
                          const double *restrict v, double *restrict o)
{
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        double p0 = prob[j], p1 = prob[j + 1], p2 = prob[j + 2], p3 = prob[j + 3];
        const double *restrict v0 = v + (size_t)j * v_head_size;
        const double *restrict v1 = v0 + v_head_size;
        const double *restrict v2 = v1 + v_head_size;
        const double *restrict v3 = v2 + v_head_size;
        for (int e = 0; e < v_head_size; e++)
            o[e] += p0 * v0[e] + p1 * v1[e] + p2 * v2[e] + p3 * v3[e];
    }
    for (; j < n; j++) {
        double pj = prob[j];
        const double *restrict vj = v + (size_t)j * v_head_size;
        for (int e = 0; e < v_head_size; e++) o[e] += pj * vj[e];
    }
}

void ar_ref_attend(const ar_attn_params *p, int num_rows, const double *q, const int *q_pos,
                   int num_keys, int key_pos0, const double *k, const double *v,
                   double *out, double *lse)
{
    if (check_params(p, "ar_ref_attend", num_rows, num_keys, out, lse, 8) != 0) return;
    if (num_rows == 0) return;
    const int hq = p->num_q_heads, hkv = p->num_kv_heads;
    const int group = hq / hkv, hd = p->head_size, hdv = p->v_head_size;
    const int key_tile = hd > 128 ? 16 : AR_REF_MAX_KEY_TILE;
    const int num_tiles = (num_keys + key_tile - 1) / key_tile;
    const int num_vecs = num_rows * group;

    /* kpack [num_tiles, hd, key_tile], vpack [num_keys, hdv], and per-block scratch. */
    double *kpack = malloc(((size_t)num_tiles * hd * key_tile + 1) * sizeof(double));
    double *vpack = malloc(((size_t)num_keys * hdv + 1) * sizeof(double));
    double *qb = malloc((size_t)AR_REF_VEC_BLOCK * hd * sizeof(double));
    double *ob = malloc((size_t)AR_REF_VEC_BLOCK * hdv * sizeof(double));
    double s[AR_REF_VEC_BLOCK * AR_REF_MAX_KEY_TILE];
    double run_max[AR_REF_VEC_BLOCK], run_sum[AR_REF_VEC_BLOCK];
    int lo[AR_REF_VEC_BLOCK], hi[AR_REF_VEC_BLOCK];
    if (!kpack || !vpack || !qb || !ob) {
        fprintf(stderr, "reference/reference.c: ar_ref_attend: out of memory for %d keys\n",
                num_keys);
        for (size_t i = 0; i < (size_t)num_rows * hq * hdv; i++) out[i] = NAN;
        for (size_t i = 0; lse && i < (size_t)num_rows * hq; i++) lse[i] = NAN;
        free(kpack); free(vpack); free(qb); free(ob);
        return;
    }

    for (int g = 0; g < hkv; g++) {
        /* Pack this KV head's keys (transposed per tile, zero tail) and values. */
        for (int t = 0; t < num_tiles; t++) {
            double *kt = kpack + (size_t)t * hd * key_tile;
            for (int jj = 0; jj < key_tile; jj++) {
                int j = t * key_tile + jj;
                const double *krow = k + ((size_t)j * hkv + g) * hd;
                for (int d = 0; d < hd; d++)
                    kt[(size_t)d * key_tile + jj] = j < num_keys ? krow[d] : 0.0;
            }
        }
        for (int j = 0; j < num_keys; j++)
            memcpy(vpack + (size_t)j * hdv, v + ((size_t)j * hkv + g) * hdv,
                   (size_t)hdv * sizeof(double));

        for (int vb = 0; vb < num_vecs; vb += AR_REF_VEC_BLOCK) {
            int nvec = num_vecs - vb < AR_REF_VEC_BLOCK ? num_vecs - vb : AR_REF_VEC_BLOCK;
            int block_lo = num_keys, block_hi = 0;
            for (int i = 0; i < nvec; i++) {
                int row = (vb + i) / group, h = g * group + (vb + i) % group;
                memcpy(qb + (size_t)i * hd, q + ((size_t)row * hq + h) * hd,
                       (size_t)hd * sizeof(double));
                visible_range(p, q_pos, row, num_keys, key_pos0, &lo[i], &hi[i]);
                if (lo[i] < hi[i]) {
                    if (lo[i] < block_lo) block_lo = lo[i];
                    if (hi[i] > block_hi) block_hi = hi[i];
                }
                run_max[i] = -INFINITY;
                run_sum[i] = 0;
                memset(ob + (size_t)i * hdv, 0, (size_t)hdv * sizeof(double));
            }
            for (int t = block_lo / key_tile; block_lo < block_hi && t * key_tile < block_hi; t++) {
                int j0 = t * key_tile;
                int kn = num_keys - j0 < key_tile ? num_keys - j0 : key_tile;
                score_tile(nvec, hd, key_tile, qb, kpack + (size_t)t * hd * key_tile, s);
                for (int i = 0; i < nvec; i++) {
                    double *srow = s + (size_t)i * key_tile;
                    int jlo = lo[i] - j0, jhi = hi[i] - j0;
                    if (jlo < 0) jlo = 0;
                    if (jhi > kn) jhi = kn;
                    if (jlo >= jhi) continue;           /* this vector sees nothing here */
                    double tile_max = -INFINITY;
                    for (int jj = jlo; jj < jhi; jj++) {
                        srow[jj] = cap_score(p->scale * srow[jj], p->soft_cap);
                        if (srow[jj] > tile_max) tile_max = srow[jj];
                    }
                    double *o = ob + (size_t)i * hdv;
                    if (tile_max > run_max[i]) {
                        double alpha = exp(run_max[i] - tile_max);   /* 0 on the first tile */
                        run_sum[i] *= alpha;
                        for (int e = 0; e < hdv; e++) o[e] *= alpha;
                        run_max[i] = tile_max;
                    }
                    double tile_sum = 0;
                    for (int jj = 0; jj < key_tile; jj++) {
                        double pr = 0;
                        if (jj >= jlo && jj < jhi) pr = exp(srow[jj] - run_max[i]);
                        srow[jj] = pr;
                        tile_sum += pr;
                    }
                    run_sum[i] += tile_sum;
                    accumulate_pv(jhi - jlo, hdv, srow + jlo, vpack + (size_t)(j0 + jlo) * hdv, o);
                }
            }
            for (int i = 0; i < nvec; i++) {
                int row = (vb + i) / group, h = g * group + (vb + i) % group;
                double *dst = out + ((size_t)row * hq + h) * hdv;
                const double *o = ob + (size_t)i * hdv;
                if (lo[i] < hi[i]) {   /* NaN inputs give NaN here, never an "empty" row */
                    double inv = 1.0 / run_sum[i];
                    for (int e = 0; e < hdv; e++) dst[e] = o[e] * inv;
                    if (lse) lse[(size_t)h * num_rows + row] = run_max[i] + log(run_sum[i]);
                } else {
                    for (int e = 0; e < hdv; e++) dst[e] = 0;
                    if (lse) lse[(size_t)h * num_rows + row] = -INFINITY;
                }
            }
        }
    }
    free(kpack);
    free(vpack);
    free(qb);
    free(ob);
}

/* ---- the naive twin ------------------------------------------------------------------------ */

void ar_ref_attend_naive(const ar_attn_params *p, int num_rows, const double *q, const int *q_pos,
                         int num_keys, int key_pos0, const double *k, const double *v,
                         double *out, double *lse)
{
    if (check_params(p, "ar_ref_attend_naive", num_rows, num_keys, out, lse, 8) != 0) return;
    const int hq = p->num_q_heads, hkv = p->num_kv_heads;
    const int group = hq / hkv, hd = p->head_size, hdv = p->v_head_size;
    double *scores = malloc(((size_t)num_keys + 1) * sizeof(double));   /* [num_keys] */
    if (!scores) {
        fprintf(stderr, "reference/reference.c: ar_ref_attend_naive: out of memory\n");
        return;
    }
    for (int row = 0; row < num_rows; row++) {
        int lo, hi;
        visible_range(p, q_pos, row, num_keys, key_pos0, &lo, &hi);
        for (int h = 0; h < hq; h++) {
            int g = h / group;
            const double *qv = q + ((size_t)row * hq + h) * hd;
            double *dst = out + ((size_t)row * hq + h) * hdv;
            /* pass 1: scores and their max */
            double max_score = -INFINITY;
            for (int j = lo; j < hi; j++) {
                const double *kv = k + ((size_t)j * hkv + g) * hd;
                double dot = 0;
                for (int d = 0; d < hd; d++) dot += qv[d] * kv[d];
                scores[j] = cap_score(p->scale * dot, p->soft_cap);
                if (scores[j] > max_score) max_score = scores[j];
            }
            /* pass 2: exponentials, their sum, and the weighted values */
            for (int e = 0; e < hdv; e++) dst[e] = 0;
            double sum = 0;
            for (int j = lo; j < hi; j++) {
                double w = exp(scores[j] - max_score);
                const double *vv = v + ((size_t)j * hkv + g) * hdv;
                sum += w;
                for (int e = 0; e < hdv; e++) dst[e] += w * vv[e];
            }
            if (lo < hi) {
                for (int e = 0; e < hdv; e++) dst[e] /= sum;
                if (lse) lse[(size_t)h * num_rows + row] = max_score + log(sum);
            } else {
                if (lse) lse[(size_t)h * num_rows + row] = -INFINITY;
            }
        }
    }
    free(scores);
}

/* ---- the naive same-dtype yardstick (FlashAttention's out_pt) ------------------------------- */

/* FlashAttention's attention_ref(upcast=False, reorder_ops=True): K is scaled in the dtype
 * (k / sqrt(d) there, k * scale here), q.k_scaled is a float-accumulated matmul rounded to the
 * dtype, the soft cap is three dtype ops (divide, tanh, multiply), softmax runs in float and is
 * rounded to the dtype, and P.V is a float-accumulated matmul rounded to the dtype.  For fp8
 * the math runs in bf16 and P is additionally rounded through fp8, as FA3's fp8 tests do
 * (intermediate_dtype). */
void ar_naive_dtype_attend(const ar_attn_params *p, ar_dtype dtype, int num_rows, const float *q,
                           const int *q_pos, int num_keys, int key_pos0, const float *k,
                           const float *v, float *out, float *lse)
{
    if (check_params(p, "ar_naive_dtype_attend", num_rows, num_keys, out, lse, 4) != 0) return;
    const int hq = p->num_q_heads, hkv = p->num_kv_heads;
    const int group = hq / hkv, hd = p->head_size, hdv = p->v_head_size;
    const ar_dtype cd = dtype == AR_FP8_E4M3 ? AR_BF16 : dtype;   /* compute dtype */
    const float scale = (float)p->scale, cap = (float)p->soft_cap;
    float *k_scaled = malloc(((size_t)num_keys * hkv * hd + 1) * sizeof(float)); /* like k */
    float *scores = malloc(((size_t)num_keys + 1) * sizeof(float));              /* [num_keys] */
    float *acc = malloc((size_t)hdv * sizeof(float));                            /* [hdv] */
    if (!k_scaled || !scores || !acc) {
        fprintf(stderr, "reference/reference.c: ar_naive_dtype_attend: out of memory\n");
        free(k_scaled); free(scores); free(acc);
        return;
    }
    for (size_t i = 0; i < (size_t)num_keys * hkv * hd; i++)
        k_scaled[i] = ar_round_to(cd, k[i] * scale);

    for (int row = 0; row < num_rows; row++) {
        int lo, hi;
        visible_range(p, q_pos, row, num_keys, key_pos0, &lo, &hi);
        for (int h = 0; h < hq; h++) {
            int g = h / group;
            const float *qv = q + ((size_t)row * hq + h) * hd;
            float *dst = out + ((size_t)row * hq + h) * hdv;
            float max_score = -INFINITY;
            for (int j = lo; j < hi; j++) {
                const float *kv = k_scaled + ((size_t)j * hkv + g) * hd;
                float dot = 0;
                for (int d = 0; d < hd; d++) dot += qv[d] * kv[d];
                float sc = ar_round_to(cd, dot);
                if (cap > 0) {
                    sc = ar_round_to(cd, sc / cap);
                    sc = ar_round_to(cd, tanhf(sc));
                    sc = ar_round_to(cd, sc * cap);
                }
                scores[j] = sc;
                if (sc > max_score) max_score = sc;
            }
            float sum = 0;
            for (int j = lo; j < hi; j++) {
                scores[j] = expf(scores[j] - max_score);
                sum += scores[j];
            }
            for (int e = 0; e < hdv; e++) acc[e] = 0;
            for (int j = lo; j < hi; j++) {
                float pr = ar_round_to(cd, scores[j] / sum);
                if (dtype == AR_FP8_E4M3) pr = ar_round_to(AR_FP8_E4M3, pr);
                const float *vv = v + ((size_t)j * hkv + g) * hdv;
                for (int e = 0; e < hdv; e++) acc[e] += pr * vv[e];
            }
            for (int e = 0; e < hdv; e++) dst[e] = lo < hi ? ar_round_to(cd, acc[e]) : 0.0f;
            if (lse) lse[(size_t)h * num_rows + row] = lo < hi ? max_score + logf(sum) : -INFINITY;
        }
    }
    free(k_scaled);
    free(scores);
    free(acc);
}

/* ---- LSE-weighted merge (vLLM merge_attn_states) -------------------------------------------- */

void ar_ref_merge(int num_rows, int num_heads, int head_size,
                  const double *a_out, const double *a_lse,
                  const double *b_out, const double *b_lse, double *out, double *lse)
{
    for (int t = 0; t < num_rows; t++) {
        for (int h = 0; h < num_heads; h++) {
            double la = a_lse[(size_t)h * num_rows + t];
            double lb = b_lse[(size_t)h * num_rows + t];
            if (la == INFINITY) la = -INFINITY;   /* FA2's empty-row sentinel */
            if (lb == INFINITY) lb = -INFINITY;
            double m = la > lb ? la : lb;
            const double *oa = a_out + ((size_t)t * num_heads + h) * head_size;
            const double *ob = b_out + ((size_t)t * num_heads + h) * head_size;
            double *o = out + ((size_t)t * num_heads + h) * head_size;
            if (m == -INFINITY) {                 /* both sides empty */
                for (int e = 0; e < head_size; e++) o[e] = oa[e];
                if (lse) lse[(size_t)h * num_rows + t] = -INFINITY;
                continue;
            }
            double wa = exp(la - m), wb = exp(lb - m), total = wa + wb;
            double sa = wa / total, sb = wb / total;
            for (int e = 0; e < head_size; e++) o[e] = oa[e] * sa + ob[e] * sb;
            if (lse) lse[(size_t)h * num_rows + t] = log(total) + m;
        }
    }
}
