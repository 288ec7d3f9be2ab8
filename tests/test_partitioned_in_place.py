"""Per-shard taps read their operands where they lie: in a loop
that updates the tapped array, XLA copied it on the device before every tap
so that it could update it in place afterwards.  hostcb now orders the
update after the tap (the tap returns its operand, in the same buffer, and
the later uses read that), so XLA needs no copy.  A tap never changes a
value: every test compares with the program without the tap.  See
docs/partitioned.md and hostcb._jax_internals.partitioned.read_taps_in_place.
"""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcb
from hostcb import _engine as engine

pytestmark = [
  pytest.mark.multidevice,
  pytest.mark.skipif(
    not engine.available(), reason="needs hostcb's native engine"
  ),
]

N = jax.device_count()
BIG = 1 << 19  # float32 elements per shard: 2 MB, a record with its own block
STEPS = 4


def _sharded(rows: int, cols: int):
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
  return jax.device_put(x, NamedSharding(mesh, P("d")))


def _step(x):
  return x * np.float32(0.5) + np.float32(1.0)


def _loop(tap, steps: int = STEPS):
  """A jitted loop of ``steps`` steps that taps the carry, then updates it;
  ``tap(x)`` returns what the step goes on with (``x`` or the tap's
  result)."""

  def body(i, x):
    return _step(tap(x))

  return jax.jit(lambda x: jax.lax.fori_loop(0, steps, body, x))


def _computations(hlo: str) -> list[str]:
  """The computations of an optimized HLO module's text, one string each."""
  out, current = [], None
  for line in hlo.splitlines():
    if current is None and line.endswith("{") and not line.startswith(" "):
      current = [line]
    elif current is not None:
      current.append(line)
      if line == "}":
        out.append("\n".join(current))
        current = None
  return out


def _tapping(hlo: str) -> str:
  """The one computation that holds hostcb's tap."""
  found = [
    c for c in _computations(hlo) if 'custom_call_target="hostcb_tap"' in c
  ]
  assert len(found) == 1, hlo
  return found[0]


def _tap_line(computation: str) -> str:
  (line,) = [
    ln
    for ln in computation.splitlines()
    if 'custom_call_target="hostcb_tap"' in ln
  ]
  return line


class _Kept:
  """A tap function that keeps every array it gets, by device."""

  def __init__(self):
    self.by_device: dict[int, list] = {}
    self._lock = threading.Lock()

  def __call__(self, a, transforms, *, device, index):
    with self._lock:
      self.by_device.setdefault(device.id, []).append((a, index))


def _expected_steps(x, steps: int = STEPS) -> list[np.ndarray]:
  out, v = [], np.asarray(x)
  for _ in range(steps):
    out.append(v)
    v = v * np.float32(0.5) + np.float32(1.0)
  return out


def _tap_and_go_on(v):
  hostcb.id_tap(lambda *a: None, v, partitioned=True)
  return v


def test_a_tap_in_a_loop_reads_the_carry_without_a_copy():
  x = _sharded(2 * N, 8)
  f = _loop(_tap_and_go_on)
  body = _tapping(f.lower(x).compile().as_text())
  assert "output_to_operand_aliasing" in _tap_line(body)
  assert " copy(" not in body


@pytest.mark.parametrize("uses_result", [False, True])
def test_a_tap_in_a_loop_leaves_every_value_as_computed(uses_result):
  x = _sharded(2 * N, 8)
  kept = _Kept()

  def tap(v):
    out = hostcb.id_tap(kept, v, partitioned=True, tap_with_device=True)
    return out if uses_result else v

  with_tap = _loop(tap)(x)
  without = _loop(lambda v: v)(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(np.asarray(with_tap), np.asarray(without))
  assert with_tap.sharding.is_equivalent_to(without.sharding, 2)
  steps = _expected_steps(x)
  assert sorted(kept.by_device) == sorted(d.id for d in jax.devices())
  for taps in kept.by_device.values():
    assert len(taps) == STEPS
    for (a, index), whole in zip(taps, steps):
      np.testing.assert_array_equal(a, whole[index])


def test_kept_arrays_keep_their_values_after_later_steps_overwrite_the_carry():
  x = _sharded(N, BIG)
  kept = _Kept()
  f = _loop(
    lambda v: hostcb.id_tap(kept, v, partitioned=True, tap_with_device=True)
  )
  out = f(x)
  hostcb.barrier_wait()
  # The device buffer the taps read was overwritten in place at each later
  # step; what the function kept is what each step computed.
  steps = _expected_steps(x)
  for taps in kept.by_device.values():
    assert len(taps) == STEPS
    for (a, index), whole in zip(taps, steps):
      np.testing.assert_array_equal(a, whole[index])
      assert not a.flags.writeable
  np.testing.assert_array_equal(
    np.asarray(out), np.asarray(_loop(lambda v: v)(x))
  )


def test_several_taps_of_one_carry_each_see_it():
  x = _sharded(2 * N, 8)
  first, second = _Kept(), _Kept()

  def taps(v):
    hostcb.id_tap(first, v, partitioned=True, tap_with_device=True)
    hostcb.id_tap(second, v, partitioned=True, tap_with_device=True)
    return v

  with_taps = _loop(taps)(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(
    np.asarray(with_taps), np.asarray(_loop(lambda v: v)(x))
  )
  steps = _expected_steps(x)
  for kept in (first, second):
    for got in kept.by_device.values():
      for (a, index), whole in zip(got, steps, strict=True):
        np.testing.assert_array_equal(a, whole[index])
  assert " copy(" not in _tapping_all(_loop(taps).lower(x).compile().as_text())


def _tapping_all(hlo: str) -> str:
  return "\n".join(
    c for c in _computations(hlo) if 'custom_call_target="hostcb_tap"' in c
  )


def test_a_tap_of_the_programs_argument_returns_nothing():
  # Returning the argument's buffer would make XLA copy it (the caller
  # keeps it): the tap stays as it was lowered.
  x = _sharded(2 * N, 8)
  f = jax.jit(lambda v: hostcb.id_tap(lambda *a: None, v, partitioned=True) * 2)
  assert "output_to_operand_aliasing" not in _tap_line(
    _tapping(f.lower(x).compile().as_text())
  )
  out = f(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(np.asarray(out), np.asarray(x) * 2)


def test_a_value_read_before_the_tap_is_left_to_xla():
  # A use before the tap: nothing orders it before an update in place.
  x = _sharded(2 * N, 8)
  kept = _Kept()

  def f(v):
    w = v + 1
    a = w * 2
    hostcb.id_tap(kept, w, partitioned=True, tap_with_device=True)
    return a + w

  jitted = jax.jit(f)
  assert "output_to_operand_aliasing" not in _tap_line(
    _tapping(jitted.lower(x).compile().as_text())
  )
  out = jitted(x)
  hostcb.barrier_wait()
  whole = np.asarray(x) + 1
  np.testing.assert_array_equal(np.asarray(out), whole * 2 + whole)
  for got in kept.by_device.values():
    ((a, index),) = got
    np.testing.assert_array_equal(a, whole[index])


def test_one_value_tapped_twice_in_one_tap_keeps_its_values():
  x = _sharded(2 * N, 8)
  kept = _Kept()

  def tap(v):
    hostcb.id_tap(kept, (v, v), partitioned=True, tap_with_device=True)
    return v

  out = _loop(tap)(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(
    np.asarray(out), np.asarray(_loop(lambda v: v)(x))
  )
  steps = _expected_steps(x)
  for got in kept.by_device.values():
    for ((a, b), (ia, ib)), whole in zip(got, steps, strict=True):
      np.testing.assert_array_equal(a, whole[ia])
      np.testing.assert_array_equal(b, whole[ib])


def test_jax_debug_callback_drop_in_reads_the_carry_without_a_copy():
  x = _sharded(2 * N, 8)
  seen = []
  lock = threading.Lock()

  def keep(a):
    with lock:
      seen.append(np.array(a))

  def tap(v):
    hostcb.debug.callback(keep, v, partitioned=True)
    return v

  f = _loop(tap)
  assert " copy(" not in _tapping(f.lower(x).compile().as_text())
  out = f(x)
  jax.effects_barrier()
  np.testing.assert_array_equal(
    np.asarray(out), np.asarray(_loop(lambda v: v)(x))
  )
  assert len(seen) == STEPS * N
  got = sorted(float(a.sum()) for a in seen)
  want = sorted(
    float(step[k * 2 : k * 2 + 2].sum())
    for step in _expected_steps(x)
    for k in range(N)
  )
  assert got == want
