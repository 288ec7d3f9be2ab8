"""Runs the scenarios with one implementation in this interpreter.

Usage (``harness.py`` starts it)::

  python runner.py IMPL OUT [--start-after NAME] [--only NAMES]

``IMPL`` is ``jax``, ``hostcb`` or ``installed`` (see
:class:`jax_diff.context.Api`).  For each scenario it writes
``{"start": name}`` before running it and ``{"name": ..., "output": ...}``
after, flushed, so that the harness knows which scenario killed the
interpreter if one does.  A scenario runs with ``sys.stdout`` recorded; what
it returns is shown after a barrier, what it raises is recorded, and a last
``jax.effects_barrier()`` after it is recorded when it raises.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: the jax_diff package


def main(argv: list[str]) -> int:
  import argparse

  p = argparse.ArgumentParser()
  p.add_argument("impl", choices=["jax", "hostcb", "installed"])
  p.add_argument("out")
  p.add_argument("--start-after", default=None)
  p.add_argument("--only", default=None, help="comma-separated names")
  args = p.parse_args(argv)
  warnings.simplefilter("ignore")

  from jax_diff import registry
  from jax_diff.context import Api, Context, LogRecorder
  from jax_diff.values import exc_text, normalize

  api = Api(args.impl)
  if (
    args.impl != "jax"
    and os.environ.get("HOSTCB_REQUIRE_NATIVE") == "1"
    and os.environ.get("HOSTCB_DISABLE_NATIVE") != "1"
  ):
    from hostcb import _engine as engine

    if not engine.available():  # the scenarios would test the back end
      raise SystemExit(
        "runner: HOSTCB_REQUIRE_NATIVE=1 and hostcb's native engine is not "
        f"available: {engine.unavailable_reason()}"
      )
  logs = LogRecorder.attach()
  modules = registry.MODULES
  if os.environ.get("HOSTCB_JAX_DIFF_MODULES"):  # for working on a few
    modules = os.environ["HOSTCB_JAX_DIFF_MODULES"].split(",")
  for m in modules:
    importlib.import_module(f"jax_diff.{m}")
  names = list(registry.SCENARIOS)
  if args.start_after is not None:
    names = names[names.index(args.start_after) + 1 :]
  if args.only:
    only = set(args.only.split(","))
    names = [n for n in names if n in only]
  with open(args.out, "a") as out:
    for name in names:
      sc = registry.SCENARIOS[name]
      out.write(json.dumps({"start": name}) + "\n")
      out.flush()
      ctx = Context(api)
      logs.ctx = ctx
      t0 = time.perf_counter()
      with contextlib.redirect_stdout(ctx):
        try:
          result = sc.func(ctx, api)
          if result is not None:
            ctx.show("result", result)
        except Exception as e:  # noqa: BLE001  (the output records it)
          ctx.log("raised", exc_text(e))
          if os.environ.get("HOSTCB_DIFF_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        ctx.barrier()
      logs.ctx = None
      out.write(
        json.dumps(
          {
            "name": name,
            "output": normalize(ctx.text()),
            "secs": round(time.perf_counter() - t0, 3),
          }
        )
        + "\n"
      )
      out.flush()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
