"""attnreplay-py given bad input, as a new user might: each is refused with a message naming the
file or option and the rule, with exit 2 (or the documented code), never a Python traceback."""
import os
import shutil
import sys
import unittest

from helpers import BUILD, cli, needs_lib, needs_numpy, query, run, sample, tmpdb


class Library(unittest.TestCase):
    @needs_numpy
    def test_library_missing_or_not_ours(self):
        d = os.path.dirname(tmpdb(self, "x.db"))
        not_elf = os.path.join(d, "libattnreplay.so")
        with open(not_elf, "w") as f:
            f.write("not a shared object\n")
        cases = [(os.path.join(d, "absent.so"), "absent.so: no such file"),
                 (not_elf, "cannot load"),
                 (d, "cannot load")]
        other = os.path.join(BUILD, "plugins", "attnreplay-example-cpu.so")
        if os.path.exists(other):
            cases.append((other, "not libattnreplay (no ar_replay_main"))
        for lib, message in cases:
            for backend in ("numpy", "cpu"):
                rc, out = run(["replay", sample("mixed"), "--backend", backend, "--db", os.path.join(d, "r.db"),
                               "--quiet"], env={"ATTNREPLAY_LIB": lib})
                self.assertEqual(rc, 2, "%s %s: %s" % (lib, backend, out))
                self.assertIn("ATTNREPLAY_LIB=%s" % lib, out)
                self.assertIn(message, out)
                self.assertNotIn("Traceback", out)
        self.assertFalse(os.path.exists(os.path.join(d, "r.db")))


class Arguments(unittest.TestCase):
    @needs_lib
    @needs_numpy
    def test_paths_not_utf8(self):
        # file names are bytes on Linux: one that is not UTF-8 reaches the engine as it is
        d = os.path.dirname(tmpdb(self, "x.db"))
        trace = os.path.join(d, os.fsdecode(b"trace-\xff.jsonl.gz"))
        db = os.path.join(d, os.fsdecode(b"results-\xfe.db"))
        shutil.copy(sample("mixed"), trace)
        rc, out = run(["replay", trace, "--backend", "numpy", "--db", db, "--quiet"])
        self.assertEqual(rc, 0, out)
        self.assertEqual(query(db, "SELECT status FROM runs"), [("passed",)])
        # the library takes paths and numbers too
        code = ("import os, pathlib, sys, attnreplay; sys.exit(attnreplay.replay([pathlib.Path(%r), '--backend', "
                "'numpy', '--db', os.fsencode(%r), '--layers', 2, '--quiet']))" % (trace, db))
        rc, out = run(["-c", code], cmd=[sys.executable])
        self.assertEqual(rc, 0, out)
        self.assertEqual(query(db, "SELECT layers FROM runs WHERE id = 2"), [(2,)])
        rc, out = run(["replay", os.path.join(d, os.fsdecode(b"absent-\xff.gz")), "--backend", "numpy", "--db", db])
        self.assertEqual(rc, 2, out)
        self.assertIn("absent-", out)
        self.assertNotIn("Traceback", out)

    @needs_lib
    @needs_numpy
    def test_last_backend_wins(self):
        # as in `attnreplay replay`, the last --backend is the one that runs
        db = tmpdb(self, "last.db")
        for args in (["--backend", "cpu", "--backend", "numpy"], ["--backend=numpy", "--backend", "cpu"],
                     ["--backend", "nosuchname", "--backend=numpy"]):
            rc, out = run(["replay", sample("mixed"), "--db", db, "--quiet", "--layers", "1"] + args)
            self.assertEqual(rc, 0, "%s: %s" % (args, out))
        self.assertEqual(query(db, "SELECT backend FROM runs ORDER BY id"), [("py:numpy",), ("cpu",), ("py:numpy",)])


    def test_usage(self):
        # as the C commands: --help on stdout with exit 0, a usage error on stderr with exit 2
        import subprocess
        for args, code, on_stdout in (([], 2, False), (["nosuchcommand"], 2, False), (["--help"], 0, True)):
            p = subprocess.run(cli() + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
            out, err = p.stdout.decode(), p.stderr.decode()
            self.assertEqual(p.returncode, code, args)
            self.assertIn("attnreplay-py replay TRACE", out if on_stdout else err, args)
            self.assertEqual(err if on_stdout else out, "", args)

    def test_library_args_one_string(self):
        # replay() takes the argument list; one string would be split into its characters
        code = ("import attnreplay\n"
                "for args in ('trace.jsonl.gz --db r.db', b'trace.jsonl.gz'):\n"
                "    try:\n"
                "        attnreplay.replay(args)\n"
                "    except TypeError as e:\n"
                "        print(e)\n")
        rc, out = run(["-c", code], cmd=[sys.executable])
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count("attnreplay replay: args is a list of arguments (as on the command line), "
                                   "not one string"), 2, out)

    @needs_lib
    @needs_numpy
    def test_library_replays_twice(self):
        # attnreplay.replay() in a loop: the same Python backend for each run of one process
        db = tmpdb(self, "twice.db")
        code = ("import sys, attnreplay\n"
                "codes = [attnreplay.replay([%r, '--backend', b, '--db', %r, '--quiet', '--steps', '0:5'])\n"
                "         for b in ('numpy', 'numpy', 'cpu', 'pybackends:Marks', 'numpy')]\n"
                "print(codes)\nsys.exit(max(codes))\n" % (sample("mixed"), db))
        rc, out = run(["-c", code], cmd=[sys.executable])
        self.assertEqual(rc, 0, out)
        self.assertEqual(query(db, "SELECT backend, status FROM runs ORDER BY id"),
                         [("py:numpy", "passed")] * 2 + [("cpu", "passed"), ("py:marks", "passed"), ("py:numpy", "passed")])

    def test_backends_arguments(self):
        # backends takes no argument: --help is its usage, anything else a usage error
        rc, out = run(["backends", "--help"])
        self.assertEqual(rc, 0, out)
        self.assertIn("usage: attnreplay-py backends", out)
        self.assertNotIn("numpy ", out)
        for extra in (["--trace", sample("mixed")], ["numpy"]):
            rc, out = run(["backends"] + extra)
            self.assertEqual(rc, 2, out)
            self.assertIn("attnreplay-py backends: unexpected argument '%s'" % extra[0], out)

    def test_backends_lists_bare_classes(self):
        # an installed backend without summary or docstring (another package's entry point)
        import contextlib
        import io
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from attnreplay import cli as package_cli
        d = os.path.dirname(tmpdb(self, "x.db"))
        with open(os.path.join(d, "bare_backend.py"), "w") as f:
            f.write("from attnreplay import Backend\nclass Bare(Backend):\n    name = 'bare'\n")
        sys.path.insert(0, d)
        self.addCleanup(sys.path.remove, d)
        saved = package_cli._entry_points
        package_cli._entry_points = lambda: {"bare": "bare_backend:Bare"}
        self.addCleanup(setattr, package_cli, "_entry_points", saved)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(package_cli.main(["backends"]), 0)
        self.assertRegex(out.getvalue(), r"(?m)^bare +cpu$")
        self.assertIn("numpy ", out.getvalue())

    def test_run_as_a_module(self):
        # python -m attnreplay is attnreplay-py
        rc, out = run(["-m", "attnreplay", "replay", sample("mixed"), "--backend", "nosuchname"], cmd=[sys.executable])
        self.assertEqual(rc, 2, out)
        self.assertIn("attnreplay-py replay: --backend nosuchname: not module:Class", out)


class Interrupt(unittest.TestCase):
    def test_sigint_before_the_engine_starts(self):
        # SIGINT while the backend's module imports (torch takes seconds): no traceback, exit 130
        db = tmpdb(self, "int.db")
        d = os.path.dirname(db)
        with open(os.path.join(d, "slow_import.py"), "w") as f:
            f.write("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n")
        rc, out = run(["replay", sample("mixed"), "--backend", "slow_import:K", "--db", db, "--quiet"],
                      env={"PYTHONPATH": d})
        self.assertEqual(rc, 130, out)
        self.assertIn("attnreplay-py replay: interrupted (SIGINT) before the replay began; nothing was stored", out)
        self.assertNotIn("Traceback", out)
        self.assertFalse(os.path.exists(db))


@unittest.skipUnless(os.path.exists("/dev/full"), "no /dev/full here")
@needs_lib
@needs_numpy
class Output(unittest.TestCase):
    def test_stdout_full_or_closed(self):
        # the ratio table or the backends list to a full disk or a closed pipe: said, exit 3
        import subprocess
        db = tmpdb(self, "out.db")
        for _ in range(2):
            rc, out = run(["replay", sample("mixed"), "--backend", "numpy", "--db", db, "--quiet"])
            self.assertEqual(rc, 0, out)
        for args in (["ratios", db, "--base", "1"], ["backends"]):
            with open("/dev/full", "w") as full:
                p = subprocess.run(cli() + args, stdout=full, stderr=subprocess.PIPE, timeout=120)
            err = p.stderr.decode(errors="replace")
            self.assertEqual(p.returncode, 3, "%s: %s" % (args, err))
            self.assertIn("attnreplay-py %s: cannot write the output (No space left on device)" % args[0], err)
            self.assertNotIn("Traceback", err)
            self.assertNotIn("Exception ignored", err)
            r, w = os.pipe()
            os.close(r)
            p = subprocess.run(cli() + args, stdout=w, stderr=subprocess.PIPE, timeout=120)
            os.close(w)
            err = p.stderr.decode(errors="replace")
            self.assertEqual(p.returncode, 3, "%s: %s" % (args, err))
            self.assertIn("cannot write the output (Broken pipe)", err)
            self.assertNotIn("Traceback", err)


BAD_MODULES = {
    "raises_on_import": 'raise RuntimeError("CUDA driver 12.2 is older than this build needs")\n',
    "bad_syntax": "def forward(:\n",
    "bad_classes": ("from attnreplay import Backend\n"
                    "class NoDevice(Backend):\n"
                    "    name = 'no-device'\n"
                    "    def __init__(self):\n"
                    "        raise RuntimeError('no CUDA device visible')\n"
                    "class NotABackend:\n"
                    "    pass\n"
                    "class OddDevice(Backend):\n"
                    "    name = 'odd-device'\n"
                    "    device = 'gpu'\n"
                    "CONSTANT = 3\n"
                    "class NumberName(Backend):\n"
                    "    name = 5\n"
                    "class NoneSummary(Backend):\n"
                    "    name = 'none-summary'\n"
                    "    summary = None\n"
                    "    capabilities = 3\n"),
}


class BackendSpecs(unittest.TestCase):
    def test_specs_that_cannot_make_a_backend(self):
        db = tmpdb(self, "specs.db")
        d = os.path.dirname(db)
        for name, text in BAD_MODULES.items():
            with open(os.path.join(d, name + ".py"), "w") as f:
                f.write(text)
        for spec, message in (
                ("raises_on_import:K", "--backend raises_on_import:K: cannot import raises_on_import: RuntimeError: "
                                       "CUDA driver 12.2 is older"),
                ("bad_syntax:K", "--backend bad_syntax:K: cannot import bad_syntax: SyntaxError"),
                (".relative:K", "--backend .relative:K: cannot import .relative"),
                (":K", "--backend :K: cannot import"),
                ("bad_classes:NoDevice", "--backend bad_classes:NoDevice: NoDevice() raised RuntimeError: no CUDA device"),
                ("bad_classes:NotABackend", "--backend bad_classes:NotABackend: not a subclass of attnreplay.Backend"),
                ("bad_classes:CONSTANT", "--backend bad_classes:CONSTANT: not a subclass of attnreplay.Backend"),
                ("os:path", "--backend os:path: not a subclass of attnreplay.Backend"),
                ("bad_classes:OddDevice", "device 'gpu': \"cpu\" or \"cuda\""),
                ("bad_classes:NumberName", "NumberName: name 5: a str (or None: the class's name)"),
                ("bad_classes:NoneSummary", "NoneSummary: capabilities 3: a str")):
            rc, out = run(["replay", sample("mixed"), "--backend", spec, "--db", db, "--quiet"],
                          env={"PYTHONPATH": d})
            self.assertEqual(rc, 2, "%s: %s" % (spec, out))
            self.assertIn(message, out, spec)
            self.assertNotIn("Traceback", out, spec)
        self.assertFalse(os.path.exists(db))


if __name__ == "__main__":
    unittest.main()
