/* cuda_backend.cu - the "cuda" backend: vLLM FLASH_ATTN semantics on a paged cache on an NVIDIA
 * GPU (sm_80+; built for sm_80 and sm_90a).  It holds
 *   - the backend descriptor (check / open / prepare / fill / forward / close),
 *   - the MetadataBuilder (prepare): the step's work list and the split-KV plan (build_plan,
 *     cuda_plan.cuh),
 *   - the device-side data generator kernels (the AR_HOSTDEV code of reference/datagen.h,
 *     compiled by nvcc, so the values are bit-identical to the CPU's) and the KV-cache write
 *     kernel (vLLM reshape_and_cache_flash: slot -1 skipped), in cuda_inputs.cuh,
 *   - the split-KV combine launch, and timing with CUDA events.
 * The attention kernels themselves are in cuda_attn.cuh (mma.sync, sm_80+),
 * cuda_attn_wgmma.cuh (wgmma, sm_90a) and cuda_attn_decode_tma.cuh (sm_90a); which one runs a
 * launch, and how it is split over the SMs, is build_plan's choice (cuda_plan.cuh).
 *
 * Timed part of forward (CUDA events; one untimed warm-up at the first forward and before every
 * series of cfg->repeat > 1; then cfg->repeat passes back to back, each on its own events, and
 * the median of them): the KV
 * write ("write"), the attention ("attn") and, when the plan splits, the combine ("combine").
 *
 * Cascade attention (b->common_prefix_len P > 0, vLLM's cascade_attention): "prefix" = the
 * same tensor-core kernel over ONE sequence made of all T query tokens, non-causal, keys
 * 0..P-1 through block-table row 0: each CTA holds 128 (token, query head) rows of one KV head
 * and streams the shared K/V tiles through shared memory once for all of them (GQA-packed), so
 * the prefix is read ceil(T x group / 128) times per KV head instead of once per request;
 * split-KV across CTAs fills the machine when T is small (its own split rule: whole waves, see
 * ar_attn_prefix_split_count; the split combine runs one thread per row x dim pair).  "suffix" = the flat plan over keys
 * P..seq_len-1 (seq_lens - P, block table shifted by P / block_size, causal bottom-right).
 * "merge" = vLLM merge_attn_states, by default fused into the suffix pass's final writes (each
 * finished row mixed with the prefix pass's in store_pair / combine_kernel, so "merge" times
 * ~0: on the H200 the fused suffix pass took 38.4 us against 34.4 + 6.1 for the suffix pass and
 * merge_kernel apart); AR_CUDA_CASCADE_MERGE=separate runs merge_kernel.  Each pass's split
 * combine is inside its time; when the suffix pass runs DECODE_TMA with the merge fused, the
 * prefix pass's split combine runs inside it too (fold_prefix_combine; AR_CUDA_CASCADE_FOLD=0
 * keeps the combine kernel), and the fused merge's "merge" times 0 (no events around it).
 * Sliding window never cascades (prepare refuses it).
 *
 * fp8 KV cache (kv_dtype fp8_e4m3, vLLM's kv_cache_dtype=fp8 with one per-tensor kv_scale for K
 * and V): the cache holds 1 byte per element, the write stores quantize(x / kv_scale) (the
 * rounding of reference/dtype.h, so the reference's ar_kv_roundtrip reads the same values), and
 * the mma.sync kernels read the fp8 tiles natively (cp.async of half the bytes, widened exactly
 * to the model dtype in shared memory; kv_scale folded into the score scale for K and into the
 * output for V) - decode, split-KV (+ combine), prefill, varlen and both cascade passes; the
 * DECODE_TMA kernel copies whole fp8 blocks by TMA and widens them in registers (fp16 MMAs).
 * The wgmma PREFILL_WG kernel copies 16-bit tiles and is never planned for an fp8 cache
 * (build_plan routes its launches to PREFILL, forced configs included); ar_cuda_plan_info.kv_fp8
 * marks such a plan (the routes "PREFILL fp8-KV", "DECODE fp8-KV" and "DECODE_TMA fp8-KV").
 *
 * Environment (read once at open; unset = the defaults described above and in cuda_plan.cuh):
 *   AR_CUDA_WGMMA=0          the mma.sync kernels everywhere (no PREFILL_WG);
 *   AR_CUDA_WG_PERSIST=0     PREFILL_WG launches one CTA per work item (by default a launch of
 *                            more items than SMs x CTAs per SM is persistent: that many CTAs,
 *                            each taking items from the launch's queue, cuda_attn_wgmma.cuh);
 *   AR_CUDA_WG_SECTION_MB=N  (0..4096) PREFILL_WG's items run in sections of (request, KV head)
 *                            groups whose K/V take at most N MiB (item_order.h; default
 *                            AR_ITEM_ORDER_SECTION_MB, 8 MiB); 0: one section, longest first
 *                            over the launch (the order before 2026-12-03);
 *   AR_CUDA_DECODE_TMA=0     no DECODE_TMA in the automatic plan;
 *   AR_CUDA_DECODE_TMA=rule  DECODE_TMA only by decode_tma_rule (the flat decode batches of
 *                            decode_tma_small_rule, 0.48 to 0.5 x SMs requests, take DECODE, as
 *                            before 2026-12-02, and those of decode_tma_many_rule too);
 *   AR_CUDA_DECODE_TMA_MANY=0  the uneven decode batches of many requests past 16k keys
 *                            (decode_tma_many_rule) take DECODE, as before 2026-12-06;
 *   AR_CUDA_DECODE_TMA_PIECES=N  (1..AR_MAX_DECODE_TMA_PIECES) the most pieces DECODE_TMA's
 *                            uneven cut gives one request (default AR_MAX_SPLITS, 64): above 64, a
 *                            request of 135k keys among short ones can be cut to its even share;
 *   AR_CUDA_COMBINE_TEAM=rule|fill|N  the split combine's threads per (row, dim pair): rule (the
 *                            default), the smallest power of two that leaves no thread more than
 *                            8 of the launch's largest group's partials; fill, the rule's team or
 *                            the largest power of two up to the largest group's partials whose
 *                            threads take at most a quarter of the device's resident threads,
 *                            whichever is wider; N, a power of two from 1 (one thread,
 *                            the plan before 2026-12-07) to 32; ar_attn_combine_team;
 *   AR_CUDA_CASCADE_MERGE=separate, AR_CUDA_CASCADE_FOLD=0   (cascade, above).
 * Sweep knobs (kernels/paged/decode_sweep.sh; results within the split paths' tolerances):
 *   AR_CUDA_DECODE_SPLITS=N  (1..64) the split count of every DECODE launch without a forced split
 *                            (instead of ar_attn_split_count; B 64 / 8k on the H200: 3);
 *   AR_CUDA_SPLIT_PATH_RATIO=N  (1..64) the uneven-decode rule's ratio (ar_attn_split_count_uneven:
 *                            a DECODE launch's pieces at most N x the even share; default 2);
 *                            =off the 85% rule's count alone (the plan before 2026-12-06);
 *   AR_CUDA_SPLIT_PATH_LARGE=N  (1..64) the uneven rule's ratio for a DECODE launch of at least
 *                            AR_SPLIT_PATH_LARGE_FAIR units a slot whose longest item is over
 *                            twice the mean (ar_attn_split_path_ratio_for; default 1, none when
 *                            AR_CUDA_SPLIT_PATH_RATIO is set); =off the ratio for every launch;
 *   AR_CUDA_DECODE_TMA=split the automatic plan takes DECODE_TMA for every flat decode launch it can
 *                            run, below decode_tma_rule's batch sizes too, there cutting each
 *                            request into ar_attn_split_count pieces over SMs x 1 CTA (B 64 on 132
 *                            SMs: 2 pieces, 128 CTAs); the pieces' partials are combined by
 *                            combine_kernel;
 *   AR_CUDA_DECODE_TMA=uneven as =split, the pieces cut by the uneven rule instead, as the
 *                            default plan cuts the batches decode_tma_rule gives DECODE_TMA
 *                            (ar_attn_decode_tma_uneven_splits: a long request among short ones
 *                            in pieces of at most the ratio x the even share, the requests no
 *                            longer than a piece whole);
 *   AR_CUDA_DECODE_TMA_SPLITS=N  (1..64) every flat DECODE_TMA launch without a forced split cuts
 *                            each request into N pieces (with AR_CUDA_DECODE_TMA=split: N for the
 *                            small batches too; alone: the batches the rule already gives it);
 *   AR_CUDA_DECODE_TMA_STAGES=N  (1..12) DECODE_TMA's ring depth, at most the stages that fit (3 at
 *                            8 KV heads: 64 KB a stage);
 *   AR_CUDA_SPLIT_LIVE_ROWS=1  split pieces of the mma.sync kernels write partials only for rows
 *                            that hold a query token (the rows combine_kernel reads: 4 of 16 for a
 *                            decode with GQA 4; its grid covers only those rows either way).
 * cuda_knobs.c reads them all at open: 0 / 1 for the on-off switches, the words above (and 1
 * for AR_CUDA_DECODE_TMA's default), the ranges above for the integers; any other value fails
 * the open with exit 2 naming the variable, so a misspelt knob never runs the default plan.
 *
 * Q and the new K/V are generated on the device before, untimed (in vLLM they come out of the
 * QKV projection).  Repeats are idempotent: the write stores the same values to the same slots.
 *
 * Output buffers on the device carry guard regions (AR_GUARD_BYTES of 0xA5 before and after
 * out and LSE), checked after every forward; out and LSE are filled with NaN before the first
 * launch, so a row the kernels never write shows up.  The paged cache is filled with NaN
 * (0xFFFF) at open. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "cuda_knobs.h"
#include "item_order.h"
#define AR_ATTN_KERNEL_BODY 1
#include "cuda_attn.cuh"
#include "../common/cuda_host.cuh"

#define AR_GUARD_BYTES 4096
#define AR_GUARD_BYTE 0xA5
#define AR_PASS_EVENTS 5          /* timing events of one timed pass (run_pass) */

/* A grow-only device buffer. */
/* dev_buf: kernels/common/cuda_host.cuh */

typedef struct cuda_state {
    ar_run_config cfg;
    int device;
    char device_name[256];
    int num_sms;
    int64_t thread_slots;           /* SMs x the threads an SM holds (the combine team's fill rule) */
    int has_wgmma;                  /* compute capability 9.0 */
    int has_tma;                    /* has_wgmma and the driver encodes tensor maps:
                                       AR_CFG_PREFILL_WG and AR_CFG_DECODE_TMA can run */
    int wgmma_auto;                 /* the config the automatic plan uses for PREFILL launches:
                                       AR_CFG_PREFILL_WG (has_tma, head size 128 or 256), 0 = none
                                       (AR_CUDA_WGMMA=0) */
    int decode_tma_auto;            /* 1: the automatic plan may take AR_CFG_DECODE_TMA (has_tma; 0
                                       with AR_CUDA_DECODE_TMA=0 in the environment) */
    /* the sweep knobs (environment, read at open; see this file's opening comment) */
    int decode_tma_all;             /* AR_CUDA_DECODE_TMA=split or =uneven: DECODE_TMA on every flat decode launch */
    int decode_tma_uneven;          /* AR_CUDA_DECODE_TMA=uneven: its pieces by the uneven rule */
    int decode_tma_small;           /* decode_tma_small_rule applies (AR_CUDA_DECODE_TMA=rule: it does not) */
    int decode_tma_many;            /* decode_tma_many_rule applies (AR_CUDA_DECODE_TMA_MANY=0: it does not) */
    int decode_tma_splits;          /* AR_CUDA_DECODE_TMA_SPLITS: pieces per request, 0 = the plan's */
    int decode_tma_pieces;          /* AR_CUDA_DECODE_TMA_PIECES: the uneven cut's most pieces a request, 0 = AR_MAX_SPLITS */
    int decode_tma_stages;          /* AR_CUDA_DECODE_TMA_STAGES: ring depth, 0 = the most that fit */
    int wg_persist;                 /* 1: PREFILL_WG launches are persistent (AR_CUDA_WG_PERSIST) */
    int64_t wg_section_bytes;       /* PREFILL_WG item order's L2 section (item_order.h):
                                       AR_ITEM_ORDER_SECTION_MB, or AR_CUDA_WG_SECTION_MB; 0:
                                       longest first */
    int decode_splits;              /* AR_CUDA_DECODE_SPLITS: DECODE's split count, 0 = the heuristic */
    int split_path_ratio;           /* AR_CUDA_SPLIT_PATH_RATIO: 0 the default, -1 off, else the ratio */
    int split_path_large;           /* AR_CUDA_SPLIT_PATH_LARGE: 0 unset (the default), -1 off, else the large uneven launches' ratio */
    int split_live_rows;            /* AR_CUDA_SPLIT_LIVE_ROWS=1: partials only for rows that hold
                                       a query token */
    int combine_team_setting;       /* AR_CUDA_COMBINE_TEAM: AR_COMBINE_TEAM_RULE (rule, unset) or a team */
    int hq, hkv, head_size, group, block_size, block_size_log2, template_hd;
    bool bf16;
    bool kv_fp8;                    /* the cache holds fp8 e4m3 (kv_scale): no PREFILL_WG */
    float kv_scale;                 /* fp8: stored = quantize(x / kv_scale); 1 otherwise */
    size_t side_elems;              /* num_blocks * block_size * hkv * head_size */
    size_t elem_bytes;              /* of the cache: 2, or 1 for fp8 */
    void **kv;                      /* [num_layers] -> [2, num_blocks, block_size, hkv, head_size] */
    int num_layers;
    cudaStream_t stream;
    cudaEvent_t done_ev;            /* the end of a forward's work */
    ar_event_pool ev_pool;          /* AR_PASS_EVENTS a repeat of a forward */
    int ctas_per_sm[AR_CFG_COUNT];

    /* the step's plan (prepare) */
    int step_ready;
    int num_reqs, num_tokens, mbpr;
    int max_query_len;              /* the longest query of the step (combine's live rows) */
    int config;
    ar_attn_geom geom;
    int num_work, num_groups, num_partials, num_splits;
    int combine_team;               /* the combine's threads per (row, dim pair) (ar_attn_combine_team) */
    int *d_qsl, *d_seq, *d_bt, *d_tok_req, *d_tok_pos;
    int64_t *d_slots;
    uint64_t *d_req_keys, *d_block_keys;
    ar_attn_work *d_work;
    ar_combine_group *d_groups;

    dev_buf meta, q, knew, vnew, out, lse, part_o, part_lse, fill;
    void *h_meta;                   /* pinned staging */
    size_t h_meta_cap;
    void *h_out;                    /* pinned: out payload, then lse payload (host copies only) */
    size_t h_out_cap;
    int *d_guard, *h_guard;         /* guard words found overwritten: device counter, pinned copy */
    int *d_wg_next_item;            /* PREFILL_WG launches' item counter (ar_attn_args.wg_next_item) */
    size_t out_bytes, lse_bytes;    /* payload sizes of the current allocation */
    int force_config, force_splits;
    int warmed;                     /* a forward has run: later ones warm up only when --repeat > 1 */
    int force_pre_config, force_pre_splits;   /* prefix pass only (ar_cuda_set_prefix_plan); -1 / 0 = as above */

    /* cascade (b->common_prefix_len P > 0): the plan above is the suffix pass (keys P..seq_len-1
     * of each request, causal), writing suf_out/suf_lse; the prefix pass (all T queries as one
     * non-causal sequence over keys 0..P-1 of block-table row 0) has its own plan and writes
     * pre_out/pre_lse; merge_kernel mixes the two into out/lse. */
    int cascade, prefix_len;
    int fused_merge;                /* 1: the suffix pass mixes each finished row with the prefix
                                       pass's (store_pair / combine_kernel) and no merge_kernel runs
                                       (the default); 0: merge_kernel after the suffix pass
                                       (AR_CUDA_CASCADE_MERGE=separate, ar_cuda_set_cascade_merge) */
    int fold_combine;               /* 1: fold the prefix pass's split combine into the suffix pass
                                       where fold_prefix_combine allows (the default); 0: never
                                       (AR_CUDA_CASCADE_FOLD=0, ar_cuda_set_cascade_fold) */
    int pre_config;
    ar_attn_geom pre_geom;
    int pre_num_work, pre_num_groups, pre_num_partials, pre_num_splits;
    int pre_combine_team;
    int *d_pre_qsl, *d_pre_seq, *d_suf_seq;
    ar_attn_work *d_pre_work;
    ar_combine_group *d_pre_groups;
    dev_buf pre_part_o, pre_part_lse, pre_out, pre_lse, suf_out, suf_lse;
} cuda_state;

static int cuda_fail(cudaError_t e, const char *what, char *err, size_t err_len)
{
    return ar_cuda_fail(e, "cuda backend", what, err, err_len);
}

static size_t round_up(size_t x, size_t a) { return ar_round_up(x, a); }

static int ensure_buf(dev_buf *b, size_t need, const char *what, char *err, size_t err_len)
{
    return ar_cuda_ensure_dev(b, need, "cuda backend", what, err, err_len);
}

static int ensure_host(void **p, size_t *cap, size_t need, char *err, size_t err_len)
{
    return ar_cuda_ensure_host(p, cap, need, "cuda backend", err, err_len);
}

#include "cuda_inputs.cuh"   /* the small kernels: generator, cache fill and write */

/* The attention kernels' attributes call for this state's dtype and cache (fp8: the _kv8 ones). */
static cudaError_t attn_attributes(const cuda_state *s, int config, int *ctas_per_sm)
{
    const int hd = s->template_hd;
    if (s->kv_fp8)
        return s->bf16 ? ar_attn_attributes_bf16_kv8(config, hd, ctas_per_sm)
                       : ar_attn_attributes_fp16_kv8(config, hd, ctas_per_sm);
    return s->bf16 ? ar_attn_attributes_bf16(config, hd, ctas_per_sm) : ar_attn_attributes_fp16(config, hd, ctas_per_sm);
}
#include "cuda_plan.cuh"     /* build_plan: the kernel and split-KV plan of each launch */

/* ---------------------------------------------------------------------------------------- */
/* Backend functions                                                                         */

static bool cuda_check(const ar_run_config *cfg, char *why, size_t why_len)
{
    const ar_model *m = &cfg->model;
    if (m->attention != AR_ATTN_MHA) {
        snprintf(why, why_len, "MLA models run on the cuda-mla backend, not the paged MHA one");
        return false;
    }
    if (cfg->dtype != AR_FP16 && cfg->dtype != AR_BF16) {
        snprintf(why, why_len, "dtype %s not supported (fp16, bf16)", ar_dtype_name(cfg->dtype));
        return false;
    }
    if (cfg->kv_dtype != cfg->dtype && cfg->kv_dtype != AR_FP8_E4M3) {
        snprintf(why, why_len, "KV dtype %s not supported (the model dtype %s or fp8_e4m3)",
                 ar_dtype_name(cfg->kv_dtype), ar_dtype_name(cfg->dtype));
        return false;
    }
    if (cfg->kv_dtype == AR_FP8_E4M3 && !(cfg->kv_scale > 0 && isfinite(cfg->kv_scale))) {
        snprintf(why, why_len, "fp8 KV needs a finite kv_scale > 0 (got %g)", cfg->kv_scale);
        return false;
    }
    if (cfg->kv_dtype == AR_FP8_E4M3 && m->head_size % 16 != 0) {
        snprintf(why, why_len, "fp8 KV needs a head size that is a multiple of 16 (16-byte rows); got %d",
                 m->head_size);
        return false;
    }
    if (ar_attn_template_hd(m->head_size) == 0 || (m->v_head_dim != 0 && m->v_head_dim != m->head_size)) {
        snprintf(why, why_len, "head size %d not supported (multiples of 8 up to 256, V dim equal)",
                 m->head_size);
        return false;
    }
    if (cfg->block_size != 16 && cfg->block_size != 32 && cfg->block_size != 64) {
        snprintf(why, why_len, "block size %d not supported (16, 32, 64)", cfg->block_size);
        return false;
    }
    if (m->num_kv_heads <= 0 || m->num_q_heads <= 0 || m->num_q_heads % m->num_kv_heads != 0) {
        snprintf(why, why_len, "num_q_heads %d is not a multiple of num_kv_heads %d", m->num_q_heads,
                 m->num_kv_heads);
        return false;
    }
    return ar_cuda_device_ok(why, why_len);
}

static void cuda_close(void *state);

static int cuda_open(const ar_run_config *cfg, void **state_out, char *err, size_t err_len)
{
    *state_out = NULL;
    char why[256];
    if (!cuda_check(cfg, why, sizeof why)) {
        snprintf(err, err_len, "cuda backend: %s", why);
        return strncmp(why, "no CUDA device", 14) == 0 ? 3 : 2;
    }
    ar_cuda_knobs knobs;   /* the environment's switches, refused with exit 2 when misspelt */
    if (ar_cuda_knobs_read(&knobs, ar_attn::DecodeTmaGeom::MAX_STAGES, err, err_len)) return 2;
    cuda_state *s = (cuda_state *)calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_len, "cuda backend: out of host memory");
        return 3;
    }
    s->cfg = *cfg;
    s->device = cfg->device_index;   /* chosen by the engine from the local rank (replay/shard.h) */
    s->force_config = -1;
    s->force_pre_config = -1;
    s->hq = cfg->model.num_q_heads;
    s->hkv = cfg->model.num_kv_heads;
    s->head_size = cfg->model.head_size;
    s->group = s->hq / s->hkv;
    s->block_size = cfg->block_size;
    s->block_size_log2 = cfg->block_size == 16 ? 4 : cfg->block_size == 32 ? 5 : 6;
    s->template_hd = ar_attn_template_hd(s->head_size);
    s->bf16 = cfg->dtype == AR_BF16;
    s->kv_fp8 = cfg->kv_dtype == AR_FP8_E4M3;
    s->kv_scale = s->kv_fp8 ? (float)cfg->kv_scale : 1.0f;
    s->elem_bytes = s->kv_fp8 ? 1 : 2;
    s->num_layers = cfg->num_layers > 0 ? cfg->num_layers : 1;
    int rc;
    cudaDeviceProp prop;
    if ((rc = cuda_fail(cudaSetDevice(s->device), "cudaSetDevice", err, err_len)) ||
        (rc = cuda_fail(cudaGetDeviceProperties(&prop, s->device), "cudaGetDeviceProperties", err, err_len))) {
        free(s);
        return rc;
    }
    snprintf(s->device_name, sizeof s->device_name, "%s", prop.name);
    s->num_sms = prop.multiProcessorCount;
    s->thread_slots = (int64_t)prop.multiProcessorCount * prop.maxThreadsPerMultiProcessor;
    s->has_wgmma = prop.major == 9 && prop.minor == 0;
    if (s->has_wgmma) {
        /* the encoding is host arithmetic on the shape: a dummy aligned base is enough */
        CUtensorMap probe;
        const uint64_t dims[3] = {128, 1, 64}, strides[2] = {256, 256};
        const uint32_t box[3] = {64, 1, 16};
        char why[256];
        s->has_tma = ar_tma_encode(&probe, (const void *)(uintptr_t)4096, 3, dims, strides, box, "cuda", why,
                                   sizeof why) == 0;
    }
    s->wgmma_auto = s->has_tma && (s->head_size == 128 || s->head_size == 256) && !knobs.wgmma_off && !s->kv_fp8
                        ? AR_CFG_PREFILL_WG
                        : 0;
    s->fold_combine = !knobs.cascade_fold_off;
    s->decode_tma_auto = s->has_tma && !knobs.decode_tma_off;
    s->decode_tma_uneven = knobs.decode_tma_uneven;
    s->decode_tma_all = knobs.decode_tma_split || knobs.decode_tma_uneven;
    s->decode_tma_small = !knobs.decode_tma_rule;
    s->decode_tma_many = !knobs.decode_tma_rule && !knobs.decode_tma_many_off;
    s->decode_tma_splits = knobs.decode_tma_splits;
    s->decode_tma_pieces = knobs.decode_tma_pieces;
    s->decode_tma_stages = knobs.decode_tma_stages;
    s->wg_persist = !knobs.wg_persist_off;
    s->wg_section_bytes = knobs.wg_section_mb >= 0 ? (int64_t)knobs.wg_section_mb << 20 : (int64_t)AR_ITEM_ORDER_SECTION_MB << 20;
    s->decode_splits = knobs.decode_splits;
    s->split_path_ratio = knobs.split_path_ratio;
    s->split_path_large = knobs.split_path_large;
    s->split_live_rows = knobs.split_live_rows;
    s->combine_team_setting = knobs.combine_team;
    s->fused_merge = !knobs.cascade_merge_separate;
    if ((rc = cuda_fail(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "stream", err, err_len))) {
        free(s);
        return rc;
    }
    if ((rc = cuda_fail(cudaEventCreate(&s->done_ev), "event", err, err_len))) {
        cuda_close(s);
        return rc;
    }
    if ((rc = cuda_fail(cudaMalloc((void **)&s->d_guard, sizeof(int)), "guard counter", err, err_len)) ||
        (rc = cuda_fail(cudaMallocHost((void **)&s->h_guard, sizeof(int)), "guard counter", err, err_len)) ||
        (rc = cuda_fail(cudaMalloc((void **)&s->d_wg_next_item, sizeof(int)), "item counter", err, err_len)) ||
        (rc = cuda_fail(cudaMemset(s->d_wg_next_item, 0, sizeof(int)), "item counter", err, err_len))) {
        cuda_close(s);
        return rc;
    }
    for (int c = 0; c < AR_CFG_COUNT; c++) {
        /* sm_90a code only; never planned elsewhere (nor PREFILL_WG for an fp8 cache) */
        if ((ar_attn_config_is_wg(c) || c == AR_CFG_DECODE_TMA) && (!s->has_wgmma || (s->kv_fp8 && c != AR_CFG_DECODE_TMA))) {
            s->ctas_per_sm[c] = 1;
            continue;
        }
        cudaError_t e = attn_attributes(s, c, &s->ctas_per_sm[c]);
        if ((rc = cuda_fail(e, "kernel attributes", err, err_len))) {
            cuda_close(s);
            return rc;
        }
        if (s->ctas_per_sm[c] < 1) s->ctas_per_sm[c] = 1;
    }
    if ((int64_t)cfg->num_blocks * cfg->block_size >= ((int64_t)1 << 31)) {
        snprintf(err, err_len, "cuda backend: num_blocks x block_size = %lld slots; at most 2^31 - 1",
                 (long long)cfg->num_blocks * cfg->block_size);
        cuda_close(s);
        return 2;
    }
    s->side_elems = (size_t)cfg->num_blocks * cfg->block_size * s->hkv * s->head_size;
    size_t layer_bytes = 2 * s->side_elems * s->elem_bytes;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    if ((double)layer_bytes * s->num_layers > 0.9 * (double)free_b) {
        snprintf(err, err_len,
                 "cuda backend: the paged caches need %.2f GiB (%d layers x %.3f GiB) but the device has "
                 "%.2f GiB free; replay fewer layers or fewer blocks",
                 (double)layer_bytes * s->num_layers / 1073741824.0, s->num_layers,
                 layer_bytes / 1073741824.0, free_b / 1073741824.0);
        cuda_close(s);
        return 2;
    }
    s->kv = (void **)calloc((size_t)s->num_layers, sizeof(void *));
    if (!s->kv) {
        snprintf(err, err_len, "cuda backend: out of host memory");
        cuda_close(s);
        return 3;
    }
    for (int l = 0; l < s->num_layers; l++) {
        if ((rc = cuda_fail(cudaMalloc(&s->kv[l], layer_bytes), "paged cache allocation", err, err_len)) ||
            (rc = cuda_fail(cudaMemsetAsync(s->kv[l], 0xFF, layer_bytes, s->stream), "NaN fill", err, err_len))) {
            cuda_close(s);
            return rc;
        }
    }
    if ((rc = cuda_fail(cudaStreamSynchronize(s->stream), "open", err, err_len))) {
        cuda_close(s);
        return rc;
    }
    *state_out = s;
    return 0;
}

static void cuda_close(void *state)
{
    cuda_state *s = (cuda_state *)state;
    if (!s) return;
    if (s->kv) {
        for (int l = 0; l < s->num_layers; l++)
            if (s->kv[l]) cudaFree(s->kv[l]);
        free(s->kv);
    }
    dev_buf *bufs[] = {&s->meta, &s->q, &s->knew, &s->vnew, &s->out, &s->lse, &s->part_o, &s->part_lse, &s->fill,
                       &s->pre_part_o, &s->pre_part_lse, &s->pre_out, &s->pre_lse, &s->suf_out, &s->suf_lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->ptr) cudaFree(bufs[i]->ptr);
    if (s->h_meta) cudaFreeHost(s->h_meta);
    if (s->h_out) cudaFreeHost(s->h_out);
    if (s->d_guard) cudaFree(s->d_guard);
    if (s->d_wg_next_item) cudaFree(s->d_wg_next_item);
    if (s->h_guard) cudaFreeHost(s->h_guard);
    if (s->done_ev) cudaEventDestroy(s->done_ev);
    ar_event_pool_free(&s->ev_pool);
    if (s->stream) cudaStreamDestroy(s->stream);
    free(s);
}

static void cuda_device_name(void *state, char *buf, size_t len)
{
    cuda_state *s = (cuda_state *)state;
    snprintf(buf, len, "%s", s ? s->device_name : "none");
}

/* The rows of a group that launch_attention's combine covers: the most (token, query head) pairs
 * of one (sequence, KV head), max_pairs, at least one and at most the rows of a partial. */
static int combine_live_rows(int rows, int64_t max_pairs)
{
    return max_pairs < 1 ? 1 : max_pairs < rows ? (int)max_pairs : rows;
}

/* The combine's threads of one group for one team member (ar_attn_combine_team's member_threads):
 * a thread per (row, dim pair) of its live rows. */
static int64_t combine_member_threads(const cuda_state *s, int rows, int64_t max_pairs)
{
    return (int64_t)combine_live_rows(rows, max_pairs) * (s->template_hd / 2);
}

static int cuda_prepare(void *state, const ar_batch *b, char *err, size_t err_len)
{
    cuda_state *s = (cuda_state *)state;
    s->step_ready = 0;
    const int R = b->num_reqs, T = b->num_tokens, mbpr = b->max_blocks_per_req;
    const int bs = s->block_size, nb = s->cfg.num_blocks;
    const int P = b->common_prefix_len;
    int rc = ar_cuda_check_batch(b, bs, nb, err, err_len);
    if (rc) return rc;
    for (int r = 0; P > 0 && r < R; r++) {
        int ctx = b->seq_lens[r] - (b->query_start_loc[r + 1] - b->query_start_loc[r]);
        if (ctx < P) {
            snprintf(err, err_len,
                     "step %lld: common_prefix_len %d exceeds request %d's context %d (rule: P <= every "
                     "num_computed_tokens)", (long long)b->step, P, r, ctx);
            return 2;
        }
    }
    if (P < 0 || P % bs != 0 || (P > 0 && (R == 0 || s->cfg.model.sliding_window > 0))) {
        snprintf(err, err_len,
                 "step %lld: common_prefix_len %d not usable (rule: a multiple of block size %d, only with "
                 "requests and without a sliding window)", (long long)b->step, P, bs);
        return 2;
    }
    const bool cascade = P > 0;

    /* plans: flat (or the cascade suffix pass: seq_lens - P), and the cascade prefix pass */
    int *suf_seq = NULL;
    int pre_qsl[2] = {0, T}, pre_seq[1] = {P};
    pass_plan main_plan, pre_plan;
    memset(&pre_plan, 0, sizeof pre_plan);
    if (cascade) {
        suf_seq = (int *)malloc(sizeof(int) * (size_t)R);
        if (!suf_seq) rc = 3;
        for (int r = 0; !rc && r < R; r++) suf_seq[r] = b->seq_lens[r] - P;
    }
    if (!rc) rc = build_plan(s, R, b->query_start_loc, cascade ? suf_seq : b->seq_lens, false, !cascade,
                             s->force_config, s->force_splits, &main_plan);
    else memset(&main_plan, 0, sizeof main_plan);
    if (!rc && cascade)
        rc = build_plan(s, 1, pre_qsl, pre_seq, true, false,
                        s->force_pre_config >= 0 ? s->force_pre_config : s->force_config,
                        s->force_pre_splits > 0 ? s->force_pre_splits : s->force_splits, &pre_plan);
    if (rc) {
        free(suf_seq);
        pass_plan_free(&main_plan);
        pass_plan_free(&pre_plan);
        snprintf(err, err_len, "cuda backend: out of host memory");
        return 3;
    }
    const int rows = main_plan.geom.rows;

    size_t off = 0;
    const ar_batch_meta bm = ar_batch_meta_layout(&off, R, T, mbpr);
    size_t o_work = ar_meta_take(&off, (size_t)main_plan.num_work * sizeof(ar_attn_work));
    size_t o_groups = ar_meta_take(&off, (size_t)main_plan.num_groups * sizeof(ar_combine_group));
    size_t o_pqsl = ar_meta_take(&off, 2 * 4);
    size_t o_pseq = ar_meta_take(&off, 4);
    size_t o_sseq = ar_meta_take(&off, (size_t)R * 4);
    size_t o_pwork = ar_meta_take(&off, (size_t)pre_plan.num_work * sizeof(ar_attn_work));
    size_t o_pgroups = ar_meta_take(&off, (size_t)pre_plan.num_groups * sizeof(ar_combine_group));
    size_t meta_bytes = round_up(off, 16) + 16;
    if ((rc = ensure_host(&s->h_meta, &s->h_meta_cap, meta_bytes, err, err_len)) ||
        (rc = ensure_buf(&s->meta, meta_bytes, "metadata buffer", err, err_len))) {
        free(suf_seq);
        pass_plan_free(&main_plan);
        pass_plan_free(&pre_plan);
        return rc;
    }
    unsigned char *h = (unsigned char *)s->h_meta;
    ar_batch_meta_fill(&bm, h, b);
    memcpy(h + o_work, main_plan.work, (size_t)main_plan.num_work * sizeof(ar_attn_work));
    memcpy(h + o_groups, main_plan.groups, (size_t)main_plan.num_groups * sizeof(ar_combine_group));
    memcpy(h + o_pqsl, pre_qsl, sizeof pre_qsl);
    memcpy(h + o_pseq, pre_seq, sizeof pre_seq);
    if (cascade) memcpy(h + o_sseq, suf_seq, (size_t)R * 4);
    memcpy(h + o_pwork, pre_plan.work, (size_t)pre_plan.num_work * sizeof(ar_attn_work));
    memcpy(h + o_pgroups, pre_plan.groups, (size_t)pre_plan.num_groups * sizeof(ar_combine_group));
    free(suf_seq);

    if ((rc = cuda_fail(cudaMemcpyAsync(s->meta.ptr, s->h_meta, meta_bytes, cudaMemcpyHostToDevice, s->stream),
                        "metadata upload", err, err_len))) {
        pass_plan_free(&main_plan);
        pass_plan_free(&pre_plan);
        return rc;
    }
    unsigned char *d = (unsigned char *)s->meta.ptr;
    s->d_qsl = (int *)(d + bm.qsl);
    s->d_seq = (int *)(d + bm.seq);
    s->d_bt = (int *)(d + bm.bt);
    s->d_tok_req = (int *)(d + bm.treq);
    s->d_tok_pos = (int *)(d + bm.tpos);
    s->d_slots = (int64_t *)(d + bm.slots);
    s->d_req_keys = (uint64_t *)(d + bm.rkeys);
    s->d_block_keys = (uint64_t *)(d + bm.bkeys);
    s->d_work = (ar_attn_work *)(d + o_work);
    s->d_groups = (ar_combine_group *)(d + o_groups);
    s->d_pre_qsl = (int *)(d + o_pqsl);
    s->d_pre_seq = (int *)(d + o_pseq);
    s->d_suf_seq = (int *)(d + o_sseq);
    s->d_pre_work = (ar_attn_work *)(d + o_pwork);
    s->d_pre_groups = (ar_combine_group *)(d + o_pgroups);

    /* per-step device buffers */
    size_t q_bytes = (size_t)T * s->hq * s->head_size * 2 + 16;
    size_t kv_bytes = (size_t)T * s->hkv * s->head_size * 2 + 16;
    size_t lse_payload = (size_t)s->hq * T * 4 + 16;
    s->out_bytes = round_up(q_bytes, 256);
    s->lse_bytes = round_up(lse_payload, 256);
    size_t out_need = 2 * AR_GUARD_BYTES + s->out_bytes, lse_need = 2 * AR_GUARD_BYTES + s->lse_bytes;
    bool out_new = out_need > s->out.cap, lse_new = lse_need > s->lse.cap;
    int64_t np = main_plan.num_partials > 0 ? main_plan.num_partials : 1;
    if ((rc = ensure_buf(&s->q, q_bytes, "Q buffer", err, err_len)) ||
        (rc = ensure_buf(&s->knew, kv_bytes, "new K buffer", err, err_len)) ||
        (rc = ensure_buf(&s->vnew, kv_bytes, "new V buffer", err, err_len)) ||
        (rc = ensure_buf(&s->out, out_need, "out buffer", err, err_len)) ||
        (rc = ensure_buf(&s->lse, lse_need, "LSE buffer", err, err_len)) ||
        (rc = ensure_buf(&s->part_o, (size_t)np * rows * s->template_hd * 4, "split partials", err, err_len)) ||
        (rc = ensure_buf(&s->part_lse, (size_t)np * rows * 4, "split LSE", err, err_len)) ||
        (rc = ensure_host(&s->h_out, &s->h_out_cap, out_need + lse_need, err, err_len))) {
        pass_plan_free(&main_plan);
        pass_plan_free(&pre_plan);
        return rc;
    }
    if (cascade) {
        int64_t pnp = pre_plan.num_partials > 0 ? pre_plan.num_partials : 1;
        int prow = pre_plan.geom.rows;
        if ((rc = ensure_buf(&s->pre_out, q_bytes, "prefix out", err, err_len)) ||
            (rc = ensure_buf(&s->suf_out, q_bytes, "suffix out", err, err_len)) ||
            (rc = ensure_buf(&s->pre_lse, lse_payload, "prefix LSE", err, err_len)) ||
            (rc = ensure_buf(&s->suf_lse, lse_payload, "suffix LSE", err, err_len)) ||
            (rc = ensure_buf(&s->pre_part_o, (size_t)pnp * prow * s->template_hd * 4, "prefix partials", err, err_len)) ||
            (rc = ensure_buf(&s->pre_part_lse, (size_t)pnp * prow * 4, "prefix split LSE", err, err_len))) {
            pass_plan_free(&main_plan);
            pass_plan_free(&pre_plan);
            return rc;
        }
    }
    /* guards: the whole buffer gets the pattern whenever it is (re)allocated; the payload is
     * overwritten with NaN before each forward, so only the two ends keep the pattern. */
    if (out_new && (rc = cuda_fail(cudaMemsetAsync(s->out.ptr, AR_GUARD_BYTE, s->out.cap, s->stream), "guard", err, err_len)))
        goto done;
    if (lse_new && (rc = cuda_fail(cudaMemsetAsync(s->lse.ptr, AR_GUARD_BYTE, s->lse.cap, s->stream), "guard", err, err_len)))
        goto done;
    /* the payload moves with T: re-stamp the area after it so that the guard is intact */
    if ((rc = cuda_fail(cudaMemsetAsync((char *)s->out.ptr + AR_GUARD_BYTES + s->out_bytes, AR_GUARD_BYTE,
                                        s->out.cap - AR_GUARD_BYTES - s->out_bytes, s->stream), "guard", err, err_len)) ||
        (rc = cuda_fail(cudaMemsetAsync((char *)s->lse.ptr + AR_GUARD_BYTES + s->lse_bytes, AR_GUARD_BYTE,
                                        s->lse.cap - AR_GUARD_BYTES - s->lse_bytes, s->stream), "guard", err, err_len)))
        goto done;
    s->num_reqs = R;
    s->num_tokens = T;
    s->mbpr = mbpr;
    s->max_query_len = 0;
    for (int r = 0; r < R; r++)
        if (b->query_start_loc[r + 1] - b->query_start_loc[r] > s->max_query_len)
            s->max_query_len = b->query_start_loc[r + 1] - b->query_start_loc[r];
    s->config = main_plan.config;
    s->geom = main_plan.geom;
    s->num_work = (int)main_plan.num_work;
    s->num_groups = (int)main_plan.num_groups;
    s->num_partials = (int)main_plan.num_partials;
    s->num_splits = main_plan.num_splits;
    s->combine_team = ar_attn_combine_team(main_plan.groups, main_plan.num_groups,
                                           combine_member_threads(s, main_plan.geom.rows, (int64_t)s->max_query_len * s->group),
                                           s->thread_slots, s->combine_team_setting);
    s->cascade = cascade ? 1 : 0;
    s->prefix_len = P;
    s->pre_config = pre_plan.config;
    s->pre_geom = pre_plan.geom;
    s->pre_num_work = (int)pre_plan.num_work;
    s->pre_num_groups = (int)pre_plan.num_groups;
    s->pre_num_partials = (int)pre_plan.num_partials;
    s->pre_num_splits = pre_plan.num_splits;
    s->pre_combine_team = ar_attn_combine_team(pre_plan.groups, pre_plan.num_groups,
                                               combine_member_threads(s, pre_plan.geom.rows, (int64_t)T * s->group),
                                               s->thread_slots, s->combine_team_setting);
    s->step_ready = 1;
done:
    pass_plan_free(&main_plan);
    pass_plan_free(&pre_plan);
    return rc;
}

static int cuda_fill(void *state, int layer, const ar_fill *f, char *err, size_t err_len)
{
    cuda_state *s = (cuda_state *)state;
    if (layer < 0 || layer >= s->num_layers) {
        snprintf(err, err_len, "cuda backend: fill: layer %d outside [0, %d)", layer, s->num_layers);
        return 2;
    }
    if (f->count <= 0) return 0;
    int64_t nslots = (int64_t)s->cfg.num_blocks * s->block_size;
    for (int i = 0; i < f->count; i++)
        if (f->slots[i] < -1 || f->slots[i] >= nslots || f->offsets[i] < 0 || f->offsets[i] >= s->block_size) {
            snprintf(err, err_len, "cuda backend: fill: entry %d has slot %lld, offset %d (slots [-1, %lld), "
                     "offsets [0, %d))", i, (long long)f->slots[i], f->offsets[i], (long long)nslots, s->block_size);
            return 2;
        }
    size_t bytes = (size_t)f->count * (8 + 8 + 4) + 64;
    int rc;
    if ((rc = ensure_buf(&s->fill, bytes, "fill buffer", err, err_len))) return rc;
    unsigned char *d = (unsigned char *)s->fill.ptr;
    size_t o_keys = round_up((size_t)f->count * 8, 16), o_off = o_keys + round_up((size_t)f->count * 8, 16);
    if ((rc = cuda_fail(cudaMemcpyAsync(d, f->slots, (size_t)f->count * 8, cudaMemcpyHostToDevice, s->stream), "fill upload", err, err_len)) ||
        (rc = cuda_fail(cudaMemcpyAsync(d + o_keys, f->keys, (size_t)f->count * 8, cudaMemcpyHostToDevice, s->stream), "fill upload", err, err_len)) ||
        (rc = cuda_fail(cudaMemcpyAsync(d + o_off, f->offsets, (size_t)f->count * 4, cudaMemcpyHostToDevice, s->stream), "fill upload", err, err_len)))
        return rc;
    char *kc = (char *)s->kv[layer], *vc = kc + s->side_elems * s->elem_bytes;
    int64_t total = (int64_t)f->count * s->hkv * (s->head_size / 8);
    fill_kernel<<<grid_for(total, 256), 256, 0, s->stream>>>(kc, vc, f->count, (const int64_t *)d,
                                                          (const uint64_t *)(d + o_keys), (const int *)(d + o_off),
                                                          s->hkv, s->head_size, s->cfg.seed, (uint32_t)layer,
                                                          s->cfg.data, s->cfg.dtype, s->kv_fp8, s->kv_scale);
    if ((rc = cuda_fail(cudaGetLastError(), "fill kernel", err, err_len))) return rc;
    /* the host arrays are only valid during this call: wait for the copies */
    return cuda_fail(cudaStreamSynchronize(s->stream), "fill", err, err_len);
}

/* ar_attn_args.persistent_ctas: SMs x PREFILL_WG CTAs per SM, 0 under AR_CUDA_WG_PERSIST=0 */
static int wg_persistent_ctas(const cuda_state *s)
{
    return s->wg_persist ? s->num_sms * s->ctas_per_sm[AR_CFG_PREFILL_WG] : 0;
}

static void fill_args(cuda_state *s, int layer, ar_attn_args *a)
{
    memset(a, 0, sizeof *a);
    char *kc = (char *)s->kv[layer];
    a->q = s->q.ptr;
    a->k_cache = kc;
    a->v_cache = kc + s->side_elems * s->elem_bytes;
    a->out = (char *)s->out.ptr + AR_GUARD_BYTES;
    a->lse = (float *)((char *)s->lse.ptr + AR_GUARD_BYTES);
    a->partial_o = (float *)s->part_o.ptr;
    a->partial_lse = (float *)s->part_lse.ptr;
    a->query_start_loc = s->d_qsl;
    a->seq_lens = s->d_seq;
    a->block_table = s->d_bt;
    a->work = s->d_work;
    a->groups = s->d_groups;
    a->num_tokens = s->num_tokens;
    a->num_q_heads = s->hq;
    a->num_kv_heads = s->hkv;
    a->head_size = s->head_size;
    a->group = s->group;
    a->block_size_log2 = s->block_size_log2;
    a->max_blocks_per_req = s->mbpr;
    a->sliding_window = s->cfg.model.sliding_window;
    /* fp8: the kernels multiply the stored e4m3 values; K's kv_scale joins the score scale, V's
     * scales each finished row */
    a->scale_log2 = (float)(s->cfg.model.scale * 1.4426950408889634 * s->kv_scale);
    a->v_scale = s->kv_scale;
    a->soft_cap = (float)s->cfg.model.logits_soft_cap;
    a->fault = (int)s->cfg.fault;
    a->num_slots = s->cfg.num_blocks * s->block_size;   /* < 2^31 (open checks) */
    a->partial_live_only = s->split_live_rows;
    a->decode_tma_stages = s->decode_tma_stages;
    a->persistent_ctas = wg_persistent_ctas(s);
    a->wg_next_item = s->d_wg_next_item;
}

/* One attention launch and, when it splits, its combine; between the two, the event `mid` is
 * recorded when given.  rows: the rows of a work item; max_pairs: the most (token, query head)
 * pairs of one (sequence, KV head): the combine's grid covers only the first max_pairs rows of a
 * group (rows at most; a group whose pairs outnumber the rows is one tile of a longer query, and
 * covers them all), since no row past them holds a query token in any group (a decode with GQA
 * 4 on DECODE's 16-row tiles: 4 rows, a quarter of the CTAs of a grid over every row, whose
 * other three quarters found no token and returned; before 2026-12-07 the grid covered every row
 * unless AR_CUDA_SPLIT_LIVE_ROWS=1); team: the combine's threads per (row, dim pair). */
static cudaError_t launch_attention(const cuda_state *s, const ar_attn_args *a, int config, int num_work,
                                    int num_groups, int rows, int64_t max_pairs, int team, cudaEvent_t mid)
{
    const int hd = s->template_hd;
    cudaError_t e = s->kv_fp8 ? (s->bf16 ? ar_attn_launch_bf16_kv8(config, hd, a, num_work, s->stream)
                                         : ar_attn_launch_fp16_kv8(config, hd, a, num_work, s->stream))
                              : (s->bf16 ? ar_attn_launch_bf16(config, hd, a, num_work, s->stream)
                                         : ar_attn_launch_fp16(config, hd, a, num_work, s->stream));
    if (e != cudaSuccess) return e;
    if (mid) cudaEventRecord(mid, s->stream);
    if (num_groups <= 0) return cudaSuccess;
    /* team threads per (row, dim pair) of every group: rows x hd / 2 x team <= 256 x 128 x 32
     * -> y <= 4096 */
    const int live = combine_live_rows(rows, max_pairs);
    dim3 grid((unsigned)num_groups, (unsigned)(((int64_t)live * (hd / 2) * team + 255) / 256));
    if (s->bf16)
        ar_attn::combine_kernel<__nv_bfloat16><<<grid, 256, 0, s->stream>>>(*a, rows, live, s->template_hd, team);
    else
        ar_attn::combine_kernel<__half><<<grid, 256, 0, s->stream>>>(*a, rows, live, s->template_hd, team);
    return cudaGetLastError();
}

/* The prefix pass's split combine folded into the suffix pass: the suffix pass runs
 * AR_CFG_DECODE_TMA with the merge fused, and every prefix-pass row block is split (its groups
 * are then [Hkv][row blocks], in the order build_plan makes them), so the suffix pass combines
 * each row's prefix partials itself and the combine kernel (8.3 us at P 32k on the H200, ncu)
 * does not run. */
static int prefix_row_blocks(const cuda_state *s)   /* row blocks per KV head of the prefix pass */
{
    const int rows = s->pre_geom.rows > 0 ? s->pre_geom.rows : 1;
    return (s->num_tokens * s->group + rows - 1) / rows;
}
static bool fold_prefix_combine(const cuda_state *s)
{
    return s->cascade && s->fused_merge && s->fold_combine && s->config == AR_CFG_DECODE_TMA &&
           s->num_groups == 0 && s->pre_num_groups > 0 && s->pre_num_groups == s->hkv * prefix_row_blocks(s) &&
           s->pre_num_work == s->pre_num_partials;
}

/* The cascade passes' arguments, from the flat ones (fill_args): the suffix pass reads keys
 * P..seq_len-1 through the block table shifted by P / block_size and writes suf_out/suf_lse
 * (fused merge: the step's out/lse, each row mixed with the prefix pass's); the prefix pass
 * runs all T queries as one non-causal sequence over keys 0..P-1 of row 0 and writes
 * pre_out/pre_lse.  The LSE_BASE2 fault is left to the merge (the merged LSE is what the
 * engine sees). */
static void cascade_args(const cuda_state *s, const ar_attn_args *flat, ar_attn_args *pre, ar_attn_args *suf)
{
    *suf = *flat;
    if (suf->fault == AR_FAULT_LSE_BASE2) suf->fault = AR_FAULT_NONE;
    suf->out = s->suf_out.ptr;
    suf->lse = (float *)s->suf_lse.ptr;
    suf->seq_lens = s->d_suf_seq;
    suf->block_table = s->d_bt + s->prefix_len / s->block_size;
    *pre = *suf;
    if (s->fused_merge) {
        suf->out = flat->out;
        suf->lse = flat->lse;
        suf->merge_out = s->pre_out.ptr;
        suf->merge_lse = (const float *)s->pre_lse.ptr;
        suf->merge_lse_base2 = flat->fault == AR_FAULT_LSE_BASE2;
    }
    pre->out = s->pre_out.ptr;
    pre->lse = (float *)s->pre_lse.ptr;
    pre->partial_o = (float *)s->pre_part_o.ptr;
    pre->partial_lse = (float *)s->pre_part_lse.ptr;
    pre->query_start_loc = s->d_pre_qsl;
    pre->seq_lens = s->d_pre_seq;
    pre->block_table = s->d_bt;
    pre->work = s->d_pre_work;
    pre->groups = s->d_pre_groups;
    pre->sliding_window = 0;
    pre->non_causal = 1;
    if (fold_prefix_combine(s)) {
        suf->merge_groups = s->d_pre_groups;
        suf->merge_partial_o = (const float *)s->pre_part_o.ptr;
        suf->merge_partial_lse = (const float *)s->pre_part_lse.ptr;
        suf->merge_rows = s->pre_geom.rows;
        suf->merge_row_blocks = prefix_row_blocks(s);
    }
}

/* One pass; with ev (AR_PASS_EVENTS events; NULL: untimed) events around the kernels:
 *   flat:    ev0 write ev1 attention ev2 combine (when split) ev3
 *   cascade: ev0 write ev1 prefix (+ combine) ev2 suffix (+ combine) ev3 merge ev4 (no ev4 when the
 *            merge is fused into the suffix pass) */
static cudaError_t run_pass(cuda_state *s, const ar_attn_args *a, int layer, const cudaEvent_t *ev)
{
    cudaError_t e;
    const bool timed = ev != NULL;
    if (timed) cudaEventRecord(ev[0], s->stream);
    if (s->num_tokens > 0) {
        char *kc = (char *)s->kv[layer];
        write_kv_kernel<<<s->num_tokens, 128, 0, s->stream>>>((const uint16_t *)s->knew.ptr, (const uint16_t *)s->vnew.ptr,
                                                             s->d_slots, kc, kc + s->side_elems * s->elem_bytes,
                                                             s->hkv * s->head_size, s->kv_fp8, s->cfg.dtype, s->kv_scale);
    }
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if (timed) cudaEventRecord(ev[1], s->stream);
    if (!s->cascade) {
        e = launch_attention(s, a, s->config, s->num_work, s->num_groups, s->geom.rows,
                             (int64_t)s->max_query_len * s->group, s->combine_team, timed ? ev[2] : NULL);
        if (e != cudaSuccess) return e;
        if (timed) cudaEventRecord(ev[3], s->stream);
        return cudaSuccess;
    }
    ar_attn_args pre, suf;
    cascade_args(s, a, &pre, &suf);
    e = launch_attention(s, &pre, s->pre_config, s->pre_num_work, suf.merge_groups ? 0 : s->pre_num_groups,
                         s->pre_geom.rows, (int64_t)s->num_tokens * s->group, s->pre_combine_team, NULL);
    if (e != cudaSuccess) return e;
    if (timed) cudaEventRecord(ev[2], s->stream);
    e = launch_attention(s, &suf, s->config, s->num_work, s->num_groups, s->geom.rows,
                         (int64_t)s->max_query_len * s->group, s->combine_team, NULL);
    if (e != cudaSuccess) return e;
    if (timed) cudaEventRecord(ev[3], s->stream);
    int64_t pairs = s->fused_merge ? 0 : (int64_t)s->num_tokens * s->hq * (s->head_size / 2);
    int nofw = s->cfg.fault == AR_FAULT_MERGE_NO_WEIGHTS, base2 = s->cfg.fault == AR_FAULT_LSE_BASE2;
    if (pairs > 0) {
        if (s->bf16)
            ar_attn::merge_kernel<__nv_bfloat16><<<grid_for(pairs, 256), 256, 0, s->stream>>>(
                (const __nv_bfloat16 *)pre.out, pre.lse, (const __nv_bfloat16 *)suf.out, suf.lse,
                (__nv_bfloat16 *)a->out, a->lse, s->num_tokens, s->hq, s->head_size, nofw, base2);
        else
            ar_attn::merge_kernel<__half><<<grid_for(pairs, 256), 256, 0, s->stream>>>(
                (const __half *)pre.out, pre.lse, (const __half *)suf.out, suf.lse, (__half *)a->out, a->lse,
                s->num_tokens, s->hq, s->head_size, nofw, base2);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    if (timed && !s->fused_merge) cudaEventRecord(ev[4], s->stream);
    return cudaSuccess;
}

static int cmp_double(const void *pa, const void *pb)
{
    double a = *(const double *)pa, b = *(const double *)pb;
    return a < b ? -1 : a > b;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The kernel path of one launch of the step's plan (backend.h): pass 0 flat, 1 cascade prefix,
 * 2 cascade suffix; the config build_plan chose; split: the launch was cut into pieces that a
 * combine merged. */
static const char *kernel_path(int pass, int config, bool split)
{
    static const char *const names[3][AR_CFG_COUNT][2] = {
        {{"attn:prefill", "attn:prefill+split"}, {"attn:decode", "attn:decode+split"},
         {"attn:prefill-wg", "attn:prefill-wg+split"}, {"attn:decode-tma", "attn:decode-tma+split"}},
        {{"cascade-prefix:prefill", "cascade-prefix:prefill+split"},
         {"cascade-prefix:decode", "cascade-prefix:decode+split"},
         {"cascade-prefix:prefill-wg", "cascade-prefix:prefill-wg+split"},
         {"cascade-prefix:decode-tma", "cascade-prefix:decode-tma+split"}},
        {{"cascade-suffix:prefill", "cascade-suffix:prefill+split"},
         {"cascade-suffix:decode", "cascade-suffix:decode+split"},
         {"cascade-suffix:prefill-wg", "cascade-suffix:prefill-wg+split"},
         {"cascade-suffix:decode-tma", "cascade-suffix:decode-tma+split"}}};
    if (pass < 0 || pass > 2 || config < 0 || config >= AR_CFG_COUNT) return "attn:unknown";
    return names[pass][config][split ? 1 : 0];
}

/* Every kernel path of the step's plan, as run_pass launches it. */
static void report_paths(const cuda_state *s, ar_forward_out *o)
{
    o->num_paths = 0;
    if (s->kv_fp8) ar_forward_add_path(o, "kv-fp8");   /* the KV8 kernels and the fp8 cache write */
    if (!s->cascade) {
        ar_forward_add_path(o, kernel_path(0, s->config, s->num_groups > 0));
        return;
    }
    ar_forward_add_path(o, kernel_path(1, s->pre_config, s->pre_num_groups > 0));
    ar_forward_add_path(o, kernel_path(2, s->config, s->num_groups > 0));
    if (fold_prefix_combine(s)) ar_forward_add_path(o, "cascade-prefix-combine:folded");
    ar_forward_add_path(o, s->fused_merge ? "cascade-merge:fused" : "cascade-merge:separate");
}

static int cuda_forward(void *state, int layer, const ar_batch *b, ar_forward_out *o, char *err, size_t err_len)
{
    cuda_state *s = (cuda_state *)state;
    (void)b;
    if (!s->step_ready) {
        snprintf(err, err_len, "cuda backend: forward before a successful prepare");
        return 2;
    }
    if (layer < 0 || layer >= s->num_layers) {
        snprintf(err, err_len, "cuda backend: forward: layer %d outside [0, %d)", layer, s->num_layers);
        return 2;
    }
    const int T = s->num_tokens;
    int rc;
    o->num_kernels = 0;
    o->total_us = 0;
    o->guard_violations = 0;
    if (T > 0) {
        /* inputs, untimed */
        int64_t nq = (int64_t)T * s->hq * (s->head_size / 8), nk = (int64_t)T * s->hkv * (s->head_size / 8);
        gen_rows_kernel<<<grid_for(nq, 256), 256, 0, s->stream>>>((uint16_t *)s->q.ptr, T, s->hq, s->head_size, s->cfg.seed,
                                                               AR_STREAM_Q, (uint32_t)layer, s->d_tok_req, s->d_tok_pos,
                                                               s->d_req_keys, s->d_block_keys, s->mbpr,
                                                               s->block_size_log2, s->cfg.data, s->cfg.dtype);
        gen_rows_kernel<<<grid_for(nk, 256), 256, 0, s->stream>>>((uint16_t *)s->knew.ptr, T, s->hkv, s->head_size, s->cfg.seed,
                                                               AR_STREAM_K, (uint32_t)layer, s->d_tok_req, s->d_tok_pos,
                                                               s->d_req_keys, s->d_block_keys, s->mbpr,
                                                               s->block_size_log2, s->cfg.data, s->cfg.dtype);
        gen_rows_kernel<<<grid_for(nk, 256), 256, 0, s->stream>>>((uint16_t *)s->vnew.ptr, T, s->hkv, s->head_size, s->cfg.seed,
                                                               AR_STREAM_V, (uint32_t)layer, s->d_tok_req, s->d_tok_pos,
                                                               s->d_req_keys, s->d_block_keys, s->mbpr,
                                                               s->block_size_log2, s->cfg.data, s->cfg.dtype);
        if ((rc = cuda_fail(cudaGetLastError(), "generator kernels", err, err_len))) return rc;
    }
    /* poison the payloads: a row the kernels never write stays NaN */
    if ((rc = cuda_fail(cudaMemsetAsync((char *)s->out.ptr + AR_GUARD_BYTES, 0xFF, s->out_bytes, s->stream), "poison", err, err_len)) ||
        (rc = cuda_fail(cudaMemsetAsync((char *)s->lse.ptr + AR_GUARD_BYTES, 0xFF, s->lse_bytes, s->stream), "poison", err, err_len)))
        return rc;
    ar_attn_args a;
    fill_args(s, layer, &a);
    int repeat = s->cfg.repeat > 0 ? s->cfg.repeat : 1;
    /* kernels timed: flat write, attn, combine (reported when the plan splits); cascade write,
     * prefix, suffix, merge (each pass's combine inside its time).  times[k * repeat + i] =
     * kernel k of repeat i; the last row is the total. */
    const int nk = s->cascade ? 4 : 3;
    /* kernels with events around them: a fused merge runs inside the suffix pass, so "merge"
     * has no events and times 0 (an empty event pair measured ~1.3 us on the H200) */
    const int nk_ev = s->cascade && s->fused_merge ? 3 : nk;
    double *times = (double *)malloc(sizeof(double) * (size_t)(nk + 1) * (size_t)repeat);
    if (!times) {
        snprintf(err, err_len, "cuda backend: out of host memory");
        return 3;
    }
    /* One untimed warm-up: at the first forward (module loading, first-launch costs) and before
     * every --repeat R > 1 series.  With --repeat 1 a replayed layer runs its kernels once, as an
     * engine does, and is timed cold. */
    if ((!s->warmed || repeat > 1) &&
        (rc = cuda_fail(run_pass(s, &a, layer, NULL), "attention launch (warm-up)", err, err_len))) {
        free(times);
        return rc;
    }
    s->warmed = 1;
    const bool host_copy = o->out && o->lse;
    const size_t out_payload = (size_t)T * s->hq * s->head_size * 2, lse_payload = (size_t)s->hq * T * 4;
    if ((rc = cuda_fail(ar_event_pool_reserve(&s->ev_pool, AR_PASS_EVENTS * repeat), "event", err, err_len))) {
        free(times);
        return rc;
    }
    /* the repeats back to back, each on its own events, then once after the last: the guard
     * regions checked on the device and, only when the engine asked for them, host copies of
     * out and LSE; one wait for all of it */
    for (int i = 0; i < repeat; i++)
        if ((rc = cuda_fail(run_pass(s, &a, layer, s->ev_pool.ev + AR_PASS_EVENTS * i), "attention launch", err,
                            err_len))) {
            free(times);
            return rc;
        }
    const ar_cuda_outbufs ob = {s->out.ptr, s->lse.ptr, s->out_bytes, s->lse_bytes, AR_GUARD_BYTES};
    if ((rc = cuda_fail(ar_cuda_forward_tail(s->stream, &ob, s->d_guard, s->h_guard, host_copy ? s->h_out : NULL,
                                           out_payload, lse_payload, s->done_ev), "forward results", err, err_len)) ||
        (rc = cuda_fail(cudaEventSynchronize(s->done_ev), "attention kernels", err, err_len))) {
        free(times);
        return rc;
    }
    ar_event_pool_times(&s->ev_pool, repeat, AR_PASS_EVENTS, nk_ev, nk, times);
    static const char *const flat_names[] = {"write", "attn", "combine"};
    static const char *const cascade_names[] = {"write", "prefix", "suffix", "merge"};
    for (int k = 0; k < nk; k++) {
        o->kernels[k].name = s->cascade ? cascade_names[k] : flat_names[k];
        o->kernels[k].us = median(times + k * repeat, repeat);
    }
    o->num_kernels = s->cascade || s->num_groups > 0 ? nk : 2;
    o->total_us = median(times + nk * repeat, repeat);
    free(times);
    report_paths(s, o);

    o->dev_out = (const char *)s->out.ptr + AR_GUARD_BYTES;
    o->dev_out_type = s->cfg.dtype;
    o->dev_lse = (const float *)((const char *)s->lse.ptr + AR_GUARD_BYTES);
    o->dev_stream = s->stream;
    int bad = *s->h_guard;
    o->guard_violations = bad;
    if (bad) {   /* re-stamp for the next forward */
        const ar_cuda_outbufs ob = {s->out.ptr, s->lse.ptr, s->out_bytes, s->lse_bytes, AR_GUARD_BYTES};
        ar_cuda_restamp_guards(s->stream, &ob);
    }
    if (host_copy) {
        const unsigned char *ho = (const unsigned char *)s->h_out;
        const uint16_t *ob = (const uint16_t *)ho;
        int64_t n_out = (int64_t)T * s->hq * s->head_size;
        if (s->bf16)
            for (int64_t i = 0; i < n_out; i++) o->out[i] = ar_bf16_to_f32(ob[i]);
        else
            for (int64_t i = 0; i < n_out; i++) o->out[i] = ar_fp16_to_f32(ob[i]);
        memcpy(o->lse, ho + out_payload, lse_payload);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Hooks                                                                                     */

extern "C" void ar_cuda_set_plan(void *state, int config, int num_splits)
{
    cuda_state *s = (cuda_state *)state;
    if (!s) return;
    s->force_config = config;
    s->force_splits = num_splits;
}

extern "C" void ar_cuda_set_prefix_plan(void *state, int config, int num_splits)
{
    cuda_state *s = (cuda_state *)state;
    if (!s) return;
    s->force_pre_config = config;
    s->force_pre_splits = num_splits;
}

extern "C" void ar_cuda_set_cascade_merge(void *state, int fused)
{
    cuda_state *s = (cuda_state *)state;
    if (s) s->fused_merge = fused ? 1 : 0;
}

extern "C" void ar_cuda_set_cascade_fold(void *state, int fold)
{
    cuda_state *s = (cuda_state *)state;
    if (s) s->fold_combine = fold ? 1 : 0;
}

extern "C" void ar_cuda_plan_of(void *state, ar_cuda_plan_info *info)
{
    cuda_state *s = (cuda_state *)state;
    memset(info, 0, sizeof *info);
    if (!s) return;
    info->config = s->config;
    info->template_hd = s->template_hd;
    info->num_work = s->num_work;
    info->num_ctas = s->config == AR_CFG_PREFILL_WG ? ar_attn_wg_ctas(wg_persistent_ctas(s), s->num_work) : s->num_work;
    info->num_splits = s->num_splits;
    info->num_groups = s->num_groups;
    info->combine_team = s->combine_team;
    info->ctas_per_sm = s->ctas_per_sm[s->config];
    info->num_sms = s->num_sms;
    info->has_wgmma = s->has_wgmma;
    info->has_tma = s->has_tma;
    info->cascade = s->cascade;
    info->prefix_len = s->prefix_len;
    info->prefix_config = s->pre_config;
    info->prefix_num_work = s->pre_num_work;
    info->prefix_num_splits = s->pre_num_splits;
    info->prefix_combine_folded = fold_prefix_combine(s) ? 1 : 0;
    info->kv_fp8 = s->kv_fp8 ? 1 : 0;
}

extern "C" int ar_cuda_merge_states(ar_dtype dtype, int num_tokens, int num_heads, int head_size,
                                    const float *prefix_out, const float *prefix_lse, const float *suffix_out,
                                    const float *suffix_lse, int no_weights, float *out, float *lse, char *err,
                                    size_t err_len)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        snprintf(err, err_len, "no CUDA device");
        return 3;
    }
    if ((dtype != AR_BF16 && dtype != AR_FP16) || num_tokens < 0 || num_heads <= 0 || head_size <= 0 ||
        head_size % 2 != 0) {
        snprintf(err, err_len, "merge: dtype %s, %d tokens, %d heads, head size %d (rule: fp16/bf16, even head size)",
                 ar_dtype_name(dtype), num_tokens, num_heads, head_size);
        return 2;
    }
    size_t n = (size_t)num_tokens * num_heads * head_size, nl = (size_t)num_tokens * num_heads;
    uint16_t *h = (uint16_t *)malloc((n > 0 ? n : 1) * 2 * 2);
    if (!h) {
        snprintf(err, err_len, "merge: out of host memory");
        return 3;
    }
    for (size_t i = 0; i < n; i++) {
        h[i] = dtype == AR_BF16 ? ar_f32_to_bf16(prefix_out[i]) : ar_f32_to_fp16(prefix_out[i]);
        h[n + i] = dtype == AR_BF16 ? ar_f32_to_bf16(suffix_out[i]) : ar_f32_to_fp16(suffix_out[i]);
    }
    unsigned char *d = NULL;
    size_t o_out = round_up(2 * n * 2, 256), o_lse = o_out + round_up(n * 2, 256);
    size_t total = o_lse + 3 * round_up(nl * 4, 256) + 256;
    int rc = cuda_fail(cudaMalloc((void **)&d, total), "merge buffers", err, err_len);
    float *d_pl = (float *)(d + o_lse), *d_sl = d_pl + round_up(nl * 4, 256) / 4, *d_l = d_sl + round_up(nl * 4, 256) / 4;
    if (!rc) rc = cuda_fail(cudaMemcpy(d, h, 2 * n * 2, cudaMemcpyHostToDevice), "merge upload", err, err_len);
    if (!rc) rc = cuda_fail(cudaMemcpy(d_pl, prefix_lse, nl * 4, cudaMemcpyHostToDevice), "merge upload", err, err_len);
    if (!rc) rc = cuda_fail(cudaMemcpy(d_sl, suffix_lse, nl * 4, cudaMemcpyHostToDevice), "merge upload", err, err_len);
    int64_t pairs = (int64_t)nl * (head_size / 2);
    if (!rc && pairs > 0) {
        if (dtype == AR_BF16)
            ar_attn::merge_kernel<__nv_bfloat16><<<grid_for(pairs, 256), 256>>>(
                (const __nv_bfloat16 *)d, d_pl, (const __nv_bfloat16 *)d + n, d_sl, (__nv_bfloat16 *)(d + o_out), d_l,
                num_tokens, num_heads, head_size, no_weights, 0);
        else
            ar_attn::merge_kernel<__half><<<grid_for(pairs, 256), 256>>>(
                (const __half *)d, d_pl, (const __half *)d + n, d_sl, (__half *)(d + o_out), d_l, num_tokens,
                num_heads, head_size, no_weights, 0);
        rc = cuda_fail(cudaGetLastError(), "merge kernel", err, err_len);
    }
    if (!rc) rc = cuda_fail(cudaMemcpy(h, d + o_out, n * 2, cudaMemcpyDeviceToHost), "merge download", err, err_len);
    if (!rc) rc = cuda_fail(cudaMemcpy(lse, d_l, nl * 4, cudaMemcpyDeviceToHost), "merge download", err, err_len);
    if (!rc)
        for (size_t i = 0; i < n; i++) out[i] = dtype == AR_BF16 ? ar_bf16_to_f32(h[i]) : ar_fp16_to_f32(h[i]);
    if (d) cudaFree(d);
    free(h);
    return rc;
}

extern "C" int ar_cuda_poke_guard(void *state)
{
    cuda_state *s = (cuda_state *)state;
    if (!s || !s->out.ptr) return -1;
    static const uint32_t junk = 0x12345678u;
    if (cudaStreamSynchronize(s->stream) != cudaSuccess) return -1;
    cudaError_t e = cudaMemcpyAsync((char *)s->out.ptr + AR_GUARD_BYTES + s->out_bytes + 8, &junk, 4,
                                    cudaMemcpyHostToDevice, s->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s->stream);
    return e == cudaSuccess ? 0 : -1;
}

extern "C" int ar_cuda_gen_values(uint64_t seed, uint32_t stream, uint32_t layer, uint64_t key, uint64_t pos0,
                                  uint32_t head, int num_pos, int dim, ar_datadist dist, ar_dtype dtype, float *out,
                                  char *err, size_t err_len)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError();
        snprintf(err, err_len, "no CUDA device");
        return 3;
    }
    size_t n = (size_t)num_pos * dim;
    float *d = NULL;
    int rc;
    if ((rc = cuda_fail(cudaMalloc(&d, n * 4 + 4), "gen buffer", err, err_len))) return rc;
    gen_values_kernel<<<grid_for((int64_t)n, 256), 256>>>(d, seed, stream, layer, key, pos0, head, num_pos, dim, dist, dtype);
    rc = cuda_fail(cudaGetLastError(), "gen kernel", err, err_len);
    if (!rc) rc = cuda_fail(cudaMemcpy(out, d, n * 4, cudaMemcpyDeviceToHost), "gen copy", err, err_len);
    cudaFree(d);
    return rc;
}

extern "C" const ar_backend ar_cuda_backend = {
    "cuda",
    "CUDA paged attention (FlashAttention-2 style mma.sync, GQA-packed tiles, split-KV decode)",
    "fp16/bf16; KV = model dtype or fp8_e4m3 (per-tensor kv_scale, head size a multiple of 16, on the "
    "mma.sync PREFILL/DECODE kernels); head sizes 64/128/256 fast + any multiple of 8 <= 256, "
    "block sizes 16/32/64, causal, sliding window, soft cap, LSE, split-KV, cascade; sm_80+",
    true,
    cuda_check,
    cuda_open,
    cuda_prepare,
    cuda_fill,
    cuda_forward,
    cuda_device_name,
    cuda_close,
};
