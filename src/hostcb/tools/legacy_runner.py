"""``hostcb run [--jax-callbacks] SCRIPT.py [args]``: runs a script unchanged.

The script runs as ``__main__`` with ``sys.argv`` set to the script and its
arguments, after :func:`hostcb.install` made ``jax.experimental.host_callback``
and ``jax.xla_computation`` resolve to hostcb.  With ``--jax-callbacks``, it
runs with ``hostcb.install(jax_callbacks=True)`` in effect: JAX's own
``jax.debug.print``, ``jax.debug.callback``, ``jax.experimental.io_callback``
and ``jax.pure_callback`` are hostcb's (docs/jax_callbacks.md).  At the end,
a barrier waits for the script's taps and callbacks, so none is lost.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys


class ScriptNotFoundError(FileNotFoundError):
  """The script that ``hostcb run`` was given does not exist (a file missing
  inside the script raises the script's own FileNotFoundError)."""


def run_script(path: str, argv: list[str], jax_callbacks: bool = False) -> None:
  """Runs the script at ``path`` as ``__main__`` with hostcb installed
  (``install(jax_callbacks=jax_callbacks)``)."""
  if not os.path.isfile(path):
    raise ScriptNotFoundError(f"hostcb run: no such script: {path!r}")
  from hostcb._import_hook import install

  install(jax_callbacks=jax_callbacks)
  sys.argv = [path, *argv]
  sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
  runpy.run_path(path, run_name="__main__")


def _main(args: argparse.Namespace) -> int:
  status = 0
  try:
    run_script(args.script, args.args, jax_callbacks=args.jax_callbacks)
  except ScriptNotFoundError as e:
    print(e, file=sys.stderr)
    return 2
  except SystemExit as e:
    code = e.code
    status = code if isinstance(code, int) else (0 if code is None else 1)
  finally:
    status = _final_barrier(args, status)
  return status


def _final_barrier(args: argparse.Namespace, status: int) -> int:
  """The barrier after the script: every tap and callback has run.  A
  failure that it raises ends the script as an uncaught one would: on
  stderr, with status 1 (an ``id_tap``/``call`` failure only with
  ``--jax-callbacks``: JAX's own callback would have failed the program)."""
  from hostcb import _engine as engine
  from hostcb._engine import errors

  try:
    engine.barrier_wait("hostcb run")
  except engine.CallbackException as e:
    print(f"hostcb run: {e}", file=sys.stderr)
    if args.jax_callbacks and status == 0:
      status = 1
  except Exception as e:  # noqa: BLE001  (a jax.debug.callback's failure
    # that no read or barrier of the script raised: errors.py)
    print(f"hostcb run: {type(e).__name__}: {e}", file=sys.stderr)
    if status == 0:
      status = 1
  # One that failed while a CallbackException was raised above.
  late = errors.take_jax_callback_failure("at hostcb run's final barrier")
  if late is not None:
    print(f"hostcb run: {type(late).__name__}: {late}", file=sys.stderr)
    if status == 0:
      status = 1
  return status


def add_parser(subparsers) -> None:
  """Adds ``hostcb run`` to the command line."""
  p = subparsers.add_parser(
    "run",
    help="run a legacy JAX script unchanged (--jax-callbacks: "
    "with JAX's callbacks on hostcb)",
    description=__doc__.splitlines()[0],
  )
  p.add_argument(
    "--jax-callbacks",
    action="store_true",
    help="also route jax.debug.print, jax.debug.callback, "
    "jax.experimental.io_callback and jax.pure_callback through "
    "hostcb (hostcb.install(jax_callbacks=True))",
  )
  p.add_argument("script", help="the Python script to run")
  p.add_argument(
    "args", nargs=argparse.REMAINDER, help="arguments passed to the script"
  )
  p.set_defaults(func=_main)
