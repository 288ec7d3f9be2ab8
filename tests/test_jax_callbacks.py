"""JAX's own callbacks on hostcb: the switch that routes them
(``install_jax_callbacks``/``uninstall_jax_callbacks``),
``jax.effects_barrier``, values, threads, order, and several devices.

What each of ``hostcb.debug.print``/``callback``, ``hostcb.io_callback`` and
``hostcb.pure_callback`` does scenario by scenario, against JAX's own, is the
differential harness's (tests/jax_diff/).  The switch is tested in this
process with ``install_jax_callbacks``, which leaves the legacy names alone;
``hostcb.install(jax_callbacks=True)``/``hostcb.uninstall()`` as a whole run in
fresh interpreters (tests/test_import_hook.py), since other test modules of
this process rely on the legacy names that ``uninstall`` removes.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import gc
import importlib
import io
import logging
import sys
import threading
import time
import types

import jax
import jax.experimental
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcb
from hostcb import _import_hook as import_hook
from hostcb._jax_internals.versions import jax_at_least

DEADLINE = 120.0  # seconds: every wait of these tests ends by then


def _jax_own(module: str, name: str):
  """JAX's function ``name`` of ``module`` (looked up by name), also if the
  module holds hostcb's in its place now (which names what it replaces)."""
  f = getattr(sys.modules[module], name)
  return getattr(f, "_hostcb_replaces", f)


# JAX's own five functions, from the modules that define them.  Kept in a
# dict: a module attribute holding one of them would itself be rebound by
# the switch.
_JAX = {
  "debug_callback": _jax_own("jax._src.debugging", "debug_callback"),
  "debug_print": _jax_own("jax._src.debugging", "debug_print"),
  "io_callback": _jax_own("jax._src.callback", "io_callback"),
  "pure_callback": _jax_own("jax._src.callback", "pure_callback"),
  "debug_breakpoint": _jax_own("jax._src.debugger.core", "breakpoint"),
}
_HOSTCB = {
  "debug_callback": hostcb.debug.jax_callback,
  "debug_print": hostcb.debug.jax_print,
  "io_callback": hostcb.io_callback,
  "pure_callback": hostcb.pure_callback,
  "debug_breakpoint": hostcb.debug.breakpoint,
}
# Where the switch must put hostcb's functions: (module name, attribute).
_PUBLIC_AND_DEFINITIONS = {
  ("jax.debug", "callback"): "debug_callback",
  ("jax.debug", "print"): "debug_print",
  ("jax.experimental", "io_callback"): "io_callback",
  ("jax", "pure_callback"): "pure_callback",
  ("jax._src.debugging", "debug_callback"): "debug_callback",
  ("jax._src.debugging", "debug_print"): "debug_print",
  ("jax._src.callback", "io_callback"): "io_callback",
  ("jax._src.callback", "pure_callback"): "pure_callback",
  ("jax.debug", "breakpoint"): "debug_breakpoint",
  ("jax._src.debugger", "breakpoint"): "debug_breakpoint",
  ("jax._src.debugger.core", "breakpoint"): "debug_breakpoint",
}

F32 = jax.ShapeDtypeStruct((), jnp.float32)
# The type of the arguments that JAX 0.10.2's callbacks get (ArrayImpl).
JAX_ARRAY = type(jnp.zeros(()))
I32 = jax.ShapeDtypeStruct((), jnp.int32)


def test_jax_functions_are_jax_own_and_not_installed():
  for key, f in _JAX.items():
    assert f is not _HOSTCB[key]
    assert f.__module__.startswith("jax._src."), (key, f.__module__)
  assert not import_hook.jax_callbacks_installed()


def _holders(functions) -> dict:
  """``{(module name, attribute): key}`` of every attribute of every loaded
  module (hostcb's excepted) that is one of ``functions`` (a dict key ->
  function)."""
  by_id = {id(f): key for key, f in functions.items()}
  found = {}
  for name, module in list(sys.modules.items()):
    if not isinstance(module, types.ModuleType) or (
      name.split(".")[0] == "hostcb"
    ):
      continue
    try:
      items = list(vars(module).items())
    except Exception:  # noqa: BLE001  (an odd module)
      continue
    for attr, value in items:
      key = by_id.get(id(value))
      if key is not None and functions[key] is value:
        found[(name, attr)] = key
  return found


def _value(module_name: str, attr: str):
  return getattr(sys.modules[module_name], attr)


@pytest.fixture
def installed():
  """JAX's callbacks routed through hostcb for the test, then put back."""
  count = import_hook.install_jax_callbacks()
  try:
    yield count
  finally:
    import_hook.uninstall_jax_callbacks()
    assert not import_hook.jax_callbacks_installed()


@pytest.fixture
def user_module(tmp_path, monkeypatch):
  """Imports a module (a file on ``sys.path``) that bound JAX's four
  callbacks with ``from ... import``; removed from ``sys.modules`` after."""
  made = []

  def make(name: str):
    (tmp_path / f"{name}.py").write_text(
      "from jax import pure_callback\n"
      "from jax.debug import callback as debug_callback\n"
      "from jax.debug import print as debug_print\n"
      "from jax.experimental import io_callback\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    made.append(name)
    return importlib.import_module(name)

  yield make
  for name in made:
    sys.modules.pop(name, None)


# ------------------------------------------------------- install/uninstall
def test_install_rebinds_every_public_name_and_definition(installed):
  for (module_name, attr), key in _PUBLIC_AND_DEFINITIONS.items():
    assert _value(module_name, attr) is _HOSTCB[key], (module_name, attr)
  assert jax.debug.print is hostcb.debug.jax_print
  assert jax.debug.callback is hostcb.debug.jax_callback
  assert jax.experimental.io_callback is hostcb.io_callback
  assert jax.pure_callback is hostcb.pure_callback
  assert jax.debug.breakpoint is hostcb.debug.breakpoint
  assert import_hook.jax_callbacks_installed()


def test_install_leaves_no_loaded_module_holding_jax_functions():
  before, ours_before = _holders(_JAX), _holders(_HOSTCB)
  assert set(_PUBLIC_AND_DEFINITIONS) <= set(before)
  count = import_hook.install_jax_callbacks()
  try:
    assert _holders(_JAX) == {}
    assert _holders(_HOSTCB) == {**before, **ours_before}
    assert count == len(before)
  finally:
    import_hook.uninstall_jax_callbacks()


def test_uninstall_restores_exactly():
  jax_before, ours_before = _holders(_JAX), _holders(_HOSTCB)
  count = import_hook.install_jax_callbacks()
  restored = import_hook.uninstall_jax_callbacks()
  assert restored == count > 0
  assert _holders(_JAX) == jax_before
  assert _holders(_HOSTCB) == ours_before
  for (module_name, attr), key in _PUBLIC_AND_DEFINITIONS.items():
    assert _value(module_name, attr) is _JAX[key], (module_name, attr)
  assert not import_hook.jax_callbacks_installed()
  assert import_hook.uninstall_jax_callbacks() == 0


def test_install_twice_is_harmless():
  jax_before, ours_before = _holders(_JAX), _holders(_HOSTCB)
  first = import_hook.install_jax_callbacks()
  try:
    assert import_hook.install_jax_callbacks() == 0
    assert _holders(_JAX) == {}
    assert _holders(_HOSTCB) == {**jax_before, **ours_before}
    assert jax.debug.print is hostcb.debug.jax_print
  finally:
    assert import_hook.uninstall_jax_callbacks() == first
  assert _holders(_JAX) == jax_before
  assert _holders(_HOSTCB) == ours_before
  assert import_hook.uninstall_jax_callbacks() == 0


def test_module_that_imported_the_names_before_install_is_rebound(user_module):
  lib = user_module("hostcb_test_lib_before_install")
  names = {
    "debug_callback": "debug_callback",
    "debug_print": "debug_print",
    "io_callback": "io_callback",
    "pure_callback": "pure_callback",
  }
  for attr, key in names.items():
    assert getattr(lib, attr) is _JAX[key]
  import_hook.install_jax_callbacks()
  try:
    for attr, key in names.items():
      assert getattr(lib, attr) is _HOSTCB[key], attr
  finally:
    import_hook.uninstall_jax_callbacks()
  for attr, key in names.items():
    assert getattr(lib, attr) is _JAX[key], attr


def test_module_imported_while_installed_binds_hostcb(installed, user_module):
  lib = user_module("hostcb_test_lib_while_installed")
  assert lib.debug_print is hostcb.debug.jax_print
  assert lib.debug_callback is hostcb.debug.jax_callback
  assert lib.io_callback is hostcb.io_callback
  assert lib.pure_callback is hostcb.pure_callback


def test_module_imported_while_installed_keeps_hostcb_after_uninstall(
  user_module,
):
  # Documented: uninstall puts back what install rebound; a module that
  # took hostcb's functions from JAX's modules meanwhile keeps them.
  import_hook.install_jax_callbacks()
  try:
    lib = user_module("hostcb_test_lib_keeps")
  finally:
    import_hook.uninstall_jax_callbacks()
  assert jax.experimental.io_callback is _JAX["io_callback"]
  assert lib.io_callback is hostcb.io_callback


def test_install_again_rebinds_modules_loaded_since(installed):
  late = types.ModuleType("hostcb_test_late_module")
  late.io = _JAX["io_callback"]
  late.dprint = _JAX["debug_print"]
  sys.modules[late.__name__] = late
  try:
    assert import_hook.install_jax_callbacks() == 2
    assert late.io is hostcb.io_callback
    assert late.dprint is hostcb.debug.jax_print
    import_hook.uninstall_jax_callbacks()
    assert late.io is _JAX["io_callback"]
    assert late.dprint is _JAX["debug_print"]
    assert jax.debug.print is _JAX["debug_print"]
  finally:
    del sys.modules[late.__name__]


def test_uninstall_leaves_a_name_rebound_since_alone(installed):
  def mine(*args, **kwargs):
    return None

  jax.debug.print = mine
  try:
    import_hook.uninstall_jax_callbacks()
    assert jax.debug.print is mine
    assert jax.debug.callback is _JAX["debug_callback"]
    assert jax.experimental.io_callback is _JAX["io_callback"]
  finally:
    jax.debug.print = _JAX["debug_print"]


def test_installed_names_stage_hostcb_primitives(installed):
  def f(x):
    jax.debug.print("x={}", x)
    jax.debug.callback(lambda a: None, x)
    y = jax.experimental.io_callback(lambda a: a, F32, x)
    return jax.pure_callback(lambda a: a, F32, y)

  jaxpr = str(jax.make_jaxpr(f)(1.0))
  assert jaxpr.count("hostcb_tap[") == 2
  assert jaxpr.count("hostcb_call[") == 2
  for jax_primitive in ("debug_callback[", "io_callback[", "pure_callback["):
    assert jax_primitive not in jaxpr


def test_jax_names_stage_jax_primitives_when_not_installed():
  def f(x):
    jax.debug.callback(lambda a: None, x)
    return jax.pure_callback(lambda a: a, F32, x)

  jaxpr = str(jax.make_jaxpr(f)(1.0))
  assert "hostcb_" not in jaxpr
  assert "debug_callback[" in jaxpr and "pure_callback[" in jaxpr


def test_installed_names_run_the_callbacks(installed, capsys):
  seen = []

  @jax.jit
  def f(x):
    jax.debug.print("x={x}", x=x)
    jax.debug.callback(lambda a: seen.append(("callback", a)), x)
    y = jax.experimental.io_callback(
      lambda a: (seen.append(("io", a)), a * 2)[1], F32, x
    )
    return jax.pure_callback(lambda a: a + 1, F32, y)

  assert float(f(3.0)) == 7.0
  jax.effects_barrier()
  assert capsys.readouterr().out == "x=3.0\n"
  assert [(k, type(a), float(a)) for k, a in seen] == [
    ("callback", JAX_ARRAY, 3.0),
    ("io", JAX_ARRAY, 3.0),
  ]


def test_function_traced_before_install_keeps_jax_callback():
  # A function keeps the callback it was traced with: hostcb's runs on
  # hostcb's consumer thread, JAX's elsewhere.
  got = {"before": [], "during": []}

  def on_hostcb_thread() -> bool:
    return threading.current_thread().name.startswith("hostcb-engine")

  def traced(label):
    return jax.jit(
      lambda x: (
        jax.debug.callback(lambda a: got[label].append(on_hostcb_thread()), x),
        x + 1,
      )[1]
    )

  before = traced("before")
  assert float(before(1.0)) == 2.0
  import_hook.install_jax_callbacks()
  try:
    assert float(before(2.0)) == 3.0
    during = traced("during")
    assert float(during(3.0)) == 4.0
    jax.effects_barrier()
  finally:
    import_hook.uninstall_jax_callbacks()
  assert float(before(4.0)) == 5.0
  # uninstall clears JAX's caches: ``during``, traced with hostcb's, is
  # traced again, with JAX's (which JAX's barrier and exit wait for).
  assert float(during(5.0)) == 6.0
  jax.effects_barrier()
  assert got == {"before": [False, False, False], "during": [True, False]}


# --------------------------------------------------- jax.effects_barrier
def test_effects_barrier_is_jax_own_followed_by_hostcb():
  assert jax.effects_barrier.__wrapped__ is (
    sys.modules["jax._src.api"].effects_barrier
  )
  assert jax.effects_barrier is not jax.effects_barrier.__wrapped__


def test_effects_barrier_waits_for_debug_callbacks_of_a_long_scan():
  seen = []

  @jax.jit
  def f(x):
    def body(c, i):
      hostcb.debug.callback(lambda a: seen.append(int(a)), i)
      return c + 1, None

    return lax.scan(body, x, jnp.arange(2000))[0]

  assert int(f(0)) == 2000
  jax.effects_barrier()
  assert seen == list(range(2000))


def test_effects_barrier_waits_for_debug_print(capsys):
  jax.jit(lambda x: hostcb.debug.print("{} and {y}", x, y=x * 2))(jnp.arange(3))
  jax.effects_barrier()
  assert capsys.readouterr().out == "[0 1 2] and [0 2 4]\n"


def test_effects_barrier_waits_for_id_tap_and_call():
  taps, calls = [], []

  def host(a):
    calls.append(int(a))
    return a + 100

  @jax.jit
  def f(x):
    def body(c, i):
      hostcb.id_tap(lambda a, t: taps.append(int(a)), i)
      return c + hostcb.call(host, i, result_shape=I32), None

    return lax.scan(body, x, jnp.arange(500))[0]

  assert int(f(0)) == sum(range(500)) + 500 * 100
  jax.effects_barrier()
  assert taps == list(range(500)) and calls == list(range(500))


def test_effects_barrier_blocks_until_a_running_callback_returns():
  release, returned = threading.Event(), threading.Event()
  seen = []

  def held(a):
    release.wait(DEADLINE)
    seen.append(float(a))

  out = jax.jit(lambda x: (hostcb.debug.callback(held, x), x * 2)[1])(3.0)
  # The device does not wait for the callback: the result is there while
  # the callback is still held (reading it on the host would wait for the
  # callback, as with JAX's: hostcb._engine.output_order.reads).
  deadline = time.monotonic() + DEADLINE
  while not out.is_ready() and time.monotonic() < deadline:
    time.sleep(0.001)  # polls the device, which does not wait for `held`
  assert out.is_ready()

  def barrier():
    jax.effects_barrier()
    returned.set()

  waiter = threading.Thread(target=barrier)
  waiter.start()
  try:
    assert not returned.wait(0.5)  # still held: the barrier waits
    assert seen == []
  finally:
    release.set()
  waiter.join(DEADLINE)
  assert not waiter.is_alive()
  assert returned.is_set() and seen == [3.0]
  assert float(out) == 6.0


def _raise(a):
  raise ValueError("boom")


@pytest.mark.parametrize("ordered", [False, True])
def test_failed_io_callback_fails_its_computation_as_jax(ordered):
  failures = []
  for io_callback in (_JAX["io_callback"], hostcb.io_callback):
    f = jax.jit(lambda x: io_callback(_raise, F32, x, ordered=ordered))
    with pytest.raises(Exception, match="ValueError: boom") as info:
      jax.block_until_ready(f(1.0))
    failures.append(type(info.value))
    jax.effects_barrier()  # nothing left to report, as JAX
    ok = jax.jit(
      lambda x: io_callback(lambda a: a + 1, F32, x, ordered=ordered)
    )
    assert float(ok(1.0)) == 2.0  # and the next computation runs
  assert failures[0] is failures[1]


def test_failed_pure_callback_fails_its_computation_as_jax():
  failures = []
  for pure_callback in (_JAX["pure_callback"], hostcb.pure_callback):
    f = jax.jit(lambda x: pure_callback(_raise, F32, x))
    with pytest.raises(Exception, match="ValueError: boom") as info:
      jax.block_until_ready(f(1.0))
    failures.append(type(info.value))
    jax.effects_barrier()
  assert failures[0] is failures[1]


def test_wrong_result_shape_fails_the_computation_with_jax_words():
  for io_callback in (_JAX["io_callback"], hostcb.io_callback):
    f = jax.jit(
      lambda x: io_callback(lambda a: np.zeros(3, np.float32), F32, x)
    )
    with pytest.raises(
      Exception,
      match=(
        r"RuntimeError: Incorrect output shape for return value #0: "
        r"Expected: \(\), Actual: \(3,\)"
      ),
    ):
      jax.block_until_ready(f(1.0))


def test_eager_debug_callback_failure_reaches_the_caller_as_jax():
  for debug_callback in (_JAX["debug_callback"], hostcb.debug.callback):
    with pytest.raises(ValueError, match="^boom$"):
      debug_callback(_raise, jnp.float32(1.0))
    jax.effects_barrier()  # raised once, where it happened


def test_effects_barrier_inside_a_callback_returns():
  done = []

  def calls_barrier(a):
    jax.effects_barrier()
    done.append(float(a))

  jax.jit(lambda x: hostcb.debug.callback(calls_barrier, x))(1.0)
  finisher = threading.Thread(target=jax.effects_barrier)
  finisher.start()
  finisher.join(DEADLINE)
  assert not finisher.is_alive()
  assert done == [1.0]


def test_effects_barrier_still_waits_for_jax_own_ordered_callbacks():
  seen = []
  f = jax.jit(
    lambda x: (
      _JAX["debug_callback"](lambda a: seen.append(float(a)), x, ordered=True),
      x,
    )[1]
  )
  f(1.0)
  f(2.0)
  jax.effects_barrier()
  assert seen == [1.0, 2.0]


# ----------------------------------------------------------------- values
def _model(x, w, debug=None):
  """A small model; with ``debug`` (a ``(callback, print)`` pair), debug
  callbacks and prints of its intermediates.

  Its arithmetic is exact in float32 for the small integer-valued inputs
  of the tests (no rounding), so its results must be bit for bit the same
  with and without callbacks.  (With transcendental functions they need
  not be: a callback, JAX's own too, changes how XLA fuses the code around
  it, and fused and unfused ``sin`` may differ in the last bit.)
  """
  h = x @ w
  if debug:
    debug[0](lambda *a: None, h, x)
    debug[1]("h={h} w={}", w, h=h)

  def body(c, i):
    c = jnp.maximum(c, -3.0) * 2.0 - i * c + 1.0
    if debug:
      debug[0](lambda *a: None, c, i, ordered=True)
      debug[1]("c={}", c)
    return c, c

  c, cs = lax.scan(body, h, jnp.arange(6.0))
  return (c * c).sum() + cs.sum()


def test_debug_callback_and_print_never_change_a_value():
  x = jax.random.randint(jax.random.key(0), (3, 5), -3, 4).astype(jnp.float32)
  w = jax.random.randint(jax.random.key(1), (5, 4), -3, 4).astype(jnp.float32)
  transforms = {
    "jit": jax.jit,
    "grad": lambda f: jax.jit(jax.grad(f, argnums=(0, 1))),
    "vmap": lambda f: jax.jit(jax.vmap(f, in_axes=(0, None))),
    "checkpoint": lambda f: jax.jit(jax.value_and_grad(jax.checkpoint(f))),
    "eager": lambda f: f,
  }
  prints = {}
  for debug in (
    (_JAX["debug_callback"], _JAX["debug_print"]),
    (hostcb.debug.callback, hostcb.debug.print),
  ):
    for name, transform in transforms.items():
      sink = io.StringIO()
      with contextlib.redirect_stdout(sink):
        want = transform(_model)(x, w)
        got = transform(functools.partial(_model, debug=debug))(x, w)
        jax.effects_barrier()
      jax.tree_util.tree_map(np.testing.assert_array_equal, got, want)
      assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(
        want
      )
      text = sink.getvalue()
      prints.setdefault(name, []).append((text.count("h=["), text.count("c=[")))
  # As many prints as JAX's: jit 1 + 6 scan steps; vmap 3 times that.
  assert {k: v[0] for k, v in prints.items()} == {
    k: v[1] for k, v in prints.items()
  }
  assert prints["jit"] == [(1, 6), (1, 6)]
  assert prints["vmap"] == [(3, 18), (3, 18)]


def test_callback_receives_exactly_the_values_computed():
  seen = []

  @jax.jit
  def f(x):
    def body(c, _):
      c = jnp.cos(c) * 3.1 + c
      hostcb.debug.callback(lambda a: seen.append(a), c)
      return c, c

    return lax.scan(body, x, None, length=50)[1]

  x = jax.random.normal(jax.random.key(2), (4,))
  cs = np.asarray(f(x))
  jax.effects_barrier()
  assert len(seen) == 50
  for i, a in enumerate(seen):
    assert a.dtype == np.float32 and a.shape == (4,)
    np.testing.assert_array_equal(a, cs[i])


def test_io_and_pure_callback_results_are_the_callback_results():
  x = jax.random.normal(jax.random.key(3), (5,))

  def host(a):
    return np.exp(a) / 7

  for name in ("io_callback", "pure_callback"):
    for fn in (_JAX[name], _HOSTCB[name]):
      out = jax.jit(
        lambda a: fn(host, jax.ShapeDtypeStruct((5,), jnp.float32), a)
      )(x)
      np.testing.assert_array_equal(out, host(np.asarray(x)))


# ---------------------------------------------------------------- threads
def test_callbacks_from_several_threads_all_arrive():
  n_threads, n_calls = 4, 40
  lock = threading.Lock()
  seen = {"debug": [], "io": [], "pure": [], "print": []}

  def record(kind):
    def host(t, i):
      with lock:
        seen[kind].append((int(t), int(i)))
      return np.int32(i)

    return host

  @jax.jit
  def f(t, i):
    hostcb.debug.callback(record("debug"), t, i)
    hostcb.debug.print("{} {}", t, i)
    a = hostcb.io_callback(record("io"), I32, t, i, ordered=True)
    b = hostcb.pure_callback(record("pure"), I32, t, i)
    return a + b

  sink = io.StringIO()
  outs: dict[int, list] = {}
  errors = []

  def work(t):
    try:
      outs[t] = [f(np.int32(t), np.int32(i)) for i in range(n_calls)]
      jax.block_until_ready(outs[t])
    except BaseException as e:  # noqa: BLE001  (reported below)
      errors.append(e)

  with contextlib.redirect_stdout(sink):
    threads = [
      threading.Thread(target=work, args=(t,)) for t in range(n_threads)
    ]
    for th in threads:
      th.start()
    for th in threads:
      th.join(DEADLINE)
    assert not any(th.is_alive() for th in threads)
    jax.effects_barrier()
  assert errors == []
  every = sorted((t, i) for t in range(n_threads) for i in range(n_calls))
  for kind in ("debug", "io", "pure"):
    assert sorted(seen[kind]) == every, kind
  for t in range(n_threads):
    # ordered io_callbacks: each thread's in the order it dispatched them
    assert [i for u, i in seen["io"] if u == t] == list(range(n_calls))
    assert [int(o) for o in outs[t]] == [2 * i for i in range(n_calls)]
  assert sorted(sink.getvalue().splitlines()) == sorted(
    f"{t} {i}" for t, i in every
  )


def test_callbacks_may_be_dispatched_from_a_callback_thread():
  # A callback that runs jitted code with callbacks of its own.
  inner = []
  g = jax.jit(
    lambda x: hostcb.io_callback(
      lambda a: (inner.append(float(a)), a)[1], F32, x * 2
    )
  )

  def outer(a):
    jax.block_until_ready(g(a))

  jax.jit(lambda x: hostcb.debug.callback(outer, x))(1.5)
  jax.effects_barrier()
  assert inner == [3.0]


def test_callbacks_of_code_a_callback_dispatched_run_by_the_next_barrier():
  # Documented (docs/jax_callbacks.md): a barrier that waited for a
  # callback may return before the callbacks of the code that callback
  # dispatched (JAX's would have run them inside it); the next one waits
  # for them.
  inner = []
  g = jax.jit(
    lambda x: hostcb.debug.callback(lambda a: inner.append(float(a)), x * 2)
  )
  f = jax.jit(lambda x: hostcb.debug.callback(lambda a: g(a), x))
  for i in range(5):
    f(float(i))
  jax.effects_barrier()
  jax.effects_barrier()
  assert sorted(inner) == [0.0, 2.0, 4.0, 6.0, 8.0]


# ------------------------------------------------------------------ order
def test_ordered_io_callback_keeps_order_across_many_dispatches():
  seen = []
  f = jax.jit(
    lambda i: hostcb.io_callback(
      lambda a: (seen.append(int(a)), a)[1], I32, i, ordered=True
    )
  )
  outs = [f(np.int32(i)) for i in range(500)]  # not waited for in between
  jax.effects_barrier()
  assert seen == list(range(500))
  assert [int(o) for o in outs] == list(range(500))


def test_ordered_io_callback_keeps_order_in_a_long_scan():
  seen = []

  @jax.jit
  def f():
    def body(c, i):
      return c + hostcb.io_callback(
        lambda a: (seen.append(int(a)), a)[1], I32, i, ordered=True
      ), None

    return lax.scan(body, jnp.int32(0), jnp.arange(5000))[0]

  assert int(f()) == sum(range(5000))
  assert seen == list(range(5000))


def test_ordered_io_callbacks_in_while_loop_and_cond_keep_order():
  seen = []

  def record(tag):
    return lambda a: (seen.append((tag, int(a))), a)[1]

  def body(carry):
    i, acc = carry
    acc = acc + lax.cond(
      i % 3 == 0,
      lambda: hostcb.io_callback(record("a"), I32, i, ordered=True),
      lambda: hostcb.io_callback(record("b"), I32, i, ordered=True),
    )
    return i + 1, acc

  out = jax.jit(
    lambda: lax.while_loop(
      lambda c: c[0] < 300, body, (jnp.int32(0), jnp.int32(0))
    )
  )()
  assert int(out[1]) == sum(range(300))
  assert seen == [("a" if i % 3 == 0 else "b", i) for i in range(300)]


def test_ordered_callbacks_of_every_kind_interleave_in_program_order():
  seen = []

  @jax.jit
  def f():
    def body(c, i):
      hostcb.debug.callback(
        lambda a: seen.append(("debug", int(a))), i, ordered=True
      )
      r = hostcb.io_callback(
        lambda a: (seen.append(("io", int(a))), a)[1], I32, i, ordered=True
      )
      hostcb.debug.callback(
        lambda a: seen.append(("after", int(a))), r, ordered=True
      )
      return c + r, None

    return lax.scan(body, jnp.int32(0), jnp.arange(300))[0]

  f()
  jax.effects_barrier()
  assert seen == [(k, i) for i in range(300) for k in ("debug", "io", "after")]


def test_unordered_io_callback_runs_every_time():
  seen = []
  f = jax.jit(
    lambda i: hostcb.io_callback(lambda a: (seen.append(int(a)), a)[1], I32, i)
  )
  for i in range(200):
    f(np.int32(i))
  jax.effects_barrier()
  assert sorted(seen) == list(range(200))


# ------------------------------------------------------- several devices
N = jax.device_count()


def _sharded(x):
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
  return jax.device_put(
    x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  )


@pytest.mark.multidevice
def test_there_are_several_devices():
  assert N >= 2


@pytest.mark.multidevice
def test_pmap_debug_callback_once_per_device_as_jax():
  results = []
  for debug_callback in (_JAX["debug_callback"], hostcb.debug.callback):
    seen = []
    lock = threading.Lock()

    def host(a, seen=seen):
      with lock:
        seen.append(float(a))

    out = jax.pmap(lambda x: (debug_callback(host, x), x * 2)[1])(
      jnp.arange(float(N))
    )
    jax.effects_barrier()
    np.testing.assert_array_equal(out, np.arange(N) * 2.0)
    results.append(sorted(seen))
  assert results == [[float(i) for i in range(N)]] * 2


@pytest.mark.multidevice
@pytest.mark.parametrize("front_end", ["callback", "print"])
def test_pmap_refuses_an_ordered_debug_callback_as_jax(front_end):
  messages = []
  for api in (_JAX, _HOSTCB):
    if front_end == "callback":

      def body(x, api=api):
        api["debug_callback"](lambda a: None, x, ordered=True)
        return x
    else:

      def body(x, api=api):
        api["debug_print"]("x={}", x, ordered=True)
        return x

    with pytest.raises(ValueError) as info:
      jax.pmap(body)(jnp.arange(float(N)))
    messages.append(str(info.value))
  assert messages[0].startswith(
    "The following ordered effects are not supported for more than 1 device"
  )
  assert messages[1] == messages[0]


@pytest.mark.multidevice
@pytest.mark.parametrize("ordered", [False, True])
def test_pmap_io_callback_on_every_device_as_jax(ordered):
  for io_callback in (_JAX["io_callback"], hostcb.io_callback):
    seen = []
    lock = threading.Lock()

    def host(a, seen=seen):
      with lock:
        seen.append(float(a))
      return a * 10

    out = jax.pmap(lambda x: io_callback(host, F32, x, ordered=ordered))(
      jnp.arange(float(N))
    )
    jax.effects_barrier()
    np.testing.assert_array_equal(out, np.arange(N) * 10.0)
    assert sorted(seen) == [float(i) for i in range(N)]


@pytest.mark.multidevice
def test_pmap_debug_callbacks_of_each_device_all_arrive_in_order():
  seen = []
  lock = threading.Lock()

  def host(a):
    with lock:
      seen.append(int(a))

  def f(x):
    def body(c, _):
      hostcb.debug.callback(host, c)
      return c + 1, None

    return lax.scan(body, x, None, length=300)[0]

  jax.pmap(f)(jnp.arange(N) * 1000)
  jax.effects_barrier()
  assert len(seen) == 300 * N
  for d in range(N):
    assert [a for a in seen if a // 1000 == d] == [
      1000 * d + k for k in range(300)
    ]


@pytest.mark.multidevice
def test_sharded_jit_debug_callback_sees_the_whole_array_once_as_jax():
  x = _sharded(jnp.arange(2.0 * N))
  for debug_callback in (_JAX["debug_callback"], hostcb.debug.callback):
    seen = []
    out = jax.jit(
      lambda a: (
        debug_callback(lambda v: seen.append(np.asarray(v).tolist()), a),
        a * 2,
      )[1]
    )(x)
    jax.effects_barrier()
    assert seen == [[float(i) for i in range(2 * N)]]
    np.testing.assert_array_equal(out, np.arange(2.0 * N) * 2)
    assert out.sharding == x.sharding


@pytest.mark.multidevice
def test_sharded_jit_io_and_pure_callback_results_as_jax():
  x = _sharded(jnp.arange(2.0 * N))
  shape = jax.ShapeDtypeStruct((2 * N,), jnp.float32)
  for name in ("io_callback", "pure_callback"):
    for fn in (_JAX[name], _HOSTCB[name]):
      seen = []

      def host(v, seen=seen):
        seen.append(v.tolist())
        return v * 3

      out = jax.jit(lambda a: fn(host, shape, a) + 1)(x)
      np.testing.assert_array_equal(out, np.arange(2.0 * N) * 3 + 1)
      assert seen == [[float(i) for i in range(2 * N)]], (name, fn)


@pytest.mark.multidevice
def test_ordered_io_callbacks_of_threads_on_different_devices():
  devices = jax.devices()
  seen = {d: [] for d in range(N)}

  @jax.jit
  def f(d, i):
    return hostcb.io_callback(
      lambda a, b: (seen[int(a)].append(int(b)), b)[1], I32, d, i, ordered=True
    )

  errors = []

  def work(d):
    try:
      outs = [
        f(
          jax.device_put(np.int32(d), devices[d]),
          jax.device_put(np.int32(i), devices[d]),
        )
        for i in range(50)
      ]
      assert [int(o) for o in outs] == list(range(50))
      assert all(o.devices() == {devices[d]} for o in outs)
    except BaseException as e:  # noqa: BLE001  (reported below)
      errors.append(e)

  threads = [threading.Thread(target=work, args=(d,)) for d in range(N)]
  for th in threads:
    th.start()
  for th in threads:
    th.join(DEADLINE)
  assert not any(th.is_alive() for th in threads)
  jax.effects_barrier()
  assert errors == []
  assert seen == {d: list(range(50)) for d in range(N)}


# ------------------------------------------- hostcb_callback_jax_arrays
@pytest.fixture
def numpy_arrays():
  """The opt-out: ``hostcb_callback_jax_arrays`` off for one test."""
  before = hostcb.config.read("hostcb_callback_jax_arrays")
  hostcb.config.update("hostcb_callback_jax_arrays", False)
  try:
    yield
  finally:
    hostcb.config.update("hostcb_callback_jax_arrays", before)


def _argument_types(api, jit: bool = True) -> list[str]:
  """The types of the arguments that each callback kind receives, under
  ``jit`` or eagerly, with JAX's functions or hostcb's (``api``)."""
  seen = []

  def host(a):
    seen.append(type(a))
    return np.asarray(a) + 1

  shape = jax.ShapeDtypeStruct((), jnp.float32)

  def f(x):
    api["debug_callback"](lambda a: seen.append(type(a)), x)
    y = api["io_callback"](host, shape, x)
    return api["pure_callback"](host, shape, y)

  assert float((jax.jit(f) if jit else f)(jnp.float32(1.0))) == 3.0
  jax.effects_barrier()
  return [t.__name__ for t in seen]


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_callbacks_receive_jax_arrays_as_jax_by_default(jit):
  assert _argument_types(_HOSTCB, jit) == _argument_types(_JAX, jit)
  assert _argument_types(_HOSTCB, jit) == ["ArrayImpl"] * 3


def test_callbacks_receive_numpy_arrays_with_the_opt_out(numpy_arrays):
  assert _argument_types(_HOSTCB) == ["ndarray"] * 3


def test_id_tap_and_call_keep_numpy_arrays():
  seen = []

  @jax.jit
  def f(x):
    x = hostcb.id_tap(lambda a, t: seen.append(type(a).__name__), x)
    return hostcb.call(
      lambda a: (seen.append(type(a).__name__), a)[1], x, result_shape=F32
    )

  assert float(f(jnp.float32(2.0))) == 2.0
  hostcb.barrier_wait()
  assert seen == ["ndarray", "ndarray"]


def _describe(a) -> tuple:
  return (
    type(a).__name__,
    str(a.dtype),
    a.shape,
    a.weak_type,
    a.committed,
    sorted(str(d) for d in a.devices()),
    np.asarray(a).tolist(),
  )


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_debug_callback_arrays_are_jax_s(jit):
  # dtype, shape, weak type, commitment, device and value as JAX's.
  def run(api):
    seen = []

    def f(x, n):
      api["debug_callback"](
        lambda *a: seen.append([_describe(v) for v in a]),
        x,
        x[0].astype(jnp.bfloat16),
        n,
        x > 1,
      )

    if jit:
      jax.jit(f)(jnp.arange(3.0), jnp.int8(5))
    else:
      f(jnp.arange(3.0), 7)
    jax.effects_barrier()
    return seen

  assert run(_HOSTCB) == run(_JAX)


@pytest.mark.parametrize(
  "method",
  [
    "sequential",
    "sequential_unrolled",
    "expand_dims",
    "broadcast_all",
    "legacy_vectorized",
  ],
)
def test_pure_callback_under_vmap_gets_jax_arrays_as_jax(method):
  def run(api):
    seen = []

    def host(a, b):
      seen.append((_describe(a), _describe(b)))
      return np.asarray(a) + np.asarray(b)

    def f(x, y):
      return api["pure_callback"](
        host, jax.ShapeDtypeStruct(x.shape, x.dtype), x, y, vmap_method=method
      )

    out = jax.jit(jax.vmap(f, in_axes=(0, None)))(
      jnp.arange(6.0).reshape(3, 2), jnp.ones(2)
    )
    return np.asarray(out).tolist(), seen

  assert run(_HOSTCB) == run(_JAX)


def test_debug_callback_under_vmap_gets_jax_arrays_as_jax():
  def run(api):
    seen = []
    jax.jit(
      jax.vmap(
        lambda x: api["debug_callback"](lambda a: seen.append(_describe(a)), x)
      )
    )(jnp.arange(6.0).reshape(3, 2))
    jax.effects_barrier()
    return seen

  assert run(_HOSTCB) == run(_JAX)


def test_io_callback_under_vmap_gets_jax_arrays_as_jax():
  def run(api):
    seen = []
    jax.jit(
      jax.vmap(
        lambda x: api["io_callback"](
          lambda a: (seen.append(_describe(a)), np.asarray(a))[1],
          jax.ShapeDtypeStruct((2,), jnp.float32),
          x,
        )
      )
    )(jnp.arange(6.0).reshape(3, 2))
    return seen

  assert run(_HOSTCB) == run(_JAX)


def test_code_written_for_jax_arrays_runs_in_hostcbs_callbacks():
  # What code written for JAX's callbacks does with its arguments.
  seen = []

  def cb(a):
    assert isinstance(a, jax.Array)
    seen.append(
      (
        a.at[0].set(7.0).tolist(),
        str(a.sharding.device_set),
        a.block_until_ready() is a,
        str((a + jnp.int32(1)).dtype),
      )
    )

  jax.jit(lambda x: hostcb.debug.callback(cb, x))(jnp.arange(2.0))
  jax.effects_barrier()
  assert seen == [([7.0, 1.0], str({jax.devices("cpu")[0]}), True, "float32")]


def test_large_arguments_are_the_engines_aligned_memory():
  # The engine gives arrays of 1 KiB and more 64-byte aligned memory, which
  # the jax.Array takes without a copy (_jax_internals.host_arrays).
  seen = []
  jax.jit(lambda x: hostcb.debug.callback(seen.append, x))(
    jnp.arange(4096, dtype=jnp.float32)
  )
  jax.effects_barrier()
  (a,) = seen
  assert a.unsafe_buffer_pointer() % 64 == 0
  np.testing.assert_array_equal(a, np.arange(4096, dtype=np.float32))


def test_small_arguments_are_the_engines_aligned_memory_too():
  # Under 1 KiB the engine's array is a 64-byte aligned slot of its own in
  # a shared slab, which the jax.Array takes without a second copy.
  seen = []
  jax.jit(lambda x: hostcb.id_tap(lambda a, t: seen.append(a), x))(
    jnp.arange(3, dtype=jnp.float32)
  )
  hostcb.barrier_wait()
  (a,) = seen
  out = hostcb._jax_internals.cpu_array(a)
  assert out.unsafe_buffer_pointer() == a.ctypes.data
  assert a.ctypes.data % 64 == 0
  np.testing.assert_array_equal(out, np.arange(3, dtype=np.float32))


def test_a_callback_traced_under_enable_x64_gets_float64_and_computes_in_it():
  # jax.enable_x64 is the tracing thread's setting; the callback runs on
  # hostcb's consumer thread, and gets it too (as JAX's, run in the
  # program's thread, does).
  seen = []

  def cb(x):
    seen.append((str(x.dtype), np.asarray(x).tolist(), str((x + 1).dtype)))

  with jax.enable_x64(True):
    jax.jit(lambda x: hostcb.debug.callback(cb, x))(
      jnp.arange(3, dtype=jnp.float64) + 0.25
    )
    jax.effects_barrier()
  assert seen == [("float64", [0.25, 1.25, 2.25], "float64")]


def test_an_io_callback_traced_under_enable_x64_computes_in_float64():
  seen = []

  def cb(x):
    seen.append(str((x * 2).dtype))
    return x * 2

  f64 = jax.ShapeDtypeStruct((), jnp.float64)
  with jax.enable_x64(True):
    out = jax.jit(lambda x: hostcb.io_callback(cb, f64, x))(jnp.float64(1.5))
    assert (str(out.dtype), float(out)) == ("float64", 3.0)
  assert seen == ["float64"]


def test_a_staged_debug_callback_sees_the_process_wide_context_not_the_callers():
  # The decision of docs/guide.md, "What a callback sees of the program's
  # thread": the consumer thread has its own context and JAX's
  # process-wide settings (JAX's callback, run in the caller, sees both).
  var = contextvars.ContextVar("var", default="default")
  seen = []

  def cb(x):
    seen.append((var.get(), jax.config.jax_numpy_rank_promotion))

  def program():
    var.set("caller")
    with jax.numpy_rank_promotion("raise"):
      jax.jit(lambda x: hostcb.debug.callback(cb, x))(jnp.float32(1))
      jax.effects_barrier()

  contextvars.copy_context().run(program)
  assert seen == [("default", "allow")]


def test_a_callback_traced_without_x64_computes_as_before():
  seen = []
  jax.jit(
    lambda x: hostcb.debug.callback(lambda a: seen.append(str(a.dtype)), x)
  )(jnp.float32(1))
  jax.effects_barrier()
  assert seen == ["float32"]


def test_an_argument_outlives_its_callback():
  # The jax.Array keeps the memory it was made from alive.
  seen = []
  for i in range(3):
    jax.jit(lambda x: hostcb.debug.callback(seen.append, x))(
      jnp.full(1024, float(i))
    )
  jax.effects_barrier()
  gc.collect()
  assert [float(a.sum()) for a in seen] == [0.0, 1024.0, 2048.0]


def _own_value_scan(api_call, n: int, size: int):
  """A jitted ``n``-step scan whose step ``i`` hands ``full(size, i)`` to
  ``api_call(keep, x)`` (a callback that keeps its argument): the kept
  arguments, the scan's results."""
  kept = []

  def keep(a):
    kept.append(a)
    return a

  def step(c, i):
    return c, api_call(keep, jnp.full((size,), i, jnp.float32))

  _, out = jax.jit(lambda: lax.scan(step, 0, jnp.arange(n)))()
  jax.effects_barrier()
  return kept, np.asarray(out)


_KEEPING = {
  "io_callback": lambda keep, x: hostcb.io_callback(
    keep, jax.ShapeDtypeStruct(x.shape, x.dtype), x
  ),
  "pure_callback": lambda keep, x: hostcb.pure_callback(
    keep, jax.ShapeDtypeStruct(x.shape, x.dtype), x
  ),
  "debug.callback": lambda keep, x: (hostcb.debug.callback(keep, x), x)[1],
}


@pytest.mark.parametrize("size", [4, 1024], ids=["16B", "4KiB"])
@pytest.mark.parametrize("kind", list(_KEEPING))
def test_kept_arguments_keep_each_calls_own_value(kind, size):
  # Small arguments are copied by jaxlib, large ones alias memory the
  # engine allocated for that one call: neither may change afterwards.
  n = 300
  kept, out = _own_value_scan(_KEEPING[kind], n, size)
  gc.collect()
  assert len(kept) == n
  assert all(isinstance(a, jax.Array) for a in kept)
  want = np.repeat(np.arange(n, dtype=np.float32)[:, None], size, axis=1)
  np.testing.assert_array_equal(np.stack([np.asarray(a) for a in kept]), want)
  np.testing.assert_array_equal(out, want)


_EXACT_VALUES = {
  "float32": np.array([1.5, -0.0, np.inf, 3e-39], np.float32),
  "bfloat16": np.array([1.5, -2.25, 3.0e38, 1e-3], jnp.bfloat16),
  "float16": np.array([0.1, -65504.0, 6e-8, 1.0], np.float16),
  "int8": np.array([-128, 0, 7, 127], np.int8),
  "uint32": np.array([0, 1, 2**32 - 1, 12345], np.uint32),
  "bool": np.array([True, False, False, True]),
  "complex64": np.array([1 + 2j, -0.5j, 0, 3], np.complex64),
  "float8_e4m3fn": np.array([1.0, -2.0, 448.0, 0.125], jnp.float8_e4m3fn),
  "int4": np.array([-8, 7, 0, -1], jnp.int4),
}


def _bits(a) -> tuple:
  a = np.asarray(a)
  return str(a.dtype), a.shape, a.tobytes() if a.itemsize else b""


def _exact_value_cases():
  for name, v in _EXACT_VALUES.items():
    marks = []
    jax_minor = tuple(int(p) for p in jax.__version__.split(".")[:2])
    if name == "int4" and jax_minor < (0, 10):
      marks = [
        pytest.mark.skip(reason="jax older than 0.10 refuses 4-bit operands")
      ]
    for shape in [(), (4,), (2, 2)]:
      value = v[0] if shape == () else v.reshape(shape)
      yield pytest.param(value, id=f"{name}{list(shape)}", marks=marks)


@pytest.mark.parametrize("value", list(_exact_value_cases()))
@pytest.mark.parametrize(
  "returns",
  ["argument", "arithmetic", "two arguments"],
)
def test_a_returned_jax_array_comes_back_exactly(value, returns):
  # The argument itself (its host array, no conversion), a new jax.Array
  # (converted by host_array), and a callback of two arguments (not the
  # one-argument fast path).
  x = jnp.asarray(value)
  spec = jax.ShapeDtypeStruct(x.shape, x.dtype)
  fn = {
    "argument": lambda a: a,
    "arithmetic": lambda a: jnp.where(jnp.ones(a.shape, bool), a, a),
    "two arguments": None,
  }[returns]
  if fn is None:
    out = jax.jit(lambda x: hostcb.io_callback(lambda a, b: a, spec, x, x))(x)
  else:
    out = jax.jit(lambda x: hostcb.io_callback(fn, spec, x))(x)
  assert _bits(out) == _bits(value)


def test_a_returned_argument_of_the_wrong_dtype_fails_as_jaxs():
  spec = jax.ShapeDtypeStruct((), jnp.float32)
  with pytest.raises(
    Exception,
    match="Incorrect output dtype for return value #0: Expected: float32, "
    "Actual: int32",
  ):
    jax.jit(lambda x: hostcb.io_callback(lambda a: a, spec, x))(jnp.int32(3))


def test_a_returned_argument_under_x64_keeps_float64():
  f64 = jax.ShapeDtypeStruct((3,), jnp.float64)
  with jax.enable_x64(True):
    value = jnp.array([0.1, 1e300, -5e-324], jnp.float64)
    out = jax.jit(lambda x: hostcb.io_callback(lambda a: a, f64, x))(value)
    assert _bits(out) == _bits(value)


def test_a_non_contiguous_numpy_result_comes_back_exactly():
  x = jnp.arange(9.0, dtype=jnp.float32).reshape(3, 3)
  spec = jax.ShapeDtypeStruct((3, 3), jnp.float32)
  out = jax.jit(
    lambda x: hostcb.io_callback(lambda a: np.asarray(a).T, spec, x)
  )(x)
  np.testing.assert_array_equal(out, np.arange(9.0).reshape(3, 3).T)


# --------------------------------------------------- when a callback fails
def _fails(a):
  raise ValueError(f"tapped {float(a)}")


def test_a_failed_debug_callback_is_logged_where_jax_logs_it(caplog):
  caplog.set_level(logging.ERROR)
  out = jax.jit(lambda x: (hostcb.debug.callback(_fails, x), x + 1)[1])(1.0)
  with pytest.raises(jax.errors.JaxRuntimeError):
    float(out)  # as JAX's failed computation
  failures = [r for r in caplog.records if r.name == "jax._src.debugging"]
  assert [r.getMessage() for r in failures] == ["jax.debug.callback failed"]
  assert failures[0].exc_info[0] is ValueError
  assert str(failures[0].exc_info[1]) == "tapped 1.0"


@pytest.mark.parametrize(
  "barrier",
  [lambda: jax.effects_barrier(), hostcb.barrier_wait],  # (patched at use)
  ids=["jax.effects_barrier", "hostcb.barrier_wait"],
)
def test_the_next_barrier_raises_a_failed_debug_callback_once(barrier):
  jax.jit(lambda x: hostcb.debug.callback(_fails, x))(1.0)
  with pytest.raises(
    jax.errors.JaxRuntimeError,
    match=r"^INTERNAL: CpuCallback error calling callback: Traceback "
    r"\(most recent call last\):\n(.|\n)*\nValueError: tapped 1\.0\n\n"
    r"hostcb: raised at the first barrier after the callback failed",
  ):
    barrier()
  jax.effects_barrier()  # once
  hostcb.barrier_wait()


def test_a_failed_debug_callback_does_not_fail_later_work():
  seen = []
  jax.jit(lambda x: hostcb.debug.callback(_fails, x))(1.0)
  with pytest.raises(jax.errors.JaxRuntimeError):
    jax.effects_barrier()  # (JAX's call raises it)
  g = jax.jit(
    lambda x: (
      hostcb.debug.callback(lambda a: seen.append(float(a)), x),
      x * 2,
    )[1]
  )
  assert float(g(3.0)) == 6.0
  jax.effects_barrier()
  assert seen == [3.0]


def test_a_failed_debug_print_is_raised_as_jaxs(caplog):
  class Unprintable:
    def __format__(self, spec):
      raise RuntimeError("cannot format")

  caplog.set_level(logging.ERROR)
  # A host-side argument (not an array) that fails to format.
  jax.jit(lambda x: hostcb.debug.print("{} {}", x, Unprintable()))(1.0)
  with pytest.raises(
    jax.errors.JaxRuntimeError, match="\nRuntimeError: cannot format\n"
  ):
    jax.effects_barrier()
  assert [
    str(r.exc_info[1]) for r in caplog.records if r.name == "jax._src.debugging"
  ] == ["cannot format"]


def test_an_id_tap_failure_is_still_raised_by_the_barrier():
  jax.jit(lambda x: hostcb.id_tap(lambda a, t: _fails(a), x))(1.0)
  with pytest.raises(hostcb.CallbackException, match="ValueError: tapped 1.0"):
    jax.effects_barrier()


def test_an_eager_debug_callback_failure_reaches_the_caller():
  with pytest.raises(ValueError, match="tapped 1.0"):
    hostcb.debug.callback(_fails, jnp.float32(1.0))
  jax.effects_barrier()


@pytest.mark.skipif(
  jax_at_least(0, 10),
  reason="jax 0.10 and newer hand 4-bit operands to Python callbacks "
  "exactly (test_sub_byte_callback_operands_arrive_exactly)",
)
def test_sub_byte_callback_operands_are_refused_before_jax_0_10():
  import jax.numpy as jnp

  x = jnp.array([0, 1, 3], jnp.uint4)
  f = jax.jit(lambda x: hostcb.debug.callback(lambda v: None, x))
  with pytest.raises(
    NotImplementedError, match=r"XLA hands a uint4\[3\] \(an odd number"
  ):
    f(x)


@pytest.mark.skipif(
  not jax_at_least(0, 10),
  reason="before jax 0.10 hostcb refuses 4-bit callback operands"
  " (test_sub_byte_callback_operands_are_refused_before_jax_0_10)",
)
def test_sub_byte_callback_operands_arrive_exactly():
  import jax.numpy as jnp
  import numpy as np

  seen = []
  x = jnp.array([0, 1, 3], jnp.uint4)
  jax.jit(lambda x: hostcb.debug.callback(seen.append, x))(x)
  jax.effects_barrier()
  assert [np.asarray(v).astype(np.int32).tolist() for v in seen] == [[0, 1, 3]]
