"""The test build of hostcb's native engine: the functions that drive its
simulated CUDA driver and inject faults (tests/native/engine_testing.cc and
cuda_fake.cc, added to ``hostcb._native._engine``).

``make install`` makes the test build (setup.py with ``HOSTCB_TEST_BUILD=1``);
a wheel or a plain ``pip install .`` makes the production one, which has
none of them.  A test that needs them calls :func:`module`: it skips, naming
the test build, where the installed extension is not one, and fails
instead under ``HOSTCB_REQUIRE_NATIVE=1`` (``make test``), where it must be.
"""

from __future__ import annotations

import os

import pytest

from hostcb import _engine as engine
from hostcb._engine import native

MISSING = (
  "needs the test build of hostcb's native engine (HOSTCB_TEST_BUILD=1 "
  "pip install --no-build-isolation ., as `make install` does)"
)


def is_test_build() -> bool:
  """Whether the installed extension is the test build."""
  return engine.available() and hasattr(native.module(), "_use_fake_cuda")


def module():
  """The extension module, where it is the test build; else skips the test
  (fails it under ``HOSTCB_REQUIRE_NATIVE=1``)."""
  if not is_test_build():
    why = MISSING
    if not engine.available():
      why += (
        f"; the native engine is not built here: {engine.unavailable_reason()}"
      )
    if os.environ.get("HOSTCB_REQUIRE_NATIVE") == "1":
      pytest.fail(f"HOSTCB_REQUIRE_NATIVE=1, but the test {why}")
    pytest.skip(why)
  return native.module()


def fail_next_allocations(n: int) -> None:
  """The consumer fails to allocate the arrays of the next ``n`` taps, as
  if out of memory."""
  module()._fail_next_allocations(int(n))


def note_tap_fallback(reason: str) -> None:
  """Counts a tap that took XLA FFI's generic decoding, for ``reason``."""
  module()._note_tap_fallback(reason)
