"""One program of tests/test_user_programs.py, in a fresh interpreter.

``python user_program_worker.py PROGRAM [ARGS]``: runs ``PROGRAM`` (one
function below) and prints what it computed and what its callbacks
printed, one line each.  The environment sets the devices
(``XLA_FLAGS``) and, in ``HOSTCB_USER_CACHE``, JAX's persistent
compilation cache directory (none if empty).
"""

from __future__ import annotations

import logging
import os
import pickle
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
from jax.experimental import serialize_executable
from jax.sharding import NamedSharding, PartitionSpec as P

import hostcb


def out(*parts) -> None:
  """Prints one line in one write: tap functions of several devices print
  from their own threads."""
  sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
  sys.stdout.flush()


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


def aot_after_uninstall_then_exit() -> None:
  """``jit(f).lower(...).compile()`` of an ``id_print`` loop, called once,
  ``uninstall()``, called three times more, exit: no barrier."""

  def loop(x):
    def body(c, _):
      return hostcb.id_print(c, output_stream=_Prefixed("x=")) + 1, None

    return jax.lax.scan(body, x, None, length=5)[0]

  compiled = jax.jit(loop).lower(np.float32(0)).compile()
  x = compiled(np.float32(0))
  hostcb.uninstall()
  for _ in range(3):
    x = compiled(x)


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


def serialize_training(path: str) -> None:
  """``jit(...).lower(...).compile()`` of the donated training loop,
  serialized (``jax.experimental.serialize_executable``) to ``path``; runs
  it here and prints its losses."""

  hostcb.register("user.log_loss", _log_loss)
  state, xs, ys = _data()
  compiled = jax.jit(_train, donate_argnums=0).lower(state, xs, ys).compile()
  with open(path, "wb") as file:
    pickle.dump(serialize_executable.serialize(compiled), file)
  _, losses = compiled(jax.device_put(state), xs, ys)
  hostcb.barrier_wait()
  out("losses", np.asarray(losses).tolist())


def run_serialized(path: str) -> None:
  """Loads the executable, runs it twice and ends without a barrier."""

  hostcb.register("user.log_loss", _log_loss)
  with open(path, "rb") as file:
    compiled = serialize_executable.deserialize_and_load(*pickle.load(file))
  initial, xs, ys = _data()
  for _ in range(2):
    compiled(jax.device_put(initial), xs, ys)


# ------------------------------------------- AOT, mesh and the cache
class _CacheLog(logging.Handler):
  """Prints JAX's persistent-cache messages about ``jit_train``."""

  def emit(self, record: logging.LogRecord) -> None:
    message = record.getMessage()
    if "jit_train" in message and (
      message.startswith("Persistent compilation cache hit")
      or message.startswith("Not writing persistent cache entry")
    ):
      out("cache:", message.split(" with key")[0].split(" because")[0])


def _tapped_step(tap: str):
  """The Adam step with the metrics tap ``tap`` (``none``: no tap)."""

  def step(state, batch):
    w, m, v, t = state["w"], state["m"], state["v"], state["t"]
    x, y = batch
    loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    t = t + 1
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    w = w - 0.05 * (m / (1 - 0.9**t)) / (jnp.sqrt(v / (1 - 0.999**t)) + 1e-8)
    metrics = {"loss": loss, "step": t}
    if tap == "id_tap":
      hostcb.id_tap(
        lambda a, tr: out(f"tap step {a['step']} loss {a['loss']:.6f}"),
        metrics,
      )
    elif tap == "id_tap_partitioned":  # each device taps its replica
      hostcb.id_tap(
        lambda a, tr, device, index: out(
          f"tap step {a['step']} loss {a['loss']:.6f} device {device.id}"
        ),
        metrics,
        partitioned=True,
        tap_with_device=True,
      )
    elif tap == "debug.print":
      hostcb.debug.print("print step {step} loss {loss:.6f}", **metrics)
    else:
      assert tap == "none", tap
    return {"w": w, "m": m, "v": v, "t": t}, loss

  return step


def aot_training(tap: str) -> None:
  """The Adam loop over a mesh of every device (data split, state
  replicated and donated), compiled ahead of time, run twice."""
  logger = logging.getLogger("jax._src.compiler")
  logger.addHandler(_CacheLog(logging.DEBUG))
  logger.setLevel(logging.DEBUG)
  # To _CacheLog alone: jax 0.8 also writes what reaches its "jax" logger
  # to stderr, which the test checks is empty.
  logger.propagate = False
  n = jax.device_count()
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
  whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  split = jax.sharding.NamedSharding(
    mesh, jax.sharding.PartitionSpec(None, "d")
  )
  initial, xs, ys = _data(n)
  step = _tapped_step(tap)

  def train(state, xs, ys):
    return jax.lax.scan(step, state, (xs, ys))

  states = {k: whole for k in initial}
  f = jax.jit(
    train,
    donate_argnums=0,
    in_shardings=(states, split, split),
    out_shardings=(states, whole),
  )
  state = jax.device_put(initial, whole)
  xs, ys = jax.device_put(xs, split), jax.device_put(ys, split)
  compiled = f.lower(state, xs, ys).compile()
  assert "flops" in compiled.cost_analysis()
  assert "ENTRY" in compiled.as_text()
  for _ in range(2):
    old = state
    state, losses = compiled(state, xs, ys)
    jax.block_until_ready(losses)
    hostcb.barrier_wait()
    deleted = all(x.is_deleted() for x in jax.tree.leaves(old))
    out("losses", np.asarray(losses).tolist(), "donated", deleted)
  out("w", np.asarray(state["w"]).tolist())


# ------------------------------------------------------ exit and waits
def mesh_prints(entry: str, wait: str) -> None:
  """Five steps of a sharded ``jit`` in ``jax.set_mesh``, each printing
  its step and sum with ``entry``; after each, ``wait`` (``none``,
  ``jax.block_until_ready``, ``jax.effects_barrier``) and a line of the
  program's own.  The program ends with no barrier."""
  if entry == "jax.debug.print":
    hostcb.install(jax_callbacks=True)
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))

  def step(x, k):
    if entry == "id_print":
      hostcb.id_print(jnp.sum(x), what=f"step {k}")
    else:  # jax.debug.print here is hostcb's
      jax.debug.print("step {k} sum {s}", k=k, s=jnp.sum(x))
    return x + 1

  with jax.set_mesh(mesh):
    rows = NamedSharding(mesh, P("d"))
    f = jax.jit(step, static_argnums=1, out_shardings=rows)
    x = jax.device_put(jnp.arange(8.0), rows)
    for k in range(5):
      x = f(x, k)
      if wait == "jax.block_until_ready":
        jax.block_until_ready(x)
      elif wait == "jax.effects_barrier":
        jax.effects_barrier()
      else:
        assert wait == "none", wait
      out(f"dispatched {k}")


PROGRAMS = {
  f.__name__: f
  for f in (
    uninstall_then_exit,
    retrace_after_uninstall,
    call_after_uninstall_then_exit,
    aot_after_uninstall_then_exit,
    export_training,
    run_exported,
    serialize_training,
    run_serialized,
    aot_training,
    mesh_prints,
  )
}

if __name__ == "__main__":
  PROGRAMS[sys.argv[1]](*sys.argv[2:])
