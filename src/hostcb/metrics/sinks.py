"""The interface of a sink, and the sinks that need no optional package.

:class:`Sink` documents the three calls a sink gets; :class:`FileSink`
adds what every sink that writes one file shares (the file opened at the
first write, its flush and close), for :class:`JsonLines`, :class:`CSV`
and :class:`~hostcb.metrics.TensorBoard`; :class:`Callback` makes a
plain function a sink.
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

__all__ = ["Sink", "FileSink", "JsonLines", "CSV", "Callback"]


class Sink:
  """What :mod:`hostcb.metrics` asks of a sink: ``write``, ``flush`` and
  ``close``.

  A sink is any object with these three methods (it need not derive from
  this class, whose ``flush`` does nothing and whose ``close`` flushes).
  hostcb.metrics calls them one at a time:

  * :meth:`write` on its writer thread, with each batch of records;
  * :meth:`flush` on its writer thread, once the records logged before a
    :func:`hostcb.metrics.flush` (or the exit) are written;
  * :meth:`close` once, after the last write and flush: from
    :func:`hostcb.metrics.remove_sink` (in the caller's thread) or at
    interpreter exit.

  What a sink raises is logged with its traceback and raised by the next
  :func:`hostcb.metrics.flush` as :class:`~hostcb.metrics.MetricsError`;
  the other sinks still get every record.
  """

  def write(self, records: list) -> None:
    """Writes a batch: a sequence of :class:`~hostcb.metrics.Record` s,
    every record that arrived since the last call, in order."""
    raise NotImplementedError

  def flush(self) -> None:
    """Makes what was written so far durable (or visible)."""

  def close(self) -> None:
    """Flushes, and releases what the sink holds; no call follows."""
    self.flush()


class FileSink(Sink):
  """A sink that writes one file, opened at its first write: a process
  that writes nothing (process 1 of a cluster, by default) leaves the
  path alone.  A subclass defines :meth:`open_file` and writes to
  :meth:`file`; this class flushes and closes the file."""

  _file = None  # the open file, from the first write on

  def open_file(self):
    """Opens the file (and writes its header, if it has one); returns
    the file object."""
    raise NotImplementedError

  def file(self):
    """The file, opened by :meth:`open_file` at the first call."""
    if self._file is None:
      self._file = self.open_file()
    return self._file

  def flush(self) -> None:
    if self._file is not None:
      self._file.flush()

  def close(self) -> None:
    if self._file is not None and not self._file.closed:
      self._file.close()


def _jsonable(v):
  if isinstance(v, np.ndarray):
    return v.tolist()
  return v


class JsonLines(FileSink):
  """One JSON object per record and line:
  ``{"step": 3, "wall_time": 1.7e9, "loss": 0.25, ...}`` (arrays as
  lists; NaN and infinities as JSON's common extensions ``NaN``,
  ``Infinity``, which Python's ``json`` and pandas read).  Appends to
  ``path`` if it exists; the file is opened at the first write (a
  process that writes nothing, e.g. process 1 of a cluster, leaves it
  alone)."""

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)

  def open_file(self):
    return open(self.path, "a", encoding="utf-8")

  def write(self, records: list) -> None:
    file = self.file()
    dumps = json.dumps
    lines = []
    for r in records:
      d = {"step": r.step, "wall_time": r.wall_time}
      for k, v in r.values.items():
        d[k] = _jsonable(v)
      lines.append(dumps(d))
    lines.append("")
    file.write("\n".join(lines))

  def __repr__(self) -> str:
    return f"JsonLines({self.path!r})"


def _cell(v) -> str:
  if isinstance(v, np.ndarray):
    return json.dumps(v.tolist())
  if isinstance(v, float) and not math.isfinite(v):
    return repr(v)  # nan, inf, -inf: what float() reads back
  return str(v)


class CSV(FileSink):
  """A table: ``step``, ``wall_time``, then one column per metric name in
  the order first seen; a record without a metric leaves its cell empty.
  A name that first appears after rows were written rewrites the file
  with the wider header (once per new name).  Arrays are written as JSON
  lists.  The file is created (replaced) at the first write."""

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    self._columns: list[str] = []
    self._index: dict = {}
    self._rows = 0
    self._lock = threading.Lock()

  def open_file(self):
    return open(self.path, "w", newline="", encoding="utf-8")

  def write(self, records: list) -> None:
    with self._lock:
      file = self.file()
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
      file.write(out.getvalue())
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
