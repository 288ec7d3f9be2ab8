"""``jax.Array`` s on the CPU made straight from the engine's host arrays.

Part of :mod:`hostcb._jax_internals`; checked against jax 0.8.0, 0.10.2
and 0.12.0.1 (run), which have the same
``xla_client.batched_device_put(aval, sharding, xs, devices, committed,
force_copy, host_buffer_semantics, enable_x64)`` (called with all eight
positional: nanobind parses keywords more slowly),
``xla_client.HostBufferSemantics.ZERO_COPY``, ``xla_client.ArrayImpl`` and
its ``_value`` (the NumPy value that ``__array__`` returns).

JAX's own callbacks hand their functions ``jax.Array`` s on the first CPU
device, made by ``jax.device_put`` of the host values: tens of
microseconds per call, mostly spent deciding what to do with the value
(its type, its sharding, the default device, the trace state).  The
values that hostcb's engine delivers need none of that: each is a
C-contiguous NumPy array of a known shape and dtype, fresh (no one else
holds it), on the host.  :func:`cpu_arrays` makes the ``jax.Array`` of each
with the one call of jaxlib that builds an array from host memory,
``batched_device_put``, given the aval, the sharding and the device, which
are looked up once per process (the device, the sharding) or once per
shape and dtype (the aval), never per call:

* the ``jax.Array`` is committed to the CPU device and not weakly typed,
  as ``jax.device_put`` of a NumPy array makes it in JAX's callbacks;
* where the memory is 64-byte aligned (the engine allocates the data of
  arrays of 1 KiB and more so), the CPU client takes it without a copy,
  and the ``jax.Array`` holds a reference to the NumPy array, which holds
  the record's memory: the array keeps its record alive;
* elsewhere (small or unaligned arrays, strided views) the client copies;
* the array has the dtype of the host array, 64-bit included, whatever
  the ``jax_enable_x64`` of the calling thread: ``enable_x64=True`` tells
  jaxlib not to narrow the data.  Without it, jaxlib reads the thread's
  setting, and a 64-bit value of a function traced under
  ``jax.enable_x64(True)`` (a setting of the tracing thread only) became,
  on hostcb's consumer thread, a ``jax.Array`` whose aval said ``float64``
  over a ``float32`` buffer: the first operation on it failed
  (``RuntimeProgramInputMismatch``).

Only arrays whose memory hostcb owns are aliased (the engine's fresh
arrays and views of them); any other array is copied, so that a later
change of a buffer that hostcb does not own can never change a value the
callback saw.  The engine never hands out memory that it reuses (its
ring): every array it delivers is a fresh copy, or a record's own block
that only the arrays over it free.

The way back, :func:`host_array`, is the NumPy value of a callback's
``jax.Array`` result, exactly what ``np.asarray`` gives, by its cheapest
route: the buffer protocol where jaxlib offers it (a view of the CPU
buffer, 0.7 µs for an f32[]), ``ArrayImpl._value`` for the ML dtypes that
the buffer protocol refuses (``bfloat16``, ``int4``, ``float8_*``: there
``np.asarray`` would try the buffer protocol, fail, then call ``_value``).
A result that *is* the argument a callback got needs no conversion at
all: its value is the host array it was made from (the callers do that
test, ``result is made``).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import numpy as np
from jax._src import core as _core
from jax._src.lib import xla_client as _xc

from hostcb._jax_internals.versions import (
  CHECKED_RANGE,
  MissingJaxInternal,
  require,
)

__all__ = [
  "cpu_array",
  "cpu_arrays",
  "bound_cpu_array",
  "host_array",
  "host_array_of",
  "prepare_cpu_arrays",
]

_WHAT = "to hand callbacks jax.Arrays made from the host values"

_lock = threading.Lock()
# Set once by prepare_cpu_arrays: jaxlib's function, the CPU device's
# sharding and the list of that one device.
_put: Any = None
_sharding: Any = None
_devices: list = []
_ZERO_COPY: Any = None  # xla_client.HostBufferSemantics.ZERO_COPY
# ...IMMUTABLE_ONLY_DURING_CALL: the memory need not stay unchanged after
# the call returns (XLA's contract; ZERO_COPY asks the caller to keep it
# unchanged as long as the array lives, even where the client copies it;
# 200 tries of 4 MiB changed right after a ZERO_COPY put never showed the
# change on jax 0.10.2, so this is the contract, not an observed race).
_ONLY_DURING_CALL: Any = None
_ARRAY_IMPL: Any = None  # xla_client.ArrayImpl
_avals: dict[tuple, Any] = {}  # (shape, dtype) -> ShapedArray
# The base of the engine's uint8 array over a record's own block (large
# taps: module.cc's "hostcb.record_block" capsule, which frees the block).
_CAPSULE = type(np.empty(0).__array_struct__)


def prepare_cpu_arrays() -> None:
  """Looks up, once, what :func:`cpu_arrays` needs; a JAX that lacks it
  fails here, with :class:`MissingJaxInternal`, when a callback that gets
  ``jax.Array`` s is traced (not in the callback, later, on the engine's
  thread).  Cheap after the first call."""
  global _put, _sharding, _devices, _ZERO_COPY, _ONLY_DURING_CALL, _ARRAY_IMPL
  if _put is not None:
    return
  with _lock:
    if _put is None:
      import jax  # noqa: PLC0415  (public API; hostcb imports it anyway)

      put = require(_xc, "batched_device_put", _WHAT, verb="uses")
      signature = str(getattr(put, "__nb_signature__", "")) + str(put.__doc__)
      if "enable_x64" not in signature:
        raise MissingJaxInternal(
          f"hostcb: jax {jax.__version__}'s "
          "xla_client.batched_device_put has no enable_x64 parameter, which "
          f"hostcb uses {_WHAT} (its 64-bit values unnarrowed). hostcb was "
          f"checked against {CHECKED_RANGE}."
        )
      semantics = require(_xc, "HostBufferSemantics", _WHAT, verb="uses")
      zero_copy = require(semantics, "ZERO_COPY", _WHAT, verb="uses")
      during_call = require(
        semantics, "IMMUTABLE_ONLY_DURING_CALL", _WHAT, verb="uses"
      )
      array_impl = require(_xc, "ArrayImpl", _WHAT, verb="uses")
      require(array_impl, "_value", _WHAT, verb="uses")
      device = jax.local_devices(backend="cpu")[0]
      _ZERO_COPY, _ONLY_DURING_CALL = zero_copy, during_call
      _ARRAY_IMPL = array_impl
      _sharding = jax.sharding.SingleDeviceSharding(device)
      _devices = [device]
      _put = put


def _new_aval(key: tuple) -> Any:
  aval = _avals[key] = _core.ShapedArray(*key)
  return aval


def cpu_array(a: Any) -> Any:
  """The ``jax.Array`` on the first local CPU device of ``a`` (a NumPy
  array, or a value ``np.asarray`` takes).

  The memory of an array that hostcb's engine made (a fresh array, whose
  ``base`` is None; a view of one, whose ``base`` is the array that owns
  the memory, the slab of small arrays included; an array over a record's
  own block, whose ``base`` is a uint8 array over the block, whose own
  ``base`` is the capsule that frees the block) is aliased
  where the CPU client can; any other array's (an array of a subclass of
  ``ndarray`` included: the buffer path's views of XLA's operands) is
  copied before this returns, so that the memory may change or go
  afterwards."""
  if _put is None:
    prepare_cpu_arrays()
  if type(a) is not np.ndarray:
    a = np.asarray(a)
  key = (a.shape, a.dtype)
  aval = _avals.get(key)
  if aval is None:
    aval = _new_aval(key)
  base = a.base
  # All eight arguments positional (committed, force_copy, semantics,
  # enable_x64): about 0.1 µs less than keywords.
  if base is None or (
    type(base) is np.ndarray
    and ((owner := base.base) is None or type(owner) is _CAPSULE)
  ):
    return _put(aval, _sharding, [a], _devices, True, False, _ZERO_COPY, True)
  return _put(
    aval, _sharding, [a], _devices, True, True, _ONLY_DURING_CALL, True
  )


def bound_cpu_array() -> Callable[[Any], Any]:
  """:func:`cpu_array` for the engine's hot paths (a callback's direct
  entry, run once per record, whose argument has the same shape and dtype
  every time): the same ``jax.Array`` of the same argument, with what it
  looks up bound once (jaxlib's function, the sharding, the device) and
  the aval of the last shape and dtype kept, the common case tested first
  (about 0.3 µs less than :func:`cpu_array`, of 3.5-4).  Safe to call
  from several threads: the kept aval is one tuple, read once."""
  if _put is None:
    prepare_cpu_arrays()
  put, sharding, devices, zero_copy = _put, _sharding, _devices, _ZERO_COPY
  ndarray, capsule = np.ndarray, _CAPSULE
  last = [((), None, None)]  # (shape, dtype, aval), replaced whole

  def bound(a):
    if type(a) is ndarray:
      base = a.base
      # As cpu_array: the engine's memory aliased (any other: cpu_array).
      if base is None or (
        type(base) is ndarray
        and ((owner := base.base) is None or type(owner) is capsule)
      ):
        kept = last[0]
        if a.dtype is not kept[1] or a.shape != kept[0]:
          key = (a.shape, a.dtype)
          aval = _avals.get(key)
          if aval is None:
            aval = _new_aval(key)
          kept = last[0] = (*key, aval)
        return put(
          kept[2], sharding, [a], devices, True, False, zero_copy, True
        )
    return cpu_array(a)

  return bound


def cpu_arrays(leaves: Sequence[Any]) -> list:
  """:func:`cpu_array` of each leaf."""
  return [cpu_array(a) for a in leaves]


def _value_or_asarray(x: Any) -> np.ndarray:
  if type(x) is _ARRAY_IMPL:
    return x._value
  return np.asarray(x)


def host_array_of(dtype: np.dtype) -> Callable[[Any], np.ndarray]:
  """:func:`host_array` for results known to be of ``dtype``, chosen once
  (per executable) rather than per call: ``np.asarray`` itself for the
  dtypes that jaxlib's buffer protocol takes, else a function that calls
  ``ArrayImpl._value``."""
  return _value_or_asarray if np.dtype(dtype).kind == "V" else np.asarray


def host_array(x: Any) -> np.ndarray:
  """``np.asarray(x)`` of a callback's result ``x`` (a ``jax.Array``, or
  anything ``np.asarray`` takes), the same value and dtype, by the
  cheapest route (see the module's text): ``_value`` for a jaxlib
  ``ArrayImpl`` of an ML dtype, else ``np.asarray`` (a tracer still fails
  there with JAX's error)."""
  # Kind "V" (a scalar type of their own): the ML dtypes, whose jax.Arrays
  # jaxlib's buffer protocol refuses.
  if type(x) is _ARRAY_IMPL and x.dtype.kind == "V":
    return x._value
  return np.asarray(x)
