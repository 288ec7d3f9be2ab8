"""Makes ``jax.experimental.host_callback`` import hostcb.

JAX removed that module; legacy code that imports it gets hostcb's
:mod:`hostcb.host_callback` instead.  A finder that acts on that one module
name and nothing else is installed

* at interpreter start, by the ``hostcb-legacy-import.pth`` file that
  ``pip install hostcb`` puts in site-packages; the finder lives in the
  top-level module ``_hostcb_legacy_import``, which imports neither hostcb
  nor JAX, so that starting Python stays cheap and programs can still set
  JAX's environment variables before they import JAX;
* or explicitly, by :func:`install`, which also puts ``xla_computation``
  back on the ``jax`` module.

Set ``HOSTCB_NO_IMPORT_HOOK=1`` to keep the ``.pth`` file from installing it.
"""
from __future__ import annotations

import sys

from _hostcb_legacy_import import LEGACY_NAME, install_finder


def _restore_jax_names() -> None:
  import jax
  from hostcb.xla_computation import xla_computation
  jax.xla_computation = xla_computation


def legacy_module():
  """hostcb's module for ``jax.experimental.host_callback`` (the finder's
  answer), with ``jax.xla_computation`` restored beside it."""
  import hostcb.host_callback as module
  _restore_jax_names()
  return module


def install() -> None:
  """Makes legacy JAX code run on hostcb in this interpreter.

  After it, ``from jax.experimental import host_callback`` gives hostcb's
  module and ``jax.xla_computation`` is hostcb's :func:`xla_computation`.
  """
  install_finder()
  _restore_jax_names()
  sys.modules.setdefault(LEGACY_NAME, sys.modules["hostcb.host_callback"])
  import jax.experimental
  jax.experimental.host_callback = sys.modules[LEGACY_NAME]
