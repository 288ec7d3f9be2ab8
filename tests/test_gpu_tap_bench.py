"""The C++ micro-benchmark of the GPU tap and call paths' host side
(tests/native/gpu_tap_bench.cc) builds against the installed JAX's FFI
headers and delivers every tap, and every call's results, with their values.

It links the engine's handlers.cc and cuda.cc alone (no Python, no GPU: a
simulated driver of its own does each operation at once); a run here is
short: the figures come from larger ``--calls`` by hand (see
docs/engine.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import jax
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE = os.path.join(ROOT, "src", "hostcb", "_native")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
  compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
  if compiler is None:
    pytest.skip("needs a C++ compiler (g++ or c++, or $CXX)")
  out = str(tmp_path_factory.mktemp("bench") / "gpu_tap_bench")
  res = subprocess.run(
    [
      compiler,
      "-std=c++17",
      "-O2",
      "-I",
      NATIVE,
      "-isystem",
      jax.ffi.include_dir(),
      os.path.join(NATIVE, "handlers.cc"),
      os.path.join(NATIVE, "cuda.cc"),
      os.path.join(ROOT, "tests", "native", "gpu_tap_bench.cc"),
      "-o",
      out,
      "-lpthread",
      "-ldl",
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert res.returncode == 0, res.stderr
  return out


def _run(bench, *args) -> dict[str, float]:
  res = subprocess.run(
    [bench, *args], capture_output=True, text=True, timeout=120
  )
  assert res.returncode == 0, res.stdout + res.stderr
  return {k: float(v) for k, v in (f.split("=") for f in res.stdout.split())}


@pytest.mark.parametrize("publication", ["word", "host"])
def test_every_gpu_tap_arrives_with_its_values(bench, publication):
  got = _run(
    bench, "--calls", "5000", "--rounds", "2", f"--publication={publication}"
  )
  assert got["records"] == 10000 and got["checked"] == 1


@pytest.mark.parametrize("publication", ["word", "host"])
def test_every_gpu_call_returns_its_results(bench, publication):
  got = _run(
    bench,
    "--calls",
    "5000",
    "--rounds",
    "2",
    "--op=call",
    f"--publication={publication}",
  )
  assert got["records"] == 0 and got["checked"] == 1
