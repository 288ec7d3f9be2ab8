"""hostcb._core.array_text: numpy.array2string's text, byte for byte.

Differential: every value is formatted by the fast path and by
``numpy.array2string``; where the fast path gives a text it must be the
same.  Edge values sit at each threshold of NumPy's choices (scientific from
a cut-off and below 1e-4, nan, inf, -0.0, subnormals, the integer limits, the
75-column row), random ones cover the rest.
"""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess

import numpy as np
import pytest

from hostcb._core import array_text
from hostcb._core.printing import format_value

_FLOATS = (np.float32, np.float64)
_INTS = (
  np.int8,
  np.int16,
  np.int32,
  np.int64,
  np.uint8,
  np.uint16,
  np.uint32,
  np.uint64,
)
_RNG_SEED = 20261126


def _differ(arrays, threshold=None) -> tuple[list, int]:
  """The arrays whose fast text is not array2string's, and how many had a
  fast text at all."""
  bad, fast = [], 0
  for a in arrays:
    text = array_text.array_text(a, threshold)
    if text is None:
      continue
    fast += 1
    expected = np.array2string(a, threshold=threshold)
    if text != expected:
      bad.append((a.dtype, a.tolist(), text, expected))
  return bad, fast


def _near(t, edges, ulps=3) -> list:
  """``edges`` of float type ``t`` and their neighbours, both signs."""
  out = []
  for e in edges:
    e = t(e)
    for direction in (t(0), t(np.inf)):
      v = e
      for _ in range(ulps + 1):
        out += [v, -v]
        with np.errstate(over="ignore"):  # past max: inf, an edge too
          v = np.nextafter(v, direction)
  return out


def _float_edges(t) -> list:
  info = np.finfo(t)
  edges = [1e-4, 1e6, 1e7, 1e8, 1e15, 1e16, 1e17, info.max, info.tiny]
  edges += [info.smallest_subnormal, 1e-5, 1.0, 0.5, 1 / 3, 2.0**24]
  edges += [10.0**k for k in range(-10, 20)]
  values = _near(t, edges) + [t(0.0), -t(0.0), t(np.nan), -t(np.nan)]
  values += [t(np.inf), -t(np.inf)]
  return values


@pytest.fixture(autouse=True)
def _default_print_options():
  with np.printoptions(**array_text._DEFAULTS):
    yield


@pytest.mark.parametrize("t", _FLOATS, ids=lambda t: t.__name__)
def test_float_scalars_at_every_threshold(t):
  arrays = [np.array(v, t) for v in _float_edges(t)]
  bad, fast = _differ(arrays)
  assert bad == []
  assert fast == len(arrays)


@pytest.mark.parametrize("t", _FLOATS, ids=lambda t: t.__name__)
def test_random_float_scalars(t):
  rng = np.random.default_rng(_RNG_SEED)
  n = 4000
  u = np.uint32 if t is np.float32 else np.uint64
  bits = rng.integers(0, np.iinfo(u).max, n, dtype=u, endpoint=True)
  magnitudes = 10.0 ** rng.uniform(-12, 20, n) * rng.choice([-1, 1], n)
  with np.errstate(over="ignore"):
    values = list(bits.view(t)) + list(magnitudes.astype(t))
  # short decimals, as programs compute them (0.1, 2.5, 1234.5678)
  decimals = rng.integers(0, 9, n).tolist()
  values += [round(v, d) for v, d in zip(rng.uniform(-1e4, 1e4, n), decimals)]
  arrays = [np.array(v, t) for v in values]
  bad, fast = _differ(arrays)
  assert bad[:5] == []
  assert fast == len(arrays)


@pytest.mark.parametrize("t", _INTS, ids=lambda t: t.__name__)
def test_integer_scalars(t):
  info = np.iinfo(t)
  rng = np.random.default_rng(_RNG_SEED)
  values = [info.min, info.min + 1, info.max, info.max - 1, 0, 1, 9, 10]
  values += list(rng.integers(info.min, info.max, 3000, dtype=t, endpoint=True))
  arrays = [np.array(v, t) for v in values]
  bad, fast = _differ(arrays)
  assert bad[:5] == []
  assert fast == len(arrays)


def test_bool_scalars():
  bad, fast = _differ([np.array(True), np.array(False)])
  assert (bad, fast) == ([], 2)


@pytest.mark.parametrize("t", _INTS + (np.bool_,), ids=lambda t: t.__name__)
def test_random_one_dimensional_rows(t):
  rng = np.random.default_rng(_RNG_SEED)
  arrays = []
  for _ in range(2000):
    n = int(rng.integers(0, 40))
    if t is np.bool_:
      arrays.append(rng.integers(0, 2, n).astype(bool))
      continue
    info = np.iinfo(t)
    top = int(rng.choice([9, 99, 999, 99999, info.max]))
    low = max(info.min, -top)
    arrays.append(rng.integers(low, min(top, info.max), n, t, endpoint=True))
  bad, fast = _differ(arrays)
  assert bad[:5] == []
  assert fast > len(arrays) // 4  # the rest wraps: array2string's


def test_rows_at_the_75_column_wrap():
  arrays = [np.zeros(n, np.int8) for n in (36, 37, 38)]  # 1 wide: 74 at 37
  arrays += [np.full(n, 10, np.int64) for n in (24, 25)]  # 2 wide: 74 at 24.6
  arrays += [np.full(n, -7, np.int32) for n in (24, 25)]  # "-7": 2 wide
  arrays += [np.ones(n, bool) for n in (12, 13)]  # " True": 5 wide, 72 at 12
  bad, fast = _differ(arrays)
  assert bad == []
  assert [array_text.python_text(a, None) is None for a in arrays] == [
    False,
    False,
    True,
    False,
    True,
    False,
    True,
    False,
    True,
  ]


def test_rows_at_the_threshold():
  a = np.arange(6)
  assert _differ([a], threshold=6) == ([], 1)
  assert array_text.array_text(a, 5) is None  # summarized: array2string's


@pytest.mark.parametrize("threshold", [0, -1, 1])
def test_scalars_under_a_threshold_below_their_size(threshold):
  """A 0-d array over the threshold is "summarized" to itself."""
  arrays = [np.array(v, t) for t in _FLOATS for v in _float_edges(t)[::7]]
  arrays += [np.array(-5, np.int64), np.array(True), np.array(255, np.uint8)]
  bad, fast = _differ(arrays, threshold=threshold)
  assert (bad, fast) == ([], len(arrays))


def test_big_endian_arrays():
  arrays = [np.array(v, ">f4") for v in (1.5, -1e-5, 3e6, np.nan)]
  arrays += [np.array(v, ">f8") for v in (1.5, -1e-5, 3e8, -np.inf)]
  arrays += [np.array(-3, ">i4"), np.arange(-2, 9, dtype=">i8")]
  bad, fast = _differ(arrays)
  assert (bad, fast) == ([], len(arrays))


def test_empty_row():
  assert _differ([np.zeros(0, np.int32), np.zeros(0, bool)]) == ([], 2)


@pytest.mark.parametrize(
  "a",
  [
    np.array(1.5, np.float16),
    np.array(1.5, np.longdouble),
    np.array(1 + 2j, np.complex64),
    np.array([1.5, 2.5], np.float32),
    np.arange(4).reshape(2, 2),
    np.array("x"),
    np.array(np.timedelta64(3, "s")),
    np.array(3, np.float32).view(np.recarray),
  ],
  ids=lambda a: f"{type(a).__name__}-{a.dtype}-{a.ndim}d",
)
def test_other_arrays_are_left_to_array2string(a):
  if type(a) is not np.ndarray:
    assert format_value(a) == np.array2string(a)
  else:
    assert array_text.python_text(a, None) is None


def test_a_threshold_that_is_not_an_int_is_left_to_array2string():
  assert array_text.array_text(np.array(3, np.int32), 1e3) is None


@pytest.mark.parametrize(
  "option",
  [
    {"precision": 3},
    {"threshold": 5},
    {"edgeitems": 1},
    {"linewidth": 20},
    {"suppress": True},
    {"nanstr": "NaN"},
    {"infstr": "Inf"},
    {"sign": "+"},
    {"sign": " "},
    {"floatmode": "fixed"},
    {"formatter": {"int": hex}},
    {"legacy": "1.13"},
    {"legacy": "2.2"},
  ],
  ids=lambda o: f"{next(iter(o))}={next(iter(o.values()))!r}",
)
def test_any_other_print_option_leaves_all_to_array2string(option):
  with np.printoptions(**option):
    assert not array_text.defaults_in_force()
    for a in (np.array(1 / 3, np.float32), np.array(-5), np.arange(3)):
      assert format_value(a) == np.array2string(a)


def test_default_print_options_take_the_fast_path():
  assert array_text.defaults_in_force()


def test_common_leaves_do_not_call_array2string(monkeypatch):
  assert array_text.defaults_in_force()  # the probes compared first

  def refuse(*a, **k):
    raise AssertionError("array2string called")

  monkeypatch.setattr(np, "array2string", refuse)
  value = (np.array(3.0, np.float32), np.array(7), np.array([True, False]))
  assert format_value(value) == "( 3. 7 [ True False] )"


def test_a_numpy_that_prints_otherwise_keeps_array2string(monkeypatch, caplog):
  """Fault injection: a cut-off that this NumPy does not use."""
  monkeypatch.setattr(array_text, "_agrees", None)
  monkeypatch.setattr(array_text, "_CUTOFF", {np.float32: 1e3, np.float64: 1e3})
  with caplog.at_level(logging.INFO, logger=array_text.__name__):
    assert not array_text.defaults_in_force()
    assert not array_text.defaults_in_force()  # for good
  assert format_value(np.array(5000.0)) == "5000."
  [record] = caplog.records
  assert record.getMessage().startswith(
    "hostcb prints arrays with numpy.array2string only: NumPy "
  )


_LEGACY_PYTHON = (
  pathlib.Path(__file__).resolve().parent.parent / ".venv-legacy/bin/python"
)

_LEGACY_SCRIPT = """
import importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("array_text", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
assert m.defaults_in_force(), "the probes differ"
rng = np.random.default_rng(1)
bad = []
for t, u in ((np.float32, np.uint32), (np.float64, np.uint64)):
  bits = rng.integers(0, np.iinfo(u).max, 3000, dtype=u, endpoint=True)
  with np.errstate(over="ignore"):
    mags = (10.0 ** rng.uniform(-12, 20, 3000)).astype(t)
  for v in list(bits.view(t)) + list(mags):
    a = np.array(v, t)
    if m.array_text(a, None) != np.array2string(a):
      bad.append((t.__name__, float(v)))
print(np.__version__, bad[:5])
"""


@pytest.mark.skipif(
  not _LEGACY_PYTHON.exists(),
  reason="no .venv-legacy (NumPy 1.26): make .venv-legacy",
)
def test_numpy_1_prints_the_same():
  """hostcb allows NumPy 1.26 (pyproject): its array2string agrees too."""
  done = subprocess.run(
    [str(_LEGACY_PYTHON), "-c", _LEGACY_SCRIPT, array_text.__file__],
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "PYTHONPATH": ""},
  )
  assert done.returncode == 0, done.stderr
  assert done.stdout.startswith("1.") and done.stdout.endswith(" []\n")
