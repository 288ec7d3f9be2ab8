"""What importing hostcb costs a program that never taps: dispatch time.

A tap-free ``jax.jit`` function (a tiny one, where dispatch is all the
cost) is called in three kinds of fresh interpreters: without hostcb,
with every module of hostcb imported, and with hostcb imported after one
tap ran elsewhere in the process (hostcb's patches installed: the price of
using hostcb once).  Each interpreter times ``--calls`` calls, ``--repeats``
times, and reports its median per call; the three kinds run in interleaved
rounds (one of each per round), and the table gives the median over rounds
and the ratio to the process without hostcb.

    python benchmarks/bench_import_cost.py [--rounds 5] [--calls 20000]
        [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import statistics, sys, time
import jax, numpy as np
kind, calls, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if kind != "without":
  import importlib, pkgutil, hostcb
  for m in pkgutil.walk_packages(hostcb.__path__, "hostcb."):
    if m.name != "hostcb.__main__":
      try:
        importlib.import_module(m.name)
      except ImportError:
        pass  # hostcb.progress without tqdm
if kind == "after a tap":
  jax.jit(lambda x: hostcb.id_tap(lambda *a: None, x))(np.float32(1))
  hostcb.barrier_wait()
f = jax.jit(lambda x: x * 2 + 1)
x = jax.device_put(np.float32(1))
f(x).block_until_ready()
per_call = []
for _ in range(repeats):
  t0 = time.perf_counter()
  for _ in range(calls):
    y = f(x)
  y.block_until_ready()
  per_call.append((time.perf_counter() - t0) / calls * 1e6)
print(statistics.median(per_call))
"""

KINDS = ("without", "imported", "after a tap")


def _one(kind: str, calls: int, repeats: int) -> float:
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  out = subprocess.run(
    [sys.executable, "-c", _CHILD, kind, str(calls), str(repeats)],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=True,
  )
  return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--calls", type=int, default=20000)
  p.add_argument("--repeats", type=int, default=5)
  args = p.parse_args()
  times: dict[str, list[float]] = {k: [] for k in KINDS}
  for _ in range(args.rounds):
    for kind in KINDS:
      times[kind].append(_one(kind, args.calls, args.repeats))
  base = statistics.median(times["without"])
  print(
    f"dispatch of a tap-free jit, µs per call (median of {args.rounds} "
    "interleaved rounds, each the median of "
    f"{args.repeats} x {args.calls} calls)"
  )
  print(f"{'process':<14}{'µs/call':>10}{'ratio':>8}")
  for kind in KINDS:
    t = statistics.median(times[kind])
    print(f"{kind:<14}{t:>10.2f}{t / base:>8.3f}")


if __name__ == "__main__":
  main()
