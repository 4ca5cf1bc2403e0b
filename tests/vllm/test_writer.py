"""test_writer.py - the recorder's trace writer and options on bad input, without an engine: a
trace that cannot be created, a full disk part-way, an engine killed part-way, and a malformed
$ATTNREPLAY_TRACE_CONTENT.  Runs in `make test-vllm` (with vLLM) and in `make py-test`, where
vLLM is absent and the two scheduler classes the recorder subclasses are stand-ins (always in
the child processes that write, so that a file-size limit meets only the trace)."""

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = os.path.abspath(os.path.join(HERE, "..", "..", "traces"))
if TRACES not in sys.path:
    sys.path.insert(0, TRACES)

# stand-ins for the two classes recorder.py subclasses (the writer needs neither)
STAND_INS = textwrap.dedent("""
    import sys, types
    for name in ("vllm", "vllm.v1", "vllm.v1.core", "vllm.v1.core.sched",
                 "vllm.v1.core.sched.scheduler", "vllm.v1.core.sched.async_scheduler"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["vllm.v1.core.sched.scheduler"].Scheduler = type("Scheduler", (), {})
    sys.modules["vllm.v1.core.sched.async_scheduler"].AsyncScheduler = type("AsyncScheduler", (), {})
""")
try:
    import vllm.v1.core.sched.scheduler  # noqa: F401
except ImportError:
    exec(STAND_INS)
from vllm_recorder import recorder  # noqa: E402

HEADER = {"format": "attnreplay-trace", "version": 1, "source": "test"}


class WriterTests(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="artest-writer.")
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def run_child(self, path, steps, fsize_limit=None, kill_after=None):
        code = STAND_INS + textwrap.dedent(f"""
            import os, resource, signal, time
            sys.path.insert(0, {TRACES!r})
            from vllm_recorder import recorder

            def step(n):
                new = [(f"r{{n}}", 600, 0, list(range(1, 40)), [n * 1000 + k for k in range(37)], None)]
                return ("step", n, 0.02 * n, new, [], {{f"r{{n}}": 600}}, 0, [], [])

            if {fsize_limit!r} is not None:
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize_limit!r}, {fsize_limit!r}))
            w = recorder.TraceWriter({path!r}, {HEADER!r})
            for n in range({steps}):
                w.put(step(n))
                w.put(("done", n, 0.02 * n + 0.01, 0.02 * n))
                if n + 1 == {kill_after!r}:
                    time.sleep(0.5)   # the writer thread writes what it has
                    os.kill(os.getpid(), signal.SIGKILL)
            w.close()
            sys.exit(1 if w.error else 0)
        """)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        return r.returncode, r.stderr

    def leftovers(self):
        return sorted(f for f in os.listdir(self.dir) if ".tmp-" in f)

    def test_whole_trace_renamed_into_place(self):
        path = os.path.join(self.dir, "t.trace.jsonl.gz")
        rc, err = self.run_child(path, 50)
        self.assertEqual(rc, 0, err)
        with gzip.open(path, "rt") as f:
            lines = [json.loads(line) for line in f]
        self.assertEqual(lines[0], HEADER)
        self.assertEqual([s["step"] for s in lines[1:]], list(range(50)))
        self.assertEqual(self.leftovers(), [])

    def test_full_disk_leaves_no_trace(self):
        """A file-size limit of 16 KiB part-way: the log says so, PATH keeps what was there."""
        path = os.path.join(self.dir, "full.trace.jsonl.gz")
        with open(path, "w") as f:
            f.write("an earlier trace\n")
        rc, err = self.run_child(path, 3000, fsize_limit=16384)
        self.assertEqual(rc, 1, err)
        self.assertIn("File too large", err)
        self.assertIn(f"no trace written to {path}", err)
        with open(path) as f:
            self.assertEqual(f.read(), "an earlier trace\n")
        self.assertEqual(self.leftovers(), [])

    def test_killed_engine_leaves_no_cut_trace(self):
        """SIGKILL part-way: no PATH (a cut gzip there read as a broken trace), only PATH.tmp-PID."""
        path = os.path.join(self.dir, "killed.trace.jsonl.gz")
        rc, err = self.run_child(path, 500, kill_after=200)
        self.assertEqual(rc, -signal.SIGKILL, err)
        self.assertFalse(os.path.exists(path))
        self.assertEqual(len(self.leftovers()), 1)

    def test_trace_that_cannot_be_created(self):
        for path, why in ((os.path.join(self.dir, "no-such-dir", "t.trace.jsonl.gz"), "No such file or directory"),
                          (self.dir, "it is a directory")):
            with self.assertRaises(OSError) as cm:
                recorder.TraceWriter(path, HEADER)
            text = str(cm.exception)
            self.assertIn(f"cannot write the trace {path} ($ATTNREPLAY_TRACE)", text)
            self.assertIn(why, text)
        self.assertEqual(self.leftovers(), [])

    def test_content_option(self):
        saved = os.environ.pop(recorder.CONTENT_ENV, None)
        try:
            self.assertIsNone(recorder.content_mode())
            for value, want in (("", None), ("tokens", "tokens")):
                os.environ[recorder.CONTENT_ENV] = value
                self.assertEqual(recorder.content_mode(), want)
            for value in ("token", "TOKENS", "keys", " tokens"):
                os.environ[recorder.CONTENT_ENV] = value
                with self.assertRaises(ValueError) as cm:
                    recorder.content_mode()
                self.assertIn(f"ATTNREPLAY_TRACE_CONTENT={value!r}: expected 'tokens'", str(cm.exception))
        finally:
            os.environ.pop(recorder.CONTENT_ENV, None)
            if saved is not None:
                os.environ[recorder.CONTENT_ENV] = saved


if __name__ == "__main__":
    unittest.main()
