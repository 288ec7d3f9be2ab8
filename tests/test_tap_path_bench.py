"""The C++ micro-benchmark of the CPU tap path (tests/native/tap_path_bench.cc,
issue 38) builds against the installed JAX's FFI headers, delivers every
record with its values, and keeps the errors of unusual call frames.

It links the engine's handlers.cc alone (no Python), with the jaxlib
headers that ``jax.ffi.include_dir()`` names; a run here is short: the
figures come from larger ``--calls`` by hand (see docs/engine.md).
"""

from __future__ import annotations

import pytest

import _native_bench


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
  return _native_bench.build(
    tmp_path_factory, "tap_path_bench", ["handlers.cc"], ["-lpthread"]
  )


def test_every_tap_arrives_with_its_values_with_a_consumer_thread(bench):
  got = _native_bench.run(bench, "--calls", "20000", "--consumer=thread")
  assert got["records"] == 20000 and got["checked"] == 1


def test_every_tap_arrives_with_its_values_drained_inline(bench):
  got = _native_bench.run(bench, "--calls", "20000", "--consumer=inline")
  assert got["records"] == 20000 and got["checked"] == 1


def test_unusual_call_frames_get_the_bindings_or_the_engines_errors(bench):
  # Another stage or attribute name goes to XLA FFI's binding; a dtype or
  # result that the engine refuses gets the engine's message; none queues.
  # A frame with an unknown extension is run by the binding (queued) and
  # counted as a fallback, with its reason; the errors are not counted.
  assert _native_bench.run(bench, "--errors") == {"errors_checked": 1}
