"""Scenarios: ``call``, with every form of ``result_shape``, eager and jit."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import host_callback as hcb

from registry import scenario

X3 = np.arange(3, dtype=np.float32)


def _host(ctx, fn):
  """A host function that logs what it receives, then returns ``fn(arg)``."""
  from normalize import fmt

  def host(arg):
    ctx.log("host got:", fmt(arg))
    return fn(arg)

  return host


@scenario
def call_shape_scalar_number(ctx):
  """``result_shape=1.`` (a Python float scalar)."""
  return jax.jit(
    lambda x: hcb.call(
      _host(ctx, lambda a: np.float32(a * 2)), x, result_shape=1.0
    )
  )(np.float32(2.0))


@scenario
def call_shape_numpy_array(ctx):
  """``result_shape`` given as a NumPy array."""
  return jax.jit(
    lambda x: hcb.call(_host(ctx, lambda a: a + 1), x, result_shape=X3)
  )(X3)


@scenario
def call_shape_jax_array(ctx):
  """``result_shape`` given as the traced operand itself."""
  return jax.jit(
    lambda x: hcb.call(_host(ctx, lambda a: a * 3), x, result_shape=x)
  )(X3)


@scenario
def call_shape_struct(ctx):
  """``result_shape=jax.ShapeDtypeStruct`` of another shape and dtype."""
  return jax.jit(
    lambda x: hcb.call(
      _host(ctx, lambda a: np.arange(4, dtype=np.int32)),
      x,
      result_shape=jax.ShapeDtypeStruct((4,), jnp.int32),
    )
  )(X3)


@scenario
def call_shape_pytree(ctx):
  """A pytree ``result_shape``: a tuple holding a dict."""

  def host(a):
    return (a * 2, {"s": np.float32(a.sum()), "n": np.int32(3)})

  rs = (X3, {"s": 1.0, "n": np.int32(0)})
  return jax.jit(lambda x: hcb.call(_host(ctx, host), x, result_shape=rs))(X3)


@scenario
def call_shape_none(ctx):
  """``result_shape=None``: no result."""
  return jax.jit(lambda x: (hcb.call(_host(ctx, lambda a: None), x), x)[0])(X3)


@scenario
def call_shape_empty_tuple(ctx):
  """``result_shape=()``: no result, returned as ``()``."""
  return jax.jit(
    lambda x: (hcb.call(_host(ctx, lambda a: ()), x, result_shape=()), x)
  )(X3)


@scenario
def call_shape_int_scalar_weak(ctx):
  """``result_shape=3`` (a Python int): int32 result."""
  return jax.jit(
    lambda x: hcb.call(_host(ctx, lambda a: np.int32(7)), x, result_shape=3)
  )(X3)


@scenario
def call_eager(ctx):
  """``call`` eagerly."""
  return hcb.call(_host(ctx, lambda a: a * 2), X3, result_shape=X3)


@scenario
def call_eager_python_scalar(ctx):
  """``call`` eagerly on a Python float."""
  return hcb.call(_host(ctx, lambda a: a * 2), 1.5, result_shape=1.5)


@scenario
def call_pytree_operand(ctx):
  """A pytree operand: dict with a tuple."""

  def host(a):
    return a["x"] + a["y"][0]

  return jax.jit(lambda d: hcb.call(_host(ctx, host), d, result_shape=X3))(
    {"x": X3, "y": (np.float32(1.0), np.int32(2))}
  )


@scenario
def call_zero_size(ctx):
  """A zero-size operand and result."""
  z = np.zeros((0, 2), np.float32)
  return jax.jit(
    lambda x: hcb.call(_host(ctx, lambda a: a), x, result_shape=x)
  )(z)


@scenario
def call_in_scan(ctx):
  """``call`` in a scan body."""

  def body(c, x):
    return hcb.call(lambda a: a + 1, c + x, result_shape=c), None

  return jax.lax.scan(body, np.float32(0.0), X3)[0]


@scenario
def call_in_cond(ctx):
  """``call`` in a cond branch."""

  def f(x):
    return jax.lax.cond(
      x > 0,
      lambda v: hcb.call(lambda a: a * 10, v, result_shape=v),
      lambda v: v,
      x,
    )

  g = jax.jit(f)
  return g(np.float32(1.0)), g(np.float32(-1.0))


@scenario
def call_with_device_jit(ctx):
  """``call_with_device=True`` under jit."""

  def host(a, *, device):
    ctx.log("device:", device)
    return a

  return jax.jit(
    lambda x: hcb.call(host, x, result_shape=x, call_with_device=True)
  )(X3)


@scenario
def call_pure_flavor(ctx):
  """``callback_flavor=PURE`` under jit."""
  return jax.jit(
    lambda x: hcb.call(
      _host(ctx, lambda a: a + 1),
      x,
      result_shape=x,
      callback_flavor=hcb.CallbackFlavor.PURE,
    )
  )(X3)


@scenario
def call_returns_float64(ctx):
  """The host returns float64 where float32 is expected."""
  return jax.jit(
    lambda x: hcb.call(lambda a: a.astype(np.float64), x, result_shape=x)
  )(X3)


@scenario(
  ours=(
    "documented difference: a failing call raises in the caller and is "
    "recorded for the next barrier_wait too (legacy 0.4.30 on CPU "
    "only raised in the caller)"
  ),
  expect=(
    "raised JaxRuntimeError: INTERNAL: CpuCallback error: Traceback (most recent call last):\n"
    "  <frames>\n"
    "TypeError: Callback func <callback> should have returned a result with pytree PyTreeDef((*, *)) but returned PyTreeDef([*, *])\n"
    "barrier raised CallbackException: There were exceptions during callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "TypeError: Callback func <callback> should have returned a result with pytree PyTreeDef((*, *)) but returned PyTreeDef([*, *])\n"
    "\n"
  ),
)
def call_returns_list_for_tuple(ctx):
  """The host returns a list where a tuple is expected."""
  return jax.jit(lambda x: hcb.call(lambda a: [a, a], x, result_shape=(x, x)))(
    X3
  )


@scenario
def call_returns_python_number(ctx):
  """The host returns a Python float for a float32 scalar result."""
  return jax.jit(
    lambda x: hcb.call(lambda a: 2.5, x, result_shape=np.float32(0))
  )(X3)


@scenario
def call_keeps_large_operands(ctx):
  """The accumulator pattern: the host keeps 256 KiB operands, later runs
  must not change what it kept."""
  kept = []

  def host(a):
    kept.append(a)
    return np.float32(0.0)

  f = jax.jit(lambda x: hcb.call(host, x * 1.0, result_shape=np.float32(0)))
  for i in range(4):
    f(np.full((1 << 16,), i, np.float32)).block_until_ready()
  for _ in range(4):
    jnp.ones((1 << 16,), np.float32).block_until_ready()
  return [float(k[0]) for k in kept], [float(k[-1]) for k in kept]


@scenario
def call_eager_compiles_once(ctx):
  """Three eager calls with one function and shapes: how many compiles
  (counted from JAX's compile log)."""
  import logging

  records = []

  class Count(logging.Handler):
    def emit(self, record):
      if "ompil" in record.getMessage():  # "Compiling <name> ..."
        records.append(record.getMessage().split(" ")[0])

  handler = Count()
  logger = logging.getLogger("jax")
  logger.addHandler(handler)
  x = np.arange(7, dtype=np.int16)  # a shape no other scenario uses
  host = lambda a: a
  try:
    with jax.log_compiles(True):
      for _ in range(3):
        hcb.call(host, x, result_shape=x).block_until_ready()
  finally:
    logger.removeHandler(handler)
  ctx.log("compile log records:", len(records) > 0)
  return sum(1 for r in records if r == "Compiling")


@scenario
def call_pure_flavor_between_taps(ctx):
  """``id_tap``, then a ``callback_flavor=PURE`` call, then ``id_tap`` of
  its result: the three run in program order."""

  def f(x):
    hcb.id_tap(ctx.tapper("before"), x)
    y = hcb.call(
      _host(ctx, lambda a: a + 1),
      x,
      result_shape=x,
      callback_flavor=hcb.CallbackFlavor.PURE,
    )
    return hcb.id_tap(ctx.tapper("after"), y)

  return jax.jit(f)(X3)


@scenario(
  ours=(
    "a failing call raises in the caller and is recorded for the next "
    "barrier_wait too (legacy 0.4.30 on CPU only raised in the caller; "
    "err_call_raises_jit); the tap before it ran first, as in legacy"
  ),
  expect=(
    "tap[before]: np.ndarray(float32, (3,), [0.0, 1.0, 2.0]) transforms=()\n"
    "host got: np.ndarray(float32, (3,), [0.0, 1.0, 2.0])\n"
    "raised JaxRuntimeError: INTERNAL: CpuCallback error: Traceback (most "
    "recent call last):\n"
    "  <frames>\n"
    "ValueError: call boom\n"
    "barrier raised CallbackException: There were exceptions during "
    "callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "ValueError: call boom\n"
    "\n"
  ),
)
def call_pure_flavor_raises_after_tap(ctx):
  """A ``callback_flavor=PURE`` call that raises between two ``id_tap`` s:
  the tap before it has run, the one after it never runs, and the call's
  failure is reported as before."""

  def fail(a):
    raise ValueError("call boom")

  def f(x):
    hcb.id_tap(ctx.tapper("before"), x)
    y = hcb.call(
      _host(ctx, fail),
      x,
      result_shape=x,
      callback_flavor=hcb.CallbackFlavor.PURE,
    )
    return hcb.id_tap(ctx.tapper("after"), y)

  return jax.jit(f)(X3)
