#!/usr/bin/env bash
# make_venv.sh - creates the pinned vLLM 0.33.0 virtual environment the recorder tests and the
# parity tests run in, unless it exists already, and prints its path on the last line.
#
# Where: $ATTNREPLAY_VLLM_VENV, else ${XDG_CACHE_HOME:-~/.cache}/attnreplay/vllm-0.33.0-venv,
# outside the clone, so only the first run pays.  What: requirements-vllm.txt beside this
# script, installed with --no-deps (exact versions, no resolver).  It is built in DIR.tmp and
# renamed when complete, so an interrupted build never leaves a half environment behind.
# Needs a Python 3.11-3.14 and PyPI.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${ATTNREPLAY_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/attnreplay/vllm-0.33.0-venv}
reqs="$here/requirements-vllm.txt"
stamp="$venv/.attnreplay-complete"

if [ -f "$stamp" ] && cmp -s "$stamp" "$reqs" && [ -x "$venv/bin/python" ]; then
    echo "$venv"
    exit 0
fi

find_python() {
    for cand in python3.12 python3.11 python3.13 python3.14 python3; do
        p=$(command -v "$cand" 2>/dev/null) || continue
        if "$p" -c 'import sys, venv, ensurepip; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 15) else 1)' 2>/dev/null; then
            echo "$p"
            return
        fi
    done
}
py=$(find_python)
if [ -z "$py" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "make_venv.sh: installing python3-venv" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv) >/dev/null || true
    py=$(find_python)
fi
if [ -z "$py" ]; then
    echo "make_venv.sh: vLLM 0.33.0 needs Python 3.11-3.14 with the venv module; none found (apt-get install python3-venv)" >&2
    exit 2
fi

echo "make_venv.sh: building $venv with $("$py" --version) (once; about 5 GB, several minutes)" >&2
start=$(date +%s)
rm -rf "$venv.tmp"
mkdir -p "$(dirname "$venv")"
"$py" -m venv "$venv.tmp"
"$venv.tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$reqs" >&2
"$venv.tmp/bin/python" -c 'import vllm.v1.core.sched.scheduler' >/dev/null 2>&1 || {
    echo "make_venv.sh: vLLM's scheduler does not import in $venv.tmp" >&2
    exit 1
}
rm -rf "$venv"
mv "$venv.tmp" "$venv"
cp "$reqs" "$stamp"
echo "make_venv.sh: built in $(( $(date +%s) - start )) s, $(du -sh "$venv" | cut -f1)" >&2
echo "$venv"
