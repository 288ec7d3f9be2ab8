"""Scenarios: taps inside control flow, and taps whose results drive it."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import host_callback as hcb

from registry import scenario

X3 = np.arange(3, dtype=np.float32)


@scenario
def cf_scan_forward(ctx):
  """A tap in a scan body, forward."""

  def body(c, x):
    c = hcb.id_tap(ctx.tap, c + x)
    return c, c * 2.0

  return jax.jit(lambda xs: lax.scan(body, np.float32(0.0), xs))(X3)


@scenario
def cf_scan_reverse(ctx):
  """A tap in a scan body, ``reverse=True``."""

  def body(c, x):
    c = hcb.id_tap(ctx.tap, c + x)
    return c, c * 2.0

  return lax.scan(body, np.float32(0.0), X3, reverse=True)


@scenario
def cf_scan_grad(ctx):
  """grad of a scan whose body taps the carry."""

  def f(x):
    def body(c, _):
      c = hcb.id_tap(ctx.tap, jnp.sin(c))
      return c, None

    return lax.scan(body, x, None, length=3)[0]

  return jax.grad(f)(np.float32(0.5))


@scenario
def cf_scan_vmap(ctx):
  """vmap of a scan whose body taps."""

  def f(x):
    return lax.scan(
      lambda c, _: (hcb.id_tap(ctx.tap, c * 2.0), None), x, None, length=2
    )[0]

  return jax.vmap(f)(X3)


@scenario
def cf_scan_custom_jvp_tangent_grad(ctx):
  """grad of a scan over a custom_jvp that taps its tangent."""

  @jax.custom_jvp
  def g(x):
    return jnp.sin(x)

  @g.defjvp
  def g_jvp(p, t):
    return jnp.sin(p[0]), hcb.id_tap(ctx.tapper("t"), t[0]) * jnp.cos(p[0])

  def f(x):
    return lax.scan(lambda c, _: (g(c), None), x, None, length=2)[0]

  return jax.grad(f)(np.float32(0.5))


@scenario
def cf_fori_loop(ctx):
  """A tap in a fori_loop body, with the loop index."""

  def body(i, c):
    return hcb.id_tap(ctx.tap, (i, c + 1.0))[1]

  return jax.jit(lambda x: lax.fori_loop(0, 3, body, x))(np.float32(0.0))


@scenario
def cf_fori_loop_dynamic(ctx):
  """A fori_loop with a traced trip count (a while loop) that taps."""

  def f(n):
    return lax.fori_loop(0, n, lambda i, c: hcb.id_tap(ctx.tap, c * 2), 1)

  return jax.jit(f)(3)


@scenario
def cf_while_body(ctx):
  """A tap in a while_loop body."""

  def f(x):
    return lax.while_loop(
      lambda c: c < 5.0, lambda c: hcb.id_tap(ctx.tap, c * 2.0), x
    )

  return jax.jit(f)(np.float32(1.0))


@scenario
def cf_while_cond(ctx):
  """A tap in a while_loop cond_fun, under jit."""

  def f(x):
    return lax.while_loop(
      lambda c: hcb.id_tap(ctx.tap, c) < 5.0, lambda c: c * 2.0, x
    )

  return jax.jit(f)(np.float32(1.0))


@scenario
def cf_while_cond_vmap_print(ctx):
  """The issue's first example: id_print of the predicate in cond_fun under
  jit of vmap; the result must be [2 2 2 3 4]."""

  def f(x):
    return lax.while_loop(lambda x: hcb.id_print(x < 2), lambda x: x + 1, x)

  return jax.jit(jax.vmap(f))(jnp.arange(5, dtype=jnp.int32))


@scenario
def cf_while_cond_vmap_unused_tap(ctx):
  """A tap whose result is unused in cond_fun under vmap: [8. 6.]."""

  def cond(c):
    return (hcb.id_tap(ctx.tap, c), c < 5.0)[1]

  return jax.vmap(lambda x: lax.while_loop(cond, lambda c: c * 2.0, x))(
    np.array([1.0, 3.0], dtype=np.float32)
  )


@scenario
def cf_while_body_vmap(ctx):
  """vmap of a while_loop whose body taps (batched predicate)."""

  def f(x):
    return lax.while_loop(
      lambda c: c < 5.0, lambda c: hcb.id_tap(ctx.tap, c * 2.0), x
    )

  return jax.vmap(f)(np.array([1.0, 3.0], dtype=np.float32))


@scenario
def cf_cond(ctx):
  """Taps in both branches of a cond; one runs."""

  def f(x):
    return lax.cond(
      x > 0,
      lambda x: hcb.id_tap(ctx.tapper("then"), x * 2),
      lambda x: hcb.id_tap(ctx.tapper("else"), x * 3),
      x,
    )

  g = jax.jit(f)
  ctx.show("pos", g(np.float32(1.0)))
  return g(np.float32(-1.0))


@scenario
def cf_cond_vmap(ctx):
  """vmap of a cond with a batched predicate (both branches run)."""

  def f(x):
    return lax.cond(
      x > 0,
      lambda x: hcb.id_tap(ctx.tapper("then"), x * 2),
      lambda x: hcb.id_tap(ctx.tapper("else"), x * 3),
      x,
    )

  return jax.vmap(f)(np.array([1.0, -1.0], dtype=np.float32))


@scenario
def cf_switch(ctx):
  """A tap in each branch of lax.switch."""
  branches = [
    lambda x, i=i: hcb.id_tap(ctx.tapper(f"b{i}"), x + i) for i in range(3)
  ]
  g = jax.jit(lambda i, x: lax.switch(i, branches, x))
  return [g(i, np.float32(10.0)) for i in range(3)]


@scenario
def cf_tap_feeds_cond(ctx):
  """The tapped value is the cond predicate's input."""

  def f(x):
    y = hcb.id_tap(ctx.tap, x * 2.0)
    return lax.cond(y > 3.0, lambda v: v + 1.0, lambda v: v - 1.0, y)

  return jax.jit(f)(np.float32(2.0))


@scenario
def cf_tap_feeds_while(ctx):
  """The tapped value is the while loop's carry and bound."""

  def f(x):
    n = hcb.id_tap(ctx.tapper("n"), x + 2)
    return lax.while_loop(
      lambda c: c[0] < n,
      lambda c: (c[0] + 1, hcb.id_tap(ctx.tap, c[1] * 2)),
      (0, 1),
    )

  return jax.jit(f)(1)


@scenario
def cf_tap_feeds_fori_bound(ctx):
  """The tapped value is a fori_loop bound."""

  def f(n):
    n = hcb.id_tap(ctx.tap, n)
    return lax.fori_loop(0, n, lambda i, c: c + i, 0)

  return jax.jit(f)(4)


@scenario
def cf_nested_scan_in_while(ctx):
  """A scan inside a while loop, both tapping."""

  def f(x):
    def body(c):
      s, _ = lax.scan(
        lambda a, _: (hcb.id_tap(ctx.tapper("scan"), a + 1.0), None),
        c,
        None,
        length=2,
      )
      return hcb.id_tap(ctx.tapper("while"), s)

    return lax.while_loop(lambda c: c < 4.0, body, x)

  return jax.jit(f)(np.float32(0.0))


@scenario
def cf_jvp_of_fori(ctx):
  """jvp of a fori_loop that taps its carry."""

  def f(x):
    return lax.fori_loop(0, 2, lambda i, c: hcb.id_tap(ctx.tap, c * c), x)

  return jax.jvp(f, (np.float32(1.5),), (np.float32(1.0),))


@scenario
def cf_grad_of_cond(ctx):
  """grad through a cond with taps in the branches."""

  def f(x):
    return lax.cond(
      x > 0,
      lambda x: hcb.id_tap(ctx.tapper("then"), x * x),
      lambda x: hcb.id_tap(ctx.tapper("else"), -x),
      x,
    )

  return jax.grad(f)(np.float32(3.0))


@scenario
def cf_remat_scan(ctx):
  """grad of a scan with a checkpointed, tapping body."""

  def f(x):
    body = jax.checkpoint(lambda c, _: (hcb.id_tap(ctx.tap, jnp.sin(c)), None))
    return lax.scan(body, x, None, length=2)[0]

  return jax.grad(f)(np.float32(0.5))
