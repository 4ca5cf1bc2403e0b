/* cuda_attn_bf16.cu - the bf16 instantiations of the paged attention kernel (cuda_attn.cuh).
 * Kept apart from the fp16 ones so the two compile in parallel. */
#define AR_ATTN_KERNEL_BODY 1
#include "cuda_attn.cuh"

cudaError_t ar_attn_launch_bf16(int config, int hd, const ar_attn_args *a, int num_work,
                                cudaStream_t stream)
{
    return ar_attn::launch_typed<__nv_bfloat16, false>(config, hd, a, num_work, stream);
}

cudaError_t ar_attn_attributes_bf16(int config, int hd, int *ctas_per_sm)
{
    return ar_attn::attributes_typed<__nv_bfloat16, false>(config, hd, ctas_per_sm);
}
