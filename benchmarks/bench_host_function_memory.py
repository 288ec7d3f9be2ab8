"""Memory held by dropped programs' host functions.

One mode per process (peak RSS is per process), each run as:

    python benchmarks/bench_host_function_memory.py MODE

* ``hostcb``: 20 jitted functions, each a ``hostcb.debug.callback`` of an
  object holding 40 MB, run and dropped one after the other, each followed
  by a barrier; then ``jax.clear_caches()``, ``gc.collect()`` and a
  barrier;
* ``jax``: the same with JAX's own ``jax.debug.callback``;
* ``install``: 50 jitted functions whose ``jax.debug.callback`` holds
  8 MB, under ``hostcb.install(jax_callbacks=True)``;
* ``hostcb-nobarrier`` and ``jax-nobarrier``: 50 jitted functions whose
  ``debug.callback`` holds 40 MB, run and dropped, then
  ``jax.clear_caches()`` and ``gc.collect()``, and no barrier at all (a
  program of drop-ins never calls one): prints how many objects are still
  alive after waiting up to 10 s for them, and the growth of the RSS.

Prints how many of the objects are still alive, the process's peak RSS,
and how many entries the engine's registry holds after re-running a
``debug.print`` function 200 times after ``jax.clear_caches()`` and a
barrier (``hostcb.barrier_wait()``; ``jax.effects_barrier()`` for JAX's).
"""

from __future__ import annotations

import contextlib
import gc
import io
import resource
import sys
import time
import weakref

import jax
import numpy as np

import hostcb
from hostcb._engine import host_functions


class Holder:
  """A callback that holds ``mb`` megabytes."""

  def __init__(self, mb: int):
    self.data = np.ones(mb << 17)  # float64: 8 bytes each

  def __call__(self, *args):
    return None


def _rss_mb() -> int:
  with open("/proc/self/status") as status:
    for line in status:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) // 1024
  return -1


def without_barrier(mode: str) -> None:
  callback = jax.debug.callback if mode == "jax" else hostcb.debug.callback
  jax.jit(lambda x: x + 1)(1.0)  # JAX's client, before the first reading
  start = _rss_mb()
  refs = []
  for _ in range(50):
    holder = Holder(40)
    refs.append(weakref.ref(holder))
    f = jax.jit(lambda x, h=holder: (callback(h, x), x)[1])
    f(1.0)
    del f, holder
  jax.clear_caches()
  gc.collect()
  deadline = time.monotonic() + 10
  while any(r() is not None for r in refs) and time.monotonic() < deadline:
    time.sleep(0.05)  # (a benchmark: hostcb frees from its consumer)
    gc.collect()
  alive = sum(r() is not None for r in refs)
  print(
    f"{mode} without a barrier: {alive} of 50 alive, RSS "
    f"+{_rss_mb() - start} MB"
  )


def main(mode: str) -> None:
  if mode == "install":
    hostcb.install(jax_callbacks=True)
  callback = hostcb.debug.callback if mode == "hostcb" else jax.debug.callback
  printer = hostcb.debug.print if mode == "hostcb" else jax.debug.print
  # (under install, jax.effects_barrier() waits for hostcb's callbacks too)
  barrier = hostcb.barrier_wait if mode == "hostcb" else jax.effects_barrier
  n, mb = (50, 8) if mode == "install" else (20, 40)
  refs = []
  for _ in range(n):
    holder = Holder(mb)
    refs.append(weakref.ref(holder))
    f = jax.jit(lambda x, h=holder: (callback(h, x), x)[1])
    f(1.0)
    del f, holder
    barrier()
  jax.clear_caches()
  gc.collect()
  barrier()  # (hostcb frees a dropped program's entries at a barrier)
  gc.collect()
  alive = sum(r() is not None for r in refs)
  peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
  print(f"{mode}: {alive} of {n} alive, peak RSS {peak_mb} MB")
  g = jax.jit(lambda x: (printer("{}", x), x)[1])
  with contextlib.redirect_stdout(io.StringIO()):
    for _ in range(200):
      jax.clear_caches()
      g(1.0)
    barrier()
  gc.collect()
  barrier()
  # (an older hostcb had no live_ids(): its key table, never freed)
  live = getattr(host_functions, "live_ids", lambda: len(host_functions._ids))()
  print(f"{mode}: {live} registry entries after 200 retraces")


_MODES = ("hostcb", "jax", "install", "hostcb-nobarrier", "jax-nobarrier")

if __name__ == "__main__":
  if len(sys.argv) != 2 or sys.argv[1] not in _MODES:
    sys.exit(f"usage: bench_host_function_memory.py {'|'.join(_MODES)}")
  if sys.argv[1].endswith("-nobarrier"):
    without_barrier(sys.argv[1].split("-")[0])
  else:
    main(sys.argv[1])
