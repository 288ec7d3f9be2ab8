"""id_tap: identity semantics, values, dtypes, and taps that are never dropped."""

import functools
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcb
from _helpers import Recorder


# ------------------------------------------------------------------ values
def test_id_tap_returns_its_argument_under_jit():
  rec = Recorder()
  out = jax.jit(lambda x: hostcb.id_tap(rec, x * 2.0))(3.0)
  hostcb.barrier_wait()
  assert float(out) == 6.0
  assert len(rec.calls) == 1
  np.testing.assert_array_equal(rec.args[0], np.float32(6.0))


def test_id_tap_returns_its_argument_eagerly():
  rec = Recorder()
  x = jnp.arange(3.0)
  out = hostcb.id_tap(rec, x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, x)
  np.testing.assert_array_equal(rec.args[0], np.arange(3.0, dtype=np.float32))


def test_tap_function_receives_numpy_arrays_and_empty_transforms():
  rec = Recorder()
  jax.jit(lambda x: hostcb.id_tap(rec, x))(jnp.ones(2))
  hostcb.barrier_wait()
  assert isinstance(rec.args[0], np.ndarray)
  assert rec.transforms == [()]
  assert rec.calls[0][2] == {}


# Sizes of each kind of array the engine hands out: a slot of a shared slab,
# memory of its own, a view of the record's own block (1 MiB and more).
WRITEABLE_SIZES = [4, 1000, 1 << 19]
WRITEABLE_IDS = ["slab", "own_memory", "own_block"]


@pytest.mark.parametrize("n", WRITEABLE_SIZES, ids=WRITEABLE_IDS)
def test_a_tapped_array_can_be_made_writeable_again_as_legacy_allowed(n):
  # Read-only as it arrives; writing to it once made writeable changes
  # neither the computation's value nor another tap's array.
  seen = []

  def tap(a, transforms):
    seen.append(a.flags.writeable)
    a.flags.writeable = True
    a[...] = -1
    seen.append(a.copy())

  x = jnp.arange(n, dtype=jnp.float32)
  out = jax.jit(lambda x: hostcb.id_tap(tap, x) * 2 + hostcb.id_tap(tap, x))(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, 3 * np.arange(n, dtype=np.float32))
  assert [seen[0], seen[2]] == [False, False]
  for a in (seen[1], seen[3]):
    np.testing.assert_array_equal(a, np.full(n, -1, np.float32))


@pytest.mark.parametrize("n", WRITEABLE_SIZES, ids=WRITEABLE_IDS)
def test_writing_to_a_tapped_array_changes_no_other_taps_arrays(n):
  # The first tap writes to its array; later taps of the same value, and
  # the other operand of its own record, keep the values computed.
  kept = []

  def write(arg, transforms):
    a, b = arg
    a.flags.writeable = True
    b.flags.writeable = True
    a[...] = -1
    kept.append(b)

  def keep(a, transforms):
    kept.append(a)

  def f(x):
    hostcb.id_tap(write, (x, x + 1))
    hostcb.id_tap(keep, x)
    return hostcb.id_tap(keep, x) * 2

  x = jnp.arange(n, dtype=jnp.float32)
  out = jax.jit(f)(x)
  hostcb.barrier_wait()
  want = np.arange(n, dtype=np.float32)
  np.testing.assert_array_equal(out, 2 * want)
  assert len(kept) == 3
  np.testing.assert_array_equal(kept[0], want + 1)
  np.testing.assert_array_equal(kept[1], want)
  np.testing.assert_array_equal(kept[2], want)


def test_result_is_returned_instead_of_arg():
  rec = Recorder()
  out = jax.jit(lambda x: hostcb.id_tap(rec, x, result=x * 10.0))(2.0)
  hostcb.barrier_wait()
  assert float(out) == 20.0
  np.testing.assert_array_equal(rec.args[0], np.float32(2.0))


def test_result_pytree_is_returned_and_not_tapped():
  rec = Recorder()
  out = jax.jit(lambda x: hostcb.id_tap(rec, x, result=(x + 1, {"a": x})))(1.0)
  hostcb.barrier_wait()
  assert float(out[0]) == 2.0 and float(out[1]["a"]) == 1.0
  assert len(rec.calls) == 1
  np.testing.assert_array_equal(rec.args[0], np.float32(1.0))


def test_result_eager_is_returned_as_is():
  rec = Recorder()
  res = np.arange(3)
  assert hostcb.id_tap(rec, 1.0, result=res) is res
  hostcb.barrier_wait()
  np.testing.assert_array_equal(rec.args[0], np.float32(1.0))


def test_result_that_is_not_a_jax_value_raises_legacy_type_error():
  rec = Recorder()
  with pytest.raises(
    TypeError,
    match=re.escape(
      "Argument 'done' of type <class 'str'> is not a valid JAX type."
    ),
  ):
    hostcb.id_tap(rec, 1.0, result={"status": "done"})
  hostcb.barrier_wait()
  assert rec.calls == []


def test_nested_pytree_is_passed_with_its_structure():
  rec = Recorder()
  arg = {"b": (jnp.ones(2), [jnp.int32(3), jnp.zeros((1, 2))]), "a": 1.0}
  out = jax.jit(lambda a: hostcb.id_tap(rec, a))(arg)
  hostcb.barrier_wait()
  got = rec.args[0]
  assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(arg)
  assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(arg)
  np.testing.assert_array_equal(got["b"][0], np.ones(2, np.float32))
  np.testing.assert_array_equal(got["b"][1][0], np.int32(3))
  np.testing.assert_array_equal(got["b"][1][1], np.zeros((1, 2), np.float32))
  np.testing.assert_array_equal(got["a"], np.float32(1.0))


@pytest.mark.parametrize(
  "arg",
  [None, (), [], {}, (None, ())],
  ids=["None", "empty_tuple", "empty_list", "empty_dict", "nested_empty"],
)
def test_empty_pytrees_are_tapped(arg):
  rec = Recorder()
  out = jax.jit(lambda: hostcb.id_tap(rec, arg))()
  hostcb.barrier_wait()
  assert out == arg
  assert rec.args == [arg]


def test_none_leaves_inside_a_pytree_are_kept():
  rec = Recorder()
  jax.jit(lambda x: hostcb.id_tap(rec, (x, None, [None])))(1.0)
  hostcb.barrier_wait()
  ((x, n1, (n2,)),) = rec.args
  assert n1 is None and n2 is None
  np.testing.assert_array_equal(x, np.float32(1.0))


def test_zero_size_arrays_are_tapped():
  rec = Recorder()
  out = jax.jit(lambda x: hostcb.id_tap(rec, (x, jnp.ones(1))))(
    jnp.zeros((0, 3), jnp.int32)
  )
  hostcb.barrier_wait()
  assert out[0].shape == (0, 3)
  got = rec.args[0][0]
  assert got.shape == (0, 3) and got.dtype == np.int32


def test_python_scalars_are_tapped_as_arrays():
  rec = Recorder()
  out = hostcb.id_tap(rec, (1, 2.5, True))
  hostcb.barrier_wait()
  assert out == (1, 2.5, True)
  i, f, b = rec.args[0]
  assert i.dtype == np.int32 and int(i) == 1
  assert f.dtype == np.float32 and float(f) == 2.5
  assert b.dtype == np.bool_ and bool(b) is True


def test_python_scalars_under_jit():
  rec = Recorder()
  jax.jit(lambda x: hostcb.id_tap(rec, (x, 7)))(2.0)
  hostcb.barrier_wait()
  x, seven = rec.args[0]
  assert float(x) == 2.0 and int(seven) == 7


def test_non_array_leaf_raises_type_error():
  with pytest.raises(
    TypeError,
    match=re.escape(
      "Argument 'not an array' of type <class 'str'> is not a valid JAX type."
    ),
  ):
    hostcb.id_tap(Recorder(), ("not an array",))


def test_kwargs_raise_type_error_in_legacy_words():
  with pytest.raises(
    TypeError,
    match=re.escape(
      "Support for **kwargs in ``id_tap`` has been removed. Instead, "
      "pre-apply keyword arguments, either by using a closure or by passing "
      "``functools.partial(tap_func, **kwargs)``."
    ),
  ):
    hostcb.id_tap(Recorder(), 1.0, what="x")


def test_functools_partial_passes_extra_keywords():
  got = []

  def host_func(arg, transforms, *, what):
    got.append((float(arg), transforms, what))

  jax.jit(
    lambda x: hostcb.id_tap(functools.partial(host_func, what="act"), 2 * x)
  )(3.0)
  hostcb.barrier_wait()
  assert got == [(6.0, (), "act")]


def test_closure_can_drop_transforms():
  got = []
  jax.jit(
    lambda x, y: hostcb.id_tap(
      lambda tap, transforms: got.append(tap), dict(x=x, y=y)
    )
  )(1.0, 2.0)
  hostcb.barrier_wait()
  assert [{k: float(v) for k, v in g.items()} for g in got] == [
    {"x": 1.0, "y": 2.0}
  ]


def test_tap_with_device_passes_device_keyword_under_jit():
  rec = Recorder()
  jax.jit(lambda x: hostcb.id_tap(rec, x, tap_with_device=True))(1.0)
  hostcb.barrier_wait()
  assert rec.calls[0][2] == {"device": jax.devices()[0]}


def test_tap_with_device_eager_reports_device_of_operand():
  rec = Recorder()
  dev = jax.devices()[-1]
  hostcb.id_tap(rec, jax.device_put(1.0, dev), tap_with_device=True)
  hostcb.barrier_wait()
  assert rec.calls[0][2] == {"device": dev}


def test_tap_with_device_for_jit_committed_to_another_device():
  rec = Recorder()
  dev = jax.devices()[-1]
  jax.jit(lambda x: hostcb.id_tap(rec, x + 1, tap_with_device=True))(
    jax.device_put(1.0, dev)
  )
  hostcb.barrier_wait()
  assert rec.calls[0][2] == {"device": dev}


def test_bad_callback_flavor_is_rejected():
  with pytest.raises(TypeError, match="CallbackFlavor"):
    hostcb.id_tap(Recorder(), 1.0, callback_flavor="io")


def test_callback_flavor_values_are_accepted_for_taps():
  for flavor in hostcb.CallbackFlavor:
    rec = Recorder()
    jax.jit(lambda x: hostcb.id_tap(rec, x, callback_flavor=flavor))(1.0)
    hostcb.barrier_wait()
    assert len(rec.calls) == 1, flavor


def test_device_index_beyond_the_local_devices_is_rejected():
  n = jax.device_count()
  with pytest.raises(ValueError, match=f"one of the {n} devices .* got {n}"):
    jax.jit(lambda x: hostcb.id_tap(Recorder(), x, device_index=n))(1.0)


def test_negative_device_index_is_rejected():
  with pytest.raises(ValueError, match="device_index"):
    hostcb.id_tap(Recorder(), 1.0, device_index=-1)


def test_non_callable_tap_func_is_rejected():
  with pytest.raises(TypeError, match="Expected a callable value, got "):
    hostcb.id_tap(42, 1.0)


def test_callback_flavor_enum_members():
  assert {m.name for m in hostcb.CallbackFlavor} == {
    "IO_CALLBACK",
    "PURE",
    "DEBUG",
  }


# ------------------------------------------------------------------ dtypes
_DTYPES = [
  np.bool_,
  np.int8,
  np.int16,
  np.int32,
  np.uint8,
  np.uint16,
  np.uint32,
  np.float16,
  jnp.bfloat16,
  np.float32,
  np.complex64,
]


@pytest.mark.parametrize("dtype", _DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtype_is_preserved_under_jit(dtype):
  rec = Recorder()
  x = (jnp.arange(6) % 2).astype(dtype).reshape(2, 3)
  out = jax.jit(lambda x: hostcb.id_tap(rec, x))(x)
  hostcb.barrier_wait()
  got = rec.args[0]
  assert got.dtype == np.dtype(dtype)
  assert got.shape == (2, 3)
  np.testing.assert_array_equal(got, np.asarray(x))
  assert out.dtype == np.dtype(dtype)


@pytest.mark.parametrize("dtype", _DTYPES, ids=lambda d: np.dtype(d).name)
def test_dtype_is_preserved_eagerly(dtype):
  rec = Recorder()
  x = jnp.ones((2,), dtype)
  hostcb.id_tap(rec, x)
  hostcb.barrier_wait()
  assert rec.args[0].dtype == np.dtype(dtype)
  np.testing.assert_array_equal(rec.args[0], np.asarray(x))


def test_complex64_values_survive():
  rec = Recorder()
  x = jnp.array([1 + 2j, -3j], jnp.complex64)
  jax.jit(lambda x: hostcb.id_tap(rec, x))(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(
    rec.args[0], np.array([1 + 2j, -3j], np.complex64)
  )


@pytest.mark.parametrize(
  "dtype",
  [np.float64, np.int64, np.uint64, np.complex128],
  ids=lambda d: np.dtype(d).name,
)
def test_x64_dtype_is_preserved(dtype):
  rec = Recorder()
  with jax.enable_x64(True):
    x = jnp.array([1, 2], dtype) + (
      jnp.array(2**40, dtype)
      if np.dtype(dtype).kind in "iu"
      else jnp.array(1e-12, dtype)
    )
    out = jax.jit(lambda x: hostcb.id_tap(rec, x))(x)
    hostcb.barrier_wait()
    expected = np.asarray(x)
  assert out.dtype == np.dtype(dtype)
  assert rec.args[0].dtype == np.dtype(dtype)
  np.testing.assert_array_equal(rec.args[0], expected)


# ---------------------------------------------------------- never dropped
def test_tap_runs_when_its_result_is_unused():
  rec = Recorder()

  def f(x):
    hostcb.id_tap(rec, x * 3)
    return x + 1

  assert float(jax.jit(f)(1.0)) == 2.0
  hostcb.barrier_wait()
  np.testing.assert_array_equal(rec.args, [np.float32(3.0)])


def test_tap_runs_when_function_returns_nothing():
  rec = Recorder()

  def f(x):
    hostcb.id_tap(rec, x)

  assert jax.jit(f)(5) is None
  hostcb.barrier_wait()
  assert [int(a) for a in rec.args] == [5]


def test_tap_in_taken_cond_branch_runs():
  rec = Recorder()

  def f(x):
    return lax.cond(
      x > 0, lambda x: hostcb.id_tap(rec, x + 100), lambda x: x - 1, x
    )

  assert float(jax.jit(f)(1.0)) == 101.0
  assert float(jax.jit(f)(-1.0)) == -2.0
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [101.0]


def test_unused_tap_inside_cond_runs():
  rec = Recorder()

  def branch(x):
    hostcb.id_tap(rec, x)
    return x * 2

  jax.jit(lambda x: lax.cond(True, branch, lambda x: x, x))(4.0)
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [4.0]


def test_tap_inside_switch_runs_selected_branch():
  rec = Recorder()
  branches = [lambda x, i=i: hostcb.id_tap(rec, (i, x)) for i in range(3)]
  jax.jit(lambda i, x: lax.switch(i, branches, x))(2, 1.0)
  hostcb.barrier_wait()
  assert [(int(i), float(x)) for i, x in rec.args] == [(2, 1.0)]


def test_tap_inside_scan_runs_every_step_in_order():
  rec = Recorder()

  def body(c, a):
    hostcb.id_tap(rec, (c, a))
    return c + a, c

  jax.jit(lambda xs: lax.scan(body, 0, xs))(jnp.arange(5))
  hostcb.barrier_wait()
  assert [(int(c), int(a)) for c, a in rec.args] == [
    (0, 0),
    (0, 1),
    (1, 2),
    (3, 3),
    (6, 4),
  ]


def test_tap_inside_while_loop_body_runs_every_iteration():
  rec = Recorder()

  def body(c):
    hostcb.id_tap(rec, c)
    return c + 1

  assert (
    int(jax.jit(lambda x: lax.while_loop(lambda c: c < 4, body, x))(0)) == 4
  )
  hostcb.barrier_wait()
  assert [int(a) for a in rec.args] == [0, 1, 2, 3]


def test_tap_inside_while_loop_cond_runs_every_test():
  rec = Recorder()

  def cond(c):
    return hostcb.id_tap(rec, c) < 3

  jax.jit(lambda x: lax.while_loop(cond, lambda c: c + 1, x))(0)
  hostcb.barrier_wait()
  assert [int(a) for a in rec.args] == [0, 1, 2, 3]


def test_tap_inside_fori_loop_runs_every_iteration():
  rec = Recorder()

  def body(i, c):
    hostcb.id_tap(rec, (i, c))
    return c * 2

  # A traced bound makes fori_loop a while_loop; a static one a scan.
  out = jax.jit(lambda n: lax.fori_loop(0, n, body, 1))(3)
  assert int(out) == 8
  out = jax.jit(lambda x: lax.fori_loop(0, 3, body, x))(1)
  assert int(out) == 8
  hostcb.barrier_wait()
  assert [(int(i), int(c)) for i, c in rec.args] == [(0, 1), (1, 2), (2, 4)] * 2


def test_tap_inside_nested_jit_runs():
  rec = Recorder()
  inner = jax.jit(lambda x: hostcb.id_tap(rec, x + 1) * 2)
  outer = jax.jit(lambda x: inner(inner(x)) + 1)
  assert float(outer(0.0)) == 7.0
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [1.0, 3.0]


def test_tap_inside_nested_loops_runs_every_iteration():
  rec = Recorder()

  def inner_body(j, c):
    hostcb.id_tap(rec, c)
    return c + 1

  def outer_body(i, c):
    return lax.fori_loop(0, 2, inner_body, c)

  jax.jit(lambda x: lax.fori_loop(0, 3, outer_body, x))(0)
  hostcb.barrier_wait()
  assert [int(a) for a in rec.args] == list(range(6))


def test_tap_inside_lax_map_runs_for_every_element():
  rec = Recorder()
  jax.jit(lambda xs: lax.map(lambda x: hostcb.id_tap(rec, x), xs))(
    jnp.arange(4)
  )
  hostcb.barrier_wait()
  assert [int(a) for a in rec.args] == [0, 1, 2, 3]


def test_many_taps_on_one_device_run_in_program_order():
  rec = Recorder()

  def f(x):
    for i in range(50):
      x = hostcb.id_tap(rec, x + i)
    return x

  jax.jit(f)(0)
  hostcb.barrier_wait()
  expected = list(np.cumsum(np.arange(50)))
  assert [int(a) for a in rec.args] == expected


def test_independent_taps_run_in_program_order():
  rec = Recorder()

  def f(x):
    for i in range(20):
      hostcb.id_tap(rec, i)
    return x

  jax.jit(f)(0)
  hostcb.barrier_wait()
  assert [int(a) for a in rec.args] == list(range(20))


def test_taps_of_successive_computations_run_in_dispatch_order():
  rec = Recorder()
  f = jax.jit(lambda x: hostcb.id_tap(rec, x))
  for i in range(30):
    f(i)
  hostcb.barrier_wait()
  assert [int(a) for a in rec.args] == list(range(30))


def test_eager_and_jit_taps_interleave_in_order():
  rec = Recorder()
  f = jax.jit(lambda x: hostcb.id_tap(rec, x))
  for i in range(5):
    hostcb.id_tap(rec, 2 * i)
    f(2 * i + 1)
  hostcb.barrier_wait()
  assert [int(a) for a in rec.args] == list(range(10))


def test_tap_functions_run_on_a_consumer_thread_by_default():
  threads = []
  jax.jit(
    lambda x: hostcb.id_tap(
      lambda a, t: threads.append(threading.current_thread()), x
    )
  )(1.0)
  hostcb.barrier_wait()
  assert len(threads) == 1 and threads[0] is not threading.current_thread()


def test_same_tap_twice_compiles_and_runs_each_time():
  rec = Recorder()
  f = jax.jit(lambda x: hostcb.id_tap(rec, x))
  f(1.0)
  f(2.0)
  hostcb.barrier_wait()
  assert [float(a) for a in rec.args] == [1.0, 2.0]


# ------------------------------------------------ returned values (as legacy)
def test_eager_python_float_comes_back_as_float32_array():
  out = hostcb.id_tap(Recorder(), 3.0)
  hostcb.barrier_wait()
  assert isinstance(out, jax.Array)
  assert out.dtype == np.float32 and out.weak_type
  assert float(out) == 3.0


def test_eager_numpy_int64_comes_back_as_canonical_int32():
  out = hostcb.id_tap(Recorder(), np.array([2**31 - 1]))
  hostcb.barrier_wait()
  assert isinstance(out, jax.Array) and out.dtype == np.int32
  assert out.tolist() == [2**31 - 1]


def test_eager_tuple_of_numbers_comes_back_as_arrays():
  a, b = hostcb.id_tap(Recorder(), (1, 2.0))
  hostcb.barrier_wait()
  assert (a.dtype, b.dtype) == (np.int32, np.float32)


def test_jvp_tangent_of_tapped_value_is_an_array():
  _, t = jax.jvp(lambda x: 2.0 * hostcb.id_tap(Recorder(), x), (3.0,), (1.0,))
  hostcb.barrier_wait()
  assert isinstance(t, jax.Array) and float(t) == 2.0


# ---------------------------------------------------------------- PRNG keys
def test_new_style_key_is_tapped_as_its_key_data():
  rec = Recorder()
  key = jax.random.key(0)
  out = jax.jit(lambda k: hostcb.id_tap(rec, k))(key)
  hostcb.barrier_wait()
  assert rec.args[0].dtype == np.uint32
  np.testing.assert_array_equal(rec.args[0], jax.random.key_data(key))
  assert jax.dtypes.issubdtype(out.dtype, jax.dtypes.prng_key)
  np.testing.assert_array_equal(
    jax.random.key_data(out), jax.random.key_data(key)
  )


def test_key_in_a_pytree_is_tapped_eagerly_and_comes_back_a_key():
  rec = Recorder()
  key = jax.random.key(1)
  out_key, out_x = hostcb.id_tap(rec, (key, 2.0))
  hostcb.barrier_wait()
  np.testing.assert_array_equal(rec.args[0][0], jax.random.key_data(key))
  assert jax.dtypes.issubdtype(out_key.dtype, jax.dtypes.prng_key)
  assert float(out_x) == 2.0


def test_legacy_prngkey_with_custom_prng_enabled_taps_and_returns_result():
  rec = Recorder()
  with jax.enable_custom_prng():
    key = jax.random.PRNGKey(0)
    out = jax.jit(lambda k: hostcb.id_tap(rec, k, result=k))(key)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(rec.args[0], jax.random.key_data(key))
  np.testing.assert_array_equal(
    jax.random.key_data(out), jax.random.key_data(key)
  )


def test_vmap_of_tapped_keys_taps_batched_key_data():
  rec = Recorder()
  keys = jax.random.split(jax.random.key(0), 3)
  jax.vmap(lambda k: hostcb.id_tap(rec, k))(keys)
  hostcb.barrier_wait()
  assert rec.args[0].shape == (3, 2)
  assert rec.transforms == [(("batch", {"batch_dims": (0,)}),)]
