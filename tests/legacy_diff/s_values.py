"""Scenarios: what taps receive and return for every kind of value.

Every dtype (eagerly and under jit), Python scalars, empty containers,
zero-size arrays, ``None`` leaves, namedtuples, ``result=`` and PRNG keys.
"""

import collections

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import host_callback as hcb

import registry
from registry import scenario

DTYPES = [
  "bool",
  "int8",
  "int16",
  "int32",
  "int64",
  "uint8",
  "uint16",
  "uint32",
  "uint64",
  "float16",
  "bfloat16",
  "float32",
  "float64",
  "complex64",
  "complex128",
]


def _array(dtype: str):
  if dtype == "bool":
    return np.array([True, False, True])
  return np.array([0, 1, 2], dtype=jnp.dtype(dtype))


def _dtype_scenario(dtype: str, jit: bool):
  def run(ctx):
    x = _array(dtype)
    f = lambda x: hcb.id_tap(ctx.tap, x)
    return (jax.jit(f) if jit else f)(x)

  run.__doc__ = f"A {dtype} array tapped " + (
    "under jit." if jit else "eagerly (its return value too)."
  )
  return run


for _dt in DTYPES:
  registry.add(f"val_dtype_{_dt}_jit", _dtype_scenario(_dt, True), __name__)
  registry.add(f"val_dtype_{_dt}_eager", _dtype_scenario(_dt, False), __name__)


@scenario
def val_python_float_eager(ctx):
  """A Python float tapped eagerly: legacy returns a float32 JAX array."""
  return hcb.id_tap(ctx.tap, 2.5)


@scenario
def val_python_int_eager(ctx):
  """A Python int tapped eagerly."""
  return hcb.id_tap(ctx.tap, 3)


@scenario
def val_numpy_int64_eager_arithmetic(ctx):
  """The issue's example: ``np.array([2**31-1])`` tapped eagerly, then + 1
  (legacy: an int32 JAX array that wraps around)."""
  y = hcb.id_tap(ctx.tap, np.array([2**31 - 1]))
  return y + 1


@scenario
def val_python_scalars_jit(ctx):
  """Python bool, int, float, complex through jit (weak types)."""
  return jax.jit(lambda *a: hcb.id_tap(ctx.tap, a))(True, 3, 2.5, 1j)


@scenario
def val_empty_tuple(ctx):
  """An empty tuple tapped under jit."""
  return jax.jit(lambda x: (hcb.id_tap(ctx.tap, ()), x)[1])(np.float32(1.0))


@scenario
def val_empty_containers_jit(ctx):
  """Empty list, dict and tuple nested in a tapped pytree, under jit."""
  return jax.jit(lambda x: hcb.id_tap(ctx.tap, ([], {}, (), x)))(
    np.float32(1.0)
  )


@scenario
def val_empty_containers_eager(ctx):
  """Empty containers nested in a tapped pytree, eagerly."""
  return hcb.id_tap(ctx.tap, ([], {}, (), np.float32(1.0)))


@scenario
def val_none_leaf(ctx):
  """``None`` inside the tapped pytree (an empty subtree)."""
  return jax.jit(lambda x: hcb.id_tap(ctx.tap, (None, x, [None])))(
    np.float32(1.0)
  )


@scenario
def val_zero_size_arrays(ctx):
  """Zero-size arrays of several shapes and dtypes, under jit."""
  args = (
    np.zeros((0,), np.float32),
    np.zeros((2, 0), np.int32),
    np.zeros((0, 3), np.bool_),
  )
  return jax.jit(lambda *a: hcb.id_tap(ctx.tap, a))(*args)


@scenario
def val_zero_size_vmap(ctx):
  """vmap over a batch of zero-size arrays."""
  return jax.vmap(lambda x: hcb.id_tap(ctx.tap, x * 2))(
    np.zeros((2, 0), np.float32)
  )


@scenario
def val_scalar_shapes(ctx):
  """Rank 0 to 4 arrays in one tap."""
  args = tuple(np.ones((2,) * r, np.float32) * r for r in range(5))
  return jax.jit(lambda a: hcb.id_tap(ctx.tap, a))(args)


Point = collections.namedtuple("Point", ["x", "y"])


@scenario
def val_namedtuple(ctx):
  """A namedtuple keeps its type through the tap."""
  return jax.jit(lambda p: hcb.id_tap(ctx.tap, p))(
    Point(np.float32(1.0), np.int32(2))
  )


@scenario
def val_dict_key_order(ctx):
  """A dict with unsorted keys: the tap gets JAX's (sorted) order."""
  return jax.jit(lambda d: hcb.id_tap(ctx.tap, d))(
    {"b": np.float32(1.0), "a": np.float32(2.0), "c": np.int32(3)}
  )


@scenario
def val_result_param_jit(ctx):
  """``result=``: the tap gets arg, the caller gets result."""
  return jax.jit(lambda x: hcb.id_tap(ctx.tap, x * 2, result=(x, x + 1)))(
    np.float32(1.0)
  )


@scenario
def val_result_param_eager(ctx):
  """``result=`` eagerly: the result object is returned as it is."""
  r = (np.float32(1.0), 2.0)
  out = hcb.id_tap(ctx.tap, np.float32(5.0), result=r)
  hcb.barrier_wait()
  ctx.log("same object:", out is r)
  return out


@scenario
def val_large_array(ctx):
  """A 1 MiB array tapped under jit (values summarized)."""
  got = []
  x = jax.jit(
    lambda x: hcb.id_tap(
      lambda a, t: got.append((a.shape, a.dtype.name, float(a.sum()))), x * 2
    )
  )(np.arange(1 << 18, dtype=np.float32))
  hcb.barrier_wait()
  ctx.log("tap got:", got)
  return float(x.sum())


@scenario
def val_prng_key_raw_jit(ctx):
  """A raw ``jax.random.PRNGKey(0)`` (uint32 data) tapped under jit."""
  k = jax.random.PRNGKey(0)
  return jax.jit(lambda k: hcb.id_tap(ctx.tap, k))(k)


@scenario
def val_prng_key_raw_vmap(ctx):
  """vmap over a stack of raw keys, tapped (not split: JAX changed the split
  values between the versions)."""
  ks = jnp.stack([jax.random.PRNGKey(0), jax.random.PRNGKey(1)])
  return jax.vmap(lambda k: hcb.id_tap(ctx.tap, k))(ks)


@scenario
def val_prng_key_custom_prng_result(ctx):
  """The issue's example: under ``jax.enable_custom_prng()``, a key tapped
  with ``result=k`` under jit."""
  with jax.enable_custom_prng(True):
    k = jax.random.PRNGKey(0)
    out = jax.jit(lambda k: hcb.id_tap(ctx.tap, k, result=k))(k)
    hcb.barrier_wait()
    return jax.random.key_data(out)


@scenario
def val_prng_typed_key_jit(ctx):
  """A typed ``jax.random.key(0)`` tapped under jit: the tap function gets
  the key data."""
  k = jax.random.key(0)
  out = jax.jit(lambda k: hcb.id_tap(ctx.tap, k))(k)
  hcb.barrier_wait()
  return jax.random.key_data(out)


@scenario
def val_prng_typed_key_eager(ctx):
  """A typed ``jax.random.key(1)`` tapped eagerly."""
  out = hcb.id_tap(ctx.tap, jax.random.key(1))
  hcb.barrier_wait()
  return jax.random.key_data(out)


@scenario
def val_prng_typed_key_vmap(ctx):
  """A batch of typed keys tapped under vmap."""
  ks = jax.vmap(jax.random.key)(jnp.arange(2))
  out = jax.vmap(lambda k: hcb.id_tap(ctx.tap, k))(ks)
  hcb.barrier_wait()
  return jax.random.key_data(out)


@scenario
def val_writeable_again(ctx):
  """Tapped arrays of every size (16 bytes to 1 MiB) arrive read-only and
  can be made writeable again; writing to one changes neither the result
  nor a later tap of the same value."""

  def write(a, transforms):
    before = a.flags.writeable
    a.flags.writeable = True
    a[...] = -1
    ctx.log(f"write: n={a.size} writeable={before}->{a.flags.writeable}")

  def check(a, transforms):
    ctx.log(f"later tap: n={a.size} first={a[0]} last={a[-1]}")

  def f(x):
    hcb.id_tap(write, x)
    hcb.id_tap(check, x)
    return x[-1] * 2

  out = [jax.jit(f)(np.arange(n, dtype=np.float32)) for n in (4, 1000, 1 << 18)]
  hcb.barrier_wait()
  return out
