"""id_print: the exact text legacy ``host_callback`` printed.

Every expected string is what legacy JAX (0.4.30, NumPy 1.26) printed for the
same program.  Values are printed from under ``jit`` unless the test says
otherwise.
"""

from __future__ import annotations

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcb
from _helpers import Stream

from hostcb._engine.entries import PrintLineTap
from hostcb.host_callback import _Printer


def printed(value, **kwargs) -> str:
  """Prints ``value`` (its leaves made arguments) from under jit."""
  leaves, tree = jax.tree_util.tree_flatten(value)
  s = Stream()
  jax.jit(
    lambda *a: hostcb.id_print(tree.unflatten(a), output_stream=s, **kwargs)
  )(*leaves)
  hostcb.barrier_wait()
  return s.output


def _dev(i: int) -> str:
  """Device ``i`` as the running JAX names it (``cpu:0`` on 0.10, ``TFRT_CPU_0`` on 0.8)."""
  return str(jax.local_devices()[i])


def i32(*xs):
  """int32 scalars (one) or a tuple of them."""
  out = tuple(np.int32(x) for x in xs)
  return out[0] if len(out) == 1 else out


def power3(x, stream, **kw):
  y = x * x
  hostcb.id_print((x, y), what="x,x^2", output_stream=stream, **kw)
  return y * x


# ------------------------------------------------------------------ leaves
def test_float32_scalar_prints_as_a_0d_array():
  assert printed(np.float32(3.0)) == "3.\n"


def test_float32_scalar_keeps_float32_digits():
  assert printed(np.float32(1 / 3)) == "0.33333334\n"


def test_int32_scalar():
  assert printed(np.int32(7)) == "7\n"


@pytest.mark.parametrize(
  "dtype, text",
  [
    ("bool", "True"),
    ("int8", "1"),
    ("int16", "1"),
    ("uint8", "1"),
    ("uint16", "1"),
    ("uint32", "1"),
    ("float16", "1."),
    ("complex64", "1.+0.j"),
  ],
)
def test_scalar_of_each_dtype(dtype, text):
  assert printed(np.array(1, dtype=dtype)) == text + "\n"


def test_bfloat16_scalar():
  assert printed(jnp.array(1.5, jnp.bfloat16)) == "1.5\n"


def test_int64_scalar_is_canonicalized_to_int32():
  assert printed(np.int64(5)) == "5\n"


def test_one_dimensional_array():
  assert printed(np.arange(4, dtype=np.float32)) == "[0. 1. 2. 3.]\n"


def test_bool_array_pads_like_numpy():
  assert printed(np.array([1, 0, 1], bool)) == "[ True False  True]\n"


def test_float16_array():
  assert printed(np.array([1.5, 2.25, 1e4], np.float16)) == (
    "[1.50e+00 2.25e+00 1.00e+04]\n"
  )


def test_bfloat16_array():
  assert printed(jnp.array([1.5, 2, 3.25], jnp.bfloat16)) == "[1.5 2 3.25]\n"


def test_complex64_array():
  assert printed(np.array([1 + 2j, -0.5j], np.complex64)) == (
    "[ 1.+2.j  -0.-0.5j]\n"
  )


def test_nan_and_inf():
  assert printed(np.array([np.nan, np.inf, -np.inf], np.float32)) == (
    "[ nan  inf -inf]\n"
  )


def test_two_dimensional_array():
  assert printed(np.arange(4).reshape(2, 2)) == "[[0 1]\n [2 3]]\n"


def test_zero_size_array():
  assert printed(np.zeros((2, 0), np.int32)) == "[]\n"


def test_long_array_wraps_at_numpy_line_width():
  assert printed(np.arange(40)) == (
    "[ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 22 23\n"
    " 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39]\n"
  )


def test_none_prints_as_none():
  assert printed(None) == "None\n"


# -------------------------------------------------------------- containers
def test_short_tuple_on_one_line():
  assert printed(i32(1, 2)) == "( 1 2 )\n"


def test_list_on_one_line():
  assert printed([np.int32(1), np.float32(2.5), np.bool_(True)]) == (
    "[ 1 2.5 True ]\n"
  )


def test_dict_on_one_line_sorted_by_key():
  assert (
    printed(
      {"b": np.int32(1), "a": np.int32(2), "B": np.int32(3), "_": np.int32(4)}
    )
    == "{ B=3 _=4 a=2 b=1 }\n"
  )


def test_nested_dict_of_the_issue():
  assert printed(
    dict(
      a=np.arange(3, dtype=np.float32),
      b=(np.int32(1), [np.float32(2.0), np.float32(3.0)]),
    )
  ) == ("{ a=[0. 1. 2.] b=( 1 [ 2. 3. ] ) }\n")


def test_tuple_of_arrays_on_one_line():
  assert printed((np.arange(3), 2 * np.arange(3))) == "( [0 1 2] [0 2 4] )\n"


def test_empty_containers():
  assert printed(((), [], {})) == "( (  ) [  ] {  } )\n"


def test_empty_tuple_alone():
  assert printed(()) == "(  )\n"


def test_none_leaves_inside_a_container():
  assert printed((None, np.int32(1), None)) == "( None 1 None )\n"


def test_namedtuple_prints_as_a_tuple():
  import collections

  point = collections.namedtuple("Point", "x y")
  assert printed(point(np.int32(1), np.float32(2.0))) == "( 1 2. )\n"


def test_non_string_dict_keys():
  assert printed({(1, 2): np.int32(1), (0, 5): np.int32(2)}) == (
    "{ (0, 5)=2 (1, 2)=1 }\n"
  )


def test_container_of_exactly_80_columns_stays_on_one_line():
  assert printed(list(i32(*range(29)))) == (
    "[ 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 "
    "26 27 28 ]\n"
  )


def test_container_over_80_columns_breaks_one_element_per_line():
  out = printed(list(i32(*range(28), 100)))
  assert out == "[ " + "\n  ".join(str(i) for i in [*range(28), 100]) + " ]\n"


def test_fit_counts_from_the_column_where_the_container_starts():
  # 78 columns of tuple after "{ kkkkkkkkkk=": it no longer fits.
  assert printed({"k" * 10: tuple(np.int32(9) for _ in range(30))}) == (
    "{ kkkkkkkkkk=( 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 9 "
    "9 9 9 ) }\n"
  )


def test_fit_ignores_what_follows_the_container():
  # The inner dict fits in the line; the outer " )" after it goes past 80.
  assert printed((np.arange(3), {"key": [np.int32(7)] * 25})) == (
    "( [0 1 2] { key=[ 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 7 ] "
    "} )\n"
  )


def test_broken_container_indents_by_nesting_level_not_column():
  out = printed({"a": [np.int32(1)] * 30, "b": ({"c": [np.int32(2)] * 40},)})
  assert out == (
    "{ a=[ 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 "
    "1 1 1 1 ]\n"
    "  b=( { c=[ " + "\n        ".join(["2"] * 40) + " ] } ) }\n"
  )


def test_elements_after_a_break_start_a_fresh_line():
  out = printed({"a": [np.int32(1)] * 40, "b": i32(1, 2)})
  assert out == ("{ a=[ " + "\n    ".join(["1"] * 40) + " ]\n  b=( 1 2 ) }\n")


def test_multiline_array_in_a_container_is_not_reindented():
  assert printed((np.int32(1), np.arange(6).reshape(2, 3))) == (
    "( 1 [[0 1 2]\n [3 4 5]] )\n"
  )


def test_multiline_arrays_count_their_whole_text_toward_the_width():
  a = np.arange(4).reshape(2, 2)
  assert printed((a, a)) == "( [[0 1]\n [2 3]] [[0 1]\n [2 3]] )\n"


def test_multiline_array_in_a_dict():
  assert printed(dict(a=np.arange(6).reshape(2, 3), b=np.int32(1))) == (
    "{ a=[[0 1 2]\n [3 4 5]] b=1 }\n"
  )


def test_multiline_array_over_the_width_breaks_the_container():
  assert printed((np.arange(60).reshape(3, 20), np.int32(1))) == (
    "( [[ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19]\n"
    " [20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39]\n"
    " [40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59]]\n"
    "  1 )\n"
  )


def test_long_array_in_a_tuple():
  assert printed((np.int32(1), np.arange(40))) == (
    "( 1\n"
    "  [ 0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15 16 17 18 19 20 21 "
    "22 23\n"
    " 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39] )\n"
  )


def test_zero_size_array_in_a_tuple():
  assert printed((np.zeros((0,), np.float32), np.int32(1))) == "( [] 1 )\n"


# --------------------------------------------------------------- threshold
def test_threshold_summarizes_long_arrays():
  assert printed(np.arange(10), threshold=5) == "[0 1 2 ... 7 8 9]\n"


def test_threshold_applies_inside_containers():
  assert printed((np.arange(10), np.int32(3)), threshold=5) == (
    "( [0 1 2 ... 7 8 9] 3 )\n"
  )


def test_default_threshold_is_numpy_print_options():
  assert printed(np.arange(1001)) == "[   0    1    2 ...  998  999 1000]\n"


def test_numpy_print_options_of_the_caller_apply():
  with np.printoptions(threshold=5, linewidth=20):
    out = printed(np.arange(12))
  assert out == "[ 0  1  2 ...  9 10\n 11]\n"


def test_numpy_print_precision_of_the_caller_applies():
  with np.printoptions(precision=2):
    out = printed(np.float32(1 / 3))
  assert out == "0.33\n"


def test_numpy_print_options_of_the_caller_apply_to_scalars_and_rows():
  value = (np.float32(1 / 3), np.int32(3), np.array([1, 2], np.int32))
  with np.printoptions(precision=3, sign="+"):
    out = printed(value)
    expected = " ".join(np.array2string(np.asarray(v)) for v in value)
  assert out == f"( {expected} )\n" == "( +0.333 +3 [+1 +2] )\n"


def test_numpy_print_formatter_of_the_caller_applies_to_scalars():
  with np.printoptions(formatter={"float_kind": "<{:.1f}>".format}):
    out = printed(np.float32(2.25))
  assert out == "<2.2>\n"


# ------------------------------------------------------------- the header
def test_keyword_arguments_are_printed_sorted_on_a_header_line():
  assert printed(np.int32(2), zeta=1, alpha="a b") == "alpha: a b zeta: 1\n2\n"


def test_header_with_what():
  assert printed(np.int32(2), what="x,x^2") == "what: x,x^2\n2\n"


def test_header_values_print_with_str():
  assert printed(
    np.int32(2), what={"b": 1, "a": 2}, tags=["a", "b"], none=None
  ) == ("none: None tags: ['a', 'b'] what: {'b': 1, 'a': 2}\n2\n")


def test_header_line_is_not_wrapped():
  assert printed(np.int32(2), what="x" * 100) == f"what: {'x' * 100}\n2\n"


def test_device_keyword_is_printed():
  assert printed(np.int32(2), device="mydev") == "device: mydev\n2\n"


def test_device_keyword_none_is_not_printed():
  assert printed(np.int32(2), device=None, what="w") == "what: w\n2\n"


def test_keyword_values_print_as_they_are_at_each_tap():
  # A list's text is read at each tap, as legacy's str(v) was.
  s = Stream()
  shown = [1]
  f = jax.jit(lambda x: hostcb.id_print(x, what=shown, output_stream=s))
  f(1)
  hostcb.barrier_wait()
  shown.append(2)
  f(2)
  hostcb.barrier_wait()
  assert s.output == "what: [1]\n1\nwhat: [1, 2]\n2\n"


def _printer(**kwargs):
  """The tap function of an id_print site with these keywords."""
  return _Printer(None, None, tuple(sorted(kwargs.items())), None)


def test_engine_entry_of_fixed_keywords_makes_the_header_once():
  entry = _printer(what="loss", step=3).tap_entry()
  if isinstance(entry, PrintLineTap):  # what Python formats: its fallback
    entry = entry.fallback
  func, second = entry
  s = io.StringIO()
  with contextlib.redirect_stdout(s):
    func(np.array(1.5, np.float32), second)
    func(np.array(2, np.int32), second)
  assert s.getvalue() == "step: 3 what: loss\n1.5\nstep: 3 what: loss\n2\n"


@pytest.mark.parametrize(
  "kwargs",
  [{"what": [1]}, {"device": None}, {"transforms": 1}, {"v": np.float32(1)}],
  ids=["list", "device", "transforms", "numpy-scalar"],
)
def test_no_engine_entry_where_the_header_may_change_or_fail(kwargs):
  assert _printer(**kwargs).tap_entry() is None


def test_tap_with_device_prints_the_legacy_device_name():
  assert printed(np.int32(2), what="here", tap_with_device=True) == (
    f"device: {_dev(0)} what: here\n2\n"
  )


def test_tap_with_device_replaces_the_device_keyword():
  assert printed(np.int32(2), device="mydev", tap_with_device=True) == (
    f"device: {_dev(0)}\n2\n"
  )


def test_result_and_callback_flavor_are_not_printed():
  assert (
    printed(
      np.int32(2), result=None, callback_flavor=hostcb.CallbackFlavor.PURE
    )
    == "2\n"
  )


def test_transforms_keyword_fails_the_tap():
  # Legacy raised from the computation, hostcb from the barrier: the tap's
  # TypeError is the same.
  s = Stream()
  with pytest.raises(
    Exception, match="got multiple values for argument 'transforms'"
  ):
    jax.jit(lambda x: hostcb.id_print(x, transforms="mine", output_stream=s))(1)
    hostcb.barrier_wait()
  assert s.output == ""


# ------------------------------------------------------------- transforms
def test_transforms_under_vmap():
  s = Stream()
  jax.vmap(lambda x: hostcb.id_print(x, output_stream=s))(jnp.arange(2))
  hostcb.barrier_wait()
  assert s.output == "transforms: [('batch', {'batch_dims': (0,)})]\n[0 1]\n"


def test_transforms_sort_among_the_keywords():
  s = Stream()
  jax.vmap(
    lambda x: hostcb.id_print(
      x, output_stream=s, transforms_x=1, tap_with_device=True
    )
  )(jnp.arange(2))
  hostcb.barrier_wait()
  assert s.output == (
    f"device: {_dev(0)} "
    "transforms: [('batch', {'batch_dims': (0,)})] "
    "transforms_x: 1\n[0 1]\n"
  )


def test_transforms_under_nested_vmap():
  s = Stream()
  jax.vmap(jax.vmap(lambda x: power3(x, s)))(np.array([[2.0, 3.0]]))
  hostcb.barrier_wait()
  assert s.output == (
    "transforms: [('batch', {'batch_dims': (0, 0)}), "
    "('batch', {'batch_dims': (0, 0)})] what: x,x^2\n"
    "( [[2. 3.]] [[4. 9.]] )\n"
  )


def test_vmap_over_axis_1_prints_multiline_batches():
  s = Stream()
  jax.vmap(lambda x: power3(x, s), in_axes=1)(np.ones((2, 3)))
  hostcb.barrier_wait()
  assert s.output == (
    "transforms: [('batch', {'batch_dims': (1, 1)})] what: x,x^2\n"
    "( [[1. 1. 1.]\n [1. 1. 1.]] [[1. 1. 1.]\n [1. 1. 1.]] )\n"
  )


def test_vmap_with_an_unbatched_operand():
  s = Stream()
  jax.vmap(
    lambda x, y: hostcb.id_print((x, y), output_stream=s), in_axes=(0, None)
  )(np.arange(3.0), 5.0)
  hostcb.barrier_wait()
  assert s.output == (
    "transforms: [('batch', {'batch_dims': (0, None)})]\n( [0. 1. 2.] 5. )\n"
  )


def test_vmap_of_long_batches_breaks_the_tuple():
  s = Stream()
  jax.vmap(lambda x: power3(x, s))(np.arange(40.0))
  hostcb.barrier_wait()
  assert s.output == (
    "transforms: [('batch', {'batch_dims': (0, 0)})] what: x,x^2\n"
    "( [ 0.  1.  2.  3.  4.  5.  6.  7.  8.  9. 10. 11. 12. 13. 14. 15. 16. "
    "17.\n"
    " 18. 19. 20. 21. 22. 23. 24. 25. 26. 27. 28. 29. 30. 31. 32. 33. 34. "
    "35.\n"
    " 36. 37. 38. 39.]\n"
    "  [0.000e+00 1.000e+00 4.000e+00 9.000e+00 1.600e+01 2.500e+01 "
    "3.600e+01\n"
    " 4.900e+01 6.400e+01 8.100e+01 1.000e+02 1.210e+02 1.440e+02 1.690e+02\n"
    " 1.960e+02 2.250e+02 2.560e+02 2.890e+02 3.240e+02 3.610e+02 4.000e+02\n"
    " 4.410e+02 4.840e+02 5.290e+02 5.760e+02 6.250e+02 6.760e+02 7.290e+02\n"
    " 7.840e+02 8.410e+02 9.000e+02 9.610e+02 1.024e+03 1.089e+03 1.156e+03\n"
    " 1.225e+03 1.296e+03 1.369e+03 1.444e+03 1.521e+03] )\n"
  )


def test_jvp_under_vmap_prints_batched_primals():
  s = Stream()
  jax.vmap(lambda x: jax.jvp(lambda x: power3(x, s), (x,), (x,)))(
    np.array([2.0, 3.0])
  )
  hostcb.barrier_wait()
  assert s.output == (
    "transforms: [('batch', {'batch_dims': (0, 0)})] "
    "what: x,x^2\n( [2. 3.] [4. 9.] )\n"
  )


# ---------------------------------------------------------------- streams
def test_output_stream_write_gets_each_line():
  buf = io.StringIO()
  jax.jit(lambda x: hostcb.id_print(x, what="w", output_stream=buf))(1)
  hostcb.barrier_wait()
  assert buf.getvalue() == "what: w\n1\n"


def test_default_prints_to_stdout(capsys):
  jax.jit(lambda x: hostcb.id_print((x, x * 2), what="out"))(3)
  hostcb.barrier_wait()
  assert capsys.readouterr().out == "what: out\n( 3 6 )\n"


class _CountingFile(io.RawIOBase):
  """A file end that records each write it gets."""

  def __init__(self):
    self.writes: list[bytes] = []

  def writable(self):
    return True

  def write(self, b):
    self.writes.append(bytes(b))
    return len(b)


def test_default_stream_is_not_flushed_after_each_print(monkeypatch):
  # As legacy's print(s) and JAX's debug.print: the lines stay in a
  # block-buffered stdout's buffer until it fills, is flushed, or at exit.
  raw = _CountingFile()
  stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8")
  monkeypatch.setattr("sys.stdout", stdout)
  f = jax.jit(lambda x: hostcb.id_print(x, what="step"))
  for i in range(5):
    f(i)
  hostcb.barrier_wait()
  assert raw.writes == []
  stdout.flush()
  assert b"".join(raw.writes) == b"".join(
    b"what: step\n%d\n" % i for i in range(5)
  )


def test_prints_to_the_stdout_assigned_after_it_was_compiled():
  f = jax.jit(lambda x: hostcb.id_print(x, what="late"))
  f(0)  # compiled, and sys.stdout wrapped for the order of writes
  hostcb.barrier_wait()
  s = io.StringIO()
  with contextlib.redirect_stdout(s):
    f(1)
    hostcb.barrier_wait()
  assert s.getvalue() == "what: late\n1\n"


def test_eager_id_print_of_python_scalars():
  s = Stream()
  hostcb.id_print((1, 2.0), output_stream=s)
  hostcb.barrier_wait()
  assert s.output == "( 1 2. )\n"


def test_eager_id_print_returns_its_argument():
  s = Stream()
  out = hostcb.id_print(jnp.array([1, 2]), what="eager", output_stream=s)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, [1, 2])
  assert s.output == "what: eager\n[1 2]\n"


def test_id_print_result_is_returned():
  s = Stream()
  out = jax.jit(lambda x: hostcb.id_print(x, result=x + 10, output_stream=s))(
    1.0
  )
  hostcb.barrier_wait()
  assert float(out) == 11.0
  assert s.output == "1.\n"


def test_prints_in_program_order_within_a_computation():
  s = Stream()

  def f(x):
    for i in range(5):
      x = hostcb.id_print(x + 1, step=i, output_stream=s)
    return x

  jax.jit(f)(0)
  hostcb.barrier_wait()
  assert s.output == "".join(f"step: {i}\n{i + 1}\n" for i in range(5))


def test_concurrent_prints_keep_header_and_value_together():
  s = Stream()

  def f(x):
    for _ in range(10):
      hostcb.id_print((x, x), what="pair", output_stream=s)
    return x

  n = jax.device_count()
  jax.pmap(f)(jnp.arange(n))
  hostcb.barrier_wait()
  assert sorted(s.records()) == sorted(
    f"what: pair\n( {i} {i} )\n" for i in range(n) for _ in range(10)
  )


# ------------------------------------------- the module docstring examples
def test_docstring_power3_under_jit():
  s = Stream()
  assert float(jax.jit(lambda x: power3(x, s))(3.0)) == 27.0
  hostcb.barrier_wait()
  assert s.output == "what: x,x^2\n( 3. 9. )\n"


def test_docstring_power3_eager():
  s = Stream()
  assert float(power3(3.0, s)) == 27.0
  hostcb.barrier_wait()
  assert s.output == "what: x,x^2\n( 3. 9. )\n"


def test_docstring_power3_under_jvp_prints_primals_once():
  s = Stream()
  primal, tangent = jax.jvp(lambda x: power3(x, s), (3.0,), (0.1,))
  hostcb.barrier_wait()
  assert (float(primal), round(float(tangent), 5)) == (27.0, 2.7)
  assert s.output == "what: x,x^2\n( 3. 9. )\n"


def test_docstring_power3_under_grad_prints_primals_once():
  s = Stream()
  assert float(jax.grad(lambda x: power3(x, s))(3.0)) == 27.0
  hostcb.barrier_wait()
  assert s.output == "what: x,x^2\n( 3. 9. )\n"


def test_docstring_power3_under_vmap():
  s = Stream()
  out = jax.vmap(lambda x: power3(x, s))(np.array([2.0, 3.0]))
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, [8.0, 27.0])
  assert s.output == (
    "transforms: [('batch', {'batch_dims': (0, 0)})] "
    "what: x,x^2\n( [2. 3.] [4. 9.] )\n"
  )


def test_docstring_checkpoint_prints_three_times():
  s = Stream()
  p3 = lambda x: power3(x, s)
  jax.grad(lambda x: p3(jax.checkpoint(p3)(x)))(3.0)
  hostcb.barrier_wait()
  assert s.output == (
    "what: x,x^2\n( 3. 9. )\n"
    "what: x,x^2\n( 27. 729. )\n"
    "what: x,x^2\n( 3. 9. )\n"
  )


def _tangent_printer(s):
  @jax.custom_jvp
  def print_tangents(arg):
    return None

  @print_tangents.defjvp
  def print_tangents_jvp(primals, tangents):
    (arg_dot,) = tangents
    hostcb.id_print(arg_dot, what="tangents", output_stream=s)
    return primals, tangents

  def power3_with_tangents(x):
    y = x * x
    hostcb.id_print((x, y), what="x,x^2", output_stream=s)
    print_tangents((x, y))
    return y * x

  return power3_with_tangents


def test_docstring_custom_jvp_prints_tangents():
  s = Stream()
  jax.jvp(_tangent_printer(s), (3.0,), (0.1,))
  hostcb.barrier_wait()
  assert s.output == ("what: x,x^2\n( 3. 9. )\nwhat: tangents\n( 0.1 0.6 )\n")


def test_custom_jvp_tangents_under_vmap():
  s = Stream()
  f = _tangent_printer(s)
  jax.vmap(lambda x: jax.jvp(f, (x,), (x,)))(np.array([1.0, 2.0]))
  hostcb.barrier_wait()
  assert s.output == (
    "transforms: [('batch', {'batch_dims': (0, 0)})] what: x,x^2\n"
    "( [1. 2.] [1. 4.] )\n"
    "transforms: [('batch', {'batch_dims': (0, 0)})] what: tangents\n"
    "( [1. 2.] [2. 8.] )\n"
  )


def _cotangent_printer(s):
  @jax.custom_vjp
  def print_cotangents(arg):
    return arg

  def fwd(arg):
    return print_cotangents(arg), None

  def bwd(residual, ct_b):
    hostcb.id_print(ct_b, what="cotangents", output_stream=s)
    return (ct_b,)

  print_cotangents.defvjp(fwd, bwd)

  def power3_with_cotangents(x):
    y = x * x
    hostcb.id_print((x, y), what="x,x^2", output_stream=s)
    x1, y1 = print_cotangents((x, y))
    return y1 * x1

  return power3_with_cotangents


def test_docstring_custom_vjp_prints_cotangents():
  s = Stream()
  assert float(jax.grad(_cotangent_printer(s))(3.0)) == 27.0
  hostcb.barrier_wait()
  assert s.output == ("what: x,x^2\n( 3. 9. )\nwhat: cotangents\n( 9. 3. )\n")


def test_docstring_custom_vjp_prints_cotangents_under_jit():
  s = Stream()
  assert float(jax.jit(jax.grad(_cotangent_printer(s)))(3.0)) == 27.0
  hostcb.barrier_wait()
  assert s.output == ("what: x,x^2\n( 3. 9. )\nwhat: cotangents\n( 9. 3. )\n")


@pytest.mark.multidevice
def test_docstring_pmap_with_device():
  s = Stream()
  jax.pmap(
    lambda x: power3(x, s, tap_with_device=True),
    devices=jax.local_devices()[:2],
  )(np.array([2.0, 3.0]))
  hostcb.barrier_wait()
  assert sorted(s.records()) == [
    f"device: {_dev(0)} what: x,x^2\n( 2. 4. )\n",
    f"device: {_dev(1)} what: x,x^2\n( 3. 9. )\n",
  ]


@pytest.mark.multidevice
def test_docstring_pjit_gathers_operand_on_one_device():
  s = Stream()
  mesh = jax.sharding.Mesh(np.array(jax.local_devices()[:2]), ["d"])
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  out = jax.jit(
    lambda x: power3(x, s, tap_with_device=True),
    in_shardings=(sharding,),
    out_shardings=sharding,
  )(np.array([3.0, 4.0]))
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, [27.0, 64.0])
  assert s.output == (f"device: {_dev(0)} what: x,x^2\n( [3. 4.] [ 9. 16.] )\n")
