"""A training step that logs two scalars every step to TensorBoard, against
the same step without logging.

The step of ``bench_train_loop.py`` (a 64 -> 128 -> 1 MLP, batch 256,
``value_and_grad`` and a momentum update, jitted, its state donated),
called from a Python loop that never reads its results; it logs the loss
and the gradients' norm every step:

* ``none``: no logging (the reference);
* ``hostcb.metrics``: ``hostcb.metrics.log`` to a ``hostcb.metrics.
  TensorBoard`` sink;
* ``hostcb.id_tap + SummaryWriter``: a tap per step whose function calls
  a TensorBoard ``SummaryWriter.add_scalar`` per value (the naive way,
  on hostcb's engine);
* ``jax.debug.callback + SummaryWriter``: the same function through JAX's
  own callback.

The ``SummaryWriter`` is ``tensorboardX``'s if installed, else PyTorch's
``torch.utils.tensorboard`` (both write with TensorBoard's event writer).
Variants run in interleaved rounds (one loop of each per round, every
other round in reverse order); the table gives the median time per step
and the median over rounds of the ratio to the reference of the same
round.  The sink and the writers are made once; each loop ends once
every step is written and flushed (``metrics.flush()``; the callbacks'
barriers and ``SummaryWriter.flush()``), and every variant must have
logged every step.

    python benchmarks/bench_metrics.py [--steps 1000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp

import hostcb
from hostcb import metrics


def _summary_writer():
  try:
    from tensorboardX import SummaryWriter

    return SummaryWriter, "tensorboardX"
  except ImportError:
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter, "torch.utils.tensorboard"


def _init(key):
  k1, k2 = jax.random.split(key)
  return {
    "w1": jax.random.normal(k1, (64, 128)) * 0.1,
    "b1": jnp.zeros(128),
    "w2": jax.random.normal(k2, (128, 1)) * 0.1,
    "b2": jnp.zeros(1),
  }


def _loss(params, x, y):
  h = jnp.tanh(x @ params["w1"] + params["b1"])
  return jnp.mean((h @ params["w2"] + params["b2"] - y) ** 2)


def make_step(log):
  """The jitted step; ``log(loss, grad_norm, step)`` stages the logging
  (or nothing)."""

  def step(params, velocity, i, x, y):
    loss, grads = jax.value_and_grad(_loss)(params, x, y)
    velocity = jax.tree.map(lambda v, g: 0.9 * v + g, velocity, grads)
    params = jax.tree.map(lambda p, v: p - 1e-3 * v, params, velocity)
    gnorm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    log(loss, gnorm, i)
    return params, velocity, i + 1

  return jax.jit(step, donate_argnums=(0, 1, 2))


class Variant:
  def __init__(self, name, log, start=None, end=None):
    self.name, self.step = name, make_step(log)
    self.start, self.end = start or (lambda: None), end or (lambda: 0)


def variants(logdir: str) -> list[Variant]:
  SummaryWriter, _ = _summary_writer()
  out = [Variant("none", lambda loss, gnorm, i: None)]

  # hostcb.metrics to a TensorBoard sink, added once (as a training script
  # does); each loop ends with metrics.flush().
  metrics.add_sink(metrics.TensorBoard(f"{logdir}/hostcb"))
  box = {}

  def metrics_start():
    box["records"] = metrics.stats()["records"]

  def metrics_end():
    metrics.flush(600)
    return metrics.stats()["records"] - box["records"]

  out.append(
    Variant(
      "hostcb.metrics",
      lambda loss, gnorm, i: metrics.log(
        {"loss": loss, "grad_norm": gnorm}, step=i
      ),
      metrics_start,
      metrics_end,
    )
  )

  # A writer called per step, through a tap or JAX's callback.
  for name, make in [
    (
      "hostcb.id_tap + SummaryWriter",
      lambda f: (
        lambda loss, gnorm, i: hostcb.id_tap(
          lambda a, t: f(*a), (loss, gnorm, i)
        )
      ),
    ),
    (
      "jax.debug.callback + SummaryWriter",
      lambda f: lambda loss, gnorm, i: jax.debug.callback(f, loss, gnorm, i),
    ),
  ]:
    # One writer per variant, made once; each loop ends with its flush.
    state = {"writer": SummaryWriter(f"{logdir}/{name.split()[0]}")}

    def write(loss, gnorm, i, state=state):
      w = state["writer"]
      w.add_scalar("loss", float(loss), int(i))
      w.add_scalar("grad_norm", float(gnorm), int(i))
      state["n"] += 1

    def start(state=state):
      state["n"] = 0

    def end(state=state):
      hostcb.barrier_wait()
      jax.effects_barrier()
      state["writer"].flush()
      return state["n"]

    out.append(Variant(name, make(write), start, end))
  return out


def run(v: Variant, steps: int, x, y) -> float:
  params = _init(jax.random.key(0))
  velocity = jax.tree.map(jnp.zeros_like, params)
  i = jnp.int32(0)
  jax.block_until_ready((params, velocity))
  v.start()
  start = time.perf_counter()
  for _ in range(steps):
    params, velocity, i = v.step(params, velocity, i, x, y)
  jax.block_until_ready(params)
  logged = v.end()
  elapsed = time.perf_counter() - start
  if v.name != "none" and logged != steps:
    raise SystemExit(f"{v.name} logged {logged} of {steps} steps")
  return elapsed / steps


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--rounds", type=int, default=15)
  args = parser.parse_args()
  x = jax.random.normal(jax.random.key(1), (256, 64))
  y = jax.random.normal(jax.random.key(2), (256, 1))
  with tempfile.TemporaryDirectory() as logdir:
    vs = variants(logdir)
    for v in vs:  # trace, compile and warm up
      run(v, 20, x, y)
    times: dict[str, list[float]] = {v.name: [] for v in vs}
    for r in range(args.rounds):
      # Every other round backwards: a machine that slows down or speeds
      # up during a round weighs on the first and last variants alike.
      for v in vs if r % 2 == 0 else vs[::-1]:
        times[v.name].append(run(v, args.steps, x, y))
  base = times["none"]
  print(
    f"jax {jax.__version__}, {jax.devices()[0].platform}, "
    f"{args.steps} steps x {args.rounds} interleaved rounds, "
    f"SummaryWriter of {_summary_writer()[1]}"
  )
  print("| logging 2 scalars per step | µs per step | vs no logging |")
  print("|---|---:|---:|")
  for name, ts in times.items():
    # The ratio to the reference of the same round, median over rounds:
    # on a shared machine, rounds differ more than variants in a round.
    ratio = statistics.median(t / b for t, b in zip(ts, base))
    print(f"| {name} | {statistics.median(ts) * 1e6:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
  main()
