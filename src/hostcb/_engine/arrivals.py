"""The one waiting primitive of the engine: a barrier's arrivals."""

from __future__ import annotations

import threading
import time

__all__ = ["Arrivals"]

# A waiter blocks at most this long at a time (see Arrivals.wait).
_WAIT_SLICE_SECONDS = 0.05


class Arrivals:
  """Counts the consumers that reached a barrier's marker; one waiter.

  The waiter blocks on a plain lock that the last arrival releases: a
  Ctrl-C there raises KeyboardInterrupt cleanly (a Condition's wait can be
  interrupted half-way through re-acquiring its lock).  It blocks in slices
  of ``_WAIT_SLICE_SECONDS``: a SIGINT that lands after Python's last check
  for signals but before the lock's wait begins does not interrupt that
  wait, and would otherwise be seen only when the barrier is done.
  """

  def __init__(self, expected: int):
    self._remaining = expected
    self._count_lock = threading.Lock()
    self._done = threading.Lock()
    if expected > 0:
      self._done.acquire()

  def arrive(self) -> None:
    """One consumer reached the marker."""
    with self._count_lock:
      self._remaining -= 1
      if self._remaining == 0:
        self._done.release()

  def wait(self, timeout: float | None) -> bool:
    """True once every consumer arrived; False if ``timeout`` (seconds)
    passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
      left = (
        _WAIT_SLICE_SECONDS
        if deadline is None
        else min(_WAIT_SLICE_SECONDS, deadline - time.monotonic())
      )
      if self._done.acquire(timeout=max(left, 0)):
        self._done.release()
        return True
      if deadline is not None and time.monotonic() >= deadline:
        return False
