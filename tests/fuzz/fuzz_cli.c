/* fuzz_cli.c - libFuzzer harness for the command-line parsers: ar_replay_main, ar_sim_main,
 * ar_report_main, ar_diff_main, ar_backends_main and ar_plan_main, called in-process with a
 * fuzzed argv, the way replay/main.c calls them.
 *
 * Input layout: byte 0 picks the command (value mod 6: replay, sim, report, diff, backends,
 * plan); the rest is the argument list, one argument per line.  Inside an argument these names
 * are replaced by paths the harness owns (so the fuzzer reaches real work, not only "file not
 * found"):
 *   @T  a copy of traces/samples/mixed.trace.jsonl.gz, @S of prefix.trace.jsonl.gz (put back
 *       after any input that wrote over them)
 *   @R  a results database with two small runs (report, diff and plan only; elsewhere @D)
 *   @D  a scratch database    @O  a scratch output path    @W  a small Mooncake workload
 * Arguments that start with '/' or contain ".." are refused (the harness must not write outside
 * its scratch directory, and it runs as whoever starts it), and so are inputs naming a number
 * above 4096 (10^8 requests or 1000 timed repeats are legal and merely slow).  The harness
 * chdir()s into a private scratch directory and empties it after every input, so relative paths
 * the fuzzer invents land there.
 *
 * Properties: no sanitizer report, no exit() (libFuzzer reports one), and the exit code is one
 * the command documents: 0, 1, 2 or 3 (replay also 4, nothing verified, and 130 or 143, which need a signal).
 *
 * gnuplot is hidden from report (PATH is emptied), so report exercises its parsing and its
 * database reads, then fails with "gnuplot missing" (exit 1) instead of forking. */
#include <ftw.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../replay/replay.h"
#include "../../reports/reports.h"
#include "../../sim/sim.h"
#include "fuzz_common.h"

#define FUZZ_CLI_MAX_ARGS 40
#define FUZZ_CLI_MAX_ARG 512
#define FUZZ_CLI_MAX_NUMBER 4096.0

static char trace_path[PATH_MAX], prefix_trace_path[PATH_MAX], results_db[PATH_MAX];
static char source_trace[PATH_MAX], source_prefix_trace[PATH_MAX];
static char scratch_dir[PATH_MAX], scratch_db[PATH_MAX], scratch_out[PATH_MAX], workload_path[PATH_MAX];
static int fixture_ready;

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb; (void)flag;
    if (ftw->level > 0) remove(path);
    return 0;
}

/* Empties the scratch directory (keeps the directory itself). */
static void wipe_scratch(void)
{
    nftw(scratch_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int run_argv(int (*fn)(int, char **), const char *const *args, int n)
{
    char *argv[FUZZ_CLI_MAX_ARGS + 2];
    for (int i = 0; i < n; i++) argv[i] = strdup(args[i]);
    argv[n] = NULL;
    int rc = fn(n, argv);
    for (int i = 0; i < n; i++) free(argv[i]);
    return rc;
}

/* Copies src to dst; 0 ok. */
static int copy_file(const char *src, const char *dst)
{
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    int ok = in && out;
    char buf[1 << 14];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = 0;
    return ok ? 0 : -1;
}

/* Puts back the fixture traces when a command wrote over them (or always, at setup). */
static void restore_fixture_traces(bool always)
{
    static struct stat want[2];
    const char *copies[2] = {trace_path, prefix_trace_path};
    const char *sources[2] = {source_trace, source_prefix_trace};
    for (int i = 0; i < 2; i++) {
        struct stat now;
        bool same = stat(copies[i], &now) == 0 && now.st_size == want[i].st_size &&
                    now.st_mtim.tv_sec == want[i].st_mtim.tv_sec && now.st_mtim.tv_nsec == want[i].st_mtim.tv_nsec &&
                    S_ISREG(now.st_mode);
        if (same && !always) continue;
        remove(copies[i]);
        if (copy_file(sources[i], copies[i]) != 0 || stat(copies[i], &want[i]) != 0) {
            fprintf(stderr, "fuzz_cli: cannot copy %s to %s\n", sources[i], copies[i]);
            abort();
        }
    }
}

/* atexit: the fixture files go with the process. */
static void remove_fixture(void)
{
    wipe_scratch();
    rmdir(scratch_dir);
    const char *files[3] = {trace_path, prefix_trace_path, workload_path};
    for (int i = 0; i < 3; i++) remove(files[i]);
    const char *suffixes[4] = {"", "-wal", "-shm", "-reserve"};
    for (int i = 0; i < 4; i++) {
        char path[PATH_MAX + 16];
        snprintf(path, sizeof path, "%s%s", results_db, suffixes[i]);
        remove(path);
    }
}

static void setup_fixture(void)
{
    const char *src = getenv("AR_SRC");
    char cwd[PATH_MAX];
    if (!src || !*src) src = getcwd(cwd, sizeof cwd) ? cwd : ".";
    snprintf(source_trace, sizeof source_trace, "%.3000s/traces/samples/mixed.trace.jsonl.gz", src);
    snprintf(source_prefix_trace, sizeof source_prefix_trace, "%.3000s/traces/samples/prefix.trace.jsonl.gz", src);
    if (access(source_trace, R_OK) != 0) {
        fprintf(stderr, "fuzz_cli: %s not found; run from the repository root or set AR_SRC\n", source_trace);
        abort();
    }
    char base[1024];
    ar_fuzz_tmp_path(base, sizeof base, "cli", "");
    /* the commands get copies: `sim --out @T` must not overwrite the repository's sample */
    snprintf(trace_path, sizeof trace_path, "%s-mixed.trace.jsonl.gz", base);
    snprintf(prefix_trace_path, sizeof prefix_trace_path, "%s-prefix.trace.jsonl.gz", base);
    restore_fixture_traces(true);
    snprintf(scratch_dir, sizeof scratch_dir, "%s-scratch", base);
    snprintf(results_db, sizeof results_db, "%s-results.db", base);
    snprintf(workload_path, sizeof workload_path, "%s-mooncake.jsonl", base);
    snprintf(scratch_db, sizeof scratch_db, "%.3000s/scratch.db", scratch_dir);
    snprintf(scratch_out, sizeof scratch_out, "%.3000s/out", scratch_dir);
    mkdir(scratch_dir, 0700);
    wipe_scratch();
    remove(results_db);
    const char *rows =
        "{\"timestamp\": 0, \"input_length\": 700, \"output_length\": 3, \"hash_ids\": [1, 2]}\n"
        "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 2, \"hash_ids\": [1, 3]}\n";
    if (ar_fuzz_write_file(workload_path, (const uint8_t *)rows, strlen(rows), false) != 0) abort();
    const char *run1[] = {"replay", trace_path, "--db", results_db, "--backend", "cpu", "--steps", "0:3",
                          "--threads", "1", "--quiet"};
    const char *run2[] = {"replay", trace_path, "--db", results_db, "--backend", "cpu", "--steps", "0:3",
                          "--threads", "1", "--quiet", "--verify", "off"};
    if (run_argv(ar_replay_main, run1, 11) != 0 || run_argv(ar_replay_main, run2, 13) != 0) {
        fprintf(stderr, "fuzz_cli: could not build the results database fixture %s\n", results_db);
        abort();
    }
    atexit(remove_fixture);
    setenv("PATH", "", 1);   /* no gnuplot: report must not fork */
    if (chdir(scratch_dir) != 0) abort();
    fixture_ready = 1;
}

/* False when the text names a number above FUZZ_CLI_MAX_NUMBER (or inf/nan). */
static bool numbers_small(const char *s)
{
    for (const char *p = s; *p;) {
        if ((*p >= '0' && *p <= '9') || ((*p == '.' || *p == '-' || *p == '+') && p[1] >= '0' && p[1] <= '9')) {
            char *end;
            double v = strtod(p, &end);
            if (end == p) { p++; continue; }
            if (!(v <= FUZZ_CLI_MAX_NUMBER && v >= -FUZZ_CLI_MAX_NUMBER)) return false;
            p = end;
        } else if (strncasecmp(p, "inf", 3) == 0 || strncasecmp(p, "nan", 3) == 0) {
            return false;
        } else {
            p++;
        }
    }
    return true;
}

/* Copies arg into out, replacing the @ names; false when the result would not fit. */
static bool substitute(const char *arg, bool reader, char *out, size_t out_len)
{
    size_t o = 0;
    for (const char *p = arg; *p;) {
        const char *rep = NULL;
        if (p[0] == '@') {
            switch (p[1]) {
            case 'T': rep = trace_path; break;
            case 'S': rep = prefix_trace_path; break;
            case 'R': rep = reader ? results_db : scratch_db; break;
            case 'D': rep = scratch_db; break;
            case 'O': rep = scratch_out; break;
            case 'W': rep = workload_path; break;
            default: break;
            }
        }
        const char *piece = rep ? rep : p;
        size_t n = rep ? strlen(rep) : 1;
        if (o + n + 1 > out_len) return false;
        memcpy(out + o, piece, n);
        o += n;
        p += rep ? 2 : 1;
    }
    out[o] = 0;
    return true;
}

int ar_fuzz_cli_one(const uint8_t *data, size_t size)
{
    static int (*const commands[6])(int, char **) = {ar_replay_main, ar_sim_main, ar_report_main,
                                                       ar_diff_main, ar_backends_main, ar_plan_main};
    static const char *const names[6] = {"replay", "sim", "report", "diff", "backends", "plan"};
    if (size < 1 || size > 4096) return 0;
    if (!fixture_ready) setup_fixture();
    int cmd = data[0] % 6;
    bool reader = cmd == 2 || cmd == 3 || cmd == 5;

    /* split into lines; NUL bytes end an argument early (argv strings cannot hold them) */
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    char *argv[FUZZ_CLI_MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = strdup(names[cmd]);
    bool ok = true;
    char *save = NULL;
    for (char *line = size > 1 ? strtok_r(text, "\n", &save) : NULL; line && ok;
         line = strtok_r(NULL, "\n", &save)) {
        if (argc >= FUZZ_CLI_MAX_ARGS || line[0] == '/' || strstr(line, "..") || !numbers_small(line)) {
            ok = false;
            break;
        }
        char buf[FUZZ_CLI_MAX_ARG];
        if (!substitute(line, reader, buf, sizeof buf)) {
            ok = false;
            break;
        }
        argv[argc++] = strdup(buf);
    }
    argv[argc] = NULL;
    free(text);
    if (ok) {
        char *copy[FUZZ_CLI_MAX_ARGS + 2];   /* the command may permute argv (getopt) */
        memcpy(copy, argv, sizeof copy);
        int rc = commands[cmd](argc, copy);
        if (!(rc == 0 || rc == 1 || rc == 2 || rc == 3 || (cmd == 0 && (rc == 4 || rc == 130 || rc == 143)))) {
            fprintf(stderr, "fuzz_cli: %s returned undocumented exit code %d\n", names[cmd], rc);
            abort();
        }
    }
    for (int i = 0; i < argc; i++) free(argv[i]);
    wipe_scratch();
    restore_fixture_traces(false);
    return 0;
}

#ifndef AR_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return ar_fuzz_cli_one(data, size);
}
#endif
