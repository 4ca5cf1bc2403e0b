/* test_cli.c - the command line of bin/attnreplay (replay/main.c): every command answers -h and
 * --help alike (usage on stdout naming its exit codes, nothing on stderr, exit 0, nothing
 * created), a usage error prints the usage on stderr with exit 2, and `version` says what was
 * built (code revision, trace format, build type, CUDA runtime and driver).  Output that cannot
 * be written (stdout on /dev/full, or closed) is exit 3 with the reason; the commands that write
 * files or a database (report, plan, sim, export, replay, merge, calibrate) still write them
 * whole first and keep a failure code of their own.  The top-level help
 * lists exactly the commands tested here, and the README's Commands block names every command
 * and every option of `replay --help`. */
#include "testutil.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../reports/plot.h"
#include "../traces/trace.h"

static const char *const commands[] = {
    "info", "replay", "merge", "backends", "sim", "report", "diff", "plan", "calibrate", "profile",
    "gen-samples", "export", "version",
};
#define NUM_COMMANDS (sizeof commands / sizeof commands[0])

/* Runs `attnreplay ARGS` inside a fresh directory; returns the exit status, stdout and stderr
 * (malloc'd) and whether the directory is still empty afterwards. */
static int run_in_empty_dir(const char *args, char **out, char **err, int *dir_empty)
{
    static int serial;
    char dir[1024], out_path[1200], err_path[1200];
    snprintf(dir, sizeof dir, "%s/cwd%d", tu_tmpdir(), serial++);
    snprintf(out_path, sizeof out_path, "%s.out", dir);
    snprintf(err_path, sizeof err_path, "%s.err", dir);
    char bin[PATH_MAX];
    if (!realpath(tu_bin(), bin)) fail_msg("no binary at %s", tu_bin());
    int rc = tu_run(NULL, "mkdir -p '%s' && cd '%s' && '%s' %s >'%s' 2>'%s'", dir, dir, bin, args, out_path, err_path);
    *out = tu_slurp(out_path);
    *err = tu_slurp(err_path);
    assert_non_null(*out);
    assert_non_null(*err);
    char count_path[1200];
    snprintf(count_path, sizeof count_path, "%s.count", dir);
    tu_run(NULL, "ls -A '%s' | wc -l >'%s'", dir, count_path);
    char *count = tu_slurp(count_path);
    *dir_empty = count && atoi(count) == 0;
    free(count);
    return rc;
}

static void test_help_every_command(void **state)
{
    (void)state;
    static const char *const forms[] = { "-h", "--help", "--frobnicate -h", "x y --help" };
    for (size_t c = 0; c < NUM_COMMANDS; c++) {
        for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
            char args[256], want[128];
            snprintf(args, sizeof args, "%s %s", commands[c], forms[f]);
            snprintf(want, sizeof want, "usage: attnreplay %s", commands[c]);
            char *out, *err;
            int empty;
            int rc = run_in_empty_dir(args, &out, &err, &empty);
            bool exit_codes = strstr(out, "Exit status") || strstr(out, "exit:") || !strcmp(commands[c], "version");
            if (rc != 0 || !strstr(out, want) || err[0] || !empty || !exit_codes)
                fail_msg("'attnreplay %s': rc %d, dir %s, stdout '%.300s', stderr '%.300s'", args, rc,
                         empty ? "empty" : "NOT empty", out, err);
            free(out);
            free(err);
        }
    }
    /* the top level too */
    char *out, *err;
    int empty;
    assert_int_equal(run_in_empty_dir("--help", &out, &err, &empty), 0);
    assert_non_null(strstr(out, "usage: attnreplay COMMAND"));
    assert_string_equal(err, "");
    free(out);
    free(err);
}

static void test_usage_errors_exit_2_on_stderr(void **state)
{
    (void)state;
    static const char *const lines[][2] = {
        { "info", "usage: attnreplay info" },
        { "info a.trace b.trace", "usage: attnreplay info" },
        { "backends --bogus", "usage: attnreplay backends" },
        { "gen-samples", "usage: attnreplay gen-samples" },
        { "sim --frobnicate", "usage: attnreplay sim" },
        { "nosuchcommand", "unknown command" },
        { "", "usage: attnreplay COMMAND" },
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        char *out, *err;
        int empty;
        int rc = run_in_empty_dir(lines[i][0], &out, &err, &empty);
        if (rc != 2 || out[0] || !strstr(err, lines[i][1]) || !empty)
            fail_msg("'attnreplay %s': rc %d, stdout '%.200s', stderr '%.200s'", lines[i][0], rc, out, err);
        free(out);
        free(err);
    }
}

static void test_version(void **state)
{
    (void)state;
    for (int form = 0; form < 2; form++) {
        char *out, *err;
        int empty;
        assert_int_equal(run_in_empty_dir(form ? "--version" : "version", &out, &err, &empty), 0);
        char want[64];
        snprintf(want, sizeof want, "\ntrace format v%d\n", AR_TRACE_VERSION);
        if (strncmp(out, "attnreplay ", 11) != 0 || !strstr(out, want) || !strstr(out, "\nbuild: ") ||
            !strstr(out, "\nCUDA runtime ") || !strstr(out, "driver "))
            fail_msg("version output '%s'", out);
        /* a build with CUDA names its kernels' architectures and the runtime's version; one
         * without says so; on a machine without a GPU the driver or device is "none" */
        if (strstr(out, "CUDA kernels for")) assert_null(strstr(out, "CUDA runtime none"));
        else assert_non_null(strstr(out, "build: CPU only"));
        if (access("/dev/nvidia0", F_OK) != 0) assert_true(strstr(out, "driver none") || strstr(out, "device none"));
        assert_string_equal(err, "");
        free(out);
        free(err);
    }
    /* it takes no arguments: one is a usage error, not ignored */
    char *out, *err;
    int empty;
    assert_int_equal(run_in_empty_dir("version --bogus", &out, &err, &empty), 2);
    if (out[0] || !strstr(err, "unexpected argument '--bogus'") || !strstr(err, "usage: attnreplay version"))
        fail_msg("stdout '%s', stderr '%s'", out, err);
    free(out);
    free(err);
}

/* stdout on a full device or closed: what the command prints is lost, so it must not exit 0
 * (or 2, "a bad trace"): exit 3 and the system's reason on stderr. */
static void test_stdout_full_or_closed(void **state)
{
    (void)state;
    if (access("/dev/full", W_OK) != 0) {
        skip();
        return;
    }
    char trace[1024], big[1024], bin[PATH_MAX], err_path[1200];
    tu_sample("mixed", trace, sizeof trace);
    tu_sample("vllm", big, sizeof big);
    if (!realpath(tu_bin(), bin)) fail_msg("no binary at %s", tu_bin());
    tu_tmp("stdout-full.err", err_path, sizeof err_path);
    static const struct { const char *args; int trace; } lines[] = {
        { "info", 1 }, { "info --steps", 1 }, { "info --steps", 2 }, { "info --help", 0 },
        { "backends", 0 }, { "backends --trace", 1 }, { "version", 0 }, { "--help", 0 },
    };
    static const struct { const char *redirect, *reason; } outputs[] = {
        { ">/dev/full", "(No space left on device)" },
        { ">&-", "(Bad file descriptor)" },
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        for (size_t o = 0; o < sizeof outputs / sizeof outputs[0]; o++) {
            char args[2200];
            snprintf(args, sizeof args, "%s '%s'", lines[i].args,
                     lines[i].trace == 0 ? "" : lines[i].trace == 1 ? trace : big);
            if (lines[i].trace == 0) args[strlen(lines[i].args)] = '\0';
            int rc = tu_run(NULL, "'%s' %s %s 2>'%s'", bin, args, outputs[o].redirect, err_path);
            char *err = tu_slurp(err_path);
            assert_non_null(err);
            if (rc != 3 || !strstr(err, "cannot write the output ") || !strstr(err, outputs[o].reason))
                fail_msg("'attnreplay %s %s': rc %d, stderr '%.300s'", args, outputs[o].redirect, rc, err);
            free(err);
        }
    }
}

/* Runs `attnreplay ARGS REDIRECT` (stderr to err_path); returns the exit status and, when want_rc
 * is not 0, fails unless it is want_rc and stderr holds "attnreplay CMD: cannot write the output
 * to stdout (" and the reason (any reason when reason is NULL: a help longer than stdio's buffer
 * loses the failed write's errno). */
static int run_summary(const char *args, const char *redirect, const char *err_path, int want_rc,
                       const char *cmd, const char *reason)
{
    char bin[PATH_MAX];
    if (!realpath(tu_bin(), bin)) fail_msg("no binary at %s", tu_bin());
    int rc = tu_run(NULL, "'%s' %s %s 2>'%s'", bin, args, redirect, err_path);
    if (want_rc == 0) return rc;
    char *err = tu_slurp(err_path);
    assert_non_null(err);
    char said[128];
    snprintf(said, sizeof said, "attnreplay %s: cannot write the output to stdout (", cmd);
    if (rc != want_rc || !strstr(err, said) || (reason && !strstr(err, reason)))
        fail_msg("'attnreplay %s %s': rc %d (want %d), stderr '%.400s'", args, redirect, rc, want_rc, err);
    free(err);
    return rc;
}

/* report, plan, sim, export, replay, merge and calibrate write their product to files or a
 * database and print a summary: with stdout on a full device or closed they used to exit 0 with
 * the summary lost.  Now the product is written whole (the same bytes, rows and status as with a
 * working stdout), then the exit is 3 naming the command and stdout; a code of the command's own
 * (a failed verification 1, nothing verified 4, bad input 2; a plot that gnuplot could not
 * render 1) stays, the lost summary said all the same. */
static void test_summary_stdout_full_or_closed(void **state)
{
    (void)state;
    if (access("/dev/full", W_OK) != 0) {
        skip();
        return;
    }
    char trace[1024], dir[1024], err_path[1200], out_path[1200], args[4096];
    tu_sample("mixed", trace, sizeof trace);
    snprintf(dir, sizeof dir, "%s/summary", tu_tmpdir());
    assert_int_equal(tu_run(NULL, "mkdir -p '%s'", dir), 0);
    snprintf(err_path, sizeof err_path, "%s/err", dir);
    snprintf(out_path, sizeof out_path, ">'%s/out'", dir);
    const int plots = ar_plot_have_gnuplot() ? 3 : 1;   /* report and plan: 1 when a plot failed */
    static const char *const sim_args =
        "sim --workload synthetic:n=20,input=100,output=10 --model llama-3.1-8b";

    /* what a working stdout gives: the baselines the runs below must match */
    char base_db[1200];
    snprintf(base_db, sizeof base_db, "%s/base.db", dir);
    snprintf(args, sizeof args, "replay '%s' --backend cpu --db '%s'", trace, base_db);
    assert_int_equal(run_summary(args, out_path, err_path, 0, NULL, NULL), 0);
    const int64_t steps = tu_query_int(base_db, "SELECT COUNT(*) FROM steps WHERE run = 1");
    assert_true(steps > 0);
    for (int shard = 0; shard < 2; shard++) {
        snprintf(args, sizeof args, "replay '%s' --backend cpu --shard %d/2 --db '%s/shard%d.db'", trace, shard,
                 dir, shard);
        assert_int_equal(run_summary(args, out_path, err_path, 0, NULL, NULL), 0);
    }
    snprintf(args, sizeof args, "%s --out '%s/base.trace.jsonl.gz' --metrics '%s/base.csv'", sim_args, dir, dir);
    assert_int_equal(run_summary(args, out_path, err_path, 0, NULL, NULL), 0);
    snprintf(args, sizeof args, "export '%s' --format flashinfer-trace --out '%s/base-export'", trace, dir);
    assert_int_equal(run_summary(args, out_path, err_path, 0, NULL, NULL), 0);

    static const struct { const char *name, *redirect, *reason; } outputs[] = {
        { "full", ">/dev/full", "(No space left on device)" },
        { "closed", ">&-", "(Bad file descriptor)" },
    };
    for (size_t o = 0; o < sizeof outputs / sizeof outputs[0]; o++) {
        const char *n = outputs[o].name, *redirect = outputs[o].redirect, *reason = outputs[o].reason;
        char db[1200], path[1400];

        /* replay: the run stored whole and 'passed' */
        snprintf(db, sizeof db, "%s/replay-%s.db", dir, n);
        snprintf(args, sizeof args, "replay '%s' --backend cpu --db '%s'", trace, db);
        run_summary(args, redirect, err_path, 3, "replay", reason);
        tu_query_text(db, "SELECT status FROM runs WHERE id = 1", path, sizeof path);
        assert_string_equal(path, "passed");
        assert_int_equal(tu_query_int(db, "SELECT COUNT(*) FROM steps WHERE run = 1"), steps);
        /* --plan-only prints nothing else */
        snprintf(args, sizeof args, "replay '%s' --backend cpu --shard 0/2 --plan-only", trace);
        run_summary(args, redirect, err_path, 3, "replay", reason);
        /* a failed verification and nothing verified keep their codes; the run is stored as such */
        snprintf(args, sizeof args, "replay '%s' --backend cpu --db '%s' --inject wrong-kv-head", trace, db);
        run_summary(args, redirect, err_path, 1, "replay", reason);
        tu_query_text(db, "SELECT status FROM runs WHERE id = 2", path, sizeof path);
        assert_string_equal(path, "failed");
        snprintf(args, sizeof args, "replay '%s' --backend cpu --db '%s' --steps 9999:", trace, db);
        run_summary(args, redirect, err_path, 4, "replay", reason);

        /* merge: one run of both shards, every step once */
        snprintf(db, sizeof db, "%s/merge-%s.db", dir, n);
        snprintf(args, sizeof args, "merge '%s' '%s/shard0.db' '%s/shard1.db'", db, dir, dir);
        run_summary(args, redirect, err_path, 3, "merge", reason);
        tu_query_text(db, "SELECT status FROM runs WHERE id = 1", path, sizeof path);
        assert_string_equal(path, "passed");
        assert_int_equal(tu_query_int(db, "SELECT COUNT(*) FROM steps WHERE run = 1"), steps);

        /* report: the pages written */
        snprintf(args, sizeof args, "report '%s' --out '%s/report-%s'", base_db, dir, n);
        run_summary(args, redirect, err_path, plots, "report", reason);
        snprintf(path, sizeof path, "%s/report-%s/summary.md", dir, n);
        assert_true(tu_file_has(path, "mixed.trace.jsonl.gz"));
        snprintf(path, sizeof path, "%s/report-%s/index.html", dir, n);
        assert_int_equal(access(path, R_OK), 0);

        /* sim: the trace and the metrics byte for byte as with a working stdout, no temporary
         * file left; the trace passes info */
        snprintf(args, sizeof args, "%s --out '%s/sim-%s.trace.jsonl.gz' --metrics '%s/sim-%s.csv'", sim_args, dir,
                 n, dir, n);
        run_summary(args, redirect, err_path, 3, "sim", reason);
        assert_int_equal(tu_run(NULL, "cmp '%s/base.trace.jsonl.gz' '%s/sim-%s.trace.jsonl.gz' && "
                                      "cmp '%s/base.csv' '%s/sim-%s.csv'", dir, dir, n, dir, dir, n), 0);
        assert_int_equal(tu_run(NULL, "ls '%s' | grep -q tmp-", dir), 1);
        snprintf(args, sizeof args, "info '%s/sim-%s.trace.jsonl.gz'", dir, n);
        assert_int_equal(run_summary(args, out_path, err_path, 0, NULL, NULL), 0);
        /* bad input keeps its 2: alone (nothing printed), and in a --sweep whose first row
         * printed its summary (the sweep flushes after each row's header, so the reason can be
         * gone) */
        snprintf(args, sizeof args, "%s --out '%s/nodir/x.trace.jsonl'", sim_args, dir);
        assert_int_equal(run_summary(args, redirect, err_path, 0, NULL, NULL), 2);
        snprintf(path, sizeof path, "%s/sweep.txt", dir);
        assert_int_equal(tu_write(path, "--seed 1\n--block-size 0\n"), 0);
        snprintf(args, sizeof args, "%s --out '%s/sweep-%s-%%i.trace.jsonl.gz' --sweep '%s'", sim_args, dir, n, path);
        run_summary(args, redirect, err_path, 2, "sim", NULL);
        assert_int_equal(tu_run(NULL, "cmp '%s/base.trace.jsonl.gz' '%s/sweep-%s-0.trace.jsonl.gz'", dir, dir, n), 0);

        /* export: the same files as with a working stdout */
        snprintf(args, sizeof args, "export '%s' --format flashinfer-trace --out '%s/export-%s'", trace, dir, n);
        run_summary(args, redirect, err_path, 3, "export", reason);
        assert_int_equal(tu_run(NULL, "diff -r '%s/base-export' '%s/export-%s' >/dev/null", dir, dir, n), 0);

        /* calibrate with given numbers: the row stored */
        snprintf(db, sizeof db, "%s/cal-%s.db", dir, n);
        snprintf(args, sizeof args, "calibrate --db '%s' --device dev --copy-gbps 100 --bf16-tflops 50", db);
        run_summary(args, redirect, err_path, 3, "calibrate", reason);
        assert_int_equal(tu_query_int(db, "SELECT COUNT(*) FROM ceilings WHERE device = 'dev' AND "
                                          "copy_gbps = 100 AND bf16_tflops = 50"), 1);

        /* profile of the roofline's numbers: the profile stored */
        snprintf(db, sizeof db, "%s/profile-%s.db", dir, n);
        snprintf(args, sizeof args, "profile --synthetic h200 --model llama-3.1-8b --db '%s'", db);
        run_summary(args, redirect, err_path, 3, "profile", reason);
        assert_int_equal(tu_query_int(db, "SELECT COUNT(*) FROM gemm"), 5 * 23);

        /* plan: plan.md written */
        snprintf(args, sizeof args, "plan --workload synthetic:n=50,input=200,output=20 --model llama-3.1-8b "
                 "--device h100 --rates 1,2 --kv-blocks 8192 --out '%s/plan-%s'", dir, n);
        run_summary(args, redirect, err_path, plots, "plan", reason);
        snprintf(path, sizeof path, "%s/plan-%s/plan.md", dir, n);
        assert_true(tu_file_has(path, "# Capacity plan: llama-3.1-8b on h100"));

        /* each one's help: its only output */
        static const char *const cmds[] = { "replay", "merge", "report", "sim", "export", "calibrate", "plan",
                                            "profile" };
        for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
            snprintf(args, sizeof args, "%s --help", cmds[c]);
            run_summary(args, redirect, err_path, 3, cmds[c], NULL);
        }
    }
}

/* The line after line (NULL after the last). */
static const char *next_line(const char *line)
{
    const char *nl = strchr(line, '\n');
    return nl ? nl + 1 : NULL;
}

/* The command names of `attnreplay --help`: each line "  NAME ..." of the command list. */
static int listed_commands(const char *help, char names[][32], int max)
{
    int n = 0;
    for (const char *line = help; line && *line; line = next_line(line)) {
        if (line[0] != ' ' || line[1] != ' ' || line[2] < 'a' || line[2] > 'z') continue;
        size_t len = strcspn(line + 2, " \n");
        if (n < max && len < 32) {
            memcpy(names[n], line + 2, len);
            names[n][len] = '\0';
            n++;
        }
    }
    return n;
}

static void test_help_lists_the_commands(void **state)
{
    (void)state;
    char *out, *err;
    int empty;
    assert_int_equal(run_in_empty_dir("--help", &out, &err, &empty), 0);
    char names[64][32];
    const int n = listed_commands(out, names, 64);
    for (int i = 0; i < n; i++) {
        bool known = false;
        for (size_t c = 0; c < NUM_COMMANDS; c++) known |= !strcmp(names[i], commands[c]);
        if (!known) fail_msg("`attnreplay --help` lists '%s', which this test does not know", names[i]);
    }
    for (size_t c = 0; c < NUM_COMMANDS; c++) {
        bool listed = false;
        for (int i = 0; i < n; i++) listed |= !strcmp(names[i], commands[c]);
        if (!listed) fail_msg("`attnreplay --help` does not list '%s'", commands[c]);
    }
    free(out);
    free(err);
}

/* The README's Commands block (the first ``` block after "## Commands") names every command as
 * "attnreplay NAME" and every option that `replay --help` lists. */
static void test_readme_names_every_command_and_replay_option(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/README.md", tu_src_dir());
    char *readme = tu_slurp(path);
    assert_non_null(readme);
    char *section = strstr(readme, "\n## Commands\n");
    assert_non_null(section);
    char *open = strstr(section, "```\n");
    assert_non_null(open);
    char *close = strstr(open + 4, "```");
    assert_non_null(close);
    *close = '\0';
    const char *block = open + 4;
    for (size_t c = 0; c < NUM_COMMANDS; c++) {
        char want[64];
        snprintf(want, sizeof want, "attnreplay %s", commands[c]);
        if (!strstr(block, want)) fail_msg("README.md's Commands block has no '%s'", want);
    }
    char *out, *err;
    int empty;
    assert_int_equal(run_in_empty_dir("replay --help", &out, &err, &empty), 0);
    int options = 0;
    for (const char *line = out; line && *line; line = next_line(line)) {
        if (strncmp(line, "  --", 4) != 0) continue;
        char opt[64];
        size_t len = strcspn(line + 2, " \n");
        if (len >= sizeof opt - 1) continue;
        memcpy(opt, line + 2, len);
        opt[len] = '\0';
        /* whole options only: "--steps" must not be found inside "--steps-x" */
        bool found = false;
        for (const char *at = block; (at = strstr(at, opt)) != NULL; at += len) {
            const char next = at[len];
            if (!((next >= 'a' && next <= 'z') || next == '-')) { found = true; break; }
        }
        if (!found) fail_msg("README.md's Commands block does not name replay's %s", opt);
        options++;
    }
    assert_true(options >= 20);   /* the help was read */
    free(out);
    free(err);
    free(readme);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_every_command),
        cmocka_unit_test(test_usage_errors_exit_2_on_stderr),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_stdout_full_or_closed),
        cmocka_unit_test(test_summary_stdout_full_or_closed),
        cmocka_unit_test(test_help_lists_the_commands),
        cmocka_unit_test(test_readme_names_every_command_and_replay_option),
    };
    return cmocka_run_group_tests_name("cli", tests, NULL, NULL);
}
