"""Runs the scenarios of one suite in this interpreter; one JSON line each.

Usage (see ``harness.py``, which starts it)::

  python runner.py IMPL OUT [--cases CASES.json] [--start-after NAME]

``IMPL`` says which implementation the scenarios get:

* ``legacy``: the real ``jax.experimental.host_callback`` (JAX 0.4.30);
* ``hostcb``: hostcb, through :func:`hostcb.install` (JAX 0.10.2);
* ``jax-buffer`` / ``hostcb-buffer``: the ``buffer_callback`` suite with
  ``jax.experimental.buffer_callback`` or ``hostcb.buffer_callback``.

For each scenario it writes ``{"start": name}`` before running it and
``{"name": name, "output": text}`` after, flushed, so that the harness knows
which scenario crashed the interpreter if one does, and restarts after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))

HCB_MODULES = [
  "s_docstring",
  "s_transforms",
  "s_control",
  "s_values",
  "s_print",
  "s_call",
  "s_errors",
  "s_parallel",
  "s_programs",
  "s_generated",
]
BUFFER_MODULES = ["b_buffer"]


class Context:
  """What a scenario gets: records its output in order, thread-safely.

  It is also the scenario's ``sys.stdout`` and the ``output_stream`` it
  passes to ``id_print``.
  """

  def __init__(self, barrier=None):
    self._barrier = barrier
    self._parts: list[str] = []
    self._lock = threading.Lock()

  def write(self, s: str) -> None:
    """Appends printed text (the ``output_stream`` protocol)."""
    with self._lock:
      self._parts.append(s)

  def flush(self) -> None:
    """Nothing to flush (``sys.stdout`` protocol)."""

  def log(self, *parts) -> None:
    """Appends one line made of ``parts`` (strings as they are)."""
    self.write(" ".join(str(p) for p in parts) + "\n")

  def show(self, label: str, value) -> None:
    """Waits for the taps so far (``barrier_wait``), then appends
    ``label: <value written by fmt>``: taps are asynchronous, so only the
    barrier puts their output before the value in a set order."""
    from normalize import fmt

    if self._barrier is not None:
      self._barrier()
    self.log(f"{label}:", fmt(value))

  def tap(self, arg, transforms, **kwargs) -> None:
    """A recording tap function: logs its argument, transforms, kwargs."""
    from normalize import fmt

    extra = "".join(f" {k}={v}" for k, v in sorted(kwargs.items()))
    self.log(f"tap: {fmt(arg)} transforms={transforms!r}{extra}")

  def tapper(self, what: str):
    """A recording tap function that also logs ``what``."""

    def tap(arg, transforms, **kwargs):
      from normalize import fmt

      extra = "".join(f" {k}={v}" for k, v in sorted(kwargs.items()))
      self.log(f"tap[{what}]: {fmt(arg)} transforms={transforms!r}{extra}")

    return tap

  def text(self) -> str:
    with self._lock:
      return "".join(self._parts)


def _setup(impl: str):
  """Imports the implementation; returns the barrier to call after each."""
  if impl == "hostcb":
    import hostcb

    hostcb.install()
  if impl in ("legacy", "hostcb"):
    from jax.experimental import host_callback as hcb

    return hcb.barrier_wait
  import jax

  if impl == "hostcb-buffer":
    import hostcb

    hostcb.install()
  # Looked up when called: hostcb wraps it when its first program is
  # traced, not at import.
  return lambda: jax.effects_barrier()


def main(argv: list[str]) -> int:
  import argparse

  p = argparse.ArgumentParser()
  p.add_argument(
    "impl", choices=["legacy", "hostcb", "jax-buffer", "hostcb-buffer"]
  )
  p.add_argument("out")
  p.add_argument("--cases", default=None)
  p.add_argument("--start-after", default=None)
  p.add_argument("--only", default=None, help="comma-separated names")
  args = p.parse_args(argv)
  warnings.simplefilter("ignore")
  os.environ["HOSTCB_DIFF_IMPL"] = args.impl
  if args.cases:
    os.environ["HOSTCB_DIFF_CASES"] = args.cases
  sys.path.insert(0, HERE)
  barrier = _setup(args.impl)
  import importlib

  import registry
  from normalize import exc_text, normalize

  modules = BUFFER_MODULES if args.impl.endswith("buffer") else HCB_MODULES
  if os.environ.get("HOSTCB_DIFF_MODULES"):  # for working on a few
    modules = os.environ["HOSTCB_DIFF_MODULES"].split(",")
  for m in modules:
    importlib.import_module(m)
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
      ctx = Context(barrier)
      t0 = time.perf_counter()
      with contextlib.redirect_stdout(ctx):
        try:
          result = sc.func(ctx)
          if result is not None:
            ctx.show("result", result)
        except Exception as e:  # noqa: BLE001  (the output records it)
          ctx.log("raised", exc_text(e))
          if os.environ.get("HOSTCB_DIFF_DEBUG"):
            traceback.print_exc(file=sys.stderr)
        try:
          barrier()
        except Exception as e:  # noqa: BLE001
          ctx.log("barrier raised", exc_text(e))
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
