"""The text of one ``id_print`` leaf: ``numpy.array2string`` against
hostcb's fast paths for the common leaves (``hostcb._core.array_text``):
its Python one and the native engine's (``array_text.cc``).

Each leaf (a float32, float64, int32 and bool scalar, an int32[8] row, an
f32[4] row, an f64[3, 3] block) is formatted ``--number`` times by each,
in interleaved rounds (the median over ``--rounds``), under NumPy's
default print options; the texts are checked equal first ("-" where a
path does not format the leaf).  The last row formats a whole tap
(``print_tap`` of a float32 scalar to a sink): without the fast paths (as
``numpy.array2string``), with the Python one, and with both.

With ``--steps N``, a second table: per step of a jitted N-step
``lax.scan`` (end to end, beyond the empty scan, into
``bench_dispatch.Sink`` as ``sys.stdout`` or ``output_stream``), in
interleaved rounds: ``id_tap``, and ``id_print`` and ``debug.print`` of an
f32[] and an f32[4] with the engine's text of arrays and without it (as
before it: compiled and run with ``array_text.cc`` hidden), and JAX's
``debug.print`` of the f32[4] (in one round of every ``--jax-every``).

    python benchmarks/bench_print_format.py [--number 20000] [--rounds 7]
        [--steps 20000] [--jax-every 3]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import time

import numpy as np

from hostcb._core import array_text, printing

LEAVES = {
  "f32[]": np.array(3.0, np.float32),
  "f64[]": np.array(0.1, np.float64),
  "i32[]": np.array(7, np.int32),
  "bool[]": np.array(True),
  "i32[8]": np.arange(8, dtype=np.int32),
  "f32[4]": np.arange(4, dtype=np.float32) / 3,
  "f64[3,3]": np.arange(9.0).reshape(3, 3) * 1.5,
}


class _Sink:
  def write(self, text: str) -> None:
    del text  # the formatting is what is timed, not the output


def _per_call(fn, number: int) -> float:
  start = time.perf_counter()
  for _ in range(number):
    fn()
  return (time.perf_counter() - start) / number * 1e6


def _tap(mode: str):
  """A print_tap of a float32 scalar with ``mode``: "numpy" (no fast
  path), "python" (the Python one) or "native" (both)."""
  value, sink = LEAVES["f32[]"], _Sink()

  def run():
    saved = array_text.defaults_in_force, array_text._native
    if mode == "numpy":
      array_text.defaults_in_force = lambda: False
    elif mode == "python":
      array_text._native = None
    try:
      printing.print_tap(value, (), output_stream=sink)
    finally:
      array_text.defaults_in_force, array_text._native = saved

  return run


def _python(a):
  return lambda: array_text.python_text(a, None)


def _native(a):
  native = array_text._native
  return lambda: native(a, array_text.NATIVE_FLAGS, 1000)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--number", type=int, default=20000)
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--steps", type=int, default=0)
  parser.add_argument("--jax-every", type=int, default=3)
  args = parser.parse_args()
  assert array_text.defaults_in_force(), "NumPy's default print options"
  variants = {}
  for name, a in LEAVES.items():
    expected = np.array2string(a)
    ways = [lambda a=a: np.array2string(a, threshold=None)]
    ways.append(_python(a) if array_text.python_text(a, None) else None)
    has_native = array_text._native is not None and _native(a)() is not None
    ways.append(_native(a) if has_native else None)
    for way in ways[1:]:
      assert way is None or way() == expected, name
    variants[name] = ways
  variants["print_tap(f32[])"] = [
    _tap(m) for m in ("numpy", "python", "native")
  ]
  times = {k: [[], [], []] for k in variants}
  for _ in range(args.rounds):
    for name, ways in variants.items():
      for i, way in enumerate(ways):
        if way is not None:
          times[name][i].append(_per_call(way, args.number))
  print(f"NumPy {np.__version__}, median of {args.rounds} rounds")
  print(
    "| leaf | array2string, µs | Python fast path, µs | native, µs "
    "| array2string / native |"
  )
  print("|---|---|---|---|---|")
  for name, columns in times.items():
    m = [statistics.median(c) if c else None for c in columns]
    cells = ["-" if v is None else f"{v:.2f}" for v in m]
    ratio = "-" if m[2] is None else f"{m[0] / m[2]:.1f}×"
    print(f"| {name} | {' | '.join(cells)} | {ratio} |")
  if args.steps:
    scan_steps(args.steps, args.rounds, args.jax_every)


@contextlib.contextmanager
def _without_native(off: bool):
  """The engine's text of arrays hidden (as before it), where ``off``."""
  saved = array_text._native, array_text._native_function
  if off:
    array_text._native, array_text._native_function = None, lambda: None
  try:
    yield
  finally:
    array_text._native, array_text._native_function = saved


def scan_steps(steps: int, rounds: int, jax_every: int) -> None:
  """The second table (``--steps``)."""
  import jax
  import jax.numpy as jnp

  import hostcb
  from bench_dispatch import Sink
  from bench_tap import scan_of

  sink, count = Sink(), [0]

  def tap(x, transforms):
    count[0] += 1

  scalar, row = jnp.float32(0), jnp.zeros(4, jnp.float32)
  dprint = lambda fn: lambda c: (fn("{}", c), c)[1]
  # (name, step, x, hidden, expected lines or taps per step)
  variants = [("empty scan", lambda c: c, scalar, False)]
  variants.append(
    ("id_tap f32[]", lambda c: hostcb.id_tap(tap, c), scalar, False)
  )
  for hidden in (True, False):
    tag = " (before: NumPy's text)" if hidden else ""
    for name, x in (("f32[]", scalar), ("f32[4]", row)):
      # A threshold that changes no text keeps the two id_prints apart
      # (equal printers share one compiled tap, and its entry).
      printer = functools.partial(
        hostcb.id_print, threshold=1 << 20 if hidden else None
      )
      variants.append((f"id_print {name}{tag}", printer, x, hidden))
      variants.append(
        (
          f"hostcb.debug.print {name}{tag}",
          dprint(hostcb.debug.print),
          x,
          hidden,
        )
      )
  variants.append(
    ("jax.debug.print f32[4]", dprint(jax.debug.print), row, False)
  )
  runs = []
  for _, step, _x, hidden in variants:
    with _without_native(hidden):
      run = scan_of(step, steps)
      runs.append(run)
  times = [[] for _ in variants]
  with contextlib.redirect_stdout(sink):
    for r in range(rounds + 1):
      for i, (name, _, x, hidden) in enumerate(variants):
        if name.startswith("jax") and r % jax_every and r:
          continue
        with _without_native(hidden):
          lines, taps = sink.lines, count[0]
          t0 = time.perf_counter()
          jax.block_until_ready(runs[i](x))
          jax.effects_barrier()
          elapsed = time.perf_counter() - t0
          got = sink.lines - lines + count[0] - taps
          assert i == 0 or got == steps, (name, got)
        if r:  # the first round compiles
          times[i].append(elapsed)
  medians = [statistics.median(t) for t in times]
  us = {
    name: max(m - medians[0], 0.0) / steps * 1e6
    for (name, *_), m in zip(variants, medians)
  }
  jax_us = us["jax.debug.print f32[4]"]
  print(
    f"\nper step of a jitted {steps}-step lax.scan, end to end, beyond the "
    f"empty scan ({medians[0] / steps * 1e6:.3f} µs); median of {rounds} "
    "interleaved rounds\n"
  )
  print(
    "| per scan step | µs | − id_tap's, µs | jax.debug.print f32[4] / this |"
  )
  print("|---|---:|---:|---:|")
  for name, u in us.items():
    if name != "empty scan":
      ratio = f"{jax_us / u:.0f}×" if u > 0 else "∞"
      print(f"| {name} | {u:.2f} | {u - us['id_tap f32[]']:+.2f} | {ratio} |")


if __name__ == "__main__":
  main()
