// fa3_unbuilt_stubs.cu - stand-ins for the FlashAttention 3 forward kernels that the peer build
// (kernels/peers/build_peers.py) leaves out to stay inside the GPU machine's time limit.
//
// FA3's API file (hopper/flash_api_stable.cpp) dispatches every enabled head size, dtype, split,
// paged-KV and PackGQA combination, so its object refers to one run_mha_fwd_ instantiation per
// combination.  The peer build compiles all the bf16 ones (head sizes 128 and 256) but, of the
// e4m3 ones, only the head-size-128 paged-KV decode kernels (the fp8 KV decode peer).  This file
// defines the other e4m3 symbols as functions that fail with a clear message, so the extension
// links and loads; a call that reaches one raises the same error type as FA3's own checks.
// Compiled with FA3's hopper/ and CUTLASS on the include path (it needs flash.h's declarations).
#include <stdexcept>

#include <cutlass/numeric_types.h>

#include "flash.h"

// Template arguments: Arch, T, kHeadDim, kHeadDimV, Split, PagedKVNonTMA, Has_softcap, PackGQA.
#define AR_FA3_UNBUILT(HDIM, SPLIT, PAGED, PACKGQA)                                                         \
    template <>                                                                                             \
    void run_mha_fwd_<90, cutlass::float_e4m3_t, HDIM, HDIM, SPLIT, PAGED, false, PACKGQA>(                \
        Flash_fwd_params &, cudaStream_t)                                                                   \
    {                                                                                                       \
        throw std::runtime_error("FA3 peer build: e4m3 head size " #HDIM " split=" #SPLIT " paged=" #PAGED \
                                 " packgqa=" #PACKGQA " was not compiled (only e4m3 hd128 paged decode is)"); \
    }

AR_FA3_UNBUILT(128, false, false, false)
AR_FA3_UNBUILT(128, false, false, true)
AR_FA3_UNBUILT(128, true, false, true)
AR_FA3_UNBUILT(256, false, false, false)
AR_FA3_UNBUILT(256, false, false, true)
AR_FA3_UNBUILT(256, false, true, true)
AR_FA3_UNBUILT(256, true, false, true)
AR_FA3_UNBUILT(256, true, true, true)
