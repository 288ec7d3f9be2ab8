"""Per-shard taps in sharded ``jit``: what a tap per step costs.

On 4 CPU devices (forced with ``XLA_FLAGS``, set before JAX starts), a
64 MB float32 array split 4 ways goes through a jitted loop of ``STEPS``
steps (``x = x * c + 1``); each step taps ``x`` with, in turn:

* ``hostcb.id_tap(f, x, partitioned=True)``: each device hands its 16 MB
  shard to hostcb's engine (no gather);
* ``hostcb.id_tap(f, x)``: legacy semantics, XLA gathers the 64 MB to
  device 0, which taps it;
* ``jax.debug.callback(f, x, partitioned=True)``: JAX's own per-shard
  callback (XLA's Python callback per shard);
* ``hostcb.debug.callback(f, x, partitioned=True)``: hostcb's drop-in for it;
* no tap: the loop alone, subtracted from the others to get each tap's
  cost per step;
* the physical limit of a tap that does not hold the device up: one more
  pass over the array per step on the devices (``y = x + 1``, kept in the
  loop's carry), the read and write that copying each shard out costs;
* one host copy of the array per step (``np.copyto`` of the whole array
  between two preallocated NumPy arrays, in the benchmark's thread): what
  a tap that copies each shard out of the device once costs at least
  (the goal: the partitioned tap's cost <= 1.5x this at 16 MB).

Each timing runs the loop once and waits for every tap
(``jax.effects_barrier``, which also waits for hostcb's), so the host's
work is counted.  The methods run in interleaved rounds; the medians and
their ratios are printed, with the goals: partitioned hostcb <= 1/3 of
the gathering tap's cost, >= 10x cheaper than JAX's partitioned callback,
and <= 1.5x one host copy.

Usage: ``python benchmarks/bench_partitioned.py [--rounds N] [--steps K]
[--mb MB | --kb KB]`` (the two sizes of the goals: ``--mb 16`` and ``--kb 4``).
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import statistics
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcb


def _ignore_tap(arg, transforms):
  del arg, transforms


def _ignore(*args):
  del args


def _loops(steps: int) -> dict[str, Callable]:
  """The jitted loops, one per way of tapping."""
  taps = {
    "hostcb id_tap partitioned": lambda x: hostcb.id_tap(
      _ignore_tap, x, partitioned=True
    ),
    "hostcb id_tap (gathers)": lambda x: hostcb.id_tap(_ignore_tap, x),
    "jax.debug.callback partitioned": lambda x: jax.debug.callback(
      _ignore, x, partitioned=True
    ),
    "hostcb.debug.callback partitioned": lambda x: hostcb.debug.callback(
      _ignore, x, partitioned=True
    ),
    "no tap": lambda x: None,
  }

  def loop(tap):
    def body(i, x):
      tap(x)
      return x * np.float32(0.5) + np.float32(1.0)

    return jax.jit(lambda x: jax.lax.fori_loop(0, steps, body, x))

  def copying_body(i, carry):
    x, _ = carry
    return x * np.float32(0.5) + np.float32(1.0), x + np.float32(1.0)

  loops = {name: loop(tap) for name, tap in taps.items()}
  # Both results are outputs: XLA cannot drop the extra pass.
  loops[COPY] = jax.jit(
    lambda x: jax.lax.fori_loop(0, steps, copying_body, (x, x))
  )
  return loops


COPY = "one more pass over the array (limit)"
HOST_COPY = "np.copyto of the array (one host copy)"


def _host_copies(steps: int, nbytes: int) -> Callable:
  """A stand-in for a loop: ``steps`` host copies of the array."""
  src = np.ones(nbytes // 4, np.float32)
  dst = np.empty_like(src)

  def copies(x):
    for _ in range(steps):
      np.copyto(dst, src)
    return x

  return copies


def _time_once(f, x) -> float:
  t = time.perf_counter()
  jax.block_until_ready(f(x))
  jax.effects_barrier()  # also waits for hostcb's taps
  return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=8)
  parser.add_argument("--mb", type=int, default=64)
  parser.add_argument(
    "--kb",
    type=int,
    default=None,
    help="the array's size in KB (instead of --mb)",
  )
  opts = parser.parse_args(argv)
  devices = jax.devices()
  if len(devices) != 4:
    raise SystemExit(f"expected 4 CPU devices, got {devices}")
  nbytes = (opts.kb << 10) if opts.kb is not None else opts.mb << 20
  size = f"{opts.kb} KB" if opts.kb is not None else f"{opts.mb} MB"
  n = nbytes // 4
  mesh = Mesh(np.array(devices), ("d",))
  x = jax.device_put(
    jnp.zeros((4, n // 4), jnp.float32), NamedSharding(mesh, P("d"))
  )
  loops = _loops(opts.steps)
  loops[HOST_COPY] = _host_copies(opts.steps, nbytes)
  for f in loops.values():  # compile and warm up
    _time_once(f, x)
    _time_once(f, x)
  times: dict[str, list[float]] = {name: [] for name in loops}
  for r in range(opts.rounds):
    for name, f in loops.items():
      times[name].append(_time_once(f, x) / opts.steps)
    print(f"round {r + 1}/{opts.rounds}", file=sys.stderr)

  med = {name: statistics.median(t) for name, t in times.items()}
  base = med["no tap"]
  cost = {name: max(m - base, 1e-9) for name, m in med.items()}
  cost[HOST_COPY] = med[HOST_COPY]  # no loop to subtract
  print(
    f"jax {jax.__version__}, 4 CPU devices, {size} float32 split "
    f"4 ways, {opts.steps} steps per loop, {opts.rounds} interleaved "
    "rounds; median per step, and the tap's cost (minus the loop "
    "without a tap)\n"
  )
  print("| | per step | tap cost per step |")
  print("|---|---|---|")
  for name in loops:
    extra = "" if name == "no tap" else f"{cost[name] * 1e3:.3f} ms"
    print(f"| {name} | {med[name] * 1e3:.3f} ms | {extra} |")
  ours = cost["hostcb id_tap partitioned"]
  gather = cost["hostcb id_tap (gathers)"]
  theirs = cost["jax.debug.callback partitioned"]
  drop_in = cost["hostcb.debug.callback partitioned"]
  print(
    f"\npartitioned / gathering tap = {ours / gather:.2f} "
    f"(goal <= 0.33: {'met' if ours / gather <= 1 / 3 else 'MISSED'})"
  )
  print(
    f"jax.debug.callback(partitioned) / hostcb partitioned tap = "
    f"{theirs / ours:.1f} (goal >= 10: "
    f"{'met' if theirs / ours >= 10 else 'MISSED'})"
  )
  print(
    f"jax.debug.callback(partitioned) / hostcb.debug.callback"
    f"(partitioned) = {theirs / drop_in:.1f}"
  )
  print(f"hostcb partitioned tap / the limit = {ours / cost[COPY]:.1f}")
  print(
    f"hostcb partitioned tap / one host copy = "
    f"{ours / cost[HOST_COPY]:.2f} (the goal at 16 MB: <= 1.5: "
    f"{'met' if ours / cost[HOST_COPY] <= 1.5 else 'MISSED'})"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
