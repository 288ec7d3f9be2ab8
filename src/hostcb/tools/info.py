"""``hostcb info``: what a bug report about hostcb needs, one fact a line.

Versions (hostcb, JAX, jaxlib, NumPy, Python), the platform, JAX's backend
and devices, whether the native tap engine is in use (and if not, why), and
hostcb's dispatch mode and queue bound, and what hostcb changed in JAX and
Python in the process that makes the report (``report()`` called from a
program lists that program's changes; the command itself changed
nothing).  Each line is ``key: value``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

# The two dispatch modes, by the value of the option hostcb_strict_barrier.
_DISPATCH = {
  True: "strict barrier (runtime tokens; legacy's cross-thread barrier)",
  False: "fast dispatch (default)",
}


def _jaxlib_version() -> str:
  """jaxlib's version, as jaxlib itself states it."""
  try:
    from jaxlib import version

    return version.__version__
  except Exception as e:  # noqa: BLE001  (a broken jaxlib is worth a line)
    return f"unknown ({type(e).__name__}: {e})"


def _backend_lines() -> list[tuple[str, str]]:
  """JAX's default backend and its devices; the error if JAX has none."""
  import jax

  try:
    backend = jax.default_backend()
    devices = jax.devices()
  except Exception as e:  # noqa: BLE001  (e.g. JAX_PLATFORMS names a
    # platform this machine lacks: the rest of the report still helps)
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return [("backend", f"unavailable ({first})")]
  return [("backend", backend), ("devices", ", ".join(str(d) for d in devices))]


def _engine_lines() -> list[tuple[str, str]]:
  """Whether the native engine is in use; if not, why, and why the install
  did not build it when it recorded that."""
  from hostcb import _engine as engine
  from hostcb._native import build_failure

  if engine.available():
    return [("native engine", "yes")]
  lines = [
    ("native engine", "no"),
    ("native engine unavailable", str(engine.unavailable_reason())),
  ]
  failure = build_failure()
  if failure is not None:
    lines.append(("native engine build failure", failure))
  return lines


def _gpu_engine_lines() -> list[tuple[str, str]]:
  """Whether taps and calls on NVIDIA GPUs use the engine's GPU back end
  (an option, on by default, in the hostcb versions that have it) and how
  its streams publish taps."""
  from hostcb import config

  try:
    on = bool(config.read("hostcb_gpu_engine"))
  except KeyError:
    return []
  if not on:
    return [
      (
        "GPU engine",
        "off (HOSTCB_GPU_ENGINE=0; XLA's Python callbacks on GPUs)",
      )
    ]
  from hostcb._engine import gpu

  if not gpu.has_local_gpu():
    return [("GPU engine", "on (default); no NVIDIA GPU in this process")]
  if not gpu.available(
    int(config.read("jax_host_callback_max_queue_byte_size"))
  ):
    return [("GPU engine", f"on, but unavailable: {gpu.unavailable_reason()}")]
  why = gpu.publication()
  if why is None:
    return [("GPU engine", "on (default); taps published by ready words")]
  return [
    ("GPU engine", f"on (default); taps published by host functions: {why}")
  ]


def _strict_barrier() -> bool:
  """The value of hostcb_strict_barrier; before that option existed, the
  opposite of hostcb_fast_dispatch."""
  from hostcb import config

  try:
    return bool(config.read("hostcb_strict_barrier"))
  except KeyError:
    return not config.read("hostcb_fast_dispatch")


def _settings_lines() -> list[tuple[str, str]]:
  """The dispatch mode and the queue bound."""
  from hostcb import config

  queue = config.read("jax_host_callback_max_queue_byte_size")
  return [
    ("dispatch", _DISPATCH[_strict_barrier()]),
    ("queue bound", f"{queue} bytes per device"),
  ]


def _changes_lines() -> list[tuple[str, str]]:
  """What hostcb changed in JAX and Python in this process (each change is
  made when the first program that needs it is traced; none at import)."""
  from hostcb import _jax_internals as ji

  changes = ji.installed()
  if not changes:
    lines = [("changed by hostcb", "nothing in this process")]
  else:
    lines = [
      (
        "changed by hostcb",
        "; ".join(f"{p.target} ({p.name})" for p in changes),
      )
    ]
  tap_threads = ji.tap_threads  # a submodule, imported by the package
  if tap_threads.created():
    lines.append(
      (
        "kept by JAX",
        f"jax.config state {tap_threads.NAME}, defined at import (part of "
        "the jit key; JAX cannot remove a config state; False outside "
        "hostcb's tap threads)",
      )
    )
  return lines


def report() -> str:
  """The report, ``key: value`` lines ending with a newline."""
  import jax
  import numpy

  import hostcb

  lines = [
    ("hostcb", hostcb.__version__),
    ("hostcb location", os.path.dirname(os.path.abspath(hostcb.__file__))),
    ("jax", jax.__version__),
    ("jaxlib", _jaxlib_version()),
    ("numpy", numpy.__version__),
    (
      "python",
      f"{platform.python_version()} "
      f"({platform.python_implementation()}, {sys.executable})",
    ),
    ("platform", platform.platform()),
    *_backend_lines(),
    *_engine_lines(),
    *_gpu_engine_lines(),
    *_settings_lines(),
    *_changes_lines(),
  ]
  return "".join(f"{key}: {value}\n" for key, value in lines)


def _main(args: argparse.Namespace) -> int:
  del args
  sys.stdout.write(report())
  return 0


def add_parser(subparsers) -> None:
  """Adds ``hostcb info`` to the command line."""
  p = subparsers.add_parser(
    "info",
    help="versions and settings to paste into a bug report",
    description="Prints hostcb's, JAX's, jaxlib's, NumPy's and Python's "
    "versions, the platform, JAX's backend and devices, whether the native "
    "tap engine is in use (and if not, why), the dispatch mode and the "
    "queue bound: what a bug report needs.",
  )
  p.set_defaults(func=_main)


if __name__ == "__main__":
  sys.exit(_main(argparse.Namespace()))
