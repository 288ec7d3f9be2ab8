"""hostcb in a multi-process JAX program, on one machine or on a cluster.

One command runs it as 2 local processes with 2 CPU devices each::

    python examples/multiprocess.py

It starts itself twice on a free port of 127.0.0.1 and prefixes each line
with the process that wrote it (``--verbose`` also shows the runtime's own
log lines: gloo connections, and XLA's warning that the operand of a
callback in ``jit`` is gathered whole on one device, which is the point).
It runs the hostcb that this Python imports (the installed one, with its
engine); only where none is installed does it use a source checkout's
``src/hostcb``.

On a cluster, start one copy per host (or per GPU) in worker mode and let
``jax.distributed.initialize()`` read the cluster's environment (SLURM,
Open MPI), or give the coordinator explicitly (e.g. on Kubernetes)::

    srun --ntasks=2 python examples/multiprocess.py --worker
    python examples/multiprocess.py --worker --coordinator HOST:PORT \\
        --num-processes N --process-id I

What it shows (see docs/multiprocess.md):

* ``id_print`` under ``jit`` over the global mesh prints once, in the
  process owning the mesh's device 0, the whole global value;
* ``call`` under that ``jit`` runs once with the whole operand, and every
  process gets its own shards of the result;
* under ``pmap`` each process prints for its own devices;
* ``barrier_wait(all_processes=True)`` waits for the taps of every process.
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import subprocess
import sys
import threading
import time


def worker(args) -> None:
  """One process of the program."""
  import jax

  # CPU devices of different processes talk through gloo (this only
  # concerns the CPU backend; GPUs use their own collectives).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if args.coordinator:
    jax.distributed.initialize(
      args.coordinator,
      num_processes=args.num_processes,
      process_id=args.process_id,
      initialization_timeout=60,
    )
  else:
    jax.distributed.initialize()  # from the cluster's environment

  import numpy as np
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import hostcb

  me = jax.process_index()
  devices = jax.devices()
  mesh = Mesh(np.array(devices), ("x",))
  sharding = NamedSharding(mesh, P("x"))
  n = 2 * len(devices)
  whole = np.arange(n, dtype=np.float32)
  x = jax.make_array_from_callback((n,), sharding, lambda idx: whole[idx])
  print(
    f"process {me} of {jax.process_count()}: local devices "
    f"{jax.local_devices()}, global array of {n} elements",
    flush=True,
  )

  # 1. A tap in jit over the global mesh: once, in the process of device 0.
  @jax.jit
  def total(v):
    return hostcb.id_print(v.sum(), what="global sum (id_print in jit)")

  total(x).block_until_ready()

  # 2. A call in jit: the host function sees the whole operand once; every
  # process receives its shards of the result.
  def host_cumsum(a):
    print(f"process {me}: call got the whole operand {a}", flush=True)
    return np.cumsum(a)

  cumsum = jax.jit(
    lambda v: hostcb.call(
      host_cumsum, v, result_shape=jax.ShapeDtypeStruct(v.shape, v.dtype)
    ),
    out_shardings=sharding,
  )
  y = cumsum(x)
  for shard in y.addressable_shards:
    print(
      f"process {me}: shard of the call's result on {shard.device}: "
      f"{np.asarray(shard.data)}",
      flush=True,
    )

  # 3. pmap: each process taps for its local devices.
  local = np.arange(jax.local_device_count(), dtype=np.float32) + 10 * me
  jax.pmap(lambda v: hostcb.id_print(v, what="pmap", tap_with_device=True))(
    local
  ).block_until_ready()

  # 4. Wait for this process's taps, then for every other process.
  hostcb.barrier_wait("end", all_processes=True)
  print(f"process {me}: every process is past its barrier", flush=True)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


_NOISE = ("[Gloo] ", "spmd_partitioner.cc")


def _checkout_src() -> str | None:
  """This checkout's ``src/`` if the script runs from one and this Python
  has no hostcb installed, else None: an installed hostcb has its native
  engine, a checkout's ``src/`` has none until built in place."""
  import importlib.util

  if importlib.util.find_spec("hostcb") is not None:
    return None
  src = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"
  )
  return (
    src if os.path.isfile(os.path.join(src, "hostcb", "__init__.py")) else None
  )


def launch_locally(
  num_processes: int, timeout: float, verbose: bool = False
) -> int:
  """Runs ``num_processes`` workers on this machine; their exit status."""
  src = _checkout_src()  # else the installed hostcb
  env = dict(os.environ)
  env["XLA_FLAGS"] = (
    env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
  ).strip()
  env["JAX_PLATFORMS"] = "cpu"
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  env["PYTHONPATH"] = os.pathsep.join(
    p for p in (src, env.get("PYTHONPATH")) if p
  )
  coordinator = f"127.0.0.1:{free_port()}"
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        "--coordinator",
        coordinator,
        "--num-processes",
        str(num_processes),
        "--process-id",
        str(i),
      ],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(num_processes)
  ]

  def relay(i: int, stream, out) -> None:
    for line in stream:
      if not verbose and any(n in line for n in _NOISE):
        continue
      out.write(f"[process {i}] {line}")
      out.flush()

  # stdout and stderr are relayed separately, so that the runtime's log
  # lines (stderr) never cut a printed line in two.
  relays = [
    threading.Thread(target=relay, args=(i, stream, out), daemon=True)
    for i, p in enumerate(procs)
    for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr))
  ]
  exits: queue.Queue = queue.Queue()
  waiters = [
    threading.Thread(
      target=lambda i=i, p=p: exits.put((i, p.wait())), daemon=True
    )
    for i, p in enumerate(procs)
  ]
  for t in relays + waiters:
    t.start()
  deadline = time.monotonic() + timeout
  status = 0
  try:
    for _ in procs:  # stop at the first failure: the others would wait
      i, rc = exits.get(timeout=max(0.0, deadline - time.monotonic()))
      if rc != 0:
        print(f"process {i} failed with exit status {rc}", file=sys.stderr)
        status = rc
        break
  except queue.Empty:
    print(f"the processes did not finish within {timeout:g} s", file=sys.stderr)
    status = 1
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    for p in procs:
      p.wait()
    for t in relays:
      t.join(timeout=5)
  return status


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
    "--worker",
    action="store_true",
    help="run as one process of a multi-process program",
  )
  parser.add_argument("--coordinator", help="HOST:PORT of process 0")
  parser.add_argument("--num-processes", type=int)
  parser.add_argument("--process-id", type=int)
  parser.add_argument(
    "--local-processes",
    type=int,
    default=2,
    help="how many local processes to start (default 2)",
  )
  parser.add_argument(
    "--timeout",
    type=float,
    default=120,
    help="seconds to wait for the local processes",
  )
  parser.add_argument(
    "--verbose", action="store_true", help="also show the runtime's log lines"
  )
  args = parser.parse_args()
  if args.worker:
    worker(args)
  else:
    sys.exit(launch_locally(args.local_processes, args.timeout, args.verbose))


if __name__ == "__main__":
  main()
