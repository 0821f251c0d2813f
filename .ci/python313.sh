#!/usr/bin/env bash
# Prints the path of a Python 3.13 interpreter, building it first when the cache lacks it.
#
# These machines run Debian 12 (Python 3.11); JAX 0.11 and newer need Python >= 3.12.
# Debian's registry serves trixie's source package python3.13, which builds here with
# bookworm's build dependencies. The build goes to a cache folder outside the clone
# (PRIMFORGE_CI_CACHE, default /var/cache/primforge-ci) and is reused while it runs; a
# missing or broken one is rebuilt. Everything but the interpreter's path goes to stderr.
set -euo pipefail
CACHE="${PRIMFORGE_CI_CACHE:-/var/cache/primforge-ci}"
PREFIX="$CACHE/python3.13"
PY="$PREFIX/bin/python3.13"
if "$PY" -c 'import sys, ssl, venv, ensurepip; assert sys.version_info[:2] == (3, 13)' \
    >/dev/null 2>&1; then
  echo "$PY"
  exit 0
fi
{
  echo "building Python 3.13 into $PREFIX"
  rm -rf "$PREFIX"
  mkdir -p "$CACHE"
  W=$(mktemp -d)
  trap 'rm -rf "$W"' EXIT
  printf 'deb-src http://deb.debian.org/debian trixie main\n' > "$W/sources.list"
  mkdir -p "$W/lists/partial"
  A=(-o "Dir::Etc::sourcelist=$W/sources.list" -o Dir::Etc::sourceparts=/dev/null
     -o "Dir::State::Lists=$W/lists")
  apt-get "${A[@]}" -q update
  (cd "$W" && apt-get "${A[@]}" -q source --download-only python3.13)
  tar -C "$W" -xf "$W"/python3.13_*.orig.tar.xz
  cd "$W"/Python-3.13.*
  ./configure -q --prefix="$PREFIX" --with-ensurepip=install
  make -s -j"$(nproc)"
  make -s install
} >&2
"$PY" -c 'import sys, ssl, venv, ensurepip; assert sys.version_info[:2] == (3, 13)' >&2
echo "$PY"
