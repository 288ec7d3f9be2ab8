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

    python benchmarks/bench_print_format.py [--number 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
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


if __name__ == "__main__":
  main()
