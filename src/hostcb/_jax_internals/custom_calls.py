"""Lowering of callbacks to XLA custom calls: placement, operands, tokens.

Part of :mod:`hostcb._jax_internals`, the only place that imports ``jax._src``;
checked against jax 0.8.0, 0.10.2 and 0.12.0.1.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
from typing import Any, Callable, Sequence

import numpy as np
from jax._src import callback as _callback
from jax._src import core as _core
from jax._src import ffi as _ffi
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import mlir as _mlir
from jax._src.lib.mlir.dialects import hlo as _hlo

from hostcb._jax_internals import patches
from hostcb._jax_internals.core import (
  HostCallbackEffect,
  ShapedArray,
  host_callback_effect,
)
from hostcb._jax_internals.versions import (
  changed,
  check_shape,
  jax_at_least,
  require,
)


# ---------------------------------------------------------------- lowering
@dataclasses.dataclass(frozen=True)
class Placement:
  """Where a lowered callback runs, as seen from the host.

  ``devices`` indexes the computation's devices; ``per_device`` is True in
  per-device (pmap, shard_map) code, where every device calls the host and
  the host function receives the partition id as a leading uint32 operand.
  Otherwise one device, ``devices[device_index]``, calls the host.
  """

  devices: tuple | None
  per_device: bool
  device_index: int


_PLACEMENT_WHAT = "to tell which devices call the host"


def _placement(
  ctx, device_index: int, avals_out: Sequence[Any] | None = None
) -> tuple[Placement, Any]:
  if avals_out is None:
    avals_out = ctx.avals_out
  axis_context = ctx.module_context.axis_context
  if isinstance(axis_context, _sharding_impls.SPMDAxisContext):
    mesh = check_shape(
      axis_context,
      "jax._src.sharding_impls.SPMDAxisContext",
      _PLACEMENT_WHAT,
      fields=("mesh",),
    ).mesh
    devices = check_shape(
      mesh,
      "the mesh of an SPMDAxisContext",
      _PLACEMENT_WHAT,
      fields=("_flat_devices_tuple",),
    )._flat_devices_tuple
    sharding = _callback._callback_op_sharding(axis_context, None, avals_out)
    return Placement(devices, True, 0), sharding
  if isinstance(axis_context, _sharding_impls.ShardingContext):
    check_shape(
      axis_context,
      "jax._src.sharding_impls.ShardingContext",
      _PLACEMENT_WHAT,
      fields=("device_assignment", "num_devices"),
    )
    devices = axis_context.device_assignment
    n = axis_context.num_devices
    if n == 1:
      device_index = 0  # a one-device computation taps where it runs
    elif not 0 <= device_index < n:
      raise ValueError(
        f"device_index must name one of the {n} devices of the computation "
        f"(0 to {n - 1}); got device_index={device_index}"
      )
    single = None
    if devices is not None and n > 1:
      single = _sharding_impls.SingleDeviceSharding(devices[device_index])
    sharding = _callback._callback_op_sharding(axis_context, single, avals_out)
    return Placement(devices, False, device_index), sharding
  return Placement(None, False, 0), None


def runs_on_one_of_several_devices(ctx) -> bool:
  """Whether the lowering is of a ``jit`` over several devices (not per-device).

  There a callback must run once, on one device, with whole operands: Shardy
  keeps such a one-device (MAXIMAL) placement only for XLA's copying Python
  callbacks, not for the buffer ones.
  """
  axis_context = ctx.module_context.axis_context
  if not isinstance(axis_context, _sharding_impls.ShardingContext):
    return False
  devices = check_shape(
    axis_context,
    "jax._src.sharding_impls.ShardingContext",
    _PLACEMENT_WHAT,
    fields=("num_devices",),
  ).num_devices
  return (
    check_shape(
      devices,
      "jax._src.sharding_impls.ShardingContext.num_devices",
      _PLACEMENT_WHAT,
      types=int,
    )
    > 1
  )


_FFI_TARGETS = {
  "cpu": "xla_ffi_python_cpu_callback",
  "cuda": "xla_ffi_python_gpu_callback",
  "rocm": "xla_ffi_python_gpu_callback",
}


def _checked_python_callback(result: Any) -> Any:
  """What ``emit_python_callback`` returned, once it is the triple hostcb
  unpacks (results, token, keep-alive; checked on jax 0.8.0, 0.10.2 and
  0.12.0.1), else :class:`JaxInternalChanged`."""
  return check_shape(
    result,
    "the result of jax._src.callback.emit_python_callback",
    "to lower a callback on platforms without XLA's FFI callbacks",
    types=tuple,
    lengths=(3,),
  )


def emit_host_callback(
  ctx,
  make_host_fn: Callable[[Placement], Callable],
  args: Sequence[Any],
  *,
  device_index: int,
  has_side_effect: bool,
  avals_out: Sequence[Any] | None = None,
) -> Sequence[Any]:
  """Lowers a call of a host function on the operands ``args``.

  ``make_host_fn(placement)`` returns the function that XLA calls with NumPy
  arrays (preceded by the partition id in per-device code) and that returns
  a tuple of arrays matching ``avals_out`` (default ``ctx.avals_out``).
  Returns the results of the custom call.
  """
  if avals_out is None:
    avals_out = ctx.avals_out
  platform = lowering_platform(ctx)
  placement, sharding = _placement(ctx, device_index, avals_out)
  host_fn = make_host_fn(placement)
  target = _FFI_TARGETS.get(platform)
  if target is None:
    # Other platforms (TPU) go through JAX's send/recv based callbacks.
    if placement.per_device:
      raise NotImplementedError(
        f"hostcb per-device callbacks are not supported on {platform}"
      )
    results, _, _ = _checked_python_callback(
      _callback.emit_python_callback(
        ctx,
        host_fn,
        None,
        list(args),
        ctx.avals_in,
        avals_out,
        has_side_effect=has_side_effect,
        returns_token=False,
        sharding=sharding,
      )
    )
    return results
  _refuse_sub_byte_operands(ctx.avals_in, avals_out)
  operands, avals_in, avals_out = _operands(ctx, args, placement, avals_out)
  token, sharding = _take_token(ctx, operands, avals_in, avals_out, sharding)
  if token is not None:
    host_fn = _with_token(host_fn)
  return _emit_ffi_call(
    ctx,
    target,
    host_fn,
    operands,
    avals_in,
    avals_out,
    has_side_effect=has_side_effect,
    sharding=sharding,
    token_effect=(host_callback_effect if token is not None else None),
  )


# Dtypes narrower than a byte.  Before jax 0.10 (seen on 0.8.0; 0.10.2 and
# 0.12.0.1 are right), XLA's CPU Python callback hands an array of such a
# dtype with an odd number of elements over without its last element (it
# reads back as another value): the callback would show a value the
# program never computed.  Even counts arrive exactly.
_SUB_BYTE = frozenset({"int2", "uint2", "int4", "uint4", "float4_e2m1fn"})


def _refuse_sub_byte_operands(avals_in, avals_out) -> None:
  """Raises, on a JAX older than 0.10, where a callback through XLA's
  Python callback takes or returns an array of a dtype narrower than a
  byte with an odd number of elements."""
  odd = [
    a
    for a in (*avals_in, *avals_out)
    if str(getattr(a, "dtype", "")) in _SUB_BYTE
    and math.prod(getattr(a, "shape", ())) % 2 == 1
  ]
  if not odd or jax_at_least(0, 10):
    return
  import jax  # noqa: PLC0415  (public API, for its version)

  version = jax.__version__
  a = odd[0]
  raise NotImplementedError(
    f"hostcb: on jax {version}, XLA hands a {a.dtype}{list(a.shape)} (an "
    "odd number of values narrower than a byte) to host callbacks without "
    "its last value, and a callback must never see values the program did "
    "not compute. Cast it first (x.astype(jnp.int8)), pad it to an even "
    "size, or use jax 0.10 or newer."
  )


def _take_token(
  ctx,
  operands: list,
  avals_in: list,
  avals_out: list,
  sharding: Any,
) -> tuple[Any, Any]:
  """Puts the token of hostcb's effect first among the operands and the
  results when the primitive has that effect; returns it (None without)
  and the sharding to use.  The token keeps the callbacks of a computation
  in program order: XLA may reorder custom calls that do not depend on
  each other.  A call without side effect (a pure call) takes it too, when
  its primitive has the effect: the taps written before it then run before
  it, those written after it after it."""
  token = ctx.tokens_in.get(host_callback_effect)
  if token is None:
    return None, sharding
  has_results = bool(avals_out)
  operands.insert(0, token)
  avals_in.insert(0, _core.abstract_token)
  avals_out.insert(0, _core.abstract_token)
  return token, _with_token_sharding(sharding, has_results)


def emit_custom_call(
  ctx,
  target: str,
  args: Sequence[Any],
  *,
  device_index: int,
  attributes: dict,
  avals_out: Sequence[Any] = (),
  has_side_effect: bool = True,
) -> Sequence[Any]:
  """Lowers an XLA FFI custom call ``target`` of ``args``; its results.

  For the native engine's handlers, which need no Python callback in the
  executable: ``attributes`` become the call's FFI attributes.  It runs on
  every device in per-device code, else on ``device_index`` only, and
  takes and returns the token of hostcb's effect (program order) when the
  primitive has that effect.
  """
  _, sharding = _placement(ctx, device_index, avals_out)
  operands, avals_in = list(args), list(ctx.avals_in)
  avals_out = list(avals_out)
  token, sharding = _take_token(ctx, operands, avals_in, avals_out, sharding)
  return _emit_ffi_call(
    ctx,
    target,
    None,
    operands,
    avals_in,
    avals_out,
    has_side_effect=has_side_effect,
    sharding=sharding,
    token_effect=(host_callback_effect if token is not None else None),
    attributes=attributes,
  )


def _emit_ffi_call(
  ctx,
  target: str,
  host_fn: Callable | None,
  operands,
  avals_in,
  avals_out,
  *,
  has_side_effect: bool,
  sharding,
  token_effect=None,
  aliases=None,
  attributes: dict | None = None,
) -> list:
  """Emits the custom call ``target``, of the host function ``host_fn``
  (XLA's Python callbacks: its index in the module is the ``index``
  attribute) or with the FFI ``attributes`` (native handlers).

  With ``token_effect``, the first operand and result are that effect's
  token, which becomes the computation's current token for the effect.
  """
  lower_ctx = dataclasses.replace(ctx, avals_in=avals_in, avals_out=avals_out)
  if host_fn is not None:
    ctx.module_context.add_host_callback(host_fn)
    attributes = {
      "index": np.uint64(len(ctx.module_context.host_callbacks) - 1)
    }
  op = _ffi.build_ffi_lowering_function(
    target,
    has_side_effect=has_side_effect,
    operand_output_aliases=aliases or None,
  )(lower_ctx, *operands, **(attributes or {}))
  if sharding is not None:
    _set_sharding(ctx.module_context, op, sharding)
  results = list(op.results)
  if token_effect is not None:
    token_out, *results = results
    ctx.set_tokens_out(
      ctx.tokens_in.update_tokens(_mlir.TokenSet({token_effect: token_out}))
    )
  return results


def lowering_platforms(ctx) -> tuple[str, ...]:
  """The platforms a lowering runs for (several for a multi-platform
  ``jax.export``)."""
  return tuple(ctx.module_context.platforms)


def lowering_platform(ctx) -> str:
  """The one platform a lowering runs for (``cpu``, ``cuda``, ``rocm``...)."""
  platforms = ctx.module_context.platforms
  if len(platforms) > 1:
    raise NotImplementedError(
      "hostcb callbacks cannot be lowered for several platforms at once; "
      f"got platforms={tuple(platforms)}"
    )
  return platforms[0]


def _operands(
  ctx, args, placement: Placement, avals_out: Sequence[Any] | None = None
) -> tuple[list, list, list]:
  """Operands and avals of a callback; per-device code gets the partition
  id as a leading uint32 operand."""
  operands, avals_in = list(args), list(ctx.avals_in)
  if placement.per_device:
    operands.insert(0, _hlo.PartitionIdOp().result)
    avals_in.insert(0, ShapedArray((), np.uint32))
  return (
    operands,
    avals_in,
    list(ctx.avals_out if avals_out is None else avals_out),
  )


def _with_token(host_fn: Callable) -> Callable:
  def host_fn_with_token(token, *arrays):
    return (token, *host_fn(*arrays))

  return host_fn_with_token


def _with_token_sharding(sharding, has_results: bool):
  """Adds the token's entry to a Shardy per-result sharding annotation."""
  sdy_list = getattr(_sharding_impls, "SdyArrayList", None)
  if (
    sharding is None
    or not has_results
    or sdy_list is None
    or not isinstance(sharding, sdy_list)
  ):
    return sharding
  first = sharding.shardings[0]
  token_sharding = _sharding_impls.SdyArray(
    mesh_shape=(), dim_shardings=(), logical_device_ids=first.logical_device_ids
  )
  return sdy_list((token_sharding, *sharding.shardings))


def _set_sharding(module_context, op, sharding) -> None:
  # jax < 0.9 takes (op, sharding); later versions also the module context.
  if "ctx" in inspect.signature(_mlir.set_sharding).parameters:
    _mlir.set_sharding(module_context, op, sharding)
  else:
    _mlir.set_sharding(op, sharding)


# ------------------------------------------------ while_loop: tap in cond_fun
# JAX lowers a while loop whose cond_fun has an ordered effect by evaluating
# cond_fun once before the loop and again at the end of each iteration.  For
# a batched predicate (vmap of a while loop) that rewrite runs the body on
# every batch element while any element's predicate holds, without keeping
# the finished elements' carry: wrong values.  JAX never meets that case
# with its own ordered effects (it refuses them under vmap); hostcb's taps
# reach it.  The rule below lowers that one case with the same rewrite plus
# the per-element select that the plain batched lowering does; every other
# while loop goes to the rule it replaced, JAX's or another library's (so
# that two libraries that override this rule compose).  Installed on the
# first bind of a hostcb primitive (a while loop that taps in its cond_fun
# binds one first), undone by hostcb.uninstall().  Checked against jax
# 0.8.0, 0.10.2 and 0.12.0.1 (``mlir._lowerings``: primitive -> an entry
# whose ``rule`` field is the rule).
from jax._src.lax.control_flow import loops as _loops  # noqa: E402

_WHILE_WHAT = "to tap in the cond_fun of a batched while_loop"
logger = logging.getLogger("hostcb")
# while_p's parameters, as hostcb's rule reads them.
_WHILE_PARAMS = {"cond_jaxpr", "body_jaxpr", "cond_nconsts", "body_nconsts"}


def _cond_taps(cond_jaxpr) -> bool:
  return any(isinstance(e, HostCallbackEffect) for e in cond_jaxpr.effects)


def _install_while_lowering() -> None:
  if patches.is_installed("while lowering"):
    return
  while_p = require(_loops, "while_p", _WHILE_WHAT)
  registry = check_shape(
    require(_mlir, "_lowerings", _WHILE_WHAT),
    "jax._src.interpreters.mlir._lowerings",
    _WHILE_WHAT,
    types=dict,
  )
  entry = registry.get(while_p)
  previous = getattr(entry, "rule", entry)
  if not callable(previous):
    raise changed(
      "jax._src.interpreters.mlir._lowerings[while_p]",
      "an entry with a callable rule",
      type(entry).__name__,
      _WHILE_WHAT,
    )

  def while_lowering(ctx, *args, **params):
    cond_jaxpr = params.get("cond_jaxpr")
    if cond_jaxpr is None or not _cond_taps(cond_jaxpr):
      return previous(ctx, *args, **params)  # not hostcb's
    if set(params) != _WHILE_PARAMS:
      raise changed(
        "the parameters of jax._src.lax.control_flow.loops.while_p",
        ", ".join(sorted(_WHILE_PARAMS)),
        ", ".join(sorted(params)),
        _WHILE_WHAT,
      )
    if not cond_jaxpr.out_avals[0].shape:
      return previous(ctx, *args, **params)  # unbatched: JAX's rewrite
    return _batched_while_with_taps(ctx, args, **params)

  _mlir.register_lowering(while_p, while_lowering)
  mine = registry.get(while_p)

  def undo() -> None:
    if registry.get(while_p) is not mine:
      # Another library's rule since, which may call hostcb's (and so the
      # one before it): left in place rather than dropped.
      logger.warning(
        "hostcb: the while_p lowering rule was replaced since "
        "hostcb set it; left as it is"
      )
    elif entry is None:
      registry.pop(while_p, None)
    else:
      registry[while_p] = entry

  patches.record(
    "while lowering",
    "jax._src.interpreters.mlir._lowerings[while_p]",
    undo,
    original=previous,
  )


def _batched_while_with_taps(
  ctx, args, *, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts
):
  from jax import lax  # noqa: PLC0415  (public API; in its own lowering)

  def cond(consts, carry):
    return _core.eval_jaxpr(
      cond_jaxpr.jaxpr, cond_jaxpr.consts, *consts, *carry
    )[0]

  def loop(*args):
    cond_consts = list(args[:cond_nconsts])
    body_consts = list(args[cond_nconsts : cond_nconsts + body_nconsts])
    carry = list(args[cond_nconsts + body_nconsts :])

    def any_running(state):
      pred, _ = state
      return lax.reduce_or(pred, tuple(range(pred.ndim)))

    def iteration(state):
      # As legacy did: cond_fun sees the body's results for every element
      # (finished ones too), a finished element stays finished, and only
      # the running elements take the body's results.  The predicate's
      # shape is a prefix of every carry's shape.
      pred, carry = state
      new = _core.eval_jaxpr(
        body_jaxpr.jaxpr, body_jaxpr.consts, *body_consts, *carry
      )
      new_pred = lax.bitwise_and(pred, cond(cond_consts, new))
      carry = [
        lax.select(
          lax.broadcast_in_dim(pred, n.shape, tuple(range(pred.ndim))), n, c
        )
        for n, c in zip(new, carry)
      ]
      return new_pred, carry

    _, out = lax.while_loop(
      any_running, iteration, (cond(cond_consts, carry), carry)
    )
    return out

  return _mlir.lower_fun(loop, multiple_results=True)(ctx, *args)


patches.when_first_needed(_install_while_lowering)
