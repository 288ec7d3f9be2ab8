"""call: results from the host, result_shape forms, checked results."""

import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcb
from _helpers import Recorder
from hostcb._core import engine_entries

_compiles = []
_compiles_lock = threading.Lock()


def _on_event(event, duration, **kwargs):
  if event.endswith("backend_compile_duration"):
    with _compiles_lock:
      _compiles.append(event)


jax.monitoring.register_event_duration_secs_listener(_on_event)


def compile_count() -> int:
  with _compiles_lock:
    return len(_compiles)


# ------------------------------------------------------------- basics
def test_call_returns_host_result_under_jit():
  out = jax.jit(lambda x: hostcb.call(np.sin, x, result_shape=x))(
    np.float32(1.0)
  )
  assert out.dtype == np.float32
  np.testing.assert_allclose(out, np.sin(np.float32(1.0)), rtol=1e-6)


def test_call_eager():
  out = hostcb.call(
    lambda a: a * 2,
    np.arange(3, dtype=np.int32),
    result_shape=jax.ShapeDtypeStruct((3,), np.int32),
  )
  np.testing.assert_array_equal(out, [0, 2, 4])


def test_call_host_eig_docstring_example():
  def host_eig(m):
    # NumPy >= 2.5 returns complex eigenvalues even when they are real.
    return np.linalg.eigvals(m).real.astype(m.dtype)

  def device_fun(m):
    return hostcb.call(
      host_eig, m, result_shape=jax.ShapeDtypeStruct(m.shape[:-1], m.dtype)
    )

  m = np.array([[2.0, 1.0], [1.0, 2.0]], np.float32)
  out = jax.jit(device_fun)(m)
  assert out.shape == (2,) and out.dtype == np.float32
  np.testing.assert_allclose(sorted(np.asarray(out)), [1.0, 3.0], rtol=1e-6)


def test_call_result_is_usable_by_following_device_code():
  f = jax.jit(lambda x: hostcb.call(lambda a: a + 1, x, result_shape=x) * 10)
  assert float(f(np.float32(1.0))) == 20.0


def test_call_argument_pytree_is_passed_with_structure():
  got = []

  def host(arg):
    got.append(arg)
    return arg["a"] + arg["b"][0]

  out = jax.jit(
    lambda x: hostcb.call(host, {"a": x, "b": (x * 2, None)}, result_shape=x)
  )(np.float32(1.0))
  assert float(out) == 3.0
  assert set(got[0]) == {"a", "b"} and got[0]["b"][1] is None


def test_call_pytree_result():
  def host(a):
    return {"s": a.sum(), "l": [a * 2, np.int32(7)]}

  x = np.arange(3, dtype=np.float32)
  out = jax.jit(
    lambda x: hostcb.call(
      host,
      x,
      result_shape={
        "s": jax.ShapeDtypeStruct((), np.float32),
        "l": [x, jax.ShapeDtypeStruct((), np.int32)],
      },
    )
  )(x)
  assert float(out["s"]) == 3.0
  np.testing.assert_array_equal(out["l"][0], [0.0, 2.0, 4.0])
  assert int(out["l"][1]) == 7 and out["l"][1].dtype == np.int32


def test_call_result_shape_numeric_scalar():
  out = jax.jit(
    lambda x: hostcb.call(lambda a: np.float32(a * 3), x, result_shape=1.0)
  )(2.0)
  assert float(out) == 6.0 and out.shape == () and out.dtype == np.float32


def test_call_result_shape_int_scalar():
  out = hostcb.call(lambda a: np.int32(5), 1.0, result_shape=0)
  assert int(out) == 5 and out.dtype == np.int32


def test_call_result_shape_numpy_array():
  out = hostcb.call(
    lambda a: np.ones((2, 3), np.float32),
    1.0,
    result_shape=np.zeros((2, 3), np.float32),
  )
  assert out.shape == (2, 3)


def test_call_result_shape_jax_array():
  x = jnp.zeros((4,), jnp.int32)
  out = jax.jit(lambda x: hostcb.call(lambda a: a + 1, x, result_shape=x))(x)
  np.testing.assert_array_equal(out, [1, 1, 1, 1])


def test_call_result_shape_none_means_no_result():
  got = []
  out = jax.jit(
    lambda x: hostcb.call(lambda a: got.append(float(a)), x, result_shape=None)
  )(2.0)
  assert out is None
  assert got == [2.0]


def test_call_result_shape_empty_tuple_means_no_result():
  got = []
  out = jax.jit(
    lambda x: hostcb.call(lambda a: (got.append(1), ())[1], x, result_shape=())
  )(2.0)
  assert out == ()
  assert got == [1]


def test_call_zero_size_result():
  out = hostcb.call(
    lambda a: np.zeros((0, 2), np.float32),
    1.0,
    result_shape=jax.ShapeDtypeStruct((0, 2), np.float32),
  )
  assert out.shape == (0, 2)


@pytest.mark.parametrize(
  "bad",
  ["a string", object(), [1, "x"]],
  ids=["str", "object", "list_with_str"],
)
def test_bad_result_shape_raises_value_error_in_legacy_words(bad):
  with pytest.raises(
    ValueError,
    match=re.escape(
      "result_shape should be a pytree of values with structure matching the "
      "expected result of the callback function. The values must be either "
      "numeric scalars, or must have 'shape' and 'dtype' attributes. Got "
    ),
  ):
    hostcb.call(lambda a: a, 1.0, result_shape=bad)


def test_call_host_result_is_cast_to_canonical_dtype():
  # The host returns float64 (NumPy's default); result_shape asks float32.
  out = hostcb.call(
    lambda a: np.ones(2),
    1.0,
    result_shape=jax.ShapeDtypeStruct((2,), np.float32),
  )
  assert out.dtype == np.float32


@pytest.mark.parametrize(
  "dtype",
  [np.bool_, np.int8, np.uint16, np.float16, jnp.bfloat16, np.complex64],
  ids=lambda d: np.dtype(d).name,
)
def test_call_round_trips_dtype(dtype):
  x = jnp.ones((3,), dtype)
  out = jax.jit(lambda x: hostcb.call(lambda a: a, x, result_shape=x))(x)
  assert out.dtype == np.dtype(dtype)
  np.testing.assert_array_equal(out, np.asarray(x))


def test_call_round_trips_x64_dtypes():
  with jax.enable_x64(True):
    for dtype in (np.float64, np.int64, np.uint64, np.complex128):
      x = jnp.array([1, 2], dtype)
      out = jax.jit(lambda x: hostcb.call(lambda a: a * 2, x, result_shape=x))(
        x
      )
      assert out.dtype == np.dtype(dtype), dtype
      np.testing.assert_array_equal(out, np.array([2, 4], dtype))


# A call whose result is one array checks an exact NumPy array of the
# result's dtype and shape in C++ on CPU (hostcb_call_one); every other kind
# of result goes through Python's check.  Each kind must come back by value.
@pytest.mark.parametrize(
  "make",
  [
    lambda: np.arange(12, dtype=np.float32)[::2].reshape(2, 3),  # strided
    lambda: np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
    lambda: np.arange(6, dtype=np.float64).reshape(2, 3),  # cast
    lambda: jnp.arange(6, dtype=jnp.float32).reshape(2, 3),  # a jax.Array
  ],
  ids=["strided", "fortran", "float64", "jax_array"],
)
def test_call_result_of_any_array_kind_comes_back_by_value(make):
  expected = np.asarray(make(), np.float32)
  shape = jax.ShapeDtypeStruct((2, 3), np.float32)
  out = jax.jit(lambda x: hostcb.call(lambda a: make(), x, result_shape=shape))(
    np.float32(0.0)
  )
  assert out.dtype == np.float32
  np.testing.assert_array_equal(out, expected)


def test_call_scalar_result_returned_as_numpy_scalar_comes_back():
  out = jax.jit(
    lambda x: hostcb.call(lambda a: np.float32(a + 2), x, result_shape=x)
  )(np.float32(1.0))
  assert out == np.float32(3.0)


def test_call_with_device_under_jit():
  got = []

  def host(a, *, device):
    got.append(device)
    return a

  jax.jit(
    lambda x: hostcb.call(host, x, result_shape=x, call_with_device=True)
  )(1.0)
  assert got == [jax.devices()[0]]


def test_call_with_device_eager_on_other_device():
  got = []
  dev = jax.devices()[-1]

  def host(a, *, device):
    got.append(device)
    return a

  hostcb.call(
    host,
    jax.device_put(np.float32(1.0), dev),
    result_shape=1.0,
    call_with_device=True,
  )
  assert got == [dev]


# ------------------------------------------------- control flow & order
def test_call_inside_scan():
  def body(c, _):
    return hostcb.call(lambda a: a + 1, c, result_shape=c), None

  out = jax.jit(lambda x: lax.scan(body, x, None, length=4)[0])(np.int32(0))
  assert int(out) == 4


def test_call_inside_while_loop():
  out = jax.jit(
    lambda x: lax.while_loop(
      lambda c: c < 10,
      lambda c: hostcb.call(lambda a: a * 2, c, result_shape=c),
      x,
    )
  )(np.int32(1))
  assert int(out) == 16


def test_call_inside_cond():
  f = jax.jit(
    lambda x: lax.cond(
      x > 0,
      lambda x: hostcb.call(lambda a: a * 10, x, result_shape=x),
      lambda x: x,
      x,
    )
  )
  assert float(f(np.float32(2.0))) == 20.0
  assert float(f(np.float32(-2.0))) == -2.0


def test_call_with_unused_result_still_runs():
  got = []

  def f(x):
    hostcb.call(lambda a: (got.append(float(a)), a)[1], x, result_shape=x)
    return x + 1

  jax.jit(f)(np.float32(3.0))
  assert got == [3.0]


def test_call_sees_taps_before_it_already_processed():
  rec = Recorder()
  seen = []

  def host(a):
    seen.append(len(rec.calls))
    return a

  def f(x):
    for i in range(5):
      hostcb.id_tap(rec, i)
    return hostcb.call(host, x, result_shape=x)

  jax.jit(f)(np.float32(0.0))
  assert seen == [5]


def _pure_call(host, x):
  return hostcb.call(
    host, x, result_shape=x, callback_flavor=hostcb.CallbackFlavor.PURE
  )


def _logging_host(events, name, result=lambda a: a + 1):
  def host(a):
    events.append(f"{name} {a.tolist()}")
    return result(a)

  return host


def _logging_tap(events, name):
  return lambda a, transforms: events.append(f"{name} {a.tolist()}")


def test_pure_flavor_call_runs_after_the_tap_before_it_and_before_the_one_after():
  events = []

  def f(x):
    hostcb.id_tap(_logging_tap(events, "before"), x)
    y = _pure_call(_logging_host(events, "call"), x)
    return hostcb.id_tap(_logging_tap(events, "after"), y)

  assert float(jax.jit(f)(np.float32(1.0))) == 2.0
  hostcb.barrier_wait()
  assert events == ["before 1.0", "call 1.0", "after 2.0"]


def test_pure_flavor_call_that_raises_after_a_tap_lets_the_tap_run_first():
  events = []

  def fail(a):
    events.append(f"call {a.tolist()}")
    raise ValueError("call boom")

  def f(x):
    hostcb.id_tap(_logging_tap(events, "before"), x)
    y = _pure_call(fail, x)
    return hostcb.id_tap(_logging_tap(events, "after"), y)

  with pytest.raises(Exception, match="call boom"):
    jax.jit(f)(np.float32(1.0))
  # As before: the failure also reaches the next barrier_wait.
  with pytest.raises(hostcb.CallbackException, match="call boom"):
    hostcb.barrier_wait()
  assert events == ["before 1.0", "call 1.0"]


def test_pure_flavor_call_in_a_scan_body_keeps_program_order():
  events = []

  def body(c, x):
    hostcb.id_tap(_logging_tap(events, "before"), x)
    y = _pure_call(_logging_host(events, "call"), x)
    return c + hostcb.id_tap(_logging_tap(events, "after"), y), None

  out = jax.jit(lambda xs: lax.scan(body, 0.0, xs)[0])(jnp.arange(2.0))
  assert float(out) == 3.0
  hostcb.barrier_wait()
  assert events == [
    "before 0.0",
    "call 0.0",
    "after 1.0",
    "before 1.0",
    "call 1.0",
    "after 2.0",
  ]


def test_pure_flavor_call_in_a_nested_jit_runs_after_the_tap_before_it():
  events = []
  inner = jax.jit(lambda v: _pure_call(_logging_host(events, "call"), v))

  def f(x):
    hostcb.id_tap(_logging_tap(events, "before"), x)
    return hostcb.id_tap(_logging_tap(events, "after"), inner(x))

  jax.jit(f)(np.float32(1.0))
  hostcb.barrier_wait()
  assert events == ["before 1.0", "call 1.0", "after 2.0"]


def test_pure_flavor_call_whose_result_is_unused_is_not_run():
  events = []

  def f(x):
    hostcb.id_tap(_logging_tap(events, "before"), x)
    _pure_call(_logging_host(events, "call"), x)
    return hostcb.id_tap(_logging_tap(events, "after"), x + 1)

  jax.jit(f)(np.float32(1.0))
  hostcb.barrier_wait()
  assert events == ["before 1.0", "after 2.0"]


def test_calls_run_synchronously_before_computation_returns():
  accumulator = []

  def host_log(arg):
    accumulator.append(float(arg))
    return np.float32(0.0)

  def device_fun(x):
    y = hostcb.call(
      host_log, x, result_shape=jax.ShapeDtypeStruct((), np.float32)
    )
    z = hostcb.call(
      host_log, 2.0 * x, result_shape=jax.ShapeDtypeStruct((), np.float32)
    )
    return y + z

  jax.jit(device_fun)(1.0).block_until_ready()
  jax.jit(device_fun)(1.0).block_until_ready()
  assert accumulator == [1.0, 2.0, 1.0, 2.0]


# ------------------------------------------------------ checked results
def _assert_next_computation_works():
  """The failed call was recorded for the barrier; everything after works."""
  with pytest.raises(hostcb.CallbackException):
    hostcb.barrier_wait()
  assert float(jax.jit(lambda x: x + 1)(1.0)) == 2.0
  out = jax.jit(lambda x: hostcb.call(lambda a: a * 2, x, result_shape=x))(
    np.float32(3.0)
  )
  assert float(out) == 6.0
  rec = Recorder()
  jax.jit(lambda x: hostcb.id_tap(rec, x))(1)
  hostcb.barrier_wait()
  assert len(rec.calls) == 1


def test_wrong_pytree_raises_naming_expected_and_actual():
  with pytest.raises(Exception) as info:
    jax.jit(lambda x: hostcb.call(lambda a: (a, a), x, result_shape=x))(
      np.float32(1.0)
    )
  assert re.search(
    r"Callback func .* should have returned a result with "
    r"pytree PyTreeDef\(\*\) but returned PyTreeDef\(\(\*, \*\)\)",
    str(info.value),
  )
  _assert_next_computation_works()


def test_wrong_shape_raises_naming_expected_and_actual():
  with pytest.raises(Exception) as info:
    jax.jit(
      lambda x: hostcb.call(lambda a: np.ones(3, np.float32), x, result_shape=x)
    )(np.float32(1.0))
  assert re.search(
    r"Callback func .* should have returned a result with "
    r"abstract values ShapedArray\(float32\[\]\) but returned "
    r"ShapedArray\(float32\[3\]\)",
    str(info.value),
  )
  _assert_next_computation_works()


def test_wrong_dtype_raises_naming_expected_and_actual():
  with pytest.raises(Exception) as info:
    jax.jit(lambda x: hostcb.call(lambda a: np.int32(1), x, result_shape=x))(
      np.float32(1.0)
    )
  assert re.search(
    r"should have returned a result with abstract values "
    r"ShapedArray\(float32\[\]\) but returned "
    r"ShapedArray\(int32\[\]\)",
    str(info.value),
  )
  _assert_next_computation_works()


def test_wrong_dtype_array_of_right_shape_raises_naming_expected_and_actual():
  with pytest.raises(Exception) as info:
    jax.jit(
      lambda x: hostcb.call(lambda a: np.ones(2, np.int32), x, result_shape=x)
    )(np.ones(2, np.float32))
  assert re.search(
    r"should have returned a result with abstract values "
    r"ShapedArray\(float32\[2\]\) but returned "
    r"ShapedArray\(int32\[2\]\)",
    str(info.value),
  )
  _assert_next_computation_works()


def test_result_of_other_byte_order_raises_naming_the_byte_order():
  # Legacy rejected it too ("Incorrect output dtype ... Actual: >f4").
  with pytest.raises(Exception) as info:
    jax.jit(
      lambda x: hostcb.call(lambda a: np.ones(2, ">f4"), x, result_shape=x)
    )(np.ones(2, np.float32))
  assert re.search(
    r"should have returned a result with abstract values "
    r"ShapedArray\(float32\[2\]\) but returned "
    r"ShapedArray\(float32\[2\]\) \(result 0 has NumPy dtype "
    r"'>f4', expected '<f4'\)",
    str(info.value),
  )
  _assert_next_computation_works()


def test_callback_exception_is_raised_in_caller_with_its_text():
  def host(a):
    raise ValueError("host function failed on purpose")

  with pytest.raises(Exception, match="host function failed on purpose"):
    jax.jit(lambda x: hostcb.call(host, x, result_shape=x))(np.float32(1.0))
  _assert_next_computation_works()


def test_callback_exception_eager_is_raised():
  def host(a):
    raise KeyError("eager failure")

  with pytest.raises(Exception, match="eager failure"):
    hostcb.call(host, np.float32(1.0), result_shape=np.float32(1.0))
  _assert_next_computation_works()


def test_wrong_result_eager_raises():
  with pytest.raises(Exception, match=r"float32\[2\]"):
    hostcb.call(
      lambda a: np.ones(2, np.float32),
      np.float32(1.0),
      result_shape=np.float32(1.0),
    )
  _assert_next_computation_works()


def test_callback_exception_inside_scan_is_raised():
  def host(a):
    if a == 2:
      raise RuntimeError("step two failed")
    return a

  def body(c, _):
    return hostcb.call(host, c, result_shape=c) + 1, None

  with pytest.raises(Exception, match="step two failed"):
    jax.jit(lambda x: lax.scan(body, x, None, length=4)[0])(np.int32(0))
  _assert_next_computation_works()


def test_failed_call_is_also_reported_by_the_next_barrier_wait():
  def host(a):
    raise ValueError("nope")

  with pytest.raises(Exception, match="nope"):
    jax.jit(lambda x: hostcb.call(host, x, result_shape=x))(np.float32(1.0))
  with pytest.raises(
    hostcb.CallbackException,
    match="(?s)There were exceptions during callback "
    "processing. Last one was:.*ValueError: nope",
  ):
    hostcb.barrier_wait()
  hostcb.barrier_wait()  # reported once


def test_failed_call_whose_failure_cannot_be_recorded_fails_with_both(
  monkeypatch,
):
  # Fault injection: recording the failure (for barrier_wait) raises.  As a
  # raise inside the runner's `except` would, the recorder's error fails
  # the computation, with the host function's as its context.
  def broken_record(e, what):
    raise RuntimeError("recorder broke")

  monkeypatch.setattr(engine_entries, "_record_call_failure", broken_record)

  def host(a):
    raise ValueError("nope")

  with pytest.raises(
    Exception,
    match="(?s)ValueError: nope.*During handling of the above exception, "
    "another exception occurred.*RuntimeError: recorder broke",
  ):
    jax.jit(lambda x: hostcb.call(host, x, result_shape=x))(np.float32(1.0))
  hostcb.barrier_wait()  # nothing was recorded
  monkeypatch.undo()
  out = jax.jit(lambda x: hostcb.call(lambda a: a * 2, x, result_shape=x))(
    np.float32(3.0)
  )
  assert float(out) == 6.0


# ---------------------------------------------------- transformations
def test_call_under_jvp_raises_not_implemented():
  with pytest.raises(
    NotImplementedError,
    match="JVP rule is implemented only for id_tap, not for call",
  ):
    jax.jvp(lambda x: hostcb.call(np.sin, x, result_shape=x), (1.0,), (1.0,))


def test_call_under_grad_raises_not_implemented():
  with pytest.raises(
    NotImplementedError,
    match="JVP rule is implemented only for id_tap, not for call",
  ):
    jax.grad(lambda x: hostcb.call(np.sin, x, result_shape=x))(1.0)


def test_call_under_vmap_raises_for_io_callback_flavor():
  with pytest.raises(NotImplementedError, match="batching rules"):
    jax.vmap(lambda x: hostcb.call(np.sin, x, result_shape=x))(
      np.ones(3, np.float32)
    )


def test_pure_flavor_call_under_vmap():
  shapes = []

  def host(a):
    shapes.append(a.shape)
    return np.sin(a)

  x = np.arange(3, dtype=np.float32)
  out = jax.vmap(
    lambda v: hostcb.call(
      host, v, result_shape=v, callback_flavor=hostcb.CallbackFlavor.PURE
    )
  )(x)
  np.testing.assert_allclose(out, np.sin(x), rtol=1e-6)
  assert len(shapes) >= 1


def test_pure_flavor_call_under_vmap_with_unbatched_operand():
  x = np.arange(3, dtype=np.float32)
  out = jax.vmap(
    lambda v: hostcb.call(
      lambda a: a[0] + a[1],
      (v, np.float32(10.0)),
      result_shape=v,
      callback_flavor=hostcb.CallbackFlavor.PURE,
    )
  )(x)
  np.testing.assert_array_equal(out, x + 10.0)


def test_debug_flavor_with_result_returns_it_as_legacy_did():
  out = jax.jit(
    lambda x: hostcb.call(
      lambda a: a * 2,
      x,
      result_shape=x,
      callback_flavor=hostcb.CallbackFlavor.DEBUG,
    )
  )(np.float32(3.0))
  assert float(out) == 6.0


def test_debug_flavor_without_result_runs():
  got = []
  jax.jit(
    lambda x: hostcb.call(
      lambda a: got.append(float(a)),
      x,
      callback_flavor=hostcb.CallbackFlavor.DEBUG,
    )
  )(4.0)
  assert got == [4.0]


def test_custom_vjp_around_call_gives_gradient():
  @jax.custom_vjp
  def host_sin(x):
    return hostcb.call(np.sin, x, result_shape=x)

  def fwd(x):
    return host_sin(x), x

  def bwd(x, ct):
    return (ct * hostcb.call(np.cos, x, result_shape=x),)

  host_sin.defvjp(fwd, bwd)
  x = np.float32(0.7)
  np.testing.assert_allclose(jax.grad(host_sin)(x), np.cos(x), rtol=1e-6)
  np.testing.assert_allclose(
    jax.jit(jax.grad(host_sin))(x), np.cos(x), rtol=1e-6
  )


# ----------------------------------------------------------- caching
def test_eager_calls_with_same_function_and_shapes_compile_once():
  def host(a):
    return a + 1

  hostcb.call(host, np.float32(0.0), result_shape=np.float32(0.0))
  before = compile_count()
  for i in range(5):
    out = hostcb.call(host, np.float32(i), result_shape=np.float32(0.0))
    assert float(out) == i + 1
  assert compile_count() == before
  # A new shape does compile (the counter does see compilations).
  hostcb.call(
    host, np.zeros(3, np.float32), result_shape=np.zeros(3, np.float32)
  )
  assert compile_count() > before


def test_three_eager_calls_on_a_numpy_array_compile_once():
  def host(a):
    return a * 2

  x = np.arange(3.0)  # float64: JAX makes it float32
  before = compile_count()
  for _ in range(3):
    out = hostcb.call(host, x, result_shape=x)
  assert compile_count() - before == 1
  np.testing.assert_array_equal(out, np.arange(3.0) * 2)


def test_eager_taps_with_same_function_and_shapes_compile_once():
  rec = Recorder()
  hostcb.id_tap(rec, np.float32(0.0))
  before = compile_count()
  for i in range(5):
    hostcb.id_tap(rec, np.float32(i))
  assert compile_count() == before
  hostcb.barrier_wait()
  assert len(rec.calls) == 6


def test_non_callable_callback_is_rejected():
  with pytest.raises(TypeError, match="Expected a callable value, got None"):
    hostcb.call(None, 1.0)


def test_non_callable_callback_is_named_by_its_str_as_in_legacy():
  with pytest.raises(
    TypeError, match=re.escape("Expected a callable value, got np.sin (")
  ):
    hostcb.call("np.sin", 1.0)
