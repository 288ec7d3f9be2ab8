"""Host functions by name: programs with callbacks that can be exported,
cached and serialized, and run in another process (``docs/export.md``).

``register(name, fn)`` binds a name to a host function.  A tap or call of
a registered function (``id_tap``, ``call``, ``hostcb.debug.callback``,
``hostcb.io_callback``, ``hostcb.pure_callback``; ``id_print`` and
``hostcb.debug.print`` need no registration) is lowered by name: to the
versioned custom calls ``hostcb_tap_v1`` / ``hostcb_call_v1``, whose two
string attributes are

* ``name``: the registered name (``""`` for the printing functions);
* ``spec``: a JSON text saying how the function is called: the structure
  of its argument and results, the result shapes and dtypes, the
  transforms applied (``vmap``, ``grad``) and the options of the front
  end.

Nothing process-local goes into the program, so the same program lowered
in two processes is the same text (the persistent compilation cache hits
whatever the order of registration), and a program exported with
:func:`export_checks`, or compiled and serialized, runs in any process
that imported hostcb and registered the names again.  There a name
that is not bound fails the computation with an error that names it
(:class:`UnboundNameError`).

Unregistered functions are lowered as before, by a process-local id.
The specs, the table of names and the target ids by name are
:mod:`hostcb._core.by_name`'s.
"""

from __future__ import annotations

from typing import Callable

import jax

from hostcb import _engine as engine
from hostcb._core import by_name
from hostcb._core.by_name import (
  NotExportableWarning,
  UnboundNameError,
  lookup,
  registered,
)

__all__ = [
  "register",
  "registered",
  "lookup",
  "export_checks",
  "UnboundNameError",
  "NotExportableWarning",
]


def register(name: str, fn: Callable | None = None):
  """Registers ``fn`` as the host function named ``name``.

  Taps and calls of ``fn`` are then lowered by name, so that the program
  can be exported (``jax.export`` with :func:`export_checks`), kept in the
  persistent compilation cache, or serialized, and run in another process
  that registers a function under the same name.  Registering a name again
  rebinds it: the programs that name it call the new function from then on.
  A function registered under several names is lowered under the name
  registered last (registering a name again makes it the last).

  Works as a decorator too: ``@hostcb.register("log")``.

  Returns ``fn``.
  """
  if not isinstance(name, str) or not name:
    raise TypeError(
      f"hostcb.register: the name must be a non-empty str; got {name!r}"
    )
  if fn is None:
    return lambda f: register(name, f)
  if not callable(fn):
    raise TypeError(
      f"hostcb.register({name!r}, fn): fn must be callable; got {fn!r}"
    )
  if by_name.bind(name, fn):  # rebound
    engine.rebind_name(name)
  return fn


def export_checks() -> list:
  """The ``disabled_checks`` of ``jax.export.export`` for programs with
  host functions by name: hostcb's versioned targets, whose compatibility
  hostcb promises (``docs/export.md``)."""
  check = jax.export.DisabledSafetyCheck.custom_call
  return [check(engine.tap_v1_target_name), check(engine.call_v1_target_name)]
