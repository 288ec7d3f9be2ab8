"""What a callback keeps of the ``jax.Array`` s that hostcb's drop-ins hand it.

A callback may keep its argument, take a NumPy view of it, start an
asynchronous computation on it (its result read later) or pass it to
another thread; whatever it keeps must still hold what the program
computed after many later calls.  Each test keeps one argument in three
(the others are dropped, so that the memory of a dropped one is free to be
used again) for one of ``hostcb.debug.callback``, ``hostcb.io_callback`` and
``hostcb.pure_callback``, under ``jit``, ``scan``, ``vmap`` and x64, reads
what it kept only once every call ran, and compares it with what JAX's own
callback keeps in the same program and with the values computed in NumPy.
"""

from __future__ import annotations

import queue
import sys
import threading

import jax
import jax.experimental
import numpy as np
import pytest

import hostcb

DEADLINE = 120.0  # seconds: every wait of these tests ends by then
KEEP_EVERY = 3  # one argument in three is kept
STEPS = 400  # scan steps
CALLS = 40  # jitted calls
BATCH = 48  # vmap's batch
BATCHES = 8  # vmapped calls


def _jax_own(module: str, name: str):
  """JAX's function ``name`` of ``module``, also where hostcb's is there in
  its place (which names what it replaces)."""
  f = getattr(sys.modules[module], name)
  return getattr(f, "_hostcb_replaces", f)


_JAX = {
  "debug_callback": _jax_own("jax._src.debugging", "debug_callback"),
  "io_callback": _jax_own("jax._src.callback", "io_callback"),
  "pure_callback": _jax_own("jax._src.callback", "pure_callback"),
}
_HOSTCB = {
  "debug_callback": hostcb.debug.callback,
  "io_callback": hostcb.io_callback,
  "pure_callback": hostcb.pure_callback,
}


class _Keeper:
  """Keeps one argument in :data:`KEEP_EVERY` by ``how``; :meth:`values`
  reads what it kept, as NumPy arrays, once every call ran."""

  def __init__(self, how: str):
    self.how = how
    self.n = 0
    self.kept: list = []
    self.errors: list = []
    if how == "other_thread":
      self.inbox: queue.Queue = queue.Queue()
      self.thread = threading.Thread(target=self._other_thread, daemon=True)
      self.thread.start()

  def __call__(self, a) -> None:
    self.n += 1
    if (self.n - 1) % KEEP_EVERY:
      return
    if self.how == "array":
      self.kept.append(a)
    elif self.how == "numpy_view":
      self.kept.append(np.asarray(a))
    elif self.how == "async_result":
      # A computation on the argument, dispatched now, its result read at
      # the end.
      self.kept.append(a * 2 + 1)
    else:
      self.inbox.put(a)

  def _other_thread(self) -> None:
    # Keeps what it gets; reads it as NumPy (later than the call that
    # passed it, while later calls run) and keeps that too.
    try:
      while (a := self.inbox.get(timeout=DEADLINE)) is not None:
        self.kept.append((a, np.asarray(a).copy()))
    except BaseException as e:  # noqa: BLE001  (reported by values)
      self.errors.append(e)

  def values(self) -> list:
    if self.how == "other_thread":
      self.inbox.put(None)
      self.thread.join(DEADLINE)
      assert not self.thread.is_alive() and self.errors == []
      out = []
      for a, read_then in self.kept:
        np.testing.assert_array_equal(np.asarray(a), read_then)
        out.append(np.asarray(a))
      return [o.tolist() for o in out]
    return [np.asarray(v).tolist() for v in self.kept]

  def expected(self, computed: list, every: int = KEEP_EVERY) -> list:
    """What it should hold, from the values the program computed (the
    arguments of every call, in order); ``every=1``: what it could."""
    chosen = computed[::every]
    if self.how == "async_result":
      chosen = [np.asarray(v) * 2 + 1 for v in chosen]
    return [np.asarray(v).tolist() for v in chosen]


def _tapped(api: dict, kind: str, keep, x):
  """``x`` through one callback of ``kind`` that calls ``keep(argument)``
  (for ``io_callback``/``pure_callback``: the result is the argument)."""
  if kind == "debug_callback":
    api[kind](keep, x)
    return x

  def host(a):
    keep(a)
    return a

  shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
  if kind == "io_callback":
    return api[kind](host, shape, x)
  return api[kind](host, shape, x, vmap_method="sequential")


def _run(api: dict, kind: str, how: str, transform: str):
  """(what the callback kept, what it should hold, every value it could
  have kept) for one program."""
  keep = _Keeper(how)
  computed: list = []
  if transform == "jit":
    f = jax.jit(lambda x: _tapped(api, kind, keep, x) * 3 + 1)
    for i in range(CALLS):
      x = np.arange(4, dtype=np.float32) + i
      computed.append(x)
      f(x).block_until_ready()
  elif transform == "vmap":
    f = jax.jit(jax.vmap(lambda x: _tapped(api, kind, keep, x) - 2))
    for i in range(BATCHES):
      xs = np.arange(BATCH * 4, dtype=np.float32).reshape(BATCH, 4) + i * 1000
      computed.extend(xs)
      f(xs).block_until_ready()
  else:  # "scan", and "x64": the scan in float64
    dtype = np.float64 if transform == "x64" else np.float32

    @jax.jit
    def f(x):
      def body(c, _):
        return _tapped(api, kind, keep, c) * 0.5 + 1.0, None

      return jax.lax.scan(body, x, None, length=STEPS)[0]

    x = np.arange(4, dtype=dtype) + (1 / 3 if transform == "x64" else 0.25)
    c = x
    for _ in range(STEPS):
      computed.append(c)
      c = c * dtype(0.5) + dtype(1.0)
    np.testing.assert_array_equal(f(x), c)
  jax.effects_barrier()
  return keep.values(), keep.expected(computed), keep.expected(computed, 1)


KINDS = ["debug_callback", "io_callback", "pure_callback"]
HOWS = ["array", "numpy_view", "async_result", "other_thread"]
TRANSFORMS = ["jit", "scan", "vmap", "x64"]


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("kind", KINDS)
def test_what_a_callback_keeps_holds_what_the_program_computed(
  kind, how, transform
):
  def run(api):
    if transform == "x64":
      with jax.enable_x64(True):
        return _run(api, kind, how, transform)
    return _run(api, kind, how, transform)

  ours, expected, _ = run(_HOSTCB)
  theirs, theirs_expected, possible = run(_JAX)
  assert len(expected) > 10
  assert ours == expected
  if transform == "vmap":
    # JAX calls a vmapped debug.callback's elements in an order of its own
    # (so keeps other elements): each kept value one that it computed.
    assert theirs == theirs_expected or _distinct_among(theirs, possible)
  else:
    assert ours == theirs


def _distinct_among(kept: list, computed: list) -> bool:
  values = {tuple(v) for v in computed}
  return len({tuple(v) for v in kept}) == len(kept) and all(
    tuple(v) in values for v in kept
  )


@pytest.mark.parametrize("kind", KINDS)
def test_kept_arguments_are_committed_float64_cpu_arrays_under_x64(kind):
  # What a kept argument is, beside its value: as JAX's.
  def run(api):
    keep = _Keeper("array")
    with jax.enable_x64(True):
      jax.jit(lambda x: _tapped(api, kind, keep, x))(
        np.arange(4, dtype=np.float64)
      ).block_until_ready()
      jax.effects_barrier()
    (a,) = keep.kept
    return (
      type(a).__name__,
      str(a.dtype),
      a.weak_type,
      a.committed,
      str(a.sharding),
    )

  assert run(_HOSTCB) == run(_JAX)
  assert run(_HOSTCB)[:4] == ("ArrayImpl", "float64", False, True)
