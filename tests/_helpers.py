"""Shared helpers of the hostcb tests: recording tap functions and streams."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(REPO, "src")


def hostcb_root() -> str:
  """The directory of the hostcb that the tests import (site-packages after
  `make install`, with the native engine built; src/ with PYTHONPATH=src)."""
  spec = importlib.util.find_spec("hostcb")
  if spec is None or spec.origin is None:
    return SRC
  return os.path.dirname(os.path.dirname(spec.origin))


class Recorder:
  """A tap function that remembers every call, thread-safely."""

  def __init__(self):
    self.calls = []
    self._lock = threading.Lock()

  def __call__(self, arg, transforms, **kwargs):
    with self._lock:
      self.calls.append((arg, transforms, kwargs))

  @property
  def args(self):
    return [c[0] for c in self.calls]

  @property
  def transforms(self):
    return [c[1] for c in self.calls]


class Stream:
  """An ``output_stream`` for ``id_print``: collects what is written."""

  def __init__(self):
    self.parts = []
    self._lock = threading.Lock()

  def write(self, s: str) -> None:
    with self._lock:
      self.parts.append(s)

  @property
  def output(self) -> str:
    return "".join(self.parts)

  def records(self) -> list[str]:
    """The printed taps, one string each (a header line starts a record)."""
    out: list[str] = []
    for line in self.output.splitlines(keepends=True):
      if line.startswith(("device:", "transforms:", "what:")) or not out:
        out.append(line)
      else:
        out[-1] += line
    return out


def run_python(
  code: str,
  *,
  env_extra: dict | None = None,
  use_src: bool = True,
  timeout: float = 240,
):
  """Runs ``code`` in a fresh interpreter, with the hostcb these tests
  import (``use_src``) or only the installed one; returns the
  CompletedProcess."""
  env = dict(os.environ)
  env.pop("PYTHONPATH", None)
  if use_src:
    env["PYTHONPATH"] = hostcb_root()
  env.setdefault("JAX_PLATFORMS", "cpu")
  env.update(env_extra or {})
  return subprocess.run(
    [sys.executable, "-c", code],
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
