/* test_cascade_cpu.c - issue 5's cascade tests on the CPU backend (kernels/cpu/cpu_backend.c,
 * kernels/cpu/cpu_attn.c), the CPU half of what tests/gpu_cascade.c checks on the GPU:
 *   - vLLM test_cascade cases: the general set [(129,871),(18,280),(37,988),(1023,2304),(1,257)]
 *     with P = 256 and the flash-decoding set [(1,1023),(1,879),(1,778),(1,1777)] (x 8 here, x 100
 *     on the GPU) with P = 512, over heads (4,4), (8,2), (16,2), head sizes 128, 192, 256, fp16 and
 *     bf16, soft cap none and 50 - one case per row of that grid, not the whole product, to stay
 *     fast on two cores.  Each runs flat and cascade on one backend instance: both pass the
 *     verifier (float64 reference, sampled rows) and agree on every element within the sum of
 *     their tolerances (cascade == flat == reference).
 *   - the CPU merge (ar_cpu_merge_task) on a subset of vLLM test_merge_attn_states' grid with
 *     ~10% +inf LSEs on each side (never both), -inf on one side and on both, against
 *     ar_ref_merge; and the MERGE_NO_WEIGHTS path computing exactly a + b. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/cpu_attn.h"
#include "../kernels/cpu/cpu_backend.h"
#include "cascade_cases.h"

typedef struct cpu_case {
    int set;                  /* 0 general (P 256), 1 flash-decoding x 8 (P 512) */
    int hq, hkv, head_size;
    ar_dtype dtype;
    double cap;
} cpu_case;

static void test_cpu_cascade_cases(void **unused)
{
    (void)unused;
    static const cpu_case cases[] = {
        {0, 8, 2, 128, AR_BF16, 0},
        {1, 4, 4, 256, AR_BF16, 50},
        {1, 4, 4, 128, AR_FP16, 0},
        {1, 16, 2, 192, AR_FP16, 50},
        {1, 8, 2, 256, AR_BF16, 50},
        {1, 16, 2, 192, AR_BF16, 0},
    };
    casc_seq fd[32];
    for (int i = 0; i < 32; i++) fd[i] = casc_fd_seqs[i % 4];
    int failures = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const cpu_case *k = &cases[i];
        ar_run_config cfg = casc_cfg(k->hq, k->hkv, k->head_size, 4096, k->dtype, k->cap);
        cfg.threads = 2;
        casc_result r;
        casc_run(&ar_cpu_backend, NULL, &cfg, k->set ? fd : casc_general_seqs, k->set ? 32 : 5,
                 k->set ? 512 : 256, k->set ? 0 : 48, &r);
        bool ok = r.flat.pass && r.casc.pass && casc_agree(&r) && r.casc.nan_count == 0;
        print_message("%s heads %d/%d d %d %s cap %g: flat %s max %.3g, cascade %s max %.3g (naive %.3g), "
                      "|c-f| %.3g lse %.3g, prefix %.0f us suffix %.0f us merge %.0f us %s %s\n",
                      k->set ? "decode x8" : "general", k->hq, k->hkv, k->head_size, ar_dtype_name(k->dtype),
                      k->cap, r.flat.pass ? "PASS" : "FAIL", r.flat.max_abs, r.casc.pass ? "PASS" : "FAIL",
                      r.casc.max_abs, r.casc.naive_max_abs, r.diff_max, r.diff_lse, r.prefix_us, r.suffix_us,
                      r.merge_us, ok ? "OK" : "FAIL", r.casc.reason);
        if (!ok) failures++;
    }
    assert_int_equal(failures, 0);
}

/* The merge under test: the CPU backend's merge task over every token. */
static int cpu_merge(ar_dtype dt, int T, int H, int D, const float *po, const float *pl, const float *so,
                     const float *sl, int no_weights, float *out, float *lse)
{
    ar_cpu_merge m = {0, T, H, D, T, po, pl, so, sl, out, lse, dt, no_weights, 0};
    int items = ar_cpu_merge_items(&m);
    for (int i = 0; i < items; i++) ar_cpu_merge_task(&m, i, 0);
    return 0;
}

static void test_cpu_merge_grid(void **unused)
{
    (void)unused;
    static const int tokens[] = {256, 512, 613, 1024, 1536, 4096};
    static const int heads[] = {4, 8, 16, 32, 48, 64};
    static const int sizes[] = {32, 48, 64, 96, 128, 256};
    static const ar_dtype dtypes[] = {AR_FP16, AR_BF16};
    int cases = 0, failed = 0;
    double worst_out = 0, worst_lse = 0;
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            for (int c = 0; c < 6; c++)
                for (int d = 0; d < 2; d++) {
                    if ((int64_t)tokens[a] * heads[b] * sizes[c] > 400000) continue;
                    if ((a + 2 * b + c + d) % 4 != 0) continue;
                    int64_t bad = casc_merge_case(cpu_merge, dtypes[d], tokens[a], heads[b], sizes[c], false,
                                                  &worst_out, &worst_lse);
                    if (bad) {
                        print_message("merge %s T %d H %d D %d: %lld bad\n", ar_dtype_name(dtypes[d]), tokens[a],
                                      heads[b], sizes[c], (long long)bad);
                        failed++;
                    }
                    cases++;
                }
    print_message("cpu merge grid: %d of %d cases failed; worst |out - ref| %.3g, |lse - ref| %.3g\n", failed,
                  cases, worst_out, worst_lse);
    assert_true(cases >= 10);
    assert_int_equal(failed, 0);
    double w0 = 0, w1 = 0;
    assert_int_equal(casc_merge_case(cpu_merge, AR_FP16, 256, 8, 64, true, &w0, &w1), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_merge_grid),
        cmocka_unit_test(test_cpu_cascade_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
