"""common.py - shared helpers of the vLLM tests (make test-vllm): where the repository, the
attnreplay binary and the public traces are, the workloads the tests run, and running
`attnreplay info` / `replay` on a trace.

AR_SRC is the repository (default: two levels up), AR_BIN the binary (default AR_SRC/bin/attnreplay),
public traces are read from AR_SRC/../shared/traces-public (AR_TRACES_PUBLIC overrides it)."""

import os
import re
import subprocess
import tempfile

SRC = os.path.abspath(os.environ.get("AR_SRC") or os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("AR_BIN") or os.path.join(SRC, "bin", "attnreplay")
PUBLIC = os.environ.get("AR_TRACES_PUBLIC") or os.path.join(SRC, "..", "shared", "traces-public")
MOONCAKE = os.path.join(PUBLIC, "mooncake-fast25", "synthetic_trace.jsonl")
TINY_MODEL = os.path.join(SRC, "traces", "vllm_recorder", "models", "tiny-llama")

_tmp = None


def tmpdir():
    global _tmp
    if _tmp is None:
        _tmp = tempfile.mkdtemp(prefix="artest-vllm.")
    return _tmp


def tmp(name):
    return os.path.join(tmpdir(), name)


def run(*args, timeout=900):
    """(exit code, stdout + stderr) of a command."""
    r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def info(trace):
    return run(BIN, "info", trace)


def replay_cpu(trace):
    """Replays a trace on the CPU backend (one layer, the default verification: every row);
    returns (exit code, output, steps verified and passed, steps failed) from the summary."""
    db = trace + ".db"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(db + suffix):
            os.remove(db + suffix)
    rc, out = run(BIN, "replay", trace, "--db", db, "--backend", "cpu", "--threads", "2")
    m = re.search(r"steps\s+(\d+) replayed, (\d+) failed, (\d+) unverified", out)
    if not m:
        return rc, out, -1, -1
    replayed, failed, unverified = (int(g) for g in m.groups())
    return rc, out, replayed - failed - unverified, failed


def have_mooncake():
    return os.path.isfile(MOONCAKE)
