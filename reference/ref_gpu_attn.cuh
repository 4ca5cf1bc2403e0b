/* ref_gpu_attn.cuh - the device reference's attention kernels for MHA on the fused check
 * (ref_gpu.cu's opening comment describes the whole computation): the fused path, which makes
 * the float64 reference and the float yardstick of requests with few checked rows (decodes,
 * sampled rows) in one read of K and one of V, and the flash reference, which makes the float64
 * reference of a prefill chunk checked row by row in one pass over its keys on the FP64 tensor
 * cores.  Built on ref_gpu_kernels.cuh's step data, operand handles and helpers; included once,
 * by ref_gpu.cu, after it. */
#ifndef AR_REF_GPU_ATTN_CUH
#define AR_REF_GPU_ATTN_CUH

namespace argpu {

/* ---- the fused path (MHA): reference and yardstick in one pass over K and over V ---------- */

/* Problems of at most SK_MAXM vectors (row blocks of a few checked rows x the query heads of one
 * KV head).  Scores: one CTA per (problem, sk_tile keys), sk_tile / SK_KEYS keys per thread; K is staged through
 * shared memory SK_DC head dims at a time and each element feeds both the float64 dot products
 * and the yardstick's float ones (its K scaled and rounded in the dtype), k ascending with one
 * fma per element: the very operations of the GEMM template, so the scores are bit-identical to
 * it.  Between them the softmax kernels compute only the statistics (max, sum; the scores stay).
 * P.V: one CTA per (problem, key split of PV_SPLIT keys), one thread per output dim (two for
 * Dv > 128), keys ascending in one accumulator per output; P of both twins is made while staged,
 * from the scores and the statistics with the softmax kernel's very operations (exp(s - max); the
 * yardstick's exp(s - max) / sum rounded), PV_KT keys of V staged too.  A problem of one split
 * stores its sums at once; the splits of a longer one go to the partial buffers and
 * fused_pv_combine_kernel adds them in order: again the GEMM template's sums exactly (it folds
 * at the same boundaries), without writing P back.  The pass rule's yardstick thus keeps its roundings; only the reads
 * and the index work are shared.  Runs in bf16 (pool, queries and yardstick) take instances with the
 * type compiled in (DT = AR_BF16: each thread's 16-byte loads of K or V all issued before the first
 * is staged, the conversions and the yardstick's bf16 roundings in the hardware's instructions, one
 * output dim a thread); any other type the generic ones (DT_ANY).  Same values either way.
 *
 * Which requests take it: those of at most FUSED_MAX_ROWS checked rows (decodes, sampled rows);
 * a request of more (a prefill chunk checked row by row) takes the GEMM template, whose 64 x 64
 * tiles read each key once for 64 vectors of its dense rows against SK_MAXM here (measured on an
 * H200 at llama-3.1-8b shapes: a prefill of 8192 rows, every row, 1.26x faster on the GEMM
 * template; 128 decodes 1.6x faster here, a mixed step with 64 rows sampled, about 31 per
 * prefill chunk spread thin over it, 1.5x).  Both kinds of problem may share a group: the twins'
 * score buffers are separate, each problem's softmax does what its path needs. */
constexpr int FUSED_MAX_ROWS = 64;
constexpr int SK_KEYS = 128;   /* threads of a scores CTA */
/* Keys of a scores CTA for problems of up to MB vectors (sk_tile / SK_KEYS per thread): 256, 128
 * for the widest bucket (its 2 x 16 accumulators a key would hold too many registers) */
__host__ __device__ constexpr int sk_tile(int MB) { return MB >= 16 ? 128 : 256; }
constexpr int SK_DC = 32;
constexpr int SK_BUCKETS = 3;   /* fused lists by M: up to 4, 8, SK_MAXM */
constexpr int PV_THREADS = 128;
constexpr int PV_KT = 32;

/* The last problem whose first tile is <= x. */
__device__ __forceinline__ int find_tile(const int *prefix, int n, int x)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (prefix[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Both twins' multiply-adds of one operand pair into MB accumulators each: accd[m] += ad[m] xd and
 * accf[m] += af[m] xf, one fma per accumulator, ad and af read from shared memory 16 bytes at a
 * time (16-byte aligned rows, MB a multiple of 4). */
template <int MB>
__device__ __forceinline__ void fma_twins(double *accd, float *accf, const double *ad, const float *af, double xd, float xf)
{
#pragma unroll
    for (int m0 = 0; m0 < MB; m0 += 4) {
        double a[4];
        float f[4];
        vec_load4(a, ad + m0);
        vec_load4(f, af + m0);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            accd[m0 + i] = fma(a[i], xd, accd[m0 + i]);
            accf[m0 + i] = fmaf(f[i], xf, accf[m0 + i]);
        }
    }
}

/* 16-bit pool (bf16 here): the raw bits of elements e0 .. e0 + 7 of the row at base (zeros when
 * base < 0 or !there), one 16-byte load; and those bits as floats. */
__device__ __forceinline__ uint4 load8_bits(const gctx &c, long long base, int e0, bool there)
{
    if (base < 0 || !there) return make_uint4(0, 0, 0, 0);
    return *reinterpret_cast<const uint4 *>((const uint16_t *)c.pool_kv + base + e0);
}
__device__ __forceinline__ void bf16x8_to_float(uint4 w, float *v)
{
    const unsigned x[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int u = 0; u < 4; u++) {
        v[2 * u] = __uint_as_float(x[u] << 16);
        v[2 * u + 1] = __uint_as_float(x[u] & 0xffff0000u);
    }
}

template <int MB, int DT>
__global__ void __launch_bounds__(SK_KEYS, MB <= 4 ? 6 : 4) fused_scores_kernel(gctx c, const gprob *probs, const int *tprefix, int nprobs)
{
    constexpr int SK_TILE = sk_tile(MB);
    constexpr int KPT = SK_TILE / SK_KEYS;   /* keys per thread: each staged q element feeds KPT keys */
    constexpr int LPT = SK_TILE * (SK_DC / 8) / SK_KEYS;   /* 8-element K loads per thread and dim chunk */
    constexpr int UNROLL = MB <= 4 ? 8 : MB <= 8 ? 4 : 2;   /* of the dim loop (registers) */
    static_assert(MB % 4 == 0 && SK_DC % 8 == 0, "16-byte shared reads of the queries, 8-element K loads");
    __shared__ __align__(16) double qd[SK_DC][MB];
    __shared__ __align__(16) float qf[SK_DC][MB];
    __shared__ float ks[SK_TILE][SK_DC + 1];
    __shared__ long long kb[SK_TILE];
    __shared__ long long qb[MB];
    __shared__ int s_lo, s_hi;
    const int tid = threadIdx.x;
    const int pi = find_tile(tprefix, nprobs, (int)blockIdx.x);
    const gprob p = probs[pi];
    const ditem &it = c.items[p.item];
    const int n0 = ((int)blockIdx.x - tprefix[pi]) * SK_TILE;
    if (tid < MB) {
        long long base = -1;
        if (tid < p.M) {
            int row, head;
            vec_of<K_MHA_S_REF>(c, p, tid, &row, &head);
            base = ((long long)row * c.hq + head) * c.D;
        }
        qb[tid] = base;
    }
    if (tid == 0) {
        int l = INT_MAX, u = INT_MIN;
        for (int m = 0; m < p.M; m++) {
            int row, head, lo, hi;
            vec_of<K_MHA_S_REF>(c, p, m, &row, &head);
            visible(c, it, c.rows[row].pos, &lo, &hi);
            if (lo < hi) {
                l = min(l, lo);
                u = max(u, hi);
            }
        }
        s_lo = l;
        s_hi = u;
    }
    __syncthreads();
    if (s_lo >= s_hi || n0 >= s_hi || n0 + SK_TILE <= s_lo) return;   /* keys nobody here sees */
    for (int j = tid; j < SK_TILE; j += SK_KEYS) {
        long long base = -1;
        if (n0 + j < p.N) {
            long long tok = pool_token(c, it, n0 + j);
            base = (((tok / c.bs) * 2 * c.bs + tok % c.bs) * c.hkv + p.head) * (long long)c.D;   /* K: side 0 */
        }
        kb[j] = base;
    }
    double accd[KPT][MB];
    float accf[KPT][MB];
#pragma unroll
    for (int u = 0; u < KPT; u++)
#pragma unroll
        for (int m = 0; m < MB; m++) {
            accd[u][m] = 0;
            accf[u][m] = 0;
        }
    for (int d0 = 0; d0 < c.D; d0 += SK_DC) {
        const int ne = min(SK_DC, c.D - d0);
        __syncthreads();   /* kb / qb written; the previous dims consumed */
        for (int idx = tid; idx < SK_DC * MB; idx += SK_KEYS) {
            const int e = idx / MB, m = idx % MB;
            const float v = (qb[m] >= 0 && e < ne) ? c.q[qb[m] + d0 + e] : 0.0f;
            qd[e][m] = (double)v;
            qf[e][m] = v;
        }
        if (DT == AR_BF16 && c.D % 8 == 0) {   /* all of a thread's loads in flight before the first store */
            uint4 w[LPT];
#pragma unroll
            for (int r = 0; r < LPT; r++) {
                const int idx = tid + r * SK_KEYS, e = idx % (SK_DC / 8) * 8, j = idx / (SK_DC / 8);
                w[r] = load8_bits(c, kb[j], d0 + e, e < ne);
            }
#pragma unroll
            for (int r = 0; r < LPT; r++) {
                const int idx = tid + r * SK_KEYS, e = idx % (SK_DC / 8) * 8, j = idx / (SK_DC / 8);
                float k8[8];
                bf16x8_to_float(w[r], k8);
#pragma unroll
                for (int u = 0; u < 8; u++) ks[j][e + u] = k8[u];
            }
        } else {
            for (int idx = tid; idx < SK_TILE * (SK_DC / 8); idx += SK_KEYS) {
                const int e = idx % (SK_DC / 8) * 8, j = idx / (SK_DC / 8);
                float k8[8];
                load8<DT>(c, kb[j], d0 + e, ne - e, k8);
#pragma unroll
                for (int u = 0; u < 8; u++) ks[j][e + u] = k8[u];
            }
        }
        __syncthreads();
        auto dim = [&](int e) {
            double kd[KPT];
            float kf[KPT];
#pragma unroll
            for (int u = 0; u < KPT; u++) {
                const float k = ks[tid + u * SK_KEYS][e];
                kd[u] = (double)k;
                kf[u] = __fmul_rn(k, c.scale_f);
            }
            /* the yardstick's round(k * scale); bf16: two keys in one packed conversion */
            if (DT == AR_BF16 && KPT % 2 == 0) {
#pragma unroll
                for (int u = 0; u < KPT; u += 2) {
                    const __nv_bfloat162 r = __floats2bfloat162_rn(kf[u], kf[u + 1]);
                    kf[u] = __low2float(r);
                    kf[u + 1] = __high2float(r);
                }
            } else {
#pragma unroll
                for (int u = 0; u < KPT; u++) kf[u] = round_cd<DT>(c, kf[u]);
            }
#pragma unroll
            for (int u = 0; u < KPT; u++) fma_twins<MB>(accd[u], accf[u], qd[e], qf[e], kd[u], kf[u]);
        };
        if (ne == SK_DC) {
#pragma unroll(UNROLL)
            for (int e = 0; e < SK_DC; e++) dim(e);
        } else {
            for (int e = 0; e < ne; e++) dim(e);
        }
    }
#pragma unroll
    for (int u = 0; u < KPT; u++) {
        const int n = n0 + tid + u * SK_KEYS;
        if (n >= p.N) continue;
#pragma unroll
        for (int m = 0; m < MB; m++)
            if (m < p.M) {
                store<K_MHA_S_REF, double>(c, p, m, n, accd[u][m]);
                store<K_MHA_S_NV, float>(c, p, m, n, accf[u][m]);
            }
    }
}

/* Splits of problem p: its keys in PV_SPLIT pieces (at least one). */
__host__ __device__ __forceinline__ int pv_splits(int N) { return N > PV_SPLIT ? (N + PV_SPLIT - 1) / PV_SPLIT : 1; }

/* Shared memory of a fused P.V CTA besides P: V of PV_KT keys, rows of vs_stride floats (Dv
 * rounded up to 8). */
__host__ __device__ __forceinline__ int pv_vs_stride(int Dv) { return (Dv + 7) / 8 * 8; }

template <int MB, int DT>
__global__ void __launch_bounds__(PV_THREADS) fused_pv_kernel(gctx c, const gprob *probs, const int *sprefix, int nprobs)
{
    static_assert(MB % 4 == 0, "16-byte shared reads of P");
    constexpr int VPT = PV_KT * (PV_THREADS / 8) / PV_THREADS;   /* 8-element V loads per thread, Dv <= PV_THREADS */
    __shared__ __align__(16) double pd[PV_KT][MB];
    __shared__ __align__(16) float pf[PV_KT][MB];
    extern __shared__ __align__(16) float vs_raw[];   /* [PV_KT][vs_stride]: V of PV_KT keys */
    const int vs_stride = pv_vs_stride(c.Dv);
    __shared__ long long vb[PV_KT];
    __shared__ int vlo[MB], vhi[MB];
    __shared__ long long prow[MB];
    __shared__ double smx[MB];                    /* the reference's row maximum */
    __shared__ float fmx[MB], fsum[MB];           /* the yardstick's maximum and sum */
    const int tid = threadIdx.x;
    const int pi = find_tile(sprefix, nprobs, (int)blockIdx.x);
    const gprob p = probs[pi];
    const ditem &it = c.items[p.item];
    const int split = (int)blockIdx.x - sprefix[pi], nsplit = sprefix[pi + 1] - sprefix[pi];
    const int s0 = split * PV_SPLIT, s1 = min(p.N, s0 + PV_SPLIT);   /* this CTA's keys */
    if (tid < MB) {
        int lo = 0, hi = 0;
        long long at = 0;
        if (tid < p.M) {
            int row, head;
            vec_of<K_MHA_PV_REF>(c, p, tid, &row, &head);
            visible(c, it, c.rows[row].pos, &lo, &hi);
            at = p.s_off + (long long)tid * p.N;
            const long long v = p.v_off + tid;
            smx[tid] = c.stat[2 * v];
            fmx[tid] = c.mx_nv[v];
            fsum[tid] = (float)c.stat_nv[2 * v + 1];
        }
        vlo[tid] = lo;
        vhi[tid] = hi;
        prow[tid] = at;
    }
    __syncthreads();
    int klo = INT_MAX, khi = INT_MIN;
    for (int m = 0; m < MB; m++)
        if (vlo[m] < vhi[m]) {
            klo = min(klo, vlo[m]);
            khi = max(khi, vhi[m]);
        }
    klo = max(klo, s0);
    khi = min(khi, s1);
    /* no vector sees a key of this chunk: the fold treats them as empty (one split: nothing to
     * store; several: this split's partial sums are zero) */
    if (klo >= khi && nsplit == 1) return;
    constexpr int ND = DT == DT_ANY ? 2 : 1;   /* output dims a thread (the typed kernels: Dv <= PV_THREADS) */
    double ad[ND][MB];
    float af[ND][MB];
#pragma unroll
    for (int dd = 0; dd < ND; dd++)
#pragma unroll
        for (int m = 0; m < MB; m++) {
            ad[dd][m] = 0;
            af[dd][m] = 0;
        }
    for (int k0 = klo; k0 < khi; k0 += PV_KT) {
        const int nk = min(PV_KT, khi - k0);
        __syncthreads();   /* the previous keys consumed */
        for (int idx = tid; idx < PV_KT * MB; idx += PV_THREADS) {
            const int m = idx / PV_KT, j = idx % PV_KT, n = k0 + j;   /* a row of P per warp: coalesced */
            double x = 0;
            float y = 0;
            if (j < nk && n >= vlo[m] && n < vhi[m]) {
                /* P as softmax_row would have stored it (p_ref_of, p_nv_of) */
                x = p_ref_of(c.S[prow[m] + n], smx[m]);
                y = p_nv_of<DT>(c, c.Snv[prow[m] + n], fmx[m], fsum[m]);
            }
            pd[j][m] = x;
            pf[j][m] = y;
        }
        for (int j = tid; j < nk; j += PV_THREADS) {
            const long long tok = pool_token(c, it, k0 + j);
            vb[j] = (((tok / c.bs) * 2 * c.bs + c.bs + tok % c.bs) * c.hkv + p.head) * (long long)c.D;   /* V: side 1 */
        }
        __syncthreads();
        const int g8 = vs_stride / 8;   /* 8-element loads per key (Dv <= 2 x PV_THREADS here) */
        auto stage = [&](int idx, const float *v8) {
            const int j = idx / g8, d = idx % g8 * 8;
            *reinterpret_cast<float4 *>(&vs_raw[j * vs_stride + d]) = make_float4(v8[0], v8[1], v8[2], v8[3]);
            *reinterpret_cast<float4 *>(&vs_raw[j * vs_stride + d + 4]) = make_float4(v8[4], v8[5], v8[6], v8[7]);
        };
        if (DT == AR_BF16 && c.Dv == PV_THREADS && c.D % 8 == 0) {   /* all loads in flight at once (aligned rows) */
            uint4 w[VPT];
#pragma unroll
            for (int r = 0; r < VPT; r++) {
                const int idx = tid + r * PV_THREADS, j = idx / g8;
                w[r] = load8_bits(c, j < nk ? vb[j] : -1, idx % g8 * 8, true);
            }
#pragma unroll
            for (int r = 0; r < VPT; r++) {
                float v8[8];
                bf16x8_to_float(w[r], v8);
                stage(tid + r * PV_THREADS, v8);
            }
        } else {
            for (int idx = tid; idx < nk * g8; idx += PV_THREADS) {
                float v8[8];
                load8<DT>(c, vb[idx / g8], idx % g8 * 8, c.Dv - idx % g8 * 8, v8);
                stage(idx, v8);
            }
        }
        __syncthreads();
        const float *v0 = vs_raw + tid, *v1 = vs_raw + tid + PV_THREADS;
        if (ND == 2 && tid + PV_THREADS < c.Dv) {   /* two output dims a thread */
            for (int j = 0; j < nk; j++) {
                const float x0 = v0[j * vs_stride], x1 = v1[j * vs_stride];
                fma_twins<MB>(ad[0], af[0], pd[j], pf[j], (double)x0, x0);
                fma_twins<MB>(ad[ND - 1], af[ND - 1], pd[j], pf[j], (double)x1, x1);
            }
        } else if (tid < c.Dv) {
            if (nk == PV_KT) {
#pragma unroll 8
                for (int j = 0; j < PV_KT; j++) {
                    const float x0 = v0[j * vs_stride];
                    fma_twins<MB>(ad[0], af[0], pd[j], pf[j], (double)x0, x0);
                }
            } else {
                for (int j = 0; j < nk; j++) {
                    const float x0 = v0[j * vs_stride];
                    fma_twins<MB>(ad[0], af[0], pd[j], pf[j], (double)x0, x0);
                }
            }
        }
    }
#pragma unroll
    for (int dd = 0; dd < ND; dd++) {
        const int d = tid + dd * PV_THREADS;
        if (d >= c.Dv) continue;
#pragma unroll
        for (int m = 0; m < MB; m++)
            if (m < p.M) {
                if (nsplit == 1) {   /* the total, from zero, as the GEMM template adds it */
                    store<K_MHA_PV_REF, double>(c, p, m, d, 0.0 + ad[dd][m]);
                    store<K_MHA_PV_NV, float>(c, p, m, d, 0.0f + af[dd][m]);
                } else {
                    const long long at = ((long long)blockIdx.x * MB + m) * c.Dv + d;
                    c.pv_part[at] = ad[dd][m];
                    c.pv_part_nv[at] = af[dd][m];
                }
            }
    }
}

/* The splits of each problem of more than one, added in order from zero (the GEMM template's
 * fold): one CTA per problem, threads over its vectors and output dims. */
template <int MB>
__global__ void __launch_bounds__(PV_THREADS) fused_pv_combine_kernel(gctx c, const gprob *probs, const int *sprefix,
                                                                    int nprobs)
{
    const int pi = (int)blockIdx.x;
    if (pi >= nprobs) return;
    const int t0 = sprefix[pi], t1 = sprefix[pi + 1];
    if (t1 - t0 < 2) return;
    const gprob p = probs[pi];
    for (int e = threadIdx.x; e < p.M * c.Dv; e += PV_THREADS) {
        const int m = e / c.Dv, d = e % c.Dv;
        double td = 0.0;
        float tf = 0.0f;
        for (int t = t0; t < t1; t++) {
            const long long at = ((long long)t * MB + m) * c.Dv + d;
            td = td + c.pv_part[at];
            tf = tf + c.pv_part_nv[at];
        }
        store<K_MHA_PV_REF, double>(c, p, m, d, td);
        store<K_MHA_PV_NV, float>(c, p, m, d, tf);
    }
}

/* ---- the flash reference (MHA, the GEMM template's problems on the fused check) -------------- */

/* The float64 reference of a problem of many vectors (the dense rows of a prefill chunk checked
 * row by row: rows x the query heads of one KV head) in one pass over its keys, the scores never
 * leaving the chip: one CTA per 64-vector tile of the GEMM template's problem lists, 8 warps of 8
 * vectors, FR_KT keys at a time.  S = Q K^T and O += P V on the FP64 tensor cores (mma.sync
 * m8n8k4), the softmax online (FlashAttention's running maximum and sum; O and the sum are
 * rescaled when the maximum grows), so O leaves unnormalised with stat = (max, sum) as
 * softmax_row and the P.V product leave it and the fold is unchanged.  The sums run in another
 * order than the GEMM template's (rescaled partial sums, four keys per instruction): the
 * reference agrees with it to the last bits (tests/gpu_verify.c: within 1e-13, and the C
 * reference to 1e-12); the yardstick keeps its own kernels.  Masked keys get P = 0, NaN scores
 * are ignored by the maximum and carried by the sums, as in softmax_row.  Head sizes (QK and V)
 * multiples of 8 up to FR_DMAX. */
constexpr int FR_ROWS = 64;
constexpr int FR_KT = 16;
constexpr int FR_DMAX = 128;
constexpr int FR_THREADS = 256;
/* row strides in doubles: a warp's fragment reads hit each 8-byte bank pair at most twice (Q, K and
 * P rows 4 apart mod 16, V rows 8 apart) */
constexpr int FR_QS = FR_DMAX + 4, FR_KS = FR_DMAX + 4, FR_VS = FR_DMAX + 8, FR_PS = FR_KT + 4;

struct fr_smem {
    double q[FR_ROWS][FR_QS];   /* the tile's queries, float64 */
    double k[FR_KT][FR_KS];     /* K of FR_KT keys */
    double v[FR_KT][FR_VS];     /* V of the same keys */
    double p[FR_ROWS][FR_PS];   /* P of each warp's 8 rows (written and read by that warp only) */
    long long qb[FR_ROWS], kb[FR_KT], vb[FR_KT];
    int lo[FR_ROWS], hi[FR_ROWS];
    int s_lo, s_hi;
};

__global__ void __launch_bounds__(FR_THREADS, 2) flash_ref_kernel(gctx c, const gprob *probs, const int *mprefix, int nprobs)
{
    extern __shared__ __align__(16) unsigned char fr_raw[];
    fr_smem &s = *reinterpret_cast<fr_smem *>(fr_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g8 = lane >> 2, t4 = lane & 3;
    const int pi = find_tile(mprefix, nprobs, (int)blockIdx.x);
    const gprob p = probs[pi];
    const int m0 = ((int)blockIdx.x - mprefix[pi]) * FR_ROWS;
    if (tid < FR_ROWS) {
        rowh h = {-1, 0, 0};
        if (m0 + tid < p.M) h = a_handle<K_MHA_S_REF>(c, p, m0 + tid);
        s.qb[tid] = h.base;
        s.lo[tid] = h.base >= 0 ? h.lo : 0;
        s.hi[tid] = h.base >= 0 ? h.hi : 0;
    }
    __syncthreads();
    if (tid == 0) {
        int l = INT_MAX, u = INT_MIN;
        for (int i = 0; i < FR_ROWS; i++)
            if (s.lo[i] < s.hi[i]) {
                l = min(l, s.lo[i]);
                u = max(u, s.hi[i]);
            }
        s.s_lo = l;
        s.s_hi = u;
    }
    for (int idx = tid; idx < FR_ROWS * c.D; idx += FR_THREADS) {
        const int i = idx / c.D, d = idx % c.D;
        s.q[i][d] = s.qb[i] >= 0 ? (double)c.q[s.qb[i] + d] : 0.0;
    }
    __syncthreads();
    const int r = 8 * warp + g8;   /* this lane's row: fragment row g8 of the warp's 8 */
    const int rlo = s.lo[r], rhi = s.hi[r], nvf = c.Dv / 8;
    double o[FR_DMAX / 8][2];
#pragma unroll
    for (int f = 0; f < FR_DMAX / 8; f++) o[f][0] = o[f][1] = 0.0;
    double mrow = -INFINITY, lrow = 0.0;
    for (int n0 = s.s_lo; n0 < s.s_hi; n0 += FR_KT) {
        __syncthreads();   /* the previous keys consumed */
        if (tid < FR_KT) {
            const bool in = n0 + tid < p.N;
            s.kb[tid] = in ? b_handle<K_MHA_S_REF>(c, p, n0 + tid).base : -1;
            s.vb[tid] = in ? b_handle<K_MHA_PV_REF>(c, p, n0 + tid).base : -1;
        }
        __syncthreads();
        const int gk = c.D / 8, gv = c.Dv / 8;
        for (int idx = tid; idx < FR_KT * (gk + gv); idx += FR_THREADS) {
            const bool isk = idx < FR_KT * gk;
            const int t = isk ? idx : idx - FR_KT * gk, g = isk ? gk : gv;
            const int j = t / g, e = t % g * 8;
            float x[8];
            load8(c, isk ? s.kb[j] : s.vb[j], e, (isk ? c.D : c.Dv) - e, x);
            double *dst = isk ? &s.k[j][e] : &s.v[j][e];
#pragma unroll
            for (int u = 0; u < 8; u += 2) *reinterpret_cast<double2 *>(dst + u) = make_double2(x[u], x[u + 1]);
        }
        __syncthreads();
        /* scores of the warp's 8 rows x FR_KT keys: FR_KT / 8 fragments; lane (g8, t4) holds keys
         * 8 j + 2 t4 + h of row r */
        double sc[FR_KT / 8][2];
#pragma unroll
        for (int j = 0; j < FR_KT / 8; j++) sc[j][0] = sc[j][1] = 0.0;
        for (int kk = 0; kk < c.D; kk += 4) {
            const double a = s.q[r][kk + t4];
#pragma unroll
            for (int j = 0; j < FR_KT / 8; j++) dmma_8x8x4(sc[j][0], sc[j][1], a, s.k[8 * j + g8][kk + t4]);
        }
        double tmax = -INFINITY;
#pragma unroll
        for (int j = 0; j < FR_KT / 8; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int n = n0 + 8 * j + 2 * t4 + h;
                double x = c.scale * sc[j][h];
                if (c.cap > 0) x = c.cap * tanh(x / c.cap);
                sc[j][h] = x;
                if (n >= rlo && n < rhi) tmax = fmax(tmax, x);
            }
        tmax = fmax(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        tmax = fmax(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
        const double mnew = fmax(mrow, tmax);
        const double alpha = mnew == -INFINITY ? 1.0 : exp(mrow - mnew);
        double psum = 0.0;
#pragma unroll
        for (int j = 0; j < FR_KT / 8; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int n = n0 + 8 * j + 2 * t4 + h;
                const double e = (n >= rlo && n < rhi) ? exp(sc[j][h] - mnew) : 0.0;
                psum += e;
                s.p[r][8 * j + 2 * t4 + h] = e;
            }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        psum += __shfl_xor_sync(0xffffffffu, psum, 2);
        lrow = lrow * alpha + psum;
        mrow = mnew;
#pragma unroll
        for (int f = 0; f < FR_DMAX / 8; f++) {
            o[f][0] *= alpha;
            o[f][1] *= alpha;
        }
        __syncwarp();   /* the warp's P rows written */
#pragma unroll
        for (int kk = 0; kk < FR_KT; kk += 4) {
            const double a = s.p[r][kk + t4];
#pragma unroll
            for (int f = 0; f < FR_DMAX / 8; f++)
                if (f < nvf) dmma_8x8x4(o[f][0], o[f][1], a, s.v[kk + t4][8 * f + g8]);
        }
    }
    if (m0 + r >= p.M) return;
    const long long v = p.v_off + m0 + r;
    if (t4 == 0) {
        c.stat[2 * v] = mrow;
        c.stat[2 * v + 1] = lrow;
    }
#pragma unroll
    for (int f = 0; f < FR_DMAX / 8; f++)
        if (f < nvf) {
            c.O[v * c.Dv + 8 * f + 2 * t4] = o[f][0];
            c.O[v * c.Dv + 8 * f + 2 * t4 + 1] = o[f][1];
        }
}

} /* namespace argpu */

#endif
