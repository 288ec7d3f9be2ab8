"""Scenarios: ``jax.effects_barrier()`` waits for the callbacks.

No scenario here calls ``ctx.barrier()`` or ``ctx.show()`` before the line
it checks: the line written right after ``api.effects_barrier()`` must come
after every callback dispatched before it.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jax_diff.registry import scenario

X3 = np.arange(3, dtype=np.float32)


@scenario
def barrier_waits_for_debug_callback(ctx, api):
  """The callback of a dispatched function has run when the barrier
  returns."""
  jax.jit(lambda x: api.debug_callback(ctx.recorder("cb"), x))(X3)
  api.effects_barrier()
  ctx.log("after barrier")


@scenario
def barrier_waits_for_print(ctx, api):
  """A print has been written when the barrier returns."""
  jax.jit(lambda x: api.debug_print("x={}", x))(X3)
  api.effects_barrier()
  ctx.log("after barrier")


@scenario
def barrier_waits_for_many_calls(ctx, api):
  """Twenty dispatched calls, ordered: all ran, in order, before the
  barrier returns."""
  f = jax.jit(lambda i: api.debug_callback(ctx.recorder("cb"), i, ordered=True))
  for i in range(20):
    f(np.int32(i))
  api.effects_barrier()
  ctx.log("after barrier")


@scenario
def barrier_waits_for_scan_of_callbacks(ctx, api):
  """A long scan of unordered callbacks: all ran before the barrier
  returns (counted)."""
  calls = []

  def body(c, x):
    api.debug_callback(lambda x: calls.append(int(x)), x)
    return c, None

  jax.jit(lambda xs: jax.lax.scan(body, 0, xs))(np.arange(500))
  api.effects_barrier()
  ctx.log("calls:", len(calls), "in order:", calls == sorted(calls))


@scenario
def barrier_waits_for_io_callback_without_result(ctx, api):
  """An io_callback without results has run when the barrier returns."""
  jax.jit(lambda x: api.io_callback(ctx.recorder("io"), None, x))(X3)
  api.effects_barrier()
  ctx.log("after barrier")


@scenario
def barrier_waits_for_ordered_io_callback(ctx, api):
  """Ordered io_callbacks of several calls have run."""
  f = jax.jit(
    lambda i: api.io_callback(ctx.recorder("io"), None, i, ordered=True)
  )
  for i in range(5):
    f(np.int32(i))
  api.effects_barrier()
  ctx.log("after barrier")


@scenario
def barrier_with_nothing_pending(ctx, api):
  """A barrier with nothing dispatched returns None."""
  ctx.log("barrier returned", api.effects_barrier())
  ctx.log("again", api.effects_barrier())


@scenario
def barrier_after_eager_callbacks(ctx, api):
  """Eager callbacks ran before their call returned."""
  api.debug_callback(ctx.recorder("cb"), 1)
  ctx.log("after call")
  api.effects_barrier()


@scenario
def barrier_after_pure_callback_result(ctx, api):
  """A pure_callback's result is ready; the barrier changes nothing."""
  y = jax.jit(
    lambda x: api.pure_callback(
      ctx.recorder("pure", lambda x: np.asarray(x) + 1),
      jax.ShapeDtypeStruct((3,), jnp.float32),
      x,
    )
  )(X3)
  ctx.log("value", np.asarray(y).tolist())
  api.effects_barrier()
  ctx.log("after barrier")


@scenario
def barrier_between_functions_ordered(ctx, api):
  """Two functions with ordered callbacks, a barrier between them."""
  f = jax.jit(lambda x: api.debug_callback(ctx.recorder("f"), x, ordered=True))
  g = jax.jit(lambda x: api.debug_print("g {}", x, ordered=True))
  f(X3)
  api.effects_barrier()
  ctx.log("between")
  g(X3)
  api.effects_barrier()
  ctx.log("end")


@scenario
def barrier_callback_dispatches_printing_code(ctx, api):
  """A debug callback that runs a jitted function with a print of its
  own: printed once two barriers returned.  (Not checked after the first
  barrier: JAX's inner print runs inside the outer callback, hostcb's is
  queued behind it and may come after the first barrier, as
  docs/jax_callbacks.md says.)"""
  inner = jax.jit(lambda x: api.debug_print("inner {}", x))

  def cb(x):
    ctx.log("outer", np.asarray(x).tolist())
    inner(x + 1)

  jax.jit(lambda x: api.debug_callback(cb, x))(X3)
  api.effects_barrier()
  api.effects_barrier()
  ctx.log("after two barriers")


@scenario
def barrier_io_callback_dispatches_printing_code(ctx, api):
  """An io_callback that runs a jitted function with a print of its own,
  then returns: printed once the barrier returned.  (Not checked when the
  result is ready: JAX's inner print runs inside the io_callback, hostcb's
  device does not wait for it.)"""
  inner = jax.jit(lambda x: api.debug_print("inner {}", x))

  def cb(x):
    inner(x + 1)
    return np.asarray(x)

  y = jax.jit(
    lambda x: api.io_callback(cb, jax.ShapeDtypeStruct((3,), jnp.float32), x)
  )(X3)
  y.block_until_ready()
  api.effects_barrier()
  ctx.log("after barrier, value", np.asarray(y).tolist())
