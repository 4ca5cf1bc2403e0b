/* workload.c - workload importers for the simulator: Mooncake JSONL (512-token hash blocks),
 * Azure LLM 2023 CSV, the real vLLM runs' requests.jsonl, and synthetic workloads (Poisson or
 * gamma arrivals, SGLang-style generated shared prefixes).
 *
 * Every request gets the chained content keys of its full prompt blocks
 * (key_i = ar_chain_key(key_{i-1}, payload_i), key_-1 = AR_ROOT_KEY).  Payloads:
 *   Mooncake hash id h, page p inside its 512-token block: mix(h * 2^16 + p + MOONCAKE_SALT)
 *   synthetic system prompt of group g, page p:           mix((g + 1) * 2^32 + p + GROUP_SALT)
 *   anything else (no prefix information):                 mix((request + 1) * 2^32 + block
 *                                                           + UNIQUE_SALT), unique per request
 * so two requests share a block key exactly when their prefixes up to that block agree. */
#include "sim.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define MOONCAKE_BLOCK 512
#define MOONCAKE_SALT 0x4d4f4f4e00000000ull
#define GROUP_SALT 0x47525000000000ull
#define UNIQUE_SALT 0x554e495100000000ull
#define AR_WORKLOAD_MAX_TOKENS 100000000   /* per prompt or output; beyond it a row is bad */

static uint64_t unique_payload(int request_index, int block_index)
{
    return ar_mix64(((uint64_t)(request_index + 1) << 32) + (uint64_t)block_index + UNIQUE_SALT);
}

void ar_workload_init(ar_workload *wl, int block_size, const char *source)
{
    memset(wl, 0, sizeof *wl);
    wl->block_size = block_size;
    snprintf(wl->source, sizeof wl->source, "%s", source ? source : "memory");
}

void ar_workload_free(ar_workload *wl)
{
    free(wl->reqs);
    free(wl->keys);
    memset(wl, 0, sizeof *wl);
}

int ar_workload_push(ar_workload *wl, double arrival, int prompt_len, int output_len,
                     const uint64_t *payloads, int num_payloads, long line, char *err,
                     size_t err_len)
{
    if (prompt_len <= 0 || output_len <= 0 || wl->block_size <= 0) {
        snprintf(err, err_len, "request %d: prompt and output lengths must be positive (got %d, %d)",
                 wl->num_reqs, prompt_len, output_len);
        return -1;
    }
    if (wl->num_reqs == wl->cap_reqs) {
        int cap = wl->cap_reqs ? wl->cap_reqs * 2 : 256;
        ar_workload_req *r = realloc(wl->reqs, (size_t)cap * sizeof *r);
        if (!r) { snprintf(err, err_len, "out of memory"); return -1; }
        wl->reqs = r;
        wl->cap_reqs = cap;
    }
    int num_keys = prompt_len / wl->block_size;
    if (wl->num_keys_total + num_keys > wl->cap_keys) {
        int64_t cap = wl->cap_keys ? wl->cap_keys : 4096;
        while (cap < wl->num_keys_total + num_keys) cap *= 2;
        uint64_t *k = realloc(wl->keys, (size_t)cap * sizeof *k);
        if (!k) { snprintf(err, err_len, "out of memory"); return -1; }
        wl->keys = k;
        wl->cap_keys = cap;
    }
    ar_workload_req *r = &wl->reqs[wl->num_reqs];
    r->arrival = arrival;
    r->prompt_len = prompt_len;
    r->output_len = output_len;
    r->key_offset = wl->num_keys_total;
    r->num_keys = num_keys;
    r->line = line;
    r->real_ttft = r->real_tpot = -1;
    uint64_t key = AR_ROOT_KEY;
    for (int i = 0; i < num_keys; i++) {
        uint64_t payload = i < num_payloads ? payloads[i] : unique_payload(wl->num_reqs, i);
        key = ar_chain_key(key, payload);
        wl->keys[wl->num_keys_total + i] = key;
    }
    wl->num_keys_total += num_keys;
    wl->num_reqs++;
    return 0;
}

/* ---- helpers -------------------------------------------------------------------------------- */

/* Grows *buf to hold n payloads. */
static int reserve_payloads(uint64_t **buf, int *cap, int n)
{
    if (n <= *cap) return 0;
    int c = *cap ? *cap : 1024;
    while (c < n) c *= 2;
    uint64_t *p = realloc(*buf, (size_t)c * sizeof *p);
    if (!p) return -1;
    *buf = p;
    *cap = c;
    return 0;
}

static bool json_int(json_t *obj, const char *name, long long *out)
{
    json_t *v = json_object_get(obj, name);
    if (!v) return false;
    if (json_is_integer(v)) { *out = json_integer_value(v); return true; }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        /* outside long long the cast is undefined: such a row is bad, not huge */
        if (d != floor(d) || !(fabs(d) < 9.2e18)) return false;
        *out = (long long)d;
        return true;
    }
    return false;
}

static bool json_num(json_t *obj, const char *name, double *out)
{
    json_t *v = json_object_get(obj, name);
    if (!v || !json_is_number(v)) return false;
    *out = json_number_value(v);
    return isfinite(*out) != 0;
}

static bool blank_line(const char *s)
{
    for (; *s; s++)
        if (*s != ' ' && *s != '\t' && *s != '\r' && *s != '\n') return false;
    return true;
}

/* Opens a workload file for reading; NULL with "PATH: why" in err.  A directory is named as
 * such (fopen would open it and the first read fail). */
static FILE *open_input(const char *path, const char *want, char *err, size_t err_len)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(err, err_len, "%s: is a directory, not %s", path, want);
        return NULL;
    }
    FILE *f = fopen(path, "r");
    if (!f) snprintf(err, err_len, "%s: %s", path, strerror(errno));
    return f;
}

/* After a getline loop: 0, or 2 with "PATH: read error: ..." when the stream failed. */
static int read_error(FILE *f, const char *path, char *err, size_t err_len)
{
    if (!ferror(f)) return 0;
    snprintf(err, err_len, "%s: read error: %s", path, strerror(errno));
    return 2;
}

/* The message for a token count outside [1, AR_WORKLOAD_MAX_TOKENS]. */
static void bad_length(char *err, size_t err_len, const char *path, long lineno, const char *name, long long value)
{
    if (value <= 0)
        snprintf(err, err_len, "%s:%ld: %s must be positive (got %lld)", path, lineno, name, value);
    else
        snprintf(err, err_len, "%s:%ld: %s %lld exceeds the limit of %d tokens", path, lineno, name, value,
                 AR_WORKLOAD_MAX_TOKENS);
}

/* One JSON Lines row as an object; NULL with "FILE:LINE: ..." in err.  A key given twice is
 * refused (otherwise the last one would silently win), as the trace reader does. */
static json_t *parse_row(const char *line, const char *path, long lineno, char *err, size_t err_len)
{
    json_error_t jerr;
    json_t *o = json_loads(line, JSON_REJECT_DUPLICATES, &jerr);
    if (!o && strstr(jerr.text, "duplicate object key")) {
        snprintf(err, err_len, "%s:%ld: duplicate key in a JSON object (%s): a row gives each field once", path,
                 lineno, jerr.text);
        return NULL;
    }
    if (!o || !json_is_object(o)) {
        snprintf(err, err_len, "%s:%ld: malformed JSON (%s)", path, lineno, o ? "not an object" : jerr.text);
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ---- Mooncake --------------------------------------------------------------------------------- */

static int load_mooncake(const char *path, ar_workload *wl, char *err, size_t err_len)
{
    int B = wl->block_size;
    if (B <= 0 || MOONCAKE_BLOCK % B != 0) {
        snprintf(err, err_len, "%s: block size %d must divide Mooncake's 512-token hash block", path, B);
        return 2;
    }
    FILE *f = open_input(path, "a Mooncake JSONL file", err, err_len);
    if (!f) return 2;
    int pages = MOONCAKE_BLOCK / B;
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    uint64_t *payloads = NULL;
    int payload_cap = 0;
    double last_ts = -1;
    int rc = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        if (blank_line(line)) continue;
        json_t *o = parse_row(line, path, lineno, err, err_len);
        if (!o) {
            rc = 2;
            break;
        }
        long long in_len, out_len;
        double ts;
        json_t *hashes = json_object_get(o, "hash_ids");
        if (!json_num(o, "timestamp", &ts) || !json_int(o, "input_length", &in_len) ||
            !json_int(o, "output_length", &out_len) || !json_is_array(hashes)) {
            snprintf(err, err_len, "%s:%ld: row needs numeric timestamp, integer input_length and output_length, and a hash_ids array",
                     path, lineno);
            json_decref(o);
            rc = 2;
            break;
        }
        if (in_len <= 0 || in_len > AR_WORKLOAD_MAX_TOKENS || out_len <= 0 || out_len > AR_WORKLOAD_MAX_TOKENS) {
            if (in_len <= 0 || in_len > AR_WORKLOAD_MAX_TOKENS) bad_length(err, err_len, path, lineno, "input_length", in_len);
            else bad_length(err, err_len, path, lineno, "output_length", out_len);
            json_decref(o);
            rc = 2;
            break;
        }
        if (ts < 0) {   /* before the first check: -1 is the "no previous row" mark below */
            snprintf(err, err_len, "%s:%ld: timestamp %.3f is negative (Mooncake timestamps are milliseconds since "
                     "the trace's start)", path, lineno, ts);
            json_decref(o);
            rc = 2;
            break;
        }
        if (ts < last_ts) {
            snprintf(err, err_len, "%s:%ld: timestamp %.3f goes back in time (previous %.3f)", path, lineno, ts, last_ts);
            json_decref(o);
            rc = 2;
            break;
        }
        last_ts = ts;
        size_t nh = json_array_size(hashes);
        if ((long long)nh * MOONCAKE_BLOCK < in_len) {
            snprintf(err, err_len, "%s:%ld: %zu hash_ids cover fewer than input_length %lld tokens",
                     path, lineno, nh, in_len);
            json_decref(o);
            rc = 2;
            break;
        }
        int full = (int)(in_len / B);
        if (reserve_payloads(&payloads, &payload_cap, full) != 0) {
            snprintf(err, err_len, "out of memory");
            json_decref(o);
            rc = 2;
            break;
        }
        int bad = 0;
        for (int i = 0; i < full; i++) {
            json_t *h = json_array_get(hashes, (size_t)(i / pages));
            if (!json_is_integer(h) || json_integer_value(h) < 0) { bad = 1; break; }
            uint64_t hv = (uint64_t)json_integer_value(h);
            payloads[i] = ar_mix64((hv << 16) + (uint64_t)(i % pages) + MOONCAKE_SALT);
        }
        json_decref(o);
        if (bad) {
            snprintf(err, err_len, "%s:%ld: hash_ids must be non-negative integers", path, lineno);
            rc = 2;
            break;
        }
        if (ar_workload_push(wl, ts / 1000.0, (int)in_len, (int)out_len, payloads, full, lineno, err, err_len) != 0) {
            rc = 2;
            break;
        }
    }
    if (rc == 0) rc = read_error(f, path, err, err_len);
    free(line);
    free(payloads);
    fclose(f);
    return rc;
}

/* ---- Azure LLM 2023 CSV ------------------------------------------------------------------------ */

/* Days in month M (1..12) of year Y, leap years of the Gregorian calendar counted. */
static int days_in_month(int Y, int M)
{
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (Y % 4 == 0 && Y % 100 != 0) || Y % 400 == 0;
    return M == 2 && leap ? 29 : days[M - 1];
}

/* "YYYY-MM-DD HH:MM:SS[.fffffff]" -> seconds since the epoch (UTC); -1 when malformed, -2 when
 * before 1970 (the importer's "no previous row" marks are negative, and no Azure trace is), -3
 * when the day is past its month's end (2023-02-31: timegm would roll it over into March). */
static double parse_azure_time(const char *s, const char **end)
{
    int Y, M, D, h, m, sec, n = 0;
    if (sscanf(s, "%4d-%2d-%2d %2d:%2d:%2d%n", &Y, &M, &D, &h, &m, &sec, &n) != 6) return -1;
    if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 60 || h < 0 || m < 0 || sec < 0) return -1;
    if (Y < 1970) return -2;   /* timegm's -1 would also read 1969-12-31 23:59:59 as malformed */
    if (D > days_in_month(Y, M)) return -3;
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    tm.tm_year = Y - 1900;
    tm.tm_mon = M - 1;
    tm.tm_mday = D;
    tm.tm_hour = h;
    tm.tm_min = m;
    tm.tm_sec = sec;
    double t = (double)timegm(&tm);
    const char *p = s + n;
    if (*p == '.') {
        p++;
        double scale = 0.1;
        while (*p >= '0' && *p <= '9') {
            t += (*p - '0') * scale;
            scale *= 0.1;
            p++;
        }
    }
    *end = p;
    return t;
}

static int parse_int_field(const char *s, const char **end, long *out)
{
    char *e;
    errno = 0;
    long v = strtol(s, &e, 10);
    if (e == s || errno) return -1;
    *out = v;
    *end = e;
    return 0;
}

static int load_azure(const char *path, ar_workload *wl, char *err, size_t err_len)
{
    FILE *f = open_input(path, "an Azure LLM CSV file", err, err_len);
    if (!f) return 2;
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    double first = -1, last = -1;
    int rc = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        if (lineno == 1) {
            if (strncmp(line, "TIMESTAMP,ContextTokens,GeneratedTokens", 39) != 0) {
                snprintf(err, err_len, "%s:1: expected the header TIMESTAMP,ContextTokens,GeneratedTokens", path);
                rc = 2;
                break;
            }
            continue;
        }
        if (blank_line(line)) continue;
        const char *p;
        double t = parse_azure_time(line, &p);
        long ctx, gen;
        if (t == -2) {
            snprintf(err, err_len, "%s:%ld: timestamp %.*s is before 1970-01-01 00:00:00 UTC", path, lineno,
                     (int)strcspn(line, ",\r\n"), line);
            rc = 2;
            break;
        }
        if (t == -3) {
            int Y, M;
            sscanf(line, "%4d-%2d", &Y, &M);
            snprintf(err, err_len, "%s:%ld: timestamp %.*s is not a date (month %02d of %d has %d days)", path, lineno,
                     (int)strcspn(line, ",\r\n"), line, M, Y, days_in_month(Y, M));
            rc = 2;
            break;
        }
        if (t < 0 || *p != ',' || parse_int_field(p + 1, &p, &ctx) != 0 || *p != ',' ||
            parse_int_field(p + 1, &p, &gen) != 0 || !blank_line(p)) {
            snprintf(err, err_len, "%s:%ld: malformed row (want YYYY-MM-DD HH:MM:SS.fffffff,ContextTokens,GeneratedTokens)",
                     path, lineno);
            rc = 2;
            break;
        }
        if (ctx <= 0 || ctx > AR_WORKLOAD_MAX_TOKENS || gen <= 0 || gen > AR_WORKLOAD_MAX_TOKENS) {
            if (ctx <= 0 || ctx > AR_WORKLOAD_MAX_TOKENS) bad_length(err, err_len, path, lineno, "ContextTokens", ctx);
            else bad_length(err, err_len, path, lineno, "GeneratedTokens", gen);
            rc = 2;
            break;
        }
        if (first < 0) first = t;
        if (t < last) {
            snprintf(err, err_len, "%s:%ld: timestamp goes back in time", path, lineno);
            rc = 2;
            break;
        }
        last = t;
        if (ar_workload_push(wl, t - first, (int)ctx, (int)gen, NULL, 0, lineno, err, err_len) != 0) {
            rc = 2;
            break;
        }
    }
    if (rc == 0) rc = read_error(f, path, err, err_len);
    if (rc == 0 && lineno == 0) {
        snprintf(err, err_len, "%s:1: empty file", path);
        rc = 2;
    }
    free(line);
    fclose(f);
    return rc;
}

/* ---- real vLLM runs (requests.jsonl) ------------------------------------------------------------ */

/* Arrival = queued_ts (the engine clock, what engine TTFT is measured from) when present,
 * else arrival_time (client clock). */
static int load_vllm_run(const char *path_in, ar_workload *wl, char *err, size_t err_len)
{
    char path[4096];
    struct stat st;
    if (stat(path_in, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(path, sizeof path, "%s/requests.jsonl", path_in);
    else
        snprintf(path, sizeof path, "%s", path_in);
    FILE *f = open_input(path, "a vLLM run's requests.jsonl", err, err_len);
    if (!f) return 2;
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    double last = -1;
    int rc = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        if (blank_line(line)) continue;
        json_t *o = parse_row(line, path, lineno, err, err_len);
        if (!o) {
            rc = 2;
            break;
        }
        long long in_len, out_len;
        double t, first_token = 0, last_token = 0;
        const bool queued = json_num(o, "queued_ts", &t);
        bool have_t = queued || json_num(o, "arrival_time", &t);
        bool have_real = json_num(o, "queued_ts", &t) && json_num(o, "first_token_ts", &first_token) &&
                         json_num(o, "last_token_ts", &last_token);
        if (!have_t || !json_int(o, "input_toks", &in_len) || !json_int(o, "output_toks", &out_len)) {
            snprintf(err, err_len, "%s:%ld: row needs queued_ts or arrival_time, and integer input_toks and output_toks",
                     path, lineno);
            json_decref(o);
            rc = 2;
            break;
        }
        json_decref(o);
        if (in_len <= 0 || in_len > AR_WORKLOAD_MAX_TOKENS || out_len <= 0 || out_len > AR_WORKLOAD_MAX_TOKENS) {
            if (in_len <= 0 || in_len > AR_WORKLOAD_MAX_TOKENS) bad_length(err, err_len, path, lineno, "input_toks", in_len);
            else bad_length(err, err_len, path, lineno, "output_toks", out_len);
            rc = 2;
            break;
        }
        if (t < 0) {   /* before the first check: -1 is the "no previous row" mark below */
            snprintf(err, err_len, "%s:%ld: %s %.6f is negative (vLLM stamps a request with its clock's seconds)",
                     path, lineno, queued ? "queued_ts" : "arrival_time", t);
            rc = 2;
            break;
        }
        if (t < last) {
            snprintf(err, err_len, "%s:%ld: timestamp goes back in time", path, lineno);
            rc = 2;
            break;
        }
        if (have_real && !(first_token >= t)) {   /* else the comparison with the engine drops it unsaid */
            snprintf(err, err_len, "%s:%ld: first_token_ts %.6f is before queued_ts %.6f (the engine's TTFT "
                     "cannot be negative)", path, lineno, first_token, t);
            rc = 2;
            break;
        }
        if (have_real && !(last_token >= first_token && isfinite(last_token - first_token))) {
            snprintf(err, err_len, "%s:%ld: last_token_ts %.6f is before first_token_ts %.6f, or too far after it "
                     "(the engine's TPOT must be a non-negative number)", path, lineno, last_token, first_token);
            rc = 2;
            break;
        }
        last = t;
        if (ar_workload_push(wl, t, (int)in_len, (int)out_len, NULL, 0, lineno, err, err_len) != 0) {
            rc = 2;
            break;
        }
        if (have_real) {   /* engine TTFT = first_token_ts - queued_ts; TPOT over the later tokens */
            ar_workload_req *r = &wl->reqs[wl->num_reqs - 1];
            r->real_ttft = first_token - t;
            if (out_len > 1) r->real_tpot = (last_token - first_token) / (double)(out_len - 1);
        }
    }
    if (rc == 0) rc = read_error(f, path, err, err_len);
    free(line);
    fclose(f);
    return rc;
}

/* ---- synthetic ------------------------------------------------------------------------------ */

/* xorshift-style generator on SplitMix64: state advances by the golden gamma. */
static double uniform01(uint64_t *state)
{
    *state += AR_GEN_GOLDEN;
    return ((double)(ar_mix64(*state) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static double normal01(uint64_t *state)
{
    double u1 = uniform01(state), u2 = uniform01(state);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Gamma(shape k, scale 1), Marsaglia-Tsang (with the k < 1 boost). */
static double gamma_sample(uint64_t *state, double k)
{
    if (k < 1.0) return gamma_sample(state, k + 1.0) * pow(uniform01(state), 1.0 / k);
    double d = k - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = normal01(state), v = 1.0 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        double u = uniform01(state);
        if (log(u) < 0.5 * x * x + d - d * v + d * log(v)) return d * v;
    }
}

int ar_workload_synthetic(const char *spec, int block_size, ar_workload *wl, char *err, size_t err_len)
{
    long groups = 0, prompts = 0, system = 0, question = 0, output = -1, n = 0, input = 0;
    double rate = 10.0, cv = 2.0;
    uint64_t seed = 1;
    bool gamma = false, plain_form = false, group_form = false;
    ar_workload_init(wl, block_size, "synthetic");   /* first: every early return leaves it freeable */
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) { snprintf(err, err_len, "synthetic spec: '%s' is not key=value", tok); return 2; }
        *eq = 0;
        const char *k = tok, *v = eq + 1;
        char *end;
        if (strcmp(k, "arrival") == 0) {
            if (strcmp(v, "poisson") == 0) gamma = false;
            else if (strcmp(v, "gamma") == 0) gamma = true;
            else { snprintf(err, err_len, "synthetic spec: arrival must be poisson or gamma"); return 2; }
            continue;
        }
        if (strcmp(k, "seed") == 0) {
            /* decimal digits, read exactly: through a double, seeds above 2^53 would round to
             * another seed, and "0x10" or "1e3" would be taken as hex or as an exponent */
            errno = 0;
            unsigned long long value = strtoull(v, &end, 10);
            if (v[0] < '0' || v[0] > '9' || *end || errno) {
                snprintf(err, err_len, "synthetic spec: seed=%s must be a non-negative decimal integer below 2^64", v);
                return 2;
            }
            seed = (uint64_t)value;
            continue;
        }
        double d = strtod(v, &end);
        if (end == v || *end || !isfinite(d)) {
            snprintf(err, err_len, "synthetic spec: %s=%s is not a number", k, v);
            return 2;
        }
        if (strcmp(k, "rate") == 0) rate = d;
        else if (strcmp(k, "cv") == 0) cv = d;
        else {
            long *target = strcmp(k, "groups") == 0 ? &groups : strcmp(k, "prompts") == 0 ? &prompts
                         : strcmp(k, "system") == 0 ? &system : strcmp(k, "question") == 0 ? &question
                         : strcmp(k, "output") == 0 ? &output : strcmp(k, "n") == 0 ? &n
                         : strcmp(k, "input") == 0 ? &input : NULL;
            if (!target) { snprintf(err, err_len, "synthetic spec: unknown key '%s'", k); return 2; }
            if (d != floor(d) || d < 0) {
                snprintf(err, err_len, "synthetic spec: %s=%s must be a non-negative integer", k, v);
                return 2;
            }
            if (d > AR_WORKLOAD_MAX_TOKENS) {
                snprintf(err, err_len, "synthetic spec: %s=%s exceeds the limit of %d", k, v, AR_WORKLOAD_MAX_TOKENS);
                return 2;
            }
            *target = (long)d;
            if (target == &n || target == &input) plain_form = true;
            if (target == &groups || target == &prompts || target == &system || target == &question) group_form = true;
        }
    }
    if (plain_form && group_form) {
        snprintf(err, err_len, "synthetic spec: give either groups=,prompts=,system=,question=,output= or "
                 "n=,input=,output=, not keys of both forms");
        return 2;
    }
    if (rate <= 0 || cv <= 0) { snprintf(err, err_len, "synthetic spec: rate and cv must be positive"); return 2; }
    bool grouped = group_form;
    if (grouped) {
        if (groups <= 0 || prompts <= 0 || system + question <= 0 || output <= 0) {
            snprintf(err, err_len, "synthetic spec: groups, prompts, output must be positive and system+question > 0");
            return 2;
        }
        if (groups * prompts > 10000000) {
            snprintf(err, err_len, "synthetic spec: groups x prompts = %ld requests exceeds the limit of 10000000",
                     groups * prompts);
            return 2;
        }
        n = groups * prompts;
    } else if (n <= 0 || input <= 0 || output <= 0) {
        snprintf(err, err_len, "synthetic spec: need groups=,prompts=,system=,question=,output= or n=,input=,output= (all positive)");
        return 2;
    }
    int *order = malloc((size_t)n * sizeof *order);
    long prompt_len = grouped ? system + question : input;
    int full = (int)(prompt_len / block_size);
    uint64_t *payloads = malloc((size_t)(full + 1) * sizeof *payloads);
    if (!order || !payloads) {
        free(order);
        free(payloads);
        snprintf(err, err_len, "out of memory");
        return 2;
    }
    uint64_t state = ar_mix64(seed);
    for (long i = 0; i < n; i++) order[i] = (int)i;
    if (grouped)   /* Fisher-Yates: the groups' prompts arrive interleaved */
        for (long i = n - 1; i > 0; i--) {
            long j = (long)(uniform01(&state) * (double)(i + 1));
            if (j > i) j = i;
            int t = order[i]; order[i] = order[j]; order[j] = t;
        }
    double t = 0;
    int rc = 0;
    for (long i = 0; i < n && rc == 0; i++) {
        int num_payloads = 0;
        if (grouped) {
            long group = order[i] / prompts;
            num_payloads = (int)(system / block_size);   /* full blocks inside the system prompt */
            for (int p = 0; p < num_payloads; p++)
                payloads[p] = ar_mix64(((uint64_t)(group + 1) << 32) + (uint64_t)p + GROUP_SALT);
        }
        if (ar_workload_push(wl, t, (int)prompt_len, (int)output, payloads, num_payloads, 0, err, err_len) != 0)
            rc = 2;
        double gap = gamma ? gamma_sample(&state, 1.0 / (cv * cv)) * (cv * cv) / rate
                           : -log(uniform01(&state)) / rate;
        t += gap;
    }
    free(order);
    free(payloads);
    return rc;
}

/* ---- dispatch ----------------------------------------------------------------------------------- */

int ar_workload_load(const char *spec, int block_size, double time_scale, int limit,
                     ar_workload *wl, char *err, size_t err_len)
{
    const char *colon = strchr(spec, ':');
    if (!colon) {
        snprintf(err, err_len, "--workload %s: want KIND:ARG with KIND mooncake, azure, vllm-run or synthetic", spec);
        return 2;
    }
    if (block_size <= 0) { snprintf(err, err_len, "block size must be positive"); return 2; }
    if (!(time_scale > 0) || !isfinite(time_scale)) { snprintf(err, err_len, "--time-scale must be positive"); return 2; }
    size_t kind_len = (size_t)(colon - spec);
    const char *arg = colon + 1;
    int rc;
    if (kind_len == 8 && strncmp(spec, "mooncake", 8) == 0) {
        ar_workload_init(wl, block_size, "mooncake");
        rc = load_mooncake(arg, wl, err, err_len);
    } else if (kind_len == 5 && strncmp(spec, "azure", 5) == 0) {
        ar_workload_init(wl, block_size, "azure");
        rc = load_azure(arg, wl, err, err_len);
    } else if (kind_len == 8 && strncmp(spec, "vllm-run", 8) == 0) {
        ar_workload_init(wl, block_size, "vllm-run");
        rc = load_vllm_run(arg, wl, err, err_len);
    } else if (kind_len == 9 && strncmp(spec, "synthetic", 9) == 0) {
        rc = ar_workload_synthetic(arg, block_size, wl, err, err_len);
    } else {
        snprintf(err, err_len, "--workload %s: unknown kind (mooncake, azure, vllm-run, synthetic)", spec);
        return 2;
    }
    if (rc != 0) {
        ar_workload_free(wl);
        return rc;
    }
    if (strcmp(wl->source, "synthetic") != 0) snprintf(wl->path, sizeof wl->path, "%s", arg);
    if (wl->num_reqs == 0) {
        snprintf(err, err_len, "%s: no requests", arg);
        ar_workload_free(wl);
        return 2;
    }
    if (limit > 0 && limit < wl->num_reqs) {
        wl->num_reqs = limit;
        wl->num_keys_total = wl->reqs[limit - 1].key_offset + wl->reqs[limit - 1].num_keys;
    }
    double t0 = wl->reqs[0].arrival;
    for (int i = 0; i < wl->num_reqs; i++) {
        double a = (wl->reqs[i].arrival - t0) * time_scale;
        if (!isfinite(a)) {   /* a trace's times must be finite numbers (JSON has no inf) */
            if (wl->reqs[i].line > 0)
                snprintf(err, err_len, "%s:%ld: arrival %.17g s after the first request, times --time-scale %g, is not a "
                         "finite number of seconds", arg, wl->reqs[i].line, wl->reqs[i].arrival - t0, time_scale);
            else
                snprintf(err, err_len, "%s: arrival of request %d, times --time-scale %g, is not a finite number of "
                         "seconds (rate too small?)", spec, i, time_scale);
            ar_workload_free(wl);
            return 2;
        }
        if (a > AR_SIM_MAX_CLOCK_S) {   /* whole microseconds stop being exact past 2^53 us */
            if (wl->reqs[i].line > 0)
                snprintf(err, err_len, "%s:%ld: arrival %.17g s after the first request, times --time-scale %g, is "
                         "beyond the simulated clock's range (2^53 us, about 285 years)", arg, wl->reqs[i].line,
                         wl->reqs[i].arrival - t0, time_scale);
            else
                snprintf(err, err_len, "%s: arrival of request %d, times --time-scale %g, is beyond the simulated "
                         "clock's range (2^53 us, about 285 years; rate too small?)", spec, i, time_scale);
            ar_workload_free(wl);
            return 2;
        }
        wl->reqs[i].arrival = a;
    }
    return 0;
}
