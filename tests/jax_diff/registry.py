"""The scenario registry of the JAX-callbacks harness (imports no JAX).

A scenario is a function ``name(ctx, api)`` decorated with
:func:`scenario`.  ``api`` holds the functions under test
(:class:`jax_diff.context.Api`): ``api.debug_print``,
``api.debug_callback``, ``api.io_callback``, ``api.pure_callback`` and
``api.effects_barrier``, which are JAX's own in one run and hostcb's in the
others.  ``ctx`` (:class:`jax_diff.context.Context`) records, in order, what
the scenario prints (it is ``sys.stdout`` while the scenario runs), what its
recording callbacks receive, the values it shows, what it raises and what
JAX's callback loggers log.

How the outputs must relate:

* nothing: hostcb's output is exactly JAX's.  The only normalization
  (:func:`jax_diff.values.normalize`) replaces the frames of a traceback
  embedded in a message (they name each implementation's files and lines)
  and object addresses;
* ``unordered=reason``: lines that come in no set order in JAX (from
  several devices, or unordered callbacks without data dependence, which
  XLA schedules as it likes); the lines are compared sorted;
* ``ours=reason`` with ``expect=text``: a documented, deliberate difference;
  hostcb's output must be ``expect`` exactly, and JAX's must still differ
  from it (the test shows both when they disagree);
* ``gap=reason`` with ``expect=text``: a known difference that is not
  deliberate, with what fixing it needs; checked as ``ours`` is, so that
  a fix (or any other change) shows;
* ``by_name=reason`` with ``by_name_expect=text``: a deliberate
  difference of hostcb's own functions called by name (``hostcb``, and
  ``hostcb-python``), whose output must be ``by_name_expect``, while the
  drop-ins that ``install(jax_callbacks=True)`` puts in place of JAX's
  (``installed``) still match JAX (or ``expect``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True)
class Scenario:
  """One registered scenario and how hostcb's output must relate to JAX's."""

  name: str
  func: Callable
  module: str
  ours: str | None = None
  expect: str | None = None
  unordered: str | None = None
  gap: str | None = None
  by_name: str | None = None
  by_name_expect: str | None = None

  @property
  def differs(self) -> str | None:
    """Why hostcb's output is ``expect`` rather than JAX's, if it is."""
    return self.ours or self.gap


SCENARIOS: dict[str, Scenario] = {}

#: The scenario modules, in the order in which the runner imports them.
MODULES = [
  "s_print",
  "s_callback",
  "s_transforms",
  "s_control",
  "s_io",
  "s_pure",
  "s_parallel",
  "s_barrier",
  "s_arrays",
]


def scenario(
  func=None,
  *,
  ours: str | None = None,
  expect: str | None = None,
  unordered: str | None = None,
  gap: str | None = None,
  by_name: str | None = None,
  by_name_expect: str | None = None,
):
  """Registers ``func`` as a scenario under its own name (module doc)."""
  if ours is not None and gap is not None:
    raise ValueError("a difference is deliberate (`ours`) or not (`gap`)")
  if (ours is None and gap is None) != (expect is None):
    raise ValueError(
      "a scenario with `ours` or `gap` states its `expect` "
      "output, and only such a scenario"
    )
  if (by_name is None) != (by_name_expect is None):
    raise ValueError("a scenario with `by_name` states `by_name_expect`")
  for reason in (ours, unordered, gap, by_name):
    if reason is not None and len(reason.split()) < 4:
      raise ValueError(f"say why, in words: {reason!r}")

  def register(f):
    name = f.__name__
    if name in SCENARIOS:
      raise ValueError(f"duplicate scenario name {name!r}")
    if not (f.__doc__ or "").strip():
      raise ValueError(f"scenario {name!r} has no docstring")
    module = f.__module__.rsplit(".", 1)[-1]
    SCENARIOS[name] = Scenario(
      name, f, module, ours, expect, unordered, gap, by_name, by_name_expect
    )
    return f

  return register(func) if func is not None else register


def view(text: str, unordered: str | None) -> str:
  """``text`` as compared: its lines, sorted for an unordered scenario."""
  lines = text.splitlines()
  return "\n".join(sorted(lines) if unordered else lines)
