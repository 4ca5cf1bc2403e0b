/* test_attn_plan.c - the "cuda" backend's work items and split-KV pieces (kernels/paged/
 * attn_plan.c) without a GPU.  On random launches (decodes, chunked prefills and whole prompts,
 * GQA groups of 1-8, every config's tile geometry, causal or not, sliding windows, the
 * off-by-one fault) every row of every request and KV head must fall in exactly one item, and an
 * item's key tiles must span exactly the keys its rows see, worked out row by row; the cut must
 * cover each item's tiles in pieces of the chosen length with a combine group and one partial
 * slot per piece; DECODE_TMA items must read each decode request's blocks from its window's start,
 * with the partial layout its combine expects.  The split rules (the uneven-batch rule among
 * them) are checked on the cases their comments work through and on their bounds. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "../kernels/paged/attn_plan.h"
#include "../kernels/paged/item_order.h"
#include "../replay/backend.h"

enum { MAX_REQS = 24 };

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static int rnd(int n) { return tu_rnd(&rng_state, n); }   /* 0 .. n - 1 */

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

/* Pieces in their items' order: request, KV head, row, first key tile. */
static int cmp_item_pos(const void *pa, const void *pb)
{
    const ar_attn_work *a = pa, *b = pb;
    if (a->req != b->req) return a->req < b->req ? -1 : 1;
    if (a->kv_head != b->kv_head) return a->kv_head < b->kv_head ? -1 : 1;
    if (a->pair0 != b->pair0) return a->pair0 < b->pair0 ? -1 : 1;
    return (a->tile_begin > b->tile_begin) - (a->tile_begin < b->tile_begin);
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
        int64_t total_blocks;
        ar_attn_decode_tma_extent(R, seq, window, &max_blocks, &total_blocks, &max_seq);
        int want_blocks = 0, want_seq = 0;
        int64_t want_total = 0;
        for (int r = 0; r < R; r++) {
            const int first_key = window > 0 && seq[r] > window ? seq[r] - window : 0;
            const int blocks = (seq[r] + 15) / 16 - first_key / 16;
            want_total += blocks;
            if (blocks > want_blocks) want_blocks = blocks;
            if (seq[r] > want_seq) want_seq = seq[r];
        }
        assert_int_equal(max_blocks, want_blocks);
        assert_int_equal(total_blocks, want_total);
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
    /* one long context among short ones (the Mooncake trace's decode step of 11 requests, one at
     * 135,150 keys, ten at 1,500; GQA 32:8, DECODE's tiles of 64 keys on 4 warps, 4 CTAs an SM on
     * 132 SMs): the rule counts 88 CTAs a split and takes 6, which leaves the long request in 6
     * pieces of 88 units against 9 units a slot spread evenly; the uneven rule cuts it into pieces
     * of at most 4 x 9; an even batch keeps the rule's count */
    {
        int qsl[12], seq[11];
        for (int r = 0; r <= 11; r++) qsl[r] = r;
        for (int r = 0; r < 11; r++) seq[r] = r == 3 ? 135150 : 1500;
        const ar_attn_shape sh = {11, qsl, seq, 8, 4, 16, 64, 4, false, 0, 0};
        ar_attn_work *items;
        int64_t n;
        int max_units;
        assert_int_equal(ar_attn_items(&sh, &items, &n, &max_units), 0);
        assert_int_equal(n, 88);
        assert_int_equal(max_units, 528);
        const int base = ar_attn_split_count((int)n, max_units, 528);
        assert_int_equal(base, 6);
        const int s = ar_attn_split_count_uneven(items, n, max_units, 4, 528, base, AR_SPLIT_PATH_RATIO);
        assert_int_equal(s, 30);   /* 2 x ceil(4,704 / 528) = 18 units a piece at most: 18 */
        assert_true((max_units + s - 1) / s <= 18 && (max_units + s - 2) / (s - 1) > 18);
        assert_int_equal(ar_attn_split_count_uneven(items, n, max_units, 4, 528, base, 4), 15);   /* pieces of 36 */
        assert_int_equal(ar_attn_split_count_uneven(items, n, max_units, 4, 528, base, -1), base);   /* off */
        free(items);
        for (int r = 0; r < 11; r++) seq[r] = 8192;
        assert_int_equal(ar_attn_items(&sh, &items, &n, &max_units), 0);
        const int even = ar_attn_split_count((int)n, max_units, 528);
        assert_int_equal(ar_attn_split_count_uneven(items, n, max_units, 4, 528, even, AR_SPLIT_PATH_RATIO), even);
        free(items);
    }
    /* the default ratio leaves every uniform batch at the rule's count (B 1-128 decodes of 512 to
     * 32k keys, GQA 32:8, on 132 SMs x 1-4 CTAs): only a lopsided launch is cut further.  Ratio 1
     * would not (B 14 of 8k keys on 396 slots: 3 -> 4 splits, 448 CTAs), which is why the default
     * is 2 although ratio 1 read faster on the Mooncake trace (attn_plan.h) */
    {
        static const int lens[] = {512, 1024, 2048, 4096, 8192, 16384, 32768};
        int qsl[129], seq[128];
        for (int r = 0; r <= 128; r++) qsl[r] = r;
        int cut_by_one = 0;
        for (int slots = 132; slots <= 528; slots += 132)
            for (int B = 1; B <= 128; B++)
                for (int li = 0; li < 7; li++) {
                    for (int r = 0; r < B; r++) seq[r] = lens[li];
                    const ar_attn_shape sh = {B, qsl, seq, 8, 4, 16, 64, 4, false, 0, 0};
                    ar_attn_work *items;
                    int64_t n;
                    int max_units;
                    assert_int_equal(ar_attn_items(&sh, &items, &n, &max_units), 0);
                    const int base = ar_attn_split_count((int)n, max_units, slots);
                    assert_int_equal(ar_attn_split_count_uneven(items, n, max_units, 4, slots, base, AR_SPLIT_PATH_RATIO), base);
                    cut_by_one += ar_attn_split_count_uneven(items, n, max_units, 4, slots, base, 1) != base;
                    free(items);
                }
        assert_true(cut_by_one > 0);
    }
    /* on random launches: never below the rule's count, at most AR_MAX_SPLITS, pieces of at most
     * AR_SPLIT_PATH_RATIO x the even share unless capped, and the smallest such count */
    for (int it = 0; it < 300; it++) {
        launch l;
        random_launch(&l);
        ar_attn_work *items;
        int64_t n;
        int max_units;
        assert_int_equal(ar_attn_items(&l.sh, &items, &n, &max_units), 0);
        const int slots = 1 + rnd(600), base = ar_attn_split_count((int)n, max_units, slots);
        const int s = ar_attn_split_count_uneven(items, n, max_units, l.sh.warps_n, slots, base, AR_SPLIT_PATH_RATIO);
        int64_t total = 0;
        for (int64_t i = 0; i < n; i++) total += (items[i].tile_end - items[i].tile_begin + l.sh.warps_n - 1) / l.sh.warps_n;
        const int64_t fair = total > slots ? (total + slots - 1) / slots : 1;
        const int top = AR_MAX_SPLITS < max_units ? AR_MAX_SPLITS : max_units;
        assert_true(s >= base && s <= (top > base ? top : base));
        if (max_units > 1 && n > 0) {
            const bool fits = (max_units + s - 1) / s <= AR_SPLIT_PATH_RATIO * fair;
            assert_true(fits || s == top);
            if (s > base) assert_true((max_units + s - 2) / (s - 1) > AR_SPLIT_PATH_RATIO * fair);
        }
        free(items);
    }
    for (int it = 0; it < 2000; it++) {
        const int c = 1 + rnd(2000), u = 1 + rnd(500), slots = 1 + rnd(600);
        const int s = ar_attn_split_count(c, u, slots), p = ar_attn_prefix_split_count(c, u, slots);
        assert_true(s >= 1 && s <= AR_MAX_SPLITS && s <= (u > 1 ? u : 1) && s <= slots);
        assert_true(p >= 1 && p <= AR_MAX_SPLITS && (p == 1 || p <= u / 2));
    }
}


/* ---- the decision function ---------------------------------------------------------------- */

/* An H200 running a llama-like model: 132 SMs, head size 128, blocks of 16, GQA 32:8, tensor
 * maps, the automatic choices on.  The geometries are the shapes of the configs' tiles (the
 * decision only reads rows, block_n and warps_n). */
static ar_attn_device h200(void)
{
    ar_attn_device d;
    memset(&d, 0, sizeof d);
    d.num_sms = 132;
    const ar_attn_geom geoms[AR_CFG_COUNT] = {{64, 64, 1, 128, 0}, {16, 64, 4, 128, 0}, {128, 128, 1, 384, 0},
                                              {16, 16, 1, 288, 0}};
    for (int c = 0; c < AR_CFG_COUNT; c++) {
        d.geom[c] = geoms[c];
        d.ctas_per_sm[c] = c == AR_CFG_DECODE ? 4 : 1;
    }
    d.has_tma = 1;
    d.head_size = d.template_hd = 128;
    d.block_size = 16;
    d.num_kv_heads = 8;
    d.group = 4;
    d.elem_bytes = 2;
    d.fault = AR_FAULT_NONE;
    d.wgmma_auto = AR_CFG_PREFILL_WG;
    d.decode_tma_auto = 1;
    d.decode_tma_small = 1;
    d.wg_section_bytes = (int64_t)AR_ITEM_ORDER_SECTION_MB << 20;   /* the backend's default */
    return d;
}

/* n requests of q_len query tokens over seq_len keys each. */
static void uniform(int n, int q_len, int seq_len, int *qsl, int *seq)
{
    qsl[0] = 0;
    for (int r = 0; r < n; r++) {
        qsl[r + 1] = qsl[r] + q_len;
        seq[r] = seq_len;
    }
}

/* The plan's config and split count for n requests of q_len tokens over seq_len keys. */
static int plan_of(const ar_attn_device *d, int n, int q_len, int seq_len, bool flat, int force_config,
                   int force_splits, int *splits)
{
    static int qsl[1025], seq[1024];
    uniform(n, q_len, seq_len, qsl, seq);
    ar_attn_plan pl;
    assert_int_equal(ar_attn_build_plan(d, n, qsl, seq, false, flat, force_config, force_splits, &pl), 0);
    const int config = pl.config;
    if (splits) *splits = pl.num_splits;
    ar_attn_plan_free(&pl);
    return config;
}

/* The automatic plan of the decode launch of seq [n] (n <= 1024, one token a request) into *pl;
 * flat: not a cascade pass. */
static void plan_decodes(const ar_attn_device *d, int n, const int *seq, bool flat, ar_attn_plan *pl)
{
    static int qsl[1025];
    assert_true(n >= 0 && n < (int)(sizeof qsl / sizeof qsl[0]));
    for (int r = 0; r <= n; r++) qsl[r] = r;
    assert_int_equal(ar_attn_build_plan(d, n, qsl, seq, false, flat, -1, 0, pl), 0);
}

/* DECODE's splits for the launch of seq [n] (one token a request) with AR_CUDA_SPLIT_PATH_LARGE
 * at large (0 unset: the default; -1 off). */
static int decode_splits_with_large(ar_attn_device *d, int n, const int *seq, int large)
{
    d->split_path_large = large;
    ar_attn_plan pl;
    plan_decodes(d, n, seq, true, &pl);
    d->split_path_large = 0;
    assert_int_equal(pl.config, AR_CFG_DECODE);
    const int splits = pl.num_splits;
    ar_attn_plan_free(&pl);
    return splits;
}

/* AR_CUDA_SPLIT_PATH_LARGE (ar_attn_split_path_ratio_for): its ratio only for a DECODE launch of
 * at least AR_SPLIT_PATH_LARGE_FAIR units a slot whose longest item is over twice the mean. */
static void test_split_path_large(void **state)
{
    (void)state;
    ar_attn_device d = h200();
    static int seq[64];
    /* the Mooncake trace's ~60-request decodes: one of 47k keys among 59 of 2k-16k */
    for (int r = 0; r < 60; r++) seq[r] = r == 0 ? 47000 : 2000 + (r * 613) % 14000;
    const int base = decode_splits_with_large(&d, 60, seq, -1);
    const int large = decode_splits_with_large(&d, 60, seq, 1);
    print_message("60 decodes, one of 47k keys: %d splits at ratio 2, %d with the large launches' ratio 1\n", base,
                  large);
    assert_true(large > base);
    /* ratio 1 is the default for such launches, and an explicit AR_CUDA_SPLIT_PATH_RATIO (a sweep of
     * the one ratio) sets it aside unless the large ratio is asked too */
    assert_int_equal(decode_splits_with_large(&d, 60, seq, 0), large);
    d.split_path_ratio = 2;
    assert_int_equal(decode_splits_with_large(&d, 60, seq, 0), base);
    assert_int_equal(decode_splits_with_large(&d, 60, seq, 1), large);
    d.split_path_ratio = 0;
    /* with the uneven rule off it stays off */
    d.split_path_ratio = -1;
    assert_int_equal(decode_splits_with_large(&d, 60, seq, 1), decode_splits_with_large(&d, 60, seq, -1));
    d.split_path_ratio = 0;
    /* a small step (9 requests, one of 9.7k keys among 8 of 1k: about 2 units a slot) keeps the
     * ratio's splits, where ratio 1 for every launch would cut it further */
    for (int r = 0; r < 9; r++) seq[r] = r == 4 ? 9700 : 1000;
    const int small = decode_splits_with_large(&d, 9, seq, -1);
    assert_int_equal(decode_splits_with_large(&d, 9, seq, 1), small);
    d.split_path_ratio = 1;
    assert_true(decode_splits_with_large(&d, 9, seq, -1) > small);
    d.split_path_ratio = 0;
    /* every uniform batch (B 1-63 of 512 to 32k keys) keeps the ratio's splits, among them those
     * that ratio 1 for every launch would cut further */
    int cut_further = 0;
    for (int b = 1; b < 64; b++)
        for (int keys = 512; keys <= 32768; keys *= 2) {
            for (int r = 0; r < b; r++) seq[r] = keys;
            const int at_ratio = decode_splits_with_large(&d, b, seq, -1);
            assert_int_equal(decode_splits_with_large(&d, b, seq, 1), at_ratio);
            assert_int_equal(decode_splits_with_large(&d, b, seq, 0), at_ratio);
            d.split_path_ratio = 1;
            cut_further += decode_splits_with_large(&d, b, seq, -1) > at_ratio;
            d.split_path_ratio = 0;
        }
    print_message("uniform batches ratio 1 would cut further: %d of 441\n", cut_further);
    assert_true(cut_further > 0);
    /* the function on its bounds: one item of 300 units and 10 of 20 (500 units, the longest
     * over twice the mean of 45.5) take the large ratio from 8 units a slot (63 slots: 8) and
     * not below (72 slots: 7); 11 items of 20 (none over twice the mean) do not; nor with the
     * large ratio unset or the rule off */
    ar_attn_work items[11];
    for (int i = 0; i < 11; i++) items[i] = (ar_attn_work){i, 0, 0, 0, i == 0 ? 300 : 20, -1, 0};
    assert_int_equal(ar_attn_split_path_ratio_for(items, 11, 300, 1, 10, 2, 1), 1);
    assert_int_equal(ar_attn_split_path_ratio_for(items, 11, 300, 1, 63, 2, 1), 1);
    assert_int_equal(ar_attn_split_path_ratio_for(items, 11, 300, 1, 72, 2, 1), 2);
    assert_int_equal(ar_attn_split_path_ratio_for(items, 11, 300, 1, 10, 2, 0), 2);
    assert_int_equal(ar_attn_split_path_ratio_for(items, 11, 300, 1, 10, -1, 1), -1);
    for (int i = 0; i < 11; i++) items[i].tile_end = 20;
    assert_int_equal(ar_attn_split_path_ratio_for(items, 11, 20, 1, 10, 2, 1), 2);
}

/* The plan of the flat decode launch of seq [n] (one token a request): its config, and in
 * *pieces_ok whether no piece is longer than the even share of the launch's blocks over the SMs
 * (DECODE_TMA's uneven cut at ratio 1). */
static int many_plan(const ar_attn_device *d, int n, const int *seq, bool flat, bool *pieces_ok)
{
    ar_attn_plan pl;
    plan_decodes(d, n, seq, flat, &pl);
    int max_blocks, max_seq;
    int64_t total;
    ar_attn_decode_tma_extent(n, seq, 0, &max_blocks, &total, &max_seq);
    const int64_t fair = (total + d->num_sms - 1) / d->num_sms;
    *pieces_ok = pl.config == AR_CFG_DECODE_TMA;
    for (int64_t k = 0; k < pl.num_work && *pieces_ok; k++) *pieces_ok = pl.work[k].tile_end - pl.work[k].tile_begin <= fair;
    const int config = pl.config;
    ar_attn_plan_free(&pl);
    return config;
}

/* decode_tma_many_rule: a flat 16-bit decode launch of at least SMs / 4 requests whose longest is
 * past 16k keys and over twice the mean (at most 32 times it), at least 64 blocks an SM of even
 * share, takes DECODE_TMA with pieces of at most the even share (the large uneven launches' ratio
 * 1); everything else keeps its plan. */
static void test_decode_tma_many(void **state)
{
    (void)state;
    ar_attn_device d = h200();
    d.decode_tma_many = 1;
    static int seq[128];
    bool ok;
    /* the Mooncake trace's ~60-request decodes: one of 40k keys among 60 of 2k-16k */
    for (int r = 0; r < 61; r++) seq[r] = r == 0 ? 40100 : 2000 + (r * 613) % 14000;
    assert_int_equal(many_plan(&d, 61, seq, true, &ok), AR_CFG_DECODE_TMA);
    assert_true(ok);
    assert_int_equal(many_plan(&d, 61, seq, false, &ok), AR_CFG_DECODE);   /* a cascade pass: not flat */
    d.decode_tma_many = 0;   /* AR_CUDA_DECODE_TMA_MANY=0: DECODE, as before */
    assert_int_equal(many_plan(&d, 61, seq, true, &ok), AR_CFG_DECODE);
    d.decode_tma_many = 1;
    d.split_path_large = -1;   /* the large ratio off: DECODE at ratio 2, as before */
    assert_int_equal(many_plan(&d, 61, seq, true, &ok), AR_CFG_DECODE);
    d.split_path_large = 0;
    d.split_path_ratio = 2;    /* a sweep of one ratio: the same */
    assert_int_equal(many_plan(&d, 61, seq, true, &ok), AR_CFG_DECODE);
    d.split_path_ratio = 0;
    d.kv_fp8 = 1;              /* an fp8 cache: DECODE */
    d.elem_bytes = 1;
    assert_int_equal(many_plan(&d, 61, seq, true, &ok), AR_CFG_DECODE);
    d.kv_fp8 = 0;
    d.elem_bytes = 2;
    /* 32 requests (fewer than SMs / 4) of the same kind: DECODE */
    assert_int_equal(many_plan(&d, 32, seq, true, &ok), AR_CFG_DECODE);
    assert_int_equal(many_plan(&d, 33, seq, true, &ok), AR_CFG_DECODE_TMA);
    assert_true(ok);
    /* uniform, 61 of 40k keys: not uneven, DECODE */
    for (int r = 0; r < 61; r++) seq[r] = 40100;
    assert_int_equal(many_plan(&d, 61, seq, true, &ok), AR_CFG_DECODE);
    /* the longest just under twice the mean: DECODE; just over it: DECODE_TMA */
    for (int r = 0; r < 40; r++) seq[r] = r < 20 ? 16 * 2000 : 16 * 1000;   /* mean 1500 blocks */
    seq[0] = 16 * 3000;   /* 3000 of a mean of 1525 */
    assert_int_equal(many_plan(&d, 40, seq, true, &ok), AR_CFG_DECODE);
    seq[0] = 16 * 3100;   /* 3100 against 2 x 1527.5: over */
    assert_int_equal(many_plan(&d, 40, seq, true, &ok), AR_CFG_DECODE_TMA);
    assert_true(ok);
    /* small: 40 requests, one of 17k keys among 39 of 100: 1,336 blocks, under 64 an SM: DECODE */
    for (int r = 0; r < 40; r++) seq[r] = r == 0 ? 17000 : 100;
    assert_int_equal(many_plan(&d, 40, seq, true, &ok), AR_CFG_DECODE);
    /* too lopsided: bench_cuda's 121 requests, one of 135k keys among 120 of 2k (44 times the mean), DECODE;
     * one of 67k keys (22 times): DECODE_TMA */
    for (int r = 0; r < 121; r++) seq[r] = r == 7 ? 135150 : 2048;
    assert_int_equal(many_plan(&d, 121, seq, true, &ok), AR_CFG_DECODE);
    seq[7] = 67575;
    assert_int_equal(many_plan(&d, 121, seq, true, &ok), AR_CFG_DECODE_TMA);
    assert_true(ok);
    /* AR_CUDA_DECODE_TMA_PIECES: DECODE_TMA's uneven cut of the Mooncake trace's lopsided step (one
     * request of 135k keys among 10 of 1.5k, under AR_CUDA_DECODE_TMA=uneven at ratio 1) stops at 64
     * pieces of 132 blocks, over the even share of 71; at 256 it reaches the even share */
    {
        for (int r = 0; r < 11; r++) seq[r] = r == 3 ? 135150 : 1500;
        d.decode_tma_all = d.decode_tma_uneven = 1;
        d.split_path_ratio = 1;
        ar_attn_plan pl;
        plan_decodes(&d, 11, seq, true, &pl);
        assert_int_equal(pl.config, AR_CFG_DECODE_TMA);
        assert_int_equal(pl.num_splits, AR_MAX_SPLITS);
        ar_attn_plan_free(&pl);
        assert_int_equal(many_plan(&d, 11, seq, true, &ok), AR_CFG_DECODE_TMA);
        assert_false(ok);
        d.decode_tma_pieces = 256;
        plan_decodes(&d, 11, seq, true, &pl);
        assert_true(pl.num_splits > AR_MAX_SPLITS && pl.num_splits <= 256);
        ar_attn_plan_free(&pl);
        assert_int_equal(many_plan(&d, 11, seq, true, &ok), AR_CFG_DECODE_TMA);
        assert_true(ok);
        d.decode_tma_pieces = 0;
        d.decode_tma_all = d.decode_tma_uneven = 0;
        d.split_path_ratio = 0;
    }
    /* none past 16k keys: 60 requests, one of 16k among 59 of 4k, DECODE */
    for (int r = 0; r < 60; r++) seq[r] = r == 0 ? 16384 : 4096;
    assert_int_equal(many_plan(&d, 60, seq, true, &ok), AR_CFG_DECODE);
    seq[0] = 16385;
    assert_int_equal(many_plan(&d, 60, seq, true, &ok), AR_CFG_DECODE_TMA);
    assert_true(ok);
}

/* The rule as the decision's comment states it, case by case. */
static void test_decision_rule(void **state)
{
    (void)state;
    ar_attn_device d = h200();
    int s;
    /* DECODE_TMA: at least half as many requests as SMs up to 16k keys, or 0.9 x SMs at any length */
    assert_int_equal(plan_of(&d, 128, 1, 8192, true, -1, 0, &s), AR_CFG_DECODE_TMA);
    assert_int_equal(s, 1);   /* whole requests with a 16-bit cache */
    assert_int_equal(plan_of(&d, 66, 1, 16384, true, -1, 0, NULL), AR_CFG_DECODE_TMA);
    assert_int_equal(plan_of(&d, 66, 1, 8192, false, -1, 0, NULL), AR_CFG_DECODE_TMA);   /* a cascade suffix pass */
    assert_int_equal(plan_of(&d, 65, 1, 8192, false, -1, 0, NULL), AR_CFG_DECODE);
    assert_int_equal(plan_of(&d, 128, 2, 8192, true, -1, 0, NULL), AR_CFG_DECODE);      /* two query tokens */
    assert_int_equal(plan_of(&d, 66, 1, 16385, true, -1, 0, NULL), AR_CFG_DECODE);
    assert_int_equal(plan_of(&d, 119, 1, 32768, true, -1, 0, NULL), AR_CFG_DECODE_TMA);   /* 10 x 119 >= 9 x 132 */
    assert_int_equal(plan_of(&d, 118, 1, 32768, true, -1, 0, NULL), AR_CFG_DECODE);
    /* just below: 0.48 x SMs on a flat launch (the small rule), not a cascade pass, not with it off */
    assert_int_equal(plan_of(&d, 64, 1, 8192, true, -1, 0, NULL), AR_CFG_DECODE_TMA);
    assert_int_equal(plan_of(&d, 64, 1, 8192, false, -1, 0, NULL), AR_CFG_DECODE);
    assert_int_equal(plan_of(&d, 63, 1, 8192, true, -1, 0, NULL), AR_CFG_DECODE);
    /* a 16-bit DECODE_TMA launch cut by the uneven rule (decode_tma_splits): B 64 and B 65 of 8k
     * keys, 512 blocks a request against twice the even share, 2 x ceil(32,768 / 132) = 498 and
     * 2 x 253 = 506, in 2 pieces (128 and 130 CTAs, one wave); from B 66 (2 x 256) whole; a
     * cascade suffix pass whole; with the ratio off or AR_CUDA_DECODE_TMA_SPLITS=1 whole */
    assert_int_equal(plan_of(&d, 64, 1, 8192, true, -1, 0, &s), AR_CFG_DECODE_TMA);
    assert_int_equal(s, 2);
    assert_int_equal(plan_of(&d, 65, 1, 8192, true, -1, 0, &s), AR_CFG_DECODE_TMA);
    assert_int_equal(s, 2);
    assert_int_equal(plan_of(&d, 66, 1, 8192, true, -1, 0, &s), AR_CFG_DECODE_TMA);
    assert_int_equal(s, 1);
    assert_int_equal(plan_of(&d, 100, 1, 8192, false, -1, 0, &s), AR_CFG_DECODE_TMA);
    assert_int_equal(s, 1);
    d.split_path_ratio = -1;
    assert_int_equal(plan_of(&d, 64, 1, 8192, true, -1, 0, &s), AR_CFG_DECODE_TMA);
    assert_int_equal(s, 1);
    d.split_path_ratio = 0;
    d.decode_tma_splits = 1;
    assert_int_equal(plan_of(&d, 64, 1, 8192, true, -1, 0, &s), AR_CFG_DECODE_TMA);
    assert_int_equal(s, 1);
    d.decode_tma_splits = 0;
    d.decode_tma_small = 0;   /* AR_CUDA_DECODE_TMA=rule */
    assert_int_equal(plan_of(&d, 64, 1, 8192, true, -1, 0, NULL), AR_CFG_DECODE);
    d.decode_tma_all = 1;     /* AR_CUDA_DECODE_TMA=split: every flat decode launch, cut to fill the SMs */
    assert_int_equal(plan_of(&d, 8, 1, 8192, true, -1, 0, &s), AR_CFG_DECODE_TMA);
    assert_true(s > 1);
    d = h200();
    /* a lopsided batch DECODE_TMA's rule would take (119 requests, 10 x 119 >= 9 x 132), one of
     * them at 135,150 keys among 118 of 2,000: its one CTA would walk 8,447 of the 23,197 blocks;
     * DECODE takes it and cuts the long request.  At twice the others' length (128 requests, one of
     * 16k keys among 8k ones), or with the long request within 16k keys (74 requests, one of 911
     * keys among 40-key ones), DECODE_TMA keeps it; AR_CUDA_DECODE_TMA=split takes it anyway */
    {
        static int qsl[129], seq[128];
        for (int r = 0; r <= 128; r++) qsl[r] = r;
        for (int r = 0; r < 119; r++) seq[r] = r == 7 ? 135150 : 2000;
        ar_attn_plan pl;
        assert_int_equal(ar_attn_build_plan(&d, 119, qsl, seq, false, true, -1, 0, &pl), 0);
        assert_int_equal(pl.config, AR_CFG_DECODE);
        assert_true(pl.num_splits > 1);
        ar_attn_plan_free(&pl);
        for (int r = 0; r < 119; r++) seq[r] = 2000 + 40 * r;   /* uneven, not lopsided: 6,720 keys at most */
        assert_int_equal(ar_attn_build_plan(&d, 119, qsl, seq, false, true, -1, 0, &pl), 0);
        assert_int_equal(pl.config, AR_CFG_DECODE_TMA);
        ar_attn_plan_free(&pl);
        for (int r = 0; r < 128; r++) seq[r] = r == 0 ? 16384 : 8192;
        assert_int_equal(ar_attn_build_plan(&d, 128, qsl, seq, false, true, -1, 0, &pl), 0);
        assert_int_equal(pl.config, AR_CFG_DECODE_TMA);
        /* its 1,024 blocks over twice the even share, 2 x ceil(66,048 / 132) = 1,002: the long
         * request in 2 pieces of 512 blocks, the 127 others whole, 129 CTAs */
        assert_int_equal(pl.num_splits, 2);
        assert_int_equal(pl.num_work, 129);
        for (int64_t k = 0; k < pl.num_work; k++) assert_true(pl.work[k].tile_end - pl.work[k].tile_begin <= 512);
        ar_attn_plan_free(&pl);
        for (int r = 0; r < 74; r++) seq[r] = r == 0 ? 911 : 40;   /* short: the long one costs microseconds */
        assert_int_equal(ar_attn_build_plan(&d, 74, qsl, seq, false, true, -1, 0, &pl), 0);
        assert_int_equal(pl.config, AR_CFG_DECODE_TMA);
        ar_attn_plan_free(&pl);
        for (int r = 0; r < 119; r++) seq[r] = r == 7 ? 135150 : 2000;
        d.decode_tma_all = 1;
        assert_int_equal(ar_attn_build_plan(&d, 119, qsl, seq, false, true, -1, 0, &pl), 0);
        assert_int_equal(pl.config, AR_CFG_DECODE_TMA);
        ar_attn_plan_free(&pl);
        d.decode_tma_all = 0;
    }
    /* the Mooncake decode step of 11 requests, one at 135,150 keys (about 48 units a slot, the
     * longest item far over twice the mean): DECODE with the uneven rule's 59 splits at the large
     * launches' ratio 1 (ratio 2: 30; the 85% rule alone: 6), the long request's 8 KV heads in 59
     * pieces of at most 9 units (36 key tiles of 64) each, the short ones whole */
    {
        int qsl[12], seq[11];
        for (int r = 0; r <= 11; r++) qsl[r] = r;
        for (int r = 0; r < 11; r++) seq[r] = r == 3 ? 135150 : 1500;
        ar_attn_plan pl;
        assert_int_equal(ar_attn_build_plan(&d, 11, qsl, seq, false, true, -1, 0, &pl), 0);
        assert_int_equal(pl.config, AR_CFG_DECODE);
        assert_int_equal(pl.num_splits, 59);
        assert_int_equal(pl.num_work, 8 * 59 + 10 * 8);
        assert_int_equal(pl.num_groups, 8);
        for (int64_t k = 0; k < pl.num_work; k++) assert_true(pl.work[k].tile_end - pl.work[k].tile_begin <= 36);
        ar_attn_plan_free(&pl);
        d.split_path_large = -1;   /* AR_CUDA_SPLIT_PATH_LARGE=off: ratio 2's 30 pieces of at most 18 units */
        assert_int_equal(ar_attn_build_plan(&d, 11, qsl, seq, false, true, -1, 0, &pl), 0);
        assert_int_equal(pl.num_splits, 30);
        assert_int_equal(pl.num_work, 8 * 30 + 10 * 8);
        for (int64_t k = 0; k < pl.num_work; k++) assert_true(pl.work[k].tile_end - pl.work[k].tile_begin <= 72);
        ar_attn_plan_free(&pl);
        d.split_path_large = 0;
        d.split_path_ratio = -1;   /* AR_CUDA_SPLIT_PATH_RATIO=off: the 85% rule's 6 */
        assert_int_equal(ar_attn_build_plan(&d, 11, qsl, seq, false, true, -1, 0, &pl), 0);
        assert_int_equal(pl.num_splits, 6);
        ar_attn_plan_free(&pl);
        d.split_path_ratio = 0;
    }
    /* the same step under AR_CUDA_DECODE_TMA=uneven: DECODE_TMA, the long request (8,447 blocks)
     * in 59 pieces of at most 2 x ceil(9,387 / 132) = 144 blocks, the ten short ones (94 blocks)
     * whole: 69 CTAs, one combine group a KV head of the long request; uniform batches of whole
     * requests stay whole (B 128 of 8k keys: 512 blocks against 2 x 497), and with the ratio off
     * the pieces are =split's */
    {
        int qsl[12], seq[11];
        for (int r = 0; r <= 11; r++) qsl[r] = r;
        for (int r = 0; r < 11; r++) seq[r] = r == 3 ? 135150 : 1500;
        int max_blocks, max_seq;
        int64_t total_blocks;
        ar_attn_decode_tma_extent(11, seq, 0, &max_blocks, &total_blocks, &max_seq);
        assert_int_equal(max_blocks, 8447);
        assert_int_equal(total_blocks, 9387);
        assert_int_equal(ar_attn_decode_tma_uneven_splits(total_blocks, max_blocks, 132, 2), 59);
        assert_int_equal(ar_attn_decode_tma_uneven_splits(total_blocks, max_blocks, 132, 4), 30);
        assert_int_equal(ar_attn_decode_tma_uneven_splits(total_blocks, max_blocks, 132, 0), 1);
        d.decode_tma_all = d.decode_tma_uneven = 1;
        ar_attn_plan pl;
        assert_int_equal(ar_attn_build_plan(&d, 11, qsl, seq, false, true, -1, 0, &pl), 0);
        assert_int_equal(pl.config, AR_CFG_DECODE_TMA);
        assert_int_equal(pl.num_splits, 59);
        assert_int_equal(pl.num_work, 59 + 10);
        assert_int_equal(pl.num_groups, 8);
        for (int64_t k = 0; k < pl.num_work; k++) assert_true(pl.work[k].tile_end - pl.work[k].tile_begin <= 144);
        ar_attn_plan_free(&pl);
        /* gpu_cuda's case: one request of 40k keys among 11 of 1.5k, pieces of at most 2 x
         * ceil(3,534 / 132) = 54 blocks: 47 for the long one, 2 for each short one */
        int qsl12[13], seq12[12];
        for (int r = 0; r <= 12; r++) qsl12[r] = r;
        for (int r = 0; r < 12; r++) seq12[r] = r == 5 ? 40000 : 1500;
        assert_int_equal(ar_attn_build_plan(&d, 12, qsl12, seq12, false, true, -1, 0, &pl), 0);
        assert_int_equal(pl.config, AR_CFG_DECODE_TMA);
        assert_int_equal(pl.num_splits, 47);
        assert_int_equal(pl.num_work, 47 + 11 * 2);
        assert_int_equal(pl.num_groups, 12 * 8);
        ar_attn_plan_free(&pl);
        int s128;
        assert_int_equal(plan_of(&d, 128, 1, 8192, true, -1, 0, &s128), AR_CFG_DECODE_TMA);
        assert_int_equal(s128, 1);
        d.split_path_ratio = -1;
        assert_int_equal(ar_attn_build_plan(&d, 11, qsl, seq, false, true, -1, 0, &pl), 0);
        assert_int_equal(pl.config, AR_CFG_DECODE_TMA);
        assert_int_equal(pl.num_splits, ar_attn_split_count(11, 8447, 132));   /* =split's count */
        ar_attn_plan_free(&pl);
        d.split_path_ratio = 0;
        d.decode_tma_all = d.decode_tma_uneven = 0;
    }
    /* what DECODE_TMA cannot run stays on DECODE */
    const ar_attn_device base = d;
    d.head_size = d.template_hd = 64;
    assert_int_equal(plan_of(&d, 128, 1, 8192, true, -1, 0, NULL), AR_CFG_DECODE);
    d = base;
    d.block_size = 32;
    assert_int_equal(plan_of(&d, 128, 1, 8192, true, -1, 0, NULL), AR_CFG_DECODE);
    d = base;
    d.num_kv_heads = 16;
    assert_int_equal(plan_of(&d, 128, 1, 8192, true, -1, 0, NULL), AR_CFG_DECODE);
    d = base;
    d.fault = AR_FAULT_CAUSAL_OFF_BY_ONE;
    assert_int_equal(plan_of(&d, 128, 1, 8192, true, -1, 0, NULL), AR_CFG_DECODE);
    d = base;
    d.has_tma = 0;
    d.decode_tma_auto = 0;
    assert_int_equal(plan_of(&d, 128, 1, 8192, true, -1, 0, NULL), AR_CFG_DECODE);
    d = base;
    /* an fp8 cache cuts DECODE_TMA batches to fill the SMs (bench_cuda, 8k keys: B 64 in 2
     * pieces a request, B 96 in 4, B 128 whole) */
    d.kv_fp8 = 1;
    d.elem_bytes = 1;
    d.wgmma_auto = 0;
    assert_int_equal(plan_of(&d, 64, 1, 8192, true, -1, 0, &s), AR_CFG_DECODE_TMA);
    assert_int_equal(s, 2);
    assert_int_equal(plan_of(&d, 96, 1, 8192, true, -1, 0, &s), AR_CFG_DECODE_TMA);
    assert_int_equal(s, 4);
    assert_int_equal(plan_of(&d, 128, 1, 8192, true, -1, 0, &s), AR_CFG_DECODE_TMA);
    assert_int_equal(s, 1);
    assert_int_equal(plan_of(&d, 100, 1, 8192, false, -1, 0, &s), AR_CFG_DECODE_TMA);   /* cascade passes stay whole */
    assert_int_equal(s, 1);
    /* prefill: PREFILL_WG at head size 128 or 256 with tensor maps, else the mma.sync PREFILL */
    assert_int_equal(plan_of(&d, 2, 8192, 8192, true, -1, 0, NULL), AR_CFG_PREFILL);   /* fp8 */
    assert_int_equal(plan_of(&d, 2, 8192, 8192, true, AR_CFG_PREFILL_WG, 0, NULL), AR_CFG_PREFILL);
    d = base;
    assert_int_equal(plan_of(&d, 2, 8192, 8192, true, -1, 0, NULL), AR_CFG_PREFILL_WG);
    assert_int_equal(plan_of(&d, 2, 8192, 8192, true, AR_CFG_PREFILL, 0, NULL), AR_CFG_PREFILL);
    d.decode_splits = 5;   /* AR_CUDA_DECODE_SPLITS fixes DECODE's split count only */
    assert_int_equal(plan_of(&d, 4, 1, 8192, true, -1, 0, &s), AR_CFG_DECODE);
    assert_int_equal(s, 5);
    assert_int_equal(plan_of(&d, 2, 8192, 8192, true, -1, 0, &s), AR_CFG_PREFILL_WG);
    assert_int_equal(s, 1);
    d.decode_splits = 0;
    d.wgmma_auto = 0;   /* AR_CUDA_WGMMA=0 */
    assert_int_equal(plan_of(&d, 2, 8192, 8192, true, -1, 0, NULL), AR_CFG_PREFILL);
    d = base;
    d.head_size = d.template_hd = 64;
    assert_int_equal(plan_of(&d, 2, 8192, 8192, true, -1, 0, NULL), AR_CFG_PREFILL);
    d = base;
    /* a step of 4-token queries: 16 rows a (request, KV head) at group 4, so DECODE; 5 tokens do not fit */
    assert_int_equal(plan_of(&d, 32, 4, 4096, true, -1, 0, NULL), AR_CFG_DECODE);
    assert_int_equal(plan_of(&d, 32, 5, 4096, true, -1, 0, NULL), AR_CFG_PREFILL_WG);
    /* forced splits are taken as they are */
    assert_int_equal(plan_of(&d, 4, 1, 8192, true, AR_CFG_DECODE, 7, &s), AR_CFG_DECODE);
    assert_int_equal(s, 7);
    assert_int_equal(plan_of(&d, 4, 1, 8192, true, AR_CFG_DECODE_TMA, 3, &s), AR_CFG_DECODE_TMA);
    assert_int_equal(s, 3);
}

/* On random devices and launches: the config chosen can run the launch, and the plan's pieces
 * are the cut of that config's items (or DECODE_TMA's items) at the plan's split count. */
static void test_random_plans(void **state)
{
    (void)state;
    for (int it = 0; it < 600; it++) {
        ar_attn_device d = h200();
        const int hds[3] = {64, 128, 256};
        d.head_size = d.template_hd = hds[rnd(3)];
        d.block_size = rnd(4) ? 16 : 32;
        d.num_kv_heads = 1 + rnd(16);
        d.group = 1 << rnd(4);
        d.has_tma = rnd(5) != 0;
        d.kv_fp8 = rnd(5) == 0;
        d.elem_bytes = d.kv_fp8 ? 1 : 2;
        d.wgmma_auto = d.has_tma && rnd(4) ? AR_CFG_PREFILL_WG : 0;
        d.decode_tma_auto = d.has_tma && rnd(5);
        d.decode_tma_all = rnd(4) == 0;
        d.decode_tma_uneven = d.decode_tma_all && rnd(2);
        d.decode_tma_small = rnd(2);
        d.decode_tma_many = rnd(2);
        d.decode_tma_pieces = rnd(6) == 0 ? 1 + rnd(300) : 0;
        d.decode_splits = rnd(5) == 0 ? 1 + rnd(6) : 0;
        d.split_path_ratio = rnd(4) == 0 ? (rnd(2) ? -1 : 1 + rnd(8)) : 0;
        d.split_path_large = rnd(4) == 0 ? (rnd(2) ? -1 : 1 + rnd(8)) : 0;
        d.sliding_window = rnd(4) == 0 ? 1 + rnd(4000) : 0;
        d.fault = rnd(10) == 0 ? AR_FAULT_CAUSAL_OFF_BY_ONE : AR_FAULT_NONE;
        static int qsl[257], seq[256];
        const int kind = rnd(3), R = 1 + rnd(kind == 0 ? 256 : 24);
        qsl[0] = 0;
        int max_q = 0;
        for (int r = 0; r < R; r++) {
            const int ql = kind == 0 ? 1 : kind == 1 ? 1 + rnd(200) : 1 + rnd(2000);
            qsl[r + 1] = qsl[r] + ql;
            seq[r] = ql + (kind == 2 ? 0 : rnd(20000));
            if (ql > max_q) max_q = ql;
        }
        const bool non_causal = rnd(6) == 0, flat = rnd(3) != 0;
        const int fc = rnd(4) == 0 ? rnd(AR_CFG_COUNT) : -1, fs = rnd(5) == 0 ? 1 + rnd(8) : 0;
        ar_attn_plan pl;
        assert_int_equal(ar_attn_build_plan(&d, R, qsl, seq, non_causal, flat, fc, fs, &pl), 0);
        assert_true(pl.num_splits >= 1 && pl.num_splits <= AR_MAX_SPLITS);
        assert_memory_equal(&pl.geom, &d.geom[pl.config], sizeof pl.geom);
        if (pl.config == AR_CFG_PREFILL_WG)
            assert_true(d.has_tma && (d.head_size == 128 || d.head_size == 256) && !d.kv_fp8);
        if (pl.config == AR_CFG_DECODE_TMA) {
            assert_true(d.has_tma && d.head_size == 128 && d.block_size == 16 && d.num_kv_heads <= 8 && d.group <= 16);
            assert_true(d.fault == AR_FAULT_NONE && !non_causal && max_q == 1);
            int max_blocks, max_seq;
            int64_t total_blocks;
            ar_attn_decode_tma_extent(R, seq, d.sliding_window, &max_blocks, &total_blocks, &max_seq);
            ar_attn_pieces want;
            assert_int_equal(ar_attn_decode_tma_items(R, qsl, seq, d.sliding_window, d.num_kv_heads, pl.num_splits,
                                                      max_blocks, &want), 0);
            ar_attn_sort_longest_first(want.work, want.num_work);
            assert_int_equal(pl.num_work, want.num_work);
            assert_memory_equal(pl.work, want.work, sizeof *pl.work * (size_t)pl.num_work);
            ar_attn_pieces_free(&want);
        } else {
            if (pl.config == AR_CFG_DECODE) assert_true(max_q * d.group <= 16);   /* no force makes a launch DECODE */
            const ar_attn_geom *g = &pl.geom;
            const ar_attn_shape sh = {R, qsl, seq, d.num_kv_heads, d.group, g->rows, g->block_n, g->warps_n,
                                      non_causal, d.sliding_window, d.fault == AR_FAULT_CAUSAL_OFF_BY_ONE};
            ar_attn_work *items;
            int64_t n;
            int max_units;
            assert_int_equal(ar_attn_items(&sh, &items, &n, &max_units), 0);
            ar_attn_work *sorted = malloc(sizeof *sorted * (size_t)(pl.num_work > 0 ? pl.num_work : 1));
            assert_non_null(sorted);
            memcpy(sorted, pl.work, sizeof *sorted * (size_t)pl.num_work);
            qsort(sorted, (size_t)pl.num_work, sizeof *sorted, cmp_item_pos);
            const ar_attn_pieces got = {sorted, pl.groups, pl.num_work, pl.num_groups, pl.num_partials};
            check_cut(items, n, pl.num_splits, max_units, g->warps_n, &got);
            /* the split count is the rule's for the launch (forced or fixed counts aside) */
            const int slots = d.num_sms * d.ctas_per_sm[pl.config];
            if (fs == 0 && !(pl.config == AR_CFG_DECODE && d.decode_splits > 0)) {
                int want = non_causal ? ar_attn_prefix_split_count((int)n, max_units, slots)
                                      : ar_attn_split_count((int)n, max_units, slots);
                if (!non_causal && pl.config == AR_CFG_DECODE) {
                    const int ratio = d.split_path_ratio ? d.split_path_ratio : AR_SPLIT_PATH_RATIO;
                    const int large = d.split_path_large ? (d.split_path_large > 0 ? d.split_path_large : 0)
                                      : d.split_path_ratio ? 0 : AR_SPLIT_PATH_LARGE;
                    want = ar_attn_split_count_uneven(
                        items, n, max_units, g->warps_n, slots, want,
                        ar_attn_split_path_ratio_for(items, n, max_units, g->warps_n, slots, ratio, large));
                }
                assert_int_equal(pl.num_splits, want);
            }
            if (!ar_attn_config_is_wg(pl.config))   /* PREFILL_WG's order is item_order's */
                for (int64_t k = 1; k < pl.num_work; k++)
                    assert_true(pl.work[k - 1].tile_end - pl.work[k - 1].tile_begin >=
                                pl.work[k].tile_end - pl.work[k].tile_begin);
            free(sorted);
            free(items);
        }
        ar_attn_plan_free(&pl);
    }
}

/* The split combine's team (ar_attn_combine_team): a fixed team as given (one thread when
 * asked); by default the rule's smallest power of two that leaves a thread at most
 * AR_COMBINE_TEAM_SPAN of the largest group's partials, never past a warp; under fill the
 * rule's team, or the widest up to the partials whose threads take at most a quarter of the
 * device's. */
static void test_combine_team(void **state)
{
    (void)state;
    ar_combine_group g[3];
    memset(g, 0, sizeof g);
    g[0].count = 2;
    g[1].count = 64;   /* one request in AR_MAX_SPLITS pieces (the Mooncake trace's lopsided steps: 28-41) */
    g[2].count = 3;
    assert_int_equal(ar_attn_combine_team(g, 3, 256, 270336, 1), 1);
    assert_int_equal(ar_attn_combine_team(g, 3, 256, 270336, 4), 4);
    assert_int_equal(ar_attn_combine_team(g, 3, 256, 270336, AR_COMBINE_TEAM_RULE), 8);
    assert_int_equal(ar_attn_combine_team(g, 0, 256, 270336, AR_COMBINE_TEAM_RULE), 1);
    static const int counts[][2] = {{1, 1}, {8, 1}, {9, 2}, {16, 2}, {17, 4}, {18, 4}, {32, 4}, {33, 8},
                                    {64, 8}, {65, 16}, {128, 16}, {129, 32}, {256, 32}, {1024, 32}};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        g[1].count = counts[i][0];
        const int team = ar_attn_combine_team(g, 3, 256, 270336, AR_COMBINE_TEAM_RULE);
        if (team != counts[i][1]) fail_msg("largest group of %d partials: team %d, want %d", counts[i][0], team,
                                           counts[i][1]);
        assert_true(team <= AR_COMBINE_TEAM_MOST && (team & (team - 1)) == 0);
    }
    /* fill: 3 groups of 256 threads on an H100's 132 x 2048 slots (a quarter: 67,584) take a
     * team of 32 (24,576 threads) when the largest group has 17 to 1024 partials, and below that
     * a team as wide as the largest group's partials rounded up to a power of two (the other
     * groups have 2 and 3); the quarter bounds the widening: 96 groups of 4 partials take 2
     * (49,152 threads), not 4 (98,304); 2,000 groups keep 1; and never below the rule's team
     * (8 for 64 partials, however many groups) */
    static const int fill[][2] = {{1, 4}, {3, 4}, {4, 4}, {5, 8}, {8, 8}, {9, 16}, {16, 16}, {17, 32}, {64, 32},
                                  {1024, 32}};
    for (size_t i = 0; i < sizeof fill / sizeof fill[0]; i++) {
        g[1].count = fill[i][0];
        const int team = ar_attn_combine_team(g, 3, 256, 270336, AR_COMBINE_TEAM_FILL);
        if (team != fill[i][1]) fail_msg("fill, largest group of %d partials: team %d, want %d", fill[i][0], team,
                                         fill[i][1]);
    }
    ar_combine_group many[2000];
    memset(many, 0, sizeof many);
    for (int i = 0; i < 2000; i++) many[i].count = 4;
    assert_int_equal(ar_attn_combine_team(many, 96, 256, 270336, AR_COMBINE_TEAM_FILL), 2);
    assert_int_equal(ar_attn_combine_team(many, 33, 256, 270336, AR_COMBINE_TEAM_FILL), 4);
    assert_int_equal(ar_attn_combine_team(many, 2000, 256, 270336, AR_COMBINE_TEAM_FILL), 1);
    for (int i = 0; i < 2000; i++) many[i].count = 64;
    assert_int_equal(ar_attn_combine_team(many, 2000, 256, 270336, AR_COMBINE_TEAM_FILL), 8);
    /* the rule and fixed teams ignore the slots */
    assert_int_equal(ar_attn_combine_team(many, 2000, 256, 270336, AR_COMBINE_TEAM_RULE), 8);
    assert_int_equal(ar_attn_combine_team(many, 2000, 256, 270336, 4), 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_items_and_cuts),
        cmocka_unit_test(test_decode_tma_items),
        cmocka_unit_test(test_split_rules),
        cmocka_unit_test(test_split_path_large),
        cmocka_unit_test(test_decode_tma_many),
        cmocka_unit_test(test_decision_rule),
        cmocka_unit_test(test_random_plans),
        cmocka_unit_test(test_combine_team),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
