/* steptime.c - how long one engine step takes, as a function of the batch.
 *
 * constant:S   every step takes S seconds.
 * linear:A,B,C,D   A + B * tokens + C * requests + D * (sum of seq_len) seconds.
 * roofline:DEVICE[,gemm_eff=..,attn_eff=..,bw_eff=..,overhead=..,per_req=..]
 *   t = max(GEMM FLOPs / (peak * gemm_eff), weight bytes / (bw * bw_eff))
 *     + max(attention FLOPs / (peak * attn_eff), KV bytes / (bw * bw_eff))
 *     + overhead + per_req * requests
 *   GEMM FLOPs  = 2 * active parameters per token * tokens (every layer's projections and MLP)
 *               + 2 * hidden * vocab * requests (LM head on the sampled positions only)
 *   weight bytes = all weights once per step (MoE: only the experts the batch is expected to
 *               touch, 1 - (1 - k/E)^tokens of them)
 *   attention FLOPs = 2 * layers * q_heads * (qk_dim + v_dim) * query-key pairs
 *               (MHA: qk = v = head_size; MLA absorbed form: 576 + 512)
 *   KV bytes    = layers * (sum of seq_len + tokens written) * KV bytes per token per layer
 * tp=N spreads FLOPs and bytes over N devices with ideal scaling (no communication cost).
 * fitted:DB[,run=ID][,device=DEV][,same keys as roofline]
 *   the roofline's GEMM term, overhead and per_req, plus an attention term fitted by least
 *   squares to a replay database: a + b * tokens + c * requests + d * (sum of seq_len), from the
 *   steps' measured attention time (time_us, summed over the replayed layers), scaled from the
 *   run's replayed layers to all of the model's layers.
 * Defaults: gemm_eff 0.7, attn_eff 0.5, bw_eff 0.8, overhead 3 ms, per_req 0, tp 1. */
#include "sim.h"

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
    if (strcmp(buf, "roofline") == 0 || strcmp(buf, "fitted") == 0) {
        bool fitted = strcmp(buf, "fitted") == 0;
        st->kind = fitted ? AR_STEPTIME_FITTED : AR_STEPTIME_ROOFLINE;
        st->preset = preset;
        st->gemm_efficiency = 0.7;
        st->attn_efficiency = 0.5;
        st->bw_efficiency = 0.8;
        st->overhead_s = 0.003;
        st->tensor_parallel = 1;
        st->weight_dtype = AR_BF16;
        st->kv_dtype = AR_BF16;
        if (!preset) {
            snprintf(err, err_len, "--step-time roofline needs a --model preset");
            return 2;
        }
        char *save = NULL, *db_path = NULL;
        double run_id = 0;
        int i = 0;
        if (fitted) st->device = *ar_device_find("h200");
        for (char *tok = strtok_r(args, ",", &save); tok; tok = strtok_r(NULL, ",", &save), i++) {
            if (i == 0 || strncmp(tok, "device=", 7) == 0) {
                if (i == 0 && fitted) { db_path = tok; continue; }
                const char *name = strncmp(tok, "device=", 7) == 0 ? tok + 7 : tok;
                const ar_device_spec *d = ar_device_find(name);
                if (!d) {
                    snprintf(err, err_len, "--step-time %s: unknown device '%s' (%s)", buf, name, ar_device_names());
                    return 2;
                }
                st->device = *d;
                continue;
            }
            char *eq = strchr(tok, '=');
            double v;
            if (fitted && eq && strncmp(tok, "run=", 4) == 0 && parse_double(eq + 1, &v) == 0 && v >= 0) {
                run_id = v;
                continue;
            }
            if (!eq || parse_double(eq + 1, &v) != 0 || v < 0) {
                snprintf(err, err_len, "--step-time roofline: '%s' is not KEY=non-negative number", tok);
                return 2;
            }
            *eq = 0;
            if (strcmp(tok, "gemm_eff") == 0) st->gemm_efficiency = v;
            else if (strcmp(tok, "attn_eff") == 0) st->attn_efficiency = v;
            else if (strcmp(tok, "bw_eff") == 0) st->bw_efficiency = v;
            else if (strcmp(tok, "overhead") == 0) st->overhead_s = v;
            else if (strcmp(tok, "per_req") == 0) st->per_req_overhead_s = v;
            else if (strcmp(tok, "tp") == 0 && v >= 1 && v <= 1024 && v == floor(v)) st->tensor_parallel = (int)v;
            else {
                snprintf(err, err_len, "--step-time roofline: unknown key or bad value '%s' (gemm_eff, attn_eff, bw_eff, overhead, per_req, tp)", tok);
                return 2;
            }
        }
        if (i == 0) {
            snprintf(err, err_len, fitted ? "--step-time fitted:DB needs a replay database"
                                          : "--step-time roofline:DEVICE needs a device (%s)", ar_device_names());
            return 2;
        }
        if (fitted) {
            int n = ar_steptime_fit_db(db_path, (int64_t)run_id, preset->model.num_layers, st->fit_coef, err, err_len);
            if (n < 0) return 2;
            st->fit_steps = n;
        }
        if (st->gemm_efficiency <= 0 || st->attn_efficiency <= 0 || st->bw_efficiency <= 0 ||
            st->gemm_efficiency > 1 || st->attn_efficiency > 1 || st->bw_efficiency > 1) {
            snprintf(err, err_len, "--step-time roofline: efficiencies must be in (0, 1]");
            return 2;
        }
        return 0;
    }
    snprintf(err, err_len, "--step-time %s: want constant:S, linear:A,B,C,D or roofline:DEVICE[,...]", spec);
    return 2;
}

static double roofline(const ar_steptime *st, const ar_batch_features *f)
{
    const ar_model_preset *p = st->preset;
    const ar_model *m = &p->model;
    int tp = st->tensor_parallel > 0 ? st->tensor_parallel : 1;   /* ideal: no communication cost */
    double peak = st->device.peak_flops * tp, bw = st->device.mem_bw * st->bw_efficiency * tp;
    double wbytes = ar_dtype_size(st->weight_dtype);
    double head = (double)p->hidden * p->vocab;
    double gemm_flops = 2.0 * ar_preset_active_params(p) * f->num_tokens + 2.0 * head * f->num_reqs;
    double weights = ar_preset_total_params(p);
    if (p->num_experts > 0) {
        double all_experts = 3.0 * p->hidden * p->moe_intermediate * p->num_experts *
                             (m->num_layers - p->first_dense_layers);
        double touched = 1.0 - pow(1.0 - (double)p->active_experts / p->num_experts, f->num_tokens);
        weights -= all_experts * (1.0 - touched);
    }
    weights -= head;   /* the embedding table is gathered, not streamed */
    double t_gemm = fmax(gemm_flops / (peak * st->gemm_efficiency), weights * wbytes / bw);
    double qk_v = m->attention == AR_ATTN_MLA ? (double)(m->kv_lora_rank + m->qk_rope_head_dim) + m->kv_lora_rank
                                              : 2.0 * m->head_size;
    double kv_token_layer = m->attention == AR_ATTN_MLA ? (double)(m->kv_lora_rank + m->qk_rope_head_dim)
                                                        : 2.0 * m->num_kv_heads * m->head_size;
    kv_token_layer *= ar_dtype_size(st->kv_dtype);
    double attn_flops = 2.0 * m->num_layers * m->num_q_heads * qk_v * f->attn_pairs;
    double attn_bytes = (double)m->num_layers * ((double)f->kv_tokens_read + f->num_tokens) * kv_token_layer;
    double t_attn = fmax(attn_flops / (peak * st->attn_efficiency), attn_bytes / bw);
    if (st->kind == AR_STEPTIME_FITTED)
        t_attn = fmax(0.0, (st->fit_coef[0] + st->fit_coef[1] * f->num_tokens + st->fit_coef[2] * f->num_reqs +
                            st->fit_coef[3] * (double)f->kv_tokens_read) / tp);
    return t_gemm + t_attn + st->overhead_s + st->per_req_overhead_s * f->num_reqs;
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
        return roofline(st, f);
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
    sqlite3_stmt *st = NULL;
    int rc = -1;
    int layers = 0;
    const char *pick = run_id > 0
        ? "SELECT id, layers FROM runs WHERE id = ?1"
        : "SELECT id, layers FROM runs WHERE EXISTS (SELECT 1 FROM steps WHERE steps.run = runs.id AND time_us > 0)"
          " ORDER BY id DESC LIMIT 1";
    if (sqlite3_prepare_v2(db, pick, -1, &st, NULL) != SQLITE_OK) goto sqlerr;
    if (run_id > 0) sqlite3_bind_int64(st, 1, run_id);
    if (sqlite3_step(st) != SQLITE_ROW) {
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
    snprintf(err, err_len, "%s: %s", db_path, sqlite3_errmsg(db));
done:
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rc;
}
