/* profile_import.c - reads LLMServingSim's published per-layer profiles into the step-time
 * profile format (sim/profile.c), for `attnreplay profile --from-llmservingsim DIR`.
 *
 * LLMServingSim (github.com/casys-kaist/LLMServingSim, MIT licence) profiles vLLM's own modules on
 * a GPU, one tensor-parallel degree per folder profiler/perf/<card>/<model>/<variant>/tp<N>/:
 *   dense.csv         layer,tokens,time_us         CUDA time of one call of each per-token module
 *                                                  (embedding, layernorm, qkv_proj, rotary_emb,
 *                                                  o_proj, gate_up_proj, act_fn, down_proj,
 *                                                  final_layernorm) at a token count
 *   per_sequence.csv  layer,sequences,time_us      the LM head (logits) and the sampler at a number
 *                                                  of sequences
 *   attention.csv     prefill_chunk,kv_prefill,n_decode,kv_decode,time_us
 *                                                  one call of vLLM's Attention module (KV write
 *                                                  included): a prefill chunk after kv_prefill
 *                                                  tokens with n_decode decodes after kv_decode
 * (their docs/docs/profiler/output-bundle.md).  The Llama layer set is mapped onto the profile's
 * operations: qkv, o, gate_up, down (GEMMs, once per layer), layernorm (twice per layer: the input
 * and post-attention RMSNorms), rotary_emb and act_fn (once per layer), embedding and
 * final_layernorm (once per step at the tokens), lm_head and sampler (once per step at the
 * requests).  attention.csv splits into decode-only rows (the decode grid), prefill-only rows (the
 * prefill grid) and mixed rows (the mixed grid).  The profile format needs complete grids; a
 * bundle whose rows merge two grids (the RTX PRO 6000's: a doubling grid and a x1.5 one) keeps the
 * largest complete part found by dropping, one at a time, the axis value whose cells are most
 * often missing (the largest share; the first such in axis order, values ascending); what was
 * kept is reported.
 *
 * Where the folder also holds skew.csv (regime,n,nb,ratio,skew,pc,kp,kvs,kv_big,kv_mean,t_mean_us,
 * t_max_us,t_skew_us,alpha: bimodal decode batches timed as they are, all at their mean context
 * and all at their largest) and skew_fit.csv (pc,n_label,skew_rate_label,kv_big_label,kp_label,
 * alpha,n_samples: LLMServingSim's alpha per bucket; docs/docs/profiler/skew-alpha-fit.md), the
 * profile takes LLMServingSim's correction for decodes of unequal contexts: the bucket axes and the
 * pooled alpha_default are derived from skew.csv as its profiler/core/fit_alpha.py does, and every
 * skew_fit.csv row must name bins of those axes.  Imported profiles time a step's prompts as
 * LLMServingSim does, as one lookup at their summed tokens and contexts (attn_prompts "together").
 *
 * Bad input is refused with "FILE:LINE: rule" (a row) or "FILE: rule" (the file): a header other
 * than the one above, a wrong field count, a number that is not one (or not positive where a time
 * or a count must be), a repeated key, an unknown or missing layer, token grids that differ
 * between layers, an empty batch; in the skew files a missing regime, a decode count below 2, a
 * bucket label that is none of the derived bins, a repeated bucket, one file without the other. */
#include "sim.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A field's number as decimal text, as the profilers write it: no leading blank or sign
 * other than '-', no hexadecimal (strtod reads "0x10" as 16), at most PROFILE_MAX_VALUE in size
 * (1e308 microseconds once read as a time and summed to inf). */
#define PROFILE_MAX_VALUE 1e15
static bool decimal_value(const char *text, double v)
{
    const char *d = text[0] == '-' ? text + 1 : text;
    return (isdigit((unsigned char)d[0]) || (d[0] == '.' && isdigit((unsigned char)d[1]))) && !strpbrk(text, "xX") &&
           fabs(v) <= PROFILE_MAX_VALUE;
}

#define IMP_MAX_FIELDS 8
#define IMP_MAX_ROWS 200000
#define IMP_MAX_VALUES 64   /* distinct values per attention axis before a complete grid is chosen */

typedef struct imp_row {
    char layer[32];
    double x[4];
    double us;
    int line;
} imp_row;

/* The next line of f into buf (size bytes), its newline and a CR before it removed.  1 a line,
 * 0 the end, -1 with err set: longer than size - 2 characters, or holding a NUL byte (a damaged or
 * binary file, which a C string would cut short there). */
static int read_line(FILE *f, char *buf, size_t size, const char *path, int line, char *err, size_t err_len)
{
    size_t n = 0;
    bool nul = false, long_line = false;
    int ch = EOF;
    while ((ch = getc(f)) != EOF && ch != '\n') {
        nul |= ch == 0;
        if (n + 2 < size) buf[n++] = (char)ch;
        else long_line = true;
    }
    if (ch == EOF && n == 0 && !long_line && !nul) return 0;
    buf[n] = 0;
    if (long_line) {
        snprintf(err, err_len, "%s:%d: line longer than %zu characters", path, line, size - 2);
        return -1;
    }
    if (nul) {
        snprintf(err, err_len, "%s:%d: a NUL byte (a damaged or binary file, not CSV)", path, line);
        return -1;
    }
    if (n > 0 && buf[n - 1] == '\r') buf[--n] = 0;
    return 1;
}

/* Reads FILE (dir/name) with the given header; each row's first text column (when text_first)
 * into layer and its numbers into x[] and us.  Returns the row count, or -1 with err set. */
static int read_csv(const char *dir, const char *name, const char *header, bool text_first, imp_row **out,
                    char *err, size_t err_len)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, err_len, "%s: cannot open (%s)", path, strerror(errno));
        return -1;
    }
    int want = 1;
    for (const char *c = header; *c; c++) want += *c == ',';
    int n = 0, cap = 1024, line = 0, rc = 0;
    imp_row *rows = malloc((size_t)cap * sizeof *rows);
    char buf[1024];
    int got;
    while (rows && rc == 0 && (got = read_line(f, buf, sizeof buf, path, line + 1, err, err_len)) != 0) {
        line++;
        if (got < 0) {
            rc = -1;
            break;
        }
        size_t len = strlen(buf);
        if (line == 1) {
            if (strcmp(buf, header) != 0) {
                snprintf(err, err_len, "%s:1: header must be '%s'", path, header);
                rc = -1;
            }
            continue;
        }
        if (len == 0) continue;
        char *fields[IMP_MAX_FIELDS];
        int nf = 0;
        for (char *tok = buf, *comma; nf < IMP_MAX_FIELDS; tok = comma + 1) {
            fields[nf++] = tok;
            if (!(comma = strchr(tok, ','))) break;
            *comma = 0;
        }
        if (nf != want || strchr(fields[nf - 1], ',')) {
            snprintf(err, err_len, "%s:%d: %d fields, the header has %d", path, line, nf, want);
            rc = -1;
            break;
        }
        if (n >= IMP_MAX_ROWS) {
            snprintf(err, err_len, "%s:%d: more than %d rows", path, line, IMP_MAX_ROWS);
            rc = -1;
            break;
        }
        if (n == cap) {
            imp_row *g = realloc(rows, (size_t)(cap *= 2) * sizeof *rows);
            if (!g) { free(rows); rows = NULL; break; }
            rows = g;
        }
        imp_row *r = &rows[n];
        memset(r, 0, sizeof *r);
        r->line = line;
        int first = 0;
        if (text_first) {
            if (!fields[0][0] || strlen(fields[0]) >= sizeof r->layer) {
                snprintf(err, err_len, "%s:%d: the layer name must be 1 to %zu characters", path, line,
                         sizeof r->layer - 1);
                rc = -1;
                break;
            }
            snprintf(r->layer, sizeof r->layer, "%s", fields[0]);
            first = 1;
        }
        for (int i = first; i < nf; i++) {
            char *end;
            errno = 0;
            double v = strtod(fields[i], &end);
            bool last = i == nf - 1;
            if (end == fields[i] || *end || errno || !isfinite(v) || !decimal_value(fields[i], v) ||
                (last ? !(v > 0) : (v < 0 || v != floor(v)))) {
                snprintf(err, err_len, "%s:%d: field %d ('%s') must be %s", path, line, i + 1, fields[i],
                         last ? "a positive time in microseconds" : "a non-negative whole number");
                rc = -1;
                break;
            }
            if (last) r->us = v;
            else r->x[i - first] = v;
        }
        n++;
    }
    fclose(f);
    if (!rows) {
        snprintf(err, err_len, "%s: out of memory", path);
        return -1;
    }
    if (rc == 0 && line < 2) {
        snprintf(err, err_len, "%s: no rows", path);
        rc = -1;
    }
    if (rc != 0) {
        free(rows);
        return -1;
    }
    *out = rows;
    return n;
}

/* The Llama layer set: LLMServingSim's name, the profile's, calls (gemm_per_layer), the GEMM's K
 * and N (0 for other operations), which file. */
typedef struct imp_op {
    const char *csv_name, *name;
    int calls, k, n;
    bool per_sequence;
} imp_op;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorted distinct values of v[n] into out; returns their count. */
static int distinct(double *v, int n, double *out)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (m == 0 || v[i] != out[m - 1]) out[m++] = v[i];
    return m;
}

static int find_value(const double *xs, int n, double v)
{
    for (int i = 0; i < n; i++)
        if (xs[i] == v) return i;
    return -1;
}

/* dense.csv and per_sequence.csv into p's operations. */
static int import_linear(const char *dir, const ar_model_preset *preset, int tp, ar_profile_table *p, char *err,
                         size_t err_len)
{
    const ar_model *m = &preset->model;
    int hd = m->head_size, h = preset->hidden;
    const imp_op ops[] = {
        {"qkv_proj", "qkv", 1, h, (m->num_q_heads + 2 * m->num_kv_heads) * hd / tp, false},
        {"o_proj", "o", 1, m->num_q_heads * hd / tp, h, false},
        {"gate_up_proj", "gate_up", 1, h, 2 * preset->intermediate / tp, false},
        {"down_proj", "down", 1, preset->intermediate / tp, h, false},
        {"lm_head", "lm_head", 0, h, preset->vocab / tp, true},
        {"layernorm", "layernorm", 2, 0, 0, false},
        {"rotary_emb", "rotary_emb", 1, 0, 0, false},
        {"act_fn", "act_fn", 1, 0, 0, false},
        {"embedding", "embedding", -1, 0, 0, false},
        {"final_layernorm", "final_layernorm", -1, 0, 0, false},
        {"sampler", "sampler", 0, 0, 0, true},
    };
    int num_ops = (int)(sizeof ops / sizeof ops[0]);
    imp_row *rows[2] = {NULL, NULL};
    int nrows[2];
    const char *files[2] = {"dense.csv", "per_sequence.csv"};
    char path[2][1200];
    nrows[0] = read_csv(dir, files[0], "layer,tokens,time_us", true, &rows[0], err, err_len);
    nrows[1] = nrows[0] < 0 ? -1 : read_csv(dir, files[1], "layer,sequences,time_us", true, &rows[1], err, err_len);
    int rc = nrows[0] < 0 || nrows[1] < 0 ? 2 : 0;
    for (int f = 0; f < 2; f++) snprintf(path[f], sizeof path[f], "%s/%s", dir, files[f]);
    /* every row names a known layer of its file, once per token count */
    for (int f = 0; f < 2 && rc == 0; f++)
        for (int i = 0; i < nrows[f] && rc == 0; i++) {
            const imp_row *r = &rows[f][i];
            int o = 0;
            while (o < num_ops && !(strcmp(ops[o].csv_name, r->layer) == 0 && ops[o].per_sequence == (f == 1))) o++;
            if (o == num_ops) {
                snprintf(err, err_len, "%s:%d: unknown layer '%s' (a Llama model's %s are: %s)", path[f], r->line,
                         r->layer, f ? "per-sequence layers" : "dense layers",
                         f ? "lm_head, sampler"
                           : "embedding, layernorm, qkv_proj, rotary_emb, o_proj, gate_up_proj, act_fn, down_proj, "
                             "final_layernorm");
                rc = 2;
            } else if (r->x[0] < 1) {
                snprintf(err, err_len, "%s:%d: %s must be at least 1", path[f], r->line, f ? "sequences" : "tokens");
                rc = 2;
            }
            for (int j = 0; j < i && rc == 0; j++)
                if (strcmp(rows[f][j].layer, r->layer) == 0 && rows[f][j].x[0] == r->x[0]) {
                    snprintf(err, err_len, "%s:%d: layer %s at %g repeats line %d", path[f], r->line, r->layer, r->x[0],
                             rows[f][j].line);
                    rc = 2;
                }
        }
    /* the token grid: the first dense layer's; every dense layer on it, every per-sequence layer on a first part */
    double *vals = rc == 0 ? malloc((size_t)(nrows[0] + 1) * sizeof *vals) : NULL;
    if (rc == 0 && !vals) {
        snprintf(err, err_len, "%s: out of memory", path[0]);
        rc = 2;
    }
    p->num_gemms = 0;
    for (int o = 0; o < num_ops && rc == 0; o++) {
        int f = ops[o].per_sequence, n = 0;
        const imp_row *first = NULL;
        for (int i = 0; i < nrows[f]; i++)
            if (strcmp(rows[f][i].layer, ops[o].csv_name) == 0) {
                vals[n++] = rows[f][i].x[0];
                if (!first) first = &rows[f][i];
            }
        if (n == 0) {
            snprintf(err, err_len, "%s: lacks layer %s", path[f], ops[o].csv_name);
            rc = 2;
            break;
        }
        double grid[AR_PROF_MAX_M];
        if (n > AR_PROF_MAX_M) {
            snprintf(err, err_len, "%s:%d: layer %s has %d %s; the profile holds at most %d", path[f], first->line,
                     ops[o].csv_name, n, f ? "sequence counts" : "token counts", AR_PROF_MAX_M);
            rc = 2;
            break;
        }
        n = distinct(vals, n, grid);
        if (p->num_gemms == 0) {
            p->num_m = n;
            memcpy(p->m, grid, (size_t)n * sizeof *grid);
        }
        bool same = f ? n <= p->num_m : n == p->num_m;
        for (int i = 0; same && i < n; i++) same = grid[i] == p->m[i];
        if (!same) {
            snprintf(err, err_len, "%s:%d: layer %s is timed at other %s than %s (%s)", path[f], first->line,
                     ops[o].csv_name, f ? "sequence counts" : "token counts", ops[0].csv_name,
                     f ? "they must be the first of its token counts" : "every dense layer must share one grid");
            rc = 2;
            break;
        }
        int g = p->num_gemms++;
        snprintf(p->gemm_name[g], sizeof p->gemm_name[g], "%s", ops[o].name);
        p->gemm_per_layer[g] = ops[o].calls;
        p->gemm_k[g] = ops[o].k;
        p->gemm_n[g] = ops[o].n;
        p->gemm_num_m[g] = n;
        for (int i = 0; i < nrows[f]; i++)
            if (strcmp(rows[f][i].layer, ops[o].csv_name) == 0)
                p->gemm_us[g][find_value(p->m, n, rows[f][i].x[0])] = rows[f][i].us;
    }
    free(vals);
    free(rows[0]);
    free(rows[1]);
    return rc;
}

/* A grid over up to 4 axes filled from rows; cells without a row are NaN. */
typedef struct imp_grid {
    int dims, size[4];
    double axis[4][IMP_MAX_VALUES];
    bool keep[4][IMP_MAX_VALUES];
    double *cell;
} imp_grid;

static size_t grid_index(const imp_grid *g, const int *idx)
{
    size_t c = 0;
    for (int a = 0; a < g->dims; a++) c = c * (size_t)g->size[a] + (size_t)idx[a];
    return c;
}

/* Advances idx over the kept values of every axis; false when done. */
static bool next_kept(const imp_grid *g, int *idx)
{
    for (int a = g->dims - 1; a >= 0; a--) {
        do idx[a]++;
        while (idx[a] < g->size[a] && !g->keep[a][idx[a]]);
        if (idx[a] < g->size[a]) return true;
        idx[a] = 0;
        while (!g->keep[a][idx[a]]) idx[a]++;
    }
    return false;
}

static bool first_kept(const imp_grid *g, int *idx)
{
    for (int a = 0; a < g->dims; a++) {
        idx[a] = 0;
        while (idx[a] < g->size[a] && !g->keep[a][idx[a]]) idx[a]++;
        if (idx[a] == g->size[a]) return false;
    }
    return true;
}

/* Drops, one at a time, the axis value with the largest share of missing cells among the kept
 * ones until the kept grid is complete.  Returns the cells dropped, -1 when an axis ran empty. */
static long complete_grid(imp_grid *g)
{
    long dropped = 0;
    for (;;) {
        long missing[4][IMP_MAX_VALUES] = {{0}}, total = 0, cells = 0;
        int idx[4];
        if (!first_kept(g, idx)) return -1;
        do {
            cells++;
            if (isnan(g->cell[grid_index(g, idx)])) {
                total++;
                for (int a = 0; a < g->dims; a++) missing[a][idx[a]]++;
            }
        } while (next_kept(g, idx));
        if (total == 0) return dropped;
        int ba = 0, bv = -1;
        double worst = -1;
        for (int a = 0; a < g->dims; a++) {
            long kept_values = 0;
            for (int v = 0; v < g->size[a]; v++) kept_values += g->keep[a][v];
            double line = (double)cells / (double)kept_values;   /* cells of one value's line */
            for (int v = 0; v < g->size[a]; v++)
                if (g->keep[a][v] && missing[a][v] / line > worst) {
                    worst = missing[a][v] / line;
                    ba = a;
                    bv = v;
                }
        }
        long kept_values = 0;
        for (int v = 0; v < g->size[ba]; v++) kept_values += g->keep[ba][v];
        dropped += cells / kept_values - missing[ba][bv];   /* the rows the dropped line held */
        g->keep[ba][bv] = false;
    }
}

/* Copies the kept values of axis a into out; returns how many. */
static int kept_axis(const imp_grid *g, int a, double *out)
{
    int n = 0;
    for (int v = 0; v < g->size[a]; v++)
        if (g->keep[a][v]) out[n++] = g->axis[a][v];
    return n;
}

/* Builds the grid of rows[i] whose x[col[0..dims-1]] are the axes (rows chosen by pick). */
static int build_grid(imp_grid *g, int dims, const int *col, const imp_row *rows, const bool *pick, int n,
                      const char *path, const char *what, char *err, size_t err_len)
{
    memset(g, 0, sizeof *g);
    g->dims = dims;
    double *vals = malloc((size_t)(n + 1) * sizeof *vals);
    if (!vals) {
        snprintf(err, err_len, "%s: out of memory", path);
        return 2;
    }
    size_t cells = 1;
    for (int a = 0; a < dims; a++) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (pick[i]) vals[k++] = rows[i].x[col[a]];
        if (k == 0) {
            free(vals);
            snprintf(err, err_len, "%s: no %s rows", path, what);
            return 2;
        }
        double tmp[IMP_MAX_VALUES + 1];
        qsort(vals, (size_t)k, sizeof *vals, cmp_double);
        int m = 0;
        for (int i = 0; i < k && m <= IMP_MAX_VALUES; i++)
            if (m == 0 || vals[i] != tmp[m - 1]) tmp[m++] = vals[i];
        if (m > IMP_MAX_VALUES) {
            free(vals);
            snprintf(err, err_len, "%s: the %s rows have over %d values on one axis", path, what, IMP_MAX_VALUES);
            return 2;
        }
        g->size[a] = m;
        memcpy(g->axis[a], tmp, (size_t)m * sizeof *tmp);
        for (int v = 0; v < m; v++) g->keep[a][v] = true;
        cells *= (size_t)m;
    }
    free(vals);
    g->cell = malloc(cells * sizeof *g->cell);
    if (!g->cell) {
        snprintf(err, err_len, "%s: out of memory", path);
        return 2;
    }
    for (size_t c = 0; c < cells; c++) g->cell[c] = NAN;
    int *seen_line = calloc(cells, sizeof *seen_line);
    if (!seen_line) {
        snprintf(err, err_len, "%s: out of memory", path);
        return 2;
    }
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (!pick[i]) continue;
        int idx[4];
        for (int a = 0; a < dims; a++) idx[a] = find_value(g->axis[a], g->size[a], rows[i].x[col[a]]);
        size_t c = grid_index(g, idx);
        if (seen_line[c]) {
            snprintf(err, err_len, "%s:%d: the same shape as line %d", path, rows[i].line, seen_line[c]);
            rc = 2;
        }
        seen_line[c] = rows[i].line;
        g->cell[c] = rows[i].us;
    }
    free(seen_line);
    return rc;
}

/* ---- the skew correction: skew.csv and skew_fit.csv ---------------------------------------- */

#define SKEW_HEADER "regime,n,nb,ratio,skew,pc,kp,kvs,kv_big,kv_mean,t_mean_us,t_max_us,t_skew_us,alpha"
#define SKEW_FIT_HEADER "pc,n_label,skew_rate_label,kv_big_label,kp_label,alpha,n_samples"
#define SKEW_LABEL 32

/* One CSV file read a row at a time: fields split at commas, the header checked. */
typedef struct csv_in {
    FILE *f;
    char path[1200];
    int line;
    char buf[1024];
    char *field[16];
    int nf;
} csv_in;

/* Opens dir/name and checks its header.  1 opened, 0 absent, -1 error (err set). */
static int csv_open(csv_in *c, const char *dir, const char *name, const char *header, char *err, size_t err_len)
{
    memset(c, 0, sizeof *c);
    snprintf(c->path, sizeof c->path, "%s/%s", dir, name);
    if (!(c->f = fopen(c->path, "r"))) {
        if (errno == ENOENT) return 0;
        snprintf(err, err_len, "%s: cannot open (%s)", c->path, strerror(errno));
        return -1;
    }
    char *h = fgets(c->buf, sizeof c->buf, c->f);
    c->line = 1;
    size_t len = h ? strlen(c->buf) : 0;
    while (len > 0 && (c->buf[len - 1] == '\n' || c->buf[len - 1] == '\r')) c->buf[--len] = 0;
    if (!h || strcmp(c->buf, header) != 0) {
        snprintf(err, err_len, "%s:1: header must be '%s'", c->path, header);
        fclose(c->f);
        c->f = NULL;
        return -1;
    }
    return 1;
}

/* The next non-empty row of want fields.  1 a row, 0 the end, -1 error (err set). */
static int csv_next(csv_in *c, int want, char *err, size_t err_len)
{
    int got;
    while ((got = read_line(c->f, c->buf, sizeof c->buf, c->path, c->line + 1, err, err_len)) != 0) {
        c->line++;
        if (got < 0) return -1;
        if (!c->buf[0]) continue;
        c->nf = 0;
        for (char *tok = c->buf, *comma; c->nf < 16; tok = comma + 1) {
            c->field[c->nf++] = tok;
            if (!(comma = strchr(tok, ','))) break;
            *comma = 0;
        }
        if (c->nf != want || strchr(c->field[c->nf - 1], ',')) {
            snprintf(err, err_len, "%s:%d: %d fields, the header has %d", c->path, c->line, c->nf, want);
            return -1;
        }
        return 1;
    }
    return 0;
}

/* Field i as a finite number: whole and >= 0 (kind 'w'), > 0 ('p'), >= 0 ('n') or any ('a'). */
static int csv_number(const csv_in *c, int i, char kind, double *v, char *err, size_t err_len)
{
    char *end;
    errno = 0;
    *v = strtod(c->field[i], &end);
    bool ok = end != c->field[i] && !*end && !errno && isfinite(*v) && decimal_value(c->field[i], *v);
    if (ok && kind == 'w') ok = *v >= 0 && *v == floor(*v);
    if (ok && kind == 'p') ok = *v > 0;
    if (ok && kind == 'n') ok = *v >= 0;
    if (!ok)
        snprintf(err, err_len, "%s:%d: field %d ('%s') must be %s", c->path, c->line, i + 1, c->field[i],
                 kind == 'w' ? "a non-negative whole number" : kind == 'p' ? "a positive number"
                 : kind == 'n' ? "a non-negative number" : "a number");
    return ok ? 0 : -1;
}

/* LLMServingSim's short form of a context length (fit_alpha.py's _short_kv): 1024 -> "1k". */
static void short_kv(char *out, size_t len, double v)
{
    long x = (long)v;
    if (x >= 1024 && x % 1024 == 0) snprintf(out, len, "%ldk", x / 1024);
    else snprintf(out, len, "%ld", x);
}

/* One axis of the bucket table: inclusive upper bounds and the labels fit_alpha.py writes. */
typedef struct skew_axis {
    int bins;
    double upper[AR_PROF_SKEW_AXIS];
    char label[AR_PROF_SKEW_AXIS][SKEW_LABEL];
} skew_axis;

static int axis_label(const skew_axis *ax, const char *label)
{
    for (int b = 0; b < ax->bins; b++)
        if (strcmp(ax->label[b], label) == 0) return b;
    return -1;
}

/* skew.csv and skew_fit.csv of dir (both or neither) into p's skew table: the axes derived from
 * skew.csv's rows with an alpha as fit_alpha.py derives them (the decode counts and the nonzero
 * prompt contexts profiled, each plus an overflow bin; the largest context on 4x steps from 1k to
 * its largest; the skew rate's five fixed bins), alpha_default its pooled weighted least squares
 * sum((t_max - t_mean)(t_skew - t_mean)) / sum((t_max - t_mean)^2) rounded to 4 places as
 * fit_alpha.py stores it, and every skew_fit.csv row a cell.  0 (also when neither file is
 * there: no table), or 2 with err set; *buckets and *rows_used report what was read. */
static int import_skew(const char *dir, ar_profile_table *p, int *buckets, int *rows_used, char *err, size_t err_len)
{
    csv_in raw, fit;
    *buckets = *rows_used = 0;
    int has_raw = csv_open(&raw, dir, "skew.csv", SKEW_HEADER, err, err_len);
    if (has_raw < 0) return 2;
    int has_fit = csv_open(&fit, dir, "skew_fit.csv", SKEW_FIT_HEADER, err, err_len);
    if (has_fit < 0) {
        if (raw.f) fclose(raw.f);
        return 2;
    }
    if (has_raw != has_fit) {
        snprintf(err, err_len, "%s: skew.csv and skew_fit.csv come together (the bucket axes and alpha_default are "
                 "derived from skew.csv)", has_raw ? fit.path : raw.path);
        if (raw.f) fclose(raw.f);
        if (fit.f) fclose(fit.f);
        return 2;
    }
    if (!has_raw) return 0;
    skew_axis *ax = calloc(4, sizeof *ax);
    double n_vals[AR_PROF_SKEW_AXIS], kp_vals[AR_PROF_SKEW_AXIS], kv_max = 0, num = 0, den = 0;
    int num_n = 0, num_kp = 0, rc = ax ? 0 : 2, got;
    if (!ax) snprintf(err, err_len, "%s: out of memory", raw.path);
    while (rc == 0 && (got = csv_next(&raw, 14, err, err_len)) != 0) {
        double v[14];
        if (got < 0 || !raw.field[0][0]) {
            if (got > 0) snprintf(err, err_len, "%s:%d: field 1 (regime) is empty", raw.path, raw.line);
            rc = 2;
            break;
        }
        for (int i = 1; i < 13 && rc == 0; i++)
            if (csv_number(&raw, i, i >= 10 ? 'p' : i == 1 || i == 5 || i == 6 || i == 8 ? 'w' : 'n', &v[i], err,
                           err_len) != 0)
                rc = 2;
        if (rc != 0) break;
        if (v[1] < 2) {
            snprintf(err, err_len, "%s:%d: n %g: a skewed batch has at least 2 decodes", raw.path, raw.line, v[1]);
            rc = 2;
            break;
        }
        if (!raw.field[13][0]) continue;   /* no alpha (t_max <= t_mean): left out, as fit_alpha.py drops it */
        if (csv_number(&raw, 13, 'a', &v[13], err, err_len) != 0) {
            rc = 2;
            break;
        }
        (*rows_used)++;
        double dtm = v[11] - v[10], dts = v[12] - v[10];
        num += dtm * dts;
        den += dtm * dtm;
        kv_max = fmax(kv_max, v[8]);
        double *vals[2] = {n_vals, kp_vals};
        int *count[2] = {&num_n, &num_kp}, cap[2] = {AR_PROF_SKEW_AXIS - 1, AR_PROF_SKEW_AXIS - 2};
        double x[2] = {v[1], v[6]};
        for (int a = 0; a < 2 && rc == 0; a++) {
            if (a == 1 && x[a] == 0) continue;   /* kp = 0 has its own bin */
            if (find_value(vals[a], *count[a], x[a]) >= 0) continue;
            if (*count[a] == cap[a]) {
                snprintf(err, err_len, "%s:%d: over %d distinct %s", raw.path, raw.line, cap[a],
                         a ? "prompt contexts (kp)" : "decode counts (n)");
                rc = 2;
            } else {
                vals[a][(*count[a])++] = x[a];
            }
        }
    }
    fclose(raw.f);
    if (rc == 0 && *rows_used == 0) {
        snprintf(err, err_len, "%s: no row with an alpha", raw.path);
        rc = 2;
    }
    if (rc == 0) {
        qsort(n_vals, (size_t)num_n, sizeof *n_vals, cmp_double);
        qsort(kp_vals, (size_t)num_kp, sizeof *kp_vals, cmp_double);
        char a_[24], b_[24];
        for (int i = 0; i < num_n; i++) {
            ax[0].upper[i] = n_vals[i];
            snprintf(ax[0].label[i], SKEW_LABEL, "n<=%ld", (long)n_vals[i]);
        }
        ax[0].upper[num_n] = 1e6;
        snprintf(ax[0].label[num_n], SKEW_LABEL, "n>%ld", (long)n_vals[num_n - 1]);
        ax[0].bins = num_n + 1;
        static const double rate_upper[5] = {0.05, 0.15, 0.40, 0.70, 1.01};
        static const char *rate_label[5] = {"sr<=5%", "sr<=15%", "sr<=40%", "sr<=70%", "sr>70%"};
        for (int i = 0; i < 5; i++) {
            ax[1].upper[i] = rate_upper[i];
            snprintf(ax[1].label[i], SKEW_LABEL, "%s", rate_label[i]);
        }
        ax[1].bins = 5;
        int k = 0;
        for (double e = 1024; e <= kv_max && k < AR_PROF_SKEW_AXIS - 2; e *= 4) ax[2].upper[k++] = e;
        if (k == 0) ax[2].upper[k++] = 1024;
        if (ax[2].upper[k - 1] < kv_max) ax[2].upper[k++] = kv_max;
        for (int i = 0; i < k; i++) {
            short_kv(a_, sizeof a_, ax[2].upper[i]);
            snprintf(ax[2].label[i], SKEW_LABEL, "kvB<=%s", a_);
        }
        short_kv(b_, sizeof b_, ax[2].upper[k - 1]);
        snprintf(ax[2].label[k], SKEW_LABEL, "kvB>%s", b_);
        ax[2].upper[k] = 1e9;
        ax[2].bins = k + 1;
        ax[3].upper[0] = 0;
        snprintf(ax[3].label[0], SKEW_LABEL, "kp=0");
        for (int i = 0; i < num_kp; i++) {
            ax[3].upper[i + 1] = kp_vals[i];
            short_kv(a_, sizeof a_, kp_vals[i]);
            snprintf(ax[3].label[i + 1], SKEW_LABEL, "kp<=%s", a_);
        }
        if (num_kp > 0) {
            short_kv(b_, sizeof b_, kp_vals[num_kp - 1]);
            snprintf(ax[3].label[num_kp + 1], SKEW_LABEL, "kp>%s", b_);
            ax[3].upper[num_kp + 1] = 1e9;
            ax[3].bins = num_kp + 2;
        } else {   /* fit_alpha.py's default prompt-context axis */
            ax[3].upper[1] = 2048;
            ax[3].upper[2] = 1e9;
            snprintf(ax[3].label[1], SKEW_LABEL, "kp<=2k");
            snprintf(ax[3].label[2], SKEW_LABEL, "kp>2k");
            ax[3].bins = 3;
        }
        p->skew_alpha_default = den > 0 ? round(num / den * 1e4) / 1e4 : 0;
    }
    /* skew_fit.csv: every row one bucket of the axes above */
    typedef struct { double pc, alpha; int bin[4], line; } fit_row;
    int nrows = 0, cap = 0;
    fit_row *rows = NULL;
    while (rc == 0 && (got = csv_next(&fit, 7, err, err_len)) != 0) {
        fit_row r = {.line = fit.line};
        double samples;
        if (got < 0 || csv_number(&fit, 0, 'w', &r.pc, err, err_len) != 0 ||
            csv_number(&fit, 5, 'a', &r.alpha, err, err_len) != 0 ||
            csv_number(&fit, 6, 'w', &samples, err, err_len) != 0) {
            rc = 2;
            break;
        }
        for (int a = 0; a < 4 && rc == 0; a++)
            if ((r.bin[a] = axis_label(&ax[a], fit.field[1 + a])) < 0) {
                snprintf(err, err_len, "%s:%d: field %d ('%s') is none of the bins skew.csv's rows give (%s ... %s)",
                         fit.path, fit.line, 2 + a, fit.field[1 + a], ax[a].label[0], ax[a].label[ax[a].bins - 1]);
                rc = 2;
            }
        if (rc == 0 && samples < 1) {
            snprintf(err, err_len, "%s:%d: n_samples must be at least 1", fit.path, fit.line);
            rc = 2;
        }
        for (int j = 0; j < nrows && rc == 0; j++)
            if (rows[j].pc == r.pc && !memcmp(rows[j].bin, r.bin, sizeof r.bin)) {
                snprintf(err, err_len, "%s:%d: the bucket of line %d again", fit.path, fit.line, rows[j].line);
                rc = 2;
            }
        if (rc == 0 && nrows == cap) {
            fit_row *g = realloc(rows, (size_t)(cap = cap ? 2 * cap : 1024) * sizeof *rows);
            if (!g) {
                snprintf(err, err_len, "%s: out of memory", fit.path);
                rc = 2;
                break;
            }
            rows = g;
        }
        if (rc == 0) rows[nrows++] = r;
    }
    fclose(fit.f);
    if (rc == 0 && nrows == 0) {
        snprintf(err, err_len, "%s: no rows", fit.path);
        rc = 2;
    }
    p->num_skew_pc = 0;
    for (int j = 0; j < nrows && rc == 0; j++) {
        if (find_value(p->skew_pc, p->num_skew_pc, rows[j].pc) >= 0) continue;
        if (p->num_skew_pc == AR_PROF_SKEW_AXIS) {
            snprintf(err, err_len, "%s:%d: over %d distinct pc values", fit.path, rows[j].line, AR_PROF_SKEW_AXIS);
            rc = 2;
        } else {
            p->skew_pc[p->num_skew_pc++] = rows[j].pc;
        }
    }
    size_t cells = (size_t)p->num_skew_pc;
    for (int a = 0; a < 4 && rc == 0; a++) cells *= (size_t)ax[a].bins;
    if (rc == 0 && cells > AR_PROF_MAX_SKEW) {
        snprintf(err, err_len, "%s: %zu buckets in all; the profile holds at most %d", fit.path, cells, AR_PROF_MAX_SKEW);
        rc = 2;
    }
    if (rc == 0) {
        qsort(p->skew_pc, (size_t)p->num_skew_pc, sizeof *p->skew_pc, cmp_double);
        for (int a = 0; a < 4; a++) {
            p->skew_bins[a] = ax[a].bins;
            memcpy(p->skew_upper[a], ax[a].upper, sizeof ax[a].upper);
        }
        for (size_t c = 0; c < cells; c++) p->skew_alpha[c] = NAN;
        for (int j = 0; j < nrows; j++) {
            size_t c = (size_t)find_value(p->skew_pc, p->num_skew_pc, rows[j].pc);
            for (int a = 0; a < 4; a++) c = c * (size_t)ax[a].bins + (size_t)rows[j].bin[a];
            p->skew_alpha[c] = rows[j].alpha;
        }
        *buckets = nrows;
    } else {
        p->num_skew_pc = 0;
    }
    free(rows);
    free(ax);
    return rc;
}

int ar_profile_import_llmservingsim(const char *dir, const ar_model_preset *preset, int tp, const char *device,
                                    ar_profile_table *p, char *note, size_t note_len, char *err, size_t err_len)
{
    memset(p, 0, sizeof *p);
    if (note && note_len) note[0] = 0;
    const ar_model *m = &preset->model;
    if (m->attention != AR_ATTN_MHA || preset->num_experts > 0) {
        snprintf(err, err_len, "%s: only dense MHA/GQA models are imported (%s is not)", dir, preset->name);
        return 2;
    }
    if (tp < 1 || m->num_kv_heads % tp != 0 || preset->intermediate % tp != 0 || preset->vocab % tp != 0) {
        snprintf(err, err_len, "%s: tp %d does not divide %s's KV heads, MLP or vocabulary", dir, tp, preset->name);
        return 2;
    }
    snprintf(p->device, sizeof p->device, "%s", device);
    snprintf(p->model, sizeof p->model, "%s", preset->name);
    p->tp = tp;
    p->replay_ratio = 1.0;
    int rc = import_linear(dir, preset, tp, p, err, err_len);
    if (rc != 0) return rc;
    imp_row *rows = NULL;
    char path[1200];
    snprintf(path, sizeof path, "%s/attention.csv", dir);
    int n = read_csv(dir, "attention.csv", "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us", false, &rows, err,
                     err_len);
    if (n < 0) return 2;
    bool *pick[3];
    for (int t = 0; t < 3; t++) pick[t] = calloc((size_t)n + 1, sizeof **pick);
    if (!pick[0] || !pick[1] || !pick[2]) {
        snprintf(err, err_len, "%s: out of memory", path);
        rc = 2;
    }
    for (int i = 0; i < n && rc == 0; i++) {
        const double *x = rows[i].x;   /* prefill_chunk, kv_prefill, n_decode, kv_decode */
        if (x[0] == 0 && x[2] == 0) {
            snprintf(err, err_len, "%s:%d: neither a prefill chunk nor decodes: an empty batch", path, rows[i].line);
            rc = 2;
        } else if ((x[0] == 0 && x[1] != 0) || (x[2] == 0 && x[3] != 0)) {
            snprintf(err, err_len, "%s:%d: a context without its requests (kv_prefill needs a prefill chunk, kv_decode "
                     "decodes)", path, rows[i].line);
            rc = 2;
        } else if (x[0] == 1) {
            snprintf(err, err_len, "%s:%d: a prefill chunk of one token is a decode", path, rows[i].line);
            rc = 2;
        } else {
            pick[x[0] == 0 ? 0 : x[2] == 0 ? 1 : 2][i] = true;
        }
    }
    static const int cols_decode[2] = {2, 3}, cols_prefill[2] = {0, 1}, cols_mixed[4] = {0, 1, 2, 3};
    static const char *what[3] = {"decode-only", "prefill-only", "mixed"};
    imp_grid *g = calloc(3, sizeof *g);
    if (!g && rc == 0) {
        snprintf(err, err_len, "%s: out of memory", path);
        rc = 2;
    }
    long dropped[3] = {0, 0, 0};
    size_t used = 0;
    for (int t = 0; t < 3 && rc == 0; t++) {
        rc = build_grid(&g[t], t == 2 ? 4 : 2, t == 0 ? cols_decode : t == 1 ? cols_prefill : cols_mixed, rows, pick[t],
                        n, path, what[t], err, err_len);
        if (rc == 0 && (dropped[t] = complete_grid(&g[t])) < 0) {
            snprintf(err, err_len, "%s: the %s rows hold no complete grid", path, what[t]);
            rc = 2;
        }
        double tmp[IMP_MAX_VALUES];
        size_t cells = 1;
        for (int a = 0; a < g[t].dims && rc == 0; a++) {
            int k = kept_axis(&g[t], a, tmp);
            cells *= (size_t)k;
            if (k > AR_PROF_MAX_AXIS || (t == 2 && cells > AR_PROF_MAX_MIX)) {
                snprintf(err, err_len, "%s: the complete %s grid has %d values on an axis or %zu cells (at most %d, %d)",
                         path, what[t], k, cells, AR_PROF_MAX_AXIS, AR_PROF_MAX_MIX);
                rc = 2;
            }
        }
        if (rc == 0 && note && note_len > used) {
            int k0 = kept_axis(&g[t], 0, tmp), k1 = kept_axis(&g[t], 1, tmp);
            int k2 = t == 2 ? kept_axis(&g[t], 2, tmp) : 0, k3 = t == 2 ? kept_axis(&g[t], 3, tmp) : 0;
            int w = t == 2 ? snprintf(note + used, note_len - used, "%s%s %d x %d x %d x %d", used ? "; " : "", what[t],
                                      k0, k1, k2, k3)
                           : snprintf(note + used, note_len - used, "%s%s %d x %d", used ? "; " : "", what[t], k0, k1);
            if (w > 0) used += (size_t)w;
            if (dropped[t] > 0 && note_len > used) {
                w = snprintf(note + used, note_len - used, " (%ld rows off the complete grid left out)", dropped[t]);
                if (w > 0) used += (size_t)w;
            }
        }
    }
    if (rc == 0) {
        int idx[4];
        p->num_dec_batch = kept_axis(&g[0], 0, p->dec_batch);
        p->num_dec_ctx = kept_axis(&g[0], 1, p->dec_ctx);
        p->num_pre_q = kept_axis(&g[1], 0, p->pre_q);
        p->num_pre_ctx = kept_axis(&g[1], 1, p->pre_ctx);
        p->num_mix_q = kept_axis(&g[2], 0, p->mix_q);
        p->num_mix_ctx = kept_axis(&g[2], 1, p->mix_ctx);
        p->num_mix_batch = kept_axis(&g[2], 2, p->mix_batch);
        p->num_mix_dctx = kept_axis(&g[2], 3, p->mix_dctx);
        for (int t = 0; t < 3; t++) {
            size_t k = 0;
            first_kept(&g[t], idx);
            do {
                double us = g[t].cell[grid_index(&g[t], idx)];
                if (t == 2) p->mix_us[k] = us;
                else if (t == 0) p->dec_us[k / p->num_dec_ctx][k % p->num_dec_ctx] = us;
                else p->pre_us[k / p->num_pre_ctx][k % p->num_pre_ctx] = us;
                k++;
            } while (next_kept(&g[t], idx));
        }
    }
    if (g)
        for (int t = 0; t < 3; t++) free(g[t].cell);
    free(g);
    for (int t = 0; t < 3; t++) free(pick[t]);
    free(rows);
    /* LLMServingSim's attention lookup: a step's prompts together, and its skew table if the folder has one */
    p->prompts_together = true;
    int buckets = 0, skew_rows = 0;
    if (rc == 0) rc = import_skew(dir, p, &buckets, &skew_rows, err, err_len);
    if (rc == 0 && note && note_len > used) {
        if (buckets > 0)
            snprintf(note + used, note_len - used, "; skew %d buckets over %d prompt-token values, alpha_default %.4f "
                     "from %d rows of skew.csv", buckets, p->num_skew_pc, p->skew_alpha_default, skew_rows);
        else
            snprintf(note + used, note_len - used, "; no skew.csv: no skew correction");
    }
    return rc;
}
