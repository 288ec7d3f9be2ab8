"""Differential tests: hostcb behaves as legacy ``host_callback`` did.

The oracle is legacy JAX itself: ``.venv-legacy`` (``make .venv-legacy``)
has ``jax==0.4.30`` with the real ``jax.experimental.host_callback``.  The
scenarios of ``tests/legacy_diff/`` (legacy programs, one function each) run
in one interpreter per environment, with 2 CPU devices: under legacy JAX,
and under hostcb on this environment's JAX.  Each test compares one
scenario's output (prints, what the tap functions received, results,
errors); see ``legacy_diff/registry.py`` for how a scenario marks a known
difference (``xfail``) or a documented one (``ours``/``expect``).

Without a usable ``.venv-legacy`` (no Python 3.11, no network to install
JAX 0.4.30), every test here skips and says what is missing.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import sys

import jax
import numpy as np
import pytest

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "legacy_diff")
sys.path.insert(0, HERE)

import hostcb  # noqa: E402
from hostcb._jax_internals import versions  # noqa: E402

hostcb.install()  # the scenario modules use the legacy import path

import compare  # noqa: E402
import harness  # noqa: E402
import registry  # noqa: E402
import runner  # noqa: E402
import s_generated  # noqa: E402

for _m in runner.HCB_MODULES:
  importlib.import_module(_m)

try:
  import generate

  CASES = generate.cases()
except ImportError as _e:  # hypothesis missing: no generated scenarios
  generate, CASES = None, None
  _NO_CASES = f"hypothesis is not installed ({_e}); `make test` installs it"
else:
  s_generated.register(CASES)

NAMES = [
  n for n, s in registry.SCENARIOS.items() if s.module in runner.HCB_MODULES
]


# Where the running versions changed what the same program computes (not
# hostcb's behaviour), per version, with the reason.
_NUMPY_2_5 = tuple(int(p) for p in np.__version__.split(".")[:2]) >= (2, 5)
_VERSION_DRIFT = {
  "doc_call_host_eig_jit": (
    _NUMPY_2_5,
    f"NumPy {np.__version__}'s eigvals returns complex64 for "
    "a real matrix with real eigenvalues (NumPy before 2.5: float32), so "
    "the legacy documentation's host function no longer returns the "
    "float32 it declares; hostcb then raises legacy's error",
  ),
}
# XLA's kernels (transcendental functions) changed after the development
# JAX: on another JAX, generated programs' floats may differ from legacy's
# in their last digits (JAX's change); they are compared to 1e-5 there.
_DEVELOPMENT_JAX = jax.__version__ == versions.DEVELOPMENT
_FLOAT = re.compile(r"-?\d+\.\d*(?:e[-+]?\d+)?")


def _same_but_float_digits(a: str, b: str) -> bool:
  """Whether ``a`` and ``b`` differ only in the last digits of floats."""
  if _FLOAT.sub("#", a) != _FLOAT.sub("#", b):
    return False
  fa, fb = _FLOAT.findall(a), _FLOAT.findall(b)
  return len(fa) == len(fb) and all(
    math.isclose(float(x), float(y), rel_tol=1e-5, abs_tol=1e-6)
    for x, y in zip(fa, fb)
  )


def _param(name):
  sc = registry.SCENARIOS[name]
  marks = [pytest.mark.xfail(strict=True, reason=sc.xfail)] if sc.xfail else []
  drift = _VERSION_DRIFT.get(name)
  if drift is not None and drift[0]:
    marks.append(pytest.mark.skip(reason=drift[1]))
  return pytest.param(name, marks=marks, id=name)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
  """``(legacy, hostcb)``: each scenario's normalized output, by name."""
  problem = harness.legacy_problem()
  if problem:
    pytest.skip(problem)
  cases = None
  if CASES is not None:
    cases = str(tmp_path_factory.mktemp("legacy-diff") / "cases.json")
    generate.write(cases, CASES)
  legacy, ours = harness.run_suites(
    [(harness.LEGACY_PYTHON, "legacy"), (sys.executable, "hostcb")], cases
  )
  return legacy, ours


@pytest.mark.parametrize("name", [_param(n) for n in NAMES])
def test_hostcb_output_matches_legacy(outputs, name):
  """hostcb prints, taps and returns what legacy did (or, for a documented
  difference, what the scenario states)."""
  sc = registry.SCENARIOS[name]
  legacy, ours = outputs
  assert name in ours, f"hostcb's runner did not run {name}"
  if sc.ours is not None:
    assert compare.ours_view(ours[name], sc.unordered) == compare.ours_view(
      sc.expect, sc.unordered
    ), sc.ours
    return
  assert name in legacy, f"legacy's runner did not run {name}"
  got = compare.ours_view(ours[name], sc.unordered)
  want = compare.expected_view(legacy[name], ours[name], sc.unordered)
  if not _DEVELOPMENT_JAX and got != want:
    assert _same_but_float_digits(got, want), (got, want)
    return
  assert got == want


PROGRAMS = [n for n in NAMES if n.startswith("gen_program_")]


@pytest.mark.parametrize(
  "name",
  PROGRAMS
  or [
    pytest.param(
      "none",
      marks=pytest.mark.skip(
        reason=_NO_CASES if CASES is None else "no generated programs"
      ),
    )
  ],
)
def test_taps_do_not_change_results(outputs, name):
  """A generated program computes the same with and without its taps."""
  assert "same without taps: True\n" in outputs[1][name]


def test_every_scenario_has_a_docstring():
  """Each hand-written scenario says what it does."""
  missing = [
    n
    for n in NAMES
    if not n.startswith("gen_")
    and not (registry.SCENARIOS[n].func.__doc__ or "").strip()
  ]
  assert missing == []
