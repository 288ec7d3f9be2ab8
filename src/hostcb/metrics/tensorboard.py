"""``TensorBoard(logdir)``: TensorBoard event files, encoded in bulk.

The file is what TensorBoard's own writers make: TFRecord-framed
``Event`` protocol buffers, the first one naming the file version
(``brain.Event:2``), in ``logdir/events.out.tfevents.<time>.<host>.<pid>
.<n>``.  Scalar metrics are ``simple_value`` summaries, one ``Event`` per
record; arrays are histograms (TensorBoard's ``histogram_pb``).

Encoding one ``Event`` per value through the protocol buffer classes and
a pure-Python CRC costs tens of microseconds per step, on the same cores
as the training step.  Here a batch's scalar events are built at once
with NumPy: runs of records that share their metric names (and the byte
length of their step) have one layout, made once and cached, whose
constant bytes are copied and whose wall times, steps and values are
written column-wise.  Their CRC-32C (the TFRecord checksums) are not
computed over every byte: a CRC is affine in the message, so the CRC of
an event is the CRC of its layout with the variable bytes zero, xor what
each variable byte adds at its place (a table of 256 per place, made with
the layout): one lookup per variable byte (the wall time's 8, the step's,
4 per value), column-wise, instead of one per byte of the event.  The
bytes are those that the protocol buffer library and TensorBoard's own
record writer give for the same ``Event`` (tests/test_metrics.py checks
it).

Needs the ``tensorboard`` package (``pip install hostcb[tensorboard]``)
for its protocol buffers, used for the file's header and histograms.
"""

from __future__ import annotations

import functools
import itertools
import os
import socket
import time
from typing import NamedTuple

import numpy as np

from hostcb.metrics._types import Batch, Columns
from hostcb.metrics.sinks import FileSink

__all__ = ["TensorBoard", "crc32c", "encode_scalar_events"]

_MISSING = (
  "hostcb.metrics.TensorBoard needs the tensorboard package, "
  "which is not installed: pip install hostcb[tensorboard]  (or: "
  "pip install tensorboard)"
)


def _protos():
  try:
    from tensorboard.compat.proto import (  # noqa: PLC0415  (optional)
      event_pb2,
      summary_pb2,
    )
  except ImportError as e:
    raise ImportError(_MISSING) from e
  return event_pb2, summary_pb2


# ------------------------------------------------------------ CRC-32C
def _crc_table() -> np.ndarray:
  table = np.arange(256, dtype=np.uint32)
  for _ in range(8):
    table = np.where(
      table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1
    ).astype(np.uint32)
  return table


_TABLE = _crc_table()
_MASK_DELTA = np.uint32(0xA282EAD8)


def crc32c(rows: np.ndarray) -> np.ndarray:
  """The CRC-32C (Castagnoli) of each row of a 2-D ``uint8`` array."""
  crc = np.full(rows.shape[0], 0xFFFFFFFF, dtype=np.uint32)
  table = _TABLE
  for j in range(rows.shape[1]):
    crc = table[(crc ^ rows[:, j]) & 0xFF] ^ (crc >> 8)
  return crc ^ np.uint32(0xFFFFFFFF)


def _masked(crc: np.ndarray) -> np.ndarray:
  return (((crc >> 15) | (crc << 17)) + _MASK_DELTA).astype(np.uint32)


def _frame(events: np.ndarray) -> bytes:
  """TFRecord frames of the rows of ``events`` (``uint8``, one event of
  equal length per row): length, its masked CRC, data, its masked CRC."""
  n, length = events.shape
  out = np.empty((n, 16 + length), dtype=np.uint8)
  out[:, :12] = _length_header(length)
  out[:, 12 : 12 + length] = events
  out[:, 12 + length :] = (
    _masked(crc32c(events)).astype("<u4").view(np.uint8).reshape(n, 4)
  )
  return out.tobytes()


def _frame_one(data: bytes) -> bytes:
  return _frame(np.frombuffer(data, np.uint8)[None, :])


def _length_header(length: int) -> np.ndarray:
  """A frame's first 12 bytes: the data's length and its masked CRC."""
  header = np.frombuffer(np.uint64(length).astype("<u8").tobytes(), np.uint8)
  crc = _masked(crc32c(header[None, :])).astype("<u4")
  return np.concatenate([header, crc.view(np.uint8)])


def _byte_shares(length: int, offsets: np.ndarray) -> np.ndarray:
  """What a byte at each of ``offsets`` of a ``length``-byte message adds
  to its CRC-32C (one row of 256 per offset, by the byte's value): the
  CRC is affine in the message, so the CRC of a message that differs from
  another only at these offsets is the other's CRC xor these shares of
  the bytes that differ (zero bytes adding nothing)."""
  # A byte b alone, then z zero bytes, leaves the register (from zero, no
  # final xor) at _TABLE[b] advanced over z zeros.
  row_of = {length - 1 - int(o): j for j, o in enumerate(offsets)}
  shares = np.empty((len(offsets), 256), np.uint32)
  reg = _TABLE.copy()
  for zeros_after in range(max(row_of) + 1):
    if zeros_after in row_of:
      shares[row_of[zeros_after]] = reg
    reg = _TABLE[reg & 0xFF] ^ (reg >> 8)
  return shares


# ----------------------------------------------- protocol buffer bytes
def _varint(n: int) -> bytes:
  n &= (1 << 64) - 1
  out = bytearray()
  while True:
    b = n & 0x7F
    n >>= 7
    if n:
      out.append(b | 0x80)
    else:
      out.append(b)
      return bytes(out)


def _varint_len(steps: np.ndarray) -> np.ndarray:
  """The varint byte length of each int64 step (0: the field is left out,
  as proto3 leaves out a zero step)."""
  u = steps.astype(np.int64).view(np.uint64)
  lengths = np.ones(u.shape, np.int64)
  for k in range(1, 10):
    lengths += u >= np.uint64(1 << (7 * k))
  return np.where(steps == 0, 0, lengths)


class _Layout(NamedTuple):
  """The framed event of some scalar names and step length: ``frame``,
  its bytes with the wall time, step, values and data CRC zero; the
  offsets in it of the step (None: no step), each value and the variable
  bytes (``variable``: the wall time's, the step's and the values');
  ``shares``, what each variable byte adds to the data's CRC
  (:func:`_byte_shares`), and ``crc``, the data's CRC with every variable
  byte zero."""

  frame: np.ndarray
  step_at: int | None
  value_at: list
  variable: np.ndarray
  shares: np.ndarray
  crc: np.uint32


# Cached: a layout's tables are made once (a pass over its event's bytes)
# and then serve every batch; 64 layouts (each about 1 KB per varying byte)
# hold the log sites of most programs.
@functools.lru_cache(maxsize=64)
def _layout(names: tuple, step_len: int) -> _Layout:
  summary = bytearray()
  value_offsets = []
  for name in names:
    tag = name.encode()
    value = b"\x0a" + _varint(len(tag)) + tag + b"\x15"
    summary += b"\x0a" + _varint(len(value) + 4) + value
    value_offsets.append(len(summary))
    summary += b"\0\0\0\0"
  head = bytearray(b"\x09" + b"\0" * 8)
  step_offset = None
  if step_len:
    head += b"\x10"
    step_offset = len(head)
    head += b"\0" * step_len
  head += b"\x2a" + _varint(len(summary))
  event = np.frombuffer(bytes(head + summary), np.uint8)
  base = len(head)
  variable = list(range(1, 9)) + [
    base + o + k for o in value_offsets for k in range(4)
  ]
  if step_len:
    variable += range(step_offset, step_offset + step_len)
  variable = np.array(sorted(variable), np.int64)
  frame = np.concatenate(
    [_length_header(event.size), event, np.zeros(4, np.uint8)]
  )
  return _Layout(
    frame,
    None if step_offset is None else 12 + step_offset,
    [12 + base + o for o in value_offsets],
    12 + variable,
    _byte_shares(event.size, variable),
    crc32c(event[None, :])[0],
  )


def _scalar_frames(names: tuple, step_len: int, steps, walls, vals) -> bytes:
  """The framed events of records of one :func:`_layout` (see
  :func:`encode_scalar_events`)."""
  lay = _layout(names, step_len)
  n = len(steps)
  rows = np.empty((n, lay.frame.size), np.uint8)
  rows[:] = lay.frame
  # The wall time is at 1 in the event, after the frame's 12 bytes.
  rows[:, 13:21] = walls.view(np.uint8).reshape(n, 8)
  if step_len:
    u = steps.view(np.uint64)
    for k in range(step_len):
      b = ((u >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
      if k < step_len - 1:
        b |= np.uint8(0x80)
      rows[:, lay.step_at + k] = b
  v = vals.view(np.uint8).reshape(n, len(names), 4)
  for j, at in enumerate(lay.value_at):
    rows[:, at : at + 4] = v[:, j]
  # The data's CRC: the zeroed event's, xor the shares of its variable
  # bytes (one lookup per variable byte, over all the records at once).
  crc = np.full(n, lay.crc, np.uint32)
  for at, shares in zip(lay.variable, lay.shares):
    crc ^= shares.take(rows[:, at])
  rows[:, -4:] = _masked(crc).astype("<u4").view(np.uint8).reshape(n, 4)
  return rows.tobytes()


def encode_scalar_events(names: tuple, steps, wall_times, values) -> bytes:
  """The framed ``Event`` s of records with the scalar metrics ``names``:
  ``steps`` (ints), ``wall_times`` (floats) and ``values`` (rows of
  floats, one column per name), in order."""
  steps = np.asarray(steps, np.int64)
  walls = np.ascontiguousarray(wall_times, "<f8")
  vals = np.ascontiguousarray(values, "<f4").reshape(len(steps), len(names))
  lengths = _varint_len(steps)
  cuts = np.flatnonzero(np.diff(lengths)) + 1
  out = []
  for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(steps)]):
    out.append(
      _scalar_frames(
        names, int(lengths[lo]), steps[lo:hi], walls[lo:hi], vals[lo:hi]
      )
    )
  return b"".join(out)


# ---------------------------------------------------------------- sink
_file_numbers = itertools.count()


class TensorBoard(FileSink):
  """Writes the records to a TensorBoard event file in ``logdir``
  (created if needed): scalars as ``simple_value`` summaries, arrays as
  histograms (``buckets`` buckets).  View with ``tensorboard --logdir
  LOGDIR``.  The file is made at the first write: a process that writes
  nothing (process 1 of a cluster, by default) makes none."""

  def __init__(
    self,
    logdir: str | os.PathLike,
    *,
    buckets: int = 30,
    filename_suffix: str = "",
  ):
    event_pb2, summary_pb2 = _protos()
    self._event_pb2, self._summary_pb2 = event_pb2, summary_pb2
    self.logdir = os.fspath(logdir)
    self.buckets = buckets
    self._suffix = filename_suffix
    self.path: str | None = None  # the event file, made at the first write

  def open_file(self):
    os.makedirs(self.logdir, exist_ok=True)
    now = time.time()
    self.path = os.path.join(
      self.logdir,
      f"events.out.tfevents.{int(now):010d}."
      f"{socket.gethostname()}.{os.getpid()}.{next(_file_numbers)}"
      f"{self._suffix}",
    )
    file = open(self.path, "wb")
    header = self._event_pb2.Event(wall_time=now, file_version="brain.Event:2")
    file.write(_frame_one(header.SerializeToString()))
    return file

  def write(self, records) -> None:
    file = self.file()
    parts = records.parts() if isinstance(records, Batch) else [records]
    chunks = []
    for part in parts:
      if type(part) is Columns:
        values = np.stack(part.columns, axis=1).astype(np.float32)
        chunks.append(
          encode_scalar_events(part.names, part.steps, part.wall_times, values)
        )
      else:
        self._write_records(part, chunks)
    file.write(b"".join(chunks))

  def _write_records(self, records: list, chunks: list) -> None:
    run_names = None
    run: list = []
    for r in records:
      values = r.values
      names = tuple(k for k, v in values.items() if type(v) is not np.ndarray)
      if names != run_names:
        if run:
          chunks.append(self._scalars(run_names, run))
        run_names, run = names, []
      if names:
        run.append(r)
      if len(names) != len(values):  # arrays: after the record's scalars
        if run:
          chunks.append(self._scalars(run_names, run))
          run = []
        chunks.append(self._histograms(r))
    if run:
      chunks.append(self._scalars(run_names, run))

  @staticmethod
  def _scalars(names: tuple, run: list) -> bytes:
    return encode_scalar_events(
      names,
      [r.step for r in run],
      [r.wall_time for r in run],
      [[float(r.values[k]) for k in names] for r in run],
    )

  def _histograms(self, r) -> bytes:
    from tensorboard.plugins.histogram import (  # noqa: PLC0415  (arrays
      summary_v2,
    )  # only)

    out = []
    for k, v in r.values.items():
      if type(v) is np.ndarray:
        summary = summary_v2.histogram_pb(
          k, v.astype(np.float64), buckets=self.buckets
        )
        event = self._event_pb2.Event(
          wall_time=r.wall_time, step=r.step, summary=summary
        )
        out.append(_frame_one(event.SerializeToString()))
    return b"".join(out)

  def __repr__(self) -> str:
    return f"TensorBoard({self.logdir!r})"
