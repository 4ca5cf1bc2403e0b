#!/usr/bin/env bash
# make_profiles.sh - measures the H200 step-time profiles of llama-3.1-8b and qwen3-32b that
# `--step-time profile:DB` reads (sim/profile.c), on the GPU machine, from the repository root
# with bin/attnreplay built by `make`:
#   sim/profiles/make_profiles.sh [OUT_DIR]      (default sim/profiles)
# For each model: a short simulated shared-prefix trace (for the replayed-step check: its first
# 200 steps are replayed on the cuda backend and compared with the profile's interpolation),
# then `attnreplay profile --device h200`.  Writes OUT_DIR/MODEL.h200.profile.db (~50 KB each)
# and prints what was measured.
set -euo pipefail
out=${1:-sim/profiles}
bin=${AR_BIN:-bin/attnreplay}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
for model in llama-3.1-8b qwen3-32b; do
  trace="$tmp/$model.trace.jsonl"
  "$bin" sim --workload synthetic:groups=4,prompts=32,system=1024,question=256,output=64,rate=40 \
    --model "$model" --num-blocks 32768 --max-num-batched-tokens 8192 --max-num-seqs 256 \
    --step-time roofline:h200 --out "$trace" --quiet
  "$bin" profile --device h200 --model "$model" --db "$out/$model.h200.profile.db" \
    --trace "$trace" --trace-steps 200 --repeat 20
done
