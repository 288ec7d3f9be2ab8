"""A multi-chain random-walk Metropolis sampler with a per-step monitor.

Chains run in parallel: ``pmap`` over the devices, ``vmap`` over the chains
of each device, ``lax.scan`` over the steps.  Every step, each device sends
the number of proposals its chains accepted to a host-side monitor::

    python examples/real_programs/sampler.py            # jax.debug.callback
    hostcb run --jax-callbacks examples/real_programs/sampler.py
    python examples/real_programs/sampler.py --hostcb   # hostcb.debug.callback

The devices call the monitor side by side, in any order; it adds up what
they report, and the program prints the totals.  All three print the same
(tests/test_real_programs.py compares them).  Run with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` for 4 CPU devices.
"""

from __future__ import annotations

import argparse
import collections
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# The target: a correlated 2-d Gaussian.
_PRECISION = jnp.linalg.inv(jnp.array([[1.0, 0.8], [0.8, 1.0]]))


def log_density(x):
  return -0.5 * x @ _PRECISION @ x


class Monitor:
  """Acceptances per step, summed over the devices that report them."""

  def __init__(self):
    self.accepted = collections.Counter()
    self.reports = 0
    self._lock = threading.Lock()

  def record(self, step, accepted) -> None:
    with self._lock:
      self.accepted[int(step)] += int(accepted)
      self.reports += 1


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument(
    "--hostcb",
    action="store_true",
    help="call hostcb.debug.callback instead of JAX's",
  )
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--chains-per-device", type=int, default=16)
  args = parser.parse_args()
  callback = jax.debug.callback
  if args.hostcb:
    import hostcb

    callback = hostcb.debug.callback
  print("# monitor called by", callback.__module__)
  monitor = Monitor()
  devices = jax.local_device_count()

  def mh_step(x, key):
    k_prop, k_acc = jax.random.split(key)
    proposal = x + 0.5 * jax.random.normal(k_prop, x.shape)
    log_ratio = log_density(proposal) - log_density(x)
    accept = jnp.log(jax.random.uniform(k_acc)) < log_ratio
    return jnp.where(accept, proposal, x), accept

  def chains_of_one_device(x0, key):
    def step(carry, i):
      x, key = carry
      key, sub = jax.random.split(key)
      x, accepted = jax.vmap(mh_step)(x, jax.random.split(sub, x.shape[0]))
      callback(monitor.record, i, jnp.sum(accepted))
      return (x, key), x

    _, samples = lax.scan(step, (x0, key), jnp.arange(args.steps))
    return samples  # (steps, chains, 2)

  x0 = jnp.zeros((devices, args.chains_per_device, 2))
  keys = jax.random.split(jax.random.PRNGKey(2), devices)
  samples = jax.pmap(chains_of_one_device)(x0, keys)
  jax.effects_barrier()  # every report has reached the monitor
  burned = np.asarray(samples)[:, args.steps // 2 :]
  print("monitor reports:", monitor.reports, "for", devices, "devices")
  print(
    "accepted per 20 steps:",
    [
      sum(monitor.accepted[s] for s in range(k, k + 20))
      for k in range(0, args.steps, 20)
    ],
  )
  print("sample mean:", burned.reshape(-1, 2).mean(0).tolist())
  print("sample covariance:", np.cov(burned.reshape(-1, 2).T).tolist())


if __name__ == "__main__":
  main()
