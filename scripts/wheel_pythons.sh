# Sourced by scripts/build_wheels.sh and scripts/check_wheels.sh: where the
# CPython of each minor version (3.11, 3.12...) is on this machine.

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
