/* ref_gpu_stub.c - the device reference (ref_gpu.h) in a build without nvcc: the same symbols,
 * available() says why not, open() fails cleanly, and the verifier keeps to the host.  The
 * Makefile compiles this file only when nvcc is absent. */
#include "ref_gpu.h"

#include <stdio.h>
#include <string.h>

static const char stub_reason[] = "built without CUDA (nvcc not found)";

bool ar_gpu_ref_available(char *why, size_t why_len)
{
    snprintf(why, why_len, "%s", stub_reason);
    return false;
}

int ar_gpu_ref_open(ar_gpu_ref **g, const ar_run_config *cfg, size_t mem_budget, char *err, size_t err_len)
{
    (void)cfg;
    (void)mem_budget;
    *g = NULL;
    snprintf(err, err_len, "device reference: %s", stub_reason);
    return -1;
}

int ar_gpu_ref_nan_count(ar_gpu_ref *g, const ar_batch *b, const ar_gpu_ref_output *o, int64_t *nan_count,
                         char *err, size_t err_len)
{
    (void)g;
    (void)b;
    (void)o;
    *nan_count = 0;
    snprintf(err, err_len, "device reference: %s", stub_reason);
    return -1;
}

int ar_gpu_ref_check(ar_gpu_ref *g, const ar_batch *b, int layer, const ar_gpu_ref_rows *rows,
                     const ar_gpu_ref_output *o, const volatile int *cancel, ar_gpu_ref_copy *copy,
                     ar_gpu_ref_summary *sum, char *err, size_t err_len)
{
    (void)g;
    (void)b;
    (void)layer;
    (void)rows;
    (void)o;
    (void)cancel;
    (void)copy;
    memset(sum, 0, sizeof *sum);
    snprintf(err, err_len, "device reference: %s", stub_reason);
    return -1;
}

void ar_gpu_ref_get_stats(const ar_gpu_ref *g, ar_gpu_ref_stats *st)
{
    (void)g;
    memset(st, 0, sizeof *st);
}

void ar_gpu_ref_close(ar_gpu_ref *g) { (void)g; }

int ar_gpu_ref_test_write(void *dst, const void *src, size_t bytes)
{
    (void)dst;
    (void)src;
    (void)bytes;
    return -1;
}
