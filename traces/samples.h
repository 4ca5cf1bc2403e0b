/* samples.h - the small sample traces of traces/samples/ (see traces/samples/README.md).
 *
 * ar_samples_write regenerates them with a tiny deterministic scheduler (not the real
 * simulator of sim/): the four tiny-gqa samples (a 2-layer GQA model "tiny-gqa", bf16, block 16,
 * 256 blocks, budget 256 tokens / 16 sequences) and the shape samples (2 layers of real models'
 * attention shapes, for kernel-path coverage).  `attnreplay gen-samples DIR` calls it. */
#ifndef AR_SAMPLES_H
#define AR_SAMPLES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of tiny-gqa sample traces and the file name of the i-th ("mixed.trace.jsonl.gz", ...). */
#define AR_NUM_SAMPLES 4
const char *ar_sample_name(int i);
/* Number of shape samples and the file name of the i-th ("llama-3.1-8b.trace.jsonl.gz", ...). */
#define AR_NUM_SHAPE_SAMPLES 6
const char *ar_shape_sample_name(int i);

/* Writes every sample trace (both families) into the directory dir, created when missing (its
 * parent must exist), each through a temporary file renamed into place.  Returns 0, or -1 with
 * err set. */
int ar_samples_write(const char *dir, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
