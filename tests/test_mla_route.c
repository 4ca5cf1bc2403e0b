/* test_mla_route.c - the cuda-mla decision function (kernels/mla/mla_route.c) without a GPU: the
 * rule of mla_route.h case by case on the devices it names (an H200, a Hopper part without the
 * wgmma kernels, an A100-sized part, one where no tensor-core kernel fits), each forced kernel,
 * the fp8 cache and the stage cap; then 20,000 random devices, forced kernels and row counts,
 * where the route must be a kernel that device can run on that launch; then which wgmma launches
 * fall back to the cp.async kernel, the kernel path each route records, and which routes take
 * which plan (ar_mla_replan). */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

#include "../kernels/mla/mla_route.h"

static const ar_mla_caps H200 = {.tc_stages = 3, .wgmma = true, .narrow_bulk = true, .wgmma16 = true,
                                 .wgmma16_fp8 = true};
static const ar_mla_caps HOPPER_NO_WGMMA = {.tc_stages = 3, .narrow_bulk = true};
static const ar_mla_caps A100 = {.tc_stages = 2};
static const ar_mla_caps TINY = {.tc_stages = 0};

/* The route with every field the rule sets, compared field by field. */
static void expect(ar_mla_route r, ar_mla_kernel_kind kind, int stages, int rows_t, const char *name)
{
    assert_int_equal(r.kind, kind);
    assert_int_equal(r.stages, stages);
    assert_int_equal(r.rows_t, rows_t);
    assert_string_equal(r.name, name);
}

static ar_mla_route auto_route(const ar_mla_caps *caps, int max_rows, bool fp8)
{
    return ar_mla_choose(caps, AR_MLA_KERNEL_AUTO, max_rows, fp8, 0);
}

static void test_h200_by_rows(void **state)
{
    (void)state;
    /* up to 16 rows the 16-wide transposed kernel, up to 32 the 32-wide one, then the 64-row tiles */
    const int rows[] = {1, 8, 16, 17, 32, 33, 64, 128, 4096};
    const int want_t[] = {16, 16, 16, 32, 32, 0, 0, 0, 0};
    const char *want_name[] = {"tc-wgmma16", "tc-wgmma16", "tc-wgmma16", "tc-wgmma32", "tc-wgmma32",
                               "tc-wgmma", "tc-wgmma", "tc-wgmma", "tc-wgmma"};
    for (int i = 0; i < (int)(sizeof rows / sizeof rows[0]); i++) {
        ar_mla_route r = auto_route(&H200, rows[i], false);
        expect(r, AR_MLA_ROUTE_WGMMA, 2, want_t[i], want_name[i]);
        assert_true(r.tensor_map);
        assert_true(r.combine_rows);
        assert_false(r.persistent);
        assert_int_equal(r.ctas_per_sm, 1);
    }
    /* the stage cap touches only the mma.sync kernels */
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_AUTO, 128, false, 2), AR_MLA_ROUTE_WGMMA, 2, 0, "tc-wgmma");
}

static void test_h200_fp8_cache(void **state)
{
    (void)state;
    /* fp8: the transposed kernel's fp8 instance up to 16 rows (no tensor map: bulk copies),
     * the mma.sync 64-row kernel above */
    for (int rows = 1; rows <= 16; rows++) {
        ar_mla_route r = auto_route(&H200, rows, true);
        expect(r, AR_MLA_ROUTE_WGMMA, 2, 16, "tc-wgmma16");
        assert_false(r.tensor_map);
    }
    expect(auto_route(&H200, 17, true), AR_MLA_ROUTE_TC, 3, 0, "tc-split-qk");
    expect(auto_route(&H200, 128, true), AR_MLA_ROUTE_TC, 3, 0, "tc-split-qk");
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_AUTO, 128, true, 2), AR_MLA_ROUTE_TC, 2, 0, "tc-split-qk");
    /* without the fp8 instance granted, 16 rows go to the narrow kernel (the bulk one reads
     * 16-bit caches only) */
    ar_mla_caps no_fp8 = H200;
    no_fp8.wgmma16_fp8 = false;
    expect(auto_route(&no_fp8, 16, true), AR_MLA_ROUTE_NARROW, 4, 0, "tc-narrow");
    expect(auto_route(&no_fp8, 17, true), AR_MLA_ROUTE_TC, 3, 0, "tc-split-qk");
}

static void test_other_devices(void **state)
{
    (void)state;
    /* compute capability 9 without the wgmma kernels: the bulk narrow kernel up to 16 rows, on
     * its persistent plan at 2 CTAs an SM */
    ar_mla_route r = auto_route(&HOPPER_NO_WGMMA, 16, false);
    expect(r, AR_MLA_ROUTE_NARROW_BULK, AR_MLA_NB_STAGES, 0, "tc-narrow-bulk");
    assert_true(r.persistent);
    assert_true(r.combine_rows);
    assert_int_equal(r.ctas_per_sm, 2);
    assert_false(r.tensor_map);
    expect(auto_route(&HOPPER_NO_WGMMA, 1, false), AR_MLA_ROUTE_NARROW_BULK, AR_MLA_NB_STAGES, 0, "tc-narrow-bulk");
    expect(auto_route(&HOPPER_NO_WGMMA, 17, false), AR_MLA_ROUTE_TC, 3, 0, "tc-split-qk");
    expect(auto_route(&HOPPER_NO_WGMMA, 16, true), AR_MLA_ROUTE_NARROW, 4, 0, "tc-narrow");
    /* the stage cap keeps the bulk kernel out (it needs the 3-tile device) */
    expect(ar_mla_choose(&HOPPER_NO_WGMMA, AR_MLA_KERNEL_AUTO, 16, false, 2), AR_MLA_ROUTE_NARROW, 2, 0, "tc-narrow");
    /* an A100's 163 KB: the narrow kernel at 2 slots, the split-score kernel at 2 */
    r = auto_route(&A100, 16, false);
    expect(r, AR_MLA_ROUTE_NARROW, 2, 0, "tc-narrow");
    assert_false(r.combine_rows);
    assert_false(r.persistent);
    expect(auto_route(&A100, 17, false), AR_MLA_ROUTE_TC, 2, 0, "tc-split-qk");
    expect(auto_route(&A100, 128, true), AR_MLA_ROUTE_TC, 2, 0, "tc-split-qk");
    /* no tensor-core kernel fits: SIMT whatever is asked */
    const ar_cuda_mla_kernel all[] = {AR_MLA_KERNEL_AUTO, AR_MLA_KERNEL_SIMT, AR_MLA_KERNEL_TC_SPLIT_QK,
                                      AR_MLA_KERNEL_TC_WGMMA, AR_MLA_KERNEL_TC_NARROW, AR_MLA_KERNEL_TC_NARROW_BULK};
    for (int k = 0; k < 6; k++) expect(ar_mla_choose(&TINY, all[k], 16, false, 0), AR_MLA_ROUTE_SIMT, 0, 0, "simt");
    /* a part of compute capability 9.0 whose wgmma16 shared memory was refused: the 64-row
     * kernel at 16 rows and more, the bulk narrow kernel under 16 */
    ar_mla_caps no16 = H200;
    no16.wgmma16 = no16.wgmma16_fp8 = false;
    expect(auto_route(&no16, 15, false), AR_MLA_ROUTE_NARROW_BULK, AR_MLA_NB_STAGES, 0, "tc-narrow-bulk");
    expect(auto_route(&no16, 16, false), AR_MLA_ROUTE_WGMMA, 2, 0, "tc-wgmma");
    expect(auto_route(&no16, 32, false), AR_MLA_ROUTE_WGMMA, 2, 0, "tc-wgmma");
}

static void test_forced_kernels(void **state)
{
    (void)state;
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_SIMT, 128, false, 0), AR_MLA_ROUTE_SIMT, 0, 0, "simt");
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_TC_SPLIT_QK, 16, false, 0), AR_MLA_ROUTE_TC, 3, 0, "tc-split-qk");
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_TC_SPLIT_QK, 16, false, 2), AR_MLA_ROUTE_TC, 2, 0, "tc-split-qk");
    /* TC_WGMMA: the 64-row kernel even where AUTO takes the transposed one; off Hopper or with
     * an fp8 cache, TC_SPLIT_QK */
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_TC_WGMMA, 16, false, 0), AR_MLA_ROUTE_WGMMA, 2, 0, "tc-wgmma");
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_TC_WGMMA, 8, true, 0), AR_MLA_ROUTE_TC, 3, 0, "tc-split-qk");
    expect(ar_mla_choose(&A100, AR_MLA_KERNEL_TC_WGMMA, 128, false, 0), AR_MLA_ROUTE_TC, 2, 0, "tc-split-qk");
    /* TC_NARROW: attn_narrow_kernel up to 16 rows (4 slots on a 3-tile device, 2 capped);
     * above, as TC_WGMMA */
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_TC_NARROW, 16, false, 0), AR_MLA_ROUTE_NARROW, 4, 0, "tc-narrow");
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_TC_NARROW, 16, false, 2), AR_MLA_ROUTE_NARROW, 2, 0, "tc-narrow");
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_TC_NARROW, 16, true, 0), AR_MLA_ROUTE_NARROW, 4, 0, "tc-narrow");
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_TC_NARROW, 17, false, 0), AR_MLA_ROUTE_WGMMA, 2, 0, "tc-wgmma");
    expect(ar_mla_choose(&A100, AR_MLA_KERNEL_TC_NARROW, 17, false, 0), AR_MLA_ROUTE_TC, 2, 0, "tc-split-qk");
    /* TC_NARROW_BULK: the bulk kernel where it can run (a 16-bit cache, the 3-tile device),
     * else attn_narrow_kernel; above 16 rows as TC_WGMMA */
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_TC_NARROW_BULK, 16, false, 0), AR_MLA_ROUTE_NARROW_BULK,
           AR_MLA_NB_STAGES, 0, "tc-narrow-bulk");
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_TC_NARROW_BULK, 16, true, 0), AR_MLA_ROUTE_NARROW, 4, 0, "tc-narrow");
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_TC_NARROW_BULK, 16, false, 2), AR_MLA_ROUTE_NARROW, 2, 0, "tc-narrow");
    expect(ar_mla_choose(&A100, AR_MLA_KERNEL_TC_NARROW_BULK, 1, false, 0), AR_MLA_ROUTE_NARROW, 2, 0, "tc-narrow");
    expect(ar_mla_choose(&H200, AR_MLA_KERNEL_TC_NARROW_BULK, 64, false, 0), AR_MLA_ROUTE_WGMMA, 2, 0, "tc-wgmma");
}

/* Random devices (caps as mla_probe can leave them: wgmma16 only with wgmma, its fp8 instance
 * only with wgmma16), forced kernels, row counts, fp8 or not, capped or not: the route must name
 * its kernel, and that kernel must be one the device runs on that launch. */
static void test_random_routes_can_run(void **state)
{
    (void)state;
    uint64_t rng = 0x5eed1234abcdull;
    for (int it = 0; it < 20000; it++) {
        ar_mla_caps c;
        memset(&c, 0, sizeof c);
        c.tc_stages = tu_rnd(&rng, 4) == 0 ? 0 : 2 + tu_rnd(&rng, 2);
        c.wgmma = tu_rnd(&rng, 2);
        c.narrow_bulk = tu_rnd(&rng, 2);
        c.wgmma16 = c.wgmma && tu_rnd(&rng, 4) != 0;
        c.wgmma16_fp8 = c.wgmma16 && tu_rnd(&rng, 4) != 0;
        const ar_cuda_mla_kernel forced = (ar_cuda_mla_kernel)tu_rnd(&rng, 6);
        const int max_rows = tu_rnd(&rng, 3) == 0 ? 1 + tu_rnd(&rng, 40) : 1 + tu_rnd(&rng, 2048);
        const bool fp8 = tu_rnd(&rng, 3) == 0;
        const int cap = tu_rnd(&rng, 2) ? 2 : 0;
        const ar_mla_route r = ar_mla_choose(&c, forced, max_rows, fp8, cap);
        const int stage_limit = cap == 2 && c.tc_stages > 2 ? 2 : c.tc_stages;
        assert_non_null(r.name);
        assert_true(r.ctas_per_sm == 1 || r.ctas_per_sm == 2);
        assert_true(r.persistent == (r.kind == AR_MLA_ROUTE_NARROW_BULK));
        assert_true(r.tensor_map == (r.kind == AR_MLA_ROUTE_WGMMA && !fp8));
        assert_true((r.kind == AR_MLA_ROUTE_SIMT) == (forced == AR_MLA_KERNEL_SIMT || c.tc_stages == 0));
        switch (r.kind) {
        case AR_MLA_ROUTE_SIMT:
            assert_string_equal(r.name, "simt");
            break;
        case AR_MLA_ROUTE_TC:
            assert_string_equal(r.name, "tc-split-qk");
            assert_int_equal(r.stages, stage_limit);
            break;
        case AR_MLA_ROUTE_NARROW:
            assert_string_equal(r.name, "tc-narrow");
            assert_true(max_rows <= AR_MLA_NARROW_ROWS);
            assert_int_equal(r.stages, stage_limit >= 3 ? 4 : 2);
            break;
        case AR_MLA_ROUTE_NARROW_BULK:
            assert_string_equal(r.name, "tc-narrow-bulk");
            assert_true(max_rows <= AR_MLA_NARROW_ROWS && c.narrow_bulk && !fp8 && stage_limit >= 3);
            break;
        case AR_MLA_ROUTE_WGMMA:
            if (r.rows_t == 0) {   /* the 64-row kernel: 16-bit caches on a wgmma device */
                assert_string_equal(r.name, "tc-wgmma");
                assert_true(c.wgmma && !fp8);
            } else {               /* the transposed kernel, chosen by AUTO only */
                assert_true(forced == AR_MLA_KERNEL_AUTO && max_rows <= r.rows_t);
                assert_true(r.rows_t == AR_MLA_W16_ROWS || r.rows_t == AR_MLA_W32_ROWS);
                assert_true(r.rows_t == AR_MLA_W16_ROWS || max_rows > AR_MLA_W16_ROWS);   /* the narrowest */
                assert_string_equal(r.name, r.rows_t == AR_MLA_W16_ROWS ? "tc-wgmma16" : "tc-wgmma32");
                assert_true(fp8 ? c.wgmma16_fp8 && r.rows_t == AR_MLA_W16_ROWS : c.wgmma16);
            }
            assert_int_equal(r.stages, 2);
            assert_true(r.combine_rows);
            break;
        default:
            fail_msg("kind %d", (int)r.kind);
        }
        /* AUTO on a 16-bit cache of a device with both wgmma kernels always picks one of them
         * (the measured winners at every row count) */
        if (forced == AR_MLA_KERNEL_AUTO && c.tc_stages > 0 && !fp8 && c.wgmma && c.wgmma16)
            assert_int_equal(r.kind, AR_MLA_ROUTE_WGMMA);
    }
}

static void test_wgmma_cpasync(void **state)
{
    (void)state;
    const ar_mla_route pairs = auto_route(&H200, 128, false), t16 = auto_route(&H200, 16, false),
                       fp8 = auto_route(&H200, 16, true), bulk = auto_route(&HOPPER_NO_WGMMA, 16, false);
    /* the 64-row tiles: cp.async without a tensor map, or on 16-key blocks (one 32-key box pair
     * does not fit a block) */
    assert_true(ar_mla_wgmma_cpasync(&pairs, 64, false));
    assert_true(ar_mla_wgmma_cpasync(&pairs, 16, true));
    assert_false(ar_mla_wgmma_cpasync(&pairs, AR_MLA_PAIRS_MIN_BLOCK, true));
    assert_false(ar_mla_wgmma_cpasync(&pairs, 64, true));
    /* the transposed kernel reads 16-key blocks by TMA; without a map it falls back too */
    assert_false(ar_mla_wgmma_cpasync(&t16, 16, true));
    assert_true(ar_mla_wgmma_cpasync(&t16, 16, false));
    /* fp8 stages its tiles by bulk copies, and the other routes have no cp.async twin */
    assert_false(ar_mla_wgmma_cpasync(&fp8, 16, false));
    assert_false(ar_mla_wgmma_cpasync(&bulk, 16, false));
}

/* The coverage path of every route, worked out from its name: "mla-decode:" name, "-cpasync"
 * on the wgmma route's cp.async kernel, "+split" with a combine; SIMT has no split form. */
static void test_route_paths(void **state)
{
    (void)state;
    const ar_mla_route routes[] = {auto_route(&H200, 128, false), auto_route(&H200, 16, false),
                                   auto_route(&H200, 32, false), auto_route(&H200, 16, true),
                                   auto_route(&HOPPER_NO_WGMMA, 16, false), auto_route(&A100, 16, false),
                                   auto_route(&A100, 128, false), auto_route(&TINY, 16, false)};
    for (int i = 0; i < (int)(sizeof routes / sizeof routes[0]); i++)
        for (int cpasync = 0; cpasync < 2; cpasync++)
            for (int split = 0; split < 2; split++) {
                const ar_mla_route *r = &routes[i];
                char want[96];
                const bool cp = cpasync && r->kind == AR_MLA_ROUTE_WGMMA;
                snprintf(want, sizeof want, "mla-decode:%s%s%s", cp ? "tc-wgmma" : r->name, cp ? "-cpasync" : "",
                         split && r->kind != AR_MLA_ROUTE_SIMT ? "+split" : "");
                assert_string_equal(ar_mla_route_path(r, cpasync, split), want);
            }
}

static void test_replan(void **state)
{
    (void)state;
    enum { R = 20 };
    int qsl[R + 1], seq[R];
    for (int r = 0; r <= R; r++) qsl[r] = r;
    for (int r = 0; r < R; r++) seq[r] = 1000 + 517 * r;
    /* the routes at one CTA an SM keep the plan they were given */
    ar_mla_plan p;
    assert_int_equal(ar_mla_build_plan(&p, R, qsl, seq, NULL, 16, 1, 0, 132, 0), 0);
    const ar_mla_work_item *before = p.work;
    const int num_work = p.num_work;
    const ar_mla_route wg = auto_route(&H200, 16, false);
    assert_int_equal(ar_mla_replan(&p, &wg, R, qsl, seq, NULL, 16, 1, 0, 132, 0), 0);
    assert_ptr_equal(p.work, before);
    assert_int_equal(p.num_work, num_work);
    /* the bulk narrow kernel: the persistent plan over 2 x SMs CTAs, chained */
    const ar_mla_route bulk = auto_route(&HOPPER_NO_WGMMA, 16, false);
    assert_int_equal(ar_mla_replan(&p, &bulk, R, qsl, seq, NULL, 16, 1, 0, 132, 0), 0);
    assert_true(p.num_ctas > 132 && p.num_ctas <= 264);
    assert_true(p.num_work >= p.num_ctas);
    int chained = 0;
    for (int k = 0; k < p.num_work; k++) chained += p.work[k].next >= 0;
    assert_int_equal(chained, p.num_work - p.num_ctas);   /* every piece but a chain's last points on */
    ar_mla_plan persistent;
    assert_int_equal(ar_mla_build_plan_persistent(&persistent, R, qsl, seq, NULL, 16, 1, 0, 264), 0);
    assert_int_equal(persistent.num_work, p.num_work);
    assert_memory_equal(persistent.work, p.work, (size_t)p.num_work * sizeof *p.work);
    ar_mla_plan_free(&persistent);
    /* a forced split count keeps the plan of the forced split */
    ar_mla_plan_free(&p);
    assert_int_equal(ar_mla_build_plan(&p, R, qsl, seq, NULL, 16, 1, 0, 132, 3), 0);
    before = p.work;
    assert_int_equal(ar_mla_replan(&p, &bulk, R, qsl, seq, NULL, 16, 1, 0, 132, 3), 0);
    assert_ptr_equal(p.work, before);
    ar_mla_plan_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_h200_by_rows),
        cmocka_unit_test(test_h200_fp8_cache),
        cmocka_unit_test(test_other_devices),
        cmocka_unit_test(test_forced_kernels),
        cmocka_unit_test(test_random_routes_can_run),
        cmocka_unit_test(test_wgmma_cpasync),
        cmocka_unit_test(test_route_paths),
        cmocka_unit_test(test_replan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
