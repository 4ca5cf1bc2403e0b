/* shard.h - sharded runs without a communication library: which shard this process is (from
 * --shard i/N or the launcher's environment), which GPU its local rank takes, how a trace's
 * steps (or layers) are split over N shards by estimated cost, and per-shard file names.
 *
 * Launchers, in the order they are read (ar_launch_detect):
 *   --shard i/N        overrides everything below
 *   Slurm              SLURM_PROCID / SLURM_NTASKS (SLURM_STEP_NUM_TASKS when srun sets it) /
 *                      SLURM_LOCALID; job arrays SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT
 *                      (SLURM_ARRAY_TASK_MIN, SLURM_ARRAY_TASK_STEP).  Array and tasks together
 *                      combine: shard = array index x tasks + task, count = array count x tasks
 *                      (each array element is its own job; its srun tasks split it further).
 *   Open MPI           OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_RANK
 *   PMI                PMI_RANK / PMI_SIZE (local rank MPI_LOCALRANKID or PMI_LOCAL_RANK)
 *   torchrun           RANK / WORLD_SIZE / LOCAL_RANK
 * The first complete set gives rank and size.  One exception: a process that mpirun, mpiexec or
 * torchrun started inside a Slurm job inherits the job's SLURM_* variables, which then describe
 * the allocation, not the process; when Open MPI's, PMI's or torchrun's variables are present
 * and disagree with Slurm's, they win (the detail says so).  Two of those disagreeing with each
 * other, a set with only some of its variables (SLURM_PROCID > 0 without a task count,
 * OMPI_COMM_WORLD_RANK without OMPI_COMM_WORLD_SIZE, RANK without WORLD_SIZE, ...), a value that
 * is not a number, or a rank outside its size is a usage error.  SLURM_NTASKS without
 * SLURM_PROCID (an salloc shell) and SLURM_PROCID=0 alone (a batch script without -n) mean one
 * process. */
#ifndef AR_SHARD_H
#define AR_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ar_launch {
    int shard, count;            /* 0 <= shard < count; 0 / 1 when nothing shards */
    int local_rank;              /* rank on this host, -1 when unknown */
    char source[24];             /* "none", "--shard", "slurm", "slurm-array", "openmpi", "pmi", "torchrun" */
    char detail[320];            /* the variables read, e.g. "SLURM_PROCID=1 SLURM_NTASKS=4 SLURM_LOCALID=1" */
} ar_launch;

/* This process's shard.  shard_opt: the text of --shard ("i/N") or NULL; envp: the environment
 * as NULL-terminated NAME=VALUE strings (environ).  With --shard the launcher only supplies the
 * local rank (when its variables are complete).  0, or -1 with err set (a usage error). */
int ar_launch_detect(const char *shard_opt, char *const *envp, ar_launch *out, char *err, size_t err_len);

/* The CUDA device ordinal (among the visible ones) for local_rank (-1 unknown: device 0):
 * local_rank modulo the devices CUDA_VISIBLE_DEVICES lists (cuda_visible NULL = unset; "" lists
 * none), or modulo device_count when it is unset (device_count <= 0: unknown).  So a launcher
 * that binds one GPU per task (CUDA_VISIBLE_DEVICES of one entry) gives device 0, and more local
 * ranks than devices share them round robin.  why gets one line saying how it was chosen. */
int ar_launch_device(int local_rank, const char *cuda_visible, int device_count, char *why, size_t why_len);

/* Number of devices CUDA_VISIBLE_DEVICES lists: comma-separated entries up to the first that is
 * empty or starts with '-' (CUDA stops there too).  -1 when cuda_visible is NULL. */
int ar_launch_visible_count(const char *cuda_visible);

/* Expands a per-shard file name: %r the shard index, %n the shard count, %h the host name, %%
 * a percent sign.  0, or -1 with err set (an unknown % sequence, or too long). */
int ar_shard_path(const char *pattern, int shard, int count, const char *host, char *out, size_t out_len,
                  char *err, size_t err_len);

/* ---- the plan ------------------------------------------------------------------------------
 * Estimated cost of a step, in units of the attention kernel's time per causal query-key pair
 * (qk_pairs, as `attnreplay info --steps` prints it: the sum over requests of
 * n x (context + (n + 1) / 2)):
 *   per replayed layer    qk_pairs + AR_SHARD_TOKEN_COST x tokens + AR_SHARD_LAYER_COST
 *   per verified layer    --verify all: AR_SHARD_VERIFY_ALL_COST x qk_pairs (every row, in FP64)
 *                         --verify sample:N: AR_SHARD_VERIFY_SAMPLE_COST x kv_tokens (each
 *                         request's last row and the sampled ones, over their whole context)
 *   per step              AR_SHARD_STEP_COST (reading the trace, the batch, the database row)
 * Steps that schedule nothing cost 0 (they are not replayed).  The constants come from the
 * H200 replays of a Mooncake slice as Llama-3.1-8B (BENCHMARKS.md, "Replay at scale": kernels
 * 4.2e-11 s a pair, 0.13 ms of host work a layer-step, the device reference 4.7e-9 s a pair
 * verifying every row and 4.1e-7 s a context token sampled); on other models and on the CPU
 * the shares differ, so the split is even in work that scales this way, not in seconds. */
/* Shards one plan may have: more than any launcher starts; a count past it is refused (its
 * plan's arrays alone would take gigabytes). */
#define AR_SHARD_MAX_COUNT (1 << 20)
#define AR_SHARD_TOKEN_COST 256.0
#define AR_SHARD_LAYER_COST 3.0e6
#define AR_SHARD_VERIFY_ALL_COST 113.0
#define AR_SHARD_VERIFY_SAMPLE_COST 9750.0
#define AR_SHARD_STEP_COST 2.4e6

/* What verification adds to a verified layer's cost. */
typedef enum ar_shard_verify { AR_SHARD_VERIFY_OFF, AR_SHARD_VERIFY_SAMPLE, AR_SHARD_VERIFY_ALL } ar_shard_verify;

typedef enum ar_shard_by { AR_SHARD_BY_AUTO, AR_SHARD_BY_STEPS, AR_SHARD_BY_LAYERS } ar_shard_by;
/* "auto", "steps", "layers"; parse returns 0 or -1. */
const char *ar_shard_by_name(ar_shard_by by);
int ar_shard_by_parse(const char *text, ar_shard_by *out);

typedef struct ar_shard_part {
    int64_t step_first, step_last;   /* trace steps [first, last]; first > last: none */
    int layer_first, layer_last;     /* layers [first, last] */
    int64_t steps;                   /* steps with work in the part */
    double cost;                     /* estimated */
} ar_shard_part;

typedef struct ar_shard_plan {
    ar_shard_by by;                  /* AR_SHARD_BY_STEPS or AR_SHARD_BY_LAYERS */
    int count;
    ar_shard_part *parts;            /* [count] */
    int layers;                      /* layers of the run */
    int64_t range_first, range_last; /* the steps planned over (the trace clipped to --steps) */
    int64_t work_steps;              /* steps in the range that schedule something */
    double total_cost;
    double imbalance;                /* largest part's cost / the mean part's */
    char why[256];                   /* why this split */
} ar_shard_plan;

/* Splits n items of cost costs[i] into count contiguous parts: part k is items
 * [bounds[k], bounds[k + 1]) (bounds has count + 1 entries, bounds[0] = 0, bounds[count] = n).
 * Each boundary sits where the running cost comes closest to k / count of the total and no part
 * is empty, so the largest part exceeds the ideal total / count by less than one item's cost;
 * with fewer items than parts, the first n parts get one each.  Deterministic: every shard
 * computes the same bounds. */
void ar_shard_split(const double *costs /* [n] */, size_t n, int count, size_t *bounds /* [count + 1] */);

/* The estimated costs of n steps (see above). */
typedef struct ar_shard_costs {
    const int64_t *steps;        /* [n] trace step numbers, ascending */
    const double *layer;         /* [n] per replayed layer */
    const double *verify;        /* [n] added per verified layer */
    const double *fixed;         /* [n] per step */
    size_t n;
} ar_shard_costs;

/* The cost of steps [from, to) replaying layers [layer_first, layer_last] of which the first
 * verified_layers of the run are verified. */
double ar_shard_cost(const ar_shard_costs *c, size_t from, size_t to, int layer_first, int layer_last,
                     int verified_layers);

/* The plan for count shards of a run of layers layers, the first verified_layers of them
 * verified (0: --verify off).  by AUTO splits steps unless that leaves the largest shard more
 * than 25% over the mean and splitting layers (layers >= count) balances better (fewer steps
 * with work than shards, or one step costing more than a shard's share).  0, or -1 with err set
 * (out of memory, layers < count with AR_SHARD_BY_LAYERS). */
int ar_shard_plan_make(const ar_shard_costs *c, int layers, int verified_layers, int count, ar_shard_by by,
                       ar_shard_plan *out, char *err, size_t err_len);

/* Reads the trace (validating it), estimates each step's cost for verify and plans count
 * shards over steps [first, last] (last INT64_MAX: to the end).  0, or -1 with err set
 * ("PATH:LINE: rule" for a bad trace). */
int ar_shard_plan_trace(const char *trace, int64_t first, int64_t last, int layers, int verified_layers,
                        ar_shard_verify verify, int count, ar_shard_by by, ar_shard_plan *out, char *err,
                        size_t err_len);
void ar_shard_plan_free(ar_shard_plan *p);

/* Prints the plan as a table, one line per shard; mark (>= 0) flags that shard's line. */
void ar_shard_plan_print(FILE *f, const ar_shard_plan *p, const char *trace, int mark);

/* Round-robin share of items for sweeps (plan points, sim rows): true when item belongs to
 * shard of count. */
bool ar_shard_owns(size_t item, int shard, int count);

#ifdef __cplusplus
}
#endif
#endif
