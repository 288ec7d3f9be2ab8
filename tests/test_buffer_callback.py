"""hostcb.buffer_callback: host callbacks that work in place on the buffers."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import hostcb
from hostcb.buffer_callback import (
  Buffer,
  ExecutionContext,
  ExecutionStage,
  buffer_callback,
)

F32_4 = jax.ShapeDtypeStruct((4,), jnp.float32)


class Calls:
  """Records what a callback saw, thread-safely (devices run in threads)."""

  def __init__(self):
    self.seen = []
    self._lock = threading.Lock()

  def add(self, item) -> None:
    with self._lock:
      self.seen.append(item)


def add_one(ctx, out, x):
  np.copyto(np.asarray(out), np.asarray(x) + 1)


def n_devices() -> int:
  n = jax.device_count()
  if n < 2:
    pytest.skip("needs at least 2 CPU devices (HOSTCB_TEST_DEVICES>=2)")
  return n


# ------------------------------------------------------------------ basics
def test_exported_from_hostcb():
  assert (
    hostcb.buffer_callback,
    hostcb.Buffer,
    hostcb.ExecutionContext,
    hostcb.ExecutionStage,
  ) == (buffer_callback, Buffer, ExecutionContext, ExecutionStage)


def test_writes_output_in_place_from_numpy_eagerly():
  f = buffer_callback(add_one, F32_4)
  np.testing.assert_array_equal(f(jnp.arange(4.0)), [1.0, 2.0, 3.0, 4.0])


def test_writes_output_in_place_under_jit():
  f = jax.jit(buffer_callback(add_one, F32_4))
  np.testing.assert_array_equal(f(jnp.arange(4.0)), [1.0, 2.0, 3.0, 4.0])


def test_result_has_the_requested_shape_and_dtype():
  def fill(ctx, out):
    np.asarray(out)[...] = 7

  r = buffer_callback(fill, jax.ShapeDtypeStruct((2, 3), jnp.int32))()
  assert (r.shape, r.dtype) == ((2, 3), jnp.int32)
  np.testing.assert_array_equal(r, np.full((2, 3), 7, np.int32))


def test_pytree_operands_keywords_and_results():
  def cb(ctx, out, pair, *, scale):
    a, b = pair
    np.asarray(out["sum"])[...] = np.asarray(a) + np.asarray(b)
    np.asarray(out["scaled"])[...] = np.asarray(a) * np.asarray(scale)

  f = buffer_callback(cb, {"sum": F32_4, "scaled": F32_4})
  r = jax.jit(f)((jnp.arange(4.0), jnp.ones(4)), scale=jnp.float32(3))
  np.testing.assert_array_equal(r["sum"], [1.0, 2.0, 3.0, 4.0])
  np.testing.assert_array_equal(r["scaled"], [0.0, 3.0, 6.0, 9.0])


def test_callback_gets_context_and_buffers():
  calls = Calls()

  def cb(ctx, out, x):
    calls.add((type(ctx), type(out), type(x)))
    add_one(ctx, out, x)

  jax.jit(buffer_callback(cb, F32_4))(jnp.zeros(4)).block_until_ready()
  assert calls.seen == [(ExecutionContext, Buffer, Buffer)]


def test_buffer_shape_dtype_ndim():
  calls = Calls()

  def cb(ctx, out, x):
    calls.add((x.shape, x.dtype, x.ndim, out.shape, out.dtype, out.ndim))
    np.asarray(out)[...] = 0

  f = buffer_callback(cb, jax.ShapeDtypeStruct((3,), jnp.int32))
  jax.jit(f)(jnp.ones((2, 5), jnp.float32)).block_until_ready()
  assert calls.seen == [
    ((2, 5), np.dtype(np.float32), 2, (3,), np.dtype(np.int32), 1)
  ]


# -------------------------------------------------- read-only / writeable
def test_input_buffers_say_read_only_but_numpy_views_are_writable_as_in_jax():
  calls = Calls()

  def cb(ctx, out, x):
    calls.add((x.writeable, np.asarray(x).flags.writeable))
    add_one(ctx, out, x)

  jax.jit(buffer_callback(cb, F32_4))(jnp.zeros(4)).block_until_ready()
  assert calls.seen == [(False, True)]


def test_output_buffers_are_writeable():
  calls = Calls()

  def cb(ctx, out, x):
    calls.add((out.writeable, np.asarray(out).flags.writeable))
    add_one(ctx, out, x)

  jax.jit(buffer_callback(cb, F32_4))(jnp.zeros(4)).block_until_ready()
  assert calls.seen == [(True, True)]


def test_input_view_is_the_argument_memory():
  calls = Calls()

  def cb(ctx, out, x):
    a = np.asarray(x)
    calls.add((a.ctypes.data, a.flags.owndata))
    add_one(ctx, out, x)

  x = jnp.arange(4.0)
  jax.jit(buffer_callback(cb, F32_4))(x).block_until_ready()
  assert calls.seen == [(x.unsafe_buffer_pointer(), False)]


def test_output_view_is_the_result_memory():
  calls = Calls()

  def cb(ctx, out, x):
    calls.add(np.asarray(out).ctypes.data)
    add_one(ctx, out, x)

  r = jax.jit(buffer_callback(cb, F32_4))(jnp.arange(4.0))
  r.block_until_ready()
  assert calls.seen == [r.unsafe_buffer_pointer()]


def test_array_with_other_dtype_is_a_copy():
  calls = Calls()

  def cb(ctx, out, x):
    a = np.asarray(x, dtype=np.float64)
    calls.add((a.dtype, a.tolist()))
    np.asarray(out)[...] = a

  jax.jit(buffer_callback(cb, F32_4))(jnp.arange(4.0)).block_until_ready()
  assert calls.seen == [(np.dtype(np.float64), [0.0, 1.0, 2.0, 3.0])]


def test_array_without_copy_in_other_dtype_raises():
  calls = Calls()

  def cb(ctx, out, x):
    try:
      x.__array__(dtype=np.float64, copy=False)
    except ValueError as e:
      calls.add(str(e))
    np.asarray(out)[...] = 0

  jax.jit(buffer_callback(cb, F32_4))(jnp.arange(4.0)).block_until_ready()
  assert calls.seen == [
    "Buffer.__array__: a float32 buffer cannot be seen as float64 without "
    "copying, and copy=False was given"
  ]


# ----------------------------------------------------------------- DLPack
def test_numpy_from_dlpack_reads_input_read_only():
  calls = Calls()

  def cb(ctx, out, x):
    a = np.from_dlpack(x)
    calls.add((a.tolist(), a.flags.writeable, x.__dlpack_device__()))
    add_one(ctx, out, x)

  jax.jit(buffer_callback(cb, F32_4))(jnp.arange(4.0)).block_until_ready()
  assert calls.seen == [([0.0, 1.0, 2.0, 3.0], False, (1, 0))]


def test_numpy_from_dlpack_writes_output():
  def cb(ctx, out, x):
    np.from_dlpack(out)[...] = np.from_dlpack(x) * 2

  r = jax.jit(buffer_callback(cb, F32_4))(jnp.arange(4.0))
  np.testing.assert_array_equal(r, [0.0, 2.0, 4.0, 6.0])


def test_torch_writes_output_in_place_through_dlpack():
  torch = pytest.importorskip("torch", reason="PyTorch is not installed")

  def cb(ctx, out, x):
    torch.mul(torch.from_dlpack(x), 3, out=torch.from_dlpack(out))

  r = jax.jit(buffer_callback(cb, F32_4))(jnp.arange(4.0))
  np.testing.assert_array_equal(r, [0.0, 3.0, 6.0, 9.0])


def test_torch_tensors_share_the_buffers():
  torch = pytest.importorskip("torch", reason="PyTorch is not installed")
  calls = Calls()

  def cb(ctx, out, x):
    tx, tout = torch.from_dlpack(x), torch.from_dlpack(out)
    calls.add((tx.data_ptr(), tout.data_ptr(), np.asarray(out).ctypes.data))
    tout.copy_(tx)

  x = jnp.arange(4.0)
  r = jax.jit(buffer_callback(cb, F32_4))(x)
  r.block_until_ready()
  assert calls.seen == [
    (
      x.unsafe_buffer_pointer(),
      r.unsafe_buffer_pointer(),
      r.unsafe_buffer_pointer(),
    )
  ]


def test_cuda_array_interface_is_absent_on_cpu():
  calls = Calls()

  def cb(ctx, out, x):
    calls.add(hasattr(x, "__cuda_array_interface__"))
    add_one(ctx, out, x)

  jax.jit(buffer_callback(cb, F32_4))(jnp.arange(4.0)).block_until_ready()
  assert calls.seen == [False]


# ---------------------------------------------------------------- context
def test_stage_is_execute_on_cpu():
  calls = Calls()

  def cb(ctx, out, x):
    calls.add((ctx.stage, ctx.platform))
    add_one(ctx, out, x)

  jax.jit(buffer_callback(cb, F32_4))(jnp.arange(4.0)).block_until_ready()
  assert calls.seen == [(ExecutionStage.EXECUTE, "cpu")]


def test_stream_raises_jax_runtime_error_on_cpu_as_jax_does():
  calls = Calls()

  def cb(ctx, out, x):
    try:
      ctx.stream
    except jax.errors.JaxRuntimeError as e:
      calls.add(str(e))
    add_one(ctx, out, x)

  jax.jit(buffer_callback(cb, F32_4))(jnp.arange(4.0)).block_until_ready()
  # JAX 0.10.2: "UNIMPLEMENTED: XLA FFI GPU context is not available"
  assert calls.seen == [
    "UNIMPLEMENTED: XLA FFI GPU context is not available (hostcb: "
    "ExecutionContext.stream is the GPU stream of the computation and "
    "exists only when the callback runs on a GPU, cuda or rocm; this "
    "callback runs on cpu)"
  ]


def test_cuda_array_interface_raises_jax_runtime_error_on_cpu_as_jax_does():
  calls = Calls()

  def cb(ctx, out, x):
    try:
      x.__cuda_array_interface__
    except jax.errors.JaxRuntimeError as e:
      calls.add(str(e))
    add_one(ctx, out, x)

  jax.jit(buffer_callback(cb, F32_4))(jnp.arange(4.0)).block_until_ready()
  assert calls.seen == [
    "UNIMPLEMENTED: Buffer.__cuda_array_interface__ is only supported on "
    "CUDA and ROCm. (hostcb: this buffer is on cpu; use "
    "numpy.asarray(buffer) or DLPack)"
  ]


# ----------------------------------------------------------------- errors
def test_callback_returning_a_value_is_an_error():
  def cb(ctx, out, x):
    add_one(ctx, out, x)
    return 1

  with pytest.raises(
    jax.errors.JaxRuntimeError,
    match=r"buffer_callback callback must not return any "
    r"values\. \(hostcb: it writes its results into "
    r"the `out` buffers, but .*cb returned a int\)",
  ):
    jax.jit(buffer_callback(cb, F32_4))(jnp.arange(4.0)).block_until_ready()


def test_exception_in_callback_fails_the_computation():
  def cb(ctx, out, x):
    raise KeyError("no such thing")

  with pytest.raises(
    jax.errors.JaxRuntimeError, match="KeyError: 'no such thing'"
  ):
    jax.jit(buffer_callback(cb, F32_4))(jnp.arange(4.0)).block_until_ready()


def test_callback_must_be_callable():
  with pytest.raises(
    TypeError, match="buffer_callback: callback must be callable; got 3"
  ):
    buffer_callback(3, F32_4)


def test_result_leaf_without_shape_raises_attribute_error_as_jax_does():
  with pytest.raises(
    AttributeError,
    match=r"^'int' object has no attribute 'shape' \(hostcb: "
    r"every leaf of result_shape_dtypes must have "
    r"`shape` and `dtype`, e\.g\. "
    r"jax\.ShapeDtypeStruct; got 3\)$",
  ):
    buffer_callback(add_one, [F32_4, 3])


def test_unknown_vmap_method_is_accepted_until_vmap_as_in_jax():
  f = buffer_callback(add_one, F32_4, vmap_method="parallel")
  np.testing.assert_array_equal(jax.jit(f)(jnp.zeros(4)), np.ones(4))
  with pytest.raises(
    NotImplementedError,
    match=r"vmap_method is one of 'sequential', "
    r"'sequential_unrolled', 'expand_dims', "
    r"'broadcast_all', or 'legacy_vectorized'\. "
    r"Got vmap_method='parallel'\.",
  ):
    jax.vmap(f)(jnp.zeros((2, 4)))


def test_result_dtype_is_kept_as_given_as_in_jax():
  f = buffer_callback(
    lambda ctx, out, x: np.asarray(out).fill(3),
    jax.ShapeDtypeStruct((), np.float64),
  )
  r = f(jnp.float32(1))
  assert r.dtype == np.float64
  assert float(r) == 3.0


# --------------------------------------------------- input_output_aliases
def test_alias_input_index_out_of_range():
  f = buffer_callback(add_one, F32_4, input_output_aliases={1: 0})
  with pytest.raises(ValueError) as e:
    f(jnp.zeros(4))
  assert str(e.value) == (
    "input_output_aliases contains the mapping '1:0' with input index 1 "
    "outside the range [0, 1)."
  )


def test_alias_output_index_out_of_range():
  f = buffer_callback(add_one, F32_4, input_output_aliases={0: 2})
  with pytest.raises(ValueError) as e:
    f(jnp.zeros(4))
  assert str(e.value) == (
    "input_output_aliases contains the mapping '0:2' with output index 2 "
    "outside the range [0, 1)."
  )


def test_alias_negative_index_is_out_of_range():
  f = buffer_callback(add_one, F32_4, input_output_aliases={-1: 0})
  with pytest.raises(ValueError) as e:
    f(jnp.zeros(4))
  assert str(e.value) == (
    "input_output_aliases contains the mapping '-1:0' with input index -1 "
    "outside the range [0, 1)."
  )


def test_alias_with_different_abstract_values():
  f = buffer_callback(add_one, F32_4, input_output_aliases={0: 0})
  with pytest.raises(ValueError) as e:
    f(jnp.zeros(3, jnp.int32))
  assert str(e.value) == (
    "input_output_aliases contains the mapping '0:0' referring to an input "
    "with abstract value int32[3] and an output with a different abstract "
    "value float32[4]."
  )


def test_alias_indices_count_flattened_inputs():
  def cb(ctx, out, pair):
    np.asarray(out)[...] += 10

  f = buffer_callback(cb, F32_4, input_output_aliases={1: 0})
  r = jax.jit(f)((jnp.zeros(2), jnp.arange(4.0)))
  np.testing.assert_array_equal(r, [10.0, 11.0, 12.0, 13.0])


def test_two_inputs_aliasing_one_output_are_rejected():
  f = buffer_callback(
    lambda ctx, out, a, b: None, F32_4, input_output_aliases={0: 0, 1: 0}
  )
  with pytest.raises(
    ValueError,
    match="input_output_aliases maps the inputs 0 and 1 to "
    "the same output 0; an output can alias at most "
    "one input",
  ):
    f(jnp.zeros(4), jnp.zeros(4))


def test_alias_indices_are_converted_with_int_as_in_jax():
  def triple_in_place(ctx, out, x):
    np.asarray(out)[...] *= 3

  f = buffer_callback(triple_in_place, F32_4, input_output_aliases={"0": 0})
  np.testing.assert_array_equal(jax.jit(f)(jnp.arange(4.0)), np.arange(4.0) * 3)


def test_aliases_without_items_raise_attribute_error_when_called_as_in_jax():
  f = buffer_callback(add_one, F32_4, input_output_aliases=[(0, 0)])
  with pytest.raises(
    AttributeError,
    match=r"^'list' object has no attribute 'items' \(hostcb:"
    r" input_output_aliases must be a dict from input "
    r"index to output index, or None; got "
    r"\[\(0, 0\)\]\)$",
  ):
    f(jnp.zeros(4))


def test_aliased_input_is_writeable_others_say_read_only():
  calls = Calls()

  def cb(ctx, out, x, y):
    calls.add(
      (
        x.writeable,
        np.asarray(x).flags.writeable,
        y.writeable,
        np.asarray(y).flags.writeable,
      )
    )
    np.asarray(x)[...] += 1  # the same memory as out

  f = buffer_callback(cb, F32_4, input_output_aliases={0: 0})
  r = jax.jit(f)(jnp.arange(4.0), jnp.zeros(4))
  np.testing.assert_array_equal(r, np.arange(4.0) + 1)
  assert calls.seen == [(True, True, False, True)]


def test_aliased_output_starts_with_the_input_values():
  def triple_in_place(ctx, out, x):
    np.asarray(out)[...] *= 3

  f = buffer_callback(triple_in_place, F32_4, input_output_aliases={0: 0})
  np.testing.assert_array_equal(
    jax.jit(f)(jnp.arange(4.0)), [0.0, 3.0, 6.0, 9.0]
  )


def test_aliased_output_shares_the_input_memory():
  calls = Calls()

  def cb(ctx, out, x):
    calls.add(np.asarray(x).ctypes.data == np.asarray(out).ctypes.data)

  f = buffer_callback(cb, F32_4, input_output_aliases={0: 0})
  jax.jit(f)(jnp.arange(4.0)).block_until_ready()
  assert calls.seen == [True]


# ------------------------------------------------------------------- vmap
def test_vmap_without_vmap_method_raises():
  f = buffer_callback(add_one, F32_4)
  with pytest.raises(NotImplementedError) as e:
    jax.vmap(f)(jnp.zeros((2, 4)))
  assert str(e.value) == (
    "vmap is only supported for the buffer_callback primitive when "
    "vmap_method is one of 'sequential', 'sequential_unrolled', "
    "'expand_dims', 'broadcast_all', or 'legacy_vectorized'. "
    "Got vmap_method=None."
  )


@pytest.mark.parametrize("method", ["sequential", "sequential_unrolled"])
def test_vmap_sequential_calls_once_per_element(method):
  calls = Calls()

  def cb(ctx, out, x, y):
    calls.add((x.shape, y.shape))
    np.copyto(np.asarray(out), np.asarray(x) + np.asarray(y))

  f = buffer_callback(cb, F32_4, vmap_method=method)
  xs = jnp.arange(12.0).reshape(3, 4)
  r = jax.vmap(f, in_axes=(0, None))(xs, jnp.ones(4))
  np.testing.assert_array_equal(r, np.arange(12.0).reshape(3, 4) + 1)
  assert calls.seen == [((4,), (4,))] * 3


def test_vmap_expand_dims_adds_unit_axis_to_unbatched():
  calls = Calls()

  def cb(ctx, out, x, y):
    calls.add((x.shape, y.shape, out.shape))
    np.copyto(np.asarray(out), np.asarray(x) + np.asarray(y))

  f = buffer_callback(cb, F32_4, vmap_method="expand_dims")
  r = jax.vmap(f, in_axes=(0, None))(jnp.zeros((3, 4)), jnp.arange(4.0))
  np.testing.assert_array_equal(r, np.tile(np.arange(4.0), (3, 1)))
  assert calls.seen == [((3, 4), (1, 4), (3, 4))]


def test_vmap_broadcast_all_broadcasts_unbatched():
  calls = Calls()

  def cb(ctx, out, x, y):
    calls.add((x.shape, y.shape))
    np.copyto(np.asarray(out), np.asarray(x) + np.asarray(y))

  f = buffer_callback(cb, F32_4, vmap_method="broadcast_all")
  jax.vmap(f, in_axes=(0, None))(jnp.zeros((3, 4)), jnp.arange(4.0))
  assert calls.seen == [((3, 4), (3, 4))]


def test_vmap_legacy_vectorized_keeps_unbatched():
  calls = Calls()

  def cb(ctx, out, x, y):
    calls.add((x.shape, y.shape))
    np.copyto(np.asarray(out), np.asarray(x) + np.asarray(y))

  f = buffer_callback(cb, F32_4, vmap_method="legacy_vectorized")
  r = jax.vmap(f, in_axes=(0, None))(jnp.zeros((3, 4)), jnp.arange(4.0))
  np.testing.assert_array_equal(r, np.tile(np.arange(4.0), (3, 1)))
  assert calls.seen == [((3, 4), (4,))]


# -------------------------------------------------------- differentiation
def test_jvp_raises():
  f = buffer_callback(add_one, F32_4)
  with pytest.raises(ValueError) as e:
    jax.jvp(f, (jnp.zeros(4),), (jnp.ones(4),))
  assert str(e.value) == (
    "Buffer callbacks do not support JVP. "
    "Please use `jax.custom_jvp` to use callbacks while taking gradients."
  )


def test_grad_raises_the_jvp_error():
  f = buffer_callback(add_one, F32_4)
  with pytest.raises(ValueError, match="Buffer callbacks do not support JVP"):
    jax.grad(lambda x: f(x).sum())(jnp.zeros(4))


def test_transpose_raises():
  f = buffer_callback(add_one, F32_4)
  with pytest.raises(ValueError) as e:
    jax.linear_transpose(f, jnp.zeros(4))(jnp.ones(4))
  assert str(e.value) == (
    "Buffer callbacks do not support transpose. "
    "Please use `jax.custom_vjp` to use callbacks while taking gradients."
  )


def test_custom_vjp_around_callback_differentiates():
  f = buffer_callback(add_one, F32_4)

  @jax.custom_vjp
  def g(x):
    return f(x)

  g.defvjp(lambda x: (f(x), None), lambda _, ct: (ct * 2,))
  np.testing.assert_array_equal(
    jax.grad(lambda x: g(x).sum())(jnp.zeros(4)), [2.0, 2.0, 2.0, 2.0]
  )


# ----------------------------------------------------------- side effects
def _unused_result(f):
  return jax.jit(lambda x: (f(x), x)[1])


def test_unused_pure_callback_is_dropped():
  calls = Calls()

  def cb(ctx, out, x):
    calls.add("ran")
    add_one(ctx, out, x)

  _unused_result(buffer_callback(cb, F32_4))(jnp.zeros(4)).block_until_ready()
  assert calls.seen == []


def test_side_effect_is_kept_when_result_unused():
  calls = Calls()

  def cb(ctx, out, x):
    calls.add("ran")
    add_one(ctx, out, x)

  f = buffer_callback(cb, F32_4, has_side_effect=True)
  _unused_result(f)(jnp.zeros(4)).block_until_ready()
  assert calls.seen == ["ran"]


def test_side_effect_without_results():
  calls = Calls()

  def record(ctx, out, x):
    calls.add(np.asarray(x).tolist())

  f = buffer_callback(record, (), has_side_effect=True)

  @jax.jit
  def g(x):
    f(x)
    return x * 2

  np.testing.assert_array_equal(g(jnp.arange(2.0)), [0.0, 2.0])
  jax.effects_barrier()
  assert calls.seen == [[0.0, 1.0]]


def test_side_effect_inside_scan_runs_every_step():
  calls = Calls()

  def record(ctx, out, x):
    calls.add(float(np.asarray(x)))
    np.asarray(out)[...] = np.asarray(x) * 2

  f = buffer_callback(
    record, jax.ShapeDtypeStruct((), jnp.float32), has_side_effect=True
  )
  _, ys = jax.jit(lambda xs: jax.lax.scan(lambda c, x: (c, f(x)), 0.0, xs))(
    jnp.arange(3.0)
  )
  np.testing.assert_array_equal(ys, [0.0, 2.0, 4.0])
  assert calls.seen == [0.0, 1.0, 2.0]


# ----------------------------------------------------------- multi-device
@pytest.mark.multidevice
def test_sharded_jit_runs_on_every_device_with_whole_operand_as_jax():
  n = n_devices()
  calls = Calls()

  def cb(ctx, out, x):
    calls.add(x.shape)
    np.copyto(np.asarray(out), np.asarray(x) * 2)

  mesh = jax.make_mesh((n,), ("x",))
  x = jax.device_put(jnp.arange(2.0 * n), NamedSharding(mesh, P("x")))
  f = buffer_callback(cb, jax.ShapeDtypeStruct((2 * n,), jnp.float32))
  r = jax.jit(f)(x)
  np.testing.assert_array_equal(r, np.arange(2.0 * n) * 2)
  assert calls.seen == [(2 * n,)] * n
  assert r.sharding == NamedSharding(mesh, P())


@pytest.mark.multidevice
def test_sharded_jit_keeps_side_effect_once_where_jax_fails():
  n = n_devices()
  calls = Calls()

  def record(ctx, out, x):
    calls.add(np.asarray(x).tolist())
    np.copyto(np.asarray(out), np.asarray(x))

  mesh = jax.make_mesh((n,), ("x",))
  x = jax.device_put(jnp.arange(float(n)), NamedSharding(mesh, P("x")))
  f = buffer_callback(
    record, jax.ShapeDtypeStruct((n,), jnp.float32), has_side_effect=True
  )
  _unused_result(f)(x).block_until_ready()
  # JAX 0.10.2: "Side-effect HLO must have sharding" (RET_CHECK failure)
  assert calls.seen == [list(np.arange(float(n)))]


@pytest.mark.multidevice
def test_sharded_jit_alias_starts_with_input():
  n = n_devices()

  def triple_in_place(ctx, out, x):
    np.asarray(out)[...] *= 3

  mesh = jax.make_mesh((n,), ("x",))
  x = jax.device_put(jnp.arange(float(n)), NamedSharding(mesh, P("x")))
  f = buffer_callback(
    triple_in_place,
    jax.ShapeDtypeStruct((n,), jnp.float32),
    input_output_aliases={0: 0},
  )
  np.testing.assert_array_equal(jax.jit(f)(x), np.arange(float(n)) * 3)


@pytest.mark.multidevice
def test_shard_map_runs_on_every_device_with_its_shard():
  n = n_devices()
  calls = Calls()

  def cb(ctx, out, x):
    calls.add(np.asarray(x).tolist())
    np.copyto(np.asarray(out), np.asarray(x) + 100)

  mesh = jax.make_mesh((n,), ("x",))
  f = buffer_callback(cb, jax.ShapeDtypeStruct((2,), jnp.float32))
  g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  r = g(jax.device_put(jnp.arange(2.0 * n), NamedSharding(mesh, P("x"))))
  np.testing.assert_array_equal(r, np.arange(2.0 * n) + 100)
  assert sorted(calls.seen) == [[2.0 * i, 2.0 * i + 1] for i in range(n)]


@pytest.mark.multidevice
def test_shard_map_side_effect_on_every_device():
  n = n_devices()
  calls = Calls()

  def record(ctx, out, x):
    calls.add(np.asarray(x).tolist())

  mesh = jax.make_mesh((n,), ("x",))
  f = buffer_callback(record, (), has_side_effect=True)

  def body(x):
    f(x)
    return x

  g = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  x = jax.device_put(jnp.arange(float(n)), NamedSharding(mesh, P("x")))
  g(x).block_until_ready()
  jax.effects_barrier()
  assert sorted(calls.seen) == [[float(i)] for i in range(n)]


@pytest.mark.multidevice
def test_pmap_runs_on_every_device():
  n = n_devices()
  calls = Calls()

  def cb(ctx, out, x):
    calls.add(np.asarray(x).tolist())
    np.copyto(np.asarray(out), np.asarray(x) * 10)

  f = buffer_callback(cb, jax.ShapeDtypeStruct((1,), jnp.float32))
  r = jax.pmap(f)(jnp.arange(float(n)).reshape(n, 1))
  np.testing.assert_array_equal(r, np.arange(float(n)).reshape(n, 1) * 10)
  assert sorted(calls.seen) == [[float(i)] for i in range(n)]


def test_large_output_is_written_in_place():
  n = 3 << 20  # 12 MiB of float32: large enough for the huge-page hint
  f = buffer_callback(add_one, jax.ShapeDtypeStruct((n,), jnp.float32))
  r = jax.jit(f)(jnp.arange(n, dtype=jnp.float32))
  np.testing.assert_array_equal(r, np.arange(1, n + 1, dtype=np.float32))


@pytest.mark.multidevice
def test_operands_on_two_meshes_over_the_same_devices_as_in_jax():
  n = n_devices()
  if n < 4:
    pytest.skip("needs 4 devices")
  calls = Calls()

  def add(ctx, out, a, b):
    calls.add(a.shape)
    np.copyto(np.asarray(out), np.asarray(a) + np.asarray(b))

  devices = np.array(jax.devices()[:4]).reshape(2, 2)
  ab = jax.sharding.Mesh(devices, ("a", "b"))
  xy = jax.sharding.Mesh(devices, ("x", "y"))
  a = jax.device_put(
    jnp.arange(8.0).reshape(4, 2), NamedSharding(ab, P("a", "b"))
  )
  b = jax.device_put(jnp.ones((4, 2)), NamedSharding(xy, P("x")))
  f = buffer_callback(add, jax.ShapeDtypeStruct((4, 2), jnp.float32))
  r = jax.jit(f)(a, b)
  np.testing.assert_array_equal(r, np.arange(8.0).reshape(4, 2) + 1)
  assert calls.seen == [(4, 2)] * 4
  assert r.sharding == NamedSharding(ab, P())
