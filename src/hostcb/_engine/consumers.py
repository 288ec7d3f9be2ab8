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

__all__ = [
  "this_thread",
  "is_consumer",
  "in_host_function",
  "host_functions",
  "note_dispatch",
  "dispatches",
]


class _ThisThread(threading.local):
  ordinal: int | None = None  # the device this native consumer serves
  queue: Any = None  # the Python-callback queue this thread serves
  dispatching = False  # its tap function dispatched a computation


this_thread = _ThisThread()

# thread id -> how many io_callback/pure_callback host functions that
# thread is running (absent: none): a computation waits for them, so they
# must not wait for a consumer (which may be waiting for that
# computation).  A dict rather than an attribute of this_thread: entering
# and leaving costs about half as much, once per call of the function.
# The native engine's direct path marks nothing per call: its handler keeps
# the runners it runs (hostcb._engine.native.runs_host_function_call).
host_functions: dict[int, int] = {}


def is_consumer() -> bool:
  """Whether the calling thread runs tap functions (either back end)."""
  t = this_thread
  return t.ordinal is not None or t.queue is not None


# How many tapping computations tap functions have dispatched (only ever
# grows; a barrier compares it before and after it waits: a tap function
# that ran meanwhile may have queued taps behind the barrier's markers).
# Two consumers adding at once may lose one addition, never both: the
# value still changes, which is all that a barrier reads.
_dispatches = 0


def note_dispatch() -> None:
  """A consumer's tap function is about to run a tapping computation."""
  global _dispatches
  _dispatches += 1


def dispatches() -> int:
  """The number of :func:`note_dispatch` calls so far (see above)."""
  return _dispatches


def in_host_function() -> bool:
  """Whether the calling thread runs the host function of an
  ``io_callback``/``pure_callback`` (its computation waits for it)."""
  return threading.get_ident() in host_functions
