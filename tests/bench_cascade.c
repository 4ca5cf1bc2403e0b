/* bench_cascade.c - cascade attention vs flat attention on the "cuda" backend, in the same run
 * (issue 5): decode batches of 128 requests (one new token each) that share a prefix of P =
 * 1k, 8k or 32k tokens (the same physical blocks, as vLLM's prefix cache gives them) and have
 * unique suffixes of S = 128 or 256 tokens (the new token included); Hq 32, Hkv 8, head size
 * 128, bf16, block 16.
 *
 * Each case fills the cache once, then times through the backend's own forward() (CUDA events,
 * one warm-up, median of REPEAT): flat (common_prefix_len 0: attention + split combine) and
 * cascade (common_prefix_len P: prefix + suffix + merge); the KV write is left out of both.
 * It prints both times, their ratio, the ideal bytes ratio B(P+S) / (P + B S) (K/V read once
 * per request vs once in all), the prefix pass's TFLOP/s (4 T Hq P hd flops) and the largest
 * |cascade - flat| over the outputs (both are rounded to bf16; a big value means a bug).
 * Target (issue 5): cascade >= 20x faster at P 32k, S 128.
 *
 * At P 32k, S 128 it also sweeps the prefix pass's plan (geometry x split count, "SWEEP" lines)
 * and the suffix pass's (kernel x split count x merge fused or separate, the prefix pass's
 * split combine folded into the suffix pass or not: "SUFFIX" lines).
 * Every case also times the flat pass on each decode kernel, DECODE and DECODE_TMA ("FLAT"
 * lines; AR_CASC_FLAT_TMA=0 leaves them out), the evidence behind the automatic choice.
 *
 * Usage: bench_cascade [REPEAT] (default 20).  One "RESULT name=..." line per case, then a
 * table.  Skips with the backend's reason when there is no GPU.  AR_CASC_ONLY=P:S runs that
 * case alone and AR_CASC_SWEEPS=0 leaves the sweeps out (for profilers); AR_CASC_HOT_PREFIX=1
 * points the whole shared prefix at 8 blocks (a cache-resident prefix: how much of the prefix
 * pass's time is waiting for K/V). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/paged/cuda_backend.h"

#define CASC_BATCH 128
#define CASC_HQ 32
#define CASC_HKV 8
#define CASC_HD 128
#define CASC_BLOCK 16

typedef struct casc_row {
    int prefix, suffix;
    double flat_us, casc_us, prefix_us, suffix_us, merge_us, ideal, prefix_tflops, max_diff;
    int prefix_splits, prefix_work, prefix_config, flat_splits;
    int ok;
} casc_row;

static uint64_t bench_mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    return x;
}

/* Attention time of one forward (everything but the KV write). */
static double attention_us(const ar_forward_out *o)
{
    double us = 0;
    for (int k = 0; k < o->num_kernels; k++)
        if (strcmp(o->kernels[k].name, "write") != 0) us += o->kernels[k].us;
    return us;
}

static double kernel_us(const ar_forward_out *o, const char *name)
{
    for (int k = 0; k < o->num_kernels; k++)
        if (strcmp(o->kernels[k].name, name) == 0) return o->kernels[k].us;
    return 0;
}

/* max |a - b| over n elements; a NaN anywhere reads as infinity */
static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double md = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) d = INFINITY;
        if (d > md) md = d;
    }
    return md;
}

/* prepare + forward of batch b into out/lse; 0 ok, else the backend's error in err */
static int forward_once(void *st, ar_batch *b, float *out, float *lse, ar_forward_out *o, char *err, size_t err_len)
{
    memset(o, 0, sizeof *o);
    o->out = out;
    o->lse = lse;
    return ar_cuda_backend.prepare(st, b, err, err_len) || ar_cuda_backend.forward(st, 0, b, o, err, err_len);
}

/* The prefix pass under other plans (geometry x split count) on the prepared cascade batch b:
 * one "SWEEP" line each with its prefix time, TFLOP/s and max |cascade - flat| (out_flat
 * [T, Hq, hd], as in run_case), for choosing the automatic plan.  auto_us is the automatic
 * plan's prefix time.  0 ok, 1 error or a variant that disagrees with flat. */
static int sweep_prefix_plans(void *st, ar_batch *b, const float *out_flat, float *out, float *lse, double auto_us)
{
    static const int configs[] = {0, 2}; /* AR_CFG_PREFILL (mma.sync, 128 x 32 tiles), AR_CFG_PREFILL_WG (wgmma,
                                            128 x 128, Hopper with tensor maps) */
    static const int splits[] = {0, 4, 7, 8, 12, 16, 24, 33};
    const double flops = 4.0 * b->num_tokens * CASC_HQ * (double)b->common_prefix_len * CASC_HD;
    printf("prefix plan sweep at P %d, T %d (auto: %.1f us):\n", b->common_prefix_len, b->num_tokens, auto_us);
    char err[512] = "";
    int bad = 0;
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++)
        for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++) {
            ar_cuda_set_prefix_plan(st, configs[c], splits[k]);
            ar_forward_out o;
            if (forward_once(st, b, out, lse, &o, err, sizeof err)) {
                printf("ERROR prefix sweep config %d splits %d: %s\n", configs[c], splits[k], err);
                ar_cuda_set_prefix_plan(st, -1, 0);
                return 1;
            }
            ar_cuda_plan_info pi;
            ar_cuda_plan_of(st, &pi);
            const double us = kernel_us(&o, "prefix");
            const double md = max_abs_diff(out, out_flat, (size_t)b->num_tokens * CASC_HQ * CASC_HD);
            printf("SWEEP prefix config=%d splits_asked=%d splits=%d work=%d prefix_us=%.1f tflops=%.1f suffix_us=%.1f "
                   "max_diff=%.3g%s\n", pi.prefix_config, splits[k], pi.prefix_num_splits, pi.prefix_num_work, us,
                   flops / us * 1e-6, kernel_us(&o, "suffix"), md, md < 0.05 ? "" : " DISAGREES");
            if (!(md < 0.05)) bad = 1;
        }
    ar_cuda_set_prefix_plan(st, -1, 0);
    return bad;
}

/* The suffix pass and the merge under other plans, the prefix pass kept on its automatic plan
 * (prefix_config, prefix_splits): merge fused into the suffix pass or separate, times the
 * suffix pass's kernel and split count (config -1 / splits 0 = its rules: DECODE_TMA on the
 * H200 at this shape, DECODE when a split is asked), and the prefix pass's split combine
 * folded into the suffix pass (the default) or run as its own kernel: one "SUFFIX" line each
 * with the suffix, merge and whole-step attention times and max |cascade - flat|.  0 ok, 1
 * error or disagreement. */
static int sweep_suffix_plans(void *st, ar_batch *b, const float *out_flat, float *out, float *lse, int prefix_config,
                              int prefix_splits)
{
    static const struct { int fused, config, splits, fold; } plans[] = {
        {1, -1, 0, 1}, {1, -1, 0, 0}, {1, -1, 1, 1}, {1, -1, 2, 1}, {1, -1, 3, 1}, {1, -1, 4, 1}, {1, 1, 0, 1},
        {0, -1, 0, 1}, {0, -1, 1, 1}, {0, -1, 2, 1}, {0, -1, 3, 1}, {0, -1, 4, 1}, {0, 1, 0, 1}};
    char err[512] = "";
    int bad = 0;
    for (size_t k = 0; k < sizeof plans / sizeof plans[0] && !bad; k++) {
        ar_cuda_set_cascade_merge(st, plans[k].fused);
        ar_cuda_set_cascade_fold(st, plans[k].fold);
        ar_cuda_set_plan(st, plans[k].config, plans[k].splits);
        ar_cuda_set_prefix_plan(st, prefix_config, prefix_splits);
        ar_forward_out o;
        if (forward_once(st, b, out, lse, &o, err, sizeof err)) {
            printf("ERROR suffix sweep fused %d config %d splits %d fold %d: %s\n", plans[k].fused, plans[k].config,
                   plans[k].splits, plans[k].fold, err);
            bad = 1;
            break;
        }
        ar_cuda_plan_info pi;
        ar_cuda_plan_of(st, &pi);
        const double md = max_abs_diff(out, out_flat, (size_t)b->num_tokens * CASC_HQ * CASC_HD);
        printf("SUFFIX fused=%d config=%d splits_asked=%d splits=%d work=%d folded=%d suffix_us=%.1f merge_us=%.1f "
               "prefix_us=%.1f cascade_us=%.1f max_diff=%.3g%s\n", plans[k].fused, pi.config, plans[k].splits,
               pi.num_splits, pi.num_work, pi.prefix_combine_folded, kernel_us(&o, "suffix"), kernel_us(&o, "merge"),
               kernel_us(&o, "prefix"), attention_us(&o), md, md < 0.05 ? "" : " DISAGREES");
        if (!(md < 0.05)) bad = 1;
    }
    ar_cuda_set_cascade_fold(st, 1);
    ar_cuda_set_cascade_merge(st, 1);
    ar_cuda_set_plan(st, -1, 0);
    ar_cuda_set_prefix_plan(st, -1, 0);
    return bad;
}

/* Runs one (P, S) case; 0 ok, 1 error, 2 skipped (no GPU). */
static int run_case(int P, int S, int repeat, casc_row *row)
{
    const int B = CASC_BLOCK, R = CASC_BATCH, T = R;
    memset(row, 0, sizeof *row);
    row->prefix = P;
    row->suffix = S;
    ar_run_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model.name, sizeof c.model.name, "bench-cascade");
    c.model.attention = AR_ATTN_MHA;
    c.model.num_layers = 1;
    c.model.num_q_heads = CASC_HQ;
    c.model.num_kv_heads = CASC_HKV;
    c.model.head_size = CASC_HD;
    c.model.v_head_dim = CASC_HD;
    c.model.scale = 1.0 / sqrt((double)CASC_HD);
    c.block_size = B;
    c.dtype = AR_BF16;
    c.kv_dtype = AR_BF16;
    c.kv_scale = 1.0;
    c.num_layers = 1;
    c.seed = 11;
    c.cascade_mode = 2;
    c.repeat = repeat;
    const int shared = P / B, own = (S + B - 1) / B, mbpr = shared + own;
    c.num_blocks = 1 + shared + R * own;
    char why[256] = "";
    if (!ar_cuda_backend.check(&c, why, sizeof why)) {
        printf("SKIP cascade P %d S %d: %s\n", P, S, why);
        return 2;
    }
    void *st = NULL;
    char err[512] = "";
    if (ar_cuda_backend.open(&c, &st, err, sizeof err)) {
        printf("ERROR cascade P %d S %d: %s\n", P, S, err);
        return 1;
    }
    int *qsl = calloc((size_t)R + 1, sizeof(int)), *seq = calloc((size_t)R, sizeof(int));
    int *ctx = calloc((size_t)R, sizeof(int)), *bt = calloc((size_t)R * mbpr, sizeof(int));
    uint64_t *bkeys = calloc((size_t)R * mbpr, sizeof(uint64_t)), *rkeys = calloc((size_t)R, sizeof(uint64_t));
    int64_t *slots = calloc((size_t)T, sizeof(int64_t));
    int fill_count = P + R * (S - 1);
    int64_t *fslots = calloc((size_t)fill_count, sizeof(int64_t));
    uint64_t *fkeys = calloc((size_t)fill_count, sizeof(uint64_t));
    int *foffs = calloc((size_t)fill_count, sizeof(int));
    size_t no = (size_t)T * CASC_HQ * CASC_HD;
    float *out_flat = malloc(sizeof(float) * no), *out_casc = malloc(sizeof(float) * no);
    float *lse = malloc(sizeof(float) * (size_t)T * CASC_HQ);
    if (!qsl || !seq || !ctx || !bt || !bkeys || !rkeys || !slots || !fslots || !fkeys || !foffs || !out_flat ||
        !out_casc || !lse) {
        printf("ERROR cascade P %d S %d: out of memory\n", P, S);
        return 1;
    }
    /* blocks: the shared prefix 1 .. shared, then each request's own ones, scrambled */
    const char *hot = getenv("AR_CASC_HOT_PREFIX");
    const int hot_prefix = hot && strcmp(hot, "1") == 0;
    const int nb_own = R * own;
    int fk = 0;
    for (int i = 0; i < shared; i++) {
        for (int p = 0; p < B; p++) {
            fslots[fk] = (int64_t)(1 + i) * B + p;
            fkeys[fk] = bench_mix(7 + (uint64_t)i);
            foffs[fk] = p;
            fk++;
        }
    }
    for (int r = 0; r < R; r++) {
        seq[r] = P + S;
        ctx[r] = P + S - 1;
        qsl[r + 1] = r + 1;
        rkeys[r] = bench_mix(5000 + (uint64_t)r);
        for (int i = 0; i < mbpr; i++) {
            if (i < shared) {
                const int blk = hot_prefix ? i % 8 : i;   /* AR_CASC_HOT_PREFIX: 8 blocks, always cached */
                bt[r * mbpr + i] = 1 + blk;
                bkeys[r * mbpr + i] = bench_mix(7 + (uint64_t)blk);
            } else {
                int k = r * own + (i - shared);
                bt[r * mbpr + i] = 1 + shared + (int)(((int64_t)k * 7919) % nb_own);
                bkeys[r * mbpr + i] = bench_mix(1000003 * (uint64_t)(r + 1) + (uint64_t)i);
            }
        }
        for (int p = P; p < ctx[r]; p++) {
            fslots[fk] = (int64_t)bt[r * mbpr + p / B] * B + p % B;
            fkeys[fk] = bkeys[r * mbpr + p / B];
            foffs[fk] = p % B;
            fk++;
        }
        int p = ctx[r];
        slots[r] = (int64_t)bt[r * mbpr + p / B] * B + p % B;
    }
    int rc = 0;
    ar_fill f = {fk, fslots, fkeys, foffs};
    if (ar_cuda_backend.fill(st, 0, &f, err, sizeof err)) {
        printf("ERROR cascade P %d S %d: fill: %s\n", P, S, err);
        rc = 1;
    }
    ar_batch b = {1, R, T, qsl, seq, ctx, 1, P + S, mbpr, bt, bkeys, rkeys, slots, 0};
    ar_forward_out o;
    ar_cuda_plan_info pi;
    for (int pass = 0; pass < 2 && !rc; pass++) {
        b.common_prefix_len = pass ? P : 0;
        if (forward_once(st, &b, pass ? out_casc : out_flat, lse, &o, err, sizeof err)) {
            printf("ERROR cascade P %d S %d (%s): %s\n", P, S, pass ? "cascade" : "flat", err);
            rc = 1;
            break;
        }
        ar_cuda_plan_of(st, &pi);
        if (!pass) {
            row->flat_us = attention_us(&o);
            row->flat_splits = pi.num_splits;
        } else {
            row->casc_us = attention_us(&o);
            row->prefix_us = kernel_us(&o, "prefix");
            row->suffix_us = kernel_us(&o, "suffix");
            row->merge_us = kernel_us(&o, "merge");
            row->prefix_splits = pi.prefix_num_splits;
            row->prefix_work = pi.prefix_num_work;
            row->prefix_config = pi.prefix_config;
        }
    }
    if (!rc) {
        const double md = max_abs_diff(out_casc, out_flat, no);
        row->max_diff = md;
        row->ideal = (double)R * (P + S) / ((double)P + (double)R * S);
        row->prefix_tflops = 4.0 * T * CASC_HQ * (double)P * CASC_HD / row->prefix_us * 1e-6;
        row->ok = md < 0.05;
        printf("RESULT name=cascade_b128_p%d_s%d flat_us=%.1f cascade_us=%.1f speedup=%.2f ideal=%.1f "
               "prefix_us=%.1f suffix_us=%.1f merge_us=%.1f prefix_tflops=%.1f prefix_config=%d prefix_splits=%d "
               "prefix_work=%d flat_splits=%d max_diff=%.3g\n", P, S, row->flat_us, row->casc_us,
               row->flat_us / row->casc_us, row->ideal, row->prefix_us, row->suffix_us, row->merge_us,
               row->prefix_tflops, row->prefix_config, row->prefix_splits, row->prefix_work, row->flat_splits, md);
        if (!row->ok) rc = 1;
    }
    /* the flat pass on each decode kernel, DECODE (config 1, split-KV) and DECODE_TMA (3, one
     * CTA per request, never split): how they compare, for the automatic rule */
    const char *ft = getenv("AR_CASC_FLAT_TMA");
    for (int fc = 0; fc < 2 && !rc && !(ft && strcmp(ft, "0") == 0); fc++) {
        const int config = fc ? 3 : 1;
        b.common_prefix_len = 0;
        ar_cuda_set_plan(st, config, 0);
        if (forward_once(st, &b, out_casc, lse, &o, err, sizeof err)) {
            printf("ERROR cascade P %d S %d (flat on config %d): %s\n", P, S, config, err);
            rc = 1;
        } else {
            ar_cuda_plan_of(st, &pi);
            const double md = max_abs_diff(out_casc, out_flat, no);
            printf("FLAT name=flat_b128_p%d_s%d config_asked=%d config=%d splits=%d us=%.1f auto_us=%.1f max_diff=%.3g%s\n",
                   P, S, config, pi.config, pi.num_splits, attention_us(&o), row->flat_us, md,
                   md < 0.05 ? "" : " DISAGREES");
            if (!(md < 0.05)) rc = 1;
        }
        ar_cuda_set_plan(st, -1, 0);
        b.common_prefix_len = P;
    }
    const char *sw = getenv("AR_CASC_SWEEPS");
    const int sweeps = P == 32768 && S == 128 && !(sw && strcmp(sw, "0") == 0);
    if (!rc && sweeps) rc = sweep_prefix_plans(st, &b, out_flat, out_casc, lse, row->prefix_us);
    if (!rc && sweeps)
        rc = sweep_suffix_plans(st, &b, out_flat, out_casc, lse, row->prefix_config, row->prefix_splits);
    ar_cuda_backend.close(st);
    free(qsl); free(seq); free(ctx); free(bt); free(bkeys); free(rkeys); free(slots);
    free(fslots); free(fkeys); free(foffs); free(out_flat); free(out_casc); free(lse);
    return rc;
}

int main(int argc, char **argv)
{
    int repeat = argc > 1 ? atoi(argv[1]) : 20;
    if (repeat < 1) repeat = 20;
    static const int prefixes[] = {1024, 8192, 32768};
    static const int suffixes[] = {128, 256};
    casc_row rows[6];
    int n = 0, rc = 0, only_p = 0, only_s = 0;
    const char *only = getenv("AR_CASC_ONLY");
    if (only && sscanf(only, "%d:%d", &only_p, &only_s) != 2) {
        fprintf(stderr, "bench_cascade: AR_CASC_ONLY=%s: expected PREFIX:SUFFIX, e.g. 32768:128\n", only);
        return 1;
    }
    int matched = 0;
    for (int p = 0; p < 3; p++)
        for (int s = 0; s < 2; s++) {
            if (only && (prefixes[p] != only_p || suffixes[s] != only_s)) continue;
            matched++;
            int r = run_case(prefixes[p], suffixes[s], repeat, &rows[n]);
            if (r == 2) return 0;
            if (r == 0) n++;
            else rc = 1;
        }
    if (!matched) {
        fprintf(stderr, "bench_cascade: AR_CASC_ONLY=%s: not one of the cases (prefix 1024, 8192 or 32768; suffix 128 or 256)\n",
                only);
        return 1;
    }
    printf("\ncascade vs flat, decode B=128, Hq 32 / Hkv 8, hd 128, bf16, block 16 (attention us, KV write excluded)\n");
    printf("| prefix | suffix | flat us | cascade us | speedup | ideal bytes ratio | prefix us (TFLOP/s, splits) | suffix us | merge us | max |c-f| |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < n; i++)
        printf("| %d | %d | %.1f | %.1f | %.2fx | %.1fx | %.1f (%.0f, %d) | %.1f | %.1f | %.3g |\n", rows[i].prefix,
               rows[i].suffix, rows[i].flat_us, rows[i].casc_us, rows[i].flat_us / rows[i].casc_us, rows[i].ideal,
               rows[i].prefix_us, rows[i].prefix_tflops, rows[i].prefix_splits, rows[i].suffix_us, rows[i].merge_us,
               rows[i].max_diff);
    for (int i = 0; i < n; i++)
        if (rows[i].prefix == 32768 && rows[i].suffix == 128)
            printf("target (>= 20x at prefix 32k, suffix 128): %.2fx -> %s\n", rows[i].flat_us / rows[i].casc_us,
                   rows[i].flat_us / rows[i].casc_us >= 20.0 ? "met" : "MISSED");
    return rc;
}
