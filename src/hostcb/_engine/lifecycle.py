"""The engine at ``fork`` and at interpreter exit.

Fork: the child gets a fresh engine: no queues, no consumers, no recorded
exception, nothing of the parent's to wait for (the parent's threads do
not exist in it); it keeps the registry and XLA's registration.

Exit: legacy ran its barrier at exit once taps had been lowered, so a
script that ends right after dispatching tapping computations still sees
every tap.  hostcb does the same in every mode: once a tap or call was
lowered in this process, the exit handler waits for the dispatched
computations and then for their taps (:func:`.barrier.wait_for_taps`,
bounded by :data:`EXIT_TIMEOUT_SECONDS` for the taps).  A process that
lowers no tap but runs programs lowered elsewhere (``jax.export``,
serialized executables) installs the handler when a device queues its
first record.  ``hostcb.uninstall()``, which removes the handler, first
waits as it would (:func:`wait_before_uninstall`), and then runs the
:data:`before_uninstall` hooks (``hostcb.metrics`` writes its records).

The exit handler only waits and reports: it never ends the process nor
changes its exit status, and the exit handlers that the program
registered before it all run after it.  A failed tap function that no
barrier raised is logged; so is a failed ``jax.debug.callback`` drop-in
that no read and no barrier raised (:mod:`.errors`: a read of its results
or a barrier raises it as JAX's ``JaxRuntimeError``, which, uncaught,
gives the exit status JAX's gives).
"""

from __future__ import annotations

import atexit
import logging
import os

from hostcb import _jax_internals as ji
from hostcb._engine import barrier, errors, native, output_order, pyqueue
from hostcb._engine import host_functions
from hostcb._engine.consumers import is_consumer

__all__ = [
  "note_lowered",
  "lowered",
  "before_uninstall",
  "after_first_record_hooks",
  "wait_before_uninstall",
  "rearm_after_uninstall",
  "EXIT_TIMEOUT_SECONDS",
]

logger = logging.getLogger("hostcb")

EXIT_TIMEOUT_SECONDS = 60.0

_owner_pid = os.getpid()
_lowered = [False]  # a tap or call was lowered in this process
# A device queued a record of a program that this process did not lower
# (exported, serialized, compiled elsewhere): its computations carry no
# mark that the exit handler could wait for, so it waits for the calling
# thread's computations first.
_ran_unlowered = [False]


def note_lowered() -> None:
  """A tap or call was lowered: the exit handler will wait for taps."""
  _lowered[0] = True


def lowered() -> bool:
  """Whether a tap or call was lowered in this process."""
  return _lowered[0]


def _first_record() -> None:
  """A device queues its first record (its consumer starts), or its first
  since ``hostcb.uninstall()`` (:func:`rearm_after_uninstall`); called by
  the device's thread, GIL taken.  Where no exit handler is installed, the
  program was lowered elsewhere (``jax.export``, a serialized executable)
  or before ``uninstall()`` (a compiled object): a process that runs it and
  ends without a barrier would lose its taps.  Installs the handler now,
  which then also waits for the computations of the thread that ends the
  program (they carry no mark of hostcb's that it could wait for)."""
  if _lowered[0] and ji.is_installed("engine: at exit"):
    return
  with ji.patches_lock:  # as ensure(), which may be installing them now
    if ji.is_installed("engine: at exit"):
      return
    _ran_unlowered[0] = True
    _lowered[0] = True
    _install_hooks()
    for hook in list(after_first_record_hooks):
      try:
        hook()
      except Exception:  # the record goes on: logged
        logger.exception("hostcb: %r failed", hook)


def rearm_after_uninstall() -> None:
  """``hostcb.uninstall()`` removed the exit handler: the next record of
  each device installs it again (:func:`_first_record`), in both back
  ends."""
  native.rearm_first_record()
  pyqueue.rearm_first_put()


native.on_first_record.append(_first_record)
pyqueue.on_first_put.append(_first_record)


# Called (no arguments, GIL held) when a device's first record installs
# the exit handler (:func:`_first_record`: after ``hostcb.uninstall()``, a
# program compiled before it): hostcb.metrics installs its own exit
# handler again, after this one, so that it runs first at exit.
after_first_record_hooks: list = []

# Called (no arguments) by wait_before_uninstall, after the wait, in the
# order added: what must be written before hostcb's exit handlers go
# (hostcb.metrics adds its flush when its own exit handler is installed).
before_uninstall: list = []


def wait_before_uninstall() -> None:
  """Waits, as the exit handler would, for the taps of the computations
  dispatched so far (bounded by :data:`EXIT_TIMEOUT_SECONDS`).

  ``hostcb.uninstall()`` calls it before it removes the exit handler and
  hostcb's barrier from ``jax.effects_barrier``: a program that ends right
  after ``uninstall()`` would otherwise lose the taps still queued, and
  prints of the computations it dispatched before would never appear.  A
  tap function's exception stays recorded for the next barrier.  Nothing
  when no tap was lowered in this process, and nothing in a tap function,
  where the wait would wait for that function itself.  Then runs the
  :data:`before_uninstall` hooks (a failing one is logged)."""
  if os.getpid() != _owner_pid or is_consumer():
    return
  if _lowered[0]:
    if _ran_unlowered[0]:
      barrier.wait_for_dispatched()
    if not barrier.wait_for_taps(timeout=EXIT_TIMEOUT_SECONDS):
      logger.error(
        "hostcb: at uninstall(), taps still pending after %s s",
        EXIT_TIMEOUT_SECONDS,
      )
  for hook in list(before_uninstall):
    try:
      hook()
    except Exception:  # the others run, and uninstall() goes on: logged
      logger.exception("hostcb: at uninstall(), %r failed", hook)


def _after_fork_in_child() -> None:
  global _owner_pid
  _owner_pid = os.getpid()
  _lowered[0] = False  # the parent's computations are not the child's
  _ran_unlowered[0] = False
  errors.after_fork_in_child()
  host_functions.after_fork_in_child()
  native.after_fork_in_child()
  pyqueue.after_fork_in_child()
  ji.forget_dispatched_computations()
  output_order.after_fork_in_child()


def _at_exit() -> None:
  """Lets the dispatched computations and their taps finish (the taps
  bounded by EXIT_TIMEOUT_SECONDS; never hangs on a stuck tap function),
  then logs the failures that nothing raised.  Returns: the exit handlers
  registered before it run after it, and the exit status is the
  program's."""
  if os.getpid() != _owner_pid or not _lowered[0]:
    return
  try:
    if _ran_unlowered[0]:
      barrier.wait_for_dispatched()
    if not barrier.wait_for_taps(timeout=EXIT_TIMEOUT_SECONDS):
      logger.error(
        "hostcb: at exit, taps still pending after %s s", EXIT_TIMEOUT_SECONDS
      )
  except Exception:  # the interpreter is going away: log it, go on
    # Raising here would only print an "Exception ignored in atexit"
    # without hostcb's context; the log says what failed, with the trace.
    logger.exception("hostcb: at exit, waiting for the taps failed")
  last, reached_caller, unraised = errors.take_for_exit()
  if last is not None and not reached_caller:
    # (a call's failure was raised to its caller)
    logger.error("hostcb: at exit, a tap function had raised:\n%s", last[1])
  if unraised is not None:
    # Logged when it failed; no read of a result on its device and no
    # barrier came after it, so nothing raised it (errors.py).  The exit
    # status stays the program's: an exit handler cannot change it, and
    # hostcb never ends the process ahead of the program's own handlers.
    logger.error(
      "hostcb: at exit, a jax.debug.callback had failed, and no read of a "
      "result on its device nor any barrier came after it to raise it:\n%s",
      unraised,
    )


_fork_hook = [False]  # registered (Python cannot unregister it)


def _install_hooks() -> None:
  """The exit handler and the fork handler, on the first bind of a hostcb
  primitive (importing hostcb registers neither).  The exit handler is
  recorded in :mod:`hostcb._jax_internals.patches` and ``hostcb.uninstall()``
  removes it; the fork handler, which only resets hostcb's own state in a
  child, stays once registered: Python has no way to remove one."""
  if ji.is_installed("engine: at exit"):
    return
  atexit.register(_at_exit)
  ji.record_patch(
    "engine: at exit",
    "atexit (hostcb._engine.lifecycle._at_exit)",
    lambda: atexit.unregister(_at_exit),
  )
  if hasattr(os, "register_at_fork") and not _fork_hook[0]:
    os.register_at_fork(after_in_child=_after_fork_in_child)
    _fork_hook[0] = True
  native.install_exit_guard()


ji.when_first_needed(_install_hooks)
