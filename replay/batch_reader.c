/* batch_reader.c - the replay engine's reader side (batch_reader.h): per step, the trace's record
 * applied to the live request table and built into a self-contained batch (query_start_loc,
 * seq_lens, block table, content keys, slot_mapping, the cascade prefix, the fill list of context
 * tokens this run never wrote, the planted metadata faults), in a ring of AR_BATCH_SLOTS slots
 * that a thread of its own fills ahead of the step loop (or the step loop fills one at a time
 * under --no-overlap).  Slots keep their buffers, grown to the largest step.  Also the step
 * counter of the progress line. */
#include "batch_reader.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "../reference/cascade.h"
#include "../reference/datagen.h"
#include "../reference/dtype.h"
#include "db.h"
#include "watchdog.h"

int ar_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}


static void slot_free(ar_batch_slot *s)
{
    free(s->qsl); free(s->seq); free(s->ctx); free(s->qlens); free(s->table); free(s->stale);
    free(s->keys); free(s->req_keys); free(s->slots); free(s->bad_slots); free(s->ids);
    free(s->id_off); free(s->text); free(s->fill_slots); free(s->fill_keys); free(s->fill_offsets);
}

static int slot_reserve(ar_batch_slot *s, size_t reqs, size_t tokens, size_t table)
{
    size_t c;
    if (reqs + 1 > s->cap_reqs) {
        const size_t n = reqs + 1;
        c = s->cap_reqs; if (ar_grow((void **)&s->qsl, &c, n, sizeof(int))) return -1;
        c = s->cap_reqs; if (ar_grow((void **)&s->seq, &c, n, sizeof(int))) return -1;
        c = s->cap_reqs; if (ar_grow((void **)&s->ctx, &c, n, sizeof(int))) return -1;
        c = s->cap_reqs; if (ar_grow((void **)&s->qlens, &c, n, sizeof(int))) return -1;
        c = s->cap_reqs; if (ar_grow((void **)&s->req_keys, &c, n, sizeof(uint64_t))) return -1;
        c = s->cap_reqs; if (ar_grow((void **)&s->ids, &c, n, sizeof(char *))) return -1;
        c = s->cap_reqs; if (ar_grow((void **)&s->id_off, &c, n, sizeof(size_t))) return -1;
        s->cap_reqs = c;
    }
    if (tokens + 1 > s->cap_tokens) {
        const size_t n = tokens + 1;
        c = s->cap_tokens; if (ar_grow((void **)&s->slots, &c, n, sizeof(int64_t))) return -1;
        c = s->cap_tokens; if (ar_grow((void **)&s->bad_slots, &c, n, sizeof(int64_t))) return -1;
        s->cap_tokens = c;
    }
    if (table + 1 > s->cap_table) {
        const size_t n = table + 1;
        c = s->cap_table; if (ar_grow((void **)&s->table, &c, n, sizeof(int))) return -1;
        c = s->cap_table; if (ar_grow((void **)&s->stale, &c, n, sizeof(int))) return -1;
        c = s->cap_table; if (ar_grow((void **)&s->keys, &c, n, sizeof(uint64_t))) return -1;
        s->cap_table = c;
    }
    return 0;
}

static int slot_reserve_fill(ar_batch_slot *s, size_t n)
{
    if (n <= s->cap_fill) return 0;
    size_t c = s->cap_fill;
    if (ar_grow((void **)&s->fill_slots, &c, n, sizeof(int64_t))) return -1;
    c = s->cap_fill;
    if (ar_grow((void **)&s->fill_keys, &c, n, sizeof(uint64_t))) return -1;
    c = s->cap_fill;
    if (ar_grow((void **)&s->fill_offsets, &c, n, sizeof(int))) return -1;
    s->cap_fill = c;
    return 0;
}


/* Context tokens of the batch that no step of this run wrote: collected from the TRUE table. */
static int collect_fill(ar_batch_reader *r, ar_batch_slot *s)
{
    const int bs = r->cfg->block_size;
    const ar_batch *b = &s->b;
    int n = 0;
    for (int q = 0; q < b->num_reqs; q++) {
        int ctx = b->context_lens[q];
        for (int i = 0; i * bs < ctx; i++) {
            int blk = s->table[(size_t)q * b->max_blocks_per_req + i];
            int need = ctx - i * bs < bs ? ctx - i * bs : bs;
            if (r->written[blk] >= need) continue;
            if (slot_reserve_fill(s, (size_t)n + (size_t)(need - r->written[blk]))) return -1;
            for (int off = r->written[blk]; off < need; off++) {
                s->fill_slots[n] = (int64_t)blk * bs + off;
                s->fill_keys[n] = s->keys[(size_t)q * b->max_blocks_per_req + i];
                s->fill_offsets[n] = off;
                n++;
            }
            r->written[blk] = (uint16_t)need;
        }
    }
    s->fill_count = n;
    return 0;
}

/* The step's new tokens will be written by its forward. */
static void mark_written(ar_batch_reader *r, const ar_batch *b)
{
    const int bs = r->cfg->block_size;
    for (int q = 0; q < b->num_reqs; q++) {
        for (int p = b->context_lens[q]; p < b->seq_lens[q]; p++) {
            int blk = b->block_table[(size_t)q * b->max_blocks_per_req + p / bs];
            if (r->written[blk] < p % bs + 1) r->written[blk] = (uint16_t)(p % bs + 1);
        }
    }
}

/* The stale-block-table fault: each request's row as of the previous step; blocks it did not
 * hold then read as the null block 0.  Then remembers this step's rows for the next. */
static int stale_rows(ar_batch_reader *r, ar_batch_slot *s)
{
    const ar_batch *b = &s->b;
    memset(s->stale, 0, (size_t)b->num_reqs * b->max_blocks_per_req * sizeof(int));
    for (int q = 0; q < b->num_reqs; q++) {
        for (int j = 0; j < r->prev_count; j++) {
            if (strcmp(r->prev_text + r->prev_off[j], s->ids[q]) != 0) continue;
            int cols = r->prev_stride < b->max_blocks_per_req ? r->prev_stride : b->max_blocks_per_req;
            memcpy(s->stale + (size_t)q * b->max_blocks_per_req,
                   r->prev_table + (size_t)j * r->prev_stride, (size_t)cols * sizeof(int));
            break;
        }
    }
    size_t cells = (size_t)b->num_reqs * b->max_blocks_per_req, text = 0;
    for (int q = 0; q < b->num_reqs; q++) text += strlen(s->ids[q]) + 1;
    if (ar_grow((void **)&r->prev_table, &r->cap_prev_table, cells + 1, sizeof(int)) ||
        ar_grow((void **)&r->prev_text, &r->cap_prev_text, text + 1, 1) ||
        ar_grow((void **)&r->prev_off, &r->cap_prev_off, (size_t)b->num_reqs + 1, sizeof(size_t)))
        return -1;
    memcpy(r->prev_table, s->table, cells * sizeof(int));
    size_t at = 0;
    for (int q = 0; q < b->num_reqs; q++) {
        size_t len = strlen(s->ids[q]) + 1;
        memcpy(r->prev_text + at, s->ids[q], len);
        r->prev_off[q] = at;
        at += len;
    }
    r->prev_count = b->num_reqs;
    r->prev_stride = b->max_blocks_per_req;
    return 0;
}

/* Bytes and FLOPs of one layer of the step (DESIGN section 8). */
static void account(const ar_run_config *c, const ar_batch *b, int64_t *bytes, int64_t *flops)
{
    const ar_model *m = &c->model;
    int64_t kvs = ar_dtype_size(c->kv_dtype), ds = ar_dtype_size(c->dtype);
    int64_t by = 0, fl = 0;
    for (int r = 0; r < b->num_reqs; r++) {
        int n = b->query_start_loc[r + 1] - b->query_start_loc[r];
        int s = b->seq_lens[r], ctx = b->context_lens[r];
        int64_t keys_read = s;
        if (m->sliding_window > 0 && keys_read > m->sliding_window + n - 1)
            keys_read = m->sliding_window + n - 1;
        for (int i = 0; i < n; i++) {
            int64_t vis = ctx + i + 1;
            if (m->sliding_window > 0 && vis > m->sliding_window) vis = m->sliding_window;
            if (m->attention == AR_ATTN_MLA)
                fl += 2 * vis * m->num_q_heads * (int64_t)(m->kv_lora_rank + m->qk_rope_head_dim + m->kv_lora_rank);
            else
                fl += 4 * vis * m->num_q_heads * (int64_t)m->head_size;
        }
        if (m->attention == AR_ATTN_MLA) {
            by += keys_read * (int64_t)m->head_size * kvs;                       /* latent cache */
            by += (int64_t)n * m->num_q_heads * (m->qk_nope_head_dim + m->qk_rope_head_dim + m->v_head_dim) * ds;
            by += (int64_t)n * m->head_size * kvs;                               /* new latents */
        } else {
            by += keys_read * m->num_kv_heads * (int64_t)m->head_size * 2 * kvs;  /* K and V read once */
            by += (int64_t)n * m->num_q_heads * m->head_size * 2 * ds;            /* Q in, O out */
            by += (int64_t)n * m->num_kv_heads * m->head_size * 2 * kvs;          /* new K/V written */
        }
    }
    *bytes = by;
    *flops = fl;
}

/* Builds slot s for step st from the reader's live table.  Returns 0, or -1 (out of memory). */
static int build_batch(ar_batch_reader *r, const ar_step *st, ar_batch_slot *s)
{
    const ar_run_config *cfg = r->cfg;
    const int bs = cfg->block_size;
    int stride = 1, tokens = 0;
    size_t text = 0;
    for (int i = 0; i < st->num_scheduled; i++) {
        const ar_live_req *lr = ar_trace_find(r->rd, st->scheduled[i].req);
        if (lr && lr->num_blocks > stride) stride = lr->num_blocks;
        tokens += st->scheduled[i].num_tokens;
        text += strlen(st->scheduled[i].req) + 1;
    }
    const size_t reqs = (size_t)st->num_scheduled, cells = reqs * (size_t)stride;
    if (slot_reserve(s, reqs, (size_t)tokens, cells) || ar_grow((void **)&s->text, &s->cap_text, text + 1, 1))
        return -1;
    memset(s->table, 0, cells * sizeof(int));
    memset(s->keys, 0, cells * sizeof(uint64_t));
    int t = 0, max_q = 0, max_s = 0, prefill = 0;
    size_t at = 0;
    int64_t total_ctx = 0;
    s->qsl[0] = 0;
    for (int q = 0; q < st->num_scheduled; q++) {
        const ar_live_req *lr = ar_trace_find(r->rd, st->scheduled[q].req);
        int n = st->scheduled[q].num_tokens;
        size_t len = strlen(lr->req) + 1;
        memcpy(s->text + at, lr->req, len);
        s->id_off[q] = at;
        at += len;
        s->req_keys[q] = lr->req_key;
        s->ctx[q] = lr->num_computed_tokens;
        s->seq[q] = lr->num_computed_tokens + n;
        s->qsl[q + 1] = s->qsl[q] + n;
        s->qlens[q] = n;
        total_ctx += s->seq[q];
        if (n > max_q) max_q = n;
        if (s->seq[q] > max_s) max_s = s->seq[q];
        if (lr->num_computed_tokens < lr->prompt_len) prefill++;
        uint64_t prev = AR_ROOT_KEY;
        for (int i = 0; i < lr->num_blocks; i++) {
            s->table[(size_t)q * stride + i] = lr->block_ids[i];
            prev = ar_block_content_key(prev, lr->prompt_keys, lr->num_prompt_keys, lr->req_key, i);
            s->keys[(size_t)q * stride + i] = prev;
        }
        for (int i = 0; i < n; i++, t++) {
            int p = lr->num_computed_tokens + i;
            s->slots[t] = (int64_t)lr->block_ids[p / bs] * bs + p % bs;
        }
    }
    for (int q = 0; q < st->num_scheduled; q++) s->ids[q] = s->text + s->id_off[q];
    ar_batch *b = &s->b;
    memset(b, 0, sizeof *b);
    b->step = st->step;
    b->num_reqs = st->num_scheduled;
    b->num_tokens = tokens;
    b->query_start_loc = s->qsl;
    b->seq_lens = s->seq;
    b->context_lens = s->ctx;
    b->max_query_len = max_q;
    b->max_seq_len = max_s;
    b->max_blocks_per_req = stride;
    b->block_table = s->table;
    b->block_keys = s->keys;
    b->req_keys = s->req_keys;
    b->slot_mapping = s->slots;
    s->step = st->step;
    s->time = st->time;
    s->num_prefill = prefill;
    s->total_context = total_ctx;

    /* Cascade: P as vLLM derives it, then the mode. MLA never cascades (as in vLLM). */
    int P = ar_common_prefix_len(st->num_common_prefix_blocks, bs, s->ctx, b->num_reqs);
    bool use = false;
    if (P > 0 && cfg->model.attention == AR_ATTN_MHA && cfg->model.sliding_window == 0) {
        if (r->cascade_mode == 2) use = true;
        else if (r->cascade_mode == 1)
            use = ar_use_cascade(P, s->qlens, b->num_reqs, cfg->model.num_q_heads, cfg->model.num_kv_heads,
                                 false, AR_NUM_SMS_DEFAULT);
    }
    b->common_prefix_len = use ? P : 0;

    if (collect_fill(r, s) != 0) return -1;
    /* Metadata faults: what the kernels see differs from the truth the fill and verify use. */
    s->kb = *b;
    if (cfg->fault == AR_FAULT_WRONG_SLOT) {
        for (int i = 0; i < tokens; i++) s->bad_slots[i] = s->slots[i] < 0 ? -1 : (s->slots[i] ^ 1);
        s->kb.slot_mapping = s->bad_slots;
    }
    if (cfg->fault == AR_FAULT_STALE_BLOCK_TABLE) {
        if (stale_rows(r, s) != 0) return -1;
        s->kb.block_table = s->stale;
    }
    mark_written(r, b);
    account(cfg, b, &s->bytes, &s->flops);
    return 0;
}

/* Fills s with the next step to replay, or with the end (SLOT_END). */
static void produce(ar_batch_reader *r, ar_batch_slot *s)
{
    char err[AR_ERR_MAX];
    s->parse_s = s->build_s = 0;
    for (;;) {
        if (ar_stop_signalled()) {
            s->kind = SLOT_END;
            s->end_rc = -1;
            return;
        }
        const ar_step *st = NULL;
        double t0 = ar_mono_seconds();
        int rc = ar_trace_next(r->rd, &st, err, sizeof err);
        s->parse_s += ar_mono_seconds() - t0;
        if (rc <= 0) {
            s->kind = SLOT_END;
            s->end_rc = rc == 0 ? 0 : 2;
            snprintf(s->end_msg, sizeof s->end_msg, "%s", rc == 0 ? "" : err);
            return;
        }
        r->last_step_seen = st->step;
        if (st->step < r->step_first || st->step <= r->resume_after) continue;
        if (st->step > r->step_last) {
            s->kind = SLOT_END;
            s->end_rc = 0;
            s->end_msg[0] = '\0';
            return;
        }
        if (st->num_scheduled == 0) continue;   /* nothing to run: not a replayed step */
        t0 = ar_mono_seconds();
        rc = build_batch(r, st, s);
        s->build_s += ar_mono_seconds() - t0;
        if (rc != 0) {
            s->kind = SLOT_END;
            s->end_rc = 3;
            snprintf(s->end_msg, sizeof s->end_msg, "step %lld: out of memory building the batch",
                     (long long)st->step);
            return;
        }
        s->kind = SLOT_STEP;
        return;
    }
}

static void *reader_main(void *arg)
{
    ar_batch_reader *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        ar_batch_slot *s = &r->slots[r->next_fill];
        while (!r->stop && s->state != SLOT_FREE) pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop) break;
        pthread_mutex_unlock(&r->mu);
        produce(r, s);
        pthread_mutex_lock(&r->mu);
        s->state = SLOT_READY;
        r->next_fill = (r->next_fill + 1) % AR_BATCH_SLOTS;
        pthread_cond_broadcast(&r->cv);
        if (s->kind == SLOT_END) break;
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int ar_reader_start(ar_batch_reader *r, bool threaded, char *err, size_t err_len)
{
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->threaded = threaded;
    if (!threaded) return 0;
    int rc = pthread_create(&r->tid, NULL, reader_main, r);
    if (rc != 0) {
        snprintf(err, err_len, "cannot start the trace reader thread: %s", strerror(rc));
        return -1;
    }
    r->thread_started = true;
    return 0;
}

ar_batch_slot *ar_reader_take(ar_batch_reader *r, double *wait_s)
{
    ar_batch_slot *s = &r->slots[r->next_take];
    if (!r->threaded) {
        produce(r, s);
        s->state = SLOT_BUSY;
        return s;
    }
    double t0 = ar_mono_seconds();
    pthread_mutex_lock(&r->mu);
    while (s->state != SLOT_READY) pthread_cond_wait(&r->cv, &r->mu);
    s->state = SLOT_BUSY;
    pthread_mutex_unlock(&r->mu);
    *wait_s += ar_mono_seconds() - t0;
    return s;
}

void ar_reader_release(ar_batch_reader *r, ar_batch_slot *s)
{
    pthread_mutex_lock(&r->mu);
    s->state = SLOT_FREE;
    r->next_take = (r->next_take + 1) % AR_BATCH_SLOTS;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void ar_reader_finish(ar_batch_reader *r)
{
    if (r->thread_started) {
        pthread_mutex_lock(&r->mu);
        r->stop = true;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->tid, NULL);
        r->thread_started = false;
    }
    for (int i = 0; i < AR_BATCH_SLOTS; i++) slot_free(&r->slots[i]);
    free(r->written);
    free(r->prev_table);
    free(r->prev_text);
    free(r->prev_off);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

/* ---- counting the trace's steps (for the progress line) ----------------------------------- */

/* Lines after the header, read through zlib (plain or gzip).  -1 when unreadable or stopped. */
long long ar_count_trace_steps(const char *path, atomic_bool *stop)
{
    gzFile f = gzopen(path, "rb");
    if (!f) return -1;
    gzbuffer(f, 1 << 18);
    static const size_t chunk = 1 << 18;
    char *buf = malloc(chunk);
    if (!buf) {
        gzclose(f);
        return -1;
    }
    long long lines = 0;
    int n;
    char last = '\n';
    while ((n = gzread(f, buf, (unsigned)chunk)) > 0) {
        if (stop && atomic_load(stop)) {
            lines = -1;
            break;
        }
        for (const char *p = buf, *end = buf + n; (p = memchr(p, '\n', (size_t)(end - p))); p++) lines++;
        last = buf[n - 1];
    }
    if (n < 0) lines = -1;
    if (lines >= 0 && last != '\n') lines++;
    free(buf);
    gzclose(f);
    return lines > 0 ? lines - 1 : lines;
}

static void *counter_main(void *arg)
{
    ar_step_counter *c = arg;
    atomic_store(&c->steps, ar_count_trace_steps(c->path, &c->stop));
    return NULL;
}


void ar_step_counter_init(ar_step_counter *c)
{
    memset(c, 0, sizeof *c);
    atomic_init(&c->steps, -1);
    atomic_init(&c->stop, false);
}

void ar_step_counter_start(ar_step_counter *c, const char *path)
{
    c->path = path;
    c->started = pthread_create(&c->tid, NULL, counter_main, c) == 0;
}

void ar_step_counter_stop(ar_step_counter *c)
{
    if (!c->started) return;
    atomic_store(&c->stop, true);
    pthread_join(c->tid, NULL);
    c->started = false;
}
