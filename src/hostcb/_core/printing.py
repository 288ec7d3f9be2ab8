"""The tap function of :func:`hostcb.id_print`, and its text layout.

A printed tap is an optional header line, the keyword arguments of
``id_print`` as ``key: value`` sorted by key (with ``transforms`` and
``device`` among them when present), then the value::

    what: x,x^2
    ( 3. 9. )

The value is laid out as legacy ``host_callback`` laid it out with JAX's
pretty printer, at a line width of 80:

* arrays are ``numpy.array2string(a, threshold=threshold)`` (0-d arrays too,
  so a float32 scalar is ``3.``; arrays of bool, integers, float32 and
  float64 get that text from :mod:`hostcb._core.array_text`, faster, and
  where the value is one such array the engine's consumer makes the whole
  print's text itself: :func:`engine_lines_writer` writes it), any other
  leaf (``None``, a Python scalar) is ``str(leaf)``;
* tuples are ``( a b )``, lists ``[ a b ]``, dicts ``{ k=v ... }`` sorted
  by key; empty ones ``(  )``, ``[  ]``, ``{  }``;
* a container goes on one line when its one-line text fits in what is left
  of the current line; otherwise its elements go one per line, indented 2
  deeper than the container's own nesting level (not its column); here
  ``{"a": [1] * 40, "b": (1, 2)}``::

      { a=[ 1
          1
          ...
          1 ]
        b=( 1 2 ) }

* the text of a multi-line array is inserted as it is: its later lines start
  at column 0, and the whole text, newlines included, counts as if it were on
  the line (so ``( 1 [[0 1 2]\\n [3 4 5]] )`` stays on "one line").

A device prints as the running JAX names it (``str(device)``, e.g.
``cpu:0``, ``cuda:0``), as legacy printed what its own JAX called it (JAX
0.4.30 said ``TFRT_CPU_0``): users compare tap output with their JAX's
device names.  Where NumPy changed under it, the text is kept as legacy
printed it:

* NumPy 2's print options (``np.set_printoptions``, ``np.printoptions``) are
  per thread, and taps print on hostcb's consumer threads: ``id_print``
  takes the caller's options when it is called (when traced, under ``jit``)
  and prints with them (legacy's NumPy 1 read its global options when
  printing).
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import sys
import threading
from typing import Any, Callable, ContextManager, Union

import numpy as np

from hostcb._core import array_text
from hostcb._engine import errors

__all__ = [
  "format_value",
  "format_header",
  "print_tap",
  "caller_print_options",
  "numpy_print_options",
]

# The line width legacy's pretty printer formatted to.
WIDTH = 80

_print_lock = threading.Lock()


class _Box:
  """A container in the layout: its brackets, entries and one-line width."""

  __slots__ = ("open", "close", "entries", "width")

  def __init__(self, open_: str, close: str, entries: list[tuple[str, _Node]]):
    self.open, self.close, self.entries = open_, close, entries
    self.width = (
      len(open_)
      + len(close)
      + max(len(entries) - 1, 0)
      + sum(len(prefix) + _width(child) for prefix, child in entries)
    )


_Node = Union[str, _Box]


def _width(node: _Node) -> int:
  return len(node) if isinstance(node, str) else node.width


def _build(value: Any, threshold: int | None, fast: list) -> _Node:
  """The layout tree of ``value``: leaves formatted, widths summed.

  ``fast``: ``[None]`` until the first array asks whether
  :mod:`hostcb._core.array_text` may give its text, then ``[answer]``.
  """
  if isinstance(value, tuple):
    return _Box("( ", " )", [("", _build(v, threshold, fast)) for v in value])
  if isinstance(value, list):
    return _Box("[ ", " ]", [("", _build(v, threshold, fast)) for v in value])
  if isinstance(value, dict):
    return _Box(
      "{ ",
      " }",
      [
        (f"{k}=", _build(v, threshold, fast))
        for k, v in sorted(value.items(), key=lambda kv: kv[0])
      ],
    )
  if isinstance(value, np.ndarray):
    if type(value) is np.ndarray:
      if fast[0] is None:
        fast[0] = array_text.defaults_in_force()
      text = array_text.array_text(value, threshold) if fast[0] else None
      if text is not None:
        return text
    return np.array2string(value, threshold=threshold)
  return str(value)


def _flat(node: _Node) -> str:
  if isinstance(node, str):
    return node
  return (
    node.open
    + " ".join(prefix + _flat(child) for prefix, child in node.entries)
    + node.close
  )


def _emit(node: _Node, nest: int, column: int, out: list[str]) -> int:
  """Appends ``node``'s text to ``out``; returns the column after it.

  ``column`` counts the characters written since the last break, as legacy's
  printer counted them (a multi-line leaf counts whole).
  """
  if isinstance(node, str) or node.width <= WIDTH - column:
    text = _flat(node)
    out.append(text)
    return column + len(text)
  inner = nest + 2
  out.append(node.open)
  column += len(node.open)
  for i, (prefix, child) in enumerate(node.entries):
    if i:
      out.append("\n" + " " * inner)
      column = inner
    out.append(prefix)
    column = _emit(child, inner, column + len(prefix), out)
  out.append(node.close)
  return column + len(node.close)


def format_value(value: Any, threshold: int | None = None) -> str:
  """The text that ``id_print`` prints for ``value`` (without a newline)."""
  out: list[str] = []
  _emit(_build(value, threshold, [None]), 0, 0, out)
  return "".join(out)


def format_header(kwargs: dict[str, Any]) -> str:
  """The header line: ``key: value`` pairs sorted by key, space-separated
  (a device as ``str(device)``, the running JAX's name for it)."""
  return " ".join(
    f"{k}: {v}" for k, v in sorted(kwargs.items(), key=lambda kv: kv[0])
  )


def print_tap(
  arg: Any,
  transforms,
  *,
  device=None,
  output_stream=None,
  threshold: int | None = None,
  **kwargs,
) -> None:
  """Prints a tapped value; the tap function behind ``id_print``.

  Args:
    arg: the tapped value (a pytree of NumPy arrays).
    transforms: the transformations the tap went through, as tap functions
      receive them; printed as ``transforms: [...]`` when not empty, a
      transform without parameters by its name alone.
    device: the device the value comes from (``tap_with_device``), or a
      value the user passed as ``device=``; printed when not ``None``.
    output_stream: an object whose ``write`` gets each line (with its
      ``"\\n"``); default: ``print`` to ``sys.stdout``.
    threshold: ``numpy.array2string``'s ``threshold`` (``None``: NumPy's
      print options).
    **kwargs: the other keyword arguments of ``id_print``, for the header.
  """
  if transforms:
    kwargs["transforms"] = [
      (name, params) if params else name for name, params in transforms
    ]
  if device is not None:
    kwargs["device"] = device
  lines = [format_header(kwargs)] if kwargs else []
  lines.append(format_value(arg, threshold))
  write_lines(lines, output_stream)


def write_lines(
  lines: list[str], output_stream=None, stdout: Callable[[], Any] | None = None
) -> None:
  """Writes the lines of one print (without their newlines): one ``write``
  per line to ``output_stream``, else one ``write`` of them all to
  ``sys.stdout`` as it is now (as ``stdout()`` gives it, where given),
  under the lock of every tap's print."""
  with _print_lock:
    if output_stream is not None:
      for line in lines:
        output_stream.write(line + "\n")
    else:
      # One write of whole lines: a print of another thread (the caller's
      # ``print(result)``) never lands inside a line of a tap's.  No flush,
      # as legacy's ``print`` and JAX's ``debug.print``: the stream's own
      # buffering decides (a terminal is line-buffered; a file or a pipe
      # gets its lines in blocks, and at exit).
      stream = sys.stdout if stdout is None else stdout()
      stream.write("".join(line + "\n" for line in lines))


# The writes that take several prints at once as they take them one by one:
# the same text reaches the same buffer, then the same file.
_WRITES_OF_SEVERAL = frozenset({io.TextIOWrapper.write, io.StringIO.write})


def engine_lines_writer(
  output_stream, header: bool, stdout: Callable[[], Any]
) -> Callable[[list], None]:
  """The ``write_lines`` of the native engine's ``id_print`` lines
  (:class:`~hostcb._engine.entries.PrintLineTap`): it gets the texts of
  consecutive prints (each its lines, with their newlines) and writes them
  as :func:`write_lines` writes each: to ``output_stream`` one write per
  line (the header, then the value), else to ``sys.stdout`` as ``stdout()``
  gives it, one write per print, or one for all where its class's write
  takes them alike.  A print whose write raises is reported as a failed
  tap (the others are still written)."""

  def write(texts: list) -> None:
    with _print_lock:
      if output_stream is None:
        stream = stdout()
        if (
          len(texts) > 1
          and type(stream).write in _WRITES_OF_SEVERAL
          and "write" not in getattr(stream, "__dict__", ())  # not patched
        ):
          try:
            stream.write("".join(texts))
            return
          except UnicodeEncodeError:
            # Nothing was written (a TextIOWrapper encodes all first):
            # each print by itself, below.
            pass
      interrupt = None
      for text in texts:
        try:
          if output_stream is None:
            stdout().write(text)
          elif header:
            head, _, value = text.partition("\n")
            output_stream.write(head + "\n")
            output_stream.write(value)
          else:
            output_stream.write(text)
        except Exception as e:  # noqa: BLE001  (the tap's failure)
          errors.record_exception(e)
        except BaseException as e:  # noqa: BLE001  (an interrupt: raised below)
          interrupt = interrupt or e
      if interrupt is not None:
        raise interrupt

  return write


PrintOptions = Union[tuple, None]


def caller_print_options() -> PrintOptions:
  """The calling thread's NumPy print options, for a consumer thread.

  ``None`` where a consumer thread sees the same options anyway (NumPy's
  defaults, or NumPy 1's global options); else the options as sorted
  ``(name, value)`` pairs.
  """
  options = np.get_printoptions()
  if options == contextvars.Context().run(np.get_printoptions):
    return None
  return tuple(sorted(options.items()))


def numpy_print_options(options: PrintOptions) -> ContextManager:
  """A context that prints with ``options`` (from :func:`caller_print_options`)."""
  if options is None:
    return contextlib.nullcontext()
  return np.printoptions(**dict(options))
