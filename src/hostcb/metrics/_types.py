"""The types that the sinks and the API share."""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["Record", "MetricsError"]


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
