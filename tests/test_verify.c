/* test_verify.c - the host logic of verification (replay/verify.h) that the device path shares:
 * the row choice, the pass rule from sums and maxima, the cross-check comparison, row blocks
 * that change no value (the host reference equals one call of ar_ref_attend bit for bit),
 * cancellation of the host verifier within about a second (MHA and MLA), and where a run
 * verifies on a machine without a CUDA device. */
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../reference/mla_ref.h"
#include "../reference/ref_gpu.h"
#include "../reference/reference.h"
#include "../replay/verify.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- row choice ------------------------------------------------------------------------------ */

static void test_choose_rows(void **state)
{
    (void)state;
    int rows[64];
    ar_verify_opts all = {AR_VERIFY_ALL, 0, 1, NULL, NULL};
    assert_int_equal(ar_verify_choose_rows(&all, 5, 100, rows), 5);
    for (int i = 0; i < 5; i++) assert_int_equal(rows[i], i);
    /* sample:4 of a 10-token step, one request of 10 rows: n - 1 - (j * n) / 4 for j = 0..3 */
    ar_verify_opts s4 = {AR_VERIFY_SAMPLE, 4, 1, NULL, NULL};
    assert_int_equal(ar_verify_choose_rows(&s4, 10, 10, rows), 4);
    const int want[4] = {2, 4, 7, 9};
    for (int i = 0; i < 4; i++) assert_int_equal(rows[i], want[i]);
    /* a request's share of the sample, at least its last row */
    assert_int_equal(ar_verify_choose_rows(&s4, 1, 1000, rows), 1);
    assert_int_equal(rows[0], 0);
    assert_int_equal(ar_verify_choose_rows(&s4, 50, 1000, rows), 1);
    assert_int_equal(rows[0], 49);
    /* never more rows than the request has; ascending and distinct */
    ar_verify_opts s64 = {AR_VERIFY_SAMPLE, 64, 1, NULL, NULL};
    int n = ar_verify_choose_rows(&s64, 40, 40, rows);
    assert_int_equal(n, 40);
    n = ar_verify_choose_rows(&s64, 33, 100, rows);
    assert_int_equal(n, 21);
    assert_int_equal(rows[n - 1], 32);
    for (int i = 1; i < n; i++) assert_true(rows[i] > rows[i - 1]);
    /* sample:0 means all */
    ar_verify_opts s0 = {AR_VERIFY_SAMPLE, 0, 1, NULL, NULL};
    assert_int_equal(ar_verify_choose_rows(&s0, 7, 7, rows), 7);
}

/* ---- the pass rule ---------------------------------------------------------------------------- */

static void test_apply_rule(void **state)
{
    (void)state;
    const double fl = ar_dtype_ulp_at_0p3(AR_BF16);
    ar_verify_sums sums = {100, 0.5, 0.02, 4.0, 1.0};   /* mean 0.005, naive mean 0.01 */
    ar_verify_result r;
    memset(&r, 0, sizeof r);
    r.max_abs = 0.05;
    r.naive_max_abs = 0.02;
    r.lse_max_abs = 0.001;
    r.naive_lse_max_abs = 0.001;
    ar_verify_apply_rule(AR_BF16, &sums, &r);
    assert_true(r.pass);
    assert_string_equal(r.reason, "");
    assert_true(fabs(r.mean_abs - 0.005) < 1e-15);
    assert_true(fabs(r.naive_mean_abs - 0.01) < 1e-15);
    assert_true(fabs(r.nmse - 0.005) < 1e-15);
    assert_true(fabs(r.tol_max_abs - (0.06 + fl)) < 1e-15);
    assert_true(fabs(r.tol_mean_abs - (0.015 + fl / 4)) < 1e-15);
    assert_true(fabs(r.tol_lse - 0.004) < 1e-15);
    /* each clause fails on its own, in order */
    ar_verify_result x = r;
    x.max_abs = 0.06 + 2 * fl;
    ar_verify_apply_rule(AR_BF16, &sums, &x);
    assert_false(x.pass);
    assert_non_null(strstr(x.reason, "max abs"));
    ar_verify_sums big_mean = sums;
    big_mean.sum_abs = 2.0;   /* mean 0.02 > 1.5 x 0.01 */
    x = r;
    ar_verify_apply_rule(AR_BF16, &big_mean, &x);
    assert_false(x.pass);
    assert_non_null(strstr(x.reason, "mean abs"));
    x = r;
    x.lse_max_abs = 0.01;
    ar_verify_apply_rule(AR_BF16, &sums, &x);
    assert_false(x.pass);
    assert_non_null(strstr(x.reason, "LSE"));
    x = r;
    x.nan_count = 3;
    x.max_abs = INFINITY;
    ar_verify_apply_rule(AR_BF16, &sums, &x);
    assert_false(x.pass);
    assert_non_null(strstr(x.reason, "3 NaN"));
    x = r;
    x.max_abs = NAN;   /* a NaN error never passes */
    ar_verify_apply_rule(AR_BF16, &sums, &x);
    assert_false(x.pass);
    /* no reference energy but an error: NMSE is infinite */
    ar_verify_sums zero_ref = {10, 0.1, 0.01, 0.0, 0.1};
    x = r;
    ar_verify_apply_rule(AR_BF16, &zero_ref, &x);
    assert_true(isinf(x.nmse));
}

/* ---- the cross-check comparison -------------------------------------------------------------- */

static void test_crosscheck_diff(void **state)
{
    (void)state;
    enum { H = 3, DV = 8 };
    double host[H * DV], dev[H * DV], hl[H] = {1.5, -INFINITY, 200.0}, dl[H];
    for (int i = 0; i < H * DV; i++) host[i] = dev[i] = (i % 5) * 0.25 - 0.5;
    host[DV + 3] = dev[DV + 3] = 1e-9;   /* an element near zero in a head of magnitude 0.5 */
    memcpy(dl, hl, sizeof dl);
    int wh = -1;
    assert_true(ar_crosscheck_diff(H, DV, dev, dl, host, hl, &wh) == 0);
    /* 1e-12 absolute on the near-zero element: relative to its head (0.5), not to itself */
    dev[DV + 3] += 1e-12;
    double d = ar_crosscheck_diff(H, DV, dev, dl, host, hl, &wh);
    assert_true(d > 1e-12 && d < 1e-11);
    assert_int_equal(wh, 1);
    assert_true(d <= AR_CROSSCHECK_TOL);
    /* 1e-8 of a head's scale disagrees */
    dev[2 * DV + 1] += 0.5 * 1e-8;
    d = ar_crosscheck_diff(H, DV, dev, dl, host, hl, &wh);
    assert_true(d > AR_CROSSCHECK_TOL);
    assert_int_equal(wh, 2);
    /* LSE: relative to max(|lse|, 1); equal infinities agree; NaN never does */
    memcpy(dev, host, sizeof dev);
    dl[2] = 200.0 * (1 + 1e-10);
    assert_true(ar_crosscheck_diff(H, DV, dev, dl, host, hl, NULL) < 2e-10);
    dl[1] = INFINITY;
    assert_true(isinf(ar_crosscheck_diff(H, DV, dev, dl, host, hl, &wh)));
    assert_int_equal(wh, 1);
    memcpy(dl, hl, sizeof dl);
    dev[0] = NAN;
    assert_true(isinf(ar_crosscheck_diff(H, DV, dev, dl, host, hl, &wh)));
    assert_int_equal(wh, 0);
}

/* ---- a one-request batch ------------------------------------------------------------------------ */

typedef struct one_req {
    ar_run_config cfg;
    int qsl[2], seq[1], ctx[1];
    int *table;
    uint64_t *keys, req_key[1];
    int64_t *slots;
    ar_batch b;
} one_req;

static void one_req_make(one_req *o, bool mla, int hq, int hkv, int d, int ctx, int n)
{
    memset(o, 0, sizeof *o);
    ar_model *m = &o->cfg.model;
    if (mla) {
        tu_mla_model(m, "verify-test", hq, 1);
    } else {
        snprintf(m->name, sizeof m->name, "verify-test");
        m->num_layers = 1;
        m->num_q_heads = hq;
        m->attention = AR_ATTN_MHA;
        m->num_kv_heads = hkv;
        m->head_size = d;
        m->v_head_dim = d;
        m->scale = 1.0 / sqrt((double)d);
    }
    o->cfg.block_size = 16;
    o->cfg.num_blocks = 4096;
    o->cfg.dtype = AR_BF16;
    o->cfg.kv_dtype = AR_BF16;
    o->cfg.kv_scale = 1.0;
    o->cfg.num_layers = 1;
    o->cfg.seed = 5;
    o->cfg.repeat = 1;
    o->cfg.threads = 1;
    const int s = ctx + n, nb = (s + 15) / 16;
    o->table = calloc((size_t)nb, sizeof *o->table);
    o->keys = calloc((size_t)nb, sizeof *o->keys);
    o->slots = calloc((size_t)n, sizeof *o->slots);
    assert_true(o->table && o->keys && o->slots);
    uint64_t prev = AR_ROOT_KEY;
    for (int i = 0; i < nb; i++) {
        o->table[i] = i + 1;
        prev = ar_chain_key(prev, (uint64_t)i * 7 + 3);
        o->keys[i] = prev;
    }
    for (int t = 0; t < n; t++) o->slots[t] = (int64_t)o->table[(ctx + t) / 16] * 16 + (ctx + t) % 16;
    o->qsl[1] = n;
    o->seq[0] = s;
    o->ctx[0] = ctx;
    o->req_key[0] = ar_req_key("verify-req");
    o->b = (ar_batch){.step = 0, .num_reqs = 1, .num_tokens = n, .query_start_loc = o->qsl, .seq_lens = o->seq,
                      .context_lens = o->ctx, .max_query_len = n, .max_seq_len = s, .max_blocks_per_req = nb,
                      .block_table = o->table, .block_keys = o->keys, .req_keys = o->req_key, .slot_mapping = o->slots};
}

static void one_req_free(one_req *o)
{
    free(o->table);
    free(o->keys);
    free(o->slots);
}

/* The request's inputs from the generator in logical order, as the reference reads them:
 *   q [n, hq, d], k and v [ctx + n, hkv, d], qpos [n]. */
static void gen_mha_inputs(const one_req *o, ar_dtype dt, double *q, double *k, double *v, int *qpos)
{
    const int hq = o->cfg.model.num_q_heads, hkv = o->cfg.model.num_kv_heads, d = o->cfg.model.head_size;
    const int ctx = o->ctx[0], n = o->qsl[1], s = o->seq[0];
    for (int i = 0; i < n; i++) {
        qpos[i] = ctx + i;
        for (int h = 0; h < hq; h++) {
            uint64_t row = ar_gen_row(o->cfg.seed, AR_STREAM_Q, 0, o->req_key[0], (uint64_t)(ctx + i), (uint32_t)h);
            for (int e = 0; e < d; e++) q[((size_t)i * hq + h) * d + e] = ar_gen(row, (uint32_t)e, AR_DATA_NORMAL, dt);
        }
    }
    for (int p = 0; p < s; p++)
        for (int g = 0; g < hkv; g++) {
            uint64_t rk = ar_gen_row(o->cfg.seed, AR_STREAM_K, 0, o->keys[p / 16], (uint64_t)(p % 16), (uint32_t)g);
            uint64_t rv = ar_gen_row(o->cfg.seed, AR_STREAM_V, 0, o->keys[p / 16], (uint64_t)(p % 16), (uint32_t)g);
            for (int e = 0; e < d; e++) {
                k[((size_t)p * hkv + g) * d + e] = ar_gen(rk, (uint32_t)e, AR_DATA_NORMAL, dt);
                v[((size_t)p * hkv + g) * d + e] = ar_gen(rv, (uint32_t)e, AR_DATA_NORMAL, dt);
            }
        }
}

/* Rows verified in blocks give the values of one ar_ref_attend call over all rows, bit for bit:
 * the backend output is that call's result rounded to float, so every error is exactly
 * |float(x) - x| and the sums match to the last bit only if the verifier's reference is x. */
static void blocks_change_nothing(int hq, int hkv, int n)
{
    const int d = 64, ctx = 300;
    one_req o;
    one_req_make(&o, false, hq, hkv, d, ctx, n);
    /* fp32 data: bf16 products sum exactly in float64, so only fp32 can show a changed order */
    o.cfg.dtype = o.cfg.kv_dtype = AR_FP32;
    const int s = ctx + n;
    double *q = malloc(sizeof(double) * (size_t)n * hq * d), *k = malloc(sizeof(double) * (size_t)s * hkv * d);
    double *v = malloc(sizeof(double) * (size_t)s * hkv * d), *ref = malloc(sizeof(double) * (size_t)n * hq * d);
    double *ref_l = malloc(sizeof(double) * (size_t)n * hq);
    float *out = malloc(sizeof(float) * (size_t)n * hq * d), *lse = malloc(sizeof(float) * (size_t)n * hq);
    int *qpos = malloc(sizeof(int) * (size_t)n);
    assert_true(q && k && v && ref && ref_l && out && lse && qpos);
    gen_mha_inputs(&o, AR_FP32, q, k, v, qpos);
    ar_attn_params p = {hq, hkv, d, d, o.cfg.model.scale, 0, 0.0, true};
    ar_ref_attend(&p, n, q, qpos, s, 0, k, v, ref, ref_l);
    double sum = 0, mx = 0, lmx = 0;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < hq; h++) {
            for (int e = 0; e < d; e++) {
                double x = ref[((size_t)i * hq + h) * d + e];
                float f = (float)x;
                out[((size_t)i * hq + h) * d + e] = f;
                double err = fabs((double)f - x);
                sum += err;
                if (err > mx) mx = err;
            }
            double xl = ref_l[(size_t)h * n + i];
            lse[(size_t)h * n + i] = (float)xl;
            double le = fabs((double)(float)xl - xl);
            if (le > lmx) lmx = le;
        }
    ar_verify_opts vo = {AR_VERIFY_ALL, 0, 2, NULL, NULL};
    ar_verify_result res;
    char err[256];
    assert_int_equal(ar_verify_step(&o.cfg, &o.b, 0, out, lse, NULL, &vo, &res, err, sizeof err), 0);
    assert_int_equal(res.rows_checked, n);
    assert_true(res.max_abs == mx);
    assert_true(res.mean_abs == sum / ((double)n * hq * d));
    assert_true(res.lse_max_abs == lmx);
    assert_true(res.pass);
    free(q); free(k); free(v); free(ref); free(ref_l); free(out); free(lse); free(qpos);
    one_req_free(&o);
}

/* ar_verify_host_reference (rows in blocks, one KV head group at a time when asked) equals one
 * ar_ref_attend call over every row and head, bit for bit (fp32 data: any change of summation
 * order would show). */
static void test_host_reference_equals_one_call(void **state)
{
    (void)state;
    const int hq = 8, hkv = 2, d = 64, ctx = 200, n = 37;
    one_req o;
    one_req_make(&o, false, hq, hkv, d, ctx, n);
    o.cfg.dtype = o.cfg.kv_dtype = AR_FP32;
    const int s = ctx + n;
    double *q = malloc(sizeof(double) * (size_t)n * hq * d), *k = malloc(sizeof(double) * (size_t)s * hkv * d);
    double *v = malloc(sizeof(double) * (size_t)s * hkv * d), *ref = malloc(sizeof(double) * (size_t)n * hq * d);
    double *ref_l = malloc(sizeof(double) * (size_t)n * hq), *got = malloc(sizeof(double) * (size_t)n * hq * d);
    double *got_l = malloc(sizeof(double) * (size_t)n * hq);
    int *qpos = malloc(sizeof(int) * (size_t)n), *rows = malloc(sizeof(int) * (size_t)n);
    assert_true(q && k && v && ref && ref_l && got && got_l && qpos && rows);
    for (int i = 0; i < n; i++) rows[i] = i;
    gen_mha_inputs(&o, AR_FP32, q, k, v, qpos);
    ar_attn_params p = {hq, hkv, d, d, o.cfg.model.scale, 0, 0.0, true};
    ar_ref_attend(&p, n, q, qpos, s, 0, k, v, ref, ref_l);
    assert_int_equal(ar_verify_host_reference(&o.cfg, &o.b, 0, 0, n, rows, 0, hq, got, got_l, NULL, NULL), 0);
    assert_memory_equal(got, ref, sizeof(double) * (size_t)n * hq * d);
    assert_memory_equal(got_l, ref_l, sizeof(double) * (size_t)n * hq);
    /* the second KV head's group alone: heads 4..7 of the same call */
    const int group = hq / hkv;
    assert_int_equal(ar_verify_host_reference(&o.cfg, &o.b, 0, 0, n, rows, group, group, got, got_l, NULL, NULL), 0);
    for (int i = 0; i < n; i++)
        for (int h = 0; h < group; h++) {
            assert_memory_equal(got + ((size_t)i * group + h) * d, ref + ((size_t)i * hq + group + h) * d, sizeof(double) * d);
            assert_true(got_l[(size_t)h * n + i] == ref_l[(size_t)(group + h) * n + i]);
        }
    /* heads that split a KV group are refused */
    assert_int_equal(ar_verify_host_reference(&o.cfg, &o.b, 0, 0, n, rows, 1, 2, got, got_l, NULL, NULL), -1);
    free(q); free(k); free(v); free(ref); free(ref_l); free(got); free(got_l); free(qpos); free(rows);
    one_req_free(&o);
}

/* MLA one head at a time (the host verifier's order, and the cross-check's) equals the all-heads
 * expanded reference ar_mla_ref_attend, bit for bit. */
static void test_mla_per_head_equals_all_heads(void **state)
{
    (void)state;
    const int N = 4, L = 512, R = 64, P = 128, V = 128, E = L + R, ctx = 60, n = 3;
    one_req o;
    one_req_make(&o, true, N, 1, 576, ctx, n);
    o.cfg.dtype = o.cfg.kv_dtype = AR_FP32;
    const int s = ctx + n;
    ar_mla_dims dims = {N, L, R, P, V, o.cfg.model.scale};
    double *uk = malloc(sizeof(double) * (size_t)L * N * P), *uv = malloc(sizeof(double) * (size_t)L * N * V);
    double *lat = malloc(sizeof(double) * (size_t)s * E), *qn = malloc(sizeof(double) * (size_t)n * N * P);
    double *qp = malloc(sizeof(double) * (size_t)n * N * R), *ref = malloc(sizeof(double) * (size_t)n * N * V);
    double *ref_l = malloc(sizeof(double) * (size_t)n * N), *got = malloc(sizeof(double) * (size_t)n * N * V);
    double *got_l = malloc(sizeof(double) * (size_t)n * N);
    int qpos[3], rows[3];
    assert_true(uk && uv && lat && qn && qp && ref && ref_l && got && got_l);
    ar_mla_gen_weights(&dims, o.cfg.seed, 0, o.cfg.data, o.cfg.dtype, uk, uv);
    for (int p = 0; p < s; p++) {
        uint64_t rl = ar_gen_row(o.cfg.seed, AR_STREAM_LATENT, 0, o.keys[p / 16], (uint64_t)(p % 16), 0);
        for (int e = 0; e < E; e++) lat[(size_t)p * E + e] = ar_gen(rl, (uint32_t)e, o.cfg.data, o.cfg.dtype);
    }
    for (int i = 0; i < n; i++) {
        rows[i] = i;
        qpos[i] = ctx + i;
        for (int h = 0; h < N; h++) {
            uint64_t rn = ar_gen_row(o.cfg.seed, AR_STREAM_Q_NOPE, 0, o.req_key[0], (uint64_t)qpos[i], (uint32_t)h);
            uint64_t rp = ar_gen_row(o.cfg.seed, AR_STREAM_Q_PE, 0, o.req_key[0], (uint64_t)qpos[i], (uint32_t)h);
            for (int e = 0; e < P; e++) qn[((size_t)i * N + h) * P + e] = ar_gen(rn, (uint32_t)e, o.cfg.data, o.cfg.dtype);
            for (int e = 0; e < R; e++) qp[((size_t)i * N + h) * R + e] = ar_gen(rp, (uint32_t)e, o.cfg.data, o.cfg.dtype);
        }
    }
    assert_int_equal(ar_mla_ref_attend(&dims, n, qn, qp, qpos, s, lat, uk, uv, ref, ref_l), 0);
    assert_int_equal(ar_verify_host_reference(&o.cfg, &o.b, 0, 0, n, rows, 0, N, got, got_l, NULL, NULL), 0);
    assert_memory_equal(got, ref, sizeof(double) * (size_t)n * N * V);
    assert_memory_equal(got_l, ref_l, sizeof(double) * (size_t)n * N);
    free(uk); free(uv); free(lat); free(qn); free(qp); free(ref); free(ref_l); free(got); free(got_l);
    one_req_free(&o);
}

static void test_row_blocks_change_no_value(void **state)
{
    (void)state;
    blocks_change_nothing(2, 2, 70);   /* group 1: the 6-row tail joins the block before it */
    blocks_change_nothing(8, 2, 70);   /* group 4: the tail is a block of its own */
    blocks_change_nothing(4, 1, 5);    /* fewer rows than one block */
}

/* ---- cancellation ---------------------------------------------------------------------------- */

typedef struct raiser {
    volatile int *flag;
    double after_s;
} raiser;

static void *raise_later(void *arg)
{
    raiser *r = arg;
    usleep((useconds_t)(r->after_s * 1e6));
    *r->flag = 1;
    return NULL;
}

/* A step that would verify for tens of seconds stops soon after the flag goes up. */
static void cancel_case(bool mla)
{
    one_req o;
    if (mla) one_req_make(&o, true, 32, 1, 576, 1500, 4);   /* one head (the granule) ~0.05 s */
    else one_req_make(&o, false, 16, 4, 128, 3000, 400);
    const int n = o.b.num_tokens, hq = o.cfg.model.num_q_heads, dv = 128;   /* both shapes */
    float *out = calloc((size_t)n * hq * dv, sizeof *out), *lse = calloc((size_t)n * hq, sizeof *lse);
    assert_true(out && lse);
    volatile int flag = 0;
    ar_verify_opts vo = {AR_VERIFY_ALL, 0, 1, NULL, &flag};
    ar_verify_result res;
    char err[256];
    /* raised before: nothing is computed */
    flag = 1;
    double t0 = now_s();
    assert_int_equal(ar_verify_step(&o.cfg, &o.b, 0, out, lse, NULL, &vo, &res, err, sizeof err), AR_VERIFY_CANCELLED);
    assert_true(now_s() - t0 < 2.0);
    /* raised while it works */
    flag = 0;
    raiser rz = {&flag, 0.3};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, raise_later, &rz), 0);
    t0 = now_s();
    int rc = ar_verify_step(&o.cfg, &o.b, 0, out, lse, NULL, &vo, &res, err, sizeof err);
    double took = now_s() - t0;
    pthread_join(th, NULL);
    print_message("%s: cancelled after %.2f s (flag raised at 0.3 s)\n", mla ? "MLA" : "MHA", took);
    assert_int_equal(rc, AR_VERIFY_CANCELLED);
    /* the work left undone takes tens of seconds; the bounds leave room for a shared machine and
     * for sanitizer builds (about ten times slower) */
#if defined(__SANITIZE_ADDRESS__)
    assert_true(took < 10.0);
#else
    assert_true(took < 5.0);
#endif
    free(out);
    free(lse);
    one_req_free(&o);
}

static void test_cancel_mha(void **state)
{
    (void)state;
    cancel_case(false);
}

static void test_cancel_mla(void **state)
{
    (void)state;
    cancel_case(true);
}

/* ---- where a run verifies ------------------------------------------------------------------ */

static bool fake_check(const ar_run_config *cfg, char *why, size_t why_len)
{
    (void)cfg;
    snprintf(why, why_len, "test");
    return true;
}

static void test_verifier_place(void **state)
{
    (void)state;
    one_req o;
    one_req_make(&o, false, 4, 2, 64, 10, 3);
    const ar_backend *cpu = ar_backend_find("cpu");
    assert_non_null(cpu);
    ar_verifier *v = NULL;
    char err[256], line[256];
    assert_int_equal(ar_verifier_open(&v, &o.cfg, cpu, err, sizeof err), 0);
    assert_string_equal(ar_verifier_where(v), "host");
    ar_verify_opts vo = {AR_VERIFY_ALL, 0, 1, NULL, NULL};
    assert_true(ar_verifier_needs_host_output(v, &vo));
    /* a host verifier cannot work without the output on the host */
    ar_forward_out fo;
    memset(&fo, 0, sizeof fo);
    ar_verify_result res;
    assert_int_equal(ar_verifier_check_layer(v, &o.b, 0, &fo, NULL, &vo, &res, err, sizeof err), -1);
    assert_non_null(strstr(err, "host"));
    assert_int_equal(ar_verifier_finish(v, line, sizeof line, err, sizeof err), 0);
    assert_string_equal(line, "");
    ar_crosscheck_stats xs;
    ar_verifier_crosscheck_stats(v, &xs);
    assert_int_equal(xs.done, 0);
    ar_verifier_close(v);

    /* asking for the device: an error unless this machine has one */
    char why[256];
    const bool dev = ar_gpu_ref_available(why, sizeof why);
    ar_backend gpu_like = *cpu;
    gpu_like.name = "gpu-like";
    gpu_like.needs_gpu = true;
    gpu_like.check = fake_check;
    ar_verifier_options opt = {"device", 0, false, 0, 0};
    int rc = ar_verifier_open_with(&v, &o.cfg, &gpu_like, &opt, err, sizeof err);
    if (!dev) {
        assert_int_equal(rc, -1);
        assert_non_null(strstr(err, "device"));
    } else {
        assert_int_equal(rc, 0);
        assert_string_equal(ar_verifier_where(v), "device");
        assert_false(ar_verifier_needs_host_output(v, &vo));
        ar_verifier_close(v);
    }
    /* a host backend never verifies on the device */
    assert_int_equal(ar_verifier_open_with(&v, &o.cfg, cpu, &opt, err, sizeof err), -1);
    /* auto with a device backend: the device where there is one, else the host */
    opt.where = "auto";
    assert_int_equal(ar_verifier_open_with(&v, &o.cfg, &gpu_like, &opt, err, sizeof err), 0);
    assert_string_equal(ar_verifier_where(v), dev ? "device" : "host");
    ar_verifier_close(v);
    /* a misspelt place is refused */
    opt.where = "gpu";
    assert_int_equal(ar_verifier_open_with(&v, &o.cfg, cpu, &opt, err, sizeof err), -1);
    assert_non_null(strstr(err, "gpu"));
    one_req_free(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_choose_rows),
        cmocka_unit_test(test_apply_rule),
        cmocka_unit_test(test_crosscheck_diff),
        cmocka_unit_test(test_host_reference_equals_one_call),
        cmocka_unit_test(test_mla_per_head_equals_all_heads),
        cmocka_unit_test(test_row_blocks_change_no_value),
        cmocka_unit_test(test_cancel_mha),
        cmocka_unit_test(test_cancel_mla),
        cmocka_unit_test(test_verifier_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
