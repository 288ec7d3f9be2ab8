"""The Python-callback back end: what the native rings cannot serve.

Where the native engine is not used (GPU and other platforms, an unbuilt
extension, a dtype it cannot carry, a tap placed on one device of a
multi-device ``jit``), a tap lowers to XLA's Python callback, whose host
function puts the work in the queue of its device here
(:class:`DeviceQueue`); the device goes on at once and one consumer thread
per device, started with the queue at the device's first tap, calls the
tap functions in order.  These queues are bounded by
``jax_host_callback_max_queue_byte_size`` (the tapped bytes plus a fixed
overhead per tap): a device whose queue is full waits for its consumer,
so no tap is ever dropped.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable

from hostcb._native import shared_constant
from hostcb._engine import errors
from hostcb._engine.consumers import this_thread
from hostcb._engine.arrivals import Arrivals

__all__ = [
  "DeviceQueue",
  "queue_for",
  "queues",
  "drain",
  "put_markers",
  "on_first_put",
  "rearm_first_put",
]

# A tap waiting for its consumer: the function to run and its bytes.
_Item = tuple[Callable[[], Any], int]

# After its last tap a consumer polls its queue every _POLL_SECONDS for
# _IDLE_POLLS times, then sleeps until a producer wakes it.  Polling lets a
# busy device queue taps without waking the consumer thread for each one.
_POLL_SECONDS = 0.001
_IDLE_POLLS = 50

# Called (no arguments) by the first put of the process, and by the first
# after rearm_first_put (``hostcb.uninstall()``), as the native engine
# calls its own on a device's first record: set by
# hostcb._engine.lifecycle, which installs the exit handler again there.
on_first_put: list = []
_first_put = [True]


def rearm_first_put() -> None:
  """The next put runs :data:`on_first_put` again."""
  _first_put[0] = True


def _run_first_put_hooks() -> None:
  _first_put[0] = False
  for hook in list(on_first_put):
    try:
      hook()
    except Exception:  # the tap is queued all the same (logged)
      logging.getLogger("hostcb").exception(
        "hostcb: a hook on the first tap of the Python back end failed"
      )


# Set from hostcb.config by hostcb._engine at import (set_max_bytes).
_max_bytes = shared_constant("DEFAULT_QUEUE_BYTES")


def set_max_bytes(n: int) -> None:
  """The byte bound of every queue."""
  global _max_bytes
  _max_bytes = int(n)


class DeviceQueue:
  """The FIFO of Python-callback taps of one device, with its consumer."""

  def __init__(self, name: str):
    self._name = name
    self._items: collections.deque[_Item] = collections.deque()
    self._cond = threading.Condition(threading.Lock())
    self._bytes = 0
    self._waiters = 0  # producers waiting for space
    self._consumer_asleep = False  # waiting until a producer wakes it
    self._queued = 0  # items ever queued (markers too)
    self._done = 0  # items ever run to the end (the difference
    # is what is queued and not yet run)
    self._last_awaited = 0  # _queued just after the latest print tap
    self._awaited_waiters = 0  # host reads waiting for prints
    self.dispatching = False  # the consumer's tap function dispatched
    self._thread = threading.Thread(
      target=self._consume, daemon=True, name=f"hostcb-consumer-{name}"
    )
    self._thread.start()

  def is_consumer(self) -> bool:
    return threading.current_thread() is self._thread

  def calls_wait(self) -> bool:
    """Whether a ``call`` on this device waits for the taps queued before
    it: not on the consumer thread, nor while the consumer runs a tap
    function that dispatched a computation (the call is then part of that
    function)."""
    return not (self.dispatching or self.is_consumer())

  def put(
    self, run: Callable[[], Any], nbytes: int, prints: bool = False
  ) -> None:
    """Queues ``run()`` (a print tap if ``prints``); waits while the queue
    holds too many bytes.

    A tap made by this queue's own consumer never waits (only that thread
    frees space), nor does any tap while the consumer runs a tap function
    that dispatched a computation (which may tap here from an XLA thread
    while the consumer waits for it).
    """
    if _first_put[0]:
      _run_first_put_hooks()
    cond = self._cond
    with cond:
      if (
        self._bytes
        and self._bytes + nbytes > _max_bytes
        and not self.is_consumer()
      ):
        self._waiters += 1
        try:
          while (
            self._bytes
            and self._bytes + nbytes > _max_bytes
            and not self.dispatching
          ):
            cond.wait()
        finally:
          self._waiters -= 1
      self._items.append((run, nbytes))
      self._bytes += nbytes
      self._queued += 1
      if prints:
        self._last_awaited = self._queued
      if self._consumer_asleep:
        cond.notify_all()

  def set_dispatching(self, dispatching: bool) -> None:
    with self._cond:
      self.dispatching = dispatching
      if dispatching and self._waiters:
        self._cond.notify_all()

  def put_marker(self, arrive: Callable[[], None]) -> bool:
    """Queues ``arrive()`` behind every tap queued so far and wakes the
    consumer; never waits.  False, and nothing queued, when every tap
    queued so far has run."""
    with self._cond:
      if self._done == self._queued:  # nothing queued is left to run
        return False
      self._items.append((arrive, 0))
      self._queued += 1
      self._cond.notify_all()
      return True

  def wait_for_awaited(self, timeout: float | None = None) -> bool:
    """Waits until the consumer has run every item up to the latest print
    tap queued so far; at once where a ``call`` would not wait
    (:meth:`calls_wait`).  False if ``timeout`` seconds passed first."""
    if not self.calls_wait():
      return True
    with self._cond:
      target = self._last_awaited
      if self._done >= target:
        return True
      self._awaited_waiters += 1
      try:
        return self._cond.wait_for(
          lambda: self._done >= target or self.dispatching, timeout
        )
      finally:
        self._awaited_waiters -= 1

  def _consume(self) -> None:
    from hostcb import _jax_internals as ji  # noqa: PLC0415

    this_thread.queue = self
    with ji.running_tap_functions():
      self._consume_forever()

  def _consume_forever(self) -> None:
    cond = self._cond
    items = self._items
    idle_polls = 0
    while True:
      with cond:
        while not items:
          if idle_polls < _IDLE_POLLS:
            idle_polls += 1
            cond.wait(_POLL_SECONDS)
          else:
            self._consumer_asleep = True
            cond.wait()
            self._consumer_asleep = False
        idle_polls = 0
        batch = list(items)
        items.clear()
      pending = 0
      for run, nbytes in batch:
        try:
          run()
        except BaseException as e:  # noqa: BLE001  (reported by barrier_wait)
          errors.record_exception(e)
        if self.dispatching:  # the tap function ran computations
          self.set_dispatching(False)
        pending += nbytes
        if self._waiters:  # a full queue: free bytes now
          with cond:
            self._bytes -= pending
            cond.notify_all()
          pending = 0
      with cond:
        self._bytes -= pending
        self._done += len(batch)
        if self._waiters or self._awaited_waiters:
          cond.notify_all()
      # Holds nothing of the batch while it waits for the next: a tap's
      # function (and what it captured) goes with its executable.
      del batch, run


_lock = threading.Lock()
# device -> its queue.  The per-call paths only ask whether it is empty (no
# Python-callback tap was ever queued); it is never replaced.
queues: dict[Any, DeviceQueue] = {}


def queue_for(device: Any) -> DeviceQueue:
  """The queue of ``device`` (any hashable key), created (with its
  consumer) on first use."""
  q = queues.get(device)
  if q is None:
    with _lock:
      q = queues.get(device)
      if q is None:
        q = queues[device] = DeviceQueue(str(device))
  return q


def dispatch_started() -> None:
  """As :func:`hostcb._engine.native.dispatch_started`, for this back end's
  consumers (its queue's producers and calls stop waiting until the tap
  function returns)."""
  q = this_thread.queue
  if q is not None and not q.dispatching:
    q.set_dispatching(True)


def put_markers(arrivals_for) -> Arrivals | None:
  """Puts a marker behind the taps queued so far in every queue; returns
  the arrivals to wait for (None: no queue).  Not from a consumer, which
  would wait for itself (:func:`.barrier.wait_for_taps` refuses those)."""
  qs = list(queues.values())
  if not qs:
    return None
  arrivals = arrivals_for(len(qs))
  for q in qs:
    if not q.put_marker(arrivals.arrive):
      arrivals.arrive()  # nothing left to run there
  return arrivals


def drain(device: Any) -> None:
  """Waits until the taps queued so far for ``device`` have run, unless
  called by its consumer or while it runs a tap function that dispatched a
  computation (a ``call`` made by a tap function runs as part of it)."""
  q = queues.get(device)
  if q is not None and q.calls_wait():
    arrivals = Arrivals(1)
    if not q.put_marker(arrivals.arrive):
      return
    arrivals.wait(None)


def after_fork_in_child() -> None:
  """A forked child starts with no queues and no consumers."""
  global _lock
  _lock = threading.Lock()
  queues.clear()
  this_thread.queue = None
