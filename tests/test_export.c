/* test_export.c - `attnreplay export --format flashinfer-trace`: the files parse (definition JSON,
 * workload JSON Lines, safetensors read back by a parser of the format's spec written here), the
 * index tensors are the trace's batches (checked against the trace reader step by step), decode
 * and prefill steps land in their definitions, and bad input is refused with exit 2; no step to
 * export exits 4, and an export replaces an earlier one in the same directory. */
#include "testutil.h"

#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../traces/export.h"
#include "../traces/trace.h"

/* A safetensors file read back: the header's JSON and the data section. */
typedef struct st_file {
    json_t *header;
    unsigned char *data;
    size_t data_len;
} st_file;

static int st_read(const char *path, st_file *f)
{
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) return -1;
    unsigned char le[8];
    if (fread(le, 1, 8, fp) != 8) { fclose(fp); return -1; }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | le[i];
    if (n == 0 || n > (1u << 24) || n % 8 != 0) { fclose(fp); return -1; }   /* the writer pads to 8 */
    char *text = malloc(n + 1);
    if (!text || fread(text, 1, n, fp) != n) { free(text); fclose(fp); return -1; }
    text[n] = '\0';
    json_error_t je;
    f->header = json_loads(text, 0, &je);
    free(text);
    long here = ftell(fp);
    fseek(fp, 0, SEEK_END);
    long end = ftell(fp);
    fseek(fp, here, SEEK_SET);
    f->data_len = (size_t)(end - here);
    f->data = malloc(f->data_len + 1);
    if (!f->header || !f->data || fread(f->data, 1, f->data_len, fp) != f->data_len) { fclose(fp); return -1; }
    fclose(fp);
    return 0;
}

/* The int32 tensor `name`: its length, and its values copied into out (malloc'd). */
static int64_t st_tensor(const st_file *f, const char *name, int32_t **out)
{
    json_t *t = json_object_get(f->header, name);
    assert_non_null(t);
    assert_string_equal(json_string_value(json_object_get(t, "dtype")), "I32");
    json_t *shape = json_object_get(t, "shape"), *offs = json_object_get(t, "data_offsets");
    assert_int_equal(json_array_size(shape), 1);
    int64_t len = json_integer_value(json_array_get(shape, 0));
    int64_t a = json_integer_value(json_array_get(offs, 0)), b = json_integer_value(json_array_get(offs, 1));
    assert_int_equal(b - a, 4 * len);
    assert_true(a >= 0 && (size_t)b <= f->data_len);
    *out = malloc(sizeof(int32_t) * (size_t)(len + 1));
    for (int64_t i = 0; i < len; i++) {
        const unsigned char *p = f->data + a + 4 * i;
        (*out)[i] = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
    }
    return len;
}

static void st_free(st_file *f)
{
    json_decref(f->header);
    free(f->data);
}

static void test_safetensors_writer_roundtrip(void **state)
{
    (void)state;
    char path[PATH_MAX], err[512];
    int32_t a[3] = {0, -7, 2147483647}, b[1] = {42};
    ar_st_tensor ts[2] = {{"a", a, 3}, {"b", b, 1}};
    const char *meta[] = {"k", "v"};
    tu_tmp("rt.safetensors", path, sizeof path);
    assert_int_equal(ar_safetensors_write_i32(path, ts, 2, meta, 1, err, sizeof err), 0);
    st_file f;
    assert_int_equal(st_read(path, &f), 0);
    int32_t *v;
    assert_int_equal(st_tensor(&f, "a", &v), 3);
    assert_int_equal(v[1], -7);
    assert_int_equal(v[2], 2147483647);
    free(v);
    assert_int_equal(st_tensor(&f, "b", &v), 1);
    assert_int_equal(v[0], 42);
    free(v);
    assert_string_equal(json_string_value(json_object_get(json_object_get(f.header, "__metadata__"), "k")), "v");
    assert_int_equal(f.data_len, 16);
    st_free(&f);
}

/* Exports a sample trace and checks every workload against the trace reader's batches. */
static void check_export(const char *sample_name, const char *steps)
{
    char trace[PATH_MAX], out[PATH_MAX], log[PATH_MAX], path[PATH_MAX + 256], err[AR_ERR_MAX];
    snprintf(trace, sizeof trace, "%s/traces/samples/%s.trace.jsonl.gz", tu_src_dir(), sample_name);
    tu_tmp(sample_name, out, sizeof out);
    tu_tmp("export.log", log, sizeof log);
    int rc = tu_run(log, "'%s' export '%s' --steps %s --format flashinfer-trace --out '%s'", tu_bin(), trace,
                    steps, out);
    assert_int_equal(rc, 0);
    snprintf(path, sizeof path, "%s/attnreplay-export.json", out);
    json_error_t je;
    json_t *prov = json_load_file(path, 0, &je);
    assert_non_null(prov);
    json_t *workloads = json_object_get(prov, "workloads");
    size_t count = json_array_size(workloads);
    assert_true(count > 0);

    ar_trace_reader *rd = ar_trace_open(trace, err, sizeof err);
    assert_non_null(rd);
    const ar_trace_header *h = ar_trace_header_of(rd);
    const int B = h->cache.block_size;
    size_t wi = 0, decode_seen = 0, prefill_seen = 0;
    const ar_step *st;
    while (wi < count && ar_trace_next(rd, &st, err, sizeof err) == 1) {
        json_t *w = json_array_get(workloads, wi);
        if (st->step != json_integer_value(json_object_get(w, "step"))) continue;
        wi++;
        const char *def = json_string_value(json_object_get(w, "definition"));
        const char *uuid = json_string_value(json_object_get(w, "uuid"));
        bool decode = json_is_true(json_object_get(w, "decode"));
        decode ? decode_seen++ : prefill_seen++;
        assert_non_null(strstr(def, decode ? "gqa_paged_decode_h8_kv2_d64_ps16"
                                           : "gqa_paged_prefill_causal_h8_kv2_d64_ps16"));
        snprintf(path, sizeof path, "%s/blob/workloads/gqa_paged/%s/%s_%s.safetensors", out, def, def, uuid);
        st_file f;
        assert_int_equal(st_read(path, &f), 0);
        int32_t *kvp, *idx, *lastlen, *qo = NULL;
        int n = st->num_scheduled;
        assert_int_equal(st_tensor(&f, "kv_indptr", &kvp), n + 1);
        assert_int_equal(st_tensor(&f, "kv_last_page_len", &lastlen), n);
        int64_t nidx = st_tensor(&f, "kv_indices", &idx);
        assert_int_equal(nidx, kvp[n]);
        if (!decode) assert_int_equal(st_tensor(&f, "qo_indptr", &qo), n + 1);
        else assert_null(json_object_get(f.header, "qo_indptr"));
        for (int r = 0; r < n; r++) {
            const ar_live_req *lr = ar_trace_find(rd, st->scheduled[r].req);
            int q_len = st->scheduled[r].num_tokens, seq_len = lr->num_computed_tokens + q_len;
            int pages = kvp[r + 1] - kvp[r];
            assert_int_equal((pages - 1) * B + lastlen[r], seq_len);
            assert_true(lastlen[r] >= 1 && lastlen[r] <= B);
            for (int p = 0; p < pages; p++) {
                assert_int_equal(idx[kvp[r] + p], lr->block_ids[p]);
                assert_true(idx[kvp[r] + p] > 0 && idx[kvp[r] + p] < h->cache.num_blocks);
            }
            if (qo) assert_int_equal(qo[r + 1] - qo[r], q_len);
            else assert_int_equal(q_len, 1);
        }
        free(kvp); free(idx); free(lastlen); free(qo);
        st_free(&f);
    }
    assert_int_equal(wi, count);
    ar_trace_close(rd);
    /* the definitions parse and carry the constants and a run() reference */
    for (int d = 0; d < 2; d++) {
        if (!(d ? decode_seen : prefill_seen)) continue;
        snprintf(path, sizeof path, "%s/definitions/gqa_paged/gqa_paged_%s_h8_kv2_d64_ps16.json", out,
                 d ? "decode" : "prefill_causal");
        json_t *def = json_load_file(path, 0, &je);
        assert_non_null(def);
        assert_string_equal(json_string_value(json_object_get(def, "op_type")), "gqa_paged");
        json_t *page_size = json_object_get(json_object_get(def, "axes"), "page_size");
        assert_int_equal(json_integer_value(json_object_get(page_size, "value")), B);
        assert_non_null(strstr(json_string_value(json_object_get(def, "reference")), "def run(q, k_cache, v_cache, "));
        json_t *sm_scale = json_object_get(json_object_get(def, "inputs"), "sm_scale");
        assert_true(json_is_null(json_object_get(sm_scale, "shape")));
        json_decref(def);
        /* every workload line is a JSON object naming this definition */
        snprintf(path, sizeof path, "%s/workloads/gqa_paged/gqa_paged_%s_h8_kv2_d64_ps16.jsonl", out,
                 d ? "decode" : "prefill_causal");
        char *text = tu_slurp(path);
        assert_non_null(text);
        size_t lines = 0;
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
            json_t *j = json_loads(line, 0, &je);
            assert_non_null(j);
            assert_true(json_is_null(json_object_get(j, "solution")));
            json_t *axes = json_object_get(json_object_get(j, "workload"), "axes");
            assert_int_equal(json_integer_value(json_object_get(axes, "len_indptr")),
                             json_integer_value(json_object_get(axes, "batch_size")) + 1);
            json_decref(j);
        }
        assert_int_equal(lines, d ? decode_seen : prefill_seen);
        free(text);
    }
    json_decref(prov);
}

static void test_export_matches_the_trace(void **state)
{
    (void)state;
    check_export("mixed", "0:");
    check_export("chunked", "3:20");
    check_export("preempt", "0:");
}

static void test_export_bad_input(void **state)
{
    (void)state;
    char trace[PATH_MAX], out[PATH_MAX], log[PATH_MAX];
    snprintf(trace, sizeof trace, "%s/traces/samples/mixed.trace.jsonl.gz", tu_src_dir());
    tu_tmp("bad-export", out, sizeof out);
    tu_tmp("bad-export.log", log, sizeof log);
    assert_int_equal(tu_run(log, "'%s' export '%s' --format parquet --out '%s'", tu_bin(), trace, out), 2);
    assert_int_equal(tu_run(log, "'%s' export '%s' --format flashinfer-trace --steps 9:3 --out '%s'", tu_bin(), trace,
                            out), 2);
    assert_int_equal(tu_run(log, "'%s' export '%s' --format flashinfer-trace", tu_bin(), trace), 2);
    assert_int_equal(tu_run(log, "'%s' export /no/such.trace --format flashinfer-trace --out '%s'", tu_bin(), out), 2);
}

#define EXPORT_CMD "'%s' export '%s' --steps %s --format flashinfer-trace --out '%s'"

static int files_counted;
static int count_file(const char *path, const struct stat *sb, int kind, struct FTW *ftw)
{
    (void)path; (void)sb; (void)ftw;
    files_counted += kind == FTW_F;
    return 0;
}

static int count_files(const char *dir)
{
    files_counted = 0;
    return nftw(dir, count_file, 16, FTW_PHYS) == 0 ? files_counted : -1;
}

/* --steps with no step to export exits 4 and writes nothing, as replay exits 4 when nothing was
 * replayed; an export into a directory holding an earlier export replaces that export's files
 * (a smaller export leaves none of the larger one's behind) and keeps other files; a non-empty
 * directory without an earlier export is refused (exit 2), untouched. */
static void test_export_nothing_and_reexport(void **state)
{
    (void)state;
    char trace[PATH_MAX], out[PATH_MAX], log[PATH_MAX], path[PATH_MAX + 64];
    snprintf(trace, sizeof trace, "%s/traces/samples/mixed.trace.jsonl.gz", tu_src_dir());
    tu_tmp("reexport", out, sizeof out);
    tu_tmp("reexport.log", log, sizeof log);
    struct stat sb;
    assert_int_equal(tu_run(log, EXPORT_CMD, tu_bin(), trace, "5000:6000", out), 4);
    assert_true(tu_file_has(log, "no step with scheduled requests"));
    assert_int_not_equal(stat(out, &sb), 0);   /* nothing written, not even DIR */
    assert_int_equal(tu_run(log, EXPORT_CMD, tu_bin(), trace, "0:25", out), 0);
    int full = count_files(out);
    assert_true(full > 8);
    snprintf(path, sizeof path, "%s/notes.txt", out);
    assert_int_equal(tu_write(path, "mine\n"), 0);
    assert_int_equal(tu_run(log, EXPORT_CMD, tu_bin(), trace, "0:0", out), 0);   /* one prefill step */
    assert_int_equal(count_files(out), 5);   /* its definition, workloads, blob, provenance + notes.txt */
    snprintf(path, sizeof path, "%s/definitions/gqa_paged/gqa_paged_decode_h8_kv2_d64_ps16.json", out);
    assert_int_not_equal(stat(path, &sb), 0);
    snprintf(path, sizeof path, "%s/notes.txt", out);
    assert_true(tu_file_has(path, "mine"));
    assert_int_equal(tu_run(log, EXPORT_CMD, tu_bin(), trace, "900:900", out), 4);   /* past the end: kept */
    assert_int_equal(count_files(out), 5);
    /* a directory of other files */
    char other[PATH_MAX];
    tu_tmp("reexport-other", other, sizeof other);
    mkdir(other, 0755);
    snprintf(path, sizeof path, "%s/data.csv", other);
    assert_int_equal(tu_write(path, "a,b\n"), 0);
    assert_int_equal(tu_run(log, EXPORT_CMD, tu_bin(), trace, "0:25", other), 2);
    assert_true(tu_file_has(log, "holds no earlier export"));
    assert_int_equal(count_files(other), 1);
}

/* A write that fails part-way (a full disk: `ulimit -f`, SIGXFSZ ignored) ends with exit 3 and
 * takes this export's files with it, leaving an empty export's record where DIR held an earlier
 * export, so that DIR takes the next export: the partial export, with no attnreplay-export.json,
 * used to be refused as "holds no earlier export" until removed by hand.  Other files stay. */
static void test_export_full_disk_leaves_nothing(void **state)
{
    (void)state;
    char trace[PATH_MAX], out[PATH_MAX], log[PATH_MAX], path[PATH_MAX + 64];
    snprintf(trace, sizeof trace, "%s/traces/samples/mixed.trace.jsonl.gz", tu_src_dir());
    tu_tmp("fullexport.log", log, sizeof log);
    const int limits[] = {1, 8, 20};   /* KiB a file: the first definition, a workload line, a later blob */
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "fullexport%d", i);
        tu_tmp(name, out, sizeof out);
        assert_int_equal(tu_run(log, EXPORT_CMD, tu_bin(), trace, "0:25", out), 0);   /* an earlier export */
        snprintf(path, sizeof path, "%s/notes.txt", out);
        assert_int_equal(tu_write(path, "mine\n"), 0);
        assert_int_equal(tu_run(log, "bash -c \"trap '' XFSZ; ulimit -f %d; exec '%s' export '%s' --format "
                                     "flashinfer-trace --out '%s' --steps 0:25\"", limits[i], tu_bin(), trace, out), 3);
        assert_int_equal(count_files(out), 2);   /* notes.txt and an empty export's record */
        assert_true(tu_file_has(path, "mine"));
        assert_int_equal(tu_run(log, EXPORT_CMD, tu_bin(), trace, "0:25", out), 0);
        assert_true(count_files(out) > 8);
    }
    /* into a new directory: nothing of it is left (no record either) */
    tu_tmp("fullexport-new", out, sizeof out);
    assert_int_equal(tu_run(log, "bash -c \"trap '' XFSZ; ulimit -f 8; exec '%s' export '%s' --format "
                                 "flashinfer-trace --out '%s' --steps 0:25\"", tu_bin(), trace, out), 3);
    assert_true(count_files(out) <= 0);   /* no file (or not even the directory) */
    assert_int_equal(tu_run(log, EXPORT_CMD, tu_bin(), trace, "0:25", out), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_safetensors_writer_roundtrip),
        cmocka_unit_test(test_export_matches_the_trace),
        cmocka_unit_test(test_export_bad_input),
        cmocka_unit_test(test_export_nothing_and_reexport),
        cmocka_unit_test(test_export_full_disk_leaves_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
