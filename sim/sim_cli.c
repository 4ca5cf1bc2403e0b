/* sim_cli.c - the `attnreplay sim` command: parses the command line, loads the workload,
 * sizes the KV cache from a model preset, runs the simulator step by step while writing the
 * trace, then writes the per-request metrics and prints the summary.
 *
 * --sweep FILE runs one simulation per line of FILE (the line's options added to the command
 * line's, %i in --out and --metrics naming the row), and spreads the rows over ranks the way
 * replay spreads steps (--shard i/N or the launcher's environment, replay/shard.h): shard i runs
 * the rows r with r % N == i.  A simulation is sequential, so a row is the unit; a job array of
 * one task per row (sbatch --array=0-ROWS-1) runs them all at once.
 *
 * The trace goes to TRACE.tmp-PID beside TRACE and is renamed to TRACE once the run, its
 * metrics included, has succeeded; a run that stops early (bad input found part-way, a write
 * error, SIGINT, SIGTERM or SIGHUP) removes it, so TRACE is either the whole new trace or what
 * was there before.  A TRACE that is a symlink, pipe or device (/dev/stdout) is written in
 * place. */
#include "sim.h"
#include "../replay/shard.h"
#include "../traces/tmp_guard.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: attnreplay sim --workload KIND:ARG --model PRESET --out TRACE [options]\n"
            "  --workload mooncake:PATH | azure:PATH | vllm-run:PATH | synthetic:SPEC\n"
            "      SPEC: groups=G,prompts=P,system=S,question=Q,output=O[,rate=R][,arrival=poisson|gamma][,cv=C][,seed=X]\n"
            "         or n=N,input=I,output=O[,rate=R][,arrival=...]\n"
            "  --model PRESET            %s\n"
            "  --num-blocks N            KV blocks including the null block 0 (default 32768; 2 .. 2^24)\n"
            "  --kv-mem SIZE             KV memory (e.g. 5.4GiB, 40GB, 123456789); blocks = SIZE / bytes per block\n"
            "  --block-size B            tokens per block (default 16; 1 .. 4096)\n"
            "  --max-num-batched-tokens N  token budget per step (default 2048, vLLM SchedulerConfig; up to 2^30)\n"
            "  --max-num-seqs N          (default 128; 1 .. 2^20)\n"
            "  --long-prefill-token-threshold N  (default 0 = off)\n"
            "  --max-model-len N         (default 0 = unlimited)\n"
            "  --no-prefix-caching\n"
            "  older vLLM behaviour (default: vLLM 0.33's; sim/README.md):\n"
            "  --no-reserve-full-isl     admit a request when its first chunk fits (scheduler_reserve_full_isl off)\n"
            "  --threshold-when-alone    --long-prefill-token-threshold caps a request even when it is the only one\n"
            "  --fifo-free               freed blocks all join the free queue's tail (0.33: unhashed ones its head)\n"
            "  --time-scale X            multiply arrival times by X (default 1)\n"
            "  --limit N                 first N requests only\n"
            "  --step-time MODEL         constant:S | linear:A,B,C,D | roofline:DEVICE[,gemm_eff=E,attn_eff=E,bw_eff=E,kv_eff=E,gap=S,overhead=S,per_req=S,tp=N]\n"
            "                            fitted:DB[,run=ID][,device=DEVICE][,roofline keys]: attention term fitted to a replay DB\n"
            "                            profile:DB[,device=DEVICE][,roofline keys]: GEMMs and attention from `attnreplay profile`\n"
            "                            more roofline keys: graph=N (CUDA-graph limit), async=0|1, link_bw=B/s, link_lat=S\n"
            "                            (default constant:0.02; devices: %s)\n"
            "  --kv-dtype T              bf16 (default), fp16, fp8_e4m3, fp32\n"
            "  --seed N                  written to the trace header (default 1)\n"
            "  --out TRACE               trace file (.jsonl or .jsonl.gz); written beside it, renamed\n"
            "                            to TRACE only when the run succeeds (a pipe or device: in place)\n"
            "  --metrics FILE            per-request table: .db/.sqlite = SQLite, else CSV (+ FILE.kv.csv)\n"
            "  --quiet                   no summary on stdout\n"
            "  --sweep FILE              one simulation per line of FILE: the line's options are added to\n"
            "                            these; %%i in --out and --metrics is the row (0, 1, ...); '#' starts\n"
            "                            a comment.  Rows are spread over ranks: --shard i/N or the\n"
            "                            launcher's environment (Slurm, Open MPI, PMI, torchrun) runs rows\n"
            "                            r %% N == i\n"
            "  Exit status: 0 done (a warning on stderr when the offered load exceeds what the engine\n"
            "  serves), 1 an I/O error while writing, 2 usage error or bad input (FILE:LINE: rule; a\n"
            "  --metrics database locked by another writer past ATTNREPLAY_BUSY_TIMEOUT_MS, default\n"
            "  30000), 3 the summary could not be written to stdout (TRACE and --metrics are written;\n"
            "  a 1 or 2 stays, said on stderr too).\n",
            ar_model_preset_names(), ar_device_names());
}

static int parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

double ar_parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0) || !isfinite(v)) return -1;
    struct { const char *suffix; double mult; } units[] = {
        {"", 1}, {"B", 1}, {"K", 1e3}, {"KB", 1e3}, {"KiB", 1024.0}, {"M", 1e6}, {"MB", 1e6},
        {"MiB", 1048576.0}, {"G", 1e9}, {"GB", 1e9}, {"GiB", 1073741824.0}, {"T", 1e12}, {"TB", 1e12},
        {"TiB", 1099511627776.0},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end, units[i].suffix) == 0) return v * units[i].mult;
    return -1;
}

/* The file a workload spec reads: PATH of KIND:PATH, a vllm-run directory's requests.jsonl;
 * "" for synthetic workloads. */
static void workload_file(const char *spec, char *buf, size_t len)
{
    buf[0] = 0;
    const char *colon = strchr(spec, ':');
    if (!colon || strncmp(spec, "synthetic:", 10) == 0) return;
    struct stat st;
    if (stat(colon + 1, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(buf, len, "%s/requests.jsonl", colon + 1);
    else snprintf(buf, len, "%s", colon + 1);
}

/* ---- the trace's temporary file ---------------------------------------------------------------- */

/* Where the trace is written first: out itself when out is a symlink, pipe or device (written in
 * place, as before), else out.tmp-PID in out's directory, which finish_tmp_trace renames. */
static bool trace_goes_through_tmp(const char *out)
{
    struct stat st;
    if (lstat(out, &st) != 0) return errno == ENOENT;
    return S_ISREG(st.st_mode);
}

/* Renames the temporary trace tmp to out (ok) or removes it, and puts the signal handlers
 * back.  Returns 0, or 1 after saying why the rename failed. */
static int finish_tmp_trace(ar_tmp_guard *g, const char *tmp, const char *out, bool ok)
{
    if (ar_tmp_guard_finish(g, ok ? out : NULL) == 0) return 0;
    fprintf(stderr, "sim: %s: cannot rename %s into place: %s\n", out, tmp, strerror(errno));
    return 1;
}

/* Every file the run will write, checked before the workload is read: writable, none of them
 * the workload itself, no two the same.  Returns 0 or 2 (after saying why on stderr). */
static int check_outputs(const char *workload, const char *out, const char *metrics)
{
    char input[4096], kv[4200], err[4400];
    workload_file(workload, input, sizeof input);
    const char *paths[3] = { out, metrics, NULL };
    static const char *const names[3] = { "--out", "--metrics", "--metrics (its KV table)" };
    if (metrics && !ar_sim_metrics_is_sqlite(metrics)) {
        snprintf(kv, sizeof kv, "%s.kv.csv", metrics);
        paths[2] = kv;
    }
    for (int i = 0; i < 3; i++) {
        if (!paths[i]) continue;
        if (input[0] && ar_same_file(paths[i], input)) {
            fprintf(stderr, "sim: %s %s is the workload file; writing it would destroy the input\n", names[i], paths[i]);
            return 2;
        }
        for (int j = 0; j < i; j++)
            if (paths[j] && (strcmp(paths[i], paths[j]) == 0 || ar_same_file(paths[i], paths[j]))) {
                fprintf(stderr, "sim: %s and %s name the same file %s\n", names[j], names[i], paths[i]);
                return 2;
            }
        if (ar_output_file_check(paths[i], err, sizeof err) != 0) {
            fprintf(stderr, "sim: %s %s\n", names[i], err);
            return 2;
        }
    }
    if (metrics && ar_sim_metrics_check(metrics, err, sizeof err) != 0) {
        fprintf(stderr, "sim: --metrics %s\n", err);
        return 2;
    }
    if (trace_goes_through_tmp(out)) {   /* the trace is written beside TRACE, then renamed */
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out, (long)getpid());
        if (ar_output_file_check(tmp, err, sizeof err) != 0) {
            fprintf(stderr, "sim: --out %s: the trace is written beside it first, and %s\n", out, err);
            return 2;
        }
    }
    return 0;
}

static int sim_one(int argc, char **argv)
{
    const char *workload = NULL, *model = NULL, *out = NULL, *metrics = NULL, *kv_mem = NULL;
    const char *step_time = "constant:0.02", *kv_dtype_name = "bf16";
    int num_blocks = 0, block_size = 0, max_batched = 2048, max_seqs = 128, threshold = 0, max_model_len = 0;
    int limit = 0, seed = 1;
    bool prefix_caching = true, quiet = false;
    ar_sim_compat compat = {0};
    double time_scale = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { usage(stdout); return 0; }
        if (strcmp(a, "--no-prefix-caching") == 0) { prefix_caching = false; continue; }
        if (strcmp(a, "--quiet") == 0) { quiet = true; continue; }
        if (strcmp(a, "--no-reserve-full-isl") == 0) { compat.no_reserve_full_isl = true; continue; }
        if (strcmp(a, "--threshold-when-alone") == 0) { compat.threshold_when_alone = true; continue; }
        if (strcmp(a, "--fifo-free") == 0) { compat.fifo_free = true; continue; }
        if (!v) {
            fprintf(stderr, "sim: %s needs a value (or is unknown)\n", a);
            usage(stderr);
            return 2;
        }
        i++;
        if (strcmp(a, "--workload") == 0) workload = v;
        else if (strcmp(a, "--model") == 0) model = v;
        else if (strcmp(a, "--out") == 0) out = v;
        else if (strcmp(a, "--metrics") == 0) metrics = v;
        else if (strcmp(a, "--kv-mem") == 0) kv_mem = v;
        else if (strcmp(a, "--step-time") == 0) step_time = v;
        else if (strcmp(a, "--kv-dtype") == 0) kv_dtype_name = v;
        /* the trace reader's header ranges (traces/trace.h), so the trace written reads back */
        else if (strcmp(a, "--num-blocks") == 0) bad = parse_int(v, 2, AR_TRACE_MAX_NUM_BLOCKS, &num_blocks);
        else if (strcmp(a, "--block-size") == 0) bad = parse_int(v, 1, AR_TRACE_MAX_BLOCK_SIZE, &block_size);
        else if (strcmp(a, "--max-num-batched-tokens") == 0) bad = parse_int(v, 1, AR_TRACE_MAX_TOKENS, &max_batched);
        else if (strcmp(a, "--max-num-seqs") == 0) bad = parse_int(v, 1, AR_TRACE_MAX_NUM_SEQS, &max_seqs);
        else if (strcmp(a, "--long-prefill-token-threshold") == 0) bad = parse_int(v, 0, 1 << 30, &threshold);
        else if (strcmp(a, "--max-model-len") == 0) bad = parse_int(v, 0, 1 << 30, &max_model_len);
        else if (strcmp(a, "--limit") == 0) bad = parse_int(v, 0, 1 << 30, &limit);
        else if (strcmp(a, "--seed") == 0) bad = parse_int(v, 0, 1 << 30, &seed);
        else if (strcmp(a, "--time-scale") == 0) {
            char *end;
            time_scale = strtod(v, &end);
            bad = end == v || *end || !(time_scale > 0) || !isfinite(time_scale);
        } else {
            fprintf(stderr, "sim: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "sim: bad value '%s' for %s (see the ranges in `attnreplay sim --help`)\n", v, a);
            return 2;
        }
    }
    if (!workload || !model || !out) {
        fprintf(stderr, "sim: --workload, --model and --out are required\n");
        usage(stderr);
        return 2;
    }
    const ar_model_preset *preset = ar_model_preset_find(model);
    if (!preset) {
        fprintf(stderr, "sim: unknown --model %s (%s)\n", model, ar_model_preset_names());
        return 2;
    }
    if (check_outputs(workload, out, metrics) != 0) return 2;
    if (num_blocks > 0 && kv_mem) {
        fprintf(stderr, "sim: give --num-blocks or --kv-mem, not both\n");
        return 2;
    }
    ar_dtype kv_dtype;
    if (ar_dtype_parse(kv_dtype_name, AR_BF16, &kv_dtype) != 0) {
        fprintf(stderr, "sim: unknown --kv-dtype %s\n", kv_dtype_name);
        return 2;
    }
    if (block_size == 0) block_size = preset->default_block_size;
    if (kv_mem) {
        double bytes = ar_parse_size(kv_mem);
        if (bytes < 0) {
            fprintf(stderr, "sim: bad --kv-mem '%s' (e.g. 5.4GiB, 40GB, 123456789)\n", kv_mem);
            return 2;
        }
        double per_block = (double)ar_kv_bytes_per_block(&preset->model, block_size, kv_dtype);
        double nb = floor(bytes / per_block);
        if (nb < 2 || nb > AR_TRACE_MAX_NUM_BLOCKS) {
            fprintf(stderr, "sim: --kv-mem %s gives %.0f blocks of %.0f bytes; need 2 .. %d\n", kv_mem, nb, per_block,
                    AR_TRACE_MAX_NUM_BLOCKS);
            return 2;
        }
        num_blocks = (int)nb;
    }
    if (num_blocks == 0) num_blocks = 32768;

    char err[AR_ERR_MAX + 4096];
    ar_sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (ar_steptime_parse(step_time, preset, &cfg.steptime, err, sizeof err) != 0) {
        fprintf(stderr, "sim: %s\n", err);
        return 2;
    }
    cfg.steptime.kv_dtype = kv_dtype;
    ar_steptime_set_engine(&cfg.steptime, max_seqs);
    if (cfg.steptime.kind == AR_STEPTIME_FITTED && !quiet) {
        const double *c = cfg.steptime.fit_coef;
        printf("sim: attention time fitted on %d replayed steps: %.3g + %.3g*tokens + %.3g*requests + %.3g*kv_tokens s\n",
               cfg.steptime.fit_steps, c[0], c[1], c[2], c[3]);
    }
    ar_workload wl;
    int rc = ar_workload_load(workload, block_size, time_scale, limit, &wl, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "sim: %s\n", err);
        return 2;
    }
    ar_trace_header *h = &cfg.header;
    h->version = AR_TRACE_VERSION;
    h->model = preset->model;
    h->cache.block_size = block_size;
    h->cache.num_blocks = num_blocks;
    h->cache.dtype = AR_BF16;
    h->cache.kv_cache_dtype = kv_dtype;
    h->sched.max_num_batched_tokens = max_batched;
    h->sched.max_num_seqs = max_seqs;
    h->sched.prefix_caching = prefix_caching;
    h->sched.cascade = false;
    snprintf(h->source, sizeof h->source, "sim:%s", wl.source);
    h->seed = (uint64_t)seed;
    cfg.long_prefill_token_threshold = threshold;
    cfg.max_model_len = max_model_len;
    cfg.compat = compat;
    cfg.num_sms = cfg.steptime.kind == AR_STEPTIME_ROOFLINE || cfg.steptime.kind == AR_STEPTIME_PROFILE
                      ? cfg.steptime.device.num_sms : 132;

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ar_sim *s = ar_sim_check_any_fits(&wl, num_blocks, block_size, max_model_len, err, sizeof err) == 0
                    ? ar_sim_create(&cfg, &wl, err, sizeof err) : NULL;
    if (!s) {
        fprintf(stderr, "sim: %s\n", err);
        ar_workload_free(&wl);
        return 2;
    }
    const bool via_tmp = trace_goes_through_tmp(out);
    ar_tmp_guard guard;
    char tmp[4200];
    struct stat old_st;
    const bool had_old = via_tmp && stat(out, &old_st) == 0;
    size_t out_len = strlen(out);
    const bool gz = out_len >= 3 && strcmp(out + out_len - 3, ".gz") == 0;
    if (via_tmp) {
        snprintf(tmp, sizeof tmp, "%s.tmp-%ld", out, (long)getpid());
        ar_tmp_guard_arm(&guard, tmp);
    }
    ar_trace_writer *w = ar_trace_create_as(via_tmp ? tmp : out, gz, h, err, sizeof err);
    if (!w) {
        fprintf(stderr, "sim: %s\n", err);
        if (via_tmp) finish_tmp_trace(&guard, tmp, out, false);
        ar_sim_destroy(s);
        ar_workload_free(&wl);
        return 1;
    }
    if (had_old) chmod(tmp, old_st.st_mode & 07777);   /* the trace it replaces keeps its mode */
    rc = 0;
    /* a progress line on a terminal only (every 4096 steps, so it costs nothing) */
    const bool progress = !quiet && isatty(STDERR_FILENO);
    for (;;) {
        const ar_step *step;
        int r = ar_sim_step(s, &step, err, sizeof err);
        if (r == 0) break;
        if (progress && r > 0 && (step->step & 4095) == 0)
            fprintf(stderr, "\r  sim step %lld, simulated time %.1f s   ", (long long)step->step, step->time);
        if (r < 0) {
            fprintf(stderr, "sim: %s\n", err);
            rc = r == -2 ? 2 : 1;   /* -2: inputs that cannot be simulated (bad input) */
            break;
        }
        if (ar_trace_write_step(w, step, err, sizeof err) != 0) {
            fprintf(stderr, "sim: %s: %s\n", out, err);
            rc = 1;
            break;
        }
    }
    if (progress) fputc('\n', stderr);
    if (ar_trace_finish(w, err, sizeof err) != 0 && rc == 0) {
        fprintf(stderr, "sim: %s: %s\n", out, err);
        rc = 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc == 0 && metrics && (rc = ar_sim_write_metrics(s, metrics, err, sizeof err)) != 0) {
        fprintf(stderr, "sim: %s\n", err);
        rc = rc == 2 ? 2 : 1;   /* 2: the database locked by another writer past the busy timeout */
    }
    if (via_tmp) {   /* TRACE only when the whole run succeeded; else it stays as it was */
        int frc = finish_tmp_trace(&guard, tmp, out, rc == 0);
        if (rc == 0) rc = frc;
    }
    if (rc == 0 && !quiet) {
        printf("sim: %s (%d requests) on %s, %d blocks x %d tokens, budget %d, max_num_seqs %d, prefix caching %s, step time %s\n",
               workload, wl.num_reqs, preset->name, num_blocks, block_size, max_batched, max_seqs,
               prefix_caching ? "on" : "off", step_time);
        ar_sim_print_summary(s, stdout);
        fflush(stdout);
        printf("  wall time (simulate + write trace): %.3f s -> %s\n",
               (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec), out);
    }
    if (rc == 0) {   /* even with --quiet: an overloaded run's latencies mislead */
        ar_sim_load load;
        ar_sim_load_check(s, &load);
        if (load.overloaded) {
            char warning[1024];
            ar_sim_load_warning(&load, warning, sizeof warning);
            fprintf(stderr, "sim: warning: %s.\n", warning);
        }
    }
    ar_sim_destroy(s);
    ar_workload_free(&wl);
    return rc;
}

/* ---- --sweep: one simulation per row, rows spread over ranks ---------------------------------- */

#define SIM_SWEEP_MAX_ARGS 256

extern char **environ;

/* Replaces %i in text by row into out; false when too long. */
static bool expand_row(const char *text, int row, char *out, size_t len)
{
    size_t at = 0;
    for (const char *p = text; *p; p++) {
        if (at + 1 >= len) return false;
        if (p[0] == '%' && p[1] == 'i') {
            int n = snprintf(out + at, len - at, "%d", row);
            if (n < 0 || (size_t)n >= len - at) return false;
            at += (size_t)n;
            p++;
        } else {
            out[at++] = *p;
        }
    }
    out[at] = '\0';
    return true;
}

static int sim_sweep(int argc, char **argv, const char *sweep, const char *shard_text)
{
    char err[512];
    ar_launch launch;
    if (ar_launch_detect(shard_text, environ, &launch, err, sizeof err) != 0) {
        fprintf(stderr, "sim: %s\n", err);
        return 2;
    }
    FILE *f = fopen(sweep, "r");
    if (!f) {
        fprintf(stderr, "sim: --sweep %s: cannot read: %s\n", sweep, strerror(errno));
        return 2;
    }
    bool out_has_row = false;
    for (int i = 1; i + 1 < argc; i++)
        if ((!strcmp(argv[i], "--out") || !strcmp(argv[i], "--metrics")) && strstr(argv[i + 1], "%i"))
            out_has_row = true;
    char *line = NULL;   /* getline: a line of any length is one row (fgets split long ones in two) */
    size_t line_cap = 0;
    int row = 0, worst = 0, ran = 0, lineno = 0;
    while (getline(&line, &line_cap, f) >= 0) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char *words[SIM_SWEEP_MAX_ARGS];
        int n = 0;
        for (char *tok = strtok(line, " \t\r\n"); tok && n < SIM_SWEEP_MAX_ARGS; tok = strtok(NULL, " \t\r\n"))
            words[n++] = tok;
        if (n == 0) continue;
        const int this_row = row++;
        if (!out_has_row && this_row > 0) {
            fprintf(stderr, "sim: --sweep %s has more than one row: give --out (and --metrics) a %%i for the row, "
                    "or every row writes the same file\n", sweep);
            free(line);
            fclose(f);
            return 2;
        }
        if (!ar_shard_owns((size_t)this_row, launch.shard, launch.count)) continue;
        if (argc + n >= SIM_SWEEP_MAX_ARGS) {
            fprintf(stderr, "sim: --sweep %s:%d: too many options\n", sweep, lineno);
            free(line);
            fclose(f);
            return 2;
        }
        char expanded[2][4096];
        char *row_argv[SIM_SWEEP_MAX_ARGS + 1];
        int m = 0, used = 0;
        for (int i = 0; i < argc; i++) {
            if (!strcmp(argv[i], "--sweep") || !strcmp(argv[i], "--shard")) {
                i++;
                continue;
            }
            bool file_opt = i > 0 && (!strcmp(argv[i - 1], "--out") || !strcmp(argv[i - 1], "--metrics"));
            if (file_opt && used < 2) {
                if (!expand_row(argv[i], this_row, expanded[used], sizeof expanded[used])) {
                    fprintf(stderr, "sim: %s: too long\n", argv[i]);
                    free(line);
                    fclose(f);
                    return 2;
                }
                row_argv[m++] = expanded[used++];
            } else {
                row_argv[m++] = argv[i];
            }
        }
        for (int k = 0; k < n; k++) row_argv[m++] = words[k];
        row_argv[m] = NULL;
        printf("sim: row %d of %s (line %d)%s%s:", this_row, sweep, lineno, launch.count > 1 ? ", " : "",
               launch.count > 1 ? launch.detail : "");
        for (int k = 0; k < n; k++) printf(" %s", words[k]);
        printf("\n");
        fflush(stdout);
        int rc = sim_one(m, row_argv);
        if (rc != 0) fprintf(stderr, "sim: row %d of %s (line %d) ended with exit status %d\n", this_row, sweep,
                             lineno, rc);
        if (rc > worst) worst = rc;
        ran++;
    }
    const int read_errno = ferror(f) ? (errno ? errno : EIO) : 0;
    free(line);
    fclose(f);
    if (read_errno) {
        fprintf(stderr, "sim: --sweep %s: read error after line %d: %s\n", sweep, lineno, strerror(read_errno));
        return 2;
    }
    if (row == 0) {
        fprintf(stderr, "sim: --sweep %s has no rows\n", sweep);
        return 2;
    }
    if (launch.count > 1)
        printf("sim: shard %d/%d ran %d of the %d rows of %s\n", launch.shard, launch.count, ran, row, sweep);
    return worst;
}

int ar_sim_main(int argc, char **argv)
{
    const char *sweep = NULL, *shard_text = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return sim_one(argc, argv);
        if ((!strcmp(argv[i], "--sweep") || !strcmp(argv[i], "--shard")) && i + 1 < argc) {
            if (!strcmp(argv[i], "--sweep")) sweep = argv[i + 1];
            else shard_text = argv[i + 1];
            i++;
        }
    }
    if (!sweep && shard_text) {
        fprintf(stderr, "sim: --shard spreads the rows of --sweep FILE; one simulation is not split\n");
        return 2;
    }
    if (sweep) return sim_sweep(argc, argv, sweep, shard_text);
    return sim_one(argc, argv);
}
