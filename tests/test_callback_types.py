"""hostcb._core.callback_types: what the front ends' callbacks take and give back."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hostcb._core import callback_types


def test_a_typed_prng_key_is_a_key_and_arrays_and_numbers_are_not():
  assert callback_types.is_key(jax.random.key(0))
  assert not callback_types.is_key(jax.random.PRNGKey(0))  # raw uint32 data
  assert not callback_types.is_key(jnp.zeros(3))
  assert not callback_types.is_key(np.float32(1))
  assert not callback_types.is_key(3)


def test_result_avals_maps_each_leaf_and_keeps_the_structure():
  avals, tree = callback_types.result_avals(
    {"a": np.zeros((2, 3), np.float32), "b": (np.int32(1),)},
    lambda leaf: (tuple(leaf.shape), np.dtype(leaf.dtype).name),
  )
  assert avals == (((2, 3), "float32"), ((), "int32"))
  assert tree == jax.tree_util.tree_structure({"a": 0, "b": (0,)})


def test_an_unsupported_vmap_method_gets_jaxs_error():
  e = callback_types.unsupported_vmap("pure_callback", "nope")
  assert isinstance(e, NotImplementedError)
  assert str(e) == (
    "vmap is only supported for the pure_callback primitive when "
    "vmap_method is one of 'sequential', 'sequential_unrolled', "
    "'expand_dims', 'broadcast_all', or 'legacy_vectorized'. "
    "Got vmap_method='nope'."
  )


@pytest.mark.parametrize("method", callback_types.VMAP_METHODS)
def test_every_vmap_method_is_accepted_by_hostcbs_pure_callback(method):
  import hostcb

  f = jax.vmap(
    lambda x: hostcb.pure_callback(
      lambda a: np.asarray(a) * 2,
      jax.ShapeDtypeStruct((), np.float32),
      x,
      vmap_method=method,
    )
  )
  np.testing.assert_array_equal(
    f(jnp.arange(3, dtype=np.float32)), np.array([0, 2, 4], np.float32)
  )
