"""Per-shard callbacks in a ``jit`` over several devices, without a gather.

Part of :mod:`hostcb._jax_internals`, the only place that imports
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
tap does: a device's taps stay in program order.

Everything the partitioner needs is in the placeholder itself (its
``backend_config``: the engine's target name and target id, chosen when
the program was lowered, and the number of devices): it keeps no state
of the lowering.  That matters for JAX's persistent compilation cache,
whose key is computed from the lowered module, before XLA partitions it:
on a cache hit XLA does not partition at all, so whatever the tap calls
must be fixed by the lowered module.  It is: the target id is in it (a
process whose lowering bound that id to another function computes
another key), and which slice of the global array a device holds, which
the partitioner learns from the shardings, is compiled into the program
as data: a table of every device's slice bounds, from which each device
passes its own row (selected by its partition id) to the tap as one more
``int64`` operand (see :func:`slice_bounds`).

A tap reads its operand where it lies; but in a loop that updates the
tapped array (``x = f(x)`` after ``tap(x)``), XLA cannot tell that the tap
reads ``x`` before ``f`` overwrites it in place (nothing orders them), so
it copies ``x`` on the device first, at every step.
:func:`read_taps_in_place` orders them, once the whole program is lowered:
the placeholder also returns the operand (the same buffer: the tap's
custom call aliases each such result to its operand and writes nothing
there), and the uses of the operand that come after the tap read that
result instead.  XLA then needs no copy.
"""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any, Sequence

import numpy as np
from jax._src import op_shardings as _op_shardings
from jax._src.interpreters import mlir as _mlir
from jax._src.lib import xla_client as _xc
from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import func as _func
from jax._src.lib.mlir.dialects import hlo as _hlo

from hostcb._jax_internals.core import host_callback_effect
from hostcb._jax_internals.custom_calls import _placement, _set_sharding
from hostcb._jax_internals.versions import require

__all__ = ["emit_per_shard_custom_call", "read_taps_in_place", "slice_bounds"]

PLACEHOLDER_TARGET = "hostcb_partitioned_tap"

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
    register = require(
      _xc,
      "register_custom_call_partitioner",
      "to run hostcb taps per shard in a sharded jit (partitioned=True)",
      verb="uses",
    )
    register(
      PLACEHOLDER_TARGET,
      _propagate_user_sharding,
      _partition,
      _infer_sharding_from_operands,
      can_side_effecting_have_replicated_sharding=True,
    )
    _registered[0] = True


def emit_per_shard_custom_call(
  ctx, args: Sequence[Any], *, target: str, target_id: int
) -> None:
  """Lowers a tap that runs on every device with its shard of ``args``.

  For a ``jit`` over several devices (a ``ShardingContext``).  When XLA's
  SPMD partitioner reaches it, every device gets the FFI custom call
  ``target`` (with the integer attribute ``target_id``) of the token, its
  shards of ``args`` and, when some operand has a dimension, its slice
  bounds (:func:`slice_bounds`).
  """
  _register()
  axis_context = ctx.module_context.axis_context
  config = {
    "target": target,
    "target_id": int(target_id),
    "devices": int(axis_context.num_devices),
    "bounds": any(len(a.shape) for a in ctx.avals_in),
    # Whether read_taps_in_place may let it return its operands: on CPU,
    # where that was measured and tested.
    "in_place": tuple(ctx.module_context.platforms) == ("cpu",),
  }
  token = ctx.tokens_in.get(host_callback_effect)
  token_type = _hlo.TokenType.get()
  op = _hlo.CustomCallOp(
    [token_type],
    [token, *args],
    call_target_name=_ir.StringAttr.get(PLACEHOLDER_TARGET),
    has_side_effect=_ir.BoolAttr.get(True),
    api_version=_mlir.i32_attr(2),
    called_computations=_ir.ArrayAttr.get([]),
    backend_config=_ir.StringAttr.get(json.dumps(config, sort_keys=True)),
    operand_layouts=None,
    result_layouts=None,
  )
  # A sharding on the op itself, without which XLA's SPMD partitioner does
  # not call the op's partitioner: the token's, on the first device.
  _, sharding = _placement(ctx, 0, ())
  if sharding is not None:
    _set_sharding(ctx.module_context, op, sharding)
  ctx.set_tokens_out(
    ctx.tokens_in.update_tokens(
      _mlir.TokenSet({host_callback_effect: op.results[0]})
    )
  )


def slice_bounds(bounds: np.ndarray, shapes: Sequence[tuple]) -> list:
  """Each operand's slice of the global array, from the ``int64`` bounds
  that the tap receives last: per operand and dimension ``start, stop``,
  where ``stop == -1`` marks a dimension that is not split
  (``slice(None)``).  ``shapes``: the operands' global shapes."""
  flat = bounds.tolist()
  out, k = [], 0
  for shape in shapes:
    index = []
    for _ in shape:
      start, stop = flat[k], flat[k + 1]
      k += 2
      index.append(slice(None) if stop < 0 else slice(start, stop))
    out.append(tuple(index))
  return out


def _emit_tap(
  target: str,
  operands: Sequence[Any],
  attributes: dict[str, int],
  aliased: Sequence[int] = (),
) -> list:
  """The FFI custom call ``target`` of ``operands`` (the token first), run
  by every device on its shard; returns its token, then ``operands[i]``
  for each ``i`` in ``aliased``, as results that are the operands' own
  buffers (the handler writes nothing there)."""
  i64 = _ir.IntegerType.get_signless(64)
  op = _mlir.custom_call(
    target,
    result_types=[_hlo.TokenType.get(), *(operands[i].type for i in aliased)],
    operands=list(operands),
    backend_config={
      k: _ir.IntegerAttr.get(i64, int(v)) for k, v in attributes.items()
    },
    has_side_effect=True,
    api_version=4,
    operand_output_aliases={i: k + 1 for k, i in enumerate(aliased)} or None,
  )
  op.attributes["mhlo.sharding"] = _ir.StringAttr.get("{manual}")
  return list(op.results)


# ------------------------------------------------- XLA's partitioner calls
def _propagate_user_sharding(user_sharding, shape, key):
  del shape, key
  return user_sharding


def _infer_sharding_from_operands(arg_shapes, arg_shardings, result_shape, key):
  del arg_shapes
  if not result_shape.is_tuple():
    return _xc.HloSharding.replicate()  # the token's
  # The token's, then those of the operands it returns (read_taps_in_place).
  aliased = _aliased(json.loads(bytes(key).decode()))
  return _xc.HloSharding.tuple_sharding(
    result_shape,
    [_xc.HloSharding.replicate(), *(arg_shardings[i] for i in aliased)],
  )


def _aliased(config: dict) -> list[int]:
  """The positions among the placeholder's operands (the token is 0) of
  those that it also returns, in order (:func:`read_taps_in_place`)."""
  return [int(i) for i in config.get("aliased", ())]


def _per_device(sharding) -> bool:
  """Whether an operand of this sharding can be tapped where it lies:
  tiled or replicated (not on one device only, nor unknown)."""
  return sharding is not None and (
    sharding.is_tiled() or sharding.is_replicated()
  )


def _bounds_table(
  shardings: Sequence[Any],
  shapes: Sequence[tuple],
  tiles: Sequence[tuple],
  n: int,
) -> np.ndarray:
  """``int64[n, 2 * total rank]``: row ``p`` holds, for the device of
  partition ``p``, each operand's slice bounds (see :func:`slice_bounds`)."""
  to_indices = require(
    _op_shardings,
    "op_sharding_to_indices",
    "to give per-shard taps their slice of the array",
    verb="uses",
  )
  columns = []
  for sharding, shape, tile in zip(shardings, shapes, tiles):
    # JAX's indices need an even split: those of the padded shape, clipped.
    padded_shape = shape
    if sharding.is_tiled():
      ways = sharding.tile_assignment_dimensions()[: len(shape)]
      padded_shape = tuple(t * w for t, w in zip(tile, ways))
    rows = []
    for index in to_indices(sharding, padded_shape, n):
      row = []
      for s, size in zip(index, shape):
        if s == slice(None):
          row += [0, -1]
        else:  # clipped: an uneven sharding's last shards reach past the end
          start, stop = s.indices(size)[:2]
          row += [start, max(start, stop)]
      rows.append(row)
    columns.append(np.asarray(rows, np.int64).reshape(n, 2 * len(shape)))
  return np.concatenate(columns, axis=1)


def _own_row(table: np.ndarray) -> Any:
  """The row of ``table`` of the device that runs the code: its bounds."""
  i32 = _ir.IntegerType.get_signless(32)
  scalar_i32 = _ir.RankedTensorType.get([], i32)
  width = table.shape[1]
  pid = _hlo.convert(scalar_i32, _hlo.PartitionIdOp().result)
  zero = _hlo.constant(_ir.DenseElementsAttr.get(np.zeros((), np.int32)))
  row = _hlo.dynamic_slice(
    _hlo.constant(_ir.DenseElementsAttr.get(table)),
    [pid, zero],
    _ir.DenseI64ArrayAttr.get([1, width]),
  )
  return _hlo.reshape(
    _ir.RankedTensorType.get([width], _ir.IntegerType.get_signless(64)), row
  )


def _partition(
  arg_shapes, arg_shardings, result_shape, result_sharding, backend_config
):
  """Called by XLA's SPMD partitioner: the module that replaces the
  placeholder, and the shardings it takes its operands and gives its
  result in."""
  config = json.loads(bytes(backend_config).decode())
  token_sharding, *shardings = arg_shardings
  shapes = [tuple(s.dimensions()) for s in arg_shapes[1:]]
  dtypes = [np.dtype(s.numpy_dtype()) for s in arg_shapes[1:]]
  # An operand on one device only (or of unknown sharding) is replicated
  # first: every device then taps the whole value.
  shardings = [
    s if _per_device(s) else _xc.HloSharding.replicate() for s in shardings
  ]
  tiles = [
    tuple(sharding.tile(s).dimensions())
    for sharding, s in zip(shardings, arg_shapes[1:])
  ]
  aliased = _aliased(config)
  with _mlir.make_ir_context(), _ir.Location.unknown():
    module = _ir.Module.create()
    types = [_hlo.TokenType.get()]
    for tile, dtype in zip(tiles, dtypes):
      types.append(
        _ir.RankedTensorType.get(list(tile), _mlir.dtype_to_ir_type(dtype))
      )
    result_types = [types[0], *(types[i] for i in aliased)]
    with _ir.InsertionPoint(module.body):
      main = _func.FuncOp("main", _ir.FunctionType.get(types, result_types))
      main.attributes["sym_visibility"] = _ir.StringAttr.get("public")
      block = main.add_entry_block()
      with _ir.InsertionPoint(block):
        operands = list(block.arguments)
        if config["bounds"]:
          operands.append(
            _own_row(_bounds_table(shardings, shapes, tiles, config["devices"]))
          )
        results = _emit_tap(
          config["target"],
          operands,
          {"target_id": config["target_id"]},
          aliased,
        )
        _func.ReturnOp(results)
    code = _mlir.module_to_bytecode(module)
  if aliased:
    # Each returned operand keeps its sharding: nothing is resharded.
    result_sharding = _xc.HloSharding.tuple_sharding(
      result_shape,
      [token_sharding, *(shardings[i - 1] for i in aliased)],
    )
  return code, [token_sharding, *shardings], result_sharding


# ------------------------------------- after lowering: taps read in place
# The first of Shardy's sharding group ids that read_taps_in_place gives in
# a module (counting up), far above those that JAX's shard_alike counts
# from 0 in a process.  The same in every process: the persistent
# compilation cache keys the module.
_FIRST_GROUP_ID = 1 << 48

# How deep read_taps_in_place follows an operand through the calls of
# private functions (a jit or a loop body inside another).
_MAX_CALL_DEPTH = 8


def _operation(op: Any) -> Any:
  """The ``ir.Operation`` of an operation or its OpView."""
  return getattr(op, "operation", op)


def _cast(cls: Any, value: Any) -> Any:
  """``value`` as an ``ir.OpResult`` or ``ir.BlockArgument`` (``cls``), or
  None where it is the other kind."""
  try:
    return cls(value)
  except ValueError:  # the other kind of value: the caller tries that one
    return None


def _string(attr: Any) -> str:
  return _ir.StringAttr(attr).value


def _walk(op: Any):
  """Every operation nested in ``op``, in program order."""
  for region in op.regions:
    for block in region.blocks:
      for inner in block.operations:
        inner = _operation(inner)
        yield inner
        yield from _walk(inner)


def _ancestor_in(block: Any, op: Any) -> Any:
  """The operation of ``block`` that is or holds ``op``, or None."""
  while op is not None:
    if op.block == block:
      return op
    parent = op.parent
    op = None if parent is None else _operation(parent)
  return None


def _writable(value: Any, calls: dict, depth: int = 0) -> bool:
  """Whether XLA may let a custom call return ``value``'s buffer as its
  result without copying it first: the result of an operation other than
  a constant, an array carried by a loop (the argument of a ``while``
  body), or the argument of a private function whose every call passes
  such a value that nothing else uses.  Not the program's own arguments
  (their buffers are the caller's).  Where this is wrong XLA copies, as
  it does today: never a wrong value."""
  result = _cast(_ir.OpResult, value)
  if result is not None:
    return _operation(result.owner).name != "stablehlo.constant"
  arg = _cast(_ir.BlockArgument, value)
  if arg is None:
    return False
  block = arg.owner
  parent = _operation(block.owner)
  if parent.name == "stablehlo.while":
    return block.region == parent.regions[1]  # the body, not the condition
  if parent.name != "func.func" or depth >= _MAX_CALL_DEPTH:
    return False
  attrs = parent.attributes
  if "sym_visibility" not in attrs or _string(attrs["sym_visibility"]) != (
    "private"
  ):
    return False
  sites = calls.get(_string(attrs["sym_name"]), [])
  for call in sites:
    passed = call.operands[arg.arg_number]
    if len(list(passed.uses)) != 1 or not _writable(passed, calls, depth + 1):
      return False
  return bool(sites)


def _later_uses(tap: Any, value: Any) -> list | None:
  """The uses ``(operation, operand number)`` of ``value`` other than by
  ``tap``, if every one of them comes after ``tap`` (in its block, or
  nested in an operation after it); else None."""
  block = tap.block
  later = []
  for use in value.uses:
    owner = _operation(use.owner)
    if owner == tap or owner.name == "sdy.sharding_group":
      continue  # (a sharding group reads nothing: see _read_in_place)
    ancestor = _ancestor_in(block, owner)
    if ancestor is None or ancestor == tap:
      return None
    if not tap.is_before_in_block(ancestor):
      return None
    later.append((owner, use.operand_number))
  return later


def _read_in_place(tap: Any, mesh: str, calls: dict, group_ids: Any) -> bool:
  """Rewrites one placeholder (see :func:`read_taps_in_place`); returns
  whether it did."""
  config = json.loads(_string(tap.attributes["backend_config"]))
  if not config.get("in_place"):
    return False
  operands = list(tap.operands)
  chosen = []
  for i in range(1, len(operands)):
    value = operands[i]
    if sum(1 for other in operands if other == value) > 1:
      continue  # one buffer, two operands: it cannot be returned twice
    later = _later_uses(tap, value)
    if later and _writable(value, calls):
      chosen.append((i, later))
  if not chosen:
    return False
  config["aliased"] = [i for i, _ in chosen]
  shardings = str(tap.attributes["sdy.sharding"])
  assert shardings.endswith("]>"), shardings
  opened = [
    f"<@{mesh}, ["
    + ", ".join(["{?}"] * _ir.RankedTensorType(operands[i].type).rank)
    + "]>"
    for i, _ in chosen
  ]
  # (By index: iterating gives names on jax 0.10.2, pairs on 0.8.0.)
  attributes = {}
  for k in range(len(tap.attributes)):
    named = tap.attributes[k]
    attributes[named.name] = named.attr
  attributes["backend_config"] = _ir.StringAttr.get(
    json.dumps(config, sort_keys=True)
  )
  # The returned arrays' shardings are left open: Shardy gives them the
  # operands' (the partitioner returns each operand's own).
  attributes["sdy.sharding"] = _ir.Attribute.parse(
    shardings[:-2] + ", " + ", ".join(opened) + "]>"
  )
  new = _ir.Operation.create(
    "stablehlo.custom_call",
    results=[tap.results[0].type, *(operands[i].type for i, _ in chosen)],
    operands=operands,
    attributes=attributes,
    loc=tap.location,
    ip=_ir.InsertionPoint(tap),
  )
  tap.results[0].replace_all_uses_with(new.results[0])
  i64 = _ir.IntegerType.get_signless(64)
  for k, (i, later) in enumerate(chosen):
    for owner, number in later:
      owner.operands[number] = new.results[k + 1]
    # The operand and the returned array get one sharding (Shardy's
    # sharding groups; JAX's shard_alike makes the same).
    group = _ir.IntegerAttr.get(i64, next(group_ids))
    for value in (operands[i], new.results[k + 1]):
      _ir.Operation.create(
        "sdy.sharding_group",
        operands=[value],
        attributes={"group_id": group},
        loc=tap.location,
        ip=_ir.InsertionPoint(tap),
      )
  tap.erase()
  return True


def read_taps_in_place(module: Any) -> int:
  """Lets the per-shard taps of a lowered ``module`` read their operands
  where they lie, without a copy by XLA first (see the module docstring);
  returns how many placeholders it rewrote.

  A placeholder's array operand is returned by it (and its later uses
  read that result) where every other use of it comes after the tap and
  XLA may reuse its buffer (:func:`_writable`); elsewhere the tap stays as
  it was lowered.  Either way every value is the one the program
  computed: the tap writes nothing.  Only with Shardy's shardings and one
  mesh (the module's ``sdy.mesh`` other than a one-device one), which the
  returned arrays' open shardings name.
  """
  meshes = [
    op
    for op in map(_operation, module.body.operations)
    if op.name == "sdy.mesh" and "device_ids" not in str(op.attributes["mesh"])
  ]
  if len(meshes) != 1:
    return 0
  mesh = _string(meshes[0].attributes["sym_name"])
  calls: dict[str, list] = {}
  taps = []
  for op in _walk(_operation(module.operation)):
    if op.name == "func.call":
      callee = _ir.FlatSymbolRefAttr(op.attributes["callee"]).value
      calls.setdefault(callee, []).append(op)
    elif (
      op.name == "stablehlo.custom_call"
      and _string(op.attributes["call_target_name"]) == PLACEHOLDER_TARGET
      and len(op.results) == 1  # not rewritten yet
      and "sdy.sharding" in op.attributes
    ):
      taps.append(op)
  with module.context, _ir.Location.unknown(module.context):
    group_ids = itertools.count(_FIRST_GROUP_ID)
    return sum(_read_in_place(tap, mesh, calls, group_ids) for tap in taps)
