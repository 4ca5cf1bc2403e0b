/* steptime.c - how long one engine step takes, as a function of the batch.
 *
 * constant:S   every step takes S seconds.
 * linear:A,B,C,D   A + B * tokens + C * requests + D * (sum of seq_len) seconds.
 * roofline:DEVICE[,KEY=VALUE...]   the engine step as vLLM runs it (terms and sources in
 *   sim/README.md, "Step time"):
 *     t = async ? max(t_gpu, t_cpu) : t_gpu + t_cpu,   t_cpu = overhead + per_req * requests
 *     t_gpu = t_linear + t_attention + t_allreduce + gap
 *   t_linear = max(GEMM FLOPs / (peak * gemm_eff), (weight + activation bytes) / (bw * bw_eff))
 *     over the tokens padded to the next CUDA-graph capture size (batches of <= graph tokens);
 *     GEMM FLOPs = 2 * active parameters per token * padded tokens (every layer's projections and
 *     MLP) + 2 * hidden * vocab * requests (LM head on the sampled rows only); weight bytes = all
 *     weights but the embedding table (MoE: only the experts the batch is expected to touch,
 *     1 - (1 - k/E)^tokens of them); activation bytes = each GEMM's input and output rows.
 *   t_attention = sum over requests of max(attention FLOPs / (peak * attn_eff), KV bytes /
 *     (bw * kv_eff)): each request is bound on its own (a long prefill by compute, decodes by
 *     their KV reads), so the cost depends on the batch's shape, not only on its totals.
 *     FLOPs = 2 * layers * q_heads * (qk + v dims) * query-key pairs (MLA absorbed: 576 + 512);
 *     KV bytes = layers * (seq_len + new tokens) * KV bytes per token per layer.
 *   t_allreduce (tp > 1) = 2 * layers * (link_lat + 2 (tp - 1) / tp * padded tokens * hidden *
 *     2 bytes / link_bw): Megatron-style tensor parallelism all-reduces after attention and after
 *     the MLP of every layer, as a ring.  FLOPs and bytes above are divided by tp.
 *   gap: per-step serial GPU time async scheduling does not hide (sampler, input copies, launches).
 *   Keys: gemm_eff, attn_eff, bw_eff (default: the device's efficiency table, sim/presets.c),
 *   kv_eff (attention's KV reads; default the device table's measured kv_eff, else bw_eff), gap (0),
 *   overhead (3 ms), per_req (0), tp (1), graph (CUDA-graph limit; default vLLM's
 *   min(2 * max_num_seqs, 512), 0 = eager), async (1 = on, vLLM's default; 0 = off), link_bw
 *   (bytes/s), link_lat (s).
 * fitted:DB[,run=ID][,device=DEV][,same keys as roofline]
 *   the roofline with its attention term replaced by a least-squares fit to a replay database:
 *   a + b * tokens + c * requests + d * (sum of seq_len), from the steps' measured attention time
 *   (time_us, summed over the replayed layers), scaled from the run's replayed layers to all of
 *   the model's layers.
 * profile:DB[,device=DEV][,same keys]
 *   t_linear and t_attention interpolated from a measured profile (sim/profile.c): every GEMM of
 *   every layer at the padded token count (and any other per-token operation the profile holds, as
 *   many calls per layer as it says, or once per step), the LM head at the number of requests, one layer's
 *   attention for the batch's shape times the layers, scaled by the profile's measured / predicted
 *   ratio over real replayed steps; all-reduce and CPU terms as in the roofline.  The device (for
 *   the interconnect) is the preset matching the GPU the profile was measured on, or device=.
 *   Keys of its own: prompts_together (1: a step's prompts are one attention lookup at their summed
 *   tokens and contexts, LLMServingSim's; 0: each alone, the largest with the decodes; default the
 *   profile's attn_prompts) and skew (0 leaves out the profile's correction for decodes of unequal
 *   contexts; default on where the profile has one). */
#include "sim.h"
#include "../replay/db_lock.h"

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_double(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

static int parse_model(const char *kind, char *args, const ar_model_preset *preset, ar_steptime *st, char *err,
                       size_t err_len);

int ar_steptime_parse(const char *spec, const ar_model_preset *preset, ar_steptime *st,
                      char *err, size_t err_len)
{
    memset(st, 0, sizeof *st);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    char *colon = strchr(buf, ':');
    char *args = colon ? colon + 1 : buf + strlen(buf);
    if (colon) *colon = 0;
    if (strcmp(buf, "constant") == 0) {
        st->kind = AR_STEPTIME_CONSTANT;
        st->constant_s = 0.02;
        if (*args && (parse_double(args, &st->constant_s) != 0 || st->constant_s <= 0)) {
            snprintf(err, err_len, "--step-time constant:S needs a positive number of seconds");
            return 2;
        }
        return 0;
    }
    if (strcmp(buf, "linear") == 0) {
        st->kind = AR_STEPTIME_LINEAR;
        double v[4] = {0.005, 5e-5, 2e-4, 1e-7};   /* defaults: an H200-class 8B engine, rough */
        int n = 0;
        char *save = NULL;
        for (char *tok = strtok_r(args, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (n >= 4 || parse_double(tok, &v[n]) != 0 || v[n] < 0) {
                snprintf(err, err_len, "--step-time linear:BASE,PER_TOKEN,PER_REQ,PER_KV_TOKEN needs up to 4 non-negative numbers");
                return 2;
            }
            n++;
        }
        st->lin_base_s = v[0];
        st->lin_per_token_s = v[1];
        st->lin_per_req_s = v[2];
        st->lin_per_kv_token_s = v[3];
        if (st->lin_base_s + st->lin_per_token_s <= 0) {
            snprintf(err, err_len, "--step-time linear: a step must take time (BASE or PER_TOKEN > 0)");
            return 2;
        }
        return 0;
    }
    if (strcmp(buf, "roofline") == 0 || strcmp(buf, "fitted") == 0 || strcmp(buf, "profile") == 0)
        return parse_model(buf, args, preset, st, err, err_len);
    snprintf(err, err_len, "--step-time %s: want constant:S, linear:A,B,C,D, roofline:DEVICE[,...], fitted:DB[,...] "
             "or profile:DB[,...]", spec);
    return 2;
}

static void use_device(ar_steptime *st, const ar_device_spec *d)
{
    st->device = *d;
    st->gemm_efficiency = d->gemm_eff;
    st->attn_efficiency = d->attn_eff;
    st->bw_efficiency = d->bw_eff;
    st->link_bw = d->link_bw;
    st->link_latency_s = d->link_latency_s;
}

/* roofline:DEVICE, fitted:DB and profile:DB with their KEY=VALUE list. */
static int parse_model(const char *kind, char *args, const ar_model_preset *preset, ar_steptime *st, char *err,
                       size_t err_len)
{
    bool fitted = strcmp(kind, "fitted") == 0, profiled = strcmp(kind, "profile") == 0;
    st->kind = fitted ? AR_STEPTIME_FITTED : profiled ? AR_STEPTIME_PROFILE : AR_STEPTIME_ROOFLINE;
    st->preset = preset;
    if (preset) {
        st->active_params = ar_preset_active_params(preset);
        st->total_params = ar_preset_total_params(preset);
    }
    st->overhead_s = 0.003;
    st->tensor_parallel = 1;
    st->weight_dtype = AR_BF16;
    st->kv_dtype = AR_BF16;
    st->cudagraph_max = -1;
    st->async_scheduling = true;
    st->attn_scale = 1.0;
    st->kv_efficiency = -1;   /* unset: bw_eff */
    if (!preset) {
        snprintf(err, err_len, "--step-time %s needs a --model preset", kind);
        return 2;
    }
    /* the device (and its efficiency table) comes first, then the keys override it */
    char *save = NULL, *db_path = NULL;
    char *toks[32];
    int n = 0;
    for (char *tok = strtok_r(args, ",", &save); tok && n < 32; tok = strtok_r(NULL, ",", &save)) toks[n++] = tok;
    if (n == 0) {
        if (fitted || profiled) snprintf(err, err_len, "--step-time %s:DB needs a database", kind);
        else snprintf(err, err_len, "--step-time roofline:DEVICE needs a device (%s)", ar_device_names());
        return 2;
    }
    const ar_device_spec *dev = fitted ? ar_device_find("h200") : NULL;
    bool device_given = false;
    for (int i = 0; i < n; i++) {
        bool is_key = strncmp(toks[i], "device=", 7) == 0;
        if (i > 0 && !is_key) continue;
        if (i == 0 && (fitted || profiled) && !is_key) { db_path = toks[0]; continue; }
        const char *name = is_key ? toks[i] + 7 : toks[i];
        if (!(dev = ar_device_find(name))) {
            snprintf(err, err_len, "--step-time %s: unknown device '%s' (%s)", kind, name, ar_device_names());
            return 2;
        }
        device_given = true;
    }
    if (profiled) {
        if (ar_profile_load(db_path, &st->profile, err, err_len) != 0) return 2;
        if (strcmp(st->profile.model, preset->name) != 0) {
            snprintf(err, err_len, "%s: the profile is of model %s, not %s", db_path, st->profile.model, preset->name);
            return 2;
        }
        st->tensor_parallel = st->profile.tp;
        st->attn_scale = st->profile.replay_ratio > 0 ? st->profile.replay_ratio : 1.0;
        if (!device_given && !(dev = ar_device_match(st->profile.device))) {
            snprintf(err, err_len, "%s: measured on '%s', which matches no device preset: give device=NAME (%s) for "
                     "its interconnect", db_path, st->profile.device, ar_device_names());
            return 2;
        }
    }
    use_device(st, dev);
    double run_id = 0;
    for (int i = 1; i < n; i++) {
        char *tok = toks[i];
        if (strncmp(tok, "device=", 7) == 0) continue;
        char *eq = strchr(tok, '=');
        double v;
        if (!eq || parse_double(eq + 1, &v) != 0 || v < 0) {
            snprintf(err, err_len, "--step-time %s: '%s' is not KEY=non-negative number", kind, tok);
            return 2;
        }
        *eq = 0;
        bool whole = v == floor(v);
        if (fitted && strcmp(tok, "run") == 0) run_id = v;
        else if (strcmp(tok, "gemm_eff") == 0) st->gemm_efficiency = v;
        else if (strcmp(tok, "attn_eff") == 0) st->attn_efficiency = v;
        else if (strcmp(tok, "bw_eff") == 0) st->bw_efficiency = v;
        else if (strcmp(tok, "kv_eff") == 0) st->kv_efficiency = v;
        else if (strcmp(tok, "overhead") == 0) st->overhead_s = v;
        else if (strcmp(tok, "per_req") == 0) st->per_req_overhead_s = v;
        else if (strcmp(tok, "gap") == 0) st->gpu_gap_s = v;
        else if (strcmp(tok, "tp") == 0 && v >= 1 && v <= 1024 && whole) {
            if (profiled && (int)v != st->profile.tp) {
                snprintf(err, err_len, "%s: the profile was measured at tp=%d; tp=%d needs its own profile", db_path,
                         st->profile.tp, (int)v);
                return 2;
            }
            st->tensor_parallel = (int)v;
        }
        else if (strcmp(tok, "graph") == 0 && v <= 1 << 20 && whole) st->cudagraph_max = (int)v;
        else if (strcmp(tok, "async") == 0 && (v == 0 || v == 1)) st->async_scheduling = v == 1;
        else if (strcmp(tok, "link_bw") == 0 && v > 0) st->link_bw = v;
        else if (strcmp(tok, "link_lat") == 0) st->link_latency_s = v;
        else if (profiled && strcmp(tok, "prompts_together") == 0 && (v == 0 || v == 1))
            st->profile.prompts_together = v == 1;
        else if (profiled && strcmp(tok, "skew") == 0 && (v == 0 || v == 1)) {
            if (v == 1 && st->profile.num_skew_pc == 0) {
                snprintf(err, err_len, "%s: skew=1: the profile has no skew table (attn_skew)", db_path);
                return 2;
            }
            if (v == 0) st->profile.num_skew_pc = 0;
        }
        else {
            snprintf(err, err_len, "--step-time %s: unknown key or bad value '%s' (gemm_eff, attn_eff, bw_eff, kv_eff, overhead, "
                     "per_req, gap, tp, graph, async, link_bw, link_lat%s)", kind, tok,
                     fitted ? ", run" : profiled ? ", skew, prompts_together" : "");
            return 2;
        }
    }
    if (fitted) {
        int steps = ar_steptime_fit_db(db_path, (int64_t)run_id, preset->model.num_layers, st->fit_coef, err, err_len);
        if (steps < 0) return 2;
        st->fit_steps = steps;
    }
    if (st->kv_efficiency < 0)   /* the device's measured KV-read rate, else the weight stream's */
        st->kv_efficiency = st->device.kv_eff > 0 ? st->device.kv_eff : st->bw_efficiency;
    if (st->gemm_efficiency <= 0 || st->attn_efficiency <= 0 || st->bw_efficiency <= 0 || st->kv_efficiency <= 0 ||
        st->gemm_efficiency > 1 || st->attn_efficiency > 1 || st->bw_efficiency > 1 || st->kv_efficiency > 1) {
        snprintf(err, err_len, "--step-time %s: efficiencies must be in (0, 1]", kind);
        return 2;
    }
    return 0;
}

void ar_steptime_set_engine(ar_steptime *st, int max_num_seqs)
{
    if (st->cudagraph_max < 0) st->cudagraph_max = 2 * max_num_seqs < 512 ? 2 * max_num_seqs : 512;
}

int ar_cudagraph_pad(int n, int max_size)
{
    if (max_size <= 0 || n <= 0) return n;
    int size = n <= 2 ? n : n <= 4 ? 4 : n <= 256 ? (n + 7) / 8 * 8 : 256 + (n - 256 + 15) / 16 * 16;
    return size <= max_size ? size : n;   /* above the largest capture size: eager, unpadded */
}

/* Bytes of the GEMMs' input and output rows per token, over all layers (bf16 activations). */
static double activation_bytes_per_token(const ar_model_preset *p)
{
    const ar_model *m = &p->model;
    double h = p->hidden, q = (double)m->num_q_heads * m->head_size, kv = (double)m->num_kv_heads * m->head_size;
    double mlp = p->num_experts > 0 ? (double)p->moe_intermediate * (p->active_experts + p->shared_experts)
                                    : (double)p->intermediate;
    if (m->attention == AR_ATTN_MLA) { q = (double)m->num_q_heads * m->v_head_dim; kv = m->kv_lora_rank; }
    /* qkv: h in, q + 2 kv out; o: q in, h out; gate_up: h in, 2 mlp out; down: mlp in, h out */
    return 2.0 * m->num_layers * (h + q + 2 * kv + q + h + h + 2 * mlp + mlp + h);
}

/* Per-request attention cost on the roofline: FLOPs and bytes of request r. */
static double attention_roofline(const ar_steptime *st, const ar_batch_features *f, double peak, double kv_bw)
{
    const ar_model *m = &st->preset->model;
    double qk_v = m->attention == AR_ATTN_MLA ? (double)(m->kv_lora_rank + m->qk_rope_head_dim) + m->kv_lora_rank
                                              : 2.0 * m->head_size;
    double kv_token_layer = m->attention == AR_ATTN_MLA ? (double)(m->kv_lora_rank + m->qk_rope_head_dim)
                                                        : 2.0 * m->num_kv_heads * m->head_size;
    kv_token_layer *= ar_dtype_size(st->kv_dtype);
    double flop_per_pair = 2.0 * m->num_layers * m->num_q_heads * qk_v;
    double byte_per_token = (double)m->num_layers * kv_token_layer;
    double compute = peak * st->attn_efficiency, stream = kv_bw;
    if (!f->query_lens || !f->context_lens)
        return fmax(flop_per_pair * f->attn_pairs / compute,
                    byte_per_token * ((double)f->kv_tokens_read + f->num_tokens) / stream);
    double t = 0;
    for (int r = 0; r < f->num_reqs; r++) {
        double n = f->query_lens[r], c = f->context_lens[r];
        double pairs = n * (c + (n + 1) * 0.5);
        t += fmax(flop_per_pair * pairs / compute, byte_per_token * (c + 2 * n) / stream);
    }
    return t;
}

void ar_steptime_parts(const ar_steptime *st, const ar_batch_features *f, ar_step_parts *parts)
{
    memset(parts, 0, sizeof *parts);
    if (st->kind != AR_STEPTIME_ROOFLINE && st->kind != AR_STEPTIME_FITTED && st->kind != AR_STEPTIME_PROFILE) return;
    const ar_model_preset *p = st->preset;
    const ar_model *m = &p->model;
    int tp = st->tensor_parallel > 0 ? st->tensor_parallel : 1;
    int tokens = ar_cudagraph_pad(f->num_tokens, st->cudagraph_max);
    parts->padded_tokens = tokens;
    double peak = st->device.peak_flops * tp, bw = st->device.mem_bw * st->bw_efficiency * tp;
    if (st->kind == AR_STEPTIME_PROFILE) {
        const ar_profile_table *pr = &st->profile;
        for (int g = 0; g < pr->num_gemms; g++) {   /* per_layer: calls per layer; 0 at the requests; -1 once */
            int calls = pr->gemm_per_layer[g];
            parts->linear_s += calls > 0    ? (double)calls * m->num_layers * ar_profile_gemm_us(pr, g, tokens)
                               : calls == 0 ? ar_profile_gemm_us(pr, g, f->num_reqs)
                                            : ar_profile_gemm_us(pr, g, tokens);
        }
        parts->linear_s *= 1e-6;
        if (f->query_lens && f->context_lens) {
            parts->attn_s = 1e-6 * m->num_layers * st->attn_scale *
                            ar_profile_attention_us(pr, f->query_lens, f->context_lens, f->num_reqs);
        } else {   /* totals only: an average request */
            int n = f->num_reqs > 0 ? f->num_reqs : 1;
            int q = (f->num_tokens + n - 1) / n, c = (int)(f->kv_tokens_read / n) - q;
            int *ql = malloc((size_t)n * sizeof(int)), *cl = malloc((size_t)n * sizeof(int));
            if (ql && cl) {
                for (int r = 0; r < n; r++) { ql[r] = q; cl[r] = c > 0 ? c : 0; }
                parts->attn_s = 1e-6 * m->num_layers * st->attn_scale * ar_profile_attention_us(pr, ql, cl, n);
            }
            free(ql);
            free(cl);
        }
    } else {
        double wbytes = ar_dtype_size(st->weight_dtype);
        double head = (double)p->hidden * p->vocab;
        double gemm_flops = 2.0 * st->active_params * tokens + 2.0 * head * f->num_reqs;
        double weights = st->total_params;
        if (p->num_experts > 0) {
            double all_experts = 3.0 * p->hidden * p->moe_intermediate * p->num_experts *
                                 (m->num_layers - p->first_dense_layers);
            double touched = 1.0 - pow(1.0 - (double)p->active_experts / p->num_experts, tokens);
            weights -= all_experts * (1.0 - touched);
        }
        weights -= head;   /* the embedding table is gathered, not streamed */
        double bytes = weights * wbytes + activation_bytes_per_token(p) * tokens;
        parts->linear_s = fmax(gemm_flops / (peak * st->gemm_efficiency), bytes / bw);
        if (st->kind == AR_STEPTIME_FITTED)
            parts->attn_s = fmax(0.0, (st->fit_coef[0] + st->fit_coef[1] * f->num_tokens + st->fit_coef[2] * f->num_reqs +
                                       st->fit_coef[3] * (double)f->kv_tokens_read) / tp);
        else
            parts->attn_s = attention_roofline(st, f, peak, st->device.mem_bw * st->kv_efficiency * tp);
    }
    if (tp > 1 && st->link_bw > 0)
        parts->allreduce_s = 2.0 * m->num_layers *
                             (st->link_latency_s + 2.0 * (tp - 1) / tp * tokens * p->hidden * 2.0 / st->link_bw);
    parts->cpu_s = st->overhead_s + st->per_req_overhead_s * f->num_reqs;
}

double ar_steptime_eval(const ar_steptime *st, const ar_batch_features *f)
{
    switch (st->kind) {
    case AR_STEPTIME_CONSTANT:
        return st->constant_s;
    case AR_STEPTIME_LINEAR:
        return st->lin_base_s + st->lin_per_token_s * f->num_tokens + st->lin_per_req_s * f->num_reqs +
               st->lin_per_kv_token_s * (double)f->kv_tokens_read;
    case AR_STEPTIME_ROOFLINE:
    case AR_STEPTIME_FITTED:
    case AR_STEPTIME_PROFILE: {
        ar_step_parts parts;
        ar_steptime_parts(st, f, &parts);
        double gpu = parts.linear_s + parts.attn_s + parts.allreduce_s + st->gpu_gap_s;
        return st->async_scheduling ? fmax(gpu, parts.cpu_s) : gpu + parts.cpu_s;
    }
    }
    return st->constant_s;
}

/* Solves the 4x4 system a x = b by Gaussian elimination with partial pivoting; -1 if singular. */
static int solve4(double a[4][4], double b[4], double x[4])
{
    for (int c = 0; c < 4; c++) {
        int piv = c;
        for (int r = c + 1; r < 4; r++)
            if (fabs(a[r][c]) > fabs(a[piv][c])) piv = r;
        if (fabs(a[piv][c]) < 1e-300) return -1;
        for (int k = 0; k < 4; k++) { double t = a[c][k]; a[c][k] = a[piv][k]; a[piv][k] = t; }
        double t = b[c]; b[c] = b[piv]; b[piv] = t;
        for (int r = c + 1; r < 4; r++) {
            double m = a[r][c] / a[c][c];
            for (int k = c; k < 4; k++) a[r][k] -= m * a[c][k];
            b[r] -= m * b[c];
        }
    }
    for (int r = 3; r >= 0; r--) {
        double v = b[r];
        for (int k = r + 1; k < 4; k++) v -= a[r][k] * x[k];
        x[r] = v / a[r][r];
    }
    return 0;
}

int ar_steptime_fit_db(const char *db_path, int64_t run_id, int model_layers, double coef[4], char *err,
                       size_t err_len)
{
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        snprintf(err, err_len, "%s: %s", db_path, db ? sqlite3_errmsg(db) : "cannot open");
        sqlite3_close(db);
        return -1;
    }
    sqlite3_busy_timeout(db, ar_db_busy_timeout_ms());   /* a replay writing it: wait as for any database */
    sqlite3_stmt *st = NULL;
    int rc = -1;
    int layers = 0;
    const char *pick = run_id > 0
        ? "SELECT id, layers FROM runs WHERE id = ?1"
        : "SELECT id, layers FROM runs WHERE EXISTS (SELECT 1 FROM steps WHERE steps.run = runs.id AND time_us > 0)"
          " ORDER BY id DESC LIMIT 1";
    if (sqlite3_prepare_v2(db, pick, -1, &st, NULL) != SQLITE_OK) goto sqlerr;
    if (run_id > 0) sqlite3_bind_int64(st, 1, run_id);
    int found = sqlite3_step(st);
    if (found != SQLITE_ROW && found != SQLITE_DONE) goto sqlerr;   /* a lock, say, not a missing run */
    if (found != SQLITE_ROW) {
        snprintf(err, err_len, "%s: no replay run %s with timed steps", db_path, run_id > 0 ? "of that id" : "");
        goto done;
    }
    run_id = sqlite3_column_int64(st, 0);
    layers = sqlite3_column_int(st, 1);
    sqlite3_finalize(st);
    st = NULL;
    if (layers <= 0) {
        snprintf(err, err_len, "%s: run %lld has no layer count", db_path, (long long)run_id);
        goto done;
    }
    if (sqlite3_prepare_v2(db, "SELECT num_tokens, num_reqs, total_context, time_us FROM steps WHERE run = ?1 AND time_us > 0",
                           -1, &st, NULL) != SQLITE_OK)
        goto sqlerr;
    sqlite3_bind_int64(st, 1, run_id);
    double ata[4][4] = {{0}}, atb[4] = {0};
    int n = 0;
    double scale = (double)model_layers / layers * 1e-6;   /* microseconds over replayed layers -> seconds, all layers */
    while (sqlite3_step(st) == SQLITE_ROW) {
        double x[4] = {1.0, sqlite3_column_double(st, 0), sqlite3_column_double(st, 1), sqlite3_column_double(st, 2)};
        double y = sqlite3_column_double(st, 3) * scale;
        for (int r = 0; r < 4; r++) {
            for (int c = 0; c < 4; c++) ata[r][c] += x[r] * x[c];
            atb[r] += x[r] * y;
        }
        n++;
    }
    if (n < 4) {
        snprintf(err, err_len, "%s: run %lld has %d timed steps; the fit needs at least 4", db_path, (long long)run_id, n);
        goto done;
    }
    /* a tiny ridge keeps the system solvable when a feature never varies (e.g. one request) */
    for (int r = 0; r < 4; r++) ata[r][r] += 1e-9 * (ata[r][r] > 0 ? ata[r][r] : 1.0);
    if (solve4(ata, atb, coef) != 0) {
        snprintf(err, err_len, "%s: run %lld: the steps do not determine a linear fit", db_path, (long long)run_id);
        goto done;
    }
    rc = n;
    goto done;
sqlerr:
    if (!ar_db_lock_error(db, db_path, NULL, err, err_len)) snprintf(err, err_len, "%s: %s", db_path, sqlite3_errmsg(db));
done:
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rc;
}
