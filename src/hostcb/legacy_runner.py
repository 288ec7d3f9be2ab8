"""``hostcb run SCRIPT.py [args]``: runs a legacy JAX script unchanged.

The script runs as ``__main__`` with ``sys.argv`` set to the script and its
arguments, after :func:`hostcb.install` made ``jax.experimental.host_callback``
and ``jax.xla_computation`` resolve to hostcb.  At the end, a barrier waits
for the script's taps, so none is lost.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys


def run_script(path: str, argv: list[str]) -> None:
  """Runs the script at ``path`` as ``__main__`` with hostcb installed."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"hostcb run: no such script: {path!r}")
  from hostcb.import_hook import install
  install()
  sys.argv = [path, *argv]
  sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
  runpy.run_path(path, run_name="__main__")


def _main(args: argparse.Namespace) -> int:
  try:
    run_script(args.script, args.args)
  except FileNotFoundError as e:
    print(e, file=sys.stderr)
    return 2
  except SystemExit as e:
    code = e.code
    return code if isinstance(code, int) else (0 if code is None else 1)
  finally:
    from hostcb import runtime
    try:
      runtime.barrier_wait("hostcb run")
    except runtime.CallbackException as e:
      print(f"hostcb run: {e}", file=sys.stderr)
  return 0


def add_parser(subparsers) -> None:
  """Adds ``hostcb run`` to the command line."""
  p = subparsers.add_parser(
      "run", help="run a legacy JAX script unchanged",
      description=__doc__.splitlines()[0])
  p.add_argument("script", help="the Python script to run")
  p.add_argument("args", nargs=argparse.REMAINDER,
                 help="arguments passed to the script")
  p.set_defaults(func=_main)
