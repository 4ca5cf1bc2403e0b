/* plugin_dev.h - the host's CUDA side for CUDA plugins (replay/plugin_cuda.cu; on a build
 * without nvcc, replay/plugin_cuda_stub.c, where every call fails with "built without CUDA").
 *
 * What a CUDA plugin needs from the host and cannot do for itself: a stream and events to be
 * timed on, device buffers (the paged caches, this step's inputs and outputs, the metadata),
 * the inputs generated on the device by the project's generator (reference/datagen.h, so they
 * are bit-identical to what the verifier regenerates), and, for a plugin without
 * ATTNREPLAY_PLUGIN_WRITES_KV, the write of the new K/V into the cache through slot_mapping
 * (vLLM's reshape_and_cache).  For an MLA plugin also the projections around its latent
 * attention: W_UK / W_UV generated on the device, q_nope absorbed into the plugin's query and its
 * latent output multiplied by W_UV (untimed).  Everything runs on the one stream, in order; only
 * the calls that return host data (download, elapsed, guard check) wait for it.  C linkage
 * throughout. */
#ifndef AR_PLUGIN_DEV_H
#define AR_PLUGIN_DEV_H

#include <stddef.h>
#include <stdint.h>
#include "../reference/datagen.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ar_pdev ar_pdev;

#define AR_PDEV_EVENTS 16   /* timing events a forward (a repeat): start, write, marks, end */

/* 0 when a CUDA device can be used; else why ("built without CUDA support", "no CUDA device"). */
int ar_pdev_probe(char *why, size_t why_len);
/* Devices the CUDA runtime sees (CUDA_VISIBLE_DEVICES applied); 0 without CUDA or a device. */
int ar_pdev_count(void);
/* Device `device` (an ordinal among the visible ones), a non-blocking stream and
 * AR_PDEV_EVENTS timing events.  0 ok, else 3 with err set. */
int ar_pdev_open(ar_pdev **d, int device, char *err, size_t err_len);
void ar_pdev_close(ar_pdev *d);
void *ar_pdev_stream(ar_pdev *d);               /* the cudaStream_t */
int ar_pdev_device_id(const ar_pdev *d);
void ar_pdev_device_name(const ar_pdev *d, char *buf, size_t len);

int ar_pdev_alloc(ar_pdev *d, void **p, size_t bytes, char *err, size_t err_len);
void ar_pdev_free(ar_pdev *d, void *p);
/* Async on the stream: every byte = value (0xff makes NaN of fp32, fp16, bf16 and fp8 e4m3). */
int ar_pdev_memset(ar_pdev *d, void *p, int value, size_t bytes, char *err, size_t err_len);
/* Async host -> device on the stream (the host buffer may be reused once this returns). */
int ar_pdev_upload(ar_pdev *d, void *dst, const void *src, size_t bytes, char *err, size_t err_len);
/* Device -> host; waits for the stream. */
int ar_pdev_download(ar_pdev *d, void *dst, const void *src, size_t bytes, char *err, size_t err_len);

/* What the generator and the cache write need to know about the run. */
typedef struct ar_pdev_gen {
    uint64_t seed;
    uint32_t layer;
    ar_datadist dist;
    ar_dtype dtype;          /* q, k_new, v_new */
    ar_dtype kv_dtype;       /* the cache */
    float kv_scale;
    int num_q_heads, num_kv_heads, head_size, block_size;
    int64_t num_blocks;
    int latent;              /* MLA: the cache is one side [num_blocks, block_size, head_size] of latent
                                entries (stream AR_STREAM_LATENT, head 0), num_kv_heads 1; k_new holds
                                the new entries and v_new is unused */
} ar_pdev_gen;

/* Q [T, Hq, D] and new K/V [T, Hkv, D] in dtype for the tokens of a step: token t is query
 * position pos[t] of the request with Q key qkey[t], and offset pos[t] % block_size of the
 * logical block with content key kvkey[t].  All arrays device memory. */
int ar_pdev_gen_inputs(ar_pdev *d, const ar_pdev_gen *g, int num_tokens, const uint64_t *qkey,
                       const int32_t *pos, const uint64_t *kvkey, void *q, void *k_new, void *v_new,
                       char *err, size_t err_len);
/* reshape_and_cache: k_new/v_new [T, Hkv, D] into cache [2, num_blocks, block_size, Hkv, D]
 * at slot_mapping[t] (-1 skipped), converted to kv_dtype (fp8: stored = quantize(x / kv_scale)). */
int ar_pdev_write_kv(ar_pdev *d, const ar_pdev_gen *g, int num_tokens, const int64_t *slot_mapping,
                     const void *k_new, const void *v_new, void *cache, char *err, size_t err_len);
/* The untimed fill: for i < count, the K/V of (content key keys[i], offset offsets[i]) written to
 * slot slots[i] of the cache, generated on the device. */
int ar_pdev_fill(ar_pdev *d, const ar_pdev_gen *g, int count, const int64_t *slots,
                 const uint64_t *keys, const int32_t *offsets, void *cache, char *err, size_t err_len);

/* MLA: the dims of the projections and the faults applied in them. */
typedef struct ar_pdev_mla {
    int kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim;   /* L, R, P, V */
    int shift_heads;         /* the wrong-kv-head fault: query head n uses head (n + 1) % N's weights */
    int no_wuv;              /* the mla-no-wuv fault: out = the first V latent values */
} ar_pdev_mla;

/* W_UK [N, L, P] and W_UV [N, L, V] of layer g->layer (ar_mla_weight), float, N = num_q_heads. */
int ar_pdev_mla_weights(ar_pdev *d, const ar_pdev_gen *g, const ar_pdev_mla *m, float *w_uk, float *w_uv,
                        char *err, size_t err_len);
/* A step's MLA inputs: q [T, N, L + R] = [q_nope W_UK (rounded to dtype) | q_pe] and the new entries
 * lat [T, L + R], generated as the cpu-mla backend does (token t as in ar_pdev_gen_inputs). */
int ar_pdev_mla_gen_inputs(ar_pdev *d, const ar_pdev_gen *g, const ar_pdev_mla *m, int num_tokens,
                           const uint64_t *qkey, const int32_t *pos, const uint64_t *kvkey, const float *w_uk,
                           void *q, void *lat, char *err, size_t err_len);
/* out [T, N, V] (float values rounded to dtype) = o_lat [T, N, L] (dtype) W_UV per head. */
int ar_pdev_mla_vproj(ar_pdev *d, const ar_pdev_gen *g, const ar_pdev_mla *m, int num_tokens, const void *o_lat,
                      const float *w_uv, float *out, char *err, size_t err_len);

/* Timing: a grow-only pool of events, AR_PDEV_EVENTS when opened.  reserve makes it at least n
 * events (n <= AR_PDEV_MAX_EVENTS); record records event i (< the pool) on the stream; elapsed
 * waits for event b.  A run's --repeat forwards use events rep * AR_PDEV_EVENTS + 0 .. . */
#define AR_PDEV_MAX_EVENTS (1000 * AR_PDEV_EVENTS)
int ar_pdev_reserve_events(ar_pdev *d, int n, char *err, size_t err_len);
int ar_pdev_record(ar_pdev *d, int i, char *err, size_t err_len);
int ar_pdev_elapsed_us(ar_pdev *d, int a, int b, double *us, char *err, size_t err_len);
/* Waits for the stream; reports any error a kernel on it raised. */
int ar_pdev_sync(ar_pdev *d, char *err, size_t err_len);

/* Guard words: a known pattern written after a buffer, counted back after forward (waits). */
#define AR_GUARD_WORDS 64
#define AR_GUARD_PATTERN 0xA5C3F00Du
int ar_pdev_guard_set(ar_pdev *d, void *p, char *err, size_t err_len);
int ar_pdev_guard_count(ar_pdev *d, const void *p, int *bad, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
