"""Host functions: identity, lifetime, and never the wrong function.

* two callables that compare equal are two functions, at every entry point,
  with the native engine and without it (``HOSTCB_DISABLE_NATIVE=1``), and
  an unhashable callable is accepted;
* the engine's entry of a host function lives as long as the compiled
  programs that can call it, and never less than a queued record needs;
* an executable that calls process-local functions cannot be serialized;
* tap arrays are read-only in both modes; a failed ``jax.debug.callback``
  that the script does not catch makes it exit with status 1, as JAX
  does; errors that say what came back.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import Recorder, Stream, hostcb_root, run_python

import hostcb
from hostcb import _engine as engine
from hostcb import host_callback as hcb
from hostcb import _import_hook as import_hook
from hostcb._engine import native, host_functions

S = jax.ShapeDtypeStruct((), jnp.float32)


@dataclasses.dataclass(frozen=True)
class Scale:
  """Equality leaves out ``factor``: Scale("s", 2.) == Scale("s", 10.)."""

  name: str
  factor: float = dataclasses.field(compare=False)

  def __call__(self, x, *rest, **kwargs):
    return np.float32(x * self.factor)


@dataclasses.dataclass(frozen=True)
class EqualRecorder:
  """A tap function that compares equal to every other of its name."""

  name: str
  calls: list = dataclasses.field(compare=False, default_factory=list)

  def __call__(self, arg, *rest, **kwargs):
    self.calls.append(np.asarray(arg).tolist())


class Unhashable:
  """A callable with ``__eq__`` and no ``__hash__``."""

  def __init__(self, factor):
    self.factor = factor
    self.calls = []

  def __eq__(self, other):
    return isinstance(other, Unhashable)

  def __call__(self, x, *rest, **kwargs):
    self.calls.append(float(np.asarray(x)))
    return np.float32(x * self.factor)


@pytest.fixture
def installed():
  import_hook.install_jax_callbacks()
  try:
    yield
  finally:
    import_hook.uninstall_jax_callbacks()


# ------------------------------------------------ 1. equal callables
def _two(make):
  """Runs ``make(f)`` jitted for two equal callables; their results."""
  a, b = Scale("s", 2.0), Scale("s", 10.0)
  assert a == b and a is not b
  return [float(jax.jit(lambda x, f=f: make(f, x))(1.0)) for f in (a, b)]


@pytest.mark.parametrize(
  "make",
  [
    lambda f, x: hostcb.io_callback(f, S, x),
    lambda f, x: hostcb.io_callback(f, S, x, ordered=True),
    lambda f, x: hostcb.pure_callback(f, S, x),
    lambda f, x: hcb.call(f, x, result_shape=S),
  ],
  ids=["io_callback", "io_callback_ordered", "pure_callback", "call"],
)
def test_equal_callables_are_two_functions_in_calls(make):
  assert _two(make) == [2.0, 10.0]


def test_equal_callables_are_two_functions_in_eager_calls():
  a, b = Scale("s", 2.0), Scale("s", 10.0)
  assert float(hostcb.io_callback(a, S, 1.0)) == 2.0
  assert float(hostcb.io_callback(b, S, 1.0)) == 10.0
  assert float(hostcb.pure_callback(a, S, 1.0)) == 2.0
  assert float(hostcb.pure_callback(b, S, 1.0)) == 10.0


@pytest.mark.parametrize(
  "tap",
  [
    lambda f, x: hcb.id_tap(f, x),
    lambda f, x: hcb.id_tap(f, x, tap_with_device=True),
    lambda f, x: hostcb.debug.callback(f, x),
    lambda f, x: hostcb.debug.callback(f, x, ordered=True),
  ],
  ids=[
    "id_tap",
    "id_tap_with_device",
    "debug_callback",
    "debug_callback_ordered",
  ],
)
def test_equal_tap_functions_each_get_their_own_taps(tap):
  a, b = EqualRecorder("r"), EqualRecorder("r")
  assert a == b
  jax.jit(lambda x: tap(a, x))(1.0)
  jax.jit(lambda x: tap(b, x))(2.0)
  hcb.barrier_wait()
  assert (a.calls, b.calls) == ([1.0], [2.0])


@pytest.mark.multidevice
def test_equal_tap_functions_each_get_their_own_shards():
  from jax.sharding import Mesh, NamedSharding, PartitionSpec

  n = jax.device_count()
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.device_put(
    np.arange(n, dtype=np.float32), NamedSharding(mesh, PartitionSpec("d"))
  )
  a, b = EqualRecorder("r"), EqualRecorder("r")
  jax.jit(lambda v: hcb.id_tap(a, v, partitioned=True))(x)
  jax.jit(lambda v: hcb.id_tap(b, v + 10, partitioned=True))(x)
  hcb.barrier_wait()
  assert sorted(a.calls) == [[float(i)] for i in range(n)]
  assert sorted(b.calls) == [[float(i + 10)] for i in range(n)]


def test_equal_output_streams_of_id_print_each_get_their_prints():

  class EqualStream(Stream):
    def __eq__(self, other):
      return isinstance(other, EqualStream)

    __hash__ = None

  s1, s2 = EqualStream(), EqualStream()
  jax.jit(lambda x: hcb.id_print(x, output_stream=s1))(1.0)
  jax.jit(lambda x: hcb.id_print(x, output_stream=s2))(2.0)
  hcb.barrier_wait()
  assert (s1.output, s2.output) == ("1.\n", "2.\n")


def test_id_print_keywords_that_compare_equal_but_print_differently():
  from decimal import Decimal

  s = Stream()
  jax.jit(lambda x: hcb.id_print(x, what=Decimal("1.0"), output_stream=s))(1.0)
  jax.jit(lambda x: hcb.id_print(x, what=Decimal("1.00"), output_stream=s))(1.0)
  hcb.barrier_wait()
  assert s.output == "what: 1.0\n1.\nwhat: 1.00\n1.\n"


def test_equal_callables_are_two_functions_under_install(installed):
  a, b = Scale("s", 2.0), Scale("s", 10.0)
  for make in (
    lambda f, x: jax.pure_callback(f, S, x),
    lambda f, x: jax.experimental.io_callback(f, S, x),
  ):
    assert _two(make) == [2.0, 10.0]
  ra, rb = EqualRecorder("r"), EqualRecorder("r")
  jax.jit(lambda x: jax.debug.callback(ra, x))(1.0)
  jax.jit(lambda x: jax.debug.callback(rb, x))(2.0)
  jax.effects_barrier()
  assert (ra.calls, rb.calls) == ([1.0], [2.0])
  del a, b


def test_two_bound_methods_of_one_object_are_one_function():
  # obj.method is a new object at each access: still the same function,
  # so that retracing a loop body reuses one compiled callback.
  rec = Recorder()
  f = jax.jit(lambda x: hcb.id_tap(rec.__call__, hcb.id_tap(rec.__call__, x)))
  f(1.0)
  hcb.barrier_wait()
  assert rec.args == [1.0, 1.0]
  t1 = hostcb._core.primitives.TapTarget(rec.__call__, None, False)
  t2 = hostcb._core.primitives.TapTarget(rec.__call__, None, False)
  assert t1 == t2 and hash(t1) == hash(t2)


@pytest.mark.parametrize(
  "api", ["id_tap", "call", "io_callback", "pure_callback", "debug_callback"]
)
def test_an_unhashable_callable_is_accepted(api):
  f = Unhashable(3.0)
  with pytest.raises(TypeError):
    hash(f)
  if api == "id_tap":
    jax.jit(lambda x: hcb.id_tap(f, x))(2.0)
  elif api == "debug_callback":
    jax.jit(lambda x: hostcb.debug.callback(f, x))(2.0)
  else:
    make = {
      "call": lambda x: hcb.call(f, x, result_shape=S),
      "io_callback": lambda x: hostcb.io_callback(f, S, x),
      "pure_callback": lambda x: hostcb.pure_callback(f, S, x),
    }[api]
    assert float(jax.jit(make)(2.0)) == 6.0
  hcb.barrier_wait()
  assert f.calls == [2.0]


_FALLBACK_SCRIPT = """
import dataclasses, numpy as np, jax, jax.numpy as jnp, hostcb
from hostcb import host_callback as hcb, engine
assert not engine.available()
S = jax.ShapeDtypeStruct((), jnp.float32)
@dataclasses.dataclass(frozen=True)
class Scale:
  name: str
  factor: float = dataclasses.field(compare=False)
  def __call__(self, x, *rest):
    out.append(float(x) * self.factor)
    return np.float32(x * self.factor)
class Unhashable:
  __hash__ = None
  def __eq__(self, other): return True
  def __call__(self, x, *rest): out.append(-float(x)); return np.float32(x)
out = []
a, b = Scale("s", 2.0), Scale("s", 10.0)
for make in (lambda f, x: hostcb.io_callback(f, S, x),
             lambda f, x: hostcb.pure_callback(f, S, x),
             lambda f, x: hcb.call(f, x, result_shape=S),
             lambda f, x: hcb.id_tap(f, x),
             lambda f, x: hostcb.debug.callback(f, x)):
  for f in (a, b, Unhashable()):
    jax.jit(lambda x, f=f: make(f, x))(1.0)
  hcb.barrier_wait()
seen = []
jax.jit(lambda x: hcb.id_tap(lambda v, t: seen.append(v.flags.writeable),
                             x))(np.ones(3, np.float32))
hcb.barrier_wait()
print(out, seen)
"""


def test_equal_callables_and_read_only_arrays_without_the_native_engine():
  proc = run_python(_FALLBACK_SCRIPT, env_extra={"HOSTCB_DISABLE_NATIVE": "1"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == f"{[2.0, 10.0, -1.0] * 5} [False]\n"


# ------------------------------------------------------- 2. lifetime
class Big:
  """A host function holding a large array."""

  def __init__(self):
    self.data = np.ones(1 << 18)  # 2 MB

  def __call__(self, x, *rest, **kwargs):
    return np.float32(x)


def _build(api, f):
  if api == "id_tap":
    return jax.jit(lambda x: hcb.id_tap(f, x))
  if api == "call":
    return jax.jit(lambda x: hcb.call(f, x, result_shape=S))
  if api == "io_callback":
    return jax.jit(lambda x: hostcb.io_callback(f, S, x))
  if api == "debug_callback":
    return jax.jit(lambda x: (hostcb.debug.callback(f, x), x)[1])
  assert api == "jax.debug.callback"
  return jax.jit(lambda x: (jax.debug.callback(f, x), x)[1])


@pytest.mark.parametrize(
  "api", ["id_tap", "call", "io_callback", "debug_callback"]
)
def test_clear_caches_frees_the_host_functions_of_dropped_programs(api):
  _free_after_clear_caches(api)


def test_clear_caches_frees_jax_debug_callbacks_under_install(installed):
  _free_after_clear_caches("jax.debug.callback")


def _settled_live_ids() -> int:
  """Live ids once every retired id whose records ran is freed (a barrier
  frees the ids retired before it)."""
  gc.collect()
  hcb.barrier_wait()
  return host_functions.live_ids()


def _free_after_clear_caches(api):
  jax.clear_caches()
  before = _settled_live_ids()
  refs, fns = [], []
  for _ in range(20):
    f = Big()
    refs.append(weakref.ref(f))
    fns.append(_build(api, f))
    fns[-1](1.0)
  del f
  hcb.barrier_wait()
  assert host_functions.live_ids() == before + 20
  assert sum(r() is not None for r in refs) == 20
  del fns
  jax.clear_caches()
  gc.collect()
  hcb.barrier_wait()  # frees the entries retired before it
  gc.collect()
  assert sum(r() is not None for r in refs) == 0
  assert host_functions.live_ids() == before


@pytest.mark.parametrize(
  "api", ["id_tap", "call", "io_callback", "debug_callback"]
)
def test_dropping_a_jitted_function_frees_its_host_function(api):
  # As JAX's own callbacks: no clear_caches needed (JAX's caches keyed by
  # primitive parameters hold hostcb's targets weakly).
  f = Big()
  ref = weakref.ref(f)
  g = _build(api, f)
  g(1.0)
  del f, g
  gc.collect()
  hcb.barrier_wait()  # frees the entries retired before it
  gc.collect()
  assert ref() is None


def test_a_dropped_program_still_running_keeps_its_functions_for_its_taps():
  # The jitted function and the result are dropped at once, the
  # computation may still run: its taps reach their function (a barrier,
  # not the garbage collection, frees an entry).
  got = []
  jax.jit(
    lambda x: jax.lax.fori_loop(
      0,
      50,
      lambda i, v: hcb.id_tap(lambda a, t: got.append(float(a[0])), v) + 1,
      x,
    )
  )(jnp.zeros((1 << 16,)))
  gc.collect()
  hcb.barrier_wait()
  assert got == [float(i) for i in range(50)]


def test_a_live_program_keeps_its_host_function():
  f = Big()
  ref = weakref.ref(f)
  g = _build("call", f)
  del f
  gc.collect()
  assert ref() is not None
  assert float(g(3.0)) == 3.0
  jax.clear_caches()  # g's own executable stays with g
  gc.collect()
  assert float(g(4.0)) == 4.0


def test_retracing_keeps_the_registry_bounded():
  jax.clear_caches()
  before = _settled_live_ids()
  # (entries of names registered by earlier tests are in the table too)
  entries = sum(e is not None for e in host_functions.tap_functions)
  rec = Recorder()
  f = jax.jit(lambda x: hcb.id_tap(rec, x))
  for i in range(200):
    jax.clear_caches()
    f(float(i))
  # The executable of the last trace is alive (f's cache); each retired one
  # was freed once its tap had run, and left one empty slot per table.
  # (<=: programs of earlier tests may be collected meanwhile)
  assert _settled_live_ids() <= before + 1
  assert sum(e is not None for e in host_functions.tap_functions) <= entries + 1
  assert rec.args == [float(i) for i in range(200)]


def _soak_entries() -> int:
  """Entries of the soak's keys, live or retired but not yet freed."""
  return sum(
    1
    for key in list(host_functions._keys.values())
    if isinstance(key, tuple) and key[:1] == ("soak",)
  )


def test_ten_thousand_retired_ids_hold_bounded_memory():
  # Each iteration is what a retrace does to the registry: one new entry,
  # its lease kept with the (new) executable, freed with it.  (A real
  # retrace costs milliseconds in JAX, so 10,000 of them would take
  # minutes: test_retracing_keeps_the_registry_bounded covers that path.)
  _settled_live_ids()
  tracemalloc.start()
  try:
    for i in range(10_000):
      if i == 1000:
        gc.collect()
        base, _ = tracemalloc.get_traced_memory()
      big = Big()
      lease = engine.target_id(("soak", big), lambda big=big: (big, ()), big)
      assert _soak_entries() == 1
      del lease, big
      # What a barrier does for the registry (no computation runs here).
      host_functions.barrier_done(host_functions.barrier_started())
      assert _soak_entries() == 0
    gc.collect()
    used, _ = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  # The slots of 9,000 freed ids (three table slots of 8 bytes each, and a
  # bit that says it was given) and nothing per id beyond them.
  assert used - base < 9_000 * 3 * 8 + 9_000 // 8 + 200_000


def test_a_queued_tap_keeps_its_function_until_it_ran():
  release = threading.Event()
  got = []

  class Slow:
    def __call__(self, x, transforms):
      assert release.wait(60), "the test never released the tap function"
      got.append(float(x))

  slow = Slow()
  ref = weakref.ref(slow)
  f = jax.jit(lambda x, slow=slow: hcb.id_tap(slow, x))
  for i in range(5):
    f(float(i))
  del f, slow
  jax.clear_caches()
  gc.collect()
  assert ref() is not None  # four taps are still queued behind the first
  release.set()
  hcb.barrier_wait()
  assert got == [0.0, 1.0, 2.0, 3.0, 4.0]
  gc.collect()
  assert ref() is None


def test_a_tap_whose_entry_was_freed_is_reported_not_given_to_another():
  # An id is never reused: a record whose function is gone (a program run
  # after it was freed) fails the next barrier with its id.
  rec = Recorder()
  lease = engine.target_id(("gone", rec), lambda: rec.__call__, rec)
  tid = lease.tid
  del lease
  gc.collect()
  hcb.barrier_wait()
  assert host_functions.tap_functions[tid] is None
  rec2 = Recorder()
  lease2 = engine.target_id(("other", rec2), lambda: rec2.__call__, rec2)
  assert lease2.tid != tid


# Without a barrier: a retired id is freed once no record can name it.
class _Deaths:
  """Counts the deaths of the objects it watches, and waits for them with
  a deadline, in short slices: between them the interpreter runs what the
  engine asked its main thread to run (an executable that an XLA thread
  dropped)."""

  def __init__(self):
    self._cond = threading.Condition()
    self.dead = 0

  def watch(self, obj):
    weakref.finalize(obj, self._died)
    return obj

  def _died(self):
    with self._cond:
      self.dead += 1
      self._cond.notify_all()

  def wait_for(self, n: int, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    with self._cond:
      while self.dead < n:
        left = deadline - time.monotonic()
        if left <= 0:
          return False
        self._cond.wait(min(left, 0.05))
    return True


# jax 0.8's XLA has no jax.ffi.register_ffi_type, and may end a dropped
# executable's state while a computation of it still runs: there hostcb
# does not count executables, and a barrier frees retired functions.
_counted = pytest.mark.skipif(
  not hasattr(jax.ffi, "register_ffi_type"),
  reason=f"jax {jax.__version__} has no jax.ffi.register_ffi_type: hostcb "
  "does not count its executables (a barrier frees dropped functions)",
)


@_counted
@pytest.mark.parametrize(
  "api", ["id_tap", "call", "io_callback", "debug_callback"]
)
def test_dropped_programs_free_their_host_functions_without_a_barrier(api):
  # The program, scaled down: 20 jitted functions whose host
  # functions hold 2 MB each, dropped, then jax.clear_caches(); the
  # program never calls barrier_wait.
  assert engine.available() and native.counts_executables()
  hcb.barrier_wait()  # (what earlier tests left; nothing of this test's)
  deaths = _Deaths()
  for i in range(20):
    g = _build(api, deaths.watch(Big()))
    assert float(g(float(i))) == float(i)
  del g
  jax.clear_caches()
  gc.collect()
  assert deaths.wait_for(20), f"{deaths.dead} of 20 host functions freed"


_FREES_WITHOUT_THE_ENGINE = """
import gc, threading, time, weakref
import jax, numpy as np
import hostcb
from hostcb import _engine as engine
from hostcb import host_callback as hcb

assert not engine.available()
cond, dead = threading.Condition(), [0]

def died():
  with cond:
    dead[0] += 1
    cond.notify_all()

class Big:
  def __init__(self):
    self.data = np.ones(1 << 18)
    weakref.finalize(self, died)
  def __call__(self, x, *rest, **kwargs):
    pass

for i in range(20):
  f = Big()
  if i % 2:
    g = jax.jit(lambda x: hcb.id_tap(f, x))
  else:
    g = jax.jit(lambda x: (hostcb.debug.callback(f, x), x)[1])
  g(float(i)).block_until_ready()
del f, g
jax.clear_caches()
gc.collect()
deadline = time.monotonic() + 60
with cond:
  while dead[0] < 20 and time.monotonic() < deadline:
    cond.wait(0.05)
print(dead[0], "of 20")
"""


def test_dropped_programs_free_their_host_functions_without_the_engine():
  # The Python-callback back end: its consumer held the last batch of taps
  # (and their functions) until the next one.
  proc = run_python(
    _FREES_WITHOUT_THE_ENGINE, env_extra={"HOSTCB_DISABLE_NATIVE": "1"}
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "20 of 20\n"


class _Silent:
  def __call__(self, x, *rest, **kwargs):
    pass


@_counted
def test_ten_thousand_dropped_host_functions_are_freed_without_a_barrier():
  # 100 programs of 100 tap functions each, each program dropped after it
  # ran; every tenth program, what was dropped before it must be freed
  # (no barrier): at no point do more than ten programs' functions live.
  hcb.barrier_wait()
  gc.collect()
  live, tracked = host_functions.live_ids(), native.tracked_targets()
  deaths = _Deaths()

  def program(fns):
    def f(x):
      for fn in fns:
        x = hcb.id_tap(fn, x)
      return x

    return jax.jit(f)

  for i in range(100):
    g = program([deaths.watch(_Silent()) for _ in range(100)])
    g(float(i))
    del g
    if i % 10 == 9:
      assert deaths.wait_for(100 * (i + 1)), f"{deaths.dead} freed"
      assert host_functions.live_ids() <= live + 10  # (other tests' programs)
      assert native.tracked_targets() <= tracked + 10
  assert deaths.dead == 10_000


@_counted
def test_a_program_dropped_while_it_runs_keeps_its_functions_until_its_taps_ran():
  # The computation is still running (its device waits for space in a
  # small queue, held full by a tap function that waits for an event) when
  # its jitted function is dropped and its last lease dies; its later taps
  # are not queued yet.  Each tap still runs with its own function, which
  # is freed after the last one ran, without a barrier.
  hcb.barrier_wait()
  native.set_capacity(8192)  # a few 1 KB taps (applied: the queue is empty)
  entered, release = threading.Event(), threading.Event()
  got = []
  gate_blocks = [False]

  def gate(x, *rest, **kwargs):
    if gate_blocks[0]:
      entered.set()
      assert release.wait(60), "the test never released the gate"

  class Record:
    def __call__(self, x, *rest, **kwargs):
      got.append(int(x[0]))

  def make(rec):
    def heavy(x):  # a loop of matmuls: XLA dispatches it asynchronously
      m = jnp.full((128, 128), x)
      return jax.lax.fori_loop(0, 2, lambda i, c: jnp.sin(c) @ jnp.cos(c), m)

    def step(c, i):
      return c, hcb.id_tap(rec, jnp.full((256,), i))

    return jax.jit(
      lambda x: jax.lax.scan(
        step, hcb.id_tap(gate, heavy(x)[0, 0]), jnp.arange(64)
      )[1]
    )

  deaths = _Deaths()
  try:
    ids_before = set(host_functions._keys)
    f = make(deaths.watch(Record()))
    f(0.0).block_until_ready()  # compiled, and run once
    hcb.barrier_wait()
    ids = set(host_functions._keys) - ids_before
    got.clear()
    gate_blocks[0] = True
    r = f(0.0)
    assert entered.wait(60), "the gate's tap never ran"
    del f, r
    jax.clear_caches()
    gc.collect()
    assert ids and not ids & set(host_functions._leases)  # the leases died
    assert deaths.dead == 0  # its executable runs: nothing is freed
    release.set()
    assert deaths.wait_for(1), "the tap function was never freed"
  finally:
    release.set()
    native.set_capacity(
      hostcb.config.read("jax_host_callback_max_queue_byte_size")
    )
  assert got == list(range(64))
  assert engine.errors.take_last_exception() is None  # no tap was lost


# ------------------------------------------------- 3. serialization
@pytest.mark.parametrize("api", ["id_tap", "call", "debug_callback"])
def test_serializing_an_executable_with_a_process_local_function_is_refused(
  api,
):
  from jax.experimental import serialize_executable

  compiled = _build(api, Big()).lower(1.0).compile()
  with pytest.raises(host_functions.ProcessLocalFunctionError) as info:
    serialize_executable.serialize(compiled)
  message = str(info.value)
  assert "exists only in the process that compiled it" in message
  assert "hostcb.register(name, fn)" in message


_SERIALIZE_A = """
import sys, jax
from jax.experimental import serialize_executable
from hostcb import host_callback as hcb
tapped = jax.jit(lambda x: hcb.id_tap(lambda v, t: print("A's tap", v), x) + 1)
plain = jax.jit(lambda x: x + 1)
for name, fn in (("tapped", tapped), ("plain", plain)):
  try:
    data, _, _ = serialize_executable.serialize(fn.lower(1.0).compile())
  except Exception as e:
    print(name, "refused:", type(e).__name__)
    continue
  with open(f"{sys.argv[1]}/{name}.bin", "wb") as out:
    out.write(data)
  print(name, "serialized")
"""

_SERIALIZE_B = """
import os, pickle, sys, jax
from jax.experimental import serialize_executable
from hostcb import host_callback as hcb
got = []
jax.jit(lambda x: hcb.id_tap(lambda v, t: got.append(float(v)), x))(5.0)
hcb.barrier_wait()
lower = jax.jit(lambda x: x + 1).lower(1.0)
for name in ("tapped", "plain"):
  path = f"{sys.argv[1]}/{name}.bin"
  if not os.path.exists(path):
    print(name, "absent")
    continue
  with open(path, "rb") as f:
    data = f.read()
  compiled = serialize_executable.deserialize_and_load(
      data, lower.in_tree, lower.out_tree,
      execution_devices=jax.devices()[:1])
  print(name, "ran", float(compiled(1.0)))
hcb.barrier_wait()
print("B's taps", got)
"""


def test_another_process_never_runs_a_serialized_tap_of_this_one(tmp_path):
  env = dict(os.environ, PYTHONPATH=hostcb_root(), JAX_PLATFORMS="cpu")

  def run(code):
    return subprocess.run(
      [sys.executable, "-c", code, str(tmp_path)],
      env=env,
      capture_output=True,
      text=True,
      timeout=240,
    )

  a = run(_SERIALIZE_A)
  assert a.returncode == 0, a.stderr
  assert a.stdout == (
    "tapped refused: ProcessLocalFunctionError\nplain serialized\n"
  )
  b = run(_SERIALIZE_B)
  assert b.returncode == 0, b.stderr
  assert b.stdout == ("tapped absent\nplain ran 2.0\nB's taps [5.0]\n")


# --------------------------------------------- 4. smaller differences
def test_tap_arrays_are_read_only_with_the_engine():
  seen = []
  jax.jit(lambda x: hcb.id_tap(lambda v, t: seen.append(v.flags.writeable), x))(
    np.ones(3, np.float32)
  )
  hcb.barrier_wait()
  assert seen == [False]


def _exit_script(body: str) -> str:
  return textwrap.dedent("""
      import jax, hostcb
      def bad(x):
        raise ValueError("boom")
  """) + textwrap.dedent(body)


@pytest.mark.parametrize(
  "body",
  [
    "hostcb.install(jax_callbacks=True)\n"
    "print(jax.jit(lambda x: (jax.debug.callback(bad, x), x)[1])(1.))\n",
    "print(jax.jit(lambda x: (hostcb.debug.callback(bad, x), x)[1])(1.))\n",
  ],
  ids=["install", "hostcb.debug"],
)
def test_a_failed_debug_callback_makes_the_script_exit_with_status_1(body):
  # Uncaught where its result is read, as JAX's from the call.
  proc = run_python(_exit_script(body + "print('end of script')\n"))
  assert proc.returncode == 1, proc.stderr
  assert proc.stdout == ""
  assert "ValueError: boom" in proc.stderr
  assert "jax.errors.JaxRuntimeError: INTERNAL: CpuCallback error" in (
    proc.stderr
  )


@pytest.mark.parametrize(
  "barrier", ["hostcb.barrier_wait()", "jax.effects_barrier()"]
)
def test_a_debug_callback_failure_before_a_barrier_is_raised_by_it(barrier):
  # Uncaught, as JAX's failed call: status 1, the program stops there.
  proc = run_python(
    _exit_script(
      "hostcb.install(jax_callbacks=True)\n"
      "jax.jit(lambda x: hostcb.debug.callback(bad, x))(1.)\n"
      f"{barrier}\n"
      "print('went on')\n"
    )
  )
  assert proc.returncode == 1, proc.stderr
  assert proc.stdout == ""
  assert "ValueError: boom" in proc.stderr
  assert "hostcb: raised at the first barrier" in proc.stderr


def test_a_string_result_is_reported_as_jax_reports_it():
  f = jax.jit(
    lambda x: hostcb.pure_callback(
      lambda x: "abc", jax.ShapeDtypeStruct((3,), jnp.float32), x
    )
  )
  with pytest.raises(
    Exception,
    match=r"TypeError: Dtype <U3 is not a valid "
    r"JAX array type\. Only arrays of numeric types are "
    r"supported by JAX\.",
  ):
    f(1.0)


def test_a_result_whose_array_differs_from_its_shape_shows_the_array():

  class Odd:
    shape, dtype = (3,), np.float32

    def __array__(self, dtype=None, copy=None):
      return np.zeros(2, np.int32)

  f = jax.jit(
    lambda x: hcb.call(
      lambda x: Odd(), x, result_shape=jax.ShapeDtypeStruct((3,), jnp.float32)
    )
  )
  with pytest.raises(
    Exception,
    match=r"abstract values "
    r"ShapedArray\(float32\[3\]\) but returned "
    r"ShapedArray\(int32\[2\]\)",
  ):
    f(1.0)
  with pytest.raises(hostcb.CallbackException):
    hcb.barrier_wait()


def test_a_call_failure_that_reached_its_caller_is_not_reported_at_exit():
  proc = run_python(
    textwrap.dedent("""
      import jax, numpy as np
      from hostcb import host_callback as hcb
      def cb(x):
        raise KeyboardInterrupt
      try:
        jax.jit(lambda x: hcb.call(cb, x, result_shape=x))(np.float32(1))
      except Exception as e:
        print("caller got", type(e).__name__)
  """)
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "caller got JaxRuntimeError\n"
  assert "at exit" not in proc.stderr


# ------------------------------------------- JAX internals it needs
def test_a_jax_without_the_keepalive_list_fails_naming_it_at_import():
  proc = run_python(
    "from jax._src.interpreters import mlir\n"
    "del mlir.ModuleContext.add_keepalive\n"
    "try:\n"
    "  import hostcb\n"
    "except ImportError as e:\n"
    "  print(type(e).__name__ + ': ' + str(e))\n"
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == (
    f"MissingJaxInternal: hostcb: jax {jax.__version__} has no "
    "jax._src.interpreters.mlir.ModuleContext.add_keepalive, which hostcb "
    "uses to free the host functions of an executable with it. hostcb was "
    "checked against jax 0.8.0 to 0.12.0.1; install a jax in that range "
    f"or a hostcb release that supports jax {jax.__version__}.\n"
  )


def test_a_jax_without_weak_cache_keys_fails_naming_them_at_the_first_tap():
  proc = run_python(
    "from jax._src import util\n"
    "del util.weakref_cache_key_types\n"
    "import jax, hostcb\n"
    "print('imported')\n"
    "try:\n"
    "  hostcb.id_tap(lambda x, t: None, 1.0)\n"
    "except ImportError as e:\n"
    "  print(type(e).__name__ + ': ' + str(e))\n"
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == (
    "imported\n"
    f"MissingJaxInternal: hostcb: jax {jax.__version__} has no "
    "jax._src.util.weakref_cache_key_types, which hostcb patches so that "
    "JAX's caches do not keep tap functions alive. hostcb was checked "
    "against jax 0.8.0 to 0.12.0.1; install a jax in that range or a "
    f"hostcb release that supports jax {jax.__version__}.\n"
  )


def test_uninstall_gives_jax_caches_back_their_strong_hold():
  from jax._src import util  # the set that hostcb adds its targets to

  hcb.id_tap(lambda x, t: None, 1.0)
  assert hostcb._core.primitives.TapTarget in util.weakref_cache_key_types
  hostcb.uninstall()
  assert hostcb._core.primitives.TapTarget not in util.weakref_cache_key_types
  hcb.id_tap(lambda x, t: None, 1.0)  # the next tap installs it again
  assert hostcb._core.primitives.TapTarget in util.weakref_cache_key_types
