"""`attnreplay export --format flashinfer-trace`: the files parse with the safetensors package
when it is installed (else with a reader of the format's spec written here), every workload's
axes agree with its tensors and its definition, and, where torch is installed, each
definition's reference runs on a workload and gives base-2 LSE."""
import glob
import json
import os
import struct
import subprocess
import unittest

import numpy as np

from helpers import BIN, sample, tmpdb


def read_safetensors(path):
    """The format: u64 little-endian header length N, N bytes of JSON, then the raw data."""
    try:
        from safetensors.numpy import load_file
        return load_file(path)
    except ImportError:
        pass
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        assert spec["dtype"] == "I32", spec
        a, b = spec["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<i4").reshape(spec["shape"])
    return out


class Export(unittest.TestCase):
    def export(self, name, steps="0:"):
        out = os.path.dirname(tmpdb(self, "x"))
        subprocess.run([BIN, "export", sample(name), "--steps", steps, "--format", "flashinfer-trace",
                        "--out", out], check=True, stdout=subprocess.DEVNULL)
        return out

    def test_workloads_parse_and_agree(self):
        out = self.export("mixed")
        lines = 0
        for jsonl in glob.glob(os.path.join(out, "workloads", "gqa_paged", "*.jsonl")):
            name = os.path.basename(jsonl)[:-len(".jsonl")]
            with open(os.path.join(out, "definitions", "gqa_paged", name + ".json")) as f:
                definition = json.load(f)
            self.assertEqual(definition["name"], name)
            with open(jsonl) as f:
                records = [json.loads(line) for line in f]
            for rec in records:
                lines += 1
                self.assertEqual(rec["definition"], name)
                self.assertIsNone(rec["solution"])
                w = rec["workload"]
                var_axes = {k for k, v in definition["axes"].items() if v["type"] == "var"}
                self.assertEqual(set(w["axes"]), var_axes)
                self.assertEqual(set(w["inputs"]), set(definition["inputs"]))
                paths = {d["path"] for d in w["inputs"].values() if d["type"] == "safetensors"}
                self.assertEqual(len(paths), 1)
                t = read_safetensors(os.path.join(out, paths.pop()))
                ax = w["axes"]
                self.assertEqual(t["kv_indptr"].shape, (ax["len_indptr"],))
                self.assertEqual(int(t["kv_indptr"][-1]), ax["num_kv_indices"])
                self.assertEqual(t["kv_last_page_len"].shape, (ax["batch_size"],))
                self.assertTrue(((t["kv_indices"] > 0) & (t["kv_indices"] < ax["num_pages"])).all())
                if "qo_indptr" in t:
                    self.assertEqual(int(t["qo_indptr"][-1]), ax["total_q"])
                else:
                    self.assertEqual(ax["total_q"], ax["batch_size"])
        self.assertEqual(lines, 26)

    def test_reference_runs_under_torch(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed: the definitions' references are checked where it is")
        out = self.export("chunked", "0:8")
        for jsonl in glob.glob(os.path.join(out, "workloads", "gqa_paged", "*.jsonl")):
            name = os.path.basename(jsonl)[:-len(".jsonl")]
            with open(os.path.join(out, "definitions", "gqa_paged", name + ".json")) as f:
                definition = json.load(f)
            scope = {}
            exec(definition["reference"], scope)
            with open(jsonl) as f:
                w = json.loads(f.readline())["workload"]
            t = read_safetensors(os.path.join(out, w["inputs"]["kv_indptr"]["path"]))
            c = {k: v["value"] for k, v in definition["axes"].items() if v["type"] == "const"}
            g = torch.Generator().manual_seed(0)
            q = torch.randn(w["axes"]["total_q"], c["num_qo_heads"], c["head_dim"], generator=g)
            k = torch.randn(w["axes"]["num_pages"], c["page_size"], c["num_kv_heads"], c["head_dim"], generator=g)
            v = torch.randn(k.shape, generator=g)
            args = [q, k, v] + [torch.from_numpy(np.array(t[n])) for n in definition["inputs"]
                                if n in t] + [w["inputs"]["sm_scale"]["value"]]
            output, lse = scope["run"](*args)
            self.assertEqual(tuple(output.shape), tuple(q.shape))
            self.assertEqual(tuple(lse.shape), (q.shape[0], c["num_qo_heads"]))
            self.assertTrue(torch.isfinite(lse).all())


if __name__ == "__main__":
    unittest.main()
