#!/usr/bin/env bash
# The GPU acceptance run in one call, for a GPU machine that has a copy of this working tree
# but no primforge installed (and no package index). Writes report.json, report.md and
# logs/ into $OUT (or the folder given as the first argument) and prints a summary last.
#
# Usage: tools/gpu_day_one.sh [OUT_DIR] [further options of python -m tools.gpu_acceptance]
#   PYTHON   interpreter to use (default python3)
#   TOTAL    seconds for the whole run (default 470, just under 8 minutes)
# Wheels in wheels/ (pure-Python packages the machine lacks, e.g. pytest-xdist or
# hypothesis) are put on the path first; see docs/gpu.md.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$root/gpu-report}"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then  # a first argument that is not an option
  out="$1"
  shift
fi
python="${PYTHON:-python3}"
path="$root"
for whl in "$root"/wheels/*.whl; do
  [ -e "$whl" ] && path="$path:$whl"
done
export PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out"
cd "$root"
# If primforge cannot even be imported here (a JAX it does not know), say so in the folder
# that comes back instead of failing without a trace.
if ! "$python" -c "import primforge" > "$out/import_error.txt" 2>&1; then
  echo "primforge does not import on this machine ($python):"
  tail -n 30 "$out/import_error.txt"
  exit 0
fi
rm -f "$out/import_error.txt"
exec "$python" -m tools.gpu_acceptance --out "$out" --total "${TOTAL:-470}" "$@"
