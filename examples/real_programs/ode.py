"""An ODE solve with a progress meter: fixed-step RK4 in a ``fori_loop``.

The Lotka-Volterra predator-prey equations, integrated with 2,000 steps;
every 200 steps the loop hands the time and state to a meter on the host
with an ordered ``io_callback`` (inside a ``lax.cond``, so that the other
steps do not call the host)::

    python examples/real_programs/ode.py            # JAX's io_callback
    hostcb run --jax-callbacks examples/real_programs/ode.py
    python examples/real_programs/ode.py --hostcb   # hostcb.io_callback

All three print the same (tests/test_real_programs.py compares them).
"""

from __future__ import annotations

import argparse

import jax
import jax.experimental
import jax.numpy as jnp
import numpy as np
from jax import lax


def lotka_volterra(y):
  prey, predators = y
  return jnp.stack(
    [
      1.1 * prey - 0.4 * prey * predators,
      0.1 * prey * predators - 0.4 * predators,
    ]
  )


def rk4_step(f, y, dt):
  k1 = f(y)
  k2 = f(y + 0.5 * dt * k1)
  k3 = f(y + 0.5 * dt * k2)
  k4 = f(y + dt * k3)
  return y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def meter(step, y) -> None:
  print(
    f"t = {float(step) * 0.01:6.2f}  prey = {float(y[0]):9.5f}  "
    f"predators = {float(y[1]):9.5f}"
  )


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument(
    "--hostcb",
    action="store_true",
    help="call hostcb.io_callback instead of JAX's",
  )
  parser.add_argument("--steps", type=int, default=2000)
  args = parser.parse_args()
  io_callback = jax.experimental.io_callback
  if args.hostcb:
    import hostcb

    io_callback = hostcb.io_callback
  print("# meter called by", io_callback.__module__)
  dt, every = 0.01, args.steps // 10

  @jax.jit
  def solve(y0):
    def body(i, y):
      lax.cond(
        i % every == 0,
        lambda: io_callback(meter, None, i, y, ordered=True),
        lambda: None,
      )
      return rk4_step(lotka_volterra, y, dt)

    return lax.fori_loop(0, args.steps, body, y0)

  y = solve(jnp.array([10.0, 5.0]))
  jax.effects_barrier()
  print("final state:", np.asarray(y).tolist())


if __name__ == "__main__":
  main()
