"""Metrics from compiled loops to TensorBoard, W&B and files, without
stalling a step.

::

  from hostcb import metrics
  metrics.add_sink(metrics.TensorBoard("runs/exp1"))

  @jax.jit
  def train_step(state, batch):
    ...
    metrics.log({"loss": loss, "lr": lr}, step=state.step)
    return state

:func:`log` taps the values with :func:`hostcb.id_tap` (the device never
waits for Python); on the host, hostcb.metrics' writer thread makes one
record per step (the mean over devices under ``pmap``/``shard_map`` and
over the batch under ``vmap``, by default) and hands the records to the
sinks in batches.  :func:`flush` waits until everything logged so far is
written; the same happens at exit, after an exception too.  See
``docs/metrics.md``.

Sinks: :class:`TensorBoard` (``pip install hostcb[tensorboard]``),
:class:`WandB` (``pip install hostcb[wandb]``), :class:`JsonLines`,
:class:`CSV`, a plain function ``f(step, values)``, or any object with
``write(records)``, ``flush()`` and ``close()`` (:class:`Sink` documents
them; :class:`FileSink` is the base of a sink that writes one file).
"""

from __future__ import annotations

from hostcb.metrics import _pipeline
from hostcb.metrics._device import log
from hostcb.metrics._records import REDUCTIONS
from hostcb.metrics._types import MetricsError, Record
from hostcb.metrics.sinks import CSV, Callback, FileSink, JsonLines, Sink
from hostcb.metrics.tensorboard import TensorBoard
from hostcb.metrics.wandb import WandB

__all__ = [
  "log",
  "add_sink",
  "remove_sink",
  "sinks",
  "flush",
  "configure",
  "stats",
  "Record",
  "MetricsError",
  "Sink",
  "FileSink",
  "TensorBoard",
  "WandB",
  "JsonLines",
  "CSV",
  "Callback",
  "REDUCTIONS",
]


def add_sink(sink, *, processes: str = "first"):
  """Adds a sink; returns it (a plain function comes back wrapped in a
  :class:`Callback`).

  Args:
    sink: an object with ``write(records)``, ``flush()`` and ``close()``,
      or a function called as ``f(step, values)`` per record.
    processes: ``"first"`` (default): in a multi-process program, only
      process 0 writes to this sink; ``"each"``: every process writes
      the records that its own devices made.
  """
  if processes not in ("first", "each"):
    raise ValueError(f"processes must be 'first' or 'each'; got {processes!r}")
  if not hasattr(sink, "write"):
    sink = Callback(sink)
  _pipeline.add(sink, processes)
  return sink


def remove_sink(sink, *, timeout: float | None = None) -> None:
  """Writes what was logged so far (:func:`flush`), then removes the sink
  and closes it.  ``sink``: what :func:`add_sink` got or returned."""
  for s in _pipeline.sinks():
    if s is sink or (isinstance(s, Callback) and s.func is sink):
      _pipeline.remove(s, timeout)
      return
  raise ValueError(f"hostcb.metrics.remove_sink: {sink!r} was not added")


def sinks() -> list:
  """The sinks added, in order."""
  return _pipeline.sinks()


def flush(timeout: float | None = None) -> None:
  """Waits until every record of the computations dispatched so far is
  written to the sinks, and flushes them.  Raises :class:`MetricsError`
  if a sink (or making a record) failed since the last flush (each
  failure is also logged with its traceback when it happens), and
  ``TimeoutError`` after ``timeout`` seconds."""
  _pipeline.flush(timeout)


def configure(
  *,
  max_pending: int | None = None,
  overflow: str | None = None,
  interval: float | None = None,
) -> None:
  """The writer's settings (those not given are kept).

  Args:
    max_pending: how many taps may wait for the writer (default 100,000).
    overflow: what a tap does when that many wait: ``"block"`` (default:
      it waits for the writer; nothing is lost, and the loop slows down to
      the sinks' pace once hostcb's tap queue is full too) or ``"drop"``
      (it is dropped and counted in :func:`stats`, with a warning at the
      next :func:`flush`).
    interval: seconds between the writer's batches (default 1.0); it also
      wakes once 8,192 taps wait, and at :func:`flush`.
  """
  _pipeline.configure(max_pending, overflow, interval)


def stats() -> dict:
  """Counts since the start: ``taps`` (taken by the writer), ``records``
  (handed to the sinks), ``dropped`` (``overflow="drop"``), ``no_sink``
  (records made while no sink was added), ``pending`` (taps waiting)."""
  return _pipeline.stats()
