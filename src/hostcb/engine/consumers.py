"""Which thread is a consumer, of what, and whether it dispatched.

Both back ends run tap functions on consumer threads, one per device.  A
consumer must never wait for itself: a barrier called from a tap function,
a tap made by a tap function into its own full queue, or a ``call`` made by
jitted code that a tap function runs would.  This thread-local state is the
one place that says which thread is a consumer and whether its tap
function dispatched a computation.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["this_thread", "is_consumer", "in_host_function"]


class _ThisThread(threading.local):
  ordinal: int | None = None  # the device this native consumer serves
  queue: Any = None  # the Python-callback queue this thread serves
  dispatching = False  # its tap function dispatched a computation
  # How many io_callback/pure_callback host functions this thread is
  # running: a computation waits for them, so they must not wait for a
  # consumer (which may be waiting for that computation).
  host_functions = 0


this_thread = _ThisThread()


def is_consumer() -> bool:
  """Whether the calling thread runs tap functions (either back end)."""
  t = this_thread
  return t.ordinal is not None or t.queue is not None


def in_host_function() -> bool:
  """Whether the calling thread runs the host function of an
  ``io_callback``/``pure_callback`` (its computation waits for it)."""
  return this_thread.host_functions > 0
