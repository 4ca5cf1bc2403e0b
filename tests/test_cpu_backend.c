/* test_cpu_backend.c - the "cpu" attention backend against the float64 reference.
 *
 * A tiny hand-written scheduler (struct sim) drives the backend through several steps of a
 * few requests - mixed prefill chunks and decodes, physical blocks handed out in shuffled
 * order, prefix hits on shared blocks - building each ar_batch by hand exactly as vLLM's model
 * runner would (query_start_loc, seq_lens, block_table, slot_mapping).  After every forward,
 * each request's output is compared with ar_ref_attend computed from LOGICAL positions: K/V
 * regenerated straight from the data generator (rounded to dtype, and for an fp8 cache through
 * the same quantisation), never read from the paged cache.
 *
 * Covered: head sizes 64/80/96/128/256, GQA ratios 1/4/8, block sizes 16/32/64 (and one block
 * larger than every sequence), fp32/fp16/bf16, fp8 KV, sliding window, soft cap, several
 * layers, cascade == flat == reference, fill() for context never written, every kernel fault
 * (the comparison must fail), NaN in unwritten slots (and none in correct outputs), slot -1
 * skipped, bad batches rejected with a message, check() verdicts, thread-count determinism. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/cpu_backend.h"
#include "../reference/datagen.h"
#include "../reference/reference.h"

#define MAX_REQS 6
#define MAX_BLOCKS 64        /* logical blocks per request (block_table row stride) */
#define MAX_TOKENS 512

/* ---- a tiny scheduler --------------------------------------------------------------- */

typedef struct sim_req {
    uint64_t req_key;
    int ctx;                              /* tokens whose K/V are in the cache */
    int num_blocks;                       /* logical blocks allocated */
    int blocks[MAX_BLOCKS];               /* physical ids */
    uint64_t keys[MAX_BLOCKS];            /* content key per logical block */
} sim_req;

typedef struct errors {
    double out;                           /* max |out - ref| / max(1, |ref|) */
    double lse;                           /* max |lse - ref| over rows with finite ref lse */
    long nan_count;                       /* NaN/Inf in out, or NaN lse */
    long lse_inf_mismatch;                /* -inf in one but not the other */
} errors;

typedef struct sim {
    ar_run_config cfg;
    void *state;
    sim_req reqs[MAX_REQS];
    int num_reqs;
    int free_blocks[1024];                /* shuffled physical ids, 1.. */
    int num_free;
    errors err;                           /* accumulated over steps */
    float *last_out;                      /* [T, Hq, D] of the last forward (last layer) */
    float *last_lse;                      /* [Hq, T] */
    int last_tokens;
    int64_t step;
} sim;

static ar_run_config make_cfg(int hq, int hkv, int d, int block_size, ar_dtype dt,
                              ar_dtype kv_dt, int window, double cap)
{
    ar_run_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model.name, sizeof c.model.name, "test");
    c.model.attention = AR_ATTN_MHA;
    c.model.num_layers = 2;
    c.model.num_q_heads = hq;
    c.model.num_kv_heads = hkv;
    c.model.head_size = d;
    c.model.v_head_dim = d;
    c.model.scale = 1.0 / sqrt((double)d);
    c.model.sliding_window = window;
    c.model.logits_soft_cap = cap;
    c.block_size = block_size;
    c.num_blocks = 96;
    c.dtype = dt;
    c.kv_dtype = kv_dt;
    c.kv_scale = kv_dt == AR_FP8_E4M3 ? 0.5 : 1.0;
    c.num_layers = 1;
    c.seed = 1234;
    c.data = AR_DATA_NORMAL;
    c.fault = AR_FAULT_NONE;
    c.repeat = 1;
    c.threads = 2;
    return c;
}

static double out_tol(ar_dtype t)
{
    return t == AR_FP32 ? 1e-5 : t == AR_FP16 ? 2e-3 : 1.6e-2;
}
#define LSE_TOL 1e-3

static void sim_open(sim *s, const ar_run_config *cfg)
{
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    char err[512] = "";
    int rc = ar_cpu_backend.open(cfg, &s->state, err, sizeof err);
    if (rc != 0) fail_msg("open failed: %s", err);
    /* Physical blocks 1..num_blocks-1 in a shuffled order (block 0 is the null block). */
    s->num_free = cfg->num_blocks - 1;
    for (int i = 0; i < s->num_free; i++) s->free_blocks[i] = i + 1;
    uint64_t x = 99;
    for (int i = s->num_free - 1; i > 0; i--) {
        x = ar_mix64(x + 1);
        int j = (int)(x % (uint64_t)(i + 1));
        int tmp = s->free_blocks[i];
        s->free_blocks[i] = s->free_blocks[j];
        s->free_blocks[j] = tmp;
    }
    s->err.out = s->err.lse = 0;
}

static void sim_close(sim *s)
{
    ar_cpu_backend.close(s->state);
    free(s->last_out);
    free(s->last_lse);
}

static int sim_add_req(sim *s, uint64_t req_key)
{
    int r = s->num_reqs++;
    memset(&s->reqs[r], 0, sizeof s->reqs[r]);
    s->reqs[r].req_key = req_key;
    return r;
}

/* Request dst starts with the first n blocks of src (a prefix-cache hit): same physical
 * blocks, same content keys, context = n full blocks. */
static void sim_share_prefix(sim *s, int dst, int src, int n)
{
    sim_req *d = &s->reqs[dst];
    for (int i = 0; i < n; i++) {
        d->blocks[i] = s->reqs[src].blocks[i];
        d->keys[i] = s->reqs[src].keys[i];
    }
    d->num_blocks = n;
    d->ctx = n * s->cfg.block_size;
}

static void ensure_blocks(sim *s, int r, int tokens)
{
    sim_req *q = &s->reqs[r];
    int need = (tokens + s->cfg.block_size - 1) / s->cfg.block_size;
    assert_true(need <= MAX_BLOCKS);
    while (q->num_blocks < need) {
        assert_true(s->num_free > 0);
        int i = q->num_blocks++;
        q->blocks[i] = s->free_blocks[--s->num_free];
        q->keys[i] = ar_chain_key(i ? q->keys[i - 1] : AR_ROOT_KEY, q->req_key ^ (uint64_t)i);
    }
}

/* What the cache holds for a generated K/V element: dtype rounding, then the KV dtype's
 * quantisation of value / kv_scale, times kv_scale on load. */
static double kv_value(const ar_run_config *c, uint64_t row, int d)
{
    float v = ar_gen(row, (uint32_t)d, c->data, c->dtype);
    float scale = c->kv_dtype == AR_FP8_E4M3 ? (float)c->kv_scale : 1.0f;
    if (scale != 1.0f) return (double)(ar_round_to(c->kv_dtype, v / scale) * scale);
    return (double)ar_round_to(c->kv_dtype, v);
}

/* Reference of request r's rows (n tokens from context ctx) for one layer, from logical
 * positions; compares against the backend's out/lse at tokens [t0, t0+n). */
static void compare_request(sim *s, int r, int layer, int ctx, int n, int t0, int T,
                            const float *out, const float *lse, errors *e)
{
    const ar_run_config *c = &s->cfg;
    const int Hq = c->model.num_q_heads, Hkv = c->model.num_kv_heads, D = c->model.head_size;
    const int B = c->block_size, seq = ctx + n;
    sim_req *q = &s->reqs[r];
    double *qb = malloc(sizeof(double) * (size_t)n * Hq * D);
    int *qpos = malloc(sizeof(int) * (size_t)n);
    double *kb = malloc(sizeof(double) * (size_t)seq * Hkv * D);
    double *vb = malloc(sizeof(double) * (size_t)seq * Hkv * D);
    double *ob = malloc(sizeof(double) * (size_t)n * Hq * D);
    double *lb = malloc(sizeof(double) * (size_t)n * Hq);
    assert_non_null(qb); assert_non_null(qpos); assert_non_null(kb);
    assert_non_null(vb); assert_non_null(ob); assert_non_null(lb);
    for (int i = 0; i < n; i++) {
        qpos[i] = ctx + i;
        for (int h = 0; h < Hq; h++) {
            uint64_t row = ar_gen_row(c->seed, AR_STREAM_Q, (uint32_t)layer, q->req_key,
                                      (uint64_t)(ctx + i), (uint32_t)h);
            for (int d = 0; d < D; d++)
                qb[((size_t)i * Hq + h) * D + d] = ar_gen(row, (uint32_t)d, c->data, c->dtype);
        }
    }
    for (int j = 0; j < seq; j++) {
        uint64_t key = q->keys[j / B];
        for (int h = 0; h < Hkv; h++) {
            uint64_t rk = ar_gen_row(c->seed, AR_STREAM_K, (uint32_t)layer, key,
                                     (uint64_t)(j % B), (uint32_t)h);
            uint64_t rv = ar_gen_row(c->seed, AR_STREAM_V, (uint32_t)layer, key,
                                     (uint64_t)(j % B), (uint32_t)h);
            for (int d = 0; d < D; d++) {
                kb[((size_t)j * Hkv + h) * D + d] = kv_value(c, rk, d);
                vb[((size_t)j * Hkv + h) * D + d] = kv_value(c, rv, d);
            }
        }
    }
    ar_attn_params p = {Hq, Hkv, D, D, c->model.scale, c->model.sliding_window,
                        c->model.logits_soft_cap, true};
    ar_ref_attend(&p, n, qb, qpos, seq, 0, kb, vb, ob, lb);
    for (int i = 0; i < n; i++) {
        for (int h = 0; h < Hq; h++) {
            for (int d = 0; d < D; d++) {
                double got = out[((size_t)(t0 + i) * Hq + h) * D + d];
                double want = ob[((size_t)i * Hq + h) * D + d];
                if (!isfinite(got)) { e->nan_count++; continue; }
                /* absolute on unit-scale values, relative above (outlier data) */
                double diff = fabs(got - want) / fmax(1.0, fabs(want));
                if (diff > e->out) e->out = diff;
            }
            double gl = lse[(size_t)h * T + t0 + i], wl = lb[(size_t)h * n + i];
            if (isnan(gl)) e->nan_count++;
            else if (isinf(wl) || isinf(gl)) {
                if (gl != wl) e->lse_inf_mismatch++;
            } else if (fabs(gl - wl) > e->lse) e->lse = fabs(gl - wl);
        }
    }
    free(qb); free(qpos); free(kb); free(vb); free(ob); free(lb);
}

/* One step: qlens[r] new tokens for every request with qlens[r] > 0 (others not scheduled),
 * common prefix P; every layer run and compared.  slot_override (token index, -1 = none)
 * sets that token's slot to -1.  Returns the forward's rc (0 ok). */
static int sim_step_ex(sim *s, const int *qlens, int P, int skip_token, bool compare)
{
    const ar_run_config *c = &s->cfg;
    const int B = c->block_size;
    int qsl[MAX_REQS + 1], seq_lens[MAX_REQS], ctx_lens[MAX_REQS], which[MAX_REQS];
    static int block_table[MAX_REQS * MAX_BLOCKS];
    static uint64_t block_keys[MAX_REQS * MAX_BLOCKS];
    uint64_t req_keys[MAX_REQS];
    static int64_t slots[MAX_TOKENS];
    int nr = 0, T = 0, max_q = 0, max_seq = 0;
    qsl[0] = 0;
    memset(block_table, 0, sizeof block_table);
    memset(block_keys, 0, sizeof block_keys);
    for (int r = 0; r < s->num_reqs; r++) {
        if (qlens[r] <= 0) continue;
        sim_req *q = &s->reqs[r];
        ensure_blocks(s, r, q->ctx + qlens[r]);
        which[nr] = r;
        ctx_lens[nr] = q->ctx;
        seq_lens[nr] = q->ctx + qlens[r];
        req_keys[nr] = q->req_key;
        for (int i = 0; i < q->num_blocks; i++) {
            block_table[nr * MAX_BLOCKS + i] = q->blocks[i];
            block_keys[nr * MAX_BLOCKS + i] = q->keys[i];
        }
        for (int i = 0; i < qlens[r]; i++) {
            int pos = q->ctx + i;
            assert_true(T + i < MAX_TOKENS);
            slots[T + i] = (int64_t)q->blocks[pos / B] * B + pos % B;
        }
        T += qlens[r];
        qsl[nr + 1] = T;
        if (qlens[r] > max_q) max_q = qlens[r];
        if (seq_lens[nr] > max_seq) max_seq = seq_lens[nr];
        nr++;
    }
    if (skip_token >= 0 && skip_token < T) slots[skip_token] = -1;
    ar_batch b = {s->step, nr, T, qsl, seq_lens, ctx_lens, max_q, max_seq, MAX_BLOCKS,
                  block_table, block_keys, req_keys, slots, P};
    char err[512] = "";
    int rc = ar_cpu_backend.prepare(s->state, &b, err, sizeof err);
    if (rc != 0) { print_message("prepare: %s\n", err); return rc; }
    const int Hq = c->model.num_q_heads, D = c->model.head_size;
    free(s->last_out);
    free(s->last_lse);
    s->last_out = malloc(sizeof(float) * (size_t)(T ? T : 1) * Hq * D);
    s->last_lse = malloc(sizeof(float) * (size_t)(T ? T : 1) * Hq);
    assert_non_null(s->last_out);
    assert_non_null(s->last_lse);
    s->last_tokens = T;
    for (int layer = 0; layer < c->num_layers; layer++) {
        ar_forward_out o;
        memset(&o, 0, sizeof o);
        o.out = s->last_out;
        o.lse = s->last_lse;
        rc = ar_cpu_backend.forward(s->state, layer, &b, &o, err, sizeof err);
        if (rc != 0) { print_message("forward: %s\n", err); return rc; }
        assert_int_equal(o.num_kernels, P > 0 ? 4 : 2);
        assert_string_equal(o.kernels[0].name, "write");
        assert_true(o.total_us >= 0);
        if (!compare) continue;
        for (int i = 0; i < nr; i++)
            compare_request(s, which[i], layer, ctx_lens[i], qsl[i + 1] - qsl[i], qsl[i], T,
                            s->last_out, s->last_lse, &s->err);
    }
    for (int i = 0; i < nr; i++) s->reqs[which[i]].ctx = seq_lens[i];
    s->step++;
    return 0;
}

static void sim_step(sim *s, const int *qlens, int P)
{
    assert_int_equal(sim_step_ex(s, qlens, P, -1, true), 0);
}

/* The standard three-step scenario: mixed prefill chunks and decodes; contexts come from
 * earlier steps' writes.  Sizes are kept modest (sequences up to ~130 keys). */
static void run_mixed(sim *s)
{
    sim_add_req(s, 0x1111);
    sim_add_req(s, 0x2222);
    sim_add_req(s, 0x3333);
    int step0[] = {45, 30, 0};
    int step1[] = {1, 50, 37};
    int step2[] = {1, 1, 20};
    sim_step(s, step0, 0);
    sim_step(s, step1, 0);
    sim_step(s, step2, 0);
}

static void expect_pass(const sim *s, const char *what)
{
    double tol = out_tol(s->cfg.dtype);
    if (getenv("AR_TEST_VERBOSE"))
        print_message("%s: out err %.3g lse err %.3g\n", what, s->err.out, s->err.lse);
    if (s->cfg.kv_dtype != s->cfg.dtype && s->cfg.kv_dtype != AR_FP32)
        tol = fmax(tol, out_tol(s->cfg.kv_dtype == AR_FP8_E4M3 ? AR_BF16 : s->cfg.kv_dtype));
    if (s->err.out > tol || s->err.lse > LSE_TOL || s->err.nan_count || s->err.lse_inf_mismatch)
        fail_msg("%s: out err %.3g (tol %.3g), lse err %.3g (tol %.3g), %ld NaN, %ld inf mismatch",
                 what, s->err.out, tol, s->err.lse, LSE_TOL, s->err.nan_count,
                 s->err.lse_inf_mismatch);
}

/* ---- tests ---------------------------------------------------------------------------- */

typedef struct grid_case {
    int hq, hkv, d, block;
    ar_dtype dt;
    int window;
    double cap;
} grid_case;

/* Head sizes x GQA ratios x block sizes x dtypes x window/cap: a covering selection rather
 * than the full cross product (every value of every axis appears, larger head sizes with
 * fewer heads), plus one head size that is not a multiple of 8. */
static void test_grid_matches_reference(void **unused)
{
    (void)unused;
    static const grid_case cases[] = {
        {4, 4, 64, 16, AR_FP32, 0, 0},
        {8, 2, 64, 32, AR_BF16, 24, 0},
        {8, 1, 80, 16, AR_FP16, 0, 1.5},
        {4, 1, 80, 64, AR_FP32, 40, 2.0},
        {8, 8, 96, 32, AR_FP16, 0, 0},
        {8, 2, 96, 16, AR_BF16, 0, 30.0},
        {8, 1, 128, 16, AR_BF16, 0, 0},
        {4, 4, 128, 64, AR_FP16, 17, 0},
        {8, 2, 128, 32, AR_FP32, 0, 0},
        {2, 2, 256, 16, AR_FP16, 0, 0},
        {8, 1, 256, 32, AR_BF16, 33, 5.0},
        {4, 1, 256, 64, AR_FP32, 0, 0},
        {4, 2, 36, 16, AR_FP16, 20, 0},      /* not a multiple of 8: scalar tails */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const grid_case *g = &cases[i];
        ar_run_config cfg = make_cfg(g->hq, g->hkv, g->d, g->block, g->dt, g->dt, g->window, g->cap);
        sim s;
        sim_open(&s, &cfg);
        run_mixed(&s);
        char what[160];
        snprintf(what, sizeof what, "Hq %d Hkv %d D %d B %d %s window %d cap %g", g->hq, g->hkv,
                 g->d, g->block, ar_dtype_name(g->dt), g->window, g->cap);
        expect_pass(&s, what);
        sim_close(&s);
    }
}

/* Two layers with different data, outlier distribution. */
static void test_layers_and_outliers(void **unused)
{
    (void)unused;
    ar_run_config cfg = make_cfg(8, 2, 64, 16, AR_FP16, AR_FP16, 0, 0);
    cfg.num_layers = 2;
    cfg.data = AR_DATA_OUTLIER;
    sim s;
    sim_open(&s, &cfg);
    run_mixed(&s);
    expect_pass(&s, "two layers, outlier data");
    sim_close(&s);
}

/* fp8 e4m3 KV cache with kv_scale 0.5 under bf16 and fp16 activations. */
static void test_fp8_kv(void **unused)
{
    (void)unused;
    ar_dtype dts[] = {AR_BF16, AR_FP16};
    for (int i = 0; i < 2; i++) {
        ar_run_config cfg = make_cfg(8, 2, 128, 16, dts[i], AR_FP8_E4M3, 0, 0);
        sim s;
        sim_open(&s, &cfg);
        run_mixed(&s);
        expect_pass(&s, "fp8 KV");
        sim_close(&s);
    }
}

/* One block holds every sequence (block_size 256 > 131 keys). */
static void test_block_larger_than_sequence(void **unused)
{
    (void)unused;
    ar_run_config cfg = make_cfg(4, 2, 64, 256, AR_FP32, AR_FP32, 0, 0);
    sim s;
    sim_open(&s, &cfg);
    run_mixed(&s);
    expect_pass(&s, "block_size 256");
    sim_close(&s);
}

/* Shared prefix of 2 blocks (P = 32): the cascade run must match the reference and the flat
 * run of the same steps.  r1, r2 start with a prefix hit on r0's first blocks. */
static void run_shared_prefix(sim *s, int use_cascade, int window)
{
    (void)window;
    sim_add_req(s, 0xaaaa);
    sim_add_req(s, 0xbbbb);
    sim_add_req(s, 0xcccc);
    int step0[] = {40, 0, 0};
    sim_step(s, step0, 0);
    sim_share_prefix(s, 1, 0, 2);
    sim_share_prefix(s, 2, 0, 2);
    int step1[] = {1, 10, 5};
    sim_step(s, step1, use_cascade ? 32 : 0);
    int step2[] = {1, 1, 3};
    sim_step(s, step2, use_cascade ? 32 : 0);
}

static void test_cascade_equals_flat(void **unused)
{
    (void)unused;
    ar_dtype dts[] = {AR_FP32, AR_BF16};
    for (int i = 0; i < 2; i++) {
        ar_run_config cfg = make_cfg(8, 2, 128, 16, dts[i], dts[i], 0, i ? 4.0 : 0);
        sim flat, casc;
        sim_open(&flat, &cfg);
        sim_open(&casc, &cfg);
        run_shared_prefix(&flat, 0, 0);
        run_shared_prefix(&casc, 1, 0);
        expect_pass(&flat, "flat");
        expect_pass(&casc, "cascade");
        assert_int_equal(flat.last_tokens, casc.last_tokens);
        int n = flat.last_tokens * cfg.model.num_q_heads * cfg.model.head_size;
        double worst = 0;
        for (int k = 0; k < n; k++) worst = fmax(worst, fabs(flat.last_out[k] - casc.last_out[k]));
        assert_true(worst <= 2 * out_tol(dts[i]));
        for (int k = 0; k < flat.last_tokens * cfg.model.num_q_heads; k++)
            assert_true(fabs(flat.last_lse[k] - casc.last_lse[k]) <= LSE_TOL);
        sim_close(&flat);
        sim_close(&casc);
    }
}

/* Context tokens provided through fill() (never written by a forward) are read correctly. */
static void test_fill_context(void **unused)
{
    (void)unused;
    ar_run_config cfg = make_cfg(4, 2, 64, 16, AR_BF16, AR_BF16, 0, 0);
    sim s;
    sim_open(&s, &cfg);
    int r = sim_add_req(&s, 0x7777);
    ensure_blocks(&s, r, 48);
    int64_t slots[48];
    uint64_t keys[48];
    int offsets[48];
    for (int p = 0; p < 48; p++) {
        slots[p] = (int64_t)s.reqs[r].blocks[p / 16] * 16 + p % 16;
        keys[p] = s.reqs[r].keys[p / 16];
        offsets[p] = p % 16;
    }
    ar_fill f = {48, slots, keys, offsets};
    char err[256];
    assert_int_equal(ar_cpu_backend.fill(s.state, 0, &f, err, sizeof err), 0);
    s.reqs[r].ctx = 48;
    int step[] = {3};
    sim_step(&s, step, 0);
    expect_pass(&s, "fill");
    /* A bad slot is refused with a message. */
    int64_t bad = (int64_t)cfg.num_blocks * 16;
    ar_fill fb = {1, &bad, keys, offsets};
    err[0] = 0;
    assert_int_not_equal(ar_cpu_backend.fill(s.state, 0, &fb, err, sizeof err), 0);
    assert_non_null(strstr(err, "slot"));
    sim_close(&s);
}

/* Every kernel fault must push the comparison outside tolerance. */
static void test_faults_are_caught(void **unused)
{
    (void)unused;
    ar_fault faults[] = {AR_FAULT_CAUSAL_OFF_BY_ONE, AR_FAULT_WRONG_KV_HEAD, AR_FAULT_NO_RESCALE,
                         AR_FAULT_LSE_BASE2, AR_FAULT_MERGE_NO_WEIGHTS};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        ar_run_config cfg = make_cfg(8, 2, 64, 16, AR_FP16, AR_FP16, 0, 0);
        cfg.fault = faults[i];
        sim s;
        sim_open(&s, &cfg);
        if (faults[i] == AR_FAULT_MERGE_NO_WEIGHTS) run_shared_prefix(&s, 1, 0);
        else run_mixed(&s);
        if (getenv("AR_TEST_VERBOSE"))
            print_message("fault %d: out err %.3g lse err %.3g\n", (int)faults[i], s.err.out, s.err.lse);
        bool caught = s.err.out > out_tol(cfg.dtype) || s.err.lse > LSE_TOL || s.err.nan_count > 0;
        if (!caught)
            fail_msg("fault %d not caught: out err %.3g lse err %.3g", (int)faults[i], s.err.out,
                     s.err.lse);
        if (faults[i] == AR_FAULT_LSE_BASE2) assert_true(s.err.lse > LSE_TOL);
        else assert_true(s.err.out > out_tol(cfg.dtype));
        sim_close(&s);
    }
}

/* Slots nobody wrote read as NaN (so a wrong read shows), and a correct run has none. */
static void test_unwritten_slots_are_nan(void **unused)
{
    (void)unused;
    ar_run_config cfg = make_cfg(4, 2, 64, 16, AR_FP16, AR_FP16, 0, 0);
    sim s;
    sim_open(&s, &cfg);
    int r = sim_add_req(&s, 0x4242);
    ensure_blocks(&s, r, 20);
    s.reqs[r].ctx = 16;                 /* claims 16 tokens of context that nobody wrote */
    int step[] = {4};
    assert_int_equal(sim_step_ex(&s, step, 0, -1, false), 0);
    int n = s.last_tokens * cfg.model.num_q_heads * cfg.model.head_size;
    for (int k = 0; k < n; k++) assert_true(isnan(s.last_out[k]));
    sim_close(&s);
}

/* A token whose slot is -1 is not written: its key stays NaN, so rows after it turn NaN
 * while rows before it stay correct. */
static void test_slot_minus_one_skipped(void **unused)
{
    (void)unused;
    ar_run_config cfg = make_cfg(4, 2, 64, 16, AR_FP32, AR_FP32, 0, 0);
    sim s;
    sim_open(&s, &cfg);
    sim_add_req(&s, 0x5151);
    int step[] = {20};
    assert_int_equal(sim_step_ex(&s, step, 0, 5, false), 0);
    const int Hq = cfg.model.num_q_heads, D = cfg.model.head_size;
    for (int t = 0; t < 20; t++) {
        int nan_here = 0;
        for (int k = 0; k < Hq * D; k++) nan_here += isnan(s.last_out[(size_t)t * Hq * D + k]);
        if (t < 5) assert_int_equal(nan_here, 0);
        else assert_int_equal(nan_here, Hq * D);
    }
    /* Rows before the skipped token match the reference. */
    errors e = {0, 0, 0, 0};
    compare_request(&s, 0, 0, 0, 5, 0, 20, s.last_out, s.last_lse, &e);
    assert_true(e.out <= out_tol(cfg.dtype));
    assert_true(e.lse <= LSE_TOL);
    assert_int_equal(e.nan_count, 0);
    sim_close(&s);
}

/* The same step with 1 and 3 threads gives bit-identical results. */
static void test_threads_deterministic(void **unused)
{
    (void)unused;
    ar_run_config c1 = make_cfg(8, 2, 64, 16, AR_BF16, AR_BF16, 0, 0);
    ar_run_config c3 = c1;
    c1.threads = 1;
    c3.threads = 3;
    sim a, b;
    sim_open(&a, &c1);
    sim_open(&b, &c3);
    run_mixed(&a);
    run_mixed(&b);
    size_t n = (size_t)a.last_tokens * 8 * 64;
    assert_int_equal(a.last_tokens, b.last_tokens);
    assert_memory_equal(a.last_out, b.last_out, n * sizeof(float));
    assert_memory_equal(a.last_lse, b.last_lse, (size_t)a.last_tokens * 8 * sizeof(float));
    char name[64];
    ar_cpu_backend.device_name(b.state, name, sizeof name);
    assert_string_equal(name, "cpu (3 threads)");
    sim_close(&a);
    sim_close(&b);
}

/* check(): yes for ordinary configs, no with a reason for impossible ones. */
static void test_check_verdicts(void **unused)
{
    (void)unused;
    char why[256];
    ar_run_config c = make_cfg(32, 8, 128, 16, AR_BF16, AR_FP8_E4M3, 0, 0);
    assert_true(ar_cpu_backend.check(&c, why, sizeof why));
    ar_run_config bad = c;
    bad.model.num_kv_heads = 5;
    assert_false(ar_cpu_backend.check(&bad, why, sizeof why));
    assert_non_null(strstr(why, "multiple"));
    bad = c;
    bad.model.head_size = 0;
    assert_false(ar_cpu_backend.check(&bad, why, sizeof why));
    assert_non_null(strstr(why, "head_size"));
    bad = c;
    bad.model.attention = AR_ATTN_MLA;
    assert_false(ar_cpu_backend.check(&bad, why, sizeof why));
    bad = c;
    bad.dtype = AR_FP8_E4M3;
    assert_false(ar_cpu_backend.check(&bad, why, sizeof why));
    bad = c;
    bad.kv_scale = 0;
    assert_false(ar_cpu_backend.check(&bad, why, sizeof why));
    void *st = NULL;
    bad = c;
    bad.model.num_kv_heads = 3;
    assert_int_equal(ar_cpu_backend.open(&bad, &st, why, sizeof why), 2);
    assert_null(st);
    assert_false(ar_cpu_backend.needs_gpu);
    assert_string_equal(ar_cpu_backend.name, "cpu");
}

/* Broken batches are refused by prepare() with a message naming the rule, never a crash. */
static void test_bad_batches_rejected(void **unused)
{
    (void)unused;
    ar_run_config cfg = make_cfg(4, 2, 64, 16, AR_FP32, AR_FP32, 0, 0);
    void *st;
    char err[512];
    assert_int_equal(ar_cpu_backend.open(&cfg, &st, err, sizeof err), 0);
    int qsl[] = {0, 3};
    int seq[] = {3}, ctx[] = {0};
    int bt[4] = {7, 0, 0, 0};
    uint64_t keys[4] = {1, 2, 3, 4}, rk[1] = {9};
    int64_t slots[3] = {112, 113, 114};
    ar_batch b = {0, 1, 3, qsl, seq, ctx, 3, 3, 4, bt, keys, rk, slots, 0};
    assert_int_equal(ar_cpu_backend.prepare(st, &b, err, sizeof err), 0);

    int bt_bad[4] = {500, 0, 0, 0};
    b.block_table = bt_bad;
    err[0] = 0;
    assert_int_not_equal(ar_cpu_backend.prepare(st, &b, err, sizeof err), 0);
    assert_non_null(strstr(err, "block_table"));
    b.block_table = bt;

    int64_t slots_bad[3] = {112, 99999, 114};
    b.slot_mapping = slots_bad;
    err[0] = 0;
    assert_int_not_equal(ar_cpu_backend.prepare(st, &b, err, sizeof err), 0);
    assert_non_null(strstr(err, "slot_mapping"));
    b.slot_mapping = slots;

    int seq_bad[] = {5};
    b.seq_lens = seq_bad;
    err[0] = 0;
    assert_int_not_equal(ar_cpu_backend.prepare(st, &b, err, sizeof err), 0);
    assert_non_null(strstr(err, "seq_len"));
    b.seq_lens = seq;

    b.common_prefix_len = 16;           /* larger than the context 0 */
    err[0] = 0;
    assert_int_not_equal(ar_cpu_backend.prepare(st, &b, err, sizeof err), 0);
    assert_non_null(strstr(err, "common_prefix_len"));
    b.common_prefix_len = 0;

    /* forward without a successful prepare of this step is refused too. */
    ar_forward_out o;
    float out[3 * 4 * 64], lse[3 * 4];
    memset(&o, 0, sizeof o);
    o.out = out;
    o.lse = lse;
    b.step = 77;
    assert_int_not_equal(ar_cpu_backend.forward(st, 0, &b, &o, err, sizeof err), 0);
    ar_cpu_backend.close(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid_matches_reference),
        cmocka_unit_test(test_layers_and_outliers),
        cmocka_unit_test(test_fp8_kv),
        cmocka_unit_test(test_block_larger_than_sequence),
        cmocka_unit_test(test_cascade_equals_flat),
        cmocka_unit_test(test_fill_context),
        cmocka_unit_test(test_faults_are_caught),
        cmocka_unit_test(test_unwritten_slots_are_nan),
        cmocka_unit_test(test_slot_minus_one_skipped),
        cmocka_unit_test(test_threads_deterministic),
        cmocka_unit_test(test_check_verdicts),
        cmocka_unit_test(test_bad_batches_rejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
