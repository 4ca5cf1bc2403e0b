"""attnreplay-py replay end to end: the numpy adapter against the float64 reference on every
sample trace, the same options and the same database as `attnreplay replay`, the host's cache
write or the backend's own, time marks, and each way a Python backend can fail."""
import os
import unittest

from helpers import BIN, BUILD, query, run, sample, tmpdb


class NumpyAdapter(unittest.TestCase):
    def test_every_sample_passes(self):
        db = tmpdb(self, "numpy.db")
        for name in ("mixed", "chunked", "prefix", "preempt"):
            rc, out = run(["replay", sample(name), "--backend", "numpy", "--db", db, "--layers", "2", "--quiet"])
            self.assertEqual(rc, 0, out)
        self.assertEqual(query(db, "SELECT count(*), min(backend), max(backend) FROM runs WHERE status='passed'"),
                         [(4, "py:numpy", "py:numpy")])
        self.assertEqual(query(db, "SELECT count(*) FROM steps WHERE pass IS NOT 1 OR rows_checked <= 0"), [(0,)])
        names = {r[0] for r in query(db, "SELECT DISTINCT name FROM kernels WHERE layer = 1 AND time_us > 0")}
        self.assertEqual(names, {"write", "gather", "attn"})

    def test_dtypes_and_options(self):
        db = tmpdb(self, "opts.db")
        for extra in (["--dtype", "fp32"], ["--dtype", "fp16"], ["--steps", "4:11", "--repeat", "2"],
                      ["--verify", "sample:3", "--data", "outlier"], ["--backend=numpy", "--seed", "7"]):
            args = ["replay", sample("mixed"), "--db", db, "--quiet"] + extra
            if not any(a.startswith("--backend") for a in extra):
                args += ["--backend", "numpy"]
            rc, out = run(args)
            self.assertEqual(rc, 0, "%s: %s" % (extra, out))
        self.assertEqual(query(db, "SELECT count(*) FROM runs WHERE status NOT IN ('passed')"), [(0,)])
        self.assertEqual(query(db, "SELECT count(*) FROM steps WHERE run=3"), [(8,)])
        self.assertEqual(query(db, "SELECT verify FROM runs WHERE id=4"), [("sample",)])

    def test_mla_sample_passes(self):
        # the host absorbs W_UK into q and applies W_UV to the adapter's latent output
        db = tmpdb(self, "mla.db")
        rc, out = run(["replay", sample("deepseek-v3-tp16"), "--backend", "numpy", "--db", db, "--steps", "7:9",
                       "--layers", "2", "--quiet"])
        self.assertEqual(rc, 0, out)
        self.assertEqual(query(db, "SELECT count(*), min(pass), min(rows_checked) > 0 FROM steps"), [(3, 1, 1)])
        rc, out = run(["replay", sample("deepseek-v3-tp16"), "--backend", "numpy", "--db", db, "--steps", "7:8",
                       "--inject", "mla-no-wuv", "--quiet"])
        self.assertEqual(rc, 1, out)

    def test_same_database_as_the_c_binary(self):
        db = tmpdb(self, "same.db")
        rc, out = run(["replay", sample("chunked"), "--backend", "cpu", "--db", db, "--quiet"], cmd=[BIN])
        self.assertEqual(rc, 0, out)
        rc, out = run(["replay", sample("chunked"), "--backend", "numpy", "--db", db, "--quiet"])
        self.assertEqual(rc, 0, out)
        shape = "SELECT step, num_reqs, num_tokens, num_prefill_reqs, max_seq_len, bytes, flops FROM steps WHERE run=? ORDER BY step"
        self.assertEqual(query(db, shape, 1), query(db, shape, 2))
        self.assertEqual(query(db, "SELECT trace_hash FROM runs WHERE id=1"), query(db, "SELECT trace_hash FROM runs WHERE id=2"))

    def test_cascade_steps_run_flat(self):
        db = tmpdb(self, "flat.db")
        rc, out = run(["replay", sample("prefix"), "--backend", "numpy", "--db", db, "--cascade", "on", "--quiet"])
        self.assertEqual(rc, 0, out)
        self.assertEqual(query(db, "SELECT count(*) FROM steps WHERE cascade != 0"), [(0,)])

    def test_backend_writes_kv_and_marks(self):
        db = tmpdb(self, "writes.db")
        rc, out = run(["replay", sample("mixed"), "--backend", "pybackends:WritesKV", "--db", db, "--quiet"])
        self.assertEqual(rc, 0, out)
        names = {r[0] for r in query(db, "SELECT DISTINCT name FROM kernels")}
        self.assertEqual(names, {"write", "gather", "attn"})   # "write" is the backend's own mark here
        rc, out = run(["replay", sample("mixed"), "--backend", "pybackends:Marks", "--db", db, "--quiet"])
        self.assertEqual(rc, 0, out)
        names = {r[0] for r in query(db, "SELECT DISTINCT name FROM kernels WHERE run=2")}
        self.assertEqual(names, {"write", "prep", "gather", "attn"})
        # the host's write with a wrong slot mapping reaches the backend: flagged
        rc, out = run(["replay", sample("mixed"), "--backend", "numpy", "--db", db, "--inject", "wrong-slot", "--quiet"])
        self.assertEqual(rc, 1, out)


class Ratios(unittest.TestCase):
    def test_ratio_table(self):
        db = tmpdb(self, "ratios.db")
        for cmd, backend in (([BIN], "cpu"), (None, "numpy")):
            rc, out = run(["replay", sample("mixed"), "--backend", backend, "--db", db, "--quiet"], cmd=cmd)
            self.assertEqual(rc, 0, out)
        rc, out = run(["ratios", db, "--base", "1"])
        self.assertEqual(rc, 0, out)
        rows = [l.split("|") for l in out.splitlines() if l.startswith("| 2 |")]
        kinds = {r[3].strip(): int(r[4]) for r in rows}
        steps = query(db, "SELECT count(*) FROM steps WHERE run=1")[0][0]
        self.assertEqual(kinds["all"], steps)
        self.assertEqual(sum(v for k, v in kinds.items() if k != "all"), steps)
        self.assertNotEqual(rows[0][8].strip(), "-")          # the numpy adapter's gather share
        rc, out = run(["ratios", db, "--base", "9"])
        self.assertEqual(rc, 2)


class Failures(unittest.TestCase):
    def expect(self, backend, code, message, extra=()):
        db = tmpdb(self, "fail.db")
        rc, out = run(["replay", sample("mixed"), "--backend", backend, "--db", db, "--quiet"] + list(extra))
        self.assertEqual(rc, code, out)
        self.assertIn(message, out)
        return db

    def test_check_refuses(self):
        self.expect("pybackends:Refuses", 2, "the plugin refuses this config: head size 64 is not one this kernel")

    def test_open_raises(self):
        self.expect("pybackends:OpenRaises", 2, "refused to open this config: open() raised MemoryError: workspace")

    def test_forward_raises(self):
        db = self.expect("pybackends:ForwardRaises", 3, "forward failed at step 2, layer 0: forward() raised "
                                                         "RuntimeError: illegal memory access (planted)")
        self.assertEqual(query(db, "SELECT status FROM runs"), [("error",)])

    def test_forward_exits(self):
        db = self.expect("pybackends:ExitsInForward", 3, "forward failed at step 2, layer 0: forward() raised "
                                                          "SystemExit: kernel gave up")
        self.assertEqual(query(db, "SELECT status FROM runs"), [("error",)])

    def test_unwritten_rows_fail(self):
        db = self.expect("pybackends:LeavesRows", 1, "")
        self.assertEqual(query(db, "SELECT status FROM runs"), [("failed",)])
        self.assertGreater(query(db, "SELECT min(nan_count) FROM steps")[0][0], 0)

    def test_kernel_fault_refused(self):
        self.expect("numpy", 2, "planted fault 'no-rescale' is not implemented by the numpy adapter",
                    ["--inject", "no-rescale"])

    def test_bad_specs(self):
        self.expect("no_such_module:Kernel", 2, "cannot import no_such_module")
        self.expect("pybackends:NoSuchClass", 2, "module pybackends has no NoSuchClass")
        self.expect("pybackends:Nameless", 2, "name must be 1-64 characters without spaces")
        self.expect("nosuchname", 2, "not module:Class")

    def test_broken_c_plugins_through_the_package(self):
        plugins = os.path.join(BUILD, "tests", "plugins")
        self.expect("plugin:" + os.path.join(plugins, "broken-abi.so"), 2,
                    "plugin ABI version 99, but this attnreplay speaks versions 1 to 2")
        self.expect("plugin:" + os.path.join(plugins, "broken-nosym.so"), 2, "does not export attnreplay_plugin_init")
        self.expect("plugin:" + os.path.join(plugins, "broken-forward.so"), 3, "forward failed at step 1")

    def test_example_c_plugin_through_the_package(self):
        self.expect("plugin:" + os.path.join(BUILD, "plugins", "attnreplay-example-cpu.so"), 0, "")


if __name__ == "__main__":
    unittest.main()
