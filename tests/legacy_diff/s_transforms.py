"""Scenarios: taps under every transformation and their combinations.

Each tap goes to ``ctx.tap`` (or ``ctx.tapper(what)``), which records the
NumPy values and the ``transforms`` the tap function receives.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import host_callback as hcb

from registry import scenario

X3 = np.arange(3, dtype=np.float32)
X23 = np.arange(6, dtype=np.float32).reshape(2, 3)


def _f(ctx):
  """x -> sin(tap(2x)) * x, with the tap recorded."""

  def f(x):
    y = hcb.id_tap(ctx.tap, 2.0 * x)
    return jnp.sin(y) * x

  return f


@scenario
def tr_eager(ctx):
  """The tapped function, eagerly."""
  return _f(ctx)(np.float32(1.5))


@scenario
def tr_jit(ctx):
  """Under jit."""
  return jax.jit(_f(ctx))(np.float32(1.5))


@scenario
def tr_jit_of_jit(ctx):
  """Under nested jit."""
  return jax.jit(jax.jit(_f(ctx)))(np.float32(1.5))


@scenario
def tr_vmap(ctx):
  """Under vmap."""
  return jax.vmap(_f(ctx))(X3)


@scenario
def tr_vmap_jit(ctx):
  """Under jit of vmap."""
  return jax.jit(jax.vmap(_f(ctx)))(X3)


@scenario
def tr_vmap_of_vmap(ctx):
  """Under vmap of vmap: two batch transforms."""
  return jax.vmap(jax.vmap(_f(ctx)))(X23)


@scenario
def tr_vmap_of_vmap_in_axes(ctx):
  """vmap over axis 1 of an inner vmap over axis 0."""
  return jax.vmap(jax.vmap(_f(ctx)), in_axes=1)(X23)


@scenario
def tr_vmap_unbatched_leaf(ctx):
  """vmap where one tapped leaf is not batched (``batch_dims`` None)."""

  def f(x, c):
    hcb.id_tap(ctx.tap, (x, c, 3.0))
    return x * c

  return jax.vmap(f, in_axes=(0, None))(X3, np.float32(2.0))


@scenario
def tr_vmap_all_unbatched(ctx):
  """vmap where the tapped value does not depend on the batched input."""

  def f(x):
    hcb.id_tap(ctx.tap, jnp.float32(7.0))
    return x + 1

  return jax.vmap(f)(X3)


@scenario
def tr_vmap_of_vmap_mixed(ctx):
  """vmap of vmap where the inner axis is not batched for one leaf."""

  def f(x, y):
    return hcb.id_tap(ctx.tap, (x, y))[0] + y

  inner = jax.vmap(f, in_axes=(0, None))
  return jax.vmap(inner, in_axes=(0, 0))(X23, np.arange(2, dtype=np.float32))


@scenario
def tr_vmap_out_axes(ctx):
  """vmap with in_axes=1 and out_axes=1."""
  return jax.vmap(_f(ctx), in_axes=1, out_axes=1)(X23)


@scenario
def tr_jvp(ctx):
  """Under jvp: the primal only."""
  return jax.jvp(_f(ctx), (np.float32(1.5),), (np.float32(0.5),))


@scenario
def tr_grad(ctx):
  """Under grad."""
  return jax.grad(_f(ctx))(np.float32(1.5))


@scenario
def tr_grad_jit(ctx):
  """Under jit of grad."""
  return jax.jit(jax.grad(_f(ctx)))(np.float32(1.5))


@scenario
def tr_grad_of_grad(ctx):
  """Under grad of grad."""
  return jax.grad(jax.grad(_f(ctx)))(np.float32(1.5))


@scenario
def tr_vjp(ctx):
  """Under vjp, and the vjp function applied."""
  y, f_vjp = jax.vjp(_f(ctx), np.float32(1.5))
  ctx.show("y", y)
  return f_vjp(np.float32(1.0))


@scenario
def tr_linearize(ctx):
  """Under linearize, and the linear function applied twice."""
  y, f_lin = jax.linearize(_f(ctx), np.float32(1.5))
  ctx.show("y", y)
  ctx.show("lin(1)", f_lin(np.float32(1.0)))
  return f_lin(np.float32(2.0))


@scenario
def tr_hessian(ctx):
  """Under hessian (jacfwd of jacrev)."""
  return jax.hessian(lambda x: jnp.sum(_f(ctx)(x)))(X3)


@scenario
def tr_jacfwd(ctx):
  """Under jacfwd (vmap of jvp)."""
  return jax.jacfwd(_f(ctx))(X3)


@scenario
def tr_jacrev(ctx):
  """Under jacrev (vmap of vjp)."""
  return jax.jacrev(_f(ctx))(X3)


@scenario
def tr_vmap_of_grad(ctx):
  """vmap of grad."""
  return jax.vmap(jax.grad(_f(ctx)))(X3)


@scenario
def tr_grad_of_vmap(ctx):
  """grad of the sum of a vmap."""
  return jax.grad(lambda x: jnp.sum(jax.vmap(_f(ctx))(x)))(X3)


@scenario
def tr_jvp_of_vmap(ctx):
  """jvp of vmap."""
  return jax.jvp(jax.vmap(_f(ctx)), (X3,), (np.ones(3, np.float32),))


@scenario
def tr_vmap_of_jvp(ctx):
  """vmap of jvp."""
  return jax.vmap(lambda x, t: jax.jvp(_f(ctx), (x,), (t,)))(
    X3, np.ones(3, np.float32)
  )


@scenario
def tr_checkpoint_grad(ctx):
  """grad of a checkpointed function: the tap runs again in the backward."""
  return jax.grad(jax.checkpoint(_f(ctx)))(np.float32(1.5))


@scenario
def tr_checkpoint_policy_dots(ctx):
  """checkpoint with the ``checkpoint_dots`` policy under grad."""

  def f(x):
    y = hcb.id_tap(ctx.tapper("in"), x @ x)
    return jnp.sin(y)

  g = jax.checkpoint(f, policy=jax.checkpoint_policies.checkpoint_dots)
  return jax.grad(g)(X3)


@scenario
def tr_checkpoint_policy_nothing(ctx):
  """checkpoint with ``nothing_saveable`` under jit of grad."""
  g = jax.checkpoint(_f(ctx), policy=jax.checkpoint_policies.nothing_saveable)
  return jax.jit(jax.grad(g))(np.float32(1.5))


@scenario
def tr_checkpoint_policy_everything(ctx):
  """checkpoint with ``everything_saveable`` under grad: no re-run tap."""
  g = jax.checkpoint(
    _f(ctx), policy=jax.checkpoint_policies.everything_saveable
  )
  return jax.grad(g)(np.float32(1.5))


@scenario
def tr_checkpoint_prevent_cse_false(ctx):
  """checkpoint(prevent_cse=False) under vmap of grad."""
  g = jax.checkpoint(_f(ctx), prevent_cse=False)
  return jax.vmap(jax.grad(g))(X3)


@scenario
def tr_custom_jvp_primals_and_tangents(ctx):
  """A custom_jvp rule that taps its primals and its tangents, under jvp."""

  @jax.custom_jvp
  def f(x):
    return jnp.sin(x)

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,) = primals
    (t,) = tangents
    hcb.id_tap(ctx.tapper("primal"), x)
    hcb.id_tap(ctx.tapper("tangent"), t)
    return jnp.sin(x), jnp.cos(x) * t

  return jax.jvp(f, (np.float32(0.5),), (np.float32(2.0),))


@scenario
def tr_custom_jvp_tangent_tap_grad(ctx):
  """grad through a custom_jvp rule that taps its tangent: the tap of the
  cotangent is transposed (``transforms`` ends with ``transpose``)."""

  @jax.custom_jvp
  def f(x):
    return jnp.sin(x)

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,) = primals
    (t,) = tangents
    t = hcb.id_tap(ctx.tapper("tangent"), t)
    return jnp.sin(x), jnp.cos(x) * t

  return jax.grad(f)(np.float32(0.5))


@scenario
def tr_custom_jvp_tangent_tap_grad_vmap(ctx):
  """vmap of grad through a custom_jvp rule that taps its tangent."""

  @jax.custom_jvp
  def f(x):
    return jnp.sin(x)

  @f.defjvp
  def f_jvp(primals, tangents):
    (x,) = primals
    (t,) = tangents
    t = hcb.id_tap(ctx.tapper("tangent"), t)
    return jnp.sin(x), jnp.cos(x) * t

  return jax.vmap(jax.grad(f))(X3)


@scenario
def tr_custom_jvp_under_vmap(ctx):
  """vmap of jvp through a custom_jvp rule that taps primals and tangents."""

  @jax.custom_jvp
  def f(x):
    return x * 2.0

  @f.defjvp
  def f_jvp(primals, tangents):
    hcb.id_tap(ctx.tapper("rule"), (primals, tangents))
    return f(*primals), tangents[0] * 2.0

  return jax.vmap(lambda x: jax.jvp(f, (x,), (x,)))(X3)


@scenario
def tr_custom_vjp_cotangents(ctx):
  """A custom_vjp whose fwd taps the primal and bwd taps the cotangent."""

  @jax.custom_vjp
  def f(x):
    return jnp.sin(x)

  def fwd(x):
    hcb.id_tap(ctx.tapper("fwd"), x)
    return jnp.sin(x), jnp.cos(x)

  def bwd(res, ct):
    hcb.id_tap(ctx.tapper("bwd"), (res, ct))
    return (res * ct,)

  f.defvjp(fwd, bwd)
  return jax.jit(jax.grad(f))(np.float32(0.5))


@scenario
def tr_custom_vjp_under_vmap(ctx):
  """vmap of grad of a custom_vjp that taps in fwd and bwd."""

  @jax.custom_vjp
  def f(x):
    return x * x

  def fwd(x):
    hcb.id_tap(ctx.tapper("fwd"), x)
    return x * x, x

  def bwd(res, ct):
    hcb.id_tap(ctx.tapper("bwd"), ct)
    return (2.0 * res * ct,)

  f.defvjp(fwd, bwd)
  return jax.vmap(jax.grad(f))(X3)


@scenario
def tr_custom_vjp_primal_call(ctx):
  """A custom_vjp function called without differentiation: fwd not used."""

  @jax.custom_vjp
  def f(x):
    hcb.id_tap(ctx.tapper("primal"), x)
    return x * 3.0

  f.defvjp(lambda x: (f(x), None), lambda r, ct: (ct * 3.0,))
  return jax.jit(f)(np.float32(2.0))


@scenario
def tr_tap_result_param_grad(ctx):
  """grad through ``id_tap(..., result=y)``: result flows, arg is tapped."""

  def f(x):
    y = jnp.sin(x)
    return hcb.id_tap(ctx.tap, x * 2.0, result=y) * 3.0

  return jax.grad(f)(np.float32(0.5))


@scenario
def tr_tap_jvp_of_grad(ctx):
  """jvp of grad (forward over reverse)."""
  return jax.jvp(jax.grad(_f(ctx)), (np.float32(1.5),), (np.float32(1.0),))


@scenario
def tr_pure_partial(ctx):
  """A tap function given by functools.partial with keyword arguments."""
  tap = functools.partial(ctx.tapper("partial"), extra=5)
  return jax.jit(lambda x: hcb.id_tap(tap, x) + 1)(np.float32(1.0))


@scenario
def tr_print_jvp_of_vmap(ctx):
  """``id_print`` of a value under jvp of vmap (printed transforms)."""

  def f(x):
    return hcb.id_print(x * 2.0, what="v") * x

  return jax.jvp(jax.vmap(f), (X3,), (np.ones(3, np.float32),))


@scenario
def tr_print_vmap_of_vmap(ctx):
  """``id_print`` under vmap of vmap (printed transforms)."""
  return jax.vmap(jax.vmap(lambda x: hcb.id_print(x, what="vv")))(X23)
