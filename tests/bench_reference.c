/* bench_reference.c - times the grouped float64 reference (ar_ref_attend) against its naive twin
 * (ar_ref_attend_naive) on the same shapes in the same run, single-threaded, and prints GFLOP/s
 * for both and their ratio.  FLOPs = 4 x visible keys x num_q_heads x head_size per query row
 * (q.k and p.v, a multiply and an add each).  Shapes: a chunked-prefill step (one request,
 * 256 new tokens after 1792 cached, 32 q / 8 kv heads, head size 128, causal) and a
 * decode-heavy step (64 requests, one new token each, contexts 1024..2047).  All requests of a
 * shape read their keys from one shared 2048-key K/V buffer (32 MB): the point is to compare
 * the two loop structures, not to stream gigabytes through a shared 2-core machine. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../reference/datagen.h"
#include "../reference/reference.h"

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* a [rows, width] from the generator, rounded to bf16 like a bf16 run's inputs */
static void fill_gen(double *a, size_t rows, int width, uint32_t stream, uint64_t key)
{
    for (size_t i = 0; i < rows; i++) {
        uint64_t row = ar_gen_row(1, stream, 0, key, i, 0);
        for (int d = 0; d < width; d++)
            a[i * width + d] = ar_gen(row, (uint32_t)d, AR_DATA_NORMAL, AR_BF16);
    }
}

/* One request of a step: its new rows; its keys are the first num_keys of the shared pool. */
typedef struct bench_req {
    int num_rows, num_keys;
    double *q;           /* [rows, hq, hd] */
    const double *k, *v; /* [keys, hkv, hd] each, pointing into the pool */
    int *q_pos;          /* [rows] */
    double *out_fast, *out_naive, *lse_fast, *lse_naive;
} bench_req;

typedef void (*attend_fn)(const ar_attn_params *, int, const double *, const int *, int, int,
                          const double *, const double *, double *, double *);

static double run_step(const ar_attn_params *p, bench_req *reqs, int num_reqs, attend_fn fn,
                       int fast)
{
    double t0 = now_seconds();
    for (int r = 0; r < num_reqs; r++) {
        bench_req *q = &reqs[r];
        fn(p, q->num_rows, q->q, q->q_pos, q->num_keys, 0, q->k, q->v,
           fast ? q->out_fast : q->out_naive, fast ? q->lse_fast : q->lse_naive);
    }
    return now_seconds() - t0;
}

static int bench_shape(const char *name, int num_reqs, const int *contexts, const int *news)
{
    ar_attn_params p = {32, 8, 128, 128, 1.0 / sqrt(128.0), 0, 0.0, true};
    enum { POOL_KEYS = 2048 };
    bench_req *reqs = calloc((size_t)num_reqs, sizeof *reqs);
    size_t pool_len = (size_t)POOL_KEYS * p.num_kv_heads * p.head_size;
    double *pool_k = malloc(pool_len * sizeof(double)), *pool_v = malloc(pool_len * sizeof(double));
    if (!reqs || !pool_k || !pool_v) return 1;
    fill_gen(pool_k, (size_t)POOL_KEYS * p.num_kv_heads, p.head_size, AR_STREAM_K, 0);
    fill_gen(pool_v, (size_t)POOL_KEYS * p.num_kv_heads, p.head_size, AR_STREAM_V, 0);
    double flops = 0;
    for (int r = 0; r < num_reqs; r++) {
        bench_req *q = &reqs[r];
        q->num_rows = news[r];
        q->num_keys = contexts[r] + news[r];
        size_t nq = (size_t)q->num_rows * p.num_q_heads * p.head_size;
        size_t nl = (size_t)q->num_rows * p.num_q_heads;
        q->q = malloc(nq * sizeof(double));
        if (q->num_keys > POOL_KEYS) return 1;
        q->k = pool_k;
        q->v = pool_v;
        q->q_pos = malloc((size_t)q->num_rows * sizeof(int));
        q->out_fast = malloc(nq * sizeof(double));
        q->out_naive = malloc(nq * sizeof(double));
        q->lse_fast = malloc(nl * sizeof(double));
        q->lse_naive = malloc(nl * sizeof(double));
        if (!q->q || !q->q_pos || !q->out_fast || !q->out_naive ||
            !q->lse_fast || !q->lse_naive) {
            fprintf(stderr, "bench_reference: out of memory\n");
            return 1;
        }
        fill_gen(q->q, (size_t)q->num_rows * p.num_q_heads, p.head_size, AR_STREAM_Q, (uint64_t)r);
        for (int i = 0; i < q->num_rows; i++) {
            q->q_pos[i] = contexts[r] + i;
            flops += 4.0 * (q->q_pos[i] + 1) * p.num_q_heads * p.head_size;
        }
    }
    double t_fast = run_step(&p, reqs, num_reqs, ar_ref_attend, 1);
    double t_naive = run_step(&p, reqs, num_reqs, ar_ref_attend_naive, 0);
    double worst = 0;
    for (int r = 0; r < num_reqs; r++) {
        size_t nq = (size_t)reqs[r].num_rows * p.num_q_heads * p.head_size;
        for (size_t i = 0; i < nq; i++) {
            double d = fabs(reqs[r].out_fast[i] - reqs[r].out_naive[i]);
            if (!(d <= worst)) worst = d;
        }
    }
    printf("%-44s %7.2f GFLOP  grouped %6.3f s %6.2f GFLOP/s  naive %6.3f s %6.2f GFLOP/s  "
           "ratio %5.2fx  max|diff| %.1e\n",
           name, flops * 1e-9, t_fast, flops * 1e-9 / t_fast, t_naive, flops * 1e-9 / t_naive,
           t_naive / t_fast, worst);
    for (int r = 0; r < num_reqs; r++) {
        free(reqs[r].q); free(reqs[r].q_pos);
        free(reqs[r].out_fast); free(reqs[r].out_naive);
        free(reqs[r].lse_fast); free(reqs[r].lse_naive);
    }
    free(reqs);
    free(pool_k);
    free(pool_v);
    return worst <= 1e-12 ? 0 : 1;
}

int main(void)
{
    int rc = 0;
    printf("float64 reference vs naive, single thread, 32 q / 8 kv heads, head size 128, causal\n");
    const int prefill_context[1] = {1792}, prefill_new[1] = {256};
    rc |= bench_shape("prefill: 1 req, 256 new over 2048 keys", 1, prefill_context, prefill_new);
    enum { DECODES = 64 };
    int contexts[DECODES], news[DECODES];
    for (int r = 0; r < DECODES; r++) {
        contexts[r] = 1024 + (r * 389) % 1024;
        news[r] = 1;
    }
    rc |= bench_shape("decode: 64 reqs x 1 new, contexts 1024..2047", DECODES, contexts, news);
    if (rc) fprintf(stderr, "bench_reference: grouped and naive disagree beyond 1e-12\n");
    return rc;
}
