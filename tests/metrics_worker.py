"""One process of hostcb.metrics' multi-process test
(test_metrics_multiprocess.py).

Usage: ``python metrics_worker.py PROCESS_ID NUM_PROCESSES PORT OUTDIR``
with ``XLA_FLAGS=--xla_force_host_platform_device_count=2``.  The worker
joins the others through ``jax.distributed.initialize`` on
127.0.0.1:PORT, adds two JsonLines sinks, ``OUTDIR/first_<ID>.jsonl``
(the default: only process 0 writes) and ``OUTDIR/each_<ID>.jsonl``
(``processes="each"``), logs the scenarios below, flushes, and exits
through the ordinary exit (which closes the sinks).
"""

from __future__ import annotations

import os

import jax

from _cluster import join

PID, NPROC, OUTDIR = join()

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import hostcb._engine.distributed  # noqa: E402
from hostcb import metrics  # noqa: E402

hostcb.set_barrier_timeout(60)
metrics.add_sink(metrics.JsonLines(os.path.join(OUTDIR, f"first_{PID}.jsonl")))
metrics.add_sink(
  metrics.JsonLines(os.path.join(OUTDIR, f"each_{PID}.jsonl")), processes="each"
)

# pmap over the 4 devices of both processes: global device d holds d.
local = np.arange(2.0, dtype=np.float32) + 2 * PID
for step in range(3):
  jax.pmap(lambda v, s=step: (metrics.log({"x": v + 10 * s}, step=s), v)[1])(
    local
  ).block_until_ready()
jax.pmap(lambda v: (metrics.log({"x": v}, step=3, reduce="each"), v)[1])(
  local
).block_until_ready()

# sharded jit over both processes: the global mean, once.
mesh = Mesh(np.array(jax.devices()), ("x",))
whole = np.arange(8.0, dtype=np.float32)
x = jax.make_array_from_callback(
  whole.shape, NamedSharding(mesh, P("x")), lambda idx: whole[idx]
)
jax.jit(lambda v: metrics.log({"mean": v.mean()}, step=4))(x)

# each process on its own: every process makes its own record.
metrics.log({"process": PID}, step=5)

metrics.flush(60)
hostcb._engine.distributed.wait_for_all_processes("metrics done", timeout_s=60)
print(f"worker {PID}: done", flush=True)
