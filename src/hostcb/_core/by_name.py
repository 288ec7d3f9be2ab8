"""Host functions by name: the internals of :mod:`hostcb.named`.

A tap or call of a registered function (:func:`hostcb.register`) is
lowered by name: to the versioned custom calls ``hostcb_tap_v1`` /
``hostcb_call_v1``, whose two string attributes are

* ``name``: the registered name (``""`` for the printing functions);
* ``spec``: a JSON text saying how the function is called
  (:func:`spec_of`): the structure of its argument and results, the
  result shapes and dtypes, the transforms applied (``vmap``, ``grad``)
  and the options of the front end.

Here are the table of names (:func:`bind`, :func:`lookup`,
:func:`name_of`), the specs and how a front end's host function is
rebuilt from one (:func:`define_kind`), and this process's target ids of
``(name, spec)`` (:func:`target_id`).  The engine's handlers by name ask
:func:`resolve` once per ``(name, spec)`` and process: a name that is not
bound fails the computation with an error that names it.
"""

from __future__ import annotations

import json
import threading
import types
import warnings
from typing import Any, Callable

import jax
import numpy as np

from hostcb import _engine as engine
from hostcb import _jax_internals as ji
from hostcb._core.engine_entries import native_call_entry, prints_lowered
from hostcb._core.host_function import HostFunction
from hostcb._core.primitives import (
  CallTarget,
  Prints,
  TapTarget,
  unpack_transforms,
)
from hostcb._engine import host_functions

# The version of the spec's format; the targets' names carry it too.
SPEC_VERSION = 1

# ------------------------------------------------------------ the names
_functions: dict[str, Callable] = {}
_lock = threading.Lock()


class UnboundNameError(LookupError):
  """A program calls a host function by a name that no function is
  registered under in this process."""

  __module__ = "hostcb.named"


def bind(name: str, fn: Callable) -> bool:
  """Binds ``name`` to ``fn``, the newest last (:func:`name_of`'s order);
  returns whether ``name`` was bound before."""
  with _lock:
    rebound = _functions.pop(name, None) is not None
    _functions[name] = fn
  return rebound


def registered() -> dict[str, Callable]:
  """``name -> function`` of the host functions registered so far."""
  return dict(_functions)


def lookup(name: str) -> Callable:
  """The function registered under ``name``, or :class:`UnboundNameError`."""
  fn = _functions.get(name)
  if fn is None:
    raise UnboundNameError(
      f"hostcb: no host function is registered under the name {name!r} in "
      f"this process; call hostcb.register({name!r}, fn) before running a "
      "program that names it"
    )
  return fn


def name_of(fn: Any) -> str | None:
  """The name ``fn`` was registered under last, or None."""
  for name, f in reversed(list(_functions.items())):
    if f is fn or (type(fn) is types.MethodType and f == fn):
      return name
  return None


# ------------------------------------------------------------ the spec
class NotExportable(ValueError):
  """What a function by name needs cannot be written down (a custom
  pytree node, a host-side argument that is not a JSON scalar); ``name``:
  the registered name, where the one that raises knows it."""

  def __init__(self, reason: str, name: str = ""):
    super().__init__(reason)
    self.name = name


class NotExportableWarning(UserWarning):
  """A registered function's tap or call is lowered by process-local id:
  what it needs cannot be written down in the program, which therefore
  cannot be exported, cached for other processes or serialized."""

  __module__ = "hostcb.named"


_warned: set = set()


def _by_id_because(name: str, e: NotExportable) -> None:
  """Lowered by id: says so, once per name and reason, where the user
  registered the function (and so meant it to travel)."""
  name = name or e.name
  if name and (name, str(e)) not in _warned:
    _warned.add((name, str(e)))
    warnings.warn(
      f"hostcb: the host function registered as {name!r} is lowered by a "
      f"process-local id, not by its name, here: it needs {e}, which a "
      "program by name cannot carry; this program cannot be exported or "
      "run in another process (docs/export.md)",
      NotExportableWarning,
      stacklevel=2,
    )


def warn_not_by_name(name: str, reason: str) -> None:
  """The lowering could not use the function by name for ``reason``: says
  so, once (see :class:`NotExportableWarning`)."""
  if name:
    _by_id_because(name, NotExportable(reason))


def json_scalar(value: Any) -> bool:
  """Whether a spec can hold ``value`` as it is (and give it back): not an
  instance of a subclass (a NumPy ``str_``, an ``IntEnum``), which would
  come back as its base class, without its own methods."""
  return value is None or type(value) in (str, int, float, bool)


def tree_to_json(treedef) -> Any:
  """A pytree structure of tuples, lists, dicts and None as JSON: a leaf is
  ``"*"``, None ``null``, a list a list, a tuple ``{"t": [...]}`` and a
  dict ``{"d": [[key, value], ...]}``."""
  skeleton = treedef.unflatten([_Leaf()] * treedef.num_leaves)

  def encode(x):
    if isinstance(x, _Leaf):
      return "*"
    if x is None:
      return None
    if type(x) is tuple:
      return {"t": [encode(v) for v in x]}
    if type(x) is list:
      return [encode(v) for v in x]
    if type(x) is dict:
      pairs = []
      for k, v in x.items():
        if not isinstance(k, (str, int)) or isinstance(k, bool):
          raise NotExportable(
            f"a dict key {k!r} (a program holds str and int keys)"
          )
        pairs.append([k, encode(v)])
      return {"d": pairs}
    raise NotExportable(
      f"a pytree node of type {type(x).__name__} (a "
      "program holds tuples, lists, dicts and None)"
    )

  encoded = encode(skeleton)
  if tree_from_json(encoded) != treedef:
    raise NotExportable(f"the pytree structure {treedef}")
  return encoded


def tree_json_of(treedef, name: str) -> Any:
  """:func:`tree_to_json` for the function registered as ``name``."""
  try:
    return tree_to_json(treedef)
  except NotExportable as e:
    raise NotExportable(str(e), name) from None


class _Leaf:
  """A leaf marker for :func:`tree_to_json` (not a pytree node)."""


def tree_from_json(encoded: Any):
  """The pytree structure that :func:`tree_to_json` wrote."""

  def decode(x):
    if x == "*":
      return 0
    if x is None:
      return None
    if isinstance(x, list):
      return [decode(v) for v in x]
    if "t" in x:
      return tuple(decode(v) for v in x["t"])
    return {k: decode(v) for k, v in x["d"]}

  return jax.tree_util.tree_structure(decode(encoded))


def _transforms_to_json(transforms: tuple) -> list:
  return [
    [name, list(dims) if name == "batch" else None] for name, dims in transforms
  ]


def _transforms_from_json(encoded: list) -> tuple:
  return tuple(
    (name, tuple(dims) if name == "batch" else None) for name, dims in encoded
  )


def dumps(spec: dict) -> str:
  """A spec's text: its JSON, the same for the same spec."""
  return json.dumps(spec, sort_keys=True, separators=(",", ":"))


def _function(func: Any) -> tuple[str, dict] | None:
  """``(name, description)`` of what the engine calls: a registered
  function as it is, or a front end's wrapper that describes itself
  (:meth:`HostFunction.export
  <hostcb._core.host_function.HostFunction.export>`), or None (not by
  name)."""
  if isinstance(func, HostFunction):
    return func.export()
  name = name_of(func)
  return None if name is None else (name, {"kind": "function"})


def _tap_fields(target: TapTarget, transforms: tuple) -> dict:
  return {
    "op": "tap",
    "tree": tree_to_json(target.treedef),
    "with_device": bool(target.with_device),
    "prints": target.prints is not Prints.NOTHING,
    "partitioned": bool(target.partitioned),
    "transforms": _transforms_to_json(transforms),
  }


def _call_fields(target: CallTarget) -> dict:
  return {
    "op": "call",
    "in_tree": tree_to_json(target.in_treedef),
    "out_tree": tree_to_json(target.out_treedef),
    "results": [
      [list(a.shape), np.dtype(a.dtype).name] for a in target.result_avals
    ],
    "with_device": bool(target.with_device),
    # JAX's callbacks (rules) fail their computation only; legacy's
    # call also reports to the next barrier_wait.
    "barrier": target.rules is None,
  }


def spec_of(
  target: TapTarget | CallTarget, transforms: tuple = ()
) -> tuple[str, str] | None:
  """``(name, spec)`` of a tap (with its ``transforms``) or call of a
  function by name, or None: lowered by id (not registered, or what
  cannot be written down)."""
  name = ""
  try:
    described = _function(target.func)
    if described is None:
      return None
    name, fn = described
    if type(target) is TapTarget:
      fields = _tap_fields(target, transforms)
    else:
      fields = _call_fields(target)
    text = dumps({"v": SPEC_VERSION, "fn": fn, **fields})
  except NotExportable as e:  # lowered by id, as an unregistered function
    return _by_id_because(name, e)
  return name, text


def note_by_id(target: TapTarget, reason: str) -> None:
  """A tap that the lowering keeps by id for ``reason``: warns if its
  function is registered (see :class:`NotExportableWarning`)."""
  try:
    described = _function(target.func)
  except NotExportable as e:
    described = (e.name, None)
  if described is not None and described[0]:
    _by_id_because(described[0], NotExportable(reason))


# --------------------------------------------- rebuilding from a spec
# kind -> build(name, description, spec) -> what the engine calls, for
# wrappers of front ends (they add theirs: define_kind).
_kinds: dict[str, Callable[[str, dict, dict], Any]] = {
  "function": lambda name, fn, spec: lookup(name),
}


def define_kind(kind: str, build: Callable[[str, dict, dict], Any]) -> None:
  """Adds how a front end's wrapper is rebuilt from its description."""
  _kinds[kind] = build


class _ExportedRules:
  """The ``rules`` of a call rebuilt from a spec of JAX's callbacks: only
  its presence matters at run time (a failure is not kept for the
  barrier); transformations were applied before the program was made."""

  effects = ()


def result_avals_of(spec: dict) -> tuple:
  """The result avals that a call spec describes."""
  return tuple(
    ji.ShapedArray(tuple(shape), jax.numpy.dtype(dtype))
    for shape, dtype in spec["results"]
  )


def _build(name: str, spec: dict) -> Any:
  fn = spec["fn"]
  build = _kinds.get(fn["kind"])
  if build is None:
    raise ValueError(
      f"hostcb: the program calls {name!r} as a host function "
      f"of kind {fn['kind']!r}, which this hostcb does not know"
    )
  return build(name, fn, spec)


def _tap_entry(name: str, spec: dict) -> Any:
  target = TapTarget(
    _build(name, spec),
    tree_from_json(spec["tree"]),
    spec["with_device"],
    prints=Prints.MAYBE if spec["prints"] else Prints.NOTHING,
    partitioned=spec["partitioned"],
  )
  return target.entry(
    unpack_transforms(_transforms_from_json(spec["transforms"]))
  )


def _version(spec: Any) -> Any:
  return spec.get("v") if isinstance(spec, dict) else None


def call_target(name: str, spec: dict) -> CallTarget:
  """The :class:`CallTarget` that a call spec describes."""
  return CallTarget(
    _build(name, spec),
    tree_from_json(spec["in_tree"]),
    tree_from_json(spec["out_tree"]),
    result_avals_of(spec),
    spec["with_device"],
    None if spec["barrier"] else _ExportedRules(),
  )


def _parse(name: str, text: str) -> dict:
  try:
    spec = json.loads(text)
  except ValueError as e:
    raise ValueError(
      f"hostcb: the program calls {name!r} with a spec that "
      f"is not JSON ({e}): {text[:200]!r}"
    ) from e
  if not isinstance(spec, dict) or spec.get("v") != SPEC_VERSION:
    raise ValueError(
      f"hostcb: the program calls {name!r} with a spec of "
      f"version {_version(spec)!r}; this hostcb reads "
      f"version {SPEC_VERSION}"
    )
  return spec


def _handlers_value(tid: int, spec: dict) -> int:
  """What the handlers by name learn of ``(name, spec)``: the target id,
  and whether the call's result is one array (``hostcb_call_one``'s
  way)."""
  return tid * 2 + int(_one_array(spec))


def target_id(name: str, text: str) -> int:
  """This process's target id of ``(name, spec)``, its entry built from the
  function bound to ``name`` (again at each rebinding); the handlers by
  name learn it."""
  spec = _parse(name, text)
  value = lambda tid: _handlers_value(tid, spec)
  if spec["op"] == "tap":
    install = lambda tid: host_functions.put_tap(tid, _tap_entry(name, spec))
    tid = engine.named_target_id(name, text, install, value)
    if spec["prints"]:  # host reads wait for such prints
      prints_lowered(tid)
    return tid

  def install_call(tid):
    host_functions.put_call(tid, native_call_entry(call_target(name, spec)))

  return engine.named_target_id(name, text, install_call, value)


def _one_array(spec: dict) -> bool:
  """Whether a call's result is one array (``hostcb_call_one``'s way)."""
  return (
    spec["op"] == "call"
    and len(spec["results"]) == 1
    and spec["out_tree"] == "*"
  )


def resolve(name: str, text: str) -> int:
  """The handlers' question, once per (name, spec) and process: raises
  :class:`UnboundNameError` for a name that is not bound."""
  if name:  # "": a printing function, which needs none
    lookup(name)
  try:
    return _handlers_value(target_id(name, text), _parse(name, text))
  except (KeyError, TypeError, IndexError) as e:  # a malformed spec
    raise ValueError(
      f"hostcb: the program calls {name!r} with a spec that "
      f"this hostcb cannot read ({type(e).__name__}: {e}): "
      f"{text[:200]!r}"
    ) from e


# The handlers by name ask it, once per (name, spec) and process.
engine.set_name_resolver(resolve)
