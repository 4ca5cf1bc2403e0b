#!/usr/bin/env bash
# install_flashinfer.sh - installs FlashInfer's carried wheels (.whl/*.whl: flashinfer-python and
# apache-tvm-ffi, kernels/peers/README.md has the pip download command) into /tmp/ar_site, where
# the peer scripts put it on PYTHONPATH; offline (no index, no dependencies).  Run from the
# repository root; pip's messages go to stderr.  Exit 0 when installed, 1 when no
# flashinfer_python wheel was carried, pip's status when it failed.  Used by build_peers.sh,
# native_peers.sh and device_harness.sh.
set -u
ls .whl/flashinfer_python-*.whl >/dev/null 2>&1 || exit 1
exec python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ar_site .whl/*.whl
