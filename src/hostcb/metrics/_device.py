"""The device's side of ``hostcb.metrics.log``: what is tapped, and where.

A ``log`` call taps ``(step, values)`` once per step with
:func:`hostcb.id_tap`, which never makes the device wait for Python.
In per-device code (``pmap``, ``shard_map``: the axes of the mesh that
are manual while tracing), the values are first reduced over those axes
on the device (``reduce="mean"``: ``lax.pmean``; ``"each"``:
``lax.all_gather``, one value per device), and only the mesh's first
device taps, inside a ``lax.cond``: one record per step, made where the
first device is (in a cluster, the process that owns it).  Under ``vmap``
the host reduces over the batch (:mod:`._records`).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hostcb import _jax_internals as ji
from hostcb.host_callback import id_tap
from hostcb.metrics import _pipeline
from hostcb.metrics._records import REDUCTIONS, RESERVED, Site

__all__ = ["log"]


def _flatten(values, prefix: str, out: dict) -> None:
  for key, value in values.items():
    if not isinstance(key, str):
      raise TypeError(
        f"hostcb.metrics.log: metric names must be str; got {key!r}"
      )
    name = f"{prefix}{key}"
    if isinstance(value, Mapping):
      _flatten(value, name + "/", out)
    else:
      out[name] = value


def _manual_axes() -> tuple[tuple[str, ...], int]:
  """The mesh axes that are manual here (per-device code) and how many
  devices they span; ``((), 1)`` in ordinary code."""
  get_mesh = getattr(jax.sharding, "get_abstract_mesh", None)
  if get_mesh is None:  # a JAX without abstract meshes: see docs/metrics.md
    return (), 1
  mesh = get_mesh()
  axes = tuple(getattr(mesh, "manual_axes", ()) or ())
  if not axes:
    return (), 1
  shape = dict(mesh.shape)
  return axes, math.prod(shape[a] for a in axes)


def _as_metric(name: str, value):
  x = jnp.asarray(value)
  if not (
    jnp.issubdtype(x.dtype, jnp.number) or jnp.issubdtype(x.dtype, jnp.bool_)
  ):
    raise TypeError(
      f"hostcb.metrics.log: metric {name!r} must be numeric; "
      f"got dtype {x.dtype}"
    )
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    raise TypeError(
      f"hostcb.metrics.log: metric {name!r} is complex "
      f"({x.dtype}); log its real and imaginary parts"
    )
  return x


def _reduce_on_devices(xs: list, axes: tuple, reduce: str) -> list:
  if reduce == "each":
    return [lax.all_gather(x, axes) for x in xs]
  if reduce == "first":
    return xs
  if reduce == "mean":
    xs = [
      x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
      for x in xs
    ]
    return list(lax.pmean(xs, axes))
  if reduce == "sum":
    return list(lax.psum(xs, axes))
  if reduce == "max":
    return list(lax.pmax(xs, axes))
  return list(lax.pmin(xs, axes))


def log(values: Mapping[str, Any], step, *, reduce: str = "mean") -> None:
  """Logs the metrics ``values`` for step ``step`` to the sinks added
  with :func:`hostcb.metrics.add_sink`.

  Works eagerly and inside ``jit``, ``scan``, ``fori_loop``,
  ``while_loop``, ``cond``, ``vmap``, ``pmap``, ``shard_map`` and sharded
  ``jit``; the device never waits for the sinks (the values are tapped
  with :func:`hostcb.id_tap` and written on the host, in batches, by
  hostcb.metrics' writer thread).

  Args:
    values: a dict of metric name to value: a number or an array (a
      scalar is written as a number, an array as an array: a histogram in
      TensorBoard).  Nested dicts give names joined by ``/``.
    step: the step, a Python int or an integer value of the device (e.g.
      a counter in a loop's carry).
    reduce: how one record per step is made from several values of a
      metric: those of the devices under ``pmap``/``shard_map`` (on the
      device, over the mesh's manual axes) and those of the elements of a
      ``vmap`` batch (on the host): ``"mean"`` (default), ``"sum"``,
      ``"max"``, ``"min"``, ``"first"`` (the first device's or element's),
      or ``"each"``: no reduction, one metric per device
      (``name/device_i``, ``i`` the device's index along the mapped axes)
      and per batch element (``name/batch_i``).
  """
  if not isinstance(values, Mapping):
    raise TypeError(
      "hostcb.metrics.log: values must be a dict of metric "
      f"name to value; got {type(values).__name__}"
    )
  if reduce not in REDUCTIONS:
    raise ValueError(
      f"hostcb.metrics.log: reduce must be one of "
      f"{', '.join(map(repr, REDUCTIONS))}; got {reduce!r}"
    )
  flat: dict = {}
  _flatten(values, "", flat)
  if not flat:
    raise ValueError("hostcb.metrics.log: no metric to log (values is empty)")
  for name in flat:
    if name in RESERVED:
      raise ValueError(
        f"hostcb.metrics.log: {name!r} cannot name a metric "
        f"(the sinks write the record's {name} under it)"
      )
  names = tuple(flat)
  if not any(ji.is_tracer(v) for v in (step, *flat.values())):
    # Eager (or constants only): one dispatch of the same code, jitted,
    # instead of an eager dispatch per operation.
    _staged(step, tuple(flat.values()), names=names, reduce=reduce)
    return
  xs = [_as_metric(n, v) for n, v in flat.items()]
  step = jnp.asarray(step)
  if not jnp.issubdtype(step.dtype, jnp.integer) or step.ndim != 0:
    raise TypeError(
      "hostcb.metrics.log: step must be an integer scalar; "
      f"got {step.dtype}{list(step.shape)}"
    )
  axes, n_devices = _manual_axes()
  devices_each = n_devices if axes and reduce == "each" else 0
  shapes = tuple(tuple(np.shape(x)) for x in xs)
  _pipeline.note_traced()
  if axes:
    xs = _reduce_on_devices(xs, axes, reduce)
  packed = _pack(step, xs)
  if packed is None:
    site = Site(names, reduce, devices_each, shapes, None)
    operand = (step, tuple(xs))
  else:
    kinds, operand = packed
    site = Site(names, reduce, devices_each, shapes, kinds)
  if not axes:
    id_tap(site, operand)
    return
  first = jnp.all(jnp.stack([lax.axis_index(a) == 0 for a in axes]))
  lax.cond(first, lambda o: id_tap(site, o), lambda o: o, operand)


@functools.partial(jax.jit, static_argnames=("names", "reduce"))
def _staged(step, xs, *, names, reduce):
  log(dict(zip(names, xs)), step, reduce=reduce)


# Scalars of these dtypes travel as one uint32 vector: their bits as they
# are ("f": float32, "i": int32, "u": uint32; "b": a bool as int32, which
# the host makes a bool again), after exact conversions.
_KINDS = {
  np.dtype(np.float32): ("f", None),
  np.dtype(np.int32): ("i", None),
  np.dtype(np.uint32): ("u", None),
  np.dtype(jnp.bfloat16): ("f", jnp.float32),
  np.dtype(np.float16): ("f", jnp.float32),
  np.dtype(np.bool_): ("b", jnp.int32),
  np.dtype(np.int8): ("i", jnp.int32),
  np.dtype(np.int16): ("i", jnp.int32),
  np.dtype(np.uint8): ("i", jnp.int32),
  np.dtype(np.uint16): ("i", jnp.int32),
}


def _pack(step, xs) -> tuple[str, Any] | None:
  """``(kinds, vector)``: the step and scalar metrics as one ``uint32``
  vector, which the host takes in one array per tap and stacks in bulk;
  None where a value is an array or of a 64-bit dtype."""
  kinds, words = [], []
  for x in [step, *xs]:
    kind = _KINDS.get(np.dtype(x.dtype))
    if kind is None or np.ndim(x) != 0:
      return None
    if kind[1] is not None:
      x = x.astype(kind[1])
    kinds.append(kind[0])
    words.append(lax.bitcast_convert_type(x, jnp.uint32))
  return "".join(kinds), jnp.stack(words)
