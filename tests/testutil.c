/* testutil.c - implementation of the shared test helpers (see testutil.h). */
#include "testutil.h"

#include <errno.h>
#include <sqlite3.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../reference/mla_ref.h"
#include "../traces/trace.h"
#include <zlib.h>

static char tmp_root[PATH_MAX];

const char *tu_src_dir(void)
{
    const char *s = getenv("AR_SRC");
    return s && *s ? s : ".";
}

const char *tu_bin(void)
{
    const char *s = getenv("AR_BIN");
    return s && *s ? s : "bin/attnreplay";
}

const char *tu_build_dir(void)
{
    static char dir[4096];
    if (dir[0]) return dir;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return "build";
    exe[n] = '\0';
    for (int up = 0; up < 2; up++) {   /* BUILD/tests/NAME -> BUILD */
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
    }
    snprintf(dir, sizeof dir, "%s", exe);
    return dir;
}

const char *tu_public_trace(const char *rel, char *buf, size_t len)
{
    snprintf(buf, len, "%s/../shared/traces-public/%s", tu_src_dir(), rel);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

static void remove_tmp(void)
{
    if (tmp_root[0] && !getenv("AR_KEEP_TMP")) {
        char cmd[PATH_MAX + 16];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
        if (system(cmd) != 0) { /* best effort */ }
    }
}

const char *tu_tmpdir(void)
{
    if (!tmp_root[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(tmp_root, sizeof tmp_root, "%s/artest.XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(tmp_root)) { perror("mkdtemp"); exit(1); }
        atexit(remove_tmp);
    }
    return tmp_root;
}

const char *tu_tmp(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s", tu_tmpdir(), name);
    return buf;
}

int tu_run(const char *out_path, const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof cmd - 64) return -1;
    if (out_path) {
        size_t l = strlen(cmd);
        snprintf(cmd + l, sizeof cmd - l, " >'%s' 2>&1", out_path);
    }
    int st = system(cmd);
    if (st == -1) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

char *tu_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

char *tu_slurp_gz(const char *path, size_t *len)
{
    gzFile gz = gzopen(path, "rb");
    *len = 0;
    if (!gz) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    int got;
    while (buf && (got = gzread(gz, buf + n, (unsigned)(cap - n))) > 0) {
        n += (size_t)got;
        if (n == cap) {
            char *grown = realloc(buf, 2 * cap + 1);
            if (!grown) free(buf);
            buf = grown;
            cap *= 2;
        }
    }
    gzclose(gz);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

bool tu_file_has(const char *path, const char *needle)
{
    char *text = tu_slurp(path);
    bool yes = text && strstr(text, needle);
    if (!yes) print_message("--- %s (no '%s'):\n%s\n", path, needle, text ? text : "(missing)");
    free(text);
    return yes;
}

const char *tu_sample(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/traces/samples/%s.trace.jsonl.gz", tu_src_dir(), name);
    return buf;
}

int tu_write(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fputs(text, f) >= 0;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

void *tu_commit_later(void *db)
{
    usleep(1500000);
    sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    return NULL;
}

int64_t tu_query_int(const char *db, const char *sql)
{
    sqlite3 *h = NULL;
    int64_t v = -1;
    if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(h, 2000);
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
            v = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    }
    sqlite3_close(h);
    return v;
}

void tu_query_text(const char *db, const char *sql, char *out, size_t len)
{
    sqlite3 *h = NULL;
    out[0] = 0;
    if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
        sqlite3_busy_timeout(h, 2000);
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(h, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW &&
            sqlite3_column_text(st, 0))
            snprintf(out, len, "%s", (const char *)sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
    }
    sqlite3_close(h);
}

size_t tu_gpu_shard(struct CMUnitTest *tests, size_t n)
{
    const char *e = getenv("AR_GPU_SHARD");
    unsigned k = 0, parts = 0;
    if (!e || sscanf(e, "%u/%u", &k, &parts) != 2 || parts == 0 || k >= parts) return n;
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        if (i % parts == k) tests[kept++] = tests[i];
    return kept;
}

int tu_run_gpu_tests(const char *group, struct CMUnitTest *tests, size_t n)
{
    const char *only = getenv("AR_GPU_ONLY");
    if (only && *only) cmocka_set_test_filter(only);
    return _cmocka_run_group_tests(group, tests, tu_gpu_shard(tests, n), NULL, NULL);
}

void tu_mla_model(struct ar_model *m, const char *name, int heads, int layers)
{
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    m->attention = AR_ATTN_MLA;
    m->num_layers = layers;
    m->num_q_heads = heads;
    m->num_kv_heads = 1;
    m->head_size = 576;
    m->kv_lora_rank = 512;
    m->qk_rope_head_dim = 64;
    m->qk_nope_head_dim = 128;
    m->v_head_dim = 128;
    m->scale = AR_MLA_DEEPSEEK_SCALE;
}

uint64_t tu_rng64(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t x = *state;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

int tu_rnd(uint64_t *state, int n)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (int)(*state % (uint64_t)n);
}
