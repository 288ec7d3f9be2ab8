"""Builds and runs the C++ micro-benchmarks of tests/native (their tests:
test_tap_path_bench.py, test_gpu_tap_bench.py): each is one source file,
linked with some of the engine's sources and compiled against the installed
JAX's FFI headers (``jax.ffi.include_dir()``); it prints its figures as
``name=value`` fields on one line."""

from __future__ import annotations

import os
import shutil
import subprocess

import jax
import pytest

from _helpers import REPO

NATIVE = os.path.join(REPO, "src", "hostcb", "_native")


def build(
  tmp_path_factory,
  name: str,
  engine_sources: list[str],
  libs: list[str],
  flags: tuple[str, ...] = ("-O2",),
) -> str:
  """The path of benchmark ``name`` (tests/native/NAME.cc), built with
  ``engine_sources`` (file names in src/hostcb/_native), ``libs`` (e.g.
  ``["-lpthread"]``) and the compiler ``flags`` in a temporary directory;
  skips where there is no C++ compiler."""
  compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
  if compiler is None:
    pytest.skip("needs a C++ compiler (g++ or c++, or $CXX)")
  out = str(tmp_path_factory.mktemp("bench") / name)
  res = subprocess.run(
    [
      compiler,
      "-std=c++17",
      *flags,
      "-I",
      NATIVE,
      "-isystem",
      jax.ffi.include_dir(),
      *(os.path.join(NATIVE, s) for s in engine_sources),
      os.path.join(REPO, "tests", "native", f"{name}.cc"),
      "-o",
      out,
      *libs,
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert res.returncode == 0, res.stderr
  return out


def run(
  bench: str,
  *args: str,
  timeout: float = 120,
  env: dict[str, str] | None = None,
) -> dict[str, float]:
  """The figures that one run of ``bench`` with ``args`` prints, by name;
  the run must succeed (within ``timeout`` seconds).  ``env``: variables
  set for the run, over this process's environment."""
  res = subprocess.run(
    [bench, *args],
    capture_output=True,
    text=True,
    timeout=timeout,
    env=None if env is None else {**os.environ, **env},
  )
  assert res.returncode == 0, res.stdout + res.stderr
  return {k: float(v) for k, v in (f.split("=") for f in res.stdout.split())}
