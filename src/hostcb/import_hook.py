"""Deprecated: ``hostcb.import_hook`` moved to ``hostcb._import_hook``
(private).  Its public names are ``hostcb.install_jax_callbacks``,
``hostcb.uninstall_jax_callbacks``, ``hostcb.jax_callbacks_installed``,
``hostcb.install``, ``hostcb.uninstall`` now.  Reading a name here still
works, with a ``DeprecationWarning`` naming the path to use.
"""

# hostcb: a deprecated path, kept by moves.sh (issue 35)

from __future__ import annotations

from hostcb._core.deprecation import forwarding_getattr
from hostcb import _import_hook as _moved

__getattr__ = forwarding_getattr(
  "hostcb.import_hook",
  _moved,
  {
    "install_jax_callbacks": "hostcb.install_jax_callbacks",
    "uninstall_jax_callbacks": "hostcb.uninstall_jax_callbacks",
    "jax_callbacks_installed": "hostcb.jax_callbacks_installed",
    "install": "hostcb.install",
    "uninstall": "hostcb.uninstall",
  },
)
