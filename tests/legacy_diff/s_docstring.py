"""Scenarios: every example of the legacy module docstring, as written there.

The docstring is ``/work/shared/spec/host_callback_module.txt``; each
scenario names the section it comes from.  The examples print to the
scenario's stdout (``id_print``'s default) or to its ``output_stream``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import host_callback as hcb

from registry import scenario


@scenario
def doc_call_host_eig_jit(ctx):
  """ "Using call": the host's eigenvalues of a symmetric matrix, under jit."""

  def host_eig(m):
    return np.linalg.eigvals(m)

  def device_fun(m):
    return hcb.call(
      host_eig, m, result_shape=jax.ShapeDtypeStruct(m.shape[:-1], m.dtype)
    )

  m = np.array([[2.0, 0.0], [0.0, 3.0]], dtype=np.float32)
  return jax.jit(device_fun)(m)


@scenario
def doc_call_host_eig_eager(ctx):
  """The same eigenvalue call, run eagerly; the host gives float64 back."""

  def host_eig(m):
    ctx.show("host_eig got", m)
    return np.linalg.eigvals(m).astype(np.float32)

  m = np.array([[2.0, 0.0], [0.0, 3.0]], dtype=np.float32)
  return hcb.call(
    host_eig, m, result_shape=jax.ShapeDtypeStruct(m.shape[:-1], m.dtype)
  )


@scenario(unordered=True)
def doc_call_pmap_with_device(ctx):
  """ "When used inside pmap": one call per device, with its device."""

  def host_sin(x, *, device):
    print(f"Invoking host_sin with {x.shape} on {device}")
    return np.sin(x)

  return jax.pmap(
    lambda x: hcb.call(host_sin, x, result_shape=x, call_with_device=True)
  )(np.ones((2, 4), dtype=np.float32))


def _host_func(arg, transforms, *, ctx, what=None, device=None):
  ctx.log(
    f"host_func arg={arg!r} transforms={transforms!r} what={what!r} "
    f"device={device}"
  )


@scenario
def doc_id_tap_examples_jit(ctx):
  """The five ``id_tap`` calls of "Using id_tap", inside one jit."""
  host_func = functools.partial(_host_func, ctx=ctx)

  def f(x, y):
    hcb.id_tap(host_func, 2 * x)
    hcb.id_tap(host_func, (2 * x, 3 * x))
    hcb.id_tap(host_func, 2 * x, tap_with_device=True)
    hcb.id_tap(functools.partial(host_func, what="activation"), 2 * x)
    hcb.id_tap(
      lambda tap, transforms: host_func(tap, (), what="data"), dict(x=x, y=y)
    )
    return x + y

  return jax.jit(f)(np.float32(1.0), np.arange(2, dtype=np.float32))


@scenario
def doc_id_tap_examples_eager(ctx):
  """The five ``id_tap`` calls of "Using id_tap", run eagerly."""
  host_func = functools.partial(_host_func, ctx=ctx)
  x, y = np.float32(1.0), np.arange(2, dtype=np.float32)
  ctx.show("r1", hcb.id_tap(host_func, 2 * x))
  ctx.show("r2", hcb.id_tap(host_func, (2 * x, 3 * x)))
  ctx.show("r3", hcb.id_tap(host_func, 2 * x, tap_with_device=True))
  ctx.show(
    "r4", hcb.id_tap(functools.partial(host_func, what="activation"), 2 * x)
  )
  ctx.show(
    "r5",
    hcb.id_tap(
      lambda tap, transforms: host_func(tap, (), what="data"), dict(x=x, y=y)
    ),
  )


@scenario
def doc_id_print_examples_jit(ctx):
  """The "Using id_tap" examples adapted to ``id_print``, under jit."""

  def f(x, y):
    hcb.id_print(2 * x)
    hcb.id_print((2 * x, 3 * x))
    hcb.id_print(2 * x, tap_with_device=True)
    hcb.id_print(2 * x, what="activation")
    hcb.id_print(dict(x=x, y=y), what="data")
    return x + y

  return jax.jit(f)(np.float32(1.0), np.arange(2, dtype=np.float32))


@scenario
def doc_barrier_wait_accumulator(ctx):
  """ "Using barrier_wait": two jitted runs, two taps each, then the wait."""
  accumulator = []

  def host_log(arg, transforms):
    accumulator.append(arg)

  def device_fun(x):
    hcb.id_tap(host_log, x)
    hcb.id_tap(host_log, 2.0 * x)

  jax.jit(device_fun)(0.0)
  jax.jit(device_fun)(1.0)
  hcb.barrier_wait()
  ctx.show("accumulator", accumulator)


@scenario
def doc_call_accumulator(ctx):
  """The ``call`` alternative to barrier_wait: the results use both calls."""
  accumulator = []

  def host_log(arg):
    accumulator.append(arg)
    return np.float32(0.0)

  def device_fun(x):
    y = hcb.call(host_log, x, result_shape=jax.ShapeDtypeStruct((), np.float32))
    z = hcb.call(
      host_log, 2.0 * x, result_shape=jax.ShapeDtypeStruct((), np.float32)
    )
    return y + z

  res1 = jax.jit(device_fun)(1.0)
  res2 = jax.jit(device_fun)(1.0)
  ctx.show("res1", res1)
  ctx.show("res2", res2)
  ctx.show("accumulator", accumulator)


def power3(x):
  """The docstring's ``power3``: prints ``(x, x^2)``, returns ``x^3``."""
  y = x * x
  hcb.id_print((x, y), what="x,x^2")
  return y * x


def power3_dev(x):
  y = x * x
  hcb.id_print((x, y), what="x,x^2", tap_with_device=True)
  return y * x


@scenario(unordered=True)
def doc_pmap_power3_with_device(ctx):
  """ "Behavior under parallelization": each device taps its own slice."""
  return jax.pmap(power3_dev, devices=jax.local_devices()[:2])(
    np.array([3.0, 4.0], dtype=np.float32)
  )


@scenario
def doc_pjit_power3(ctx):
  """The pjit example: one device collects the whole operand and taps."""
  from jax.experimental import pjit
  from jax.sharding import Mesh, PartitionSpec as P

  with Mesh(jax.local_devices()[:2], ["d"]):
    return pjit.pjit(power3_dev, in_shardings=(P("d"),), out_shardings=P("d"))(
      np.array([3.0, 4.0], dtype=np.float32)
    )


@scenario
def doc_power3_eager(ctx):
  """ "Behavior under autodiff": the plain call, eagerly."""
  return power3(3.0)


@scenario
def doc_power3_jvp(ctx):
  """``jax.jvp(power3, (3.,), (0.1,))``: one tap, primal values only."""
  return jax.jvp(power3, (3.0,), (0.1,))


@scenario
def doc_power3_grad(ctx):
  """``jax.grad(power3)(3.)``: the tap of the forward computation."""
  return jax.grad(power3)(3.0)


@jax.custom_jvp
def print_tangents(arg):
  return None


@print_tangents.defjvp
def print_tangents_jvp(primals, tangents):
  (arg_dot,) = tangents
  hcb.id_print(arg_dot, what="tangents")
  return primals, tangents


def power3_with_tangents(x):
  y = x * x
  hcb.id_print((x, y), what="x,x^2")
  print_tangents((x, y))
  return y * x


@scenario
def doc_print_tangents_jvp(ctx):
  """The custom_jvp that prints tangents, under ``jax.jvp``."""
  return jax.jvp(power3_with_tangents, (3.0,), (0.1,))


@jax.custom_vjp
def print_cotangents(arg):
  return arg


def print_cotangents_fwd(arg):
  return print_cotangents(arg), None


def _print_cotangents_bwd(residual, ct_b):
  hcb.id_print(ct_b, what="cotangents")
  return (ct_b,)


print_cotangents.defvjp(print_cotangents_fwd, _print_cotangents_bwd)


def power3_with_cotangents(x):
  y = x * x
  hcb.id_print((x, y), what="x,x^2")
  (x1, y1) = print_cotangents((x, y))
  return y1 * x1


@scenario
def doc_print_cotangents_grad(ctx):
  """The custom_vjp that prints cotangents, under ``jax.grad``."""
  return jax.grad(power3_with_cotangents)(3.0)


@scenario
def doc_checkpoint_power3_grad(ctx):
  """The checkpoint example: the inner taps run again in the backward pass.

  ``jax.checkpoint`` is the docstring's ``ad_checkpoint.checkpoint`` (the
  same function; JAX 0.10 removed the old name)."""
  return jax.grad(lambda x: power3(jax.checkpoint(power3)(x)))(3.0)


@scenario
def doc_vmap_power3(ctx):
  """ "Behavior under jax.vmap": batched values and the batch transform."""
  return jax.vmap(power3)(np.array([2.0, 3.0], dtype=np.float32))


@scenario
def doc_power3_jit_stream(ctx):
  """``power3`` under jit printing to an ``output_stream``."""

  def f(x):
    y = x * x
    hcb.id_print((x, y), what="x,x^2", output_stream=ctx)
    return y * x

  return jax.jit(f)(jnp.float32(3.0))
