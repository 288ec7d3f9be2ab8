#!/usr/bin/env bash
# Runs the test suite against the newest JAX that pip resolves, as a new
# user gets it: on a Python >= 3.12 (JAX >= 0.11 no longer installs on
# Python 3.11), in its own virtual environment .venv-newest, with hostcb
# installed from this clone by `pip install .` with pip's defaults (build
# isolation), as the test build (HOSTCB_TEST_BUILD=1, below).  Then, as
# `make test` does, the whole suite on 4 CPU devices and the multi-device
# tests on 2.
#   bash scripts/check_newest_jax.sh [pytest args...]
#
# The Python: $NEWEST_PYTHON if set; else the first interpreter >= 3.12 that
# actually runs, newest first: python3.14, python3.13, python3.12 on PATH
# (every one on PATH: a pyenv shim that fails unless selected is passed
# over), then pyenv's installed versions, then CPython built from Debian's
# source package python3.13 into $HOSTCB_PYTHON_CACHE (default
# ~/.cache/hostcb/python3.13), built once (about 20 minutes on 2 cores) and
# reused after.  `bash scripts/check_newest_jax.sh --find-python` only
# prints the interpreter it would use (building none); `--build-python`
# only builds the fallback (if $HOSTCB_PYTHON_CACHE has none yet).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-newest}
CACHE=${HOSTCB_PYTHON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hostcb/python3.13}
# The suite on which the Debian source package python3.13 lies.
DEBIAN_SUITE=${DEBIAN_SUITE:-trixie}

# usable PY: PY runs, is CPython >= 3.12 and can make a venv with pip.
usable() {
  "$1" -c 'import sys, venv, ensurepip, ssl, zlib
sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1
}

# find_python: prints the first usable interpreter; fails if there is none.
find_python() {
  local name candidate root
  if [ -n "${NEWEST_PYTHON:-}" ]; then
    if usable "$NEWEST_PYTHON"; then echo "$NEWEST_PYTHON"; return 0; fi
    echo "NEWEST_PYTHON=$NEWEST_PYTHON is not a usable Python >= 3.12" >&2
    return 1
  fi
  for name in python3.14 python3.13 python3.12; do
    # type -P -a: every one on PATH, not only the first (a shim).
    while IFS= read -r candidate; do
      if usable "$candidate"; then echo "$candidate"; return 0; fi
    done < <(type -P -a "$name" 2>/dev/null || true)
  done
  root=$( (command -v pyenv >/dev/null 2>&1 && pyenv root 2>/dev/null) \
          || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  if [ -d "$root/versions" ]; then
    # Newest first: version-sorted names, reversed.
    while IFS= read -r candidate; do
      if usable "$candidate"; then echo "$candidate"; return 0; fi
    done < <(for dir in $(ls -1 "$root/versions" | sort -V -r); do
               for name in python3.14 python3.13 python3.12; do
                 [ -x "$root/versions/$dir/bin/$name" ] \
                   && echo "$root/versions/$dir/bin/$name"
               done
             done)
  fi
  if usable "$CACHE/bin/python3.13"; then
    echo "$CACHE/bin/python3.13"; return 0
  fi
  return 1
}

# build_python: CPython from Debian's source package python3.13 (the
# suite $DEBIAN_SUITE), into $CACHE.  apt reads a sources file of its own
# (deb-src for $DEBIAN_SUITE on the mirror this machine's apt already
# uses), with its own lists under $CACHE: the machine's apt setup is left
# as it was.
build_python() {
  local work=$CACHE.build uris sources
  echo "== no Python >= 3.12 found: building CPython 3.13 from Debian's" \
       "source package python3.13 ($DEBIAN_SUITE) into $CACHE"
  rm -rf "$work"
  mkdir -p "$work/lists/partial"
  uris=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources \
           2>/dev/null | grep -v -e security -e '^$' | head -1 || true)
  if [ -z "$uris" ]; then
    uris=$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\).*/\2/p' \
             /etc/apt/sources.list 2>/dev/null | grep -v security | head -1 || true)
  fi
  if [ -z "$uris" ]; then
    echo "no Debian mirror in this machine's apt sources" >&2
    return 1
  fi
  sources=$work/deb-src.sources
  printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n' \
    "$uris" "$DEBIAN_SUITE" /usr/share/keyrings/debian-archive-keyring.gpg \
    >"$sources"
  local apt_opts=(-o "Dir::Etc::SourceList=$sources"
                  -o "Dir::Etc::SourceParts=/nonexistent"
                  -o "Dir::State::Lists=$work/lists")
  # The compiler and the headers of the modules pip and venv need (ssl,
  # zlib, ctypes' libffi) and a few more of the standard library.
  apt-get update -qq
  apt-get install -y -qq build-essential xz-utils pkg-config libssl-dev \
    zlib1g-dev libffi-dev libbz2-dev liblzma-dev libsqlite3-dev \
    libreadline-dev libncurses-dev uuid-dev >/dev/null
  apt-get "${apt_opts[@]}" update -qq
  # Only the upstream tarball that the source package carries is built:
  # Debian's patches fit CPython to Debian's own layout (one of them turns
  # ensurepip off, which venv needs).
  (cd "$work" && apt-get "${apt_opts[@]}" source -qq --download-only \
     python3.13)
  local tarball src
  tarball=$(find "$work" -maxdepth 1 -name 'python3.13_*.orig.tar.*' \
              ! -name '*.asc' | head -1)
  if [ -z "$tarball" ]; then
    echo "apt-get source python3.13 brought no upstream tarball to $work" >&2
    return 1
  fi
  tar -xf "$tarball" -C "$work"
  src=$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'Python-3.13*' \
          | head -1)
  (cd "$src" && ./configure -q --prefix="$CACHE" --with-ensurepip=install \
       >"$work/configure.log" \
     && make -j"$(nproc)" >"$work/make.log" 2>&1 \
     && make install >"$work/install.log" 2>&1) \
    || { echo "building CPython failed; logs in $work" >&2;
         tail -30 "$work"/*.log >&2; return 1; }
  rm -rf "$work"
  if ! usable "$CACHE/bin/python3.13"; then
    echo "the CPython built in $CACHE cannot make a venv with pip" >&2
    return 1
  fi
}

case ${1:-} in
  --find-python)
    find_python
    exit ;;
  --build-python)  # the fallback alone, into $CACHE (kept if usable)
    usable "$CACHE/bin/python3.13" || build_python
    echo "$CACHE/bin/python3.13"
    exit ;;
esac

START=$SECONDS
if ! PY=$(find_python); then
  build_python
  PY=$CACHE/bin/python3.13
fi
echo "== Python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"

# The environment is kept between runs; it is made anew when it is broken
# or was made by another Python.
if ! "$VENV/bin/python" -c 'import sys
sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 \
    || [ "$(cat "$VENV/.base-python" 2>/dev/null)" != "$PY" ]; then
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  echo "$PY" >"$VENV/.base-python"
fi
# The newest jax and jaxlib that pip resolves (upgraded on each run), and
# what the suite needs, as the Makefile installs it (no PyTorch: its DLPack
# tests skip and say so).
"$VENV/bin/pip" install -q --upgrade jax jaxlib numpy "pytest>=8" \
  pytest-timeout hypothesis graphviz tqdm flatbuffers
"$VENV/bin/python" -c "import jax, jaxlib, numpy, sys
print('== jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'numpy',
      numpy.__version__, 'python', sys.version.split()[0])"
# hostcb as a user installs it from a clone: pip's defaults, build isolation
# (pyproject.toml's [build-system] brings the FFI headers), but the test
# build of the native engine (HOSTCB_TEST_BUILD=1, which the isolated build
# sees too): the suite drives its simulated CUDA driver and fault
# injections.  check_wheels.sh checks the production build of a plain
# `pip install <repo>`.
HOSTCB_TEST_BUILD=1 "$VENV/bin/pip" install -q .
(cd "$VENV" && ./bin/python -c "from hostcb import _engine as engine
print('== native engine:', engine.available() or engine.unavailable_reason())")
# A JAX newer than the newest that hostcb names (versions.NEWEST): the run
# says so; once it passes, the range in versions.py, README.md and
# pyproject.toml's comment moves up to it.
(cd "$VENV" && ./bin/python -c "import jax
from hostcb._jax_internals import versions
key = lambda v: tuple(int(p) for p in v.split('.') if p.isdigit())
if key(jax.__version__) > key(versions.NEWEST):
  print('== note: jax', jax.__version__, 'is newer than the newest hostcb '
        'names (' + versions.CHECKED_RANGE + '); if this run passes, raise '
        'NEWEST in src/hostcb/_jax_internals/versions.py, README.md and '
        'pyproject.toml')")
echo "== ready in $((SECONDS - START)) s"

HOSTCB_REQUIRE_NATIVE=1 HOSTCB_TEST_DEVICES=4 "$VENV/bin/python" -m pytest -q \
  -p no:cacheprovider tests "$@"
HOSTCB_REQUIRE_NATIVE=1 HOSTCB_TEST_DEVICES=2 "$VENV/bin/python" -m pytest -q \
  -p no:cacheprovider -m multidevice tests "$@"
echo "== check_newest_jax.sh: passed in $((SECONDS - START)) s"
