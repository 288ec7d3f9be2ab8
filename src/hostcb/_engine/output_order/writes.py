"""A thread's writes after its own prints: ``print``, log records and
``redirect_stdout`` (part of :mod:`hostcb._engine.output_order`, whose
docstring maps the whole).

Under JAX, ``print("result:", f(x))`` shows the lines that ``f``'s
``jax.debug.print`` made, then ``result: ...``: on CPU, JAX runs a
computation with callbacks while its caller waits.  hostcb's prints run
later, on consumer threads (the device never waits for them), so the
thread that dispatched them waits for them where it writes next.

**What a thread waits for** (:func:`wait_for_own_prints`).  A thread with
a note (the outputs of its latest computation that prints, or its latest
runtime token: :func:`hostcb._jax_internals.this_threads_notes`) waits
until that computation has finished (so its prints are queued; the CPU
client runs one thread's computations in dispatch order, so the ones
before it finished too), then until each device's consumer has run the
prints queued so far (those of this thread among them; a consumer runs its
queue in order, so the records queued before them run first), all in at
most :data:`WAIT_SECONDS`, and drops its note.  (The prints of other
threads queued on a device before that look are waited for too: records
carry no thread, and a consumer runs its queue in order.)  A thread that
has no note (it dispatched no computation that prints, or waited for its
latest one already) does not wait at all, whatever other threads have
pending: a slow tap function of another thread never holds up its writes.
Nor does a consumer (it would wait for itself), a thread that Python did
not create (XLA's, running a callback), or a thread running the host
function of an ``io_callback``/``pure_callback`` (its computation waits
for it).

**Where it waits**, once a print has been staged (:func:`install`):
``builtins.print`` (a C function of the native engine where that is
there: with no thread noted it looks at two dict sizes and calls Python's
``print`` with its arguments as given, to any stream, one taken before
included), ``logging.Handler.handle`` (whatever stream the handler took,
and when) and ``contextlib.redirect_stdout``/``redirect_stderr`` (their
common base: entering and leaving waits first, so that ``with
redirect_stdout(buf): f(x)`` leaves ``f``'s lines in ``buf``, as the
prints go to ``sys.stdout`` as it is when they run).

``sys.stdout`` and ``sys.stderr`` themselves are left alone: their type,
protocol and cost stay Python's.  So what reaches a stream by other ways
than these is not ordered after the prints dispatched before it: a direct
``sys.stdout.write(...)`` (or ``.write`` on a stream taken before), a
plain ``sys.stdout = stream`` assignment, and pytest's switching of its
capture (docs/guide.md, "What hostcb changes in a process").  Reading a
result before such a write (``float(y)``, ``y.block_until_ready()``) or a
print (``jax.effects_barrier()``) orders it.

Costs: nothing before a print is staged; then, with no thread noted, a
C-level call in front of ``print`` (within noise:
``benchmarks/bench_output_order.py``) and a Python one in front of each
log record's handler; a thread with a note pays its wait once.
``hostcb.uninstall()`` puts back ``print``, ``Handler.handle`` and
``redirect_stdout``'s methods (they are recorded in
:mod:`hostcb._jax_internals.patches`); the next print staged installs them
again.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import logging
import sys
import threading
import time
from typing import Any, Callable

from hostcb import _jax_internals as ji
from hostcb._native import extension
from hostcb._engine import native, pyqueue
from hostcb._engine.consumers import in_host_function, is_consumer

__all__ = [
  "install",
  "installed",
  "wait_for_own_prints",
  "WAIT_SECONDS",
  "consumer_stdout",
]

logger = logging.getLogger("hostcb")

WAIT_SECONDS = 10.0
"""The longest a write waits for the computations and prints before it."""

_PRINT = "output order (print)"
_state = threading.local()  # .busy: this thread is in wait_for_own_prints
_warned = [False]
_outputs, _tokens = ji.this_threads_notes()
_get_ident = threading.get_ident


def consumer_stdout() -> Any:
  """``sys.stdout`` as a consumer's print finds it now."""
  return sys.stdout


def installed() -> bool:
  """Whether ``print``, log records and ``redirect_stdout`` wait now."""
  return ji.is_installed(_PRINT)


def wait_for_own_prints() -> None:
  """Waits, where the calling thread has a note (module docstring), for
  its latest computation that prints and for the prints queued so far;
  at once otherwise."""
  ident = _get_ident()
  if ident not in _outputs and ident not in _tokens:
    return  # the common case
  if is_consumer() or isinstance(
    threading.current_thread(), threading._DummyThread
  ):
    # A tap function's computation, or XLA's thread: never waits; its
    # outputs are no longer looked at.
    ji.forget_this_threads_print_outputs()
    return
  if (
    in_host_function()
    or native.runs_host_function_call()
    or getattr(_state, "busy", False)
    or sys.is_finalizing()  # (JAX may be gone then)
  ):
    return
  _state.busy = True  # what the waits log is written without waiting
  try:
    _wait()
  finally:
    _state.busy = False


def _wait() -> None:
  deadline = time.monotonic() + WAIT_SECONDS
  ok = ji.wait_for_this_threads_computation(WAIT_SECONDS)
  if ok:  # its prints are queued: now wait for them to run
    for q in list(pyqueue.queues.values()):
      ok = q.wait_for_awaited(max(0.0, deadline - time.monotonic())) and ok
    ok = native.wait_for_awaited_everywhere(deadline) and ok
  else:  # goes on without it; the next write does not wait for it again
    ji.forget_this_threads_print_outputs()
  if not ok and not _warned[0]:
    _warned[0] = True  # once per process: the same cause would repeat it
    logger.warning(
      "hostcb: a write to sys.stdout/sys.stderr (or an assignment of "
      "another stream to them) waited %s s for the "
      "computation before it and hostcb's prints queued by them (a tap "
      "function that does not return?); it goes on without them",
      WAIT_SECONDS,
    )


def _ordered_print(print_: Callable[..., Any]) -> Callable[..., Any]:
  engine = extension()
  make = getattr(engine, "ordered_print", None)
  if make is None:  # no engine, or an older build (reinstalling adds it)
    return _waiting_first(print_)
  return make(print_, _outputs, _tokens, wait_for_own_prints)


def _waiting_first(method: Callable[..., Any]) -> Callable[..., Any]:
  """``method`` (of a class of the standard library), once the calling
  thread's own prints ran."""

  @functools.wraps(method)
  def waiting_first(*args, **kwargs):
    if _outputs or _tokens:
      wait_for_own_prints()
    return method(*args, **kwargs)

  return waiting_first


# The ordered ``print`` where the native engine is absent (the engine's C
# function ``ordered_print`` otherwise).
_python_print = _waiting_first


def install() -> None:
  """Makes ``print``, log records and ``redirect_stdout`` wait for the
  calling thread's own prints (module docstring); recorded in
  :mod:`hostcb._jax_internals.patches`, which ``hostcb.uninstall()``
  undoes.  Cheap once installed."""
  if ji.is_installed(_PRINT):
    return
  with ji.patches_lock:
    if ji.is_installed(_PRINT):
      return
    redirect = getattr(contextlib, "_RedirectStream", None)
    for name in ("__enter__", "__exit__"):
      if redirect is not None and name in vars(redirect):
        ji.install_patch(
          f"output order (redirect_stdout.{name})",
          redirect,
          name,
          _waiting_first(vars(redirect)[name]),
        )
    ji.install_patch(
      "output order (logging)",
      logging.Handler,
      "handle",
      _waiting_first(logging.Handler.handle),
    )
    # Last: is_installed(_PRINT) says all three are in place.
    ji.install_patch(_PRINT, builtins, "print", _ordered_print(builtins.print))
  # This thread is staging the first print, maybe inside the arguments of
  # a print that Python found before the hook: its dispatch waits itself.
  ji.wait_after_next_dispatch(wait_for_own_prints)
