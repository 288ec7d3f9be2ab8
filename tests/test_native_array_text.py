"""The native engine's text of arrays (src/hostcb/_native/array_text.cc):
``numpy.array2string``'s, byte for byte, under NumPy's default options.

Differential: random and edge arrays of float32, float64, the integer types
and bool, of every rank up to 3, are formatted by the engine
(``array_text(array, flags, threshold)``) and by NumPy 2 here and NumPy
1.26 in .venv-legacy (the extension loaded there by path); where the
engine gives a text it must be NumPy's.  Then the lines that ``id_print``
and ``debug.print`` make with it on the engine's consumer.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcb
from _helpers import Stream
from _random_arrays import random_arrays as _random_arrays
from hostcb import _engine as engine
from hostcb._core import array_text
from hostcb._engine.entries import PrintLineTap
from hostcb.host_callback import _Printer

pytestmark = pytest.mark.skipif(
  not array_text.formats_natively(),
  reason="needs the native engine with array_text (not built here)",
)

_SEED = 20261129


def _text(a, threshold=1000):
  return engine.native.module().array_text(
    a, array_text.NATIVE_FLAGS, threshold
  )


def _differ(arrays, threshold=1000) -> tuple[list, int]:
  """The arrays whose engine text is not array2string's, and how many had
  an engine text."""
  bad, made = [], 0
  for a in arrays:
    text = _text(a, threshold)
    if text is None:
      continue
    made += 1
    expected = np.array2string(a, threshold=threshold)
    if text != expected:
      bad.append((a.dtype, a.tolist(), text, expected))
  return bad, made


def test_random_arrays_as_numpy_prints_them():
  arrays = _random_arrays(np.random.default_rng(_SEED), 4000)
  bad, made = _differ(arrays)
  assert bad == []
  assert made > 0.97 * len(arrays)  # the rest: on a rounding boundary


@pytest.mark.parametrize(
  "a",
  [
    np.array([1.0, 2.5, -0.0], np.float32),
    np.array([1e-5, 1.0, np.nan, -np.inf]),
    np.array([np.nan, np.inf]),
    np.array([-np.inf]),
    np.array([0.1, 1000.5, 123456.7]),
    np.array([1.0, 1000.0]),  # the ratio at 1000: positional
    np.array([1.0, 1000.0001]),  # past it: scientific
    np.array(np.float32(1e-4)),  # compared with 0.0001 in its dtype or not
    np.array([np.float32(1e-4), 1.0], np.float32),
    np.array([999999.9, 1e6], np.float32),  # float32's cut-off (NumPy 2.3)
    np.array([99999999.0, 1e8]),
    np.array(np.finfo(np.float64).smallest_subnormal),
    np.array([np.finfo(np.float32).max, 1.0], np.float32),
    np.array(0.001953125),  # a tie at the 9th digit: to the even one
    np.array(1000000005.0),  # a tie at the 9th significant digit
    np.array([1e-300, 1e300]),  # three-digit exponents
    np.array([0.3, 1e-5]),  # padded with the exact digits, not zeros
    np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7,
    np.arange(60).reshape(3, 20),
    np.linspace(-3, 7, 40),  # wraps at 75 columns
    np.zeros((2, 0)),
    np.zeros((0,), np.int8),
    np.eye(3, dtype=bool),
    np.array(True),
    np.array([np.iinfo(np.int64).min, 0, np.iinfo(np.int64).max]),
    np.array(np.iinfo(np.uint64).max, np.uint64),
  ],
  ids=lambda a: f"{a.dtype}{list(a.shape)}",
)
def test_edge_arrays_as_numpy_prints_them(a):
  assert _text(a) == np.array2string(a)


def test_rows_at_the_75_column_wrap():
  arrays = [np.zeros(n, np.int8) for n in (36, 37, 38)]
  arrays += [np.full(n, -7, np.int32) for n in (24, 25)]
  arrays += [np.full(n, 0.5) for n in (18, 19, 20)]
  arrays += [np.full((2, n), 1.5, np.float32) for n in (17, 18, 19)]
  assert _differ(arrays) == ([], len(arrays))


def test_arrays_over_the_threshold_are_left_to_numpy():
  a = np.arange(1001)
  assert _text(a) is None  # NumPy summarizes it
  assert _text(a, 1001) == np.array2string(a, threshold=1001)
  assert _text(np.arange(6), 5) is None
  assert _text(np.zeros(0), -1) == "[]"


def test_values_on_a_rounding_boundary_are_left_to_numpy():
  """float32 64311768: its shortest digits, 6431177e1, lie halfway to the
  next float32; NumPy's two texts of it differ (64311770. and 64311768.)."""
  a = np.array([np.float32(64311768.0)])
  assert _text(a) is None
  assert _text(np.array([1.0, 64311768.0], np.float32)) is None


@pytest.mark.parametrize(
  "a",
  [
    np.array(1.5, np.float16),
    np.array(1.5, np.longdouble),
    np.array([1 + 2j], np.complex64),
    np.array(["x"]),
    np.arange(6.0)[::2],  # not contiguous
    np.arange(3.0).astype(">f8"),  # big-endian
  ],
  ids=lambda a: f"{a.dtype}{list(a.shape)}",
)
def test_other_arrays_are_left_to_numpy(a):
  assert _text(a) is None


_LEGACY_PYTHON = (
  pathlib.Path(__file__).resolve().parent.parent / ".venv-legacy/bin/python"
)
# The legacy venv's Python ("3.11"): it loads this interpreter's engine,
# which only a Python of the same version can.
_LEGACY_VERSION = next(
  (
    d.name.removeprefix("python")
    for d in (_LEGACY_PYTHON.parent.parent / "lib").glob("python3.*")
  ),
  None,
)
_THIS_VERSION = "%d.%d" % sys.version_info[:2]

_LEGACY_SCRIPT = """
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("hostcb._native._engine", sys.argv[1])
engine = importlib.util.module_from_spec(spec)
spec.loader.exec_module(engine)
spec = importlib.util.spec_from_file_location("t", sys.argv[2])
t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(t)
bad, made = [], 0
arrays = t.random_arrays(np.random.default_rng(int(sys.argv[3])), 4000)
for a in arrays:
  text = engine.array_text(a, 0, 1000)
  if text is not None:
    made += 1
    if text != np.array2string(a):
      bad.append((str(a.dtype), a.tolist(), text, np.array2string(a)))
print(np.__version__, made > 0.97 * len(arrays), bad[:3])
"""


@pytest.mark.skipif(
  not _LEGACY_PYTHON.exists(),
  reason="no .venv-legacy (NumPy 1.26): make .venv-legacy",
)
@pytest.mark.skipif(
  _LEGACY_PYTHON.exists() and _LEGACY_VERSION != _THIS_VERSION,
  reason=f"the engine here is built for Python {_THIS_VERSION} and "
  f".venv-legacy (NumPy 1.26) runs Python {_LEGACY_VERSION}: the check "
  "loads one into the other (make test runs it, on Python 3.11)",
)
def test_numpy_1_prints_the_same():
  """hostcb allows NumPy 1.26 (pyproject): the engine's text is its text
  too (flags 0: NumPy 1's comparisons and cut-off)."""
  done = subprocess.run(
    [
      str(_LEGACY_PYTHON),
      "-c",
      _LEGACY_SCRIPT,
      engine.native.module().__file__,
      str(pathlib.Path(__file__).parent / "_random_arrays.py"),
      str(_SEED),
    ],
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "PYTHONPATH": ""},
  )
  assert done.returncode == 0, done.stderr
  assert done.stdout.startswith("1.") and done.stdout.endswith(" True []\n")


# ------------------------------------------------- the consumer's lines
def _scan(step, x, steps: int = 5):
  @jax.jit
  def run(x):
    return jax.lax.scan(lambda c, _: (step(c) + 1, None), x, None, steps)[0]

  jax.block_until_ready(run(x))
  hostcb.barrier_wait()
  jax.effects_barrier()


def test_id_print_entry_has_the_engine_make_its_lines():
  entry = _Printer(None, None, (("what", "x"),), None).tap_entry()
  assert isinstance(entry, PrintLineTap)
  assert entry.pieces == (b"what: x\n", b"")
  assert entry.array_text[0] is array_text.native_flags


def test_id_print_prints_arrays_of_a_scan_as_numpy_does():
  s = Stream()
  x = jnp.array([0.5, -1.0, 1e-5], jnp.float32)
  _scan(lambda c: hostcb.id_print(c, what="c", output_stream=s), x)
  expected = []
  for k in range(5):
    expected += ["what: c\n", np.array2string(np.asarray(x) + k) + "\n"]
  assert s.parts == expected  # one write per line, as legacy's


def test_id_print_to_stdout_prints_the_lines_of_a_scan():
  out = io.StringIO()
  x = jnp.arange(3, dtype=jnp.int32)
  with contextlib.redirect_stdout(out):
    _scan(hostcb.id_print, x)
  assert out.getvalue() == "".join(
    np.array2string(np.arange(3, dtype=np.int32) + k) + "\n" for k in range(5)
  )


def test_debug_print_prints_arrays_of_a_scan_as_jax_does():
  out = io.StringIO()
  x = jnp.array([[1.5, 2.0], [np.nan, -3.0]], jnp.float32)
  with contextlib.redirect_stdout(out):
    _scan(lambda c: (hostcb.debug.print("c={0} and {0}", c), c)[1], x)
  values = [np.asarray(x) + k for k in range(5)]
  assert out.getvalue() == "".join(f"c={v} and {v}\n" for v in values)


def test_a_tap_that_changes_the_print_options_is_heeded_by_later_prints():
  """A tap function that sets NumPy's print options on the consumer thread
  changes how the prints after it print, as legacy's (its options were
  read when printing): the engine leaves a batch's lines after such a
  function to Python."""
  s = Stream()

  def set_precision(x, transforms):
    np.set_printoptions(precision=2)

  def step(c):
    c = hostcb.id_tap(set_precision, c)
    return hostcb.id_print(c, output_stream=s)

  def reset(x, transforms):
    np.set_printoptions(precision=8)

  try:
    _scan(step, jnp.array([1 / 3, 2 / 3], jnp.float32), steps=3)
  finally:  # on the same consumer thread
    jax.jit(lambda x: hostcb.id_tap(reset, x))(jnp.float32(0))
    hostcb.barrier_wait()
  assert s.output == "[0.33 0.67]\n[1.33 1.67]\n[2.33 2.67]\n"
