"""JAX's ``io_callback`` and ``pure_callback`` on hostcb's engine, and the
switch that routes JAX's own callback functions through hostcb.

:func:`io_callback` and :func:`pure_callback` take what
``jax.experimental.io_callback`` and ``jax.pure_callback`` take (JAX 0.10.2's
signatures) and behave as they do, as thin front ends over hostcb's
``call`` primitive: ``io_callback`` is an effectful call, kept in program
order with every other hostcb callback; ``pure_callback`` a call without
effect, which JAX may drop when its result is unused.  Their ``vmap``,
``jvp`` and transpose rules, their checks of the callback's result and
their error messages are JAX's (see ``docs/jax_callbacks.md`` for the few
differences and why).

:func:`hostcb.install` with ``jax_callbacks=True`` (:mod:`hostcb._import_hook`)
puts hostcb's four functions (these two and :mod:`hostcb.debug`'s ``print``
and ``callback``) in place of JAX's.  Importing this module (``import
hostcb`` does) also makes ``jax.effects_barrier()`` wait for hostcb's
callbacks.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from typing import Any, Callable

import jax
import numpy as np

from hostcb import config
from hostcb import _jax_internals as ji
from hostcb._core import lowering as _lowering  # noqa: F401  (registers lowerings)
from hostcb._core import by_name

from hostcb._engine.consumers import host_functions as _host_functions
from hostcb._engine import errors as _engine_errors
from hostcb._core.host_function import HostFunction
from hostcb._core.identity import Same
from hostcb._engine.entries import CallEntry, CallRunner
from hostcb._core.primitives import CallTarget, call_p
from hostcb._core.callback_types import (
  VMAP_METHODS,
  is_key,
  result_avals,
  unsupported_vmap,
)
from hostcb._core.dropins import (
  _JAX,
  bind_as,
  flat_treedef,
  is_jax_own,
  wait_for_earlier_callbacks,
)

__all__ = ["io_callback", "pure_callback"]


# np.asarray of a callback's result, by jaxlib's cheapest exact route.
_host_array = ji.host_array

# Where JAX logs a failed callback; hostcb logs the same failures there.
_callback_logger = logging.getLogger("jax._src.callback")


def x64_enabled() -> bool:
  """Whether this thread has JAX's 64-bit types on (``jax_enable_x64``,
  with a ``jax.enable_x64`` context of the thread's own)."""
  return bool(jax.config.jax_enable_x64)


def call_with_x64(fn: Callable, *args) -> Any:
  """``fn(*args)`` with JAX's 64-bit types on in this thread.

  A callback traced under ``jax.enable_x64(True)`` (a setting of the
  tracing thread alone) runs on hostcb's consumer thread, or on XLA's,
  where it is off: its ``float64`` arguments would turn ``float32`` in
  its first ``jnp`` operation.  JAX's callbacks see the setting of the
  program's thread when the CPU runs the program in that thread, as it
  does for small programs: hostcb's get it always."""
  if x64_enabled():
    return fn(*args)
  with jax.enable_x64(True):
    return fn(*args)


# ------------------------------------------------- the host function
class HostCall(HostFunction):
  """The host side of :func:`io_callback` / :func:`pure_callback`: calls the
  callback with the arguments rebuilt from the flat operands, and checks
  its result as JAX does (same errors, same words).

  Equal for the same callback (the same object, :mod:`hostcb._core.identity`),
  argument structure and result, so that an eager call of the same
  callback reuses its compiled computation, as JAX's own does; two
  callbacks that compare equal are two functions.
  """

  __slots__ = (
    "callback",
    "in_tree",
    "n_in",
    "result_avals",
    "name",
    "jax_arrays",
    "_to_jax",
    "_to_jax_one",
    "_positional",
    "_expected",
    "_one",
    "_hash",
    "_key",
    "_x64",
  )

  def __init__(
    self,
    callback: Callable,
    in_tree: Any,
    n_in: int,
    result_avals: tuple,
    name: str,
    jax_arrays: bool = False,
  ):
    self.callback = callback
    # ``jax.Array`` arguments on the CPU, as JAX's (hostcb_callback_jax_arrays)
    self.jax_arrays = jax_arrays
    self._to_jax = ji.cpu_arrays if jax_arrays else None
    # One argument (the common case): made without the list of leaves.
    self._to_jax_one = ji.cpu_array if jax_arrays and n_in == 1 else None
    if jax_arrays:
      ji.prepare_cpu_arrays()  # a JAX without what it needs fails here
    self.in_tree = in_tree
    self.n_in = n_in
    self.result_avals = result_avals
    self.name = name  # "jax.io_callback" or "jax.pure_callback"
    # Positional array arguments only: call without rebuilding the tree.
    self._positional = in_tree == jax.tree_util.tree_structure(
      ((0,) * n_in, {})
    )
    self._expected = [(a.shape, np.dtype(a.dtype)) for a in result_avals]
    self._one = self._expected[0] if len(self._expected) == 1 else None
    # Traced with 64-bit types on: called with them on (call_with_x64).
    self._x64 = x64_enabled()
    # What it is equal by, the callback by what it is (identity.Same).
    self._key = (
      Same(callback),
      in_tree,
      result_avals,
      name,
      jax_arrays,
      self._x64,
    )
    self._hash = hash(self._key)

  def __hash__(self) -> int:
    return self._hash

  def __eq__(self, other) -> bool:
    return type(other) is HostCall and (
      self is other or (self._hash == other._hash and self._key == other._key)
    )

  def __repr__(self) -> str:
    return f"{self.name}({self.callback!r})"

  def export(self) -> tuple[str, dict] | None:
    """By name when its callback is registered (:mod:`hostcb.named`)."""
    name = by_name.name_of(self.callback)
    if name is None:
      return None
    return name, {
      "kind": "jax_callback",
      "function": self.name,
      "in_tree": by_name.tree_json_of(self.in_tree, name),
      "n_in": self.n_in,
      "jax_arrays": bool(self.jax_arrays),
    }

  def call_entry(
    self, pending: dict, wait_for_pending: Callable[[int], None]
  ) -> CallEntry | None:
    """For one positional argument and one array result (the common
    case): the runner returns the callback's result, a NumPy array as it
    is (the handler copies it when it is an exact array of the result,
    and else calls ``check(result)``, which gives what :meth:`__call__`
    would: the flat, checked results, or JAX's error); else None.  The
    lookups are done here, once per executable, and nothing is marked per
    call: the handler keeps the entries it runs, and this one's
    ``host_function`` says that a host read in the callback does not wait
    for prints (:func:`hostcb._engine.native.runs_host_function_call`),
    since the computation waits for it."""
    return _direct_entry(self, pending, wait_for_pending)

  def _finish(self, results: list):
    return self.check(results)

  def __call__(self, arg):
    # A host read of a jax.Array in the callback does not wait for prints
    # (hostcb._engine.output_order.reads): the computation waits for it.
    # (The engine's direct path marks nothing: call_entry.)
    running, ident = _host_functions, threading.get_ident()
    depth = running.get(ident, 0)
    running[ident] = depth + 1
    try:
      if self._x64 and not x64_enabled():
        return call_with_x64(self._call, arg)
      return self._call(arg)
    finally:
      if depth:
        running[ident] = depth
      else:
        del running[ident]

  def _call(self, arg):
    try:
      made = None
      if self._to_jax_one is not None:
        leaves = (made := self._to_jax_one(arg),)
      else:
        leaves = (arg,) if self.n_in == 1 else arg
        if self._to_jax is not None:
          leaves = self._to_jax(leaves)
      if self._positional:
        result = self.callback(*leaves)
        # The argument itself: its value is the host array it was made of.
        if result is made and made is not None:
          result = arg
        one = self._one
        # The common cases, one exact array of the expected shape and dtype
        # (NumPy's, or a jax.Array such as the argument itself), need no
        # more checks here (the engine's handler checks it too).
        if one is not None:
          if type(result) is np.ndarray:
            if result.dtype == one[1] and result.shape == one[0]:
              return result
          elif (
            isinstance(result, jax.Array)
            and result.dtype == one[1]
            and result.shape == one[0]
          ):
            return _host_array(result)
      else:
        args, kwargs = self.in_tree.unflatten(leaves)
        result = self.callback(*args, **kwargs)
      results = [_host_array(r) for r in jax.tree_util.tree_leaves(result)]
    except BaseException:
      _callback_logger.exception("%s failed", self.name)
      raise
    return self.check(results)

  def check(self, results: list):
    """The results as arrays of the expected shapes and dtypes (converted
    to JAX's canonical dtype, as JAX does), or JAX's ``RuntimeError``."""
    return _checked(self._expected, results)


def _direct_entry(
  call: HostCall, pending: dict, wait_for_pending: Callable[[int], None]
) -> CallEntry | None:
  """:meth:`HostCall.call_entry`, for one positional argument and one
  array result (the common case); else None."""
  one = call._one
  if not (call._positional and call.n_in == 1 and one is not None):
    return None
  if call._x64:
    return None  # traced with 64-bit types on: __call__ turns them on
  callback = call.callback
  to_jax = None if call._to_jax_one is None else ji.bound_cpu_array()
  shape, dtype = one
  to_host = ji.host_array_of(dtype)  # a jax.Array result's NumPy value
  name, finish, array_type = call.name, call._finish, jax.Array
  ndarray = np.ndarray

  def run(arrays, ordinal):
    if pending:
      wait_for_pending(ordinal)
    try:
      result = callback(arrays[0])
    except BaseException:
      _callback_logger.exception("%s failed", name)
      raise
    if type(result) is ndarray:
      return result  # checked by the handler, or by check
    return finished(result)

  def run_jax_arrays(arrays, ordinal):  # run, the argument a jax.Array
    if pending:
      wait_for_pending(ordinal)
    arg = arrays[0]
    try:
      made = to_jax(arg)
      result = callback(made)
    except BaseException:
      _callback_logger.exception("%s failed", name)
      raise
    if result is made:  # its value is the host array it was made of
      return arg  # checked by the handler, or by check, as any ndarray
    if type(result) is ndarray:
      return result
    return finished(result)

  def finished(result):
    try:
      if (
        isinstance(result, (np.ndarray, array_type))
        and result.dtype == dtype
        and result.shape == shape
      ):
        return to_host(result)
      results = [_host_array(r) for r in jax.tree_util.tree_leaves(result)]
    except BaseException:
      _callback_logger.exception("%s failed", name)
      raise
    return finish(results)

  def check(result) -> tuple:
    return (finished(result),)

  if to_jax is not None:
    run = run_jax_arrays
  return CallEntry(CallRunner(run, host_function=True), check)


def _checked(expected: list, results: list):
  """:meth:`HostCall.check` against ``expected``, ``[(shape, dtype)]``."""
  if len(results) != len(expected):
    raise RuntimeError(
      "Mismatched number of outputs from callback. "
      f"Expected: {len(expected)}, Actual: {len(results)}"
    )
  for r in results:  # JAX checks every value's dtype before the shapes
    if not _is_jax_dtype(r.dtype):
      raise TypeError(
        f"Dtype {r.dtype} is not a valid JAX array type. Only arrays of "
        "numeric types are supported by JAX."
      )
  for i, ((shape, dtype), r) in enumerate(zip(expected, results)):
    if r.dtype != dtype:
      canonical = jax.dtypes.canonicalize_dtype(r.dtype)
      if canonical != r.dtype:
        r = results[i] = r.astype(canonical)
    if r.shape != shape:
      raise RuntimeError(
        f"Incorrect output shape for return value #{i}: "
        f"Expected: {shape}, Actual: {r.shape}"
      )
    if r.dtype != dtype:
      raise RuntimeError(
        f"Incorrect output dtype for return value #{i}: "
        f"Expected: {dtype}, Actual: {r.dtype}"
      )
  return results[0] if len(results) == 1 else tuple(results)


def _is_jax_dtype(dtype: np.dtype) -> bool:
  """Whether JAX has arrays of ``dtype``: booleans and numbers, with the
  ML dtypes (``bfloat16``, ``float8_*``, ``int4``...), which NumPy sees as
  kind ``V`` with their own scalar type; not strings, objects, dates or
  plain bytes."""
  return dtype.kind in "biufc" or (
    dtype.kind == "V" and dtype.type is not np.void
  )


def call_target(
  callback: Callable,
  in_tree: Any,
  n_in: int,
  result_avals: tuple,
  name: str,
  rules: Any,
) -> CallTarget:
  """The :class:`~hostcb._core.primitives.CallTarget` of one callback."""
  return CallTarget(
    HostCall(
      callback,
      in_tree,
      n_in,
      result_avals,
      name,
      config.read(config.JAX_ARRAYS),
    ),
    flat_treedef(n_in),
    flat_treedef(len(result_avals)),
    result_avals,
    False,
    rules,
  )


by_name.define_kind(
  "jax_callback",
  lambda name, fn, spec: HostCall(
    by_name.lookup(name),
    by_name.tree_from_json(fn["in_tree"]),
    fn["n_in"],
    by_name.result_avals_of(spec),
    fn["function"],
    fn["jax_arrays"],
  ),
)


def _check_shape_dtype(leaf) -> None:
  dtype = np.dtype(leaf.dtype)
  if jax.dtypes.canonicalize_dtype(dtype) != dtype:
    raise ValueError(
      "result_shape_dtypes cannot specify 64-bit types when "
      "`jax_enable_x64` is disabled"
    )


def _result_aval(leaf):
  _check_shape_dtype(leaf)
  return ji.ShapedArray(leaf.shape, leaf.dtype)


def _result_avals(result_shape_dtypes) -> tuple[tuple, Any]:
  return result_avals(result_shape_dtypes, _result_aval)


# ------------------------------------------------------- vmap rules
def _moved(args, dims) -> list:
  return [
    a if d is None else jax.numpy.moveaxis(a, d, 0) for a, d in zip(args, dims)
  ]


def _axis_size(args, dims) -> int:
  (size,) = {a.shape[d] for a, d in zip(args, dims) if d is not None}
  return size


def _sequential(target, args, dims, *, device_index, effectful, unroll=False):
  """One call per batch element, in a scan over the batch (as JAX's
  ``sequential`` vmap_method and its unordered ``io_callback`` do)."""
  dims = [None if d is ji.not_mapped else d for d in dims]
  moved = _moved(args, dims)
  batched = [a for a, d in zip(moved, dims) if d is not None]

  def step(carry, xs):
    xs = iter(xs)
    full = [a if d is None else next(xs) for a, d in zip(moved, dims)]
    return carry, call_p.bind(
      *full, target=target, device_index=device_index, effectful=effectful
    )

  _, outs = jax.lax.scan(step, (), batched, unroll=unroll)
  return list(outs), [0] * len(outs)


_VMAP_METHODS = [*VMAP_METHODS, None]  # listed so in JAX's error


@dataclasses.dataclass(frozen=True)
class PureRules:
  """``pure_callback``'s rules (see :class:`~hostcb._core.primitives.CallTarget`)."""

  vmap_method: str | None
  # No JAX effect (effectful=False): only hostcb's, which orders it.
  effects = ()
  effectful = False  # JAX may drop the call when its result is unused

  def jvp(self):
    raise ValueError(
      "Pure callbacks do not support JVP. Please use `jax.custom_jvp` to "
      "use callbacks while taking gradients."
    )

  def transpose(self):
    raise ValueError(
      "Pure callbacks do not support transpose. Please use "
      "`jax.custom_vjp` to use callbacks while taking gradients."
    )

  def batch(self, target, args, dims, *, device_index, effectful):
    method = self.vmap_method
    if method in ("sequential", "sequential_unrolled"):
      return _sequential(
        target,
        args,
        dims,
        device_index=device_index,
        effectful=effectful,
        unroll=method == "sequential_unrolled",
      )
    if method not in VMAP_METHODS:
      raise unsupported_vmap("pure_callback", method)
    dims = [None if d is ji.not_mapped else d for d in dims]
    size = _axis_size(args, dims)
    moved = _moved(args, dims)
    if method != "legacy_vectorized":
      # Unbatched operands get a leading axis: of size 1, or the batch's.
      lead = size if method == "broadcast_all" else 1
      moved = [
        jax.lax.broadcast(a, (lead,)) if d is None else a
        for a, d in zip(moved, dims)
      ]
    func = target.func
    avals = tuple(
      ji.ShapedArray((size, *a.shape), a.dtype) for a in target.result_avals
    )
    batched = call_target(
      func.callback, func.in_tree, func.n_in, avals, func.name, self
    )
    outs = call_p.bind(
      *moved, target=batched, device_index=device_index, effectful=effectful
    )
    return list(outs), [0] * len(outs)


@dataclasses.dataclass(frozen=True)
class IoRules:
  """``io_callback``'s rules (see :class:`~hostcb._core.primitives.CallTarget`)."""

  ordered: bool
  effectful = True  # never dropped

  @property
  def effects(self) -> tuple:
    # JAX's own effect too: vmap of cond, vmap of a while loop with a
    # batched predicate and partial evaluation of checkpoint refuse an
    # io_callback by finding it, with JAX's errors.
    return (ji.jax_io_effect(self.ordered),)

  def jvp(self):
    raise ValueError("IO callbacks do not support JVP.")

  def transpose(self):
    raise ValueError("IO callbacks do not support transpose.")

  def batch(self, target, args, dims, *, device_index, effectful):
    if self.ordered:
      raise ValueError("Cannot `vmap` ordered IO callback.")
    return _sequential(
      target, args, dims, device_index=device_index, effectful=effectful
    )


# ------------------------------------------------------ the functions
def _callback(
  name: str,
  rules: PureRules | IoRules,
  callback: Callable[..., Any],
  result_shape_dtypes: Any,
  args: tuple,
  kwargs: dict,
  sharding: Any,
  jax_options: dict,
):
  """The body of :func:`pure_callback` and :func:`io_callback` (``name``):
  binds hostcb's call of ``callback(*args, **kwargs)`` with ``rules``
  (effectful for ``io_callback``); or hands the call to JAX's own function
  (with ``sharding`` and ``jax_options``, its other options) where
  ``sharding`` is given or the callback is JAX's own.

  A PRNG key operand goes as its key data, which is what JAX's callback
  receives (under ``jit`` and outside it).  An operand that is not a JAX
  value fails with JAX's error, which names ``name``.
  """
  if sharding is not None or is_jax_own(callback):
    return _JAX[name](
      callback,
      result_shape_dtypes,
      *args,
      sharding=sharding,
      **jax_options,
      **kwargs,
    )
  flat, in_tree = jax.tree_util.tree_flatten((args, kwargs))
  avals, out_tree = _result_avals(result_shape_dtypes)
  target = call_target(
    callback, in_tree, len(flat), avals, f"jax.{name}", rules
  )
  for i, x in enumerate(flat):
    if is_key(x):
      flat[i] = jax.random.key_data(x)
  outs = bind_as(
    name,
    call_p,
    *flat,
    target=target,
    device_index=0,
    effectful=rules.effectful,
  )
  return out_tree.unflatten(outs)


def pure_callback(
  callback: Callable[..., Any],
  result_shape_dtypes: Any,
  *args: Any,
  sharding=None,
  vmap_method: str | None = None,
  **kwargs: Any,
):
  """``jax.pure_callback`` on hostcb's engine: calls a side-effect-free
  host function from JAX code and returns its result.

  ``callback(*args, **kwargs)`` runs on the host and must return a pytree
  of arrays with as many leaves as ``result_shape_dtypes`` (a pytree of
  objects with ``shape`` and ``dtype``, e.g. ``jax.ShapeDtypeStruct``),
  each of the described shape and dtype (64-bit values are narrowed as
  JAX narrows them); the result has ``result_shape_dtypes``'s structure.
  Because the function is taken to be pure, JAX may drop the call when
  its result is unused, and may call it several times.

  Under ``jax.vmap`` ``vmap_method`` says how: ``"sequential"`` (one call
  per batch element, in a loop), ``"sequential_unrolled"`` (the same,
  unrolled), ``"expand_dims"`` (one call with the batch as a leading axis;
  unbatched arguments get a leading axis of size 1), ``"broadcast_all"``
  (the same, unbatched arguments broadcast to the batch size),
  ``"legacy_vectorized"`` (one call, unbatched arguments as they are);
  ``None``, the default, makes ``vmap`` raise ``NotImplementedError``.
  It cannot be differentiated (wrap it in ``jax.custom_jvp`` or
  ``jax.custom_vjp``).

  The callback receives ``jax.Array`` s on the CPU, as JAX's (NumPy arrays
  with the opt-out ``hostcb_callback_jax_arrays=False``).  Differences
  from JAX's (``docs/jax_callbacks.md``): with ``sharding=`` given, or a
  callback defined inside JAX, the call is JAX's own.

  Args:
    callback: the host function.
    result_shape_dtypes: the shapes and dtypes of its result (see above).
    *args: arguments of the callback, pytrees of arrays or numbers.
    sharding: a ``SingleDeviceSharding`` naming the device that calls the
      host, in code over several devices (handed to JAX's implementation).
    vmap_method: the ``vmap`` behaviour, see above.
    **kwargs: keyword arguments of the callback, pytrees of arrays.

  Returns:
    The callback's result, as JAX arrays of ``result_shape_dtypes``.
  """
  if vmap_method not in _VMAP_METHODS:
    raise ValueError(
      f"vmap_method must be on of the allowed methods {_VMAP_METHODS}, "
      f"but got: {vmap_method}"
    )
  return _callback(
    "pure_callback",
    PureRules(vmap_method),
    callback,
    result_shape_dtypes,
    args,
    kwargs,
    sharding,
    {"vmap_method": vmap_method},
  )


pure_callback._hostcb_replaces = _JAX["pure_callback"]


def io_callback(
  callback: Callable[..., Any],
  result_shape_dtypes: Any,
  *args: Any,
  sharding=None,
  ordered: bool = False,
  **kwargs: Any,
):
  """``jax.experimental.io_callback`` on hostcb's engine: calls a host
  function with side effects from JAX code and returns its result.

  ``callback(*args, **kwargs)`` runs on the host every time the program
  reaches it (it is never dropped) and must return a pytree of arrays
  with as many leaves as ``result_shape_dtypes`` (a pytree of objects with
  ``shape`` and ``dtype``; ``None`` for no result), each of the described
  shape and dtype.  Under ``jax.vmap`` it is called once per batch
  element, unless ``ordered``, which ``vmap`` refuses.  It cannot be
  differentiated.

  hostcb runs every ``io_callback`` in program order with the other
  callbacks of its device, ``ordered`` or not.  The callback receives
  ``jax.Array`` s on the CPU, as JAX's (NumPy arrays with the opt-out
  ``hostcb_callback_jax_arrays=False``).  Differences from JAX's
  (``docs/jax_callbacks.md``): with ``sharding=`` given, or a callback
  defined inside JAX, the call is JAX's own.

  Args:
    callback: the host function.
    result_shape_dtypes: the shapes and dtypes of its result.
    *args: arguments of the callback, pytrees of arrays or numbers.
    sharding: a ``SingleDeviceSharding`` naming the device that calls the
      host (handed to JAX's implementation).
    ordered: whether the call must stay in order with the other ordered
      callbacks (hostcb keeps every callback in order; ``vmap`` refuses an
      ordered one, as JAX's does).
    **kwargs: keyword arguments of the callback, pytrees of arrays.

  Returns:
    The callback's result, as JAX arrays of ``result_shape_dtypes``.
  """
  return _callback(
    "io_callback",
    IoRules(bool(ordered)),
    callback,
    result_shape_dtypes,
    args,
    kwargs,
    sharding,
    {"ordered": ordered},
  )


io_callback._hostcb_replaces = _JAX["io_callback"]


# ------------------------------------------------ jax.effects_barrier
# jax.effects_barrier() waits for hostcb's callbacks too, and raises their
# failures as hostcb's barrier does, from the first bind of a hostcb
# primitive on (not at import: hostcb._jax_internals.patches).  JAX's own
# wait reads its runtime tokens, which is no read of a result: it raises no
# failed debug.callback, which hostcb's barrier raises after.
ji.when_first_needed(
  functools.partial(
    ji.patch_effects_barrier,
    functools.partial(wait_for_earlier_callbacks, raise_failures=True),
    _engine_errors.held,
  )
)
