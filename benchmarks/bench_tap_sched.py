"""Where a tapped scan step's device time goes: CPU or waiting for a CPU.

A jitted ``lax.scan`` over f32[4] with, per step, nothing, the empty XLA
FFI custom call, ``hostcb.id_tap``, and ``hostcb.id_tap`` with its tap
function held (its first call of a round waits until the scan has
returned, so that no consumer runs beside the device).  For each, per
step, the untapped scan's figures subtracted, medians over interleaved
rounds:

* wall: until the scan's result is ready (bench_tap.py's device time);
* CPU: the calling thread's CPU time (on CPU, XLA runs a small program
  on the thread that calls it, so this is the device thread's);
* run-queue wait: the time that thread was ready to run but had no CPU
  (``/proc/thread-self/schedstat``, Linux).

* wall, slope: the wall time per step from the slope between ``steps``
  and ``4 * steps`` (the time each step adds), and per call the rest
  (the intercept): what a tapped call pays once, such as its return
  waiting for the GIL, which the consumer thread holds while it runs tap
  functions (CPython hands it over at its switch interval, 5 ms);
* sleeps: the times that thread gave up its CPU to wait (voluntary
  context switches, ``/proc/thread-self/status``), per 1000 steps, and
  among them those on the tap queue's lock (the engine's ``lock_sleeps``
  counter, which counts the consumer's too).

Wall minus CPU was the run-queue wait, which the consumer
thread caused; ``HOSTCB_CONSUMER_NICE=0`` shows it (the option's default
is 10).  Later the rest of it was the device thread sleeping on the tap
queue's lock about once per batch that the consumer took, until the
consumer held it for less and every tap-path hold spun before sleeping.

    python benchmarks/bench_tap_sched.py [--steps 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import jax
import jax.numpy as jnp

import hostcb
from hostcb import _engine as engine


def voluntary_switches() -> int:
  """Times the calling thread has given up its CPU to wait (Linux)."""
  with open("/proc/thread-self/status") as f:
    for line in f:
      if line.startswith("voluntary_ctxt_switches:"):
        return int(line.split(":")[1])
  raise RuntimeError("no voluntary_ctxt_switches in /proc/thread-self/status")


def run_queue_wait_s() -> float:
  """Seconds the calling thread has waited on a run queue (Linux)."""
  with open("/proc/thread-self/schedstat") as f:
    return int(f.read().split()[1]) * 1e-9


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20000)
  parser.add_argument("--rounds", type=int, default=7)
  args = parser.parse_args()
  steps = args.steps
  count = [0]
  gate = threading.Event()
  gate.set()

  def tap(x, transforms):
    count[0] += 1

  def held(x, transforms):
    count[0] += 1
    gate.wait(60)  # bounded: the round opens it once the scan is done

  noop = jax.ffi.ffi_call(engine.noop_target_name, (), has_side_effect=True)
  variants = [
    ("untapped scan", lambda c: c),
    ("empty XLA FFI custom call (the limit)", lambda c: (noop(c), c)[1]),
    ("hostcb.id_tap", lambda c: hostcb.id_tap(tap, c)),
    ("hostcb.id_tap, tap function held", lambda c: hostcb.id_tap(held, c)),
  ]

  def scan_of(step, length=steps):
    def run(x):
      def body(c, _):
        return step(c) + 1.0, None

      return jax.lax.scan(body, x, None, length=length)[0]

    return jax.jit(run)

  x = jnp.zeros((4,), jnp.float32)
  runs = [scan_of(step).lower(x).compile() for _, step in variants]
  long_runs = [
    scan_of(step, 4 * steps).lower(x).compile() for _, step in variants
  ]
  wall, cpu, wait, sleeps, locks, long_wall = (
    [[] for _ in variants] for _ in range(6)
  )
  ordinal = x.devices().pop().id

  def lock_sleeps() -> int:
    return engine.counters(ordinal)["lock_sleeps"]

  def once(i: int) -> None:
    if "held" in variants[i][0]:
      gate.clear()
    s0, l0 = voluntary_switches(), lock_sleeps()
    w0, c0, t0 = run_queue_wait_s(), time.thread_time(), time.perf_counter()
    jax.block_until_ready(runs[i](x))
    wall[i].append(time.perf_counter() - t0)
    cpu[i].append(time.thread_time() - c0)
    wait[i].append(run_queue_wait_s() - w0)
    sleeps[i].append(voluntary_switches() - s0)
    locks[i].append(lock_sleeps() - l0)
    gate.set()
    hostcb.barrier_wait()
    if "held" in variants[i][0]:
      gate.clear()
    t0 = time.perf_counter()
    jax.block_until_ready(long_runs[i](x))
    long_wall[i].append(time.perf_counter() - t0)
    gate.set()
    hostcb.barrier_wait()

  for i in range(len(variants)):
    once(i)  # the first taps start the consumer
  count[0] = 0
  for _ in range(args.rounds):
    for i in range(len(variants)):
      once(i)
  hostcb.barrier_wait()
  expected = 2 * 5 * steps * args.rounds

  def per_step(samples, i):
    m = statistics.median(samples[i][-args.rounds :])
    m0 = statistics.median(samples[0][-args.rounds :])
    return (m - m0) / steps * 1e6

  print(
    f"jax {jax.__version__}; hostcb_consumer_nice="
    f"{hostcb.config.read('hostcb_consumer_nice')}; {steps} scan steps, "
    f"median of {args.rounds} interleaved rounds; all taps delivered: "
    f"{'yes' if count[0] == expected else 'NO'}; tap call frames decoded "
    f"by XLA FFI's binding: {engine.tap_fallbacks()[0]}\n"
  )

  def slope(i):
    # µs per step from steps to 4 * steps, the untapped scan's subtracted:
    # what each step adds, without what the call pays once (intercept).
    def one(j):
      short = statistics.median(wall[j][-args.rounds :])
      long = statistics.median(long_wall[j][-args.rounds :])
      return (long - short) / (3 * steps) * 1e6, short

    (s, short), (s0, short0) = one(i), one(0)
    per_call = (short - short0) * 1e6 - (s - s0) * steps
    return s - s0, per_call

  def per_k_steps(samples, i):
    return statistics.median(samples[i][-args.rounds :]) / steps * 1000

  print(
    "| per scan step | wall µs | CPU µs | run-queue wait µs | wall vs limit "
    "| sleeps per 1000 steps | of them on the queue's lock "
    "| wall µs, slope | slope vs limit | per call µs |"
  )
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  limit = per_step(wall, 1)
  limit_slope = slope(1)[0]
  for i, (name, _) in enumerate(variants[1:], start=1):
    w = per_step(wall, i)
    print(
      f"| {name} | {w:.3f} | {per_step(cpu, i):.3f} | "
      f"{per_step(wait, i):.3f} | {w / limit:.2f}× | "
      f"{per_k_steps(sleeps, i):.2f} | {per_k_steps(locks, i):.2f} | "
      f"{slope(i)[0]:.3f} | {slope(i)[0] / limit_slope:.2f}× | "
      f"{slope(i)[1]:.0f} |"
    )


if __name__ == "__main__":
  main()
