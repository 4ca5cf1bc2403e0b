/* bench_cuda.c - timings of the "cuda" backend on the shapes of issue 4, through the backend's
 * own forward() (data generated on the device, CUDA events, one warm-up, median of --repeat).
 *
 *   decode  : B=64, context 8192, Hq=32, Hkv=8, hd128, bf16, block 16 -> effective GB/s
 *             (K/V bytes read once + Q + O over the attention time, combine included); also
 *             B=32 and B=48 (the batches of attn_plan.c's decode_tma_small_rule), and B=96
 *             and B=128 (its rule's sizes) with an fp8 cache and B=128 with a bf16 one;
 *   prefill : B=2, S=8192, causal, hd128 (16 heads) and hd256 (8 heads) -> TFLOP/s;
 *   varlen  : 16 causal sequences of the lengths in varlen_lens (17,408 tokens), hd128, 16 heads;
 *   lopsided: 121 decodes, one of 135,168 keys among 120 of 2,048 (attn_plan.c's
 *             decode_tma_lopsided), automatic and on DECODE_TMA forced, and 18 decodes, one of
 *             135,168 keys among 17 of 1,280 (the Mooncake trace's lopsided steps) -> effective GB/s;
 *   one long: 128 decodes, one of 16,384 keys among 127 of 8,192: DECODE_TMA's rule takes it and
 *             the uneven rule cuts the long request in 2 (attn_plan.c's decode_tma_splits;
 *             AR_CUDA_DECODE_TMA_SPLITS=1 keeps it whole) -> effective GB/s;
 *   chunk   : one chunked-prefill step of a long request, 8,192 new tokens after 90,112 cached
 *             ones, Hq=32, Hkv=8, hd128: the shape of the Mooncake trace's long mixed steps
 *             (BENCHMARKS.md, real traces), nearly every key tile unmasked -> TFLOP/s.
 * The "_mma" cases force the mma.sync PREFILL kernel (the fallback) where the automatic plan
 * runs the wgmma kernel (head sizes 128 and 256 on a compute-capability 9.0 device).
 * The "_fp8" cases run the same shapes with an fp8 e4m3 cache (vLLM kv_cache_dtype=fp8,
 * kv_scale 1): the decode rows beside the bf16-KV ones, their K/V bytes counted at 1 per element
 * (the bytes actually read, as kernels/peers/fa3_peer.py counts them for FA3's e4m3 paged decode,
 * the peer of decode_b64_s8192_gqa32_8_hd128_fp8 in peer_table.py; FA3 also quantises Q to e4m3,
 * ours keeps Q in bf16 and multiplies in fp16 or bf16: the automatic plan runs the fp8
 * DECODE_TMA, the nosplit / split4 rows the fp8 DECODE); prefill and varlen on the fp8-KV mma.sync PREFILL kernel
 * (the wgmma kernel copies 16-bit tiles and does not take an fp8 cache).
 * FLOPs follow FA3's benchmark: per sequence 2 * H * sq * avg_k * (hd + hd_v) with avg_k the
 * mean number of visible keys of a row (causal, bottom-right).
 *
 * Usage: bench_cuda [REPEAT [CASE]] (default 20 repeats, every case).  AR_BENCH_BLOCK_SIZE=32 or
 * 64 runs every case on a cache of that block size instead of 16 (each RESULT line says which;
 * any other value: exit 2).  The backend's environment knobs (kernels/paged/cuda_backend.cu)
 * apply to the automatic cases; kernels/paged/decode_sweep.sh runs the decode case under each.
 * Each case prints one machine-readable line ("RESULT name=... us=... combine_us=... gbps=...
 * tflops=... kv=..."; us includes the split combine, combine_us is its part)
 * that kernels/device_harness.sh puts beside the torch peers (kernels/peers/peer_attention.py,
 * which uses the same shapes).  Skips with the backend's reason when there is no GPU. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/paged/cuda_backend.h"

/* The varlen batch; kernels/peers/peer_attention.py lists the same lengths. */
static const int varlen_lens[16] = {256, 384, 512, 640, 768, 896, 1024, 1152,
                                    1280, 1408, 1536, 1664, 1792, 1920, 2048, 128};

typedef struct bench_case {
    const char *name;
    int hq, hkv, hd;
    int num_reqs;
    const int *q_lens;       /* [num_reqs] */
    const int *kv_lens;      /* [num_reqs] */
    int force_config;        /* -1 auto */
    int force_splits;        /* 0 auto */
    bool fp8_kv;             /* fp8 e4m3 cache (kv_scale 1) instead of bf16 */
} bench_case;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    return x;
}

/* B: the cache's block size */
static int run_bench(const bench_case *bc, int repeat, int B)
{
    ar_run_config c;
    memset(&c, 0, sizeof c);
    snprintf(c.model.name, sizeof c.model.name, "bench");
    c.model.attention = AR_ATTN_MHA;
    c.model.num_layers = 1;
    c.model.num_q_heads = bc->hq;
    c.model.num_kv_heads = bc->hkv;
    c.model.head_size = bc->hd;
    c.model.v_head_dim = bc->hd;
    c.model.scale = 1.0 / sqrt((double)bc->hd);
    c.block_size = B;
    c.dtype = AR_BF16;
    c.kv_dtype = bc->fp8_kv ? AR_FP8_E4M3 : AR_BF16;
    c.kv_scale = 1.0;
    c.num_layers = 1;
    c.seed = 5;
    c.repeat = repeat;
    int total_blocks = 1, T = 0, max_kv = 0, max_q = 0;
    for (int r = 0; r < bc->num_reqs; r++) {
        total_blocks += (bc->kv_lens[r] + B - 1) / B;
        T += bc->q_lens[r];
        if (bc->kv_lens[r] > max_kv) max_kv = bc->kv_lens[r];
        if (bc->q_lens[r] > max_q) max_q = bc->q_lens[r];
    }
    c.num_blocks = total_blocks;
    char why[256] = "";
    if (!ar_cuda_backend.check(&c, why, sizeof why)) {
        printf("SKIP %s: %s\n", bc->name, why);
        return 0;
    }
    void *st = NULL;
    char err[512] = "";
    if (ar_cuda_backend.open(&c, &st, err, sizeof err)) {
        printf("ERROR %s: %s\n", bc->name, err);
        return 1;
    }
    ar_cuda_set_plan(st, bc->force_config, bc->force_splits);
    const int R = bc->num_reqs, mbpr = (max_kv + B - 1) / B;
    int *qsl = calloc((size_t)R + 1, sizeof(int)), *seq = calloc((size_t)R, sizeof(int));
    int *ctx = calloc((size_t)R, sizeof(int)), *bt = calloc((size_t)R * mbpr, sizeof(int));
    uint64_t *bkeys = calloc((size_t)R * mbpr, sizeof(uint64_t)), *rkeys = calloc((size_t)R, sizeof(uint64_t));
    int64_t *slots = calloc((size_t)T, sizeof(int64_t));
    int fill_count = 0;
    for (int r = 0; r < R; r++) fill_count += bc->kv_lens[r] - bc->q_lens[r];
    int64_t *fslots = calloc((size_t)fill_count + 1, sizeof(int64_t));
    uint64_t *fkeys = calloc((size_t)fill_count + 1, sizeof(uint64_t));
    int *foffs = calloc((size_t)fill_count + 1, sizeof(int));
    if (!qsl || !seq || !ctx || !bt || !bkeys || !rkeys || !slots || !fslots || !fkeys || !foffs) {
        printf("ERROR %s: out of memory\n", bc->name);
        return 1;
    }
    /* blocks dealt out in a scrambled order (a real cache is not contiguous) */
    int next = 0, tok = 0, fk = 0;
    const int nb = total_blocks - 1;
    for (int r = 0; r < R; r++) {
        seq[r] = bc->kv_lens[r];
        ctx[r] = bc->kv_lens[r] - bc->q_lens[r];
        rkeys[r] = mix(1000 + (uint64_t)r);
        for (int i = 0; i < (seq[r] + B - 1) / B; i++) {
            bt[r * mbpr + i] = 1 + (int)(((int64_t)next++ * 7919) % nb);
            bkeys[r * mbpr + i] = mix((uint64_t)r * 100003 + (uint64_t)i);
        }
        for (int p = 0; p < ctx[r]; p++) {
            fslots[fk] = (int64_t)bt[r * mbpr + p / B] * B + p % B;
            fkeys[fk] = bkeys[r * mbpr + p / B];
            foffs[fk] = p % B;
            fk++;
        }
        for (int i = 0; i < bc->q_lens[r]; i++) {
            int p = ctx[r] + i;
            slots[tok + i] = (int64_t)bt[r * mbpr + p / B] * B + p % B;
        }
        tok += bc->q_lens[r];
        qsl[r + 1] = tok;
    }
    int rc = 0;
    ar_fill f = {fill_count, fslots, fkeys, foffs};
    if (fill_count > 0 && ar_cuda_backend.fill(st, 0, &f, err, sizeof err)) {
        printf("ERROR %s: fill: %s\n", bc->name, err);
        rc = 1;
    }
    ar_batch b = {1, R, T, qsl, seq, ctx, max_q, max_kv, mbpr, bt, bkeys, rkeys, slots, 0};
    float *out = malloc(sizeof(float) * (size_t)T * bc->hq * bc->hd);
    float *lse = malloc(sizeof(float) * (size_t)T * bc->hq);
    ar_forward_out o;
    memset(&o, 0, sizeof o);
    o.out = out;
    o.lse = lse;
    if (!rc && ar_cuda_backend.prepare(st, &b, err, sizeof err)) {
        printf("ERROR %s: prepare: %s\n", bc->name, err);
        rc = 1;
    }
    if (!rc && ar_cuda_backend.forward(st, 0, &b, &o, err, sizeof err)) {
        printf("ERROR %s: forward: %s\n", bc->name, err);
        rc = 1;
    }
    if (!rc) {
        ar_cuda_plan_info pi;
        ar_cuda_plan_of(st, &pi);
        double attn_us = 0, write_us = 0, combine_us = 0;
        for (int k = 0; k < o.num_kernels; k++) {
            if (strcmp(o.kernels[k].name, "write") == 0) write_us = o.kernels[k].us;
            else attn_us += o.kernels[k].us;
            if (strcmp(o.kernels[k].name, "combine") == 0) combine_us = o.kernels[k].us;
        }
        double bytes = 0, flops = 0;
        long nan = 0;
        for (int r = 0; r < R; r++) {
            double sq = bc->q_lens[r], sk = bc->kv_lens[r];
            bytes += sk * bc->hkv * bc->hd * 2.0 * (bc->fp8_kv ? 1.0 : 2.0) + 2.0 * sq * bc->hq * bc->hd * 2.0;
            double avg_k = (fmax(0.0, sk - sq) + sk) / 2.0;
            flops += 2.0 * bc->hq * sq * avg_k * (2.0 * bc->hd);
        }
        for (long i = 0; i < (long)T * bc->hq * bc->hd; i++)
            if (out[i] != out[i]) nan++;
        printf("RESULT name=%s us=%.2f write_us=%.2f combine_us=%.2f gbps=%.1f tflops=%.1f config=%d splits=%d "
               "work=%d ctas_per_sm=%d combine_team=%d nan=%ld kv=%s block=%d device=\"", bc->name, attn_us, write_us,
               combine_us, bytes / attn_us * 1e-3, flops / attn_us * 1e-6, pi.config, pi.num_splits, pi.num_work,
               pi.ctas_per_sm, pi.combine_team, nan, pi.kv_fp8 ? "fp8_e4m3" : "bf16", B);
        char dev[128];
        ar_cuda_backend.device_name(st, dev, sizeof dev);
        printf("%s\"\n", dev);
        if (nan) rc = 1;
    }
    ar_cuda_backend.close(st);
    free(qsl); free(seq); free(ctx); free(bt); free(bkeys); free(rkeys); free(slots);
    free(fslots); free(fkeys); free(foffs); free(out); free(lse);
    return rc;
}

int main(int argc, char **argv)
{
    int repeat = argc > 1 ? atoi(argv[1]) : 20;
    if (repeat < 1) repeat = 20;
    /* the cache's block size: 16 (vLLM's default), or AR_BENCH_BLOCK_SIZE */
    const char *bs_env = getenv("AR_BENCH_BLOCK_SIZE");
    int block_size = 16;
    if (bs_env && *bs_env) {
        char *end;
        long v = strtol(bs_env, &end, 10);
        if (*end || (v != 16 && v != 32 && v != 64)) {
            fprintf(stderr, "bench_cuda: AR_BENCH_BLOCK_SIZE=%s: must be 16, 32 or 64 (the backend's block sizes)\n",
                    bs_env);
            return 2;
        }
        block_size = (int)v;
    }
    static int dec_q[128], dec_kv[128], pre_q[2], pre_kv[2];
    static const int chunk_q[1] = {8192}, chunk_kv[1] = {98304};
    static int lop_kv[121];   /* 120 decodes of 2k keys and one of 135,168 (the Mooncake trace's lopsided steps) */
    static int one_long_kv[128];   /* 127 decodes of 8k keys and one of 16k */
    static int lop18_kv[18];       /* the trace's median lopsided step: one of 135,168 keys among 17 of 1,280 */
    for (int i = 0; i < 128; i++) { dec_q[i] = 1; dec_kv[i] = 8192; }
    for (int i = 0; i < 121; i++) lop_kv[i] = i == 60 ? 135168 : 2048;
    for (int i = 0; i < 128; i++) one_long_kv[i] = i == 37 ? 16384 : 8192;
    for (int i = 0; i < 18; i++) lop18_kv[i] = i == 0 ? 135168 : 1280;
    for (int i = 0; i < 2; i++) { pre_q[i] = 8192; pre_kv[i] = 8192; }
    const bench_case cases[] = {
        {"decode_b64_s8192_gqa32_8_hd128", 32, 8, 128, 64, dec_q, dec_kv, -1, 0, false},
        {"decode_b64_s8192_gqa32_8_hd128_nosplit", 32, 8, 128, 64, dec_q, dec_kv, -1, 1, false},
        {"decode_b32_s8192_gqa32_8_hd128", 32, 8, 128, 32, dec_q, dec_kv, -1, 0, false},   /* the plan's small batches */
        {"decode_b48_s8192_gqa32_8_hd128", 32, 8, 128, 48, dec_q, dec_kv, -1, 0, false},
        {"decode_b64_s8192_gqa32_8_hd128_split4", 32, 8, 128, 64, dec_q, dec_kv, -1, 4, false},
        {"decode_b64_s8192_gqa32_8_hd128_fp8", 32, 8, 128, 64, dec_q, dec_kv, -1, 0, true},
        {"decode_b64_s8192_gqa32_8_hd128_nosplit_fp8", 32, 8, 128, 64, dec_q, dec_kv, -1, 1, true},
        {"decode_b64_s8192_gqa32_8_hd128_split4_fp8", 32, 8, 128, 64, dec_q, dec_kv, -1, 4, true},
        {"decode_b96_s8192_gqa32_8_hd128_fp8", 32, 8, 128, 96, dec_q, dec_kv, -1, 0, true},    /* DECODE_TMA's rule sizes */
        {"decode_b128_s8192_gqa32_8_hd128_fp8", 32, 8, 128, 128, dec_q, dec_kv, -1, 0, true},
        {"decode_b128_s8192_gqa32_8_hd128", 32, 8, 128, 128, dec_q, dec_kv, -1, 0, false},
        /* a batch decode_tma_rule takes (>= 0.9 x SMs requests) but decode_tma_lopsided sends
         * to DECODE: automatic, and DECODE_TMA's whole requests forced */
        {"decode_lopsided_b121_s2048_135k", 32, 8, 128, 121, dec_q, lop_kv, -1, 0, false},
        {"decode_lopsided_b121_s2048_135k_tma", 32, 8, 128, 121, dec_q, lop_kv, 3, 0, false},
        /* the Mooncake trace's lopsided decode steps as they are (fa3_peer.py's "lopsided"): DECODE
         * cuts the long request into tens of pieces; their combine took 17.5 us of 244 with one
         * thread, 9 with the combine team's rule (H100, 2026-12-07) */
        {"decode_lopsided_b18_s1280_135k", 32, 8, 128, 18, dec_q, lop18_kv, -1, 0, false},
        /* a batch DECODE_TMA's rule takes whose one long request the uneven rule cuts */
        {"decode_b128_s8192_one16k", 32, 8, 128, 128, dec_q, one_long_kv, -1, 0, false},
        {"prefill_b2_s8192_causal_hd128", 16, 16, 128, 2, pre_q, pre_kv, -1, 0, false},
        {"prefill_b2_s8192_causal_hd128_mma", 16, 16, 128, 2, pre_q, pre_kv, 0, 0, false},   /* the mma.sync fallback */
        {"prefill_b2_s8192_causal_hd128_fp8", 16, 16, 128, 2, pre_q, pre_kv, -1, 0, true},
        {"prefill_b2_s8192_causal_hd256", 8, 8, 256, 2, pre_q, pre_kv, -1, 0, false},
        {"prefill_b2_s8192_causal_hd256_mma", 8, 8, 256, 2, pre_q, pre_kv, 0, 0, false},     /* the mma.sync fallback */
        {"varlen16_causal_hd128", 16, 16, 128, 16, varlen_lens, varlen_lens, -1, 0, false},
        {"varlen16_causal_hd128_mma", 16, 16, 128, 16, varlen_lens, varlen_lens, 0, 0, false},
        {"varlen16_causal_hd128_fp8", 16, 16, 128, 16, varlen_lens, varlen_lens, -1, 0, true},
        {"prefill_b2_s8192_causal_hd64", 32, 32, 64, 2, pre_q, pre_kv, -1, 0, false},
        {"chunk_q8192_ctx98304_gqa32_8_hd128", 32, 8, 128, 1, chunk_q, chunk_kv, -1, 0, false},
    };
    const char *only = argc > 2 ? argv[2] : NULL;   /* run just this case (for ncu) */
    int rc = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!only || strcmp(only, cases[i].name) == 0) rc |= run_bench(&cases[i], repeat, block_size);
    return rc;
}
