/* cascade_cases.h - shared pieces of the cascade tests (tests/test_cascade_cpu.c on the CPU
 * backend, tests/gpu_cascade.c on the CUDA one; tests/gpu_cuda.c takes the batch builder with
 * P = 0): vLLM test_cascade's sequence sets, a batch
 * whose requests share the first P / block_size physical blocks, the context fill, and one
 * case run flat and with cascade on the same backend instance, both through the verifier
 * (replay/verify.h) and compared with each other on every element.  Functions are static
 * inline so that each test binary takes only what it uses. */
#ifndef AR_TESTS_CASCADE_CASES_H
#define AR_TESTS_CASCADE_CASES_H

#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../reference/reference.h"
#include "../replay/backend.h"
#include "../replay/verify.h"

typedef struct casc_seq {
    int q_len, kv_len;
} casc_seq;

/* A batch whose requests share the first prefix_blocks physical blocks. */
typedef struct casc_batch {
    int num_reqs, num_tokens, mbpr;
    int *qsl, *seq_lens, *ctx_lens, *block_table;
    uint64_t *block_keys, *req_keys;
    int64_t *slots;
    ar_batch b;
} casc_batch;

static uint64_t casc_rng = 0x9e3779b97f4a7c15ull;
static inline uint64_t casc_next(void) { return tu_rng64(&casc_rng); }

static inline ar_run_config casc_cfg(int hq, int hkv, int d, int num_blocks, ar_dtype dt, double cap)
{
    ar_run_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model.name, sizeof c.model.name, "gpu-cascade");
    c.model.attention = AR_ATTN_MHA;
    c.model.num_layers = 1;
    c.model.num_q_heads = hq;
    c.model.num_kv_heads = hkv;
    c.model.head_size = d;
    c.model.v_head_dim = d;
    c.model.scale = 1.0 / sqrt((double)d);
    c.model.logits_soft_cap = cap;
    c.block_size = 16;
    c.num_blocks = num_blocks;
    c.dtype = dt;
    c.kv_dtype = dt;
    c.kv_scale = 1.0;
    c.num_layers = 1;
    c.seed = 4242;
    c.data = AR_DATA_NORMAL;
    c.fault = AR_FAULT_NONE;
    c.cascade_mode = 2;
    c.repeat = 1;
    return c;
}

static inline void casc_free(casc_batch *t)
{
    free(t->qsl);
    free(t->seq_lens);
    free(t->ctx_lens);
    free(t->block_table);
    free(t->block_keys);
    free(t->req_keys);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

/* Requests get distinct random physical blocks (never block 0) after the shared prefix_len
 * tokens, whose blocks (and content keys) are request 0's. */
static inline void casc_make(casc_batch *t, const ar_run_config *cfg, const casc_seq *cases, int n, int prefix_len)
{
    const int B = cfg->block_size, shared = prefix_len / B;
    memset(t, 0, sizeof *t);
    t->num_reqs = n;
    int max_kv = 0, max_q = 0, T = 0, total_blocks = shared;
    for (int i = 0; i < n; i++) {
        if (cases[i].kv_len > max_kv) max_kv = cases[i].kv_len;
        if (cases[i].q_len > max_q) max_q = cases[i].q_len;
        T += cases[i].q_len;
        total_blocks += (cases[i].kv_len + B - 1) / B - shared;
    }
    assert_true(total_blocks < cfg->num_blocks);
    t->num_tokens = T;
    t->mbpr = (max_kv + B - 1) / B;
    t->qsl = calloc((size_t)n + 1, sizeof(int));
    t->seq_lens = calloc((size_t)n, sizeof(int));
    t->ctx_lens = calloc((size_t)n, sizeof(int));
    t->block_table = calloc((size_t)n * t->mbpr, sizeof(int));
    t->block_keys = calloc((size_t)n * t->mbpr, sizeof(uint64_t));
    t->req_keys = calloc((size_t)n, sizeof(uint64_t));
    t->slots = calloc((size_t)(T > 0 ? T : 1), sizeof(int64_t));
    int *perm = malloc(sizeof(int) * (size_t)cfg->num_blocks);
    assert_non_null(perm);
    assert_non_null(t->slots);
    for (int i = 0; i < cfg->num_blocks - 1; i++) perm[i] = i + 1;
    for (int i = cfg->num_blocks - 2; i > 0; i--) {
        int j = (int)(casc_next() % (uint64_t)(i + 1));
        int x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    int next = 0, tok = 0;
    for (int r = 0; r < n; r++) {
        t->seq_lens[r] = cases[r].kv_len;
        t->ctx_lens[r] = cases[r].kv_len - cases[r].q_len;
        t->req_keys[r] = casc_next();
        for (int i = 0; i < (cases[r].kv_len + B - 1) / B; i++) {
            if (r > 0 && i < shared) {
                t->block_table[r * t->mbpr + i] = t->block_table[i];
                t->block_keys[r * t->mbpr + i] = t->block_keys[i];
            } else {
                t->block_table[r * t->mbpr + i] = perm[next++];
                t->block_keys[r * t->mbpr + i] = casc_next();
            }
        }
        for (int i = 0; i < cases[r].q_len; i++) {
            int p = t->ctx_lens[r] + i;
            t->slots[tok + i] = (int64_t)t->block_table[r * t->mbpr + p / B] * B + p % B;
        }
        tok += cases[r].q_len;
        t->qsl[r + 1] = tok;
    }
    free(perm);
    ar_batch b = {1, n, T, t->qsl, t->seq_lens, t->ctx_lens, max_q, max_kv, t->mbpr,
                  t->block_table, t->block_keys, t->req_keys, t->slots, 0};
    t->b = b;
}

/* Writes every context token of layer through fill(); the shared blocks only once (request 0). */
static inline void casc_fill(const ar_backend *be, void *state, const ar_run_config *cfg, const casc_batch *t,
                             int prefix_len, int layer)
{
    const int B = cfg->block_size;
    int count = 0;
    for (int r = 0; r < t->num_reqs; r++) count += t->ctx_lens[r] - (r > 0 ? prefix_len : 0);
    if (count <= 0) return;
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)count);
    uint64_t *keys = malloc(sizeof(uint64_t) * (size_t)count);
    int *offs = malloc(sizeof(int) * (size_t)count);
    assert_non_null(slots);
    assert_non_null(keys);
    assert_non_null(offs);
    int k = 0;
    for (int r = 0; r < t->num_reqs; r++)
        for (int p = r > 0 ? prefix_len : 0; p < t->ctx_lens[r]; p++) {
            slots[k] = (int64_t)t->block_table[r * t->mbpr + p / B] * B + p % B;
            keys[k] = t->block_keys[r * t->mbpr + p / B];
            offs[k] = p % B;
            k++;
        }
    ar_fill f = {count, slots, keys, offs};
    char err[512] = "";
    int rc = be->fill(state, layer, &f, err, sizeof err);
    if (rc) print_message("fill: %s\n", err);
    assert_int_equal(rc, 0);
    free(slots);
    free(keys);
    free(offs);
}

typedef struct casc_result {
    ar_verify_result flat, casc;
    int prefix_config, prefix_num_work, prefix_num_splits;   /* the CUDA plan; 0 elsewhere */
    double diff_max;          /* max |cascade - flat| over every out element */
    double diff_lse;          /* max |cascade - flat| over every finite LSE */
    double prefix_us, suffix_us, merge_us, flat_us;
    int guard_violations;
} casc_result;

/* How much of a case the float64 reference checks.  The cascade == flat comparison always
 * covers every element of every request; the verifier (a float64 CPU reference per checked
 * row, regenerating each checked request's keys) is what costs time on big sets. */
typedef struct casc_check {
    int flat_rows;      /* rows per step verified on the flat run (0 = every row) */
    int cascade_rows;   /* rows per step verified on the cascade run (0 = every row) */
    int verify_reqs;    /* verify only requests [0, verify_reqs) (0 = all); NaN/Inf still checked everywhere */
    void (*after_open)(void *state);   /* NULL, or called on the backend state right after open (plan overrides) */
} casc_check;

/* One forward of the prepared step into out/lse, verified (sample_rows 0 = all rows; verify_reqs
 * 0 = all requests, else the first verify_reqs). */
static inline void casc_forward(const ar_backend *be, void *state, const ar_run_config *cfg, const casc_batch *t, const ar_batch *bb,
                         int sample_rows, int verify_reqs, float *out, float *lse, ar_forward_out *o, ar_verify_result *vr)
{
    char err[512] = "";
    memset(o, 0, sizeof *o);
    o->out = out;
    o->lse = lse;
    int rc = be->forward(state, 0, bb, o, err, sizeof err);
    if (rc) print_message("forward: %s\n", err);
    assert_int_equal(rc, 0);
    ar_verify_opts vo = {sample_rows > 0 ? AR_VERIFY_SAMPLE : AR_VERIFY_ALL, sample_rows, 0, NULL, NULL};
    /* a view of the first verify_reqs requests: num_tokens (the out/lse row stride) unchanged */
    ar_batch checked = t->b;
    if (verify_reqs > 0 && verify_reqs < checked.num_reqs) checked.num_reqs = verify_reqs;
    rc = ar_verify_step(cfg, &checked, 0, out, lse, NULL, &vo, vr, err, sizeof err);
    if (rc) print_message("verify: %s\n", err);
    assert_int_equal(rc, 0);
    if (o->guard_violations) vr->pass = false;
}

/* Runs the batch flat and with cascade prefix P on one backend instance, verifying as check
 * says; after_prepare (may be NULL) sees the state right after the cascade step's prepare. */
static inline void casc_run_checked(const ar_backend *be, void (*after_prepare)(void *state, casc_result *res),
                                    const ar_run_config *cfg, const casc_seq *cases, int n, int prefix_len,
                                    const casc_check *check, casc_result *res)
{
    memset(res, 0, sizeof *res);
    void *state = NULL;
    char err[512] = "";
    int rc = be->open(cfg, &state, err, sizeof err);
    if (rc) print_message("open: %s\n", err);
    assert_int_equal(rc, 0);
    if (check->after_open) check->after_open(state);
    casc_batch t;
    casc_make(&t, cfg, cases, n, prefix_len);
    casc_fill(be, state, cfg, &t, prefix_len, 0);
    const int Hq = cfg->model.num_q_heads, D = cfg->model.head_size, T = t.num_tokens;
    size_t no = (size_t)T * Hq * D, nl = (size_t)T * Hq;
    float *out_flat = malloc(sizeof(float) * no), *lse_flat = malloc(sizeof(float) * nl);
    float *out_casc = malloc(sizeof(float) * no), *lse_casc = malloc(sizeof(float) * nl);
    assert_non_null(out_flat);
    assert_non_null(lse_flat);
    assert_non_null(out_casc);
    assert_non_null(lse_casc);

    ar_batch bb = t.b;
    ar_forward_out o;
    bb.common_prefix_len = 0;
    rc = be->prepare(state, &bb, err, sizeof err);
    if (rc) print_message("prepare (flat): %s\n", err);
    assert_int_equal(rc, 0);
    casc_forward(be, state, cfg, &t, &bb, check->flat_rows, check->verify_reqs, out_flat, lse_flat, &o, &res->flat);
    assert_string_equal(o.kernels[1].name, "attn");
    res->flat_us = o.total_us - o.kernels[0].us;
    res->guard_violations += o.guard_violations;

    bb.common_prefix_len = prefix_len;
    rc = be->prepare(state, &bb, err, sizeof err);
    if (rc) print_message("prepare (cascade): %s\n", err);
    assert_int_equal(rc, 0);
    if (after_prepare) after_prepare(state, res);
    casc_forward(be, state, cfg, &t, &bb, check->cascade_rows, check->verify_reqs, out_casc, lse_casc, &o, &res->casc);
    assert_int_equal(o.num_kernels, 4);
    assert_string_equal(o.kernels[0].name, "write");
    assert_string_equal(o.kernels[1].name, "prefix");
    assert_string_equal(o.kernels[2].name, "suffix");
    assert_string_equal(o.kernels[3].name, "merge");
    res->prefix_us = o.kernels[1].us;
    res->suffix_us = o.kernels[2].us;
    res->merge_us = o.kernels[3].us;
    res->guard_violations += o.guard_violations;

    for (size_t i = 0; i < no; i++) {
        double d = fabs((double)out_casc[i] - (double)out_flat[i]);
        if (isnan(d)) d = INFINITY;   /* a NaN anywhere fails the agreement check */
        if (d > res->diff_max) res->diff_max = d;
    }
    for (size_t i = 0; i < nl; i++) {
        if (isinf(lse_casc[i]) && isinf(lse_flat[i]) && lse_casc[i] == lse_flat[i]) continue;
        double d = fabs((double)lse_casc[i] - (double)lse_flat[i]);
        if (isnan(d)) d = INFINITY;
        if (d > res->diff_lse) res->diff_lse = d;
    }
    free(out_flat);
    free(lse_flat);
    free(out_casc);
    free(lse_casc);
    casc_free(&t);
    be->close(state);
}

/* casc_run_checked with sample_rows rows verified on both runs, every request (0 = all rows). */
static inline void casc_run(const ar_backend *be, void (*after_prepare)(void *state, casc_result *res),
                            const ar_run_config *cfg, const casc_seq *cases, int n, int prefix_len, int sample_rows,
                            casc_result *res)
{
    casc_check check = {sample_rows, sample_rows, 0, NULL};
    casc_run_checked(be, after_prepare, cfg, cases, n, prefix_len, &check, res);
}

/* vLLM test_cascade's sequence sets: (query_len, kv_len) */
static const casc_seq casc_general_seqs[] = {{129, 871}, {18, 280}, {37, 988}, {1023, 2304}, {1, 257}};
static const casc_seq casc_fd_seqs[] = {{1, 1023}, {1, 879}, {1, 778}, {1, 1777}};

/* Largest |cascade - flat| allowed: the sum of the two runs' verifier tolerances. */
static inline bool casc_agree(const casc_result *r)
{
    return r->diff_max <= r->flat.tol_max_abs + r->casc.tol_max_abs && r->diff_lse <= r->flat.tol_lse + r->casc.tol_lse;
}

/* Normal-ish values from the test RNG. */
static inline float casc_randn(void)
{
    double u1 = ((double)(casc_next() >> 11) + 0.5) / 9007199254740992.0;
    double u2 = (double)(casc_next() >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* A merge implementation: partial outputs (dtype values) and LSEs in, merged out/lse back;
 * 0 ok. */
typedef int (*casc_merge_fn)(ar_dtype dt, int T, int H, int D, const float *po, const float *pl,
                             const float *so, const float *sl, int no_weights, float *out, float *lse);

/* One merge case against ar_ref_merge: returns the number of bad elements (out within
 * 1e-3 + 1e-2 |ref|, LSE within 1e-4 (1 + |ref|), both-empty rows exact). */
static inline int64_t casc_merge_case(casc_merge_fn merge, ar_dtype dt, int T, int H, int D, bool no_weights, double *worst_out, double *worst_lse)
{
    size_t no = (size_t)T * H * D, nl = (size_t)T * H;
    float *po = malloc(no * 4), *so = malloc(no * 4), *out = malloc(no * 4);
    float *pl = malloc(nl * 4), *sl = malloc(nl * 4), *lse = malloc(nl * 4);
    double *dpo = malloc(no * 8), *dso = malloc(no * 8), *dout = malloc(no * 8);
    double *dpl = malloc(nl * 8), *dsl = malloc(nl * 8), *dlse = malloc(nl * 8);
    assert_true(po && so && out && pl && sl && lse && dpo && dso && dout && dpl && dsl && dlse);
    for (size_t i = 0; i < no; i++) {
        po[i] = ar_round_to(dt, casc_randn());
        so[i] = ar_round_to(dt, casc_randn());
        dpo[i] = po[i];
        dso[i] = so[i];
    }
    /* LSEs: ~10% +inf on each side, never both (vLLM's test); every 97th row -inf on the
     * prefix side, every 89th on the suffix side; every 211th row -inf on both */
    for (size_t i = 0; i < nl; i++) {
        pl[i] = 3.f * casc_randn();
        sl[i] = 3.f * casc_randn();
        uint64_t pick = casc_next() % 20;
        if (pick == 0) pl[i] = INFINITY;
        else if (pick == 1) sl[i] = INFINITY;
        if (i % 97 == 5) pl[i] = -INFINITY;
        if (i % 89 == 7) sl[i] = -INFINITY;
        if (i % 211 == 3) pl[i] = sl[i] = -INFINITY;
        dpl[i] = pl[i];
        dsl[i] = sl[i];
    }
    assert_int_equal(merge(dt, T, H, D, po, pl, so, sl, no_weights ? 1 : 0, out, lse), 0);
    if (no_weights) {
        /* the fault adds the sides unweighted: out = round(a + b) exactly */
        for (size_t i = 0; i < no; i++) {
            dout[i] = ar_round_to(dt, po[i] + so[i]);
        }
    } else {
        ar_ref_merge(T, H, D, dpo, dpl, dso, dsl, dout, dlse);
    }
    int64_t bad = 0;
    for (size_t i = 0; i < no; i++) {
        double d = fabs((double)out[i] - dout[i]);
        if (!(d <= *worst_out)) *worst_out = d;
        if (!(d <= 1e-3 + 1e-2 * fabs(dout[i]))) bad++;
    }
    if (!no_weights)
        for (size_t t = 0; t < (size_t)T; t++)
            for (size_t h = 0; h < (size_t)H; h++) {
                size_t li = h * (size_t)T + t;
                if (dlse[li] == -INFINITY) {
                    /* both sides empty: lse -inf and out is the prefix side as given */
                    if (lse[li] != -INFINITY) bad++;
                    for (int e = 0; e < D; e++)
                        if (out[(t * H + h) * D + e] != po[(t * H + h) * D + e]) bad++;
                    continue;
                }
                double d = fabs((double)lse[li] - dlse[li]);
                if (!(d <= *worst_lse)) *worst_lse = d;
                if (!(d <= 1e-4 * (1.0 + fabs(dlse[li])))) bad++;
            }
    free(po); free(so); free(out); free(pl); free(sl); free(lse);
    free(dpo); free(dso); free(dout); free(dpl); free(dsl); free(dlse);
    return bad;
}

#endif
