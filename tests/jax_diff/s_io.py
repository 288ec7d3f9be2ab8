"""Scenarios: ``jax.experimental.io_callback``."""

import jax
import jax.numpy as jnp
import numpy as np

from jax_diff.registry import scenario

X3 = np.arange(3, dtype=np.float32)
X23 = np.arange(6, dtype=np.float32).reshape(2, 3)
F32_3 = jax.ShapeDtypeStruct((3,), jnp.float32)
F32 = jax.ShapeDtypeStruct((), jnp.float32)


def _double(x, *rest, **kw):
  return np.asarray(x) * 2


@scenario
def io_eager_value(ctx, api):
  """Outside jit: called once, its result returned."""
  return api.io_callback(ctx.recorder("io", _double), F32_3, X3)


@scenario
def io_jit_value(ctx, api):
  """Under jit: the result flows on."""
  f = jax.jit(
    lambda x: api.io_callback(ctx.recorder("io", _double), F32_3, x) + 1
  )
  return f(X3)


@scenario
def io_pytree_result(ctx, api):
  """A dict of results with several dtypes."""

  def cb(x):
    return {
      "a": np.asarray(x).sum(),
      "b": (np.ones(2, np.int32), np.asarray(x) > 0),
    }

  shapes = {
    "a": F32,
    "b": (
      jax.ShapeDtypeStruct((2,), jnp.int32),
      jax.ShapeDtypeStruct((3,), jnp.bool_),
    ),
  }
  return jax.jit(lambda x: api.io_callback(ctx.recorder("io", cb), shapes, x))(
    X3
  )


@scenario
def io_none_result(ctx, api):
  """``result_shape_dtypes=None``: no result."""
  return jax.jit(lambda x: api.io_callback(ctx.recorder("io"), None, x))(X3)


@scenario
def io_pytree_and_keyword_arguments(ctx, api):
  """Pytree positional arguments and keyword arguments."""

  def cb(d, *, scale):
    return np.asarray(d["x"]) * np.asarray(scale)

  return jax.jit(
    lambda x: api.io_callback(
      ctx.recorder("io", cb), F32_3, {"x": x, "y": [x[0]]}, scale=np.float32(3)
    )
  )(X3)


@scenario
def io_python_scalar_argument(ctx, api):
  """Python numbers as arguments (weak 0-d arrays)."""
  return jax.jit(
    lambda x: api.io_callback(
      ctx.recorder("io", lambda *a: np.float32(1)), F32, x[0], 2, 0.5
    )
  )(X3)


@scenario
def io_string_argument_error(ctx, api):
  """A string argument: not a JAX type."""
  api.io_callback(ctx.recorder("io"), None, "text")


@scenario
def io_dtypes(ctx, api):
  """Arguments and results of several dtypes."""

  def cb(a, b, c, d):
    return (
      np.asarray(a) + 1,
      np.asarray(b),
      np.asarray(c),
      np.asarray(d).astype(np.uint8),
    )

  shapes = (
    jax.ShapeDtypeStruct((3,), jnp.int8),
    jax.ShapeDtypeStruct((3,), jnp.bfloat16),
    jax.ShapeDtypeStruct((3,), jnp.complex64),
    jax.ShapeDtypeStruct((3,), jnp.uint8),
  )
  return jax.jit(
    lambda x: api.io_callback(
      ctx.recorder("io", cb),
      shapes,
      x.astype(jnp.int8),
      x.astype(jnp.bfloat16),
      x + 1j,
      x > 0,
    )
  )(X3)


@scenario
def io_unused_result_still_called(ctx, api):
  """Under jit, an io_callback whose result is unused still runs."""

  def f(x):
    api.io_callback(ctx.recorder("io", _double), F32_3, x)
    return x

  return jax.jit(f)(X3)


@scenario
def io_ordered_sequence(ctx, api):
  """Ordered io_callbacks run in program order."""

  def f(x):
    for i in range(5):
      x = x + api.io_callback(
        ctx.recorder(f"io{i}", _double), F32_3, x, ordered=True
      )
    return x

  return jax.jit(f)(X3)


@scenario
def io_ordered_independent(ctx, api):
  """Ordered io_callbacks without data dependence: program order."""

  def f(x):
    for i in range(4):
      api.io_callback(ctx.recorder(f"io{i}"), None, x[i % 3], ordered=True)

  jax.jit(f)(X3)


@scenario
def io_ordered_across_calls(ctx, api):
  """Ordered io_callbacks of successive calls, in call order."""
  f = jax.jit(
    lambda i: api.io_callback(ctx.recorder("io"), None, i, ordered=True)
  )
  for i in range(4):
    f(np.int32(i))


@scenario
def io_in_scan(ctx, api):
  """In a scan: once per step, in order."""

  def body(c, x):
    return c + api.io_callback(
      ctx.recorder("io", lambda c, x: np.asarray(c) + np.asarray(x)), F32, c, x
    ), None

  return jax.jit(lambda xs: jax.lax.scan(body, np.float32(0), xs)[0])(X3)


@scenario
def io_in_while(ctx, api):
  """In a while loop's body."""

  def body(c):
    return api.io_callback(
      ctx.recorder("io", lambda c: np.asarray(c) * 2),
      jax.ShapeDtypeStruct((), jnp.int32),
      c,
    )

  return jax.jit(lambda c: jax.lax.while_loop(lambda c: c < 10, body, c))(
    np.int32(1)
  )


@scenario
def io_in_cond(ctx, api):
  """In a cond branch: only when taken."""
  f = jax.jit(
    lambda p, x: jax.lax.cond(
      p,
      lambda x: api.io_callback(ctx.recorder("io", _double), F32_3, x),
      lambda x: x,
      x,
    )
  )
  f(False, X3)
  ctx.barrier()
  return f(True, X3)


@scenario
def io_vmap_unordered_sequential(ctx, api):
  """vmap of an unordered io_callback: once per element, in order."""
  return jax.vmap(
    lambda x: api.io_callback(ctx.recorder("io", _double), F32_3, x)
  )(X23)


@scenario
def io_vmap_unordered_jit(ctx, api):
  """vmap under jit: once per element, in order (a loop)."""
  return jax.jit(
    jax.vmap(lambda x: api.io_callback(ctx.recorder("io", _double), F32_3, x))
  )(X23)


@scenario
def io_vmap_unbatched_argument(ctx, api):
  """vmap with an unbatched argument: passed whole each time."""
  return jax.vmap(
    lambda x, y: api.io_callback(
      ctx.recorder("io", lambda x, y: np.asarray(x) + np.asarray(y)[0]),
      F32_3,
      x,
      y,
    ),
    in_axes=(0, None),
  )(X23, X3)


@scenario
def io_vmap_axis_1(ctx, api):
  """vmap over axis 1 of the argument."""
  return jax.vmap(
    lambda x: api.io_callback(
      ctx.recorder("io", lambda x: np.asarray(x).sum()), F32, x
    ),
    in_axes=1,
  )(X23)


@scenario
def io_vmap_nested(ctx, api):
  """Nested vmaps: JAX's order."""
  return jax.vmap(
    jax.vmap(lambda x: api.io_callback(ctx.recorder("io", _double), F32, x))
  )(X23)


@scenario
def io_vmap_ordered_error(ctx, api):
  """vmap of an ordered io_callback: ValueError."""
  jax.vmap(
    lambda x: api.io_callback(
      ctx.recorder("io", _double), F32_3, x, ordered=True
    )
  )(X23)


@scenario
def io_jvp_error(ctx, api):
  """jvp: ValueError."""
  jax.jvp(
    lambda x: api.io_callback(ctx.recorder("io", _double), F32_3, x),
    (X3,),
    (X3,),
  )


@scenario
def io_grad_error(ctx, api):
  """grad: ValueError."""
  jax.grad(
    lambda x: api.io_callback(ctx.recorder("io", _double), F32_3, x).sum()
  )(X3)


@scenario
def io_grad_of_unrelated_input(ctx, api):
  """grad with respect to an argument the io_callback does not use."""

  def f(x, y):
    return (api.io_callback(ctx.recorder("io", _double), F32_3, y) * x).sum()

  return jax.grad(f)(X3, X3 + 1)


@scenario
def io_custom_jvp_grad(ctx, api):
  """An io_callback inside custom_jvp differentiates by the rule."""

  @jax.custom_jvp
  def f(x):
    return api.io_callback(ctx.recorder("io", _double), F32_3, x)

  f.defjvp(lambda p, t: (f(p[0]), 2 * t[0]))
  return jax.grad(lambda x: f(x).sum())(X3)


@scenario
def io_shape_mismatch(ctx, api):
  """A result of the wrong shape, under jit."""
  jax.jit(
    lambda x: api.io_callback(
      ctx.recorder("io", lambda x: np.zeros(4, np.float32)), F32_3, x
    )
  )(X3)


@scenario
def io_dtype_mismatch(ctx, api):
  """A result of the wrong dtype, under jit."""
  jax.jit(
    lambda x: api.io_callback(
      ctx.recorder("io", lambda x: np.zeros(3, np.int32)), F32_3, x
    )
  )(X3)


@scenario
def io_count_mismatch(ctx, api):
  """Two results where one is expected."""
  jax.jit(
    lambda x: api.io_callback(ctx.recorder("io", lambda x: (x, x)), F32_3, x)
  )(X3)


@scenario
def io_count_mismatch_eager(ctx, api):
  """No result where one is expected, outside jit."""
  api.io_callback(ctx.recorder("io"), F32_3, X3)


@scenario
def io_result_float64_narrowed(ctx, api):
  """A float64 result for a float32 one is narrowed (no x64)."""
  return jax.jit(
    lambda x: api.io_callback(
      ctx.recorder("io", lambda x: np.asarray(x, np.float64) / 3), F32_3, x
    )
  )(X3)


@scenario
def io_result_python_scalar(ctx, api):
  """A Python float for a float32 scalar, and an int for int32."""
  shapes = (F32, jax.ShapeDtypeStruct((), jnp.int32))
  return jax.jit(
    lambda x: api.io_callback(
      ctx.recorder("io", lambda x: (1.25, 7)), shapes, x
    )
  )(X3)


@scenario
def io_result_list_for_tuple(ctx, api):
  """A list returned where a tuple of results is expected."""
  shapes = (F32, F32)
  return jax.jit(
    lambda x: api.io_callback(
      ctx.recorder("io", lambda x: [np.float32(1), np.float32(2)]), shapes, x
    )
  )(X3)


@scenario
def io_x64_result_spec_error(ctx, api):
  """A float64 result spec without x64: ValueError at the call."""
  api.io_callback(ctx.recorder("io"), jax.ShapeDtypeStruct((), np.float64), X3)


@scenario
def io_raises_eager(ctx, api):
  """A callback that raises, outside jit."""

  def cb(x):
    raise ValueError("io boom")

  api.io_callback(cb, F32_3, X3)


@scenario
def io_raises_jit(ctx, api):
  """A callback that raises under jit: the error reaches the caller."""

  def cb(x):
    raise ValueError("io boom")

  jax.jit(lambda x: api.io_callback(cb, F32_3, x) + 1)(X3)


@scenario
def io_raises_jit_ordered(ctx, api):
  """An ordered callback that raises under jit."""

  def cb(x):
    raise KeyError("io boom")

  jax.jit(lambda x: api.io_callback(cb, None, x, ordered=True))(X3)


@scenario
def io_raises_then_next_call_works(ctx, api):
  """After a failed call, the next call of the same function works."""

  def cb(x):
    if np.asarray(x)[0] < 0:
      raise ValueError("negative")
    return np.asarray(x)

  f = jax.jit(lambda x: api.io_callback(cb, F32_3, x))
  ctx.attempt("first", lambda: f(-X3 - 1))
  return f(X3)


@scenario
def io_arg_types(ctx, api):
  """The Python type of the array arguments."""

  def cb(label):
    def f(x):
      ctx.log(f"{label}:", type(x).__name__)
      return np.asarray(x)

    return f

  api.io_callback(cb("eager"), F32_3, X3)
  jax.jit(lambda x: api.io_callback(cb("jit"), F32_3, x))(X3)


@scenario
def io_sharding_single_device(ctx, api):
  """``sharding=SingleDeviceSharding`` of the first device."""
  s = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.jit(
    lambda x: api.io_callback(ctx.recorder("io", _double), F32_3, x, sharding=s)
  )(X3)


@scenario
def io_key_argument_jit(ctx, api):
  """A PRNG key argument under jit."""
  return jax.jit(
    lambda k: api.io_callback(
      ctx.recorder("io", lambda k: np.int32(0)),
      jax.ShapeDtypeStruct((), jnp.int32),
      k,
    )
  )(jax.random.key(3))


@scenario
def io_key_argument_eager(ctx, api):
  """A PRNG key argument outside jit."""
  return api.io_callback(
    ctx.recorder("io", lambda k: np.int32(0)),
    jax.ShapeDtypeStruct((), jnp.int32),
    jax.random.key(3),
  )


@scenario
def io_result_spec_is_array(ctx, api):
  """The argument itself as ``result_shape_dtypes`` (an array)."""
  return jax.jit(lambda x: api.io_callback(ctx.recorder("io", _double), x, x))(
    X3
  )


@scenario
def io_calls_jax_inside(ctx, api):
  """A callback that runs JAX operations and returns a JAX array."""
  return jax.jit(
    lambda x: api.io_callback(
      ctx.recorder("io", lambda x: jnp.sin(jnp.asarray(x))), F32_3, x
    )
  )(X3)


@scenario
def io_ordered_eager_sequence(ctx, api):
  """Ordered io_callbacks outside jit, one after the other."""
  for i in range(3):
    api.io_callback(ctx.recorder("io"), None, np.int32(i), ordered=True)


@scenario
def io_make_jaxpr_does_not_call(ctx, api):
  """Tracing does not call the callback."""
  f = lambda x: api.io_callback(ctx.recorder("io", _double), F32_3, x)
  jax.make_jaxpr(f)(X3)
  return jax.eval_shape(f, X3)


@scenario
def io_aot_compiled(ctx, api):
  """An io_callback in a function compiled ahead of time."""
  compiled = (
    jax.jit(lambda x: api.io_callback(ctx.recorder("io", _double), F32_3, x))
    .lower(X3)
    .compile()
  )
  return compiled(X3 + 1)


@scenario
def io_empty_tuple_result(ctx, api):
  """``result_shape_dtypes=()``: an empty tuple back."""
  return jax.jit(
    lambda x: api.io_callback(ctx.recorder("io", lambda x: ()), (), x)
  )(X3)


@scenario
def io_in_checkpoint(ctx, api):
  """An io_callback in a checkpointed function, no differentiation."""
  f = jax.checkpoint(
    lambda x: api.io_callback(ctx.recorder("io", _double), F32_3, x)
  )
  return jax.jit(f)(X3)


@scenario
def io_in_checkpoint_grad_unrelated(ctx, api):
  """grad through a checkpointed function whose io_callback uses only a
  non-differentiated argument."""

  @jax.checkpoint
  def f(x, y):
    return (api.io_callback(ctx.recorder("io", _double), F32_3, y) * x).sum()

  return jax.grad(f)(X3, X3 + 1)


@scenario
def io_in_custom_vjp_fwd(ctx, api):
  """An io_callback in a custom_vjp's forward rule, under grad."""

  @jax.custom_vjp
  def f(x):
    return x * 2

  def fwd(x):
    api.io_callback(ctx.recorder("fwd"), None, x)
    return x * 2, None

  f.defvjp(fwd, lambda _, g: (2 * g,))
  return jax.grad(lambda x: f(x).sum())(X3)


@scenario
def io_in_cond_under_vmap_batched_predicate(ctx, api):
  """vmap of a cond with an io_callback, batched predicate."""
  f = lambda p, x: jax.lax.cond(
    p,
    lambda x: api.io_callback(ctx.recorder("io", _double), F32_3, x),
    lambda x: x,
    x,
  )
  return jax.vmap(f)(np.array([True, False]), X23)


@scenario
def io_in_while_under_vmap_batched_predicate(ctx, api):
  """vmap of a while loop with an io_callback, batched predicate."""
  body = lambda c: api.io_callback(
    ctx.recorder("io", lambda c: np.asarray(c) + 1),
    jax.ShapeDtypeStruct((), jnp.int32),
    c,
  )
  return jax.vmap(lambda c: jax.lax.while_loop(lambda c: c < 3, body, c))(
    np.array([0, 2], np.int32)
  )


@scenario
def io_in_scan_under_vmap(ctx, api):
  """vmap of a scan with an io_callback: per element and step."""

  def body(c, x):
    return c + api.io_callback(ctx.recorder("io", _double), F32, x), None

  return jax.vmap(lambda xs: jax.lax.scan(body, np.float32(0), xs)[0])(X23)


@scenario
def io_ordered_in_cond_under_vmap(ctx, api):
  """vmap of a cond with an ordered io_callback, batched predicate."""
  f = lambda p, x: jax.lax.cond(
    p,
    lambda x: api.io_callback(
      ctx.recorder("io", _double), F32_3, x, ordered=True
    ),
    lambda x: x,
    x,
  )
  return jax.vmap(f)(np.array([True, False]), X23)


@scenario
def io_ordered_in_checkpoint_grad_unrelated(ctx, api):
  """grad through a checkpointed function with an ordered io_callback of
  a non-differentiated argument."""

  @jax.checkpoint
  def f(x, y):
    return (
      api.io_callback(ctx.recorder("io", _double), F32_3, y, ordered=True) * x
    ).sum()

  return jax.grad(f)(X3, X3 + 1)


@scenario
def io_in_cond_under_vmap_unbatched_predicate(ctx, api):
  """vmap of a cond with an io_callback, unbatched predicate: a cond of
  the batched branch (io per element)."""
  f = lambda p, x: jax.lax.cond(
    p,
    lambda x: api.io_callback(ctx.recorder("io", _double), F32_3, x),
    lambda x: x,
    x,
  )
  return jax.vmap(f, in_axes=(None, 0))(True, X23)


@scenario
def io_callback_not_callable(ctx, api):
  """A callback that is not callable: fails when called, under jit."""
  jax.jit(lambda x: api.io_callback(3, F32_3, x))(X3)


@scenario
def io_in_scan_grad_unrelated(ctx, api):
  """grad through a scan whose io_callback uses only the scanned values,
  not the differentiated carry."""

  def body(c, x):
    return c * api.io_callback(ctx.recorder("io", _double), F32, x), None

  return jax.grad(lambda c: jax.lax.scan(body, c, X3)[0])(np.float32(1))
