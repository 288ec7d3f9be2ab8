"""The two legacy knobs of ``host_callback``, and hostcb's fast dispatch.

Each knob is read from its environment variable when hostcb is imported and
can be changed later from Python, in any of three equivalent ways::

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

``hostcb_fast_dispatch`` (environment: ``HOSTCB_FAST_DISPATCH``)
    hostcb's own, not legacy's.  Compile tapping functions that run on one
    device so that ``jax.jit`` dispatches them on its C++ fast path, about
    as fast as the same function without taps (1.5x instead of about 15x
    its dispatch time on CPU).  Taps keep every guarantee but one:
    ``barrier_wait`` waits for the computations that the calling thread
    dispatched (and for any that already finished), not for a one-device
    computation that another thread dispatched and that is still running.
    In this mode a function over several devices that taps (``pmap``,
    sharded ``jit``, ``shard_map``) returns from its dispatch once its
    device work is done, which keeps later taps after its taps.
    Default ``False``.  Changing it clears JAX's compilation caches.
"""
from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["update", "read", "INLINE", "MAX_QUEUE_BYTE_SIZE", "FAST_DISPATCH"]

INLINE = "jax_host_callback_inline"
MAX_QUEUE_BYTE_SIZE = "jax_host_callback_max_queue_byte_size"
FAST_DISPATCH = "hostcb_fast_dispatch"

_MIN_QUEUE_BYTES = int(16e6)
_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off", ""}

_lock = threading.Lock()


def _bool_from_env(var: str, default: bool) -> bool:
  raw = os.environ.get(var)
  if raw is None:
    return default
  value = raw.strip().lower()
  if value in _TRUE:
    return True
  if value in _FALSE:
    return False
  raise ValueError(f"environment variable {var} must be a boolean such as "
                   f"'1', 'true', '0' or 'false'; got {raw!r}")


def _int_from_env(var: str, default: int) -> int:
  raw = os.environ.get(var)
  if raw is None:
    return default
  try:
    return int(float(raw))
  except ValueError:
    raise ValueError(f"environment variable {var} must be a number of bytes; "
                     f"got {raw!r}") from None


def _check(name: str, value: Any) -> Any:
  if name in (INLINE, FAST_DISPATCH):
    if not isinstance(value, (bool, int)):
      raise TypeError(f"{name} must be a bool; got {value!r}")
    return bool(value)
  if name == MAX_QUEUE_BYTE_SIZE:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise TypeError(f"{MAX_QUEUE_BYTE_SIZE} must be an int number of bytes;"
                      f" got {value!r}")
    value = int(value)
    if value < _MIN_QUEUE_BYTES:
      raise ValueError(f"{MAX_QUEUE_BYTE_SIZE} must be at least "
                       f"{_MIN_QUEUE_BYTES} bytes; got {value}")
    return value
  raise KeyError(f"unknown hostcb option {name!r}; expected one of "
                 f"{INLINE!r}, {MAX_QUEUE_BYTE_SIZE!r}, {FAST_DISPATCH!r}")


_values: dict[str, Any] = {
    INLINE: _bool_from_env("JAX_HOST_CALLBACK_INLINE", False),
    MAX_QUEUE_BYTE_SIZE: _check(
        MAX_QUEUE_BYTE_SIZE,
        _int_from_env("JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE", int(256e6))),
    FAST_DISPATCH: _bool_from_env("HOSTCB_FAST_DISPATCH", False),
}


def read(name: str) -> Any:
  """Returns the current value of option ``name``."""
  try:
    return _values[name]
  except KeyError:
    _check(name, None)  # raises KeyError with the list of names
    raise


def update(name: str, value: Any) -> None:
  """Sets option ``name`` (one of the names above) to ``value``."""
  value = _check(name, value)
  with _lock:
    _values[name] = value
  if name == MAX_QUEUE_BYTE_SIZE:
    from hostcb import runtime
    runtime.set_max_queue_bytes(value)
  elif name == FAST_DISPATCH:
    from hostcb import jax_internals
    jax_internals.set_fast_dispatch(value)
