"""Deprecated: ``hostcb.lowering`` moved to ``hostcb._core.lowering``
(private).  Its public names are ``hostcb.BUFFER_CALL_MIN_BYTES`` now.
Reading a name here still works, with a ``DeprecationWarning`` naming the
path to use.
"""

# hostcb: a deprecated path, kept by moves.sh (issue 35)

from __future__ import annotations

from hostcb._core.deprecation import forwarding_getattr
from hostcb._core import lowering as _moved

__getattr__ = forwarding_getattr(
  "hostcb.lowering",
  _moved,
  {
    "BUFFER_CALL_MIN_BYTES": "hostcb.BUFFER_CALL_MIN_BYTES",
  },
)
