"""What hostcb's JAX-API drop-ins share (``hostcb.jax_callbacks`` and
``hostcb.debug``): JAX's own functions, where JAX logs a failed
callback, and the wait for earlier callbacks.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import jax

from hostcb import _jax_internals as ji
from hostcb._engine import barrier_wait as _barrier_wait
from hostcb._engine import wait_for_taps as _wait_for_taps
from hostcb._engine.consumers import is_consumer as _is_consumer


# JAX's own functions, as JAX defined them (the originals, also once
# install() has rebound the names).
_JAX = ji.jax_callback_functions()


debug_logger = logging.getLogger("jax._src.debugging")


# ------------------------------------------------------------- helpers
def jax_function(name: str) -> Callable:
  """JAX's own ``debug_callback``, ``debug_print``, ``io_callback`` or
  ``pure_callback`` (what hostcb hands work back to)."""
  return _JAX[name]


def is_jax_own(callback: Any) -> bool:
  """Whether ``callback`` is defined inside JAX (``jax._src``): Pallas's
  interpreter, ``jax.debug.breakpoint``.  Those keep JAX's implementation:
  they may rely on receiving ``jax.Array`` arguments or on the device
  waiting for them."""
  while isinstance(callback, functools.partial):
    callback = callback.func
  module = getattr(callback, "__module__", None)
  return isinstance(module, str) and module.startswith("jax._src.")


def wait_for_earlier_callbacks(*, raise_failures: bool = False) -> None:
  """Waits until hostcb's callbacks of the computations dispatched so far
  have run, unless called by one of those callbacks (a consumer thread),
  which cannot wait for itself.

  The eager (unstaged) debug callbacks of :mod:`hostcb.debug` wait so, to
  run after them in program order.  With ``raise_failures``, the wait is
  :func:`hostcb.barrier_wait`'s, which then raises what a callback raised
  since the previous barrier: ``jax.effects_barrier()`` waits so
  (:mod:`hostcb.jax_callbacks`)."""
  if _is_consumer():
    return
  if raise_failures:
    _barrier_wait()
  else:
    _wait_for_taps()


def flat_treedef(n: int):
  """The pytree structure of ``n`` flat operands as the engine hands them
  to a target: the array itself for one, else a tuple."""
  return jax.tree_util.tree_structure(0 if n == 1 else (0,) * n)


def bind_as(name: str, prim, *operands, **params):
  """``prim.bind(*operands, **params)`` for JAX's function ``name``
  (``debug_print``, ``io_callback``...): an operand that is not a JAX
  value fails with JAX's error, which names the primitive of JAX's
  function (``name``) where it would name ``prim``."""
  try:
    return prim.bind(*operands, **params)
  except TypeError as e:
    own = f"Error interpreting argument to {prim.name} as a JAX value."
    message = str(e)
    if message.startswith(own):
      raise TypeError(message.replace(prim.name, name)) from e.__cause__
    raise
