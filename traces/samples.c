/* samples.c - writes the sample traces of traces/samples/ with a tiny deterministic scheduler.
 *
 * This is not the simulator of sim/: it is a small, fixed script of requests run through a
 * vLLM-V1-like loop, just enough to produce valid, interesting traces.  Two families share the
 * loop: the four "tiny-gqa" samples (one small model and cache, AR_NUM_SAMPLES), and the shape
 * samples (AR_NUM_SHAPE_SAMPLES) with real models' attention shapes (head sizes 64, 128 and 256,
 * GQA 1, 4 and 8, block sizes 16, 32 and 64, a shared-prefix trace for cascade, an MLA trace),
 * scripted so that together they exercise every default kernel path of the CUDA backends'
 * decision functions on an H200 (tests/gpu_coverage.c asserts it).  The loop:
 *   - running requests first (decode 1 token, or the next prefill chunk), then waiting ones in
 *     arrival order while the 256-token budget and 16 sequences allow (chunked prefill);
 *   - a block pool of 255 usable blocks (0 is the null block), freed blocks pushed on a stack so
 *     they are reused first; prefix caching: full prompt blocks are registered by content key
 *     once computed, and a new or resumed request takes the longest run of registered blocks
 *     (at most (num_tokens - 1) / block_size blocks, as vLLM) with their reference counts raised;
 *   - num_common_prefix_blocks as vLLM: blocks of running[0], counted from the start while
 *     every running request holds them;
 *   - a request samples one token when it has caught up with its tokens; it finishes when it
 *     has output_len tokens, frees its blocks and is listed in the next step's `finished`;
 *   - scripted preemption: at a given tick the last running request is preempted (blocks
 *     freed, recompute), held back a few ticks, then resumed with a full new block list.
 * Prompt tokens are synthetic; block keys are chained over them with ar_chain_key /
 * ar_tokens_payload, so requests that share the system prompt share keys (and blocks).
 * ar_samples_write creates DIR when missing (not its parents) and writes each sample to
 * NAME.tmp-PID there, renamed to NAME once whole: a run that fails (a full disk) or is stopped by
 * SIGINT, SIGTERM or SIGHUP leaves no part-written sample; the samples written before stay. */
#include "samples.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../reference/datagen.h"
#include "tmp_guard.h"
#include "trace.h"

#define SAMPLE_MAX_BLOCK_SIZE 64
#define SAMPLE_MAX_BLOCKS 2048     /* pool size limit, the null block included */
#define SAMPLE_MAX_REQS 128
#define SAMPLE_MAX_TOKENS 2048     /* prompt + output of one request */
#define SAMPLE_MAX_REQ_BLOCKS (SAMPLE_MAX_TOKENS / 16)
#define SAMPLE_TICK_MS 25
#define SAMPLE_HOLD_TICKS 3

/* A sample's model, cache and scheduler limits. */
typedef struct sample_shape {
    ar_model model;
    int block_size, num_blocks, budget, max_seqs;
} sample_shape;

/* The tiny-gqa samples': 2 layers, 8 q / 2 kv heads, head 64, block 16, 256 blocks, budget 256
 * tokens / 16 sequences. */
static const sample_shape tiny_gqa = {
    {.name = "tiny-gqa", .attention = AR_ATTN_MHA, .num_layers = 2, .num_q_heads = 8, .num_kv_heads = 2,
     .head_size = 64, .v_head_dim = 64, .scale = 0.125},
    16, 256, 256, 16};

/* One scripted request. */
typedef struct sample_spec {
    int arrival_tick;
    int shared_prefix_len;   /* leading tokens equal across requests of the sample */
    int prompt_len;
    int output_len;
} sample_spec;

typedef struct sample_req {
    char id[24];
    sample_spec spec;
    uint64_t keys[SAMPLE_MAX_REQ_BLOCKS];   /* content keys of the full prompt blocks */
    int num_keys;
    int num_tokens;          /* prompt + generated so far */
    int generated;
    int num_computed;
    int blocks[SAMPLE_MAX_REQ_BLOCKS];
    int num_blocks;
    bool waiting, running, done, ever_scheduled;
    int hold_until_tick;     /* a preempted request waits until this tick */
} sample_req;

typedef struct sample_sim {
    ar_trace_header header;
    int bs;                            /* block size */
    int num_blocks, budget, max_seqs;
    sample_req reqs[SAMPLE_MAX_REQS];
    int num_reqs;
    int running[SAMPLE_MAX_REQS];      /* request indices in running order */
    int num_running;
    int waiting[SAMPLE_MAX_REQS];      /* request indices in queue order */
    int num_waiting;
    int free_stack[SAMPLE_MAX_BLOCKS];
    int num_free;
    int ref_count[SAMPLE_MAX_BLOCKS];
    bool registered[SAMPLE_MAX_BLOCKS];
    uint64_t block_key[SAMPLE_MAX_BLOCKS];
    int finished_pending[SAMPLE_MAX_REQS];
    int num_finished_pending;
    int preempt_tick;                  /* -1: never */
} sample_sim;

static int32_t sample_token(uint64_t salt, int req_index, int pos, int shared_prefix_len)
{
    uint64_t who = pos < shared_prefix_len ? 0 : (uint64_t)req_index + 1;
    return (int32_t)(ar_mix64(salt ^ (who << 32) ^ (uint64_t)pos) % 50000u);
}

static void sim_init(sample_sim *sim, const sample_shape *shape, const char *source, uint64_t salt,
                     const sample_spec *specs, int n, int preempt_tick)
{
    memset(sim, 0, sizeof *sim);
    sim->bs = shape->block_size;
    sim->num_blocks = shape->num_blocks;
    sim->budget = shape->budget;
    sim->max_seqs = shape->max_seqs;
    ar_trace_header *h = &sim->header;
    h->version = AR_TRACE_VERSION;
    h->model = shape->model;
    h->cache.block_size = shape->block_size;
    h->cache.num_blocks = shape->num_blocks;
    h->cache.dtype = AR_BF16;
    h->cache.kv_cache_dtype = AR_BF16;
    h->sched.max_num_batched_tokens = shape->budget;
    h->sched.max_num_seqs = shape->max_seqs;
    h->sched.prefix_caching = true;
    h->sched.cascade = false;
    snprintf(h->source, sizeof h->source, "%s", source);
    h->seed = 1;
    /* the stack pops 1 first */
    for (int b = sim->num_blocks - 1; b >= 1; b--) sim->free_stack[sim->num_free++] = b;
    sim->num_reqs = n;
    sim->preempt_tick = preempt_tick;
    for (int i = 0; i < n; i++) {
        sample_req *r = &sim->reqs[i];
        snprintf(r->id, sizeof r->id, "%s-%d", source, i);
        r->spec = specs[i];
        r->num_tokens = specs[i].prompt_len;
        r->num_keys = specs[i].prompt_len / sim->bs;
        int32_t tokens[SAMPLE_MAX_BLOCK_SIZE];
        uint64_t prev = AR_ROOT_KEY;
        for (int k = 0; k < r->num_keys; k++) {
            for (int t = 0; t < sim->bs; t++)
                tokens[t] = sample_token(salt, i, k * sim->bs + t, specs[i].shared_prefix_len);
            prev = ar_chain_key(prev, ar_tokens_payload(tokens, sim->bs));
            r->keys[k] = prev;
        }
    }
}

static int pop_block(sample_sim *sim)
{
    if (sim->num_free == 0) return -1;
    int b = sim->free_stack[--sim->num_free];
    sim->ref_count[b] = 1;
    sim->registered[b] = false;
    return b;
}

static void free_blocks(sample_sim *sim, sample_req *r)
{
    for (int i = r->num_blocks - 1; i >= 0; i--) {   /* tail first, as vLLM */
        int b = r->blocks[i];
        if (--sim->ref_count[b] == 0) {
            sim->registered[b] = false;
            sim->free_stack[sim->num_free++] = b;
        }
    }
    r->num_blocks = 0;
}

static int find_registered(const sample_sim *sim, uint64_t key)
{
    for (int b = 1; b < sim->num_blocks; b++)
        if (sim->registered[b] && sim->ref_count[b] > 0 && sim->block_key[b] == key) return b;
    return 0;
}

/* Grows r's block list to cover `tokens` tokens.  Returns 0, or -1 when the pool is empty. */
static int cover(sample_sim *sim, sample_req *r, int tokens)
{
    int need = (tokens + sim->bs - 1) / sim->bs;
    while (r->num_blocks < need) {
        if (r->num_blocks >= SAMPLE_MAX_REQ_BLOCKS) return -1;
        int b = pop_block(sim);
        if (b < 0) return -1;
        r->blocks[r->num_blocks++] = b;
    }
    return 0;
}

static void remove_index(int *v, int *n, int pos)
{
    memmove(v + pos, v + pos + 1, (size_t)(*n - pos - 1) * sizeof *v);
    (*n)--;
}

/* Runs the script and writes the trace, gzipped, to path. */
static int sim_run(sample_sim *sim, const char *path, char *err, size_t err_len)
{
    ar_trace_writer *w = ar_trace_create_as(path, true, &sim->header, err, err_len);
    if (!w) return -1;
    ar_new_req new_reqs[SAMPLE_MAX_REQS];
    ar_cached_req cached[SAMPLE_MAX_REQS];
    ar_sched_entry sched[SAMPLE_MAX_REQS];
    char *finished[SAMPLE_MAX_REQS], *preempted[SAMPLE_MAX_REQS];
    int sched_req[SAMPLE_MAX_REQS];
    int64_t step_no = 0;
    int rc = 0;
    for (int tick = 0; tick < 1000 && rc == 0; tick++) {
        bool all_done = true;
        for (int i = 0; i < sim->num_reqs; i++) all_done = all_done && sim->reqs[i].done;
        if (all_done) break;
        /* arrivals join the waiting queue */
        for (int i = 0; i < sim->num_reqs; i++)
            if (sim->reqs[i].spec.arrival_tick == tick) {
                sim->reqs[i].waiting = true;
                sim->waiting[sim->num_waiting++] = i;
            }
        ar_step s;
        memset(&s, 0, sizeof s);
        s.step = step_no;
        s.time = (double)(tick * SAMPLE_TICK_MS) / 1000.0;   /* exact decimal milliseconds */
        s.new_reqs = new_reqs;
        s.cached = cached;
        s.scheduled = sched;
        s.finished = finished;
        s.preempted = preempted;
        for (int i = 0; i < sim->num_finished_pending; i++)
            finished[s.num_finished++] = sim->reqs[sim->finished_pending[i]].id;

        /* scripted preemption of the last running request (recompute) */
        if (tick == sim->preempt_tick && sim->num_running > 0) {
            int v = sim->running[--sim->num_running];
            sample_req *r = &sim->reqs[v];
            free_blocks(sim, r);
            r->running = false;
            r->waiting = true;
            r->num_computed = 0;
            r->hold_until_tick = tick + SAMPLE_HOLD_TICKS;
            memmove(sim->waiting + 1, sim->waiting, (size_t)sim->num_waiting * sizeof *sim->waiting);
            sim->waiting[0] = v;
            sim->num_waiting++;
            preempted[s.num_preempted++] = r->id;
        }

        int budget = sim->budget;
        for (int k = 0; k < sim->num_running && budget > 0; k++) {
            sample_req *r = &sim->reqs[sim->running[k]];
            int n = r->num_tokens - r->num_computed;
            if (n > budget) n = budget;
            int old_blocks = r->num_blocks;
            if (cover(sim, r, r->num_computed + n) != 0) { rc = -1; break; }
            ar_cached_req *c = &cached[s.num_cached++];
            c->req = r->id;
            c->num_computed_tokens = r->num_computed;
            c->new_block_ids = r->blocks + old_blocks;
            c->num_new_block_ids = r->num_blocks - old_blocks;
            c->resumed = false;
            sched_req[s.num_scheduled] = sim->running[k];
            sched[s.num_scheduled].req = r->id;
            sched[s.num_scheduled++].num_tokens = n;
            budget -= n;
        }
        if (s.num_preempted == 0) {
            for (int k = 0; k < sim->num_waiting && rc == 0; k++) {
                if (budget == 0 || sim->num_running >= sim->max_seqs) break;
                int idx = sim->waiting[k];
                sample_req *r = &sim->reqs[idx];
                if (r->hold_until_tick > tick) continue;
                /* prefix-cache lookup: the longest run of registered full blocks */
                int max_hit = (r->num_tokens - 1) / sim->bs;
                if (max_hit > r->num_keys) max_hit = r->num_keys;
                r->num_blocks = 0;
                for (int b = 0; b < max_hit; b++) {
                    int blk = find_registered(sim, r->keys[b]);
                    if (!blk) break;
                    sim->ref_count[blk]++;
                    r->blocks[r->num_blocks++] = blk;
                }
                r->num_computed = r->num_blocks * sim->bs;
                int n = r->num_tokens - r->num_computed;
                if (n > budget) n = budget;
                if (cover(sim, r, r->num_computed + n) != 0) { rc = -1; break; }
                if (!r->ever_scheduled) {
                    ar_new_req *nr = &new_reqs[s.num_new++];
                    nr->req = r->id;
                    nr->prompt_len = r->spec.prompt_len;
                    nr->num_computed_tokens = r->num_computed;
                    nr->block_ids = r->blocks;
                    nr->num_block_ids = r->num_blocks;
                    nr->block_keys = r->keys;
                    nr->num_block_keys = r->num_keys;
                } else {
                    ar_cached_req *c = &cached[s.num_cached++];
                    c->req = r->id;
                    c->num_computed_tokens = r->num_computed;
                    c->new_block_ids = r->blocks;
                    c->num_new_block_ids = r->num_blocks;
                    c->resumed = true;
                }
                r->ever_scheduled = true;
                r->waiting = false;
                r->running = true;
                sim->running[sim->num_running++] = idx;
                remove_index(sim->waiting, &sim->num_waiting, k);
                k--;
                sched_req[s.num_scheduled] = idx;
                sched[s.num_scheduled].req = r->id;
                sched[s.num_scheduled++].num_tokens = n;
                budget -= n;
            }
        }
        if (rc != 0) {
            snprintf(err, err_len, "%s: sample generator ran out of blocks at tick %d", path, tick);
            break;
        }
        /* idle tick: no step (requests finished meanwhile are listed by the next real step) */
        if (s.num_scheduled == 0 && s.num_preempted == 0) continue;

        if (sim->num_running > 0) {
            const sample_req *first = &sim->reqs[sim->running[0]];
            int common = 0;
            while (common < first->num_blocks && sim->ref_count[first->blocks[common]] == sim->num_running) common++;
            s.num_common_prefix_blocks = common;
        }
        if (ar_trace_write_step(w, &s, err, err_len) != 0) { rc = -1; break; }
        step_no++;
        sim->num_finished_pending = 0;

        /* after the step: advance, sample, register full prompt blocks, finish */
        for (int k = 0; k < s.num_scheduled; k++) {
            sample_req *r = &sim->reqs[sched_req[k]];
            r->num_computed += sched[k].num_tokens;
            for (int b = 0; b < r->num_keys && (b + 1) * sim->bs <= r->num_computed; b++) {
                int blk = r->blocks[b];
                if (!sim->registered[blk] && !find_registered(sim, r->keys[b])) {
                    sim->registered[blk] = true;
                    sim->block_key[blk] = r->keys[b];
                }
            }
            if (r->num_computed >= r->num_tokens) {
                r->generated++;
                r->num_tokens++;
                if (r->generated >= r->spec.output_len) {
                    free_blocks(sim, r);
                    r->running = false;
                    r->done = true;
                    for (int j = 0; j < sim->num_running; j++)
                        if (sim->running[j] == sched_req[k]) { remove_index(sim->running, &sim->num_running, j); break; }
                    sim->finished_pending[sim->num_finished_pending++] = sched_req[k];
                }
            }
        }
    }
    if (rc != 0) {
        char ignore[AR_ERR_MAX];
        ar_trace_finish(w, ignore, sizeof ignore);
        return -1;
    }
    return ar_trace_finish(w, err, err_len);
}

/* ---- the four samples ------------------------------------------------------------------------- */

static const sample_spec mixed_specs[] = {
    {0, 0, 60, 12}, {0, 0, 37, 20}, {3, 0, 120, 10}, {5, 0, 45, 15}, {9, 0, 90, 12}, {12, 0, 30, 14},
};

static const sample_spec chunked_specs[] = {
    {0, 0, 40, 24}, {0, 0, 25, 26}, {2, 0, 700, 8}, {6, 0, 50, 10},
};

#define SYSTEM_PROMPT 320
static const sample_spec prefix_specs[] = {
    {0, SYSTEM_PROMPT, 350, 24}, {2, SYSTEM_PROMPT, 341, 20}, {3, SYSTEM_PROMPT, 362, 20},
    {4, SYSTEM_PROMPT, 333, 20}, {5, SYSTEM_PROMPT, 357, 18}, {6, SYSTEM_PROMPT, 345, 18},
    {7, SYSTEM_PROMPT, 370, 16}, {8, SYSTEM_PROMPT, 338, 16}, {9, SYSTEM_PROMPT, 352, 14},
    {10, SYSTEM_PROMPT, 366, 14}, {11, SYSTEM_PROMPT, 329, 12}, {12, SYSTEM_PROMPT, 347, 12},
};

static const sample_spec preempt_specs[] = {
    {0, 0, 48, 20}, {0, 0, 64, 20}, {1, 0, 80, 24}, {2, 0, 33, 20},
};

/* ---- the shape samples ------------------------------------------------------------------------ */

/* Models as vLLM sees them on one GPU (tensor-parallel shards where the model is larger). */
#define MHA_MODEL(nm, hq, hkv, d) \
    {.name = nm, .attention = AR_ATTN_MHA, .num_layers = 2, .num_q_heads = hq, .num_kv_heads = hkv, \
     .head_size = d, .v_head_dim = d, .scale = SCALE_##d}
#define SCALE_64 0.125
#define SCALE_128 0.08838834764831845
#define SCALE_256 0.0625

/* Llama-3.1-8B (32 q / 8 kv heads, head 128, GQA 4), block 16. */
static const sample_shape llama_8b = {MHA_MODEL("llama-3.1-8b", 32, 8, 128), 16, 1024, 256, 128};
/* Llama-3.1-70B on 8-way tensor parallelism: 8 q / 1 kv heads per GPU (GQA 8), head 128, block 32. */
static const sample_shape llama_70b_tp8 = {MHA_MODEL("llama-3.1-70b-tp8", 8, 1, 128), 32, 256, 512, 16};
/* Gemma-7B (16 q / 16 kv heads, head 256, GQA 1), block 64. */
static const sample_shape gemma_7b = {MHA_MODEL("gemma-7b", 16, 16, 256), 64, 128, 512, 16};
/* Llama-3.2-1B (32 q / 8 kv heads, head 64, GQA 4), block 32. */
static const sample_shape llama_1b = {MHA_MODEL("llama-3.2-1b", 32, 8, 64), 32, 256, 512, 16};
/* DeepSeek-V3 on 16-way tensor parallelism: 8 of its 128 heads per GPU, MLA (latent 512, rope 64,
 * nope 128, v 128, scale 192^-0.5 x mscale^2), FlashMLA's block 64. */
static const sample_shape deepseek_tp16 = {
    {.name = "deepseek-v3-tp16", .attention = AR_ATTN_MLA, .num_layers = 2, .num_q_heads = 8, .num_kv_heads = 1,
     .head_size = 576, .kv_lora_rank = 512, .qk_rope_head_dim = 64, .qk_nope_head_dim = 128, .v_head_dim = 128,
     .scale = 0.1352338},
    64, 256, 256, 16};

/* Spec lists too long to write out: made by formula into a static table. */
static sample_spec made_specs[SAMPLE_MAX_REQS];

/* Llama-3.1-8B: 72 short requests arriving over 4 ticks (18 a tick) beside two long prompts, so
 * that after the prefills 74 requests decode together (DECODE_TMA takes a flat decode batch of at
 * least 0.48 x the H200's 132 SMs requests, 64), then fewer as they finish (the mma.sync DECODE
 * kernel, split when few CTAs are left: the two long requests decode alone at the end); a third
 * long prompt arrives late, alone, so its later chunks run the wgmma prefill kernel split-KV over a
 * long context; last, two short requests alone (single-tile launches, never split). */
static int llama_8b_specs(const sample_spec **out)
{
    int n = 0;
    for (int i = 0; i < 72; i++) made_specs[n++] = (sample_spec){i / 18, 0, 24 + (i * 13) % 24, 28 + (i * 7) % 12};
    made_specs[n++] = (sample_spec){0, 0, 880, 64};
    made_specs[n++] = (sample_spec){0, 0, 900, 72};
    made_specs[n++] = (sample_spec){70, 0, 1000, 4};
    made_specs[n++] = (sample_spec){95, 0, 30, 20};
    made_specs[n++] = (sample_spec){95, 0, 24, 16};
    *out = made_specs;
    return n;
}

/* Shared prefix (cascade) on Llama-3.1-8B: one request computes a 512-token system prompt, then 72
 * more hit it in the prefix cache (32 shared blocks): 8 with long questions (560-700 tokens, so
 * their own keys outweigh the shared ones in the LSE merge), then 64 short ones; they prefill their
 * questions and decode together: cascade steps whose suffix pass is a decode batch of >= 66
 * requests (DECODE_TMA) and whose prefix pass is split over 512 keys (its combine folded into the
 * suffix pass), and prefill steps whose suffix pass is a prefill. */
static int cascade_specs(const sample_spec **out)
{
    int n = 0;
    made_specs[n++] = (sample_spec){0, 512, 530, 48};
    for (int i = 0; i < 8; i++) made_specs[n++] = (sample_spec){2, 512, 1072 + i * 20, 60};
    for (int i = 0; i < 64; i++) made_specs[n++] = (sample_spec){3, 512, 528 + (i * 11) % 24, 24 + (i * 5) % 8};
    *out = made_specs;
    return n;
}

/* The MHA shapes below: a few requests with contexts of a few hundred tokens (split launches: few
 * CTAs), then two short ones alone (launches of one key tile: never split). */
static const sample_spec llama_70b_specs[] = {
    {0, 0, 600, 20}, {0, 0, 230, 24}, {1, 0, 410, 18}, {2, 0, 120, 30}, {6, 0, 700, 12}, {9, 0, 64, 20},
    {45, 0, 30, 16}, {45, 0, 20, 18},
};

static const sample_spec gemma_specs[] = {
    {0, 0, 520, 16}, {0, 0, 150, 20}, {1, 0, 330, 14}, {3, 0, 610, 10}, {8, 0, 96, 18}, {10, 0, 260, 12},
    {40, 0, 28, 14}, {40, 0, 20, 16},
};

static const sample_spec llama_1b_specs[] = {
    {0, 0, 480, 16}, {0, 0, 100, 22}, {1, 0, 260, 18}, {2, 0, 700, 12}, {5, 0, 150, 20}, {5, 0, 40, 24},
    {9, 0, 330, 14}, {12, 0, 90, 16}, {45, 0, 40, 20}, {45, 0, 30, 20},
};

/* DeepSeek-V3 (8 heads a GPU): prompts over 128 tokens take the MLA prefill path (the 600- and
 * 700-token ones are chunked by the budget, so their later chunks gather context), prompts of at
 * most 128 the absorbed path with 8 x query rows (the wgmma kernel from 16 rows), and decodes have 8
 * rows (the narrow bulk kernel); few requests, so the latent attention splits; last, two short
 * requests alone (launches too short to split). */
static const sample_spec deepseek_specs[] = {
    {0, 0, 600, 12}, {0, 0, 90, 16}, {1, 0, 40, 20}, {2, 0, 300, 10}, {4, 0, 700, 8}, {6, 0, 120, 14},
    {11, 0, 24, 10}, {30, 0, 100, 4}, {40, 0, 16, 10},
};

typedef struct sample_def {
    const char *file;
    const char *source;
    uint64_t salt;
    const sample_shape *shape;
    const sample_spec *specs;
    int num_specs;
    int (*make_specs)(const sample_spec **out);   /* instead of specs when set */
    int preempt_tick;
} sample_def;

#define SPECS(a) a, (int)(sizeof a / sizeof a[0]), NULL

static const sample_def sample_defs[AR_NUM_SAMPLES + AR_NUM_SHAPE_SAMPLES] = {
    {"mixed.trace.jsonl.gz", "mixed", 0x6d69786564ull, &tiny_gqa, SPECS(mixed_specs), -1},
    {"chunked.trace.jsonl.gz", "chunked", 0x6368756e6bull, &tiny_gqa, SPECS(chunked_specs), -1},
    {"prefix.trace.jsonl.gz", "prefix", 0x707265666978ull, &tiny_gqa, SPECS(prefix_specs), -1},
    {"preempt.trace.jsonl.gz", "preempt", 0x707265656d70ull, &tiny_gqa, SPECS(preempt_specs), 8},
    /* the shape samples */
    {"llama-3.1-8b.trace.jsonl.gz", "llama8b", 0x6c6c616d6138ull, &llama_8b, NULL, 0, llama_8b_specs, -1},
    {"llama-3.1-8b-cascade.trace.jsonl.gz", "casc", 0x63617363ull, &llama_8b, NULL, 0, cascade_specs, -1},
    {"llama-3.1-70b-tp8.trace.jsonl.gz", "llama70b", 0x6c6c37306bull, &llama_70b_tp8, SPECS(llama_70b_specs), -1},
    {"gemma-7b.trace.jsonl.gz", "gemma", 0x67656d6d61ull, &gemma_7b, SPECS(gemma_specs), -1},
    {"llama-3.2-1b.trace.jsonl.gz", "llama1b", 0x6c6c316bull, &llama_1b, SPECS(llama_1b_specs), -1},
    {"deepseek-v3-tp16.trace.jsonl.gz", "dsv3", 0x64737633ull, &deepseek_tp16, SPECS(deepseek_specs), -1},
};

const char *ar_sample_name(int i)
{
    return i >= 0 && i < AR_NUM_SAMPLES ? sample_defs[i].file : NULL;
}

const char *ar_shape_sample_name(int i)
{
    return i >= 0 && i < AR_NUM_SHAPE_SAMPLES ? sample_defs[AR_NUM_SAMPLES + i].file : NULL;
}

/* ---- writing them ------------------------------------------------------------------------ */

/* dir, created when missing (not its parents); 0, or -1 with err set. */
static int sample_dir(const char *dir, char *err, size_t err_len)
{
    struct stat st;
    if (!*dir) {
        snprintf(err, err_len, "DIR is empty (give a directory; '.' for this one)");
        return -1;
    }
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT || mkdir(dir, 0777) != 0) {
            snprintf(err, err_len, "%s: cannot create the directory: %s", dir, strerror(errno));
            return -1;
        }
    } else if (!S_ISDIR(st.st_mode)) {
        snprintf(err, err_len, "%s: not a directory", dir);
        return -1;
    }
    return 0;
}

int ar_samples_write(const char *dir, char *err, size_t err_len)
{
    if (sample_dir(dir, err, err_len) != 0) return -1;
    sample_sim *sim = malloc(sizeof *sim);
    if (!sim) {
        snprintf(err, err_len, "%s: out of memory for the sample generator", dir);
        return -1;
    }
    /* each sample goes to NAME.tmp-PID and is renamed to NAME once whole, so a failed or killed
     * run leaves no part-written sample (SIGINT, SIGTERM and SIGHUP remove the one in progress) */
    int rc = 0;
    for (int i = 0; i < AR_NUM_SAMPLES + AR_NUM_SHAPE_SAMPLES && rc == 0; i++) {
        const sample_def *d = &sample_defs[i];
        char path[4096];
        int n = snprintf(path, sizeof path, "%s/%s", dir, d->file);
        if (n < 0 || (size_t)n >= sizeof path) {
            snprintf(err, err_len, "%s: directory name too long", dir);
            rc = -1;
            break;
        }
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
        ar_tmp_guard guard;
        ar_tmp_guard_arm(&guard, tmp);
        const sample_spec *specs = d->specs;
        int num_specs = d->make_specs ? d->make_specs(&specs) : d->num_specs;
        sim_init(sim, d->shape, d->source, d->salt, specs, num_specs, d->preempt_tick);
        rc = sim_run(sim, tmp, err, err_len);
        if (ar_tmp_guard_finish(&guard, rc == 0 ? path : NULL) != 0) {
            snprintf(err, err_len, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
            rc = -1;
        }
    }
    free(sim);
    return rc;
}
