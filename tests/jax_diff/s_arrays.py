"""Scenarios: the ``jax.Array`` s that the callbacks get, and what code
written for JAX does with them: their type, dtype and weak type,
device, sharding and commitment, ``block_until_ready``, ``.at``, type
promotion, JAX operations on them, keeping or deleting them."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from jax_diff.registry import scenario

X3 = np.arange(3, dtype=np.float32)
X24 = np.arange(8, dtype=np.float32).reshape(2, 4)
F32_3 = jax.ShapeDtypeStruct((3,), jnp.float32)
F32 = jax.ShapeDtypeStruct((), jnp.float32)

_DEVICES = (
  "each device runs its own callbacks, in JAX as in hostcb, in "
  "no set order between devices; the lines are compared as sets"
)


def _describe(x) -> str:
  """What code written for JAX sees of one argument."""
  if not isinstance(x, jax.Array):
    return f"{type(x).__name__} (not a jax.Array)"
  devices = ",".join(f"{d.platform}:{d.id}" for d in x.devices())
  shifted = x.at[...].add(1)
  return " ".join(
    [
      type(x).__name__,
      f"{x.dtype}{list(x.shape)}",
      f"weak={x.weak_type}",
      f"committed={x.committed}",
      f"sharding={type(x.sharding).__name__}",
      f"devices={devices}",
      f"ready_is_self={x.block_until_ready() is x}",
      f"at_add={np.asarray(shifted).tolist()}",
      f"plus_int={(x + 1).dtype}/weak={(x + 1).weak_type}",
      f"times_f16={(x * jnp.float16(2)).dtype}",
      f"sin_device={','.join(str(d.id) for d in jnp.sin(x).devices())}",
      f"numpy_writeable={np.asarray(x).flags.writeable}",
      f"replicated={x.is_fully_replicated}",
      f"deleted={x.is_deleted()}",
    ]
  )


def _describer(ctx, label: str, result=None):
  def callback(*args):
    ctx.log(f"{label}:", " | ".join(_describe(a) for a in args))
    return None if result is None else result(*args)

  return callback


def _same(x, *rest):
  return x


@scenario
def arrays_debug_callback_jit(ctx, api):
  """debug.callback under jit: floats, integers and booleans."""
  jax.jit(lambda x, i: api.debug_callback(_describer(ctx, "jit"), x, i, x > 1))(
    X3, jnp.int32(7)
  )


@scenario
def arrays_debug_callback_eager(ctx, api):
  """debug.callback outside jit: an array and Python numbers (weak)."""
  api.debug_callback(_describer(ctx, "eager"), jnp.asarray(X3), 2, 1.5)


@scenario
def arrays_debug_callback_vmap(ctx, api):
  """debug.callback under vmap and jit: one call per element."""
  jax.jit(jax.vmap(lambda x: api.debug_callback(_describer(ctx, "vmap"), x)))(
    X24
  )


@scenario
def arrays_debug_callback_scan(ctx, api):
  """debug.callback per step of a scan: a scalar carry each step."""

  def step(c, _):
    api.debug_callback(_describer(ctx, "step"), c, ordered=True)
    return c + 1, None

  jax.jit(lambda c: jax.lax.scan(step, c, None, length=3)[0])(jnp.float32(0))


@scenario
def arrays_io_callback_jit(ctx, api):
  """io_callback under jit, its result the argument it got."""
  return jax.jit(
    lambda x: api.io_callback(_describer(ctx, "io", _same), F32_3, x)
  )(X3)


@scenario
def arrays_io_callback_eager(ctx, api):
  """io_callback outside jit."""
  return api.io_callback(_describer(ctx, "io", _same), F32_3, jnp.asarray(X3))


@scenario
def arrays_io_callback_vmap(ctx, api):
  """io_callback under vmap: one call per element."""
  return jax.jit(
    jax.vmap(lambda x: api.io_callback(_describer(ctx, "io", _same), F32, x))
  )(X3)


@scenario
def arrays_pure_callback_jit(ctx, api):
  """pure_callback under jit, its result the argument it got."""
  return jax.jit(
    lambda x: api.pure_callback(_describer(ctx, "pure", _same), F32_3, x)
  )(X3)


@scenario
def arrays_pure_callback_eager(ctx, api):
  """pure_callback outside jit."""
  return api.pure_callback(
    _describer(ctx, "pure", _same), F32_3, jnp.asarray(X3)
  )


@scenario
def arrays_pure_callback_vmap_methods(ctx, api):
  """pure_callback under vmap, with each vmap_method."""
  for method in ("sequential", "expand_dims", "broadcast_all"):
    ctx.log("method", method)
    out = jax.jit(
      jax.vmap(
        lambda x, m=method: api.pure_callback(
          _describer(ctx, method, _same),
          jax.ShapeDtypeStruct(x.shape, x.dtype),
          x,
          vmap_method=m,
        )
      )
    )(X24)
    ctx.show("out", out)


@scenario(unordered=_DEVICES)
def arrays_pmap_debug_callback(ctx, api):
  """debug.callback in pmap: which device each call's argument is on."""
  jax.pmap(
    lambda x: api.debug_callback(_describer(ctx, "pmap"), x),
    devices=jax.devices()[:2],
  )(X24)


@scenario(unordered=_DEVICES)
def arrays_shard_map_io_callback(ctx, api):
  """io_callback in shard_map: each shard's call."""
  mesh = Mesh(np.array(jax.devices()[:2]), ("i",))
  f = jax.shard_map(
    lambda x: api.io_callback(
      _describer(ctx, "shard", _same), jax.ShapeDtypeStruct((1, 4), x.dtype), x
    ),
    mesh=mesh,
    in_specs=P("i"),
    out_specs=P("i"),
  )
  return jax.jit(f)(X24)


@scenario
def arrays_kept_after_the_call(ctx, api):
  """Arguments a callback keeps hold their values after it returns."""
  kept = []
  f = jax.jit(lambda x: api.debug_callback(kept.append, x * 2, ordered=True))
  for i in range(3):
    f(jnp.full((256,), float(i)))
  f(jnp.float32(5))
  ctx.barrier()
  ctx.log("kept", [(type(a).__name__, float(a.sum())) for a in kept])


@scenario
def arrays_deleted_by_the_callback(ctx, api):
  """A callback that deletes its argument: later calls are unaffected."""

  def cb(x):
    ctx.log("got", float(x))
    x.delete()
    ctx.log("deleted", x.is_deleted())

  f = jax.jit(lambda x: api.debug_callback(cb, x, ordered=True))
  f(1.0)
  f(2.0)


@scenario
def arrays_callbacks_asserting_jax_arrays_then_ordered_print(ctx, api):
  """Many callbacks that assert they get jax.Arrays and run JAX operations
  on them (as JAX's test_async_deadlock), then an ordered print in a
  function jitted twice over: nothing left behind fails the print."""
  calls = []

  def cb(x):
    assert isinstance(x, jax.Array), type(x)
    calls.append(float(jnp.asarray(x) + 1))

  def step(c, _):
    api.debug_callback(cb, c)
    return c + 1, None

  jax.jit(lambda c: jax.lax.scan(step, c, None, length=200)[0])(0.0)
  ctx.barrier()
  ctx.log("calls", len(calls), "sum", sum(calls))
  jax.jit(jax.jit(lambda x: api.debug_print("x={x}", x=x, ordered=True)))(3.0)


@scenario
def arrays_with_x64_enabled(ctx, api):
  """Under ``jax.enable_x64(True)``: 64-bit arguments, jitted and eager,
  and the 64-bit results of io_callback and pure_callback."""
  f64 = jax.ShapeDtypeStruct((3,), jnp.float64)
  with jax.enable_x64(True):
    x = jnp.arange(3, dtype=jnp.float64)
    i = jnp.int64(2**40)
    jax.jit(lambda x, i: api.debug_callback(_describer(ctx, "jit"), x, i))(x, i)
    ctx.barrier()
    api.debug_callback(_describer(ctx, "eager"), x, 2)
    ctx.barrier()
    io = jax.jit(
      lambda x: api.io_callback(_describer(ctx, "io", _same), f64, x)
    )(x)
    pure = jax.jit(
      lambda x: api.pure_callback(_describer(ctx, "pure", _same), f64, x)
    )(x)
    ctx.show("io", io)
    ctx.show("pure", pure)


@scenario
def arrays_of_narrow_dtypes(ctx, api):
  """4- and 8-bit integers and floats, and the others JAX has: each
  argument's dtype, values and a JAX operation on it, jitted and eager."""
  dtypes = [
    jnp.int4,
    jnp.uint4,
    jnp.int8,
    jnp.uint8,
    jnp.uint16,
    jnp.float8_e4m3fn,
    jnp.float8_e5m2,
    jnp.bfloat16,
    jnp.float16,
    jnp.complex64,
    jnp.bool_,
  ]

  def cb(*xs):
    for x in xs:
      doubled = x + x if x.dtype != jnp.bool_ else x | x
      ctx.log(
        type(x).__name__,
        str(x.dtype),
        np.asarray(x.astype(jnp.float32).real).tolist(),
        str(doubled.dtype),
        np.asarray(doubled.astype(jnp.float32).real).tolist(),
      )

  x = jnp.array([0, 1, 3], jnp.int32)
  operands = [x.astype(d) for d in dtypes]
  jax.jit(lambda *xs: api.debug_callback(cb, *xs))(*operands)
  ctx.barrier()
  api.debug_callback(cb, *operands)
