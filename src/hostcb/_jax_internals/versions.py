"""What to do when a JAX lacks an internal symbol that hostcb patches.

Part of :mod:`hostcb._jax_internals`; checked against jax 0.8.0, 0.10.2,
0.11.2 and 0.12.0.1.  It also names the range of JAX versions that hostcb
is checked against (:data:`OLDEST`, :data:`DEVELOPMENT`, :data:`NEWEST`,
:data:`CHECKED_RANGE`) and compares JAX versions (:func:`jax_at_least`,
for hostcb and its tests): every message that names the range takes it from
here, and CI checks each end (``scripts/check_oldest_jax.sh``, ``make
test``, ``scripts/check_newest_jax.sh``).

hostcb wraps a few private functions of JAX (the runtime-token exchange
between dispatched computations, the cached lowering of executables) and
reads a few private structures (the tuple that the cached lowering
returns, JAX's runtime tokens).  A future JAX may rename, remove or
reshape them; hostcb must then stop, when the first program that needs
them is traced, with a message that says which JAX and which symbol
(:class:`MissingJaxInternal`, :func:`require`; :class:`JaxInternalChanged`,
:func:`check_shape`), instead of silently losing the guarantee the patch
gave (a ``barrier_wait`` that no longer covers other threads' computations
would look like it works) or misreading a tuple by position.
"""

from __future__ import annotations

from typing import Any

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

    where = getattr(owner, "__module__", None) or getattr(
      owner, "__name__", repr(owner)
    )
    if isinstance(owner, type):
      where = f"{owner.__module__}.{owner.__qualname__}"
    raise MissingJaxInternal(
      f"hostcb: jax {jax.__version__} has no {where}.{name}, which hostcb "
      f"{verb} {what}. hostcb was checked against {CHECKED_RANGE}; "
      "install a jax in that range or a hostcb release that supports "
      f"jax {jax.__version__}."
    )
  return value


class JaxInternalChanged(MissingJaxInternal):
  """A private structure of the running JAX that hostcb reads (a tuple, an
  object's fields) no longer has the shape hostcb was written for."""


def _jax_version() -> str:
  import jax  # noqa: PLC0415  (public API, for its version)

  return jax.__version__


def jax_release() -> tuple[int, ...]:
  """The running JAX's release: the leading numeric parts of its version
  ("0.12.0.1" gives (0, 12, 0, 1); "0.11.0.dev20260101" gives (0, 11,
  0)).  Every comparison of JAX versions in hostcb and its tests goes
  through here (:func:`jax_at_least`)."""
  parts = []
  for part in _jax_version().split("."):
    if not part.isdigit():
      break
    parts.append(int(part))
  return tuple(parts)


def jax_at_least(*release: int) -> bool:
  """Whether the running JAX is ``release`` or newer: ``jax_at_least(0,
  10)`` is true on jax 0.10.0, 0.10.2 and 0.12.0.1, false on 0.8.0."""
  return jax_release() >= release


def changed(
  symbol: str, expected: str, found: str, what: str
) -> JaxInternalChanged:
  """The error for a private structure of JAX that lost its shape: names
  the JAX version, the symbol, what hostcb expected and found, and what
  hostcb needs it for."""
  version = _jax_version()
  return JaxInternalChanged(
    f"hostcb: in jax {version}, {symbol} is not what hostcb reads {what}: "
    f"expected {expected}, found {found}. hostcb was checked against "
    f"{CHECKED_RANGE}; install a jax in that range or a hostcb release "
    f"that supports jax {version}."
  )


def check_shape(
  value: Any,
  symbol: str,
  what: str,
  *,
  types: type | tuple[type, ...] | None = None,
  lengths: tuple[int, ...] | None = None,
  fields: tuple[str, ...] = (),
) -> Any:
  """``value`` if it has the shape hostcb reads (an instance of ``types``,
  of one of the ``lengths``, with the attributes ``fields``), else
  :class:`JaxInternalChanged` naming the JAX version and ``symbol``."""
  if types is not None and not isinstance(value, types):
    names = (types,) if isinstance(types, type) else types
    raise changed(
      symbol, " or ".join(t.__name__ for t in names), type(value).__name__, what
    )
  if lengths is not None:
    try:
      n = len(value)
    except TypeError:
      n = None
    if n not in lengths:
      raise changed(
        symbol,
        "length " + " or ".join(map(str, lengths)),
        f"{type(value).__name__} of length {n}",
        what,
      )
  for field in fields:
    if not hasattr(value, field):
      raise changed(
        symbol, f"a field {field!r}", f"{type(value).__name__} without it", what
      )
  return value
