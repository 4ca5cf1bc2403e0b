/* gpu_mla_backend.c - GPU tests of the "cuda-mla" backend (kernels/mla/cuda_mla.cu) end to end,
 * through its open / fill / prepare / forward (the kernels alone: gpu_mla.c; the helpers both
 * share: gpu_mla_common.h).
 * 1. The backend end to end (open / fill / prepare / forward) on DeepSeek-V3 dims against the
 *    float64 EXPANDED-form reference (reference/mla_ref.h): decode batches (query lengths 1..4,
 *    block sizes 16 and 64), mixed batches with prefill requests (> 128 new tokens, context
 *    chunked through the workspace), fp8 cache, 128 heads; each setting of AR_MLA_GEMM and
 *    AR_MLA_PREFILL (the Hopper prefill attention, the default on compute capability 9.0, and
 *    AR_MLA_PREFILL=pingpong, refused elsewhere; the mma.sync one, AR_MLA_PREFILL=tc); and every
 *    planted fault flagged on each prefill attention.
 * 2. A trace from the simulator's deepseek-v3 preset replays through bin/attnreplay on cuda-mla
 *    with every verified step passing (skips when this build does not register cuda-mla).
 * AR_GPU_SMALL=1 (compute-sanitizer runs) keeps the small batches and drops the 128-head steps
 * and the trace replay; AR_GPU_ONLY=PATTERN runs only the tests whose names match.
 * Every test skips with the backend's reason when there is no GPU. */
#include "gpu_mla_common.h"

/* ---- the backend end to end vs the expanded-form reference ---------------------------------- */

typedef struct req_case {
    int q_len, ctx;
} req_case;

typedef struct tbatch {
    int R, T, mbpr;
    int *qsl, *seq, *ctx, *bt;
    uint64_t *bkeys, *rkeys;
    int64_t *slots;
    ar_batch b;
} tbatch;

static void tbatch_free(tbatch *t)
{
    free(t->qsl);
    free(t->seq);
    free(t->ctx);
    free(t->bt);
    free(t->bkeys);
    free(t->rkeys);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

/* Random distinct physical blocks (never block 0), random content and request keys. */
static void tbatch_make(tbatch *t, const ar_run_config *cfg, const req_case *rc, int n)
{
    const int B = cfg->block_size;
    memset(t, 0, sizeof *t);
    int max_s = 0, T = 0, total_blocks = 0;
    for (int i = 0; i < n; i++) {
        int s = rc[i].ctx + rc[i].q_len;
        if (s > max_s) max_s = s;
        T += rc[i].q_len;
        total_blocks += (s + B - 1) / B;
    }
    assert_true(total_blocks < cfg->num_blocks);
    t->R = n;
    t->T = T;
    t->mbpr = max_s > 0 ? (max_s + B - 1) / B : 1;
    t->qsl = calloc((size_t)n + 1, sizeof(int));
    t->seq = calloc((size_t)n, sizeof(int));
    t->ctx = calloc((size_t)n, sizeof(int));
    t->bt = calloc((size_t)n * t->mbpr, sizeof(int));
    t->bkeys = calloc((size_t)n * t->mbpr, sizeof(uint64_t));
    t->rkeys = calloc((size_t)n, sizeof(uint64_t));
    t->slots = calloc((size_t)(T > 0 ? T : 1), sizeof(int64_t));
    int *perm = malloc(sizeof(int) * (size_t)cfg->num_blocks);
    assert_true(t->qsl && t->seq && t->ctx && t->bt && t->bkeys && t->rkeys && t->slots && perm);
    for (int i = 0; i < cfg->num_blocks - 1; i++) perm[i] = i + 1;
    for (int i = cfg->num_blocks - 2; i > 0; i--) {
        int j = (int)(rng_next() % (uint64_t)(i + 1));
        int x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
    int next = 0, tok = 0, max_q = 0;
    for (int r = 0; r < n; r++) {
        int s = rc[r].ctx + rc[r].q_len;
        t->seq[r] = s;
        t->ctx[r] = rc[r].ctx;
        t->rkeys[r] = rng_next();
        for (int i = 0; i < (s + B - 1) / B; i++) {
            t->bt[r * t->mbpr + i] = perm[next++];
            t->bkeys[r * t->mbpr + i] = rng_next();
        }
        for (int i = 0; i < rc[r].q_len; i++) {
            int p = rc[r].ctx + i;
            t->slots[tok + i] = (int64_t)t->bt[r * t->mbpr + p / B] * B + p % B;
        }
        tok += rc[r].q_len;
        t->qsl[r + 1] = tok;
        if (rc[r].q_len > max_q) max_q = rc[r].q_len;
    }
    free(perm);
    ar_batch b = {1, n, T, t->qsl, t->seq, t->ctx, max_q, max_s, t->mbpr, t->bt, t->bkeys, t->rkeys, t->slots, 0};
    t->b = b;
}

static void fill_context(void *state, const ar_run_config *cfg, const tbatch *t)
{
    const int B = cfg->block_size;
    int count = 0;
    for (int r = 0; r < t->R; r++) count += t->ctx[r];
    if (count == 0) return;
    int64_t *slots = malloc(sizeof(int64_t) * (size_t)count);
    uint64_t *keys = malloc(sizeof(uint64_t) * (size_t)count);
    int *offs = malloc(sizeof(int) * (size_t)count);
    assert_true(slots && keys && offs);
    int k = 0;
    for (int r = 0; r < t->R; r++)
        for (int p = 0; p < t->ctx[r]; p++) {
            slots[k] = (int64_t)t->bt[r * t->mbpr + p / B] * B + p % B;
            keys[k] = t->bkeys[r * t->mbpr + p / B];
            offs[k] = p % B;
            k++;
        }
    ar_fill f = {count, slots, keys, offs};
    char err[512] = "";
    int rc = ar_cuda_mla_backend.fill(state, 0, &f, err, sizeof err);
    if (rc) print_message("fill: %s\n", err);
    assert_int_equal(rc, 0);
    free(slots);
    free(keys);
    free(offs);
}

typedef struct e2e_result {
    double max_err;         /* max |out - ref| / (atol + rtol |ref|): > 1 fails */
    double max_abs, lse_max_abs;
    long nan_count;
    int guard_violations;
    ar_cuda_mla_plan_info plan;
} e2e_result;

/* The float64 expanded-form reference of one request (inputs regenerated on the host). */
typedef struct ref_job {
    const ar_run_config *cfg;
    const tbatch *t;
    int r;
    const ar_mla_dims *dims;
    const double *w_uk, *w_uv;
    double *out;            /* [q_len, H, V] */
    double *lse;            /* [H, q_len] */
    int rc;
    bool started;
} ref_job;

static void *ref_request(void *arg)
{
    ref_job *jb = arg;
    const ar_run_config *cfg = jb->cfg;
    const tbatch *t = jb->t;
    const int r = jb->r, H = jb->dims->num_heads, P = 128, R = 64, V = 128, L = 512;
    int ql = t->qsl[r + 1] - t->qsl[r], sl = t->seq[r];
    jb->rc = -1;
    double *qn = malloc(sizeof(double) * ((size_t)ql * H * P + 1));
    double *qp = malloc(sizeof(double) * ((size_t)ql * H * R + 1));
    double *lat = malloc(sizeof(double) * ((size_t)sl * (L + R) + 1));
    int *qpos = malloc(sizeof(int) * ((size_t)ql + 1));
    jb->out = malloc(sizeof(double) * ((size_t)ql * H * V + 1));
    jb->lse = malloc(sizeof(double) * ((size_t)H * ql + 1));
    if (qn && qp && lat && qpos && jb->out && jb->lse) {
        for (int i = 0; i < ql; i++) {
            int pos = t->ctx[r] + i;
            qpos[i] = pos;
            for (int h = 0; h < H; h++) {
                uint64_t rn = ar_gen_row(cfg->seed, AR_STREAM_Q_NOPE, 0, t->rkeys[r], (uint64_t)pos, (uint32_t)h);
                uint64_t rp = ar_gen_row(cfg->seed, AR_STREAM_Q_PE, 0, t->rkeys[r], (uint64_t)pos, (uint32_t)h);
                for (int d = 0; d < P; d++) qn[((size_t)i * H + h) * P + d] = ar_gen(rn, (uint32_t)d, cfg->data, cfg->dtype);
                for (int d = 0; d < R; d++) qp[((size_t)i * H + h) * R + d] = ar_gen(rp, (uint32_t)d, cfg->data, cfg->dtype);
            }
        }
        for (int j = 0; j < sl; j++) {
            uint64_t key = t->bkeys[r * t->mbpr + j / cfg->block_size];
            uint64_t row = ar_gen_row(cfg->seed, AR_STREAM_LATENT, 0, key, (uint64_t)(j % cfg->block_size), 0);
            for (int d = 0; d < L + R; d++)
                lat[(size_t)j * (L + R) + d] = ar_kv_roundtrip(cfg->kv_dtype, cfg->dtype, (float)cfg->kv_scale,
                                                               ar_gen(row, (uint32_t)d, cfg->data, cfg->dtype));
        }
        jb->rc = ql == 0 ? 0 : ar_mla_ref_attend(jb->dims, ql, qn, qp, qpos, sl, lat, jb->w_uk, jb->w_uv, jb->out, jb->lse);
    }
    free(qn);
    free(qp);
    free(lat);
    free(qpos);
    return NULL;
}

/* Kernel the end-to-end runs ask for (the default unless a test says otherwise). */
static ar_cuda_mla_kernel e2e_kernel = AR_MLA_KERNEL_AUTO;

/* Opens the backend, fills context, runs one step, compares with ar_mla_ref_attend. */
static void run_e2e(const ar_run_config *cfg, const req_case *rc, int n, int splits, int use_prefill,
                    e2e_result *res)
{
    memset(res, 0, sizeof *res);
    void *state = NULL;
    char err[512] = "";
    int rc_open = ar_cuda_mla_backend.open(cfg, &state, err, sizeof err);
    if (rc_open) print_message("open: %s\n", err);
    assert_int_equal(rc_open, 0);
    ar_cuda_mla_set_plan(state, e2e_kernel, splits, use_prefill);
    ar_cuda_mla_set_workspace(state, 256);   /* several context chunks from short contexts */
    tbatch t;
    tbatch_make(&t, cfg, rc, n);
    fill_context(state, cfg, &t);
    int rc_prep = ar_cuda_mla_backend.prepare(state, &t.b, err, sizeof err);
    if (rc_prep) print_message("prepare: %s\n", err);
    assert_int_equal(rc_prep, 0);
    const int H = cfg->model.num_q_heads, P = 128, V = 128, L = 512;
    ar_forward_out o;
    memset(&o, 0, sizeof o);
    o.out = malloc(sizeof(float) * (size_t)t.T * H * V);
    o.lse = malloc(sizeof(float) * (size_t)H * t.T);
    assert_true(o.out && o.lse);
    int rc_fwd = ar_cuda_mla_backend.forward(state, 0, &t.b, &o, err, sizeof err);
    if (rc_fwd) print_message("forward: %s\n", err);
    assert_int_equal(rc_fwd, 0);
    ar_cuda_mla_plan_of(state, &res->plan);
    res->guard_violations = o.guard_violations;
    ar_mla_dims dims = ar_mla_deepseek_dims(H);
    dims.scale = cfg->model.scale;
    double *w_uk = malloc(sizeof(double) * (size_t)L * H * P);
    double *w_uv = malloc(sizeof(double) * (size_t)L * H * V);
    assert_true(w_uk && w_uv);
    ar_mla_gen_weights(&dims, cfg->seed, 0, cfg->data, cfg->dtype, w_uk, w_uv);
    const double atol = cfg->dtype == AR_BF16 ? 2e-2 : 5e-3, rtol = cfg->dtype == AR_BF16 ? 2e-2 : 5e-3;
    for (int i = 0; i < t.T * H * V; i++)
        if (!isfinite(o.out[i])) res->nan_count++;
    for (int i = 0; i < t.T * H; i++)
        if (isnan(o.lse[i]) || o.lse[i] == INFINITY) res->nan_count++;
    /* one thread per request computes its float64 reference (the expansion is the slow part) */
    ref_job *jobs = calloc((size_t)t.R, sizeof *jobs);
    pthread_t *tids = calloc((size_t)t.R, sizeof *tids);
    assert_true(jobs && tids);
    for (int r = 0; r < t.R; r++) {
        ref_job *jb = &jobs[r];
        jb->cfg = cfg;
        jb->t = &t;
        jb->r = r;
        jb->dims = &dims;
        jb->w_uk = w_uk;
        jb->w_uv = w_uv;
        jb->started = pthread_create(&tids[r], NULL, ref_request, jb) == 0;
        if (!jb->started) ref_request(jb);
    }
    for (int r = 0; r < t.R; r++)
        if (jobs[r].started) pthread_join(tids[r], NULL);
    for (int r = 0; r < t.R; r++) {
        const ref_job *jb = &jobs[r];
        int ql = t.qsl[r + 1] - t.qsl[r], q0 = t.qsl[r];
        assert_int_equal(jb->rc, 0);
        for (int i = 0; i < ql; i++)
            for (int h = 0; h < H; h++) {
                for (int v = 0; v < V; v++) {
                    double ref = jb->out[((size_t)i * H + h) * V + v];
                    double got = o.out[((size_t)(q0 + i) * H + h) * V + v];
                    double e = fabs(got - ref);
                    if (!(e <= res->max_abs)) res->max_abs = isnan(e) ? INFINITY : e;
                    double ratio = e / (atol + rtol * fabs(ref));
                    if (!(ratio <= res->max_err)) res->max_err = isnan(ratio) ? INFINITY : ratio;
                }
                double lr = jb->lse[(size_t)h * ql + i], lg = o.lse[(size_t)h * t.T + q0 + i];
                double e = (isinf(lr) && isinf(lg) && lr < 0 && lg < 0) ? 0.0 : fabs(lg - lr);
                if (!(e <= res->lse_max_abs)) res->lse_max_abs = isnan(e) ? INFINITY : e;
            }
        free(jb->out);
        free(jb->lse);
    }
    free(jobs);
    free(tids);
    free(w_uk);
    free(w_uv);
    free(o.out);
    free(o.lse);
    tbatch_free(&t);
    ar_cuda_mla_backend.close(state);
}

static bool e2e_pass(const e2e_result *r)
{
    return r->max_err <= 1.0 && r->lse_max_abs <= 2e-2 && r->nan_count == 0 && r->guard_violations == 0;
}

static void report(const char *what, const e2e_result *r)
{
    print_message("%-34s max abs %.3g (%.2f of tol), lse %.3g, nan %ld, guards %d, decode %d prefill %d "
                  "work %d groups %d chunks %d\n", what, r->max_abs, r->max_err, r->lse_max_abs, r->nan_count,
                  r->guard_violations, r->plan.num_decode_reqs, r->plan.num_prefill_reqs, r->plan.num_work,
                  r->plan.num_groups, r->plan.num_context_chunks);
}

static const req_case decode_batch[] = {{1, 0}, {1, 37}, {2, 300}, {4, 129}, {1, 600}, {3, 64}};
/* two prefills with context (workspace 256 tokens: chunks of 128, so 5 context chunks), one
 * without, plus decodes */
static const req_case mixed_batch[] = {{1, 50}, {140, 600}, {4, 77}, {150, 333}, {200, 0}};
/* prefills without context beside a decode: the prefill path in one pass (no merge) */
static const req_case fresh_batch[] = {{200, 0}, {1, 30}, {129, 0}};
/* a long prefill without context (700 new tokens: 11 key tiles, so the pingpong kernel's ring of
 * four stages turns over twice and a pair's warpgroups see different key counts), a decode, and
 * a prefill with context */
static const req_case long_batch[] = {{700, 0}, {1, 30}, {300, 520}};

static void test_backend_decode(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    int bss[] = {16, 64};
    for (int i = 0; i < 2; i++) {
        ar_run_config cfg = mla_cfg(16, bss[i], 4096 / bss[i] * 16, AR_BF16, AR_BF16, 1.0);
        e2e_result r;
        run_e2e(&cfg, decode_batch, 6, 0, 1, &r);
        report(bss[i] == 16 ? "decode bf16 block 16" : "decode bf16 block 64", &r);
        assert_true(e2e_pass(&r));
        assert_int_equal(r.plan.num_prefill_reqs, 0);
        run_e2e(&cfg, decode_batch, 6, 5, 1, &r);
        report("decode bf16 forced 5 splits", &r);
        assert_true(e2e_pass(&r));
        assert_true(r.plan.num_groups > 0);
    }
    ar_run_config cfg = mla_cfg(16, 64, 1024, AR_FP16, AR_FP16, 1.0);
    e2e_result r;
    run_e2e(&cfg, decode_batch, 6, 0, 1, &r);
    report("decode fp16", &r);
    assert_true(e2e_pass(&r));
    /* every request with q_len 1 at 16 heads: the narrow kernel through the backend, with
     * split pieces merged by the combine kernel (the grid runs it unsplit) */
    static const req_case single[] = {{1, 0}, {1, 37}, {1, 300}, {1, 129}, {1, 250}};
    cfg = mla_cfg(16, 64, 1024, AR_BF16, AR_BF16, 1.0);
    run_e2e(&cfg, single, 5, 4, 1, &r);
    report("decode bf16 q_len 1, 4 splits", &r);
    assert_true(e2e_pass(&r));
    assert_true(r.plan.num_groups > 0);
    cfg = mla_cfg(16, 64, 1024, AR_BF16, AR_FP8_E4M3, 0.5);
    run_e2e(&cfg, decode_batch, 6, 0, 1, &r);
    report("decode bf16, fp8 cache", &r);
    assert_true(e2e_pass(&r));
    if (small_mode()) return;   /* compute-sanitizer runs: the 128-head steps are the slow part */
    const req_case big[] = {{1, 100}, {3, 40}, {2, 0}};
    cfg = mla_cfg(128, 64, 256, AR_BF16, AR_BF16, 1.0);
    run_e2e(&cfg, big, 3, 0, 1, &r);
    report("decode bf16, 128 heads", &r);
    assert_true(e2e_pass(&r));
    /* the other kernels through the backend (AUTO above: the wgmma kernel on an sm_90 device) */
    e2e_kernel = AR_MLA_KERNEL_TC_SPLIT_QK;
    run_e2e(&cfg, big, 3, 0, 1, &r);
    report("decode bf16, 128 heads, split-QK", &r);
    assert_true(e2e_pass(&r));
    e2e_kernel = AR_MLA_KERNEL_TC_WGMMA;   /* split-QK where the wgmma kernel cannot run */
    run_e2e(&cfg, big, 3, 3, 1, &r);
    report("decode bf16, 128 heads, tc-wgmma, 3 splits", &r);
    assert_true(e2e_pass(&r));
    e2e_kernel = AR_MLA_KERNEL_SIMT;
    e2e_result r2;
    run_e2e(&cfg, big, 3, 0, 1, &r2);
    report("decode bf16, 128 heads, SIMT", &r2);
    e2e_kernel = AR_MLA_KERNEL_AUTO;
    assert_true(e2e_pass(&r));
    assert_true(e2e_pass(&r2));
}

static void test_backend_prefill_mixed(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    ar_run_config cfg = mla_cfg(16, 16, 1024, AR_BF16, AR_BF16, 1.0);
    e2e_result r;
    run_e2e(&cfg, mixed_batch, 5, 0, 1, &r);
    report("mixed bf16, prefill path", &r);
    assert_true(e2e_pass(&r));
    assert_int_equal(r.plan.num_prefill_reqs, 3);
    assert_int_equal(r.plan.num_decode_reqs, 2);
    assert_true(r.plan.num_context_chunks >= 4);
    /* the same step with every request on the absorbed path agrees too */
    run_e2e(&cfg, mixed_batch, 5, 0, 0, &r);
    report("mixed bf16, all absorbed", &r);
    assert_true(e2e_pass(&r));
    cfg = mla_cfg(16, 64, 256, AR_BF16, AR_FP8_E4M3, 0.5);
    run_e2e(&cfg, mixed_batch, 5, 0, 1, &r);
    report("mixed bf16, fp8 cache", &r);
    assert_true(e2e_pass(&r));
}

/* 1 when cuBLAS loads on this machine (the default GEMM setting then runs through it). */
static int cublas_loads(void)
{
    char path[512], why[2600];
    return ar_cuda_cublas_probe(path, sizeof path, why, sizeof why) == 0;
}

/* One switch setting of cuda-mla's GEMMs and prefill attention against the float64 reference:
 * decode batches in bf16 and fp16, the mixed batch (prefills over several context chunks:
 * tiles of 64 tokens, a partial last tile, partial key tiles) in bf16, fp16 and over an fp8
 * cache, prefills without context (one pass, no merge) in bf16, and a batch with a 700-token
 * prefill (more key tiles than the pingpong kernel's ring holds) in bf16.  gemm: AR_MLA_GEMM,
 * prefill: AR_MLA_PREFILL (NULL: unset, the defaults: pingpong where the device runs it, else tc;
 * "pingpong" only where the device runs it);
 * each run's plan must say the kernels asked for ran. */
static void check_switches(const char *gemm, const char *prefill)
{
    if (gemm) setenv("AR_MLA_GEMM", gemm, 1);
    else unsetenv("AR_MLA_GEMM");
    if (prefill) setenv("AR_MLA_PREFILL", prefill, 1);
    else unsetenv("AR_MLA_PREFILL");
    const int want_tc = !(gemm && strcmp(gemm, "simt") == 0);
    const int want_cublas = gemm ? strcmp(gemm, "cublas") == 0 : cublas_loads();
    static int hopper_runs = -1;   /* the default prefill attention: pingpong where the device runs the wgmma kernels */
    if (!prefill && hopper_runs < 0) {
        char why[512];
        hopper_runs = wgmma_available(why, sizeof why);
    }
    const int want_pf = !prefill                          ? (hopper_runs ? AR_MLA_PF_ATTN_PINGPONG : AR_MLA_PF_ATTN_TC)
                        : strcmp(prefill, "pingpong") == 0 ? AR_MLA_PF_ATTN_PINGPONG
                        : strcmp(prefill, "tc") == 0       ? AR_MLA_PF_ATTN_TC
                                                           : AR_MLA_PF_ATTN_SIMT;
    static const struct {
        int block_size, num_blocks;
        ar_dtype dt, kv;
        double kv_scale;
        int mixed;          /* 0 decode_batch, 1 mixed_batch, 2 fresh_batch, 3 long_batch */
    } cases[] = {{16, 1024, AR_BF16, AR_BF16, 1.0, 0}, {16, 1024, AR_BF16, AR_BF16, 1.0, 1},
                 {16, 1024, AR_FP16, AR_FP16, 1.0, 0}, {16, 1024, AR_FP16, AR_FP16, 1.0, 1},
                 {64, 256, AR_BF16, AR_FP8_E4M3, 0.5, 1}, {16, 1024, AR_BF16, AR_BF16, 1.0, 2},
                 {16, 1024, AR_BF16, AR_BF16, 1.0, 3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (small_mode() && i != 1) continue;   /* compute-sanitizer runs: the mixed bf16 batch */
        ar_run_config cfg = mla_cfg(16, cases[i].block_size, cases[i].num_blocks, cases[i].dt, cases[i].kv,
                                    cases[i].kv_scale);
        e2e_result r;
        if (cases[i].mixed == 3)
            run_e2e(&cfg, long_batch, 3, 0, 1, &r);
        else if (cases[i].mixed == 2)
            run_e2e(&cfg, fresh_batch, 3, 0, 1, &r);
        else if (cases[i].mixed)
            run_e2e(&cfg, mixed_batch, 5, 0, 1, &r);
        else
            run_e2e(&cfg, decode_batch, 6, 0, 1, &r);
        char what[160];
        snprintf(what, sizeof what, "gemm %s, prefill %s: %s %s%s", gemm ? gemm : "default",
                 prefill ? prefill : "default",
                 cases[i].mixed == 3   ? "a 700-token prefill"
                 : cases[i].mixed == 2 ? "prefills without context"
                 : cases[i].mixed      ? "mixed"
                                       : "decode",
                 cases[i].dt == AR_BF16 ? "bf16" : "fp16",
                 cases[i].kv == AR_FP8_E4M3 ? ", fp8 cache" : "");
        report(what, &r);
        assert_true(e2e_pass(&r));
        assert_int_equal(r.plan.gemm_tc, want_tc);
        assert_int_equal(r.plan.gemm_cublas, want_cublas);
        if (cases[i].mixed) {
            assert_int_equal(r.plan.num_prefill_reqs, cases[i].mixed == 1 ? 3 : 2);
            if (cases[i].mixed == 2)
                assert_int_equal(r.plan.num_context_chunks, 0);
            else
                assert_true(r.plan.num_context_chunks >= (cases[i].mixed == 3 ? 1 : 4));
            assert_int_equal(r.plan.prefill_attn, want_pf);
            /* mixed_batch: decodes at 0 and 2, prefills between; fresh_batch and long_batch: one decode */
            assert_int_equal(r.plan.decode_row_runs, cases[i].mixed == 1 ? 2 : 1);
            assert_int_equal(r.plan.decode_rows_span, 0);
        }
    }
    unsetenv("AR_MLA_GEMM");
    unsetenv("AR_MLA_PREFILL");
}

/* The defaults: the 16-bit projection GEMMs through cuBLAS where it loads (else the
 * tensor-core kernel), the prefill attention on the Hopper pingpong kernel where the device
 * runs it (else the mma.sync one). */
static void test_default_switches(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    check_switches(NULL, NULL);
}

/* AR_MLA_PREFILL=tc: the prefill attention on the mma.sync tensor-core kernel (the default
 * off compute capability 9.0), with the default GEMMs and the tensor-core GEMM kernel. */
static void test_tc_prefill_switch(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    check_switches(NULL, "tc");
    check_switches("tc", "tc");
}

/* The projections' GEMMs on the tensor-core kernel (AR_MLA_GEMM=tc) and on the SIMT one
 * (AR_MLA_GEMM=simt): the absorption, W_UV and the prefill path's up-projections; with the
 * SIMT prefill attention (AR_MLA_PREFILL=simt) as well as the tensor-core one. */
static void test_gemm_switches(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    check_switches("tc", NULL);
    check_switches("tc", "simt");
    check_switches("simt", NULL);
    check_switches("simt", "simt");
}

/* AR_MLA_PREFILL=pingpong: the prefill attention on the Hopper wgmma kernel (two query tiles a
 * CTA sharing each key tile, a TMA producer, ping-pong turns) against the float64 reference in
 * check_switches' batches (bf16, fp16 and an fp8 cache; prefills of 129 to 700 tokens: tiles of
 * 64 and a partial last one, over several context chunks and without context, partial key
 * tiles, more key tiles than the ring holds), with the projections on the default GEMMs and on
 * the tensor-core kernel.  Off compute capability 9.0 the switch is refused at open (exit 2), as
 * it is for a model whose QK / V dims are not 192 / 128 (any device). */
static void test_pingpong_prefill_switch(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    char why[512] = "";
    const bool hopper = wgmma_available(why, sizeof why);
    for (int shape = 0; shape < 2; shape++) {
        if (shape == 0 && hopper) continue;
        ar_run_config cfg = mla_cfg(16, 16, 64, AR_BF16, AR_BF16, 1.0);
        if (shape == 1) cfg.model.qk_nope_head_dim = 64;
        setenv("AR_MLA_PREFILL", "pingpong", 1);
        void *state = NULL;
        char err[512] = "";
        int rc = ar_cuda_mla_backend.open(&cfg, &state, err, sizeof err);
        unsetenv("AR_MLA_PREFILL");
        print_message("AR_MLA_PREFILL=pingpong, %s: open %d: %s\n", shape ? "QK 128" : why, rc, err);
        if (rc == 0) ar_cuda_mla_backend.close(state);
        assert_int_equal(rc, 2);
        assert_non_null(strstr(err, "AR_MLA_PREFILL=pingpong"));
    }
    if (!hopper) {
        print_message("skipping the pingpong runs: %s\n", why);
        skip();
        return;
    }
    check_switches(NULL, "pingpong");
    check_switches("tc", "pingpong");
}

/* AR_MLA_GEMM=cublas named: cuBLAS runs, where it loads. */
static void test_cublas_gemm(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    char path[512], why[2600];
    if (ar_cuda_cublas_probe(path, sizeof path, why, sizeof why) != 0) {
        print_message("skipping: %s\n", why);
        skip();
        return;
    }
    check_switches("cublas", NULL);
    check_switches("cublas", "simt");
}

/* A value of one of the backend's switches it does not take (AR_MLA_GEMM, AR_MLA_PREFILL, and
 * mla_knobs.c's AR_MLA_KERNEL, AR_MLA_TMA, AR_MLA_SPLITS) is refused at open (exit 2, the message
 * naming the variable and what it takes), not read as the default. */
static void test_unknown_switch_refused(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    static const char *const cases[][2] = {
        {"AR_MLA_GEMM", "cuBLAS"}, {"AR_MLA_PREFILL", "cuBLAS"}, {"AR_MLA_KERNEL", "tc-wgmma16"},
        {"AR_MLA_TMA", "off"},     {"AR_MLA_SPLITS", "0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv(cases[i][0], cases[i][1], 1);
        ar_run_config cfg = mla_cfg(16, 16, 64, AR_BF16, AR_BF16, 1.0);
        void *state = NULL;
        char err[512] = "";
        int rc = ar_cuda_mla_backend.open(&cfg, &state, err, sizeof err);
        unsetenv(cases[i][0]);
        print_message("%s=%s: open %d: %s\n", cases[i][0], cases[i][1], rc, err);
        if (rc == 0) ar_cuda_mla_backend.close(state);
        assert_int_equal(rc, 2);
        assert_non_null(strstr(err, cases[i][0]));
        assert_non_null(strstr(err, ": not "));
    }
}

/* Decode requests between prefills: the absorption and W_UV run on each run of decode tokens
 * (9 runs), or past 16 runs on one span holding prefill tokens too (18 runs); both verified. */
static void test_interleaved_decode_rows(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    req_case batch[36];
    for (int runs = small_mode() ? 18 : 9; runs <= 18; runs += 9) {   /* sanitizer runs: the span */
        for (int i = 0; i < runs; i++) {
            batch[2 * i] = (req_case){1 + i % 3, 20 + 7 * i};
            batch[2 * i + 1] = (req_case){129, 3 * i};
        }
        ar_run_config cfg = mla_cfg(16, 16, 1024, AR_BF16, AR_BF16, 1.0);
        e2e_result r;
        run_e2e(&cfg, batch, 2 * runs, 0, 1, &r);
        char what[96];
        snprintf(what, sizeof what, "%d decode runs between prefills", runs);
        report(what, &r);
        assert_true(e2e_pass(&r));
        assert_int_equal(r.plan.num_decode_reqs, runs);
        assert_int_equal(r.plan.decode_row_runs, runs <= 16 ? runs : 1);
        assert_int_equal(r.plan.decode_rows_span, runs > 16);
    }
}

/* Every kernel-side fault must break the comparison (metadata faults are the engine's), on the
 * decode path, the prefill path and the prefill path's tensor-core attention (mma.sync, and
 * the Hopper pingpong kernel where the device runs it); the pingpong kernel also on a step of
 * one pass (prefills without context), where it writes the step's out and LSE itself (no merge
 * there, so the merge fault is left out of that path). */
static void test_faults_flagged(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    static const ar_fault faults[] = {AR_FAULT_CAUSAL_OFF_BY_ONE, AR_FAULT_WRONG_KV_HEAD, AR_FAULT_NO_RESCALE,
                                      AR_FAULT_LSE_BASE2, AR_FAULT_MERGE_NO_WEIGHTS, AR_FAULT_MLA_NO_WUV};
    const req_case dec[] = {{4, 40}, {2, 300}, {1, 90}};
    const req_case pf[] = {{150, 40}, {1, 20}};
    const req_case pf_one_pass[] = {{150, 0}, {1, 20}};
    char why[512] = "";
    const int paths = wgmma_available(why, sizeof why) ? 5 : 3;
    if (paths == 3) print_message("the pingpong prefill left out: %s\n", why);
    static const int attn_of_path[5] = {AR_MLA_PF_ATTN_NONE, AR_MLA_PF_ATTN_SIMT, AR_MLA_PF_ATTN_TC,
                                        AR_MLA_PF_ATTN_PINGPONG, AR_MLA_PF_ATTN_PINGPONG};
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        for (int path = 0; path < paths; path++) {
            if (path == 4 && faults[i] == AR_FAULT_MERGE_NO_WEIGHTS) continue;
            ar_run_config cfg = mla_cfg(16, 16, 512, AR_BF16, AR_BF16, 1.0);
            cfg.fault = faults[i];
            e2e_result r;
            if (path == 1) setenv("AR_MLA_PREFILL", "simt", 1);
            if (path == 2) setenv("AR_MLA_PREFILL", "tc", 1);
            if (path >= 3) setenv("AR_MLA_PREFILL", "pingpong", 1);
            if (path == 0)
                run_e2e(&cfg, dec, 3, faults[i] == AR_FAULT_MERGE_NO_WEIGHTS ? 4 : 0, 1, &r);
            else
                run_e2e(&cfg, path == 4 ? pf_one_pass : pf, 2, 0, 1, &r);
            unsetenv("AR_MLA_PREFILL");
            char what[96];
            snprintf(what, sizeof what, "fault %s (%s)", ar_fault_name(faults[i]),
                     path == 0   ? "decode"
                     : path == 1 ? "prefill"
                     : path == 2 ? "tc prefill"
                     : path == 3 ? "pingpong prefill"
                                 : "pingpong prefill, one pass");
            report(what, &r);
            assert_int_equal(r.plan.prefill_attn, attn_of_path[path]);
            assert_false(e2e_pass(&r));
        }
    }
}

/* Item 8: a trace from the simulator's deepseek-v3 preset replays on cuda-mla with every
 * verified step passing, and a planted fault makes the replay fail. */
static void test_simulated_deepseek_trace_replays(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    if (small_mode()) {
        /* compute-sanitizer runs: the replay child runs the kernels the backend tests above ran,
         * and its time (128-head host verification, the sanitized child) is not bounded by them */
        print_message("skipping under AR_GPU_SMALL: same kernels as test_backend_*\n");
        skip();
        return;
    }
    char trace[512], db[512], db2[512], log[512];
    tu_tmp("ds.trace.jsonl.gz", trace, sizeof trace);
    tu_tmp("ds.db", db, sizeof db);
    tu_tmp("ds-fault.db", db2, sizeof db2);
    tu_tmp("ds.log", log, sizeof log);
    /* small: the host verifier expands 128 heads x every key per verified request (the first
     * H200 run spent 72 s here with n=4, input=200, output=8); input > 128 keeps a prefill step */
    int rc = tu_run(log, "%s sim --workload synthetic:n=2,input=150,output=4,rate=100 --model deepseek-v3 "
                    "--num-blocks 2048 --out %s --quiet", tu_bin(), trace);
    if (rc != 0) {
        char *text = tu_slurp(log);
        print_message("skipping: attnreplay sim failed (%d): %s\n", rc, text ? text : "");
        free(text);
        skip();
        return;
    }
    /* bounded: the verifier of 128-head steps runs on the host */
    rc = tu_run(log, "timeout 300 %s replay %s --db %s --backend cuda-mla --layers 1 --verify sample:8 --quiet",
                tu_bin(), trace, db);
    char *text = tu_slurp(log);
    if (rc == 2 && text && strstr(text, "unknown backend")) {
        print_message("skipping: this build does not register cuda-mla: %s\n", text);
        free(text);
        skip();
        return;
    }
    if (rc != 0) print_message("replay exit %d: %s\n", rc, text ? text : "");
    free(text);
    assert_int_equal(rc, 0);
    rc = tu_run(log, "timeout 300 %s replay %s --db %s --backend cuda-mla --layers 1 --steps 0:0 --inject mla-no-wuv "
                "--verify sample:8 --quiet", tu_bin(), trace, db2);
    assert_int_equal(rc, 1);
}

static void test_check_reasons(void **st)
{
    (void)st;
    char why[256];
    ar_run_config cfg = mla_cfg(16, 64, 64, AR_BF16, AR_BF16, 1.0);
    cfg.model.attention = AR_ATTN_MHA;
    assert_false(ar_cuda_mla_backend.check(&cfg, why, sizeof why));
    if (strstr(why, "without CUDA")) {   /* the stub backend of a build without nvcc refuses everything */
        print_message("skipping: %s\n", why);
        skip();
        return;
    }
    assert_non_null(strstr(why, "MLA"));
    cfg = mla_cfg(16, 64, 64, AR_FP32, AR_FP32, 1.0);
    assert_false(ar_cuda_mla_backend.check(&cfg, why, sizeof why));
    cfg = mla_cfg(16, 48, 64, AR_BF16, AR_BF16, 1.0);
    assert_false(ar_cuda_mla_backend.check(&cfg, why, sizeof why));
    assert_non_null(strstr(why, "48"));
}

int main(void)
{
    struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_check_reasons, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_backend_decode, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_backend_prefill_mixed, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_default_switches, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_tc_prefill_switch, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_gemm_switches, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_pingpong_prefill_switch, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_cublas_gemm, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_unknown_switch_refused, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_interleaved_decode_rows, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_faults_flagged, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_simulated_deepseek_trace_replays, test_setup, test_teardown),
    };
    int failed = tu_run_gpu_tests("gpu_mla_backend", tests, sizeof tests / sizeof tests[0]);   /* AR_GPU_ONLY / AR_GPU_SHARD */
    ar_cuda_mla_release_case_buffers();
    return failed;
}
