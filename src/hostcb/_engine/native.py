"""The native back end: C++ rings on CPU, one consumer thread per device.

A tap lowered here is one XLA custom call, ``hostcb_tap``
(:data:`tap_target_name`), whose ``target_id`` attribute indexes
:data:`hostcb._engine.host_functions.tap_functions`.  Its C++ handler
(``src/hostcb/_native/handlers.cc``) copies the operands' bytes, with a
small header, into the ring of the device it runs on, without the GIL, and
returns.  The compiled executable holds no Python callback.

A ``call`` is ``hostcb_call`` (:data:`call_target_name`,
``src/hostcb/_native/call.cc``), or ``hostcb_call_one``
(:data:`call_one_target_name`) when its result is one array: its handler
runs on the device thread, waits for the taps queued before the call on its
device, takes the GIL, copies the operands into fresh read-only NumPy
arrays and runs the call's entry ``host_functions.call_runners[target_id]``
(:mod:`hostcb._engine.entries`: a ``CallRunner``'s ``run(arrays,
ordinal)``, or, for a ``DirectCall`` of one array to one array, the host
function on the array itself: see ``call.cc``); it copies the returned arrays into
the call's results (``hostcb_call_one`` checks an exact NumPy array of
the result in C++ and passes anything else to the call's ``check``).
An exception fails the computation with :func:`_call_failure_text`.

Host functions by name (:mod:`hostcb.named`) are ``hostcb_tap_v1`` and
``hostcb_call_v1`` (``named.cc``): their ``name`` and ``spec`` string
attributes take the place of ``target_id``; the handlers turn them into
this process's target id (asking Python once per process, through
:func:`set_name_resolver`) and go on as the ones above.  All handlers are
registered with XLA when hostcb is imported (:func:`register_at_import`),
so that a program compiled, cached or exported elsewhere finds them.

The handlers of process-local ids (``hostcb_tap``, ``hostcb_call``,
``hostcb_call_one``) have an instantiate stage (``lifetimes.cc``): XLA runs
it when it builds an executable, and destroys the state it keeps once the
executable is gone and its last computation has ended.  The engine counts
them per target id; when the last goes it puts a retire marker behind every
record of each queue, and once a retired id's markers are all passed, the
consumer has the registry free its functions (:func:`.host_functions.free_quiet`):
no barrier is needed, and no record can still name the id.

Consumers start when their device queues its first record, not when a
function is lowered: the first producer of a device takes the GIL once and
calls :func:`_start_consumer` (``set_consumer_starter``).  A consumer takes
the records out in batches (the GIL held once per batch, released while
waiting), builds one NumPy array per operand (the one copy: the arrays
belong to Python and may be kept) and calls the tap functions in the order
the device queued them, from C++ (``run_batch`` in ``module.cc``).
Barrier markers, a tap function's exception and the end of a tap function
that dispatched computations come back through three hooks.

Guarantees (see ``queue.h`` for the native invariants):

* Nothing is dropped: a device whose queue is full waits (the bound is in
  bytes, ``jax_host_callback_max_queue_byte_size``, per device, counting
  each record's operands and its 56-byte descriptor; a record larger than
  the queue goes through alone).  Memory held: within 2x the bound.
  A tap whose arrays cannot be allocated on the host (out of memory) is
  reported as lost by the next barrier; the consumer goes on.
* Per device, records come out in the order their handlers queued them,
  which within one device program is program order; a call runs after
  every record queued before it on its device.
* A tap made by a tap function never deadlocks on a full queue (its
  consumer's own taps never wait, and while a tap function's dispatched
  computation runs, its queue's producers and calls do not wait either).

Device identification: the handlers read the FFI execution context's
device ordinal, which XLA's CPU client sets to the JAX device id (the GPU
back end, :mod:`.gpu`, uses ``GPU_KEY_BASE`` plus the GPU's local
ordinal); :func:`device_of_ordinal` maps either to a ``jax.Device``.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
import traceback
from typing import Any, Iterable

import numpy as np
from _hostcb_env import env_flag

from hostcb import config
from hostcb import _jax_internals as ji
from hostcb._native import shared_constant
from hostcb._engine import entries, errors, host_functions
from hostcb._engine.entries import CallRunner
from hostcb._engine.consumers import this_thread
from hostcb._engine.arrivals import Arrivals

logger = logging.getLogger("hostcb")

tap_target_name = "hostcb_tap"
call_target_name = "hostcb_call"
call_one_target_name = "hostcb_call_one"
noop_target_name = "hostcb_noop"
# The versioned targets of host functions by name (named.cc): what exported,
# cached and serialized programs carry (docs/export.md).  Their names,
# attributes and behaviour never change; a new behaviour is a new version.
tap_v1_target_name = "hostcb_tap_v1"
call_v1_target_name = "hostcb_call_v1"

# Records handed out per batch, at most: the queue's lock is held briefly
# by the consumer, so the device seldom waits for it (256 instead of 4096
# took id_tap's device time per scan step from 0.86 to 0.53 us).
_MAX_BATCH = 256
# After its last batch a consumer polls for this long (timed waits that
# producers need not signal) before sleeping until a producer wakes it.
_POLL_SECONDS = 0.05

_FIX_BUILD = (
  "install a C++ compiler (e.g. g++) and reinstall hostcb: "
  "pip install --force-reinstall --no-deps --no-cache-dir hostcb"
)

# ------------------------------------------------------------------ loading
_native: Any = None
_reason: str | None = None
_disabled_by_user = False


def _build_failure() -> str | None:
  try:
    from hostcb._native import build_failure  # noqa: PLC0415
  except ImportError:
    return None
  return build_failure()


def _load() -> None:
  global _native, _reason, _disabled_by_user
  if env_flag("HOSTCB_DISABLE_NATIVE"):
    _reason = "disabled by HOSTCB_DISABLE_NATIVE"
    _disabled_by_user = True
    return
  try:
    from hostcb._native import _engine  # noqa: PLC0415
  except ImportError as e:
    failure = _build_failure()
    if failure:
      _reason = (
        f"it was not built when hostcb was installed ({failure}); "
        f"to build it, {_FIX_BUILD}"
      )
    else:
      first = str(e).splitlines()[0] if str(e) else type(e).__name__
      _reason = (
        f"the extension hostcb._native._engine cannot be loaded "
        f"({first}); {_FIX_BUILD}"
      )
    return
  _native = _engine


_load()


def disabled_by_user() -> bool:
  """True if HOSTCB_DISABLE_NATIVE turned the engine off."""
  return _disabled_by_user


def unavailable_reason() -> str | None:
  """One line saying why the engine is not available, or None."""
  return _reason


def _disable(reason: str) -> None:
  global _native, _reason
  _native, _reason = None, reason


def _require() -> Any:
  if _native is None:
    raise RuntimeError(f"hostcb native tap engine: {_reason}")
  return _native


def module() -> Any:
  """The extension module ``hostcb._native._engine`` (raises if it is not
  available)."""
  return _require()


# ------------------------------------------------------- XLA FFI targets
# XLA_FFI_DataType codes (xla/ffi/api/c_api.h) of the dtypes taps may
# carry, by NumPy/ml_dtypes name.  Sub-byte types are refused by the
# handlers.
_DTYPE_CODES = {
  "bool": 1,
  "int8": 2,
  "int16": 3,
  "int32": 4,
  "int64": 5,
  "uint8": 6,
  "uint16": 7,
  "uint32": 8,
  "uint64": 9,
  "float16": 10,
  "float32": 11,
  "float64": 12,
  "complex64": 15,
  "bfloat16": 16,
  "complex128": 18,
  "float8_e5m2": 19,
  "float8_e4m3fn": 20,
  "float8_e4m3b11fnuz": 23,
  "float8_e5m2fnuz": 24,
  "float8_e4m3fnuz": 25,
  "float8_e4m3": 28,
  "float8_e3m4": 29,
  "float8_e8m0fnu": 33,
}

_registered = False  # every handler, with the checked registration
_registered_at_import = False  # all but _LOCAL_TARGETS (unchecked)
_register_lock = threading.Lock()
# The handlers of process-local target ids: registered with their
# instantiate stage (lifetimes.cc), which counts the executables that name
# each id, so that a retired id is freed once no record can name it
# (:mod:`.host_functions`).  XLA accepts the stage's state type only before the
# handlers that use it, and a registration made before JAX's CPU client
# starts is replayed handlers first: so these wait for the checked
# registration (a lowering that uses them makes it first; no program made
# elsewhere names a process-local id).
_LOCAL_TARGETS = frozenset({"hostcb_tap", "hostcb_call", "hostcb_call_one"})
_counts_executables = [False]


def _dtype_table() -> dict[int, np.dtype]:
  try:
    import ml_dtypes  # noqa: PLC0415  (a dependency of jax)
  except ImportError:
    ml_dtypes = None
  table = {}
  for name, code in _DTYPE_CODES.items():
    if name == "bool":
      table[code] = np.dtype(np.bool_)
    elif hasattr(np, name):
      table[code] = np.dtype(name)
    elif ml_dtypes is not None and hasattr(ml_dtypes, name):
      table[code] = np.dtype(getattr(ml_dtypes, name))
  return table


def register_targets(capacity: int, check: bool = True) -> None:
  """Registers the FFI targets with XLA (CPU), once per process; raises
  if XLA refuses them (e.g. a handler built for another jaxlib).

  ``check``: start JAX's CPU client first, so that XLA checks each handler
  now; ``import hostcb`` registers them without (it starts no backend:
  a deserialized program may need them before anything is traced), all
  but those of process-local ids (:data:`_LOCAL_TARGETS`)."""
  global _registered, _registered_at_import
  if _registered or (_registered_at_import and not check):
    return
  native = _require()
  with _register_lock:
    if _registered or (_registered_at_import and not check):
      return
    import jax  # noqa: PLC0415

    # With the CPU client running, XLA checks each handler now (a handler
    # built for another jaxlib raises here) instead of failing the
    # client's start later.  (JAX_PLATFORMS may leave the CPU out: the
    # handlers then serve the GPU back end alone.)
    try:
      if check:
        jax.local_devices(backend="cpu")
    except RuntimeError:  # no CPU backend: nothing to check it against
      pass
    if not _registered_at_import:
      native.set_name_resolver(_resolve_name)  # the handlers by name ask it
      native.set_dtypes(_dtype_table())
      entries.hand_to_engine(native)  # the kinds of entries it runs
      native.set_call_server(
        host_functions.call_runners, _check_call, _call_failure_text
      )
      native.set_consumer_hooks(
        _marker_arrived,
        _tap_failed,
        dispatch_finished,
        host_functions.free_quiet,
      )
      native.set_consumer_starter(_start_consumer)
      for name, capsule in native.handlers().items():
        if name not in _LOCAL_TARGETS:
          jax.ffi.register_ffi_target(name, capsule, platform="cpu")
      native.set_capacity(int(capacity))
      _registered_at_import = True
    if check:
      _register_local_targets(jax, native)
      _registered = True


def _register_local_targets(jax: Any, native: Any) -> None:
  """Registers the handlers of process-local ids, with their instantiate
  stage where this JAX registers the type of its state (then the registry
  frees retired ids without a barrier: :func:`.host_functions.count_executables`),
  else without it (a barrier frees them)."""
  handlers = native.handlers()
  lifetimes = native.lifetimes()
  staged = False
  try:
    _register_state_type(jax, lifetimes)
    staged = True
  except Exception as e:  # noqa: BLE001  (an XLA without the stage)
    logger.debug("hostcb: executables are not counted (%s)", e)
  for name in sorted(_LOCAL_TARGETS):
    if staged:
      try:
        jax.ffi.register_ffi_target(
          name,
          {"instantiate": lifetimes["instantiate"], "execute": handlers[name]},
          platform="cpu",
        )
        continue
      except Exception as e:  # noqa: BLE001  (as above)
        logger.debug("hostcb: executables are not counted (%s)", e)
        staged = False
    jax.ffi.register_ffi_target(name, handlers[name], platform="cpu")
  if staged:
    _counts_executables[0] = True
    host_functions.count_executables(native.retire_target, native.take_quiet)


def _register_state_type(jax: Any, lifetimes: dict) -> None:
  """Registers the type of the instantiate stage's state, with its deleter
  (``jax.ffi.register_ffi_type``, jax >= 0.10).  jax 0.8 has only
  ``register_ffi_type_id``, and its XLA may end a dropped executable's
  state while a computation of it still runs (a function was freed with
  its taps still queued): there executables are not counted, and a barrier
  frees retired functions."""
  register_type = getattr(jax.ffi, "register_ffi_type", None)
  if register_type is None:
    raise NotImplementedError(
      f"jax {jax.__version__} has no jax.ffi.register_ffi_type"
    )
  register_type(
    "hostcb_live_executable",
    {"type_id": lifetimes["type_id"], "type_info": lifetimes["type_info"]},
    platform="cpu",
  )


def counts_executables() -> bool:
  """Whether the CPU handlers of process-local ids count the executables
  that name each id (XLA's instantiate stage): retired ids are then freed
  without a barrier, once no record can name them."""
  return _counts_executables[0]


def register_at_import(capacity: int) -> None:
  """Registers the handlers when hostcb is imported (see
  :func:`register_targets`), so that programs that were compiled, cached
  or exported elsewhere find them; where XLA refuses them, the engine is
  off and says why."""
  if _native is None or _registered or _registered_at_import:
    return
  try:
    register_targets(capacity, check=False)
  except Exception as e:  # noqa: BLE001  (e.g. built for another jaxlib)
    _refused(e)


def _refused(e: BaseException) -> None:
  _disable(
    f"XLA refused its FFI handlers ({str(e).splitlines()[0]}); "
    "reinstall hostcb to build it for the installed jaxlib: "
    "pip install --force-reinstall --no-deps --no-cache-dir "
    "hostcb"
  )


# resolver(name, spec) -> target id * 2 + one-array call: set by hostcb.named.
_name_resolver: list[Any] = [None]


def set_name_resolver(resolver: Any) -> None:
  """Sets what the handlers by name ask, once per (name, spec) and process."""
  _name_resolver[0] = resolver


def _resolve_name(name: str, spec: str) -> int:
  """The handlers' question (device thread, GIL held)."""
  resolver = _name_resolver[0]
  if resolver is None:
    raise LookupError(
      f"hostcb: no host function is registered under the name {name!r} in "
      "this process (hostcb.named is not imported)"
    )
  return resolver(name, spec)


def set_named(name: str, spec: str, value: int) -> None:
  """Tells the handlers what (name, spec) resolves to, before they ask."""
  _require().set_named(name, spec, int(value))


def available(capacity: int) -> bool:
  """True if the engine is built, loadable, and XLA accepts its handlers
  (registering them on first use, with queues of ``capacity`` bytes)."""
  if _native is None:
    return False
  if not _registered:
    try:
      register_targets(capacity)
    except Exception as e:  # noqa: BLE001  (e.g. built for another jaxlib)
      _refused(e)
      return False
  return True


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


def _check_call(tid: int, result: Any) -> tuple:
  """The flat, checked results of call ``tid`` from what its host function
  returned, for ``hostcb_call_one`` when that was not already an exact
  array of the result (on the device thread, GIL held)."""
  return host_functions.call_checks[tid](result)


def _call_failure_text(e: BaseException) -> str:
  """The text with which a failed call fails its computation.

  It begins as XLA's own Python callbacks word it ("CpuCallback error
  calling callback: " and the traceback), which user code may match.
  """
  return (
    "CpuCallback error calling callback: "
    + "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()
  )


# ------------------------------------------------------------ consumers
_lock = threading.Lock()  # consumers and markers
_consumers: dict[int, "_Consumer"] = {}
_marker_ids = itertools.count(1)
_markers: dict[int, Arrivals] = {}
_devices_by_ordinal: dict[int, Any] | None = None


# Keys of GPU queues start here (kGpuKeyBase in engine.h; see .gpu).
GPU_KEY_BASE = shared_constant("GPU_KEY_BASE")


def device_of_ordinal(ordinal: int) -> Any:
  """The local ``jax.Device`` of an engine queue key: a CPU device's FFI
  device ordinal (XLA's CPU client gives its handlers the device id), or
  ``GPU_KEY_BASE`` plus a GPU's local hardware id (:mod:`.gpu`)."""
  global _devices_by_ordinal
  if _devices_by_ordinal is None or (
    ordinal >= GPU_KEY_BASE and ordinal not in _devices_by_ordinal
  ):
    import jax  # noqa: PLC0415

    table = {}
    for backend in ("cpu", "gpu"):
      try:
        devices = jax.local_devices(backend=backend)
      except RuntimeError:  # no such backend (JAX_PLATFORMS may omit cpu)
        continue
      for d in devices:
        key = key_of_device(d)
        if key is not None:
          table[key] = d
    _devices_by_ordinal = table
  return _devices_by_ordinal.get(ordinal, ordinal)


def key_of_device(device: Any) -> int | None:
  """The engine queue key of a local ``jax.Device`` (None for platforms
  the engine does not serve)."""
  platform = getattr(device, "platform", None)
  if platform == "cpu":
    return device.id
  if (
    platform in ("gpu", "cuda")
    and getattr(device, "local_hardware_id", None) is not None
  ):
    return GPU_KEY_BASE + device.local_hardware_id
  return None


# A failed consumer tries again after _RETRY_FIRST_SECONDS, doubling up to
# _RETRY_MAX_SECONDS while failures follow each other within
# _RETRY_RESET_SECONDS; a later failure starts again from the first delay.
_RETRY_FIRST_SECONDS = 0.01
_RETRY_MAX_SECONDS = 2.0
_RETRY_RESET_SECONDS = 10.0
_sleep = time.sleep  # (tests replace it)


def retry_delay(previous: float, since_last_failure: float | None) -> float:
  """How long a consumer waits after a failure, given its previous delay
  and the seconds since its previous failure (None: the first one)."""
  if since_last_failure is None or since_last_failure > _RETRY_RESET_SECONDS:
    return _RETRY_FIRST_SECONDS
  return min(max(2 * previous, _RETRY_FIRST_SECONDS), _RETRY_MAX_SECONDS)


_nice_refused = False  # whether a consumer could not lower its priority
_PLATFORM = sys.platform  # (tests replace it)


def _lower_priority(increment: int) -> None:
  """Schedules the calling thread (a consumer) ``increment`` nice levels
  below the rest of the process (``hostcb_consumer_nice``; Linux, where a
  thread has its own nice value; elsewhere it stays as it is and the log
  says so once).  On a busy machine the device threads then get the CPU
  before the tap functions of their earlier taps, which they would
  otherwise share it with (the wall-clock time per tap was 1.4x the empty
  custom call's with it, 2.4 to 9x without)."""
  global _nice_refused
  if increment == 0:
    return
  try:
    if not _PLATFORM.startswith("linux"):
      raise OSError(f"a thread has no nice value of its own on {_PLATFORM}")
    tid = threading.get_native_id()
    now = os.getpriority(os.PRIO_PROCESS, tid)
    os.setpriority(os.PRIO_PROCESS, tid, min(now + increment, 19))
  except OSError as e:
    if not _nice_refused:
      _nice_refused = True
      logger.warning(
        "hostcb: the threads that run tap functions keep the process's "
        "priority (hostcb_consumer_nice=%d not applied: %s); a device may "
        "then share its CPU with them on a busy machine",
        increment,
        e,
      )


class _Consumer:
  """The thread that runs the tap functions of one device."""

  def __init__(self, ordinal: int):
    self.ordinal = ordinal
    self.device = device_of_ordinal(ordinal)
    self.thread = threading.Thread(
      target=self._run, daemon=True, name=f"hostcb-engine-{ordinal}"
    )

  def _run(self) -> None:
    from hostcb import _jax_internals as ji  # noqa: PLC0415

    this_thread.ordinal = self.ordinal
    _lower_priority(config.read(config.CONSUMER_NICE))
    delay, failed_at = 0.0, None
    with ji.running_tap_functions():
      while True:
        try:
          self._consume()
        except Exception as e:  # noqa: BLE001  (the consumer never dies)
          errors.record_exception(
            e, f"the consumer of device {self.ordinal} failed"
          )
          # Logged and kept for the barrier; then the consumer waits before
          # it tries again, longer after each failure that follows closely
          # on the last, so that a persistent failure is no hot loop.
          now = time.monotonic()
          delay = retry_delay(
            delay, None if failed_at is None else now - failed_at
          )
          failed_at = now
          _sleep(delay)

  def _consume(self) -> None:
    run_batch = _native.run_batch
    functions = host_functions.tap_functions
    device, ordinal = self.device, self.ordinal
    while True:
      # Each batch in order, the GIL held throughout (less the
      # interpreter's switches), calling the tap functions and the hooks.
      run_batch(ordinal, functions, device, _MAX_BATCH, None, 0, _POLL_SECONDS)


def _marker_arrived(marker: int) -> None:
  """A consumer reached barrier marker ``marker``."""
  arrivals = _markers.get(marker)
  if arrivals is not None:
    arrivals.arrive()


def _tap_failed(tid: int, e: BaseException | None) -> None:
  """Tap function ``tid`` raised ``e`` (None: there is none; -1 is a tap
  whose operands could not be allocated on the host, by the device or by
  the consumer): reported by the next barrier."""
  if tid == -1:
    e = MemoryError(
      "hostcb: a tap was lost: its operands could not be allocated on the host"
    )
  elif e is None:
    e = KeyError(f"hostcb: no tap function has target id {tid}")
  elif e.__traceback__ is None:
    # Raised by the call itself (a tap function that takes other
    # arguments), before any frame of it ran: give it the frame of its
    # caller, the consumer, so that the report shows a traceback as
    # legacy's did.
    try:
      raise e
    except BaseException as raised:  # noqa: BLE001
      e = raised
  errors.record_exception(e)


# Called (no arguments) when a device queues its first record: set by
# hostcb._engine.lifecycle, which this module cannot import (it imports
# this one).
on_first_record: list = []


def rearm_first_record() -> None:
  """The next record of each device runs :data:`on_first_record` again
  (``hostcb.uninstall()``: compiled programs keep tapping after it,
  without the exit handler that their next record installs again).
  Nothing without the engine."""
  if _native is not None:
    _native.rearm_consumer_starter()


def _start_consumer(ordinal: int) -> None:
  """The first record of device ``ordinal`` is being queued (called by the
  device thread, GIL taken)."""
  try:
    for hook in on_first_record:
      hook()
  except Exception:  # the consumer must start all the same: without it
    # the device's taps would never run (logged, with its traceback)
    logger.exception("hostcb: a hook on the first record of a device failed")
  ensure_started([ordinal])


def ensure_started(ordinals: Iterable[int]) -> None:
  """Starts the consumer of each of these device ordinals that has none."""
  started = []
  with _lock:
    for o in ordinals:
      if o not in _consumers:
        c = _consumers[o] = _Consumer(o)
        started.append(c)
  for c in started:
    c.thread.start()


def dispatch_started() -> None:
  """This thread is about to run a computation that taps or calls: if it
  is a native consumer (a tap function runs jitted code), then until that
  tap function returns (:func:`dispatch_finished`), the producers of its
  queue do not wait for space, nor calls for the taps before them."""
  t = this_thread
  if t.ordinal is not None and not t.dispatching:
    t.dispatching = True
    _native.set_consumer_dispatching(t.ordinal, True)


def dispatch_finished() -> None:
  """The tap function that dispatched computations has returned."""
  t = this_thread
  if t.dispatching and t.ordinal is not None:
    t.dispatching = False
    _native.set_consumer_dispatching(t.ordinal, False)


def put_markers(arrivals_for) -> Arrivals | None:
  """Puts a marker behind every record queued so far on each device with
  a consumer; returns the arrivals to wait for (None: no consumer).

  ``arrivals_for(n)`` makes the Arrivals for ``n`` markers.  Not from a
  consumer, which would wait for itself (:func:`.barrier.wait_for_taps`
  refuses those).
  """
  ordinals = list(_consumers)
  if not ordinals:
    return None
  with _lock:
    mid = next(_marker_ids)
    arrivals = _markers[mid] = arrivals_for(len(ordinals))
  for o in ordinals:
    _native.put_marker(o, mid)
  return arrivals


def forget_markers(arrivals: Arrivals) -> None:
  """Drops the marker whose arrivals were waited for."""
  with _lock:
    for mid, a in list(_markers.items()):
      if a is arrivals:
        del _markers[mid]


def set_capacity(nbytes: int) -> None:
  """Sets the byte bound of every device's queue (applied to a non-empty
  queue when it next empties)."""
  if _native is not None:
    _native.set_capacity(max(int(nbytes), 4096))


def retire_target(tid: int) -> bool:
  """The last lease of ``tid`` died: whether no executable that names it
  lives any more and every record it made has run (``lifetimes.cc``)."""
  return _native.retire_target(tid)


def take_quiet() -> list[int]:
  """Retired ids that became quiet where no consumer could say so."""
  return _native.take_quiet()


def tracked_targets() -> int:
  """Target ids whose executables the engine counts (for tests)."""
  return _require().tracked_targets()


def counters(ordinal: int) -> dict[str, int]:
  """records_in, records_out, bytes_held, records_held, capacity,
  space_waiters and lock_sleeps (how often a thread slept on the queue's
  lock after spinning) of the queue of a device ordinal (for tests and
  benchmarks)."""
  return _require().counters(ordinal)


def tap_fallbacks() -> tuple[int, str | None]:
  """(count, reason): the CPU taps whose call frame the engine's handler did
  not decode itself but ran through XLA FFI's generic decoding (slower,
  still in order), and why the first did; (0, None) when every tap took
  the fast path.  The consumer logs the reason once, on the "hostcb"
  logger."""
  return _require().tap_fallbacks()


def wait_for_device(ordinal: int, awaited_only: bool = False) -> None:
  """Returns once every record queued so far on device ``ordinal`` has
  been processed (``awaited_only``: every record up to the latest print
  tap, see :func:`mark_awaited`); at once when called by that device's
  consumer, while that consumer runs a tap function that dispatched a
  computation (the call belongs to that function), or when nothing went
  through the engine on that device."""
  c = _consumers.get(ordinal)
  if c is None or c.thread is threading.current_thread():
    return
  _native.wait_for_earlier_records(ordinal, awaited_only)


def runs_host_function_call() -> bool:
  """Whether this thread runs, in the engine's call handler, the runner of
  an ``io_callback``/``pure_callback`` host function (a
  :class:`~hostcb._engine.entries.CallRunner` with ``host_function``):
  its computation waits for it.  The handler keeps the stack of the
  entries it runs, so that such a runner marks nothing per call."""
  if _native is None:
    return False
  for entry in _native.running_call_runners():
    if type(entry) is CallRunner and entry.host_function:
      return True
  return False


def formats_print_lines() -> bool:
  """Whether the loaded extension makes the text of a ``debug.print`` line
  in C (its ``print_line_text``: the tap entry
  :class:`~hostcb._engine.entries.PrintLineTap`): not an older build
  (reinstalling adds it), nor one whose C++ library lacks the shortest
  floating-point ``std::to_chars`` (GCC before 11)."""
  return _native is not None and bool(
    getattr(_native, "FORMATS_PRINT_LINES", False)
  )


def awaited_run_everywhere() -> bool:
  """Whether every device's consumer has run the prints queued so far
  (no waiting, and the GIL kept)."""
  for ordinal in list(_consumers):
    if not _native.wait_for_earlier_records(ordinal, True, 0.0):
      return False
  return True


def wait_for_awaited_everywhere(deadline: float) -> bool:
  """``wait_for_device(o, awaited_only=True)`` for every device ``o`` with
  a consumer, until ``deadline`` (``time.monotonic()``); False if it
  passed first.  Not from a consumer thread (the caller checks)."""
  ok = True
  for ordinal in list(_consumers):
    ok = (
      _native.wait_for_earlier_records(
        ordinal, True, max(0.0, deadline - time.monotonic())
      )
      and ok
    )
  return ok


def mark_awaited(tid: int) -> None:
  """Taps of target ``tid`` print: ``wait_for_device(..., awaited_only=True)``
  waits for them.
  A target id beyond the engine's table is not marked (a program with a
  million tap sites); its prints are then not waited for by host reads."""
  if tid < _native.MAX_PRINT_TARGETS:
    _native.mark_awaited_target(tid)


def after_fork_in_child() -> None:
  """A fresh back end in a forked child: the parent's threads do not exist
  here, and its queues may be locked by them; forget both.  The child
  keeps XLA's registration of the targets, the dtype table and the
  capacity (plain memory)."""
  global _lock, _register_lock
  _lock = threading.Lock()
  _register_lock = threading.Lock()
  _consumers.clear()
  _markers.clear()
  this_thread.ordinal = None
  this_thread.dispatching = False
  if _native is not None:
    _native.after_fork_in_child()


def install_exit_guard() -> None:
  """Installs the engine's ``std::terminate`` handler (``exit_guard.cc``:
  a thread that Python ends at shutdown inside C++ code does not abort the
  process), when the first program that taps is traced; recorded in
  :mod:`hostcb._jax_internals.patches`, which puts the previous handler
  back.  Nothing without the engine."""
  if _native is None or ji.is_installed("exit guard"):
    return
  _native.install_exit_guard()

  def undo() -> None:
    if not _native.uninstall_exit_guard():
      logger.warning(
        "hostcb: another std::terminate handler replaced "
        "hostcb's exit guard since; left in place"
      )

  ji.record_patch("exit guard", "std::terminate handler (exit_guard.cc)", undo)
