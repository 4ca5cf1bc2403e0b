/* test_mla_plan.c - the cuda-mla planners (kernels/mla/mla_plan.c) without a GPU.  The decode
 * planner: on
 * random batches (decodes, multi-token queries, prefill-sized rows, 16 and 128 heads, causal or
 * not, the off-by-one fault's extra key, a request mask, SM counts from 1 to 132, forced split
 * counts) every plan must cover each row tile's visible keys exactly once, in pieces that start
 * on key tiles, with a combine group for each row tile that was cut and one partial slot per
 * piece.  The one-piece-a-CTA plan must be sorted longest first and cut evenly; the persistent
 * plan's chains must visit every piece once, in request order, with the same number of key
 * tiles on every CTA but the last.  Two shapes whose plans were measured on the H200
 * (mla_plan.c: FlashMLA's b = 128 at h_q 16 and 128, and 32 requests of 4k keys) are checked
 * piece by piece.  The prefill path's passes and query tiles: test_prefill_passes; the runs of
 * decode tokens the projection GEMMs take: test_decode_runs. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "../kernels/mla/mla_plan.h"

enum { MAX_REQS = 96, ROWS = AR_MLA_PLAN_ROWS, KEYS = AR_MLA_PLAN_KEYS };

typedef struct batch {
    int R, H, causal, extra;
    int qsl[MAX_REQS + 1];          /* query_start_loc */
    int seq_lens[MAX_REQS];
    unsigned char include[MAX_REQS];
    int use_include;
} batch;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static int rnd(int n) { return tu_rnd(&rng_state, n); }   /* 0 .. n - 1 */

/* The keys the last row of the row tile at row0 of request r sees: its query token i =
 * last_row / H sees keys 0 .. seq_len - q_len + i (+ extra) when causal, all of them otherwise. */
static int want_key_end(const batch *b, int r, int row0)
{
    const int ql = b->qsl[r + 1] - b->qsl[r], sl = b->seq_lens[r], nrows = ql * b->H;
    const int last = row0 + ROWS - 1 < nrows - 1 ? row0 + ROWS - 1 : nrows - 1;
    if (!b->causal) return sl;
    int lim = sl - ql + last / b->H + 1 + b->extra;
    if (lim > sl) lim = sl;
    return lim < 0 ? 0 : lim;
}

static int planned(const batch *b, int r) { return !b->use_include || b->include[r]; }

static int64_t tiles_of(int key_begin, int key_end) { return (key_end - key_begin + KEYS - 1) / KEYS; }

static int cmp_pos(const ar_mla_work_item *a, const ar_mla_work_item *b)
{
    if (a->req != b->req) return a->req < b->req ? -1 : 1;
    if (a->row0 != b->row0) return a->row0 < b->row0 ? -1 : 1;
    return a->key_begin < b->key_begin ? -1 : a->key_begin > b->key_begin;
}

static int cmp_pos_q(const void *a, const void *b) { return cmp_pos(a, b); }

/* What every plan must hold; returns the total of key tiles. */
static int64_t check_coverage(const batch *b, const ar_mla_plan *p)
{
    assert_true(p->num_work >= 0 && p->num_groups >= 0 && p->num_partials >= 0);
    ar_mla_work_item *sorted = malloc(sizeof *sorted * (size_t)(p->num_work > 0 ? p->num_work : 1));
    assert_non_null(sorted);
    memcpy(sorted, p->work, sizeof *sorted * (size_t)p->num_work);
    qsort(sorted, (size_t)p->num_work, sizeof *sorted, cmp_pos_q);
    char *partial_seen = calloc((size_t)p->num_partials + 1, 1);
    char *group_seen = calloc((size_t)p->num_groups + 1, 1);
    assert_true(partial_seen && group_seen);
    int64_t total = 0;
    int i = 0, max_rows = 0;
    for (int r = 0; r < b->R; r++) {
        const int nrows = (b->qsl[r + 1] - b->qsl[r]) * b->H;
        if (!planned(b, r)) continue;
        if (nrows > max_rows) max_rows = nrows;
        for (int row0 = 0; row0 < nrows; row0 += ROWS) {
            const int kend = want_key_end(b, r, row0);
            int first = i, at = 0;
            /* the row tile's pieces, in key order: [0, kend) exactly, each on a key tile */
            while (i < p->num_work && sorted[i].req == r && sorted[i].row0 == row0) {
                const ar_mla_work_item *w = &sorted[i];
                assert_int_equal(w->key_begin, at);
                assert_int_equal(w->key_begin % KEYS, 0);
                assert_true(w->key_end > w->key_begin || (kend == 0 && w->key_end == 0));
                at = w->key_end;
                total += tiles_of(w->key_begin, w->key_end);
                i++;
            }
            assert_int_equal(at, kend);
            const int pieces = i - first;
            assert_true(pieces >= 1);
            if (pieces == 1) {
                assert_int_equal(sorted[first].partial, -1);
                continue;
            }
            /* a cut row tile: one combine group, its partial slots the pieces' own */
            int g = -1;
            for (int k = 0; k < p->num_groups; k++)
                if (p->groups[k].req == r && p->groups[k].row0 == row0) {
                    assert_int_equal(g, -1);
                    g = k;
                }
            assert_true(g >= 0);
            group_seen[g] = 1;
            const ar_mla_combine_group *gp = &p->groups[g];
            assert_int_equal(gp->count, pieces);
            assert_true(gp->first_partial >= 0 && gp->first_partial + gp->count <= p->num_partials);
            for (int k = first; k < i; k++) {
                const int slot = sorted[k].partial;
                assert_true(slot >= gp->first_partial && slot < gp->first_partial + gp->count);
                assert_int_equal(partial_seen[slot], 0);
                partial_seen[slot] = 1;
            }
        }
    }
    assert_int_equal(i, p->num_work);   /* no piece of another request or row tile */
    for (int k = 0; k < p->num_groups; k++) assert_int_equal(group_seen[k], 1);
    for (int k = 0; k < p->num_partials; k++) assert_int_equal(partial_seen[k], 1);
    assert_int_equal(p->max_rows, max_rows);
    assert_int_equal(p->total_tiles, total);
    free(sorted);
    free(partial_seen);
    free(group_seen);
    return total;
}

/* The one-piece-a-CTA plan: no chains, longest first, and cut pieces of one length per row tile
 * but its last (force_splits: at most that many; else total / SMs tiles, at least 4). */
static void check_one_piece_plan(const batch *b, const ar_mla_plan *p, int num_sms, int force_splits)
{
    const int64_t total = check_coverage(b, p);
    assert_int_equal(p->num_ctas, p->num_work);
    int64_t chunk = num_sms > 0 ? (total + num_sms - 1) / num_sms : total;
    if (chunk < 4) chunk = 4;
    for (int k = 0; k < p->num_work; k++) {
        const ar_mla_work_item *w = &p->work[k];
        assert_int_equal(w->next, -1);
        if (k > 0) assert_true(p->work[k - 1].key_end - p->work[k - 1].key_begin >= w->key_end - w->key_begin);
        if (w->partial < 0) continue;
        const ar_mla_combine_group *gp = NULL;
        for (int g = 0; g < p->num_groups; g++)
            if (p->groups[g].req == w->req && p->groups[g].row0 == w->row0) gp = &p->groups[g];
        assert_non_null(gp);
        const int kend = want_key_end(b, w->req, w->row0);
        if (force_splits > 0) {
            assert_true(gp->count <= force_splits);
            const int64_t my_chunk = (tiles_of(0, kend) + force_splits - 1) / force_splits;
            if (w->key_end < kend) assert_int_equal(tiles_of(w->key_begin, w->key_end), my_chunk);
        } else if (w->key_end < kend) {
            assert_int_equal(tiles_of(w->key_begin, w->key_end), chunk);
        }
    }
}

/* The persistent plan: CTA c starts at work[c]; its chain (next) visits its pieces in request
 * order, the chains one after another cover the whole plan in request order, and every CTA but
 * the last holds ceil(total / num_ctas asked) key tiles (the last at most that). */
static void check_persistent_plan(const batch *b, const ar_mla_plan *p, int num_ctas)
{
    const int64_t total = check_coverage(b, p);
    assert_true(p->num_ctas <= (num_ctas > 0 ? num_ctas : 1));
    assert_true(p->num_ctas >= (p->num_work > 0 ? 1 : 0));
    const int64_t target = total > 0 ? (total + num_ctas - 1) / num_ctas : 1;
    char *seen = calloc((size_t)p->num_work + 1, 1);
    assert_non_null(seen);
    const ar_mla_work_item *prev = NULL;
    int visited = 0;
    for (int c = 0; c < p->num_ctas; c++) {
        int64_t tiles = 0;
        for (int at = c; at >= 0; at = p->work[at].next) {
            assert_true(at < p->num_work);
            assert_int_equal(seen[at], 0);   /* no piece twice, no cycle */
            seen[at] = 1;
            visited++;
            if (prev) assert_true(cmp_pos(prev, &p->work[at]) < 0);
            prev = &p->work[at];
            tiles += tiles_of(p->work[at].key_begin, p->work[at].key_end);
        }
        if (c < p->num_ctas - 1)
            assert_int_equal(tiles, target);
        else
            assert_true(tiles <= target);
    }
    assert_int_equal(visited, p->num_work);
    free(seen);
}

static void random_batch(batch *b)
{
    memset(b, 0, sizeof *b);
    b->R = 1 + rnd(MAX_REQS);
    static const int heads[] = {8, 16, 32, 64, 128};   /* DeepSeek-V3 at TP 16 .. 1 */
    b->H = heads[rnd(5)];
    b->causal = rnd(4) != 0;
    b->extra = rnd(8) == 0;
    b->use_include = rnd(3) == 0;
    const int kind = rnd(3);   /* decodes, short queries, a prefill-sized mix */
    for (int r = 0; r < b->R; r++) {
        int ql = kind == 0 ? 1 : kind == 1 ? 1 + rnd(4) : 1 + rnd(rnd(2) ? 8 : 300);
        int ctx = rnd(4) == 0 ? rnd(64) : rnd(5000);
        b->qsl[r + 1] = b->qsl[r] + ql;
        b->seq_lens[r] = ql + ctx;
        if (!b->causal && rnd(20) == 0) b->seq_lens[r] = 0;   /* a row tile with no visible key */
        b->include[r] = (unsigned char)(rnd(4) != 0);
    }
}

static void test_random_batches(void **state)
{
    (void)state;
    const int sms[] = {1, 4, 7, 66, 132};
    for (int it = 0; it < 600; it++) {
        batch b;
        random_batch(&b);
        const int num_sms = sms[rnd(5)], force = rnd(3) == 0 ? 1 + rnd(6) : 0;
        const unsigned char *inc = b.use_include ? b.include : NULL;
        ar_mla_plan p;
        assert_int_equal(ar_mla_build_plan(&p, b.R, b.qsl, b.seq_lens, inc, b.H, b.causal, b.extra, num_sms, force), 0);
        check_one_piece_plan(&b, &p, num_sms, force);
        ar_mla_plan_free(&p);
        const int ctas = num_sms * (1 + rnd(2));
        assert_int_equal(ar_mla_build_plan_persistent(&p, b.R, b.qsl, b.seq_lens, inc, b.H, b.causal, b.extra, ctas),
                         0);
        check_persistent_plan(&b, &p, ctas);
        ar_mla_plan_free(&p);
        ar_mla_plan_free(&p);   /* a freed plan is zeroed: freeing it again is harmless */
    }
}

/* A NULL mask and a mask of every request give the same plan. */
static void test_include_all_is_no_mask(void **state)
{
    (void)state;
    batch b;
    random_batch(&b);
    b.causal = 1;
    memset(b.include, 1, sizeof b.include);
    ar_mla_plan a, m;
    assert_int_equal(ar_mla_build_plan(&a, b.R, b.qsl, b.seq_lens, NULL, b.H, 1, 0, 132, 0), 0);
    assert_int_equal(ar_mla_build_plan(&m, b.R, b.qsl, b.seq_lens, b.include, b.H, 1, 0, 132, 0), 0);
    assert_int_equal(a.num_work, m.num_work);
    assert_memory_equal(a.work, m.work, sizeof *a.work * (size_t)a.num_work);
    ar_mla_plan_free(&a);
    ar_mla_plan_free(&m);
}

/* b decode requests of s_k keys and h_q heads, one query token each. */
static void decodes(batch *b, int n, int h_q, int s_k)
{
    memset(b, 0, sizeof *b);
    b->R = n;
    b->H = h_q;
    b->causal = 1;
    for (int r = 0; r < n; r++) {
        b->qsl[r + 1] = r + 1;
        b->seq_lens[r] = s_k;
    }
}

/* The plans measured on the H200 (mla_plan.c): FlashMLA's b = 128 whole at h_q 16 (one row
 * tile a request, 128 CTAs on 132 SMs) and at h_q 128 (two row tiles, 256 CTAs) at every length;
 * 32 requests of 4k keys cut into 4 pieces each (32 tiles of 32 keys, 128 CTAs) and combined. */
static void test_measured_shapes(void **state)
{
    (void)state;
    static batch b;   /* MAX_REQS < 128: the b = 128 shapes are built by hand below */
    const int lens[] = {4096, 8192, 16384, 32768};
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 4; l++) {
            int qsl[129], seq[128];
            for (int r = 0; r <= 128; r++) qsl[r] = r;
            for (int r = 0; r < 128; r++) seq[r] = lens[l];
            ar_mla_plan p;
            const int h_q = h ? 128 : 16;
            assert_int_equal(ar_mla_build_plan(&p, 128, qsl, seq, NULL, h_q, 1, 0, 132, 0), 0);
            assert_int_equal(p.num_work, h ? 256 : 128);
            assert_int_equal(p.num_groups, 0);
            for (int k = 0; k < p.num_work; k++) {
                assert_int_equal(p.work[k].key_begin, 0);
                assert_int_equal(p.work[k].key_end, lens[l]);
                assert_int_equal(p.work[k].partial, -1);
            }
            ar_mla_plan_free(&p);
        }
    decodes(&b, 32, 16, 4096);
    ar_mla_plan p;
    assert_int_equal(ar_mla_build_plan(&p, b.R, b.qsl, b.seq_lens, NULL, 16, 1, 0, 132, 0), 0);
    check_one_piece_plan(&b, &p, 132, 0);
    assert_int_equal(p.num_work, 128);
    assert_int_equal(p.num_groups, 32);
    assert_int_equal(p.num_partials, 128);
    for (int k = 0; k < p.num_work; k++) assert_int_equal(p.work[k].key_end - p.work[k].key_begin, 1024);
    ar_mla_plan_free(&p);
    /* the persistent plan of the same batch over 132 CTAs: 4096 tiles, 32 a CTA (the last 0
     * left: 128 CTAs) */
    assert_int_equal(ar_mla_build_plan_persistent(&p, b.R, b.qsl, b.seq_lens, NULL, 16, 1, 0, 132), 0);
    check_persistent_plan(&b, &p, 132);
    assert_int_equal(p.num_ctas, 128);
    ar_mla_plan_free(&p);
}

/* The causal limits of a multi-token query's row tiles: the tile's last row decides. */
static void test_causal_row_tiles(void **state)
{
    (void)state;
    batch b;
    memset(&b, 0, sizeof b);
    b.R = 1;
    b.H = 16;
    b.causal = 1;
    b.qsl[1] = 8;           /* 8 tokens x 16 heads: two row tiles, tokens 0-3 and 4-7 */
    b.seq_lens[0] = 100;    /* 92 keys of context */
    ar_mla_plan p;
    assert_int_equal(ar_mla_build_plan(&p, 1, b.qsl, b.seq_lens, NULL, 16, 1, 0, 132, 1), 0);
    assert_int_equal(p.num_work, 2);
    for (int k = 0; k < 2; k++) assert_int_equal(p.work[k].key_end, p.work[k].row0 == 0 ? 96 : 100);
    ar_mla_plan_free(&p);
    assert_int_equal(ar_mla_build_plan(&p, 1, b.qsl, b.seq_lens, NULL, 16, 1, 1, 132, 1), 0);   /* off by one */
    for (int k = 0; k < 2; k++) assert_int_equal(p.work[k].key_end, p.work[k].row0 == 0 ? 97 : 100);
    ar_mla_plan_free(&p);
}

/* ---- the prefill path's passes and query tiles -------------------------------------------- */

/* One random step for the prefill planner: up to 24 requests, some prefills (q_len 129-700)
 * with or without context (up to 3000 keys), the others decodes or short queries. */
static void random_prefill_step(int *R, int *qsl, int *seq_lens, unsigned char *is_pf)
{
    *R = 1 + rnd(24);
    qsl[0] = 0;
    for (int r = 0; r < *R; r++) {
        is_pf[r] = (unsigned char)(rnd(3) != 0);
        const int ql = is_pf[r] ? 129 + rnd(572) : 1 + rnd(128);
        const int ctx = rnd(3) == 0 ? 0 : rnd(3001);
        qsl[r + 1] = qsl[r] + ql;
        seq_lens[r] = ctx + ql;
    }
}

/* The pairs of query tiles (ar_mla_pair_prefill_tiles): every tile in exactly one pair; a pair is
 * a request's tiles 2k and 2k + 1 (its first tile at an even offset in the request's tiles), or
 * a request's last tile alone; pairs ordered by the position of their last token, highest
 * first, ties in tile order. */
static void check_pairs(const ar_mla_prefill_passes *pp, int R, const int *qsl, const int *seq_lens,
                        const unsigned char *is_pf, const int *tiles)
{
    enum { MAXP = 24 * 700 };
    static int pairs[2 * MAXP], seen[MAXP], first_tile_of[64];
    assert_int_equal(ar_mla_pair_prefill_tiles(pp, R, qsl, seq_lens, is_pf, pairs), 0);
    memset(seen, 0, sizeof seen);
    for (int k = pp->num_tiles - 1; k >= 0; k--) first_tile_of[tiles[3 * k + 2]] = k;
    int want_pairs = 0;
    for (int r = 0; r < R; r++)
        if (is_pf[r]) want_pairs += (qsl[r + 1] - qsl[r] + 127) / 128;
    assert_int_equal(pp->num_pairs, want_pairs);
    long prev_last = -1, prev_first = -1;
    for (int i = 0; i < pp->num_pairs; i++) {
        const int t0 = pairs[2 * i], t1 = pairs[2 * i + 1];
        assert_true(t0 >= 0 && t0 < pp->num_tiles);
        const int r = tiles[3 * t0 + 2];
        assert_int_equal((t0 - first_tile_of[r]) % 2, 0);
        seen[t0]++;
        if (t1 >= 0) {
            assert_int_equal(t1, t0 + 1);
            assert_int_equal(tiles[3 * t1 + 2], r);
            seen[t1]++;
        } else {
            assert_true(t0 + 1 == pp->num_tiles || tiles[3 * (t0 + 1) + 2] != r);   /* the request's last */
        }
        const int lt = t1 >= 0 ? t1 : t0;
        const int ql = qsl[r + 1] - qsl[r];
        const long last = (long)(seq_lens[r] - ql) + (tiles[3 * lt] - tiles[3 * first_tile_of[r]]) + tiles[3 * lt + 1] - 1;
        if (i > 0) assert_true(last < prev_last || (last == prev_last && t0 > prev_first));
        prev_last = last;
        prev_first = t0;
    }
    for (int k = 0; k < pp->num_tiles; k++) assert_int_equal(seen[k], 1);
}

/* Every pass holds, for each prefill request, one run of consecutive positions (what the
 * tensor-core attention's key skipping relies on); over the passes the request's context
 * positions [0, ctx) each once, in context passes of at most `chunk` positions starting at
 * multiples of it, and its new tokens [ctx, ctx + q_len) in the last pass; rows and max_rows
 * add up; a pass stays within the workspace unless one block a request exceeds it.  The tokens
 * are the prefill requests' in order, and the query tiles cut them into runs of 1..64 tokens
 * of one request, in order, each token once. */
static void test_prefill_passes(void **state)
{
    (void)state;
    enum { MAXR = 24, MAXT = MAXR * 700 };
    static int row_req[MAXR * 4096], row_pos[MAXR * 4096], pf_tok[MAXT], tiles[MAXT * 3];
    for (int it = 0; it < 500; it++) {
        int R, qsl[MAXR + 1], seq_lens[MAXR], kb[MAXR], ke[MAXR];
        unsigned char is_pf[MAXR];
        random_prefill_step(&R, qsl, seq_lens, is_pf);
        const int bs = 16 << rnd(3), workspace = rnd(4) == 0 ? 16 + rnd(200) : 256 << rnd(5);
        ar_mla_prefill_passes pp;
        assert_int_equal(ar_mla_plan_prefill(&pp, R, qsl, seq_lens, is_pf, workspace, bs), 0);
        int reqs = 0, tokens = 0, with_ctx = 0, tiles_want = 0;
        for (int r = 0; r < R; r++)
            if (is_pf[r]) {
                reqs++;
                tokens += qsl[r + 1] - qsl[r];
                tiles_want += (qsl[r + 1] - qsl[r] + 63) / 64;
                with_ctx += seq_lens[r] > qsl[r + 1] - qsl[r];
            }
        assert_int_equal(pp.num_reqs, reqs);
        assert_int_equal(pp.num_tokens, tokens);
        assert_int_equal(pp.num_tiles, tiles_want);
        assert_int_equal(pp.num_passes, reqs > 0 ? pp.num_ctx_chunks + 1 : 0);
        assert_true(pp.chunk >= bs && pp.chunk % bs == 0);
        int covered[MAXR], max_rows = 0;   /* context positions seen so far, per request */
        memset(covered, 0, sizeof covered);
        for (int p = 0; p < pp.num_passes; p++) {
            assert_true(pp.rows[p] <= MAXR * 4096);
            ar_mla_fill_prefill_pass(&pp, p, R, qsl, seq_lens, is_pf, row_req, row_pos, kb, ke);
            const bool last = p == pp.num_passes - 1;
            int w = 0;
            for (int r = 0; r < R; r++) {
                assert_int_equal(kb[r], w);
                const int ql = qsl[r + 1] - qsl[r], ctx = seq_lens[r] - ql, n = ke[r] - kb[r];
                if (!is_pf[r]) {
                    assert_int_equal(n, 0);
                    continue;
                }
                for (int i = 0; i < n; i++) {
                    assert_int_equal(row_req[kb[r] + i], r);
                    assert_int_equal(row_pos[kb[r] + i], row_pos[kb[r]] + i);   /* consecutive */
                }
                if (last) {
                    assert_int_equal(n, ql);
                    assert_int_equal(n > 0 ? row_pos[kb[r]] : ctx, ctx);
                } else if (n > 0) {
                    assert_int_equal(row_pos[kb[r]], covered[r]);   /* picks up where the last pass ended */
                    assert_int_equal(row_pos[kb[r]] % pp.chunk, 0);
                    assert_true(n <= pp.chunk);
                    covered[r] += n;
                }
                w = ke[r];
            }
            assert_int_equal(w, pp.rows[p]);
            if (!last) assert_true(w <= (workspace > with_ctx * bs ? workspace : with_ctx * bs));
            if (w > max_rows) max_rows = w;
        }
        assert_int_equal(pp.max_rows, max_rows);
        for (int r = 0; r < R; r++)
            if (is_pf[r]) assert_int_equal(covered[r], seq_lens[r] - (qsl[r + 1] - qsl[r]));
        ar_mla_fill_prefill_tokens(R, qsl, is_pf, pf_tok, tiles);
        int n = 0;
        for (int r = 0; r < R; r++)
            for (int t = qsl[r]; is_pf[r] && t < qsl[r + 1]; t++) assert_int_equal(pf_tok[n++], t);
        int next = 0;
        for (int k = 0; k < pp.num_tiles; k++) {
            const int first = tiles[3 * k], count = tiles[3 * k + 1], r = tiles[3 * k + 2];
            assert_int_equal(first, next);
            assert_true(count >= 1 && count <= AR_MLA_PREFILL_TILE);
            assert_true(is_pf[r]);
            for (int i = 0; i < count; i++) assert_true(pf_tok[first + i] >= qsl[r] && pf_tok[first + i] < qsl[r + 1]);
            next = first + count;
        }
        assert_int_equal(next, tokens);
        check_pairs(&pp, R, qsl, seq_lens, is_pf, tiles);
        ar_mla_prefill_passes_free(&pp);
        ar_mla_prefill_passes_free(&pp);   /* zeroed: freeing again is harmless */
    }
}

/* The runs of decode tokens: on random steps (decode and prefill requests in any order, some of
 * no tokens), the runs cover exactly the decode requests' tokens, in order, each run maximal
 * (the next starts past a gap); past max_runs, one span from the first decode token to the
 * step's end, and only when the maximal runs are more than max_runs. */
static void test_decode_runs(void **state)
{
    (void)state;
    enum { MAXR = 40 };
    for (int it = 0; it < 2000; it++) {
        const int R = rnd(MAXR + 1), max_runs = 1 + rnd(16);
        int qsl[MAXR + 1], rows[2 * 16 + 2];
        unsigned char is_dec[MAXR + 1], want[MAXR * 200 + 1];
        qsl[0] = 0;
        for (int r = 0; r < R; r++) {
            is_dec[r] = (unsigned char)(rnd(3) != 0);
            const int q = is_dec[r] ? (rnd(5) == 0 ? 0 : 1 + rnd(4)) : (rnd(6) == 0 ? 0 : 129 + rnd(50));
            qsl[r + 1] = qsl[r] + q;
            for (int t = qsl[r]; t < qsl[r + 1]; t++) want[t] = is_dec[r];
        }
        const int T = qsl[R];
        int maximal = 0, first = -1;   /* the maximal runs of decode tokens, counted directly */
        for (int t = 0; t < T; t++) {
            if (want[t] && (t == 0 || !want[t - 1])) maximal++;
            if (want[t] && first < 0) first = t;
        }
        int n = -1;
        const int span = ar_mla_decode_runs(R, qsl, is_dec, max_runs, rows, &n);
        if (span) {
            assert_true(maximal > max_runs);
            assert_int_equal(n, 1);
            assert_int_equal(rows[0], first);
            assert_int_equal(rows[1], T);
            continue;
        }
        assert_int_equal(n, maximal);
        unsigned char got[MAXR * 200 + 1];
        memset(got, 0, sizeof got);
        for (int i = 0; i < n; i++) {
            assert_true(rows[2 * i] < rows[2 * i + 1]);
            if (i > 0) assert_true(rows[2 * i] > rows[2 * i - 1]);   /* in order, a gap between */
            for (int t = rows[2 * i]; t < rows[2 * i + 1]; t++) got[t] = 1;
        }
        for (int t = 0; t < T; t++) assert_int_equal(got[t], want[t]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefill_passes),
        cmocka_unit_test(test_decode_runs),
        cmocka_unit_test(test_random_batches),
        cmocka_unit_test(test_include_all_is_no_mask),
        cmocka_unit_test(test_measured_shapes),
        cmocka_unit_test(test_causal_row_tiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
