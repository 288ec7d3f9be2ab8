"""What a progress bar costs a compiled loop: ``hostcb.progress`` against
the approaches of the small progress-bar packages, in one run.

Three loops, each jitted, each a ``lax.scan``:

* ``tiny body``: ``--steps`` (10,000) steps of a few element-wise
  operations on f32[16] (a fraction of a millisecond in all: what any bar's
  fixed costs, a tqdm bar made, drawn and closed, weigh against);
* ``small body``: ``--steps`` steps of a 32x32 matmul and a tanh;
* ``training``: ``--train-steps`` (1,000) SGD steps of a 2-layer MLP
  (32-256-1, batch 128).

Two times per run: until the loop's results are ready (what the bar costs
the computation), and end to end (until every callback has run and every
bar is closed: ``hostcb.barrier_wait()`` and ``jax.effects_barrier()``).
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
from hostcb import _engine as engine, progress

_DEVNULL = open(os.devnull, "w")


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


def tiny_body(c, x):
  del x
  c = c * 0.999 + jnp.sin(c) * 1e-3
  return c, None


_W = jax.random.normal(jax.random.key(1), (32, 32)) / 6


def small_body(c, x):
  del x
  return jnp.tanh(c @ _W) * 0.5 + c * 0.5, None


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
  params = (
    jax.random.normal(k1, (32, 256)) * 0.1,
    jnp.zeros(256),
    jax.random.normal(k2, (256, 1)) * 0.1,
    jnp.zeros(1),
  )
  xs = jax.random.normal(k3, (train_steps, 128, 32))
  batches = (xs, jnp.sum(xs, axis=-1, keepdims=True))
  return [
    ("tiny body", tiny_body, jnp.ones(16), None, steps),
    ("small body", small_body, jnp.ones((32, 32)), None, steps),
    ("training", training_body, params, batches, train_steps),
  ]


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
    lax.cond(
      i % k == 0, lambda: jax.debug.callback(reference.to, i), lambda: None
    )

  def id_tap(i):
    hostcb.id_tap(reference.to, i)

  return [
    (
      "no bar",
      jax.jit(lambda init, xs: lax.scan(body, init, xs, length=length)),
    ),
    (
      "hostcb.progress.scan",
      jax.jit(
        lambda init, xs: progress.scan(
          body, init, xs, length=length, tqdm_class=HostcbBars
        )
      ),
    ),
    ("jax.debug.callback every step", jax.jit(with_step(every_step))),
    (
      f"jax.debug.callback every {k} steps (lax.cond)",
      jax.jit(with_step(every_k)),
    ),
    ("hostcb.id_tap every step", jax.jit(with_step(id_tap))),
  ]


def measure(name: str, body, init, xs, length: int, rounds: int):
  """Rows (variant, median seconds until the results are ready, ratio to
  no bar, median seconds end to end, ratio to no bar) and whether every
  bar reached ``length``."""
  reference = Bars(length)
  variants = _variants(body, length, reference)
  HostcbBars.finished = []

  def once(i: int) -> tuple[float, float]:
    if variants[i][0].startswith(("jax.", "hostcb.id_tap")):
      reference.new()
    t0 = time.perf_counter()
    jax.block_until_ready(variants[i][1](init, xs))
    t1 = time.perf_counter()
    hostcb.barrier_wait()
    jax.effects_barrier()
    return t1 - t0, time.perf_counter() - t0

  ready: list[list[float]] = [[] for _ in variants]
  done: list[list[float]] = [[] for _ in variants]
  for i in range(len(variants)):
    once(i)  # compiles
  for _ in range(rounds):
    for i in range(len(variants)):
      r, d = once(i)
      ready[i].append(r)
      done[i].append(d)
  r = [statistics.median(t) for t in ready]
  d = [statistics.median(t) for t in done]
  finished = reference.close()[1:] + HostcbBars.finished  # [0]: no bar yet
  complete = (
    all(n == length for n in finished)
    and len(HostcbBars.finished) == rounds + 1
  )
  return [
    (v, r[i], r[i] / r[0], d[i], d[i] / d[0])
    for i, (v, _) in enumerate(variants)
  ], complete


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=10000)
  parser.add_argument("--train-steps", type=int, default=1000)
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument(
    "--quick",
    action="store_true",
    help="a short run (3 rounds): checks that everything "
    "works; the figures are rougher",
  )
  args = parser.parse_args()
  if args.quick:
    args.rounds = 3
  print(
    f"jax {jax.__version__}, hostcb {hostcb.__version__}, "
    f"tqdm {tqdm.__version__}, {jax.devices()[0].platform}, "
    f"{platform.processor() or platform.machine()}, {os.cpu_count()} "
    f"cores; native engine: "
    f"{'yes' if engine.available() else engine.unavailable_reason()}"
  )
  ok = True
  t0 = time.perf_counter()
  for name, body, init, xs, length in _loops(args.steps, args.train_steps):
    rows, complete = measure(name, body, init, xs, length, args.rounds)
    ok = ok and complete
    print(
      f"\n{name}: a jitted {length}-step lax.scan, median of "
      f"{args.rounds} interleaved rounds\n"
    )
    print(
      "| variant | results ready, ms | vs no bar | end to end, ms | vs no bar |"
    )
    print("|---|---:|---:|---:|---:|")
    for variant, r, rr, d, dr in rows:
      print(
        f"| {variant} | {r * 1e3:.2f} | {rr:.3f}× | {d * 1e3:.2f} | {dr:.3f}× |"
      )
    print(f"\nevery bar reached {length}: {'yes' if complete else 'NO'}")
  print(f"\n({time.perf_counter() - t0:.0f} s)")
  if not ok:
    sys.exit("bench_progress: a bar did not reach the loop's length")


if __name__ == "__main__":
  np.set_printoptions(precision=3)
  main()
