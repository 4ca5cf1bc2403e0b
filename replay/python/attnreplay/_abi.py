"""ctypes mirrors of replay/attnreplay_plugin.h (plugin ABI version 2) and of libattnreplay's C API.

Every struct here has the layout of its C twin; tests/test_abi.py checks sizes and offsets
against the library's own (ar_plugin_abi_sizeof / ar_plugin_abi_offsetof).
"""
import ctypes
import ctypes.util
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_float, c_int, c_int32, c_int64,
                    c_long, c_size_t, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p)

ABI_VERSION = 2

# DLPack (1.1 layout)
kDLCPU, kDLCUDA = 1, 2
kDLInt, kDLUInt, kDLFloat, kDLBfloat = 0, 1, 2, 4
kDLFloat8_e4m3fn = 10

WRITES_KV = 0x1
CASCADE = 0x2
MLA = 0x4
ATTENTION_MHA, ATTENTION_MLA = 0, 1
MAX_MARKS = 5


class DLDevice(Structure):
    _fields_ = [("device_type", c_int), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32), ("dtype", DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


SetErrorFn = CFUNCTYPE(None, c_char_p)
LogFn = CFUNCTYPE(None, c_int, c_char_p)
StreamFn = CFUNCTYPE(c_void_p)
MarkFn = CFUNCTYPE(None, c_char_p)


class HostApi(Structure):
    _fields_ = [("abi_version", c_int32), ("struct_size", c_int32), ("set_error", SetErrorFn),
                ("log", LogFn), ("cuda_stream", StreamFn), ("time_mark", MarkFn)]


class Config(Structure):
    _fields_ = [("struct_size", c_int32), ("model_name", c_char_p), ("num_q_heads", c_int32),
                ("num_kv_heads", c_int32), ("head_size", c_int32), ("scale", c_float),
                ("sliding_window", c_int32), ("logits_soft_cap", c_float), ("block_size", c_int32),
                ("num_blocks", c_int32), ("num_layers", c_int32), ("dtype", DLDataType),
                ("kv_dtype", DLDataType), ("kv_scale", c_float), ("cascade", c_int32),
                ("inject", c_char_p), ("repeat", c_int32), ("device", DLDevice),
                ("attention", c_int32), ("kv_lora_rank", c_int32), ("qk_rope_head_dim", c_int32)]


METADATA_TENSORS = ("query_start_loc", "seq_lens", "block_table", "slot_mapping")
CASCADE_TENSORS = ("cu_prefix_query_lens", "prefix_kv_lens", "suffix_kv_lens")
CPU_TENSORS = ("query_start_loc_cpu", "seq_lens_cpu", "block_table_cpu", "slot_mapping_cpu",
               "context_lens_cpu")


class Metadata(Structure):
    _fields_ = ([("struct_size", c_int32), ("step", c_int64), ("num_reqs", c_int32),
                 ("num_actual_tokens", c_int32), ("max_query_len", c_int32), ("max_seq_len", c_int32)]
                + [(n, DLTensor) for n in METADATA_TENSORS]
                + [("use_cascade", c_int32), ("common_prefix_len", c_int32)]
                + [(n, DLTensor) for n in CASCADE_TENSORS]
                + [(n, DLTensor) for n in CPU_TENSORS])


class ForwardArgs(Structure):
    _fields_ = [("struct_size", c_int32), ("layer", c_int32), ("md", POINTER(Metadata)),
                ("q", DLTensor), ("k_new", DLTensor), ("v_new", DLTensor), ("kv_cache", DLTensor),
                ("out", DLTensor), ("lse", DLTensor), ("stream", c_void_p)]


CheckFn = CFUNCTYPE(c_int, POINTER(Config))
OpenFn = CFUNCTYPE(c_int, POINTER(Config), POINTER(c_void_p))
PlanFn = CFUNCTYPE(c_int, c_void_p, POINTER(Metadata))
ForwardFn = CFUNCTYPE(c_int, c_void_p, POINTER(ForwardArgs))
CloseFn = CFUNCTYPE(None, c_void_p)


class Plugin(Structure):
    _fields_ = [("abi_version", c_int32), ("struct_size", c_int32), ("name", c_char_p),
                ("summary", c_char_p), ("capabilities", c_char_p), ("device_type", c_int32),
                ("flags", c_uint32), ("check", CheckFn), ("open", OpenFn), ("plan", PlanFn),
                ("forward", ForwardFn), ("close", CloseFn)]


# The C type returns const attnreplay_plugin *; a ctypes callback can only return a simple type,
# so it is declared returning the address (same ABI).
InitFn = CFUNCTYPE(c_void_p, POINTER(HostApi), c_int)

# which-codes of ar_plugin_abi_sizeof / ar_plugin_abi_offsetof
LAYOUTS = {0: DLTensor, 1: HostApi, 2: Config, 3: Metadata, 4: ForwardArgs, 5: Plugin}


def _find_library():
    env = os.environ.get("ATTNREPLAY_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "libattnreplay.so")]
    # in a checkout: replay/python/attnreplay -> build/libattnreplay.so
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    candidates.append(os.path.join(root, "build", "libattnreplay.so"))
    candidates.append(os.path.join(root, "build", "libattnreplay-lite.so"))
    for c in candidates:
        if os.path.exists(c):
            return c
    return ctypes.util.find_library("attnreplay")


_lib = None


def lib():
    """libattnreplay.so with its prototypes (loaded once)."""
    global _lib
    if _lib is not None:
        return _lib
    path = _find_library()
    if not path:
        raise OSError("libattnreplay.so not found: build it (make) and set ATTNREPLAY_LIB=/path/to/"
                      "build/libattnreplay.so")
    L = ctypes.CDLL(path)
    L.ar_replay_main.argtypes = [c_int, POINTER(c_char_p)]
    L.ar_replay_main.restype = c_int
    L.ar_plugin_register_init.argtypes = [InitFn, c_char_p, c_char_p, c_char_p, c_size_t]
    L.ar_plugin_register_init.restype = c_void_p
    L.ar_plugin_abi_sizeof.argtypes = [c_int]
    L.ar_plugin_abi_sizeof.restype = c_long
    L.ar_plugin_abi_offsetof.argtypes = [c_int, c_char_p]
    L.ar_plugin_abi_offsetof.restype = c_long
    L.ar_plugin_abi_version.argtypes = []
    L.ar_plugin_abi_version.restype = c_int
    L.ar_dlpack_wrap.argtypes = [POINTER(DLTensor), c_int]
    L.ar_dlpack_wrap.restype = c_void_p
    if L.ar_plugin_abi_version() != ABI_VERSION:
        raise OSError(f"{path} speaks plugin ABI version {L.ar_plugin_abi_version()}, this package "
                      f"version {ABI_VERSION}: install the package from the same checkout")
    _lib = L
    return L
