/* cpu_attn.h - the attention core shared by the CPU backends ("cpu" and "cpu-mla").
 *
 * One kernel, ar_cpu_attn_task, computes softmax(scale * q.k) . v for a work item: a tile of
 * query tokens of one segment x all query heads of one KV head, reading keys either from a
 * paged cache through a block-table row or from a contiguous workspace.  Float32 accumulation,
 * online softmax over tiles of AR_CPU_KEY_TILE keys (rescaling the accumulator when the running
 * max grows), bottom-right causal mask against absolute token positions, optional sliding
 * window and soft cap, output rounded to out_dtype, LSE as natural log (empty row: out 0,
 * lse -inf).  Kernel faults CAUSAL_OFF_BY_ONE, WRONG_KV_HEAD and NO_RESCALE are honoured here.
 *
 * Cache entry layout: element (slot, kv_head, d) sits at (slot * num_kv_heads + kv_head) *
 * kv_stride + d, in kv_dtype bits, multiplied by kv_scale on load.  K reads head_size elements
 * of the entry, V reads v_head_size elements of its own array (MLA passes the latent cache as
 * both, with V = the first kv_lora_rank elements of the K entry).
 *
 * ar_cpu_merge_task is vLLM's merge_attn_states over a range of tokens (semantics section 6).
 * All task functions match ar_task_fn (threadpool.h). */
#ifndef AR_CPU_ATTN_H
#define AR_CPU_ATTN_H

#include <stdint.h>
#include "../../reference/dtype.h"
#include "../../replay/backend.h"

#define AR_CPU_KEY_TILE 32       /* keys per online-softmax step */
#define AR_CPU_MAX_TILE_ROWS 128 /* query rows (tokens x heads of a group) per work item */
#define AR_CPU_TOKEN_TILE 16     /* tokens per generation / write / merge work item */

/* A run of consecutive query tokens that read one key range. */
typedef struct ar_cpu_segment {
    int tok0, tok1;          /* query tokens [tok0, tok1) of the step */
    int block_row;           /* paged: row of the block table that maps keys to slots */
    int row0;                /* contiguous: workspace row of key key_lo */
    int key_lo, key_hi;      /* logical key positions [key_lo, key_hi) */
    int causal;              /* 1: key visible iff its position <= the token's position */
} ar_cpu_segment;

typedef struct ar_cpu_item {
    int seg;                 /* index into the segment array */
    int tok0, tok1;          /* tokens of this item, inside the segment */
    int kv_head;
} ar_cpu_item;

/* Per-thread scratch of the kernel. */
typedef struct ar_cpu_scratch {
    float *k_tile;           /* [head_size, AR_CPU_KEY_TILE] keys transposed */
    float *k_row;            /* [head_size] */
    float *v_tile;           /* [AR_CPU_KEY_TILE, v_head_size] */
    float *scores;           /* [AR_CPU_KEY_TILE] */
    float *acc;              /* [max_rows, v_head_size] */
    float *row_max;          /* [max_rows] */
    float *row_sum;          /* [max_rows] */
    int *tok_lo, *tok_hi;    /* [tile_tokens] */
} ar_cpu_scratch;

/* Everything one attention pass needs. */
typedef struct ar_cpu_attn {
    int num_q_heads, num_kv_heads, head_size, v_head_size;
    int kv_stride;           /* elements per (slot, kv head) entry of k_cache */
    int v_stride;            /* the same for v_cache; 0 = kv_stride */
    int block_size;          /* > 0: paged through block_table; 0: contiguous rows (row0) */
    float scale, soft_cap;   /* soft_cap 0 = off */
    int window;              /* 0 = off */
    ar_dtype out_dtype;      /* outputs rounded to it */
    ar_dtype kv_dtype;
    float kv_scale;          /* multiplier on load */
    ar_fault fault;
    int lse_base2;           /* report lse / ln 2 (fault LSE_BASE2 on a final output) */
    const void *k_cache;     /* [slots, num_kv_heads, kv_stride] */
    const void *v_cache;     /* [slots, num_kv_heads, v_stride] */
    const int *block_table;  /* [rows, block_table_stride] (paged only) */
    int block_table_stride;
    const int *token_pos;    /* [T] absolute position of each query token */
    const float *q;          /* [T, num_q_heads, head_size] */
    int num_tokens;          /* T: the lse row stride */
    const ar_cpu_segment *segs;
    const ar_cpu_item *items;
    float *out;              /* [T, num_q_heads, v_head_size] */
    float *lse;              /* [num_q_heads, T] */
    ar_cpu_scratch *scratch; /* [threads] */
} ar_cpu_attn;

/* Tokens per work item for a GQA group size. */
int ar_cpu_tile_tokens(int group);
/* Scratch for `threads` workers; NULL when out of memory. */
ar_cpu_scratch *ar_cpu_scratch_alloc(int threads, int head_size, int v_head_size, int group);
void ar_cpu_scratch_free(ar_cpu_scratch *scratch, int threads);
/* Appends the work items of segment seg_index (tiles of tile_tokens x every KV head) to
 * *items (grown as needed, capacity *cap).  0 ok, -1 out of memory. */
int ar_cpu_add_items(const ar_cpu_segment *seg, int seg_index, int tile_tokens, int num_kv_heads,
                     ar_cpu_item **items, int *num, int *cap);
/* The kernel: ctx is an ar_cpu_attn, item an index into its items. */
void ar_cpu_attn_task(void *ctx, int item, int worker);

/* LSE-weighted merge of two partial attentions (vLLM merge_attn_states) for the tokens
 * [tok0, tok1): +inf LSE read as -inf; both empty -> a's output, lse -inf; a NaN on either
 * side gives NaN.  no_weights (fault MERGE_NO_WEIGHTS) adds the two outputs instead. */
typedef struct ar_cpu_merge {
    int tok0, tok1;
    int num_heads, head_size;
    int lse_stride;          /* T of the [num_heads, T] LSE arrays */
    const float *a_out, *a_lse, *b_out, *b_lse;  /* [T, heads, head_size], [heads, T] */
    float *out, *lse;        /* may alias a_out / a_lse */
    ar_dtype out_dtype;
    int no_weights;
    int lse_base2;
} ar_cpu_merge;
/* ctx is an ar_cpu_merge; item covers AR_CPU_TOKEN_TILE tokens from tok0. */
void ar_cpu_merge_task(void *ctx, int item, int worker);
int ar_cpu_merge_items(const ar_cpu_merge *m);

/* Per-step token metadata every CPU backend derives in prepare(), and the batch checks. */
typedef struct ar_cpu_step {
    int num_tokens;
    int cap_tokens;
    int *token_req;          /* [T] request index of each token */
    int *token_pos;          /* [T] absolute position */
    int min_context;         /* smallest context_len (INT_MAX without requests) */
    int duplicate_slots;     /* two tokens write one slot: write serially in token order */
    unsigned char *slot_seen; /* [slots / 8 + 1] scratch bitmap, all zero between calls */
    int64_t slots;           /* num_blocks * block_size */
} ar_cpu_step;

/* Allocates the bitmap; 0 ok, -1 out of memory. */
int ar_cpu_step_init(ar_cpu_step *st, int num_blocks, int block_size);
void ar_cpu_step_free(ar_cpu_step *st);
/* Validates b (query_start_loc, seq_lens = context + query, block-table entries of every used
 * block inside [0, num_blocks), slot_mapping inside the cache or -1, common_prefix_len a
 * multiple of the block size and at most the smallest context) and fills token_req/pos.
 * Returns 0, 2 (bad batch, err says "WHO: step S: rule") or 3 (out of memory). */
int ar_cpu_step_prepare(ar_cpu_step *st, const ar_batch *b, int block_size, int num_blocks,
                        const char *who, char *err, size_t err_len);

/* ---- helpers both CPU backends use ---- */

/* The run-level checks every CPU backend shares: block size and count, activation dtype
 * (fp32/fp16/bf16), KV dtype, fp8 kv_scale, layer count.  true, or false with a reason. */
bool ar_cpu_check_run(const ar_run_config *cfg, char *why, size_t why_len);
/* forward()'s preconditions: prepare() succeeded for this step, layer in range.  0 or 2. */
int ar_cpu_check_forward(const ar_cpu_step *st, int prepared, int64_t prepared_step,
                         const ar_batch *b, int layer, int num_layers, const char *who,
                         char *err, size_t err_len);
/* fill()'s checks: layer in range, every slot inside the cache and offset inside a block. */
int ar_cpu_check_fill(const ar_fill *f, int layer, int num_layers, int64_t slots, int block_size,
                      const char *who, char *err, size_t err_len);
/* "cpu (N threads)". */
void ar_cpu_device_name(int threads, char *buf, size_t len);
/* End of the token tile that starts at t0 (AR_CPU_TOKEN_TILE tokens, at most n). */
int ar_cpu_tile_end(int t0, int n);
/* Resizes *p to n floats (at least 1); 0 ok, -1 out of memory (old buffer kept). */
int ar_cpu_resize_floats(float **p, size_t n);
/* Fills o's kernels (and total_us) with the medians over repeats of times
 * [repeat, num_kernels + 1] (last column: total); kernels with used[k] == 0 are left out. */
void ar_cpu_report_times(const double *times, int repeat, int num_kernels,
                         const char *const *names, const int *used, ar_forward_out *o);

/* Cache element conversion: n elements from element index first, times mult / divided by div. */
void ar_cpu_load_row(ar_dtype t, const void *base, int64_t first, int n, float mult,
                     float *dst /* [n] */);
void ar_cpu_store_row(ar_dtype t, void *base, int64_t first, int n, float div,
                      const float *src /* [n] */);
/* Fills n elements of type t with its NaN pattern. */
/* Refuses a cache larger than the memory the kernel says is available (MemAvailable in
 * /proc/meminfo), so a huge num_blocks gives a clear error, not the OOM killer.  0 = fits
 * (or unknown), else 3 with err naming the bytes asked for and available. */
int ar_cpu_check_memory(size_t bytes, const char *who, char *err, size_t err_len);
void ar_cpu_fill_nan(ar_dtype t, void *base, size_t n);
/* acc[d] += p * v[d] for d < n (vectorised in blocks of 8). */
void ar_cpu_add_scaled(float *acc /* [n] */, const float *v /* [n] */, float p, int n);
/* q . k over n elements, eight partial sums. */
float ar_cpu_dot(const float *a /* [n] */, const float *b /* [n] */, int n);
/* Monotonic clock in microseconds; median of n values (sorts v). */
double ar_cpu_now_us(void);
double ar_cpu_median(double *v /* [n] */, int n);

#endif
