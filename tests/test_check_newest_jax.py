"""scripts/check_newest_jax.sh: which Python it takes (``--find-python``,
which builds and installs nothing), with stand-in interpreters: a script
that exits 0 stands for a usable Python >= 3.12, one that exits 127 for a
pyenv shim of a version that is not selected."""

from __future__ import annotations

import os
import subprocess

import pytest

from _helpers import REPO

SCRIPT = os.path.join(REPO, "scripts", "check_newest_jax.sh")


def _interpreter(path, works: bool) -> str:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("#!/bin/sh\nexit %d\n" % (0 if works else 127))
  path.chmod(0o755)
  return str(path)


def _find(tmp_path, path_dirs, **env_extra) -> subprocess.CompletedProcess:
  env = {
    "HOME": str(tmp_path / "home"),
    "PYENV_ROOT": str(tmp_path / "no-pyenv"),
    "HOSTCB_PYTHON_CACHE": str(tmp_path / "cache"),
    "PATH": os.pathsep.join([str(d) for d in path_dirs] + ["/usr/bin", "/bin"]),
  }
  env.update(env_extra)
  return subprocess.run(
    ["bash", SCRIPT, "--find-python"],
    env=env,
    capture_output=True,
    text=True,
    timeout=60,
  )


@pytest.fixture(autouse=True)
def _no_real_python_on_usr_bin():
  for name in ("python3.14", "python3.13", "python3.12"):
    if os.path.exists(os.path.join("/usr/bin", name)):
      pytest.skip(
        f"/usr/bin/{name} exists: these stand-ins would not be "
        "the only interpreters the script sees"
      )


def test_a_failing_shim_on_path_is_passed_over_for_a_later_one(tmp_path):
  _interpreter(tmp_path / "shims" / "python3.13", works=False)
  real = _interpreter(tmp_path / "bin" / "python3.13", works=True)
  proc = _find(tmp_path, [tmp_path / "shims", tmp_path / "bin"])
  assert (proc.returncode, proc.stdout) == (0, real + "\n"), proc.stderr


def test_the_newest_name_on_path_comes_first(tmp_path):
  _interpreter(tmp_path / "a" / "python3.12", works=True)
  newest = _interpreter(tmp_path / "b" / "python3.13", works=True)
  proc = _find(tmp_path, [tmp_path / "a", tmp_path / "b"])
  assert (proc.returncode, proc.stdout) == (0, newest + "\n"), proc.stderr


def test_pyenv_versions_are_tried_newest_first(tmp_path):
  root = tmp_path / "pyenv"
  _interpreter(root / "versions" / "3.12.1" / "bin" / "python3.12", True)
  _interpreter(root / "versions" / "3.13.10" / "bin" / "python3.13", False)
  newest_working = _interpreter(
    root / "versions" / "3.13.9" / "bin" / "python3.13", True
  )
  _interpreter(root / "versions" / "3.11.7" / "bin" / "python3.11", True)
  _interpreter(tmp_path / "shims" / "python3.13", works=False)
  proc = _find(tmp_path, [tmp_path / "shims"], PYENV_ROOT=str(root))
  assert (proc.returncode, proc.stdout) == (0, newest_working + "\n"), (
    proc.stderr
  )


def test_the_cached_build_is_taken_last(tmp_path):
  built = _interpreter(tmp_path / "cache" / "bin" / "python3.13", True)
  proc = _find(tmp_path, [])
  assert (proc.returncode, proc.stdout) == (0, built + "\n"), proc.stderr


def test_no_python_found_fails_without_building(tmp_path):
  _interpreter(tmp_path / "shims" / "python3.13", works=False)
  proc = _find(tmp_path, [tmp_path / "shims"])
  assert (proc.returncode, proc.stdout) == (1, "")
  assert not (tmp_path / "cache").exists()


def test_newest_python_chooses_and_must_work(tmp_path):
  chosen = _interpreter(tmp_path / "x" / "python", works=True)
  _interpreter(tmp_path / "bin" / "python3.13", works=True)
  proc = _find(tmp_path, [tmp_path / "bin"], NEWEST_PYTHON=chosen)
  assert (proc.returncode, proc.stdout) == (0, chosen + "\n")
  broken = _interpreter(tmp_path / "y" / "python", works=False)
  proc = _find(tmp_path, [tmp_path / "bin"], NEWEST_PYTHON=broken)
  assert (proc.returncode, proc.stdout) == (1, "")
  assert proc.stderr == (
    f"NEWEST_PYTHON={broken} is not a usable Python >= 3.12\n"
  )
