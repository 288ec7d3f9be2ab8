"""``buffer_callback``: the buffer custom call, its effect and batching.

Part of :mod:`hostcb._jax_internals`, the only place that imports ``jax._src``;
checked against jax 0.8.0, 0.10.2 and 0.12.0.1.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from jax._src import core as _core
from jax._src import effects as _effects
from jax._src import ffi as _ffi
from jax._src.lib import ffi as _ffi_lib

from hostcb._jax_internals.core import (
  Primitive,
  lowered_with_devices,
  not_mapped,
)
from hostcb._jax_internals.custom_calls import (
  _FFI_TARGETS,
  Placement,
  _emit_ffi_call,
  _operands,
  _placement,
  _with_token,
  _with_token_sharding,
  lowering_platform,
  runs_on_one_of_several_devices,
)
from hostcb._jax_internals.versions import require

_WHAT = "to lower buffer_callback"

# The stage in which XLA runs a buffer callback (see hostcb.buffer_callback).
ExecutionStage = require(_ffi_lib, "ExecutionStage", _WHAT, "uses")

_BUFFER_TARGETS = {
  "cpu": "xla_buffer_python_cpu_callback",
  "cuda": "xla_buffer_python_gpu_callback",
  "rocm": "xla_buffer_python_gpu_callback",
}


class BufferCallbackEffect(_effects.Effect):
  """The effect of a ``buffer_callback`` made with ``has_side_effect=True``.

  Unordered (unlike :class:`HostCallbackEffect`, which is ordered): it only
  keeps the call alive when its results are unused.
  """

  def __str__(self) -> str:
    return "BufferCallback"


buffer_callback_effect = BufferCallbackEffect()
for _effect_set in (
  _effects.lowerable_effects,
  _effects.control_flow_allowed_effects,
  _effects.remat_allowed_effects,
  _effects.custom_derivatives_allowed_effects,
):
  _effect_set.add_type(BufferCallbackEffect)


def same_shape_and_dtype(a: Any, b: Any) -> bool:
  """Whether two abstract values may share one buffer (aliasing)."""
  check = require(_ffi, "_check_compatible_avals", _WHAT, "uses")
  return bool(check(a, b))


def ffi_batching(prim: Primitive, args, dims, **params):
  """JAX's ``vmap_method`` batching of FFI calls, for any such primitive.

  ``params`` must hold ``vmap_method`` and ``result_avals``; the others are
  passed through to ``prim.bind``.
  """
  dims = [None if d is not_mapped else d for d in dims]
  rule = require(_ffi, "ffi_batching_rule", "to batch buffer_callback", "uses")
  return rule(prim, args, dims, **params)


def emit_buffer_callback_everywhere(
  ctx,
  host_fn: Callable,
  args: Sequence[Any],
  *,
  has_side_effect: bool,
  operand_output_aliases: Sequence[tuple[int, int]] = (),
  command_buffer_compatible: bool = False,
) -> Sequence[Any]:
  """Lowers a buffer callback as ``jax.experimental.buffer_callback`` does.

  No sharding is put on the call, so it runs wherever the computation runs:
  once per device of a ``jit`` over several devices (with whole, replicated
  operands), of a ``pmap`` or of a ``shard_map`` (with its shard).
  ``host_fn(ctx, *operands, *results)`` gets XLA's context and buffers.
  """
  platform = lowering_platform(ctx)
  target = _BUFFER_TARGETS.get(platform)
  if target is None:
    raise ValueError(
      f"`buffer_callback` not supported on {platform} backend."
      " (hostcb's buffer callbacks run on cpu, cuda and rocm)"
    )
  if command_buffer_compatible and platform != "cpu":
    target += "_cmd_buffer"
  return _emit_ffi_call(
    ctx,
    target,
    host_fn,
    list(args),
    list(ctx.avals_in),
    list(ctx.avals_out),
    has_side_effect=has_side_effect,
    sharding=None,
    aliases={int(i): int(o) for i, o in operand_output_aliases},
  )


def lowers_without_devices(prim: Primitive) -> None:
  """Lets ``jit`` lower ``prim`` without a device assignment (as JAX's own
  callbacks), which also lets operands of different meshes meet."""
  lowered_with_devices().discard(prim)


def _host_copies_adapter(
  buffer_fn: Callable, avals_out: Sequence[Any], aliases: dict[int, int]
) -> Callable:
  """Runs a buffer host function on NumPy copies, for XLA's copying callback.

  The operands arrive as NumPy arrays; the results are fresh NumPy arrays
  (an aliased result starts as a copy of its operand) that the buffer
  function fills and XLA then copies to the device.  The execution context
  is None.
  """
  shapes = [(tuple(a.shape), np.dtype(a.dtype)) for a in avals_out]

  def host_fn(*arrays):
    outs = [np.empty(shape, dtype) for shape, dtype in shapes]
    for i, o in aliases.items():
      np.copyto(outs[o], arrays[i])
    buffer_fn(None, *arrays, *outs)
    return tuple(outs)

  return host_fn


def _without_token_buffers(host_fn: Callable, n_operands: int) -> Callable:
  """Hides the token operand (first) and result (first output) from XLA's
  buffer callback arguments ``(ctx, *operands, *results)``."""

  def host_fn_with_token(raw_ctx, *buffers):
    host_fn(raw_ctx, *buffers[1:n_operands], *buffers[n_operands + 1 :])
    return ()

  return host_fn_with_token


def emit_buffer_callback(
  ctx,
  make_host_fn: Callable[[Placement, bool], Callable],
  args: Sequence[Any],
  *,
  device_index: int,
  has_side_effect: bool,
  operand_output_aliases: Sequence[tuple[int, int]] = (),
  command_buffer_compatible: bool = False,
  ordered_effect: Any = None,
) -> Sequence[Any]:
  """Lowers a call of a host function that works on the device buffers.

  ``make_host_fn(placement, host_copies)`` returns the function that XLA
  calls as ``fn(ctx, *inputs, *outputs)``: an execution context, then one
  buffer per operand (preceded by the partition id, as a uint32 scalar
  buffer, in per-device code) and one writable buffer per result of
  ``ctx.avals_out``; it returns nothing.  ``operand_output_aliases`` pairs
  indices into ``args`` with result indices that share their buffer.  With
  an ``ordered_effect`` (an ordered effect of the primitive), the call
  threads that effect's token, as :func:`emit_host_callback` does, so it
  keeps its place in program order (a call without side effect too: the
  token orders it, and XLA may still drop it where nothing uses it).

  Placement is as for :func:`emit_host_callback`.  In a ``jit`` over several
  devices (see :func:`.custom_calls.runs_on_one_of_several_devices`) the call goes through
  XLA's copying callback instead: ``host_copies`` is then True, the context
  None, and the buffers NumPy arrays in host memory.
  """
  platform = lowering_platform(ctx)
  target = _BUFFER_TARGETS.get(platform)
  if target is None:
    raise NotImplementedError(
      "buffer callbacks run only on cpu, cuda and rocm; this computation "
      f"is lowered for {platform}"
    )
  aliases = {int(i): int(o) for i, o in operand_output_aliases}
  placement, sharding = _placement(ctx, device_index)
  host_copies = runs_on_one_of_several_devices(ctx)
  host_fn = make_host_fn(placement, host_copies)
  if host_copies:
    target = _FFI_TARGETS[platform]
    host_fn = _host_copies_adapter(host_fn, ctx.avals_out, aliases)
    aliases = {}
  elif command_buffer_compatible and platform != "cpu":
    target += "_cmd_buffer"
  operands, avals_in, avals_out = _operands(ctx, args, placement)
  if placement.per_device:
    aliases = {i + 1: o for i, o in aliases.items()}
  token = None
  if ordered_effect is not None:
    token = ctx.tokens_in.get(ordered_effect)
  if token is not None:
    operands.insert(0, token)
    avals_in.insert(0, _core.abstract_token)
    avals_out.insert(0, _core.abstract_token)
    aliases = {i + 1: o + 1 for i, o in aliases.items()}
    host_fn = (
      _with_token(host_fn)
      if host_copies
      else _without_token_buffers(host_fn, len(operands))
    )
    sharding = _with_token_sharding(sharding, bool(ctx.avals_out))
  return _emit_ffi_call(
    ctx,
    target,
    host_fn,
    operands,
    avals_in,
    avals_out,
    has_side_effect=has_side_effect,
    sharding=sharding,
    token_effect=ordered_effect if token is not None else None,
    aliases=aliases,
  )
