"""One dispatch of a tiny jitted function with one callback, every entry
point against the same function without it.

The function is ``x + 1`` on an f32[] (the baseline row, no callback);
the limit row adds one empty custom call with XLA's side-effect flag (a
tap compiled with the engine's empty handler ``hostcb_noop``, which
reads and queues nothing: what any callback that XLA may not drop pays
per dispatch, with the native engine only); each other row adds one
callback of hostcb's, in the default configuration
(fast dispatch, ``jax.Array`` arguments for the drop-ins): ``id_tap``,
``id_print``, ``call``, ``hostcb.debug.callback``, ``hostcb.debug.print``,
``hostcb.io_callback`` (unordered and ordered) and
``hostcb.pure_callback``; one row has two, a ``debug.callback`` and then
a ``pure_callback``, which runs after it (program order).  A round
dispatches ``--calls`` times in a Python loop that never reads a result,
then waits for the last result and for every callback
(``hostcb.barrier_wait()`` and ``jax.effects_barrier()``):
the time per dispatch end to end includes the host function's work,
amortized; the loop alone is what the dispatching thread pays (on a
machine with a free core, the consumer's work runs beside it).  The
variants run in interleaved rounds (one loop of each per round; the median
over rounds), so that a slow phase of a shared machine weighs on every
variant alike.  Prints go to a text stream over a buffered file, as
``sys.stdout`` is in a terminal or redirected to a file or a pipe (an
``io.TextIOWrapper``), whose file end counts lines; every callback is
counted and the script fails if one was missing.

The floor row bounds the drop-ins' rows: the baseline's dispatch, plus
one ``jax.Array`` made per dispatch from a host f32[] as the drop-ins make
their functions' arguments (``hostcb._jax_internals.cpu_array``, in the
dispatching loop).  The drop-ins dispatch on jit's C++ fast path with no
token, as ``id_tap`` and ``call`` do; what they add beside the NumPy
opt-out rows is that array, made and freed once per call.

``--jax`` adds JAX's own ``jax.debug.callback``/``jax.debug.print``/
``io_callback``/``pure_callback`` as reference rows (much slower: run it
with fewer calls).

    python benchmarks/bench_dispatch.py [--calls 3000] [--rounds 7]
        [--runs 1] [--jax]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import statistics
import sys
import time

import jax
import jax.experimental
import jax.numpy as jnp
import numpy as np

import hostcb
from hostcb import _engine as engine
from hostcb import _jax_internals as ji


class _CountingFile(io.RawIOBase):
  """The file end of :class:`Sink`: counts the lines written to it."""

  def __init__(self):
    self.lines = 0

  def writable(self) -> bool:
    return True

  def write(self, b) -> int:
    self.lines += bytes(b).count(b"\n")
    return len(b)


class Sink(io.TextIOWrapper):
  """Where prints go while the benchmark runs: a text stream over a
  buffered file, as ``sys.stdout`` is in a terminal or when redirected to
  a file or a pipe, whose file end counts lines."""

  def __init__(self):
    self._file = _CountingFile()
    super().__init__(io.BufferedWriter(self._file), encoding="utf-8")

  @property
  def lines(self) -> int:
    """The lines written so far."""
    self.flush()
    return self._file.lines


NUMPY = "NumPy opt-out: "
LIMIT = "empty custom call with XLA's side-effect flag (the limit)"
TAP_THEN_CALL = "hostcb.debug.callback, then hostcb.pure_callback"
FLOOR = "no callback, plus one jax.Array made per dispatch (the floor)"


@contextlib.contextmanager
def empty_handler():
  """Taps traced and compiled inside it call the engine's empty handler
  (``hostcb_noop``: it reads nothing and queues nothing), with the same
  custom call around it: a tap's floor.  (Benchmark-only: it swaps the
  target name that hostcb's lowering reads.)"""
  name = engine.ffi_target_name
  engine.ffi_target_name = engine.noop_target_name
  try:
    yield
  finally:
    engine.ffi_target_name = name


def variants(count: list[int], with_jax: bool) -> list[tuple[str, object]]:
  """(name, step) pairs: ``step(x)`` is ``x + 1`` with one callback."""
  f32 = jax.ShapeDtypeStruct((), jnp.float32)

  def tap(x, transforms):
    count[0] += 1

  def plain(*args):
    count[0] += 1

  def same(x):
    count[0] += 1
    return x

  rows = [
    ("no callback (baseline)", lambda v: v + 1),
    ("hostcb.id_tap", lambda v: hostcb.id_tap(tap, v) + 1),
    ("hostcb.id_print", lambda v: hostcb.id_print(v) + 1),
    ("hostcb.call", lambda v: hostcb.call(same, v, result_shape=f32) + 1),
    (
      "hostcb.debug.callback",
      lambda v: (hostcb.debug.callback(plain, v), v + 1)[1],
    ),
    ("hostcb.debug.print", lambda v: (hostcb.debug.print("{}", v), v + 1)[1]),
    ("hostcb.io_callback", lambda v: hostcb.io_callback(same, f32, v) + 1),
    (
      "hostcb.io_callback(ordered=True)",
      lambda v: hostcb.io_callback(same, f32, v, ordered=True) + 1,
    ),
    ("hostcb.pure_callback", lambda v: hostcb.pure_callback(same, f32, v) + 1),
    # Two callbacks, the call ordered after the tap (its token).
    (
      TAP_THEN_CALL,
      lambda v: (
        hostcb.debug.callback(plain, v),
        hostcb.pure_callback(same, f32, v) + 1,
      )[1],
    ),
    # The same with NumPy arguments (hostcb_callback_jax_arrays=False when
    # traced): the difference is the cost of making the jax.Array.
    (
      NUMPY + "hostcb.debug.callback",
      lambda v: (hostcb.debug.callback(plain, v), v + 1)[1],
    ),
    (
      NUMPY + "hostcb.io_callback",
      lambda v: hostcb.io_callback(same, f32, v) + 1,
    ),
  ]
  if engine.available():
    # Compiled with the engine's empty handler in place of the tap's (see
    # measure): what XLA's side-effecting custom call costs per dispatch.
    rows.insert(1, (LIMIT, lambda v: hostcb.id_tap(tap, v) + 1))
  if with_jax:
    io_cb = jax.experimental.io_callback
    rows += [
      (
        "jax.debug.callback",
        lambda v: (jax.debug.callback(plain, v), v + 1)[1],
      ),
      ("jax.debug.print", lambda v: (jax.debug.print("{}", v), v + 1)[1]),
      ("jax io_callback", lambda v: io_cb(same, f32, v) + 1),
      ("jax pure_callback", lambda v: jax.pure_callback(same, f32, v) + 1),
    ]
  return rows


def with_floor() -> bool:
  """Whether the floor row is measured: where the drop-ins hand their
  functions ``jax.Array`` s made as :func:`hostcb._jax_internals.cpu_array`
  makes them (the default)."""
  try:
    ji.prepare_cpu_arrays()
  except Exception:  # noqa: BLE001  (a JAX without it: the NumPy arrays)
    return False
  return bool(hostcb.config.read("hostcb_callback_jax_arrays"))


def measure(calls: int, rounds: int, with_jax: bool, sink: Sink):
  """Rows of (name, µs per dispatch, all delivered): medians over
  ``rounds`` interleaved rounds of ``calls`` dispatches each."""
  count = [0]
  named = variants(count, with_jax)
  fns = [jax.jit(step) for _, step in named]
  x = jnp.float32(1)
  if with_floor():
    # The baseline's function, and the drop-ins' argument made beside it.
    make, base, host = ji.cpu_array, fns[0], np.ones((), np.float32)
    named.append((FLOOR, None))
    fns.append(lambda v: (make(host), base(v))[1])
  delivered = [0] * len(fns)
  times: list[list[float]] = [[] for _ in fns]
  loops: list[list[float]] = [[] for _ in fns]

  def once(i: int) -> tuple[float, float]:
    f = fns[i]
    count[0] = 0
    lines = sink.lines
    t0 = time.perf_counter()
    for _ in range(calls):
      out = f(x)
    loop = time.perf_counter() - t0
    out.block_until_ready()
    hostcb.barrier_wait()
    jax.effects_barrier()
    elapsed = time.perf_counter() - t0
    delivered[i] += count[0] + sink.lines - lines
    return elapsed, loop

  option = "hostcb_callback_jax_arrays"
  default = hostcb.config.read(option)
  for i in range(len(fns)):  # compiles, and warms up past the first calls
    hostcb.config.update(option, not named[i][0].startswith(NUMPY))
    limit = named[i][0] == LIMIT
    try:
      with empty_handler() if limit else contextlib.nullcontext():
        once(i)
    finally:
      hostcb.config.update(option, default)
  for _ in range(rounds):
    for i in range(len(fns)):
      elapsed, loop = once(i)
      times[i].append(elapsed)
      loops[i].append(loop)
  rows = []
  for i, (name, _) in enumerate(named):
    idle = (named[0][0], LIMIT, FLOOR)
    expected = 0 if name in idle else calls * (rounds + 1)
    if name == TAP_THEN_CALL:
      expected *= 2
    ok = delivered[i] == expected
    rows.append(
      (
        name,
        statistics.median(times[i]) / calls * 1e6,
        statistics.median(loops[i]) / calls * 1e6,
        ok,
      )
    )
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--calls", type=int, default=3000)
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument(
    "--runs", type=int, default=1, help="runs of the whole table, one by one"
  )
  parser.add_argument(
    "--jax", action="store_true", help="JAX's own callbacks as reference rows"
  )
  args = parser.parse_args()
  print(
    f"jax {jax.__version__}, hostcb {hostcb.__version__}, "
    f"{jax.devices()[0].platform}, "
    f"{platform.processor() or platform.machine()}, {os.cpu_count()} "
    f"cores; native engine: "
    f"{'yes' if engine.available() else engine.unavailable_reason()}"
  )
  ok = True
  for run in range(args.runs):
    sink = Sink()
    with contextlib.redirect_stdout(sink):
      rows = measure(args.calls, args.rounds, args.jax, sink)
    base, base_loop = rows[0][1], rows[0][2]
    print(
      f"\nrun {run + 1}: one dispatch of jit(x + 1) on an f32[] with one "
      f"callback; median of {args.rounds} interleaved rounds of "
      f"{args.calls} dispatches; end to end (until every callback ran) "
      "and the dispatching loop alone\n"
    )
    print(
      "| per dispatch | end to end, µs | vs no callback "
      "| loop alone, µs | vs no callback | all delivered |"
    )
    print("|---|---:|---:|---:|---:|:---:|")
    for name, us, loop_us, delivered in rows:
      print(
        f"| {name} | {us:.2f} | {us / base:.2f}× | {loop_us:.2f} | "
        f"{loop_us / base_loop:.2f}× | {'yes' if delivered else 'NO'} |"
      )
      ok = ok and delivered
  if not ok:
    sys.exit("bench_dispatch: a callback was not delivered")


if __name__ == "__main__":
  main()
