"""Running hostcb's own small computations outside the user's context mesh.

Part of :mod:`hostcb._jax_internals`; checked against jax 0.8.0, 0.10.2 and
0.12.0.1.

``jax.set_mesh(mesh)`` (and ``jax.sharding.use_mesh``) make ``jax.jit``
check every argument's devices against the context mesh: a computation of
hostcb's own that runs on one device at a time (the barrier's
:func:`hostcb._jax_internals.dispatch.drain_this_thread`) would be refused
under a mesh that does not hold that device alone.  From jax 0.10 on,
``jax.set_mesh(None)`` (public) is the context without a mesh.  jax 0.8's
``set_mesh`` takes only a mesh; there hostcb sets the two thread-local
states that ``set_mesh`` sets (private, looked up only on such a JAX) to
the empty meshes that stand for "no context mesh".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ContextManager

import jax

from hostcb._jax_internals.versions import require

_WHAT = "to run hostcb's barrier outside the caller's context mesh"


def outside_context_mesh() -> ContextManager[Any]:
  """A context in which this thread has no context mesh; the caller's is
  restored after it."""
  set_mesh = require(jax, "set_mesh", _WHAT, verb="uses")
  try:
    return set_mesh(None)  # sets no mesh now; its __exit__ restores
  except ValueError as e:
    if "Expected mesh of type" not in str(e):
      raise  # e.g. called inside jit: not hostcb's case to hide
  return _without_mesh_states()


@contextlib.contextmanager
def _without_mesh_states() -> Iterator[None]:
  """jax 0.8: ``set_mesh``'s two thread-local states, emptied."""
  from jax._src import config as _config  # noqa: PLC0415  (jax 0.8 only)
  from jax._src import mesh as _mesh  # noqa: PLC0415

  abstract = require(
    _config, "abstract_mesh_context_manager", _WHAT, verb="uses"
  )
  concrete = require(_config, "device_context", _WHAT, verb="uses")
  empty_abstract = require(_mesh, "empty_abstract_mesh", _WHAT, verb="uses")
  empty_concrete = require(_mesh, "empty_concrete_mesh", _WHAT, verb="uses")
  prev_abstract = abstract.swap_local(empty_abstract)
  prev_concrete = concrete.swap_local(empty_concrete)
  try:
    yield
  finally:
    abstract.set_local(prev_abstract)
    concrete.set_local(prev_concrete)
