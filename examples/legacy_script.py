"""A legacy host_callback script, unchanged: run it with `hostcb run`.

    hostcb run examples/legacy_script.py 4

It imports the module JAX removed; hostcb's import hook provides it.
"""

import sys

import jax
import jax.numpy as jnp
from jax.experimental import host_callback as hcb


def main(steps: int) -> None:
  def body(i, acc):
    hcb.id_print((i, acc), what="step,acc")
    return acc * 2

  total = jax.jit(lambda x: jax.lax.fori_loop(0, steps, body, x))(1.0)
  hcb.barrier_wait()
  doubled = jax.jit(lambda x: hcb.call(lambda v: v * 2, x, result_shape=x))(
    jnp.float32(total)
  )
  print("total", total, "doubled on the host", doubled)


if __name__ == "__main__":
  main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
