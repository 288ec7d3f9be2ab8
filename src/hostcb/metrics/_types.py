"""The types that the sinks and the API share."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

__all__ = ["Record", "MetricsError", "Columns", "Batch"]


class MetricsError(RuntimeError):
  """A record could not be made, or a sink failed (raised by
  :func:`hostcb.metrics.flush`, the cause chained)."""


class Record(NamedTuple):
  """One step's metrics: ``values`` maps each name to a Python number
  (a scalar metric) or a NumPy array; ``wall_time``: when the host
  received it (seconds since the epoch)."""

  step: int
  values: dict
  wall_time: float


class Columns(NamedTuple):
  """Records of one ``log`` site, in columns: ``steps`` (int64) and
  ``wall_times`` (float64) arrays, and one array per name in ``names``
  (scalar metrics only)."""

  names: tuple
  steps: Any
  wall_times: Any
  columns: list

  def records(self) -> list:
    names = self.names
    return [
      Record(s, dict(zip(names, vals)), w)
      for s, w, vals in zip(
        self.steps.tolist(),
        self.wall_times.tolist(),
        zip(*[c.tolist() for c in self.columns]),
      )
    ]


class Batch(Sequence):
  """What a sink's ``write`` gets: a sequence of :class:`Record` s (made
  when first read).  A sink that can use columns (TensorBoard's) reads
  :meth:`parts` instead: :class:`Columns` runs and lists of records, in
  order."""

  def __init__(self, parts: list):
    self._parts = parts
    self._records: list | None = None

  def parts(self) -> list:
    return self._parts

  def _all(self) -> list:
    if self._records is None:
      out: list = []
      for p in self._parts:
        out += p.records() if type(p) is Columns else p
      self._records = out
    return self._records

  def __len__(self) -> int:
    if self._records is not None:
      return len(self._records)
    return sum(
      len(p.steps) if type(p) is Columns else len(p) for p in self._parts
    )

  def __getitem__(self, i):
    return self._all()[i]

  def __iter__(self) -> Iterator:
    return iter(self._all())
