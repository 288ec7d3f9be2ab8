"""The engine's public face: whether it serves this process, what it
counted, and the warning and error it raises.

Everything else of the engine is internal (``hostcb._engine``).  The names
here are stable: programs and benchmarks may read them.

* :func:`available`, :func:`unavailable_reason`: whether CPU taps and calls
  go to the native engine, and if not, why (they then take XLA's Python
  callbacks, and :class:`EngineFallbackWarning` says so once);
* :func:`counters`: one device queue's counts (records in and out, bytes
  held, lock sleeps...);
* :func:`tap_fallbacks`: how many CPU taps took XLA FFI's generic decoding,
  and why the first did;
* :func:`counts_executables`: whether ids of dropped host functions are
  freed without a barrier;
* :func:`gpu_publication`: how GPU streams publish their taps;
* :class:`ProcessLocalFunctionError`: an executable calling process-local
  host functions was serialized (``hostcb.register`` is the fix).
"""

from __future__ import annotations

from hostcb._engine import (
  EngineFallbackWarning,
  ProcessLocalFunctionError,
  available,
  counters,
  tap_fallbacks,
  unavailable_reason,
)
from hostcb._engine.gpu import publication as gpu_publication
from hostcb._engine.native import counts_executables

__all__ = [
  "available",
  "unavailable_reason",
  "counters",
  "tap_fallbacks",
  "counts_executables",
  "gpu_publication",
  "EngineFallbackWarning",
  "ProcessLocalFunctionError",
]
