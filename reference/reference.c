/* reference.c - the float64 reference attention (fast, grouped), its naive twin, the naive
 * same-dtype "out_pt" yardstick, and the LSE-weighted merge (semantics in reference.h).
 *
 * ar_ref_attend is the one the verifier runs on every step, so it is written for speed while
 * staying plain C: for each KV head it takes the query rows x query heads of the group in
 * blocks of 16 vectors and sweeps tiles of 32 keys (16 for head sizes over 128), so each key
 * tile is read from L1 by every vector of the block instead of once per query row from memory.
 * When a call has many vectors per group (prefill) the head's keys are first packed transposed
 * per tile and a score tile is computed with eight independent accumulators per vector; with
 * few vectors (decode) packing would cost more than it saves, so scores are computed straight
 * from the caller's keys, two keys x four vectors at a time.  An online softmax in double
 * rescales the running output when the running max grows; P.V reads the caller's values four
 * keys at a time.  Key tiles that no vector of a block can see (causal / window) are skipped.
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

/* Two doubles in one SSE2/NEON register: GCC/Clang vector extension, plain arithmetic on it
 * compiles to packed instructions.  Loads and stores go through memcpy (no alignment needed). */
typedef double f64x2 __attribute__((vector_size(16)));

static inline f64x2 load2(const double *p)
{
    f64x2 x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline void store2(double *p, f64x2 x)
{
    memcpy(p, &x, sizeof x);
}

/* Score tile from packed keys: s[i][j] = q_i . k_j for nvec query vectors and key_tile keys,
 * eight keys per pass (four register pairs), so each q element is loaded once for eight.
 *   qb    [nvec, head_size]
 *   ktile [head_size, key_tile]  (keys of the tile transposed; tail keys zero)
 *   s     [nvec, key_tile] */
static void score_tile_packed(int nvec, int head_size, int key_tile, const double *restrict qb,
                              const double *restrict ktile, double *restrict s)
{
    for (int i = 0; i < nvec; i++) {
        const double *restrict qrow = qb + (size_t)i * head_size;
        for (int jc = 0; jc < key_tile; jc += 8) {
            f64x2 a01 = {0, 0}, a23 = {0, 0}, a45 = {0, 0}, a67 = {0, 0};
            const double *restrict kcol = ktile + jc;
            for (int d = 0; d < head_size; d++) {
                f64x2 qd = {qrow[d], qrow[d]};
                const double *restrict kr = kcol + (size_t)d * key_tile;
                a01 += qd * load2(kr);
                a23 += qd * load2(kr + 2);
                a45 += qd * load2(kr + 4);
                a67 += qd * load2(kr + 6);
            }
            double *srow = s + (size_t)i * key_tile + jc;
            store2(srow, a01);
            store2(srow + 2, a23);
            store2(srow + 4, a45);
            store2(srow + 6, a67);
        }
    }
}

/* Sum of the two lanes. */
static inline double hsum2(f64x2 x)
{
    return x[0] + x[1];
}

/* Score tile straight from the caller's keys (no packing, for few query vectors - decode):
 * two keys x four vectors per pass, eight register-pair accumulators over pairs of dims.
 * nvec is rounded up to 4 by the caller (the extra rows of qb hold finite filler whose scores
 * are ignored).
 *   qb    [nvec, head_size]
 *   kbase key 0 of the tile, rows kstride doubles apart: [kn, head_size] strided
 *   s     [nvec, key_tile] */
static void score_tile_direct(int nvec, int head_size, int kn, int key_tile,
                              const double *restrict qb, const double *restrict kbase,
                              size_t kstride, double *restrict s)
{
    const int even = head_size & ~1;
    for (int jj = 0; jj < kn; jj += 2) {
        const double *restrict kr0 = kbase + (size_t)jj * kstride;
        const double *restrict kr1 = jj + 1 < kn ? kr0 + kstride : kr0;
        for (int i = 0; i < nvec; i += 4) {
            const double *restrict q0 = qb + (size_t)i * head_size;
            const double *restrict q1 = q0 + head_size;
            const double *restrict q2 = q1 + head_size;
            const double *restrict q3 = q2 + head_size;
            f64x2 a0 = {0, 0}, b0 = {0, 0}, a1 = {0, 0}, b1 = {0, 0};
            f64x2 a2 = {0, 0}, b2 = {0, 0}, a3 = {0, 0}, b3 = {0, 0};
            for (int d = 0; d < even; d += 2) {
                f64x2 k0 = load2(kr0 + d), k1 = load2(kr1 + d);
                f64x2 x0 = load2(q0 + d), x1 = load2(q1 + d), x2 = load2(q2 + d), x3 = load2(q3 + d);
                a0 += x0 * k0; b0 += x0 * k1;
                a1 += x1 * k0; b1 += x1 * k1;
                a2 += x2 * k0; b2 += x2 * k1;
                a3 += x3 * k0; b3 += x3 * k1;
            }
            double sa[4] = {hsum2(a0), hsum2(a1), hsum2(a2), hsum2(a3)};
            double sb[4] = {hsum2(b0), hsum2(b1), hsum2(b2), hsum2(b3)};
            if (even < head_size) {   /* odd head size: the last dim */
                const double *restrict qs[4] = {q0, q1, q2, q3};
                for (int r = 0; r < 4; r++) {
                    sa[r] += qs[r][even] * kr0[even];
                    sb[r] += qs[r][even] * kr1[even];
                }
            }
            double *s0 = s + (size_t)i * key_tile + jj;
            for (int r = 0; r < 4; r++) {
                s0[(size_t)r * key_tile] = sa[r];
                if (jj + 1 < kn) s0[(size_t)r * key_tile + 1] = sb[r];
            }
        }
    }
}

/* o += sum_j prob[j] * v[j] over n keys, four keys at a time.  No key is skipped for a zero
 * probability, so a NaN value shows in the output as it would in a kernel.
 *   prob [n], v [n, v_head_size] with rows vstride doubles apart, o [v_head_size] */
static void accumulate_pv(int n, int v_head_size, size_t vstride, const double *restrict prob,
                          const double *restrict v, double *restrict o)
{
    const int even = v_head_size & ~1;
    int j = 0;
    for (; j + 4 <= n; j += 4) {
        f64x2 p0 = {prob[j], prob[j]}, p1 = {prob[j + 1], prob[j + 1]};
        f64x2 p2 = {prob[j + 2], prob[j + 2]}, p3 = {prob[j + 3], prob[j + 3]};
        const double *restrict v0 = v + (size_t)j * vstride;
        const double *restrict v1 = v0 + vstride;
        const double *restrict v2 = v1 + vstride;
        const double *restrict v3 = v2 + vstride;
        for (int e = 0; e < even; e += 2)
            store2(o + e, load2(o + e) + p0 * load2(v0 + e) + p1 * load2(v1 + e) +
                              p2 * load2(v2 + e) + p3 * load2(v3 + e));
        for (int e = even; e < v_head_size; e++)
            o[e] += prob[j] * v0[e] + prob[j + 1] * v1[e] + prob[j + 2] * v2[e] +
                    prob[j + 3] * v3[e];
    }
    for (; j < n; j++) {
        double pj = prob[j];
        const double *restrict vj = v + (size_t)j * vstride;
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

    /* Packing a KV head's keys pays off only when many query vectors reuse each key tile. */
    const bool pack = num_vecs >= AR_REF_VEC_BLOCK;
    /* kpack [num_tiles, hd, key_tile] when packing; qb [VEC_BLOCK, hd] zeroed (filler rows). */
    double *kpack = malloc(((pack ? (size_t)num_tiles * hd * key_tile : 0) + 1) * sizeof(double));
    double *qb = calloc((size_t)AR_REF_VEC_BLOCK * hd, sizeof(double));
    double *ob = malloc((size_t)AR_REF_VEC_BLOCK * hdv * sizeof(double));
    double s[AR_REF_VEC_BLOCK * AR_REF_MAX_KEY_TILE];
    double run_max[AR_REF_VEC_BLOCK], run_sum[AR_REF_VEC_BLOCK];
    int lo[AR_REF_VEC_BLOCK], hi[AR_REF_VEC_BLOCK];
    if (!kpack || !qb || !ob) {
        fprintf(stderr, "reference/reference.c: ar_ref_attend: out of memory for %d keys\n",
                num_keys);
        for (size_t i = 0; i < (size_t)num_rows * hq * hdv; i++) out[i] = NAN;
        for (size_t i = 0; lse && i < (size_t)num_rows * hq; i++) lse[i] = NAN;
        free(kpack); free(qb); free(ob);
        return;
    }

    for (int g = 0; g < hkv; g++) {
        /* Pack this KV head's keys (transposed per tile, zero tail). */
        for (int t = 0; pack && t < num_tiles; t++) {
            double *kt = kpack + (size_t)t * hd * key_tile;
            for (int jj = 0; jj < key_tile; jj++) {
                int j = t * key_tile + jj;
                const double *krow = k + ((size_t)j * hkv + g) * hd;
                for (int d = 0; d < hd; d++)
                    kt[(size_t)d * key_tile + jj] = j < num_keys ? krow[d] : 0.0;
            }
        }

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
                if (pack)
                    score_tile_packed(nvec, hd, key_tile, qb, kpack + (size_t)t * hd * key_tile, s);
                else
                    score_tile_direct((nvec + 3) / 4 * 4, hd, kn, key_tile, qb,
                                      k + ((size_t)j0 * hkv + g) * hd, (size_t)hkv * hd, s);
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
                    accumulate_pv(jhi - jlo, hdv, (size_t)hkv * hdv, srow + jlo,
                                  v + ((size_t)(j0 + jlo) * hkv + g) * hdv, o);
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
