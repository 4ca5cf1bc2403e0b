/* attn_plan.c - the "cuda" backend's split rules, work items and split-KV pieces
 * (attn_plan.h); cuda_plan.cuh decides the kernel and calls these.  Plain C, host only;
 * tests/test_attn_plan.c checks them. */
#include "attn_plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* See cuda_plan.cuh's comment: FlashAttention's 85%-of-best-wave-efficiency rule for an
 * under-filled launch, and the tail rule for an over-filled one with few waves. */
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
    memset(out, 0, sizeof *out);
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

void ar_attn_decode_tma_extent(int num_reqs, const int *query_start_loc, const int *seq_lens, int window,
                               int *max_blocks, int *max_seq)
{
    (void)query_start_loc;
    *max_blocks = *max_seq = 0;
    for (int r = 0; r < num_reqs; r++) {
        int begin, end;
        decode_blocks(seq_lens[r], window, &begin, &end);
        if (end - begin > *max_blocks) *max_blocks = end - begin;
        if (seq_lens[r] > *max_seq) *max_seq = seq_lens[r];
    }
}

int ar_attn_decode_tma_items(int num_reqs, const int *query_start_loc, const int *seq_lens, int window,
                             int num_kv_heads, int splits, int max_blocks, ar_attn_pieces *out)
{
    memset(out, 0, sizeof *out);
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
