"""Differential tests: hostcb's JAX callbacks behave as JAX's own.

The oracle is JAX itself, in this environment (0.10.2): the scenarios of
``tests/jax_diff/`` (one small program each) run in one interpreter per
implementation, with ``HOSTCB_TEST_DEVICES`` CPU devices:

* ``jax``: ``jax.debug.print``, ``jax.debug.callback``,
  ``jax.experimental.io_callback``, ``jax.pure_callback`` as JAX has them;
* ``hostcb``: ``hostcb.debug.print``, ``hostcb.debug.callback``,
  ``hostcb.io_callback``, ``hostcb.pure_callback``;
* ``installed``: JAX's names after ``hostcb.install(jax_callbacks=True)``;
* ``hostcb-python``: hostcb's functions again, on the Python back end
  alone (the native engine off), which serves what the engine cannot.

The runners import the hostcb that this interpreter imports (the
installed one, with its native engine, under ``make test``).

Each test compares one scenario: what it printed, what each callback
received and how often, what it returned, raised and logged.  hostcb's
output (both ways of getting it) must be JAX's exactly, or, for a
documented difference (``ours=`` in the scenario for a deliberate one,
``gap=`` for a known one still to fix, each with its reason), the output
the scenario states, which must still differ from JAX's.  See
``jax_diff/registry.py``.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys

import pytest

from hostcb._jax_internals.versions import jax_at_least

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jax_diff import harness, registry

for _m in registry.MODULES:
  importlib.import_module(f"jax_diff.{_m}")

IMPLS = ["jax", "hostcb", "installed", harness.PYTHON_BACK_END]
NAMES = list(registry.SCENARIOS)

# hostcb follows JAX 0.10.2 (the oracle).  These scenarios show what JAX
# changed since 0.8: the two-call form of debug.print/debug.callback (and
# so their signatures), and the words of the error for a string operand of
# io_callback.  Under an older JAX (`make check-oldest` runs 0.8.0) JAX
# itself is not their oracle.  Also an eager debug.print of a value that
# JAX cannot take: jax 0.8's bind does not check operands (0.10's does), so
# there hostcb prints the value and then raises jnp.asarray's TypeError
# where JAX raises InvalidInputException and prints nothing.
_SINCE_JAX_0_10 = {
  "print_argument_that_is_not_a_jax_value_error_eager",
  "api_signatures",
  "print_two_call_form",
  "print_two_call_form_option_names_as_fields",
  "print_two_call_form_extra_arguments_error",
  "cb_two_call_form",
  "cb_two_call_form_extra_arguments_error",
  "io_string_argument_error",
}


# Scenarios with operands narrower than a byte (int4, uint4).
_SUB_BYTE_SCENARIOS = {"arrays_of_narrow_dtypes"}


@pytest.fixture(scope="module")
def outputs() -> dict:
  """``{impl: {scenario name: output}}`` for the three implementations."""
  return dict(zip(IMPLS, harness.run_suites(IMPLS)))


def _diff(want: str, got: str, label: str) -> str:
  return "\n".join(
    difflib.unified_diff(
      want.splitlines(), got.splitlines(), "expected", label, lineterm=""
    )
  )


@pytest.mark.parametrize("name", NAMES)
def test_hostcb_matches_jax(outputs, name):
  """hostcb (called directly, and installed in place of JAX's functions)
  prints, calls back, returns and raises what JAX does in this scenario,
  or what the scenario documents."""
  if name in _SUB_BYTE_SCENARIOS and not jax_at_least(0, 10):
    import jax

    pytest.skip(
      f"{name} passes 4-bit operands, which hostcb refuses on jax "
      f"{jax.__version__} (XLA's layout there reads back as other values; "
      "test_jax_callbacks checks the error)"
    )
  if name in _SINCE_JAX_0_10 and not jax_at_least(0, 10):
    import jax

    pytest.skip(
      f"{name} shows JAX 0.10's API, which hostcb follows; jax "
      f"{jax.__version__} differs there (its own API drift)"
    )
  sc = registry.SCENARIOS[name]
  theirs = outputs["jax"].get(name)
  assert theirs is not None, f"JAX's runner did not run {name}"
  assert not theirs.startswith(("CRASHED", "HUNG")), theirs
  if sc.differs is not None:
    want = sc.expect
    assert registry.view(theirs, sc.unordered) != registry.view(
      want, sc.unordered
    ), (
      "JAX now does what the scenario documents as hostcb's "
      f"difference; the difference is gone: {sc.differs}"
    )
  else:
    want = theirs
  if sc.by_name is not None:
    assert registry.view(theirs, sc.unordered) != registry.view(
      sc.by_name_expect, sc.unordered
    ), f"JAX now does what hostcb's functions do by name: {sc.by_name}"
  for impl in IMPLS[1:]:
    ours = outputs[impl].get(name)
    assert ours is not None, f"the {impl} runner did not run {name}"
    expected, differs = want, sc.differs
    if sc.by_name is not None and impl != "installed":
      expected, differs = sc.by_name_expect, sc.by_name
    assert registry.view(ours, sc.unordered) == registry.view(
      expected, sc.unordered
    ), (
      f"{impl} differs from "
      + ("the documented output" if differs else "JAX")
      + ":\n"
      + _diff(expected, ours, impl)
      + (
        f"\n(documented: {differs})\nJAX's own output:\n{theirs}"
        if differs
        else ""
      )
    )


def test_every_scenario_module_is_registered():
  """Every ``s_*.py`` of ``jax_diff`` is one the runner imports."""
  here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax_diff")
  files = sorted(
    f[:-3] for f in os.listdir(here) if f.startswith("s_") and f.endswith(".py")
  )
  assert files == sorted(registry.MODULES)


def test_documented_differences_state_their_reason():
  """A scenario whose output is hostcb's own says why, in the scenario."""
  for sc in registry.SCENARIOS.values():
    if sc.differs is not None:
      assert sc.expect is not None and len(sc.differs.split()) >= 10, sc.name
    if sc.by_name is not None:
      assert len(sc.by_name.split()) >= 10, sc.name
