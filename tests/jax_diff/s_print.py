"""Scenarios: what ``jax.debug.print`` prints (format strings, values)."""

import contextlib
import io

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
    "print (jit's fast path): a print that fails under jit cannot fail "
    "the call, which JAX's does (JaxRuntimeError from the call); the "
    "exception is logged where JAX logs it, and the first host read of "
    "a result on its device, or else the first barrier, raises it as "
    "JaxRuntimeError with JAX's words, then hostcb's saying where "
    "(docs/jax_callbacks.md, 'When a callback fails')"
  ),
  expect=(
    "log jax._src.debugging ERROR: jax.debug.callback failed "
    "[TypeError: unsupported format string passed to "
    "numpy.ndarray.__format__]\n"
    "barrier raised JaxRuntimeError: INTERNAL: CpuCallback error calling "
    "callback: Traceback (most recent call last):\n"
    "  <frames>\n"
    "TypeError: unsupported format string passed to "
    "numpy.ndarray.__format__\n"
    "\n"
    "hostcb: raised at the first barrier after the callback failed "
    "(hostcb's device does not wait for jax.debug.callback: the "
    "computation that ran it returned first)\n"
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


# ------------------------------------ the engine's C text of a 0-d number
# A plain `{}`/`{0}` print of one 0-d float, integer or bool has its line
# made in C (src/hostcb/_native/print_line.cc); these compare it with JAX's
# at the values where Python's layout of a number changes.  Ordered: JAX's
# unordered prints of one computation come in XLA's order.

_EDGE_FLOATS = [
  0.0,
  -0.0,
  np.nan,
  -np.nan,
  np.inf,
  -np.inf,
  1.5,
  0.1,
  1 / 3,
  1e16,
  1e17,
  9999999999999998.0,
  1.2345e16,
  123456789.0,
  1e22,
  0.0001,
  0.00001,
  0.00012,
  1e-5,
  2.5e-5,
]
_PLAIN_FORMATS = [
  "{}",
  "x={}",
  "{} units",
  "{0}|{0}",
  "{{{}}}",
  "}}{}{{",
  "[{0}] ({0})",
  "ünï {} çødé → ✓ 😀",
  "a\nb {}\n\nc",
  "\t{}\r",
  "{:}",
  "{0:}",
]


def _edges(dtype) -> np.ndarray:
  """The edge values of a float dtype (its limits and smallest values
  too), or an integer dtype's minimum, maximum and a few others."""
  if np.dtype(dtype).kind == "f":
    info = np.finfo(dtype)
    limits = [
      info.max,
      info.min,
      info.tiny,
      info.smallest_subnormal,
      info.eps,
      -info.smallest_subnormal,
    ]
    with np.errstate(over="ignore"):
      return np.array(_EDGE_FLOATS + [float(v) for v in limits], dtype)
  if dtype == np.bool_:
    return np.array([True, False])
  info = np.iinfo(dtype)
  return np.array([info.min, info.max, 0, 1, info.max // 3], dtype)


def _print_each(api, values: np.ndarray, formats) -> None:
  """Jitted: each value of ``values`` in each of ``formats``, one 0-d
  argument per print, ordered."""

  def f(x):
    for k in range(x.shape[0]):
      for spec in formats:
        api.debug_print(spec, x[k], ordered=True)

  jax.jit(f)(values)


@scenario
def print_scalar_edge_values_of_each_32_bit_dtype(ctx, api):
  """0-d float16, float32, int8..int32, uint8..uint32 and bool values at
  their edges (NaN, -NaN, the infinities, -0.0, the limits, subnormals,
  where Python's repr changes layout: 1e16, 1e17, 0.0001, 0.00001) in
  plain fields, the text of the engine's C formatter."""
  for dtype in (np.float16, np.float32):
    _print_each(api, _edges(dtype), ["{}", "<{0}>"])
  for dtype in (
    np.int8,
    np.int16,
    np.int32,
    np.uint8,
    np.uint16,
    np.uint32,
    np.bool_,
  ):
    _print_each(api, _edges(dtype), ["{}", "<{0}>"])


@scenario
def print_scalar_edge_values_with_x64(ctx, api):
  """Under ``jax.enable_x64(True)``: 0-d float64, int64 and uint64 at
  their edges (int64's minimum, uint64's maximum, float64's limits and
  subnormals), and 32-bit values, in plain fields."""
  with jax.enable_x64(True):
    for dtype in (np.float64, np.int64, np.uint64, np.float32, np.int32):
      _print_each(api, _edges(dtype), ["{}", "<{0}>"])


@scenario
def print_plain_fields_with_text_around(ctx, api):
  """Plain fields (``{}``, ``{0}``, ``{:}``) with text around them:
  escaped braces next to a field, a field repeated, non-ASCII text,
  newlines and tabs in the text, for a float, an int and a bool."""
  for values in (
    np.array([2.5, -0.0], np.float32),
    np.array([-7, 0], np.int32),
    np.array([True, False]),
  ):
    _print_each(api, values, _PLAIN_FORMATS)


@scenario
def print_scalar_under_transforms(ctx, api):
  """0-d values printed under vmap, scan, fori_loop, grad and checkpoint
  (ordered, so that JAX's order is program order)."""

  def body(c, x):
    api.debug_print("c={} x={}", c, x, ordered=True)
    api.debug_print("{}", c, ordered=True)
    return c + x, None

  xs = np.arange(4, dtype=np.float32) / 7
  jax.jit(lambda xs: jax.lax.scan(body, np.float32(0), xs))(xs)
  jax.jit(
    lambda: jax.lax.fori_loop(
      0,
      3,
      lambda i, c: (
        api.debug_print("i={}", i, ordered=True),
        api.debug_print("{0}", c, ordered=True),
        c * 1.5,
      )[-1],
      np.float32(1.1),
    )
  )()
  jax.jit(jax.vmap(lambda x: api.debug_print("v={}", x, ordered=True)))(xs)

  def g(x):
    api.debug_print("x={}", x, ordered=True)
    return jnp.sin(x)

  jax.jit(jax.grad(g))(np.float32(0.3))
  jax.jit(jax.grad(lambda x: jax.checkpoint(g)(x) * 2))(np.float32(0.3))


@scenario
def print_scalar_with_specs_and_conversions(ctx, api):
  """Fields with a spec or conversion (Python formats those): ``{:.3f}``,
  ``{!r}``, ``{0:>8}``, ``{!s}``, ``{x}`` by name, on 0-d values."""

  def f(x, i, b):
    for v in (x, i, b):
      for spec in ("{:.3f}", "{!r}", "{0:>8}", "{!s}", "{0!s:>9}|"):
        api.debug_print(spec, v, ordered=True)
      api.debug_print("{x} and {x}", x=v, ordered=True)

  jax.jit(f)(np.float32(1 / 3), np.int32(-12), np.bool_(True))


@scenario
def print_values_the_c_text_leaves_to_python(ctx, api):
  """Plain fields with values that are not one 0-d float, integer or
  bool: a vector, a pytree, bfloat16 and complex scalars, two arguments."""

  def f(x):
    for v in (
      x,
      (x[0], {"a": x[1]}),
      x[0].astype(jnp.bfloat16),
      (x[0] + 1j).astype(jnp.complex64),
    ):
      api.debug_print("{}", v, ordered=True)
    api.debug_print("{} {}", x[0], x[1], ordered=True)

  jax.jit(f)(np.arange(3, dtype=np.float32) / 3)


@scenario
def print_to_redirected_streams(ctx, api):
  """Lines of plain prints in a loop (ordered: JAX's unordered prints of
  one step come in XLA's order), to a ``contextlib.redirect_stdout`` of
  an ``io.StringIO``, of a ``TextIOWrapper`` over a ``BytesIO`` and of an
  object whose ``write`` records each call (one call per line)."""

  class Recording:
    def __init__(self):
      self.writes = []

    def write(self, text):
      self.writes.append(text)
      return len(text)

  def body(c, i):
    api.debug_print("a={}", i, ordered=True)
    api.debug_print("b={}", c, ordered=True)
    return c + i, None

  f = jax.jit(lambda x: jax.lax.scan(body, x, jnp.arange(30.0))[0])
  text = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
  recording = Recording()
  strings = io.StringIO()
  for stream in (strings, text, recording):
    with contextlib.redirect_stdout(stream):
      f(np.float32(0.5))
      ctx.barrier()
  text.flush()
  ctx.log(repr(strings.getvalue()))
  ctx.log(repr(text.buffer.getvalue().decode()))
  ctx.log(repr(recording.writes))


@scenario
def print_argument_that_is_not_a_jax_value_error(ctx, api):
  """An argument that JAX takes for an array but cannot stage (a NumPy
  ``datetime64``): JAX's TypeError, which names ``debug_print``."""
  jax.jit(lambda x: api.debug_print("{} {}", np.datetime64("2020-01-01"), x))(
    X3
  )


@scenario
def print_argument_that_is_not_a_jax_value_error_eager(ctx, api):
  """The same outside jit: JAX's TypeError naming ``debug_print``."""
  api.debug_print("{}", np.longdouble(0.5))


@scenario
def print_explicit_64_bit_value_without_x64_eager(ctx, api):
  """With ``jax_explicit_x64_dtypes="allow"`` and x64 off, a float64 and
  an int64 array made explicitly, printed outside jit: their values as
  computed, 64-bit."""
  before = jax.config.jax_explicit_x64_dtypes
  jax.config.update("jax_explicit_x64_dtypes", "allow")
  try:
    y = jnp.asarray(np.float32(0.1)).astype(jnp.float64) / 3
    n = jnp.asarray(2**20, jnp.int64) * jnp.asarray(2**20, jnp.int64)
    api.debug_print("{} {} {} {}", y, y.dtype, n, n.dtype)
  finally:
    jax.config.update("jax_explicit_x64_dtypes", before)


@scenario(
  ours=(
    "with x64 off, JAX's staged print of a 64-bit value made "
    "explicitly (jax_explicit_x64_dtypes='allow') shows it narrowed to "
    "32 bits (2**40 as 0, a float64 rounded to float32): values the "
    "program did not compute, which a hostcb tap never shows; hostcb "
    "prints the 64-bit values as computed, as JAX's eager print does "
    "(docs/jax_callbacks.md)"
  ),
  expect="0.033333333830038704 [0.03333333] 1099511627776 int64\n",
)
def print_explicit_64_bit_value_without_x64_jit(ctx, api):
  """The same under jit: a 0-d float64, a float64[1] and a 0-d int64."""
  before = jax.config.jax_explicit_x64_dtypes
  jax.config.update("jax_explicit_x64_dtypes", "allow")
  try:

    def f(x):
      y = x.astype(jnp.float64) / 3
      n = x.astype(jnp.int64) * 0 + jnp.asarray(2**20, jnp.int64) ** 2
      api.debug_print("{} {} {} {}", y, y[None], n, n.dtype)

    jax.jit(f)(np.float32(0.1))
  finally:
    jax.config.update("jax_explicit_x64_dtypes", before)


class _Shouting(str):
  """A format string whose own ``format`` changes the text."""

  def format(self, *args, **kwargs):
    return "LOUD " + str.format(self, *args, **kwargs).upper()


class _Tag(str):
  """A string argument with its own ``__format__``."""

  def __format__(self, spec):
    return f"<tag {str(self)}>"


@scenario
def print_format_of_a_str_subclass(ctx, api):
  """A format that is a ``str`` subclass with its own ``format``: JAX
  calls that ``format`` (for a 0-d number in plain fields, a vector, and
  outside jit)."""
  jax.jit(lambda x: api.debug_print(_Shouting("x={}"), x[0], ordered=True))(X3)
  jax.jit(lambda x: api.debug_print(_Shouting("v={0}"), x, ordered=True))(X3)
  api.debug_print(_Shouting("e={}"), jnp.float32(np.inf))


@scenario
def print_string_arguments_of_str_subclasses(ctx, api):
  """Host-side string arguments of ``str`` subclasses (a NumPy ``str_``,
  one with its own ``__format__``) keep their type: their ``repr`` and
  ``format`` are theirs."""
  jax.jit(
    lambda x: api.debug_print(
      "{} {!r} {} {!r} {}", np.str_("s"), np.str_("s"), _Tag("t"), _Tag("t"), x
    )
  )(np.float32(1))


@scenario
def print_to_a_redirected_stdout_left_without_a_barrier(ctx, api):
  """A jitted function that prints, called inside
  ``contextlib.redirect_stdout(io.StringIO())`` whose block ends without
  a barrier: its lines are in the redirected stream (JAX's computation
  printed while the caller waited), none in the stream before it; a
  print dispatched before the block goes to the stream before it."""

  def body(c, i):
    api.debug_print("{}", i)
    return c + i, None

  f = jax.jit(lambda x: jax.lax.scan(body, x, jnp.arange(300))[0])
  g = jax.jit(lambda x: api.debug_print("before the block {}", x))
  f(0)
  g(0)
  ctx.barrier()
  g(1)
  for _ in range(3):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
      f(0)
    ctx.log(sorted(int(n) for n in buf.getvalue().split()) == list(range(300)))
  ctx.barrier()


def _python_lines_of_64_bit_edges() -> str:
  """What Python's ``"{}".format`` gives for each value that
  :func:`print_explicit_64_bit_scalar_edges_without_x64` prints."""
  lines = [
    f"{v}"
    for dtype in (np.float64, np.int64, np.uint64)
    for v in _normal_edges(dtype).tolist()
  ]
  return "".join(line + "\n" for line in lines)


def _normal_edges(dtype) -> np.ndarray:
  """:func:`_edges` without subnormal values (XLA's CPU code flushes
  them to zero when it moves them)."""
  v = _edges(dtype)
  if v.dtype.kind != "f":
    return v
  return v[~((v != 0) & (np.abs(v) < np.finfo(dtype).tiny))]


@scenario(
  ours=(
    "with x64 off, JAX's staged print of 64-bit values made explicitly "
    "shows them narrowed to 32 bits, values the program did not compute "
    "(print_explicit_64_bit_value_without_x64_jit); hostcb prints each "
    "0-d float64, int64 and uint64 as Python formats it, its line made by "
    "the engine's C text"
  ),
  expect=_python_lines_of_64_bit_edges(),
)
def print_explicit_64_bit_scalar_edges_without_x64(ctx, api):
  """0-d float64, int64 and uint64 values at their edges (int64's
  minimum, uint64's maximum, float64's limits), one per
  plain print, made with ``jax_explicit_x64_dtypes="allow"`` and x64 off:
  the engine's C text of 64-bit numbers in a real tap."""
  before = jax.config.jax_explicit_x64_dtypes
  jax.config.update("jax_explicit_x64_dtypes", "allow")
  try:
    for dtype in (np.float64, np.int64, np.uint64):
      # The values as 64-bit integers' bits (an argument would be narrowed).
      bits = _normal_edges(dtype).view(np.uint32).reshape(-1, 2)
      f = jax.jit(
        lambda b, dtype=dtype: (
          [
            api.debug_print(
              "{}", jax.lax.bitcast_convert_type(b[k], dtype), ordered=True
            )
            for k in range(b.shape[0])
          ]
          and None
        )
      )
      f(bits)
  finally:
    jax.config.update("jax_explicit_x64_dtypes", before)


class _Refusing:
  """A stream whose ``write`` raises."""

  def write(self, text):
    raise OSError(f"refused {text!r}")


@scenario
def print_to_a_stream_whose_write_raises(ctx, api):
  """``sys.stdout`` a stream whose ``write`` raises: a 0-d number's line
  (the engine's C text) and a vector's, under jit, then one outside jit
  (whose exception reaches the caller)."""
  f = jax.jit(lambda x: api.debug_print("x={}", x))
  g = jax.jit(lambda x: api.debug_print("v={}", x))
  f(np.float32(0))  # compiled while sys.stdout works
  g(X3)
  ctx.barrier()
  with contextlib.redirect_stdout(_Refusing()):
    for call in (lambda: f(np.float32(1.5)), lambda: g(X3)):
      try:
        call()
        jax.effects_barrier()
      except Exception as e:  # noqa: BLE001  (JAX's: the output shows it)
        ctx.log("jit raised", type(e).__name__)
    try:
      api.debug_print("eager={}", jnp.float32(2.5))
    except OSError as e:
      ctx.log("eager raised OSError:", e)
