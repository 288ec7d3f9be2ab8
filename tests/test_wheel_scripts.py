"""scripts/wheels_lib.sh, what scripts/build_wheels.sh and
scripts/check_wheels.sh share: which interpreter serves each CPython minor
(``find_python``), and the environment without a compiler
(``make_compiler_stubs``, ``no_compiler``, ``compilers_masked``).

Stand-in interpreters are shell scripts: one answers for a single minor
version (and names itself as ``sys.executable``), one that exits 127 stands
for a pyenv shim of a version that is not selected.  Their versions (3.96
to 3.99) are ones no real interpreter on PATH has.  Nothing is built or
installed."""

from __future__ import annotations

import os
import subprocess
import sys

from _helpers import REPO

LIB = os.path.join(REPO, "scripts", "wheels_lib.sh")


def _interpreter(path, minor: str | None) -> str:
  """A stand-in at ``path`` for CPython ``minor`` (None: a failing shim)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  if minor is None:
    path.write_text("#!/bin/sh\nexit 127\n")
  else:
    path.write_text(
      "#!/bin/sh\n"
      'case "$2" in\n'
      f'  *sys.executable*) echo "{path}";;\n'
      f"  *\"'{minor}'\"*) exit 0;;\n"
      "  *) exit 1;;\n"
      "esac\n"
    )
  path.chmod(0o755)
  return str(path)


def _bash(tmp_path, script: str, path_dirs=(), **env_extra):
  """Runs ``script`` in bash after sourcing the library, with only
  ``path_dirs`` and the system's bin folders on PATH and no pyenv."""
  env = {
    "HOME": str(tmp_path / "home"),
    "PYENV_ROOT": str(tmp_path / "no-pyenv"),
    "PATH": os.pathsep.join([str(d) for d in path_dirs] + ["/usr/bin", "/bin"]),
  }
  env.update(env_extra)
  return subprocess.run(
    ["bash", "-c", f". {LIB}\n{script}"],
    env=env,
    capture_output=True,
    text=True,
    timeout=60,
  )


def test_find_python_passes_over_a_failing_shim(tmp_path):
  _interpreter(tmp_path / "shims" / "python3.98", None)
  real = _interpreter(tmp_path / "bin" / "python3.98", "3.98")
  proc = _bash(
    tmp_path, "find_python 3.98", [tmp_path / "shims", tmp_path / "bin"]
  )
  assert (proc.returncode, proc.stdout) == (0, real + "\n"), proc.stderr


def test_find_python_takes_only_the_minor_asked_for(tmp_path):
  # A python3.98 that is in fact another version is no 3.98.
  _interpreter(tmp_path / "a" / "python3.98", "3.97")
  right = _interpreter(tmp_path / "b" / "python3.98", "3.98")
  proc = _bash(tmp_path, "find_python 3.98", [tmp_path / "a", tmp_path / "b"])
  assert (proc.returncode, proc.stdout) == (0, right + "\n"), proc.stderr


def test_find_python_takes_pyenvs_newest_working_patch(tmp_path):
  root = tmp_path / "pyenv"
  _interpreter(root / "versions" / "3.99.0" / "bin" / "python3.99", "3.99")
  _interpreter(root / "versions" / "3.99.10" / "bin" / "python3.99", None)
  newest = _interpreter(
    root / "versions" / "3.99.9" / "bin" / "python3.99", "3.99"
  )
  _interpreter(root / "versions" / "3.98.1" / "bin" / "python3.98", "3.98")
  proc = _bash(tmp_path, "find_python 3.99", PYENV_ROOT=str(root))
  assert (proc.returncode, proc.stdout) == (0, newest + "\n"), proc.stderr


def test_find_python_tries_wheel_pythons_first(tmp_path):
  _interpreter(tmp_path / "bin" / "python3.97", "3.97")
  chosen = _interpreter(tmp_path / "x" / "py397", "3.97")
  other = _interpreter(tmp_path / "x" / "py399", "3.99")
  proc = _bash(
    tmp_path,
    "find_python 3.97",
    [tmp_path / "bin"],
    WHEEL_PYTHONS=f"{other} {chosen}",
  )
  assert (proc.returncode, proc.stdout) == (0, chosen + "\n"), proc.stderr


def test_find_python_fails_when_the_minor_is_missing(tmp_path):
  _interpreter(tmp_path / "bin" / "python3.98", "3.98")
  proc = _bash(tmp_path, "find_python 3.96", [tmp_path / "bin"])
  assert (proc.returncode, proc.stdout) == (1, "")


def _compilers(folder) -> list[str]:
  """Stand-in compilers in ``folder`` that succeed, as a real one would."""
  names = [
    "cc",
    "gcc",
    "g++-14",
    "x86_64-linux-gnu-gcc-13",
    "clang++",
    "clang-19",
    "c++",
  ]
  folder.mkdir(parents=True)
  for name in names:
    (folder / name).write_text("#!/bin/sh\necho compiled\n")
    (folder / name).chmod(0o755)
  return names


def test_no_compiler_masks_every_compiler_on_path(tmp_path):
  names = _compilers(tmp_path / "toolchain")
  script = (
    f"make_compiler_stubs {tmp_path / 'stubs'}\n"
    "for name in " + " ".join(names) + "; do\n"
    '  $name >/dev/null 2>&1 || echo "$name runs unmasked?"\n'
    '  no_compiler $name && echo "$name RAN"\n'
    "done\n"
    "no_compiler sh -c 'echo CC=$CC CXX=$CXX'\n"
  )
  proc = _bash(tmp_path, script, [tmp_path / "toolchain"])
  assert proc.stdout == "CC=false CXX=false\n"
  assert proc.stderr == "".join(
    f"no C/C++ compiler here ({name} is masked)\n" for name in names
  )


def test_compilers_masked_names_a_compiler_the_mask_misses(tmp_path):
  # sysconfig of this stand-in Python names "mycc", a compiler whose name
  # the stubs do not cover: the check must see that it still runs.
  (tmp_path / "toolchain").mkdir()
  (tmp_path / "toolchain" / "mycc").write_text("#!/bin/sh\nexit 0\n")
  (tmp_path / "toolchain" / "mycc").chmod(0o755)
  python = tmp_path / "python"
  python.write_text("#!/bin/sh\necho mycc\n")
  python.chmod(0o755)
  proc = _bash(
    tmp_path,
    f"make_compiler_stubs {tmp_path / 'stubs'}\ncompilers_masked {python}",
    [tmp_path / "toolchain"],
  )
  assert (proc.returncode, proc.stderr) == (
    1,
    "mycc still runs under the mask\n",
  )


def test_compilers_masked_accepts_this_pythons_compilers(tmp_path):
  proc = _bash(
    tmp_path,
    f"make_compiler_stubs {tmp_path / 'stubs'}\n"
    f"compilers_masked {sys.executable}",
    [os.path.dirname(sys.executable)],
  )
  assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
