"""The engine's C text of a ``debug.print`` line (``print_line_text``,
src/hostcb/_native/print_line.cc): for a 0-d float, integer or bool in
plain ``{}`` fields, exactly what Python's ``str.format`` gives for the
0-d array (what JAX's own ``debug.print`` and hostcb's Python path print),
and None for every value it leaves to Python."""

from __future__ import annotations

import io
import logging
import sys
import sysconfig
import threading
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import _native_bench
import hostcb
from hostcb import debug as hdebug
from hostcb import _engine as engine
from hostcb._engine import entries, host_functions

pytestmark = pytest.mark.skipif(
  not engine.available() or not engine.native.formats_print_lines(),
  reason="needs the native engine with print_line_text (not built here)",
)


def _text(pieces: tuple[bytes, ...], value) -> str | None:
  return engine.native.module().print_line_text(pieces, value)


def _python(fmt: str, value) -> str:
  return fmt.format(value) + "\n"


def _check_all(values: np.ndarray) -> None:
  """Each 0-d value of ``values`` gives Python's text of it."""
  wrong = []
  for v in values:
    a = np.array(v)
    got = _text((b"", b""), a)
    if got != _python("{}", a):
      wrong.append((repr(v), got, _python("{}", a)))
  assert wrong[:5] == []


def test_every_float16_is_formatted_as_python_formats_it():
  _check_all(np.arange(1 << 16, dtype=np.uint16).view(np.float16))


def test_a_sample_of_float32_bit_patterns_is_formatted_as_python_formats_it():
  rng = np.random.default_rng(0)
  bits = rng.integers(0, 1 << 32, size=100_000, dtype=np.uint64)
  _check_all(bits.astype(np.uint32).view(np.float32))


def test_a_sample_of_float64_bit_patterns_is_formatted_as_python_formats_it():
  rng = np.random.default_rng(1)
  bits = rng.integers(0, np.iinfo(np.uint64).max, size=100_000, dtype=np.uint64)
  _check_all(bits.view(np.float64))


def test_floats_where_pythons_layout_changes_are_formatted_as_python():
  # Powers of ten and their neighbours: the switch between positional
  # (1e-4 <= |x| < 1e16) and scientific text, ".0" after integers.
  values = []
  for e in range(-30, 31):
    x = 10.0**e
    values += [x, np.nextafter(x, 0), np.nextafter(x, np.inf), 1.5 * x, -x]
  _check_all(np.array(values, np.float64))
  _check_all(np.array(values, np.float32))


def test_the_limits_and_special_floats_are_formatted_as_python():
  for t in (np.float16, np.float32, np.float64):
    info = np.finfo(t)
    special = [
      0.0,
      -0.0,
      np.inf,
      -np.inf,
      np.nan,
      -np.nan,
      info.max,
      -info.max,
      info.tiny,
      info.smallest_subnormal,
      -info.smallest_subnormal,
      info.eps,
      1.0,
      2.0**24,
      2.0**53,
    ]
    with np.errstate(over="ignore"):  # 2**24 and 2**53 are inf in float16
      _check_all(np.array(special, t))


@pytest.mark.parametrize(
  "dtype",
  [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32]
  + [np.uint64, np.intc, np.uintc, np.longlong, np.ulonglong],
)
def test_integers_are_formatted_as_python_formats_them(dtype):
  info = np.iinfo(dtype)
  rng = np.random.default_rng(2)
  sample = rng.integers(info.min, info.max, size=1000, dtype=dtype)
  _check_all(np.array([info.min, info.max, 0, 1, *sample], dtype))


def test_bools_are_formatted_as_true_and_false():
  assert _text((b"", b""), np.array(True)) == "True\n"
  assert _text((b"", b""), np.array(False)) == "False\n"


def test_the_pieces_surround_each_field_with_the_value():
  pieces = hdebug._line_pieces("a={0}, again {0} {{literal}} é")
  assert pieces == (b"a=", b", again ", " {literal} é".encode())
  assert _text(pieces, np.array(2.5, np.float32)) == (
    "a=2.5, again 2.5 {literal} é\n"
  )


@pytest.mark.parametrize(
  "value",
  [
    np.array([1.0, 2.0], np.float32),  # not 0-d
    np.array(1.0, ml_dtypes.bfloat16),
    np.array(1 + 2j, np.complex64),
    np.array(1.0, np.longdouble),
    np.array("text"),
    np.array(1.0, np.dtype(np.float32).newbyteorder()),  # not native order
    1.0,  # not an array
  ],
  ids=repr,
)
def test_values_left_to_python_give_none(value):
  assert _text((b"", b""), value) is None


def test_pieces_that_are_not_bytes_are_refused():
  with pytest.raises(TypeError, match="UTF-8 bytes"):
    _text(("x=", ""), np.array(1.0))
  with pytest.raises(TypeError, match="at least two bytes"):
    _text((b"",), np.array(1.0))


@pytest.mark.parametrize(
  "fmt",
  [
    "{:.3f}",
    "{!r}",
    "{!s}",
    "{0.real}",
    "{0[0]}",
    "{x}",
    "no field",
    "{",
    "\ud800{}",
  ],
)
def test_formats_other_than_plain_fields_have_no_pieces(fmt):
  assert hdebug._line_pieces(fmt) is None


def _c_entries(first_piece: bytes) -> list:
  """The registered tap entries that make their line in C and start it
  with ``first_piece``."""
  return [
    e
    for e in host_functions.tap_functions
    if type(e) is entries.PrintLineTap and e.pieces[0] == first_piece
  ]


def test_a_plain_print_of_a_scalar_gets_the_c_entry(capsys):
  jax.jit(lambda x: hostcb.debug.print("plain c entry={}", x))(1.5)
  jax.effects_barrier()
  assert len(_c_entries(b"plain c entry=")) == 1
  assert capsys.readouterr().out == "plain c entry=1.5\n"


def test_a_print_with_a_spec_keeps_the_python_entry(capsys):
  jax.jit(lambda x: hostcb.debug.print("spec python entry={:.2f}", x))(1.5)
  jax.effects_barrier()
  assert _c_entries(b"spec python entry=") == []
  assert capsys.readouterr().out == "spec python entry=1.50\n"


@pytest.mark.parametrize(
  "value",
  [
    jnp.float32(0.1),
    jnp.float16(-3.25),
    jnp.int32(-7),
    jnp.uint8(200),
    jnp.bool_(True),
    jnp.bfloat16(0.1),  # Python's path
    jnp.arange(3.0),  # Python's path
  ],
  ids=repr,
)
def test_printed_lines_are_those_of_the_python_path(value, capsys):
  fmt = "v={0} and {0}"
  jax.jit(lambda x: hostcb.debug.print(fmt, x))(value)
  jax.effects_barrier()
  assert capsys.readouterr().out == fmt.format(np.asarray(value)) + "\n"


def test_a_scalar_print_never_changes_a_value():
  def f(x):
    hostcb.debug.print("{}", x)
    return x * 3

  x = jnp.float32(1.25)
  assert jax.jit(f)(x) == jax.jit(lambda x: x * 3)(x)


def test_lines_of_a_loop_arrive_in_order(capsys):
  def f(x):
    def body(c, i):
      hostcb.debug.print("{}", i)
      return c + i, None

    return jax.lax.scan(body, x, jnp.arange(100))[0]

  assert int(jax.jit(f)(0)) == 4950
  jax.effects_barrier()
  assert capsys.readouterr().out == "".join(f"{i}\n" for i in range(100))


def test_lines_go_to_the_stream_that_is_sys_stdout_when_they_print(monkeypatch):
  f = jax.jit(lambda x: hostcb.debug.print("{}", x))
  first, second = io.StringIO(), io.StringIO()
  monkeypatch.setattr(sys, "stdout", first)
  f(1)
  jax.effects_barrier()
  monkeypatch.setattr(sys, "stdout", second)
  f(2)
  jax.effects_barrier()
  assert (first.getvalue(), second.getvalue()) == ("1\n", "2\n")


def test_a_stream_that_fails_is_logged_as_a_failed_print(monkeypatch, caplog):
  class Broken:
    def write(self, text):
      raise OSError("stream closed")

  caplog.set_level(logging.ERROR)
  f = jax.jit(lambda x: hostcb.debug.print("{}", x))
  f(1.0)  # compiled while sys.stdout works
  jax.effects_barrier()
  monkeypatch.setattr(sys, "stdout", Broken())
  f(2.0)
  with pytest.raises(
    jax.errors.JaxRuntimeError, match="OSError: stream closed"
  ):
    jax.effects_barrier()  # as JAX raises it (at the call, there)
  assert [
    str(r.exc_info[1]) for r in caplog.records if r.name == "jax._src.debugging"
  ] == ["stream closed"]


def _loop_of_prints(n: int):
  """A jitted loop of ``n`` steps that prints two lines per step."""

  def f(x):
    def body(c, i):
      hostcb.debug.print("a={}", i)
      hostcb.debug.print("b={}", i * 2)
      return c + i, None

    return jax.lax.scan(body, x, jnp.arange(n))[0]

  return jax.jit(f)


def _lines(n: int) -> list[str]:
  return [line for i in range(n) for line in (f"a={i}\n", f"b={2 * i}\n")]


def test_a_stream_with_a_write_of_its_own_gets_one_write_per_line(monkeypatch):
  class Recording:
    def __init__(self):
      self.writes = []

    def write(self, text):
      self.writes.append(text)
      return len(text)

  stream = Recording()
  monkeypatch.setattr(sys, "stdout", stream)
  assert int(_loop_of_prints(300)(0)) == 44850
  jax.effects_barrier()
  assert stream.writes == _lines(300)


def test_a_string_stream_gets_every_line_in_order(monkeypatch):
  stream = io.StringIO()
  monkeypatch.setattr(sys, "stdout", stream)
  _loop_of_prints(300)(0)
  jax.effects_barrier()
  assert stream.getvalue() == "".join(_lines(300))


def test_a_file_gets_every_line_in_order(monkeypatch, tmp_path):
  with open(tmp_path / "out.txt", "w") as stream:
    monkeypatch.setattr(sys, "stdout", stream)
    _loop_of_prints(300)(0)
    jax.effects_barrier()
  assert (tmp_path / "out.txt").read_text() == "".join(_lines(300))


def test_lines_keep_their_place_between_other_taps_output(capsys):
  def f(x):
    def body(c, i):
      hostcb.debug.print("print {}", i)
      hostcb.id_tap(lambda a, t: print(f"tap {a}"), i)
      return c, None

    return jax.lax.scan(body, x, jnp.arange(50))[0]

  jax.jit(f)(0)
  jax.effects_barrier()
  assert capsys.readouterr().out == "".join(
    f"print {i}\ntap {i}\n" for i in range(50)
  )


def test_each_line_a_closed_stream_refuses_is_logged(monkeypatch, caplog):
  caplog.set_level(logging.ERROR)
  f = _loop_of_prints(3)
  f(0)  # compiled while sys.stdout works
  jax.effects_barrier()
  closed = io.StringIO()
  closed.close()
  monkeypatch.setattr(sys, "stdout", closed)
  f(0)
  with pytest.raises(jax.errors.JaxRuntimeError, match="closed file"):
    jax.effects_barrier()  # the first failure, as JAX raises it
  assert [
    str(r.exc_info[1]) for r in caplog.records if r.name == "jax._src.debugging"
  ] == ["I/O operation on closed file"] * 6


def test_formats_python_fails_on_still_fail_as_in_python(capsys, caplog):
  # skip_format_check lets through a format that needs two arguments.
  caplog.set_level(logging.ERROR)
  jax.jit(lambda x: hostcb.debug.print("{}{}", x, skip_format_check=True))(1.5)
  with pytest.raises(jax.errors.JaxRuntimeError, match="IndexError"):
    jax.effects_barrier()  # as JAX raises it (at the call, there)
  assert capsys.readouterr().out == ""
  assert [
    type(r.exc_info[1])
    for r in caplog.records
    if r.name == "jax._src.debugging"
  ] == [IndexError]


def test_a_write_patched_on_the_stream_gets_one_call_per_line(monkeypatch):
  stream = io.StringIO()
  writes = []
  stream.write = lambda text: writes.append(text) or len(text)
  monkeypatch.setattr(sys, "stdout", stream)
  _loop_of_prints(100)(0)
  jax.effects_barrier()
  assert writes == _lines(100)


def _replace_entry(first_piece: bytes, **parts):
  """Replaces the C entry of the print whose line starts with
  ``first_piece`` by one with ``parts`` (write_lines, fallback) changed."""
  (entry,) = _c_entries(first_piece)
  tid = host_functions.tap_functions.index(entry)
  host_functions.tap_functions[tid] = entry._replace(**parts)


def test_a_scalars_line_is_made_without_the_python_entry(capsys):
  f = jax.jit(lambda x: hostcb.debug.print("made in c={}", x))
  f(1.0)
  jax.effects_barrier()
  formatted_in_python = []
  _replace_entry(
    b"made in c=",
    fallback=entries.ArrayTap(
      lambda arg, transforms: formatted_in_python.append(arg), ()
    ),
  )
  for v in (2.0, 3.0):
    f(v)
  jax.effects_barrier()
  assert formatted_in_python == []
  assert (
    capsys.readouterr().out == "made in c=1.0\nmade in c=2.0\nmade in c=3.0\n"
  )


def test_lines_a_consumer_takes_together_reach_write_lines_together():
  # The consumer waits in a tap function until all 200 prints behind it
  # are queued, so that its next takes hold many of them.
  queued = threading.Event()

  def wait_for_the_prints(a, transforms):
    assert queued.wait(timeout=30)

  def f(x):
    hostcb.id_tap(wait_for_the_prints, x)

    def body(c, i):
      hostcb.debug.print("together {}", i)
      return c, None

    return jax.lax.scan(body, x, jnp.arange(200))[0]

  g = jax.jit(f)
  queued.set()
  g(0)
  jax.effects_barrier()
  calls = []
  _replace_entry(b"together ", write_lines=calls.append)
  queued.clear()
  before = engine.counters(0)["records_in"]
  g(0)
  deadline = time.monotonic() + 30
  while engine.counters(0)["records_in"] < before + 201:
    assert time.monotonic() < deadline, "the prints were not queued"
    time.sleep(0.001)
  queued.set()
  jax.effects_barrier()
  assert [line for lines in calls for line in lines] == [
    f"together {i}\n" for i in range(200)
  ]
  assert max(len(lines) for lines in calls) > 1


def test_without_the_c_formatting_prints_take_the_python_entry(
  monkeypatch, capsys
):
  # An engine built without it (a C++ library with no floating-point
  # std::to_chars) says so, and every line is formatted in Python.
  monkeypatch.setattr(engine.native, "formats_print_lines", lambda: False)
  jax.jit(lambda x: hostcb.debug.print("no c entry={}", x))(0.5)
  jax.effects_barrier()
  assert _c_entries(b"no c entry=") == []
  assert capsys.readouterr().out == "no c entry=0.5\n"


@pytest.fixture(scope="module")
def check_program(tmp_path_factory):
  """tests/native/print_line_check.cc, built against this Python (which it
  embeds, for CPython's repr) and NumPy."""
  if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
    pytest.skip("needs a Python built with --enable-shared (libpython)")
  libdir = sysconfig.get_config_var("LIBDIR")
  version = sysconfig.get_config_var("LDVERSION") or sysconfig.get_config_var(
    "VERSION"
  )
  return _native_bench.build(
    tmp_path_factory,
    "print_line_check",
    [],
    [f"-L{libdir}", f"-lpython{version}", f"-Wl,-rpath,{libdir}"],
    flags=(
      "-O2",
      "-I",
      sysconfig.get_paths()["include"],
      "-I",
      np.get_include(),
    ),
  )


@pytest.mark.parametrize(
  "kind, n", [("f32", "4093"), ("f64", "1000000")], ids=["f32", "f64"]
)
def test_the_engines_float_text_is_cpythons_repr(check_program, kind, n):
  # Every 4093rd float32 bit pattern (about a million) and a million
  # doubles; `print_line_check f32 1` compares all 2^32 float32 values
  # (about half an hour).
  got = _native_bench.run(check_program, kind, n, timeout=300)
  if got.get("unsupported"):
    pytest.skip("needs a C++ library with floating-point std::to_chars")
  assert got["mismatches"] == 0
  assert got["checked"] == (-(-(1 << 32) // 4093) if kind == "f32" else 1e6)


# ------------------------------------- a stream that cannot encode a line
def _ascii_stdout(monkeypatch) -> io.TextIOWrapper:
  """``sys.stdout``: a text stream over bytes whose encoding (ASCII) has no
  ``é``, as a file or terminal opened with such an encoding."""
  stream = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
  monkeypatch.setattr(sys, "stdout", stream)
  return stream


def _written(stream: io.TextIOWrapper) -> str:
  stream.flush()
  return stream.buffer.getvalue().decode("ascii")


def _failed_lines(caplog) -> list[str]:
  """The line of each failed print logged on JAX's logger."""
  return [
    r.exc_info[1].object
    for r in caplog.records
    if r.name == "jax._src.debugging"
    and isinstance(r.exc_info[1], UnicodeEncodeError)
  ]


_ENCODABLE_OR_NOT = [("a={}", 1), ("é={}", 2), ("c={}", 3)]


def test_jaxs_print_fails_only_the_line_a_stream_cannot_encode(
  monkeypatch, caplog
):
  # The oracle: JAX writes each print's line by itself.
  caplog.set_level(logging.ERROR)
  stream = _ascii_stdout(monkeypatch)
  for fmt, value in _ENCODABLE_OR_NOT:
    f = jax.jit(lambda x, fmt=fmt: jax.debug.print(fmt, x))
    if fmt.isascii():
      f(value)
    else:
      with pytest.raises(jax.errors.JaxRuntimeError, match="UnicodeEncode"):
        f(value)
  jax.effects_barrier()
  assert _written(stream) == "a=1\nc=3\n"
  assert _failed_lines(caplog) == ["é=2\n"]


def test_lines_written_together_fail_only_where_the_stream_cannot_encode(
  monkeypatch, caplog
):
  caplog.set_level(logging.ERROR)
  stream = _ascii_stdout(monkeypatch)
  hdebug._write_lines([fmt.format(v) + "\n" for fmt, v in _ENCODABLE_OR_NOT])
  assert _written(stream) == "a=1\nc=3\n"
  assert _failed_lines(caplog) == ["é=2\n"]


def test_prints_a_consumer_takes_together_fail_only_where_not_encodable(
  monkeypatch, caplog
):
  # As test_lines_a_consumer_takes_together_reach_write_lines_together:
  # the consumer waits in a tap function until the prints behind it are
  # queued, so that it takes them in one batch.
  caplog.set_level(logging.ERROR)
  queued = threading.Event()

  def wait_for_the_prints(a, transforms):
    assert queued.wait(timeout=30)

  def f(x):
    hostcb.id_tap(wait_for_the_prints, x)
    for fmt, value in _ENCODABLE_OR_NOT:
      hostcb.debug.print("encodable " + fmt, x + value, ordered=True)

  g = jax.jit(f)
  queued.set()
  g(0)
  jax.effects_barrier()
  calls = []
  (entry,) = _c_entries(b"encodable a=")
  write_lines = entry[0]

  def counting(lines):  # one writer for the three: they go together
    calls.append(len(lines))
    write_lines(lines)

  for fmt, _ in _ENCODABLE_OR_NOT:
    _replace_entry(
      ("encodable " + fmt.split("{")[0]).encode(), write_lines=counting
    )
  stream = _ascii_stdout(monkeypatch)
  caplog.clear()
  queued.clear()
  before = engine.counters(0)["records_in"]
  g(0)
  deadline = time.monotonic() + 30
  while engine.counters(0)["records_in"] < before + 4:
    assert time.monotonic() < deadline, "the prints were not queued"
    time.sleep(0.001)
  queued.set()
  with pytest.raises(jax.errors.JaxRuntimeError, match="UnicodeEncodeError"):
    jax.effects_barrier()  # the line that failed, as JAX raises it
  assert calls == [3]  # the three lines, together
  assert _written(stream) == "encodable a=1\nencodable c=3\n"
  assert _failed_lines(caplog) == ["encodable é=2\n"]


# ------------------------------------------------------ pytest's capture
def _edge_prints(print_fn):
  """A jitted loop of plain prints (ordered, so that JAX's come in program
  order) of 0-d values where Python's layout of a number changes."""
  values = np.array(
    [-0.0, np.nan, np.inf, -np.inf, 1e16, 1e17, 1e-4, 1e-5, 1 / 3, 65504],
    np.float32,
  )

  def f(xs):
    def body(c, x):
      print_fn("x={} é {{}}", x, ordered=True)
      print_fn("{0}|{0}", x.astype(jnp.float16), ordered=True)
      print_fn("{}", (x * 1000).astype(jnp.int16), ordered=True)
      print_fn("{}", x > 0, ordered=True)
      return c, None

    return jax.lax.scan(body, 0, xs)[0]

  with np.errstate(invalid="ignore"):
    jax.jit(f)(values)
  jax.effects_barrier()


@pytest.mark.parametrize("capture", ["capsys", "capfd"])
def test_pytests_capture_gets_the_lines_of_jaxs_print(capture, request):
  cap = request.getfixturevalue(capture)
  cap.readouterr()
  _edge_prints(jax.debug.print)
  theirs = cap.readouterr().out
  _edge_prints(hostcb.debug.print)
  assert cap.readouterr().out == theirs
  assert theirs.splitlines()[:4] == ["x=-0.0 é {}", "-0.0|-0.0", "0", "False"]
