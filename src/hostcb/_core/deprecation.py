"""The deprecated paths of names that moved (issue 35)."""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import Any, Callable


def forwarding_getattr(
  old: str, moved: ModuleType, public: dict[str, str]
) -> Callable[[str], Any]:
  """A module ``__getattr__`` for the old module ``old``: each name is read
  from ``moved``, with a ``DeprecationWarning`` naming the path to use
  (``public[name]``, else the private module's)."""

  def __getattr__(name: str) -> Any:
    if name.startswith("__"):
      raise AttributeError(f"module {old!r} has no attribute {name!r}")
    value = getattr(moved, name)
    use = public.get(name, f"{moved.__name__}.{name} (private)")
    warnings.warn(
      f"{old}.{name} is deprecated: use {use}",
      DeprecationWarning,
      stacklevel=2,
    )
    return value

  return __getattr__
