#!/usr/bin/env bash
# Checks what a user gets from pip's defaults (build isolation: the build
# environment has only pyproject.toml's build requirements).  Builds ONE
# wheel with `pip wheel .`, installs that same wheel in fresh virtual
# environments under the oldest and the newest supported JAX, installs the
# repository with a plain `pip install <repo>`, an sdist with pip and the
# repository with `uv pip install`, and in each one runs a jitted id_tap
# that must go through the native tap engine.
#   bash scripts/check_wheel.sh
# Environments live under .venv-wheel/ (made anew on each run; pip's cache
# keeps the downloads).  Exits non-zero if any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PYTHON=${PYTHON:-python3}
JAX_OLDEST=${JAX_OLDEST:-0.8.0}
JAX_NEWEST=${JAX_NEWEST:-0.10.2}
WORK=${WORK:-$REPO/.venv-wheel}
DIST=$WORK/dist

# The check each environment runs, from outside the repository so that the
# installed hostcb is the one imported.
read -r -d '' CHECK <<'EOF' || true
import os, sys
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax
import jax.numpy as jnp
import numpy as np
import hostcb
from hostcb import engine

where = os.path.dirname(hostcb.__file__)
assert os.path.realpath(where).startswith(os.path.realpath(sys.prefix)), (
    f"hostcb imported from {where}, not from the environment {sys.prefix}")
if not engine.available():
  sys.exit(f"the native engine is not available: "
           f"{engine.unavailable_reason()}")

received = []

def tap(value, transforms):
  received.append(np.asarray(value))

def f(x):
  return hostcb.id_tap(tap, x * 2) + 1

x = jnp.arange(4.0)
hlo = jax.jit(f).lower(x).as_text()
assert "hostcb_tap" in hlo, "the tap is not lowered to the native handler"
out = jax.jit(f)(x)
hostcb.barrier_wait()
np.testing.assert_array_equal(np.asarray(out), [1.0, 3.0, 5.0, 7.0])
assert len(received) == 1, f"{len(received)} taps received, expected 1"
np.testing.assert_array_equal(received[0], [0.0, 2.0, 4.0, 6.0])
print(f"jax {jax.__version__}, native engine loaded, "
      f"{len(received)} tap received with the right values")
EOF

SUMMARY=()
FAILED=0

# new_venv NAME: a fresh virtual environment $WORK/NAME.
new_venv() {
  rm -rf "${WORK:?}/$1"
  "$PYTHON" -m venv "$WORK/$1"
}

# check NAME: runs $CHECK in $WORK/NAME and records the outcome; on failure
# prints `hostcb info` of that environment too.
check() {
  local name=$1 out
  if out=$(cd "$WORK" && "$WORK/$name/bin/python" -c "$CHECK" 2>&1); then
    echo "$out"
    SUMMARY+=("ok    $name: ${out##*$'\n'}")
  else
    echo "$out"
    (cd "$WORK" && "$WORK/$name/bin/hostcb" info) || true
    SUMMARY+=("FAIL  $name: ${out##*$'\n'}")
    FAILED=1
  fi
}

# fail NAME WHAT: records a step that failed before the check could run.
fail() {
  SUMMARY+=("FAIL  $1: $2")
  FAILED=1
}

mkdir -p "$WORK"
rm -rf "$DIST"

echo "== building one wheel: pip wheel --no-deps -w $DIST . (build isolation)"
"$PYTHON" -m pip wheel -q --no-deps -w "$DIST" "$REPO"
WHEELS=("$DIST"/hostcb-*.whl)
if [ "${#WHEELS[@]}" -ne 1 ] || [ ! -f "${WHEELS[0]}" ]; then
  echo "expected one hostcb wheel in $DIST, found: ${WHEELS[*]}" >&2
  exit 1
fi
WHEEL=${WHEELS[0]}
echo "built $(basename "$WHEEL")"
# The wheel must hold the engine, and no record of a failed build.
if "$PYTHON" - "$WHEEL" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
engines = [n for n in names if n.startswith("hostcb/_native/_engine")]
failure = "hostcb/_native/_build_failure.txt"
if failure in names:
  sys.exit("the wheel records a failed build: " +
           zipfile.ZipFile(sys.argv[1]).read(failure).decode().strip())
if len(engines) != 1:
  sys.exit(f"the wheel holds {len(engines)} native engines: {engines}")
print("the wheel holds", engines[0])
EOF
then
  SUMMARY+=("ok    wheel: $(basename "$WHEEL") holds the native engine")
else
  fail wheel "$(basename "$WHEEL") holds no native engine"
fi

for version in "$JAX_OLDEST" "$JAX_NEWEST"; do
  name=wheel-jax-$version
  echo "== $name: the wheel, with jax==$version jaxlib==$version"
  new_venv "$name"
  if "$WORK/$name/bin/pip" install -q "$WHEEL" "jax==$version" \
      "jaxlib==$version"; then
    check "$name"
  else
    fail "$name" "pip install failed"
  fi
done

name=repo-jax-$JAX_NEWEST
echo "== $name: pip install jax==$JAX_NEWEST, then pip install <repo>"
new_venv "$name"
if "$WORK/$name/bin/pip" install -q "jax==$JAX_NEWEST" "jaxlib==$JAX_NEWEST" \
    && "$WORK/$name/bin/pip" install -q "$REPO"; then
  check "$name"
else
  fail "$name" "pip install failed"
fi

# The sdist (python -m build --sdist), installed by pip into a fresh
# environment, and the repository installed by uv: tools from PyPI in their
# own environment.
new_venv tools
if "$WORK/tools/bin/pip" install -q build uv; then
  rm -rf "$WORK/sdist"
  if "$WORK/tools/bin/python" -m build -q --sdist -o "$WORK/sdist" "$REPO" \
      >/dev/null; then
    SDISTS=("$WORK/sdist"/hostcb-*.tar.gz)
    name=sdist-jax-$JAX_NEWEST
    echo "== $name: pip install jax==$JAX_NEWEST $(basename "${SDISTS[0]}")"
    new_venv "$name"
    if "$WORK/$name/bin/pip" install -q "jax==$JAX_NEWEST" \
        "jaxlib==$JAX_NEWEST" "${SDISTS[0]}"; then
      check "$name"
    else
      fail "$name" "pip install of the sdist failed"
    fi
  else
    fail sdist "python -m build --sdist failed"
  fi
  name=uv-jax-$JAX_NEWEST
  echo "== $name: uv pip install jax==$JAX_NEWEST <repo>"
  rm -rf "${WORK:?}/$name"
  if "$WORK/tools/bin/uv" venv -q -p "$PYTHON" "$WORK/$name" \
      && VIRTUAL_ENV="$WORK/$name" "$WORK/tools/bin/uv" pip install -q \
          "jax==$JAX_NEWEST" "jaxlib==$JAX_NEWEST" "$REPO"; then
    check "$name"
  else
    fail "$name" "uv pip install failed"
  fi
else
  fail tools "pip install build uv failed"
fi

echo "== summary"
printf '%s\n' "${SUMMARY[@]}"
exit "$FAILED"
