"""Objects that live exactly as long as a compiled executable.

Part of :mod:`hostcb.jax_internals`, the only place that imports ``jax._src``;
checked against jax 0.8.0, 0.10.2 and 0.12.0.1, where the lowering context
of a primitive (``ctx.module_context``, a ``jax._src.interpreters.mlir.
ModuleContext``) has ``add_keepalive(obj)``: JAX appends ``obj`` to the
lowered module's keep-alive list, which the compiled executable holds
(``pxla.UnloadedMeshExecutable.keepalive``) and which goes with it
(``jax.clear_caches()``, the jitted function dropped).  JAX's own
callbacks keep their Python functions alive that way; hostcb keeps the
leases of its engine's target ids (:mod:`hostcb.engine.registry`).

``jax.experimental.serialize_executable.serialize`` pickles that list
with the executable: an object in it that refuses pickling refuses the
serialization.
"""
from __future__ import annotations

from typing import Any

from jax._src.interpreters import mlir as _mlir

from hostcb.jax_internals.versions import require

__all__ = ["keep_alive_with_executable"]

_add = require(getattr(_mlir, "ModuleContext", None), "add_keepalive",
               "to free the host functions of an executable with it",
               verb="uses")


def keep_alive_with_executable(ctx: Any, obj: Any) -> None:
  """Keeps ``obj`` alive as long as the executable that the lowering
  context ``ctx`` (of a primitive's lowering rule) builds."""
  _add(ctx.module_context, obj)
