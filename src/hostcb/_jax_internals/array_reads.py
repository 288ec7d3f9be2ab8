"""A hook that runs when a ``jax.Array`` is read on the host.

Part of :mod:`hostcb._jax_internals`; checked against jax 0.8.0, 0.10.2 and 0.12.0.1.

hostcb's prints (``id_print``, ``hostcb.debug.print``) run on consumer
threads after the computation queued them, so without more a result could
show on the host before the lines of the computation that produced it
(``print(f(x))`` printing the result, then ``f``'s line, or the two on one
line).  JAX's own callbacks run while the computation runs, so its prints
always come first.  hostcb keeps that order at the one place where it is
visible: when a result is read on the host.  :func:`after_host_reads`
makes every read of a ``jax.Array``'s value, once the array is ready (its
computation has queued all its taps), call a hook with the array before
the value is returned:

* ``ArrayImpl._value``, the property behind ``str``, ``repr``, ``float``,
  ``int``, ``bool``, ``format``, ``.tolist()``, ``__array__`` and
  ``jax.device_get``;
* ``ArrayImpl.item`` (which reads through NumPy's buffer protocol);
* ``ArrayImpl.block_until_ready`` (one array, and ``jax.block_until_ready``
  of one array);
* ``xla_client.batched_block_until_ready``, which ``jax.block_until_ready``
  calls for several arrays.

Nothing else changes: the device never waits, and a program that never
reads its results on the host never calls the hook.  One read escapes it:
``np.asarray(array)`` and ``np.array(array)`` of an array on the CPU read
its memory through the buffer protocol, a slot of JAX's C++ array type
that Python code cannot wrap.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from jax._src import array as _array
from jax._src.lib import xla_client as _xc

from hostcb._jax_internals import patches
from hostcb._jax_internals.versions import check_shape, require

_WHAT = "to show hostcb's prints before the results they come with"
_NAME = "host reads"
# JAX's own ArrayImpl.block_until_ready, once the hook was installed.
_unhooked_block: list[Callable[[Any], Any]] = []


def block_without_hook(array: Any) -> Any:
  """``array.block_until_ready()`` without the hook: for hostcb's own waits
  on a computation (its runtime token), which are no read of a result and
  must not wait for the taps that the computation queued."""
  unhooked = _unhooked_block[:1]
  if unhooked:
    return unhooked[0](array)
  return array.block_until_ready()


def after_host_reads(hook: Callable[[Any], None]) -> None:
  """From now on, ``hook(array)`` runs after each host read of a ready
  ``jax.Array`` (module docstring), in the reading thread.  Installed once
  (under :data:`.patches.lock`: two threads staging their first print
  install it once), recorded in :mod:`.patches`, which undoes it; later
  calls do nothing while it is in place."""
  if patches.is_installed(_NAME):
    return
  with patches.lock:
    if patches.is_installed(_NAME):
      return
    _install(hook)


def _install(hook: Callable[[Any], None]) -> None:
  impl = require(_array, "ArrayImpl", _WHAT)
  value = require(impl, "_value", _WHAT)
  block = require(impl, "block_until_ready", _WHAT)
  item = require(impl, "item", _WHAT)
  batched = require(_xc, "batched_block_until_ready", _WHAT)
  check_shape(value, "jax._src.array.ArrayImpl._value", _WHAT, types=property)
  read_value = value.fget

  def _value(self):
    v = read_value(self)
    hook(self)
    return v

  def block_until_ready(self):
    out = block(self)
    hook(self)
    return out

  def item_(self, *args):
    self.block_until_ready()  # the hook, once the array is ready
    return item(self, *args)

  def batched_block_until_ready(arrays):
    out = batched(arrays)
    for a in arrays:
      hook(a)
    return out

  # JAX's own function (what the class holds again after uninstall).
  _unhooked_block[:] = [block]
  patches.install(_NAME, impl, "_value", property(_value, doc=value.__doc__))
  patches.install(
    f"{_NAME} (block_until_ready)", impl, "block_until_ready", block_until_ready
  )
  patches.install(f"{_NAME} (item)", impl, "item", functools.wraps(item)(item_))
  patches.install(
    f"{_NAME} (several arrays)",
    _xc,
    "batched_block_until_ready",
    batched_block_until_ready,
  )
