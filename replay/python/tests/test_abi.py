"""The ctypes mirrors match the C structs of attnreplay_plugin.h, as the library was built."""
import ctypes
import unittest

from attnreplay import _abi

FIELDS = {
    0: ["data", "device", "ndim", "dtype", "shape", "strides", "byte_offset"],
    1: ["set_error", "log", "cuda_stream", "time_mark"],
    2: ["model_name", "num_q_heads", "scale", "sliding_window", "logits_soft_cap", "block_size", "num_layers",
        "dtype", "kv_dtype", "kv_scale", "cascade", "inject", "repeat", "device", "attention", "kv_lora_rank",
        "qk_rope_head_dim"],
    3: ["step", "num_reqs", "max_seq_len", "query_start_loc", "block_table", "slot_mapping", "use_cascade",
        "common_prefix_len", "cu_prefix_query_lens", "suffix_kv_lens", "query_start_loc_cpu", "context_lens_cpu"],
    4: ["layer", "md", "q", "kv_cache", "out", "lse", "stream"],
    5: ["name", "device_type", "flags", "check", "open", "plan", "forward", "close"],
}


class AbiLayout(unittest.TestCase):
    def test_version(self):
        self.assertEqual(_abi.lib().ar_plugin_abi_version(), _abi.ABI_VERSION)

    def test_sizes_and_offsets(self):
        L = _abi.lib()
        for which, struct in _abi.LAYOUTS.items():
            self.assertEqual(ctypes.sizeof(struct), L.ar_plugin_abi_sizeof(which), struct.__name__)
            for f in FIELDS[which]:
                self.assertEqual(getattr(struct, f).offset, L.ar_plugin_abi_offsetof(which, f.encode()),
                                 "%s.%s" % (struct.__name__, f))
        self.assertEqual(L.ar_plugin_abi_offsetof(0, b"no_such_field"), -1)


if __name__ == "__main__":
    unittest.main()
