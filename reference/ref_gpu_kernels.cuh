/* ref_gpu_kernels.cuh - the device half of the device reference (ref_gpu.cu, whose opening
 * comment describes the whole computation): the step's device data, the operands of each
 * product, the tiled GEMM template, the per-vector softmax and fold kernels, the generator
 * kernels and the comparison and its reduction (the fused MHA path and the flash reference are
 * in ref_gpu_attn.cuh).  Included once, by ref_gpu.cu; ref_gpu.cu keeps the host side that plans
 * and launches them. */
#ifndef AR_REF_GPU_KERNELS_CUH
#define AR_REF_GPU_KERNELS_CUH

/* AR_REF_GEMM_VEC=0 at compile time: the SIMT tiles read shared memory one element at a time
 * (for A/B measurements of the 16-byte reads; the results are the same). */
#ifndef AR_REF_GEMM_VEC
#define AR_REF_GEMM_VEC 1
#endif

namespace argpu {

/* ---- device data of a step ------------------------------------------------------------------- */

struct dreq {
    unsigned long long req_key;
    int q0, n, ctx, seq, kmin, kmax, row0, nrows;
};

struct drow {
    int r, row, pos, t;
};

struct ditem {
    int r, row0, nrows, chunk, k0, nkeys, map0, nblocks;
};

/* One GEMM problem (also the unit of the per-vector kernels): M rows ("vectors": a checked row
 * and one query head), N columns, K reduction. */
struct gprob {
    int item;                 /* index into the step's items (-1: none) */
    int head;                 /* MHA: KV head; MLA reference / W_UV: head; else -1 */
    int M, N, K;
    int r0;                   /* MHA: first row of the problem within its item (a problem may cover
                                 only some of the item's rows: the fused path's row blocks) */
    long long s_off;          /* first score of the problem in the scratch ([M][N]) */
    long long v_off;          /* first vector in the per-vector scratch */
    long long aux;            /* MLA W_UV: the item's first yardstick vector */
};

/* MHA problems of at most SK_MAXM vectors take the fused kernels when the check uses them (see
 * "the fused path" below); larger ones the GEMM template. */
constexpr int SK_MAXM = 16;
__host__ __device__ constexpr bool fused_sized(int M) { return M <= SK_MAXM; }

struct rowh {
    long long base;           /* -1: a zero row */
    int lo, hi;               /* A rows: keys visible in the item's chunk (k or n units) */
};

enum kind {
    K_MHA_S_REF, K_MHA_PV_REF, K_MHA_S_NV, K_MHA_PV_NV,
    K_MLA_QL, K_MLA_UP_K, K_MLA_UP_V,
    K_MLA_S_REF, K_MLA_PV_REF, K_MLA_S_NV, K_MLA_PV_NV, K_MLA_WUV
};

constexpr int NO_MASK = INT_MAX / 2;

/* The MHA P.V products are summed in key splits of PV_SPLIT keys (of the item's chunk): each split
 * is one chain of fmas from zero, keys ascending, and the splits are added in order, from zero.
 * The fused path runs a CTA per split (a long context fills the GPU however few rows are checked)
 * and the GEMM template folds its accumulator at the same key boundaries, so the two paths keep
 * giving the same bits.  A multiple of the GEMM template's BK (16) and of PV_KT (32). */
constexpr int PV_SPLIT = 1024;
template <int KIND> struct pv_split_kind {
    static constexpr bool value = KIND == K_MHA_PV_REF || KIND == K_MHA_PV_NV;
};

/* Everything the kernels read, by value (one launch parameter). */
struct gctx {
    int hq, hkv, group, D, Dv, bs, window, mla;
    int H, L, R, P, V;
    double scale, cap;
    float scale_f, cap_f, kv_scale;
    ar_dtype dtype, kv_dtype, cd, pool_type;
    ar_datadist dist;
    unsigned long long seed;
    unsigned layer;
    int slot_layers;          /* layers per cache slot (MHA step-shared slots: the run's layers; else 1) */
    int pool_layer;           /* this layer's place in a slot (slot_layers == 1: 0) */
    int num_tokens, num_rows;
    const dreq *reqs;
    const drow *rows;
    const ditem *items;
    const int *slot_map;
    const int *miss_slot;
    const unsigned long long *miss_key;
    int nmiss;
    float *q;                 /* MHA [rows, Hq, D]; MLA [rows, H, P + R] = q_nope | q_pe */
    float *ql;                /* MLA [rows, H, L + R] = round(W_UK q_nope) | q_pe */
    const float *w_uk, *w_uv; /* MLA [L, H, P], [L, H, V] */
    void *pool_kv;            /* MHA [slots][2][bs][Hkv][D] of pool_type */
    double *pool_kn, *pool_v; /* MLA [slots][bs][H][P], [slots][bs][H][V] */
    float *pool_lat;          /* MLA [slots][bs][L + R] */
    double *S;                /* scores / P of the reference */
    double *O;                /* [vectors][Dv] of the reference */
    float *Snv;               /* MHA yardstick scores / P (fused path: own buffer; else S's float view) */
    float *Onv;               /* MHA yardstick [vectors][Dv] (fused path: own buffer; else O's float view) */
    float *olat;              /* MLA yardstick [vectors][L] */
    float *onv;               /* MLA yardstick [vectors][V] */
    double *stat;             /* [vectors][2] the reference's softmax statistics */
    double *stat_nv;          /* [vectors][2] the yardstick's (fused path: own buffer, both are live at
                                 once; else the same as stat) */
    float *mx_nv;             /* [vectors] the yardstick's score maximum (fused path) */
    int flash_ref;            /* 1: flash_ref_kernel makes the reference of the GEMM template's MHA problems
                                 (their scores, softmax and P.V products are skipped) */
    double *acc_o, *acc_l, *nv_o, *nv_l;   /* [rows][Hq][Dv], [rows][Hq] */
    double *pv_part;          /* fused P.V key splits: [split tiles][MB][Dv] the reference's partial sums */
    float *pv_part_nv;        /* [split tiles][MB][Dv] the yardstick's */
};

/* ---- small helpers ------------------------------------------------------------------------- */

/* The keys [lo, hi) of item it (indices into its chunk) that query position pos sees. */
__device__ __forceinline__ void visible(const gctx &c, const ditem &it, int pos, int *lo, int *hi)
{
    int a = 0, b = pos + 1 - it.k0;
    if (c.window > 0) {
        int s = pos - c.window + 1 - it.k0;
        if (s > a) a = s;
    }
    if (b > it.nkeys) b = it.nkeys;
    if (b < 0) b = 0;
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

/* Checked row and query head of vector m of problem p. */
template <int KIND>
__device__ __forceinline__ void vec_of(const gctx &c, const gprob &p, int m, int *row, int *head)
{
    const ditem &it = c.items[p.item];
    if (KIND == K_MHA_S_REF || KIND == K_MHA_PV_REF || KIND == K_MHA_S_NV || KIND == K_MHA_PV_NV) {
        *row = it.row0 + p.r0 + m / c.group;
        *head = p.head * c.group + m % c.group;
    } else if (KIND == K_MLA_S_NV || KIND == K_MLA_PV_NV) {
        *row = it.row0 + m / c.H;
        *head = m % c.H;
    } else {
        *row = it.row0 + m;
        *head = p.head;
    }
}

/* Pool token (slot * bs + offset) of key n of item it. */
__device__ __forceinline__ long long pool_token(const gctx &c, const ditem &it, int n)
{
    int pos = it.k0 + n;
    long long slot = c.slot_map[it.map0 + pos / c.bs - it.k0 / c.bs];
    return (slot * c.slot_layers + c.pool_layer) * c.bs + pos % c.bs;
}

__device__ __forceinline__ long long miss_token(const gctx &c, int m)
{
    return (long long)c.miss_slot[m / c.bs] * c.bs + m % c.bs;
}

__device__ __forceinline__ float round_f(ar_dtype t, float x) { return ar_round_to(t, x); }

/* ---- operands of each product ------------------------------------------------------------ */

/* Columns and reduction length of a product.  The P.V and W_UV products run over the score
 * products' problem lists, whose N is the item's keys and K the QK width. */
template <int KIND>
__device__ __forceinline__ int prod_n(const gctx &c, const gprob &p)
{
    switch (KIND) {
    case K_MHA_PV_REF:
    case K_MHA_PV_NV: return c.Dv;
    case K_MLA_PV_REF:
    case K_MLA_WUV: return c.V;
    case K_MLA_PV_NV: return c.L;
    case K_MLA_UP_K: return c.H * c.P;
    case K_MLA_UP_V: return c.H * c.V;
    default: return p.N;
    }
}

template <int KIND>
__device__ __forceinline__ int prod_k(const gctx &c, const gprob &p)
{
    switch (KIND) {
    case K_MHA_PV_REF:
    case K_MHA_PV_NV:
    case K_MLA_PV_REF:
    case K_MLA_PV_NV: return p.N;   /* the item's keys */
    case K_MLA_WUV:
    case K_MLA_UP_K:
    case K_MLA_UP_V: return c.L;
    default: return p.K;
    }
}

template <int KIND>
__device__ rowh a_handle(const gctx &c, const gprob &p, int m)
{
    rowh h = {-1, 0, NO_MASK};
    switch (KIND) {
    case K_MLA_QL:
        h.base = ((long long)m * c.H + p.head) * (c.P + c.R);
        return h;
    case K_MLA_UP_K:
    case K_MLA_UP_V:
        h.base = miss_token(c, m) * (c.L + c.R);
        return h;
    case K_MLA_WUV:
        h.base = (p.aux + (long long)m * c.H + p.head) * c.L;
        return h;
    default:
        break;
    }
    int row, head;
    vec_of<KIND>(c, p, m, &row, &head);
    const ditem &it = c.items[p.item];
    visible(c, it, c.rows[row].pos, &h.lo, &h.hi);
    switch (KIND) {
    case K_MHA_S_REF:
    case K_MHA_S_NV: h.base = ((long long)row * c.hq + head) * c.D; break;
    case K_MLA_S_REF: h.base = ((long long)row * c.H + head) * (c.P + c.R); break;
    case K_MLA_S_NV: h.base = ((long long)row * c.H + head) * (c.L + c.R); break;
    default: h.base = p.s_off + (long long)m * p.N; break;   /* P.V products: the row of P */
    }
    return h;
}

template <int KIND, typename T>
__device__ __forceinline__ T a_at(const gctx &c, const rowh &h, int k, int kmax)
{
    if (h.base < 0 || k >= kmax) return (T)0;
    switch (KIND) {
    case K_MHA_S_REF:
    case K_MHA_S_NV:
    case K_MLA_QL:
    case K_MLA_S_REF: return (T)c.q[h.base + k];
    case K_MLA_S_NV: return (T)c.ql[h.base + k];
    case K_MLA_UP_K:
    case K_MLA_UP_V: return (T)c.pool_lat[h.base + k];
    case K_MLA_WUV: return (T)c.olat[h.base + k];
    case K_MHA_PV_NV:
        if (k < h.lo || k >= h.hi) return (T)0;
        return (T)c.Snv[h.base + k];
    default:   /* K_MHA_PV_REF, K_MLA_PV_REF, K_MLA_PV_NV */
        if (k < h.lo || k >= h.hi) return (T)0;
        return (T)c.S[h.base + k];
    }
}

/* P as softmax_row stores it, made again from a score by the fused P.V kernel: exp(s - max) for the
 * reference; for the yardstick exp(s - max) / sum in float, rounded to the compute dtype (and
 * through fp8 for an fp8 run). */
/* The element type of the block pool and of the yardstick's roundings as the fused kernels see
 * it: DT_ANY reads c.pool_type and c.cd at run time (a switch per element); a dtype (AR_BF16) is a
 * run whose pool and compute types are both that dtype (so its queries too: never fp8), known at
 * compile time, the conversions and roundings inlined.  Same values either way. */
constexpr int DT_ANY = -1;
template <int DT>
__device__ __forceinline__ ar_dtype pool_dt(const gctx &c) { return DT == DT_ANY ? c.pool_type : (ar_dtype)DT; }
/* x rounded to the yardstick's compute type: for bf16 the hardware's round-to-nearest-even
 * conversion, the same value as ar_round_to's (a NaN may carry another payload) */
template <int DT>
__device__ __forceinline__ float round_cd(const gctx &c, float x)
{
    if (DT == AR_BF16) return __bfloat162float(__float2bfloat16_rn(x));
    return round_f(DT == DT_ANY ? c.cd : (ar_dtype)DT, x);
}

__device__ __forceinline__ double p_ref_of(double s, double mx) { return exp(s - mx); }

template <int DT = DT_ANY>
__device__ __forceinline__ float p_nv_of(const gctx &c, float s, float fmx, float fsum)
{
    const float e = exp(s - fmx);
    const float y = round_cd<DT>(c, (float)(e / fsum));
    return DT == DT_ANY && c.dtype == AR_FP8_E4M3 ? round_f(AR_FP8_E4M3, y) : y;   /* DT set: the queries are DT */
}

/* B handles: per column n (score products, the W_UK product of ql) or per row k (the rest). */
template <int KIND>
__device__ rowh b_handle(const gctx &c, const gprob &p, int idx)
{
    rowh h = {-1, 0, 0};
    switch (KIND) {
    case K_MLA_QL: h.base = ((long long)idx * c.H + p.head) * c.P; return h;            /* n = l */
    case K_MLA_UP_K: h.base = (long long)idx * c.H * c.P; return h;                      /* k = l */
    case K_MLA_UP_V: h.base = (long long)idx * c.H * c.V; return h;                      /* k = l */
    case K_MLA_WUV: h.base = ((long long)idx * c.H + p.head) * c.V; return h;           /* k = l */
    default: break;
    }
    const ditem &it = c.items[p.item];
    long long tok = pool_token(c, it, idx);   /* key idx of the item */
    switch (KIND) {
    case K_MHA_S_REF:
    case K_MHA_S_NV:   /* K: side 0 */
        h.base = (((tok / c.bs) * 2 * c.bs + tok % c.bs) * c.hkv + p.head) * (long long)c.D;
        break;
    case K_MHA_PV_REF:
    case K_MHA_PV_NV:  /* V: side 1 */
        h.base = (((tok / c.bs) * 2 * c.bs + c.bs + tok % c.bs) * c.hkv + p.head) * (long long)c.D;
        break;
    default: h.base = tok; break;   /* MLA: the pool token */
    }
    return h;
}

template <int KIND, typename T>
__device__ __forceinline__ T b_at(const gctx &c, const gprob &p, const rowh &h, int idx, int bound)
{
    if (h.base < 0 || idx >= bound) return (T)0;
    switch (KIND) {
    case K_MHA_S_REF:
    case K_MHA_PV_REF:
    case K_MHA_PV_NV: return (T)ar_load(c.pool_type, c.pool_kv, h.base + idx);
    case K_MHA_S_NV:   /* the yardstick's K scaled in the dtype: round(k * scale) */
        return (T)round_f(c.cd, __fmul_rn(ar_load(c.pool_type, c.pool_kv, h.base + idx), c.scale_f));
    case K_MLA_QL:
    case K_MLA_UP_K: return (T)c.w_uk[h.base + idx];
    case K_MLA_UP_V:
    case K_MLA_WUV: return (T)c.w_uv[h.base + idx];
    case K_MLA_S_REF:
        if (idx < c.P) return (T)c.pool_kn[(h.base * c.H + p.head) * c.P + idx];
        return (T)c.pool_lat[h.base * (c.L + c.R) + c.L + (idx - c.P)];
    case K_MLA_PV_REF: return (T)c.pool_v[(h.base * c.H + p.head) * c.V + idx];
    default: return (T)c.pool_lat[h.base * (c.L + c.R) + idx];   /* K_MLA_S_NV, K_MLA_PV_NV */
    }
}

template <int KIND, typename T>
__device__ __forceinline__ void store(const gctx &c, const gprob &p, int m, int n, T acc)
{
    switch (KIND) {
    case K_MHA_S_REF: {
        double s = c.scale * (double)acc;
        if (c.cap > 0) s = c.cap * tanh(s / c.cap);
        c.S[p.s_off + (long long)m * p.N + n] = s;
        break;
    }
    case K_MHA_S_NV: {   /* rounded score; soft cap as three rounded dtype ops */
        float sc = round_f(c.cd, (float)acc);
        if (c.cap_f > 0) {
            sc = round_f(c.cd, __fdiv_rn(sc, c.cap_f));
            sc = round_f(c.cd, tanhf(sc));
            sc = round_f(c.cd, __fmul_rn(sc, c.cap_f));
        }
        c.Snv[p.s_off + (long long)m * p.N + n] = sc;
        break;
    }
    case K_MHA_PV_REF: c.O[(p.v_off + m) * c.Dv + n] = (double)acc; break;
    case K_MLA_PV_REF: c.O[(p.v_off + m) * c.V + n] = (double)acc; break;
    case K_MHA_PV_NV: c.Onv[(p.v_off + m) * c.Dv + n] = round_f(c.cd, (float)acc); break;
    case K_MLA_QL: c.ql[((long long)m * c.H + p.head) * (c.L + c.R) + n] = round_f(c.dtype, (float)acc); break;
    case K_MLA_UP_K: c.pool_kn[miss_token(c, m) * c.H * c.P + n] = (double)acc; break;
    case K_MLA_UP_V: c.pool_v[miss_token(c, m) * c.H * c.V + n] = (double)acc; break;
    case K_MLA_S_REF:
    case K_MLA_S_NV: c.S[p.s_off + (long long)m * p.N + n] = c.scale * (double)acc; break;
    case K_MLA_PV_NV: c.olat[(p.v_off + m) * c.L + n] = round_f(c.dtype, (float)acc); break;
    default: c.onv[(p.aux + (long long)m * c.H + p.head) * c.V + n] = round_f(c.dtype, (float)acc); break;   /* WUV */
    }
}

/* ---- the GEMM template ----------------------------------------------------------------------- */

/* FP64 tensor-core product of one 8 x 4 by 4 x 8 fragment pair into an 8 x 8 accumulator
 * (mma.sync m8n8k4, sm_80 and later): lane = 4 g + t holds a = A[g][t], b = B[t][g] and
 * c = C[g][2t], C[g][2t + 1]. */
__device__ __forceinline__ void dmma_8x8x4(double &c0, double &c1, double a, double b)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};\n"
                 : "+d"(c0), "+d"(c1)
                 : "d"(a), "d"(b));
#else
    (void)c0; (void)c1; (void)a; (void)b;
    __trap();
#endif
}

/* Four consecutive elements from 16-byte-aligned shared memory: one float4 or two double2 loads. */
__device__ __forceinline__ void vec_load4(float *x, const float *at)
{
    const float4 v = *reinterpret_cast<const float4 *>(at);
    x[0] = v.x;
    x[1] = v.y;
    x[2] = v.z;
    x[3] = v.w;
}
__device__ __forceinline__ void vec_load4(double *x, const double *at)
{
    const double2 u = reinterpret_cast<const double2 *>(at)[0], v = reinterpret_cast<const double2 *>(at)[1];
    x[0] = u.x;
    x[1] = u.y;
    x[2] = v.x;
    x[3] = v.y;
}

/* Elements e0 .. e0 + 7 of the pool row at base (the first n of them; the rest, and all when
 * base < 0, are zero), converted to float as ar_load does: one 16-byte load (8-byte for fp8, two
 * for float) where the whole group is there and aligned, else element by element. */
template <int DT = DT_ANY>
__device__ __forceinline__ void load8(const gctx &c, long long base, int e0, int n, float *v)
{
    const long long i = base + e0;
    const ar_dtype pt = pool_dt<DT>(c);
    if (base >= 0 && n >= 8 && (i & 7) == 0) {
        if (pt == AR_BF16 || pt == AR_FP16) {
            const uint4 w = *reinterpret_cast<const uint4 *>((const uint16_t *)c.pool_kv + i);
            const uint16_t *h = reinterpret_cast<const uint16_t *>(&w);
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = ar_load(pt, h, u);
        } else if (pt == AR_FP8_E4M3) {
            const uint2 w = *reinterpret_cast<const uint2 *>((const uint8_t *)c.pool_kv + i);
            const uint8_t *b = reinterpret_cast<const uint8_t *>(&w);
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = ar_load(pt, b, u);
        } else {
            const float4 a = reinterpret_cast<const float4 *>((const float *)c.pool_kv + i)[0];
            const float4 b = reinterpret_cast<const float4 *>((const float *)c.pool_kv + i)[1];
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        }
        return;
    }
#pragma unroll
    for (int u = 0; u < 8; u++) v[u] = (base >= 0 && u < n) ? ar_load(pt, c.pool_kv, i + u) : 0.0f;
}

/* TC (float64 only, 64 x 64 tiles of 256 threads): the products on the FP64 tensor cores, each
 * warp a 32 x 16 block of the tile as 4 x 2 fragments of 8 x 8 (acc[i][2 j + h] is row
 * 8 i + g, column 8 j + 2 t + h of the warp's block); the sums then run in groups of four keys
 * inside the instruction instead of one fma per key, so they differ from the SIMT sums in the
 * last bits (ref_gpu.cu says where each is used). */
template <typename T, int KIND, int BM, int BN, int BK, int TM, int TN, bool B_PER_K, bool TC = false>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
gemm_kernel(gctx c, const gprob *probs, const int *mprefix, int nprobs)
{
    constexpr int NT = (BM / TM) * (BN / TN);
    constexpr int HB = B_PER_K ? 1 : BN;   /* per-column B handles (per-k ones: hbk below) */
    static_assert(!TC || (std::is_same<T, double>::value && BM == 64 && BN == 64 && TM == 4 && TN == 4 && BK % 4 == 0),
                  "the tensor-core tiles are 64 x 64 float64 with 256 threads");
    /* VEC: the SIMT 4 x 4 thread tiles read their TM a's and TN b's of each k with 16-byte
     * shared loads (rows padded to 16 bytes) instead of one load per element */
    constexpr bool VEC = AR_REF_GEMM_VEC && !TC && TM == 4 && TN == 4;
    /* TC: fragment reads of a warp hit 16 distinct 8-byte banks per half */
    constexpr int PAD = TC ? 4 : VEC ? 16 / (int)sizeof(T) : 1;
    __shared__ __align__(16) T As[BK][BM + PAD];
    __shared__ __align__(16) T Bs[BK][BN + PAD];
    __shared__ rowh ha[BM];
    __shared__ rowh hb[HB];
    __shared__ int s_lo, s_hi;
    const int tid = threadIdx.x;
    const int x = blockIdx.x;
    int lo = 0, hi = nprobs - 1;   /* the last problem whose first m-tile is <= x */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (mprefix[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    const gprob p = probs[lo];
    const int PN = prod_n<KIND>(c, p), PK = prod_k<KIND>(c, p);
    const int m0 = (x - mprefix[lo]) * BM, n0 = blockIdx.y * BN;
    if (n0 >= PN) return;
    for (int i = tid; i < BM; i += NT) {
        rowh h = {-1, 0, 0};
        if (m0 + i < p.M) h = a_handle<KIND>(c, p, m0 + i);
        ha[i] = h;
    }
    __syncthreads();
    if (tid == 0) {
        int l = INT_MAX, u = INT_MIN;
        for (int i = 0; i < BM; i++)
            if (ha[i].base >= 0 && ha[i].lo < ha[i].hi) {
                l = min(l, ha[i].lo);
                u = max(u, ha[i].hi);
            }
        s_lo = l;
        s_hi = u;
    }
    __syncthreads();
    if (s_lo >= s_hi) return;                 /* no row of the tile sees a key of this item */
    int klo = 0, khi = PK;
    if (!B_PER_K) {
        if (n0 >= s_hi || n0 + BN <= s_lo) return;   /* keys nobody here sees */
        for (int j = tid; j < BN; j += NT) {
            rowh h = {-1, 0, 0};
            if (n0 + j < PN) h = b_handle<KIND>(c, p, n0 + j);
            hb[j] = h;
        }
    } else {
        klo = max(0, s_lo) / BK * BK;
        khi = min(PK, s_hi);
    }
    const int tx = tid % (BN / TN), ty = tid / (BN / TN);
    constexpr bool SPLIT = pv_split_kind<KIND>::value;
    T acc[TM][TN], tot[SPLIT ? TM : 1][SPLIT ? TN : 1];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) acc[i][j] = (T)0;
    if (SPLIT) {
#pragma unroll
        for (int i = 0; i < (SPLIT ? TM : 1); i++)
#pragma unroll
            for (int j = 0; j < (SPLIT ? TN : 1); j++) tot[i][j] = (T)0;
    }
    /* The k loop is software-pipelined: tile t + 1 is read from global memory into registers
     * while tile t is multiplied out of shared memory, then stored there after a barrier (the
     * B handles of a per-k product are made a tile ahead, double-buffered).  The sums and their
     * order are those of the plain loop. */
    constexpr int AR = (BM * BK + NT - 1) / NT, BR = (BN * BK + NT - 1) / NT;
    __shared__ rowh hbk[2][B_PER_K ? BK : 1];
    T ra[AR], rb[BR];
    auto make_hb = [&](int k0, int buf) {
        if (B_PER_K)
            for (int j = tid; j < BK; j += NT) {
                rowh h = {-1, 0, 0};
                if (k0 + j < khi) h = b_handle<KIND>(c, p, k0 + j);
                hbk[buf][j] = h;
            }
    };
    auto load = [&](int k0, int buf) {
#pragma unroll
        for (int r = 0; r < AR; r++) {
            const int idx = tid + r * NT;
            if (AR * NT == BM * BK || idx < BM * BK) ra[r] = a_at<KIND, T>(c, ha[idx / BK], k0 + idx % BK, khi);
        }
#pragma unroll
        for (int r = 0; r < BR; r++) {
            const int idx = tid + r * NT;
            if (BR * NT != BN * BK && idx >= BN * BK) continue;
            if (!B_PER_K) rb[r] = b_at<KIND, T>(c, p, hb[idx / BK], k0 + idx % BK, khi);
            else rb[r] = b_at<KIND, T>(c, p, hbk[buf][idx / BN], n0 + idx % BN, PN);
        }
    };
    auto stash = [&]() {
#pragma unroll
        for (int r = 0; r < AR; r++) {
            const int idx = tid + r * NT;
            if (AR * NT == BM * BK || idx < BM * BK) As[idx % BK][idx / BK] = ra[r];
        }
#pragma unroll
        for (int r = 0; r < BR; r++) {
            const int idx = tid + r * NT;
            if (BR * NT != BN * BK && idx >= BN * BK) continue;
            if (!B_PER_K) Bs[idx % BK][idx / BK] = rb[r];
            else Bs[idx / BN][idx % BN] = rb[r];
        }
    };
    if (klo < khi) {
        make_hb(klo, 0);
        __syncthreads();
        load(klo, 0);
        stash();
        if (klo + BK < khi) make_hb(klo + BK, 1);
        __syncthreads();
    }
    for (int k0 = klo, t = 0; k0 < khi; k0 += BK, t++) {
        if (SPLIT && k0 != klo && k0 % PV_SPLIT == 0) {   /* a key split ends: add it to the total */
#pragma unroll
            for (int i = 0; i < (SPLIT ? TM : 1); i++)
#pragma unroll
                for (int j = 0; j < (SPLIT ? TN : 1); j++) {
                    tot[i][j] = tot[i][j] + acc[i][j];
                    acc[i][j] = (T)0;
                }
        }
        const bool more = k0 + BK < khi;
        if (more) load(k0 + BK, (t + 1) & 1);   /* in flight during the products below */
        if constexpr (TC) {
            const int lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
            const int wm = (warp & 1) * 32, wn = (warp >> 1) * 16;
#pragma unroll
            for (int kk = 0; kk < BK; kk += 4) {
                double a[4], bv[2];
#pragma unroll
                for (int i = 0; i < 4; i++) a[i] = As[kk + t4][wm + 8 * i + g8];
#pragma unroll
                for (int j = 0; j < 2; j++) bv[j] = Bs[kk + t4][wn + 8 * j + g8];
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 2; j++)
                        dmma_8x8x4(acc[i][2 * j], acc[i][2 * j + 1], a[i], bv[j]);
            }
        } else {
#pragma unroll
            for (int kk = 0; kk < BK; kk++) {
                T a[TM], bv[TN];
                if constexpr (VEC) {
                    vec_load4(a, &As[kk][ty * TM]);
                    vec_load4(bv, &Bs[kk][tx * TN]);
                } else {
#pragma unroll
                    for (int i = 0; i < TM; i++) a[i] = As[kk][ty * TM + i];
#pragma unroll
                    for (int j = 0; j < TN; j++) bv[j] = Bs[kk][tx * TN + j];
                }
#pragma unroll
                for (int i = 0; i < TM; i++)
#pragma unroll
                    for (int j = 0; j < TN; j++) acc[i][j] = fma(a[i], bv[j], acc[i][j]);
            }
        }
        __syncthreads();   /* tile t consumed */
        if (more) {
            stash();
            if (k0 + 2 * BK < khi) make_hb(k0 + 2 * BK, t & 1);   /* tile t's handles are free */
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; i++) {
        const int lane = tid & 31, warp = tid >> 5;
        int m = TC ? (warp & 1) * 32 + 8 * i + (lane >> 2) : ty * TM + i;
        if (m0 + m >= p.M) continue;
#pragma unroll
        for (int j = 0; j < TN; j++) {
            int n = n0 + (TC ? (warp >> 1) * 16 + 8 * (j >> 1) + 2 * (lane & 3) + (j & 1) : tx * TN + j);
            if (n < PN) store<KIND, T>(c, p, m0 + m, n, SPLIT ? tot[SPLIT ? i : 0][SPLIT ? j : 0] + acc[i][j] : acc[i][j]);
        }
    }
}

/* ---- per-vector kernels: one warp per vector ------------------------------------------------ */

/* The problem holding vector v (problems sorted by v_off) and v's index in it. */
__device__ __forceinline__ int find_vec(const gprob *probs, int nprobs, long long v, int *m)
{
    int lo = 0, hi = nprobs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (probs[mid].v_off <= v) lo = mid;
        else hi = mid - 1;
    }
    *m = (int)(v - probs[lo].v_off);
    return lo;
}

template <typename T>
__device__ __forceinline__ T warp_max(T x)
{
    for (int o = 16; o > 0; o >>= 1) x = max(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
template <typename T>
__device__ __forceinline__ T warp_sum(T x)
{
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* Softmax of one score row over its visible keys, in T.  MODE 0: float64 reference (stores
 * exp(s - max), stat = max, sum); 1: MHA yardstick (float; stores P rounded to the compute dtype,
 * and through fp8 for an fp8 run; stat = lse, sum; its max in mx_nv); 2: MLA yardstick (float64;
 * stores P rounded to the dtype; stat = lse).  NaN scores propagate as in the host code (max
 * ignores them; exp and the sum carry them).  FUSED (MHA, the check uses the fused kernels): a
 * problem on the fused path (fused_sized) gets the statistics only, its scores left as they are
 * (the fused P.V kernel makes P from them with the same operations: p_ref_of, p_nv_of); the
 * others, on the GEMM template, as above.  (Making P on the fly in the GEMM template's P.V too
 * was measured slower on the H200: every row of a mixed step 789 -> 938 ms, as each of its
 * column tiles makes every P element again.) */
template <typename T, int KIND, int MODE, bool FUSED = false>
__device__ void softmax_row(const gctx &c, const gprob *probs, int nprobs, long long v, int lane)
{
    int m;
    const gprob &p = probs[find_vec(probs, nprobs, v, &m)];
    int row, head, lo, hi;
    vec_of<KIND>(c, p, m, &row, &head);
    visible(c, c.items[p.item], c.rows[row].pos, &lo, &hi);
    double *st = (MODE == 0 ? c.stat : c.stat_nv) + 2 * v;
    if (lo >= hi) {
        if (lane == 0) {
            st[0] = -INFINITY;
            st[1] = 0;
        }
        return;
    }
    T *s = (MODE == 1 ? (T *)c.Snv : (T *)c.S) + p.s_off + (long long)m * p.N;
    if (MODE == 0 && FUSED && c.flash_ref && !fused_sized(p.M)) return;   /* flash_ref_kernel's vectors */
    const bool stats_only = FUSED && fused_sized(p.M);
    T mx = -INFINITY;
    for (int j = lo + lane; j < hi; j += 32) mx = max(mx, s[j]);
    mx = warp_max(mx);
    T sum = 0;
    for (int j = lo + lane; j < hi; j += 32) {
        T e = exp(s[j] - mx);
        if (!stats_only) s[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    if (MODE != 0 && !stats_only) {
        for (int j = lo + lane; j < hi; j += 32) {
            float pr = round_f(MODE == 1 ? c.cd : c.dtype, (float)(s[j] / sum));
            if (MODE == 1 && c.dtype == AR_FP8_E4M3) pr = round_f(AR_FP8_E4M3, pr);
            s[j] = (T)pr;
        }
    }
    if (lane == 0) {
        st[0] = MODE == 0 ? (double)mx : (double)(mx + log(sum));
        st[1] = (double)sum;
        if (MODE == 1 && c.mx_nv) c.mx_nv[v] = (float)mx;   /* the fused path's P.V kernel needs it */
    }
}

/* One warp per vector, grid-stride (a launch may cover more vectors than a grid has warps). */
template <int KIND, int MODE, bool FUSED>
__global__ void softmax_kernel(gctx c, const gprob *probs, int nprobs, long long nvec)
{
    const long long warps = (long long)gridDim.x * blockDim.x / 32;
    for (long long v = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; v < nvec; v += warps)
        softmax_row<typename std::conditional<MODE == 1, float, double>::type, KIND, MODE, FUSED>(c, probs, nprobs, v,
                                                                                                 threadIdx.x % 32);
}

/* ar_ref_merge of (ob, lb) into the running (oa, la), one warp, Dv elements; first: copy. */
__device__ __forceinline__ void merge_into(double *oa, double *la, int dv, bool first, bool empty, double lb,
                                           const double *ob, const float *obf, double ob_scale, int lane)
{
    if (first) {
        for (int e = lane; e < dv; e += 32)
            oa[e] = empty ? 0.0 : (ob ? ob[e] * ob_scale : (double)obf[e]);
        if (lane == 0) *la = empty ? -INFINITY : lb;
        return;
    }
    if (empty) lb = -INFINITY;
    double a = *la, b = lb;
    if (a == INFINITY) a = -INFINITY;
    if (b == INFINITY) b = -INFINITY;
    double mx = a > b ? a : b;
    if (mx == -INFINITY) {
        __syncwarp();
        if (lane == 0) *la = -INFINITY;
        return;
    }
    double wa = exp(a - mx), wb = exp(b - mx), total = wa + wb;
    double sa = wa / total, sb = wb / total;
    for (int e = lane; e < dv; e += 32) {
        double bv = empty ? 0.0 : (ob ? ob[e] * ob_scale : (double)obf[e]);
        oa[e] = __dadd_rn(__dmul_rn(oa[e], sa), __dmul_rn(bv, sb));
    }
    __syncwarp();
    if (lane == 0) *la = log(total) + mx;
}

/* Folds this chunk's result of every vector into the row's running result.  NV: the yardstick
 * (chunk outputs already rounded, float; stat[0] = lse), else the reference (O unnormalised,
 * stat = max, sum). */
template <int KIND, bool NV>
__device__ void fold_row(const gctx &c, const gprob *probs, int nprobs, long long v, int lane)
{
    int m;
    const gprob &p = probs[find_vec(probs, nprobs, v, &m)];
    int row, head, lo, hi;
    vec_of<KIND>(c, p, m, &row, &head);
    const ditem &it = c.items[p.item];
    visible(c, it, c.rows[row].pos, &lo, &hi);
    const bool empty = lo >= hi, first = it.chunk == 0;
    const long long at = (long long)row * c.hq + head;
    if (!NV) {
        double mx = c.stat[2 * v], sum = c.stat[2 * v + 1];
        merge_into(c.acc_o + at * c.Dv, c.acc_l + at, c.Dv, first, empty, empty ? 0 : mx + log(sum),
                   c.O + v * c.Dv, NULL, empty ? 0 : 1.0 / sum, lane);
    } else {
        const float *ob = c.mla ? c.onv + v * c.Dv : c.Onv + v * c.Dv;
        merge_into(c.nv_o + at * c.Dv, c.nv_l + at, c.Dv, first, empty, c.stat_nv[2 * v], NULL, ob, 1.0, lane);
    }
}

template <int KIND, bool NV>
__global__ void fold_kernel(gctx c, const gprob *probs, int nprobs, long long nvec)
{
    const long long warps = (long long)gridDim.x * blockDim.x / 32;
    for (long long v = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32; v < nvec; v += warps)
        fold_row<KIND, NV>(c, probs, nprobs, v, threadIdx.x % 32);
}

/* ---- inputs from the generator -------------------------------------------------------------- */

__global__ void gen_q_mha_kernel(gctx c)
{
    const int nch = (c.D + 7) / 8;
    long long total = (long long)c.num_rows * c.hq * nch;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        int ch = (int)(idx % nch);
        long long rh = idx / nch;
        int h = (int)(rh % c.hq), row = (int)(rh / c.hq);
        const drow rw = c.rows[row];
        uint64_t gr = ar_gen_row(c.seed, AR_STREAM_Q, c.layer, c.reqs[rw.r].req_key, (uint64_t)rw.pos, (uint32_t)h);
        for (int e = 0; e < 8; e++) {
            int d = ch * 8 + e;
            if (d < c.D) c.q[rh * c.D + d] = ar_gen(gr, (uint32_t)d, c.dist, c.dtype);
        }
    }
}

__global__ void gen_q_mla_kernel(gctx c)
{
    const int W = c.P + c.R, nch = (W + 7) / 8;
    long long total = (long long)c.num_rows * c.H * nch;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        int ch = (int)(idx % nch);
        long long rh = idx / nch;
        int h = (int)(rh % c.H), row = (int)(rh / c.H);
        const drow rw = c.rows[row];
        uint64_t key = c.reqs[rw.r].req_key;
        uint64_t rn = ar_gen_row(c.seed, AR_STREAM_Q_NOPE, c.layer, key, (uint64_t)rw.pos, (uint32_t)h);
        uint64_t rp = ar_gen_row(c.seed, AR_STREAM_Q_PE, c.layer, key, (uint64_t)rw.pos, (uint32_t)h);
        for (int e = 0; e < 8; e++) {
            int k = ch * 8 + e;
            if (k >= W) break;
            if (k < c.P) {
                c.q[rh * W + k] = ar_gen(rn, (uint32_t)k, c.dist, c.dtype);
            } else {
                float x = ar_gen(rp, (uint32_t)(k - c.P), c.dist, c.dtype);
                c.q[rh * W + k] = x;
                c.ql[rh * (c.L + c.R) + c.L + (k - c.P)] = x;
            }
        }
    }
}

/* Elements [8 ch, 8 ch + 8) of K (side 0) or V (side 1), KV head g, offset off of the block with
 * content key `key`, after the KV round trip, into pool slot `slot` (in slot units of one layer). */
__device__ __forceinline__ void gen_kv_chunk(const gctx &c, long long slot, int side, int off, int g, int ch,
                                             unsigned long long key)
{
    uint64_t gr = ar_gen_row(c.seed, side ? AR_STREAM_V : AR_STREAM_K, c.layer, key, (uint64_t)off, (uint32_t)g);
    long long base = (((slot * 2 + side) * c.bs + off) * c.hkv + g) * c.D;
    for (int e = 0; e < 8; e++) {
        int d = ch * 8 + e;
        if (d >= c.D) break;
        float x = ar_kv_roundtrip(c.kv_dtype, c.dtype, c.kv_scale, ar_gen(gr, (uint32_t)d, c.dist, c.dtype));
        ar_store(c.pool_type, c.pool_kv, base + d, x);
    }
}

/* MHA: K and V of the missed blocks after the KV round trip, in pool_type. */
__global__ void gen_pool_mha_kernel(gctx c)
{
    const int nch = (c.D + 7) / 8;
    long long total = (long long)c.nmiss * c.bs * c.hkv * nch;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        int ch = (int)(idx % nch);
        long long rest = idx / nch;
        int g = (int)(rest % c.hkv);
        rest /= c.hkv;
        int off = (int)(rest % c.bs), i = (int)(rest / c.bs);
        long long slot = c.miss_slot[i];
        uint64_t key = c.miss_key[i];
        for (int side = 0; side < 2; side++) gen_kv_chunk(c, slot, side, off, g, ch, key);
    }
}

/* MHA with step-shared slots: layer c.layer of the blocks a group reads (uslot / ukey [n], each
 * slot once), made unless the slot already holds it.  Per slot the device keeps the content key
 * it holds and a mask of the layers made for that content (mask_words words): a slot given new
 * content starts with an empty mask.  One CTA per slot, the mask written after the block. */
__global__ void gen_slots_mha_kernel(gctx c, const int *uslot, const unsigned long long *ukey, int n,
                                     unsigned long long *content, unsigned long long *mask, int mask_words)
{
    const int nch = (c.D + 7) / 8;
    const int w = (int)(c.layer / 64);
    const unsigned long long bit = 1ull << (c.layer % 64);
    for (int i = blockIdx.x; i < n; i += gridDim.x) {
        const int slot = uslot[i];
        const unsigned long long key = ukey[i];
        unsigned long long *mk = mask + (long long)slot * mask_words;
        const bool same = content[slot] == key;
        if (same && (mk[w] & bit)) continue;   /* the same for every thread of the CTA */
        const long long vslot = (long long)slot * c.slot_layers + c.pool_layer;
        const int rows_total = 2 * c.bs * c.hkv;
        for (int idx = threadIdx.x; idx < rows_total * nch; idx += blockDim.x) {
            const int ch = idx % nch, rowi = idx / nch;
            const int g = rowi % c.hkv, off = (rowi / c.hkv) % c.bs, side = rowi / (c.hkv * c.bs);
            gen_kv_chunk(c, vslot, side, off, g, ch, key);
        }
        __syncthreads();   /* every read of the mask and every write of the block done */
        if (threadIdx.x == 0) {
            if (!same) {
                for (int k = 0; k < mask_words; k++) mk[k] = 0;
                content[slot] = key;
            }
            mk[w] |= bit;
        }
        __syncthreads();
    }
}

/* MLA: the latent entries of the missed blocks after the KV round trip. */
__global__ void gen_pool_lat_kernel(gctx c)
{
    const int E = c.L + c.R, nch = (E + 7) / 8;
    long long total = (long long)c.nmiss * c.bs * nch;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        int ch = (int)(idx % nch);
        long long rest = idx / nch;
        int off = (int)(rest % c.bs), i = (int)(rest / c.bs);
        uint64_t gr = ar_gen_row(c.seed, AR_STREAM_LATENT, c.layer, c.miss_key[i], (uint64_t)off, 0);
        long long base = ((long long)c.miss_slot[i] * c.bs + off) * E;
        for (int e = 0; e < 8; e++) {
            int k = ch * 8 + e;
            if (k >= E) break;
            c.pool_lat[base + k] = ar_kv_roundtrip(c.kv_dtype, c.dtype, c.kv_scale, ar_gen(gr, (uint32_t)k, c.dist, c.dtype));
        }
    }
}

/* MLA: one layer's W_UK [L, H, P] and W_UV [L, H, V] (ar_mla_weight). */
__global__ void gen_weights_kernel(float *w, int L, int H, int width, uint32_t stream, uint64_t seed, uint32_t layer,
                                   ar_datadist dist, ar_dtype dtype)
{
    long long total = (long long)L * H * width;
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        int col = (int)(idx % width);
        long long lh = idx / width;
        int h = (int)(lh % H), l = (int)(lh / H);
        w[idx] = ar_mla_weight(seed, stream, layer, L, l, h, col, dist, dtype);
    }
}

__global__ void init_acc_kernel(double *o, double *l, long long n_out, long long n_lse)
{
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_out; i += (long long)gridDim.x * blockDim.x) {
        o[i] = 0;
        if (i < n_lse) l[i] = -INFINITY;
    }
}

/* ---- comparison and reduction ------------------------------------------------------------ */

struct wentry {
    double err, got, want;
    long long idx;            /* (row * Hq + head) * Dv + dim: the host's insertion order */
};

struct part {
    double sum_abs, sum_sq_err, sum_sq_ref, naive_sum;
    double max_abs, max_rel, lse_max, naive_max, naive_lse_max;
    long long bad, elems;
    int nworst, pad;
    wentry w[AR_GPU_REF_WORST];
};

struct dsum {
    part total;
    unsigned long long nan;
};

/* a before b in the worst list: larger error first, then the earlier element */
__device__ __forceinline__ bool better(double ea, long long ia, double eb, long long ib)
{
    return ea > eb || (ea == eb && ia < ib);
}

__device__ void worst_insert(wentry *w, int *n, const wentry &x)
{
    if (*n == AR_GPU_REF_WORST && !better(x.err, x.idx, w[AR_GPU_REF_WORST - 1].err, w[AR_GPU_REF_WORST - 1].idx))
        return;
    int i = *n < AR_GPU_REF_WORST ? (*n)++ : AR_GPU_REF_WORST - 1;
    while (i > 0 && better(x.err, x.idx, w[i - 1].err, w[i - 1].idx)) {
        w[i] = w[i - 1];
        i--;
    }
    w[i] = x;
}

__device__ __forceinline__ double lse_diff(double a, double b)
{
    if (isinf(a) && isinf(b) && (a < 0) == (b < 0)) return 0;
    double d = fabs(a - b);
    return isnan(d) ? INFINITY : d;
}

struct cmp_args {
    const void *out;
    ar_dtype out_type;
    const float *lse;
    double atol, rtol;
    part *parts;
};

constexpr int CMP_THREADS = 256;

/* Element by element as replay/verify.c's compare_rows; one partial per block. */
__global__ void __launch_bounds__(CMP_THREADS) compare_kernel(gctx c, cmp_args a)
{
    __shared__ double sh_d[CMP_THREADS / 32][9];
    __shared__ long long sh_l[CMP_THREADS / 32][2];
    __shared__ wentry sh_w[CMP_THREADS / 32][AR_GPU_REF_WORST];
    __shared__ int sh_n[CMP_THREADS / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    double sum_abs = 0, sum_sq_err = 0, sum_sq_ref = 0, naive_sum = 0;
    double max_abs = 0, max_rel = 0, lse_max = 0, naive_max = 0, naive_lse_max = 0;
    long long bad = 0, elems = 0;
    wentry w[AR_GPU_REF_WORST];
    int nw = 0;
    const long long per_row = (long long)c.hq * c.Dv, total = (long long)c.num_rows * per_row;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        int row = (int)(i / per_row), rem = (int)(i % per_row);
        int h = rem / c.Dv, e = rem % c.Dv;
        int t = c.rows[row].t;
        double got = ar_load(a.out_type, a.out, ((long long)t * c.hq + h) * c.Dv + e);
        double want = c.acc_o[i];
        double naive = ar_round_to(c.dtype, (float)c.nv_o[i]);
        double err = fabs(got - want);
        if (isnan(err)) err = INFINITY;
        double ne = fabs(naive - want);
        elems++;
        sum_abs += err;
        sum_sq_err += err * err;
        sum_sq_ref += want * want;
        naive_sum += ne;
        if (ne > naive_max) naive_max = ne;
        double rel = err / (fabs(want) > 1e-3 ? fabs(want) : 1e-3);
        if (rel > max_rel) max_rel = rel;
        if (err > a.atol + a.rtol * fabs(want)) bad++;
        if (err > max_abs) max_abs = err;
        wentry x = {err, got, want, i};
        worst_insert(w, &nw, x);
        if (e == 0) {
            long long at = (long long)row * c.hq + h;
            double gl = a.lse[(long long)h * c.num_tokens + t], rl = c.acc_l[at];
            double le = lse_diff(gl, rl), nle = lse_diff(c.nv_l[at], rl);
            if (le > lse_max) lse_max = le;
            if (nle > naive_lse_max) naive_lse_max = nle;
        }
    }
    /* sums and maxima: warp butterflies, then the block's warps in order */
    double d[9] = {sum_abs, sum_sq_err, sum_sq_ref, naive_sum, max_abs, max_rel, lse_max, naive_max, naive_lse_max};
    for (int k = 0; k < 4; k++) d[k] = warp_sum(d[k]);
    for (int k = 4; k < 9; k++) d[k] = warp_max(d[k]);
    bad = warp_sum(bad);
    elems = warp_sum(elems);
    /* worst: 8 rounds of a warp arg-best over each lane's list head */
    int head = 0;
    for (int round = 0; round < AR_GPU_REF_WORST; round++) {
        double be = head < nw ? w[head].err : -1.0;
        long long bi = head < nw ? w[head].idx : LLONG_MAX;
        double bg = head < nw ? w[head].got : 0, bw = head < nw ? w[head].want : 0;
        for (int o = 16; o > 0; o >>= 1) {
            double oe = __shfl_xor_sync(0xffffffffu, be, o);
            long long oi = __shfl_xor_sync(0xffffffffu, bi, o);
            double og = __shfl_xor_sync(0xffffffffu, bg, o), ow = __shfl_xor_sync(0xffffffffu, bw, o);
            if (better(oe, oi, be, bi)) {
                be = oe;
                bi = oi;
                bg = og;
                bw = ow;
            }
        }
        if (head < nw && w[head].idx == bi) head++;
        if (lane == 0) {
            if (be >= 0) sh_w[warp][round] = wentry{be, bg, bw, bi};
            if (be >= 0) sh_n[warp] = round + 1;
            else if (round == 0) sh_n[warp] = 0;
        }
        if (be < 0) break;
    }
    if (lane == 0) {
        for (int k = 0; k < 9; k++) sh_d[warp][k] = d[k];
        sh_l[warp][0] = bad;
        sh_l[warp][1] = elems;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        part pt;
        memset(&pt, 0, sizeof pt);
        for (int wi = 0; wi < CMP_THREADS / 32; wi++) {
            pt.sum_abs += sh_d[wi][0];
            pt.sum_sq_err += sh_d[wi][1];
            pt.sum_sq_ref += sh_d[wi][2];
            pt.naive_sum += sh_d[wi][3];
            pt.max_abs = fmax(pt.max_abs, sh_d[wi][4]);
            pt.max_rel = fmax(pt.max_rel, sh_d[wi][5]);
            pt.lse_max = fmax(pt.lse_max, sh_d[wi][6]);
            pt.naive_max = fmax(pt.naive_max, sh_d[wi][7]);
            pt.naive_lse_max = fmax(pt.naive_lse_max, sh_d[wi][8]);
            pt.bad += sh_l[wi][0];
            pt.elems += sh_l[wi][1];
            for (int k = 0; k < sh_n[wi]; k++) worst_insert(pt.w, &pt.nworst, sh_w[wi][k]);
        }
        a.parts[blockIdx.x] = pt;
    }
}

/* p folded into t: sums added, maxima kept (a NaN max_abs sticks), worst lists merged. */
__device__ void fold_part(part &t, const part &p)
{
    t.sum_abs += p.sum_abs;
    t.sum_sq_err += p.sum_sq_err;
    t.sum_sq_ref += p.sum_sq_ref;
    t.naive_sum += p.naive_sum;
    if (p.max_abs > t.max_abs || isnan(p.max_abs)) t.max_abs = p.max_abs;
    if (p.max_rel > t.max_rel) t.max_rel = p.max_rel;
    if (p.lse_max > t.lse_max) t.lse_max = p.lse_max;
    if (p.naive_max > t.naive_max) t.naive_max = p.naive_max;
    if (p.naive_lse_max > t.naive_lse_max) t.naive_lse_max = p.naive_lse_max;
    t.bad += p.bad;
    t.elems += p.elems;
    for (int k = 0; k < p.nworst; k++) worst_insert(t.w, &t.nworst, p.w[k]);
}

/* The block partials in a fixed order: lane l of one warp folds partials l, l + 32, ... in turn,
 * then lane 0 the 32 lanes' in lane order (a lone thread over a few hundred partials took most of
 * a sampled check's comparison time). */
__global__ void __launch_bounds__(32) reduce_kernel(const part *parts, int nparts, dsum *out)
{
    __shared__ part lanes[32];
    const int lane = threadIdx.x;
    part t;
    memset(&t, 0, sizeof t);
    for (int i = lane; i < nparts; i += 32) fold_part(t, parts[i]);
    lanes[lane] = t;
    __syncwarp();
    if (lane != 0) return;
    part u;
    memset(&u, 0, sizeof u);
    for (int l = 0; l < 32; l++) fold_part(u, lanes[l]);
    out->total = u;
}

/* NaN/Inf anywhere in the output, NaN/+Inf anywhere in the LSE (integer counts: exact). */
__global__ void nan_kernel(const void *out, ar_dtype out_type, long long n_out, const float *lse, long long n_lse,
                           unsigned long long *count)
{
    unsigned long long bad = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_out + n_lse;
         i += (long long)gridDim.x * blockDim.x) {
        if (i < n_out) {
            if (!isfinite(ar_load(out_type, out, i))) bad++;
        } else {
            float x = lse[i - n_out];
            if (isnan(x) || x == INFINITY) bad++;
        }
    }
    bad = warp_sum(bad);
    if (threadIdx.x % 32 == 0 && bad) atomicAdd(count, bad);
}

} /* namespace argpu */

#endif
