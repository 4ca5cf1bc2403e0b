"""attnreplay-py given bad input, as a new user might: each is refused with a message naming the
file or option and the rule, with exit 2 (or the documented code), never a Python traceback."""
import os
import unittest

from helpers import BUILD, run, sample, tmpdb


class Library(unittest.TestCase):
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


if __name__ == "__main__":
    unittest.main()
