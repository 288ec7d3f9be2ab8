"""The tap function of :func:`hostcb.id_print`, and its text layout.

A printed tap is one line of sorted ``key: value`` pairs (the keyword
arguments of ``id_print``, plus ``transforms`` and ``device`` when present),
then the value.  Containers break one element per line::

    what: x,x^2
    ( 3.0
      9.0 )

Tuples are ``( ... )``, lists ``[ ... ]``, dicts ``{ k=v ... }`` with sorted
keys, arrays go through ``numpy.array2string`` with the given ``threshold``.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["format_value", "print_tap"]

_print_lock = threading.Lock()


def format_value(value: Any, threshold: int | None = None,
                 indent: int = 0) -> str:
  """Formats ``value`` as ``id_print`` does, continuation lines indented."""
  if isinstance(value, tuple):
    return _format_seq("( ", " )", value, threshold, indent)
  if isinstance(value, list):
    return _format_seq("[ ", " ]", value, threshold, indent)
  if isinstance(value, dict):
    inner = indent + 2
    parts = [f"{k}=" + format_value(v, threshold, inner)
             for k, v in sorted(value.items())]
    return "{ " + ("\n" + " " * inner).join(parts) + " }"
  if isinstance(value, np.ndarray):
    return np.array2string(value, threshold=threshold)
  return str(value)


def _format_seq(open_: str, close: str, items, threshold, indent) -> str:
  inner = indent + 2
  parts = [format_value(v, threshold, inner) for v in items]
  return open_ + ("\n" + " " * inner).join(parts) + close


def print_tap(arg: Any, transforms, *, device=None, output_stream=None,
              threshold: int | None = None, **kwargs) -> None:
  """Prints a tapped value; the tap function behind ``id_print``."""
  if transforms:
    kwargs["transforms"] = [(name, params) if params else name
                            for name, params in transforms]
  if device is not None:
    kwargs["device"] = device
  header = " ".join(f"{k}: {v}" for k, v in sorted(kwargs.items()))
  lines = [header] if header else []
  lines.append(format_value(arg, threshold))
  with _print_lock:
    for line in lines:
      if output_stream is not None:
        output_stream.write(line + "\n")
      else:
        print(line, flush=True)
