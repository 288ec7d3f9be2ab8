"""The GPU back end: taps and calls on NVIDIA GPUs through the engine's
rings, without XLA's Python callbacks.

A tap lowered for CUDA is the custom call ``hostcb_tap`` registered for
the ``CUDA`` platform (``src/hostcb/_native/cuda.cc``).  Its handler
reserves the record in the ring of its GPU on the host and puts on the
GPU's stream an asynchronous copy of the operands into the ring (pinned
pages) and a write of the record's ready word (``cuStreamWriteValue64``),
which the consumer thread polls; where the driver cannot write words, a
host function marks the record ready instead (:func:`publication` says
which).  The stream never waits for Python; the ring's bound, the order of records, the
consumer thread, the registry, the barrier's markers and the recording of
exceptions are those of the CPU back end (:mod:`.native`), so a GPU's tap
functions run exactly as a CPU device's do.  ``hostcb_call`` copies the
operands to the host, waits for the stream, runs the call's function on
the handler's thread as on CPU, and copies the results back on the stream.

The CUDA driver is loaded at run time (``dlopen("libcuda.so.1")``):
building hostcb needs nothing of CUDA, and where there is no driver the
back end says why (:func:`unavailable_reason`).

A GPU's queue is the engine's queue of key :data:`GPU_KEY_BASE` plus the
GPU's local hardware id (the FFI device ordinal XLA gives the handlers).

On by default (``hostcb_gpu_engine``; ``HOSTCB_GPU_ENGINE=0`` turns it
off): ``scripts/check_gpu.sh`` passed on an NVIDIA H200 with jax 0.11.2.
Its host side is tested on CPU machines with a simulated driver
(``tests/test_engine_gpu.py``; the driver is in the test build of the
extension only, ``tests/native/cuda_fake.cc``).
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from hostcb import config
from hostcb._engine import native

# Keys of GPU queues start here (kGpuKeyBase in engine.h).
GPU_KEY_BASE = native.GPU_KEY_BASE

_lock = threading.Lock()
_registered = False
_reason: str | None = None
_warned = [False]


def enabled() -> bool:
  """Whether taps and calls on NVIDIA GPUs should use this back end
  (option ``hostcb_gpu_engine``)."""
  return bool(config.read(config.GPU_ENGINE))


def available(capacity: int) -> bool:
  """True if the native engine is available, the CUDA driver loads and
  XLA accepts the CUDA handlers (registering them on first use)."""
  global _registered, _reason
  if _registered:
    return True
  if not native.available(capacity):
    _reason = (
      f"the native engine is not available: {native.unavailable_reason()}"
    )
    return False
  with _lock:
    if _registered:
      return True
    engine = native.module()
    why = engine.load_cuda()
    if why is not None:
      _reason = why
      return False
    try:
      import jax  # noqa: PLC0415

      for name, capsule in engine.cuda_handlers().items():
        jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
    except Exception as e:  # noqa: BLE001  (e.g. built for another jaxlib)
      _reason = f"XLA refused its CUDA handlers ({str(e).splitlines()[0]})"
      return False
    _registered = True
    _reason = None
  return True


# has_local_gpu's answer once asked (None before): a process cannot gain
# a GPU, and JAX's answer costs a look at its backends at every lowering
# for CUDA otherwise.
_local_gpu: bool | None = None


def has_local_gpu() -> bool:
  """Whether JAX has NVIDIA GPUs in this process (its backend for them
  started).  Asked of JAX once per process."""
  global _local_gpu
  if _local_gpu is None:
    import jax  # noqa: PLC0415

    try:
      found = bool(jax.local_devices(backend="cuda"))
    except RuntimeError:  # no CUDA backend
      found = False
    # Two threads asking at once both get JAX's answer: the same one.
    _local_gpu = found
  return _local_gpu


def unavailable_reason() -> str | None:
  """Why the GPU back end could not be used (None if it can, or if
  nothing asked yet)."""
  return _reason


class GpuEngineFallbackWarning(RuntimeWarning):
  """``hostcb_gpu_engine`` is on but the GPU back end cannot be used."""


def warn_unavailable() -> None:
  """Warns once per process that GPU taps and calls use XLA's Python
  callbacks although the GPU back end was asked for, naming why."""
  if _warned[0]:
    return
  _warned[0] = True
  warnings.warn(
    f"hostcb: the GPU engine (hostcb_gpu_engine) is on but cannot be used: "
    f"{_reason}. Taps and calls on GPUs use XLA's Python callbacks "
    "instead, which make the stream wait for Python.",
    GpuEngineFallbackWarning,
    stacklevel=4,
  )


def key_of(local_hardware_id: int) -> int:
  """The engine's queue key of the GPU with this local hardware id."""
  return GPU_KEY_BASE + int(local_hardware_id)


def pinned_bytes(local_hardware_id: int) -> int:
  """Bytes of that GPU's ring that are pinned (page-locked) so far."""
  return native.module().gpu_pinned_bytes(int(local_hardware_id))


def publication() -> str | None:
  """None where streams publish GPU taps by writing each record's ready
  word (``cuStreamWriteValue64``: the stream never waits for the host),
  else why host functions publish them (each makes the stream wait for
  the host)."""
  return native.module().gpu_publication()


def pin_refusal(local_hardware_id: int) -> str | None:
  """Why the driver refused to pin part of that GPU's ring (the CUDA error
  of the first refusal; the taps there were copied through pageable
  memory, which is slower), or None."""
  return native.module().gpu_pin_refusal(int(local_hardware_id))


def _clear_caches(_value: Any, _first=[True]) -> None:  # noqa: B006
  """Option changes after the first: compiled code lowered either way."""
  if _first[0]:
    _first[0] = False
    return
  import jax  # noqa: PLC0415

  jax.clear_caches()


config.subscribe(config.GPU_ENGINE, _clear_caches)
