"""Records: what the sinks get, made on the host from what a site tapped.

A :class:`Site` is one ``hostcb.metrics.log`` call as traced (its metric
names, reduction and shapes); it is the tap function, hashable by value,
so that the same ``log`` on the same shapes reuses JAX's compilation
caches (eagerly too).  Its tap puts the raw operands in the pipeline
(:mod:`._pipeline`); the writer thread turns them into :class:`Record` s
here, reducing over ``vmap`` batches.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from typing import Any

import numpy as np

from hostcb.metrics import _pipeline
from hostcb.metrics._types import Columns, MetricsError, Record

__all__ = ["Record", "Site", "REDUCTIONS", "RESERVED", "MetricsError"]

REDUCTIONS = ("mean", "sum", "max", "min", "first", "each")
RESERVED = ("step", "wall_time")


def _scalar(a):
  a = np.asarray(a)
  return a.item() if a.ndim == 0 else a


_operand_of = operator.itemgetter(1)  # of a queued tap (._pipeline.put)
_wall_of = operator.itemgetter(3)

_VIEWS = {"f": np.float32, "i": np.int32, "u": np.uint32, "b": np.int32}


def _words_as(words: np.ndarray, kind: str) -> np.ndarray:
  """Packed ``uint32`` words as the values of ``kind`` they hold: a bool
  as a bool (it keeps its type in every sink)."""
  values = words.view(_VIEWS[kind])
  return values != 0 if kind == "b" else values


@dataclasses.dataclass(frozen=True)
class Site:
  """One ``log`` call as traced; called on a consumer thread as a tap
  function ``site(arg, transforms)``.  ``kinds``: the tapped operand is
  one ``uint32`` vector (the step, then the scalar metrics), whose words
  are of these kinds (``f`` float32, ``i`` int32, ``u`` uint32, ``b``
  bool); None: it is ``(step, values)``."""

  names: tuple
  reduce: str
  devices_each: int  # > 0: the values were gathered over this many devices
  shapes: tuple  # the values' shapes as logged (per device, element)
  kinds: str | None

  # The tap function: ``site(arg, transforms)`` queues the tap, in one
  # Python call (no frame of its own in between).
  __call__ = _pipeline.put

  # ---------------------------------------------- on the writer thread
  def columns(self, items: list) -> Columns:
    """The records of consecutive taps of this (packed) site without
    transforms, ``items`` as queued, in columns."""
    kinds = self.kinds
    # Each tap's operand is a fresh, contiguous uint32 vector: their bytes
    # joined in C (a third of np.concatenate's time for small vectors).
    words = np.frombuffer(b"".join(map(_operand_of, items)), np.uint32)
    words = words.reshape(len(items), len(kinds))
    steps = words[:, 0].view(_VIEWS[kinds[0]]).astype(np.int64)
    walls = np.fromiter(map(_wall_of, items), np.float64, len(items))
    cols = [_words_as(words[:, j], k) for j, k in enumerate(kinds) if j]
    return Columns(self.names, steps, walls, cols)

  def records(self, arg, transforms, wall_time: float) -> list[Record]:
    """The records of one tap (several under ``vmap`` with
    ``reduce="each"`` when the elements' steps differ)."""
    levels = [t[1]["batch_dims"] for t in transforms if t[0] == "batch"]
    if len(levels) != len(transforms):
      raise MetricsError(
        "hostcb.metrics.log: a metric was tapped under a transformation "
        f"other than vmap ({[t[0] for t in transforms]}); log primal "
        "values only"
      )
    if self.kinds is not None:
      (words,) = _batch_first([np.asarray(arg)], levels)
      leaves = [_words_as(words[..., j], k) for j, k in enumerate(self.kinds)]
    else:
      step, xs = arg
      leaves = _batch_first([np.asarray(step), *map(np.asarray, xs)], levels)
    steps, xs = leaves[0], leaves[1:]
    if not levels:
      return [Record(int(steps), self._named(xs), wall_time)]
    batch_shape = steps.shape
    if self.reduce == "each":
      by_step: dict = {}
      for idx in itertools.product(*map(range, batch_shape)):
        suffix = "/batch_" + "_".join(map(str, idx))
        values = by_step.setdefault(int(steps[idx]), {})
        for name, v in self._named([x[idx] for x in xs]).items():
          values[name + suffix] = v
      return [Record(s, v, wall_time) for s, v in by_step.items()]
    first = steps.flat[0]
    if not np.all(steps == first):
      raise MetricsError(
        f"hostcb.metrics.log: under vmap the step differs across the "
        f"batch ({sorted(set(steps.ravel().tolist()))[:8]}), so one "
        f"record with reduce={self.reduce!r} has no single step; log an "
        "unbatched step, or use reduce='each'"
      )
    axes = tuple(range(len(batch_shape)))
    reduced = [_reduce(x, axes, self.reduce) for x in xs]
    return [Record(int(first), self._named(reduced), wall_time)]

  def _named(self, xs) -> dict:
    if not self.devices_each:
      return {n: _scalar(x) for n, x in zip(self.names, xs)}
    out = {}
    for n, x in zip(self.names, xs):
      for i in range(self.devices_each):
        out[f"{n}/device_{i}"] = _scalar(x[i])
    return out


def _reduce(x: np.ndarray, axes: tuple, how: str):
  if how == "first":
    return x[(0,) * len(axes)]
  if how == "mean":
    if not np.issubdtype(x.dtype, np.floating):
      x = x.astype(np.float32)
    return np.mean(x, axis=axes, dtype=x.dtype)
  if how == "sum":  # of bools: how many are true (int32), as jnp.sum
    return np.sum(x, axis=axes, dtype=np.int32 if x.dtype == bool else x.dtype)
  if how == "max":
    return np.max(x, axis=axes)
  return np.min(x, axis=axes)


def _batch_first(leaves: list, levels: list) -> list:
  """Each leaf with its batch dimensions first, outermost ``vmap`` first,
  broadcast where a leaf is not batched at a level.  ``levels`` lists
  the batch dims per leaf, innermost ``vmap`` first, as in
  ``transforms``."""
  out = []
  outer_first = list(reversed(levels))
  for i, leaf in enumerate(leaves):
    a: Any = leaf
    missing = []
    for k, dims in enumerate(outer_first):
      d = dims[i]
      if d is None:
        a = np.expand_dims(a, k)
        missing.append(k)
      else:
        a = np.moveaxis(a, d + k, k)
    out.append((a, missing))
  n = len(levels)
  shape = [1] * n
  for a, missing in out:
    for k in range(n):
      if k not in missing:
        shape[k] = a.shape[k]
  return [
    np.broadcast_to(a, tuple(shape) + a.shape[n:]) if missing else a
    for a, missing in out
  ]
