/* ref_gpu.cu - the device twin of the float64 reference and of the naive yardstick, and the
 * device half of verification (see ref_gpu.h for what it computes and why).
 *
 * Deliberately plain CUDA, sharing nothing with kernels/: one tiled GEMM template for every
 * product, the fused MHA kernels below, a flash-style kernel for the MHA reference of long
 * prefills checked row by row, and warp-per-row kernels for everything else, on the SIMT units
 * except the MHA reference's 64 x 64 GEMM tiles and the flash kernel, whose products run on the
 * FP64 tensor cores (mma.sync m8n8k4: float64 products and sums, four keys per instruction).
 * Per step-layer:
 *
 *   1. the host plans (ref_gpu_plan.c): items (request, rows, key chunk) in groups that fit the
 *      scratch, and the block-cache slots of every block an item reads; one upload of that plan.
 *      MHA (unless ATTNREPLAY_GPU_REF_FUSED=0) plans once per step (step-shared slots: a slot
 *      holds a block for every layer of the run; the plan is reused while batch and rows are the
 *      same, checked word by word against the inputs it was made from);
 *   2. Q of the checked rows from the generator (MLA: q_nope, q_pe and the yardstick's latent
 *      query ql = round(W_UK q_nope) | q_pe);
 *   3. per group: the blocks the cache misses are generated (MHA: K and V after the KV round
 *      trip, with step-shared slots every distinct slot of the group is visited and the layer
 *      made unless the device's record says the slot holds it for this content; MLA: the latent,
 *      then k_nope = c W_UK and v = c W_UV in float64); then
 *        reference:  S = scale q.k (float64, soft cap)  -> softmax rows (max, exp, sum)
 *                    -> O = P.V (float64) -> fold the chunk into the row's running result
 *                    (ar_ref_merge's rule; the first chunk is copied);
 *        yardstick:  MHA - float products, each score rounded to the dtype (soft cap as three
 *                    rounded ops), softmax in float with P rounded to the dtype (fp8: also
 *                    through fp8), P.V in float rounded; MLA - float64 sums, P rounded, the
 *                    latent output rounded, then W_UV, rounded; folded in float64;
 *      MHA by default takes the fused path instead of the four products for the requests of at
 *      most FUSED_MAX_ROWS checked rows (decodes, sampled rows): their rows are cut into problems
 *      of at most SK_MAXM vectors (a few rows x the query heads of one KV head: GQA grouped), and
 *      one kernel makes both twins' scores in one read of K, the softmax kernels only their
 *      statistics, one kernel both P.V products in one read of V (one CTA per problem and
 *      key split of PV_SPLIT keys, keys ascending, P made on the fly; the splits added in order).
 *      Each product is summed in exactly the SIMT GEMM template's order with its roundings (the
 *      template folds its P.V sums at the same key splits), so the yardstick is bit-identical to
 *      it and the reference too, except against the tensor-core tiles (last bits; tests/
 *      gpu_verify.c checks both).  A request of more checked rows (a prefill chunk checked row
 *      by row) takes the GEMM template in the same group, reading the same step-shared slots (its
 *      dense rows fill 64 x 64 tiles); there the reference comes from flash_ref_kernel instead
 *      (head sizes multiples of 8 up to 128; ATTNREPLAY_GPU_REF_FLASH=0 at open: the GEMM
 *      template's products): S, the online softmax and P.V for 64 vectors per CTA in one pass
 *      over the keys, no scores in memory, its sums in another order (the reference's last
 *      bits; tests/gpu_verify.c), the yardstick still on the GEMM template.
 *      ATTNREPLAY_GPU_REF_FUSED at open: 0 selects the GEMM template for every row with per-layer
 *      planning (as do query groups wider than SK_MAXM and value widths above 2 x PV_THREADS),
 *      1 the fused path for every row (both for A/B measurements);
 *   4. the comparison with the backend's output (replay/verify.c's compare_rows, element by
 *      element, with per-block partial sums and worst lists reduced in a fixed order), the
 *      NaN/Inf count over the whole output, one copy of the summary back, one wait.
 *
 * The GEMM template: C[m][n] = sum_k A(m, k) B(k, n) over a list of problems (each CTA finds its
 * problem by binary search over per-problem m-tile counts; blockIdx.y is the n-tile).  A is read
 * through row handles (base offset, visible key range [lo, hi)) made once per tile; B either
 * per column n (keys of a score product: contiguous in k) or per row k (values of a P.V
 * product: contiguous in n).  Tiles no checked row can see are skipped (score products) or
 * their key range is cut to what the tile's rows see (P.V products).  Two tile shapes: 64 x 64
 * (4 x 4 per thread) for problems of more than 8 rows, 8 rows x 256 / 128 columns (8 x 2 /
 * 8 x 1 per thread) for decode-like problems of a few rows.
 *
 * The kernels are in ref_gpu_kernels.cuh (step data, operands, the GEMM template, per-vector,
 * generator and comparison kernels) and ref_gpu_attn.cuh (the fused path and the flash
 * reference), included below; this file is the host side: the buffers, the block cache, the
 * plan's upload and the launches of each check. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <type_traits>

#include "ref_gpu.h"
#include "ref_gpu_plan.h"
#include "datagen.h"
#include "dtype.h"
#include "mla_ref.h"
extern "C" {
#include "../replay/verify.h"
}

#include "ref_gpu_kernels.cuh"
#include "ref_gpu_attn.cuh"

using namespace argpu;

/* ---- host side ------------------------------------------------------------------------------ */

typedef struct dbuf {
    void *ptr;
    size_t cap;
} dbuf;

/* Host view of one group's problem lists inside the arena. */
typedef struct glists {
    size_t all, small, big, psmall, pbig;   /* arena offsets */
    int n_all, n_small, n_big, t_small, t_big, max_n;
    /* the fused path's problems: [0] M <= 4, [1] M <= 8, [2] M <= SK_MAXM, with key-tile prefix
     * arrays (scores) and P.V key-split prefix arrays */
    size_t fz[SK_BUCKETS], pfz[SK_BUCKETS], sfz[SK_BUCKETS];
    int n_fz[SK_BUCKETS], t_fz[SK_BUCKETS], s_fz[SK_BUCKETS];
} glists;

typedef struct hgroup {
    glists ref, nv;           /* MHA: the same lists for both (nv unused); MLA: (item, h) and (item) */
    int u0, nu;               /* step-shared slots: the group's distinct slots [u0, u0 + nu) */
    size_t up, pup;           /* MLA: the up-projection problem */
    int t_up;
    long long nvec_ref, nvec_nv;
} hgroup;

/* What a check's plan left in the pinned arena (uploaded to g->arena) and the host needs. */
typedef struct saved_plan {
    bool valid;               /* the device arena holds this plan and the last check succeeded */
    size_t o_reqs, o_rows, o_items, o_map, o_mslot, o_mkey, o_uslot, o_ukey, arena_bytes;
    int64_t max_scores, max_vec;
    int64_t max_pv_part;      /* fused P.V partial sums of a bucket of several splits: split tiles x MB */
    int rows_fused;           /* checked rows on the fused path */
    glists qlists;
    hgroup *hg;               /* [plan.num_groups] */
} saved_plan;

struct ar_gpu_ref {
    ar_run_config cfg;
    bool mla;
    int hq, hkv, group, D, Dv, bs;
    int H, L, R, P, V;
    int num_sms;
    ar_dtype pool_type;
    bool fused;               /* MHA: the fused kernels and step-shared slots (default; ATTNREPLAY_GPU_REF_FUSED=0:
                                 the GEMM template only, per-layer slots) */
    int fused_rows;           /* checked rows per fused problem: SK_MAXM / group */
    bool flash;               /* with fused: the GEMM template's problems get their reference from
                                 flash_ref_kernel (head sizes multiples of 8 up to FR_DMAX;
                                 ATTNREPLAY_GPU_REF_FLASH=0: the GEMM template's products) */
    int fused_max_rows;       /* with fused: a request of more checked rows takes the GEMM template
                                 (FUSED_MAX_ROWS; ATTNREPLAY_GPU_REF_FUSED=1: INT_MAX, none does) */
    cudaStream_t stream;
    cudaEvent_t ev_in, ev_group[2];
    bool profile;
    cudaEvent_t ev_prof[4];
    ar_block_cache *cache;
    int capacity;
    size_t entry_bytes;
    void *pool_kv;
    double *pool_kn, *pool_v;
    float *pool_lat;
    int64_t max_scores, max_vectors;
    dbuf arena, q, ql, acc, S, O, olat, onv, stat, parts, sum, w, Snv, Onv, statnv, mxnv, pvpart;
    int w_layer;
    void *h_arena;
    size_t h_arena_cap;
    void *h_sum;
    ar_ref_plan plan;
    uint64_t stamp;
    ar_gpu_ref_stats stats;
    /* step-shared slots (MHA with fused): a slot holds one block for each of the run's
     * slot_layers layers, the device knows per slot the content key it holds and which layers are
     * made (dev_content [slots], dev_mask [slots][mask_words]); the plan of a step is made at its
     * first check and reused by its other layers while batch and rows are the same (sig) */
    bool step_slots;
    int slot_layers, mask_words;
    unsigned long long *dev_content, *dev_mask;
    int *seen;                /* [capacity] the group that last listed a slot (planning) */
    int seen_serial;
    uint64_t *sig, *sig_new;
    size_t sig_len, sig_cap, sig_new_len, sig_new_cap;
    struct saved_plan sp;
};

static int fail(cudaError_t e, const char *what, char *err, size_t err_len)
{
    if (e == cudaSuccess) return 0;
    snprintf(err, err_len, "device reference: %s: %s", what, cudaGetErrorString(e));
    return -1;
}

static int ensure(dbuf *b, size_t need, const char *what, char *err, size_t err_len)
{
    if (need <= b->cap) return 0;
    if (b->ptr) cudaFree(b->ptr);
    b->ptr = NULL;
    b->cap = 0;
    size_t cap = (need + need / 4 + 4095) / 4096 * 4096;
    cudaError_t e = cudaMalloc(&b->ptr, cap);
    if (e != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, err_len, "device reference: %s: cannot allocate %.2f GiB of device memory (%s)", what,
                 cap / 1073741824.0, cudaGetErrorString(e));
        return -1;
    }
    b->cap = cap;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int grid_for(long long n, int threads)
{
    long long b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535LL * 16) b = 65535LL * 16;
    return (int)b;
}

extern "C" bool ar_gpu_ref_available(char *why, size_t why_len)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(why, why_len, "no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
        cudaGetLastError();
        return false;
    }
    snprintf(why, why_len, "CUDA device present");
    return true;
}

extern "C" void ar_gpu_ref_close(ar_gpu_ref *g)
{
    if (!g) return;
    if (g->stream) cudaStreamSynchronize(g->stream);
    dbuf *bufs[] = {&g->arena, &g->q, &g->ql, &g->acc, &g->S, &g->O, &g->olat, &g->onv, &g->stat, &g->parts,
                    &g->sum, &g->w, &g->Snv, &g->Onv, &g->statnv, &g->mxnv, &g->pvpart};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]->ptr) cudaFree(bufs[i]->ptr);
    if (g->pool_kv) cudaFree(g->pool_kv);
    if (g->pool_kn) cudaFree(g->pool_kn);
    if (g->pool_v) cudaFree(g->pool_v);
    if (g->pool_lat) cudaFree(g->pool_lat);
    if (g->dev_content) cudaFree(g->dev_content);
    if (g->dev_mask) cudaFree(g->dev_mask);
    free(g->seen);
    free(g->sig);
    free(g->sig_new);
    free(g->sp.hg);
    if (g->h_arena) cudaFreeHost(g->h_arena);
    if (g->h_sum) cudaFreeHost(g->h_sum);
    if (g->ev_in) cudaEventDestroy(g->ev_in);
    for (int i = 0; i < 4; i++)
        if (g->ev_prof[i]) cudaEventDestroy(g->ev_prof[i]);
    for (int i = 0; i < 2; i++)
        if (g->ev_group[i]) cudaEventDestroy(g->ev_group[i]);
    if (g->stream) cudaStreamDestroy(g->stream);
    ar_block_cache_free(g->cache);
    ar_ref_plan_free(&g->plan);
    free(g);
}

extern "C" int ar_gpu_ref_open(ar_gpu_ref **out, const ar_run_config *cfg, size_t mem_budget, char *err,
                               size_t err_len)
{
    *out = NULL;
    char why[256];
    if (!ar_gpu_ref_available(why, sizeof why)) {
        snprintf(err, err_len, "device reference: %s", why);
        return -1;
    }
    const ar_model *m = &cfg->model;
    ar_gpu_ref *g = (ar_gpu_ref *)calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, err_len, "device reference: out of host memory");
        return -1;
    }
    g->cfg = *cfg;
    g->mla = m->attention == AR_ATTN_MLA;
    g->bs = cfg->block_size;
    g->w_layer = -1;
    if (g->mla) {
        g->H = g->hq = m->num_q_heads;
        g->hkv = 1;
        g->group = g->hq;
        g->L = m->kv_lora_rank;
        g->R = m->qk_rope_head_dim;
        g->P = m->qk_nope_head_dim;
        g->V = g->Dv = m->v_head_dim;
        g->D = g->P + g->R;
        if (g->H <= 0 || g->L <= 0 || g->R < 0 || g->P <= 0 || g->V <= 0 || m->head_size != g->L + g->R) {
            snprintf(err, err_len, "device reference: MLA dims heads %d, kv_lora_rank %d, rope %d, nope %d, v %d, "
                     "head_size %d are not consistent", g->H, g->L, g->R, g->P, g->V, m->head_size);
            free(g);
            return -1;
        }
    } else {
        g->hq = m->num_q_heads;
        g->hkv = m->num_kv_heads;
        g->D = m->head_size;
        g->Dv = m->v_head_dim > 0 ? m->v_head_dim : m->head_size;
        if (g->hq <= 0 || g->hkv <= 0 || g->hq % g->hkv != 0 || g->D <= 0 || g->Dv != g->D) {
            snprintf(err, err_len, "device reference: heads %d / %d, head size %d, v dim %d not supported",
                     g->hq, g->hkv, g->D, g->Dv);
            free(g);
            return -1;
        }
        g->group = g->hq / g->hkv;
    }
    if (g->bs <= 0 || cfg->dtype == AR_DTYPE_COUNT) {
        snprintf(err, err_len, "device reference: block size %d not supported", g->bs);
        free(g);
        return -1;
    }
    g->pool_type = (cfg->kv_dtype == cfg->dtype && (cfg->dtype == AR_BF16 || cfg->dtype == AR_FP16)) ? cfg->dtype : AR_FP32;
    int dev = 0;
    cudaDeviceProp prop;
    if (fail(cudaSetDevice(cfg->device_index), "cudaSetDevice", err, err_len) ||   /* the backend's device */
        fail(cudaGetDevice(&dev), "cudaGetDevice", err, err_len) ||
        fail(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties", err, err_len) ||
        fail(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking), "stream", err, err_len) ||
        fail(cudaEventCreateWithFlags(&g->ev_in, cudaEventDisableTiming), "event", err, err_len) ||
        fail(cudaEventCreateWithFlags(&g->ev_group[0], cudaEventDisableTiming), "event", err, err_len) ||
        fail(cudaEventCreateWithFlags(&g->ev_group[1], cudaEventDisableTiming), "event", err, err_len) ||
        fail(cudaMallocHost(&g->h_sum, sizeof(dsum)), "pinned summary", err, err_len)) {
        ar_gpu_ref_close(g);
        return -1;
    }
    g->num_sms = prop.multiProcessorCount;
    const char *fz = getenv("ATTNREPLAY_GPU_REF_FUSED");
    g->fused = !g->mla && !(fz && strcmp(fz, "0") == 0) && g->group <= SK_MAXM && g->Dv <= 2 * PV_THREADS;
    g->fused_rows = g->fused ? SK_MAXM / g->group : 0;
    g->fused_max_rows = fz && strcmp(fz, "1") == 0 ? INT_MAX : FUSED_MAX_ROWS;
    const char *fl = getenv("ATTNREPLAY_GPU_REF_FLASH");
    g->flash = g->fused && !(fl && strcmp(fl, "0") == 0) && g->D % 8 == 0 && g->Dv % 8 == 0 && g->D <= FR_DMAX &&
               g->Dv <= FR_DMAX;
    if (g->flash && fail(cudaFuncSetAttribute(flash_ref_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              (int)sizeof(fr_smem)),
                         "flash reference shared memory", err, err_len)) {
        ar_gpu_ref_close(g);
        return -1;
    }
    g->step_slots = g->fused;
    g->slot_layers = g->step_slots && cfg->num_layers > 1 ? cfg->num_layers : 1;
    g->mask_words = (g->slot_layers + 63) / 64;
    const char *prof = getenv("ATTNREPLAY_GPU_REF_PROFILE");
    g->profile = prof && strcmp(prof, "1") == 0;
    for (int i = 0; g->profile && i < 4; i++)
        if (fail(cudaEventCreate(&g->ev_prof[i]), "event", err, err_len)) {
            ar_gpu_ref_close(g);
            return -1;
        }
    /* memory: the backend's caches are allocated by now; of what is free the reference takes all
     * but a reserve (3 GiB and 1/32 of it: the backend's grow-only step buffers, which grow with
     * the first large steps, and the driver), the block cache first (below), the rest for the
     * scratch of one group */
    if (g->mla)
        g->entry_bytes = (size_t)g->bs * g->H * (g->P + g->V) * 8 + (size_t)g->bs * (g->L + g->R) * 4;
    else
        g->entry_bytes = (size_t)2 * g->bs * g->hkv * g->D * ar_dtype_size(g->pool_type) * g->slot_layers;
    const int min_slots = AR_VERIFY_KEY_CHUNK / g->bs + 2;
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    const size_t reserve = ((size_t)3 << 30) + free_b / 32;
    size_t budget = mem_budget ? mem_budget : free_b > 2 * reserve ? free_b - reserve : free_b / 2;
    if (mem_budget == AR_GPU_REF_LEAST)   /* the cache's least and a small scratch (over its floor) */
        budget = (size_t)min_slots * g->entry_bytes * 4 / 3 + ((size_t)1 << 30) + ((size_t)64 << 20);
    /* the block cache's share: half; with step-shared slots all but a scratch floor (1/32 of the
     * budget, at least 1 GiB, at most a quarter): a run of many layers needs a slot per block for
     * all of them, or every layer of a step makes its blocks again once a step's blocks outgrow
     * the cache (llama-3.1-8b at 32 layers: 2 MiB a slot, a Mooncake step reads up to 32k blocks),
     * while the sampled checks such runs make need little scratch; a run whose blocks all fit
     * leaves the rest to the scratch */
    size_t floor_b = budget / 32 > ((size_t)1 << 30) ? budget / 32 : ((size_t)1 << 30);
    if (floor_b > budget / 4) floor_b = budget / 4;
    int64_t slots = (int64_t)((g->step_slots ? budget - floor_b : budget / 2) / g->entry_bytes);
    int64_t enough = (int64_t)cfg->num_blocks * (cfg->num_layers > 0 && !g->step_slots ? cfg->num_layers : 1) + min_slots;
    if (slots > enough) slots = enough;
    if (slots > INT_MAX / 2) slots = INT_MAX / 2;
    if (slots < min_slots) {
        snprintf(err, err_len, "device reference: needs at least %.2f GiB of device memory for its block cache "
                 "(%d blocks of %.1f KiB), has a budget of %.2f GiB", min_slots * (double)g->entry_bytes / 1073741824.0,
                 min_slots, g->entry_bytes / 1024.0, budget / 1073741824.0);
        ar_gpu_ref_close(g);
        return -1;
    }
    g->capacity = (int)slots;
    cudaError_t e = cudaSuccess;
    if (g->mla) {
        e = cudaMalloc((void **)&g->pool_kn, (size_t)slots * g->bs * g->H * g->P * 8);
        if (e == cudaSuccess) e = cudaMalloc((void **)&g->pool_v, (size_t)slots * g->bs * g->H * g->V * 8);
        if (e == cudaSuccess) e = cudaMalloc((void **)&g->pool_lat, (size_t)slots * g->bs * (g->L + g->R) * 4);
    } else {
        e = cudaMalloc(&g->pool_kv, (size_t)slots * g->entry_bytes);
    }
    if (e == cudaSuccess && g->step_slots) {
        e = cudaMalloc((void **)&g->dev_content, (size_t)slots * 8);
        if (e == cudaSuccess) e = cudaMalloc((void **)&g->dev_mask, (size_t)slots * g->mask_words * 8);
        if (e == cudaSuccess) e = cudaMemset(g->dev_content, 0, (size_t)slots * 8);
        if (e == cudaSuccess) e = cudaMemset(g->dev_mask, 0, (size_t)slots * g->mask_words * 8);   /* nothing made */
        g->seen = (int *)calloc((size_t)slots, sizeof(int));
    }
    g->cache = ar_block_cache_new(g->capacity);
    if (fail(e, "block cache allocation", err, err_len) || !g->cache || (g->step_slots && !g->seen)) {
        if (e == cudaSuccess) snprintf(err, err_len, "device reference: out of host memory");
        ar_gpu_ref_close(g);
        return -1;
    }
    size_t scratch = budget - (size_t)slots * g->entry_bytes;
    if (scratch < ((size_t)64 << 20)) scratch = (size_t)64 << 20;
    /* MHA: the yardstick's scores and outputs have their own float buffers (the fused path needs
     * both twins at once; the GEMM path aliases them, the budget is the same for both) */
    size_t per_vector = g->mla ? (size_t)g->V * 8 + (size_t)g->L * 4 + (size_t)g->V * 4 + 16 : (size_t)g->Dv * 12 + 36;
    g->max_scores = (int64_t)(scratch * 3 / 4 / (g->mla ? 8 : 12));
    g->max_vectors = (int64_t)(scratch / 4 / per_vector);
    g->stats.cache_slots = g->capacity;
    g->stats.cache_gib = (double)slots * g->entry_bytes / 1073741824.0;
    g->stats.scratch_gib = (double)scratch / 1073741824.0;
    *out = g;
    return 0;
}

extern "C" int ar_gpu_ref_test_write(void *dst, const void *src, size_t bytes)
{
    return cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? 0 : -1;
}

extern "C" void ar_gpu_ref_get_stats(const ar_gpu_ref *g, ar_gpu_ref_stats *st)
{
    memset(st, 0, sizeof *st);
    if (g) *st = g->stats;
}

/* The pinned arena: a byte offset per array, 16-byte aligned. */
static size_t take(size_t *off, size_t bytes)
{
    size_t at = *off;
    *off += (bytes + 15) / 16 * 16;
    return at;
}


/* Arena bytes split_lists takes for n problems (the sizing of the pinned arena). */
static size_t lists_bytes(size_t n)
{
    return (3 + SK_BUCKETS) * (sizeof(gprob) * (n + 1) + 16) + (2 + 2 * SK_BUCKETS) * (sizeof(int) * (n + 1) + 16);
}

/* Splits the problems [n] (already in the arena at list->all) into small (M <= 8) and big lists
 * with their m-tile prefix arrays; with fused, problems of at most SK_MAXM vectors go to the
 * fused lists instead (by M: up to 4, 8, SK_MAXM) with their key-tile and key-split prefix
 * arrays. */
static void split_lists(unsigned char *h, glists *ls, const gprob *probs, int n, size_t *off, bool fused)
{
    ls->n_all = n;
    ls->small = take(off, sizeof(gprob) * (size_t)(n > 0 ? n : 1));
    ls->big = take(off, sizeof(gprob) * (size_t)(n > 0 ? n : 1));
    ls->psmall = take(off, sizeof(int) * (size_t)(n + 1));
    ls->pbig = take(off, sizeof(int) * (size_t)(n + 1));
    gprob *sm = (gprob *)(h + ls->small), *bg = (gprob *)(h + ls->big);
    int *ps = (int *)(h + ls->psmall), *pb = (int *)(h + ls->pbig);
    gprob *fz[SK_BUCKETS];
    int *pfz[SK_BUCKETS], *sfz[SK_BUCKETS];
    for (int k = 0; k < SK_BUCKETS; k++) {
        ls->fz[k] = take(off, sizeof(gprob) * (size_t)(n > 0 ? n : 1));
        ls->pfz[k] = take(off, sizeof(int) * (size_t)(n + 1));
        ls->sfz[k] = take(off, sizeof(int) * (size_t)(n + 1));
        fz[k] = (gprob *)(h + ls->fz[k]);
        pfz[k] = (int *)(h + ls->pfz[k]);
        sfz[k] = (int *)(h + ls->sfz[k]);
        ls->n_fz[k] = ls->t_fz[k] = ls->s_fz[k] = 0;
    }
    ls->n_small = ls->n_big = ls->t_small = ls->t_big = ls->max_n = 0;
    for (int i = 0; i < n; i++) {
        const gprob *p = &probs[i];
        if (p->N > ls->max_n) ls->max_n = p->N;
        if (fused && fused_sized(p->M)) {
            const int k = p->M <= 4 ? 0 : p->M <= 8 ? 1 : 2;
            pfz[k][ls->n_fz[k]] = ls->t_fz[k];
            sfz[k][ls->n_fz[k]] = ls->s_fz[k];
            fz[k][ls->n_fz[k]++] = *p;
            const int tile = sk_tile(k == 0 ? 4 : k == 1 ? 8 : SK_MAXM);   /* bucket_rows[k] */
            ls->t_fz[k] += (p->N + tile - 1) / tile;
            ls->s_fz[k] += pv_splits(p->N);
        } else if (p->M <= 8) {
            ps[ls->n_small] = ls->t_small;
            sm[ls->n_small++] = *p;
            ls->t_small += (p->M + 7) / 8;
        } else {
            pb[ls->n_big] = ls->t_big;
            bg[ls->n_big++] = *p;
            ls->t_big += (p->M + 63) / 64;
        }
    }
    ps[ls->n_small] = ls->t_small;
    pb[ls->n_big] = ls->t_big;
    for (int k = 0; k < SK_BUCKETS; k++) {
        pfz[k][ls->n_fz[k]] = ls->t_fz[k];
        sfz[k][ls->n_fz[k]] = ls->s_fz[k];
    }
}

/* MB of each fused bucket: split_lists sorts problems into them, launch_fused instantiates them */
static const int bucket_rows[SK_BUCKETS] = {4, 8, SK_MAXM};
static_assert(SK_BUCKETS == 3 && SK_MAXM == 16, "bucket_rows, split_lists and launch_fused list the buckets");

/* Partial-sum vectors the fused P.V of a group's buckets needs at once (the buckets run in turn
 * on one stream and share the buffer): split tiles x MB of the largest bucket with several splits. */
static int64_t pv_part_vectors(const glists *ls)
{
    int64_t most = 0;
    for (int k = 0; k < SK_BUCKETS; k++)
        if (ls->s_fz[k] > ls->n_fz[k] && (int64_t)ls->s_fz[k] * bucket_rows[k] > most)
            most = (int64_t)ls->s_fz[k] * bucket_rows[k];
    return most;
}

/* The fused path over a group's lists: both twins' scores (before the softmaxes) or both P.V
 * products (after them). */
template <int MB, int DT>
static void launch_fused_bucket(const gctx &c, const glists &ls, int k, bool scores, const unsigned char *d,
                                cudaStream_t st)
{
    if (ls.n_fz[k] <= 0) return;
    if (scores && ls.t_fz[k] > 0)
        fused_scores_kernel<MB, DT><<<(unsigned)ls.t_fz[k], SK_KEYS, 0, st>>>(
            c, (const gprob *)(d + ls.fz[k]), (const int *)(d + ls.pfz[k]), ls.n_fz[k]);
    if (!scores) {
        const gprob *probs = (const gprob *)(d + ls.fz[k]);
        const int *sprefix = (const int *)(d + ls.sfz[k]);
        const size_t vs_bytes = (size_t)PV_KT * pv_vs_stride(c.Dv) * sizeof(float);
        fused_pv_kernel<MB, DT><<<(unsigned)ls.s_fz[k], PV_THREADS, vs_bytes, st>>>(c, probs, sprefix, ls.n_fz[k]);
        if (ls.s_fz[k] > ls.n_fz[k])   /* some problem has several splits */
            fused_pv_combine_kernel<MB><<<(unsigned)ls.n_fz[k], PV_THREADS, 0, st>>>(c, probs, sprefix, ls.n_fz[k]);
    }
}

/* bf16 runs (pool, queries and yardstick in bf16) of value widths up to PV_THREADS on kernels with
 * the dtype compiled in; any other on the generic ones */
template <int DT>
static void launch_fused_dt(const gctx &c, const glists &ls, bool scores, const unsigned char *d, cudaStream_t st)
{
    launch_fused_bucket<4, DT>(c, ls, 0, scores, d, st);
    launch_fused_bucket<8, DT>(c, ls, 1, scores, d, st);
    launch_fused_bucket<SK_MAXM, DT>(c, ls, 2, scores, d, st);
}

static void launch_fused(const gctx &c, const glists &ls, bool scores, const unsigned char *d, cudaStream_t st)
{
    if (c.pool_type == AR_BF16 && c.cd == AR_BF16 && c.dtype == AR_BF16 && c.Dv <= PV_THREADS)
        launch_fused_dt<AR_BF16>(c, ls, scores, d, st);
    else
        launch_fused_dt<DT_ANY>(c, ls, scores, d, st);
}

/* Launches one product over a group's lists: small problems on 8-row tiles, the rest on 64 x 64. */
template <typename T, int KIND, bool B_PER_K>
static void launch_product(const gctx &c, const glists &ls, const unsigned char *d, int N_hint, cudaStream_t st)
{
    constexpr int SBN = B_PER_K ? 128 : 256, STN = B_PER_K ? 1 : 2;
    const int n = N_hint > 0 ? N_hint : ls.max_n;
    if (ls.n_small > 0 && ls.t_small > 0) {
        dim3 grid((unsigned)ls.t_small, (unsigned)((n + SBN - 1) / SBN));
        gemm_kernel<T, KIND, 8, SBN, 16, 8, STN, B_PER_K><<<grid, (SBN / STN), 0, st>>>(
            c, (const gprob *)(d + ls.small), (const int *)(d + ls.psmall), ls.n_small);
    }
    if (ls.n_big > 0 && ls.t_big > 0) {
        /* the MHA reference's products on the FP64 tensor cores (see the file's comment) */
        constexpr bool TC = KIND == K_MHA_S_REF || KIND == K_MHA_PV_REF;
        dim3 grid((unsigned)ls.t_big, (unsigned)((n + 63) / 64));
        gemm_kernel<T, KIND, 64, 64, 16, 4, 4, B_PER_K, TC><<<grid, 256, 0, st>>>(
            c, (const gprob *)(d + ls.big), (const int *)(d + ls.pbig), ls.n_big);
    }
}

template <int KIND, int MODE, bool FUSED = false>
static void launch_softmax(const gctx &c, const glists &ls, const unsigned char *d, long long nvec, cudaStream_t st)
{
    if (nvec <= 0) return;
    softmax_kernel<KIND, MODE, FUSED><<<grid_for(nvec * 32, 256), 256, 0, st>>>(c, (const gprob *)(d + ls.all), ls.n_all,
                                                                              nvec);
}

template <int KIND, bool NV>
static void launch_fold(const gctx &c, const glists &ls, const unsigned char *d, long long nvec, cudaStream_t st)
{
    if (nvec <= 0) return;
    fold_kernel<KIND, NV><<<grid_for(nvec * 32, 256), 256, 0, st>>>(c, (const gprob *)(d + ls.all), ls.n_all, nvec);
}

static gctx make_ctx(const ar_gpu_ref *g, const ar_batch *b, int layer, int num_rows)
{
    gctx c;
    memset(&c, 0, sizeof c);
    const ar_run_config *cfg = &g->cfg;
    c.hq = g->hq;
    c.hkv = g->hkv;
    c.group = g->group;
    c.D = g->D;
    c.Dv = g->Dv;
    c.bs = g->bs;
    c.window = g->mla ? 0 : cfg->model.sliding_window;
    c.mla = g->mla;
    c.H = g->H;
    c.L = g->L;
    c.R = g->R;
    c.P = g->P;
    c.V = g->V;
    c.scale = cfg->model.scale;
    c.cap = g->mla ? 0 : cfg->model.logits_soft_cap;
    c.scale_f = (float)c.scale;
    c.cap_f = (float)c.cap;
    c.kv_scale = (float)cfg->kv_scale;
    c.dtype = cfg->dtype;
    c.kv_dtype = cfg->kv_dtype;
    c.cd = cfg->dtype == AR_FP8_E4M3 ? AR_BF16 : cfg->dtype;
    c.pool_type = g->pool_type;
    c.dist = cfg->data;
    c.seed = cfg->seed;
    c.layer = (unsigned)layer;
    c.slot_layers = g->slot_layers;
    c.pool_layer = g->slot_layers > 1 ? layer : 0;
    c.num_tokens = b->num_tokens;
    c.num_rows = num_rows;
    c.q = (float *)g->q.ptr;
    c.ql = (float *)g->ql.ptr;
    c.w_uk = (const float *)g->w.ptr;
    c.w_uv = g->w.ptr ? (const float *)g->w.ptr + (size_t)g->L * g->H * g->P : NULL;
    c.pool_kv = g->pool_kv;
    c.pool_kn = g->pool_kn;
    c.pool_v = g->pool_v;
    c.pool_lat = g->pool_lat;
    c.S = (double *)g->S.ptr;
    c.O = (double *)g->O.ptr;
    c.Snv = g->fused ? (float *)g->Snv.ptr : (float *)g->S.ptr;   /* the GEMM path: after the reference's */
    c.Onv = g->fused ? (float *)g->Onv.ptr : (float *)g->O.ptr;
    c.olat = (float *)g->olat.ptr;
    c.onv = (float *)g->onv.ptr;
    c.stat = (double *)g->stat.ptr;
    c.stat_nv = g->fused ? (double *)g->statnv.ptr : c.stat;
    c.mx_nv = g->fused ? (float *)g->mxnv.ptr : NULL;
    c.flash_ref = g->flash;
    return c;
}

extern "C" int ar_gpu_ref_nan_count(ar_gpu_ref *g, const ar_batch *b, const ar_gpu_ref_output *o, int64_t *nan_count,
                                    char *err, size_t err_len)
{
    *nan_count = 0;
    if (b->num_tokens <= 0) return 0;
    if (ensure(&g->sum, sizeof(dsum), "summary", err, err_len)) return -1;
    dsum *ds = (dsum *)g->sum.ptr;
    long long n_out = (long long)b->num_tokens * g->hq * g->Dv, n_lse = (long long)g->hq * b->num_tokens;
    if (fail(cudaEventRecord(g->ev_in, (cudaStream_t)o->stream), "event", err, err_len) ||
        fail(cudaStreamWaitEvent(g->stream, g->ev_in, 0), "stream wait", err, err_len) ||
        fail(cudaMemsetAsync(&ds->nan, 0, sizeof ds->nan, g->stream), "memset", err, err_len))
        return -1;
    nan_kernel<<<grid_for(n_out + n_lse, 256), 256, 0, g->stream>>>(o->out, o->out_type, n_out, o->lse, n_lse, &ds->nan);
    unsigned long long *h = (unsigned long long *)g->h_sum;
    /* the count is this call's result: wait for it */
    if (fail(cudaGetLastError(), "NaN count kernel", err, err_len) ||
        fail(cudaMemcpyAsync(h, &ds->nan, sizeof *h, cudaMemcpyDeviceToHost, g->stream), "copy", err, err_len) ||
        fail(cudaStreamSynchronize(g->stream), "NaN count", err, err_len))
        return -1;
    *nan_count = (int64_t)*h;
    return 0;
}

/* Checked rows per reference problem of item it (MHA: per KV head): fused_rows on the fused path
 * (its request has at most fused_max_rows checked rows), else all the item's rows. */
static int problem_rows(const ar_gpu_ref *g, const ar_gpu_ref_rows *rows, const ar_ref_item *it)
{
    if (g->fused && rows->req_row0[it->r + 1] - rows->req_row0[it->r] <= g->fused_max_rows) return g->fused_rows;
    return it->nrows > 0 ? it->nrows : 1;
}

/* Reference problems of one group (see the problem lists in plan_check). */
static size_t group_problems(const ar_gpu_ref *g, const ar_gpu_ref_rows *rows, const ar_ref_plan *pl,
                             const ar_ref_group *gr)
{
    if (g->mla) return (size_t)gr->nitems * (size_t)g->H;
    size_t n = 0;
    for (int i = gr->item0; i < gr->item0 + gr->nitems; i++) {
        const int per = problem_rows(g, rows, &pl->items[i]);
        n += (size_t)((pl->items[i].nrows + per - 1) / per) * (size_t)g->hkv;
    }
    return n;
}

/* The inputs a check's plan depends on besides the layer, into g->sig_new (g->sig_new_len words):
 * a plan made from equal words is the same plan.  0 or -1 (out of memory). */
static int plan_signature(ar_gpu_ref *g, const ar_batch *b, const ar_gpu_ref_rows *rows, char *err, size_t err_len)
{
    const int R = b->num_reqs, NR = rows->num_rows, bs = g->bs;
    size_t n = 5 + (size_t)R * 6 + (size_t)NR;
    for (int r = 0; r < R; r++)
        if (rows->req_row0[r + 1] > rows->req_row0[r]) {
            int nb = (b->seq_lens[r] + bs - 1) / bs;
            n += (size_t)(nb < b->max_blocks_per_req ? nb : b->max_blocks_per_req);
        }
    if (n > g->sig_new_cap) {
        uint64_t *p = (uint64_t *)realloc(g->sig_new, sizeof(uint64_t) * (n + n / 4));
        if (!p) {
            snprintf(err, err_len, "device reference: out of host memory");
            return -1;
        }
        g->sig_new = p;
        g->sig_new_cap = n + n / 4;
    }
    uint64_t *w = g->sig_new;
    size_t k = 0;
    w[k++] = (uint64_t)b->step;
    w[k++] = (uint64_t)(uint32_t)R;
    w[k++] = (uint64_t)(uint32_t)NR;
    w[k++] = (uint64_t)(uint32_t)b->num_tokens;
    w[k++] = (uint64_t)(uint32_t)b->max_blocks_per_req;
    for (int r = 0; r < R; r++) {
        w[k++] = b->req_keys[r];
        w[k++] = (uint64_t)(uint32_t)b->context_lens[r];
        w[k++] = (uint64_t)(uint32_t)b->seq_lens[r];
        w[k++] = (uint64_t)(uint32_t)b->query_start_loc[r];
        w[k++] = (uint64_t)(uint32_t)rows->req_row0[r];
        w[k++] = (uint64_t)(uint32_t)rows->req_row0[r + 1];
    }
    for (int i = 0; i < NR; i++) w[k++] = (uint64_t)(uint32_t)rows->row[i];
    for (int r = 0; r < R; r++)
        if (rows->req_row0[r + 1] > rows->req_row0[r]) {
            int nb = (b->seq_lens[r] + bs - 1) / bs;
            if (nb > b->max_blocks_per_req) nb = b->max_blocks_per_req;
            memcpy(w + k, b->block_keys + (size_t)r * b->max_blocks_per_req, sizeof(uint64_t) * (size_t)nb);
            k += (size_t)nb;
        }
    g->sig_new_len = k;
    return 0;
}

/* Plans one check (ar_gpu_ref_check's rows of step b at `layer`) into g->sp and the pinned arena:
 * the block-cache slots, items and groups, and every list the kernels read.  0 or -1. */
static int plan_check(ar_gpu_ref *g, const ar_batch *b, int layer, const ar_gpu_ref_rows *rows, char *err,
                      size_t err_len)
{
    saved_plan *sp = &g->sp;
    const int R = b->num_reqs, NR = rows->num_rows;
    const int hq = g->hq, bs = g->bs;
    const int win = g->mla ? 0 : g->cfg.model.sliding_window;
    /* ---- plan: requests, rows, items, groups ---- */
    ar_ref_plan_req *preq = (ar_ref_plan_req *)malloc(sizeof *preq * (size_t)(R > 0 ? R : 1));
    if (!preq) {
        snprintf(err, err_len, "device reference: out of host memory");
        return -1;
    }
    for (int r = 0; r < R; r++) {
        ar_ref_plan_req *q = &preq[r];
        const int ctx = b->context_lens[r], s = b->seq_lens[r];
        q->row0 = rows->req_row0[r];
        q->nrows = rows->req_row0[r + 1] - q->row0;
        q->block_keys = b->block_keys + (size_t)r * b->max_blocks_per_req;
        q->kmin = q->kmax = 0;
        if (q->nrows <= 0) continue;
        /* as replay/verify.c: keys [kmin, kmax) visible to some checked row */
        int first = ctx + rows->row[q->row0], last = ctx + rows->row[q->row0 + q->nrows - 1];
        q->kmax = last + 1 < s ? last + 1 : s;
        if (win > 0 && first - win + 1 > 0) q->kmin = first - win + 1;
    }
    ar_ref_budget bud = {AR_VERIFY_KEY_CHUNK, bs, hq, g->max_scores, g->max_vectors};
    /* step-shared slots: one cache entry per content key for every layer (the device makes each
     * layer of it on first use); else one per (layer, content key) */
    if (ar_ref_plan_build(&g->plan, g->cache, g->step_slots ? 0 : layer, b->step, &g->stamp, R, preq, &bud, err,
                          err_len) != 0) {
        free(preq);
        return -1;
    }
    const ar_ref_plan *pl = &g->plan;

    /* ---- the arena: everything the kernels read, one upload ---- */
    size_t off = 0;
    const size_t o_reqs = sp->o_reqs = take(&off, sizeof(dreq) * (size_t)(R > 0 ? R : 1));
    const size_t o_rows = sp->o_rows = take(&off, sizeof(drow) * (size_t)(NR > 0 ? NR : 1));
    const size_t o_items = sp->o_items = take(&off, sizeof(ditem) * (size_t)(pl->num_items > 0 ? pl->num_items : 1));
    const size_t o_map = sp->o_map = take(&off, sizeof(int) * (size_t)(pl->num_map > 0 ? pl->num_map : 1));
    const size_t o_mslot = sp->o_mslot = take(&off, sizeof(int) * (size_t)(pl->num_miss > 0 ? pl->num_miss : 1));
    const size_t o_mkey = sp->o_mkey = take(&off, sizeof(unsigned long long) * (size_t)(pl->num_miss > 0 ? pl->num_miss : 1));
    /* step-shared slots: each group's distinct slots and their content keys (at most num_map) */
    const size_t o_uslot = sp->o_uslot = take(&off, sizeof(int) * (size_t)(pl->num_map > 0 ? pl->num_map : 1));
    const size_t o_ukey = sp->o_ukey = take(&off, sizeof(unsigned long long) * (size_t)(pl->num_map > 0 ? pl->num_map : 1));
    /* problem lists: sized generously first (items x heads per group, x 2 for MLA), filled below */
    size_t need = off;
    for (int gi = 0; gi < pl->num_groups; gi++) {
        size_t np = group_problems(g, rows, pl, &pl->groups[gi]) + 2;
        need += sizeof(gprob) * np + 16 + lists_bytes(np) + 2 * (3 * sizeof(gprob) + 64);
        if (g->mla) need += sizeof(gprob) * np + 16 + lists_bytes(np);
    }
    size_t o_qlprobs = 0;
    if (g->mla) need += sizeof(gprob) * (size_t)(g->H + 1) + 16 + lists_bytes((size_t)g->H + 1);
    need += 256;
    if (need > g->h_arena_cap) {
        if (g->h_arena) cudaFreeHost(g->h_arena);
        g->h_arena = NULL;
        g->h_arena_cap = 0;
        if (fail(cudaMallocHost(&g->h_arena, need + need / 4), "pinned arena", err, err_len)) {
            free(preq);
            return -1;
        }
        g->h_arena_cap = need + need / 4;
    }
    unsigned char *h = (unsigned char *)g->h_arena;
    dreq *hr = (dreq *)(h + o_reqs);
    for (int r = 0; r < R; r++) {
        hr[r].req_key = b->req_keys[r];
        hr[r].q0 = b->query_start_loc[r];
        hr[r].n = b->query_start_loc[r + 1] - b->query_start_loc[r];
        hr[r].ctx = b->context_lens[r];
        hr[r].seq = b->seq_lens[r];
        hr[r].kmin = preq[r].kmin;
        hr[r].kmax = preq[r].kmax;
        hr[r].row0 = preq[r].row0;
        hr[r].nrows = preq[r].nrows;
    }
    drow *hw = (drow *)(h + o_rows);
    for (int r = 0; r < R; r++)
        for (int i = rows->req_row0[r]; i < rows->req_row0[r + 1]; i++) {
            hw[i].r = r;
            hw[i].row = rows->row[i];
            hw[i].pos = b->context_lens[r] + rows->row[i];
            hw[i].t = b->query_start_loc[r] + rows->row[i];
        }
    ditem *hi = (ditem *)(h + o_items);
    for (int i = 0; i < pl->num_items; i++) {
        const ar_ref_item *it = &pl->items[i];
        hi[i] = ditem{it->r, it->row0, it->nrows, it->chunk, it->k0, it->nkeys, it->map0, it->nblocks};
    }
    memcpy(h + o_map, pl->slot_map, sizeof(int) * (size_t)pl->num_map);
    memcpy(h + o_mslot, pl->miss_slot, sizeof(int) * (size_t)pl->num_miss);
    memcpy(h + o_mkey, pl->miss_key, sizeof(uint64_t) * (size_t)pl->num_miss);
    int nuniq = 0;

    hgroup *hg = (hgroup *)calloc((size_t)(pl->num_groups > 0 ? pl->num_groups : 1), sizeof *hg);
    gprob *tmp = NULL;
    size_t tmp_cap = 0;
    int64_t max_scores = 0, max_vec = 0, max_pv_part = 0;
    if (!hg) {
        free(preq);
        snprintf(err, err_len, "device reference: out of host memory");
        return -1;
    }
    for (int gi = 0; gi < pl->num_groups; gi++) {
        const ar_ref_group *gr = &pl->groups[gi];
        hgroup *x = &hg[gi];
        size_t np = group_problems(g, rows, pl, gr) + 1;
        if (np > tmp_cap) {
            free(tmp);
            tmp = (gprob *)malloc(sizeof(gprob) * np);
            tmp_cap = tmp ? np : 0;
            if (!tmp) {
                free(hg);
                free(preq);
                snprintf(err, err_len, "device reference: out of host memory");
                return -1;
            }
        }
        /* reference problems: MHA (item, KV head), on the fused path (item, KV head, block of
         * fused_rows rows); MLA (item, head).  Vectors in problem order.  A request's rows take one
         * path in all its items (problem_rows). */
        long long s = 0, v = 0, vnv = 0;
        int n = 0;
        for (int i = gr->item0; i < gr->item0 + gr->nitems; i++) {
            const ar_ref_item *it = &pl->items[i];
            const int heads = g->mla ? g->H : g->hkv;
            const int rows_per = problem_rows(g, rows, it);
            for (int hh = 0; hh < heads; hh++)
                for (int r0 = 0; r0 < it->nrows; r0 += rows_per) {
                    const int nr = it->nrows - r0 < rows_per ? it->nrows - r0 : rows_per;
                    const int M = g->mla ? nr : nr * g->group;
                    gprob p = {i, hh, M, it->nkeys, g->mla ? g->P + g->R : g->D, r0, s, v, vnv};
                    tmp[n++] = p;
                    s += (long long)M * it->nkeys;
                    v += M;
                }
            vnv += (long long)it->nrows * g->H;
        }
        x->nvec_ref = v;
        if (s > max_scores) max_scores = s;
        if (v > max_vec) max_vec = v;
        x->ref.all = take(&off, sizeof(gprob) * (size_t)(n > 0 ? n : 1));
        memcpy(h + x->ref.all, tmp, sizeof(gprob) * (size_t)n);
        split_lists(h, &x->ref, tmp, n, &off, g->fused);
        if (pv_part_vectors(&x->ref) > max_pv_part) max_pv_part = pv_part_vectors(&x->ref);
        if (g->mla) {
            /* yardstick problems: (item), every head, vectors (row, head) */
            s = v = 0;
            n = 0;
            for (int i = gr->item0; i < gr->item0 + gr->nitems; i++) {
                const ar_ref_item *it = &pl->items[i];
                gprob p = {i, -1, it->nrows * g->H, it->nkeys, g->L + g->R, 0, s, v, v};
                tmp[n++] = p;
                s += (long long)p.M * it->nkeys;
                v += p.M;
            }
            x->nvec_nv = v;
            x->nv.all = take(&off, sizeof(gprob) * (size_t)(n > 0 ? n : 1));
            memcpy(h + x->nv.all, tmp, sizeof(gprob) * (size_t)n);
            split_lists(h, &x->nv, tmp, n, &off, false);
            /* the up-projection of the blocks this group misses: one problem */
            x->up = take(&off, sizeof(gprob));
            x->pup = take(&off, 2 * sizeof(int));
            gprob up = {-1, -1, gr->nmiss * bs, g->H * g->P, g->L, 0, 0, 0, 0};
            *(gprob *)(h + x->up) = up;
            ((int *)(h + x->pup))[0] = 0;
            ((int *)(h + x->pup))[1] = x->t_up = (up.M + 63) / 64;
        }
    }
    free(tmp);
    glists qlists;
    memset(&qlists, 0, sizeof qlists);
    if (g->mla) {
        /* ql = round(W_UK q_nope): one problem per head over every checked row */
        gprob *qp = (gprob *)malloc(sizeof(gprob) * (size_t)g->H);
        if (!qp) {
            free(hg);
            free(preq);
            snprintf(err, err_len, "device reference: out of host memory");
            return -1;
        }
        for (int hh = 0; hh < g->H; hh++) qp[hh] = gprob{-1, hh, NR, g->L, g->P, 0, 0, 0, 0};
        o_qlprobs = take(&off, sizeof(gprob) * (size_t)g->H);
        qlists.all = o_qlprobs;
        memcpy(h + o_qlprobs, qp, sizeof(gprob) * (size_t)g->H);
        split_lists(h, &qlists, qp, g->H, &off, false);
        free(qp);
    }
    if (g->step_slots) {   /* each group's distinct slots and their content keys */
        int *us = (int *)(h + o_uslot);
        unsigned long long *uk = (unsigned long long *)(h + o_ukey);
        for (int gi = 0; gi < pl->num_groups; gi++) {
            hg[gi].u0 = nuniq;
            hg[gi].nu = ar_ref_plan_group_slots(pl, gi, preq, bs, g->seen, &g->seen_serial, us + nuniq,
                                                (uint64_t *)(uk + nuniq));
            nuniq += hg[gi].nu;
        }
    }
    free(preq);
    sp->arena_bytes = off;
    sp->max_scores = max_scores;
    sp->max_vec = max_vec;
    sp->max_pv_part = max_pv_part;
    sp->rows_fused = 0;
    for (int r = 0; g->fused && r < R; r++) {
        const int nr = rows->req_row0[r + 1] - rows->req_row0[r];
        if (nr <= g->fused_max_rows) sp->rows_fused += nr;
    }
    sp->qlists = qlists;
    free(sp->hg);
    sp->hg = hg;
    return 0;
}


extern "C" int ar_gpu_ref_check(ar_gpu_ref *g, const ar_batch *b, int layer, const ar_gpu_ref_rows *rows,
                                const ar_gpu_ref_output *o, const volatile int *cancel, ar_gpu_ref_copy *copy,
                                ar_gpu_ref_summary *sum, char *err, size_t err_len)
{
    memset(sum, 0, sizeof *sum);
    const double t0 = now_s();
    const int NR = rows->num_rows;
    const int hq = g->hq, Dv = g->Dv, bs = g->bs;
    g->stats.checks++;
    saved_plan *sp = &g->sp;
    /* the step's other layers reuse its plan (step-shared slots: the slots do not depend on the
     * layer), when the batch and the rows are the same */
    bool reuse = false;
    if (g->step_slots) {
        if (layer < 0 || layer >= g->slot_layers) {
            snprintf(err, err_len, "device reference: layer %d outside the run's %d layers", layer, g->slot_layers);
            return -1;
        }
        if (plan_signature(g, b, rows, err, err_len)) return -1;
        reuse = sp->valid && g->sig_new_len == g->sig_len && memcmp(g->sig_new, g->sig, sizeof(uint64_t) * g->sig_len) == 0;
    }
    if (!reuse) {
        sp->valid = false;
        if (plan_check(g, b, layer, rows, err, err_len)) return -1;
        if (g->step_slots) {
            uint64_t *t = g->sig;
            size_t tc = g->sig_cap;
            g->sig = g->sig_new;
            g->sig_cap = g->sig_new_cap;
            g->sig_len = g->sig_new_len;
            g->sig_new = t;
            g->sig_new_cap = tc;
            sum->generated_blocks = g->plan.num_miss;
            g->stats.blocks_generated += g->plan.num_miss;
        }
    }
    const ar_ref_plan *pl = &g->plan;
    const hgroup *hg = sp->hg;
    const int64_t max_scores = sp->max_scores, max_vec = sp->max_vec;
    const size_t arena_bytes = sp->arena_bytes;
    const glists qlists = sp->qlists;
    unsigned char *h = (unsigned char *)g->h_arena;

    /* ---- device buffers (grow-only) ---- */
    const size_t acc_elems = (size_t)(NR > 0 ? NR : 1) * hq * Dv, lse_elems = (size_t)(NR > 0 ? NR : 1) * hq;
    int nparts = g->num_sms * 2;
    long long total_cmp = (long long)NR * hq * Dv;
    if (nparts > grid_for(total_cmp, CMP_THREADS)) nparts = grid_for(total_cmp, CMP_THREADS);
    if (nparts < 1) nparts = 1;
    size_t vec_bytes = g->mla ? (size_t)g->V * 8 : (size_t)Dv * 8;
    if (ensure(&g->arena, arena_bytes, "plan upload", err, err_len) ||
        ensure(&g->q, (size_t)(NR > 0 ? NR : 1) * hq * g->D * 4, "query buffer", err, err_len) ||
        (g->mla && ensure(&g->ql, (size_t)(NR > 0 ? NR : 1) * g->H * (g->L + g->R) * 4, "latent query", err, err_len)) ||
        ensure(&g->acc, (2 * acc_elems + 2 * lse_elems) * 8, "accumulators", err, err_len) ||
        ensure(&g->S, (size_t)(max_scores > 0 ? max_scores : 1) * 8, "score scratch", err, err_len) ||
        ensure(&g->O, (size_t)(max_vec > 0 ? max_vec : 1) * vec_bytes, "output scratch", err, err_len) ||
        ensure(&g->stat, (size_t)(max_vec > 0 ? max_vec : 1) * 16, "row statistics", err, err_len) ||
        (g->fused && ensure(&g->Snv, (size_t)(max_scores > 0 ? max_scores : 1) * 4, "yardstick scores", err, err_len)) ||
        (g->fused && ensure(&g->Onv, (size_t)(max_vec > 0 ? max_vec : 1) * Dv * 4, "yardstick outputs", err, err_len)) ||
        (g->fused && ensure(&g->statnv, (size_t)(max_vec > 0 ? max_vec : 1) * 16, "yardstick statistics", err, err_len)) ||
        (g->fused && ensure(&g->mxnv, (size_t)(max_vec > 0 ? max_vec : 1) * 4, "yardstick maxima", err, err_len)) ||
        (g->fused && ensure(&g->pvpart, (size_t)(sp->max_pv_part > 0 ? sp->max_pv_part : 1) * Dv * 12, "P.V partial sums",
                            err, err_len)) ||
        (g->mla && ensure(&g->olat, (size_t)(max_vec > 0 ? max_vec : 1) * g->L * 4, "latent outputs", err, err_len)) ||
        (g->mla && ensure(&g->onv, (size_t)(max_vec > 0 ? max_vec : 1) * g->V * 4, "yardstick outputs", err, err_len)) ||
        (g->mla && ensure(&g->w, (size_t)g->L * g->H * (g->P + g->V) * 4, "MLA weights", err, err_len)) ||
        ensure(&g->parts, sizeof(part) * (size_t)nparts, "partials", err, err_len) ||
        ensure(&g->sum, sizeof(dsum), "summary", err, err_len)) {
        sp->valid = false;
        return -1;
    }
    gctx c = make_ctx(g, b, layer, NR);
    unsigned char *d = (unsigned char *)g->arena.ptr;
    c.reqs = (const dreq *)(d + sp->o_reqs);
    c.rows = (const drow *)(d + sp->o_rows);
    c.items = (const ditem *)(d + sp->o_items);
    c.slot_map = (const int *)(d + sp->o_map);
    double *acc = (double *)g->acc.ptr;
    c.acc_o = acc;
    c.nv_o = acc + acc_elems;
    c.acc_l = acc + 2 * acc_elems;
    c.nv_l = acc + 2 * acc_elems + lse_elems;
    if (g->fused) {
        c.pv_part = (double *)g->pvpart.ptr;
        c.pv_part_nv = (float *)(c.pv_part + (size_t)(sp->max_pv_part > 0 ? sp->max_pv_part : 1) * Dv);
    }
    const double t_plan = now_s();
    sum->plan_s = t_plan - t0;
    sum->rows_fused = sp->rows_fused;

    /* ---- device work ---- */
    cudaStream_t st = g->stream;
    dsum *ds = (dsum *)g->sum.ptr;
    int rc = 0;
    if (fail(cudaEventRecord(g->ev_in, (cudaStream_t)o->stream), "event", err, err_len) ||
        fail(cudaStreamWaitEvent(st, g->ev_in, 0), "stream wait", err, err_len) ||
        (!reuse && fail(cudaMemcpyAsync(d, h, arena_bytes, cudaMemcpyHostToDevice, st), "plan upload", err, err_len)) ||
        fail(cudaMemsetAsync(&ds->nan, 0, sizeof ds->nan, st), "memset", err, err_len)) {
        sp->valid = false;
        ar_block_cache_clear(g->cache);
        return -1;
    }
    init_acc_kernel<<<grid_for((long long)acc_elems, 256), 256, 0, st>>>(c.acc_o, c.acc_l, (long long)acc_elems, (long long)lse_elems);
    init_acc_kernel<<<grid_for((long long)acc_elems, 256), 256, 0, st>>>(c.nv_o, c.nv_l, (long long)acc_elems, (long long)lse_elems);
    if (NR > 0) {
        if (!g->mla) {
            gen_q_mha_kernel<<<grid_for((long long)NR * hq * ((g->D + 7) / 8), 256), 256, 0, st>>>(c);
        } else {
            if (g->w_layer != layer) {
                gen_weights_kernel<<<grid_for((long long)g->L * g->H * g->P, 256), 256, 0, st>>>(
                    (float *)g->w.ptr, g->L, g->H, g->P, AR_STREAM_W_UK, g->cfg.seed, (uint32_t)layer, g->cfg.data, g->cfg.dtype);
                gen_weights_kernel<<<grid_for((long long)g->L * g->H * g->V, 256), 256, 0, st>>>(
                    (float *)g->w.ptr + (size_t)g->L * g->H * g->P, g->L, g->H, g->V, AR_STREAM_W_UV, g->cfg.seed,
                    (uint32_t)layer, g->cfg.data, g->cfg.dtype);
                g->w_layer = layer;
            }
            gen_q_mla_kernel<<<grid_for((long long)NR * g->H * ((g->P + g->R + 7) / 8), 256), 256, 0, st>>>(c);
            launch_product<double, K_MLA_QL, false>(c, qlists, d, g->L, st);
        }
    }
    if ((rc = fail(cudaGetLastError(), "input kernels", err, err_len))) goto out;
    for (int gi = 0; gi < pl->num_groups; gi++) {
        /* at most two groups in flight, so that a raised cancel flag stops the work within about
         * one group's time (a group is bounded by the scratch budget) */
        if (gi >= 2 && (rc = fail(cudaEventSynchronize(g->ev_group[gi % 2]), "group", err, err_len))) goto out;
        if (cancel && *cancel) {
            cudaStreamSynchronize(st);
            rc = AR_GPU_REF_CANCELLED;
            goto out;
        }
        const ar_ref_group *gr = &pl->groups[gi];
        const hgroup *x = &hg[gi];
        c.miss_slot = (const int *)(d + sp->o_mslot) + gr->miss0;
        c.miss_key = (const unsigned long long *)(d + sp->o_mkey) + gr->miss0;
        c.nmiss = gr->nmiss;
        g->stats.groups++;
        sum->groups++;
        if (!g->step_slots) {   /* step-shared slots: counted when planned (blocks newly cached) */
            g->stats.blocks_generated += gr->nmiss;
            sum->generated_blocks += gr->nmiss;
        }
        if (g->profile) cudaEventRecord(g->ev_prof[0], st);
        if (!g->mla) {
            if (g->step_slots) {
                if (x->nu > 0)
                    gen_slots_mha_kernel<<<x->nu < 65535 * 8 ? x->nu : 65535 * 8, 256, 0, st>>>(
                        c, (const int *)(d + sp->o_uslot) + x->u0, (const unsigned long long *)(d + sp->o_ukey) + x->u0,
                        x->nu, g->dev_content, g->dev_mask, g->mask_words);
            } else if (gr->nmiss > 0) {
                gen_pool_mha_kernel<<<grid_for((long long)gr->nmiss * bs * g->hkv * ((g->D + 7) / 8), 256), 256, 0, st>>>(c);
            }
            if (g->profile) cudaEventRecord(g->ev_prof[1], st);
            if (g->fused) {   /* both twins in each pass; the profile counts it all as the reference's */
                /* problems of at most SK_MAXM vectors are in the fused lists, those of the requests
                 * with many checked rows in the GEMM template's (each twin has its own scores, P and
                 * outputs here, so the order of the two paths' launches does not matter) */
                launch_fused(c, x->ref, true, d, st);
                if (g->flash) {   /* the reference of the GEMM template's problems in one pass */
                    if (x->ref.n_big > 0 && x->ref.t_big > 0)
                        flash_ref_kernel<<<(unsigned)x->ref.t_big, FR_THREADS, sizeof(fr_smem), st>>>(
                            c, (const gprob *)(d + x->ref.big), (const int *)(d + x->ref.pbig), x->ref.n_big);
                } else {
                    launch_product<double, K_MHA_S_REF, false>(c, x->ref, d, 0, st);
                }
                launch_product<float, K_MHA_S_NV, false>(c, x->ref, d, 0, st);
                launch_softmax<K_MHA_S_REF, 0, true>(c, x->ref, d, x->nvec_ref, st);   /* fused: statistics only */
                launch_softmax<K_MHA_S_NV, 1, true>(c, x->ref, d, x->nvec_ref, st);
                launch_fused(c, x->ref, false, d, st);
                if (!g->flash) launch_product<double, K_MHA_PV_REF, true>(c, x->ref, d, Dv, st);
                launch_product<float, K_MHA_PV_NV, true>(c, x->ref, d, Dv, st);
                launch_fold<K_MHA_PV_REF, false>(c, x->ref, d, x->nvec_ref, st);
                launch_fold<K_MHA_PV_NV, true>(c, x->ref, d, x->nvec_ref, st);
                if (g->profile) cudaEventRecord(g->ev_prof[2], st);
            } else {
                launch_product<double, K_MHA_S_REF, false>(c, x->ref, d, 0, st);
                launch_softmax<K_MHA_S_REF, 0>(c, x->ref, d, x->nvec_ref, st);
                launch_product<double, K_MHA_PV_REF, true>(c, x->ref, d, Dv, st);
                launch_fold<K_MHA_PV_REF, false>(c, x->ref, d, x->nvec_ref, st);
                if (g->profile) cudaEventRecord(g->ev_prof[2], st);
                launch_product<float, K_MHA_S_NV, false>(c, x->ref, d, 0, st);
                launch_softmax<K_MHA_S_NV, 1>(c, x->ref, d, x->nvec_ref, st);
                launch_product<float, K_MHA_PV_NV, true>(c, x->ref, d, Dv, st);
                launch_fold<K_MHA_PV_NV, true>(c, x->ref, d, x->nvec_ref, st);
            }
        } else {
            if (gr->nmiss > 0) {
                gen_pool_lat_kernel<<<grid_for((long long)gr->nmiss * bs * ((g->L + g->R + 7) / 8), 256), 256, 0, st>>>(c);
                const gprob *up = (const gprob *)(d + x->up);
                const int *pup = (const int *)(d + x->pup);
                dim3 gk((unsigned)x->t_up, (unsigned)((g->H * g->P + 63) / 64));
                gemm_kernel<double, K_MLA_UP_K, 64, 64, 16, 4, 4, true><<<gk, 256, 0, st>>>(c, up, pup, 1);
                /* the V product: the same problem with N = H x V */
                dim3 gv((unsigned)x->t_up, (unsigned)((g->H * g->V + 63) / 64));
                gemm_kernel<double, K_MLA_UP_V, 64, 64, 16, 4, 4, true><<<gv, 256, 0, st>>>(c, up + 0, pup, 1);
            }
            if (g->profile) cudaEventRecord(g->ev_prof[1], st);
            launch_product<double, K_MLA_S_REF, false>(c, x->ref, d, 0, st);
            launch_softmax<K_MLA_S_REF, 0>(c, x->ref, d, x->nvec_ref, st);
            launch_product<double, K_MLA_PV_REF, true>(c, x->ref, d, g->V, st);
            launch_fold<K_MLA_PV_REF, false>(c, x->ref, d, x->nvec_ref, st);
            if (g->profile) cudaEventRecord(g->ev_prof[2], st);
            launch_product<double, K_MLA_S_NV, false>(c, x->nv, d, 0, st);
            launch_softmax<K_MLA_S_NV, 2>(c, x->nv, d, x->nvec_nv, st);
            launch_product<double, K_MLA_PV_NV, true>(c, x->nv, d, g->L, st);
            launch_product<double, K_MLA_WUV, true>(c, x->ref, d, g->V, st);
            launch_fold<K_MLA_PV_NV, true>(c, x->nv, d, x->nvec_nv, st);
        }
        if ((rc = fail(cudaGetLastError(), "reference kernels", err, err_len)) ||
            (rc = fail(cudaEventRecord(g->ev_group[gi % 2], st), "event", err, err_len)))
            goto out;
        if (g->profile) {   /* measurements only: wait for the group and read its phases */
            float ms[3] = {0, 0, 0};
            cudaEventRecord(g->ev_prof[3], st);
            if ((rc = fail(cudaEventSynchronize(g->ev_prof[3]), "profile", err, err_len))) goto out;
            for (int k = 0; k < 3; k++) cudaEventElapsedTime(&ms[k], g->ev_prof[k], g->ev_prof[k + 1]);
            sum->gen_ms += ms[0];
            sum->ref_ms += ms[1];
            sum->naive_ms += ms[2];
            g->stats.gen_ms += ms[0];
            g->stats.ref_ms += ms[1];
            g->stats.naive_ms += ms[2];
        }
    }
    if (cancel && *cancel) {
        cudaStreamSynchronize(st);
        rc = AR_GPU_REF_CANCELLED;
        goto out;
    }
    {
        double atol, rtol;
        ar_verify_fixed_tolerance(g->cfg.dtype, &atol, &rtol);
        cmp_args ca = {o->out, o->out_type, o->lse, atol, rtol, (part *)g->parts.ptr};
        if (g->profile) cudaEventRecord(g->ev_prof[0], st);
        if (total_cmp > 0) {
            compare_kernel<<<nparts, CMP_THREADS, 0, st>>>(c, ca);
            reduce_kernel<<<1, 32, 0, st>>>((const part *)g->parts.ptr, nparts, ds);
        } else if ((rc = fail(cudaMemsetAsync(&ds->total, 0, sizeof ds->total, st), "memset", err, err_len))) {
            goto out;
        }
        long long n_out = (long long)b->num_tokens * hq * Dv, n_lse = (long long)hq * b->num_tokens;
        if (n_out + n_lse > 0)
            nan_kernel<<<grid_for(n_out + n_lse, 256), 256, 0, st>>>(o->out, o->out_type, n_out, o->lse, n_lse, &ds->nan);
        if (g->profile) cudaEventRecord(g->ev_prof[1], st);
        if ((rc = fail(cudaGetLastError(), "comparison kernels", err, err_len)) ||
            (rc = fail(cudaMemcpyAsync(g->h_sum, ds, sizeof *ds, cudaMemcpyDeviceToHost, st), "summary copy", err, err_len)))
            goto out;
        if (copy) {
            size_t row_elems = (size_t)hq * Dv;
            if (copy->ref_out) cudaMemcpyAsync(copy->ref_out, c.acc_o, (size_t)NR * row_elems * 8, cudaMemcpyDeviceToHost, st);
            if (copy->ref_lse) cudaMemcpyAsync(copy->ref_lse, c.acc_l, (size_t)NR * hq * 8, cudaMemcpyDeviceToHost, st);
            if (copy->naive_out) cudaMemcpyAsync(copy->naive_out, c.nv_o, (size_t)NR * row_elems * 8, cudaMemcpyDeviceToHost, st);
            if (copy->naive_lse) cudaMemcpyAsync(copy->naive_lse, c.nv_l, (size_t)NR * hq * 8, cudaMemcpyDeviceToHost, st);
            if (copy->probe_heads > 0 && copy->probe_row >= 0 && copy->probe_row < NR && copy->probe_head0 >= 0 &&
                copy->probe_head0 + copy->probe_heads <= hq) {
                size_t at = (size_t)copy->probe_row * hq + copy->probe_head0;
                if (copy->probe_out)
                    cudaMemcpyAsync(copy->probe_out, c.acc_o + at * Dv, (size_t)copy->probe_heads * Dv * 8,
                                    cudaMemcpyDeviceToHost, st);
                if (copy->probe_lse)
                    cudaMemcpyAsync(copy->probe_lse, c.acc_l + at, (size_t)copy->probe_heads * 8, cudaMemcpyDeviceToHost, st);
            }
        }
        /* the summary is this call's result: wait for it (the only wait of a check besides the
         * cancellation pacing above) */
        if ((rc = fail(cudaStreamSynchronize(st), "reference kernels", err, err_len))) goto out;
    }
    if (g->profile) {
        float ms = 0;
        cudaEventElapsedTime(&ms, g->ev_prof[0], g->ev_prof[1]);
        sum->compare_ms = ms;
        g->stats.compare_ms += ms;
    }
    {
        const dsum *hs = (const dsum *)g->h_sum;
        const part *t = &hs->total;
        sum->elems = t->elems;
        sum->sum_abs = t->sum_abs;
        sum->sum_sq_err = t->sum_sq_err;
        sum->sum_sq_ref = t->sum_sq_ref;
        sum->naive_sum_abs = t->naive_sum;
        sum->max_abs = t->max_abs;
        sum->max_rel = t->max_rel;
        sum->lse_max = t->lse_max;
        sum->naive_max = t->naive_max;
        sum->naive_lse_max = t->naive_lse_max;
        sum->bad = t->bad;
        sum->nan_count = (int64_t)hs->nan;
        sum->num_worst = t->nworst;
        for (int k = 0; k < t->nworst; k++) {
            const wentry &w = t->w[k];
            long long per_row = (long long)hq * Dv;
            sum->worst[k].row = (int)(w.idx / per_row);
            sum->worst[k].head = (int)(w.idx % per_row / Dv);
            sum->worst[k].dim = (int)(w.idx % Dv);
            sum->worst[k].got = w.got;
            sum->worst[k].want = w.want;
            sum->worst[k].err = w.err;
        }
        g->stats.blocks_used += pl->num_map;
    }
out:
    sp->valid = rc == 0 && g->step_slots;
    if (rc != 0) {
        /* slots planned but maybe never filled: forget them all */
        ar_block_cache_clear(g->cache);
        if (rc != AR_GPU_REF_CANCELLED) cudaStreamSynchronize(st);
        else rc = AR_GPU_REF_CANCELLED;
    }
    sum->device_s = now_s() - t_plan;
    g->stats.device_s += sum->device_s;
    return rc;
}
