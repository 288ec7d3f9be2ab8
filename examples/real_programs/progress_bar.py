"""A progress bar over a long ``lax.scan`` under ``vmap``: random walkers.

The scan's step reports its index to the host, where a counter draws the
bar every tenth of the way::

    python examples/real_programs/progress_bar.py          # jax.debug.callback
    hostcb run --jax-callbacks examples/real_programs/progress_bar.py
    python examples/real_programs/progress_bar.py --hostcb # hostcb.id_tap

The step index is not batched, so the bar advances once per step whatever
the number of walkers.  All three print the same
(tests/test_real_programs.py compares them).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


class ProgressBar:
  """Counts the steps reported and draws a bar at every tenth."""

  def __init__(self, total: int):
    self.total = total
    self.count = 0

  def update(self, step) -> None:
    self.count += 1
    done = int(step) + 1
    if done % (self.total // 10) == 0:
      tenths = done * 10 // self.total
      print(f"[{'#' * tenths}{'.' * (10 - tenths)}] {done}/{self.total}")


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument(
    "--hostcb",
    action="store_true",
    help="count with hostcb.id_tap instead of jax.debug.callback",
  )
  parser.add_argument("--steps", type=int, default=500)
  parser.add_argument("--walkers", type=int, default=8)
  args = parser.parse_args()
  bar = ProgressBar(args.steps)
  if args.hostcb:
    import hostcb

    def report(step):
      hostcb.id_tap(lambda s, transforms: bar.update(s), step)

    print("# reported with", hostcb.id_tap.__module__)
  else:

    def report(step):
      jax.debug.callback(bar.update, step)

    print("# reported with", jax.debug.callback.__module__)

  def walk(key):
    def step(carry, i):
      x, key = carry
      key, sub = jax.random.split(key)
      report(i)
      return (x + 0.1 * jax.random.normal(sub), key), x

    (end, _), path = lax.scan(
      step, (jnp.float32(0), key), jnp.arange(args.steps)
    )
    return end, jnp.max(jnp.abs(path))

  keys = jax.random.split(jax.random.PRNGKey(1), args.walkers)
  end, furthest = jax.jit(jax.vmap(walk))(keys)
  jax.effects_barrier()  # the bar is complete
  print("steps reported:", bar.count)
  print("ends:", np.asarray(end).tolist())
  print("furthest:", np.asarray(furthest).tolist())


if __name__ == "__main__":
  main()
