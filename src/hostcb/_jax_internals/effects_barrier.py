"""``jax.effects_barrier()`` that also waits for hostcb's taps and calls.

Part of :mod:`hostcb._jax_internals`, the only place that imports ``jax._src``.
Checked against jax 0.8.0, 0.10.2 and 0.12.0.1, where ``jax.effects_barrier`` is
``jax._src.api.effects_barrier``: a function that waits for the runtime
tokens of the computations that the calling thread dispatched (JAX's own
ordered callbacks).  hostcb's callbacks run on its own consumer threads,
which that function knows nothing about.

:func:`patch_effects_barrier` (on the first bind of a hostcb primitive, not
at import; :mod:`.patches` undoes it) rebinds the public name
``jax.effects_barrier`` to a function that first does what JAX's does, then calls the waiter it is
given (hostcb's barrier).  Only the public name: JAX's own callers of its
barrier (``jax.clear_backends``) keep JAX's function, so that a failed tap
cannot interrupt them.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, ContextManager

import jax
from jax._src import api as _api

from hostcb._jax_internals import patches
from hostcb._jax_internals.versions import CHECKED_RANGE

__all__ = ["patch_effects_barrier", "jax_effects_barrier"]


def jax_effects_barrier() -> Callable[[], None]:
  """JAX's own ``effects_barrier``, also once the public name is patched."""
  original = getattr(_api, "effects_barrier", None)
  if original is None:
    raise RuntimeError(
      f"hostcb: jax {jax.__version__} has no jax._src.api.effects_barrier, "
      "which hostcb wraps so that jax.effects_barrier() also waits for "
      f"hostcb's callbacks (hostcb is checked against {CHECKED_RANGE})"
    )
  return original


def patch_effects_barrier(
  also_wait: Callable[[], None],
  around_jax: Callable[[], ContextManager] = contextlib.nullcontext,
) -> None:
  """Makes ``jax.effects_barrier()`` call ``also_wait()`` after JAX's own
  wait, which runs inside ``around_jax()`` (recorded in :mod:`.patches`,
  which undoes it; a second call while it is in place changes nothing).
  Called on the first bind of a hostcb primitive, not at import."""
  original = jax_effects_barrier()
  if patches.is_installed("effects barrier"):
    return
  current = getattr(jax, "effects_barrier", None)
  if current is not original:
    raise RuntimeError(
      f"hostcb: in jax {jax.__version__}, jax.effects_barrier is not "
      "jax._src.api.effects_barrier, which hostcb expects to wrap "
      f"(checked against {CHECKED_RANGE})"
    )

  @functools.wraps(original)
  def effects_barrier():
    with around_jax():
      original()
    also_wait()

  effects_barrier._hostcb_waiter = also_wait
  effects_barrier.__doc__ = (
    "Waits until the computations dispatched so far have completed their "
    "side effects: JAX's own ordered callbacks, and (hostcb) every tap and "
    "call of hostcb's, such as hostcb.debug.print; raises "
    "hostcb.CallbackException if one of hostcb's id_tap or call functions "
    "failed since the previous barrier, else JaxRuntimeError, as JAX's "
    "failed computation, if a hostcb.debug.callback failed and no read "
    "raised it yet."
  )
  patches.install("effects barrier", jax, "effects_barrier", effects_barrier)
