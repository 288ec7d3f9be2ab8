"""Scenarios: ``jax.debug.callback``: what it is called with, how often."""

import jax
import jax.numpy as jnp
import numpy as np

from jax_diff.registry import scenario

X3 = np.arange(3, dtype=np.float32)

_STAGED_ERRORS = (
  "hostcb's device does not wait for an unordered debug callback (jit's "
  "fast path): a callback that raises under jit cannot fail the call, "
  "which JAX's does (JaxRuntimeError from the call); its exception is "
  "logged where JAX logs it, and the first host read of a result on its "
  "device, or else the first barrier, raises it as JaxRuntimeError with "
  "JAX's words, then hostcb's saying where (docs/jax_callbacks.md, 'When "
  "a callback fails')"
)

# hostcb's words after JAX's in the error that a barrier raises.
_AT_BARRIER = (
  "hostcb: raised at the first barrier after the callback failed "
  "(hostcb's device does not wait for jax.debug.callback: the computation "
  "that ran it returned first)\n"
)


@scenario
def cb_eager_positional(ctx, api):
  """Outside jit: arrays and numbers as positional arguments."""
  api.debug_callback(ctx.recorder("cb"), jnp.asarray(X3), 2, 1.5)


@scenario
def cb_eager_keyword(ctx, api):
  """Outside jit: keyword arguments."""
  api.debug_callback(ctx.recorder("cb"), jnp.asarray(X3), y=jnp.int8(3), z=True)


@scenario
def cb_jit_positional_keyword(ctx, api):
  """Under jit: positional and keyword arguments, the result after."""

  def f(x):
    api.debug_callback(ctx.recorder("cb"), x, x * 2, total=x.sum())
    return x - 1

  return jax.jit(f)(X3)


@scenario
def cb_jit_pytree_arguments(ctx, api):
  """Pytree arguments (dict, tuple, list, nested) are rebuilt."""

  def f(x):
    api.debug_callback(
      ctx.recorder("cb"), {"a": x, "b": (x[0], [x[1]])}, k=[x, {"z": x[2]}]
    )

  jax.jit(f)(X3)


@scenario
def cb_static_arguments(ctx, api):
  """Non-array arguments (strings, objects, None) are passed as given."""

  class Obj:
    def __repr__(self):
      return "Obj()"

  def f(x):
    api.debug_callback(
      ctx.recorder("cb"), "label", x, Obj(), None, mode="fast", data=(x, "s")
    )

  jax.jit(f)(X3)


@scenario
def cb_no_arguments(ctx, api):
  """A callback without arguments, under jit."""
  jax.jit(lambda x: api.debug_callback(ctx.recorder("cb")) or x)(X3)


@scenario
def cb_dtypes(ctx, api):
  """Arrays of several dtypes reach the callback with their dtype."""

  def f(x):
    api.debug_callback(
      ctx.recorder("cb"),
      x.astype(jnp.int8),
      x.astype(jnp.uint32),
      x.astype(jnp.float16),
      x.astype(jnp.bfloat16),
      x > 1,
      x + 1j,
      x.astype(jnp.int16),
    )

  jax.jit(f)(X3)


@scenario
def cb_shapes(ctx, api):
  """Scalars, empty and 3-d arrays."""

  def f(x):
    api.debug_callback(
      ctx.recorder("cb"), x[0], x[:0], jnp.zeros((2, 1, 3), jnp.int32)
    )

  jax.jit(f)(X3)


@scenario
def cb_weak_python_scalars(ctx, api):
  """Python numbers are staged (as 0-d arrays), under jit."""
  jax.jit(lambda x: api.debug_callback(ctx.recorder("cb"), 3, 2.5, x[0]))(X3)


@scenario
def cb_key_argument_eager(ctx, api):
  """A PRNG key, outside jit: the callback gets the key."""
  api.debug_callback(ctx.recorder("cb"), jax.random.key(7))


@scenario
def cb_key_argument_jit(ctx, api):
  """A PRNG key under jit: JAX's staged callback gets the key's data."""
  jax.jit(lambda k: api.debug_callback(ctx.recorder("cb"), k))(
    jax.random.key(7)
  )


@scenario
def cb_key_type_eager_vmap(ctx, api):
  """PRNG keys under an eager vmap: one key per call."""
  jax.vmap(lambda k: api.debug_callback(ctx.recorder("cb"), k))(
    jax.random.split(jax.random.key(1), 2)
  )


@scenario
def cb_arg_types(ctx, api):
  """The Python types of the array arguments, outside jit and under jit."""

  def cb(label):
    return lambda x, y: ctx.log(f"{label}:", type(x).__name__, type(y).__name__)

  api.debug_callback(cb("eager"), jnp.asarray(X3), 1)
  ctx.barrier()
  jax.jit(lambda x: api.debug_callback(cb("jit"), x, 1))(X3)


@scenario
def cb_not_callable_error(ctx, api):
  """A first argument that is not callable: TypeError."""
  api.debug_callback(3, X3)


@scenario
def cb_two_call_form(ctx, api):
  """The two-call form: options, then the callback and its arguments;
  ``ordered=`` of the second call goes to the callback."""
  jax.jit(
    lambda x: api.debug_callback(ordered=True)(
      ctx.recorder("cb"), x, ordered=x[0]
    )
  )(X3)


@scenario
def cb_two_call_form_extra_arguments_error(ctx, api):
  """Arguments without a callback in the first call: TypeError."""
  api.debug_callback(None, X3, k=1)


@scenario
def cb_returns_value_ignored(ctx, api):
  """What the callback returns is ignored, under jit."""

  def cb(x):
    ctx.log("called")
    return x * 2

  return jax.jit(lambda x: (api.debug_callback(cb, x), x)[1])(X3)


@scenario
def cb_unused_value_still_called(ctx, api):
  """A callback of a value that nothing else uses runs under jit."""

  def f(x):
    api.debug_callback(ctx.recorder("cb"), jnp.sin(x))
    return jnp.float32(1)

  return jax.jit(f)(X3)


@scenario
def cb_ordered_sequence(ctx, api):
  """Ordered callbacks run in program order."""

  def f(x):
    for i in range(6):
      api.debug_callback(ctx.recorder(f"cb{i}"), x[i % 3], ordered=True)

  jax.jit(f)(X3)


@scenario
def cb_ordered_across_calls(ctx, api):
  """Ordered callbacks of successive calls run in call order."""
  f = jax.jit(lambda i: api.debug_callback(ctx.recorder("cb"), i, ordered=True))
  for i in range(5):
    f(np.int32(i))


@scenario
def cb_ordered_two_functions(ctx, api):
  """Ordered callbacks of two jitted functions, called alternately."""
  f = jax.jit(lambda i: api.debug_callback(ctx.recorder("f"), i, ordered=True))
  g = jax.jit(
    lambda i: api.debug_callback(ctx.recorder("g"), i * 10, ordered=True)
  )
  for i in range(3):
    f(np.int32(i))
    g(np.int32(i))


@scenario
def cb_eager_order_with_jit(ctx, api):
  """An eager callback after a jitted one (waited for): in order."""
  f = jax.jit(lambda x: api.debug_callback(ctx.recorder("jit"), x))
  api.debug_callback(ctx.recorder("eager"), 1)
  f(X3)
  ctx.barrier()
  api.debug_callback(ctx.recorder("eager"), 2)


@scenario
def cb_traced_once_called_each_time(ctx, api):
  """A jitted function is traced once; its callback runs per call."""
  f = jax.jit(lambda x: api.debug_callback(ctx.recorder("cb"), x))
  for i in range(3):
    f(X3 + i)
    ctx.barrier()


@scenario
def cb_raises_eager(ctx, api):
  """A callback that raises, outside jit: its exception reaches the
  caller, and is logged."""

  def cb(x):
    raise ValueError(f"boom {x.tolist()}")

  api.debug_callback(cb, jnp.asarray(X3))


@scenario(
  ours=_STAGED_ERRORS,
  expect=(
    "log jax._src.debugging ERROR: jax.debug.callback failed "
    "[ValueError: boom [0.0, 1.0, 2.0]]\n"
    "barrier raised JaxRuntimeError: INTERNAL: CpuCallback error calling "
    "callback: Traceback (most recent call last):\n"
    "  <frames>\n"
    "ValueError: boom [0.0, 1.0, 2.0]\n"
    "\n" + _AT_BARRIER
  ),
)
def cb_raises_jit(ctx, api):
  """A callback that raises under jit."""

  def cb(x):
    raise ValueError(f"boom {x.tolist()}")

  jax.jit(lambda x: api.debug_callback(cb, x))(X3)


@scenario(
  ours=_STAGED_ERRORS,
  expect=(
    "log jax._src.debugging ERROR: jax.debug.callback failed "
    "[ValueError: boom]\n"
    "barrier raised JaxRuntimeError: INTERNAL: CpuCallback error calling "
    "callback: Traceback (most recent call last):\n"
    "  <frames>\n"
    "ValueError: boom\n"
    "\n"
    + _AT_BARRIER
    + "result: Array(float32[3]=[1.0, 2.0, 3.0], weak=False)\n"
  ),
)
def cb_raises_jit_with_result(ctx, api):
  """A callback that raises under jit, in a function with a result."""

  def cb(x):
    raise ValueError("boom")

  def f(x):
    api.debug_callback(cb, x)
    return x + 1

  return jax.jit(f)(X3)


@scenario(
  ours=_STAGED_ERRORS,
  expect=(
    "cb(float32[]=1.0)\n"
    "log jax._src.debugging ERROR: jax.debug.callback failed "
    "[ValueError: boom]\n"
    "raised JaxRuntimeError: INTERNAL: CpuCallback error calling "
    "callback: Traceback (most recent call last):\n"
    "  <frames>\n"
    "ValueError: boom\n"
    "\n" + _AT_BARRIER + "cb(float32[]=3.0)\n"
  ),
)
def cb_raises_then_next_call(ctx, api):
  """After a failed callback under jit, a barrier, then the next call."""

  def cb(x):
    raise ValueError("boom")

  f = jax.jit(lambda x: api.debug_callback(cb, x))
  g = jax.jit(lambda x: api.debug_callback(ctx.recorder("cb"), x))
  g(np.float32(1))
  api.effects_barrier()
  try:
    f(np.float32(2))
    api.effects_barrier()
  except Exception as e:  # noqa: BLE001
    ctx.log("raised", type(e).__name__ + ":", e)
  g(np.float32(3))


@scenario
def cb_raises_then_barrier_for_other_work(ctx, api):
  """A callback that raises under jit, in a computation whose result is
  read, then other work and a barrier: the read raises the failure (JAX's
  call does), the other work runs and the barrier returns."""

  def cb(x):
    raise ValueError("boom")

  f = jax.jit(lambda x: (api.debug_callback(cb, x), x + 1)[1])
  g = jax.jit(lambda x: (api.debug_callback(ctx.recorder("cb"), x), x * 2)[1])
  try:
    jax.block_until_ready(f(np.float32(1)))
  except Exception as e:  # noqa: BLE001  (JAX's fails its computation)
    ctx.log("f raised", type(e).__name__)
  ctx.attempt("other work", lambda: g(np.float32(3)))
  ctx.barrier()
  ctx.log("done")


@scenario
def cb_calls_jax_inside(ctx, api):
  """A callback that itself runs JAX operations."""

  def cb(x):
    ctx.log("sum", float(jnp.sum(jnp.asarray(x) * 2)))

  jax.jit(lambda x: api.debug_callback(cb, x))(X3)


@scenario
def cb_make_jaxpr_does_not_call(ctx, api):
  """Tracing (make_jaxpr, eval_shape) does not call the callback."""
  f = lambda x: (api.debug_callback(ctx.recorder("cb"), x), x)[1]
  jax.make_jaxpr(f)(X3)
  jax.eval_shape(f, X3)
  ctx.log("traced")


@scenario
def cb_under_disable_jit(ctx, api):
  """Inside ``jax.disable_jit()``: called at once, in the caller."""
  with jax.disable_jit():
    jax.jit(lambda x: api.debug_callback(ctx.recorder("cb"), x))(X3)
    ctx.log("after call")


@scenario
def cb_aot_compiled(ctx, api):
  """A callback in a function compiled ahead of time, called twice."""
  compiled = (
    jax.jit(lambda x: api.debug_callback(ctx.recorder("cb"), x, ordered=True))
    .lower(X3)
    .compile()
  )
  compiled(X3)
  compiled(X3 + 1)


@scenario
def cb_namedtuple_argument(ctx, api):
  """A NamedTuple argument is rebuilt as that NamedTuple."""
  import collections

  Point = collections.namedtuple("Point", ["x", "y"])
  jax.jit(lambda x: api.debug_callback(ctx.recorder("cb"), Point(x, x[0])))(X3)


@scenario
def api_signatures(ctx, api):
  """The four functions' signatures (parameter names, kinds, defaults)."""
  import inspect

  for name in ("debug_callback", "debug_print", "io_callback", "pure_callback"):
    sig = inspect.signature(getattr(api, name))
    ctx.log(
      name,
      [(p.name, p.kind.name, repr(p.default)) for p in sig.parameters.values()],
    )


@scenario
def cb_ordered_jit_then_eager_no_barrier(ctx, api):
  """An ordered callback under jit, then an ordered eager one, with no
  barrier between: in program order."""
  f = jax.jit(
    lambda x: api.debug_callback(ctx.recorder("jit"), x, ordered=True)
  )
  for i in range(3):
    f(np.int32(i))
    api.debug_callback(ctx.recorder("eager"), np.int32(i), ordered=True)


@scenario
def cb_argument_that_is_not_a_jax_value_error(ctx, api):
  """An argument that JAX takes for an array but cannot stage (a NumPy
  ``datetime64``), under jit and outside it: JAX's TypeError, which
  names ``debug_callback``."""
  rec = ctx.recorder("cb")
  ctx.attempt(
    "jit",
    lambda: jax.jit(
      lambda x: api.debug_callback(rec, np.datetime64("2020-01-01"), x)
    )(np.float32(1)),
  )
  ctx.attempt("eager", lambda: api.debug_callback(rec, np.longdouble(0.5)))
