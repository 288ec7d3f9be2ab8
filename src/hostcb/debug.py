"""``jax.debug.print`` and ``jax.debug.callback`` on hostcb's engine.

:func:`print` and :func:`callback` take what JAX 0.10.2's ``jax.debug.print``
and ``jax.debug.callback`` take, and print and call what they do: a
``callback(*args, **kwargs)`` with the array arguments on the host and the
other arguments (strings, objects) as they were given; under ``jax.vmap``
once per batch element, in JAX's order; under ``jvp``/``grad`` with the
primal values, once; again when ``jax.checkpoint`` recomputes.

One deliberate difference: in a branch of a ``cond``/``switch`` whose
index ``vmap`` batches, and in the body of a ``while_loop`` whose
predicate it batches, they run only for the batch elements that take the
branch (that are still running), where JAX's run for every element
(:mod:`hostcb._jax_internals.branch_masks`).  :func:`jax_print` and
:func:`jax_callback`, which ``hostcb.install(jax_callbacks=True)`` puts in
place of JAX's, run for every element there, as JAX's do.

They are thin front ends over hostcb's tap primitive: the device hands the
operands to hostcb's engine and goes on (it does not wait for the
callback), and a consumer thread per device calls the function, in program
order with every other hostcb callback of that device.
``jax.effects_barrier()`` (and :func:`hostcb.barrier_wait`) waits for them.
Outside ``jit`` (nothing staged) the function runs at once in the calling
thread, after the callbacks dispatched before it, as JAX's does.

A PRNG key argument reaches the callback as JAX hands it over: as a key
outside ``jit``, as its key data (``uint32``) from staged code.  A failing
callback is logged where JAX logs it (``jax._src.debugging``).

The callback receives ``jax.Array`` s on the CPU, as JAX's does
(``hostcb_callback_jax_arrays=False``, the opt-out, gives NumPy arrays).
Differences from JAX's, each for a reason given in ``docs/jax_callbacks.md``
(and checked by the scenarios of ``tests/jax_diff``): the device never
waits for it, so an exception it raises under ``jit`` cannot fail the
call that ran the computation, as JAX's does: it is logged where JAX
logs it, and the first host read of a result on its device after it, or
the first barrier, raises it with JAX's words, as
``jax.errors.JaxRuntimeError`` (:mod:`hostcb._engine.errors`).  As JAX's,
``ordered=True`` is refused in a computation over several devices (JAX's
error).

:func:`breakpoint` and :func:`breakpoint_if` (defined in
:mod:`hostcb._debugger`) are JAX's text debugger on a host call that the
device waits for (``docs/debugging.md``).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import string
import sys
from typing import Any, Callable, Iterator

import jax
import numpy as np

from hostcb import config
from hostcb import _engine as engine
from hostcb._core import by_name
from hostcb import jax_callbacks as _jc
from hostcb._core import dropins as _dropins
from hostcb import _jax_internals as ji
from hostcb._engine.errors import note_jax_callback_failure
from hostcb._engine.output_order import consumer_stdout
from hostcb._jax_internals import branch_masks as _branch_masks
from hostcb._jax_internals.branch_masks import (
  BranchMaskWarning as BranchMaskWarning,
)
from hostcb._jax_internals import own_callbacks as _ji_callbacks
from hostcb._core.host_function import HostFunction
from hostcb._core.primitives import Prints, TapTarget, tap_p
from hostcb._engine.entries import ArrayTap, PrintLineTap
from hostcb._core import array_text
from hostcb._core.printing import caller_print_options, numpy_print_options
from hostcb._core.callback_types import is_key
from hostcb._debugger import breakpoint as breakpoint
from hostcb._debugger import breakpoint_if as breakpoint_if

__all__ = [
  "print",
  "callback",
  "breakpoint",
  "breakpoint_if",
  "jax_print",
  "jax_callback",
  "BranchMaskWarning",
]

_JAX_CALLBACK = _dropins.jax_function("debug_callback")
_cpu_array = ji.cpu_array
_JAX_PRINT = _dropins.jax_function("debug_print")


# --------------------------------------------------------- arguments
def _split(args: tuple, kwargs: dict):
  """``(in_tree, operands, static)`` of a debug callback's arguments: the
  leaves JAX stages (arrays, numbers) are operands; the others (strings,
  objects) stay on the host, as ``((leaf index, value), ...)``."""
  leaves, in_tree = jax.tree_util.tree_flatten((args, kwargs))
  operands, static = [], []
  for i, leaf in enumerate(leaves):
    if ji.is_jax_value(leaf):
      operands.append(leaf)
    else:
      static.append((i, leaf))
  return in_tree, operands, tuple(static)


def _element(array: np.ndarray, dim: int, i: int) -> np.ndarray:
  return array[(slice(None),) * dim + (i,)]


def _elements(leaves: tuple, levels: list) -> list:
  """The operands of each batch element, in the order in which JAX's
  ``vmap`` of a debug callback calls it.

  ``levels`` holds one tuple of batch dims per ``vmap``, innermost first;
  the outermost level's axes are in ``leaves`` as they are, each inner
  level's in the slices of the levels outside it.  JAX unrolls the
  innermost ``vmap`` first, so the innermost index varies slowest.
  """
  if not levels:
    return [leaves]
  *inner, outer = levels
  size = next(a.shape[d] for a, d in zip(leaves, outer) if d is not None)
  if size == 0:  # an empty batch: no element, no call
    return []
  per_outer = [
    _elements(
      tuple(
        a if d is None else _element(a, d, o) for a, d in zip(leaves, outer)
      ),
      inner,
    )
    for o in range(size)
  ]
  return [
    per_outer[o][k] for k in range(len(per_outer[0])) for o in range(size)
  ]


def _failed() -> None:
  """A staged callback failed (:meth:`_DebugCall.__call__`, in its
  ``except``): logged with its traceback, and noted, for the next host
  read of a result on its device or the next barrier to raise it.  A
  closed pipe (``prog.py | head``) is logged once: under JAX its first
  failed print ends the program's dispatches, where hostcb's computations
  dispatched before it still queue theirs, each of which fails the same
  way."""
  if isinstance(sys.exc_info()[1], BrokenPipeError):
    if _pipe_closed[0]:
      note_jax_callback_failure(sys.exc_info()[1])
      return
    _pipe_closed[0] = True
  _dropins.debug_logger.exception("jax.debug.callback failed")
  note_jax_callback_failure(sys.exc_info()[1])


_pipe_closed = [False]  # a BrokenPipeError was logged (_failed)


# The writes that take several lines at once as they take them one by one:
# the same text reaches the same buffer, then the same file (fewer flushes
# of a line-buffered stream).  A stream of another class gets one write
# per line, as JAX's print gives it.
_WRITES_OF_SEVERAL_LINES = frozenset(
  {io.TextIOWrapper.write, io.StringIO.write}
)


def _write_lines(lines: list[str]) -> None:
  """Writes the lines of ``debug.print`` s (each ending with a newline) to
  ``sys.stdout`` as it is when they are written: in one write where its
  class's write is one of :data:`_WRITES_OF_SEVERAL_LINES` (the engine
  gives the lines of consecutive prints of a batch together: module.cc,
  run_batch), else one write per line, each to ``sys.stdout`` as it is
  then.  A failed write is logged as a failed callback (:func:`_failed`),
  once for each line it held; but where the stream could not encode the
  lines written together, they are written again one by one, as JAX
  writes them, and only those it cannot encode fail."""
  try:
    stream = consumer_stdout()
    if len(lines) == 1:
      stream.write(lines[0])
      return
    if (
      type(stream).write in _WRITES_OF_SEVERAL_LINES
      and "write" not in getattr(stream, "__dict__", ())  # not patched
    ):
      try:
        stream.write("".join(lines))
        return
      except UnicodeEncodeError:
        # A TextIOWrapper encodes the whole text before it buffers any of
        # it: nothing was written, and each line goes by itself (below).
        pass
  except BaseException as e:  # as _DebugCall.__call__
    for _ in lines:
      _failed()
    if not isinstance(e, Exception):
      raise
    return
  interrupt = None  # raised once every line was written or logged
  for i, line in enumerate(lines):
    try:
      (stream if i == 0 else consumer_stdout()).write(line)
    except BaseException as e:  # noqa: BLE001  (an interrupt: re-raised below)
      _failed()
      if not isinstance(e, Exception) and interrupt is None:
        interrupt = e
  if interrupt is not None:
    raise interrupt


class _DebugCall(HostFunction):
  """The tap function of one ``debug.callback``/``debug.print`` site.

  Called by the engine as ``f(arg, transforms)``; rebuilds the callback's
  arguments (the host-side ones put back in place), once per batch element
  under ``vmap``, and calls it.  ``as_jax_arrays``: the array arguments as
  ``jax.Array`` s on the CPU (JAX's), made straight from the engine's host
  arrays (:func:`hostcb._jax_internals.cpu_arrays`), else NumPy arrays.

  ``masks_branches``: hostcb's own function (not JAX's drop-in): in a
  branch under ``vmap`` it runs only for the elements that take the
  branch.  ``mask``: the tap's first operand is the element's mask
  (:meth:`with_mask`); the function runs only where it holds.
  """

  mask = False

  def __init__(
    self,
    func: Callable,
    in_tree: Any,
    static: tuple,
    n_operands: int,
    key_impls: tuple,
    as_jax_arrays: bool,
    masks_branches: bool = False,
  ):
    self.func = func
    self.masks_branches = masks_branches
    self.masked_target = None  # of with_mask(), made once
    self.in_tree = in_tree
    self.static = static
    self.n = n_operands
    self.key_impls = (
      key_impls if any(k is not None for k in key_impls) else None
    )
    self.as_jax_arrays = as_jax_arrays
    # Traced with 64-bit types on: called with them on (_jc.call_with_x64).
    self.x64 = _jc.x64_enabled()
    self.to_jax = ji.cpu_arrays if as_jax_arrays else None
    if as_jax_arrays:
      ji.prepare_cpu_arrays()  # a JAX without what it needs fails here
    # Positional operands only: call without rebuilding the tree.
    self.positional = not static and in_tree == jax.tree_util.tree_structure(
      ((0,) * n_operands, {})
    )

  def __repr__(self) -> str:
    return f"jax.debug.callback({self.func!r})"

  def with_mask(self) -> _DebugCall:
    """This callback with the element's mask as its first operand."""
    masked = copy.copy(self)
    masked.mask = True
    masked.n = self.n + 1
    return masked

  def elements(self, leaves: tuple, transforms) -> Iterator[tuple]:
    """The operands of each call: once, or once per batch element under
    ``vmap``; with a mask, only the elements where it holds (without
    it)."""
    levels = [
      params["batch_dims"] for name, params in transforms if name == "batch"
    ]
    for element in _elements(leaves, levels):
      if not self.mask:
        yield element
      elif element[0]:
        yield element[1:]

  def export(self) -> tuple[str, dict] | None:
    """By name when its function is registered, or is a ``debug.print``'s
    (:mod:`hostcb.named`); its host-side arguments must be JSON scalars."""
    if isinstance(self.func, _Format):
      name, described = "", self.func.export_description()
      if described is None:
        return None
    else:
      name, described = by_name.name_of(self.func), {}
      if name is None:
        return None
    if not all(by_name.json_scalar(v) for _, v in self.static):
      if not name:
        return None
      raise by_name.NotExportable(
        "host-side arguments that are not str, numbers, bool or None", name
      )
    fn = {
      "in_tree": by_name.tree_json_of(self.in_tree, name),
      "static": [list(iv) for iv in self.static],
      "n": self.n,
      "as_jax_arrays": bool(self.as_jax_arrays),
      **({"mask": True} if self.mask else {}),
      **described,
    }
    return name, {"kind": "debug_callback" if name else "debug_print", **fn}

  def __call__(self, arg, transforms=()) -> None:
    """Runs the staged callback (the engine's call): a PRNG key operand
    arrives as its key data, as JAX's staged callback receives it.

    A failure is logged where JAX logs it, with its traceback, and kept:
    the computation that staged it went on long ago, so the first host
    read of a result on its device, or the first barrier, raises it as
    JAX's failed computation does (docs/jax_callbacks.md, "When a
    callback fails"; :func:`hostcb._engine.errors.note_jax_callback_failure`).
    A ``BaseException`` that is no ``Exception`` (an interrupt) goes on to
    the engine too."""
    try:
      if self.x64 and not _jc.x64_enabled():
        _jc.call_with_x64(self.run_staged, arg, transforms)
      elif not transforms and self.positional and not self.mask:
        # The common case, in one frame: positional array arguments.
        if self.n == 1:
          self.func(arg if self.to_jax is None else _cpu_array(arg))
        else:
          self.func(*(arg if self.to_jax is None else self.to_jax(arg)))
      else:
        self.run(arg, transforms, False)
    except BaseException as e:  # logged, and an interrupt re-raised
      _failed()
      if not isinstance(e, Exception):
        raise  # an interrupt goes on to the engine

  def tap_entry(self) -> ArrayTap | PrintLineTap | None:
    """For one positional array argument: :meth:`__call__`'s work with its
    lookups done once per executable, and for a ``debug.print`` with
    NumPy's default options, its formatting and writing in the same frame;
    else None.  For a ``debug.print`` whose fields are all plain ``{}``,
    where the engine formats in C, a :class:`PrintLineTap` whose
    ``write_lines`` is :func:`_write_lines`: a 0-d number's line made in
    C, any other value's in Python."""
    return _tap_entry(self)

  def run_staged(self, arg, transforms) -> None:
    """What :meth:`__call__` runs, without its handling of a failure."""
    if not transforms and self.positional and not self.mask:
      if self.n == 1:
        self.func(arg if self.to_jax is None else _cpu_array(arg))
      else:
        self.func(*(arg if self.to_jax is None else self.to_jax(arg)))
    else:
      self.run(arg, transforms, False)

  def run(self, arg, transforms, wrap_keys: bool) -> None:
    """Calls the function once, or once per batch element under ``vmap``;
    ``wrap_keys``: PRNG key operands as key arrays (JAX's eager call) rather
    than their key data (JAX's staged call)."""
    leaves = (arg,) if self.n == 1 else arg
    for element in self.elements(tuple(leaves), transforms):
      self.call(element, wrap_keys)

  def call(
    self, leaves, wrap_keys: bool = False, converted: bool = False
  ) -> None:
    """Calls the function with one set of operands (``converted``: already
    what the function gets)."""
    if self.to_jax is not None and not converted:
      leaves = self.to_jax(leaves)
    if wrap_keys and self.key_impls is not None:
      leaves = [
        a if impl is None else jax.random.wrap_key_data(a, impl=impl)
        for a, impl in zip(leaves, self.key_impls)
      ]
    if self.positional:
      self.func(*leaves)
      return
    flat = list(leaves)
    for i, value in self.static:
      flat.insert(i, value)
    args, kwargs = self.in_tree.unflatten(flat)
    self.func(*args, **kwargs)


def _tap_entry(call: _DebugCall) -> ArrayTap | PrintLineTap | None:
  """:meth:`_DebugCall.tap_entry`."""
  if call.x64 or not call.positional or call.n != 1 or call.mask:
    return None
  func = call.func
  if (
    type(func) is _Format
    and func.placeholders
    and func.options is None
    and call.to_jax is None
  ):
    fmt = func.fmt.format
    # A 0-d value as the Python number NumPy formats (_SCALAR_TYPES).
    scalar_types = _SCALAR_TYPES if _formats_value_only(func.fmt) else {}
    ndarray = np.ndarray
    pieces = _line_pieces(func.fmt) if scalar_types else None
    # An array in plain {} fields prints its str, which is array2string's
    # text under the consumer's options: the fast path's, where it has it.
    around = None if pieces is None else [p.decode() for p in pieces]

    def print_entry(arg, transforms) -> None:
      try:
        text = None
        if type(arg) is ndarray:
          if not arg.ndim:
            number = scalar_types.get(arg.dtype)
            if number is not None:
              arg = number(arg)
          elif around is not None and array_text.defaults_in_force():
            value = array_text.array_text(arg, None)
            if value is not None:
              text = value.join(around) + "\n"
        if text is None:
          text = fmt(arg) + "\n"
      except BaseException as e:  # as __call__
        _failed()
        if not isinstance(e, Exception):
          raise
        return
      _write_lines([text])

    if pieces is not None and engine.native.formats_print_lines():
      # The engine makes the line of a 0-d number in C, and of an array
      # whose str it makes (array_text.cc, under NumPy's defaults), and
      # writes it with _write_lines; print_entry formats any other value
      # (registry).
      return PrintLineTap(
        _write_lines,
        pieces,
        ArrayTap(print_entry, ()),
        (array_text.native_flags, 1000, True)
        if array_text.formats_natively()
        else None,
      )
    return ArrayTap(print_entry, ())
  to_jax = None if call.to_jax is None else ji.bound_cpu_array()

  def entry(arg, transforms) -> None:
    try:
      func(arg if to_jax is None else to_jax(arg))
    except BaseException as e:  # as __call__
      _failed()
      if not isinstance(e, Exception):
        raise

  return ArrayTap(entry, ())


# Under checkpoint, rematerialized as JAX rematerializes its debug callbacks.
_ji_callbacks.rematerialize_as_jax_debug(
  tap_p, lambda params: isinstance(params["target"].func, _DebugCall)
)


class _Eagerly:
  """Runs a debug callback that is not staged (outside ``jit``) at once, in
  the calling thread, after hostcb's callbacks dispatched before it, as
  JAX runs its own: its exception is logged where JAX logs it and reaches
  the caller."""

  def __init__(self, call: _DebugCall):
    self.call = call

  def __call__(self, args: tuple, transforms: tuple) -> None:
    _dropins.wait_for_earlier_callbacks()
    call = self.call
    if call.as_jax_arrays:
      # As JAX puts them on the CPU: a Python number stays weakly typed.
      cpu = jax.local_devices(backend="cpu")[0]
      arrays = tuple(jax.device_put(a, cpu) for a in args)
    else:
      arrays = tuple(_canonical_array(a) for a in args)
    try:
      for element in call.elements(arrays, transforms):
        call.call(element, True, converted=True)
    except BaseException:
      _dropins.debug_logger.exception("jax.debug.callback failed")
      raise


def _rebuilt_debug_call(func: Callable, fn: dict) -> _DebugCall:
  """The :class:`_DebugCall` that :meth:`_DebugCall.export`
  described, calling ``func`` (PRNG keys arrive as key data when staged)."""
  mask = bool(fn.get("mask", False))
  n = fn["n"] - mask
  call = _DebugCall(
    func,
    by_name.tree_from_json(fn["in_tree"]),
    tuple((i, v) for i, v in fn["static"]),
    n,
    (None,) * n,
    fn["as_jax_arrays"],
  )
  return call.with_mask() if mask else call


by_name.define_kind(
  "debug_callback",
  lambda name, fn, spec: _rebuilt_debug_call(by_name.lookup(name), fn),
)


def _canonical_array(a) -> np.ndarray:
  """``a`` on the host with the dtype JAX gives it (a Python ``int`` is an
  ``int32``, a NumPy ``float64`` a ``float32`` without x64).  A
  ``jax.Array`` keeps its own, as JAX's ``device_put`` keeps it: a 64-bit
  one made without x64 (``jax_explicit_x64_dtypes="allow"``) shows its
  values, not narrowed ones."""
  if isinstance(a, jax.Array):
    return np.asarray(a)
  a = np.asarray(a)
  dtype = jax.dtypes.canonicalize_dtype(a.dtype)
  return a if dtype == a.dtype else a.astype(dtype)


def _tap(
  func: Callable,
  args: tuple,
  kwargs: dict,
  ordered: bool,
  as_jax_arrays: bool | None = None,
  partitioned: bool = False,
  masks_branches: bool = False,
) -> None:
  """Stages ``func(*args, **kwargs)``; ``as_jax_arrays``: whether its array
  arguments are ``jax.Array`` s (None: as ``hostcb_callback_jax_arrays``
  says, True by default); ``masks_branches``: in a branch under ``vmap``,
  called only for the elements that take it (:mod:`hostcb._jax_internals.branch_masks`)."""
  in_tree, operands, static = _split(args, kwargs)
  key_impls = []
  for i, x in enumerate(operands):
    if is_key(x):
      key_impls.append(jax.random.key_impl(x))
      operands[i] = jax.random.key_data(x)
    else:
      key_impls.append(None)
  call = _DebugCall(
    func,
    in_tree,
    static,
    len(operands),
    tuple(key_impls),
    config.read(config.JAX_ARRAYS) if as_jax_arrays is None else as_jax_arrays,
    masks_branches,
  )
  if masks_branches:
    _branch_masks.install(_TAP_MASKS)
  # An ordered callback carries JAX's ordered debug effect too: JAX
  # refuses it in computations over several devices, as its own.
  effects = (ji.jax_ordered_debug_effect(),) if ordered else ()
  target = TapTarget(
    call,
    _dropins.flat_treedef(len(operands)),
    False,
    eager=_Eagerly(call),
    effects=effects,
    prints=Prints.LINES if isinstance(func, _Format) else Prints.MAYBE,
    partitioned=partitioned,
    per_element=partitioned,
  )
  # An operand that is not a JAX value: JAX's error, naming its primitive.
  _dropins.bind_as(
    "debug_print" if isinstance(func, _Format) else "debug_callback",
    tap_p,
    *operands,
    target=target,
    transforms=(),
    device_index=0,
  )


def _to_jax(
  jax_fn: Callable, first, args: tuple, kwargs: dict, options: dict
) -> None:
  """Hands a call to JAX's own function, with its options."""
  if any(k in kwargs for k in options):
    # Only the two-call form can pass the callback keywords of these names.
    jax_fn(**options)(first, *args, **kwargs)
  else:
    jax_fn(first, *args, **options, **kwargs)


def _partitions_natively() -> bool:
  """Whether ``partitioned=True`` runs on hostcb's engine: on CPU, with the
  native engine built (a sharded ``jit`` then taps per shard on it).
  Elsewhere (GPUs, no native engine) the call goes to JAX's own
  implementation, which partitions with its Python callbacks."""
  return jax.default_backend() == "cpu" and engine.available()


# ------------------------------------------------------- branch masks
def _debug_call(params: dict) -> _DebugCall | None:
  func = params["target"].func
  return func if isinstance(func, _DebugCall) else None


def _maskable(params: dict) -> bool:
  call = _debug_call(params)
  return call is not None and call.masks_branches and not call.mask


def _masked(params: dict) -> bool:
  call = _debug_call(params)
  return call is not None and call.mask


def _with_mask(params: dict) -> dict:
  """The parameters of the tap with the element's mask as its first
  operand (its target made once per callback)."""
  target = params["target"]
  call = target.func
  if call.masked_target is None:
    masked = call.with_mask()
    call.masked_target = dataclasses.replace(
      target,
      func=masked,
      treedef=_dropins.flat_treedef(masked.n),
      eager=_Eagerly(masked),
    )
  return {**params, "target": call.masked_target}


_TAP_MASKS = _branch_masks.TapMasks(tap_p, _maskable, _masked, _with_mask)


# ------------------------------------------------------------ callback
def _callback(
  func,
  args: tuple,
  kwargs: dict,
  ordered: bool,
  partitioned: bool,
  masks_branches: bool = True,
) -> None:
  if not callable(func):
    raise TypeError(
      "first argument to jax.debug.callback must be callable, "
      f"but got an object of type {type(func)}"
    )
  if _dropins.is_jax_own(func) or (partitioned and not _partitions_natively()):
    _to_jax(
      _JAX_CALLBACK,
      func,
      args,
      kwargs,
      {"ordered": ordered, "partitioned": partitioned},
    )
    return
  _tap(
    func,
    args,
    kwargs,
    ordered,
    partitioned=partitioned,
    masks_branches=masks_branches,
  )


def callback(
  callback: Callable[..., None] | None = None,
  *args: Any,
  ordered: bool = False,
  partitioned: bool = False,
  **kwargs: Any,
) -> Callable[..., None] | None:
  """``jax.debug.callback`` on hostcb's engine: calls ``callback(*args,
  **kwargs)`` on the host from JAX code, for its side effects.

  Array and number arguments come from the device as ``jax.Array`` s on
  the CPU, as JAX passes them (NumPy arrays with the opt-out
  ``hostcb_callback_jax_arrays=False``); any other argument (a string, an
  object) is passed as it was given.  Under ``jax.vmap`` the callback is called once
  per batch element (in a ``cond`` branch, or a ``while_loop`` body, whose
  predicate ``vmap`` batches: once per element that takes the branch, or
  is still running; JAX's is called for every element); under
  ``jvp``/``grad`` once, with the primal values; under
  ``jax.checkpoint`` again when the forward pass is recomputed.  The
  device does not wait for it: hostcb's consumer thread calls it, in
  program order with the other callbacks of its device;
  ``jax.effects_barrier()`` waits until it has run.  An exception it
  raises under ``jit`` is logged where JAX logs it and raised as JAX's
  failed computation raises it (``jax.errors.JaxRuntimeError``, JAX's
  words) by the first host read of a result on its device after it, or
  else the first barrier, once.  Outside ``jit`` it runs at once, in the
  calling thread, and its exception reaches the caller.

  Two forms, as JAX's: ``callback(f, *args, ordered=..., **kwargs)``, and
  ``callback(ordered=...)`` returning a function that takes ``(f, *args,
  **kwargs)`` (every keyword of that second call goes to ``f``).

  Args:
    callback: the host function (its return value is ignored).
    *args: its positional arguments.
    ordered: hostcb keeps every callback in program order either way;
      ``True`` is refused, as by JAX, in a computation over several
      devices.
    partitioned: in a sharded ``jit``, call it once per device with the
      device's shard of each array argument (in each process for its own
      devices), without gathering them, as JAX does; hostcb's engine runs
      it (on CPU; elsewhere JAX's own implementation does).  Outside
      ``jit`` it is called once, with the whole arrays, as JAX's.
    **kwargs: its keyword arguments.

  Returns:
    None, or in the two-call form the function to call.
  """
  if callback is not None:
    _callback(callback, args, kwargs, ordered, partitioned)
    return None
  if args or kwargs:
    raise TypeError(
      "debug_callback received unexpected arguments in the "
      f"two-call form: {args=} {kwargs=}"
    )

  def debug_callback(
    callback: Callable[..., None], *args: Any, **kwargs: Any
  ) -> None:
    _callback(callback, args, kwargs, ordered, partitioned)

  return debug_callback


callback._hostcb_replaces = _JAX_CALLBACK


# --------------------------------------------------------------- print
class _FormatCheck(string.Formatter):
  """Formats nothing, only checks that the format string uses every
  argument and names no missing one (JAX's checks, with its messages)."""

  def format_field(self, value, format_spec):
    return ""

  def check_unused_args(self, used_args, args, kwargs):
    unused = [a for i, a in enumerate(args) if i not in used_args]
    if unused:
      raise ValueError(
        f"Unused positional arguments to `jax.debug.print`: {unused}"
      )
    unused_names = [k for k in kwargs if k not in used_args]
    if unused_names:
      raise ValueError(
        f"Unused keyword arguments to `jax.debug.print`: {unused_names}. "
        'You may be passing an f-string (i.e, `f"{x}"`) into '
        "`jax.debug.print` and instead should pass in a regular string."
      )


_format_check = _FormatCheck()


def _first_field_is_placeholder(fmt: str) -> bool:
  """JAX formats the arguments into ``fmt`` when its first parsed piece is
  a replacement field, and otherwise prints ``fmt`` followed by them."""
  if not fmt:
    return False
  _, field, _, _ = next(iter(string.Formatter().parse(fmt)))
  return field is not None


# What NumPy formats a 0-d array of these dtypes as: ``format(a, spec)``
# of a 0-d array formats its scalar, and the scalar's ``__format__``
# formats the Python number of it (``float``, ``int``, ``bool``), so the
# text is the number's, for every spec (checked for NumPy 1.26 and 2.4 with
# every kind of spec, NaN, infinities, -0.0 and the limits of each dtype,
# errors included).  Formatting that number directly skips NumPy's two
# steps (0.2 µs less per print of an f32[], a third of its formatting).
# Not for the other dtypes (long double, complex, the ML dtypes), whose
# scalars format otherwise.
_SCALAR_TYPES: dict[np.dtype, type] = {
  **{np.dtype(t): float for t in (np.float16, np.float32, np.float64)},
  **{np.dtype(t): int for t in array_text.INTEGER_TYPES},
  np.dtype(np.bool_): bool,
}


def _formats_value_only(fmt: str) -> bool:
  """Whether every replacement field of ``fmt`` formats its one positional
  argument with at most a plain spec (``{}``, ``{0}``, ``{:.3f}``): no
  conversion (``!s`` prints the array's ``str``), attribute, item, name or
  nested field, so that a 0-d array and its Python number format alike."""
  try:
    for _, field, spec, conversion in string.Formatter().parse(fmt):
      if field is None:
        continue
      if field not in ("", "0") or conversion is not None or "{" in spec:
        return False
  except ValueError:
    return False
  return True


def _line_pieces(fmt: str) -> tuple[bytes, ...] | None:
  """The literal text around the fields of ``fmt`` (``{{``/``}}`` undone),
  as UTF-8, for the engine's C formatting of a 0-d number
  (``print_line_text``): where every field is a plain ``{}``/``{0}``,
  without a spec; else None.  ``"x={}!"`` gives ``(b"x=", b"!")``."""
  pieces, fields, text = [], [], ""
  try:
    for literal, field, spec, conversion in string.Formatter().parse(fmt):
      text += literal
      if field is None:
        continue
      if field not in ("", "0") or spec or conversion is not None:
        return None
      fields.append(field)
      pieces.append(text)
      text = ""
    pieces.append(text)
    # What str.format accepts with one argument: one automatic field, or
    # any number of {0} (with skip_format_check, a print may have others,
    # which Python's format fails on).
    if fields != [""] and (not fields or "" in fields):
      return None
    return tuple(p.encode("utf-8") for p in pieces)
  except (ValueError, UnicodeEncodeError):  # not formattable so: Python's
    return None


def _shows_jax_arrays(fmt: str) -> bool:
  """Whether a format shows more of its arguments than their values (a
  ``!r``/``!a`` conversion, an attribute or an item): those print what a
  ``jax.Array`` prints, so they get one."""
  try:
    for _, field, _, conversion in string.Formatter().parse(fmt):
      if field is None:
        continue
      if conversion in ("r", "a") or "." in field or "[" in field:
        return True
  except ValueError:
    return True
  return False


def _contains_arrays(args: tuple, kwargs: dict) -> bool:
  """Whether an argument is a container (a pytree node) with an array or
  number in it: a container prints the ``repr`` of its arrays, which is
  ``Array(...)`` for the ``jax.Array`` s that JAX's print gets."""
  for a in (*args, *kwargs.values()):
    leaves = jax.tree_util.tree_leaves(a)
    if (
      leaves
      and not (len(leaves) == 1 and leaves[0] is a)
      and any(ji.is_jax_value(x) for x in leaves)
    ):
      return True
  return False


class _Format:
  """The callback of one ``debug.print``: formats and writes one line to
  ``sys.stdout`` (looked up when it prints), with the NumPy print options
  of the thread that called ``print``."""

  def __init__(self, fmt: str, placeholders: bool, options):
    self.fmt = fmt
    self.placeholders = placeholders
    self.options = options

  def __repr__(self) -> str:
    return f"jax.debug.print({self.fmt!r})"

  def export_description(self) -> dict | None:
    """What :mod:`hostcb.named` writes down of it, or None (a format or
    NumPy options that JSON cannot hold as they are: a ``str`` subclass
    keeps its own ``format``)."""
    options = self.options or ()
    if not by_name.json_scalar(self.fmt) or not all(
      by_name.json_scalar(v) for _, v in options
    ):
      return None
    return {
      "fmt": self.fmt,
      "placeholders": self.placeholders,
      "options": None if self.options is None else [list(kv) for kv in options],
    }

  def __call__(self, *args, **kwargs) -> None:
    if self.placeholders:
      if self.options is None:  # NumPy's defaults: nothing to set
        text = self.fmt.format(*args, **kwargs)
      else:
        with numpy_print_options(self.options):
          text = self.fmt.format(*args, **kwargs)
    else:
      text = " ".join((self.fmt, *(str(a) for a in args)))
    sys.stdout.write(text + "\n")


by_name.define_kind(
  "debug_print",
  lambda name, fn, spec: _rebuilt_debug_call(
    _Format(
      fn["fmt"],
      fn["placeholders"],
      None
      if fn["options"] is None
      else tuple(tuple(kv) for kv in fn["options"]),
    ),
    fn,
  ),
)


def _print(
  fmt,
  args: tuple,
  kwargs: dict,
  ordered: bool,
  partitioned: bool,
  skip_format_check: bool,
  use_logging: bool,
  masks_branches: bool = True,
) -> None:
  if use_logging or (partitioned and not _partitions_natively()):
    options = {
      "ordered": ordered,
      "partitioned": partitioned,
      "skip_format_check": skip_format_check,
    }
    if use_logging:
      options["_use_logging"] = True
    _to_jax(_JAX_PRINT, fmt, args, kwargs, options)
    return
  if not skip_format_check:
    _format_check.format(fmt, *args, **kwargs)
  placeholders = _first_field_is_placeholder(fmt)
  printer = _Format(fmt, placeholders, caller_print_options())
  _tap(
    printer,
    args,
    kwargs,
    ordered,
    as_jax_arrays=(
      # A str subclass's own format gets what JAX's gets (and so not the
      # engine's C text of a number, which is str.format's).
      type(fmt) is not str
      or (placeholders and _shows_jax_arrays(fmt))
      or _contains_arrays(args, kwargs)
    ),
    partitioned=partitioned,
    masks_branches=masks_branches,
  )


def print(
  fmt: str | None = None,
  *args,
  ordered: bool = False,
  partitioned: bool = False,
  skip_format_check: bool = False,
  _use_logging: bool = False,
  **kwargs,
) -> Callable[..., None] | None:
  """``jax.debug.print`` on hostcb's engine: prints values from JAX code.

  Prints ``fmt.format(*args, **kwargs)`` on one line of ``sys.stdout``,
  with the array arguments as NumPy prints them, under the NumPy print
  options of the thread that called ``print`` (pass the values as
  arguments: an f-string would print the tracers).  A format whose first
  piece is not a replacement field prints ``fmt`` and the arguments
  separated by spaces (with ``skip_format_check``; otherwise unused
  arguments are an error).  The text is exactly JAX's; ``{x!r}`` shows
  ``Array(...)`` as JAX's does.

  When, how often and in which order it prints is as for :func:`callback`:
  once per batch element under ``vmap`` (in a batched ``cond`` branch
  only for the elements that take it), the device does not wait,
  ``jax.effects_barrier()`` waits for it, outside ``jit`` it prints at
  once.

  Two forms, as JAX's: ``print(fmt, *args, ordered=..., **kwargs)`` and
  ``print(ordered=...)`` returning a function of ``(fmt, *args,
  **kwargs)``.

  Args:
    fmt: a ``str.format`` format string.
    *args: values for its positional fields.
    ordered: as for :func:`callback`.
    partitioned: in a sharded ``jit``, print once per device, its shard
      of each array, as for :func:`callback`.
    skip_format_check: do not check that ``fmt`` uses every argument.
    _use_logging: log instead of printing (``jax.debug.log``): handed to
      JAX's own implementation.
    **kwargs: values for its named fields.

  Returns:
    None, or in the two-call form the function to call.
  """
  if fmt is not None:
    _print(
      fmt, args, kwargs, ordered, partitioned, skip_format_check, _use_logging
    )
    return None
  if args or kwargs:
    raise TypeError(
      "debug_print received unexpected arguments in the "
      f"two-call form: {args=} {kwargs=}"
    )

  def debug_print(fmt: str, *args, **kwargs) -> None:
    _print(
      fmt, args, kwargs, ordered, partitioned, skip_format_check, _use_logging
    )

  return debug_print


print._hostcb_replaces = _JAX_PRINT


# ------------------------------------------------ JAX's, under install()
def jax_callback(
  callback: Callable[..., None] | None = None,
  *args: Any,
  ordered: bool = False,
  partitioned: bool = False,
  **kwargs: Any,
) -> Callable[..., None] | None:
  """:func:`callback` with JAX's behaviour in a batched branch: what
  ``hostcb.install(jax_callbacks=True)`` puts in place of
  ``jax.debug.callback``.  In a branch of a ``cond``/``switch`` whose
  index ``vmap`` batches, and in the body of a ``while_loop`` whose
  predicate it batches, it is called for every batch element, as JAX's
  is (:func:`callback` only for the elements that take the branch)."""
  if callback is not None:
    _callback(callback, args, kwargs, ordered, partitioned, False)
    return None
  if args or kwargs:
    raise TypeError(
      "debug_callback received unexpected arguments in the "
      f"two-call form: {args=} {kwargs=}"
    )

  def debug_callback(
    callback: Callable[..., None], *args: Any, **kwargs: Any
  ) -> None:
    _callback(callback, args, kwargs, ordered, partitioned, False)

  return debug_callback


def jax_print(
  fmt: str | None = None,
  *args,
  ordered: bool = False,
  partitioned: bool = False,
  skip_format_check: bool = False,
  _use_logging: bool = False,
  **kwargs,
) -> Callable[..., None] | None:
  """:func:`print` with JAX's behaviour in a batched branch: what
  ``hostcb.install(jax_callbacks=True)`` puts in place of
  ``jax.debug.print`` (see :func:`jax_callback`)."""
  options = (ordered, partitioned, skip_format_check, _use_logging, False)
  if fmt is not None:
    _print(fmt, args, kwargs, *options)
    return None
  if args or kwargs:
    raise TypeError(
      "debug_print received unexpected arguments in the "
      f"two-call form: {args=} {kwargs=}"
    )

  def debug_print(fmt: str, *args, **kwargs) -> None:
    _print(fmt, args, kwargs, *options)

  return debug_print


jax_callback._hostcb_replaces = _JAX_CALLBACK
jax_print._hostcb_replaces = _JAX_PRINT
