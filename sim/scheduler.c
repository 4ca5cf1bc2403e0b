/* scheduler.c - the step-by-step vLLM V1 scheduler simulation (semantics sections 5.2, 8.4,
 * 8.5; sim/README.md lists every modelled behaviour with its vLLM source): KV block pool with
 * the null block 0, a prefix cache keyed by chained content keys (hash map) with LRU eviction of
 * free cached blocks (intrusive doubly-linked free queue), token budget, max_num_seqs, chunked
 * prefill, long_prefill_token_threshold, admission that reserves the whole prompt, preemption by
 * recompute, num_common_prefix_blocks, and the finished / preempted lists.
 *
 * One ar_sim_step = vLLM's Scheduler.schedule() at time `now`, then the step runs for the
 * step-time model's duration, then update_from_output(): tokens computed, one token sampled
 * for every request whose computed tokens reach its token count, finished requests freed
 * (listed in the next step's `finished`).
 *
 * Prefix cache: every FULL block is registered under its content key when it is allocated for
 * tokens that fill it (vLLM's cache_blocks at allocate_slots), so a request admitted later in
 * the same step can already hit it.  Prompt blocks carry the workload's keys; blocks holding
 * generated tokens get request-private keys (generated tokens are the request's own), which only
 * the same request can hit, when it is re-admitted after a preemption.  Equal keys on several
 * blocks are all kept (BlockHashToBlockMap): a lookup takes the earliest registered one still
 * cached.  Freeing a request walks its blocks tail first; blocks without a key go to the head
 * of the free queue (reused first), keyed ones to its tail (evicted last, LRU). */
#include "sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sim_req {
    const ar_workload_req *w;
    const uint64_t *keys;      /* [w->num_keys] */
    char id[24];
    ar_sim_status status;
    int num_computed;          /* tokens whose KV is in the cache */
    int num_output;            /* generated tokens */
    int *blocks;               /* [num_blocks] logical order */
    int num_blocks, cap_blocks;
    uint64_t *own_keys;        /* [num_own_keys] keys of logical blocks num_keys.., request-private */
    int num_own_keys, cap_own_keys;
    int num_registered;        /* leading prompt blocks already in (or from) the prefix cache */
    int blocks_at_start;       /* blocks held before this step's allocation */
    int sched_tokens;          /* this step */
    int computed_at_start;     /* num_computed before this step's tokens */
    bool scheduled_once;       /* has appeared as a new request */
    bool resumed;              /* re-admitted from preemption this step */
    int preemptions;
    int hit_tokens;            /* prefix hit at first admission */
    double first_sched, first_token, last_token;
} sim_req;

struct ar_sim {
    ar_sim_config cfg;
    const ar_workload *wl;
    int block_size, num_blocks;
    /* block pool */
    int *ref;                  /* [num_blocks] */
    uint64_t *block_key;       /* [num_blocks] key when registered */
    unsigned char *registered; /* [num_blocks] */
    int *dup_next;             /* [num_blocks] next block registered under the same key, -1 = none */
    int *free_scratch;         /* [num_blocks] blocks freed by one request, in free order */
    int *free_prev, *free_next;/* [num_blocks] free queue links, -1 = none */
    int free_head, free_tail, free_count;
    /* prefix cache: open addressing, linear probing, backward-shift deletion */
    uint64_t *map_keys;
    int *map_vals;             /* -1 = empty */
    uint32_t map_mask;
    /* requests and queues */
    sim_req *reqs;
    int num_reqs, next_arrival;
    int *waitq;                /* ring of request indices */
    int wq_cap, wq_head, wq_len;
    int *running;              /* [num_running] request indices, vLLM's running order */
    int num_running;
    int *hits;                 /* scratch for prefix lookups */
    int hits_cap;
    double now;
    int64_t step_no;
    /* step output */
    ar_step step;
    ar_new_req *out_new;
    ar_cached_req *out_cached;
    ar_sched_entry *out_sched;
    char **out_finished, **out_preempted;
    int *sched_order;          /* request indices scheduled this step, in order */
    int num_sched;
    int *pending_finished;     /* finished in the last step, listed in the next */
    int num_pending_finished;
    int *preempted_now;
    int num_preempted_now;
    ar_batch_features feat;
    int *feat_query_lens, *feat_context_lens;   /* [num_reqs] the step's shape, for feat */
    /* statistics */
    ar_sim_kv_sample *samples;
    int64_t num_samples, cap_samples;
    int64_t preemptions, cascade_eligible, scheduled_tokens, prompt_tokens, hit_tokens, output_tokens;
    int step_prompt_tokens, step_hit_tokens;   /* first admissions in the current step */
    double usage_integral;
    double usage_max;
    int num_finished, num_skipped;
};

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

/* ---- free queue (LRU: allocate from the head, freed blocks go to the tail) -------------------- */

static void fq_remove(ar_sim *s, int b)
{
    int p = s->free_prev[b], n = s->free_next[b];
    if (p >= 0) s->free_next[p] = n; else s->free_head = n;
    if (n >= 0) s->free_prev[n] = p; else s->free_tail = p;
    s->free_prev[b] = s->free_next[b] = -1;
    s->free_count--;
}

static void fq_push_tail(ar_sim *s, int b)
{
    s->free_prev[b] = s->free_tail;
    s->free_next[b] = -1;
    if (s->free_tail >= 0) s->free_next[s->free_tail] = b; else s->free_head = b;
    s->free_tail = b;
    s->free_count++;
}

/* ---- prefix-cache map --------------------------------------------------------------------------- */

static uint32_t map_slot(const ar_sim *s, uint64_t key)
{
    return (uint32_t)((key ^ (key >> 29)) * 0x9e3779b97f4a7c15ull >> 32) & s->map_mask;
}

static int map_get(const ar_sim *s, uint64_t key)
{
    for (uint32_t i = map_slot(s, key);; i = (i + 1) & s->map_mask) {
        if (s->map_vals[i] < 0) return -1;
        if (s->map_keys[i] == key) return s->map_vals[i];
    }
}

static void map_put(ar_sim *s, uint64_t key, int block)
{
    uint32_t i = map_slot(s, key);
    while (s->map_vals[i] >= 0) i = (i + 1) & s->map_mask;
    s->map_keys[i] = key;
    s->map_vals[i] = block;
}

static void map_set(ar_sim *s, uint64_t key, int block)
{
    for (uint32_t i = map_slot(s, key);; i = (i + 1) & s->map_mask)
        if (s->map_keys[i] == key && s->map_vals[i] >= 0) {
            s->map_vals[i] = block;
            return;
        }
}

static void map_del(ar_sim *s, uint64_t key)
{
    uint32_t i = map_slot(s, key);
    while (s->map_vals[i] >= 0 && s->map_keys[i] != key) i = (i + 1) & s->map_mask;
    if (s->map_vals[i] < 0) return;
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & s->map_mask;
        if (s->map_vals[j] < 0) break;
        uint32_t ideal = map_slot(s, s->map_keys[j]);
        /* move j into the hole at i unless ideal lies cyclically in (i, j] */
        bool stays = i <= j ? (ideal > i && ideal <= j) : (ideal > i || ideal <= j);
        if (!stays) {
            s->map_keys[i] = s->map_keys[j];
            s->map_vals[i] = s->map_vals[j];
            i = j;
        }
    }
    s->map_vals[i] = -1;
}

/* ---- prefix-cache entries: key -> blocks in registration order ---------------------------------- */

/* Registers block b under key, after any blocks already registered under it. */
static void register_block(ar_sim *s, int b, uint64_t key)
{
    int head = map_get(s, key);
    if (head < 0) {
        map_put(s, key, b);
    } else {
        while (s->dup_next[head] >= 0) head = s->dup_next[head];
        s->dup_next[head] = b;
    }
    s->dup_next[b] = -1;
    s->block_key[b] = key;
    s->registered[b] = 1;
}

static void unregister_block(ar_sim *s, int b)
{
    uint64_t key = s->block_key[b];
    int head = map_get(s, key);
    if (head == b) {
        if (s->dup_next[b] >= 0) map_set(s, key, s->dup_next[b]);
        else map_del(s, key);
    } else {
        while (s->dup_next[head] != b) head = s->dup_next[head];
        s->dup_next[head] = s->dup_next[b];
    }
    s->dup_next[b] = -1;
    s->registered[b] = 0;
}

/* ---- blocks ------------------------------------------------------------------------------------- */

static void fq_push_head(ar_sim *s, int b)
{
    s->free_next[b] = s->free_head;
    s->free_prev[b] = -1;
    if (s->free_head >= 0) s->free_prev[s->free_head] = b; else s->free_tail = b;
    s->free_head = b;
    s->free_count++;
}

/* Pops the head of the free queue; evicts its prefix-cache entry. */
static int alloc_block(ar_sim *s)
{
    int b = s->free_head;
    fq_remove(s, b);
    if (s->registered[b]) unregister_block(s, b);
    s->ref[b] = 1;
    return b;
}

static int reserve_blocks(sim_req *r, int n)
{
    if (n <= r->cap_blocks) return 0;
    int cap = r->cap_blocks ? r->cap_blocks : 16;
    while (cap < n) cap *= 2;
    int *p = realloc(r->blocks, (size_t)cap * sizeof *p);
    if (!p) return -1;
    r->blocks = p;
    r->cap_blocks = cap;
    return 0;
}

/* Frees a request's blocks tail first (KVCacheManager.free -> BlockPool.free_blocks): of the
 * blocks no request holds any more, those without a prefix-cache key go to the head of the free
 * queue in that order (the request's last block first), keyed ones to its tail (the last block
 * nearest the head, so a chain is evicted from its end).  compat.fifo_free: all to the tail. */
static void free_request_blocks(ar_sim *s, sim_req *r)
{
    int n_head = 0;
    for (int i = r->num_blocks - 1; i >= 0; i--) {
        int b = r->blocks[i];
        if (--s->ref[b] != 0) continue;
        if (s->registered[b] || s->cfg.compat.fifo_free) fq_push_tail(s, b);
        else s->free_scratch[n_head++] = b;
    }
    while (n_head > 0) fq_push_head(s, s->free_scratch[--n_head]);
    r->num_blocks = 0;
    r->num_registered = 0;
}

static int num_tokens(const sim_req *r) { return r->w->prompt_len + r->num_output; }

/* Private payload of a request's logical block i beyond its prompt keys (ar_sim_logical_key). */
static uint64_t private_payload(int req, int block_index)
{
    return ar_mix64(((uint64_t)(req + 1) << 32) ^ (uint64_t)block_index ^ 0x5052495600000000ull);
}

/* Content key of request ri's logical block i: its prompt key, else the request-private chain
 * (cached per request; extended on demand).  *oom set when the cache cannot grow. */
static uint64_t block_key_of(ar_sim *s, int ri, int i, int *oom)
{
    sim_req *r = &s->reqs[ri];
    if (i < r->w->num_keys) return r->keys[i];
    int k = i - r->w->num_keys;
    if (k >= r->cap_own_keys) {
        int cap = r->cap_own_keys ? r->cap_own_keys * 2 : 16;
        while (cap <= k) cap *= 2;
        uint64_t *p = realloc(r->own_keys, (size_t)cap * sizeof *p);
        if (!p) { *oom = 1; return 0; }
        r->own_keys = p;
        r->cap_own_keys = cap;
    }
    while (r->num_own_keys <= k) {
        int j = r->w->num_keys + r->num_own_keys;
        uint64_t prev = j == 0 ? AR_ROOT_KEY : j - 1 < r->w->num_keys ? r->keys[j - 1] : r->own_keys[j - 1 - r->w->num_keys];
        r->own_keys[r->num_own_keys++] = ar_chain_key(prev, private_payload(ri, j));
    }
    return r->own_keys[k];
}

/* Longest prefix-cache hit for a waiting request: full blocks, capped so at least one token is
 * computed (hit <= num_tokens - 1; a re-admitted request may hit its own generated blocks).
 * Fills s->hits; returns the block count. */
static int lookup_hits(ar_sim *s, int ri, int *oom)
{
    const sim_req *r = &s->reqs[ri];
    if (!s->cfg.header.sched.prefix_caching) return 0;
    int max_blocks = (num_tokens(r) - 1) / s->block_size;
    int n = 0;
    while (n < max_blocks) {
        uint64_t key = block_key_of(s, ri, n, oom);
        if (*oom) return 0;
        int b = map_get(s, key);
        if (b < 0) break;
        s->hits[n++] = b;
    }
    return n;
}

/* vLLM's KVCacheManager.allocate_slots: room for num_computed + num_new tokens (the request's
 * num_computed already includes the hit), hit blocks first.  reserve_tokens > 0 (admission with
 * scheduler_reserve_full_isl) first requires room for that many tokens.  false = not enough
 * free blocks, nothing changed. */
static bool allocate_slots(ar_sim *s, int ri, int num_new, int num_hits, int reserve_tokens, int *oom)
{
    sim_req *r = &s->reqs[ri];
    int B = s->block_size;
    int evictable = 0;
    for (int i = 0; i < num_hits; i++) evictable += s->ref[s->hits[i]] == 0;
    if (reserve_tokens > 0) {
        int full = ceil_div(reserve_tokens, B) - r->num_blocks - num_hits;
        if ((full > 0 ? full : 0) + evictable > s->free_count) return false;
    }
    int need = ceil_div(r->num_computed + num_new, B);
    int to_alloc = need - r->num_blocks - num_hits;
    if (to_alloc < 0) to_alloc = 0;
    if (to_alloc + evictable > s->free_count) return false;
    if (reserve_blocks(r, r->num_blocks + num_hits + to_alloc) != 0) { *oom = 1; return false; }
    for (int i = 0; i < num_hits; i++) {
        int b = s->hits[i];
        if (s->ref[b] == 0) fq_remove(s, b);
        s->ref[b]++;
        r->blocks[r->num_blocks++] = b;
    }
    if (num_hits > 0) r->num_registered = num_hits;
    for (int i = 0; i < to_alloc; i++) r->blocks[r->num_blocks++] = alloc_block(s);
    if (s->cfg.header.sched.prefix_caching) {
        int filled = r->num_computed + num_new;
        if (filled > num_tokens(r)) filled = num_tokens(r);
        int full = filled / B;
        for (int i = r->num_registered; i < full; i++) {
            int b = r->blocks[i];
            uint64_t key = block_key_of(s, ri, i, oom);
            if (*oom) return false;
            if (!s->registered[b]) register_block(s, b, key);
        }
        if (full > r->num_registered) r->num_registered = full;
    }
    return true;
}

/* ---- queues --------------------------------------------------------------------------------------- */

static void wq_push_back(ar_sim *s, int i)
{
    s->waitq[(s->wq_head + s->wq_len) % s->wq_cap] = i;
    s->wq_len++;
}

static void wq_push_front(ar_sim *s, int i)
{
    s->wq_head = (s->wq_head + s->wq_cap - 1) % s->wq_cap;
    s->waitq[s->wq_head] = i;
    s->wq_len++;
}

static int wq_front(const ar_sim *s) { return s->waitq[s->wq_head]; }

static void wq_pop_front(ar_sim *s)
{
    s->wq_head = (s->wq_head + 1) % s->wq_cap;
    s->wq_len--;
}

/* ---- create / destroy ----------------------------------------------------------------------------- */

void ar_sim_destroy(ar_sim *s)
{
    if (!s) return;
    for (int i = 0; i < s->num_reqs; i++) {
        free(s->reqs[i].blocks);
        free(s->reqs[i].own_keys);
    }
    free(s->reqs);
    free(s->ref);
    free(s->block_key);
    free(s->registered);
    free(s->dup_next);
    free(s->free_scratch);
    free(s->free_prev);
    free(s->free_next);
    free(s->map_keys);
    free(s->map_vals);
    free(s->waitq);
    free(s->running);
    free(s->hits);
    free(s->out_new);
    free(s->out_cached);
    free(s->out_sched);
    free(s->out_finished);
    free(s->out_preempted);
    free(s->sched_order);
    free(s->pending_finished);
    free(s->preempted_now);
    free(s->feat_query_lens);
    free(s->feat_context_lens);
    free(s->samples);
    free(s);
}

ar_sim *ar_sim_create(const ar_sim_config *cfg, const ar_workload *wl, char *err, size_t err_len)
{
    const ar_cache_config *cc = &cfg->header.cache;
    const ar_sched_config *sc = &cfg->header.sched;
    if (cc->block_size <= 0 || cc->num_blocks < 2) {
        snprintf(err, err_len, "block size must be positive and num_blocks at least 2 (got %d, %d)",
                 cc->block_size, cc->num_blocks);
        return NULL;
    }
    if (wl->block_size != cc->block_size) {
        snprintf(err, err_len, "workload keys were made for block size %d, engine uses %d", wl->block_size, cc->block_size);
        return NULL;
    }
    if (sc->max_num_batched_tokens <= 0 || sc->max_num_seqs <= 0 || cfg->long_prefill_token_threshold < 0) {
        snprintf(err, err_len, "max_num_batched_tokens and max_num_seqs must be positive, the threshold >= 0");
        return NULL;
    }
    ar_sim *s = calloc(1, sizeof *s);
    if (!s) { snprintf(err, err_len, "out of memory"); return NULL; }
    s->cfg = *cfg;
    s->wl = wl;
    s->num_reqs = wl->num_reqs;
    s->block_size = cc->block_size;
    s->num_blocks = cc->num_blocks;
    int nb = s->num_blocks, nr = wl->num_reqs;
    uint32_t map_cap = 16;
    while (map_cap < (uint32_t)nb * 2u) map_cap *= 2;
    s->map_mask = map_cap - 1;
    s->ref = calloc((size_t)nb, sizeof *s->ref);
    s->block_key = calloc((size_t)nb, sizeof *s->block_key);
    s->registered = calloc((size_t)nb, 1);
    s->dup_next = malloc((size_t)nb * sizeof(int));
    s->free_scratch = malloc((size_t)nb * sizeof(int));
    s->free_prev = malloc((size_t)nb * sizeof(int));
    s->free_next = malloc((size_t)nb * sizeof(int));
    s->map_keys = malloc((size_t)map_cap * sizeof *s->map_keys);
    s->map_vals = malloc((size_t)map_cap * sizeof *s->map_vals);
    s->reqs = calloc((size_t)(nr > 0 ? nr : 1), sizeof *s->reqs);
    s->wq_cap = nr + 1;
    s->waitq = malloc((size_t)s->wq_cap * sizeof(int));
    s->running = malloc((size_t)(nr + 1) * sizeof(int));
    s->sched_order = malloc((size_t)(nr + 1) * sizeof(int));
    s->pending_finished = malloc((size_t)(nr + 1) * sizeof(int));
    s->preempted_now = malloc((size_t)(nr + 1) * sizeof(int));
    s->feat_query_lens = malloc((size_t)(nr + 1) * sizeof(int));
    s->feat_context_lens = malloc((size_t)(nr + 1) * sizeof(int));
    s->out_new = malloc((size_t)(nr + 1) * sizeof *s->out_new);
    s->out_cached = malloc((size_t)(nr + 1) * sizeof *s->out_cached);
    s->out_sched = malloc((size_t)(nr + 1) * sizeof *s->out_sched);
    s->out_finished = malloc((size_t)(nr + 1) * sizeof(char *));
    s->out_preempted = malloc((size_t)(nr + 1) * sizeof(char *));
    /* a lookup walks at most (prompt + output - 1) / block_size blocks */
    int max_keys = 1;
    for (int i = 0; i < nr; i++) {
        int64_t n = ((int64_t)wl->reqs[i].prompt_len + wl->reqs[i].output_len) / cc->block_size;
        if (n > max_keys) max_keys = n > nb ? nb : (int)n;
    }
    s->hits_cap = max_keys;
    s->hits = malloc((size_t)max_keys * sizeof(int));
    if (!s->ref || !s->block_key || !s->registered || !s->dup_next || !s->free_scratch || !s->free_prev || !s->free_next || !s->map_keys ||
        !s->map_vals || !s->reqs || !s->waitq || !s->running || !s->sched_order || !s->pending_finished ||
        !s->preempted_now || !s->out_new || !s->out_cached || !s->out_sched || !s->out_finished ||
        !s->out_preempted || !s->hits || !s->feat_query_lens || !s->feat_context_lens) {
        ar_sim_destroy(s);
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    for (uint32_t i = 0; i < map_cap; i++) s->map_vals[i] = -1;
    for (int b = 0; b < nb; b++) s->dup_next[b] = -1;
    /* block 0 is the null block: never in the free queue, never allocated */
    s->free_head = s->free_tail = -1;
    s->free_prev[0] = s->free_next[0] = -1;
    for (int b = 1; b < nb; b++) fq_push_tail(s, b);
    int usable_blocks = nb - 1;
    int warned = 0;
    for (int i = 0; i < nr; i++) {
        sim_req *r = &s->reqs[i];
        r->w = &wl->reqs[i];
        /* no full prompt block anywhere: keys is NULL (offsetting it would be undefined) */
        r->keys = wl->keys ? wl->keys + wl->reqs[i].key_offset : NULL;
        snprintf(r->id, sizeof r->id, "r%d", i);
        r->status = AR_REQ_PENDING;
        r->first_sched = r->first_token = r->last_token = -1;
        if (i > 0 && wl->reqs[i].arrival < wl->reqs[i - 1].arrival) {
            snprintf(err, err_len, "workload request %d (line %ld) arrives before the one before it", i, wl->reqs[i].line);
            ar_sim_destroy(s);
            return NULL;
        }
        /* the last generated token is sampled, never computed */
        int64_t need = ((int64_t)r->w->prompt_len + r->w->output_len - 1 + s->block_size - 1) / s->block_size;
        bool too_long = cfg->max_model_len > 0 && r->w->prompt_len + r->w->output_len > cfg->max_model_len;
        if (need > usable_blocks || too_long) {
            r->status = AR_REQ_SKIPPED;
            s->num_skipped++;
            if (warned++ < 5) {
                const char *where = wl->path[0] ? wl->path : wl->source;
                if (too_long)
                    fprintf(stderr, "sim: %s:%ld: skipping request %s: %d prompt + %d output tokens exceed max_model_len %d\n",
                            where, r->w->line, r->id, r->w->prompt_len, r->w->output_len, cfg->max_model_len);
                else
                    fprintf(stderr, "sim: %s:%ld: skipping request %s: %d prompt + %d output tokens can never fit the KV cache (%d blocks of %d)\n",
                            where, r->w->line, r->id, r->w->prompt_len, r->w->output_len, usable_blocks, s->block_size);
            }
        }
    }
    if (s->num_skipped > 5) fprintf(stderr, "sim: %d requests skipped in all\n", s->num_skipped);
    return s;
}

int ar_sim_check_any_fits(const ar_workload *wl, int num_blocks, int block_size, int max_model_len, char *err,
                          size_t err_len)
{
    int best = -1;
    int64_t best_need = 0;
    for (int i = 0; i < wl->num_reqs; i++) {
        const ar_workload_req *w = &wl->reqs[i];
        /* the last generated token is sampled, never computed */
        int64_t need = ((int64_t)w->prompt_len + w->output_len - 1 + block_size - 1) / block_size;
        bool too_long = max_model_len > 0 && w->prompt_len + w->output_len > max_model_len;
        if (need <= num_blocks - 1 && !too_long) return 0;
        if (best < 0 || need < best_need) { best = i; best_need = need; }
    }
    if (best < 0) return 0;   /* no requests: the loaders refuse those themselves */
    const ar_workload_req *w = &wl->reqs[best];
    const char *where = wl->path[0] ? wl->path : wl->source;
    if (best_need <= num_blocks - 1)
        snprintf(err, err_len, "no request of %s can run: every one exceeds max_model_len %d (the shortest, "
                 "%s:%ld, has %d prompt + %d output tokens)", where, max_model_len, where, w->line, w->prompt_len,
                 w->output_len);
    else
        snprintf(err, err_len, "no request of %s can run: a KV cache of %d blocks (%d usable) of %d tokens holds "
                 "none of them; the smallest, %s:%ld (%d prompt + %d output tokens), needs %lld blocks "
                 "(give a larger KV cache)", where, num_blocks, num_blocks - 1, block_size, where, w->line,
                 w->prompt_len, w->output_len, (long long)best_need);
    return 2;
}

/* ---- one step ------------------------------------------------------------------------------------- */

static void preempt(ar_sim *s, sim_req *r, int index)
{
    free_request_blocks(s, r);
    r->status = AR_REQ_PREEMPTED;
    r->num_computed = 0;
    r->preemptions++;
    s->preemptions++;
    wq_push_front(s, index);
    s->preempted_now[s->num_preempted_now++] = index;
}

static int add_sample(ar_sim *s, double time, int num_tokens_step)
{
    if (s->num_samples == s->cap_samples) {
        int64_t cap = s->cap_samples ? s->cap_samples * 2 : 4096;
        ar_sim_kv_sample *p = realloc(s->samples, (size_t)cap * sizeof *p);
        if (!p) return -1;
        s->samples = p;
        s->cap_samples = cap;
    }
    ar_sim_kv_sample *k = &s->samples[s->num_samples++];
    k->time = time;
    k->used_blocks = s->num_blocks - 1 - s->free_count;
    k->running = s->num_running;
    k->waiting = s->wq_len;
    k->num_tokens = num_tokens_step;
    k->admitted_prompt_tokens = s->step_prompt_tokens;
    k->admitted_hit_tokens = s->step_hit_tokens;
    return 0;
}

/* vLLM's use_cascade_attention (semantics 5.4) on this step's common prefix. */
static bool cascade_eligible(const ar_sim *s, int num_common_blocks)
{
    const ar_model *m = &s->cfg.header.model;
    if (m->attention == AR_ATTN_MLA || m->sliding_window > 0 || num_common_blocks == 0 || s->num_sched < 8) return false;
    int P = num_common_blocks * s->block_size;
    for (int k = 0; k < s->num_sched; k++) {
        int c = s->reqs[s->sched_order[k]].computed_at_start;
        if (c < P) P = c;
    }
    P = P / s->block_size * s->block_size;
    if (P < 256) return false;
    int qpkv = m->num_q_heads / (m->num_kv_heads > 0 ? m->num_kv_heads : 1);
    bool all_single = true;
    for (int k = 0; k < s->num_sched; k++) all_single &= s->reqs[s->sched_order[k]].sched_tokens == 1;
    if (!(qpkv > 1 && all_single)) return true;
    int sms = s->cfg.num_sms > 0 ? s->cfg.num_sms : 132;
    long tiles = ceil_div(P, 128), nreq = s->num_sched;
    long cascade_time = ceil_div((int)(m->num_q_heads * ceil_div((int)nreq, 128)), sms) * tiles;
    long fd_time = (nreq * m->num_kv_heads * ceil_div(qpkv, 128) * tiles + sms - 1) / sms;
    return cascade_time < fd_time;
}

int ar_sim_step(ar_sim *s, const ar_step **step_out, char *err, size_t err_len)
{
    const ar_sched_config *sc = &s->cfg.header.sched;
    int B = s->block_size;
    int oom = 0;
    /* arrivals; jump over idle time */
    while (s->next_arrival < s->num_reqs && s->reqs[s->next_arrival].status == AR_REQ_SKIPPED) s->next_arrival++;
    if (s->num_running == 0 && s->wq_len == 0) {
        if (s->next_arrival >= s->num_reqs) return 0;
        double a = s->reqs[s->next_arrival].w->arrival;
        if (!isfinite(a)) {
            snprintf(err, err_len, "step %lld: workload request %d arrives at %g s, not a finite time",
                     (long long)s->step_no, s->next_arrival, a);
            return -2;
        }
        double t = ceil(a * 1e6) / 1e6;
        /* beyond 2^53 us (~285 years) the rounding can land below a; beyond ~1.8e302 s it overflows */
        if (t < a || !isfinite(t)) t = a;
        if (t > s->now) s->now = t;
    }
    /* arrivals up to now (half a microsecond of slack for the clock's rounding) */
    while (s->next_arrival < s->num_reqs && s->reqs[s->next_arrival].w->arrival <= s->now + 5e-7) {
        sim_req *r = &s->reqs[s->next_arrival];
        if (r->status == AR_REQ_PENDING) {
            r->status = AR_REQ_WAITING;
            wq_push_back(s, s->next_arrival);
        }
        s->next_arrival++;
    }

    /* ---- schedule: running requests first ---- */
    int budget = sc->max_num_batched_tokens;
    /* the threshold keeps a long prompt from starving others: none to starve when it is alone */
    int threshold = s->cfg.long_prefill_token_threshold;
    if (!s->cfg.compat.threshold_when_alone && s->num_running + s->wq_len <= 1) threshold = 0;
    s->num_sched = 0;
    s->num_preempted_now = 0;
    s->step_prompt_tokens = s->step_hit_tokens = 0;
    for (int k = 0; k < s->num_running; k++) {
        sim_req *r = &s->reqs[s->running[k]];
        r->sched_tokens = 0;
        r->resumed = false;
    }
    int idx = 0;
    while (idx < s->num_running && budget > 0) {
        int ri = s->running[idx];
        sim_req *r = &s->reqs[ri];
        int num_new = num_tokens(r) - r->num_computed;
        if (threshold > 0 && num_new > threshold) num_new = threshold;
        if (num_new > budget) num_new = budget;
        if (s->cfg.max_model_len > 0 && num_new > s->cfg.max_model_len - 1 - r->num_computed)
            num_new = s->cfg.max_model_len - 1 - r->num_computed;
        if (num_new <= 0) { idx++; continue; }
        r->blocks_at_start = r->num_blocks;
        bool scheduled = false;
        for (;;) {
            if (allocate_slots(s, ri, num_new, 0, 0, &oom)) { scheduled = true; break; }
            if (oom) { snprintf(err, err_len, "out of memory"); return -1; }
            /* preempt the last running request (vLLM's running.pop()) */
            int vi = s->running[--s->num_running];
            sim_req *v = &s->reqs[vi];
            if (v->sched_tokens > 0) {   /* scheduled earlier this step: give its tokens back */
                budget += v->sched_tokens;
                v->sched_tokens = 0;
                int w = 0;
                for (int k = 0; k < s->num_sched; k++)
                    if (s->sched_order[k] != vi) s->sched_order[w++] = s->sched_order[k];
                s->num_sched = w;
            }
            preempt(s, v, vi);
            if (vi == ri) break;
        }
        if (!scheduled) break;
        r->computed_at_start = r->num_computed;
        r->sched_tokens = num_new;
        budget -= num_new;
        s->sched_order[s->num_sched++] = ri;
        idx++;
    }

    /* ---- then waiting requests, only if nothing was preempted this step ---- */
    if (s->num_preempted_now == 0) {
        while (s->wq_len > 0 && budget > 0 && s->num_running < sc->max_num_seqs) {
            int ri = wq_front(s);
            sim_req *r = &s->reqs[ri];
            int num_hits = lookup_hits(s, ri, &oom);
            if (oom) { snprintf(err, err_len, "out of memory"); return -1; }
            r->num_computed = num_hits * B;
            int num_new = num_tokens(r) - r->num_computed;
            if (threshold > 0 && num_new > threshold) num_new = threshold;
            if (num_new > budget) num_new = budget;
            r->blocks_at_start = 0;
            /* scheduler_reserve_full_isl: the whole prompt (with the tokens generated before a
             * preemption) must fit, not just this chunk */
            int reserve = 0;
            if (!s->cfg.compat.no_reserve_full_isl) {
                reserve = num_tokens(r);
                if (s->cfg.max_model_len > 0 && reserve > s->cfg.max_model_len) reserve = s->cfg.max_model_len;
            }
            if (!allocate_slots(s, ri, num_new, num_hits, reserve, &oom)) {
                r->num_computed = 0;
                if (oom) { snprintf(err, err_len, "out of memory"); return -1; }
                break;
            }
            wq_pop_front(s);
            r->resumed = r->status == AR_REQ_PREEMPTED;
            r->status = AR_REQ_RUNNING;
            s->running[s->num_running++] = ri;
            r->computed_at_start = r->num_computed;
            r->sched_tokens = num_new;
            budget -= num_new;
            s->sched_order[s->num_sched++] = ri;
            if (r->first_sched < 0) {
                r->first_sched = s->now;
                r->hit_tokens = r->num_computed;
                s->hit_tokens += r->num_computed;
                s->prompt_tokens += r->w->prompt_len;
                s->step_hit_tokens += r->num_computed;
                s->step_prompt_tokens += r->w->prompt_len;
            }
        }
    }
    if (s->num_sched == 0) {
        snprintf(err, err_len, "step %lld: nothing could be scheduled (%d running, %d waiting, %d free blocks)",
                 (long long)s->step_no, s->num_running, s->wq_len, s->free_count);
        return -1;
    }

    /* ---- the SchedulerOutput ---- */
    ar_step *st = &s->step;
    memset(st, 0, sizeof *st);
    st->step = s->step_no;
    st->time = s->now;
    st->new_reqs = s->out_new;
    st->cached = s->out_cached;
    st->scheduled = s->out_sched;
    st->finished = s->out_finished;
    st->preempted = s->out_preempted;
    ar_batch_features *f = &s->feat;
    memset(f, 0, sizeof *f);
    f->query_lens = s->feat_query_lens;
    f->context_lens = s->feat_context_lens;
    for (int pass = 0; pass < 2; pass++)   /* cached: running ones, then resumed ones */
        for (int k = 0; k < s->num_sched; k++) {
            sim_req *r = &s->reqs[s->sched_order[k]];
            if (!r->scheduled_once || r->resumed != (pass == 1)) continue;
            ar_cached_req *c = &st->cached[st->num_cached++];
            c->req = r->id;
            c->num_computed_tokens = r->computed_at_start;
            c->resumed = r->resumed;
            c->new_block_ids = r->blocks + (r->resumed ? 0 : r->blocks_at_start);
            c->num_new_block_ids = r->num_blocks - (r->resumed ? 0 : r->blocks_at_start);
        }
    for (int k = 0; k < s->num_sched; k++) {
        sim_req *r = &s->reqs[s->sched_order[k]];
        if (!r->scheduled_once) {
            ar_new_req *n = &st->new_reqs[st->num_new++];
            n->req = r->id;
            n->prompt_len = r->w->prompt_len;
            n->num_computed_tokens = r->computed_at_start;
            n->block_ids = r->blocks;
            n->num_block_ids = r->num_blocks;
            n->block_keys = (uint64_t *)r->keys;
            n->num_block_keys = r->w->num_keys;
        }
        st->scheduled[st->num_scheduled].req = r->id;
        st->scheduled[st->num_scheduled++].num_tokens = r->sched_tokens;
        int n = r->sched_tokens, c = r->computed_at_start;
        s->feat_query_lens[f->num_reqs] = n;
        s->feat_context_lens[f->num_reqs] = c;
        f->num_reqs++;
        f->num_tokens += n;
        bool decode = n == 1 && r->num_output > 0 && c == num_tokens(r) - 1;
        if (decode) f->num_decode_reqs++; else f->num_prefill_tokens += n;
        f->kv_tokens_read += c + n;
        f->attn_pairs += (double)n * (c + (n + 1) * 0.5);
    }
    for (int k = 0; k < s->num_pending_finished; k++)
        st->finished[st->num_finished++] = s->reqs[s->pending_finished[k]].id;
    s->num_pending_finished = 0;
    for (int k = 0; k < s->num_preempted_now; k++)
        st->preempted[st->num_preempted++] = s->reqs[s->preempted_now[k]].id;
    /* num_common_prefix_blocks: running[0]'s leading blocks held by every request that holds blocks */
    if (sc->prefix_caching && s->num_running > 0) {
        const sim_req *r0 = &s->reqs[s->running[0]];
        int n = 0;
        while (n < r0->num_blocks && s->ref[r0->blocks[n]] == s->num_running) n++;
        st->num_common_prefix_blocks = n;
    }
    if (cascade_eligible(s, st->num_common_prefix_blocks)) s->cascade_eligible++;

    /* ---- run the step ---- */
    double dur = ar_steptime_eval(&s->cfg.steptime, f);
    if (!isfinite(dur)) {   /* an absurd model (--step-time constant:1e308, linear:1e308,...) */
        snprintf(err, err_len, "step %lld: the step-time model gives a duration of %g s, not a finite number "
                 "(check --step-time)", (long long)s->step_no, dur);
        return -2;
    }
    if (!(dur > 0)) dur = 1e-6;
    if (add_sample(s, s->now, f->num_tokens) != 0) { snprintf(err, err_len, "out of memory"); return -1; }
    double used = (double)(s->num_blocks - 1 - s->free_count) / (double)(s->num_blocks - 1);
    s->usage_integral += used * dur;
    if (used > s->usage_max) s->usage_max = used;
    /* the clock ticks in whole microseconds: trace times stay short and exact in decimal */
    double t_end = round((s->now + dur) * 1e6) / 1e6;
    if (t_end <= s->now) t_end = s->now + 1e-6;
    if (!isfinite(t_end) || t_end > AR_SIM_MAX_CLOCK_S) {   /* JSON has no inf; past 2^53 us steps stop adding up */
        snprintf(err, err_len, "step %lld: the simulated clock overflows: %g s + a step of %g s counted in "
                 "microseconds is past the clock's range of 2^53 us, about 285 years (check --step-time and --time-scale)", (long long)s->step_no,
                 s->now, dur);
        return -2;
    }
    s->scheduled_tokens += f->num_tokens;

    /* ---- update_from_output ---- */
    for (int k = 0; k < s->num_sched; k++) {
        sim_req *r = &s->reqs[s->sched_order[k]];
        r->scheduled_once = true;
        r->num_computed += r->sched_tokens;
        if (r->num_computed >= num_tokens(r)) {   /* a token is sampled */
            r->num_output++;
            s->output_tokens++;
            if (r->first_token < 0) r->first_token = t_end;
            r->last_token = t_end;
            if (r->num_output >= r->w->output_len) {
                free_request_blocks(s, r);
                r->status = AR_REQ_FINISHED;
                s->num_finished++;
                s->pending_finished[s->num_pending_finished++] = s->sched_order[k];
            }
        }
    }
    if (s->num_pending_finished > 0) {
        int w = 0;
        for (int k = 0; k < s->num_running; k++)
            if (s->reqs[s->running[k]].status == AR_REQ_RUNNING) s->running[w++] = s->running[k];
        s->num_running = w;
    }
    s->now = t_end;
    s->step_no++;
    *step_out = st;
    return 1;
}

/* ---- inspection ------------------------------------------------------------------------------------ */

const ar_batch_features *ar_sim_last_features(const ar_sim *s) { return &s->feat; }
int ar_sim_num_blocks(const ar_sim *s) { return s->num_blocks; }
int ar_sim_block_ref(const ar_sim *s, int block) { return s->ref[block]; }
int ar_sim_num_requests(const ar_sim *s) { return s->num_reqs; }
int ar_sim_num_running(const ar_sim *s) { return s->num_running; }
int ar_sim_num_waiting(const ar_sim *s) { return s->wq_len; }

int ar_sim_free_blocks(const ar_sim *s)
{
    int n = 0;
    for (int b = s->free_head; b >= 0 && n <= s->num_blocks; b = s->free_next[b]) n++;
    return n;
}

void ar_sim_request(const ar_sim *s, int i, ar_sim_req_info *info)
{
    const sim_req *r = &s->reqs[i];
    memset(info, 0, sizeof *info);
    info->id = r->id;
    info->status = r->status;
    info->prompt_len = r->w->prompt_len;
    info->output_len = r->w->output_len;
    info->num_computed_tokens = r->num_computed;
    info->num_output_tokens = r->num_output;
    info->block_ids = r->blocks;
    info->num_blocks = r->num_blocks;
    info->prompt_keys = r->keys;
    info->num_prompt_keys = r->w->num_keys;
    info->num_preemptions = r->preemptions;
    info->prefix_hit_tokens = r->hit_tokens;
    info->arrival = r->w->arrival;
    info->first_scheduled = r->first_sched;
    info->first_token = r->first_token;
    info->last_token = r->last_token;
}

const ar_workload_req *ar_sim_workload_req(const ar_sim *s, int i) { return s->reqs[i].w; }

uint64_t ar_sim_logical_key(const ar_sim *s, int req, int block_index)
{
    const sim_req *r = &s->reqs[req];
    if (block_index < r->w->num_keys) return r->keys[block_index];
    uint64_t key = r->w->num_keys > 0 ? r->keys[r->w->num_keys - 1] : AR_ROOT_KEY;
    for (int i = r->w->num_keys; i <= block_index; i++) key = ar_chain_key(key, private_payload(req, i));
    return key;
}

void ar_sim_summarize(const ar_sim *s, ar_sim_summary *sum)
{
    memset(sum, 0, sizeof *sum);
    sum->num_requests = s->num_reqs;
    sum->num_finished = s->num_finished;
    sum->num_skipped = s->num_skipped;
    sum->steps = s->step_no;
    sum->preemptions = s->preemptions;
    sum->cascade_eligible_steps = s->cascade_eligible;
    sum->prompt_tokens = s->prompt_tokens;
    sum->prefix_hit_tokens = s->hit_tokens;
    sum->output_tokens = s->output_tokens;
    sum->scheduled_tokens = s->scheduled_tokens;
    sum->duration = s->now;
    sum->kv_usage_mean = s->now > 0 ? s->usage_integral / s->now : 0;
    sum->kv_usage_max = s->usage_max;
}

const ar_sim_kv_sample *ar_sim_kv_samples(const ar_sim *s, int64_t *count)
{
    *count = s->num_samples;
    return s->samples;
}
