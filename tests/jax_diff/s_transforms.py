"""Scenarios: debug callbacks and prints under vmap, autodiff, remat."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_diff.registry import scenario

X3 = np.arange(3, dtype=np.float32)
X23 = np.arange(6, dtype=np.float32).reshape(2, 3)

_XLA_ORDER = (
  "JAX's unordered callbacks that do not depend on each other "
  "run in the order XLA schedules them, which varies (hostcb "
  "runs them in program order); the lines are compared as sets"
)


# ---------------------------------------------------------------- vmap
@scenario
def vmap_cb_eager_per_element(ctx, api):
  """An eager vmap calls the callback once per element, in order."""
  jax.vmap(lambda x: api.debug_callback(ctx.recorder("cb"), x))(X23)


@scenario(unordered=_XLA_ORDER)
def vmap_cb_jit_per_element(ctx, api):
  """vmap under jit: once per element."""
  jax.jit(jax.vmap(lambda x: api.debug_callback(ctx.recorder("cb"), x)))(X23)


@scenario
def vmap_cb_jit_ordered_per_element(ctx, api):
  """vmap under jit of an ordered callback: once per element, in order."""
  jax.jit(
    jax.vmap(
      lambda x: api.debug_callback(ctx.recorder("cb"), x, x.sum(), ordered=True)
    )
  )(X23)


@scenario
def vmap_cb_unbatched_argument(ctx, api):
  """``in_axes=(0, None)``: the unbatched argument is passed whole."""
  jax.vmap(
    lambda x, y: api.debug_callback(ctx.recorder("cb"), x, y), in_axes=(0, None)
  )(X3, X23)


@scenario
def vmap_cb_batch_axis_1(ctx, api):
  """``in_axes=1``: the elements are the columns."""
  jax.vmap(lambda x: api.debug_callback(ctx.recorder("cb"), x), in_axes=1)(X23)


@scenario
def vmap_cb_batched_after_op_axis(ctx, api):
  """A value whose batch axis moved (a transpose inside vmap)."""

  def f(x):
    y = jnp.outer(x, jnp.ones(2))
    api.debug_callback(ctx.recorder("cb"), y.T, x[0])

  jax.vmap(f, in_axes=1)(X23)


@scenario
def vmap_cb_nested_eager_order(ctx, api):
  """Nested eager vmaps: the order of JAX's unrolling (inner index
  slowest)."""
  jax.vmap(jax.vmap(lambda x: api.debug_callback(ctx.recorder("cb"), x)))(X23)


@scenario
def vmap_cb_nested_jit_ordered(ctx, api):
  """Nested vmaps under jit, ordered: JAX's order."""
  jax.jit(
    jax.vmap(
      jax.vmap(
        lambda x: api.debug_callback(ctx.recorder("cb"), x, ordered=True)
      )
    )
  )(X23)


@scenario
def vmap_cb_nested_unbatched_inner(ctx, api):
  """Nested vmaps where the inner one leaves an argument unbatched."""
  f = jax.vmap(
    lambda x, y: api.debug_callback(ctx.recorder("cb"), x, y), in_axes=(0, None)
  )
  jax.vmap(f, in_axes=(None, 0))(X3, np.array([10.0, 20.0], np.float32))


@scenario
def vmap_cb_static_and_pytree(ctx, api):
  """vmap with a static argument and a dict."""
  jax.vmap(
    lambda x: api.debug_callback(
      ctx.recorder("cb"), "tag", {"v": x, "s": x.sum()}
    )
  )(X23)


@scenario
def vmap_print_eager(ctx, api):
  """vmap of a print: one line per element."""
  jax.vmap(lambda x: api.debug_print("x={x} s={s}", x=x, s=x.sum()))(X23)


@scenario
def vmap_print_jit_ordered(ctx, api):
  """vmap of an ordered print under jit."""
  jax.jit(jax.vmap(lambda x: api.debug_print("{}", x, ordered=True)))(X23)


@scenario
def vmap_of_jit_ordered(ctx, api):
  """vmap of a jitted function with an ordered callback."""
  f = jax.jit(lambda x: api.debug_callback(ctx.recorder("cb"), x, ordered=True))
  jax.vmap(f)(X23)


@scenario
def vmap_cb_size_one(ctx, api):
  """A batch of one element."""
  jax.vmap(lambda x: api.debug_callback(ctx.recorder("cb"), x))(X23[:1])


@scenario
def vmap_cb_result_of_vmap(ctx, api):
  """The vmapped function's result is unaffected by the callback."""

  def f(x):
    api.debug_callback(ctx.recorder("cb"), x)
    return x * 2

  return jax.vmap(f)(X23)


# ------------------------------------------------------------ autodiff
def _sin_with_cb(ctx, api, what="cb", ordered=False):
  def f(x):
    api.debug_callback(ctx.recorder(what), x, ordered=ordered)
    return jnp.sin(x).sum()

  return f


@scenario
def jvp_cb_primal_only(ctx, api):
  """jvp: the callback gets the primal value, once."""
  return jax.jvp(_sin_with_cb(ctx, api), (X3,), (np.ones(3, np.float32),))


@scenario
def grad_cb_eager(ctx, api):
  """grad: called once, with the primal."""
  return jax.grad(_sin_with_cb(ctx, api))(X3)


@scenario
def grad_cb_jit(ctx, api):
  """jit of grad."""
  return jax.jit(jax.grad(_sin_with_cb(ctx, api)))(X3)


@scenario
def grad_of_jit_cb(ctx, api):
  """grad of a jitted function."""
  return jax.grad(jax.jit(_sin_with_cb(ctx, api)))(X3)


@scenario
def grad_print(ctx, api):
  """A print under grad prints the primal."""

  def f(x):
    api.debug_print("x={}", x)
    return (x * x).sum()

  return jax.grad(f)(X3)


@scenario
def grad_cb_of_intermediate(ctx, api):
  """A callback of an intermediate value, under grad."""

  def f(x):
    y = jnp.cos(x) * 2
    api.debug_callback(ctx.recorder("cb"), y)
    return (y * x).sum()

  return jax.grad(f)(X3)


@scenario
def grad_of_grad_cb(ctx, api):
  """Second derivative: how often the callback runs."""

  def f(x):
    api.debug_callback(ctx.recorder("cb"), x)
    return jnp.sin(x) * x

  return jax.grad(jax.grad(f))(np.float32(0.5))


@scenario
def value_and_grad_cb(ctx, api):
  """value_and_grad."""
  return jax.value_and_grad(_sin_with_cb(ctx, api))(X3)


@scenario
def linearize_cb(ctx, api):
  """linearize calls it once; applying the linear function does not."""
  y, f_jvp = jax.linearize(_sin_with_cb(ctx, api), X3)
  ctx.show("primal", y)
  ctx.show("tangent", f_jvp(np.ones(3, np.float32)))
  return f_jvp(np.full(3, 2, np.float32))


@scenario
def vjp_cb(ctx, api):
  """vjp: called at the forward pass only."""
  y, pullback = jax.vjp(_sin_with_cb(ctx, api), X3)
  ctx.show("primal", y)
  return pullback(np.float32(1))


@scenario
def jacfwd_cb(ctx, api):
  """jacfwd (vmap of jvp): how often the callback runs."""

  def f(x):
    api.debug_callback(ctx.recorder("cb"), x)
    return jnp.sin(x)

  return jax.jacfwd(f)(X3)


@scenario
def jacrev_cb(ctx, api):
  """jacrev (vmap of vjp)."""

  def f(x):
    api.debug_callback(ctx.recorder("cb"), x)
    return jnp.sin(x)

  return jax.jacrev(f)(X3)


@scenario
def grad_cb_ordered_jit(ctx, api):
  """An ordered callback under jit of grad."""
  return jax.jit(jax.grad(_sin_with_cb(ctx, api, ordered=True)))(X3)


@scenario
def grad_vmap_cb(ctx, api):
  """vmap of grad (per-example gradients)."""

  def f(x):
    api.debug_callback(ctx.recorder("cb"), x)
    return jnp.sin(x).sum()

  return jax.vmap(jax.grad(f))(X23)


# ------------------------------------------- custom_jvp / custom_vjp
def _custom_jvp(ctx, api):
  @jax.custom_jvp
  def f(x):
    api.debug_callback(ctx.recorder("primal"), x)
    return jnp.sin(x)

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,) = primals
    (t,) = tangents
    api.debug_callback(ctx.recorder("jvp"), x, t)
    return f(x), jnp.cos(x) * t

  return f


@scenario
def custom_jvp_cb_call(ctx, api):
  """A custom_jvp function called plainly: its callback runs."""
  return jax.jit(_custom_jvp(ctx, api))(X3)


@scenario
def custom_jvp_cb_grad(ctx, api):
  """grad of a custom_jvp function with callbacks in f and its rule."""
  return jax.grad(lambda x: _custom_jvp(ctx, api)(x).sum())(X3)


@scenario
def custom_jvp_cb_jvp(ctx, api):
  """jvp of a custom_jvp function."""
  return jax.jvp(_custom_jvp(ctx, api), (X3,), (np.ones(3, np.float32),))


def _custom_vjp(ctx, api):
  @jax.custom_vjp
  def f(x):
    api.debug_callback(ctx.recorder("primal"), x)
    return jnp.sin(x)

  def fwd(x):
    api.debug_callback(ctx.recorder("fwd"), x)
    return jnp.sin(x), jnp.cos(x)

  def bwd(res, g):
    api.debug_callback(ctx.recorder("bwd"), res, g)
    return (res * g,)

  f.defvjp(fwd, bwd)
  return f


@scenario
def custom_vjp_cb_call(ctx, api):
  """A custom_vjp function called plainly."""
  return _custom_vjp(ctx, api)(X3)


@scenario
def custom_vjp_cb_grad(ctx, api):
  """grad of a custom_vjp function: fwd and bwd callbacks."""
  return jax.grad(lambda x: _custom_vjp(ctx, api)(x).sum())(X3)


@scenario(unordered=_XLA_ORDER)
def custom_vjp_cb_grad_jit(ctx, api):
  """jit of grad of a custom_vjp function: fwd and bwd callbacks."""
  return jax.jit(jax.grad(lambda x: _custom_vjp(ctx, api)(x).sum()))(X3)


# ---------------------------------------------------------- checkpoint
@scenario
def checkpoint_grad_cb(ctx, api):
  """grad of a checkpointed function: the forward pass runs again."""
  f = jax.checkpoint(_sin_with_cb(ctx, api))
  return jax.grad(f)(X3)


@scenario
def checkpoint_grad_cb_jit(ctx, api):
  """jit of grad of a checkpointed function."""
  f = jax.checkpoint(_sin_with_cb(ctx, api, ordered=True))
  return jax.jit(jax.grad(f))(X3)


@scenario
def checkpoint_policy_saveable_cb(ctx, api):
  """checkpoint with a policy that saves everything."""
  f = jax.checkpoint(
    _sin_with_cb(ctx, api), policy=jax.checkpoint_policies.everything_saveable
  )
  return jax.grad(f)(X3)


@scenario
def checkpoint_no_grad_cb(ctx, api):
  """A checkpointed function called without grad: once."""
  return jax.jit(jax.checkpoint(_sin_with_cb(ctx, api)))(X3)


@scenario
def checkpoint_scan_grad_cb(ctx, api):
  """grad of a scan with a checkpointed body."""

  @jax.checkpoint
  def body(c, x):
    api.debug_callback(ctx.recorder("body"), c, x, ordered=True)
    return c * jnp.sin(x), None

  return jax.grad(lambda xs: jax.lax.scan(body, 1.0, xs)[0])(X3)


@scenario
def remat_partial_cb(ctx, api):
  """jax.remat (an alias of checkpoint) with static_argnums."""

  @functools.partial(jax.remat, static_argnums=(1,))
  def f(x, k):
    api.debug_callback(ctx.recorder("cb"), x, k)
    return jnp.sin(x * k).sum()

  return jax.grad(f)(X3, 2)


@scenario
def vmap_cb_empty_batch(ctx, api):
  """vmap over an empty batch: never called."""
  jax.vmap(lambda x: api.debug_callback(ctx.recorder("cb"), x))(
    np.zeros((0, 3), np.float32)
  )
  ctx.log("done")


@scenario
def vmap_cb_empty_batch_jit(ctx, api):
  """vmap over an empty batch under jit: never called."""
  jax.jit(jax.vmap(lambda x: api.debug_print("{}", x)))(
    np.zeros((0, 3), np.float32)
  )
  ctx.log("done")


@scenario
def vmap_cb_static_arguments_only(ctx, api):
  """A callback with only host-side arguments inside vmap: not batched,
  called once."""
  jax.vmap(lambda x: (api.debug_callback(ctx.recorder("cb"), "hi"), x)[1])(X23)


@scenario
def vmap_cb_unbatched_operand_only(ctx, api):
  """A callback of a value that does not depend on the batch: once."""
  y = np.float32(5)
  jax.vmap(lambda x: (api.debug_callback(ctx.recorder("cb"), y), x)[1])(X23)
