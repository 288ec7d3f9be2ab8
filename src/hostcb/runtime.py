"""``barrier_wait`` and the host queues of taps lowered to Python callbacks.

On CPU, taps go through the native engine (:mod:`hostcb.engine`: C++ ring
buffers, one consumer thread per device).  Where it is not available (GPU,
other platforms, an unbuilt extension, a dtype it cannot carry), a tap
lowers to XLA's Python callback, whose host function puts the work in the
queue of its device here (:class:`_DeviceQueue`); the device goes on at
once and one consumer thread per device calls the tap functions in order.
These queues are bounded by ``jax_host_callback_max_queue_byte_size`` (the
tapped bytes plus a fixed overhead per tap): a device whose queue is full
waits for its consumer, so no tap is ever dropped.

:func:`barrier_wait` covers both: it waits until every tapping computation
that any thread dispatched has finished (:mod:`hostcb.jax_internals` keeps
the latest token of each thread), then puts a marker behind the taps in
every queue, native or not, and waits for the consumers to reach it.  It
waits for what was queued before it, not for an empty queue, so it returns
while other threads keep tapping.

An exception raised by a tap function is logged and remembered
(:func:`hostcb.engine.record_exception`); the consumer goes on with the
next tap, and the next :func:`barrier_wait` raises :class:`CallbackException`
carrying the last such exception.
"""
from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
from typing import Any, Callable

from hostcb import config
from hostcb import engine
from hostcb import jax_internals as ji
from hostcb.engine import record_exception, take_last_exception

ji.set_fast_dispatch(config.read(config.FAST_DISPATCH))

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
  """The FIFO of Python-callback taps of one device, with its consumer."""

  def __init__(self, name: str):
    self._name = name
    self._items: collections.deque[_Item] = collections.deque()
    self._cond = threading.Condition(threading.Lock())
    self._bytes = 0
    self._unfinished = 0        # items queued and not yet run to the end
    self._waiters = 0           # producers waiting for space
    self._consumer_asleep = False  # waiting until a producer wakes it
    self._dispatching = False   # the consumer's tap function dispatched
    self._thread = threading.Thread(target=self._consume, daemon=True,
                                    name=f"hostcb-consumer-{name}")
    self._thread.start()

  def is_consumer(self) -> bool:
    return threading.current_thread() is self._thread

  def calls_wait(self) -> bool:
    """Whether a ``call`` on this device waits for the taps queued before
    it: not on the consumer thread, nor while the consumer runs a tap
    function that dispatched a computation (the call is then part of that
    function)."""
    return not (self._dispatching or self.is_consumer())

  def put(self, run: Callable[[], Any], nbytes: int) -> None:
    """Queues ``run()``; waits while the queue holds too many bytes.

    A tap made by a tap function of this queue (its consumer thread) never
    waits: only that thread frees space.  Nor does any tap while the
    consumer runs a tap function that dispatched a computation (jitted
    code, which may tap here from an XLA thread while the consumer waits
    for it).
    It runs after the taps queued before it, like any other.
    """
    cond = self._cond
    with cond:
      if (self._bytes and self._bytes + nbytes > _max_bytes
          and not self.is_consumer()):
        self._waiters += 1
        try:
          while (self._bytes and self._bytes + nbytes > _max_bytes
                 and not self._dispatching):
            cond.wait()
        finally:
          self._waiters -= 1
      self._items.append((run, nbytes))
      self._bytes += nbytes
      self._unfinished += 1
      if self._consumer_asleep:
        cond.notify_all()

  def set_dispatching(self, dispatching: bool) -> None:
    with self._cond:
      self._dispatching = dispatching
      if dispatching and self._waiters:
        self._cond.notify_all()

  def put_marker(self, arrive: Callable[[], None]) -> bool:
    """Queues ``arrive()`` behind every tap queued so far and wakes the
    consumer (a polling one too: a ``call`` waits for it); never waits.
    False, and nothing queued, when every tap queued so far has run."""
    with self._cond:
      if not self._unfinished:
        return False
      self._items.append((arrive, 0))
      self._unfinished += 1
      self._cond.notify_all()
      return True

  def _consume(self) -> None:
    with ji.running_tap_functions():
      self._consume_forever()

  def _consume_forever(self) -> None:
    _this_thread.queue = self
    cond = self._cond
    items = self._items
    idle_polls = 0
    while True:
      with cond:
        while not items:
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
      pending = 0
      for run, nbytes in batch:
        try:
          run()
        except BaseException as e:  # noqa: BLE001  (reported by barrier_wait)
          record_exception(e)
        if self._dispatching:  # the tap function ran computations
          self.set_dispatching(False)
        pending += nbytes
        if self._waiters:  # a full queue: free bytes now
          with cond:
            self._bytes -= pending
            cond.notify_all()
          pending = 0
      with cond:
        self._bytes -= pending
        self._unfinished -= len(batch)
        if self._waiters:
          cond.notify_all()


class _ThisThread(threading.local):
  queue: _DeviceQueue | None = None  # the queue this consumer thread serves


_this_thread = _ThisThread()


def _dispatch_started() -> None:
  """Called by a thread about to run a computation that taps or calls: if
  it is a consumer thread (a tap function runs jitted code), its queue
  stops making producers, and calls, wait until that tap function returns
  (see ``put`` and ``calls_wait``)."""
  engine.dispatch_started()
  q = _this_thread.queue
  if q is not None and not q._dispatching:
    q.set_dispatching(True)


ji.set_dispatch_hook(_dispatch_started)

_lock = threading.Lock()
_queues: dict[Any, _DeviceQueue] = {}
# The same dict, for the per-call paths that only ask whether it is empty
# (no Python-callback tap was ever queued); it is never replaced.
python_queues = _queues
_max_bytes: int = config.read(config.MAX_QUEUE_BYTE_SIZE)


def set_max_queue_bytes(n: int) -> None:
  """The byte bound of every queue, native and Python."""
  global _max_bytes
  _max_bytes = n
  if engine.loaded():
    engine.set_capacity(max(int(n), 4096))


def queue_for(device: Any) -> _DeviceQueue:
  """The queue of ``device`` (any hashable key), created on first use."""
  q = _queues.get(device)
  if q is None:
    with _lock:
      q = _queues.get(device)
      if q is None:
        q = _queues[device] = _DeviceQueue(str(device))
  return q


def _wait_for_python_queues(queues, timeout: float | None) -> bool:
  arrivals = engine.Arrivals(len(queues))
  for q in queues:
    if not q.put_marker(arrivals.arrive):
      arrivals.arrive()  # nothing left to run there
  return arrivals.wait(timeout)


def drain_device(device: Any, engine_records: bool = True) -> None:
  """Waits until the taps queued so far for ``device`` have run (both
  kinds of queue, or only the Python-callback one if not
  ``engine_records``), unless called by a consumer of that device or while
  it runs a tap function that dispatched a computation: a ``call`` made by
  a tap function runs as part of that function."""
  if _queues:
    q = _queues.get(device)
    if q is not None and q.calls_wait():
      _wait_for_python_queues([q], None)
  # The engine serves CPU devices only; its ordinal of a device is its id.
  if engine_records and getattr(device, "platform", None) == "cpu":
    engine.wait_for_device(device.id)


def _check_not_a_consumer() -> None:
  if (any(q.is_consumer() for q in list(_queues.values()))
      or engine.current_consumer() is not None):
    raise RuntimeError(
        "barrier_wait() was called from a tap function; it would wait for "
        "that function itself. Call it from the thread that runs the "
        "computation.")


def _barrier(timeout: float | None = None) -> bool:
  """Waits until every tap of the computations dispatched so far has run."""
  _check_not_a_consumer()
  ji.wait_for_dispatched_computations()
  if ji.fast_dispatch_used():
    # Executables without runtime tokens: this thread's computations.
    ji.drain_this_thread()
  done = True
  if engine.has_consumers():
    done = engine.barrier(timeout=timeout)
  queues = list(_queues.values())
  if queues:
    done = _wait_for_python_queues(queues, timeout) and done
  return done


def barrier_wait(logging_name: str | None = None, *,
                 all_processes: bool = False) -> None:
  """Blocks until every tap of the computations started so far has run.

  Waits for the tapping computations that any thread of this process
  dispatched before the call to finish, then for every tap function they
  queued to return; taps queued later (other threads keep tapping) are not
  waited for.  If a tap function raised since the previous barrier, raises
  :class:`CallbackException` with the last such exception (the
  computations themselves went on).  Safe to call from several threads at
  once.  Not from a tap function, which it would wait for.

  Args:
    logging_name: a name to show in the log messages of this barrier.
    all_processes: in a multi-process JAX program
      (``jax.distributed.initialize``), also wait until every process has
      reached its own ``barrier_wait(all_processes=True)``.
  """
  name = logging_name or ""
  logger.debug("hostcb: barrier_wait(%s) starts", name)
  _barrier()
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
  """Processes every pending tap (a barrier that does not raise).

  Legacy stopped its receiver threads here and started them again on the
  next tap.  hostcb's consumer threads sleep while there is nothing to do,
  so they are left running: a tap of a computation that runs afterwards
  is never left without a consumer.  Exceptions of tap functions stay
  recorded for the next :func:`barrier_wait`.
  """
  _barrier()


# ------------------------------------------------------------- exit, fork
_owner_pid = os.getpid()


def _after_fork_in_child() -> None:
  """A forked child starts with no queues, no consumers and nothing to
  wait for (the parent's threads do not exist in it)."""
  global _lock, _owner_pid
  _lock = threading.Lock()
  _queues.clear()
  _owner_pid = os.getpid()
  ji.forget_dispatched_computations()


def _at_exit() -> None:
  """Lets the consumers finish what was queued; bounded, never hangs."""
  if os.getpid() != _owner_pid:
    return
  if not _queues and not engine.has_consumers():
    return  # this process never tapped
  try:
    if not _barrier(timeout=60.0):
      logger.error("hostcb: at exit, taps still pending after 60 s")
  except Exception:  # noqa: BLE001  (the interpreter is going away)
    pass
  last = take_last_exception()
  if last is not None:
    logger.error("hostcb: at exit, a tap function had raised:\n%s", last[1])


if hasattr(os, "register_at_fork"):
  os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
