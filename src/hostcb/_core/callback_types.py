"""What the front ends' callbacks take and give back, defined once.

Shared by :mod:`hostcb.host_callback`, :mod:`hostcb.debug`,
:mod:`hostcb.jax_callbacks` and :mod:`hostcb.buffer_callback`: which
operands are PRNG keys, the abstract values of a callback's declared
result, and the ``vmap_method`` values that JAX's callbacks accept.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

__all__ = ["is_key", "result_avals", "VMAP_METHODS", "unsupported_vmap"]

# The vmap_method values of JAX's pure_callback and buffer_callback (None,
# pure_callback's default, is no method: vmap then raises).
VMAP_METHODS = (
  "sequential",
  "sequential_unrolled",
  "expand_dims",
  "broadcast_all",
  "legacy_vectorized",
)


def is_key(x: Any) -> bool:
  """Whether ``x`` is a JAX PRNG key (a typed key array or its tracer)."""
  dtype = getattr(x, "dtype", None)
  return (
    dtype is not None
    and not isinstance(dtype, np.dtype)
    and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
  )


def result_avals(
  result_shape: Any, leaf_aval: Callable[[Any], Any]
) -> tuple[tuple, Any]:
  """The abstract values of a callback's declared result, one per leaf of
  the pytree ``result_shape`` (``leaf_aval(leaf)``, which checks the leaf
  as its front end requires), and the result's tree structure."""
  leaves, treedef = jax.tree_util.tree_flatten(result_shape)
  return tuple(leaf_aval(leaf) for leaf in leaves), treedef


def unsupported_vmap(primitive: str, method: Any) -> NotImplementedError:
  """JAX's error for ``vmap`` of a callback whose ``vmap_method`` is none
  of :data:`VMAP_METHODS` (``primitive``: JAX's name of its primitive)."""
  return NotImplementedError(
    f"vmap is only supported for the {primitive} primitive when "
    "vmap_method is one of 'sequential', 'sequential_unrolled', "
    "'expand_dims', 'broadcast_all', or 'legacy_vectorized'. "
    f"Got vmap_method={method!r}."
  )
