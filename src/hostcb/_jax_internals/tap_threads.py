"""The JAX config state that marks the threads where tap functions run.

Part of :mod:`hostcb._jax_internals`; checked against jax 0.8.0, 0.10.2 and
0.12.0.1 (``jax._src.config.bool_state`` with ``include_in_jit_key`` and
``include_in_trace_context``).

A computation that a tap function dispatches keeps its runtime token even
in fast-dispatch mode (:mod:`.dispatch`): its dispatch is what tells the
engine that the consumer waits for a computation, so that the taps and
calls of that computation do not wait for the consumer.  The state
``hostcb_in_tap_function`` is True in hostcb's consumer threads
(:func:`running_tap_functions`); it is part of JAX's jit key and trace
context, so a function compiled in both kinds of threads gets one
executable for each.

Importing hostcb creates it, as it defines legacy's two options: it is
the one JAX object that import adds (hostcb's own, False everywhere but in
hostcb's tap threads).  A state in the jit key is part of the key of every
``jax.jit`` call, so creating it later (at the first bind of a hostcb
primitive, say) would change the key of every function compiled before:
each would be traced and compiled again at its next call, the first
tapping function included.  JAX has no way to remove a config state, so
it stays after ``hostcb.uninstall()`` (``hostcb info`` names it).
"""

from __future__ import annotations

from typing import Any

from jax._src import config as _config

from hostcb._jax_internals import patches
from hostcb._jax_internals.versions import require

NAME = "hostcb_in_tap_function"
_WHAT = "to mark the threads where tap functions run"
_state: list[Any] = []  # the state, once created (never removed)


def _create() -> Any:
  with patches.lock:
    if not _state:
      make = require(_config, "bool_state", _WHAT, verb="uses")
      _state.append(
        make(
          name=NAME,
          default=False,
          help="hostcb: set in the threads that run tap functions",
          include_in_jit_key=True,
          include_in_trace_context=True,
        )
      )
    return _state[0]


def created() -> bool:
  """Whether this process has the state (a hostcb primitive was bound)."""
  return bool(_state)


def running_tap_functions() -> Any:
  """A context for a consumer thread's whole life: the state is True in it
  (created here if no primitive was bound before)."""
  return _create()(True)


def in_tap_function() -> bool:
  """Whether this thread runs tap functions now (False where the state
  was never created: no thread has set it)."""
  return bool(_state) and bool(_state[0].value)


_create()
