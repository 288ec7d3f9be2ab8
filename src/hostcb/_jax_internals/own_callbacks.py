"""JAX's own callback functions, for hostcb's front ends that replace them.

Part of :mod:`hostcb._jax_internals`, the only place that imports ``jax._src``.
Checked against jax 0.8.0, 0.10.2 and 0.12.0.1:

* the functions that ``jax.debug.callback``, ``jax.debug.print``,
  ``jax.experimental.io_callback``, ``jax.pure_callback`` and
  ``jax.debug.breakpoint`` are, in the modules that define them
  (``jax._src.debugging``, ``jax._src.callback``, ``jax._src.debugger.core``),
  so that hostcb can hand work back to them and find every name bound to
  them (:mod:`hostcb.jax_callbacks`);
* ``core.shaped_abstractify``, which decides which arguments of
  ``jax.debug.callback`` and ``jax.debug.print`` JAX passes to the device
  (arrays and numbers) and which it keeps on the host as they are (strings,
  other objects);
* the partial-evaluation rule registry (``checkpoint``), where the taps of
  ``hostcb.debug`` get the rule JAX gives its debug callbacks
  (:func:`rematerialize_as_jax_debug`);
* ``callback._IOEffect`` and ``callback._OrderedIOEffect``, the effects of
  JAX's ``io_callback``, which hostcb's ``io_callback`` carries beside its
  own (:func:`jax_io_effect`);
* ``debugging.ordered_debug_effect``, which hostcb's ordered debug callbacks
  carry beside its own (:func:`jax_ordered_debug_effect`).
"""

from __future__ import annotations

import jax
from jax._src import callback as _callback
from jax._src import core as _core
from jax._src import debugging as _debugging
from jax._src.debugger import core as _debugger
from jax._src.interpreters import partial_eval as _pe

from hostcb._jax_internals.versions import (
  CHECKED_RANGE,
  changed,
  check_shape,
  require,
)

__all__ = [
  "jax_callback_functions",
  "is_jax_value",
  "rematerialize_as_jax_debug",
  "jax_io_effect",
  "jax_ordered_debug_effect",
  "is_jax_callback_effect",
]

_DEFINED_IN = {
  "debug_callback": (_debugging, "debug_callback"),
  "debug_print": (_debugging, "debug_print"),
  "io_callback": (_callback, "io_callback"),
  "pure_callback": (_callback, "pure_callback"),
  "debug_breakpoint": (_debugger, "breakpoint"),
}


def jax_callback_functions() -> dict:
  """``{"debug_callback": f, "debug_print": f, "io_callback": f,
  "pure_callback": f, "debug_breakpoint": f}``: JAX's own functions, from the modules that define
  them (unwrapped if hostcb already replaced them there)."""
  functions = {}
  for key, (module, name) in _DEFINED_IN.items():
    f = getattr(module, name, None)
    if f is None:
      raise RuntimeError(
        f"hostcb: jax {jax.__version__} has no {module.__name__}.{name}, "
        "which hostcb's replacement of JAX's callbacks needs (checked "
        f"against {CHECKED_RANGE})"
      )
    functions[key] = getattr(f, "_hostcb_replaces", f)
  return functions


def is_jax_value(x) -> bool:
  """Whether JAX stages ``x`` as an operand of a debug callback (an array
  or a number), rather than keeping it on the host as it is."""
  try:
    _core.shaped_abstractify(x)
    return True
  except (AssertionError, TypeError):
    return False


def rematerialize_as_jax_debug(prim, is_debug) -> None:
  """Under ``checkpoint``, the equations of ``prim`` (an identity with a
  side effect, see :func:`hostcb._jax_internals.rematerialize_on_backward_pass`,
  whose rule they keep otherwise) for which ``is_debug(params)`` run again
  when JAX's debug callbacks do.

  The one case where JAX's rule differs: the policy saves the operands and
  they are all available in the backward pass anyway; JAX's debug callback
  then runs in both passes (the legacy tap, in the forward pass only).
  """
  what = "to rematerialize its debug prints as JAX's under checkpoint"
  rules = check_shape(
    require(_pe, "partial_eval_jaxpr_custom_rules", what),
    "jax._src.interpreters.partial_eval.partial_eval_jaxpr_custom_rules",
    what,
    types=dict,
  )
  previous = rules.get(prim)
  if not callable(previous):
    raise changed(
      "jax._src.interpreters.partial_eval.partial_eval_jaxpr_custom_rules"
      f"[{prim}]",
      "a rule (hostcb's primitive registered as an effectful identity)",
      repr(previous),
      what,
    )

  def rule(saveable, unks_in, inst_in, eqn):
    if (
      is_debug(eqn.params)
      and not any(unks_in)
      and all(inst_in)
      and saveable(prim, *[v.aval for v in eqn.invars], **eqn.params)
    ):
      n_out = len(eqn.outvars)
      again = eqn.replace(outvars=[_core.DropVar(v.aval) for v in eqn.outvars])
      return eqn, again, [False] * n_out, [False] * n_out, []
    return previous(saveable, unks_in, inst_in, eqn)

  rules[prim] = rule


def jax_io_effect(ordered: bool):
  """The effect of JAX's own ``io_callback`` (``ordered`` or not).

  hostcb's ``io_callback`` carries it beside hostcb's effect, which orders
  it and keeps it alive.  JAX's transformations refuse an ``io_callback``
  where they find this effect (``vmap`` of a ``cond``, of a ``while_loop``
  with a batched predicate, partial evaluation of ``checkpoint``), with
  their own errors; carrying it makes them refuse hostcb's in the same
  places, with the same words.  Fast dispatch drops it from one-device
  executables with hostcb's effect (:mod:`.dispatch`).
  """
  what = "to give hostcb's io_callback the effect of JAX's io_callback"
  return require(
    _callback, "_OrderedIOEffect" if ordered else "_IOEffect", what, verb="uses"
  )


def jax_ordered_debug_effect():
  """The effect of JAX's ``jax.debug.callback``/``jax.debug.print`` with
  ``ordered=True``.

  hostcb's ordered debug callbacks carry it beside hostcb's effect: JAX
  refuses it in a computation over several devices (``pmap``, sharded
  ``jit``, ``shard_map``: "The following ordered effects are not supported
  for more than 1 device"), and so refuses hostcb's where it refuses its
  own.  Fast dispatch drops it from one-device executables with hostcb's
  effect (:mod:`.dispatch`).
  """
  return require(
    _debugging,
    "ordered_debug_effect",
    "to give hostcb's ordered debug callbacks the effect of JAX's",
    verb="uses",
  )


def is_jax_callback_effect(effect) -> bool:
  """Whether ``effect`` is one that hostcb's front ends carry for JAX's
  sake: JAX's ``io_callback`` effects or its ordered debug effect."""
  return (
    effect is getattr(_callback, "_IOEffect", None)
    or effect is getattr(_callback, "_OrderedIOEffect", None)
    or effect is getattr(_debugging, "ordered_debug_effect", None)
  )
