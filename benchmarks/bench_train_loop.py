"""A training loop's cost per step with a logged scalar, against none.

The loop users write: a 64 -> 128 -> 1 MLP, batch 256, ``value_and_grad``
and a momentum update in a jitted step (its state donated), called from a
Python loop that never reads the loss; the step logs one scalar (the
loss) through a callback:

* ``none``: the same step without a callback (the reference);
* ``hostcb.id_tap``: a tap function that appends the loss to a list;
* ``hostcb.debug.callback``: the same function through hostcb's drop-in,
  which hands it a ``jax.Array`` (the default, as JAX's does);
* ``hostcb.debug.callback, NumPy opt-out``: the same with the option
  ``hostcb_callback_jax_arrays`` off (the function gets NumPy arrays): the
  cost of making the ``jax.Array`` is the difference to the row above;
* ``jax.debug.callback``: JAX's own.

Variants run in interleaved rounds (one loop of each per round, the
median over rounds), so that a slow phase of a shared machine weighs on
every variant alike; each loop ends with ``hostcb.barrier_wait()`` and
``jax.effects_barrier()``, and every variant must have logged every step.

    python benchmarks/bench_train_loop.py [--steps 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import hostcb


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


NUMPY_ROW = "hostcb.debug.callback, NumPy opt-out"


def make_step(log):
  """The jitted step; ``log(loss)`` stages the callback (or nothing)."""

  def step(params, velocity, x, y):
    loss, grads = jax.value_and_grad(_loss)(params, x, y)
    velocity = jax.tree.map(lambda v, g: 0.9 * v + g, velocity, grads)
    params = jax.tree.map(lambda p, v: p - 1e-3 * v, params, velocity)
    log(loss)
    return params, velocity

  return jax.jit(step, donate_argnums=(0, 1))


def variants(seen: dict[str, list]) -> dict:
  def record(name):
    out = seen.setdefault(name, [])
    return out.append

  def tap(name):
    append = record(name)
    return lambda loss: hostcb.id_tap(lambda a, t: append(a), loss)

  def debug(name, callback):
    append = record(name)
    return lambda loss: callback(append, loss)

  return {
    "none": make_step(lambda loss: None),
    "hostcb.id_tap": make_step(tap("hostcb.id_tap")),
    "hostcb.debug.callback": make_step(
      debug("hostcb.debug.callback", hostcb.debug.callback)
    ),
    NUMPY_ROW: make_step(debug(NUMPY_ROW, hostcb.debug.callback)),
    "jax.debug.callback": make_step(
      debug("jax.debug.callback", jax.debug.callback)
    ),
  }


def run(step, steps: int, x, y) -> float:
  params = _init(jax.random.key(0))
  velocity = jax.tree.map(jnp.zeros_like, params)
  jax.block_until_ready((params, velocity))
  start = time.perf_counter()
  for _ in range(steps):
    params, velocity = step(params, velocity, x, y)
  jax.block_until_ready(params)
  hostcb.barrier_wait()
  jax.effects_barrier()
  return (time.perf_counter() - start) / steps


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=2000)
  parser.add_argument("--rounds", type=int, default=7)
  args = parser.parse_args()
  x = jax.random.normal(jax.random.key(1), (256, 64))
  y = jax.random.normal(jax.random.key(2), (256, 1))
  seen: dict[str, list] = {}
  steps = variants(seen)
  for name, step in steps.items():  # trace, compile and warm up
    hostcb.config.update("hostcb_callback_jax_arrays", name != NUMPY_ROW)
    run(step, 20, x, y)
  hostcb.config.update("hostcb_callback_jax_arrays", True)
  times: dict[str, list[float]] = {name: [] for name in steps}
  for _ in range(args.rounds):
    for name, step in steps.items():
      seen.get(name, []).clear()
      times[name].append(run(step, args.steps, x, y))
      if name != "none" and len(seen[name]) != args.steps:
        raise SystemExit(
          f"{name} logged {len(seen[name])} of {args.steps} steps"
        )
  base = statistics.median(times["none"])
  print(
    f"jax {jax.__version__}, {jax.devices()[0].platform}, "
    f"{args.steps} steps x {args.rounds} interleaved rounds"
  )
  print("| variant | argument | µs per step | vs no callback |")
  print("|---|---|---:|---:|")
  for name, ts in times.items():
    t = statistics.median(ts)
    arg = type(seen[name][0]).__name__ if seen.get(name) else "-"
    print(f"| {name} | {arg} | {t * 1e6:.1f} | {t / base:.2f}x |")


if __name__ == "__main__":
  main()
