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


class LibraryError(OSError):
    """libattnreplay.so is missing, cannot be loaded, or is not ours (the message says which)."""


def _find_library():
    """(path, how it was found: "ATTNREPLAY_LIB=PATH" or the path) or (None, None)."""
    env = os.environ.get("ATTNREPLAY_LIB")
    if env:
        return env, "ATTNREPLAY_LIB=" + env
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "libattnreplay.so")]
    # in a checkout: replay/python/attnreplay -> build/libattnreplay.so
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    candidates.append(os.path.join(root, "build", "libattnreplay.so"))
    candidates.append(os.path.join(root, "build", "libattnreplay-lite.so"))
    for c in candidates:
        if os.path.exists(c):
            return c, c
    found = ctypes.util.find_library("attnreplay")
    return found, found


_lib = None
_PROTOTYPES = (("ar_replay_main", [c_int, POINTER(c_char_p)], c_int),
               ("ar_plugin_register_init", [InitFn, c_char_p, c_char_p, c_char_p, c_size_t], c_void_p),
               ("ar_plugin_abi_sizeof", [c_int], c_long),
               ("ar_plugin_abi_offsetof", [c_int, c_char_p], c_long),
               ("ar_plugin_abi_version", [], c_int),
               ("ar_dlpack_wrap", [POINTER(DLTensor), c_int], c_void_p))


def lib():
    """libattnreplay.so with its prototypes (loaded once).  Raises LibraryError naming the file
    (and ATTNREPLAY_LIB when it came from there) when it is missing, cannot be loaded or is not
    libattnreplay of this plugin ABI."""
    global _lib
    if _lib is not None:
        return _lib
    path, how = _find_library()
    if not path:
        raise LibraryError("libattnreplay.so not found: build it (make) and set ATTNREPLAY_LIB=/path/to/"
                           "build/libattnreplay.so")
    if os.sep in path and not os.path.exists(path):
        raise LibraryError("%s: no such file (the library is build/libattnreplay.so of a built checkout)" % how)
    try:
        L = ctypes.CDLL(path)
    except OSError as e:
        raise LibraryError("%s: cannot load: %s" % (how, str(e).replace(path + ": ", ""))) from None
    for name, argtypes, restype in _PROTOTYPES:
        try:
            fn = getattr(L, name)
        except AttributeError:
            raise LibraryError("%s: not libattnreplay (no %s): set ATTNREPLAY_LIB to build/libattnreplay.so"
                               % (how, name)) from None
        fn.argtypes, fn.restype = argtypes, restype
    if L.ar_plugin_abi_version() != ABI_VERSION:
        raise LibraryError(f"{how} speaks plugin ABI version {L.ar_plugin_abi_version()}, this package "
                           f"version {ABI_VERSION}: install the package from the same checkout")
    _lib = L
    return L
