"""Taps and calls that stay in their loop when JAX hoists loop-invariant work.

Part of :mod:`hostcb._jax_internals`, the only place that imports ``jax._src``;
checked against jax 0.8.0, 0.10.2 and 0.12.0.1.

When JAX differentiates a ``scan`` (``grad``, ``vjp``, ``linearize``, and
``checkpoint`` of a loop), it moves out of the loop what depends only on the
loop's constants, so that it is computed once instead of once per step.  It
does so by partially evaluating the loop's body with the constants known and
the carry and the sliced inputs unknown: an equation whose operands are all
known is evaluated there and then, outside the loop.  For a pure equation
that is an optimization; for a tap of a loop-invariant value it is a tap that
runs once instead of once per step.  The passes:

* ``jax._src.lax.control_flow.loops._scan_known_hoisting`` (a differentiated
  ``scan``: ``_scan_linearize``, ``_scan_partial_eval``);
* the hoisting inside ``_scan_partial_eval_custom``, the rule of ``scan`` in
  ``jax._src.interpreters.partial_eval.partial_eval_jaxpr_custom_rules``
  (``checkpoint``).

:func:`keep_in_loops` (on the first bind of a hostcb primitive, not at
import; :mod:`.patches` undoes it) wraps both, so that while they run (in
this thread) an equation given :func:`stay_in_loops` that would be evaluated
there is staged in the loop instead, with its known operands as loop
constants.  Everything else is still hoisted: a tap is an identity, so what
uses its results still sees known values.  Equations nested in the body stay
too.  A ``jit`` or an inner ``scan`` is split by its own partial-evaluation
rule, which meets the tap there.  A ``cond``, ``while_loop`` or
``checkpoint`` that holds such an equation is staged whole in the loop
(JAX's rules of these evaluate one whose operands are all known outside the
loop, or keep the part that taps only if its results are used).  A
``custom_jvp`` or ``custom_vjp`` call that holds one, which JAX evaluates
whole outside the loop when its operands are all known, runs inline
instead, as JAX runs one whose operands are not all known (its
``get_bind_params`` notes it, ``JaxprTrace``'s rule inlines it).

Each pass wrapper works only where the loop's body carries hostcb's effect:
a program without taps and calls is hoisted as before.  During a pass,
``jax._src.interpreters.partial_eval._partial_eval_jaxpr_nounits`` (cached
by JAX per jaxpr) is called on a copy of its jaxpr, so that a split made
while taps stay in loops and one made without are never confused.

:func:`in_hoisting_pass` tells a rule whether it runs in such a pass.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

from jax._src import core as _core
from jax._src.interpreters import partial_eval as _pe
from jax._src.lax.control_flow import loops as _loops

from hostcb._jax_internals import patches
from hostcb._jax_internals.core import HostCallbackEffect
from hostcb._jax_internals.versions import check_shape, require

__all__ = ["stay_in_loops", "keep_in_loops", "in_hoisting_pass"]

_WHAT = "to keep taps and calls in the loops that JAX differentiates"

_pass = threading.local()
# primitive -> stays(params): whether its equation stays in its loop.
_staying: dict[Any, Callable[[dict], bool]] = {}


def in_hoisting_pass() -> bool:
  """Whether this thread is in one of JAX's hoisting passes of a loop."""
  return getattr(_pass, "on", False)


@contextlib.contextmanager
def _hoisting_pass(effects) -> Iterator[None]:
  """Marks a hoisting pass over a body with ``effects``: only where the body
  carries hostcb's effect (else nothing changes)."""
  if in_hoisting_pass() or not any(
    isinstance(e, HostCallbackEffect) for e in effects
  ):
    yield
    return
  _pass.on = True
  try:
    yield
  finally:
    _pass.on = False
    _pass.inline = None


def stay_in_loops(
  prim: Any, stays: Callable[[dict], bool], identity: bool
) -> None:
  """Gives ``prim`` the rule that keeps its equations in their loops in a
  hoisting pass: an equation with ``stays(params)`` whose operands are all
  known is staged in the loop, its known operands becoming the loop's
  constants.  ``identity``: its results are its operands (a tap), which
  stay known, so that what uses them is still hoisted; else they are
  computed in the loop.  Outside a hoisting pass the rule is JAX's default
  (registered for hostcb's own primitive; JAX's are not changed)."""
  _staying[prim] = stays

  def rule(trace, *tracers, **params):
    if (
      in_hoisting_pass()
      and stays(params)
      and all(t.pval.is_known() for t in tracers)
    ):
      staged = trace.default_process_primitive(
        prim, [trace.instantiate_const(t) for t in tracers], params
      )
      return list(tracers) if identity else staged
    return trace.default_process_primitive(prim, tracers, params)

  _pe.custom_partial_eval_rules[prim] = rule


def _holds_staying(jaxpr: Any) -> bool:
  """Whether ``jaxpr`` (a ``Jaxpr``), or one nested in it, has an
  equation that stays in its loop."""
  for eqn in jaxpr.eqns:
    if not any(isinstance(e, HostCallbackEffect) for e in eqn.effects):
      continue
    stays = _staying.get(eqn.primitive)
    if stays is not None and stays(eqn.params):
      return True
    if any(_holds_staying(j) for j in _core.jaxprs_in_params(eqn.params)):
      return True
  return False


def _scan_known_hoisting(original: Callable) -> Callable:
  def hoisting(jaxpr_known, *rest):
    with _hoisting_pass(jaxpr_known.effects):
      return original(jaxpr_known, *rest)

  return hoisting


def _scan_partial_eval_custom(original: Callable) -> Callable:
  # The hoisting is the only partial evaluation in JAX's rule (and in the
  # rules it calls) that JaxprTrace does: the rest is
  # partial_eval_jaxpr_custom, which the mark does not change.
  def rule(saveable, unks_in, inst_in, eqn):
    with _hoisting_pass(eqn.params["jaxpr"].effects):
      return original(saveable, unks_in, inst_in, eqn)

  return rule


def _staged_whole(prim: Any, original: Callable) -> Callable:
  # In a hoisting pass JAX's rules of these primitives evaluate one whose
  # operands are all known outside the loop, or stage the part that taps
  # without keeping it for its effect (it goes when nothing uses its
  # results): staged whole instead, by JAX's default rule, which keeps it.
  def rule(trace, *tracers, **params):
    if in_hoisting_pass() and any(
      _holds_staying(j) for j in _core.jaxprs_in_params(params)
    ):
      return trace.default_process_primitive(
        prim, [trace.instantiate_const(t) for t in tracers], params
      )
    return original(trace, *tracers, **params)

  return rule


def _marking_bind_params(original: Callable) -> Callable:
  # A custom_jvp/custom_vjp call evaluated from a jaxpr in a hoisting pass:
  # its function is noted when its jaxpr holds an equation that stays, for
  # the JaxprTrace rule that meets it next (_inlined_call).
  def get_bind_params(self, params):
    bind_params = original(self, params)
    if in_hoisting_pass() and any(
      _holds_staying(j) for j in _core.jaxprs_in_params(params)
    ):
      if isinstance(bind_params, dict):  # jax 0.10 on: (fun, ...) in it
        _pass.inline = bind_params["subfuns"][0]
      else:  # jax 0.8: ([fun, ...], params)
        _pass.inline = bind_params[0][0]
    return bind_params

  return get_bind_params


def _inlined_call(original: Callable, n_rules: int) -> Callable:
  # JAX evaluates a custom_jvp/custom_vjp call whose operands are all known
  # whole, outside the loop: one noted above runs inline instead, where its
  # taps stay in the loop and the rest is hoisted (as JAX's rule does for
  # one with operands that vary: the custom rule is not kept there).
  # ``n_rules``: the rule functions between ``fun`` and the operands.
  def process(self, prim, fun, *rest, **params):
    if getattr(_pass, "inline", None) is fun:
      _pass.inline = None
      tracers = [self.to_jaxpr_tracer(t) for t in rest[n_rules]]
      if all(t.is_known() for t in tracers):
        with _core.set_current_trace(self):
          return fun.call_wrapped(*tracers)
    return original(self, prim, fun, *rest, **params)

  return process


def _split_uncached(original: Callable) -> Callable:
  def split(jaxpr, *rest):
    if in_hoisting_pass():  # a copy: JAX's cache holds it weakly
      jaxpr = jaxpr.replace()  # (a ClosedJaxpr; a Jaxpr from jax 0.12)
    return original(jaxpr, *rest)

  return split


def _whole_primitives() -> dict:
  """The primitives staged whole in a hoisting pass, by name (for the
  record of patches)."""
  from jax._src import ad_checkpoint as _checkpoint  # noqa: PLC0415
  from jax._src.lax.control_flow import conditionals  # noqa: PLC0415

  return {
    "cond": require(conditionals, "cond_p", _WHAT, verb="uses"),
    "while": require(_loops, "while_p", _WHAT, verb="uses"),
    "checkpoint": require(_checkpoint, "remat_p", _WHAT, verb="uses"),
  }


def _custom_calls() -> dict:
  """The custom-derivative calls run inline in a hoisting pass: name ->
  (their primitive's class, JaxprTrace's method, rule functions)."""
  from jax._src import custom_derivatives as _custom  # noqa: PLC0415

  found = {}
  for name, prim, method, n_rules in (
    ("custom_jvp", "custom_jvp_call_p", "process_custom_jvp_call", 1),
    ("custom_vjp", "custom_vjp_call_p", "process_custom_vjp_call", 2),
  ):
    cls = type(require(_custom, prim, _WHAT, verb="uses"))
    check_shape(
      vars(cls).get("get_bind_params"),
      f"{cls.__module__}.{cls.__qualname__}.get_bind_params",
      _WHAT,
      fields=("__call__",),
    )
    require(_pe.JaxprTrace, method, _WHAT)
    found[name] = (cls, method, n_rules)
  return found


def _rule_of(rules: dict, prim: Any, symbol: str) -> Callable:
  return check_shape(rules.get(prim), symbol, _WHAT, fields=("__call__",))


def keep_in_loops() -> None:
  """Wraps JAX's hoisting passes of loops (recorded in :mod:`.patches`,
  which undoes it; a second call while they are in place changes
  nothing).  Called on the first bind of a hostcb primitive, not at
  import."""
  if patches.is_installed("taps stay in loops"):
    return
  where = "jax._src.interpreters.partial_eval"
  hoisting = require(_loops, "_scan_known_hoisting", _WHAT)
  split = require(_pe, "_partial_eval_jaxpr_nounits", _WHAT)
  custom_rules = check_shape(
    require(_pe, "partial_eval_jaxpr_custom_rules", _WHAT),
    f"{where}.partial_eval_jaxpr_custom_rules",
    _WHAT,
    types=dict,
  )
  rules = check_shape(
    require(_pe, "custom_partial_eval_rules", _WHAT),
    f"{where}.custom_partial_eval_rules",
    _WHAT,
    types=dict,
  )
  scan_p = require(_loops, "scan_p", _WHAT, verb="uses")
  scan_symbol = f"{where}.partial_eval_jaxpr_custom_rules[scan]"
  scan_rule = _rule_of(custom_rules, scan_p, scan_symbol)
  whole = {
    name: (
      prim,
      _rule_of(rules, prim, f"{where}.custom_partial_eval_rules[{name}]"),
    )
    for name, prim in _whole_primitives().items()
  }
  calls = _custom_calls()
  patches.install(
    "taps stay in loops",
    _loops,
    "_scan_known_hoisting",
    _scan_known_hoisting(hoisting),
  )
  patches.install(
    "taps stay in loops (splits)",
    _pe,
    "_partial_eval_jaxpr_nounits",
    _split_uncached(split),
  )
  patches.install_item(
    "taps stay in loops (checkpoint of scan)",
    custom_rules,
    scan_p,
    _scan_partial_eval_custom(scan_rule),
    scan_symbol,
  )
  for name, (cls, method, n_rules) in calls.items():
    patches.install(
      f"taps stay in loops ({name})",
      cls,
      "get_bind_params",
      _marking_bind_params(vars(cls)["get_bind_params"]),
    )
    patches.install(
      f"taps stay in loops ({name}, inline)",
      _pe.JaxprTrace,
      method,
      _inlined_call(getattr(_pe.JaxprTrace, method), n_rules),
    )
  for name, (prim, rule) in whole.items():
    patches.install_item(
      f"taps stay in loops ({name})",
      rules,
      prim,
      _staged_whole(prim, rule),
      f"{where}.custom_partial_eval_rules[{name}]",
    )


patches.when_first_needed(keep_in_loops)
