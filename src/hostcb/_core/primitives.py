"""The two primitives behind the API, and their transformation rules.

``hostcb_tap`` (``id_tap``, ``id_print``) is an identity with a side
effect: its results are its operands (the lowering returns the operands
themselves, so it costs nothing on the device).  Its effect keeps it alive
when nothing uses the tapped value, inside control flow too.  Rules:

* ``vmap`` binds it again on the batched operands, adding
  ``("batch", {"batch_dims": ...})`` to ``transforms``;
* ``jvp`` (and so ``grad``) taps the primal values only; the tangents pass
  through;
* transposition (a tap of a tangent, e.g. in a ``custom_jvp`` rule, under
  ``grad``) taps the cotangents, adding ``"transpose"``;
* under ``checkpoint`` it runs again when the residuals are rematerialized.

``hostcb_call`` (``call``) returns the host function's results.  It cannot
be differentiated (use ``jax.custom_vjp``) and is batched only for the
``PURE`` flavor, sequentially, one host call per batch element.

The parameters ``target`` are :class:`TapTarget` / :class:`CallTarget`:
hashable descriptions of what the host runs, so that the same function on
the same shapes hits JAX's compilation caches.  Their functions compare by
identity (:mod:`hostcb._core.identity`): two callables that compare equal are
two functions, and an unhashable callable is accepted.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import Any, Callable

import jax
import numpy as np

from hostcb import config
from hostcb import _jax_internals as ji
from hostcb._core.host_function import HostFunction
from hostcb._core.identity import Same
from hostcb._engine.entries import ArraysTap, ArrayTap, TapEntry

__all__ = ["tap_p", "call_p", "TapTarget", "CallTarget", "Prints"]

Transforms = tuple  # of ("batch", batch_dims) entries, innermost first


def unpack_transforms(transforms: Transforms) -> tuple:
  """The ``transforms`` argument that tap functions receive."""
  return tuple(
    (name, {"batch_dims": dims}) if name == "batch" else (name, {})
    for name, dims in transforms
  )


def _name(func: Callable) -> str:
  return getattr(func, "__qualname__", None) or repr(func)


class Prints(enum.Enum):
  """What a tap function writes to the program's output
  (:attr:`TapTarget.prints`)."""

  NOTHING = 0
  """Host reads do not wait for it."""
  MAYBE = 1
  """A callback that may print (``hostcb.debug.callback``): a host read of
  a result waits for such taps queued before it
  (:mod:`hostcb._engine.output_order.reads`), not for the others."""
  LINES = 2
  """A print's own formatter (``id_print``, ``hostcb.debug.print``): host
  reads wait for it, and its executable keeps JAX's runtime token, so
  that the next print of the dispatching thread waits for it
  (:mod:`hostcb._engine.output_order.writes`)."""


@dataclasses.dataclass(frozen=True)
class TapTarget:
  """A tap function with the pytree structure of its argument.

  ``eager``: for a front end that runs its function in the calling thread
  when the tap is not staged (outside ``jit``), as ``jax.debug.callback``
  does (:mod:`hostcb.debug`): called as ``eager(operands, transforms)``
  instead of compiling the tap, with the operands as they were bound
  (``jax.Array`` s, NumPy arrays, Python numbers).

  ``effects``: JAX effects that the tap carries beside hostcb's, so that
  JAX's transformations treat it as they treat the JAX function that the
  front end replaces (:mod:`hostcb.debug`'s ordered callbacks carry JAX's
  ordered debug effect, which JAX refuses on several devices).

  ``prints``: what the function writes to the program's output
  (:class:`Prints`).

  ``partitioned``: in a ``jit`` over several devices, every device taps its
  own shard (``id_tap(..., partitioned=True)``, see
  ``docs/partitioned.md``) instead of one device the whole, gathered,
  value; with ``with_device`` the function also gets ``index=``, the
  shard's slice of the global array.

  ``per_element``: under ``vmap`` the tap is bound again once per batch
  element, on that element's slices, instead of once on the batched
  operands (JAX's rule for its debug callbacks).  For a partitioned
  debug callback: each device then gets its shards of each element, as
  from JAX's, and the host never has to pair elements up from shards
  that the devices hold along different batch axes.

  Equality and hash are the dataclass's, with ``func`` and ``eager``
  compared by what they are (:class:`~hostcb._core.identity.Same`).
  """

  func: Callable = dataclasses.field(compare=False)
  treedef: Any
  with_device: bool
  eager: Callable | None = dataclasses.field(default=None, compare=False)
  effects: tuple = ()
  prints: Prints = Prints.NOTHING
  partitioned: bool = False
  per_element: bool = False
  identity: tuple = dataclasses.field(init=False, repr=False)

  def __post_init__(self):
    object.__setattr__(self, "identity", (Same(self.func), Same(self.eager)))

  @functools.cached_property
  def one_leaf(self) -> bool:
    """Whether the argument is one array (no container around it)."""
    return self.treedef.num_leaves == 1 and self.treedef.num_nodes == 1

  def entry(self, transforms, shapes: tuple | None = None) -> TapEntry:
    """The entry that the native engine's consumers run per tap
    (:mod:`hostcb._engine.entries`): where the argument is one array and
    the function takes no device, an :class:`ArrayTap` of the function
    (no Python frame of hostcb's per tap), or, without ``transforms``,
    the entry of a front end's own (:meth:`HostFunction.tap_entry
    <hostcb._core.host_function.HostFunction.tap_entry>`); else an
    :class:`ArraysTap` of :meth:`caller` (always for a per-shard tap,
    ``shapes`` given)."""
    if shapes is None and not self.with_device and self.one_leaf:
      if not transforms and isinstance(self.func, HostFunction):
        entry = self.func.tap_entry()
        if entry is not None:
          return entry
      return ArrayTap(self.func, transforms)
    return ArraysTap(self.caller(transforms, shapes))

  def caller(
    self, transforms, shapes: tuple | None = None
  ) -> Callable[[tuple, Any], None]:
    """``call(arrays, device)``: calls the tap function with the argument
    rebuilt from ``arrays``, with its lookups done once (the engine's
    consumers call it once per tap).

    ``shapes``: for a per-shard tap in a sharded ``jit``
    (:mod:`hostcb._jax_internals.partitioned`), the operands' global
    shapes: the arrays are the device's shards, followed, when one of
    them has a dimension, by the shard's slice bounds."""
    if shapes is not None or (self.partitioned and self.with_device):
      return _shard_caller(self, transforms, shapes)
    func = self.func
    if self.one_leaf:
      if self.with_device:  # the argument is one array
        return lambda arrays, device: func(arrays[0], transforms, device=device)
      return lambda arrays, device: func(arrays[0], transforms)
    unflatten = self.treedef.unflatten
    if self.with_device:
      return lambda arrays, device: func(
        unflatten(arrays), transforms, device=device
      )
    return lambda arrays, device: func(unflatten(arrays), transforms)


def _shard_caller(
  target: TapTarget, transforms, shapes
) -> Callable[[tuple, Any], None]:
  """The caller of a per-shard tap: trims the padding of uneven shards
  and, with ``with_device``, passes the shard's ``index=`` (per leaf, a
  tuple of slices of the global array; all ``slice(None)`` where the
  operand is not split: one device, ``shard_map``, ``pmap``).

  ``shapes``: the operands' global shapes in a sharded ``jit``, where
  the last array holds the shard's slice bounds (when some operand has
  a dimension); None elsewhere, where the arrays are whole."""
  func, with_device = target.func, target.with_device
  one = target.one_leaf
  unflatten = target.treedef.unflatten
  bounded = shapes is not None and any(len(s) for s in shapes)
  slices: dict = {}  # bounds (bytes) -> (index shown, trims)

  def slices_of(bounds) -> tuple:
    key = bounds.tobytes()
    found = slices.get(key)
    if found is None:
      index = ji.slice_bounds(bounds, shapes)
      shown = index[0] if one else unflatten(list(index))
      found = slices[key] = (shown, tuple(map(_trim, index)))
    return found

  def call(arrays, device):
    if bounded:
      *arrays, bounds = arrays
      shown, trims = slices_of(bounds)
      arrays = [_trimmed(a, t) for a, t in zip(arrays, trims)]
    elif with_device:
      whole = [(slice(None),) * np.ndim(a) for a in arrays]
      shown = whole[0] if one else unflatten(whole)
    arg = arrays[0] if one else unflatten(arrays)
    if not with_device:
      return func(arg, transforms)
    return func(arg, transforms, device=device, index=shown)

  return call


def _trim(index: tuple) -> tuple:
  """The extent of each dimension of the slice ``index`` (None where the
  dimension is not split)."""
  return tuple(None if s == slice(None) else s.stop - s.start for s in index)


def _trimmed(array: np.ndarray, extents: tuple) -> np.ndarray:
  """The part of a shard's buffer that holds its slice: the buffer of an
  uneven sharding's last shards has padding past ``extents``."""
  if all(e is None or e == n for e, n in zip(extents, array.shape)):
    return array
  return array[
    tuple(slice(None) if e is None else slice(0, e) for e in extents)
  ]


@dataclasses.dataclass(frozen=True)
class CallTarget:
  """A host function of ``call``, with its argument and result structure.

  ``rules``: for a front end with JAX's rules instead of legacy's
  (:mod:`hostcb.jax_callbacks`): ``rules.jvp()`` and ``rules.transpose()``
  raise its errors, ``rules.batch(target, args, dims, device_index=...,
  effectful=...)`` is its ``vmap`` rule, ``rules.effects`` are JAX effects
  that an effectful call carries beside hostcb's (``io_callback``: JAX's
  own, so that JAX's transformations refuse it where they refuse JAX's),
  and a failure of its function fails the computation only (it is not
  kept for ``barrier_wait``).

  Equality and hash are the dataclass's, with ``func`` compared by what it
  is (:class:`~hostcb._core.identity.Same`).
  """

  func: Callable = dataclasses.field(compare=False)
  in_treedef: Any
  out_treedef: Any
  result_avals: tuple
  with_device: bool
  rules: Any = None
  identity: Same = dataclasses.field(init=False, repr=False)

  def __post_init__(self):
    object.__setattr__(self, "identity", Same(self.func))

  def caller(
    self,
    device_of: Callable[[Any], Any] | None = None,
    unchecked_one_array: bool = False,
  ) -> Callable[[tuple, Any], Any]:
    """``call(arrays, device)``: calls the host function and returns its
    flat, checked results, with its lookups done once, for the paths that
    call it once per call (once per loop step in a loop).

    ``device_of`` maps the second argument to the device, looked up only
    for ``call_with_device`` (the native engine passes a device ordinal).
    ``unchecked_one_array``: a result meant to be one array is returned as
    the host function gave it, for a caller that checks it itself (the
    ``hostcb_call_one`` handler, which falls back to
    :meth:`check_results`).
    """
    func, with_device, check = self.func, self.with_device, self.check_results
    unflatten = None if self.one_leaf else self.in_treedef.unflatten
    dtype, shape = self.one_array or (None, None)
    unchecked = unchecked_one_array and self.one_array is not None

    def call(arrays, where):
      arg = arrays[0] if unflatten is None else unflatten(arrays)
      if with_device:
        res = func(arg, device=where if device_of is None else device_of(where))
      else:
        res = func(arg)
      if unchecked:
        return res
      if (
        type(res) is np.ndarray
        and dtype is not None
        and (res.dtype is dtype or res.dtype == dtype)
        and res.shape == shape
      ):  # one array, as expected: checked
        return (res,)
      return check(res)

    return call

  @functools.cached_property
  def direct(self) -> bool:
    """Whether the engine's handler may call the host function itself,
    ``func(array)``, and check its result: one array argument, one array
    result, no device argument."""
    return self.one_leaf and not self.with_device and self.one_array is not None

  @functools.cached_property
  def one_leaf(self) -> bool:
    """Whether the argument is one array (no container around it)."""
    return self.in_treedef.num_leaves == 1 and self.in_treedef.num_nodes == 1

  @functools.cached_property
  def one_array(self):
    """(dtype, shape) when the result is one array, else None."""
    if self.out_treedef.num_leaves == 1 and self.out_treedef.num_nodes == 1:
      aval = self.result_avals[0]
      return np.dtype(aval.dtype), tuple(aval.shape)
    return None

  def check_results(self, res) -> tuple:
    """The flat results as arrays of ``result_avals``, or a ``TypeError``.

    The messages begin as legacy's did ("Callback func ... should have
    returned a result with ..."), which user code matches.
    """
    flat, treedef = jax.tree_util.tree_flatten(res)
    if treedef != self.out_treedef:
      raise TypeError(
        f"Callback func {_name(self.func)} should have returned a result "
        f"with pytree {self.out_treedef} but returned {treedef}"
      )
    out = []
    # Each value converted once: what is checked and shown is what the
    # value gives as an array (its ``__array__``), not its ``shape``.
    arrays = [np.asarray(v) for v in flat]
    for i, (a, aval) in enumerate(zip(arrays, self.result_avals)):
      dtype = jax.dtypes.canonicalize_dtype(a.dtype)
      if a.shape != aval.shape or dtype != aval.dtype:
        actual = [
          ji.ShapedArray(v.shape, jax.dtypes.canonicalize_dtype(v.dtype))
          for v in arrays
        ]
        expected_text = _avals_text(self.out_treedef, self.result_avals)
        actual_text = _avals_text(self.out_treedef, actual)
        detail = ""
        if expected_text == actual_text:  # e.g. another byte order
          detail = (
            f" (result {i} has NumPy dtype {dtype.str!r}, expected "
            f"{np.dtype(aval.dtype).str!r})"
          )
        raise TypeError(
          f"Callback func {_name(self.func)} should have returned a result "
          f"with abstract values {expected_text} but returned "
          f"{actual_text}{detail}"
        )
      if a.dtype != dtype:
        a = a.astype(dtype)
      out.append(a)
    return tuple(out)


class _Shown:
  """A leaf that prints as the given text, inside containers too."""

  def __init__(self, text: str):
    self.text = text

  def __repr__(self) -> str:
    return self.text

  __str__ = __repr__


def _avals_text(treedef, avals) -> str:
  """``(ShapedArray(float32[]), ...)``: abstract values as legacy showed them."""
  return str(treedef.unflatten([_Shown(repr(a)) for a in avals]))


def _device_for(args, device_index: int):
  for a in args:
    devices = getattr(a, "devices", None)
    if devices is not None and device_index == 0:
      return next(iter(devices()))
  return jax.local_devices()[device_index]


def _eager_args(args, device_index: int):
  """Places eager operands on the device chosen by ``device_index``."""
  if device_index == 0:
    return args
  return jax.device_put(args, jax.local_devices()[device_index])


# JAX's caches keyed by primitive parameters hold targets weakly, from the
# first bind on: a dropped program frees its functions without
# jax.clear_caches() (hostcb._jax_internals.keepalive).
ji.hold_weakly_in_jax_caches(TapTarget, CallTarget)

# --------------------------------------------------------------------- tap
tap_p = ji.new_primitive("hostcb_tap")


@tap_p.def_effectful_abstract_eval
def _tap_abstract_eval(*avals, target, transforms, device_index):
  del transforms, device_index
  return avals, {ji.host_callback_effect, *target.effects}


@tap_p.def_impl
def _tap_impl(*args, target, transforms, device_index):
  if target.eager is not None:  # the operands as given (Python numbers too)
    target.eager(args, unpack_transforms(transforms))
    return [jax.numpy.asarray(a) for a in args]
  if config.read(config.INLINE):
    device = _device_for(args, device_index)
    # As outside inline mode, the tap sees the operands of JAX's canonical
    # dtypes (a Python float is float32 unless x64 is on): what it returns.
    arrays = [jax.numpy.asarray(a) for a in args]
    target.caller(unpack_transforms(transforms))(
      tuple(np.asarray(a) for a in arrays), device
    )
    return arrays
  # The computation's results are the operands as JAX arrays of the
  # canonical dtype, which legacy returned too.
  return ji.apply_compiled(
    tap_p,
    *_eager_args(args, device_index),
    target=target,
    transforms=transforms,
    device_index=device_index,
  )


def _tap_jvp(primals, tangents, **params):
  return tap_p.bind(*primals, **params), list(tangents)


def _tap_transpose(cts, *args, target, transforms, device_index):
  """Taps the cotangents flowing back through a tapped linear value.

  Operands that are not linear (primal values tapped together with
  tangents) are tapped as they are.  When no cotangent reaches the tap (its
  result was not used), there is nothing to tap.
  """
  linear = [ji.is_undefined_primal(a) for a in args]
  if all(ji.is_symbolic_zero(ct) for ct, lin in zip(cts, linear) if lin):
    return [None] * len(args)
  values = [
    ji.instantiate_zeros(ct) if lin else a
    for ct, a, lin in zip(cts, args, linear)
  ]
  outs = tap_p.bind(
    *values,
    target=target,
    device_index=device_index,
    transforms=transforms + (("transpose", None),),
  )
  return [o if lin else None for o, lin in zip(outs, linear)]


def _tap_batch(args, dims, *, target, transforms, device_index):
  batch_dims = tuple(None if d is ji.not_mapped else d for d in dims)
  if target.per_element:
    size = next(a.shape[d] for a, d in zip(args, batch_dims) if d is not None)
    for i in range(size):
      tap_p.bind(
        *(
          a if d is None else jax.lax.index_in_dim(a, i, axis=d, keepdims=False)
          for a, d in zip(args, batch_dims)
        ),
        target=target,
        device_index=device_index,
        transforms=transforms,
      )
    return list(args), list(dims)  # an identity: its operands
  outs = tap_p.bind(
    *args,
    target=target,
    device_index=device_index,
    transforms=transforms + (("batch", batch_dims),),
  )
  return outs, list(dims)


ji.register_jvp(tap_p, _tap_jvp)
ji.register_transpose(tap_p, _tap_transpose)
ji.register_batching(tap_p, _tap_batch)
ji.rematerialize_on_backward_pass(tap_p)
# A tap stays in its loop when JAX moves loop-invariant work out of a
# differentiated loop: it runs once per step, its operands loop constants.
ji.stay_in_loops(tap_p, stays=lambda params: True, identity=True)


# -------------------------------------------------------------------- call
call_p = ji.new_primitive("hostcb_call")


@call_p.def_effectful_abstract_eval
def _call_abstract_eval(*avals, target, device_index, effectful):
  # A pure call carries hostcb's effect too: its token keeps it in program
  # order with the taps around it (a tap written before it has run when it
  # runs, one written after it runs after it), in nested jit and loops too.
  # For it the effect only orders: it is dropped when unused and rebuilt
  # under checkpoint as an equation without effects (_orders_only).
  del avals, device_index
  effects = {ji.host_callback_effect}
  if effectful and target.rules is not None:
    effects.update(target.rules.effects)
  return target.result_avals, effects


def _orders_only(params) -> bool:
  return not params["effectful"]


@call_p.def_impl
def _call_impl(*args, target, device_index, effectful):
  if config.read(config.INLINE):
    device = _device_for(args, device_index)
    # The host sees what it sees outside inline mode: the operands of JAX's
    # canonical dtypes (a Python float is float32 unless x64 is on).
    operands = tuple(np.asarray(jax.numpy.asarray(a)) for a in args)
    # Copies: a host function may return (and later overwrite) arrays of
    # its own, which must not change the call's results.
    return [np.array(r) for r in target.caller()(operands, device)]
  return ji.apply_compiled(
    call_p,
    *_eager_args(args, device_index),
    target=target,
    device_index=device_index,
    effectful=effectful,
  )


def _call_jvp(primals, tangents, *, target, **params):
  if target.rules is not None:
    target.rules.jvp()
  raise NotImplementedError(
    "JVP rule is implemented only for id_tap, not for call. "
    "Use jax.custom_jvp or jax.custom_vjp around hostcb.call."
  )


def _call_transpose(cts, *args, target, **params):
  if target.rules is not None:
    target.rules.transpose()
  raise NotImplementedError(
    "differentiation rules are implemented only for id_tap, not for call. "
    "Use jax.custom_vjp around hostcb.call."
  )


def _call_batch(args, dims, *, target, device_index, effectful):
  if target.rules is not None:
    return target.rules.batch(
      target, args, dims, device_index=device_index, effectful=effectful
    )
  if effectful:
    raise NotImplementedError(
      "batching rules are implemented only for id_tap, not for call. "
      "Use callback_flavor=CallbackFlavor.PURE for a call that may be "
      "batched (it is then called once per batch element)."
    )
  mapped = [i for i, d in enumerate(dims) if d is not ji.not_mapped]
  moved = [jax.numpy.moveaxis(args[i], dims[i], 0) for i in mapped]

  def one(xs):
    full = list(args)
    for i, x in zip(mapped, xs):
      full[i] = x
    return call_p.bind(
      *full, target=target, device_index=device_index, effectful=effectful
    )

  outs = jax.lax.map(one, moved)
  return outs, [0] * len(outs)


ji.register_jvp(call_p, _call_jvp)
ji.register_transpose(call_p, _call_transpose)
ji.register_batching(call_p, _call_batch)
ji.effect_orders_only(call_p, _orders_only)
# An effectful call stays in its loop too (a pure one may be hoisted).
ji.stay_in_loops(
  call_p, stays=lambda params: params["effectful"], identity=False
)
