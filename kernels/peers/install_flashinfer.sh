#!/usr/bin/env bash
# install_flashinfer.sh - installs FlashInfer's carried wheels (.whl/*.whl: flashinfer-python and
# apache-tvm-ffi, kernels/peers/README.md has the pip download command) into /tmp/ar_site, offline
# (no index, no dependencies), and prints on stdout the PYTHONPATH that imports them: MODULES (the
# folder of modules compiled ahead of time with their flashinfer_jit_cache shim, when given),
# /tmp/ar_site, then the caller's PYTHONPATH.  The one place that knows where the wheels go:
#
#   PYTHONPATH=$(bash kernels/peers/install_flashinfer.sh [MODULES]) python3 ...
#
# Run from the repository root; pip's messages go to stderr.  Exit 0 when installed, 1 when no
# flashinfer_python wheel was carried, pip's status when it failed (nothing printed then).  Used by
# build_peers.sh, native_peers.sh, device_harness.sh and replay/python/side_by_side.sh.
set -u
site=/tmp/ar_site
ls .whl/flashinfer_python-*.whl >/dev/null 2>&1 || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl >&2 || exit
echo "${1:+$1:}$site${PYTHONPATH:+:$PYTHONPATH}"
