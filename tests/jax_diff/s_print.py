"""Scenarios: what ``jax.debug.print`` prints (format strings, values)."""

import jax
import jax.numpy as jnp
import numpy as np

from jax_diff.registry import scenario

X3 = np.arange(3, dtype=np.float32)
X23 = np.arange(6, dtype=np.float32).reshape(2, 3)


@scenario
def print_eager_positional(ctx, api):
  """Outside jit: positional fields with an array and a number."""
  api.debug_print("x={} n={}", jnp.asarray(X3), 7)


@scenario
def print_eager_keyword(ctx, api):
  """Outside jit: named fields."""
  api.debug_print("a={a} b={b}", a=jnp.float32(1.5), b=jnp.int32(-2))


@scenario
def print_jit_positional(ctx, api):
  """Under jit: positional fields, the function's result after."""

  def f(x):
    api.debug_print("x={} y={}", x, x * 2)
    return x + 1

  return jax.jit(f)(X3)


@scenario
def print_jit_keyword(ctx, api):
  """Under jit: named fields, used out of order."""

  def f(x):
    api.debug_print("{b} then {a}", a=x, b=x.sum())
    return x

  return jax.jit(f)(X3)


@scenario
def print_numbered_fields(ctx, api):
  """Explicitly numbered fields, one used twice."""
  jax.jit(lambda x, y: api.debug_print("{1} {0} {1}", x, y))(X3, 4.0)


@scenario
def print_format_spec_float(ctx, api):
  """A float format spec (``{x:.2f}``) on a scalar."""
  jax.jit(lambda x: api.debug_print("x={x:.2f}", x=x[1] / 3))(X3)


@scenario
def print_format_spec_int(ctx, api):
  """Integer format specs: zero padding, hex, sign."""
  jax.jit(lambda i: api.debug_print("{:04d} {:x} {:+d}", i, i * 16, i))(
    np.int32(5)
  )


@scenario
def print_format_spec_width_string(ctx, api):
  """Width and alignment specs on a scalar (``{:>8}``, ``{:<6}|``)."""
  jax.jit(lambda x: api.debug_print("[{:>8}] [{:<6}]", x, x))(np.float32(2.5))


@scenario
def print_format_spec_on_array_eager(ctx, api):
  """A float spec on a non-scalar array, outside jit: the error of
  formatting an array reaches the caller."""
  api.debug_print("{:.2f}", jnp.asarray(X3))


@scenario
def print_repr_conversion(ctx, api):
  """``{x!r}`` shows the array's repr (``Array(...)``)."""
  jax.jit(lambda x: api.debug_print("{x!r}", x=x))(X3)


@scenario
def print_str_conversion(ctx, api):
  """``{x!s}`` and ``{x!a}``."""
  jax.jit(lambda x: api.debug_print("{x!s} / {x!a}", x=x))(X3)


@scenario
def print_attribute_and_index(ctx, api):
  """Fields with an attribute and an item: ``{x.shape}``, ``{x[1]}``."""
  jax.jit(lambda x: api.debug_print("{x.shape} {x.dtype} {x[1]}", x=x))(X23)


@scenario
def print_pytree_dict(ctx, api):
  """A dict argument prints as a dict of arrays."""
  jax.jit(lambda x: api.debug_print("{}", {"b": x, "a": x[0]}))(X3)


@scenario
def print_pytree_tuple_list(ctx, api):
  """Tuples and lists (nested) print as themselves."""
  jax.jit(lambda x: api.debug_print("{} {}", (x, [x * 2, (x[0],)]), [x]))(X3)


@scenario
def print_pytree_field_item(ctx, api):
  """An item of a pytree argument: ``{d[k]}``."""
  jax.jit(lambda x: api.debug_print("{d[k]}", d={"k": x}))(X3)


@scenario
def print_dtypes_int(ctx, api):
  """Integer dtypes (int8, uint8, int16, uint32, int32)."""

  def f(x):
    api.debug_print(
      "{} {} {} {} {}",
      x.astype(jnp.int8),
      x.astype(jnp.uint8),
      x.astype(jnp.int16),
      x.astype(jnp.uint32),
      x,
    )

  jax.jit(f)(np.array([-1, 0, 7], np.int32))


@scenario
def print_dtypes_float(ctx, api):
  """Float dtypes (float16, bfloat16, float32) with fractions."""

  def f(x):
    api.debug_print(
      "{} {} {}", x.astype(jnp.float16), x.astype(jnp.bfloat16), x
    )

  jax.jit(f)(np.array([0.1, 1.5, -3.25], np.float32))


@scenario
def print_one_scalar_each_dtype_and_spec(ctx, api):
  """One 0-d argument per print (the consumer's one-argument path, which
  formats a 0-d value as its Python number): float16, float32, the
  integer dtypes, bool, bfloat16 and complex64, each with plain, width,
  precision, sign and type specs, ``{0}`` and ``{!s}``, on NaN, the
  infinities, -0.0 and the limits (ordered: JAX's unordered prints in one
  computation come in XLA's order)."""
  floats = np.array(
    [1.1, -0.0, np.nan, np.inf, -np.inf, 65504.0, 6e-8, 1 / 3], np.float32
  )
  ints = np.array([-128, 0, 7, 255], np.int32)
  float_specs = ["{}", "{0}", "{:.3f}", "{:>12}", "{:+e}", "{:g}", "{!s}"]
  int_specs = ["{}", "{:04d}", "{:x}", "{:+}", "{:>6}", "{:.2f}", "{!s}"]

  def f(x, i):
    for k in range(x.shape[0]):
      for v in (x[k].astype(jnp.float16), x[k]):
        for spec in float_specs:
          api.debug_print(spec, v, ordered=True)
      api.debug_print("{}", x[k].astype(jnp.bfloat16), ordered=True)
      api.debug_print(
        "{}", (x[k] + 1j * x[k]).astype(jnp.complex64), ordered=True
      )
    for k in range(i.shape[0]):
      for v in (
        i[k].astype(jnp.int8),
        i[k].astype(jnp.uint8),
        i[k].astype(jnp.int16),
        i[k].astype(jnp.uint32),
        i[k],
        i[k] > 0,
      ):
        for spec in int_specs:
          api.debug_print(spec, v, ordered=True)

  jax.jit(f)(floats, ints)


@scenario
def print_dtypes_bool_complex(ctx, api):
  """bool and complex64."""

  def f(x):
    api.debug_print("{} {}", x > 1, x + 1j * x)

  jax.jit(f)(X3)


@scenario
def print_shapes(ctx, api):
  """Scalars, 2-d, 3-d and empty arrays."""

  def f(x):
    api.debug_print("{}|{}|{}|{}", x[0, 0], x, x.reshape(1, 2, 3), x[:0])

  jax.jit(f)(X23)


@scenario
def print_large_array_summarized(ctx, api):
  """An array above NumPy's summarization threshold (``...``)."""
  jax.jit(lambda x: api.debug_print("{}", x))(np.arange(2000, dtype=np.int32))


@scenario
def print_numpy_printoptions(ctx, api):
  """The NumPy print options in effect when ``print`` is traced apply,
  also to later calls of the same jitted function."""
  f = jax.jit(lambda x: api.debug_print("{}", x / 3))
  with np.printoptions(precision=2, suppress=True):
    f(X3)
    ctx.barrier()
  f(X3)


@scenario
def print_python_scalars(ctx, api):
  """Python int, float and bool arguments (staged as weak arrays)."""
  api.debug_print("{} {} {}", 3, 2.5, True)


@scenario
def print_python_scalars_jit(ctx, api):
  """Python numbers formatted with specs, under jit."""
  jax.jit(lambda x: api.debug_print("{:.1f} {:d} {}", 2.25, 3, x[0]))(X3)


@scenario
def print_string_argument(ctx, api):
  """A string argument stays on the host as it is."""
  jax.jit(lambda x: api.debug_print("{} is {}", "x", x))(X3)


@scenario
def print_object_argument(ctx, api):
  """An object argument (not an array) prints with its ``__format__``."""

  class Tag:
    def __format__(self, spec):
      return f"<tag {spec or 'plain'}>"

  jax.jit(lambda x: api.debug_print("{} {:wide} {}", Tag(), Tag(), x))(X3)


@scenario
def print_none_argument(ctx, api):
  """``None`` as an argument (an empty pytree)."""
  jax.jit(lambda x: api.debug_print("{} {}", None, x))(X3)


@scenario
def print_escaped_braces(ctx, api):
  """Doubled braces print as braces."""
  jax.jit(lambda x: api.debug_print("{{literal}} {} {{}}", x))(X3)


@scenario
def print_no_fields(ctx, api):
  """A format without fields and no arguments prints as it is."""
  jax.jit(lambda x: api.debug_print("just text"))(X3)


@scenario
def print_empty_format(ctx, api):
  """An empty format with no arguments prints an empty line."""
  jax.jit(lambda x: api.debug_print(""))(X3)


@scenario
def print_skip_format_check_no_fields(ctx, api):
  """``skip_format_check=True`` and a format without fields: the format
  and then the arguments, separated by spaces."""
  jax.jit(
    lambda x: api.debug_print("values:", x, x[0], skip_format_check=True)
  )(X3)


@scenario
def print_skip_format_check_unused(ctx, api):
  """``skip_format_check=True`` with a field and an unused argument."""
  jax.jit(lambda x: api.debug_print("{}", x, x[0], skip_format_check=True))(X3)


@scenario
def print_literal_first_with_field(ctx, api):
  """Text before the first field: still formatted."""
  jax.jit(lambda x: api.debug_print("value {}", x))(X3)


@scenario
def print_unused_positional_error(ctx, api):
  """An unused positional argument: ValueError at trace time."""
  jax.jit(lambda x: api.debug_print("{}", x, x))(X3)


@scenario
def print_unused_keyword_error(ctx, api):
  """An unused keyword argument (an f-string mistake): ValueError."""
  jax.jit(lambda x: api.debug_print("x", x=x))(X3)


@scenario
def print_missing_positional_error(ctx, api):
  """A field without an argument: IndexError."""
  jax.jit(lambda x: api.debug_print("{} {}", x))(X3)


@scenario
def print_missing_keyword_error(ctx, api):
  """A named field without an argument: KeyError."""
  jax.jit(lambda x: api.debug_print("{y}", x=x))(X3)


@scenario
def print_bad_format_error(ctx, api):
  """An unbalanced brace: ValueError from the format parser."""
  jax.jit(lambda x: api.debug_print("{x", x=x))(X3)


@scenario
def print_two_call_form(ctx, api):
  """The two-call form: options first, then the format and arguments."""
  jax.jit(lambda x: api.debug_print(ordered=True)("{x} {}", x[0], x=x))(X3)


@scenario
def print_two_call_form_option_names_as_fields(ctx, api):
  """In the two-call form, ``ordered=`` of the second call is a field."""
  jax.jit(lambda x: api.debug_print()("{ordered}", ordered=x))(X3)


@scenario
def print_two_call_form_extra_arguments_error(ctx, api):
  """Arguments without a format in the first call: TypeError."""
  api.debug_print(None, 1)


@scenario
def print_key_array(ctx, api):
  """A PRNG key array argument."""
  jax.jit(lambda k: api.debug_print("{}", k))(jax.random.key(42))


@scenario
def print_eager_then_jit_order(ctx, api):
  """An eager print, a jitted one, an eager one: printed in that order
  once each has been waited for."""
  f = jax.jit(lambda x: api.debug_print("jit {}", x))
  api.debug_print("eager {}", 1)
  f(X3)
  ctx.barrier()
  api.debug_print("eager {}", 2)


@scenario
def print_ordered_sequence(ctx, api):
  """Ordered prints in one function, in program order."""

  def f(x):
    for i in range(5):
      api.debug_print("step {i}: {x}", i=i, x=x + i, ordered=True)

  jax.jit(f)(X3)


@scenario
def print_ordered_across_calls(ctx, api):
  """Ordered prints across several calls of a jitted function."""
  f = jax.jit(lambda x: api.debug_print("call {}", x, ordered=True))
  for i in range(4):
    f(np.int32(i))


@scenario
def print_result_unused(ctx, api):
  """A print of a value that nothing else uses still prints under jit."""

  def f(x):
    api.debug_print("dead {}", x * 3)
    return jnp.float32(0)

  return jax.jit(f)(X3)


@scenario
def print_in_jit_traced_once(ctx, api):
  """A jitted function called twice is traced once and prints twice."""
  f = jax.jit(lambda x: api.debug_print("{}", x))
  f(X3)
  f(X3 + 1)


@scenario(
  ours=(
    "hostcb's device does not wait for an unordered debug "
    "print (issue 18: the fast path): a print that fails under "
    "jit does not fail the computation, which JAX's does "
    "(JaxRuntimeError from the call); the exception is logged "
    "where JAX logs it, and, as with JAX, no barrier raises it "
    "(issue 33: docs/jax_callbacks.md)"
  ),
  expect=(
    "log jax._src.debugging ERROR: jax.debug.callback failed "
    "[TypeError: unsupported format string passed to "
    "numpy.ndarray.__format__]\n"
  ),
)
def print_format_spec_on_array_jit(ctx, api):
  """A float spec on a non-scalar array under jit: the callback's
  failure."""
  jax.jit(lambda x: api.debug_print("{:.2f}", x))(X3)


@scenario
def print_scalar_float32_default_format(ctx, api):
  """A float32 scalar in ``{}`` (formatted as a Python float) and in
  ``{!s}`` (NumPy's shortest text)."""
  jax.jit(lambda x: api.debug_print("{} {!s}", x, x))(np.float32(0.1))


@scenario
def print_scalar_extended_floats(ctx, api):
  """bfloat16 and float16 scalars, plain and with a spec."""

  def f(x):
    b, h = x.astype(jnp.bfloat16), x.astype(jnp.float16)
    api.debug_print("{} {:.3f} {} {:.5f}", b, b, h, h)

  jax.jit(f)(np.float32(0.1))


@scenario
def print_scalar_specs_misc(ctx, api):
  """Thousands separators, exponent, percent and bool as int."""

  def f(i, x):
    api.debug_print("{:,} {:.2e} {:.1%} {:d}", i, x, x, i > 0)

  jax.jit(f)(np.int32(1234567), np.float32(0.25))


@scenario
def print_nested_format_spec(ctx, api):
  """A format spec taken from another argument (``{x:{w}}``)."""
  jax.jit(lambda x: api.debug_print("[{x:>{w}}]", x=x, w=9))(np.float32(1.5))


@scenario
def print_under_disable_jit(ctx, api):
  """Inside ``jax.disable_jit()`` a jitted function prints at once."""
  with jax.disable_jit():
    jax.jit(lambda x: api.debug_print("nojit {}", x * 2))(X3)
    ctx.log("after call")


@scenario
def print_aot_compiled(ctx, api):
  """A print in a function compiled ahead of time (lower/compile)."""
  compiled = (
    jax.jit(lambda x: api.debug_print("aot {}", x) or x + 1).lower(X3).compile()
  )
  return compiled(X3)


@scenario
def print_use_logging(ctx, api):
  """``_use_logging=True`` (what ``jax.debug.log`` passes): the text goes
  to JAX's debugging logger at INFO instead of stdout."""
  jax.jit(lambda x: api.debug_print("logged {}", x, _use_logging=True))(X3)


@scenario
def print_format_not_a_string(ctx, api):
  """A format that is not a string."""
  jax.jit(lambda x: api.debug_print(3, x))(X3)


@scenario
def print_repr_of_python_scalar(ctx, api):
  """``{!r}`` of a Python number (a weakly typed array in JAX)."""
  jax.jit(lambda x: api.debug_print("{!r} {!r}", 3, x[0] * 2.0))(X3)


@scenario
def print_container_with_python_scalars(ctx, api):
  """A tuple with Python numbers and a weakly typed value."""
  jax.jit(lambda x: api.debug_print("{}", (3, 1.5, x[0] + 1)))(X3)


@scenario
def print_repr_weak_value_eager(ctx, api):
  """``{!r}`` outside jit, of a Python number and a weak array."""
  api.debug_print("{!r} {!r}", 2, jnp.asarray(1.0) * 2)


@scenario
def print_namedtuple(ctx, api):
  """A NamedTuple prints its fields' reprs."""
  import collections

  Point = collections.namedtuple("Point", ["x", "y"])
  jax.jit(lambda x: api.debug_print("{}", Point(x, 2)))(X3)
