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

__all__ = ["CallbackException", "record_exception", "take_last_exception"]

logger = logging.getLogger("hostcb")


class CallbackException(Exception):
  """A tap function raised since the previous :func:`barrier_wait`.

  Raised by :func:`barrier_wait`; the message holds the text and traceback
  of the last exception raised by a tap function, which is also chained as
  ``__cause__``.
  """


_lock = threading.Lock()
_last: tuple[BaseException, str] | None = None


def record_exception(e: BaseException,
                     what: str = "a tap function raised an exception") -> None:
  """Logs ``e`` and keeps it for the next barrier (``barrier_wait``)."""
  global _last
  text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
  logger.error("hostcb: %s:\n%s", what, text)
  with _lock:
    _last = (e, text)


def take_last_exception() -> tuple[BaseException, str] | None:
  """The last recorded exception since the previous call (and its
  formatted traceback), or None; clears it."""
  global _last
  with _lock:
    last, _last = _last, None
  return last


def after_fork_in_child() -> None:
  """A forked child starts with nothing recorded and a fresh lock."""
  global _lock, _last
  _lock = threading.Lock()
  _last = None
