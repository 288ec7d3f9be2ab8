"""Asynchronous taps: consumer threads, bounded queues, barrier, exceptions."""

import threading
import time

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import hostcb
from hostcb import _engine as engine
from _helpers import Recorder, run_python


def test_slow_tap_function_does_not_block_the_device():
  release = threading.Event()
  done = []

  def slow_tap(arg, transforms):
    assert release.wait(timeout=60), "main thread never released the tap"
    done.append(int(arg))

  out = jax.jit(lambda x: hostcb.id_tap(slow_tap, x) + 1)(1)
  out.block_until_ready()  # would deadlock if the device waited for the tap
  assert int(out) == 2
  assert done == []
  release.set()
  hostcb.barrier_wait()
  assert done == [1]


def test_barrier_wait_returns_after_all_taps_processed():
  accumulator = []

  def host_log(arg, transforms):
    accumulator.append(float(arg))

  def device_fun(x):
    hostcb.id_tap(host_log, x)
    hostcb.id_tap(host_log, 2.0 * x)

  jax.jit(device_fun)(1.0)
  jax.jit(device_fun)(1.0)
  hostcb.barrier_wait()
  assert accumulator == [1.0, 2.0, 1.0, 2.0]


def test_barrier_wait_accepts_logging_name():
  rec = Recorder()
  jax.jit(lambda x: hostcb.id_tap(rec, x))(1)
  hostcb.barrier_wait("my_barrier")
  assert len(rec.calls) == 1


def _queue_state():
  """(producers waiting for space, bytes held) of device 0's tap queue."""
  device = jax.devices()[0]
  if engine.available():
    c = engine.counters(device.id)
    return c["space_waiters"], c["bytes_held"]
  q = engine.queue_for(device)
  return q._waiters, q._bytes


def test_bounded_queue_makes_producer_wait_and_drops_nothing():
  old = hostcb.config.read("jax_host_callback_max_queue_byte_size")
  limit = int(16e6)
  hostcb.config.update("jax_host_callback_max_queue_byte_size", limit)
  release = threading.Event()
  seen = []
  queued = []

  def tap(arg, transforms):
    assert release.wait(timeout=120)
    queued.append(_queue_state()[1])
    seen.append(int(arg[0]))

  steps = 12  # 12 x 4 MB > 16 MB

  def f(x):
    def body(c, _):
      hostcb.id_tap(tap, jnp.full((1024 * 1024,), c, jnp.float32))
      return c + 1, None

    return lax.scan(body, x, None, length=steps)[0]

  try:
    result = []
    t = threading.Thread(target=lambda: result.append(int(jax.jit(f)(0))))
    t.start()
    deadline = time.monotonic() + 120
    while _queue_state()[0] == 0 and time.monotonic() < deadline:
      time.sleep(0.01)  # polls a condition; not used as synchronisation
    waiters, held = _queue_state()
    assert waiters > 0, "the producer never waited on the full queue"
    assert held <= limit
    release.set()
    t.join(timeout=120)
    assert not t.is_alive() and result == [steps]
    hostcb.barrier_wait()
  finally:
    release.set()
    hostcb.config.update("jax_host_callback_max_queue_byte_size", old)
  assert seen == list(range(steps))
  assert max(queued) <= limit


def test_tap_exception_raises_callback_exception_at_barrier():
  def bad(arg, transforms):
    raise ValueError("tap failed: value " + str(int(arg)))

  out = jax.jit(lambda x: hostcb.id_tap(bad, x) + 1)(3)
  assert int(out) == 4  # the computation went on
  with pytest.raises(hostcb.CallbackException) as info:
    hostcb.barrier_wait()
  msg = str(info.value)
  assert "tap failed: value 3" in msg
  assert "Traceback" in msg and "ValueError" in msg
  assert isinstance(info.value.__cause__, ValueError)


def test_tap_function_exception_alias():
  assert hostcb.TapFunctionException is hostcb.CallbackException
  jax.jit(lambda x: hostcb.id_tap(lambda a, t: 1 / 0, x))(1)
  with pytest.raises(hostcb.TapFunctionException, match="ZeroDivisionError"):
    hostcb.barrier_wait()


def test_barrier_reports_the_last_exception():
  def bad(arg, transforms):
    raise RuntimeError(f"failure number {int(arg)}")

  f = jax.jit(lambda x: hostcb.id_tap(bad, x))
  f(1)
  f(2)
  with pytest.raises(hostcb.CallbackException) as info:
    hostcb.barrier_wait()
  assert "failure number 2" in str(info.value)
  assert "failure number 1" not in str(info.value)


def test_taps_after_an_exception_still_run_and_next_barrier_is_clean():
  rec = Recorder()

  def f(x):
    hostcb.id_tap(lambda a, t: 1 / 0, x)
    hostcb.id_tap(rec, x + 1)
    return x

  jax.jit(f)(1)
  with pytest.raises(hostcb.CallbackException):
    hostcb.barrier_wait()
  assert [int(a) for a in rec.args] == [2]
  hostcb.barrier_wait()  # nothing new: no exception


def test_exception_in_eager_tap_reported_at_barrier():
  hostcb.id_tap(lambda a, t: [][1], 1.0)
  with pytest.raises(hostcb.CallbackException, match="IndexError"):
    hostcb.barrier_wait()


def test_concurrent_taps_from_several_threads_are_all_delivered():
  rec = Recorder()
  f = jax.jit(lambda x: hostcb.id_tap(rec, x))
  errors = []

  def worker(k):
    try:
      for i in range(20):
        f(k * 100 + i)
    except Exception as e:  # noqa: BLE001
      errors.append(e)

  threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  hostcb.barrier_wait()
  assert errors == []
  got = sorted(int(a) for a in rec.args)
  assert got == sorted(k * 100 + i for k in range(4) for i in range(20))
  for k in range(4):  # each thread's taps in its dispatch order
    assert [int(a) for a in rec.args if int(a) // 100 == k] == [
      k * 100 + i for i in range(20)
    ]


def test_concurrent_barrier_waits_while_other_threads_tap():
  rec = Recorder()
  f = jax.jit(lambda x: hostcb.id_tap(rec, x))
  errors = []

  def tapper(k):
    try:
      for i in range(15):
        f(k * 100 + i)
        hostcb.barrier_wait()
        # after this thread's barrier, its own taps have all run
        mine = [int(a) for a in list(rec.args) if int(a) // 100 == k]
        assert mine == [k * 100 + j for j in range(i + 1)], mine
    except Exception as e:  # noqa: BLE001
      errors.append(e)

  def barrier_only():
    try:
      for _ in range(15):
        hostcb.barrier_wait()
    except Exception as e:  # noqa: BLE001
      errors.append(e)

  threads = [threading.Thread(target=tapper, args=(k,)) for k in range(3)] + [
    threading.Thread(target=barrier_only) for _ in range(2)
  ]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  assert not any(t.is_alive() for t in threads)
  assert errors == []
  hostcb.barrier_wait()
  assert len(rec.calls) == 45


def test_barrier_wait_from_tap_function_raises_instead_of_deadlocking():
  def tap(arg, transforms):
    hostcb.barrier_wait()

  jax.jit(lambda x: hostcb.id_tap(tap, x))(1)
  with pytest.raises(hostcb.CallbackException, match="barrier_wait"):
    hostcb.barrier_wait()


def test_one_barrier_waits_for_taps_that_tap_functions_make_meanwhile():
  seen = []
  inner = jax.jit(lambda a: hostcb.id_tap(lambda v, t: seen.append("inner"), a))
  innermost = jax.jit(
    lambda a: hostcb.id_tap(lambda v, t: seen.append("innermost"), a)
  )

  def middle(a, t):
    seen.append("middle")
    innermost(a)

  def outer(a, t):
    inner(a)
    hostcb.id_tap(middle, a)  # eagerly, from the tap function
    seen.append("outer")

  jax.jit(lambda x: hostcb.id_tap(outer, x))(1)
  hostcb.barrier_wait()
  assert seen == ["outer", "inner", "middle", "innermost"]


@pytest.mark.skipif(
  not engine.available(),
  reason="needs the native engine: without it, each round of this flood "
  "of nested taps takes seconds on a loaded machine (the bound on the "
  "rounds is the same code)",
)
def test_a_barrier_returns_while_another_threads_tap_functions_keep_tapping():
  # Each of its rounds sees new taps made by tap functions: it stops after
  # NESTED_ROUNDS more rounds, as it returns while other threads tap.
  # The other thread keeps one tapping call in flight at a time (not a
  # flood, whose backlog a loaded machine takes each round long to drain).
  stop, started = threading.Event(), threading.Event()
  ran = threading.Semaphore(0)
  inner = jax.jit(lambda a: hostcb.id_tap(lambda v, t: None, a))

  def outer(a, t):
    started.set()
    inner(a)
    ran.release()

  f = jax.jit(lambda x: hostcb.id_tap(outer, x))

  def loop():
    while not stop.is_set():
      f(1)
      ran.acquire(timeout=60)

  thread = threading.Thread(target=loop, daemon=True)
  thread.start()
  try:
    assert started.wait(60), "the other thread's tap function never ran"
    assert engine.wait_for_taps(60)
  finally:
    stop.set()
    thread.join(60)
  assert not thread.is_alive()
  hostcb.barrier_wait()


def test_stop_outfeed_receiver_processes_pending_taps_then_taps_work_again():
  rec = Recorder()
  f = jax.jit(lambda x: hostcb.id_tap(rec, x))
  f(1)
  hostcb.stop_outfeed_receiver()
  assert [int(a) for a in rec.args] == [1]
  f(2)
  hostcb.id_tap(rec, 3)
  hostcb.barrier_wait()
  assert [int(a) for a in rec.args] == [1, 2, 3]


def test_taps_without_barrier_all_run_at_exit():
  code = """
import jax, hostcb
def tap(arg, transforms):
    print("tap", int(arg), flush=True)
f = jax.jit(lambda x: hostcb.id_tap(tap, x))
for i in range(50):
    f(i)
"""
  proc = run_python(code)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [f"tap {i}" for i in range(50)]


def test_exception_at_exit_is_logged_not_fatal():
  code = """
import jax, hostcb
jax.jit(lambda x: hostcb.id_tap(lambda a, t: 1 / 0, x))(1)
print("done", flush=True)
"""
  proc = run_python(code)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "done\n"
  assert "ZeroDivisionError" in proc.stderr
