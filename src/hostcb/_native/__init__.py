"""hostcb's native tap engine (C++), built as ``hostcb._native._engine``.

See :mod:`hostcb._engine` for the Python side and ``handlers.cc``,
``queue.h`` and ``module.cc`` in the source tree's ``src/hostcb/_native``
for the design (an installed hostcb has the built extension only).

When the install could not build the extension, ``setup.py`` leaves a
one-line file here saying why; :func:`build_failure` reads it.  The facts
that C++ and Python share (``engine.h``) come to Python from the extension
through :func:`shared_constant`.  This module imports only the standard
library (no JAX, no NumPy) at import.
"""

from __future__ import annotations

import os
from typing import Any

from _hostcb_env import env_flag

__all__ = ["build_failure", "extension", "shared_constant"]

# The values of engine.h's shared constants, for a process without the
# extension (not built, not loadable, or HOSTCB_DISABLE_NATIVE), where no C++
# uses them; the extension's own attributes are read everywhere else.
_WITHOUT_EXTENSION = {
  "GPU_KEY_BASE": 1 << 30,  # kGpuKeyBase
  "DEFAULT_QUEUE_BYTES": 256_000_000,  # kDefaultQueueBytes
}


def extension() -> Any:
  """The extension module ``hostcb._native._engine``, or None where it is
  absent (not built, not loadable: :mod:`hostcb._engine` says why; or
  turned off by ``HOSTCB_DISABLE_NATIVE``)."""
  if env_flag("HOSTCB_DISABLE_NATIVE"):
    return None
  try:
    from hostcb._native import _engine  # noqa: PLC0415
  except ImportError:  # not built or not loadable: hostcb._engine says why
    return None
  return _engine


def shared_constant(name: str) -> int:
  """Constant ``name`` of ``engine.h``, as the extension exports it (a
  module attribute of ``hostcb._native._engine``); where the extension is
  absent, its value for Python alone."""
  engine = extension()
  if engine is None:
    return _WITHOUT_EXTENSION[name]
  value = getattr(engine, name, None)
  if value is None:
    raise ImportError(
      f"hostcb: the extension {engine.__file__} has no {name}: it was "
      "built from other sources than this hostcb; reinstall hostcb: "
      "pip install --force-reinstall --no-deps --no-cache-dir hostcb"
    )
  return value


# The name setup.py writes (FAILURE_FILE there).
_FAILURE_FILE = "_build_failure.txt"


def build_failure() -> str | None:
  """Why the install did not build the native engine, in one line (a
  compiler error or the headers it could not find), or None when the
  install recorded no failure."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), _FAILURE_FILE)
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      line = f.readline().strip()
  except OSError:  # no file: the install recorded no failure
    return None
  return line or None
