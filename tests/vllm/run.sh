#!/usr/bin/env bash
# run.sh - `make test-vllm`: creates the pinned vLLM 0.33.0 environment when it is absent
# (traces/vllm_recorder/make_venv.sh, cached outside the clone), then runs tests/vllm/test_*.py
# in it (the recorder on vLLM's real scheduler, and parity of `attnreplay sim` with it), then
# measures the recorder's overhead per step, and closes with "N passed, N failed, N skipped".
# Needs AR_BIN (the attnreplay binary) and AR_SRC (the repository).
set -euo pipefail
src=${AR_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
venv=$("$src/traces/vllm_recorder/make_venv.sh" | tail -n 1)
export AR_SRC="$src" AR_BIN=${AR_BIN:-$src/bin/attnreplay}
export PYTHONPATH="$src/traces:$src/tests/vllm${PYTHONPATH:+:$PYTHONPATH}"
# vLLM's own logging to warnings only; no usage reporting; no __pycache__ in the clone
export VLLM_LOGGING_LEVEL=WARNING VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
cd "$src"
"$venv/bin/python" "$src/tests/vllm/run_tests.py" "$@"
