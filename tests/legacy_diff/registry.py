"""The scenario registry of the differential harness (imports no JAX).

A scenario is a small program written as legacy JAX code would be, a
function ``name(ctx)`` decorated with :func:`scenario`.  The runner
(:mod:`runner`) calls it with a :class:`runner.Context` that records what it
prints, what its tap functions receive and the values it shows; the pytest
side (``tests/test_legacy_diff.py``) compares the records of both
environments.

Each scenario states how its outputs must relate:

* nothing: legacy JAX and hostcb print exactly the same (after
  :func:`normalize.normalize`, which removes only what JAX itself changed);
* ``xfail="reason"``: a known difference that another change is fixing
  (the reason says which); the test is a strict xfail and flips when the
  fix lands;
* ``ours=reason`` with ``expect=text``: a documented difference, or a
  scenario that legacy itself fails (raises, crashes); hostcb's own output
  must then be ``expect`` exactly, and the reason says why;
* ``unordered=True``: taps from several devices arrive in no set order, so
  the lines are compared as sorted lists.
"""

from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True)
class Scenario:
  """One registered scenario and how its two outputs must relate."""

  name: str
  func: Callable | None
  module: str
  xfail: str | None = None
  ours: str | None = None
  expect: str | None = None
  unordered: bool = False


SCENARIOS: dict[str, Scenario] = {}


def scenario(
  func=None,
  *,
  xfail: str | None = None,
  ours: str | None = None,
  expect: str | None = None,
  unordered: bool = False,
):
  """Registers ``func`` as a scenario under its own name (see module doc)."""
  if (ours is None) != (expect is None):
    raise ValueError("a scenario with `ours` states its `expect` output too")
  if xfail is not None and not xfail.strip():
    raise ValueError("a scenario with `xfail` says why")

  def register(f):
    name = f.__name__
    if name in SCENARIOS:
      raise ValueError(f"duplicate scenario name {name!r}")
    SCENARIOS[name] = Scenario(
      name, f, f.__module__, xfail, ours, expect, unordered
    )
    return f

  return register(func) if func is not None else register


def add(name: str, func: Callable, module: str, **kw) -> None:
  """Registers a generated scenario (a closure) under ``name``."""
  if name in SCENARIOS:
    raise ValueError(f"duplicate scenario name {name!r}")
  SCENARIOS[name] = Scenario(name, func, module, **kw)
