/* shard.c - launcher detection, the GPU a local rank takes, the cost-balanced split of a trace
 * over shards and per-shard file names (see shard.h for the rules). */
#include "shard.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../traces/trace.h"

/* ---- the environment ------------------------------------------------------------------------ */

static const char *env_get(char *const *envp, const char *name)
{
    if (!envp) return NULL;
    size_t n = strlen(name);
    for (char *const *e = envp; *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=') return *e + n + 1;
    return NULL;
}

/* A non-negative decimal below 2^31. */
static int parse_count(const char *s, long *out)
{
    if (!s || !*s) return -1;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9') return -1;
    errno = 0;
    long v = strtol(s, NULL, 10);
    if (errno || v > INT_MAX) return -1;
    *out = v;
    return 0;
}

/* One launcher's variables, read. */
typedef struct launcher_vars {
    const char *name;              /* "slurm", "openmpi", ... */
    bool present, complete;
    long rank, size, local;        /* local -1 when not given */
    char detail[200];
} launcher_vars;

static void add_detail(launcher_vars *v, const char *name, const char *value)
{
    size_t used = strlen(v->detail);
    snprintf(v->detail + used, sizeof v->detail - used, "%s%s=%s", used ? " " : "", name, value);
}

/* Reads rank/size/local from the three names (local optional: NULL).  -1 with err for a partial
 * or malformed set. */
static int read_set(char *const *envp, launcher_vars *v, const char *rank_name, const char *size_name,
                    const char *const *local_names, char *err, size_t err_len)
{
    const char *rank = env_get(envp, rank_name), *size = env_get(envp, size_name);
    const char *local = NULL, *local_name = NULL;
    for (int i = 0; local_names && local_names[i] && !local; i++) {
        local = env_get(envp, local_names[i]);
        local_name = local_names[i];
    }
    v->local = -1;
    if (!rank && !size) return 0;
    v->present = true;
    if (rank) add_detail(v, rank_name, rank);
    if (size) add_detail(v, size_name, size);
    if (local) add_detail(v, local_name, local);
    if (!rank || !size) {
        snprintf(err, err_len, "%s is set but %s is not: partial %s launcher variables; launch through the "
                 "launcher, unset the stray variable, or give --shard i/N", rank ? rank_name : size_name,
                 rank ? size_name : rank_name, v->name);
        return -1;
    }
    if (parse_count(rank, &v->rank) || parse_count(size, &v->size) || (local && parse_count(local, &v->local))) {
        snprintf(err, err_len, "%s: not a non-negative integer in %s", v->name, v->detail);
        return -1;
    }
    if (v->size < 1 || v->rank >= v->size) {
        snprintf(err, err_len, "%s: rank %ld is outside the size %ld (%s)", v->name, v->rank, v->size, v->detail);
        return -1;
    }
    v->complete = true;
    return 0;
}

/* Slurm: tasks of the step, and the array index; combined as shard.h says. */
static int read_slurm(char *const *envp, launcher_vars *v, char *err, size_t err_len)
{
    const char *procid = env_get(envp, "SLURM_PROCID");
    const char *step_tasks = env_get(envp, "SLURM_STEP_NUM_TASKS");
    const char *ntasks = step_tasks ? step_tasks : env_get(envp, "SLURM_NTASKS");
    const char *ntasks_name = step_tasks ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
    const char *localid = env_get(envp, "SLURM_LOCALID");
    const char *task_id = env_get(envp, "SLURM_ARRAY_TASK_ID"), *task_count = env_get(envp, "SLURM_ARRAY_TASK_COUNT");
    long rank = 0, size = 1, local = -1;
    v->local = -1;
    if (procid) {
        v->present = true;
        add_detail(v, "SLURM_PROCID", procid);
        if (ntasks) add_detail(v, ntasks_name, ntasks);
        if (localid) add_detail(v, "SLURM_LOCALID", localid);
        if (parse_count(procid, &rank) || (ntasks && parse_count(ntasks, &size)) ||
            (localid && parse_count(localid, &local))) {
            snprintf(err, err_len, "slurm: not a non-negative integer in %s", v->detail);
            return -1;
        }
        if (!ntasks && rank != 0) {
            snprintf(err, err_len, "SLURM_PROCID=%ld is set but SLURM_NTASKS is not: partial slurm launcher "
                     "variables; give --shard i/N", rank);
            return -1;
        }
        if (size < 1 || rank >= size) {
            snprintf(err, err_len, "slurm: task %ld is outside the task count %ld (%s)", rank, size, v->detail);
            return -1;
        }
    }
    if (task_id || task_count) {
        v->present = true;
        add_detail(v, "SLURM_ARRAY_TASK_ID", task_id ? task_id : "(unset)");
        add_detail(v, "SLURM_ARRAY_TASK_COUNT", task_count ? task_count : "(unset)");
        if (!task_id || !task_count) {
            snprintf(err, err_len, "%s is set but %s is not: partial slurm job-array variables; give --shard i/N",
                     task_id ? "SLURM_ARRAY_TASK_ID" : "SLURM_ARRAY_TASK_COUNT",
                     task_id ? "SLURM_ARRAY_TASK_COUNT" : "SLURM_ARRAY_TASK_ID");
            return -1;
        }
        const char *min_text = env_get(envp, "SLURM_ARRAY_TASK_MIN"), *step_text = env_get(envp, "SLURM_ARRAY_TASK_STEP");
        long id, count, min = 0, step = 1;
        if (min_text) add_detail(v, "SLURM_ARRAY_TASK_MIN", min_text);
        if (step_text) add_detail(v, "SLURM_ARRAY_TASK_STEP", step_text);
        if (parse_count(task_id, &id) || parse_count(task_count, &count) || (min_text && parse_count(min_text, &min)) ||
            (step_text && parse_count(step_text, &step)) || step < 1 || count < 1) {
            snprintf(err, err_len, "slurm: not a usable job-array number in %s", v->detail);
            return -1;
        }
        if (id < min || (id - min) % step != 0 || (id - min) / step >= count) {
            snprintf(err, err_len, "slurm: array task %ld is not one of %ld evenly spaced ids from %ld (%s): shards "
                     "need --array=0-%ld (or A-B[:S]); for other arrays give --shard i/N", id, count, min, v->detail,
                     count - 1);
            return -1;
        }
        long index = (id - min) / step;
        if ((long long)count * size > INT_MAX) {
            snprintf(err, err_len, "slurm: %ld array tasks x %ld tasks is too many shards", count, size);
            return -1;
        }
        rank = index * size + rank;
        size = count * size;
    }
    if (!v->present) return 0;
    v->rank = rank;
    v->size = size;
    v->local = local;
    v->complete = true;
    return 0;
}

int ar_launch_detect(const char *shard_opt, char *const *envp, ar_launch *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    out->count = 1;
    out->local_rank = -1;
    snprintf(out->source, sizeof out->source, "none");
    static const char *const ompi_local[] = {"OMPI_COMM_WORLD_LOCAL_RANK", NULL};
    static const char *const pmi_local[] = {"MPI_LOCALRANKID", "PMI_LOCAL_RANK", NULL};
    static const char *const torch_local[] = {"LOCAL_RANK", NULL};
    launcher_vars sets[4] = {{.name = "slurm"}, {.name = "openmpi"}, {.name = "pmi"}, {.name = "torchrun"}};
    char why[4][384];
    int bad[4];
    bad[0] = read_slurm(envp, &sets[0], why[0], sizeof why[0]);
    bad[1] = read_set(envp, &sets[1], "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", ompi_local, why[1], sizeof why[1]);
    bad[2] = read_set(envp, &sets[2], "PMI_RANK", "PMI_SIZE", pmi_local, why[2], sizeof why[2]);
    bad[3] = read_set(envp, &sets[3], "RANK", "WORLD_SIZE", torch_local, why[3], sizeof why[3]);

    if (shard_opt) {
        long i, n;
        const char *slash = strchr(shard_opt, '/');
        char head[32];
        if (!slash || (size_t)(slash - shard_opt) >= sizeof head) goto bad_opt;
        memcpy(head, shard_opt, (size_t)(slash - shard_opt));
        head[slash - shard_opt] = '\0';
        if (parse_count(head, &i) || parse_count(slash + 1, &n) || n < 1 || i >= n) goto bad_opt;
        out->shard = (int)i;
        out->count = (int)n;
        snprintf(out->source, sizeof out->source, "--shard");
        snprintf(out->detail, sizeof out->detail, "--shard %ld/%ld", i, n);
        /* the local rank still comes from a launcher, when one is there and whole */
        for (int k = 1; k <= 4; k++) {
            int s = k % 4;   /* Open MPI, PMI, torchrun, then Slurm: the innermost launcher first */
            if (!bad[s] && sets[s].complete && sets[s].local >= 0) {
                out->local_rank = (int)sets[s].local;
                size_t used = strlen(out->detail);
                snprintf(out->detail + used, sizeof out->detail - used, ", local rank from %s", sets[s].detail);
                break;
            }
        }
        return 0;
    bad_opt:
        snprintf(err, err_len, "--shard takes i/N with 0 <= i < N (got '%s')", shard_opt);
        return -1;
    }
    for (int s = 0; s < 4; s++) {
        if (bad[s]) {
            snprintf(err, err_len, "%s", why[s]);
            return -1;
        }
    }
    /* The winner: the first complete set, except that an inner launcher beats Slurm's inherited
     * variables when they disagree. */
    int win = -1;
    for (int s = 0; s < 4 && win < 0; s++)
        if (sets[s].complete) win = s;
    if (win < 0) return 0;
    bool nested = false;
    if (win == 0) {
        for (int s = 1; s < 4; s++) {
            if (!sets[s].complete) continue;
            if (sets[s].rank != sets[0].rank || sets[s].size != sets[0].size) {
                win = s;
                nested = true;
            }
            break;
        }
    }
    for (int s = 1; s < 4; s++) {
        if (s == win || !sets[s].complete) continue;
        if (sets[s].rank != sets[win].rank || sets[s].size != sets[win].size) {
            snprintf(err, err_len, "inconsistent launcher variables: %s says rank %ld of %ld (%s) but %s says rank "
                     "%ld of %ld (%s); give --shard i/N", sets[win].name, sets[win].rank, sets[win].size,
                     sets[win].detail, sets[s].name, sets[s].rank, sets[s].size, sets[s].detail);
            return -1;
        }
    }
    const launcher_vars *w = &sets[win];
    out->shard = (int)w->rank;
    out->count = (int)w->size;
    out->local_rank = (int)w->local;
    bool array = win == 0 && env_get(envp, "SLURM_ARRAY_TASK_ID");
    snprintf(out->source, sizeof out->source, "%s", array ? "slurm-array" : w->name);
    snprintf(out->detail, sizeof out->detail, "%s%s", w->detail,
             nested ? " (started inside a Slurm job: its SLURM_* variables describe the allocation)" : "");
    return 0;
}

int ar_launch_visible_count(const char *cuda_visible)
{
    if (!cuda_visible) return -1;
    int n = 0;
    const char *p = cuda_visible;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len > 0 && p[0] == ' ') { p++; len--; }
        if (len == 0 || p[0] == '-') break;
        n++;
        if (!end) break;
        p = end + 1;
    }
    return n;
}

int ar_launch_device(int local_rank, const char *cuda_visible, int device_count, char *why, size_t why_len)
{
    if (local_rank < 0) {
        snprintf(why, why_len, "device 0 (no local rank from a launcher)");
        return 0;
    }
    int visible = ar_launch_visible_count(cuda_visible);
    int n = visible >= 0 ? visible : device_count;
    if (n <= 0) {
        snprintf(why, why_len, "device 0 (%s)", visible == 0 ? "CUDA_VISIBLE_DEVICES lists no device"
                                                              : "no CUDA device counted");
        return 0;
    }
    int dev = local_rank % n;
    if (visible >= 0)
        snprintf(why, why_len, "device %d of the %d in CUDA_VISIBLE_DEVICES=%s (local rank %d%s)", dev, n,
                 cuda_visible, local_rank, local_rank >= n ? ", shared round robin" : "");
    else
        snprintf(why, why_len, "device %d of %d (local rank %d%s)", dev, n, local_rank,
                 local_rank >= n ? ", shared round robin" : "");
    return dev;
}

int ar_shard_path(const char *pattern, int shard, int count, const char *host, char *out, size_t out_len,
                  char *err, size_t err_len)
{
    size_t at = 0;
    for (const char *p = pattern; *p; p++) {
        char piece[256];
        if (*p != '%') {
            piece[0] = *p;
            piece[1] = '\0';
        } else {
            switch (p[1]) {
            case 'r': snprintf(piece, sizeof piece, "%d", shard); break;
            case 'n': snprintf(piece, sizeof piece, "%d", count); break;
            case 'h': snprintf(piece, sizeof piece, "%s", host && *host ? host : "localhost"); break;
            case '%': snprintf(piece, sizeof piece, "%%"); break;
            default:
                snprintf(err, err_len, "'%s': unknown %%%c (a per-shard name takes %%r shard, %%n shard count, "
                         "%%h host, %%%% a percent sign)", pattern, p[1] ? p[1] : ' ');
                return -1;
            }
            p++;
        }
        size_t len = strlen(piece);
        if (at + len + 1 > out_len) {
            snprintf(err, err_len, "'%s': the expanded name is too long", pattern);
            return -1;
        }
        memcpy(out + at, piece, len);
        at += len;
    }
    out[at] = '\0';
    return 0;
}

/* ---- the plan --------------------------------------------------------------------------------- */

const char *ar_shard_by_name(ar_shard_by by)
{
    return by == AR_SHARD_BY_STEPS ? "steps" : by == AR_SHARD_BY_LAYERS ? "layers" : "auto";
}

int ar_shard_by_parse(const char *text, ar_shard_by *out)
{
    if (strcmp(text, "auto") == 0) *out = AR_SHARD_BY_AUTO;
    else if (strcmp(text, "steps") == 0) *out = AR_SHARD_BY_STEPS;
    else if (strcmp(text, "layers") == 0) *out = AR_SHARD_BY_LAYERS;
    else return -1;
    return 0;
}

bool ar_shard_owns(size_t item, int shard, int count)
{
    return count <= 1 || (int)(item % (size_t)count) == shard;
}

void ar_shard_split(const double *costs, size_t n, int count, size_t *bounds)
{
    double total = 0;
    for (size_t i = 0; i < n; i++) total += costs[i];
    bounds[0] = 0;
    if (n < (size_t)count) {   /* fewer items than parts: one each, the last parts empty */
        for (int k = 1; k <= count; k++) bounds[k] = (size_t)k < n ? (size_t)k : n;
        return;
    }
    size_t j = 0;          /* items before bounds[k] */
    double prefix = 0;     /* cost of items [0, j) */
    for (int k = 1; k < count; k++) {
        double target = total * (double)k / (double)count;
        /* advance while the next item brings the prefix closer to the target */
        while (j < n && fabs(prefix + costs[j] - target) <= fabs(prefix - target) &&
               !(prefix + costs[j] == prefix && prefix >= target)) {
            prefix += costs[j];
            j++;
        }
        size_t lo = bounds[k - 1] + 1, hi = n - (size_t)(count - k);   /* no empty part */
        size_t b = j < lo ? lo : j > hi ? hi : j;
        while (j < b) prefix += costs[j++];
        while (j > b) prefix -= costs[--j];
        bounds[k] = b;
    }
    bounds[count] = n;
}

void ar_shard_plan_free(ar_shard_plan *p)
{
    free(p->parts);
    p->parts = NULL;
}

double ar_shard_cost(const ar_shard_costs *c, size_t from, size_t to, int layer_first, int layer_last,
                     int verified_layers)
{
    const int layers = layer_last - layer_first + 1;
    const int last_verified = verified_layers - 1 < layer_last ? verified_layers - 1 : layer_last;
    const int verified = last_verified >= layer_first ? last_verified - layer_first + 1 : 0;
    double sum = 0;
    for (size_t i = from; i < to; i++) sum += c->layer[i] * layers + c->verify[i] * verified + c->fixed[i];
    return sum;
}

int ar_shard_plan_make(const ar_shard_costs *c, int layers, int verified_layers, int count, ar_shard_by by,
                       ar_shard_plan *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    const size_t n = c->n;
    if (count < 1 || layers < 1) {
        snprintf(err, err_len, "a plan needs at least one shard and one layer");
        return -1;
    }
    if (count > AR_SHARD_MAX_COUNT) {
        snprintf(err, err_len, "%d shards: more than the %d one plan may have", count, AR_SHARD_MAX_COUNT);
        return -1;
    }
    if (by == AR_SHARD_BY_LAYERS && layers < count) {
        snprintf(err, err_len, "--shard-by layers: %d layer%s cannot be split over %d shards (give --layers %d or "
                 "more, or --shard-by steps)", layers, layers == 1 ? "" : "s", count, count);
        return -1;
    }
    out->parts = calloc((size_t)count, sizeof *out->parts);
    double *full = malloc((n ? n : 1) * sizeof *full);
    size_t *bounds = malloc(((size_t)count + 1) * sizeof *bounds);
    if (!out->parts || !full || !bounds) {
        free(full);
        free(bounds);
        ar_shard_plan_free(out);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    out->count = count;
    out->layers = layers;
    double total = 0, biggest = 0;
    for (size_t i = 0; i < n; i++) {
        full[i] = ar_shard_cost(c, i, i + 1, 0, layers - 1, verified_layers);
        total += full[i];
        if (full[i] > biggest) biggest = full[i];
        out->work_steps += full[i] > 0;
    }
    out->total_cost = total;
    const double mean = total / count;
    /* the step split */
    ar_shard_split(full, n, count, bounds);
    double step_max = 0;
    for (int k = 0; k < count; k++) {
        double part = 0;
        for (size_t i = bounds[k]; i < bounds[k + 1]; i++) part += full[i];
        if (part > step_max) step_max = part;
    }
    /* the layer split: layers dealt out evenly, each shard paying every step's fixed cost */
    double layer_max = INFINITY;
    if (layers >= count) {
        layer_max = 0;
        for (int k = 0; k < count; k++) {
            double part = ar_shard_cost(c, 0, n, (int)((int64_t)layers * k / count),
                                        (int)((int64_t)layers * (k + 1) / count) - 1, verified_layers);
            if (part > layer_max) layer_max = part;
        }
    }
    const double step_imb = mean > 0 ? step_max / mean : 1, layer_imb = mean > 0 ? layer_max / mean : INFINITY;
    ar_shard_by chosen = by;
    if (by == AR_SHARD_BY_AUTO) {
        chosen = AR_SHARD_BY_STEPS;
        if (count > 1 && step_imb > 1.25 && layer_imb < step_imb) chosen = AR_SHARD_BY_LAYERS;
        if (chosen == AR_SHARD_BY_LAYERS)
            snprintf(out->why, sizeof out->why, "auto: splitting steps would leave the largest shard %.2fx the mean "
                     "(%lld steps with work, the largest %.0f%% of the total); splitting %d layers gives %.2fx",
                     step_imb, (long long)out->work_steps, total > 0 ? 100.0 * biggest / total : 0.0, layers, layer_imb);
        else if (count > 1)
            snprintf(out->why, sizeof out->why, "auto: contiguous step ranges balanced by estimated cost "
                     "(largest shard %.2fx the mean%s)", step_imb,
                     layers >= count ? "" : "; too few layers to split them instead");
        else
            snprintf(out->why, sizeof out->why, "one shard");
    } else {
        snprintf(out->why, sizeof out->why, "--shard-by %s", ar_shard_by_name(by));
    }
    out->by = chosen;
    for (int k = 0; k < count; k++) {
        ar_shard_part *p = &out->parts[k];
        if (chosen == AR_SHARD_BY_STEPS) {
            p->layer_first = 0;
            p->layer_last = layers - 1;
            if (bounds[k] < bounds[k + 1]) {
                p->step_first = c->steps[bounds[k]];
                p->step_last = c->steps[bounds[k + 1] - 1];
            } else {
                p->step_first = 0;
                p->step_last = -1;
            }
            for (size_t i = bounds[k]; i < bounds[k + 1]; i++) {
                p->cost += full[i];
                p->steps += full[i] > 0;
            }
        } else {
            p->layer_first = (int)((int64_t)layers * k / count);
            p->layer_last = (int)((int64_t)layers * (k + 1) / count) - 1;
            p->step_first = n ? c->steps[0] : 0;
            p->step_last = n ? c->steps[n - 1] : -1;
            p->steps = out->work_steps;
            p->cost = ar_shard_cost(c, 0, n, p->layer_first, p->layer_last, verified_layers);
        }
    }
    double part_max = 0;
    for (int k = 0; k < count; k++)
        if (out->parts[k].cost > part_max) part_max = out->parts[k].cost;
    out->imbalance = mean > 0 ? part_max / mean : 1;
    out->range_first = n ? c->steps[0] : 0;
    out->range_last = n ? c->steps[n - 1] : -1;
    free(full);
    free(bounds);
    return 0;
}

int ar_shard_plan_trace(const char *trace, int64_t first, int64_t last, int layers, int verified_layers,
                        ar_shard_verify verify, int count, ar_shard_by by, ar_shard_plan *out, char *err,
                        size_t err_len)
{
    memset(out, 0, sizeof *out);
    ar_trace_reader *r = ar_trace_open(trace, err, err_len);
    if (!r) return -1;
    size_t n = 0, cap = 0;
    int64_t *steps = NULL;
    double *layer = NULL, *vcost = NULL, *fixed = NULL;
    const ar_step *s;
    int rc;
    while ((rc = ar_trace_next(r, &s, err, err_len)) == 1) {
        if (s->step < first) continue;
        if (s->step > last) break;
        if (n == cap) {
            cap = cap ? 2 * cap : 1024;
            int64_t *ns = realloc(steps, cap * sizeof *ns);
            if (ns) steps = ns;
            double *nl = realloc(layer, cap * sizeof *nl);
            if (nl) layer = nl;
            double *nv = realloc(vcost, cap * sizeof *nv);
            if (nv) vcost = nv;
            double *nf = realloc(fixed, cap * sizeof *nf);
            if (nf) fixed = nf;
            if (!ns || !nl || !nv || !nf) {
                snprintf(err, err_len, "out of memory planning the shards");
                rc = -1;
                break;
            }
        }
        double pairs = 0, tokens = 0, kv = 0;
        for (int i = 0; i < s->num_scheduled; i++) {
            const ar_live_req *lr = ar_trace_find(r, s->scheduled[i].req);
            double q = s->scheduled[i].num_tokens, ctx = lr ? lr->num_computed_tokens : 0;
            pairs += q * (ctx + (q + 1) / 2.0);
            tokens += q;
            kv += ctx + q;
        }
        const bool work = s->num_scheduled > 0;
        steps[n] = s->step;
        layer[n] = work ? pairs + AR_SHARD_TOKEN_COST * tokens + AR_SHARD_LAYER_COST : 0;
        vcost[n] = !work ? 0 : verify == AR_SHARD_VERIFY_ALL ? AR_SHARD_VERIFY_ALL_COST * pairs
                 : verify == AR_SHARD_VERIFY_SAMPLE ? AR_SHARD_VERIFY_SAMPLE_COST * kv : 0;
        fixed[n] = work ? AR_SHARD_STEP_COST : 0;
        n++;
    }
    ar_trace_close(r);
    if (rc == 1) rc = 0;   /* stopped after the last step of the range */
    if (rc == 0) {
        ar_shard_costs costs = {steps, layer, vcost, fixed, n};
        rc = ar_shard_plan_make(&costs, layers, verify == AR_SHARD_VERIFY_OFF ? 0 : verified_layers, count, by, out,
                                err, err_len);
    }
    free(steps);
    free(layer);
    free(vcost);
    free(fixed);
    return rc < 0 ? -1 : 0;
}

void ar_shard_plan_print(FILE *f, const ar_shard_plan *p, const char *trace, int mark)
{
    fprintf(f, "shard plan: %d shard%s of %s, steps %lld..%lld (%lld with work), %d layer%s, split by %s\n", p->count,
            p->count == 1 ? "" : "s", trace, (long long)p->range_first, (long long)p->range_last,
            (long long)p->work_steps, p->layers, p->layers == 1 ? "" : "s", ar_shard_by_name(p->by));
    fprintf(f, "  %s\n", p->why);
    fprintf(f, "  %-8s %-19s %-11s %11s %12s %7s\n", "shard", "steps", "layers", "with work", "est. cost", "share");
    for (int k = 0; k < p->count; k++) {
        const ar_shard_part *q = &p->parts[k];
        char id[24], steps[48], layers[32];
        snprintf(id, sizeof id, "%d/%d", k, p->count);
        if (q->step_first <= q->step_last) snprintf(steps, sizeof steps, "%lld..%lld", (long long)q->step_first,
                                                    (long long)q->step_last);
        else snprintf(steps, sizeof steps, "none");
        snprintf(layers, sizeof layers, "%d..%d", q->layer_first, q->layer_last);
        fprintf(f, "%c %-8s %-19s %-11s %11lld %12.4g %6.1f%%\n", k == mark ? '>' : ' ', id, steps, layers,
                (long long)q->steps, q->cost, p->total_cost > 0 ? 100.0 * q->cost / p->total_cost : 0.0);
    }
    fprintf(f, "  largest shard %.2fx the mean; cost in kernel query-key pairs: per layer qk_pairs + %.0f x tokens + "
            "%.2g, per verified layer %.0f x qk_pairs (all) or %.0f x context tokens (sample), %.2g per step\n",
            p->imbalance, AR_SHARD_TOKEN_COST, AR_SHARD_LAYER_COST, AR_SHARD_VERIFY_ALL_COST,
            AR_SHARD_VERIFY_SAMPLE_COST, AR_SHARD_STEP_COST);
}
