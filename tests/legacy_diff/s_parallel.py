"""Scenarios: pmap (2 CPU devices), sharded jit, devices of taps."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import host_callback as hcb
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from registry import scenario

X2 = np.arange(2, dtype=np.float32)
X24 = np.arange(8, dtype=np.float32).reshape(2, 4)


@scenario(unordered=True)
def par_pmap_tap(ctx):
  """A tap in pmap: one per device, with its slice."""
  return jax.pmap(lambda x: hcb.id_tap(ctx.tap, x * 2))(X24)


@scenario(unordered=True)
def par_pmap_tap_with_device(ctx):
  """A tap with ``tap_with_device`` in pmap."""
  return jax.pmap(lambda x: hcb.id_tap(ctx.tap, x + 1, tap_with_device=True))(
    X2
  )


@scenario(unordered=True)
def par_pmap_print(ctx):
  """id_print in pmap, with device."""
  return jax.pmap(lambda x: hcb.id_print(x, what="p", tap_with_device=True))(
    X24
  )


@scenario(unordered=True)
def par_pmap_call_with_device(ctx):
  """call with ``call_with_device`` in pmap."""

  def host(a, *, device):
    ctx.log("call on", device, "with", a.tolist())
    return a * 10

  return jax.pmap(
    lambda x: hcb.call(host, x, result_shape=x, call_with_device=True)
  )(X24)


@scenario(unordered=True)
def par_pmap_vmap(ctx):
  """vmap inside pmap: batched taps per device."""
  return jax.pmap(
    jax.vmap(lambda x: hcb.id_tap(ctx.tap, x, tap_with_device=True))
  )(X24)


@scenario(unordered=True)
def par_pmap_grad(ctx):
  """grad inside pmap."""
  return jax.pmap(jax.grad(lambda x: jnp.sin(hcb.id_tap(ctx.tap, x))))(X2)


@scenario(unordered=True)
def par_pmap_collective(ctx):
  """A tap of a psum result in pmap."""
  return jax.pmap(
    lambda x: hcb.id_tap(ctx.tap, jax.lax.psum(x, "i")), axis_name="i"
  )(X2)


@scenario(
  ours="documented difference: under jit of a "
  "pmap, hostcb runs a tap outside the pmap once, legacy once per "
  "device",
  expect="tap[inside]: np.ndarray(float32, (), 0.0) transforms=() "
  "device=cpu:0\n"
  "tap[inside]: np.ndarray(float32, (), 1.0) transforms=() "
  "device=cpu:1\n"
  "tap[outside]: np.ndarray(float32, (2,), [1.0, 2.0]) "
  "transforms=() device=cpu:0\n"
  "result: jax.Array(float32, (2,), weak=False, [1.0, 2.0])\n",
  unordered=True,
)
def par_jit_of_pmap_outside_tap(ctx):
  """A tap inside and one outside a pmap, all under jit."""

  def f(x):
    y = jax.pmap(
      lambda v: hcb.id_tap(ctx.tapper("inside"), v, tap_with_device=True)
    )(x)
    return hcb.id_tap(ctx.tapper("outside"), y + 1, tap_with_device=True)

  return jax.jit(f)(X2)


@scenario
def par_sharded_jit_tap(ctx):
  """A tap in a jit over an operand sharded on 2 devices: one tap of the
  whole value, from device 0."""
  mesh = Mesh(jax.devices()[:2], ("d",))
  x = jax.device_put(X24, NamedSharding(mesh, P("d")))
  return jax.jit(lambda x: hcb.id_tap(ctx.tap, x * 2, tap_with_device=True))(x)


@scenario
def par_sharded_jit_call(ctx):
  """A call in a sharded jit: the host sees the whole operand."""
  mesh = Mesh(jax.devices()[:2], ("d",))
  x = jax.device_put(X24, NamedSharding(mesh, P("d")))

  def host(a):
    ctx.log("host got shape", a.shape)
    return a + 1

  return jax.jit(lambda x: hcb.call(host, x, result_shape=x))(x)


@scenario(
  ours=(
    "legacy 0.4.30's CPU callback reported device 0 for every "
    "jit; hostcb reports the device that ran the tap (cpu:1 for "
    "an operand there)"
  ),
  expect=(
    "tap: np.ndarray(float32, (2,), [0.0, 1.0]) transforms=() device=cpu:1\n"
    "result: jax.Array(float32, (2,), weak=False, [0.0, 1.0])\n"
  ),
)
def par_jit_on_device1(ctx):
  """A jit whose operand lives on device 1: the tap comes from cpu:1."""
  x = jax.device_put(X2, jax.devices()[1])
  return jax.jit(lambda x: hcb.id_tap(ctx.tap, x, tap_with_device=True))(x)


@scenario
def par_eager_tap_with_device(ctx):
  """An eager tap with ``tap_with_device``."""
  return hcb.id_tap(ctx.tap, X2, tap_with_device=True)


@scenario
def par_barrier_after_pmap(ctx):
  """barrier_wait after a pmap of taps: all taps arrived."""
  got = []
  jax.pmap(lambda x: hcb.id_tap(lambda a, t: got.append(a.tolist()), x))(X2)
  hcb.barrier_wait()
  return sorted(got)
