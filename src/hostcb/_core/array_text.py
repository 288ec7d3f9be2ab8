"""The text of ``numpy.array2string`` for ``id_print``'s common leaves, fast.

The native engine makes it for whole arrays of bool, the integer types,
float32 and float64, of any shape that NumPy does not summarize
(``src/hostcb/_native/array_text.cc``; :func:`array_text` asks it first,
and the engine's consumer makes ``id_print``'s and ``debug.print``'s lines
with it, checking :func:`native_flags` once per batch); the Python below
covers the rest of what this module gives, and the whole of it where the
engine is absent.

``numpy.array2string`` costs about 14 µs for a scalar, most of it choosing
a layout that one value or a short row does not need; it runs on hostcb's
consumer thread, which shares the GIL with the thread that dispatches.
:func:`array_text` gives the same text, byte for byte, for:

* 0-d arrays of bool, the NumPy integer types, float32 and float64;
* 1-D arrays of those integer types and bool whose text fits on one line
  (NumPy wraps at 75 columns) and is not summarized (``threshold``);
* arrays with no elements (``[]``);

and only under NumPy's default print options (any option changed, a
``formatter``, a ``legacy`` mode: :func:`defaults_in_force` is false and
the caller uses ``numpy.array2string``).  Everything else (float16,
bfloat16 and the other ML dtypes, complex, n-d arrays, floats in 1-D) gives
``None``: the caller uses ``numpy.array2string``.

What ``numpy.array2string`` does for these, under the defaults (read from
NumPy 1.26 and 2.4's ``arrayprint``; the tests compare the two on edge and
random values):

* a bool scalar is ``True`` or ``False``; in 1-D, each is 5 wide
  (`` True``);
* integers are ``str(value)``, right-aligned in 1-D to the widest;
* a float scalar is scientific when it is not zero and its magnitude is at
  least a cut-off, or below ``0.0001`` (compared as NumPy compares a scalar
  of its dtype with a Python float), else positional; with up to 8 digits
  after the point, the shortest that reads back the same, trailing zeros
  cut but the point kept (``3.``, ``1.e+08``); ``nan``, ``inf``, ``-inf``;
  the cut-off is ``1e8``, and from NumPy 2.3 on ``10 ** min(8, digits)``
  with ``digits`` the dtype's decimal precision (``1e6`` for float32); the
  text is made twice, as array2string makes it: the second time padded to
  the parts of the first (NumPy 1 rounds some float32 values otherwise);
* a 1-D row is ``[`` the words joined by a space ``]``, on one line while
  ``n * (width + 1) <= 74`` (75 columns, less the closing bracket).

The first time it is used, :func:`defaults_in_force` compares this module's
text with ``numpy.array2string`` on values at every threshold; a NumPy that
prints any of them otherwise keeps ``numpy.array2string`` for good (logged).
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import math
from typing import Callable

import numpy as np

__all__ = ["array_text", "defaults_in_force"]

_log = logging.getLogger(__name__)

# NumPy's default print options, as np.get_printoptions() reports them
# (``override_repr``, NumPy 2.1 on, is checked apart: it may be missing).
_DEFAULTS = {
  "edgeitems": 3,
  "threshold": 1000,
  "floatmode": "maxprec",
  "precision": 8,
  "suppress": False,
  "linewidth": 75,
  "nanstr": "nan",
  "infstr": "inf",
  "sign": "-",
  "formatter": None,
  "legacy": False,
}

# A 1-D row stays on one line while n * (width + 1) <= this.
_ROW_BUDGET = _DEFAULTS["linewidth"] - len("]")

# NumPy's integer scalar types (the fixed-width ones and their C names).
INTEGER_TYPES = frozenset(
  {
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.intc,
    np.uintc,
    np.longlong,
    np.ulonglong,
  }
)


def _cutoffs() -> dict[type, float]:
  """The magnitude from which a float scalar prints in scientific form."""
  if np.lib.NumpyVersion(np.__version__) < "2.3.0":
    return {np.float32: 1e8, np.float64: 1e8}
  return {
    t: 10.0 ** min(8, np.finfo(t).precision) for t in (np.float32, np.float64)
  }


_CUTOFF = _cutoffs()


def _float_text(x: np.floating, cutoff: float) -> str:
  """The text of a float32/float64 scalar ``x`` as a 0-d array."""
  if not math.isfinite(x):
    return "nan" if math.isnan(x) else ("-inf" if x < 0 else "inf")
  magnitude = abs(x)  # a NumPy scalar: compared as NumPy compares it
  # As array2string does: a first text sizes the parts, a second pads to
  # them (which changes digits on NumPy 1: 97474816. for float32, not the
  # first text's 97474820.).
  if magnitude != 0 and (magnitude >= cutoff or magnitude < 0.0001):
    mantissa, _, exponent = np.format_float_scientific(
      x, precision=8, unique=True, trim="."
    ).partition("e")
    whole, _, fraction = mantissa.partition(".")
    return np.format_float_scientific(
      x,
      precision=len(fraction),
      min_digits=len(fraction),
      unique=True,
      trim="k",
      pad_left=len(whole),
      exp_digits=len(exponent) - 1,
    )
  whole, _, fraction = np.format_float_positional(
    x, precision=8, unique=True, fractional=True, trim="."
  ).partition(".")
  return np.format_float_positional(
    x,
    precision=8,
    min_digits=0,
    unique=True,
    fractional=True,
    trim=".",
    pad_left=len(whole),
    pad_right=len(fraction),
  )


# The NumPy behaviours that the native engine's text follows (array_text.cc:
# ArrayTextFlags): a float32 compared with 0.0001 as a float32 (NumPy 2),
# float32's scientific cut-off at 1e6 (NumPy 2.3 on).
NATIVE_FLAGS = (1 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 0) | (
  2 if np.lib.NumpyVersion(np.__version__) >= "2.3.0" else 0
)

# The largest threshold the native engine takes (a C long long).
_MAX_THRESHOLD = (1 << 62) - 1


def _native_function() -> Callable | None:
  """The engine's ``array_text(array, flags, threshold)`` (array_text.cc),
  or None without it (no extension, or one built before it)."""
  try:
    from hostcb._native import extension  # noqa: PLC0415
  except ImportError:  # this file loaded alone (the NumPy 1 test)
    return None
  engine = extension()
  return None if engine is None else getattr(engine, "array_text", None)


# array_text.cc's text of a whole array (any shape of bool, integers,
# float32, float64, not summarized) where it agrees with the probes:
# :func:`defaults_in_force` sets it.
_native: Callable | None = None


def array_text(a: np.ndarray, threshold: int | None) -> str | None:
  """``numpy.array2string(a, threshold=threshold)``, or ``None`` where this
  module does not give that text (the caller calls it then).

  Only valid while :func:`defaults_in_force` is true.
  """
  if threshold is not None and type(threshold) is not int:
    return None  # NumPy checks and compares it; leave that to NumPy
  native = _native
  if native is not None:
    text = native(
      a,
      NATIVE_FLAGS,
      _DEFAULTS["threshold"]
      if threshold is None
      else min(threshold, _MAX_THRESHOLD),
    )
    if text is not None:
      return text
  return python_text(a, threshold)


def python_text(a: np.ndarray, threshold: int | None) -> str | None:
  """:func:`array_text` made in Python (scalars and short integer rows)."""
  if threshold is not None and type(threshold) is not int:
    return None
  t = a.dtype.type
  if a.ndim == 0:
    if t is np.float64 or t is np.float32:
      return _float_text(a[()], _CUTOFF[t])
    if t in INTEGER_TYPES or t is np.bool_:
      return str(a.item())
    return None
  if a.ndim != 1:
    return None
  n = a.shape[0]
  if t is not np.bool_ and t not in INTEGER_TYPES:
    return None
  if n == 0:
    return "[]"
  if n > (_DEFAULTS["threshold"] if threshold is None else threshold):
    return None  # summarized
  if n * 2 > _ROW_BUDGET:
    return None  # wraps: every word is 1 wide at least
  if t is np.bool_:
    width, words = 5, [" True" if v else "False" for v in a.tolist()]
  else:
    words = [str(v) for v in a.tolist()]
    width = max(map(len, words))
    words = [w.rjust(width) for w in words]
  if n * (width + 1) > _ROW_BUDGET:
    return None  # wraps
  return "[" + " ".join(words) + "]"


def _probes() -> list[np.ndarray]:
  """Values at every threshold of :func:`array_text`'s choices."""
  out = []
  for t in (np.float32, np.float64):
    info = np.finfo(t)
    edges = [1e-4, 1e6, 1e8, _CUTOFF[t], info.tiny, info.smallest_subnormal]
    values = [0.0, 1.0, 3.0, 0.1, 1 / 3, 1.5, 123456.789, info.max]
    for e in edges:
      e = t(e)
      values += [e, np.nextafter(e, t(0)), np.nextafter(e, t(np.inf))]
    values += [np.nan, np.inf]
    for v in values:
      out += [np.array(v, t), np.array(-t(v), t)]
  for t in (np.int8, np.uint8, np.int64, np.uint64):
    info = np.iinfo(t)
    out += [np.array(v, t) for v in (0, 1, info.min, info.max)]
    out += [np.array([info.min, 0, info.max], t)]
    out += [np.arange(24, dtype=t), np.zeros(37, t), np.full(3, info.min, t)]
  out += [np.array(True), np.array(False), np.array([True, False, True])]
  out += [np.zeros(12, bool), np.ones(12, bool), np.zeros(0, np.int32)]
  return out


def _native_probes() -> list[np.ndarray]:
  """:func:`_probes`, and rows and blocks of floats at the thresholds of
  scientific form, padding, wrapping and nesting."""
  out = _probes()
  for t in (np.float32, np.float64):
    out += [
      np.array([1.0, 2.5, -0.0], t),
      np.array([1e-5, 1.0, np.nan, -np.inf], t),
      np.array([0.1, 1000.5, 123456.7], t),
      np.array([np.nan, np.inf], t),
      np.linspace(-3, 7, 30).astype(t),
      np.arange(24, dtype=t).reshape(2, 3, 4) / 7,
    ]
  out += [np.arange(60).reshape(3, 20), np.zeros((2, 0)), np.eye(3, dtype=bool)]
  return out


def _disagreement(text_of, probes, what: str) -> bool:
  """Whether ``text_of`` gives a probe's text otherwise than
  ``numpy.array2string`` (logged)."""
  differ = [
    (a, text, expected)
    for a in probes
    if (text := text_of(a)) is not None
    and text != (expected := np.array2string(a))
  ]
  if differ:
    a, text, expected = differ[0]
    _log.info(
      "hostcb prints arrays with numpy.array2string%s: NumPy %s prints "
      "%r of %s as %r, not %r as hostcb's %s would (%d probes differ)",
      " only" if what == "fast path" else " and hostcb's Python fast path",
      np.__version__,
      a.tolist(),
      a.dtype,
      expected,
      text,
      what,
      len(differ),
    )
  return bool(differ)


def _compare() -> bool:
  """Compares the fast paths with this NumPy on the probes, once: sets
  :data:`_native` where the engine's agrees; whether the Python one
  does."""
  global _native
  if _disagreement(lambda a: python_text(a, None), _probes(), "fast path"):
    return False
  native = _native_function()
  if native is not None and not _disagreement(
    lambda a: native(a, NATIVE_FLAGS, _DEFAULTS["threshold"]),
    _native_probes(),
    "native engine",
  ):
    _native = native
  return True


def _default_options_getter() -> Callable[[], bool] | None:
  """A quick test that this thread's print options are NumPy's defaults
  (NumPy 2 keeps them in a context variable whose default is one dict;
  ``np.printoptions`` restores it), or None."""
  try:
    var = importlib.import_module("numpy._core.printoptions").format_options
  except (ImportError, AttributeError):
    return None
  if not isinstance(var, contextvars.ContextVar):
    return None
  default = contextvars.Context().run(var.get)
  return lambda: var.get() is default


_is_default = _default_options_getter()

_agrees: bool | None = None  # None: not compared yet

# Set in the flags of native_flags: the engine may format now.
IN_FORCE = 256


def native_flags() -> int:
  """For the native engine's lines (a ``PrintLineTap``'s ``array_text``
  check, once per batch on a consumer thread): :data:`NATIVE_FLAGS` with
  :data:`IN_FORCE` where its text is NumPy's now (the default print
  options in this thread, and the probes agreed), else 0."""
  return NATIVE_FLAGS | IN_FORCE if defaults_in_force() and _native else 0


def formats_natively() -> bool:
  """Whether the engine has the text of arrays (array_text.cc); it is
  used only where it agrees with this NumPy (:func:`native_flags`)."""
  return _native_function() is not None


def defaults_in_force() -> bool:
  """Whether :func:`array_text` may be used now: NumPy's print options in
  this thread are the defaults, and this NumPy prints the probes as this
  module does."""
  global _agrees
  if _agrees and _is_default is not None and _is_default():
    return True
  options = np.get_printoptions()
  if options.pop("override_repr", None) is not None or options != _DEFAULTS:
    return False
  if _agrees is None:
    _agrees = _compare()
  return _agrees
