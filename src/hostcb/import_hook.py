"""Makes ``jax.experimental.host_callback`` import hostcb.

JAX removed that module; legacy code that imports it gets hostcb's
:mod:`hostcb.host_callback` instead.  The finder below acts on that one
module name and nothing else.  It is installed

* at interpreter start, by the ``hostcb-legacy-import.pth`` file that
  ``pip install hostcb`` puts in site-packages (this file must stay cheap to
  import: it does not import JAX);
* or explicitly, by :func:`install`, which also puts ``xla_computation``
  back on the ``jax`` module.

Set ``HOSTCB_NO_IMPORT_HOOK=1`` to keep the ``.pth`` file from installing it.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

LEGACY_NAME = "jax.experimental.host_callback"


class _LegacyFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Resolves ``jax.experimental.host_callback`` to hostcb's module."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname != LEGACY_NAME:
      return None
    return importlib.util.spec_from_loader(fullname, self)

  def create_module(self, spec):
    import hostcb.host_callback as module
    _restore_jax_names()
    return module

  def exec_module(self, module):
    # Importing jax.experimental.host_callback binds it as an attribute of
    # jax.experimental, as for any submodule.
    pass


_finder = _LegacyFinder()


def _restore_jax_names() -> None:
  import jax
  from hostcb.xla_computation import xla_computation
  jax.xla_computation = xla_computation


def install_finder() -> None:
  """Puts the finder first on ``sys.meta_path`` (once)."""
  if _finder not in sys.meta_path:
    sys.meta_path.insert(0, _finder)


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


def _install_from_pth() -> None:
  if os.environ.get("HOSTCB_NO_IMPORT_HOOK", "") not in ("", "0"):
    return
  install_finder()
