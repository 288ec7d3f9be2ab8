"""hostcb's host engine: everything that happens on the host side of taps
and calls, in one package.

* :mod:`.native`: the back end of CPU taps and calls (C++ rings, XLA FFI
  handlers, one consumer thread per device, started at the device's first
  tap);
* :mod:`.gpu`: the CUDA back end, filling the same rings from the GPU's
  stream (on by default; ``hostcb_gpu_engine`` turns it off);
* :mod:`.pyqueue`: the back end of what the rings cannot serve (GPUs
  without the GPU back end, other platforms, an unbuilt extension, dtypes
  the rings cannot carry), through XLA's Python callbacks;
* :mod:`.host_functions`: the tap and call functions, by target id;
* :mod:`.consumers`: which thread is a consumer (of either back end);
* :mod:`.errors`: exceptions of tap and call functions, for the barrier;
* :mod:`.arrivals`: what a barrier waits on: its markers' arrivals;
* :mod:`.barrier`: ``barrier_wait`` over both back ends;
* :mod:`.distributed`: the barrier across the processes of a
  multi-process program;
* :mod:`.output_order`: writes and host reads after the prints dispatched
  before them (its docstring maps every place that takes part);
* :mod:`.lifecycle`: fork and interpreter exit.

This module is what the rest of hostcb uses: the lowering asks which back
end serves a callback and registers its functions; the public API re-exports
the barrier.  It subscribes to the options of :mod:`hostcb.config` that
concern it (the queue bound; the strict barrier, which turns fast dispatch
off).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from _hostcb_env import env_flag

from hostcb import config
from hostcb import _jax_internals as ji
from hostcb._engine import consumers, gpu, native, pyqueue, host_functions
from hostcb._engine import lifecycle  # noqa: F401  (fork and exit handlers)
from hostcb._engine.barrier import (
  barrier_wait,
  stop_outfeed_receiver,
  wait_for_taps,
)
from hostcb._engine.errors import CallbackException, record_exception
from hostcb._engine.lifecycle import note_lowered
from hostcb._engine.native import (
  call_one_target_name,
  call_target_name,
  counters,
  tap_fallbacks,
  device_of_ordinal,
  mark_awaited,
  noop_target_name,
  supports,
  unavailable_reason,
  wait_for_device,
)
from hostcb._engine.native import tap_target_name as ffi_target_name
from hostcb._engine.native import (
  call_v1_target_name,
  set_name_resolver,
  tap_v1_target_name,
)
from hostcb._engine.output_order import awaited_tap_staged
from hostcb._engine.pyqueue import queue_for
from hostcb._engine.pyqueue import queues as python_queues
from hostcb._engine.host_functions import ProcessLocalFunctionError

__all__ = [
  "tap_v1_target_name",
  "call_v1_target_name",
  "named_target_id",
  "set_name_resolver",
  "rebind_name",
  "available",
  "serves",
  "unavailable_reason",
  "EngineFallbackWarning",
  "warn_if_unavailable",
  "ffi_target_name",
  "call_target_name",
  "call_one_target_name",
  "noop_target_name",
  "target_id",
  "call_target_id",
  "supports",
  "device_of_ordinal",
  "counters",
  "tap_fallbacks",
  "wait_for_device",
  "drain_device",
  "queue_for",
  "python_queues",
  "record_exception",
  "CallbackException",
  "barrier_wait",
  "stop_outfeed_receiver",
  "wait_for_taps",
  "note_lowered",
  "awaited_tap_staged",
  "mark_awaited",
  "ProcessLocalFunctionError",
]


def _capacity() -> int:
  return int(config.read(config.MAX_QUEUE_BYTE_SIZE))


def available() -> bool:
  """True if the native engine is built, loadable, and XLA accepts its
  handlers (registering them on first use).  When False,
  :func:`unavailable_reason` says why and CPU taps use XLA's Python
  callbacks."""
  return native.available(_capacity())


def serves(platform: str) -> bool:
  """Whether taps and calls lowered for ``platform`` (``cpu``, ``cuda``...)
  go to the engine's rings.  Warns once when they cannot although they
  should (CPU without the native engine; GPUs with ``hostcb_gpu_engine``
  on and no usable driver).  A program lowered for CUDA in a process
  without an NVIDIA GPU (``xla_computation(backend="cuda")``, say) runs
  elsewhere: it takes XLA's Python callbacks, which any GPU machine runs,
  without a warning."""
  if platform == "cpu":
    if available():
      return True
    warn_if_unavailable()
    return False
  if platform == "cuda" and gpu.enabled() and gpu.has_local_gpu():
    if gpu.available(_capacity()):
      return True
    gpu.warn_unavailable()
  return False


def target_id(
  key: Any, make: Callable[[], Any], func: Any = None, platform: str = "cpu"
) -> host_functions.Lease:
  """A lease (:class:`.host_functions.Lease`) of the native target id
  (``.tid``) of the tap entry that ``make()`` builds, one per ``key`` (see
  :mod:`.host_functions`), for a program lowered for ``platform``; registers the
  handlers on first use.  The id lives while a lease of it does: keep the
  lease with the executable
  (:func:`hostcb._jax_internals.keep_alive_with_executable`); once retired,
  it is freed when no record can name it any more."""
  native.register_targets(_capacity())
  return host_functions.tap_id(key, make, func, _counted(platform))


def call_target_id(
  key: Any,
  make: Callable[[], tuple[Callable, Callable]],
  func: Any = None,
  platform: str = "cpu",
) -> host_functions.Lease:
  """A lease of the native target id of a call, one per ``key`` (see
  :func:`.host_functions.call_id` and :func:`target_id`)."""
  native.register_targets(_capacity())
  return host_functions.call_id(key, make, func, _counted(platform))


def _counted(platform: str) -> bool:
  """Whether the engine counts the executables of a program lowered for
  ``platform`` (CPU's handlers, where XLA runs their instantiate stage)."""
  return platform == "cpu" and native.counts_executables()


def drain_device(device: Any, engine_records: bool = True) -> None:
  """Waits until the taps queued so far for ``device`` have run (both back
  ends, or only the Python-callback one if not ``engine_records``), unless
  called by a consumer of that device or while it runs a tap function that
  dispatched a computation: a ``call`` made by a tap function runs as part
  of that function."""
  if python_queues:
    pyqueue.drain(device)
  if engine_records:
    key = native.key_of_device(device)
    if key is not None:
      wait_for_device(key)


def named_target_id(
  name: str,
  spec: str,
  install: Callable[[int], None],
  value: Callable[[int], int],
) -> int:
  """The native target id of the host function by name ``(name, spec)``
  (see :func:`.host_functions.named_id`); the handlers by name learn
  ``value(tid)`` (the id * 2 + one-array call) now rather than asking."""
  native.register_targets(_capacity())
  tid = host_functions.named_id(name, spec, install)
  native.set_named(name, spec, value(tid))
  return tid


def rebind_name(name: str) -> None:
  """``name`` is bound to another function: rebuilds its entries."""
  host_functions.rebind(name)


# -------------------------------------------------- the fallback warning
class EngineFallbackWarning(RuntimeWarning):
  """hostcb runs without its native engine (slower taps and calls)."""

  __module__ = "hostcb.engine"


_warned = [False]


def warn_if_unavailable() -> None:
  """Warns once per process, when a CPU tap or call is lowered without the
  native engine, naming why and the fix.  Silent where the user turned the
  engine off (``HOSTCB_DISABLE_NATIVE``) or asked for silence
  (``HOSTCB_NO_ENGINE_WARNING=1``, or a ``warnings`` filter on
  :class:`EngineFallbackWarning`)."""
  if _warned[0]:
    return
  _warned[0] = True
  if native.disabled_by_user() or env_flag("HOSTCB_NO_ENGINE_WARNING"):
    return
  warnings.warn(
    f"hostcb: the native engine is not available: {unavailable_reason()}. "
    "Taps and calls on CPU use XLA's Python callbacks instead, several "
    "times slower per tap and call. Set HOSTCB_NO_ENGINE_WARNING=1 to "
    "silence this warning.",
    EngineFallbackWarning,
    stacklevel=3,
  )


# ------------------------------------------------------------- wiring
def _dispatch_started() -> None:
  """A thread is about to run a computation that taps or calls (see
  :func:`.native.dispatch_started`)."""
  if consumers.is_consumer():  # a tap function runs it: barriers look again
    consumers.note_dispatch()
  native.dispatch_started()
  pyqueue.dispatch_started()


def _set_max_queue_bytes(n: int) -> None:
  pyqueue.set_max_bytes(n)
  native.set_capacity(n)


def _set_strict_barrier(strict: bool) -> None:
  ji.set_fast_dispatch(not strict)


# Programs compiled, cached or exported elsewhere may run here before
# anything is traced: the handlers are registered now (XLA's registry of
# FFI targets, no JAX object; the backend is not started).
native.register_at_import(_capacity())

ji.set_dispatch_hook(_dispatch_started)
config.subscribe(config.MAX_QUEUE_BYTE_SIZE, _set_max_queue_bytes)
config.subscribe(config.STRICT_BARRIER, _set_strict_barrier)
