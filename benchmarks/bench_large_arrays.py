"""Host callbacks on large arrays: what the copies cost.

Times, in one run on the default (first) CPU device, an identity host call
through ``hostcb.call`` (default ``IO_CALLBACK`` flavor, and ``PURE``),
``jax.pure_callback``, ``jax.experimental.
io_callback`` and ``hostcb.buffer_callback``, against a jitted ``a * 1.0``
(the device writes a fresh output buffer, as every callback must) and one
``numpy.copyto`` between preallocated host arrays, on 1 KB, 1 MB and 64 MB
float32 arrays.  Prints a Markdown table of median times with the ratio to
``a * 1.0``, then its two targets at 64 MB.

Usage: ``python benchmarks/bench_large_arrays.py [--quick]``
(``--quick``: fewer repetitions).  Takes about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

import hostcb
from hostcb.buffer_callback import buffer_callback

SIZES = (("1 KB", 1 << 10), ("1 MB", 1 << 20), ("64 MB", 64 << 20))


def _identity(a):
  return a


def _copy_into_out(ctx, out, a):
  np.copyto(np.asarray(out), np.asarray(a))


def _methods(x: jax.Array) -> dict[str, Callable[[], object]]:
  """The contenders, each a no-argument function that blocks on its result."""
  spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
  call = jax.jit(lambda a: hostcb.call(_identity, a, result_shape=spec))
  call_pure = jax.jit(
    lambda a: hostcb.call(
      _identity,
      a,
      result_shape=spec,
      callback_flavor=hostcb.CallbackFlavor.PURE,
    )
  )
  pure = jax.jit(lambda a: jax.pure_callback(_identity, spec, a))
  io = jax.jit(lambda a: io_callback(_identity, spec, a))
  buf = jax.jit(buffer_callback(_copy_into_out, spec))
  scale = jax.jit(lambda a: a * 1.0)
  src = np.ones(x.shape, x.dtype)
  dst = np.empty_like(src)
  return {
    "`hostcb.call`": lambda: call(x).block_until_ready(),
    "`hostcb.call` (`PURE`)": lambda: call_pure(x).block_until_ready(),
    "`jax.pure_callback`": lambda: pure(x).block_until_ready(),
    "`io_callback`": lambda: io(x).block_until_ready(),
    "`hostcb.buffer_callback`": lambda: buf(x).block_until_ready(),
    "jitted `a * 1.0`": lambda: scale(x).block_until_ready(),
    "`numpy.copyto`": lambda: np.copyto(dst, src),
  }


def _median_seconds(
  fn: Callable[[], object], budget_s: float, min_reps: int, max_reps: int
) -> float:
  fn()  # compile
  # Warm up for a quarter of the budget (at least twice): the first calls
  # of a size pay for fresh host allocations (page faults) until the
  # allocator keeps such blocks, which would make whichever method runs
  # first look slower.
  warm_until = time.perf_counter() + budget_s / 4
  for i in range(max_reps):
    fn()
    if i >= 1 and time.perf_counter() > warm_until:
      break
  times: list[float] = []
  start = time.perf_counter()
  while len(times) < max_reps and (
    len(times) < min_reps or time.perf_counter() - start < budget_s
  ):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def _fmt(seconds: float) -> str:
  if seconds < 1e-3:
    return f"{seconds * 1e6:.0f} µs"
  return f"{seconds * 1e3:.1f} ms"


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--quick", action="store_true", help="fewer repetitions (a rougher table)"
  )
  opts = parser.parse_args(argv)
  budget, min_reps = (0.5, 3) if opts.quick else (2.0, 7)

  results: dict[str, dict[str, float]] = {}
  for label, nbytes in SIZES:
    x = jnp.ones((nbytes // 4,), jnp.float32)
    for name, fn in _methods(x).items():
      results.setdefault(name, {})[label] = _median_seconds(
        fn, budget, min_reps, 2000
      )
    print(f"measured {label}", file=sys.stderr)

  base = results["jitted `a * 1.0`"]
  head = "| | " + " | ".join(label for label, _ in SIZES) + " |"
  print(
    f"jax {jax.__version__}, {jax.devices()[0].device_kind}, median "
    "time per call (ratio to jitted `a * 1.0`)\n"
  )
  print(head)
  print("|---" * (len(SIZES) + 1) + "|")
  for name, row in results.items():
    cells = [
      f"{_fmt(row[label])} ({row[label] / base[label]:.2f}×)"
      for label, _ in SIZES
    ]
    print(f"| {name} | " + " | ".join(cells) + " |")

  big = SIZES[-1][0]
  call = results["`hostcb.call`"][big]
  vs_scale = call / base[big]
  vs_pure = results["`jax.pure_callback`"][big] / call
  print(
    f"\nTargets at {big}: `hostcb.call` / `a * 1.0` = {vs_scale:.2f} "
    f"(target <= 1.3: {'met' if vs_scale <= 1.3 else 'MISSED'}); "
    f"`pure_callback` / `hostcb.call` = {vs_pure:.1f} "
    f"(target >= 3: {'met' if vs_pure >= 3 else 'MISSED'})"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
