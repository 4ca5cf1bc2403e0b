/* export.h - replayed steps as FlashInfer-Trace workloads, for FlashInfer-Bench (README "Bring your
 * own kernel", section Export).
 *
 * `attnreplay export TRACE --steps A:B --format flashinfer-trace --out DIR` writes, for an
 * MHA/GQA trace:
 *   DIR/definitions/gqa_paged/<name>.json       one per kind of step met: decode (every request
 *        has one new token) gqa_paged_decode_h{Hq}_kv{Hkv}_d{D}_ps{B}, else
 *        gqa_paged_prefill_causal_h{Hq}_kv{Hkv}_d{D}_ps{B}; axes, inputs, outputs, constraints
 *        and a plain PyTorch reference (output, and lse in base 2 [total_q, Hq], as FlashInfer);
 *   DIR/workloads/gqa_paged/<name>.jsonl         one line per step: a Trace with only
 *        definition and workload (uuid, the var axes, q/k_cache/v_cache "random", sm_scale a
 *        scalar, the index tensors from safetensors);
 *   DIR/blob/workloads/gqa_paged/<name>/<name>_<uuid>.safetensors   the step's qo_indptr
 *        (prefill), kv_indptr, kv_indices and kv_last_page_len, int32;
 *   DIR/attnreplay-export.json                   provenance: the trace, its hash, and per
 *        workload uuid the step it came from.
 * The safetensors files are written here (8-byte little-endian header length, the JSON header
 * padded with spaces to 8 bytes, the raw little-endian data). */
#ifndef AR_EXPORT_H
#define AR_EXPORT_H

#include <stddef.h>
#include <stdint.h>

/* `attnreplay export ...` (argv[0] = "export"); returns the exit code: 0 written, 2 bad input
 * (options, trace, an MLA or windowed model, a DIR that is not empty and holds no earlier export),
 * 3 a write failure, 4 no step to export in --steps (nothing written).  An earlier export in DIR
 * (the files its attnreplay-export.json lists) is removed when the first workload is written. */
int ar_export_main(int argc, char **argv);

/* One safetensors tensor to write: int32 data of the given 1-D length. */
typedef struct ar_st_tensor {
    const char *name;
    const int32_t *data;
    int64_t len;
} ar_st_tensor;

/* Writes a safetensors file of 1-D int32 tensors (and string metadata pairs, may be NULL/0).
 * 0, or -1 with err set. */
int ar_safetensors_write_i32(const char *path, const ar_st_tensor *t, int n, const char *const *meta_kv,
                             int n_meta, char *err, size_t err_len);

#endif
