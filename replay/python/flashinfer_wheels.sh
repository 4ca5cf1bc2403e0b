#!/usr/bin/env bash
# flashinfer_wheels.sh - the FlashInfer wheels a GPU machine without network lacks, trimmed so they
# travel with the working tree (at most 64 MiB in all).
#
#   replay/python/flashinfer_wheels.sh [DIR]      (default .whl; run it where pip reaches PyPI)
#
# flashinfer-python is one pure-Python wheel (~100 MB compressed, ~700 MB unpacked) that
# JIT-compiles its kernels with nvcc and ninja on first use.  Most of its size is CUDA sources
# of kernels the attention adapter never builds (MoE, GDN/KDA, the "cake" backends, the
# experimental tree's data); this keeps the Python modules (flashinfer/__init__ imports them all)
# and drops those sources only.  Dependencies fetched beside it: apache-tvm-ffi (the JIT's
# loader), cuda-tile, nccl4py and nvidia-cudnn-frontend (imported by flashinfer's modules).
# Not fetched: nvidia-cutlass-dsl (CuTe-DSL kernels, hundreds of MB) and nccl-extensions (23 MB):
# if `import flashinfer` needs them there, the adapter's check says so and the run is skipped.
# The versions are pinned to the ones this was prepared with (Python 3.12, torch 2.11, CUDA 13).
set -euo pipefail
OUT=${1:-.whl}
mkdir -p "$OUT"
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$tmp" flashinfer-python==0.7.4 apache-tvm-ffi==0.1.15.post2 cuda-tile==1.7.0 nccl4py==0.6.0 \
  nvidia-cudnn-frontend==1.32.0
python3 - "$tmp" "$OUT" <<'EOF'
import os, re, shutil, sys, zipfile
src, out = sys.argv[1], sys.argv[2]
drop = re.compile(r"^flashinfer/(data/csrc/(cake_|kda|fused_moe|gdn|blackwell_|moe)|cake_[^/]+/csrc/|"
                  r"moe_ep/kernel_src/|fused_moe/backends/|experimental/[^/]+/.*\.(cu|cuh|cpp|h|hpp)$)")
for name in sorted(os.listdir(src)):
    path = os.path.join(src, name)
    if not name.startswith("flashinfer_python"):
        shutil.copy(path, os.path.join(out, name))
        continue
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(os.path.join(out, name), "w", zipfile.ZIP_DEFLATED) as zout:
        kept = dropped = 0
        for item in zin.infolist():
            if drop.match(item.filename):
                dropped += item.file_size
                continue
            zout.writestr(item, zin.read(item.filename))
            kept += item.file_size
    print("flashinfer-python: kept %.0f MB, dropped %.0f MB of unused kernel sources" % (kept / 1e6, dropped / 1e6))
total = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
print("%s: %.1f MiB in %d wheels (the carry limit is 64 MiB with the working tree)" % (out, total / 2**20, len(os.listdir(out))))
EOF
rm -rf "$tmp"
