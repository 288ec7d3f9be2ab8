# Sourced by scripts/build_wheels.sh and scripts/check_wheels.sh (and
# tests/test_wheel_scripts.py): where the CPython of each minor version
# (3.11, 3.12...) is on this machine, and an environment with no compiler.

# usable PY MINOR: PY runs, is CPython MINOR, and has pip and venv.
usable() {
  "$1" -c "import sys, venv, ensurepip, pip, platform
sys.exit(platform.python_implementation() != 'CPython'
         or '%d.%d' % sys.version_info[:2] != '$2')" >/dev/null 2>&1
}

# real PY: the interpreter that PY runs (a pyenv shim runs another).
real() {
  "$1" -c 'import sys; print(sys.executable)'
}

# find_python MINOR: prints the first usable CPython MINOR (its real path,
# sys.executable, not a shim's); fails if none.
# $WHEEL_PYTHONS (interpreters, space-separated) first, then python3.X on
# PATH (every one: a pyenv shim that fails unless selected is passed over),
# then pyenv's installed versions, the newest patch release first.
find_python() {
  local minor=$1 candidate root dir
  for candidate in ${WHEEL_PYTHONS:-}; do
    if usable "$candidate" "$minor"; then real "$candidate"; return 0; fi
  done
  while IFS= read -r candidate; do
    if usable "$candidate" "$minor"; then real "$candidate"; return 0; fi
  done < <(type -P -a "python$minor" 2>/dev/null || true)
  root=$( (command -v pyenv >/dev/null 2>&1 && pyenv root 2>/dev/null) \
          || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  if [ -d "$root/versions" ]; then
    for dir in $(ls -1 "$root/versions" | sort -V -r); do
      candidate=$root/versions/$dir/bin/python$minor
      if [ -x "$candidate" ] && usable "$candidate" "$minor"; then
        real "$candidate"; return 0
      fi
    done
  fi
  return 1
}

# make_compiler_stubs DIR: in DIR, a stub that fails (with a message) for
# every C/C++ compiler name on PATH and the usual ones; no_compiler puts DIR
# first on PATH.
make_compiler_stubs() {
  local dir name path_dirs
  STUBS=$1
  mkdir -p "$STUBS"
  {
    printf '%s\n' cc c++ gcc g++ cpp clang clang++ c89 c99 \
      x86_64-linux-gnu-gcc x86_64-linux-gnu-g++ aarch64-linux-gnu-gcc \
      aarch64-linux-gnu-g++
    IFS=: read -r -a path_dirs <<<"$PATH"
    for dir in "${path_dirs[@]}"; do
      [ -d "$dir" ] && ls -1 "$dir" 2>/dev/null
    done | grep -E \
      '^([a-z0-9_]+-)*(cc|c\+\+|gcc|g\+\+|clang|clang\+\+)(-[0-9.]+)?$' \
      || true
  } | sort -u | while IFS= read -r name; do
    printf '#!/bin/sh\necho "no C/C++ compiler here (%s is masked)" >&2\nexit 1\n' \
      "$name" >"$STUBS/$name"
    chmod +x "$STUBS/$name"
  done
}

# no_compiler CMD...: runs CMD with the stubs of make_compiler_stubs first
# on PATH, and CC, CXX, CPP and LDSHARED (which setuptools reads before
# sysconfig's gcc) set to `false`.
no_compiler() {
  env PATH="$STUBS:$PATH" CC=false CXX=false CPP=false LDSHARED=false "$@"
}

# compilers_masked PY: under no_compiler, no compiler that PY's setuptools
# could take (sysconfig's CC, CXX, LDSHARED, and the usual names) runs.
compilers_masked() {
  local name names
  names=$("$1" -c 'import sysconfig
for var in ("CC", "CXX", "LDSHARED"):
  print((sysconfig.get_config_var(var) or "cc").split()[0])')
  for name in $names cc c++ gcc g++ clang clang++; do
    if no_compiler bash -c "$name --version" >/dev/null 2>&1; then
      echo "$name still runs under the mask" >&2
      return 1
    fi
  done
}
