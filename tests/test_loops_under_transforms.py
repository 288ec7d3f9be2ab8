"""Taps and calls in loops under transformations: once per step, wherever
their operands come from.

JAX moves the loop-invariant work of a differentiated loop out of it
(``grad``, ``vjp``, ``linearize``, ``checkpoint``); a tap or call there
stays in the loop and runs once per step, with the values of that step
(docs/debugging.md, "Loops under transformations").  Each entry point
runs in a loop of :data:`STEPS` steps under each transformation, with a
loop-invariant operand (:data:`K`) and with the step's index; the values
and gradients are those of the same function without the tap.
"""

from __future__ import annotations

import contextlib
import io
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcb
from hostcb import debug as hdebug
from _helpers import run_python

STEPS = 5
K = np.float32(3.0)
_F32 = jax.ShapeDtypeStruct((), jnp.float32)


class Seen:
  """The values that a loop's taps or calls saw, in the order they ran."""

  def __init__(self):
    self.values: list[float] = []
    self._lock = threading.Lock()

  def __call__(self, value) -> None:
    with self._lock:
      self.values.append(float(np.asarray(value)))


def _returning(seen: Seen) -> callable:
  def host(value):
    seen(value)
    return np.asarray(value, np.float32)

  return host


# entry point -> fire(seen, value): the tap or call of ``value`` in a body.
ENTRIES = {
  "id_tap": lambda seen, v: hostcb.id_tap(lambda a, t: seen(a), v),
  "call": lambda seen, v: hostcb.call(_returning(seen), v, result_shape=_F32),
  "debug.callback": lambda seen, v: hdebug.callback(seen, v),
  "io_callback": lambda seen, v: hostcb.io_callback(_returning(seen), _F32, v),
  "io_callback(ordered)": lambda seen, v: hostcb.io_callback(
    _returning(seen), _F32, v, ordered=True
  ),
}
# The entries that tap (an identity with an effect): run again when the
# backward pass recomputes the forward pass under checkpoint.
TAPS = ("id_tap", "debug.callback")


def _operand(which: str, i):
  """The tapped value: loop-invariant (K) or the step's index."""
  return jnp.float32(K) if which == "invariant" else i.astype(jnp.float32)


def _scan_loss(fire, which):
  def loss(x):
    def body(c, i):
      if fire is not None:
        fire(_operand(which, i))
      return c * 2.0 + 1.0, None

    return lax.scan(body, x, jnp.arange(STEPS))[0]

  return loss


def _fori_loss(fire, which):
  def loss(x):
    def body(i, c):
      if fire is not None:
        fire(_operand(which, i))
      return c * 2.0 + 1.0

    return lax.fori_loop(0, STEPS, body, x)

  return loss


LOOPS = {"scan": _scan_loss, "fori_loop": _fori_loss}

TRANSFORMS = {
  "grad": jax.grad,
  "vjp": lambda f: lambda x: jax.vjp(f, x)[1](1.0)[0],
  "linearize": lambda f: lambda x: jax.linearize(f, x)[1](1.0),
  "jvp": lambda f: lambda x: jax.jvp(f, (x,), (1.0,))[1],
  "checkpoint": lambda f: jax.grad(jax.checkpoint(f)),
  "vmap": lambda f: lambda x: jax.vmap(f)(x * jnp.ones(3)),
}


def _run(transform: str, loop: str, entry: str | None, which: str):
  seen = Seen()
  fire = None if entry is None else lambda v: ENTRIES[entry](seen, v)
  f = jax.jit(TRANSFORMS[transform](LOOPS[loop](fire, which)))
  out = jax.block_until_ready(f(jnp.float32(1.5)))
  jax.effects_barrier()
  return np.asarray(out), seen.values


def _expected(transform: str, entry: str, which: str) -> list[float]:
  """Once per step with that step's value; under checkpoint a tap runs
  again when the backward pass recomputes the forward loop."""
  steps = [float(K) if which == "invariant" else float(i) for i in range(STEPS)]
  if transform == "checkpoint" and entry in TAPS:
    return steps + steps
  return steps


def _cases():
  for transform in TRANSFORMS:
    for entry in ENTRIES:
      if transform == "checkpoint" and entry.startswith("io_callback"):
        continue  # refused, as JAX's (below)
      for loop in LOOPS:
        for which in ("invariant", "step index"):
          yield pytest.param(
            transform,
            entry,
            loop,
            which,
            id=f"{transform}-{entry}-{loop}-{which}",
          )


@pytest.mark.parametrize("transform,entry,loop,which", list(_cases()))
def test_a_tap_or_call_in_a_loop_runs_once_per_step(
  transform, entry, loop, which
):
  out, values = _run(transform, loop, entry, which)
  assert values == _expected(transform, entry, which)
  plain, _ = _run(transform, loop, None, which)
  np.testing.assert_array_equal(out, plain)  # the value or gradient


def _jax_io_callback_error(ordered: bool) -> str:
  """The words of JAX's own error for its io_callback under checkpoint."""
  from jax.experimental import io_callback

  def loss(x):
    def body(c, _):
      io_callback(lambda v: v, _F32, jnp.float32(K), ordered=ordered)
      return c * 2.0, None

    return lax.scan(body, x, None, length=STEPS)[0]

  with pytest.raises(NotImplementedError) as jax_error:
    jax.jit(jax.grad(jax.checkpoint(loss)))(jnp.float32(1.0))
  return str(jax_error.value).split(":")[0]


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
def test_io_callback_under_checkpoint_is_refused_as_jaxs(ordered):
  words = _jax_io_callback_error(ordered)
  assert words.startswith("Effects not supported in ")
  entry = "io_callback(ordered)" if ordered else "io_callback"
  with pytest.raises(NotImplementedError, match=re.escape(words + ": [")):
    _run("checkpoint", "scan", entry, "invariant")


def test_debug_print_in_a_loop_prints_once_per_step_under_grad():
  def loss(x):
    def body(c, _):
      hdebug.print("k={k}", k=jnp.float32(K))
      return c * 2.0, None

    return lax.scan(body, x, None, length=STEPS)[0]

  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.block_until_ready(jax.jit(jax.grad(loss))(1.0))
    jax.effects_barrier()
  assert out.getvalue() == "k=3.0\n" * STEPS


def test_id_print_in_a_loop_prints_once_per_step_under_grad():
  stream = io.StringIO()

  def loss(x):
    def body(c, _):
      hostcb.id_print(jnp.float32(K), output_stream=stream, what="k")
      return c * 2.0, None

    return lax.scan(body, x, None, length=STEPS)[0]

  jax.block_until_ready(jax.jit(jax.grad(loss))(1.0))
  hostcb.barrier_wait()
  assert stream.getvalue() == "what: k\n3.\n" * STEPS


# ----------------------------------------------- taps nested in the body
def _nested_loss(nest, seen):
  def loss(x):
    def body(c, _):
      nest(lambda k: hostcb.id_tap(lambda a, t: seen(a), k))
      return c * 2.0, None

    return lax.scan(body, x, None, length=STEPS)[0]

  return loss


def _with_custom_jvp(f):
  f = jax.custom_jvp(f)
  f.defjvp(lambda primals, tangents: (f(*primals), tangents[0]))
  return f


def _with_custom_vjp(f):
  f = jax.custom_vjp(f)
  f.defvjp(lambda k: (f(k), None), lambda _, g: (g,))
  return f


# nest(tap) -> (a body that calls tap(k) inside the construct, taps per step)
NESTS = {
  "jit": (lambda tap: jax.jit(tap)(K), 1),
  "cond": (lambda tap: lax.cond(True, tap, lambda k: k, K), 1),
  "inner scan": (
    lambda tap: lax.scan(lambda a, _: (tap(K), None), 0.0, None, length=3),
    3,
  ),
  "while_loop": (
    lambda tap: lax.while_loop(
      lambda i: i < 3, lambda i: (tap(K), i + 1)[1], 0
    ),
    3,
  ),
  "checkpoint": (lambda tap: jax.checkpoint(tap)(K), 1),
  "custom_jvp": (lambda tap: _with_custom_jvp(tap)(K), 1),
  "custom_vjp": (lambda tap: _with_custom_vjp(tap)(K), 1),
}


@pytest.mark.parametrize("nest", list(NESTS))
@pytest.mark.parametrize("transform", ["grad", "vjp", "linearize"])
def test_a_tap_nested_in_a_loop_body_runs_in_every_step(nest, transform):
  seen = Seen()
  make, per_step = NESTS[nest]
  f = jax.jit(TRANSFORMS[transform](_nested_loss(make, seen)))
  assert float(f(jnp.float32(1.0))) == 2.0**STEPS
  jax.effects_barrier()
  assert seen.values == [float(K)] * (STEPS * per_step)


def test_linearize_of_a_while_loop_taps_again_in_the_linear_function():
  # JAX's linearize of a while_loop (a fori_loop of a traced trip count)
  # runs the whole loop again in the linear function, as checkpoint does;
  # its taps run there again (as legacy's and JAX's own callbacks).
  seen = Seen()

  def f(x, n):
    def body(i, c):
      hostcb.id_tap(lambda a, t: seen(a), i.astype(jnp.float32))
      return c * 2.0

    return lax.fori_loop(0, n, body, x)

  lin = jax.jit(
    lambda x: jax.linearize(lambda x: f(x, jnp.int32(STEPS)), x)[1](1.0)
  )
  assert float(lin(jnp.float32(1.0))) == 2.0**STEPS
  hostcb.barrier_wait()
  assert seen.values == [float(i) for i in range(STEPS)] * 2


# --------------------------------- what stays hoisted, what may be hoisted
def _loop_eqns(jaxpr) -> list:
  """The equations inside the scans of ``jaxpr``, by primitive name."""
  names = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "scan":
      names += [e.primitive.name for e in eqn.params["jaxpr"].jaxpr.eqns]
  return names


def test_loop_invariant_work_around_a_tap_is_still_hoisted():
  def loss(x):
    def body(c, _):
      k = hostcb.id_tap(lambda a, t: None, jnp.float32(K))
      return c * jnp.sin(k), None

    return lax.scan(body, x, None, length=STEPS)[0]

  jaxpr = jax.make_jaxpr(jax.grad(loss))(1.0).jaxpr
  inside = _loop_eqns(jaxpr)
  assert "hostcb_tap" in inside
  assert "sin" not in inside
  assert [e.primitive.name for e in jaxpr.eqns].count("sin") == 1


def test_a_pure_call_of_a_loop_invariant_value_may_be_hoisted():
  seen = Seen()

  def loss(x):
    def body(c, _):
      k = hostcb.pure_callback(_returning(seen), _F32, jnp.float32(K))
      return c * k, None

    return lax.scan(body, x, None, length=STEPS)[0]

  assert float(jax.jit(jax.grad(loss))(jnp.float32(1.0))) == float(K) ** STEPS
  hostcb.barrier_wait()
  assert seen.values == [float(K)]  # as JAX's pure_callback


def test_a_tap_after_uninstall_stays_in_its_loop():
  seen = Seen()
  loss = _nested_loss(lambda tap: tap(K), seen)
  hostcb.uninstall()
  jax.block_until_ready(jax.jit(jax.grad(loss))(jnp.float32(1.0)))
  hostcb.barrier_wait()
  assert seen.values == [float(K)] * STEPS


# -------------------------------- JAX's own callbacks, under install()
_JAX_OWN = r"""
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from jax.experimental import io_callback
import hostcb

hostcb.install(jax_callbacks=True)
f32 = jax.ShapeDtypeStruct((), jnp.float32)
k = jnp.float32(3.0)
runs = []


def host(v):
  runs.append(float(v))
  return np.float32(v)


BODIES = {
  "jax.debug.callback": lambda: jax.debug.callback(host, k),
  "jax.debug.print": lambda: jax.debug.print("k={}", k),
  "io_callback": lambda: io_callback(host, f32, k),
  "io_callback(ordered)": lambda: io_callback(host, f32, k, ordered=True),
}
for name, tap in BODIES.items():
  def loss(x):
    def body(c, _):
      tap()
      return c * 2.0, None
    return lax.scan(body, x, None, length=5)[0]
  runs.clear()
  g = jax.jit(jax.grad(loss))(jnp.float32(1.0))
  jax.effects_barrier()
  print(name, float(g), runs)
"""


def test_jaxs_own_callbacks_under_install_run_once_per_step():
  proc = run_python(_JAX_OWN, timeout=240)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
    "jax.debug.callback 32.0 [3.0, 3.0, 3.0, 3.0, 3.0]",
    *["k=3.0"] * 5,
    "jax.debug.print 32.0 []",
    "io_callback 32.0 [3.0, 3.0, 3.0, 3.0, 3.0]",
    "io_callback(ordered) 32.0 [3.0, 3.0, 3.0, 3.0, 3.0]",
  ]
