/* test_reference.c - the float64 reference (reference.c): the fast grouped ar_ref_attend against
 * the naive twin over a grid of shapes and masks; identities that must hold whatever the
 * implementation (paged gather = dense, chunked prefill = one shot, prefix + suffix + merge =
 * flat); merge edge cases; softmax normalisation and LSE computed directly; and the size of
 * the naive same-dtype yardstick's error. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../reference/datagen.h"
#include "../reference/reference.h"

/* ---- helpers ----------------------------------------------------------------------------- */

/* a[i*width + d] = generator value of row i, dim d, rounded to t.  a [rows, width] */
static void fill_gen(double *a, size_t rows, int width, uint32_t stream, uint64_t seed,
                     ar_datadist dist, ar_dtype t)
{
    for (size_t i = 0; i < rows; i++) {
        uint64_t row = ar_gen_row(seed, stream, 0, 0, i, 0);
        for (int d = 0; d < width; d++) a[i * width + d] = ar_gen(row, (uint32_t)d, dist, t);
    }
}

static double *alloc_doubles(size_t n)
{
    double *a = calloc(n ? n : 1, sizeof(double));
    assert_non_null(a);
    return a;
}

/* max |a-b| over n, where equal infinities count as 0 and a NaN on either side as inf */
static double max_abs_diff(const double *a, const double *b, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d;
        if (isnan(a[i]) || isnan(b[i])) d = INFINITY;
        else if (a[i] == b[i]) d = 0;
        else d = fabs(a[i] - b[i]);
        if (d > worst) worst = d;
    }
    return worst;
}

/* One attention problem with its inputs. */
typedef struct problem {
    ar_attn_params p;
    int num_rows, num_keys, key_pos0;
    double *q, *k, *v;   /* [rows, hq, hd], [keys, hkv, hd], [keys, hkv, hdv] */
    int *q_pos;          /* [rows] */
} problem;

static problem make_problem(int hq, int hkv, int hd, int hdv, int num_rows, int num_keys,
                            int key_pos0, int first_q_pos, uint64_t seed, ar_datadist dist)
{
    problem pr;
    memset(&pr, 0, sizeof pr);
    pr.p.num_q_heads = hq;
    pr.p.num_kv_heads = hkv;
    pr.p.head_size = hd;
    pr.p.v_head_size = hdv;
    pr.p.scale = 1.0 / sqrt((double)hd);
    pr.p.causal = true;
    pr.num_rows = num_rows;
    pr.num_keys = num_keys;
    pr.key_pos0 = key_pos0;
    pr.q = alloc_doubles((size_t)num_rows * hq * hd);
    pr.k = alloc_doubles((size_t)num_keys * hkv * hd);
    pr.v = alloc_doubles((size_t)num_keys * hkv * hdv);
    pr.q_pos = calloc((size_t)num_rows + 1, sizeof(int));
    assert_non_null(pr.q_pos);
    fill_gen(pr.q, (size_t)num_rows * hq, hd, AR_STREAM_Q, seed, dist, AR_BF16);
    fill_gen(pr.k, (size_t)num_keys * hkv, hd, AR_STREAM_K, seed, dist, AR_BF16);
    fill_gen(pr.v, (size_t)num_keys * hkv, hdv, AR_STREAM_V, seed, dist, AR_BF16);
    for (int i = 0; i < num_rows; i++) pr.q_pos[i] = first_q_pos + i;
    return pr;
}

static void free_problem(problem *pr)
{
    free(pr->q); free(pr->k); free(pr->v); free(pr->q_pos);
}

static size_t out_len(const problem *pr)
{
    return (size_t)pr->num_rows * pr->p.num_q_heads * pr->p.v_head_size;
}

static size_t lse_len(const problem *pr)
{
    return (size_t)pr->num_rows * pr->p.num_q_heads;
}

static void run_fast(const problem *pr, double *out, double *lse)
{
    ar_ref_attend(&pr->p, pr->num_rows, pr->q, pr->q_pos, pr->num_keys, pr->key_pos0, pr->k,
                  pr->v, out, lse);
}

static void run_naive(const problem *pr, double *out, double *lse)
{
    ar_ref_attend_naive(&pr->p, pr->num_rows, pr->q, pr->q_pos, pr->num_keys, pr->key_pos0,
                        pr->k, pr->v, out, lse);
}

/* Compares fast and naive; returns the number of rows x heads with no visible key. */
static int check_fast_vs_naive(const problem *pr, double tol)
{
    size_t no = out_len(pr), nl = lse_len(pr);
    double *o1 = alloc_doubles(no), *o2 = alloc_doubles(no);
    double *l1 = alloc_doubles(nl), *l2 = alloc_doubles(nl);
    for (size_t i = 0; i < no; i++) o1[i] = o2[i] = 12345.0;   /* must be overwritten */
    run_fast(pr, o1, l1);
    run_naive(pr, o2, l2);
    double out_err = max_abs_diff(o1, o2, no);
    double lse_err = 0;
    int empty = 0;
    for (size_t i = 0; i < nl; i++) {
        double scale = fabs(l2[i]) > 1 && isfinite(l2[i]) ? fabs(l2[i]) : 1;
        double d = max_abs_diff(&l1[i], &l2[i], 1) / scale;
        if (d > lse_err) lse_err = d;
        if (l1[i] == -INFINITY) {
            empty++;
            int h = (int)(i / (size_t)pr->num_rows), row = (int)(i % (size_t)pr->num_rows);
            const double *o = o1 + ((size_t)row * pr->p.num_q_heads + h) * pr->p.v_head_size;
            for (int e = 0; e < pr->p.v_head_size; e++) assert_true(o[e] == 0.0);
        }
    }
    if (!(out_err <= tol && lse_err <= tol))
        fail_msg("hq=%d hkv=%d hd=%d hdv=%d causal=%d window=%d cap=%g key_pos0=%d: "
                 "out err %.3g lse err %.3g", pr->p.num_q_heads, pr->p.num_kv_heads,
                 pr->p.head_size, pr->p.v_head_size, pr->p.causal, pr->p.sliding_window,
                 pr->p.soft_cap, pr->key_pos0, out_err, lse_err);
    free(o1); free(o2); free(l1); free(l2);
    return empty;
}

/* ---- fast vs naive -------------------------------------------------------------------------- */

static void test_fast_matches_naive_grid(void **state)
{
    (void)state;
    const int ratios[3] = {1, 4, 8};
    const int head_sizes[5][2] = {{64, 64}, {128, 128}, {256, 256}, {80, 48}, {33, 7}}; /* hd, hdv */
    int cases = 0, empty_rows = 0;
    for (int ri = 0; ri < 3; ri++) {
        for (int hi = 0; hi < 5; hi++) {
            for (int mask = 0; mask < 6; mask++) {
                int hkv = 2, hq = hkv * ratios[ri];
                int key_pos0 = mask == 5 ? 70 : 0;
                problem pr = make_problem(hq, hkv, head_sizes[hi][0], head_sizes[hi][1], 13,
                                          77, key_pos0, 64, (uint64_t)(100 + cases),
                                          AR_DATA_NORMAL);
                pr.p.causal = mask != 1 && mask != 4;
                if (mask == 2) pr.p.sliding_window = 20;
                if (mask == 3 || mask == 4) pr.p.soft_cap = 2.0;
                if (mask == 3) pr.p.sliding_window = 5;
                if (mask == 5) pr.p.sliding_window = 100;   /* wider than the keys */
                empty_rows += check_fast_vs_naive(&pr, 1e-12);
                free_problem(&pr);
                cases++;
            }
        }
    }
    assert_int_equal(cases, 90);
    /* key_pos0 = 70 with q_pos 64..76: rows 64..69 see nothing, for every head of every shape */
    assert_int_equal(empty_rows, 6 * 5 * (2 + 8 + 16));
}

static void test_fast_matches_naive_hard_data(void **state)
{
    (void)state;
    /* outlier and large data: nearly one-hot softmax and scores in the thousands */
    for (int dist = AR_DATA_OUTLIER; dist <= AR_DATA_LARGE; dist++) {
        problem pr = make_problem(8, 2, 128, 128, 40, 200, 0, 160, 9, (ar_datadist)dist);
        check_fast_vs_naive(&pr, 1e-12);
        pr.p.sliding_window = 33;
        check_fast_vs_naive(&pr, 1e-12);
        free_problem(&pr);
    }
    /* a long decode-like row over many tiles, and many rows over few keys */
    problem decode = make_problem(32, 8, 128, 128, 1, 1000, 0, 999, 5, AR_DATA_NORMAL);
    check_fast_vs_naive(&decode, 1e-12);
    free_problem(&decode);
    problem wide = make_problem(4, 4, 64, 64, 100, 3, 0, 0, 6, AR_DATA_NORMAL);
    assert_true(check_fast_vs_naive(&wide, 1e-12) == 0);
    wide.p.causal = false;
    check_fast_vs_naive(&wide, 1e-12);
    free_problem(&wide);
}

static void test_no_keys_and_bad_params(void **state)
{
    (void)state;
    problem pr = make_problem(4, 2, 64, 64, 5, 0, 0, 0, 1, AR_DATA_NORMAL);
    assert_int_equal(check_fast_vs_naive(&pr, 0), 5 * 4);
    free_problem(&pr);

    /* num_q_heads not a multiple of num_kv_heads: no crash, NaN out */
    problem bad = make_problem(4, 2, 64, 64, 3, 10, 0, 5, 1, AR_DATA_NORMAL);
    bad.p.num_q_heads = 3;
    double *out = alloc_doubles(3 * 4 * 64), *lse = alloc_doubles(3 * 4);
    run_fast(&bad, out, lse);
    assert_true(isnan(out[0]) && isnan(lse[0]));
    memset(out, 0, sizeof(double) * 3 * 4 * 64);
    run_naive(&bad, out, lse);
    assert_true(isnan(out[0]));
    /* zero rows: nothing written, nothing read */
    bad.p.num_q_heads = 4;
    ar_ref_attend(&bad.p, 0, NULL, NULL, 10, 0, bad.k, bad.v, NULL, NULL);
    free(out); free(lse);
    free_problem(&bad);
}

/* ---- identities ----------------------------------------------------------------------------- */

/* dst[j] = paged[block_table[j / bs] * bs + j % bs] for j < n; each slot `width` doubles. */
static void gather_paged(const double *paged, const int *block_table, int bs, int n, int width,
                         double *dst)
{
    for (int j = 0; j < n; j++) {
        size_t slot = (size_t)block_table[j / bs] * bs + (size_t)(j % bs);
        memcpy(dst + (size_t)j * width, paged + slot * width, (size_t)width * sizeof(double));
    }
}

static void test_paged_gather_equals_dense(void **state)
{
    (void)state;
    problem pr = make_problem(8, 2, 64, 64, 9, 77, 0, 68, 21, AR_DATA_NORMAL);
    int width = pr.p.num_kv_heads * pr.p.head_size;
    size_t no = out_len(&pr), nl = lse_len(&pr);
    double *dense_out = alloc_doubles(no), *dense_lse = alloc_doubles(nl);
    double *paged_out = alloc_doubles(no), *paged_lse = alloc_doubles(nl);
    run_fast(&pr, dense_out, dense_lse);

    /* block_size >= seq_len (one block, index 2 of 4), and block_size 16 with a shuffled table */
    const int block_sizes[2] = {128, 16};
    const int tables[2][5] = {{2, 0, 0, 0, 0}, {3, 0, 6, 1, 5}};
    for (int c = 0; c < 2; c++) {
        int bs = block_sizes[c], num_blocks = 8;
        size_t slots = (size_t)num_blocks * bs;
        double *paged_k = alloc_doubles(slots * width), *paged_v = alloc_doubles(slots * width);
        for (size_t i = 0; i < slots * width; i++) paged_k[i] = paged_v[i] = NAN;
        for (int j = 0; j < pr.num_keys; j++) {   /* write through the slot mapping */
            size_t slot = (size_t)tables[c][j / bs] * bs + (size_t)(j % bs);
            memcpy(paged_k + slot * width, pr.k + (size_t)j * width, (size_t)width * sizeof(double));
            memcpy(paged_v + slot * width, pr.v + (size_t)j * width, (size_t)width * sizeof(double));
        }
        problem gathered = pr;
        gathered.k = alloc_doubles((size_t)pr.num_keys * width);
        gathered.v = alloc_doubles((size_t)pr.num_keys * width);
        gather_paged(paged_k, tables[c], bs, pr.num_keys, width, gathered.k);
        gather_paged(paged_v, tables[c], bs, pr.num_keys, width, gathered.v);
        run_fast(&gathered, paged_out, paged_lse);
        assert_memory_equal(paged_out, dense_out, no * sizeof(double));
        assert_memory_equal(paged_lse, dense_lse, nl * sizeof(double));
        /* reading one slot too far (a NaN slot beyond the sequence) must show */
        if (c == 1) {
            double *k_ext = alloc_doubles((size_t)(pr.num_keys + 1) * width);
            double *v_ext = alloc_doubles((size_t)(pr.num_keys + 1) * width);
            gather_paged(paged_k, tables[c], bs, pr.num_keys + 1, width, k_ext);
            gather_paged(paged_v, tables[c], bs, pr.num_keys + 1, width, v_ext);
            int *pos_ext = calloc((size_t)pr.num_rows, sizeof(int));
            assert_non_null(pos_ext);
            memcpy(pos_ext, pr.q_pos, (size_t)pr.num_rows * sizeof(int));
            pos_ext[pr.num_rows - 1] += 1;   /* the last row now sees key 77 */
            ar_ref_attend(&pr.p, pr.num_rows, pr.q, pos_ext, pr.num_keys + 1, 0, k_ext, v_ext,
                          paged_out, paged_lse);
            assert_true(isnan(paged_lse[pr.num_rows - 1]));
            assert_true(isnan(paged_out[(size_t)(pr.num_rows - 1) * pr.p.num_q_heads * pr.p.v_head_size]));
            assert_false(isnan(paged_lse[pr.num_rows - 2]));
            free(k_ext); free(v_ext); free(pos_ext);
        }
        free(gathered.k); free(gathered.v);
        free(paged_k); free(paged_v);
    }
    free(dense_out); free(dense_lse); free(paged_out); free(paged_lse);
    free_problem(&pr);
}

static void test_chunked_prefill_equals_one_shot(void **state)
{
    (void)state;
    for (int window = 0; window <= 40; window += 40) {
        problem full = make_problem(8, 2, 64, 64, 150, 150, 0, 0, 31, AR_DATA_NORMAL);
        full.p.sliding_window = window;
        int hq = full.p.num_q_heads, hd = full.p.head_size, hdv = full.p.v_head_size;
        double *one_out = alloc_doubles(out_len(&full)), *one_lse = alloc_doubles(lse_len(&full));
        run_fast(&full, one_out, one_lse);
        const int chunk_ends[3] = {37, 100, 150};
        int start = 0;
        double worst = 0;
        for (int c = 0; c < 3; c++) {
            int end = chunk_ends[c], n = end - start;
            /* this step: rows start..end-1, keys 0..end-1 (context + the chunk's own) */
            double *out = alloc_doubles((size_t)n * hq * hdv), *lse = alloc_doubles((size_t)n * hq);
            ar_ref_attend(&full.p, n, full.q + (size_t)start * hq * hd, full.q_pos + start, end, 0,
                          full.k, full.v, out, lse);
            double d = max_abs_diff(out, one_out + (size_t)start * hq * hdv, (size_t)n * hq * hdv);
            if (d > worst) worst = d;
            for (int h = 0; h < hq; h++) {
                d = max_abs_diff(lse + (size_t)h * n, one_lse + (size_t)h * full.num_rows + start,
                                 (size_t)n);
                if (d > worst) worst = d;
            }
            free(out); free(lse);
            start = end;
        }
        assert_true(worst <= 1e-13);
        free(one_out); free(one_lse);
        free_problem(&full);
    }
}

/* Cascade: rows of several requests that share the first `prefix` keys; request r has context
 * contexts[r] and new[r] new tokens, its own keys after the prefix.  Flat causal per request vs
 * prefix pass (all rows, non-causal, the shared keys) + suffix pass per request + merge. */
static void test_prefix_suffix_merge_equals_flat(void **state)
{
    (void)state;
    const int hq = 8, hkv = 2, hd = 64, prefix = 64;
    const int contexts[3] = {96, 64, 130}, news[3] = {40, 1, 7};
    const int num_reqs = 3;
    int total_rows = 0;
    for (int r = 0; r < num_reqs; r++) total_rows += news[r];
    problem shared = make_problem(hq, hkv, hd, hd, total_rows, prefix, 0, 0, 41, AR_DATA_NORMAL);
    shared.p.causal = false;
    double *pre_out = alloc_doubles(out_len(&shared)), *pre_lse = alloc_doubles(lse_len(&shared));
    double *suf_out = alloc_doubles(out_len(&shared)), *suf_lse = alloc_doubles(lse_len(&shared));
    double *flat_out = alloc_doubles(out_len(&shared)), *flat_lse = alloc_doubles(lse_len(&shared));
    int row0 = 0;
    for (int r = 0; r < num_reqs; r++) {
        int seq = contexts[r] + news[r];
        problem req = make_problem(hq, hkv, hd, hd, news[r], seq, 0, contexts[r],
                                   (uint64_t)(50 + r), AR_DATA_NORMAL);
        /* the shared prefix keys are identical in every request */
        memcpy(req.k, shared.k, (size_t)prefix * hkv * hd * sizeof(double));
        memcpy(req.v, shared.v, (size_t)prefix * hkv * hd * sizeof(double));
        memcpy(shared.q + (size_t)row0 * hq * hd, req.q, (size_t)news[r] * hq * hd * sizeof(double));
        double *o = alloc_doubles(out_len(&req)), *l = alloc_doubles(lse_len(&req));
        run_fast(&req, o, l);   /* flat */
        memcpy(flat_out + (size_t)row0 * hq * hd, o, out_len(&req) * sizeof(double));
        for (int h = 0; h < hq; h++)
            memcpy(flat_lse + (size_t)h * total_rows + row0, l + (size_t)h * news[r],
                   (size_t)news[r] * sizeof(double));
        /* suffix pass: keys prefix..seq-1, causal, key_pos0 = prefix */
        ar_ref_attend(&req.p, news[r], req.q, req.q_pos, seq - prefix, prefix,
                      req.k + (size_t)prefix * hkv * hd, req.v + (size_t)prefix * hkv * hd, o, l);
        memcpy(suf_out + (size_t)row0 * hq * hd, o, out_len(&req) * sizeof(double));
        for (int h = 0; h < hq; h++)
            memcpy(suf_lse + (size_t)h * total_rows + row0, l + (size_t)h * news[r],
                   (size_t)news[r] * sizeof(double));
        free(o); free(l);
        free_problem(&req);
        row0 += news[r];
    }
    run_fast(&shared, pre_out, pre_lse);   /* prefix pass: all rows as one sequence */
    double *merged = alloc_doubles(out_len(&shared)), *merged_lse = alloc_doubles(lse_len(&shared));
    ar_ref_merge(total_rows, hq, hd, pre_out, pre_lse, suf_out, suf_lse, merged, merged_lse);
    assert_true(max_abs_diff(merged, flat_out, out_len(&shared)) <= 1e-12);
    assert_true(max_abs_diff(merged_lse, flat_lse, lse_len(&shared)) <= 1e-12);
    /* and an unweighted merge would not pass */
    for (size_t i = 0; i < out_len(&shared); i++) merged[i] = 0.5 * (pre_out[i] + suf_out[i]);
    assert_true(max_abs_diff(merged, flat_out, out_len(&shared)) > 1e-3);
    free(pre_out); free(pre_lse); free(suf_out); free(suf_lse); free(flat_out); free(flat_lse);
    free(merged); free(merged_lse);
    free_problem(&shared);
}

/* ---- merge edge cases ----------------------------------------------------------------------- */

static void test_merge_edge_cases(void **state)
{
    (void)state;
    /* one row per case, 1 head, 4 dims */
    enum { CASES = 8, D = 4 };
    const double a_lse[CASES] = {INFINITY, -INFINITY, 1.5, 1.5, -INFINITY, INFINITY, 0.3, -2.0};
    const double b_lse[CASES] = {1.5, 1.5, INFINITY, -INFINITY, -INFINITY, INFINITY, 0.3, 0.7};
    double a_out[CASES * D], b_out[CASES * D], out[CASES * D], lse[CASES];
    for (int i = 0; i < CASES * D; i++) {
        a_out[i] = 1.0 + i;
        b_out[i] = -3.0 + 0.5 * i;
    }
    /* rows are tokens: num_rows = CASES, one head, so lse index = row */
    ar_ref_merge(CASES, 1, D, a_out, a_lse, b_out, b_lse, out, lse);
    for (int d = 0; d < D; d++) {
        assert_true(out[0 * D + d] == b_out[0 * D + d]);   /* a empty (+inf) */
        assert_true(out[1 * D + d] == b_out[1 * D + d]);   /* a empty (-inf) */
        assert_true(out[2 * D + d] == a_out[2 * D + d]);   /* b empty (+inf) */
        assert_true(out[3 * D + d] == a_out[3 * D + d]);   /* b empty (-inf) */
        assert_true(out[4 * D + d] == a_out[4 * D + d]);   /* both empty: a's out */
        assert_true(out[5 * D + d] == a_out[5 * D + d]);
        assert_true(fabs(out[6 * D + d] - 0.5 * (a_out[6 * D + d] + b_out[6 * D + d])) < 1e-15);
        double wa = exp(-2.0), wb = exp(0.7);   /* direct formula */
        double want = (wa * a_out[7 * D + d] + wb * b_out[7 * D + d]) / (wa + wb);
        assert_true(fabs(out[7 * D + d] - want) < 1e-14);
    }
    assert_true(lse[0] == 1.5 && lse[1] == 1.5 && lse[2] == 1.5 && lse[3] == 1.5);
    assert_true(lse[4] == -INFINITY && lse[5] == -INFINITY);
    assert_true(fabs(lse[6] - (0.3 + log(2.0))) < 1e-15);
    assert_true(fabs(lse[7] - log(exp(-2.0) + exp(0.7))) < 1e-15);
    /* huge LSEs do not overflow */
    const double big_a = 800, big_b = 790;
    double o2[D], l2;
    ar_ref_merge(1, 1, D, a_out, &big_a, b_out, &big_b, o2, &l2);
    assert_true(isfinite(l2) && fabs(l2 - (800 + log1p(exp(-10.0)))) < 1e-12);
    assert_true(isfinite(o2[0]));
}

/* ---- normalisation and LSE ------------------------------------------------------------------ */

static void test_softmax_sums_to_one_and_lse_direct(void **state)
{
    (void)state;
    problem pr = make_problem(8, 2, 64, 32, 20, 50, 0, 30, 61, AR_DATA_NORMAL);
    pr.p.sliding_window = 9;
    for (size_t i = 0; i < (size_t)pr.num_keys * 2 * 32; i++) pr.v[i] = 1.0;
    double *out = alloc_doubles(out_len(&pr)), *lse = alloc_doubles(lse_len(&pr));
    run_fast(&pr, out, lse);
    for (size_t i = 0; i < out_len(&pr); i++) assert_true(fabs(out[i] - 1.0) < 1e-14);
    /* LSE straight from its definition: log of the sum of exp(scale * q.k) over visible keys */
    for (int row = 0; row < pr.num_rows; row++) {
        for (int h = 0; h < 8; h++) {
            const double *qv = pr.q + ((size_t)row * 8 + h) * 64;
            double sum = 0;
            int visible = 0;
            for (int j = 0; j < pr.num_keys; j++) {
                if (j > pr.q_pos[row] || j < pr.q_pos[row] - 9 + 1) continue;
                const double *kv = pr.k + ((size_t)j * 2 + h / 4) * 64;
                double dot = 0;
                for (int d = 0; d < 64; d++) dot += qv[d] * kv[d];
                sum += exp(pr.p.scale * dot);
                visible++;
            }
            assert_int_equal(visible, 9);
            assert_true(fabs(lse[(size_t)h * pr.num_rows + row] - log(sum)) < 1e-13);
        }
    }
    free(out); free(lse);
    free_problem(&pr);
}

/* ---- the naive same-dtype yardstick --------------------------------------------------------- */

static double yardstick_error(ar_dtype t, double soft_cap, double *lse_err)
{
    problem pr = make_problem(8, 2, 128, 128, 24, 300, 0, 276, 71, AR_DATA_NORMAL);
    pr.p.soft_cap = soft_cap;
    size_t nq = (size_t)pr.num_rows * 8 * 128, nk = (size_t)pr.num_keys * 2 * 128;
    /* inputs rounded to t, shared by both */
    for (size_t i = 0; i < nq; i++) pr.q[i] = ar_round_to(t, (float)pr.q[i]);
    for (size_t i = 0; i < nk; i++) {
        pr.k[i] = ar_round_to(t, (float)pr.k[i]);
        pr.v[i] = ar_round_to(t, (float)pr.v[i]);
    }
    float *qf = malloc(nq * sizeof(float)), *kf = malloc(nk * sizeof(float));
    float *vf = malloc(nk * sizeof(float));
    float *outf = malloc(out_len(&pr) * sizeof(float)), *lsef = malloc(lse_len(&pr) * sizeof(float));
    assert_true(qf && kf && vf && outf && lsef);
    for (size_t i = 0; i < nq; i++) qf[i] = (float)pr.q[i];
    for (size_t i = 0; i < nk; i++) { kf[i] = (float)pr.k[i]; vf[i] = (float)pr.v[i]; }
    double *ref = alloc_doubles(out_len(&pr)), *ref_lse = alloc_doubles(lse_len(&pr));
    run_fast(&pr, ref, ref_lse);
    ar_naive_dtype_attend(&pr.p, t, pr.num_rows, qf, pr.q_pos, pr.num_keys, 0, kf, vf, outf, lsef);
    double worst = 0;
    for (size_t i = 0; i < out_len(&pr); i++) {
        assert_true(outf[i] == ar_round_to(t == AR_FP8_E4M3 ? AR_BF16 : t, outf[i]));
        double d = fabs((double)outf[i] - ref[i]);
        if (d > worst) worst = d;
    }
    *lse_err = 0;
    for (size_t i = 0; i < lse_len(&pr); i++) {
        double d = fabs((double)lsef[i] - ref_lse[i]);
        if (d > *lse_err) *lse_err = d;
    }
    free(qf); free(kf); free(vf); free(outf); free(lsef); free(ref); free(ref_lse);
    free_problem(&pr);
    return worst;
}

static void test_naive_dtype_error_size(void **state)
{
    (void)state;
    double lse32, lse16, lse_bf, lse8;
    double e32 = yardstick_error(AR_FP32, 0, &lse32);
    double e16 = yardstick_error(AR_FP16, 0, &lse16);
    double ebf = yardstick_error(AR_BF16, 0, &lse_bf);
    double e8 = yardstick_error(AR_FP8_E4M3, 0, &lse8);
    print_message("naive same-dtype max error: fp32 %.3g fp16 %.3g bf16 %.3g fp8 %.3g\n",
                  e32, e16, ebf, e8);
    assert_true(e32 < 1e-5 && lse32 < 1e-4);
    assert_true(ebf > 0 && ebf < 0.05 && lse_bf < 0.1);
    assert_true(e16 > 0 && e16 < ebf);   /* 3 more mantissa bits than bf16 */
    assert_true(e32 < e16 / 10);
    assert_true(e8 > ebf && e8 < 0.5);
    double lse_cap;
    double ecap = yardstick_error(AR_BF16, 1.5, &lse_cap);
    assert_true(ecap > 0 && ecap < 0.05);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fast_matches_naive_grid),
        cmocka_unit_test(test_fast_matches_naive_hard_data),
        cmocka_unit_test(test_no_keys_and_bad_params),
        cmocka_unit_test(test_paged_gather_equals_dense),
        cmocka_unit_test(test_chunked_prefill_equals_one_shot),
        cmocka_unit_test(test_prefix_suffix_merge_equals_flat),
        cmocka_unit_test(test_merge_edge_cases),
        cmocka_unit_test(test_softmax_sums_to_one_and_lse_direct),
        cmocka_unit_test(test_naive_dtype_error_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
