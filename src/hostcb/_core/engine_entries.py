"""What the engine runs for a tap or call that a lowering emits.

* :func:`native_call_entry`: the engine's entry of a call lowered to the
  native engine (:mod:`hostcb._engine.entries`), the one way a call's
  entry is made, for a call by process-local id and by name alike;
* :func:`call_runner`: the host function of a call lowered to XLA's
  Python callbacks;
* :func:`prints_lowered`: a printing tap was lowered (host reads wait for
  its prints).

A call's failure fails its computation; a legacy ``call``'s also reaches
the next ``barrier_wait``, a front end's (``target.rules``) does not.
"""

from __future__ import annotations

from hostcb import _engine as engine
from hostcb._core.host_function import HostFunction
from hostcb._engine.entries import CallEntry, CallRunner, DirectCall

__all__ = ["native_call_entry", "call_runner", "prints_lowered"]


def prints_lowered(tid: int | None = None) -> None:
  """A tap that prints (:attr:`TapTarget.prints
  <hostcb._core.primitives.TapTarget.prints>`) was lowered: host reads
  wait for prints from now on, and, where it has the engine's target id
  ``tid``, for that id's taps queued before them."""
  engine.awaited_tap_staged()
  if tid is not None:
    engine.mark_awaited(tid)


def _record_call_failure(e: BaseException, what: str) -> None:
  """A legacy ``call`` failed: it fails its computation (its caller gets
  it), and, as in legacy, the next ``barrier_wait`` raises it too."""
  engine.record_exception(e, what, reaches_caller=True)


def _keep_out(e: BaseException, what: str = "") -> None:
  """A front end's call (``target.rules``, e.g. ``hostcb.pure_callback``)
  fails its computation only, as JAX's callbacks do: its failure is not
  kept for ``barrier_wait``."""


def call_runner(target):
  """``run(arrays, device) -> results``: runs a call's host function once
  the taps queued before it on its device have run, and returns its flat,
  checked results.

  It runs once per call (once per loop step in a loop), so the per-call
  work is looked up here, once.
  """
  invoke = target.caller()
  drain = engine.drain_device
  record = _record_call_failure if target.rules is None else _keep_out

  def run(arrays, device):
    drain(device)  # the taps that came before run first
    try:
      return invoke(arrays, device)
    except BaseException as e:
      # As legacy: the failure also reaches the next barrier_wait.
      record(e, f"the call to {target.func!r} failed")
      raise

  return run


def native_call_entry(target) -> CallEntry:
  """The engine's entry of a call lowered to the native engine (see
  :func:`hostcb._engine.call_target_id`), of a kind of
  :mod:`hostcb._engine.entries`: the one way a call's entry is made.

  Its runner runs once per call, on the device thread, after the handler
  waited for the engine's taps queued before the call; only taps queued
  through XLA's Python callbacks (dtypes the engine cannot carry) may be
  left, and only then is the device looked up for them.  When the result
  is one array, the runner returns the host function's result as it is:
  the ``hostcb_call_one`` handler checks it, and calls the entry's
  ``check`` only for what is not an exact array of the result.

  Where the handler may call the host function itself
  (:attr:`CallTarget.direct`), the entry is the front end's own
  (:meth:`HostFunction.call_entry
  <hostcb._core.host_function.HostFunction.call_entry>`, for JAX's rules)
  where it has one, else a :class:`DirectCall`; otherwise a
  :class:`CallRunner`.
  """
  device_of = engine.device_of_ordinal
  python_queues = engine.python_queues  # the same dict for the process
  drain = engine.drain_device
  if (
    target.direct
    and target.rules is not None
    and isinstance(target.func, HostFunction)
  ):
    # A front end's own entry: the same work with no frame between.
    own = target.func.call_entry(
      python_queues, lambda ordinal: drain(device_of(ordinal), False)
    )
    if own is not None:
      return own
  invoke = target.caller(device_of=device_of, unchecked_one_array=True)
  check_results = target.check_results
  record = _record_call_failure if target.rules is None else _keep_out
  what = f"the call to {target.func!r} failed"

  def run(arrays, ordinal):
    if python_queues:  # Python-callback taps may be queued before it
      drain(device_of(ordinal), False)
    try:
      return invoke(arrays, ordinal)
    except BaseException as e:
      # As legacy: the failure also reaches the next barrier_wait.
      record(e, what)
      raise

  def check(res):
    try:
      return check_results(res)
    except BaseException as e:
      record(e, what)
      raise

  if not target.direct:
    return CallEntry(CallRunner(run), check)

  def on_failure(e):
    record(e, what)

  # (What run does, done by the handler while no tap waits in a
  # Python-callback queue; a front end's failures are not recorded.)
  keep = on_failure if target.rules is None else None
  return CallEntry(DirectCall(target.func, keep, python_queues, run), check)
