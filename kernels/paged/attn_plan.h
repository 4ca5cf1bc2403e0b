/* attn_plan.h - the "cuda" backend's planner: its kernel configs and their geometry, its work
 * items, and the decision function that picks the kernel of each attention launch and cuts its
 * work into split-KV pieces: the split rules, a launch's items (a tile of query-head rows of one
 * request and KV head over the key tiles those rows see), their cut with combine groups, the
 * DECODE_TMA launch's items (one a request, every KV head), and ar_attn_build_plan over them.
 * The backend (cuda_plan.cuh) hands it the device's facts and its environment knobs
 * (ar_attn_device) and each config's geometry from the kernels' templates.  Plain C, host only,
 * so that tests/test_attn_plan.c checks the plans without a GPU; the kernels (cuda_attn.cuh)
 * read ar_attn_work and ar_combine_group as laid out here. */
#ifndef AR_ATTN_PLAN_H
#define AR_ATTN_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AR_CFG_PREFILL 0        /* mma.sync, any head size (the fallback) */
#define AR_CFG_DECODE 1         /* mma.sync, every (request, KV head) within 16 rows */
#define AR_CFG_PREFILL_WG 2     /* head size 128 or 256 exactly, compute capability 9.0 with tensor maps:
                                   the wgmma kernel (cuda_attn_wgmma.cuh) */
#define AR_CFG_DECODE_TMA 3     /* compute capability 9.0, decode batches of many requests: one
                                   CTA per request (every KV head), whole cache blocks copied by
                                   TMA (cuda_attn_decode_tma.cuh) */
#define AR_CFG_COUNT 4
#define AR_MAX_SPLITS 64
#define AR_MAX_DECODE_TMA_PIECES 1024   /* AR_CUDA_DECODE_TMA_PIECES's most (a sweep knob) */

/* Geometry of a (config, template head dim) pair; the same table the kernels instantiate. */
typedef struct ar_attn_geom {
    int rows;        /* rows per CTA */
    int block_n;     /* keys per tile */
    int warps_n;     /* warps walking different key tiles (DECODE) */
    int threads;
    size_t smem;     /* dynamic shared memory bytes */
} ar_attn_geom;

/* The wgmma config (head size 128 or 256 on a compute-capability 9.0 device only). */
static inline int ar_attn_config_is_wg(int config)
{
    return config == AR_CFG_PREFILL_WG;
}

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

/* The split count of a DECODE launch whose longest item would outlast the rest (one long
 * context among short ones).  ar_attn_split_count counts C s CTAs for s splits, as though every
 * item were as long as the longest, while the cut leaves items shorter than a piece whole, so such
 * a launch gets far fewer CTAs than it aims for and the long item's few pieces set the step's
 * time.  fair = ceil(total units / slots), the units a slot walks when the work is spread evenly
 * (the DRAM-bound time).  A CTA that streams on while most others are done reads about 4-5 times
 * its even share of the DRAM's rate (attn_plan.c), which first set the ratio at 4.  The Mooncake
 * trace's 1,059 decode steps (H100, 2026-12-06 13:23-13:46 UTC, kernels/paged/trace_sweep.sh in
 * three runs, every step verified) took 1.246 / 1.091 / 1.000 / 0.946-0.949 / 0.918-0.921 of
 * ratio 4's total time with the rule off / ratio 8 / 4 / 2 / 1 (ratio 2: the lopsided steps
 * 0.83-0.87, the ~60-request ones 0.93-0.96; bench_cuda's lopsided batch 777.7 / 601.4 / 543.4 us
 * at 4 / 2 / 1).  The default is 2, not 1: ratio 2 leaves every uniform batch at the rule's count,
 * while ratio 1 cuts 23-82 of 896 uniform shapes further (B 14 of 8k keys on 396 slots: 336 ->
 * 448 CTAs, past one wave; test_attn_plan), unmeasured.  Returns the smallest s >= base (the
 * rule's count) whose pieces, ceil(max_units / s) units, are at most ratio x fair; base when its
 * pieces are already, or when ratio < 1.  items [n], units in key tiles of warps_n. */
#define AR_SPLIT_PATH_RATIO 2
int ar_attn_split_count_uneven(const ar_attn_work *items, int64_t n, int max_units, int warps_n, int slots, int base,
                               int ratio);

/* The uneven rule's ratio for one DECODE launch with a second ratio for large uneven launches
 * (AR_SPLIT_PATH_LARGE, 1, by default; AR_CUDA_SPLIT_PATH_LARGE=N or off): large_ratio where the
 * launch is large, at least AR_SPLIT_PATH_LARGE_FAIR units a slot of even share, and uneven, its
 * longest item over twice the mean; else ratio.  Ratio 1 for every launch took 0.970 of ratio 2's
 * time on the Mooncake trace's steps of ~60 requests of up to 47k keys (about 40 units a slot) but
 * 1.08 on its small steps of 8-10 requests and 17k keys (about 2 units a slot), whose pieces it
 * halves to one or two units (H100, 2026-12-06, two runs); uniform launches, where the 85% rule
 * is measured, are left to ratio.  With this rule the trace's 1,059 decode steps took 0.987 of
 * ratio 2's total time (H100, 2026-12-06 20:12 UTC, every step verified): 0.988 / 0.985 / 0.987 /
 * 0.947 by total context 16k-128k / 128k-256k / 256k-512k / 512k up, 0.999 under 16k, no group
 * slower.  items [n], units in key tiles of warps_n; ratio (off: < 1) when either is < 1. */
#define AR_SPLIT_PATH_LARGE 1
#define AR_SPLIT_PATH_LARGE_FAIR 8
int ar_attn_split_path_ratio_for(const ar_attn_work *items, int64_t n, int max_units, int warps_n, int slots, int ratio,
                                 int large_ratio);

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

/* A DECODE_TMA launch's extent: the most key blocks (16 keys) any of its num_reqs requests reads
 * from its window's start, their sum, and the longest context. */
void ar_attn_decode_tma_extent(int num_reqs, const int *seq_lens, int window,
                               int *max_blocks, int64_t *total_blocks, int *max_seq);

/* Its items: one a request (every KV head, blocks from the window's start), or with splits > 1
 * pieces of ceil(max_blocks / splits) blocks for the requests longer than that: piece p of a
 * request cut into n writes partial slot base + p + h x n for KV head h (partial_stride n), and
 * (request, h) is a combine group of the n slots from base + h x n.  0 ok, 3 out of host memory. */
int ar_attn_decode_tma_items(int num_reqs, const int *query_start_loc, const int *seq_lens, int window,
                             int num_kv_heads, int splits, int max_blocks, ar_attn_pieces *out);

/* The pieces per request of a 16-bit DECODE_TMA launch, cut by the uneven rule (attn_plan.c's decode_tma_splits):
 * the smallest n <= AR_MAX_SPLITS whose pieces, ceil(max_blocks / n) blocks, are at most ratio x
 * fair, fair = ceil(the launch's blocks / slots), as ar_attn_split_count_uneven does for DECODE's
 * items; DECODE_TMA's unit is a cache block of every KV head and its slots are SMs x 1 CTA.  A
 * DECODE_TMA CTA streams about 67 GB/s, 2.9 times a slot's even share of an H100's DRAM rate,
 * so pieces of up to twice the even share end with the rest.  1 when ratio < 1 or nothing is
 * longer than that; max_blocks and total_blocks as ar_attn_decode_tma_extent gives them. */
int ar_attn_decode_tma_uneven_splits(int64_t total_blocks, int max_blocks, int slots, int ratio);

/* The split-KV combine's team: the threads that share one (row, dim pair) of a combine group,
 * each walking every team-th partial, their sums joined by warp shuffles (cuda_attn.cuh's
 * combine_kernel).  One thread walking a group's partials one after another is bound by the
 * loads' latency once a group has many: the Mooncake trace's lopsided decodes (one request of
 * 135k keys cut into tens of pieces) spent 18 us of a 260 us step in the combine with one
 * thread, 9 us with the rule's team (H100, 2026-12-07; BENCHMARKS.md).
 * setting: AR_COMBINE_TEAM_RULE (the default: the smallest power of two that leaves no thread
 * more than AR_COMBINE_TEAM_SPAN partials of the launch's largest group, at most
 * AR_COMBINE_TEAM_MOST); AR_COMBINE_TEAM_FILL (the rule's team, or a wider one where the
 * launch leaves the device mostly idle: the largest power of two, at most the largest group's
 * partials rounded up to one and AR_COMBINE_TEAM_MOST, whose threads, num_groups x
 * member_threads x team, take at most 1 / AR_COMBINE_FILL_SHARE of thread_slots; a launch of
 * few groups, such as the requests of a small batch cut into many pieces, takes a team as wide
 * as its partials; a launch of many keeps the rule's: on an H100, B 64 of 8k, 512 groups of 3
 * partials, combined in 7.6 us by one thread each and in 10.4 us by teams of 2, whose threads
 * were 0.97 of the device's.  Against the rule on the Mooncake trace (H100, 2026-12-07) fill took
 * the decodes under 16k keys to 0.979 and those of 16k-128k to 1.010, all steps 1.000: a knob,
 * not the default); or a power of two from 1
 * (one thread, the plan before 2026-12-07) to AR_COMBINE_TEAM_MOST (AR_CUDA_COMBINE_TEAM).
 * groups[num_groups]: the launch's combine groups; member_threads: the (row, dim pair)s of one
 * group that hold a query token (the combine's threads that do work, one a team member);
 * thread_slots: the device's resident threads (SMs x threads an SM holds). */
#define AR_COMBINE_TEAM_RULE 0
#define AR_COMBINE_TEAM_FILL (-1)
#define AR_COMBINE_TEAM_SPAN 8
#define AR_COMBINE_FILL_SHARE 4
#define AR_COMBINE_TEAM_MOST 32    /* a warp: the team's shuffles stay inside one */
int ar_attn_combine_team(const ar_combine_group *groups, int64_t num_groups, int64_t member_threads,
                         int64_t thread_slots, int setting);

/* Sorts work[n] longest first (ties: request, KV head, row). */
void ar_attn_sort_longest_first(ar_attn_work *work, int64_t n);

/* What the decision function needs of the device and the run (cuda_backend.cu fills it from
 * its state: cuda_plan.cuh's device_of). */
typedef struct ar_attn_device {
    int num_sms;
    int ctas_per_sm[AR_CFG_COUNT];  /* CTAs of each config that fit on one SM */
    ar_attn_geom geom[AR_CFG_COUNT];/* each config's geometry at template_hd (DECODE_TMA: 128) */
    int has_tma;                    /* compute capability 9.0 and the driver encodes tensor maps */
    int head_size, template_hd, block_size, num_kv_heads, group;
    int kv_fp8;                     /* the cache holds fp8 e4m3: no PREFILL_WG */
    int elem_bytes;                 /* of the cache: 2, or 1 for fp8 */
    int sliding_window;             /* tokens, 0 none */
    int fault;                      /* the planted fault (replay/backend.h ar_fault), AR_FAULT_NONE */
    int wgmma_auto;                 /* the config PREFILL launches take automatically: AR_CFG_PREFILL_WG, or 0 */
    int decode_tma_auto;            /* the automatic plan may take DECODE_TMA */
    int decode_tma_all;             /* AR_CUDA_DECODE_TMA=split or =uneven: DECODE_TMA on every flat decode launch */
    int decode_tma_uneven;          /* AR_CUDA_DECODE_TMA=uneven: with decode_tma_all, the uneven rule's pieces (not =split's) */
    int decode_tma_small;           /* the small-batch rule applies (AR_CUDA_DECODE_TMA=rule: it does not) */
    int decode_tma_many;            /* the many-request uneven rule applies (AR_CUDA_DECODE_TMA_MANY=0: it does not) */
    int decode_tma_splits;          /* AR_CUDA_DECODE_TMA_SPLITS: pieces per request, 0 = the plan's */
    int decode_tma_pieces;          /* AR_CUDA_DECODE_TMA_PIECES: the uneven cut's most pieces a request, 0 = AR_MAX_SPLITS */
    int decode_splits;              /* AR_CUDA_DECODE_SPLITS: DECODE's split count, 0 = the rule's */
    int split_path_ratio;           /* AR_CUDA_SPLIT_PATH_RATIO: the uneven rule's ratio, 0 = AR_SPLIT_PATH_RATIO, -1 = off */
    int split_path_large;           /* AR_CUDA_SPLIT_PATH_LARGE: the ratio for large uneven DECODE launches, 0 = AR_SPLIT_PATH_LARGE
                                       (none when split_path_ratio is set), -1 = off */
    int64_t wg_section_bytes;       /* PREFILL_WG item order's L2 section (item_order.h) */
} ar_attn_device;

/* One attention launch's plan: config, geometry, split count and the work list (malloc'd). */
typedef struct ar_attn_plan {
    int config;
    ar_attn_geom geom;
    int num_splits;
    int64_t num_work, num_groups, num_partials;
    ar_attn_work *work;             /* [num_work], sorted longest first (PREFILL_WG: in
                                       item_order.h's L2 sections) */
    ar_combine_group *groups;       /* [num_groups] */
} ar_attn_plan;

void ar_attn_plan_free(ar_attn_plan *pl);

/* The decision function (attn_plan.c's comment has the rule): the kernel of one launch and its
 * split-KV plan.  R sequences; query_start_loc [R + 1], seq_lens [R].  non_causal: every query
 * of a sequence sees all its seq_len keys (cascade prefix pass: its own split rule), and the
 * sliding window is not applied.  flat: a flat launch (not a cascade pass; DECODE_TMA splits
 * only these).  force_config -1 / force_splits 0 = automatic, then the device's knobs.  0 ok, 3
 * out of host memory. */
int ar_attn_build_plan(const ar_attn_device *d, int R, const int *query_start_loc, const int *seq_lens,
                       bool non_causal, bool flat, int force_config, int force_splits, ar_attn_plan *pl);

#ifdef __cplusplus
}
#endif

#endif
