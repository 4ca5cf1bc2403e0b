/* cuda_mla.cu - the "cuda-mla" backend: DeepSeek-V2/V3 multi-head latent attention (MLA) on an
 * NVIDIA GPU (sm_80+, built for sm_80 and sm_90a), with vLLM's MLA semantics (semantics
 * section 7).  This file is the backend's triple, read in one place:
 *   - the descriptor (ar_cuda_mla_backend: check / open / close, at the end);
 *   - the MetadataBuilder (mla_prepare): the step's decode and prefill requests, the decode
 *     launch's kernel (the decision function ar_mla_choose, mla_route.c) and plan, the prefill path's
 *     workspace passes, all packed into one device buffer;
 *   - the Impl (mla_fill, mla_forward): inputs generated on the device, then per pass the
 *     latent-cache write, the absorption GEMM, the latent attention and its split combine, the
 *     W_UV up-projection and the prefill path; timed, guarded, copied back.
 * The pieces it drives live in kernels/mla/: mla_route.c (the decision function and a route's
 * plan), mla_plan.c (the planner), mla_decode.h / mla_decode.cu (the decode launch and its
 * kernels), mla_prefill.cuh (GEMM and prefill kernels), mla_prefill_pingpong.cuh (the prefill
 * attention on wgmma, two warpgroups fed by TMA),
 * mla_inputs.cuh (generator and cache write), mla_common.cuh (shapes, arguments, helpers).
 *
 * Timed part of forward (CUDA events; one untimed warm-up at the first forward and before every
 * series of cfg->repeat > 1; then cfg->repeat passes back to back, each on its own events, and
 * the median of them): "write"
 * (latent cache write), "absorb" (q_nope x W_UK), "attn" (latent attention), "combine" (split
 * merge), "wuv" (o_lat x W_UV), and for prefill requests "prefill" (up-projection, chunked
 * attention and merges).  Inputs and weights are generated untimed.  Output buffers carry
 * guard regions checked after every forward; out/LSE are NaN-poisoned before each forward.
 * The absorption and W_UV run on the decode requests' tokens only (runs of consecutive tokens;
 * past MLA_DEC_RANGES runs, one span from the first decode token to the step's last token).
 * Projection GEMMs (AR_MLA_GEMM): by default all go through cuBLAS (kernels/common/cuda_cublas.h,
 * loaded at run time) in 16 bits, as vLLM runs them; W_UV's float operand (the latent attention
 * output) is rounded to the dtype first and its result widened back (narrow_kernel, widen_kernel).
 * The planted wrong-head fault's shifted weights, and every GEMM where cuBLAS cannot load (said
 * once on stderr), run on the tensor-core kernel of mla_prefill.cuh.  AR_MLA_GEMM=cublas
 * insists on cuBLAS (open refuses with exit 2 without it), =tc takes the tensor-core kernel for
 * all, =simt the SIMT kernel.
 * Prefill attention (AR_MLA_PREFILL): by default the expanded path's attention runs on the
 * Hopper kernel in FlashAttention-3's form (prefill_attn_pingpong_kernel: two query tiles a CTA
 * sharing every key tile, a TMA producer, ping-pong turns; DeepSeek's QK 192 / V 128 on compute
 * capability 9.0; elsewhere the mma.sync kernel prefill_attn_tc_kernel, said once on stderr;
 * other shapes the SIMT kernel).  =pingpong insists on it (open refuses with exit 2 where it
 * cannot run), =tc takes the mma.sync kernel, =simt the SIMT one; =absorbed sends requests of
 * more than AR_CUDA_MLA_DECODE_THRESHOLD query tokens down the absorbed decode path too, as
 * FlashMLA's and FlashInfer's adapters do (for comparisons).  Other values of either are
 * refused (exit 2).
 * AR_MLA_KERNEL=simt|tc-split-qk|tc-wgmma|tc-narrow|tc-narrow-bulk forces the decode kernel (for comparisons;
 * mla_route.h has the rule); AR_MLA_TMA=0 makes no tensor map of the cache, so the wgmma route
 * runs its cp.async fallback (attn_wgmma_cpasync_kernel), as where the driver refuses the map;
 * AR_MLA_SPLITS=N (1..1024) cuts every 64-row tile's keys into at most N pieces.  mla_knobs.c
 * reads these three and refuses any other value (exit 2).
 *
 * LSE convention: [Hq, T], natural log, -inf for a row that sees no key (backend contract). */
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_mla.h"
#include "mla_knobs.h"
#include "../common/cuda_cublas.h"
#include "../common/cuda_host.cuh"
#include "mla_decode.h"
#include "mla_inputs.cuh"
#include "mla_prefill.cuh"
#include "mla_prefill_pingpong.cuh"

#define MLA_GUARD_BYTES 4096
#define MLA_PASS_EVENTS 7          /* timing events of one timed pass (run_pass) */
#define MLA_DEC_RANGES 16   /* runs of decode tokens given their own absorption / W_UV GEMMs */
#define MLA_GUARD_BYTE 0xA5

using namespace ar_mla;

/* ---------------------------------------------------------------------------------------- */
/* Host helpers                                                                              */

/* dev_buf: kernels/common/cuda_host.cuh; mla_fail, mla_ensure, mla_grid, median_of:
 * mla_decode.h */
static size_t mla_round_up(size_t x, size_t a) { return ar_round_up(x, a); }

static int mla_ensure_host(void **p, size_t *cap, size_t need, char *err, size_t err_len)
{
    return ar_cuda_ensure_host(p, cap, need, "cuda-mla backend", err, err_len);
}

/* ---------------------------------------------------------------------------------------- */
/* The backend                                                                                */

/* Workspace bound of the prefill path, in tokens per context chunk (vLLM: up to 65536; smaller
 * here so that the up-projected chunk, tokens x heads x (192 + 128) values, stays modest). */
#define MLA_WORKSPACE_TOKENS 4096

typedef struct mla_state {
    ar_run_config cfg;
    int device;
    char device_name[256];
    int num_sms;
    mla_caps caps;                  /* what the device can run (mla_probe) */
    int H, P, V, bs, num_layers;
    bool bf16, fp8;
    size_t cache_bytes;             /* per layer */
    void **cache;                   /* [num_layers] -> [num_blocks, block_size, 576] */
    uint16_t **w_uk, **w_uv;        /* [num_layers] -> [H, 512, P] and [H, 512, V], made lazily */
    cudaStream_t stream;
    cudaEvent_t done_ev;            /* the end of a forward's work */
    ar_event_pool ev_pool;          /* MLA_PASS_EVENTS a repeat of a forward */
    int *d_guard, *h_guard;         /* guard words found overwritten: device counter, pinned copy */

    /* the step (prepare) */
    int step_ready;
    int R, T, mbpr;
    int num_work, num_groups, num_partials;
    int num_ctas;                   /* CTAs of the latent-attention launch (num_work unless persistent) */
    int max_rows;                   /* most rows (q_len * H) of an absorbed request */
    int n_dec_reqs, n_pf_reqs, n_pf_tok, n_passes, ws_rows_max;
    int n_pf_tiles;                 /* query tiles of <= AR_MLA_PREFILL_TILE prefill tokens of one request */
    int dec_rows[2 * MLA_DEC_RANGES];   /* [n_dec_ranges][2] token ranges [begin, end) the absorption and W_UV run on */
    int n_dec_ranges;
    bool dec_rows_hold_prefill;     /* more than MLA_DEC_RANGES runs: one span, prefill tokens inside it */
    ar_mla_prefill_passes pf;       /* the prefill path's passes (mla_plan.h) */
    size_t *pass_meta_off;          /* [n_passes] offset of the pass's arrays in meta */
    int *d_qsl, *d_seq, *d_bt, *d_treq, *d_tpos, *d_pf_tok;
    int *d_pf_tiles;                /* [n_pf_tiles][3] first pf_tok index, count, request */
    int64_t *d_slots;
    uint64_t *d_rkeys, *d_bkeys;
    work_item *d_work;
    combine_group *d_groups;

    dev_buf meta, qlat, qnope, lat, olat, out, lse, part_o, part_lse, fill;
    dev_buf ws_lat, ws_k, ws_v, pass_o, pass_lse, acc_o, acc_lse;
    dev_buf stage_a, stage_c;       /* 16-bit copies of a float GEMM operand / result for cuBLAS */
    void *h_meta;
    size_t h_meta_cap;
    void *h_out;                    /* pinned: out payload, then lse payload (host copies only) */
    size_t h_out_cap;
    size_t out_bytes, lse_bytes;
    ar_cuda_mla_kernel force_kernel;
    bool no_tensor_map;             /* AR_MLA_TMA=0: the wgmma route without the cache's tensor map */
    mla_route route;                /* the decode kernel of this step (ar_mla_choose) */
    int force_splits;
    int use_prefill;
    bool gemm_tc;                   /* the projections' GEMMs on the tensor cores (all but AR_MLA_GEMM=simt) */
    bool gemm_cublas;               /* the 16-bit ones through cuBLAS (cublas_handle set) */
    bool gemm_cublas_asked;         /* AR_MLA_GEMM=cublas named: refuse to open without cuBLAS */
    const ar_cublas_api *cublas;
    void *cublas_handle;            /* on s->stream */
    ar_mla_prefill_attn prefill_attn;   /* the prefill attention's kernel (AR_MLA_PREFILL, open): the tensor-core
                                       ones get their shared memory limit raised at open */
    int n_pf_pairs;                 /* pairs of query tiles (the pingpong kernel's CTAs) */
    int *d_pf_pairs;                /* [n_pf_pairs][2] tile indices (ar_mla_pair_prefill_tiles) */
    CUtensorMap tmap_ws_k, tmap_ws_v;   /* the key / value workspace for the pingpong kernel's TMA copies */
    dev_buf tmap_ws_of[2];          /* the ws_k / ws_v allocations (pointer, capacity) those maps describe */
    int workspace_tokens;
    ar_cuda_mla_plan_info info;
    int warmed;                     /* a forward has run: later ones warm up only when --repeat > 1 */
} mla_state;

static bool mla_check(const ar_run_config *cfg, char *why, size_t why_len)
{
    const ar_model *m = &cfg->model;
    if (m->attention != AR_ATTN_MLA) {
        snprintf(why, why_len, "not an MLA model (cuda-mla runs model attention \"mla\" only)");
        return false;
    }
    if (m->kv_lora_rank != DL || m->qk_rope_head_dim != DR || m->head_size != D) {
        snprintf(why, why_len, "MLA dims kv_lora_rank %d, qk_rope_head_dim %d, head_size %d not supported "
                 "(512, 64, 576 as DeepSeek-V2/V3)", m->kv_lora_rank, m->qk_rope_head_dim, m->head_size);
        return false;
    }
    if (m->qk_nope_head_dim < 8 || m->qk_nope_head_dim > 256 || m->v_head_dim < 8 || m->v_head_dim > 256) {
        snprintf(why, why_len, "qk_nope_head_dim %d / v_head_dim %d not supported (8..256)", m->qk_nope_head_dim,
                 m->v_head_dim);
        return false;
    }
    if (m->num_kv_heads != 1 || m->num_q_heads < 1) {
        snprintf(why, why_len, "MLA needs num_kv_heads 1 and num_q_heads >= 1 (got %d, %d)", m->num_kv_heads,
                 m->num_q_heads);
        return false;
    }
    if (m->sliding_window != 0 || m->logits_soft_cap != 0) {
        snprintf(why, why_len, "sliding window / soft cap are not part of MLA");
        return false;
    }
    if (cfg->dtype != AR_FP16 && cfg->dtype != AR_BF16) {
        snprintf(why, why_len, "dtype %s not supported (fp16, bf16)", ar_dtype_name(cfg->dtype));
        return false;
    }
    if (cfg->kv_dtype != cfg->dtype && cfg->kv_dtype != AR_FP8_E4M3) {
        snprintf(why, why_len, "KV dtype %s not supported (the model dtype or fp8_e4m3)", ar_dtype_name(cfg->kv_dtype));
        return false;
    }
    if (cfg->kv_dtype == AR_FP8_E4M3 && !(cfg->kv_scale > 0)) {
        snprintf(why, why_len, "fp8 KV needs kv_scale > 0 (got %g)", cfg->kv_scale);
        return false;
    }
    if (cfg->block_size != 16 && cfg->block_size != 32 && cfg->block_size != 64) {
        snprintf(why, why_len, "block size %d not supported (16, 32, 64)", cfg->block_size);
        return false;
    }
    return ar_cuda_device_ok(why, why_len);
}

static void mla_close(void *state);
static int ensure_weights(mla_state *s, int layer, char *err, size_t err_len);

static int mla_open(const ar_run_config *cfg, void **state_out, char *err, size_t err_len)
{
    *state_out = NULL;
    char why[256];
    if (!mla_check(cfg, why, sizeof why)) {
        snprintf(err, err_len, "cuda-mla backend: %s", why);
        return strncmp(why, "no CUDA device", 14) == 0 ? 3 : 2;
    }
    mla_state *s = (mla_state *)calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, err_len, "cuda-mla backend: out of host memory");
        return 3;
    }
    s->cfg = *cfg;
    s->device = cfg->device_index;   /* chosen by the engine from the local rank (replay/shard.h) */
    s->H = cfg->model.num_q_heads;
    s->P = cfg->model.qk_nope_head_dim;
    s->V = cfg->model.v_head_dim;
    s->bs = cfg->block_size;
    s->bf16 = cfg->dtype == AR_BF16;
    s->fp8 = cfg->kv_dtype == AR_FP8_E4M3;
    s->num_layers = cfg->num_layers > 0 ? cfg->num_layers : 1;
    /* AR_MLA_PREFILL: the prefill path's attention on the Hopper kernel (pingpong, the default
     * for DeepSeek's QK 192 / V 128; other shapes keep the SIMT one; named, refused with exit 2
     * where it cannot run, below), on the mma.sync kernel (tc), on the SIMT kernel (simt), or
     * every request on the absorbed decode kernels, prefill chunks too, as FlashMLA's and
     * FlashInfer's adapters run them (absorbed, for comparisons; the others keep vLLM's split,
     * semantics 7.3).  AR_MLA_GEMM: the projection GEMMs through cuBLAS (cublas, the default:
     * the tensor-core kernel where cuBLAS cannot load), on the tensor-core kernel (tc) or on the
     * SIMT one (simt).  Any other value is refused. */
    const char *pf_env = getenv("AR_MLA_PREFILL"), *gemm_env = getenv("AR_MLA_GEMM");
    if (pf_env && *pf_env && strcmp(pf_env, "tc") && strcmp(pf_env, "simt") && strcmp(pf_env, "pingpong") &&
        strcmp(pf_env, "absorbed")) {
        snprintf(err, err_len, "cuda-mla backend: AR_MLA_PREFILL=%s: not one of pingpong (the default), tc, simt, absorbed",
                 pf_env);
        free(s);
        return 2;
    }
    if (gemm_env && *gemm_env && strcmp(gemm_env, "cublas") && strcmp(gemm_env, "tc") && strcmp(gemm_env, "simt")) {
        snprintf(err, err_len, "cuda-mla backend: AR_MLA_GEMM=%s: not one of cublas (the default), tc, simt", gemm_env);
        free(s);
        return 2;
    }
    const bool pf_named = pf_env && *pf_env, gemm_named = gemm_env && *gemm_env;
    s->use_prefill = !(pf_named && strcmp(pf_env, "absorbed") == 0);
    const bool pf_shape = s->P + DR == PF_TC_QK && s->V == PF_TC_V;
    /* pingpong by default where the shape allows (open falls back to tc below where the device
     * cannot run it); named, it must run (else exit 2) */
    const bool pingpong_asked = pf_named && strcmp(pf_env, "pingpong") == 0;
    if (!pf_shape || (pf_named && strcmp(pf_env, "simt") == 0))
        s->prefill_attn = AR_MLA_PF_ATTN_SIMT;
    else if (pf_named && strcmp(pf_env, "tc") == 0)
        s->prefill_attn = AR_MLA_PF_ATTN_TC;
    else
        s->prefill_attn = AR_MLA_PF_ATTN_PINGPONG;
    if (pingpong_asked && !pf_shape) {
        snprintf(err, err_len, "cuda-mla backend: AR_MLA_PREFILL=pingpong: the pingpong kernel needs QK 192 / V 128 "
                 "(qk_nope_head_dim %d, v_head_dim %d)", s->P, s->V);
        free(s);
        return 2;
    }
    s->gemm_cublas = !gemm_named || strcmp(gemm_env, "cublas") == 0;
    s->gemm_cublas_asked = gemm_named && s->gemm_cublas;
    s->gemm_tc = !(gemm_named && strcmp(gemm_env, "simt") == 0);
    s->workspace_tokens = MLA_WORKSPACE_TOKENS;
    ar_mla_knobs knobs;   /* AR_MLA_KERNEL, AR_MLA_TMA, AR_MLA_SPLITS (mla_knobs.h) */
    if (ar_mla_knobs_read(&knobs, err, err_len)) {
        free(s);
        return 2;
    }
    s->force_kernel = knobs.kernel;
    s->no_tensor_map = knobs.no_tensor_map;
    s->force_splits = knobs.splits;   /* every row tile in <= N pieces where set */
    int rc;
    cudaDeviceProp prop;
    if ((rc = mla_fail(cudaSetDevice(s->device), "cudaSetDevice", err, err_len)) ||
        (rc = mla_fail(cudaGetDeviceProperties(&prop, s->device), "cudaGetDeviceProperties", err, err_len))) {
        free(s);
        return rc;
    }
    snprintf(s->device_name, sizeof s->device_name, "%s", prop.name);
    s->num_sms = prop.multiProcessorCount;
    if (s->prefill_attn == AR_MLA_PF_ATTN_PINGPONG) {   /* sm_90a code: compute capability 9.0 only */
        cudaError_t e = cudaSuccess;
        if (prop.major != 9 || prop.minor != 0 ||
            (e = cudaFuncSetAttribute(prefill_attn_pingpong_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      PP_SMEM)) != cudaSuccess ||
            (e = cudaFuncSetAttribute(prefill_attn_pingpong_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      PP_SMEM)) != cudaSuccess) {
            char why[160];
            if (e != cudaSuccess)
                snprintf(why, sizeof why, "the pingpong kernel's shared memory: %s", cudaGetErrorString(e));
            else
                snprintf(why, sizeof why, "the pingpong kernel needs compute capability 9.0 (this device: %d.%d)",
                         prop.major, prop.minor);
            cudaGetLastError();
            if (pingpong_asked) {
                snprintf(err, err_len, "cuda-mla backend: AR_MLA_PREFILL=pingpong: %s", why);
                free(s);
                return 2;
            }
            /* the default: the mma.sync kernel instead, said once */
            fprintf(stderr, "cuda-mla backend: the prefill attention runs on the mma.sync kernel: %s\n", why);
            s->prefill_attn = AR_MLA_PF_ATTN_TC;
        }
    }
    if (s->prefill_attn == AR_MLA_PF_ATTN_TC) {   /* its shared memory: more than the 48 KiB a launch gets unasked */
        cudaError_t e = cudaFuncSetAttribute(prefill_attn_tc_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             PF_TC_SMEM);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(prefill_attn_tc_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     PF_TC_SMEM);
        if ((rc = mla_fail(e, "the tensor-core prefill kernel's shared memory", err, err_len))) {
            free(s);
            return rc;
        }
    }
    s->caps = mla_probe(s->device);
    if ((rc = mla_fail(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "stream", err, err_len))) {
        free(s);
        return rc;
    }
    if ((rc = mla_fail(cudaEventCreate(&s->done_ev), "event", err, err_len))) {
        mla_close(s);
        return rc;
    }
    if (s->gemm_cublas) {
        char why[2600];
        int status = -1;
        if ((s->cublas = ar_cublas_load(why, sizeof why)) != NULL) {
            if ((status = s->cublas->create(&s->cublas_handle)) != 0)
                s->cublas_handle = NULL;   /* a failed create's handle is not one to destroy */
            else
                status = s->cublas->set_stream(s->cublas_handle, s->stream);
        }
        if (s->cublas && status != 0)
            snprintf(why, sizeof why, "cublasCreate / cublasSetStream (%s) returned status %d", s->cublas->path,
                     status);
        if (status != 0 && s->gemm_cublas_asked) {   /* -1: not loadable, why says where it looked */
            snprintf(err, err_len, "cuda-mla backend: AR_MLA_GEMM=cublas: %s", why);
            mla_close(s);
            return 2;
        }
        if (status != 0) {   /* the default: the tensor-core kernel instead, said once */
            static bool told = false;
            if (!told) fprintf(stderr, "cuda-mla backend: %s; the projection GEMMs run on the tensor-core kernel\n", why);
            told = true;
            if (s->cublas_handle) s->cublas->destroy(s->cublas_handle);
            s->cublas_handle = NULL;
            s->gemm_cublas = false;
        }
    }
    if ((rc = mla_fail(cudaMalloc((void **)&s->d_guard, sizeof(int)), "guard counter", err, err_len)) ||
        (rc = mla_fail(cudaMallocHost((void **)&s->h_guard, sizeof(int)), "guard counter", err, err_len))) {
        mla_close(s);
        return rc;
    }
    s->cache_bytes = (size_t)cfg->num_blocks * cfg->block_size * D * (s->fp8 ? 1 : 2);
    size_t weight_bytes = (size_t)s->H * DL * (s->P + s->V) * 2;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    if ((double)(s->cache_bytes + weight_bytes) * s->num_layers > 0.85 * (double)free_b) {
        snprintf(err, err_len,
                 "cuda-mla backend: the latent caches and weights need %.2f GiB (%d layers x %.3f GiB) but the "
                 "device has %.2f GiB free; replay fewer layers or fewer blocks",
                 (double)(s->cache_bytes + weight_bytes) * s->num_layers / 1073741824.0, s->num_layers,
                 (double)(s->cache_bytes + weight_bytes) / 1073741824.0, free_b / 1073741824.0);
        mla_close(s);
        return 2;
    }
    s->cache = (void **)calloc((size_t)s->num_layers, sizeof(void *));
    s->w_uk = (uint16_t **)calloc((size_t)s->num_layers, sizeof(uint16_t *));
    s->w_uv = (uint16_t **)calloc((size_t)s->num_layers, sizeof(uint16_t *));
    if (!s->cache || !s->w_uk || !s->w_uv) {
        snprintf(err, err_len, "cuda-mla backend: out of host memory");
        mla_close(s);
        return 3;
    }
    for (int l = 0; l < s->num_layers; l++) {
        if ((rc = mla_fail(cudaMalloc(&s->cache[l], s->cache_bytes), "latent cache allocation", err, err_len)) ||
            (rc = mla_fail(cudaMemsetAsync(s->cache[l], 0xFF, s->cache_bytes, s->stream), "NaN fill", err, err_len)) ||
            (rc = ensure_weights(s, l, err, err_len))) {   /* here, not in the first step's forward */
            mla_close(s);
            return rc;
        }
    }
    if ((rc = mla_fail(cudaStreamSynchronize(s->stream), "open", err, err_len))) {
        mla_close(s);
        return rc;
    }
    *state_out = s;
    return 0;
}

static void mla_close(void *state)
{
    mla_state *s = (mla_state *)state;
    if (!s) return;
    if (s->stream) cudaStreamSynchronize(s->stream);
    if (s->cublas_handle) s->cublas->destroy(s->cublas_handle);
    for (int l = 0; l < s->num_layers; l++) {
        if (s->cache && s->cache[l]) cudaFree(s->cache[l]);
        if (s->w_uk && s->w_uk[l]) cudaFree(s->w_uk[l]);
        if (s->w_uv && s->w_uv[l]) cudaFree(s->w_uv[l]);
    }
    free(s->cache);
    free(s->w_uk);
    free(s->w_uv);
    dev_buf *bufs[] = {&s->meta, &s->qlat, &s->qnope, &s->lat, &s->olat, &s->out, &s->lse, &s->part_o,
                       &s->part_lse, &s->fill, &s->ws_lat, &s->ws_k, &s->ws_v, &s->pass_o, &s->pass_lse,
                       &s->acc_o, &s->acc_lse, &s->stage_a, &s->stage_c};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->ptr) cudaFree(bufs[i]->ptr);
    if (s->h_meta) cudaFreeHost(s->h_meta);
    if (s->h_out) cudaFreeHost(s->h_out);
    if (s->d_guard) cudaFree(s->d_guard);
    if (s->h_guard) cudaFreeHost(s->h_guard);
    if (s->done_ev) cudaEventDestroy(s->done_ev);
    ar_event_pool_free(&s->ev_pool);
    if (s->stream) cudaStreamDestroy(s->stream);
    ar_mla_prefill_passes_free(&s->pf);
    free(s->pass_meta_off);
    free(s);
}

static void mla_device_name(void *state, char *buf, size_t len)
{
    mla_state *s = (mla_state *)state;
    snprintf(buf, len, "%s", s ? s->device_name : "none");
}

static int mla_prepare(void *state, const ar_batch *b, char *err, size_t err_len)
{
    mla_state *s = (mla_state *)state;
    s->step_ready = 0;
    const int R = b->num_reqs, T = b->num_tokens, mbpr = b->max_blocks_per_req;
    const int bs = s->bs, nb = s->cfg.num_blocks, H = s->H;
    if (ar_cuda_check_batch(b, bs, nb, err, err_len)) return 2;

    /* decode / prefill split (semantics 7.3) */
    unsigned char *is_pf = (unsigned char *)calloc((size_t)(R > 0 ? R : 1), 1);
    unsigned char *is_dec = (unsigned char *)calloc((size_t)(R > 0 ? R : 1), 1);
    if (!is_pf || !is_dec) {
        free(is_pf);
        free(is_dec);
        snprintf(err, err_len, "cuda-mla backend: out of host memory");
        return 3;
    }
    for (int r = 0; r < R; r++) {
        int ql = b->query_start_loc[r + 1] - b->query_start_loc[r];
        is_pf[r] = s->use_prefill && ql > AR_CUDA_MLA_DECODE_THRESHOLD;
        is_dec[r] = !is_pf[r];
    }
    /* the decode requests' tokens as runs of consecutive tokens (one run where decodes come
     * first, as vLLM orders a batch): the absorption and W_UV GEMMs run on these rows only, not
     * on the prefill tokens the expanded path computes; past MLA_DEC_RANGES runs, one span */
    int dec_rows[2 * MLA_DEC_RANGES], n_dec_ranges = 0;
    const bool dec_rows_hold_prefill =
        ar_mla_decode_runs(R, b->query_start_loc, is_dec, MLA_DEC_RANGES, dec_rows, &n_dec_ranges) != 0;
    const int extra = s->cfg.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0;
    mla_plan plan;
    int plan_rc = ar_mla_build_plan(&plan, R, b->query_start_loc, b->seq_lens, is_dec, H, 1, extra, s->num_sms, s->force_splits);
    /* the decision function: the decode kernel of this step, and its plan */
    s->route = ar_mla_choose(&s->caps, s->force_kernel, plan.max_rows, s->fp8, 0);
    if (!plan_rc)
        plan_rc = ar_mla_replan(&plan, &s->route, R, b->query_start_loc, b->seq_lens, is_dec, H, 1, extra, s->num_sms,
                             s->force_splits);
    if (plan_rc) {
        free(is_pf);
        free(is_dec);
        snprintf(err, err_len, "cuda-mla backend: out of host memory");
        return 3;
    }

    /* prefill passes: context chunks of at most M tokens per request (workspace-bounded,
     * block-aligned as in vLLM), then one pass over the new tokens (mla_plan.h) */
    ar_mla_prefill_passes_free(&s->pf);
    free(s->pass_meta_off);
    s->pass_meta_off = NULL;
    if (ar_mla_plan_prefill(&s->pf, R, b->query_start_loc, b->seq_lens, is_pf, s->workspace_tokens, bs) != 0 ||
        !(s->pass_meta_off = (size_t *)calloc((size_t)(s->pf.num_passes + 1) * 4, sizeof(size_t)))) {
        free(is_pf);
        free(is_dec);
        ar_mla_plan_free(&plan);
        snprintf(err, err_len, "cuda-mla backend: out of host memory");
        return 3;
    }
    const ar_mla_prefill_passes *pf = &s->pf;
    const int n_pf_reqs = pf->num_reqs, n_pf_tok = pf->num_tokens, n_passes = pf->num_passes;

    /* metadata layout */
    size_t off = 0;
    const ar_batch_meta bm = ar_batch_meta_layout(&off, R, T, mbpr);
    size_t o_work = ar_meta_take(&off, (size_t)plan.num_work * sizeof(work_item));
    size_t o_groups = ar_meta_take(&off, (size_t)plan.num_groups * sizeof(combine_group));
    size_t o_pftok = ar_meta_take(&off, (size_t)n_pf_tok * 4);
    size_t o_pftiles = ar_meta_take(&off, (size_t)pf->num_tiles * 3 * 4);
    const bool pingpong = s->prefill_attn == AR_MLA_PF_ATTN_PINGPONG && n_pf_reqs > 0;
    size_t o_pfpairs = ar_meta_take(&off, pingpong ? (size_t)pf->num_pairs * 2 * 4 : 0);
    for (int p = 0; p < n_passes; p++) {
        s->pass_meta_off[4 * p + 0] = ar_meta_take(&off, (size_t)pf->rows[p] * 4);   /* row_req */
        s->pass_meta_off[4 * p + 1] = ar_meta_take(&off, (size_t)pf->rows[p] * 4);   /* row_pos */
        s->pass_meta_off[4 * p + 2] = ar_meta_take(&off, (size_t)R * 4);                 /* kb */
        s->pass_meta_off[4 * p + 3] = ar_meta_take(&off, (size_t)R * 4);                 /* ke */
    }
    size_t meta_bytes = mla_round_up(off, 16) + 16;
    int rc;
    if ((rc = mla_ensure_host(&s->h_meta, &s->h_meta_cap, meta_bytes, err, err_len)) ||
        (rc = mla_ensure(&s->meta, meta_bytes, "metadata buffer", err, err_len))) {
        free(is_pf);
        free(is_dec);
        ar_mla_plan_free(&plan);
        return rc;
    }
    unsigned char *h = (unsigned char *)s->h_meta;
    ar_batch_meta_fill(&bm, h, b);
    ar_mla_fill_prefill_tokens(R, b->query_start_loc, is_pf, (int *)(h + o_pftok), (int *)(h + o_pftiles));
    if (pingpong && ar_mla_pair_prefill_tiles(pf, R, b->query_start_loc, b->seq_lens, is_pf, (int *)(h + o_pfpairs))) {
        free(is_pf);
        free(is_dec);
        ar_mla_plan_free(&plan);
        snprintf(err, err_len, "cuda-mla backend: out of host memory");
        return 3;
    }
    memcpy(h + o_work, plan.work, (size_t)plan.num_work * sizeof(work_item));
    memcpy(h + o_groups, plan.groups, (size_t)plan.num_groups * sizeof(combine_group));
    for (int p = 0; p < n_passes; p++)
        ar_mla_fill_prefill_pass(pf, p, R, b->query_start_loc, b->seq_lens, is_pf,
                                 (int *)(h + s->pass_meta_off[4 * p + 0]), (int *)(h + s->pass_meta_off[4 * p + 1]),
                                 (int *)(h + s->pass_meta_off[4 * p + 2]), (int *)(h + s->pass_meta_off[4 * p + 3]));
    if ((rc = mla_fail(cudaMemcpyAsync(s->meta.ptr, s->h_meta, meta_bytes, cudaMemcpyHostToDevice, s->stream),
                       "metadata upload", err, err_len))) {
        free(is_pf);
        free(is_dec);
        ar_mla_plan_free(&plan);
        return rc;
    }
    unsigned char *d = (unsigned char *)s->meta.ptr;
    s->d_qsl = (int *)(d + bm.qsl);
    s->d_seq = (int *)(d + bm.seq);
    s->d_bt = (int *)(d + bm.bt);
    s->d_treq = (int *)(d + bm.treq);
    s->d_tpos = (int *)(d + bm.tpos);
    s->d_slots = (int64_t *)(d + bm.slots);
    s->d_rkeys = (uint64_t *)(d + bm.rkeys);
    s->d_bkeys = (uint64_t *)(d + bm.bkeys);
    s->d_work = (work_item *)(d + o_work);
    s->d_groups = (combine_group *)(d + o_groups);
    s->d_pf_tok = (int *)(d + o_pftok);
    s->d_pf_tiles = (int *)(d + o_pftiles);
    s->d_pf_pairs = (int *)(d + o_pfpairs);

    /* per-step buffers */
    const int P = s->P, V = s->V, QK = P + DR;
    size_t out_payload = mla_round_up((size_t)T * H * V * 4 + 16, 256);
    size_t lse_payload = mla_round_up((size_t)H * T * 4 + 16, 256);
    size_t out_need = 2 * MLA_GUARD_BYTES + out_payload, lse_need = 2 * MLA_GUARD_BYTES + lse_payload;
    bool out_new = out_need > s->out.cap, lse_new = lse_need > s->lse.cap;
    size_t ws = (size_t)(pf->max_rows > 0 ? pf->max_rows : 1);
    size_t tpf = (size_t)(n_pf_tok > 0 ? T : 1);
    if ((rc = mla_ensure(&s->qlat, (size_t)T * H * D * 2 + 16, "latent query buffer", err, err_len)) ||
        (rc = mla_ensure(&s->qnope, (size_t)T * H * P * 2 + 16, "q_nope buffer", err, err_len)) ||
        (rc = mla_ensure(&s->lat, (size_t)T * D * 2 + 16, "new latent buffer", err, err_len)) ||
        (rc = mla_ensure(&s->olat, (size_t)T * H * DL * 4 + 16, "latent output buffer", err, err_len)) ||
        (rc = mla_ensure(&s->out, out_need, "out buffer", err, err_len)) ||
        (rc = mla_ensure(&s->lse, lse_need, "LSE buffer", err, err_len)) ||
        (rc = mla_ensure(&s->part_o, (size_t)(plan.num_partials + 1) * ROWS * DL * 4, "split partials", err, err_len)) ||
        (rc = mla_ensure(&s->part_lse, (size_t)(plan.num_partials + 1) * ROWS * 4, "split LSE", err, err_len)) ||
        (n_pf_reqs > 0 &&
         ((rc = mla_ensure(&s->ws_lat, ws * D * 2, "prefill latent workspace", err, err_len)) ||
          (rc = mla_ensure(&s->ws_k, ws * H * QK * 2, "prefill key workspace", err, err_len)) ||
          (rc = mla_ensure(&s->ws_v, ws * H * V * 2, "prefill value workspace", err, err_len)) ||
          (rc = mla_ensure(&s->pass_o, tpf * H * V * 4, "prefill pass output", err, err_len)) ||
          (rc = mla_ensure(&s->pass_lse, tpf * H * 4, "prefill pass LSE", err, err_len)) ||
          (rc = mla_ensure(&s->acc_o, tpf * H * V * 4, "prefill output", err, err_len)) ||
          (rc = mla_ensure(&s->acc_lse, tpf * H * 4, "prefill LSE", err, err_len)))) ||
        (rc = mla_ensure_host(&s->h_out, &s->h_out_cap, out_need + lse_need, err, err_len))) {
        free(is_pf);
        free(is_dec);
        ar_mla_plan_free(&plan);
        return rc;
    }
    /* the pingpong kernel's TMA views of the workspace, over its whole capacity (a pass's rows past
     * its own are masked by the kernel): ws_k [rows][H][QK], ws_v [rows][H][V], box [64 rows][1
     * head][64 dims]; encoded again only when mla_ensure reallocated a buffer (to grow it: a new
     * capacity, the pointer possibly the same) */
    if (pingpong && (s->tmap_ws_of[0].ptr != s->ws_k.ptr || s->tmap_ws_of[0].cap != s->ws_k.cap ||
                     s->tmap_ws_of[1].ptr != s->ws_v.ptr || s->tmap_ws_of[1].cap != s->ws_v.cap)) {
        memset(s->tmap_ws_of, 0, sizeof s->tmap_ws_of);
        const uint64_t k_rows = s->ws_k.cap / ((size_t)H * QK * 2), v_rows = s->ws_v.cap / ((size_t)H * V * 2);
        const uint64_t k_dims[3] = {(uint64_t)QK, (uint64_t)H, k_rows}, v_dims[3] = {(uint64_t)V, (uint64_t)H, v_rows};
        const uint64_t k_strides[2] = {(uint64_t)QK * 2, (uint64_t)H * QK * 2};
        const uint64_t v_strides[2] = {(uint64_t)V * 2, (uint64_t)H * V * 2};
        const uint32_t box[3] = {64, 1, (uint32_t)PF_TC_KEYS};
        if ((rc = ar_tma_encode(&s->tmap_ws_k, s->ws_k.ptr, 3, k_dims, k_strides, box, "cuda-mla pingpong prefill",
                                err, err_len)) ||
            (rc = ar_tma_encode(&s->tmap_ws_v, s->ws_v.ptr, 3, v_dims, v_strides, box, "cuda-mla pingpong prefill",
                                err, err_len))) {
            free(is_pf);
            free(is_dec);
            ar_mla_plan_free(&plan);
            return rc;
        }
        s->tmap_ws_of[0] = s->ws_k;   /* a copy of the pointer and capacity, not an owner */
        s->tmap_ws_of[1] = s->ws_v;
    }
    /* cuBLAS's 16-bit copies of W_UV's float operand and result: here, not in a timed forward */
    int64_t dec_tok = 0;
    for (int i = 0; i < n_dec_ranges; i++) dec_tok += dec_rows[2 * i + 1] - dec_rows[2 * i];
    if (s->cublas_handle && dec_tok > 0 &&
        ((rc = mla_ensure(&s->stage_a, (size_t)dec_tok * H * DL * 2, "GEMM staging", err, err_len)) ||
         (rc = mla_ensure(&s->stage_c, (size_t)dec_tok * H * V * 2, "GEMM staging", err, err_len)))) {
        free(is_pf);
        free(is_dec);
        ar_mla_plan_free(&plan);
        return rc;
    }
    s->out_bytes = out_payload;
    s->lse_bytes = lse_payload;
    /* prefill tokens' latent rows are never written by the absorbed path; where the W_UV GEMM
     * reads some (one span over interleaved requests; its prefill rows are overwritten later)
     * or the planted no-W_UV fault copies every row, keep them defined */
    if (n_pf_reqs > 0 && (dec_rows_hold_prefill || s->cfg.fault == AR_FAULT_MLA_NO_WUV))
        cudaMemsetAsync(s->olat.ptr, 0, (size_t)T * H * DL * 4, s->stream);
    /* the SIMT decode kernel attends every token's latent query, the prefill tokens' too (their
     * results are overwritten); the absorption writes only the decode rows, so keep the others
     * defined */
    if (n_pf_reqs > 0 && s->route.kind == AR_MLA_ROUTE_SIMT && !dec_rows_hold_prefill)
        cudaMemsetAsync(s->qlat.ptr, 0, (size_t)T * H * D * 2, s->stream);
    if (out_new) cudaMemsetAsync(s->out.ptr, MLA_GUARD_BYTE, s->out.cap, s->stream);
    if (lse_new) cudaMemsetAsync(s->lse.ptr, MLA_GUARD_BYTE, s->lse.cap, s->stream);
    /* the payload moves with T: re-stamp the area after it */
    cudaMemsetAsync((char *)s->out.ptr + MLA_GUARD_BYTES + s->out_bytes, MLA_GUARD_BYTE,
                    s->out.cap - MLA_GUARD_BYTES - s->out_bytes, s->stream);
    cudaMemsetAsync((char *)s->lse.ptr + MLA_GUARD_BYTES + s->lse_bytes, MLA_GUARD_BYTE,
                    s->lse.cap - MLA_GUARD_BYTES - s->lse_bytes, s->stream);
    if ((rc = mla_fail(cudaGetLastError(), "guard set-up", err, err_len))) {
        free(is_pf);
        free(is_dec);
        ar_mla_plan_free(&plan);
        return rc;
    }
    s->R = R;
    s->T = T;
    s->mbpr = mbpr;
    memcpy(s->dec_rows, dec_rows, sizeof dec_rows);
    s->n_dec_ranges = n_dec_ranges;
    s->dec_rows_hold_prefill = dec_rows_hold_prefill;
    s->num_work = plan.num_work;
    s->num_ctas = plan.num_ctas;
    s->num_groups = plan.num_groups;
    s->num_partials = plan.num_partials;
    s->max_rows = plan.max_rows;
    s->n_pf_reqs = n_pf_reqs;
    s->n_dec_reqs = R - n_pf_reqs;
    s->n_pf_tok = n_pf_tok;
    s->n_pf_tiles = pf->num_tiles;
    s->n_pf_pairs = pingpong ? pf->num_pairs : 0;
    s->n_passes = n_passes;
    s->ws_rows_max = pf->max_rows;
    s->info.num_decode_reqs = R - n_pf_reqs;
    s->info.num_prefill_reqs = n_pf_reqs;
    s->info.num_work = plan.num_ctas;
    s->info.num_groups = plan.num_groups;
    s->info.num_context_chunks = pf->num_ctx_chunks;
    s->info.num_sms = s->num_sms;
    s->step_ready = 1;
    free(is_pf);
    free(is_dec);
    ar_mla_plan_free(&plan);
    return 0;
}

static int mla_fill(void *state, int layer, const ar_fill *f, char *err, size_t err_len)
{
    mla_state *s = (mla_state *)state;
    if (layer < 0 || layer >= s->num_layers) {
        snprintf(err, err_len, "cuda-mla backend: fill: layer %d outside [0, %d)", layer, s->num_layers);
        return 2;
    }
    if (f->count <= 0) return 0;
    int64_t nslots = (int64_t)s->cfg.num_blocks * s->bs;
    for (int i = 0; i < f->count; i++)
        if (f->slots[i] < -1 || f->slots[i] >= nslots || f->offsets[i] < 0 || f->offsets[i] >= s->bs) {
            snprintf(err, err_len, "cuda-mla backend: fill: entry %d has slot %lld, offset %d (slots [-1, %lld), "
                     "offsets [0, %d))", i, (long long)f->slots[i], f->offsets[i], (long long)nslots, s->bs);
            return 2;
        }
    size_t o_keys = mla_round_up((size_t)f->count * 8, 16), o_off = o_keys + mla_round_up((size_t)f->count * 8, 16);
    int rc;
    if ((rc = mla_ensure(&s->fill, o_off + (size_t)f->count * 4 + 64, "fill buffer", err, err_len))) return rc;
    unsigned char *d = (unsigned char *)s->fill.ptr;
    if ((rc = mla_fail(cudaMemcpyAsync(d, f->slots, (size_t)f->count * 8, cudaMemcpyHostToDevice, s->stream), "fill upload", err, err_len)) ||
        (rc = mla_fail(cudaMemcpyAsync(d + o_keys, f->keys, (size_t)f->count * 8, cudaMemcpyHostToDevice, s->stream), "fill upload", err, err_len)) ||
        (rc = mla_fail(cudaMemcpyAsync(d + o_off, f->offsets, (size_t)f->count * 4, cudaMemcpyHostToDevice, s->stream), "fill upload", err, err_len)))
        return rc;
    fill_latent_kernel<<<mla_grid((int64_t)f->count * D, 256), 256, 0, s->stream>>>(
        s->cache[layer], f->count, (const int64_t *)d, (const uint64_t *)(d + o_keys), (const int *)(d + o_off),
        s->cfg.seed, (uint32_t)layer, s->cfg.data, s->cfg.dtype, s->cfg.kv_dtype, (float)s->cfg.kv_scale);
    if ((rc = mla_fail(cudaGetLastError(), "fill kernel", err, err_len))) return rc;
    /* the host arrays are only valid during this call: wait for the copies */
    return mla_fail(cudaStreamSynchronize(s->stream), "fill", err, err_len);
}

static void fill_attn_args(mla_state *s, int layer, attn_args *a)
{
    memset(a, 0, sizeof *a);
    a->q = s->qlat.ptr;
    a->cache = s->cache[layer];
    a->o_lat = (float *)s->olat.ptr;
    a->lse = (float *)((char *)s->lse.ptr + MLA_GUARD_BYTES);
    a->part_o = (float *)s->part_o.ptr;
    a->part_lse = (float *)s->part_lse.ptr;
    a->qsl = s->d_qsl;
    a->seq_lens = s->d_seq;
    a->block_table = s->d_bt;
    a->tok_req = s->d_treq;
    a->work = s->d_work;
    a->groups = s->d_groups;
    a->num_tokens = s->T;
    a->num_heads = s->H;
    a->mbpr = s->mbpr;
    a->block_size = s->bs;
    a->block_size_log2 = s->bs == 16 ? 4 : s->bs == 32 ? 5 : 6;
    a->causal = 1;
    a->fault = (int)s->cfg.fault;
    a->bf16 = s->bf16;
    a->fp8_cache = s->fp8;
    a->scale = (float)s->cfg.model.scale;
    a->scale_log2 = (float)(s->cfg.model.scale * 1.4426950408889634);
    a->scale_ref = s->cfg.model.scale;
    a->kv_scale = (float)s->cfg.kv_scale;
}

/* cuBLAS: the GEMM g describes, all of it 16-bit (ar_cublas_gemm has gemm_args' fields). */
static int cublas_gemm16(mla_state *s, const gemm_args &g)
{
    const ar_cublas_gemm c = {g.batch, g.M, g.N, g.K, g.A, g.a_b, g.a_m, g.a_k, g.B,
                              g.b_b, g.b_k, g.b_n, g.C, g.c_b, g.c_m, g.c_n, g.bf16};   /* field order */
    return ar_cublas_gemm_16(s->cublas_handle, &c);
}

/* One projection GEMM: through cuBLAS (the default where it loads) unless a planted fault
 * shifts its weights; a float operand or result (W_UV) is staged through the 16-bit buffers
 * mla_prepare sized (narrow_kernel / widen_kernel: the rounding the tensor-core kernel does on
 * the way in and out; dense [M][batch][K] and [M][batch][N]).  Else the tensor-core kernel (all
 * but AR_MLA_GEMM=simt) or the SIMT one. */
static cudaError_t run_gemm(mla_state *s, const gemm_args &g)
{
    const int64_t a_elems = (int64_t)g.M * g.batch * g.K, c_elems = (int64_t)g.M * g.batch * g.N;
    const bool staged_fit = (g.a_bits16 || (size_t)a_elems * 2 <= s->stage_a.cap) &&
                            (g.c_bits16 || (size_t)c_elems * 2 <= s->stage_c.cap);
    if (s->cublas_handle && g.b_shift == 0 && g.M > 0 && staged_fit) {
        gemm_args g16 = g;
        if (!g.a_bits16) {
            narrow_kernel<<<mla_grid(a_elems, 256), 256, 0, s->stream>>>((const float *)g.A, g.a_b, g.a_m, g.a_k,
                                                                       (uint16_t *)s->stage_a.ptr, g.batch, g.M, g.K,
                                                                       g.bf16);
            g16.A = s->stage_a.ptr;
            g16.a_b = g.K;
            g16.a_m = (int64_t)g.batch * g.K;
            g16.a_k = 1;
        }
        if (!g.c_bits16) {
            g16.C = s->stage_c.ptr;
            g16.c_b = g.N;
            g16.c_m = (int64_t)g.batch * g.N;
            g16.c_n = 1;
        }
        const int status = cublas_gemm16(s, g16);
        if (status == 0 && !g.c_bits16)
            widen_kernel<<<mla_grid(c_elems, 256), 256, 0, s->stream>>>((const uint16_t *)s->stage_c.ptr,
                                                                      (float *)g.C, g.c_b, g.c_m, g.c_n, g.batch,
                                                                      g.M, g.N, g.bf16);
        if (status == 0) return cudaGetLastError();
        if (status != -1) {
            fprintf(stderr, "cuda-mla backend: cublasGemmStridedBatchedEx (M %d, N %d, K %d, batch %d) returned "
                            "status %d\n", g.M, g.N, g.K, g.batch, status);
            return cudaErrorUnknown;
        }
    }
    return launch_gemm(g, s->gemm_tc, s->stream);
}

/* One projection GEMM whose M dimension is the step's tokens, on the decode requests' rows only
 * (s->dec_rows): A and C move by whole rows. */
static cudaError_t run_gemm_decode_rows(mla_state *s, const gemm_args &g)
{
    for (int i = 0; i < s->n_dec_ranges; i++) {
        const int t0 = s->dec_rows[2 * i], t1 = s->dec_rows[2 * i + 1];
        gemm_args part = g;
        part.M = t1 - t0;
        part.A = (const char *)g.A + (int64_t)t0 * g.a_m * (g.a_bits16 ? 2 : 4);
        part.C = (char *)g.C + (int64_t)t0 * g.c_m * (g.c_bits16 ? 2 : 4);
        cudaError_t e = run_gemm(s, part);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

/* The prefill path for this step's long requests (see the file comment). */
static cudaError_t run_prefill(mla_state *s, const attn_args &a, int layer)
{
    const int H = s->H, P = s->P, V = s->V, QK = P + DR, T = s->T;
    const int wrong_head = s->cfg.fault == AR_FAULT_WRONG_KV_HEAD ? 1 : 0;
    float *out = (float *)((char *)s->out.ptr + MLA_GUARD_BYTES);
    cudaError_t e;
    for (int p = 0; p < s->n_passes; p++) {
        int rows = s->pf.rows[p];
        const unsigned char *d = (const unsigned char *)s->meta.ptr;
        const int *row_req = (const int *)(d + s->pass_meta_off[4 * p + 0]);
        const int *row_pos = (const int *)(d + s->pass_meta_off[4 * p + 1]);
        const int *kb = (const int *)(d + s->pass_meta_off[4 * p + 2]);
        const int *ke = (const int *)(d + s->pass_meta_off[4 * p + 3]);
        if (rows > 0) {
            gather_latent_kernel<<<mla_grid((int64_t)rows * D, 256), 256, 0, s->stream>>>(
                (uint16_t *)s->ws_lat.ptr, rows, row_req, row_pos, a, (const uint16_t *)s->lat.ptr);
            /* k_nope[w, n, :] = c_w W_UK[n] ; v[w, n, :] = c_w W_UV[n] */
            gemm_args g = gemm_of(H, rows, P, DL, s->ws_lat.ptr, 1, 0, D, 1, s->w_uk[layer], (int64_t)DL * P, P, 1,
                                  wrong_head, s->ws_k.ptr, 1, QK, (int64_t)H * QK, 1, s->bf16);
            if ((e = run_gemm(s, g)) != cudaSuccess) return e;
            rope_key_kernel<<<mla_grid((int64_t)rows * H, 8), 256, 0, s->stream>>>(
                (uint16_t *)s->ws_k.ptr, (const uint16_t *)s->ws_lat.ptr, rows, H, P);
            if (s->cfg.fault == AR_FAULT_MLA_NO_WUV) {
                latent_as_value_kernel<<<mla_grid((int64_t)rows * H * V, 256), 256, 0, s->stream>>>(
                    (uint16_t *)s->ws_v.ptr, (const uint16_t *)s->ws_lat.ptr, rows, H, V);
            } else {
                g = gemm_of(H, rows, V, DL, s->ws_lat.ptr, 1, 0, D, 1, s->w_uv[layer], (int64_t)DL * V, V, 1, 0,
                            s->ws_v.ptr, 1, V, (int64_t)H * V, 1, s->bf16);
                if ((e = run_gemm(s, g)) != cudaSuccess) return e;
            }
        }
        if (s->prefill_attn == AR_MLA_PF_ATTN_PINGPONG) {
            /* one CTA a pair of query tiles and a head; a step of one pass writes its rows of out
             * and lse itself (no prefill_finish_kernel: 1 GB less traffic on an 8k-token step) */
            auto *kernel = s->bf16 ? prefill_attn_pingpong_kernel<true> : prefill_attn_pingpong_kernel<false>;
            const bool final_out = s->n_passes == 1;
            kernel<<<dim3((unsigned)s->n_pf_pairs, (unsigned)H), PP_THREADS, PP_SMEM, s->stream>>>(
                a, s->tmap_ws_k, s->tmap_ws_v, s->d_pf_tok, s->d_pf_tiles, s->d_pf_pairs, s->d_tpos,
                (const uint16_t *)s->qnope.ptr, row_pos, kb, ke, final_out ? out : (float *)s->pass_o.ptr,
                final_out ? a.lse : (float *)s->pass_lse.ptr, final_out ? 1 : 0);
        } else if (s->prefill_attn == AR_MLA_PF_ATTN_TC) {
            /* one CTA a query tile and head */
            auto *kernel = s->bf16 ? prefill_attn_tc_kernel<true> : prefill_attn_tc_kernel<false>;
            kernel<<<dim3((unsigned)s->n_pf_tiles, (unsigned)H), 128, PF_TC_SMEM, s->stream>>>(
                a, s->d_pf_tok, s->d_pf_tiles, s->d_tpos, (const uint16_t *)s->qnope.ptr, (const uint16_t *)s->ws_k.ptr,
                (const uint16_t *)s->ws_v.ptr, row_pos, kb, ke, (float *)s->pass_o.ptr, (float *)s->pass_lse.ptr);
        } else {
            prefill_attn_kernel<<<s->n_pf_tok * H, SIMT_THREADS, 0, s->stream>>>(
                a, s->d_pf_tok, s->d_tpos, (const uint16_t *)s->qnope.ptr, (const uint16_t *)s->ws_k.ptr,
                (const uint16_t *)s->ws_v.ptr, row_pos, kb, ke, P, V, (float *)s->pass_o.ptr,
                (float *)s->pass_lse.ptr);
        }
        if (s->n_passes == 1) break;   /* one pass (no context): it is the result, no merge */
        prefill_merge_kernel<<<mla_grid((int64_t)s->n_pf_tok * H, 8), 256, 0, s->stream>>>(
            a, s->d_pf_tok, s->n_pf_tok, V, (float *)s->acc_o.ptr, (float *)s->acc_lse.ptr,
            (const float *)s->pass_o.ptr, (const float *)s->pass_lse.ptr, p == 0);
        prefill_merge_lse_kernel<<<mla_grid((int64_t)s->n_pf_tok * H, 256), 256, 0, s->stream>>>(
            a, s->d_pf_tok, s->n_pf_tok, (float *)s->acc_lse.ptr, (const float *)s->pass_lse.ptr, p == 0);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    (void)T;
    const bool one = s->n_passes == 1;
    if (one && s->prefill_attn == AR_MLA_PF_ATTN_PINGPONG) return cudaGetLastError();   /* written by the kernel */
    prefill_finish_kernel<<<mla_grid((int64_t)s->n_pf_tok * H, 8), 256, 0, s->stream>>>(
        a, s->d_pf_tok, s->n_pf_tok, V, (const float *)(one ? s->pass_o.ptr : s->acc_o.ptr),
        (const float *)(one ? s->pass_lse.ptr : s->acc_lse.ptr), out, a.lse);
    return cudaGetLastError();
}

/* One pass: write, absorb, attention, combine, W_UV, prefill; with ev (MLA_PASS_EVENTS events;
 * NULL: untimed) events ev[0..6] around them. */
static cudaError_t run_pass(mla_state *s, const attn_args &a, const CUtensorMap *tmap, int layer, const cudaEvent_t *ev)
{
    const int H = s->H, P = s->P, V = s->V, T = s->T;
    const bool timed = ev != NULL;
    cudaError_t e;
    if (timed) cudaEventRecord(ev[0], s->stream);
    if (T > 0)
        write_latent_kernel<<<T, 128, 0, s->stream>>>((const uint16_t *)s->lat.ptr, s->d_slots, s->cache[layer], T,
                                                      s->cfg.dtype, s->cfg.kv_dtype, (float)s->cfg.kv_scale, 0);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if (timed) cudaEventRecord(ev[1], s->stream);
    bool any_dec = s->n_dec_reqs > 0 && T > s->n_pf_tok;
    if (any_dec) {
        /* absorption: ql[t, n, :] = q_nope[t, n, :] W_UK[n]^T -> columns 0..511 of the latent query */
        gemm_args g = gemm_of(H, T, DL, P, s->qnope.ptr, 1, P, (int64_t)H * P, 1, s->w_uk[layer], (int64_t)DL * P, 1, P,
                              s->cfg.fault == AR_FAULT_WRONG_KV_HEAD ? 1 : 0, s->qlat.ptr, 1, D, (int64_t)H * D, 1,
                              s->bf16);
        if ((e = run_gemm_decode_rows(s, g)) != cudaSuccess) return e;
    }
    if (timed) cudaEventRecord(ev[2], s->stream);
    if (any_dec) {
        e = mla_launch_decode(a, s->route, s->num_ctas, s->num_groups, T, tmap, s->stream, timed ? ev[3] : NULL);
        if (e != cudaSuccess) return e;
    } else if (timed) {
        cudaEventRecord(ev[3], s->stream);
    }
    if (timed) cudaEventRecord(ev[4], s->stream);
    float *out = (float *)((char *)s->out.ptr + MLA_GUARD_BYTES);
    if (any_dec) {
        if (s->cfg.fault == AR_FAULT_MLA_NO_WUV) {
            latent_as_output_kernel<<<mla_grid((int64_t)T * H * V, 256), 256, 0, s->stream>>>(
                (const float *)s->olat.ptr, out, T, H, V, s->bf16);
            if ((e = cudaGetLastError()) != cudaSuccess) return e;
        } else {
            /* out[t, n, :] = o_lat[t, n, :] W_UV[n] */
            gemm_args g = gemm_of(H, T, V, DL, s->olat.ptr, 0, DL, (int64_t)H * DL, 1, s->w_uv[layer], (int64_t)DL * V,
                                  V, 1, 0, out, 0, V, (int64_t)H * V, 1, s->bf16);
            if ((e = run_gemm_decode_rows(s, g)) != cudaSuccess) return e;
        }
    }
    if (timed) cudaEventRecord(ev[5], s->stream);
    if (s->n_pf_reqs > 0 && (e = run_prefill(s, a, layer)) != cudaSuccess) return e;
    if (timed) cudaEventRecord(ev[6], s->stream);
    return cudaSuccess;
}

static int ensure_weights(mla_state *s, int layer, char *err, size_t err_len)
{
    if (s->w_uk[layer]) return 0;
    const int H = s->H, P = s->P, V = s->V;
    int rc;
    if ((rc = mla_fail(cudaMalloc(&s->w_uk[layer], (size_t)H * DL * P * 2), "W_UK allocation", err, err_len)) ||
        (rc = mla_fail(cudaMalloc(&s->w_uv[layer], (size_t)H * DL * V * 2), "W_UV allocation", err, err_len))) {
        if (s->w_uk[layer]) cudaFree(s->w_uk[layer]);
        s->w_uk[layer] = NULL;
        s->w_uv[layer] = NULL;
        return rc;
    }
    const int rank = s->cfg.model.kv_lora_rank;
    gen_weight_kernel<<<mla_grid((int64_t)H * DL * P, 256), 256, 0, s->stream>>>(
        s->w_uk[layer], H, P, AR_STREAM_W_UK, s->cfg.seed, (uint32_t)layer, s->cfg.data, s->cfg.dtype, rank);
    gen_weight_kernel<<<mla_grid((int64_t)H * DL * V, 256), 256, 0, s->stream>>>(
        s->w_uv[layer], H, V, AR_STREAM_W_UV, s->cfg.seed, (uint32_t)layer, s->cfg.data, s->cfg.dtype, rank);
    return mla_fail(cudaGetLastError(), "weight generator", err, err_len);
}

static int mla_forward(void *state, int layer, const ar_batch *b, ar_forward_out *o, char *err, size_t err_len)
{
    mla_state *s = (mla_state *)state;
    (void)b;
    if (!s->step_ready) {
        snprintf(err, err_len, "cuda-mla backend: forward before a successful prepare");
        return 2;
    }
    if (layer < 0 || layer >= s->num_layers) {
        snprintf(err, err_len, "cuda-mla backend: forward: layer %d outside [0, %d)", layer, s->num_layers);
        return 2;
    }
    const int T = s->T, H = s->H, P = s->P, V = s->V;
    int rc;
    o->num_kernels = 0;
    o->total_us = 0;
    o->guard_violations = 0;
    if ((rc = ensure_weights(s, layer, err, err_len))) return rc;
    if (T > 0) {
        gen_q_kernel<<<mla_grid((int64_t)T * H * (P + DR), 256), 256, 0, s->stream>>>(
            (uint16_t *)s->qnope.ptr, (uint16_t *)s->qlat.ptr, T, H, P, s->cfg.seed, (uint32_t)layer, s->d_treq,
            s->d_tpos, s->d_rkeys, s->cfg.data, s->cfg.dtype);
        gen_latent_kernel<<<mla_grid((int64_t)T * D, 256), 256, 0, s->stream>>>(
            (uint16_t *)s->lat.ptr, T, s->cfg.seed, (uint32_t)layer, s->d_treq, s->d_tpos, s->d_bkeys, s->mbpr, s->bs,
            s->cfg.data, s->cfg.dtype);
        if ((rc = mla_fail(cudaGetLastError(), "generator kernels", err, err_len))) return rc;
    }
    if ((rc = mla_fail(cudaMemsetAsync((char *)s->out.ptr + MLA_GUARD_BYTES, 0xFF, s->out_bytes, s->stream), "poison", err, err_len)) ||
        (rc = mla_fail(cudaMemsetAsync((char *)s->lse.ptr + MLA_GUARD_BYTES, 0xFF, s->lse_bytes, s->stream), "poison", err, err_len)))
        return rc;
    attn_args a;
    fill_attn_args(s, layer, &a);
    bool use_tc = s->route.kind != AR_MLA_ROUTE_SIMT;
    /* the wgmma kernel: this layer's cache as a tensor map, else its cp.async key loads run
     * (said once on stderr); with an fp8 cache it stages its tiles by bulk copies instead */
    CUtensorMap tmap;
    const CUtensorMap *tmap_arg = NULL;
    if (s->route.tensor_map && !s->no_tensor_map) {
        char why[256] = "";
        static bool told = false;
        if (mla_wgmma_tensor_map(a, s->cache_bytes / (D * 2), &tmap, why, sizeof why) == 0)
            tmap_arg = &tmap;
        else if (!told) {
            fprintf(stderr, "%s: the wgmma kernel runs with cp.async key loads\n", why);
            told = true;
        }
    }
    int repeat = s->cfg.repeat > 0 ? s->cfg.repeat : 1;
    double *times = (double *)malloc(sizeof(double) * 7 * (size_t)repeat);
    if (!times) {
        snprintf(err, err_len, "cuda-mla backend: out of host memory");
        return 3;
    }
    /* one untimed warm-up: at the first forward and before every --repeat R > 1 series (the
     * paged backend's rule) */
    if ((!s->warmed || repeat > 1) &&
        (rc = mla_fail(run_pass(s, a, tmap_arg, layer, NULL), "MLA launch (warm-up)", err, err_len))) {
        free(times);
        return rc;
    }
    s->warmed = 1;
    const bool host_copy = o->out && o->lse;
    const size_t out_payload = (size_t)T * H * V * 4, lse_payload = (size_t)H * T * 4;
    if ((rc = mla_fail(ar_event_pool_reserve(&s->ev_pool, MLA_PASS_EVENTS * repeat), "event", err, err_len))) {
        free(times);
        return rc;
    }
    /* the repeats back to back, each on its own events (the paged backend's rule), then once
     * after the last: the guard regions checked on the device and, only when the engine asked
     * for them, host copies of out and LSE; one wait for all of it */
    for (int i = 0; i < repeat; i++)
        if ((rc = mla_fail(run_pass(s, a, tmap_arg, layer, s->ev_pool.ev + MLA_PASS_EVENTS * i), "MLA launch", err,
                           err_len))) {
            free(times);
            return rc;
        }
    const ar_cuda_outbufs ob = {s->out.ptr, s->lse.ptr, s->out_bytes, s->lse_bytes, MLA_GUARD_BYTES};
    if ((rc = mla_fail(ar_cuda_forward_tail(s->stream, &ob, s->d_guard, s->h_guard, host_copy ? s->h_out : NULL,
                                           out_payload, lse_payload, s->done_ev), "forward results", err, err_len)) ||
        (rc = mla_fail(cudaEventSynchronize(s->done_ev), "MLA kernels", err, err_len))) {
        free(times);
        return rc;
    }
    ar_event_pool_times(&s->ev_pool, repeat, MLA_PASS_EVENTS, 6, 6, times);
    static const char *const names[6] = {"write", "absorb", "attn", "combine", "wuv", "prefill"};
    bool present[6] = {true, s->n_dec_reqs > 0, s->n_dec_reqs > 0, s->n_dec_reqs > 0 && use_tc && s->num_groups > 0,
                       s->n_dec_reqs > 0, s->n_pf_reqs > 0};
    for (int k = 0; k < 6; k++) {
        double med = median_of(times + k * repeat, repeat);
        if (!present[k]) continue;
        o->kernels[o->num_kernels].name = names[k];
        o->kernels[o->num_kernels].us = med;
        o->num_kernels++;
    }
    o->total_us = median_of(times + 6 * repeat, repeat);
    free(times);
    o->num_paths = 0;
    if (s->n_dec_reqs > 0 && T > s->n_pf_tok)
        ar_forward_add_path(o, ar_mla_route_path(&s->route, ar_mla_wgmma_cpasync(&s->route, a.block_size, tmap_arg != NULL), present[3]));
    if (s->n_pf_reqs > 0) ar_forward_add_path(o, "mla-prefill:new");
    if (s->n_pf_reqs > 0 && s->info.num_context_chunks > 0) ar_forward_add_path(o, "mla-prefill:context");
    if (s->n_pf_reqs > 0 && s->prefill_attn == AR_MLA_PF_ATTN_TC) ar_forward_add_path(o, "mla-prefill-attn:tc");
    if (s->n_pf_reqs > 0 && s->prefill_attn == AR_MLA_PF_ATTN_PINGPONG)
        ar_forward_add_path(o, "mla-prefill-attn:pingpong");
    if (s->fp8) ar_forward_add_path(o, "kv-fp8");

    o->dev_out = (const char *)s->out.ptr + MLA_GUARD_BYTES;
    o->dev_out_type = AR_FP32;   /* float values rounded to the dtype */
    o->dev_lse = (const float *)((const char *)s->lse.ptr + MLA_GUARD_BYTES);
    o->dev_stream = s->stream;
    int bad = *s->h_guard;
    o->guard_violations = bad;
    if (bad) {   /* re-stamp for the next forward */
        const ar_cuda_outbufs ob = {s->out.ptr, s->lse.ptr, s->out_bytes, s->lse_bytes, MLA_GUARD_BYTES};
        ar_cuda_restamp_guards(s->stream, &ob);
    }
    if (host_copy) {
        memcpy(o->out, s->h_out, out_payload);
        memcpy(o->lse, (const unsigned char *)s->h_out + out_payload, lse_payload);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Hooks and the descriptor                                                                   */

extern "C" void ar_cuda_mla_set_plan(void *state, ar_cuda_mla_kernel kernel, int num_splits, int use_prefill_path)
{
    mla_state *s = (mla_state *)state;
    if (!s) return;
    s->force_kernel = kernel;
    s->force_splits = num_splits;
    s->use_prefill = use_prefill_path ? 1 : 0;
}

extern "C" void ar_cuda_mla_set_workspace(void *state, int tokens)
{
    mla_state *s = (mla_state *)state;
    if (s) s->workspace_tokens = tokens < 16 ? 16 : tokens;
}

extern "C" void ar_cuda_mla_plan_of(void *state, ar_cuda_mla_plan_info *info)
{
    mla_state *s = (mla_state *)state;
    memset(info, 0, sizeof *info);
    if (s) {
        *info = s->info;
        info->gemm_tc = s->gemm_tc;
        info->gemm_cublas = s->cublas_handle != NULL;
        info->prefill_attn = s->n_pf_reqs > 0 ? s->prefill_attn : AR_MLA_PF_ATTN_NONE;
        info->decode_row_runs = s->n_dec_ranges;
        info->decode_rows_span = s->dec_rows_hold_prefill;
    }
}

extern "C" const ar_backend ar_cuda_mla_backend = {
    "cuda-mla",
    "CUDA MLA: absorbed latent decode (mma.sync, or wgmma on sm_90; 64-row head tiles, split-KV + combine), chunked "
    "up-projected prefill merged by LSE",
    "MLA models (kv_lora_rank 512, rope 64), fp16/bf16, latent cache = dtype or fp8_e4m3 (per-tensor "
    "scale), block sizes 16/32/64, decode threshold 128; sm_80+",
    true,
    mla_check,
    mla_open,
    mla_prepare,
    mla_fill,
    mla_forward,
    mla_device_name,
    mla_close,
};
