"""The host_callback API on a GPU: taps, calls, the barrier, buffer_callback.

These run only where JAX sees a GPU, with ``JAX_PLATFORMS=cuda,cpu`` (the
suite's default is ``cpu``)::

    JAX_PLATFORMS=cuda,cpu python -m pytest tests/test_gpu.py

On a GPU the taps and calls lower to the engine's GPU back end by default,
and to XLA's Python-callback custom call for GPUs with
``HOSTCB_GPU_ENGINE=0`` (``scripts/check_gpu.sh`` runs this file both
ways); these tests check that every guarantee of the CPU suite holds there too:
values, printed output, program order, transforms, exceptions and the
barrier.  The tests marked for the GPU back end check what only it does
(its custom call, pinned ring, bound, overlap).
"""

from __future__ import annotations

import io
import re
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcb
from hostcb import config
from hostcb._engine import gpu as gpu_engine
from hostcb._engine import native
from _helpers import Recorder


def _gpus():
  try:
    return jax.devices("gpu")
  except RuntimeError:
    return []


pytestmark = pytest.mark.skipif(
  not _gpus(),
  reason="needs a GPU that JAX sees: run on a machine with one,"
  " with JAX_PLATFORMS=cuda,cpu",
)


@pytest.fixture
def gpu():
  return _gpus()[0]


def on(device, x):
  return jax.device_put(x, device)


# ------------------------------------------------------------------ taps
def test_tap_under_jit_delivers_value_and_gpu_device(gpu):
  rec = Recorder()
  x = on(gpu, jnp.arange(4, dtype=jnp.float32))
  out = jax.jit(lambda x: hostcb.id_tap(rec, x * 2, tap_with_device=True))(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, [0.0, 2.0, 4.0, 6.0])
  assert out.devices() == {gpu}
  assert len(rec.calls) == 1
  arg, transforms, kwargs = rec.calls[0]
  assert isinstance(arg, np.ndarray) and arg.dtype == np.float32
  np.testing.assert_array_equal(arg, [0.0, 2.0, 4.0, 6.0])
  assert transforms == () and kwargs == {"device": gpu}


def test_id_print_prints_gpu_device_and_value(gpu):
  s = io.StringIO()
  x = on(gpu, jnp.arange(3, dtype=jnp.int32))
  jax.jit(
    lambda x: hostcb.id_print(
      x, what="x", tap_with_device=True, output_stream=s
    )
  )(x)
  hostcb.barrier_wait()
  assert s.getvalue() == f"device: cuda:{gpu.id} what: x\n[0 1 2]\n"


def test_taps_in_scan_arrive_in_program_order(gpu):
  rec = Recorder()

  def body(c, i):
    hostcb.id_tap(rec, i)
    hostcb.id_tap(rec, -i)
    return c + i, None

  out = jax.jit(lambda c: lax.scan(body, c, jnp.arange(100))[0])(
    on(gpu, jnp.int32(0))
  )
  hostcb.barrier_wait()
  assert int(out) == sum(range(100))
  assert [int(a) for a in rec.args] == [v for i in range(100) for v in (i, -i)]


def test_taps_in_cond_and_while_run_once_per_taken_step(gpu):
  rec = Recorder()

  def f(x):
    y = lax.cond(
      x > 0, lambda x: hostcb.id_tap(rec, x, result=x + 1), lambda x: x - 1, x
    )
    return lax.while_loop(
      lambda c: c < 5, lambda c: hostcb.id_tap(rec, c) + 1, y
    )

  out = jax.jit(f)(on(gpu, jnp.int32(1)))
  hostcb.barrier_wait()
  assert int(out) == 5
  assert [int(a) for a in rec.args] == [1, 2, 3, 4]


def test_tap_with_unused_result_is_kept(gpu):
  rec = Recorder()

  def f(x):
    hostcb.id_tap(rec, x * 3)
    return x + 1

  out = jax.jit(f)(on(gpu, jnp.float32(2.0)))
  hostcb.barrier_wait()
  assert float(out) == 3.0
  assert [float(a) for a in rec.args] == [6.0]


def test_grad_through_tap_is_unchanged_and_taps_the_primal_once(gpu):
  rec = Recorder()

  def f(x, tapped):
    y = jnp.sin(x) * x
    if tapped:
      y = hostcb.id_tap(rec, y)
    return jnp.sum(y * y)

  x = on(gpu, jnp.linspace(0.0, 1.0, 8, dtype=jnp.float32))
  g_tapped = jax.jit(jax.grad(lambda x: f(x, True)))(x)
  g_plain = jax.jit(jax.grad(lambda x: f(x, False)))(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(g_tapped, g_plain)
  assert rec.transforms == [()]
  np.testing.assert_allclose(rec.args[0], jnp.sin(x) * x, rtol=1e-6)


def test_vmap_of_tap_reports_batch_dims(gpu):
  rec = Recorder()
  x = on(gpu, jnp.arange(6, dtype=jnp.float32).reshape(3, 2))
  out = jax.jit(jax.vmap(lambda v: hostcb.id_tap(rec, v) * 2))(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(6).reshape(3, 2) * 2)
  np.testing.assert_array_equal(rec.args[0], np.arange(6).reshape(3, 2))
  assert rec.transforms == [(("batch", {"batch_dims": (0,)}),)]


@pytest.mark.parametrize(
  "dtype",
  [jnp.bfloat16, np.float16, np.int8, np.bool_, np.complex64],
  ids=lambda d: np.dtype(d).name,
)
def test_tap_carries_dtype(gpu, dtype):
  rec = Recorder()
  x = on(gpu, jnp.ones((3,), dtype))
  jax.jit(lambda x: hostcb.id_tap(rec, x))(x)
  hostcb.barrier_wait()
  assert rec.args[0].dtype == np.dtype(dtype)
  np.testing.assert_array_equal(rec.args[0], np.ones((3,), dtype))


def test_large_tap_arrives_whole(gpu):
  rec = Recorder()
  n = 1 << 22  # 16 MB of f32
  x = on(gpu, jnp.arange(n, dtype=jnp.float32))
  jax.jit(lambda x: hostcb.id_tap(rec, x + 1))(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(rec.args[0], np.arange(n, dtype=np.float32) + 1)


def test_many_taps_beyond_the_queue_size_are_all_delivered(gpu):
  # 2,000 taps of 64 KB: 128 MB through a 100 MB queue, none dropped.
  seen = []

  def tap(x, transforms):
    seen.append(int(x[0]))

  def body(c, i):
    hostcb.id_tap(tap, jnp.full((16384,), i, jnp.int32))
    return c, None

  jax.jit(lambda c: lax.scan(body, c, jnp.arange(2000))[0])(
    on(gpu, jnp.int32(0))
  )
  hostcb.barrier_wait()
  assert seen == list(range(2000))


def test_tap_exception_reaches_barrier_wait(gpu):
  def tap(x, transforms):
    raise ValueError("tap failed on purpose")

  out = jax.jit(lambda x: hostcb.id_tap(tap, x) + 1)(on(gpu, jnp.int32(1)))
  assert int(out) == 2
  with pytest.raises(
    hostcb.CallbackException,
    match="(?s)There were exceptions during callback "
    "processing. Last one was:.*tap failed on purpose",
  ):
    hostcb.barrier_wait()
  hostcb.barrier_wait()  # reported once


def test_pmap_over_the_gpu_taps_with_its_device(gpu):
  rec = Recorder()
  n = len(_gpus())
  x = jnp.arange(n * 2, dtype=jnp.float32).reshape(n, 2)
  out = jax.pmap(
    lambda v: hostcb.id_tap(rec, v, tap_with_device=True) + 1, devices=_gpus()
  )(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, np.asarray(x) + 1)
  assert sorted(c[2]["device"].id for c in rec.calls) == [d.id for d in _gpus()]


def test_gpu_and_cpu_taps_in_one_program_name_their_devices(gpu):
  rec = Recorder()
  cpu = jax.devices("cpu")[0]
  f = jax.jit(lambda x: hostcb.id_tap(rec, x, tap_with_device=True))
  f(on(gpu, jnp.int32(1)))
  f(on(cpu, jnp.int32(2)))
  hostcb.barrier_wait()
  got = sorted((int(a), kw["device"]) for a, _, kw in rec.calls)
  assert got == [(1, gpu), (2, cpu)]


def test_fast_dispatch_keeps_dispatch_order_on_gpu(gpu):
  rec = Recorder()
  fast = hostcb.config.FAST_DISPATCH
  before = hostcb.config.read(fast)
  hostcb.config.update(fast, True)
  try:
    f = jax.jit(lambda x: hostcb.id_tap(rec, x) + 1)
    x = on(gpu, jnp.int32(0))
    for _ in range(50):
      x = f(x)
    hostcb.barrier_wait()
  finally:
    hostcb.config.update(fast, before)
  assert int(x) == 50
  assert [int(a) for a in rec.args] == list(range(50))


def test_fast_dispatch_barrier_waits_for_this_threads_cpu_computations(gpu):
  # Beside the GPU, a computation on the CPU that is still running when
  # barrier_wait is called: the barrier drains the CPU too.
  seen = []

  def body(c, i):
    hostcb.id_tap(lambda x, transforms: seen.append(int(x)), i)
    return c, None

  fast = hostcb.config.FAST_DISPATCH
  before = hostcb.config.read(fast)
  hostcb.config.update(fast, True)
  try:
    f = jax.jit(lambda c: lax.scan(body, c, jnp.arange(20000))[0])
    x = on(jax.devices("cpu")[0], jnp.int32(0))
    jax.block_until_ready(f(x))
    hostcb.barrier_wait()
    seen.clear()
    for _ in range(3):
      f(x)  # not waited for
    hostcb.barrier_wait()
    assert seen == list(range(20000)) * 3
  finally:
    hostcb.config.update(fast, before)


# ----------------------------------------------------------------- calls
def test_call_returns_host_result_on_gpu(gpu):
  x = on(gpu, jnp.linspace(0.0, 1.0, 5, dtype=jnp.float32))
  out = jax.jit(lambda x: hostcb.call(np.sin, x, result_shape=x) * 2)(x)
  assert out.devices() == {gpu}
  np.testing.assert_allclose(out, 2 * np.sin(np.asarray(x)), rtol=1e-6)


def test_call_with_device_gets_the_gpu(gpu):
  got = []

  def host(a, *, device):
    got.append(device)
    return a

  jax.jit(
    lambda x: hostcb.call(host, x, result_shape=x, call_with_device=True)
  )(on(gpu, jnp.float32(1.0)))
  assert got == [gpu]


def test_call_in_scan_sees_earlier_taps_in_order(gpu):
  rec = Recorder()
  seen = []

  def host(a):
    seen.append(len(rec.calls))
    return a + 1

  def body(c, _):
    hostcb.id_tap(rec, c)
    return hostcb.call(host, c, result_shape=c), None

  out = jax.jit(lambda c: lax.scan(body, c, None, length=20)[0])(
    on(gpu, jnp.int32(0))
  )
  hostcb.barrier_wait()
  assert int(out) == 20
  assert seen == list(range(1, 21))


def test_call_exception_is_raised_in_the_caller(gpu):
  def host(a):
    raise ValueError("gpu call failed on purpose")

  with pytest.raises(Exception, match="gpu call failed on purpose"):
    jax.block_until_ready(
      jax.jit(lambda x: hostcb.call(host, x, result_shape=x))(
        on(gpu, jnp.float32(1.0))
      )
    )
  with pytest.raises(hostcb.CallbackException):
    hostcb.barrier_wait()
  out = jax.jit(lambda x: hostcb.call(lambda a: a * 2, x, result_shape=x))(
    on(gpu, jnp.float32(3.0))
  )
  assert float(out) == 6.0


def test_call_wrong_shape_names_expected_and_actual(gpu):
  with pytest.raises(Exception) as info:
    jax.block_until_ready(
      jax.jit(
        lambda x: hostcb.call(
          lambda a: np.ones(3, np.float32), x, result_shape=x
        )
      )(on(gpu, jnp.float32(1.0)))
    )
  assert re.search(
    r"should have returned a result with abstract values "
    r"ShapedArray\(float32\[\]\) but returned "
    r"ShapedArray\(float32\[3\]\)",
    str(info.value),
  )
  with pytest.raises(hostcb.CallbackException):
    hostcb.barrier_wait()


def test_large_call_round_trips(gpu):
  n = 1 << 20
  x = on(gpu, jnp.arange(n, dtype=jnp.float32))
  out = jax.jit(lambda x: hostcb.call(lambda a: a * 2, x, result_shape=x))(x)
  np.testing.assert_array_equal(out, np.arange(n, dtype=np.float32) * 2)


# ------------------------------------------------------- buffer_callback
def test_buffer_callback_sees_stream_and_cuda_buffers(gpu):
  seen = []

  def cb(ctx, out, x):
    seen.append(
      (
        ctx.platform,
        type(ctx.stream),
        x.__cuda_array_interface__["shape"],
        x.__cuda_array_interface__["typestr"],
        out.__cuda_array_interface__["data"][1],
      )
    )

  f = hostcb.buffer_callback(cb, jax.ShapeDtypeStruct((4,), jnp.float32))
  jax.block_until_ready(jax.jit(f)(on(gpu, jnp.ones((4,), jnp.float32))))
  assert seen == [("cuda", int, (4,), "<f4", False)]


def test_buffer_callback_writes_output_with_cupy(gpu):
  cp = pytest.importorskip("cupy", reason="needs CuPy to write GPU buffers")

  def cb(ctx, out, x):
    with cp.cuda.ExternalStream(ctx.stream):
      cp.asarray(out)[...] = cp.asarray(x) * 3 + 1

  f = hostcb.buffer_callback(cb, jax.ShapeDtypeStruct((5,), jnp.float32))
  out = jax.jit(f)(on(gpu, jnp.arange(5, dtype=jnp.float32)))
  np.testing.assert_array_equal(out, np.arange(5) * 3 + 1)


# ------------------------------------------------- the engine's GPU back end
GPU_ENGINE = pytest.mark.skipif(
  not config.read(config.GPU_ENGINE),
  reason="the GPU back end is off: HOSTCB_GPU_ENGINE=0 is set",
)


def _custom_call_targets(text):
  return set(re.findall(r"stablehlo\.custom_call @(\w+)", text))


@GPU_ENGINE
def test_gpu_engine_taps_and_calls_lower_to_its_handlers(gpu):
  def f(x):
    hostcb.id_tap(lambda *a: None, x)
    return hostcb.call(lambda a: a, x, result_shape=x)

  text = jax.jit(f).lower(on(gpu, jnp.float32(1))).as_text()
  assert _custom_call_targets(text) == {"hostcb_tap", "hostcb_call_one"}


@GPU_ENGINE
def test_gpu_engine_delivers_every_tap_in_order_through_pinned_memory(gpu):
  seen = []

  def tap(x, transforms):
    seen.append(int(x[0]))

  def body(c, i):
    hostcb.id_tap(tap, jnp.full((64,), i, jnp.int32))
    return c + 1, None

  out = jax.jit(lambda c: lax.scan(body, c, jnp.arange(10000))[0])(
    on(gpu, jnp.int32(0))
  )
  hostcb.barrier_wait()
  assert int(out) == 10000
  assert seen == list(range(10000))
  assert gpu_engine.pinned_bytes(gpu.local_hardware_id) >= 2 << 20, (
    gpu_engine.pin_refusal(gpu.local_hardware_id)
  )


@GPU_ENGINE
def test_gpu_engine_publishes_taps_by_ready_words_the_stream_writes(gpu):
  # No host function on the stream per tap: the stream writes each
  # record's ready word (cuStreamWriteValue64) and never waits for the
  # host.  Over several ring wraps, every value arrives, in order.
  seen = []

  def tap(x, transforms):
    seen.append(x.copy())

  def body(c, i):
    hostcb.id_tap(tap, (c + i).astype(jnp.float32) + jnp.arange(1000.0))
    return c + 1, None

  bound = hostcb.config.read(hostcb.config.MAX_QUEUE_BYTE_SIZE)
  hostcb.config.update(hostcb.config.MAX_QUEUE_BYTE_SIZE, int(16e6))
  try:
    out = jax.jit(lambda c: lax.scan(body, c, jnp.arange(20000))[0])(
      on(gpu, jnp.int32(0))
    )
    hostcb.barrier_wait()
  finally:
    hostcb.config.update(hostcb.config.MAX_QUEUE_BYTE_SIZE, bound)
  assert gpu_engine.publication() is None
  assert int(out) == 20000
  assert len(seen) == 20000
  for i in (0, 1, 4999, 12345, 19999):
    np.testing.assert_array_equal(seen[i], 2 * i + np.arange(1000.0))


@GPU_ENGINE
def test_gpu_engine_bounds_the_queue_while_the_tap_function_is_blocked(gpu):
  release = threading.Event()
  seen = []

  def tap(x, transforms):
    release.wait(60)
    seen.append(int(x[0]))

  def body(c, i):
    hostcb.id_tap(tap, jnp.full((1024,), i, jnp.int32))  # 4 KB each
    return c, None

  key = gpu_engine.key_of(gpu.local_hardware_id)
  f = jax.jit(lambda c: lax.scan(body, c, jnp.arange(200))[0])
  f(on(gpu, jnp.int32(0)))  # creates the queue and compiles
  release.set()
  hostcb.barrier_wait()
  release.clear()
  seen.clear()
  native.set_capacity(64 << 10)
  x = on(gpu, jnp.int32(0))
  outs = []
  # Dispatched from another thread: XLA may run the handlers on the
  # dispatching thread, which then waits for space until `release`.
  worker = threading.Thread(
    target=lambda: outs.append(f(x).block_until_ready())
  )  # 800 KB of taps through a 64 KB queue
  worker.start()
  try:
    deadline = time.monotonic() + 60
    while native.counters(key)["space_waiters"] == 0:
      assert time.monotonic() < deadline, "no producer waited for space"
      time.sleep(0.001)
    assert native.counters(key)["bytes_held"] <= 64 << 10
    release.set()
    worker.join(60)
    assert not worker.is_alive(), "the computation did not finish"
    hostcb.barrier_wait()
  finally:
    release.set()
    worker.join(60)
    native.set_capacity(config.read(config.MAX_QUEUE_BYTE_SIZE))
  assert len(outs) == 1 and int(outs[0]) == 0
  assert seen == list(range(200))


@GPU_ENGINE
def test_gpu_engine_scan_finishes_while_its_tap_functions_are_blocked(gpu):
  release = threading.Event()
  seen = []

  def tap(x, transforms):
    release.wait(60)
    seen.append(float(x))

  f = jax.jit(
    lambda c: lax.scan(
      lambda c, _: (hostcb.id_tap(tap, c) + 1, None), c, None, length=50
    )[0]
  )
  x = on(gpu, jnp.float32(0))
  try:
    # The stream never waits for Python: the scan's result is ready while
    # the first tap function is still blocked.
    assert float(f(x).block_until_ready()) == 50
    assert seen == []
  finally:
    release.set()
  hostcb.barrier_wait()
  assert seen == [float(i) for i in range(50)]
