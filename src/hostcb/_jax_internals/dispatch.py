"""Fast dispatch: tapping executables without JAX runtime tokens.

Part of :mod:`hostcb._jax_internals`, the only place that imports ``jax._src``;
checked against jax 0.8.0, 0.10.2 and 0.12.0.1.

hostcb's effect is an ordered JAX effect (:mod:`.core`): a tapping
executable that takes and returns a runtime token orders its taps after
those of the computations dispatched before it and lets ``barrier_wait``
wait for the computations of every thread.  The price is JAX's Python
dispatch path: ``jax.jit`` runs an executable through its C++ fast path
only when the executable has no JAX effect at all
(``pjit._get_fastpath_data``), so such a function pays many times the
dispatch time of the same function without the tap (the figure: README.md's
dispatch table, the ``hostcb_strict_barrier`` row).  That is the
strict-barrier mode (``hostcb_strict_barrier``).

In fast-dispatch mode, the default (:func:`set_fast_dispatch`), for an
executable that runs on one device, the effect stays on every jaxpr, so
that everything that depends on it is unchanged (taps are never dropped
by dead-code elimination, nested ``jit``/``scan``/``cond``/
``while`` and ``checkpoint`` keep them, the token threads through control
flow in program order), but the executable no longer exchanges the token
with the runtime: the lowered ``main`` function creates the effect's token
itself (``stablehlo.create_token``) instead of taking it as an argument,
and drops it from its results.  Inside the computation the taps stay
chained by that token, so they reach the host in program order.  The
executable then declares no effect and ``jax.jit`` dispatches it on its C++
fast path.

Executables over several devices (``pmap``, sharded ``jit``,
``shard_map``) keep their runtime token in both modes: XLA's CPU client
orders them with its own rules for collective launches, and they keep
every guarantee of the default mode.

Why order across computations still holds, and what the barrier covers:
XLA's CPU client runs the one-device computations that one thread
dispatches in the order it dispatched them (a computation starts when the
previous one of that thread has finished); measured for single-device
``jit`` and eager taps on jax 0.8.0 and 0.10.2 (``tests/test_dispatch.py``).
It does not order a one-device computation after a multi-device one, so
in this mode the dispatch of a multi-device computation that taps returns
once that computation has finished (:func:`_wait_in_fast_mode`).  So the
taps of one thread's computations
reach each device's queue in dispatch order, and a computation that the
thread dispatches after them (:func:`drain_this_thread`) finishes only after
they have queued all their taps.  Computations of *different* threads are
not ordered by the CPU client, and without a token nothing records them:
in this mode ``barrier_wait`` (``hostcb._engine.barrier``) waits for the
computations of the calling thread (as ``jax.effects_barrier`` does for
JAX's own effects), for every multi-device one, for those of any thread
whose results are alive (``jax.live_arrays``) and for those that finished;
not for a one-device computation that another thread dispatched, that is
still running and whose results were all dropped.  A computation that a
tap function dispatches keeps its token
(see :mod:`.tap_threads`).
"""

from __future__ import annotations

import functools
import gc
import threading
import weakref
from typing import Any

import numpy as np
from jax._src import stages as _stages
from jax._src.interpreters import pxla as _pxla
from jax._src.interpreters import mlir as _mlir
from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import func as _func
from jax._src.lib.mlir.dialects import hlo as _hlo

from hostcb._jax_internals.array_reads import block_without_hook
from hostcb._jax_internals import core as _core
from hostcb._jax_internals.core import HostCallbackEffect
from hostcb._jax_internals.mesh_context import outside_context_mesh
from hostcb._jax_internals.own_callbacks import is_jax_callback_effect
from hostcb._jax_internals.partitioned import read_taps_in_place
from hostcb._jax_internals.token_removal import drop_lone_tokens, on_cpu
from hostcb._jax_internals import patches
from hostcb._jax_internals import printing_computations as printing
from hostcb._jax_internals.tap_threads import in_tap_function
from hostcb._jax_internals.token_arrays import tokens_as_arrays
from hostcb._jax_internals.versions import check_shape, require

# Fast dispatch is the default (hostcb.config's hostcb_strict_barrier turns
# it off); executables lowered before any change are in this mode.
_fast = [True]
_used = [False]  # an executable was lowered in fast-dispatch mode
# A lowered module's tokens were made arrays (.token_arrays), in place.
_rewritten = [False]


def set_fast_dispatch(on: bool) -> None:
  """Lowers executables in fast-dispatch mode (or not) from now on.

  Clears JAX's compilation caches when the mode changes, so that no
  executable of the other mode is reused.
  """
  if _fast[0] != bool(on):
    _fast[0] = bool(on)
    import jax  # noqa: PLC0415  (public API)

    jax.clear_caches()


def fast_dispatch() -> bool:
  """Whether executables are lowered in fast-dispatch mode now."""
  return _fast[0]


def fast_dispatch_used() -> bool:
  """Whether some executable of this process was lowered in that mode."""
  return _used[0]


# _cached_lowering_to_hlo returns (module, keepalive, host_callbacks,
# unordered_effects, ordered_effects, [nreps on jax 0.8,] tuple_args,
# shape_poly_state): 8 entries on jax 0.8, 7 on 0.10.2 and 0.12.0.1.
_MODULE, _KEEPALIVE, _UNORDERED, _ORDERED = 0, 1, 3, 4
_LOWERING = "jax._src.interpreters.pxla._cached_lowering_to_hlo"
_LOWERING_WHAT = (
  "to lower one-device tapping executables for jit's fast dispatch path"
)


def _checked_lowering(result: Any) -> Any:
  """The tuple that ``_cached_lowering_to_hlo`` returned, once its shape is
  the one hostcb reads by position (else :class:`JaxInternalChanged`
  naming the JAX version and the function)."""
  check_shape(
    result,
    f"the result of {_LOWERING}",
    _LOWERING_WHAT,
    types=tuple,
    lengths=(7, 8),
  )
  check_shape(
    result[_MODULE],
    f"{_LOWERING}(...)[{_MODULE}] (the module)",
    _LOWERING_WHAT,
    types=_ir.Module,
  )
  for i, name in ((_UNORDERED, "unordered"), (_ORDERED, "ordered")):
    check_shape(
      result[i],
      f"{_LOWERING}(...)[{i}] (the {name} effects)",
      _LOWERING_WHAT,
      types=(list, tuple),
    )
  check_shape(
    result[-1],
    f"{_LOWERING}(...)[-1] (the shape_poly_state)",
    _LOWERING_WHAT,
    fields=("dim_vars",),
  )
  return result


def _internalize_token(module: Any, index: int, num_dim_vars: int) -> Any:
  """Makes ``main`` create the token of its ``index``-th ordered effect
  instead of taking it as an argument, and drop it from its results;
  returns that token (the value).

  ``main``'s arguments are the shape variables, then one token per ordered
  effect, then the arrays; its results are one token per ordered effect,
  then the arrays (``mlir.lower_jaxpr_to_fun``).
  """
  main = _main(module)
  arg_pos = num_dim_vars + index
  block = main.regions[0].blocks[0]
  with module.context, _ir.Location.unknown(module.context):
    with _ir.InsertionPoint.at_block_begin(block):
      token = _hlo.create_token()
    block.arguments[arg_pos].replace_all_uses_with(token)
    block.erase_argument(arg_pos)
    ret = list(block.operations)[-1]
    operands = [v for i, v in enumerate(ret.operands) if i != index]
    with _ir.InsertionPoint(ret):
      _func.ReturnOp(operands)
    ret.erase()
    ftype = _ir.FunctionType(main.attributes["function_type"].value)
    inputs = [t for i, t in enumerate(ftype.inputs) if i != arg_pos]
    results = [t for i, t in enumerate(ftype.results) if i != index]
    main.attributes["function_type"] = _ir.TypeAttr.get(
      _ir.FunctionType.get(inputs, results)
    )
    for name, drop in (("arg_attrs", arg_pos), ("res_attrs", index)):
      if name in main.attributes:
        attrs = list(main.attributes[name])
        del attrs[drop]
        main.attributes[name] = _ir.ArrayAttr.get(attrs)
    _shift_aliases(main, index)
  return token


# The argument attribute by which JAX's lowering says that a donated
# argument's buffer becomes the result of that number
# (``mlir.lower_jaxpr_to_fun``; checked on jax 0.8.0, 0.10.2 and 0.12).
_ALIAS = "tf.aliasing_output"


def _shift_aliases(main: Any, dropped: int) -> None:
  """Renumbers the donated arguments' result numbers after result
  ``dropped`` (a token, which nothing aliases) left ``main``'s results: a
  donated buffer must still become the result it was lowered for, not the
  one after it (an error, or a wrong alias where the sizes match)."""
  if "arg_attrs" not in main.attributes:
    return
  changed, attrs = False, []
  for d in main.attributes["arg_attrs"]:
    d = _ir.DictAttr(d)
    if _ALIAS in d:
      alias = _ir.IntegerAttr(d[_ALIAS]).value
      if alias == dropped:
        raise AssertionError(
          f"hostcb: a donated argument aliases the token result {dropped}"
        )
      if alias > dropped:
        entries = {a.name: a.attr for a in d}
        entries[_ALIAS] = _ir.IntegerAttr.get(
          _ir.IntegerType.get_signless(32), alias - 1
        )
        d = _ir.DictAttr.get(entries)
        changed = True
    attrs.append(d)
  if changed:
    main.attributes["arg_attrs"] = _ir.ArrayAttr.get(attrs)


def _main(module: Any) -> Any:
  return next(
    op
    for op in module.body.operations
    if isinstance(op, _func.FuncOp) and op.sym_name.value == "main"
  )


def _leading_tokens(module: Any, num_dim_vars: int) -> int:
  """How many token arguments ``main`` takes after its shape variables."""
  inputs = _ir.FunctionType(
    _main(module).attributes["function_type"].value
  ).inputs[num_dim_vars:]
  n = 0
  while n < len(inputs) and _hlo.TokenType.isinstance(inputs[n]):
    n += 1
  return n


def _returns_arrays(module: Any) -> bool:
  """Whether ``main`` returns an array beside its effects' tokens."""
  results = _ir.FunctionType(
    _main(module).attributes["function_type"].value
  ).results
  return any(not _hlo.TokenType.isinstance(t) for t in results)


def _devices(module: Any) -> int:
  """How many devices a lowered module runs on (replicas x partitions)."""
  attrs = module.operation.attributes
  n = 1
  for name in ("mhlo.num_replicas", "mhlo.num_partitions"):
    if name in attrs:
      n *= _ir.IntegerAttr(attrs[name]).value
  return n


# Executables that print (a print's lowering called
# :func:`.printing_computations.note_awaited_lowered`): the thread's next
# print waits for the latest one it dispatched and for its prints
# (:mod:`hostcb._engine.output_order`).  Decided once per executable, at
# lowering: one that returns arrays stays on jit's fast path, marked
# (:func:`.printing_computations.marked_keepalive`), and each dispatch
# notes its outputs; one that returns nothing keeps its runtime token.

_lowering = threading.local()  # .ordered: see note_ordered_lowered
# Modules whose hostcb effect orders a tap or an effectful call (its
# lowering called note_ordered_lowered), decided at lowering as above.  In
# every other module that has the effect, only pure calls carry it: inside
# the computation their token keeps them in program order with nothing
# (there is no tap), and between computations JAX never ordered them, so
# the module drops the token from its signature in every mode and on any
# number of devices (_order_inside_only): it costs what it cost before
# pure calls carried the effect, and dispatches on jit's fast path.
_ordered_modules: weakref.WeakSet = weakref.WeakSet()


def note_ordered_lowered() -> None:
  """The lowering running in this thread stages a tap or an effectful
  call: its module keeps hostcb's token where the mode says so."""
  _lowering.ordered = getattr(_lowering, "ordered", 0) + 1


def _for_export(args: tuple, kwargs: dict) -> bool:
  """Whether a lowering is ``jax.export``'s (its ``LoweringParameters``
  say so; looked up by type, the argument's position differing between
  versions).  An exported program keeps JAX's signature, its tokens as
  tokens: ``Exported.call`` passes them so (docs/export.md)."""
  for a in (*args, *kwargs.values()):
    if isinstance(a, _mlir.LoweringParameters):
      return bool(getattr(a, "for_export", False))
  return False


def _install() -> None:
  """Wraps ``_cached_lowering_to_hlo`` (the module docstring); installed on
  the first bind of a hostcb primitive (:mod:`.patches`)."""
  original = require(_pxla, "_cached_lowering_to_hlo", _LOWERING_WHAT)
  if patches.is_installed("fast dispatch"):
    return

  def cached_lowering_to_hlo(*args, **kwargs):
    # ``original`` is cached: on a hit it returns the module it returned
    # before, already rewritten if that lowering was made in fast mode.
    awaited_before = printing.awaited_lowerings()
    ordered_before = ordered_lowerings()
    result = _checked_lowering(original(*args, **kwargs))
    if printing.awaited_lowerings() != awaited_before:
      printing.lowered_printing(result[_MODULE])
    if ordered_lowerings() != ordered_before:
      _ordered_modules.add(result[_MODULE])
    ordered = list(result[_ORDERED])
    if not any(isinstance(e, HostCallbackEffect) for e in ordered):
      return result
    module, num_dim_vars = result[_MODULE], len(result[-1].dim_vars)
    if module not in _ordered_modules:
      return _order_inside_only(result, ordered, num_dim_vars, args, kwargs)
    if _devices(module) > 1 and _for_export(args, kwargs):
      return result  # an exported program keeps its tokens as tokens
    if _devices(module) > 1:
      # Keeps its token, as a bool[0] array that jaxlib can serialize
      # (the persistent compilation cache; see .token_arrays).
      _kept_token[0] = _rewritten[0] = True
      with module.context:
        tokens_as_arrays(module, num_dim_vars)
        # Per-shard taps: no copy by XLA before them (.partitioned).
        read_taps_in_place(module)
      return result
    if not _fast[0] or in_tap_function():
      _kept_token[0] = True
      return result
    prints = printing.prints_module(module) and not _for_export(args, kwargs)
    if prints and not _returns_arrays(module):
      # Keeps its token (.printing_computations).  Not a program for
      # jax.export: that one is run by Exported.call, which dispatches it
      # inside a program of its own, and it must carry no JAX effect that
      # export cannot serialize (JAX's IO effect of hostcb's io_callback).
      _kept_token[0] = True
      return result
    # hostcb's io_callback also carries JAX's io_callback effect, and its
    # ordered debug callbacks JAX's ordered debug effect
    # (.own_callbacks), which would keep the executable off the fast path
    # as well; where hostcb's effect is there, the guarantees
    # above hold for the whole executable, so JAX's go too.
    mine = [
      i
      for i, e in enumerate(ordered)
      if isinstance(e, HostCallbackEffect) or is_jax_callback_effect(e)
    ]
    with module.context:
      _used[0] = True
      if _leading_tokens(module, num_dim_vars) == len(ordered):
        tokens = _without_unused(
          [_internalize_token(module, i, num_dim_vars) for i in reversed(mine)]
        )
        if on_cpu(args, kwargs):
          # A lone tap or call: its token orders nothing (.token_removal).
          drop_lone_tokens(module, tokens)
    for i in reversed(mine):
      del ordered[i]
    result = list(result)
    if prints:  # noted at each dispatch (.printing_computations)
      result[_KEEPALIVE] = printing.marked_keepalive(result[_KEEPALIVE])
    result[_ORDERED] = ordered
    result[_UNORDERED] = [
      e for e in result[_UNORDERED] if not is_jax_callback_effect(e)
    ]
    return tuple(result)

  patches.install(
    "fast dispatch",
    _pxla,
    "_cached_lowering_to_hlo",
    cached_lowering_to_hlo,
    before_undo=functools.partial(_forget_rewritten_lowerings, original),
  )


def _without_unused(tokens: list) -> list:
  """Erases the ``create_token`` of each of ``tokens`` that nothing uses
  (JAX's own effects' tokens, which hostcb's callbacks that carry those
  effects do not thread: ``main`` took and returned them only); returns
  the others."""
  used = []
  for token in tokens:
    if list(token.uses):
      used.append(token)
    else:
      token.owner.erase()
  return used


def _order_inside_only(
  result: tuple, ordered: list, num_dim_vars: int, args: tuple, kwargs: dict
) -> tuple:
  """The lowering ``result`` of a module where only pure calls carry
  hostcb's effect (see :data:`_ordered_modules`): ``main`` makes the
  effect's token itself (a lone call's token goes, on CPU) and the
  executable declares no hostcb effect."""
  module = result[_MODULE]
  lone = on_cpu(args, kwargs) and _devices(module) == 1
  result = list(result)
  result[_ORDERED] = without_order_token(module, ordered, num_dim_vars, lone)
  return tuple(result)


def without_order_token(
  module: Any, ordered: list, num_dim_vars: int, lone: bool = False
) -> list:
  """Makes ``main`` of ``module``, whose ordered effects are ``ordered``,
  create hostcb's token itself instead of taking and returning it (with
  ``lone``, a token with one user goes too, :mod:`.token_removal`);
  returns the ordered effects left.  For a module where only pure calls
  carry the effect (their token orders them within the computation
  only).  A module rewritten already (a hit of a cached lowering) is
  left as it is."""
  mine = [i for i, e in enumerate(ordered) if isinstance(e, HostCallbackEffect)]
  with module.context:
    if mine and _leading_tokens(module, num_dim_vars) == len(ordered):
      _rewritten[0] = True
      tokens = [
        _internalize_token(module, i, num_dim_vars) for i in reversed(mine)
      ]
      if lone:
        drop_lone_tokens(module, tokens)
  return [e for i, e in enumerate(ordered) if i not in mine]


def ordered_lowerings() -> int:
  """How many taps and effectful calls this thread's lowerings staged so
  far: a lowering during which it did not change staged none."""
  return getattr(_lowering, "ordered", 0)


def _forget_rewritten_lowerings(original: Any) -> None:
  """Before JAX's own cached lowering (``original``) comes back: the
  modules that the wrapper rewrote (no token argument, or tokens made
  arrays) are still in its cache, beside the effects that JAX's lowering
  gave them (with hostcb's); a later hit would compile a module that does
  not match its calling convention.  So that cache is cleared (JAX's
  caches of compiled executables are not: what they hold is consistent)."""
  if _used[0] or _rewritten[0]:
    require(
      original,
      "cache_clear",
      "to forget the modules it rewrote at hostcb.uninstall()",
      verb="uses",
    )()


patches.when_first_needed(_install)


def _install_aot_guard() -> None:
  """``jit(f).lower(...).compile()`` of a function that keeps hostcb's
  ordered effect (strict mode, several devices) must not be called through
  JAX's C++ path for compiled functions: that path hands the executable
  no runtime token (it leaves out only unordered effects and XLA's Python
  callbacks, and hostcb's taps are neither), so every call after the first
  failed ("Execution supplied 2 arguments but compiled program expected
  3").  Such a compiled function keeps JAX's Python call path, which
  passes the token.  Checked on jax 0.8.0, 0.10.2 and 0.12.0.1
  (``MeshExecutable.create_cpp_call``)."""
  executable = require(
    _pxla, "MeshExecutable", "to keep the runtime token of compiled functions"
  )
  original = require(
    executable,
    "create_cpp_call",
    "to keep the runtime token of compiled functions",
  )
  if patches.is_installed("compiled-call guard"):
    return

  def create_cpp_call(self, params):
    if _keeps_token(self):
      return None  # JAX's Python path, which passes the token
    if printing.prints(self):
      return None  # JAX's Python path, which notes its outputs
    return original(self, params)

  patches.install(
    "compiled-call guard",
    executable,
    "create_cpp_call",
    create_cpp_call,
    before_undo=_settle_compiled_functions,
  )


def _keeps_token(executable: Any) -> bool:
  """Whether a ``MeshExecutable`` exchanges hostcb's runtime token.  An
  executable whose call is not JAX's replicated call (no
  ``ordered_effects``) has none: JAX's own ``create_cpp_call`` decides."""
  call = getattr(executable, "unsafe_call", None)
  return any(
    isinstance(e, HostCallbackEffect)
    for e in getattr(call, "ordered_effects", ())
  )


# Whether an executable that keeps hostcb's runtime token was lowered in
# this process (strict mode, several devices, in a tap function).
_kept_token = [False]
_AOT_WHAT = "to keep compiled functions callable after hostcb.uninstall()"


def _settle_compiled_functions() -> None:
  """Before ``hostcb.uninstall()`` gives JAX its ``create_cpp_call`` back:
  every live compiled function (``jit(f).lower(...).compile()``) whose
  executable keeps hostcb's runtime token and that was never called gets
  JAX's Python call path now, as the guard would have given it at its
  first call; JAX's own ``create_cpp_call`` would give it the C++ path,
  which fails it ("Execution supplied 1 arguments but compiled program
  expected 2").  Looked for only where such an executable was lowered.
  Checked on jax 0.10.2 (``stages.Compiled``: ``_executable``,
  ``_params``, ``_call``; ``Compiled.call(params, *args, **kwargs)``
  returns ``(outs, out_flat, args_flat)``)."""
  if not _kept_token[0]:
    return
  compiled = require(_stages, "Compiled", _AOT_WHAT, verb="uses")
  call = require(compiled, "call", _AOT_WHAT, verb="uses")
  for obj in gc.get_objects():
    # type(), not isinstance(): isinstance reads obj.__class__, which some
    # libraries' lazy or deprecated objects answer with a warning (seen with
    # torch.distributed.reduce_op's FutureWarning).
    if (
      not issubclass(type(obj), compiled)
      or getattr(obj, "_call", 0) is not None
    ):
      continue
    check_shape(
      obj,
      "jax._src.stages.Compiled",
      _AOT_WHAT,
      fields=("_executable", "_params", "_call"),
    )
    if _keeps_token(obj._executable):
      obj._call = functools.partial(_python_call, call, obj._params)


def _python_call(call: Any, params: Any, *args, **kwargs) -> Any:
  """JAX's Python call path of a compiled function: its outputs."""
  result = check_shape(
    call(params, *args, **kwargs),
    "the result of jax._src.stages.Compiled.call",
    _AOT_WHAT,
    types=tuple,
    lengths=(3,),
  )
  return result[0]


patches.when_first_needed(_install_aot_guard)


def _wait_in_fast_mode(token: Any) -> None:
  """After a multi-device computation that keeps its token: in fast mode,
  or in a process that has executables without tokens, wait until it
  finished.

  XLA's CPU client does not run a later one-device computation of the same
  thread after a multi-device one (a pmap's taps and a following jit's
  interleaved on a device, with XLA's Python callbacks), and the one-device
  executables of fast dispatch take no token to wait for.  So the dispatch
  of a pmap, sharded jit or shard_map that taps returns once its device
  work is done (its taps are queued; the tap functions run later), once
  fast dispatch is on or was used.  An error of the computation reaches its
  caller through its results, as always.
  """
  if _fast[0] or _used[0]:
    try:
      # Not a read of a result: the dispatch must not wait for the taps
      # the computation queued (which a read does once a print is staged).
      block_without_hook(token)
    except Exception:  # noqa: BLE001  (reported through the results)
      pass


_core._after_multi_device_dispatch[:] = [_wait_in_fast_mode]


def drain_this_thread() -> None:
  """Returns when every computation that this thread dispatched before the
  call has finished: runs a tiny computation on each local device after
  them (the CPU client runs one thread's computations in dispatch order, a
  GPU its stream's), the CPU's too beside an accelerator, and waits for
  them."""
  import jax  # noqa: PLC0415  (public API)

  noop = _noop()
  # Outside the caller's context mesh (``jax.set_mesh``): jit refuses an
  # argument on a device that the context mesh does not hold, and the
  # little computation runs on each device alone, whatever mesh the user's
  # program runs in.
  with outside_context_mesh():
    outs = [noop(jax.device_put(np.int32(0), d)) for d in local_devices()]
  for out in outs:
    out.block_until_ready()


def local_devices() -> list:
  """The local devices of the default platform and, beside an accelerator,
  the CPU's: a program may tap on both."""
  import jax  # noqa: PLC0415  (public API)

  devices = list(jax.local_devices())
  if devices and devices[0].platform != "cpu":
    try:
      devices += jax.local_devices(backend="cpu")
    except RuntimeError:  # JAX_PLATFORMS without cpu
      pass
  return devices


@functools.cache
def _noop():
  import jax  # noqa: PLC0415  (public API)

  return jax.jit(lambda x: x + 1)


def declares_no_effect(jitted, *args) -> bool:
  """Whether the executable that ``jitted(*args)`` runs declares no JAX
  effect, which ``jax.jit`` needs to dispatch it on its C++ fast path
  (``pjit._get_fastpath_data``).  For tests and benchmarks."""
  call = jitted.lower(*args).compile()._executable.unsafe_call
  return not call.ordered_effects and not call.has_unordered_effects
