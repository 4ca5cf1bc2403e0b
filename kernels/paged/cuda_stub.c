/* cuda_stub.c - the "cuda" backend on a machine without nvcc: the same symbols as
 * cuda_backend.cu, but check() always says why it cannot run and every entry point fails
 * cleanly.  The Makefile compiles this file only when nvcc is absent. */
#include "cuda_backend.h"

#include <stdio.h>
#include <string.h>

static const char stub_reason[] = "built without CUDA (a host-only build: no nvcc, or make demo with no GPU)";

static bool stub_check(const ar_run_config *cfg, char *why, size_t why_len)
{
    (void)cfg;
    snprintf(why, why_len, "%s", stub_reason);
    return false;
}

static int stub_open(const ar_run_config *cfg, void **state, char *err, size_t err_len)
{
    (void)cfg;
    *state = NULL;
    snprintf(err, err_len, "cuda backend: %s", stub_reason);
    return 3;
}

static int stub_prepare(void *state, const ar_batch *b, char *err, size_t err_len)
{
    (void)state;
    (void)b;
    snprintf(err, err_len, "cuda backend: %s", stub_reason);
    return 3;
}

static int stub_fill(void *state, int layer, const ar_fill *f, char *err, size_t err_len)
{
    (void)state;
    (void)layer;
    (void)f;
    snprintf(err, err_len, "cuda backend: %s", stub_reason);
    return 3;
}

static int stub_forward(void *state, int layer, const ar_batch *b, ar_forward_out *o, char *err,
                        size_t err_len)
{
    (void)state;
    (void)layer;
    (void)b;
    (void)o;
    snprintf(err, err_len, "cuda backend: %s", stub_reason);
    return 3;
}

static void stub_device_name(void *state, char *buf, size_t len)
{
    (void)state;
    snprintf(buf, len, "none");
}

static void stub_close(void *state) { (void)state; }

const ar_backend ar_cuda_backend = {
    "cuda",
    "CUDA paged attention (not built: nvcc was not found)",
    "none in this build",
    true,
    stub_check,
    stub_open,
    stub_prepare,
    stub_fill,
    stub_forward,
    stub_device_name,
    stub_close,
};

void ar_cuda_set_plan(void *state, int config, int num_splits)
{
    (void)state;
    (void)config;
    (void)num_splits;
}

void ar_cuda_set_prefix_plan(void *state, int config, int num_splits)
{
    (void)state;
    (void)config;
    (void)num_splits;
}

void ar_cuda_set_cascade_merge(void *state, int fused)
{
    (void)state;
    (void)fused;
}

void ar_cuda_set_cascade_fold(void *state, int fold)
{
    (void)state;
    (void)fold;
}

void ar_cuda_plan_of(void *state, ar_cuda_plan_info *info)
{
    (void)state;
    memset(info, 0, sizeof *info);
}

int ar_cuda_gen_values(uint64_t seed, uint32_t stream, uint32_t layer, uint64_t key, uint64_t pos0,
                       uint32_t head, int num_pos, int dim, ar_datadist dist, ar_dtype dtype,
                       float *out, char *err, size_t err_len)
{
    (void)seed; (void)stream; (void)layer; (void)key; (void)pos0; (void)head;
    (void)num_pos; (void)dim; (void)dist; (void)dtype; (void)out;
    snprintf(err, err_len, "%s", stub_reason);
    return 3;
}

int ar_cuda_merge_states(ar_dtype dtype, int num_tokens, int num_heads, int head_size,
                         const float *prefix_out, const float *prefix_lse, const float *suffix_out,
                         const float *suffix_lse, int no_weights, float *out, float *lse, char *err,
                         size_t err_len)
{
    (void)dtype; (void)num_tokens; (void)num_heads; (void)head_size; (void)prefix_out;
    (void)prefix_lse; (void)suffix_out; (void)suffix_lse; (void)no_weights; (void)out; (void)lse;
    snprintf(err, err_len, "%s", stub_reason);
    return 3;
}

int ar_cuda_poke_guard(void *state)
{
    (void)state;
    return -1;
}
