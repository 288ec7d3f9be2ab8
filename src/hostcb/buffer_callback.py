"""``buffer_callback``: a host callback that works in place on device buffers.

``jax.pure_callback`` and ``io_callback`` hand the host function NumPy copies
of the operands and copy its results back into the device buffers.  A
buffer callback instead receives the buffers themselves:

.. code-block:: python

    def scale(ctx, out, x):          # returns nothing
      np.multiply(np.asarray(x), 2, out=np.asarray(out))

    double = hostcb.buffer_callback(scale, jax.ShapeDtypeStruct((n,), f32))
    y = jax.jit(double)(x)

The operands arrive as :class:`Buffer` objects not to be written (their
``writeable`` is False), the results as writable ones in a pytree shaped
like ``result_shape_dtypes``; on CPU both are zero-copy NumPy arrays
through ``numpy.asarray`` and tensors of other libraries through DLPack
(``torch.from_dlpack``).  This is built on XLA's
``xla_buffer_python_*_callback`` custom calls, as JAX's own
``jax.experimental.buffer_callback`` is, and behaves as JAX's does (code
written for it runs unchanged; in a ``jit`` over several devices the
callback runs on every device, with whole operands), except that:

* as in JAX, an operand's ``writeable`` is False (True for an operand
  aliased to a result) but ``numpy.asarray`` gives a writable view of it:
  writing there changes an immutable ``jax.Array``, so don't;
* errors say more: ``ctx.stream`` on CPU and ``__cuda_array_interface__``
  off GPU raise JAX's ``JaxRuntimeError`` with JAX's message and hostcb's
  explanation after it (the latter is also an ``AttributeError``, so
  ``hasattr`` works); ``input_output_aliases`` is checked against the
  flattened operands (JAX counts positional arguments);
* ``numpy.asarray(buf, dtype=...)`` converts (JAX's refuses a dtype), and
  buffers and contexts have a readable ``repr``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import numpy as np

from hostcb import _jax_internals as ji
from hostcb._core.identity import function_hash, same_function
from hostcb._core.callback_types import (
  VMAP_METHODS,
  result_avals,
  unsupported_vmap,
)
from hostcb._core.huge_pages import HUGE_PAGE_MIN_BYTES, advise_huge_pages

__all__ = ["buffer_callback", "Buffer", "ExecutionContext", "ExecutionStage"]

ExecutionStage = ji.ExecutionStage
"""The stage of XLA's execution a callback runs in (``EXECUTE`` on CPU).

The same enum as ``jax.experimental.buffer_callback.ExecutionStage``.  On
GPU, a ``command_buffer_compatible`` callback also sees the stages of
command buffer construction.
"""


def _name(func: Callable) -> str:
  return getattr(func, "__qualname__", None) or repr(func)


class NoCudaArrayInterfaceError(jax.errors.JaxRuntimeError, AttributeError):
  """``Buffer.__cuda_array_interface__`` off GPU.

  A ``JaxRuntimeError`` as JAX raises there, and an ``AttributeError`` so
  that ``hasattr(buffer, "__cuda_array_interface__")`` is False.
  """


class Buffer:
  """One device buffer, as a buffer callback sees it.

  Made by hostcb for the duration of one callback: do not keep it, or any
  array or tensor made from it, once the callback has returned (the memory
  belongs to XLA).  Inputs are not to be written (``writeable`` False,
  except one aliased to a result), results are writable.

  * ``numpy.asarray(buf)`` (CPU): a NumPy array over the buffer's memory,
    without copying; writable for inputs too, as in JAX, but writing there
    changes an immutable ``jax.Array``.
  * ``buf.__dlpack__()`` (CPU and GPU): e.g. ``torch.from_dlpack(buf)`` or
    ``numpy.from_dlpack(buf)``.  The DLPack capsule of an input is marked
    read-only, but libraries without read-only tensors (PyTorch) ignore
    that: do not write to inputs through them.
  * ``buf.__cuda_array_interface__`` (GPU): e.g. for CuPy or Numba.
  """

  __slots__ = ("_raw", "_writeable", "_platform")

  def __init__(self, raw: Any, writeable: bool, platform: str):
    self._raw = raw
    self._writeable = writeable
    self._platform = platform

  @property
  def shape(self) -> tuple[int, ...]:
    """The shape of the buffer."""
    return tuple(self._raw.shape)

  @property
  def dtype(self) -> np.dtype:
    """The element type of the buffer."""
    return self._raw.dtype

  @property
  def ndim(self) -> int:
    """The number of dimensions."""
    return self._raw.ndim

  @property
  def writeable(self) -> bool:
    """True for results and aliased operands, False for other operands."""
    return self._writeable

  def __array__(
    self, dtype: Any = None, copy: bool | None = None
  ) -> np.ndarray:
    """The buffer as a NumPy array (CPU only): a view unless copying."""
    if copy:
      return np.array(self._raw, dtype=dtype, copy=True)
    arr = np.asarray(self._raw)  # writable even for operands, as in JAX
    if dtype is not None and np.dtype(dtype) != arr.dtype:
      if copy is False:
        raise ValueError(
          f"Buffer.__array__: a {arr.dtype} buffer cannot be seen as "
          f"{np.dtype(dtype)} without copying, and copy=False was given"
        )
      arr = arr.astype(dtype)
    return arr

  def __dlpack__(
    self,
    *,
    stream: Any = None,
    max_version: Any = None,
    dl_device: Any = None,
    copy: bool | None = None,
  ) -> Any:
    """A DLPack capsule over the buffer (see the DLPack protocol)."""
    return self._raw.__dlpack__(
      stream=stream, max_version=max_version, dl_device=dl_device, copy=copy
    )

  def __dlpack_device__(self) -> tuple[int, int]:
    """The DLPack ``(device_type, device_id)`` of the buffer."""
    return self._raw.__dlpack_device__()

  @property
  def __cuda_array_interface__(self) -> dict:
    """The CUDA array interface of a GPU buffer (an error elsewhere)."""
    if self._platform not in ("cuda", "rocm"):
      raise NoCudaArrayInterfaceError(
        "UNIMPLEMENTED: Buffer.__cuda_array_interface__ is only supported "
        "on CUDA and ROCm. (hostcb: this buffer is on "
        f"{self._platform}; use numpy.asarray(buffer) or DLPack)"
      )
    return self._raw.__cuda_array_interface__

  def __repr__(self) -> str:
    kind = "writeable" if self._writeable else "read-only"
    return (
      f"hostcb.Buffer({np.dtype(self.dtype).name}{list(self.shape)}, "
      f"{kind}, {self._platform})"
    )


class ExecutionContext:
  """What XLA tells a buffer callback about the running computation.

  ``ctx.stage`` is the :class:`ExecutionStage`; ``ctx.stream`` is the GPU
  stream the computation runs on (as an integer handle), for launching
  work on it; on CPU there is none and reading it raises
  ``jax.errors.JaxRuntimeError``, as JAX's does.
  """

  __slots__ = ("_raw", "_platform")

  def __init__(self, raw: Any, platform: str):
    self._raw = raw
    self._platform = platform

  @property
  def stage(self) -> ExecutionStage:
    """The execution stage of this call."""
    if self._raw is None:  # host copies (jit over several devices)
      return ExecutionStage.EXECUTE
    return self._raw.stage

  @property
  def stream(self) -> int:
    """The GPU stream of the computation; JaxRuntimeError on CPU."""
    if self._platform not in ("cuda", "rocm"):
      raise jax.errors.JaxRuntimeError(
        "UNIMPLEMENTED: XLA FFI GPU context is not available (hostcb: "
        "ExecutionContext.stream is the GPU stream of the computation and "
        "exists only when the callback runs on a GPU, cuda or rocm; this "
        f"callback runs on {self._platform})"
      )
    return self._raw.stream

  @property
  def platform(self) -> str:
    """The platform the callback runs on: ``cpu``, ``cuda`` or ``rocm``."""
    return self._platform

  def __repr__(self) -> str:
    return f"hostcb.ExecutionContext(stage={self.stage}, {self._platform})"


@dataclasses.dataclass(frozen=True, eq=False)
class _Target:
  """The user's callback with the pytree structures of its arguments.

  Hashable, so that the same callback on the same shapes reuses JAX's
  compilation caches; the callback compares by identity
  (:mod:`hostcb._core.identity`), so that two callbacks that compare equal are
  never merged, and an unhashable one is accepted.
  """

  callback: Callable
  in_tree: Any
  out_tree: Any
  aliased_inputs: frozenset = frozenset()

  def __eq__(self, other) -> bool:
    return (
      type(other) is _Target
      and same_function(self.callback, other.callback)
      and self.in_tree == other.in_tree
      and self.out_tree == other.out_tree
      and self.aliased_inputs == other.aliased_inputs
    )

  def __hash__(self) -> int:
    return hash(
      (
        function_hash(self.callback),
        self.in_tree,
        self.out_tree,
        self.aliased_inputs,
      )
    )

  def run(self, platform: str, raw_ctx: Any, raw_buffers) -> None:
    """Calls the callback on the buffers of one execution."""
    n_in = self.in_tree.num_leaves
    ins = [
      Buffer(b, i in self.aliased_inputs, platform)
      for i, b in enumerate(raw_buffers[:n_in])
    ]
    outs = [Buffer(b, True, platform) for b in raw_buffers[n_in:]]
    if platform == "cpu":
      for out in outs:
        if (
          math.prod(out.shape) * np.dtype(out.dtype).itemsize
          >= HUGE_PAGE_MIN_BYTES
        ):
          advise_huge_pages(np.asarray(out))
    args, kwargs = self.in_tree.unflatten(ins)
    ret = self.callback(
      ExecutionContext(raw_ctx, platform),
      self.out_tree.unflatten(outs),
      *args,
      **kwargs,
    )
    if ret is not None:
      raise ValueError(
        "buffer_callback callback must not return any values. (hostcb: it "
        f"writes its results into the `out` buffers, but "
        f"{_name(self.callback)} returned a {type(ret).__name__})"
      )


# --------------------------------------------------------------- primitive
buffer_callback_p = ji.new_primitive("hostcb_buffer_callback")


@buffer_callback_p.def_effectful_abstract_eval
def _abstract_eval(
  *avals,
  target,
  result_avals,
  vmap_method,
  has_side_effect,
  input_output_aliases,
  command_buffer_compatible,
):
  del avals, target, vmap_method, input_output_aliases
  del command_buffer_compatible
  effects = {ji.buffer_callback_effect} if has_side_effect else ji.no_effects
  return result_avals, effects


def _jvp(primals, tangents, **params):
  del primals, tangents, params
  raise ValueError(
    "Buffer callbacks do not support JVP. "
    "Please use `jax.custom_jvp` to use callbacks while taking gradients."
  )


def _transpose(cts, *args, **params):
  del cts, args, params
  raise ValueError(
    "Buffer callbacks do not support transpose. "
    "Please use `jax.custom_vjp` to use callbacks while taking gradients."
  )


def _batch(args, dims, *, vmap_method, **params):
  if vmap_method not in VMAP_METHODS:
    raise unsupported_vmap("buffer_callback", vmap_method)
  return ji.ffi_batching(
    buffer_callback_p, args, dims, vmap_method=vmap_method, **params
  )


def _lowering(
  ctx,
  *args,
  target,
  result_avals,
  vmap_method,
  has_side_effect,
  input_output_aliases,
  command_buffer_compatible,
):
  del result_avals, vmap_method
  platform = ji.lowering_platform(ctx)
  run = target.run

  def host_fn(raw_ctx, *raw_buffers):
    run(platform, raw_ctx, raw_buffers)
    return ()

  if has_side_effect and ji.runs_on_one_of_several_devices(ctx):
    # JAX's own fails here (XLA wants a sharding on a side-effecting call in
    # a jit over several devices); hostcb runs it once, on the first device
    # of the computation, with whole operands copied to the host.
    def make_host_fn(placement: ji.Placement, host_copies: bool) -> Callable:
      del placement
      where = "cpu" if host_copies else platform
      return lambda raw_ctx, *raw_buffers: (
        run(where, raw_ctx, raw_buffers),
        (),
      )[1]

    return ji.emit_buffer_callback(
      ctx,
      make_host_fn,
      args,
      device_index=0,
      has_side_effect=True,
      operand_output_aliases=input_output_aliases,
      command_buffer_compatible=command_buffer_compatible,
    )

  return ji.emit_buffer_callback_everywhere(
    ctx,
    host_fn,
    args,
    has_side_effect=has_side_effect,
    operand_output_aliases=input_output_aliases,
    command_buffer_compatible=command_buffer_compatible,
  )


ji.register_jvp(buffer_callback_p, _jvp)
ji.register_transpose(buffer_callback_p, _transpose)
ji.register_batching(buffer_callback_p, _batch)
ji.register_lowering(buffer_callback_p, _lowering)
ji.lowers_without_devices(buffer_callback_p)


# --------------------------------------------------------------------- API
def _result_aval(leaf):
  for attribute in ("shape", "dtype"):
    if not hasattr(leaf, attribute):
      raise AttributeError(
        f"{type(leaf).__name__!r} object has no attribute {attribute!r} "
        "(hostcb: every leaf of result_shape_dtypes must have `shape` and "
        f"`dtype`, e.g. jax.ShapeDtypeStruct; got {leaf!r})"
      )
  # As JAX's: the dtype is kept as given (not canonicalized).
  return ji.ShapedArray(tuple(leaf.shape), np.dtype(leaf.dtype))


def _result_avals(result_shape_dtypes) -> tuple[tuple, Any]:
  return result_avals(result_shape_dtypes, _result_aval)


def _check_aliases(
  aliases: dict, in_avals, out_avals
) -> tuple[tuple[int, int], ...]:
  """Validates ``input_output_aliases``; returns it as sorted pairs."""
  pairs = []
  outputs_taken: dict[int, int] = {}
  for i_idx, o_idx in sorted(aliases.items()):
    i_idx, o_idx = int(i_idx), int(o_idx)  # as JAX's: "1" is 1
    if not 0 <= i_idx < len(in_avals):
      raise ValueError(
        f"input_output_aliases contains the mapping '{i_idx}:{o_idx}' "
        f"with input index {i_idx} outside the range [0, "
        f"{len(in_avals)})."
      )
    if not 0 <= o_idx < len(out_avals):
      raise ValueError(
        f"input_output_aliases contains the mapping '{i_idx}:{o_idx}' "
        f"with output index {o_idx} outside the range [0, "
        f"{len(out_avals)})."
      )
    in_aval, out_aval = in_avals[i_idx], out_avals[o_idx]
    if not ji.same_shape_and_dtype(in_aval, out_aval):
      raise ValueError(
        f"input_output_aliases contains the mapping '{i_idx}:{o_idx}' "
        f"referring to an input with abstract value {in_aval} and an "
        f"output with a different abstract value {out_aval}."
      )
    if o_idx in outputs_taken:
      raise ValueError(
        f"input_output_aliases maps the inputs {outputs_taken[o_idx]} and "
        f"{i_idx} to the same output {o_idx}; an output can alias at most "
        "one input"
      )
    outputs_taken[o_idx] = i_idx
    pairs.append((i_idx, o_idx))
  return tuple(pairs)


def buffer_callback(
  callback: Callable[..., None],
  result_shape_dtypes: Any,
  *,
  has_side_effect: bool = False,
  vmap_method: str | None = None,
  input_output_aliases: dict[int, int] | None = None,
  command_buffer_compatible: bool = False,
) -> Callable[..., Any]:
  """Wraps ``callback`` into a JAX function that runs it on device buffers.

  The returned function takes arrays (pytrees of arrays, keyword arguments
  too), can be used eagerly and under ``jit``, ``vmap``, ``scan``,
  ``shard_map``..., and returns arrays shaped as ``result_shape_dtypes``.
  At run time the host calls ``callback(ctx, out, *args, **kwargs)`` where
  ``ctx`` is an :class:`ExecutionContext`, ``out`` the pytree of writable
  :class:`Buffer` objects of ``result_shape_dtypes`` to fill, and ``args`` /
  ``kwargs`` the operands as :class:`Buffer` objects not to be written.  The
  callback must return None; an exception it raises fails the computation
  (``jax.errors.JaxRuntimeError`` carrying its traceback).

  Args:
    callback: the host function, as above.
    result_shape_dtypes: a pytree whose leaves have ``shape`` and ``dtype``
      (e.g. ``jax.ShapeDtypeStruct``).
    has_side_effect: keep the call even when its results are unused.
    vmap_method: how ``vmap`` batches the call, as for
      ``jax.pure_callback``: ``"sequential"`` (one call per batch element,
      in a ``scan``), ``"sequential_unrolled"``, ``"expand_dims"`` (unbatched
      operands get a leading axis of size 1), ``"broadcast_all"`` (they are
      broadcast to the batch size) or ``"legacy_vectorized"``; None (the
      default) makes ``vmap`` raise ``NotImplementedError``.
    input_output_aliases: ``{input index: output index}``, indices into the
      flattened operands and results: each such result shares the memory
      of its operand (same shape and dtype), which is then donated.
    command_buffer_compatible: on GPU, let XLA record the callback in a
      command buffer: the Python code runs once and its GPU work is replayed
      on later executions.  No effect on CPU.

  Returns:
    A function of the operands that returns the results.
  """
  if not callable(callback):
    raise TypeError(
      f"buffer_callback: callback must be callable; got {callback!r}"
    )
  result_avals, out_tree = _result_avals(result_shape_dtypes)
  # As JAX's, an unknown vmap_method is an error only under vmap.
  has_side_effect = bool(has_side_effect)
  command_buffer_compatible = bool(command_buffer_compatible)

  def wrapped(*args, **kwargs):
    flat_args, in_tree = jax.tree_util.tree_flatten((args, kwargs))
    in_avals = [jax.typeof(x) for x in flat_args]
    pairs = ()
    if input_output_aliases is not None:
      if not hasattr(input_output_aliases, "items"):
        raise AttributeError(
          f"{type(input_output_aliases).__name__!r} object has no "
          "attribute 'items' (hostcb: input_output_aliases must be a dict "
          "from input index to output index, or None; got "
          f"{input_output_aliases!r})"
        )
      pairs = _check_aliases(
        dict(input_output_aliases.items()), in_avals, result_avals
      )
    outs = buffer_callback_p.bind(
      *flat_args,
      target=_Target(
        callback, in_tree, out_tree, frozenset(i for i, _ in pairs)
      ),
      result_avals=result_avals,
      vmap_method=vmap_method,
      has_side_effect=has_side_effect,
      input_output_aliases=pairs,
      command_buffer_compatible=command_buffer_compatible,
    )
    return out_tree.unflatten(outs)

  wrapped.__name__ = f"buffer_callback({_name(callback)})"
  wrapped.__doc__ = callback.__doc__
  return wrapped
