"""Computations that print: marked at lowering, noted at each dispatch,
waited for by their thread.

Part of :mod:`hostcb._jax_internals`; checked against jax 0.8.0, 0.10.2 and
0.12.0.1.  The JAX-private half of output ordering; the map of the whole is
:mod:`hostcb._engine.output_order`, which calls what is here.

A thread's next print waits for the latest computation that prints and
that it dispatched, and for its prints, as JAX's own prints are out before
the dispatch of a CPU computation returns.  What this module holds:

* **Marked at lowering.**  A print's lowering calls
  :func:`note_awaited_lowered`; :mod:`.dispatch`'s wrapper of
  ``_cached_lowering_to_hlo`` keeps the modules lowered with one
  (:func:`lowered_printing`, :func:`prints_module`; weakly: an id could be
  reused by a later module, and the cached lowering returns the same
  module again without lowering it), and decides once per executable:

  - one that returns arrays stays on jit's fast path (no runtime token),
    and its executable carries :data:`_PRINTS` in its keepalive
    (:func:`marked_keepalive`);
  - one that returns nothing keeps its runtime token (JAX's Python path),
    whose dispatch the token chain of :mod:`.core` sees (the token of the
    latest one of each thread).

* **Noted at each dispatch** (:data:`_print_outputs`, thread id -> the
  outputs of its latest computation that prints).  On the C++ fast path
  that is one call per dispatch, made by jaxlib when it builds the result
  tree: the tree is wrapped in a ``_PrintOutputs`` node, whose unflatten,
  a C function of the native engine where it is there, notes the outputs
  and returns the tree as it was (:func:`_install_fastpath_note`).  On
  JAX's Python path (``ExecuteReplicated.__call__``: the first call, an
  AOT-compiled call) the outputs are noted there
  (:func:`_install_python_path_note`), which also runs the hook of
  :func:`wait_after_next_dispatch`.

* **Waited for** (:func:`wait_for_this_threads_computation`): the noted
  outputs ready, the latest runtime token ready.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Callable

from jax._src.interpreters import pxla as _pxla

from hostcb._native import extension
from hostcb._jax_internals import core as _core
from hostcb._jax_internals import patches
from hostcb._jax_internals.versions import check_shape, require

__all__ = [
  "note_awaited_lowered",
  "lowered_printing",
  "prints_module",
  "marked_keepalive",
  "prints",
  "this_threads_notes",
  "note_print_outputs",
  "forget_this_threads_print_outputs",
  "forget_print_outputs",
  "wait_for_this_threads_computation",
  "wait_after_next_dispatch",
]

# ------------------------------------------------------ marked at lowering
_lowering = threading.local()  # .awaited: awaited taps lowered by this thread
_awaited_modules: weakref.WeakSet = weakref.WeakSet()


def note_awaited_lowered() -> None:
  """The lowering running in this thread stages a print."""
  _lowering.awaited = getattr(_lowering, "awaited", 0) + 1


def awaited_lowerings() -> int:
  """How many prints this thread's lowerings staged so far: a lowering
  during which it did not change staged none."""
  return getattr(_lowering, "awaited", 0)


def lowered_printing(module: Any) -> None:
  """``module`` was lowered with a print (its lowering changed
  :func:`awaited_lowerings`)."""
  _awaited_modules.add(module)


def prints_module(module: Any) -> bool:
  """Whether ``module`` was lowered with a print."""
  return module in _awaited_modules


class _PrintsMarker:
  """In the keepalive of an executable that prints and dispatches on the
  fast path (module docstring)."""

  def __repr__(self) -> str:
    return "<hostcb: prints>"

  def __reduce__(self):
    # Pickled with an executable (jax.experimental.serialize_executable):
    # the same marker once loaded again.
    return (_prints_marker, ())


_PRINTS = _PrintsMarker()


def _prints_marker() -> _PrintsMarker:
  return _PRINTS


def marked_keepalive(keepalive: Any) -> list:
  """The keepalive of an executable that prints and stays on the fast
  path, with :data:`_PRINTS`; installs the notes of its dispatches."""
  _install_fastpath_note()
  return [*(keepalive or ()), _PRINTS]


def prints(executable: Any) -> bool:
  """Whether a ``MeshExecutable`` carries :data:`_PRINTS`."""
  call = getattr(executable, "unsafe_call", None)
  return _marked(getattr(call, "keepalive", None))


def _marked(keepalive: Any) -> bool:
  return isinstance(keepalive, list) and any(k is _PRINTS for k in keepalive)


# ----------------------------------------------------- noted at dispatch
# thread id -> the output arrays of the last computation that prints and
# that it dispatched on jit's fast path: ready once that computation
# finished.  Held until the thread's next print or such dispatch (the
# result of a loop that drops its results stays allocated until then).
# Never rebound (only cleared): the fast path's note (a C function of the
# native engine) and the ordered ``print`` hold it.
_print_outputs: dict[int, Any] = {}
_get_ident = threading.get_ident


def note_print_outputs(arrays: Any) -> None:
  """The calling thread dispatched a computation that prints, whose
  outputs are the sequence ``arrays`` (not empty; see
  :func:`wait_for_this_threads_computation`)."""
  _print_outputs[_get_ident()] = arrays


def this_threads_notes() -> tuple[dict, dict]:
  """The two dicts, keyed by thread id, whose keys are the threads with a
  noted computation to wait for (:func:`wait_for_this_threads_computation`):
  their latest print outputs, their latest runtime tokens (:mod:`.core`).
  Never rebound (only cleared): :mod:`hostcb._engine.output_order` looks
  in them on each ``print``, for the calling thread's id alone."""
  return _print_outputs, _core._latest_tokens


def forget_this_threads_print_outputs() -> None:
  """Drops the print outputs noted for the calling thread (a thread that
  does not wait for them: a consumer, or XLA's).  Its token, if any, stays
  (barriers wait for it)."""
  _print_outputs.pop(_get_ident(), None)


def forget_print_outputs() -> None:
  """In a forked child: the parent's computations are not ours to wait
  for (their tokens: :func:`.core.forget_dispatched_computations`)."""
  _print_outputs.clear()


_NOTE_WHAT = (
  "to let writes wait for the computations that print, on jit's fast path"
)


class _PrintOutputs:
  """The root of the result tree of an executable that prints, on jit's
  fast path: jaxlib unflattens it once per dispatch, in C++, which calls
  the node's unflatten (:func:`_note_and_unflatten`; a pytree node of
  hostcb's, registered at the first such executable).  Its aux data is the
  result tree itself, or None where the result is one array; its children
  that tree's leaves."""

  __slots__ = ("tree",)

  def __init__(self, tree: Any):
    self.tree = tree


_LEAF = object()  # a placeholder leaf, to build the wrapped tree once


def _flatten_print_outputs(node: _PrintOutputs) -> tuple:
  tree = node.tree
  # One array (a leaf, the only node): decided here, once per executable.
  return [_LEAF] * tree.num_leaves, None if tree.num_nodes == 1 else tree


def _unflatten_print_outputs(tree: Any, children: Any) -> Any:
  """The result tree as the function returns it, once one of its outputs
  is noted for the next print (one call per dispatch).  The native
  engine's ``print_outputs_unflatten`` makes the same function in C
  (:func:`_note_and_unflatten`); this one is for a process without it."""
  _print_outputs[_get_ident()] = children  # note_print_outputs, inlined
  if tree is None:  # the result is one array
    return children[0]
  return tree.unflatten(children)


def _note_and_unflatten() -> Callable[[Any, Any], Any]:
  """The node's unflatten: the native engine's, which runs no Python frame
  per dispatch, or :func:`_unflatten_print_outputs` where the extension is
  absent (or is an older build without it: reinstalling adds it)."""
  engine = extension()
  make = getattr(engine, "print_outputs_unflatten", None)
  if make is None:
    return _unflatten_print_outputs
  return make(_print_outputs)


_registered = [False]


def _install_fastpath_note() -> None:
  """Installed at the first executable that prints and stays on the fast
  path: ``pjit._get_fastpath_data`` wraps such an executable's result tree
  in a ``_PrintOutputs`` node; ``ExecuteReplicated.__call__`` (JAX's
  Python path) notes its outputs; ``MeshExecutable.create_cpp_call`` (AOT
  calls) gives it the Python path (:mod:`.dispatch`'s guard).  Checked
  on jax 0.8.0, 0.10.2 and 0.12.0.1 (``_get_fastpath_data`` returns a
  ``MeshExecutableFastpathData`` with an ``out_pytree_def`` field or
  None; jaxlib unflattens the outputs with it through
  ``tree_util.dispatch_registry``)."""
  if patches.is_installed("print outputs (fast path)"):
    return
  import jax  # noqa: PLC0415  (public API)
  from jax._src import pjit as _pjit  # noqa: PLC0415  (only where needed)
  from jax._src import tree_util as _tree_util  # noqa: PLC0415  (same)

  original = require(_pjit, "_get_fastpath_data", _NOTE_WHAT)
  registry = require(_tree_util, "dispatch_registry", _NOTE_WHAT)
  with patches.lock:
    if patches.is_installed("print outputs (fast path)"):
      return
    if not _registered[0]:
      # A node type of hostcb's own, in every registry (public API): it
      # stays registered after hostcb.uninstall(), and no value of that
      # type exists outside these trees.
      jax.tree_util.register_pytree_node(
        _PrintOutputs, _flatten_print_outputs, _note_and_unflatten()
      )
      _registered[0] = True

    def get_fastpath_data(executable, *args, **kwargs):
      data = original(executable, *args, **kwargs)
      if data is None or not prints(executable):
        return data
      check_shape(
        data,
        "jax._src.interpreters.pxla.MeshExecutableFastpathData",
        _NOTE_WHAT,
        fields=("out_pytree_def",),
      )
      tree = data.out_pytree_def
      if tree.num_leaves == 0:
        return None  # nothing to wait for: JAX's Python path notes none
      wrapped = registry.flatten(_PrintOutputs(tree), None)[1]
      return data._replace(out_pytree_def=wrapped)

    patches.install(
      "print outputs (fast path)",
      _pjit,
      "_get_fastpath_data",
      get_fastpath_data,
    )
    _install_python_path_note()


def _install_python_path_note() -> None:
  """``ExecuteReplicated.__call__`` (JAX's Python path: a first call, an
  AOT-compiled call, a function that returns nothing) notes the outputs
  of an executable that prints, then runs the hook of
  :func:`wait_after_next_dispatch`."""
  if patches.is_installed("print outputs (Python path)"):
    return
  replicated = require(_pxla, "ExecuteReplicated", _NOTE_WHAT)
  call = require(replicated, "__call__", _NOTE_WHAT)
  notes = this_threads_notes()

  def execute_replicated_call(self, *args):
    out = call(self, *args)
    if out and _marked(self.keepalive):
      note_print_outputs(out)
    hook = getattr(_next_dispatch, "hook", None)
    if hook is not None and any(_get_ident() in n for n in notes):
      _next_dispatch.hook = None
      hook()
    return out

  with patches.lock:
    patches.install(
      "print outputs (Python path)",
      replicated,
      "__call__",
      execute_replicated_call,
    )


_next_dispatch = threading.local()  # .hook: see wait_after_next_dispatch


def wait_after_next_dispatch(hook: Callable[[], None]) -> None:
  """The calling thread's next dispatch through JAX's Python path that
  leaves it a computation to wait for (it prints) calls ``hook()`` once,
  in this thread, before the dispatch returns.  For the call whose
  tracing staged the process's first print: Python looked ``print`` up
  before it evaluated that call, in ``print("label:", f(x))``, so the
  hook makes the dispatch itself wait, as JAX's does (the Python path:
  a first call)."""
  _install_python_path_note()
  _next_dispatch.hook = hook


# ---------------------------------------------------------- waited for
def wait_for_this_threads_computation(timeout: float) -> bool:
  """Waits until the latest computation that prints and that this thread
  dispatched on jit's fast path (its output, :func:`note_print_outputs`)
  has finished, and the latest one that keeps a runtime token (see
  :mod:`.dispatch`: one that prints and returns nothing, or any tapping
  one in the strict-barrier mode), and so every such computation of this
  thread before them (the CPU client runs one thread's computations in
  dispatch order; tokens chain them); at once if there is none or they
  finished.  False if ``timeout`` seconds passed first:
  ``block_until_ready`` has no deadline."""
  ident = _get_ident()
  tokens = _core._latest_tokens
  out = _print_outputs.get(ident)
  token = tokens.get(ident)
  if out is None and token is None:
    return True  # the common case: no clock
  deadline = time.monotonic() + timeout
  if out is not None:
    if not _output_ready(out, deadline):
      return False
    if _print_outputs.get(ident) is out:
      _print_outputs.pop(ident, None)
  if token is None:
    return True
  buf = token._buf
  if buf.is_ready():
    if tokens.get(ident) is token:  # finished: nothing to wait for
      tokens.pop(ident, None)  # (as the barrier forgets it)
    return True
  pause = 1e-5
  while not buf.is_ready():
    if time.monotonic() >= deadline:
      return False
    time.sleep(pause)
    pause = min(pause * 2, 1e-3)
  return True


def _output_ready(arrays: Any, deadline: float) -> bool:
  """Waits until the computation whose outputs are ``arrays`` finished
  (its outputs are ready together): True, or False once ``deadline``
  (``time.monotonic()``) passed first.  Looks at the first output that
  was not deleted; where all were (donated to a computation dispatched
  after, which itself starts only once they are ready), there is nothing
  left to look at, and the print goes on."""
  pause = 1e-5
  while True:
    for array in arrays:
      try:
        ready = array.is_ready()
        break
      except Exception:  # noqa: BLE001  (deleted: donated or deleted since;
        continue  # the computation's own failure reaches its caller)
    else:
      return True
    if ready:
      return True
    if time.monotonic() >= deadline:
      return False
    time.sleep(pause)
    pause = min(pause * 2, 1e-3)
