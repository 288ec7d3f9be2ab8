"""Scenarios: ``id_print``'s text, for every shape of value and option.

The printed text is compared character for character: container layout,
long and multi-line arrays, ``threshold``, ``output_stream``, keyword
arguments (also those that collide with the printer's own), devices and
transforms.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import host_callback as hcb

from registry import scenario


def _jp(value, **kw):
  """Prints ``value`` from under jit with the given id_print keywords."""
  leaves, tree = jax.tree_util.tree_flatten(value)
  jax.jit(lambda *a: hcb.id_print(tree.unflatten(a), **kw))(*leaves)


@scenario
def pr_scalar(ctx):
  """A float32 scalar."""
  _jp(np.float32(3.5))


@scenario
def pr_tuple_short(ctx):
  """A short tuple (fits on one line)."""
  _jp((np.float32(3.0), np.float32(9.0)))


@scenario
def pr_nested_dict(ctx):
  """The issue's dict: ``{ a=[0. 1. 2.] b=( 1 [ 2. 3. ] ) }``."""
  _jp(
    dict(
      a=np.arange(3, dtype=np.float32),
      b=(np.int32(1), [np.float32(2.0), np.float32(3.0)]),
    )
  )


@scenario
def pr_tuple_of_arrays(ctx):
  """``( [0 1 2] [0 2 4] )``."""
  _jp((np.arange(3, dtype=np.int32), 2 * np.arange(3, dtype=np.int32)))


@scenario
def pr_list(ctx):
  """A list of scalars."""
  _jp([np.int32(1), np.int32(2), np.int32(3)])


@scenario
def pr_deeply_nested(ctx):
  """Containers nested four deep."""
  _jp(([(np.int32(1), {"k": [np.float32(2.0)]})], np.bool_(True)))


@scenario
def pr_wide_tuple(ctx):
  """A tuple too wide for one line: it breaks."""
  _jp(tuple(np.arange(8, dtype=np.float32) + 100 * i for i in range(6)))


@scenario
def pr_wide_dict(ctx):
  """A dict too wide for one line."""
  _jp({f"key_{i}": np.arange(10, dtype=np.float32) * i for i in range(4)})


@scenario
def pr_multiline_array(ctx):
  """A 2-D array (printed on several lines) alone."""
  _jp(np.arange(12, dtype=np.float32).reshape(3, 4))


@scenario
def pr_multiline_array_in_tuple(ctx):
  """A 2-D array inside a tuple, next to a scalar."""
  _jp((np.float32(1.0), np.arange(12, dtype=np.float32).reshape(3, 4)))


@scenario
def pr_multiline_array_in_dict(ctx):
  """2-D arrays as dict values."""
  _jp({"m": np.eye(3, dtype=np.float32), "n": np.ones((2, 2), np.int32)})


@scenario
def pr_3d_array(ctx):
  """A 3-D array."""
  _jp(np.arange(24, dtype=np.int32).reshape(2, 3, 4))


@scenario
def pr_long_array(ctx):
  """A 1-D array of 2000 elements (numpy summarizes it)."""
  _jp(np.arange(2000, dtype=np.float32))


@scenario
def pr_long_array_wraps(ctx):
  """A 1-D array of 40 floats (wraps at numpy's line width)."""
  _jp(np.arange(40, dtype=np.float32) / 3)


@scenario
def pr_threshold_small(ctx):
  """``threshold=4`` summarizes a 10-element array."""
  _jp(np.arange(10, dtype=np.int32), threshold=4)


@scenario
def pr_threshold_in_tuple(ctx):
  """``threshold=3`` applies to every array of a tuple."""
  _jp(
    (np.arange(10, dtype=np.int32), np.arange(5, dtype=np.float32)), threshold=3
  )


@scenario
def pr_threshold_large(ctx):
  """``threshold=5000`` prints all of a 2000-element array."""
  _jp(np.arange(2000, dtype=np.int32) % 7, threshold=5000)


@scenario
def pr_output_stream(ctx):
  """``output_stream=ctx``: printed through its ``write``."""
  _jp((np.float32(1.0), np.int32(2)), output_stream=ctx, what="stream")


@scenario
def pr_kwargs_sorted(ctx):
  """Several keyword arguments, printed sorted by key."""
  _jp(np.float32(1.0), zeta=3, alpha="a", mid=[1, 2])


@scenario
def pr_kwarg_string_with_spaces(ctx):
  """A keyword value with spaces and a newline."""
  _jp(np.float32(1.0), what="two words\nand a line")


@scenario(
  ours=(
    "legacy 0.4.30 ran CPU taps synchronously, so a failing tap "
    "failed the computation with JaxRuntimeError; hostcb runs "
    "taps asynchronously, as legacy's documentation describes: "
    "the computation completes and the next barrier_wait raises "
    "CallbackException"
  ),
  expect=(
    "barrier raised CallbackException: There were exceptions during callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "TypeError: print_tap() got multiple values for argument 'transforms'\n"
    "\n"
  ),
)
def pr_kwarg_named_transforms(ctx):
  """A user keyword ``transforms=`` collides with the printer's own."""
  _jp(np.float32(1.0), transforms="mine")


@scenario(
  ours=(
    "legacy 0.4.30 ran CPU taps synchronously, so a failing tap "
    "failed the computation with JaxRuntimeError; hostcb runs "
    "taps asynchronously, as legacy's documentation describes: "
    "the computation completes and the next barrier_wait raises "
    "CallbackException"
  ),
  expect=(
    "barrier raised CallbackException: There were exceptions during callback processing. Last one was:\n"
    "Traceback (most recent call last):\n"
    "  <frames>\n"
    "TypeError: print_tap() got multiple values for argument 'transforms'\n"
    "\n"
  ),
)
def pr_kwarg_named_transforms_vmap(ctx):
  """A user ``transforms=`` keyword under vmap (the printer adds its own)."""
  jax.vmap(lambda x: hcb.id_print(x, transforms="mine"))(
    np.arange(2, dtype=np.float32)
  )


@scenario
def pr_kwarg_named_device(ctx):
  """A user keyword ``device=`` with ``tap_with_device=True``."""
  _jp(np.float32(1.0), device="mine", tap_with_device=True)


@scenario
def pr_kwarg_named_threshold_stream(ctx):
  """``threshold`` and ``output_stream`` are not printed as keywords."""
  _jp(np.arange(6, dtype=np.int32), threshold=2, output_stream=ctx, what="t")


@scenario
def pr_tap_with_device(ctx):
  """``tap_with_device=True`` prints the device first."""
  _jp(np.float32(2.0), tap_with_device=True, what="d")


@scenario
def pr_dtypes(ctx):
  """One value of each printable dtype in a tuple."""
  _jp(
    (
      np.bool_(True),
      np.int8(-3),
      np.uint8(200),
      np.int32(7),
      np.uint32(9),
      np.float16(1.5),
      jnp.bfloat16(2.5),
      np.float32(1 / 3),
      np.complex64(1 + 2j),
    )
  )


@scenario
def pr_bool_array(ctx):
  """A bool array."""
  _jp(np.array([True, False, True]))


@scenario
def pr_empty_containers(ctx):
  """Empty tuple, list and dict, inside a tuple."""
  _jp(((), [], {}, np.float32(1.0)))


@scenario
def pr_empty_tuple_alone(ctx):
  """An empty tuple alone."""
  jax.jit(lambda x: (hcb.id_print(()), x)[1])(np.float32(1.0))


@scenario
def pr_zero_size(ctx):
  """Zero-size arrays."""
  _jp((np.zeros((0,), np.float32), np.zeros((2, 0), np.int32)))


@scenario
def pr_none_leaf(ctx):
  """``None`` in the printed pytree."""
  _jp((None, np.float32(1.0)))


@scenario
def pr_eager(ctx):
  """id_print eagerly, of a tuple."""
  return hcb.id_print((np.float32(1.0), np.arange(3)), what="eager")


@scenario
def pr_vmap_tuple(ctx):
  """vmap of id_print of a tuple with an unbatched leaf."""
  jax.vmap(lambda x: hcb.id_print((x, 3.0), what="v"))(
    np.arange(3, dtype=np.float32)
  )


@scenario
def pr_jvp_tangents_zero(ctx):
  """A custom_jvp printing its tangents where one tangent is a symbolic zero
  (the argument jvp does not differentiate)."""

  @jax.custom_jvp
  def f(x, y):
    return x * y

  @f.defjvp
  def f_jvp(primals, tangents):
    hcb.id_print(tangents, what="tangents")
    return f(*primals), tangents[0] * primals[1]

  return jax.jvp(
    lambda x: f(x, np.float32(3.0)), (np.float32(2.0),), (np.float32(1.0),)
  )


@scenario
def pr_grad_integer_input_cotangent(ctx):
  """A custom_vjp printing cotangents of an int input (float0)."""

  @jax.custom_vjp
  def f(x, n):
    return x * n

  def fwd(x, n):
    return x * n, n

  def bwd(n, ct):
    hcb.id_print(ct, what="ct")
    return ct * n, None

  f.defvjp(fwd, bwd)
  return jax.grad(f)(np.float32(2.0), 3)


@scenario
def pr_float_formatting(ctx):
  """Floats that numpy prints in scientific notation and with many digits."""
  _jp(np.array([1e-8, 1.0, 123456789.0], np.float32))


@scenario
def pr_negative_and_nan(ctx):
  """Negative values, nan and inf."""
  _jp(np.array([-1.5, np.nan, np.inf, -np.inf], np.float32))


@scenario
def pr_two_prints_order(ctx):
  """Two prints in one jit come out in program order."""

  def f(x):
    y = hcb.id_print(x, what="first")
    return hcb.id_print(y * 2, what="second")

  return jax.jit(f)(np.float32(1.0))


@scenario
def pr_grad_print(ctx):
  """id_print under grad prints the primal only."""
  return jax.grad(lambda x: hcb.id_print(x * x, what="sq") * 2.0)(
    np.float32(3.0)
  )
