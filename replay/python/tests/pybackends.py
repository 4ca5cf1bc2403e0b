"""Backends the tests load by module:Class: each breaks the contract in one way, or marks time."""
import sys

import numpy as np

from attnreplay import Backend, host
from attnreplay.adapters.numpy_ref import NumpyPaged


class Refuses(Backend):
    name = "refuses"

    def check(self, config):
        return "head size %d is not one this kernel was built for" % config.head_size

    def forward(self, *args):
        raise AssertionError("never called")


class OpenRaises(NumpyPaged):
    name = "open-raises"

    def open(self, config):
        raise MemoryError("workspace of 80 GiB does not fit")


class ForwardRaises(NumpyPaged):
    name = "forward-raises"

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        if self.step.step >= 2:
            raise RuntimeError("illegal memory access (planted)")
        super().forward(layer, q, k_new, v_new, kv_cache, out, lse)


class ExitsInForward(NumpyPaged):
    """Calls sys.exit() in forward: SystemExit is no Exception, yet the forward failed."""
    name = "exits-in-forward"

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        if self.step.step >= 2:
            sys.exit("kernel gave up")
        super().forward(layer, q, k_new, v_new, kv_cache, out, lse)


class LeavesRows(NumpyPaged):
    """Writes every output row but the last: the host's NaN poisoning must show it."""
    name = "leaves-rows"

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        keep_out, keep_lse = out[-1].copy(), lse[:, -1].copy()
        super().forward(layer, q, k_new, v_new, kv_cache, out, lse)
        out[-1] = keep_out
        lse[:, -1] = keep_lse


class WritesKV(NumpyPaged):
    """Declares writes_kv and writes the new K/V itself through slot_mapping."""
    name = "writes-kv"
    writes_kv = True

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        flat_k = kv_cache[0].reshape(-1, *kv_cache.shape[3:])
        flat_v = kv_cache[1].reshape(-1, *kv_cache.shape[3:])
        slots = self.step.slot_mapping_cpu
        ok = slots >= 0
        flat_k[slots[ok]] = k_new[ok]
        flat_v[slots[ok]] = v_new[ok]
        host.time_mark("write")
        super().forward(layer, q, k_new, v_new, kv_cache, out, lse)


class Marks(NumpyPaged):
    """Marks extra parts: the database gets prep, gather, attn."""
    name = "marks"

    def forward(self, layer, q, k_new, v_new, kv_cache, out, lse):
        np.sum(q[:1].astype(np.float32))
        host.time_mark("prep")
        super().forward(layer, q, k_new, v_new, kv_cache, out, lse)


class Nameless(NumpyPaged):
    name = "has space"
