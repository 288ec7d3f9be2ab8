"""What the program writes comes after the prints it dispatched before.

Under JAX, ``print("result:", f(x))`` shows the lines that ``f``'s
``jax.debug.print`` made, then ``result: ...``: on CPU, JAX runs a
computation with callbacks while the caller waits.  hostcb's prints run
later, on consumer threads (the device never waits for them), and
:mod:`.read_waits` makes host *reads* of results wait for them; but
``print`` writes its label before it reads the array, so the label came
first.  This module keeps JAX's order for everything the program writes
to ``sys.stdout`` and ``sys.stderr``:

* once a print has been staged (:func:`install`, called by
  :func:`hostcb.engine.awaited_tap_staged`), ``sys.stdout`` and ``sys.stderr``
  are wrapped in :class:`OrderedStream`; so is every stream assigned to
  them later (pytest's capture, ``contextlib.redirect_stdout``, a plain
  ``sys.stdout = f``), since ``sys``'s module class gets two data
  descriptors that wrap what is assigned;
* before a write, and before ``sys.stdout``/``sys.stderr`` is assigned
  another stream (so that ``with contextlib.redirect_stdout(buf): f(x)``
  leaves ``f``'s lines in ``buf``), the thread (not a consumer, which
  would wait for itself) first waits until the latest computation that
  prints (``id_print``, ``hostcb.debug.print``; not ``debug.callback``,
  whose functions need not print) and that it dispatched has finished (so its prints are queued:
  each dispatch of such an executable notes one of its outputs, on jit's
  fast path too, or keeps JAX's runtime token where it returns nothing;
  see :mod:`hostcb.jax_internals.dispatch`), then until the consumers have
  run every print queued so far (and so the taps queued before them), all
  in at most :data:`WAIT_SECONDS`;
* a thread that Python did not create (XLA's, running a callback) does not
  wait; nor does a callback's host function that runs in the dispatching
  thread, since its own computation's token is not yet the thread's.

Costs: nothing before a print is staged; then, per write, a look at the
thread's latest output or token and at each consumer's queue (well under
a microsecond where nothing is pending; a consumer's own write, two
thread-local lookups); a function that prints and returns an array
stays on jit's fast path, with one call per dispatch (noting an output;
a C function of the native engine where it is there); one that returns
nothing dispatches through JAX's Python path (tens of microseconds,
where JAX's own prints cost more).  The device never waits.  :func:`uninstall` (called by
:func:`hostcb.uninstall`) puts ``sys``'s class and the streams back; the
next print staged installs it again.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import types
from typing import Any

from hostcb import jax_internals as ji
from hostcb.engine import native, pyqueue
from hostcb.engine.consumers import this_thread as _this_thread

__all__ = [
  "install",
  "uninstall",
  "installed",
  "OrderedStream",
  "WAIT_SECONDS",
  "ordered_sys_class",
  "consumer_stdout",
]

logger = logging.getLogger("hostcb")

WAIT_SECONDS = 10.0
"""The longest a write waits for the computations and prints before it."""

_NAMES = ("stdout", "stderr")
_lock = threading.Lock()
_installed = [False]
_state = threading.local()  # .busy: this thread is in _before_write
_warned = [False]


class OrderedStream:
  """A text stream whose writes first wait for the prints of the
  computations dispatched before them (module docstring); everything else
  is the wrapped stream's."""

  def __init__(self, stream: Any):
    object.__setattr__(self, "_hostcb_stream", stream)

  def write(self, text):
    # A consumer's write never waits: the look at the queues in
    # _before_write would give up the GIL while its own print is pending.
    # (consumers.is_consumer, inlined: no call for a consumer's print.)
    t = _this_thread
    if t.ordinal is None and t.queue is None:
      _before_write()
    return self._hostcb_stream.write(text)

  def writelines(self, lines):
    t = _this_thread
    if t.ordinal is None and t.queue is None:  # (as write)
      _before_write()
    return self._hostcb_stream.writelines(lines)

  def __getattr__(self, name: str):
    return getattr(self._hostcb_stream, name)

  def __setattr__(self, name: str, value) -> None:
    # Kept on the wrapper, which is what sys.stdout is now: a library that
    # patches `sys.stdout.write` with a function calling the `write` it
    # found (W&B's console capture does) gets this one, which writes to
    # the wrapped stream.  Set on the wrapped stream, its function would
    # call itself through this wrapper without end.
    object.__setattr__(self, name, value)

  def __iter__(self):
    return iter(self._hostcb_stream)

  def __repr__(self) -> str:
    return repr(self._hostcb_stream)


def _wrap(stream: Any) -> Any:
  if stream is None or isinstance(stream, OrderedStream):
    return stream
  return OrderedStream(stream)


def _unwrap(stream: Any) -> Any:
  if isinstance(stream, OrderedStream):
    if len(vars(stream)) > 1:
      # Another library patched the wrapper itself (its `write`): left in
      # place, where it only passes writes on once uninstalled.
      return stream
    return stream._hostcb_stream
  return stream


class _Wrapping:
  """``sys.stdout``/``sys.stderr`` on ``sys``'s module class: what is
  assigned is stored wrapped, in the module's dict, where ``print`` reads
  it."""

  def __init__(self, name: str):
    self.name = name

  def __get__(self, module, owner=None):
    if module is None:
      return self
    try:
      return module.__dict__[self.name]
    except KeyError:
      raise AttributeError(
        f"module 'sys' has no attribute {self.name!r}"
      ) from None

  def __set__(self, module, value) -> None:
    # The prints dispatched before go to the stream being replaced, where
    # JAX's computation, which printed while its caller waited, wrote
    # them: `with redirect_stdout(buf): f(x)` gets f's lines in buf.  (A
    # consumer does not wait, as in OrderedStream.write.)
    t = _this_thread
    if t.ordinal is None and t.queue is None:
      _before_write()
    module.__dict__[self.name] = _wrap(value)

  def __delete__(self, module) -> None:
    del module.__dict__[self.name]


class _SysModule(types.ModuleType):
  """``sys``'s class while installed."""

  stdout = _Wrapping("stdout")
  stderr = _Wrapping("stderr")


ordered_sys_class = _SysModule
"""``sys``'s class while installed: ``sys.stdout`` and ``sys.stderr`` are
then what ``sys.__dict__`` holds under their names (a consumer's print
reads them there, without the descriptor's Python frame)."""


_sys_dict = sys.__dict__


def consumer_stdout() -> Any:
  """``sys.stdout`` as a consumer's print finds it: read without the frames
  of this module's class of ``sys`` (whose module dict holds what its
  descriptor returns) and of :class:`OrderedStream` (a consumer's write
  never waits), unless a library patched the wrapper itself."""
  stream = _sys_dict.get("stdout") if type(sys) is _SysModule else None
  if stream is None:  # another class of sys, or no stream
    stream = sys.stdout
  if type(stream) is OrderedStream:
    attrs = stream.__dict__
    if len(attrs) == 1:
      stream = attrs["_hostcb_stream"]
  return stream


def installed() -> bool:
  """Whether writes to ``sys.stdout``/``sys.stderr`` wait now."""
  return _installed[0]


def install() -> None:
  """Wraps ``sys.stdout`` and ``sys.stderr``, and what is assigned to them
  from now on (module docstring).  Cheap once installed."""
  if _installed[0]:
    return
  with _lock:
    if _installed[0]:
      return
    if type(sys) is not types.ModuleType:
      # Another tool changed sys's class: wrap the streams as they are now
      # (a later assignment is then not wrapped), without touching it.
      logger.warning(
        "hostcb: sys's class is %r (another tool's): streams "
        "assigned to sys.stdout/sys.stderr from now on do not "
        "wait for hostcb's prints",
        type(sys),
      )
    else:
      sys.__class__ = _SysModule
    for name in _NAMES:
      sys.__dict__[name] = _wrap(sys.__dict__.get(name))
    _installed[0] = True
    # Listed by `hostcb info`; hostcb.uninstall() undoes it with the rest.
    ji.record_patch("output order", "sys.stdout, sys.stderr", uninstall)


def uninstall() -> None:
  """Undoes :func:`install`: ``sys``'s class and unwrapped streams."""
  with _lock:
    if not _installed[0]:
      return
    if type(sys) is _SysModule:
      sys.__class__ = types.ModuleType
    for name in _NAMES:
      sys.__dict__[name] = _unwrap(sys.__dict__.get(name))
    _installed[0] = False


def _before_write() -> None:
  """Before a write of a thread that is no consumer (OrderedStream)."""
  if not _installed[0] or sys.is_finalizing():  # (JAX may be gone then)
    return
  if (
    ji.wait_for_this_threads_computation(0.0)  # (never waits)
    and not pyqueue.queues
    and native.awaited_run_everywhere()
  ):
    return  # nothing pending (the common case): no clock, no state
  state = _state
  waits = getattr(state, "waits", None)
  if waits is None:  # XLA's threads (running a callback) keep no order
    waits = state.waits = not isinstance(
      threading.current_thread(), threading._DummyThread
    )
  if not waits or getattr(state, "busy", False):
    return
  state.busy = True  # what the waits log is written without waiting
  try:
    _wait_for_earlier_awaited()
  finally:
    state.busy = False


def _wait_for_earlier_awaited() -> None:
  deadline = time.monotonic() + WAIT_SECONDS
  ok = ji.wait_for_this_threads_computation(WAIT_SECONDS)
  for q in list(pyqueue.queues.values()):
    ok = q.wait_for_awaited(max(0.0, deadline - time.monotonic())) and ok
  ok = native.wait_for_awaited_everywhere(deadline) and ok
  if not ok and not _warned[0]:
    _warned[0] = True  # once per process: the same cause would repeat it
    logger.warning(
      "hostcb: a write to sys.stdout/sys.stderr (or an assignment of "
      "another stream to them) waited %s s for the "
      "computation before it and hostcb's prints queued by them (a tap "
      "function that does not return?); it goes on without them",
      WAIT_SECONDS,
    )
