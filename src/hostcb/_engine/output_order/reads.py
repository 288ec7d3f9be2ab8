"""Host reads of results after the prints before them (part of
:mod:`hostcb._engine.output_order`, whose docstring maps the whole).

hostcb's prints (``id_print``, ``hostcb.debug.print`` and
``hostcb.debug.callback``) run on the consumer threads, after the device
queued them: the device never waits for them.  JAX's callbacks run while
the computation runs, so a program that prints a result read on the host
shows the computation's lines first.  hostcb keeps that order where a
person sees it: once a print has been staged, each host read of a
``jax.Array`` (``print(result)``, ``.item()``, ``.tolist()``,
``jax.device_get``, ``block_until_ready()``; the hook is
:mod:`hostcb._jax_internals.array_reads`, which names the read that
escapes: ``np.asarray`` of an array on the CPU, which reads its memory
directly) calls :func:`wait_for_earlier_prints`, which waits, after the
array is ready, until the consumers of the array's devices have run every
print tap queued before the read (and so the taps queued before that
print, which run first).  A tap function queued after the latest print,
however slow or blocked, is not waited for; nor does the device ever
wait.  A loop that never reads its results on the host pays nothing; one
that does waits only where a print is still pending.

Once it has waited, the read raises the failure of a ``jax.debug.callback``
drop-in that ran on those consumers and that nothing raised yet
(:mod:`hostcb._engine.errors`), as JAX's read of a failed computation's
results raises it: the read that waits for the callback is where hostcb
learns of it.

Not in a tap function (a consumer thread), which would wait for itself,
nor in the host function of an ``io_callback``/``pure_callback`` (which
reads its ``jax.Array`` arguments): its computation waits for it, and a
consumer may be waiting for that computation.
"""

from __future__ import annotations

from typing import Any

from hostcb import _jax_internals as ji
from hostcb._engine import errors, native, pyqueue
from hostcb._engine.consumers import in_host_function, is_consumer

__all__ = ["install", "wait_for_earlier_prints"]


def install() -> None:
  """From now on, host reads wait for the prints queued before them
  (module docstring).  Cheap after the first call."""
  ji.after_host_reads(wait_for_earlier_prints)


def wait_for_earlier_prints(array: Any) -> None:
  """After a host read of ``array`` (ready): waits until the consumers of
  its devices ran the prints queued so far, then raises a failed
  ``jax.debug.callback`` drop-in of theirs that nothing raised yet."""
  if is_consumer() or in_host_function() or native.runs_host_function_call():
    return  # (before the look at the queues, which from a consumer would
    # give up the GIL while its own print is pending)
  if (
    not pyqueue.queues
    and native.awaited_run_everywhere()
    and not errors.jax_callback_failed()
  ):
    return  # no print pending on any device (the common case): no lookups
  try:
    devices = array.devices()
  except Exception:  # noqa: BLE001  (deleted: no value was read; the read
    return  # itself raised or will raise the reason)
  keys = []
  for d in devices:  # another process's devices have no queue here
    q = pyqueue.queues.get(d) if pyqueue.queues else None
    if q is not None:
      q.wait_for_awaited()
    key = native.key_of_device(d)
    if key is not None:
      native.wait_for_device(key, awaited_only=True)
    keys += errors.consumer_keys(key, q)
  if errors.jax_callback_failed() and not errors.held_here():
    errors.raise_jax_callback_failure(
      keys, "at the first host read of a result on its device"
    )
