"""Scenarios: ``jax.pure_callback``."""

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


def _add(x, y):
  """Adds, as the callback sees the shapes (broadcasting)."""
  return np.asarray(x) + np.asarray(y)


@scenario
def pure_eager_value(ctx, api):
  """Outside jit: called once, its result returned."""
  return api.pure_callback(ctx.recorder("pure", _double), F32_3, X3)


@scenario
def pure_jit_value(ctx, api):
  """Under jit: the result flows on."""
  return jax.jit(
    lambda x: api.pure_callback(ctx.recorder("pure", _double), F32_3, x) * 3
  )(X3)


@scenario
def pure_pytree_result(ctx, api):
  """A tuple/dict of results."""

  def cb(x):
    return (np.asarray(x)[:2], {"s": np.asarray(x).sum().astype(np.int32)})

  shapes = (
    jax.ShapeDtypeStruct((2,), jnp.float32),
    {"s": jax.ShapeDtypeStruct((), jnp.int32)},
  )
  return jax.jit(
    lambda x: api.pure_callback(ctx.recorder("pure", cb), shapes, x)
  )(X3)


@scenario
def pure_keyword_arguments(ctx, api):
  """Pytree and keyword arguments."""

  def cb(a, *, b):
    return np.asarray(a[0]) + np.asarray(b["k"])

  return jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", cb), F32_3, [x], b={"k": x[1]}
    )
  )(X3)


@scenario
def pure_unused_result_removed_jit(ctx, api):
  """Under jit, a pure_callback whose result is unused is not called."""

  def f(x):
    api.pure_callback(ctx.recorder("pure", _double), F32_3, x)
    return x + 1

  return jax.jit(f)(X3)


@scenario
def pure_unused_result_eager(ctx, api):
  """Outside jit, an unused pure_callback is called (nothing is traced)."""
  api.pure_callback(ctx.recorder("pure", _double), F32_3, X3)


@scenario
def pure_partly_used_result(ctx, api):
  """One of two results used: called once."""

  def cb(x):
    return np.asarray(x), np.asarray(x) * 2

  return jax.jit(
    lambda x: api.pure_callback(ctx.recorder("pure", cb), (F32_3, F32_3), x)[1]
  )(X3)


@scenario
def pure_unused_in_scan_removed(ctx, api):
  """An unused pure_callback in a scan body is removed too."""

  def body(c, x):
    api.pure_callback(ctx.recorder("pure", _double), F32, x)
    return c + x, None

  return jax.jit(lambda xs: jax.lax.scan(body, 0.0, xs)[0])(X3)


@scenario
def pure_in_scan(ctx, api):
  """A used pure_callback in a scan body: once per step."""

  def body(c, x):
    return c + api.pure_callback(ctx.recorder("pure", _double), F32, x), None

  return jax.jit(lambda xs: jax.lax.scan(body, np.float32(0), xs)[0])(X3)


def _vmapped(ctx, api, method, in_axes=(0, None)):
  f = lambda x, y: api.pure_callback(
    ctx.recorder("pure", _add), F32_3, x, y, vmap_method=method
  )
  return jax.vmap(f, in_axes=in_axes)(X23, X3)


@scenario
def pure_vmap_sequential(ctx, api):
  """``sequential``: once per element, the unbatched argument whole."""
  return _vmapped(ctx, api, "sequential")


@scenario
def pure_vmap_sequential_unrolled(ctx, api):
  """``sequential_unrolled``: the same calls, unrolled."""
  return _vmapped(ctx, api, "sequential_unrolled")


@scenario
def pure_vmap_expand_dims(ctx, api):
  """``expand_dims``: one call, unbatched arguments get an axis of 1."""
  return _vmapped(ctx, api, "expand_dims")


@scenario
def pure_vmap_broadcast_all(ctx, api):
  """``broadcast_all``: one call, unbatched arguments broadcast."""
  return _vmapped(ctx, api, "broadcast_all")


@scenario
def pure_vmap_legacy_vectorized(ctx, api):
  """``legacy_vectorized``: one call, unbatched arguments as they are."""
  return _vmapped(ctx, api, "legacy_vectorized")


@scenario
def pure_vmap_default_method_error(ctx, api):
  """No ``vmap_method``: vmap raises NotImplementedError."""
  return _vmapped(ctx, api, None)


@scenario
def pure_vmap_method_invalid(ctx, api):
  """An unknown ``vmap_method``: ValueError at the call."""
  api.pure_callback(ctx.recorder("pure"), F32_3, X3, vmap_method="loop")


@scenario
def pure_invalid_method_not_vmapped(ctx, api):
  """``vmap_method=None`` without vmap works."""
  return jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", _double), F32_3, x, vmap_method=None
    )
  )(X3)


@scenario
def pure_vmap_sequential_axis_1_jit(ctx, api):
  """``sequential`` under jit, batched on axis 1."""
  f = lambda x: api.pure_callback(
    ctx.recorder("pure", lambda x: np.asarray(x).sum()),
    F32,
    x,
    vmap_method="sequential",
  )
  return jax.jit(jax.vmap(f, in_axes=1))(X23)


@scenario
def pure_vmap_expand_dims_axis_1(ctx, api):
  """``expand_dims``, batched on axis 1 (moved to the front)."""
  f = lambda x: api.pure_callback(
    ctx.recorder("pure", lambda x: np.asarray(x).sum(axis=-1)),
    F32,
    x,
    vmap_method="expand_dims",
  )
  return jax.vmap(f, in_axes=1)(X23)


@scenario
def pure_vmap_nested_expand_dims(ctx, api):
  """Nested vmaps with ``expand_dims``: one call with both axes."""
  f = lambda x, y: api.pure_callback(
    ctx.recorder("pure", _add), F32, x, y, vmap_method="expand_dims"
  )
  inner = jax.vmap(f, in_axes=(0, None))
  return jax.vmap(inner, in_axes=(0, None))(X23, np.float32(10))


@scenario
def pure_vmap_nested_sequential(ctx, api):
  """Nested vmaps with ``sequential``: JAX's order of the calls."""
  f = lambda x: api.pure_callback(
    ctx.recorder("pure", _double), F32, x, vmap_method="sequential"
  )
  return jax.vmap(jax.vmap(f))(X23)


@scenario
def pure_vmap_nested_broadcast_all(ctx, api):
  """Nested vmaps with ``broadcast_all`` and an unbatched scalar."""
  f = lambda x, y: api.pure_callback(
    ctx.recorder("pure", _add), F32, x, y, vmap_method="broadcast_all"
  )
  inner = jax.vmap(f, in_axes=(0, None))
  return jax.vmap(inner, in_axes=(0, None))(X23, np.float32(10))


@scenario
def pure_vmap_pytree_result(ctx, api):
  """``expand_dims`` with a pytree result."""

  def cb(x):
    return {"a": np.asarray(x) * 2, "b": np.asarray(x).sum(-1)}

  f = lambda x: api.pure_callback(
    ctx.recorder("pure", cb),
    {"a": F32_3, "b": F32},
    x,
    vmap_method="expand_dims",
  )
  return jax.vmap(f)(X23)


@scenario
def pure_jvp_error(ctx, api):
  """jvp: ValueError."""
  jax.jvp(
    lambda x: api.pure_callback(ctx.recorder("pure", _double), F32_3, x),
    (X3,),
    (X3,),
  )


@scenario
def pure_grad_error(ctx, api):
  """grad: ValueError."""
  jax.grad(
    lambda x: api.pure_callback(ctx.recorder("pure", _double), F32_3, x).sum()
  )(X3)


@scenario
def pure_linearize_error(ctx, api):
  """linearize: ValueError."""
  jax.linearize(
    lambda x: api.pure_callback(ctx.recorder("pure", _double), F32_3, x), X3
  )


@scenario
def pure_grad_of_unrelated_input(ctx, api):
  """grad with respect to an argument the callback does not use."""

  def f(x, y):
    return (
      api.pure_callback(ctx.recorder("pure", _double), F32_3, y) * x
    ).sum()

  return jax.grad(f)(X3, X3 + 1)


@scenario
def pure_custom_jvp_grad(ctx, api):
  """pure_callback in custom_jvp: differentiable by its rule."""

  @jax.custom_jvp
  def f(x):
    return api.pure_callback(ctx.recorder("sin", lambda x: np.sin(x)), F32_3, x)

  f.defjvp(
    lambda p, t: (
      f(p[0]),
      api.pure_callback(ctx.recorder("cos", lambda x: np.cos(x)), F32_3, p[0])
      * t[0],
    )
  )
  return jax.grad(lambda x: f(x).sum())(X3)


@scenario
def pure_custom_vjp_grad(ctx, api):
  """pure_callback in custom_vjp's fwd and bwd."""

  @jax.custom_vjp
  def f(x):
    return api.pure_callback(ctx.recorder("f", _double), F32_3, x)

  def fwd(x):
    return f(x), x

  def bwd(x, g):
    return (
      api.pure_callback(
        ctx.recorder("bwd", lambda x, g: np.asarray(g) * 2), F32_3, x, g
      ),
    )

  f.defvjp(fwd, bwd)
  return jax.jit(jax.grad(lambda x: f(x).sum()))(X3)


@scenario
def pure_shape_mismatch(ctx, api):
  """A result of the wrong shape, under jit."""
  jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", lambda x: np.zeros((1, 3), np.float32)), F32_3, x
    )
  )(X3)


@scenario
def pure_dtype_mismatch(ctx, api):
  """A result of the wrong dtype, under jit."""
  jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", lambda x: np.zeros(3, np.int8)), F32_3, x
    )
  )(X3)


@scenario
def pure_dtype_mismatch_second_result(ctx, api):
  """The second result of the wrong dtype, outside jit."""
  api.pure_callback(
    ctx.recorder("pure", lambda x: (x, np.zeros(3, bool))), (F32_3, F32_3), X3
  )


@scenario
def pure_count_mismatch(ctx, api):
  """One result where two are expected."""
  jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", _double), (F32_3, F32_3), x
    )
  )(X3)


@scenario
def pure_result_structure_ignored(ctx, api):
  """Only the leaves count: a dict returned where a tuple is expected."""
  return jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", lambda x: {"z": np.float32(1), "a": np.float32(2)}),
      (F32, F32),
      x,
    )
  )(X3)


@scenario
def pure_result_int64_narrowed(ctx, api):
  """An int64 result for int32 is narrowed (no x64)."""
  return jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", lambda x: np.arange(3)),
      jax.ShapeDtypeStruct((3,), jnp.int32),
      x,
    )
  )(X3)


@scenario
def pure_x64_result_spec_error(ctx, api):
  """An int64 result spec without x64: ValueError."""
  api.pure_callback(
    ctx.recorder("pure"), jax.ShapeDtypeStruct((), np.int64), X3
  )


@scenario
def pure_raises_eager(ctx, api):
  """A callback that raises, outside jit."""

  def cb(x):
    raise RuntimeError("pure boom")

  api.pure_callback(cb, F32_3, X3)


@scenario
def pure_raises_jit(ctx, api):
  """A callback that raises under jit."""

  def cb(x):
    raise ZeroDivisionError("pure boom")

  jax.jit(lambda x: api.pure_callback(cb, F32_3, x))(X3)


@scenario
def pure_raises_in_vmap_sequential(ctx, api):
  """A callback that raises at the second element of a sequential vmap."""

  def cb(x):
    if np.asarray(x)[0] > 0:
      raise ValueError(f"bad {np.asarray(x).tolist()}")
    return np.asarray(x)

  f = lambda x: api.pure_callback(cb, F32_3, x, vmap_method="sequential")
  jax.jit(jax.vmap(f))(X23)


@scenario
def pure_no_arguments(ctx, api):
  """A callback without arguments, under jit."""
  return jax.jit(
    lambda: api.pure_callback(ctx.recorder("pure", lambda: np.float32(4)), F32)
  )()


@scenario
def pure_empty_result_shape(ctx, api):
  """A zero-size result."""
  return jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", lambda x: np.zeros((0, 2), np.float32)),
      jax.ShapeDtypeStruct((0, 2), jnp.float32),
      x,
    )
  )(X3)


@scenario
def pure_traced_once_called_each_time(ctx, api):
  """A jitted function with a pure_callback called three times."""
  f = jax.jit(
    lambda x: api.pure_callback(ctx.recorder("pure", _double), F32, x)
  )
  return [f(np.float32(i)) for i in range(3)]


@scenario
def pure_eager_same_callback_twice(ctx, api):
  """The same callback called eagerly twice: called twice."""
  cb = ctx.recorder("pure", _double)
  return [
    api.pure_callback(cb, F32_3, X3),
    api.pure_callback(cb, F32_3, X3 + 1),
  ]


@scenario
def pure_sharding_single_device(ctx, api):
  """``sharding=SingleDeviceSharding``."""
  s = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", _double), F32_3, x, sharding=s
    )
  )(X3)


@scenario
def pure_arg_types(ctx, api):
  """The Python type of the array arguments."""

  def cb(label):
    def f(x):
      ctx.log(f"{label}:", type(x).__name__)
      return np.asarray(x)

    return f

  api.pure_callback(cb("eager"), F32_3, X3)
  jax.jit(lambda x: api.pure_callback(cb("jit"), F32_3, x))(X3)


@scenario
def pure_key_argument(ctx, api):
  """A PRNG key argument under jit: its data."""
  return jax.jit(
    lambda k: api.pure_callback(
      ctx.recorder("pure", lambda k: np.int32(1)),
      jax.ShapeDtypeStruct((), jnp.int32),
      k,
    )
  )(jax.random.key(5))


@scenario
def pure_vmap_in_cond(ctx, api):
  """A sequential pure_callback in a cond under vmap (both branches)."""
  f = lambda p, x: jax.lax.cond(
    p,
    lambda x: api.pure_callback(
      ctx.recorder("t", _double), F32_3, x, vmap_method="sequential"
    ),
    lambda x: x,
    x,
  )
  return jax.vmap(f)(np.array([True, False]), X23)


@scenario
def pure_checkpoint_grad_custom_jvp(ctx, api):
  """checkpoint of a custom_jvp pure_callback under grad: recomputed."""

  @jax.custom_jvp
  def f(x):
    return api.pure_callback(ctx.recorder("f", _double), F32_3, x)

  f.defjvp(lambda p, t: (f(p[0]), 2 * t[0]))
  return jax.grad(lambda x: jax.checkpoint(f)(x).sum())(X3)


@scenario
def pure_result_spec_is_array(ctx, api):
  """The argument itself as ``result_shape_dtypes`` (a tracer)."""
  return jax.jit(
    lambda x: api.pure_callback(ctx.recorder("pure", _double), x, x)
  )(X3)


@scenario
def pure_result_spec_weak_scalar(ctx, api):
  """A weakly typed scalar as the result spec: the result is strong."""
  return jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", lambda x: np.float32(2)), jnp.asarray(1.0), x
    )
  )(X3)


@scenario
def pure_calls_jax_inside(ctx, api):
  """A callback that runs JAX operations and returns a JAX array."""
  return jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", lambda x: jnp.cos(jnp.asarray(x))), F32_3, x
    )
  )(X3)


@scenario
def pure_eval_shape_does_not_call(ctx, api):
  """eval_shape gives the result shapes without calling."""
  return jax.eval_shape(
    lambda x: api.pure_callback(ctx.recorder("pure", _double), {"r": F32_3}, x),
    X3,
  )


@scenario
def pure_vmap_expand_dims_jit_in_scan(ctx, api):
  """``expand_dims`` under jit, inside a scan: one call per step with the
  whole batch."""

  def body(c, x):
    y = jax.vmap(
      lambda v: api.pure_callback(
        ctx.recorder("pure", _double), F32, v, vmap_method="expand_dims"
      )
    )(x)
    return c + y.sum(), None

  return jax.jit(lambda xs: jax.lax.scan(body, np.float32(0), xs)[0])(X23)


@scenario
def pure_aot_compiled(ctx, api):
  """A pure_callback in a function compiled ahead of time."""
  compiled = (
    jax.jit(
      lambda x: api.pure_callback(ctx.recorder("pure", _double), F32_3, x)
    )
    .lower(X3)
    .compile()
  )
  return compiled(X3 + 2)


@scenario
def pure_identical_calls_jit(ctx, api):
  """Two identical pure_callbacks on the same value under jit: how many
  calls reach the host."""
  cb = ctx.recorder("pure", _double)

  def f(x):
    return api.pure_callback(cb, F32_3, x) + api.pure_callback(cb, F32_3, x)

  return jax.jit(f)(X3)


@scenario
def pure_bad_result_spec(ctx, api):
  """A result spec without shape and dtype."""
  api.pure_callback(ctx.recorder("pure"), "f32", X3)


@scenario
def pure_vmap_expand_dims_wrong_shape(ctx, api):
  """``expand_dims`` and a callback that ignores the batch axis: the
  shape error names the batched shape."""
  f = lambda x: api.pure_callback(
    ctx.recorder("pure", lambda x: np.zeros(3, np.float32)),
    F32_3,
    x,
    vmap_method="expand_dims",
  )
  jax.jit(jax.vmap(f))(X23)


@scenario
def pure_vmap_sequential_empty_batch(ctx, api):
  """``sequential`` over an empty batch: never called."""
  f = lambda x: api.pure_callback(
    ctx.recorder("pure", _double), F32_3, x, vmap_method="sequential"
  )
  return jax.vmap(f)(np.zeros((0, 3), np.float32))


@scenario
def pure_vmap_broadcast_all_empty_batch(ctx, api):
  """``broadcast_all`` over an empty batch: one call with empty arrays."""
  f = lambda x, y: api.pure_callback(
    ctx.recorder("pure", _add), F32_3, x, y, vmap_method="broadcast_all"
  )
  return jax.vmap(f, in_axes=(0, None))(np.zeros((0, 3), np.float32), X3)


@scenario
def pure_in_scan_grad_unrelated(ctx, api):
  """grad through a scan whose pure_callback uses only the scanned values."""

  def body(c, x):
    return c * api.pure_callback(ctx.recorder("pure", _double), F32, x), None

  return jax.grad(lambda c: jax.lax.scan(body, c, X3)[0])(np.float32(1))


@scenario
def pure_namedtuple_result(ctx, api):
  """A NamedTuple of result shapes: the result is that NamedTuple."""
  import collections

  Pair = collections.namedtuple("Pair", ["a", "b"])
  return jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", lambda x: (np.asarray(x), np.asarray(x)[0])),
      Pair(F32_3, F32),
      x,
    )
  )(X3)


# ---------------------------------------------------------- program order
# A callback's place in the program is its order, "unordered" or not: a
# pure_callback runs after the callbacks written before it and before those
# written after it (hostcb's effect token orders it).


def _pure_between_callbacks(ctx, api, callback):
  """``debug.callback``, then ``pure_callback(callback)``, then
  ``debug.print`` of its result: the three in program order."""

  def f(x):
    api.debug_callback(ctx.recorder("before"), x)
    y = api.pure_callback(callback, F32, x)
    api.debug_print("after {}", y)
    return y

  return jax.jit(f)(np.float32(1))


@scenario
def pure_between_callbacks_jit(ctx, api):
  """The pure_callback runs after the debug.callback written before it,
  and the debug.print of its result after it."""
  return _pure_between_callbacks(ctx, api, ctx.recorder("pure", _double))


@scenario
def pure_raises_after_callback_jit(ctx, api):
  """A pure_callback that raises: the debug.callback before it has run, and
  the computation fails with the pure_callback's error."""

  def cb(x):
    ctx.log("pure raises")
    raise ValueError("pure boom")

  _pure_between_callbacks(ctx, api, cb)


@scenario
def pure_between_callbacks_nested_jit(ctx, api):
  """The same order where the pure_callback is in a nested jit."""
  inner = jax.jit(
    lambda x: api.pure_callback(ctx.recorder("pure", _double), F32, x)
  )

  def f(x):
    api.debug_callback(ctx.recorder("before"), x)
    y = inner(x)
    api.debug_print("after {}", y)
    return y

  return jax.jit(f)(np.float32(1))


# Before jax 0.12, JAX ran a scan body's pure_callback before the
# debug.callback written above it; jax 0.12 keeps the program's order, as
# hostcb does on every version.
_SCAN_BODY_REORDERED = tuple(map(int, jax.__version__.split(".")[:2])) < (0, 12)


@scenario(
  **(
    dict(
      ours=(
        "in a scan body JAX (before 0.12) runs the pure_callback before "
        "the debug.callback written before it (XLA schedules them as it "
        "likes: nothing orders them); hostcb's effect token keeps the "
        "program's order in every iteration"
      ),
      expect=(
        "before(float32[]=0.0)\n"
        "pure(float32[]=0.0)\n"
        "after 0.0\n"
        "before(float32[]=1.0)\n"
        "pure(float32[]=1.0)\n"
        "after 2.0\n"
        "result: Array(float32[]=2.0, weak=False)\n"
      ),
    )
    if _SCAN_BODY_REORDERED
    else {}
  )
)
def pure_between_callbacks_in_scan(ctx, api):
  """The same order in each iteration of a scan."""

  def body(c, x):
    api.debug_callback(ctx.recorder("before"), x)
    y = api.pure_callback(ctx.recorder("pure", _double), F32, x)
    api.debug_print("after {}", y)
    return c + y, None

  return jax.jit(lambda xs: jax.lax.scan(body, 0.0, xs)[0])(X3[:2])


@scenario
def pure_in_checkpoint_grad_unrelated(ctx, api):
  """grad of a checkpointed function (not jitted) whose pure_callback uses
  only a value that is not differentiated: the backward pass computes the
  callback's result again, so it is called twice."""

  @jax.checkpoint
  def f(x):
    y = api.pure_callback(
      ctx.recorder("pure", _double), F32, jax.lax.stop_gradient(x)
    )
    return jnp.sin(x) * y

  return jax.grad(f)(np.float32(1))
