"""What the core asks of a front end's host function: one protocol.

A front end (``id_print`` in :mod:`hostcb.host_callback`,
:mod:`hostcb.debug`, :mod:`hostcb.jax_callbacks`) hands the primitives
(:mod:`hostcb._core.primitives`) not the user's function itself but a
wrapper of its own, a :class:`HostFunction`, that rebuilds the user's
arguments, calls the function and checks what it returns.  The core calls
it as any tap or call function; beyond that, it asks the hooks below, each
documented here once, each with a default that means "nothing of its
own" (a front end overrides those it has):

* :meth:`HostFunction.tap_entry`: the engine's entry for a tap of it;
* :meth:`HostFunction.call_entry`: the engine's entry for a call of it;
* :meth:`HostFunction.export`: how a program names it, when it is lowered
  by name (:mod:`hostcb.named`).

Identity: a host function is keyed by what it *is*
(:mod:`hostcb._core.identity`).  A :class:`HostFunction` may compare by
value, with an ``__eq__`` and ``__hash__`` that compare the user's
functions inside it by identity (:func:`hostcb._core.identity.same_function`),
so that the same user function at the same site hits JAX's caches.

The hooks are looked up on the class (``isinstance``), never by name on
the object: a callable whose ``__getattr__`` answers every name (a mock)
is a plain function to the core.
"""

from __future__ import annotations

from typing import Callable

from hostcb._engine.entries import ArrayTap, CallEntry, PrintLineTap

__all__ = ["HostFunction"]


class HostFunction:
  """Base class of the front ends' host functions (see the module)."""

  __slots__ = ()

  def tap_entry(self) -> ArrayTap | PrintLineTap | None:
    """For a tap of one array, without transforms and without a device
    argument: the entry that the engine's consumers run instead of calling
    this object (:mod:`hostcb._engine.entries`), the same work with its
    lookups done once per executable; None: the engine calls this object
    as ``self(array, transforms)``."""
    return None

  def call_entry(
    self, pending: dict, wait_for_pending: Callable[[int], None]
  ) -> CallEntry | None:
    """For a call with JAX's rules of one array argument to one array
    result, without a device argument: the entry that the engine's
    ``hostcb_call_one`` handler runs instead of the core's runner around
    this object, with nothing recorded around it (such failures reach the
    computation only); None: the core's runner.

    Its runner, ``run(arrays, device_ordinal)``, first calls
    ``wait_for_pending(device_ordinal)`` when ``pending`` (the dict of the
    Python-callback tap queues) is not empty: taps queued there come
    before the call."""
    del pending, wait_for_pending
    return None

  def export(self) -> tuple[str, dict] | None:
    """``(name, description)`` under which a program names this function
    when it is lowered by name (:mod:`hostcb.named`): the registered name
    of the user's function (``""`` for the printing functions, which need
    no registration) and a JSON description of the wrapper, from which the
    kind that it names (:func:`hostcb._core.by_name.define_kind`) rebuilds it in
    another process; None: lowered by a process-local id.  Raises
    ``NotExportable`` where the function is registered but what the
    wrapper holds cannot be written down."""
    return None
