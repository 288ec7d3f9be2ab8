"""``hostcb.install()``: JAX programs run on hostcb without edits.

Two things can be switched on in this interpreter:

* legacy ``host_callback`` (always): JAX removed
  ``jax.experimental.host_callback``; :func:`install` puts hostcb's
  :mod:`hostcb.host_callback` in ``sys.modules`` under that name and on
  ``jax.experimental``, which serves both ``import
  jax.experimental.host_callback`` and ``from jax.experimental import
  host_callback``, and puts ``xla_computation`` back on the ``jax`` module;
* JAX's own callbacks (``install(jax_callbacks=True)``):
  ``jax.debug.print``, ``jax.debug.callback``,
  ``jax.experimental.io_callback``, ``jax.pure_callback`` and
  ``jax.debug.breakpoint`` become hostcb's (see :func:`install_jax_callbacks` for exactly which
  names).

:func:`uninstall` puts back every name that :func:`install` changed.

Without any call, a ``pip install``-ed hostcb also resolves the legacy
import at interpreter start: the ``hostcb-legacy-import.pth`` file installs
a finder for that one module name (top-level module
``_hostcb_startup_finder``, which imports neither hostcb nor JAX, so that
starting Python stays cheap and programs can still set JAX's environment
variables before they import JAX); the finder calls :func:`legacy_module`
when the module is imported.  Set ``HOSTCB_NO_IMPORT_HOOK=1`` to keep the
``.pth`` file from installing it.  This module does not import the finder's
module: the finder imports this one, lazily.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Callable

import jax
import jax.experimental

from hostcb import debug, host_callback, jax_callbacks
from hostcb._core import dropins as _dropins
from hostcb import _jax_internals as ji
from hostcb._engine import lifecycle
from hostcb.xla_computation import xla_computation

__all__ = [
  "install",
  "uninstall",
  "legacy_module",
  "LEGACY_NAME",
  "install_jax_callbacks",
  "uninstall_jax_callbacks",
  "jax_callbacks_installed",
]

LEGACY_NAME = "jax.experimental.host_callback"

_MISSING = object()
_lock = threading.Lock()
# (object, attribute or sys.modules key, previous value or _MISSING, value
# set) of every legacy name install() set, to put back in uninstall().
_legacy_set: list[tuple[object, str, object, object]] = []


def _restore_jax_names() -> None:
  jax.xla_computation = xla_computation


def legacy_module():
  """hostcb's module for ``jax.experimental.host_callback`` (the finder's
  answer), with ``jax.xla_computation`` restored beside it."""
  module = host_callback
  _restore_jax_names()
  return module


def _set(obj, name: str, value) -> None:
  """Sets an attribute (or a ``sys.modules`` entry) to ``value``, noting
  what was there the first time."""
  if obj is sys.modules:
    previous = sys.modules.get(name, _MISSING)
  else:
    previous = getattr(obj, name, _MISSING)
  if previous is value:
    return
  _legacy_set.append((obj, name, previous, value))
  if obj is sys.modules:
    sys.modules[name] = value
  else:
    setattr(obj, name, value)


def install(jax_callbacks: bool = False) -> None:
  """Makes JAX code run on hostcb in this interpreter.

  Always: ``from jax.experimental import host_callback`` (and ``import
  jax.experimental.host_callback``) gives hostcb's module, and
  ``jax.xla_computation`` is hostcb's :func:`xla_computation`.

  With ``jax_callbacks=True``, also ``jax.debug.print``,
  ``jax.debug.callback``, ``jax.debug.breakpoint``,
  ``jax.experimental.io_callback`` and ``jax.pure_callback`` are hostcb's
  (:func:`hostcb.debug.jax_print`, :func:`hostcb.debug.jax_callback`,
  :func:`hostcb.debug.breakpoint`, :func:`hostcb.io_callback`,
  :func:`hostcb.pure_callback`), in every loaded
  module that holds JAX's functions, JAX's own included; install before
  tracing, since functions already traced keep what they were traced
  with.  See :func:`install_jax_callbacks`.

  Calling it again does no harm (and routes the JAX callbacks held by
  modules imported since).  :func:`uninstall` undoes it.
  """
  with _lock:
    _set(jax, "xla_computation", xla_computation)
    if sys.modules.get(LEGACY_NAME) is None:
      _set(sys.modules, LEGACY_NAME, host_callback)
    _set(jax.experimental, "host_callback", sys.modules[LEGACY_NAME])
  if jax_callbacks:
    install_jax_callbacks()


def uninstall() -> None:
  """Gives JAX and Python back every object hostcb changed in this process.

  Undoes :func:`install`: JAX's callback functions are bound back
  wherever ``install(jax_callbacks=True)`` rebound them, and the legacy
  names it set (``sys.modules["jax.experimental.host_callback"]``,
  ``jax.experimental.host_callback``, ``jax.xla_computation``) are put back
  as they were, unless something else changed them since.

  Also puts back what hostcb changed when its first program was traced
  (:mod:`hostcb._jax_internals.patches`, which ``hostcb info`` lists):
  ``jax.effects_barrier``, JAX's cached lowering and compiled-call
  functions, its runtime-token functions, the ``while_p`` lowering rule,
  the read hooks of ``jax.Array``, the types that JAX's caches hold weakly
  (hostcb's primitives' targets), hostcb's exit handlers and
  ``sys.excepthook`` (``hostcb.progress``).  Programs compiled before keep
  running their taps (they need none of these to run), without the
  guarantees these gave: ``jax.effects_barrier()`` no longer waits for
  their taps (``hostcb.barrier_wait()`` still does), and a host read no
  longer waits for their prints; their first tap after it installs the
  exit handler again.  The taps of the computations dispatched before
  ``uninstall()`` have all run when it returns (as at exit: bounded by
  60 s, logged past it), so a program may end right after it.  The next
  program that binds one of hostcb's primitives installs them again.
  ``print``, log records and ``redirect_stdout`` no longer wait for
  hostcb's prints (:mod:`hostcb._engine.output_order`) until a print is
  staged again.

  Where JAX's callbacks were hostcb's, JAX's caches of traced functions
  are cleared (:func:`uninstall_jax_callbacks`): a jitted function traced
  with hostcb's drop-ins is traced again at its next call, with JAX's
  callbacks.  A ``.pth``-installed hook still resolves a later ``import
  jax.experimental.host_callback``.
  """
  lifecycle.wait_before_uninstall()
  uninstall_jax_callbacks()
  ji.uninstall_all()  # output_order's hook among them
  # A program compiled before keeps tapping: its next tap installs the
  # exit handler again.
  lifecycle.rearm_after_uninstall()
  with _lock:
    while _legacy_set:
      obj, name, previous, value = _legacy_set.pop()
      if obj is sys.modules:
        if sys.modules.get(name) is not value:
          continue  # changed since: left alone
        if previous is _MISSING:
          sys.modules.pop(name, None)
        else:
          sys.modules[name] = previous
      elif getattr(obj, name, _MISSING) is not value:
        continue  # changed since: left alone
      elif previous is _MISSING:
        delattr(obj, name)
      else:
        setattr(obj, name, previous)


# ----------------------------------------------- install / uninstall
# (module, attribute, JAX's function) of every name install() rebound.
_replaced: list[tuple[types.ModuleType, str, object]] = []


def _replacements() -> dict[int, tuple[Callable, Callable]]:
  """id(JAX's function) -> (JAX's function, hostcb's)."""
  ours = {
    "debug_callback": debug.jax_callback,
    "debug_print": debug.jax_print,
    "io_callback": jax_callbacks.io_callback,
    "pure_callback": jax_callbacks.pure_callback,
    "debug_breakpoint": debug.breakpoint,
  }
  return {
    id(_dropins.jax_function(k)): (
      _dropins.jax_function(k),
      f,
    )
    for k, f in ours.items()
  }


def install_jax_callbacks() -> int:
  """Rebinds JAX's ``debug.callback``, ``debug.print``, ``debug.breakpoint``,
  ``io_callback`` and ``pure_callback`` to hostcb's, wherever a loaded
  module holds them.

  Every attribute of every module in ``sys.modules`` (hostcb's own
  excepted) that is one of JAX's five functions becomes hostcb's
  counterpart: ``jax.debug.callback``, ``jax.debug.print``,
  ``jax.debug.breakpoint``, ``jax.experimental.io_callback``,
  ``jax.pure_callback``, their definitions in ``jax._src.debugging``,
  ``jax._src.debugger`` and ``jax._src.callback`` (which
  JAX's own modules call through), and the names that other modules bound
  with ``from ... import``.  Modules imported later get hostcb's through
  those.  Functions already traced keep what they were traced with until
  they are traced again (JAX's callbacks, which ``jax.effects_barrier()``
  still waits for).  Calling it again rebinds what modules imported
  since then hold.  Returns how many names it rebound.
  """
  table = _replacements()
  count = 0
  with _lock:
    for module in list(sys.modules.values()):
      if not isinstance(module, types.ModuleType):
        continue
      name = getattr(module, "__name__", "")
      if not isinstance(name, str) or name.split(".")[0] == "hostcb":
        continue
      try:
        items = list(vars(module).items())
      except Exception:  # noqa: BLE001  (an odd module: leave it alone)
        continue
      for attr, value in items:
        entry = table.get(id(value))
        if entry is not None and entry[0] is value:
          setattr(module, attr, entry[1])
          _replaced.append((module, attr, value))
          count += 1
  return count


def uninstall_jax_callbacks() -> int:
  """Binds back JAX's functions wherever :func:`install_jax_callbacks` rebound them (a
  name that was rebound again since, to something else, is left alone).
  Where it restores a name, it clears JAX's caches of traced functions
  (``jax.clear_caches()``): a jitted function traced with hostcb's
  callbacks is traced again at its next call, with JAX's, so that JAX's
  barrier waits for its callbacks again (compiled objects keep hostcb's).
  Every jitted function compiles again at its next call (from JAX's
  persistent cache where it is on).  Returns how many names it
  restored."""
  ours = {id(f) for _, f in _replacements().values()}
  count = 0
  with _lock:
    while _replaced:
      module, attr, original = _replaced.pop()
      if id(getattr(module, attr, None)) in ours:
        setattr(module, attr, original)
        count += 1
  if count:
    # A function traced with hostcb's keeps hostcb's callbacks, which
    # JAX's barrier, back after uninstall(), does not wait for: traced
    # again, it has JAX's.
    jax.clear_caches()
  return count


def jax_callbacks_installed() -> bool:
  """Whether ``jax.debug.print`` is hostcb's now."""
  return jax.debug.print is debug.jax_print
