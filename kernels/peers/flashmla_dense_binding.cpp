// flashmla_dense_binding.cpp - the Python module of the FlashMLA peer: only FlashMLA's sm90 dense
// decode entry point (csrc/api/dense_decode.h), bound under the name FlashMLA's own Python
// package imports (flash_mla.cuda, function dense_decode_fwd).
//
// FlashMLA's api.cpp binds every kernel family (sparse decode, sparse prefill, sm100 prefill and
// backward) and so needs all of them compiled; the peer (kernels/peers/build_peers.py) compiles
// the dense bf16 decode kernel, its scheduler-metadata and combine kernels and this file, which
// is all flash_mla.flash_mla_with_kvcache needs for dense attention.  Build with
// -DFLASH_MLA_DISABLE_FP16 and -DTORCH_EXTENSION_NAME=cuda.
#include <pybind11/pybind11.h>

#include "api/dense_decode.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
    m.doc() = "FlashMLA sm90 dense decode (bf16) only";
    m.def("dense_decode_fwd", &dense_attn_decode_interface);
}
