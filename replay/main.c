/* main.c - the attnreplay command line: one binary, one subcommand per job.
 *
 *   info       summarise a trace               (traces/)
 *   replay     replay a trace through a backend, verify, store in SQLite   (replay/)
 *   backends   list the backends and whether each can run a trace          (replay/)
 *   sim        simulate a vLLM V1 scheduler over a workload -> trace       (sim/)
 *   report     plots and tables from a results database                    (reports/)
 *   diff       compare two runs; exit 1 on a regression                    (reports/)
 *   plan       capacity planning from a workload and measured steps        (reports/, sim/)
 *   calibrate  measure the device ceilings (copy GB/s, bf16 TFLOP/s)        (reports/, kernels/)
 *   gen-samples  regenerate the small sample traces                        (traces/)
 *   export     steps as FlashInfer-Trace workloads                          (traces/)
 *   version    code revision, trace format, build type, CUDA runtime and driver
 *
 * Every command answers -h / --help with its usage on stdout and exit 0; a usage error prints
 * the usage on stderr and exits 2.  Every command flushes stdout before it exits: output that
 * could not be written (a full disk, /dev/full, a closed stdout) is exit 3 with the system's
 * reason on stderr.  For info, backends, diff, gen-samples, version and the help that is so
 * whatever else they would have answered (output_done); report, plan, sim, export, replay,
 * merge, calibrate and profile write their product to files or a database and print a summary,
 * so a failure code of their own, once said, is kept (summary_done, stdout_check.h). */
#include <stdbool.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <string.h>

#include "../reports/reports.h"
#include "../sim/sim.h"
#include "../traces/export.h"
#include "../traces/samples.h"
#include "../traces/trace.h"
#include "replay.h"
#include "stdout_check.h"

#ifdef AR_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#ifndef AR_CODE_REV
#define AR_CODE_REV "unknown"
#endif
#ifndef AR_BUILD_TYPE
#define AR_BUILD_TYPE "unknown (built outside the Makefile)"
#endif

static void usage(FILE *f)
{
    fprintf(f,
        "attnreplay - replay LLM-serving scheduler traces through attention kernels and a float64\n"
        "reference, check they agree, and store per-step timings and errors in SQLite.\n\n"
        "usage: attnreplay COMMAND [options]   (COMMAND --help for its options)\n"
        "  info TRACE [--steps]               steps, requests, tokens, prefill/decode mix, prefix hits\n"
        "  replay TRACE --db FILE [...]       replay, verify every step, store results\n"
        "  merge OUT.db SHARD.db...           the shard databases of a sharded replay as one run\n"
        "  backends [--trace TRACE]           the backend table and why each can or cannot run\n"
        "  sim --workload KIND:PATH --model PRESET --out TRACE [...]   scheduler simulator\n"
        "  report DB [--run ID ...] --out DIR plots (PNG, SVG), index.html and summary.md\n"
        "  diff DB RUN_A RUN_B [--threshold 5%%]  step-by-step comparison; exit 1 on a regression\n"
        "  plan --workload SPEC --model PRESET --device DEV --out DIR [--db DB] [--slo ...]\n"
        "                                     capacity plan: fitted step time, simulator sweep, SLO answer\n"
        "  calibrate --db DB [--no-cublas]    measure copy GB/s and bf16 TFLOP/s into table ceilings (GPU)\n"
        "  profile --device DEV --model PRESET --db DB   measure GEMM and attention times for\n"
        "                                     --step-time profile:DB (GPU)\n"
        "  gen-samples DIR                    write the sample traces\n"
        "  export TRACE --steps A:B --format flashinfer-trace --out DIR   steps as FlashInfer-Trace workloads\n"
        "  version (or --version)             code revision, trace format, build, CUDA runtime and driver\n"
        "Every command takes -h / --help (usage on stdout, exit 0).\n");
}

/* True when the arguments ask for help: -h or --help anywhere. */
static bool wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) return true;
    return false;
}

static void info_usage(FILE *f)
{
    fputs("usage: attnreplay info TRACE [--steps]\n"
          "  Reads and checks the whole trace (every rule of traces/trace.c), then prints its header,\n"
          "  steps, requests, token mix, step kinds, context, prefix hits, cascade-eligible steps,\n"
          "  preemptions and duration.\n"
          "  --steps  instead one line per step: step time_s requests tokens prefill_tokens\n"
          "           max_seq_len kv_tokens qk_pairs cascade_eligible (qk_pairs = causal query-key\n"
          "           pairs; x 4 x q heads x head_size = the step's attention FLOPs per layer), to\n"
          "           pick --steps for replay\n"
          "  Exit status: 0 a valid trace, 2 a bad trace (FILE:LINE: rule) or usage error, 3 the output\n"
          "  could not be written (a full disk, a closed stdout).\n", f);
}

static void gen_samples_usage(FILE *f)
{
    fputs("usage: attnreplay gen-samples DIR\n"
          "  Writes the sample traces (traces/samples/) into DIR, creating it if needed (not its\n"
          "  parents).  Each is written to NAME.tmp-PID and renamed to NAME once whole, so a failed\n"
          "  or stopped run leaves no part-written sample.\n"
          "  Exit status: 0 written, 2 usage error or DIR not writable (a full disk included).\n", f);
}

static int info_main(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        info_usage(stdout);
        return 0;
    }
    const char *trace = NULL;
    bool per_step = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--steps") == 0) per_step = true;
        else if (argv[i][0] == '-' || trace) {
            info_usage(stderr);
            return 2;
        } else {
            trace = argv[i];
        }
    }
    if (!trace) {
        info_usage(stderr);
        return 2;
    }
    char err[AR_ERR_MAX];
    if ((per_step ? ar_trace_print_steps(trace, stdout, err, sizeof err)
                  : ar_trace_print_info(trace, stdout, err, sizeof err)) != 0) {
        fprintf(stderr, "attnreplay info: %s\n", err);
        if (ferror(stdout)) {   /* said; what is still buffered is dropped */
            __fpurge(stdout);
            clearerr(stdout);
            return 3;
        }
        return 2;
    }
    return 0;
}

static int gen_samples_main(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        gen_samples_usage(stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        gen_samples_usage(stderr);
        return 2;
    }
    char err[AR_ERR_MAX];
    if (ar_samples_write(argv[1], err, sizeof err) != 0) {
        fprintf(stderr, "attnreplay gen-samples: %s\n", err);
        return 2;
    }
    return 0;
}

/* `attnreplay version`: what was built and what it runs on. */
static void version_usage(FILE *f)
{
    fputs("usage: attnreplay version (or attnreplay --version)\n"
          "  Prints the code revision, the trace format version, the build type and, when built\n"
          "  with CUDA, the CUDA runtime linked in and the driver found (\"none\" without one).\n"
          "  Exit status: 0 printed, 2 an argument given, 3 the output could not be written.\n", f);
}

static int version_main(int argc, char **argv)
{
    if (wants_help(argc, argv)) {
        version_usage(stdout);
        return 0;
    }
    if (argc > 1) {   /* it takes no arguments */
        fprintf(stderr, "attnreplay version: unexpected argument '%s'\n", argv[1]);
        version_usage(stderr);
        return 2;
    }
    printf("attnreplay %s\n", AR_CODE_REV);
    printf("trace format v%d\n", AR_TRACE_VERSION);
    printf("build: %s\n", AR_BUILD_TYPE);
#ifdef AR_HAVE_CUDA
    int runtime = 0, driver = 0, devices = 0;
    cudaRuntimeGetVersion(&runtime);
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    printf("CUDA runtime %d.%d, ", runtime / 1000, runtime % 1000 / 10);
    if (driver > 0) printf("driver %d.%d", driver / 1000, driver % 1000 / 10);
    else printf("driver none");
    cudaError_t e = driver > 0 ? cudaGetDeviceCount(&devices) : cudaErrorNoDevice;
    if (e != cudaSuccess || devices == 0) {
        printf(", device none\n");
    } else {
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
            printf(", device %s (sm_%d%d)%s\n", prop.name, prop.major, prop.minor, devices > 1 ? " and more" : "");
        else
            printf(", %d device(s)\n", devices);
    }
#else
    printf("CUDA runtime none, driver none (built without CUDA: the CPU backends only)\n");
#endif
    return 0;
}

/* rc, once stdout is flushed; 3 with the reason on stderr when what cmd printed could not be
 * written (a full disk, /dev/full, a closed stdout), whatever rc was. */
static int output_done(const char *cmd, int rc)
{
    const char *why = NULL;
    if (ar_stdout_flush(&why) == 0) return rc;
    fprintf(stderr, "attnreplay %s: cannot write the output (%s)\n", cmd, why);
    return 3;
}

/* rc, once stdout is flushed, for a command whose stdout summarises files or a database it has
 * written: a summary that could not be written is exit 3 when rc is 0; a failure code of the
 * command's own (a failed verification, bad input, an interrupt) is kept, the lost summary said
 * on stderr all the same. */
static int summary_done(const char *cmd, int rc)
{
    const int out = ar_stdout_check(cmd);
    return rc != 0 ? rc : out;
}

/* The commands: name, another name it answers to, its main, and whether its stdout only
 * summarises a product written elsewhere (summary_done) or is the output itself (output_done). */
static const struct {
    const char *name, *alias;
    int (*run)(int argc, char **argv);
    bool summary;
} commands[] = {
    {"replay", NULL, ar_replay_main, true},       {"merge", NULL, ar_merge_main, true},
    {"info", NULL, info_main, false},             {"backends", NULL, ar_backends_main, false},
    {"sim", NULL, ar_sim_main, true},             {"report", NULL, ar_report_main, true},
    {"diff", NULL, ar_diff_main, false},          {"plan", NULL, ar_plan_main, true},
    {"calibrate", NULL, ar_calibrate_main, true}, {"profile", NULL, ar_profile_main, true},
    {"gen-samples", NULL, gen_samples_main, false}, {"export", NULL, ar_export_main, true},
    {"version", "--version", version_main, false},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    int sub_argc = argc - 1;
    char **sub_argv = argv + 1;
    /* -h or --help anywhere: every command gets exactly "CMD --help", so each prints its own
     * usage on stdout and exits 0, whatever else the line holds */
    char *help_argv[3] = { argv[1], (char *)"--help", NULL };
    if (wants_help(sub_argc, sub_argv)) {
        sub_argc = 2;
        sub_argv = help_argv;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(cmd, commands[i].name) != 0 && !(commands[i].alias && strcmp(cmd, commands[i].alias) == 0))
            continue;
        const int rc = commands[i].run(sub_argc, sub_argv);
        return commands[i].summary ? summary_done(commands[i].name, rc) : output_done(commands[i].name, rc);
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return output_done("help", 0);
    }
    fprintf(stderr, "attnreplay: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
