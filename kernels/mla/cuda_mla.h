/* cuda_mla.h - the CUDA MLA backend "cuda-mla" (DeepSeek-V2/V3 multi-head latent attention on
 * the latent paged cache [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]) and the
 * overrides its GPU test uses.
 *
 * The backend is kernels/mla/cuda_mla.cu (the decode launch in kernels/mla/); on a machine without
 * nvcc, kernels/mla/cuda_mla_stub.c defines the same symbols and check() says why it cannot run.
 * Everything has C linkage.  The test hook that runs single FlashMLA-shaped cases is
 * kernels/mla/cuda_mla_case.h (linked into the tests, not into bin/attnreplay).
 *
 * Data recipe of the backend (bit-identical with the CPU, reference/datagen.h):
 *   latent entry of a token  ar_gen(ar_gen_row(seed, AR_STREAM_LATENT, layer, block key,
 *                            offset in block, head 0), d, dist, dtype), d < 576, then stored
 *                            through ar_kv_roundtrip (fp8 cache: quantize(x / kv_scale));
 *   q_nope [token, head, 128] ar_gen(row(seed, AR_STREAM_Q_NOPE, layer, request key, absolute
 *                            position, head), d, dist, dtype);
 *   q_pe   [token, head, 64]  the same with AR_STREAM_Q_PE;
 *   W_UK[l, head, p]          ar_mla_weight(seed, AR_STREAM_W_UK, layer, 512, l, head, p, dist, dtype)
 *                            (reference/mla_ref.h), l < 512, p < qk_nope_head_dim;
 *   W_UV[l, head, v]          the same with AR_STREAM_W_UV, v < v_head_dim. */
#ifndef AR_CUDA_MLA_H
#define AR_CUDA_MLA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "../../replay/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const ar_backend ar_cuda_mla_backend;

/* Query length up to which a request takes the absorbed (decode) path, FlashMLA's
 * reorder_batch_threshold; longer ones take the prefill path (semantics 7.3). */
#define AR_CUDA_MLA_DECODE_THRESHOLD 128

/* Latent-attention kernel: AUTO is the decision function's choice (kernels/mla/mla_route.h:
 * on Hopper the 64-row wgmma kernel over 32 rows a request, its transposed twin up to 32 (with
 * an fp8 cache up to 16); off Hopper or with an fp8 cache over 16 rows the mma.sync kernels;
 * SIMT where their shared memory does not fit).  The others force a kernel where it can run: SIMT the plain SIMT kernel; TC_SPLIT_QK the
 * mma.sync 64-row kernel; TC_WGMMA the wgmma kernel (compute capability 9.0 and a bf16/fp16 cache;
 * elsewhere TC_SPLIT_QK; forced, it is the 64-row kernel also for requests of at most 32 rows,
 * which AUTO gives its transposed twin); TC_NARROW the mma.sync narrow 16-row kernel where every
 * request has at most 16 rows (else as TC_WGMMA); TC_NARROW_BULK the bulk-copy narrow kernel
 * likewise (compute capability 9 or more and a bf16/fp16 cache; else TC_NARROW's).  The
 * environment variable AR_MLA_KERNEL=simt|tc-split-qk|tc-wgmma|tc-narrow|tc-narrow-bulk selects
 * one for the backend. */
typedef enum ar_cuda_mla_kernel {
    AR_MLA_KERNEL_AUTO = 0,
    AR_MLA_KERNEL_SIMT = 1,
    AR_MLA_KERNEL_TC_SPLIT_QK = 2,
    AR_MLA_KERNEL_TC_WGMMA = 3,
    AR_MLA_KERNEL_TC_NARROW = 4,
    AR_MLA_KERNEL_TC_NARROW_BULK = 5
} ar_cuda_mla_kernel;

/* Overrides for tests (state from ar_cuda_mla_backend.open): kernel, forced split count
 * (0 = the heuristic), and whether long queries take the chunked up-projected prefill path
 * (1, the default) or the absorbed path (0). */
void ar_cuda_mla_set_plan(void *state, ar_cuda_mla_kernel kernel, int num_splits, int use_prefill_path);

/* Workspace bound of the prefill path in tokens per context chunk (default 4096; tests use a
 * small one to get several chunks from short contexts).  Values < 16 are read as 16. */
void ar_cuda_mla_set_workspace(void *state, int tokens);

/* The prefill path's attention kernels (AR_MLA_PREFILL): the Hopper wgmma kernel with two
 * warpgroups fed by TMA (pingpong: the default for QK 192 / V 128 on compute capability 9.0),
 * the mma.sync one (tc: the default elsewhere) and the SIMT one (other shapes, or simt). */
typedef enum ar_mla_prefill_attn {
    AR_MLA_PF_ATTN_NONE = 0,
    AR_MLA_PF_ATTN_SIMT,
    AR_MLA_PF_ATTN_TC,
    AR_MLA_PF_ATTN_PINGPONG,
} ar_mla_prefill_attn;

/* What the last forward did. */
typedef struct ar_cuda_mla_plan_info {
    int num_decode_reqs;      /* requests on the absorbed path */
    int num_prefill_reqs;     /* requests on the prefill path */
    int num_work;             /* CTAs of the latent-attention launch */
    int num_groups;           /* row tiles whose split pieces the combine kernel merged */
    int num_context_chunks;   /* prefill context chunks (workspace-bounded) */
    int num_sms;
    int gemm_tc;              /* 1: the projections' GEMMs not through cuBLAS ran on the tensor-core kernel
                                 (all but AR_MLA_GEMM=simt) */
    int prefill_attn;         /* the kernel the prefill requests' attention ran on (ar_mla_prefill_attn;
                                 AR_MLA_PF_ATTN_NONE without a prefill request) */
    int gemm_cublas;          /* 1: the 16-bit projection GEMMs ran through cuBLAS (the default where it loads) */
    int decode_row_runs;      /* runs of consecutive decode tokens the absorption and W_UV GEMMs ran on */
    int decode_rows_span;     /* 1: too many runs; one span from the first decode token to the step's last */
} ar_cuda_mla_plan_info;
void ar_cuda_mla_plan_of(void *state, ar_cuda_mla_plan_info *info);

#ifdef __cplusplus
}
#endif
#endif
