"""Partitioned debug callbacks against JAX's own, program by program.

Each scenario runs twice in this process: with ``jax.debug.callback``
(or ``jax.debug.print``) and ``partitioned=True``, the oracle, and with
hostcb's.  The calls are compared as a multiset (devices call in no set
order between them): how many, and for each the shapes and values of its
arguments together, so that a wrong pairing of arguments shows.  The
tests are marked ``multidevice``: ``make test`` runs them on 4 CPU
devices and again on 2.
"""

from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcb

pytestmark = pytest.mark.multidevice

N = jax.device_count()


def _mesh() -> Mesh:
  return Mesh(np.array(jax.devices()), ("d",))


_ROWS = P("d")


def _sharded(x, spec=_ROWS):
  return jax.device_put(x, NamedSharding(_mesh(), spec))


def _square(offset: int = 0):
  """An (N, N) int32 array split by rows."""
  return _sharded(np.arange(N * N, dtype=np.int32).reshape(N, N) + offset)


def _replicated(x):
  return jax.device_put(x, NamedSharding(_mesh(), P()))


_AXES = [(0, 0), (0, 1), (1, 0), (1, 1), (0, None), (None, 1), (1, None)]


def _vmapped(in_axes):
  def build(cb):
    return jax.jit(jax.vmap(lambda a, b: cb(a, b), in_axes=in_axes)), (
      _square(),
      _square(100),
    )

  return build


def _nested(outer, inner):
  def build(cb):
    f = jax.vmap(jax.vmap(lambda a, b: cb(a, b), in_axes=inner), in_axes=outer)
    cube = np.arange(N**3, dtype=np.int32).reshape(N, N, N)
    x, y = _sharded(cube), _sharded(cube + 1000, P(None, "d"))
    return jax.jit(f), (x, y)

  return build


def _sharded_with_replicated(in_axes):
  def build(cb):
    w = _replicated(np.arange(N, dtype=np.int32) * 10)
    return jax.jit(jax.vmap(lambda a, b: cb(a, b), in_axes=in_axes)), (
      _square(),
      w,
    )

  return build


def _scan(cb):
  def f(x):
    def body(c, row):
      cb(c, row)
      return c + 1, row

    return jax.lax.scan(body, jnp.zeros((), jnp.int32), x)

  return jax.jit(f), (
    _sharded(
      np.arange(3 * 2 * N, dtype=np.int32).reshape(3, 2 * N), P(None, "d")
    ),
  )


def _cond(cb):
  def f(x, p):
    return jax.lax.cond(p, lambda v: (cb(v), v)[1], lambda v: v * 2, x)

  return jax.jit(f), (_square(), True)


def _cond_not_taken(cb):
  def f(x, p):
    return jax.lax.cond(p, lambda v: (cb(v), v)[1], lambda v: v * 2, x)

  return jax.jit(f), (_square(), False)


def _grad(cb):
  def loss(x):
    cb(x)
    return jnp.sum(x * x)

  x = _sharded(np.arange(2 * N, dtype=np.float32))
  return jax.jit(jax.grad(loss)), (x,)


def _jvp(cb):
  def f(x):
    cb(x * 2)
    return jnp.sin(x)

  x = _sharded(np.arange(2 * N, dtype=np.float32))
  return jax.jit(lambda v: jax.jvp(f, (v,), (jnp.ones_like(v),))), (x,)


def _shard_map(cb):
  f = jax.shard_map(
    lambda v, w: (cb(v, w), v)[1],
    mesh=_mesh(),
    in_specs=(P("d"), P()),
    out_specs=P("d"),
  )
  return jax.jit(f), (_square(), _replicated(np.arange(3, dtype=np.int32)))


def _vmap_in_shard_map(cb):
  f = jax.shard_map(
    jax.vmap(lambda v: (cb(v), v)[1], in_axes=1, out_axes=1),
    mesh=_mesh(),
    in_specs=P("d"),
    out_specs=P("d"),
  )
  return jax.jit(f), (_square(),)


def _vmap_of_scan(cb):
  def one(row):
    def body(c, v):
      cb(c, v)
      return c + v, v

    return jax.lax.scan(body, jnp.zeros((), jnp.int32), row)[0]

  return jax.jit(jax.vmap(one)), (_square(),)


SCENARIOS = {
  **{f"vmap_in_axes_{a}_{b}": _vmapped((a, b)) for a, b in _AXES},
  **{
    f"nested_vmap_{o[0]}{o[1]}_{i[0]}{i[1]}": _nested(o, i)
    for o, i in [
      ((0, 0), (0, 1)),
      ((0, 1), (1, 0)),
      ((None, 0), (0, 1)),
      ((1, 1), (0, 0)),
    ]
  },
  "vmap_sharded_with_replicated": _sharded_with_replicated((0, None)),
  "vmap_sharded_with_replicated_batched": _sharded_with_replicated((1, 0)),
  "scan": _scan,
  "cond": _cond,
  "cond_not_taken": _cond_not_taken,
  "grad": _grad,
  "jvp": _jvp,
  "shard_map": _shard_map,
  "vmap_in_shard_map": _vmap_in_shard_map,
  "vmap_of_scan": _vmap_of_scan,
}


def _calls(debug_callback, build) -> list:
  """Sorted (shape, values) of the arguments of each call."""
  got = []
  lock = threading.Lock()

  def record(*values):
    with lock:
      got.append(tuple((np.shape(v), np.asarray(v).tolist()) for v in values))

  fn, args = build(lambda *a: debug_callback(record, *a, partitioned=True))
  jax.block_until_ready(fn(*args))
  jax.effects_barrier()
  return sorted(got, key=repr)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_partitioned_debug_callback_calls_as_jax_does(name):
  theirs = _calls(jax.debug.callback, SCENARIOS[name])
  ours = _calls(hostcb.debug.callback, SCENARIOS[name])
  assert ours == theirs
  if name != "cond_not_taken":
    assert ours  # called at all


def _printed(debug_print, build, capsys) -> list:
  capsys.readouterr()
  fn, args = build(
    lambda *a: debug_print(" ".join(["{}"] * len(a)), *a, partitioned=True)
  )
  jax.block_until_ready(fn(*args))
  jax.effects_barrier()
  return sorted(capsys.readouterr().out.splitlines())


@pytest.mark.parametrize(
  "name",
  [
    "vmap_in_axes_0_1",
    "vmap_in_axes_1_0",
    "nested_vmap_01_10",
    "scan",
    "shard_map",
  ],
)
def test_partitioned_debug_print_prints_as_jax_does(name, capsys):
  theirs = _printed(jax.debug.print, SCENARIOS[name], capsys)
  ours = _printed(hostcb.debug.print, SCENARIOS[name], capsys)
  assert ours == theirs
  assert ours


def test_the_issue_example_prints_four_pairs(capsys):
  """vmap with in_axes=(0, 1) over two row-sharded arrays."""

  @functools.partial(jax.vmap, in_axes=(0, 1))
  def f(x, y):
    hostcb.debug.print("hello: {} {}", x, y, partitioned=True)

  mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
  s = NamedSharding(mesh, P("x"))
  x = jax.device_put(np.arange(4).reshape(2, 2), s)
  y = jax.device_put(np.arange(4).reshape(2, 2) + 6, s)
  jax.jit(f)(x, y)
  jax.effects_barrier()
  assert sorted(capsys.readouterr().out.splitlines()) == [
    "hello: [0 1] [6]",
    "hello: [0 1] [8]",
    "hello: [2 3] [7]",
    "hello: [2 3] [9]",
  ]


# ------------------------------------------- id_tap: shards of the batch
@pytest.mark.parametrize("in_axes", _AXES)
def test_partitioned_tap_under_vmap_gets_the_shards_its_index_names(in_axes):
  """``id_tap(partitioned=True)`` keeps its own semantics under ``vmap``:
  each device taps its shard of the batched operands, and ``index``
  names where each lies in the batched (global) array."""
  seen = []
  lock = threading.Lock()

  def rec(arg, transforms, *, device, index):
    with lock:
      seen.append((arg, transforms, index))

  x, y = _square(), _square(100)
  jax.jit(
    jax.vmap(
      lambda a, b: hostcb.id_tap(
        rec, (a, b), partitioned=True, tap_with_device=True
      ),
      in_axes=in_axes,
    )
  )(x, y)
  hostcb.barrier_wait()
  whole = (np.asarray(x), np.asarray(y))
  # Each device at least once (more where an operand is replicated).
  assert len(seen) >= N
  batch = tuple(None if d is None else d for d in in_axes)
  for arg, transforms, index in seen:
    assert transforms == (("batch", {"batch_dims": batch}),)
    for got, full, ix in zip(arg, whole, index):
      np.testing.assert_array_equal(got, full[ix])
