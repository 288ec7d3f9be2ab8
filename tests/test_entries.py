"""The kinds of host-function entries: Python and the C++ engine name the
same kinds with the same fields (``_engine/entries.py``,
``_native/entries.h``), and the engine runs an entry by its kind."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcb
from hostcb import _engine as engine
from hostcb._engine import entries, host_functions
from hostcb._engine.native import _native

pytestmark = pytest.mark.skipif(
  not engine.available(),
  reason=f"the native engine is not built here: {engine.unavailable_reason()}",
)

_KINDS = {
  k.__name__: k
  for k in (
    entries.ArrayTap,
    entries.PrintLineTap,
    entries.ArraysTap,
    entries.CallRunner,
    entries.DirectCall,
  )
}


def test_the_engine_takes_pythons_entry_kinds():
  _native.set_entry_kinds(_KINDS)  # what the engine's start hands it


class _OtherArrayTap(NamedTuple):
  function: Any
  second: Any


def test_the_engine_refuses_a_kind_whose_fields_differ_from_its_own():
  with pytest.raises(TypeError, match="the entry kind ArrayTap has other"):
    _native.set_entry_kinds({**_KINDS, "ArrayTap": _OtherArrayTap})


def test_the_engine_refuses_kinds_that_lack_one():
  kinds = {k: v for k, v in _KINDS.items() if k != "DirectCall"}
  with pytest.raises(TypeError, match="lacks the tuple type DirectCall"):
    _native.set_entry_kinds(kinds)


def test_a_one_array_tap_gets_an_array_tap_entry():
  seen = []

  def tap(a, transforms):
    seen.append(a)

  f = jax.jit(lambda x: hostcb.id_tap(tap, x))  # keeps its entry alive
  f(jnp.float32(2.5))
  hostcb.barrier_wait()
  assert seen == [np.float32(2.5)]
  assert [
    e.second
    for e in host_functions.tap_functions
    if type(e) is entries.ArrayTap and e.func is tap
  ] == [()]


def test_a_tap_of_several_arrays_gets_an_arrays_tap_entry():
  seen = []

  def tap(args, transforms):
    seen.append(tuple(map(float, args)))

  f = jax.jit(lambda x, y: hostcb.id_tap(tap, (x, y)))
  f(1.0, 2.0)
  hostcb.barrier_wait()
  assert seen == [(1.0, 2.0)]
  assert any(type(e) is entries.ArraysTap for e in host_functions.tap_functions)


def test_a_call_of_one_array_gets_a_direct_call_entry():
  def twice(a):
    return a * 2

  f = jax.jit(lambda x: hostcb.call(twice, x, result_shape=x))
  assert f(jnp.float32(3.0)) == 6.0
  direct = [
    e
    for e in host_functions.call_runners
    if type(e) is entries.DirectCall and e.func is twice
  ]
  assert len(direct) == 1
