"""The C++ micro-benchmark of the GPU tap and call paths' host side
(tests/native/gpu_tap_bench.cc) builds against the installed JAX's FFI
headers and delivers every tap, and every call's results, with their values.

It links the engine's handlers.cc and cuda.cc alone (no Python, no GPU: a
simulated driver of its own does each operation at once, installed through
the test build's hooks, ``HOSTCB_TEST_BUILD``); a run here is short: the
figures come from larger ``--calls`` by hand (see docs/guide.md, "Goals not
met yet").
"""

from __future__ import annotations

import pytest

import _native_bench


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
  return _native_bench.build(
    tmp_path_factory,
    "gpu_tap_bench",
    ["handlers.cc", "cuda.cc"],
    ["-lpthread", "-ldl"],
    flags=("-O2", "-DHOSTCB_TEST_BUILD"),
  )


@pytest.mark.parametrize("publication", ["word", "host"])
def test_every_gpu_tap_arrives_with_its_values(bench, publication):
  got = _native_bench.run(
    bench, "--calls", "5000", "--rounds", "2", f"--publication={publication}"
  )
  assert got["records"] == 10000 and got["checked"] == 1


@pytest.mark.parametrize("publication", ["word", "host"])
def test_every_gpu_call_returns_its_results(bench, publication):
  got = _native_bench.run(
    bench,
    "--calls",
    "5000",
    "--rounds",
    "2",
    "--op=call",
    f"--publication={publication}",
  )
  assert got["records"] == 0 and got["checked"] == 1
