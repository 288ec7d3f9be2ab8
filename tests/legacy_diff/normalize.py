"""How a scenario's values are written down, and the one normalization.

:func:`fmt` writes any value a scenario shows or a tap function receives as
text that keeps everything a program could observe: Python and NumPy types,
dtypes, shapes, weak types and exact values.  :func:`normalize` then removes
from a scenario's whole output only what changed in JAX itself between
0.4.30 and 0.10.2, never anything that hostcb produces:

* device names: ``TFRT_CPU_0`` (0.4.30's ``str``) and ``CpuDevice(id=0)``
  (the ``repr``) both become ``cpu:0`` (0.10.2's ``str``);
* the runtime error class, renamed from ``XlaRuntimeError`` to
  ``JaxRuntimeError``;
* the frames of a traceback embedded in an error message (they name JAX's
  internal files and lines); the exception line after them stays;
* the prefix that JAX's CPU callback machinery puts before a callback's
  error (``Generated function failed: CpuCallback error:`` in 0.4.30,
  ``CpuCallback error calling callback:`` in 0.10.2);
* object addresses (``at 0x7f...``), which change from run to run anyway;
* the ``_deprecated_`` prefix of legacy's function names in Python's
  argument errors (``_deprecated_id_tap() takes 2 positional ...``);
* the callback's name in ``call``'s result errors (legacy wrote the repr
  of its internal ``_CallbackWrapper`` there).
"""

from __future__ import annotations

import re

import numpy as np

_RULES = [
  (re.compile(r"TFRT_CPU_(\d+)"), r"cpu:\1"),
  (re.compile(r"CpuDevice\(id=(\d+)\)"), r"cpu:\1"),
  (
    re.compile(
      r"\b(jaxlib\.xla_extension\.|jax\.errors\.|jaxlib\._jax\.)?"
      r"(XlaRuntimeError|JaxRuntimeError)\b"
    ),
    "JaxRuntimeError",
  ),
  (
    re.compile(
      r"Generated function failed: CpuCallback error: "
      r"|CpuCallback error calling callback: "
    ),
    "CpuCallback error: ",
  ),
  (re.compile(r" at 0x[0-9a-fA-F]+"), " at 0x?"),
  # Legacy's public functions were named _deprecated_* in its module (JAX
  # 0.4.26 on), which Python's argument errors name.
  (
    re.compile(r"\b_deprecated_(id_tap|id_print|call|barrier_wait)\("),
    r"\1(",
  ),
  # Legacy named its internal wrapper object in call errors, where the
  # name of the callback goes.
  (
    re.compile(r"Callback func .*? should have returned"),
    "Callback func <callback> should have returned",
  ),
]

_TRACEBACK = re.compile(
  r"Traceback \(most recent call last\):\n"
  r"(?:(?:  File .*\n)(?:    .*\n)*)*"
  r"(?:\n?During handling.*\n\n)?"
)


def normalize(text: str) -> str:
  """The scenario output ``text`` without JAX-version noise (module doc)."""
  text = _TRACEBACK.sub(
    "Traceback (most recent call last):\n  <frames>\n", text
  )
  for pattern, repl in _RULES:
    text = pattern.sub(repl, text)
  return text


def _is_key(x) -> bool:
  import jax

  try:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
  except Exception:  # noqa: BLE001  (not an array with a dtype)
    return False


def _values(a: np.ndarray):
  """Exact values as Python objects (extended float types as float32)."""
  if a.dtype.kind == "V" or a.dtype.name in (
    "bfloat16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float16",
  ):
    a = a.astype(np.float32)
  return a.tolist()


def fmt(x) -> str:
  """Writes ``x`` with everything observable about it (module doc)."""
  import jax

  if x is None:
    return "None"
  if isinstance(x, tuple):
    name = "" if type(x) is tuple else type(x).__name__
    return (
      f"{name}("
      + ", ".join(fmt(v) for v in x)
      + ("," if len(x) == 1 else "")
      + ")"
    )
  if isinstance(x, list):
    return "[" + ", ".join(fmt(v) for v in x) + "]"
  if isinstance(x, dict):
    return "{" + ", ".join(f"{k!r}: {fmt(v)}" for k, v in x.items()) + "}"
  if isinstance(x, jax.Array):
    if _is_key(x):
      data = np.asarray(jax.random.key_data(x))
      return (
        f"jax.Array(key<{jax.random.key_impl(x)}>, {x.shape}, "
        f"data={data.tolist()})"
      )
    weak = getattr(x, "weak_type", None)
    return (
      f"jax.Array({x.dtype}, {x.shape}, weak={weak}, {_values(np.asarray(x))})"
    )
  if isinstance(x, np.ndarray):
    return f"np.ndarray({x.dtype}, {x.shape}, {_values(x)})"
  if isinstance(x, np.generic):
    return f"np.{type(x).__name__}({_values(np.asarray(x))!r})"
  if isinstance(x, (bool, int, float, complex, str)):
    return f"{type(x).__name__}({x!r})"
  return f"{type(x).__name__}<{x!r}>"


def exc_text(e: BaseException) -> str:
  """``TypeName: message`` of an exception, for the scenario output."""
  return f"{type(e).__name__}: {e}"
