"""How much memory taps take while the tap function cannot keep up.

A tap function that blocks on its first tap; a jitted scan that taps 20
scalars per step, ``--steps`` steps, with hostcb's queue bound set to
``--queue-mb``.  The device fills the queue and then waits for space: the
process's memory must grow by about the queue bound, not with the number
of taps.  After ``--hold`` seconds the growth is read, the tap function is
released, and every tap must arrive.

    python benchmarks/bench_queue_bound.py [--steps 2000000] [--queue-mb 16]
        [--hold 5]
"""

from __future__ import annotations

import argparse
import threading
import time

import jax
import jax.numpy as jnp

import hostcb
from bench_tap import rss  # benchmarks/ is on sys.path


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=2_000_000)
  parser.add_argument("--queue-mb", type=int, default=16)
  parser.add_argument("--hold", type=float, default=5.0)
  opts = parser.parse_args()
  hostcb.config.update(hostcb.config.MAX_QUEUE_BYTE_SIZE, opts.queue_mb << 20)

  release = threading.Event()
  seen = [0]

  def tap(args, transforms):
    seen[0] += 1
    if seen[0] == 1:
      release.wait(600)

  @jax.jit
  def run(x):
    def body(c, _):
      hostcb.id_tap(tap, tuple(c + i for i in range(20)))
      return c + 1.0, None

    return jax.lax.scan(body, x, None, length=opts.steps)[0]

  run.lower(jnp.float32(0)).compile()
  base = rss()
  worker = threading.Thread(
    target=lambda: jax.block_until_ready(run(jnp.float32(0)))
  )
  worker.start()
  time.sleep(opts.hold)  # the device fills the queue, then waits for space
  grown = rss() - base
  release.set()
  worker.join(600)
  hostcb.barrier_wait()
  print(
    f"jax {jax.__version__}; native engine: "
    f"{'yes' if hostcb.engine.available() else 'no'}; queue bound "
    f"{opts.queue_mb} MB; tap function blocked for {opts.hold:g} s: "
    f"memory grew by {grown / 2**20:.0f} MB; {seen[0]} of {opts.steps} "
    f"taps of 20 scalars delivered"
  )
  if seen[0] != opts.steps:
    raise SystemExit("taps were lost")


if __name__ == "__main__":
  main()
