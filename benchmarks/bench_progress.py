"""What a progress bar costs a compiled loop: ``hostcb.progress`` against
the approaches of the small progress-bar packages, in one run.

Two loops, each jitted, timed end to end (dispatch until the results are
ready and every callback has run: ``hostcb.barrier_wait()`` and
``jax.effects_barrier()``):

* ``small body``: a ``lax.scan`` of ``--steps`` steps (10,000) whose body is
  a few element-wise operations on f32[16];
* ``training``: ``--train-steps`` (1,000) SGD steps of a 2-layer MLP
  (32-256-1, batch 128) in a ``lax.scan``.

Variants per loop, timed in interleaved rounds (one run of each per round,
the median over rounds, so that a slow phase of a shared machine weighs on
every variant alike), printed as ratios to the loop without a bar:

* ``no bar``: ``lax.scan``;
* ``hostcb.progress.scan``: the default (a tap every k steps, k from the
  length: at most about 200 updates, decided on the device);
* ``jax.debug.callback every step``: a tqdm update from every step;
* ``jax.debug.callback every k steps``: the same under ``lax.cond`` on
  ``step % k == 0``, with hostcb's k;
* ``hostcb.id_tap every step``: hostcb's tap without the ``lax.cond``.

Every bar writes to ``os.devnull``; every variant's bar is checked to reach
the loop's length (the script fails if one does not).

    python benchmarks/bench_progress.py [--steps 10000] [--train-steps 1000]
        [--rounds 7] [--quick]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from jax import lax

import hostcb
from hostcb import engine, progress

_DEVNULL = open(os.devnull, "w")  # noqa: SIM115  (lives as long as the run)


class Bars:
  """The bars of the reference variants: one per run, counted."""

  def __init__(self, total: int):
    self.total = total
    self.bar = None
    self.finished = []

  def new(self) -> None:
    if self.bar is not None:
      self.finished.append(self.bar.n)
      self.bar.close()
    self.bar = tqdm.tqdm(total=self.total, file=_DEVNULL)

  def step(self, *args) -> None:
    self.bar.update(1)

  def to(self, step, *args) -> None:
    n = int(step)
    self.bar.update(n - self.bar.n)

  def close(self) -> list[int]:
    self.new()
    self.bar.close()
    return self.finished


class HostcbBars(tqdm.tqdm):
  """hostcb.progress's bars, written to os.devnull and counted."""
  finished: list = []

  def __init__(self, *args, **kwargs):
    super().__init__(*args, file=_DEVNULL, **kwargs)

  def close(self) -> None:
    if not self.disable:
      HostcbBars.finished.append(self.n)
    super().close()


def small_body(c, x):
  del x
  c = c * 0.999 + jnp.sin(c) * 1e-3
  return c, None


def _mlp_loss(params, batch):
  w1, b1, w2, b2 = params
  x, y = batch
  h = jnp.tanh(x @ w1 + b1)
  return jnp.mean((h @ w2 + b2 - y) ** 2)


def training_body(params, batch):
  grads = jax.grad(_mlp_loss)(params, batch)
  return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), None


def _loops(steps: int, train_steps: int):
  """(name, body, init, xs, length) of the two loops."""
  key = jax.random.key(0)
  k1, k2, k3 = jax.random.split(key, 3)
  params = (jax.random.normal(k1, (32, 256)) * 0.1, jnp.zeros(256),
            jax.random.normal(k2, (256, 1)) * 0.1, jnp.zeros(1))
  xs = jax.random.normal(k3, (train_steps, 128, 32))
  batches = (xs, jnp.sum(xs, axis=-1, keepdims=True))
  return [("small body", small_body, jnp.ones(16), None, steps),
          ("training", training_body, params, batches, train_steps)]


def _variants(body, length: int, reference: Bars):
  """(name, jitted function of (init, xs)) per variant."""
  k = max(1, -(-length // progress.DEFAULT_UPDATES))

  def with_step(tap):
    def scan(init, xs):
      def f(carry, x):
        i, c = carry
        c, y = body(c, x)
        i = i + 1
        tap(i)
        return (i, c), y
      (_, c), ys = lax.scan(f, (jnp.int32(0), init), xs, length=length)
      return c, ys
    return scan

  def every_step(i):
    jax.debug.callback(reference.step, i)

  def every_k(i):
    lax.cond(i % k == 0, lambda: jax.debug.callback(reference.to, i),
             lambda: None)

  def id_tap(i):
    hostcb.id_tap(reference.to, i)

  return [
      ("no bar", jax.jit(lambda init, xs: lax.scan(body, init, xs,
                                                   length=length))),
      ("hostcb.progress.scan", jax.jit(
          lambda init, xs: progress.scan(body, init, xs, length=length,
                                         tqdm_class=HostcbBars))),
      ("jax.debug.callback every step", jax.jit(with_step(every_step))),
      (f"jax.debug.callback every {k} steps (lax.cond)",
       jax.jit(with_step(every_k))),
      ("hostcb.id_tap every step", jax.jit(with_step(id_tap))),
  ]


def measure(name: str, body, init, xs, length: int, rounds: int):
  """Rows (variant, median seconds, ratio to no bar) and whether every bar
  reached ``length``."""
  reference = Bars(length)
  variants = _variants(body, length, reference)
  HostcbBars.finished = []

  def once(i: int) -> float:
    if variants[i][0].startswith(("jax.", "hostcb.id_tap")):
      reference.new()
    t0 = time.perf_counter()
    jax.block_until_ready(variants[i][1](init, xs))
    hostcb.barrier_wait()
    jax.effects_barrier()
    return time.perf_counter() - t0

  times: list[list[float]] = [[] for _ in variants]
  for i in range(len(variants)):
    once(i)  # compiles
  for _ in range(rounds):
    for i in range(len(variants)):
      times[i].append(once(i))
  medians = [statistics.median(t) for t in times]
  finished = reference.close()[1:] + HostcbBars.finished  # [0]: no bar yet
  complete = all(n == length for n in finished) and len(
      HostcbBars.finished) == rounds + 1
  return [(v, m, m / medians[0]) for (v, _), m in zip(variants, medians)
          ], complete


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=10000)
  parser.add_argument("--train-steps", type=int, default=1000)
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--quick", action="store_true",
                      help="a short run (3 rounds): checks that everything "
                           "works; the figures are rougher")
  args = parser.parse_args()
  if args.quick:
    args.rounds = 3
  print(f"jax {jax.__version__}, hostcb {hostcb.__version__}, "
        f"tqdm {tqdm.__version__}, {jax.devices()[0].platform}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} "
        f"cores; native engine: "
        f"{'yes' if engine.available() else engine.unavailable_reason()}")
  ok = True
  t0 = time.perf_counter()
  for name, body, init, xs, length in _loops(args.steps, args.train_steps):
    rows, complete = measure(name, body, init, xs, length, args.rounds)
    ok = ok and complete
    print(f"\n{name}: a jitted {length}-step lax.scan, end to end, median "
          f"of {args.rounds} interleaved rounds\n")
    print("| variant | ms per loop | vs no bar |")
    print("|---|---:|---:|")
    for variant, m, ratio in rows:
      print(f"| {variant} | {m * 1e3:.2f} | {ratio:.3f}× |")
    print(f"\nevery bar reached {length}: {'yes' if complete else 'NO'}")
  print(f"\n({time.perf_counter() - t0:.0f} s)")
  if not ok:
    sys.exit("bench_progress: a bar did not reach the loop's length")


if __name__ == "__main__":
  np.set_printoptions(precision=3)
  main()
