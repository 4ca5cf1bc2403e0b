/* sim.h - the vLLM V1 scheduler simulator (DESIGN section 10): workloads, engine presets,
 * step-time models, the step-by-step scheduler, and per-request serving metrics.
 *
 * Flow: a workload (ar_workload: arrivals, prompt/output lengths, chained content keys of the
 * full prompt blocks) and an engine configuration (ar_sim_config: model, KV cache, scheduler
 * limits, step-time model) go into ar_sim_create; every ar_sim_step call runs one scheduler
 * step exactly as vLLM V1's Scheduler.schedule + update_from_output would, and returns the
 * step as a trace step (traces/trace.h) ready for ar_trace_write_step.  The simulator's
 * internal state (block pool, requests) can be inspected between steps, which is what the
 * invariant tests do.  ar_sim_main is the `attnreplay sim` command. */
#ifndef AR_SIM_H
#define AR_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "../reference/datagen.h"
#include "../traces/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- workloads (sim/workload.c) ------------------------------------------------------------ */

typedef struct ar_workload_req {
    double arrival;       /* seconds from the workload's start, already time-scaled */
    int prompt_len;       /* tokens, > 0 */
    int output_len;       /* tokens to generate, > 0 */
    int64_t key_offset;   /* first content key in ar_workload.keys */
    int num_keys;         /* full prompt blocks: prompt_len / block_size */
    long line;            /* line of the source file (0 for generated requests) */
    double real_ttft;     /* vllm-run only: the engine's TTFT and TPOT in seconds, else -1 */
    double real_tpot;
} ar_workload_req;

typedef struct ar_workload {
    char source[32];           /* "mooncake", "azure", "vllm-run", "synthetic", "memory" */
    char path[1024];           /* the file it came from ("" when generated) */
    int block_size;
    ar_workload_req *reqs;     /* [num_reqs], arrival non-decreasing */
    int num_reqs, cap_reqs;
    uint64_t *keys;            /* [num_keys_total] chained content keys, per request contiguous */
    int64_t num_keys_total, cap_keys;
    int num_skipped;           /* rows skipped with a warning (see ar_workload_load) */
} ar_workload;

/* Empty in-memory workload for a block size. */
void ar_workload_init(ar_workload *wl, int block_size, const char *source);
/* Appends a request.  payloads[i] (i < num_payloads) is the payload of full prompt block i
 * (blocks with equal payload chains share content); blocks beyond num_payloads get payloads
 * unique to this request.  Keys are chained from AR_ROOT_KEY with ar_chain_key.
 * Returns 0, or -1 (out of memory / bad lengths) with err set. */
int ar_workload_push(ar_workload *wl, double arrival, int prompt_len, int output_len,
                     const uint64_t *payloads /* [num_payloads] */, int num_payloads, long line,
                     char *err, size_t err_len);
/* Loads "mooncake:PATH", "azure:PATH", "vllm-run:PATH" (a requests.jsonl, or the directory
 * holding it) or "synthetic:SPEC" (see ar_workload_synthetic).  Arrival times are shifted so
 * the first request arrives at 0 and multiplied by time_scale; limit > 0 keeps the first
 * limit requests.  Returns 0, or 2 with "FILE:LINE: rule" in err for bad input (malformed
 * row, non-positive length, missing or decreasing timestamp). */
int ar_workload_load(const char *spec, int block_size, double time_scale, int limit,
                     ar_workload *wl, char *err, size_t err_len);
/* SPEC = comma-separated key=value:
 *   groups=G,prompts=P,system=S,question=Q,output=O   SGLang generated-shared-prefix style:
 *        G groups x P prompts; each prompt = the group's S-token system prompt + a unique
 *        Q-token question; O output tokens; requests shuffled (seed) before arrival times.
 *   n=N,input=I,output=O                               N independent requests (no groups).
 *   rate=R (requests/s, default 10), arrival=poisson|gamma, cv=C (gamma's coefficient of
 *   variation, default 2), seed=X (default 1).
 * Returns 0 or 2 with err set. */
int ar_workload_synthetic(const char *spec, int block_size, ar_workload *wl, char *err,
                          size_t err_len);
void ar_workload_free(ar_workload *wl);

/* ---- engine presets and devices (sim/presets.c) --------------------------------------------- */

typedef struct ar_model_preset {
    const char *name;
    ar_model model;            /* the trace header's model block */
    int hidden;                /* hidden size */
    int intermediate;          /* dense MLP intermediate size */
    int vocab;
    int q_lora_rank;           /* MLA only */
    int num_experts;           /* routed experts (0 = dense) */
    int active_experts;        /* routed experts per token */
    int shared_experts;
    int moe_intermediate;
    int first_dense_layers;    /* MoE models: leading dense layers */
    int default_block_size;
} ar_model_preset;

typedef struct ar_device_spec {
    const char *name;
    double peak_flops;         /* dense bf16 FLOP/s */
    double mem_bw;             /* bytes/s */
    int num_sms;
    const char *source;        /* where the numbers come from */
    /* the interconnect between the devices of one tensor-parallel group */
    const char *link;          /* "nvlink", "pcie" */
    double link_bw;            /* bytes/s one device sends (and receives) at once in a ring all-reduce */
    double link_latency_s;     /* fixed cost of one all-reduce */
    const char *link_source;
    /* the device's efficiency table: default fractions of peak / bandwidth the roofline uses */
    double gemm_eff, attn_eff, bw_eff;
    double kv_eff;             /* attention's paged KV reads, a fraction of mem_bw; 0 = none measured (bw_eff) */
    /* a candidate linear-layer table, not the default: gemm_eff and bw_eff measured from vLLM's own linear
     * layers on the card (sim/presets.c); 0 = none.  `make fidelity` reports the model with it */
    double linear_gemm_eff, linear_bw_eff;
    const char *eff_source;
} ar_device_spec;

/* NULL when unknown. */
const ar_model_preset *ar_model_preset_find(const char *name);
const ar_device_spec *ar_device_find(const char *name);
/* The preset of a GPU as the CUDA runtime names it ("NVIDIA H200" -> h200), or of a preset name;
 * NULL when none matches. */
const ar_device_spec *ar_device_match(const char *gpu_name);
/* Comma-separated names, for usage messages. */
const char *ar_model_preset_names(void);
const char *ar_device_names(void);
/* Bytes one KV block takes over all layers: MHA 2 * kv_heads * head_size per token per layer,
 * MLA (kv_lora_rank + rope dim) per token per layer, times the KV dtype's size. */
int64_t ar_kv_bytes_per_block(const ar_model *m, int block_size, ar_dtype kv_dtype);
/* Parameters touched per token (active parameters, for GEMM FLOPs) and all weight bytes. */
double ar_preset_active_params(const ar_model_preset *p);
double ar_preset_total_params(const ar_model_preset *p);

/* ---- step-time models (sim/steptime.c) ------------------------------------------------------ */

typedef enum ar_steptime_kind {
    AR_STEPTIME_CONSTANT = 0,
    AR_STEPTIME_LINEAR = 1,
    AR_STEPTIME_ROOFLINE = 2,
    AR_STEPTIME_FITTED = 3,    /* roofline with the attention term fitted from a replay database */
    AR_STEPTIME_PROFILE = 4    /* GEMM and attention times interpolated from a measured profile */
} ar_steptime_kind;

/* What a step-time model sees of a batch. */
typedef struct ar_batch_features {
    int num_reqs;              /* scheduled requests */
    int num_tokens;            /* scheduled tokens */
    int num_prefill_tokens;    /* tokens of requests still in their prompt (or recomputing) */
    int num_decode_reqs;       /* requests scheduled for exactly one generated token */
    int64_t kv_tokens_read;    /* sum of seq_len = num_computed + n over scheduled requests */
    double attn_pairs;         /* sum over requests of n * (num_computed + (n + 1) / 2): query-key pairs */
    /* the batch's shape, one entry per scheduled request (NULL: only the totals above are known) */
    const int *query_lens;     /* [num_reqs] tokens scheduled this step */
    const int *context_lens;   /* [num_reqs] num_computed_tokens before the step */
} ar_batch_features;

/* A measured step-time profile (sim/profile.c: `attnreplay profile`, stored in SQLite): per-call
 * times of the model's GEMMs (and other per-token operations) over a grid of token counts, and one
 * layer's attention time over grids of decode batches (requests x context) and single prefills
 * (query x context); optionally (profiles imported from LLMServingSim, sim/profile_import.c) a
 * grid of mixed batches, one prefill and a decode batch in one kernel. */
#define AR_PROF_MAX_GEMMS 12
#define AR_PROF_MAX_M 160
#define AR_PROF_MAX_AXIS 24
#define AR_PROF_MAX_MIX 12288      /* cells of the mixed grid */
#define AR_PROF_SKEW_AXIS 24       /* values or bins of one axis of the skew table */
#define AR_PROF_MAX_SKEW 12288     /* cells of the skew table */
typedef struct ar_profile_table {
    char device[128];          /* what the profile was measured on (the GPU's name) */
    char model[64];            /* preset name */
    int tp;                    /* tensor-parallel degree the GEMM shapes are sharded for */
    int num_gemms;
    char gemm_name[AR_PROF_MAX_GEMMS][16];   /* "qkv", "o", "gate_up", "down", "lm_head", ... */
    int gemm_k[AR_PROF_MAX_GEMMS], gemm_n[AR_PROF_MAX_GEMMS];   /* 0 for an operation that is not a GEMM */
    /* calls per layer at M = tokens (1 for a GEMM, 2 for a layer's two norms); 0: once per step at
       M = requests (LM head, sampler); -1: once per step at M = tokens (embedding, final norm) */
    int gemm_per_layer[AR_PROF_MAX_GEMMS];
    int num_m;
    double m[AR_PROF_MAX_M];                 /* token counts, ascending */
    int gemm_num_m[AR_PROF_MAX_GEMMS];       /* points of m timed for each operation: all (num_m), or
                                                for one run at M = requests a prefix of them */
    double gemm_us[AR_PROF_MAX_GEMMS][AR_PROF_MAX_M];
    int num_dec_batch, num_dec_ctx;          /* decode: num_dec_batch requests of 1 token each */
    double dec_batch[AR_PROF_MAX_AXIS], dec_ctx[AR_PROF_MAX_AXIS];
    double dec_us[AR_PROF_MAX_AXIS][AR_PROF_MAX_AXIS];    /* [batch][context], one layer */
    int num_pre_q, num_pre_ctx;              /* prefill: one request, q new tokens after ctx */
    double pre_q[AR_PROF_MAX_AXIS], pre_ctx[AR_PROF_MAX_AXIS];
    double pre_us[AR_PROF_MAX_AXIS][AR_PROF_MAX_AXIS];    /* [q][context], one layer */
    /* mixed: one prefill of q tokens after ctx together with batch decodes after dctx each, one
       layer; num_mix_q == 0: none (then a step's prefills and decodes are timed apart and added) */
    int num_mix_q, num_mix_ctx, num_mix_batch, num_mix_dctx;
    double mix_q[AR_PROF_MAX_AXIS], mix_ctx[AR_PROF_MAX_AXIS], mix_batch[AR_PROF_MAX_AXIS], mix_dctx[AR_PROF_MAX_AXIS];
    double mix_us[AR_PROF_MAX_MIX];          /* [q][ctx][batch][dctx], row-major */
    int replay_steps;          /* replayed steps measured with the profile (0 none) */
    double replay_ratio;       /* median of measured / interpolated attention over them (1 none) */
    /* LLMServingSim's attention lookup (version 3, profiles imported from it): a step's prompts as
       one lookup at their summed query tokens and contexts (else the largest with the decodes and
       each other alone), and its correction for decodes of unequal contexts: t(mean context) +
       alpha x (t(largest) - t(mean)), alpha per bucket of (prompt tokens pc, decodes, skew rate
       (mean - min) / (max - min), largest context, prompt context), skew_alpha_default where the
       table has no row (NaN cell) */
    bool prompts_together;
    int num_skew_pc;           /* 0: no skew correction */
    double skew_pc[AR_PROF_SKEW_AXIS];       /* the bucket's prompt tokens, matched exactly */
    int skew_bins[4];          /* decodes, skew rate, largest context, prompt context */
    double skew_upper[4][AR_PROF_SKEW_AXIS]; /* bin i: values <= upper[i] (and above upper[i-1]);
                                                beyond the last bound: the last bin */
    double skew_alpha[AR_PROF_MAX_SKEW];     /* [pc][n][rate][largest][prompt ctx], row-major */
    double skew_alpha_default;
} ar_profile_table;

typedef struct ar_steptime {
    ar_steptime_kind kind;
    double constant_s;         /* CONSTANT: seconds per step */
    double lin_base_s, lin_per_token_s, lin_per_req_s, lin_per_kv_token_s;  /* LINEAR */
    /* ROOFLINE */
    const ar_model_preset *preset;
    ar_device_spec device;
    double gemm_efficiency;    /* fraction of peak FLOP/s reached by the GEMMs */
    double attn_efficiency;    /* fraction of peak FLOP/s reached by attention */
    double bw_efficiency;      /* fraction of memory bandwidth reached streaming weights */
    double kv_efficiency;      /* fraction of memory bandwidth reached by attention's KV reads
                                  (paged, block-sized gathers); default the device's kv_eff,
                                  else bw_efficiency */
    double overhead_s;         /* fixed per-step cost (scheduler, launch, sampling) */
    double per_req_overhead_s; /* per scheduled request */
    double gpu_gap_s;          /* per-step serial time on the GPU's stream that async scheduling does not
                                  hide (sampling, input copies, graph launches); adds to t_gpu */
    int tensor_parallel;       /* devices sharing the model (ideal scaling) */
    /* FITTED: attention seconds for ALL layers = a + b*tokens + c*requests + d*sum(seq_len) */
    double fit_coef[4];
    int fit_steps;             /* steps the fit used */
    ar_dtype weight_dtype, kv_dtype;
    /* engine behaviour (all kinds but constant and linear) */
    int cudagraph_max;         /* batches of <= this many tokens run padded to a CUDA-graph size;
                                  0 = no graphs, -1 = vLLM's default min(2 x max_num_seqs, 512) */
    bool async_scheduling;     /* the CPU part of a step overlaps the GPU part (vLLM's default) */
    double link_bw, link_latency_s;   /* tensor-parallel all-reduce (from the device preset) */
    double attn_scale;         /* PROFILE: multiplies the interpolated attention (replay_ratio) */
    ar_profile_table profile;  /* PROFILE */
    double active_params, total_params;   /* the preset's (ar_preset_*_params), set by the parser */
} ar_steptime;

/* Parses MODEL: "constant:SECONDS", "linear:BASE,PER_TOKEN,PER_REQ,PER_KV_TOKEN" (seconds),
 * "roofline:DEVICE[,gemm_eff=E][,attn_eff=E][,bw_eff=E][,overhead=S][,per_req=S][,tp=N]",
 * "fitted:DB[,run=ID][,device=DEVICE][,roofline keys]": the roofline with its attention term
 * replaced by a linear fit of the database's measured attention times (device default h200).
 * preset is needed for roofline.  Returns 0 or 2 with err set. */
int ar_steptime_parse(const char *spec, const ar_model_preset *preset, ar_steptime *st,
                      char *err, size_t err_len);
/* Resolves what depends on the engine configuration: the CUDA-graph capture limit (-1 becomes
 * vLLM's min(2 x max_num_seqs, 512)). */
void ar_steptime_set_engine(ar_steptime *st, int max_num_seqs);
/* Seconds the step takes. */
double ar_steptime_eval(const ar_steptime *st, const ar_batch_features *f);
/* The step's parts in seconds (kinds roofline, fitted, profile; zero otherwise): GPU time of the
 * linear layers (GEMMs incl. the LM head), attention, tensor-parallel all-reduce, and the CPU
 * time (overhead + per-request) that async scheduling overlaps with them. */
typedef struct ar_step_parts {
    double linear_s, attn_s, allreduce_s, cpu_s;
    int padded_tokens;         /* tokens the GEMMs ran with after CUDA-graph padding */
} ar_step_parts;
void ar_steptime_parts(const ar_steptime *st, const ar_batch_features *f, ar_step_parts *parts);
/* The CUDA-graph size a batch of n tokens is padded to: vLLM's capture sizes 1, 2, 4, 8..248 in
 * steps of 8, then steps of 16 up to max_size; n itself when n > max_size or max_size <= 0. */
int ar_cudagraph_pad(int n, int max_size);

/* ---- step timings of a real run (sim/stepfit.c) -------------------------------------------- */

/* One request of a real vLLM run (requests.jsonl), times on the engine's clock in seconds. */
typedef struct ar_run_req {
    int prompt_len, output_len;
    double scheduled, first_token, last_token;
} ar_run_req;
/* Reads a run's requests.jsonl (PATH or the folder holding it): input_toks, output_toks,
 * scheduled_ts, first_token_ts, last_token_ts.  Returns 0 with *out malloc'ed, or 2 with
 * "FILE:LINE: rule" in err. */
int ar_run_load(const char *path, ar_run_req **out, int *num, char *err, size_t err_len);

/* Two observed step ends and the number of engine steps between them, (start, end]. */
typedef struct ar_step_interval {
    double start, end;
    int steps;
} ar_step_interval;
typedef struct ar_step_interval_stats {
    int num_nodes;            /* distinct first/last-token stamps: step ends seen */
    int num_components;       /* groups of stamps with step indices known relative to each other */
    int num_bad_components;   /* components whose requests disagree on a step count (preemption) */
    int num_dropped;          /* intervals of those components, left out */
    int num_inconsistent;     /* later stamp with no more steps: left out */
    int num_intervals;
} ar_step_interval_stats;
/* The step ends a run's requests reveal and the exact step counts between them (stepfit.c's
 * comment): stamps as nodes, requests as edges of output_len - 1 steps, each component's nodes
 * adjacent in time as one interval.  Returns the number of intervals (*out malloc'ed), -1 when
 * out of memory. */
int ar_step_intervals(const ar_run_req *reqs, int num_reqs, ar_step_interval **out, ar_step_interval_stats *stats);

/* The intervals cut into equal pieces of time, each with its batches rebuilt: the decodes at its
 * middle, and one mixed step of those decodes plus the prompts scheduled in the piece. */
typedef struct ar_stepfit_sample {
    size_t offset;            /* into query_lens / context_lens / entry_req: decodes first, then prompts */
    int capacity;             /* entries reserved at offset (every decode and prompt window, + 1) */
    int num_reqs;             /* entries of the mixed step */
    int num_decode;           /* decodes (the first entries) */
    int num_waiting;          /* requests between their first and last token left out of the decodes
                                 (preempted and waiting, from a simulation; 0 unless set) */
    double prefill_tokens;    /* prompt tokens computed in the piece (prompts spread over their windows) */
    double start_s;           /* the piece's start (the run's clock) */
    double length_s;          /* the piece's length */
    double recompute_tokens;  /* extra prompt tokens the piece computes that no stamp shows (recomputation
                                 after preemption, from a simulation; 0 unless set) */
    int recompute_chunk;      /* 1 when the mixed step carries a recompute chunk in the slot after its
                                 entries (a piece whose decodes leave budget), else 0 */
} ar_stepfit_sample;
typedef struct ar_stepfit_set {
    ar_step_interval *intervals;      /* [stats.num_intervals] */
    ar_step_interval_stats stats;
    int *sample_start;                /* [num_intervals + 1]: interval k's samples */
    ar_stepfit_sample *samples;
    int *query_lens, *context_lens;   /* per sampled request */
    int *entry_req;                   /* per sampled request: its index in reqs (-1: the recompute chunk) */
    bool *keep;                       /* [num_intervals]: false once rejected as an outlier */
    double *recompute_tokens;         /* [num_intervals]: hidden recompute prefill per interval (0 = none) */
    int budget;                       /* the scheduler's token budget per step */
    ar_run_req *reqs;                 /* [num_reqs]: a copy of the run's requests (pieces are rebuilt) */
    int *sched_order;                 /* [num_reqs]: request indices in the order first scheduled */
    int num_reqs;
} ar_stepfit_set;
/* Builds the intervals of a run, each cut into min(steps, samples_per_interval) pieces, with the
 * scheduler's token budget.  Returns 0, or 2 with err set. */
int ar_stepfit_build(const ar_run_req *reqs, int num_reqs, int budget, int samples_per_interval,
                     ar_stepfit_set *set, char *err, size_t err_len);
void ar_stepfit_free(ar_stepfit_set *set);
/* One piece's decode-only step, or with mixed its mixed step (pointers into set). */
void ar_stepfit_features(const ar_stepfit_set *set, int sample, bool mixed, ar_batch_features *f);
/* Sets interval k's hidden recompute prefill (tokens >= 0): spread evenly over its pieces, each
 * piece's share added to its prompt tokens; a piece whose mixed step holds no prompt gets a
 * recompute chunk (context 0) of its share, up to the budget its decodes leave. */
void ar_stepfit_set_recompute(ar_stepfit_set *set, int k, double tokens);
/* Sets which requests wait preempted during piece `sample` (waiting: [num_reqs] indexed like the
 * run's requests, from a simulation; NULL = none): they are not counted as decoding there although
 * between their first and last token, and the budget they leave goes to the piece's prompts as
 * the build gives it.  Replaces the piece's previous setting; keeps its recompute share.  Returns
 * the decodes left out. */
int ar_stepfit_set_waiting(ar_stepfit_set *set, int sample, const bool *waiting);
/* The steps the model fits into interval k: per piece, the mixed steps its prompt and recompute
 * tokens need ((prefill_tokens + recompute_tokens) / the mixed step's prompt tokens) and decode
 * steps in the time they leave. */
double ar_stepfit_predicted_steps(const ar_stepfit_set *set, int k, const ar_steptime *st);
/* log(predicted / observed steps) of interval k; NAN when the model predicts none. */
double ar_stepfit_residual(const ar_stepfit_set *set, int k, const ar_steptime *st);
/* Mean absolute residual over the kept intervals (least absolute deviations). */
double ar_stepfit_loss(const ar_stepfit_set *set, const ar_steptime *st);
/* Keeps only intervals whose residual under st lies within k_mad scaled median absolute
 * deviations (1.4826 MAD) of the median residual.  Returns the number rejected, -1 out of memory. */
int ar_stepfit_reject(ar_stepfit_set *set, const ar_steptime *st, double k_mad);

/* ---- measured profiles (sim/profile.c) ------------------------------------------------------ */

/* Reads a profile database written by `attnreplay profile`.  Returns 0, or 2 with "PATH: rule"
 * in err (missing tables, grids not ascending or incomplete, non-positive times). */
int ar_profile_load(const char *path, ar_profile_table *p, char *err, size_t err_len);
/* 0 when a profile may be written at path: nothing there, an empty file or a profile (meta format
 * attnreplay-profile), in a directory that takes new files (ar_db_check_writable); else -1 with err
 * naming path and what it is (a results database, another file, a directory) or why its directory
 * cannot take it (missing, not a directory, read-only).  What is there is never replaced. */
int ar_profile_check_replaceable(const char *path, char *err, size_t err_len);
/* Writes p (and the command line that made it, for the meta table) to a new database beside path,
 * then renames it over path, which ar_profile_check_replaceable must accept.  Returns 0, -1 with
 * err set (a write failed), or -2 with err set (path holds something other than a profile). */
int ar_profile_save(const char *path, const ar_profile_table *p, const char *command, char *err,
                    size_t err_len);
/* One layer's attention time in microseconds for a batch shape, interpolated from the profile:
 * decode requests (one token) together from the decode grid at their count and mean context,
 * every other request alone from the prefill grid; with a mixed grid, a step holding decodes and
 * prefills takes its largest prefill (most tokens, the first of equals) and the decodes from the
 * mixed grid, every other prefill alone.  With prompts_together (LLMServingSim's lookup) the
 * prefills are one lookup at their summed tokens and contexts (with the decodes, one mixed cell).
 * With a skew table the decodes' lookup is corrected for their unequal contexts.  Requests of no
 * tokens cost nothing. */
double ar_profile_attention_us(const ar_profile_table *p, const int *query_lens /* [n] */,
                               const int *context_lens /* [n] */, int n);
/* Time of GEMM g at m tokens in microseconds: linear interpolation on the grid, proportional to
 * m beyond its end, the first point's time below it. */
double ar_profile_gemm_us(const ar_profile_table *p, int g, double m);
/* Times one layer's attention (median of repeat, KV write included) for batch requests of q new
 * tokens after ctx context tokens each, through the named backend (replay/backend.h), with the
 * model's heads divided by tp.  Returns 0 with *us set, 2 when the backend cannot run the shape,
 * 3 on a device/runtime error; err set. */
int ar_profile_time_attention(const char *backend_name, const ar_model *model, int tp, int batch, int q, int ctx,
                              int repeat, double *us, char *err, size_t err_len);
/* Reads one tensor-parallel folder of an LLMServingSim profile bundle (dense.csv,
 * per_sequence.csv, attention.csv and, where present, skew.csv with skew_fit.csv:
 * github.com/casys-kaist/LLMServingSim, profiler/perf/<card>/<model>/<variant>/tp<N>/) of a
 * Llama-architecture model into p (sim/profile_import.c), with LLMServingSim's attention lookup
 * (prompts_together, the skew table when the folder has one).  device
 * is what p records as measured on.  note (may be NULL) receives a line on the grids kept.
 * Returns 0, or 2 with "FILE:LINE: rule" or "FILE: rule" in err. */
int ar_profile_import_llmservingsim(const char *dir, const ar_model_preset *preset, int tp, const char *device,
                                    ar_profile_table *p, char *note, size_t note_len, char *err, size_t err_len);
/* `attnreplay profile ...`: 0 done, 2 bad input/usage, 3 device/runtime error. */
int ar_profile_main(int argc, char **argv);
/* Least-squares fit of a replay database's measured attention time (steps.time_us, summed over
 * the run's replayed layers, scaled to model_layers) as coef[0] + coef[1]*num_tokens +
 * coef[2]*num_reqs + coef[3]*total_context seconds.  run_id 0 = the newest run with timed
 * steps.  Returns the number of steps used (>= 4), or -1 with err set. */
int ar_steptime_fit_db(const char *db_path, int64_t run_id, int model_layers, double coef[4],
                       char *err, size_t err_len);

/* ---- the simulator (sim/scheduler.c) -------------------------------------------------------- */

/* Scheduler behaviours in which vLLM versions differ (sim/README.md gives each with its vLLM
 * source).  All false = vLLM 0.33's defaults; each true selects the older behaviour. */
typedef struct ar_sim_compat {
    bool no_reserve_full_isl;     /* admit a waiting request when its first chunk fits, not its
                                     whole prompt (SchedulerConfig.scheduler_reserve_full_isl off) */
    bool threshold_when_alone;    /* long_prefill_token_threshold caps a request even when it is the
                                     only running or waiting one */
    bool fifo_free;               /* freed blocks all join the free queue's tail; 0.33 puts blocks
                                     without a prefix-cache hash at the head (reused first) */
} ar_sim_compat;

typedef struct ar_sim_config {
    ar_trace_header header;            /* model, cache (block_size, num_blocks), scheduler */
    int long_prefill_token_threshold;  /* 0 = off */
    int max_model_len;                 /* 0 = unlimited */
    int num_sms;                       /* for the cascade-eligibility statistic (132 = H200) */
    ar_sim_compat compat;              /* zero = vLLM 0.33 */
    ar_steptime steptime;
} ar_sim_config;

typedef enum ar_sim_status {
    AR_REQ_PENDING = 0,     /* not arrived yet */
    AR_REQ_WAITING = 1,     /* in the waiting queue, never scheduled */
    AR_REQ_RUNNING = 2,
    AR_REQ_PREEMPTED = 3,   /* in the waiting queue after preemption */
    AR_REQ_FINISHED = 4,
    AR_REQ_SKIPPED = 5      /* can never fit the KV cache */
} ar_sim_status;

/* One request's state and metrics as the simulator sees it. */
typedef struct ar_sim_req_info {
    const char *id;
    ar_sim_status status;
    int prompt_len, output_len;
    int num_computed_tokens;
    int num_output_tokens;          /* generated so far */
    const int *block_ids;           /* [num_blocks] held now */
    int num_blocks;
    const uint64_t *prompt_keys;    /* [num_prompt_keys] */
    int num_prompt_keys;
    int num_preemptions;
    int prefix_hit_tokens;          /* at first admission */
    double arrival, first_scheduled, first_token, last_token;  /* seconds; -1 = not yet */
} ar_sim_req_info;

typedef struct ar_sim_summary {
    int num_requests, num_finished, num_skipped;
    int64_t steps, preemptions, cascade_eligible_steps;
    int64_t prompt_tokens, prefix_hit_tokens, output_tokens, scheduled_tokens;
    double duration;                /* time at the end of the last step */
    double kv_usage_mean;           /* time-weighted held blocks / usable blocks */
    double kv_usage_max;
} ar_sim_summary;

typedef struct ar_sim ar_sim;

/* Builds a simulator; the workload must outlive it.  Requests that can never fit the KV cache
 * are skipped (status AR_REQ_SKIPPED, counted, one warning each on stderr up to 5).
 * NULL with err set on bad configuration. */
/* The simulated clock ticks in whole microseconds held in a double, exact up to 2^53 us (about
 * 285 years); an arrival or a step end past it is refused as bad input (exit 2). */
#define AR_SIM_MAX_CLOCK_S (9007199254740992.0 / 1e6)

ar_sim *ar_sim_create(const ar_sim_config *cfg, const ar_workload *wl, char *err, size_t err_len);
/* 0 when at least one request of wl can run on num_blocks blocks (block 0 is the null block) of
 * block_size tokens within max_model_len (0 = no limit); else 2 with err naming the smallest
 * request (its file and line) and what it needs.  sim and plan refuse such a configuration
 * (ar_sim_create itself runs it, every request skipped). */
int ar_sim_check_any_fits(const ar_workload *wl, int num_blocks, int block_size, int max_model_len, char *err,
                          size_t err_len);
/* Runs one step.  Returns 1 with *step set (owned by the simulator, valid until the next
 * call), 0 when every request has finished, -1 on an internal error (err set), -2 when the
 * inputs cannot be simulated: the step-time model gives a non-finite duration, or the clock
 * would pass the largest finite number of seconds (err set; bad input, not a fault). */
int ar_sim_step(ar_sim *s, const ar_step **step, char *err, size_t err_len);
/* Features of the last step (for tests and reports). */
const ar_batch_features *ar_sim_last_features(const ar_sim *s);
void ar_sim_destroy(ar_sim *s);

/* Inspection. */
int ar_sim_num_blocks(const ar_sim *s);
int ar_sim_free_blocks(const ar_sim *s);         /* length of the free queue, walked */
int ar_sim_block_ref(const ar_sim *s, int block); /* reference count */
int ar_sim_num_requests(const ar_sim *s);
void ar_sim_request(const ar_sim *s, int i, ar_sim_req_info *info);
const ar_workload_req *ar_sim_workload_req(const ar_sim *s, int i);
int ar_sim_num_running(const ar_sim *s);
int ar_sim_num_waiting(const ar_sim *s);
void ar_sim_summarize(const ar_sim *s, ar_sim_summary *sum);
/* The content key a request's logical block holds (full prompt block: its prompt key, else
 * request-private, chained), as replay will see it. */
uint64_t ar_sim_logical_key(const ar_sim *s, int req, int block_index);

/* ---- metrics (sim/metrics.c) ---------------------------------------------------------------- */

/* Writes the per-request table: PATH ending in .db/.sqlite is SQLite (tables sim_requests,
 * sim_steps_kv, sim_summary), anything else CSV (and PATH.kv.csv with KV usage over time).
 * Returns 0, or with err set 2 when another connection's lock on the database outlasted the
 * busy timeout (ATTNREPLAY_BUSY_TIMEOUT_MS; bad input), -1 on any other failure. */
int ar_sim_write_metrics(const ar_sim *s, const char *path, char *err, size_t err_len);
/* True when ar_sim_write_metrics writes path as SQLite (else CSV plus PATH.kv.csv). */
bool ar_sim_metrics_is_sqlite(const char *path);
/* 0, or 2 with err naming path when path is meant for SQLite and is an existing file that is
 * not an SQLite database, or one another connection keeps locked past the busy timeout (checked
 * before the simulation, so bad input stops it). */
int ar_sim_metrics_check(const char *path, char *err, size_t err_len);
/* Output paths, checked before any work so a bad one costs nothing: ar_output_file_check says
 * whether a file can be created (or overwritten) at path - not a directory, its directory
 * present and writable - leaving nothing behind; ar_output_dir_prepare creates the directory
 * (not its parents) when missing and checks a file can be created in it.  Both return 0, or -1
 * with "PATH: why" (the system's own words) in err.  ar_same_file: the two paths name one file
 * (the same inode, or, for files not yet there, the same resolved directory and name). */
int ar_output_file_check(const char *path, char *err, size_t err_len);
int ar_output_dir_prepare(const char *path, char *err, size_t err_len);
bool ar_same_file(const char *a, const char *b);
/* Prints the summary (p50/p90/p99 of TTFT, TPOT, E2E, queueing; throughput; KV usage; prefix
 * hit rate; preemptions; cascade-eligible steps) to f.  For vllm-run workloads it adds the real
 * engine's TTFT and TPOT over the same requests and the gaps of mean, p50 and p90. */
void ar_sim_print_summary(const ar_sim *s, FILE *f);
/* Simulated against real (vllm-run workloads): mean, p50 and p90 of TTFT and TPOT (seconds) over
 * the requests that finished in the simulation and have real timings, and the gaps sim / real - 1. */
typedef struct ar_fidelity {
    int num_ttft, num_tpot;                  /* requests compared */
    double sim_ttft[3], real_ttft[3], gap_ttft[3];   /* [mean, p50, p90] */
    double sim_tpot[3], real_tpot[3], gap_tpot[3];
} ar_fidelity;
/* Returns 0, or -1 when no finished request has real timings (not a vllm-run workload). */
int ar_sim_fidelity(const ar_sim *s, ar_fidelity *out);
/* Offered load against what the engine serves.  Work = tokens the engine must schedule for a
 * request (prompt - prefix-hit tokens + output - 1); offered = the work of every admitted
 * request / the time from the first to the last arrival; served = tokens scheduled per
 * second over the steps that left requests waiting (the engine's rate when it is the
 * bottleneck).  Overloaded: offered > AR_SIM_OVERLOAD x served with requests still waiting at
 * the last arrival - the queue then grows for as long as requests keep coming. */
#define AR_SIM_OVERLOAD 1.05
typedef struct ar_sim_load {
    int requests;                 /* admitted (not skipped) */
    double arrival_span_s;        /* first to last arrival */
    double offered_tokens_per_s;
    double served_tokens_per_s;   /* 0 when no step left a request waiting */
    double backlogged_s;          /* simulated time with requests waiting */
    double load;                  /* offered / served (0 when served is 0) */
    int waiting_at_last_arrival;
    double queueing_first_tenth_s, queueing_last_tenth_s;  /* mean, by arrival order */
    bool overloaded;
} ar_sim_load;
void ar_sim_load_check(const ar_sim *s, ar_sim_load *out);
/* The warning sim prints on stderr for an overloaded run (one paragraph, no newline at the end). */
void ar_sim_load_warning(const ar_sim_load *load, char *buf, size_t len);

/* q-quantile (0..1) of values (sorted in place), linear interpolation; 0 for n == 0. */
double ar_quantile(double *values /* [n] */, int n, double q);

/* KV usage sample recorded per step (for metrics writers). */
typedef struct ar_sim_kv_sample {
    double time;
    int used_blocks;       /* blocks with ref > 0 */
    int running, waiting;
    int num_tokens;
    int admitted_prompt_tokens;  /* prompts of requests admitted for the first time this step */
    int admitted_hit_tokens;     /* of which prefix-cache hits */
} ar_sim_kv_sample;
const ar_sim_kv_sample *ar_sim_kv_samples(const ar_sim *s, int64_t *count);

/* ---- the command -------------------------------------------------------------------------- */

/* `attnreplay sim ...` (argv[0] = "sim"): returns 0, or 2 on bad input/usage, 1 on I/O error. */
int ar_sim_main(int argc, char **argv);
/* A size on the command line ("123", "5.4GiB", "40GB", "512MiB", "2G") in bytes; -1 when malformed
 * or not positive (the commands' --kv-mem and --verify-mem). */
double ar_parse_size(const char *s);

#ifdef __cplusplus
}
#endif
#endif
