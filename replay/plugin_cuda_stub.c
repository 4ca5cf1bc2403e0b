/* plugin_cuda_stub.c - plugin_dev.h on a build without nvcc: the probe says why a CUDA plugin
 * cannot run, and every other call fails the same way (none is reached once the probe fails). */
#include <stdio.h>

#include "plugin_dev.h"

static const char stub_reason[] = "built without CUDA (no nvcc when attnreplay was built)";

static int fail(char *err, size_t err_len)
{
    snprintf(err, err_len, "%s", stub_reason);
    return 3;
}

int ar_pdev_probe(char *why, size_t why_len)
{
    snprintf(why, why_len, "%s", stub_reason);
    return 3;
}

int ar_pdev_count(void) { return 0; }

int ar_pdev_open(ar_pdev **d, int device, char *err, size_t err_len)
{
    (void)device;
    *d = NULL;
    return fail(err, err_len);
}

void ar_pdev_close(ar_pdev *d) { (void)d; }
void *ar_pdev_stream(ar_pdev *d) { (void)d; return NULL; }
int ar_pdev_device_id(const ar_pdev *d) { (void)d; return 0; }

void ar_pdev_device_name(const ar_pdev *d, char *buf, size_t len)
{
    (void)d;
    snprintf(buf, len, "none");
}

int ar_pdev_alloc(ar_pdev *d, void **p, size_t bytes, char *err, size_t err_len)
{
    (void)d; (void)bytes;
    *p = NULL;
    return fail(err, err_len);
}

void ar_pdev_free(ar_pdev *d, void *p) { (void)d; (void)p; }

int ar_pdev_memset(ar_pdev *d, void *p, int value, size_t bytes, char *err, size_t err_len)
{
    (void)d; (void)p; (void)value; (void)bytes;
    return fail(err, err_len);
}

int ar_pdev_upload(ar_pdev *d, void *dst, const void *src, size_t bytes, char *err, size_t err_len)
{
    (void)d; (void)dst; (void)src; (void)bytes;
    return fail(err, err_len);
}

int ar_pdev_download(ar_pdev *d, void *dst, const void *src, size_t bytes, char *err, size_t err_len)
{
    (void)d; (void)dst; (void)src; (void)bytes;
    return fail(err, err_len);
}

int ar_pdev_gen_inputs(ar_pdev *d, const ar_pdev_gen *g, int num_tokens, const uint64_t *qkey,
                       const int32_t *pos, const uint64_t *kvkey, void *q, void *k_new, void *v_new,
                       char *err, size_t err_len)
{
    (void)d; (void)g; (void)num_tokens; (void)qkey; (void)pos; (void)kvkey; (void)q; (void)k_new; (void)v_new;
    return fail(err, err_len);
}

int ar_pdev_write_kv(ar_pdev *d, const ar_pdev_gen *g, int num_tokens, const int64_t *slot_mapping,
                     const void *k_new, const void *v_new, void *cache, char *err, size_t err_len)
{
    (void)d; (void)g; (void)num_tokens; (void)slot_mapping; (void)k_new; (void)v_new; (void)cache;
    return fail(err, err_len);
}

int ar_pdev_fill(ar_pdev *d, const ar_pdev_gen *g, int count, const int64_t *slots,
                 const uint64_t *keys, const int32_t *offsets, void *cache, char *err, size_t err_len)
{
    (void)d; (void)g; (void)count; (void)slots; (void)keys; (void)offsets; (void)cache;
    return fail(err, err_len);
}

int ar_pdev_mla_weights(ar_pdev *d, const ar_pdev_gen *g, const ar_pdev_mla *m, float *w_uk, float *w_uv,
                        char *err, size_t err_len)
{
    (void)d; (void)g; (void)m; (void)w_uk; (void)w_uv;
    return fail(err, err_len);
}

int ar_pdev_mla_gen_inputs(ar_pdev *d, const ar_pdev_gen *g, const ar_pdev_mla *m, int num_tokens,
                           const uint64_t *qkey, const int32_t *pos, const uint64_t *kvkey, const float *w_uk,
                           void *q, void *lat, char *err, size_t err_len)
{
    (void)d; (void)g; (void)m; (void)num_tokens; (void)qkey; (void)pos; (void)kvkey; (void)w_uk; (void)q; (void)lat;
    return fail(err, err_len);
}

int ar_pdev_mla_vproj(ar_pdev *d, const ar_pdev_gen *g, const ar_pdev_mla *m, int num_tokens, const void *o_lat,
                      const float *w_uv, float *out, char *err, size_t err_len)
{
    (void)d; (void)g; (void)m; (void)num_tokens; (void)o_lat; (void)w_uv; (void)out;
    return fail(err, err_len);
}

int ar_pdev_reserve_events(ar_pdev *d, int n, char *err, size_t err_len)
{
    (void)d; (void)n;
    return fail(err, err_len);
}

int ar_pdev_record(ar_pdev *d, int i, char *err, size_t err_len)
{
    (void)d; (void)i;
    return fail(err, err_len);
}

int ar_pdev_elapsed_us(ar_pdev *d, int a, int b, double *us, char *err, size_t err_len)
{
    (void)d; (void)a; (void)b;
    *us = 0;
    return fail(err, err_len);
}

int ar_pdev_sync(ar_pdev *d, char *err, size_t err_len)
{
    (void)d;
    return fail(err, err_len);
}

int ar_pdev_guard_set(ar_pdev *d, void *p, char *err, size_t err_len)
{
    (void)d; (void)p;
    return fail(err, err_len);
}

int ar_pdev_guard_count(ar_pdev *d, const void *p, int *bad, char *err, size_t err_len)
{
    (void)d; (void)p;
    *bad = 0;
    return fail(err, err_len);
}
