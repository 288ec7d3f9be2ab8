"""Large taps reach the tap function without a second host copy: the
engine gives such a record its own block, and the NumPy arrays the
function gets view that block and keep it alive (queue.h: own blocks).
A function that keeps them sees the values it was given, whatever the
engine queues afterwards."""

from __future__ import annotations

import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import _native_testing
import hostcb
from hostcb import _engine as engine

pytestmark = pytest.mark.skipif(
  not engine.available(), reason="needs hostcb's native engine"
)

BIG = 1 << 19  # float32 elements: 2 MB, past the engine's own-block size
SMALL = 256


def _kept_taps(n: int, steps: int) -> list:
  """The arrays that a tap function kept, from a loop of ``steps`` taps of
  an ``n``-element array that holds the step number."""
  kept = []

  def keep(a, transforms):
    kept.append(a)

  def body(i, x):
    hostcb.id_tap(keep, x)
    return x + 1

  jax.jit(lambda x: jax.lax.fori_loop(0, steps, body, x))(
    jnp.zeros((n,), jnp.float32)
  )
  hostcb.barrier_wait()
  return kept


def test_kept_large_arrays_keep_their_values():
  kept = _kept_taps(BIG, 6)
  assert [a.shape for a in kept] == [(BIG,)] * 6
  for step, a in enumerate(kept):
    assert np.all(a == step), step


def test_a_large_tap_views_its_record_without_copying_it():
  (a,) = _kept_taps(BIG, 1)
  # The array is a view of the record's block, which its base keeps: a
  # writeable uint8 array over the block, whose own base is the capsule
  # that frees the block (so that the array can be made writeable again).
  assert not a.flags.owndata and not a.flags.writeable
  assert a.flags.c_contiguous and a.flags.aligned
  owner = a.base
  assert (type(owner), owner.dtype, owner.ndim) == (np.ndarray, np.uint8, 1)
  assert owner.flags.writeable and not owner.flags.owndata
  assert type(owner.base).__name__ == "PyCapsule"
  start = owner.ctypes.data
  assert start <= a.ctypes.data
  assert a.ctypes.data + a.nbytes <= start + owner.nbytes


def test_a_large_tap_array_made_writeable_writes_only_its_own_values():
  got = []

  def write(arg, transforms):
    x, y = arg
    x.flags.writeable = True
    x[...] = -1.0
    got.append(arg)

  x = jnp.full((BIG,), 3.0, jnp.float32)
  out = jax.jit(lambda x, y: hostcb.id_tap(write, (x, y)))(
    x, jnp.arange(7, dtype=jnp.int32)
  )
  hostcb.barrier_wait()
  ((a, b),) = got
  assert a.base is b.base  # one block
  assert np.all(a == -1.0)
  assert b.tolist() == list(range(7))
  assert np.all(out[0] == 3.0) and out[1].tolist() == list(range(7))


def test_a_large_records_block_goes_with_the_last_array_over_it():
  got = []
  jax.jit(lambda x, y: hostcb.id_tap(lambda a, t: got.append(a), (x, y)))(
    jnp.full((BIG,), 3.0, jnp.float32), jnp.arange(7, dtype=jnp.int32)
  )
  hostcb.barrier_wait()
  ((x, y),) = got
  got.clear()
  # The uint8 array over the block holds the capsule that frees the block
  # (nothing else does): the block lives as long as it.
  owner = weakref.ref(x.base)
  x.flags.writeable = True
  del x
  assert owner() is not None  # y views the block
  assert y.tolist() == list(range(7))
  del y
  assert owner() is None


def test_small_taps_get_arrays_of_their_own():
  kept = _kept_taps(SMALL, 3)
  # Its own memory: owned, or (1 KiB and more, 64-byte aligned for jax.Array
  # arguments without a copy) a view of a fresh buffer that owns it.
  owners = [a if a.flags.owndata else a.base for a in kept]
  assert all(type(o) is np.ndarray and o.flags.owndata for o in owners)
  assert len({id(o) for o in owners}) == 3
  assert [a.tolist() for a in kept] == [[float(s)] * SMALL for s in range(3)]


def test_tiny_taps_get_aligned_slots_of_their_own():
  # Under 1 KiB: a 64-byte aligned slot of a shared slab, each handed out
  # once (pyarrays.h, SlabSlot); more taps than a slab holds after them do
  # not change them.
  kept = _kept_taps(4, 300)
  _kept_taps(4, 300)
  assert [a.tolist() for a in kept] == [[float(s)] * 4 for s in range(300)]
  assert all(a.ctypes.data % 64 == 0 for a in kept)
  assert len({a.ctypes.data for a in kept}) == 300
  # The slabs' own uint8 arrays, 16 slots of 64 bytes each.
  slabs = {id(a.base): a.base for a in kept}
  assert {(type(b), b.dtype, b.base) for b in slabs.values()} == {
    (np.ndarray, np.dtype(np.uint8), None)
  }
  # 19 slabs, or 20 where the first taps took the rest of an earlier one.
  assert len(slabs) in (300 // 16 + 1, 300 // 16 + 2)
  assert not any(a.flags.writeable for a in kept)


def test_a_large_array_outlives_the_queue_that_carried_it():
  kept = _kept_taps(BIG, 2)
  # More taps through the same queue after the first were released.
  _kept_taps(BIG, 4)
  del kept[0]
  assert np.all(kept[0] == 1)


def test_every_operand_of_a_large_record_views_the_same_block():
  got = []

  def keep(arg, transforms):
    got.append(arg)

  jax.jit(lambda x, y: hostcb.id_tap(keep, (x, y)))(
    jnp.full((BIG,), 3.0, jnp.float32), jnp.arange(7, dtype=jnp.int32)
  )
  hostcb.barrier_wait()
  ((x, y),) = got
  assert x.base is y.base
  assert np.all(x == 3.0)
  assert y.tolist() == list(range(7))


@pytest.mark.multidevice
def test_per_shard_taps_of_large_shards_keep_their_values():
  n = jax.device_count()
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.device_put(
    np.arange(n * BIG, dtype=np.float32).reshape(n, BIG),
    NamedSharding(mesh, P("d")),
  )
  got = {}
  lock = threading.Lock()

  def keep(a, transforms, *, device, index):
    with lock:
      got[device.id] = (a, index)

  jax.jit(
    lambda v: hostcb.id_tap(keep, v * 2, partitioned=True, tap_with_device=True)
  )(x)
  hostcb.barrier_wait()
  whole = np.asarray(x) * 2
  assert sorted(got) == sorted(d.id for d in jax.devices())
  for a, index in got.values():
    np.testing.assert_array_equal(a, whole[index])
    assert not a.flags.owndata


def test_a_large_tap_whose_arrays_cannot_be_made_is_reported_and_freed():
  """Fault injection: the consumer cannot make the arrays of a record with
  its own block; the tap is reported as lost, the queue frees the block
  (it was not adopted), and the next large taps get their values."""
  native = engine.native
  got = []

  @jax.jit
  def f(x):
    for k in range(3):
      hostcb.id_tap(lambda a, t: got.append(a), x + k)
    return x

  x = jnp.zeros((BIG,), jnp.float32)
  f(x).block_until_ready()
  hostcb.barrier_wait()
  got.clear()
  _native_testing.fail_next_allocations(1)  # the next tap: out of memory
  f(x)
  with pytest.raises(
    hostcb.CallbackException,
    match="a tap was lost: its operands could not be allocated on the host",
  ):
    hostcb.barrier_wait()
  assert [float(a[0]) for a in got] == [1.0, 2.0]
  held = native.counters(0)  # the device of this jit
  assert held["bytes_held"] == 0 and held["records_held"] == 0, held
  f(x + 10)
  hostcb.barrier_wait()
  assert [float(a[0]) for a in got] == [1.0, 2.0, 10.0, 11.0, 12.0]
  assert all(np.all(a == a[0]) for a in got)
