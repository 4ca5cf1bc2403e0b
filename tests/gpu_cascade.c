/* gpu_cascade.c - GPU tests of cascade attention in the "cuda" backend (kernels/paged/cuda_backend.cu:
 * prefix pass, suffix pass, merge kernel) against the float64 reference and the backend's own
 * flat path, through the verifier the replay uses (replay/verify.h).
 *
 * Cases: vLLM's tests/kernels/attention/test_cascade_flash_attn.py::test_cascade - general
 * [(129,871),(18,280),(37,988),(1023,2304),(1,257)] with P = 256 and flash-decoding
 * [(1,1023),(1,879),(1,778),(1,1777)] x 100 with P = 512; heads (4,4), (8,2), (16,2); head sizes
 * 128, 192 (generic path), 256; fp16 and bf16; soft cap none and 50.  Every request shares the
 * first P / block_size physical blocks (same content keys); each case runs flat (P = 0) and
 * cascade (P) on the same cache: both must pass the verifier and agree with each other within
 * the sum of their tolerances on every element.  The merge kernel runs on a subset of vLLM's
 * test_merge_attn_states grid with ~10% +inf LSEs on each side (never both), plus rows with
 * -inf on one side and on both, against ar_ref_merge.  Planted faults (merge without weights,
 * LSE base 2, causal off by one, no rescale) are flagged on a cascade step.
 * The float64 reference checks sampled rows (every row of one general case, the first 16
 * requests of the decode set) so that the binary finishes in well under a minute on the H200;
 * cascade == flat is compared on every element.
 * The prefix pass also runs on both prefill kernels (the mma.sync PREFILL and the wgmma
 * PREFILL_WG, which falls back to PREFILL off Hopper), with and without a forced split, and every
 * pass of a step on the wgmma kernel.
 * The grid runs again with an fp8 e4m3 KV cache (vLLM kv_cache_dtype=fp8; kv_scale 0.37 without
 * soft cap, 1 with it): every pass of every step must plan an fp8-KV kernel (the prefix pass
 * mma.sync PREFILL or DECODE, never the 16-bit wgmma kernel; the suffix pass DECODE or, for the
 * decode set at head size 128, the fp8 DECODE_TMA).
 * AR_GPU_SMALL=1 (compute-sanitizer runs) keeps only head size 128 without soft cap, 20 requests
 * of the decode set, a short merge grid and five of the prefix-pass geometries.
 * Every test skips with the backend's reason when there is no GPU. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/paged/cuda_backend.h"
#include "../reference/reference.h"
#include "cascade_cases.h"

enum { CFG_PREFILL = 0, CFG_DECODE = 1, CFG_PREFILL_WG = 2, CFG_DECODE_TMA = 3 };   /* AR_CFG_* (kernels/paged/cuda_attn.cuh) */

static bool casc_small(void)
{
    const char *e = getenv("AR_GPU_SMALL");
    return e && e[0] == '1';
}

static bool casc_gpu_ready(void)
{
    ar_run_config c;
    memset(&c, 0, sizeof c);
    c.model.attention = AR_ATTN_MHA;
    c.model.num_q_heads = c.model.num_kv_heads = 4;
    c.model.head_size = c.model.v_head_dim = 128;
    c.block_size = 16;
    c.num_blocks = 64;
    c.dtype = c.kv_dtype = AR_BF16;
    char why[256] = "";
    if (ar_cuda_backend.check(&c, why, sizeof why)) return true;
    print_message("skipping: %s\n", why);
    return false;
}

/* Prints one case; returns 1 when it failed. */
static int casc_report(const char *what, const casc_result *r)
{
    double tol_out = r->flat.tol_max_abs + r->casc.tol_max_abs;
    bool agree = casc_agree(r);
    bool ok = r->flat.pass && r->casc.pass && agree && r->guard_violations == 0 && r->casc.nan_count == 0;
    print_message("%-40s flat %s max %.3g | cascade %s max %.3g (naive %.3g) lse %.3g | |c-f| %.3g (tol %.3g) "
                  "lse %.3g | prefix cfg %d work %d splits %d | us flat %.1f prefix %.1f suffix %.1f merge %.1f %s%s\n",
                  what, r->flat.pass ? "PASS" : "FAIL", r->flat.max_abs, r->casc.pass ? "PASS" : "FAIL",
                  r->casc.max_abs, r->casc.naive_max_abs, r->casc.lse_max_abs, r->diff_max, tol_out, r->diff_lse,
                  r->prefix_config, r->prefix_num_work, r->prefix_num_splits, r->flat_us,
                  r->prefix_us, r->suffix_us, r->merge_us, ok ? "OK" : "FAIL ", ok ? "" : r->casc.reason);
    return ok ? 0 : 1;
}

/* The CUDA plan of the cascade step, right after its prepare. */
static void cuda_plan_hook(void *state, casc_result *res)
{
    ar_cuda_plan_info pi;
    ar_cuda_plan_of(state, &pi);
    assert_int_equal(pi.cascade, 1);
    res->prefix_config = pi.prefix_config;
    res->prefix_num_work = pi.prefix_num_work;
    res->prefix_num_splits = pi.prefix_num_splits;
}

/* cuda_plan_hook, and both passes on fp8-KV kernels (the suffix pass may take DECODE_TMA). */
static void cuda_fp8_plan_hook(void *state, casc_result *res)
{
    cuda_plan_hook(state, res);
    ar_cuda_plan_info pi;
    ar_cuda_plan_of(state, &pi);
    assert_int_equal(pi.kv_fp8, 1);
    assert_true((pi.config <= CFG_DECODE || pi.config == CFG_DECODE_TMA) && pi.prefix_config <= CFG_DECODE);
}

/* vLLM test_cascade: both sequence sets x heads x head sizes x dtypes x soft caps; fp8: with an
 * fp8 e4m3 cache. */
static void vllm_cascade_grid(bool fp8)
{
    if (!casc_gpu_ready()) { skip(); return; }
    static const int heads[3][2] = {{4, 4}, {8, 2}, {16, 2}};
    static const int sizes[] = {128, 192, 256};
    static const ar_dtype dtypes[] = {AR_FP16, AR_BF16};
    static const double caps[] = {0, 50};
    casc_seq *fd = malloc(sizeof(casc_seq) * 400);
    assert_non_null(fd);
    for (int i = 0; i < 400; i++) fd[i] = casc_fd_seqs[i % 4];
    const int n_fd = casc_small() ? 20 : 400;   /* compute-sanitizer runs: 20 requests */
    int failures = 0, count = 0;
    for (int set = 0; set < 2; set++)
        for (int h = 0; h < 3; h++)
            for (int d = 0; d < 3; d++)
                for (int dt = 0; dt < 2; dt++)
                    for (int c = 0; c < 2; c++) {
                        if (casc_small() && (sizes[d] != 128 || c == 1)) continue;
                        ar_run_config cfg = casc_cfg(heads[h][0], heads[h][1], sizes[d], set ? 32768 : 2048,
                                                     dtypes[dt], caps[c]);
                        if (fp8) {
                            cfg.kv_dtype = AR_FP8_E4M3;
                            cfg.kv_scale = c ? 1.0 : 0.37;
                        }
                        /* The float64 reference (CPU, the slow part of this test) checks:
                         * general set: every cascade row for heads 8/2, d 128, fp16, no cap
                         * (flat: 16 rows); elsewhere ~24 cascade and ~8 flat rows spread over
                         * the batch, each request's last row always.  Decode set: the last
                         * row of the first 16 requests (all four shapes, 4 times each).
                         * cascade == flat covers every element of every request in all cases. */
                        bool full = set == 0 && h == 1 && d == 0 && dt == 0 && c == 0;
                        casc_check check = {full ? 16 : 8, full ? 0 : 24, 0, NULL};
                        if (set) check = (casc_check){0, 0, 16, NULL};
                        casc_result r;
                        casc_run_checked(&ar_cuda_backend, fp8 ? cuda_fp8_plan_hook : cuda_plan_hook, &cfg,
                                         set ? fd : casc_general_seqs, set ? n_fd : 5, set ? 512 : 256, &check, &r);
                        char what[128];
                        snprintf(what, sizeof what, "%s%s heads %d/%d d %d %s cap %g", fp8 ? "fp8 KV " : "",
                                 set ? "decode" : "general", heads[h][0], heads[h][1], sizes[d],
                                 ar_dtype_name(dtypes[dt]), caps[c]);
                        failures += casc_report(what, &r);
                        count++;
                    }
    free(fd);
    print_message("%svllm test_cascade grid: %d of %d cases failed\n", fp8 ? "fp8 KV " : "", failures, count);
    assert_int_equal(failures, 0);
}

static void test_vllm_cascade_grid(void **unused)
{
    (void)unused;
    vllm_cascade_grid(false);
}

static void test_vllm_cascade_grid_fp8_kv(void **unused)
{
    (void)unused;
    vllm_cascade_grid(true);
}

/* A decode batch small enough for the DECODE geometry in the prefix pass too, a forced split
 * of every pass, and requests whose whole context is the prefix (empty suffix keys before the
 * new token never happen: the new token is always a suffix key). */
static void test_cascade_small_shapes(void **unused)
{
    (void)unused;
    if (!casc_gpu_ready()) { skip(); return; }
    static const casc_seq two[] = {{1, 300}, {1, 400}};
    static const casc_seq exact[] = {{1, 257}, {3, 259}, {16, 272}};
    int failures = 0;
    ar_run_config cfg = casc_cfg(4, 4, 128, 512, AR_BF16, 0);
    casc_result r;
    casc_run(&ar_cuda_backend, cuda_plan_hook, &cfg, two, 2, 256, 0, &r);
    failures += casc_report("2 decodes, prefix in DECODE geometry", &r);
    assert_int_equal(r.prefix_config, 1);
    casc_run(&ar_cuda_backend, cuda_plan_hook, &cfg, exact, 3, 256, 0, &r);
    failures += casc_report("context == P for every request", &r);
    ar_run_config gqa = casc_cfg(32, 8, 128, 4096, AR_FP16, 0);
    /* contexts 2048 + 17 i: every one >= P = 2048 (vLLM caps P at the smallest context) */
    casc_seq many[64];
    for (int i = 0; i < 64; i++) many[i] = (casc_seq){1, 2049 + 17 * i};
    casc_run(&ar_cuda_backend, cuda_plan_hook, &gqa, many, 64, 2048, 0, &r);
    failures += casc_report("64 decodes, GQA 32/8, P 2048", &r);
    assert_true(r.prefix_num_splits > 1);
    assert_int_equal(failures, 0);
}

static void prefix_prefill(void *state) { ar_cuda_set_prefix_plan(state, CFG_PREFILL, 0); }
static void prefix_prefill_split(void *state) { ar_cuda_set_prefix_plan(state, CFG_PREFILL, 5); }
static void prefix_wg(void *state) { ar_cuda_set_prefix_plan(state, CFG_PREFILL_WG, 0); }
static void prefix_wg_split(void *state) { ar_cuda_set_prefix_plan(state, CFG_PREFILL_WG, 5); }
static void all_wg(void *state) { ar_cuda_set_plan(state, CFG_PREFILL_WG, 0); }
static void all_wg_split(void *state) { ar_cuda_set_plan(state, CFG_PREFILL_WG, 3); }
static void merge_separate(void *state) { ar_cuda_set_cascade_merge(state, 0); }
static void merge_separate_split(void *state)
{
    ar_cuda_set_cascade_merge(state, 0);
    ar_cuda_set_plan(state, -1, 2);
}

/* The wgmma config runs as PREFILL (0) where the device has no wgmma kernel or the driver
 * cannot encode tensor maps: the plan hook records whether it has them. */
static bool tma_available = true;
static void wg_plan_hook(void *state, casc_result *res)
{
    cuda_plan_hook(state, res);
    ar_cuda_plan_info pi;
    ar_cuda_plan_of(state, &pi);
    tma_available = pi.has_tma != 0;
}
static int ran_config(int asked)
{
    return asked == CFG_PREFILL_WG && !tma_available ? CFG_PREFILL : asked;
}

/* The prefix pass on both prefill kernels with and without a forced split, every pass of the
 * step - flat, suffix and prefix, causal prefill chunks included - on the wgmma kernel, and the
 * merge run separately (merge_kernel) instead of fused into the suffix pass, with and without a
 * suffix split: verified like the grid. */
static void test_cascade_prefix_geometries(void **unused)
{
    (void)unused;
    if (!casc_gpu_ready()) { skip(); return; }
    static void (*const setups[])(void *) = {prefix_prefill, prefix_prefill_split, prefix_wg, prefix_wg_split,
                                             all_wg,         all_wg_split,         merge_separate, merge_separate_split};
    /* (the two "merge separate" entries run the automatic prefix config, PREFILL_WG) */
    static const int want_config[] = {CFG_PREFILL,    CFG_PREFILL,    CFG_PREFILL_WG, CFG_PREFILL_WG,
                                      CFG_PREFILL_WG, CFG_PREFILL_WG, CFG_PREFILL_WG, CFG_PREFILL_WG};
    static const char *const names[] = {"prefix PREFILL",     "prefix PREFILL split 5",
                                        "prefix WG",          "prefix WG split 5",
                                        "every pass WG",      "every pass WG split 3",
                                        "merge separate",     "merge separate, suffix split 2"};
    enum { NUM_GEOMETRIES = sizeof want_config / sizeof want_config[0] };
    int failures = 0;
    casc_seq many[128];
    for (int i = 0; i < 128; i++) many[i] = (casc_seq){1, 4097 + 5 * i};
    for (int k = 0; k < NUM_GEOMETRIES; k++) {
        /* under AR_GPU_SMALL (compute-sanitizer): the mma.sync prefix pass, the wgmma one split,
         * every pass on the wgmma kernel, and the separate merge with a split suffix pass */
        if (casc_small() && k != 0 && k != 3 && k != 4 && k != 5 && k != 7) continue;
        /* every row verified on the flat run where the flat pass itself is the wgmma config */
        bool flat_wg = k == 4 || k == 5;
        casc_check check = {flat_wg ? 0 : 8, 32, 0, setups[k]};
        casc_result r;
        char what[96];
        ar_run_config cfg = casc_cfg(8, 2, 128, 2048, k == 1 || k == 3 || k == 5 ? AR_FP16 : AR_BF16, 0);
        casc_run_checked(&ar_cuda_backend, wg_plan_hook, &cfg, casc_general_seqs, 5, 256, &check, &r);
        snprintf(what, sizeof what, "general 8/2 d128, %s", names[k]);
        failures += casc_report(what, &r);
        assert_int_equal(r.prefix_config, ran_config(want_config[k]));
        /* the benchmark's shape at a smaller prefix: 128 decodes, GQA 32/8, P 4096 (not
         * under AR_GPU_SMALL: compute-sanitizer runs) */
        if (casc_small()) continue;
        ar_run_config gqa = casc_cfg(32, 8, 128, 8192, AR_FP16, 0);
        check.cascade_rows = 0;
        check.verify_reqs = 16;
        casc_run_checked(&ar_cuda_backend, wg_plan_hook, &gqa, many, 128, 4096, &check, &r);
        snprintf(what, sizeof what, "128 decodes 32/8 P 4096, %s", names[k]);
        failures += casc_report(what, &r);
        assert_int_equal(r.prefix_config, ran_config(want_config[k]));
    }
    assert_int_equal(failures, 0);
}

/* The suffix pass on AR_CFG_DECODE_TMA (one CTA per request, whole cache blocks by TMA; Hopper
 * with tensor maps): vLLM's flash-decoding set (400 decodes, P 512) with the suffix pass forced
 * onto it (heads 4/4, 8/2, 16/2; d 128; fp16 and bf16; soft cap none and 50; the prefix pass on
 * its automatic config), the fused merge and the separate one, and the benchmark's shape at a
 * smaller prefix (128 decodes, GQA 32/8, suffixes of 1-300 keys), where the automatic plan
 * must choose it and fold the prefix pass's split combine into it - and once more with the
 * fold turned off (the combine kernel, the prefix rows read up front).  Skips where the device
 * has no tensor maps. */
static int suffix_config_seen = -1, suffix_has_tma = 0, suffix_folded = -1;
static void suffix_plan_hook(void *state, casc_result *res)
{
    cuda_plan_hook(state, res);
    ar_cuda_plan_info pi;
    ar_cuda_plan_of(state, &pi);
    suffix_config_seen = pi.config;
    suffix_has_tma = pi.has_tma;
    suffix_folded = pi.prefix_combine_folded;
}
static void no_fold(void *state) { ar_cuda_set_cascade_fold(state, 0); }
static void suffix_decode_tma(void *state)
{
    ar_cuda_set_plan(state, CFG_DECODE_TMA, 0);
    ar_cuda_set_prefix_plan(state, CFG_PREFILL_WG, 0);
}
static void suffix_decode_tma_separate(void *state)
{
    suffix_decode_tma(state);
    ar_cuda_set_cascade_merge(state, 0);
}
static void test_cascade_suffix_decode_tma(void **unused)
{
    (void)unused;
    if (!casc_gpu_ready()) { skip(); return; }
    static const int heads[3][2] = {{4, 4}, {8, 2}, {16, 2}};
    static const ar_dtype dtypes[] = {AR_FP16, AR_BF16};
    casc_seq *fd = malloc(sizeof(casc_seq) * 400);
    assert_non_null(fd);
    for (int i = 0; i < 400; i++) fd[i] = casc_fd_seqs[i % 4];
    const int n_fd = casc_small() ? 20 : 400;
    int failures = 0, count = 0;
    for (int h = 0; h < 3; h++)
        for (int dt = 0; dt < 2; dt++)
            for (int c = 0; c < 3; c++) {
                if (casc_small() && (h != 1 || c == 1)) continue;
                /* c: 0 plain, 1 soft cap 50, 2 the separate merge */
                ar_run_config cfg = casc_cfg(heads[h][0], heads[h][1], 128, 32768, dtypes[dt], c == 1 ? 50 : 0);
                casc_check check = {0, 0, 16, c == 2 ? suffix_decode_tma_separate : suffix_decode_tma};
                casc_result r;
                casc_run_checked(&ar_cuda_backend, suffix_plan_hook, &cfg, fd, n_fd, 512, &check, &r);
                if (!suffix_has_tma) {
                    free(fd);
                    print_message("skipping: DECODE_TMA needs compute capability 9.0 and tensor maps\n");
                    skip();
                    return;
                }
                char what[128];
                snprintf(what, sizeof what, "decode set heads %d/%d %s%s, suffix DECODE_TMA", heads[h][0],
                         heads[h][1], ar_dtype_name(dtypes[dt]), c == 1 ? " cap 50" : c == 2 ? " merge separate" : "");
                failures += casc_report(what, &r);
                assert_int_equal(suffix_config_seen, CFG_DECODE_TMA);
                count++;
            }
    free(fd);
    /* the automatic plan on many short suffixes */
    casc_seq many[128];
    for (int i = 0; i < 128; i++) many[i] = (casc_seq){1, 2048 + 1 + (i * 37) % 300};
    ar_run_config gqa = casc_cfg(32, 8, 128, 8192, AR_BF16, 0);
    casc_check check = {0, 0, 16, NULL};
    casc_result r;
    casc_run_checked(&ar_cuda_backend, suffix_plan_hook, &gqa, many, 128, 2048, &check, &r);
    failures += casc_report("128 decodes 32/8 P 2048, automatic suffix plan", &r);
    assert_int_equal(suffix_config_seen, CFG_DECODE_TMA);
    assert_int_equal(suffix_folded, 1);   /* the prefix pass splits: its combine runs in the suffix pass */
    count++;
    check.after_open = no_fold;
    casc_run_checked(&ar_cuda_backend, suffix_plan_hook, &gqa, many, 128, 2048, &check, &r);
    failures += casc_report("128 decodes 32/8 P 2048, combine kernel", &r);
    assert_int_equal(suffix_config_seen, CFG_DECODE_TMA);
    assert_int_equal(suffix_folded, 0);
    count++;
    print_message("suffix DECODE_TMA: %d of %d cases failed\n", failures, count);
    assert_int_equal(failures, 0);
}

/* Bad prefix lengths are refused with a reason, never run. */
static void test_cascade_bad_prefix_refused(void **unused)
{
    (void)unused;
    if (!casc_gpu_ready()) { skip(); return; }
    static const casc_seq two[] = {{1, 300}, {1, 400}};
    ar_run_config cfg = casc_cfg(4, 4, 128, 512, AR_BF16, 0);
    void *state = NULL;
    char err[512] = "";
    assert_int_equal(ar_cuda_backend.open(&cfg, &state, err, sizeof err), 0);
    casc_batch t;
    casc_make(&t, &cfg, two, 2, 256);
    ar_batch bb = t.b;
    bb.common_prefix_len = 264;   /* not a block multiple */
    assert_int_equal(ar_cuda_backend.prepare(state, &bb, err, sizeof err), 2);
    assert_non_null(strstr(err, "common_prefix_len"));
    bb.common_prefix_len = 304;   /* past request 0's context 299 */
    assert_int_equal(ar_cuda_backend.prepare(state, &bb, err, sizeof err), 2);
    assert_non_null(strstr(err, "context"));
    casc_free(&t);
    ar_cuda_backend.close(state);
}

/* Every planted fault that can touch a cascade step is flagged on one. */
static void test_cascade_faults_flagged(void **unused)
{
    (void)unused;
    if (!casc_gpu_ready()) { skip(); return; }
    static const ar_fault faults[] = {AR_FAULT_MERGE_NO_WEIGHTS, AR_FAULT_LSE_BASE2, AR_FAULT_CAUSAL_OFF_BY_ONE,
                                      AR_FAULT_NO_RESCALE, AR_FAULT_WRONG_KV_HEAD};
    int missed = 0;
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        ar_run_config cfg = casc_cfg(8, 2, 128, 2048, AR_BF16, 0);
        cfg.fault = faults[i];
        /* 32 rows spread over the batch flag every fault but the causal one with a wide
         * margin (on the H200: 3.4 vs 0.01, 3.7 vs 0.003, 0.35 vs 0.008, 0.49 vs 0.009);
         * causal-off-by-one moves each prefill row by one key only (0.0167 vs 0.0117 on 32
         * rows), so its cascade run checks every row (0.19 vs 0.016 in the first run) */
        casc_check check = {32, faults[i] == AR_FAULT_CAUSAL_OFF_BY_ONE ? 0 : 32, 0, NULL};
        casc_result r;
        casc_run_checked(&ar_cuda_backend, cuda_plan_hook, &cfg, casc_general_seqs, 5, 256, &check, &r);
        print_message("fault %-20s cascade %s (%s)\n", ar_fault_name(faults[i]), r.casc.pass ? "PASS" : "FAIL",
                      r.casc.reason);
        if (r.casc.pass) missed++;
    }
    assert_int_equal(missed, 0);
}

/* The merge under test: the device kernel. */
static int cuda_merge(ar_dtype dt, int T, int H, int D, const float *po, const float *pl, const float *so,
                      const float *sl, int no_weights, float *out, float *lse)
{
    char err[256] = "";
    int rc = ar_cuda_merge_states(dt, T, H, D, po, pl, so, sl, no_weights, out, lse, err, sizeof err);
    if (rc) print_message("merge: %s\n", err);
    return rc;
}

/* A subset of vLLM test_merge_attn_states' grid (tokens 256 512 613 1024 1536 4096, heads 4 8
 * 16 32 48 64, head sizes 32 48 64 96 128 256) bounded to 4M elements a case, fp16 and bf16 (79 cases; 15 with AR_GPU_SMALL). */
static void test_merge_states_grid(void **unused)
{
    (void)unused;
    if (!casc_gpu_ready()) { skip(); return; }
    static const int tokens[] = {256, 512, 613, 1024, 1536, 4096};
    static const int heads[] = {4, 8, 16, 32, 48, 64};
    static const int sizes[] = {32, 48, 64, 96, 128, 256};
    static const ar_dtype dtypes[] = {AR_FP16, AR_BF16};
    int64_t limit = casc_small() ? 200000 : 4000000;
    int cases = 0, failed = 0;
    double worst_out = 0, worst_lse = 0;
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            for (int c = 0; c < 6; c++)
                for (int d = 0; d < 2; d++) {
                    if ((int64_t)tokens[a] * heads[b] * sizes[c] > limit) continue;
                    if ((a + b + c + d) % 4 != 0) continue;    /* a quarter of the grid, every axis covered */
                    int64_t bad = casc_merge_case(cuda_merge, dtypes[d], tokens[a], heads[b], sizes[c], false, &worst_out, &worst_lse);
                    if (bad) {
                        print_message("merge %s T %d H %d D %d: %lld bad elements\n", ar_dtype_name(dtypes[d]),
                                      tokens[a], heads[b], sizes[c], (long long)bad);
                        failed++;
                    }
                    cases++;
                }
    print_message("merge grid: %d of %d cases failed; worst |out - ref| %.3g, |lse - ref| %.3g\n", failed, cases,
                  worst_out, worst_lse);
    assert_true(cases >= (casc_small() ? 10 : 40));
    assert_int_equal(failed, 0);
    /* the fault path computes what it says, and that differs from the weighted merge */
    double w0 = 0, w1 = 0;
    assert_int_equal(casc_merge_case(cuda_merge, AR_BF16, 256, 8, 128, true, &w0, &w1), 0);
}

int main(void)
{
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_states_grid),
        cmocka_unit_test(test_cascade_bad_prefix_refused),
        cmocka_unit_test(test_cascade_small_shapes),
        cmocka_unit_test(test_cascade_prefix_geometries),
        cmocka_unit_test(test_cascade_suffix_decode_tma),
        cmocka_unit_test(test_cascade_faults_flagged),
        cmocka_unit_test(test_vllm_cascade_grid),
        cmocka_unit_test(test_vllm_cascade_grid_fp8_kv),
    };
    return tu_run_gpu_tests("gpu_cascade", tests, sizeof tests / sizeof tests[0]);   /* AR_GPU_ONLY / AR_GPU_SHARD */
}
