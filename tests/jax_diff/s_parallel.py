"""Scenarios: callbacks in pmap, shard_map and sharded jit (2 devices)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_diff.registry import scenario

X2 = np.arange(2, dtype=np.float32)
X24 = np.arange(8, dtype=np.float32).reshape(2, 4)
F32 = jax.ShapeDtypeStruct((), jnp.float32)
F32_4 = jax.ShapeDtypeStruct((4,), jnp.float32)

_DEVICES = (
  "each device runs its own callbacks, in JAX as in hostcb, in "
  "no set order between devices; the lines are compared as sets"
)


def _mesh():
  return Mesh(np.array(jax.devices()[:2]), ("i",))


def _double(x, *rest):
  return np.asarray(x) * 2


@scenario(unordered=_DEVICES)
def pmap_debug_callback(ctx, api):
  """pmap: one call per device, with its slice."""
  return jax.pmap(
    lambda x: (api.debug_callback(ctx.recorder("cb"), x), x * 2)[1],
    devices=jax.devices()[:2],
  )(X24)


@scenario(unordered=_DEVICES)
def pmap_debug_print(ctx, api):
  """A print in pmap."""
  jax.pmap(lambda x: api.debug_print("x={}", x), devices=jax.devices()[:2])(X24)


@scenario(unordered=_DEVICES)
def pmap_io_callback(ctx, api):
  """io_callback in pmap: per device."""
  return jax.pmap(
    lambda x: api.io_callback(ctx.recorder("io", _double), F32_4, x),
    devices=jax.devices()[:2],
  )(X24)


@scenario(unordered=_DEVICES)
def pmap_pure_callback(ctx, api):
  """pure_callback in pmap: per device."""
  return jax.pmap(
    lambda x: api.pure_callback(ctx.recorder("pure", _double), F32_4, x),
    devices=jax.devices()[:2],
  )(X24)


@scenario(unordered=_DEVICES)
def pmap_vmap_debug_callback(ctx, api):
  """vmap inside pmap: per device, per element."""
  jax.pmap(
    jax.vmap(
      lambda x: api.debug_callback(ctx.recorder("cb"), x, ordered=False)
    ),
    devices=jax.devices()[:2],
  )(X24.reshape(2, 2, 2))


@scenario(unordered=_DEVICES)
def pmap_ordered_io_callback(ctx, api):
  """An ordered io_callback in pmap."""
  jax.pmap(
    lambda x: api.io_callback(ctx.recorder("io"), None, x, ordered=True),
    devices=jax.devices()[:2],
  )(X24)


@scenario(unordered=_DEVICES)
def shard_map_debug_callback(ctx, api):
  """shard_map: the callback runs per shard."""
  f = jax.shard_map(
    lambda x: (api.debug_callback(ctx.recorder("cb"), x), x)[1],
    mesh=_mesh(),
    in_specs=P("i"),
    out_specs=P("i"),
  )
  return jax.jit(f)(X24)


@scenario(unordered=_DEVICES)
def shard_map_debug_print(ctx, api):
  """A print in shard_map: per shard."""
  f = jax.shard_map(
    lambda x: api.debug_print("shard {}", x) or x,
    mesh=_mesh(),
    in_specs=P("i"),
    out_specs=P("i"),
  )
  jax.jit(f)(X24)


@scenario(unordered=_DEVICES)
def shard_map_io_callback(ctx, api):
  """io_callback in shard_map: per shard."""
  f = jax.shard_map(
    lambda x: api.io_callback(
      ctx.recorder("io", _double), jax.ShapeDtypeStruct((1, 4), jnp.float32), x
    ),
    mesh=_mesh(),
    in_specs=P("i"),
    out_specs=P("i"),
  )
  return jax.jit(f)(X24)


@scenario(unordered=_DEVICES)
def shard_map_pure_callback(ctx, api):
  """pure_callback in shard_map: per shard."""
  f = jax.shard_map(
    lambda x: api.pure_callback(
      ctx.recorder("pure", _double),
      jax.ShapeDtypeStruct((1, 4), jnp.float32),
      x,
    ),
    mesh=_mesh(),
    in_specs=P("i"),
    out_specs=P("i"),
  )
  return jax.jit(f)(X24)


def _sharded(x):
  return jax.device_put(x, NamedSharding(_mesh(), P("i")))


@scenario
def sharded_jit_debug_callback(ctx, api):
  """jit over a sharded array: called once, with the whole value."""
  return jax.jit(
    lambda x: (api.debug_callback(ctx.recorder("cb"), x), x + 1)[1]
  )(_sharded(X24))


@scenario
def sharded_jit_debug_print(ctx, api):
  """A print under jit over a sharded array: the whole value, once."""
  jax.jit(lambda x: api.debug_print("{}", x * 2))(_sharded(X24))


@scenario(unordered=_DEVICES)
def sharded_jit_debug_callback_partitioned(ctx, api):
  """``partitioned=True``: once per shard, without gathering."""
  jax.jit(
    lambda x: api.debug_callback(ctx.recorder("cb"), x, partitioned=True)
  )(_sharded(X24))


@scenario(unordered=_DEVICES)
def sharded_jit_debug_print_partitioned(ctx, api):
  """A partitioned print: once per shard."""
  jax.jit(lambda x: api.debug_print("{}", x, partitioned=True))(_sharded(X24))


@scenario
def sharded_jit_io_callback(ctx, api):
  """io_callback under jit over a sharded array: once, whole value."""
  return jax.jit(
    lambda x: api.io_callback(
      ctx.recorder("io", _double), jax.ShapeDtypeStruct((2, 4), jnp.float32), x
    )
  )(_sharded(X24))


@scenario
def sharded_jit_pure_callback(ctx, api):
  """pure_callback under jit over a sharded array: once."""
  return jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", _double),
      jax.ShapeDtypeStruct((2, 4), jnp.float32),
      x,
    )
  )(_sharded(X24))


@scenario
def sharded_jit_ordered_io_callback(ctx, api):
  """An ordered io_callback under jit over a sharded array."""
  f = jax.jit(
    lambda x: api.io_callback(ctx.recorder("io"), None, x.sum(), ordered=True)
  )
  f(_sharded(X24))
  f(_sharded(X24 + 1))


@scenario
def io_callback_sharding_second_device(ctx, api):
  """io_callback with ``sharding`` naming the second device: what the
  callback receives (the result is not shown: JAX 0.10.2 returns zeros
  here, which is not behaviour to pin down)."""
  s = jax.sharding.SingleDeviceSharding(jax.devices()[1])
  jax.jit(
    lambda x: api.io_callback(
      ctx.recorder("io", _double), F32_4, x.sum(0), sharding=s
    )
  )(_sharded(X24))


@scenario
def pmap_ordered_debug_callback(ctx, api):
  """An ordered debug callback in pmap: refused, as JAX refuses it."""
  jax.pmap(
    lambda x: api.debug_callback(ctx.recorder("cb"), x, ordered=True),
    devices=jax.devices()[:2],
  )(X24)


@scenario
def sharded_jit_ordered_debug_callback(ctx, api):
  """An ordered debug callback under jit over a sharded array: refused."""
  f = jax.jit(
    lambda x: api.debug_callback(ctx.recorder("cb"), x.sum(), ordered=True)
  )
  f(_sharded(X24))
