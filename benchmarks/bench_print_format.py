"""The text of one ``id_print`` leaf: ``numpy.array2string`` against
hostcb's fast path for the common leaves (``hostcb._core.array_text``).

Each leaf (a float32, float64, int32 and bool scalar, an int32[8] row) is
formatted ``--number`` times by each, in interleaved rounds (the median
over ``--rounds``), under NumPy's default print options; the two texts are
checked equal first.  The last rows format a whole tap (``print_tap`` of a
float32 scalar to a sink): with the fast path, and without it (as before).

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
}


class _Sink:
  def write(self, text: str) -> None:
    del text  # the formatting is what is timed, not the output


def _per_call(fn, number: int) -> float:
  start = time.perf_counter()
  for _ in range(number):
    fn()
  return (time.perf_counter() - start) / number * 1e6


def _tap(fast: bool):
  value, sink = LEAVES["f32[]"], _Sink()
  original = array_text.defaults_in_force

  def tap():
    printing.print_tap(value, (), output_stream=sink)

  def run():
    if not fast:
      array_text.defaults_in_force = lambda: False
    try:
      tap()
    finally:
      array_text.defaults_in_force = original

  return run


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--number", type=int, default=20000)
  parser.add_argument("--rounds", type=int, default=7)
  args = parser.parse_args()
  assert array_text.defaults_in_force(), "NumPy's default print options"
  variants = {}
  for name, a in LEAVES.items():
    assert array_text.array_text(a, None) == np.array2string(a), name
    variants[name] = (
      lambda a=a: np.array2string(a, threshold=None),
      lambda a=a: array_text.array_text(a, None),
    )
  variants["print_tap(f32[])"] = (_tap(False), _tap(True))
  times = {k: ([], []) for k in variants}
  for _ in range(args.rounds):
    for name, (slow, fast) in variants.items():
      times[name][0].append(_per_call(slow, args.number))
      times[name][1].append(_per_call(fast, args.number))
  print(f"NumPy {np.__version__}, median of {args.rounds} rounds")
  print("| leaf | array2string, µs | fast path, µs | speed-up |")
  print("|---|---|---|---|")
  for name, (slow, fast) in times.items():
    s, f = statistics.median(slow), statistics.median(fast)
    print(f"| {name} | {s:.2f} | {f:.2f} | {s / f:.1f}× |")


if __name__ == "__main__":
  main()
