/* attnreplay_plugin.h - the plugin ABI of attnreplay (version 2): bring your own attention kernel.
 *
 * A plugin is a shared library that exports one C symbol,
 *
 *     const attnreplay_plugin *attnreplay_plugin_init(const attnreplay_host_api *host,
 *                                                    int host_abi_version);
 *
 * and is loaded with `attnreplay replay TRACE --backend plugin:PATH.so --db DB`.  It returns the
 * same backend triple every built-in backend has (DESIGN section 6): check (can it run this
 * config), plan (the MetadataBuilder, once per step) and forward (the Impl, once per layer).
 * This header is the whole contract: a plugin includes it and links nothing of attnreplay's.
 *
 * Division of labour.  The host reads and validates the trace, owns the paged KV cache of every
 * layer (vLLM's layout [2, num_blocks, block_size, num_kv_heads, head_size], every slot NaN until
 * written), generates each layer's inputs (Q and the new K/V) on the plugin's device with its
 * deterministic generator, writes the new K/V into the cache through slot_mapping unless the
 * plugin says it writes them itself (vLLM's reshape_and_cache before FlashAttention's forward),
 * times forward (CUDA events on the host's stream for a CUDA plugin, its --repeat calls back to
 * back and waited for once; a monotonic clock for a CPU one; the median of --repeat), verifies out and LSE against its float64 reference and
 * stores everything in SQLite.  The plugin only does attention.
 *
 * Rules a plugin follows:
 *  - Every function returns 0 on success.  On failure it calls host->set_error(text) first and
 *    returns non-zero: from check() that means "cannot run this config" (the text is the reason,
 *    shown to the user; exit 2); from open() a config it refuses (exit 2); from plan() or
 *    forward() a runtime failure (the replay stops with exit 3).
 *  - Tensors are DLPack DLTensors (below); the host owns all of them, valid for the call only
 *    (metadata: from plan() until the next plan()).  A plugin never frees or keeps them.
 *  - A CUDA plugin launches on host->cuda_stream() (also args->stream), creates no streams of
 *    its own for the timed work and never synchronises the device inside forward.  It uses the
 *    primary context of device config->device.device_id.  Its out/LSE stay on the device.
 *  - forward() writes out [T, Hq, D] in the run's dtype and lse [Hq, T] in float32, natural log
 *    (an empty row: out 0, lse -inf).  Before each forward the host fills out and lse with NaN,
 *    and it checks guard words after them afterwards, so stale or stray writes show.
 *  - The host never dlcloses a plugin: it stays loaded until the process exits.
 *  - The host calls the plugin from one thread.
 *  - A plugin that faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, abort()) or does not return within
 *    --forward-timeout ends the replay with a message naming it: in init or check() it is a
 *    broken plugin (exit 2, nothing stored); in open, plan or forward the run stops (exit 3, the
 *    run 'error', committed steps kept); in close(), which the host calls after the run's
 *    outcome is stored, the run stays as stored (exit 3).
 *
 * Versioning.  ATTNREPLAY_PLUGIN_ABI_VERSION changes whenever a struct below changes layout or a
 * rule changes meaning.  The host passes its version to init and refuses a plugin whose
 * attnreplay_plugin.abi_version it does not speak, with a message naming both versions.  A plugin
 * may itself return NULL (after set_error) when host_abi_version is not the one it was built for.
 * Version 2 appended the MLA fields to attnreplay_config (nothing moved), so this host still
 * loads a version-1 plugin; such a plugin is never offered an MLA model.
 *
 * Semantics of the attention (DESIGN section 5): request r with context c = seq_lens[r] - q_len
 * and q_len new tokens; query token i (absolute position p = c + i) of head h sees keys 0..p
 * (bottom-right causal), limited to the last sliding_window keys when set; score = scale * q.k,
 * soft-capped cap * tanh(score / cap) when logits_soft_cap > 0; GQA: query head h reads KV head
 * h / (num_q_heads / num_kv_heads).  The physical slot of position p of request r is
 * block_table[r][p / block_size] * block_size + p % block_size.
 *
 * MLA (DeepSeek's multi-head latent attention; a plugin with ATTNREPLAY_PLUGIN_MLA, config.attention
 * == ATTNREPLAY_ATTENTION_MLA).  The plugin does the latent attention, FlashMLA's part in vLLM; the
 * host does the projections around it, untimed, as vLLM's MLACommonImpl does in torch.  For every
 * token, prefills included (one form for all tokens):
 *   q        [T, num_q_heads, L + R]  the absorbed query [q_nope W_UK (L, rounded to dtype) | q_pe (R)];
 *   k_new    [T, 1, L + R]            the token's cache entry [kv_c (L) | k_pe (R)]; v_new absent;
 *   kv_cache [num_blocks, block_size, L + R]  one latent "KV head" in kv_dtype: keys are the whole
 *                                     entries, values their first L elements (concat_and_cache_mla);
 *   out      [T, num_q_heads, L]      softmax(scale q.k) . kv_c in dtype;  lse as above;
 * with L = kv_lora_rank, R = qk_rope_head_dim, head_size = L + R, num_kv_heads = 1, the causal rule
 * above, no window, soft cap or cascade.  The host multiplies out by W_UV per head and verifies
 * that against its float64 reference of the expanded form, on the plugin's device. */
#ifndef ATTNREPLAY_PLUGIN_H
#define ATTNREPLAY_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTNREPLAY_PLUGIN_ABI_VERSION 2
#define ATTNREPLAY_PLUGIN_ABI_STRING "2"   /* the same, for messages */
#define ATTNREPLAY_PLUGIN_ABI_OLDEST 1   /* the oldest plugin version this host still loads */

/* ---- DLPack ------------------------------------------------------------------------------
 * The tensor description of DLPack (https://dmlc.github.io/dlpack/latest/c_api.html), data
 * layout of DLPack 1.1 (the version with the float8 type codes), written out here so a plugin
 * needs nothing else.  A plugin that uses the real dlpack.h includes it BEFORE this header;
 * these definitions then step aside (the layouts are the same). */
#if !defined(DLPACK_MAJOR_VERSION) && !defined(DLPACK_VERSION)
#define ATTNREPLAY_DLPACK_MAJOR 1
#define ATTNREPLAY_DLPACK_MINOR 1

typedef enum {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
    kDLOpenCL = 4,
    kDLVulkan = 7,
    kDLMetal = 8,
    kDLVPI = 9,
    kDLROCM = 10,
    kDLROCMHost = 11,
    kDLExtDev = 12,
    kDLCUDAManaged = 13,
    kDLOneAPI = 14,
    kDLWebGPU = 15,
    kDLHexagon = 16,
    kDLMAIA = 17
} DLDeviceType;

typedef struct {
    DLDeviceType device_type;
    int32_t device_id;
} DLDevice;

typedef enum {
    kDLInt = 0,
    kDLUInt = 1,
    kDLFloat = 2,
    kDLOpaqueHandle = 3,
    kDLBfloat = 4,
    kDLComplex = 5,
    kDLBool = 6,
    kDLFloat8_e3m4 = 7,
    kDLFloat8_e4m3 = 8,
    kDLFloat8_e4m3b11fnuz = 9,
    kDLFloat8_e4m3fn = 10,
    kDLFloat8_e4m3fnuz = 11,
    kDLFloat8_e5m2 = 12,
    kDLFloat8_e5m2fnuz = 13,
    kDLFloat8_e8m0fnu = 14,
    kDLFloat6_e2m3fn = 15,
    kDLFloat6_e3m2fn = 16,
    kDLFloat4_e2m1fn = 17
} DLDataTypeCode;

typedef struct {
    uint8_t code;      /* a DLDataTypeCode */
    uint8_t bits;      /* 8, 16, 32, 64 */
    uint16_t lanes;    /* 1 */
} DLDataType;

typedef struct {
    void *data;        /* the host's pointer (CPU memory, or a CUDA device pointer) */
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;    /* [ndim] */
    int64_t *strides;  /* [ndim] in elements; attnreplay always passes them (row-major) */
    uint64_t byte_offset;
} DLTensor;
#endif

/* ---- what the host offers -------------------------------------------------------------- */

/* Passed to init; valid until the process exits, so a plugin may keep the pointer.  The
 * functions take plain strings (no varargs, so any FFI can call them): format with snprintf. */
typedef struct attnreplay_host_api {
    int32_t abi_version;                 /* ATTNREPLAY_PLUGIN_ABI_VERSION of the host */
    int32_t struct_size;                 /* sizeof(attnreplay_host_api) in the host */
    /* The reason the current call fails; the host shows it (prefixed with the plugin's name). */
    void (*set_error)(const char *message);
    /* A line on stderr; level 0 error, 1 warning, 2 info, 3 debug (shown with
     * ATTNREPLAY_PLUGIN_LOG=3). */
    void (*log)(int level, const char *message);
    /* The cudaStream_t (as void *) the host runs and times a CUDA plugin on; NULL for a CPU one. */
    void *(*cuda_stream)(void);
    /* Splits forward's timed region: ends the part that began at the start of forward (or at the
     * previous mark) and names it (at most 15 characters kept), e.g. "gather" in an adapter that
     * copies paged K/V into a contiguous buffer before calling a dense kernel.  The part after
     * the last mark is named "attn".  At most ATTNREPLAY_MAX_MARKS marks per forward; more are
     * ignored.  CUDA: an event on the host stream; CPU: the monotonic clock. */
    void (*time_mark)(const char *name);
} attnreplay_host_api;

#define ATTNREPLAY_MAX_MARKS 5

/* Log levels for host->log. */
#define ATTNREPLAY_LOG_ERROR 0
#define ATTNREPLAY_LOG_WARN 1
#define ATTNREPLAY_LOG_INFO 2
#define ATTNREPLAY_LOG_DEBUG 3

/* ---- the run configuration (check / open) ---------------------------------------------- */

typedef struct attnreplay_config {
    int32_t struct_size;                 /* sizeof(attnreplay_config) */
    const char *model_name;              /* from the trace header, e.g. "llama-3.1-8b" */
    int32_t num_q_heads;
    int32_t num_kv_heads;                /* num_q_heads is a multiple of it (GQA / MQA) */
    int32_t head_size;                   /* K, V and output head dim */
    float scale;                         /* softmax scale */
    int32_t sliding_window;              /* 0 = none, else the last W keys */
    float logits_soft_cap;               /* 0 = none */
    int32_t block_size;                  /* tokens per cache block (page) */
    int32_t num_blocks;                  /* blocks per layer's cache, the null block 0 included */
    int32_t num_layers;                  /* layers replayed; forward's layer is 0..num_layers-1 */
    DLDataType dtype;                    /* q, k_new, v_new and out: float32, float16 or bfloat16 */
    DLDataType kv_dtype;                 /* the cache: dtype, or float8_e4m3fn */
    float kv_scale;                      /* float8 cache: value = stored * kv_scale; else 1 */
    int32_t cascade;                     /* --cascade: 0 off, 1 auto (vLLM's heuristic), 2 on */
    const char *inject;                  /* a planted kernel fault (--inject) the plugin must
                                            reproduce, or "none"; the metadata faults are applied
                                            by the host to the metadata and show as "none" */
    int32_t repeat;                      /* --repeat: forward runs this many times per layer */
    DLDevice device;                     /* where the host puts tensors: the plugin's device */
    /* version 2: */
    int32_t attention;                   /* ATTNREPLAY_ATTENTION_MHA (GQA, MQA) or _MLA (see MLA above) */
    int32_t kv_lora_rank;                /* MLA: L, the latent width and out's head dim (512); else 0 */
    int32_t qk_rope_head_dim;            /* MLA: R, the rope part of q and of a cache entry (64); else 0 */
} attnreplay_config;

#define ATTNREPLAY_ATTENTION_MHA 0
#define ATTNREPLAY_ATTENTION_MLA 1

/* ---- per-step metadata (plan) -----------------------------------------------------------
 * vLLM's FlashAttentionMetadata, field for field.  Each tensor is on the plugin's device; the
 * *_cpu twins hold the same values in host memory (vLLM's seq_lens_cpu etc.), so a CUDA plugin
 * can plan without a device round trip.  A tensor whose data is NULL is absent (vLLM's None):
 * the cascade fields when use_cascade is 0. */
typedef struct attnreplay_metadata {
    int32_t struct_size;                 /* sizeof(attnreplay_metadata) */
    int64_t step;                        /* the trace step */
    int32_t num_reqs;
    int32_t num_actual_tokens;           /* T = query_start_loc[num_reqs] */
    int32_t max_query_len;
    int32_t max_seq_len;
    DLTensor query_start_loc;            /* int32 [num_reqs + 1] */
    DLTensor seq_lens;                   /* int32 [num_reqs]: context + new tokens */
    DLTensor block_table;                /* int32 [num_reqs, max_blocks_per_req], unused 0 */
    DLTensor slot_mapping;               /* int64 [T], -1 = do not write this token */
    int32_t use_cascade;                 /* 1: the host asks for cascade this step (only when the
                                            plugin has ATTNREPLAY_PLUGIN_CASCADE) */
    int32_t common_prefix_len;           /* P tokens shared by every request (0 = flat) */
    DLTensor cu_prefix_query_lens;       /* int32 [2] = {0, T} */
    DLTensor prefix_kv_lens;             /* int32 [1] = {P} */
    DLTensor suffix_kv_lens;             /* int32 [num_reqs] = seq_lens - P */
    DLTensor query_start_loc_cpu;        /* host twins of the tensors above */
    DLTensor seq_lens_cpu;
    DLTensor block_table_cpu;
    DLTensor slot_mapping_cpu;
    DLTensor context_lens_cpu;           /* int32 [num_reqs]: num_computed_tokens before the step */
} attnreplay_metadata;

/* ---- per-layer forward ------------------------------------------------------------------ */

typedef struct attnreplay_forward_args {
    int32_t struct_size;                 /* sizeof(attnreplay_forward_args) */
    int32_t layer;
    const attnreplay_metadata *md;       /* the last plan()'s */
    DLTensor q;                          /* [T, num_q_heads, head_size] dtype */
    DLTensor k_new;                      /* [T, num_kv_heads, head_size] dtype */
    DLTensor v_new;                      /* [T, num_kv_heads, head_size] dtype; MLA: absent (data NULL) */
    DLTensor kv_cache;                   /* [2, num_blocks, block_size, num_kv_heads, head_size]
                                            kv_dtype, this layer's; [0] keys, [1] values.  Holds
                                            k_new/v_new already unless the plugin writes them.
                                            MLA: [num_blocks, block_size, L + R] */
    DLTensor out;                        /* [T, num_q_heads, head_size] dtype: write here (MLA:
                                            [T, num_q_heads, L]) */
    DLTensor lse;                        /* [num_q_heads, T] float32, natural log: write here */
    void *stream;                        /* cudaStream_t of a CUDA plugin; NULL on the CPU */
} attnreplay_forward_args;

/* ---- what the plugin returns from init ---------------------------------------------------- */

/* Capability flags. */
#define ATTNREPLAY_PLUGIN_WRITES_KV 0x1u /* forward writes k_new/v_new into kv_cache through
                                            slot_mapping itself (FlashAttention style); without it
                                            the host writes them before forward (vLLM's
                                            reshape_and_cache, timed as "write") */
#define ATTNREPLAY_PLUGIN_CASCADE 0x2u   /* plan/forward handle use_cascade (prefix + suffix
                                            passes merged by LSE); without it the host never
                                            asks for cascade and every step runs flat */
#define ATTNREPLAY_PLUGIN_MLA 0x4u       /* (version 2) runs MLA models' latent attention (see MLA
                                            above); without it the host never offers an MLA model */

typedef struct attnreplay_plugin {
    int32_t abi_version;                 /* ATTNREPLAY_PLUGIN_ABI_VERSION the plugin was built with */
    int32_t struct_size;                 /* sizeof(attnreplay_plugin) */
    const char *name;                    /* short, no spaces: the backend is "plugin:<name>" */
    const char *summary;                 /* one line for `attnreplay backends` */
    const char *capabilities;            /* one line: dtypes, head sizes, features */
    int32_t device_type;                 /* kDLCPU or kDLCUDA: where its tensors live */
    uint32_t flags;                      /* ATTNREPLAY_PLUGIN_* */
    /* 0: can run cfg.  Else set_error(reason) and non-zero.  No allocation here. */
    int (*check)(const attnreplay_config *cfg);
    /* Per run: the plugin's state (workspace, plans). */
    int (*open)(const attnreplay_config *cfg, void **state);
    /* Per step, before the layers: the MetadataBuilder (vLLM's build()).  md stays valid until
     * the next plan. */
    int (*plan)(void *state, const attnreplay_metadata *md);
    /* Per layer (and per --repeat): attention of this step's queries, out and lse written. */
    int (*forward)(void *state, const attnreplay_forward_args *args);
    void (*close)(void *state);
} attnreplay_plugin;

typedef const attnreplay_plugin *(*attnreplay_plugin_init_fn)(const attnreplay_host_api *host,
                                                              int host_abi_version);

#if defined(_WIN32)
#define ATTNREPLAY_PLUGIN_EXPORT __declspec(dllexport)
#else
#define ATTNREPLAY_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* The one symbol a plugin exports. */
ATTNREPLAY_PLUGIN_EXPORT const attnreplay_plugin *attnreplay_plugin_init(const attnreplay_host_api *host,
                                                                        int host_abi_version);

#ifdef __cplusplus
}
#endif
#endif
