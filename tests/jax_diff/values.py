"""How the harness writes values down, and its one normalization.

* :func:`see` writes what a callback receives: a ``jax.Array`` as its
  dtype, shape and exact values, a NumPy array or scalar the same after
  its type (``ndarray:``), so that every scenario checks that a callback
  gets the type of argument that JAX's gets; everything else (strings,
  objects, containers) is written with its type.
* :func:`fmt` writes a value a scenario returns or shows, with its type and
  weak type: both implementations return ``jax.Array`` s.
* :func:`normalize` replaces the frames of a traceback embedded in an error
  message (they name each implementation's source files and lines) and
  object addresses (``at 0x...``); nothing else.
"""

from __future__ import annotations

import re

import numpy as np

_EXTENDED_FLOATS = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


def _is_key(x) -> bool:
  import jax

  try:
    return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
  except Exception:  # noqa: BLE001  (no dtype)
    return False


def _values(a: np.ndarray):
  if a.dtype.name in _EXTENDED_FLOATS:
    a = a.astype(np.float32)
  return a.tolist()


def _array_text(x) -> str:
  import jax

  if _is_key(x):
    data = np.asarray(jax.random.key_data(x))
    return f"key<{jax.random.key_impl(x)}>{list(x.shape)}={data.tolist()}"
  a = np.asarray(x)
  return f"{a.dtype}{list(a.shape)}={_values(a)}"


def see(x) -> str:
  """What a callback received (module doc): arrays by value and dtype."""
  import jax

  if isinstance(x, jax.Array):
    return _array_text(x)
  if isinstance(x, (np.ndarray, np.generic)):
    return f"{type(x).__name__}:{_array_text(x)}"
  if isinstance(x, tuple):
    name = "" if type(x) is tuple else type(x).__name__
    return (
      f"{name}("
      + ", ".join(see(v) for v in x)
      + ("," if len(x) == 1 else "")
      + ")"
    )
  if isinstance(x, list):
    return "[" + ", ".join(see(v) for v in x) + "]"
  if isinstance(x, dict):
    return "{" + ", ".join(f"{k!r}: {see(v)}" for k, v in x.items()) + "}"
  return f"{type(x).__name__}<{x!r}>"


def fmt(x) -> str:
  """A value a scenario returns or shows, with its type (module doc)."""
  import jax

  if isinstance(x, jax.Array):
    weak = getattr(x, "weak_type", None)
    return f"Array({_array_text(x)}, weak={weak})"
  if isinstance(x, np.ndarray):
    return f"ndarray({_array_text(x)})"
  if isinstance(x, np.generic):
    return f"np.{type(x).__name__}({_array_text(x)})"
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
  return f"{type(x).__name__}<{x!r}>"


def exc_text(e: BaseException) -> str:
  """``TypeName: message`` of an exception."""
  return f"{type(e).__name__}: {e}"


_TRACEBACK = re.compile(
  r"Traceback \(most recent call last\):\n"
  r"(?:(?:  File .*\n)(?:    .*\n)*)*"
)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def normalize(text: str) -> str:
  """``text`` without traceback frames and addresses (module doc)."""
  text = _TRACEBACK.sub(
    "Traceback (most recent call last):\n  <frames>\n", text
  )
  return _ADDRESS.sub(" at 0x?", text)
