"""Output ordering: what the program writes, and the results it reads on
the host, come after the prints it dispatched before, as under JAX.

JAX's callbacks run while their computation runs, and on CPU its caller
waits for it, so ``print("result:", f(x))`` shows ``f``'s
``jax.debug.print`` lines first.  hostcb's prints (``id_print``,
``hostcb.debug.print``/``callback``) run later, on the consumer threads:
the device never waits for them.  So the host waits for them where a
person would see the difference: at the program's next write and at its
next read of a result.  Nothing of this runs before a print is staged.
This docstring is the map; each place it names says the rest.

**Staged** (at lowering, once per print; what starts it all):

* :func:`awaited_tap_staged` (as ``hostcb._engine.awaited_tap_staged``):
  called by ``_core/engine_entries.prints_lowered``, which
  ``_core/lowering._tap_lowering`` calls for a tap whose
  ``TapTarget.prints`` is not ``Prints.NOTHING`` (``_core/primitives.py``),
  and ``_core/by_name.target_id`` for a print by name; installs
  :func:`.reads.install` and :func:`.writes.install` (once).
* ``hostcb._engine.mark_awaited(tid)`` (:mod:`hostcb._engine.native`):
  called by ``_core/engine_entries.prints_lowered`` with the tap's target
  id (from ``_core/lowering._tap_target_id`` and
  ``_core/by_name.target_id``);
  sets the target's bit in the C++ table ``g_awaited_targets``
  (``_native/handlers.cc``, read through ``IsPrintTarget`` in
  ``_native/engine.h``, written by ``mark_awaited_target`` in
  ``_native/module.cc``), so that the engine's queue notes each record of
  that target as a print (``NotePrintLocked`` in ``_native/queue.h``).
  The Python-callback back end notes it per record instead
  (:meth:`hostcb._engine.pyqueue.DeviceQueue.put`'s ``prints``, from
  ``_core/lowering``'s ``queue_tap``).
* :func:`hostcb._jax_internals.note_awaited_lowered`: called by
  ``_tap_lowering`` where ``TapTarget.prints`` is ``Prints.LINES`` (a
  print's own formatter); the module being lowered prints
  (:mod:`hostcb._jax_internals.printing_computations`, decided by
  :mod:`hostcb._jax_internals.dispatch`'s wrapper of
  ``_cached_lowering_to_hlo``: an executable that returns arrays is marked
  and stays on jit's fast path, its AOT-compiled calls taking JAX's Python
  path (``dispatch``'s compiled-call guard); one that returns nothing
  keeps its runtime token).

**Noted** (at each dispatch of a computation that prints; the state the
waits look at, kept by the JAX hooks that write it, read here through
:func:`hostcb._jax_internals.this_threads_notes`):

* the thread's latest print outputs
  (``printing_computations._print_outputs``): on jit's fast path by the
  unflatten of a ``_PrintOutputs`` node (``print_outputs_unflatten``, a C
  function of ``_native/module.cc``, or its Python twin), on JAX's Python
  path by the wrapper of ``ExecuteReplicated.__call__``;
* the thread's latest runtime token (``core._latest_tokens``, the token
  chain of :mod:`hostcb._jax_internals.core`, which barriers use too).

**Wait points** (where the program waits):

* ``builtins.print``, ``logging.Handler.handle``,
  ``contextlib.redirect_stdout``/``redirect_stderr`` (enter and exit):
  :mod:`.writes`; the thread waits for its own latest computation that
  prints and for the prints queued so far
  (:func:`.writes.wait_for_own_prints`; the ``print`` is the C function
  ``ordered_print`` of ``_native/module.cc``, or
  ``writes._python_print``);
* the dispatch whose tracing staged the process's first print (Python
  found ``print`` before it called ``f`` in ``print("r:", f(x))``):
  :func:`hostcb._jax_internals.wait_after_next_dispatch` runs
  :func:`.writes.wait_for_own_prints` once, in the wrapper of
  ``ExecuteReplicated.__call__``;
* host reads of a ``jax.Array`` (``ArrayImpl._value``, ``.item``,
  ``.block_until_ready``, ``xla_client.batched_block_until_ready``): the
  hook of :mod:`hostcb._jax_internals.array_reads` runs
  :func:`.reads.wait_for_earlier_prints`, which waits for the prints
  queued on the array's devices (``DeviceQueue.wait_for_awaited``;
  :func:`hostcb._engine.native.wait_for_device` with ``awaited_only``,
  ``EarlierPrintsRun`` in ``_native/queue.h``) and raises a failed
  ``debug.callback`` drop-in that nothing raised yet.  hostcb's own wait
  for a computation is no read: it takes ``array_reads.block_without_hook``
  (``dispatch._wait_in_fast_mode``);
* not output ordering's own, but they order writes too: ``barrier_wait``
  (:mod:`hostcb._engine.barrier`), ``jax.effects_barrier``
  (:mod:`hostcb._jax_internals.effects_barrier`) and the exit handler
  (:mod:`hostcb._engine.lifecycle`) wait for every tap.

**Never waits:** a consumer thread (it would wait for itself), XLA's
threads, a thread running the host function of an
``io_callback``/``pure_callback`` (its computation waits for it)
(:mod:`hostcb._engine.consumers`, ``native.runs_host_function_call``).
A consumer's print writes to :func:`consumer_stdout` (``hostcb.debug``,
``hostcb.host_callback``).

**Undone** by ``hostcb.uninstall()``: every patch named above is in
:mod:`hostcb._jax_internals.patches` (``output order (...)``, ``host reads
(...)``, ``print outputs (...)``); the next print staged installs them
again.  In a forked child, :func:`after_fork_in_child` drops the parent's
notes.
"""

from __future__ import annotations

from hostcb import _jax_internals as ji
from hostcb._engine.output_order import reads, writes
from hostcb._engine.output_order.writes import (
  consumer_stdout,
  installed,
  wait_for_own_prints,
)

__all__ = [
  "awaited_tap_staged",
  "after_fork_in_child",
  "consumer_stdout",
  "installed",
  "wait_for_own_prints",
]


def awaited_tap_staged() -> None:
  """A print was staged: from now on, host reads wait for the prints
  queued before them (:mod:`.reads`), and a thread's prints, log records
  and ``redirect_stdout`` wait for its own (:mod:`.writes`).  Cheap after
  the first call."""
  reads.install()
  writes.install()


def after_fork_in_child() -> None:
  """In a forked child: the parent's computations are not ours to wait
  for (their tokens go with
  :func:`hostcb._jax_internals.forget_dispatched_computations`)."""
  ji.forget_print_outputs()
