"""The one list of what hostcb has changed in this process, and its undo.

Part of :mod:`hostcb._jax_internals`; it imports nothing of JAX's and works
the same on every JAX (checked against jax 0.8.0, 0.10.2 and 0.12.0.1).

Importing hostcb changes none of JAX's objects and none of Python's hooks.
Each change that hostcb needs (a wrapped private function of JAX, a rule
in one of JAX's registries, ``jax.effects_barrier``, ``sys.excepthook``...)
is made when the first program that needs it is traced, through
:func:`install` (an attribute) or :func:`install_item` (an entry of a
mapping), which return what was there and record it.  :func:`installed`
lists the records (``hostcb info`` prints them); :func:`uninstall_all`
(``hostcb.uninstall()``) puts every original back, newest first.

Most of hostcb's changes go in together, on the first bind of one of its
primitives (:func:`when_first_needed`, :func:`ensure`); after
:func:`uninstall_all`, the next bind installs them again.  A change that
only some programs need (the read hook of prints, the progress bars'
``sys.excepthook``) is installed by its owner, under :data:`lock`, the
first time a program needs it (:func:`is_installed` says whether it is in
place now).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from typing import Any, Callable

__all__ = [
  "Patch",
  "install",
  "install_item",
  "record",
  "installed",
  "is_installed",
  "uninstall_all",
  "when_first_needed",
  "ensure",
  "tracing_only",
  "lock",
]

logger = logging.getLogger("hostcb")

#: Held while patches are installed or removed (re-entrant: an installer
#: may install several).
lock = threading.RLock()

_ABSENT = object()


@dataclasses.dataclass
class Patch:
  """One change: ``name`` (hostcb's), ``target`` (what was changed, in
  words: ``module.attribute``), the ``original`` object (None where there
  was none) and how to undo it."""

  name: str
  target: str
  original: Any
  undo: Callable[[], None] = dataclasses.field(repr=False)


_patches: list[Patch] = []
# The installers that run on the first bind of a hostcb primitive (in the
# order they were given), and whether they have run since the last undo.
_first_need: list[Callable[[], None]] = []
_ready = [False]


def _describe(owner: Any, attr: str) -> str:
  if isinstance(owner, type):
    return f"{owner.__module__}.{owner.__qualname__}.{attr}"
  return f"{getattr(owner, '__name__', type(owner).__name__)}.{attr}"


def install(
  name: str,
  owner: Any,
  attr: str,
  new: Any,
  before_undo: Callable[[], None] | None = None,
) -> Any:
  """Sets ``owner.attr = new`` and records it under ``name``; returns the
  object that was there (for a class, as ``getattr`` gives it).

  The undo puts back exactly what the owner held: a class attribute that
  was inherited is deleted again rather than copied onto the class; where
  something else replaced ``new`` since, it leaves that in place (with a
  warning) rather than drop another library's wrapper.  A
  second install of the same ``name`` that is still in place returns the
  original recorded the first time and changes nothing.  ``before_undo()``
  runs just before the original is put back (``new`` still in place).
  """
  with lock:
    for p in _patches:
      if p.name == name:
        return p.original
    own = vars(owner) if isinstance(owner, type) else None
    raw = (
      own.get(attr, _ABSENT)
      if own is not None
      else getattr(owner, attr, _ABSENT)
    )
    original = getattr(owner, attr, None)

    def undo() -> None:
      if before_undo is not None:
        before_undo()
      if _current(owner, attr) is not new:
        # Another library wrapped hostcb's object since: putting the
        # original back would drop its wrapper, which may call hostcb's
        # (still working, delegating to the original).
        logger.warning(
          "hostcb: %s was changed again since hostcb set it; left as it is",
          _describe(owner, attr),
        )
        return
      if raw is _ABSENT:
        try:
          delattr(owner, attr)
        except AttributeError:
          pass  # already gone: what the owner had before hostcb
      else:
        setattr(owner, attr, raw)

    setattr(owner, attr, new)
    _patches.append(Patch(name, _describe(owner, attr), original, undo))
    return original


def _current(owner: Any, attr: str) -> Any:
  if isinstance(owner, type):
    return vars(owner).get(attr, _ABSENT)
  return getattr(owner, attr, _ABSENT)


def install_item(
  name: str, mapping: dict, key: Any, new: Any, target: str
) -> Any:
  """Sets ``mapping[key] = new`` (a rule in one of JAX's registries) and
  records it under ``name`` (``target`` says which entry, in words);
  returns what was there (None where there was nothing)."""
  with lock:
    for p in _patches:
      if p.name == name:
        return p.original
    raw = mapping.get(key, _ABSENT)

    def undo() -> None:
      if raw is _ABSENT:
        mapping.pop(key, None)
      else:
        mapping[key] = raw

    mapping[key] = new
    original = None if raw is _ABSENT else raw
    _patches.append(Patch(name, target, original, undo))
    return original


def record(
  name: str, target: str, undo: Callable[[], None], original: Any = None
) -> None:
  """Records a change that the caller made itself (e.g. an ``atexit``
  handler), with the function that undoes it."""
  with lock:
    _patches.append(Patch(name, target, original, undo))


def installed() -> list[Patch]:
  """The changes in place now, oldest first."""
  with lock:
    return list(_patches)


def is_installed(name: str) -> bool:
  with lock:
    return any(p.name == name for p in _patches)


def when_first_needed(installer: Callable[[], None]) -> None:
  """Runs ``installer()`` on the next :func:`ensure` (the first bind of a
  hostcb primitive), and again after each :func:`uninstall_all`.  Called
  at import by hostcb's modules; changes nothing by itself."""
  with lock:
    _first_need.append(installer)
    if _ready[0]:
      installer()


_tracing_only = threading.local()


@contextlib.contextmanager
def tracing_only():
  """Binds in this thread, inside the block, install nothing: for a probe
  that only traces a function (``jax.make_jaxpr``) to see what JAX does
  with hostcb's primitives, and neither lowers nor runs it."""
  before = getattr(_tracing_only, "on", False)
  _tracing_only.on = True
  try:
    yield
  finally:
    _tracing_only.on = before


def ensure() -> None:
  """Installs what hostcb's programs need, once (cheap afterwards)."""
  if _ready[0] or getattr(_tracing_only, "on", False):
    return
  with lock:
    if _ready[0]:
      return
    for installer in list(_first_need):
      installer()
    _ready[0] = True


def uninstall_all() -> int:
  """Puts back every original, newest change first; returns how many
  changes were undone.  The next :func:`ensure` installs them again."""
  with lock:
    count = 0
    errors = []
    while _patches:
      p = _patches.pop()
      try:
        p.undo()
        count += 1
      except Exception as e:  # noqa: BLE001  (the others are still undone;
        errors.append((p, e))  # the first failure is raised below)
    _ready[0] = False
    if errors:
      p, e = errors[0]
      raise RuntimeError(
        f"hostcb: could not put back {p.target} ({p.name})"
      ) from e
    return count
