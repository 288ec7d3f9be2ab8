"""Taps and calls under pmap, sharded jit (pjit style) and shard_map."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcb
from _helpers import Recorder

try:
  from jax import shard_map as _shard_map
except ImportError:  # older JAX
  from jax.experimental.shard_map import shard_map as _shard_map

pytestmark = pytest.mark.multidevice

N = jax.device_count()


def _mesh():
  return Mesh(np.array(jax.devices()), ("d",))


def _sharded(x):
  return jax.device_put(x, NamedSharding(_mesh(), P("d")))


def shard_map(f, **kw):
  try:
    return _shard_map(f, mesh=_mesh(), in_specs=P("d"), out_specs=P("d"), **kw)
  except TypeError:
    return _shard_map(f, _mesh(), in_specs=P("d"), out_specs=P("d"), **kw)


def test_there_are_several_devices():
  assert N >= 2


# -------------------------------------------------------------------- pmap
def test_pmap_taps_once_per_device_with_its_slice():
  rec = Recorder()
  out = jax.pmap(lambda x: hostcb.id_tap(rec, x * 2))(
    jnp.arange(N * 3.0).reshape(N, 3)
  )
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(N * 3.0).reshape(N, 3) * 2)
  assert sorted(a.tolist() for a in rec.args) == [
    [2.0 * (3 * i + j) for j in range(3)] for i in range(N)
  ]


def test_pmap_tap_with_device_passes_each_device():
  rec = Recorder()
  jax.pmap(lambda x: hostcb.id_tap(rec, x, tap_with_device=True))(jnp.arange(N))
  hostcb.barrier_wait()
  got = {int(arg): kw["device"] for arg, _, kw in rec.calls}
  assert got == {i: d for i, d in enumerate(jax.local_devices()[:N])}


def test_pmap_taps_of_each_device_in_program_order():
  rec = Recorder()

  def f(x):
    for _i in range(10):
      x = hostcb.id_tap(rec, x + 1, tap_with_device=True)
    return x

  jax.pmap(f)(jnp.arange(N) * 100)
  hostcb.barrier_wait()
  for i, dev in enumerate(jax.local_devices()[:N]):
    seq = [int(a) for a, _, kw in rec.calls if kw["device"] == dev]
    assert seq == [100 * i + k for k in range(1, 11)]


def test_pmap_tap_inside_scan_on_every_device():
  rec = Recorder()

  def f(x):
    return jax.lax.scan(
      lambda c, _: (hostcb.id_tap(rec, c) + 1, None), x, None, length=3
    )[0]

  jax.pmap(f)(jnp.zeros(N, jnp.int32))
  hostcb.barrier_wait()
  assert sorted(int(a) for a in rec.args) == sorted([0, 1, 2] * N)


def test_pmap_of_vmap_adds_batch_transform():
  rec = Recorder()
  jax.pmap(jax.vmap(lambda x: hostcb.id_tap(rec, x)))(jnp.ones((N, 2)))
  hostcb.barrier_wait()
  assert len(rec.calls) == N
  assert all(t == (("batch", {"batch_dims": (0,)}),) for t in rec.transforms)
  assert all(a.shape == (2,) for a in rec.args)


def test_pmap_call_with_device_once_per_device():
  seen = []

  def host_sin(x, *, device):
    seen.append((x.shape, device))
    return np.sin(x)

  x = np.ones((N, 4), np.float32)
  out = jax.pmap(
    lambda x: hostcb.call(host_sin, x, result_shape=x, call_with_device=True)
  )(x)
  np.testing.assert_allclose(out, np.sin(x), rtol=1e-6)
  assert sorted(seen, key=lambda s: s[1].id) == [
    ((4,), d) for d in jax.local_devices()[:N]
  ]


def test_pmap_call_returns_per_device_results():
  out = jax.pmap(lambda x: hostcb.call(lambda a: a * 10, x, result_shape=x))(
    jnp.arange(N, dtype=jnp.float32)
  )
  np.testing.assert_array_equal(out, np.arange(N) * 10.0)


def test_pmap_call_error_is_raised():
  def host(a):
    raise ValueError("pmap host failure")

  with pytest.raises(Exception, match="pmap host failure"):
    jax.block_until_ready(
      jax.pmap(lambda x: hostcb.call(host, x, result_shape=x))(
        jnp.arange(N, dtype=jnp.float32)
      )
    )
  out = jax.pmap(lambda x: hostcb.call(lambda a: a + 1, x, result_shape=x))(
    jnp.zeros(N, jnp.float32)
  )
  np.testing.assert_array_equal(out, np.ones(N))


def test_pmap_grad_taps_primals_per_device():
  rec = Recorder()
  jax.pmap(jax.grad(lambda x: hostcb.id_tap(rec, x) ** 2))(
    jnp.arange(N, dtype=jnp.float32)
  )
  hostcb.barrier_wait()
  assert sorted(float(a) for a in rec.args) == list(map(float, range(N)))


# ----------------------------------------------------------- sharded jit
def test_sharded_jit_taps_gathered_operand_once():
  rec = Recorder()
  x = _sharded(jnp.arange(2.0 * N))
  out = jax.jit(lambda x: hostcb.id_tap(rec, x * 2, tap_with_device=True))(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(2.0 * N) * 2)
  assert len(rec.calls) == 1
  np.testing.assert_array_equal(rec.args[0], np.arange(2.0 * N) * 2)
  assert rec.calls[0][2] == {"device": jax.devices()[0]}


def test_sharded_jit_device_index_chooses_the_tapping_device():
  rec = Recorder()
  x = _sharded(jnp.arange(2.0 * N))
  jax.jit(
    lambda x: hostcb.id_tap(rec, x, tap_with_device=True, device_index=1)
  )(x)
  hostcb.barrier_wait()
  assert len(rec.calls) == 1
  assert rec.calls[0][2] == {"device": jax.devices()[1]}
  np.testing.assert_array_equal(rec.args[0], np.arange(2.0 * N))


def test_pjit_style_in_out_shardings_with_device_index():
  rec = Recorder()
  sharding = NamedSharding(_mesh(), P("d"))
  f = jax.jit(
    lambda x: hostcb.id_tap(rec, x + 1, tap_with_device=True, device_index=1),
    in_shardings=sharding,
    out_shardings=sharding,
  )
  out = f(np.arange(2.0 * N))
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(2.0 * N) + 1)
  assert out.sharding == sharding
  assert len(rec.calls) == 1
  assert rec.calls[0][2] == {"device": jax.devices()[1]}
  np.testing.assert_array_equal(rec.args[0], np.arange(2.0 * N) + 1)


def test_sharded_jit_device_index_out_of_range_raises():
  x = _sharded(jnp.arange(2.0 * N))
  with pytest.raises(ValueError, match="device_index"):
    jax.jit(lambda x: hostcb.id_tap(Recorder(), x, device_index=N))(x)


def test_sharded_jit_call_gets_whole_operand_on_device_index():
  seen = []

  def host(a, *, device):
    seen.append((a.tolist(), device))
    return a * 10

  sharding = NamedSharding(_mesh(), P("d"))
  f = jax.jit(
    lambda x: hostcb.call(
      host, x, result_shape=x, call_with_device=True, device_index=1
    ),
    in_shardings=sharding,
    out_shardings=sharding,
  )
  out = f(np.arange(2.0 * N, dtype=np.float32))
  np.testing.assert_array_equal(out, np.arange(2.0 * N) * 10)
  assert seen == [(list(np.arange(2.0 * N)), jax.devices()[1])]


def test_sharded_jit_call_on_device_index_returns_its_result_as_output():
  # Without out_shardings: the call's result is the program's output as is.
  x = _sharded(jnp.arange(2.0 * N))
  out = jax.jit(
    lambda x: hostcb.call(lambda a: a * 10, x, result_shape=x, device_index=1)
  )(x)
  np.testing.assert_array_equal(out, np.arange(2.0 * N) * 10)


def test_sharded_jit_taps_in_order():
  rec = Recorder()
  x = _sharded(jnp.arange(2.0 * N))

  def f(x):
    for _i in range(5):
      x = hostcb.id_tap(rec, x + 1)
    return x

  jax.jit(f)(x)
  hostcb.barrier_wait()
  assert [float(a[0]) for a in rec.args] == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_eager_device_index_taps_on_that_device():
  rec = Recorder()
  hostcb.id_tap(rec, np.float32(1.0), tap_with_device=True, device_index=1)
  hostcb.barrier_wait()
  assert rec.calls[0][2] == {"device": jax.devices()[1]}


# --------------------------------------------------------------- shard_map
def test_shard_map_taps_once_per_device_with_its_shard():
  rec = Recorder()
  x = _sharded(jnp.arange(2.0 * N))
  out = jax.jit(
    shard_map(lambda x: hostcb.id_tap(rec, x * 2, tap_with_device=True))
  )(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(2.0 * N) * 2)
  got = {kw["device"]: a.tolist() for a, _, kw in rec.calls}
  assert got == {d: [4.0 * i, 4.0 * i + 2] for i, d in enumerate(jax.devices())}


def test_shard_map_call_with_device_per_shard():
  seen = []

  def host(a, *, device):
    seen.append((a.tolist(), device))
    return a + 1

  x = _sharded(jnp.arange(2.0 * N, dtype=jnp.float32))
  out = jax.jit(
    shard_map(
      lambda x: hostcb.call(host, x, result_shape=x, call_with_device=True)
    )
  )(x)
  np.testing.assert_array_equal(out, np.arange(2.0 * N) + 1)
  assert sorted(seen, key=lambda s: s[1].id) == [
    ([2.0 * i, 2.0 * i + 1], d) for i, d in enumerate(jax.devices())
  ]
