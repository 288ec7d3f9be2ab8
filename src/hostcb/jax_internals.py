"""Every use of JAX internals (``jax._src``) in hostcb, and nothing else.

hostcb needs a few things that JAX does not expose publicly: defining a
primitive with an effect and its transformation rules, lowering it to the
custom call that XLA uses for Python callbacks, and the context the lowering
runs in (which devices, which sharding).  They all live here, so that a JAX
upgrade is fixed in this one file.

Checked against jax 0.8.0 and 0.10.2 (``make test`` runs 0.10.2;
``scripts/check_oldest_jax.sh`` runs the test suite against 0.8.0).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Sequence

import numpy as np

from jax._src import callback as _callback
from jax._src import config as _config
from jax._src import core as _core
from jax._src import debugging as _debugging
from jax._src import dispatch as _dispatch
from jax._src import effects as _effects
from jax._src import ffi as _ffi
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import ad as _ad
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import partial_eval as _pe
from jax._src.lib.mlir.dialects import hlo as _hlo

ShapedArray = _core.ShapedArray
Primitive = _core.Primitive
no_effects = _core.no_effects
not_mapped = None  # how batching rules mark an unbatched operand


# ----------------------------------------------------------------- effects
class HostCallbackEffect(_effects.Effect):
  """The effect of a tap or an impure call: the host sees it happen.

  It is ordered in JAX's sense: a token threads through the callbacks of a
  computation (and from one dispatched computation to the next), because
  XLA may otherwise run independent side-effecting custom calls in any
  order.  It is also "shardable", so that multi-device computations accept
  it; within one device the host still sees its callbacks in program order.
  """

  def __str__(self) -> str:
    return "HostCallback"


host_callback_effect = HostCallbackEffect()


def _keep_token_chain_per_computation() -> None:
  """The token of our effect orders callbacks within one computation only.

  JAX also passes an ordered effect's token from one dispatched computation
  to the next; when one fails asynchronously (a ``call`` whose callback
  raised, under pmap), its error token would fail every later computation
  of the thread.  Computations already run in dispatch order on a device,
  so hostcb does not chain them: each gets a fresh token.
  """
  cls = getattr(_dispatch, "RuntimeTokenSet", None)
  original = getattr(cls, "set_token_result", None)
  if original is None or getattr(original, "_hostcb", False):
    return

  def set_token_result(self, eff, token):
    if isinstance(eff, HostCallbackEffect):
      return
    original(self, eff, token)

  # Since the token is not chained, every computation on the same devices
  # can start from the same ready token: make it once per device tuple
  # instead of copying it to the devices at every dispatch.
  original_get = cls.get_token_input
  fresh_tokens: dict = {}

  def get_token_input(self, eff, devices):
    if not isinstance(eff, HostCallbackEffect):
      return original_get(self, eff, devices)
    key = tuple(devices)
    token = fresh_tokens.get(key)
    if token is None:
      self.current_tokens.pop(eff, None)
      token = fresh_tokens[key] = original_get(self, eff, devices)
      self.current_tokens.pop(eff, None)
    return token

  set_token_result._hostcb = True
  cls.set_token_result = set_token_result
  cls.get_token_input = get_token_input


_keep_token_chain_per_computation()


def wait_for_this_threads_computations() -> None:
  """Waits for the computations this thread dispatched to finish.

  A computation that failed already reported its error to its caller; its
  error does not make this wait fail.
  """
  try:
    _dispatch.runtime_tokens.block_until_ready()
  except Exception:  # noqa: BLE001
    _dispatch.runtime_tokens.clear()


for _effect_set in (_effects.ordered_effects,
                    _effects.shardable_ordered_effects,
                    _effects.lowerable_effects,
                    _effects.control_flow_allowed_effects,
                    _effects.remat_allowed_effects,
                    _effects.custom_derivatives_allowed_effects,
                    _effects.partial_eval_kept_effects):
  _effect_set.add_type(HostCallbackEffect)


# -------------------------------------------------------------- primitives
def new_primitive(name: str) -> Primitive:
  """A multiple-results primitive whose lowering may ask for the devices."""
  prim = _core.Primitive(name)
  prim.multiple_results = True
  # Makes jit pass the device assignment to the lowering, even for a single
  # device, so the host side knows which device a callback comes from.
  _dispatch.prim_requires_devices_during_lowering.add(prim)
  prim.def_impl(functools.partial(_dispatch.apply_primitive, prim))
  return prim


def apply_compiled(prim: Primitive, *args, **params):
  """Runs ``prim`` eagerly as a compiled computation (cached per params)."""
  return _dispatch.apply_primitive(prim, *args, **params)


def register_jvp(prim: Primitive, rule: Callable) -> None:
  _ad.primitive_jvps[prim] = rule


def register_transpose(prim: Primitive, rule: Callable) -> None:
  _ad.primitive_transposes[prim] = rule


def register_batching(prim: Primitive, rule: Callable) -> None:
  _batching.primitive_batchers[prim] = rule


def rematerialize_on_backward_pass(prim: Primitive) -> None:
  """Under ``checkpoint``, also run ``prim`` again when residuals are rebuilt.

  Without this rule partial evaluation keeps an effectful equation only in
  the forward pass; legacy taps ran again during rematerialization.
  """
  _pe.partial_eval_jaxpr_custom_rules[prim] = functools.partial(
      _debugging._debug_partial_eval_custom, primitive=prim)


def register_lowering(prim: Primitive, rule: Callable) -> None:
  _mlir.register_lowering(prim, rule)


# ----------------------------------------------------------- jax.config
def register_config_options(on_update: Callable[[str, Any], None],
                            inline: bool, max_queue_bytes: int) -> None:
  """Makes ``jax.config.update('jax_host_callback_...', v)`` work again."""
  for name, make, default in (
      ("jax_host_callback_inline", _config.bool_state, inline),
      ("jax_host_callback_max_queue_byte_size", _config.int_state,
       max_queue_bytes)):
    try:
      make(name=name, default=default,
           help="hostcb: see hostcb.config",
           update_global_hook=functools.partial(on_update, name))
    except Exception:  # already defined (e.g. module reloaded): keep going
      pass


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


def _placement(ctx, device_index: int) -> tuple[Placement, Any]:
  axis_context = ctx.module_context.axis_context
  if isinstance(axis_context, _sharding_impls.SPMDAxisContext):
    mesh = axis_context.mesh
    devices = getattr(mesh, "_flat_devices_tuple", None)
    sharding = _callback._callback_op_sharding(axis_context, None,
                                               ctx.avals_out)
    return Placement(devices, True, 0), sharding
  if isinstance(axis_context, _sharding_impls.ShardingContext):
    devices = axis_context.device_assignment
    n = axis_context.num_devices
    if n == 1:
      device_index = 0  # a one-device computation taps where it runs
    elif not 0 <= device_index < n:
      raise ValueError(
          f"device_index must name one of the {n} devices of the computation "
          f"(0 to {n - 1}); got device_index={device_index}")
    single = None
    if devices is not None and n > 1:
      single = _sharding_impls.SingleDeviceSharding(devices[device_index])
    sharding = _callback._callback_op_sharding(axis_context, single,
                                               ctx.avals_out)
    return Placement(devices, False, device_index), sharding
  return Placement(None, False, 0), None


_FFI_TARGETS = {"cpu": "xla_ffi_python_cpu_callback",
                "cuda": "xla_ffi_python_gpu_callback",
                "rocm": "xla_ffi_python_gpu_callback"}


def emit_host_callback(ctx, make_host_fn: Callable[[Placement], Callable],
                       args: Sequence[Any], *, device_index: int,
                       has_side_effect: bool) -> Sequence[Any]:
  """Lowers a call of a host function on the operands ``args``.

  ``make_host_fn(placement)`` returns the function that XLA calls with NumPy
  arrays (preceded by the partition id in per-device code) and that returns
  a tuple of arrays matching ``ctx.avals_out``.
  """
  platform = lowering_platform(ctx)
  placement, sharding = _placement(ctx, device_index)
  host_fn = make_host_fn(placement)
  target = _FFI_TARGETS.get(platform)
  if target is None:
    # Other platforms (TPU) go through JAX's send/recv based callbacks.
    if placement.per_device:
      raise NotImplementedError(
          f"hostcb per-device callbacks are not supported on {platform}")
    results, _, _ = _callback.emit_python_callback(
        ctx, host_fn, None, list(args), ctx.avals_in, ctx.avals_out,
        has_side_effect=has_side_effect, returns_token=False,
        sharding=sharding)
    return results
  operands, avals_in, avals_out = _operands(ctx, args, placement)
  token = (ctx.tokens_in.get(host_callback_effect) if has_side_effect
           else None)
  if token is not None:
    # The token keeps the callbacks of a computation in program order: XLA
    # may reorder side-effecting custom calls that do not depend on each
    # other.
    operands.insert(0, token)
    avals_in.insert(0, _core.abstract_token)
    avals_out.insert(0, _core.abstract_token)
    host_fn = _with_token(host_fn)
    sharding = _with_token_sharding(sharding, bool(ctx.avals_out))
  return _emit_ffi_call(ctx, target, host_fn, operands, avals_in, avals_out,
                        has_side_effect=has_side_effect, sharding=sharding,
                        token_effect=(host_callback_effect if token is not None
                                      else None))


def _emit_ffi_call(ctx, target: str, host_fn: Callable, operands, avals_in,
                   avals_out, *, has_side_effect: bool, sharding,
                   token_effect=None, aliases=None) -> list:
  """Emits the custom call ``target`` of the host function ``host_fn``.

  With ``token_effect``, the first operand and result are that effect's
  token, which becomes the computation's current token for the effect.
  """
  lower_ctx = dataclasses.replace(ctx, avals_in=avals_in, avals_out=avals_out)
  ctx.module_context.add_host_callback(host_fn)
  index = np.uint64(len(ctx.module_context.host_callbacks) - 1)
  op = _ffi.build_ffi_lowering_function(
      target, has_side_effect=has_side_effect,
      operand_output_aliases=aliases or None)(lower_ctx, *operands,
                                              index=index)
  if sharding is not None:
    _set_sharding(ctx.module_context, op, sharding)
  results = list(op.results)
  if token_effect is not None:
    token_out, *results = results
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(
        _mlir.TokenSet({token_effect: token_out})))
  return results


def lowering_platform(ctx) -> str:
  """The one platform a lowering runs for (``cpu``, ``cuda``, ``rocm``...)."""
  platforms = ctx.module_context.platforms
  if len(platforms) > 1:
    raise NotImplementedError(
        "hostcb callbacks cannot be lowered for several platforms at once; "
        f"got platforms={tuple(platforms)}")
  return platforms[0]


def _operands(ctx, args, placement: Placement) -> tuple[list, list, list]:
  """Operands and avals of a callback; per-device code gets the partition
  id as a leading uint32 operand."""
  operands, avals_in = list(args), list(ctx.avals_in)
  if placement.per_device:
    operands.insert(0, _hlo.PartitionIdOp().result)
    avals_in.insert(0, ShapedArray((), np.uint32))
  return operands, avals_in, list(ctx.avals_out)


def _with_token(host_fn: Callable) -> Callable:
  def host_fn_with_token(token, *arrays):
    return (token, *host_fn(*arrays))
  return host_fn_with_token


def _with_token_sharding(sharding, has_results: bool):
  """Adds the token's entry to a Shardy per-result sharding annotation."""
  sdy_list = getattr(_sharding_impls, "SdyArrayList", None)
  if (sharding is None or not has_results or sdy_list is None
      or not isinstance(sharding, sdy_list)):
    return sharding
  first = sharding.shardings[0]
  token_sharding = _sharding_impls.SdyArray(
      mesh_shape=(), dim_shardings=(),
      logical_device_ids=first.logical_device_ids)
  return sdy_list((token_sharding, *sharding.shardings))


def _set_sharding(module_context, op, sharding) -> None:
  # jax < 0.9 takes (op, sharding); later versions also the module context.
  if "ctx" in inspect.signature(_mlir.set_sharding).parameters:
    _mlir.set_sharding(module_context, op, sharding)
  else:
    _mlir.set_sharding(op, sharding)


def is_tracer(x: Any) -> bool:
  return isinstance(x, _core.Tracer)


def wait_at_process_barrier(barrier_id: str, timeout_ms: int) -> bool:
  """Waits in JAX's distributed runtime until every process reaches
  ``barrier_id`` (each id may be used once).

  Returns False at once, without waiting, if ``jax.distributed`` is not
  initialized in this process.  Raises ``jax.errors.JaxRuntimeError``
  (``DEADLINE_EXCEEDED: ...``) if some process is not there within
  ``timeout_ms``.
  """
  from jax._src import distributed as _distributed
  client = _distributed.global_state.client
  if client is None:
    return False
  client.wait_at_barrier(barrier_id, int(timeout_ms))
  return True


# ---------------------------------------------------------- xla_computation
# JAX lowers collectives only inside pmap-free SPMD contexts now; legacy
# xla_computation lowered them per replica.  The context below gives JAX's
# collective lowerings the named axes of an ``axis_env`` laid out row-major
# over replicas (no devices), so they emit replica groups without channel
# ids, and ``axis_index`` (whose own rule only knows SPMD contexts) is
# lowered from the replica id.
import math as _math

from jax._src.lax import parallel as _parallel
from jax._src.lib import _jax as _jaxlib_jax
from jax._src.lib import xla_client as _xc
from jax._src.lib.mlir import ir as _ir


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


# ---------------------------------------------------------- buffer_callback
# (internals used by hostcb.buffer_callback go here)
from jax._src.lib import ffi as _ffi_lib  # noqa: E402

# The stage in which XLA runs a buffer callback (see hostcb.buffer_callback).
ExecutionStage = _ffi_lib.ExecutionStage

_BUFFER_TARGETS = {"cpu": "xla_buffer_python_cpu_callback",
                   "cuda": "xla_buffer_python_gpu_callback",
                   "rocm": "xla_buffer_python_gpu_callback"}


class BufferCallbackEffect(_effects.Effect):
  """The effect of a ``buffer_callback`` made with ``has_side_effect=True``.

  Unordered, like :class:`HostCallbackEffect`: it only keeps the call alive
  when its results are unused.
  """

  def __str__(self) -> str:
    return "BufferCallback"


buffer_callback_effect = BufferCallbackEffect()
for _effect_set in (_effects.lowerable_effects,
                    _effects.control_flow_allowed_effects,
                    _effects.remat_allowed_effects,
                    _effects.custom_derivatives_allowed_effects):
  _effect_set.add_type(BufferCallbackEffect)


def same_shape_and_dtype(a: Any, b: Any) -> bool:
  """Whether two abstract values may share one buffer (aliasing)."""
  return bool(_ffi._check_compatible_avals(a, b))


def ffi_batching(prim: Primitive, args, dims, **params):
  """JAX's ``vmap_method`` batching of FFI calls, for any such primitive.

  ``params`` must hold ``vmap_method`` and ``result_avals``; the others are
  passed through to ``prim.bind``.
  """
  dims = [None if d is not_mapped else d for d in dims]
  return _ffi.ffi_batching_rule(prim, args, dims, **params)


def runs_on_one_of_several_devices(ctx) -> bool:
  """Whether the lowering is of a ``jit`` over several devices (not per-device).

  There a callback must run once, on one device, with whole operands: Shardy
  keeps such a one-device (MAXIMAL) placement only for XLA's copying Python
  callbacks, not for the buffer ones.
  """
  axis_context = ctx.module_context.axis_context
  return (isinstance(axis_context, _sharding_impls.ShardingContext)
          and axis_context.num_devices > 1)


def _host_copies_adapter(buffer_fn: Callable, avals_out: Sequence[Any],
                         aliases: dict[int, int]) -> Callable:
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
    host_fn(raw_ctx, *buffers[1:n_operands], *buffers[n_operands + 1:])
    return ()
  return host_fn_with_token


def emit_buffer_callback(ctx, make_host_fn: Callable[[Placement, bool],
                                                     Callable],
                         args: Sequence[Any], *, device_index: int,
                         has_side_effect: bool,
                         operand_output_aliases: Sequence[tuple[int, int]] = (),
                         command_buffer_compatible: bool = False,
                         ordered_effect: Any = None) -> Sequence[Any]:
  """Lowers a call of a host function that works on the device buffers.

  ``make_host_fn(placement, host_copies)`` returns the function that XLA
  calls as ``fn(ctx, *inputs, *outputs)``: an execution context, then one
  buffer per operand (preceded by the partition id, as a uint32 scalar
  buffer, in per-device code) and one writable buffer per result of
  ``ctx.avals_out``; it returns nothing.  ``operand_output_aliases`` pairs
  indices into ``args`` with result indices that share their buffer.  With
  ``has_side_effect`` and an ``ordered_effect`` (an ordered effect of the
  primitive), the call threads that effect's token, as
  :func:`emit_host_callback` does, so it keeps its place in program order.

  Placement is as for :func:`emit_host_callback`.  In a ``jit`` over several
  devices (see :func:`runs_on_one_of_several_devices`) the call goes through
  XLA's copying callback instead: ``host_copies`` is then True, the context
  None, and the buffers NumPy arrays in host memory.
  """
  platform = lowering_platform(ctx)
  target = _BUFFER_TARGETS.get(platform)
  if target is None:
    raise NotImplementedError(
        "buffer callbacks run only on cpu, cuda and rocm; this computation "
        f"is lowered for {platform}")
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
  if has_side_effect and ordered_effect is not None:
    token = ctx.tokens_in.get(ordered_effect)
  if token is not None:
    operands.insert(0, token)
    avals_in.insert(0, _core.abstract_token)
    avals_out.insert(0, _core.abstract_token)
    aliases = {i + 1: o + 1 for i, o in aliases.items()}
    host_fn = (_with_token(host_fn) if host_copies
               else _without_token_buffers(host_fn, len(operands)))
    sharding = _with_token_sharding(sharding, bool(ctx.avals_out))
  return _emit_ffi_call(ctx, target, host_fn, operands, avals_in, avals_out,
                        has_side_effect=has_side_effect, sharding=sharding,
                        token_effect=ordered_effect if token is not None else None,
                        aliases=aliases)
