"""The knobs: jax_host_callback_inline and jax_host_callback_max_queue_byte_size."""

import threading

import jax
import numpy as np
import pytest

import hostcb
from _helpers import run_python


@pytest.fixture
def inline():
  old = hostcb.config.read("jax_host_callback_inline")
  hostcb.config.update("jax_host_callback_inline", True)
  yield
  hostcb.config.update("jax_host_callback_inline", old)


def test_defaults():
  assert hostcb.config.read("jax_host_callback_inline") is False
  assert hostcb.config.read("jax_host_callback_max_queue_byte_size") == int(
    256e6
  )
  assert hostcb.config.read("hostcb_strict_barrier") is False
  assert hostcb.config.read("hostcb_callback_jax_arrays") is True
  assert hostcb.config.read("hostcb_consumer_nice") == 10


def test_a_subscriber_gets_the_value_now_and_at_every_change():
  seen = []
  old = hostcb.config.read("jax_host_callback_inline")
  hostcb.config.subscribe("jax_host_callback_inline", seen.append)
  try:
    hostcb.config.update("jax_host_callback_inline", not old)
    hostcb.config.update("jax_host_callback_inline", old)
  finally:
    hostcb.config._subscribers["jax_host_callback_inline"].remove(seen.append)
  assert seen == [old, not old, old]


def test_the_queue_bound_reaches_the_engine():
  old = hostcb.config.read("jax_host_callback_max_queue_byte_size")
  try:
    hostcb.config.update("jax_host_callback_max_queue_byte_size", int(32e6))
    if hostcb.engine.available():
      jax.jit(lambda x: hostcb.id_tap(lambda a, t: None, x))(1)
      hostcb.barrier_wait()
      assert hostcb.engine.counters(0)["capacity"] == int(32e6)
    assert hostcb._engine.pyqueue._max_bytes == int(32e6)
  finally:
    hostcb.config.update("jax_host_callback_max_queue_byte_size", old)


def test_an_unknown_option_names_the_known_ones():
  with pytest.raises(KeyError, match="'hostcb_strict_barrier'"):
    hostcb.config.read("hostcb_no_such_option")


def test_an_unknown_option_names_the_fast_dispatch_alias_too():
  with pytest.raises(KeyError) as info:
    hostcb.config.update("hostcb_no_such_option", True)
  for name in (
    "jax_host_callback_inline",
    "jax_host_callback_max_queue_byte_size",
    "hostcb_strict_barrier",
    "hostcb_gpu_engine",
    "hostcb_callback_jax_arrays",
    "hostcb_consumer_nice",
    "hostcb_fast_dispatch",
  ):
    assert repr(name) in str(info.value)


def test_inline_eager_tap_runs_in_calling_thread(inline):
  threads = []
  hostcb.id_tap(lambda a, t: threads.append(threading.current_thread()), 1.0)
  assert threads == [threading.current_thread()]  # before any barrier


def test_inline_eager_tap_exception_propagates_to_caller(inline):
  with pytest.raises(ZeroDivisionError):
    hostcb.id_tap(lambda a, t: 1 / 0, 1.0)


def test_inline_eager_call_runs_in_calling_thread(inline):
  threads = []
  out = hostcb.call(
    lambda a: (threads.append(threading.current_thread()), a * 2)[1],
    np.float32(2.0),
    result_shape=np.float32(0.0),
  )
  assert float(out) == 4.0
  assert threads == [threading.current_thread()]


def _tapped_dtypes(arg):
  seen = []
  hostcb.id_tap(lambda a, t: seen.append([x.dtype.name for x in a]), arg)
  hostcb.barrier_wait()
  return seen


def test_inline_eager_tap_sees_the_dtypes_it_sees_without_inline(inline):
  arg = (3.0, 2, np.float64(0.5), np.arange(2, dtype=np.int64), True)
  got = _tapped_dtypes(arg)
  hostcb.config.update("jax_host_callback_inline", False)
  assert got == _tapped_dtypes(arg)
  assert got == [["float32", "int32", "float32", "int32", "bool"]]


def test_inline_eager_call_gets_the_canonical_dtype(inline):
  seen = []
  out = hostcb.call(
    lambda a: (seen.append(a.dtype.name), a * 2)[1], 1.5, result_shape=1.5
  )
  assert seen == ["float32"]
  assert float(out) == 3.0


def test_inline_eager_call_result_is_not_the_host_functions_array(inline):
  buf = np.zeros(2, np.float32)

  def host(a):
    buf[:] = a
    return buf

  out = hostcb.call(host, np.ones(2, np.float32), result_shape=buf)
  buf[:] = -1
  np.testing.assert_array_equal(out, np.ones(2, np.float32))


def test_inline_does_not_affect_jit(inline):
  threads = []
  jax.jit(
    lambda x: hostcb.id_tap(
      lambda a, t: threads.append(threading.current_thread()), x
    )
  )(1.0)
  hostcb.barrier_wait()
  assert len(threads) == 1 and threads[0] is not threading.current_thread()


def test_not_inline_eager_tap_runs_on_consumer_thread():
  threads = []
  hostcb.id_tap(lambda a, t: threads.append(threading.current_thread()), 1.0)
  hostcb.barrier_wait()
  assert len(threads) == 1 and threads[0] is not threading.current_thread()


def test_jax_config_update_legacy_spelling():
  old = hostcb.config.read("jax_host_callback_inline")
  try:
    jax.config.update("jax_host_callback_inline", True)
    assert hostcb.config.read("jax_host_callback_inline") is True
  finally:
    jax.config.update("jax_host_callback_inline", old)
  assert hostcb.config.read("jax_host_callback_inline") is old


def test_queue_size_below_16mb_is_rejected():
  with pytest.raises(ValueError, match="at least"):
    hostcb.config.update("jax_host_callback_max_queue_byte_size", 1000)


def test_unknown_option_is_rejected():
  with pytest.raises(KeyError, match="jax_host_callback_inline"):
    hostcb.config.update("jax_host_callback_nope", 1)


def test_environment_variables_set_the_knobs():
  code = """
import threading, hostcb
print(hostcb.config.read("jax_host_callback_inline"),
      hostcb.config.read("jax_host_callback_max_queue_byte_size"))
t = []
hostcb.id_tap(lambda a, tr: t.append(threading.current_thread()), 1.)
print(t == [threading.current_thread()])
"""
  proc = run_python(
    code,
    env_extra={
      "JAX_HOST_CALLBACK_INLINE": "1",
      "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE": "20000000",
    },
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.split() == ["True", "20000000", "True"]


def test_the_environment_opts_out_of_jax_arrays():
  proc = run_python(
    'import hostcb; print(hostcb.config.read("hostcb_callback_jax_arrays"))',
    env_extra={"HOSTCB_CALLBACK_JAX_ARRAYS": "0"},
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "False\n"


@pytest.mark.parametrize("value", [-1, 20, True, 2.5])
def test_the_consumer_nice_takes_an_int_from_0_to_19(value):
  with pytest.raises((TypeError, ValueError), match="hostcb_consumer_nice"):
    hostcb.config.update("hostcb_consumer_nice", value)
  assert hostcb.config.read("hostcb_consumer_nice") == 10


def test_the_environment_sets_the_consumer_nice():
  proc = run_python(
    'import hostcb; print(hostcb.config.read("hostcb_consumer_nice"))',
    env_extra={"HOSTCB_CONSUMER_NICE": "0"},
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "0\n"


def test_an_unreadable_consumer_nice_in_the_environment_names_the_variable():
  proc = run_python(
    "import hostcb", env_extra={"HOSTCB_CONSUMER_NICE": "lowest"}
  )
  assert proc.returncode != 0
  assert "HOSTCB_CONSUMER_NICE must be a nice increment" in proc.stderr
