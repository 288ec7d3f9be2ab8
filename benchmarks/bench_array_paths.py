"""What one ``jax.Array`` of an f32[] made from host memory costs, by path.

The default of hostcb's drop-ins hands callbacks ``jax.Array`` s
(docs/jax_callbacks.md, "Speed"); this measures the ways jaxlib has to make
one, in the calling thread's CPU time (``time.thread_time``, which a
machine shared with other jobs disturbs less than the wall clock), each
made and dropped, every path once per round in interleaved rounds, the
median over rounds:

* ``jax.device_put``, as JAX's own callbacks make theirs;
* jaxlib's ``batched_device_put`` (what hostcb's ``cpu_array`` calls) of
  memory that NumPy allocated (the CPU client copies it) and of 64-byte
  aligned memory (the client aliases it);
* hostcb's ``cpu_array`` (``batched_device_put`` with its checks), and
  ``bound_cpu_array``'s, which the drop-ins call per argument;
* ``ArrayImpl(aval, sharding, [array])`` over an existing single-device
  array (its checks skipped), and a second ``ArrayImpl`` of an existing buffer
  (``_rewrap_with_aval_and_sharding``): no buffer made at all, the least
  that one call making one new ``jax.Array`` object costs;
* batch paths: ``lax.unstack`` of an f32[256] (a jitted computation), and
  one ``batched_device_put`` over a mesh that repeats the CPU device, then
  its per-shard arrays, per array;
* the way back, a callback's ``jax.Array`` result as a NumPy array, each
  row a ``cpu_array`` made and then converted (subtract the ``cpu_array``
  row): ``np.asarray`` (jaxlib's buffer protocol for an f32[]; for a
  bfloat16[] it fails and ``__array__`` is called) and hostcb's
  ``host_array`` (``ArrayImpl._value`` for a bfloat16[]).  A result that is
  the callback's own argument costs nothing: hostcb returns the host array
  it was made of.

    python benchmarks/bench_array_paths.py [--rounds 9] [--calls 3000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hostcb import _jax_internals as ji
from hostcb._jax_internals import host_arrays


def _aligned_scalar() -> np.ndarray:
  raw = np.empty(128, np.uint8)
  off = (-raw.ctypes.data) % 64
  a = raw[off : off + 4].view(np.float32).reshape(())
  a[...] = 1.5
  return a


def paths() -> dict:
  """``{name: (make, arrays per call)}``."""
  ji.prepare_cpu_arrays()
  put = host_arrays._put
  sharding, devices = host_arrays._sharding, host_arrays._devices
  device = devices[0]
  aval = ji.ShapedArray((), np.float32)
  numpy_memory = np.array(1.5, np.float32)
  aligned = _aligned_scalar()
  existing = put(aval, sharding, [aligned], devices, True)
  array_impl = type(existing)
  big = jax.device_put(np.arange(256, dtype=np.float32), device)
  k = 64
  repeated = NamedSharding(
    Mesh(np.array([device] * k), ("i",)), PartitionSpec("i")
  )
  k_aval = ji.ShapedArray((k,), np.float32)
  rows = [np.array([float(i)], np.float32) for i in range(k)]
  bf16 = np.array(1.5, jax.numpy.bfloat16)
  bound = ji.bound_cpu_array()
  return {
    "jax.device_put (JAX's callbacks)": (
      lambda: jax.device_put(numpy_memory, device),
      1,
    ),
    "batched_device_put, NumPy's memory (copied)": (
      lambda: put(aval, sharding, [numpy_memory], devices, True),
      1,
    ),
    "batched_device_put, 64-byte aligned (aliased)": (
      lambda: put(aval, sharding, [aligned], devices, True),
      1,
    ),
    "hostcb cpu_array": (lambda: ji.cpu_array(numpy_memory), 1),
    "hostcb cpu_array of 64-byte aligned memory": (
      lambda: ji.cpu_array(aligned),
      1,
    ),
    "hostcb bound_cpu_array of 64-byte aligned memory (the drop-ins')": (
      lambda: bound(aligned),
      1,
    ),
    "cpu_array, then np.asarray of it": (
      lambda: np.asarray(ji.cpu_array(numpy_memory)),
      1,
    ),
    "cpu_array, then hostcb host_array of it": (
      lambda: ji.host_array(ji.cpu_array(numpy_memory)),
      1,
    ),
    "cpu_array of a bfloat16[]": (lambda: ji.cpu_array(bf16), 1),
    "cpu_array of a bfloat16[], then np.asarray": (
      lambda: np.asarray(ji.cpu_array(bf16)),
      1,
    ),
    "cpu_array of a bfloat16[], then host_array": (
      lambda: ji.host_array(ji.cpu_array(bf16)),
      1,
    ),
    "ArrayImpl over an existing single-device array": (
      lambda: array_impl(
        aval, sharding, [existing], committed=True, _skip_checks=True
      ),
      1,
    ),
    "a new ArrayImpl of an existing buffer (no buffer made)": (
      lambda: existing._rewrap_with_aval_and_sharding(aval, sharding),
      1,
    ),
    "lax.unstack of an f32[256], per array": (big._unstack, 256),
    f"one put over a mesh of {k} x the CPU device, per array": (
      lambda: put(k_aval, repeated, rows, [device] * k, True)._arrays,
      k,
    ),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=9)
  parser.add_argument("--calls", type=int, default=3000)
  args = parser.parse_args()
  made = paths()
  times: dict[str, list[float]] = {name: [] for name in made}
  for make, _ in made.values():
    make()
  for _ in range(args.rounds):
    for name, (make, per) in made.items():
      n = max(args.calls // per, 20)
      t0 = time.thread_time_ns()
      for _ in range(n):
        make()
      times[name].append((time.thread_time_ns() - t0) / n / per / 1e3)
  print(
    f"jax {jax.__version__}: thread CPU µs per jax.Array of an f32[], "
    f"median of {args.rounds} interleaved rounds\n"
  )
  print("| path | µs |\n|---|---:|")
  for name, t in times.items():
    print(f"| {name} | {statistics.median(t):.2f} |")


if __name__ == "__main__":
  main()
