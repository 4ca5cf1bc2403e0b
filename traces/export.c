/* export.c - `attnreplay export`: a trace's steps as FlashInfer-Trace definitions, workloads and
 * safetensors blobs (export.h says what goes where).
 *
 * The mapping, per step (the same batch the replay builds): request r of the step has q_len new
 * tokens and seq_len = context + q_len keys; its pages are the first ceil(seq_len / B) blocks of
 * its block list, in order.  qo_indptr is the running sum of q_len (vLLM's query_start_loc),
 * kv_indptr the running sum of page counts, kv_indices the pages, kv_last_page_len
 * seq_len - (pages - 1) * B.  FlashInfer's paged attention with these is ours: the new tokens
 * are in the cache before attention, causal is bottom-right aligned.  Float inputs become
 * "random" (FlashInfer-Bench draws them), so a workload keeps the batch's exact structure but
 * not our generated values; sm_scale is the model's.  The null block 0 never appears. */
#include "export.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../reference/datagen.h"
#include "trace.h"

/* ---- safetensors -------------------------------------------------------------------------- */

int ar_safetensors_write_i32(const char *path, const ar_st_tensor *t, int n, const char *const *meta_kv,
                             int n_meta, char *err, size_t err_len)
{
    json_t *h = json_object();
    int64_t offset = 0;
    for (int i = 0; i < n; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string("I32"));
        json_object_set_new(e, "shape", json_pack("[I]", (json_int_t)t[i].len));
        json_object_set_new(e, "data_offsets", json_pack("[I,I]", (json_int_t)offset,
                                                         (json_int_t)(offset + 4 * t[i].len)));
        json_object_set_new(h, t[i].name, e);
        offset += 4 * t[i].len;
    }
    if (n_meta > 0) {
        json_t *m = json_object();
        for (int i = 0; i < n_meta; i++) json_object_set_new(m, meta_kv[2 * i], json_string(meta_kv[2 * i + 1]));
        json_object_set_new(h, "__metadata__", m);
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(h);
    if (!text) {
        snprintf(err, err_len, "%s: out of memory", path);
        return -1;
    }
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, err_len, "%s: cannot create: %s", path, strerror(errno));
        free(text);
        return -1;
    }
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    bool ok = fwrite(le, 1, 8, f) == 8 && fwrite(text, 1, len, f) == len;
    for (size_t i = len; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    for (int i = 0; ok && i < n; i++) {
        for (int64_t j = 0; ok && j < t[i].len; j++) {
            uint32_t v = (uint32_t)t[i].data[j];
            unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                                  (unsigned char)(v >> 24)};
            ok = fwrite(b, 1, 4, f) == 4;
        }
    }
    free(text);
    if (fclose(f) != 0) ok = false;
    if (!ok) {
        snprintf(err, err_len, "%s: write failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------ */

static int mkdirs(const char *path, char *err, size_t err_len)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) goto fail;
        *p = '/';
    }
    if (mkdir(buf, 0777) != 0 && errno != EEXIST) goto fail;
    return 0;
fail:
    snprintf(err, err_len, "%.900s: cannot create directory: %s", buf, strerror(errno));
    return -1;
}

/* What is in DIR before an export: 0 nothing (missing or empty), 1 an earlier export of ours
 * (*previous: its attnreplay-export.json), -1 anything else, with err set.  An earlier export's
 * names are checked (no '/', our prefix), since they become paths to remove. */
static int out_dir_state(const char *out, json_t **previous, char *err, size_t err_len)
{
    *previous = NULL;
    struct stat sb;
    if (stat(out, &sb) != 0) return 0;
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(err, err_len, "%.900s: not a directory", out);
        return -1;
    }
    DIR *d = opendir(out);
    if (!d) {
        snprintf(err, err_len, "%.900s: cannot read the directory: %s", out, strerror(errno));
        return -1;
    }
    int entries = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        entries += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    if (entries == 0) return 0;
    char path[4200];
    snprintf(path, sizeof path, "%s/attnreplay-export.json", out);
    json_t *prov = json_load_file(path, 0, NULL);
    json_t *w = prov ? json_object_get(prov, "workloads") : NULL;
    const char *format = prov ? json_string_value(json_object_get(prov, "format")) : NULL;
    bool ok = format && strcmp(format, "attnreplay-export") == 0 && json_is_array(w);
    for (size_t i = 0; ok && i < json_array_size(w); i++) {
        const char *def = json_string_value(json_object_get(json_array_get(w, i), "definition"));
        const char *uuid = json_string_value(json_object_get(json_array_get(w, i), "uuid"));
        ok = def && uuid && strncmp(def, "gqa_paged_", 10) == 0 && !strchr(def, '/') && !strchr(uuid, '/') &&
             strlen(def) < 128 && strlen(uuid) < 64;
    }
    if (!ok) {
        snprintf(err, err_len, "%.800s: the directory is not empty and holds no earlier export of attnreplay "
                 "(attnreplay-export.json); give an empty or new directory", out);
        json_decref(prov);
        return -1;
    }
    *previous = prov;
    return 1;
}

/* Removes the files an earlier export lists (attnreplay-export.json, each definition, workload
 * file and blob) and then the directories it made, where they are left empty; other files stay. */
static int remove_previous(const char *out, json_t *prev, char *err, size_t err_len)
{
    json_t *w = json_object_get(prev, "workloads");
    char path[4600];
    snprintf(path, sizeof path, "%s/attnreplay-export.json", out);
    int rc = unlink(path) != 0 && errno != ENOENT ? -1 : 0;
    for (size_t i = 0; rc == 0 && i < json_array_size(w); i++) {
        const char *def = json_string_value(json_object_get(json_array_get(w, i), "definition"));
        const char *uuid = json_string_value(json_object_get(json_array_get(w, i), "uuid"));
        for (int f = 0; rc == 0 && f < 3; f++) {
            if (f == 0) snprintf(path, sizeof path, "%s/blob/workloads/gqa_paged/%s/%s_%s.safetensors", out, def, def, uuid);
            else if (f == 1) snprintf(path, sizeof path, "%s/definitions/gqa_paged/%s.json", out, def);
            else snprintf(path, sizeof path, "%s/workloads/gqa_paged/%s.jsonl", out, def);
            if (unlink(path) != 0 && errno != ENOENT) rc = -1;
        }
        snprintf(path, sizeof path, "%s/blob/workloads/gqa_paged/%s", out, def);
        rmdir(path);
    }
    if (rc != 0) {
        snprintf(err, err_len, "%.900s: cannot remove the earlier export's file: %s", path, strerror(errno));
        return -1;
    }
    const char *dirs[] = {"blob/workloads/gqa_paged", "blob/workloads", "blob", "workloads/gqa_paged", "workloads",
                          "definitions/gqa_paged", "definitions"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", out, dirs[i]);
        rmdir(path);   /* only when empty */
    }
    return 0;
}

/* A UUID-shaped id, a pure function of the trace hash and the step (re-exports give the same). */
static void step_uuid(const char *hash, int64_t step, char out[37])
{
    uint64_t h = strtoull(hash, NULL, 16);
    uint64_t a = ar_mix64(h ^ (uint64_t)step), b = ar_mix64(a + AR_GEN_GOLDEN);
    snprintf(out, 37, "%08x-%04x-8%03x-%04x-%012llx", (unsigned)(a >> 32), (unsigned)(a >> 16) & 0xffffu,
             (unsigned)a & 0xfffu, (unsigned)((b >> 48) & 0x3fffu) | 0x8000u,
             (unsigned long long)(b & 0xffffffffffffull));
}

static const char *fit_dtype(ar_dtype t)
{
    switch (t) {
    case AR_FP16: return "float16";
    case AR_BF16: return "bfloat16";
    case AR_FP8_E4M3: return "float8_e4m3fn";
    default: return "float32";
    }
}

static const char reference_src[] =
    "import math\n"
    "import torch\n"
    "\n"
    "\n"
    "def run(q, k_cache, v_cache, %sKV_INDPTR, kv_indices, kv_last_page_len, sm_scale):\n"
    "    total_q, num_qo_heads, head_dim = q.shape\n"
    "    page_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]\n"
    "    group = num_qo_heads // num_kv_heads\n"
    "    batch = kv_indptr.shape[0] - 1\n"
    "%s"
    "    output = torch.zeros_like(q)\n"
    "    lse = torch.full((total_q, num_qo_heads), -math.inf, dtype=torch.float32, device=q.device)\n"
    "    for b in range(batch):\n"
    "        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])\n"
    "        pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])].long()\n"
    "        kv_len = (pages.shape[0] - 1) * page_size + int(kv_last_page_len[b])\n"
    "        k = k_cache[pages].reshape(-1, num_kv_heads, head_dim)[:kv_len].float().repeat_interleave(group, 1)\n"
    "        v = v_cache[pages].reshape(-1, num_kv_heads, head_dim)[:kv_len].float().repeat_interleave(group, 1)\n"
    "        n = q1 - q0\n"
    "        s = torch.einsum(\"qhd,khd->hqk\", q[q0:q1].float(), k) * sm_scale\n"
    "        qpos = kv_len - n + torch.arange(n, device=q.device)[:, None]\n"
    "        kpos = torch.arange(kv_len, device=q.device)[None, :]\n"
    "        s = s.masked_fill((kpos > qpos)[None], -math.inf)  # causal, bottom-right aligned\n"
    "        output[q0:q1] = torch.einsum(\"hqk,khd->qhd\", torch.softmax(s, -1), v).to(q.dtype)\n"
    "        lse[q0:q1] = (torch.logsumexp(s, -1) / math.log(2.0)).transpose(0, 1)  # base 2\n"
    "    return output, lse\n";

static json_t *tensor_spec(const char *const *axes, int n, const char *dtype, const char *desc)
{
    json_t *shape = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(shape, json_string(axes[i]));
    json_t *t = json_pack("{s:o,s:s}", "shape", n ? shape : (json_decref(shape), json_null()), "dtype", dtype);
    if (desc) json_object_set_new(t, "description", json_string(desc));
    return t;
}

static json_t *definition_json(const ar_trace_header *h, bool decode, const char *name, const char *hash)
{
    const ar_model *m = &h->model;
    const char *dt = fit_dtype(h->cache.dtype), *kvt = fit_dtype(h->cache.kv_cache_dtype);
    json_t *axes = json_pack("{s:{s:s,s:i},s:{s:s,s:i},s:{s:s,s:i},s:{s:s,s:i},s:{s:s},s:{s:s},s:{s:s},s:{s:s}}",
                             "num_qo_heads", "type", "const", "value", m->num_q_heads,
                             "num_kv_heads", "type", "const", "value", m->num_kv_heads,
                             "head_dim", "type", "const", "value", m->head_size,
                             "page_size", "type", "const", "value", h->cache.block_size,
                             "total_q", "type", "var", "num_pages", "type", "var",
                             "len_indptr", "type", "var", "num_kv_indices", "type", "var");
    const char *q_axes[] = {"total_q", "num_qo_heads", "head_dim"};
    const char *cache_axes[] = {"num_pages", "page_size", "num_kv_heads", "head_dim"};
    const char *indptr[] = {"len_indptr"}, *indices[] = {"num_kv_indices"}, *batch[] = {"batch_size"};
    json_object_set_new(axes, "batch_size", json_pack("{s:s}", "type", "var"));
    json_t *inputs = json_object();
    json_object_set_new(inputs, "q", tensor_spec(q_axes, 3, dt, NULL));
    json_object_set_new(inputs, "k_cache", tensor_spec(cache_axes, 4, kvt,
                                                       "paged keys, vLLM's [num_blocks, block_size, num_kv_heads, head_size]"));
    json_object_set_new(inputs, "v_cache", tensor_spec(cache_axes, 4, kvt, NULL));
    if (!decode)
        json_object_set_new(inputs, "qo_indptr", tensor_spec(indptr, 1, "int32", "vLLM's query_start_loc"));
    json_object_set_new(inputs, "kv_indptr", tensor_spec(indptr, 1, "int32", NULL));
    json_object_set_new(inputs, "kv_indices",
                        tensor_spec(indices, 1, "int32", "pages: each request's block_table row"));
    json_object_set_new(inputs, "kv_last_page_len", tensor_spec(batch, 1, "int32", NULL));
    json_object_set_new(inputs, "sm_scale", tensor_spec(NULL, 0, "float32", NULL));
    json_t *outputs = json_object();
    json_object_set_new(outputs, "output", tensor_spec(q_axes, 3, dt, NULL));
    const char *lse_axes[] = {"total_q", "num_qo_heads"};
    json_object_set_new(outputs, "lse", tensor_spec(lse_axes, 2, "float32", "log-sum-exp, base 2"));
    char ref[sizeof reference_src + 256];
    snprintf(ref, sizeof ref, reference_src, decode ? "" : "qo_indptr, ",
             decode ? "    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=q.device)\n" : "");
    char *kv = strstr(ref, "KV_INDPTR");
    if (kv) memcpy(kv, "kv_indptr", 9);
    json_t *constraints = json_pack("[s,s,s]", "len_indptr == batch_size + 1", "num_kv_indices == kv_indptr[-1]",
                                    decode ? "total_q == batch_size" : "total_q == qo_indptr[-1]");
    char tag_model[160], tag_trace[64];
    snprintf(tag_model, sizeof tag_model, "model:%s", m->name);
    snprintf(tag_trace, sizeof tag_trace, "attnreplay:trace=%s", hash);
    return json_pack("{s:s,s:s,s:[s,s,s,s],s:s,s:o,s:o,s:o,s:o,s:s}", "name", name, "op_type", "gqa_paged",
                     "tags", decode ? "stage:decode" : "stage:prefill", tag_model, tag_trace, "status:draft",
                     "description", decode ? "Paged GQA decode (one query per request) of steps replayed by attnreplay"
                                           : "Paged GQA prefill, causal bottom-right, of steps replayed by attnreplay",
                     "axes", axes, "inputs", inputs, "outputs", outputs, "constraints", constraints,
                     "reference", ref);
}

/* ---- the command -------------------------------------------------------------------------- */

typedef struct kind_out {
    bool used;
    char name[128];
    FILE *jsonl;
    int64_t count;
} kind_out;

/* After a failed write (a full disk): removes what this export wrote - the blob being written
 * (inflight, "" for none), each kind's definition and workload file, the workloads prov lists -
 * and the directories it left empty, so that DIR takes the next export as it took this one. */
static void remove_partial(const char *out, json_t *prov, const kind_out kinds[2], const char *inflight)
{
    char path[4600], err[256];
    if (inflight[0]) unlink(inflight);
    for (int i = 0; i < 2; i++) {
        if (!kinds[i].name[0]) continue;
        snprintf(path, sizeof path, "%s/definitions/gqa_paged/%s.json", out, kinds[i].name);
        unlink(path);
        snprintf(path, sizeof path, "%s/workloads/gqa_paged/%s.jsonl", out, kinds[i].name);
        unlink(path);
        snprintf(path, sizeof path, "%s/blob/workloads/gqa_paged/%s", out, kinds[i].name);
        rmdir(path);   /* empty when none of its blobs was listed; else remove_previous's */
    }
    remove_previous(out, prov, err, sizeof err);   /* the listed blobs, then the empty directories */
}

static void usage(FILE *f)
{
    fprintf(f, "usage: attnreplay export TRACE --format flashinfer-trace --out DIR [--steps A:B]\n"
               "  writes the steps as FlashInfer-Trace definitions, workloads (jsonl) and safetensors blobs\n"
               "  DIR must be missing, empty or hold an earlier export (attnreplay-export.json), whose files\n"
               "  are removed when the first workload is written; other files there stay. An export whose\n"
               "  write fails part-way removes its own files (and leaves an empty export's record where DIR\n"
               "  held one), so DIR takes the next export\n"
               "  Exit status: 0 written, 2 bad input or usage (an unreadable or malformed trace, a model\n"
               "  the format cannot hold: MLA, a sliding window, a soft cap; DIR not empty and no earlier\n"
               "  export), 3 a write failed (the directory, a full disk) or out of memory, or the summary\n"
               "  could not be written to stdout (DIR is written), 4 nothing to export: no step with\n"
               "  scheduled requests in --steps (nothing written; 4 stays when stdout fails too).\n");
}

int ar_export_main(int argc, char **argv)
{
    const char *out = NULL, *format = NULL;
    int64_t first = 0, last = INT64_MAX;
    static const struct option longopts[] = {{"out", required_argument, 0, 'o'}, {"format", required_argument, 0, 'f'},
                                              {"steps", required_argument, 0, 's'}, {"help", no_argument, 0, 'h'},
                                              {0, 0, 0, 0}};
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'f': format = optarg; break;
        case 's':
            if (ar_parse_step_range(optarg, &first, &last)) {
                fprintf(stderr, "attnreplay export: --steps takes A:B with 0 <= A <= B (got '%s')\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default:
            fprintf(stderr, "attnreplay export: unknown or incomplete option '%s'\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (optind != argc - 1 || !out || !format) {
        usage(stderr);
        return 2;
    }
    if (strcmp(format, "flashinfer-trace") != 0) {
        fprintf(stderr, "attnreplay export: --format %s: the one format is flashinfer-trace\n", format);
        return 2;
    }
    const char *trace = argv[optind];
    char err[AR_ERR_MAX + 512];
    ar_trace_reader *rd = ar_trace_open(trace, err, sizeof err);
    if (!rd) {
        fprintf(stderr, "attnreplay export: %s\n", err);
        return 2;
    }
    const ar_trace_header *h = ar_trace_header_of(rd);
    const ar_model *m = &h->model;
    if (m->attention != AR_ATTN_MHA || m->sliding_window > 0 || m->logits_soft_cap > 0) {
        fprintf(stderr, "attnreplay export: %s: model %s is %s; the export writes gqa_paged definitions, which have "
                "no MLA, sliding window or soft cap\n", trace, m->name,
                m->attention != AR_ATTN_MHA ? "MLA" : m->sliding_window > 0 ? "windowed" : "soft-capped");
        ar_trace_close(rd);
        return 2;
    }
    char hash[17];
    if (ar_trace_file_hash(trace, hash) != 0) {
        fprintf(stderr, "attnreplay export: %s: cannot read: %s\n", trace, strerror(errno));
        ar_trace_close(rd);
        return 2;
    }
    json_t *previous = NULL;
    if (out_dir_state(out, &previous, err, sizeof err) < 0) {
        fprintf(stderr, "attnreplay export: %s\n", err);
        ar_trace_close(rd);
        return 2;
    }
    int rc = 0;
    const bool had_previous = previous != NULL;
    kind_out kinds[2];   /* 0 prefill, 1 decode */
    char inflight[4600] = "";   /* the blob of the step in progress, removed when a write of the step fails */
    memset(kinds, 0, sizeof kinds);
    json_t *prov = json_pack("{s:s,s:s,s:s,s:I,s:I,s:o}", "format", "attnreplay-export", "trace", trace,
                             "trace_hash", hash, "first_step", (json_int_t)first,
                             "last_step", (json_int_t)(last == INT64_MAX ? -1 : last), "workloads", json_array());
    int32_t *qo = NULL, *kvp = NULL, *idx = NULL, *lastlen = NULL;
    size_t cap_req = 0, cap_idx = 0;
    char dir[4096], path[4600];
    const int B = h->cache.block_size;
    for (;;) {
        const ar_step *st = NULL;
        int r = ar_trace_next(rd, &st, err, sizeof err);
        if (r == 0) break;
        if (r < 0) {
            fprintf(stderr, "attnreplay export: %s\n", err);
            rc = 2;
            break;
        }
        if (st->step < first) continue;
        if (st->step > last) break;
        int n = st->num_scheduled;
        if (n == 0) continue;
        if ((size_t)n + 1 > cap_req) {
            cap_req = 2 * ((size_t)n + 1);
            int32_t *a = realloc(qo, cap_req * 4), *b2 = realloc(kvp, cap_req * 4);
            if (a) qo = a;
            if (b2) kvp = b2;
            int32_t *c2 = realloc(lastlen, cap_req * 4);
            if (c2) lastlen = c2;
            if (!a || !b2 || !c2) { rc = 3; fprintf(stderr, "attnreplay export: out of memory\n"); break; }
        }
        bool decode = true;
        qo[0] = kvp[0] = 0;
        for (int i = 0; i < n; i++) {
            const ar_live_req *lr = ar_trace_find(rd, st->scheduled[i].req);
            int q_len = st->scheduled[i].num_tokens, seq_len = lr->num_computed_tokens + q_len;
            int pages = (seq_len + B - 1) / B;
            if (q_len != 1) decode = false;
            qo[i + 1] = qo[i] + q_len;
            kvp[i + 1] = kvp[i] + pages;
            lastlen[i] = seq_len - (pages - 1) * B;
            if ((size_t)kvp[i + 1] > cap_idx) {
                cap_idx = 2 * (size_t)kvp[i + 1];
                int32_t *a = realloc(idx, cap_idx * 4);
                if (!a) { rc = 3; break; }
                idx = a;
            }
            for (int p = 0; p < pages; p++) idx[kvp[i] + p] = lr->block_ids[p];
        }
        if (rc) { fprintf(stderr, "attnreplay export: out of memory\n"); break; }
        kind_out *k = &kinds[decode ? 1 : 0];
        if (previous) {   /* the first workload replaces an earlier export, not before */
            int bad = remove_previous(out, previous, err, sizeof err);
            json_decref(previous);
            previous = NULL;
            if (bad) { rc = 3; break; }
        }
        if (!k->used) {
            snprintf(k->name, sizeof k->name, "gqa_paged_%s_h%d_kv%d_d%d_ps%d", decode ? "decode" : "prefill_causal",
                     m->num_q_heads, m->num_kv_heads, m->head_size, B);
            snprintf(dir, sizeof dir, "%s/definitions/gqa_paged", out);
            if (mkdirs(dir, err, sizeof err) != 0) { rc = 3; break; }
            snprintf(path, sizeof path, "%s/%s.json", dir, k->name);
            json_t *def = definition_json(h, decode, k->name, hash);
            int bad = json_dump_file(def, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
            json_decref(def);
            if (bad) { snprintf(err, sizeof err, "%.900s: cannot write", path); rc = 3; break; }
            snprintf(dir, sizeof dir, "%s/workloads/gqa_paged", out);
            if (mkdirs(dir, err, sizeof err) != 0) { rc = 3; break; }
            snprintf(path, sizeof path, "%s/%s.jsonl", dir, k->name);
            k->jsonl = fopen(path, "w");
            if (!k->jsonl) {
                snprintf(err, sizeof err, "%.900s: cannot create: %s", path, strerror(errno));
                rc = 3;
                break;
            }
            snprintf(dir, sizeof dir, "%s/blob/workloads/gqa_paged/%s", out, k->name);
            if (mkdirs(dir, err, sizeof err) != 0) { rc = 3; break; }
            k->used = true;
        }
        char uuid[37], step_s[32];
        step_uuid(hash, st->step, uuid);
        snprintf(step_s, sizeof step_s, "%lld", (long long)st->step);
        char rel[600];
        snprintf(rel, sizeof rel, "blob/workloads/gqa_paged/%s/%s_%s.safetensors", k->name, k->name, uuid);
        snprintf(path, sizeof path, "%s/%s", out, rel);
        ar_st_tensor ts[4];
        int nt = 0;
        if (!decode) ts[nt++] = (ar_st_tensor){"qo_indptr", qo, n + 1};
        ts[nt++] = (ar_st_tensor){"kv_indptr", kvp, n + 1};
        ts[nt++] = (ar_st_tensor){"kv_indices", idx, kvp[n]};
        ts[nt++] = (ar_st_tensor){"kv_last_page_len", lastlen, n};
        const char *meta[] = {"attnreplay_step", step_s, "attnreplay_trace_hash", hash};
        snprintf(inflight, sizeof inflight, "%s", path);
        if (ar_safetensors_write_i32(path, ts, nt, meta, 2, err, sizeof err) != 0) { rc = 3; break; }
        json_t *inputs = json_object();
        json_object_set_new(inputs, "q", json_pack("{s:s}", "type", "random"));
        json_object_set_new(inputs, "k_cache", json_pack("{s:s}", "type", "random"));
        json_object_set_new(inputs, "v_cache", json_pack("{s:s}", "type", "random"));
        for (int i = 0; i < nt; i++)
            json_object_set_new(inputs, ts[i].name, json_pack("{s:s,s:s,s:s}", "type", "safetensors", "path", rel,
                                                              "tensor_key", ts[i].name));
        json_object_set_new(inputs, "sm_scale", json_pack("{s:s,s:f}", "type", "scalar", "value",
                                                          m->scale > 0 ? m->scale : 1.0 / sqrt((double)m->head_size)));
        json_t *line = json_pack("{s:s,s:{s:s,s:{s:i,s:i,s:i,s:i,s:i},s:o},s:n,s:n}", "definition", k->name,
                                 "workload", "uuid", uuid, "axes", "total_q", qo[n], "num_pages", h->cache.num_blocks,
                                 "len_indptr", n + 1, "num_kv_indices", kvp[n], "batch_size", n, "inputs", inputs,
                                 "solution", "evaluation");
        char *text = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(line);
        if (!text || fprintf(k->jsonl, "%s\n", text) < 0) {
            free(text);
            snprintf(err, sizeof err, "%s: write failed", k->name);
            rc = 3;
            break;
        }
        free(text);
        json_array_append_new(json_object_get(prov, "workloads"),
                              json_pack("{s:s,s:s,s:I,s:i,s:i,s:b}", "uuid", uuid, "definition", k->name, "step",
                                        (json_int_t)st->step, "num_reqs", n, "total_q", qo[n], "decode", decode));
        k->count++;
        inflight[0] = '\0';   /* listed in prov from here */
    }
    for (int i = 0; i < 2; i++)
        if (kinds[i].jsonl && fclose(kinds[i].jsonl) != 0 && !rc) {
            snprintf(err, sizeof err, "%s.jsonl: write failed", kinds[i].name);
            rc = 3;
        }
    if (rc == 3 && err[0]) fprintf(stderr, "attnreplay export: %s\n", err);
    if (rc == 3) {
        remove_partial(out, prov, kinds, inflight);
        if (had_previous) {   /* DIR held an earlier export, now gone: it stays a place for the next one */
            json_t *empty = json_pack("{s:s,s:s,s:[],s:s}", "format", "attnreplay-export", "trace", trace, "workloads",
                                      "note", "an export into this directory failed part-way; its files were removed");
            snprintf(path, sizeof path, "%s/attnreplay-export.json", out);
            if (!empty || json_dump_file(empty, path, JSON_INDENT(2)) != 0)
                fprintf(stderr, "attnreplay export: %s: cannot write the empty export's record either\n", path);
            json_decref(empty);
        }
    }
    if (!rc && kinds[0].count + kinds[1].count == 0) {   /* as replay: nothing done is not success */
        fprintf(stderr, "attnreplay export: %s: no step with scheduled requests in --steps %lld:%s (past the trace's "
                "end?); nothing written%s\n", trace, (long long)first,
                last == INT64_MAX ? "" : (snprintf(path, sizeof path, "%lld", (long long)last), path),
                previous ? ", the earlier export left as it was" : "");
        rc = 4;
    }
    json_decref(previous);
    if (!rc) {
        snprintf(path, sizeof path, "%s/attnreplay-export.json", out);
        if (mkdirs(out, err, sizeof err) != 0 ||
            json_dump_file(prov, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0) {
            fprintf(stderr, "attnreplay export: %s: cannot write\n", path);
            rc = 3;
        }
    }
    if (!rc)
        printf("attnreplay export: %lld prefill and %lld decode workloads of %s in %s\n", (long long)kinds[0].count,
               (long long)kinds[1].count, trace, out);
    json_decref(prov);
    free(qo);
    free(kvp);
    free(idx);
    free(lastlen);
    ar_trace_close(rd);
    return rc;
}
