"""``barrier_wait``: every tap of the computations started so far has run.

A barrier has two steps.  First it waits until the tapping computations
dispatched before it have finished, so that every tap they make is queued:

* computations that exchange a runtime token with JAX (every one in the
  strict-barrier mode; multi-device ones, and those that tap functions
  dispatch, in the default mode): :mod:`hostcb._jax_internals` keeps each
  thread's latest token, and the barrier waits for all of them;
* one-device computations of the default (fast-dispatch) mode carry no
  token: the barrier waits for those of the calling thread (a tiny
  computation after them on every device, which the device runs after
  them) and for every computation, of any thread, whose results are still
  alive (``jax.live_arrays()``).  What it cannot see is a one-device
  computation of *another* thread that is still running and whose results
  were all dropped; ``hostcb_strict_barrier`` covers that too.

Then it puts a marker behind the taps in every queue of both back ends
(:mod:`.native`, :mod:`.pyqueue`) and waits for the consumers to reach
them.  It waits for what was queued before it, not for an empty queue, so
it returns while other threads keep tapping.
"""

from __future__ import annotations

import logging
import time

from hostcb import _jax_internals as ji
from hostcb._engine import errors, native, pyqueue, host_functions
from hostcb._engine import consumers
from hostcb._engine.consumers import is_consumer
from hostcb._engine.arrivals import Arrivals

__all__ = [
  "barrier_wait",
  "stop_outfeed_receiver",
  "wait_for_dispatched",
  "wait_for_taps",
]

logger = logging.getLogger("hostcb")


def _wait_for_live_arrays() -> None:
  """Waits for the computations of every live array of the local
  platforms (tapping computations of other threads whose results are
  alive, in the fast-dispatch mode)."""
  import jax  # noqa: PLC0415  (public API)

  platforms = {d.platform for d in ji.local_devices()}
  for platform in platforms:
    for a in jax.live_arrays(platform):
      try:
        a.block_until_ready()
      except Exception:  # noqa: BLE001  (deleted meanwhile, or it failed:
        pass  # its error reaches its own caller)


def wait_for_dispatched() -> None:
  """Waits for the computations that this thread dispatched and for those
  whose results are alive, as :func:`wait_for_taps` does in the
  fast-dispatch mode: for programs lowered elsewhere (``jax.export``,
  serialized executables), which carry no mark of hostcb's that the
  barrier could wait for."""
  with errors.held():
    ji.drain_this_thread()
    _wait_for_live_arrays()


NESTED_ROUNDS = 8
"""How many more rounds a barrier waits for taps that tap functions made
while it waited (:func:`wait_for_taps`)."""


def wait_for_taps(timeout: float | None = None) -> bool:
  """Waits until every tap of the computations dispatched so far has run
  (module docstring); False if ``timeout`` seconds passed first.

  A tap function that runs a tapping computation while the barrier waits
  queues its taps behind the barrier's markers: then the barrier waits
  again, for those (as legacy's synchronous CPU taps had run them), until
  a round in which no tap function dispatched anything, at most
  :data:`NESTED_ROUNDS` more rounds (taps of tap functions of tap
  functions ... that deep), so that it returns while another thread's
  tap functions keep running computations.
  """
  if is_consumer():
    raise RuntimeError(
      "barrier_wait() was called from a tap function; it would wait for "
      "that function itself. Call it from the thread that runs the "
      "computation."
    )
  deadline = None if timeout is None else time.monotonic() + timeout
  with errors.held():  # its reads raise no callback's failure: the caller
    for _ in range(1 + NESTED_ROUNDS):  # (barrier_wait) raises it
      dispatched = consumers.dispatches()
      left = None if deadline is None else max(0.0, deadline - time.monotonic())
      if not _wait_once(left):
        return False
      if consumers.dispatches() == dispatched:
        break
  return True


def _wait_once(timeout: float | None) -> bool:
  """One round of :func:`wait_for_taps`: the computations dispatched so
  far, then a marker behind the taps in every queue."""
  retired = host_functions.barrier_started()
  ji.wait_for_dispatched_computations()
  if ji.fast_dispatch_used():
    ji.drain_this_thread()
    _wait_for_live_arrays()
  waits = [
    a
    for a in (native.put_markers(Arrivals), pyqueue.put_markers(Arrivals))
    if a is not None
  ]
  try:
    done = all([a.wait(timeout) for a in waits])
  finally:
    for a in waits:
      native.forget_markers(a)
  if done:  # the ids retired before it need wait for nothing more
    host_functions.barrier_done(retired)
  return done


def barrier_wait(
  logging_name: str | None = None,
  *,
  all_processes: bool = False,
) -> None:
  """Blocks until every tap of the computations started so far has run.

  Waits for the tapping computations dispatched before the call to
  finish, then for every tap function they queued to return, and again
  for the taps that tap functions made meanwhile; taps that other
  threads queue later are not waited for.  If a tap
  function raised since the previous barrier, raises
  :class:`CallbackException` with the last such exception (the
  computations themselves went on).  Else, if a ``jax.debug.callback``
  drop-in (``hostcb.debug.callback``/``print`` under ``jit``) failed and
  no host read raised it yet, raises it as JAX does, as
  ``jax.errors.JaxRuntimeError`` (:mod:`hostcb._engine.errors`).  Safe to
  call from several threads at once; not from a tap function, which it
  would wait for.

  Which computations: every computation that the calling thread
  dispatched, every multi-device one (``pmap``, sharded ``jit``,
  ``shard_map``), and every one, of any thread, whose results are still
  alive.  A one-device computation that another thread dispatched, that
  is still running and whose results were all dropped is covered only
  with ``hostcb.config.update("hostcb_strict_barrier", True)`` (legacy's
  cross-thread barrier; slower dispatch).

  Args:
    logging_name: a name to show in the log messages of this barrier.
    all_processes: in a multi-process JAX program
      (``jax.distributed.initialize``), also wait until every process has
      reached its own ``barrier_wait(all_processes=True)``.
  """
  name = logging_name or ""
  logger.debug("hostcb: barrier_wait(%s) starts", name)
  wait_for_taps()
  if all_processes:
    from hostcb._engine import distributed  # noqa: PLC0415  (JAX's multi-process)

    distributed.wait_for_all_processes(name)
  logger.debug("hostcb: barrier_wait(%s) done", name)
  last = errors.take_last_exception()
  if last is not None:
    exc, text = last
    raise errors.CallbackException(
      f"There were exceptions during callback processing. Last one was:\n{text}"
    ) from exc
  if errors.jax_callback_failed():
    errors.raise_jax_callback_failure(None, "at the first barrier")


def stop_outfeed_receiver() -> None:
  """Processes every pending tap (a barrier that does not raise).

  Legacy stopped its receiver threads here and started them again on the
  next tap.  hostcb's consumer threads sleep while there is nothing to do,
  so they are left running.  Exceptions of tap functions stay recorded for
  the next :func:`barrier_wait`.
  """
  wait_for_taps()
