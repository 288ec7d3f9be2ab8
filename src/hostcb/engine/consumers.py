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

__all__ = ["this_thread", "is_consumer"]


class _ThisThread(threading.local):
  ordinal: int | None = None  # the device this native consumer serves
  queue: Any = None           # the Python-callback queue this thread serves
  dispatching = False         # its tap function dispatched a computation


this_thread = _ThisThread()


def is_consumer() -> bool:
  """Whether the calling thread runs tap functions (either back end)."""
  t = this_thread
  return t.ordinal is not None or t.queue is not None
