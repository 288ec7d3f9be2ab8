"""What a host callback costs, hostcb against JAX's own and the limit.

One run on one machine, every variant in the same process:

1. per step of a jitted ``lax.scan`` over f32[4] (the untapped scan's time
   subtracted; the variants timed in interleaved rounds, medians): an
   empty XLA FFI custom call (the physical limit),
   ``hostcb.id_tap`` end to end (until ``barrier_wait`` returns) and device
   time only (until the scan returns; the consumer may still be running),
   and device time with the tap function held (its first call waits until
   the scan has returned: the handler's cost without the consumer beside
   it),
   ``hostcb.call``, ``jax.debug.callback`` and ordered ``io_callback``;
2. one dispatch of a tiny jitted function, with and without a tap (in the
   default mode, fast dispatch, and with ``hostcb_strict_barrier``);
3. ``--taps`` taps of f32[64] end to end, every value checked, with the
   growth of the process's memory;
4. a slow tap function (``--slow-ms`` per tap) beside device work of about
   the same total time: how well they overlap (rounds of both, the host
   time as the tap functions measured it, the median round).

Every callback is counted; the tables say whether all arrived.  Legacy JAX
0.4.30's figures, measured on this machine class with its own process, are
printed as reference (legacy cannot run in the same interpreter).

On a GPU, hostcb's rows come twice: with the engine's GPU back end
(``hostcb_gpu_engine``: asynchronous copies into pinned memory and a host
function on the stream) and with XLA's Python callbacks for GPUs, each
compiled under its own setting and timed in the same interleaved rounds.

    python benchmarks/bench_tap.py [--steps 20000] [--repeats 5]
        [--taps 1000000] [--slow-ms 1]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import threading
import time

import jax
import jax.numpy as jnp
from jax.experimental import io_callback

import hostcb
from hostcb import _engine as engine

# Legacy jax 0.4.30 host_callback, this machine class.
LEGACY = {"id_tap": 4.75, "call": 15.4, "dispatch": 230.0}

ON_GPU = jax.devices()[0].platform == "gpu"
# The settings of hostcb_gpu_engine that the rows compare: on a GPU both,
# labelled, and the GPU engine's taps published by host functions instead
# of ready words (as on a driver without cuStreamWriteValue64); elsewhere
# the option changes nothing.
HOST_FUNCTIONS = "host functions"


def _can_publish_by_host_functions() -> bool:
  """Whether the engine can be told to publish GPU taps by host functions:
  the test build's ``_gpu_words_refused`` (``make bench`` installs that
  build; a wheel's production build lacks it, and its rows are left out)."""
  if not engine.available():
    return False
  from hostcb._engine import native

  return hasattr(native.module(), "_gpu_words_refused")


GPU_ENGINE_MODES = (
  (
    (" [GPU engine]", True),
    *(
      [(" [GPU engine, host functions]", HOST_FUNCTIONS)]
      if _can_publish_by_host_functions()
      else []
    ),
    (" [Python callbacks]", False),
  )
  if ON_GPU
  else (("", None),)
)
# CUDA_ERROR_NOT_SUPPORTED: what a driver without stream memory operations
# answers.
_NOT_SUPPORTED = 801


def publish(mode) -> None:
  """Has the GPU engine publish taps as `mode` says (host functions, or
  ready words), where it runs."""
  if ON_GPU and gpu_engine_available() and _can_publish_by_host_functions():
    from hostcb._engine import native

    native.module()._gpu_words_refused(
      _NOT_SUPPORTED if mode == HOST_FUNCTIONS else 0
    )


def gpu_engine_available() -> bool:
  """Whether the engine's GPU back end can run here (whatever the option)."""
  return engine.gpu.available(
    hostcb.config.read(hostcb.config.MAX_QUEUE_BYTE_SIZE)
  )


@contextlib.contextmanager
def gpu_engine(on: bool | None):
  """Compiles under ``hostcb_gpu_engine = on`` (None: leaves it)."""
  if on is None:
    yield
    return
  before = hostcb.config.read(hostcb.config.GPU_ENGINE)
  hostcb.config.update(hostcb.config.GPU_ENGINE, bool(on))
  publish(on)
  try:
    yield
  finally:
    hostcb.config.update(hostcb.config.GPU_ENGINE, before)
    publish(None)


def rss() -> int:
  """The resident memory of this process, in bytes."""
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def scan_of(step, steps: int):
  """A jitted ``lax.scan`` of ``steps`` steps of ``step`` (and + 1.0)."""

  @jax.jit
  def run(x):
    def body(c, _):
      return step(c) + 1.0, None

    return jax.lax.scan(body, x, None, length=steps)[0]

  return run


def _median_time(run, x, repeats, finish=lambda: None) -> float:
  jax.block_until_ready(run(x))  # compiles
  finish()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(run(x))
    finish()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def per_step(steps: int, repeats: int):
  """Rows (name, µs per step, all delivered).

  The variants are timed in interleaved rounds (one run of each variant
  per round, the median over rounds), so that a slow phase of a shared
  machine weighs on every variant alike rather than on one row.
  """
  count = [0]

  def tap(x, transforms):
    count[0] += 1

  def plain(x):
    count[0] += 1

  # The held variant's tap function: its first call of a round waits until
  # the scan has returned (`once` opens the gate), so that the consumer
  # does not run beside the device (bounded: a queue too small for the
  # round would make the device wait for space, and the gate's deadline
  # ends that wait).
  gate = threading.Event()
  gate.set()

  def held(x, transforms):
    count[0] += 1
    gate.wait(60)

  def ret(x):
    count[0] += 1
    return x

  f32 = jax.ShapeDtypeStruct((4,), jnp.float32)
  x = jnp.zeros((4,), jnp.float32)
  nothing = lambda: None
  # (name, step, finish, counted, hostcb_gpu_engine)
  variants = [("untapped scan", lambda c: c, nothing, False, None)]
  if engine.available() and (not ON_GPU or gpu_engine_available()):
    noop = jax.ffi.ffi_call(engine.noop_target_name, (), has_side_effect=True)
    variants.append(
      (
        "empty XLA FFI custom call (the limit)",
        lambda c: (noop(c), c)[1],
        nothing,
        False,
        None,
      )
    )
  for label, mode in GPU_ENGINE_MODES:
    variants += [
      (
        "hostcb.id_tap, end to end" + label,
        lambda c: hostcb.id_tap(tap, c),
        hostcb.barrier_wait,
        True,
        mode,
      ),
      (
        "hostcb.id_tap, device time" + label,
        lambda c: hostcb.id_tap(tap, c),
        nothing,
        True,
        mode,
      ),
      (
        "hostcb.id_tap, device time, tap function held" + label,
        lambda c: hostcb.id_tap(held, c),
        nothing,
        True,
        mode,
      ),
      (
        "hostcb.call" + label,
        lambda c: hostcb.call(ret, c, result_shape=f32),
        hostcb.barrier_wait,
        True,
        mode,
      ),
    ]
  variants += [
    (
      "jax.debug.callback",
      lambda c: (jax.debug.callback(plain, c), c)[1],
      jax.effects_barrier,
      True,
      None,
    ),
    (
      "io_callback(ordered=True)",
      lambda c: io_callback(ret, f32, c, ordered=True),
      jax.effects_barrier,
      True,
      None,
    ),
  ]
  runs = []
  for _, step, _, _, mode in variants:
    with gpu_engine(mode):  # each compiled under its own setting
      runs.append(scan_of(step, steps).lower(x).compile())
  times: list[list[float]] = [[] for _ in variants]
  counts = [0] * len(variants)

  def once(i: int) -> float:
    count[0] = 0
    publish(variants[i][4])
    if "held" in variants[i][0]:
      gate.clear()
    t0 = time.perf_counter()
    jax.block_until_ready(runs[i](x))
    variants[i][2]()
    elapsed = time.perf_counter() - t0
    gate.set()
    hostcb.barrier_wait()  # the device-time row's taps, before the next
    jax.effects_barrier()
    counts[i] += count[0]
    return elapsed

  for i in range(len(variants)):
    once(i)  # compiles
  for _ in range(repeats):
    for i in range(len(variants)):
      times[i].append(once(i))
  base = statistics.median(times[0])
  rows = []
  for i, (name, _, _, counted, _) in enumerate(variants[1:], start=1):
    per_step_us = max(statistics.median(times[i]) - base, 0.0) / steps * 1e6
    delivered = counts[i] == steps * (repeats + 1) if counted else True
    rows.append((name, per_step_us, delivered))
  return rows


def dispatch(calls: int, rounds: int = 5):
  """Rows (name, µs per dispatch, all delivered) of a tiny jitted function,
  the median of ``rounds`` rounds of ``calls`` dispatches."""
  count = [0]

  def ignore(*args):
    count[0] += 1

  strict = hostcb.config.STRICT_BARRIER
  default = hostcb.config.read(strict)
  gpu_default = hostcb.config.read(hostcb.config.GPU_ENGINE)
  variants = [("no callback", lambda x: x + 1, default, 0, None)]
  for label, mode in GPU_ENGINE_MODES:
    variants += [
      (
        "hostcb.id_tap (default: fast dispatch)" + label,
        lambda x: hostcb.id_tap(ignore, x) + 1,
        False,
        1,
        mode,
      ),
      (
        "hostcb.id_tap, hostcb_strict_barrier" + label,
        lambda x: hostcb.id_tap(ignore, x) + 1,
        True,
        1,
        mode,
      ),
    ]
  variants.append(
    (
      "jax.debug.callback",
      lambda x: (jax.debug.callback(ignore, x), x + 1)[1],
      default,
      1,
      None,
    )
  )
  rows = []
  for name, fn, strict_mode, taps, mode in variants:
    hostcb.config.update(strict, strict_mode)
    if mode is not None:
      hostcb.config.update(hostcb.config.GPU_ENGINE, bool(mode))
      publish(mode)
    count[0] = 0
    f = jax.jit(fn)
    x = jnp.float32(1)
    for _ in range(100):
      f(x)
    hostcb.barrier_wait()
    jax.effects_barrier()
    times = []
    for _ in range(rounds):
      t0 = time.perf_counter()
      for _ in range(calls):
        out = f(x)
      out.block_until_ready()
      times.append(time.perf_counter() - t0)
    hostcb.barrier_wait()
    jax.effects_barrier()
    ok = count[0] == taps * (100 + rounds * calls)
    rows.append((name, statistics.median(times) / calls * 1e6, ok))
  hostcb.config.update(strict, default)
  hostcb.config.update(hostcb.config.GPU_ENGINE, gpu_default)
  publish(None)
  return rows


def many_taps(n: int, mode: bool | None = None):
  """(µs per tap, all delivered with their values, RSS growth in MB), with
  ``hostcb_gpu_engine = mode`` (None: as it is)."""
  seen = [0, 0.0]

  def tap(x, transforms):
    seen[0] += 1
    seen[1] += float(x[0])

  @jax.jit
  def run(x):
    def body(c, i):
      hostcb.id_tap(tap, jnp.full((64,), i, jnp.float32))
      return c, None

    return jax.lax.scan(body, x, jnp.arange(n, dtype=jnp.int32))[0]

  with gpu_engine(mode):
    run = run.lower(jnp.float32(0)).compile()
    return _many_taps_run(run, n, seen)


def _many_taps_run(run, n, seen):
  run(jnp.float32(0)).block_until_ready()
  hostcb.barrier_wait()
  seen[:] = [0, 0.0]
  before = rss()
  t0 = time.perf_counter()
  run(jnp.float32(0)).block_until_ready()
  hostcb.barrier_wait()
  elapsed = time.perf_counter() - t0
  ok = seen[0] == n and seen[1] == n * (n - 1) / 2
  return elapsed / n * 1e6, ok, (rss() - before) / 1e6


def overlap(
  slow_ms: float, steps: int = 200, mode: bool | None = None, rounds: int = 5
):
  """(host s, device s, together s): a slow tap beside device work, with
  ``hostcb_gpu_engine = mode`` (None: as it is).

  Each round runs the untapped computation (device) and the tapped one
  until its last tap returned (together), one after the other; host is the
  time the tap functions took in that round (their sleeps as the machine
  gave them, not ``steps * slow_ms``).  The round with the median ratio
  ``together / max(host, device)`` is returned: on a machine whose load
  drifts, times from the same round compare.
  """
  spent = [0.0]

  def slow(x, transforms):
    t0 = time.perf_counter()
    time.sleep(slow_ms / 1e3)
    spent[0] += time.perf_counter() - t0

  m = jnp.ones((300, 300), jnp.float32) / 300

  def work(c):
    for _ in range(4):
      c = jnp.tanh(m @ c)
    return c

  def run_with(tapped):
    @jax.jit
    def run(c):
      def body(c, _):
        c = work(c)
        if tapped:
          hostcb.id_tap(slow, c[0, 0])
        return c, None

      return jax.lax.scan(body, c, None, length=steps)[0]

    return run

  c = jnp.ones((300, 300), jnp.float32)
  results = []
  with gpu_engine(mode):
    untapped = run_with(False).lower(c).compile()
    tapped = run_with(True).lower(c).compile()
    jax.block_until_ready(untapped(c))
    jax.block_until_ready(tapped(c))  # its first taps' threads start here
    hostcb.barrier_wait()
    for _ in range(rounds):
      t0 = time.perf_counter()
      jax.block_until_ready(untapped(c))
      device = time.perf_counter() - t0
      spent[0] = 0.0
      t0 = time.perf_counter()
      jax.block_until_ready(tapped(c))
      hostcb.barrier_wait()
      together = time.perf_counter() - t0
      results.append((spent[0], device, together))
  results.sort(key=lambda r: r[2] / max(r[0], r[1]))
  return results[len(results) // 2]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20000)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--taps", type=int, default=1_000_000)
  parser.add_argument("--slow-ms", type=float, default=1.0)
  args = parser.parse_args()
  print(
    f"jax {jax.__version__}, {jax.devices()[0].platform}, "
    f"{platform.processor() or platform.machine()}, {os.cpu_count()} "
    f"cores; native engine: "
    f"{'yes' if engine.available() else engine.unavailable_reason()}; "
    f"hostcb_consumer_nice={hostcb.config.read('hostcb_consumer_nice')}"
  )
  if ON_GPU:
    print(
      "GPU engine: "
      + (
        (
          "available; taps published by "
          + (
            "ready words the stream writes"
            if engine.gpu.publication() is None
            else f"host functions: {engine.gpu.publication()}"
          )
        )
        if gpu_engine_available()
        else f"NOT available: {engine.gpu.unavailable_reason()}"
      )
    )
  rows = per_step(args.steps, args.repeats)
  by = {name: v for name, v, _ in rows}
  dbg, io = by["jax.debug.callback"], by["io_callback(ordered=True)"]
  print(
    f"\n{args.steps} scan steps over f32[4], median of {args.repeats} "
    "interleaved rounds\n"
  )
  print(
    "| per scan step | µs | vs jax.debug.callback | vs io_callback "
    "| all delivered |"
  )
  print("|---|---:|---:|---:|:---:|")
  for name, v, ok in rows:
    ratio = lambda a: f"{a / v:.0f}×" if v > 0 else "∞"
    print(
      f"| {name} | {v:.3f} | {ratio(dbg)} | {ratio(io)} | "
      f"{'yes' if ok else 'NO'} |"
    )
  print(
    f"| legacy JAX 0.4.30 id_tap / call (reference) | "
    f"{LEGACY['id_tap']} / {LEGACY['call']} | | | |"
  )

  drows = dispatch(3000)
  untapped = drows[0][1]
  print(
    "\n| one dispatch of a tiny jitted function | µs | vs no callback "
    "| all delivered |"
  )
  print("|---|---:|---:|:---:|")
  for name, v, ok in drows:
    print(
      f"| {name} | {v:.1f} | {v / untapped:.1f}× | {'yes' if ok else 'NO'} |"
    )
  print(
    f"| legacy JAX 0.4.30 id_tap (reference) | {LEGACY['dispatch']:.0f} | | |"
  )

  for label, mode in GPU_ENGINE_MODES:
    us, ok, grown = many_taps(args.taps, mode)
    print(
      f"\n{args.taps:,} taps of f32[64] end to end{label}: {us:.2f} µs "
      f"per tap; all delivered with their values: "
      f"{'yes' if ok else 'NO'}; memory grew by {grown:.0f} MB (queue "
      f"bound "
      f"{hostcb.config.read('jax_host_callback_max_queue_byte_size') / 1e6:.0f}"
      " MB per device)"
    )

  for label, mode in GPU_ENGINE_MODES:
    host, device, together = overlap(args.slow_ms, mode=mode)
    print(
      f"\nslow tap ({args.slow_ms} ms each) beside device work{label}: "
      f"host {host:.2f} s, device {device:.2f} s, together "
      f"{together:.2f} s = {together / max(host, device):.2f}× "
      "max(host, device)"
    )


if __name__ == "__main__":
  main()
