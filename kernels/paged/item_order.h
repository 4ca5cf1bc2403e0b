/* item_order.h - the order in which the wgmma prefill kernel's CTAs take their work items
 * (PREFILL_WG, kernels/paged/cuda_attn_wgmma.cuh: each CTA takes its next item from a queue
 * when it is free, so this order is the order of the items' starts).
 *
 * The items of one group - a (request, KV head) pair - read the same keys: a request's Q tiles
 * of one KV head all walk its K/V from the first tile.  Ordered longest first over the whole
 * launch, the items running at one time come from many groups (bench_cuda's varlen batch of 16
 * requests x 16 heads on 132 CTAs: up to 102 MiB of K/V in flight against the H200's 50 MB L2,
 * tests/test_item_order.c's count), and each key tile is read from DRAM again by most items
 * (ncu, 2026-12-03: 782 MB read for 142 MB of K/V, an L2 hit rate of 31%; sectioned: 235 MB,
 * 67%).  So the groups are dealt into sections whose K/V
 * fit in a share of the L2, the groups of the longest items first, and the items run section
 * after section, longest first within each.  A section's items of one group then run side by
 * side and share their keys through the L2.
 *
 * The last section sets how evenly the CTAs finish: when its longest item is long against its
 * work per CTA, the CTAs that take those items finish late.  So the last sections are merged
 * (from the end) until the merged tail holds at least TAIL_FACTOR times its longest item of
 * work per CTA, an item costing its key tiles plus one for its start-up.  Plain C, host only;
 * tests/test_item_order.c checks it. */
#ifndef AR_ITEM_ORDER_H
#define AR_ITEM_ORDER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AR_ITEM_ORDER_TAIL_FACTOR 1

/* The wgmma prefill kernel's default section, in MiB (cuda_backend.cu; AR_CUDA_WG_SECTION_MB
 * changes it).  A third of the L2 (16.7 MiB on the H100 and H200) until 2026-12-07; 8 MiB then
 * ran the hd 256 prefill 2.7% and the varlen batch 1-2% faster on an H100, the others level
 * (BENCHMARKS.md, "The item queue's sections at 8 MiB"). */
#define AR_ITEM_ORDER_SECTION_MB 8

typedef struct ar_order_item {
    int req, kv_head;   /* the group: 0 <= req < num_reqs, 0 <= kv_head < num_kv_heads */
    int tiles;          /* key tiles the item walks (its cost, less the start-up) */
    int pair0;          /* first row pair, then first tile: ties broken by these, so the order */
    int tile_begin;     /* is the same on every run */
} ar_order_item;

/* Writes to order[0 .. n-1] the indices of items[] in the order the CTAs should take them.
 * group_bytes[req]: the K/V bytes one KV head of request req reads (its keys x head size x 2
 * sides x element bytes).  section_bytes <= 0: one section (longest first over the launch).
 * ctas: the CTAs of the launch.  Returns the number of sections (after the tail merge; 0 when
 * n is 0), -1 on a bad argument, -2 out of memory. */
int ar_item_order(const ar_order_item *items, int64_t n, const int64_t *group_bytes, int num_reqs, int num_kv_heads,
                  int64_t section_bytes, int ctas, int64_t *order);

#ifdef __cplusplus
}
#endif

#endif
