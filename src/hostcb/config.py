"""hostcb's options: legacy's two knobs, the strict barrier and the GPU engine.

Each option is read from its environment variable when hostcb is imported
and can be changed later from Python, in any of these equivalent ways::

    hostcb.config.update("jax_host_callback_inline", True)
    jax.config.update("jax_host_callback_inline", True)   # legacy spelling
    os.environ["JAX_HOST_CALLBACK_INLINE"] = "1"          # before import

``jax_host_callback_inline``
    Run tap and call functions directly in the calling thread when the call is
    made outside any staging context (outside ``jit`` and control flow), so
    that tracebacks show the calling code.  Default ``False``.

``jax_host_callback_max_queue_byte_size``
    The most bytes of tapped values that may wait for their tap function, per
    device.  When the queue is full the device computation waits until the
    tap functions catch up; nothing is ever dropped.  Default 256 MB, at
    least 16 MB.

``hostcb_strict_barrier`` (environment: ``HOSTCB_STRICT_BARRIER``)
    hostcb's own.  By default (``False``) a function that taps or calls and
    runs on one device is compiled for ``jax.jit``'s C++ fast dispatch path
    (no JAX runtime token; about 1.3x the dispatch time of the same
    function without the tap, instead of the strict mode's cost in
    README.md's dispatch table), and ``barrier_wait``
    waits for every computation of the calling thread, every multi-device
    one, and every one of any thread whose results are still alive.  The
    one computation it cannot see is a one-device computation that another
    thread dispatched, that is still running, and whose results were all
    dropped.  ``True`` restores legacy's full cross-thread barrier: every
    tapping computation exchanges a runtime token, which ``barrier_wait``
    waits for, at legacy's dispatch cost.  Changing it clears JAX's
    compilation caches.

``hostcb_gpu_engine`` (environment: ``HOSTCB_GPU_ENGINE``)
    hostcb's own.  ``True`` (the default) lowers taps and calls on NVIDIA
    GPUs to the engine's CUDA back end (asynchronous copies into pinned host
    memory and a ready word the stream writes: the stream never waits for
    Python) instead of XLA's Python callbacks for GPUs, which make the
    stream wait for Python at every callback.  ``False`` restores those.
    Changing it clears JAX's compilation caches.

``hostcb_callback_jax_arrays`` (environment: ``HOSTCB_CALLBACK_JAX_ARRAYS``)
    hostcb's own.  ``True`` (the default) hands the functions of hostcb's
    drop-ins for JAX's callbacks (``hostcb.debug.callback``,
    ``hostcb.io_callback``, ``hostcb.pure_callback``, and JAX's names under
    ``hostcb.install(jax_callbacks=True)``) ``jax.Array`` s on the CPU, as
    JAX's own callbacks do, made straight from the engine's host arrays
    (no ``jax.device_put``; docs/jax_callbacks.md gives the cost).
    ``False`` is the opt-out: NumPy arrays, as earlier hostcb releases
    passed them, a little cheaper still.  ``id_tap``,
    ``id_print`` and ``call`` always pass NumPy arrays (legacy's
    interface), and ``hostcb.debug.print`` prints JAX's text either way.
    Read when a callback is staged: set it before tracing.

``hostcb_consumer_nice`` (environment: ``HOSTCB_CONSUMER_NICE``)
    hostcb's own, Linux only.  How much lower than the rest of the process
    the threads that run tap functions (one per device) are scheduled: the
    nice increment, 0 to 19, that each takes when it starts.  Where the
    cores are all busy, the device threads that make the taps then get the
    CPU before the Python work of earlier taps, so a tap costs the device
    little more than its copy (README.md's device-time table); the tap
    functions still run, in order, on what CPU the rest leaves, and a
    device waits for them only when its queue is full.  Threads that a tap
    function starts inherit it.  Default 10; 0 leaves them as they are.
    Read when a device's consumer thread starts.

``hostcb_fast_dispatch`` (environment: ``HOSTCB_FAST_DISPATCH``)
    The opt-in name of hostcb 0.2, kept working: it is the opposite of
    ``hostcb_strict_barrier`` (reading it gives ``not strict``; setting it
    sets ``strict = not value``).

Other modules follow an option with :func:`subscribe` (this module imports
none of them, but for :mod:`hostcb._native`'s constants).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from _hostcb_env import env_flag

from hostcb._native import shared_constant

__all__ = [
  "update",
  "read",
  "subscribe",
  "INLINE",
  "MAX_QUEUE_BYTE_SIZE",
  "STRICT_BARRIER",
  "FAST_DISPATCH",
  "GPU_ENGINE",
  "JAX_ARRAYS",
  "CONSUMER_NICE",
]

INLINE = "jax_host_callback_inline"
MAX_QUEUE_BYTE_SIZE = "jax_host_callback_max_queue_byte_size"
STRICT_BARRIER = "hostcb_strict_barrier"
FAST_DISPATCH = "hostcb_fast_dispatch"  # hostcb 0.2's name: not STRICT_BARRIER
GPU_ENGINE = "hostcb_gpu_engine"
JAX_ARRAYS = "hostcb_callback_jax_arrays"
CONSUMER_NICE = "hostcb_consumer_nice"

_MIN_QUEUE_BYTES = int(16e6)
# The tap consumers' default nice increment (README's device-time table,
# with and without it).
_DEFAULT_CONSUMER_NICE = 10

_lock = threading.Lock()


def _int_from_env(var: str, default: int) -> int:
  raw = os.environ.get(var)
  if raw is None:
    return default
  try:
    return int(float(raw))
  except ValueError:
    raise ValueError(
      f"environment variable {var} must be a number of bytes; got {raw!r}"
    ) from None


def _check(name: str, value: Any) -> Any:
  if name in (INLINE, STRICT_BARRIER, FAST_DISPATCH, GPU_ENGINE, JAX_ARRAYS):
    if not isinstance(value, (bool, int)):
      raise TypeError(f"{name} must be a bool; got {value!r}")
    return bool(value)
  if name == MAX_QUEUE_BYTE_SIZE:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise TypeError(
        f"{MAX_QUEUE_BYTE_SIZE} must be an int number of bytes; got {value!r}"
      )
    value = int(value)
    if value < _MIN_QUEUE_BYTES:
      raise ValueError(
        f"{MAX_QUEUE_BYTE_SIZE} must be at least "
        f"{_MIN_QUEUE_BYTES} bytes; got {value}"
      )
    return value
  if name == CONSUMER_NICE:
    if isinstance(value, bool) or not isinstance(value, int):
      raise TypeError(f"{CONSUMER_NICE} must be an int; got {value!r}")
    if not 0 <= value <= 19:
      raise ValueError(
        f"{CONSUMER_NICE} must be a nice increment from 0 to 19; got {value}"
      )
    return value
  raise KeyError(
    f"unknown hostcb option {name!r}; expected one of "
    f"{INLINE!r}, {MAX_QUEUE_BYTE_SIZE!r}, {STRICT_BARRIER!r}, "
    f"{GPU_ENGINE!r}, {JAX_ARRAYS!r}, {CONSUMER_NICE!r} (or {FAST_DISPATCH!r}, "
    f"hostcb 0.2's name for the opposite of {STRICT_BARRIER!r})"
  )


def _nice_from_env() -> int:
  raw = os.environ.get("HOSTCB_CONSUMER_NICE")
  if raw is None:
    return _DEFAULT_CONSUMER_NICE
  try:
    return _check(CONSUMER_NICE, int(raw))
  except ValueError:
    raise ValueError(
      "environment variable HOSTCB_CONSUMER_NICE must be a nice increment "
      f"from 0 to 19; got {raw!r}"
    ) from None


def _strict_from_env() -> bool:
  if "HOSTCB_STRICT_BARRIER" in os.environ:
    return env_flag("HOSTCB_STRICT_BARRIER", False)
  return not env_flag("HOSTCB_FAST_DISPATCH", True)


_values: dict[str, Any] = {
  INLINE: env_flag("JAX_HOST_CALLBACK_INLINE", False),
  MAX_QUEUE_BYTE_SIZE: _check(
    MAX_QUEUE_BYTE_SIZE,
    _int_from_env(
      "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE",
      shared_constant("DEFAULT_QUEUE_BYTES"),
    ),
  ),
  STRICT_BARRIER: _strict_from_env(),
  GPU_ENGINE: env_flag("HOSTCB_GPU_ENGINE", True),
  JAX_ARRAYS: env_flag("HOSTCB_CALLBACK_JAX_ARRAYS", True),
  CONSUMER_NICE: _nice_from_env(),
}
_subscribers: dict[str, list[Callable[[Any], None]]] = {}


def read(name: str) -> Any:
  """Returns the current value of option ``name``."""
  if name == FAST_DISPATCH:
    return not _values[STRICT_BARRIER]
  try:
    return _values[name]
  except KeyError:
    _check(name, None)  # raises KeyError with the list of names
    raise


def update(name: str, value: Any) -> None:
  """Sets option ``name`` (one of the names above) to ``value``."""
  value = _check(name, value)
  if name == FAST_DISPATCH:
    name, value = STRICT_BARRIER, not value
  with _lock:
    _values[name] = value
    subscribers = list(_subscribers.get(name, ()))
  for notify in subscribers:
    notify(value)


def subscribe(name: str, notify: Callable[[Any], None]) -> None:
  """Calls ``notify(value)`` now and whenever option ``name`` changes."""
  _check(name, read(name))
  with _lock:
    _subscribers.setdefault(name, []).append(notify)
    value = _values[name]
  notify(value)
