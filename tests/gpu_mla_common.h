/* gpu_mla_common.h - what the two GPU test files of the "cuda-mla" backend share: gpu_mla.c
 * (its latent attention kernels through the test hook, kernels/mla/cuda_mla_case.h) and
 * gpu_mla_backend.c (the backend end to end).  The seeded generator, the DeepSeek-V3 test
 * config, the skip without a GPU, the per-test setup / teardown (the failure-line budget and the
 * test's wall time) and the probe of the wgmma kernel.  Header-only: each test binary is one
 * translation unit. */
#ifndef AR_TESTS_GPU_MLA_COMMON_H
#define AR_TESTS_GPU_MLA_COMMON_H

#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/common/cuda_cublas.h"
#include "../kernels/mla/cuda_mla.h"
#include "../kernels/mla/cuda_mla_case.h"
#include "../reference/mla_ref.h"
#include "../reference/reference.h"

static uint64_t rng_state = 0x5eedf00dull;
static inline uint64_t rng_next(void) { return tu_rng64(&rng_state); }

static inline double rng_uniform(void) { return ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0; }

static inline double rng_normal(double mean, double sd)
{
    double u1 = rng_uniform(), u2 = rng_uniform();
    return mean + sd * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static inline bool small_mode(void)
{
    const char *e = getenv("AR_GPU_SMALL");
    return e && e[0] == '1';
}

static inline ar_run_config mla_cfg(int heads, int block_size, int num_blocks, ar_dtype dt, ar_dtype kv_dt, double kv_scale)
{
    ar_run_config c;
    memset(&c, 0, sizeof c);
    tu_mla_model(&c.model, "deepseek-v3-test", heads, 1);
    c.block_size = block_size;
    c.num_blocks = num_blocks;
    c.dtype = dt;
    c.kv_dtype = kv_dt;
    c.kv_scale = kv_scale;
    c.num_layers = 1;
    c.seed = 1234;
    c.data = AR_DATA_NORMAL;
    c.fault = AR_FAULT_NONE;
    c.repeat = 1;
    return c;
}

/* true when the backend can run here; otherwise prints the reason (the caller skips). */
static inline bool gpu_ready(void)
{
    ar_run_config c = mla_cfg(16, 64, 64, AR_BF16, AR_BF16, 1.0);
    char why[256] = "";
    if (ar_cuda_mla_backend.check(&c, why, sizeof why)) return true;
    print_message("skipping: %s\n", why);
    return false;
}

#define SKIP_WITHOUT_GPU() \
    do {                   \
        if (!gpu_ready()) { \
            skip();        \
            return;        \
        }                  \
    } while (0)


/* Failure lines printed by the current test (at most 30 per test; reset by test_setup). */
static int fail_lines = 0;
static struct timespec test_start;

/* Per-test setup / teardown: resets the failure-line budget and prints the test's wall time
 * (the device run has a time budget; this shows where it goes). */
static inline int test_setup(void **st)
{
    (void)st;
    fail_lines = 0;
    clock_gettime(CLOCK_MONOTONIC, &test_start);
    return 0;
}

static inline int test_teardown(void **st)
{
    (void)st;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    print_message("(test wall time %.1f s)\n",
                  (double)(now.tv_sec - test_start.tv_sec) + 1e-9 * (double)(now.tv_nsec - test_start.tv_nsec));
    return 0;
}

/* A tiny case (1 request, 64 heads, 20 keys, bf16 queries, latent cache kv_dtype) forced to the
 * wgmma kernel, untimed and unchecked: run_case's code, the kernel that ran in *r. */
static inline int wgmma_probe(ar_dtype kv_dtype, ar_cuda_mla_result *r, char *why, size_t why_len)
{
    int one = 20;
    ar_cuda_mla_case c;
    memset(&c, 0, sizeof c);
    c.batch = 1;
    c.s_q = 1;
    c.h_q = 64;
    c.seqlens_k = &one;
    c.block_size = 64;
    c.dtype = AR_BF16;
    c.kv_dtype = kv_dtype;
    c.kv_scale = kv_dtype == AR_FP8_E4M3 ? 0.5 : 1.0;
    c.scale = 1.0 / 24.0;
    c.seed = 1;
    c.kernel = AR_MLA_KERNEL_TC_WGMMA;
    memset(r, 0, sizeof *r);
    return ar_cuda_mla_run_case(&c, r, why, why_len);
}

/* Whether the wgmma kernel (AR_MLA_KERNEL_TC_WGMMA) runs on this device (the hook refuses it
 * with code 2 off compute capability 9.0); why says why not. */
static inline bool wgmma_available(char *why, size_t why_len)
{
    ar_cuda_mla_result r;
    int rc = wgmma_probe(AR_BF16, &r, why, why_len);
    if (rc == 0 && (!r.kernel_name || strcmp(r.kernel_name, "tc-wgmma") != 0)) {
        snprintf(why, why_len, "forced wgmma case ran %s", r.kernel_name ? r.kernel_name : "?");
        return false;
    }
    return rc == 0;
}

/* Skips the calling test (with the reason) where the wgmma kernels cannot run. */
static inline void require_wgmma(void)
{
    char why[512] = "";
    if (!wgmma_available(why, sizeof why)) {
        print_message("skipping: %s\n", why);
        skip();
    }
}

#endif
