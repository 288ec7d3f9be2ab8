"""A one-device executable's lone tap or call without its token.

Part of :mod:`hostcb._jax_internals`, the only place that imports
``jax._src``; checked against jax 0.8.0, 0.10.2 and 0.12.0.1 (the MLIR
that hostcb's lowering makes for a tap or call: a ``stablehlo.custom_call``
whose first operand is the effect's token and whose first result is the
next token; ``_cached_lowering_to_hlo``'s ``platforms``, its last
positional argument).

In fast-dispatch mode (:mod:`.dispatch`), the ``main`` of a one-device
executable makes its effect's token itself (``stablehlo.create_token``),
and inside the computation that token chains the taps and calls in
program order.  Where exactly one hostcb custom call uses that token, and
nothing uses the token it returns, the token orders nothing: the custom
call is its only user.  XLA still pays for it on every run, in the
custom call's operands and results (a tuple where a call has a result
too): about 0.2 µs per dispatch of a tiny function on a 2-core CPU, a
sixth of what a tapped dispatch adds.
:func:`drop_lone_tokens` rewrites such a custom call without the token
operand and the token result.  Its handlers take the token as optional
(``handlers.cc``, ``call.cc``).  The custom call keeps its
``has_side_effect``: XLA neither removes nor merges a tap or an effectful
call (a pure call has no such flag, as before it carried the token).  Its
order against the computations dispatched before and after it is the CPU
client's (:mod:`.dispatch`), as before.

Only on CPU (the CUDA handlers were not checked without a token: no GPU
was at hand) and only where the
token has that one user: several taps in one function, or one inside a
loop, a branch or a nested call, keep their tokens.
"""

from __future__ import annotations

import logging
from typing import Any

from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import hlo as _hlo

__all__ = ["drop_lone_tokens", "on_cpu"]

logger = logging.getLogger("hostcb")

# The CPU targets of hostcb's taps and calls (hostcb._engine.native's names,
# which this layer does not import; tests/test_token_removal.py checks that
# they agree): each takes an optional token first and returns the token
# first only if one came in.
TARGETS = frozenset(
  {
    "hostcb_tap",
    "hostcb_tap_v1",
    "hostcb_call",
    "hostcb_call_one",
    "hostcb_call_v1",
    "hostcb_noop",  # (benchmarks' empty call: takes and returns anything)
  }
)

# Attributes of a custom call that name its operands or results one by one:
# the token's entries leave with it.  Shardings (per value) go altogether:
# on one device they place nothing.
_PER_OPERAND = "operand_layouts"
_PER_RESULT = "result_layouts"
_SHARDINGS = ("mhlo.sharding", "sdy.sharding")
# Where one of these is not empty, the custom call is left as it is
# (hostcb's taps and calls on CPU have them empty or not at all).
_REFUSED = ("output_operand_aliases", "called_computations")


def _attributes(op: Any) -> dict[str, Any]:
  """``op``'s attributes by name (indexed: iterating the map yields names
  or named attributes, depending on the MLIR bindings)."""
  attrs = op.attributes
  named = (attrs[i] for i in range(len(attrs)))
  return {a.name: a.attr for a in named}


def _is_token(t: Any) -> bool:
  return _hlo.TokenType.isinstance(t)


def _only_user(value: Any) -> Any:
  """The one operation that uses ``value`` once, else None."""
  users = [u.owner for u in value.uses]
  return users[0] if len(users) == 1 else None


def _droppable(op: Any, token: Any) -> bool:
  """Whether ``op`` is a hostcb CPU custom call that takes ``token`` as its
  first operand and returns one token first, used by nothing."""
  if op is None or op.name != "stablehlo.custom_call":
    return False
  attrs = _attributes(op)
  if any(len(_ir.ArrayAttr(attrs[a])) for a in _REFUSED if a in attrs):
    return False
  target = attrs.get("call_target_name")
  if target is None or _ir.StringAttr(target).value not in TARGETS:
    return False
  operands, results = list(op.operands), list(op.results)
  if not operands or operands[0] != token:
    return False
  if any(_is_token(v.type) for v in operands[1:]):
    return False
  if not results or not _is_token(results[0].type):
    return False
  if any(_is_token(r.type) for r in results[1:]):
    return False
  return not list(results[0].uses)


def _without_first(attr: Any) -> Any:
  return _ir.ArrayAttr.get(list(_ir.ArrayAttr(attr))[1:])


def _drop(op: Any, make_token: Any) -> None:
  """Replaces custom call ``op`` by one without its token operand and
  result; erases ``make_token`` (the token's maker, now unused)."""
  attrs = _attributes(op)
  for name in _SHARDINGS:
    attrs.pop(name, None)
  for name in (_PER_OPERAND, _PER_RESULT):
    if name in attrs:
      attrs[name] = _without_first(attrs[name])
  results = list(op.results)[1:]
  with _ir.InsertionPoint(op), op.location:
    new = _ir.Operation.create(
      "stablehlo.custom_call",
      results=[r.type for r in results],
      operands=list(op.operands)[1:],
      attributes=attrs,
    )
  for old, fresh in zip(results, new.results):
    old.replace_all_uses_with(fresh)
  op.erase()
  make_token.erase()


def drop_lone_tokens(module: Any, tokens: list[Any]) -> None:
  """Drops each of ``tokens`` (values that ``create_token`` ops of
  ``module``'s ``main`` made, :mod:`.dispatch`) whose one user is a
  hostcb CPU tap or call that only passes it on to nothing (the module
  docstring)."""
  with module.context:
    for token in tokens:
      op = _only_user(token)
      if _droppable(op, token):
        _drop(op, token.owner)


def on_cpu(args: tuple, kwargs: dict) -> bool:
  """Whether a call of ``_cached_lowering_to_hlo`` lowers for the CPU
  alone: its ``platforms`` argument, by name or as its last positional
  argument (where JAX's callers pass it on jax 0.8.0, 0.10.2 and
  0.12.0.1, whose positions before it differ).  Where that is no tuple of
  platform names (another JAX), False: the token is kept (correct, about
  0.2 µs per dispatch slower), and the first such lowering logs why."""
  platforms = kwargs.get("platforms", args[-1] if args else None)
  if not (
    isinstance(platforms, tuple)
    and platforms
    and all(isinstance(p, str) for p in platforms)
  ):
    if not _warned[0]:
      _warned[0] = True
      logger.warning(
        "hostcb: this JAX's _cached_lowering_to_hlo does not take its "
        "platforms last (got %r): a one-device executable's lone tap keeps "
        "its token (about 0.2 µs per dispatch more). hostcb was checked on "
        "jax 0.8.0 to 0.12.0.1; please report this JAX version",
        type(platforms).__name__,
      )
    return False
  return platforms == ("cpu",)


_warned = [False]
