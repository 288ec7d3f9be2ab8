"""Where a tapped dispatch's time goes, thread by thread (Linux).

``bench_dispatch.py`` gives the time per dispatch; this script says which
thread spends it.  Each variant (a tiny jitted ``x + 1`` on an f32[] with
one callback, as in ``bench_dispatch.py``) runs in a process of its own,
so that every thread of that process is the variant's: the dispatching
thread, hostcb's consumer thread (the callbacks of ``id_tap`` and
``debug.*``), XLA's threads.  Per dispatch it prints

* the time end to end (until every callback ran) and of the dispatching
  loop alone, in µs;
* the CPU time of the dispatching thread and of the other threads
  (``/proc/self/task/*/schedstat``, ns), in µs;
* the context switches of all threads (``/proc/self/task/*/status``),
  per dispatch: a consumer that waits for the GIL while the dispatching
  thread takes and releases it is woken again and again (a futex wake on
  each release), which costs both threads CPU;
* the records per consumer batch (median), where the variant taps.

Two regimes show on a 2-core machine.  Where the consumer gets no core of
its own (another job holds it), the two threads take turns: the CPU times
add up to the time end to end, and the consumer runs full batches of 256.
Where it has a core of its own, it contends for the GIL: both threads'
CPU times grow and the context switches rise (one per few dispatches).
Run it a few times (``--runs``) and compare like with like.

    python benchmarks/bench_dispatch_threads.py [--calls 100000] [--runs 2]
        [--variants base,id_tap,dcb]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time

VARIANTS = {
  "base": "no callback (baseline)",
  "id_tap": "hostcb.id_tap",
  "call": "hostcb.call",
  "dcb": "hostcb.debug.callback",
  "dcb_np": "NumPy opt-out: hostcb.debug.callback",
  "dprint": "hostcb.debug.print",
  "io": "hostcb.io_callback",
  "io_np": "NumPy opt-out: hostcb.io_callback",
  "pure": "hostcb.pure_callback",
}


def _task_ids() -> list[str]:
  return os.listdir("/proc/self/task")


def _cpu_ns() -> dict[int, int]:
  """CPU time of each thread of this process, in ns."""
  out = {}
  for t in _task_ids():
    try:
      with open(f"/proc/self/task/{t}/schedstat") as f:
        out[int(t)] = int(f.read().split()[0])
    except OSError:  # the thread ended meanwhile: it spent nothing since
      pass
  return out


def _context_switches() -> int:
  total = 0
  for t in _task_ids():
    try:
      with open(f"/proc/self/task/{t}/status") as f:
        for line in f:
          if "ctxt_switches" in line:
            total += int(line.split()[1])
    except OSError:  # the thread ended meanwhile
      pass
  return total


def run_one(name: str, calls: int) -> None:
  """Runs one variant in this process and prints one line of figures."""
  # Imported here: only the child processes run JAX.
  import jax
  import jax.numpy as jnp

  import hostcb
  from hostcb._engine import native

  # The variants are bench_dispatch.py's (this script's directory is on
  # sys.path: the children run it as a script too).
  from bench_dispatch import Sink, variants

  count = [0]
  step = dict(variants(count, with_jax=False))[VARIANTS[name]]
  if name.endswith("_np"):
    hostcb.config.update("hostcb_callback_jax_arrays", False)
  # Records per batch: the consumer binds run_batch when it starts, after
  # this (the first tap starts it).
  batches: list[int] = []
  run_batch = native._native.run_batch

  def counting_run_batch(*args):
    n = run_batch(*args)
    if n:
      batches.append(n)
    return n

  native._native.run_batch = counting_run_batch
  f = jax.jit(step)
  x = jnp.float32(1)
  main = threading.get_native_id()
  sink = Sink()
  with contextlib.redirect_stdout(sink):
    for _ in range(2000):  # compiles, starts the consumer, warms up
      out = f(x)
    out.block_until_ready()
    hostcb.barrier_wait()
    jax.effects_barrier()
    batches.clear()
    count[0] = 0
    lines0 = sink.lines
    switches0, cpu0 = _context_switches(), _cpu_ns()
    t0 = time.perf_counter()
    for _ in range(calls):
      out = f(x)
    loop = time.perf_counter() - t0
    out.block_until_ready()
    hostcb.barrier_wait()
    jax.effects_barrier()
    elapsed = time.perf_counter() - t0
    cpu1, switches1 = _cpu_ns(), _context_switches()
  delivered = count[0] + sink.lines - lines0
  if name != "base" and delivered != calls:
    sys.exit(f"{name}: {delivered} of {calls} callbacks delivered")
  per = {t: (ns - cpu0.get(t, 0)) / calls / 1e3 for t, ns in cpu1.items()}
  mine = per.pop(main, 0.0)
  print(
    name,
    f"{elapsed / calls * 1e6:.3f}",
    f"{loop / calls * 1e6:.3f}",
    f"{mine:.3f}",
    f"{sum(per.values()):.3f}",
    f"{(switches1 - switches0) / calls:.4f}",
    statistics.median(batches) if batches else "-",
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--calls", type=int, default=100000)
  parser.add_argument("--runs", type=int, default=2)
  parser.add_argument(
    "--variants", default=",".join(VARIANTS), help="comma-separated names"
  )
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    run_one(args.child, args.calls)
    return
  names = args.variants.split(",")
  unknown = [n for n in names if n not in VARIANTS]
  if unknown:
    sys.exit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
  print(
    f"per dispatch of jit(x + 1) on an f32[] with one callback, "
    f"{args.calls} dispatches, each variant in a process of its own; "
    f"load average at start {os.getloadavg()[0]:.2f}\n"
  )
  print(
    "| run | per dispatch | end to end, µs | vs base, same run "
    "| loop alone, µs "
    "| dispatching thread CPU, µs | other threads CPU, µs "
    "| context switches | records per batch |"
  )
  print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
  for run in range(args.runs):  # interleaved: each run every variant once
    base_e2e = None
    for name in names:
      out = subprocess.run(
        [sys.executable, __file__, "--child", name, "--calls", str(args.calls)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
      )
      if out.returncode != 0:
        sys.exit(f"{name} failed:\n{out.stderr[-2000:]}")
      _, e2e, loop, mine, others, switches, batch = out.stdout.split()[-7:]
      if name == "base":
        base_e2e = float(e2e)
      ratio = f"{float(e2e) / base_e2e:.2f}×" if base_e2e else "-"
      print(
        f"| {run + 1} | {VARIANTS[name]} | {e2e} | {ratio} | {loop} | "
        f"{mine} | "
        f"{others} | {switches} | {batch} |"
      )


if __name__ == "__main__":
  main()
