/* ref_gpu_plan.c - the block cache and the step-layer plan of the device reference (see
 * ref_gpu_plan.h).
 *
 * The cache is an open-addressing hash table (linear probing, backward-shift deletion) from
 * (layer, content key) to slot, beside a doubly linked recency list over the slots in use.  A
 * slot touched by the group being planned carries that group's stamp and moves to the most
 * recent end, so the pinned slots are always a suffix of the list: when the least recent slot is
 * pinned, all are; and the slot just before that suffix (unpinned_tail, kept up to date as slots
 * move) is the most recently used unpinned one. */
#include "ref_gpu_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datagen.h"

/* One slot's bookkeeping, kept together so that a touch reads and writes one cache line. */
typedef struct cache_slot {
    uint64_t key;
    uint64_t stamp;           /* the group that pinned it last */
    int64_t epoch;            /* the step that used it last */
    int layer;
    int prev, next;           /* recency links, -1 = none */
} cache_slot;

struct ar_block_cache {
    int capacity, size;
    cache_slot *slot;         /* [capacity] */
    int lru, mru;             /* least / most recently used slot in use, -1 = none */
    int *free_slots;          /* [capacity] stack */
    int num_free;
    uint64_t cur_stamp;       /* the stamp unpinned_tail and num_pinned refer to */
    int unpinned_tail;        /* the most recently used slot not pinned by cur_stamp, -1 = none */
    int num_pinned;           /* slots pinned by cur_stamp */
    int *table;               /* [table_size] slot or -1 */
    unsigned table_mask;
};

static unsigned hash_of(const ar_block_cache *c, int layer, uint64_t key)
{
    return (unsigned)(ar_mix64(key ^ ((uint64_t)(uint32_t)layer * AR_GEN_GOLDEN)) & c->table_mask);
}

ar_block_cache *ar_block_cache_new(int capacity)
{
    if (capacity < 1) capacity = 1;
    ar_block_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    unsigned size = 16;
    while (size < 2u * (unsigned)capacity) size <<= 1;
    c->capacity = capacity;
    c->slot = malloc(sizeof *c->slot * (size_t)capacity);
    c->free_slots = malloc(sizeof(int) * (size_t)capacity);
    c->table = malloc(sizeof(int) * (size_t)size);
    c->table_mask = size - 1;
    if (!c->slot || !c->free_slots || !c->table) {
        ar_block_cache_free(c);
        return NULL;
    }
    ar_block_cache_clear(c);
    return c;
}

void ar_block_cache_free(ar_block_cache *c)
{
    if (!c) return;
    free(c->slot);
    free(c->free_slots);
    free(c->table);
    free(c);
}

void ar_block_cache_clear(ar_block_cache *c)
{
    c->size = 0;
    c->lru = c->mru = -1;
    c->cur_stamp = 0;
    c->unpinned_tail = -1;
    c->num_pinned = 0;
    /* free stack popped from the end: slot 0 first */
    c->num_free = c->capacity;
    for (int i = 0; i < c->capacity; i++) {
        c->free_slots[i] = c->capacity - 1 - i;
        c->slot[i].stamp = 0;
        c->slot[i].prev = c->slot[i].next = -1;
    }
    for (unsigned i = 0; i <= c->table_mask; i++) c->table[i] = -1;
}

int ar_block_cache_capacity(const ar_block_cache *c) { return c->capacity; }
int ar_block_cache_size(const ar_block_cache *c) { return c->size; }

/* Table position of (layer, key), or of the empty entry that ends its probe run. */
static unsigned probe(const ar_block_cache *c, int layer, uint64_t key)
{
    unsigned i = hash_of(c, layer, key);
    for (;;) {
        int s = c->table[i];
        if (s < 0 || (c->slot[s].key == key && c->slot[s].layer == layer)) return i;
        i = (i + 1) & c->table_mask;
    }
}

int ar_block_cache_find(const ar_block_cache *c, int layer, uint64_t key)
{
    return c->table[probe(c, layer, key)];
}

int ar_block_cache_pinned_count(const ar_block_cache *c, uint64_t stamp)
{
    return stamp == c->cur_stamp ? c->num_pinned : 0;
}

bool ar_block_cache_pinned(const ar_block_cache *c, int slot, uint64_t stamp)
{
    return slot >= 0 && slot < c->capacity && c->slot[slot].stamp == stamp;
}

static void unlink_slot(ar_block_cache *c, int s)
{
    cache_slot *x = &c->slot[s];
    if (x->prev >= 0) c->slot[x->prev].next = x->next;
    else c->lru = x->next;
    if (x->next >= 0) c->slot[x->next].prev = x->prev;
    else c->mru = x->prev;
    x->prev = x->next = -1;
}

static void link_mru(ar_block_cache *c, int s)
{
    c->slot[s].prev = c->mru;
    c->slot[s].next = -1;
    if (c->mru >= 0) c->slot[c->mru].next = s;
    else c->lru = s;
    c->mru = s;
}

/* Removes table entry i and shifts the rest of its probe run back (no tombstones). */
static void table_delete(ar_block_cache *c, unsigned i)
{
    unsigned hole = i;
    c->table[hole] = -1;
    for (unsigned j = (hole + 1) & c->table_mask; c->table[j] >= 0; j = (j + 1) & c->table_mask) {
        int s = c->table[j];
        unsigned home = hash_of(c, c->slot[s].layer, c->slot[s].key);
        /* s may move into the hole when the hole lies on its probe path: home .. j (cyclic) */
        bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            c->table[hole] = s;
            c->table[j] = -1;
            hole = j;
        }
    }
}

/* Unlinks s, keeping unpinned_tail on the most recent unpinned slot. */
static void take_out(ar_block_cache *c, int s)
{
    if (s == c->unpinned_tail) c->unpinned_tail = c->slot[s].prev;
    unlink_slot(c, s);
}

int ar_block_cache_acquire(ar_block_cache *c, int layer, uint64_t key, uint64_t stamp, int64_t epoch, bool *miss)
{
    if (stamp != c->cur_stamp) {   /* a new group: nothing is pinned by it yet */
        c->cur_stamp = stamp;
        c->unpinned_tail = c->mru;
        c->num_pinned = 0;
    }
    unsigned at = probe(c, layer, key);
    int s = c->table[at];
    if (s >= 0) {
        cache_slot *x = &c->slot[s];
        if (x->stamp != stamp) c->num_pinned++;
        if (s != c->mru) {
            if (x->stamp != stamp) take_out(c, s);
            else unlink_slot(c, s);
            link_mru(c, s);
        } else if (s == c->unpinned_tail) {
            c->unpinned_tail = x->prev;
        }
        x->stamp = stamp;
        x->epoch = epoch;
        *miss = false;
        return s;
    }
    if (c->num_free > 0) {
        s = c->free_slots[--c->num_free];
        c->size++;
    } else {
        s = c->lru;
        if (s < 0 || c->slot[s].stamp == stamp) return -1;   /* everything is pinned */
        if (!(c->slot[s].epoch < epoch - 1)) s = c->unpinned_tail;   /* nothing stale: the most recent */
        if (s < 0) return -1;
        table_delete(c, probe(c, c->slot[s].layer, c->slot[s].key));
        take_out(c, s);
        at = probe(c, layer, key);   /* the deletion may have moved entries */
    }
    cache_slot *x = &c->slot[s];
    x->layer = layer;
    x->key = key;
    x->stamp = stamp;
    x->epoch = epoch;
    c->table[at] = s;
    link_mru(c, s);
    c->num_pinned++;
    *miss = true;
    return s;
}

/* ---- the plan ------------------------------------------------------------------------------ */

/* Makes *arr (elements of `size` bytes, capacity *cap) hold at least need; 0 or -1. */
static int grow(void **arr, int *cap, int need, size_t size)
{
    if (need <= *cap) return 0;
    int c = *cap > 0 ? *cap : 64;
    while (c < need) c *= 2;
    void *p = realloc(*arr, (size_t)c * size);
    if (!p) return -1;
    *arr = p;
    *cap = c;
    return 0;
}

void ar_ref_plan_free(ar_ref_plan *pl)
{
    free(pl->items);
    free(pl->groups);
    free(pl->slot_map);
    free(pl->miss_slot);
    free(pl->miss_key);
    memset(pl, 0, sizeof *pl);
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Appends the items of every request's chunk c, in request order; returns how many. */
static int add_chunk_items(ar_ref_plan *pl, int c, int num_reqs, const ar_ref_plan_req *reqs,
                           const ar_ref_budget *bud)
{
    int added = 0;
    for (int r = 0; r < num_reqs; r++) {
        const ar_ref_plan_req *q = &reqs[r];
        int64_t k0 = (int64_t)q->kmin + (int64_t)c * bud->chunk_keys;
        if (q->nrows <= 0 || k0 >= q->kmax) continue;
        int nkeys = (int)min64(bud->chunk_keys, q->kmax - k0);
        /* rows per item: the item alone must fit both scratch budgets */
        int64_t cap = min64(bud->max_scores / ((int64_t)bud->heads * nkeys), bud->max_vectors / bud->heads);
        if (cap < 1) cap = 1;
        for (int i = 0; i < q->nrows; i += (int)min64(cap, q->nrows - i)) {
            if (grow((void **)&pl->items, &pl->cap_items, pl->num_items + 1, sizeof *pl->items)) return -1;
            ar_ref_item *it = &pl->items[pl->num_items++];
            memset(it, 0, sizeof *it);
            it->r = r;
            it->row0 = q->row0 + i;
            it->nrows = (int)min64(cap, q->nrows - i);
            it->chunk = c;
            it->k0 = (int)k0;
            it->nkeys = nkeys;
            it->nblocks = (int)((k0 + nkeys - 1) / bud->block_size - k0 / bud->block_size + 1);
            added++;
        }
    }
    return added;
}

int ar_ref_plan_build(ar_ref_plan *pl, ar_block_cache *cache, int layer, int64_t epoch, uint64_t *stamp,
                      int num_reqs, const ar_ref_plan_req *reqs, const ar_ref_budget *bud,
                      char *err, size_t err_len)
{
    pl->num_items = pl->num_groups = pl->num_map = pl->num_miss = 0;
    pl->max_chunks = 0;
    for (int c = 0;; c++) {
        int n = add_chunk_items(pl, c, num_reqs, reqs, bud);
        if (n < 0) goto oom;
        if (n == 0) break;
        pl->max_chunks = c + 1;
    }
    const int capacity = ar_block_cache_capacity(cache);
    ar_ref_group *g = NULL;
    for (int i = 0; i < pl->num_items; i++) {
        ar_ref_item *it = &pl->items[i];
        const ar_ref_plan_req *q = &reqs[it->r];
        const int64_t scores = (int64_t)it->nrows * bud->heads * it->nkeys;
        const int64_t vectors = (int64_t)it->nrows * bud->heads;
        const int b0 = it->k0 / bud->block_size;
        if (it->nblocks > capacity) {
            snprintf(err, err_len,
                     "device reference: one chunk of %d keys needs %d cache blocks but the block cache holds %d "
                     "(too little device memory for the verifier)", it->nkeys, it->nblocks, capacity);
            return -1;
        }
        int new_pins = 0;
        const int pinned = g ? ar_block_cache_pinned_count(cache, *stamp) : 0;
        if (g && pinned + it->nblocks > capacity) {   /* only when the cheap bound does not settle it */
            for (int j = 0; j < it->nblocks; j++) {
                int s = ar_block_cache_find(cache, layer, q->block_keys[b0 + j]);
                if (!ar_block_cache_pinned(cache, s, *stamp)) new_pins++;
            }
        }
        /* a group holds the items of one key chunk only: its fold launch then merges each row
         * at most once, after every earlier chunk's launch (two chunks of a row in one launch
         * would race on the row's running result) */
        if (!g || it->chunk != pl->items[g->item0].chunk || g->scores + scores > bud->max_scores ||
            g->vectors + vectors > bud->max_vectors || pinned + new_pins > capacity) {
            if (grow((void **)&pl->groups, &pl->cap_groups, pl->num_groups + 1, sizeof *pl->groups)) goto oom;
            g = &pl->groups[pl->num_groups++];
            memset(g, 0, sizeof *g);
            g->item0 = i;
            g->miss0 = pl->num_miss;
            (*stamp)++;
        }
        if (grow((void **)&pl->slot_map, &pl->cap_map, pl->num_map + it->nblocks, sizeof *pl->slot_map) ||
            grow((void **)&pl->miss_slot, &pl->cap_miss, pl->num_miss + it->nblocks, sizeof *pl->miss_slot))
            goto oom;
        /* miss_key grows in step with miss_slot (same capacity) */
        uint64_t *mk = realloc(pl->miss_key, sizeof(uint64_t) * (size_t)pl->cap_miss);
        if (!mk) goto oom;
        pl->miss_key = mk;
        it->map0 = pl->num_map;
        for (int j = 0; j < it->nblocks; j++) {
            uint64_t key = q->block_keys[b0 + j];
            bool miss = false;
            int s = ar_block_cache_acquire(cache, layer, key, *stamp, epoch, &miss);
            if (s < 0) {   /* cannot happen: the group was closed when the item would not fit */
                snprintf(err, err_len, "device reference: block cache full of pinned blocks (internal error)");
                return -1;
            }

            pl->slot_map[pl->num_map++] = s;
            if (miss) {
                pl->miss_slot[pl->num_miss] = s;
                pl->miss_key[pl->num_miss] = key;
                pl->num_miss++;
            }
        }
        g->nitems++;
        g->nmiss = pl->num_miss - g->miss0;
        g->scores += scores;
        g->vectors += vectors;
    }
    return 0;
oom:
    snprintf(err, err_len, "device reference: out of host memory planning a step");
    return -1;
}

int ar_ref_plan_group_slots(const ar_ref_plan *pl, int gi, const ar_ref_plan_req *reqs, int block_size, int *seen,
                            int *serial, int *slots, uint64_t *keys)
{
    const ar_ref_group *g = &pl->groups[gi];
    const int mark = ++*serial;
    int n = 0;
    for (int i = g->item0; i < g->item0 + g->nitems; i++) {
        const ar_ref_item *it = &pl->items[i];
        const uint64_t *bk = reqs[it->r].block_keys + it->k0 / block_size;
        for (int j = 0; j < it->nblocks; j++) {
            const int s = pl->slot_map[it->map0 + j];
            if (seen[s] == mark) continue;
            seen[s] = mark;
            slots[n] = s;
            keys[n++] = bk[j];
        }
    }
    return n;
}
