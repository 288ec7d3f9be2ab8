"""Lowering of the primitives to XLA, and the host functions XLA calls.

Taps on CPU lower to the native engine's custom call ``hostcb_tap``
(:mod:`hostcb._engine`): its C++ handler copies the operands into the ring
buffer of the device that runs it, without Python, and the device goes on;
the device's consumer thread calls the tap function.  On NVIDIA GPUs, with
the engine's GPU back end on (``hostcb_gpu_engine``), the same custom call
is registered for CUDA and fills the GPU's ring from its stream
(:mod:`hostcb._engine.gpu`).  Elsewhere (GPUs without it, other platforms,
no native engine, a dtype it cannot carry) a tap lowers to XLA's
Python-callback custom call, whose host function queues the work for the
device's consumer thread in :mod:`hostcb._engine.pyqueue`.

A ``call`` on CPU (and on GPUs with the GPU back end) lowers to the
engine's custom call ``hostcb_call``, whose C++ handler runs the host
function on the device thread (with large
operands or results, ``BUFFER_CALL_MIN_BYTES``, to the buffer-callback
custom call, whose host function sees the device buffers and copies the
results once into the outputs); elsewhere, or where the engine cannot
carry its dtypes, to XLA's Python-callback custom call.  Either way the
host function first lets the taps queued before it on its device run
(program order), then runs the callback and checks its result; run from a
tap function of its device (the consumer thread), it runs at once, as part
of that function.

A tap or call of a function registered by name (``hostcb.register``,
:mod:`hostcb._core.by_name`) lowers, where the engine serves it, to the versioned
custom calls ``hostcb_tap_v1`` / ``hostcb_call_v1`` instead, whose
attributes name the function and say how it is called (no process-local
id): such a program can be exported, cached and serialized, and run in
another process (``docs/export.md``); for several platforms at once
(``jax.export(..., platforms=("cpu", "cuda"))``) too.

Where a callback runs:

* one-device and sharded ``jit``/``pjit`` code: once, on the computation's
  device number ``device_index``, with the whole (gathered) operand;
* per-device code (``pmap``, ``shard_map``): on every device, each with its
  shard;
* a partitioned tap (``partitioned=True``) in sharded ``jit`` code: on every
  device, with its shard, without a gather
  (:mod:`hostcb._jax_internals.partitioned`).

Every tap and every call takes and returns the token of hostcb's effect
(:mod:`hostcb._jax_internals`), which keeps them in program order within a
computation and orders the computations of a thread.  A pure call
(``effectful=False``) carries the effect for that token alone: its custom
call has no side effect, and a computation whose only callbacks are pure
calls keeps its token inside (:mod:`hostcb._jax_internals.dispatch`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from hostcb import _engine as engine
from hostcb import _jax_internals as ji
from hostcb._core import by_name
from hostcb._core.engine_entries import (
  call_runner,
  native_call_entry,
  prints_lowered,
)
from hostcb._core.huge_pages import advise_huge_pages
from hostcb._core.primitives import Prints, call_p, tap_p, unpack_transforms

# Bookkeeping bytes counted for each queued Python-callback tap, so that
# even empty taps are bounded by the queue size.
_TAP_OVERHEAD_BYTES = 64


def _native(ctx) -> bool:
  """Whether this callback lowers to the native engine (CPU, and NVIDIA
  GPUs with the GPU back end on).  Also notes, for the exit handler, that
  this process lowered a tap or call; the engine warns once if a callback
  that should use it cannot."""
  engine.note_lowered()
  if not engine.serves(ji.lowering_platform(ctx)):
    return False
  # Not in a jit over several devices, where the tap runs on one of them:
  # XLA's SPMD partitioner (Shardy) keeps that placement only for its own
  # Python callbacks.
  return not ji.runs_on_one_of_several_devices(ctx) and engine.supports(
    a.dtype for a in (*ctx.avals_in, *ctx.avals_out)
  )


# The platforms whose back ends have the handlers by name (named.cc).
_NAMED_PLATFORMS = ("cpu", "cuda")


def _by_name(ctx, spec) -> bool:
  """Whether a callback of a function by name (``spec`` not None) lowers
  to the versioned targets: for one platform, where the engine serves it
  (as :func:`_native`); for several (a multi-platform ``jax.export``),
  where each is CPU or CUDA and the native engine is built, the program
  being compiled and run elsewhere (hostcb cannot check here that the
  other platform's back end serves it)."""
  if spec is None:
    return False
  platforms = ji.lowering_platforms(ctx)
  if len(platforms) == 1:
    if _native(ctx):
      return True
    by_name.warn_not_by_name(
      spec[0],
      (
        "a callback in a jit over several devices, which runs on one of them"
        if ji.runs_on_one_of_several_devices(ctx)
        else f"XLA's Python callbacks on {platforms[0]}, where hostcb's engine "
        "does not serve it (or its dtypes)"
      ),
    )
    return False
  engine.note_lowered()
  if (
    "cuda" in platforms
    and engine.gpu.has_local_gpu()
    and not engine.serves("cuda")
  ):
    # It would run here, on a GPU where hostcb's CUDA handlers are not
    # registered.
    raise NotImplementedError(
      "hostcb: a program for several platforms with host functions by name "
      "runs on this machine's GPU through the engine's GPU back end, which "
      "is off; turn it on: hostcb.config.update('hostcb_gpu_engine', True) "
      f"(platforms={platforms})"
    )
  return (
    all(p in _NAMED_PLATFORMS for p in platforms)
    and engine.available()
    and not ji.runs_on_one_of_several_devices(ctx)
    and engine.supports(a.dtype for a in (*ctx.avals_in, *ctx.avals_out))
  )


def _nbytes(avals) -> int:
  return sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in avals)


def _constant(aval) -> bool:
  """Whether ``aval``'s shape has no symbolic dimension (``jax.export``'s
  shape polymorphism)."""
  return all(isinstance(d, (int, np.integer)) for d in aval.shape)


def _check_constant_results(ctx, target) -> None:
  """A call's results must have constant shapes: the host function's
  results are checked against them, and copied into buffers of their size,
  with no symbolic dimension resolved when the program runs."""
  if all(_constant(a) for a in ctx.avals_out):
    return
  given = ", ".join(a.str_short() for a in ctx.avals_out)
  raise NotImplementedError(
    "hostcb: the results of a host call must have constant shapes; the "
    f"call of {target.func!r} has results ({given}) with symbolic "
    "dimensions (jax.export's shape polymorphism), which hostcb does not "
    "resolve when the program runs. Give the results constant shapes (the "
    "operands may keep symbolic ones), or export with constant input shapes."
  )


def _device_of(placement: ji.Placement):
  """Returns ``pid -> device`` for per-device code, else the one device."""
  devices = placement.devices
  if placement.per_device:
    if devices is None:
      return int
    return lambda pid: devices[int(pid)]
  return None if devices is None else devices[placement.device_index]


def _host_function(placement: ji.Placement, run, *, context: bool = False):
  """The host function that XLA calls for a callback lowered at
  ``placement``: it calls ``run(operands, device)`` with the device that
  runs the callback (per-device code passes its partition id first).

  ``context``: XLA passes an execution context first (buffer callbacks).
  """
  where = _device_of(placement)
  if placement.per_device:
    if context:

      def per_device_with_context(exec_ctx, pid, *operands):
        return run(operands, where(np.asarray(pid)))

      return per_device_with_context

    def per_device(pid, *operands):
      return run(operands, where(pid))

    return per_device
  if context:

    def one_device_with_context(exec_ctx, *operands):
      return run(operands, where)

    return one_device_with_context

  def one_device(*operands):
    return run(operands, where)

  return one_device


def _tap_target_id(ctx, target, key, make) -> int:
  """The engine's target id of a tap that this lowering emits: its lease
  (one per ``key``, the entry built by ``make()``, see
  :func:`hostcb._engine.target_id`) is kept with the executable, and a
  printing tap's id is marked awaited (host reads wait for its prints)."""
  lease = engine.target_id(key, make, target.func, ji.lowering_platform(ctx))
  ji.keep_alive_with_executable(ctx, lease)
  tid = lease.tid
  if target.prints is not Prints.NOTHING:
    prints_lowered(tid)
  return tid


def _per_shard_tap_lowering(ctx, args, target, transforms):
  """A partitioned tap in a ``jit`` over several devices: every device taps
  its own shard, through the engine (see
  :mod:`hostcb._jax_internals.partitioned`)."""
  engine.note_lowered()
  platform = ji.lowering_platform(ctx)
  dtypes = [a.dtype for a in ctx.avals_in]
  if not (engine.serves(platform) and engine.supports(dtypes)):
    raise NotImplementedError(
      "hostcb: a partitioned tap in a jit over several devices runs on "
      "hostcb's native engine, which does not serve this computation "
      f"(platform {platform!r}, operand dtypes "
      f"{[str(d) for d in dtypes]}; engine: "
      f"{engine.unavailable_reason() or 'available'}); use "
      "partitioned=False, or shard_map, where every device taps its own "
      "operand"
    )
  # The target id is fixed here, in the lowered module, not when XLA
  # partitions it: JAX's persistent compilation cache keys the lowered
  # module, and a cache hit is never partitioned again.
  shapes = tuple(tuple(a.shape) for a in ctx.avals_in)
  tid = _tap_target_id(
    ctx,
    target,
    ("shard tap", target, transforms, shapes),
    lambda: target.entry(unpack_transforms(transforms), shapes),
  )
  ji.emit_per_shard_custom_call(
    ctx, args, target=engine.ffi_target_name, target_id=tid
  )
  return list(args)  # the tap is an identity: its results are its operands


def _tap_lowering(ctx, *args, target, transforms, device_index):
  ji.note_ordered_lowered()  # its executable orders its taps (.dispatch)
  if target.prints is not Prints.NOTHING:  # host reads wait for prints
    prints_lowered()
  if target.prints is Prints.LINES:  # its executable keeps its token
    ji.note_awaited_lowered()
  if target.partitioned and ji.runs_on_one_of_several_devices(ctx):
    by_name.note_by_id(target, "a tap per shard in a jit over several devices")
    return _per_shard_tap_lowering(ctx, args, target, transforms)
  spec = by_name.spec_of(target, transforms)
  if _by_name(ctx, spec):  # by name (hostcb.register): no process-local id
    name, text = spec
    by_name.target_id(name, text)
    ji.emit_custom_call(
      ctx,
      engine.tap_v1_target_name,
      args,
      device_index=device_index,
      attributes={"name": name, "spec": text},
    )
    return list(args)  # the tap is an identity: its results are its operands
  if _native(ctx):
    tid = _tap_target_id(
      ctx,
      target,
      ("tap", target, transforms),
      lambda: target.entry(unpack_transforms(transforms)),
    )
    ji.emit_custom_call(
      ctx,
      engine.ffi_target_name,
      args,
      device_index=device_index,
      attributes={"target_id": np.int64(tid)},
    )
    return list(args)  # the tap is an identity: its results are its operands
  transforms = unpack_transforms(transforms)
  nbytes = _nbytes(ctx.avals_in) + _TAP_OVERHEAD_BYTES
  invoke = target.caller(transforms)
  prints = target.prints is not Prints.NOTHING

  def queue_tap(arrays, device):
    engine.queue_for(device).put(
      functools.partial(invoke, arrays, device), nbytes, prints
    )
    return ()

  ji.emit_host_callback(
    ctx,
    lambda placement: _host_function(placement, queue_tap),
    args,
    device_index=device_index,
    has_side_effect=True,
    avals_out=(),
  )
  return list(args)  # the tap is an identity: its results are its operands


# From this many bytes of operands and results, ``call`` on CPU works on the
# device buffers: the operands are copied once out of them (into memory
# hinted for huge pages) and the results copied once into the output
# buffers.  Below it, XLA's copying callback costs less per call.  Either
# way the callback gets read-only arrays of its own, as in legacy, which it
# may keep: views of the device buffers would be reused or freed by XLA
# once the callback returns.
BUFFER_CALL_MIN_BYTES = 1 << 16


def _uses_buffers(ctx) -> bool:
  return (
    ji.lowering_platform(ctx) == "cpu"
    and not ji.runs_on_one_of_several_devices(ctx)
    and all(_constant(a) for a in ctx.avals_in)  # else: sizes known at run
    and _nbytes(ctx.avals_in) + _nbytes(ctx.avals_out) >= BUFFER_CALL_MIN_BYTES
  )


def _read_only_copy(buffer) -> np.ndarray:
  view = np.asarray(buffer)  # over the device memory
  a = np.empty(view.shape, view.dtype)
  advise_huge_pages(a)
  np.copyto(a, view)
  a.flags.writeable = False
  return a


def _call_lowering_on_buffers(ctx, args, target, device_index, effectful):
  n_in = len(args)
  run_call = call_runner(target)

  def run(buffers, device):
    arrays = tuple(_read_only_copy(b) for b in buffers[:n_in])
    results = run_call(arrays, device)
    for out, result in zip(buffers[n_in:], results):
      out = np.asarray(out)  # over the output buffer
      advise_huge_pages(out)
      np.copyto(out, result)  # the one copy
    return ()

  def make_host_fn(placement, host_copies):
    del host_copies  # never: _uses_buffers excludes jit over several devices
    return _host_function(placement, run, context=True)

  return ji.emit_buffer_callback(
    ctx,
    make_host_fn,
    args,
    device_index=device_index,
    has_side_effect=effectful,
    ordered_effect=ji.host_callback_effect,
  )


def _call_lowering(ctx, *args, target, device_index, effectful):
  _check_constant_results(ctx, target)
  engine.note_lowered()
  if effectful:  # a pure call's token orders it within its computation only
    ji.note_ordered_lowered()
  spec = by_name.spec_of(target)
  if _by_name(ctx, spec):  # by name (hostcb.register): no process-local id
    name, text = spec
    by_name.target_id(name, text)
    return ji.emit_custom_call(
      ctx,
      engine.call_v1_target_name,
      args,
      device_index=device_index,
      attributes={"name": name, "spec": text},
      avals_out=ctx.avals_out,
      has_side_effect=effectful,
    )
  if _uses_buffers(ctx):
    return _call_lowering_on_buffers(ctx, args, target, device_index, effectful)
  if _native(ctx):
    lease = engine.call_target_id(
      ("call", target),
      lambda: native_call_entry(target),
      target.func,
      ji.lowering_platform(ctx),
    )
    ji.keep_alive_with_executable(ctx, lease)
    tid = lease.tid
    name = (
      engine.call_one_target_name
      if target.one_array is not None
      else engine.call_target_name
    )
    return ji.emit_custom_call(
      ctx,
      name,
      args,
      device_index=device_index,
      attributes={"target_id": np.int64(tid)},
      avals_out=ctx.avals_out,
      has_side_effect=effectful,
    )

  run_call = call_runner(target)
  return ji.emit_host_callback(
    ctx,
    lambda placement: _host_function(placement, run_call),
    args,
    device_index=device_index,
    has_side_effect=effectful,
  )


ji.register_lowering(tap_p, _tap_lowering)
ji.register_lowering(call_p, _call_lowering)
