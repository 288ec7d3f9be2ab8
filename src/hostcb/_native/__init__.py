"""hostcb's native tap engine (C++), built as ``hostcb._native._engine``.

See :mod:`hostcb.engine` for the Python side and ``handlers.cc``,
``queue.h`` and ``module.cc`` here for the design.

When the install could not build the extension, ``setup.py`` leaves a
one-line file here saying why; :func:`build_failure` reads it.  This module
imports only the standard library (no JAX, no NumPy).
"""
from __future__ import annotations

import os

__all__ = ["build_failure"]

# The name setup.py writes (FAILURE_FILE there).
_FAILURE_FILE = "_build_failure.txt"


def build_failure() -> str | None:
  """Why the install did not build the native engine, in one line (a
  compiler error or the headers it could not find), or None when the
  install recorded no failure."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      _FAILURE_FILE)
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      line = f.readline().strip()
  except OSError:  # no file: the install recorded no failure
    return None
  return line or None
