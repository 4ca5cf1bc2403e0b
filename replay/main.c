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
 */
#include <stdio.h>
#include <string.h>

#include "../reports/reports.h"
#include "../sim/sim.h"
#include "../traces/export.h"
#include "../traces/samples.h"
#include "../traces/trace.h"
#include "replay.h"

#ifndef AR_CODE_REV
#define AR_CODE_REV "unknown"
#endif

static void usage(FILE *f)
{
    fprintf(f,
        "attnreplay - replay LLM-serving scheduler traces through attention kernels and a float64\n"
        "reference, check they agree, and store per-step timings and errors in SQLite.\n\n"
        "usage: attnreplay COMMAND [options]   (COMMAND --help for its options)\n"
        "  info TRACE                         steps, requests, tokens, prefill/decode mix, prefix hits\n"
        "  replay TRACE --db FILE [...]       replay, verify every step, store results\n"
        "  backends [--trace TRACE]           the backend table and why each can or cannot run\n"
        "  sim --workload KIND:PATH --model PRESET --out TRACE [...]   scheduler simulator\n"
        "  report DB [--run ID ...] --out DIR plots (PNG, SVG), index.html and summary.md\n"
        "  diff DB RUN_A RUN_B [--threshold 5%%]  step-by-step comparison; exit 1 on a regression\n"
        "  plan --workload SPEC --model PRESET --device DEV --out DIR [--db DB] [--slo ...]\n"
        "                                     capacity plan: fitted step time, simulator sweep, SLO answer\n"
        "  calibrate --db DB [--no-cublas]    measure copy GB/s and bf16 TFLOP/s into table ceilings (GPU)\n"
        "  gen-samples DIR                    write the sample traces\n"
        "  export TRACE --steps A:B --format flashinfer-trace --out DIR   steps as FlashInfer-Trace workloads\n"
        "  version\n");
}

static int info_main(int argc, char **argv)
{
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: attnreplay info TRACE\n");
        return 2;
    }
    char err[AR_ERR_MAX];
    if (ar_trace_print_info(argv[1], stdout, err, sizeof err) != 0) {
        fprintf(stderr, "attnreplay info: %s\n", err);
        return 2;
    }
    return 0;
}

static int gen_samples_main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: attnreplay gen-samples DIR\n");
        return 2;
    }
    char err[AR_ERR_MAX];
    if (ar_samples_write(argv[1], err, sizeof err) != 0) {
        fprintf(stderr, "attnreplay gen-samples: %s\n", err);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    int sub_argc = argc - 1;
    char **sub_argv = argv + 1;
    if (strcmp(cmd, "replay") == 0) return ar_replay_main(sub_argc, sub_argv);
    if (strcmp(cmd, "info") == 0) return info_main(sub_argc, sub_argv);
    if (strcmp(cmd, "backends") == 0) return ar_backends_main(sub_argc, sub_argv);
    if (strcmp(cmd, "sim") == 0) return ar_sim_main(sub_argc, sub_argv);
    if (strcmp(cmd, "report") == 0) return ar_report_main(sub_argc, sub_argv);
    if (strcmp(cmd, "diff") == 0) return ar_diff_main(sub_argc, sub_argv);
    if (strcmp(cmd, "plan") == 0) return ar_plan_main(sub_argc, sub_argv);
    if (strcmp(cmd, "calibrate") == 0) return ar_calibrate_main(sub_argc, sub_argv);
    if (strcmp(cmd, "gen-samples") == 0) return gen_samples_main(sub_argc, sub_argv);
    if (strcmp(cmd, "export") == 0) return ar_export_main(sub_argc, sub_argv);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("attnreplay %s (trace format v%d)\n", AR_CODE_REV, AR_TRACE_VERSION);
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "attnreplay: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
