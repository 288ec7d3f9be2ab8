"""What a host function by name (``hostcb.register``) costs against the same
function by id, per step of a jitted ``lax.scan`` over f32[4].

A function by name lowers to ``hostcb_tap_v1`` / ``hostcb_call_v1``, whose
handlers look its (name, spec) attributes up in a per-thread table each
time they run; a function by id is one integer attribute.  The variants
run in interleaved rounds in one process; the table shows medians (µs per
step, the untapped scan's time subtracted) and the by-name/by-id ratios.

    python benchmarks/bench_named.py [--steps 20000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import hostcb


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=20000)
  parser.add_argument("--repeats", type=int, default=7)
  a = parser.parse_args()
  count = [0]

  def tap_by_id(x, t):
    count[0] += 1

  def tap_by_name(x, t):
    count[0] += 1

  def call_by_id(x):
    return x

  def call_by_name(x):
    return x

  hostcb.register("bench.tap", tap_by_name)
  hostcb.register("bench.call", call_by_name)
  S = jax.ShapeDtypeStruct((4,), jnp.float32)

  def scan(body):
    def run(x):
      return jax.lax.scan(
        lambda c, _: (body(c), None), x, None, length=a.steps
      )[0]

    return jax.jit(run)

  variants = {
    "none": scan(lambda c: c + 1),
    "id_tap by id": scan(lambda c: hostcb.id_tap(tap_by_id, c) + 1),
    "id_tap by name": scan(lambda c: hostcb.id_tap(tap_by_name, c) + 1),
    "call by id": scan(
      lambda c: hostcb.call(call_by_id, c, result_shape=S) + 1
    ),
    "call by name": scan(
      lambda c: hostcb.call(call_by_name, c, result_shape=S) + 1
    ),
  }
  x = np.zeros(4, np.float32)
  for f in variants.values():  # compile and warm up
    f(x).block_until_ready()
  hostcb.barrier_wait()
  times: dict[str, list[float]] = {k: [] for k in variants}
  for _ in range(a.repeats):
    for name, f in variants.items():
      t0 = time.perf_counter()
      f(x).block_until_ready()
      hostcb.barrier_wait()
      times[name].append(time.perf_counter() - t0)
  base = statistics.median(times["none"])
  per_step = {
    k: (statistics.median(v) - base) / a.steps * 1e6
    for k, v in times.items()
    if k != "none"
  }
  print(
    f"jax {jax.__version__}, {a.steps} steps, {a.repeats} interleaved "
    "rounds, medians, untapped scan subtracted"
  )
  for k, us in per_step.items():
    print(f"  {k:16s} {us:7.3f} us/step")
  for what in ("id_tap", "call"):
    ratio = per_step[f"{what} by name"] / per_step[f"{what} by id"]
    print(f"  {what}: by name / by id = {ratio:.2f}")


if __name__ == "__main__":
  main()
