/* stats.c - whole-trace summary: ar_trace_stats_compute and `attnreplay info` (ar_trace_print_info),
 * and the per-step table of `attnreplay info TRACE --steps` (ar_trace_print_steps).
 *
 * Both stream the trace through the validating reader, so a broken trace is reported with its
 * file, line and rule.  Definitions:
 *   prefill tokens   scheduled tokens of a request while num_computed_tokens < prompt_len,
 *                    split at the prompt boundary (a chunk that crosses it counts in both);
 *                    tokens a resumed request recomputes beyond its prompt count as decode;
 *   step kinds       prefill-only / decode-only / mixed by the tokens above (empty steps: none);
 *   max context      the largest seq_len = num_computed_tokens + n of any scheduled request;
 *   prefix hits      num_computed_tokens / block_size of every new request;
 *   cascade-eligible steps whose common prefix passes vLLM's use_cascade_attention with
 *                    num_sms = AR_STATS_NUM_SMS (132, an H200), whatever the trace's cascade
 *                    flag; MLA traces never count (vLLM's MLA backends do not use cascade). */
#include "trace.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../reference/cascade.h"

static int grow_ints(int **v, int *cap, int need)
{
    if (need <= *cap) return 0;
    int ncap = *cap ? *cap : 64;
    while (ncap < need) ncap *= 2;
    int *nv = realloc(*v, (size_t)ncap * sizeof *nv);
    if (!nv) return -1;
    *v = nv;
    *cap = ncap;
    return 0;
}

/* What one step asks of the attention kernels. */
typedef struct {
    int64_t tokens, prefill_tokens;
    int64_t max_seq_len;          /* largest num_computed_tokens + n */
    int64_t kv_tokens;            /* sum of seq_lens */
    double qk_pairs;              /* sum of n * (num_computed + (n + 1) / 2): causal query-key pairs */
    bool cascade_eligible;
} step_shape;

typedef struct {
    int *context_lens, *query_lens;   /* [num_scheduled] */
    int cap_context, cap_query;
} step_scratch;

/* Measures step s, just returned by r.  Returns 0, or -1 when out of memory. */
static int measure_step(const ar_trace_reader *r, const ar_step *s, step_scratch *w, step_shape *out)
{
    const ar_trace_header *hdr = ar_trace_header_of(r);
    memset(out, 0, sizeof *out);
    if (grow_ints(&w->context_lens, &w->cap_context, s->num_scheduled) ||
        grow_ints(&w->query_lens, &w->cap_query, s->num_scheduled))
        return -1;
    for (int i = 0; i < s->num_scheduled; i++) {
        const ar_live_req *lr = ar_trace_find(r, s->scheduled[i].req);
        int n = s->scheduled[i].num_tokens;
        int computed = lr ? lr->num_computed_tokens : 0;
        int prompt_len = lr ? lr->prompt_len : 0;
        int64_t prefill = 0;
        if (computed < prompt_len) prefill = prompt_len - computed < n ? prompt_len - computed : n;
        out->tokens += n;
        out->prefill_tokens += prefill;
        if ((int64_t)computed + n > out->max_seq_len) out->max_seq_len = (int64_t)computed + n;
        out->kv_tokens += (int64_t)computed + n;
        out->qk_pairs += (double)n * ((double)computed + (double)(n + 1) / 2.0);
        w->context_lens[i] = computed;
        w->query_lens[i] = n;
    }
    if (s->num_common_prefix_blocks > 0 && hdr->model.attention == AR_ATTN_MHA) {
        int p = ar_common_prefix_len(s->num_common_prefix_blocks, hdr->cache.block_size, w->context_lens,
                                     s->num_scheduled);
        out->cascade_eligible = ar_use_cascade(p, w->query_lens, s->num_scheduled, hdr->model.num_q_heads,
                                               hdr->model.num_kv_heads, hdr->model.sliding_window > 0,
                                               AR_STATS_NUM_SMS);
    }
    return 0;
}

int ar_trace_stats_compute(const char *path, ar_trace_stats *st, ar_trace_header *h,
                           char *err, size_t err_len)
{
    memset(st, 0, sizeof *st);
    ar_trace_reader *r = ar_trace_open(path, err, err_len);
    if (!r) return -1;
    const ar_trace_header *hdr = ar_trace_header_of(r);
    if (h) *h = *hdr;
    int bs = hdr->cache.block_size;
    step_scratch w = { 0 };
    const ar_step *s;
    int rc;
    while ((rc = ar_trace_next(r, &s, err, err_len)) == 1) {
        st->steps++;
        st->requests += s->num_new;
        st->preemptions += s->num_preempted;
        st->duration = s->time;
        for (int i = 0; i < s->num_new; i++) st->prefix_hit_blocks += s->new_reqs[i].num_computed_tokens / bs;
        step_shape shape;
        if (measure_step(r, s, &w, &shape) != 0) {
            snprintf(err, err_len, "%s:%ld: out of memory", path, s->line);
            rc = -1;
            break;
        }
        st->tokens += shape.tokens;
        st->prefill_tokens += shape.prefill_tokens;
        st->decode_tokens += shape.tokens - shape.prefill_tokens;
        if (shape.max_seq_len > st->max_context) st->max_context = shape.max_seq_len;
        if (shape.tokens > st->max_batch_tokens) st->max_batch_tokens = shape.tokens;
        if (shape.tokens > 0) {
            if (shape.prefill_tokens == shape.tokens) st->prefill_only_steps++;
            else if (shape.prefill_tokens == 0) st->decode_only_steps++;
            else st->mixed_steps++;
        }
        st->cascade_eligible_steps += shape.cascade_eligible;
    }
    free(w.context_lens);
    free(w.query_lens);
    ar_trace_close(r);
    return rc < 0 ? -1 : 0;
}

/* err for output that could not be written; e is the failed write's errno (0: not known). */
static void output_error(int e, char *err, size_t err_len)
{
    snprintf(err, err_len, "cannot write the output (%s)", e ? strerror(e) : "a write failed");
}

int ar_trace_print_steps(const char *path, FILE *out, char *err, size_t err_len)
{
    ar_trace_reader *r = ar_trace_open(path, err, err_len);
    if (!r) return -1;
    fprintf(out, "#step time_s requests tokens prefill_tokens max_seq_len kv_tokens qk_pairs cascade_eligible\n");
    step_scratch w = { 0 };
    const ar_step *s;
    int rc, out_errno = 0;
    while ((rc = ar_trace_next(r, &s, err, err_len)) == 1) {
        step_shape shape;
        if (measure_step(r, s, &w, &shape) != 0) {
            snprintf(err, err_len, "%s:%ld: out of memory", path, s->line);
            rc = -1;
            break;
        }
        fprintf(out, "%lld %.6f %d %lld %lld %lld %lld %.0f %d\n", (long long)s->step, s->time, s->num_scheduled,
                (long long)shape.tokens, (long long)shape.prefill_tokens, (long long)shape.max_seq_len,
                (long long)shape.kv_tokens, shape.qk_pairs, shape.cascade_eligible);
        if (ferror(out)) {   /* the table cannot be written: no use reading on */
            out_errno = errno;
            break;
        }
    }
    free(w.context_lens);
    free(w.query_lens);
    ar_trace_close(r);
    if (rc >= 0 && ferror(out)) {
        output_error(out_errno, err, err_len);
        return -1;
    }
    return rc < 0 ? -1 : 0;
}

static double percent(int64_t part, int64_t whole)
{
    return whole > 0 ? 100.0 * (double)part / (double)whole : 0.0;
}

int ar_trace_print_info(const char *path, FILE *out, char *err, size_t err_len)
{
    ar_trace_stats st;
    ar_trace_header h;
    if (ar_trace_stats_compute(path, &st, &h, err, err_len) != 0) return -1;
    const ar_model *m = &h.model;
    fprintf(out, "trace      %s (format v%d, source \"%s\", seed %llu)\n", path, h.version, h.source,
            (unsigned long long)h.seed);
    if (m->attention == AR_ATTN_MLA)
        fprintf(out, "model      %s: MLA, %d layers, %d q heads, kv_lora_rank %d, rope %d, nope %d, v %d, scale %.6g\n",
                m->name, m->num_layers, m->num_q_heads, m->kv_lora_rank, m->qk_rope_head_dim, m->qk_nope_head_dim,
                m->v_head_dim, m->scale);
    else
        fprintf(out, "model      %s: MHA, %d layers, %d q heads, %d kv heads, head_size %d, scale %.6g\n", m->name,
                m->num_layers, m->num_q_heads, m->num_kv_heads, m->head_size, m->scale);
    if (m->sliding_window || m->logits_soft_cap != 0)
        fprintf(out, "           sliding_window %d, logits_soft_cap %g\n", m->sliding_window, m->logits_soft_cap);
    fprintf(out, "cache      block_size %d, %d blocks (incl. null block 0), dtype %s, kv_cache_dtype %s\n",
            h.cache.block_size, h.cache.num_blocks, ar_dtype_name(h.cache.dtype), ar_dtype_name(h.cache.kv_cache_dtype));
    fprintf(out, "scheduler  max_num_batched_tokens %d, max_num_seqs %d, prefix caching %s, cascade %s\n",
            h.sched.max_num_batched_tokens, h.sched.max_num_seqs, h.sched.prefix_caching ? "on" : "off",
            h.sched.cascade ? "on" : "off");
    fprintf(out, "steps      %lld (prefill-only %lld, decode-only %lld, mixed %lld)\n", (long long)st.steps,
            (long long)st.prefill_only_steps, (long long)st.decode_only_steps, (long long)st.mixed_steps);
    fprintf(out, "requests   %lld\n", (long long)st.requests);
    fprintf(out, "tokens     %lld scheduled: prefill %lld (%.1f%%), decode %lld (%.1f%%)\n", (long long)st.tokens,
            (long long)st.prefill_tokens, percent(st.prefill_tokens, st.tokens), (long long)st.decode_tokens,
            percent(st.decode_tokens, st.tokens));
    fprintf(out, "max        context %lld tokens, batch %lld tokens\n", (long long)st.max_context,
            (long long)st.max_batch_tokens);
    fprintf(out, "prefix     %lld blocks hit by new requests\n", (long long)st.prefix_hit_blocks);
    fprintf(out, "cascade    %lld eligible steps (vLLM heuristic, %d SMs%s)\n", (long long)st.cascade_eligible_steps,
            AR_STATS_NUM_SMS, m->attention == AR_ATTN_MLA ? "; MLA never uses cascade" : "");
    fprintf(out, "preempted  %lld times\n", (long long)st.preemptions);
    fprintf(out, "duration   %.3f s\n", st.duration);
    if (ferror(out)) {
        output_error(errno, err, err_len);
        return -1;
    }
    return 0;
}

int ar_parse_step_range(const char *s, int64_t *a, int64_t *b)
{
    const char *colon = strchr(s, ':');
    char *end;
    if (!colon) return -1;
    *a = 0;
    *b = INT64_MAX;
    if (colon != s) {
        *a = strtoll(s, &end, 10);
        if (end != colon || *a < 0) return -1;
    }
    if (colon[1]) {
        *b = strtoll(colon + 1, &end, 10);
        if (*end || *b < *a) return -1;
    }
    return 0;
}

int ar_trace_file_hash(const char *path, char out[17])
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint64_t h = 1469598103934665603ull;
    unsigned char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        for (size_t i = 0; i < n; i++) h = (h ^ buf[i]) * 1099511628211ull;
    int bad = ferror(f);
    fclose(f);
    if (bad) return -1;
    snprintf(out, 17, "%016llx", (unsigned long long)h);
    return 0;
}
