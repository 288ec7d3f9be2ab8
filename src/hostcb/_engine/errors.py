"""Exceptions of tap and call functions, and failures of JAX's callbacks.

A tap function's exception cannot reach the code that tapped (that code
went on long ago); legacy logged it and made the next ``barrier_wait``
raise :class:`CallbackException` with the last one.  Both back ends of the
engine record here, and so does a failing ``call`` (which also fails its
computation).

A drop-in for JAX's ``jax.debug.callback`` (``hostcb.debug.callback`` and
``hostcb.debug.print`` under ``jit``) fails as JAX's does: JAX fails the
computation that ran it, whose call or first read of its results raises
``jax.errors.JaxRuntimeError``.  hostcb's device does not wait for the
callback, so the computation has returned when it fails: the failure is
kept here, per consumer (:func:`note_jax_callback_failure`), and raised
with JAX's words by the first host read of a result on that device that
waits for it (:mod:`.output_order.reads`) or by the first barrier
(:func:`raise_jax_callback_failure`), once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import threading
import traceback
from typing import Any, Iterable, Iterator

from hostcb._engine.consumers import this_thread

__all__ = [
  "CallbackException",
  "record_exception",
  "take_last_exception",
  "note_jax_callback_failure",
  "jax_callback_failed",
  "consumer_keys",
  "held",
  "held_here",
  "raise_jax_callback_failure",
  "take_jax_callback_failure",
  "take_for_exit",
  "JAX_FAILURE_WORDS",
]

logger = logging.getLogger("hostcb")


class CallbackException(Exception):
  """A tap function raised since the previous :func:`barrier_wait`.

  Raised by :func:`barrier_wait`; the message holds the text and traceback
  of the last exception raised by a tap function, which is also chained as
  ``__cause__``.
  """


# What JAX 0.10.2's failed computation says when its callback raised (its
# CPU client's words), before the callback's traceback.
JAX_FAILURE_WORDS = "INTERNAL: CpuCallback error calling callback: "

_lock = threading.Lock()
_last: tuple[BaseException, str] | None = None
# Whether the last recorded exception failed a computation, so that its
# caller got it already.
_last_reached_caller = False


@dataclasses.dataclass
class _Unraised:
  """The first failure of a JAX-API callback on one consumer since the
  last time one was raised there, and how many failed after it."""

  order: int
  text: str
  more: int = 0


# Consumer key (see _consumer_key) -> its failure not raised yet.
_unraised: dict[Any, _Unraised] = {}
_order = itertools.count()


def _consumer_key() -> Any:
  """Where the calling consumer thread takes its records from: the native
  engine's device ordinal, or the Python-callback queue; None elsewhere."""
  t = this_thread
  if t.ordinal is not None:
    return ("native", t.ordinal)
  return t.queue


def consumer_keys(ordinal: int | None, queue: Any) -> tuple:
  """The keys of :func:`note_jax_callback_failure` for a device with this
  native ordinal and this Python-callback queue (either None)."""
  return (
    *(() if ordinal is None else (("native", ordinal),)),
    *(() if queue is None else (queue,)),
    None,
  )


def _jax_text(e: BaseException) -> str:
  """JAX's message for a computation whose callback raised ``e``: its
  words, then the callback's traceback as JAX gives it (the frames without
  their lines of code)."""
  frames = "".join(
    f'  File "{f.filename}", line {f.lineno}, in {f.name}\n'
    for f in traceback.extract_tb(e.__traceback__)
  )
  only = "".join(traceback.format_exception_only(type(e), e)).rstrip("\n")
  return (
    f"{JAX_FAILURE_WORDS}Traceback (most recent call last):\n{frames}{only}"
  )


def note_jax_callback_failure(e: BaseException) -> None:
  """A staged callback of JAX's API raised ``e`` (logged by its caller) on
  this consumer thread: the next host read of a result on its device, or
  the next barrier, raises it (module docstring).  Only its text is
  kept, not ``e``, whose frames would keep what they hold alive."""
  key = _consumer_key()  # (one consumer per key: no other thread adds it)
  with _lock:
    kept = _unraised.get(key)
    if kept is not None:
      kept.more += 1
      return
  text = _jax_text(e)
  with _lock:
    _unraised[key] = _Unraised(next(_order), text)


class _HeldHere(threading.local):
  depth = 0  # > 0 while hostcb waits in this thread (see held)


_held_here = _HeldHere()


@contextlib.contextmanager
def held() -> Iterator[None]:
  """While hostcb itself waits for computations in this thread (a
  barrier, the exit handler): its reads of their arrays are no read of the
  program's and raise no failure (the barrier raises it after)."""
  _held_here.depth += 1
  try:
    yield
  finally:
    _held_here.depth -= 1


def held_here() -> bool:
  """Whether this thread is inside :func:`held`."""
  return _held_here.depth > 0


def jax_callback_failed() -> bool:
  """Whether a JAX-API callback failed and was not raised yet (no lock:
  a read's cheap test before it looks any further)."""
  return bool(_unraised)


def _take(keys: Iterable | None) -> list[_Unraised]:
  with _lock:
    if keys is None:
      found = list(_unraised.values())
      _unraised.clear()
    else:
      found = [_unraised.pop(k) for k in set(keys) if k in _unraised]
  return sorted(found, key=lambda u: u.order)


def _as_jax_raises(found: list[_Unraised], where: str) -> BaseException:
  import jax  # noqa: PLC0415  (public API; loaded once a callback ran)

  first = found[0]
  more = first.more + sum(1 + u.more for u in found[1:])
  detail = (
    f"\n\nhostcb: raised {where} after the callback failed (hostcb's "
    "device does not wait for jax.debug.callback: the computation that "
    "ran it returned first)"
  )
  if more:
    detail += f"; {more} more callback(s) failed after it, each logged"
  return jax.errors.JaxRuntimeError(first.text + detail)


def raise_jax_callback_failure(keys: Iterable | None, where: str) -> None:
  """Raises, as JAX's ``JaxRuntimeError`` with JAX's words, the first
  failure of a JAX-API callback not raised yet on these consumers
  (:func:`consumer_keys`; None: on any), and forgets theirs; ``where``
  says at what, in hostcb's words after JAX's."""
  found = _take(keys)
  if found:
    raise _as_jax_raises(found, where)


def take_jax_callback_failure(where: str) -> BaseException | None:
  """The failure that :func:`raise_jax_callback_failure` would raise for
  every consumer (None if none), forgotten."""
  found = _take(None)
  return _as_jax_raises(found, where) if found else None


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
  global _last
  with _lock:
    last, _last = _last, None
  return last


def take_for_exit() -> tuple[
  tuple[BaseException, str] | None, bool, str | None
]:
  """:func:`take_last_exception`, with whether that exception reached its
  caller, and the text of the first JAX-API callback failure that nothing
  raised (None if none), forgotten."""
  global _last
  with _lock:
    last, _last = _last, None
    reached = _last_reached_caller
  found = _take(None)
  return last, reached, found[0].text if found else None


def after_fork_in_child() -> None:
  """A forked child starts with nothing recorded and a fresh lock."""
  global _lock, _last
  _lock = threading.Lock()
  _last = None
  _unraised.clear()
