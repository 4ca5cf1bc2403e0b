"""test_install_flashinfer.py - install_flashinfer.sh without pip or wheels: a stand-in python3
first on PATH plays pip.  The script prints only the PYTHONPATH that imports what it installed (the
modules folder given, /tmp/ar_site, then the caller's PYTHONPATH), with pip's own output on stderr;
it prints nothing and exits 1 when no wheel was carried, and with pip's status when pip fails.
Its callers (build_peers.sh, native_peers.sh, device_harness.sh, side_by_side.sh) take the path
from it, so a wrong one fails here.

    python3 kernels/peers/test_install_flashinfer.py     (CI runs it with the other kernels/peers tests)
"""
import os
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "install_flashinfer.sh")


class InstallFlashInfer(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ar_fi_install_")
        self.addCleanup(shutil.rmtree, self.dir, True)
        os.makedirs(os.path.join(self.dir, "bin"))
        os.makedirs(os.path.join(self.dir, "repo", ".whl"))
        stub = os.path.join(self.dir, "bin", "python3")
        with open(stub, "w") as f:   # "pip": says what it was asked on stdout, exits $STUB_RC
            f.write('#!/bin/sh\necho "pip $*"\nexit ${STUB_RC:-0}\n')
        os.chmod(stub, 0o755)

    def run_script(self, *args, wheel=True, **env):
        whl = os.path.join(self.dir, "repo", ".whl", "flashinfer_python-0.5.3-py3-none-any.whl")
        if wheel:
            open(whl, "w").close()
        elif os.path.exists(whl):
            os.remove(whl)
        full = dict(os.environ, PATH=os.path.join(self.dir, "bin") + os.pathsep + os.environ["PATH"])
        full.pop("PYTHONPATH", None)
        full.update(env)
        return subprocess.run(["bash", SCRIPT, *args], cwd=os.path.join(self.dir, "repo"), env=full,
                              capture_output=True, text=True, timeout=60)

    def test_prints_the_path_and_nothing_else(self):
        p = self.run_script("/built/flashinfer", PYTHONPATH="/mine")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "/built/flashinfer:/tmp/ar_site:/mine\n")
        self.assertIn("--target /tmp/ar_site", p.stderr)        # pip ran, its words on stderr
        self.assertIn("--no-index", p.stderr)

    def test_without_modules_or_caller_path(self):
        p = self.run_script()
        self.assertEqual((p.returncode, p.stdout), (0, "/tmp/ar_site\n"), p.stderr)

    def test_no_wheel_carried(self):
        p = self.run_script("/built/flashinfer", wheel=False)
        self.assertEqual((p.returncode, p.stdout), (1, ""))
        self.assertNotIn("pip", p.stderr)

    def test_pip_failing(self):
        p = self.run_script("/built/flashinfer", STUB_RC="3")
        self.assertEqual((p.returncode, p.stdout), (3, ""))


if __name__ == "__main__":
    unittest.main()
