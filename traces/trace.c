/* trace.c - trace format v1 (DESIGN section 3): the streaming reader with full validation,
 * the live-request table and ar_block_content_key (the writer is in trace_write.c).
 *
 * Reading.  zlib's gz API reads both plain and gzip files; lines of any length are read into
 * a growing buffer; every line is parsed by jansson (duplicate object keys rejected).  A corrupt
 * or truncated gzip stream is reported as "PATH:LINE: corrupt or truncated gzip".  Blank lines
 * are skipped but counted.  Nothing grows with the length of the trace except the live table.
 *
 * Step semantics (mirrors vLLM's SchedulerOutput and the model runner's _update_states):
 *   1. `finished` ids are dropped first: vLLM lists requests that finished since the previous
 *      step.  A finished id must be live or preempted-and-waiting and not scheduled now.
 *   2. `new` requests are inserted with their whole block list (prefix hits first);
 *      `cached` requests get `new_block_ids` appended, or, with "resumed": true, replacing
 *      the list (only a preempted request may resume, and a preempted one must resume).
 *      num_computed_tokens is set to the step's value (the value before this step's tokens).
 *   3. `preempted` ids are removed from the live table at the end of the step that lists
 *      them (they must be live and not scheduled in it); their blocks are dropped and the
 *      request is remembered (prompt length, and the content keys the trace gave; private keys
 *      are made again from the id) until it resumes or finishes.
 * The whole step is validated against the state left by the previous steps before anything is
 * applied, so a rejected step leaves the reader exactly as it was.
 *
 * Content keys of a new request's full prompt blocks (prompt_len / block_size of them) come
 * from "block_keys" (16-hex-digit strings), or are chained from "prompt_token_ids" with
 * ar_chain_key over ar_tokens_payload of each full block starting at AR_ROOT_KEY, or, when
 * neither is given, are request-private: key(i) = ar_chain_key(key(i-1),
 * ar_private_payload(ar_req_key(id), i)) from AR_ROOT_KEY, so no two requests share them.
 *
 * Optional fields: header model.attention ("mha"), scale (1/sqrt(head_size); MLA
 * 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)), sliding_window and logits_soft_cap (0),
 * cache.kv_cache_dtype ("auto" = dtype), scheduler.prefix_caching (true) and cascade (false),
 * source (""), seed (0; a decimal string is accepted for seeds above 2^63 - 1); MLA headers may
 * omit num_kv_heads (1) and head_size (kv_lora_rank + qk_rope_head_dim).  Step fields
 * num_common_prefix_blocks (0), finished and preempted ([]), cached[].new_block_ids ([]) and
 * resumed (false).  Unknown fields are ignored: the format may grow.
 *
 * Rules checked (each has its own message; the error reads "PATH:LINE: <rule ...>"):
 *   bad JSON / a line that is not one object / duplicate keys in an object; missing or
 *   wrong-typed field; header format and version; header numbers out of range (layers, heads,
 *   head_size, num_q_heads a multiple of num_kv_heads, block_size >= 1, num_blocks >= 2, dtype
 *   names, MLA dims); step numbers consecutive from 0; time non-decreasing; a new id already
 *   live (or preempted: it must resume); a cached id not live, resumed without preemption, or
 *   preempted but not resumed; duplicate ids in new+cached, num_scheduled_tokens, finished,
 *   preempted; num_scheduled_tokens keys exactly new U cached, each n >= 1; sum of n <=
 *   max_num_batched_tokens, number scheduled <= max_num_seqs; block ids in [1, num_blocks);
 *   a block list covering num_computed_tokens + n; no block twice in one request's list;
 *   num_computed_tokens of a cached, not resumed request = its previous value + previous n;
 *   new + cached requests <= max_num_seqs (counted before any is parsed); the full prompt
 *   blocks of a step's new requests together <= AR_TRACE_MAX_STEP_KEYS (2^24, checked before
 *   their keys are made); the keys the trace spells out (block_keys, prompt_token_ids) for the
 *   live and preempted requests together <= AR_TRACE_MAX_GIVEN_KEYS (2^25); a new request:
 *   1 <= prompt_len <= (num_blocks - 1) * block_size
 *   (the cache holds the whole prompt, as vLLM requires), 0 <= num_computed_tokens <
 *   prompt_len, num_computed a multiple of block_size, num_computed + n <= prompt_len,
 *   block_keys count = prompt_len /
 *   block_size and 16 hex digits each, prompt_token_ids count = prompt_len; finished and
 *   preempted ids live and not scheduled in the step; 0 <= num_common_prefix_blocks <= the
 *   fewest blocks held by a scheduled request (by a live one when none is scheduled);
 *   block ownership: a block a live request holds is handed to another request only as a
 *   prefix hit on the same content key, and two claims of one step on a free block agree on
 *   its content and hand it out fresh at most once (see "block ownership" below);
 *   corrupt or truncated gzip (complete lines before a cut are still read).
 *
 * Writing is trace_write.c's. */
#include "trace.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>
#include <libdeflate.h>
#include <pthread.h>
#include <unistd.h>
#include <zlib.h>

#include "../reference/datagen.h"
#include "step_arena.h"

#define AR_MAX_HEADS 1024
#define AR_MAX_HEAD_SIZE 1024
#define AR_MAX_LAYERS 1024
#define AR_MAX_BLOCK_SIZE AR_TRACE_MAX_BLOCK_SIZE
#define AR_MAX_NUM_BLOCKS AR_TRACE_MAX_NUM_BLOCKS
#define AR_MAX_TOKENS_PER_REQ AR_TRACE_MAX_TOKENS

/* ---- small helpers ---------------------------------------------------------------------- */

static void set_err(char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t err_len, const char *fmt, ...)
{
    if (!err || err_len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* ---- the live-request table --------------------------------------------------------------- */

typedef struct live_entry {
    ar_live_req pub;          /* what ar_trace_find returns; pointers refreshed on change */
    char *id;
    int *blocks;              /* [num_blocks] */
    int num_blocks, cap_blocks;
    uint64_t *keys;           /* [num_keys] content keys of the full prompt blocks (see below) */
    int num_keys, cap_keys;
    int prompt_blocks;        /* full prompt blocks: prompt_len / block_size */
    bool private_keys;        /* keys made from the id (neither block_keys nor prompt_token_ids) */
    int prompt_len;
    int num_computed;
    int64_t expected_computed;  /* num_computed + n of the last step that scheduled it */
    uint64_t last_key;        /* content key of its last block (chained on when blocks are appended) */
    bool preempted;           /* waiting to resume; not in the live order */
    int order;                /* index in the live order, -1 when preempted */
} live_entry;

/* Keys kept.  Keys the trace gave (block_keys, or chained from prompt_token_ids) are kept whole,
 * num_keys = prompt_blocks, until the request finishes: they are as many as the trace spelled
 * out, together at most max_given_keys (AR_TRACE_MAX_GIVEN_KEYS).  Request-private keys are a
 * function of the id, and ar_block_content_key chains past a
 * request's prompt keys by the same rule that made them, so only those of the blocks it holds
 * are kept: num_keys = min(prompt_blocks, num_blocks), grown as blocks are appended, none while
 * it is preempted, remade from its id when it resumes.  Every content key the reader or a
 * consumer chains from block 0 is the same either way; what is held stays proportional to the
 * block ids the trace lists, not to prompt_len (which costs the trace a few bytes). */

typedef struct live_table {
    live_entry **slots;       /* [cap] open addressing by id, NULL = empty */
    size_t cap, count;        /* count = live + preempted */
    live_entry **order;       /* [num_live] live requests in the order they became live */
    int num_live, cap_order;
} live_table;

static size_t live_slot(const live_table *t, const char *id)
{
    size_t mask = t->cap - 1, i = (size_t)ar_fnv1a(id) & mask;
    while (t->slots[i] && strcmp(t->slots[i]->id, id) != 0) i = (i + 1) & mask;
    return i;
}

static live_entry *live_get(const live_table *t, const char *id)
{
    if (t->cap == 0) return NULL;
    return t->slots[live_slot(t, id)];
}

static int live_grow(live_table *t)
{
    size_t ncap = t->cap ? t->cap * 2 : 256;
    live_entry **ns = calloc(ncap, sizeof *ns);
    if (!ns) return -1;
    live_entry **old = t->slots;
    size_t ocap = t->cap;
    t->slots = ns;
    t->cap = ncap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i]) t->slots[live_slot(t, old[i]->id)] = old[i];
    free(old);
    return 0;
}

static int live_insert(live_table *t, live_entry *e)
{
    if ((t->count + 1) * 2 > t->cap && live_grow(t) != 0) return -1;
    t->slots[live_slot(t, e->id)] = e;
    t->count++;
    return 0;
}

/* Removes e from the hash (backward-shift deletion keeps probe chains intact). */
static void live_unhash(live_table *t, live_entry *e)
{
    size_t mask = t->cap - 1, i = live_slot(t, e->id);
    t->slots[i] = NULL;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!t->slots[j]) break;
        size_t home = (size_t)ar_fnv1a(t->slots[j]->id) & mask;
        /* can slot j's entry move to i?  yes when home is cyclically outside (i, j] */
        bool in_range = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!in_range) {
            t->slots[i] = t->slots[j];
            t->slots[j] = NULL;
            i = j;
        }
    }
    t->count--;
}

static int order_push(live_table *t, live_entry *e)
{
    if (t->num_live == t->cap_order) {
        int ncap = t->cap_order ? t->cap_order * 2 : 64;
        live_entry **no = ar_xrealloc_array(t->order, (size_t)ncap, sizeof *no);
        if (!no) return -1;
        t->order = no;
        t->cap_order = ncap;
    }
    e->order = t->num_live;
    t->order[t->num_live++] = e;
    return 0;
}

static void order_remove(live_table *t, live_entry *e)
{
    int i = e->order;
    if (i < 0) return;
    memmove(t->order + i, t->order + i + 1, (size_t)(t->num_live - i - 1) * sizeof *t->order);
    t->num_live--;
    for (int k = i; k < t->num_live; k++) t->order[k]->order = k;
    e->order = -1;
}

/* The number of keys e keeps for nblocks held blocks (see "Keys kept"). */
static int keys_wanted(const live_entry *e, int nblocks)
{
    if (!e->private_keys) return e->prompt_blocks;
    return nblocks < e->prompt_blocks ? nblocks : e->prompt_blocks;
}

/* Room for n <= prompt_blocks keys (at least one): exactly n at first, then doubling up to
 * prompt_blocks as a private-key entry's blocks grow; -1 when out of memory (e unchanged). */
static int keys_reserve(live_entry *e, int n)
{
    if (e->keys && n <= e->cap_keys) return 0;
    int ncap = n > 1 ? n : 1;
    if (e->keys) {
        int twice = e->cap_keys > INT32_MAX / 2 ? INT32_MAX : 2 * e->cap_keys;
        if (twice > e->prompt_blocks) twice = e->prompt_blocks;
        if (twice > ncap) ncap = twice;
    }
    uint64_t *nk = ar_xrealloc_array(e->keys, (size_t)ncap, sizeof *nk);
    if (!nk) return -1;
    e->keys = nk;
    e->cap_keys = ncap;
    return 0;
}

/* Makes a private-key entry's keys up to keys_wanted(e, e->num_blocks), chained from the last
 * one kept (room reserved before). */
static void keys_fill(live_entry *e)
{
    if (!e->private_keys) return;
    int want = keys_wanted(e, e->num_blocks);
    uint64_t prev = e->num_keys ? e->keys[e->num_keys - 1] : AR_ROOT_KEY;
    for (int i = e->num_keys; i < want; i++) {
        prev = ar_chain_key(prev, ar_private_payload(e->pub.req_key, i));
        e->keys[i] = prev;
    }
    if (want > e->num_keys) e->num_keys = want;
}

static void entry_free(live_entry *e)
{
    if (!e) return;
    free(e->id);
    free(e->blocks);
    free(e->keys);
    free(e);
}

static void entry_refresh(live_entry *e)
{
    e->pub.req = e->id;
    e->pub.prompt_len = e->prompt_len;
    e->pub.num_computed_tokens = e->num_computed;
    e->pub.block_ids = e->blocks;
    e->pub.num_blocks = e->num_blocks;
    e->pub.prompt_keys = e->keys;
    e->pub.num_prompt_keys = e->num_keys;
}

static void live_table_free(live_table *t)
{
    for (size_t i = 0; i < t->cap; i++) entry_free(t->slots[i]);
    free(t->slots);
    free(t->order);
    memset(t, 0, sizeof *t);
}

/* ---- the reader --------------------------------------------------------------------------- */

struct ar_trace_reader {
    char *path;
    gzFile gz;
    long line;               /* number of the last line read */
    char *buf;               /* current line */
    size_t cap;
    ar_trace_header header;
    bool have_prev;
    int64_t prev_step;
    double prev_time;
    ar_step step;            /* the step returned last; its arrays live in the arena */
    ar_arena mem;
    ar_str_map union_ids, sched_ids, finished_ids, preempted_ids;
    bool *new_private;       /* [num_new] of the step read last (arena): its keys are request-private */
    int64_t given_keys;      /* keys the trace spelled out that live and preempted requests hold */
    int64_t max_given_keys;  /* their bound: AR_TRACE_MAX_GIVEN_KEYS or ar_trace_set_given_key_limit's */
    live_entry **cached_entries;   /* [num_cached] looked up during validation */
    int cap_cached_entries;
    uint32_t *block_stamp;   /* [num_blocks] duplicate-block detection */
    uint32_t stamp;
    live_table live;
    /* block ownership (see "Block ownership" below) */
    int32_t *block_ref;      /* [owner_cap] live requests holding each block */
    uint64_t *block_key;     /* [owner_cap] the content key its holders see (when ref > 0) */
    uint32_t *claim_round;   /* [owner_cap] == round: claimed in the step being checked */
    uint32_t *claim_slot;    /* [owner_cap] its index in claims */
    int owner_cap;           /* grown to the largest block id seen, not num_blocks up front */
    uint32_t round;
    struct block_claim *claims;
    int num_claims, cap_claims;
    struct owner_undo *undo; /* changes of the step being checked, undone when it is rejected */
    size_t num_undo, cap_undo;
};

static int fail(ar_trace_reader *r, char *err, size_t err_len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(ar_trace_reader *r, char *err, size_t err_len, const char *fmt, ...)
{
    char msg[AR_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    set_err(err, err_len, "%s:%ld: %s", r->path, r->line, msg);
    return -1;
}

/* Reads the next non-blank line into r->buf.  Returns 1, 0 at end of file, -1 on a read error. */
static int read_line(ar_trace_reader *r, char *err, size_t err_len, size_t *len_out)
{
    for (;;) {
        size_t len = 0;
        bool got_any = false;
        for (;;) {
            if (r->cap - len < 2) {
                size_t ncap = r->cap * 2;
                char *nb = realloc(r->buf, ncap);
                if (!nb) { r->line++; return fail(r, err, err_len, "out of memory reading a line of %zu bytes", len); }
                r->buf = nb;
                r->cap = ncap;
            }
            int want = (int)((r->cap - len) > (size_t)1 << 30 ? (size_t)1 << 30 : (r->cap - len));
            if (!gzgets(r->gz, r->buf + len, want)) break;
            got_any = true;
            len += strlen(r->buf + len);
            if (len > 0 && r->buf[len - 1] == '\n') break;
        }
        int zerr = Z_OK;
        const char *zmsg = gzerror(r->gz, &zerr);
        /* a truncated stream (Z_BUF_ERROR) still hands out what it decoded: complete lines
         * before the cut are good, the cut line is the error */
        bool complete = got_any && len > 0 && r->buf[len - 1] == '\n';
        if (zerr == Z_BUF_ERROR && complete) zerr = Z_OK;
        if (zerr != Z_OK && zerr != Z_STREAM_END) {
            r->line++;
            if (zerr == Z_ERRNO)
                return fail(r, err, err_len, "read error: %s", strerror(errno));
            return fail(r, err, err_len, "corrupt or truncated gzip (zlib: %s)", zmsg ? zmsg : "?");
        }
        if (!got_any) return 0;
        r->line++;
        r->buf[len] = 0;
        size_t k = 0;
        while (k < len && (r->buf[k] == ' ' || r->buf[k] == '\t' || r->buf[k] == '\r' || r->buf[k] == '\n')) k++;
        if (k == len) continue;   /* blank line */
        *len_out = len;
        return 1;
    }
}

static json_t *parse_line(ar_trace_reader *r, size_t len, char *err, size_t err_len)
{
    json_error_t jerr;
    json_t *root = json_loadb(r->buf, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (strstr(jerr.text, "duplicate object key"))
            fail(r, err, err_len, "duplicate key in a JSON object (%s); e.g. a request id listed twice in num_scheduled_tokens",
                 jerr.text);
        else
            fail(r, err, err_len, "bad JSON at column %d: %s", jerr.column, jerr.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        fail(r, err, err_len, "bad JSON: a line must be one JSON object");
        return NULL;
    }
    return root;
}

/* Field access with "missing or wrong-typed field" errors. `where` names the object. */
static int need_int(ar_trace_reader *r, json_t *obj, const char *where, const char *key, bool required,
                    long long dflt, long long *out, char *err, size_t err_len)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return fail(r, err, err_len, "missing field '%s%s'", where, key);
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v))
        return fail(r, err, err_len, "wrong-typed field '%s%s': expected an integer", where, key);
    *out = (long long)json_integer_value(v);
    return 0;
}

static int need_num(ar_trace_reader *r, json_t *obj, const char *where, const char *key, bool required,
                    double dflt, double *out, char *err, size_t err_len)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return fail(r, err, err_len, "missing field '%s%s'", where, key);
        *out = dflt;
        return 0;
    }
    if (!json_is_number(v))
        return fail(r, err, err_len, "wrong-typed field '%s%s': expected a number", where, key);
    *out = json_number_value(v);
    return 0;
}

static int need_str(ar_trace_reader *r, json_t *obj, const char *where, const char *key, bool required,
                    const char *dflt, const char **out, char *err, size_t err_len)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return fail(r, err, err_len, "missing field '%s%s'", where, key);
        *out = dflt;
        return 0;
    }
    if (!json_is_string(v))
        return fail(r, err, err_len, "wrong-typed field '%s%s': expected a string", where, key);
    *out = json_string_value(v);
    return 0;
}

static int need_bool(ar_trace_reader *r, json_t *obj, const char *where, const char *key, bool required,
                     bool dflt, bool *out, char *err, size_t err_len)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return fail(r, err, err_len, "missing field '%s%s'", where, key);
        *out = dflt;
        return 0;
    }
    if (!json_is_boolean(v))
        return fail(r, err, err_len, "wrong-typed field '%s%s': expected true or false", where, key);
    *out = json_is_true(v);
    return 0;
}

static json_t *need_kind(ar_trace_reader *r, json_t *obj, const char *where, const char *key, bool is_array,
                         char *err, size_t err_len)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        fail(r, err, err_len, "missing field '%s%s'", where, key);
        return NULL;
    }
    if (is_array ? !json_is_array(v) : !json_is_object(v)) {
        fail(r, err, err_len, "wrong-typed field '%s%s': expected %s", where, key, is_array ? "an array" : "an object");
        return NULL;
    }
    return v;
}

/* An integer header field in [lo, hi]. */
static int header_int(ar_trace_reader *r, json_t *obj, const char *where, const char *key, bool required,
                      long long dflt, long long lo, long long hi, int *out, char *err, size_t err_len)
{
    long long v = 0;
    if (need_int(r, obj, where, key, required, dflt, &v, err, err_len) != 0) return -1;
    if (v < lo || v > hi)
        return fail(r, err, err_len, "header value out of range: %s%s = %lld, must be in [%lld, %lld]",
                    where, key, v, lo, hi);
    *out = (int)v;
    return 0;
}

static int read_header(ar_trace_reader *r, json_t *root, char *err, size_t err_len)
{
    ar_trace_header *h = &r->header;
    memset(h, 0, sizeof *h);
    json_t *fmt = json_object_get(root, "format");
    if (!fmt || !json_is_string(fmt) || strcmp(json_string_value(fmt), AR_TRACE_FORMAT) != 0)
        return fail(r, err, err_len, "not an attnreplay trace: header 'format' must be \"%s\"", AR_TRACE_FORMAT);
    long long version = 0;
    if (need_int(r, root, "", "version", true, 0, &version, err, err_len) != 0) return -1;
    if (version != AR_TRACE_VERSION)
        return fail(r, err, err_len, "unsupported trace version %lld (this reader reads version %d)", version,
                    AR_TRACE_VERSION);
    h->version = (int)version;

    json_t *model = need_kind(r, root, "", "model", false, err, err_len);
    if (!model) return -1;
    json_t *cache = need_kind(r, root, "", "cache", false, err, err_len);
    if (!cache) return -1;
    json_t *sched = need_kind(r, root, "", "scheduler", false, err, err_len);
    if (!sched) return -1;

    /* model */
    ar_model *m = &h->model;
    const char *s;
    if (need_str(r, model, "model.", "name", true, NULL, &s, err, err_len) != 0) return -1;
    if (strlen(s) >= AR_NAME_MAX)
        return fail(r, err, err_len, "header value out of range: model.name longer than %d bytes", AR_NAME_MAX - 1);
    snprintf(m->name, sizeof m->name, "%s", s);
    if (need_str(r, model, "model.", "attention", false, "mha", &s, err, err_len) != 0) return -1;
    if (strcmp(s, "mha") == 0) m->attention = AR_ATTN_MHA;
    else if (strcmp(s, "mla") == 0) m->attention = AR_ATTN_MLA;
    else return fail(r, err, err_len, "header value out of range: model.attention \"%s\" must be \"mha\" or \"mla\"", s);
    if (header_int(r, model, "model.", "num_layers", true, 0, 1, AR_MAX_LAYERS, &m->num_layers, err, err_len)) return -1;
    if (header_int(r, model, "model.", "num_q_heads", true, 0, 1, AR_MAX_HEADS, &m->num_q_heads, err, err_len)) return -1;
    if (m->attention == AR_ATTN_MHA) {
        if (header_int(r, model, "model.", "num_kv_heads", true, 0, 1, AR_MAX_HEADS, &m->num_kv_heads, err, err_len)) return -1;
        if (header_int(r, model, "model.", "head_size", true, 0, 1, AR_MAX_HEAD_SIZE, &m->head_size, err, err_len)) return -1;
        if (m->num_q_heads % m->num_kv_heads != 0)
            return fail(r, err, err_len, "header value out of range: model.num_q_heads (%d) must be a multiple of model.num_kv_heads (%d)",
                        m->num_q_heads, m->num_kv_heads);
        m->v_head_dim = m->head_size;
    } else {
        if (header_int(r, model, "model.", "kv_lora_rank", true, 0, 1, 4096, &m->kv_lora_rank, err, err_len)) return -1;
        if (header_int(r, model, "model.", "qk_rope_head_dim", true, 0, 1, 1024, &m->qk_rope_head_dim, err, err_len)) return -1;
        if (header_int(r, model, "model.", "qk_nope_head_dim", true, 0, 1, 1024, &m->qk_nope_head_dim, err, err_len)) return -1;
        if (header_int(r, model, "model.", "v_head_dim", true, 0, 1, 1024, &m->v_head_dim, err, err_len)) return -1;
        if (header_int(r, model, "model.", "num_kv_heads", false, 1, 1, 1, &m->num_kv_heads, err, err_len)) return -1;
        int want = m->kv_lora_rank + m->qk_rope_head_dim;
        if (header_int(r, model, "model.", "head_size", false, want, want, want, &m->head_size, err, err_len)) return -1;
    }
    double dflt_scale = m->attention == AR_ATTN_MHA ? 1.0 / sqrt((double)m->head_size)
                                                    : 1.0 / sqrt((double)(m->qk_nope_head_dim + m->qk_rope_head_dim));
    if (need_num(r, model, "model.", "scale", false, dflt_scale, &m->scale, err, err_len)) return -1;
    if (!isfinite(m->scale) || m->scale <= 0)
        return fail(r, err, err_len, "header value out of range: model.scale must be finite and > 0");
    if (header_int(r, model, "model.", "sliding_window", false, 0, 0, AR_MAX_TOKENS_PER_REQ, &m->sliding_window, err, err_len)) return -1;
    if (need_num(r, model, "model.", "logits_soft_cap", false, 0.0, &m->logits_soft_cap, err, err_len)) return -1;
    if (!isfinite(m->logits_soft_cap) || m->logits_soft_cap < 0)
        return fail(r, err, err_len, "header value out of range: model.logits_soft_cap must be finite and >= 0");

    /* cache */
    ar_cache_config *c = &h->cache;
    if (header_int(r, cache, "cache.", "block_size", true, 0, 1, AR_MAX_BLOCK_SIZE, &c->block_size, err, err_len)) return -1;
    if (header_int(r, cache, "cache.", "num_blocks", true, 0, 2, AR_MAX_NUM_BLOCKS, &c->num_blocks, err, err_len)) return -1;
    if (need_str(r, cache, "cache.", "dtype", true, NULL, &s, err, err_len)) return -1;
    if (strcmp(s, "auto") == 0 || ar_dtype_parse(s, AR_BF16, &c->dtype) != 0)
        return fail(r, err, err_len, "header value out of range: unknown cache.dtype \"%s\" (fp32, fp16, bf16, fp8_e4m3)", s);
    if (need_str(r, cache, "cache.", "kv_cache_dtype", false, "auto", &s, err, err_len)) return -1;
    if (ar_dtype_parse(s, c->dtype, &c->kv_cache_dtype) != 0)
        return fail(r, err, err_len, "header value out of range: unknown cache.kv_cache_dtype \"%s\" (auto, fp32, fp16, bf16, fp8_e4m3)", s);

    /* scheduler */
    ar_sched_config *sc = &h->sched;
    if (header_int(r, sched, "scheduler.", "max_num_batched_tokens", true, 0, 1, AR_MAX_TOKENS_PER_REQ,
                   &sc->max_num_batched_tokens, err, err_len)) return -1;
    if (header_int(r, sched, "scheduler.", "max_num_seqs", true, 0, 1, AR_TRACE_MAX_NUM_SEQS, &sc->max_num_seqs, err, err_len)) return -1;
    if (need_bool(r, sched, "scheduler.", "prefix_caching", false, true, &sc->prefix_caching, err, err_len)) return -1;
    if (need_bool(r, sched, "scheduler.", "cascade", false, false, &sc->cascade, err, err_len)) return -1;

    if (need_str(r, root, "", "source", false, "", &s, err, err_len)) return -1;
    snprintf(h->source, sizeof h->source, "%s", s);
    /* seed: a non-negative integer, or a decimal string for seeds above 2^63 - 1 */
    json_t *seed = json_object_get(root, "seed");
    if (json_is_string(seed)) {
        const char *digits = json_string_value(seed);
        char *end = NULL;
        errno = 0;
        h->seed = strtoull(digits, &end, 10);
        if (!*digits || *end || errno || digits[0] == '-')
            return fail(r, err, err_len, "wrong-typed field 'seed': expected an unsigned integer");
    } else if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed) || json_integer_value(seed) < 0)
            return fail(r, err, err_len, "wrong-typed field 'seed': expected an unsigned integer");
        h->seed = (uint64_t)json_integer_value(seed);
    }
    return 0;
}

ar_trace_reader *ar_trace_open(const char *path, char *err, size_t err_len)
{
    ar_trace_reader *r = calloc(1, sizeof *r);
    if (!r) { set_err(err, err_len, "%s:0: out of memory", path); return NULL; }
    r->path = strdup(path);
    r->max_given_keys = AR_TRACE_MAX_GIVEN_KEYS;
    r->cap = 1 << 16;
    r->buf = malloc(r->cap);
    if (!r->path || !r->buf) {
        set_err(err, err_len, "%s:0: out of memory", path);
        ar_trace_close(r);
        return NULL;
    }
    r->gz = gzopen(path, "rb");
    if (!r->gz) {
        set_err(err, err_len, "%s:0: cannot open: %s", path, errno ? strerror(errno) : "gzopen failed");
        ar_trace_close(r);
        return NULL;
    }
    gzbuffer(r->gz, 1 << 18);
    size_t len = 0;
    int rc = read_line(r, err, err_len, &len);
    if (rc == 0) fail(r, err, err_len, "empty file: no header line");
    if (rc != 1) { ar_trace_close(r); return NULL; }
    json_t *root = parse_line(r, len, err, err_len);
    if (!root) { ar_trace_close(r); return NULL; }
    rc = read_header(r, root, err, err_len);
    json_decref(root);
    if (rc != 0) { ar_trace_close(r); return NULL; }
    r->block_stamp = calloc((size_t)r->header.cache.num_blocks, sizeof *r->block_stamp);
    if (!r->block_stamp) {
        fail(r, err, err_len, "out of memory for %d blocks", r->header.cache.num_blocks);
        ar_trace_close(r);
        return NULL;
    }
    return r;
}

const ar_trace_header *ar_trace_header_of(const ar_trace_reader *r) { return &r->header; }

void ar_trace_set_given_key_limit(ar_trace_reader *r, int64_t max_keys)
{
    r->max_given_keys = max_keys;
}

void ar_trace_close(ar_trace_reader *r)
{
    if (!r) return;
    if (r->gz) gzclose_r(r->gz);
    free(r->path);
    free(r->buf);
    ar_arena_free(&r->mem);
    ar_str_map_free(&r->union_ids);
    ar_str_map_free(&r->sched_ids);
    ar_str_map_free(&r->finished_ids);
    ar_str_map_free(&r->preempted_ids);
    free(r->cached_entries);
    free(r->block_stamp);
    free(r->block_ref);
    free(r->block_key);
    free(r->claim_round);
    free(r->claim_slot);
    free(r->claims);
    free(r->undo);
    live_table_free(&r->live);
    free(r);
}

/* ---- step parsing (syntax and types only) -------------------------------------------------- */

/* arr may be NULL: an absent list is empty. */
static int parse_id_list(ar_trace_reader *r, json_t *arr, const char *what, char ***out, int *count,
                         char *err, size_t err_len)
{
    size_t n = arr ? json_array_size(arr) : 0;
    *count = (int)n;
    *out = ar_arena_alloc(&r->mem, (n ? n : 1) * sizeof **out);
    if (!*out) return fail(r, err, err_len, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_string(v))
            return fail(r, err, err_len, "wrong-typed field '%s[%zu]': expected a request id string", what, i);
        (*out)[i] = ar_arena_strdup(&r->mem, json_string_value(v));
        if (!(*out)[i]) return fail(r, err, err_len, "out of memory");
    }
    return 0;
}

static int parse_block_ids(ar_trace_reader *r, json_t *arr, const char *where, int **out, int *count,
                           char *err, size_t err_len)
{
    size_t n = json_array_size(arr);
    if (n > (size_t)AR_MAX_NUM_BLOCKS)
        return fail(r, err, err_len, "%s holds more blocks (%zu) than any cache", where, n);
    *count = (int)n;
    *out = ar_arena_alloc(&r->mem, (n ? n : 1) * sizeof **out);
    if (!*out) return fail(r, err, err_len, "out of memory");
    int num_blocks = r->header.cache.num_blocks;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v))
            return fail(r, err, err_len, "wrong-typed field '%s[%zu]': expected a block id integer", where, i);
        json_int_t b = json_integer_value(v);
        if (b < 1 || b >= num_blocks)
            return fail(r, err, err_len, "block id %lld in %s out of range [1, %d) (0 is the null block)",
                        (long long)b, where, num_blocks);
        (*out)[i] = (int)b;
    }
    return 0;
}

static int parse_hex_key(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    int n = 0;
    for (; s[n]; n++) {
        char ch = s[n];
        int d;
        if (ch >= '0' && ch <= '9') d = ch - '0';
        else if (ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
        else if (ch >= 'A' && ch <= 'F') d = ch - 'A' + 10;
        else return -1;
        v = (v << 4) | (uint64_t)d;
        if (n >= 16) return -1;
    }
    if (n != 16) return -1;
    *out = v;
    return 0;
}

/* step_keys: the content keys the step's earlier new requests made; this request's are added
 * and the total checked against AR_TRACE_MAX_STEP_KEYS before they are made.  *private_keys:
 * set when neither block_keys nor prompt_token_ids is given (the keys come from the id). */
static int parse_new_req(ar_trace_reader *r, json_t *o, size_t idx, ar_new_req *nr, int64_t *step_keys,
                         bool *private_keys, char *err, size_t err_len)
{
    char where[64];
    snprintf(where, sizeof where, "new[%zu].", idx);
    if (!json_is_object(o)) return fail(r, err, err_len, "wrong-typed field 'new[%zu]': expected an object", idx);
    const char *id;
    long long prompt_len = 0, computed = 0;
    if (need_str(r, o, where, "req", true, NULL, &id, err, err_len)) return -1;
    if (need_int(r, o, where, "prompt_len", true, 0, &prompt_len, err, err_len)) return -1;
    if (need_int(r, o, where, "num_computed_tokens", true, 0, &computed, err, err_len)) return -1;
    if (prompt_len < 1 || prompt_len > AR_MAX_TOKENS_PER_REQ)
        return fail(r, err, err_len, "prompt_len %lld of new request '%s' must be in [1, %d]", prompt_len, id,
                    AR_MAX_TOKENS_PER_REQ);
    if (computed < 0 || computed >= prompt_len)
        return fail(r, err, err_len, "num_computed_tokens %lld of new request '%s' must be in [0, prompt_len %lld)",
                    computed, id, prompt_len);
    /* vLLM never admits a prompt the whole cache cannot hold (max_model_len <= the KV capacity);
     * checked before the prompt's content keys are made, which are as many as its full blocks */
    int64_t cache_tokens = (int64_t)(r->header.cache.num_blocks - 1) * r->header.cache.block_size;
    if (prompt_len > cache_tokens)
        return fail(r, err, err_len, "prompt_len %lld of new request '%s' exceeds the KV cache: %d blocks of %d tokens "
                    "hold %" PRId64 " tokens", prompt_len, id, r->header.cache.num_blocks - 1,
                    r->header.cache.block_size, cache_tokens);
    nr->req = ar_arena_strdup(&r->mem, id);
    if (!nr->req) return fail(r, err, err_len, "out of memory");
    nr->prompt_len = (int)prompt_len;
    nr->num_computed_tokens = (int)computed;
    json_t *blocks = need_kind(r, o, where, "block_ids", true, err, err_len);
    if (!blocks) return -1;
    char bwhere[96];
    snprintf(bwhere, sizeof bwhere, "%sblock_ids", where);
    if (parse_block_ids(r, blocks, bwhere, &nr->block_ids, &nr->num_block_ids, err, err_len)) return -1;

    int bs = r->header.cache.block_size;
    int nkeys = (int)(prompt_len / bs);
    *step_keys += nkeys;
    if (*step_keys > AR_TRACE_MAX_STEP_KEYS)
        return fail(r, err, err_len, "the prompts of new requests new[0..%zu] have %" PRId64 " full blocks, more than the "
                    "%d content keys one step may make", idx, *step_keys, AR_TRACE_MAX_STEP_KEYS);
    nr->num_block_keys = nkeys;
    nr->block_keys = ar_arena_alloc(&r->mem, (size_t)(nkeys ? nkeys : 1) * sizeof *nr->block_keys);
    if (!nr->block_keys) return fail(r, err, err_len, "out of memory");
    json_t *keys = json_object_get(o, "block_keys");
    json_t *toks = json_object_get(o, "prompt_token_ids");
    if (keys && !json_is_null(keys)) {
        if (!json_is_array(keys))
            return fail(r, err, err_len, "wrong-typed field '%sblock_keys': expected an array", where);
        if (json_array_size(keys) != (size_t)nkeys)
            return fail(r, err, err_len, "block_keys of new request '%s' has %zu entries, must be prompt_len / block_size = %d",
                        id, json_array_size(keys), nkeys);
        for (int i = 0; i < nkeys; i++) {
            json_t *k = json_array_get(keys, (size_t)i);
            if (!json_is_string(k) || parse_hex_key(json_string_value(k), &nr->block_keys[i]) != 0)
                return fail(r, err, err_len, "block_keys[%d] of new request '%s' must be a 16-hex-digit string", i, id);
        }
    }
    if (toks && !json_is_null(toks)) {
        if (!json_is_array(toks))
            return fail(r, err, err_len, "wrong-typed field '%sprompt_token_ids': expected an array", where);
        if (json_array_size(toks) != (size_t)prompt_len)
            return fail(r, err, err_len, "prompt_token_ids of new request '%s' has %zu entries, must equal prompt_len %lld",
                        id, json_array_size(toks), prompt_len);
        int32_t *t = ar_arena_alloc(&r->mem, (size_t)prompt_len * sizeof *t);
        if (!t) return fail(r, err, err_len, "out of memory");
        for (long long i = 0; i < prompt_len; i++) {
            json_t *v = json_array_get(toks, (size_t)i);
            if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN || json_integer_value(v) > INT32_MAX)
                return fail(r, err, err_len, "wrong-typed field '%sprompt_token_ids[%lld]': expected a 32-bit integer", where, i);
            t[i] = (int32_t)json_integer_value(v);
        }
        if (!keys || json_is_null(keys)) {
            uint64_t prev = AR_ROOT_KEY;
            for (int i = 0; i < nkeys; i++) {
                prev = ar_chain_key(prev, ar_tokens_payload(t + (size_t)i * (size_t)bs, bs));
                nr->block_keys[i] = prev;
            }
        }
    }
    *private_keys = (!keys || json_is_null(keys)) && (!toks || json_is_null(toks));
    if (*private_keys) {
        uint64_t req_key = ar_req_key(id), prev = AR_ROOT_KEY;
        for (int i = 0; i < nkeys; i++) {
            prev = ar_chain_key(prev, ar_private_payload(req_key, i));
            nr->block_keys[i] = prev;
        }
    }
    return 0;
}

static int parse_cached_req(ar_trace_reader *r, json_t *o, size_t idx, ar_cached_req *cr, char *err, size_t err_len)
{
    char where[64];
    snprintf(where, sizeof where, "cached[%zu].", idx);
    if (!json_is_object(o)) return fail(r, err, err_len, "wrong-typed field 'cached[%zu]': expected an object", idx);
    const char *id;
    long long computed = 0;
    if (need_str(r, o, where, "req", true, NULL, &id, err, err_len)) return -1;
    if (need_int(r, o, where, "num_computed_tokens", true, 0, &computed, err, err_len)) return -1;
    if (computed < 0 || computed > AR_MAX_TOKENS_PER_REQ)
        return fail(r, err, err_len, "num_computed_tokens %lld of cached request '%s' must be in [0, %d]", computed, id,
                    AR_MAX_TOKENS_PER_REQ);
    if (need_bool(r, o, where, "resumed", false, false, &cr->resumed, err, err_len)) return -1;
    cr->req = ar_arena_strdup(&r->mem, id);
    if (!cr->req) return fail(r, err, err_len, "out of memory");
    cr->num_computed_tokens = (int)computed;
    json_t *blocks = json_object_get(o, "new_block_ids");
    char bwhere[96];
    snprintf(bwhere, sizeof bwhere, "%snew_block_ids", where);
    if (!blocks || json_is_null(blocks)) {
        cr->new_block_ids = ar_arena_alloc(&r->mem, sizeof *cr->new_block_ids);
        cr->num_new_block_ids = 0;
        if (!cr->new_block_ids) return fail(r, err, err_len, "out of memory");
        return 0;
    }
    if (!json_is_array(blocks)) return fail(r, err, err_len, "wrong-typed field '%s': expected an array", bwhere);
    return parse_block_ids(r, blocks, bwhere, &cr->new_block_ids, &cr->num_new_block_ids, err, err_len);
}

static int parse_step(ar_trace_reader *r, json_t *root, ar_step *s, char *err, size_t err_len)
{
    memset(s, 0, sizeof *s);
    s->line = r->line;
    long long stepno = 0;
    if (need_int(r, root, "", "step", true, 0, &stepno, err, err_len)) return -1;
    s->step = stepno;
    if (need_num(r, root, "", "time", true, 0, &s->time, err, err_len)) return -1;

    json_t *jnew = need_kind(r, root, "", "new", true, err, err_len);
    if (!jnew) return -1;
    json_t *jcached = need_kind(r, root, "", "cached", true, err, err_len);
    if (!jcached) return -1;
    json_t *jsched = need_kind(r, root, "", "num_scheduled_tokens", false, err, err_len);
    if (!jsched) return -1;
    long long ncpb = 0;
    if (need_int(r, root, "", "num_common_prefix_blocks", false, 0, &ncpb, err, err_len)) return -1;
    if (ncpb < 0 || ncpb > AR_MAX_NUM_BLOCKS)
        return fail(r, err, err_len, "num_common_prefix_blocks %lld must be >= 0 (and at most the blocks held)", ncpb);
    s->num_common_prefix_blocks = (int)ncpb;
    json_t *jfin = json_object_get(root, "finished");
    json_t *jpre = json_object_get(root, "preempted");
    if (jfin && !json_is_null(jfin) && !json_is_array(jfin))
        return fail(r, err, err_len, "wrong-typed field 'finished': expected an array");
    if (jpre && !json_is_null(jpre) && !json_is_array(jpre))
        return fail(r, err, err_len, "wrong-typed field 'preempted': expected an array");

    size_t nnew = json_array_size(jnew), ncached = json_array_size(jcached), nsched = json_object_size(jsched);
    if (nnew > (size_t)1 << 24 || ncached > (size_t)1 << 24 || nsched > (size_t)1 << 24)
        return fail(r, err, err_len, "step lists too many requests");
    /* every new and cached request is scheduled (checked later): counted before any is parsed,
     * so a step cannot make the keys of more requests than a step may schedule */
    int max_seqs = r->header.sched.max_num_seqs;
    if (nsched > (size_t)max_seqs)
        return fail(r, err, err_len, "%zu scheduled requests exceed max_num_seqs %d", nsched, max_seqs);
    if (nnew + ncached > (size_t)max_seqs)
        return fail(r, err, err_len, "%zu new and %zu cached requests exceed max_num_seqs %d (each is scheduled in its step)",
                    nnew, ncached, max_seqs);
    s->num_new = (int)nnew;
    s->num_cached = (int)ncached;
    s->num_scheduled = (int)nsched;
    s->new_reqs = ar_arena_alloc(&r->mem, (nnew ? nnew : 1) * sizeof *s->new_reqs);
    s->cached = ar_arena_alloc(&r->mem, (ncached ? ncached : 1) * sizeof *s->cached);
    s->scheduled = ar_arena_alloc(&r->mem, (nsched ? nsched : 1) * sizeof *s->scheduled);
    r->new_private = ar_arena_alloc(&r->mem, (nnew ? nnew : 1) * sizeof *r->new_private);
    if (!s->new_reqs || !s->cached || !s->scheduled || !r->new_private) return fail(r, err, err_len, "out of memory");
    int64_t step_keys = 0;
    for (size_t i = 0; i < nnew; i++)
        if (parse_new_req(r, json_array_get(jnew, i), i, &s->new_reqs[i], &step_keys, &r->new_private[i], err,
                          err_len))
            return -1;
    for (size_t i = 0; i < ncached; i++)
        if (parse_cached_req(r, json_array_get(jcached, i), i, &s->cached[i], err, err_len)) return -1;
    const char *key;
    json_t *val;
    int k = 0;
    json_object_foreach(jsched, key, val) {
        if (!json_is_integer(val))
            return fail(r, err, err_len, "wrong-typed field 'num_scheduled_tokens.%s': expected an integer", key);
        json_int_t n = json_integer_value(val);
        if (n < 1 || n > AR_MAX_TOKENS_PER_REQ)
            return fail(r, err, err_len, "num_scheduled_tokens of '%s' is %lld, must be >= 1", key, (long long)n);
        s->scheduled[k].req = ar_arena_strdup(&r->mem, key);
        if (!s->scheduled[k].req) return fail(r, err, err_len, "out of memory");
        s->scheduled[k].num_tokens = (int)n;
        k++;
    }
    if (parse_id_list(r, json_is_array(jfin) ? jfin : NULL, "finished", &s->finished, &s->num_finished, err, err_len))
        return -1;
    if (parse_id_list(r, json_is_array(jpre) ? jpre : NULL, "preempted", &s->preempted, &s->num_preempted, err, err_len))
        return -1;
    return 0;
}

/* ---- block ownership -------------------------------------------------------------------------
 *
 * Every block id held by a live request has a reference count and the content key its holders
 * see (ar_block_content_key of the holder's logical block).  A step claims blocks: a new
 * request its whole list, a cached request the blocks it appends, a resumed one its new list.
 * A claimed block at logical index i < num_computed_tokens / block_size of a new or resumed
 * request is a prefix hit; every other claimed block is handed out fresh.  vLLM shares a block
 * only through prefix hits on the same content, so:
 *   - a block a live request still holds may be claimed only as a prefix hit with the same
 *     content key ("handed to ... while live request ... still holds it", "... different
 *     content");
 *   - two claims of one step on a free block must agree on the content key, and at most one of
 *     them may be fresh (a request computing it; the others hit it in the same step).
 * Blocks of requests that finished before the step or are preempted in it are free first (vLLM
 * frees a preempted request's blocks while it schedules the step, so they may be handed out in
 * that very step).  The checks change the counts as they go and log every change, so a
 * rejected step is undone exactly. */

typedef struct owner_undo {
    int block;
    int32_t ref;
    uint64_t key;
} owner_undo;

typedef struct block_claim {
    const char *req;         /* first request claiming the block in this step (arena string) */
    bool fresh;              /* some claim of this step hands it out fresh */
    bool held_before;        /* a live request held it before the step's claims */
} block_claim;

static int owner_set(ar_trace_reader *r, int block, int32_t ref, uint64_t key)
{
    if (r->num_undo == r->cap_undo) {
        size_t ncap = r->cap_undo ? r->cap_undo * 2 : 256;
        owner_undo *nu = ar_xrealloc_array(r->undo, ncap, sizeof *nu);
        if (!nu) return -1;
        r->undo = nu;
        r->cap_undo = ncap;
    }
    r->undo[r->num_undo++] = (owner_undo){ block, r->block_ref[block], r->block_key[block] };
    r->block_ref[block] = ref;
    r->block_key[block] = key;
    return 0;
}

/* Grows the per-block arrays to hold block ids up to max_id (new entries zero). */
static int owner_reserve(ar_trace_reader *r, int max_id)
{
    if (max_id < r->owner_cap) return 0;
    int ncap = r->owner_cap ? r->owner_cap : 1024;
    while (ncap <= max_id) ncap = ncap > INT32_MAX / 2 ? max_id + 1 : ncap * 2;
    if (ncap > r->header.cache.num_blocks) ncap = r->header.cache.num_blocks;
    size_t old = (size_t)r->owner_cap, add = (size_t)ncap - old;
#define AR_GROW(field)                                                                       \
    do {                                                                                     \
        void *grown = ar_xrealloc_array(r->field, (size_t)ncap, sizeof *r->field);              \
        if (!grown) return -1;                                                               \
        r->field = grown;                                                                    \
        memset(r->field + old, 0, add * sizeof *r->field);                                   \
    } while (0)
    AR_GROW(block_ref);
    AR_GROW(block_key);
    AR_GROW(claim_round);
    AR_GROW(claim_slot);
#undef AR_GROW
    r->owner_cap = ncap;
    return 0;
}

/* Restores the counts and keys as they were before the step being checked. */
static void owner_rollback(ar_trace_reader *r)
{
    while (r->num_undo > 0) {
        const owner_undo *u = &r->undo[--r->num_undo];
        r->block_ref[u->block] = u->ref;
        r->block_key[u->block] = u->key;
    }
}

/* Frees the blocks a live entry holds (it finishes, or is preempted, in this step). */
static int owner_drop(ar_trace_reader *r, const live_entry *e)
{
    for (int i = 0; i < e->num_blocks; i++) {
        int b = e->blocks[i];
        if (owner_set(r, b, r->block_ref[b] - 1, r->block_key[b]) != 0) return -1;
    }
    return 0;
}

/* A live request that held `block` before this step and still holds it (for messages). */
static const char *holder_of(const ar_trace_reader *r, int block, const char *except)
{
    for (int i = 0; i < r->live.num_live; i++) {
        const live_entry *e = r->live.order[i];
        if (strcmp(e->id, except) == 0 || ar_str_map_get(&r->finished_ids, e->id) >= 0 ||
            ar_str_map_get(&r->preempted_ids, e->id) >= 0)
            continue;
        for (int k = 0; k < e->num_blocks; k++)
            if (e->blocks[k] == block) return e->id;
    }
    return "?";
}

static int owner_claim(ar_trace_reader *r, const char *req, int block, uint64_t key, bool fresh,
                       char *err, size_t err_len)
{
    block_claim *c;
    if (r->claim_round[block] != r->round) {
        if (r->num_claims == r->cap_claims) {
            int ncap = r->cap_claims ? r->cap_claims * 2 : 256;
            block_claim *nc = ar_xrealloc_array(r->claims, (size_t)ncap, sizeof *nc);
            if (!nc) return fail(r, err, err_len, "out of memory");
            r->claims = nc;
            r->cap_claims = ncap;
        }
        r->claim_round[block] = r->round;
        r->claim_slot[block] = (uint32_t)r->num_claims;
        c = &r->claims[r->num_claims++];
        *c = (block_claim){ req, false, r->block_ref[block] > 0 };
    } else {
        c = &r->claims[r->claim_slot[block]];
    }
    if (c->held_before) {
        if (fresh)
            return fail(r, err, err_len, "block %d handed to '%s' as a new block while live request '%s' still holds it",
                        block, req, holder_of(r, block, req));
        if (key != r->block_key[block])
            return fail(r, err, err_len, "block %d is a prefix hit of '%s' with different content than live request '%s' "
                        "holds in it (content keys %016" PRIx64 " and %016" PRIx64 "; vLLM shares a block only on equal content)",
                        block, req, holder_of(r, block, req), key, r->block_key[block]);
    } else if (r->block_ref[block] > 0) {   /* claimed earlier in this step */
        if (fresh && c->fresh)
            return fail(r, err, err_len, "block %d handed to two requests as a new block in one step ('%s' and '%s')",
                        block, c->req, req);
        if (key != r->block_key[block])
            return fail(r, err, err_len, "block %d is claimed in one step by '%s' and '%s' with different content "
                        "(content keys %016" PRIx64 " and %016" PRIx64 ")", block, c->req, req, r->block_key[block], key);
    }
    if (fresh) c->fresh = true;
    if (owner_set(r, block, r->block_ref[block] + 1, key) != 0) return fail(r, err, err_len, "out of memory");
    return 0;
}

/* Claims block_ids[0..n) as logical blocks first, first + 1, ... of a request; the first
 * `hits` of them (counted from logical block 0) are prefix hits.  prev: the content key of
 * logical block first - 1 (AR_ROOT_KEY for 0). */
static int owner_claim_list(ar_trace_reader *r, const char *req, uint64_t req_key, const uint64_t *prompt_keys,
                            int num_prompt_keys, const int *block_ids, int n, int first, int hits, uint64_t prev,
                            char *err, size_t err_len)
{
    for (int i = 0; i < n; i++) {
        int index = first + i;
        prev = ar_block_content_key(prev, prompt_keys, num_prompt_keys, req_key, index);
        if (owner_claim(r, req, block_ids[i], prev, index >= hits, err, err_len) != 0) return -1;
    }
    return 0;
}

/* The ownership rules for a step that passed every other check (see above). */
static int check_ownership(ar_trace_reader *r, const ar_step *s, char *err, size_t err_len)
{
    int bs = r->header.cache.block_size;
    int max_id = 0;
    for (int i = 0; i < s->num_new; i++)
        for (int k = 0; k < s->new_reqs[i].num_block_ids; k++)
            if (s->new_reqs[i].block_ids[k] > max_id) max_id = s->new_reqs[i].block_ids[k];
    for (int i = 0; i < s->num_cached; i++)
        for (int k = 0; k < s->cached[i].num_new_block_ids; k++)
            if (s->cached[i].new_block_ids[k] > max_id) max_id = s->cached[i].new_block_ids[k];
    if (owner_reserve(r, max_id) != 0) return fail(r, err, err_len, "out of memory");
    if (++r->round == 0) {
        memset(r->claim_round, 0, (size_t)r->owner_cap * sizeof *r->claim_round);
        r->round = 1;
    }
    r->num_claims = 0;
    for (int i = 0; i < s->num_finished; i++) {
        live_entry *e = live_get(&r->live, s->finished[i]);
        if (e && !e->preempted && owner_drop(r, e) != 0) return fail(r, err, err_len, "out of memory");
    }
    for (int i = 0; i < s->num_preempted; i++)
        if (owner_drop(r, live_get(&r->live, s->preempted[i])) != 0) return fail(r, err, err_len, "out of memory");
    for (int i = 0; i < s->num_cached; i++) {
        const ar_cached_req *cr = &s->cached[i];
        const live_entry *e = r->cached_entries[i];
        if (cr->resumed) continue;
        if (owner_claim_list(r, cr->req, e->pub.req_key, e->keys, e->num_keys, cr->new_block_ids,
                             cr->num_new_block_ids, e->num_blocks, 0, e->last_key, err, err_len) != 0)
            return -1;
    }
    for (int i = 0; i < s->num_new; i++) {
        const ar_new_req *nr = &s->new_reqs[i];
        if (owner_claim_list(r, nr->req, ar_req_key(nr->req), nr->block_keys, nr->num_block_keys, nr->block_ids,
                             nr->num_block_ids, 0, nr->num_computed_tokens / bs, AR_ROOT_KEY, err, err_len) != 0)
            return -1;
    }
    for (int i = 0; i < s->num_cached; i++) {
        const ar_cached_req *cr = &s->cached[i];
        const live_entry *e = r->cached_entries[i];
        if (!cr->resumed) continue;
        if (owner_claim_list(r, cr->req, e->pub.req_key, e->keys, e->num_keys, cr->new_block_ids,
                             cr->num_new_block_ids, 0, cr->num_computed_tokens / bs, AR_ROOT_KEY, err, err_len) != 0)
            return -1;
    }
    return 0;
}

/* The content key of e's last block, chained from `from` (its key of block first - 1). */
static uint64_t chain_last_key(const live_entry *e, int first, uint64_t from)
{
    uint64_t prev = from;
    for (int i = first; i < e->num_blocks; i++)
        prev = ar_block_content_key(prev, e->keys, e->num_keys, e->pub.req_key, i);
    return prev;
}

/* ---- step validation against the live state ------------------------------------------------ */

/* Checks that no block id repeats in old[0..n_old) + add[0..n_add).  Returns the repeated id or 0. */
static int find_repeated_block(ar_trace_reader *r, const int *old, int n_old, const int *add, int n_add)
{
    r->stamp++;
    if (r->stamp == 0) {
        memset(r->block_stamp, 0, (size_t)r->header.cache.num_blocks * sizeof *r->block_stamp);
        r->stamp = 1;
    }
    for (int i = 0; i < n_old; i++) r->block_stamp[old[i]] = r->stamp;
    for (int i = 0; i < n_add; i++) {
        if (r->block_stamp[add[i]] == r->stamp) return add[i];
        r->block_stamp[add[i]] = r->stamp;
    }
    return 0;
}

static int validate_step(ar_trace_reader *r, const ar_step *s, char *err, size_t err_len)
{
    const ar_trace_header *h = &r->header;
    int bs = h->cache.block_size;

    int64_t want_step = r->have_prev ? r->prev_step + 1 : 0;
    if (s->step != want_step)
        return fail(r, err, err_len, "step numbers must be consecutive from 0: expected %" PRId64 ", got %" PRId64,
                    want_step, s->step);
    if (!isfinite(s->time)) return fail(r, err, err_len, "time must be finite");
    if (r->have_prev && s->time < r->prev_time)
        return fail(r, err, err_len, "time must not decrease: %.17g after %.17g", s->time, r->prev_time);

    /* duplicates and the set of new + cached ids */
    if (ar_str_map_reset(&r->union_ids, (size_t)(s->num_new + s->num_cached)) ||
        ar_str_map_reset(&r->sched_ids, (size_t)s->num_scheduled) ||
        ar_str_map_reset(&r->finished_ids, (size_t)s->num_finished) ||
        ar_str_map_reset(&r->preempted_ids, (size_t)s->num_preempted))
        return fail(r, err, err_len, "out of memory");
    for (int i = 0; i < s->num_new; i++)
        if (!ar_str_map_put(&r->union_ids, s->new_reqs[i].req, i))
            return fail(r, err, err_len, "duplicate request id '%s' in new", s->new_reqs[i].req);
    for (int i = 0; i < s->num_cached; i++)
        if (!ar_str_map_put(&r->union_ids, s->cached[i].req, s->num_new + i))
            return fail(r, err, err_len, "duplicate request id '%s' in new/cached", s->cached[i].req);
    for (int i = 0; i < s->num_scheduled; i++)
        if (!ar_str_map_put(&r->sched_ids, s->scheduled[i].req, s->scheduled[i].num_tokens))
            return fail(r, err, err_len, "duplicate request id '%s' in num_scheduled_tokens", s->scheduled[i].req);
    for (int i = 0; i < s->num_finished; i++)
        if (!ar_str_map_put(&r->finished_ids, s->finished[i], i))
            return fail(r, err, err_len, "duplicate request id '%s' in finished", s->finished[i]);
    for (int i = 0; i < s->num_preempted; i++)
        if (!ar_str_map_put(&r->preempted_ids, s->preempted[i], i))
            return fail(r, err, err_len, "duplicate request id '%s' in preempted", s->preempted[i]);

    /* num_scheduled_tokens keys == new U cached */
    int64_t total = 0;
    for (int i = 0; i < s->num_scheduled; i++) {
        if (ar_str_map_get(&r->union_ids, s->scheduled[i].req) < 0)
            return fail(r, err, err_len, "num_scheduled_tokens lists '%s', which is in neither new nor cached",
                        s->scheduled[i].req);
        total += s->scheduled[i].num_tokens;
    }
    for (int i = 0; i < s->num_new; i++)
        if (ar_str_map_get(&r->sched_ids, s->new_reqs[i].req) < 0)
            return fail(r, err, err_len, "new request '%s' is missing from num_scheduled_tokens", s->new_reqs[i].req);
    for (int i = 0; i < s->num_cached; i++)
        if (ar_str_map_get(&r->sched_ids, s->cached[i].req) < 0)
            return fail(r, err, err_len, "cached request '%s' is missing from num_scheduled_tokens", s->cached[i].req);
    if (total > h->sched.max_num_batched_tokens)
        return fail(r, err, err_len, "sum of num_scheduled_tokens %" PRId64 " exceeds max_num_batched_tokens %d", total,
                    h->sched.max_num_batched_tokens);
    if (s->num_scheduled > h->sched.max_num_seqs)
        return fail(r, err, err_len, "%d scheduled requests exceed max_num_seqs %d", s->num_scheduled, h->sched.max_num_seqs);

    /* finished: live or preempted, not scheduled now */
    for (int i = 0; i < s->num_finished; i++) {
        const char *id = s->finished[i];
        if (!live_get(&r->live, id))
            return fail(r, err, err_len, "finished request '%s' is not live", id);
        if (ar_str_map_get(&r->sched_ids, id) >= 0)
            return fail(r, err, err_len, "finished request '%s' is also scheduled in this step", id);
    }

    int min_held = -1;   /* fewest blocks held after this step by a scheduled request */

    /* keys spelled out and held: those of the finished requests go, the new ones' come */
    int64_t given = r->given_keys;
    for (int i = 0; i < s->num_finished; i++) {
        const live_entry *e = live_get(&r->live, s->finished[i]);
        if (!e->private_keys) given -= e->num_keys;
    }
    for (int i = 0; i < s->num_new; i++)
        if (!r->new_private[i]) given += s->new_reqs[i].num_block_keys;
    if (given > r->max_given_keys)
        return fail(r, err, err_len, "the live requests' prompts would hold %" PRId64 " content keys the trace spells out "
                    "(block_keys / prompt_token_ids), more than the %" PRId64 " the reader keeps", given,
                    r->max_given_keys);

    /* new requests */
    for (int i = 0; i < s->num_new; i++) {
        const ar_new_req *nr = &s->new_reqs[i];
        live_entry *e = live_get(&r->live, nr->req);
        if (e && ar_str_map_get(&r->finished_ids, nr->req) < 0) {
            if (e->preempted)
                return fail(r, err, err_len, "new request '%s' was preempted; it must come back as cached with \"resumed\": true",
                            nr->req);
            return fail(r, err, err_len, "new request id '%s' is already live", nr->req);
        }
        int n = ar_str_map_get(&r->sched_ids, nr->req);
        if (nr->num_computed_tokens % bs != 0)
            return fail(r, err, err_len, "num_computed_tokens %d of new request '%s' must be a multiple of block_size %d (prefix hits are whole blocks)",
                        nr->num_computed_tokens, nr->req, bs);
        if ((int64_t)nr->num_computed_tokens + n > nr->prompt_len)
            return fail(r, err, err_len, "new request '%s' schedules past its prompt: num_computed_tokens %d + %d > prompt_len %d",
                        nr->req, nr->num_computed_tokens, n, nr->prompt_len);
        int64_t need = ((int64_t)nr->num_computed_tokens + n + bs - 1) / bs;
        if (nr->num_block_ids < need)
            return fail(r, err, err_len, "block list of '%s' does not cover num_computed_tokens + n = %" PRId64 " tokens: %d blocks of %d",
                        nr->req, (int64_t)nr->num_computed_tokens + n, nr->num_block_ids, bs);
        int rep = find_repeated_block(r, NULL, 0, nr->block_ids, nr->num_block_ids);
        if (rep) return fail(r, err, err_len, "block id %d appears twice in the block list of '%s'", rep, nr->req);
        if (min_held < 0 || nr->num_block_ids < min_held) min_held = nr->num_block_ids;
    }

    /* cached requests */
    if (s->num_cached > r->cap_cached_entries) {
        live_entry **ne = ar_xrealloc_array(r->cached_entries, (size_t)s->num_cached, sizeof *ne);
        if (!ne) return fail(r, err, err_len, "out of memory");
        r->cached_entries = ne;
        r->cap_cached_entries = s->num_cached;
    }
    for (int i = 0; i < s->num_cached; i++) {
        const ar_cached_req *cr = &s->cached[i];
        live_entry *e = live_get(&r->live, cr->req);
        if (!e || ar_str_map_get(&r->finished_ids, cr->req) >= 0)
            return fail(r, err, err_len, "cached request '%s' is not live", cr->req);
        if (cr->resumed && !e->preempted)
            return fail(r, err, err_len, "cached request '%s' has \"resumed\": true but was not preempted", cr->req);
        if (!cr->resumed && e->preempted)
            return fail(r, err, err_len, "cached request '%s' was preempted and must have \"resumed\": true", cr->req);
        int n = ar_str_map_get(&r->sched_ids, cr->req);
        if (!cr->resumed && cr->num_computed_tokens != e->expected_computed)
            return fail(r, err, err_len, "num_computed_tokens of cached request '%s' is %d, expected %" PRId64
                        " (previous num_computed_tokens + scheduled tokens)", cr->req, cr->num_computed_tokens,
                        e->expected_computed);
        int held = cr->resumed ? cr->num_new_block_ids : e->num_blocks + cr->num_new_block_ids;
        int64_t need = ((int64_t)cr->num_computed_tokens + n + bs - 1) / bs;
        if (held < need)
            return fail(r, err, err_len, "block list of '%s' does not cover num_computed_tokens + n = %" PRId64 " tokens: %d blocks of %d",
                        cr->req, (int64_t)cr->num_computed_tokens + n, held, bs);
        if (cr->num_new_block_ids > 0) {
            int rep = cr->resumed ? find_repeated_block(r, NULL, 0, cr->new_block_ids, cr->num_new_block_ids)
                                  : find_repeated_block(r, e->blocks, e->num_blocks, cr->new_block_ids, cr->num_new_block_ids);
            if (rep) return fail(r, err, err_len, "block id %d appears twice in the block list of '%s'", rep, cr->req);
        }
        if (min_held < 0 || held < min_held) min_held = held;
        r->cached_entries[i] = e;
    }

    /* preempted: live (not preempted already, not finished), not scheduled now */
    for (int i = 0; i < s->num_preempted; i++) {
        const char *id = s->preempted[i];
        live_entry *e = live_get(&r->live, id);
        if (!e || e->preempted || ar_str_map_get(&r->finished_ids, id) >= 0)
            return fail(r, err, err_len, "preempted request '%s' is not live", id);
        if (ar_str_map_get(&r->sched_ids, id) >= 0)
            return fail(r, err, err_len, "preempted request '%s' is also scheduled in this step", id);
    }

    /* common prefix: at most the blocks of every scheduled request (of every live one when
     * nothing is scheduled) */
    if (s->num_common_prefix_blocks > 0) {
        if (min_held < 0) {
            for (int i = 0; i < r->live.num_live; i++) {
                live_entry *e = r->live.order[i];
                if (ar_str_map_get(&r->finished_ids, e->id) >= 0) continue;
                if (min_held < 0 || e->num_blocks < min_held) min_held = e->num_blocks;
            }
        }
        if (min_held < 0) min_held = 0;
        if (s->num_common_prefix_blocks > min_held)
            return fail(r, err, err_len, "num_common_prefix_blocks %d exceeds the %d blocks held by a scheduled request",
                        s->num_common_prefix_blocks, min_held);
    }
    return check_ownership(r, s, err, err_len);
}

/* ---- applying a validated step -------------------------------------------------------------- */

static int set_blocks(live_entry *e, const int *old, int n_old, const int *add, int n_add)
{
    int n = n_old + n_add;
    if (n > e->cap_blocks) {
        int ncap = e->cap_blocks ? e->cap_blocks : 8;
        while (ncap < n) ncap *= 2;
        int *nb = ar_xrealloc_array(e->blocks, (size_t)ncap, sizeof *nb);
        if (!nb) return -1;
        e->blocks = nb;
        e->cap_blocks = ncap;
    }
    if (old != e->blocks && n_old) memmove(e->blocks, old, (size_t)n_old * sizeof *old);
    if (n_add) memcpy(e->blocks + n_old, add, (size_t)n_add * sizeof *add);
    e->num_blocks = n;
    return 0;
}

static void drop_entry(ar_trace_reader *r, live_entry *e)
{
    if (!e->private_keys) r->given_keys -= e->num_keys;
    order_remove(&r->live, e);
    live_unhash(&r->live, e);
    entry_free(e);
}

/* Memory for new entries and block growth is reserved before any change, so that an out of
 * memory error cannot half-apply a step. */
static int apply_step(ar_trace_reader *r, const ar_step *s, char *err, size_t err_len)
{
    /* reserve: entries for new requests, block capacity for cached ones, table room */
    live_entry **fresh = ar_arena_alloc(&r->mem, (size_t)(s->num_new ? s->num_new : 1) * sizeof *fresh);
    if (!fresh) return fail(r, err, err_len, "out of memory");
    int made = 0;
    for (int i = 0; i < s->num_new; i++) {
        const ar_new_req *nr = &s->new_reqs[i];
        live_entry *e = calloc(1, sizeof *e);
        if (!e) goto oom;
        fresh[made++] = e;
        e->id = strdup(nr->req);
        e->pub.req_key = e->id ? ar_req_key(e->id) : 0;
        e->prompt_blocks = nr->num_block_keys;
        e->private_keys = r->new_private[i];
        int nkeys = keys_wanted(e, nr->num_block_ids);
        if (!e->id || keys_reserve(e, nkeys) || set_blocks(e, NULL, 0, nr->block_ids, nr->num_block_ids)) goto oom;
        if (nkeys) memcpy(e->keys, nr->block_keys, (size_t)nkeys * sizeof *e->keys);
        e->num_keys = nkeys;
        e->prompt_len = nr->prompt_len;
        e->num_computed = nr->num_computed_tokens;
        e->expected_computed = (int64_t)nr->num_computed_tokens + ar_str_map_get(&r->sched_ids, nr->req);
        e->last_key = chain_last_key(e, 0, AR_ROOT_KEY);
        e->order = -1;
    }
    for (int i = 0; i < s->num_cached; i++) {
        live_entry *e = r->cached_entries[i];
        int n = (s->cached[i].resumed ? 0 : e->num_blocks) + s->cached[i].num_new_block_ids;
        if (n > e->cap_blocks) {
            int ncap = e->cap_blocks ? e->cap_blocks : 8;
            while (ncap < n) ncap *= 2;
            int *nb = ar_xrealloc_array(e->blocks, (size_t)ncap, sizeof *nb);
            if (!nb) goto oom;
            e->blocks = nb;
            e->cap_blocks = ncap;
        }
        if (keys_reserve(e, keys_wanted(e, n))) goto oom;
    }
    while ((r->live.count + (size_t)s->num_new + 1) * 2 > r->live.cap)
        if (live_grow(&r->live)) goto oom;
    {
        int need_order = r->live.num_live + s->num_new + s->num_cached;
        if (need_order > r->live.cap_order) {
            int ncap = r->live.cap_order ? r->live.cap_order : 64;
            while (ncap < need_order) ncap *= 2;
            live_entry **no = ar_xrealloc_array(r->live.order, (size_t)ncap, sizeof *no);
            if (!no) goto oom;
            r->live.order = no;
            r->live.cap_order = ncap;
        }
    }

    /* from here on nothing can fail */
    for (int i = 0; i < s->num_finished; i++) drop_entry(r, live_get(&r->live, s->finished[i]));
    for (int i = 0; i < s->num_new; i++) {
        live_entry *e = fresh[i];
        if (!e->private_keys) r->given_keys += e->num_keys;
        live_insert(&r->live, e);
        order_push(&r->live, e);
        entry_refresh(e);
    }
    for (int i = 0; i < s->num_cached; i++) {
        const ar_cached_req *cr = &s->cached[i];
        live_entry *e = r->cached_entries[i];
        if (cr->resumed) {
            set_blocks(e, NULL, 0, cr->new_block_ids, cr->num_new_block_ids);
            keys_fill(e);
            e->last_key = chain_last_key(e, 0, AR_ROOT_KEY);
            e->preempted = false;
            order_push(&r->live, e);
        } else {
            int first = e->num_blocks;
            set_blocks(e, e->blocks, e->num_blocks, cr->new_block_ids, cr->num_new_block_ids);
            keys_fill(e);
            e->last_key = chain_last_key(e, first, e->last_key);
        }
        e->num_computed = cr->num_computed_tokens;
        e->expected_computed = (int64_t)cr->num_computed_tokens + ar_str_map_get(&r->sched_ids, cr->req);
        entry_refresh(e);
    }
    for (int i = 0; i < s->num_preempted; i++) {
        live_entry *e = live_get(&r->live, s->preempted[i]);
        order_remove(&r->live, e);
        e->preempted = true;
        e->num_blocks = 0;
        if (e->private_keys) {   /* remade from the id when it resumes */
            free(e->keys);
            e->keys = NULL;
            e->num_keys = e->cap_keys = 0;
        }
        e->last_key = AR_ROOT_KEY;
        e->num_computed = 0;
        entry_refresh(e);
    }
    r->have_prev = true;
    r->prev_step = s->step;
    r->prev_time = s->time;
    return 0;
oom:
    for (int i = 0; i < made; i++) entry_free(fresh[i]);
    return fail(r, err, err_len, "out of memory");
}

int ar_trace_next(ar_trace_reader *r, const ar_step **step, char *err, size_t err_len)
{
    *step = NULL;
    size_t len = 0;
    int rc = read_line(r, err, err_len, &len);
    if (rc <= 0) return rc;
    json_t *root = parse_line(r, len, err, err_len);
    if (!root) return -1;
    ar_arena_reset(&r->mem);
    ar_step s;
    rc = parse_step(r, root, &s, err, err_len);
    json_decref(root);
    if (rc == 0) rc = validate_step(r, &s, err, err_len);
    if (rc == 0) rc = apply_step(r, &s, err, err_len);
    if (rc != 0) {
        owner_rollback(r);
        memset(&r->step, 0, sizeof r->step);
        return -1;
    }
    r->num_undo = 0;   /* the step stands: its ownership changes stay */
    r->step = s;
    *step = &r->step;
    return 1;
}

const ar_live_req *ar_trace_find(const ar_trace_reader *r, const char *req)
{
    live_entry *e = live_get(&r->live, req);
    if (!e || e->preempted) return NULL;
    return &e->pub;
}

int ar_trace_live_count(const ar_trace_reader *r) { return r->live.num_live; }

const ar_live_req *ar_trace_live_at(const ar_trace_reader *r, int i)
{
    if (i < 0 || i >= r->live.num_live) return NULL;
    return &r->live.order[i]->pub;
}

uint64_t ar_block_content_key(uint64_t prev_key, const uint64_t *prompt_keys, int num_prompt_keys,
                              uint64_t req_key, int block_index)
{
    if (block_index >= 0 && block_index < num_prompt_keys) return prompt_keys[block_index];
    return ar_chain_key(prev_key, ar_private_payload(req_key, block_index));
}
