"""Deprecated: ``hostcb.distributed`` moved to ``hostcb._core.distributed``
(private).  Its public names are ``hostcb.set_barrier_timeout``,
``hostcb.get_barrier_timeout`` now.  Reading a name here still works, with a
``DeprecationWarning`` naming the path to use.
"""

# hostcb: a deprecated path, kept by moves.sh (issue 35)

from __future__ import annotations

from hostcb._core.deprecation import forwarding_getattr
from hostcb._core import distributed as _moved

__getattr__ = forwarding_getattr(
  "hostcb.distributed",
  _moved,
  {
    "set_timeout": "hostcb.set_barrier_timeout",
    "get_timeout": "hostcb.get_barrier_timeout",
  },
)
