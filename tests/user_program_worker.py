"""One program of tests/test_user_programs.py, in a fresh interpreter.

``python user_program_worker.py PROGRAM [ARGS]``: runs ``PROGRAM`` (one
function below) and prints what it computed and what its callbacks
printed, one line each.  The environment sets the devices
(``XLA_FLAGS``) and, in ``HOSTCB_USER_CACHE``, JAX's persistent
compilation cache directory (none if empty).
"""

from __future__ import annotations

import os
import sys

import jax

if os.environ.get("HOSTCB_USER_CACHE"):
  jax.config.update(
    "jax_compilation_cache_dir", os.environ["HOSTCB_USER_CACHE"]
  )
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import jax.numpy as jnp
import numpy as np

import hostcb


def out(*parts) -> None:
  print(*parts, flush=True)


# ------------------------------------------------------------ uninstall
def uninstall_then_exit(entry: str) -> None:
  """Twenty prints dispatched, then ``uninstall()``, then exit."""
  if entry == "jax.debug.print":
    hostcb.install(jax_callbacks=True)

    def body(x):
      jax.debug.print("x={}", x)
      return x
  else:
    assert entry == "hostcb.id_print", entry

    def body(x):
      return hostcb.id_print(x, output_stream=_Prefixed("x="))

  f = jax.jit(body)
  for i in range(20):
    f(np.float32(i))
  hostcb.uninstall()


class _Prefixed:
  """An ``output_stream`` that writes each line of ``id_print`` to stdout
  after ``prefix``."""

  def __init__(self, prefix: str):
    self.prefix = prefix

  def write(self, text: str) -> None:
    for line in text.splitlines():
      out(self.prefix + line)


_traces = [0]


def _print_x(x):
  _traces[0] += 1
  jax.debug.print("x={}", x)
  return x


def retrace_after_uninstall() -> None:
  hostcb.install(jax_callbacks=True)
  f = jax.jit(_print_x)
  f(np.float32(1))
  jax.effects_barrier()
  out("installed", hostcb.jax_callbacks_installed())
  f(np.float32(2))
  jax.effects_barrier()
  out("after barrier")
  hostcb.uninstall()
  out("installed", hostcb.jax_callbacks_installed())
  f(np.float32(3))
  jax.effects_barrier()
  out("after barrier")
  out("traces", _traces[0])


def call_after_uninstall_then_exit() -> None:
  """A jitted ``id_print`` called once, ``uninstall()``, called again,
  exit: no barrier."""
  f = jax.jit(lambda x: hostcb.id_print(x, output_stream=_Prefixed("x=")))
  f(np.float32(1))
  hostcb.uninstall()
  f(np.float32(2))


# ------------------------------------------------------- export
def _log_loss(loss, transforms) -> None:
  out(f"log loss={float(loss):.6f}")


def _adam_step(state, batch):
  """One Adam step of a least-squares fit; taps its loss by name and
  prints its step with hostcb.debug.print."""
  w, m, v, t = state["w"], state["m"], state["v"], state["t"]
  x, y = batch
  loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
  t = t + 1
  m = 0.9 * m + 0.1 * g
  v = 0.999 * v + 0.001 * g * g
  step = 0.05 * (m / (1 - 0.9**t)) / (jnp.sqrt(v / (1 - 0.999**t)) + 1e-8)
  hostcb.id_tap(_log_loss, loss)
  hostcb.debug.print("step {t} loss {l:.6f}", t=t, l=loss)
  return {"w": w - step, "m": m, "v": v, "t": t}, loss


def _train(state, xs, ys):
  return jax.lax.scan(_adam_step, state, (xs, ys))


def _data(devices: int = 1):
  rng = np.random.default_rng(0)
  xs = rng.normal(size=(4, 4 * devices, 3)).astype(np.float32)
  ys = xs @ np.array([1.0, -2.0, 3.0], np.float32)
  state = {
    "w": np.zeros(3, np.float32),
    "m": np.zeros(3, np.float32),
    "v": np.zeros(3, np.float32),
    "t": np.float32(0),
  }
  return state, xs, ys


def export_training(path: str) -> None:
  """Exports the training loop (donating its state) to ``path``, runs it
  here and prints its losses."""
  hostcb.register("user.log_loss", _log_loss)
  state, xs, ys = _data()
  f = jax.jit(_train, donate_argnums=0)
  exp = jax.export.export(f, disabled_checks=hostcb.export_checks())(
    state, xs, ys
  )
  with open(path, "wb") as file:
    file.write(exp.serialize())
  _, losses = f(jax.device_put(state), xs, ys)
  hostcb.barrier_wait()
  out("losses", np.asarray(losses).tolist())


def run_exported(path: str) -> None:
  """Runs the artifact twice in this process, which lowered no tap, and
  ends without a barrier."""
  hostcb.register("user.log_loss", _log_loss)
  with open(path, "rb") as file:
    exp = jax.export.deserialize(bytearray(file.read()))
  initial, xs, ys = _data()
  f = jax.jit(exp.call, donate_argnums=0)
  for _ in range(2):  # each from the initial state, donated
    state = jax.device_put(initial)
    _, losses = f(state, xs, ys)
    losses = np.asarray(losses).tolist()
    hostcb.barrier_wait()  # (its lines before the losses)
    out("losses", losses, "donated", state["w"].is_deleted())
  f(jax.device_put(initial), xs, ys)  # no barrier after this one


PROGRAMS = {
  f.__name__: f
  for f in (
    uninstall_then_exit,
    retrace_after_uninstall,
    call_after_uninstall_then_exit,
    export_training,
    run_exported,
  )
}

if __name__ == "__main__":
  PROGRAMS[sys.argv[1]](*sys.argv[2:])
