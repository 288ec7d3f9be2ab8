"""The kinds of host-function entries that the native engine runs.

The engine's tables (:mod:`hostcb._engine.host_functions`) hold, per
target id, one entry of a kind named here; the C++ handlers tell the kinds
apart by their type (``_native/entries.h`` names the same kinds, with the
same fields in the same order, and :func:`hand_to_engine` checks that they
agree) and read their fields by position, with no Python frame, attribute
lookup or tuple length between.  Each kind is a ``NamedTuple``: built once
per executable, read once per tap or call.

Tap entries (``host_functions.tap_functions``; ``module.cc``: ``RunTap``):

* :class:`ArrayTap` ``(func, second)``: ``func(arrays[0], second)``, for a
  tap function of one array that takes no device (no Python frame of
  hostcb's per tap);
* :class:`PrintLineTap` ``(write_lines, pieces, fallback, array_text)``:
  a ``debug.print`` or ``id_print`` line whose text the engine makes in C
  from ``pieces`` (``print_line.cc``) where the one operand is a 0-d number
  or, with ``array_text``, an array whose ``numpy.array2string`` text it
  makes (``array_text.cc``), written as
  ``write_lines([line, ...])`` (the lines of consecutive such taps of a
  batch with the same ``write_lines`` in one call); any other value goes
  to ``fallback``, an :class:`ArrayTap` that formats it in Python;
* :class:`ArraysTap` ``(run,)``: ``run(arrays, device)``, any other tap.

Call entries (``host_functions.call_runners``; ``call.cc``: ``RunCall``):

* :class:`CallRunner` ``(run, host_function)``: ``run(arrays,
  device_ordinal)`` returns the flat, checked results (or, for a call
  lowered to ``hostcb_call_one``, the host function's result as it is);
  ``host_function``: ``run`` is the runner of an ``io_callback`` /
  ``pure_callback``, whose computation waits for it
  (:func:`hostcb._engine.native.runs_host_function_call`);
* :class:`DirectCall` ``(func, on_failure, pending, run)``: for one array
  argument and one array result, the handler calls ``func(array)``
  itself while ``pending`` (the dict of Python-callback tap queues) is
  empty, calling ``on_failure(exc)`` (None: nothing) when it raised, and
  ``run(arrays, device_ordinal)`` otherwise (a runner that drains those
  taps first and does the same work).

What a call's lowering makes is a :class:`CallEntry` ``(runner, check)``:
the runner above and ``check(result)``, which turns a result that is not
an exact array of the call's one result into the flat, checked results,
or raises.

Standard library only.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

__all__ = [
  "ArrayTap",
  "PrintLineTap",
  "ArraysTap",
  "TapEntry",
  "CallRunner",
  "DirectCall",
  "CallEntry",
  "hand_to_engine",
]


class ArrayTap(NamedTuple):
  """A tap of one array: ``func(arrays[0], second)``."""

  func: Callable[[Any, Any], Any]
  second: Any


class PrintLineTap(NamedTuple):
  """A print's line made in C where its operand is a 0-d number (or, with
  ``array_text``, an array that C formats), written with
  ``write_lines([line, ...])``; else ``fallback``."""

  write_lines: Callable[[list], Any]
  pieces: tuple  # of bytes: the text around the value (print_line.cc)
  fallback: ArrayTap
  # None, or (check, threshold, numbers): the value as numpy.array2string
  # prints it (array_text.cc), while check() (called once per batch)
  # returns nonzero flags; above threshold elements NumPy summarizes;
  # numbers: a 0-d value as its Python number still.
  array_text: tuple | None = None


class ArraysTap(NamedTuple):
  """Any other tap: ``run(arrays, device)``."""

  run: Callable[[tuple, Any], Any]


TapEntry = ArrayTap | PrintLineTap | ArraysTap


class CallRunner(NamedTuple):
  """A call: ``run(arrays, device_ordinal)``."""

  run: Callable[[tuple, int], Any]
  host_function: bool = False


class DirectCall(NamedTuple):
  """A call of one array to one array that the handler makes itself
  (``func(array)``) while no Python-callback tap is ``pending``."""

  func: Callable[[Any], Any]
  on_failure: Callable[[BaseException], Any] | None
  pending: dict
  run: Callable[[tuple, int], Any]


class CallEntry(NamedTuple):
  """What the engine keeps of a call: its runner and its check."""

  runner: CallRunner | DirectCall
  check: Callable[[Any], tuple]


_KINDS = (ArrayTap, PrintLineTap, ArraysTap, CallRunner, DirectCall)


def hand_to_engine(native: Any) -> None:
  """Gives the extension ``native`` the kinds, which it checks against
  its own (names and fields) and then tells apart by type."""
  native.set_entry_kinds({kind.__name__: kind for kind in _KINDS})
