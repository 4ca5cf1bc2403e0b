/* cuda_host.cuh - host-side helpers both CUDA backends (cuda_backend.cu, cuda_mla.cu) share:
 * a grow-only device buffer, CUDA error text with the backend's name, grow-only device and
 * pinned host allocations, and the encoding of TMA tensor maps (through the driver entry point
 * the runtime hands out, so nothing links libcuda).  Header-only (static) so each .cu keeps its
 * own copy of the code. */
#ifndef AR_CUDA_HOST_CUH
#define AR_CUDA_HOST_CUH

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stddef.h>
#include <stdio.h>

/* A device allocation that only grows. */
typedef struct dev_buf {
    void *ptr;
    size_t cap;
} dev_buf;

/* 0 for cudaSuccess, else 3 with "WHO: WHAT: <CUDA error>" in err. */
static inline int ar_cuda_fail(cudaError_t e, const char *who, const char *what, char *err, size_t err_len)
{
    if (e == cudaSuccess) return 0;
    snprintf(err, err_len, "%s: %s: %s", who, what, cudaGetErrorString(e));
    return 3;
}

static inline size_t ar_round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Makes b hold at least need bytes (with 25% headroom, 4 KiB granules); 0 or 3 with err set. */
static inline int ar_cuda_ensure_dev(dev_buf *b, size_t need, const char *who, const char *what,
                                     char *err, size_t err_len)
{
    if (need <= b->cap) return 0;
    if (b->ptr) cudaFree(b->ptr);
    b->ptr = NULL;
    b->cap = 0;
    size_t cap = ar_round_up(need + need / 4, 4096);
    cudaError_t e = cudaMalloc(&b->ptr, cap);
    if (e != cudaSuccess) return ar_cuda_fail(e, who, what, err, err_len);
    b->cap = cap;
    return 0;
}

/* The same for a pinned host buffer *p of capacity *cap. */
static inline int ar_cuda_ensure_host(void **p, size_t *cap, size_t need, const char *who,
                                      char *err, size_t err_len)
{
    if (need <= *cap) return 0;
    if (*p) cudaFreeHost(*p);
    *p = NULL;
    *cap = 0;
    size_t c = ar_round_up(need + need / 4, 4096);
    cudaError_t e = cudaMallocHost(p, c);
    if (e != cudaSuccess) return ar_cuda_fail(e, who, "pinned host buffer", err, err_len);
    *cap = c;
    return 0;
}

/* True when a CUDA device is present; else false with "no CUDA device (...)" in why (the
 * phrase replay's exit code 3 and the selector's report key on). */
static inline bool ar_cuda_have_device(char *why, size_t why_len)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "no CUDA device (%s)", cudaGetErrorString(e));
        cudaGetLastError();
        return false;
    }
    if (count == 0) {
        snprintf(why, why_len, "no CUDA device (cudaGetDeviceCount found 0)");
        return false;
    }
    return true;
}

/* Device 0 is present and can run mma.sync (compute capability 8.0 or newer); why says
 * "supported on NAME" or the reason it is not. */
static inline bool ar_cuda_device_ok(char *why, size_t why_len)
{
    if (!ar_cuda_have_device(why, why_len)) return false;
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, 0);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "no CUDA device (%s)", cudaGetErrorString(e));
        cudaGetLastError();
        return false;
    }
    if (prop.major < 8) {
        snprintf(why, why_len, "%s has compute capability %d.%d; needs 8.0 or newer (mma.sync)",
                 prop.name, prop.major, prop.minor);
        return false;
    }
    snprintf(why, why_len, "supported on %s", prop.name);
    return true;
}

/* Encodes in *map the TMA view of a global tensor of 16-bit elements with rank dimensions
 * dims[0] (contiguous) .. dims[rank - 1], row strides stride_bytes[0 .. rank - 2] (between
 * consecutive indices of dims[1], dims[2], ...), and a box of box[0 .. rank - 1] elements read
 * with the 128-byte swizzle (box[0] * 2 must be 128 or less).  Out-of-range coordinates read as
 * zeros.  0, or 3 with "WHO: tensor map: <reason>" in err (no driver entry point, or the driver
 * refused the shape: a stride not a multiple of 16, a base not 16-byte aligned, ...). */
static inline int ar_tma_encode(CUtensorMap *map, const void *base, int rank, const uint64_t *dims,
                                const uint64_t *stride_bytes, const uint32_t *box, const char *who,
                                char *err, size_t err_len)
{
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    if (!encode) {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                         cudaEnableDefault, &found);
        if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || !fn) {
            snprintf(err, err_len, "%s: tensor map: the driver has no cuTensorMapEncodeTiled (%s)", who,
                     cudaGetErrorString(e));
            cudaGetLastError();
            return 3;
        }
        encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    }
    cuuint64_t gdim[5], gstride[4];
    cuuint32_t gbox[5], estride[5];
    for (int i = 0; i < rank; i++) {
        gdim[i] = dims[i];
        gbox[i] = box[i];
        estride[i] = 1;
        if (i + 1 < rank) gstride[i] = stride_bytes[i];
    }
    CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT16, (cuuint32_t)rank, (void *)base, gdim, gstride,
                        gbox, estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        snprintf(err, err_len, "%s: tensor map: cuTensorMapEncodeTiled refused the shape (CUresult %d)", who, (int)r);
        return 3;
    }
    return 0;
}

#endif
