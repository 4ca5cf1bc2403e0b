/* trace.h - trace format v1 (DESIGN section 3): types, the streaming reader, the writer.
 *
 * A trace is JSON Lines, optionally gzip-compressed (zlib's gz API reads both): line 1 the
 * header, every further line one scheduler step mirroring vLLM's SchedulerOutput.  The reader
 * validates every rule (see ar_trace_next) against the state of all steps before, so a step
 * it returns is always safe to apply; a broken trace gives "FILE:LINE: rule" and no step.
 *
 * Memory: the reader holds one step and the live-request table (block lists of requests that
 * have not finished, and the content keys the trace gave for their prompts; request-private
 * keys only for the blocks a request holds), never the whole trace, so a trace of any size
 * streams and what it keeps grows with the block ids and keys the trace lists, not with
 * prompt_len. */
#ifndef AR_TRACE_H
#define AR_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "../reference/dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AR_TRACE_FORMAT "attnreplay-trace"
#define AR_TRACE_VERSION 1
#define AR_NAME_MAX 64
#define AR_ERR_MAX 512

/* The largest header values the reader accepts (each header value's range is in trace.c);
 * whatever writes a trace (attnreplay sim) keeps to them, so its traces read back. */
#define AR_TRACE_MAX_BLOCK_SIZE 4096
#define AR_TRACE_MAX_NUM_BLOCKS (1 << 24)
#define AR_TRACE_MAX_NUM_SEQS (1 << 20)
#define AR_TRACE_MAX_TOKENS (1 << 30)   /* max_num_batched_tokens; prompt_len and tokens of one request */
/* Content keys (prompt_len / block_size per new request) all the new requests of one step may
 * make together: 2^24, as many as the largest cache has blocks, so one step's keys take at most
 * 128 MiB however many requests it admits. */
#define AR_TRACE_MAX_STEP_KEYS (1 << 24)
/* Content keys a trace spells out (block_keys, or prompt_token_ids) that the requests live or
 * preempted at once may hold: 2^25 (256 MiB).  They are kept until a request finishes, as the
 * trace alone can make them again; 1,000 live requests of 128k-token prompts in blocks of 16
 * hold 8 M.  Request-private keys (neither field given) are remade from the id and not counted. */
#define AR_TRACE_MAX_GIVEN_KEYS (1 << 25)

typedef enum ar_attention { AR_ATTN_MHA = 0, AR_ATTN_MLA = 1 } ar_attention;

typedef struct ar_model {
    char name[AR_NAME_MAX];
    ar_attention attention;
    int num_layers;
    int num_q_heads;
    int num_kv_heads;        /* MLA: 1 */
    int head_size;           /* MHA: head dim; MLA: kv_lora_rank + qk_rope_head_dim (576) */
    int kv_lora_rank;        /* MLA only (512) */
    int qk_rope_head_dim;    /* MLA only (64) */
    int qk_nope_head_dim;    /* MLA only (128) */
    int v_head_dim;          /* MLA only (128); MHA: equals head_size */
    double scale;            /* softmax scale */
    int sliding_window;      /* tokens; 0 = none */
    double logits_soft_cap;  /* 0 = none */
} ar_model;

typedef struct ar_cache_config {
    int block_size;
    int num_blocks;          /* including the null block 0 */
    ar_dtype dtype;          /* model (activation) dtype */
    ar_dtype kv_cache_dtype; /* "auto" in the file means = dtype */
} ar_cache_config;

typedef struct ar_sched_config {
    int max_num_batched_tokens;
    int max_num_seqs;
    bool prefix_caching;
    bool cascade;
} ar_sched_config;

typedef struct ar_trace_header {
    int version;
    ar_model model;
    ar_cache_config cache;
    ar_sched_config sched;
    char source[AR_NAME_MAX];
    uint64_t seed;
} ar_trace_header;

/* A request scheduled for the first time (vLLM NewRequestData). */
typedef struct ar_new_req {
    char *req;                /* request id */
    int prompt_len;
    int num_computed_tokens;  /* before this step (prefix-cache hit) */
    int *block_ids;           /* all blocks, prefix hits first */
    int num_block_ids;
    uint64_t *block_keys;     /* content keys of the full prompt blocks: prompt_len / block_size */
    int num_block_keys;
} ar_new_req;

/* A request scheduled before (vLLM CachedRequestData, one entry). */
typedef struct ar_cached_req {
    char *req;
    int num_computed_tokens;  /* before this step */
    int *new_block_ids;       /* appended, or the whole new list when resumed */
    int num_new_block_ids;
    bool resumed;
} ar_cached_req;

typedef struct ar_sched_entry {
    char *req;
    int num_tokens;
} ar_sched_entry;

typedef struct ar_step {
    int64_t step;
    double time;
    ar_new_req *new_reqs;
    int num_new;
    ar_cached_req *cached;
    int num_cached;
    ar_sched_entry *scheduled;     /* in file order; every id is in new or cached */
    int num_scheduled;
    int num_common_prefix_blocks;
    char **finished;
    int num_finished;
    char **preempted;
    int num_preempted;
    long line;                     /* line number of this step in its file */
} ar_step;

/* ---- reading --------------------------------------------------------------------------- */

typedef struct ar_trace_reader ar_trace_reader;

/* Opens PATH (.jsonl or .jsonl.gz) and reads and validates the header.
 * On failure returns NULL and writes "PATH:LINE: rule" into err. */
ar_trace_reader *ar_trace_open(const char *path, char *err, size_t err_len);
const ar_trace_header *ar_trace_header_of(const ar_trace_reader *r);
/* Reads, validates and returns the next step (owned by the reader, valid until the next call).
 * Returns 1 with *step set, 0 at a clean end of file, -1 on a broken trace (err set to
 * "PATH:LINE: rule"; the reader's state is unchanged by the broken step). */
int ar_trace_next(ar_trace_reader *r, const ar_step **step, char *err, size_t err_len);
void ar_trace_close(ar_trace_reader *r);
/* The bound on spelled-out keys held at once (AR_TRACE_MAX_GIVEN_KEYS unless set here, before
 * the first ar_trace_next): a lower one for a host with less memory, or for a test. */
void ar_trace_set_given_key_limit(ar_trace_reader *r, int64_t max_keys);

/* The reader's live-request table, as of the last step returned: every request that holds
 * blocks (scheduled now or earlier, not finished, not preempted).  After ar_trace_next the
 * step's new/cached entries are applied: block lists appended or replaced, num_computed_tokens
 * set to the step's value (before this step's tokens). */
typedef struct ar_live_req {
    const char *req;
    uint64_t req_key;            /* ar_req_key(req) */
    int prompt_len;
    int num_computed_tokens;
    const int *block_ids;
    int num_blocks;
    /* content keys of the full prompt blocks: all prompt_len / block_size of them when the trace
     * gave them (block_keys, prompt_token_ids); request-private ones (neither given) only for
     * the blocks held, min(prompt_len / block_size, num_blocks): the rest are what
     * ar_block_content_key chains past num_prompt_keys from req_key, so keys chained from block
     * 0 are the same either way */
    const uint64_t *prompt_keys;
    int num_prompt_keys;
} ar_live_req;

/* Looks a request up by id; NULL when it is not live. */
const ar_live_req *ar_trace_find(const ar_trace_reader *r, const char *req);
/* Number of live requests, and the i-th in the order they first became live. */
int ar_trace_live_count(const ar_trace_reader *r);
const ar_live_req *ar_trace_live_at(const ar_trace_reader *r, int i);

/* ---- writing --------------------------------------------------------------------------- */

typedef struct ar_trace_writer ar_trace_writer;

/* Creates PATH; gzip when it ends in ".gz".  Writes the header line. */
ar_trace_writer *ar_trace_create(const char *path, const ar_trace_header *h, char *err, size_t err_len);
/* The same, gzip when gz says so whatever PATH's name (a temporary file renamed to a .gz name). */
ar_trace_writer *ar_trace_create_as(const char *path, bool gz, const ar_trace_header *h, char *err, size_t err_len);
/* Appends one step line.  Returns 0, or -1 with err set (e.g. disk full). */
int ar_trace_write_step(ar_trace_writer *w, const ar_step *s, char *err, size_t err_len);
/* Flushes and closes; returns 0, or -1 with err set. */
int ar_trace_finish(ar_trace_writer *w, char *err, size_t err_len);

/* ---- summary (attnreplay info) ----------------------------------------------------------- */

typedef struct ar_trace_stats {
    int64_t steps;
    int64_t requests;             /* distinct request ids */
    int64_t tokens;               /* sum of scheduled tokens */
    int64_t prefill_tokens;       /* tokens of requests still in their prompt */
    int64_t decode_tokens;
    int64_t prefill_only_steps, decode_only_steps, mixed_steps;
    int64_t max_context;          /* max seq_len seen */
    int64_t max_batch_tokens;
    int64_t prefix_hit_blocks;    /* blocks given to new requests as already computed */
    int64_t cascade_eligible_steps;  /* steps whose common prefix passes vLLM's heuristic */
    int64_t preemptions;
    double duration;              /* time of the last step */
} ar_trace_stats;

/* Reads the whole trace (streaming) and fills stats; returns 0, or -1 with err set. */
int ar_trace_stats_compute(const char *path, ar_trace_stats *st, ar_trace_header *h,
                           char *err, size_t err_len);

/* SM count the stats assume for vLLM's cascade heuristic (an H200 has 132). */
#define AR_STATS_NUM_SMS 132

/* Prints a readable summary of the trace at path (header, steps, requests, token mix, step
 * kinds, context, prefix hits, cascade-eligible steps, preemptions, duration) for
 * `attnreplay info TRACE`.  Returns 0, or -1 with err set ("PATH:LINE: rule"). */
int ar_trace_print_info(const char *path, FILE *out, char *err, size_t err_len);

/* Prints one line per step for `attnreplay info TRACE --steps`: step, time_s, requests, tokens,
 * prefill_tokens, max_seq_len, kv_tokens (sum of seq_lens), qk_pairs (causal query-key pairs,
 * sum of n * (num_computed_tokens + (n + 1) / 2): the step's attention work is 4 x qk_pairs x
 * q heads x head_size FLOPs) and cascade_eligible (0/1), after a '#' header line; space
 * separated, for awk.  Returns 0, or -1 with err set ("PATH:LINE: rule"). */
int ar_trace_print_steps(const char *path, FILE *out, char *err, size_t err_len);

/* Content key of a logical block: the prompt key if the block is a full prompt block, else a
 * request-private key chained after the previous block (see datagen.h). */
uint64_t ar_block_content_key(uint64_t prev_key, const uint64_t *prompt_keys, int num_prompt_keys,
                              uint64_t req_key, int block_index);

/* The trace's identity in the runs table (trace_hash, which resume and merge compare): FNV-1a's
 * 64-bit step over the file's bytes from the basis 1469598103934665603 (not FNV's published
 * one; kept, since stored hashes depend on it), as 16 hex digits into out; 0, or -1 when the file
 * cannot be read. */
int ar_trace_file_hash(const char *path, char out[17]);

/* A --steps range "A:B", "A:" or ":B" (inclusive, A >= 0, B >= A; an open end is 0 or
 * INT64_MAX) into *a and *b; 0, or -1 when s is not one. */
int ar_parse_step_range(const char *s, int64_t *a, int64_t *b);

#ifdef __cplusplus
}
#endif
#endif
