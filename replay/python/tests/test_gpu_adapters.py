"""The torch, FlashInfer, FA3 and FlashMLA adapters on a CUDA device (skipped, with the reason,
elsewhere): each replays the sample traces and passes against the float64 reference (FlashMLA and
FlashInfer's MLA wrapper the DeepSeek sample, MLA); the gathered adapters record their gather apart; FlashInfer runs cascade
steps; the example CUDA plugin passes through the package too."""
import os
import unittest

from helpers import BUILD, query, run, sample, tmpdb


def _cuda_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


REASON = _cuda_reason()


@unittest.skipIf(REASON, REASON or "")
class GpuAdapters(unittest.TestCase):
    def replay_all(self, backend, extra=(), traces=("mixed", "chunked", "prefix", "preempt")):
        # a plugin backend is named by its path: keep the database name a plain file name
        db = tmpdb(self, "".join(c if c.isalnum() or c in "-_." else "_" for c in backend) + ".db")
        for t in traces:
            rc, out = run(["replay", sample(t), "--backend", backend, "--db", db, "--layers", "2", "--quiet"]
                          + list(extra))
            self.assertEqual(rc, 0, "%s on %s: %s" % (backend, t, out))
        self.assertEqual(query(db, "SELECT count(*) FROM steps WHERE pass IS NOT 1"), [(0,)])
        return db

    def test_torch_fa2(self):
        db = self.replay_all("torch-fa2")
        self.assertGreater(query(db, "SELECT count(*) FROM kernels WHERE name='gather' AND time_us > 0")[0][0], 0)
        self.replay_all("torch-fa2", ["--dtype", "fp16"], traces=("mixed",))

    def test_torch_cudnn(self):
        db = self.replay_all("torch-cudnn")
        self.assertGreater(query(db, "SELECT count(*) FROM kernels WHERE name='gather'")[0][0], 0)

    def test_flex(self):
        self.replay_all("flex", ["--repeat", "2"])

    def test_flashinfer(self):
        try:
            import flashinfer  # noqa: F401
        except Exception as e:
            self.skipTest("flashinfer is not importable: %s" % e)
        db = self.replay_all("flashinfer", ["--cascade", "on"])
        self.assertGreater(query(db, "SELECT count(*) FROM steps WHERE cascade=1")[0][0], 0)

    def test_fa3(self):
        try:
            from attnreplay.adapters.fa3 import _import_fa3
            _import_fa3()
        except Exception as e:
            self.skipTest("FlashAttention 3 is not importable: %s" % e)
        self.replay_all("fa3")

    def test_flashmla(self):
        try:
            from attnreplay.adapters.flashmla import _import_flashmla
            _import_flashmla()
        except Exception as e:
            self.skipTest("FlashMLA is not importable: %s" % e)
        db = self.replay_all("flashmla", traces=("deepseek-v3-tp16",))
        self.assertEqual(query(db, "SELECT count(*) FROM steps"), [(36,)])
        rc, out = run(["replay", sample("llama-3.2-1b"), "--backend", "flashmla", "--db", db, "--quiet"])
        self.assertEqual(rc, 2, out)   # an MHA model: refused with the reason
        self.assertIn("MLA models only", out)

    def test_flashinfer_mla(self):
        try:
            import flashinfer.mla  # noqa: F401
        except Exception as e:
            self.skipTest("flashinfer.mla is not importable: %s" % e)
        db = self.replay_all("flashinfer-mla", traces=("deepseek-v3-tp16",))
        self.assertEqual(query(db, "SELECT count(*) FROM steps"), [(36,)])
        names = {r[0] for r in query(db, "SELECT DISTINCT name FROM kernels WHERE time_us > 0")}
        self.assertIn("split", names)

    def test_example_cuda_plugin_through_the_package(self):
        plugin = os.path.join(BUILD, "plugins", "attnreplay-example-cuda.so")
        if not os.path.exists(plugin):
            self.skipTest("%s was not built (no nvcc)" % plugin)
        self.replay_all("plugin:" + plugin)


if __name__ == "__main__":
    unittest.main()
