"""The sinks that need no optional package: files and plain callables.

A sink is any object with ``write(records)``, ``flush()`` and
``close()``; the writer thread calls ``write`` with a list of
:class:`~hostcb.metrics.Record` s (a batch: every record that arrived
since the last call), ``flush`` from :func:`hostcb.metrics.flush` and at
exit, ``close`` from :func:`hostcb.metrics.remove_sink` and at exit.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import threading
from typing import Callable

import numpy as np

__all__ = ["Sink", "JsonLines", "CSV", "Callback"]


class Sink:
  """The base of hostcb's sinks (a sink need not derive from it)."""

  def write(self, records: list) -> None:
    raise NotImplementedError

  def flush(self) -> None:
    pass

  def close(self) -> None:
    self.flush()


def _jsonable(v):
  if isinstance(v, np.ndarray):
    return v.tolist()
  return v


class JsonLines(Sink):
  """One JSON object per record and line:
  ``{"step": 3, "wall_time": 1.7e9, "loss": 0.25, ...}`` (arrays as
  lists; NaN and infinities as JSON's common extensions ``NaN``,
  ``Infinity``, which Python's ``json`` and pandas read).  Appends to
  ``path`` if it exists; the file is opened at the first write (a
  process that writes nothing, e.g. process 1 of a cluster, leaves it
  alone)."""

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    self._file = None

  def write(self, records: list) -> None:
    if self._file is None:
      self._file = open(self.path, "a", encoding="utf-8")
    dumps = json.dumps
    lines = []
    for r in records:
      d = {"step": r.step, "wall_time": r.wall_time}
      for k, v in r.values.items():
        d[k] = _jsonable(v)
      lines.append(dumps(d))
    lines.append("")
    self._file.write("\n".join(lines))

  def flush(self) -> None:
    if self._file is not None:
      self._file.flush()

  def close(self) -> None:
    if self._file is not None and not self._file.closed:
      self._file.close()

  def __repr__(self) -> str:
    return f"JsonLines({self.path!r})"


def _cell(v) -> str:
  if isinstance(v, np.ndarray):
    return json.dumps(v.tolist())
  if isinstance(v, float) and not math.isfinite(v):
    return repr(v)  # nan, inf, -inf: what float() reads back
  return str(v)


class CSV(Sink):
  """A table: ``step``, ``wall_time``, then one column per metric name in
  the order first seen; a record without a metric leaves its cell empty.
  A name that first appears after rows were written rewrites the file
  with the wider header (once per new name).  Arrays are written as JSON
  lists.  The file is created (replaced) at the first write."""

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    self._columns: list[str] = []
    self._index: dict = {}
    self._file = None
    self._rows = 0
    self._lock = threading.Lock()

  def write(self, records: list) -> None:
    with self._lock:
      if self._file is None:
        self._file = open(self.path, "w", newline="", encoding="utf-8")
      new = [k for r in records for k in r.values if k not in self._index]
      if new:
        self._widen(list(dict.fromkeys(new)))
      index = self._index
      width = len(self._columns)
      out = io.StringIO()
      w = csv.writer(out)
      rows = []
      for r in records:
        row = [""] * width
        row[0] = str(r.step)
        row[1] = repr(r.wall_time)
        for k, v in r.values.items():
          row[index[k]] = _cell(v)
        rows.append(row)
      w.writerows(rows)
      self._file.write(out.getvalue())
      self._rows += len(rows)

  def _widen(self, new: list) -> None:
    old_width = len(self._columns)
    if not self._columns:
      self._columns = ["step", "wall_time"]
      old_width = 0
    for k in new:
      self._index[k] = len(self._columns)
      self._columns.append(k)
    if self._rows == 0:
      self._file.seek(0)
      self._file.truncate()
      csv.writer(self._file).writerow(self._columns)
      return
    # Rows were written under the narrower header: rewrite the file.
    self._file.flush()
    with open(self.path, newline="", encoding="utf-8") as f:
      rows = list(csv.reader(f))[1:]
    pad = len(self._columns) - old_width
    self._file.seek(0)
    self._file.truncate()
    w = csv.writer(self._file)
    w.writerow(self._columns)
    w.writerows(row + [""] * pad for row in rows)

  def flush(self) -> None:
    if self._file is not None:
      self._file.flush()

  def close(self) -> None:
    if self._file is not None and not self._file.closed:
      self._file.close()

  def __repr__(self) -> str:
    return f"CSV({self.path!r})"


class Callback(Sink):
  """A plain function as a sink: ``func(step, values)`` per record
  (``values``: the record's dict of name to number or array).
  :func:`hostcb.metrics.add_sink` wraps a callable in it."""

  def __init__(self, func: Callable[[int, dict], object]):
    if not callable(func):
      raise TypeError(f"a sink function must be callable; got {func!r}")
    self.func = func

  def write(self, records: list) -> None:
    func = self.func
    for r in records:
      func(r.step, r.values)

  def __repr__(self) -> str:
    return f"Callback({self.func!r})"
