#!/usr/bin/env bash
# gpu_carry_check.sh - `make gpu-carry` builds everything its archive packs before packing it.
# A prerequisite list written above the variables it names expands to nothing (make expands a
# rule's prerequisites where it reads the rule), and the archive then silently lacked
# libattnreplay.so, which the Python adapters on the GPU machine load. This reads make's own
# database (`make -pnq`, nothing is built) and asserts that the rule's prerequisites name the
# shared library, the libraries carried beside it and the example plugins. Run by `make test`;
# where the development headers are missing the rule does not exist and the check says so.
set -u
cd "$(dirname "$0")/.."
db=$(make -pnq --no-print-directory gpu-carry 2>/dev/null)
rule=$(printf '%s\n' "$db" | grep -m1 '^gpu-carry:')
if [ -z "$rule" ]; then
    echo "gpu_carry_check: skipped (no gpu-carry rule: the development headers are missing, make deps installs them)"
    exit 0
fi
var() { printf '%s\n' "$db" | sed -n "s/^$1 := //p" | head -1; }
need="$(var SHLIB) $(var SHLIB_CARRY) $(var PLUGINS)"
missing=
for f in $need; do
    case " ${rule#gpu-carry:} " in *" $f "*) ;; *) missing="$missing $f" ;; esac
done
[ -n "$(var SHLIB)" ] || missing="$missing (SHLIB itself: not found in make's database)"
if [ -n "$missing" ]; then
    echo "gpu_carry_check: FAILED: make gpu-carry packs but does not build:$missing"
    exit 1
fi
echo "gpu_carry_check: passed (gpu-carry builds $(echo $need | wc -w) libraries and plugins before packing them)"
