"""Running hostcb's own small computations outside the user's context mesh.

Part of :mod:`hostcb.jax_internals`; checked against jax 0.8.0 and 0.10.2.

``jax.set_mesh(mesh)`` (and ``jax.sharding.use_mesh``) make ``jax.jit``
check every argument's devices against the context mesh: a computation of
hostcb's own that runs on one device at a time (the barrier's
:func:`hostcb.jax_internals.dispatch.drain_this_thread`) would be refused
under a mesh that does not hold that device alone.  jax 0.10 accepts
``jax.set_mesh(None)`` for "no mesh"; jax 0.8 does not, so hostcb sets the
two thread-local states that ``set_mesh`` sets, to the empty meshes that
stand for "no context mesh" in both.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from jax._src import config as _config
from jax._src import mesh as _mesh

from hostcb.jax_internals.versions import require

_WHAT = "to run hostcb's barrier outside the caller's context mesh"
_abstract_state = require(_config, "abstract_mesh_context_manager", _WHAT,
                          verb="uses")
_concrete_state = require(_config, "device_context", _WHAT, verb="uses")
_empty_abstract = require(_mesh, "empty_abstract_mesh", _WHAT, verb="uses")
_empty_concrete = require(_mesh, "empty_concrete_mesh", _WHAT, verb="uses")


@contextlib.contextmanager
def outside_context_mesh() -> Iterator[None]:
  """A context in which this thread has no context mesh; the caller's is
  restored after it."""
  prev_abstract = _abstract_state.swap_local(_empty_abstract)
  prev_concrete = _concrete_state.swap_local(_empty_concrete)
  try:
    yield
  finally:
    _abstract_state.set_local(prev_abstract)
    _concrete_state.set_local(prev_concrete)
