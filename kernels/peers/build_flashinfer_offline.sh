#!/usr/bin/env bash
# build_flashinfer_offline.sh - compiles the FlashInfer 0.5.3 JIT modules that flashinfer_peer.py
# needs on an H100/H200 (sm_90a) on a machine without a GPU (nvcc and ninja only), so that the GPU
# machine loads them from .peers/built/flashinfer instead of compiling them in its short window.
#
# It installs .whl's two wheels, torch and FlashInfer's small Python dependencies into a venv under
# $FI_OFFLINE (default /tmp/fi_offline; needs pip to reach PyPI and a Python 3.12, the wheels' ABI),
# then runs the peer's wrapper calls (decode with CUDA-core and tensor-core kernels, the paged
# prefill at hd 128 and 256 with backend auto, the two-level cascade; same arguments as
# flashinfer_peer.py) on CPU tensors with FlashInfer told it is on an sm90 device
# (FLASHINFER_CUDA_ARCH_LIST=9.0a, get_compute_capability -> (9, 0)) and every module load replaced
# by a recorder.  The recorded JitSpecs are FlashInfer's own, so the module names are exactly those
# a GPU run asks for (the prefill ones end in _sm90: backend auto picks the FA3 template on sm90).
# The ones .peers/built/flashinfer/aot lacks are compiled with FlashInfer's build_jit_specs (its
# ninja files, MAX_JOBS parallel compiles, default nproc) in $FI_OFFLINE/ws; then
# flashinfer_peer.keep_modules() places every module compiled there at
# .peers/built/flashinfer/aot/<name>/<name>.so (stripped) and writes the flashinfer_jit_cache
# shim beside it, as a GPU run's --keep-modules does.  Each placed module is checked with
# cuobjdump --list-elf (sm_90a cubins) where a cuobjdump is found.
#
# Run from the repository root: bash kernels/peers/build_flashinfer_offline.sh
# Environment: FI_OFFLINE (work folder), PYTHON312 (interpreter for the venv), MAX_JOBS,
# CUDA_HOME (default /usr/local/cuda), FI_REBUILD=1 (rebuild modules that are already placed).
# On 2 cores (MAX_JOBS=2, nvcc 13.0, 2026-12-07) the venv took about 2.5 minutes and the four
# modules missing then (hd 128 and hd 256 sm90 prefill, cascade, page) 543 s: each FA3-template
# kernel file (8 per prefill module) 50-75 s, the cascade and page modules 10-20 s.
# An H100 loaded those modules the same day: every FlashInfer row of run_peers.sh ran and passed
# its float32 reference check.
# Writes only under $FI_OFFLINE and .peers/built/flashinfer.
set -eu
cd "$(dirname "$0")/../.."
FI_OFFLINE=${FI_OFFLINE:-/tmp/fi_offline}
VENV=$FI_OFFLINE/venv
DEST=$PWD/.peers/built/flashinfer
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
PY=${PYTHON312:-}
if [ -z "$PY" ]; then   # the first that runs (a pyenv shim may exist without its version active)
  for c in python3.12 /usr/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 python3; do
    "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { PY=$c; break; }
  done
fi
[ -n "$PY" ] || { echo "build_flashinfer_offline.sh: no Python 3.12 (set PYTHON312)"; exit 1; }
ls .whl/flashinfer_python-0.5.3-*.whl .whl/apache_tvm_ffi-*.whl >/dev/null ||
  { echo "build_flashinfer_offline.sh: .whl lacks FlashInfer 0.5.3's wheels (kernels/peers/README.md)"; exit 1; }
mkdir -p "$FI_OFFLINE" "$DEST/aot"

if ! "$VENV/bin/python" -c 'import torch, flashinfer' 2>/dev/null; then
  echo "== venv $VENV ($PY)"
  "$PY" -m venv "$VENV"
  # a CPU-only torch where its index is reachable, else PyPI's (CUDA libraries included, ~3 GB)
  "$VENV/bin/pip" install -q torch --index-url https://download.pytorch.org/whl/cpu 2>/dev/null ||
    "$VENV/bin/pip" install -q torch
  "$VENV/bin/pip" install -q ninja numpy packaging filelock einops click tqdm tabulate requests nvidia-ml-py
  # --no-deps: the CUTLASS DSL and cuDNN frontend it lists are not needed for these modules
  "$VENV/bin/pip" install -q --no-deps .whl/flashinfer_python-0.5.3-*.whl .whl/apache_tvm_ffi-*.whl 2>&1 |
    grep -v "dependency resolver\|requires nvidia-" || true
fi

CUOBJDUMP=$(command -v cuobjdump || ls "$CUDA_HOME/bin/cuobjdump" "$VENV"/lib/python3*/site-packages/triton/backends/nvidia/bin/cuobjdump 2>/dev/null | head -1 || true)
export CUOBJDUMP DEST FI_REBUILD=${FI_REBUILD:-0}
export PATH="$CUDA_HOME/bin:$VENV/bin:$PATH" CUDA_HOME
export FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=$FI_OFFLINE/ws
export PYTHONPATH=$DEST PYTHONUNBUFFERED=1
# FlashInfer reads its ahead-of-time folder from the shim when it is imported, so a first build
# (no shim yet) writes the shim first, in a process of its own
if [ ! -f "$DEST/flashinfer_jit_cache/__init__.py" ]; then
  "$VENV/bin/python" -c 'import sys; sys.path.insert(0, "kernels/peers"); import flashinfer_peer
flashinfer_peer.write_jit_cache_shim(sys.argv[1])' "$DEST/aot" || { echo "build_flashinfer_offline.sh: cannot write the shim"; exit 1; }
fi
"$VENV/bin/python" - <<'EOF'
import os, subprocess, sys, time
from unittest import mock
import torch

_empty = torch.empty
def _empty_unpinned(*a, **k):   # the wrappers pin a host buffer, which needs a GPU
    k.pop("pin_memory", None)
    return _empty(*a, **k)
torch.empty = _empty_unpinned
import flashinfer
import flashinfer.utils
from flashinfer.jit import env as jit_env
from flashinfer.jit.core import JitSpec, build_jit_specs

dest_aot = os.path.join(os.environ["DEST"], "aot")
assert os.path.abspath(str(jit_env.FLASHINFER_AOT_DIR)) == os.path.abspath(dest_aot), jit_env.FLASHINFER_AOT_DIR
flashinfer.utils.get_compute_capability = lambda device: (9, 0)   # an H100 / H200
asked = {}
real_build_and_load = JitSpec.build_and_load
def record(self):
    asked.setdefault(self.name, self)
    m = mock.MagicMock()
    m.plan.return_value = [0] * 16
    return m
JitSpec.build_and_load = record

# flashinfer_peer.py's calls (fa3_peer.py's shapes), bf16, page 16, NHD, CPU tensors
DT, PAGE = torch.bfloat16, 16
i32 = dict(dtype=torch.int32)
ws = torch.zeros(1 << 20, dtype=torch.uint8)
def layout(B, ppr):
    return torch.arange(B + 1, **i32) * ppr, torch.arange(B * ppr, **i32), torch.full((B,), PAGE, **i32)
def part(label, fn):
    n = len(asked)
    fn()
    print(f"# {label}: {list(asked)[n:] or 'no new module'}")
B, Hq, Hkv, S, D = 64, 32, 8, 8192, 128          # decode_b64_s8192_gqa32_8_hd128
for tc in (False, True):
    def decode():
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
        w.plan(*layout(B, S // PAGE), Hq, Hkv, D, PAGE, q_data_type=DT, kv_data_type=DT)
        w.run(torch.zeros(B, Hq, D, dtype=DT), (torch.zeros(4, PAGE, Hkv, D, dtype=DT),) * 2)
    part(f"decode use_tensor_cores={tc}", decode)
for hd, H in ((128, 16), (256, 8)):               # prefill_b2_s8192_causal_hd128 / hd256 (varlen: hd128, H 16)
    def prefill():
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        w.plan(torch.arange(3, **i32) * 8192, *layout(2, 8192 // PAGE), H, H, hd, PAGE, causal=True,
               q_data_type=DT, kv_data_type=DT)
        w.run(torch.zeros(2 * 8192, H, hd, dtype=DT), (torch.zeros(1024, PAGE, H, hd, dtype=DT),) * 2)
    part(f"prefill hd{hd} (backend auto)", prefill)
def cascade():                                    # cascade_b128_p<P>_s<S>: Hq 32, Hkv 8, hd 128, two levels
    B, pp, sp = 128, 64, 8
    w = flashinfer.MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
    w.plan([torch.tensor([0, B], **i32), torch.arange(B + 1, **i32)],
           [torch.tensor([0, pp], **i32), torch.arange(B + 1, **i32) * sp],
           [torch.arange(pp, **i32), torch.arange(B * sp, **i32)],
           [torch.tensor([PAGE], **i32), torch.full((B,), PAGE, **i32)],
           32, 8, 128, PAGE, causal=False, q_data_type=DT, kv_data_type=DT)
    w.run(torch.zeros(B, 32, 128, dtype=DT), (torch.zeros(pp + B * sp, PAGE, 8, 128, dtype=DT),) * 2)
part("cascade (two levels)", cascade)
JitSpec.build_and_load = real_build_and_load

rebuild = os.environ.get("FI_REBUILD") == "1"
todo = [s for s in asked.values() if rebuild or not s.aot_path.exists()]
for name, s in asked.items():
    print(f"# {'build' if s in todo else 'have '} {name}")
if todo:
    t = time.time()
    print(f"# compiling {len(todo)} modules, MAX_JOBS={os.environ.get('MAX_JOBS')}", flush=True)
    build_jit_specs(todo, verbose=True, skip_prebuilt=False)
    print(f"# compiled in {time.time() - t:.0f} s", flush=True)
sys.path.insert(0, os.path.join(os.getcwd(), "kernels", "peers"))
import flashinfer_peer   # the peer's own copy and shim, as a GPU run's --keep-modules makes them
flashinfer_peer.keep_modules(dest_aot)
bad = 0
for name, s in asked.items():
    elfs = "no cuobjdump"
    if os.environ.get("CUOBJDUMP"):
        out = subprocess.run([os.environ["CUOBJDUMP"], "--list-elf", str(s.aot_path)], capture_output=True, text=True).stdout
        elfs = sorted({l.rsplit(".", 2)[-2] for l in out.splitlines() if l.endswith(".cubin")})
        bad += elfs != ["sm_90a"]
    print(f"MODULE {name} bytes={s.aot_path.stat().st_size} elf={elfs}")
sys.exit(1 if bad else 0)
EOF
du -sh "$DEST"; du -sh "$(dirname "$DEST")"
