"""A training step that logs two scalars every step to TensorBoard, against
the same step without logging.

The step of ``bench_train_loop.py`` (a 64 -> 128 -> 1 MLP, batch 256,
``value_and_grad`` and a momentum update, jitted, its state donated),
called from a Python loop that never reads its results; it logs the loss
and the gradients' norm every step:

* ``none``: no logging (the reference);
* ``hostcb.metrics``: ``hostcb.metrics.log`` to a ``hostcb.metrics.
  TensorBoard`` sink;
* ``hostcb.id_tap, no-op (floor)``: the tap that ``metrics.log`` makes
  (the step and the two values as one ``uint32`` vector) to a function
  that only counts it: what any logging through hostcb's engine costs
  before a record is made;
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
logged every step.  On Linux, the last columns give the CPU time per
step of hostcb's threads (median over rounds, from
``/proc/self/task/*/schedstat``): the consumer of the device, which runs
the tap functions, and hostcb.metrics' writer, which makes the records
and writes them.

    python benchmarks/bench_metrics.py [--steps 1000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import threading
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


def _hostcb_threads_cpu() -> collections.Counter:
  """CPU seconds so far of hostcb's consumer and writer threads (empty
  where /proc has no per-thread schedstat)."""
  names = {t.native_id: t.name for t in threading.enumerate()}
  out: collections.Counter = collections.Counter()
  for tid, name in names.items():
    if name.startswith("hostcb-engine-"):
      group = "consumer"
    elif name == "hostcb-metrics-writer":
      group = "writer"
    else:
      continue
    try:
      with open(f"/proc/self/task/{tid}/schedstat") as f:
        out[group] += int(f.read().split()[0]) / 1e9
    except OSError:  # not Linux, or the thread just ended
      pass
  return out


def _as_words(*xs):
  """The scalars as one uint32 vector (as metrics.log taps them)."""
  return jnp.stack([jax.lax.bitcast_convert_type(x, jnp.uint32) for x in xs])


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


_floor_taps = [0]


def _count(arg, transforms):
  _floor_taps[0] += 1


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

  # The floor: the same tap to a function that only counts it.
  def floor_start():
    _floor_taps[0] = 0

  def floor_end():
    hostcb.barrier_wait()
    return _floor_taps[0]

  out.append(
    Variant(
      "hostcb.id_tap, no-op (floor)",
      lambda loss, gnorm, i: hostcb.id_tap(_count, _as_words(i, loss, gnorm)),
      floor_start,
      floor_end,
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


def run(v: Variant, steps: int, x, y) -> tuple[float, collections.Counter]:
  """Seconds per step, and CPU seconds per step of hostcb's threads."""
  params = _init(jax.random.key(0))
  velocity = jax.tree.map(jnp.zeros_like, params)
  i = jnp.int32(0)
  jax.block_until_ready((params, velocity))
  v.start()
  cpu = _hostcb_threads_cpu()
  start = time.perf_counter()
  for _ in range(steps):
    params, velocity, i = v.step(params, velocity, i, x, y)
  jax.block_until_ready(params)
  logged = v.end()
  elapsed = time.perf_counter() - start
  cpu = _hostcb_threads_cpu() - cpu
  if v.name != "none" and logged != steps:
    raise SystemExit(f"{v.name} logged {logged} of {steps} steps")
  return elapsed / steps, collections.Counter(
    {k: t / steps for k, t in cpu.items()}
  )


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
    cpus: dict[str, list] = {v.name: [] for v in vs}
    for r in range(args.rounds):
      # Every other round backwards: a machine that slows down or speeds
      # up during a round weighs on the first and last variants alike.
      for v in vs if r % 2 == 0 else vs[::-1]:
        t, cpu = run(v, args.steps, x, y)
        times[v.name].append(t)
        cpus[v.name].append(cpu)
  base = times["none"]
  print(
    f"jax {jax.__version__}, {jax.devices()[0].platform}, "
    f"{args.steps} steps x {args.rounds} interleaved rounds, "
    f"SummaryWriter of {_summary_writer()[1]}"
  )
  print(
    "| logging 2 scalars per step | µs per step | vs no logging "
    "| CPU µs per step: consumer | writer |"
  )
  print("|---|---:|---:|---:|---:|")
  for name, ts in times.items():
    # The ratio to the reference of the same round, median over rounds:
    # on a shared machine, rounds differ more than variants in a round.
    ratio = statistics.median(t / b for t, b in zip(ts, base))
    cpu = [
      statistics.median(c[k] for c in cpus[name]) * 1e6
      for k in ("consumer", "writer")
    ]
    print(
      f"| {name} | {statistics.median(ts) * 1e6:.1f} | {ratio:.3f}x "
      f"| {cpu[0]:.2f} | {cpu[1]:.2f} |"
    )


if __name__ == "__main__":
  main()
