#!/usr/bin/env bash
# Build the wheel of the tracked files of the working tree into a temporary folder and
# check that it holds only the library: no test runner and no release tooling (see
# tools/wheel_contents.py for what is checked; it prints the list and names any file found).
# With --install, also install the wheel into a fresh virtual environment (outside the
# source tree, so the installed package is the one imported) and run the quickstart and the
# command; that needs the network or a pip cache for jax, numpy and numba.
# The source tree is left untouched.
#
# Usage: tools/check_wheel.sh [--install] [PYTHON]      (PYTHON defaults to python3)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
install=0
if [ "${1:-}" = "--install" ]; then
  install=1
  shift
fi
python="${1:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

mkdir "$work/src" "$work/dist"
(cd "$root" && git ls-files -z | while IFS= read -r -d '' f; do
  [ -f "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf -) | tar -x -C "$work/src"
if "$python" -c "import build" 2> /dev/null; then
  "$python" -m build --wheel --no-isolation --outdir "$work/dist" "$work/src" > "$work/build.log" 2>&1 \
    || { tail -n 40 "$work/build.log"; exit 1; }
else
  "$python" -m pip wheel --no-deps --no-build-isolation -w "$work/dist" "$work/src" \
    > "$work/build.log" 2>&1 || { tail -n 40 "$work/build.log"; exit 1; }
fi
wheel="$(ls "$work"/dist/primforge-*.whl)"
"$python" "$root/tools/wheel_contents.py" "$wheel"
[ "$install" = 1 ] || exit 0

"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet "$wheel" numba

cd "$work"  # not the source tree
export JAX_PLATFORMS=cpu PRIMFORGE_CACHE_DIR="$work/cache"
"$work/venv/bin/python" - "$wheel" <<'PY'
import importlib.metadata, pathlib, sys, primforge
site = pathlib.Path(primforge.__file__).parent
assert "site-packages" in str(site), f"imported the source tree: {site}"
assert importlib.metadata.version("primforge") == primforge.__version__
assert (site / "ops" / "csr" / "csrc" / "csr_body.h").is_file(), "CSR sources missing"
print(f"installed primforge {primforge.__version__} from {pathlib.Path(sys.argv[1]).name}")
PY
"$work/venv/bin/python" "$work/src/examples/quickstart.py" | tail -1
"$work/venv/bin/primforge" list --tags csr > /dev/null
echo "wheel OK"
