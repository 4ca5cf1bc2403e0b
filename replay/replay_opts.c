/* replay_opts.c - `attnreplay replay`'s command line: its usage text and the parser that fills a
 * replay_opts (replay_opts.h), each option checked as it is read and the ones that go together
 * checked at the end.  Nothing is opened or run here: replay.c does that with the result. */
#include "replay_opts.h"

#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../sim/sim.h"
#include "../traces/trace.h"

void ar_replay_usage(FILE *f)
{
    fprintf(f,
        "usage: attnreplay replay TRACE --db FILE [options]\n"
        "  --backend auto|NAME      backend (default auto: first that supports the trace)\n"
        "  --dtype bf16|fp16|fp32   model dtype (default: the trace's)\n"
        "  --kv-dtype auto|fp8_e4m3 KV-cache dtype (default: the trace's); --kv-scale X for fp8\n"
        "  --layers N               layers to replay (default 1; each has its own cache and data)\n"
        "  --steps A:B              replay steps A..B inclusive (either side may be empty)\n"
        "  --verify all|sample:N|off  check every row, N rows per step (+ each request's last), or none\n"
        "  --verify-layers all|first|K  verify every replayed layer (default), layer 0 only, or the\n"
        "                           first K layers; the others get the NaN/Inf and guard checks only\n"
        "  --verify-mem SIZE        device memory of the GPU verifier (block cache and scratch), e.g.\n"
        "                           40GiB (default: all that is free after the backend's caches but\n"
        "                           a reserve of 3 GiB + 1/32)\n"
        "  --seed S                 data seed, a decimal integer (default: the trace's)\n"
        "  --data normal|outlier|large  input distribution (default normal)\n"
        "  --inject FAULT           plant a fault: causal-off-by-one, wrong-slot, stale-block-table,\n"
        "                           wrong-kv-head, no-rescale, lse-base2, merge-no-weights (acts only\n"
        "                           where a cascade or split-KV merge runs), mla-no-wuv (MLA traces)\n"
        "  --cascade auto|on|off    cascade attention: vLLM's heuristic, whenever legal, or never\n"
        "  --repeat R               timed repetitions per launch, median stored (default 1)\n"
        "  --threads N              CPU threads (default: all cores)\n"
        "  --resume                 continue the newest unfinished run of this trace and config\n"
        "  --dump-step N --dump-dir DIR  write step N's inputs/outputs/reference as .npy (DIR is\n"
        "                           created if missing) with an index.json\n"
        "  --no-overlap             read the trace and write the database on the step loop's thread\n"
        "                           (same results; for comparisons and debugging)\n"
        "  --forward-timeout S      a backend call (open, prepare, fill, a layer's forward) that has not\n"
        "                           returned after S seconds fails the run (exit 3); 0 = no limit\n"
        "                           (default %d s for a GPU backend, %d s on the host;\n"
        "                           ATTNREPLAY_FORWARD_TIMEOUT sets it too); a plugin's init and\n"
        "                           check() have S as well (default %d s: the plugin's kind is\n"
        "                           not known yet), its close() the backend's\n"
        "sharding (README \"Running on a cluster\"):\n"
        "  --shard i/N              replay shard i of N; without it the launcher's environment says\n"
        "                           (Slurm, Open MPI, PMI, torchrun; none: one shard)\n"
        "  --shard-by auto|steps|layers  contiguous step ranges balanced by estimated cost, or the\n"
        "                           layers of --layers dealt out; auto (default) splits steps unless\n"
        "                           that leaves a shard 25%% over the mean and layers balance better\n"
        "  --db PATTERN             %%r the shard index, %%n the count, %%h the host (runs-%%r.db)\n"
        "  --device N               CUDA device ordinal (default: the local rank modulo the visible\n"
        "                           devices, CUDA_VISIBLE_DEVICES respected)\n"
        "  --plan-only              print the shard plan of every shard and exit (no --db needed)\n"
        "  then `attnreplay merge OUT.db runs-*.db` makes one run of the shards\n"
        "  --quiet                  no progress line, no summary\n"
        "  -h, --help               this text\n"
        "progress: on a terminal a live line (step / total, steps/s, ETA); otherwise a line every 10 s\n"
        "signals: SIGINT or SIGTERM abandons the step in flight within 2 s, keeps every committed step\n"
        "  and marks the run 'interrupted'; --resume continues it\n"
        "a backend that faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, a CUDA error) or outlives\n"
        "  --forward-timeout fails its step: committed steps are kept, the run is marked 'error', exit 3;\n"
        "  --resume continues it.  A plugin that faults or hangs in attnreplay_plugin_init or check() is\n"
        "  refused (exit 2, nothing stored); in close(), after the run is stored, the run stays as\n"
        "  stored and the exit is 3\n"
        "environment: ATTNREPLAY_BUSY_TIMEOUT_MS  how long to wait for another writer of the\n"
        "  database (default 30000); ATTNREPLAY_CRASH_HANDLER=0  leaves a backend's faults to the\n"
        "  default action (a core dump) instead of failing the run cleanly\n"
        "exit: 0 every verified step passed (status 'passed'; with --verify off 'unverified'),\n"
        "      1 a step failed verification, 2 bad input or usage (a plugin that cannot be loaded,\n"
        "        refuses the config, or faults or hangs in init or check(); a database locked by\n"
        "        another writer past ATTNREPLAY_BUSY_TIMEOUT_MS, before or during the run: committed\n"
        "        steps are kept and --resume continues it), 3 device/runtime error\n"
        "        (a plugin's close() that faults or hangs after the run is stored: the run stays as\n"
        "        stored; the summary could not be written to stdout: the run is stored whole),\n"
        "      4 nothing verified: no step replayed ('empty') or the planted fault never showed\n"
        "        ('fault-not-fired'), 130 SIGINT, 143 SIGTERM ('interrupted'); a summary lost with\n"
        "        1, 2, 4 or a signal keeps that code (and says so on stderr)\n",
        AR_FORWARD_TIMEOUT_GPU_S, AR_FORWARD_TIMEOUT_HOST_S, AR_FORWARD_TIMEOUT_GPU_S);
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Returns 0, 1 after printing --help, or -1 on a bad option (message printed). */
int ar_replay_parse_opts(int argc, char **argv, replay_opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = "auto";
    o->kv_scale = 1.0;
    o->step_last = INT64_MAX;
    o->verify = AR_VERIFY_ALL;
    o->cascade_mode = 1;
    o->repeat = 1;
    o->dump_step = -1;
    o->layers = 1;
    o->device = -1;
    o->forward_timeout = -1;
    enum { O_DB = 256, O_BACKEND, O_DTYPE, O_KVDTYPE, O_KVSCALE, O_LAYERS, O_STEPS, O_VERIFY,
           O_VERIFY_LAYERS, O_SEED, O_INJECT, O_RESUME, O_CASCADE, O_REPEAT, O_THREADS, O_DATA,
           O_DUMPSTEP, O_DUMPDIR, O_QUIET, O_NO_OVERLAP, O_SHARD, O_SHARD_BY, O_DEVICE, O_PLAN_ONLY,
           O_FORWARD_TIMEOUT, O_VERIFY_MEM, O_HELP = 'h' };
    static const struct option longopts[] = {
        {"db", required_argument, 0, O_DB}, {"backend", required_argument, 0, O_BACKEND},
        {"dtype", required_argument, 0, O_DTYPE}, {"kv-dtype", required_argument, 0, O_KVDTYPE},
        {"kv-scale", required_argument, 0, O_KVSCALE}, {"layers", required_argument, 0, O_LAYERS},
        {"steps", required_argument, 0, O_STEPS}, {"verify", required_argument, 0, O_VERIFY},
        {"verify-layers", required_argument, 0, O_VERIFY_LAYERS}, {"verify-mem", required_argument, 0, O_VERIFY_MEM},
        {"seed", required_argument, 0, O_SEED}, {"inject", required_argument, 0, O_INJECT},
        {"resume", no_argument, 0, O_RESUME}, {"cascade", required_argument, 0, O_CASCADE},
        {"repeat", required_argument, 0, O_REPEAT}, {"threads", required_argument, 0, O_THREADS},
        {"data", required_argument, 0, O_DATA}, {"dump-step", required_argument, 0, O_DUMPSTEP},
        {"dump-dir", required_argument, 0, O_DUMPDIR}, {"quiet", no_argument, 0, O_QUIET},
        {"no-overlap", no_argument, 0, O_NO_OVERLAP}, {"shard", required_argument, 0, O_SHARD},
        {"shard-by", required_argument, 0, O_SHARD_BY}, {"device", required_argument, 0, O_DEVICE},
        {"plan-only", no_argument, 0, O_PLAN_ONLY},
        {"forward-timeout", required_argument, 0, O_FORWARD_TIMEOUT}, {"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};
    optind = 0;   /* 0, not 1: glibc then also resets its scan state left by an earlier call */
    opterr = 0;
    int c;
    long v;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case O_DB: o->db = optarg; break;
        case O_BACKEND: o->backend = optarg; break;
        case O_DTYPE: o->dtype = optarg; break;
        case O_KVDTYPE: o->kv_dtype = optarg; break;
        case O_KVSCALE: {
            char *end;
            o->kv_scale = strtod(optarg, &end);
            /* the backends keep the scale as a float (vLLM's k_scale): outside float's normal
             * range it becomes 0 or inf there while the reference divides by the double */
            if (*end || end == optarg || !(o->kv_scale >= FLT_MIN && o->kv_scale <= FLT_MAX)) {
                fprintf(stderr, "attnreplay replay: --kv-scale must be a positive number in float32's normal range "
                                "(%g .. %g), got '%s'\n", (double)FLT_MIN, (double)FLT_MAX, optarg);
                return -1;
            }
            o->kv_scale_given = true;
            break;
        }
        case O_LAYERS:
            if (parse_int(optarg, 1, 4096, &v)) {
                fprintf(stderr, "attnreplay replay: --layers must be 1..4096\n");
                return -1;
            }
            o->layers = (int)v;
            break;
        case O_STEPS:
            if (ar_parse_step_range(optarg, &o->step_first, &o->step_last)) {
                fprintf(stderr, "attnreplay replay: --steps takes A:B with 0 <= A <= B (got '%s')\n", optarg);
                return -1;
            }
            o->steps_given = true;
            break;
        case O_VERIFY:
            if (strcmp(optarg, "all") == 0) o->verify = AR_VERIFY_ALL;
            else if (strcmp(optarg, "off") == 0) o->verify = AR_VERIFY_OFF;
            else if (strncmp(optarg, "sample:", 7) == 0 && parse_int(optarg + 7, 1, 1 << 30, &v) == 0) {
                o->verify = AR_VERIFY_SAMPLE;
                o->sample_rows = (int)v;
            } else {
                fprintf(stderr, "attnreplay replay: --verify takes all, sample:N or off (got '%s')\n", optarg);
                return -1;
            }
            break;
        case O_VERIFY_LAYERS:
            o->verify_layers_first = false;
            if (strcmp(optarg, "all") == 0) o->verify_layers = 0;
            else if (strcmp(optarg, "first") == 0) {
                o->verify_layers = 1;
                o->verify_layers_first = true;
            } else if (parse_int(optarg, 1, 4096, &v) == 0) o->verify_layers = (int)v;
            else {
                fprintf(stderr, "attnreplay replay: --verify-layers takes all, first or a layer count K "
                                ">= 1 (got '%s')\n", optarg);
                return -1;
            }
            break;
        case O_VERIFY_MEM: {
            const double bytes = ar_parse_size(optarg);
            if (!(bytes >= (double)(64 << 20)) || bytes > 1e15) {
                fprintf(stderr, "attnreplay replay: --verify-mem takes a size of at least 64MiB, like 40GiB "
                                "(got '%s')\n", optarg);
                return -1;
            }
            o->verify_mem = (size_t)bytes;
            break;
        }
        case O_SEED: {
            char *end;
            errno = 0;
            o->seed = strtoull(optarg, &end, 10);
            /* decimal, as in a trace header: base 0 would read "010" as 8 and "0x10" as 16; and
             * strtoull takes "-1" as 2^64 - 1 (and skips blanks and a sign): only digits */
            if (errno || *end || end == optarg || optarg[0] < '0' || optarg[0] > '9') {
                fprintf(stderr, "attnreplay replay: --seed must be an unsigned integer in decimal, 0 .. 2^64 - 1 "
                                "(got '%s')\n", optarg);
                return -1;
            }
            o->seed_given = true;
            break;
        }
        case O_INJECT:
            if (ar_fault_parse(optarg, &o->fault) != 0 || o->fault == AR_FAULT_NONE) {
                fprintf(stderr, "attnreplay replay: unknown fault '%s'; one of:", optarg);
                for (int i = 1; i < AR_FAULT_COUNT; i++) fprintf(stderr, " %s", ar_fault_name((ar_fault)i));
                fprintf(stderr, "\n");
                return -1;
            }
            break;
        case O_RESUME: o->resume = true; break;
        case O_CASCADE:
            if (strcmp(optarg, "off") == 0) o->cascade_mode = 0;
            else if (strcmp(optarg, "auto") == 0) o->cascade_mode = 1;
            else if (strcmp(optarg, "on") == 0) o->cascade_mode = 2;
            else {
                fprintf(stderr, "attnreplay replay: --cascade takes auto, on or off\n");
                return -1;
            }
            break;
        case O_REPEAT:
            if (parse_int(optarg, 1, 1000, &v)) {
                fprintf(stderr, "attnreplay replay: --repeat must be 1..1000\n");
                return -1;
            }
            o->repeat = (int)v;
            break;
        case O_THREADS:
            if (parse_int(optarg, 0, 1024, &v)) {
                fprintf(stderr, "attnreplay replay: --threads must be 0..1024\n");
                return -1;
            }
            o->threads = (int)v;
            break;
        case O_DATA:
            if (strcmp(optarg, "normal") == 0) o->data = AR_DATA_NORMAL;
            else if (strcmp(optarg, "outlier") == 0) o->data = AR_DATA_OUTLIER;
            else if (strcmp(optarg, "large") == 0) o->data = AR_DATA_LARGE;
            else {
                fprintf(stderr, "attnreplay replay: --data takes normal, outlier or large\n");
                return -1;
            }
            break;
        case O_DUMPSTEP:
            if (parse_int(optarg, 0, 1L << 40, &v)) {
                fprintf(stderr, "attnreplay replay: --dump-step must be a step number\n");
                return -1;
            }
            o->dump_step = v;
            break;
        case O_DUMPDIR: o->dump_dir = optarg; break;
        case O_QUIET: o->quiet = true; break;
        case O_NO_OVERLAP: o->no_overlap = true; break;
        case O_SHARD: o->shard_text = optarg; break;
        case O_SHARD_BY:
            if (ar_shard_by_parse(optarg, &o->shard_by) != 0) {
                fprintf(stderr, "attnreplay replay: --shard-by takes auto, steps or layers (got '%s')\n", optarg);
                return -1;
            }
            break;
        case O_DEVICE:
            if (parse_int(optarg, 0, 1023, &v)) {
                fprintf(stderr, "attnreplay replay: --device takes a CUDA device ordinal 0..1023 (got '%s')\n", optarg);
                return -1;
            }
            o->device = (int)v;
            break;
        case O_PLAN_ONLY: o->plan_only = true; break;
        case O_FORWARD_TIMEOUT: {
            char *end;
            o->forward_timeout = strtod(optarg, &end);
            if (*end || end == optarg || !(o->forward_timeout >= 0) || !isfinite(o->forward_timeout)) {
                fprintf(stderr, "attnreplay replay: --forward-timeout takes seconds >= 0 (0: no limit), got '%s'\n",
                        optarg);
                return -1;
            }
            break;
        }
        case O_HELP: ar_replay_usage(stdout); return 1;   /* the caller exits 0 (no exit(): library code) */
        default:
            fprintf(stderr, "attnreplay replay: unknown or incomplete option '%s'\n", argv[optind - 1]);
            return -1;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "attnreplay replay: exactly one TRACE argument is needed\n");
        return -1;
    }
    o->trace = argv[optind];
    if (!o->db && !o->plan_only) {
        fprintf(stderr, "attnreplay replay: --db FILE is required\n");
        return -1;
    }
    if ((o->dump_step >= 0) != (o->dump_dir != NULL)) {
        fprintf(stderr, "attnreplay replay: --dump-step and --dump-dir go together\n");
        return -1;
    }
    if (o->dump_step >= 0 && (o->dump_step < o->step_first || o->dump_step > o->step_last)) {
        fprintf(stderr, "attnreplay replay: --dump-step %lld is outside --steps %lld:%lld\n",
                (long long)o->dump_step, (long long)o->step_first,
                o->step_last == INT64_MAX ? -1LL : (long long)o->step_last);
        return -1;
    }
    return 0;
}
