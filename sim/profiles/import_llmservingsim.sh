#!/usr/bin/env bash
# import_llmservingsim.sh - converts LLMServingSim's published per-layer profiles of vLLM 0.19
# running Llama-3.1-8B bf16 at TP 1 on the RTX 4090 and the RTX PRO 6000 (Blackwell Server Edition)
# into the step-time profile format (`attnreplay profile --from-llmservingsim`, sim/profile_import.c),
# the files `make fidelity-profiles` and `--step-time profile:DB` read:
#   sim/profiles/import_llmservingsim.sh LLMSERVINGSIM_GIT_DIR [OUT_DIR]   (default sim/profiles)
# LLMSERVINGSIM_GIT_DIR is a clone (or bare mirror) of github.com/casys-kaist/LLMServingSim holding
# commit 5daddb2 (the profiles used here; MIT licence, sim/profiles/LLMSERVINGSIM-LICENSE).  Run
# from the repository root with bin/attnreplay built (AR_BIN overrides).  Writes
# OUT_DIR/llama-3.1-8b.{rtx4090,rtxpro6000}.llmservingsim.profile.db (~0.45-0.5 MB each; format
# version 3: with each card's skew.csv and skew_fit.csv, LLMServingSim's attention lookup).
set -euo pipefail
src=${1:?usage: $0 LLMSERVINGSIM_GIT_DIR [OUT_DIR]}
out=$(cd "${2:-sim/profiles}" && pwd)
bin=$(cd "$(dirname "${AR_BIN:-bin/attnreplay}")" && pwd)/$(basename "${AR_BIN:-bin/attnreplay}")
commit=5daddb2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for pair in rtx4090:RTX4090 rtxpro6000:RTXPRO6000; do
  device=${pair%%:*} card=${pair##*:}
  bundle=profiler/perf/$card/meta-llama/Llama-3.1-8B/bf16
  git -C "$src" archive "$commit" "$bundle/meta.yaml" "$bundle/tp1" | tar -x -C "$tmp"
  # relative paths, so the command the database records names the bundle, not this machine
  (cd "$tmp" && "$bin" profile --from-llmservingsim "$bundle/tp1" --device "$device" --model llama-3.1-8b \
     --db "llama-3.1-8b.$device.llmservingsim.profile.db")
  mv "$tmp/llama-3.1-8b.$device.llmservingsim.profile.db" "$out/"
done
