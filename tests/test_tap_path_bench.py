"""The C++ micro-benchmark of the CPU tap path (tests/native/tap_path_bench.cc,
issue 38) builds against the installed JAX's FFI headers, delivers every
record with its values, and keeps the errors of unusual call frames.

It links the engine's handlers.cc alone (no Python), with the jaxlib
headers that ``jax.ffi.include_dir()`` names; a run here is short: the
figures come from larger ``--calls`` by hand (see docs/engine.md).
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
  out = str(tmp_path_factory.mktemp("bench") / "tap_path_bench")
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
      os.path.join(ROOT, "tests", "native", "tap_path_bench.cc"),
      "-o",
      out,
      "-lpthread",
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
  assert res.returncode == 0, res.stderr
  return {k: float(v) for k, v in (f.split("=") for f in res.stdout.split())}


def test_every_tap_arrives_with_its_values_with_a_consumer_thread(bench):
  got = _run(bench, "--calls", "20000", "--consumer=thread")
  assert got["records"] == 20000 and got["checked"] == 1


def test_every_tap_arrives_with_its_values_drained_inline(bench):
  got = _run(bench, "--calls", "20000", "--consumer=inline")
  assert got["records"] == 20000 and got["checked"] == 1


def test_unusual_call_frames_get_the_bindings_or_the_engines_errors(bench):
  # Another stage or attribute name goes to XLA FFI's binding; a dtype or
  # result that the engine refuses gets the engine's message; none queues.
  # A frame with an unknown extension is run by the binding (queued) and
  # counted as a fallback, with its reason; the errors are not counted.
  assert _run(bench, "--errors") == {"errors_checked": 1}
