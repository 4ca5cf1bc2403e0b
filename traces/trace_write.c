/* trace_write.c - the trace writer (ar_trace_create / ar_trace_write_step / ar_trace_finish):
 * the header and step lines of DESIGN section 3's sketch, gzip when the path ends in ".gz";
 * block keys always as "block_keys"; every write and the close are checked.  gzip output is a
 * series of members of about 1 MiB each, compressed by libdeflate (level 1) on worker threads
 * while the caller goes on (see gz_pipe below).  trace.c reads what this writes. */
#include "trace.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <libdeflate.h>
#include <pthread.h>
#include <unistd.h>

typedef struct str_buf {
    char *p;
    size_t len, cap;
    bool oom;
} str_buf;

static void sb_reserve(str_buf *b, size_t extra)
{
    if (b->oom || b->len + extra + 1 <= b->cap) return;
    size_t ncap = b->cap ? b->cap : 4096;
    while (ncap < b->len + extra + 1) ncap *= 2;
    char *np = realloc(b->p, ncap);
    if (!np) { b->oom = true; return; }
    b->p = np;
    b->cap = ncap;
}

static void sb_add(str_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 <= b->cap) {   /* the common case: room already */
        memcpy(b->p + b->len, s, n);
        b->len += n;
        b->p[b->len] = 0;
        return;
    }
    sb_reserve(b, n);
    if (b->oom) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_puts(str_buf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_printf(str_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(str_buf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) { sb_add(b, tmp, (size_t)n); return; }
    sb_reserve(b, (size_t)n);
    if (b->oom) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* A JSON string literal. */
static void sb_json_str(str_buf *b, const char *s)
{
    size_t plain = 0;   /* fast path: nothing to escape */
    while (s[plain] && s[plain] != '"' && s[plain] != '\\' && (unsigned char)s[plain] >= 0x20) plain++;
    if (!s[plain]) {
        sb_add(b, "\"", 1);
        sb_add(b, s, plain);
        sb_add(b, "\"", 1);
        return;
    }
    sb_add(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"') sb_add(b, "\\\"", 2);
        else if (*c == '\\') sb_add(b, "\\\\", 2);
        else if (*c == '\n') sb_add(b, "\\n", 2);
        else if (*c == '\t') sb_add(b, "\\t", 2);
        else if (*c == '\r') sb_add(b, "\\r", 2);
        else if (*c < 0x20) sb_printf(b, "\\u%04x", *c);
        else sb_add(b, (const char *)c, 1);
    }
    sb_add(b, "\"", 1);
}

static void sb_int(str_buf *b, long long v)
{
    char tmp[24];
    int n = 0;
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v : (unsigned long long)v;
    do { tmp[sizeof tmp - 1 - n++] = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) tmp[sizeof tmp - 1 - n++] = '-';
    sb_add(b, tmp + sizeof tmp - n, (size_t)n);
}

/* Shortest of %.15g/%.16g/%.17g that reads back exactly.  Fast path for times in whole
 * microseconds (what the simulator writes): v = k / 10^6 exactly as a double, 1e-4 <= v < 1e9,
 * printed as the same digits %.15g gives, without snprintf and strtod. */
static void sb_double(str_buf *b, double v)
{
    if (v >= 1e-4 && v < 1e9) {
        long long micro = llround(v * 1e6);
        if ((double)micro / 1e6 == v) {
            long long whole = micro / 1000000, frac = micro % 1000000;
            sb_int(b, whole);
            char tmp[8];
            int n = 0;
            tmp[n++] = '.';
            int digits = 6;
            if (frac == 0) {
                tmp[n++] = '0';
            } else {
                while (frac % 10 == 0) { frac /= 10; digits--; }
                for (int i = digits; i >= 1; i--, frac /= 10) tmp[i] = (char)('0' + frac % 10);
                n += digits;
            }
            sb_add(b, tmp, (size_t)n);
            return;
        }
    }
    char tmp[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        if (strtod(tmp, NULL) == v) break;
    }
    /* keep it a JSON real so it reads back as a number either way */
    sb_puts(b, tmp);
    if (!strpbrk(tmp, ".eEn")) sb_puts(b, ".0");
}


/* A content key as a JSON string of 16 lower-case hex digits. */
static void sb_hex_key(str_buf *b, uint64_t key)
{
    static const char digits[] = "0123456789abcdef";
    char tmp[18];
    tmp[0] = tmp[17] = '"';
    for (int i = 16; i >= 1; i--, key >>= 4) tmp[i] = digits[key & 15];
    sb_add(b, tmp, sizeof tmp);
}

static void sb_int_list(str_buf *b, const int *v, int n)
{
    sb_add(b, "[", 1);
    for (int i = 0; i < n; i++) {
        if (i) sb_add(b, ",", 1);
        sb_int(b, v[i]);
    }
    sb_add(b, "]", 1);
}

static void sb_id_list(str_buf *b, char *const *v, int n)
{
    sb_add(b, "[", 1);
    for (int i = 0; i < n; i++) {
        if (i) sb_add(b, ",", 1);
        sb_json_str(b, v[i]);
    }
    sb_add(b, "]", 1);
}

/* gzip output.  Step lines collect in chunks of GZ_CHUNK bytes; each chunk becomes one gzip
 * member (RFC 1952: a gzip file is a series of members; zlib's gzread, gzip and Python read
 * them as one stream), compressed by libdeflate at level 1 on a worker thread and written in
 * chunk order, so compression overlaps the simulator and, with two workers, itself.  Slots
 * cycle FREE -> OPEN (the writer fills it) -> FILLED -> BUSY (a worker compresses it, then
 * waits for its turn to write) -> FREE.  The first write error is kept and reported by the
 * next ar_trace_write_step or by ar_trace_finish. */
#define GZ_CHUNK (1u << 20)
#define GZ_LEVEL 1
#define GZ_MAX_WORKERS 2
#define GZ_SLOTS (2 * GZ_MAX_WORKERS + 1)

enum { SLOT_FREE = 0, SLOT_OPEN, SLOT_FILLED, SLOT_BUSY };

typedef struct gz_slot {
    char *in, *out;
    size_t in_len, in_cap, out_cap;
    int64_t seq;
    int state;
} gz_slot;

typedef struct gz_pipe {
    pthread_mutex_t mu;
    pthread_cond_t work;    /* a slot was filled, or stop */
    pthread_cond_t turn;    /* a chunk was written: the next may go, a slot is free */
    gz_slot slots[GZ_SLOTS];
    pthread_t threads[GZ_MAX_WORKERS];
    int num_threads;
    int64_t next_seq, next_write;
    bool stop;
    int io_errno;           /* first write error (errno), or -1 out of memory; 0 none */
    FILE *f;
    gz_slot *open;          /* the slot being filled */
} gz_pipe;

struct ar_trace_writer {
    char *path;
    bool is_gz;
    gz_pipe *gz;
    FILE *f;
    str_buf line;
    bool failed;
};

/* Compresses slot->in into slot->out as one gzip member; 0, or -1 out of memory. */
static int gz_compress_slot(struct libdeflate_compressor *c, gz_slot *slot, size_t *out_len)
{
    size_t bound = libdeflate_gzip_compress_bound(c, slot->in_len);
    if (bound > slot->out_cap) {
        char *np = realloc(slot->out, bound);
        if (!np) return -1;
        slot->out = np;
        slot->out_cap = bound;
    }
    *out_len = libdeflate_gzip_compress(c, slot->in, slot->in_len, slot->out, slot->out_cap);
    return *out_len > 0 ? 0 : -1;
}

/* Writes a compressed slot when its turn comes (called with mu held; returns with it held). */
static void gz_write_in_order(gz_pipe *p, gz_slot *slot, size_t out_len, int compress_rc)
{
    while (p->next_write != slot->seq) pthread_cond_wait(&p->turn, &p->mu);
    if (p->io_errno == 0) {
        if (compress_rc != 0) {
            p->io_errno = -1;
        } else {
            pthread_mutex_unlock(&p->mu);
            errno = 0;
            bool ok = fwrite(slot->out, 1, out_len, p->f) == out_len;
            int saved = errno ? errno : EIO;
            pthread_mutex_lock(&p->mu);
            if (!ok && p->io_errno == 0) p->io_errno = saved;
        }
    }
    p->next_write++;
    slot->in_len = 0;
    slot->state = SLOT_FREE;
    pthread_cond_broadcast(&p->turn);
}

static void *gz_worker(void *arg)
{
    gz_pipe *p = arg;
    struct libdeflate_compressor *c = libdeflate_alloc_compressor(GZ_LEVEL);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        gz_slot *pick = NULL;
        for (int i = 0; i < GZ_SLOTS; i++)
            if (p->slots[i].state == SLOT_FILLED && (!pick || p->slots[i].seq < pick->seq)) pick = &p->slots[i];
        if (!pick) {
            if (p->stop) break;
            pthread_cond_wait(&p->work, &p->mu);
            continue;
        }
        pick->state = SLOT_BUSY;
        pthread_mutex_unlock(&p->mu);
        size_t out_len = 0;
        int rc = c ? gz_compress_slot(c, pick, &out_len) : -1;
        pthread_mutex_lock(&p->mu);
        gz_write_in_order(p, pick, out_len, rc);
    }
    pthread_mutex_unlock(&p->mu);
    libdeflate_free_compressor(c);
    return NULL;
}

/* Hands the open slot to the workers (compresses it here when there are none) and opens a free
 * one; with finishing set, opens none. */
static void gz_submit(gz_pipe *p, bool finishing)
{
    pthread_mutex_lock(&p->mu);
    gz_slot *slot = p->open;
    p->open = NULL;
    if (slot && slot->in_len > 0) {
        slot->seq = p->next_seq++;
        if (p->num_threads > 0) {
            slot->state = SLOT_FILLED;
            pthread_cond_signal(&p->work);
        } else {
            slot->state = SLOT_BUSY;
            pthread_mutex_unlock(&p->mu);
            struct libdeflate_compressor *c = libdeflate_alloc_compressor(GZ_LEVEL);
            size_t out_len = 0;
            int rc = c ? gz_compress_slot(c, slot, &out_len) : -1;
            libdeflate_free_compressor(c);
            pthread_mutex_lock(&p->mu);
            gz_write_in_order(p, slot, out_len, rc);
        }
    } else if (slot) {
        slot->state = SLOT_FREE;
    }
    while (!finishing && !p->open) {
        for (int i = 0; i < GZ_SLOTS && !p->open; i++)
            if (p->slots[i].state == SLOT_FREE) p->open = &p->slots[i];
        if (!p->open) pthread_cond_wait(&p->turn, &p->mu);
    }
    if (p->open) p->open->state = SLOT_OPEN;
    pthread_mutex_unlock(&p->mu);
}

static gz_pipe *gz_pipe_open(FILE *f)
{
    gz_pipe *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->turn, NULL);
    p->f = f;
    p->open = &p->slots[0];
    p->open->state = SLOT_OPEN;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int want = cpus >= GZ_MAX_WORKERS ? GZ_MAX_WORKERS : 1;
    pthread_mutex_lock(&p->mu);   /* the workers read the pipe under mu from their first instant */
    for (int i = 0; i < want; i++)
        if (pthread_create(&p->threads[p->num_threads], NULL, gz_worker, p) == 0) p->num_threads++;
    pthread_mutex_unlock(&p->mu);
    return p;
}

/* Submits what is left, stops the workers; returns the first write error (0 none, -1 OOM). */
static int gz_pipe_close(gz_pipe *p)
{
    gz_submit(p, true);
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->num_threads; i++) pthread_join(p->threads[i], NULL);
    int io = p->io_errno;
    for (int i = 0; i < GZ_SLOTS; i++) {
        free(p->slots[i].in);
        free(p->slots[i].out);
    }
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->turn);
    pthread_mutex_destroy(&p->mu);
    free(p);
    return io;
}

static int gz_errno(gz_pipe *p)
{
    pthread_mutex_lock(&p->mu);
    int io = p->io_errno;
    pthread_mutex_unlock(&p->mu);
    return io;
}

/* Appends a finished line to the open slot; submits the slot once it holds GZ_CHUNK bytes. */
static int gz_append(gz_pipe *p, const char *s, size_t n)
{
    gz_slot *slot = p->open;
    if (slot->in_len + n > slot->in_cap) {
        size_t cap = slot->in_cap ? slot->in_cap : GZ_CHUNK + (GZ_CHUNK >> 2);
        while (cap < slot->in_len + n) cap *= 2;
        char *np = realloc(slot->in, cap);
        if (!np) return -1;
        slot->in = np;
        slot->in_cap = cap;
    }
    memcpy(slot->in + slot->in_len, s, n);
    slot->in_len += n;
    if (slot->in_len >= GZ_CHUNK) gz_submit(p, false);
    return 0;
}

static void write_error(ar_trace_writer *w, int io, char *err, size_t err_len)
{
    snprintf(err, err_len, "%s: write failed: %s", w->path, io < 0 ? "out of memory" : strerror(io));
    w->failed = true;
}

static int writer_emit(ar_trace_writer *w, char *err, size_t err_len)
{
    if (w->line.oom) {
        snprintf(err, err_len, "%s: out of memory building a line", w->path);
        w->failed = true;
        return -1;
    }
    sb_add(&w->line, "\n", 1);
    if (w->is_gz) {
        int io = gz_errno(w->gz);
        if (io == 0 && gz_append(w->gz, w->line.p, w->line.len) != 0) io = -1;
        if (io != 0) {
            write_error(w, io, err, err_len);
            return -1;
        }
    } else if (fwrite(w->line.p, 1, w->line.len, w->f) != w->line.len) {
        write_error(w, errno ? errno : EIO, err, err_len);
        return -1;
    }
    return 0;
}

static void writer_free(ar_trace_writer *w)
{
    free(w->path);
    free(w->line.p);
    free(w);
}

/* Closes the output; 0, or -1 with err set unless an earlier error was already reported. */
static int writer_close(ar_trace_writer *w, int rc, char *err, size_t err_len)
{
    int io = w->gz ? gz_pipe_close(w->gz) : 0;
    if (io != 0 && rc == 0) {
        write_error(w, io, err, err_len);
        rc = -1;
    }
    errno = 0;
    bool bad = fflush(w->f) != 0 || ferror(w->f);
    int saved = errno ? errno : EIO;
    if (fclose(w->f) != 0 && !bad) { bad = true; saved = errno ? errno : EIO; }
    if (bad && rc == 0) {
        snprintf(err, err_len, "%s: close failed: %s", w->path, strerror(saved));
        rc = -1;
    }
    writer_free(w);
    return rc;
}

ar_trace_writer *ar_trace_create(const char *path, const ar_trace_header *h, char *err, size_t err_len)
{
    size_t n = strlen(path);
    return ar_trace_create_as(path, n >= 3 && strcmp(path + n - 3, ".gz") == 0, h, err, err_len);
}

ar_trace_writer *ar_trace_create_as(const char *path, bool gz, const ar_trace_header *h, char *err, size_t err_len)
{
    ar_trace_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        snprintf(err, err_len, "%s: out of memory", path);
        free(w);
        return NULL;
    }
    w->is_gz = gz;
    w->f = fopen(path, "wb");
    if (!w->f) {
        snprintf(err, err_len, "%s: cannot create: %s", path, strerror(errno));
        writer_free(w);
        return NULL;
    }
    if (w->is_gz) {
        if (!(w->gz = gz_pipe_open(w->f))) {
            snprintf(err, err_len, "%s: out of memory", path);
            fclose(w->f);
            writer_free(w);
            return NULL;
        }
    } else {
        setvbuf(w->f, NULL, _IOFBF, 1 << 20);
    }
    const ar_model *m = &h->model;
    str_buf *b = &w->line;
    sb_puts(b, "{\"format\":\"" AR_TRACE_FORMAT "\",\"version\":");
    sb_printf(b, "%d", AR_TRACE_VERSION);
    sb_puts(b, ",\"model\":{\"name\":");
    sb_json_str(b, m->name);
    sb_printf(b, ",\"attention\":\"%s\",\"num_layers\":%d,\"num_q_heads\":%d,\"num_kv_heads\":%d,\"head_size\":%d",
              m->attention == AR_ATTN_MLA ? "mla" : "mha", m->num_layers, m->num_q_heads, m->num_kv_heads, m->head_size);
    if (m->attention == AR_ATTN_MLA)
        sb_printf(b, ",\"kv_lora_rank\":%d,\"qk_rope_head_dim\":%d,\"qk_nope_head_dim\":%d,\"v_head_dim\":%d",
                  m->kv_lora_rank, m->qk_rope_head_dim, m->qk_nope_head_dim, m->v_head_dim);
    sb_puts(b, ",\"scale\":");
    sb_double(b, m->scale);
    if (m->sliding_window) sb_printf(b, ",\"sliding_window\":%d", m->sliding_window);
    if (m->logits_soft_cap != 0) {
        sb_puts(b, ",\"logits_soft_cap\":");
        sb_double(b, m->logits_soft_cap);
    }
    const ar_cache_config *c = &h->cache;
    sb_printf(b, "},\"cache\":{\"block_size\":%d,\"num_blocks\":%d,\"dtype\":\"%s\",\"kv_cache_dtype\":\"%s\"}",
              c->block_size, c->num_blocks, ar_dtype_name(c->dtype),
              c->kv_cache_dtype == c->dtype ? "auto" : ar_dtype_name(c->kv_cache_dtype));
    const ar_sched_config *sc = &h->sched;
    sb_printf(b, ",\"scheduler\":{\"max_num_batched_tokens\":%d,\"max_num_seqs\":%d,\"prefix_caching\":%s,\"cascade\":%s}",
              sc->max_num_batched_tokens, sc->max_num_seqs, sc->prefix_caching ? "true" : "false",
              sc->cascade ? "true" : "false");
    sb_puts(b, ",\"source\":");
    sb_json_str(b, h->source);
    if (h->seed > (uint64_t)INT64_MAX) sb_printf(b, ",\"seed\":\"%" PRIu64 "\"}", h->seed);   /* beyond JSON readers' int64 */
    else sb_printf(b, ",\"seed\":%" PRIu64 "}", h->seed);
    if (writer_emit(w, err, err_len) != 0) {
        writer_close(w, -1, err, err_len);
        return NULL;
    }
    return w;
}

int ar_trace_write_step(ar_trace_writer *w, const ar_step *s, char *err, size_t err_len)
{
    if (w->failed) {
        snprintf(err, err_len, "%s: an earlier write failed", w->path);
        return -1;
    }
    if (!isfinite(s->time)) {   /* JSON has no inf or nan: the line could never be read back */
        snprintf(err, err_len, "%s: step %lld: time %g is not a finite number of seconds", w->path,
                 (long long)s->step, s->time);
        return -1;
    }
    str_buf *b = &w->line;
    b->len = 0;
    if (b->p) b->p[0] = 0;
    sb_puts(b, "{\"step\":");
    sb_int(b, s->step);
    sb_puts(b, ",\"time\":");
    sb_double(b, s->time);
    sb_puts(b, ",\"new\":[");
    for (int i = 0; i < s->num_new; i++) {
        const ar_new_req *nr = &s->new_reqs[i];
        sb_puts(b, i ? ",{\"req\":" : "{\"req\":");
        sb_json_str(b, nr->req);
        sb_puts(b, ",\"prompt_len\":");
        sb_int(b, nr->prompt_len);
        sb_puts(b, ",\"num_computed_tokens\":");
        sb_int(b, nr->num_computed_tokens);
        sb_puts(b, ",\"block_ids\":");
        sb_int_list(b, nr->block_ids, nr->num_block_ids);
        if (nr->num_block_keys > 0) {
            sb_puts(b, ",\"block_keys\":[");
            for (int k = 0; k < nr->num_block_keys; k++) {
                if (k) sb_add(b, ",", 1);
                sb_hex_key(b, nr->block_keys[k]);
            }
            sb_puts(b, "]");
        }
        sb_puts(b, "}");
    }
    sb_puts(b, "],\"cached\":[");
    for (int i = 0; i < s->num_cached; i++) {
        const ar_cached_req *cr = &s->cached[i];
        sb_puts(b, i ? ",{\"req\":" : "{\"req\":");
        sb_json_str(b, cr->req);
        sb_puts(b, ",\"num_computed_tokens\":");
        sb_int(b, cr->num_computed_tokens);
        sb_puts(b, ",\"new_block_ids\":");
        sb_int_list(b, cr->new_block_ids, cr->num_new_block_ids);
        sb_puts(b, cr->resumed ? ",\"resumed\":true}" : ",\"resumed\":false}");
    }
    sb_puts(b, "],\"num_scheduled_tokens\":{");
    for (int i = 0; i < s->num_scheduled; i++) {
        if (i) sb_puts(b, ",");
        sb_json_str(b, s->scheduled[i].req);
        sb_add(b, ":", 1);
        sb_int(b, s->scheduled[i].num_tokens);
    }
    sb_puts(b, "},\"num_common_prefix_blocks\":");
    sb_int(b, s->num_common_prefix_blocks);
    sb_puts(b, ",\"finished\":");
    sb_id_list(b, s->finished, s->num_finished);
    sb_puts(b, ",\"preempted\":");
    sb_id_list(b, s->preempted, s->num_preempted);
    sb_puts(b, "}");
    return writer_emit(w, err, err_len);
}

int ar_trace_finish(ar_trace_writer *w, char *err, size_t err_len)
{
    if (!w) return -1;
    int rc = w->failed ? -1 : 0;
    if (w->failed) snprintf(err, err_len, "%s: an earlier write failed", w->path);
    return writer_close(w, rc, err, err_len);
}
