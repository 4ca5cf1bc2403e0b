/* mla_prefill.cuh - the cuda-mla backend's GEMM and prefill path.
 *   - A batched SIMT GEMM (fp32 accumulate) and its tensor-core twin (the default where cuBLAS
 *     does not run a GEMM; AR_MLA_GEMM=simt takes the SIMT one) for the
 *     absorption q_nope x W_UK -> the 512-wide
 *     latent query, the up-projection o_lat x W_UV -> v_head_dim, and the prefill path's
 *     up-projected keys and values; gemm_of / launch_gemm describe and launch one.
 *   - The prefill path for requests with query_len > AR_CUDA_MLA_DECODE_THRESHOLD: the new
 *     tokens' keys / values are up-projected (k_nope = c W_UK, v = c W_UV, k = [k_nope | k_pe], QK
 *     dim 192, V dim 128) and attended causally; the context is up-projected in chunks bounded
 *     by a workspace and attended non-causally; the chunk results and the new-token result are
 *     merged by LSE (vLLM merge_attn_states).  For DeepSeek's QK 192 / V 128 the attention
 *     runs on the Hopper wgmma kernel (mla_prefill_pingpong.cuh, the default on compute
 *     capability 9.0) or on the mma.sync tensor-core kernel here (AR_MLA_PREFILL=tc, and the
 *     default elsewhere), which share their softmax and stores (the pf_* helpers below); other
 *     shapes, or AR_MLA_PREFILL=simt, take a SIMT kernel.
 * Included by cuda_mla.cu (run_prefill and run_pass drive them). */
#ifndef AR_MLA_PREFILL_CUH
#define AR_MLA_PREFILL_CUH

#include <limits.h>

#include "mla_common.cuh"

namespace ar_mla {

/* ---------------------------------------------------------------------------------------- */
/* Batched GEMM (SIMT, 64 x 64 tiles, fp32 accumulate):                                     */
/*   C[b][m][n] = sum_k A[b][m][k] * B[(b + b_shift) % batch][k][n]                           */
/* with element strides; A is float or 16-bit dtype bits, B 16-bit dtype bits, C float        */
/* (rounded to round_dtype) or 16-bit bits.                                                   */

struct gemm_args {
    int batch, M, N, K;
    const void *A;
    int a_bits16;               /* 1: A holds dtype bits, 0: float */
    int64_t a_b, a_m, a_k;
    const uint16_t *B;
    int64_t b_b, b_k, b_n;
    int b_shift;
    void *C;
    int c_bits16;               /* 1: store dtype bits, 0: float rounded to dtype */
    int64_t c_b, c_m, c_n;
    int bf16;                   /* the dtype of 16-bit data and of the rounding */
};

__global__ void __launch_bounds__(256) gemm_kernel(gemm_args g)
{
    __shared__ float As[16][64 + 4];
    __shared__ float Bs[16][64 + 4];
    const int bz = blockIdx.z;
    const int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int bb = (bz + g.b_shift) % g.batch;
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
    for (int k0 = 0; k0 < g.K; k0 += 16) {
        for (int e = threadIdx.x; e < 64 * 16; e += 256) {
            int kk = e % 16, mm = e / 16;
            int m = m0 + mm, k = k0 + kk;
            float v = 0.f;
            if (m < g.M && k < g.K) {
                int64_t idx = bz * g.a_b + m * g.a_m + k * g.a_k;
                v = g.a_bits16 ? from_bits(g.bf16, ((const uint16_t *)g.A)[idx]) : ((const float *)g.A)[idx];
            }
            As[kk][mm] = v;
            int nn = e % 64, kb = e / 64;
            int n = n0 + nn, k2 = k0 + kb;
            float u = 0.f;
            if (n < g.N && k2 < g.K) u = from_bits(g.bf16, g.B[bb * g.b_b + k2 * g.b_k + n * g.b_n]);
            Bs[kb][nn] = u;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            float av[4], bv[4];
            for (int i = 0; i < 4; i++) av[i] = As[kk][ty * 4 + i];
            for (int j = 0; j < 4; j++) bv[j] = Bs[kk][tx * 4 + j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            int m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
            if (m >= g.M || n >= g.N) continue;
            int64_t idx = bz * g.c_b + m * g.c_m + n * g.c_n;
            if (g.c_bits16)
                ((uint16_t *)g.C)[idx] = to_bits(g.bf16, acc[i][j]);
            else
                ((float *)g.C)[idx] = g.bf16 ? ar_round_to(AR_BF16, acc[i][j]) : ar_round_to(AR_FP16, acc[i][j]);
        }
}

/* The same GEMM on the tensor cores (mma.sync m16n8k16, fp32 accumulate), taken for the GEMMs
 * cuBLAS does not run (every GEMM with AR_MLA_GEMM=tc or without cuBLAS, and the planted
 * wrong-head fault's shifted weights; AR_MLA_GEMM=simt takes the SIMT kernel above): the 64 x 64
 * tile of C in 8 warps, warp w on rows 16 (w % 4) .. + 16 and columns 32 (w / 4) .. + 32, four 16 x 8 products a k16 step.  A is staged [m][k] and B transposed to
 * [n][k], both as 16-bit dtype values, so that every fragment register is one 32-bit shared load
 * of a k pair.  A float A operand (the latent attention output before W_UV) is rounded to the
 * dtype on the way in, as vLLM's 16-bit attention output and the verifier's yardstick are; the
 * SIMT kernel multiplies it unrounded.  Sums run in a different order than the SIMT kernel's.
 *   As [64 rows of C][BK], Bs [64 columns of C][BK] per k block */
template <bool BF16>
__global__ void __launch_bounds__(256) gemm_tc_kernel(gemm_args g)
{
    constexpr int BK = 32, LD = BK + 8;   /* 8 halves of padding: rows 80 bytes apart */
    __shared__ __align__(16) uint16_t As[64][LD];
    __shared__ __align__(16) uint16_t Bs[64][LD];
    const int bz = blockIdx.z, m0 = blockIdx.y * 64, n0 = blockIdx.x * 64;
    const int bb = (bz + g.b_shift) % g.batch;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4, tig = lane % 4;
    const int wm = (warp % 4) * 16, wn = (warp / 4) * 32;
    float acc[4][4];
    for (int nt = 0; nt < 4; nt++)
        for (int j = 0; j < 4; j++) acc[nt][j] = 0.f;
    for (int k0 = 0; k0 < g.K; k0 += BK) {
        for (int e = threadIdx.x; e < 64 * BK; e += 256) {
            const int kk = e % BK, mm = e / BK, m = m0 + mm, k = k0 + kk;
            uint16_t v = 0;
            if (m < g.M && k < g.K) {
                const int64_t idx = bz * g.a_b + m * g.a_m + k * g.a_k;
                v = g.a_bits16 ? ((const uint16_t *)g.A)[idx] : to_bits(BF16, ((const float *)g.A)[idx]);
            }
            As[mm][kk] = v;
        }
        for (int e = threadIdx.x; e < 64 * BK; e += 256) {
            const int nn = e % 64, kb = e / 64, n = n0 + nn, k = k0 + kb;
            Bs[nn][kb] = (n < g.N && k < g.K) ? g.B[bb * g.b_b + k * g.b_k + n * g.b_n] : (uint16_t)0;
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < BK; ks += 16) {
            uint32_t a[4];
            a[0] = *reinterpret_cast<const uint32_t *>(&As[wm + grp][ks + 2 * tig]);
            a[1] = *reinterpret_cast<const uint32_t *>(&As[wm + grp + 8][ks + 2 * tig]);
            a[2] = *reinterpret_cast<const uint32_t *>(&As[wm + grp][ks + 2 * tig + 8]);
            a[3] = *reinterpret_cast<const uint32_t *>(&As[wm + grp + 8][ks + 2 * tig + 8]);
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                const int n = wn + nt * 8 + grp;
                const uint32_t b0 = *reinterpret_cast<const uint32_t *>(&Bs[n][ks + 2 * tig]);
                const uint32_t b1 = *reinterpret_cast<const uint32_t *>(&Bs[n][ks + 2 * tig + 8]);
                mma16816<BF16>(acc[nt], a, b0, b1);
            }
        }
        __syncthreads();
    }
    /* acc[nt][2h + j]: row wm + grp + 8h, column wn + 8nt + 2tig + j */
    for (int nt = 0; nt < 4; nt++)
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 2; j++) {
                const int m = m0 + wm + grp + 8 * h, n = n0 + wn + nt * 8 + 2 * tig + j;
                if (m >= g.M || n >= g.N) continue;
                const int64_t idx = bz * g.c_b + m * g.c_m + n * g.c_n;
                const float x = acc[nt][2 * h + j];
                if (g.c_bits16)
                    ((uint16_t *)g.C)[idx] = to_bits(BF16, x);
                else
                    ((float *)g.C)[idx] = ar_round_to(BF16 ? AR_BF16 : AR_FP16, x);
            }
}

/* A GEMM description (see gemm_args): C = A B per batch entry, with element strides. */
static gemm_args gemm_of(int batch, int M, int N, int K, const void *A, int a_bits16, int64_t a_b, int64_t a_m,
                         int64_t a_k, const uint16_t *B, int64_t b_b, int64_t b_k, int64_t b_n, int b_shift, void *C,
                         int c_bits16, int64_t c_b, int64_t c_m, int64_t c_n, int bf16)
{
    gemm_args g;
    g.batch = batch;
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = A;
    g.a_bits16 = a_bits16;
    g.a_b = a_b;
    g.a_m = a_m;
    g.a_k = a_k;
    g.B = B;
    g.b_b = b_b;
    g.b_k = b_k;
    g.b_n = b_n;
    g.b_shift = b_shift;
    g.C = C;
    g.c_bits16 = c_bits16;
    g.c_b = c_b;
    g.c_m = c_m;
    g.c_n = c_n;
    g.bf16 = bf16;
    return g;
}

/* Staging for a GEMM with a float operand or result that cuBLAS runs in 16 bits (W_UV: the
 * latent attention output is float, the output is float rounded to the dtype): narrow_kernel
 * rounds src [batch, M, K] by element strides to the dtype into dense dst [M][batch][K];
 * widen_kernel writes dense src [M][batch][N] 16-bit back to the float dst by its strides. */
__global__ void narrow_kernel(const float *src, int64_t s_b, int64_t s_m, int64_t s_k, uint16_t *dst, int batch,
                              int M, int K, int bf16)
{
    const int64_t total = (int64_t)M * batch * K;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int k = (int)(idx % K), b = (int)(idx / K % batch);
        const int64_t m = idx / K / batch;
        dst[idx] = to_bits(bf16, src[b * s_b + m * s_m + k * s_k]);
    }
}

__global__ void widen_kernel(const uint16_t *src, float *dst, int64_t d_b, int64_t d_m, int64_t d_n, int batch, int M,
                             int N, int bf16)
{
    const int64_t total = (int64_t)M * batch * N;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        const int n = (int)(idx % N), b = (int)(idx / N % batch);
        const int64_t m = idx / N / batch;
        dst[b * d_b + m * d_m + n * d_n] = from_bits(bf16, src[idx]);
    }
}

/* tc: the tensor-core kernel instead of the SIMT one (all but AR_MLA_GEMM=simt). */
static cudaError_t launch_gemm(const gemm_args &g, bool tc, cudaStream_t st)
{
    if (g.M <= 0 || g.N <= 0 || g.batch <= 0) return cudaSuccess;
    dim3 grid((unsigned)((g.N + 63) / 64), (unsigned)((g.M + 63) / 64), (unsigned)g.batch);
    if (!tc)
        gemm_kernel<<<grid, 256, 0, st>>>(g);
    else if (g.bf16)
        gemm_tc_kernel<true><<<grid, 256, 0, st>>>(g);
    else
        gemm_tc_kernel<false><<<grid, 256, 0, st>>>(g);
    return cudaGetLastError();
}

/* ---------------------------------------------------------------------------------------- */
/* Prefill path (query_len > threshold): up-projected keys/values in a workspace               */

/* Workspace latent rows: row w = (request row_req[w], position row_pos[w]); a context position
 * comes from the cache (fp8 dequantised to the dtype), a new token's from the new latents. */
__global__ void gather_latent_kernel(uint16_t *ws_lat, int n_rows, const int *row_req, const int *row_pos,
                                     const attn_args a, const uint16_t *lat_new)
{
    int64_t total = (int64_t)n_rows * D;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int d = (int)(idx % D);
        int w = (int)(idx / D);
        int r = row_req[w], p = row_pos[w];
        int q0 = a.qsl[r], ql = a.qsl[r + 1] - q0, ctx = a.seq_lens[r] - ql;
        uint16_t v;
        if (p >= ctx) {
            /* the verifier (and the CPU backend) read every key through the cache, so an fp8
             * cache's new tokens take the same quantise / dequantise trip (ar_kv_roundtrip) */
            v = lat_new[((int64_t)q0 + p - ctx) * D + d];
            if (a.fp8_cache)
                v = to_bits(a.bf16, ar_kv_roundtrip(AR_FP8_E4M3, a.bf16 ? AR_BF16 : AR_FP16, a.kv_scale,
                                                    from_bits(a.bf16, v)));
        } else {
            int64_t src = key_slot(a, r, p) * D + d;
            if (a.fp8_cache)
                v = to_bits(a.bf16, __fmul_rn(ar_fp8e4m3_to_f32(((const uint8_t *)a.cache)[src]), a.kv_scale));
            else
                v = ((const uint16_t *)a.cache)[src];
        }
        ws_lat[idx] = v;
    }
}

/* The prefill path's elementwise kernels over (row, head) pairs - rope_key_kernel,
 * prefill_merge_kernel, prefill_finish_kernel - give each pair to one warp, its lanes across
 * the columns, so the pair's row and head cost one 32-bit division a lane per row.  An index
 * per element cost three 64-bit divisions by run-time values, which bound them by the ALU: on a
 * DeepSeek-V3 mixed step (8,185 prefill tokens x 128 heads x 128 columns) the finish took
 * about 0.95 ms under Nsight Compute, three times its 1.07 GB of traffic at the copy rate.
 * Launch: 256 threads, mla_grid(pairs, 8) blocks. */

/* k_pe (latent columns 512..575) broadcast to every head: ws_k[w, n, P + d]. */
__global__ void rope_key_kernel(uint16_t *ws_k, const uint16_t *ws_lat, int n_rows, int H, int P)
{
    const int QK = P + DR, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int wn = blockIdx.x * warps + threadIdx.x / 32; wn < n_rows * H; wn += gridDim.x * warps) {
        const int w = wn / H;
        for (int d = lane; d < DR; d += 32) ws_k[(int64_t)wn * QK + P + d] = ws_lat[(int64_t)w * D + DL + d];
    }
}

/* AR_FAULT_MLA_NO_WUV on the prefill path: values left in latent space (first V columns). */
__global__ void latent_as_value_kernel(uint16_t *ws_v, const uint16_t *ws_lat, int n_rows, int H, int V)
{
    int64_t total = (int64_t)n_rows * H * V;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int c = (int)(idx % V);
        int64_t w = idx / V / H;
        ws_v[idx] = ws_lat[w * D + c];
    }
}

/* Attention of prefill token pf_tok[blockIdx.x / H], head blockIdx.x % H over workspace rows
 * [kb[r], ke[r]) of its request; key row w visible iff row_pos[w] <= the query position
 * (+1 with the off-by-one fault).  q = [q_nope | q_pe] (QK = P + 64), k = ws_k, v = ws_v.
 * Writes pass_o [T, H, V] (float) and pass_lse [H, T] (natural; -inf when nothing visible). */
__global__ void __launch_bounds__(SIMT_THREADS) prefill_attn_kernel(
    const attn_args a, const int *pf_tok, const int *tok_pos, const uint16_t *q_nope, const uint16_t *ws_k,
    const uint16_t *ws_v, const int *row_pos, const int *kb, const int *ke, int P, int V, float *pass_o,
    float *pass_lse)
{
    __shared__ float qs[256 + DR];
    __shared__ float ps[SIMT_CHUNK];
    __shared__ float red[SIMT_THREADS / 32];
    const int H = a.num_heads, QK = P + DR;
    const int t = pf_tok[blockIdx.x / H], n = blockIdx.x % H;
    const int r = a.tok_req[t];
    const int qpos = tok_pos[t] + (a.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0);
    for (int d = threadIdx.x; d < QK; d += blockDim.x)
        qs[d] = d < P ? from_bits(a.bf16, q_nope[((int64_t)t * H + n) * P + d])
                      : from_bits(a.bf16, ((const uint16_t *)a.q)[((int64_t)t * H + n) * D + DL + (d - P)]);
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float m = -INFINITY, l = 0.f, acc[2] = {0.f, 0.f};
    const int k_begin = kb[r], k_end = ke[r];
    for (int c0 = k_begin; c0 < k_end; c0 += SIMT_CHUNK) {
        int cnt = k_end - c0 < SIMT_CHUNK ? k_end - c0 : SIMT_CHUNK;
        for (int kk = warp; kk < cnt; kk += nw) {
            int w = c0 + kk;
            const uint16_t *kr = ws_k + ((int64_t)w * H + n) * QK;
            float dot = 0.f;
            for (int d = lane; d < QK; d += 32) dot += qs[d] * from_bits(a.bf16, kr[d]);
            for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
            if (lane == 0) ps[kk] = row_pos[w] <= qpos ? dot * a.scale_log2 : -INFINITY;
        }
        __syncthreads();
        float mine = threadIdx.x < cnt ? ps[threadIdx.x] : -INFINITY;
        float mc = block_reduce<float>(mine, true, red);
        float m_new = fmaxf(m, mc);
        float m_use = m_new == -INFINITY ? 0.f : m_new;
        float alpha = exp2f(m - m_use);
        float p = threadIdx.x < cnt ? exp2f(mine - m_use) : 0.f;
        float lsum = block_reduce<float>(p, false, red);
        if (threadIdx.x < cnt) ps[threadIdx.x] = p;
        __syncthreads();
        if (a.fault == AR_FAULT_NO_RESCALE) alpha = 1.f;
        l = l * alpha + lsum;
        for (int c = 0; c < 2; c++) {
            int col = threadIdx.x + c * SIMT_THREADS;
            if (col >= V) break;
            float sum = 0.f;
            for (int kk = 0; kk < cnt; kk++) {
                if (ps[kk] == 0.f) continue;
                sum += ps[kk] * from_bits(a.bf16, ws_v[((int64_t)(c0 + kk) * H + n) * V + col]);
            }
            acc[c] = acc[c] * alpha + sum;
        }
        m = m_new;
        __syncthreads();
    }
    for (int c = 0; c < 2; c++) {
        int col = threadIdx.x + c * SIMT_THREADS;
        if (col < V) pass_o[((int64_t)t * H + n) * V + col] = l > 0.f ? acc[c] / l : 0.f;
    }
    if (threadIdx.x == 0)
        pass_lse[(int64_t)n * a.num_tokens + t] = l > 0.f ? (m + log2f(l)) * 0.6931471805599453f : -INFINITY;
}

/* Tensor-core prefill attention on mma.sync (AR_MLA_PREFILL=tc, and the default where the wgmma
 * kernel of mla_prefill_pingpong.cuh cannot run; =simt takes the SIMT kernel): the
 * pass prefill_attn_kernel computes, for DeepSeek's shapes only (QK = 128 + 64 = 192, V = 128),
 * FlashAttention-2 style on mma.sync m16n8k16.  A CTA (4 warps, 16 query rows each) takes one tile of at most 64 prefill tokens of
 * one request (pf_tiles) and one head (blockIdx.y; the tiles of one head run side by side, so
 * its keys and values are read from L2 after the first tile).  Key tiles of 64 workspace rows
 * go through a two-stage cp.async ring in shared memory (K and V as rows; V's fragments come
 * through ldmatrix.trans): the next tile loads while this one is computed.  Scores and the
 * online softmax stay in registers, and the probabilities are rounded to the dtype for P V.
 * A request's workspace rows hold consecutive positions (mla_prepare writes them so), so the
 * rows past the tile's last visible position are skipped, not masked.  The planted fault
 * AR_FAULT_NO_RESCALE skips the rescale at every 64-key tile here (every 128-key chunk in the
 * SIMT kernel), so the two faulty outputs differ; both fail verification.
 *   pf_tiles [n_tiles][3]: first pf_tok index, token count (1..64), request
 *   q_nope [T, H, 128], a.q [T, H, 576] (q_pe at 512..575), ws_k [rows, H, 192],
 *   ws_v [rows, H, 128]; pass_o [T, H, 128] float, pass_lse [H, T] natural.
 * Dynamic shared memory: PF_TC_SMEM bytes (two stages of K and V; the query tile is staged in
 * stage 0 first). */
constexpr int PF_TC_QK = 192, PF_TC_V = 128, PF_TC_ROWS = AR_MLA_PREFILL_TILE, PF_TC_KEYS = 64;
static_assert(PF_TC_ROWS == 64, "4 warps x 16 query rows");
constexpr int PF_TC_KS = PF_TC_QK + 8, PF_TC_VS = PF_TC_V + 8;   /* row strides: conflict-free fragments */
constexpr int PF_TC_STAGE = PF_TC_KEYS * (PF_TC_KS + PF_TC_VS);  /* 16-bit elements a stage */
constexpr int PF_TC_SMEM = 2 * PF_TC_STAGE * 2;

/* One key tile (rows k0 .. k0 + cnt - 1 of the workspace, head n) into the tc kernel's stage by
 * cp.async, one group: K and V as padded rows (PF_TC_KS, PF_TC_VS); rows past cnt are
 * zero-filled (0 x garbage could be NaN) and get position INT_MAX. */
__device__ __forceinline__ void pf_tc_load_tile(uint16_t *stage, int *kpos, const uint16_t *ws_k,
                                                const uint16_t *ws_v, const int *row_pos, int k0, int cnt,
                                                int H, int n)
{
    constexpr int QK = PF_TC_QK, V = PF_TC_V;
    uint16_t *Ks = stage, *Vs = stage + PF_TC_KEYS * PF_TC_KS;
    for (int e = threadIdx.x; e < PF_TC_KEYS * (QK / 8); e += blockDim.x) {
        const int j = e / (QK / 8), c8 = (e % (QK / 8)) * 8;
        const bool in = j < cnt;
        cp_async16(Ks + j * PF_TC_KS + c8, in ? ws_k + ((int64_t)(k0 + j) * H + n) * QK + c8 : ws_k, in);
    }
    for (int e = threadIdx.x; e < PF_TC_KEYS * (V / 8); e += blockDim.x) {
        const int j = e / (V / 8), c8 = (e % (V / 8)) * 8;
        const bool in = j < cnt;
        cp_async16(Vs + j * PF_TC_VS + c8, in ? ws_v + ((int64_t)(k0 + j) * H + n) * V + c8 : ws_v, in);
    }
    if ((int)threadIdx.x < PF_TC_KEYS) kpos[threadIdx.x] = (int)threadIdx.x < cnt ? row_pos[k0 + threadIdx.x] : INT_MAX;
    cp_async_commit();
}

/* The 16 bytes of query row th (token x heads + head) at dims c8 .. c8 + 7 of [q_nope | q_pe]. */
__device__ __forceinline__ const uint16_t *pf_q_chunk(const attn_args &a, const uint16_t *q_nope, int64_t th, int c8)
{
    constexpr int P = PF_TC_QK - DR;
    return c8 < P ? q_nope + th * P + c8 : (const uint16_t *)a.q + th * D + DL + (c8 - P);
}

/* The end of the workspace rows k_begin .. k_stop - 1 a tile whose last query position is last_q
 * sees: a request's rows hold consecutive positions (mla_prepare writes them so), so the rows
 * past the last visible one are skipped, not masked. */
__device__ __forceinline__ int pf_key_end(const int *row_pos, int k_begin, int k_stop, int last_q)
{
    int k_end = k_begin;
    if (k_stop > k_begin) {
        const int visible = last_q - row_pos[k_begin] + 1;
        k_end = k_begin + (visible < 0 ? 0 : visible < k_stop - k_begin ? visible : k_stop - k_begin);
    }
    return k_end;
}

/* The online softmax of one key tile on the m16n8 accumulator layout the prefill tensor-core
 * kernels hold S in, without the output's rescale: s[nt][2h + j] is query row grp + 8h of the
 * warp's 16 (grp = lane / 4), key nt * 8 + 2 tig + j (tig = lane % 4); a row's 64 keys are spread
 * over the 4 threads of a quad.  In: the raw scores; out: P (unrounded), 2^(S scale_log2 - m) as
 * one FFMA and EX2 an element.  visible(key, h): whether the thread's row grp + 8h sees key
 * (0..63) of the tile.  The running maxima m (log2 domain) and the thread's partial row sums l
 * are updated; alpha[h] is the factor the output rows' accumulator is due (1 under the planted
 * fault AR_FAULT_NO_RESCALE). */
template <typename Visible>
__device__ __forceinline__ void pf_softmax_scores(const attn_args &a, float (&s)[PF_TC_KEYS / 8][4], Visible visible,
                                                  int tig, float (&m)[2], float (&l)[2], float (&alpha)[2])
{
    constexpr int NT = PF_TC_KEYS / 8;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            for (int j = 0; j < 2; j++) {
                const int key = nt * 8 + 2 * tig + j;
                const float x = visible(key, h) ? s[nt][2 * h + j] : -INFINITY;
                s[nt][2 * h + j] = x;
                mx = fmaxf(mx, x);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        /* scale_log2 > 0, so the largest scaled score is the largest score scaled, rounded alike */
        const float m_new = fmaxf(m[h], mx * a.scale_log2);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        alpha[h] = a.fault == AR_FAULT_NO_RESCALE ? 1.f : exp2f(m[h] - m_use);
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            for (int j = 0; j < 2; j++) {
                const float p = exp2f(fmaf(s[nt][2 * h + j], a.scale_log2, -m_use));
                s[nt][2 * h + j] = p;
                sum += p;
            }
        l[h] = l[h] * alpha[h] + sum;
        m[h] = m_new;
    }
}

/* The output accumulator o (the same layout, 128 dims) times its rows' factors alpha, skipped
 * where no row of the warp has a new maximum (every factor exactly 1). */
__device__ __forceinline__ void pf_rescale_o(float (&o)[PF_TC_V / 8][4], const float (&alpha)[2])
{
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int dt = 0; dt < PF_TC_V / 8; dt++)
            for (int h = 0; h < 2; h++) {
                o[dt][2 * h] *= alpha[h];
                o[dt][2 * h + 1] *= alpha[h];
            }
    }
}

/* The mma.sync kernel's whole online softmax of one key tile (pf_softmax_scores, then the
 * output's rescale), a key visible when its position kp[key] <= the row's position qpos[h]. */
__device__ __forceinline__ void pf_softmax_tile(const attn_args &a, float (&s)[PF_TC_KEYS / 8][4], const int *kp,
                                                const int (&qpos)[2], int tig, float (&m)[2], float (&l)[2],
                                                float (&o)[PF_TC_V / 8][4])
{
    float alpha[2];
    pf_softmax_scores(a, s, [&](int key, int h) { return kp[key] <= qpos[h]; }, tig, m, l, alpha);
    pf_rescale_o(o, alpha);
}

/* P (the accumulator layout of S, as pf_softmax_scores leaves it) rounded to the dtype as the A
 * fragment of keys 16 kt .. 16 kt + 15 (the mma.sync m16n8k16 layout, which wgmma's register A
 * operand shares). */
template <bool BF16>
__device__ __forceinline__ void pf_p_frag(const float (&s)[PF_TC_KEYS / 8][4], int kt, uint32_t (&pa)[4])
{
    pa[0] = pack2<BF16>(s[2 * kt][0], s[2 * kt][1]);
    pa[1] = pack2<BF16>(s[2 * kt][2], s[2 * kt][3]);
    pa[2] = pack2<BF16>(s[2 * kt + 1][0], s[2 * kt + 1][1]);
    pa[3] = pack2<BF16>(s[2 * kt + 1][2], s[2 * kt + 1][3]);
}

/* A prefill row's final output value (the dtype's rounding of the float result) and LSE
 * (natural; base 2 under the planted LSE_BASE2 fault), as the step's out and lse hold them:
 * written by prefill_finish_kernel, or by the pingpong kernel itself on a step of one pass. */
__device__ __forceinline__ float pf_out_value(const attn_args &a, float x) { return round16(a.bf16, x); }
__device__ __forceinline__ float pf_out_lse(const attn_args &a, float v)
{
    return a.fault == AR_FAULT_LSE_BASE2 && v != -INFINITY ? v * 1.4426950408889634f : v;
}

/* The tile's outputs: the thread's two rows (wrow + grp + 8h of the tile, those below count) of
 * pass_o normalized and their natural LSE (-INF where the row saw no key), the quad's partial row
 * sums added first.  final_out: pass_o / pass_lse are the step's out / lse and this pass is the
 * only one, so the rows are written as prefill_finish_kernel writes them (rounded to the dtype; the
 * LSE in base 2 under the planted LSE_BASE2 fault) and that kernel need not run. */
__device__ __forceinline__ void pf_store_rows(const attn_args &a, const int *pf_tok, int first, int count, int n,
                                              int wrow, int grp, int tig, const float (&m)[2], float (&l)[2],
                                              const float (&o)[PF_TC_V / 8][4], float *pass_o, float *pass_lse,
                                              bool final_out = false)
{
    constexpr int V = PF_TC_V;
    const int H = a.num_heads;
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    for (int h = 0; h < 2; h++) {
        const int i = wrow + grp + 8 * h;
        if (i >= count) continue;
        const int t = pf_tok[first + i];
        const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
        float *dst = pass_o + ((int64_t)t * H + n) * V;
#pragma unroll
        for (int dt = 0; dt < V / 8; dt++) {
            float x0 = o[dt][2 * h] * inv, x1 = o[dt][2 * h + 1] * inv;
            if (final_out) {
                x0 = pf_out_value(a, x0);
                x1 = pf_out_value(a, x1);
            }
            *reinterpret_cast<float2 *>(dst + dt * 8 + 2 * tig) = make_float2(x0, x1);
        }
        if (tig == 0) {
            const float v = l[h] > 0.f ? (m[h] + log2f(l[h])) * 0.6931471805599453f : -INFINITY;
            pass_lse[(int64_t)n * a.num_tokens + t] = final_out ? pf_out_lse(a, v) : v;
        }
    }
}

template <bool BF16>
__global__ void __launch_bounds__(128) prefill_attn_tc_kernel(
    const attn_args a, const int *pf_tok, const int *pf_tiles, const int *tok_pos, const uint16_t *q_nope,
    const uint16_t *ws_k, const uint16_t *ws_v, const int *row_pos, const int *kb, const int *ke, float *pass_o,
    float *pass_lse)
{
    constexpr int QK = PF_TC_QK, V = PF_TC_V, KS = PF_TC_KS, VS = PF_TC_VS;
    extern __shared__ __align__(16) uint16_t pf_tc_smem[];
    __shared__ int kpos[2][PF_TC_KEYS];
    const int H = a.num_heads, n = blockIdx.y;
    const int first = pf_tiles[3 * blockIdx.x], count = pf_tiles[3 * blockIdx.x + 1], r = pf_tiles[3 * blockIdx.x + 2];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4, tig = lane % 4;
    const int wrow = warp * 16;
    const int extra = a.fault == AR_FAULT_CAUSAL_OFF_BY_ONE ? 1 : 0;

    /* the query tile, staged in stage 0's K rows: row i = [q_nope | q_pe] of token
     * pf_tok[first + i], zeros past count */
    uint16_t *Qs = pf_tc_smem;
    for (int e = threadIdx.x; e < PF_TC_ROWS * (QK / 8); e += blockDim.x) {
        const int i = e / (QK / 8), c8 = (e % (QK / 8)) * 8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (i < count)
            v = *reinterpret_cast<const uint4 *>(pf_q_chunk(a, q_nope, (int64_t)pf_tok[first + i] * H + n, c8));
        *reinterpret_cast<uint4 *>(Qs + i * KS + c8) = v;
    }
    int qpos[2];
    for (int h = 0; h < 2; h++) {
        const int i = wrow + grp + 8 * h;
        qpos[h] = i < count ? tok_pos[pf_tok[first + i]] + extra : -1;   /* -1: sees no key */
    }
    __syncthreads();
    uint32_t qf[QK / 16][4];
#pragma unroll
    for (int ks = 0; ks < QK / 16; ks++) {
        qf[ks][0] = *reinterpret_cast<const uint32_t *>(Qs + (wrow + grp) * KS + ks * 16 + 2 * tig);
        qf[ks][1] = *reinterpret_cast<const uint32_t *>(Qs + (wrow + grp + 8) * KS + ks * 16 + 2 * tig);
        qf[ks][2] = *reinterpret_cast<const uint32_t *>(Qs + (wrow + grp) * KS + ks * 16 + 2 * tig + 8);
        qf[ks][3] = *reinterpret_cast<const uint32_t *>(Qs + (wrow + grp + 8) * KS + ks * 16 + 2 * tig + 8);
    }
    __syncthreads();   /* stage 0 is the key ring's from here */

    const int k_begin = kb[r];
    const int k_end = pf_key_end(row_pos, k_begin, ke[r], tok_pos[pf_tok[first + count - 1]] + extra);
    const int n_tiles = (k_end - k_begin + PF_TC_KEYS - 1) / PF_TC_KEYS;
    float o[V / 8][4];
#pragma unroll
    for (int dt = 0; dt < V / 8; dt++)
        for (int j = 0; j < 4; j++) o[dt][j] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    if (n_tiles > 0)
        pf_tc_load_tile(pf_tc_smem, kpos[0], ws_k, ws_v, row_pos, k_begin,
                        k_end - k_begin < PF_TC_KEYS ? k_end - k_begin : PF_TC_KEYS, H, n);
    for (int it = 0; it < n_tiles; it++) {
        if (it + 1 < n_tiles) {
            const int k1 = k_begin + (it + 1) * PF_TC_KEYS;
            pf_tc_load_tile(pf_tc_smem + ((it + 1) & 1) * PF_TC_STAGE, kpos[(it + 1) & 1], ws_k, ws_v, row_pos, k1,
                            k_end - k1 < PF_TC_KEYS ? k_end - k1 : PF_TC_KEYS, H, n);
            cp_async_wait<1>();   /* this tile's group is done; the next one may still fly */
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *Ks = pf_tc_smem + (it & 1) * PF_TC_STAGE;
        const uint16_t *Vs = Ks + PF_TC_KEYS * KS;
        const int *kp = kpos[it & 1];

        /* s[nt][2h + j]: query row wrow + grp + 8h, key nt * 8 + 2 tig + j */
        float s[PF_TC_KEYS / 8][4];
#pragma unroll
        for (int nt = 0; nt < PF_TC_KEYS / 8; nt++)
            for (int j = 0; j < 4; j++) s[nt][j] = 0.f;
#pragma unroll
        for (int ks = 0; ks < QK / 16; ks++)
#pragma unroll
            for (int nt = 0; nt < PF_TC_KEYS / 8; nt++) {
                const uint16_t *krow = Ks + (nt * 8 + grp) * KS + ks * 16 + 2 * tig;
                mma16816<BF16>(s[nt], qf[ks], *reinterpret_cast<const uint32_t *>(krow),
                               *reinterpret_cast<const uint32_t *>(krow + 8));
            }
        pf_softmax_tile(a, s, kp, qpos, tig, m, l, o);
        /* o += P V: P's accumulator layout is the A fragment of keys 16 kt .. 16 kt + 15 */
#pragma unroll
        for (int kt = 0; kt < PF_TC_KEYS / 16; kt++) {
            uint32_t pa[4];
            pf_p_frag<BF16>(s, kt, pa);
#pragma unroll
            for (int d0 = 0; d0 < V; d0 += 16) {
                /* four 8x8 blocks: keys +0 / +8 of this k step, columns d0 / d0 + 8 */
                uint32_t b[4];
                ldmatrix_x4_trans(b, Vs + (kt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * VS + d0 + (lane / 16) * 8);
                mma16816<BF16>(o[d0 / 8], pa, b[0], b[1]);
                mma16816<BF16>(o[d0 / 8 + 1], pa, b[2], b[3]);
            }
        }
        __syncthreads();   /* the stage is refilled by the next iteration's load */
    }
    pf_store_rows(a, pf_tok, first, count, n, wrow, grp, tig, m, l, o, pass_o, pass_lse);
}

/* acc (out, lse) <- merge(acc, pass) for every prefill token and head (vLLM merge_attn_states);
 * first: acc <- pass. */
__global__ void prefill_merge_kernel(const attn_args a, const int *pf_tok, int n_pf, int V, float *acc_o,
                                     float *acc_lse, const float *pass_o, const float *pass_lse, int first)
{
    const int H = a.num_heads, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int row = blockIdx.x * warps + threadIdx.x / 32; row < n_pf * H; row += gridDim.x * warps) {
        const int n = row % H, t = pf_tok[row / H];
        const int64_t base = ((int64_t)t * H + n) * V, li = (int64_t)n * a.num_tokens + t;
        const float pl = pass_lse[li];
        if (first) {
            for (int c = lane; c < V; c += 32) acc_o[base + c] = pass_o[base + c];
            continue;
        }
        const float al = acc_lse[li];
        const float m = fmaxf(al, pl);
        if (m == -INFINITY) continue;   /* both empty: keep acc (zeros) */
        const float wa = expf(al - m), wp = expf(pl - m);
        for (int c = lane; c < V; c += 32) {
            const int64_t o = base + c;
            if (a.fault == AR_FAULT_MERGE_NO_WEIGHTS)
                acc_o[o] = acc_o[o] + pass_o[o];
            else
                acc_o[o] = acc_o[o] * (wa / (wa + wp)) + pass_o[o] * (wp / (wa + wp));
        }
    }
}

/* The LSE half of the merge (one thread per token and head, after prefill_merge_kernel). */
__global__ void prefill_merge_lse_kernel(const attn_args a, const int *pf_tok, int n_pf, float *acc_lse,
                                         const float *pass_lse, int first)
{
    const int H = a.num_heads;
    int64_t total = (int64_t)n_pf * H;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int n = (int)(idx % H);
        int t = pf_tok[idx / H];
        int64_t li = (int64_t)n * a.num_tokens + t;
        float pl = pass_lse[li];
        if (first) {
            acc_lse[li] = pl;
            continue;
        }
        float al = acc_lse[li];
        float m = fmaxf(al, pl);
        acc_lse[li] = m == -INFINITY ? -INFINITY : m + logf(expf(al - m) + expf(pl - m));
    }
}

/* Final prefill rows: out (rounded to dtype) and lse (log2 with the LSE_BASE2 fault), as
 * pf_out_value / pf_out_lse make them. */
__global__ void prefill_finish_kernel(const attn_args a, const int *pf_tok, int n_pf, int V, const float *acc_o,
                                      const float *acc_lse, float *out, float *lse)
{
    const int H = a.num_heads, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int row = blockIdx.x * warps + threadIdx.x / 32; row < n_pf * H; row += gridDim.x * warps) {
        const int n = row % H, t = pf_tok[row / H];
        const int64_t base = ((int64_t)t * H + n) * V;
        for (int c = lane; c < V; c += 32) out[base + c] = pf_out_value(a, acc_o[base + c]);
        if (lane == 0) lse[(int64_t)n * a.num_tokens + t] = pf_out_lse(a, acc_lse[(int64_t)n * a.num_tokens + t]);
    }
}

/* AR_FAULT_MLA_NO_WUV on the absorbed path: out = the first V latent columns, rounded. */
__global__ void latent_as_output_kernel(const float *o_lat, float *out, int T, int H, int V, int bf16)
{
    int64_t total = (int64_t)T * H * V;
    for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (int64_t)gridDim.x * blockDim.x) {
        int c = (int)(idx % V);
        int64_t th = idx / V;
        float v = o_lat[th * DL + c];
        out[idx] = bf16 ? ar_round_to(AR_BF16, v) : ar_round_to(AR_FP16, v);
    }
}

} /* namespace ar_mla */

#endif
