#!/usr/bin/env bash
# native_peers.sh - times the compiled peers (FlashAttention 3, FlashMLA, FlashInfer) on the GPU
# machine and appends their PEER lines to $OUT/peers.txt; then prints the target table
# (peer_table.py) from $OUT/bench.txt, cascade_bench.txt, mla_bench.txt (when there) and peers.txt.
# Used by kernels/device_harness.sh (peers stage) and kernels/peers/run_peers.sh.
#
# Each peer runs when its build is in .peers/built (kernels/peers/build_peers.sh; carried in or
# built on this machine) and otherwise gets one line saying it is missing and why.  FlashInfer
# also needs its wheels in .whl; it runs with FLASHINFER_DISABLE_JIT=1, so a kernel that was not
# compiled by build_peers.sh is an error line, not minutes of compiling.  Timeouts (s): FA3_RUN
# (240), MLA_RUN (150), FI_RUN (150), each cut to what is left before PEERS_DEADLINE (unix seconds)
# when that is set.  Writes no file to $OUT besides appending to peers.txt.
set -u
OUT=${OUT:-/tmp/ar_peers_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export AR_PEERS_BUILT=${AR_PEERS_BUILT:-$PWD/.peers/built} PYTHONUNBUFFERED=1
native=$(mktemp /tmp/ar_native_peers.XXXXXX)
limit() {   # limit SECONDS: SECONDS, or less when PEERS_DEADLINE comes sooner (at least 10)
  local left=$(( ${PEERS_DEADLINE:-0} - $(date +%s) - 15 ))
  if [ "${PEERS_DEADLINE:-0}" -gt 0 ] && [ "$left" -lt "$1" ]; then echo $(( left > 10 ? left : 10 )); else echo "$1"; fi
}
for peer in fa3 flashmla; do
  if [ -f "$AR_PEERS_BUILT/$peer/BUILD.txt" ]; then
    echo "peer $peer: $(head -2 "$AR_PEERS_BUILT/$peer/BUILD.txt" | tr '\n' ' ')"
  else
    echo "peer $peer: MISSING ($AR_PEERS_BUILT/$peer not there: run kernels/peers/build_peers.sh, carry .peers)"
  fi
done
timeout "$(limit "${FA3_RUN:-240}")" python3 kernels/peers/fa3_peer.py >>"$native" 2>>"$OUT/peers_err.txt"
echo "fa3_peer rc=$?"
timeout "$(limit "${MLA_RUN:-150}")" python3 kernels/peers/flashmla_peer.py >>"$native" 2>>"$OUT/peers_err.txt"
echo "flashmla_peer rc=$?"
if [ ! -d "$AR_PEERS_BUILT/flashinfer/flashinfer_jit_cache" ]; then
  echo "peer flashinfer: MISSING (no compiled modules in $AR_PEERS_BUILT/flashinfer: build_peers.sh compiles them when .whl has FlashInfer's wheels)"
elif ! ls .whl/flashinfer_python-*.whl >/dev/null 2>&1; then
  echo "peer flashinfer: MISSING (.whl/flashinfer_python-*.whl not carried)"
elif ! fi_path=$(bash kernels/peers/install_flashinfer.sh "$AR_PEERS_BUILT/flashinfer" 2>>"$OUT/peers_err.txt"); then
  echo "peer flashinfer: MISSING (installing .whl failed: see peers_err.txt)"
else
  PYTHONPATH=$fi_path FLASHINFER_DISABLE_JIT=1 \
    timeout "$(limit "${FI_RUN:-150}")" python3 kernels/peers/flashinfer_peer.py >>"$native" 2>>"$OUT/peers_err.txt"
  echo "flashinfer_peer rc=$?"
fi
cut -c1-170 "$native"
grep "^PEER" "$native" >>"$OUT/peers.txt"
rm -f "$native"
if [ -f "$OUT/bench.txt" ]; then
  mla=()
  [ -f "$OUT/mla_bench.txt" ] && mla=(--mla "$OUT/mla_bench.txt")
  casc=()
  [ -f "$OUT/cascade_bench.txt" ] && casc=(--cascade "$OUT/cascade_bench.txt")
  python3 kernels/peers/peer_table.py --bench "$OUT/bench.txt" ${casc[@]+"${casc[@]}"} ${mla[@]+"${mla[@]}"} \
    --peers "$OUT/peers.txt" |
    sed 's/^/# /' | tee -a "$OUT/peers.txt"
fi
