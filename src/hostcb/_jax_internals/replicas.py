"""``xla_computation``: lowering per replica of an ``axis_env`` grid, shardings, XlaComputation.

JAX lowers collectives only inside pmap-free SPMD contexts now; legacy
xla_computation lowered them per replica.  The context below gives JAX's
collective lowerings the named axes of an ``axis_env`` laid out row-major
over replicas (no devices), so they emit replica groups without channel
ids, and ``axis_index`` (whose own rule only knows SPMD contexts) is
computed from the replica id.

``jax.pmap`` is now a ``jit`` of a ``shard_map`` over the first devices of
this machine, so it cannot trace an axis larger than the device count.
While ``xla_computation`` traces (:func:`staging_pmaps`), a ``pmap`` is
staged instead over an abstract mesh of its axis size, and the per-replica
lowering gives that ``shard_map`` legacy's meaning: the pmap axis becomes an
inner axis of the replica grid, each replica takes its block of the mapped
operands, and the blocks of the results are put back together with an
all-reduce.

Part of :mod:`hostcb._jax_internals`, the only place that imports ``jax._src``;
checked against jax 0.8.0, 0.10.2, 0.11.2 and 0.12.0.1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import itertools
import math as _math
import threading
import types
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from jax._src import core as _core
from jax._src import effects as _effects
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import mlir as _mlir
from jax._src.lax import parallel as _parallel
from jax._src.lib import _jax as _jaxlib_jax
from jax._src.lib import xla_client as _xc
from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import hlo as _hlo

from hostcb._jax_internals.dispatch import (
  ordered_lowerings,
  without_order_token,
)
from hostcb._jax_internals.versions import (
  changed,
  check_shape,
  jax_at_least,
  require,
)

try:  # jax >= 0.9: pmap is a jit of a shard_map
  from jax._src import pmap as _pmap_impl
  from jax._src import shard_map as _shard_map_impl
except ImportError:
  _pmap_impl = _shard_map_impl = None
# The pmap staging below wraps helpers of jax 0.10's pmap (checked on
# 0.10.2); jax 0.8's pmap has helpers of the same names with other
# signatures.  There, a pmap inside xla_computation behaves as JAX's own.
if not jax_at_least(0, 10):
  _pmap_impl = None
elif _pmap_impl is None:
  import warnings

  warnings.warn(
    f"hostcb: jax {jax.__version__} has no jax._src.pmap; a pmap inside "
    "hostcb.xla_computation is lowered by JAX's own rules (no per-replica "
    "HLO)",
    RuntimeWarning,
    stacklevel=2,
  )

try:
  from jax._src.lib import hlo as _hlo_lib

  HloPrintOptions = _hlo_lib.HloPrintOptions
except (ImportError, AttributeError):  # jaxlib 0.8
  HloPrintOptions = _jaxlib_jax.HloPrintOptions


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
  """Lowering context of a computation run once per replica of a grid.

  ``replicas[0]`` collects the largest replica count that the lowering
  needs (pmaps inside add inner axes to the grid).
  """

  mesh: _ReplicaGrid
  replicas: list = dataclasses.field(
    default_factory=lambda: [1], compare=False, hash=False
  )


def _replica_axis_index(grid: _ReplicaGrid, axis_name: Any) -> Any:
  """The index along ``axis_name`` of this replica, as a uint32 scalar.

  ``(replica_id / stride) % size``, where stride is the product of the
  sizes of the axes after this one: replica ids number the axes row-major.
  """
  if axis_name not in grid.axis_names:
    raise NameError(
      f"axis_index: unbound axis name {axis_name!r}; the "
      f"axis_env names {list(grid.axis_names)}"
    )
  pos = grid.axis_names.index(axis_name)
  stride = _mlir.ir_constant(
    np.array(_math.prod(grid.axis_sizes[pos + 1 :]), np.uint32)
  )
  size = _mlir.ir_constant(np.array(grid.axis_sizes[pos], np.uint32))
  return _hlo.remainder(_hlo.divide(_hlo.replica_id(), stride), size)


def _axis_index_from_replica_id(ctx, *, axis_name) -> list:
  grid = ctx.module_context.axis_context.mesh
  if isinstance(axis_name, (tuple, list)):
    if len(axis_name) != 1:
      raise NotImplementedError(
        f"axis_index of several axes at once; got {tuple(axis_name)}"
      )
    (axis_name,) = axis_name
  index = _replica_axis_index(grid, axis_name)
  i32 = _ir.RankedTensorType.get([], _ir.IntegerType.get_signless(32))
  return [_hlo.convert(i32, index)]


# ------------------------------------------------------- pmap, per replica
class _StagedDevices(tuple):
  """What stands for pmap's devices while ``xla_computation`` traces.

  Only its length, the pmap's axis size, is used: no device is needed.
  """


_staging = threading.local()


@contextlib.contextmanager
def staging_pmaps() -> Iterator[None]:
  """In this thread, ``jax.pmap`` stages out whatever the device count.

  Within the context, a ``pmap`` traces to a ``shard_map`` over an abstract
  mesh of its axis size, which :func:`lower_for_replicas` lowers per
  replica, as legacy ``xla_computation`` lowered ``pmap``.  Calling a pmap
  eagerly inside the context is not supported.
  """
  _install_pmap_staging()
  depth = getattr(_staging, "depth", 0)
  _staging.depth = depth + 1
  try:
    yield
  finally:
    _staging.depth = depth


def _staging_active() -> bool:
  return getattr(_staging, "depth", 0) > 0


def _squeeze_at(x: Any, axis: int | None) -> Any:
  return x if axis is None else jax.lax.squeeze(x, [axis])


def _expand_at(x: Any, axis: int | None) -> Any:
  return x if axis is None else jax.lax.expand_dims(x, [axis])


def _staged_pmap(
  fun: Any,
  in_tree: Any,
  in_axes_flat: Sequence[Any],
  out_axes_flat: Sequence[Any],
  out_axes_tree: Any,
  axis_name: Any,
  axis_size: int,
) -> Any:
  """pmap's cached shard_map, over an abstract mesh of ``axis_size``."""
  if getattr(_staging, "pmap_depth", 0):
    raise NotImplementedError(
      "xla_computation: a pmap inside another pmap is not supported "
      f"(inner axis {axis_name!r}); give the outer axes in axis_env "
      "instead, e.g. xla_computation(f, axis_env=[('i', 2)]) around the "
      "inner pmap"
    )
  # Auto, as the Mesh of pmap's own shard_map: an AbstractMesh's axes are
  # Auto by default up to jax 0.10 but Explicit from jax 0.11 on, and over
  # Explicit axes shard_map asks the operands' types to carry the mesh
  # sharding of in_specs, which a traced operand does not.
  mesh = jax.sharding.AbstractMesh(
    (axis_size,), (axis_name,), axis_types=(jax.sharding.AxisType.Auto,)
  )
  tree_util = jax.tree_util
  out_axes = tree_util.tree_unflatten(out_axes_tree, list(out_axes_flat))
  to_pspec = require(_shard_map_impl, "_axes_to_pspec", _PMAP_WHAT, "uses")
  in_specs = tuple(to_pspec(axis_name, ax) for ax in in_axes_flat)
  out_specs = tree_util.tree_map(
    lambda ax: to_pspec(axis_name, ax),
    out_axes,
    is_leaf=lambda x: x is None,
  )

  def body(*flat_args):
    args, kwargs = tree_util.tree_unflatten(
      in_tree, [_squeeze_at(x, ax) for x, ax in zip(flat_args, in_axes_flat)]
    )
    _staging.pmap_depth = getattr(_staging, "pmap_depth", 0) + 1
    try:
      out = fun.call_wrapped(*args, **kwargs)
    finally:
      _staging.pmap_depth -= 1
    return tree_util.tree_map(
      lambda ax, sub: tree_util.tree_map(lambda x: _expand_at(x, ax), sub),
      out_axes,
      out,
      is_leaf=lambda x: x is None,
    )

  jitted = jax.jit(
    jax.shard_map(
      body,
      mesh=mesh,
      in_specs=in_specs,
      out_specs=out_specs,
      check_vma=False,
      axis_names={axis_name},
    )
  )
  return types.SimpleNamespace(jitted_f=jitted, jitted_f_with_shardings=jitted)


_PMAP_WHAT = "to lower a pmap inside xla_computation per replica"
_GET_DEVICES = "jax._src.pmap._get_mesh_devices"
_CACHED_SHARD_MAP = "jax._src.pmap._cached_shard_map"
# The parameters of _get_mesh_devices that hostcb reads, one of which names
# the pmap's axis size (jax 0.10.2, 0.11.2 and 0.12.0.1).
_SIZE_PARAMETERS = ("axis_size", "local_axis_size")
# _cached_shard_map(fun, in_tree, in_axes_flat, out_axes_flat,
#                   out_axes_tree, donated_invars, mesh_devices, axis_name)
# (lu.cache hides the signature): 8 positional arguments, the devices that
# _get_mesh_devices returned 7th.
_SHARD_MAP_ARGS, _DEVICES_AT = 8, 6


def _staged_devices_at(args: tuple, kwargs: dict) -> bool:
  """Whether a call of ``_cached_shard_map`` is one of a staged pmap: its
  mesh devices are :class:`_StagedDevices`, where hostcb reads them (else,
  where they are elsewhere, :class:`JaxInternalChanged`)."""
  staged = [i for i, a in enumerate(args) if isinstance(a, _StagedDevices)] + [
    k for k, a in kwargs.items() if isinstance(a, _StagedDevices)
  ]
  if not staged:
    return False
  if kwargs or len(args) != _SHARD_MAP_ARGS or staged != [_DEVICES_AT]:
    raise changed(
      f"the arguments of {_CACHED_SHARD_MAP}",
      f"{_SHARD_MAP_ARGS} positional arguments, the mesh devices at "
      f"position {_DEVICES_AT}",
      f"{len(args)} positional arguments and keywords {sorted(kwargs)}, "
      f"the mesh devices at {staged}",
      _PMAP_WHAT,
    )
  return True


def _install_pmap_staging() -> None:
  """Wraps two helpers of ``jax.pmap`` (jax 0.10.2) once, per thread inert.

  Outside :func:`staging_pmaps` they behave exactly as JAX's own.
  """
  if _pmap_impl is None or getattr(_pmap_impl, "_hostcb_staging", False):
    return
  get_devices = require(_pmap_impl, "_get_mesh_devices", _PMAP_WHAT)
  cached = require(_pmap_impl, "_cached_shard_map", _PMAP_WHAT)
  devices_sig = inspect.signature(get_devices)
  if not set(_SIZE_PARAMETERS) & set(devices_sig.parameters):
    raise changed(
      f"the signature of {_GET_DEVICES}",
      "a parameter " + " or ".join(_SIZE_PARAMETERS),
      str(devices_sig),
      _PMAP_WHAT,
    )

  def mesh_devices(*args, **kwargs):
    if not _staging_active():
      return get_devices(*args, **kwargs)
    given = devices_sig.bind(*args, **kwargs).arguments
    size = next((given[p] for p in _SIZE_PARAMETERS if given.get(p)), None)
    if not isinstance(size, int):
      raise changed(
        f"the arguments of {_GET_DEVICES}",
        "an int axis size in " + " or ".join(_SIZE_PARAMETERS),
        repr(size),
        _PMAP_WHAT,
      )
    return _StagedDevices((None,) * size)

  def cached_shard_map(*args, **kwargs):
    if not _staged_devices_at(args, kwargs):
      return cached(*args, **kwargs)
    fun, in_tree, in_axes, out_axes, out_tree, _, devices, name = args
    return _staged_pmap(
      fun, in_tree, in_axes, out_axes, out_tree, name, len(devices)
    )

  _pmap_impl._get_mesh_devices = mesh_devices
  _pmap_impl._cached_shard_map = cached_shard_map
  _pmap_impl._hostcb_staging = True


def _spec_entries(spec: Any, ndim: int) -> list[tuple]:
  """Per dimension, the mesh axis names a PartitionSpec splits it over."""
  entries = []
  for d in range(ndim):
    entry = spec[d] if d < len(spec) else None
    if entry is None:
      entries.append(())
    elif isinstance(entry, (tuple, list)):
      entries.append(tuple(entry))
    else:
      entries.append((entry,))
  return entries


def _block_start(grid: _ReplicaGrid, names: tuple, block: int) -> Any:
  """The int32 offset of this replica's block along axes ``names``."""
  u32 = lambda v: _mlir.ir_constant(np.array(v, np.uint32))
  index = None
  for k, name in enumerate(names):
    term = _replica_axis_index(grid, name)
    scale = _math.prod(
      grid.axis_sizes[grid.axis_names.index(n)] for n in names[k + 1 :]
    )
    if scale != 1:
      term = _hlo.multiply(term, u32(scale))
    index = term if index is None else _hlo.add(index, term)
  start = _hlo.multiply(index, u32(block))
  i32 = _ir.RankedTensorType.get([], _ir.IntegerType.get_signless(32))
  return _hlo.convert(i32, start)


def _starts(
  grid: _ReplicaGrid, entries: list[tuple], block_shape: Sequence[int]
) -> list:
  zero = _mlir.ir_constant(np.array(0, np.int32))
  return [
    _block_start(grid, names, size) if names else zero
    for names, size in zip(entries, block_shape)
  ]


def _replica_groups_over(grid: _ReplicaGrid, names: set) -> list[list[int]]:
  """Replica groups whose members differ only along the axes ``names``."""
  ids = np.arange(grid.size).reshape(grid.axis_sizes)
  inner = [i for i, n in enumerate(grid.axis_names) if n in names]
  outer = [i for i, n in enumerate(grid.axis_names) if n not in names]
  moved = np.transpose(ids, outer + inner)
  group_size = _math.prod(grid.axis_sizes[i] for i in inner)
  return moved.reshape(-1, group_size).tolist()


def _replica_groups_attr(groups: list[list[int]]) -> Any:
  """The ``replica_groups`` attribute of an all-reduce: an int64 matrix,
  one row per group (JAX's own helper for it was renamed in jax 0.11)."""
  return _ir.DenseIntElementsAttr.get(
    np.ascontiguousarray(np.array(groups, dtype=np.int64))
  )


def _sum_over_replicas(ctx, x: Any, aval: Any, groups: list[list[int]]) -> Any:
  """An all-reduce of ``x`` in ``groups`` (logical or for booleans)."""
  op = _hlo.AllReduceOp(
    [x.type], [x], replica_groups=_replica_groups_attr(groups)
  )
  scalar = _mlir.aval_to_ir_type(
    ctx.module_context, _core.ShapedArray((), aval.dtype)
  )
  block = op.regions[0].blocks.append(scalar, scalar)
  with _ir.InsertionPoint(block):
    a, b = block.arguments
    combine = _hlo.or_ if aval.dtype == np.bool_ else _hlo.add
    _hlo.return_([combine(a, b)])
  return op.result


_SHARD_MAP_P = "jax._src.shard_map.shard_map_p"
_SUBCOMP = "jax._src.interpreters.mlir.jaxpr_subcomp"


def _checked_subcomp(result: Any) -> Any:
  """What ``jaxpr_subcomp`` returned, once it is the pair hostcb unpacks
  (the results, the tokens out; else :class:`JaxInternalChanged`)."""
  return check_shape(
    result,
    f"the result of {_SUBCOMP}",
    _PMAP_WHAT,
    types=tuple,
    lengths=(2,),
  )


def _shard_map_per_replica(
  ctx, *args, jaxpr, mesh, in_specs, out_specs, **params
) -> Sequence[Any]:
  """A ``shard_map`` (a staged pmap) run per replica of an extended grid."""
  del params
  outer = ctx.module_context.axis_context.mesh
  check_shape(
    mesh,
    f"the mesh parameter of {_SHARD_MAP_P}",
    _PMAP_WHAT,
    fields=("axis_names", "axis_sizes"),
  )
  names, sizes = tuple(mesh.axis_names), tuple(mesh.axis_sizes)
  shadowed = set(names) & set(outer.axis_names)
  if shadowed:
    raise NotImplementedError(
      f"xla_computation: a pmap over the axis name(s) {sorted(shadowed)} "
      "inside a computation that already binds them"
    )
  grid = _ReplicaGrid(outer.axis_names + names, outer.axis_sizes + sizes)
  replicas = ctx.module_context.axis_context.replicas
  replicas[0] = max(replicas[0], grid.size)
  inner_ctx = ctx.module_context.replace(
    axis_context=ReplicaAxisContext(grid, replicas)
  )

  blocks = []
  for x, aval, inner_aval, spec in zip(
    args, ctx.avals_in, [v.aval for v in jaxpr.invars], in_specs
  ):
    entries = _spec_entries(spec, len(aval.shape))
    if not any(entries):
      blocks.append(x)
      continue
    sub = ctx.replace(avals_in=[aval], avals_out=[inner_aval])
    blocks.append(
      _mlir.dynamic_slice(
        sub,
        inner_aval,
        x,
        start_indices=_starts(grid, entries, inner_aval.shape),
      )
    )

  extra = dict(
    dim_var_values=ctx.dim_var_values,
    const_lowering=getattr(ctx, "const_lowering", None),
    outer_traceback=_jaxlib_jax.Traceback(),
  )
  accepted = inspect.signature(_mlir.jaxpr_subcomp).parameters
  extra = {k: v for k, v in extra.items() if k in accepted}
  with _core.extend_axis_env_nd(list(zip(names, sizes))):
    outs, tokens_out = _checked_subcomp(
      _mlir.jaxpr_subcomp(
        inner_ctx, jaxpr, ctx.name_stack, ctx.tokens_in, (), *blocks, **extra
      )
    )
  ctx.set_tokens_out(tokens_out)

  results = []
  for y, aval, inner_aval, spec in zip(
    outs, ctx.avals_out, [v.aval for v in jaxpr.outvars], out_specs
  ):
    entries = _spec_entries(spec, len(aval.shape))
    if not any(entries):
      results.append(y)
      continue
    sub = ctx.replace(avals_in=[aval, inner_aval], avals_out=[aval])
    whole = _mlir.dynamic_update_slice(
      sub,
      aval,
      _mlir.full_like_aval(sub, 0, aval),
      y,
      start_indices=_starts(grid, entries, inner_aval.shape),
    )
    split_over = set(itertools.chain.from_iterable(entries))
    results.append(
      _sum_over_replicas(
        ctx, whole, aval, _replica_groups_over(grid, split_over)
      )
    )
  return results


_REPLICAS_WHAT = "to lower xla_computation per replica of an axis_env"
_TO_MODULE = "jax._src.interpreters.mlir.lower_jaxpr_to_module"


def _replica_context(grid: _ReplicaGrid) -> tuple[Any, Any]:
  """The axis context for ``grid`` and the lowering rules it needs."""
  native = getattr(_sharding_impls, "ReplicaAxisContext", None)
  if native is not None:  # jax 0.8 still lowers per replica by itself
    axis_env = check_shape(
      require(_sharding_impls, "AxisEnv", _REPLICAS_WHAT, "uses"),
      "jax._src.sharding_impls.AxisEnv",
      _REPLICAS_WHAT,
      fields=("nreps", "names", "sizes"),
    )
    env = axis_env(
      nreps=max(grid.size, 1), names=grid.axis_names, sizes=grid.axis_sizes
    )
    return native(env), None
  rules = [(_parallel.axis_index_p, _axis_index_from_replica_id)]
  if _shard_map_impl is not None:
    rules.append((_shard_map_impl.shard_map_p, _shard_map_per_replica))
  return ReplicaAxisContext(grid, [max(grid.size, 1)]), tuple(rules)


def _lowering_parameters(**kwargs) -> Any:
  known = {f.name for f in dataclasses.fields(_mlir.LoweringParameters)}
  return _mlir.LoweringParameters(
    **{k: v for k, v in kwargs.items() if k in known}
  )


def lower_for_replicas(
  closed_jaxpr: Any,
  *,
  module_name: str,
  axis_env: Sequence[tuple[Any, int]],
  platform: str,
  donated: Sequence[bool],
) -> Any:
  """Lowers a closed jaxpr to a StableHLO module, one program per replica.

  ``axis_env`` names the axes that collectives may use; the module has
  ``prod(sizes)`` replicas and one partition.  Constants of the jaxpr are
  folded into the module.  Returns the ``ir.Module``.
  """
  grid = _ReplicaGrid(
    tuple(n for n, _ in axis_env), tuple(int(s) for _, s in axis_env)
  )
  context, overrides = _replica_context(grid)
  params = _lowering_parameters(
    override_lowering_rules=overrides, hoist_constants_as_args=False
  )
  kwargs = dict(
    num_const_args=0,
    in_avals=closed_jaxpr.in_avals,
    out_avals=closed_jaxpr.out_avals,  # jax >= 0.11 asks for them
    ordered_effects=list(
      _effects.ordered_effects.filter_in(closed_jaxpr.effects)
    ),
    platforms=[platform],
    backend=None,
    axis_context=context,
    donated_args=list(donated),
    lowering_parameters=params,
  )
  accepted = inspect.signature(_mlir.lower_jaxpr_to_module).parameters
  kwargs = {k: v for k, v in kwargs.items() if k in accepted}
  ordered_before = ordered_lowerings()
  result = _mlir.lower_jaxpr_to_module(module_name, closed_jaxpr, **kwargs)
  module = check_shape(
    result, f"the result of {_TO_MODULE}", _REPLICAS_WHAT, fields=("module",)
  ).module
  check_shape(
    module, f"{_TO_MODULE}(...).module", _REPLICAS_WHAT, types=_ir.Module
  )
  if ordered_lowerings() == ordered_before:
    # Only pure calls carry hostcb's effect: no token in the signature, as
    # before they carried it (legacy's pure calls had none).
    without_order_token(
      module, kwargs.get("ordered_effects", []), 0, lone=platform == "cpu"
    )
  replicas = max(grid.size, 1)
  if isinstance(context, ReplicaAxisContext):
    replicas = context.replicas[0]  # pmaps inside may need more
  with module.context:
    module.operation.attributes["mhlo.num_replicas"] = _mlir.i32_attr(replicas)
    # JAX strips trailing underscores (``_lambda_``); keep the name given.
    module.operation.attributes["sym_name"] = _ir.StringAttr.get(module_name)
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


def _with_shardings(
  old: Any, count: int, shardings: Sequence[str | None]
) -> Any:
  # Token arguments/results of ordered effects come first: align the
  # shardings with the trailing ``len(shardings)`` entries.
  old_dicts = (
    [_ir.DictAttr(d) for d in old]
    if old is not None
    else [_ir.DictAttr.get({}) for _ in range(count)]
  )
  offset = count - len(shardings)
  new = []
  for i, attrs in enumerate(old_dicts):
    items = {named.name: named.attr for named in attrs}
    if i >= offset and shardings[i - offset] is not None:
      items["mhlo.sharding"] = _ir.StringAttr.get(shardings[i - offset])
    new.append(_ir.DictAttr.get(items))
  return _ir.ArrayAttr.get(new)


def annotate_shardings(
  module: Any,
  *,
  args: Sequence[str | None] | None,
  results: Sequence[str | None] | None,
  num_partitions: int,
) -> None:
  """Puts XLA sharding texts on the main function's parameters/results."""
  main = _main_function(module)
  with module.context:
    ftype = _ir.FunctionType(
      _ir.TypeAttr(main.attributes["function_type"]).value
    )
    if args is not None:
      old = (
        main.attributes["arg_attrs"] if "arg_attrs" in main.attributes else None
      )
      main.attributes["arg_attrs"] = _with_shardings(
        old, len(ftype.inputs), args
      )
    if results is not None:
      old = (
        main.attributes["res_attrs"] if "res_attrs" in main.attributes else None
      )
      main.attributes["res_attrs"] = _with_shardings(
        old, len(ftype.results), results
      )
    module.operation.attributes["mhlo.num_partitions"] = _mlir.i32_attr(
      num_partitions
    )


def to_xla_computation(module: Any, *, tuple_args: bool) -> Any:
  """Converts a StableHLO module to XLA's ``XlaComputation`` (tuple result)."""
  return _jaxlib_jax.mlir.mlir_module_to_xla_computation(
    _mlir.module_to_bytecode(module),
    use_tuple_args=tuple_args,
    return_tuple=True,
  )


def xla_computation_from_proto(serialized: bytes) -> Any:
  """A fresh ``XlaComputation`` from a serialized ``HloModuleProto``."""
  return _xc.XlaComputation(serialized)
