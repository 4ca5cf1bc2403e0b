"""Shared by the package's tests: where things are, running attnreplay-py, reading a database."""
import importlib.util
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("AR_SRC") or os.path.abspath(os.path.join(HERE, "..", "..", ".."))
BUILD = os.environ.get("AR_BUILD") or os.path.join(SRC, "build")
BIN = os.environ.get("AR_BIN") or os.path.join(SRC, "bin", "attnreplay")
LIB = os.environ.get("ATTNREPLAY_LIB") or os.path.join(BUILD, "libattnreplay.so")
needs_lib = unittest.skipUnless(os.path.exists(LIB), "%s not built (make; or set ATTNREPLAY_LIB)" % LIB)
needs_numpy = unittest.skipUnless(importlib.util.find_spec("numpy"), "numpy not installed (the numpy adapter)")


def sample(name):
    return os.path.join(SRC, "traces", "samples", name + ".trace.jsonl.gz")


def cli():
    """The installed console script when there is one, else the module."""
    script = os.path.join(os.path.dirname(sys.executable), "attnreplay-py")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "attnreplay.cli"]


def sigint_default():
    """In the child before exec: SIGINT back to its default action, as a terminal starts a command.
    A test run from a background job or under nohup inherits SIGINT ignored, and Python then keeps
    it ignored (no KeyboardInterrupt), which is right for the command and wrong for a test of it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(args, cmd=None, env=None):
    """Runs attnreplay-py (or cmd) with args, env added to the environment, SIGINT at its default
    action (sigint_default); returns (exit code, stdout + stderr)."""
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("ATTNREPLAY_LIB", LIB)
    p = subprocess.run((cmd or cli()) + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       env=env, timeout=600, preexec_fn=sigint_default)
    return p.returncode, p.stdout.decode(errors="replace")


def query(db, sql, *params):
    con = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


def tmpdb(testcase, name):
    d = tempfile.mkdtemp(prefix="attnreplay-py-")
    testcase.addCleanup(lambda: subprocess.run(["rm", "-rf", d]))
    return os.path.join(d, name)
