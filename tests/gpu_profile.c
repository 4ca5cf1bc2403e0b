/* gpu_profile.c - GPU tests of `attnreplay profile`'s measurements: cuBLAS GEMM times
 * (kernels/common/cuda_profile.cu) are positive, grow with the token count and stay below the device's
 * peak rate; attention through the cuda backend grows with the context; a quick profile written
 * by the command loads and drives the simulator.  Every test skips with the reason when there is
 * no GPU (or no cuBLAS). */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../kernels/common/cuda_profile.h"
#include "../sim/sim.h"

static bool gpu_ready(char *name, size_t len)
{
    char err[512];
    if (ar_cuda_profile_device(name, len, err, sizeof err) != 0) {
        print_message("skipping: %s\n", err);
        return false;
    }
    return true;
}

static void test_gemm_times(void **state)
{
    (void)state;
    char name[256], engine[1200], err[2048];
    if (!gpu_ready(name, sizeof name)) { skip(); return; }
    const int ms[4] = {1, 64, 1024, 8192};
    double us[4];
    int rc = ar_cuda_profile_gemm(4096, 6144, ms, 4, 10, us, engine, sizeof engine, err, sizeof err);
    if (rc != 0 && strstr(err, "cuBLAS")) {
        print_message("skipping: %s\n", err);
        skip();
        return;
    }
    if (rc != 0) fail_msg("%s", err);
    for (int i = 0; i < 4; i++) assert_true(us[i] > 0);
    assert_true(us[3] > us[0]);
    assert_true(us[3] > us[2]);
    /* the 8192-token GEMM: a plausible rate, below any GPU's dense bf16 peak (~2.5 PFLOP/s) */
    double tflops = 2.0 * 8192 * 4096 * 6144 / (us[3] * 1e-6) / 1e12;
    print_message("%s: qkv GEMM at 8192 tokens %.1f us = %.0f TFLOP/s (%s)\n", name, us[3], tflops, engine);
    assert_true(tflops > 10 && tflops < 2500);
}

static void test_attention_times(void **state)
{
    (void)state;
    char name[256], err[2048];
    if (!gpu_ready(name, sizeof name)) { skip(); return; }
    const ar_model *m = &ar_model_preset_find("llama-3.1-8b")->model;
    double short_ctx = 0, long_ctx = 0, prefill = 0;
    if (ar_profile_time_attention("cuda", m, 1, 16, 1, 1024, 10, &short_ctx, err, sizeof err) != 0) fail_msg("%s", err);
    if (ar_profile_time_attention("cuda", m, 1, 16, 1, 16384, 10, &long_ctx, err, sizeof err) != 0) fail_msg("%s", err);
    if (ar_profile_time_attention("cuda", m, 1, 1, 2048, 0, 10, &prefill, err, sizeof err) != 0) fail_msg("%s", err);
    print_message("%s: decode 16 x 1k %.1f us, 16 x 16k %.1f us, prefill 2048 %.1f us\n", name, short_ctx, long_ctx,
                  prefill);
    assert_true(short_ctx > 0 && prefill > 0);
    assert_true(long_ctx > 2 * short_ctx);
}

/* profile --quick end to end: the database loads and sim runs on it. */
static void test_quick_profile_command(void **state)
{
    (void)state;
    char name[256];
    if (!gpu_ready(name, sizeof name)) { skip(); return; }
    const ar_device_spec *dev = ar_device_match(name);
    if (!dev) {
        print_message("skipping: GPU '%s' matches no device preset\n", name);
        skip();
        return;
    }
    char db[512], out[512], trace[512], err[1024];
    tu_tmp("quick-profile.db", db, sizeof db);
    tu_tmp("quick-profile.txt", out, sizeof out);
    tu_tmp("quick.trace.jsonl", trace, sizeof trace);
    int rc = tu_run(out, "%s profile --device %s --model llama-3.1-8b --db %s --quick --repeat 5", tu_bin(), dev->name,
                    db);
    if (rc != 0) {
        char *log = tu_slurp(out);
        fail_msg("profile failed (%d): %s", rc, log ? log : "");
    }
    ar_profile_table p;
    if (ar_profile_load(db, &p, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(p.num_gemms, 5);
    assert_int_equal(tu_run(out, "%s sim --workload synthetic:n=50,input=400,output=20,rate=40 --model llama-3.1-8b "
                                 "--step-time profile:%s --out %s", tu_bin(), db, trace), 0);
}

int main(void)
{
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_times),
        cmocka_unit_test(test_attention_times),
        cmocka_unit_test(test_quick_profile_command),
    };
    return tu_run_gpu_tests("gpu_profile", tests, sizeof tests / sizeof tests[0]);
}
