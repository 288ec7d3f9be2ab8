"""Fast dispatch (the default; ``hostcb_strict_barrier`` turns it off):
tapping executables that ``jax.jit`` runs on its C++ fast path keep the
taps' guarantees.

Each test compares with what the strict-barrier mode guarantees: values, program
order within and across computations, no dropped tap, remat, and the
barrier for the calling thread's computations.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcb
import test_engine
from _helpers import run_python
from hostcb import _jax_internals as ji


_MODE = "hostcb_strict_barrier"


def _in_mode(strict: bool):
  before = hostcb.config.read(_MODE)
  hostcb.config.update(_MODE, strict)
  try:
    yield
  finally:
    hostcb.barrier_wait()
    hostcb.config.update(_MODE, before)


@pytest.fixture
def fast():
  yield from _in_mode(False)


@pytest.fixture
def strict():
  yield from _in_mode(True)


def _heavy(h):
  """About 10 ms of CPU work that the next computation does not need."""
  for _ in range(20):
    h = jnp.tanh(h @ h)
  return h


_BIG = np.full((256, 256), 1e-3, np.float32)


def _tapped(x):
  return hostcb.id_tap(lambda a, t: None, x) + 1


@pytest.mark.parametrize(
  "env, expected",
  [
    (
      {"HOSTCB_STRICT_BARRIER": "", "HOSTCB_FAST_DISPATCH": ""},
      "False True",
    ),  # the default: fast dispatch
    ({"HOSTCB_STRICT_BARRIER": "1"}, "True False"),  # keeps the token
    (
      {"HOSTCB_STRICT_BARRIER": "", "HOSTCB_FAST_DISPATCH": "0"},
      "True False",
    ),  # hostcb 0.2's name, turned off
  ],
  ids=["default", "strict", "fast-dispatch-off"],
)
def test_the_mode_from_the_environment(env, expected):
  env = {k: v for k, v in env.items() if v}
  drop = "".join(
    f"os.environ.pop({k!r}, None)\n"
    for k in ("HOSTCB_STRICT_BARRIER", "HOSTCB_FAST_DISPATCH")
    if k not in env
  )
  proc = run_python(
    "import os\n" + drop + "import hostcb, jax, jax.numpy as jnp\n"
    "from hostcb import _jax_internals as ji\n"
    "f = jax.jit(lambda x: hostcb.id_tap(lambda a, t: None, x) + 1)\n"
    "print(hostcb.config.read('hostcb_strict_barrier'),"
    " ji.declares_no_effect(f, jnp.float32(1)))\n",
    env_extra=env,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == expected + "\n"


def test_fast_dispatch_is_the_opposite_of_the_strict_barrier():
  before = hostcb.config.read(_MODE)
  try:
    hostcb.config.update("hostcb_fast_dispatch", False)
    assert hostcb.config.read(_MODE) is True
    hostcb.config.update("hostcb_fast_dispatch", True)
    assert hostcb.config.read(_MODE) is False
    assert hostcb.config.read("hostcb_fast_dispatch") is True
  finally:
    hostcb.config.update(_MODE, before)


def _taps_of_other_threads(
  keep_results: bool, n_threads=4, per_thread=3, steps=100
):
  """Worker threads dispatch tapping one-device scans, keep (or drop) the
  results without waiting for them, and exit; the main thread's barrier
  then counts the taps it saw."""
  import threading

  count = [0]
  lock = threading.Lock()

  def tap(a, t):
    with lock:
      count[0] += 1

  f = jax.jit(
    lambda x: lax.scan(
      lambda c, _: (hostcb.id_tap(tap, _heavy(c)), None), x, None, length=steps
    )[0]
  )
  f(_BIG).block_until_ready()
  hostcb.barrier_wait()
  count[0] = 0
  kept = []

  def worker():
    outs = [f(_BIG) for _ in range(per_thread)]
    if keep_results:
      kept.extend(outs)

  threads = [threading.Thread(target=worker) for _ in range(n_threads)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  hostcb.barrier_wait()
  seen = count[0]
  del kept[:]
  hostcb.barrier_wait()
  return seen, n_threads * per_thread * steps


def test_fast_mode_barrier_waits_for_other_threads_computations_whose_results_are_alive(
  fast,
):
  seen, expected = _taps_of_other_threads(keep_results=True)
  assert seen == expected


def test_strict_barrier_waits_for_other_threads_computations_whose_results_were_dropped(
  strict,
):
  seen, expected = _taps_of_other_threads(keep_results=False)
  assert seen == expected


def test_tapped_jit_declares_no_effect_in_fast_mode(fast):
  assert ji.declares_no_effect(jax.jit(_tapped), jnp.float32(1))


def test_tapped_jit_declares_its_effect_by_default(strict):
  assert not ji.declares_no_effect(jax.jit(_tapped), jnp.float32(1))


def _with_io_callback(ordered: bool, seen: list):
  def record(x):
    seen.append(float(x))
    return np.asarray(x) * 2

  return jax.jit(
    lambda x: (
      hostcb.io_callback(
        record, jax.ShapeDtypeStruct((), jnp.float32), x, ordered=ordered
      )
      + 1
    )
  )


@pytest.mark.parametrize("ordered", [False, True])
def test_io_callback_with_jax_io_effect_declares_no_effect_in_fast_mode(
  fast, ordered
):
  # hostcb's io_callback carries JAX's IOEffect/OrderedIOEffect too (so that
  # JAX's transformations refuse it where they refuse JAX's); fast dispatch
  # drops them from the executable with hostcb's effect.
  seen = []
  f = _with_io_callback(ordered, seen)
  assert f(jnp.float32(3)) == 7.0
  assert ji.declares_no_effect(f, jnp.float32(1))
  hostcb.barrier_wait()
  assert seen == [3.0]


@pytest.mark.parametrize("ordered", [False, True])
def test_io_callback_carries_jax_io_effect_and_declares_it_in_strict_mode(
  strict, ordered
):
  seen = []
  f = _with_io_callback(ordered, seen)
  effects = jax.make_jaxpr(f)(jnp.float32(1)).effects
  assert effects == {ji.host_callback_effect, ji.jax_io_effect(ordered)}
  assert f(jnp.float32(3)) == 7.0
  assert not ji.declares_no_effect(f, jnp.float32(1))
  assert seen == [3.0]


def _tapped_twice(x):
  x = hostcb.id_tap(lambda a, t: None, x)
  return hostcb.id_tap(lambda a, t: None, x) + 1


def test_main_function_creates_the_token_in_fast_mode(fast):
  # Two taps: the token orders them (one alone drops it, test_token_removal).
  text = jax.jit(_tapped_twice).lower(jnp.float32(1)).as_text()
  main = next(line for line in text.splitlines() if "@main(" in line)
  assert "!stablehlo.token" not in main
  assert "stablehlo.create_token" in text


def test_fast_mode_keeps_program_order_within_a_computation(fast):
  seen = []

  @jax.jit
  def f(x, y):
    hostcb.id_tap(lambda a, t: seen.append("slow"), _heavy(x))
    hostcb.id_tap(lambda a, t: seen.append("quick"), y)
    return y

  for _ in range(5):
    f(_BIG, 1.0)
  hostcb.barrier_wait()
  assert seen == ["slow", "quick"] * 5


def test_fast_mode_keeps_the_order_of_a_loop_and_the_tap_after_it(fast):
  seen = []

  @jax.jit
  def f(x, y):
    def body(c):
      i, h = c
      hostcb.id_tap(lambda a, t: seen.append(int(a)), i)
      return i + 1, jnp.tanh(h @ h)

    _, h = lax.while_loop(lambda c: c[0] < 3, body, (0, x))
    hostcb.id_tap(lambda a, t: seen.append("after"), y)
    return h

  f(_BIG, 1.0)
  hostcb.barrier_wait()
  assert seen == [0, 1, 2, "after"]


def test_fast_mode_keeps_dispatch_order_across_pmap_jit_and_eager(fast):
  test_engine.test_taps_of_a_device_follow_dispatch_order_across_pmap_jit_and_eager()


@pytest.mark.multidevice
def test_fast_mode_keeps_dispatch_order_with_python_callback_taps():
  # With XLA's Python callbacks (slower taps), a pmap's taps and those of a
  # jit dispatched after it interleaved on device 0 unless the pmap's
  # dispatch waits for it (_jax_internals.dispatch._wait_in_fast_mode).
  test = "test_taps_of_a_device_follow_dispatch_order_across_pmap_jit_and_eager"
  code = (
    "import sys, pytest; sys.exit(pytest.main(['-q', '-p', "
    f"'no:cacheprovider', '{test_engine.__file__}::{test}']))"
  )
  proc = run_python(code, timeout=180, env_extra={"HOSTCB_DISABLE_NATIVE": "1"})
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "1 passed" in proc.stdout


@pytest.mark.multidevice
def test_multi_device_functions_keep_their_token_in_fast_mode(fast):
  mesh = jax.sharding.Mesh(np.array(jax.local_devices()[:2]), ("d",))
  sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  x = jax.device_put(jnp.arange(2.0), sharded)
  assert not ji.declares_no_effect(jax.jit(_tapped), x)


def _pure_only(x):
  return (
    hostcb.pure_callback(
      lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x
    )
    + 1
  )


@pytest.mark.parametrize("mode", ["fast", "strict"])
def test_pure_calls_alone_declare_no_effect_on_one_device(mode, request):
  # A pure call carries hostcb's effect for its token (program order with
  # the taps around it); with no tap in the executable, the token stays
  # inside it: jit's C++ fast path, as before pure calls carried it.
  request.getfixturevalue(mode)
  f = jax.jit(_pure_only)
  assert ji.declares_no_effect(f, jnp.float32(1))
  assert float(f(jnp.float32(3))) == 7.0


@pytest.mark.multidevice
@pytest.mark.parametrize("mode", ["fast", "strict"])
def test_pure_calls_alone_declare_no_effect_on_several_devices(mode, request):
  request.getfixturevalue(mode)
  mesh = jax.sharding.Mesh(np.array(jax.local_devices()[:2]), ("d",))
  sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  x = jax.device_put(jnp.arange(2.0), sharded)
  f = jax.jit(_pure_only)
  assert ji.declares_no_effect(f, x)
  np.testing.assert_array_equal(f(x), [1.0, 3.0])


def test_computations_of_tap_functions_keep_their_token_in_fast_mode():
  # A tap function that runs jitted code must mark its consumer as waiting
  # for a computation (on the Python dispatch path), or taps and calls of
  # that computation wait for the consumer forever.  Each deadlock test of
  # test_engine.py, in its own interpreter with a bound.
  tests = [
    "test_tap_functions_that_tap_on_a_full_queue_do_not_deadlock",
    "test_jitted_call_inside_a_tap_function_works",
    "test_exception_of_a_tap_made_by_a_tap_function_reaches_barrier_wait",
  ]
  code = (
    "import sys, pytest; sys.exit(pytest.main(['-q', '-p', "
    "'no:cacheprovider', "
    + ", ".join(f"'{test_engine.__file__}::{t}'" for t in tests)
    + "]))"
  )
  proc = run_python(code, timeout=180)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "3 passed" in proc.stdout


def test_fast_mode_barrier_waits_for_this_threads_running_computations(fast):
  count = [0]

  def tap(a, t):
    count[0] += 1

  f = jax.jit(lambda x: hostcb.id_tap(tap, _heavy(x)))
  for i in range(1, 4):
    f(_BIG)
    f(_BIG)  # queued behind the first one
    hostcb.barrier_wait()
    assert count[0] == 2 * i


def test_fast_mode_keeps_taps_whose_results_are_unused(fast):
  seen = []
  tap = lambda a, t: seen.append(int(a))

  @jax.jit
  def f(x):
    jax.jit(lambda y: hostcb.id_tap(tap, y))(x)
    lax.scan(
      lambda c, _: (hostcb.id_tap(tap, c) + 1, None), x + 10, None, length=2
    )
    lax.cond(x > 0, lambda y: hostcb.id_tap(tap, y + 20), lambda y: y, x)
    return x

  f(1)
  hostcb.barrier_wait()
  assert seen == [1, 11, 12, 21]


def test_fast_mode_values_equal_those_without_taps(fast):
  def f(x):
    y = hostcb.id_print(jnp.sin(x), what="sin", output_stream=_Null())
    return jnp.sum(y * x)

  def plain(x):
    return jnp.sum(jnp.sin(x) * x)

  x = jnp.arange(5.0)
  np.testing.assert_array_equal(
    jax.jit(jax.grad(f))(x), jax.jit(jax.grad(plain))(x)
  )
  np.testing.assert_array_equal(
    jax.jit(jax.vmap(f))(x[:, None]), jax.jit(jax.vmap(plain))(x[:, None])
  )


def test_fast_mode_reruns_taps_under_checkpoint(fast):
  seen = []

  def f(x):
    return jnp.sin(hostcb.id_tap(lambda a, t: seen.append(float(a)), x * 2.0))

  jax.jit(jax.grad(jax.checkpoint(f)))(1.0)
  hostcb.barrier_wait()
  assert seen == [2.0, 2.0]  # forward, and again when rematerializing


def test_switching_the_mode_recompiles_functions_already_compiled(strict):
  seen = []
  f = jax.jit(lambda x: hostcb.id_tap(lambda a, t: seen.append(int(a)), x))
  f(1)
  hostcb.config.update(_MODE, False)
  try:
    f(2)
    assert ji.declares_no_effect(f, 3)
  finally:
    hostcb.config.update(_MODE, True)
  f(4)
  assert not ji.declares_no_effect(f, 5)
  hostcb.barrier_wait()
  assert seen == [1, 2, 4]


class _Null:
  def write(self, s):
    pass


# ------------------------------------------------------------- donation
def _donating(tap: bool):
  """``(x, y) -> (x + 1, y * 2)`` with ``x`` donated, and a tap of ``x``
  when ``tap``: both results have ``x``'s size, so a donated buffer that
  became the wrong result would go unnoticed in the values."""

  def f(x, y):
    if tap:
      x = hostcb.id_tap(lambda a, t: None, x)
    return x + 1, y * 2

  return jax.jit(f, donate_argnums=0)


def _donated_result(tap: bool) -> tuple[list, int | None, bool]:
  """The results, which of them took the donated buffer, and whether the
  donated input was deleted."""
  x, y = jnp.arange(4.0), jnp.arange(4.0) + 10
  pointer = x.unsafe_buffer_pointer()
  outs = _donating(tap)(x, y)
  hostcb.barrier_wait()
  took = [i for i, o in enumerate(outs) if o.unsafe_buffer_pointer() == pointer]
  return (
    [np.asarray(o).tolist() for o in outs],
    took[0] if took else None,
    x.is_deleted(),
  )


@pytest.mark.parametrize("mode", ["fast", "strict"])
def test_a_donated_buffer_becomes_the_result_it_becomes_without_a_tap(
  mode, request
):
  request.getfixturevalue(mode)
  without = _donated_result(tap=False)
  assert without == ([[1.0, 2.0, 3.0, 4.0], [20.0, 22.0, 24.0, 26.0]], 0, True)
  assert _donated_result(tap=True) == without


@pytest.mark.parametrize("mode", ["fast", "strict"])
def test_donation_with_one_result_compiles_and_deletes_the_input(mode, request):
  request.getfixturevalue(mode)
  f = jax.jit(
    lambda x, y: hostcb.id_tap(lambda a, t: None, x) + y, donate_argnums=0
  )
  x = jnp.ones(4)
  np.testing.assert_array_equal(f(x, jnp.ones(4)), [2.0, 2.0, 2.0, 2.0])
  assert x.is_deleted()


def test_fast_mode_lowers_a_donated_argument_with_its_result_number(fast):
  text = _donating(tap=True).lower(jnp.arange(4.0), jnp.arange(4.0)).as_text()
  assert "tf.aliasing_output = 0 : i32" in text
  assert "tf.aliasing_output = 1" not in text


# ----------------------------------------------------------- context mesh
@pytest.mark.multidevice
def test_barrier_runs_under_a_context_mesh_without_this_device(fast):
  devices = jax.devices()
  mesh = jax.sharding.Mesh(np.array(devices[1:]), ("d",))
  seen = []
  f = jax.jit(lambda x: hostcb.id_tap(lambda a, t: seen.append(float(a)), x))
  f(jnp.float32(3.0))  # a one-device computation, on device 0
  with jax.set_mesh(mesh):
    hostcb.barrier_wait()
  assert seen == [3.0]


# ---------------------------------------------------------------- AOT
def test_a_compiled_function_keeps_its_token_on_every_call_in_strict_mode(
  strict,
):
  seen = []
  compiled = (
    jax.jit(lambda x: hostcb.id_tap(lambda a, t: seen.append(float(a)), x) + 1)
    .lower(jnp.float32(0.0))
    .compile()
  )
  outs = [float(compiled(jnp.float32(i))) for i in range(3)]
  hostcb.barrier_wait()
  assert outs == [1.0, 2.0, 3.0]
  assert seen == [0.0, 1.0, 2.0]


@pytest.mark.multidevice
def test_a_compiled_multi_device_function_keeps_its_token_in_fast_mode(fast):
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("d",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  seen = []
  x = jax.device_put(jnp.arange(4.0), sharding)
  compiled = (
    jax.jit(
      lambda x: hostcb.id_tap(lambda a, t: seen.append(a.tolist()), x) * 2
    )
    .lower(x)
    .compile()
  )
  outs = [compiled(x + i).tolist() for i in range(3)]
  hostcb.barrier_wait()
  assert outs == [[2.0 * (v + i) for v in range(4)] for i in range(3)]
  assert seen == [[float(v + i) for v in range(4)] for i in range(3)]


# ------------------------------------------------- the drop-ins' dispatch
_F32 = jax.ShapeDtypeStruct((), jnp.float32)


def _one_callback(kind: str, seen: list):
  """``x + 1`` with one callback of ``kind``, which records what it saw."""

  def record(*args):
    seen.append(float(args[0]))

  def same(x):
    seen.append(float(x))
    return x

  return {
    "debug.callback": lambda v: (hostcb.debug.callback(record, v), v + 1)[1],
    "debug.callback(ordered=True)": lambda v: (
      hostcb.debug.callback(record, v, ordered=True),
      v + 1,
    )[1],
    "debug.print": lambda v: (hostcb.debug.print("{}", v), v + 1)[1],
    "io_callback": lambda v: hostcb.io_callback(same, _F32, v) + 1,
    "io_callback(ordered=True)": lambda v: (
      hostcb.io_callback(same, _F32, v, ordered=True) + 1
    ),
    "pure_callback": lambda v: hostcb.pure_callback(same, _F32, v) + 1,
    "id_print": lambda v: hostcb.id_print(v) + 1,
    "id_tap": lambda v: hostcb.id_tap(lambda a, t: record(a), v) + 1,
  }[kind]


# JAX's Python dispatch path of jit (its C++ fast path runs none of them).
_JAX_DISPATCH = ("pjit.py", "pxla.py", "dispatch.py")


def _jax_dispatch_frames(f, x, calls: int) -> int:
  """How many Python frames of JAX's dispatch ``calls`` calls of ``f(x)``
  run in the calling thread."""
  jax_src = os.path.join(os.path.dirname(jax.__file__), "_src")
  frames = [0]

  def profile(frame, event, arg):
    path = frame.f_code.co_filename
    if (
      event == "call"
      and path.startswith(jax_src)
      and os.path.basename(path) in _JAX_DISPATCH
    ):
      frames[0] += 1

  sys.setprofile(profile)
  try:
    for _ in range(calls):
      out = f(x)
  finally:
    sys.setprofile(None)
  out.block_until_ready()
  return frames[0]


@pytest.mark.parametrize(
  "kind",
  [
    "debug.callback",
    "debug.callback(ordered=True)",
    "debug.print",
    "io_callback",
    "io_callback(ordered=True)",
    "pure_callback",
    "id_print",
    "id_tap",
  ],
)
def test_a_drop_in_alone_dispatches_on_jits_cpp_fast_path(fast, kind, capsys):
  # No frame of JAX's Python dispatch per call: the executable declares no
  # effect and exchanges no token, as id_tap's.
  seen = []
  f = jax.jit(_one_callback(kind, seen))
  x = jnp.float32(2)
  f(x), f(x)  # compiles; the second call fills jit's C++ cache
  hostcb.barrier_wait()
  assert _jax_dispatch_frames(f, x, 20) == 0
  assert ji.declares_no_effect(f, x)
  hostcb.barrier_wait()
  printed = capsys.readouterr().out
  if "print" in kind:  # legacy's text of an f32 2 for id_print
    line = "2.\n" if kind == "id_print" else "2.0\n"
    assert (seen, printed) == ([], line * 22)
  else:
    assert (seen, printed) == ([2.0] * 22, "")
