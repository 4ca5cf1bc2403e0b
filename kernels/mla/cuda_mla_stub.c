/* cuda_mla_stub.c - the "cuda-mla" backend on a machine without nvcc: the same symbols as
 * cuda_mla.cu, but check() always says why it cannot run and every entry point fails cleanly.
 * The Makefile compiles this file only when nvcc is absent (like kernels/paged/cuda_stub.c). */
#include "cuda_mla.h"

#include <stdio.h>
#include <string.h>

static const char mla_stub_reason[] = "built without CUDA (a host-only build: no nvcc, or make demo with no GPU)";

static bool mla_stub_check(const ar_run_config *cfg, char *why, size_t why_len)
{
    (void)cfg;
    snprintf(why, why_len, "%s", mla_stub_reason);
    return false;
}

static int mla_stub_open(const ar_run_config *cfg, void **state, char *err, size_t err_len)
{
    (void)cfg;
    *state = NULL;
    snprintf(err, err_len, "cuda-mla backend: %s", mla_stub_reason);
    return 3;
}

static int mla_stub_prepare(void *state, const ar_batch *b, char *err, size_t err_len)
{
    (void)state;
    (void)b;
    snprintf(err, err_len, "cuda-mla backend: %s", mla_stub_reason);
    return 3;
}

static int mla_stub_fill(void *state, int layer, const ar_fill *f, char *err, size_t err_len)
{
    (void)state;
    (void)layer;
    (void)f;
    snprintf(err, err_len, "cuda-mla backend: %s", mla_stub_reason);
    return 3;
}

static int mla_stub_forward(void *state, int layer, const ar_batch *b, ar_forward_out *o, char *err,
                            size_t err_len)
{
    (void)state;
    (void)layer;
    (void)b;
    (void)o;
    snprintf(err, err_len, "cuda-mla backend: %s", mla_stub_reason);
    return 3;
}

static void mla_stub_device_name(void *state, char *buf, size_t len)
{
    (void)state;
    snprintf(buf, len, "none");
}

static void mla_stub_close(void *state) { (void)state; }

const ar_backend ar_cuda_mla_backend = {
    "cuda-mla",
    "CUDA MLA (not built: nvcc was not found)",
    "none in this build",
    true,
    mla_stub_check,
    mla_stub_open,
    mla_stub_prepare,
    mla_stub_fill,
    mla_stub_forward,
    mla_stub_device_name,
    mla_stub_close,
};

void ar_cuda_mla_set_plan(void *state, ar_cuda_mla_kernel kernel, int num_splits, int use_prefill_path)
{
    (void)state;
    (void)kernel;
    (void)num_splits;
    (void)use_prefill_path;
}

void ar_cuda_mla_set_workspace(void *state, int tokens)
{
    (void)state;
    (void)tokens;
}

void ar_cuda_mla_plan_of(void *state, ar_cuda_mla_plan_info *info)
{
    (void)state;
    memset(info, 0, sizeof *info);
}
