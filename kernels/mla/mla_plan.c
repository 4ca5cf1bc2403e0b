/* mla_plan.c - the cuda-mla planner (mla_plan.h): the decode plan (one piece a CTA, with its
 * estimate of whether cutting the row tiles pays, and the persistent plan of equal runs), the
 * prefill path's passes and query tiles, and the runs of decode tokens the projection GEMMs
 * take.  Plain C, host only; tests/test_mla_plan.c checks every plan's invariants. */
#include "mla_plan.h"

#include <stdlib.h>
#include <string.h>

void ar_mla_plan_free(ar_mla_plan *p)
{
    free(p->work);
    free(p->groups);
    memset(p, 0, sizeof *p);
}

static int cmp_work_len(const void *pa, const void *pb)
{
    const ar_mla_work_item *a = pa, *b = pb;
    int la = a->key_end - a->key_begin, lb = b->key_end - b->key_begin;
    if (la != lb) return lb - la;
    if (a->req != b->req) return a->req - b->req;
    if (a->row0 != b->row0) return a->row0 - b->row0;
    return a->key_begin - b->key_begin;
}

static int host_key_limit(int causal, int sl, int ql, int i, int extra)
{
    if (!causal) return sl;
    int lim = sl - ql + i + 1 + extra;
    if (lim > sl) lim = sl;
    return lim < 0 ? 0 : lim;
}

/* Key limit of the row tile at row0 of a request (its last row's limit: rows are token-major). */
static int row_tile_key_end(int causal, int sl, int ql, int H, int row0, int nrows, int extra)
{
    int last = row0 + AR_MLA_PLAN_ROWS - 1 < nrows - 1 ? row0 + AR_MLA_PLAN_ROWS - 1 : nrows - 1;
    return host_key_limit(causal, sl, ql, last / H, extra);
}

/* A planned row tile: rows row0 .. row0 + 63 of request req, its keys [0, kend) in ntiles key
 * tiles. */
typedef struct row_tile {
    int req, row0, kend;
    int64_t ntiles;
} row_tile;

/* The planned requests' row tiles in request order, *n of them (an empty array when none; NULL
 * when out of memory); their key tiles in all and the most rows of a request. */
static row_tile *row_tiles(int R, const int *qsl, const int *seq_lens, const unsigned char *include, int H,
                           int causal, int extra, int64_t *n, int64_t *total_tiles, int *max_rows)
{
    int64_t count = 0;
    for (int r = 0; r < R; r++)
        if (!include || include[r]) count += ((int64_t)(qsl[r + 1] - qsl[r]) * H + AR_MLA_PLAN_ROWS - 1) / AR_MLA_PLAN_ROWS;
    row_tile *rt = malloc((size_t)(count > 0 ? count : 1) * sizeof *rt);
    *n = *total_tiles = 0;
    *max_rows = 0;
    if (!rt) return NULL;
    for (int r = 0; r < R; r++) {
        if (include && !include[r]) continue;
        const int ql = qsl[r + 1] - qsl[r], nrows = ql * H;
        if (nrows > *max_rows) *max_rows = nrows;
        for (int row0 = 0; row0 < nrows; row0 += AR_MLA_PLAN_ROWS) {
            row_tile *t = &rt[(*n)++];
            t->req = r;
            t->row0 = row0;
            t->kend = row_tile_key_end(causal, seq_lens[r], ql, H, row0, nrows, extra);
            t->ntiles = (t->kend + AR_MLA_PLAN_KEYS - 1) / AR_MLA_PLAN_KEYS;
            *total_tiles += t->ntiles;
        }
    }
    return rt;
}

/* The time the launch's CTAs take when the hardware hands them, longest first, to the first of
 * `slots` free SMs (list scheduling): costs[n] sorted longest first, in key tiles.  heap: room
 * for min(n, slots) loads. */
static int64_t list_makespan(const int64_t *costs, int64_t n, int slots, int64_t *heap)
{
    int64_t used = 0, makespan = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t load;
        if (used < slots) {   /* an idle SM */
            load = costs[i];
            int64_t k = used++;
            heap[k] = load;
            while (k > 0 && heap[(k - 1) / 2] > heap[k]) {
                int64_t up = (k - 1) / 2, tmp = heap[up];
                heap[up] = heap[k];
                heap[k] = tmp;
                k = up;
            }
        } else {              /* the SM that frees first */
            load = heap[0] + costs[i];
            heap[0] = load;
            for (int64_t k = 0;;) {
                int64_t l = 2 * k + 1, m = k;
                if (l < used && heap[l] < heap[m]) m = l;
                if (l + 1 < used && heap[l + 1] < heap[m]) m = l + 1;
                if (m == k) break;
                int64_t tmp = heap[m];
                heap[m] = heap[k];
                heap[k] = tmp;
                k = m;
            }
        }
        if (load > makespan) makespan = load;
    }
    return makespan;
}

static int cmp_int64_desc(const void *pa, const void *pb)
{
    const int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return a < b ? 1 : a > b ? -1 : 0;
}

/* Pieces of `chunk` key tiles a row tile of ntiles is cut into (a row tile without keys: one). */
static int64_t pieces_of(int64_t ntiles, int64_t chunk) { return ntiles > 0 ? (ntiles + chunk - 1) / chunk : 1; }

/* Whether cutting the row tiles rt[n] into pieces of `chunk` key tiles finishes sooner on num_sms SMs than leaving them whole, by list scheduling with a CTA's
 * start-up (Q tile, the first key tile's latency, the epilogue) at PIECE_COST key tiles and the
 * combine launch at COMBINE_COST.  Measured on the H200 (2026-12-02, b = 128, h_q = 16, the wgmma16
 * kernel): whole row tiles faster at every length, +9.8 / +5.4 / +1.7 / +1.4% at 4k / 8k / 16k /
 * 32k keys a request (the cut was 63 + 1 tiles at 4k: a second wave of one-tile pieces and a
 * combine), which the estimate reproduces; it still cuts small batches and long requests next to
 * short ones (32 requests of 4k keys: 4 pieces each).  -1 when out of memory. */
static int split_pays(const row_tile *rt, int64_t n, int64_t chunk, int num_sms)
{
    enum { PIECE_COST = 4, COMBINE_COST = 4 };
    int64_t n_pieces = 0;
    int any_split = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t pieces = pieces_of(rt[i].ntiles, chunk);
        n_pieces += pieces;
        any_split |= pieces > 1;
    }
    if (!any_split) return 0;
    int64_t *whole = malloc((size_t)n * sizeof *whole);
    int64_t *cut = malloc((size_t)n_pieces * sizeof *cut);
    int64_t *heap = malloc((size_t)(num_sms > 0 ? num_sms : 1) * sizeof *heap);
    if (!whole || !cut || !heap) {
        free(whole);
        free(cut);
        free(heap);
        return -1;
    }
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t tiles = rt[i].ntiles;
        whole[i] = tiles + PIECE_COST;
        for (int64_t b = 0; b < tiles || (b == 0 && tiles == 0); b += chunk) {
            int64_t len = tiles - b < chunk ? tiles - b : chunk;
            cut[k++] = len + PIECE_COST;
        }
    }
    qsort(whole, (size_t)n, sizeof(int64_t), cmp_int64_desc);
    qsort(cut, (size_t)k, sizeof(int64_t), cmp_int64_desc);
    const int slots = num_sms > 0 ? num_sms : 1;
    const int64_t t_whole = list_makespan(whole, n, slots, heap);
    const int64_t t_cut = list_makespan(cut, k, slots, heap) + COMBINE_COST;
    free(whole);
    free(cut);
    free(heap);
    return t_cut < t_whole ? 1 : 0;
}

/* The piece length of a row tile of ntiles key tiles: chunk, or with force_splits its ntiles cut
 * into that many. */
static int64_t chunk_of(int64_t ntiles, int64_t chunk, int force_splits)
{
    if (force_splits <= 0) return chunk;
    return ntiles > 0 ? (ntiles + force_splits - 1) / force_splits : 1;
}

/* See mla_plan.h. */
int ar_mla_build_plan(ar_mla_plan *p, int R, const int *qsl, const int *seq_lens, const unsigned char *include, int H,
                      int causal, int extra, int num_sms, int force_splits)
{
    memset(p, 0, sizeof *p);
    int64_t n_rt = 0, total_tiles = 0;
    int max_rows = 0;
    row_tile *rt = row_tiles(R, qsl, seq_lens, include, H, causal, extra, &n_rt, &total_tiles, &max_rows);
    if (!rt) return -1;
    int64_t chunk = num_sms > 0 ? (total_tiles + num_sms - 1) / num_sms : total_tiles;
    if (chunk < 4) chunk = 4;
    if (force_splits <= 0 && n_rt > 0) {   /* cut only where it finishes sooner */
        int pays = split_pays(rt, n_rt, chunk, num_sms);
        if (pays < 0) {
            free(rt);
            return -1;
        }
        if (!pays) chunk = INT32_MAX;
    }
    /* the pieces, combine groups and partial slots, counted first */
    int64_t n_work = 0, n_groups = 0, n_partials = 0;
    for (int64_t i = 0; i < n_rt; i++) {
        const int64_t pieces = pieces_of(rt[i].ntiles, chunk_of(rt[i].ntiles, chunk, force_splits));
        n_work += pieces;
        n_groups += pieces > 1;
        n_partials += pieces > 1 ? pieces : 0;
    }
    p->work = malloc((size_t)(n_work > 0 ? n_work : 1) * sizeof *p->work);
    p->groups = malloc((size_t)(n_groups > 0 ? n_groups : 1) * sizeof *p->groups);
    if (!p->work || !p->groups) {
        free(rt);
        ar_mla_plan_free(p);
        return -1;
    }
    int64_t wi = 0, gi = 0, pi = 0;
    for (int64_t i = 0; i < n_rt; i++) {
        const row_tile *t = &rt[i];
        const int64_t my_chunk = chunk_of(t->ntiles, chunk, force_splits);
        const int64_t pieces = pieces_of(t->ntiles, my_chunk);
        if (pieces > 1) {
            ar_mla_combine_group *g = &p->groups[gi++];
            g->req = t->req;
            g->row0 = t->row0;
            g->first_partial = (int)pi;
            g->count = (int)pieces;
        }
        for (int64_t k = 0; k < pieces; k++) {
            ar_mla_work_item *w = &p->work[wi++];
            memset(w, 0, sizeof *w);
            w->req = t->req;
            w->row0 = t->row0;
            w->key_begin = (int)(k * my_chunk * AR_MLA_PLAN_KEYS);
            int64_t e = (k + 1) * my_chunk * AR_MLA_PLAN_KEYS;
            w->key_end = (int)(e < t->kend ? e : t->kend);
            if (t->ntiles == 0) w->key_begin = w->key_end = 0;
            w->partial = pieces > 1 ? (int)(pi + k) : -1;
            w->next = -1;   /* one piece per CTA (a persistent kernel stops after it) */
        }
        if (pieces > 1) pi += pieces;
    }
    free(rt);
    qsort(p->work, (size_t)n_work, sizeof *p->work, cmp_work_len);
    p->num_work = (int)n_work;
    p->num_ctas = (int)n_work;
    p->num_groups = (int)n_groups;
    p->num_partials = (int)n_partials;
    p->max_rows = max_rows;
    p->total_tiles = total_tiles;
    return 0;
}

/* See mla_plan.h: the runs of equal length, then the chains. */
int ar_mla_build_plan_persistent(ar_mla_plan *p, int R, const int *qsl, const int *seq_lens, const unsigned char *include,
                                 int H, int causal, int extra, int num_ctas)
{
    memset(p, 0, sizeof *p);
    int64_t total_tiles = 0, n_rowtiles = 0;
    int max_rows = 0;
    row_tile *rt = row_tiles(R, qsl, seq_lens, include, H, causal, extra, &n_rowtiles, &total_tiles, &max_rows);
    if (!rt) return -1;
    if (num_ctas < 1) num_ctas = 1;
    const int64_t target = total_tiles > 0 ? (total_tiles + num_ctas - 1) / num_ctas : 1;
    /* at most one cut per run boundary: n_rowtiles + num_ctas pieces */
    const int64_t cap = n_rowtiles + num_ctas + 1;
    ar_mla_work_item *tmp = malloc((size_t)cap * sizeof *tmp);
    int *cta_of = malloc((size_t)cap * sizeof *cta_of);
    p->groups = malloc((size_t)(n_rowtiles > 0 ? n_rowtiles : 1) * sizeof *p->groups);
    p->work = malloc((size_t)cap * sizeof *p->work);
    int *first = malloc((size_t)num_ctas * sizeof *first), *last_of = malloc((size_t)num_ctas * sizeof *last_of);
    if (!tmp || !cta_of || !p->groups || !p->work || !first || !last_of) {
        free(rt);
        free(tmp);
        free(cta_of);
        free(first);
        free(last_of);
        ar_mla_plan_free(p);
        return -1;
    }
    int64_t n = 0, used = 0;
    int cta = 0, n_groups = 0, n_partials = 0;
    for (int64_t i = 0; i < n_rowtiles; i++) {
        const row_tile *t = &rt[i];
        int64_t begin_n = n, start = 0;
        if (t->ntiles == 0) {   /* no visible key: rides with the run being filled */
            memset(&tmp[n], 0, sizeof tmp[n]);
            tmp[n].req = t->req;
            tmp[n].row0 = t->row0;
            cta_of[n++] = cta;
        }
        while (start < t->ntiles) {
            if (used >= target && cta < num_ctas - 1) {
                cta++;
                used = 0;
            }
            int64_t take = cta == num_ctas - 1 ? t->ntiles - start : target - used;
            if (take > t->ntiles - start) take = t->ntiles - start;
            memset(&tmp[n], 0, sizeof tmp[n]);
            tmp[n].req = t->req;
            tmp[n].row0 = t->row0;
            tmp[n].key_begin = (int)(start * AR_MLA_PLAN_KEYS);
            int64_t e = (start + take) * AR_MLA_PLAN_KEYS;
            tmp[n].key_end = (int)(e < t->kend ? e : t->kend);
            cta_of[n++] = cta;
            start += take;
            used += take;
        }
        int64_t pieces = n - begin_n;
        if (pieces > 1) {
            ar_mla_combine_group *g = &p->groups[n_groups++];
            g->req = t->req;
            g->row0 = t->row0;
            g->first_partial = n_partials;
            g->count = (int)pieces;
        }
        for (int64_t k = 0; k < pieces; k++) tmp[begin_n + k].partial = pieces > 1 ? n_partials + (int)k : -1;
        if (pieces > 1) n_partials += (int)pieces;
    }
    free(rt);
    /* CTA c's first piece at index c, the others after the last CTA, chained by next */
    const int ctas = n > 0 ? cta_of[n - 1] + 1 : 0;
    for (int c = 0; c < ctas; c++) first[c] = last_of[c] = -1;
    int64_t next_free = ctas;
    for (int64_t i = 0; i < n; i++) {
        int c = cta_of[i];
        int64_t at = first[c] < 0 ? c : next_free++;
        p->work[at] = tmp[i];
        p->work[at].next = -1;
        if (first[c] < 0)
            first[c] = (int)at;
        else
            p->work[last_of[c]].next = (int)at;
        last_of[c] = (int)at;
    }
    free(tmp);
    free(cta_of);
    free(first);
    free(last_of);
    p->num_work = (int)n;
    p->num_ctas = ctas;
    p->num_groups = n_groups;
    p->num_partials = n_partials;
    p->max_rows = max_rows;
    p->total_tiles = total_tiles;
    return 0;
}

/* ---- the prefill path's workspace passes ---------------------------------------------------- */

void ar_mla_prefill_passes_free(ar_mla_prefill_passes *pp)
{
    free(pp->rows);
    memset(pp, 0, sizeof *pp);
}

/* Request r's positions in pass p: [*lo, *hi) (empty when hi <= lo). */
static void pass_span(const ar_mla_prefill_passes *pp, int p, int ql, int ctx, int *lo, int *hi)
{
    if (p < pp->num_ctx_chunks) {
        *lo = p * pp->chunk;
        *hi = (p + 1) * pp->chunk < ctx ? (p + 1) * pp->chunk : ctx;
    } else {
        *lo = ctx;
        *hi = ctx + ql;
    }
}

int ar_mla_plan_prefill(ar_mla_prefill_passes *pp, int R, const int *qsl, const int *seq_lens,
                        const unsigned char *is_pf, int workspace_tokens, int block_size)
{
    memset(pp, 0, sizeof *pp);
    int with_ctx = 0, max_ctx = 0;
    for (int r = 0; r < R; r++) {
        if (!is_pf[r]) continue;
        const int ql = qsl[r + 1] - qsl[r], ctx = seq_lens[r] - ql;
        pp->num_reqs++;
        pp->num_tokens += ql;
        pp->num_tiles += (ql + AR_MLA_PREFILL_TILE - 1) / AR_MLA_PREFILL_TILE;
        pp->num_pairs += (ql + 2 * AR_MLA_PREFILL_TILE - 1) / (2 * AR_MLA_PREFILL_TILE);
        if (ctx > 0) with_ctx++;
        if (ctx > max_ctx) max_ctx = ctx;
    }
    int chunk = with_ctx > 0 ? workspace_tokens / with_ctx : workspace_tokens;
    chunk = chunk / block_size * block_size;
    pp->chunk = chunk < block_size ? block_size : chunk;
    pp->num_ctx_chunks = max_ctx > 0 ? (max_ctx + pp->chunk - 1) / pp->chunk : 0;
    pp->num_passes = pp->num_reqs > 0 ? pp->num_ctx_chunks + 1 : 0;
    pp->rows = calloc((size_t)pp->num_passes + 1, sizeof(int));
    if (!pp->rows) {
        memset(pp, 0, sizeof *pp);
        return -1;
    }
    for (int p = 0; p < pp->num_passes; p++) {
        for (int r = 0; r < R; r++) {
            if (!is_pf[r]) continue;
            const int ql = qsl[r + 1] - qsl[r];
            int lo, hi;
            pass_span(pp, p, ql, seq_lens[r] - ql, &lo, &hi);
            if (hi > lo) pp->rows[p] += hi - lo;
        }
        if (pp->rows[p] > pp->max_rows) pp->max_rows = pp->rows[p];
    }
    return 0;
}

void ar_mla_fill_prefill_pass(const ar_mla_prefill_passes *pp, int p, int R, const int *qsl, const int *seq_lens,
                              const unsigned char *is_pf, int *row_req, int *row_pos, int *kb, int *ke)
{
    int w = 0;
    for (int r = 0; r < R; r++) {
        kb[r] = ke[r] = w;
        if (!is_pf[r]) continue;
        const int ql = qsl[r + 1] - qsl[r];
        int lo, hi;
        pass_span(pp, p, ql, seq_lens[r] - ql, &lo, &hi);
        for (int pos = lo; pos < hi; pos++) {
            row_req[w] = r;
            row_pos[w] = pos;
            w++;
        }
        ke[r] = w;
    }
}

void ar_mla_fill_prefill_tokens(int R, const int *qsl, const unsigned char *is_pf, int *pf_tok, int *tiles)
{
    int n = 0, tile = 0;
    for (int r = 0; r < R; r++) {
        if (!is_pf[r]) continue;
        for (int t0 = qsl[r]; t0 < qsl[r + 1]; t0 += AR_MLA_PREFILL_TILE) {
            const int left = qsl[r + 1] - t0;
            tiles[3 * tile + 0] = n + (t0 - qsl[r]);
            tiles[3 * tile + 1] = left < AR_MLA_PREFILL_TILE ? left : AR_MLA_PREFILL_TILE;
            tiles[3 * tile + 2] = r;
            tile++;
        }
        for (int t = qsl[r]; t < qsl[r + 1]; t++) pf_tok[n++] = t;
    }
}

typedef struct tile_pair {
    int last_pos;   /* position of the pair's last token */
    int index;      /* in tile order */
    int tile[2];
} tile_pair;

static int by_last_pos_desc(const void *x, const void *y)
{
    const tile_pair *a = (const tile_pair *)x, *b = (const tile_pair *)y;
    if (a->last_pos != b->last_pos) return a->last_pos > b->last_pos ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

int ar_mla_pair_prefill_tiles(const ar_mla_prefill_passes *pp, int R, const int *qsl, const int *seq_lens,
                              const unsigned char *is_pf, int *pairs)
{
    tile_pair *tp = malloc((size_t)(pp->num_pairs > 0 ? pp->num_pairs : 1) * sizeof *tp);
    if (!tp) return -1;
    int n = 0, tile = 0;
    for (int r = 0; r < R; r++) {
        if (!is_pf[r]) continue;
        const int ql = qsl[r + 1] - qsl[r], ctx = seq_lens[r] - ql;
        const int tiles = (ql + AR_MLA_PREFILL_TILE - 1) / AR_MLA_PREFILL_TILE;
        for (int k = 0; k < tiles; k += 2) {
            const int end = (k + 2) * AR_MLA_PREFILL_TILE < ql ? (k + 2) * AR_MLA_PREFILL_TILE : ql;
            tp[n].last_pos = ctx + end - 1;
            tp[n].index = n;
            tp[n].tile[0] = tile + k;
            tp[n].tile[1] = k + 1 < tiles ? tile + k + 1 : -1;
            n++;
        }
        tile += tiles;
    }
    qsort(tp, (size_t)n, sizeof *tp, by_last_pos_desc);
    for (int i = 0; i < n; i++) {
        pairs[2 * i] = tp[i].tile[0];
        pairs[2 * i + 1] = tp[i].tile[1];
    }
    free(tp);
    return 0;
}

int ar_mla_decode_runs(int R, const int *qsl, const unsigned char *is_dec, int max_runs, int *rows, int *num_runs)
{
    int n = 0;
    for (int r = 0; r < R; r++) {
        const int t0 = qsl[r], t1 = qsl[r + 1];
        if (!is_dec[r] || t1 <= t0) continue;
        if (n > 0 && rows[2 * n - 1] == t0) {
            rows[2 * n - 1] = t1;
        } else if (n < max_runs) {
            rows[2 * n] = t0;
            rows[2 * n + 1] = t1;
            n++;
        } else {   /* one span from the first run's start to the step's last token */
            rows[1] = qsl[R];
            *num_runs = 1;
            return 1;
        }
    }
    *num_runs = n;
    return 0;
}
