/* bench_mla.c - the CUDA MLA decode kernels (latent attention + split combine) on FlashMLA's
 * benchmark shapes, beside plain-torch MLA (kernels/peers/mla_peer.py, einsum) in the same run.
 *
 * Shapes: b = 128 requests, s_q = 1, one latent KV head, d = 576, dv = 512, bf16, block size 64,
 * every request with s_k = 4096, 8192, 16384, 32768 keys; h_q = 128 (TFLOP/s, FlashMLA's count
 * 2 x h_q x s_q x keys x (576 + 512)) and h_q = 16 (effective TB/s, FlashMLA's byte count
 * (keys x 576 + b x s_q x h_q x (576 + 512)) x 2 bytes).  Targets: >= 450 TFLOP/s at h_q = 128,
 * >= 3.6 TB/s at h_q = 16.  Rows per h_q: AUTO (the decision function's kernel: on a compute-
 * capability 9.0 device the 64-row wgmma kernel at h_q = 128, the transposed one at 16 and 8) at
 * the four lengths; an fp8 latent cache and the 2-stage key ring (an A100's) at 16k; and the
 * mma.sync fallback forced at the four lengths (the 64-row kernel at h_q = 128, the narrow kernel
 * at h_q = 16); and at h_q = 8 AUTO at the four lengths (elsewhere a narrow kernel).  Times are CUDA events around the
 * attention and combine launches, the median of 20 samples after a warm-up; inputs are generated
 * on the device.  Timed as the peers are (kernels/peers/fa3_peer.py bench()): a sample is
 * one event pair around enough back-to-back launches for about 2 ms of GPU work (1-50), so that
 * each launch's host-side cost hides behind the one before it, as in an engine's step;
 * us_single= beside it is the median of single launches on an idle GPU (that cost inside).
 * AR_MLA_BENCH_REPEAT=N takes N samples a row instead of 20, AR_MLA_BENCH_TIMING=b2b the
 * back-to-back ones only (us_single=0): kernels/peers/power_trace.py runs it so.
 * Without a GPU it prints why and exits 0.  Kernel variants that are not in the
 * product are measured by kernels/lab/ (`make lab`).  `bench_mla --only H_Q S_K [SPLITS [KERNEL]]`
 * runs that one shape at any h_q (SPLITS: pieces a row tile, forced; KERNEL: auto, tc-wgmma =
 * the 64-row kernel forced, or fp8 = AUTO over an fp8 e4m3 cache) and no torch peer (for a
 * profiler: one kernel, a warm-up, 20 single launches, then the 20 samples).  Each row is also
 * printed as a result line, "RESULT name=mla_h<H>_sk<S_K>[_fp8|_ring2|_fallback] us= tflops=
 * gbps= kernel= ctas= pieces= combine_us= us_single= reps=" (the CTAs, the pieces they ran,
 * the combine's share of a single launch, the single launch's time and the launches a sample;
 * TFLOP/s from 64 heads up, GB/s below, the other 0), which kernels/peers/ab.sh collects. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/mla/cuda_mla.h"
#include "../kernels/mla/cuda_mla_case.h"
#include "testutil.h"

#define MAX_PEER 16

typedef struct peer_row {
    int h, sk;
    double us;
} peer_row;

/* Runs the torch peer once for every shape; returns the rows it printed (0 if none). */
static int run_peer(peer_row *rows, char *why, size_t why_len)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "python3 %s/kernels/peers/mla_peer.py --b 128 --sq 1 --h 128 16 8 --sk 4096 8192 16384 32768 2>&1",
             tu_src_dir());
    FILE *p = popen(cmd, "r");
    snprintf(why, why_len, "could not start python3");
    if (!p) return 0;
    int n = 0;
    char line[512];
    why[0] = 0;
    while (fgets(line, sizeof line, p)) {
        peer_row r;
        if (sscanf(line, "PEER %d %d %lf", &r.h, &r.sk, &r.us) == 3) {
            if (n < MAX_PEER) rows[n++] = r;
        } else if (strncmp(line, "ERROR ", 6) == 0 && !why[0]) {
            line[strcspn(line, "\n")] = 0;
            snprintf(why, why_len, "%.200s", line + 6);
        }
    }
    int st = pclose(p);
    if (n == 0 && !why[0]) snprintf(why, why_len, "peer printed nothing (exit status %d)", st);
    return n;
}

static const peer_row *find_peer(const peer_row *rows, int n, int h, int sk)
{
    for (int i = 0; i < n; i++)
        if (rows[i].h == h && rows[i].sk == sk) return &rows[i];
    return NULL;
}

int main(int argc, char **argv)
{
    const int B = 128, SQ = 1;
    /* --only H_Q S_K [SPLITS [KERNEL]]: that one row alone (any h_q; KERNEL auto, tc-wgmma, or
     * fp8: AUTO's kernel over an fp8 e4m3 cache) */
    int only_h = 0, only_sk = 0, only_splits = 0;
    bool only_fp8 = false;
    ar_cuda_mla_kernel only_kernel = AR_MLA_KERNEL_AUTO;
    if (argc >= 4 && argc <= 6 && strcmp(argv[1], "--only") == 0) {
        only_h = atoi(argv[2]);
        only_sk = atoi(argv[3]);
        if (argc >= 5) only_splits = atoi(argv[4]);
        if (argc == 6 && strcmp(argv[5], "tc-wgmma") == 0) only_kernel = AR_MLA_KERNEL_TC_WGMMA;
        else if (argc == 6 && strcmp(argv[5], "fp8") == 0) only_fp8 = true;
        else if (argc == 6 && strcmp(argv[5], "auto") != 0) only_h = 0;
    }
    if (argc != 1 && (only_h <= 0 || only_sk <= 0 || only_splits < 0)) {
        fprintf(stderr, "usage: bench_mla [--only H_Q S_K [SPLITS [auto|tc-wgmma|fp8]]]\n");
        return 2;
    }
    static const int sks[] = {4096, 8192, 16384, 32768};
    int hqs[] = {128, 16, 8};
    if (only_h) hqs[0] = hqs[1] = hqs[2] = only_h;   /* --only: the one h_q (run once: ih 0) */
    int *seqlens = malloc(sizeof(int) * B);
    if (!seqlens) return 1;
    ar_cuda_mla_case c = ar_cuda_mla_bench_case(B, 128, seqlens);
    /* AR_MLA_BENCH_REPEAT: samples a row (default 20); AR_MLA_BENCH_TIMING=b2b: the back-to-back
     * samples only (kernels/peers/power_trace.py keeps the GPU busy with these) */
    const char *rep_env = getenv("AR_MLA_BENCH_REPEAT"), *timing_env = getenv("AR_MLA_BENCH_TIMING");
    if (rep_env && *rep_env) {
        char *end = NULL;
        long v = strtol(rep_env, &end, 10);
        if (*end != '\0' || v < 1 || v > 100000) {
            fprintf(stderr, "bench_mla: AR_MLA_BENCH_REPEAT=%s: not a count of samples from 1 to 100000\n", rep_env);
            free(seqlens);
            return 2;
        }
        c.repeat = (int)v;
    }
    if (timing_env && *timing_env) {
        if (strcmp(timing_env, "b2b") != 0 && strcmp(timing_env, "both") != 0) {
            fprintf(stderr, "bench_mla: AR_MLA_BENCH_TIMING=%s: b2b or both\n", timing_env);
            free(seqlens);
            return 2;
        }
        c.back_to_back_only = strcmp(timing_env, "b2b") == 0;
    }
    /* probe the device with a tiny case */
    int one = 16;
    ar_cuda_mla_case probe = c;
    probe.batch = 1;
    probe.seqlens_k = &one;
    probe.h_q = 1;
    probe.repeat = 0;
    ar_cuda_mla_result res;
    memset(&res, 0, sizeof res);
    char err[512] = "";
    if (ar_cuda_mla_run_case(&probe, &res, err, sizeof err) != 0) {
        printf("bench_mla: skipped: %s\n", err);
        free(seqlens);
        ar_cuda_mla_release_case_buffers();
        return 0;
    }
    peer_row peer[MAX_PEER];
    char peer_why[256] = "";
    int n_peer = only_h ? 0 : run_peer(peer, peer_why, sizeof peer_why);
    if (only_h) snprintf(peer_why, sizeof peer_why, "not run (--only)");

    printf("CUDA MLA decode (cuda-mla latent attention + combine) vs plain torch einsum, b=%d s_q=%d, d=576 dv=512, "
           "block 64, median of %d samples of back-to-back launches\n", B, SQ, c.repeat);
    printf("%-5s %-8s %-6s %-14s %6s %10s %9s %8s %6s | %12s %9s %8s\n", "h_q", "s_k", "kv", "kernel", "stages",
           "cuda-mla us", "TFLOP/s", "TB/s", "CTAs", "torch us", "TFLOP/s", "TB/s");
    int rc = 0;
    double best_tflops = 0, best_tbps = 0;
    for (size_t ih = 0; ih < 3; ih++)
        for (size_t ik = 0; ik < (ih < 2 ? 10u : 4u); ik++) {
            /* rows: 4 lengths (AUTO: on an sm_90 device the wgmma kernels, transposed at h_q 16;
             * else the narrow kernel at 16, split-QK at 128); fp8 cache at 16k (AUTO: split-QK at
             * 128, the narrow kernel at 16); the 2-stage ring at 16k (what an A100 runs); the
             * mma.sync fallback forced x 4 (split-QK at 128, the narrow kernel at 16); at h_q 8
             * (under 16 rows a request) AUTO x 4 (on Hopper the transposed wgmma kernel) */
            bool fp8_row = ik == 4, ring2_row = ik == 5, fallback_row = ik >= 6;
            int sk = ik < 4 ? sks[ik] : ik < 6 ? 16384 : sks[ik - 6];
            if (only_fp8 && fp8_row) sk = only_sk;
            if (only_h && (ih > 0 || sk != only_sk || (only_fp8 ? !fp8_row : ik >= 4))) continue;
            for (int b = 0; b < B; b++) seqlens[b] = sk;
            c.h_q = hqs[ih];
            c.kv_dtype = fp8_row ? AR_FP8_E4M3 : AR_BF16;
            c.stages = ring2_row ? 2 : 0;
            c.num_splits = only_splits;   /* 0: the planner's */
            c.kernel = !(fallback_row || ring2_row) ? AR_MLA_KERNEL_AUTO
                       : c.h_q >= 64                ? AR_MLA_KERNEL_TC_SPLIT_QK
                                                    : AR_MLA_KERNEL_TC_NARROW;
            if (only_h) c.kernel = only_kernel;
            memset(&res, 0, sizeof res);
            if (ar_cuda_mla_run_case(&c, &res, err, sizeof err) != 0) {
                printf("%-5d %-8d error: %s\n", c.h_q, sk, err);
                rc = 1;
                continue;
            }
            double keys = (double)B * sk;
            double flops = 2.0 * c.h_q * SQ * keys * (576 + 512);
            double bytes = (keys * 576 + (double)B * SQ * c.h_q * (576 + 512)) * 2.0;
            if (fp8_row) bytes = keys * 576 + (double)B * SQ * c.h_q * (576 + 512) * 2.0;
            double tflops = flops / res.attn_us / 1e6, tbps = bytes / res.attn_us / 1e6;
            if (ik < 4 && c.h_q == 128 && tflops > best_tflops) best_tflops = tflops;
            if (ik < 4 && c.h_q == 16 && tbps > best_tbps) best_tbps = tbps;
            printf("%-5d %-8d %-6s %-14s %6d %10.1f %9.1f %8.2f %6d | ", c.h_q, sk, fp8_row ? "fp8" : "bf16",
                   res.kernel_name ? res.kernel_name : "?", res.stages, res.attn_us, tflops, tbps, res.num_work);
            const peer_row *pr = ik >= 4 ? NULL : find_peer(peer, n_peer, c.h_q, sk);
            if (pr)
                printf("%12.1f %9.1f %8.2f\n", pr->us, flops / pr->us / 1e6, bytes / pr->us / 1e6);
            else
                printf("%12s\n", ik >= 4 ? "-" : "n/a");
            /* the row as a result line (kernels/peers/ab.sh collects these): TFLOP/s from 64 heads
             * up, where FlashMLA counts the compute, GB/s below */
            printf("RESULT name=mla_h%d_sk%d%s us=%.2f tflops=%.1f gbps=%.1f kernel=\"%s\" ctas=%d pieces=%d "
                   "combine_us=%.2f us_single=%.2f reps=%d\n", c.h_q, sk,
                   fp8_row ? "_fp8" : ring2_row ? "_ring2" : fallback_row ? "_fallback" : "", res.attn_us,
                   c.h_q >= 64 ? tflops : 0.0, c.h_q >= 64 ? 0.0 : tbps * 1000.0,
                   res.kernel_name ? res.kernel_name : "?", res.num_work, res.num_pieces, res.combine_us,
                   res.attn_single_us, res.reps);
        }
    if (n_peer == 0) printf("torch peer: %s\n", peer_why[0] ? peer_why : "no result");
    printf("targets: >= 450 TFLOP/s at h_q=128 (best AUTO %.1f: %s), >= 3.6 TB/s at h_q=16 (best AUTO %.2f: %s)\n",
           best_tflops, best_tflops >= 450 ? "met" : "NOT met", best_tbps, best_tbps >= 3.6 ? "met" : "NOT met");
    free(seqlens);
    ar_cuda_mla_release_case_buffers();
    return rc;
}
