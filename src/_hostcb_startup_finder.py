"""hostcb's import hook for ``jax.experimental.host_callback``, as the
``hostcb-legacy-import.pth`` file installs it at interpreter start.

Python runs that ``.pth`` file at every start, in every program of the
environment, so this module imports only the standard library: neither
hostcb nor JAX.  (Importing JAX there would also read JAX's configuration
from the environment before the program could set it, e.g. a script's
``os.environ["JAX_PLATFORMS"] = "cpu"`` before its ``import jax``.)  The
finder acts on the one module name ``jax.experimental.host_callback``;
hostcb, and JAX, are imported when that module is.  The rest of the hook,
:func:`hostcb.install`, is in :mod:`hostcb._import_hook`, which this module
imports only then (and which does not import this one).

Set ``HOSTCB_NO_IMPORT_HOOK=1`` to keep the ``.pth`` file from installing it
(a value that is not a boolean is an error, see :mod:`_hostcb_env`).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

from _hostcb_env import env_flag

LEGACY_NAME = "jax.experimental.host_callback"


class LegacyFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Resolves ``jax.experimental.host_callback`` to hostcb's module."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname != LEGACY_NAME:
      return None
    return importlib.util.spec_from_loader(fullname, self)

  def create_module(self, spec):
    from hostcb import _import_hook as import_hook  # noqa: PLC0415  (only now: imports JAX)

    return import_hook.legacy_module()

  def exec_module(self, module):
    # Importing jax.experimental.host_callback binds it as an attribute of
    # jax.experimental, as for any submodule.
    pass


FINDER = LegacyFinder()


def install_finder() -> None:
  """Puts the finder first on ``sys.meta_path`` (once)."""
  if FINDER not in sys.meta_path:
    sys.meta_path.insert(0, FINDER)


def install_from_pth() -> None:
  """What the ``.pth`` file runs: the finder, unless HOSTCB_NO_IMPORT_HOOK."""
  if env_flag("HOSTCB_NO_IMPORT_HOOK"):
    return
  install_finder()
