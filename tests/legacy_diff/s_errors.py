"""Scenarios: error cases, their exception types and their messages.

The runner records ``raised Type: message`` for an exception that reaches
the scenario and ``barrier raised ...`` for one that the closing
``barrier_wait`` raises; both are compared as text (tracebacks reduced to
their last line by the normalization).
"""

import jax
import numpy as np
from jax.experimental import host_callback as hcb

from registry import scenario

X3 = np.arange(3, dtype=np.float32)


def _boom(arg, transforms):
  raise ValueError(f"boom {arg!r}")


@scenario
def err_id_tap_kwargs(ctx):
  """``id_tap(f, x, y=1)``: the removed **kwargs support."""
  hcb.id_tap(ctx.tap, X3, y=1)


@scenario
def err_call_bad_result_shape_string(ctx):
  """``result_shape="x"``: neither a number nor shape/dtype."""
  jax.jit(lambda x: hcb.call(lambda a: a, x, result_shape="x"))(X3)


@scenario
def err_call_bad_result_shape_object(ctx):
  """``result_shape=object()``."""
  hcb.call(lambda a: a, X3, result_shape=object())


@scenario(
  ours=(
    "legacy 0.4.30 ran CPU taps synchronously, so a failing tap "
    "failed the computation with JaxRuntimeError; hostcb runs "
    "taps asynchronously, as legacy's documentation describes: "
    "the computation completes and the next barrier_wait raises "
    "CallbackException"
  ),
  expect=(
    "raised CallbackException: There were exceptions during callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "ValueError: boom array([0., 1., 2.], dtype=float32)\n"
    "\n"
  ),
)
def err_tap_raises_jit(ctx):
  """A tap function that raises, under jit."""
  return jax.jit(lambda x: hcb.id_tap(_boom, x) + 1)(X3)


@scenario(
  ours=(
    "legacy 0.4.30 ran CPU taps synchronously, so a failing tap "
    "failed the computation with JaxRuntimeError; hostcb runs "
    "taps asynchronously, as legacy's documentation describes: "
    "the computation completes and the next barrier_wait raises "
    "CallbackException"
  ),
  expect=(
    "raised CallbackException: There were exceptions during callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "ValueError: boom array([0., 1., 2.], dtype=float32)\n"
    "\n"
  ),
)
def err_tap_raises_eager(ctx):
  """A tap function that raises, eagerly."""
  return hcb.id_tap(_boom, X3)


@scenario(
  ours=(
    "legacy 0.4.30 ran CPU taps synchronously, so a failing tap "
    "failed the computation with JaxRuntimeError; hostcb runs "
    "taps asynchronously, as legacy's documentation describes: "
    "the computation completes and the next barrier_wait raises "
    "CallbackException"
  ),
  expect=(
    "tap: np.ndarray(float32, (3,), [0.0, 1.0, 2.0]) transforms=()\n"
    "raised CallbackException: There were exceptions during callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "ValueError: boom array([0., 1., 2.], dtype=float32)\n"
    "\n"
  ),
)
def err_tap_raises_then_ok(ctx):
  """A failing tap, then a good one: is the error kept until the barrier?"""
  f = jax.jit(lambda x: hcb.id_tap(_boom, x))
  try:
    f(X3)
  except Exception as e:  # noqa: BLE001
    ctx.log("first run raised", type(e).__name__)
  return jax.jit(lambda x: hcb.id_tap(ctx.tap, x))(X3)


@scenario(
  ours=(
    "documented difference: a failing call raises in the caller and is "
    "recorded for the next barrier_wait too (legacy 0.4.30 on CPU "
    "only raised in the caller)"
  ),
  expect=(
    "raised JaxRuntimeError: INTERNAL: CpuCallback error: Traceback (most recent call last):\n"
    "  <frames>\n"
    "ValueError: host failed\n"
    "barrier raised CallbackException: There were exceptions during callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "ValueError: host failed\n"
    "\n"
  ),
)
def err_call_raises_jit(ctx):
  """A call whose host function raises, under jit."""

  def host(a):
    raise ValueError("host failed")

  return jax.jit(lambda x: hcb.call(host, x, result_shape=x))(X3)


@scenario(
  ours=(
    "documented difference: a failing call raises in the caller and is "
    "recorded for the next barrier_wait too (legacy 0.4.30 on CPU "
    "only raised in the caller)"
  ),
  expect=(
    "raised JaxRuntimeError: INTERNAL: CpuCallback error: Traceback (most recent call last):\n"
    "  <frames>\n"
    "ValueError: host failed\n"
    "barrier raised CallbackException: There were exceptions during callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "ValueError: host failed\n"
    "\n"
  ),
)
def err_call_raises_eager(ctx):
  """A call whose host function raises, eagerly."""

  def host(a):
    raise ValueError("host failed")

  return hcb.call(host, X3, result_shape=X3)


@scenario(
  ours=(
    "documented difference: a failing call raises in the caller and is "
    "recorded for the next barrier_wait too (legacy 0.4.30 on CPU "
    "only raised in the caller)"
  ),
  expect=(
    "caller raised JaxRuntimeError\n"
    "raised CallbackException: There were exceptions during callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "ValueError: host failed\n"
    "\n"
  ),
)
def err_call_raises_then_barrier(ctx):
  """A failing call caught by the caller, then ``barrier_wait``: what
  reaches the barrier (a documented difference)."""

  def host(a):
    raise ValueError("host failed")

  try:
    jax.jit(lambda x: hcb.call(host, x, result_shape=x))(X3)
  except Exception as e:  # noqa: BLE001
    ctx.log("caller raised", type(e).__name__)
  hcb.barrier_wait()
  ctx.log("barrier passed")


@scenario(
  ours=(
    "documented difference: a failing call raises in the caller and is "
    "recorded for the next barrier_wait too (legacy 0.4.30 on CPU "
    "only raised in the caller)"
  ),
  expect=(
    "raised JaxRuntimeError: INTERNAL: CpuCallback error: Traceback (most recent call last):\n"
    "  <frames>\n"
    "TypeError: Callback func <callback> should have returned a result with abstract values ShapedArray(float32[3]) but returned ShapedArray(float32[4])\n"
    "barrier raised CallbackException: There were exceptions during callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "TypeError: Callback func <callback> should have returned a result with abstract values ShapedArray(float32[3]) but returned ShapedArray(float32[4])\n"
    "\n"
  ),
)
def err_call_wrong_shape(ctx):
  """The host returns a result of the wrong shape."""
  return jax.jit(
    lambda x: hcb.call(lambda a: np.zeros(4, np.float32), x, result_shape=x)
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
    "TypeError: Callback func <callback> should have returned a result with abstract values ShapedArray(float32[3]) but returned ShapedArray(int32[3])\n"
    "barrier raised CallbackException: There were exceptions during callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "TypeError: Callback func <callback> should have returned a result with abstract values ShapedArray(float32[3]) but returned ShapedArray(int32[3])\n"
    "\n"
  ),
)
def err_call_wrong_dtype(ctx):
  """The host returns int32 where float32 is expected."""
  return jax.jit(
    lambda x: hcb.call(lambda a: a.astype(np.int32), x, result_shape=x)
  )(X3)


@scenario
def err_call_under_vmap(ctx):
  """``call`` under vmap (IO_CALLBACK flavor)."""
  return jax.vmap(lambda x: hcb.call(lambda a: a, x, result_shape=x))(X3)


@scenario
def err_call_under_jvp(ctx):
  """``call`` under jvp."""
  return jax.jvp(
    lambda x: hcb.call(lambda a: a, x, result_shape=x), (X3,), (X3,)
  )


@scenario
def err_call_under_grad(ctx):
  """``call`` under grad."""
  return jax.grad(lambda x: hcb.call(lambda a: a, x, result_shape=x))(
    np.float32(1.0)
  )


@scenario
def err_call_debug_flavor_with_result(ctx):
  """``CallbackFlavor.DEBUG`` with a result_shape."""
  return jax.jit(
    lambda x: hcb.call(
      lambda a: a, x, result_shape=x, callback_flavor=hcb.CallbackFlavor.DEBUG
    )
  )(X3)


@scenario
def err_id_tap_string_arg(ctx):
  """A string as the tapped value."""
  return jax.jit(lambda x: hcb.id_tap(ctx.tap, ("s", x)))(X3)


@scenario
def err_id_tap_not_callable(ctx):
  """A tap function that is not callable."""
  return jax.jit(lambda x: hcb.id_tap(3, x))(X3)


@scenario(
  ours=(
    "legacy 0.4.30 ran CPU taps synchronously, so a failing tap "
    "failed the computation with JaxRuntimeError; hostcb runs "
    "taps asynchronously, as legacy's documentation describes: "
    "the computation completes and the next barrier_wait raises "
    "CallbackException"
  ),
  expect=(
    "raised CallbackException: There were exceptions during callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "TypeError: err_tap_wrong_signature.<locals>.<lambda>.<locals>.<lambda>() takes 1 positional argument but 2 were given\n"
    "\n"
  ),
)
def err_tap_wrong_signature(ctx):
  """A tap function taking one argument only."""
  return jax.jit(lambda x: hcb.id_tap(lambda a: None, x))(X3)


@scenario(
  ours=(
    "documented difference: a failing call raises in the caller and is "
    "recorded for the next barrier_wait too (legacy 0.4.30 on CPU "
    "only raised in the caller)"
  ),
  expect=(
    "raised JaxRuntimeError: INTERNAL: CpuCallback error: Traceback (most recent call last):\n"
    "  <frames>\n"
    "TypeError: Callback func <callback> should have returned a result with pytree PyTreeDef((*, *)) but returned PyTreeDef(*)\n"
    "barrier raised CallbackException: There were exceptions during callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "TypeError: Callback func <callback> should have returned a result with pytree PyTreeDef((*, *)) but returned PyTreeDef(*)\n"
    "\n"
  ),
)
def err_call_result_shape_mismatch_pytree(ctx):
  """The host returns one value where result_shape is a pair."""
  return jax.jit(lambda x: hcb.call(lambda a: a, x, result_shape=(x, x)))(X3)


@scenario(
  ours=(
    "legacy 0.4.30 ran CPU taps synchronously, so a failing tap "
    "failed the computation with JaxRuntimeError; hostcb runs "
    "taps asynchronously, as legacy's documentation describes: "
    "the computation completes and the next barrier_wait raises "
    "CallbackException"
  ),
  expect=("barrier 0 raised CallbackException\nbarrier 1 passed\n"),
)
def err_barrier_twice(ctx):
  """After a failing tap, the first barrier raises, the second does not."""
  jax.jit(lambda x: hcb.id_tap(_boom, x))(X3)
  for i in range(2):
    try:
      hcb.barrier_wait()
      ctx.log(f"barrier {i} passed")
    except Exception as e:  # noqa: BLE001
      ctx.log(f"barrier {i} raised", type(e).__name__)


@scenario(
  ours=(
    "legacy 0.4.30 rejected any device_index on CPU (outfeed "
    "only); hostcb supports device_index and rejects one beyond "
    "the devices"
  ),
  expect=(
    "raised ValueError: device_index must name one of the 2 "
    "devices (0 to 1); got 5\n"
  ),
)
def err_device_index_out_of_range(ctx):
  """``device_index=5`` with 2 devices."""
  return jax.jit(lambda x: hcb.id_tap(ctx.tap, x, device_index=5))(X3)


@scenario
def err_call_with_device_eager(ctx):
  """``call_with_device=True`` eagerly."""

  def host(a, *, device):
    ctx.log("device:", device)
    return a

  return hcb.call(host, X3, result_shape=X3, call_with_device=True)
