"""id_print: the exact printed text, and the module docstring's examples."""
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcb
from _helpers import Stream


def printed(f, *args, **kwargs) -> str:
  """Runs ``f(*args, stream)`` under jit; returns what id_print wrote."""
  s = Stream()
  jax.jit(lambda *a: f(*a, s))(*args)
  hostcb.barrier_wait()
  return s.output


def power3(x, stream, **kw):
  y = x * x
  hostcb.id_print((x, y), what="x,x^2", output_stream=stream, **kw)
  return y * x


# ------------------------------------------------------------ the layout
def test_float_scalar():
  assert printed(lambda x, s: hostcb.id_print(x, output_stream=s), 3.) == "3.\n"


def test_int_scalar():
  assert printed(lambda x, s: hostcb.id_print(x, output_stream=s), 7) == "7\n"


def test_bool_scalar():
  assert printed(lambda x, s: hostcb.id_print(x, output_stream=s),
                 True) == "True\n"


def test_one_dimensional_array():
  assert printed(lambda x, s: hostcb.id_print(x, output_stream=s),
                 jnp.arange(4.)) == "[0. 1. 2. 3.]\n"


def test_two_dimensional_array():
  assert printed(lambda x, s: hostcb.id_print(x, output_stream=s),
                 jnp.arange(4).reshape(2, 2)) == "[[0 1]\n [2 3]]\n"


def test_tuple_one_element_per_line():
  assert printed(lambda x, s: hostcb.id_print((x, x + 1), output_stream=s),
                 1) == "( 1\n  2 )\n"


def test_list_one_element_per_line():
  assert printed(lambda x, s: hostcb.id_print([x, x + 1, x + 2],
                                              output_stream=s),
                 1) == "[ 1\n  2\n  3 ]\n"


def test_dict_sorted_keys():
  assert printed(lambda x, s: hostcb.id_print({"b": x + 1, "a": x},
                                              output_stream=s),
                 1) == "{ a=1\n  b=2 }\n"


def test_nested_containers_indent():
  out = printed(lambda x, s: hostcb.id_print(((x, x + 1), [x + 2]),
                                             output_stream=s), 1)
  assert out == "( ( 1\n    2 )\n  [ 3 ] )\n"


def test_dict_of_tuple_indent():
  out = printed(lambda x, s: hostcb.id_print({"a": (x, x + 1), "b": x},
                                             output_stream=s), 1)
  assert out == "{ a=( 1\n    2 )\n  b=1 }\n"


def test_empty_tuple():
  assert printed(lambda x, s: hostcb.id_print((), output_stream=s),
                 1) == "(  )\n"


def test_tuple_of_arrays():
  out = printed(lambda x, s: hostcb.id_print((x, x * x), output_stream=s),
                jnp.array([3., 4.]))
  assert out == "( [3. 4.]\n  [ 9. 16.] )\n"


def test_keyword_arguments_are_printed_sorted_on_a_header_line():
  out = printed(lambda x, s: hostcb.id_print(x, zeta=1, alpha="a b",
                                             output_stream=s), 2)
  assert out == "alpha: a b zeta: 1\n2\n"


def test_header_with_what():
  out = printed(lambda x, s: hostcb.id_print(x * 2, what="a * 2",
                                             output_stream=s), 5.)
  assert out == "what: a * 2\n10.\n"


def test_threshold_summarizes_long_arrays():
  out = printed(lambda x, s: hostcb.id_print(x, threshold=5, output_stream=s),
                jnp.arange(10))
  assert out == "[0 1 2 ... 7 8 9]\n"


def test_without_threshold_long_arrays_are_printed_whole():
  out = printed(lambda x, s: hostcb.id_print(x, output_stream=s),
                jnp.arange(20))
  assert out == np.array2string(np.arange(20, dtype=np.int32)) + "\n"


def test_device_in_header():
  out = printed(lambda x, s: hostcb.id_print(x, what="here",
                                             tap_with_device=True,
                                             output_stream=s), 1)
  assert out == f"device: {jax.devices()[0]} what: here\n1\n"


def test_transforms_in_header_under_vmap():
  s = Stream()
  jax.vmap(lambda x: hostcb.id_print(x, output_stream=s))(jnp.arange(2))
  hostcb.barrier_wait()
  assert s.output == "transforms: [('batch', {'batch_dims': (0,)})]\n[0 1]\n"


def test_header_keys_are_sorted_with_device_and_transforms():
  s = Stream()
  jax.vmap(lambda x: hostcb.id_print(x, what="v", tap_with_device=True,
                                     output_stream=s))(jnp.arange(2))
  hostcb.barrier_wait()
  assert s.output == (f"device: {jax.devices()[0]} "
                      "transforms: [('batch', {'batch_dims': (0,)})] what: v\n"
                      "[0 1]\n")


def test_id_print_returns_its_argument():
  s = Stream()
  out = jax.jit(lambda x: hostcb.id_print(x * 2, output_stream=s) + 1)(1.)
  hostcb.barrier_wait()
  assert float(out) == 3.
  assert s.output == "2.\n"


def test_id_print_result_is_returned():
  s = Stream()
  out = jax.jit(lambda x: hostcb.id_print(x, result=x + 10,
                                          output_stream=s))(1.)
  hostcb.barrier_wait()
  assert float(out) == 11.
  assert s.output == "1.\n"


def test_output_stream_write_is_used():
  buf = io.StringIO()
  jax.jit(lambda x: hostcb.id_print(x, what="w", output_stream=buf))(1)
  hostcb.barrier_wait()
  assert buf.getvalue() == "what: w\n1\n"


def test_default_prints_to_stdout(capsys):
  jax.jit(lambda x: hostcb.id_print((x, x * 2), what="out"))(3)
  hostcb.barrier_wait()
  assert capsys.readouterr().out == "what: out\n( 3\n  6 )\n"


def test_eager_id_print(capsys):
  out = hostcb.id_print(jnp.array([1, 2]), what="eager")
  hostcb.barrier_wait()
  assert capsys.readouterr().out == "what: eager\n[1 2]\n"
  np.testing.assert_array_equal(out, [1, 2])


def test_unhashable_keyword_value_is_printed():
  out = printed(lambda x, s: hostcb.id_print(x, tags=["a", "b"],
                                             output_stream=s), 1)
  assert out == "tags: ['a', 'b']\n1\n"


def test_prints_in_program_order_within_a_computation():
  def f(x, s):
    for i in range(5):
      x = hostcb.id_print(x + 1, step=i, output_stream=s)
    return x

  assert printed(f, 0) == "".join(f"step: {i}\n{i + 1}\n" for i in range(5))


def test_concurrent_prints_do_not_interleave_lines():
  s = Stream()

  def f(x):
    for _ in range(10):
      hostcb.id_print((x, x), what="pair", output_stream=s)
    return x

  jax.pmap(f)(jnp.arange(jax.device_count()))
  hostcb.barrier_wait()
  records = s.records()
  assert len(records) == 10 * jax.device_count()
  for r in records:
    head, a, b = r.splitlines()
    assert head == "what: pair"
    assert a[2:] == b[2:].rstrip(" )")


# ------------------------------------------- the module docstring examples
def test_docstring_power3_under_jit():
  assert printed(power3, 3.) == "what: x,x^2\n( 3.\n  9. )\n"


def test_docstring_power3_eager():
  s = Stream()
  assert float(power3(3., s)) == 27.
  hostcb.barrier_wait()
  assert s.output == "what: x,x^2\n( 3.\n  9. )\n"


def test_docstring_power3_under_jvp_prints_primals_once():
  s = Stream()
  primal, tangent = jax.jvp(lambda x: power3(x, s), (3.,), (0.1,))
  hostcb.barrier_wait()
  assert (float(primal), round(float(tangent), 5)) == (27., 2.7)
  assert s.output == "what: x,x^2\n( 3.\n  9. )\n"


def test_docstring_power3_under_grad_prints_primals_once():
  s = Stream()
  assert float(jax.grad(lambda x: power3(x, s))(3.)) == 27.
  hostcb.barrier_wait()
  assert s.output == "what: x,x^2\n( 3.\n  9. )\n"


def test_docstring_power3_under_vmap():
  s = Stream()
  out = jax.vmap(lambda x: power3(x, s))(np.array([2., 3.]))
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, [8., 27.])
  assert s.output == ("transforms: [('batch', {'batch_dims': (0, 0)})] "
                      "what: x,x^2\n( [2. 3.]\n  [4. 9.] )\n")


def test_docstring_checkpoint_prints_three_times():
  s = Stream()
  p3 = lambda x: power3(x, s)  # noqa: E731
  jax.grad(lambda x: p3(jax.checkpoint(p3)(x)))(3.)
  hostcb.barrier_wait()
  assert s.output == ("what: x,x^2\n( 3.\n  9. )\n"
                      "what: x,x^2\n( 27.\n  729. )\n"
                      "what: x,x^2\n( 3.\n  9. )\n")


def test_docstring_custom_jvp_prints_tangents():
  s = Stream()

  @jax.custom_jvp
  def print_tangents(arg):
    return None

  @print_tangents.defjvp
  def print_tangents_jvp(primals, tangents):
    arg_dot, = tangents
    hostcb.id_print(arg_dot, what="tangents", output_stream=s)
    return primals, tangents

  def power3_with_tangents(x):
    y = x * x
    hostcb.id_print((x, y), what="x,x^2", output_stream=s)
    print_tangents((x, y))
    return y * x

  jax.jvp(power3_with_tangents, (3.,), (0.1,))
  hostcb.barrier_wait()
  assert s.output == ("what: x,x^2\n( 3.\n  9. )\n"
                      "what: tangents\n( 0.1\n  0.6 )\n")


def _cotangent_printer(s):
  @jax.custom_vjp
  def print_cotangents(arg):
    return arg

  def fwd(arg):
    return print_cotangents(arg), None

  def bwd(residual, ct_b):
    hostcb.id_print(ct_b, what="cotangents", output_stream=s)
    return ct_b,

  print_cotangents.defvjp(fwd, bwd)

  def power3_with_cotangents(x):
    y = x * x
    hostcb.id_print((x, y), what="x,x^2", output_stream=s)
    x1, y1 = print_cotangents((x, y))
    return y1 * x1

  return power3_with_cotangents


def test_docstring_custom_vjp_prints_cotangents():
  s = Stream()
  assert float(jax.grad(_cotangent_printer(s))(3.)) == 27.
  hostcb.barrier_wait()
  assert s.output == ("what: x,x^2\n( 3.\n  9. )\n"
                      "what: cotangents\n( 9.\n  3. )\n")


def test_docstring_custom_vjp_prints_cotangents_under_jit():
  s = Stream()
  assert float(jax.jit(jax.grad(_cotangent_printer(s)))(3.)) == 27.
  hostcb.barrier_wait()
  assert s.output == ("what: x,x^2\n( 3.\n  9. )\n"
                      "what: cotangents\n( 9.\n  3. )\n")


@pytest.mark.multidevice
def test_docstring_pmap_with_device():
  s = Stream()
  jax.pmap(lambda x: power3(x, s, tap_with_device=True),
           devices=jax.local_devices()[:2])(np.array([3., 4.]))
  hostcb.barrier_wait()
  d0, d1 = jax.local_devices()[:2]
  assert sorted(s.records()) == sorted([
      f"device: {d0} what: x,x^2\n( 3.\n  9. )\n",
      f"device: {d1} what: x,x^2\n( 4.\n  16. )\n"])


@pytest.mark.multidevice
def test_docstring_pjit_gathers_operand_on_one_device():
  s = Stream()
  mesh = jax.sharding.Mesh(np.array(jax.local_devices()[:2]), ["d"])
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
  out = jax.jit(lambda x: power3(x, s, tap_with_device=True),
                in_shardings=(sharding,), out_shardings=sharding)(
                    np.array([3., 4.]))
  hostcb.barrier_wait()
  np.testing.assert_array_equal(out, [27., 64.])
  assert s.output == (f"device: {jax.local_devices()[0]} what: x,x^2\n"
                      "( [3. 4.]\n  [ 9. 16.] )\n")
