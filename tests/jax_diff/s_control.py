"""Scenarios: debug callbacks and prints inside control flow."""

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


@scenario
def scan_cb_per_step(ctx, api):
  """A callback in a scan body: once per step, in order."""

  def body(c, x):
    api.debug_callback(ctx.recorder("step"), c, x)
    return c + x, c * x

  return jax.lax.scan(body, np.float32(1), X3)


@scenario
def scan_cb_jit(ctx, api):
  """A scan with a callback, under jit."""

  def body(c, x):
    api.debug_callback(ctx.recorder("step"), c, x)
    return c + x, None

  return jax.jit(lambda xs: jax.lax.scan(body, np.zeros(3, np.float32), xs)[0])(
    X23
  )


@scenario(unordered=_XLA_ORDER)
def scan_print_unrolled(ctx, api):
  """A print in a scan with ``unroll=2``."""

  def body(c, x):
    api.debug_print("c={} x={}", c, x)
    return c + x, None

  return jax.jit(lambda xs: jax.lax.scan(body, np.float32(0), xs, unroll=2)[0])(
    np.arange(5.0)
  )


@scenario
def scan_reverse_cb(ctx, api):
  """``reverse=True``: the steps in reverse."""

  def body(c, x):
    api.debug_callback(ctx.recorder("step"), x)
    return c, None

  jax.jit(lambda xs: jax.lax.scan(body, 0.0, xs, reverse=True))(X3)


@scenario
def fori_loop_cb(ctx, api):
  """fori_loop: once per iteration, with the index."""

  def body(i, c):
    api.debug_callback(ctx.recorder("it"), i, c)
    return c * 2

  return jax.jit(lambda c: jax.lax.fori_loop(0, 4, body, c))(np.float32(1))


@scenario
def fori_loop_dynamic_bounds_cb(ctx, api):
  """fori_loop with traced bounds (a while loop)."""

  def body(i, c):
    api.debug_print("i={} c={}", i, c)
    return c + i

  return jax.jit(lambda n: jax.lax.fori_loop(0, n, body, 0))(np.int32(3))


@scenario
def while_loop_cb_cond_and_body(ctx, api):
  """Callbacks in a while loop's condition and body, ordered."""

  def cond(c):
    api.debug_callback(ctx.recorder("cond"), c, ordered=True)
    return c < 3

  def body(c):
    api.debug_callback(ctx.recorder("body"), c, ordered=True)
    return c + 1

  return jax.jit(lambda c: jax.lax.while_loop(cond, body, c))(np.int32(0))


@scenario
def while_loop_cb_eager(ctx, api):
  """A while loop outside jit (staged anyway)."""

  def body(c):
    api.debug_callback(ctx.recorder("body"), c)
    return c * 3

  return jax.lax.while_loop(lambda c: c < 20, body, np.int32(1))


@scenario
def cond_cb_taken_branch(ctx, api):
  """cond: only the taken branch's callback runs."""

  def f(p, x):
    return jax.lax.cond(
      p,
      lambda x: (api.debug_callback(ctx.recorder("true"), x), x)[1],
      lambda x: (api.debug_callback(ctx.recorder("false"), x), -x)[1],
      x,
    )

  f = jax.jit(f)
  f(True, X3)
  ctx.barrier()
  return f(False, X3)


@scenario
def cond_print_eager(ctx, api):
  """cond with a print in one branch, outside jit."""

  def yes(x):
    api.debug_print("yes {}", x)
    return x

  return jax.lax.cond(True, yes, lambda x: x * 0, X3)


@scenario
def switch_cb(ctx, api):
  """switch: the chosen branch's callback, index clamped."""
  branches = [
    lambda x, i=i: (api.debug_callback(ctx.recorder(f"b{i}"), x), x + i)[1]
    for i in range(3)
  ]
  f = jax.jit(lambda i, x: jax.lax.switch(i, branches, x))
  for i in (0, 2, 7, -1):
    f(np.int32(i), X3)
    ctx.barrier()


_BY_NAME_MASKS = (
  "hostcb.debug.callback called by name fires only for the batch "
  "elements that take the branch (that are still running); the drop-in "
  "of install(jax_callbacks=True) fires for every element, as JAX's "
  "(docs/debugging.md, prints and callbacks in a cond branch under vmap)"
)


@scenario(
  unordered=_XLA_ORDER,
  by_name=_BY_NAME_MASKS,
  by_name_expect=(
    "false(float32[3]=[3.0, 4.0, 5.0])\n"
    "true(float32[3]=[0.0, 1.0, 2.0])\n"
    "result: Array(float32[2, 3]=[[0.0, 1.0, 2.0], [-3.0, -4.0, -5.0]], "
    "weak=False)\n"
  ),
)
def cond_under_vmap_both_branches(ctx, api):
  """cond with a batched predicate under vmap: both branches run (as a
  select), each callback once per element."""

  def f(p, x):
    return jax.lax.cond(
      p,
      lambda x: (api.debug_callback(ctx.recorder("true"), x), x)[1],
      lambda x: (api.debug_callback(ctx.recorder("false"), x), -x)[1],
      x,
    )

  return jax.vmap(f)(np.array([True, False]), X23)


@scenario(unordered=_XLA_ORDER)
def scan_under_vmap(ctx, api):
  """vmap of a scan with a callback in the body, eager."""

  def body(c, x):
    api.debug_callback(ctx.recorder("step"), x)
    return c + x, None

  return jax.vmap(lambda xs: jax.lax.scan(body, 0.0, xs)[0])(X23)


@scenario(
  unordered=_XLA_ORDER,
  by_name=_BY_NAME_MASKS,
  by_name_expect=(
    "body(int32[]=0)\nbody(int32[]=2)\nbody(int32[]=1)\nbody(int32[]=2)\n"
    "result: Array(int32[2]=[3, 3], weak=False)\n"
  ),
)
def while_under_vmap_batched_predicate(ctx, api):
  """vmap of a while loop with a batched predicate: the body runs for
  every element until all are done."""

  def body(c):
    api.debug_callback(ctx.recorder("body"), c)
    return c + 1

  return jax.vmap(lambda c: jax.lax.while_loop(lambda c: c < 3, body, c))(
    np.array([0, 2], np.int32)
  )


@scenario
def lax_map_cb(ctx, api):
  """lax.map: once per element, in order."""
  return jax.lax.map(
    lambda x: (api.debug_callback(ctx.recorder("m"), x), x.sum())[1], X23
  )


@scenario
def nested_jit_cb(ctx, api):
  """A callback in a jitted function called from another."""
  inner = jax.jit(
    lambda x: (api.debug_callback(ctx.recorder("inner"), x), x * 2)[1]
  )
  return jax.jit(lambda x: inner(x) + 1)(X3)


@scenario(unordered=_XLA_ORDER)
def two_unordered_callbacks_jit(ctx, api):
  """Two independent unordered callbacks in one jitted function."""

  def f(x):
    api.debug_callback(ctx.recorder("a"), x)
    api.debug_callback(ctx.recorder("b"), x * 2)

  jax.jit(f)(X3)


@scenario
def ordered_and_unordered_mixed(ctx, api):
  """Ordered callbacks keep their order among unordered ones."""

  def f(x):
    api.debug_callback(ctx.recorder("o1"), x, ordered=True)
    api.debug_callback(ctx.recorder("o2"), x + 1, ordered=True)
    api.debug_callback(ctx.recorder("o3"), x + 2, ordered=True)

  jax.jit(f)(X3)


@scenario
def scan_grad_cb(ctx, api):
  """grad of a scan with a callback in its body: the forward steps."""

  def body(c, x):
    api.debug_callback(ctx.recorder("step"), c, x)
    return c * jnp.sin(x), None

  return jax.grad(lambda xs: jax.lax.scan(body, 1.0, xs)[0])(X3)


@scenario
def scan_grad_cb_jit_ordered(ctx, api):
  """jit of grad of a scan with an ordered print in its body."""

  def body(c, x):
    api.debug_print("c={} x={}", c, x, ordered=True)
    return c * jnp.sin(x), None

  return jax.jit(jax.grad(lambda xs: jax.lax.scan(body, 1.0, xs)[0]))(X3)


@scenario
def while_grad_forward_cb(ctx, api):
  """jvp of a fori_loop with a callback (forward-mode through while)."""

  def body(i, c):
    api.debug_callback(ctx.recorder("it"), i, c)
    return c * 2

  return jax.jvp(lambda c: jax.lax.fori_loop(0, 3, body, c), (1.0,), (1.0,))


@scenario(
  ours=(
    "JAX's lowering of a while loop whose predicate is batched evaluates "
    "the predicate twice per iteration (in the loop's condition and again "
    "in its body), so JAX prints each value twice; hostcb's callbacks are "
    "ordered, which makes JAX carry the predicate from the body to the "
    "condition: each value printed once per evaluation that the loop "
    "needs, the last with the lanes as the body left them (3 for the "
    "element already done, as JAX's own ordered print shows it) "
    "(docs/jax_callbacks.md, the batched while_loop condition)"
  ),
  expect=(
    "cond c=0\ncond c=1\ncond c=1\ncond c=2\ncond c=2\ncond c=3\n"
    "result: Array(int32[2]=[2, 2], weak=False)\n"
  ),
)
def print_in_batched_while_cond(ctx, api):
  """A debug.print in the condition of a while loop under vmap, with a
  batched predicate."""

  def cond(c):
    api.debug_print("cond c={}", c)
    return c < 2

  return jax.vmap(lambda c: jax.lax.while_loop(cond, lambda c: c + 1, c))(
    np.array([0, 1], np.int32)
  )
