"""Per-step cost of a host callback inside a jitted ``lax.scan``.

Compares, in one run on the same machine: ``hostcb.id_tap``, ``hostcb.call``,
``jax.debug.callback``, ordered ``jax.experimental.io_callback`` and no
callback at all.  Each variant runs a scan of ``--steps`` steps whose body
sends the loop counter to the host; the time per step is the best of
``--repeats`` runs, after a warm-up run that compiles.  Every callback is
counted: the table says whether all of them arrived.  A second table gives the cost
of one dispatch of a tiny jitted function that calls back once.

    python benchmarks/bench_tap.py [--steps 20000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import platform
import time

import jax
import jax.numpy as jnp
from jax.experimental import io_callback

import hostcb


def _variants(counter: list[int]):
  def count_tap(x, transforms):
    counter[0] += 1

  def count(x):
    counter[0] += 1

  def count_and_return(x):
    counter[0] += 1
    return x

  f32 = jax.ShapeDtypeStruct((), jnp.float32)
  return {
      "no callback": (lambda c: c, False),
      "hostcb.id_tap": (lambda c: hostcb.id_tap(count_tap, c), True),
      "hostcb.call": (
          lambda c: hostcb.call(count_and_return, c, result_shape=f32), True),
      "jax.debug.callback": (
          lambda c: (jax.debug.callback(count, c), c)[1], True),
      "io_callback(ordered=True)": (
          lambda c: io_callback(count_and_return, f32, c, ordered=True), True),
  }


def _scan(step, steps: int):
  @jax.jit
  def run(x):
    def body(c, _):
      return step(c) + 1.0, None
    return jax.lax.scan(body, x, length=steps)[0]
  return run


def measure(steps: int, repeats: int) -> list[tuple[str, float, bool]]:
  counter = [0]
  rows = []
  for name, (step, counts) in _variants(counter).items():
    run = _scan(step, steps)
    run(jnp.float32(0)).block_until_ready()          # compile
    hostcb.barrier_wait()
    best = float("inf")
    counter[0] = 0
    for _ in range(repeats):
      t0 = time.perf_counter()
      run(jnp.float32(0)).block_until_ready()
      hostcb.barrier_wait()   # taps are asynchronous: include their cost
      best = min(best, time.perf_counter() - t0)
    delivered = (counter[0] == steps * repeats) if counts else True
    rows.append((name, best / steps * 1e6, delivered))
  return rows


def measure_dispatch(calls: int) -> list[tuple[str, float]]:
  """Cost of one dispatch of a tiny jitted function that calls back once."""
  def ignore(*args):
    pass

  variants = {
      "no callback": lambda x: x + 1,
      "hostcb.id_tap": lambda x: hostcb.id_tap(ignore, x) + 1,
      "jax.debug.callback": lambda x: (jax.debug.callback(ignore, x), x + 1)[1],
  }
  rows = []
  for name, fn in variants.items():
    f = jax.jit(fn)
    x = jnp.float32(1)
    for _ in range(50):
      f(x)
    hostcb.barrier_wait()
    t0 = time.perf_counter()
    for _ in range(calls):
      out = f(x)
    out.block_until_ready()
    hostcb.barrier_wait()
    rows.append((name, (time.perf_counter() - t0) / calls * 1e6))
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20000)
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  rows = measure(args.steps, args.repeats)
  by_name = {name: us for name, us, _ in rows}
  print(f"jax {jax.__version__}, {jax.devices()[0].platform}, "
        f"{platform.processor() or platform.machine()}, "
        f"{args.steps} scan steps, best of {args.repeats}\n")
  print("| callback per scan step | µs/step | vs jax.debug.callback "
        "| vs io_callback | all delivered |")
  print("|---|---:|---:|---:|:---:|")
  for name, us, delivered in rows:
    dbg = by_name["jax.debug.callback"] / us
    io = by_name["io_callback(ordered=True)"] / us
    print(f"| {name} | {us:.2f} | {dbg:.1f}× | {io:.1f}× | "
          f"{'yes' if delivered else 'NO'} |")
  tap, call = by_name["hostcb.id_tap"], by_name["hostcb.call"]
  print(f"\nid_tap is {by_name['jax.debug.callback'] / tap:.1f}× cheaper than "
        f"jax.debug.callback (target ≥ 5×); call is "
        f"{by_name['io_callback(ordered=True)'] / call:.1f}× cheaper than "
        f"io_callback (target ≥ 2×).")
  print("\n| one dispatch of a jitted function | µs |\n|---|---:|")
  for name, us in measure_dispatch(2000):
    print(f"| {name} | {us:.1f} |")


if __name__ == "__main__":
  main()
