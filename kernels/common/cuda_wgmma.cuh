/* cuda_wgmma.cuh - Hopper (sm_90a) building blocks shared by the wgmma kernels of the paged
 * attention backend (cuda_attn_wgmma.cuh) and of the MLA backend (cuda_mla.cu): mbarriers
 * addressed by their shared-memory address, the wgmma shared-memory matrix descriptor with the
 * 128-byte swizzle, the warpgroup fence / commit / wait instructions, the generic-to-async proxy
 * fence, register reallocation between warpgroups (setmaxnreg), and the tensor memory accelerator
 * (TMA) loads that copy a box of a global tensor into shared memory and complete on an mbarrier
 * (the tensor maps are encoded on the host, ar_tma_encode in cuda_host.cuh), the 128-byte
 * swizzled tile layout, and the wgmma products the backends' kernels share (m64n128k16 with A
 * from registers, m64n64k16 with A from registers or shared memory); the other wgmma shapes live
 * beside the kernels that use them.  Everything is in namespace ar_wg. */
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
/* The same for an accumulator held as [N][M] floats. */
template <int N, int M> __device__ __forceinline__ void fence_regs(float (&d)[N][M])
{
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < M; j++) asm volatile("" : "+f"(d[i][j])::"memory");
}

/* Byte offset of (row, 16-byte chunk) in a 128-byte-swizzled K-major tile stored as 64-dim column
 * parts (dims 0-63, 64-127, ...) of [rows][128 bytes], PART_BYTES apart, each part starting on a
 * 1024-byte boundary: chunk c of row r lies at chunk position c ^ (r & 7) of its part's row. */
template <int PART_BYTES> __device__ __forceinline__ uint32_t wg_swizzle(int row, int chunk)
{
    return (uint32_t)((chunk >> 3) * PART_BYTES + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}

/* The products, 16-bit operands (BF16: bf16, else fp16) and float accumulators.  The accumulator
 * d of an m64nN product holds N / 2 floats a thread: element i is row 16 (warp % 4) + lane / 4 +
 * 8 ((i >> 1) & 1) of the warpgroup's 64, column 8 (i >> 2) + 2 (lane % 4) + (i & 1) (the layout
 * of N / 8 mma.sync m16n8 tiles side by side).  An A operand from registers (a[4]) is the
 * mma.sync m16n8k16 A fragment of the warp's 16 rows, so the accumulator of S = Q K^T converts
 * in place to the A operand of P V.  accumulate 0: d = A B. */
/* d [64 x 128] (+)= A B, A from registers, B [16 x 128] from shared memory (desc_b): TRANS_B
 * true reads B transposed ("MN-major": its N side contiguous, as V stored [keys][dims] for
 * P V), false K-major (as K stored [keys][dims] for S = Q K^T). */
template <bool BF16, bool TRANS_B>
__device__ __forceinline__ void mma_rs_m64n128(float *d, const uint32_t a[4], uint64_t desc_b, int accumulate);
/* d [64 x 64] (+)= A B, A (desc_a: 64 rows) and B (desc_b: 64 rows) both from shared memory and
 * K-major. */
template <bool BF16>
__device__ __forceinline__ void mma_ss_m64n64(float *d, uint64_t desc_a, uint64_t desc_b, int accumulate);
/* d [64 x 64] (+)= A B, A [64 x 16] from registers (a[4], as mma_rs_m64n128's), B [16 x 64] from
 * shared memory, K-major */
template <bool BF16>
__device__ __forceinline__ void mma_rs_m64n64(float *d, const uint32_t a[4], uint64_t desc_b, int accumulate);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The inline-assembly pieces: the accumulator operands ("+f"(d[0]) ..) and each instruction's
 * text with the operand type (TY: ".bf16" or ".f16") left open. */
#define AR_WG_ACC32(d) \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define AR_WG_ACC64(d) \
    AR_WG_ACC32(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), \
    "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), \
    "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), \
    "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), \
    "+f"(d[63])
/* TNSP "1": B transposed, "0": K-major; the accumulate flag is operand 69 */
#define AR_WGMMA_RS128_TEXT(TY, TNSP) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n128k16.f32" TY TY " " \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, " \
    "1, 1, " TNSP ";\n}\n"
/* the accumulate flag is operand 37 */
#define AR_WGMMA_RS64_TEXT(TY) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32" TY TY " " \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, " \
    "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
/* the accumulate flag is operand 34 */
#define AR_WGMMA_SS64_TEXT(TY) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32" TY TY " " \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"

template <bool BF16, bool TRANS_B>
__device__ __forceinline__ void mma_rs_m64n128(float *d, const uint32_t a[4], uint64_t desc_b, int accumulate)
{
    if constexpr (BF16 && TRANS_B)
        asm volatile(AR_WGMMA_RS128_TEXT(".bf16", "1") : AR_WG_ACC64(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
    else if constexpr (BF16)
        asm volatile(AR_WGMMA_RS128_TEXT(".bf16", "0") : AR_WG_ACC64(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
    else if constexpr (TRANS_B)
        asm volatile(AR_WGMMA_RS128_TEXT(".f16", "1") : AR_WG_ACC64(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
    else
        asm volatile(AR_WGMMA_RS128_TEXT(".f16", "0") : AR_WG_ACC64(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
template <bool BF16>
__device__ __forceinline__ void mma_ss_m64n64(float *d, uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    if constexpr (BF16)
        asm volatile(AR_WGMMA_SS64_TEXT(".bf16") : AR_WG_ACC32(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
    else
        asm volatile(AR_WGMMA_SS64_TEXT(".f16") : AR_WG_ACC32(d) : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
template <bool BF16>
__device__ __forceinline__ void mma_rs_m64n64(float *d, const uint32_t a[4], uint64_t desc_b, int accumulate)
{
    if constexpr (BF16)
        asm volatile(AR_WGMMA_RS64_TEXT(".bf16") : AR_WG_ACC32(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
    else
        asm volatile(AR_WGMMA_RS64_TEXT(".f16") : AR_WG_ACC32(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
#undef AR_WG_ACC32
#undef AR_WG_ACC64
#undef AR_WGMMA_RS64_TEXT
#undef AR_WGMMA_RS128_TEXT
#undef AR_WGMMA_SS64_TEXT
#endif /* __CUDA_ARCH_FEAT_SM90_ALL */

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
