"""Differential tests: ``hostcb.buffer_callback`` behaves as JAX's own.

The scenarios of ``tests/legacy_diff/b_buffer.py`` run in two interpreters
of this environment, one with ``jax.experimental.buffer_callback`` and one
with ``hostcb.buffer_callback``; each test compares one scenario's output
(what the callback saw, results, errors).  Same rules as
``test_legacy_diff.py``.
"""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "legacy_diff")
sys.path.insert(0, HERE)

import b_buffer  # noqa: E402,F401  (registers the scenarios)
import compare  # noqa: E402
import harness  # noqa: E402
import registry  # noqa: E402

NAMES = [n for n, s in registry.SCENARIOS.items() if s.module == "b_buffer"]


def _param(name):
  sc = registry.SCENARIOS[name]
  marks = [pytest.mark.xfail(strict=True, reason=sc.xfail)] if sc.xfail else []
  return pytest.param(name, marks=marks, id=name)


@pytest.fixture(scope="module")
def outputs():
  """``(jax, hostcb)``: each scenario's normalized output, by name."""
  try:
    from jax.experimental import buffer_callback  # noqa: F401
  except ImportError as e:
    pytest.skip(f"this JAX has no jax.experimental.buffer_callback: {e}")
  return harness.run_suites(
    [(sys.executable, "jax-buffer"), (sys.executable, "hostcb-buffer")], None
  )


@pytest.mark.parametrize("name", [_param(n) for n in NAMES])
def test_hostcb_buffer_callback_matches_jax(outputs, name):
  """hostcb's buffer_callback does what JAX's does in this scenario."""
  sc = registry.SCENARIOS[name]
  theirs, ours = outputs
  assert name in ours and name in theirs
  if sc.ours is not None:
    assert compare.ours_view(ours[name], sc.unordered) == compare.ours_view(
      sc.expect, sc.unordered
    ), sc.ours
    return
  assert compare.ours_view(ours[name], sc.unordered) == compare.expected_view(
    theirs[name], ours[name], sc.unordered
  )
