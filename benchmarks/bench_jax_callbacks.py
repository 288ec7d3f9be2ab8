"""JAX's own callbacks against hostcb's, side by side in one run.

For each of ``jax.debug.callback``, ``jax.debug.print``,
``jax.experimental.io_callback`` (unordered and ordered) and
``jax.pure_callback``, JAX's function and hostcb's (``hostcb.debug.callback``,
``hostcb.debug.print``, ``hostcb.io_callback``, ``hostcb.pure_callback``),
every variant in the same process:

0. one callback of an f32[] per step of a jitted ``lax.scan``:
   ``hostcb.id_tap``, ``hostcb.debug.callback`` with ``jax.Array``
   arguments (the default) and with NumPy arrays (the opt-out
   ``hostcb_callback_jax_arrays=False``), and ``jax.debug.callback``,
   with the type of argument each function got;
1. per step of a jitted ``lax.scan`` over f32[4], end to end (until
   ``jax.effects_barrier()`` returns, which waits for JAX's callbacks and
   hostcb's): the untapped scan's time subtracted, the variants timed in
   interleaved rounds (one run of each per round, the median over rounds),
   so that a slow phase of a shared machine weighs on every variant alike.
   The empty scan and an empty XLA FFI custom call (the physical limit of
   a call from the device to the host) are measured beside them;
2. one dispatch of a small jitted function with one callback of each kind
   against the same function without it (also in interleaved rounds; the
   final ``jax.effects_barrier()`` of each round is included);
3. the floor, in the same run: ``id_tap``'s cost per step (the engine's,
   with a NumPy argument), and what making one ``jax.Array`` of the engine's
   memory costs (hostcb's ``bound_cpu_array``: jaxlib's
   ``batched_device_put``)
   and the least any new ``jax.Array`` costs (a second ``ArrayImpl`` of an
   existing buffer), in the calling thread's CPU time
   (``bench_array_paths.py``'s rows, interleaved rounds).  A callback that
   gets ``jax.Array`` s costs at least ``id_tap``'s step plus one
   ``jax.Array`` per argument: each row shows that floor, and how much
   cheaper than JAX's own a function at the floor would be.

Each row says which argument the function got: ``jax.Array`` (JAX's
callbacks and hostcb's drop-ins by default) or NumPy (``id_tap``, ``call``
and the opt-out ``hostcb_callback_jax_arrays=False``).

Prints go to a text stream over a buffered file, as ``sys.stdout`` is in a
terminal or redirected (``bench_dispatch.Sink``, whose file end counts
lines; ``sys.stdout`` redirected for JAX's and hostcb's alike); every
callback is counted and the tables say whether every call was delivered
(the script fails if one was not).

    python benchmarks/bench_jax_callbacks.py [--steps 20000] [--repeats 5]
        [--calls 2000] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time

import jax
import jax.experimental
import jax.numpy as jnp

import hostcb
from bench_array_paths import paths as array_paths  # benchmarks/ too
from bench_dispatch import Sink  # benchmarks/ is on sys.path
from bench_tap import scan_of
from hostcb import _engine as engine
from hostcb import _import_hook as import_hook

if import_hook.jax_callbacks_installed():
  # Under `hostcb run --jax-callbacks` JAX's names are hostcb's: there would
  # be nothing to compare with.
  sys.exit(
    "bench_jax_callbacks: run it without hostcb.install(jax_callbacks=True)"
  )

# (kind, JAX's function, hostcb's function)
FUNCTIONS = [
  ("debug.callback", jax.debug.callback, hostcb.debug.callback),
  ("debug.print", jax.debug.print, hostcb.debug.print),
  ("io_callback", jax.experimental.io_callback, hostcb.io_callback),
  (
    "io_callback(ordered=True)",
    jax.experimental.io_callback,
    hostcb.io_callback,
  ),
  ("pure_callback", jax.pure_callback, hostcb.pure_callback),
]


class Counter:
  """Counts callback calls (the host functions of every variant) and
  notes the type of the argument they got (``jax.Array``: ``ArrayImpl``,
  NumPy: ``ndarray``)."""

  def __init__(self):
    self.n = 0
    self.type = ""

  def plain(self, *args) -> None:
    self.n += 1
    self.type = type(args[0]).__name__

  def tap(self, x, transforms) -> None:  # id_tap's function
    self.n += 1
    self.type = type(x).__name__

  def same(self, x):
    self.n += 1
    self.type = type(x).__name__
    return x


@contextlib.contextmanager
def _jax_arrays(value: bool | None):
  """``hostcb_callback_jax_arrays`` set to ``value`` (None: as it is): the
  option is read when a callback is traced, i.e. at a variant's first
  run."""
  name = "hostcb_callback_jax_arrays"
  before = hostcb.config.read(name)
  if value is not None:
    hostcb.config.update(name, value)
  try:
    yield
  finally:
    hostcb.config.update(name, before)


def _call(kind: str, fn, counter: Counter, shape):
  """``step(x) -> y``: one callback of ``kind`` through ``fn`` whose
  result (or ``x`` itself, for the debug functions) is ``y``."""
  if kind == "debug.callback":
    return lambda x: (fn(counter.plain, x), x)[1]
  if kind == "debug.print":
    return lambda x: (fn("{}", x), x)[1]
  ordered = kind == "io_callback(ordered=True)"
  if kind.startswith("io_callback"):
    return lambda x: fn(counter.same, shape, x, ordered=ordered)
  return lambda x: fn(counter.same, shape, x)  # pure_callback, result used


def _interleaved(variants, once, rounds: int) -> list[float]:
  """The median over ``rounds`` rounds of ``once(i)`` for every variant
  (one call each per round, after one call each to compile)."""
  times: list[list[float]] = [[] for _ in variants]
  for i in range(len(variants)):
    once(i)  # compiles
  for _ in range(rounds):
    for i in range(len(variants)):
      times[i].append(once(i))
  return [statistics.median(t) for t in times]


CALL = "hostcb.call (reference)"
TAP = "hostcb.id_tap (reference)"
IO_NUMPY = "io_callback, NumPy opt-out"
# bench_array_paths.py's rows: one jax.Array as the drop-ins make each
# argument, and the least that any new jax.Array costs.
ONE_ARRAY = "hostcb bound_cpu_array of 64-byte aligned memory (the drop-ins')"
ANY_ARRAY = "a new ArrayImpl of an existing buffer (no buffer made)"


def per_step(steps: int, repeats: int, sink: Sink):
  """(empty scan µs per step, limit µs per step or None, rows): rows of
  (kind, JAX µs, hostcb µs, all delivered), per scan step beyond the
  empty scan's."""
  counter = Counter()
  f32 = jax.ShapeDtypeStruct((4,), jnp.float32)
  x = jnp.zeros((4,), jnp.float32)
  # (name, step, counted[, hostcb_callback_jax_arrays at tracing])
  variants = [("empty scan", lambda c: c, False)]
  has_limit = engine.available() and jax.devices()[0].platform == "cpu"
  if has_limit:
    noop = jax.ffi.ffi_call(engine.noop_target_name, (), has_side_effect=True)
    variants.append(("limit", lambda c: (noop(c), c)[1], False))
  for kind, jax_fn, our_fn in FUNCTIONS:
    variants.append((("jax", kind), _call(kind, jax_fn, counter, f32), True))
    variants.append((("hostcb", kind), _call(kind, our_fn, counter, f32), True))
  # References for hostcb's io_callback/pure_callback: legacy's ``call``
  # (NumPy arguments) and the same io_callback with the NumPy opt-out; and
  # id_tap, the engine's own cost per step (the floor).
  variants.append((TAP, lambda c: hostcb.id_tap(counter.tap, c), True))
  variants.append(
    (
      CALL,
      lambda c: hostcb.call(counter.same, c, result_shape=f32),
      True,
    )
  )
  variants.append(
    (
      IO_NUMPY,
      _call("io_callback", hostcb.io_callback, counter, f32),
      True,
      False,
    )
  )
  runs = [scan_of(step, steps) for _, step, *_ in variants]
  delivered = [0] * len(variants)
  types = [""] * len(variants)

  def once(i: int) -> float:
    counter.n = 0
    lines = sink.lines
    with _jax_arrays(variants[i][3] if len(variants[i]) > 3 else None):
      t0 = time.perf_counter()
      jax.block_until_ready(runs[i](x))
      jax.effects_barrier()
      elapsed = time.perf_counter() - t0
    delivered[i] += counter.n + sink.lines - lines
    if counter.n:
      types[i] = counter.type
    return elapsed

  medians = _interleaved(variants, once, repeats)
  base = medians[0]
  us = [max(m - base, 0.0) / steps * 1e6 for m in medians]
  ok = [
    d == steps * (repeats + 1) if counted else True
    for d, (_, _, counted, *_) in zip(delivered, variants)
  ]
  by = {name: (u, o, t) for (name, *_), u, o, t in zip(variants, us, ok, types)}
  rows = []
  for kind, _, _ in FUNCTIONS:
    (j, jok, jt), (h, hok, ht) = by[("jax", kind)], by[("hostcb", kind)]
    rows.append((kind, j, jt, h, ht, jok and hok))
  for name in (TAP, CALL, IO_NUMPY):
    h, hok, ht = by[name]
    rows.append((name, None, "", h, ht, hok))
  limit = by["limit"][0] if has_limit else None
  return base / steps * 1e6, limit, rows


def scalar_per_step(steps: int, repeats: int, sink: Sink):
  """Rows of (variant, argument type, µs per scan step beyond the empty
  scan, all delivered) for one callback of an f32[] per step of a jitted
  scan: ``id_tap``, ``id_print`` (its lines counted), hostcb's
  ``debug.callback`` with ``jax.Array`` arguments (the default) and with
  NumPy arrays (the opt-out), and JAX's ``debug.callback``."""
  counter = Counter()
  x = jnp.float32(0)
  # (name, step, counted, hostcb_callback_jax_arrays at tracing)
  variants = [
    ("empty scan", lambda c: c, False, None),
    ("hostcb.id_tap", lambda c: hostcb.id_tap(counter.tap, c), True, None),
    ("hostcb.id_print", lambda c: hostcb.id_print(c), True, None),
    (
      "hostcb.debug.callback",
      lambda c: (hostcb.debug.callback(counter.plain, c), c)[1],
      True,
      True,
    ),
    (
      "hostcb.debug.callback, NumPy opt-out",
      lambda c: (hostcb.debug.callback(counter.plain, c), c)[1],
      True,
      False,
    ),
    (
      "jax.debug.callback",
      lambda c: (jax.debug.callback(counter.plain, c), c)[1],
      True,
      None,
    ),
  ]
  runs = [scan_of(step, steps) for _, step, _, _ in variants]
  delivered = [0] * len(variants)
  types = [""] * len(variants)

  def once(i: int) -> float:
    counter.n = 0
    lines = sink.lines
    with _jax_arrays(variants[i][3]):
      t0 = time.perf_counter()
      jax.block_until_ready(runs[i](x))
      jax.effects_barrier()
      elapsed = time.perf_counter() - t0
    delivered[i] += counter.n + sink.lines - lines
    if counter.n:
      types[i] = counter.type
    elif sink.lines > lines:
      types[i] = "ndarray"  # id_print's
    return elapsed

  medians = _interleaved(variants, once, repeats)
  base = medians[0]
  rows = []
  for (name, _, counted, _), m, d, t in zip(
    variants, medians, delivered, types
  ):
    if counted:
      rows.append(
        (name, t, max(m - base, 0.0) / steps * 1e6, d == steps * (repeats + 1))
      )
  return rows


def dispatch(calls: int, rounds: int, sink: Sink):
  """(no-callback µs, rows): rows of (kind, JAX µs, hostcb µs, all
  delivered), per dispatch of a small jitted function with one callback,
  the median of ``rounds`` interleaved rounds of ``calls`` dispatches."""
  counter = Counter()
  f32 = jax.ShapeDtypeStruct((), jnp.float32)
  x = jnp.float32(1)
  variants = [("none", jax.jit(lambda v: v + 1), False)]
  for kind, jax_fn, our_fn in FUNCTIONS:
    for who, fn in (("jax", jax_fn), ("hostcb", our_fn)):
      step = _call(kind, fn, counter, f32)
      variants.append(((who, kind), jax.jit(lambda v, s=step: s(v) + 1), True))
  delivered = [0] * len(variants)

  def once(i: int) -> float:
    f = variants[i][1]
    counter.n = 0
    lines = sink.lines
    t0 = time.perf_counter()
    for _ in range(calls):
      out = f(x)
    out.block_until_ready()
    jax.effects_barrier()
    elapsed = time.perf_counter() - t0
    delivered[i] += counter.n + sink.lines - lines
    return elapsed

  for i in range(len(variants)):  # warm up past the first dispatches
    once(i)
  medians = _interleaved(variants, once, rounds)
  us = [m / calls * 1e6 for m in medians]
  ok = [
    d == calls * (rounds + 2) if counted else True
    for d, (_, _, counted) in zip(delivered, variants)
  ]
  by = {name: (u, o) for (name, _, _), u, o in zip(variants, us, ok)}
  rows = []
  for kind, _, _ in FUNCTIONS:
    (j, jok), (h, hok) = by[("jax", kind)], by[("hostcb", kind)]
    rows.append((kind, j, h, jok and hok))
  return by["none"][0], rows


def array_floors(rounds: int, calls: int = 3000) -> dict[str, float]:
  """Thread CPU µs per ``jax.Array``, median of ``rounds`` interleaved
  rounds, of :data:`ONE_ARRAY` and :data:`ANY_ARRAY`
  (``bench_array_paths.py``'s measurement, in this run)."""
  made = array_paths()
  made = {name: made[name] for name in (ONE_ARRAY, ANY_ARRAY)}
  times: dict[str, list[float]] = {name: [] for name in made}
  for make, _ in made.values():
    make()
  for _ in range(rounds):
    for name, (make, per) in made.items():
      t0 = time.thread_time_ns()
      for _ in range(calls // per):
        make()
      times[name].append((time.thread_time_ns() - t0) / (calls // per) / 1e3)
  return {name: statistics.median(t) for name, t in times.items()}


def _ratio(a: float, b: float) -> str:
  return f"{a / b:.0f}×" if b > 0 else "∞"


def _argument(type_name: str) -> str:
  """What the function got, as the tables say it."""
  return {"ArrayImpl": "jax.Array", "ndarray": "NumPy"}.get(
    type_name, type_name or "-"
  )


def _floor(tap_us: float, one_array_us: float, type_name: str) -> float:
  """The least a step of a function given ``type_name`` costs: id_tap's
  step, and one jax.Array where it gets one."""
  return tap_us + (one_array_us if type_name == "ArrayImpl" else 0.0)


def _print_scalar_table(args, srows, floors: dict) -> None:
  print(
    f"\none callback of an f32[] per step of a jitted {args.steps}-step "
    "lax.scan, end to end, beyond the empty scan; median of "
    f"{args.repeats} interleaved rounds; the floor: id_tap's step, plus "
    "one jax.Array where the function gets one (measured in this run)\n"
  )
  print(
    "| per scan step | argument | µs | − id_tap's, µs "
    "| JAX's / this | floor, µs | JAX's / floor | all delivered |"
  )
  print("|---|---|---:|---:|---:|---:|---:|:---:|")
  tap_us = srows[0][2]
  jax_us = srows[-1][2]
  for name, arg, us, ok in srows:
    floor = _floor(tap_us, floors[ONE_ARRAY], arg)
    print(
      f"| {name} | {_argument(arg)} | {us:.2f} | {us - tap_us:+.2f} | "
      f"{_ratio(jax_us, us)} | {floor:.2f} | {_ratio(jax_us, floor)} | "
      f"{'yes' if ok else 'NO'} |"
    )


def _print_step_table(args, rows, empty, limit, floors: dict) -> None:
  print(
    f"\nper step of a jitted {args.steps}-step lax.scan over f32[4], "
    "end to end, beyond the empty scan; median of "
    f"{args.repeats} interleaved rounds; the floor as above\n"
  )
  print(
    "| per scan step | JAX's, µs | argument | hostcb's, µs | argument "
    "| JAX / hostcb | floor, µs | JAX / floor | all delivered |"
  )
  print("|---|---:|---|---:|---|---:|---:|---:|:---:|")
  call_us = next(h for kind, _, _, h, _, _ in rows if kind == CALL)
  tap_us = next(h for kind, _, _, h, _, _ in rows if kind == TAP)
  for kind, j, jt, h, ht, ok in rows:
    floor = _floor(tap_us, floors[ONE_ARRAY], ht)
    if j is None:  # a reference row: hostcb's only
      print(
        f"| {kind} | | | {h:.2f} | {_argument(ht)} | | {floor:.2f} | | "
        f"{'yes' if ok else 'NO'} |"
      )
      continue
    print(
      f"| {kind} | {j:.2f} | {_argument(jt)} | {h:.2f} | {_argument(ht)} | "
      f"{_ratio(j, h)} | {floor:.2f} | {_ratio(j, floor)} | "
      f"{'yes' if ok else 'NO'} |"
    )
  if limit is not None:
    print(
      f"| empty XLA FFI custom call (the limit) | | | {limit:.2f} | | | | | |"
    )
  print(f"| the empty scan itself | {empty:.3f} | | | | | | | |")
  print()
  for kind, _, _, h, _, _ in rows:
    if kind.startswith(("io_callback", "pure_callback")):
      times = f"{h / call_us:.2f}×" if call_us > 0 else "∞ ×"
      print(f"hostcb's {kind}: {times} hostcb.call's per step")


def _print_floors(floors: dict, rows) -> None:
  """What one jax.Array costs, in this run, and how much cheaper than
  JAX's own a drop-in at the floor would be."""
  print(
    "\nthe floor: one jax.Array of an f32[] (bench_array_paths.py), "
    "thread CPU µs, median of interleaved rounds, in this run\n"
  )
  print("| one jax.Array | µs |\n|---|---:|")
  for name, us in floors.items():
    print(f"| {name} | {us:.2f} |")
  tap_us = next(h for kind, _, _, h, _, _ in rows if kind == TAP)
  jax_us = next(j for kind, j, *_ in rows if kind == "debug.callback")
  least = tap_us + floors[ANY_ARRAY]
  print(
    f"\nid_tap's step + the least any new jax.Array costs: {least:.2f} µs; "
    f"JAX's debug.callback / that: {_ratio(jax_us, least)} (the most a "
    "drop-in handing a new jax.Array per call could gain over JAX's)"
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20000)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--calls", type=int, default=2000)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument(
    "--quick",
    action="store_true",
    help="a short run (2,000 steps, 3 repeats, 300 calls, "
    "3 rounds): checks that everything works; "
    "the figures are rougher",
  )
  args = parser.parse_args()
  if args.quick:
    args.steps, args.repeats, args.calls, args.rounds = 2000, 3, 300, 3
  print(
    f"jax {jax.__version__}, hostcb {hostcb.__version__}, "
    f"{jax.devices()[0].platform}, "
    f"{platform.processor() or platform.machine()}, {os.cpu_count()} "
    f"cores; native engine: "
    f"{'yes' if engine.available() else engine.unavailable_reason()}"
  )

  sink = Sink()
  t0 = time.perf_counter()
  with contextlib.redirect_stdout(sink):
    srows = scalar_per_step(args.steps, args.repeats, sink)
    empty, limit, rows = per_step(args.steps, args.repeats, sink)
    none, drows = dispatch(args.calls, args.rounds, sink)
  floors = array_floors(max(args.rounds, 5))
  elapsed = time.perf_counter() - t0

  _print_scalar_table(args, srows, floors)
  _print_step_table(args, rows, empty, limit, floors)
  _print_floors(floors, rows)

  print(
    f"\none dispatch of a small jitted function (f32[] + 1) with one "
    f"callback, median of {args.rounds} interleaved rounds of "
    f"{args.calls} dispatches\n"
  )
  print(
    "| per dispatch | JAX's, µs | vs none | hostcb's, µs | vs none "
    "| all delivered |"
  )
  print("|---|---:|---:|---:|---:|:---:|")
  print(f"| no callback | {none:.1f} | 1.00× | {none:.1f} | 1.00× | |")
  for kind, j, h, ok in drows:
    print(
      f"| {kind} | {j:.1f} | {j / none:.2f}× | {h:.1f} | "
      f"{h / none:.2f}× | {'yes' if ok else 'NO'} |"
    )
  print(f"\n({elapsed:.0f} s)")
  if not all(ok for *_, ok in rows + drows + srows):
    sys.exit("bench_jax_callbacks: a callback was not delivered")


if __name__ == "__main__":
  main()
