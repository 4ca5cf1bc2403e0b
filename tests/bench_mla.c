/* bench_mla.c - the CUDA MLA decode kernel (latent attention + split combine) on FlashMLA's
 * benchmark shapes, beside plain-torch MLA (kernels/peers/mla_peer.py, einsum) in the same run.
 *
 * Shapes: b = 128 requests, s_q = 1, one latent KV head, d = 576, dv = 512, bf16, block size 64,
 * every request with s_k = 4096, 8192, 16384, 32768 keys; h_q = 128 (TFLOP/s, FlashMLA's count
 * 2 x h_q x s_q x keys x (576 + 512)) and h_q = 16 (effective TB/s, FlashMLA's byte count
 * (keys x 576 + b x s_q x h_q x (576 + 512)) x 2 bytes).  Targets of issue 6: >= 450 TFLOP/s at
 * h_q = 128, >= 3.6 TB/s at h_q = 16.  Also an fp8 latent cache row per h_q at 16k.  At h_q = 128
 * AUTO runs the wgmma kernel on an sm_90 device (kernels/cuda_mla_wgmma.cuh); the mma.sync
 * split-QK kernel (AUTO before it) is forced on the same lengths in the same run, beside it.
 * Times are CUDA events around the attention and combine launches, median of 20 after a
 * warm-up; inputs are generated on the device.  Without a GPU it prints why and exits 0.
 *
 * Then the narrow-kernel sweep (issue 6 item 7), printed last: every variant of the h_q = 16
 * kernel (ar_cuda_mla_narrow_variant_name; 1 = base, the kernel before the sweep; the default
 * is bulk-s2x2-cp since round 4 of 2026-11-30, bulk-s2x2-c before) at s_k = 4096, 16384, 32768 with the
 * test recipe's permuted block table and at 32768 with a contiguous one (FlashMLA's benchmark
 * uses arange), the default once more at the end of each (the run-to-run spread), one SWEEP
 * line each: time of attention + combine (FlashMLA's definition) and of the combine alone,
 * effective TB/s, CTAs, max |out - float64 reference| and max |LSE - reference| over 3 requests
 * (first, middle, last), and max |out - the default's out| over all requests (0 =
 * bit-identical).  `bench_mla sweep` runs the sweep only; AR_SWEEP_VARIANTS="17 19" runs only
 * those narrow variant numbers (the first one run is then the "vs base" baseline).
 *
 * `bench_mla wgsweep` runs only the sweep of the wgmma kernel's variants (AR_MLA_WG_VARIANT,
 * 0 .. AR_CUDA_MLA_WG_VARIANT_COUNT - 1; 0 = round 1, 1 = s1, 4 = seesaw, 5 = seesaw-rs,
 * 6 = s1-tma (the default), 7 = seesaw-rs-tma: key tiles by TMA; ran= names the cp.async twin if the
 * map was refused) at
 * h_q = 128, b = 128, s_q = 1, bf16, block 64, s_k = 4k, 8k, 16k, 32k, one line each:
 *   WGSWEEP variant=<n> name=<short> h_q=<heads> sk=<keys> us=<attn+combine> tflops=<FlashMLA's count>
 *           tbps=<FlashMLA's bytes / time>
 *           max_diff_vs_default=<max |out - the first variant run's out|, all requests> err_vs_ref=<max
 *           |out - float64 reference| over 3 requests> lse_vs_ref=<the same for the LSE>
 *           ran=<variant that ran>
 * AR_WGSWEEP_VARIANTS="0 2" (or "145") restricts it to those variant numbers (so that a variant that hangs
 * on a new device can be left out of a run); AR_WGSWEEP_HQ=16 runs it at h_q = 16 instead (16 of each
 * tile's 64 rows used: the bandwidth shape on the wgmma kernel), tbps= is FlashMLA's byte count;
 * AR_WGSWEEP_SPLITS=N forces the split count (splits=0 on the line: the planner's). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cuda_mla.h"
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
             "python3 %s/kernels/peers/mla_peer.py --b 128 --sq 1 --h 128 16 --sk 4096 8192 16384 32768 2>&1",
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

/* Max |a - b| over n floats (NaN anywhere: infinity). */
static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) return INFINITY;
        if (d > m) m = d;
    }
    return m;
}

/* Max |out - float64 reference| and max |LSE - reference| (equal infinities count as 0) over
 * the requests sel marks, of a result r for B requests of H heads (out [B, H, 512], lse [B, H]);
 * a NaN sticks. */
static void ref_errors(const ar_cuda_mla_result *r, const unsigned char *sel, int B, int H, double *err_out,
                       double *err_lse)
{
    *err_out = *err_lse = 0;
    for (int b = 0; b < B; b++) {
        if (!sel[b]) continue;
        for (size_t i = (size_t)b * H * 512; i < (size_t)(b + 1) * H * 512; i++) {
            double d = fabs((double)r->out[i] - r->ref_out[i]);
            if (!(d <= *err_out)) *err_out = d;
        }
        for (size_t i = (size_t)b * H; i < (size_t)(b + 1) * H; i++) {
            double d = fabs((double)r->lse[i] - r->ref_lse[i]);
            if (isinf(r->lse[i]) && isinf(r->ref_lse[i])) d = 0;
            if (!(d <= *err_lse)) *err_lse = d;
        }
    }
}

/* Whether narrow variant v is in the list of numbers `only` (AR_SWEEP_VARIANTS="17 19": space or
 * comma separated); every variant when the list is NULL or empty. */
static bool sweep_variant_listed(const char *only, int v)
{
    if (!only || !*only) return true;
    for (const char *p = only; *p;) {
        char *end = NULL;
        long n = strtol(p, &end, 10);
        if (end == p) {   /* not a number: skip one character */
            p++;
            continue;
        }
        if (n == v) return true;
        p = end;
    }
    return false;
}

/* The SWEEP lines (see the file comment) for the h_q = 16 case c; sel [B] marks the requests
 * the reference covers, base_out [B, 16, 512] keeps the default's output, r has out / lse /
 * ref_out / ref_lse of that size.  0 ok, 1 if a case failed to run. */
static int sweep_rows(ar_cuda_mla_case c, int *seqlens, unsigned char *sel, float *base_out, ar_cuda_mla_result *r)
{
    /* s_k, and whether the block table is contiguous (FlashMLA's benchmark: arange) rather than
     * the test recipe's permutation (every 64-key block somewhere else in the 4.8 GB cache) */
    static const int sks[] = {4096, 16384, 32768, 32768}, contig[] = {0, 0, 0, 1};
    const int B = c.batch, H = 16, count = ar_cuda_mla_narrow_variant_count();
    const size_t n_out = (size_t)B * H * 512;
    c.h_q = H;
    c.kv_dtype = AR_BF16;
    c.stages = 0;
    c.kernel = AR_MLA_KERNEL_AUTO;
    c.want_reference = true;
    c.ref_requests = sel;
    int rc = 0;
    printf("narrow-kernel sweep: b=%d s_q=1 h_q=%d bf16 block 64, median of %d; variants:\n", B, H, c.repeat);
    for (int v = 1; v <= count; v++)
        printf("  %2d %-15s %s\n", v, ar_cuda_mla_narrow_variant_name(v), ar_cuda_mla_narrow_variant_about(v));
    printf("(ran: = when the variant asked for ran, else the one that did; diag: wrong output by design)\n");
    printf("%-5s %2s %-14s %-6s %6s %-6s %9s %7s %6s %4s %8s %8s %8s\n", "", "v", "variant", "ran", "s_k", "blocks",
           "attn+comb", "comb us", "TB/s", "CTAs", "err out", "err lse", "vs base");
    for (size_t ik = 0; ik < sizeof sks / sizeof sks[0]; ik++) {
        const int sk = sks[ik];
        for (int b = 0; b < B; b++) seqlens[b] = sk;
        c.seqlens_k = seqlens;
        c.contiguous_blocks = contig[ik] != 0;
        bool have_base = false;
        for (int k = 1; k <= count + 1; k++) {
            const int v = k <= count ? k : 1;   /* the default again last */
            if (!sweep_variant_listed(getenv("AR_SWEEP_VARIANTS"), v)) continue;
            c.narrow_variant = v;
            char err[512] = "";
            if (ar_cuda_mla_run_case(&c, r, err, sizeof err) != 0) {
                printf("SWEEP %2d %-14s %6d error: %.150s\n", v, ar_cuda_mla_narrow_variant_name(v), sk, err);
                rc = 1;
                continue;
            }
            double err_out, err_lse;
            ref_errors(r, sel, B, H, &err_out, &err_lse);
            if (!have_base) {   /* the first variant run (1 unless AR_SWEEP_VARIANTS leaves it out) */
                memcpy(base_out, r->out, n_out * sizeof(float));
                have_base = true;
            }
            double vs_base = max_abs_diff(r->out, base_out, n_out);
            double keys = (double)B * sk;
            double bytes = (keys * 576 + (double)B * H * (576 + 512)) * 2.0;
            const char *ran = r->narrow_variant == v ? "=" : r->narrow_variant_name ? r->narrow_variant_name : "?";
            printf("SWEEP %2d %-14s %-6s %6d %-6s %9.1f %7.1f %6.2f %4d %8.1e %8.1e %8.1e%s\n", v,
                   ar_cuda_mla_narrow_variant_name(v), ran, sk, contig[ik] ? "contig" : "perm", r->attn_us,
                   r->combine_us, bytes / r->attn_us / 1e6, r->num_work, err_out, err_lse, vs_base,
                   ar_cuda_mla_narrow_variant_is_diagnostic(v) ? " diag" : err_out > 8e-4 ? " ERROR > 8e-4" : "");
        }
    }
    return rc;
}

/* Host buffers of a sweep over B requests of H heads: which requests the float64 reference
 * covers (first, middle, last), the baseline output [B, H, 512], and the result's output,
 * LSE and reference. */
typedef struct sweep_buffers {
    unsigned char *sel;     /* [B] */
    float *base_out;        /* [B * H * 512] */
    ar_cuda_mla_result r;   /* out [B * H * 512], lse [B * H], ref_out, ref_lse the same in double */
} sweep_buffers;

static void sweep_buffers_free(sweep_buffers *sb)
{
    free(sb->sel);
    free(sb->base_out);
    free(sb->r.out);
    free(sb->r.lse);
    free(sb->r.ref_out);
    free(sb->r.ref_lse);
    memset(sb, 0, sizeof *sb);
}

/* false (nothing left allocated) when out of host memory */
static bool sweep_buffers_alloc(sweep_buffers *sb, int B, int H)
{
    const size_t n_out = (size_t)B * H * 512, n_lse = (size_t)B * H;
    memset(sb, 0, sizeof *sb);
    sb->sel = calloc((size_t)B, 1);
    sb->base_out = malloc(n_out * sizeof(float));
    sb->r.out = malloc(n_out * sizeof(float));
    sb->r.lse = malloc(n_lse * sizeof(float));
    sb->r.ref_out = malloc(n_out * sizeof(double));
    sb->r.ref_lse = malloc(n_lse * sizeof(double));
    if (!sb->sel || !sb->base_out || !sb->r.out || !sb->r.lse || !sb->r.ref_out || !sb->r.ref_lse) {
        sweep_buffers_free(sb);
        return false;
    }
    sb->sel[0] = sb->sel[B / 2] = sb->sel[B - 1] = 1;
    return true;
}

/* The wgmma-kernel variant sweep (see the file comment).  c: the case set up by main.  0 ok, 1
 * if a case failed to run. */
static int run_wgsweep(ar_cuda_mla_case c, int *seqlens)
{
    static const int sks[] = {4096, 8192, 16384, 32768};
    const char *hq_env = getenv("AR_WGSWEEP_HQ");   /* 16: the bandwidth shape, 16 of 64 rows a tile */
    const int B = c.batch, H = hq_env && atoi(hq_env) > 0 && atoi(hq_env) <= 128 ? atoi(hq_env) : 128;
    const size_t n_out = (size_t)B * H * 512;
    sweep_buffers sb;
    if (!sweep_buffers_alloc(&sb, B, H)) {
        printf("bench_mla wgsweep: out of host memory\n");
        return 1;
    }
    const unsigned char *sel = sb.sel;
    float *base_out = sb.base_out;
    ar_cuda_mla_result r = sb.r;   /* (its buffers are sb's; each case fills in the scalars) */
    c.h_q = H;
    c.kv_dtype = AR_BF16;
    c.stages = 0;
    c.kernel = AR_MLA_KERNEL_TC_WGMMA;
    c.force_wg_variant = true;
    const char *splits_env = getenv("AR_WGSWEEP_SPLITS");   /* N >= 1: force the split count */
    c.num_splits = splits_env && atoi(splits_env) > 0 ? atoi(splits_env) : 0;
    c.want_reference = true;
    c.ref_requests = sel;
    printf("wgmma-kernel variant sweep: b=%d s_q=1 h_q=%d bf16 block 64, median of %d, %d variants\n", B, H,
           c.repeat, AR_CUDA_MLA_WG_VARIANT_COUNT);
    int rc = 0;
    for (size_t ik = 0; ik < sizeof sks / sizeof sks[0]; ik++) {
        const int sk = sks[ik];
        for (int b = 0; b < B; b++) seqlens[b] = sk;
        c.seqlens_k = seqlens;
        bool have_base = false;
        for (int v = 0; v < AR_CUDA_MLA_WG_VARIANT_COUNT; v++) {
            /* AR_WGSWEEP_VARIANTS="0 2": only those variant numbers (the baseline is 0) */
            const char *only = getenv("AR_WGSWEEP_VARIANTS");
            if (only && !strchr(only, '0' + v)) continue;
            c.wg_variant = v;
            char err[512] = "";
            if (ar_cuda_mla_run_case(&c, &r, err, sizeof err) != 0) {
                printf("WGSWEEP variant=%d sk=%d error: %.200s\n", v, sk, err);
                rc = 1;
                continue;
            }
            double err_out, err_lse;
            ref_errors(&r, sel, B, H, &err_out, &err_lse);
            if (!have_base) {   /* the first variant run (0 unless AR_WGSWEEP_VARIANTS leaves it out) */
                memcpy(base_out, r.out, n_out * sizeof(float));
                have_base = true;
            }
            double vs_base = have_base ? max_abs_diff(r.out, base_out, n_out) : -1.0;
            double flops = 2.0 * H * (double)B * sk * (576 + 512);
            double bytes = ((double)B * sk * 576 + (double)B * H * (576 + 512)) * 2.0;
            printf("WGSWEEP variant=%d name=%s h_q=%d sk=%d splits=%d ctas=%d us=%.1f tflops=%.1f tbps=%.2f "
                   "max_diff_vs_default=%.3g err_vs_ref=%.3g lse_vs_ref=%.3g ran=%d%s\n", v,
                   r.wg_variant_name ? r.wg_variant_name : "?", H, sk, c.num_splits, r.num_work, r.attn_us,
                   flops / r.attn_us / 1e6, bytes / r.attn_us / 1e6, vs_base, err_out, err_lse, r.wg_variant,
                   !(err_out <= 8e-4) ? " ERROR > 8e-4" : "");
            fflush(stdout);
        }
    }
    sweep_buffers_free(&sb);
    return rc;
}

/* The narrow-kernel sweep (see the file comment).  c: the case set up by main. */
static int run_sweep(ar_cuda_mla_case c, int *seqlens)
{
    const int B = c.batch, H = 16;
    sweep_buffers sb;
    if (!sweep_buffers_alloc(&sb, B, H)) {
        printf("bench_mla sweep: out of host memory\n");
        return 1;
    }
    int rc = sweep_rows(c, seqlens, sb.sel, sb.base_out, &sb.r);
    sweep_buffers_free(&sb);
    return rc;
}

int main(int argc, char **argv)
{
    const bool sweep_only = argc > 1 && strcmp(argv[1], "sweep") == 0;
    const bool wgsweep_only = argc > 1 && strcmp(argv[1], "wgsweep") == 0;
    const int B = 128, SQ = 1;
    static const int hqs[] = {128, 16}, sks[] = {4096, 8192, 16384, 32768};
    int *seqlens = malloc(sizeof(int) * B);
    if (!seqlens) return 1;
    ar_cuda_mla_case c;
    memset(&c, 0, sizeof c);
    c.batch = B;
    c.s_q = SQ;
    c.seqlens_k = seqlens;
    c.block_size = 64;
    c.causal = true;
    c.dtype = AR_BF16;
    c.kv_dtype = AR_BF16;
    c.kv_scale = 1.0;
    c.scale = 1.0 / 24.0;
    c.seed = 7;
    c.kernel = AR_MLA_KERNEL_AUTO;
    c.repeat = 20;
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
    if (wgsweep_only) {
        int src = run_wgsweep(c, seqlens);
        free(seqlens);
        ar_cuda_mla_release_case_buffers();
        return src;
    }
    if (sweep_only) {
        int src = run_sweep(c, seqlens);
        free(seqlens);
        ar_cuda_mla_release_case_buffers();
        return src;
    }
    peer_row peer[MAX_PEER];
    char peer_why[256] = "";
    int n_peer = run_peer(peer, peer_why, sizeof peer_why);

    printf("CUDA MLA decode (cuda-mla latent attention + combine) vs plain torch einsum, b=%d s_q=%d, d=576 dv=512, "
           "block 64, median of %d\n", B, SQ, c.repeat);
    printf("%-5s %-8s %-6s %-11s %6s %10s %9s %8s %6s | %12s %9s %8s\n", "h_q", "s_k", "kv", "kernel", "stages",
           "cuda-mla us", "TFLOP/s", "TB/s", "CTAs", "torch us", "TFLOP/s", "TB/s");
    int rc = 0;
    double best_tflops = 0, best_tbps = 0;
    for (size_t ih = 0; ih < 2; ih++)
        for (size_t ik = 0; ik < 14; ik++) {
            /* rows: 4 lengths (AUTO: on an sm_90 device the wgmma kernel at h_q 16 and 128; else the
             * narrow kernel at 16, split-QK at 128); fp8 cache at 16k (AUTO: split-QK at 128); 2-stage ring at
             * 16k (at 128: split-QK forced, what an A100 runs); the plain 64-row kernel x 4; at
             * h_q 128 the split-QK kernel forced x 4 (AUTO before the wgmma kernel, beside it) */
            bool fp8_row = ik == 4, ring2_row = ik == 5, plain_row = ik >= 6 && ik < 10, split_row = ik >= 10;
            if (split_row && hqs[ih] < 64) continue;
            int sk = ik < 4 ? sks[ik] : ik < 6 ? 16384 : sks[(ik - 6) % 4];
            for (int b = 0; b < B; b++) seqlens[b] = sk;
            c.h_q = hqs[ih];
            c.kv_dtype = fp8_row ? AR_FP8_E4M3 : AR_BF16;
            c.stages = ring2_row ? 2 : 0;
            c.kernel = plain_row                        ? AR_MLA_KERNEL_TC
                       : split_row || (ring2_row && c.h_q >= 64) ? AR_MLA_KERNEL_TC_SPLIT_QK
                                                            : AR_MLA_KERNEL_AUTO;
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
            if (!fp8_row && c.h_q == 128 && tflops > best_tflops) best_tflops = tflops;
            if (!fp8_row && c.h_q == 16 && tbps > best_tbps) best_tbps = tbps;
            printf("%-5d %-8d %-6s %-11s %6d %10.1f %9.1f %8.2f %6d | ", c.h_q, sk, fp8_row ? "fp8" : "bf16",
                   res.kernel_name ? res.kernel_name : "?", res.stages, res.attn_us, tflops, tbps, res.num_work);
            const peer_row *pr = ik >= 4 ? NULL : find_peer(peer, n_peer, c.h_q, sk);
            if (pr)
                printf("%12.1f %9.1f %8.2f\n", pr->us, flops / pr->us / 1e6, bytes / pr->us / 1e6);
            else
                printf("%12s\n", ik >= 4 ? "-" : "n/a");
        }
    if (n_peer == 0) printf("torch peer: %s\n", peer_why[0] ? peer_why : "no result");
    printf("targets (issue 6): >= 450 TFLOP/s at h_q=128 (best %.1f: %s), >= 3.6 TB/s at h_q=16 (best %.2f: %s)\n",
           best_tflops, best_tflops >= 450 ? "met" : "NOT met", best_tbps, best_tbps >= 3.6 ? "met" : "NOT met");
    if (run_sweep(c, seqlens) != 0) rc = 1;
    free(seqlens);
    ar_cuda_mla_release_case_buffers();
    return rc;
}
