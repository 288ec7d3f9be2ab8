"""A training loop: a small MLP fitted to sin(x) with momentum SGD.

The step is jitted, donates the training state, and prints the loss of
every step with ``jax.debug.print``; a Python loop calls it::

    python examples/real_programs/training_loop.py            # JAX's print
    hostcb run --jax-callbacks examples/real_programs/training_loop.py
    python examples/real_programs/training_loop.py --hostcb   # hostcb's

The second command runs the same code with hostcb's callbacks in place of
JAX's; the third calls ``hostcb.debug.print`` itself.  All three print the
same (tests/test_real_programs.py compares them).
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np


def init_params(key, sizes):
  params = []
  for n_in, n_out in zip(sizes[:-1], sizes[1:]):
    key, sub = jax.random.split(key)
    w = jax.random.normal(sub, (n_in, n_out)) / np.sqrt(n_in)
    params.append({"w": w, "b": jnp.zeros(n_out)})
  return params


def mlp(params, x):
  for layer in params[:-1]:
    x = jnp.tanh(x @ layer["w"] + layer["b"])
  return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, y):
  return jnp.mean((mlp(params, x) - y) ** 2)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument(
    "--hostcb",
    action="store_true",
    help="call hostcb.debug.print instead of JAX's",
  )
  parser.add_argument("--steps", type=int, default=25)
  args = parser.parse_args()
  debug_print = jax.debug.print
  if args.hostcb:
    import hostcb

    debug_print = hostcb.debug.print
  print("# debug.print from", debug_print.__module__)

  x = jnp.linspace(-3.0, 3.0, 64)[:, None]
  y = jnp.sin(x)

  @functools.partial(jax.jit, donate_argnums=0)
  def train_step(state, x, y):
    params, velocity, step = state
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    velocity = jax.tree.map(lambda v, g: 0.9 * v + g, velocity, grads)
    params = jax.tree.map(lambda p, v: p - 0.02 * v, params, velocity)
    debug_print("step {step} loss {loss:.6f}", step=step, loss=loss)
    return (params, velocity, step + 1), loss

  params = init_params(jax.random.PRNGKey(0), [1, 16, 16, 1])
  state = (params, jax.tree.map(jnp.zeros_like, params), jnp.int32(0))
  losses = []
  for _ in range(args.steps):
    previous = state
    state, loss = train_step(state, x, y)
    losses.append(loss)
  jax.effects_barrier()  # every print of the steps has appeared
  print(
    "donated state deleted:",
    all(leaf.is_deleted() for leaf in jax.tree.leaves(previous)),
  )
  print("losses:", [float(v) for v in losses])
  print(
    "final params:",
    [np.asarray(leaf).tolist() for leaf in jax.tree.leaves(state[0])][:2],
  )


if __name__ == "__main__":
  main()
