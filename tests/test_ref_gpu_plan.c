/* test_ref_gpu_plan.c - the host-side planning of the device reference (reference/ref_gpu_plan.h):
 * the block cache (hits, stale-first then most-recent eviction, pinned slots never evicted, a
 * cyclic sweep larger than the cache still hitting, agreement with a plain model over a long
 * random run) and the step plan (chunk order, row blocks and groups within the
 * budgets, shared blocks made once, every item's slots holding its blocks' keys when its group
 * runs, hits across steps, a clear error when one chunk cannot fit), and each group's distinct
 * slots for a cache whose slots hold every layer of a block. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "../reference/datagen.h"
#include "../reference/ref_gpu_plan.h"

static void test_cache_hits_and_eviction(void **state)
{
    (void)state;
    ar_block_cache *c = ar_block_cache_new(3);
    assert_non_null(c);
    bool miss = false;
    int a = ar_block_cache_acquire(c, 0, 100, 1, 0, &miss);
    assert_true(miss);
    int b = ar_block_cache_acquire(c, 0, 200, 1, 0, &miss);
    assert_true(miss);
    int d = ar_block_cache_acquire(c, 1, 100, 1, 0, &miss);   /* same key, other layer: its own slot */
    assert_true(miss);
    assert_int_not_equal(a, d);
    assert_int_equal(ar_block_cache_size(c), 3);
    assert_int_equal(ar_block_cache_acquire(c, 0, 100, 2, 0, &miss), a);   /* hit, now most recent */
    assert_false(miss);
    /* full, nothing stale (all used this step): the most recently used unpinned slot goes (d),
     * not the least recent (b), so a cyclic sweep keeps most of what it had */
    int e = ar_block_cache_acquire(c, 0, 300, 2, 0, &miss);
    assert_true(miss);
    assert_int_equal(e, d);
    assert_int_equal(ar_block_cache_find(c, 1, 100), -1);
    assert_int_equal(ar_block_cache_find(c, 0, 200), b);
    /* two steps later b (last used at step 0) is stale: the least recent stale slot goes */
    int f = ar_block_cache_acquire(c, 0, 400, 3, 2, &miss);
    assert_true(miss);
    assert_int_equal(f, b);
    assert_int_equal(ar_block_cache_find(c, 0, 200), -1);
    assert_int_equal(ar_block_cache_find(c, 0, 300), e);
    /* stamp 4 pins all three; a fourth key cannot get a slot and nothing changes */
    ar_block_cache_acquire(c, 0, 100, 4, 2, &miss);
    ar_block_cache_acquire(c, 0, 300, 4, 2, &miss);
    ar_block_cache_acquire(c, 0, 400, 4, 2, &miss);
    assert_true(ar_block_cache_pinned(c, a, 4));
    assert_false(ar_block_cache_pinned(c, a, 3));
    assert_int_equal(ar_block_cache_acquire(c, 0, 500, 4, 9, &miss), -1);
    assert_int_equal(ar_block_cache_find(c, 0, 100), a);
    assert_int_equal(ar_block_cache_size(c), 3);
    ar_block_cache_clear(c);
    assert_int_equal(ar_block_cache_size(c), 0);
    assert_int_equal(ar_block_cache_find(c, 0, 100), -1);
    ar_block_cache_free(c);
}

/* A sweep over more blocks than the cache holds, in the same order every step (layers x blocks),
 * keeps hitting on about capacity blocks per sweep. */
static void test_cache_cyclic_sweep_keeps_hitting(void **state)
{
    (void)state;
    enum { CAP = 100, BLOCKS = 250, STEPS = 6 };
    ar_block_cache *c = ar_block_cache_new(CAP);
    uint64_t stamp = 0;
    int hits = 0;
    for (int step = 0; step < STEPS; step++)
        for (int layer = 0; layer < 5; layer++) {
            stamp++;   /* one group per layer */
            for (int k = 0; k < BLOCKS / 5; k++) {
                bool miss;
                assert_true(ar_block_cache_acquire(c, layer, (uint64_t)k, stamp, step, &miss) >= 0);
                if (!miss && step == STEPS - 1) hits++;
            }
        }
    print_message("cyclic sweep of %d blocks through %d slots: %d hits in the last step\n", BLOCKS, CAP, hits);
    assert_true(hits >= CAP * 8 / 10);
    ar_block_cache_free(c);
}

/* A plain model of the cache: slot -> (layer, key, last use, stamp, epoch), linear scans. */
typedef struct model_slot {
    bool used;
    int layer;
    uint64_t key, stamp;
    long last;
    int64_t epoch;
} model_slot;

static void test_cache_matches_a_plain_model(void **state)
{
    (void)state;
    enum { CAP = 37, OPS = 20000 };
    ar_block_cache *c = ar_block_cache_new(CAP);
    assert_non_null(c);
    model_slot m[CAP];
    memset(m, 0, sizeof m);
    uint64_t rng = 12345, stamp = 1;
    for (long op = 0; op < OPS; op++) {
        rng = ar_mix64(rng + 1);
        if (rng % 7 == 0) stamp++;
        const int64_t epoch = op / 300;
        int layer = (int)(rng >> 8) % 3;
        uint64_t key = (rng >> 16) % 60;   /* keys collide in the hash table's home positions too */
        /* the model's answer */
        int want = -1;
        bool want_miss = true;
        for (int s = 0; s < CAP; s++)
            if (m[s].used && m[s].layer == layer && m[s].key == key) {
                want = s;
                want_miss = false;
            }
        bool all_pinned = false;
        if (want < 0) {
            int victim = -1;
            for (int s = 0; s < CAP && victim < 0; s++)
                if (!m[s].used) victim = s;
            if (victim < 0) {
                int lru = 0, mru_unpinned = -1;
                for (int s = 1; s < CAP; s++)
                    if (m[s].last < m[lru].last) lru = s;
                for (int s = 0; s < CAP; s++)
                    if (m[s].stamp != stamp && (mru_unpinned < 0 || m[s].last > m[mru_unpinned].last)) mru_unpinned = s;
                if (m[lru].stamp == stamp) all_pinned = true;
                else victim = m[lru].epoch < epoch - 1 ? lru : mru_unpinned;
            }
            want = victim;
        }
        bool miss = false;
        int got = ar_block_cache_acquire(c, layer, key, stamp, epoch, &miss);
        if (all_pinned) {
            assert_int_equal(got, -1);
            continue;
        }
        if (!want_miss) assert_int_equal(got, want);
        assert_true(got >= 0);
        assert_int_equal(miss, want_miss);
        if (want_miss) {
            /* free slots may be handed out in any order: the model follows the cache's choice,
             * but an eviction must take the model's victim */
            if (m[want].used) assert_int_equal(got, want);
            else assert_false(m[got].used);
            want = got;
        }
        m[want] = (model_slot){true, layer, key, stamp, op, epoch};
        for (int s = 0; s < CAP; s++)
            if (m[s].used) assert_int_equal(ar_block_cache_find(c, m[s].layer, m[s].key), s);
    }
    ar_block_cache_free(c);
}

/* Requests whose block keys are given per request: shared prefixes share keys. */
typedef struct plan_case {
    int num_reqs;
    ar_ref_plan_req reqs[8];
    uint64_t keys[8][1300];
} plan_case;

static void make_case(plan_case *pc, int n, const int *nrows, const int *kmax, int shared_blocks)
{
    memset(pc, 0, sizeof *pc);
    pc->num_reqs = n;
    int row = 0;
    for (int r = 0; r < n; r++) {
        for (int i = 0; i < 1300; i++) pc->keys[r][i] = i < shared_blocks ? 1000 + (uint64_t)i : (uint64_t)(r + 1) * 100000 + (uint64_t)i;
        pc->reqs[r] = (ar_ref_plan_req){row, nrows[r], 0, kmax[r], pc->keys[r]};
        row += nrows[r];
    }
}

/* Replays the plan's groups against a slot -> key table: every item's slots must hold its
 * blocks' keys when its group runs (misses fill first), and a slot filled in this group must not
 * have been filled twice in it. */
static void check_plan_consistent(const ar_ref_plan *pl, const plan_case *pc, int block_size, uint64_t *slot_key,
                                  int capacity)
{
    for (int g = 0; g < pl->num_groups; g++) {
        const ar_ref_group *gr = &pl->groups[g];
        char *filled = calloc((size_t)capacity, 1);
        assert_non_null(filled);
        for (int i = gr->miss0; i < gr->miss0 + gr->nmiss; i++) {
            int s = pl->miss_slot[i];
            assert_true(s >= 0 && s < capacity);
            assert_false(filled[s]);
            filled[s] = 1;
            slot_key[s] = pl->miss_key[i];
        }
        free(filled);
        for (int i = gr->item0; i < gr->item0 + gr->nitems; i++) {
            const ar_ref_item *it = &pl->items[i];
            assert_int_equal(it->chunk, pl->items[gr->item0].chunk);   /* one chunk per group */
            for (int j = 0; j < it->nblocks; j++)
                assert_int_equal(slot_key[pl->slot_map[it->map0 + j]], pc->keys[it->r][it->k0 / block_size + j]);
        }
    }
}

static void test_plan_chunks_groups_and_sharing(void **state)
{
    (void)state;
    static plan_case pc;
    const int nrows[3] = {5, 1, 40}, kmax[3] = {20000, 300, 9000};
    make_case(&pc, 3, nrows, kmax, 4);
    ar_block_cache *c = ar_block_cache_new(4000);
    assert_non_null(c);
    static uint64_t slot_key[4000];
    ar_ref_plan pl;
    memset(&pl, 0, sizeof pl);
    uint64_t stamp = 0;
    char err[256];
    /* large budgets: one group per key chunk (a group never holds two chunks of a row: their
     * folds would race in one launch) */
    ar_ref_budget big = {8192, 16, 8, (int64_t)1 << 40, (int64_t)1 << 30};
    assert_int_equal(ar_ref_plan_build(&pl, c, 0, 0, &stamp, 3, pc.reqs, &big, err, sizeof err), 0);
    assert_int_equal(pl.max_chunks, 3);   /* 20000 keys: chunks of 8192 */
    assert_int_equal(pl.num_groups, 3);
    /* chunk order: every chunk-0 item first */
    int last_chunk = 0;
    for (int i = 0; i < pl.num_items; i++) {
        assert_true(pl.items[i].chunk >= last_chunk);
        last_chunk = pl.items[i].chunk;
        assert_int_equal(pl.items[i].k0, pl.items[i].chunk * 8192);
    }
    /* shared blocks 0..3 made once; every other block of every chunk once */
    int want_blocks = 4 + (1250 - 4) + (19 - 4) + (563 - 4);
    assert_int_equal(pl.num_miss, want_blocks);
    check_plan_consistent(&pl, &pc, 16, slot_key, 4000);
    /* the same step again: everything hits */
    assert_int_equal(ar_ref_plan_build(&pl, c, 0, 0, &stamp, 3, pc.reqs, &big, err, sizeof err), 0);
    assert_int_equal(pl.num_miss, 0);
    check_plan_consistent(&pl, &pc, 16, slot_key, 4000);
    /* another layer: its own blocks */
    assert_int_equal(ar_ref_plan_build(&pl, c, 1, 0, &stamp, 3, pc.reqs, &big, err, sizeof err), 0);
    assert_int_equal(pl.num_miss, want_blocks);

    /* small score budget: rows split into items, items into groups, all within the budget */
    ar_block_cache *c2 = ar_block_cache_new(4000);
    ar_ref_budget tight = {8192, 16, 8, 8 * 8192 * 3, 100};
    assert_int_equal(ar_ref_plan_build(&pl, c2, 0, 0, &stamp, 3, pc.reqs, &tight, err, sizeof err), 0);
    assert_true(pl.num_groups > 3);
    int rows_seen[3][3] = {{0}};
    for (int g = 0; g < pl.num_groups; g++) {
        const ar_ref_group *gr = &pl.groups[g];
        assert_true(gr->nitems == 1 || (gr->scores <= tight.max_scores && gr->vectors <= tight.max_vectors));
        for (int i = gr->item0; i < gr->item0 + gr->nitems; i++) rows_seen[pl.items[i].r][pl.items[i].chunk] += pl.items[i].nrows;
    }
    /* every checked row of every request in each chunk it has */
    for (int r = 0; r < 3; r++)
        for (int ch = 0; ch < 3; ch++) {
            bool has = ch * 8192 < kmax[r];
            assert_int_equal(rows_seen[r][ch], has ? nrows[r] : 0);
        }
    check_plan_consistent(&pl, &pc, 16, slot_key, 4000);

    /* a cache smaller than the step: groups split on capacity, items still consistent */
    ar_block_cache *c3 = ar_block_cache_new(600);
    static uint64_t slot_key3[600];
    assert_int_equal(ar_ref_plan_build(&pl, c3, 0, 0, &stamp, 3, pc.reqs, &big, err, sizeof err), 0);
    assert_true(pl.num_groups >= 3);
    check_plan_consistent(&pl, &pc, 16, slot_key3, 600);

    /* a cache that cannot hold one chunk of keys: a clear error */
    ar_block_cache *c4 = ar_block_cache_new(100);
    assert_int_equal(ar_ref_plan_build(&pl, c4, 0, 0, &stamp, 3, pc.reqs, &big, err, sizeof err), -1);
    assert_non_null(strstr(err, "cache"));

    ar_ref_plan_free(&pl);
    ar_block_cache_free(c);
    ar_block_cache_free(c2);
    ar_block_cache_free(c3);
    ar_block_cache_free(c4);
}

/* Each group's distinct slots (for a cache whose slots hold every layer): every slot its items
 * read exactly once, in first-use order, with the content key its items expect there, its misses
 * among them; the same list again on a later call. */
static void test_group_slots_distinct_and_complete(void **state)
{
    (void)state;
    static plan_case pc;
    const int nrows[4] = {5, 1, 40, 2}, kmax[4] = {20000, 300, 9000, 4000};
    make_case(&pc, 4, nrows, kmax, 30);   /* 30 shared prefix blocks: one slot, several items */
    for (int cap_i = 0; cap_i < 2; cap_i++) {
        const int capacity = cap_i ? 700 : 4000;   /* 700: groups split on the cache, slots reused */
        ar_block_cache *c = ar_block_cache_new(capacity);
        assert_non_null(c);
        ar_ref_plan pl;
        memset(&pl, 0, sizeof pl);
        uint64_t stamp = 0;
        char err[256];
        ar_ref_budget bud = {8192, 16, 8, 8 * 8192 * 3, 1000};
        assert_int_equal(ar_ref_plan_build(&pl, c, 0, 0, &stamp, 4, pc.reqs, &bud, err, sizeof err), 0);
        int *seen = calloc((size_t)capacity, sizeof(int)), serial = 0;
        int *slots = malloc(sizeof(int) * (size_t)pl.num_map), *again = malloc(sizeof(int) * (size_t)pl.num_map);
        uint64_t *keys = malloc(sizeof(uint64_t) * (size_t)pl.num_map), *keys2 = malloc(sizeof(uint64_t) * (size_t)pl.num_map);
        int *pos = malloc(sizeof(int) * (size_t)capacity);
        assert_true(seen && slots && again && keys && keys2 && pos);
        int shared_groups = 0;
        for (int g = 0; g < pl.num_groups; g++) {
            const ar_ref_group *gr = &pl.groups[g];
            int n = ar_ref_plan_group_slots(&pl, g, pc.reqs, 16, seen, &serial, slots, keys);
            for (int s = 0; s < capacity; s++) pos[s] = -1;
            for (int i = 0; i < n; i++) {
                assert_true(slots[i] >= 0 && slots[i] < capacity);
                assert_int_equal(pos[slots[i]], -1);   /* once */
                pos[slots[i]] = i;
            }
            int refs = 0, last_first = -1;
            for (int i = gr->item0; i < gr->item0 + gr->nitems; i++) {
                const ar_ref_item *it = &pl.items[i];
                for (int j = 0; j < it->nblocks; j++) {
                    int s = pl.slot_map[it->map0 + j];
                    assert_true(pos[s] >= 0);   /* complete */
                    assert_int_equal(keys[pos[s]], pc.keys[it->r][it->k0 / 16 + j]);
                    if (pos[s] > last_first) {   /* first uses come in list order */
                        assert_int_equal(pos[s], last_first + 1);
                        last_first = pos[s];
                    }
                    refs++;
                }
            }
            assert_int_equal(last_first + 1, n);
            if (refs > n) shared_groups++;
            for (int i = gr->miss0; i < gr->miss0 + gr->nmiss; i++) assert_true(pos[pl.miss_slot[i]] >= 0);
            assert_int_equal(ar_ref_plan_group_slots(&pl, g, pc.reqs, 16, seen, &serial, again, keys2), n);
            assert_memory_equal(again, slots, sizeof(int) * (size_t)n);
            assert_memory_equal(keys2, keys, sizeof(uint64_t) * (size_t)n);
        }
        assert_true(shared_groups > 0);   /* some group lists a shared slot once for several items */
        assert_int_equal(serial, 2 * pl.num_groups);
        free(seen);
        free(slots);
        free(again);
        free(keys);
        free(keys2);
        free(pos);
        ar_ref_plan_free(&pl);
        ar_block_cache_free(c);
    }
}

/* A request whose checked rows see no key (kmax <= kmin) gets no item; windows start chunks at kmin. */
static void test_plan_window_start_and_empty(void **state)
{
    (void)state;
    static plan_case pc;
    const int nrows[2] = {2, 3}, kmax[2] = {0, 9000};
    make_case(&pc, 2, nrows, kmax, 0);
    pc.reqs[1].kmin = 1000;
    ar_block_cache *c = ar_block_cache_new(2000);
    static uint64_t slot_key[2000];
    ar_ref_plan pl;
    memset(&pl, 0, sizeof pl);
    uint64_t stamp = 7;
    char err[256];
    ar_ref_budget big = {8192, 16, 4, (int64_t)1 << 40, (int64_t)1 << 30};
    assert_int_equal(ar_ref_plan_build(&pl, c, 3, 0, &stamp, 2, pc.reqs, &big, err, sizeof err), 0);
    assert_int_equal(pl.num_items, 1);
    assert_int_equal(pl.items[0].r, 1);
    assert_int_equal(pl.items[0].k0, 1000);
    assert_int_equal(pl.items[0].nkeys, 8000);
    assert_int_equal(pl.items[0].nblocks, (8999 / 16) - (1000 / 16) + 1);
    assert_int_equal(stamp, 8);
    check_plan_consistent(&pl, &pc, 16, slot_key, 2000);
    ar_ref_plan_free(&pl);
    ar_block_cache_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_hits_and_eviction),
        cmocka_unit_test(test_cache_cyclic_sweep_keeps_hitting),
        cmocka_unit_test(test_cache_matches_a_plain_model),
        cmocka_unit_test(test_plan_chunks_groups_and_sharing),
        cmocka_unit_test(test_plan_window_start_and_empty),
        cmocka_unit_test(test_group_slots_distinct_and_complete),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
