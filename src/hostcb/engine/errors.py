"""Exceptions of tap and call functions, kept for the next barrier.

A tap function's exception cannot reach the code that tapped (that code
went on long ago); legacy logged it and made the next ``barrier_wait``
raise :class:`CallbackException` with the last one.  Both back ends of the
engine record here, and so does a failing ``call`` (which also fails its
computation).
"""

from __future__ import annotations

import logging
import threading
import traceback

__all__ = [
  "CallbackException",
  "record_exception",
  "take_last_exception",
  "note_jax_callback_failure",
  "take_jax_callback_failure",
  "take_for_exit",
]

logger = logging.getLogger("hostcb")


class CallbackException(Exception):
  """A tap function raised since the previous :func:`barrier_wait`.

  Raised by :func:`barrier_wait`; the message holds the text and traceback
  of the last exception raised by a tap function, which is also chained as
  ``__cause__``.
  """


_lock = threading.Lock()
_last: tuple[BaseException, str] | None = None
# Whether the last recorded exception failed a computation, so that its
# caller got it already.
_last_reached_caller = False
_jax_callback_failed = False  # see note_jax_callback_failure


def note_jax_callback_failure() -> None:
  """A staged callback of JAX's API failed, was logged, and is raised
  nowhere (docs/jax_callbacks.md, "When a callback fails"): unless a
  barrier waits for it before the program ends, the process exits with
  status 1, as a JAX program does whose callback failed after its last
  ``effects_barrier`` (:func:`take_for_exit`)."""
  global _jax_callback_failed
  _jax_callback_failed = True


def take_jax_callback_failure() -> bool:
  """Whether :func:`note_jax_callback_failure` was called since the last
  time this was asked; a barrier that waited for the failed callback asks
  (the program went past it, as past JAX's ``effects_barrier``, and exits
  with status 0)."""
  global _jax_callback_failed
  failed, _jax_callback_failed = _jax_callback_failed, False
  return failed


def record_exception(
  e: BaseException,
  what: str = "a tap function raised an exception",
  *,
  reaches_caller: bool = False,
) -> None:
  """Logs ``e`` and keeps it for the next barrier (``barrier_wait``).

  ``reaches_caller``: ``e`` also fails the computation (a ``call``), so
  the caller sees it; the exit handler does not report it again.
  """
  global _last, _last_reached_caller
  text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
  if not _logged_closed_pipe(e):
    logger.error("hostcb: %s:\n%s", what, text)
  with _lock:
    _last = (e, text)
    _last_reached_caller = reaches_caller


_closed_pipe = [False]  # a BrokenPipeError was logged (_logged_closed_pipe)


def _logged_closed_pipe(e: BaseException) -> bool:
  """Whether ``e`` is a closed pipe (``prog.py | head``) after one was
  logged already: every print queued after the first that failed fails
  the same way, where the program (legacy's and JAX's) stopped at the
  first; it is recorded, not logged again."""
  if not isinstance(e, BrokenPipeError):
    return False
  logged, _closed_pipe[0] = _closed_pipe[0], True
  return logged


def take_last_exception() -> tuple[BaseException, str] | None:
  """The last recorded exception since the previous call (and its
  formatted traceback), or None; clears it."""
  return take_for_exit()[0]


def take_for_exit() -> tuple[tuple[BaseException, str] | None, bool, bool]:
  """:func:`take_last_exception`, with whether that exception reached its
  caller and whether a JAX-API callback failed since the last barrier (see
  :func:`note_jax_callback_failure`)."""
  global _last
  with _lock:
    last, _last = _last, None
    return (
      last,
      _last_reached_caller,
      _jax_callback_failed,
    )


def after_fork_in_child() -> None:
  """A forked child starts with nothing recorded and a fresh lock."""
  global _lock, _last, _jax_callback_failed
  _lock = threading.Lock()
  _last = None
  _jax_callback_failed = False
