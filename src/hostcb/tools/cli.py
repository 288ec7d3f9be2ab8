"""The ``hostcb`` command: ``demo``, ``run SCRIPT.py``, ``hlo FILE.py:FN``,
``info``."""

from __future__ import annotations

import argparse
import sys


def _build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="hostcb",
    description="JAX host callbacks that work: tools for hostcb users.",
  )
  sub = parser.add_subparsers(dest="command", required=True)
  from hostcb.tools import demo, hlo_render, info, legacy_runner

  demo.add_parser(sub)
  legacy_runner.add_parser(sub)
  hlo_render.add_parser(sub)
  info.add_parser(sub)
  return parser


def main(argv: list[str] | None = None) -> int:
  """Runs the ``hostcb`` command line; returns the exit status."""
  args = _build_parser().parse_args(argv)
  return args.func(args) or 0


if __name__ == "__main__":
  sys.exit(main())
