/* bench_ref_gpu.c - how fast the device reference verifies (reference/ref_gpu.h), on steps shaped
 * like the ones replay meets: a prefill-heavy step of a Mooncake-like trace (llama-3.1-8b heads,
 * every row), decode-heavy steps (every row, and sample:64), and a DeepSeek-V3 MLA step.  Each
 * case runs the backend once (no host copy) and the device check twice: cold (every block
 * generated / up-projected) and warm (the block cache holds them, as at the next step).
 * Phases come from CUDA events (ATTNREPLAY_GPU_REF_PROFILE=1, set here): block generation, the
 * float64 reference, the yardstick, the comparison.  FP64 rate = reference FLOPs / reference
 * time, with FLOPs counted as the verified rows' share of the step's attention (4 x visible keys
 * x heads x head size per row; MLA expanded form: 2 x heads x keys x (192 + 128)).  For MHA by
 * default the requests of few checked rows take the fused kernels, those of many the tiled GEMMs
 * ("fused" counts the rows on the fused kernels), "ref" is both twins' attention and "naive" 0;
 * ATTNREPLAY_GPU_REF_FUSED=0 in the environment measures the separate tiled GEMMs for every row
 * (ref and naive apart), =1 the fused kernels for every row (same results, bit for bit).
 * Each pass also prints the verdict's sums to the last bit, so two builds of the reference can be
 * compared on the same steps.  Skips with a reason without a device.
 * Usage: bench_ref_gpu [case-name-substring] */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../kernels/paged/cuda_backend.h"
#include "../kernels/mla/cuda_mla.h"
#include "../reference/ref_gpu.h"
#include "../replay/verify.h"
#include "cascade_cases.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct bench_case {
    const char *name;
    bool mla;
    int sample_rows;          /* 0: every row */
    int n;
    casc_seq seqs[160];
} bench_case;

/* FLOPs of the float64 reference over the rows verify.c checks. */
static double ref_flops(const ar_run_config *c, const ar_batch *b, const ar_verify_opts *vo)
{
    const ar_model *m = &c->model;
    double per_key = m->attention == AR_ATTN_MLA
                         ? 2.0 * m->num_q_heads * (m->qk_nope_head_dim + m->qk_rope_head_dim + m->v_head_dim)
                         : 4.0 * m->num_q_heads * m->head_size;
    double f = 0;
    int *rows = malloc(sizeof(int) * (size_t)b->num_tokens);
    for (int r = 0; r < b->num_reqs; r++) {
        int n = b->query_start_loc[r + 1] - b->query_start_loc[r];
        int k = ar_verify_choose_rows(vo, n, b->num_tokens, rows);
        for (int i = 0; i < k; i++) f += per_key * (b->context_lens[r] + rows[i] + 1);
    }
    free(rows);
    return f;
}

static void run(const bench_case *bc)
{
    ar_run_config cfg;
    if (bc->mla) {
        cfg = casc_cfg(128, 1, 576, 8192, AR_BF16, 0);
        cfg.model.attention = AR_ATTN_MLA;
        cfg.model.kv_lora_rank = 512;
        cfg.model.qk_rope_head_dim = 64;
        cfg.model.qk_nope_head_dim = 128;
        cfg.model.v_head_dim = 128;
        cfg.model.scale = 0.1352338;
    } else {
        cfg = casc_cfg(32, 8, 128, 131072, AR_BF16, 0);
    }
    cfg.cascade_mode = 0;
    const ar_backend *be = bc->mla ? &ar_cuda_mla_backend : &ar_cuda_backend;
    char why[256] = "", err[512] = "";
    if (!ar_gpu_ref_available(why, sizeof why) || !be->check(&cfg, why, sizeof why)) {
        printf("%-34s skipped: %s\n", bc->name, why);
        return;
    }
    void *state = NULL;
    if (be->open(&cfg, &state, err, sizeof err) != 0) {
        printf("%-34s open: %s\n", bc->name, err);
        return;
    }
    casc_batch t;
    casc_make(&t, &cfg, bc->seqs, bc->n, 0);
    casc_fill(be, state, &cfg, &t, 0, 0);
    ar_forward_out fo;
    memset(&fo, 0, sizeof fo);
    if (be->prepare(state, &t.b, err, sizeof err) != 0 || be->forward(state, 0, &t.b, &fo, err, sizeof err) != 0) {
        printf("%-34s backend: %s\n", bc->name, err);
        be->close(state);
        casc_free(&t);
        return;
    }
    ar_verify_opts vo = {bc->sample_rows > 0 ? AR_VERIFY_SAMPLE : AR_VERIFY_ALL, bc->sample_rows, 0, NULL, NULL};
    int *row0 = malloc(sizeof(int) * (size_t)(t.b.num_reqs + 1)), *rows = malloc(sizeof(int) * (size_t)t.b.num_tokens);
    int nrows = 0;
    for (int r = 0; r < t.b.num_reqs; r++) {
        row0[r] = nrows;
        int n = t.b.query_start_loc[r + 1] - t.b.query_start_loc[r];
        nrows += ar_verify_choose_rows(&vo, n, t.b.num_tokens, rows + nrows);
    }
    row0[t.b.num_reqs] = nrows;
    const double flops = ref_flops(&cfg, &t.b, &vo), attn_us = fo.total_us;
    ar_gpu_ref *g = NULL;
    if (ar_gpu_ref_open(&g, &cfg, 0, err, sizeof err) != 0) {
        printf("%-34s device reference: %s\n", bc->name, err);
    } else {
        ar_gpu_ref_rows gr = {nrows, row0, rows};
        ar_gpu_ref_output go = {fo.dev_out, fo.dev_out_type, fo.dev_lse, fo.dev_stream};
        for (int pass = 0; pass < 2; pass++) {
            ar_gpu_ref_summary s;
            double t0 = now_s();
            int rc = ar_gpu_ref_check(g, &t.b, 0, &gr, &go, NULL, NULL, &s, err, sizeof err);
            double wall = now_s() - t0;
            if (rc != 0) {
                printf("%-34s check: %s\n", bc->name, err);
                break;
            }
            printf("%-34s %-4s rows %6d  ref %8.1f GFLOP  wall %8.1f ms (plan %5.1f)  gen %7.1f  ref %8.1f  naive "
                   "%8.1f  cmp %5.1f ms  FP64 %5.1f TFLOP/s  blocks %6d  groups %3d  fused %6d  backend attn %8.1f us\n",
                   bc->name, pass ? "warm" : "cold", nrows, flops / 1e9, wall * 1e3, s.plan_s * 1e3, s.gen_ms, s.ref_ms,
                   s.naive_ms, s.compare_ms, s.ref_ms > 0 ? flops / (s.ref_ms * 1e-3) / 1e12 : 0, s.generated_blocks,
                   s.groups, s.rows_fused, attn_us);
            /* the verdict's sums, to the last bit: two builds of the reference can be compared */
            printf("%-34s %-4s result: sum_abs %.17g max_abs %.17g naive_sum %.17g naive_max %.17g bad %lld nan %lld\n",
                   bc->name, pass ? "warm" : "cold", s.sum_abs, s.max_abs, s.naive_sum_abs, s.naive_max, (long long)s.bad,
                   (long long)s.nan_count);
        }
        ar_gpu_ref_close(g);
    }
    free(row0);
    free(rows);
    casc_free(&t);
    be->close(state);
}

int main(int argc, char **argv)
{
    setenv("ATTNREPLAY_GPU_REF_PROFILE", "1", 1);
    static bench_case cases[5];
    int nc = 0;
    /* a Mooncake-like prefill step: 2 chunks of 4000 new tokens on 20k / 36k of context, 57
     * decodes at 2k-40k */
    bench_case *c = &cases[nc++];
    c->name = "llama8b mixed step, every row";
    c->n = 59;
    c->seqs[0] = (casc_seq){4000, 24000};
    c->seqs[1] = (casc_seq){4000, 40000};
    for (int i = 2; i < 59; i++) c->seqs[i] = (casc_seq){1, 2000 + (i * 677) % 38000};
    c = &cases[nc++];
    *c = cases[0];
    c->name = "llama8b mixed step, sample:64";
    c->sample_rows = 64;
    c = &cases[nc++];
    c->name = "llama8b 128 decodes at 8k, every row";
    c->n = 128;
    for (int i = 0; i < 128; i++) c->seqs[i] = (casc_seq){1, 8000 + i};
    c = &cases[nc++];
    c->name = "llama8b full prefill 8192, every row";
    c->n = 2;
    c->seqs[0] = (casc_seq){4096, 4096};
    c->seqs[1] = (casc_seq){4096, 12288};
    c = &cases[nc++];
    c->name = "deepseek-v3 64 decodes + prefill";
    c->mla = true;
    c->n = 65;
    for (int i = 0; i < 64; i++) c->seqs[i] = (casc_seq){1, 1300 + i};
    c->seqs[64] = (casc_seq){1024, 1280};
    printf("device reference (reference/ref_gpu.cu): cold = every block made, warm = block cache hits\n");
    for (int i = 0; i < nc; i++)
        if (argc < 2 || strstr(cases[i].name, argv[1])) run(&cases[i]);
    return 0;
}
