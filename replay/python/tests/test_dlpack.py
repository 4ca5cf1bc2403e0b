"""Zero-copy DLPack views of host memory: numpy sees and writes the same bytes, through both the
versioned (DLPack >= 1.0) and the legacy capsule; bfloat16 comes as its uint16 bits."""
import ctypes
import gc
import unittest

import numpy as np

from attnreplay import _abi, dlpack


def tensor(buf, shape, code, bits):
    nd = len(shape)
    sh = (ctypes.c_int64 * nd)(*shape)
    st = [1] * nd
    for i in range(nd - 2, -1, -1):
        st[i] = st[i + 1] * shape[i + 1]
    strides = (ctypes.c_int64 * nd)(*st)
    t = _abi.DLTensor(ctypes.cast(buf, ctypes.c_void_p), _abi.DLDevice(_abi.kDLCPU, 0), nd,
                      _abi.DLDataType(code, bits, 1), ctypes.cast(sh, ctypes.POINTER(ctypes.c_int64)),
                      ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)), 0)
    return t, (sh, strides)


class DLPackViews(unittest.TestCase):
    def check_roundtrip(self, legacy):
        buf = (ctypes.c_float * 6)(*range(6))
        t, keep = tensor(buf, (2, 3), _abi.kDLFloat, 32)
        old = dlpack.Exported.force_legacy
        dlpack.Exported.force_legacy = legacy
        try:
            a = dlpack.as_numpy(t)
        finally:
            dlpack.Exported.force_legacy = old
        self.assertEqual(a.shape, (2, 3))
        self.assertEqual(a.dtype, np.float32)
        self.assertEqual(a[1, 2], 5.0)
        buf[4] = 7.0                        # a view of the host's memory, no copy
        self.assertEqual(a[1, 1], 7.0)
        if not legacy:                      # numpy makes pre-1.0 (legacy) imports read-only
            a[0, 1] = 42.0
            self.assertEqual(buf[1], 42.0)
        del a
        gc.collect()

    def test_versioned(self):
        self.check_roundtrip(False)

    def test_legacy(self):
        self.check_roundtrip(True)

    def test_bfloat16_as_bits(self):
        buf = (ctypes.c_uint16 * 4)(0x3f80, 0x4000, 0xbf80, 0)
        t, keep = tensor(buf, (4,), _abi.kDLBfloat, 16)
        a = dlpack.as_numpy(t)
        self.assertEqual(a.dtype, np.uint16)
        from attnreplay.adapters.numpy_ref import bf16_to_f32, f32_to_bf16
        np.testing.assert_array_equal(bf16_to_f32(a), np.array([1, 2, -1, 0], np.float32))
        np.testing.assert_array_equal(f32_to_bf16(np.array([1.00390625, 1.01171875], np.float32)),
                                      np.array([0x3f80, 0x3f82], np.uint16))   # ties to even

    def test_unconsumed_capsule_is_freed(self):
        buf = (ctypes.c_float * 2)()
        t, keep = tensor(buf, (2,), _abi.kDLFloat, 32)
        for _ in range(1000):   # the destructor frees wrappers nobody consumed (no crash, no leak)
            dlpack.Exported(t).__dlpack__(max_version=(1, 0))
        gc.collect()


if __name__ == "__main__":
    unittest.main()
