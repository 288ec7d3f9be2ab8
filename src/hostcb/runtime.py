"""The host side of taps: per-device queues, consumer threads and the barrier.

A tap that runs on a device copies its operands to the host (XLA does that
before calling us) and puts them in the queue of its device; the device goes
on at once.  One consumer thread per device takes the taps out in order and
calls the tap functions.  The queues are bounded in bytes
(``jax_host_callback_max_queue_byte_size``): a device whose queue is full
waits for its consumer, so memory stays bounded and no tap is ever dropped.

An exception raised by a tap function is logged and remembered; the consumer
goes on with the next tap, and the next :func:`barrier_wait` raises
:class:`CallbackException` carrying the last such exception.
"""
from __future__ import annotations

import atexit
import collections
import logging
import threading
import traceback
from typing import Any, Callable

import jax
import numpy as np

from hostcb import config
from hostcb import jax_internals as ji

__all__ = ["CallbackException", "barrier_wait", "stop_outfeed_receiver"]

logger = logging.getLogger("hostcb")


class CallbackException(Exception):
  """A tap function raised since the previous :func:`barrier_wait`.

  Raised by :func:`barrier_wait`; the message holds the text and traceback
  of the last exception raised by a tap function, which is also chained as
  ``__cause__``.
  """


# A tap waiting for its consumer: the function to run and its bytes.
_Item = tuple[Callable[[], Any], int]

# After its last tap a consumer polls its queue every _POLL_SECONDS for
# _IDLE_POLLS times, then sleeps until a producer wakes it.  Polling lets a
# busy device queue taps without waking the consumer thread for each one.
_POLL_SECONDS = 0.001
_IDLE_POLLS = 50


class _DeviceQueue:
  """The FIFO of taps of one device, with its consumer thread."""

  def __init__(self, name: str):
    self._name = name
    self._items: collections.deque[_Item] = collections.deque()
    self._cond = threading.Condition(threading.Lock())
    self._bytes = 0
    self._busy = False          # the consumer is running a tap function
    self._waiters = 0           # producers or barriers waiting on _cond
    self._consumer_asleep = False  # waiting until a producer wakes it
    self._stopping = False
    self._thread = threading.Thread(target=self._consume, daemon=True,
                                    name=f"hostcb-consumer-{name}")
    self._thread.start()

  def put(self, run: Callable[[], Any], nbytes: int) -> None:
    """Queues ``run()``; waits while the queue holds too many bytes."""
    cond = self._cond
    with cond:
      if self._bytes and self._bytes + nbytes > _max_bytes:
        if threading.current_thread() is self._thread:
          # A tap function that taps again: waiting would wait on itself.
          run()
          return
        self._waiters += 1
        try:
          while self._bytes and self._bytes + nbytes > _max_bytes:
            cond.wait()
        finally:
          self._waiters -= 1
      self._items.append((run, nbytes))
      self._bytes += nbytes
      if self._consumer_asleep:
        cond.notify_all()

  def _consume(self) -> None:
    cond = self._cond
    items = self._items
    idle_polls = 0
    while True:
      with cond:
        while not items:
          if self._stopping:
            return
          if idle_polls < _IDLE_POLLS:
            # Recently busy: poll, so that producers need not wake us for
            # every tap and taps are taken out in batches.
            idle_polls += 1
            cond.wait(_POLL_SECONDS)
          else:
            self._consumer_asleep = True
            cond.wait()
            self._consumer_asleep = False
        idle_polls = 0
        batch = list(items)
        items.clear()
        self._busy = True
      pending = 0
      for run, nbytes in batch:
        try:
          run()
        except BaseException as e:  # noqa: BLE001  (reported by barrier_wait)
          record_exception(e)
        pending += nbytes
        if self._waiters:  # a full queue or a barrier: free bytes now
          with cond:
            self._bytes -= pending
            cond.notify_all()
          pending = 0
      with cond:
        self._bytes -= pending
        self._busy = False
        if self._waiters:
          cond.notify_all()

  def check_not_consumer(self) -> None:
    """Raises if called from this queue's consumer, which would deadlock."""
    if threading.current_thread() is self._thread:
      raise RuntimeError(
          "barrier_wait() was called from a tap function; it would wait for "
          "itself. Call it from the thread that runs the computation.")

  def drain(self) -> None:
    """Returns once every tap queued so far has been processed."""
    self.check_not_consumer()
    with self._cond:
      self._waiters += 1
      try:
        while self._items or self._busy:
          self._cond.wait()
      finally:
        self._waiters -= 1

  def stop(self) -> None:
    with self._cond:
      self._stopping = True
      self._cond.notify_all()
    self._thread.join()


_lock = threading.Lock()
_queues: dict[Any, _DeviceQueue] = {}
_max_bytes: int = config.read(config.MAX_QUEUE_BYTE_SIZE)
_last_exception: tuple[BaseException, str] | None = None
_atexit_registered = False


def set_max_queue_bytes(n: int) -> None:
  global _max_bytes
  _max_bytes = n


def queue_for(device: Any) -> _DeviceQueue:
  """The queue of ``device`` (any hashable key), created on first use."""
  q = _queues.get(device)
  if q is None:
    with _lock:
      q = _queues.get(device)
      if q is None:
        _register_atexit()
        q = _queues[device] = _DeviceQueue(str(device))
  return q


def drain_device(device: Any) -> None:
  """Waits until the taps queued so far for ``device`` have run."""
  q = _queues.get(device)
  if q is not None and (q._items or q._busy):
    q.drain()


def record_exception(e: BaseException,
                     what: str = "a tap function raised an exception") -> None:
  """Logs ``e`` and keeps it for the next :func:`barrier_wait`."""
  global _last_exception
  text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
  logger.error("hostcb: %s:\n%s", what, text)
  with _lock:
    _last_exception = (e, text)


def take_last_exception() -> tuple[BaseException, str] | None:
  global _last_exception
  with _lock:
    last, _last_exception = _last_exception, None
  return last


class _BarrierArrivals:
  """Counts the barrier taps that reached their consumers."""

  def __init__(self, expected: int):
    self._remaining = expected
    self._cond = threading.Condition()

  def arrive(self) -> None:
    with self._cond:
      self._remaining -= 1
      self._cond.notify_all()

  def wait(self) -> None:
    with self._cond:
      while self._remaining > 0:
        self._cond.wait()


_barriers: dict[int, _BarrierArrivals] = {}
_barrier_ids = iter(range(1, 2**31))
_barrier_tap_jit = None


def _barrier_arrived(barrier_id, transforms) -> None:
  _barriers[int(barrier_id)].arrive()


def _wait_for_dispatched_taps() -> None:
  """Waits until the taps of every computation dispatched so far have run.

  First the computations of this thread are waited for (JAX's runtime
  tokens).  Then a tiny computation taps on every local device: a device
  that runs its computations in dispatch order (GPUs; the CPU runs
  concurrent computations of several threads side by side) queues that tap
  behind the taps of every computation started before, by any thread.
  """
  global _barrier_tap_jit
  for q in list(_queues.values()):
    q.check_not_consumer()
  ji.wait_for_this_threads_computations()
  if _barrier_tap_jit is None:
    from hostcb.host_callback import id_tap
    _barrier_tap_jit = jax.jit(lambda i: id_tap(_barrier_arrived, i))
  devices = jax.local_devices()
  with _lock:
    barrier_id = next(_barrier_ids)
    arrivals = _barriers[barrier_id] = _BarrierArrivals(len(devices))
  try:
    for device in devices:
      _barrier_tap_jit(jax.device_put(np.int32(barrier_id), device))
    arrivals.wait()
  finally:
    with _lock:
      del _barriers[barrier_id]
  for q in list(_queues.values()):  # queues of no device (e.g. TPU paths)
    q.drain()


def barrier_wait(logging_name: str | None = None, *,
                 all_processes: bool = False) -> None:
  """Blocks until every tap of the computations started so far has run.

  Waits for the computations already dispatched on this process's devices
  to finish, then for every tap function they queued to return.  If a tap
  function raised since the previous barrier, raises
  :class:`CallbackException` with the last such exception (the
  computations themselves went on).  Safe to call from several threads at
  once, and while other threads run tapped computations.

  Args:
    logging_name: a name to show in the log messages of this barrier.
    all_processes: in a multi-process JAX program
      (``jax.distributed.initialize``), also wait until every process has
      reached its own ``barrier_wait(all_processes=True)``.
  """
  name = logging_name or ""
  logger.debug("hostcb: barrier_wait(%s) starts", name)
  _wait_for_dispatched_taps()
  if all_processes:
    from hostcb import distributed
    distributed.wait_for_all_processes(name)
  logger.debug("hostcb: barrier_wait(%s) done", name)
  last = take_last_exception()
  if last is not None:
    exc, text = last
    raise CallbackException(
        "There were exceptions during callback processing. "
        f"Last one was:\n{text}") from exc


def stop_outfeed_receiver() -> None:
  """Processes every pending tap, then stops the consumer threads.

  They start again on the next tap.  Exceptions of tap functions stay
  recorded for the next :func:`barrier_wait`.
  """
  _wait_for_dispatched_taps()
  with _lock:
    queues = list(_queues.values())
    _queues.clear()
  for q in queues:
    q.drain()
    q.stop()


def _at_exit() -> None:
  try:
    barrier_wait("at_exit")
  except CallbackException as e:
    logger.error("hostcb: at exit, %s", e)
  except Exception:  # noqa: BLE001  (the interpreter is going away)
    pass


def _register_atexit() -> None:
  global _atexit_registered
  if not _atexit_registered:
    _atexit_registered = True
    atexit.register(_at_exit)
