"""Which host function a callback is: by what it is, not what it equals.

hostcb keys its compiled callbacks (the primitives' parameters, which JAX
caches by equality, and the engine's registry of target ids) by the
function they call.  Two callables that compare equal may still compute
different things (a dataclass whose equality leaves out a field), and a
callable need not be hashable at all: keyed by equality, the second would
run the first's code.  So a host function is the same as another only if
it is the same object, or:

* a bound method of the same object and the same function (``obj.f``
  builds a new method object at each access);
* one of hostcb's own wrappers, a front end's host function
  (:class:`hostcb._core.host_function.HostFunction`), which compares the
  user's functions inside it by identity (through :func:`same_function`),
  and so may compare by value itself.
"""

from __future__ import annotations

import types
from typing import Any

from hostcb._core.host_function import HostFunction

__all__ = ["same_function", "function_hash", "Same"]


def same_function(a: Any, b: Any) -> bool:
  """Whether ``a`` and ``b`` are the same host function (see above)."""
  if a is b:
    return True
  if type(a) is not type(b):
    return False
  if type(a) is types.MethodType:
    return a.__self__ is b.__self__ and a.__func__ is b.__func__
  if isinstance(a, HostFunction):
    return a == b
  return False


def function_hash(f: Any) -> int:
  """A hash consistent with :func:`same_function`; for any callable,
  hashable or not."""
  if type(f) is types.MethodType:
    return hash((id(f.__self__), id(f.__func__)))
  if isinstance(f, HostFunction):
    return hash(f)
  return id(f)


class Same:
  """A host function, equal to another only where :func:`same_function`
  says so: a field of a frozen dataclass that holds a function, whose
  generated equality and hash then compare it by what it is."""

  __slots__ = ("func",)

  def __init__(self, func: Any):
    self.func = func

  def __eq__(self, other: Any) -> bool:
    return type(other) is Same and same_function(self.func, other.func)

  def __hash__(self) -> int:
    return function_hash(self.func)

  def __repr__(self) -> str:
    return f"Same({self.func!r})"
