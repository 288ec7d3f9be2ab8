"""The host's side: from the taps to the sinks, off the step's path.

A site's tap function (on hostcb's consumer thread of the tapping device)
only appends ``(site, operands, transforms, time)`` to one bounded FIFO.
One writer thread, started with the first sink or record, wakes every
``interval`` seconds (or once ``WAKE_AT`` taps wait), takes everything
queued, makes the records (:mod:`._records`) and hands them to each sink
as one batch: a slow sink delays the writer, never the tapping device,
until the FIFO is full.

Full FIFO (``max_pending`` taps waiting; the writer's current batch
is held beside it, so at most twice that many taps are in memory):

* ``overflow="block"`` (default): the consumer thread waits for the
  writer; the device then waits once hostcb's own tap queue is full too.
  Nothing is lost; the loop runs at the sinks' pace.
* ``overflow="drop"``: the tap is dropped and counted
  (``stats()["dropped"]``), with a warning at the next :func:`flush`.

:func:`flush` waits for the taps of the computations dispatched so far,
then for the writer to hand their records to the sinks and flush them.
At interpreter exit the same happens (bounded), then the sinks are
closed; an exception or a ``KeyboardInterrupt`` that ends the script
goes through the same exit, and so does a failed callback (hostcb's exit
handlers never end the process).  ``hostcb.uninstall()``, which removes
the exit handler, first writes and flushes what was logged before it
(:data:`hostcb._engine.lifecycle.before_uninstall`); a program compiled
before it that logs after it installs the exit handler again (with the
engine's, :data:`hostcb._engine.lifecycle.after_first_record_hooks`, or
at its first record).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import itertools
import logging
import operator
import os
import threading
import time
from typing import Any

from hostcb._engine import lifecycle, wait_for_taps
from hostcb._engine.lifecycle import EXIT_TIMEOUT_SECONDS
from hostcb._jax_internals import patches
from hostcb.metrics._types import Batch, MetricsError, Record

__all__ = [
  "put",
  "add",
  "remove",
  "flush",
  "configure",
  "stats",
  "note_traced",
  "OVERFLOW_POLICIES",
]

logger = logging.getLogger("hostcb")

OVERFLOW_POLICIES = ("block", "drop")
WAKE_AT = 8192  # taps waiting that wake the writer before its interval


@dataclasses.dataclass
class _Settings:
  max_pending: int = 100_000
  overflow: str = "block"
  interval: float = 1.0


_settings = _Settings()
_pending: collections.deque = collections.deque()
_space = threading.Condition(threading.Lock())  # producers of a full FIFO
_wake = threading.Event()
_state_lock = threading.Lock()
_sinks: list = []  # _Entry, in the order added
_errors: list = []  # exceptions not yet raised by flush()
_counts = {"taps": 0, "records": 0, "dropped": 0, "no_sink": 0}
_reported = {"dropped": 0, "no_sink": 0}
_writer: list = [None]  # the writer thread, once started
_traced = [False]
_hooked = [False]  # the exit handler is installed (uninstall() removes it)


@dataclasses.dataclass(eq=False)
class _Entry:
  sink: Any
  processes: str


class _Marker:
  """Queued by flush() (as ``(marker,)``, where a tap is ``(site, arg,
  transforms, wall_time)``): the writer sets it once everything before
  it was written and the sinks flushed."""

  def __init__(self):
    self.done = threading.Event()


def note_traced() -> None:
  """A ``log`` was traced: the exit handler will flush."""
  _traced[0] = True
  _install_hooks()


# ------------------------------------------------- consumer threads
def put(site, arg, transforms, _now=time.time) -> None:
  """Queues one tap (on a consumer thread): the hot path, which
  :class:`~._records.Site` calls as its tap function."""
  pending = _pending
  if len(pending) >= _settings.max_pending and not _make_room():
    return
  pending.append((site, arg, transforms, _now()))
  if len(pending) == WAKE_AT:
    _wake.set()
  elif _writer[0] is None:
    _start_writer()
  if not _hooked[0]:  # a program compiled before uninstall() logs after it
    _install_hooks()


def _make_room() -> bool:
  """The FIFO is full: waits for the writer ("block"), or counts the tap
  as dropped ("drop"; returns False)."""
  _wake.set()
  with _space:
    while len(_pending) >= _settings.max_pending:
      if _settings.overflow == "drop":
        with _state_lock:
          _counts["dropped"] += 1
        return False
      # The writer notifies once it took the FIFO's taps; configure()
      # notifies too (a new bound or policy).  The timeout only re-checks.
      _space.wait(1.0)
  return True


# -------------------------------------------------------- the writer
def _start_writer() -> None:
  with _state_lock:
    if _writer[0] is None:
      t = threading.Thread(
        target=_write_forever, daemon=True, name="hostcb-metrics-writer"
      )
      _writer[0] = t
      t.start()


def _write_forever() -> None:
  while True:
    _wake.wait(_settings.interval)
    _wake.clear()
    try:
      _write_pending()
    except BaseException as e:  # noqa: BLE001  (kept for flush(), logged)
      _record_error(e, "the writer")


def _take() -> list:
  """Everything queued so far, in order (only the writer takes; the
  consumers only append, so that many are there to take)."""
  n = len(_pending)
  items = list(itertools.starmap(_pending.popleft, itertools.repeat((), n)))
  with _space:
    _space.notify_all()
  return items


_site_of = operator.itemgetter(0)
_transforms_of = operator.itemgetter(2)


def _write_pending() -> None:
  """Makes the records of the taps queued so far and hands them to the
  sinks: each run of consecutive taps of one site in one go (the runs of
  a packed site without transforms as :class:`Columns`), up to each
  flush marker, which is set once everything before it is written and
  the sinks flushed."""
  items = _take()
  if not items:
    return
  parts: list = []  # Columns, and lists of Records
  taps = 0
  for site, run in itertools.groupby(items, _site_of):
    if type(site) is _Marker:
      _deliver(parts)
      parts = []
      _flush_sinks()
      site.done.set()
      continue
    run = list(run)
    taps += len(run)
    try:
      if site.kinds is not None and not any(map(_transforms_of, run)):
        parts.append(site.columns(run))
      else:
        parts.append(_records_of(site, run))
    except Exception as e:  # noqa: BLE001  (kept for flush(), logged)
      _record_error(e, "making records")
  _deliver(parts)
  with _state_lock:
    _counts["taps"] += taps


def _records_of(site, run: list) -> list:
  """The records of a run of taps of one site, one tap at a time (a tap
  that fails loses its own records only)."""
  records: list[Record] = []
  for _, arg, transforms, wall in run:
    try:
      records += site.records(arg, transforms, wall)
    except Exception as e:  # noqa: BLE001  (kept for flush(), logged)
      _record_error(e, "making a record")
  return records


def _deliver(parts: list) -> None:
  if not parts:
    return
  batch = Batch(parts)
  with _state_lock:
    sinks = list(_sinks)
    if not sinks:
      _counts["no_sink"] += len(batch)
      return
    _counts["records"] += len(batch)
  first_process = _process_index() == 0
  for entry in sinks:
    if entry.processes == "first" and not first_process:
      continue
    try:
      entry.sink.write(batch)
    except Exception as e:  # noqa: BLE001  (kept for flush(), logged)
      _record_error(e, f"sink {entry.sink!r}")


def _flush_sinks() -> None:
  with _state_lock:
    sinks = list(_sinks)
  for entry in sinks:
    try:
      entry.sink.flush()
    except Exception as e:  # noqa: BLE001  (kept for flush(), logged)
      _record_error(e, f"flushing sink {entry.sink!r}")


_process = [None]


def _process_index() -> int:
  if _process[0] is None:
    import jax  # noqa: PLC0415  (only once records are written)

    _process[0] = jax.process_index()
  return _process[0]


def _record_error(e: BaseException, where: str) -> None:
  logger.error("hostcb.metrics: %s failed", where, exc_info=e)
  with _state_lock:
    _errors.append(e)


# ------------------------------------------------------- the API
def add(sink, processes: str) -> None:
  _install_hooks()
  with _state_lock:
    _sinks.append(_Entry(sink, processes))
  _start_writer()


def remove(sink, timeout: float | None) -> None:
  flush(timeout)
  with _state_lock:
    found = [e for e in _sinks if e.sink is sink]
    if not found:
      raise ValueError(f"hostcb.metrics.remove_sink: {sink!r} was not added")
    _sinks.remove(found[0])
  found[0].sink.close()


def sinks() -> list:
  with _state_lock:
    return [e.sink for e in _sinks]


def flush(timeout: float | None = None) -> None:
  if threading.current_thread() is _writer[0]:
    raise RuntimeError(
      "hostcb.metrics.flush() was called from a sink; it would wait for "
      "that sink itself. Call it from the thread that runs the loop."
    )
  deadline = None if timeout is None else time.monotonic() + timeout
  if not wait_for_taps(timeout):
    raise TimeoutError(
      f"hostcb.metrics.flush: taps still pending after {timeout} s"
    )
  _start_writer()
  marker = _Marker()
  _pending.append((marker,))
  _wake.set()
  left = None if deadline is None else max(0.0, deadline - time.monotonic())
  if not marker.done.wait(left):
    raise TimeoutError(
      f"hostcb.metrics.flush: the sinks did not finish "
      f"writing within {timeout} s"
    )
  _warn_losses()
  with _state_lock:
    errors = list(_errors)
    _errors.clear()
  if errors:
    raise MetricsError(
      f"hostcb.metrics: {len(errors)} failure(s) since the last flush "
      f"(logged with their tracebacks); the first: "
      f"{type(errors[0]).__name__}: {errors[0]}"
    ) from errors[0]


def _warn_losses() -> None:
  with _state_lock:
    dropped = _counts["dropped"] - _reported["dropped"]
    unsinked = _counts["no_sink"] - _reported["no_sink"]
    _reported.update(dropped=_counts["dropped"], no_sink=_counts["no_sink"])
  if dropped:
    logger.warning(
      "hostcb.metrics: %d tap(s) dropped: the sinks were "
      "slower than the loop and overflow='drop'",
      dropped,
    )
  if unsinked:
    logger.warning(
      "hostcb.metrics: %d record(s) logged while no sink was "
      "added were not written",
      unsinked,
    )


def configure(
  max_pending: int | None = None,
  overflow: str | None = None,
  interval: float | None = None,
) -> None:
  if max_pending is not None:
    if (
      isinstance(max_pending, bool)
      or not isinstance(max_pending, int)
      or max_pending < 1
    ):
      raise ValueError(
        f"max_pending must be a positive int; got {max_pending!r}"
      )
    _settings.max_pending = max_pending
  if overflow is not None:
    if overflow not in OVERFLOW_POLICIES:
      raise ValueError(f"overflow must be 'block' or 'drop'; got {overflow!r}")
    _settings.overflow = overflow
  if interval is not None:
    if not (isinstance(interval, (int, float)) and 0 < interval < 1e6):
      raise ValueError(
        f"interval must be a positive number of seconds; got {interval!r}"
      )
    _settings.interval = float(interval)
  with _space:
    _space.notify_all()
  _wake.set()


def stats() -> dict:
  with _state_lock:
    out = dict(_counts)
  out["pending"] = sum(type(i[0]) is not _Marker for i in list(_pending))
  return out


def _at_exit() -> None:
  """Writes what was logged, then closes the sinks (bounded waits)."""
  if not (_traced[0] or _sinks):
    return
  try:
    flush(EXIT_TIMEOUT_SECONDS)
  except Exception:  # the interpreter is going away: the log says what
    # failed, with its traceback; the sinks close below
    logger.exception("hostcb.metrics: at exit, flushing the records")
  with _state_lock:
    entries = list(_sinks)
    _sinks.clear()
  for entry in entries:
    try:
      entry.sink.close()
    except Exception:  # as above: logged; the other sinks close
      logger.exception("hostcb.metrics: at exit, closing sink %r", entry.sink)


def _flush_before_uninstall() -> None:
  """``hostcb.uninstall()`` is about to remove the exit handler: writes
  and flushes what was logged so far (bounded as at exit; a failure is
  logged, as at exit).  The sinks stay added."""
  if not (_traced[0] or _sinks):
    return
  try:
    flush(EXIT_TIMEOUT_SECONDS)
  except Exception:  # uninstall() goes on: the log says what failed
    logger.exception("hostcb.metrics: at uninstall(), flushing the records")


def _after_fork_in_child() -> None:
  """A forked child starts with no writer and nothing pending: the
  parent's records are the parent's to write; its sinks stay added (their
  files are shared with the parent: give the child its own sinks)."""
  global _space, _state_lock
  _pending.clear()
  _space = threading.Condition(threading.Lock())
  _state_lock = threading.Lock()
  _writer[0] = None
  _process[0] = None


def _remove_exit_handler() -> None:
  """The undo of the exit handler (``hostcb.uninstall()``, which first
  flushed: :func:`_flush_before_uninstall`)."""
  _hooked[0] = False
  atexit.unregister(_at_exit)


_fork_hook = [False]  # registered (Python cannot unregister it)


def _install_hooks() -> None:
  """The exit handler and the fork handler, when the first ``log`` is
  traced or the first sink added (importing hostcb.metrics registers
  neither).  The exit handler is recorded in
  :mod:`hostcb._jax_internals.patches` and ``hostcb.uninstall()`` removes
  it; the fork handler, which only resets this module's state in a child,
  stays once registered."""
  if patches.is_installed("metrics: at exit"):
    return
  with patches.lock:
    if patches.is_installed("metrics: at exit"):
      return
    atexit.register(_at_exit)
    patches.record(
      "metrics: at exit",
      "atexit (hostcb.metrics._pipeline._at_exit)",
      _remove_exit_handler,
    )
    _hooked[0] = True
    if _flush_before_uninstall not in lifecycle.before_uninstall:
      lifecycle.before_uninstall.append(_flush_before_uninstall)
      lifecycle.after_first_record_hooks.append(_install_hooks)
    if hasattr(os, "register_at_fork") and not _fork_hook[0]:
      os.register_at_fork(after_in_child=_after_fork_in_child)
      _fork_hook[0] = True
