/* cuda_host.cuh - host-side helpers both CUDA backends (cuda_backend.cu, cuda_mla.cu) share
 * (and the plugin host's CUDA side, replay/plugin_cuda.cu, its event pool):
 * a grow-only device buffer, CUDA error text with the backend's name, grow-only device and
 * pinned host allocations, the batch's checks and its arrays in the packed metadata buffer,
 * the check of the output buffers' guard regions on the device, a pool of timing events and the
 * times read from it, the encoding of TMA tensor maps (through the driver entry point the
 * runtime hands out, so nothing links libcuda).  (The environment's switches: env_knobs.h.)
 * Header-only (static) so each .cu keeps its own copy of the code. */
#ifndef AR_CUDA_HOST_CUH
#define AR_CUDA_HOST_CUH

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../replay/backend.h"

/* A device allocation that only grows. */
typedef struct dev_buf {
    void *ptr;
    size_t cap;
} dev_buf;

/* 0 for cudaSuccess, else 3 with "WHO: WHAT: <CUDA error>" in err. */
static inline int ar_cuda_fail(cudaError_t e, const char *who, const char *what, char *err, size_t err_len)
{
    if (e == cudaSuccess) return 0;
    /* the errors that leave the context unusable (every later call fails the same way) */
    const bool sticky = e == cudaErrorIllegalAddress || e == cudaErrorLaunchFailure || e == cudaErrorAssert ||
                        e == cudaErrorIllegalInstruction || e == cudaErrorMisalignedAddress ||
                        e == cudaErrorInvalidAddressSpace || e == cudaErrorInvalidPc ||
                        e == cudaErrorHardwareStackError || e == cudaErrorLaunchTimeout;
    snprintf(err, err_len, "%s: %s: %s%s", who, what, cudaGetErrorString(e),
             sticky ? " (a kernel fault: the CUDA context is unusable from here on, so the run stops)" : "");
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

/* 0 when the step's batch fits a cache of nb blocks of bs tokens (request and token counts,
 * query_start_loc from 0 to num_tokens, 0 <= query_len <= seq_len <= max_blocks_per_req x bs,
 * the block table's used entries and the slot mapping inside the cache); else 2 with the
 * broken rule in err. */
static inline int ar_cuda_check_batch(const ar_batch *b, int bs, int nb, char *err, size_t err_len)
{
    const int R = b->num_reqs, T = b->num_tokens, mbpr = b->max_blocks_per_req;
    if (R < 0 || T < 0 || (R > 0 && mbpr <= 0)) {
        snprintf(err, err_len, "step %lld: batch has num_reqs %d, num_tokens %d, max_blocks_per_req %d",
                 (long long)b->step, R, T, mbpr);
        return 2;
    }
    if (R > 0 && (b->query_start_loc[0] != 0 || b->query_start_loc[R] != T)) {
        snprintf(err, err_len, "step %lld: query_start_loc must run from 0 to num_tokens %d",
                 (long long)b->step, T);
        return 2;
    }
    for (int r = 0; r < R; r++) {
        int ql = b->query_start_loc[r + 1] - b->query_start_loc[r], sl = b->seq_lens[r];
        if (ql < 0 || sl < ql || sl > mbpr * bs) {
            snprintf(err, err_len,
                     "step %lld: request %d has query_len %d, seq_len %d (rule: 0 <= query_len <= seq_len <= "
                     "max_blocks_per_req * block_size = %d)",
                     (long long)b->step, r, ql, sl, mbpr * bs);
            return 2;
        }
        for (int i = 0; i < (sl + bs - 1) / bs; i++) {
            int blk = b->block_table[(int64_t)r * mbpr + i];
            if (blk < 0 || blk >= nb) {
                snprintf(err, err_len, "step %lld: request %d block_table[%d] = %d outside [0, %d)",
                         (long long)b->step, r, i, blk, nb);
                return 2;
            }
        }
    }
    for (int t = 0; t < T; t++) {
        int64_t sl = b->slot_mapping[t];
        if (sl < -1 || sl >= (int64_t)nb * bs) {
            snprintf(err, err_len, "step %lld: slot_mapping[%d] = %lld outside [-1, %lld)", (long long)b->step,
                     t, (long long)sl, (long long)nb * bs);
            return 2;
        }
    }
    return 0;
}

/* Places `bytes` at the next 16-byte boundary of a packed metadata buffer; returns the offset. */
static inline size_t ar_meta_take(size_t *off, size_t bytes)
{
    size_t at = ar_round_up(*off, 16);
    *off = at + bytes;
    return at;
}

/* Where the batch's own arrays sit in a backend's packed metadata buffer (offsets), first in
 * it: query_start_loc, seq_lens, block_table, each token's request and position, slot_mapping,
 * request keys, block keys. */
typedef struct ar_batch_meta {
    size_t qsl, seq, bt, treq, tpos, slots, rkeys, bkeys;
} ar_batch_meta;

static inline ar_batch_meta ar_batch_meta_layout(size_t *off, int R, int T, int mbpr)
{
    ar_batch_meta m;
    m.qsl = ar_meta_take(off, (size_t)(R + 1) * 4);
    m.seq = ar_meta_take(off, (size_t)R * 4);
    m.bt = ar_meta_take(off, (size_t)R * mbpr * 4);
    m.treq = ar_meta_take(off, (size_t)T * 4);
    m.tpos = ar_meta_take(off, (size_t)T * 4);
    m.slots = ar_meta_take(off, (size_t)T * 8);
    m.rkeys = ar_meta_take(off, (size_t)R * 8);
    m.bkeys = ar_meta_take(off, (size_t)R * mbpr * 8);
    return m;
}

/* Writes the batch's arrays into the staging copy h of the metadata buffer. */
static inline void ar_batch_meta_fill(const ar_batch_meta *m, unsigned char *h, const ar_batch *b)
{
    const int R = b->num_reqs, T = b->num_tokens, mbpr = b->max_blocks_per_req;
    memcpy(h + m->qsl, b->query_start_loc, (size_t)(R + 1) * 4);
    memcpy(h + m->seq, b->seq_lens, (size_t)R * 4);
    memcpy(h + m->bt, b->block_table, (size_t)R * mbpr * 4);
    int *treq = (int *)(h + m->treq), *tpos = (int *)(h + m->tpos);
    for (int r = 0; r < R; r++) {
        int q0 = b->query_start_loc[r], ql = b->query_start_loc[r + 1] - q0, ctx = b->seq_lens[r] - ql;
        for (int i = 0; i < ql; i++) {
            treq[q0 + i] = r;
            tpos[q0 + i] = ctx + i;
        }
    }
    memcpy(h + m->slots, b->slot_mapping, (size_t)T * 8);
    memcpy(h + m->rkeys, b->req_keys, (size_t)R * 8);
    memcpy(h + m->bkeys, b->block_keys, (size_t)R * mbpr * 8);
}

/* Counts the 32-bit words of the four guard regions that lost the 0xA5 pattern: the `guard`
 * bytes before and after the out payload (out_payload bytes at out + guard) and the same around
 * the LSE payload; *count += that number.  One block. */
static __global__ void ar_guard_count_kernel(const unsigned char *out, size_t out_payload, const unsigned char *lse,
                                             size_t lse_payload, int guard, int *count)
{
    const int words = guard / 4;
    int bad = 0;
    for (int i = threadIdx.x; i < 4 * words; i += blockDim.x) {
        const int region = i / words, w = i % words;
        const unsigned char *base = region == 0 ? out : region == 1 ? out + guard + out_payload
                                  : region == 2 ? lse : lse + guard + lse_payload;
        if (reinterpret_cast<const unsigned *>(base)[w] != 0xA5A5A5A5u) bad++;
    }
    if (bad) atomicAdd(count, bad);
}

/* A backend's output buffers: out and LSE payloads of out_payload / lse_payload bytes, each with
 * `guard` bytes of 0xA5 before and after (out and lse point at the first guard byte). */
typedef struct ar_cuda_outbufs {
    void *out, *lse;
    size_t out_payload, lse_payload;
    int guard;
} ar_cuda_outbufs;

/* What ends a forward, enqueued on st after its last repeat: the guard check into d_count with
 * the count copied to the pinned *h_count; when host is non-NULL, copies of the first out_copy
 * bytes of the out payload and lse_copy bytes of the LSE payload to host (one after the other);
 * then the event done.  *h_count and host are valid once done has completed. */
static inline cudaError_t ar_cuda_forward_tail(cudaStream_t st, const ar_cuda_outbufs *b, int *d_count, int *h_count,
                                               void *host, size_t out_copy, size_t lse_copy, cudaEvent_t done)
{
    cudaError_t e = cudaMemsetAsync(d_count, 0, sizeof *d_count, st);
    if (e != cudaSuccess) return e;
    ar_guard_count_kernel<<<1, 256, 0, st>>>((const unsigned char *)b->out, b->out_payload,
                                             (const unsigned char *)b->lse, b->lse_payload, b->guard, d_count);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if ((e = cudaMemcpyAsync(h_count, d_count, sizeof *h_count, cudaMemcpyDeviceToHost, st)) != cudaSuccess) return e;
    if (host) {
        if ((e = cudaMemcpyAsync(host, (const char *)b->out + b->guard, out_copy, cudaMemcpyDeviceToHost, st)) !=
                cudaSuccess ||
            (e = cudaMemcpyAsync((char *)host + out_copy, (const char *)b->lse + b->guard, lse_copy,
                                 cudaMemcpyDeviceToHost, st)) != cudaSuccess)
            return e;
    }
    return cudaEventRecord(done, st);
}

/* A grow-only pool of timing events: a forward's repeats each take their own run of events, so
 * that all of them are enqueued back to back and waited for once (a wait between repeats would
 * leave the GPU idle there, and its clocks and power budget recover as they would not under an
 * engine's steps or a peer's back-to-back timing). */
typedef struct ar_event_pool {
    cudaEvent_t *ev;
    int n;
} ar_event_pool;

/* At least need events in the pool; a cudaError_t (the pool keeps what it had on failure). */
static inline cudaError_t ar_event_pool_reserve(ar_event_pool *p, int need)
{
    if (need <= p->n) return cudaSuccess;
    cudaEvent_t *ev = (cudaEvent_t *)realloc(p->ev, sizeof(cudaEvent_t) * (size_t)need);
    if (!ev) return cudaErrorMemoryAllocation;
    p->ev = ev;
    for (; p->n < need; p->n++) {
        cudaError_t e = cudaEventCreate(&p->ev[p->n]);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

/* A forward's times from the pool, its repeats' runs of per_pass events back to back:
 * times[k * repeat + i] = the microseconds from event k to event k + 1 of repeat i for the parts
 * k < timed (0 for parts k >= timed, which have no events of their own), and
 * times[parts * repeat + i] = repeat i's sum over the parts. */
static inline void ar_event_pool_times(const ar_event_pool *p, int repeat, int per_pass, int timed, int parts,
                                       double *times)
{
    for (int i = 0; i < repeat; i++) {
        const cudaEvent_t *ev = p->ev + (size_t)per_pass * i;
        double total = 0;
        for (int k = 0; k < parts; k++) {
            float ms = 0;
            if (k < timed) cudaEventElapsedTime(&ms, ev[k], ev[k + 1]);
            times[(size_t)k * repeat + i] = ms * 1e3;
            total += ms * 1e3;
        }
        times[(size_t)parts * repeat + i] = total;
    }
}

static inline void ar_event_pool_free(ar_event_pool *p)
{
    for (int i = 0; i < p->n; i++) cudaEventDestroy(p->ev[i]);
    free(p->ev);
    p->ev = NULL;
    p->n = 0;
}

/* Writes the guard pattern back into the four guard regions (after a forward found them hit). */
static inline void ar_cuda_restamp_guards(cudaStream_t st, const ar_cuda_outbufs *b)
{
    cudaMemsetAsync(b->out, 0xA5, b->guard, st);
    cudaMemsetAsync((char *)b->out + b->guard + b->out_payload, 0xA5, b->guard, st);
    cudaMemsetAsync(b->lse, 0xA5, b->guard, st);
    cudaMemsetAsync((char *)b->lse + b->guard + b->lse_payload, 0xA5, b->guard, st);
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
