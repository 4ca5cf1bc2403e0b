/* attn_plan.c - the "cuda" backend's planner (attn_plan.h): the split rules, a launch's work
 * items and their split-KV pieces, then the decision function that picks each launch's kernel
 * and split count (its opening comment has the rule and the measurements behind it).  Plain C,
 * host only; tests/test_attn_plan.c checks it. */
#include "attn_plan.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../../replay/backend.h"
#include "item_order.h"

void ar_attn_pieces_free(ar_attn_pieces *p)
{
    free(p->work);
    free(p->groups);
    memset(p, 0, sizeof *p);
}

/* Room for n_work pieces and n_groups groups in *out (zeroed first); 0 ok, 3 out of memory
 * (then nothing held). */
static int pieces_alloc(ar_attn_pieces *out, int64_t n_work, int64_t n_groups)
{
    memset(out, 0, sizeof *out);
    out->work = malloc((size_t)(n_work > 0 ? n_work : 1) * sizeof *out->work);
    out->groups = malloc((size_t)(n_groups > 0 ? n_groups : 1) * sizeof *out->groups);
    if (out->work && out->groups) return 0;
    ar_attn_pieces_free(out);
    return 3;
}

/* FlashAttention's 85%-of-best-wave-efficiency rule for an under-filled launch, and the tail
 * rule for an over-filled one with few waves ("Split heuristic" in the decision's comment). */
int ar_attn_split_count(int num_ctas, int max_units, int slots)
{
    if (num_ctas <= 0 || max_units <= 1 || slots <= 0) return 1;
    int max_s = AR_MAX_SPLITS;
    if (max_s > slots) max_s = slots;
    if (max_s > max_units) max_s = max_units;
    if ((double)num_ctas >= 0.8 * slots) {
        /* tail rule: time ~ ceil(C s / S_slots) / s (waves of unsplit work) */
        if ((double)num_ctas >= 4.0 * slots) return 1;
        double cost[9], best = 1e30;
        int top = max_s < 8 ? max_s : 8;
        for (int s = 1; s <= top; s++) {
            cost[s] = ceil((double)num_ctas * s / slots) / s;
            if (cost[s] < best) best = cost[s];
        }
        for (int s = 1; s <= top; s++)
            if (cost[s] <= 1.05 * best) return s;
        return 1;
    }
    double eff[AR_MAX_SPLITS + 1];
    double best = 0.0;
    for (int s = 1; s <= max_s; s++) {
        eff[s] = 0.0;
        if (s > 1 && (max_units + s - 1) / s == (max_units + s - 2) / (s - 1)) continue;
        double waves = (double)num_ctas * s / slots;
        eff[s] = waves / ceil(waves);
        if (eff[s] > best) best = eff[s];
    }
    for (int s = 1; s <= max_s; s++)
        if (eff[s] >= 0.85 * best) return s;
    return 1;
}

/* The uneven rule's cut, for DECODE's items and DECODE_TMA's requests alike: the smallest
 * s >= base (at most most_pieces and max_units) whose pieces of the longest item,
 * ceil(max_units / s) units, are at most ratio x fair, fair = ceil(total units / slots); the
 * largest allowed when none is. */
static int uneven_cut(int64_t total, int max_units, int slots, int base, int ratio, int most_pieces)
{
    const int64_t fair = total > slots ? (total + slots - 1) / slots : 1;
    const int top = most_pieces < max_units ? most_pieces : max_units;
    for (int s = base; s <= top; s++)
        if ((max_units + s - 1) / s <= ratio * fair) return s;
    return top > base ? top : base;
}

/* Units of items [n] in key tiles of warps_n. */
static int64_t total_units(const ar_attn_work *items, int64_t n, int warps_n)
{
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) total += (items[i].tile_end - items[i].tile_begin + warps_n - 1) / warps_n;
    return total;
}

int ar_attn_split_count_uneven(const ar_attn_work *items, int64_t n, int max_units, int warps_n, int slots, int base,
                               int ratio)
{
    if (n <= 0 || max_units <= 1 || slots <= 0 || warps_n <= 0 || base < 1 || ratio < 1) return base;
    return uneven_cut(total_units(items, n, warps_n), max_units, slots, base, ratio, AR_MAX_SPLITS);
}

int ar_attn_split_path_ratio_for(const ar_attn_work *items, int64_t n, int max_units, int warps_n, int slots, int ratio,
                                 int large_ratio)
{
    if (ratio < 1 || large_ratio < 1 || n <= 0 || slots <= 0 || warps_n <= 0) return ratio;
    const int64_t total = total_units(items, n, warps_n);
    const int64_t fair = (total + slots - 1) / slots;
    const bool uneven = (int64_t)max_units * n > 2 * total;
    return fair >= AR_SPLIT_PATH_LARGE_FAIR && uneven ? large_ratio : ratio;
}

/* The uneven rule's ratio for this run: AR_CUDA_SPLIT_PATH_RATIO, else AR_SPLIT_PATH_RATIO (-1: off). */
static int split_path_ratio(const ar_attn_device *d)
{
    return d->split_path_ratio ? d->split_path_ratio : AR_SPLIT_PATH_RATIO;
}

/* The large uneven DECODE launches' ratio for this run: AR_CUDA_SPLIT_PATH_LARGE, else
 * AR_SPLIT_PATH_LARGE unless AR_CUDA_SPLIT_PATH_RATIO asks one ratio of every launch (a sweep of
 * the ratio measures it alone); 0 none. */
static int split_path_large(const ar_attn_device *d)
{
    if (d->split_path_large) return d->split_path_large > 0 ? d->split_path_large : 0;
    return d->split_path_ratio ? 0 : AR_SPLIT_PATH_LARGE;
}

/* The cascade prefix pass: one sequence, so every unsplit item has the same length and the
 * time is ~ ceil(C s / S_slots) / s waves of unsplit work.  Take the smallest s within 5% of
 * the best over s <= 64 (no split from 4 waves of unsplit work up), with pieces of at least 2
 * key-tile units (the Q tile load and the partial write are amortised) - e.g. C = 32 items on
 * 264 slots: s = 8 (256 CTAs, one wave) where the FlashAttention rule took 7 (224 CTAs: 15% of
 * the slots idle, 14% longer pieces). */
int ar_attn_prefix_split_count(int num_ctas, int max_units, int slots)
{
    if (num_ctas <= 0 || max_units <= 1 || slots <= 0 || num_ctas >= 4 * slots) return 1;
    int max_s = max_units / 2;
    if (max_s > AR_MAX_SPLITS) max_s = AR_MAX_SPLITS;
    if (max_s < 1) return 1;
    double best = 1e30;
    for (int s = 1; s <= max_s; s++) {
        double cost = ceil((double)num_ctas * s / slots) / s;
        if (cost < best) best = cost;
    }
    for (int s = 1; s <= max_s; s++)
        if (ceil((double)num_ctas * s / slots) / s <= 1.05 * best) return s;
    return 1;
}

static int cmp_work_desc(const void *pa, const void *pb)
{
    const ar_attn_work *a = pa, *b = pb;
    int la = a->tile_end - a->tile_begin, lb = b->tile_end - b->tile_begin;
    if (la != lb) return lb - la;
    if (a->req != b->req) return a->req - b->req;
    if (a->kv_head != b->kv_head) return a->kv_head - b->kv_head;
    return a->pair0 - b->pair0;
}

void ar_attn_sort_longest_first(ar_attn_work *work, int64_t n)
{
    if (n > 1) qsort(work, (size_t)n, sizeof *work, cmp_work_desc);
}

int ar_attn_items(const ar_attn_shape *sh, ar_attn_work **items_out, int64_t *n_out, int *max_units_out)
{
    const int R = sh->num_reqs, rows = sh->rows, bn = sh->block_n, wn = sh->warps_n, group = sh->group;
    const int window = sh->non_causal ? 0 : sh->window;
    *items_out = NULL;
    *n_out = 0;
    *max_units_out = 0;
    int64_t n_items = 0;
    for (int r = 0; r < R; r++) {
        int ql = sh->query_start_loc[r + 1] - sh->query_start_loc[r];
        n_items += (int64_t)sh->num_kv_heads * ((ql * group + rows - 1) / rows);
    }
    int max_units = 0;
    ar_attn_work *items = malloc((size_t)(n_items > 0 ? n_items : 1) * sizeof *items);
    if (!items) return 3;
    int64_t k = 0;
    for (int r = 0; r < R; r++) {
        int ql = sh->query_start_loc[r + 1] - sh->query_start_loc[r], sl = sh->seq_lens[r], ctx = sl - ql;
        int pairs = ql * group;
        for (int h = 0; h < sh->num_kv_heads; h++)
            for (int p0 = 0; p0 < pairs; p0 += rows) {
                int tf = p0 / group, tl = (p0 + rows - 1) / group;
                if (tl > ql - 1) tl = ql - 1;
                int kv_end = sh->non_causal ? sl : ctx + tl + 1 + sh->extra;
                if (kv_end > sl) kv_end = sl;
                int kv_start = window > 0 ? ctx + tf - window + 1 : 0;
                if (kv_start < 0) kv_start = 0;
                ar_attn_work *w = &items[k++];
                w->req = r;
                w->kv_head = h;
                w->pair0 = p0;
                w->tile_begin = kv_start / bn;
                w->tile_end = kv_end > kv_start ? (kv_end + bn - 1) / bn : w->tile_begin;
                w->partial = -1;
                w->partial_stride = 0;
                int units = (w->tile_end - w->tile_begin + wn - 1) / wn;
                if (units > max_units) max_units = units;
            }
    }
    *items_out = items;
    *n_out = n_items;
    *max_units_out = max_units;
    return 0;
}

int ar_attn_cut(const ar_attn_work *items, int64_t n_items, int splits, int max_units, int warps_n,
                ar_attn_pieces *out)
{
    const int wn = warps_n;
    int chunk_units = splits > 1 ? (max_units + splits - 1) / splits : max_units;
    if (chunk_units < 1) chunk_units = 1;
    int64_t n_work = 0, n_groups = 0, n_partials = 0;
    for (int64_t i = 0; i < n_items; i++) {
        int units = (items[i].tile_end - items[i].tile_begin + wn - 1) / wn;
        int pieces = splits > 1 ? (units + chunk_units - 1) / chunk_units : 1;
        if (pieces < 1) pieces = 1;
        n_work += pieces;
        if (pieces > 1) {
            n_groups++;
            n_partials += pieces;
        }
    }
    if (pieces_alloc(out, n_work, n_groups)) return 3;
    ar_attn_work *work = out->work;
    ar_combine_group *groups = out->groups;
    int64_t wi = 0, gi = 0, pi = 0;
    for (int64_t i = 0; i < n_items; i++) {
        ar_attn_work it = items[i];
        int units = (it.tile_end - it.tile_begin + wn - 1) / wn;
        int pieces = splits > 1 ? (units + chunk_units - 1) / chunk_units : 1;
        if (pieces <= 1) {
            work[wi++] = it;
            continue;
        }
        ar_combine_group *g = &groups[gi++];
        memset(g, 0, sizeof *g);
        g->req = it.req;
        g->kv_head = it.kv_head;
        g->pair0 = it.pair0;
        g->first_partial = (int)pi;
        g->count = pieces;
        for (int p = 0; p < pieces; p++) {
            ar_attn_work piece = it;
            piece.tile_begin = it.tile_begin + p * chunk_units * wn;
            piece.tile_end = piece.tile_begin + chunk_units * wn;
            if (piece.tile_end > it.tile_end) piece.tile_end = it.tile_end;
            piece.partial = (int)(pi++);
            work[wi++] = piece;
        }
    }
    out->num_work = n_work;
    out->num_groups = n_groups;
    out->num_partials = n_partials;
    return 0;
}

/* A decode request's cache blocks (16 keys): from its window's start to its last key. */
static void decode_blocks(int seq_len, int window, int *begin, int *end)
{
    int kv_start = window > 0 ? seq_len - window : 0;
    if (kv_start < 0) kv_start = 0;
    *begin = kv_start / 16;
    *end = (seq_len + 15) / 16;
}

void ar_attn_decode_tma_extent(int num_reqs, const int *seq_lens, int window,
                               int *max_blocks, int64_t *total_blocks, int *max_seq)
{
    *max_blocks = *max_seq = 0;
    *total_blocks = 0;
    for (int r = 0; r < num_reqs; r++) {
        int begin, end;
        decode_blocks(seq_lens[r], window, &begin, &end);
        *total_blocks += end - begin;
        if (end - begin > *max_blocks) *max_blocks = end - begin;
        if (seq_lens[r] > *max_seq) *max_seq = seq_lens[r];
    }
}

/* ar_attn_decode_tma_uneven_splits with at most most_pieces pieces a request. */
static int decode_tma_uneven_cut(int64_t total_blocks, int max_blocks, int slots, int ratio, int most_pieces)
{
    if (ratio < 1 || slots < 1 || max_blocks <= 1) return 1;
    return uneven_cut(total_blocks, max_blocks, slots, 1, ratio, most_pieces);
}

int ar_attn_decode_tma_uneven_splits(int64_t total_blocks, int max_blocks, int slots, int ratio)
{
    return decode_tma_uneven_cut(total_blocks, max_blocks, slots, ratio, AR_MAX_SPLITS);
}

int ar_attn_decode_tma_items(int num_reqs, const int *query_start_loc, const int *seq_lens, int window,
                             int num_kv_heads, int splits, int max_blocks, ar_attn_pieces *out)
{
    const int chunk = splits > 1 ? (max_blocks + splits - 1) / splits : (max_blocks > 0 ? max_blocks : 1);
    int64_t n_work = 0, n_groups = 0;
    for (int r = 0; r < num_reqs; r++) {
        if (query_start_loc[r + 1] - query_start_loc[r] != 1) continue;
        int begin, end;
        decode_blocks(seq_lens[r], window, &begin, &end);
        const int pieces = splits > 1 && end - begin > chunk ? (end - begin + chunk - 1) / chunk : 1;
        n_work += pieces;
        if (pieces > 1) n_groups += num_kv_heads;
    }
    if (pieces_alloc(out, n_work, n_groups)) return 3;
    ar_attn_work *work = out->work;
    ar_combine_group *groups = out->groups;
    int64_t n = 0, gi = 0, n_partials = 0;
    for (int r = 0; r < num_reqs; r++) {
        if (query_start_loc[r + 1] - query_start_loc[r] != 1) continue;
        int begin, end;
        decode_blocks(seq_lens[r], window, &begin, &end);
        const int pieces = splits > 1 && end - begin > chunk ? (end - begin + chunk - 1) / chunk : 1;
        if (pieces == 1) {
            ar_attn_work w = {r, 0, 0, begin, end, -1, 0};
            work[n++] = w;
            continue;
        }
        const int base = (int)n_partials;
        for (int h = 0; h < num_kv_heads; h++) {
            ar_combine_group *g = &groups[gi++];
            memset(g, 0, sizeof *g);
            g->req = r;
            g->kv_head = h;
            g->pair0 = 0;
            g->first_partial = base + h * pieces;
            g->count = pieces;
        }
        for (int p = 0; p < pieces; p++) {
            const int b0 = begin + p * chunk, b1 = b0 + chunk < end ? b0 + chunk : end;
            ar_attn_work w = {r, 0, 0, b0, b1, base + p, pieces};
            work[n++] = w;
        }
        n_partials += (int64_t)pieces * num_kv_heads;
    }
    out->num_work = n;
    out->num_groups = gi;
    out->num_partials = n_partials;
    return 0;
}

/* ---- the decision ------------------------------------------------------------------------ */

/* The decision (ar_attn_build_plan).
 *
 * Which kernel runs a launch: decode launches (one query token per request) of at least half as
 * many requests as SMs with every context at most 16k keys, or of at least 0.9 x SMs requests,
 * head size 128, block size 16, at most 8 KV heads, on a compute-capability 9.0 device with
 * tensor maps take DECODE_TMA (one CTA per request, or per piece of one where decode_tma_splits
 * cuts it, whole cache blocks by TMA; see
 * decode_tma_plan for the measurements behind the rule; the cascade suffix pass of a decode
 * batch is such a launch), and so do flat decode launches of 0.48 to 0.5 x SMs requests with
 * contexts of at most 16k keys (decode_tma_small_rule); other launches in the DECODE geometry
 * (every (request, KV head) within 16 rows) take the mma.sync DECODE kernel; other launches
 * with head size exactly 128 or 256 on a compute-capability 9.0 device whose driver encodes
 * tensor maps take PREFILL_WG (128-row tiles over 128 keys at head size 128, 64 keys at 256; two
 * ping-pong consumer warpgroups fed by a producer warpgroup whose whole-tile K/V copies are bulk
 * tensor copies; H200: causal prefill B=2 S=8k hd 128 500.6 TFLOP/s against 272 for the mma.sync
 * kernel, BENCHMARKS.md).  Everything else runs the
 * mma.sync PREFILL kernel.  AR_CUDA_WGMMA=0 in the environment keeps the mma.sync kernels
 * everywhere (the fallback, for comparisons).  An fp8 cache runs the fp8-KV variants of
 * DECODE_TMA, DECODE and PREFILL, by the same rule, except that PREFILL_WG launches take PREFILL
 * (forced too) and that fp8 DECODE_TMA batches are cut into pieces that fill the SMs
 * (decode_tma_splits); the split rule then uses those kernels' occupancy.
 *
 * Split heuristic (FlashAttention 2/3's num_splits_heuristic, the "85% of the best wave
 * efficiency" rule): let C be the CTAs of the unsplit launch and S_slots = SMs x CTAs that fit
 * on one SM.  If C >= 0.8 S_slots, do not split.  Otherwise, for s = 1 .. min(64, S_slots,
 * n_blocks) (n_blocks: the most key-tile units any CTA walks; a unit is one key tile per warp
 * column) skip every s that does not change ceil(n_blocks / s) and take the wave efficiency
 * e(s) = w / ceil(w) with w = C s / S_slots; choose the smallest s with e(s) >= 0.85 max e.
 * Our addition (the "tail rule"): when C >= 0.8 S_slots but under 4 waves, the last wave can
 * leave most SMs idle (C = 512 on 396 slots runs 2 waves for 1.29 waves of work), so take the
 * smallest s <= 8 whose ceil(C s / S_slots) / s is within 5% of the best.
 * Each work item is then cut into pieces of ceil(n_blocks / s) units (short ones stay whole),
 * so the split is per request, like FA3's dynamic varlen splits.  A DECODE launch whose longest
 * item would outlast the rest takes ar_attn_split_count_uneven's larger count.  On the Mooncake
 * trace (H100, 2026-12-06 11:11 UTC, before it): a decode step of 11 requests, one of them at 135k
 * keys, took the rule's 6 splits, 48 CTAs on the long request, and ran in 650 us (960 GB/s) where
 * FA3's paged decode took 405-420 us; a step of 61 requests of up to 40k keys, unsplit, read at
 * 2.94 TB/s, its longest item (20.5 MB) at 29 GB/s, 5.2 times its even share of that rate over
 * 528 slots (the estimate behind the first ratio, 4; the trace's sweep chose AR_SPLIT_PATH_RATIO,
 * 2: attn_plan.h).
 *
 * Item order: the work list is sorted longest first, except a PREFILL_WG launch's: its CTAs take
 * their items from a queue, and wg_l2_order puts its list in item_order.h's order: longest first within sections
 * of (request, KV head) groups whose K/V take at most AR_ITEM_ORDER_SECTION_MB (8 MiB; a third
 * of the L2 until 2026-12-07), so that the items at work at one time share their keys through
 * the L2 (sections of a third of the L2 against none: H200, 2026-12-03 14:05 UTC, bench_cuda 10,
 * two rounds, TFLOP/s, before / after: varlen 375.2-377.0 / 409.3-409.6, DRAM bytes read 782 /
 * 235 MB and L2 hit rate 30.8% / 66.8% under ncu; causal hd 128 590.5-590.9 / 621.0-621.2, hd 256
 * 654.4-656.4 / 663.4-663.8, the chunked step 578.6-583.3 / 590.3-590.4; the queue alone over
 * the longest-first list, AR_CUDA_WG_SECTION_MB=0: 370.1-370.7 / 592.1-592.6 / 656.5-657.2 /
 * 570.6-576.2).  The other kernels keep the longest-first list (a CTA per item, in order).
 *
 * The environment's sweep knobs (cuda_backend.cu's opening comment) change these choices for
 * measurements: AR_CUDA_DECODE_SPLITS fixes DECODE's s; AR_CUDA_DECODE_TMA=rule keeps the
 * small-batch launches of decode_tma_small_rule on DECODE; AR_CUDA_DECODE_TMA=split lets DECODE_TMA
 * take the flat decode batches below its rule too, its requests cut into pieces (decode_tma_splits);
 * AR_CUDA_DECODE_TMA_SPLITS fixes that cut. */

void ar_attn_plan_free(ar_attn_plan *pl)
{
    free(pl->work);
    free(pl->groups);
    memset(pl, 0, sizeof *pl);
}

int ar_attn_combine_team(const ar_combine_group *groups, int64_t num_groups, int64_t member_threads,
                         int64_t thread_slots, int setting)
{
    if (setting > 0) return setting;
    int most = 0;
    for (int64_t g = 0; g < num_groups; g++)
        if (groups[g].count > most) most = groups[g].count;
    int team = 1;
    while (team < AR_COMBINE_TEAM_MOST && most > team * AR_COMBINE_TEAM_SPAN) team *= 2;
    if (setting == AR_COMBINE_TEAM_FILL) {
        const int64_t one_each = num_groups * (member_threads > 0 ? member_threads : 1);
        int wide = 1;
        while (wide < AR_COMBINE_TEAM_MOST && wide < most &&
               one_each * wide * 2 * AR_COMBINE_FILL_SHARE <= thread_slots)
            wide *= 2;
        if (wide > team) team = wide;
    }
    return team;
}

/* The plan of a launch: its config, geometry and split count, and the pieces (taken over). */
static void plan_take(ar_attn_plan *pl, int config, ar_attn_geom geom, int splits, const ar_attn_pieces *pc)
{
    pl->config = config;
    pl->geom = geom;
    pl->num_splits = splits;
    pl->num_work = pc->num_work;
    pl->num_groups = pc->num_groups;
    pl->num_partials = pc->num_partials;
    pl->work = pc->work;
    pl->groups = pc->groups;
}

/* AR_CFG_DECODE_TMA (cuda_attn_decode_tma.cuh) can run this launch: Hopper with tensor maps,
 * a 16-bit or an fp8 cache, head size 128, block size 16, at most 8 KV heads, a group of at most 16, no planted fault
 * (the faults live in the general kernels), causal, and one query token per request.  The
 * automatic plan takes it (force_config -1, no forced split, AR_CUDA_DECODE_TMA not 0) for
 * batches of at least half as many requests as the device has SMs whose longest context is at
 * most DECODE_TMA_MAX_KEYS keys, and for batches of at least 0.9 x SMs requests at any
 * context: one CTA walks a request, or a piece of one of at most twice the even share
 * (decode_tma_splits), so it needs most SMs busy, and none of its requests much longer than the
 * rest (decode_tma_lopsided).  On the H200
 * (bench_cascade's FLAT lines, 128 decodes, GQA 32/8, whole-block boxes, out/run52.sh,
 * 2026-11-30): 128 keys (the cascade suffix pass) 30.7 us against 36.0 for DECODE; 1152 keys
 * 82.1 against 155.6; 8320 keys 480.0 against 761.4; 32896 keys 1845.8 against 2888.7; 33024
 * keys 1845-2030 against 3105.4.  With fewer requests DECODE's split-KV fills the machine (the
 * decode bench's 64 requests stay on it).  force_config AR_CFG_DECODE_TMA takes it whenever it
 * can run. */
#define DECODE_TMA_MAX_KEYS 16384
static bool decode_tma_rule(const ar_attn_device *d, int R, int max_seq)
{
    return (2 * R >= d->num_sms && max_seq <= DECODE_TMA_MAX_KEYS) || 10 * R >= 9 * d->num_sms;
}
/* Just below that rule, a flat decode launch of at least 0.48 x SMs requests with contexts of at
 * most DECODE_TMA_MAX_KEYS keys takes DECODE_TMA too (measured with whole requests; the default
 * plan cuts such a batch into 2 pieces a request, decode_tma_splits): one DECODE_TMA CTA streams
 * about 67 GB/s (H200, kernels/paged/decode_sweep.sh, 8k contexts, GQA 32:8, 2026-12-02: B 48 in
 * 500.2 us = 3.22 TB/s over 48 CTAs, B 64 in 505.3 us = 4.25 TB/s over 64), so it takes about
 * the copy ceiling (4.23 TB/s) / 67 GB/s = 64 CTAs, 0.48 of the 132 SMs, to read at the rate of
 * the DRAM.  There B 64 runs in 505.3-509.1 us against 542.8 us on DECODE (3 splits, 1536 CTAs
 * and their combine) and 528.8 us for FA3's paged decode in the same run; at B 48 DECODE keeps it
 * (395.1 us; cut into pieces, DECODE_TMA took 413.6).  AR_CUDA_DECODE_TMA=rule keeps these
 * launches on DECODE. */
static bool decode_tma_small_rule(const ar_attn_device *d, int R, int max_seq)
{
    return d->decode_tma_small && 25 * R >= 12 * d->num_sms && max_seq <= DECODE_TMA_MAX_KEYS;
}
/* A batch too lopsided for DECODE_TMA's whole requests: one CTA walks each request, at about 67
 * GB/s (decode_tma_small_rule's measurement: 64 such CTAs reach the DRAM's rate), so a request of
 * more than 2/64 of the batch's key blocks makes the launch at least twice its DRAM-bound time
 * (one request of 135k keys among 118 of 2k: 8,447 of 23,197 blocks, about 12x).  Only a request
 * longer than DECODE_TMA_MAX_KEYS counts: up to there the rule's batches are measured as they are
 * (and a small batch's one long request costs microseconds; the llama-3.1-8b sample's 74-request
 * decodes, one of 911 keys, keep DECODE_TMA).  The automatic plan sends such a batch to DECODE,
 * whose split rule cuts the long request (ar_attn_split_count_uneven, measured on the Mooncake
 * trace's lopsided decode steps).  Measured on an H100 (2026-12-06, tests/bench_cuda.c's
 * decode_lopsided_b121_s2048_135k, 120 requests of 2k keys and one of 135k): 815-822 us on
 * DECODE against 7,808-7,871 us with DECODE_TMA forced. */
static bool decode_tma_lopsided(int max_seq, int max_blocks, int64_t total)
{
    if (max_seq <= DECODE_TMA_MAX_KEYS) return false;
    return (int64_t)max_blocks * 32 > total;
}
/* A flat 16-bit decode launch of many requests, long, uneven and large, which the rules above leave
 * to DECODE: DECODE_TMA with the uneven rule's pieces at the large uneven launches' ratio (1: no
 * piece longer than the even share of the launch's blocks over one CTA an SM; decode_tma_splits)
 * reads it faster than DECODE at its own ratio 1.  Many: at least a quarter as many requests as
 * SMs; long: one past DECODE_TMA_MAX_KEYS keys; uneven: the longest over twice the mean and at most
 * 32 times it; large: at least DECODE_TMA_MANY_BLOCKS blocks an SM of even share.  Every measured
 * batch that gained was all four; shorter or uniform batches of that size keep DECODE (B 32 and B
 * 48 of 8k keys: 377 and 542 us against DECODE_TMA's pieces' 382 and 562, H100, 2026-12-06), and so
 * does bench_cuda's decode_lopsided_b121_s2048_135k (one of 135k keys among 120 of 2k, 44 times the
 * mean: 573.3-576.4 us on DECODE_TMA against 566.8-567.6 on DECODE, H100, 2026-12-06 20:54 UTC).
 * Measured on the Mooncake trace (H100, 2026-12-06 20:46 UTC, kernels/paged/trace_sweep.sh, every
 * step verified), AR_CUDA_DECODE_TMA=uneven at ratio 1 against the default (DECODE at ratio 1 for
 * these launches): its 500 decode steps of 33-71 requests (241k-529k keys, the longest 3.5-21x the
 * mean) 0.949 of the total time, 94% of them faster, the slowest 1.04; its 139 steps of 8-32
 * requests 1.071 (1.04-1.15 by request count; among them the 132 lopsided ones, about 11 requests
 * with one of up to 135k keys, whose long request's cut reaches AR_MAX_SPLITS pieces), so those
 * keep DECODE; cut into up to 256 pieces (AR_CUDA_DECODE_TMA_PIECES, H100, 2026-12-07) they only
 * drew level with it (0.997 of its time), so the rule stops short of them.  With the rule on
 * (20:54 UTC, the same harness), those 500 steps took 1.056 of its time under
 * AR_CUDA_DECODE_TMA_MANY=0 (the rule faster on 95% of them), and FA3's paged decode 1.011 of it,
 * median 1.014 (before the rule, two runs: 0.936 and 0.997, medians 0.931 and 0.954).
 * Off with the large ratio (AR_CUDA_SPLIT_PATH_LARGE=off, or AR_CUDA_SPLIT_PATH_RATIO alone): at
 * ratio 2 these pieces lost (1.025 of the default on the same steps).  AR_CUDA_DECODE_TMA_MANY=0
 * turns this rule off alone; AR_CUDA_DECODE_TMA=rule, with the small one. */
#define DECODE_TMA_MANY_BLOCKS 64
static bool decode_tma_many_rule(const ar_attn_device *d, int R, int max_seq, int max_blocks, int64_t total_blocks)
{
    return d->decode_tma_many && !d->kv_fp8 && split_path_large(d) >= 1 && 4 * R >= d->num_sms &&
           max_seq > DECODE_TMA_MAX_KEYS &&
           (int64_t)max_blocks * R > 2 * total_blocks && (int64_t)max_blocks * R <= 32 * total_blocks &&
           total_blocks >= (int64_t)DECODE_TMA_MANY_BLOCKS * d->num_sms;
}
/* flat: a flat launch (not a cascade pass); AR_CUDA_DECODE_TMA=split or =uneven
 * (d->decode_tma_all) lets the automatic plan take DECODE_TMA for every flat decode launch it can
 * run, below the rule's batch sizes too (decode_tma_splits then cuts the requests so that the
 * pieces fill the SMs); without it a lopsided batch (decode_tma_lopsided) stays on DECODE.
 * max_seq, max_blocks, total_blocks: the launch's extent (ar_attn_decode_tma_extent). */
static bool decode_tma_plan(const ar_attn_device *d, int R, const int *query_start_loc, int max_seq, int max_blocks,
                            int64_t total_blocks, bool non_causal, int force_config, int force_splits, bool flat)
{
    if (!d->has_tma || non_causal || d->head_size != 128 || d->template_hd != 128 ||
        d->block_size != 16 || d->num_kv_heads > 8 || d->group > 16 || d->fault != AR_FAULT_NONE)
        return false;
    for (int r = 0; r < R; r++)
        if (query_start_loc[r + 1] - query_start_loc[r] > 1) return false;
    if (force_config == AR_CFG_DECODE_TMA) return true;
    if (force_config >= 0 || force_splits > 0 || !d->decode_tma_auto) return false;
    if (flat && d->decode_tma_all) return true;
    if (flat && decode_tma_many_rule(d, R, max_seq, max_blocks, total_blocks)) return true;
    if (decode_tma_lopsided(max_seq, max_blocks, total_blocks)) return false;
    return decode_tma_rule(d, R, max_seq) || (flat && decode_tma_small_rule(d, R, max_seq));
}

/* The pieces per request of a DECODE_TMA launch.  Only flat launches split (a cascade suffix pass
 * keeps whole requests): a forced split with force_config AR_CFG_DECODE_TMA, else
 * AR_CUDA_DECODE_TMA_SPLITS (d->decode_tma_splits), else, for a 16-bit cache, the uneven rule
 * (ar_attn_decode_tma_uneven_splits at the uneven rule's ratio; ratio off: whole requests), and
 * for an fp8 cache, and under AR_CUDA_DECODE_TMA=split for a 16-bit batch below decode_tma_rule's
 * sizes, choose_num_splits over SMs x CTAs per SM (B 64 on 132 SMs: 2, 128 CTAs in one wave).
 *
 * The uneven rule cuts a request only where it is longer than twice its even share of the
 * launch's blocks over one CTA an SM, so a uniform batch from 0.5 x SMs requests keeps whole
 * requests (B 66 to 131 on 132 SMs), a batch of 0.48 to 0.5 x SMs requests (decode_tma_small_rule)
 * takes 2 pieces a request, and a long request among shorter ones is cut to about its even share
 * instead of outlasting the rest (127 requests of 8k keys and one of 16k: the long one in 2
 * pieces, 129 CTAs, where whole it took twice as long as the others; bench_cuda's
 * decode_b128_s8192_one16k: 1362-1364 us, 3.18 TB/s, on an H100 on 2026-12-07, not yet timed
 * with whole requests).  Measured on bench_cuda's uniform B 64 of
 * 8k keys, GQA 32:8, us whole / 2 pieces: H100 (2026-12-06 17:46-18:05 UTC, two runs, four
 * readings each) 709.6-716.5 / 686.6-686.9; H200 (2026-12-02 17:19 UTC, three repeats)
 * 530.9-533.3 / 522.9-527.0.  Whole requests read 3.0 TB/s on the H100 from 64 CTAs, short of its
 * DRAM's rate, 128 half-requests 3.13.  AR_CUDA_DECODE_TMA_SPLITS=1 or
 * AR_CUDA_SPLIT_PATH_RATIO=off keeps whole requests (the plan before 2026-12-06).
 *
 * An fp8 CTA is bound by its consumers' widening and MMAs, not by its copies, so the number of
 * CTAs at work sets the rate; on the H200, 8k keys, GQA 32:8 (bench_cuda, 2026-12-02 16:37 and
 * 17:04 UTC), us by pieces per request 1 / 2 / 3 / 4 (fp8 DECODE): B 64 570.8 / 302.2-304.2 /
 * 399.3 / - (459.8); B 96 565.0-565.3 / 581.6 / 585.0 / 456.1 (648.0), where choose_num_splits
 * takes 4 (2.9 waves); B 128 570.9-571.2 / 588.0 / 595.0 / 600.3 (897.4), where it takes 1.  A
 * 16-bit cache streams near the DRAM's rate from 64 whole requests (H200, B 128: 1015.3-1019.0 /
 * 1030.3 / 1033.9 / 1041.0), so beyond the uneven rule's cut it keeps them whole.
 * AR_CUDA_DECODE_TMA=uneven takes DECODE_TMA for every flat decode batch it can run
 * (decode_tma_plan) with these pieces.  max_blocks, total_blocks: the most key blocks of any
 * request and their sum (ar_attn_decode_tma_extent). */
static int decode_tma_splits(const ar_attn_device *d, int R, int max_seq, int max_blocks, int64_t total_blocks,
                             int force_config, int force_splits, bool flat)
{
    if (!flat) return 1;
    const bool automatic = force_splits <= 0 && force_config < 0;
    const bool split_everywhere = d->decode_tma_all && !d->decode_tma_uneven;   /* AR_CUDA_DECODE_TMA=split */
    const int most = d->decode_tma_pieces > 0 ? d->decode_tma_pieces : AR_MAX_SPLITS;
    int n = 1;
    if (force_config == AR_CFG_DECODE_TMA && force_splits > 0) n = force_splits;
    else if (force_splits <= 0 && d->decode_tma_splits > 0) n = d->decode_tma_splits;
    else if (automatic && !d->kv_fp8 && !split_everywhere && split_path_ratio(d) >= 1)
        n = decode_tma_uneven_cut(
            total_blocks, max_blocks, d->num_sms * d->ctas_per_sm[AR_CFG_DECODE_TMA],
            decode_tma_many_rule(d, R, max_seq, max_blocks, total_blocks) ? split_path_large(d) : split_path_ratio(d),
            most);
    else if (automatic && (d->kv_fp8 || (d->decode_tma_all && !decode_tma_rule(d, R, max_seq))))
        n = ar_attn_split_count(R, max_blocks, d->num_sms * d->ctas_per_sm[AR_CFG_DECODE_TMA]);
    const int cap = most > AR_MAX_SPLITS ? most : AR_MAX_SPLITS;
    return n < 1 ? 1 : n > cap ? cap : n;
}

/* PREFILL_WG takes its items from a queue (cuda_attn_wgmma.cuh) in the order of item_order.h:
 * longest first within sections of (request, KV head) groups whose K/V fit in
 * d->wg_section_bytes.  work [n] is put in that order in place (whatever order it came in: the
 * order's keys break every tie); where item_order refuses its arguments, longest first.  0 ok,
 * 3 out of host memory. */
static int wg_l2_order(const ar_attn_device *d, int R, const int *seq_lens, int config, ar_attn_work *work, int64_t n)
{
    if (n <= 1) return 0;
    ar_order_item *items = malloc((size_t)n * sizeof *items);
    int64_t *order = malloc((size_t)n * sizeof *order);
    int64_t *group_bytes = malloc((size_t)(R > 0 ? R : 1) * sizeof *group_bytes);
    ar_attn_work *copy = malloc((size_t)n * sizeof *copy);
    int rc = 0;
    if (!items || !order || !group_bytes || !copy) rc = 3;
    if (!rc) {
        for (int r = 0; r < R; r++) group_bytes[r] = (int64_t)seq_lens[r] * d->head_size * 2 * (int64_t)d->elem_bytes;
        for (int64_t i = 0; i < n; i++) {
            const ar_order_item it = {work[i].req, work[i].kv_head, work[i].tile_end - work[i].tile_begin, work[i].pair0,
                                      work[i].tile_begin};
            items[i] = it;
        }
        const int slots = d->num_sms * d->ctas_per_sm[config];
        const int got = ar_item_order(items, n, group_bytes, R, d->num_kv_heads, d->wg_section_bytes, slots > 0 ? slots : 1, order);
        if (got == -2) rc = 3;
        else if (got > 0) {
            memcpy(copy, work, (size_t)n * sizeof *copy);
            for (int64_t i = 0; i < n; i++) work[i] = copy[order[i]];
        } else {
            ar_attn_sort_longest_first(work, n);
        }
    }
    free(items);
    free(order);
    free(group_bytes);
    free(copy);
    return rc;
}

/* See attn_plan.h; the rule is this section's opening comment, the environment's knobs behind
 * the device's fields are in cuda_backend.cu's opening comment. */
int ar_attn_build_plan(const ar_attn_device *d, int R, const int *query_start_loc, const int *seq_lens,
                      bool non_causal, bool flat, int force_config, int force_splits, ar_attn_plan *pl)
{
    memset(pl, 0, sizeof *pl);
    int max_q = 0;
    for (int r = 0; r < R; r++) {
        int ql = query_start_loc[r + 1] - query_start_loc[r];
        if (ql > max_q) max_q = ql;
    }
    int config = max_q * d->group <= 16 ? AR_CFG_DECODE : AR_CFG_PREFILL;
    if (force_config == AR_CFG_PREFILL) config = AR_CFG_PREFILL;
    const bool wg_ok = d->has_tma && (d->head_size == 128 || d->head_size == 256) && !d->kv_fp8;
    if (ar_attn_config_is_wg(force_config)) config = wg_ok ? force_config : AR_CFG_PREFILL;
    if (force_config < 0 && config == AR_CFG_PREFILL && d->wgmma_auto && wg_ok) config = d->wgmma_auto;
    /* a DECODE launch's extent, for DECODE_TMA's choice and its cut */
    const int window0 = d->sliding_window;
    int max_seq = 0, max_blocks = 0;
    int64_t total_blocks = 0;
    if (config == AR_CFG_DECODE) ar_attn_decode_tma_extent(R, seq_lens, window0, &max_blocks, &total_blocks, &max_seq);
    if (config == AR_CFG_DECODE && decode_tma_plan(d, R, query_start_loc, max_seq, max_blocks, total_blocks, non_causal,
                                                   force_config, force_splits, flat)) {
        /* one item per request with its token (key blocks from the window's start), or, split,
         * pieces of chunk blocks: piece p of a request cut into n writes partial slots base + p +
         * h x n for KV head h, and (request, h) is a combine group of the n slots from base + h x n */
        const int splits = decode_tma_splits(d, R, max_seq, max_blocks, total_blocks, force_config, force_splits, flat);
        ar_attn_pieces pieces;
        if (ar_attn_decode_tma_items(R, query_start_loc, seq_lens, window0, d->num_kv_heads, splits, max_blocks, &pieces))
            return 3;
        ar_attn_sort_longest_first(pieces.work, pieces.num_work);
        plan_take(pl, AR_CFG_DECODE_TMA, d->geom[AR_CFG_DECODE_TMA], splits, &pieces);
        return 0;
    }
    ar_attn_geom geom = d->geom[config];
    const ar_attn_shape shape = {R, query_start_loc, seq_lens, d->num_kv_heads, d->group, geom.rows, geom.block_n, geom.warps_n,
                                 non_causal, d->sliding_window,
                                 d->fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0};
    ar_attn_work *items;
    int64_t n_items;
    int max_units;
    if (ar_attn_items(&shape, &items, &n_items, &max_units)) return 3;
    int slots = d->num_sms * d->ctas_per_sm[config];
    int splits = force_splits > 0                                       ? force_splits
                 : non_causal                                           ? ar_attn_prefix_split_count((int)n_items, max_units, slots)
                 : config == AR_CFG_DECODE && d->decode_splits > 0      ? d->decode_splits
                                                                        : ar_attn_split_count((int)n_items, max_units, slots);
    if (force_splits <= 0 && !non_causal && config == AR_CFG_DECODE && d->decode_splits <= 0)
        splits = ar_attn_split_count_uneven(items, n_items, max_units, geom.warps_n, slots, splits,
                                            ar_attn_split_path_ratio_for(items, n_items, max_units, geom.warps_n, slots,
                                                                         split_path_ratio(d), split_path_large(d)));
    if (splits > AR_MAX_SPLITS) splits = AR_MAX_SPLITS;
    ar_attn_pieces pieces;
    const int cut_rc = ar_attn_cut(items, n_items, splits, max_units, geom.warps_n, &pieces);
    free(items);
    if (cut_rc) return 3;
    if (!ar_attn_config_is_wg(config)) ar_attn_sort_longest_first(pieces.work, pieces.num_work);
    else if (wg_l2_order(d, R, seq_lens, config, pieces.work, pieces.num_work)) {
        ar_attn_pieces_free(&pieces);
        return 3;
    }
    plan_take(pl, config, geom, splits, &pieces);
    return 0;
}
