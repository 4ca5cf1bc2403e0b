#!/usr/bin/env bash
# stage_sources.sh - packs the third-party sources that kernels/peers/build_peers.sh compiles on the
# GPU machine into compressed tarballs (default folder .peers/src, which git ignores: third-party
# source never enters the repository).  Only what the builds read is packed, at pinned commits:
#   fa3-hopper-0251105a.tar.gz   Dao-AILab/flash-attention  hopper/ without its tests and benchmarks
#   cutlass-7127592.tar.gz        NVIDIA/cutlass include/ at FA3's csrc/cutlass submodule commit
#   flashmla-9241ae3.tar.gz      deepseek-ai/FlashMLA  csrc/ (without sm100/), flash_mla/, setup.py
#   cutlass-147f567.tar.gz        NVIDIA/cutlass include/ and tools/util/include at FlashMLA's submodule
#
# Usage: stage_sources.sh FLASH_ATTENTION_GIT FLASHMLA_GIT CUTLASS_GIT [DEST]
# Each *_GIT is a local clone (bare or not) holding the pinned commit; nothing is fetched.  A
# partial clone (one without every blob) serves: git may print "invalid object" for files outside
# the packed paths (FA3's assets/, CUTLASS's media/), which are not read.  A tarball whose
# `git archive` failed is removed and the script exits 1.
set -eu -o pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 FLASH_ATTENTION_GIT FLASHMLA_GIT CUTLASS_GIT [DEST]" >&2
  exit 2
fi
FA=$1 ML=$2 CU=$3 DEST=${4:-.peers/src}
FA_REV=0251105a2fb19d2957484b7f023cd8c115286ced
ML_REV=9241ae3ef9bac614dd25e45e507e089f888280e0
CU_FA3=7127592069c2fe01b041e174ba4345ef9b279671
CU_MLA=147f5673d0c1c3dcf66f78d677fd647e4a020219
for pair in "$FA:$FA_REV" "$ML:$ML_REV" "$CU:$CU_FA3" "$CU:$CU_MLA"; do
  if ! git -C "${pair%%:*}" cat-file -e "${pair##*:}^{commit}" 2>/dev/null; then
    echo "$0: ${pair%%:*}: commit ${pair##*:} not found" >&2
    exit 2
  fi
done
# the pinned FA3 and FlashMLA commits must point their cutlass submodules at the commits packed here
[ "$(git -C "$FA" rev-parse "$FA_REV:csrc/cutlass")" = "$CU_FA3" ] || { echo "$0: FA3's cutlass submodule moved" >&2; exit 2; }
[ "$(git -C "$ML" rev-parse "$ML_REV:csrc/cutlass")" = "$CU_MLA" ] || { echo "$0: FlashMLA's cutlass submodule moved" >&2; exit 2; }
mkdir -p "$DEST"
pack() {   # pack REPO REV PREFIX OUT PATH...
  local repo=$1 rev=$2 prefix=$3 out=$4
  shift 4
  if ! git -C "$repo" archive --prefix="$prefix/" "$rev" "$@" | gzip -9 >"$DEST/$out.tmp"; then
    rm -f "$DEST/$out.tmp"
    echo "$0: git archive of $repo at $rev failed; $DEST/$out not written" >&2
    exit 1
  fi
  mv "$DEST/$out.tmp" "$DEST/$out"
}
fa_files=$(git -C "$FA" ls-tree -r --name-only "$FA_REV" hopper | grep -v -e '^hopper/test_' -e '^hopper/benchmark' -e '^hopper/padding.py')
ml_files=$(git -C "$ML" ls-tree -r --name-only "$ML_REV" | grep -e '^csrc/' -e '^flash_mla/' -e '^setup.py$' -e '^LICENSE$' \
  | grep -v -e '^csrc/sm100/' -e '^csrc/cutlass$')
# shellcheck disable=SC2086
pack "$FA" "$FA_REV" flash-attention fa3-hopper-${FA_REV:0:8}.tar.gz LICENSE $fa_files
pack "$CU" "$CU_FA3" cutlass-${CU_FA3:0:7} cutlass-${CU_FA3:0:7}.tar.gz include LICENSE.txt
# shellcheck disable=SC2086
pack "$ML" "$ML_REV" FlashMLA flashmla-${ML_REV:0:7}.tar.gz $ml_files
pack "$CU" "$CU_MLA" cutlass-${CU_MLA:0:7} cutlass-${CU_MLA:0:7}.tar.gz include tools/util/include LICENSE.txt
ls -l "$DEST"
