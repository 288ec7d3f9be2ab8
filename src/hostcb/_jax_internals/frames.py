"""What a breakpoint needs from JAX's internals: which stack frames are
JAX's own, and which tracers belong to the computation being staged now.

Part of :mod:`hostcb._jax_internals`, the only place that imports ``jax._src``;
checked against jax 0.10.2.
"""

from __future__ import annotations

import types

from jax._src import core as _core
from jax._src import traceback_util as _traceback_util
from jax._src.interpreters import partial_eval as _pe

# The staged functions whose trace JAX caches with what it closed over
# (``jit`` and ``pmap``): a tracer of a trace outside such a one must not
# be captured inside it, or the cached trace holds it (a tracer leak at
# the next call).  The bodies of ``scan``, ``cond``, ``while_loop``...
# take what they close over as operands of each use, so tracers of the
# function around them can be captured.
_CACHED_TRACES = frozenset({"jit", "pmap"})


def include_frame(frame: types.FrameType) -> bool:
  """Whether JAX's traceback filtering keeps ``frame`` (not JAX's own, nor
  a library's that registered itself with JAX's filter)."""
  return _traceback_util.include_frame(frame)


def _staged_here() -> set[int]:
  """The ids of the traces whose tracers can be operands of what is bound
  now: the current trace and its parents, up to the innermost trace of a
  function that JAX caches (:data:`_CACHED_TRACES`)."""
  here = set()
  trace = _core.trace_ctx.trace
  while trace is not None:
    here.add(id(trace))
    if isinstance(trace, _pe.DynamicJaxprTrace):
      info = getattr(trace.frame, "debug_info", None)
      if getattr(info, "traced_for", None) in _CACHED_TRACES:
        break
    trace = getattr(trace, "parent_trace", None)
  return here


def tracer_kinds(values: list) -> list[str]:
  """For each value: ``"here"`` for a tracer of the computation staged now
  (see :func:`_staged_here`), ``"outside"`` for a tracer of another,
  ``"value"`` for anything else."""
  here = None
  kinds = []
  for v in values:
    if not isinstance(v, _core.Tracer):
      kinds.append("value")
      continue
    if here is None:
      here = _staged_here()
    kinds.append(
      "here" if id(getattr(v, "_trace", None)) in here else "outside"
    )
  return kinds


def is_staging() -> bool:
  """Whether a trace is active (what is bound now is staged or
  transformed), not eager evaluation."""
  return not isinstance(_core.trace_ctx.trace, _core.EvalTrace)
