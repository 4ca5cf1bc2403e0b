/* item_order.c - sections of (request, KV head) groups that fit in the L2, and the longest-first
 * order within them, for the wgmma prefill kernel's item queue (item_order.h says why). */
#include "item_order.h"

#include <stdlib.h>

typedef struct group_info {
    int64_t work;      /* sum over its items of tiles + 1 */
    int longest;       /* its longest item's tiles */
    int present;       /* it has an item */
    int section;
} group_info;

typedef struct sort_key {
    int section;
    ar_order_item item;
    int64_t index;
} sort_key;

typedef struct group_rank {
    int longest;
    int index;         /* req x num_kv_heads + kv_head */
} group_rank;

/* groups by longest item, longest first, then by request and KV head */
static int cmp_group(const void *pa, const void *pb)
{
    const group_rank *a = (const group_rank *)pa, *b = (const group_rank *)pb;
    if (a->longest != b->longest) return a->longest > b->longest ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

static int cmp_key(const void *pa, const void *pb)
{
    const sort_key *ka = (const sort_key *)pa, *kb = (const sort_key *)pb;
    const ar_order_item *a = &ka->item, *b = &kb->item;
    if (ka->section != kb->section) return ka->section < kb->section ? -1 : 1;
    if (a->tiles != b->tiles) return a->tiles > b->tiles ? -1 : 1;
    if (a->req != b->req) return a->req < b->req ? -1 : 1;
    if (a->kv_head != b->kv_head) return a->kv_head < b->kv_head ? -1 : 1;
    if (a->pair0 != b->pair0) return a->pair0 < b->pair0 ? -1 : 1;
    if (a->tile_begin != b->tile_begin) return a->tile_begin < b->tile_begin ? -1 : 1;
    return ka->index < kb->index ? -1 : ka->index > kb->index;
}

int ar_item_order(const ar_order_item *items, int64_t n, const int64_t *group_bytes, int num_reqs, int num_kv_heads,
                  int64_t section_bytes, int ctas, int64_t *order)
{
    if (n < 0 || num_reqs < 0 || num_kv_heads <= 0 || ctas <= 0 || (n > 0 && (!items || !order || !group_bytes)))
        return -1;
    if (n == 0) return 0;
    const int64_t num_groups = (int64_t)num_reqs * num_kv_heads;
    for (int64_t i = 0; i < n; i++)
        if (items[i].req < 0 || items[i].req >= num_reqs || items[i].kv_head < 0 || items[i].kv_head >= num_kv_heads ||
            items[i].tiles < 0)
            return -1;
    group_info *groups = (group_info *)calloc((size_t)num_groups, sizeof *groups);
    group_rank *by_length = (group_rank *)malloc((size_t)num_groups * sizeof *by_length);
    sort_key *keys = (sort_key *)malloc((size_t)n * sizeof *keys);
    if (!groups || !by_length || !keys) {
        free(groups);
        free(by_length);
        free(keys);
        return -2;
    }
    for (int64_t i = 0; i < n; i++) {
        group_info *g = &groups[(int64_t)items[i].req * num_kv_heads + items[i].kv_head];
        g->present = 1;
        g->work += (int64_t)items[i].tiles + 1;
        if (items[i].tiles > g->longest) g->longest = items[i].tiles;
    }
    int used = 0;
    for (int64_t gi = 0; gi < num_groups; gi++)
        if (groups[gi].present) {
            by_length[used].longest = groups[gi].longest;
            by_length[used++].index = (int)gi;
        }
    qsort(by_length, (size_t)used, sizeof *by_length, cmp_group);

    /* deal the groups into sections of at most section_bytes (a group alone may exceed it) */
    int sections = 0;
    int64_t bytes = 0;
    for (int k = 0; k < used; k++) {
        group_info *g = &groups[by_length[k].index];
        const int64_t gb = group_bytes[by_length[k].index / num_kv_heads];
        if (k == 0 || (section_bytes > 0 && bytes + gb > section_bytes)) {
            sections++;
            bytes = 0;
        }
        bytes += gb;
        g->section = sections - 1;
    }
    /* merge the last sections until the tail holds TAIL_FACTOR x its longest item per CTA
     * (groups[] of one section are consecutive in by_length, so k walks them back to front) */
    int tail = sections - 1;
    int64_t tail_work = 0;
    int tail_longest = 0, k = used - 1;
    for (;;) {
        for (; k >= 0 && groups[by_length[k].index].section == tail; k--) {
            const group_info *g = &groups[by_length[k].index];
            tail_work += g->work;
            if (g->longest > tail_longest) tail_longest = g->longest;
        }
        if (tail == 0 || tail_work >= (int64_t)AR_ITEM_ORDER_TAIL_FACTOR * ctas * ((int64_t)tail_longest + 1)) break;
        tail--;
    }
    for (k = 0; k < used; k++)
        if (groups[by_length[k].index].section > tail) groups[by_length[k].index].section = tail;

    for (int64_t i = 0; i < n; i++) {
        keys[i].section = groups[(int64_t)items[i].req * num_kv_heads + items[i].kv_head].section;
        keys[i].item = items[i];
        keys[i].index = i;
    }
    qsort(keys, (size_t)n, sizeof *keys, cmp_key);
    for (int64_t i = 0; i < n; i++) order[i] = keys[i].index;
    free(groups);
    free(by_length);
    free(keys);
    return tail + 1;
}
