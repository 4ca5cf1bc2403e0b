/* gpu_mla.c - GPU tests of the "cuda-mla" backend's latent attention kernels
 * (kernels/mla/cuda_mla.cu) through its test hook (kernels/mla/cuda_mla_case.h); the backend end
 * to end is gpu_mla_backend.c, the helpers both share gpu_mla_common.h.
 *
 * 1. The latent attention kernel on FlashMLA's dense-decoding grid (tests/test_flash_mla_dense_
 *    decoding.py upstream): b in {1,2,6,64}, s_q in {1,2,4}, s_k in {20,140,4096}, h_q in
 *    {1,3,9,63,64,126,128}, h_kv 1, fixed and variable lengths (max(N(s_k, s_k/2), s_q), with
 *    zero-length requests), causal and not, d 576, dv 512, block size 64, bf16, scale
 *    1/sqrt(576), values randn / 10 clamped to [-1, 1] as upstream (the tolerances assume it), against the float64 device reference (itself checked against the host
 *    reference reference/reference.h on small cases).  FlashMLA's pass rule: every element abs
 *    error < 8e-4 or relative < 2.01/128, cosine difference 1 - 2 sum(xy) / sum(x^2 + y^2)
 *    < 5e-6; LSE abs < 1e-6 or relative < 8.01/65536; empty rows give out 0 and LSE +inf; no
 *    NaN.  For the large cases the reference covers a sample of requests (first, last, a
 *    middle one and every zero-length one); the kernel output of all requests is checked for
 *    NaN.  AR_GPU_SMALL=1 (compute-sanitizer runs) keeps only s_k <= 140 and b <= 6 in the grids
 *    (the dense grid: 32 cases, see test_flashmla_dense_grid); AR_GPU_ONLY=PATTERN runs only the
 *    tests whose names match (one process per test under racecheck, the slowest tool)
 *    and drops the 4096-key and 128-head extras.
 *    test_every_tc_instance runs each mma.sync kernel instance (dtype pair x narrow / 64-row x
 *    key-ring depth) once on a small case, in both modes.  test_narrow_bulk_kernel (forced) and
 *    test_wgmma16_kernel (AUTO: the transposed wgmma kernel, the default for at most 32 rows a
 *    request on Hopper, 16 or 32 rows wide) run the kernels for at most 16 (32) rows on shapes
 *    that reach their edges.
 *    test_wgmma_kernel_forced runs the Hopper 64-row wgmma kernel (AR_MLA_KERNEL_TC_WGMMA) on
 *    every grid case with fewer than 64 rows a request, plus splits,
 *    block sizes 16 / 32, fp16, partial row tiles and empty requests, once with its TMA key tiles
 *    (the default) and once with its cp.async ones (what runs where the tensor map is refused;
 *    AR_GPU_WG_PATHS=tma or cpasync runs one, AR_GPU_WG_CASES=N only the grid's first N cases
 *    (AR_GPU_CASE_LOG=1 prints every case before it runs, so that a sanitizer's reports name it);
 *    skips off compute capability 9.0).  The kernel
 *    that ran is checked: a TMA case that ran the cp.async path counts as a failure.
 * 2. Forced split-KV (the combine kernel), the 2-stage key ring, the mma.sync kernels forced
 *    (AR_MLA_KERNEL_TC_SPLIT_QK, AR_MLA_KERNEL_TC_NARROW), the SIMT fallback kernel, fp16, fp8
 *    e4m3 latent cache.  The grid runs AUTO (on a compute-capability 9.0 device with a bf16/fp16
 *    cache the 64-row wgmma kernel when s_q * h_q > 32 and the transposed one below - the grid
 *    asserts which ran; elsewhere the narrow 16-row kernels when s_q * h_q <= 16, else
 *    split-QK).
 * Every test skips with the backend's reason when there is no GPU. */
#include "gpu_mla_common.h"


typedef struct case_stats {
    double max_abs, cos_diff, lse_max_abs;
    long bad_out, bad_lse, nan_out;
    char first_bad[160];    /* where the first failing element is, for debugging */
} case_stats;

/* FlashMLA's rule over the rows of the selected requests; all rows checked for NaN. */
static void compare_case(const ar_cuda_mla_case *c, const ar_cuda_mla_result *r, const unsigned char *sel,
                         case_stats *st)
{
    memset(st, 0, sizeof *st);
    const int B = c->batch, SQ = c->s_q, H = c->h_q;
    double sxy = 0, sxx = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < SQ; i++)
            for (int n = 0; n < H; n++) {
                size_t row = ((size_t)(b * SQ + i) * H + n) * 512;
                for (int d = 0; d < 512; d++) {
                    float o = r->out[row + d];
                    if (!isfinite(o)) st->nan_out++;
                    if (sel && !sel[b]) continue;
                    double ref = r->ref_out[row + d];
                    double e = fabs((double)o - ref);
                    if (!(e < 8e-4 || e / fmax(fabs(ref), 1e-30) < 2.01 / 128)) {
                        if (st->bad_out++ == 0 && !st->first_bad[0])
                            snprintf(st->first_bad, sizeof st->first_bad,
                                     "out[b=%d, i=%d, h=%d, d=%d] = %.6g, reference %.6g", b, i, n, d, o, ref);
                    }
                    if (e > st->max_abs) st->max_abs = e;
                    sxy += (double)o * ref;
                    sxx += (double)o * o + ref * ref;
                }
                if (sel && !sel[b]) continue;
                size_t li = ((size_t)b * H + n) * SQ + i;
                double lo = r->lse[li], lr = r->ref_lse[li];
                double e = fabs(lo - lr);
                bool ok;
                if (isinf(lr) || isinf(lo))
                    ok = isinf(lr) && isinf(lo) && lr > 0 && lo > 0;
                else
                    ok = e < 1e-6 || e / fmax(fabs(lr), 1e-30) < 8.01 / 65536;
                if (!ok) {
                    if (st->bad_lse++ == 0 && !st->first_bad[0])
                        snprintf(st->first_bad, sizeof st->first_bad, "lse[b=%d, h=%d, i=%d] = %.8g, reference %.8g",
                                 b, n, i, lo, lr);
                    continue;
                }
                if (isinf(lr)) continue;
                if (e > st->lse_max_abs) st->lse_max_abs = e;
            }
    st->cos_diff = sxx > 0 ? 1.0 - 2.0 * sxy / sxx : 0.0;
}

typedef struct grid_opts {
    ar_dtype dtype, kv_dtype;
    double kv_scale;
    ar_cuda_mla_kernel kernel;
    int num_splits;
    int block_size;
    double cos_limit;
    int stages;             /* 0: the most that fit (3 on Hopper), 2: the A100 ring */
    bool wgmma_cpasync;     /* the wgmma kernel's cp.async key loads instead of TMA */
    bool q_spread;          /* query rows 2^32 apart in magnitude (ar_cuda_mla_case.q_spread) */
} grid_opts;

/* The kernel the last run_checked case ran (ar_cuda_mla_result.kernel_name). */
static char last_kernel_name[32];

/* Runs one case and checks it; returns false (with a message) on failure. */
static bool run_checked(int b, int s_q, int s_k, int h_q, bool varlen, bool causal, bool zero_lens,
                        const grid_opts *go)
{
    int *seqlens = malloc(sizeof(int) * (size_t)b);
    unsigned char *sel = calloc((size_t)b, 1);
    assert_non_null(seqlens);
    assert_non_null(sel);
    for (int i = 0; i < b; i++) {
        int L = s_k;
        if (varlen) {
            double x = rng_normal(s_k, s_k / 2.0);
            L = x > s_q ? (int)x : s_q;
        }
        if (zero_lens && (i % 3 == 1 || b == 1)) L = 0;
        seqlens[i] = L;
    }
    /* requests the reference covers: all of a small case, else first, middle, last, zeros */
    int64_t work = 0;
    for (int i = 0; i < b; i++) work += (int64_t)seqlens[i] * s_q * h_q;
    for (int i = 0; i < b; i++)
        sel[i] = work <= 4000000 || i == 0 || i == b / 2 || i == b - 1 || seqlens[i] == 0;
    ar_cuda_mla_case c;
    memset(&c, 0, sizeof c);
    c.batch = b;
    c.s_q = s_q;
    c.h_q = h_q;
    c.seqlens_k = seqlens;
    c.block_size = go->block_size;
    c.causal = causal;
    c.dtype = go->dtype;
    c.kv_dtype = go->kv_dtype;
    c.kv_scale = go->kv_scale;
    c.scale = 1.0 / sqrt(576.0);
    c.seed = 42 + (uint64_t)(b * 7 + s_q * 13 + s_k + h_q * 31);
    c.kernel = go->kernel;
    c.num_splits = go->num_splits;
    c.stages = go->stages;
    c.wgmma_cpasync = go->wgmma_cpasync;
    c.q_spread = go->q_spread;
    c.want_reference = true;
    c.ref_requests = sel;
    size_t n_out = (size_t)b * s_q * h_q * 512, n_lse = (size_t)b * h_q * s_q;
    ar_cuda_mla_result r;
    memset(&r, 0, sizeof r);
    r.out = malloc(n_out * sizeof(float));
    r.ref_out = malloc(n_out * sizeof(double));
    r.lse = malloc(n_lse * sizeof(float));
    r.ref_lse = malloc(n_lse * sizeof(double));
    assert_true(r.out && r.ref_out && r.lse && r.ref_lse);
    char err[512] = "";
    if (getenv("AR_GPU_CASE_LOG")) {   /* each case before it runs: a sanitizer's reports fall between */
        printf("case b=%d s_q=%d h_q=%d varlen=%d causal=%d splits=%d block=%d s_k:", b, s_q, h_q, varlen, causal,
               go->num_splits, go->block_size);
        for (int i = 0; i < b && i < 8; i++) printf(" %d", seqlens[i]);
        printf(b > 8 ? " ...\n" : "\n");
        fflush(stdout);
    }
    int rc = ar_cuda_mla_run_case(&c, &r, err, sizeof err);
    bool ok = rc == 0;
    if (!ok) print_message("case b=%d s_q=%d s_k=%d h_q=%d: %s\n", b, s_q, s_k, h_q, err);
    snprintf(last_kernel_name, sizeof last_kernel_name, "%s", ok && r.kernel_name ? r.kernel_name : "?");
    case_stats st;
    if (ok) {
        compare_case(&c, &r, sel, &st);
        ok = st.bad_out == 0 && st.bad_lse == 0 && st.nan_out == 0 && st.cos_diff < go->cos_limit;
        if (!ok && fail_lines++ < 30)
            print_message("FAIL b=%d s_q=%d s_k=%d h_q=%d varlen=%d causal=%d zeros=%d splits=%d kernel=%d (%s) %s/%s: "
                          "max abs %.3g, cos diff %.3g, bad out %ld, bad lse %ld (lse max abs %.3g), nan %ld; first: %s\n",
                          b, s_q, s_k, h_q, varlen, causal, zero_lens, go->num_splits, (int)go->kernel,
                          r.kernel_name ? r.kernel_name : "?",
                          ar_dtype_name(go->dtype), ar_dtype_name(go->kv_dtype), st.max_abs, st.cos_diff,
                          st.bad_out, st.bad_lse, st.lse_max_abs, st.nan_out, st.first_bad);
    }
    free(r.out);
    free(r.ref_out);
    free(r.lse);
    free(r.ref_lse);
    free(seqlens);
    free(sel);
    return ok;
}

static grid_opts default_opts(void)
{
    grid_opts g = {AR_BF16, AR_BF16, 1.0, AR_MLA_KERNEL_AUTO, 0, 64, 5e-6, 0, false, false};
    return g;
}

/* The float64 device reference against the host reference (reference.h: ar_ref_attend with
 * one KV head, head size 576, V size 512), inputs regenerated on the host by the hook's recipe. */
static void test_device_reference_matches_host(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    struct {
        int b, s_q, h, bs;
        int lens[3];
        bool causal;
        ar_dtype kv;
        double kv_scale;
    } cases[] = {
        {2, 2, 3, 64, {20, 140, 0}, true, AR_BF16, 1.0},
        {3, 4, 9, 16, {0, 37, 5}, true, AR_BF16, 1.0},
        {2, 1, 17, 64, {200, 1, 0}, false, AR_FP8_E4M3, 0.5},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int B = cases[ci].b, SQ = cases[ci].s_q, H = cases[ci].h;
        ar_cuda_mla_case c;
        memset(&c, 0, sizeof c);
        c.batch = B;
        c.s_q = SQ;
        c.h_q = H;
        c.seqlens_k = cases[ci].lens;
        c.block_size = cases[ci].bs;
        c.causal = cases[ci].causal;
        c.dtype = AR_BF16;
        c.kv_dtype = cases[ci].kv;
        c.kv_scale = cases[ci].kv_scale;
        c.scale = 1.0 / sqrt(576.0);
        c.seed = 99 + ci;
        c.kernel = AR_MLA_KERNEL_AUTO;
        c.want_reference = true;
        size_t n_out = (size_t)B * SQ * H * 512, n_lse = (size_t)B * H * SQ;
        ar_cuda_mla_result r;
        memset(&r, 0, sizeof r);
        r.out = malloc(n_out * sizeof(float));
        r.ref_out = malloc(n_out * sizeof(double));
        r.lse = malloc(n_lse * sizeof(float));
        r.ref_lse = malloc(n_lse * sizeof(double));
        char err[512] = "";
        int rc = ar_cuda_mla_run_case(&c, &r, err, sizeof err);
        if (rc) print_message("%s\n", err);
        assert_int_equal(rc, 0);
        double worst = 0, worst_lse = 0;
        for (int b = 0; b < B; b++) {
            int L = cases[ci].lens[b];
            double *q = malloc(sizeof(double) * (size_t)SQ * H * 576);
            double *k = malloc(sizeof(double) * (size_t)(L > 0 ? L : 1) * 576);
            double *out = malloc(sizeof(double) * (size_t)SQ * H * 512);
            double *lse = malloc(sizeof(double) * (size_t)H * SQ);
            int *qpos = malloc(sizeof(int) * (size_t)SQ);
            assert_true(q && k && out && lse && qpos);
            for (int i = 0; i < SQ; i++) {
                qpos[i] = L - SQ + i;
                for (int n = 0; n < H; n++) {
                    uint64_t row = ar_gen_row(c.seed, AR_STREAM_Q, 0, (uint64_t)b, (uint64_t)i, (uint32_t)n);
                    for (int d = 0; d < 576; d++)
                        q[((size_t)i * H + n) * 576 + d] =
                            ar_cuda_mla_case_value(ar_gen(row, (uint32_t)d, AR_DATA_NORMAL, AR_BF16), AR_BF16);
                }
            }
            for (int j = 0; j < L; j++) {
                uint64_t row = ar_gen_row(c.seed, AR_STREAM_LATENT, 0, 1000003ull + (uint64_t)b, (uint64_t)j, 0);
                for (int d = 0; d < 576; d++)
                    k[(size_t)j * 576 + d] = ar_kv_roundtrip(
                        c.kv_dtype, AR_BF16, (float)c.kv_scale,
                        ar_cuda_mla_case_value(ar_gen(row, (uint32_t)d, AR_DATA_NORMAL, AR_BF16), AR_BF16));
            }
            ar_attn_params p = {H, 1, 576, 512, c.scale, 0, 0, c.causal};
            /* values = the first 512 of each entry: pass a [L, 512] copy */
            double *v = malloc(sizeof(double) * (size_t)(L > 0 ? L : 1) * 512);
            assert_non_null(v);
            for (int j = 0; j < L; j++) memcpy(v + (size_t)j * 512, k + (size_t)j * 576, 512 * sizeof(double));
            ar_ref_attend(&p, SQ, q, qpos, L, 0, k, v, out, lse);
            for (int i = 0; i < SQ; i++)
                for (int n = 0; n < H; n++) {
                    for (int d = 0; d < 512; d++) {
                        double g = r.ref_out[((size_t)(b * SQ + i) * H + n) * 512 + d];
                        double e = fabs(g - out[((size_t)i * H + n) * 512 + d]);
                        if (e > worst) worst = e;
                    }
                    double gl = r.ref_lse[((size_t)b * H + n) * SQ + i], hl = lse[(size_t)n * SQ + i];
                    if (isinf(hl)) {
                        assert_true(isinf(gl) && gl > 0);   /* FlashMLA: +inf for an empty row */
                    } else {
                        double e = fabs(gl - hl);
                        if (e > worst_lse) worst_lse = e;
                    }
                }
            free(q);
            free(k);
            free(v);
            free(out);
            free(lse);
            free(qpos);
        }
        /* both are float64 from the same (float-exact) inputs and a double scale, so they differ
         * by summation order only (~1e-15); a float anywhere in the device reference (a float
         * scale gave 3.3e-8) fails this */
        print_message("device reference vs host, case %zu: out %.3g, lse %.3g\n", ci, worst, worst_lse);
        assert_true(worst < 1e-10);
        assert_true(worst_lse < 1e-10);
        free(r.out);
        free(r.ref_out);
        free(r.lse);
        free(r.ref_lse);
    }
}

static void test_flashmla_dense_grid(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    static const int bs_[] = {1, 2, 6, 64}, sqs[] = {1, 2, 4}, sks[] = {20, 140, 4096},
                     hqs[] = {1, 3, 9, 63, 64, 126, 128};
    grid_opts go = default_opts();
    char why[512] = "";
    const bool wg = wgmma_available(why, sizeof why);
    int fails = 0, runs = 0, n_wgmma = 0, n_wgmma16 = 0, wrong_kernel = 0;
    for (size_t ib = 0; ib < 4; ib++)
        for (size_t iq = 0; iq < 3; iq++)
            for (size_t ik = 0; ik < 3; ik++)
                for (size_t ih = 0; ih < 7; ih++)
                    for (int varlen = 0; varlen < 2; varlen++)
                        for (int causal = 0; causal < 2; causal++) {
                            /* small (compute-sanitizer; racecheck ran past 445 s on the 504 cases
                             * of s_k <= 140, b <= 6): b 1 and 6, s_q 1 and 4, s_k 20 and 140,
                             * h_q 3 and 128, causal == varlen - 32 cases, every kernel path */
                            if (small_mode() && (sks[ik] > 140 || (bs_[ib] != 1 && bs_[ib] != 6) || sqs[iq] == 2 ||
                                                 (hqs[ih] != 3 && hqs[ih] != 128) || causal != varlen))
                                continue;
                            runs++;
                            if (!run_checked(bs_[ib], sqs[iq], sks[ik], hqs[ih], varlen, causal, false, &go)) {
                                fails++;
                                continue;
                            }
                            /* AUTO on an sm_90 device: the 64-row wgmma kernel for every case
                             * with more than 32 rows (s_q * h_q), its transposed twin for the
                             * others (16 or 32 rows wide); none of them elsewhere */
                            const int rows = sqs[iq] * hqs[ih];
                            const bool is_wg = strcmp(last_kernel_name, "tc-wgmma") == 0;
                            const bool is_wg16 = strcmp(last_kernel_name, "tc-wgmma16") == 0;
                            const bool is_wg32 = strcmp(last_kernel_name, "tc-wgmma32") == 0;
                            n_wgmma += is_wg;
                            n_wgmma16 += is_wg16 || is_wg32;
                            if (is_wg != (wg && rows > 32) || is_wg16 != (wg && rows <= 16) ||
                                is_wg32 != (wg && rows > 16 && rows <= 32)) {
                                if (wrong_kernel++ < 5)
                                    print_message("b=%d s_q=%d s_k=%d h_q=%d: AUTO ran %s\n", bs_[ib], sqs[iq],
                                                  sks[ik], hqs[ih], last_kernel_name);
                            }
                        }
    print_message("FlashMLA dense grid: %d cases (%d on the wgmma kernel, %d on wgmma16/32%s%s), %d failed, %d ran an "
                  "unexpected kernel\n", runs, n_wgmma, n_wgmma16, wg ? "" : "; not here: ", wg ? "" : why, fails,
                  wrong_kernel);
    assert_int_equal(fails, 0);
    assert_int_equal(wrong_kernel, 0);
}

/* FlashMLA's zero-length corner cases: some or all requests with s_k = 0. */
static void test_zero_length_requests(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    grid_opts go = default_opts();
    int fails = 0;
    static const int hqs[] = {1, 64, 128};
    for (size_t ih = 0; ih < 3; ih++)
        for (int s_q = 1; s_q <= 4; s_q *= 2)
            for (int causal = 0; causal < 2; causal++) {
                if (!run_checked(6, s_q, 140, hqs[ih], true, causal, true, &go)) fails++;
                if (!run_checked(1, s_q, 140, hqs[ih], false, causal, true, &go)) fails++;
            }
    assert_int_equal(fails, 0);
}

/* Forced split counts exercise the combine kernel; block size 16 the multi-block key tiles. */
static void test_forced_splits_and_block16(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    grid_opts go = default_opts();
    int fails = 0;
    static const int splits[] = {1, 2, 3, 7, 32};
    for (size_t i = 0; i < 5; i++) {
        go.num_splits = splits[i];
        if (!run_checked(2, 2, 1000, 128, true, true, false, &go)) fails++;
        if (!run_checked(3, 1, 333, 16, false, false, false, &go)) fails++;
        if (!run_checked(6, 4, 140, 9, true, true, true, &go)) fails++;
    }
    go = default_opts();
    go.block_size = 16;
    if (!run_checked(6, 2, 500, 64, true, true, false, &go)) fails++;
    if (!small_mode() && !run_checked(2, 1, 4096, 128, false, false, false, &go)) fails++;
    /* the 2-stage key ring (what an A100 gets) on the same shapes (split-QK forced at 128
     * heads: AUTO runs the wgmma kernel there on an sm_90 device) */
    go = default_opts();
    go.stages = 2;
    go.kernel = AR_MLA_KERNEL_TC_SPLIT_QK;
    if (!run_checked(2, 2, 1000, 128, true, true, false, &go)) fails++;
    go.kernel = AR_MLA_KERNEL_AUTO;
    if (!run_checked(6, 4, 140, 9, true, true, true, &go)) fails++;
    go.kv_dtype = AR_FP8_E4M3;
    go.kv_scale = 0.5;
    go.cos_limit = 1e-4;
    if (!run_checked(2, 1, 700, 16, false, false, false, &go)) fails++;
    assert_int_equal(fails, 0);
}

/* Every mma.sync kernel instance once on a small case (for the compute-sanitizer runs, cheap
 * enough to run in both modes): the latent dtype pairs bf16/bf16, bf16/fp8, fp16/fp16, fp16/fp8 x
 * the narrow 16-row kernel (s_q * h_q = 8, AR_MLA_KERNEL_TC_NARROW: on Hopper AUTO runs the bulk
 * narrow kernel there) and the 64-row kernel (s_q * h_q = 32, AR_MLA_KERNEL_TC_SPLIT_QK: AUTO
 * runs the wgmma kernel there on Hopper with a 16-bit cache) x the deepest key ring (3 stages,
 * narrow 4, on Hopper) and the 2-stage one.  fp16 with an fp8 cache and several of the 2-stage
 * instances run nowhere else. */
static void test_every_tc_instance(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    static const ar_dtype dtypes[4][2] = {
        {AR_BF16, AR_BF16}, {AR_BF16, AR_FP8_E4M3}, {AR_FP16, AR_FP16}, {AR_FP16, AR_FP8_E4M3}};
    static const char *const variants[2] = {"tc-narrow", "tc-split-qk"};
    int fails = 0, runs = 0;
    for (int t = 0; t < 4; t++)
        for (int stages = 0; stages <= 2; stages += 2)
            for (int v = 0; v < 2; v++) {
                grid_opts go = default_opts();
                go.dtype = dtypes[t][0];
                go.kv_dtype = dtypes[t][1];
                if (go.kv_dtype == AR_FP8_E4M3) {
                    go.kv_scale = 0.5;
                    go.cos_limit = 1e-4;
                }
                go.stages = stages;
                go.kernel = v == 1 ? AR_MLA_KERNEL_TC_SPLIT_QK : AR_MLA_KERNEL_TC_NARROW;
                const int s_q = v == 0 ? 1 : 2, h_q = v == 0 ? 8 : 16;
                runs++;
                bool ok = run_checked(2, s_q, 140, h_q, true, true, false, &go);
                if (ok && strcmp(last_kernel_name, variants[v]) != 0) {
                    print_message("%s/%s stages %d: ran %s, expected %s\n", ar_dtype_name(go.dtype),
                                  ar_dtype_name(go.kv_dtype), stages, last_kernel_name, variants[v]);
                    ok = false;
                }
                if (!ok) fails++;
            }
    print_message("tensor-core kernel instances: %d cases, %d failed\n", runs, fails);
    assert_int_equal(fails, 0);
}

/* Shapes at the edges of the kernels for at most 16 rows a request: pieces chained across
 * requests and cut by the combine, s_q x h_q = 16 / 15 / 12 / 8 / 3 / 1 rows, causal and not,
 * zero-length requests, fewer key tiles than ring slots, a last tile of one key, block sizes 16
 * and 32, fp16, forced splits 1, 3 and 5 - run with `kernel` forced (AUTO: the decision
 * function's); each case must pass and run `expect`.  Returns the cases that failed. */
typedef struct row_case {
    int b, s_q, s_k, h_q, varlen, causal, zeros, splits, block;
    ar_dtype dt;
    ar_dtype kv;       /* the latent cache's dtype: AR_FP32 (0, never a cache dtype here) = dt */
    double kv_scale;   /* an fp8 cache's scale */
} row_case;

/* Runs cases[n] (in small mode the first two with s_k <= 140) with `kernel` forced; each must
 * pass and run `expect`; one summary line named `what`.  Returns the cases that failed. */
static int run_row_cases(const row_case *cases, size_t n, ar_cuda_mla_kernel kernel, const char *expect,
                         const char *what)
{
    int fails = 0, runs = 0, wrong_kernel = 0;
    for (size_t i = 0; i < n; i++) {
        if (small_mode() && (i > 1 || cases[i].s_k > 140)) continue;
        grid_opts go = default_opts();
        go.kernel = kernel;
        go.num_splits = cases[i].splits;
        go.block_size = cases[i].block;
        go.dtype = go.kv_dtype = cases[i].dt;
        if (cases[i].kv == AR_FP8_E4M3) {   /* FlashMLA's fp8 test relaxes the cosine rule to 1e-4 */
            go.kv_dtype = AR_FP8_E4M3;
            go.kv_scale = cases[i].kv_scale;
            go.cos_limit = 1e-4;
        }
        runs++;
        bool ok = run_checked(cases[i].b, cases[i].s_q, cases[i].s_k, cases[i].h_q, cases[i].varlen, cases[i].causal,
                              cases[i].zeros, &go);
        if (ok && strcmp(last_kernel_name, expect) != 0) {
            if (wrong_kernel++ < 5) print_message("case %zu ran %s, expected %s\n", i, last_kernel_name, expect);
            ok = false;
        }
        fails += !ok;
    }
    print_message("kernel for %s (%s): %d cases, %d failed\n", what, expect, runs, fails);
    return fails;
}

static int narrow_cases(ar_cuda_mla_kernel kernel, const char *expect)
{
    static const row_case cases[] = {
        {6, 1, 4096, 15, 1, 1, 0, 0, 64, AR_BF16, AR_FP32, 0}, {3, 2, 140, 6, 1, 1, 1, 0, 64, AR_BF16, AR_FP32, 0},
        {5, 4, 333, 3, 1, 0, 0, 0, 64, AR_BF16, AR_FP32, 0},   {2, 1, 1000, 1, 0, 1, 0, 0, 64, AR_BF16, AR_FP32, 0},
        {4, 1, 33, 12, 0, 1, 0, 0, 64, AR_BF16, AR_FP32, 0},   {3, 1, 5, 8, 0, 0, 0, 0, 64, AR_BF16, AR_FP32, 0},
        {2, 1, 1000, 15, 0, 0, 0, 3, 64, AR_BF16, AR_FP32, 0}, {2, 1, 700, 15, 1, 1, 0, 1, 64, AR_BF16, AR_FP32, 0},
        {4, 1, 500, 15, 1, 1, 0, 0, 16, AR_BF16, AR_FP32, 0},  {3, 1, 700, 15, 1, 1, 0, 0, 64, AR_FP16, AR_FP32, 0},
        {64, 1, 2000, 8, 1, 1, 1, 0, 64, AR_BF16, AR_FP32, 0}, {8, 1, 2049, 16, 0, 1, 0, 0, 64, AR_BF16, AR_FP32, 0},
        {5, 2, 1000, 8, 1, 1, 0, 5, 32, AR_BF16, AR_FP32, 0},  {3, 1, 65, 16, 0, 0, 0, 0, 16, AR_FP16, AR_FP32, 0},
        {200, 1, 300, 16, 1, 1, 1, 0, 64, AR_BF16, AR_FP32, 0},
    };
    return run_row_cases(cases, sizeof cases / sizeof cases[0], kernel, expect, "<= 16 rows");
}

/* The bulk narrow kernel (attn_narrow_bulk_kernel: key rows by bulk copies onto mbarriers, one
 * CTA barrier a tile, 2 CTAs per SM, the persistent plan whose CTAs run several pieces in turn),
 * AUTO's choice under 16 rows a request on devices of compute capability 9 or more without the
 * wgmma kernels, forced here (AR_MLA_KERNEL_TC_NARROW_BULK) on narrow_cases.  Where it cannot
 * run, the same cases run the mma.sync narrow kernel (checked all the same). */
static void test_narrow_bulk_kernel(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    char why[512] = "";
    const bool hopper = wgmma_available(why, sizeof why);
    assert_int_equal(narrow_cases(AR_MLA_KERNEL_TC_NARROW_BULK, hopper ? "tc-narrow-bulk" : "tc-narrow"), 0);
}

/* The transposed wgmma kernel (attn_wgmma16_kernel), AUTO's choice for at most 32 rows a request
 * on a compute-capability 9.0 device with a 16-bit cache: its 16-row instance on narrow_cases (a
 * case of exactly 16 rows, 1-key last tiles, 5 forced pieces, 200 requests among them), its
 * 32-row one on 17-32 rows (32 exactly, causal multi-token queries, block sizes 16 and 32, fp16,
 * forced pieces, 128 requests), and its fp8-cache form (<= 16 rows, kv_scale 0.37 / 0.5 / 2,
 * bf16 and fp16 queries, block sizes 16 / 32 / 64, a partial last tile, forced pieces; bf16
 * query rows 2^32 apart in magnitude, which its fp16 products take only through its per-row
 * scaling).  Skips where the wgmma
 * kernels cannot run (AUTO then runs the narrow kernels, which test_narrow_bulk_kernel covers). */
static void test_wgmma16_kernel(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    require_wgmma();
    int fails = narrow_cases(AR_MLA_KERNEL_AUTO, "tc-wgmma16");
    /* 17-32 rows: the 32-row instance (DeepSeek at tensor parallelism 4, or 8 with two query
     * tokens of multi-token prediction) */
    static const row_case wide[] = {
        {3, 3, 65, 6, 0, 0, 0, 0, 32, AR_FP16, AR_FP32, 0},    {2, 2, 100, 16, 1, 1, 0, 0, 64, AR_BF16, AR_FP32, 0},
        {8, 2, 2049, 16, 0, 1, 0, 0, 64, AR_BF16, AR_FP32, 0}, {6, 1, 1000, 32, 1, 1, 1, 0, 64, AR_BF16, AR_FP32, 0},
        {5, 4, 333, 8, 1, 1, 0, 3, 16, AR_BF16, AR_FP32, 0},   {128, 1, 300, 17, 1, 0, 0, 0, 64, AR_BF16, AR_FP32, 0},
    };
    fails += run_row_cases(wide, sizeof wide / sizeof wide[0], AR_MLA_KERNEL_AUTO, "tc-wgmma32", "17-32 rows");
    /* an fp8 e4m3 cache (<= 16 rows): staged by bulk copies, widened in shared memory; kv_scale
     * 0.5 and one that is not a power of two */
    static const row_case fp8[] = {
        {3, 1, 100, 16, 1, 1, 0, 0, 64, AR_BF16, AR_FP8_E4M3, 0.5},
        {2, 2, 130, 6, 0, 1, 1, 0, 16, AR_FP16, AR_FP8_E4M3, 0.37},
        {8, 1, 2049, 16, 0, 1, 0, 0, 64, AR_BF16, AR_FP8_E4M3, 0.37},
        {64, 1, 1000, 15, 1, 1, 1, 0, 32, AR_BF16, AR_FP8_E4M3, 0.5},
        {4, 1, 3000, 8, 1, 0, 0, 3, 64, AR_FP16, AR_FP8_E4M3, 2.0},
    };
    fails += run_row_cases(fp8, sizeof fp8 / sizeof fp8[0], AR_MLA_KERNEL_AUTO, "tc-wgmma16", "<= 16 rows, fp8 cache");
    /* the fp8 form's products are fp16: bf16 query rows 2^32 apart in magnitude (2^16 would
     * overflow fp16 unscaled, 2^-16 fall below its normal range) must come out as exactly */
    int spread_fails = 0;
    for (int i = 0; i < 2; i++) {
        grid_opts go = default_opts();
        go.kv_dtype = AR_FP8_E4M3;
        go.kv_scale = i ? 0.37 : 0.5;
        go.cos_limit = 1e-4;
        go.q_spread = true;
        bool ok = run_checked(i ? 4 : 3, 1, i ? 700 : 100, i ? 15 : 16, i, 1, 0, &go);
        if (ok && strcmp(last_kernel_name, "tc-wgmma16") != 0) ok = false;
        spread_fails += !ok;
    }
    print_message("fp8 cache, bf16 queries with rows 2^32 apart (tc-wgmma16): 2 cases, %d failed\n", spread_fails);
    fails += spread_fails;
    assert_int_equal(fails, 0);
}

/* test_wgmma_kernel_forced's cases on the TMA path or (cpasync) the cp.async one; returns the
 * number that failed. */
static int wgmma_forced_cases(bool cpasync)
{
    static const int bs_[] = {1, 2, 6, 64}, sqs[] = {1, 2, 4}, sks[] = {20, 140, 4096},
                     hqs[] = {1, 3, 9, 63, 64, 126, 128};
    grid_opts go = default_opts();
    go.kernel = AR_MLA_KERNEL_TC_WGMMA;
    go.wgmma_cpasync = cpasync;
    const char *const expect = cpasync ? "tc-wgmma (cp.async)" : "tc-wgmma";
    int fails = 0, runs = 0;
    /* AR_GPU_WG_CASES=N: only the grid's first N cases (racecheck, the slowest tool, in its limit) */
    const char *cases_env = getenv("AR_GPU_WG_CASES");
    const int max_cases = cases_env ? atoi(cases_env) : 0;
    for (size_t ib = 0; ib < 4; ib++)
        for (size_t iq = 0; iq < 3; iq++)
            for (size_t ik = 0; ik < 3; ik++)
                for (size_t ih = 0; ih < 7; ih++)
                    for (int varlen = 0; varlen < 2; varlen++)
                        for (int causal = 0; causal < 2; causal++) {
                            if (sqs[iq] * hqs[ih] >= 64) continue;
                            if (max_cases > 0 && runs >= max_cases) continue;
                            if (small_mode() && (sks[ik] > 140 || (bs_[ib] != 1 && bs_[ib] != 6) || sqs[iq] == 2 ||
                                                 (hqs[ih] != 3 && hqs[ih] != 63) || causal != varlen))
                                continue;
                            runs++;
                            bool ok = run_checked(bs_[ib], sqs[iq], sks[ik], hqs[ih], varlen, causal, false, &go);
                            if (ok && strcmp(last_kernel_name, expect) != 0) {
                                print_message("forced wgmma kernel (%s) ran %s\n", expect, last_kernel_name);
                                ok = false;
                            }
                            fails += !ok;
                        }
    if (max_cases > 0) {
        print_message("wgmma kernel forced (%s): the first %d grid cases (AR_GPU_WG_CASES), %d failed\n", expect, runs,
                      fails);
        fflush(stdout);
        return fails;
    }
    /* full row tiles (AUTO's wgmma cases in the dense grid), many key tiles */
    for (int causal = 0; causal < 2; causal++) {
        fails += !run_checked(4, 1, 700, 128, causal == 1, causal == 1, false, &go);
        fails += !run_checked(2, 4, 300, 64, true, causal == 1, false, &go);
        fails += !run_checked(3, 2, 2000, 128, causal == 0, causal == 1, true, &go);
        runs += 3;
    }
    static const int splits[] = {1, 2, 3, 7, 32};
    for (size_t i = 0; i < 5; i++) {
        go.num_splits = splits[i];
        fails += !run_checked(2, 2, 1000, 128, true, true, false, &go);
        fails += !run_checked(6, 4, 140, 9, true, true, true, &go);
        fails += !run_checked(3, 1, 333, 126, false, false, false, &go);
        runs += 3;
    }
    go.num_splits = 0;
    fails += !run_checked(6, 4, 140, 63, true, true, true, &go);
    fails += !run_checked(6, 2, 140, 126, true, true, true, &go);
    fails += !run_checked(1, 1, 140, 128, false, false, true, &go);   /* the only request: s_k 0 */
    fails += !run_checked(4, 1, 65, 64, false, false, false, &go);    /* a 1-key second tile */
    go.block_size = 16;
    fails += !run_checked(6, 2, 500, 64, true, true, false, &go);
    if (!small_mode()) fails += !run_checked(2, 1, 4096, 128, false, false, false, &go);
    go.block_size = 32;
    fails += !run_checked(3, 2, 300, 128, true, true, false, &go);
    go.block_size = 64;
    go.dtype = go.kv_dtype = AR_FP16;
    fails += !run_checked(2, 2, 333, 64, true, true, false, &go);
    fails += !run_checked(6, 4, 140, 126, true, true, true, &go);
    go.num_splits = 3;
    fails += !run_checked(2, 1, 1000, 128, false, false, false, &go);
    runs += small_mode() ? 10 : 11;
    print_message("wgmma kernel forced (%s): %d cases, %d failed\n", expect, runs, fails);
    fflush(stdout);   /* each path's line out even if the other one hangs and the run is killed */
    return fails;
}

/* The wgmma kernel forced (AR_MLA_KERNEL_TC_WGMMA) on every dense-grid case with partial row
 * tiles (s_q * h_q < 64: row tiles mostly or wholly past the request's rows; under AUTO the
 * grid runs the default variant from 16 rows up, which test_flashmla_dense_grid asserts), then
 * on split pieces merged by the combine kernel, block size 16, fp16, zero-length requests and
 * partial row tiles (h_q 63 / 126) - all of it with the TMA key tiles and again with the
 * cp.async ones (one summary line each), with full row tiles over many key tiles added.  Skips
 * off compute capability 9.0. */
static void test_wgmma_kernel_forced(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    require_wgmma();
    int fails = 0;
    /* AR_GPU_WG_PATHS=tma or cpasync: only that path (compute-sanitizer runs one per process to
     * stay within its time limit) */
    const char *only = getenv("AR_GPU_WG_PATHS");
    if (!only || strstr(only, "tma")) fails += wgmma_forced_cases(false);
    if (!only || strstr(only, "cpasync")) fails += wgmma_forced_cases(true);
    /* an fp8 cache is refused (it stays on the mma.sync kernels) */
    ar_cuda_mla_result r;
    char err[512] = "";
    assert_int_equal(wgmma_probe(AR_FP8_E4M3, &r, err, sizeof err), 2);
    assert_non_null(strstr(err, "wgmma kernel needs"));
    assert_int_equal(fails, 0);
}

static void test_simt_fallback_fp16_fp8(void **st)
{
    (void)st;
    SKIP_WITHOUT_GPU();
    int fails = 0;
    grid_opts go = default_opts();
    go.kernel = AR_MLA_KERNEL_SIMT;
    if (!run_checked(2, 2, 140, 64, true, true, false, &go)) fails++;
    if (!run_checked(6, 1, 20, 3, false, false, true, &go)) fails++;
    go = default_opts();
    go.dtype = go.kv_dtype = AR_FP16;
    if (!run_checked(2, 2, 1000, 128, true, true, false, &go)) fails++;
    if (!run_checked(6, 4, 140, 9, false, true, true, &go)) fails++;
    /* fp8 latent cache (the reference reads the same round-tripped values; FlashMLA's fp8 test
     * relaxes the cosine rule to 1e-4) */
    go = default_opts();
    go.kv_dtype = AR_FP8_E4M3;
    go.kv_scale = 0.5;
    go.cos_limit = 1e-4;
    if (!small_mode() && !run_checked(2, 1, 4096, 128, false, false, false, &go)) fails++;
    if (!run_checked(6, 2, 140, 16, true, true, false, &go)) fails++;
    go.kv_scale = 0.37;   /* a scale that is not a power of two */
    if (!run_checked(2, 4, 500, 64, true, true, false, &go)) fails++;
    go.kernel = AR_MLA_KERNEL_SIMT;
    if (!run_checked(2, 2, 140, 9, true, true, false, &go)) fails++;
    assert_int_equal(fails, 0);
}

int main(void)
{
    struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_device_reference_matches_host, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_flashmla_dense_grid, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_zero_length_requests, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_forced_splits_and_block16, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_every_tc_instance, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_wgmma_kernel_forced, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_simt_fallback_fp16_fp8, test_setup, test_teardown),
        /* last: a bulk-copy kernel that failed on the device (a trapped mbarrier wait) leaves the
         * context unusable */
        cmocka_unit_test_setup_teardown(test_narrow_bulk_kernel, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_wgmma16_kernel, test_setup, test_teardown),
    };
    int failed = tu_run_gpu_tests("gpu_mla", tests, sizeof tests / sizeof tests[0]);   /* AR_GPU_ONLY / AR_GPU_SHARD */
    ar_cuda_mla_release_case_buffers();
    return failed;
}
