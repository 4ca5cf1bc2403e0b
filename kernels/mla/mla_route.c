/* mla_route.c - the cuda-mla decision function and the plan of a route (mla_route.h has the rules
 * and the measurements behind them).  Plain C, host only. */
#include "mla_route.h"

#include <string.h>

ar_mla_route ar_mla_choose(const ar_mla_caps *caps, ar_cuda_mla_kernel forced, int max_rows, bool fp8_cache,
                           int stages_cap)
{
    ar_mla_route r;
    memset(&r, 0, sizeof r);
    r.ctas_per_sm = 1;
    if (forced == AR_MLA_KERNEL_SIMT || caps->tc_stages == 0) {
        r.kind = AR_MLA_ROUTE_SIMT;
        r.name = "simt";
        return r;
    }
    const int tc_stages = stages_cap == 2 && caps->tc_stages > 2 ? 2 : caps->tc_stages;
    const bool wgmma = caps->wgmma && !fp8_cache;
    const bool transposed = forced == AR_MLA_KERNEL_AUTO &&
                            (fp8_cache ? caps->wgmma16_fp8 && max_rows <= AR_MLA_W16_ROWS
                                       : wgmma && caps->wgmma16 && max_rows <= AR_MLA_W32_ROWS);
    const bool bulk_ok = caps->narrow_bulk && !fp8_cache && tc_stages >= 3;
    const bool narrow = max_rows <= AR_MLA_NARROW_ROWS && !transposed &&
                        (forced == AR_MLA_KERNEL_TC_NARROW || forced == AR_MLA_KERNEL_TC_NARROW_BULK ||
                         (forced == AR_MLA_KERNEL_AUTO && (!wgmma || max_rows < AR_MLA_NARROW_ROWS)));
    if (forced == AR_MLA_KERNEL_TC_SPLIT_QK)
        r.kind = AR_MLA_ROUTE_TC;
    else if (narrow && forced == AR_MLA_KERNEL_TC_NARROW)
        r.kind = AR_MLA_ROUTE_NARROW;
    else if (narrow)
        r.kind = bulk_ok ? AR_MLA_ROUTE_NARROW_BULK : AR_MLA_ROUTE_NARROW;
    else
        r.kind = wgmma || transposed ? AR_MLA_ROUTE_WGMMA : AR_MLA_ROUTE_TC;
    switch (r.kind) {
    case AR_MLA_ROUTE_WGMMA:
        r.stages = 2;
        r.combine_rows = true;
        r.rows_t = !transposed ? 0 : max_rows <= AR_MLA_W16_ROWS ? AR_MLA_W16_ROWS : AR_MLA_W32_ROWS;
        r.tensor_map = !fp8_cache;
        r.name = r.rows_t == AR_MLA_W16_ROWS ? "tc-wgmma16" : r.rows_t ? "tc-wgmma32" : "tc-wgmma";
        break;
    case AR_MLA_ROUTE_NARROW_BULK:
        r.stages = AR_MLA_NB_STAGES;
        r.ctas_per_sm = 2;
        r.persistent = true;
        r.combine_rows = true;
        r.name = "tc-narrow-bulk";
        break;
    case AR_MLA_ROUTE_NARROW:
        r.stages = tc_stages >= 3 ? 4 : 2;
        r.name = "tc-narrow";
        break;
    default:
        r.stages = tc_stages;
        r.name = "tc-split-qk";
        break;
    }
    return r;
}

bool ar_mla_wgmma_cpasync(const ar_mla_route *r, int block_size, bool have_tmap)
{
    return r->kind == AR_MLA_ROUTE_WGMMA && r->tensor_map &&
           (!have_tmap || (r->rows_t == 0 && block_size < AR_MLA_PAIRS_MIN_BLOCK));
}

const char *ar_mla_route_path(const ar_mla_route *route, bool cpasync, bool split)
{
    switch (route->kind) {
    case AR_MLA_ROUTE_WGMMA:
        if (cpasync) return split ? "mla-decode:tc-wgmma-cpasync+split" : "mla-decode:tc-wgmma-cpasync";
        if (route->rows_t == AR_MLA_W16_ROWS) return split ? "mla-decode:tc-wgmma16+split" : "mla-decode:tc-wgmma16";
        if (route->rows_t == AR_MLA_W32_ROWS) return split ? "mla-decode:tc-wgmma32+split" : "mla-decode:tc-wgmma32";
        return split ? "mla-decode:tc-wgmma+split" : "mla-decode:tc-wgmma";
    case AR_MLA_ROUTE_NARROW_BULK: return split ? "mla-decode:tc-narrow-bulk+split" : "mla-decode:tc-narrow-bulk";
    case AR_MLA_ROUTE_NARROW: return split ? "mla-decode:tc-narrow+split" : "mla-decode:tc-narrow";
    case AR_MLA_ROUTE_TC: return split ? "mla-decode:tc-split-qk+split" : "mla-decode:tc-split-qk";
    default: return "mla-decode:simt";
    }
}

int ar_mla_replan(ar_mla_plan *p, const ar_mla_route *route, int R, const int *qsl, const int *seq_lens,
                  const unsigned char *include, int H, int causal, int extra, int num_sms, int force_splits)
{
    if (force_splits > 0 || (!route->persistent && route->ctas_per_sm <= 1)) return 0;
    ar_mla_plan_free(p);
    if (route->persistent)
        return ar_mla_build_plan_persistent(p, R, qsl, seq_lens, include, H, causal, extra,
                                            num_sms * route->ctas_per_sm);
    return ar_mla_build_plan(p, R, qsl, seq_lens, include, H, causal, extra, num_sms * route->ctas_per_sm,
                             force_splits);
}
