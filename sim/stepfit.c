/* stepfit.c - engine step timings reconstructed from a real vLLM run's per-request timestamps,
 * and how far a step-time model is from them (sim/README.md, "Step timings of a real run").
 *
 * vLLM stamps a request's first and last token with the time the engine core built the step's
 * outputs, so requests served by the same step share the stamp: every first_token_ts and
 * last_token_ts is the end of some engine step.  Between a request's first and last token the
 * engine ran exactly output_toks - 1 steps (one token per step, unless the request was preempted).
 * Taking each distinct stamp as a node and each request as an edge of output_toks - 1 steps, the
 * nodes of one connected component get exact step indices relative to each other; two nodes of a
 * component adjacent in time bound an interval of known duration and known step count.
 *
 * What the engine ran inside an interval is rebuilt from the same requests: at time t a request
 * decodes (one token, context = prompt + tokens generated so far at its own mean rate) between its
 * first and last token, and is in its prompt between its first schedule and its first token (its
 * remaining prompt shrinking linearly over that time); a step gives the budget left after the
 * decodes to the prefilling requests in the order they were first scheduled.  A model's step time
 * tau(t) at sample points across the interval predicts interval / harmonic mean(tau) steps; the
 * residual is log(predicted / observed steps).  Two things no stamp shows can be supplied from a
 * simulation of the run: prompt tokens recomputed after a preemption, per interval
 * (set_recompute), and, per piece, the requests waiting preempted there, which then do not count
 * as decoding although between their first and last token (set_waiting). */
#include "sim.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define STEPFIT_SAME_STAMP_S 1e-6   /* stamps closer than this are one step end */

static bool json_number_field(json_t *obj, const char *name, double *out)
{
    json_t *v = json_object_get(obj, name);
    if (!v || !json_is_number(v)) return false;
    *out = json_number_value(v);
    return isfinite(*out) != 0;
}

int ar_run_load(const char *path, ar_run_req **out, int *num, char *err, size_t err_len)
{
    char file[1200];
    struct stat sb;
    snprintf(file, sizeof file, "%s%s", path, stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) ? "/requests.jsonl" : "");
    *out = NULL;
    *num = 0;
    FILE *f = fopen(file, "r");
    if (!f) {
        snprintf(err, err_len, "%s: cannot open: %s", file, strerror(errno));
        return 2;
    }
    ar_run_req *reqs = NULL;
    int n = 0, cap = 0, rc = 0;
    char *line = NULL;   /* a line of any length (getline), so line numbers stay those of the file */
    size_t line_cap = 0;
    ssize_t len;
    long lineno = 0;
    errno = 0;
    while ((len = getline(&line, &line_cap, f)) >= 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == (size_t)len) continue;
        json_error_t jerr;
        json_t *o = json_loadb(line, (size_t)len, JSON_REJECT_DUPLICATES, &jerr);
        if (!o && strstr(jerr.text, "duplicate object key")) {   /* else the last one would silently win */
            snprintf(err, err_len, "%s:%ld: duplicate key in a JSON object (%s): a row gives each field once", file,
                     lineno, jerr.text);
            rc = 2;
            break;
        }
        double in = 0, outt = 0, sched = 0, first = 0, last = 0;
        bool ok = o && json_number_field(o, "input_toks", &in) && json_number_field(o, "output_toks", &outt) &&
                  json_number_field(o, "scheduled_ts", &sched) && json_number_field(o, "first_token_ts", &first) &&
                  json_number_field(o, "last_token_ts", &last);
        json_decref(o);
        if (!ok || in < 1 || outt < 1 || in != floor(in) || outt != floor(outt) || in > 1e8 || outt > 1e8 ||
            !(sched <= first && first <= last)) {
            snprintf(err, err_len, "%s:%ld: row needs positive integer input_toks and output_toks and "
                     "scheduled_ts <= first_token_ts <= last_token_ts", file, lineno);
            rc = 2;
            break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            ar_run_req *grown = realloc(reqs, (size_t)cap * sizeof *reqs);
            if (!grown) {
                snprintf(err, err_len, "%s: out of memory", file);
                rc = 2;
                break;
            }
            reqs = grown;
        }
        reqs[n++] = (ar_run_req){(int)in, (int)outt, sched, first, last};
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, err_len, "%s: read error after line %ld: %s", file, lineno, strerror(errno ? errno : EIO));
        rc = 2;
    }
    free(line);
    fclose(f);
    if (rc == 0 && n == 0) {
        snprintf(err, err_len, "%s: no requests", file);
        rc = 2;
    }
    if (rc != 0) {
        free(reqs);
        return rc;
    }
    *out = reqs;
    *num = n;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The node (index into the sorted distinct stamps) of time t. */
static int node_of(const double *nodes, int n, double t)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (nodes[mid] < t - STEPFIT_SAME_STAMP_S) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

int ar_step_intervals(const ar_run_req *reqs, int num_reqs, ar_step_interval **out, ar_step_interval_stats *stats)
{
    memset(stats, 0, sizeof *stats);
    *out = NULL;
    size_t nr = (size_t)num_reqs + 1, nn_cap = 2 * (size_t)num_reqs + 1;
    double *stamps = malloc(nn_cap * sizeof *stamps);
    int *first_node = malloc(nr * sizeof(int)), *last_node = malloc(nr * sizeof(int));
    int *deg = calloc(nn_cap + 1, sizeof(int)), *fill = calloc(nn_cap, sizeof(int)), *adj = malloc(nn_cap * sizeof(int));
    long long *pot = malloc(nn_cap * sizeof *pot);
    int *comp = malloc(nn_cap * sizeof(int)), *stack = malloc(nn_cap * sizeof(int)), *last_in_comp = malloc(nn_cap * sizeof(int));
    bool *bad_comp = calloc(nn_cap, sizeof(bool));
    ar_step_interval *iv = malloc(nn_cap * sizeof *iv);
    int ni = -1;
    if (!stamps || !first_node || !last_node || !deg || !fill || !adj || !pot || !comp || !stack || !last_in_comp ||
        !bad_comp || !iv)
        goto done;
    int ns = 0;
    for (int i = 0; i < num_reqs; i++) {
        stamps[ns++] = reqs[i].first_token;
        stamps[ns++] = reqs[i].last_token;
    }
    qsort(stamps, (size_t)ns, sizeof *stamps, cmp_double);
    int nn = 0;   /* distinct stamps: the step ends seen */
    for (int i = 0; i < ns; i++)
        if (nn == 0 || stamps[i] - stamps[nn - 1] > STEPFIT_SAME_STAMP_S) stamps[nn++] = stamps[i];
    stats->num_nodes = nn;
    for (int i = 0; i < num_reqs; i++) {
        first_node[i] = node_of(stamps, nn, reqs[i].first_token);
        last_node[i] = node_of(stamps, nn, reqs[i].last_token);
    }
    /* adjacency in compressed rows: each request an edge first -> last of output_len - 1 steps */
    for (int i = 0; i < num_reqs; i++) { deg[first_node[i] + 1]++; deg[last_node[i] + 1]++; }
    for (int v = 0; v < nn; v++) deg[v + 1] += deg[v];
    for (int i = 0; i < num_reqs; i++) {   /* entry: request index; the direction follows from the node */
        adj[deg[first_node[i]] + fill[first_node[i]]++] = i;
        adj[deg[last_node[i]] + fill[last_node[i]]++] = i;
    }
    /* step indices relative to each component's earliest node, by depth-first search */
    for (int v = 0; v < nn; v++) comp[v] = -1;
    for (int s = 0; s < nn; s++) {
        if (comp[s] >= 0) continue;
        stats->num_components++;
        comp[s] = s;
        pot[s] = 0;
        int top = 0;
        stack[top++] = s;
        while (top > 0) {
            int u = stack[--top];
            for (int e = deg[u]; e < deg[u + 1]; e++) {
                const int r = adj[e];
                if (first_node[r] == last_node[r]) continue;
                int w = reqs[r].output_len - 1;
                int v = first_node[r] == u ? last_node[r] : first_node[r];
                long long want = first_node[r] == u ? pot[u] + w : pot[u] - w;
                if (comp[v] < 0) {
                    comp[v] = s;
                    pot[v] = want;
                    stack[top++] = v;
                } else if (pot[v] != want) {
                    bad_comp[s] = true;   /* a cycle whose step counts disagree: a preemption */
                }
            }
        }
    }
    ni = 0;
    for (int v = 0; v < nn; v++) last_in_comp[v] = -1;
    for (int v = 0; v < nn; v++) {   /* nodes in time order: each with its component's previous node */
        int c = comp[v], a = last_in_comp[c];
        last_in_comp[c] = v;
        if (a < 0) continue;
        if (bad_comp[c]) { stats->num_dropped++; continue; }
        long long steps = pot[v] - pot[a];
        if (steps < 1 || steps > 1000000000LL) { stats->num_inconsistent++; continue; }
        iv[ni++] = (ar_step_interval){stamps[a], stamps[v], (int)steps};
    }
    for (int v = 0; v < nn; v++)
        if (comp[v] == v && bad_comp[v]) stats->num_bad_components++;
    stats->num_intervals = ni;
    *out = iv;
    iv = NULL;
done:
    free(stamps); free(first_node); free(last_node); free(deg); free(fill); free(adj); free(pot); free(comp);
    free(stack); free(last_in_comp); free(bad_comp); free(iv);
    return ni;
}

/* What the engine ran in the piece [t0, t1) of an interval, rebuilt from the requests (file
 * comment): the requests decoding at its middle (query 1, context = prompt + tokens generated by
 * then at the request's own mean rate), written first, then the prompts whose scheduling window
 * [first schedule, first token) overlaps the piece, in the order they were scheduled, each whole
 * (context 0) up to the budget the decodes leave: one mixed step.  *prefill_tokens = the prompt
 * tokens the piece must compute: each prompt spread evenly over its window.  waiting (NULL = none,
 * else [num_reqs]): requests not decoding in the piece although between their first and last token
 * (preempted, waiting).  q, c and who (each entry's request) need room for the decodes plus
 * *windows entries.  Returns the entries written; *num_decode the decodes among them, *windows the
 * prompt windows overlapping the piece (written or not). */
static int batch_in(const ar_run_req *reqs, const int *sched_order, int num_reqs, int budget, double t0, double t1,
                    const bool *waiting, int *q, int *c, int *who, int *num_decode, double *prefill_tokens,
                    int *windows)
{
    int n = 0;
    double t = 0.5 * (t0 + t1);
    for (int i = 0; i < num_reqs; i++) {
        const ar_run_req *r = &reqs[i];
        if (t < r->first_token || t >= r->last_token || r->output_len < 2 || (waiting && waiting[i])) continue;
        double per_token = (r->last_token - r->first_token) / (r->output_len - 1);
        int generated = 1 + (int)((t - r->first_token) / per_token);
        if (generated > r->output_len - 1) generated = r->output_len - 1;
        q[n] = 1;
        c[n] = r->prompt_len + generated - 1;
        who[n] = i;
        n++;
    }
    *num_decode = n;
    *prefill_tokens = 0;
    *windows = 0;
    int left = budget - n;
    for (int k = 0; k < num_reqs; k++) {
        const ar_run_req *r = &reqs[sched_order[k]];
        double lo = fmax(t0, r->scheduled), hi = fmin(t1, r->first_token);
        if (hi <= lo && !(r->first_token == r->scheduled && r->scheduled >= t0 && r->scheduled < t1)) continue;
        *prefill_tokens += r->first_token > r->scheduled ? r->prompt_len * (hi - lo) / (r->first_token - r->scheduled)
                                                         : r->prompt_len;
        (*windows)++;
        if (left <= 0) continue;
        int take = r->prompt_len < left ? r->prompt_len : left;
        q[n] = take;
        c[n] = 0;
        who[n] = sched_order[k];
        n++;
        left -= take;
    }
    return n;
}

static const ar_run_req *sort_reqs;
static int cmp_sched(const void *a, const void *b)
{
    double x = sort_reqs[*(const int *)a].scheduled, y = sort_reqs[*(const int *)b].scheduled;
    return x < y ? -1 : x > y ? 1 : (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

/* Grows the per-entry arrays to hold at least need entries; false when out of memory. */
static bool reserve_entries(ar_stepfit_set *set, size_t need, size_t *cap)
{
    if (need <= *cap) return true;
    while (*cap < need) *cap *= 2;
    int *qg = realloc(set->query_lens, *cap * sizeof(int));
    if (qg) set->query_lens = qg;
    int *cg = realloc(set->context_lens, *cap * sizeof(int));
    if (cg) set->context_lens = cg;
    int *wg = realloc(set->entry_req, *cap * sizeof(int));
    if (wg) set->entry_req = wg;
    return qg && cg && wg;
}

/* Rebuilds piece j's batches (waiting as batch_in's) in its reserved entries, then lays out its
 * recompute chunk. */
static void layout_recompute(ar_stepfit_set *set, int j);
static void rebuild_piece(ar_stepfit_set *set, int j, const bool *waiting)
{
    ar_stepfit_sample *s = &set->samples[j];
    int windows;
    s->num_reqs = batch_in(set->reqs, set->sched_order, set->num_reqs, set->budget, s->start_s,
                           s->start_s + s->length_s, waiting, set->query_lens + s->offset,
                           set->context_lens + s->offset, set->entry_req + s->offset, &s->num_decode,
                           &s->prefill_tokens, &windows);
    layout_recompute(set, j);
}

int ar_stepfit_build(const ar_run_req *reqs, int num_reqs, int budget, int samples_per_interval,
                     ar_stepfit_set *set, char *err, size_t err_len)
{
    memset(set, 0, sizeof *set);
    if (num_reqs < 1 || budget < 1 || samples_per_interval < 1) {
        snprintf(err, err_len, "step fit: needs requests, a positive budget and samples");
        return 2;
    }
    if (ar_step_intervals(reqs, num_reqs, &set->intervals, &set->stats) < 0) {
        snprintf(err, err_len, "step fit: out of memory");
        return 2;
    }
    int ni = set->stats.num_intervals;
    set->sample_start = malloc((size_t)(ni + 1) * sizeof(int));
    size_t cap_samples = (size_t)ni * (size_t)samples_per_interval + 1;
    set->samples = malloc(cap_samples * sizeof *set->samples);
    size_t cap_lens = 1024;
    set->query_lens = malloc(cap_lens * sizeof(int));
    set->context_lens = malloc(cap_lens * sizeof(int));
    set->entry_req = malloc(cap_lens * sizeof(int));
    set->keep = malloc((size_t)(ni + 1) * sizeof(bool));
    set->recompute_tokens = calloc((size_t)(ni + 1), sizeof(double));
    set->reqs = malloc((size_t)num_reqs * sizeof *set->reqs);
    set->sched_order = malloc((size_t)num_reqs * sizeof(int));
    set->num_reqs = num_reqs;
    set->budget = budget;
    if (!set->sample_start || !set->samples || !set->query_lens || !set->context_lens || !set->entry_req ||
        !set->keep || !set->recompute_tokens || !set->reqs || !set->sched_order) {
        ar_stepfit_free(set);
        snprintf(err, err_len, "step fit: out of memory");
        return 2;
    }
    memcpy(set->reqs, reqs, (size_t)num_reqs * sizeof *reqs);
    for (int i = 0; i < num_reqs; i++) set->sched_order[i] = i;
    sort_reqs = set->reqs;
    qsort(set->sched_order, (size_t)num_reqs, sizeof(int), cmp_sched);
    size_t num_lens = 0;
    int ns = 0;
    for (int k = 0; k < ni; k++) {
        const ar_step_interval *iv = &set->intervals[k];
        set->keep[k] = true;
        set->sample_start[k] = ns;
        int m = iv->steps < samples_per_interval ? iv->steps : samples_per_interval;
        for (int j = 0; j < m; j++) {
            /* room for every request (+ 1: the recompute chunk's slot) while the piece is built */
            if (!reserve_entries(set, num_lens + (size_t)num_reqs + 1, &cap_lens)) {
                ar_stepfit_free(set);
                snprintf(err, err_len, "step fit: out of memory");
                return 2;
            }
            double len = (iv->end - iv->start) / m;
            ar_stepfit_sample *s = &set->samples[ns];
            *s = (ar_stepfit_sample){.offset = num_lens, .start_s = iv->start + j * len, .length_s = len};
            int windows;
            s->num_reqs = batch_in(set->reqs, set->sched_order, num_reqs, budget, s->start_s, s->start_s + len, NULL,
                                   set->query_lens + num_lens, set->context_lens + num_lens,
                                   set->entry_req + num_lens, &s->num_decode, &s->prefill_tokens, &windows);
            /* reserved: every decode and every prompt window (leaving decodes out frees budget for
             * more prompts), then the recompute chunk's slot */
            s->capacity = s->num_decode + windows + 1;
            layout_recompute(set, ns);
            num_lens += (size_t)s->capacity;
            ns++;
        }
    }
    set->sample_start[ni] = ns;
    return 0;
}

void ar_stepfit_free(ar_stepfit_set *set)
{
    free(set->intervals);
    free(set->sample_start);
    free(set->samples);
    free(set->query_lens);
    free(set->context_lens);
    free(set->entry_req);
    free(set->keep);
    free(set->recompute_tokens);
    free(set->reqs);
    free(set->sched_order);
    memset(set, 0, sizeof *set);
}

void ar_stepfit_features(const ar_stepfit_set *set, int sample, bool mixed, ar_batch_features *f)
{
    const ar_stepfit_sample *s = &set->samples[sample];
    const int *q = set->query_lens + s->offset, *c = set->context_lens + s->offset;
    memset(f, 0, sizeof *f);
    f->num_reqs = mixed ? s->num_reqs + s->recompute_chunk : s->num_decode;
    for (int i = 0; i < f->num_reqs; i++) {
        f->num_tokens += q[i];
        if (i < s->num_decode) f->num_decode_reqs++;
        else f->num_prefill_tokens += q[i];
        f->kv_tokens_read += c[i] + q[i];
        f->attn_pairs += q[i] * (c[i] + (q[i] + 1) / 2.0);
    }
    f->query_lens = q;
    f->context_lens = c;
}

/* Piece j's recompute chunk: its share of the recompute prefill in the slot after its entries,
 * when its mixed step holds no prompt, up to the budget its entries leave. */
static void layout_recompute(ar_stepfit_set *set, int j)
{
    ar_stepfit_sample *s = &set->samples[j];
    int used = 0;
    for (int i = 0; i < s->num_reqs; i++) used += set->query_lens[s->offset + (size_t)i];
    int chunk = (int)fmin(ceil(s->recompute_tokens), (double)(set->budget - used));
    s->recompute_chunk = s->num_reqs == s->num_decode && chunk > 0;
    size_t slot = s->offset + (size_t)s->num_reqs;
    set->query_lens[slot] = s->recompute_chunk ? chunk : 0;
    set->context_lens[slot] = 0;
    set->entry_req[slot] = -1;
}

void ar_stepfit_set_recompute(ar_stepfit_set *set, int k, double tokens)
{
    set->recompute_tokens[k] = tokens;
    int first = set->sample_start[k], m = set->sample_start[k + 1] - first;
    for (int j = first; j < first + m; j++) {
        set->samples[j].recompute_tokens = tokens / m;
        layout_recompute(set, j);
    }
}

int ar_stepfit_set_waiting(ar_stepfit_set *set, int sample, const bool *waiting)
{
    ar_stepfit_sample *s = &set->samples[sample];
    int decoding = s->num_decode + s->num_waiting;   /* as the stamps alone have it */
    rebuild_piece(set, sample, waiting);
    s->num_waiting = decoding - s->num_decode;
    return s->num_waiting;
}

double ar_stepfit_predicted_steps(const ar_stepfit_set *set, int k, const ar_steptime *st)
{
    double steps = 0;
    for (int j = set->sample_start[k]; j < set->sample_start[k + 1]; j++) {
        const ar_stepfit_sample *s = &set->samples[j];
        ar_batch_features f;
        double mixed_steps = 0, mixed_s = 0;
        double prompt_tokens = s->prefill_tokens + s->recompute_tokens;
        if (prompt_tokens > 0 && s->num_reqs + s->recompute_chunk > s->num_decode) {
            ar_stepfit_features(set, j, true, &f);
            double tau = ar_steptime_eval(st, &f);
            mixed_steps = prompt_tokens / f.num_prefill_tokens;
            mixed_s = mixed_steps * tau;
            if (mixed_s >= s->length_s) {   /* the prompts alone overfill the piece */
                steps += s->length_s / tau;
                continue;
            }
        }
        steps += mixed_steps;
        if (s->num_decode > 0) {
            ar_stepfit_features(set, j, false, &f);
            steps += (s->length_s - mixed_s) / ar_steptime_eval(st, &f);
        }
    }
    return steps;
}

double ar_stepfit_residual(const ar_stepfit_set *set, int k, const ar_steptime *st)
{
    double steps = ar_stepfit_predicted_steps(set, k, st);
    return steps > 0 ? log(steps / set->intervals[k].steps) : NAN;
}

double ar_stepfit_loss(const ar_stepfit_set *set, const ar_steptime *st)
{
    double sum = 0;
    int n = 0;
    for (int k = 0; k < set->stats.num_intervals; k++) {
        if (!set->keep[k]) continue;
        double r = ar_stepfit_residual(set, k, st);
        if (isnan(r)) continue;
        sum += fabs(r);
        n++;
    }
    return n ? sum / n : INFINITY;
}

int ar_stepfit_reject(ar_stepfit_set *set, const ar_steptime *st, double k_mad)
{
    int ni = set->stats.num_intervals, n = 0;
    double *r = malloc((size_t)(ni + 1) * sizeof *r), *dev = malloc((size_t)(ni + 1) * sizeof *dev);
    if (!r || !dev) { free(r); free(dev); return -1; }
    for (int k = 0; k < ni; k++) {
        r[k] = ar_stepfit_residual(set, k, st);
        set->keep[k] = !isnan(r[k]);
        if (set->keep[k]) dev[n++] = r[k];
    }
    if (n == 0) { free(r); free(dev); return 0; }
    qsort(dev, (size_t)n, sizeof *dev, cmp_double);
    double med = n % 2 ? dev[n / 2] : 0.5 * (dev[n / 2 - 1] + dev[n / 2]);
    for (int i = 0; i < n; i++) dev[i] = fabs(dev[i] - med);
    qsort(dev, (size_t)n, sizeof *dev, cmp_double);
    double mad = n % 2 ? dev[n / 2] : 0.5 * (dev[n / 2 - 1] + dev[n / 2]);
    double limit = k_mad * 1.4826 * mad;
    int rejected = 0;
    for (int k = 0; k < ni; k++)
        if (set->keep[k] && fabs(r[k] - med) > limit) { set->keep[k] = false; rejected++; }
    free(r);
    free(dev);
    return rejected;
}
