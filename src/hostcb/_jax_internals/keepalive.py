"""Objects that live exactly as long as a compiled executable; primitive
parameters that JAX's caches hold weakly.

Part of :mod:`hostcb._jax_internals`, the only place that imports ``jax._src``.
Checked against the sources of jax 0.8.0 and 0.10.2 (jax 0.12.0.1 was not
at hand: ``make check-newest`` runs these paths there, and a missing
symbol raises :class:`~hostcb._jax_internals.versions.MissingJaxInternal`).
In both, the lowering context
of a primitive (``ctx.module_context``, a ``jax._src.interpreters.mlir.
ModuleContext``) has ``add_keepalive(obj)``: JAX appends ``obj`` to the
lowered module's keep-alive list, which the compiled executable holds
(``pxla.UnloadedMeshExecutable.keepalive``) and which goes with it
(``jax.clear_caches()``, the jitted function dropped).  JAX's own
callbacks keep their Python functions alive that way; hostcb keeps the
leases of its engine's target ids (:mod:`hostcb._engine.host_functions`).

``jax.experimental.serialize_executable.serialize`` pickles that list
with the executable: an object in it that refuses pickling refuses the
serialization.

JAX caches the abstract evaluation of each primitive by its parameters
(``jax._src.interpreters.partial_eval._cached_abstract_eval``, a
``multi_weakref_lru_cache`` of up to 2048 entries, cleared by
``jax.clear_caches()``).  It holds a parameter weakly when it is callable
(JAX's own callbacks) or its type is in ``jax._src.util.
weakref_cache_key_types``; any other parameter strongly, so that a tap's
target (and the function it holds, and what that captured) would outlive
every program that uses it until 2048 other evaluations pushed it out.
:func:`hold_weakly_in_jax_caches` adds hostcb's target types to that set
(on the first bind of a hostcb primitive, undone by ``hostcb.uninstall()``,
through :mod:`.patches`), so that the entry goes with the last jaxpr that
holds the target, as JAX's own callbacks' do.
"""

from __future__ import annotations

from typing import Any

from jax._src import util as _util
from jax._src.interpreters import mlir as _mlir

from hostcb._jax_internals import patches
from hostcb._jax_internals.versions import require

__all__ = ["keep_alive_with_executable", "hold_weakly_in_jax_caches"]

_add = require(
  getattr(_mlir, "ModuleContext", None),
  "add_keepalive",
  "to free the host functions of an executable with it",
  verb="uses",
)


def keep_alive_with_executable(ctx: Any, obj: Any) -> None:
  """Keeps ``obj`` alive as long as the executable that the lowering
  context ``ctx`` (of a primitive's lowering rule) builds."""
  _add(ctx.module_context, obj)


def hold_weakly_in_jax_caches(*classes: type) -> None:
  """Makes JAX's caches keyed by primitive parameters hold instances of
  ``classes`` weakly (see above), from the first bind of a hostcb
  primitive on (:func:`.patches.when_first_needed`; undone by
  ``hostcb.uninstall()``).  Called at import; changes nothing by itself.
  The classes must support weak references."""

  def install() -> None:
    types = require(
      _util,
      "weakref_cache_key_types",
      "so that JAX's caches do not keep tap functions alive",
    )
    added = [cls for cls in classes if cls not in types]
    types.update(added)
    patches.record(
      "weak cache keys",
      "jax._src.util.weakref_cache_key_types",
      lambda: types.difference_update(added),
    )

  patches.when_first_needed(install)
