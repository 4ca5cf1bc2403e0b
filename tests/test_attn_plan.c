/* test_attn_plan.c - the "cuda" backend's work items and split-KV pieces (kernels/paged/
 * attn_plan.c) without a GPU.  On random launches (decodes, chunked prefills and whole prompts,
 * GQA groups of 1-8, every config's tile geometry, causal or not, sliding windows, the
 * off-by-one fault) every row of every request and KV head must fall in exactly one item, and an
 * item's key tiles must span exactly the keys its rows see, worked out row by row; the cut must
 * cover each item's tiles in pieces of the chosen length with a combine group and one partial
 * slot per piece; DECODE_TMA items must read each decode request's blocks from its window's start,
 * with the partial layout its combine expects.  The split rules are checked on the cases their
 * comments work through and on their bounds. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "../kernels/paged/attn_plan.h"

enum { MAX_REQS = 24 };

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static int rnd(int n)   /* 0 .. n - 1 */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (int)(rng_state % (uint64_t)n);
}

typedef struct launch {
    int qsl[MAX_REQS + 1], seq_lens[MAX_REQS];
    ar_attn_shape sh;
} launch;

/* The keys row `pair` of request r sees, [lo, hi): causal up to its token's position (plus the
 * fault's one), from window - 1 keys before it with a window; all seq_len keys non-causal. */
static void row_keys(const ar_attn_shape *sh, int r, int pair, int *lo, int *hi)
{
    const int ql = sh->query_start_loc[r + 1] - sh->query_start_loc[r], sl = sh->seq_lens[r];
    const int pos = sl - ql + pair / sh->group;   /* the token's position in the sequence */
    if (sh->non_causal) {
        *lo = 0;
        *hi = sl;
        return;
    }
    *hi = pos + 1 + sh->extra < sl ? pos + 1 + sh->extra : sl;
    *lo = sh->window > 0 && pos - sh->window + 1 > 0 ? pos - sh->window + 1 : 0;
}

static void random_launch(launch *l)
{
    static const int geoms[][3] = {{16, 64, 4}, {64, 64, 1}, {128, 128, 1}, {128, 64, 1}, {16, 16, 1}};
    memset(l, 0, sizeof *l);
    ar_attn_shape *sh = &l->sh;
    sh->num_reqs = 1 + rnd(MAX_REQS);
    sh->num_kv_heads = 1 + rnd(8);
    sh->group = 1 << rnd(4);
    const int *g = geoms[rnd(5)];
    sh->rows = g[0];
    sh->block_n = g[1];
    sh->warps_n = g[2];
    sh->non_causal = rnd(6) == 0;
    sh->window = rnd(4) == 0 ? 1 + rnd(3000) : 0;
    sh->extra = rnd(8) == 0;
    const int kind = rnd(3);   /* decodes, chunks, prompts */
    for (int r = 0; r < sh->num_reqs; r++) {
        const int ql = kind == 0 ? 1 : kind == 1 ? 1 + rnd(300) : 1 + rnd(3000);
        const int ctx = kind == 2 ? 0 : rnd(9000);
        l->qsl[r + 1] = l->qsl[r] + ql;
        l->seq_lens[r] = ql + ctx;
    }
    sh->query_start_loc = l->qsl;
    sh->seq_lens = l->seq_lens;
}

/* Every (request, KV head, row) in exactly one item; an item's tiles span the union of its rows'
 * keys; max_units the longest item's units. */
static void check_items(const ar_attn_shape *sh, const ar_attn_work *items, int64_t n, int max_units)
{
    int64_t want = 0, k = 0;
    int longest = 0;
    for (int r = 0; r < sh->num_reqs; r++) {
        const int pairs = (sh->query_start_loc[r + 1] - sh->query_start_loc[r]) * sh->group;
        for (int h = 0; h < sh->num_kv_heads; h++)
            for (int p0 = 0; p0 < pairs; p0 += sh->rows, k++) {
                want++;
                assert_true(k < n);
                const ar_attn_work *w = &items[k];
                assert_int_equal(w->req, r);
                assert_int_equal(w->kv_head, h);
                assert_int_equal(w->pair0, p0);
                assert_int_equal(w->partial, -1);
                int lo = INT32_MAX, hi = 0;
                for (int p = p0; p < p0 + sh->rows && p < pairs; p++) {
                    int a, b;
                    row_keys(sh, r, p, &a, &b);
                    if (b > a) {
                        if (a < lo) lo = a;
                        if (b > hi) hi = b;
                    }
                }
                if (hi == 0) {   /* no row sees a key */
                    assert_int_equal(w->tile_end, w->tile_begin);
                } else {
                    assert_int_equal(w->tile_begin, lo / sh->block_n);
                    assert_int_equal(w->tile_end, (hi + sh->block_n - 1) / sh->block_n);
                }
                const int units = (w->tile_end - w->tile_begin + sh->warps_n - 1) / sh->warps_n;
                if (units > longest) longest = units;
            }
    }
    assert_int_equal(n, want);
    assert_int_equal(max_units, longest);
}

/* The pieces cover each item's tiles in order, in pieces of ceil(max_units / splits) units
 * (split units of warps_n tiles) but the last; a cut item has one combine group and one partial
 * slot per piece, the slots of the plan each used once. */
static void check_cut(const ar_attn_work *items, int64_t n_items, int splits, int max_units, int warps_n,
                      const ar_attn_pieces *pc)
{
    int chunk = splits > 1 ? (max_units + splits - 1) / splits : max_units;
    if (chunk < 1) chunk = 1;
    char *slot_seen = calloc((size_t)pc->num_partials + 1, 1);
    assert_non_null(slot_seen);
    int64_t wi = 0, gi = 0;
    for (int64_t i = 0; i < n_items; i++) {
        const ar_attn_work *it = &items[i];
        int at = it->tile_begin, pieces = 0;
        int64_t first = wi;
        do {
            assert_true(wi < pc->num_work);
            const ar_attn_work *w = &pc->work[wi++];
            assert_int_equal(w->req, it->req);
            assert_int_equal(w->kv_head, it->kv_head);
            assert_int_equal(w->pair0, it->pair0);
            assert_int_equal(w->tile_begin, at);
            at = w->tile_end;
            pieces++;
        } while (at < it->tile_end);
        assert_int_equal(at, it->tile_end);
        const int units = (it->tile_end - it->tile_begin + warps_n - 1) / warps_n;
        assert_int_equal(pieces, splits > 1 && units > chunk ? (units + chunk - 1) / chunk : 1);
        if (pieces == 1) {
            assert_int_equal(pc->work[first].partial, -1);
            continue;
        }
        const ar_combine_group *g = &pc->groups[gi++];
        assert_int_equal(g->req, it->req);
        assert_int_equal(g->kv_head, it->kv_head);
        assert_int_equal(g->pair0, it->pair0);
        assert_int_equal(g->count, pieces);
        for (int64_t k = first; k < wi; k++) {
            const ar_attn_work *w = &pc->work[k];
            if (k < wi - 1) assert_int_equal(w->tile_end - w->tile_begin, chunk * warps_n);
            assert_int_equal(w->partial, g->first_partial + (int)(k - first));
            assert_true(w->partial >= 0 && w->partial < pc->num_partials);
            assert_int_equal(slot_seen[w->partial], 0);
            slot_seen[w->partial] = 1;
        }
    }
    assert_int_equal(wi, pc->num_work);
    assert_int_equal(gi, pc->num_groups);
    for (int64_t s = 0; s < pc->num_partials; s++) assert_int_equal(slot_seen[s], 1);
    free(slot_seen);
}

static void test_items_and_cuts(void **state)
{
    (void)state;
    for (int it = 0; it < 400; it++) {
        static launch l;
        random_launch(&l);
        ar_attn_work *items;
        int64_t n;
        int max_units;
        assert_int_equal(ar_attn_items(&l.sh, &items, &n, &max_units), 0);
        check_items(&l.sh, items, n, max_units);
        const int slots = 132 * (1 + rnd(3));
        const int choices[4] = {1, 1 + rnd(AR_MAX_SPLITS), ar_attn_split_count((int)n, max_units, slots),
                                ar_attn_prefix_split_count((int)n, max_units, slots)};
        for (int c = 0; c < 4; c++) {
            ar_attn_pieces pc;
            assert_int_equal(ar_attn_cut(items, n, choices[c], max_units, l.sh.warps_n, &pc), 0);
            check_cut(items, n, choices[c], max_units, l.sh.warps_n, &pc);
            ar_attn_sort_longest_first(pc.work, pc.num_work);
            for (int64_t k = 1; k < pc.num_work; k++)
                assert_true(pc.work[k - 1].tile_end - pc.work[k - 1].tile_begin >=
                            pc.work[k].tile_end - pc.work[k].tile_begin);
            ar_attn_pieces_free(&pc);
            ar_attn_pieces_free(&pc);   /* zeroed: freeing again is harmless */
        }
        free(items);
    }
}

/* DECODE_TMA: each decode request one item over its blocks from the window's start (every KV
 * head), or cut into pieces of ceil(max_blocks / splits) blocks whose KV head h writes partial
 * slot partial + h x partial_stride, with (request, h) groups of those slots. */
static void test_decode_tma_items(void **state)
{
    (void)state;
    for (int it = 0; it < 300; it++) {
        int qsl[MAX_REQS + 1] = {0}, seq[MAX_REQS];
        const int R = 1 + rnd(MAX_REQS), hkv = 1 + rnd(8), window = rnd(3) == 0 ? 1 + rnd(5000) : 0;
        for (int r = 0; r < R; r++) {
            qsl[r + 1] = qsl[r] + (rnd(10) == 0 ? 2 : 1);   /* a few non-decode requests, left out */
            seq[r] = 1 + rnd(20000);
        }
        int max_blocks, max_seq;
        ar_attn_decode_tma_extent(R, qsl, seq, window, &max_blocks, &max_seq);
        int want_blocks = 0, want_seq = 0;
        for (int r = 0; r < R; r++) {
            const int first_key = window > 0 && seq[r] > window ? seq[r] - window : 0;
            const int blocks = (seq[r] + 15) / 16 - first_key / 16;
            if (blocks > want_blocks) want_blocks = blocks;
            if (seq[r] > want_seq) want_seq = seq[r];
        }
        assert_int_equal(max_blocks, want_blocks);
        assert_int_equal(max_seq, want_seq);
        const int splits = rnd(2) ? 1 : 1 + rnd(8);
        ar_attn_pieces pc;
        assert_int_equal(ar_attn_decode_tma_items(R, qsl, seq, window, hkv, splits, max_blocks, &pc), 0);
        const int chunk = splits > 1 ? (max_blocks + splits - 1) / splits : max_blocks;
        char *slot_seen = calloc((size_t)pc.num_partials + 1, 1);
        assert_non_null(slot_seen);
        int64_t wi = 0;
        for (int r = 0; r < R; r++) {
            if (qsl[r + 1] - qsl[r] != 1) continue;
            const int first_key = window > 0 && seq[r] > window ? seq[r] - window : 0;
            const int begin = first_key / 16, end = (seq[r] + 15) / 16;
            int at = begin, pieces = 0;
            const int64_t first = wi;
            while (at < end || pieces == 0) {
                assert_true(wi < pc.num_work);
                const ar_attn_work *w = &pc.work[wi++];
                assert_int_equal(w->req, r);
                assert_int_equal(w->kv_head, 0);
                assert_int_equal(w->tile_begin, at);
                assert_true(w->tile_end > w->tile_begin);
                at = w->tile_end;
                pieces++;
            }
            assert_int_equal(at, end);
            assert_int_equal(pieces, splits > 1 && end - begin > chunk ? (end - begin + chunk - 1) / chunk : 1);
            if (pieces == 1) {
                assert_int_equal(pc.work[first].partial, -1);
                continue;
            }
            for (int64_t k = first; k < wi - 1; k++) assert_int_equal(pc.work[k].tile_end - pc.work[k].tile_begin, chunk);
            for (int h = 0; h < hkv; h++) {
                const ar_combine_group *g = NULL;
                for (int64_t q = 0; q < pc.num_groups; q++)
                    if (pc.groups[q].req == r && pc.groups[q].kv_head == h) g = &pc.groups[q];
                assert_non_null(g);
                assert_int_equal(g->count, pieces);
                for (int64_t k = first; k < wi; k++) {
                    const ar_attn_work *w = &pc.work[k];
                    assert_int_equal(w->partial_stride, pieces);
                    const int slot = w->partial + h * w->partial_stride;
                    assert_int_equal(slot, g->first_partial + (int)(k - first));
                    assert_true(slot >= 0 && slot < pc.num_partials);
                    assert_int_equal(slot_seen[slot], 0);
                    slot_seen[slot] = 1;
                }
            }
        }
        assert_int_equal(wi, pc.num_work);
        for (int64_t s = 0; s < pc.num_partials; s++) assert_int_equal(slot_seen[s], 1);
        free(slot_seen);
        ar_attn_pieces_free(&pc);
    }
}

/* The split rules on the cases their comments work through, and their bounds. */
static void test_split_rules(void **state)
{
    (void)state;
    /* the cascade prefix pass: 32 items on 264 slots take 8 (256 CTAs, one wave) */
    assert_int_equal(ar_attn_prefix_split_count(32, 1000, 264), 8);
    /* the tail rule: 512 CTAs on 396 slots (2 waves for 1.29 waves of work): 3 (4 waves for 3.88) */
    assert_int_equal(ar_attn_split_count(512, 1000, 396), 3);
    /* FlashAttention's rule: 64 CTAs on 132 slots; 2 gives 0.97 of a wave's efficiency, the
     * smallest s within 85% of the best (1.0 at 33) */
    assert_int_equal(ar_attn_split_count(64, 1000, 132), 2);
    /* 100 CTAs on 132 slots: 2-4 splits all at 0.76, 5 at 0.95 (4 waves of 3.79) */
    assert_int_equal(ar_attn_split_count(100, 1000, 132), 5);
    /* no split: four waves or more, one unit, nothing to run */
    assert_int_equal(ar_attn_split_count(4 * 132, 1000, 132), 1);
    assert_int_equal(ar_attn_prefix_split_count(4 * 132, 1000, 132), 1);
    assert_int_equal(ar_attn_split_count(10, 1, 132), 1);
    assert_int_equal(ar_attn_split_count(0, 100, 132), 1);
    assert_int_equal(ar_attn_prefix_split_count(10, 3, 132), 1);   /* pieces of at least 2 units */
    for (int it = 0; it < 2000; it++) {
        const int c = 1 + rnd(2000), u = 1 + rnd(500), slots = 1 + rnd(600);
        const int s = ar_attn_split_count(c, u, slots), p = ar_attn_prefix_split_count(c, u, slots);
        assert_true(s >= 1 && s <= AR_MAX_SPLITS && s <= (u > 1 ? u : 1) && s <= slots);
        assert_true(p >= 1 && p <= AR_MAX_SPLITS && (p == 1 || p <= u / 2));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_items_and_cuts),
        cmocka_unit_test(test_decode_tma_items),
        cmocka_unit_test(test_split_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
