"""The adapters' import of a peer built by kernels/peers/ (import_built), on any machine: a module
on the path wins; else it comes from $AR_PEERS_BUILT/<folder>; else the error names the folder it
looked in, or says AR_PEERS_BUILT is not set, so a user sees where the build was expected."""
import os
import shutil
import sys
import tempfile
import unittest

from attnreplay.adapters import import_built


class ImportBuilt(unittest.TestCase):
    def setUp(self):
        self.built = tempfile.mkdtemp(prefix="ar_peers_built_")
        self.addCleanup(shutil.rmtree, self.built, True)
        saved = os.environ.pop("AR_PEERS_BUILT", None)
        self.addCleanup(lambda: os.environ.pop("AR_PEERS_BUILT", None) if saved is None
                        else os.environ.__setitem__("AR_PEERS_BUILT", saved))
        self.addCleanup(sys.modules.pop, "ar_fake_peer", None)
        path = list(sys.path)
        self.addCleanup(lambda: sys.path.__setitem__(slice(None), path))

    def test_from_the_build_folder(self):
        os.makedirs(os.path.join(self.built, "fake"))
        with open(os.path.join(self.built, "fake", "ar_fake_peer.py"), "w") as f:
            f.write("WHERE = 'built'\n")
        os.environ["AR_PEERS_BUILT"] = self.built
        self.assertEqual(import_built("ar_fake_peer", "fake").WHERE, "built")

    def test_missing_folder_is_named(self):
        os.environ["AR_PEERS_BUILT"] = self.built
        with self.assertRaises(ImportError) as e:
            import_built("ar_fake_peer", "fake")
        self.assertIn(os.path.join(self.built, "fake") + " is not a folder", str(e.exception))
        self.assertIn("ar_fake_peer is not importable", str(e.exception))

    def test_unset_variable_is_said(self):
        with self.assertRaises(ImportError) as e:
            import_built("ar_fake_peer", "fake")
        self.assertIn("AR_PEERS_BUILT, the folder of kernels/peers' build, is not set", str(e.exception))


if __name__ == "__main__":
    unittest.main()
