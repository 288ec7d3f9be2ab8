"""``hostcb hlo FILE.py:FUNCTION``: print or draw a function's HLO.

    hostcb hlo model.py:step --arg 'f32[4,3]' --arg 'i32[]'
    hostcb hlo model.py:step --arg 'f32[8]' --axis-env i=4 --format png

The function is loaded from the file, given example arguments described by
``--arg`` (dtype and shape, in argument order) and ``--static`` (Python
literals at fixed positions), and handed to :func:`hostcb.xla_computation`.
``--format svg`` and ``png`` draw the graph with Graphviz's ``dot``.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

_DTYPES = {
  "pred": "bool",
  "bool": "bool",
  "s8": "int8",
  "s16": "int16",
  "s32": "int32",
  "s64": "int64",
  "i8": "int8",
  "i16": "int16",
  "i32": "int32",
  "i64": "int64",
  "u8": "uint8",
  "u16": "uint16",
  "u32": "uint32",
  "u64": "uint64",
  "bf16": "bfloat16",
  "f16": "float16",
  "f32": "float32",
  "f64": "float64",
  "c64": "complex64",
  "c128": "complex128",
}
_ARG = re.compile(r"^\s*([a-z0-9]+)\s*\[\s*([0-9,\s]*)\]\s*$")
FORMATS = ("text", "dot", "svg", "png")
GRAPHVIZ_MISSING = (
  "rendering --format {fmt} needs Graphviz's `dot` program, which is not on "
  "PATH. Install Graphviz: `apt-get install graphviz` (Debian, Ubuntu), "
  "`brew install graphviz` (macOS), or see https://graphviz.org/download/; "
  "or use --format text or --format dot, which need nothing."
)


class UsageError(Exception):
  """A command-line value that cannot be used; the message says why."""


def parse_arg_spec(spec: str) -> Any:
  """``'f32[4,3]'`` -> ``jax.ShapeDtypeStruct((4, 3), float32)``."""
  import jax

  match = _ARG.match(spec)
  if not match or match.group(1) not in _DTYPES:
    raise UsageError(
      f"--arg expects DTYPE[DIMS] such as 'f32[4,3]' or 'i32[]', with DTYPE"
      f" one of {', '.join(sorted(_DTYPES))}; got {spec!r}"
    )
  dims_text = match.group(2).strip()
  parts = [d.strip() for d in dims_text.split(",")] if dims_text else []
  if "" in parts:
    raise UsageError(f"--arg: empty dimension in {spec!r}")
  dtype = jax.numpy.dtype(_DTYPES[match.group(1)])
  return jax.ShapeDtypeStruct(tuple(int(d) for d in parts), dtype)


def parse_static(spec: str) -> tuple[int, Any]:
  """``'1=3'`` -> ``(1, 3)``: a position and a Python literal value."""
  position, sep, value = spec.partition("=")
  if not sep or not position.strip().isdigit():
    raise UsageError(
      f"--static expects POSITION=VALUE such as '1=3' or "
      f"\"2='relu'\"; got {spec!r}"
    )
  try:
    literal = ast.literal_eval(value.strip())
  except (ValueError, SyntaxError):
    raise UsageError(
      f"--static {spec!r}: {value!r} is not a Python literal "
      "(numbers, strings in quotes, tuples, lists, dicts, "
      "True/False/None)"
    ) from None
  return int(position), literal


def parse_axis_env(spec: str) -> tuple[str, int]:
  """``'i=4'`` -> ``('i', 4)``."""
  name, sep, size = spec.partition("=")
  if not sep or not name.strip() or not size.strip().isdigit() or int(size) < 1:
    raise UsageError(
      f"--axis-env expects NAME=SIZE with a positive SIZE, "
      f"such as 'i=4'; got {spec!r}"
    )
  return name.strip(), int(size)


def load_function(target: str) -> tuple[Callable, str]:
  """Loads ``FILE.py:FUNCTION`` (FUNCTION may be dotted); returns it, name."""
  path_text, sep, qualname = target.rpartition(":")
  if not sep or not path_text or not qualname:
    raise UsageError(f"expected FILE.py:FUNCTION; got {target!r}")
  path = Path(path_text)
  if not path.is_file():
    raise UsageError(f"no such file: {path_text}")
  spec = importlib.util.spec_from_file_location(
    f"_hostcb_hlo_{path.stem}", path
  )
  if spec is None or spec.loader is None:
    raise UsageError(f"cannot load {path_text} as Python")
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, str(path.resolve().parent))
  try:
    spec.loader.exec_module(module)
  finally:
    sys.path.pop(0)
  obj: Any = module
  for part in qualname.split("."):
    if not hasattr(obj, part):
      raise UsageError(f"{path_text} has no {qualname!r}")
    obj = getattr(obj, part)
  if not callable(obj):
    raise UsageError(
      f"{path_text}:{qualname} is not callable; got {type(obj).__name__}"
    )
  return obj, qualname


def example_arguments(
  arrays: list[Any], statics: list[tuple[int, Any]]
) -> tuple[list, tuple]:
  """Interleaves static values (at their positions) with the arrays."""
  total = len(arrays) + len(statics)
  by_position = dict(statics)
  if len(by_position) != len(statics):
    raise UsageError("--static gives the same position twice")
  outside = sorted(p for p in by_position if p >= total)
  if outside:
    raise UsageError(
      f"--static position {outside[0]} is past the last argument: there "
      f"are {total} arguments ({len(arrays)} --arg, {len(statics)} "
      "--static), numbered from 0"
    )
  remaining = iter(arrays)
  args = [
    by_position[i] if i in by_position else next(remaining)
    for i in range(total)
  ]
  return args, tuple(sorted(by_position))


def render_with_dot(dot_text: str, fmt: str) -> bytes:
  """Runs Graphviz's ``dot -T<fmt>`` on DOT text; returns the picture."""
  dot = shutil.which("dot")
  if dot is None:
    raise RuntimeError(GRAPHVIZ_MISSING.format(fmt=fmt))
  done = subprocess.run(
    [dot, f"-T{fmt}"], input=dot_text.encode(), capture_output=True, check=False
  )
  if done.returncode != 0:
    raise RuntimeError(
      f"Graphviz's dot failed (exit status "
      f"{done.returncode}): {done.stderr.decode().strip()}"
    )
  return done.stdout


def run(args: argparse.Namespace) -> int:
  """Carries out ``hostcb hlo``; returns the exit status."""
  try:
    arrays = [parse_arg_spec(s) for s in args.arg]
    statics = [parse_static(s) for s in args.static]
    axis_env = [parse_axis_env(s) for s in args.axis_env]
    fun, name = load_function(args.target)
    values, static_argnums = example_arguments(arrays, statics)
  except UsageError as e:
    print(f"hostcb hlo: error: {e}", file=sys.stderr)
    return 2
  from hostcb.xla_computation import xla_computation

  computation = xla_computation(
    fun, static_argnums=static_argnums, axis_env=axis_env or None
  )(*values)
  if args.format == "text":
    data = computation.as_hlo_text().encode()
  elif args.format == "dot":
    data = computation.as_hlo_dot_graph().encode()
  else:
    try:
      data = render_with_dot(computation.as_hlo_dot_graph(), args.format)
    except RuntimeError as e:
      print(f"hostcb hlo: error: {e}", file=sys.stderr)
      return 1
  output = args.output
  if output is None and args.format == "png":
    output = f"{name.rpartition('.')[2]}.png"  # binary: not for a terminal
  if output is None:
    sys.stdout.write(data.decode())
    sys.stdout.flush()
  else:
    Path(output).write_bytes(data)
    print(f"wrote {output}", file=sys.stderr)
  return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
  """Adds the ``hlo`` subcommand to the ``hostcb`` command's subparsers."""
  parser = subparsers.add_parser(
    "hlo",
    help="print or draw the XLA HLO of a function",
    description="Print the unoptimized XLA HLO of FUNCTION from FILE.py "
    "(hostcb.xla_computation), or draw it with Graphviz.",
    epilog="example: hostcb hlo model.py:step --arg 'f32[4,3]' "
    "--arg 'i32[]' --static 2=True --axis-env i=4 --format png -o step.png",
  )
  parser.add_argument(
    "target",
    metavar="FILE.py:FUNCTION",
    help="the Python file and the function in it",
  )
  parser.add_argument(
    "--arg",
    action="append",
    default=[],
    metavar="DTYPE[DIMS]",
    help="next array argument, e.g. 'f32[4,3]', 'i32[]'",
  )
  parser.add_argument(
    "--static",
    action="append",
    default=[],
    metavar="N=VALUE",
    help="argument N (from 0) is the Python literal VALUE, "
    "folded in as a constant",
  )
  parser.add_argument(
    "--axis-env",
    action="append",
    default=[],
    metavar="NAME=SIZE",
    help="bind axis NAME of SIZE for collectives (psum...)",
  )
  parser.add_argument(
    "--format",
    choices=FORMATS,
    default="text",
    help="text (HLO), dot (Graphviz source), svg or png "
    "(need Graphviz's dot); default: text",
  )
  parser.add_argument(
    "-o",
    "--output",
    metavar="OUT",
    help="write to OUT instead of standard output (png "
    "defaults to FUNCTION.png)",
  )
  parser.set_defaults(func=run)
  return parser
