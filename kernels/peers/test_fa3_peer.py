"""test_fa3_peer.py - fa3_peer.py's page-size rule without a GPU: FA3_PAGE takes 16, 32 or 64
(unset or empty: 16); any other value makes main() exit 2 naming the rule before any peer runs;
and FA3_PAGE moves only FA3's own paged calls, never the module's PAGE, which flashinfer_peer.py
imports for its page-16 calls.  Also: the lopsided shape's name is bench_cuda's case and
peer_table.py's row, so the two sides pair.  torch and peer_attention are stand-ins here (fa3_peer imports
them at its top; nothing below touches them).

    python3 kernels/peers/test_fa3_peer.py     (CI runs it with the other kernels/peers tests)
"""
import contextlib
import importlib
import io
import os
import sys
import tempfile
import types
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))


def import_fa3_peer(env):
    """fa3_peer imported afresh under env, with stand-in torch and peer_attention modules."""
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(empty_cache=lambda: None)
    pa = types.ModuleType("peer_attention")
    for name in ("CASC_D", "CASC_HKV", "CASC_HQ", "CASC_R", "DEV", "DT", "VARLEN_LENS", "attention_f32",
                 "causal_flops", "emit", "guard", "no_tf32", "timed"):
        setattr(pa, name, None)
    with mock.patch.dict(sys.modules, {"torch": torch, "peer_attention": pa}), mock.patch.dict(os.environ, env):
        sys.path.insert(0, HERE)
        try:
            sys.modules.pop("fa3_peer", None)
            return importlib.import_module("fa3_peer")
        finally:
            sys.path.remove(HERE)
            sys.modules.pop("fa3_peer", None)


class Fa3PeerPageTest(unittest.TestCase):
    def test_page_size_rule(self):
        m = import_fa3_peer({})
        self.assertEqual(m.page_size({}), 16)
        self.assertEqual(m.page_size({"FA3_PAGE": ""}), 16)
        for ok in ("16", "32", "64"):
            self.assertEqual(m.page_size({"FA3_PAGE": ok}), int(ok))
        for bad in ("48", "128", "0", "x", "16x", "-16", " 32"):
            with self.assertRaises(ValueError) as cm:
                m.page_size({"FA3_PAGE": bad})
            self.assertIn(f"FA3_PAGE={bad}", str(cm.exception))
            self.assertIn("16, 32, 64", str(cm.exception))

    def test_bad_page_exits_2_before_any_peer(self):
        m = import_fa3_peer({})
        err = io.StringIO()
        with mock.patch.dict(os.environ, {"FA3_PAGE": "48"}), mock.patch.object(sys, "argv", ["fa3_peer.py", "decode"]), \
                mock.patch.object(m, "load_built", side_effect=AssertionError("a peer ran")), contextlib.redirect_stderr(err):
            self.assertEqual(m.main(), 2)
        self.assertIn("FA3_PAGE=48: must be one of 16, 32, 64", err.getvalue())

    def test_fa3_page_leaves_the_shared_page_alone(self):
        m = import_fa3_peer({"FA3_PAGE": "64"})          # read at import: it must not move PAGE
        self.assertEqual((m.PAGE, m.PAGE_FA3, m.PAGED), (16, 16, "paged16"))
        out = io.StringIO()
        with tempfile.TemporaryDirectory() as empty, \
                mock.patch.dict(os.environ, {"FA3_PAGE": "64", "AR_PEERS_BUILT": empty}), \
                mock.patch.object(sys, "argv", ["fa3_peer.py", "decode"]), contextlib.redirect_stdout(out):
            self.assertEqual(m.main(), 0)                 # not built: one error line, exit 0
        self.assertEqual((m.PAGE, m.PAGE_FA3, m.PAGED), (16, 64, "paged64"))
        self.assertIn("PEER name=decode impl=fa3 error=", out.getvalue())


class Fa3PeerNamesTest(unittest.TestCase):
    def test_lopsided_name_is_a_bench_case_and_a_table_row(self):
        """The peer's line pairs with ours only under the same name: bench_cuda's case and the
        row peer_table.py reads."""
        name = import_fa3_peer({}).lopsided_name()
        with open(os.path.join(HERE, "..", "..", "tests", "bench_cuda.c")) as f:
            self.assertIn(f'{{"{name}", 32, 8, 128, 18,', f.read())
        with open(os.path.join(HERE, "peer_table.py")) as f:
            self.assertIn(f'"{name}"', f.read())


if __name__ == "__main__":
    unittest.main()
