/* profile_lookup.c - the interpolation `--step-time profile:DB` (sim/steptime.c) runs on a
 * loaded profile (sim/profile.c measures, writes and loads them): a GEMM's time at a token count
 * and a step's attention time from its requests' query and context lengths.
 *
 * Interpolation: piecewise linear along each axis; beyond the last grid point the last segment
 * is extended (never below the last value); below the first point the first value holds.  Two
 * axes: along the inner axis first, then the outer.  A step's attention = the decode requests
 * together at their count and mean context + each other request alone at its (query, context);
 * with attn_mixed, a step with decodes and prefills takes its largest prefill and the decodes
 * from the mixed grid, the other prefills alone; with attn_prompts "together" the prompts are one
 * lookup at their summed tokens and contexts instead.  With attn_skew, decodes of unequal contexts
 * take t(mean) + alpha x (t(largest) - t(mean)) when alpha is not 0 and t(largest) > t(mean)
 * (LLMServingSim's _lookup_attention_with_skew). */
#include "sim.h"

#include <math.h>

static double interp1(const double *xs, const double *ys, int n, double x)
{
    if (n <= 0) return 0;
    if (n == 1 || x <= xs[0]) return ys[0];
    int i = 1;
    while (i < n - 1 && xs[i] < x) i++;
    double x0 = xs[i - 1], x1 = xs[i], y0 = ys[i - 1], y1 = ys[i];
    double y = y0 + (y1 - y0) * (x - x0) / (x1 - x0);
    return x > xs[n - 1] ? fmax(y, ys[n - 1]) : y;
}

/* table[i][j] at (xa[i], xb[j]); na, nb <= AR_PROF_MAX_AXIS. */
static double interp2(const double *xa, int na, const double *xb, int nb,
                      const double table[AR_PROF_MAX_AXIS][AR_PROF_MAX_AXIS], double a, double b)
{
    double col[AR_PROF_MAX_AXIS];
    for (int i = 0; i < na; i++) col[i] = interp1(xb, table[i], nb, b);
    return interp1(xa, col, na, a);
}

double ar_profile_gemm_us(const ar_profile_table *p, int g, double m)
{
    if (g < 0 || g >= p->num_gemms) return 0;
    int n = p->gemm_num_m[g] > 0 && p->gemm_num_m[g] <= p->num_m ? p->gemm_num_m[g] : p->num_m;
    return interp1(p->m, p->gemm_us[g], n, m);
}

/* The points of an axis interp1 would use at x: *off and 1 or 2 points from there. */
static int segment(const double *xs, int n, double x, int *off)
{
    if (n <= 1 || x <= xs[0]) { *off = 0; return 1; }
    int i = 1;
    while (i < n - 1 && xs[i] < x) i++;
    *off = i - 1;
    return 2;
}

/* The mixed grid at (q, ctx, batch, dctx): piecewise linear along each axis as interp1 (the last
 * segment extended beyond the grid, never below its last value; the first value held below it),
 * dctx innermost, then batch, ctx, q; only the bracketing points of each axis are read. */
static double mixed_us(const ar_profile_table *p, double q, double ctx, double batch, double dctx)
{
    int oq, oc, ob, od;
    int lq = segment(p->mix_q, p->num_mix_q, q, &oq), lc = segment(p->mix_ctx, p->num_mix_ctx, ctx, &oc);
    int lb = segment(p->mix_batch, p->num_mix_batch, batch, &ob), ld = segment(p->mix_dctx, p->num_mix_dctx, dctx, &od);
    size_t nc = (size_t)p->num_mix_ctx, nb = (size_t)p->num_mix_batch, nd = (size_t)p->num_mix_dctx;
    double by_q[2], by_ctx[2], by_batch[2];
    for (int i = 0; i < lq; i++) {
        for (int j = 0; j < lc; j++) {
            for (int k = 0; k < lb; k++) {
                const double *row = p->mix_us + (((size_t)(oq + i) * nc + (size_t)(oc + j)) * nb + (size_t)(ob + k)) * nd;
                by_batch[k] = interp1(p->mix_dctx + od, row + od, ld, dctx);
            }
            by_ctx[j] = interp1(p->mix_batch + ob, by_batch, lb, batch);
        }
        by_q[i] = interp1(p->mix_ctx + oc, by_ctx, lc, ctx);
    }
    return interp1(p->mix_q + oq, by_q, lq, q);
}

/* The skew table's bin of v on axis a: the first whose bound v does not exceed, else the last. */
static int skew_bin(const ar_profile_table *p, int a, double v)
{
    int i = 0;
    while (i < p->skew_bins[a] - 1 && v > p->skew_upper[a][i]) i++;
    return i;
}

/* alpha for a decode batch (LLMServingSim's _skew_alpha): the cell of (pc exactly, decodes, skew
 * rate clipped to [0, 1], largest context, prompt context), skew_alpha_default without one. */
static double skew_alpha(const ar_profile_table *p, double pc, int decodes, double rate, double largest, double kp)
{
    int ip = 0;
    while (ip < p->num_skew_pc && p->skew_pc[ip] != pc) ip++;
    if (ip == p->num_skew_pc) return p->skew_alpha_default;
    double v[4] = {decodes, rate < 0 ? 0 : rate > 1 ? 1 : rate, largest, kp};
    size_t c = (size_t)ip;
    for (int a = 0; a < 4; a++) c = c * (size_t)p->skew_bins[a] + (size_t)skew_bin(p, a, v[a]);
    double alpha = p->skew_alpha[c];
    return isnan(alpha) ? p->skew_alpha_default : alpha;
}

double ar_profile_attention_us(const ar_profile_table *p, const int *query_lens, const int *context_lens, int n)
{
    double us = 0, decode_ctx = 0, dmin = 0, dmax = 0, q_sum = 0, ctx_sum = 0;
    int decodes = 0, largest = -1, prompts = 0;
    for (int r = 0; r < n; r++) {
        if (query_lens[r] == 1) {
            double c = context_lens[r];
            dmin = decodes == 0 || c < dmin ? c : dmin;
            dmax = decodes == 0 || c > dmax ? c : dmax;
            decodes++;
            decode_ctx += c;
        } else if (query_lens[r] > 1) {
            prompts++;
            q_sum += query_lens[r];
            ctx_sum += context_lens[r];
            if (largest < 0 || query_lens[r] > query_lens[largest]) largest = r;
        }
    }
    bool mixed = p->num_mix_q > 0 && decodes > 0 && largest >= 0;
    /* the prompt the decodes share a lookup with: all of them summed, or the largest */
    double pq = prompts == 0 ? 0 : p->prompts_together ? q_sum : query_lens[largest];
    double pc = prompts == 0 ? 0 : p->prompts_together ? ctx_sum : context_lens[largest];
    if (p->prompts_together) {
        if (prompts > 0 && !mixed) us += interp2(p->pre_q, p->num_pre_q, p->pre_ctx, p->num_pre_ctx, p->pre_us, pq, pc);
    } else {
        for (int r = 0; r < n; r++)
            if (query_lens[r] > 1 && !(mixed && r == largest))
                us += interp2(p->pre_q, p->num_pre_q, p->pre_ctx, p->num_pre_ctx, p->pre_us, query_lens[r],
                              context_lens[r]);
    }
    if (decodes == 0) return us;
    double mean = decode_ctx / decodes;
    double t_mean = mixed ? mixed_us(p, pq, pc, decodes, mean)
                          : interp2(p->dec_batch, p->num_dec_batch, p->dec_ctx, p->num_dec_ctx, p->dec_us, decodes, mean);
    /* LLMServingSim's skew correction (_lookup_attention_with_skew): toward the largest context */
    if (p->num_skew_pc > 0 && decodes > 1 && dmax > mean) {
        double alpha = skew_alpha(p, mixed ? pq : 0, decodes, dmax > dmin ? (mean - dmin) / (dmax - dmin) : 0.5, dmax,
                                  mixed ? pc : 0);
        if (alpha != 0) {
            double t_max = mixed ? mixed_us(p, pq, pc, decodes, dmax)
                                 : interp2(p->dec_batch, p->num_dec_batch, p->dec_ctx, p->num_dec_ctx, p->dec_us,
                                           decodes, dmax);
            if (t_max > t_mean) t_mean += alpha * (t_max - t_mean);
        }
    }
    return us + t_mean;
}
