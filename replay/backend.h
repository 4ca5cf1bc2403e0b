/* backend.h - what an attention backend is (DESIGN section 6) and the per-step batch it sees.
 *
 * A backend is three pieces, as in vLLM:
 *   descriptor  - name, capabilities and check(config, why): yes, or no with a reason;
 *   prepare     - the MetadataBuilder: once per step, ar_batch -> the backend's own metadata;
 *   forward     - the Impl: per layer, generate this step's inputs (Q, new K/V) from the data
 *                 generator on the backend's own device, write new K/V into the paged cache
 *                 through slot_mapping (slot -1 skipped), compute out + LSE, and hand them to
 *                 verification (device pointers, and host copies when the engine asks), with
 *                 per-kernel times.
 * The paged cache [2, num_blocks, block_size, num_kv_heads, head_size] (MLA:
 * [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]) lives inside the backend, one per
 * layer, in the run's KV dtype, and every slot starts as NaN so that a read of a slot nobody
 * wrote shows up in the output.
 *
 * All arrays in ar_batch are host memory, row-major, owned by the replay engine, and valid
 * for the duration of one step. */
#ifndef AR_BACKEND_H
#define AR_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "../reference/datagen.h"
#include "../traces/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Planted faults (--inject NAME).  Every backend implements every one; the verifier must flag
 * each.  Metadata faults (slot mapping, block table) are applied by the replay engine to the
 * batch before prepare(); kernel faults are honoured inside forward(). */
typedef enum ar_fault {
    AR_FAULT_NONE = 0,
    AR_FAULT_CAUSAL_OFF_BY_ONE,  /* query at p also sees key p+1 */
    AR_FAULT_WRONG_SLOT,         /* new K/V written to slot ^ 1 (the neighbour in the block) */
    AR_FAULT_STALE_BLOCK_TABLE,  /* attention reads the previous step's block table rows */
    AR_FAULT_WRONG_KV_HEAD,      /* query head h reads KV head (h / group + 1) % num_kv_heads */
    AR_FAULT_NO_RESCALE,         /* online softmax forgets to rescale the accumulator */
    AR_FAULT_LSE_BASE2,          /* LSE reported as log2 instead of natural log */
    AR_FAULT_MERGE_NO_WEIGHTS,   /* cascade/split merge adds the two sides unweighted */
    AR_FAULT_MLA_NO_WUV,         /* MLA output left in latent space (W_UV skipped) */
    AR_FAULT_COUNT
} ar_fault;

const char *ar_fault_name(ar_fault f);
int ar_fault_parse(const char *name, ar_fault *out);   /* 0 ok, -1 unknown */

/* Everything about a run that does not change per step. */
typedef struct ar_run_config {
    ar_model model;
    int block_size;
    int num_blocks;
    ar_dtype dtype;          /* Q/O and compute input dtype */
    ar_dtype kv_dtype;       /* paged cache dtype */
    double kv_scale;         /* fp8 KV: stored = quantize(x / kv_scale); 1.0 otherwise */
    int num_layers;          /* layers replayed (<= model.num_layers) */
    uint64_t seed;
    ar_datadist data;
    ar_fault fault;
    int cascade_mode;        /* 0 off, 1 auto (vLLM heuristic), 2 on whenever P > 0 is legal */
    int repeat;              /* timed repetitions per launch (median reported); >= 1 */
    int threads;             /* CPU threads; 0 = all cores */
    int device_index;        /* CUDA device ordinal among the visible ones (replay/shard.h chooses it
                                from the local rank); device backends cudaSetDevice it first */
} ar_run_config;

/* One step's batch, backend-independent (vLLM CommonAttentionMetadata + content keys). */
typedef struct ar_batch {
    int64_t step;
    int num_reqs;
    int num_tokens;                 /* T = sum of query lens */
    const int *query_start_loc;     /* [num_reqs + 1] */
    const int *seq_lens;            /* [num_reqs] context + new */
    const int *context_lens;        /* [num_reqs] num_computed_tokens before the step */
    int max_query_len;
    int max_seq_len;
    int max_blocks_per_req;         /* row stride of block_table and block_keys */
    const int *block_table;         /* [num_reqs, max_blocks_per_req], unused entries 0 */
    const uint64_t *block_keys;     /* [num_reqs, max_blocks_per_req] content key per logical block */
    const uint64_t *req_keys;       /* [num_reqs] Q key per request (ar_req_key of its id) */
    const int64_t *slot_mapping;    /* [num_tokens], -1 = skip */
    int common_prefix_len;          /* cascade P actually used this step (0 = flat) */
} ar_batch;

/* Context tokens the cache must hold before a step but that this run never wrote (a replay
 * started mid-trace with --steps or --resume, or a prefix hit on a block written before the
 * first replayed step).  Written untimed, from the generator, with the given content keys. */
typedef struct ar_fill {
    int count;
    const int64_t *slots;           /* [count] physical slot = block * block_size + offset */
    const uint64_t *keys;           /* [count] content key of the token's logical block */
    const int *offsets;             /* [count] offset of the token in its block */
} ar_fill;

/* Kernel timing of one forward (per layer). */
#define AR_MAX_KERNELS 8
typedef struct ar_kernel_time {
    const char *name;               /* "write", "attn", "prefix", "suffix", "merge", "combine", ... */
    double us;                      /* median over repeats */
} ar_kernel_time;

/* Kernel paths (kernel-path coverage): the code paths one forward ran, by name, so that every
 * step records which of a backend's decision-function outcomes it exercised (the `coverage`
 * table, replay/db.h).  A name is "PASS:KERNEL" or a plain word, stable across builds, and a
 * string literal (or text that lives as long as the backend's registration); a forward lists each
 * path once.  The names each backend reports:
 *   cpu       "flat", or on cascade steps "cascade-prefix", "cascade-suffix", "cascade-merge";
 *             "kv-fp8" when the cache is fp8
 *   cpu-mla   "mla-decode:absorbed", "mla-prefill:new" (a prefill request's new tokens),
 *             "mla-prefill:context" (its context, gathered in workspace chunks and merged by LSE);
 *             "kv-fp8"
 *   cuda      flat steps "attn:KERNEL", cascade steps "cascade-prefix:KERNEL" and
 *             "cascade-suffix:KERNEL", KERNEL one of prefill-wg (wgmma), prefill (mma.sync),
 *             decode (mma.sync), decode-tma, with "+split" when the launch was split and a
 *             combine merged the pieces; "cascade-prefix-combine:folded" when the suffix pass
 *             combined the prefix pass's pieces itself; "cascade-merge:fused" or
 *             "cascade-merge:separate"
 *   cuda-mla  "mla-decode:ROUTE[+split]" (ROUTE the decision function's kernel: tc-wgmma,
 *             tc-wgmma-cpasync, tc-narrow-bulk, tc-narrow, tc-split-qk, simt), "mla-prefill:new",
 *             "mla-prefill:context", "mla-prefill-attn:wgmma" (the prefill passes' attention on the
 *             Hopper wgmma kernel, the default for QK 192 / V 128 on compute capability 9.0),
 *             "mla-prefill-attn:tc" (on the mma.sync kernel: AR_MLA_PREFILL=tc, or the default
 *             elsewhere), "kv-fp8"
 *   plugins   "plugin:NAME"
 * Paths are derived from the plan the backend's decision function made (no kernel reports). */
#define AR_MAX_PATHS 8

/* What forward returns.  out and lse are host buffers allocated by the engine, or NULL when
 * the engine does not need the output on the host (the verifier works on the device, see
 * verify.h ar_verifier_needs_host_output): a device backend then makes no host copy at all.
 * A device backend always sets dev_out / dev_lse / dev_stream: where this layer's output lives
 * on the device (valid until its next prepare or forward) and the CUDA stream that wrote it. */
typedef struct ar_forward_out {
    float *out;                     /* [num_tokens, num_q_heads, v_head_dim], values in dtype; or NULL */
    float *lse;                     /* [num_q_heads, num_tokens], natural log; empty row: -inf; or NULL */
    const void *dev_out;            /* device [num_tokens, num_q_heads, v_head_dim] of dev_out_type;
                                       NULL for a host backend */
    ar_dtype dev_out_type;          /* the run's 16-bit dtype (its bits) or AR_FP32 (float values,
                                       already rounded to the dtype) */
    const float *dev_lse;           /* device [num_q_heads, num_tokens] */
    void *dev_stream;               /* cudaStream_t the output was produced on */
    int num_kernels;
    ar_kernel_time kernels[AR_MAX_KERNELS];
    double total_us;                /* median wall time of the whole timed part */
    int guard_violations;           /* device guard-region words found overwritten */
    int num_paths;                  /* kernel paths this forward ran (see AR_MAX_PATHS) */
    const char *paths[AR_MAX_PATHS];
} ar_forward_out;

/* Adds a kernel path to o (once; at most AR_MAX_PATHS). */
static inline void ar_forward_add_path(ar_forward_out *o, const char *name)
{
    for (int i = 0; i < o->num_paths; i++)
        if (o->paths[i] == name || strcmp(o->paths[i], name) == 0) return;
    if (o->num_paths < AR_MAX_PATHS) o->paths[o->num_paths++] = name;
}

typedef struct ar_backend {
    const char *name;               /* "cpu", "cuda", "cuda-mla", ... */
    const char *summary;            /* one line for `attnreplay backends` */
    const char *capabilities;       /* one line: dtypes, head sizes, block sizes, features */
    bool needs_gpu;
    /* Says yes (returns true) or no with a reason in why.  The one decision function: the
     * selector, --backend and `backends` all call it. */
    bool (*check)(const ar_run_config *cfg, char *why, size_t why_len);
    /* Allocates the per-layer caches (filled with NaN) and device state. 0 ok, else err set;
     * returns 3 for a device/runtime error, 2 for a config the backend cannot run. */
    int (*open)(const ar_run_config *cfg, void **state, char *err, size_t err_len);
    /* MetadataBuilder: once per step, before the layers. 0 ok. */
    int (*prepare)(void *state, const ar_batch *b, char *err, size_t err_len);
    /* Untimed: writes missing context tokens (see ar_fill) into layer's cache. 0 ok. */
    int (*fill)(void *state, int layer, const ar_fill *f, char *err, size_t err_len);
    /* Impl: generates Q/new K/V for layer, writes K/V via slot_mapping, attention, out+LSE. */
    int (*forward)(void *state, int layer, const ar_batch *b, ar_forward_out *o,
                   char *err, size_t err_len);
    /* Device name for the runs table ("cpu: 2 threads", "NVIDIA H200"). */
    void (*device_name)(void *state, char *buf, size_t len);
    void (*close)(void *state);
} ar_backend;

/* The value a K/V element has after its trip through the paged cache: x itself when the cache
 * holds the run's dtype, else the stored quantize(x / kv_scale) read back times kv_scale (vLLM's
 * fp8 scaled_convert), in float.  Backends and the verifier both use this one definition. */
AR_HOSTDEV float ar_kv_roundtrip(ar_dtype kv_dtype, ar_dtype dtype, float kv_scale, float x)
{
    if (kv_dtype == dtype) return x;
#ifdef __CUDA_ARCH__
    return __fmul_rn(ar_round_to(kv_dtype, __fdiv_rn(x, kv_scale)), kv_scale); /* no fast-math */
#else
    return ar_round_to(kv_dtype, x / kv_scale) * kv_scale;
#endif
}

/* The registry (registry.c): backends in selector priority order. */
int ar_backend_count(void);
const ar_backend *ar_backend_at(int i);
const ar_backend *ar_backend_find(const char *name);
/* Adds a backend made at run time (a plugin, replay/plugin.h); it is found by name, never picked
 * by "auto".  0 ok, -1 when the table is full. */
int ar_backend_register(const ar_backend *b);
/* False for a backend that never runs cascade (a plugin without ATTNREPLAY_PLUGIN_CASCADE): the
 * engine then keeps every step's common_prefix_len 0. */
bool ar_backend_runs_cascade(const ar_backend *b);

#ifdef __cplusplus
}
#endif
#endif
