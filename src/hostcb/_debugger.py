"""``hostcb.debug.breakpoint`` and ``hostcb.debug.breakpoint_if``: a text
debugger that stops a compiled program, on hostcb's ``call``.

Where :func:`breakpoint` is traced, it takes the Python stack as it is then
(the frames above it, JAX's own left out as JAX's filter leaves them out)
and each frame's locals.  The locals that are traced values of the
computation being staged become the operands of one synchronous host call
(hostcb's ``call`` primitive: the device waits until the session ends);
the others stay on the host as they are.  On the host, each stop rebuilds
the frames with the values the device computed and runs the session: the
``(jdb)`` prompt and the commands of JAX's ``cli`` debugger, printed as it
prints them.

What differs from ``jax.debug.breakpoint``, each for a reason:

* a traced value of another computation (a local of a function outside
  the ``jit`` being traced, traced by ``eval_shape`` or another ``jit``)
  is not captured: it shows as ``<traced outside this computation: ...>``.
  JAX captures it into the ``jit``'s cached trace, which leaks it;
* under ``vmap`` the stops are made by hostcb's batching rule, one per
  batch element, in JAX's order, without slicing a key (JAX's slices
  trip its key-reuse checker);
* a PRNG key goes to the host as its key data and is shown as the key
  again (JAX shows its ``uint32`` data);
* the device waits for every stop (under ``pmap``/sharded code too);
* ``breakpoint_if(pred)`` stops only where ``pred`` holds, per element
  under ``vmap``; where it holds for no element, the program pays a
  ``lax.cond`` on ``pred``, no host call.

The locals go to the host through ``stop_gradient``: a stop changes
neither the values the program computes nor its derivatives.
"""

from __future__ import annotations

import cmd
import collections.abc
import dataclasses
import inspect
import os
import pprint
import sys
import threading
import traceback
from typing import Any

import jax
import numpy as np

from hostcb import _jax_internals as ji
from hostcb._core.primitives import CallTarget, call_p
from hostcb._core.callback_types import is_key

__all__ = ["breakpoint", "breakpoint_if"]

_HOSTCB_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# One session at a time: stops of several devices (XLA's threads) queue.
_session_lock = threading.Lock()


# ------------------------------------------------------------ the frames
class _Shown:
  """A local shown as a fixed text (``p name`` prints it)."""

  def __init__(self, text: str):
    self.text = text

  def __repr__(self) -> str:
    return self.text


_CANT_FLATTEN = _Shown("<cant_flatten>")


@dataclasses.dataclass(frozen=True)
class Frame:
  """One Python frame of a stop: where it is, its source and its locals
  (``offset`` indexes ``source`` at ``lineno``; None without source)."""

  filename: str
  lineno: int
  source: tuple
  offset: int | None
  locals: dict


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class _Place:
  """A frame as traced: ``locals`` is ``((name, treedef, leaves), ...)``,
  each leaf ``("value", v)``, ``("operand", i, key_impl)`` or
  ``("shown", _Shown)``."""

  filename: str
  lineno: int
  source: tuple
  offset: int | None
  locals: tuple

  def __repr__(self) -> str:
    return f"{self.filename}:{self.lineno}"

  def frame(self, operands: list) -> Frame:
    """The frame with the values of one stop."""
    values = {}
    for name, treedef, leaves in self.locals:
      flat = [_leaf_value(leaf, operands) for leaf in leaves]
      values[name] = jax.tree_util.tree_unflatten(treedef, flat)
    return Frame(self.filename, self.lineno, self.source, self.offset, values)


def _leaf_value(leaf: tuple, operands: list):
  if leaf[0] != "operand":
    return leaf[1]
  _, i, impl = leaf
  value = ji.cpu_array(np.array(operands[i]))  # a copy the session owns
  if impl is not None:
    value = jax.random.wrap_key_data(value, impl=impl)
  return value


def _source(frame) -> tuple[tuple, int | None]:
  """``(lines, offset)`` of the source around ``frame`` (its function's,
  or the whole module's), as ``inspect`` finds it; ``((), None)`` where
  there is none."""
  try:
    lines, start = inspect.getsourcelines(frame)
  except (OSError, TypeError):
    return (), None
  source = tuple("".join(lines).split("\n"))
  offset = frame.f_lineno - max(start, 1)
  if offset >= len(source):  # e.g. code made by exec
    return (), None
  return source, offset


def _stack(depth: int, filter_frames: bool, num_frames: int | None) -> list:
  """The frames above the caller ``depth`` levels up, innermost first."""
  frame = sys._getframe(depth + 1)
  frames = []
  while frame is not None:
    if not filter_frames or (
      ji.include_frame(frame)
      and not frame.f_code.co_filename.startswith(_HOSTCB_DIR)
    ):
      frames.append(frame)
    frame = frame.f_back
  return frames if num_frames is None else frames[:num_frames]


class _Operands:
  """The traced leaves a stop sends to the host, each once."""

  def __init__(self):
    self.values: list = []
    self._index: dict[int, int] = {}

  def leaf(self, value, kind: str) -> tuple:
    if kind == "value":
      return ("value", value)
    if kind == "outside":
      aval = getattr(value, "aval", None)
      text = aval.str_short() if aval is not None else type(value).__name__
      return ("shown", _Shown(f"<traced outside this computation: {text}>"))
    impl = jax.random.key_impl(value) if is_key(value) else None
    i = self._index.get(id(value))
    if i is None:
      i = self._index[id(value)] = len(self.values)
      data = jax.random.key_data(value) if impl is not None else value
      self.values.append(jax.lax.stop_gradient(data))
    return ("operand", i, impl)


def _is_iterator(value) -> bool:
  # Kept as they are (JAX warns of flattening an iterator as a leaf).
  return isinstance(value, collections.abc.Iterator)


def _places(frames: list) -> tuple[tuple, list]:
  """The frames as :class:`_Place` s, and the traced values they hold."""
  operands = _Operands()
  places = []
  for frame in frames:
    local_list = []
    for name, value in list(frame.f_locals.items()):
      try:
        leaves, treedef = jax.tree_util.tree_flatten(value, _is_iterator)
      except Exception:  # noqa: BLE001  (shown as JAX shows it)
        leaves, treedef = jax.tree_util.tree_flatten(_CANT_FLATTEN)
      kinds = ji.tracer_kinds(leaves)
      built = tuple(operands.leaf(v, k) for v, k in zip(leaves, kinds))
      local_list.append((name, treedef, built))
    source, offset = _source(frame)
    places.append(
      _Place(
        frame.f_code.co_filename,
        frame.f_lineno,
        source,
        offset,
        tuple(local_list),
      )
    )
  return tuple(places), operands.values


# ----------------------------------------------------------- the session
class CliDebugger(cmd.Cmd):
  """The ``(jdb)`` session over the frames of one stop: JAX's ``cli``
  debugger's prompt, commands and printed text."""

  prompt = "(jdb) "

  def __init__(self, frames, stdin=None, stdout=None, completekey="tab"):
    super().__init__(completekey=completekey, stdin=stdin, stdout=stdout)
    self.use_rawinput = stdin is None
    self.frames = frames
    self.frame_index = 0
    self.intro = "Entering jdb:"

  def _say(self, text: str) -> None:
    print(text, file=self.stdout)

  def _evaluate(self, expression: str):
    return eval(expression, {}, dict(self.frames[self.frame_index].locals))

  def _show(self, expression: str, form) -> None:
    try:
      self._say(form(self._evaluate(expression)))
    except:  # noqa: E722  (any error, SystemExit too, is reported)
      kind, error = sys.exc_info()[:2]
      text = traceback.format_exception_only(kind, error)[-1].strip()
      self._say(f"*** {text}")

  def default(self, line):
    """Prints the value of a Python expression over the frame's locals."""
    self._show(line, repr)

  def _context(self, num_lines: int = 2) -> None:
    frame = self.frames[self.frame_index]
    lines = [f"> {frame.filename}({frame.lineno})"]
    if frame.offset is not None:
      low, high = frame.offset - 1 - num_lines, frame.offset + num_lines
      for i, line in enumerate(frame.source):
        if low <= i <= high:
          lines.append(("->  " if i == frame.offset else "    ") + line)
    self._say("\n".join(lines))

  def do_p(self, arg):
    """p expression
    Print the value of the expression."""
    self._show(arg, repr)

  def do_pp(self, arg):
    """pp expression
    Pretty-print the value of the expression."""
    self._show(arg, pprint.pformat)

  def do_up(self, arg):
    """u(p)
    Go one frame up (towards the caller) and show where it is."""
    if self.frame_index == len(self.frames) - 1:
      self._say("At topmost frame.")
    else:
      self.frame_index += 1
    self._context()

  do_u = do_up

  def do_down(self, arg):
    """d(own)
    Go one frame down (towards the breakpoint) and show where it is."""
    if self.frame_index == 0:
      self._say("At bottommost frame.")
    else:
      self.frame_index -= 1
    self._context()

  do_d = do_down

  def do_list(self, arg):
    """l(ist)
    Show the source around the current line of the frame."""
    self._context(num_lines=5)

  do_l = do_list

  def do_where(self, arg):
    """w(here)
    Print the stack, the innermost frame last ('bt' does the same)."""
    lines = ["Traceback:"]
    for frame in reversed(self.frames):
      lines.append(f'  File "{frame.filename}", line {frame.lineno}')
      if frame.offset is None:
        lines.append("    <no source>")
      else:
        lines.append("    " + frame.source[frame.offset].strip())
    self._say("\n".join(lines))

  do_w = do_bt = do_where

  def do_continue(self, arg):
    """c(ont(inue))
    End the session: the program goes on."""
    return True

  do_c = do_cont = do_continue

  def do_quit(self, arg):
    """q(uit) or exit
    End the session and the program: the computation fails."""
    sys.exit(0)

  do_q = do_EOF = do_exit = do_quit

  def run(self) -> None:
    while True:
      try:
        self.cmdloop()
        return
      except KeyboardInterrupt:
        print("--KeyboardInterrupt--", file=sys.stdout)


def _session(places: tuple, operands: list, options: dict) -> None:
  frames = [place.frame(operands) for place in places]
  with _session_lock:
    CliDebugger(frames, **options).run()


# --------------------------------------------------------- the host call
@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class _Stops:
  """The host function of a staged breakpoint.

  Its operands are ``(pred, *values)``.  ``levels[i]`` says at which
  ``vmap`` levels operand ``i`` is batched (outermost first; its leading
  axes are those levels'); ``sizes`` are the levels' sizes.  It stops
  once per batch element where ``pred`` holds, in JAX's order of a
  batched debug callback (the innermost level's index varies slowest).
  """

  places: tuple
  options: tuple
  conditional: bool
  levels: tuple
  sizes: tuple = ()

  def __repr__(self) -> str:  # in jaxprs: where it stops
    kind = "breakpoint_if" if self.conditional else "breakpoint"
    where = self.places[0] if self.places else "?"
    return f"{kind}({where}, sizes={self.sizes})"

  def __call__(self, arrays) -> tuple:
    options = dict(self.options)
    for reversed_index in np.ndindex(*self.sizes[::-1]):
      index = reversed_index[::-1]
      element = [
        a[tuple(i for i, batched in zip(index, lv) if batched)]
        for a, lv in zip(arrays, self.levels)
      ]
      if bool(element[0]):
        _session(self.places, element[1:], options)
    return ()


def _target(stops: _Stops) -> CallTarget:
  n = len(stops.levels)
  return CallTarget(
    stops,
    jax.tree_util.tree_structure((0,) * n),
    jax.tree_util.tree_structure(()),
    (),
    False,
    _RULES,
  )


def _bind(operands: list, stops: _Stops) -> None:
  call_p.bind(*operands, target=_target(stops), device_index=0, effectful=True)


@dataclasses.dataclass(frozen=True)
class _Rules:
  """The transformation rules of a breakpoint's call (see
  :class:`~hostcb._core.primitives.CallTarget`): its operands come
  through ``stop_gradient``, so no JVP or transpose reaches it; under
  ``vmap`` it stays one call, which stops per element."""

  effects = ()

  def jvp(self):
    raise ValueError("hostcb.debug.breakpoint: its operands have no tangents.")

  def transpose(self):
    raise ValueError("hostcb.debug.breakpoint cannot be transposed.")

  def batch(self, target, args, dims, *, device_index, effectful):
    del device_index, effectful
    stops = target.func
    dims = [None if d is ji.not_mapped else d for d in dims]
    (size,) = {a.shape[d] for a, d in zip(args, dims) if d is not None}
    moved = [
      a if d is None else jax.numpy.moveaxis(a, d, 0)
      for a, d in zip(args, dims)
    ]
    batched = dataclasses.replace(
      stops,
      levels=tuple((d is not None, *lv) for d, lv in zip(dims, stops.levels)),
      sizes=(size, *stops.sizes),
    )
    if stops.conditional:
      # Where pred holds for no element, no host call: a cond on it.
      jax.lax.cond(
        jax.numpy.any(moved[0]),
        lambda ops: _bind(ops, batched),
        lambda ops: None,
        moved,
      )
    else:
      _bind(moved, batched)
    return [], []


_RULES = _Rules()


# ---------------------------------------------------------- the functions
def _stop(pred, conditional, depth, token, options) -> Any:
  """Stops at the caller ``depth`` frames up where ``pred`` holds (see
  :func:`breakpoint`); returns ``token``."""
  filter_frames = options.pop("filter_frames")
  num_frames = options.pop("num_frames")
  frames = _stack(depth + 1, filter_frames, num_frames)
  places, values = _places(frames)
  del frames
  if token is not None:  # the stop waits for the token's values
    leaves = jax.tree_util.tree_leaves(token)
    for leaf, kind in zip(leaves, ji.tracer_kinds(leaves)):
      if kind == "here":
        values.append(jax.lax.stop_gradient(leaf))
  if not values and not ji.is_staging():
    # Nothing traced: the session runs now, in this thread.
    if bool(pred):
      _session(places, [], options)
    return token
  stops = _Stops(
    places, tuple(options.items()), conditional, ((),) * (len(values) + 1)
  )
  operands = [jax.numpy.asarray(pred, dtype=bool), *values]
  if conditional:
    jax.lax.cond(
      operands[0],
      lambda ops: _bind(ops, stops),
      lambda ops: None,
      operands,
    )
  else:
    _bind(operands, stops)
  return token


def breakpoint(
  *,
  backend: str | None = None,
  filter_frames: bool = True,
  num_frames: int | None = None,
  ordered: bool = False,
  token=None,
  **kwargs,
):
  """Stops the program here and opens a ``(jdb)`` debugger session.

  Takes what ``jax.debug.breakpoint`` takes, and its ``cli`` session
  prints what JAX's prints: ``p``/``pp`` an expression over the frame's
  locals (any other line is evaluated too), ``u``/``d`` to move between
  frames, ``l`` for the source, ``w`` for the stack, ``c`` to go on, ``q``
  to end the program (the computation fails), ``help``.

  Under ``jit`` the device waits until the session ends.  Under ``vmap``
  it stops once per batch element, showing that element's values.  A
  stop changes nothing that the program computes.

  Args:
    backend: accepted for JAX's signature; hostcb's debugger is the text
      (``cli``) one whatever is named.
    filter_frames: leave out JAX's own frames (and hostcb's), as JAX does.
    num_frames: how many frames, from this one up, the session shows.
    ordered: accepted for JAX's signature; hostcb's stops are ordered
      with hostcb's other callbacks of a device anyway.
    token: a pytree of arrays, returned unchanged; the stop comes after
      its values are computed.
    **kwargs: for the session: ``stdin``, ``stdout``, ``completekey``
      (``cmd.Cmd``'s).

  Returns:
    ``token``.
  """
  del backend
  if token is not None and ordered:
    raise ValueError("`ordered` and `token` are mutually exclusive arguments.")
  options = dict(kwargs, filter_frames=filter_frames, num_frames=num_frames)
  return _stop(True, False, 1, token, options)


def breakpoint_if(
  pred,
  *,
  backend: str | None = None,
  filter_frames: bool = True,
  num_frames: int | None = None,
  **kwargs,
) -> None:
  """:func:`breakpoint`, where the scalar boolean ``pred`` holds.

  Under ``vmap`` it stops for the batch elements where ``pred`` holds,
  each with its own values; where it holds for none, the program does
  not leave the device (a ``lax.cond`` on ``pred``).  To stop where a
  NaN first appears: ``breakpoint_if(~jnp.isfinite(x).all())``.
  """
  del backend
  shape = np.shape(pred)
  if shape != ():
    raise ValueError(
      f"breakpoint_if: pred must be a scalar boolean, got shape {shape}"
    )
  options = dict(kwargs, filter_frames=filter_frames, num_frames=num_frames)
  _stop(pred, True, 1, None, options)
