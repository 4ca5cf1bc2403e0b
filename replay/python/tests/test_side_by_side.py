"""replay/python/side_by_side.sh on the CPU (the GPU machine's script, run here with the CPU
backends and the numpy adapter): a trace the base backend cannot replay is skipped with exit 1,
never compared with another trace's run; runs stopped by PER_RUN_S still enter the diff and the
ratios, on the whole step and on the named marks; CASCADE reaches every replay."""
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import unittest

from helpers import BIN, BUILD, LIB, SRC, needs_lib, needs_numpy, sample, tmpdb

SCRIPT = os.path.join(SRC, "replay", "python", "side_by_side.sh")


def side_by_side(db, trace, **env):
    full = dict(os.environ, AR_BIN=BIN, BUILD=BUILD, ATTNREPLAY_LIB=LIB, PYTHON=sys.executable, PLUGIN="none",
                ADAPTERS="numpy", REPEAT="1")
    full.update(env)
    p = subprocess.run(["bash", SCRIPT, db, trace], cwd=SRC, env=full, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=300)
    return p.returncode, p.stdout.decode(errors="replace")


@needs_lib
@needs_numpy
@unittest.skipUnless(os.access(BIN, os.X_OK), "%s not built (make)" % BIN)
class SideBySide(unittest.TestCase):
    def test_base_that_cannot_replay_skips_the_trace(self):
        db = tmpdb(self, "sbs_refused.db")
        # a run of another trace is in DB already: it must not become the base
        rc, out = side_by_side(db, sample("mixed"), BASE_BACKEND="cpu", STEPS="0:2")
        self.assertEqual(rc, 0, out)
        rc, out = side_by_side(db, sample("deepseek-v3-tp16"), BASE_BACKEND="cpu")
        self.assertEqual(rc, 1, out)
        self.assertIn("cpu did not replay", out)
        self.assertNotIn("-- attnreplay diff", out)
        self.assertNotIn("Traceback", out)

    def test_stopped_runs_enter_the_diff_and_the_ratios(self):
        db = tmpdb(self, "sbs_stopped.db")
        # 'write' is a mark both sides time (the cache write: cpu-mla's own, the host's for numpy)
        rc, out = side_by_side(db, sample("deepseek-v3-tp16"), BASE_BACKEND="cpu-mla", PER_RUN_S="3",
                               PARTS="write")
        self.assertEqual(rc, 0, out)
        self.assertIn("cpu-mla: exit 143", out)            # both stopped by PER_RUN_S
        self.assertIn("numpy: exit 143", out)
        self.assertIn("verification: 0 newly failing", out)   # diff compared their steps
        # ... and did not refuse the stopped run (its warning that the run "did not finish" may stay
        # within the 15 lines the script keeps when few steps were timed, as on a loaded machine)
        self.assertNotIn("pass --allow-unfinished", out)
        whole, _, parts = out.partition("the marks write alone")
        self.assertIn("| 2 | py:numpy | all |", whole)     # the ratios on the whole step
        self.assertIn("| 2 | py:numpy | all |", parts)     # and on the mark alone

    def test_cascade_reaches_every_replay(self):
        # the prefix sample: 5 steps pass vLLM's rule; on cascades every legal step, off none
        for mode in ("on", "off"):
            db = tmpdb(self, "sbs_cascade_%s.db" % mode)
            rc, out = side_by_side(db, sample("prefix"), BASE_BACKEND="cpu", CASCADE=mode)
            self.assertEqual(rc, 0, out)
            self.assertIn("| 2 | py:numpy | all |", out)
            if mode == "on":
                self.assertIn("| 2 | py:numpy | cascade |", out)
            else:
                self.assertNotIn("| cascade |", out)
            # every run, the base's and the adapter's, recorded the mode it was given
            with sqlite3.connect(db) as con:
                modes = [m for (m,) in con.execute("SELECT cascade FROM runs ORDER BY id")]
            self.assertEqual(modes, [mode, mode], out)

    def test_peers_build_folder_defaults_to_the_checkouts(self):
        # the fa3 and flashmla adapters find kernels/peers' build through AR_PEERS_BUILT: unset, the
        # script hands them the checkout's .peers/built; set, the caller's folder
        db = tmpdb(self, "sbs_peers_default.db")
        env = dict(BASE_BACKEND="cpu", STEPS="0:1")
        saved = os.environ.pop("AR_PEERS_BUILT", None)
        try:
            rc, out = side_by_side(db, sample("mixed"), **env)
        finally:
            if saved is not None:
                os.environ["AR_PEERS_BUILT"] = saved
        self.assertEqual(rc, 0, out)
        self.assertIn("peers: AR_PEERS_BUILT=%s" % os.path.join(SRC, ".peers", "built"), out)
        rc, out = side_by_side(tmpdb(self, "sbs_peers_set.db"), sample("mixed"), AR_PEERS_BUILT="/nonexistent/built", **env)
        self.assertEqual(rc, 0, out)
        self.assertIn("peers: AR_PEERS_BUILT=/nonexistent/built (not a folder", out)

    def test_flashinfer_from_the_peers_build(self):
        # a folder shaped as kernels/peers/'s FlashInfer build: the script takes it up (or says why
        # it cannot); a flashinfer that still does not run here is refused (exit 2 or 3), never compared,
        # and the other adapter still is
        try:
            import flashinfer  # noqa: F401
            importable = True
        except Exception:       # an ImportError, or a dependency failing its import
            importable = False
        if importable:
            self.skipTest("flashinfer is importable here: the script leaves the path alone")
        built = tempfile.mkdtemp(prefix="ar_sbs_peers_")
        self.addCleanup(shutil.rmtree, built, True)
        os.makedirs(os.path.join(built, "flashinfer", "flashinfer_jit_cache"))
        db = tmpdb(self, "sbs_flashinfer.db")
        rc, out = side_by_side(db, sample("mixed"), BASE_BACKEND="cpu", STEPS="0:2", ADAPTERS="numpy flashinfer",
                               AR_PEERS_BUILT=built)
        self.assertEqual(rc, 0, out)
        self.assertTrue("flashinfer: the carried wheels" in out or "installing .whl's wheels failed" in out, out)
        if "the carried wheels" in out:
            self.assertIn(os.path.join(built, "flashinfer"), out)
        self.assertRegex(out, r"\nflashinfer: exit [23] ")   # refused: not importable (2) or no device (3)
        self.assertIn("| 2 | py:numpy | all |", out)
        self.assertNotIn("py:flashinfer |", out)
        self.assertNotIn("Traceback", out)


if __name__ == "__main__":
    unittest.main()
