"""Scenarios for ``buffer_callback``: hostcb's against JAX's own.

Both run in the JAX 0.10.2 environment: the runner's ``jax-buffer`` gives
the scenarios ``jax.experimental.buffer_callback.buffer_callback``,
``hostcb-buffer`` gives ``hostcb.buffer_callback``.  A scenario writes what
the callback sees (types, shapes, dtypes, writeability, stage) and what
comes out; the two outputs must be identical.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from registry import scenario


def _bc():
  """The ``buffer_callback`` function under test."""
  if os.environ.get("HOSTCB_DIFF_IMPL") == "hostcb-buffer":
    import hostcb

    return hostcb.buffer_callback
  from jax.experimental.buffer_callback import buffer_callback

  return buffer_callback


X = np.arange(6, dtype=np.float32).reshape(2, 3)


def _describe(ctx, what, buf):
  arr = np.asarray(buf)
  ctx.log(
    f"{what}: shape={buf.shape} dtype={buf.dtype} "
    f"array={arr.dtype}{list(arr.shape)} writeable={arr.flags.writeable}"
  )


@scenario
def buf_add_one(ctx):
  """The docstring's example: out = x + 1, eagerly."""

  def cb(c, out, x):
    np.asarray(out)[...] = np.asarray(x) + 1

  x = jnp.array(41, dtype=jnp.int32)
  return _bc()(cb, jax.ShapeDtypeStruct.like(x))(x)


@scenario
def buf_jit_two_outputs(ctx):
  """Two operands, two outputs, under jit; what the callback receives."""

  def cb(c, outs, x, y):
    _describe(ctx, "x", x)
    _describe(ctx, "y", y)
    _describe(ctx, "out0", outs[0])
    np.asarray(outs[0])[...] = np.asarray(x) * 2
    np.asarray(outs[1])[...] = np.asarray(y).sum()

  f = _bc()(
    cb,
    (
      jax.ShapeDtypeStruct(X.shape, X.dtype),
      jax.ShapeDtypeStruct((), jnp.int32),
    ),
  )
  return jax.jit(f)(X, np.arange(4, dtype=np.int32))


@scenario
def buf_pytree_result(ctx):
  """A dict of result shapes."""

  def cb(c, out, x):
    np.asarray(out["a"])[...] = np.asarray(x)
    np.asarray(out["b"])[...] = 7

  f = _bc()(
    cb,
    {
      "a": jax.ShapeDtypeStruct(X.shape, X.dtype),
      "b": jax.ShapeDtypeStruct((2,), jnp.int8),
    },
  )
  return jax.jit(f)(X)


@scenario
def buf_ctx_stage_and_repr_types(ctx):
  """``ctx.stage()`` and the types the callback gets."""

  def cb(c, out, x):
    ctx.log("stage:", c.stage())
    ctx.log("types:", type(c).__name__, type(out).__name__, type(x).__name__)
    np.asarray(out)[...] = np.asarray(x)

  return jax.jit(_bc()(cb, jax.ShapeDtypeStruct(X.shape, X.dtype)))(X)


@scenario
def buf_ctx_stream_cpu(ctx):
  """``ctx.stream`` on CPU raises ``jax.errors.JaxRuntimeError`` whose
  message contains "XLA FFI GPU context is not available"."""

  def cb(c, out, x):
    try:
      c.stream
      ctx.log("stream: no error")
    except jax.errors.JaxRuntimeError as e:
      ctx.log(
        "JaxRuntimeError; GPU context message:",
        "XLA FFI GPU context is not available" in str(e),
      )
    except Exception as e:  # noqa: BLE001
      ctx.log("other error:", type(e).__name__)
    np.asarray(out)[...] = np.asarray(x)

  return jax.jit(_bc()(cb, jax.ShapeDtypeStruct(X.shape, X.dtype)))(X)


@scenario
def buf_vmap_sequential(ctx):
  """``vmap_method="sequential"``: one call per batch element."""

  def cb(c, out, x):
    ctx.log("call with shape", x.shape)
    np.asarray(out)[...] = np.asarray(x) * 10

  f = _bc()(
    cb, jax.ShapeDtypeStruct((3,), jnp.float32), vmap_method="sequential"
  )
  return jax.vmap(f)(X)


@scenario
def buf_vmap_broadcast_all(ctx):
  """``vmap_method="broadcast_all"``: one call with the whole batch."""

  def cb(c, out, x):
    ctx.log("call with shape", x.shape, "out", out.shape)
    np.asarray(out)[...] = np.asarray(x) * 10

  f = _bc()(
    cb, jax.ShapeDtypeStruct((3,), jnp.float32), vmap_method="broadcast_all"
  )
  return jax.vmap(f)(X)


@scenario
def buf_vmap_expand_dims(ctx):
  """``vmap_method="expand_dims"`` with an unbatched second operand."""

  def cb(c, out, x, y):
    ctx.log("shapes", x.shape, y.shape, "out", out.shape)
    np.asarray(out)[...] = np.asarray(x) + np.asarray(y)

  f = _bc()(
    cb, jax.ShapeDtypeStruct((3,), jnp.float32), vmap_method="expand_dims"
  )
  return jax.vmap(f, in_axes=(0, None))(X, np.ones(3, np.float32))


@scenario
def buf_vmap_none(ctx):
  """No ``vmap_method``: vmap is an error."""

  def cb(c, out, x):
    np.asarray(out)[...] = np.asarray(x)

  f = _bc()(cb, jax.ShapeDtypeStruct((3,), jnp.float32))
  return jax.vmap(f)(X)


@scenario
def buf_alias(ctx):
  """``input_output_aliases={0: 0}``: the output is the input buffer."""

  def cb(c, out, x):
    _describe(ctx, "x", x)
    _describe(ctx, "out", out)
    np.asarray(out)[...] += 1

  f = _bc()(
    cb, jax.ShapeDtypeStruct(X.shape, X.dtype), input_output_aliases={0: 0}
  )
  return jax.jit(f)(X)


@scenario
def buf_alias_bad_shape(ctx):
  """An alias between buffers of different shapes is an error."""

  def cb(c, out, x):
    pass

  f = _bc()(
    cb, jax.ShapeDtypeStruct((4,), jnp.float32), input_output_aliases={0: 0}
  )
  return jax.jit(f)(X)


@scenario
def buf_side_effect_unused(ctx):
  """``has_side_effect=True``: runs even if its result is unused."""

  def cb(c, out, x):
    ctx.log("side effect ran")

  f = _bc()(cb, jax.ShapeDtypeStruct((), jnp.float32), has_side_effect=True)
  return jax.jit(lambda x: (f(x), x)[1])(X)


@scenario
def buf_no_side_effect_unused(ctx):
  """``has_side_effect=False``: dropped when its result is unused."""

  def cb(c, out, x):
    ctx.log("pure ran")

  f = _bc()(cb, jax.ShapeDtypeStruct((), jnp.float32))
  return jax.jit(lambda x: (f(x), x)[1])(X)


@scenario
def buf_grad_error(ctx):
  """grad through a buffer_callback is an error."""

  def cb(c, out, x):
    np.asarray(out)[...] = np.asarray(x)

  f = _bc()(cb, jax.ShapeDtypeStruct((), jnp.float32))
  return jax.grad(f)(np.float32(1.0))


@scenario
def buf_callback_raises(ctx):
  """An exception in the callback fails the computation."""

  def cb(c, out, x):
    raise ValueError("cb failed")

  f = _bc()(cb, jax.ShapeDtypeStruct(X.shape, X.dtype))
  return jax.jit(f)(X)


@scenario
def buf_zero_size(ctx):
  """Zero-size operand and result."""

  def cb(c, out, x):
    _describe(ctx, "x", x)

  z = np.zeros((0, 2), np.float32)
  return jax.jit(_bc()(cb, jax.ShapeDtypeStruct(z.shape, z.dtype)))(z)


@scenario
def buf_dtypes(ctx):
  """Operands of several dtypes."""

  def cb(c, out, *xs):
    for i, x in enumerate(xs):
      _describe(ctx, f"x{i}", x)

  xs = [
    np.ones(2, d)
    for d in (np.bool_, np.int8, np.uint32, np.float16, np.complex64)
  ]
  return jax.jit(_bc()(cb, ()))(*xs)


@scenario
def buf_two_meshes(ctx):
  """Operands on NamedShardings of two different meshes over the same
  devices (axes ('a','b') and ('x','y'))."""
  devs = np.array(jax.devices()[:2]).reshape(2, 1)
  m1 = Mesh(devs, ("a", "b"))
  m2 = Mesh(devs, ("x", "y"))
  x = jax.device_put(X, NamedSharding(m1, P("a")))
  y = jax.device_put(X + 1, NamedSharding(m2, P("x")))

  def cb(c, out, x, y):
    np.asarray(out)[...] = np.asarray(x) + np.asarray(y)

  f = _bc()(cb, jax.ShapeDtypeStruct(X.shape, X.dtype))
  return jax.jit(f)(x, y)


@scenario
def buf_result_shape_number(ctx):
  """A result_shape_dtypes that is not a shape/dtype: the error."""

  def cb(c, out, x):
    pass

  return jax.jit(_bc()(cb, 1.0))(X)


@scenario
def buf_in_scan(ctx):
  """buffer_callback inside a scan body."""

  def cb(c, out, x):
    np.asarray(out)[...] = np.asarray(x) + 1

  f = _bc()(cb, jax.ShapeDtypeStruct((), jnp.float32))
  return jax.lax.scan(
    lambda c, _: (f(c), None), np.float32(0.0), None, length=3
  )[0]


@scenario
def buf_in_place_output_writeable(ctx):
  """Inputs are read-only, outputs writeable (seen through NumPy)."""

  def cb(c, out, x):
    try:
      np.asarray(x)[...] = 0
      ctx.log("input write: ok")
    except ValueError as e:
      ctx.log("input write:", type(e).__name__)
    np.asarray(out)[...] = 3

  return jax.jit(_bc()(cb, jax.ShapeDtypeStruct(X.shape, X.dtype)))(X)
