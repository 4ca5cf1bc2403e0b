#!/usr/bin/env bash
# build_peers.sh - builds the third-party peers that kernels/peers/ times beside our kernels,
# FlashAttention 3 (hopper/) and FlashMLA's sm90 dense decode, on the GPU machine (offline: no
# network, no git), from the source tarballs staged in .peers/src (kernels/peers/README.md says
# which), and packs the result for the later runs that carry it.
#
# The two builds run side by side, each under `timeout -s KILL`, with nproc - 3 and 3 parallel
# compiles (kernels/peers/build_peers.py writes the ninja files: the upstream setup.py files call
# git and, for FA3 on CUDA < 13, download a toolchain); FlashInfer's kernels compile beside them
# when its wheels are carried in .whl.  Written to $OUT:
#   build_env.txt            compiler, torch and machine versions
#   build_fa3.log            the FA3 build (per-file compile seconds, registers, the import check)
#   build_flashmla.log       the FlashMLA build
#   build_flashinfer.log     FlashInfer's kernels compiled for our shapes (when .whl has its wheels)
#   peers-built.tar.xz       .peers/built (fa3/, flashmla/), or peers-built.tar.xz.partNN pieces
#                            of 15 MiB when larger; rejoin them in the repository root with
#                            `mkdir -p .peers && cat FILES/peers-built.tar.xz* | tar -xJf - -C .peers`
# The built tree also stays in .peers/built on the machine, for the harness in the same run.
# Environment: PEERS_SRC, PEERS_DEST, PEERS_WORK (compile folder, kept between runs on the same
# machine: a second run only recompiles what is missing), FA3_TIMEOUT / MLA_TIMEOUT (s, default 500),
# FA3_JOBS / MLA_JOBS, PEERS_FLASHINFER=0 (skip FlashInfer), FI_JOBS (4, or every core when FA3 and
# FlashMLA came along built), FI_TIMEOUT (s, 530), PEERS_REBUILD=1 (rebuild FA3 and FlashMLA even
# where $DEST already holds them).
# A peer whose build came along in $DEST (carried from an earlier run) is not rebuilt, and
# FlashInfer loads the modules $DEST/flashinfer already holds, so a run with .peers/built carried
# spends its time on what is missing (FlashInfer's modules for the shapes a cut build left out).
# Exit status 0 when FA3 and FlashMLA built (or came along built) and imported, 1 otherwise.
set -u
OUT=${OUT:-/tmp/ar_peers_out}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
SRC=${PEERS_SRC:-.peers/src}
DEST=${PEERS_DEST:-.peers/built}
WORK=${PEERS_WORK:-/tmp/ar_peers_build}
CORES=$(nproc 2>/dev/null || echo 16)
MLA_JOBS=${MLA_JOBS:-3}
FA3_JOBS=${FA3_JOBS:-$(( CORES > MLA_JOBS + 1 ? CORES - MLA_JOBS : 1 ))}
FA3_TIMEOUT=${FA3_TIMEOUT:-500}
MLA_TIMEOUT=${MLA_TIMEOUT:-500}
FI_TIMEOUT=${FI_TIMEOUT:-530}
# built PEER: its module is in $DEST already (and PEERS_REBUILD is not 1)
built() {
  [ "${PEERS_REBUILD:-0}" = 1 ] && return 1
  case $1 in
    fa3) ls "$DEST"/fa3/flash_attn_3/_C*.so ;;
    flashmla) ls "$DEST"/flashmla/flash_mla/*.so ;;
  esac >/dev/null 2>&1
}
if built fa3 && built flashmla; then FI_JOBS=${FI_JOBS:-$CORES}; else FI_JOBS=${FI_JOBS:-4}; fi
export PYTHONUNBUFFERED=1

{
  echo "date: $(date -u)"; echo "cores: $CORES"; free -g | head -2
  command -v nvcc && nvcc --version | tail -2
  c++ --version | head -1; echo "ninja $(ninja --version 2>&1)"
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  ls -l "$SRC"
} >"$OUT/build_env.txt" 2>&1
cat "$OUT/build_env.txt"
missing=""
need=""
built fa3 || need="fa3-hopper cutlass-7127592"
built flashmla || need="$need flashmla cutlass-147f567"
for t in $need; do
  ls "$SRC"/$t*.tar.* >/dev/null 2>&1 || missing="$missing $t"
done
if [ -n "$missing" ]; then
  echo "build_peers.sh: $SRC lacks the source tarballs:$missing (stage them and carry .peers)"
  exit 1
fi

# FlashInfer (when its wheels are in .whl) compiles its kernels when a wrapper is planned:
# flashinfer_peer.py --plan-only does that for every benchmark shape, beside the two builds (the
# cores FA3 leaves idle while its last files finish), and keeps the compiled modules in
# $DEST/flashinfer, which later runs load instead of compiling.
pid_fi=""
fi_whl=$(ls .whl/flashinfer_python-*.whl 2>/dev/null | head -1)
if [ "${PEERS_FLASHINFER:-1}" != 0 ] && [ -n "$fi_whl" ]; then
  echo "== FlashInfer: installing .whl, compiling its modules ($FI_JOBS jobs, ${FI_TIMEOUT}s)"
  ( fi_path=$(bash kernels/peers/install_flashinfer.sh "$DEST/flashinfer") &&
    MAX_JOBS=$FI_JOBS PYTHONPATH=$fi_path timeout -s KILL "$FI_TIMEOUT" \
      python3 kernels/peers/flashinfer_peer.py --plan-only --keep-modules "$DEST/flashinfer/aot" ) >"$OUT/build_flashinfer.log" 2>&1 &
  pid_fi=$!
else
  echo "FlashInfer: ${fi_whl:+skipped (PEERS_FLASHINFER=0)}${fi_whl:-no .whl/flashinfer_python-*.whl carried: not built}"
fi
echo "== building FA3 ($FA3_JOBS jobs, ${FA3_TIMEOUT}s) and FlashMLA ($MLA_JOBS jobs, ${MLA_TIMEOUT}s) at $(date -u +%H:%M:%S)"
# a carried build: its BUILD.txt and a result line instead of a compile
carried() {
  { echo "carried in $DEST/$1 (PEERS_REBUILD=1 rebuilds it):"; cat "$DEST/$1/BUILD.txt" 2>/dev/null
    echo "BUILD peer=$1 status=carried"; } >"$OUT/build_$1.log"
}
rc_fa3=0 rc_mla=0 pid_fa3="" pid_mla=""
if built fa3; then carried fa3; else
  timeout -s KILL "$FA3_TIMEOUT" python3 kernels/peers/build_peers.py fa3 --jobs "$FA3_JOBS" \
    --deadline $(( FA3_TIMEOUT - 70 )) --src "$SRC" --work "$WORK" --dest "$DEST" >"$OUT/build_fa3.log" 2>&1 &
  pid_fa3=$!
fi
if built flashmla; then carried flashmla; else
  timeout -s KILL "$MLA_TIMEOUT" python3 kernels/peers/build_peers.py flashmla --jobs "$MLA_JOBS" \
    --deadline $(( MLA_TIMEOUT - 70 )) --src "$SRC" --work "$WORK" --dest "$DEST" >"$OUT/build_flashmla.log" 2>&1 &
  pid_mla=$!
fi
[ -n "$pid_fa3" ] && { wait "$pid_fa3"; rc_fa3=$?; }
[ -n "$pid_mla" ] && { wait "$pid_mla"; rc_mla=$?; }
# a builder killed by its timeout leaves its ninja process group (id in ninja.pgid): end it
for f in "$WORK"/fa3/ninja.pgid "$WORK"/flashmla/ninja.pgid; do
  [ -f "$f" ] && kill -KILL -- "-$(cat "$f")" 2>/dev/null && echo "ended the compile group of $f"
  rm -f "$f"
done
echo "== done at $(date -u +%H:%M:%S): fa3 rc=$rc_fa3 flashmla rc=$rc_mla (137: killed by the timeout)"
rc_fi=0
if [ -n "$pid_fi" ]; then
  wait "$pid_fi"; rc_fi=$?
  echo "flashinfer rc=$rc_fi (137: killed by the timeout; the modules compiled before stay)"
  grep -E "^# |^PEER|Error" "$OUT/build_flashinfer.log" | cut -c1-200 | tail -14
fi
for peer in fa3 flashmla; do
  log="$OUT/build_$peer.log"
  grep -E "FAILED|error:|fatal|import (check|failed)|deadline|not linked" "$log" | head -12
  grep -E "^\[build_peers.*\] +[0-9.]+ s " "$log" | head -4
  grep -E "^BUILD " "$log" || echo "BUILD peer=$peer status=failed (no result line: see $log)"
done

if [ -d "$DEST" ] && [ -n "$(ls -A "$DEST" 2>/dev/null)" ]; then
  XZ_OPT=-T0 tar -C "$(dirname "$DEST")" -cJf "$OUT/peers-built.tar.xz" "$(basename "$DEST")"
  size=$(stat -c %s "$OUT/peers-built.tar.xz")
  if [ "$size" -gt $(( 15 * 1024 * 1024 )) ]; then
    split -b 15M -d "$OUT/peers-built.tar.xz" "$OUT/peers-built.tar.xz.part"
    rm -f "$OUT/peers-built.tar.xz"
  fi
  ls -l "$OUT"/peers-built.tar.xz*
  echo "rejoin in the repository root: mkdir -p .peers && cat FILES/peers-built.tar.xz* | tar -xJf - -C .peers"
fi
[ "$rc_fa3" -eq 0 ] && [ "$rc_mla" -eq 0 ]
