"""The public ``host_callback`` API: ``id_tap``, ``id_print``, ``call``.

This module is also what ``from jax.experimental import host_callback``
resolves to once hostcb's import hook is installed (see
:mod:`hostcb._import_hook`), so it exports every public name of the legacy
module.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
from typing import Any, Callable

import jax
import numpy as np

from hostcb import config
from hostcb import _jax_internals as ji
from hostcb._core import lowering as _lowering  # noqa: F401  (registers lowerings)
from hostcb._core import by_name
from hostcb._core.host_function import HostFunction
from hostcb._core.primitives import (
  CallTarget,
  Prints,
  TapTarget,
  call_p,
  tap_p,
)
from hostcb import _engine as engine
from hostcb._core import array_text
from hostcb._engine.entries import ArrayTap, PrintLineTap
from hostcb._core.printing import (
  engine_lines_writer,
  caller_print_options,
  format_header,
  format_value,
  numpy_print_options,
  print_tap,
  write_lines,
)
from hostcb._core.callback_types import is_key, result_avals
from hostcb._engine import (
  CallbackException,
  barrier_wait,
  stop_outfeed_receiver,
)
from hostcb._engine.output_order import consumer_stdout as _consumer_stdout

__all__ = [
  "id_tap",
  "id_print",
  "call",
  "barrier_wait",
  "stop_outfeed_receiver",
  "CallbackException",
  "TapFunctionException",
  "CallbackFlavor",
]

TapFunctionException = CallbackException
"""Legacy alias of :class:`CallbackException`."""

# Legacy code sets the knobs with jax.config.update("jax_host_callback_...").
ji.register_config_options(
  config.update,
  config.read(config.INLINE),
  config.read(config.MAX_QUEUE_BYTE_SIZE),
)


class CallbackFlavor(enum.Enum):
  """How a callback may be treated by JAX.

  ``IO_CALLBACK`` (default): the callback has side effects; it always runs,
  in program order, and ``call`` cannot be batched.
  ``PURE``: ``call`` is a pure function of its argument: JAX may drop it if
  its result is unused, and ``vmap`` calls it once per batch element.
  ``DEBUG``: like ``IO_CALLBACK`` (legacy's default implementation did
  the same; its alternative one accepted it only without results).
  Taps always behave as ``IO_CALLBACK``.
  """

  IO_CALLBACK = 1
  PURE = 2
  DEBUG = 3


def _check_flavor(flavor) -> None:
  if not isinstance(flavor, CallbackFlavor):
    raise TypeError(
      f"callback_flavor must be a hostcb.CallbackFlavor; got {flavor!r}"
    )


def _check_device_index(device_index) -> None:
  if (
    isinstance(device_index, bool)
    or not isinstance(device_index, int)
    or device_index < 0
  ):
    raise ValueError(
      f"device_index must be a non-negative int; got {device_index!r}"
    )
  n = jax.device_count()
  if device_index >= n:
    raise ValueError(
      f"device_index must name one of the {n} devices "
      f"(0 to {n - 1}); got {device_index}"
    )


_NUMBERS = (int, float, complex, bool, np.ndarray, np.generic)


def _array_like(x) -> bool:
  """An object JAX takes as an array: a shape and a numeric dtype (e.g. the
  typed literals that JAX 0.8 passes for constants)."""
  try:
    return hasattr(x, "shape") and np.dtype(x.dtype) != object
  except TypeError:  # a dtype NumPy does not know: not an array to JAX
    return False


def _operands(arg, what: str):
  """The flat operands of ``arg``, its structure and its key leaves.

  Leaves must be arrays or numbers; NumPy values and numbers are bound as
  they are (JAX gives them the canonical dtype, as in legacy: ``np.int64``
  becomes ``int32`` unless x64 is on).  PRNG key arrays travel as their key
  data (``jax.random.key_data``): the host sees the ``uint32`` array.
  Returns the operands, the tree structure and, per operand, the key
  implementation to rewrap it with (or None).
  """
  flat, treedef = jax.tree_util.tree_flatten(arg)
  key_impls = []
  for i, x in enumerate(flat):
    if isinstance(x, jax.Array) or ji.is_tracer(x):
      if is_key(x):
        key_impls.append(jax.random.key_impl(x))
        flat[i] = jax.random.key_data(x)
        continue
    else:
      _check_leaf(x, f"the argument of {what}")
    key_impls.append(None)
  return flat, treedef, key_impls


def _check_leaf(x, where: str) -> None:
  """Raises legacy's TypeError unless ``x`` (not a JAX array or tracer) is
  a value JAX takes: an array or a number."""
  if (not isinstance(x, _NUMBERS) and not _array_like(x)) or (
    isinstance(x, np.ndarray) and x.dtype == object
  ):
    raise TypeError(
      f"Argument '{x}' of type {type(x)} is not a valid JAX type. "
      f"(hostcb: every leaf of {where} must be an array or a number)"
    )


def _check_result(result) -> None:
  """Legacy checked each leaf of ``id_tap``'s ``result`` as a JAX value
  before anything else, though it returns ``result`` as it is."""
  for x in jax.tree_util.tree_leaves(result):
    if not (isinstance(x, jax.Array) or ji.is_tracer(x)):
      _check_leaf(x, "the result of id_tap")


def id_tap(
  tap_func: Callable,
  arg,
  *,
  result=None,
  tap_with_device=False,
  device_index=0,
  callback_flavor=CallbackFlavor.IO_CALLBACK,
  partitioned=False,
  **kwargs,
):
  """Identity function that also sends ``arg`` to ``tap_func`` on the host.

  The host calls ``tap_func(arg, transforms)`` (and ``device=dev`` too when
  ``tap_with_device``), where ``arg`` holds NumPy arrays and ``transforms``
  lists the transformations applied, e.g.
  ``(("batch", {"batch_dims": (0,)}),)`` under ``vmap``.  The device does not
  wait for ``tap_func``: use :func:`barrier_wait` to wait for all taps.

  Args:
    tap_func: the host function.
    arg: a pytree of arrays or numbers to tap.
    result: if given, returned instead of ``arg`` (and not sent to the host).
    tap_with_device: pass the tapping device as ``device=``.
    device_index: in sharded (``jit``/``pjit``) code, which of the
      computation's devices collects the whole operand and taps.
    callback_flavor: accepted for compatibility; taps are always ordered
      side effects.
    partitioned: in sharded ``jit`` code, every device taps its own shard
      (one call per device, in each process for its own devices) instead
      of ``device_index`` tapping the whole, gathered, value; with
      ``tap_with_device`` the function also gets ``index=``: the shard's
      slice of the global array, a tuple of slices per leaf of ``arg``
      (``slice(None)`` where the array is not split; all ``slice(None)``
      in ``shard_map``/``pmap`` code, whose operands are already the
      device's own).  See ``docs/partitioned.md``.

  Returns:
    ``arg``, or ``result`` if given.
  """
  if kwargs:
    raise TypeError(
      "Support for **kwargs in ``id_tap`` has been removed. Instead, "
      "pre-apply keyword arguments, either by using a closure or by passing "
      "``functools.partial(tap_func, **kwargs)``. "
      f"(hostcb: got keyword arguments {sorted(kwargs)})"
    )
  if result is not None:
    _check_result(result)
  if not callable(tap_func):
    raise TypeError(
      f"Expected a callable value, got {tap_func} "
      "(hostcb: the tap_func of id_tap)"
    )
  _check_flavor(callback_flavor)
  _check_device_index(device_index)
  if not isinstance(partitioned, bool):
    raise TypeError(f"partitioned must be a bool; got {partitioned!r}")
  flat, treedef, key_impls = _operands(arg, "id_tap")
  # ``id_tap(print, x)``, the quickest debugging tap, prints as id_print
  # does: reads and writes of the program wait for its lines.
  prints = isinstance(tap_func, _Printer) or tap_func is builtins.print
  target = TapTarget(
    tap_func,
    treedef,
    bool(tap_with_device),
    prints=Prints.LINES if prints else Prints.NOTHING,
    partitioned=partitioned,
  )
  outs = tap_p.bind(
    *flat, target=target, transforms=(), device_index=device_index
  )
  if result is not None:
    return result
  outs = [
    o if impl is None else jax.random.wrap_key_data(o, impl=impl)
    for o, impl in zip(outs, key_impls)
  ]
  return treedef.unflatten(outs)


def _engine_formats_arrays() -> bool:
  """Whether the native engine makes ``id_print``'s text (array_text.cc)."""
  return engine.native.formats_print_lines() and array_text.formats_natively()


@dataclasses.dataclass(frozen=True)
class _Printer(HostFunction):
  """The tap function of one ``id_print`` site (hashable, for caching).

  Equal to another only for the same stream (the same object) and keyword
  values that are equal and print the same (:mod:`hostcb._core.identity`).
  """

  output_stream: Any
  threshold: int | None
  kwargs: tuple
  print_options: tuple | None  # the caller's NumPy print options, if needed

  def __call__(self, arg, transforms, **device):
    # As legacy's functools.partial did: the device of ``tap_with_device``
    # overrides a user's ``device=`` keyword, and a user's ``transforms=``
    # fails the tap with a TypeError (multiple values for 'transforms').
    with numpy_print_options(self.print_options):
      print_tap(
        arg,
        transforms,
        output_stream=self.output_stream,
        threshold=self.threshold,
        **{**dict(self.kwargs), **device},
      )

  def tap_entry(self) -> ArrayTap | None:
    """:meth:`__call__`'s work with the header line made once, where every
    keyword value is a plain ``str``, number, bool or None (whose text
    cannot change) and the caller's NumPy print options are the
    consumer's; else None."""
    kwargs = dict(self.kwargs)
    if (
      self.print_options is not None
      or "transforms" in kwargs  # fails each tap, as __call__
      or "device" in kwargs  # print_tap's parameter: None is not printed
      # A value whose text can change between taps (a list, a subclass's
      # __str__): the exact scalars that an exported spec holds cannot.
      or not all(by_name.json_scalar(v) for v in kwargs.values())
    ):
      return None
    head = [format_header(kwargs)] if kwargs else []
    stream, threshold = self.output_stream, self.threshold

    def print_one(arg, transforms) -> None:
      # On a consumer thread only: sys.stdout as it is when it prints.
      write_lines(
        [*head, format_value(arg, threshold)], stream, _consumer_stdout
      )

    if (
      threshold is not None and type(threshold) is not int
    ) or not _engine_formats_arrays():
      return ArrayTap(print_one, ())
    # The engine makes the text of a value that its array_text.cc formats
    # (as numpy.array2string, while NumPy's defaults are in force), print_one
    # any other.
    return PrintLineTap(
      engine_lines_writer(stream, bool(head), _consumer_stdout),
      ((head[0] + "\n").encode() if head else b"", b""),
      ArrayTap(print_one, ()),
      (
        array_text.native_flags,
        1000 if threshold is None else max(min(threshold, 1 << 62), -1),
        False,
      ),
    )

  def __hash__(self):
    try:
      return hash(
        (
          id(self.output_stream),
          self.threshold,
          self.kwargs,
          self.print_options,
        )
      )
    except TypeError:  # an unhashable keyword value: no cache sharing
      return id(self)

  def export(self) -> tuple[str, dict] | None:
    """By name (no registration: the name is ""), when it prints to
    ``sys.stdout`` with keywords and NumPy options that JSON can hold
    (:mod:`hostcb.named`)."""
    if self.output_stream is not None:
      return None
    values = [v for _, v in self.kwargs] + [
      v for _, v in (self.print_options or ())
    ]
    if not all(by_name.json_scalar(v) for v in values):
      return None
    return "", {
      "kind": "id_print",
      "threshold": self.threshold,
      "kwargs": [list(kv) for kv in self.kwargs],
      "print_options": (
        None
        if self.print_options is None
        else [list(kv) for kv in self.print_options]
      ),
    }

  def __eq__(self, other):
    return (
      isinstance(other, _Printer)
      and self.output_stream is other.output_stream
      and self.threshold == other.threshold
      and self.kwargs == other.kwargs
      and [(type(v), str(v)) for _, v in self.kwargs]
      == [(type(v), str(v)) for _, v in other.kwargs]
      and self.print_options == other.print_options
    )


by_name.define_kind(
  "id_print",
  lambda name, fn, spec: _Printer(
    None,
    fn["threshold"],
    tuple(tuple(kv) for kv in fn["kwargs"]),
    None
    if fn["print_options"] is None
    else tuple(tuple(kv) for kv in fn["print_options"]),
  ),
)


def id_print(
  arg,
  *,
  result=None,
  tap_with_device=False,
  device_index=0,
  output_stream=None,
  threshold=None,
  callback_flavor=CallbackFlavor.IO_CALLBACK,
  partitioned=False,
  **kwargs,
):
  """Like :func:`id_tap`, with a tap function that prints ``arg``.

  Prints the keyword arguments first, on one line (sorted, as
  ``key: value``, with ``transforms`` and ``device`` when present), then
  ``arg`` as legacy printed it: tuples as ``( a b )``, lists as ``[ a b ]``,
  dicts as ``{ k=v }`` sorted by key, on one line when that fits in 80
  columns, else one element per line, nested 2 deeper; arrays through
  ``numpy.array2string(threshold=threshold)``.  A ``device=`` keyword is
  printed unless ``tap_with_device`` replaces it with the tap's device;
  ``transforms=`` makes the tap fail, as in legacy.

  Args:
    arg, result, tap_with_device, device_index, callback_flavor, partitioned:
      as for :func:`id_tap` (a partitioned print with ``tap_with_device``
      shows ``index:`` beside ``device:``).
    output_stream: an object with a ``write(str)`` method to print to;
      default ``sys.stdout``.
    threshold: passed to ``numpy.array2string``; ``None``: NumPy's print
      options, those of the thread that calls ``id_print`` (traces it).
    **kwargs: printed before ``arg``.
  """
  printer = _Printer(
    output_stream,
    threshold,
    tuple(sorted(kwargs.items())),
    caller_print_options(),
  )
  return id_tap(
    printer,
    arg,
    result=result,
    tap_with_device=tap_with_device,
    device_index=device_index,
    callback_flavor=callback_flavor,
    partitioned=partitioned,
  )


def _result_aval(r):
  """Legacy's leaf of ``result_shape``: a number, or anything with a shape
  and a dtype; its dtype canonicalized."""
  if hasattr(r, "shape") and hasattr(r, "dtype"):
    shape, dtype = tuple(r.shape), np.dtype(r.dtype)
  else:
    if not isinstance(r, (int, float, complex, bool, np.number, np.bool_)):
      raise TypeError(type(r))
    shape, dtype = (), np.asarray(r).dtype
  return ji.ShapedArray(shape, jax.dtypes.canonicalize_dtype(dtype))


def _result_avals(result_shape):
  try:
    return result_avals(result_shape, _result_aval)
  except Exception:  # noqa: BLE001  (any malformed leaf: legacy's error)
    raise ValueError(
      "result_shape should be a pytree of values with structure matching "
      "the expected result of the callback function. The values must be "
      "either numeric scalars, or must have 'shape' and 'dtype' attributes. "
      f"Got {result_shape}"
    ) from None


def call(
  callback_func: Callable,
  arg,
  *,
  result_shape=None,
  call_with_device=False,
  device_index=0,
  callback_flavor=CallbackFlavor.IO_CALLBACK,
):
  """Calls ``callback_func(arg)`` on the host and returns its result.

  The device waits for the result.  ``result_shape`` describes it: a pytree
  whose leaves are numeric scalars or objects with ``shape`` and ``dtype``
  (e.g. ``jax.ShapeDtypeStruct``), or ``None``/``()`` for no result.  A
  result of another structure, shape or dtype, or an exception in
  ``callback_func``, fails the computation with an error that says what was
  expected and what came back.

  Args:
    callback_func: the host function, called as ``callback_func(arg)`` (with
      ``device=dev`` too when ``call_with_device``) with NumPy arrays; it
      returns a pytree of arrays.
    arg: a pytree of arrays or numbers.
    result_shape: the expected result, see above.
    call_with_device: pass the calling device as ``device=``.
    device_index: in sharded code, which of the computation's devices makes
      the call with the whole operand.
    callback_flavor: ``CallbackFlavor.PURE`` lets JAX drop unused calls and
      batch the call under ``vmap``; ``DEBUG`` behaves as ``IO_CALLBACK``
      (with or without results, as in legacy).

  Returns:
    The result of ``callback_func``, as arrays of ``result_shape``.
  """
  if not callable(callback_func):
    raise TypeError(
      f"Expected a callable value, got {callback_func} "
      "(hostcb: the callback_func of call)"
    )
  _check_flavor(callback_flavor)
  _check_device_index(device_index)
  avals, out_treedef = _result_avals(result_shape)
  flat, in_treedef, _ = _operands(arg, "call")
  target = CallTarget(
    callback_func, in_treedef, out_treedef, avals, bool(call_with_device)
  )
  outs = call_p.bind(
    *flat,
    target=target,
    device_index=device_index,
    effectful=callback_flavor is not CallbackFlavor.PURE,
  )
  if device_index and outs:
    # XLA (seen on 0.10.2, and with jax.pure_callback too) returns zeros when
    # a result made on a device other than the first is the program's output
    # as it is; a barrier op between them makes it move the data.
    outs = jax.lax.optimization_barrier(outs)
  return out_treedef.unflatten(outs)
