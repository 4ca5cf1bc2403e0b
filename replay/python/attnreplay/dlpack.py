"""Zero-copy views of the host's tensors through DLPack.

The host owns every tensor it hands a backend (attnreplay_plugin.h).  An Exported object wraps
one DLTensor and implements the DLPack Python protocol (__dlpack__ / __dlpack_device__), so
numpy.from_dlpack and torch.from_dlpack make views of the same memory, no copy.  The capsule
holds a DLManagedTensor(Versioned) made by libattnreplay (ar_dlpack_wrap) whose deleter frees
only that small wrapper.  For dtypes a consumer lacks (numpy has no bfloat16 or float8) the
view is taken with the raw unsigned type of the same width: as_numpy says so by its dtype
(uint16 for bfloat16, uint8 for float8_e4m3fn), and as_torch reinterprets it back.
"""
import ctypes
from ctypes import c_char_p, c_void_p, py_object

from . import _abi

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = py_object
_capsule_new.argtypes = [c_void_p, c_char_p, c_void_p]
# The destructor receives the dying capsule: it must not be touched as a Python object (its
# reference count is already 0), so these prototypes take it as a plain pointer.
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, c_void_p, c_char_p)(("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_get = ctypes.PYFUNCTYPE(c_void_p, c_void_p, c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))

LEGACY_NAME = b"dltensor"
VERSIONED_NAME = b"dltensor_versioned"


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _abi.DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", c_void_p),
                ("deleter", c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _abi.DLTensor)]


_DELETER = ctypes.CFUNCTYPE(None, c_void_p)


@ctypes.CFUNCTYPE(None, c_void_p)
def _capsule_destructor(capsule):
    # A capsule never consumed (still named "dltensor"/"dltensor_versioned") frees its wrapper; a
    # consumer renames it "used_..." and calls the deleter itself when done.
    for name, struct in ((LEGACY_NAME, _Managed), (VERSIONED_NAME, _ManagedVersioned)):
        if _capsule_is_valid(capsule, name):
            ptr = _capsule_get(capsule, name)
            managed = struct.from_address(ptr)
            if managed.deleter:
                _DELETER(managed.deleter)(ptr)
            return


_DESTRUCTOR_PTR = ctypes.cast(_capsule_destructor, c_void_p)


def _copy_tensor(t, dtype=None):
    """A DLTensor struct copy (shape/strides arrays kept alive by the Exported object)."""
    nd = t.ndim
    shape = (ctypes.c_int64 * max(nd, 1))(*[t.shape[i] for i in range(nd)])
    strides = (ctypes.c_int64 * max(nd, 1))(*[t.strides[i] for i in range(nd)]) if t.strides else None
    c = _abi.DLTensor()
    c.data = t.data
    c.device = _abi.DLDevice(t.device.device_type, t.device.device_id)
    c.ndim = nd
    c.dtype = _abi.DLDataType(t.dtype.code, t.dtype.bits, t.dtype.lanes) if dtype is None else dtype
    c.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    c.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)) if strides is not None else None
    c.byte_offset = t.byte_offset
    return c, shape, strides


class Exported:
    """One host tensor, exportable through DLPack any number of times."""

    force_legacy = False   # tests: hand out the pre-1.0 capsule even when a versioned one is asked for

    def __init__(self, tensor, dtype=None):
        self._t, self._shape, self._strides = _copy_tensor(tensor, dtype)

    @property
    def shape(self):
        return tuple(self._shape[i] for i in range(self._t.ndim))

    def __dlpack_device__(self):
        return (int(self._t.device.device_type), int(self._t.device.device_id))

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        # stream: the consumer's stream.  The adapters consume on the host's own stream (they run
        # inside torch.cuda.stream(host stream)), so there is nothing to wait for.
        if copy:
            raise BufferError("attnreplay tensors are views of the host's buffers; copy=True is not offered")
        versioned = (max_version is not None and tuple(max_version)[0] >= 1 and not self.force_legacy)
        ptr = _abi.lib().ar_dlpack_wrap(ctypes.byref(self._t), 1 if versioned else 0)
        if not ptr:
            raise MemoryError("ar_dlpack_wrap")
        return _capsule_new(ptr, VERSIONED_NAME if versioned else LEGACY_NAME, _DESTRUCTOR_PTR)


def _raw_dtype(t):
    """The unsigned integer type of the same width, for consumers without t's float type."""
    return _abi.DLDataType(_abi.kDLUInt, t.dtype.bits, 1)


def is_present(t):
    return bool(t.data) or t.ndim == 0 or any(t.shape[i] == 0 for i in range(t.ndim))


def as_numpy(t):
    """A numpy view of DLTensor t (CPU); bfloat16 and float8 come as uint16 / uint8."""
    import numpy as np
    if not t.data:
        if t.ndim > 0 and any(t.shape[i] == 0 for i in range(t.ndim)):
            return np.empty(tuple(t.shape[i] for i in range(t.ndim)), dtype=np.int32)
        return None
    native = t.dtype.code in (_abi.kDLInt, _abi.kDLUInt) or (t.dtype.code == _abi.kDLFloat and t.dtype.bits in (16, 32, 64))
    return np.from_dlpack(Exported(t, None if native else _raw_dtype(t)))


def as_torch(t):
    """A torch view of DLTensor t, on its device; float8_e4m3fn reinterpreted from uint8 if needed."""
    import torch
    if not t.data:
        if t.ndim > 0 and any(t.shape[i] == 0 for i in range(t.ndim)):
            dev = "cuda" if t.device.device_type == _abi.kDLCUDA else "cpu"
            return torch.empty(tuple(t.shape[i] for i in range(t.ndim)), dtype=torch.int32, device=dev)
        return None
    if t.dtype.code == _abi.kDLFloat8_e4m3fn:
        try:
            return torch.from_dlpack(Exported(t))
        except (BufferError, RuntimeError, TypeError):
            return torch.from_dlpack(Exported(t, _raw_dtype(t))).view(torch.float8_e4m3fn)
    return torch.from_dlpack(Exported(t))
