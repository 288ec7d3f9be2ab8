"""The start of a worker process of the multi-process tests
(multiprocess_worker.py, metrics_worker.py): its arguments
``PROCESS_ID NUM_PROCESSES PORT OUTDIR``, then ``jax.distributed`` on
127.0.0.1:PORT with gloo collectives and bounded waits."""

from __future__ import annotations

import sys


def join() -> tuple[int, int, str]:
  """Joins the cluster; returns (process id, number of processes, OUTDIR)."""
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  pid, nproc, port, outdir = (
    int(sys.argv[1]),
    int(sys.argv[2]),
    sys.argv[3],
    sys.argv[4],
  )
  jax.distributed.initialize(
    f"127.0.0.1:{port}",
    num_processes=nproc,
    process_id=pid,
    initialization_timeout=60,
  )
  return pid, nproc, outdir
