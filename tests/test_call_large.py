"""hostcb.call on large operands and results (XLA's buffer callback on CPU).

On CPU, from ``lowering.BUFFER_CALL_MIN_BYTES`` bytes of operands and
results, ``call`` lowers to XLA's buffer callback: the operands are copied
once out of the device buffers into read-only arrays the callback owns (it
may keep them, as in legacy), and its results are copied once into the
output buffers.  Everything else ``call`` promises stays the same.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import hostcb
from hostcb._core.lowering import BUFFER_CALL_MIN_BYTES

# float32 elements of an operand that alone reaches the threshold
BIG = BUFFER_CALL_MIN_BYTES // 4


class Seen:
  """Records what host functions saw, thread-safely."""

  def __init__(self):
    self.items = []
    self._lock = threading.Lock()

  def add(self, item) -> None:
    with self._lock:
      self.items.append(item)


def _flags(seen: Seen):
  def host(a):
    seen.add((a.flags.writeable, a.flags.owndata, a.ctypes.data))
    return a

  return host


def _call_jit(func, **kwargs):
  return jax.jit(lambda a: hostcb.call(func, a, result_shape=a, **kwargs))


# ------------------------------------------------------------- operands
def test_large_operand_is_a_read_only_copy_the_callback_owns():
  seen = Seen()
  x = jnp.arange(BIG, dtype=jnp.float32)
  _call_jit(_flags(seen))(x).block_until_ready()
  [(writeable, owndata, ptr)] = seen.items
  assert (writeable, owndata) == (False, True)
  assert ptr != x.unsafe_buffer_pointer()


def test_kept_large_operands_keep_their_values_after_later_computations():
  # The spec's accumulator pattern: the callback keeps what it gets.
  kept = []

  def keep(a):
    kept.append(a)
    return a

  f = _call_jit(keep)
  for i in range(4):
    f(jnp.full(4 * BIG, float(i), jnp.float32)).block_until_ready()
  jax.jit(lambda a: a * 7)(jnp.ones(4 * BIG)).block_until_ready()
  for i, a in enumerate(kept):
    np.testing.assert_array_equal(a, np.full(4 * BIG, float(i), np.float32))


def test_small_operand_is_a_read_only_copy():
  # A copy in a slot of its own, 64-byte aligned, of a slab that the
  # engine never reuses (the array's base keeps it alive).
  seen = Seen()
  x = jnp.arange(4, dtype=jnp.float32)

  def host(a):
    seen.add((a.flags.writeable, type(a.base).__name__, a.ctypes.data))
    return a

  _call_jit(host)(x).block_until_ready()
  [(writeable, base, ptr)] = seen.items
  assert (writeable, base) == (False, "ndarray")
  assert ptr != x.unsafe_buffer_pointer()
  assert ptr % 64 == 0


@pytest.mark.parametrize("n", [4, 1000, 1 << 18], ids=["16B", "4KB", "1MiB"])
def test_an_operand_can_be_made_writeable_again_as_legacy_allowed(n):
  # Legacy's operands could be (code that writes in place, or that silences
  # torch.from_numpy's warning); a small one is a view of a slab that owns
  # its memory, a larger one of an array of its own, and one of
  # BUFFER_CALL_MIN_BYTES or more (here 1 MiB) a copy of its own out of
  # XLA's buffer.  Writing to it changes neither the operand, nor what a
  # later tap of it gets.
  tapped = []

  def host(a):
    a.flags.writeable = True
    a += 1
    return a

  def f(x):
    out = hostcb.call(host, x, result_shape=x)
    hostcb.id_tap(lambda a, t: tapped.append(a), x)
    return out, x * 2

  x = jnp.arange(n, dtype=jnp.float32)
  out, doubled = jax.jit(f)(x)
  hostcb.barrier_wait()
  want = np.arange(n, dtype=np.float32)
  np.testing.assert_array_equal(out, want + 1)
  np.testing.assert_array_equal(doubled, want * 2)
  np.testing.assert_array_equal(x, want)
  (a,) = tapped
  np.testing.assert_array_equal(a, want)


def test_operands_and_results_together_reach_the_threshold():
  seen = Seen()

  def host(a):
    seen.add(a.flags.owndata)
    return np.zeros(BIG // 2, np.float32)

  x = jnp.ones(BIG // 2, jnp.float32)
  f = jax.jit(
    lambda a: hostcb.call(
      host, a, result_shape=jax.ShapeDtypeStruct((BIG // 2,), jnp.float32)
    )
  )
  f(x).block_until_ready()
  assert seen.items == [True]


def test_writing_to_a_large_operand_raises():
  seen = Seen()

  def host(a):
    try:
      a[0] = 5
    except ValueError as e:
      seen.add(str(e))
    return a

  x = jnp.zeros(BIG, jnp.float32)
  r = _call_jit(host)(x)
  np.testing.assert_array_equal(r, np.zeros(BIG, np.float32))
  assert seen.items == ["assignment destination is read-only"]


def test_eager_call_on_large_operand_gets_a_copy():
  seen = Seen()
  x = jnp.arange(BIG, dtype=jnp.float32)
  hostcb.call(_flags(seen), x, result_shape=x).block_until_ready()
  [(writeable, owndata, ptr)] = seen.items
  assert (writeable, owndata) == (False, True)
  assert ptr != x.unsafe_buffer_pointer()


# --------------------------------------------------------------- results
def test_identity_result_is_copied_to_the_output():
  x = jnp.arange(BIG, dtype=jnp.float32)
  r = _call_jit(lambda a: a)(x)
  np.testing.assert_array_equal(r, np.arange(BIG, dtype=np.float32))
  assert r.unsafe_buffer_pointer() != x.unsafe_buffer_pointer()


def test_computed_results_in_a_pytree():
  def host(a):
    return {"double": a * 2, "sum": np.sum(a, dtype=np.float32)}

  x = jnp.arange(BIG, dtype=jnp.float32)
  shape = {
    "double": jax.ShapeDtypeStruct((BIG,), jnp.float32),
    "sum": jax.ShapeDtypeStruct((), jnp.float32),
  }
  r = jax.jit(lambda a: hostcb.call(host, a, result_shape=shape))(x)
  np.testing.assert_array_equal(r["double"], np.arange(BIG) * 2.0)
  assert float(r["sum"]) == float(np.sum(np.arange(BIG, dtype=np.float32)))


def test_result_in_a_wider_dtype_is_converted():
  def host(a):
    return np.asarray(a, np.float64) + 1

  x = jnp.zeros(BIG, jnp.float32)
  r = _call_jit(host)(x)
  assert r.dtype == jnp.float32
  np.testing.assert_array_equal(r, np.ones(BIG, np.float32))


def test_result_of_wrong_shape_fails_with_the_call_message():
  x = jnp.zeros(BIG, jnp.float32)
  with pytest.raises(
    jax.errors.JaxRuntimeError,
    match=(
      r"Callback func \S*<lambda> should have returned a result with "
      rf"abstract values ShapedArray\(float32\[{BIG}\]\) but returned "
      r"ShapedArray\(float32\[3\]\)"
    ),
  ):
    _call_jit(lambda a: a[:3])(x).block_until_ready()


def test_result_of_wrong_structure_fails_with_the_call_message():
  x = jnp.zeros(BIG, jnp.float32)
  with pytest.raises(
    jax.errors.JaxRuntimeError,
    match=r"Callback func \S*<lambda> should have returned "
    r"a result with pytree PyTreeDef\(\*\) but returned "
    r"PyTreeDef\(\(\*, \*\)\)",
  ):
    _call_jit(lambda a: (a, a))(x).block_until_ready()


def test_exception_in_callback_fails_the_computation():
  def host(a):
    raise ZeroDivisionError("nothing to divide")

  x = jnp.zeros(BIG, jnp.float32)
  with pytest.raises(
    jax.errors.JaxRuntimeError, match="ZeroDivisionError: nothing to divide"
  ):
    _call_jit(host)(x).block_until_ready()


def test_call_without_result_runs():
  seen = Seen()

  def host(a):
    seen.add(float(a[-1]))

  x = jnp.arange(BIG, dtype=jnp.float32)

  @jax.jit
  def f(a):
    hostcb.call(host, a)
    return a + 1

  f(x).block_until_ready()
  hostcb.barrier_wait()
  assert seen.items == [float(BIG - 1)]


# ----------------------------------------------------------- guarantees
def test_call_with_device_gets_the_device():
  seen = Seen()

  def host(a, device):
    seen.add(device)
    return a

  x = jnp.zeros(BIG, jnp.float32)
  _call_jit(host, call_with_device=True)(x).block_until_ready()
  assert seen.items == [x.devices().pop()]


def test_taps_queued_before_the_call_run_first():
  seen = Seen()

  def tap(a, transforms):
    seen.add(("tap", float(a[0])))

  def host(a):
    seen.add(("call", float(a[0])))
    return a

  @jax.jit
  def f(a):
    a = hostcb.id_tap(tap, a)
    return hostcb.call(host, a + 1, result_shape=a)

  f(jnp.zeros(BIG, jnp.float32)).block_until_ready()
  hostcb.barrier_wait()
  assert seen.items == [("tap", 0.0), ("call", 1.0)]


def test_independent_calls_keep_program_order():
  seen = Seen()

  def host(tag):
    def record(a):
      seen.add(tag)
      return a

    return record

  @jax.jit
  def f(a, b):
    y = hostcb.call(host("first"), b, result_shape=b)
    x = hostcb.call(host("second"), a, result_shape=a)
    return x, y

  f(jnp.zeros(BIG, jnp.float32), jnp.ones(BIG, jnp.float32))[
    0
  ].block_until_ready()
  assert seen.items == ["first", "second"]


def test_calls_in_scan_see_each_carry():
  seen = Seen()

  def host(a):
    seen.add(float(a[0]))
    return a + 1

  @jax.jit
  def f(a):
    return jax.lax.scan(
      lambda c, _: (hostcb.call(host, c, result_shape=c), None),
      a,
      None,
      length=3,
    )[0]

  r = f(jnp.zeros(BIG, jnp.float32))
  np.testing.assert_array_equal(r, np.full(BIG, 3.0, np.float32))
  assert seen.items == [0.0, 1.0, 2.0]


def test_pure_call_under_vmap_calls_once_per_element():
  seen = Seen()

  def host(a):
    seen.add(a.shape)
    return a * 2

  f = jax.vmap(
    lambda a: hostcb.call(
      host, a, result_shape=a, callback_flavor=hostcb.CallbackFlavor.PURE
    )
  )
  r = f(jnp.ones((2, BIG), jnp.float32))
  np.testing.assert_array_equal(r, np.full((2, BIG), 2.0, np.float32))
  assert seen.items == [(BIG,), (BIG,)]


# ----------------------------------------------------------- multi-device
def _devices() -> int:
  n = jax.device_count()
  if n < 2:
    pytest.skip("needs at least 2 CPU devices (HOSTCB_TEST_DEVICES>=2)")
  return n


@pytest.mark.multidevice
def test_shard_map_call_sees_a_copy_of_each_device_shard():
  n = _devices()
  seen = Seen()

  def host(a, device):
    seen.add((device.id, float(a[0]), a.flags.owndata))
    return a + 1

  mesh = jax.make_mesh((n,), ("x",))
  x = jax.device_put(
    jnp.repeat(jnp.arange(float(n)), BIG), NamedSharding(mesh, P("x"))
  )
  body = lambda a: hostcb.call(host, a, result_shape=a, call_with_device=True)
  r = jax.jit(
    jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  )(x)
  np.testing.assert_array_equal(r, np.repeat(np.arange(float(n)) + 1, BIG))
  expected = sorted(
    (d.id, float(i), True) for i, d in enumerate(mesh.devices.flat)
  )
  assert sorted(seen.items) == expected


@pytest.mark.multidevice
def test_sharded_jit_call_runs_once_with_the_whole_operand():
  n = _devices()
  seen = Seen()

  def host(a, device):
    seen.add((device, a.shape))
    return a * 3

  mesh = jax.make_mesh((n,), ("x",))
  x = jax.device_put(
    jnp.ones(n * BIG, jnp.float32), NamedSharding(mesh, P("x"))
  )
  f = jax.jit(
    lambda a: hostcb.call(host, a, result_shape=a, call_with_device=True)
  )
  np.testing.assert_array_equal(f(x), np.full(n * BIG, 3.0, np.float32))
  assert seen.items == [(jax.devices()[0], (n * BIG,))]


def test_large_result_reaches_the_output():
  n = 3 << 20  # 12 MiB of float32: large enough for the huge-page hint
  x = jnp.arange(n, dtype=jnp.float32)
  r = _call_jit(lambda a: a + 1)(x)
  np.testing.assert_array_equal(r, np.arange(1, n + 1, dtype=np.float32))
