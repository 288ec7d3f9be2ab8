"""Per-shard taps (``partitioned=True``) in sharded ``jit``, ``shard_map``,
outside ``jit``, and the partitioned ``hostcb.debug`` callbacks beside
JAX's own.  See docs/partitioned.md."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcb
from _helpers import Recorder, Stream, run_python

pytestmark = pytest.mark.multidevice

N = jax.device_count()
COLLECTIVES = (
  "all-gather",
  "all-reduce",
  "all-to-all",
  "collective-permute",
  "reduce-scatter",
  "collective-broadcast",
)


def _mesh(n: int = N) -> Mesh:
  return Mesh(np.array(jax.devices()[:n]), ("d",))


_ROWS = P("d")


def _sharded(x, spec=_ROWS):
  return jax.device_put(x, NamedSharding(_mesh(), spec))


def _matrix():
  """A (2N, 3) float32 array split by rows: device i holds rows 2i, 2i+1."""
  return _sharded(np.arange(2 * N * 3, dtype=np.float32).reshape(2 * N, 3))


def _by_device(rec: Recorder) -> dict:
  """{device id: [(arg as lists, index), ...]} in tap order."""
  out: dict = {}
  for arg, _, kw in rec.calls:
    out.setdefault(kw["device"].id, []).append(
      (jax.tree.map(lambda a: a.tolist(), arg), kw.get("index"))
    )
  return out


def _shards(x) -> dict:
  """{device id: (shard as lists, index)} of a jax.Array."""
  return {
    s.device.id: (np.asarray(s.data).tolist(), s.index)
    for s in x.addressable_shards
  }


def test_there_are_several_devices():
  assert N >= 2


# ------------------------------------------------------------- id_tap
def test_partitioned_tap_gets_each_device_its_shard_and_index():
  rec = Recorder()
  x = _matrix()
  jax.jit(
    lambda v: hostcb.id_tap(rec, v * 2, partitioned=True, tap_with_device=True)
  )(x)
  hostcb.barrier_wait()
  expected = {
    d: [([[2 * e for e in row] for row in data], index)]
    for d, (data, index) in _shards(x).items()
  }
  assert _by_device(rec) == expected
  assert sorted(
    (i[0].start, i[0].stop, i[1]) for taps in expected.values() for _, i in taps
  ) == [(2 * k, 2 * k + 2, slice(None)) for k in range(N)]


def test_partitioned_tap_does_not_change_the_value():
  x = _matrix()
  with_tap = jax.jit(
    lambda v: hostcb.id_tap(lambda *a: None, v * 3 + 1, partitioned=True) - 1
  )(x)
  without = jax.jit(lambda v: v * 3 + 1 - 1)(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(np.asarray(with_tap), np.asarray(without))
  assert with_tap.sharding.is_equivalent_to(without.sharding, 2)


def test_partitioned_tap_compiles_without_collectives():
  x = _matrix()

  def f(partitioned):
    return lambda v: (
      hostcb.id_tap(lambda *a: None, v * 2, partitioned=partitioned) + 1
    )

  per_shard = jax.jit(f(True)).lower(x).compile().as_text()
  gathering = jax.jit(f(False)).lower(x).compile().as_text()
  assert not [c for c in COLLECTIVES if c in per_shard], per_shard
  assert "hostcb_tap" in per_shard
  assert "all-gather" in gathering  # what partitioned=True avoids


def test_partitioned_tap_of_a_pytree_gets_an_index_per_leaf():
  rec = Recorder()
  x, y = _matrix(), jnp.arange(3.0)  # y is replicated
  jax.jit(
    lambda a, b: hostcb.id_tap(
      rec, {"a": a, "b": b}, partitioned=True, tap_with_device=True
    )
  )(x, y)
  hostcb.barrier_wait()
  shards = _shards(x)
  got = _by_device(rec)
  assert got == {
    d: [({"a": data, "b": [0.0, 1.0, 2.0]}, {"a": index, "b": (slice(None),)})]
    for d, (data, index) in shards.items()
  }


def test_partitioned_tap_without_device_gets_no_index():
  rec = Recorder()
  jax.jit(lambda v: hostcb.id_tap(rec, v, partitioned=True))(_matrix())
  hostcb.barrier_wait()
  assert [kw for _, _, kw in rec.calls] == [{}] * N
  assert sorted(a.tolist() for a in rec.args) == sorted(
    d for d, _ in _shards(_matrix()).values()
  )


def test_uneven_sharding_gives_each_device_only_its_rows():
  rec = Recorder()
  rows = 2 * N - 1  # the last device holds one row, not two

  def f(v):
    part = jax.lax.with_sharding_constraint(
      v[:rows] + 0, NamedSharding(_mesh(), P("d"))
    )
    return hostcb.id_tap(rec, part, partitioned=True, tap_with_device=True)

  out = jax.jit(f)(_matrix())
  hostcb.barrier_wait()
  whole = np.arange(2 * N * 3, dtype=np.float32).reshape(2 * N, 3)[:rows]
  np.testing.assert_array_equal(np.asarray(out), whole)
  got = _by_device(rec)
  devices = [d.id for d in jax.devices()[:N]]
  assert got == {
    d: [
      (
        whole[2 * k : 2 * k + 2].tolist(),
        (slice(2 * k, min(2 * k + 2, rows)), slice(None)),
      )
    ]
    for k, d in enumerate(devices)
  }


def test_partitioned_taps_of_a_device_stay_in_program_order():
  rec = Recorder()

  def step(i, v):
    hostcb.id_tap(rec, (i, v[0, 0]), partitioned=True, tap_with_device=True)
    return v + 1

  jax.jit(lambda v: jax.lax.fori_loop(0, 5, step, v))(_matrix())
  hostcb.barrier_wait()
  got = {d: [arg[0] for arg, _ in taps] for d, taps in _by_device(rec).items()}
  assert got == {d.id: [0, 1, 2, 3, 4] for d in jax.devices()[:N]}


def test_barrier_waits_for_every_shard_tap():
  release, returned = threading.Event(), threading.Event()
  rec = Recorder()

  def held(arg, transforms):
    assert release.wait(60), "the test never released the taps"
    rec(arg, transforms)

  # Dispatched and not read: a read would wait for the taps once a print
  # was staged in this process (prints come before results).
  jax.jit(lambda v: hostcb.id_tap(held, v, partitioned=True))(_matrix())

  def barrier():
    hostcb.barrier_wait()  # covers multi-device computations of any thread
    returned.set()

  waiter = threading.Thread(target=barrier)
  waiter.start()
  try:
    assert not returned.wait(0.5)  # every tap is held: the barrier waits
    assert rec.calls == []
  finally:
    release.set()
  waiter.join(60)
  assert returned.is_set()
  assert len(rec.calls) == N


def test_dispatch_does_not_wait_for_its_taps_once_a_print_is_staged():
  # Once a print is staged, a read of a result waits for the taps before
  # it; the dispatch of a multi-device computation (which waits for its
  # runtime token) must not: it would hold the loop for every tap.
  jax.make_jaxpr(lambda v: hostcb.id_print(v, output_stream=Stream()))(1.0)
  release = threading.Event()
  rec = Recorder()

  def held(arg, transforms):
    assert release.wait(60), "the dispatch waited for the held taps"
    rec(arg, transforms)

  try:
    jax.jit(lambda v: hostcb.id_tap(held, v, partitioned=True))(_matrix())
    assert rec.calls == []  # dispatched while every tap is held
  finally:
    release.set()
  hostcb.barrier_wait()
  assert len(rec.calls) == N


def test_partitioned_tap_in_shard_map_gets_the_local_operand():
  rec = Recorder()
  x = _matrix()
  jax.jit(
    jax.shard_map(
      lambda v: hostcb.id_tap(rec, v, partitioned=True, tap_with_device=True),
      mesh=_mesh(),
      in_specs=P("d"),
      out_specs=P("d"),
    )
  )(x)
  hostcb.barrier_wait()
  # The operand is already the device's own: its index is all of it.
  assert _by_device(rec) == {
    d: [(data, (slice(None), slice(None)))]
    for d, (data, _) in _shards(x).items()
  }


def test_partitioned_tap_outside_jit_taps_each_shard():
  rec = Recorder()
  x = _matrix()
  out = hostcb.id_tap(rec, x, partitioned=True, tap_with_device=True)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
  assert _by_device(rec) == {
    d: [(data, index)] for d, (data, index) in _shards(x).items()
  }


def test_partitioned_tap_on_one_device_taps_the_whole_value():
  rec = Recorder()
  jax.jit(
    lambda v: hostcb.id_tap(rec, v, partitioned=True, tap_with_device=True)
  )(jnp.arange(3.0))
  hostcb.barrier_wait()
  assert _by_device(rec) == {
    jax.devices()[0].id: [([0.0, 1.0, 2.0], (slice(None),))]
  }


def test_partitioned_tap_under_vmap_taps_the_batched_shard():
  rec = Recorder()
  x = _matrix()
  jax.jit(
    jax.vmap(lambda col: hostcb.id_tap(rec, col, partitioned=True), in_axes=1)
  )(x)
  hostcb.barrier_wait()
  assert rec.transforms == [(("batch", {"batch_dims": (1,)}),)] * N
  assert sorted(a.tolist() for a in rec.args) == sorted(
    d for d, _ in _shards(x).values()
  )


def test_partitioned_id_print_prints_each_shard_with_its_index():
  stream = Stream()
  x = _sharded(np.arange(N, dtype=np.int32))
  jax.jit(
    lambda v: hostcb.id_print(
      v, partitioned=True, tap_with_device=True, output_stream=stream, what="v"
    )
  )(x)
  hostcb.barrier_wait()
  assert sorted(stream.records()) == sorted(
    f"device: {d} index: (slice({k}, {k + 1}, None),) what: v\n[{k}]\n"
    for k, d in enumerate(jax.devices()[:N])
  )


def test_partitioned_must_be_a_bool():
  with pytest.raises(TypeError, match="partitioned must be a bool; got 1"):
    hostcb.id_tap(lambda *a: None, 1.0, partitioned=1)


# ------------------------------------------------- hostcb.debug, beside JAX
@pytest.mark.parametrize(
  "case",
  ["jit", "replicated", "eager", "one_device", "vmap", "loop", "shard_map"],
)
def test_partitioned_debug_callback_calls_as_jax_does(case):
  x = _matrix()
  y = jnp.arange(3.0)
  wrap = {
    "jit": lambda cb: (jax.jit(lambda v: cb(v * 2)), (x,)),
    "replicated": lambda cb: (jax.jit(lambda v, w: cb(v, w)), (x, y)),
    "eager": lambda cb: (cb, (x,)),
    "one_device": lambda cb: (jax.jit(lambda w: cb(w)), (y,)),
    "vmap": lambda cb: (jax.jit(jax.vmap(lambda c: cb(c), in_axes=1)), (x,)),
    "loop": lambda cb: (
      jax.jit(
        lambda v: jax.lax.fori_loop(0, 3, lambda i, c: (cb(c, i), c + 1)[1], v)
      ),
      (x,),
    ),
    "shard_map": lambda cb: (
      jax.jit(
        jax.shard_map(
          lambda v: (cb(v), v)[1],
          mesh=_mesh(),
          in_specs=P("d"),
          out_specs=P("d"),
        )
      ),
      (x,),
    ),
  }[case]

  def run(debug_callback):
    """Sorted (shape, values) of each call of the callback."""
    got = []
    lock = threading.Lock()

    def record(*values):
      with lock:
        got.append(tuple((np.shape(v), np.asarray(v).tolist()) for v in values))

    fn, args = wrap(lambda *a: debug_callback(record, *a, partitioned=True))
    fn(*args)
    jax.effects_barrier()
    return sorted(got, key=repr)

  ours = run(hostcb.debug.callback)
  theirs = run(jax.debug.callback)
  assert ours == theirs
  assert ours  # called at all


def test_partitioned_debug_callback_compiles_without_collectives():
  f = jax.jit(
    lambda v: hostcb.debug.callback(lambda a: None, v, partitioned=True)
  )
  text = f.lower(_matrix()).compile().as_text()
  assert not [c for c in COLLECTIVES if c in text], text
  assert "hostcb_tap" in text  # hostcb's engine, not JAX's Python callback


def test_partitioned_debug_print_prints_each_shard(capsys):
  x = _sharded(np.arange(N, dtype=np.int32))
  jax.jit(lambda v: hostcb.debug.print("v={}", v, partitioned=True))(x)
  jax.effects_barrier()
  assert sorted(capsys.readouterr().out.splitlines()) == [
    f"v=[{k}]" for k in range(N)
  ]


def test_partially_replicated_shards_are_tapped_by_each_holder():
  rec = Recorder()
  mesh = Mesh(np.array(jax.devices()).reshape(N // 2, 2), ("a", "b"))
  x = jax.device_put(
    np.arange(N * 2, dtype=np.float32).reshape(N, 2),
    NamedSharding(mesh, P("a")),
  )  # copies along "b"
  jax.jit(
    lambda v: hostcb.id_tap(rec, v, partitioned=True, tap_with_device=True)
  )(x)
  hostcb.barrier_wait()
  assert _by_device(rec) == {
    d: [(data, index)] for d, (data, index) in _shards(x).items()
  }


def test_partitioned_tap_with_the_gspmd_partitioner():
  rec = Recorder()
  x = _matrix()
  before = jax.config.jax_use_shardy_partitioner
  jax.config.update("jax_use_shardy_partitioner", False)
  try:
    f = jax.jit(
      lambda v: hostcb.id_tap(rec, v, partitioned=True, tap_with_device=True)
    )
    text = f.lower(x).compile().as_text()
    f(x)
    hostcb.barrier_wait()
  finally:
    jax.config.update("jax_use_shardy_partitioner", before)
  assert not [c for c in COLLECTIVES if c in text], text
  assert _by_device(rec) == {
    d: [(data, index)] for d, (data, index) in _shards(x).items()
  }


_WITHOUT_ENGINE = """
import warnings
warnings.simplefilter("ignore")
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import hostcb
mesh = Mesh(np.array(jax.devices()), ("d",))
x = jax.device_put(jnp.arange(4.0), NamedSharding(mesh, P("d")))
seen = []
jax.jit(lambda v: hostcb.debug.callback(
    lambda a: seen.append(np.asarray(a).tolist()), v, partitioned=True))(x)
jax.effects_barrier()
print(sorted(seen))
try:
  jax.jit(lambda v: hostcb.id_tap(lambda *a: None, v, partitioned=True))(x)
except NotImplementedError as e:
  print("refused:", str(e))
"""


def test_without_the_native_engine_partitioned_debug_goes_to_jax():
  proc = run_python(
    _WITHOUT_ENGINE,
    env_extra={
      "HOSTCB_DISABLE_NATIVE": "1",
      "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
    },
  )
  assert proc.returncode == 0, proc.stderr
  calls, refusal = proc.stdout.splitlines()
  assert calls == "[[0.0, 1.0], [2.0, 3.0]]"  # JAX's, once per shard
  assert refusal.startswith(
    "refused: hostcb: a partitioned tap in a jit over several devices "
    "runs on hostcb's native engine, which does not serve this computation "
    "(platform 'cpu', operand dtypes ['float32']; engine: "
  ), refusal
  assert refusal.endswith(
    "); use partitioned=False, or shard_map, where every device taps its "
    "own operand"
  ), refusal
