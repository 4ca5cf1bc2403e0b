#!/usr/bin/env bash
# ab.sh - A/B of kernel builds in one run on the GPU machine: our benchmarks built from several git
# revisions (or the working tree), run one after another in alternating rounds, and the table of
# each build's medians and ratios to the first (kernels/peers/ab_table.py).  A change to a kernel
# counts only against the kernel before it measured in the same run (BENCHMARKS.md, "Same run").
#
# On the development machine, after `make gpu-build`:
#   kernels/peers/ab.sh build [NAME=]REV ...   REV: a git revision, or "." for the working tree
#                                              as built (build/tests as it is)
# brings this tree's two benchmarks up to date, then builds them for each revision in a scratch
# worktree whose build folder starts as a copy of this one, every output marked newer than the
# sources and only the files that differ from the working tree marked changed, so make recompiles
# just what the revisions change (a paged kernel header: the translation units including it, 3
# minutes on two cores; a revision with the tree's sources: 8 s).
# The binaries go to build/ab/NAME/ (NAME defaults to the short hash; "." is "tree") and all of them
# into build/ab.tar.xz (about 4 MB a build), which a GPU run carries.
#
# On the GPU machine (carry build/ab.tar.xz and build/tests/libcmocka.so.0, or build/ab):
#   kernels/peers/ab.sh run [ROUNDS [REPEAT]] [CASE ...]
# runs, for each round, each build in the order given at build time, each CASE: a bench_cuda case
# name (tests/bench_cuda.c lists them), "cascade" (bench_cascade without its plan sweeps), or
# "mla128" / "mla16" (bench_mla --only at 128 / 16 heads, 4k-32k keys: FlashMLA's shapes; its
# repeat count is its own, 20, whatever REPEAT says).
# Default: 2 rounds of bench_cuda 10 on the causal hd 128 / hd 256, varlen and chunked-prefill
# cases, and cascade.  Writes $OUT/ab.txt (the raw lines, "AB variant=NAME RESULT ...") and
# prints the table.  Each benchmark runs under `timeout -s KILL` (AB_CASE_TIMEOUT, default 60 s).
# Exit status: ab_table.py's (0 table, 1 no result: no GPU, or every case failed).
set -u
cd "$(dirname "$0")/../.." || exit 2
cmd=${1:-}
shift || true
AB=build/ab
case "$cmd" in
build)
  [ $# -gt 0 ] || { echo "usage: $0 build [NAME=]REV ..." >&2; exit 2; }
  [ -x build/tests/bench_cuda ] || { echo "$0: build/tests/bench_cuda missing: run make gpu-build first" >&2; exit 2; }
  names=()
  for spec in "$@"; do                  # every argument checked before anything is built
    rev=${spec#*=}
    name=${spec%%=*}
    if [ "$name" = "$spec" ]; then
      if [ "$rev" = . ]; then name=tree; else name=$(git rev-parse --short "$rev" 2>/dev/null); fi
    fi
    case "$name" in ''|*[!A-Za-z0-9._-]*) echo "$0: $spec: not a revision, or a name other than [A-Za-z0-9._-]" >&2; exit 2 ;; esac
    [ "$rev" = . ] || git rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "$0: $rev: no such revision" >&2; exit 2; }
    case " ${names[*]} " in *" $name "*) echo "$0: $name: named twice" >&2; exit 2 ;; esac
    names+=("$name")
  done
  # the build folder must match the working tree first: the revisions' builds start from it
  make -s build/tests/bench_cuda build/tests/bench_cascade build/tests/bench_mla || exit 1
  rm -rf "$AB" "$AB.tar.xz"
  mkdir -p "$AB"
  : >"$AB/ORDER"
  for spec in "$@"; do
    rev=${spec#*=}
    name=${names[0]}
    names=("${names[@]:1}")
    mkdir -p "$AB/$name"
    if [ "$rev" = . ]; then
      cp build/tests/bench_cuda build/tests/bench_cascade build/tests/bench_mla "$AB/$name/"
      echo "the working tree of $(git rev-parse --short HEAD) as built" >"$AB/$name/REV.txt"
    else
      wt=$(mktemp -d /tmp/ar_ab.XXXXXX)
      git worktree add -q --detach "$wt" "$rev" || exit 2
      trap 'git worktree remove --force "$wt"' EXIT   # also when the build fails or is interrupted
      tar --exclude=build/ab --exclude=build/mutants -cf - build | tar -C "$wt" -xf -
      # the checkout's sources older than every output, the files that differ from this tree newer
      find "$wt" -path "$wt/build" -prune -o -type f -exec touch -d '2 minutes ago' {} +
      find "$wt/build" -type f -exec touch -d '1 minute ago' {} +
      differ=$(git diff --name-only "$rev" -- .)
      for f in $differ; do [ -f "$wt/$f" ] && touch "$wt/$f"; done
      echo "== $name ($rev): $(echo "$differ" | grep -c .) files differ from the tree"
      if ! make -C "$wt" -s build/tests/bench_cuda build/tests/bench_cascade build/tests/bench_mla >"$AB/$name/build.log" 2>&1; then
        tail -20 "$AB/$name/build.log" >&2
        echo "$0: $name: build failed (log: $AB/$name/build.log)" >&2
        exit 1
      fi
      cp "$wt/build/tests/bench_cuda" "$wt/build/tests/bench_cascade" "$wt/build/tests/bench_mla" "$AB/$name/"
      git rev-parse "$rev" >"$AB/$name/REV.txt"
      git worktree remove --force "$wt"
      trap - EXIT
    fi
    echo "$name" >>"$AB/ORDER"
  done
  tar -C build -cf - ab | xz -T0 --lzma2=preset=1,dict=256MiB >"$AB.tar.xz"
  ls -l "$AB.tar.xz"
  echo "carry build/ab.tar.xz and build/tests/libcmocka.so.0; on the GPU machine: kernels/peers/ab.sh run"
  ;;
run)
  OUT=${OUT:-/tmp/ar_ab_out}
  mkdir -p "$OUT"
  [ -d "$AB" ] || { [ -f "$AB.tar.xz" ] && xz -dc "$AB.tar.xz" | tar -C build -xf -; }
  [ -f "$AB/ORDER" ] || { echo "$0: no $AB/ORDER (kernels/peers/ab.sh build makes it)" >&2; exit 2; }
  rounds=2 repeat=10
  case "${1:-}" in ''|*[!0-9]*) ;; *) rounds=$1; shift ;; esac
  case "${1:-}" in ''|*[!0-9]*) ;; *) repeat=$1; shift ;; esac
  cases=("$@")
  [ ${#cases[@]} -gt 0 ] || cases=(prefill_b2_s8192_causal_hd128 prefill_b2_s8192_causal_hd256 varlen16_causal_hd128
                                  chunk_q8192_ctx98304_gqa32_8_hd128 cascade)
  limit=${AB_CASE_TIMEOUT:-60}
  : >"$OUT/ab.txt"
  for r in $(seq "$rounds"); do
    echo "== round $r ($(date -u +%H:%M:%S))" | tee -a "$OUT/ab.txt"
    while read -r v; do
      # the build's binaries beside build/tests/libcmocka.so.0 (their rpath is $ORIGIN)
      # (a build without bench_mla leaves none: the previous build's must not stand in for it)
      rm -f build/tests/bench_mla_ab
      cp "$AB/$v/bench_cuda" build/tests/bench_cuda_ab && cp "$AB/$v/bench_cascade" build/tests/bench_cascade_ab &&
        { [ ! -f "$AB/$v/bench_mla" ] || cp "$AB/$v/bench_mla" build/tests/bench_mla_ab; }
      for c in "${cases[@]}"; do
        if [ "$c" = cascade ]; then
          AR_CASC_SWEEPS=0 timeout -s KILL "$limit" build/tests/bench_cascade_ab "$repeat" >"$OUT/last.txt" 2>&1
        elif [ "$c" = mla128 ] || [ "$c" = mla16 ]; then
          : >"$OUT/last.txt"
          for sk in 4096 8192 16384 32768; do
            timeout -s KILL "$limit" build/tests/bench_mla_ab --only "${c#mla}" "$sk" >>"$OUT/last.txt" 2>&1
          done
        else
          timeout -s KILL "$limit" build/tests/bench_cuda_ab "$repeat" "$c" >"$OUT/last.txt" 2>&1
        fi
        rc=$?
        grep "^RESULT" "$OUT/last.txt" | sed "s/^/AB variant=$v /" >>"$OUT/ab.txt"
        grep -q "^RESULT" "$OUT/last.txt" || echo "$v $c: no result (rc $rc): $(head -c 300 "$OUT/last.txt")"
      done
    done <"$AB/ORDER"
  done
  rm -f build/tests/bench_cuda_ab build/tests/bench_cascade_ab build/tests/bench_mla_ab "$OUT/last.txt"
  python3 kernels/peers/ab_table.py "$OUT/ab.txt"
  ;;
*)
  echo "usage: $0 build [NAME=]REV ... | run [ROUNDS [REPEAT]] [CASE ...]" >&2
  exit 2
  ;;
esac
