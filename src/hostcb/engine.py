"""The native tap engine: the host side of taps and calls in one place.

A tap lowered through this engine is one XLA custom call,
``hostcb_tap`` (:data:`ffi_target_name`), whose ``target_id`` attribute
names a Python function in this module's registry (:func:`target_id`).
Its C++ handler (``src/hostcb/_native/handlers.cc``) copies the operands'
bytes, with a small header, into the ring buffer of the device it runs on,
without the GIL, and returns.  The compiled executable holds no Python
callback, so lowering only has to emit custom calls (``hostcb.lowering``).

A ``call`` lowered through this engine is the custom call ``hostcb_call``
(:data:`call_target_name`, ``src/hostcb/_native/call.cc``), or
``hostcb_call_one`` (:data:`call_one_target_name`) when its result is one
array: its handler runs on the device thread, waits for the taps queued
before the call on its device, takes the GIL, copies the operands into
fresh read-only NumPy arrays and calls the runner registered for the call
(:func:`call_target_id`) as ``run(arrays, device_ordinal)``; it copies the
returned arrays into the call's results.  ``hostcb_call_one`` takes the
host function's result as it is and checks it in C++ (an exact NumPy array
of the result's dtype and shape is copied at once); anything else goes to
the call's ``check``, which converts it or raises legacy's error.  An
exception fails the computation with :func:`_call_failure_text`.  A call
does not go through the consumer thread: it waits for its results anyway,
and a call made by jitted code that a tap function runs must not wait for
the consumer that runs that tap function.

On the host, one consumer thread per device takes the records out in
batches (the GIL held once per batch, released while waiting), builds one
NumPy array per operand (the one copy: the arrays belong to Python and may
be kept) and calls the registered tap functions in the order the device
queued them, from C++ (``run_batch`` in ``src/hostcb/_native/module.cc``):
a registered entry ``(func, transforms)`` as ``func(array, transforms)``
(a tap function of one array that takes no device: no Python frame of
ours per tap), any other as ``entry(arrays, device)`` (``arrays`` a tuple
of NumPy arrays, ``device`` the ``jax.Device``).  Barrier markers, a tap
function's exception and the end of a tap function that dispatched
computations come back to Python through three hooks
(:func:`_marker_arrived`, :func:`_tap_failed`, :func:`dispatch_finished`).

Guarantees (see ``queue.h`` for the native invariants):

* Nothing is dropped: a device whose queue is full waits (the bound is in
  bytes, ``JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE``, 256 MB by default, per
  device, counting each record's operands and its 56-byte descriptor, so
  that taps of tiny or no operands are bounded too; a record larger than
  the queue goes through alone).  Memory held: the ring and descriptors
  plus at most one batch being handed out, within 2x the bound.
* Per device, records come out in the order their handlers queued them,
  which within one device program is program order; a call runs after every
  record queued before it on its device.
* :func:`barrier` puts a marker in each device's queue and waits until
  every consumer reached its marker: it waits for what was queued before
  it, not for an empty queue, so it returns while other threads keep
  tapping.  An exception raised by a tap function is logged and recorded;
  :func:`take_last_exception` hands the last one to the barrier's caller.
* A tap made by a tap function never deadlocks on a full queue: a tap
  whose handler runs on the consumer thread itself never waits for space,
  and while a consumer thread runs a tap function that dispatched a
  computation (the dispatch hook of :mod:`hostcb.jax_internals`, set by
  :mod:`hostcb.runtime`) the producers of its queue do not wait either,
  since that computation may run on an XLA thread while the consumer waits
  for it.  The bound is then exceeded by those taps only.  Calls made
  meanwhile do not wait for the consumer either (they belong to that tap
  function).
* ``fork``: the child gets a fresh engine (no queues, no consumers, no
  recorded exception, the same registry); nothing of the parent's is
  waited for, so a child that never taps exits normally.

Device identification: the handlers read the FFI execution context's
device ordinal, which XLA's CPU client sets to the JAX device id (0..N-1
with ``--xla_force_host_platform_device_count=N`` in one process; the ids
of the process's own devices in a multi-process program), in ``jit``,
``pmap`` and ``shard_map`` code alike; :func:`device_of_ordinal` maps it to
a ``jax.Device``.

If the extension is not built or cannot be loaded, :func:`available` is
False and :func:`unavailable_reason` says why in one line; hostcb then
lowers to XLA's Python callbacks.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import traceback
from typing import Any, Callable, Iterable

import numpy as np

__all__ = ["available", "unavailable_reason", "ffi_target_name",
           "call_target_name", "call_one_target_name", "noop_target_name",
           "register_targets", "call_target_id",
           "ensure_started", "barrier",
           "take_last_exception", "record_exception", "supports",
           "target_id", "wait_for_device", "set_capacity", "counters",
           "device_of_ordinal", "has_consumers", "current_consumer"]

logger = logging.getLogger("hostcb")

ffi_target_name = "hostcb_tap"
call_target_name = "hostcb_call"
call_one_target_name = "hostcb_call_one"
noop_target_name = "hostcb_noop"

# Records handed out per batch, at most.  Small batches keep the queue's
# lock held briefly by the consumer, so the device seldom waits for it:
# 256 instead of 4096 took id_tap's device time per scan step from 0.86
# to 0.53 us (2-core machine; 128 and 512 measured the same as 256).
_MAX_BATCH = 256
# After its last batch a consumer polls for this long (timed waits that
# producers need not signal) before sleeping until a producer wakes it.
_POLL_SECONDS = 0.05

# ------------------------------------------------------------------ loading
_native: Any = None
_reason: str | None = None


def _load() -> None:
  global _native, _reason
  if os.environ.get("HOSTCB_DISABLE_NATIVE", "").strip() not in ("", "0"):
    _reason = "disabled by HOSTCB_DISABLE_NATIVE"
    return
  try:
    from hostcb._native import _engine  # noqa: PLC0415
  except ImportError as e:
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    _reason = (f"the native extension hostcb._native._engine is not "
               f"available ({first})")
    return
  _native = _engine


_load()


def available() -> bool:
  """True if the native engine is built, loadable, and XLA accepts its
  handlers (registering them on first use)."""
  if _native is None:
    return False
  if not _registered:
    try:
      register_targets()
    except Exception as e:  # noqa: BLE001  (e.g. built for another jaxlib)
      _disable(f"XLA refused its FFI handlers ({str(e).splitlines()[0]}); "
               "reinstall hostcb to build it for the installed jaxlib")
      return False
  return True


def loaded() -> bool:
  """True if the extension is imported (without asking XLA anything)."""
  return _native is not None


def _disable(reason: str) -> None:
  global _native, _reason
  _native, _reason = None, reason
  logger.warning("hostcb: the native tap engine is not used: %s; taps use "
                 "XLA's Python callbacks", reason)


def unavailable_reason() -> str | None:
  """One line saying why the engine is not available, or None."""
  return _reason


def _require() -> Any:
  if _native is None:
    raise RuntimeError(f"hostcb native tap engine: {_reason}")
  return _native


# ------------------------------------------------------- XLA FFI targets
# XLA_FFI_DataType codes (xla/ffi/api/c_api.h) of the dtypes taps may
# carry, by NumPy/ml_dtypes name.  Sub-byte types are refused by the
# handlers.
_DTYPE_CODES = {
    "bool": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint8": 6,
    "uint16": 7, "uint32": 8, "uint64": 9, "float16": 10, "float32": 11,
    "float64": 12, "complex64": 15, "bfloat16": 16, "complex128": 18,
    "float8_e5m2": 19, "float8_e4m3fn": 20, "float8_e4m3b11fnuz": 23,
    "float8_e5m2fnuz": 24, "float8_e4m3fnuz": 25, "float8_e4m3": 28,
    "float8_e3m4": 29, "float8_e8m0fnu": 33,
}

_registered = False
_register_lock = threading.Lock()


def _dtype_table() -> dict[int, np.dtype]:
  try:
    import ml_dtypes  # noqa: PLC0415  (a dependency of jax)
  except ImportError:
    ml_dtypes = None
  table = {}
  for name, code in _DTYPE_CODES.items():
    if hasattr(np, name) and name != "bool":
      table[code] = np.dtype(name)
    elif name == "bool":
      table[code] = np.dtype(np.bool_)
    elif ml_dtypes is not None and hasattr(ml_dtypes, name):
      table[code] = np.dtype(getattr(ml_dtypes, name))
  return table


def register_targets() -> None:
  """Registers the FFI targets with XLA (CPU), once per process."""
  global _registered
  if _registered:
    return
  native = _require()
  with _register_lock:
    if _registered:
      return
    import jax  # noqa: PLC0415
    # With the CPU client running, XLA checks each handler now (a handler
    # built for another jaxlib raises here) instead of failing the
    # client's start later.
    jax.local_devices(backend="cpu")
    native.set_dtypes(_dtype_table())
    native.set_call_server(_call_runners, _check_call, _call_failure_text)
    for name, capsule in native.handlers().items():
      jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    from hostcb import config  # noqa: PLC0415
    native.set_capacity(int(config.read(config.MAX_QUEUE_BYTE_SIZE)))
    _registered = True


# ------------------------------------------------------------ registry
# Target ids index three tables, which the native engine reads directly
# (no Python int is built per tap or call to look one up).  Ids come from
# one sequence and one key table shared by taps and calls, so each table
# has None where the other kind has its ids.  Entries are kept alive for
# the life of the process: a compiled executable may run again at any time.
#
# Taps: id -> entry.  An entry ``(func, second)`` is called as
# ``func(arrays[0], second)`` (a tap function of one array, without the
# device: no Python frame of ours per tap), any other entry as
# ``entry(arrays, device)``.
_functions: list[Any] = [None]
# Calls: id -> run(arrays, device_ordinal), and id -> check(result) (see
# call_target_id and _check_call).
_call_runners: list[Callable[[tuple, int], Any] | None] = [None]
_call_checks: list[Callable[[Any], tuple] | None] = [None]
_ids: dict[Any, int] = {}  # key -> target id
_next_id = itertools.count(1)
_registry_lock = threading.Lock()


def _assign_id(key: Any, install: Callable[[int], None]) -> int:
  """The target id of ``key``; a new one is passed to ``install`` first."""
  register_targets()
  ensure_started()
  tid = _ids.get(key)
  if tid is None:
    with _registry_lock:
      tid = _ids.get(key)
      if tid is None:
        tid = next(_next_id)
        install(tid)
        _ids[key] = tid
  return tid


def _put(table: list, tid: int, value: Any) -> None:
  """``table[tid] = value``, the table grown with None as needed."""
  if len(table) <= tid:
    table.extend([None] * (tid + 1 - len(table)))
  table[tid] = value


def target_id(key: Any, make: Callable[[], Any]) -> int:
  """The target id of the tap entry that ``make()`` builds (see
  ``_functions``), one per ``key``.

  The lowering calls this for every tap it emits; the same key (a tap
  function with its tree structure and transforms) gets the same id, so
  recompiling a function does not grow the registry.
  """
  return _assign_id(key, lambda tid: _put(_functions, tid, make()))


def call_target_id(key: Any, make: Callable[[], tuple[Callable, Callable]]
                   ) -> int:
  """The target id of a call, one per ``key``, as :func:`target_id`.

  ``make()`` returns ``(run, check)``: ``run(arrays, device_ordinal)``
  calls the host function and returns its flat, checked results (or, for a
  call lowered to ``hostcb_call_one``, the host function's result as it
  is); ``check(result)`` turns such a result into the flat, checked
  results or raises.
  """
  def install(tid: int) -> None:
    run, check = make()
    _put(_call_checks, tid, check)
    _put(_call_runners, tid, run)

  return _assign_id(key, install)


_supported_dtypes: frozenset = frozenset()


def supports(dtypes: Iterable[Any]) -> bool:
  """Whether the engine can carry operands of all these dtypes."""
  global _supported_dtypes
  if not _supported_dtypes:
    _supported_dtypes = frozenset(_dtype_table().values())
  try:
    return all(np.dtype(d) in _supported_dtypes for d in dtypes)
  except TypeError:  # not a NumPy dtype (e.g. an extended JAX dtype)
    return False


# ------------------------------------------------------------ consumers
_lock = threading.Lock()  # consumers, markers, last exception
_consumers: dict[int, "_Consumer"] = {}
_marker_ids = itertools.count(1)
_markers: dict[int, "Arrivals"] = {}
_last_exception: tuple[BaseException, str] | None = None
_owner_pid = os.getpid()
_devices_by_ordinal: dict[int, Any] | None = None


def device_of_ordinal(ordinal: int) -> Any:
  """The local CPU ``jax.Device`` whose FFI device ordinal is ``ordinal``.

  XLA's CPU client gives its handlers the device id as the ordinal
  (``0..N-1`` in one process; in a multi-process program the ids of the
  process's own devices).
  """
  global _devices_by_ordinal
  if _devices_by_ordinal is None:
    import jax  # noqa: PLC0415
    _devices_by_ordinal = {d.id: d for d in jax.local_devices(backend="cpu")}
  return _devices_by_ordinal.get(ordinal, ordinal)


def record_exception(e: BaseException,
                     what: str = "a tap function raised an exception") -> None:
  """Logs ``e`` and keeps it for the next barrier (``barrier_wait``)."""
  global _last_exception
  text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
  logger.error("hostcb: %s:\n%s", what, text)
  with _lock:
    _last_exception = (e, text)


def take_last_exception() -> tuple[BaseException, str] | None:
  """The last exception of a tap function since the previous call (and its
  formatted traceback), or None; clears it."""
  global _last_exception
  with _lock:
    last, _last_exception = _last_exception, None
  return last


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
    with self._count_lock:
      self._remaining -= 1
      if self._remaining == 0:
        self._done.release()

  def wait(self, timeout: float | None) -> bool:
    """True once every consumer arrived; False if ``timeout`` (seconds)
    passed first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
      left = (_WAIT_SLICE_SECONDS if deadline is None else
              min(_WAIT_SLICE_SECONDS, deadline - time.monotonic()))
      if self._done.acquire(timeout=max(left, 0)):
        self._done.release()
        return True
      if deadline is not None and time.monotonic() >= deadline:
        return False


def _check_call(tid: int, result: Any) -> tuple:
  """The flat, checked results of call ``tid`` from what its host function
  returned, for ``hostcb_call_one`` when that was not already an exact
  array of the result (on the device thread, GIL held)."""
  return _call_checks[tid](result)


def _call_failure_text(e: BaseException) -> str:
  """The text with which a failed call fails its computation.

  It begins as XLA's own Python callbacks word it ("CpuCallback error
  calling callback: " and the traceback), which user code may match.
  """
  return "CpuCallback error calling callback: " + "".join(
      traceback.format_exception(type(e), e, e.__traceback__)).rstrip()


class _Consumer:
  """The thread that runs the tap and call functions of one device."""

  def __init__(self, ordinal: int):
    self.ordinal = ordinal
    self.device = device_of_ordinal(ordinal)
    self.thread = threading.Thread(target=self._run, daemon=True,
                                   name=f"hostcb-engine-{ordinal}")

  def _run(self) -> None:
    from hostcb import jax_internals as ji  # noqa: PLC0415
    with ji.running_tap_functions():
      self._consume()

  def _consume(self) -> None:
    _this_thread.ordinal = self.ordinal
    # Set by every consumer before its first batch (idempotent), so that no
    # consumer can run without them, however it was started.
    _native.set_consumer_hooks(_marker_arrived, _tap_failed,
                               dispatch_finished)
    run_batch = _native.run_batch
    functions = _functions
    device, ordinal = self.device, self.ordinal
    while True:
      # The native engine runs each batch in order, the GIL held throughout
      # (less the interpreter's switches), calling the tap functions of
      # _functions and the hooks set above.
      run_batch(ordinal, functions, device, _MAX_BATCH, None, 0,
                _POLL_SECONDS)


def _marker_arrived(marker: int) -> None:
  """A consumer reached barrier marker ``marker``."""
  arrivals = _markers.get(marker)
  if arrivals is not None:
    arrivals.arrive()


def _tap_failed(tid: int, e: BaseException | None) -> None:
  """Tap function ``tid`` raised ``e`` (None: there is none; -1 is a tap
  whose operands could not be allocated): reported by the next barrier."""
  if tid == -1:
    e = MemoryError("hostcb: a tap was lost: its operands could not be "
                    "allocated on the host")
  elif e is None:
    e = KeyError(f"hostcb: no tap function has target id {tid}")
  record_exception(e)


def _local_ordinals() -> list[int]:
  device_of_ordinal(0)
  return list(_devices_by_ordinal)


def ensure_started(ordinals: Iterable[int] | None = None) -> None:
  """Starts the consumer of each device ordinal (default: every local CPU
  device) that has none."""
  _require()
  _check_pid()
  if ordinals is None:
    if _consumers and len(_consumers) >= len(_local_ordinals()):
      return
    ordinals = _local_ordinals()
  started = []
  with _lock:
    for o in ordinals:
      if o not in _consumers:
        c = _consumers[o] = _Consumer(o)
        started.append(c)
  for c in started:
    c.thread.start()


class _ThisThread(threading.local):
  ordinal: int | None = None   # the device this consumer thread serves
  dispatching = False          # its tap function dispatched a computation


_this_thread = _ThisThread()


def dispatch_started() -> None:
  """A computation that taps or calls is about to run, dispatched by this
  thread.

  If this is a consumer thread (a tap function runs jitted code), then
  until that tap function returns (:func:`dispatch_finished`, called by the
  consumer), the producers of its queue do not wait for space, nor calls
  for the taps before them: the computation may tap this very queue or call
  from an XLA thread while this thread waits for it (during the dispatch,
  or later for its results), and only this thread frees space and runs
  taps.
  """
  t = _this_thread
  if t.ordinal is not None and not t.dispatching:
    t.dispatching = True
    _native.set_consumer_dispatching(t.ordinal, True)


def dispatch_finished() -> None:
  """The tap function that dispatched computations has returned."""
  t = _this_thread
  if t.dispatching:
    t.dispatching = False
    _native.set_consumer_dispatching(t.ordinal, False)


def has_consumers() -> bool:
  """Whether any consumer was started in this process (something tapped)."""
  if _native is None:
    return False
  _check_pid()
  return bool(_consumers)


def current_consumer() -> int | None:
  """The device ordinal whose consumer is this thread, or None."""
  return _this_thread.ordinal


def barrier(ordinals: Iterable[int] | None = None,
            timeout: float | None = None) -> bool:
  """Waits until every record queued so far on the devices has been
  processed (default: every device with a consumer).

  Waits for what was queued before the call, not for an empty queue.
  Returns False if ``timeout`` (seconds) passed first.  Exceptions of tap
  functions are not raised here: see :func:`take_last_exception`.
  Raises RuntimeError when called from a tap or call function on the
  consumer of one of those devices, which would wait for itself.
  """
  native = _require()
  _check_pid()
  ordinals = list(_consumers) if ordinals is None else list(ordinals)
  if not ordinals:
    return True
  ensure_started(ordinals)
  mine = _this_thread.ordinal
  if mine is not None and mine in ordinals:
    raise RuntimeError(
        "hostcb: a barrier (barrier_wait) was called from a tap or call "
        f"function running on the consumer of device {mine}; it would wait "
        "for that function itself")
  with _lock:
    mid = next(_marker_ids)
    arrivals = _markers[mid] = Arrivals(len(ordinals))
  try:
    for o in ordinals:
      native.put_marker(o, mid)
    return arrivals.wait(timeout)
  finally:
    with _lock:
      _markers.pop(mid, None)


def set_capacity(nbytes: int) -> None:
  """Sets the byte bound of every device's queue (applied to a non-empty
  queue when it next empties)."""
  _require().set_capacity(int(nbytes))


def counters(ordinal: int) -> dict[str, int]:
  """records_in, records_out, bytes_held, records_held and capacity of the
  queue of a device ordinal (for tests)."""
  return _require().counters(ordinal)


def wait_for_device(ordinal: int) -> None:
  """Returns once every record queued so far on device ``ordinal`` has
  been processed; at once when called by that device's consumer or while
  that consumer runs a tap function that dispatched a computation (the
  call belongs to that function), or when nothing is pending: what the
  ``hostcb_call`` handlers do themselves."""
  c = _consumers.get(ordinal)
  # No consumer: nothing went through the engine on that device (consumers
  # start for every local device at the first native tap).
  if c is None or c.thread is threading.current_thread():
    return
  _native.wait_for_earlier_records(ordinal)


# ------------------------------------------------------------ exit, fork
def _check_pid() -> None:
  if os.getpid() != _owner_pid:  # fork without the at-fork hook (rare)
    _after_fork_in_child()


def _after_fork_in_child() -> None:
  """A fresh engine in a forked child: the parent's threads do not exist
  here, its queues may be locked by them; forget both."""
  global _lock, _last_exception, _owner_pid, _register_lock, _registry_lock
  _lock = threading.Lock()
  _register_lock = threading.Lock()
  _registry_lock = threading.Lock()
  _consumers.clear()
  _markers.clear()
  _last_exception = None
  _owner_pid = os.getpid()
  if _native is not None:
    # The child keeps XLA's registration of the targets, the dtype table
    # and the capacity (plain memory); it loses the queues.
    _native.after_fork_in_child()


if hasattr(os, "register_at_fork"):
  os.register_at_fork(after_in_child=_after_fork_in_child)
# At exit, hostcb.runtime's barrier lets the consumers finish (bounded).
