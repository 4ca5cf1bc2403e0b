/* cuda_wgmma.cuh - Hopper (sm_90a) building blocks shared by the wgmma kernels of the paged
 * attention backend (cuda_attn_wgmma.cuh) and of the MLA backend (cuda_mla.cu): mbarriers
 * addressed by their shared-memory address, the wgmma shared-memory matrix descriptor with the
 * 128-byte swizzle, the warpgroup fence / commit / wait instructions, the generic-to-async proxy
 * fence, register reallocation between warpgroups (setmaxnreg), and the tensor memory accelerator
 * (TMA) loads that copy a box of a global tensor into shared memory and complete on an mbarrier
 * (the tensor maps are encoded on the host, ar_tma_encode in cuda_host.cuh).  Nothing here is
 * specific to a matrix shape; the wgmma instructions themselves live beside the kernels that
 * use them.  Everything is in namespace ar_wg. */
#ifndef AR_CUDA_WGMMA_CUH
#define AR_CUDA_WGMMA_CUH

#include <stdint.h>

namespace ar_wg {

/* ---- mbarriers (bar = shared-memory address of an 8-byte barrier) ---- */
__device__ __forceinline__ void mbar_init(uint32_t bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" :: "r"(bar) : "memory");
}
/* arrives on bar once every cp.async this thread issued so far has completed */
__device__ __forceinline__ void mbar_arrive_cp_async(uint32_t bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(bar) : "memory");
}
/* one arrival on bar that also raises the phase's expected transaction count by bytes: the phase
 * completes once every arrival is in and that many bytes of TMA copies have landed */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes) : "memory");
}
/* waits until the phase with the given parity (0 for the first completion, 1 for the second,
 * ...) has completed */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

/* The same wait with a warp-uniform exit: the warp leaves the loop together, on a vote.  For a
 * wait between the wgmma of one product inside a loop whose trip count ptxas cannot prove
 * uniform (the MLA transposed kernel's chain of pieces): there a per-thread exit puts the
 * warpgroup.arrive that ptxas inserts on a divergent path, and ptxas then serializes every wgmma
 * of the kernel (its C7520 "wgmma.mma_async instructions are serialized").  Every lane of the
 * warp must take part. */
__device__ __forceinline__ void mbar_wait_warp(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!__all_sync(0xffffffffu, done));
}

/* The same wait, asking the hardware to suspend the thread until the phase completes (for
 * at most about 10 ms per try) instead of returning at once: a waiting warp stops competing for
 * issue slots with the warps that do the work on its scheduler. */
__device__ __forceinline__ void mbar_wait_suspend(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity), "r"(10000000u) : "memory");
    } while (!done);
}

/* ---- 32-bit words addressed by their shared-memory address (a 32-bit register, where a
 * generic pointer takes two) ---- */
__device__ __forceinline__ void st_shared_s32(uint32_t addr, int v)
{
    asm volatile("st.shared.s32 [%0], %1;\n" :: "r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_shared_s32(uint32_t addr)
{
    int v;
    asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

/* ---- wgmma ---- */
/* Shared-memory matrix descriptor: start address, leading and stride byte offsets (stored in
 * 16-byte units), 128-byte swizzle (the tile's 1024-byte-aligned 8-row groups of 128-byte rows
 * have their 16-byte chunk c of row r at chunk position c ^ (r & 7)). */
__device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes)
{
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32) | ((uint64_t)1 << 62);
}
/* desc with its start address advanced by off16 16-byte units.  The sum stays in the low 32 bits
 * (address field and leading byte offset): shared addresses stay below 2^18, so the 14-bit address
 * field never carries.  A 64-bit add compiles to an add with carry and register moves before
 * every wgmma; this form to one 32-bit add: the paged prefill kernel 1.09x at head size 256 and
 * 1.01x at 128, the MLA kernels unchanged (H200, BENCHMARKS.md 2026-12-03). */
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t off16)
{
    return (desc & 0xFFFFFFFF00000000ull) | (uint64_t)((uint32_t)desc + off16);
}
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* waits until at most N committed wgmma groups of this warpgroup are still in flight */
template <int N> __device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory"); }
/* makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to the
 * async proxy (wgmma operand reads, bulk copies) */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* Keeps the compiler from moving reads or writes of an accumulator across an in-flight wgmma. */
template <int N> __device__ __forceinline__ void fence_regs(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* ---- TMA (cp.async.bulk.tensor); tmap = the address of a CUtensorMap kernel parameter declared
 * const __grid_constant__ (or of one in global memory) ---- */
/* Copies the box at element coordinates (c0 innermost, c1, c2) of the 3-D tensor tmap describes
 * to shared address dst (aligned as the map's swizzle needs: 1024 bytes for 128-byte swizzle);
 * the bytes count against bar's expected transactions.  Coordinates past the tensor's edge read
 * as zeros (and still count). */
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void *tmap, uint32_t bar, int c0, int c1, int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
                 :: "r"(dst), "l"(tmap), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
/* The same for a 2-D tensor (c0 innermost). */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void *tmap, uint32_t bar, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
                 :: "r"(dst), "l"(tmap), "r"(bar), "r"(c0), "r"(c1) : "memory");
}
/* tma_load_2d with an L2 cache policy (from l2_evict_first_policy). */
__device__ __forceinline__ void tma_load_2d_hint(uint32_t dst, const void *tmap, uint32_t bar, int c0, int c1, uint64_t policy)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%3, %4}], [%2], %5;\n"
                 :: "r"(dst), "l"(tmap), "r"(bar), "r"(c0), "r"(c1), "l"(policy) : "memory");
}
/* An L2 policy that evicts the lines it brings in first (data read once). */
__device__ __forceinline__ uint64_t l2_evict_first_policy()
{
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    return policy;
}
/* The same for a 4-D tensor (c0 innermost). */
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void *tmap, uint32_t bar, int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
                 :: "r"(dst), "l"(tmap), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
/* The same for a 5-D tensor (c0 innermost). */
__device__ __forceinline__ void tma_load_5d(uint32_t dst, const void *tmap, uint32_t bar, int c0, int c1, int c2, int c3,
                                            int c4)
{
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n"
                 :: "r"(dst), "l"(tmap), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4) : "memory");
}
/* Fetches the tensor map into the TMA unit's cache ahead of the first copy. */
__device__ __forceinline__ void tma_prefetch_map(const void *tmap)
{
    asm volatile("prefetch.tensormap [%0];\n" :: "l"(tmap) : "memory");
}

/* ---- register reallocation: every warp of the warpgroup executes it; counts multiple of 8 ---- */
template <int REGS> __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(REGS)); }
template <int REGS> __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(REGS)); }

} /* namespace ar_wg */

#endif
