"""``xla_computation``: lowering per replica of an ``axis_env`` grid, shardings, XlaComputation.

JAX lowers collectives only inside pmap-free SPMD contexts now; legacy
xla_computation lowered them per replica.  The context below gives JAX's
collective lowerings the named axes of an ``axis_env`` laid out row-major
over replicas (no devices), so they emit replica groups without channel
ids, and ``axis_index`` (whose own rule only knows SPMD contexts) is

Part of :mod:`hostcb.jax_internals`, the only place that imports ``jax._src``;
checked against jax 0.8.0 and 0.10.2.
"""
from __future__ import annotations

import dataclasses
import inspect
import math as _math
from typing import Any, Sequence

import numpy as np
from jax._src import effects as _effects
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import mlir as _mlir
from jax._src.lax import parallel as _parallel
from jax._src.lib import _jax as _jaxlib_jax
from jax._src.lib import xla_client as _xc
from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import hlo as _hlo


@dataclasses.dataclass(frozen=True)
class _ReplicaGrid:
  """Named axes of sizes ``axis_sizes``; replica ids number them row-major.

  It answers what JAX's collective lowerings ask of a mesh (names, sizes,
  total size) and holds no devices.
  """
  axis_names: tuple
  axis_sizes: tuple

  @property
  def size(self) -> int:
    return _math.prod(self.axis_sizes)


@dataclasses.dataclass(frozen=True)
class ReplicaAxisContext:
  """Lowering context of a computation run once per replica of a grid."""
  mesh: _ReplicaGrid


def _axis_index_from_replica_id(ctx, *, axis_name) -> list:
  # (replica_id / stride) % size, where stride is the product of the sizes
  # of the axes after this one: replica ids number the axes row-major.
  grid = ctx.module_context.axis_context.mesh
  if isinstance(axis_name, (tuple, list)):
    if len(axis_name) != 1:
      raise NotImplementedError(
          f"axis_index of several axes at once; got {tuple(axis_name)}")
    axis_name, = axis_name
  if axis_name not in grid.axis_names:
    raise NameError(f"axis_index: unbound axis name {axis_name!r}; the "
                    f"axis_env names {list(grid.axis_names)}")
  pos = grid.axis_names.index(axis_name)
  stride = _mlir.ir_constant(
      np.array(_math.prod(grid.axis_sizes[pos + 1:]), np.uint32))
  size = _mlir.ir_constant(np.array(grid.axis_sizes[pos], np.uint32))
  index = _hlo.remainder(_hlo.divide(_hlo.replica_id(), stride), size)
  i32 = _ir.RankedTensorType.get([], _ir.IntegerType.get_signless(32))
  return [_hlo.convert(i32, index)]


def _replica_context(grid: _ReplicaGrid) -> tuple[Any, Any]:
  """The axis context for ``grid`` and the lowering rules it needs."""
  native = getattr(_sharding_impls, "ReplicaAxisContext", None)
  if native is not None:  # jax 0.8 still lowers per replica by itself
    env = _sharding_impls.AxisEnv(max(grid.size, 1), grid.axis_names,
                                  grid.axis_sizes)
    return native(env), None
  return (ReplicaAxisContext(grid),
          ((_parallel.axis_index_p, _axis_index_from_replica_id),))


def _lowering_parameters(**kwargs) -> Any:
  known = {f.name for f in dataclasses.fields(_mlir.LoweringParameters)}
  return _mlir.LoweringParameters(
      **{k: v for k, v in kwargs.items() if k in known})


def lower_for_replicas(closed_jaxpr: Any, *, module_name: str,
                       axis_env: Sequence[tuple[Any, int]], platform: str,
                       donated: Sequence[bool]) -> Any:
  """Lowers a closed jaxpr to a StableHLO module, one program per replica.

  ``axis_env`` names the axes that collectives may use; the module has
  ``prod(sizes)`` replicas and one partition.  Constants of the jaxpr are
  folded into the module.  Returns the ``ir.Module``.
  """
  grid = _ReplicaGrid(tuple(n for n, _ in axis_env),
                      tuple(int(s) for _, s in axis_env))
  context, overrides = _replica_context(grid)
  params = _lowering_parameters(override_lowering_rules=overrides,
                                hoist_constants_as_args=False)
  kwargs = dict(
      num_const_args=0, in_avals=closed_jaxpr.in_avals,
      ordered_effects=list(
          _effects.ordered_effects.filter_in(closed_jaxpr.effects)),
      platforms=[platform], backend=None,
      axis_context=context, donated_args=list(donated),
      lowering_parameters=params)
  accepted = inspect.signature(_mlir.lower_jaxpr_to_module).parameters
  kwargs = {k: v for k, v in kwargs.items() if k in accepted}
  result = _mlir.lower_jaxpr_to_module(module_name, closed_jaxpr, **kwargs)
  module = result.module
  with module.context:
    module.operation.attributes["mhlo.num_replicas"] = _mlir.i32_attr(
        max(grid.size, 1))
  return module


def tiled_sharding_text(tiles: Sequence[int] | None) -> str:
  """XLA's text for a sharding: ``{replicated}`` or ``{devices=[..]..}``.

  ``tiles[d]`` is how many pieces dimension ``d`` is split into; the pieces
  go to devices ``0 .. prod(tiles) - 1`` in row-major order.
  """
  proto = _xc.OpSharding()
  if tiles is None:
    proto.type = _xc.OpSharding.Type.REPLICATED
  else:
    proto.type = _xc.OpSharding.Type.OTHER
    proto.tile_assignment_dimensions = list(tiles)
    proto.tile_assignment_devices = list(range(_math.prod(tiles)))
  return repr(_xc.HloSharding.from_proto(proto))


def _main_function(module: Any) -> Any:
  for op in module.body.operations:
    if _ir.StringAttr(op.attributes["sym_name"]).value == "main":
      return op
  raise AssertionError("lowered module has no main function")


def _with_shardings(old: Any, count: int,
                    shardings: Sequence[str | None]) -> Any:
  # Token arguments/results of ordered effects come first: align the
  # shardings with the trailing ``len(shardings)`` entries.
  old_dicts = ([_ir.DictAttr(d) for d in old] if old is not None
               else [_ir.DictAttr.get({}) for _ in range(count)])
  offset = count - len(shardings)
  new = []
  for i, attrs in enumerate(old_dicts):
    items = {named.name: named.attr for named in attrs}
    if i >= offset and shardings[i - offset] is not None:
      items["mhlo.sharding"] = _ir.StringAttr.get(shardings[i - offset])
    new.append(_ir.DictAttr.get(items))
  return _ir.ArrayAttr.get(new)


def annotate_shardings(module: Any, *, args: Sequence[str | None] | None,
                       results: Sequence[str | None] | None,
                       num_partitions: int) -> None:
  """Puts XLA sharding texts on the main function's parameters/results."""
  main = _main_function(module)
  with module.context:
    ftype = _ir.FunctionType(_ir.TypeAttr(
        main.attributes["function_type"]).value)
    if args is not None:
      old = main.attributes["arg_attrs"] if "arg_attrs" in main.attributes \
          else None
      main.attributes["arg_attrs"] = _with_shardings(
          old, len(ftype.inputs), args)
    if results is not None:
      old = main.attributes["res_attrs"] if "res_attrs" in main.attributes \
          else None
      main.attributes["res_attrs"] = _with_shardings(
          old, len(ftype.results), results)
    module.operation.attributes["mhlo.num_partitions"] = _mlir.i32_attr(
        num_partitions)


def to_xla_computation(module: Any, *, tuple_args: bool) -> Any:
  """Converts a StableHLO module to XLA's ``XlaComputation`` (tuple result)."""
  return _jaxlib_jax.mlir.mlir_module_to_xla_computation(
      _mlir.module_to_bytecode(module), use_tuple_args=tuple_args,
      return_tuple=True)


def xla_computation_from_proto(serialized: bytes) -> Any:
  """A fresh ``XlaComputation`` from a serialized ``HloModuleProto``."""
  return _xc.XlaComputation(serialized)

