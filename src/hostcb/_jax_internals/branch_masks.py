"""Taps that fire only for the batch elements that take a branch.

Part of :mod:`hostcb._jax_internals`; checked against jax 0.8.0, 0.10.2 and
0.12.0.1.

``vmap`` of a ``cond`` (or ``switch``) whose index is batched runs every
branch for every element and selects the results; ``vmap`` of a
``while_loop`` whose predicate is batched runs the body for every element
until the last one is done.  A tap in such a branch or body would fire for
elements that never took it.  :func:`install` wraps JAX's batching rules
of ``cond`` and ``while`` (recorded in :mod:`.patches`): where a branch or
body holds a tap that takes a mask (:class:`TapMasks`), the rule rewrites
it first, so that each such tap gets, as its first operand, whether the
element takes the branch (``index == i``; for a loop body, the loop's
condition on the element's carry), ANDed through nested ``cond`` s and
passed into nested ``scan``, ``while``, ``cond``, ``jit`` and
``checkpoint`` bodies as an
extra operand; then JAX's own rule batches the rewritten jaxprs.  The
host calls the tap function only for the elements whose mask holds.

A jaxpr without such taps is never rewritten: JAX's rule runs on it as
it is.  A tap inside another higher-order primitive (``custom_jvp``,
``custom_vjp``, ``shard_map``, a ``jit`` with shardings of its own)
keeps firing for the whole batch, with a :class:`BranchMaskWarning` once
per kind of primitive, naming it and the fix.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from typing import Any, Callable

import numpy as np
from jax._src import ad_checkpoint as _ad_checkpoint
from jax._src import core as _core
from jax._src import linear_util as _lu
from jax._src import pjit as _pjit
from jax._src import source_info_util as _source_info
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import partial_eval as _pe
from jax._src.lax import lax as _lax
from jax._src.lax.control_flow import conditionals as _conditionals
from jax._src.lax.control_flow import loops as _loops

from hostcb._jax_internals import patches
from hostcb._jax_internals.versions import changed, require

__all__ = ["TapMasks", "BranchMaskWarning", "install"]


class BranchMaskWarning(UserWarning):
  """A tap in a ``cond`` branch (or a batched ``while`` body) under
  ``vmap`` fires for every batch element, not only those that take the
  branch: it sits inside a primitive whose body hostcb does not rewrite."""


@dataclasses.dataclass(frozen=True)
class TapMasks:
  """The taps that take a mask: equations of ``primitive`` for which
  ``maskable(params)`` (no mask yet) or ``masked(params)`` (their first
  operand is the mask); ``with_mask(params)`` are the parameters of the
  masked tap."""

  primitive: Any
  maskable: Callable[[dict], bool]
  masked: Callable[[dict], bool]
  with_mask: Callable[[dict], dict]

  def kind(self, eqn) -> int:
    """0: not such a tap; 1: one without its mask; 2: one with it."""
    if eqn.primitive is not self.primitive:
      return 0
    if self.masked(eqn.params):
      return 2
    return 1 if self.maskable(eqn.params) else 0


_masks: list[TapMasks] = []  # the one set of taps, from install()
_warned: set = set()  # the primitives already warned of
_BOOL = _core.ShapedArray((), np.dtype(np.bool_))


def install(masks: TapMasks) -> None:
  """Wraps JAX's batching rules of ``cond`` and ``while`` (once, recorded
  in :mod:`.patches`) so that they mask ``masks``' taps."""
  if patches.is_installed("branch masks: cond"):
    return
  what = "to fire taps only for the batch elements that take a branch"
  rules = require(_batching, "fancy_primitive_batchers", what)
  with patches.lock:
    _masks[:] = [masks]
    for prim, name, wrap in (
      (_conditionals.cond_p, "branch masks: cond", _cond_rule),
      (_loops.while_p, "branch masks: while", _while_rule),
    ):
      original = rules.get(prim)
      if not callable(original):
        raise changed(
          f"jax._src.interpreters.batching.fancy_primitive_batchers[{prim}]",
          "a batching rule",
          repr(original),
          what,
        )
      patches.install_item(
        name,
        rules,
        prim,
        wrap(original),
        f"jax._src.interpreters.batching.fancy_primitive_batchers[{prim}]",
      )


# ---------------------------------------------------------- finding taps
def _has_taps(jaxpr) -> bool:
  """Whether the (open) ``jaxpr`` holds a tap that takes a mask, at any
  depth."""
  if not _masks:
    return False
  masks = _masks[0]
  for eqn in jaxpr.eqns:
    if masks.kind(eqn):
      return True
    if any(_has_taps(j) for j in _core.jaxprs_in_params(eqn.params)):
      return True
  return False


# What users call the primitives that a warning names.
_CALLED = {
  "custom_jvp_call": "jax.custom_jvp",
  "custom_vjp_call": "jax.custom_vjp",
  "custom_vjp_call_jaxpr": "jax.custom_vjp",
  "shard_map": "jax.shard_map",
  "jit": "jax.jit",
  "pjit": "jax.jit",
}


def _warn_whole_batch(eqn, why: str) -> None:
  name = eqn.primitive.name
  if name in _warned:
    return
  _warned.add(name)
  called = _CALLED.get(name)
  what = f"`{name}` (`{called}`)" if called else f"`{name}`"
  warnings.warn(
    f"hostcb: a tap inside {what} in a branch of a `cond` (or the body "
    "of a `while_loop`) under `vmap` fires for every batch element, not "
    f"only for those that take the branch ({why}). To print or call "
    "back only for those, move the call out of it into the "
    "branch itself, or pass the branch's condition to it and test it "
    "in the callback.",
    BranchMaskWarning,
    stacklevel=2,
  )


# ------------------------------------------------------------ rewriting
def _rewritten(closed, extra_avals: list, mask_of: Callable):
  """``closed`` (a ClosedJaxpr) with ``extra_avals`` as new leading
  inputs, and its taps masked by ``mask_of(extra, args)``."""
  k = len(extra_avals)

  def fun(*args):
    extra, rest = list(args[:k]), list(args[k:])
    return _evaluate(closed.jaxpr, closed.consts, rest, mask_of(extra, rest))

  info = closed.jaxpr.debug_info
  names = getattr(info, "arg_names", None)
  if names is not None:
    info = info._replace(arg_names=("",) * k + tuple(names))
  jaxpr, _, consts = _pe.trace_to_jaxpr_dynamic(
    _lu.wrap_init(fun, debug_info=info), [*extra_avals, *closed.in_avals]
  )
  return _closed(jaxpr, consts)


def _closed(jaxpr, consts):
  """A closed jaxpr: a ``ClosedJaxpr`` (jax < 0.12), or the jaxpr with its
  consts (jax 0.12 merged the two classes)."""
  closed_jaxpr = getattr(_core, "ClosedJaxpr", None)
  if closed_jaxpr is not None:
    return closed_jaxpr(jaxpr, consts)
  return jaxpr.with_consts(consts)


def _given(extra, args):
  return extra[0]


def _bind(eqn, invals: list) -> list:
  got = eqn.primitive.get_bind_params(eqn.params)
  subfuns, params = got if isinstance(got, tuple) else ((), got)
  out = eqn.primitive.bind(*subfuns, *invals, **params)
  return out if eqn.primitive.multiple_results else [out]


def _evaluate(jaxpr, consts, args: list, mask) -> list:
  """Evaluates ``jaxpr`` as ``core.eval_jaxpr`` does, each tap masked by
  ``mask`` (ANDed with its own where it has one)."""
  env: dict = {}

  def read(v):
    return v.val if isinstance(v, _core.Literal) else env[v]

  for v, x in zip([*jaxpr.constvars, *jaxpr.invars], [*consts, *args]):
    env[v] = x
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    name_stack = _source_info.current_name_stack() + eqn.source_info.name_stack
    with (
      _source_info.user_context(
        eqn.source_info.traceback, name_stack=name_stack
      ),
      eqn.ctx.manager,
    ):
      outs = _masked_eqn(eqn, invals, mask)
      if outs is None:
        outs = _bind(eqn, invals)
    for v, x in zip(eqn.outvars, outs):
      if not isinstance(v, _core.DropVar):
        env[v] = x
  return [read(v) for v in jaxpr.outvars]


def _masked_eqn(eqn, invals: list, mask) -> list | None:
  """The outputs of ``eqn`` with its taps masked, or None where it holds
  none (bound as it is)."""
  masks = _masks[0]
  kind = masks.kind(eqn)
  if kind == 1:
    params = masks.with_mask(eqn.params)
    return masks.primitive.bind(mask, *invals, **params)[1:]
  if kind == 2:
    both = _lax.bitwise_and(invals[0], mask)
    return masks.primitive.bind(both, *invals[1:], **eqn.params)
  if not any(_has_taps(j) for j in _core.jaxprs_in_params(eqn.params)):
    return None
  threaded = _THREADED.get(eqn.primitive)
  if threaded is not None:
    return threaded(eqn, invals, mask)
  _warn_whole_batch(eqn, "hostcb does not pass the branch's mask into it")
  return None


# How the mask goes into the bodies of the higher-order primitives that
# hostcb rewrites: as an extra leading operand of each body.
def _cond_eqn(eqn, invals, mask):
  index, *ops = invals
  params = dict(eqn.params)
  params["branches"] = tuple(
    _rewritten(b, [_BOOL], _given) for b in params["branches"]
  )
  return _conditionals.cond_p.bind(index, mask, *ops, **params)


def _scan_eqn(eqn, invals, mask):
  params = dict(eqn.params)
  if "ft_in" in params:  # jax 0.12: the operands as a flat tree
    from jax._src import flattree  # noqa: PLC0415  (jax 0.12 only)

    consts, carry, xs = params["ft_in"].unpack()
    params["ft_in"] = flattree.pack(
      (flattree.nones(len(consts) + 1), carry, xs)
    )
  else:
    params["num_consts"] += 1
  if "linear" in params:  # jax < 0.10
    params["linear"] = (False, *params["linear"])
  params["jaxpr"] = _rewritten(params["jaxpr"], [_BOOL], _given)
  return _loops.scan_p.bind(mask, *invals, **params)


def _while_eqn(eqn, invals, mask):
  params = dict(eqn.params)
  nc = params["cond_nconsts"]
  cconsts, rest = invals[:nc], invals[nc:]
  if _has_taps(params["cond_jaxpr"].jaxpr):
    params["cond_jaxpr"] = _rewritten(params["cond_jaxpr"], [_BOOL], _given)
    params["cond_nconsts"] += 1
    cconsts = [mask, *cconsts]
  if _has_taps(params["body_jaxpr"].jaxpr):
    params["body_jaxpr"] = _rewritten(params["body_jaxpr"], [_BOOL], _given)
    params["body_nconsts"] += 1
    rest = [mask, *rest]
  return _loops.while_p.bind(*cconsts, *rest, **params)


def _jit_eqn(eqn, invals, mask):
  params = eqn.params
  unspecified = _pjit.UnspecifiedValue
  if not all(
    isinstance(s, unspecified)
    for s in (*params["in_shardings"], *params["out_shardings"])
  ):
    _warn_whole_batch(eqn, "it has shardings of its own")
    return None
  # Inlined: without shardings, a nested jit only names a computation.
  closed = params["jaxpr"]
  return _evaluate(closed.jaxpr, closed.consts, invals, mask)


def _remat_eqn(eqn, invals, mask):
  params = dict(eqn.params)
  body = _rewritten(_closed(params["jaxpr"], []), [_BOOL], _given)
  consts = list(body.consts)
  params["jaxpr"] = _pe.convert_constvars_jaxpr(body.jaxpr)
  if isinstance(params["prevent_cse"], tuple):  # per operand
    params["prevent_cse"] = (False,) * (len(consts) + 1) + tuple(
      params["prevent_cse"]
    )
  return _ad_checkpoint.remat_p.bind(*consts, mask, *invals, **params)


def _closed_call_eqn(eqn, invals, mask):
  closed = eqn.params["call_jaxpr"]
  return _evaluate(closed.jaxpr, closed.consts, invals, mask)


_THREADED = {
  _conditionals.cond_p: _cond_eqn,
  _loops.scan_p: _scan_eqn,
  _loops.while_p: _while_eqn,
  _pjit.jit_p: _jit_eqn,
  _ad_checkpoint.remat_p: _remat_eqn,
}
if getattr(_core, "closed_call_p", None) is not None:
  _THREADED[_core.closed_call_p] = _closed_call_eqn


# ------------------------------------------------------ batching rules
def _cond_rule(original):
  def rule(axis_data, args, dims, *, branches, **params):
    index_dim = dims[0]
    if (
      index_dim is None
      or "branches_platforms" in params
      or not any(_has_taps(b.jaxpr) for b in branches)
    ):
      return original(axis_data, args, dims, branches=branches, **params)
    index_aval = _core.ShapedArray((), args[0].dtype)

    def taken(i):
      const = np.array(i, dtype=index_aval.dtype)
      return lambda extra, rest: _lax.eq(extra[0], const)

    masked = tuple(
      _rewritten(b, [index_aval], taken(i)) for i, b in enumerate(branches)
    )
    return original(
      axis_data,
      [args[0], *args],
      [index_dim, *dims],
      branches=masked,
      **params,
    )

  return rule


def _predicate_batched(
  axis_data, dims, cond_nconsts, cond_jaxpr, body_nconsts, body_jaxpr
) -> bool:
  """Whether ``vmap`` batches the loop's predicate (JAX's own fixpoint)."""
  batched = [d is not None for d in dims]
  cconst_bat = batched[:cond_nconsts]
  bconst_bat = batched[cond_nconsts : cond_nconsts + body_nconsts]
  carry_bat = batched[cond_nconsts + body_nconsts :]
  for _ in range(1 + len(carry_bat)):
    _, out = _batching.batch_jaxpr(
      body_jaxpr, axis_data, bconst_bat + carry_bat, instantiate=carry_bat
    )
    if out == carry_bat:
      break
    carry_bat = [a or b for a, b in zip(carry_bat, out)]
  _, (pred_bat,) = _batching.batch_jaxpr(
    cond_jaxpr, axis_data, cconst_bat + carry_bat, instantiate=False
  )
  return pred_bat


def _while_rule(original):
  def rule(
    axis_data, args, dims, *, cond_nconsts, cond_jaxpr, body_nconsts, body_jaxpr
  ):
    params = dict(
      cond_nconsts=cond_nconsts,
      cond_jaxpr=cond_jaxpr,
      body_nconsts=body_nconsts,
      body_jaxpr=body_jaxpr,
    )
    if not _has_taps(body_jaxpr.jaxpr) or not _predicate_batched(
      axis_data, dims, **params
    ):
      return original(axis_data, args, dims, **params)
    if cond_jaxpr.effects:  # evaluated again in the body: not with effects
      _warn_whole_batch_loop()
      return original(axis_data, args, dims, **params)
    nc = cond_nconsts

    def running(extra, rest):
      carry = rest[body_nconsts:]
      (pred,) = _core.eval_jaxpr(
        cond_jaxpr.jaxpr, cond_jaxpr.consts, *extra, *carry
      )
      return pred

    body = _rewritten(body_jaxpr, list(cond_jaxpr.in_avals[:nc]), running)
    return original(
      axis_data,
      [*args[:nc], *args[:nc], *args[nc:]],
      [*dims[:nc], *dims[:nc], *dims[nc:]],
      cond_nconsts=nc,
      cond_jaxpr=cond_jaxpr,
      body_nconsts=nc + body_nconsts,
      body_jaxpr=body,
    )

  return rule


_loop_warned = threading.Event()


def _warn_whole_batch_loop() -> None:
  if _loop_warned.is_set():
    return
  _loop_warned.set()
  warnings.warn(
    "hostcb: a tap in the body of a `while_loop` under `vmap` fires for "
    "every batch element until the last one is done (the loop's "
    "condition has effects, so hostcb cannot evaluate it again in the "
    "body to tell which elements are done). To print only for the "
    "running elements, move the effects out of the condition.",
    BranchMaskWarning,
    stacklevel=2,
  )
