/* racecheck_probe.cu - a diagnostic, not a kernel variant: the MLA pairs kernel's epilogue row-sum
 * exchange (each warpgroup's quad leaders write their half of s_sum, __syncthreads(), every thread
 * reads both halves) alone and behind each synchronisation that kernel uses before it, to find
 * which one makes compute-sanitizer's racecheck report hazards across the __syncthreads()
 * (RELIABILITY.md, the pairs kernel's epilogue reports).  One CTA of 256 threads a launch.
 *
 *   build: nvcc -O3 -gencode arch=compute_90a,code=sm_90a -lineinfo racecheck_probe.cu -o probe
 *   run:   compute-sanitizer --tool racecheck ./probe MODE [SMEM_KB]
 *   MODE   0 the exchange alone
 *          1 before it, each warpgroup syncs on its own 128-thread named barrier (5, 6) a different
 *            number of times (the pairs kernel's TAIL zeroing)
 *          2 before it, four named-barrier hand-overs (one warpgroup bar.arrive, the other bar.sync)
 *          3 before it, the same hand-overs on mbarriers
 *          4 modes 1 and 2 together (the product pairs kernel's mix)
 *   SMEM_KB dynamic shared memory of the launch (default 1; the pairs kernel takes 226)
 * Prints the sums it read; a wrong sum exits 1. */
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__device__ __forceinline__ void bar_sync_n(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive_n(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity)
{
    asm volatile("{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}

__global__ void __launch_bounds__(256, 1) probe_kernel(int mode, float *out)
{
    extern __shared__ __align__(16) unsigned char smem[];
    float *const s_sum = reinterpret_cast<float *>(smem);          /* [2][64] */
    float *const s_x = s_sum + 128;                                 /* [64] a hand-over value */
    unsigned long long *const bars = reinterpret_cast<unsigned long long *>(smem + 1024 - 64);
    const unsigned bar0 = (unsigned)__cvta_generic_to_shared(bars);
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, warp4 = (tid >> 5) & 3, tig = lane & 3;
    const int lr0 = warp4 * 16 + (lane >> 2), lr1 = lr0 + 8;
    if (tid == 0)
        for (int i = 0; i < 4; i++) mbar_init(bar0 + 8u * i, 128);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncthreads();
    float l0 = (float)(wg * 1000 + lr0), l1 = (float)(wg * 1000 + lr1);
    if (mode == 1 || mode == 4)   /* wg 0: three syncs of its own, wg 1: one */
        for (int k = 0; k < (wg ? 1 : 3); k++) bar_sync_n(5 + wg, 128);
    if (mode == 2 || mode == 4 || mode == 3) {
        for (int pair = 0; pair < 2; pair++) {
            /* wg 0 writes s_x, hands over (id 1); wg 1 reads it, writes, hands back (id 2) */
            if (wg == 0) {
                if (tig == 0) s_x[lr0] = l0 + pair;
                if (mode == 3) mbar_arrive(bar0); else bar_arrive_n(1, 256);
                if (mode == 3) mbar_wait(bar0 + 8, pair & 1); else bar_sync_n(2, 256);
                l0 += s_x[lr1];
            } else {
                if (mode == 3) mbar_wait(bar0, pair & 1); else bar_sync_n(1, 256);
                l1 += s_x[lr0];
                __syncwarp();
                if (tig == 0) s_x[lr1] = l1;
                if (mode == 3) mbar_arrive(bar0 + 8); else bar_arrive_n(2, 256);
            }
        }
    }
    /* the epilogue's exchange */
    __syncthreads();   /* every hand-over's reads of s_x are done (the sums below use s_sum only) */
    if (tig == 0) {
        s_sum[wg * 64 + lr0] = l0;
        s_sum[wg * 64 + lr1] = l1;
    }
    __syncthreads();
    const float a = s_sum[lr0] + s_sum[64 + lr0], b = s_sum[lr1] + s_sum[64 + lr1];
    if (tig == 0) {
        out[wg * 64 + lr0] = a;
        out[wg * 64 + lr1] = b;
    }
}

int main(int argc, char **argv)
{
    const int mode = argc > 1 ? atoi(argv[1]) : 0, kb = argc > 2 ? atoi(argv[2]) : 1;
    const size_t smem = (size_t)(kb < 1 ? 1 : kb) * 1024;
    if (cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
        fprintf(stderr, "racecheck_probe: %zu bytes of shared memory refused\n", smem);
        return 2;
    }
    float *d = nullptr, h[128];
    cudaMalloc(&d, sizeof h);
    for (int rep = 0; rep < 3; rep++) probe_kernel<<<1, 256, smem>>>(mode, d);
    cudaError_t e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        fprintf(stderr, "racecheck_probe: %s\n", cudaGetErrorString(e));
        return 2;
    }
    /* each row's two sums: wg 0's value + wg 1's, the same for both warpgroups' copies */
    int bad = 0;
    for (int r = 0; r < 64; r++) bad += h[r] != h[64 + r];
    printf("racecheck_probe mode %d, %d KB: row 0 %.0f, row 63 %.0f, %d rows differ between the warpgroups\n", mode,
           kb, h[0], h[63], bad);
    cudaFree(d);
    return bad ? 1 : 0;
}
