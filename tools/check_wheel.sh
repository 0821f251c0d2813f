#!/usr/bin/env bash
# Build the wheel of the committed tree (HEAD), install it into a fresh virtual environment
# (outside the source tree, so the installed package is the one imported), and run the
# quickstart and the command. The source tree is left untouched.
#
# Usage: tools/check_wheel.sh [PYTHON]      (PYTHON defaults to python3; needs the network
#                                             or a pip cache for jax, numpy and numba)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${1:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$python" -m pip install --quiet build
mkdir "$work/src"
git -C "$root" archive HEAD | tar -x -C "$work/src"
"$python" -m build --wheel --outdir "$work/dist" "$work/src"
wheel="$(ls "$work"/dist/primforge-*.whl)"
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
