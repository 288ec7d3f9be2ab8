"""What to do when a JAX lacks an internal symbol that hostcb patches.

Part of :mod:`hostcb.jax_internals`; checked against jax 0.8.0, 0.10.2,
0.11.2 and 0.12.0.1.  It also names the range of JAX versions that hostcb
is checked against (:data:`OLDEST`, :data:`DEVELOPMENT`, :data:`NEWEST`,
:data:`CHECKED_RANGE`): every message that names the range takes it from
here, and CI checks each end (``scripts/check_oldest_jax.sh``, ``make
test``, ``scripts/check_newest_jax.sh``).

hostcb wraps a few private functions of JAX (the runtime-token exchange
between dispatched computations, the cached lowering of executables).  A
future JAX may rename or remove them; hostcb must then stop at import with
a message that says which JAX and which symbol, instead of silently losing
the guarantee the patch gave (a ``barrier_wait`` that no longer covers
other threads' computations would look like it works).
"""
from __future__ import annotations

from typing import Any

# The JAX releases hostcb was checked against, oldest and newest: the range
# that every message about an unsupported JAX names.
OLDEST_CHECKED = "0.8.0"
NEWEST_CHECKED = "0.12.0.1"
CHECKED_RANGE = f"jax {OLDEST_CHECKED} to {NEWEST_CHECKED}"


#: The oldest JAX hostcb supports (pyproject.toml: ``jax>=0.8``), checked by
#: ``make check-oldest``.
OLDEST = "0.8.0"
#: The JAX of development and of ``make test``.
DEVELOPMENT = "0.10.2"
#: The newest JAX checked: what ``pip install jax`` resolved on Python 3.13
#: when ``make check-newest`` last passed (it installs the newest each run).
NEWEST = "0.12.0.1"
#: The range, as messages name it.
CHECKED_RANGE = f"jax {OLDEST} to {NEWEST}"


class MissingJaxInternal(ImportError):
  """The running JAX lacks a private symbol that hostcb patches."""


def require(owner: Any, name: str, what: str, verb: str = "patches") -> Any:
  """``getattr(owner, name)``, or :class:`MissingJaxInternal` naming the
  JAX version, the symbol and what hostcb needs it for (``verb``: what
  hostcb does with it, "patches" or "uses")."""
  value = getattr(owner, name, None) if owner is not None else None
  if value is None:
    import jax  # noqa: PLC0415  (public API)
    where = getattr(owner, "__module__", None) or getattr(owner, "__name__",
                                                           repr(owner))
    if isinstance(owner, type):
      where = f"{owner.__module__}.{owner.__qualname__}"
    raise MissingJaxInternal(
        f"hostcb: jax {jax.__version__} has no {where}.{name}, which hostcb "
        f"{verb} {what}. hostcb was checked against {CHECKED_RANGE}; "
        "install a jax in that range or a hostcb release that supports "
        f"jax {jax.__version__}.")
  return value
