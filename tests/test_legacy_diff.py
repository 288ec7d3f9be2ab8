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
import os
import sys

import pytest

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                    "legacy_diff")
sys.path.insert(0, HERE)

import hostcb  # noqa: E402

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

NAMES = [n for n, s in registry.SCENARIOS.items()
         if s.module in runner.HCB_MODULES]


def _param(name):
  sc = registry.SCENARIOS[name]
  marks = ([pytest.mark.xfail(strict=True, reason=sc.xfail)]
           if sc.xfail else [])
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
      [(harness.LEGACY_PYTHON, "legacy"), (sys.executable, "hostcb")], cases)
  return legacy, ours


@pytest.mark.parametrize("name", [_param(n) for n in NAMES])
def test_hostcb_output_matches_legacy(outputs, name):
  """hostcb prints, taps and returns what legacy did (or, for a documented
  difference, what the scenario states)."""
  sc = registry.SCENARIOS[name]
  legacy, ours = outputs
  assert name in ours, f"hostcb's runner did not run {name}"
  if sc.ours is not None:
    assert (compare.ours_view(ours[name], sc.unordered)
            == compare.ours_view(sc.expect, sc.unordered)), sc.ours
    return
  assert name in legacy, f"legacy's runner did not run {name}"
  assert (compare.ours_view(ours[name], sc.unordered)
          == compare.expected_view(legacy[name], ours[name], sc.unordered))


PROGRAMS = [n for n in NAMES if n.startswith("gen_program_")]


@pytest.mark.parametrize("name", PROGRAMS or [
    pytest.param("none", marks=pytest.mark.skip(
        reason=_NO_CASES if CASES is None else "no generated programs"))])
def test_taps_do_not_change_results(outputs, name):
  """A generated program computes the same with and without its taps."""
  assert "same without taps: True\n" in outputs[1][name]


def test_every_scenario_has_a_docstring():
  """Each hand-written scenario says what it does."""
  missing = [n for n in NAMES if not n.startswith("gen_")
             and not (registry.SCENARIOS[n].func.__doc__ or "").strip()]
  assert missing == []
