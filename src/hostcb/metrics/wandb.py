"""``WandB(...)``: Weights & Biases runs (``pip install hostcb[wandb]``).

Each record is one ``run.log(values, step=step)`` on the writer thread
(W&B has no call for several steps at once; it queues them to its own
service process).  Arrays are logged as ``wandb.Histogram`` s.  W&B
ignores, with its own warning, a step lower than one it already has.
"""

from __future__ import annotations

import numpy as np

from hostcb.metrics.sinks import Sink

__all__ = ["WandB"]

_MISSING = (
  "hostcb.metrics.WandB needs the wandb package, which is not "
  "installed: pip install hostcb[wandb]  (or: pip install wandb)"
)


def _wandb():
  try:
    import wandb  # noqa: PLC0415  (an optional dependency)
  except ImportError as e:
    raise ImportError(_MISSING) from e
  return wandb


class WandB(Sink):
  """Logs the records to a W&B run: ``run`` if given (left open by
  :meth:`close`), else a run started with ``wandb.init(**init)`` (e.g.
  ``project=``, ``mode="offline"``) at the first write, on hostcb.metrics'
  writer thread (a process that writes nothing, e.g. process 1 of a
  cluster, starts none), and finished by :meth:`close` (at
  :func:`hostcb.metrics.remove_sink` or at exit)."""

  def __init__(self, run=None, **init):
    self._wandb = _wandb()
    self._owns = run is None
    self._init = init
    self.run = run

  def write(self, records: list) -> None:
    if self.run is None:
      self.run = self._wandb.init(**self._init)
    log, histogram = self.run.log, self._wandb.Histogram
    for r in records:
      values = {
        k: histogram(v) if type(v) is np.ndarray else v
        for k, v in r.values.items()
      }
      log(values, step=r.step)

  def close(self) -> None:
    if self._owns and self.run is not None:
      run, self.run = self.run, None
      run.finish()

  def __repr__(self) -> str:
    return f"WandB({getattr(self.run, 'name', None)!r})"
