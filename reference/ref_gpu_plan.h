/* ref_gpu_plan.h - host-side planning of the device reference (reference/ref_gpu.cu).
 *
 * Two pieces, both plain C so that they build and are tested on every machine:
 *   - the block cache: which device slot holds the generated (MHA: K and V) or up-projected
 *     (MLA: k_nope, v and the latent) contents of one cache block, keyed by (layer, content
 *     key).  A block's contents are a pure function of (seed, layer, content key), so a slot
 *     stays valid across steps and blocks that several requests share are made once.  A slot is
 *     never reused while the group being planned uses it (it is "pinned" by that group's stamp).
 *     Otherwise the victim is the least recently used slot when it is stale (not used in this
 *     step or the one before: a finished request's block), else the most recently used unpinned
 *     slot: a run whose layers together read more blocks than the cache holds sweeps them in the
 *     same order every step, and for such a cyclic sweep evicting the most recent keeps a fixed
 *     part of it cached (hit rate about capacity / blocks swept) where least-recent eviction
 *     would miss every time;
 *   - the plan of one step-layer: the checked rows of each request are cut into items
 *     (request, block of rows, key chunk) and the items into groups that fit the device's
 *     scratch budgets and the cache.  Key chunks are AR_VERIFY_KEY_CHUNK keys from each
 *     request's first visible key, exactly the chunks the host verifier merges by LSE, and every
 *     item of chunk c comes before every item of chunk c + 1, and a group holds items of one
 *     chunk only, so the device folds each row's chunks in the host's order, one launch each. */
#ifndef AR_REF_GPU_PLAN_H
#define AR_REF_GPU_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the block cache ----------------------------------------------------------------------- */

typedef struct ar_block_cache ar_block_cache;

/* A cache of `capacity` slots (0 .. capacity - 1), all free.  NULL when out of memory. */
ar_block_cache *ar_block_cache_new(int capacity);
void ar_block_cache_free(ar_block_cache *c);
int ar_block_cache_capacity(const ar_block_cache *c);
/* Slots in use. */
int ar_block_cache_size(const ar_block_cache *c);
/* The slot holding (layer, key), or -1.  Does not change the LRU order. */
int ar_block_cache_find(const ar_block_cache *c, int layer, uint64_t key);
/* Slots pinned by stamp (0 unless stamp is the one last acquired with). */
int ar_block_cache_pinned_count(const ar_block_cache *c, uint64_t stamp);
/* True when slot is pinned by stamp (used by the group being planned). */
bool ar_block_cache_pinned(const ar_block_cache *c, int slot, uint64_t stamp);
/* The slot of (layer, key), made most recently used, pinned by stamp and marked used at epoch (the
 * step: non-decreasing).  On a miss it takes a free slot or evicts one (see above) and sets *miss
 * (the caller must fill the slot before anything reads it).  Returns -1, changing nothing, when
 * every slot is pinned by stamp. */
int ar_block_cache_acquire(ar_block_cache *c, int layer, uint64_t key, uint64_t stamp, int64_t epoch, bool *miss);
/* Forgets every entry (after a cancelled or failed step whose fills may not have run). */
void ar_block_cache_clear(ar_block_cache *c);

/* ---- the plan of one step-layer ------------------------------------------------------------ */

/* What the plan needs to know of one request. */
typedef struct ar_ref_plan_req {
    int row0, nrows;          /* its checked rows: [row0, row0 + nrows) of the step's checked-row list */
    int kmin, kmax;           /* keys [kmin, kmax) that some checked row can see (kmax <= kmin: none) */
    const uint64_t *block_keys; /* content key of logical block i (covers kmax - 1) */
} ar_ref_plan_req;

typedef struct ar_ref_budget {
    int chunk_keys;           /* keys per chunk (AR_VERIFY_KEY_CHUNK) */
    int block_size;
    int heads;                /* vectors per checked row: query heads */
    int64_t max_scores;       /* score scratch of one group: sum of rows x heads x keys */
    int64_t max_vectors;      /* per-vector scratch of one group: sum of rows x heads */
} ar_ref_budget;

/* Items are what the kernels see: request r's checked rows [row0, row0 + nrows) against keys
 * [k0, k0 + nkeys), chunk `chunk` of that request; the slots of the item's logical blocks
 * k0 / block_size .. (k0 + nkeys - 1) / block_size are slot_map[map0 ..]. */
typedef struct ar_ref_item {
    int r;
    int row0, nrows;
    int chunk;
    int k0, nkeys;
    int map0, nblocks;
} ar_ref_item;

/* A group is a run of items the device processes at once: first the blocks it misses are
 * filled (miss_slot / miss_key [miss0, miss0 + nmiss)), then attention for its items. */
typedef struct ar_ref_group {
    int item0, nitems;
    int miss0, nmiss;
    int64_t scores, vectors;
} ar_ref_group;

typedef struct ar_ref_plan {
    ar_ref_item *items;
    int num_items, cap_items;
    ar_ref_group *groups;
    int num_groups, cap_groups;
    int *slot_map;
    int num_map, cap_map;
    int *miss_slot;
    uint64_t *miss_key;
    int num_miss, cap_miss;
    int max_chunks;           /* chunks of the request with the most */
} ar_ref_plan;

/* Plans layer `layer` of step `epoch` with num_reqs requests (reqs [num_reqs]); *stamp is the
 * last group stamp used and advances by one per group (stamps must never repeat in a cache's
 * life).  Returns 0, or -1 with err set: out of memory, or one item needing more blocks than the
 * cache holds (the budget is too small for one chunk of keys). */
int ar_ref_plan_build(ar_ref_plan *pl, ar_block_cache *cache, int layer, int64_t epoch, uint64_t *stamp,
                      int num_reqs, const ar_ref_plan_req *reqs, const ar_ref_budget *bud,
                      char *err, size_t err_len);
void ar_ref_plan_free(ar_ref_plan *pl);

/* The distinct slots that the items of group gi read, in first-use order, and the content key of
 * each (reqs: the requests the plan was built from): written to slots / keys (room for the
 * group's slot_map entries), returns how many.  seen [cache capacity] and *serial are the
 * caller's scratch, zeroed before the first call and kept between calls (each call takes a new
 * serial).  For a block cache whose slots hold every layer of a block, these are the blocks
 * whose layer the device must make unless the slot holds it already. */
int ar_ref_plan_group_slots(const ar_ref_plan *pl, int gi, const ar_ref_plan_req *reqs, int block_size, int *seen,
                            int *serial, int *slots, uint64_t *keys);

#ifdef __cplusplus
}
#endif
#endif
