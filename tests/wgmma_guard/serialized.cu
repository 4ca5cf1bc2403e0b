/* serialized.cu - a kernel that ptxas must serialise, for tests/wgmma_guard_check.sh: one of its
 * accumulators is written while the wgmma that accumulates into it is in flight (CUDA 13.0's ptxas
 * reports C7511 for it).
 * Not part of any build; the check compiles it through the Makefile's .cu rule, whose
 * guard (kernels/nvcc_guard.sh) must then fail the build.  clean.cu is the same kernel without that write. */
#include <cstdint>

__global__ void wgmma_guard_probe(float *out, uint64_t desc_a, uint64_t desc_b)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    float d[4] = {0.f, 0.f, 0.f, 0.f};   /* [64 x 8] fp32 accumulator tile, this thread's 4 */
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    for (int k = 0; k < 2; k++) {
        asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 0;\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "l"(desc_a), "l"(desc_b));
#ifndef WGMMA_GUARD_CLEAN
        d[0] += 1.f;   /* the accumulator written inside the wgmma's stage */
#endif
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
#else
    (void)desc_a;
    (void)desc_b;
    out[threadIdx.x] = 0.f;
#endif
}
