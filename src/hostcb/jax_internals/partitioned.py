"""Per-shard callbacks in a ``jit`` over several devices, without a gather.

Part of :mod:`hostcb.jax_internals`, the only place that imports
``jax._src``; checked against jax 0.8.0, 0.10.2 and 0.12.0.1 (the
custom-call partitioner API of ``jaxlib.xla_client`` and
``jax._src.op_shardings``; tests/test_partitioned.py runs in CI on all
three).

In a ``jit`` over several devices the shardings of a value are known only
once XLA's sharding propagation has run, after lowering: the lowering
cannot know the shape of a device's shard.  So a per-shard tap lowers to a
placeholder custom call, ``hostcb_partitioned_tap``, with a partitioner
registered for it (the mechanism behind ``jax.experimental.custom_partitioning``).
When XLA's SPMD partitioner reaches it, it calls :func:`_partition` with the
operands' shardings; that returns a small module, inlined in place of the
placeholder, holding one native tap custom call on the device's own shard
(sharding ``{manual}``: every device runs it on its shard).  No operand is
resharded (the partitioner asks for the shardings the operands already
have), so the compiled program has no all-gather and no collective.

The placeholder takes and returns the token of hostcb's effect, as every
tap does: a device's taps stay in program order.  The partitioner also
learns, from the shardings, which slice of the global array each device
holds: the caller's ``target_id_for`` gets that, per device, and returns
the engine's target id for these shards.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
import weakref
from typing import Any, Callable, Sequence

import numpy as np
from jax._src import op_shardings as _op_shardings
from jax._src.interpreters import mlir as _mlir
from jax._src.lib import xla_client as _xc
from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import func as _func
from jax._src.lib.mlir.dialects import hlo as _hlo

from hostcb.jax_internals.core import host_callback_effect
from hostcb.jax_internals.custom_calls import _placement, _set_sharding
from hostcb.jax_internals.versions import require

__all__ = ["emit_per_shard_custom_call", "emit_manual_tap", "ShardLayout"]

PLACEHOLDER_TARGET = "hostcb_partitioned_tap"

Index = tuple  # of slices, one per dimension


@dataclasses.dataclass(frozen=True)
class ShardLayout:
  """What a device holds of each operand of a per-shard tap.

  ``indices[device_id]``: per operand, the device's slice of the global
  array (a tuple of slices, as ``jax.Array.addressable_shards[i].index``);
  ``padded``: whether some device's buffer is larger than its slice (an
  uneven sharding: XLA pads the last shards), so that the host must trim
  the arrays it receives to the slice's extent.
  """
  indices: dict
  padded: bool

  def key(self) -> tuple:
    """A hashable form (slices are not hashable before Python 3.12)."""
    return (self.padded, tuple(sorted(
        (d, tuple(tuple((s.start, s.stop) for s in index)
                  for index in per_operand))
        for d, per_operand in self.indices.items())))


@dataclasses.dataclass(eq=False)
class _Pending:
  """A placeholder's state, from lowering until XLA partitions it."""
  emit_tap: Callable[..., None]  # (operands, layout) -> emits the tap
  devices: tuple  # the computation's device assignment
  # Kept alive by the module context (the executable) it was lowered for.
  __weakref__: Any = dataclasses.field(default=None, repr=False)


_pending: "weakref.WeakValueDictionary[bytes, _Pending]" = (
    weakref.WeakValueDictionary())
_keys = itertools.count()
_registered = [False]
# Two threads lowering their first per-shard tap register the partitioner
# once (XLA keeps the first registration of a name).
_register_lock = threading.Lock()


def _register() -> None:
  """Registers the placeholder's partitioner with XLA, once per process
  (a registration of hostcb's own custom call, which changes nothing of
  JAX's and cannot be undone; made when the first per-shard tap lowers)."""
  if _registered[0]:
    return
  with _register_lock:
    if _registered[0]:
      return
    register = require(_xc, "register_custom_call_partitioner",
                       "to run hostcb taps per shard in a sharded jit "
                       "(partitioned=True)", verb="uses")
    register(PLACEHOLDER_TARGET, _propagate_user_sharding, _partition,
             _infer_sharding_from_operands,
             can_side_effecting_have_replicated_sharding=True)
    _registered[0] = True


def emit_per_shard_custom_call(ctx, args: Sequence[Any], *,
                               emit_tap: Callable[..., Any]) -> None:
  """Lowers a tap that runs on every device with its shard of ``args``.

  For a ``jit`` over several devices (a ``ShardingContext``).  ``emit_tap(
  operands, layout)`` is called by XLA's SPMD partitioner, at compile time,
  inside the module that replaces the placeholder: ``operands`` are the
  token and the device's shards (MLIR values), ``layout`` a
  :class:`ShardLayout`; it emits the tap with :func:`emit_manual_tap` and
  returns its token.
  """
  _register()
  axis_context = ctx.module_context.axis_context
  pending = _Pending(emit_tap, tuple(axis_context.device_assignment or ()))
  key = f"hostcb-ptap-{next(_keys)}".encode()
  _pending[key] = pending
  # XLA partitions when it compiles this module: keep the state until then
  # (and as long as the executable lives).
  ctx.module_context.add_keepalive(pending)
  token = ctx.tokens_in.get(host_callback_effect)
  token_type = _hlo.TokenType.get()
  op = _hlo.CustomCallOp(
      [token_type], [token, *args],
      call_target_name=_ir.StringAttr.get(PLACEHOLDER_TARGET),
      has_side_effect=_ir.BoolAttr.get(True),
      api_version=_mlir.i32_attr(2),
      called_computations=_ir.ArrayAttr.get([]),
      backend_config=_ir.StringAttr.get(key.decode()),
      operand_layouts=None, result_layouts=None)
  # A sharding on the op itself, without which XLA's SPMD partitioner does
  # not call the op's partitioner: the token's, on the first device.
  _, sharding = _placement(ctx, 0, ())
  if sharding is not None:
    _set_sharding(ctx.module_context, op, sharding)
  ctx.set_tokens_out(ctx.tokens_in.update_tokens(
      _mlir.TokenSet({host_callback_effect: op.results[0]})))


def emit_manual_tap(target: str, operands: Sequence[Any],
                    attributes: dict[str, int]) -> Any:
  """Emits the FFI custom call ``target`` of ``operands`` (the token first)
  with integer ``attributes``, run by every device on its shard; returns
  its token.  For ``emit_tap`` of :func:`emit_per_shard_custom_call`."""
  i64 = _ir.IntegerType.get_signless(64)
  op = _mlir.custom_call(
      target, result_types=[_hlo.TokenType.get()], operands=list(operands),
      backend_config={k: _ir.IntegerAttr.get(i64, int(v))
                      for k, v in attributes.items()},
      has_side_effect=True, api_version=4)
  op.attributes["mhlo.sharding"] = _ir.StringAttr.get("{manual}")
  return op.results[0]


# ------------------------------------------------- XLA's partitioner calls
def _propagate_user_sharding(user_sharding, shape, key):
  del shape, key
  return user_sharding


def _infer_sharding_from_operands(arg_shapes, arg_shardings, result_shape,
                                  key):
  del arg_shapes, arg_shardings, result_shape, key
  return _xc.HloSharding.replicate()  # the token's


def _per_device(sharding) -> bool:
  """Whether an operand of this sharding can be tapped where it lies:
  tiled or replicated (not on one device only, nor unknown)."""
  return sharding is not None and (sharding.is_tiled()
                                   or sharding.is_replicated())


def _layout(shardings: Sequence[Any], shapes: Sequence[tuple],
            tiles: Sequence[tuple], devices: tuple) -> ShardLayout:
  """Each device's slice of each operand, from the operands' shardings
  (indexed by the position of a device in ``devices``)."""
  to_indices = require(_op_shardings, "op_sharding_to_indices",
                       "to give per-shard taps their slice of the array",
                       verb="uses")
  per_operand = []
  padded = False
  for sharding, shape, tile in zip(shardings, shapes, tiles):
    slices = []
    # JAX's indices need an even split: those of the padded shape, clipped.
    padded_shape = shape
    if sharding.is_tiled():
      ways = sharding.tile_assignment_dimensions()[:len(shape)]
      padded_shape = tuple(t * w for t, w in zip(tile, ways))
    for index in to_indices(sharding, padded_shape, len(devices)):
      # Clipped to the array (the last shards of an uneven sharding reach
      # past its end); a dimension that is not split stays slice(None).
      index = tuple(s if s == slice(None) else slice(*s.indices(n)[:2])
                    for s, n in zip(index, shape))
      extent = tuple(len(range(*s.indices(n))) for s, n in zip(index, shape))
      padded = padded or extent != tile
      slices.append(index)
    per_operand.append(slices)
  indices = {dev.id: tuple(p[i] for p in per_operand)
             for i, dev in enumerate(devices)}
  return ShardLayout(indices, padded)


def _partition(arg_shapes, arg_shardings, result_shape, result_sharding,
               key):
  """Called by XLA's SPMD partitioner: the module that replaces the
  placeholder, and the shardings it takes its operands and gives its
  result in."""
  pending = _pending.get(bytes(key))
  if pending is None:
    raise RuntimeError(
        "hostcb: XLA asked to partition a per-shard tap of a computation "
        f"whose lowering is gone (key {bytes(key)!r})")
  token_sharding, *shardings = arg_shardings
  shapes = [tuple(s.dimensions()) for s in arg_shapes[1:]]
  dtypes = [np.dtype(s.numpy_dtype()) for s in arg_shapes[1:]]
  # An operand on one device only (or of unknown sharding) is replicated
  # first: every device then taps the whole value.
  shardings = [s if _per_device(s) else _xc.HloSharding.replicate()
               for s in shardings]
  tiles = [tuple(sharding.tile(s).dimensions())
           for sharding, s in zip(shardings, arg_shapes[1:])]
  layout = _layout(shardings, shapes, tiles, pending.devices)
  with _mlir.make_ir_context(), _ir.Location.unknown():
    module = _ir.Module.create()
    types = [_hlo.TokenType.get()]
    for tile, dtype in zip(tiles, dtypes):
      types.append(_ir.RankedTensorType.get(
          list(tile), _mlir.dtype_to_ir_type(dtype)))
    token_type = _hlo.TokenType.get()
    with _ir.InsertionPoint(module.body):
      main = _func.FuncOp("main", _ir.FunctionType.get(types, [token_type]))
      main.attributes["sym_visibility"] = _ir.StringAttr.get("public")
      block = main.add_entry_block()
      with _ir.InsertionPoint(block):
        token = pending.emit_tap(list(block.arguments), layout)
        _func.ReturnOp([token])
    code = _mlir.module_to_bytecode(module)
  return code, [token_sharding, *shardings], result_sharding
