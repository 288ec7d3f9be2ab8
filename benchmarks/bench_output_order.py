"""What a write costs the program once hostcb's prints are staged.

hostcb keeps JAX's order between a computation's prints and what the
program writes after it (``hostcb._engine.output_order``): once a print is
staged, ``print`` and log records of a thread that dispatched a
computation that prints wait for it first.  This times, per call, with
nothing pending, ``sys.stdout.write("x\\n")``, ``print("x")`` and
``logging.info("x")`` (a ``StreamHandler`` on ``sys.stdout``), and
Python's own ``print`` taken before any print (the reference, in the same
rounds: ``print`` is hostcb's function once a print is staged), before any
print is staged and after one was (and its line written), with
``sys.stdout`` the interpreter's own, redirected to ``/dev/null`` and to a
file (each target in its own process: the script runs itself with its
stdout redirected, and reports on stderr).  Each figure is the best of
``--rounds`` interleaved rounds of ``--calls`` calls (``timeit``).

    python benchmarks/bench_output_order.py [--calls 200000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_OPS = {
  "sys.stdout.write": "sys.stdout.write('x\\n')",
  "print": "print('x')",
  "Python's print, taken before": "python_print('x')",
  "logging.info": "log.info('x')",
}


def _child(calls: int, rounds: int) -> None:
  import builtins
  import logging
  import timeit

  import jax
  import jax.numpy as jnp

  import hostcb

  log = logging.getLogger("bench_output_order")
  log.propagate = False
  log.addHandler(logging.StreamHandler(sys.stdout))
  log.setLevel(logging.INFO)
  scope = {"sys": sys, "log": log, "python_print": builtins.print}

  def best(phase: str) -> dict:
    # Interleaved: one round of each op, then the next round.
    times = {op: [] for op in _OPS}
    for _ in range(rounds):
      for op, stmt in _OPS.items():
        t = timeit.timeit(stmt, globals=scope, number=calls)
        times[op].append(t / calls * 1e9)
    return {f"{op}, {phase}": min(t) for op, t in times.items()}

  rows = best("before a print")
  f = jax.jit(lambda x: (hostcb.debug.print("{}", x), x + 1)[1])
  print("staged:", f(jnp.float32(0)))  # waits for its line
  jax.effects_barrier()
  rows.update(best("after a print"))
  sys.stderr.write(json.dumps(rows) + "\n")


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--calls", type=int, default=200_000)
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    _child(args.calls, args.rounds)
    return
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  command = [
    sys.executable,
    __file__,
    "--child",
    f"--calls={args.calls}",
    f"--rounds={args.rounds}",
  ]
  with tempfile.TemporaryDirectory() as tmp:
    targets = {"/dev/null": os.devnull, "a file": os.path.join(tmp, "out")}
    results = {}
    for name, path in targets.items():
      with open(path, "w") as out:
        proc = subprocess.run(
          command, stdout=out, stderr=subprocess.PIPE, text=True, env=env
        )
      if proc.returncode:
        sys.exit(proc.stderr)
      results[name] = json.loads(proc.stderr.strip().splitlines()[-1])
  print(f"ns per call, best of {args.rounds} rounds of {args.calls}")
  print(f"{'':46}" + "".join(f"{t:>12}" for t in results))
  for row in results["/dev/null"]:
    print(f"{row:46}" + "".join(f"{r[row]:12.0f}" for r in results.values()))


if __name__ == "__main__":
  main()
