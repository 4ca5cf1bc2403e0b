/* attn_plan.h - the "cuda" backend's work items, and the parts of its planner that are plain
 * arithmetic: the split rules, a launch's items (a tile of query-head rows of one request and KV
 * head over the key tiles those rows see), their cut into split-KV pieces with combine groups,
 * and the DECODE_TMA launch's items (one a request, every KV head).  cuda_plan.cuh's build_plan
 * picks the kernel and the split count from the device and the environment, then calls these.
 * Plain C, host only, so that tests/test_attn_plan.c checks the items and pieces without a GPU;
 * the kernels (cuda_attn.cuh) read ar_attn_work and ar_combine_group as laid out here. */
#ifndef AR_ATTN_PLAN_H
#define AR_ATTN_PLAN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AR_MAX_SPLITS 64

/* One CTA's job.  Rows are pairs pair0 .. pair0 + ROWS - 1 of (req, kv_head). */
typedef struct ar_attn_work {
    int req;
    int kv_head;
    int pair0;
    int tile_begin, tile_end;   /* key tiles [begin, end) of BLOCK_N keys */
    int partial;                /* -1: write out/lse; else this split's partial slot */
    int partial_stride;         /* DECODE_TMA pieces (one item, every KV head): KV head h writes
                                   partial slot partial + h x partial_stride; 0 elsewhere */
} ar_attn_work;

/* One split-KV group for the combine kernel: partials first .. first + count - 1. */
typedef struct ar_combine_group {
    int req;
    int kv_head;
    int pair0;
    int first_partial;
    int count;
    int pad_[3];
} ar_combine_group;

/* A launch's query rows and keys as a kernel config tiles them.  A row is a (query token, query
 * head) pair of one KV head: pair = token x group + head within the group. */
typedef struct ar_attn_shape {
    int num_reqs;
    const int *query_start_loc;     /* [num_reqs + 1] */
    const int *seq_lens;            /* [num_reqs]: context + query tokens */
    int num_kv_heads, group;        /* KV heads; query heads per KV head */
    int rows;                       /* rows (pairs) of one item */
    int block_n;                    /* keys of one key tile */
    int warps_n;                    /* key tiles a split unit (the config's warp columns) */
    int non_causal;                 /* every row sees all seq_len keys (the cascade prefix pass), no window */
    int window;                     /* sliding window in tokens, 0 none */
    int extra;                      /* 1: the causal off-by-one fault (a row sees one key more) */
} ar_attn_shape;

/* A plan's pieces (malloc'd; ar_attn_pieces_free). */
typedef struct ar_attn_pieces {
    ar_attn_work *work;             /* [num_work] */
    ar_combine_group *groups;       /* [num_groups] */
    int64_t num_work, num_groups, num_partials;
} ar_attn_pieces;

void ar_attn_pieces_free(ar_attn_pieces *p);

/* The split count of an under-filled launch (FlashAttention's 85%-of-best-wave-efficiency rule)
 * or of an over-filled one with few waves (the tail rule): num_ctas unsplit CTAs, max_units the
 * most split units any of them walks, slots = SMs x CTAs an SM.  1 .. AR_MAX_SPLITS. */
int ar_attn_split_count(int num_ctas, int max_units, int slots);

/* The cascade prefix pass's split count: the smallest s within 5% of the best over s <= 64 of
 * ceil(C s / slots) / s, pieces of at least 2 units, none from 4 waves of unsplit work up. */
int ar_attn_prefix_split_count(int num_ctas, int max_units, int slots);

/* The shape's unsplit items, in request, KV head, row order: *items (malloc'd, n of them) and
 * the most split units (warps_n key tiles) of one.  0 ok, 3 out of host memory. */
int ar_attn_items(const ar_attn_shape *sh, ar_attn_work **items, int64_t *n, int *max_units);

/* Each item of more than ceil(max_units / splits) units cut into pieces of that many (splits
 * <= 1: none cut), a combine group for each cut item and a partial slot for each of its pieces,
 * in *out; the pieces in the items' order.  0 ok, 3 out of host memory. */
int ar_attn_cut(const ar_attn_work *items, int64_t n_items, int splits, int max_units, int warps_n,
                ar_attn_pieces *out);

/* A DECODE_TMA launch (one query token a request; other requests are left out): the most key
 * blocks (16 keys) a request reads from its window's start, and its longest context. */
void ar_attn_decode_tma_extent(int num_reqs, const int *query_start_loc, const int *seq_lens, int window,
                               int *max_blocks, int *max_seq);

/* Its items: one a request (every KV head, blocks from the window's start), or with splits > 1
 * pieces of ceil(max_blocks / splits) blocks for the requests longer than that: piece p of a
 * request cut into n writes partial slot base + p + h x n for KV head h (partial_stride n), and
 * (request, h) is a combine group of the n slots from base + h x n.  0 ok, 3 out of host memory. */
int ar_attn_decode_tma_items(int num_reqs, const int *query_start_loc, const int *seq_lens, int window,
                             int num_kv_heads, int splits, int max_blocks, ar_attn_pieces *out);

/* Sorts work[n] longest first (ties: request, KV head, row). */
void ar_attn_sort_longest_first(ar_attn_work *work, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
