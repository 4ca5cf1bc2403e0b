/* cuda_attn_bf16_kv8.cu - the bf16 instantiations of the paged attention kernel (cuda_attn.cuh)
 * for an fp8 e4m3 cache (the PREFILL and DECODE mma.sync kernels).  A file of its own so that
 * it compiles in parallel with the 16-bit-cache ones. */
#define AR_ATTN_KERNEL_BODY 1
#include "cuda_attn.cuh"

cudaError_t ar_attn_launch_bf16_kv8(int config, int hd, const ar_attn_args *a, int num_work,
                                    cudaStream_t stream)
{
    return ar_attn::launch_typed<__nv_bfloat16, true>(config, hd, a, num_work, stream);
}

cudaError_t ar_attn_attributes_bf16_kv8(int config, int hd, int *ctas_per_sm)
{
    return ar_attn::attributes_typed<__nv_bfloat16, true>(config, hd, ctas_per_sm);
}
