"""``hostcb.xla_computation``: the XLA HLO of a function, from example args.

JAX removed ``jax.xla_computation``; this module brings it back on current
JAX.  The function is traced (with the named axes of ``axis_env`` bound, so
``psum`` and friends need no ``pmap``), lowered once per replica, and handed
back as an :class:`XlaComputation` whose methods print or serialize the HLO.
Nothing is compiled or sent to a device, so the number of devices of this
machine does not matter, and ``backend='cuda'`` or ``'tpu'`` lowers for
hardware that is not here.

The returned objects wrap XLA's own: every method checks what it is asked
and raises a Python exception on wrong use, where XLA's objects would abort
the interpreter (``tuple_shapes()`` of an array shape, for instance).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Any, Callable, Hashable, Iterable, Sequence

import numpy as np

import jax

from hostcb import _jax_internals as _internals

__all__ = [
  "xla_computation",
  "XlaComputation",
  "ProgramShape",
  "Shape",
  "HloModule",
  "HloComputation",
  "HloInstruction",
  "HloPrintOptions",
]

HloPrintOptions = _internals.HloPrintOptions
"""XLA's options for printing HLO text, for :meth:`HloModule.to_string`.

Legacy code reached it as ``xla_client._xla.HloPrintOptions``, which no
longer exists: ``HloPrintOptions.short_parsable()``, then set attributes
such as ``print_metadata`` or ``print_large_constants``.
"""

#: With ``tuple_args=None``, more positional leaves than this give one tuple.
TUPLE_ARGS_THRESHOLD = 100

_PLATFORMS = ("cpu", "cuda", "rocm", "tpu")


# ------------------------------------------------------------------ shapes
class Shape:
  """The shape of an HLO value: an array, a tuple of shapes, or a token.

  A read-only copy of XLA's ``Shape``; asking an array for its tuple
  elements (or a tuple for its dimensions) raises ``TypeError``.
  """

  def __init__(self, xla_shape: Any):
    self._text = repr(xla_shape)
    self._proto = xla_shape.to_serialized_proto()
    self._xla_type = xla_shape.xla_element_type()
    self._children: tuple[Shape, ...] | None = None
    self._dims: tuple[int, ...] | None = None
    self._dtype: np.dtype | None = None
    if xla_shape.is_tuple():
      self._children = tuple(Shape(s) for s in xla_shape.tuple_shapes())
    elif xla_shape.is_array():
      self._dims = tuple(xla_shape.dimensions())
      self._dtype = np.dtype(xla_shape.numpy_dtype())

  def is_tuple(self) -> bool:
    """True for a tuple shape."""
    return self._children is not None

  def is_array(self) -> bool:
    """True for an array shape."""
    return self._dims is not None

  def tuple_shapes(self) -> list[Shape]:
    """The element shapes of a tuple shape."""
    if self._children is None:
      raise TypeError(f"tuple_shapes() needs a tuple shape; {self} is not one")
    return list(self._children)

  def dimensions(self) -> tuple[int, ...]:
    """The dimension sizes of an array shape."""
    if self._dims is None:
      raise TypeError(f"dimensions() needs an array shape; got {self}")
    return self._dims

  def rank(self) -> int:
    """The number of dimensions of an array shape."""
    return len(self.dimensions())

  def numpy_dtype(self) -> np.dtype:
    """The NumPy dtype of an array shape (``object`` for other shapes)."""
    return self._dtype if self._dtype is not None else np.dtype(object)

  def element_type(self) -> np.dtype:
    """The NumPy element type of an array shape."""
    if self._dtype is None:
      raise TypeError(f"element_type() needs an array shape; got {self}")
    return self._dtype

  def xla_element_type(self) -> Any:
    """XLA's ``PrimitiveType`` of the shape (``TUPLE`` for tuples)."""
    return self._xla_type

  def to_serialized_proto(self) -> bytes:
    """The shape as a serialized XLA ``ShapeProto``."""
    return self._proto

  def __repr__(self) -> str:
    return self._text

  def __eq__(self, other: object) -> bool:
    return isinstance(other, Shape) and self._proto == other._proto

  def __hash__(self) -> int:
    return hash(self._proto)


class ProgramShape:
  """The parameter shapes and the result shape of a computation."""

  def __init__(
    self, xla_program_shape: Any, names: Sequence[str] | None = None
  ):
    self._params = tuple(Shape(s) for s in xla_program_shape.parameter_shapes())
    self._result = Shape(xla_program_shape.result_shape())
    self._text = repr(xla_program_shape)
    if names is not None and len(names) == len(self._params):
      # XLA now calls them p0, p1, ...; legacy: Arg_0, ... or arg_tuple.
      self._text = re.sub(
        r"(^\(|, )p(\d+): ",
        lambda m: f"{m.group(1)}{names[int(m.group(2))]}: ",
        self._text,
      )

  def parameter_shapes(self) -> list[Shape]:
    """One shape per parameter of the entry computation."""
    return list(self._params)

  def result_shape(self) -> Shape:
    """The result shape: a tuple with one element per output leaf."""
    return self._result

  def __repr__(self) -> str:
    return self._text


# ------------------------------------------------------------- HLO module
class HloInstruction:
  """A read-only view of one instruction of an :class:`HloModule`."""

  def __init__(self, xla_instruction: Any, owner: Any):
    self._instruction = xla_instruction
    self._owner = owner  # keeps XLA's module alive

  @property
  def name(self) -> str:
    """The instruction's name, e.g. ``all-reduce.7``."""
    return self._instruction.name

  @property
  def opcode(self) -> Any:
    """XLA's ``HloOpcode`` of the instruction."""
    return self._instruction.opcode

  def operands(self) -> list[HloInstruction]:
    """The instructions whose values this one reads."""
    return [
      HloInstruction(i, self._owner) for i in self._instruction.operands()
    ]

  def users(self) -> list[HloInstruction]:
    """The instructions that read this one's value."""
    return [HloInstruction(i, self._owner) for i in self._instruction.users()]

  def to_string(self) -> str:
    """The instruction as a line of HLO text."""
    return self._instruction.to_string()

  def __repr__(self) -> str:
    return f"<HloInstruction {self.name}>"


class HloComputation:
  """A read-only view of one computation of an :class:`HloModule`."""

  def __init__(self, xla_computation: Any, owner: Any):
    self._computation = xla_computation
    self._owner = owner

  @property
  def name(self) -> str:
    """The computation's name, e.g. ``main.6``."""
    return self._computation.name

  def instructions(self) -> list[HloInstruction]:
    """Its instructions, operands before users."""
    listing = getattr(self._computation, "instructions", None)
    if listing is None:
      raise NotImplementedError(
        "this jaxlib cannot list the instructions of an HLO computation "
        "(jaxlib 0.8 lacks HloComputation.instructions); read "
        "HloModule.to_string() instead"
      )
    return [HloInstruction(i, self._owner) for i in listing()]

  def __repr__(self) -> str:
    return f"<HloComputation {self.name}>"


class HloModule:
  """A read-only view of an HLO module: its text and its computations."""

  def __init__(self, serialized: bytes):
    self._serialized = serialized
    self._module = _internals.xla_computation_from_proto(
      serialized
    ).get_hlo_module()

  @property
  def name(self) -> str:
    """The module name, e.g. ``xla_computation_f``."""
    return self._module.name

  def to_string(self, options: Any = None) -> str:
    """The module as HLO text, printed as ``options`` say.

    ``options`` is XLA's :class:`HloPrintOptions` (also exported by this
    module), e.g. ``HloPrintOptions.short_parsable()`` with
    ``print_metadata = True`` to see the op names of ``jax.named_call``;
    None prints with XLA's defaults.
    """
    if options is None:
      return self._module.to_string()
    if not isinstance(options, HloPrintOptions):
      raise TypeError(
        "HloModule.to_string: options must be an "
        "HloPrintOptions (hostcb.xla_computation.HloPrintOptions,"
        f" XLA's own class) or None; got {options!r}"
      )
    return self._module.to_string(options)

  def computations(self) -> list[HloComputation]:
    """Every computation of the module, the entry computation last."""
    return [
      HloComputation(c, self._module) for c in self._module.computations()
    ]

  def as_serialized_hlo_module_proto(self) -> bytes:
    """The module as a serialized ``HloModuleProto``."""
    return self._serialized

  def __repr__(self) -> str:
    return f"<HloModule {self.name}>"


class XlaComputation:
  """The unoptimized HLO of a function, as ``xla_computation`` builds it.

  The entry computation returns a tuple with one element per output leaf,
  as legacy ``jax.xla_computation`` did.
  """

  def __init__(self, xla_computation: Any):
    self._computation = xla_computation
    self._serialized = xla_computation.as_serialized_hlo_module_proto()

  def name(self) -> str:
    """The module name: ``xla_computation_`` and the function's name."""
    return self._computation.name()

  def as_hlo_text(self, print_large_constants: bool = False) -> str:
    """The HLO text (large constants elided unless asked for)."""
    if not isinstance(print_large_constants, bool):
      raise TypeError(
        f"print_large_constants must be a bool; got {print_large_constants!r}"
      )
    return self._computation.as_hlo_text(print_large_constants)

  def as_serialized_hlo_module_proto(self) -> bytes:
    """The HLO as a serialized ``HloModuleProto``."""
    return self._serialized

  def as_hlo_dot_graph(self) -> str:
    """The entry computation as a Graphviz DOT graph."""
    return self._computation.as_hlo_dot_graph()

  def as_hlo_module(self) -> HloModule:
    """A read-only :class:`HloModule` view of a copy of the HLO."""
    return HloModule(self._serialized)

  get_hlo_module = as_hlo_module

  def program_shape(self) -> ProgramShape:
    """Parameter shapes and result (tuple) shape of the entry computation.

    Its text names the parameters as legacy did (``Arg_0``, ...,
    ``arg_tuple``), after the parameter instructions of the HLO.
    """
    return ProgramShape(
      self._computation.program_shape(), _parameter_names(self.as_hlo_text())
    )

  def hash(self) -> int:
    """XLA's fingerprint of the HLO module."""
    return self._computation.hash()

  def __repr__(self) -> str:
    return f"<hostcb.XlaComputation {self.name()}>"


_PARAMETER = re.compile(
  r"^\s*(?:ROOT )?(\S+?)(?:\.\d+)? = .* parameter\((\d+)\)"
)


def _parameter_names(hlo_text: str) -> list[str]:
  """The entry computation's parameter names, in parameter order."""
  entry = hlo_text[hlo_text.find("\nENTRY ") :]
  found = {}
  for line in entry.splitlines()[1:]:
    if line.startswith("}"):
      break
    match = _PARAMETER.match(line)
    if match:
      found[int(match.group(2))] = match.group(1)
  return [found[i] for i in sorted(found)]


# ------------------------------------------------------ argument checking
def _argnums(value: Any, what: str) -> tuple[int, ...]:
  items = (value,) if isinstance(value, int) else value
  try:
    items = tuple(items)
  except TypeError:
    items = None
  if items is None or not all(
    isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in items
  ):
    raise TypeError(
      f"{what} must be an int or a sequence of ints; got {value!r}"
    )
  return tuple(int(i) for i in items)


def _axis_env(value: Any) -> tuple[tuple[Hashable, int], ...]:
  if value is None:
    return ()
  expected = (
    "axis_env must be a sequence of (axis name, positive size) "
    "pairs, e.g. [('i', 4)]"
  )
  if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
    raise TypeError(f"{expected}; got {value!r}")
  pairs = []
  for item in value:
    if not isinstance(item, (tuple, list)) or len(item) != 2:
      raise TypeError(f"{expected}; got the entry {item!r}")
    name, size = item
    try:
      hash(name)
    except TypeError:
      raise TypeError(
        f"{expected}; the axis name {name!r} is not hashable"
      ) from None
    if (
      isinstance(size, bool)
      or not isinstance(size, (int, np.integer))
      or size < 1
    ):
      raise ValueError(f"{expected}; axis {name!r} has size {size!r}")
    pairs.append((name, int(size)))
  names = [n for n, _ in pairs]
  duplicates = sorted({repr(n) for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(
      f"axis_env names each axis once; {', '.join(duplicates)}"
      f" appears more than once in {value!r}"
    )
  return tuple(pairs)


def _platform(backend: Any) -> str:
  if backend is None:
    return jax.default_backend()
  if not isinstance(backend, str):
    raise TypeError(
      f"backend must be a platform name such as 'cpu', 'gpu' or"
      f" 'tpu', or None; got {backend!r}"
    )
  name = backend.lower()
  if name == "gpu":
    try:
      return jax.devices("gpu")[0].platform
    except RuntimeError:
      return "cuda"  # no GPU here: lower for CUDA, the usual GPU platform
  if name not in _PLATFORMS:
    raise ValueError(
      f"backend must be one of 'cpu', 'gpu', "
      f"{', '.join(repr(p) for p in _PLATFORMS[1:])}; "
      f"got {backend!r}"
    )
  return name


def _positions(
  argnums: tuple[int, ...],
  nargs: int,
  what: str,
  static: tuple[int, ...],
  donate: tuple[int, ...],
) -> set[int]:
  positions = set()
  for i in argnums:
    j = i + nargs if i < 0 else i
    if not 0 <= j < nargs:
      raise ValueError(
        f"jitted function has static_argnums={static}, donate_argnums="
        f"{donate} but was called with only {nargs} positional "
        f"argument{'' if nargs == 1 else 's'}. ({what} refers to argument "
        f"{i}, but the function was given {nargs} positional argument(s))"
      )
    positions.add(j)
  return positions


def _function_name(fun: Callable) -> str:
  while isinstance(fun, functools.partial):
    fun = fun.func
  return getattr(fun, "__name__", type(fun).__name__)


def _module_name(name: str) -> str:
  """``xla_computation_`` and the name, other characters as ``_`` (legacy)."""
  return "xla_computation_" + re.sub(r"[^\w.-]", "_", name)


# ------------------------------------------------------- example arguments
def _is_concrete(leaf: Any) -> bool:
  return isinstance(
    leaf,
    (
      jax.Array,
      np.ndarray,
      np.generic,
      bool,
      int,
      float,
      complex,
      jax.ShapeDtypeStruct,
    ),
  )


def _example(leaf: Any, where: str) -> Any:
  if _is_concrete(leaf):
    return leaf
  if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
    try:
      return jax.ShapeDtypeStruct(tuple(leaf.shape), np.dtype(leaf.dtype))
    except TypeError as e:
      raise TypeError(
        f"{where}: shape {leaf.shape!r} and dtype "
        f"{leaf.dtype!r} do not describe an array ({e})"
      ) from e
  raise TypeError(
    f"Argument {leaf!r} of type {type(leaf)} is not a valid "
    f"JAX type ({where} must be an array, a scalar or an object "
    f"with shape and dtype; got {type(leaf).__name__} {leaf!r})"
  )


def _where(path: tuple) -> str:
  rest = jax.tree_util.keystr(path[2:])
  if path[0].idx == 0:
    return f"argument {path[1].idx}{rest}"
  return f"keyword argument {path[1].key!r}{rest}"


def _examples(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
  leaves, tree = jax.tree_util.tree_flatten_with_path((args, kwargs))
  converted = [_example(leaf, _where(path)) for path, leaf in leaves]
  return jax.tree_util.tree_unflatten(tree, converted)


# --------------------------------------------------------------- in_parts
def _is_tiles(x: Any) -> bool:
  return (
    isinstance(x, tuple)
    and len(x) > 0
    and all(
      isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in x
    )
  )


def _is_spec(x: Any) -> bool:
  return x is None or _is_tiles(x)


class _Repeated:
  """A spec repeated for each leaf of a subtree (a pytree leaf itself)."""

  def __init__(self, spec: Any, count: int):
    self.items = [spec] * count


def _specs_per_leaf(prefix: Any, tree: Any, what: str) -> list:
  def repeat(spec, subtree):
    return _Repeated(spec, len(jax.tree_util.tree_leaves(subtree)))

  try:
    repeated = jax.tree_util.tree_map(repeat, prefix, tree, is_leaf=_is_spec)
  except (ValueError, TypeError) as e:
    raise ValueError(
      f"{what} must be None, a tuple of partition counts (one per "
      "dimension), or a tree of those matching the structure of "
      f"{'the arguments' if what == 'in_parts' else 'the outputs'}; "
      f"got {prefix!r} ({e})"
    ) from e
  return [spec for r in jax.tree_util.tree_leaves(repeated) for spec in r.items]


def _sharding_texts(
  specs: Sequence[Any], avals: Sequence[Any], what: str
) -> list[str]:
  texts = []
  for spec, aval in zip(specs, avals):
    if spec is not None:
      if len(spec) != len(aval.shape) or any(int(n) < 1 for n in spec):
        raise ValueError(
          f"{what}: {spec!r} must give a positive partition count for each "
          f"of the {len(aval.shape)} dimensions of a value of shape "
          f"{tuple(aval.shape)}"
        )
      spec = tuple(int(n) for n in spec)
    texts.append(_internals.tiled_sharding_text(spec))
  return texts


def _partition_count(*spec_lists: Sequence[Any] | None) -> int:
  counts = [
    math.prod(s)
    for specs in spec_lists
    if specs
    for s in specs
    if s is not None
  ]
  return max(counts, default=1)


# --------------------------------------------------------------- the steps
@dataclasses.dataclass(frozen=True, eq=False)
class _Options:
  """The options of one ``xla_computation(fun, ...)``, checked."""

  static: tuple[int, ...]  # static_argnums
  donate: tuple[int, ...]  # donate_argnums
  env: tuple[tuple[Hashable, int], ...]  # axis_env
  platform: str  # backend, resolved
  in_parts: Any
  out_parts: Any
  tuple_args: bool | None
  return_shape: bool
  name: str  # the function's name


@dataclasses.dataclass(frozen=True, eq=False)
class _Traced:
  """A traced call of the function: its jaxpr, its output structure, the
  arguments that are parameters (``dynamic``, in order) and the
  positions of the donated arguments."""

  closed: Any  # the ClosedJaxpr
  out_info: Any  # the outputs, as a pytree of shapes and dtypes
  dynamic: tuple
  dynamic_positions: list[int]
  donate_at: set[int]


def _computation(fun: Callable, options: _Options, args: tuple, kwargs: dict):
  """``xla_computation(fun, ...)(*args, **kwargs)``: traces, lowers per
  replica, annotates the shardings, and wraps XLA's computation."""
  traced = _trace(fun, options, args, kwargs)
  in_avals = traced.closed.in_avals
  donated = _donated(traced)
  shardings = _shardings(options, traced)
  module = _internals.lower_for_replicas(
    traced.closed,
    module_name=_module_name(options.name),
    axis_env=options.env,
    platform=options.platform,
    donated=donated,
  )
  if shardings is not None:
    _internals.annotate_shardings(module, **shardings)
  tupled = (
    len(in_avals) > TUPLE_ARGS_THRESHOLD
    if options.tuple_args is None
    else options.tuple_args
  )
  computation = XlaComputation(
    _internals.to_xla_computation(module, tuple_args=tupled)
  )
  if not options.return_shape:
    return computation
  shapes = jax.tree_util.tree_map(
    lambda o: jax.ShapeDtypeStruct(o.shape, o.dtype), traced.out_info
  )
  return computation, shapes


def _trace(
  fun: Callable, options: _Options, args: tuple, kwargs: dict
) -> _Traced:
  """Traces ``fun`` on the example arguments, the static ones folded in,
  with the axis names of ``axis_env`` bound."""
  nargs = len(args)
  static, donate = options.static, options.donate
  static_at = _positions(static, nargs, "static_argnums", static, donate)
  donate_at = _positions(donate, nargs, "donate_argnums", static, donate)
  if static_at & donate_at:
    raise ValueError(
      "an argument cannot be both static and donated; "
      f"positions {sorted(static_at & donate_at)} are in "
      "static_argnums and donate_argnums"
    )
  dynamic = tuple(a for i, a in enumerate(args) if i not in static_at)
  examples, example_kwargs = _examples(dynamic, kwargs)

  def with_statics(*dyn_args, **dyn_kwargs):
    it = iter(dyn_args)
    full = [args[i] if i in static_at else next(it) for i in range(nargs)]
    return fun(*full, **dyn_kwargs)

  env = options.env
  try:
    with _internals.staging_pmaps():
      closed, out_info = jax.make_jaxpr(
        with_statics, axis_env=list(env) or None, return_shape=True
      )(*examples, **example_kwargs)
  except NameError as e:
    raise _unbound_axis_error(e, env) from e
  dynamic_positions = [i for i in range(nargs) if i not in static_at]
  return _Traced(closed, out_info, dynamic, dynamic_positions, donate_at)


def _unbound_axis_error(e: NameError, env: tuple) -> NameError:
  """JAX's error for an axis name that ``axis_env`` does not bind, with
  legacy's words first."""
  names = [n for n, _ in env]
  match = re.search(r"unbound axis name: (.*?)\. ", str(e))
  legacy = (
    ""
    if match is None
    else (
      f"unbound axis name: {match.group(1)}. The following axis names "
      "(e.g. defined by pmap) are available to collective operations: "
      f"{names}. "
    )
  )
  return NameError(
    f"{legacy}{e} (xla_computation binds the axis names "
    f"of axis_env, here {names})"
  )


def _donated(traced: _Traced) -> list[bool]:
  """Per parameter (leaf of the dynamic arguments, then of the keyword
  arguments), whether its argument is donated."""
  donated = [
    i in traced.donate_at
    for i, a in zip(traced.dynamic_positions, traced.dynamic)
    for _ in jax.tree_util.tree_leaves(a)
  ]
  return donated + [False] * (len(traced.closed.in_avals) - len(donated))


def _shardings(options: _Options, traced: _Traced) -> dict | None:
  """``in_parts`` and ``out_parts`` as the XLA sharding annotations of the
  parameters and results (the arguments of
  :func:`hostcb._jax_internals.annotate_shardings`); None if neither is
  given."""
  in_avals, out_avals = traced.closed.in_avals, traced.closed.out_avals
  arg_texts = result_texts = None
  arg_specs = result_specs = None
  if options.in_parts is not None:
    arg_specs = _specs_per_leaf(options.in_parts, traced.dynamic, "in_parts")
    arg_specs += [None] * (len(in_avals) - len(arg_specs))  # keywords
    arg_texts = _sharding_texts(arg_specs, in_avals, "in_parts")
  if options.out_parts is not None:
    out_tree = jax.tree_util.tree_structure(traced.out_info)
    dummy = jax.tree_util.tree_unflatten(out_tree, [0] * len(out_avals))
    result_specs = _specs_per_leaf(options.out_parts, dummy, "out_parts")
    result_texts = _sharding_texts(result_specs, out_avals, "out_parts")
  if arg_texts is None and result_texts is None:
    return None
  return {
    "args": arg_texts,
    "results": result_texts,
    "num_partitions": _partition_count(arg_specs, result_specs),
  }


def _named_like(maker: Callable, fun: Callable, name: str) -> Callable:
  """``maker`` with ``fun``'s metadata, named ``xla_computation(name)``."""
  try:
    maker = functools.wraps(fun)(maker)
  except (AttributeError, TypeError):  # a callable without function metadata
    pass  # (e.g. a partial): the name below
  maker.__name__ = f"xla_computation({name})"
  maker.__qualname__ = maker.__name__
  return maker


# ------------------------------------------------------------ the function
def xla_computation(
  fun: Callable,
  static_argnums: int | Iterable[int] = (),
  axis_env: Sequence[tuple[Hashable, int]] | None = None,
  in_parts: Any = None,
  out_parts: Any = None,
  backend: str | None = None,
  tuple_args: bool | None = False,
  instantiate_const_outputs: bool | None = None,
  return_shape: bool = False,
  donate_argnums: int | Iterable[int] = (),
) -> Callable:
  """Wraps ``fun`` so that calling it on example arguments gives its HLO.

  ``xla_computation(fun, ...)(*args, **kwargs)`` traces ``fun`` and returns
  an :class:`XlaComputation` (with ``as_hlo_text()``, ``program_shape()``
  and so on).  Example arguments may be arrays, scalars, or any objects
  with ``shape`` and ``dtype`` (``jax.ShapeDtypeStruct``,
  ``types.SimpleNamespace``); nothing is sent to a device.

  Args:
    fun: the function; it may return any pytree of arrays.
    static_argnums: positions of arguments folded in as constants; they
      are not parameters of the computation and need not be arrays.
    axis_env: ``[(name, size), ...]``: named axes that collectives
      (``psum``, ``axis_index``, ``all_gather``, ...) may use, as ``pmap``
      would bind them.  The computation has ``prod(sizes)`` replicas,
      numbered row-major over the axes in the order given.
    in_parts: per positional argument, ``None`` (replicated) or a tuple
      giving into how many pieces each dimension is split; becomes an XLA
      sharding annotation on the parameters.  A single tuple applies to
      every argument.
    out_parts: the same for the outputs.
    backend: platform to lower for: ``'cpu'``, ``'gpu'`` (``'cuda'`` or
      ``'rocm'``) or ``'tpu'``; default: JAX's default backend.  It need
      not be present on this machine.
    tuple_args: pass all parameters as one tuple; ``None`` does so when
      there are more than 100 of them.
    instantiate_const_outputs: accepted for compatibility and ignored
      (legacy JAX had already made it a no-op).
    return_shape: also return the outputs' structure, as a pytree of
      ``jax.ShapeDtypeStruct``.
    donate_argnums: positions of arguments whose buffers the computation
      may reuse; where an output has the same shape and type, the HLO
      records the alias (``input_output_alias``).

  Returns:
    A function of the example arguments that returns an
    :class:`XlaComputation`, or ``(computation, output_shapes)`` when
    ``return_shape`` is true.
  """
  if not callable(fun):
    raise TypeError(
      f"Expected a callable value, got {fun} "
      "(xla_computation expects a callable)"
    )
  static = _argnums(static_argnums, "static_argnums")
  donate = _argnums(donate_argnums, "donate_argnums")
  env = _axis_env(axis_env)
  platform = _platform(backend)
  if tuple_args is not None and not isinstance(tuple_args, bool):
    raise TypeError(
      f"tuple_args must be True, False or None; got {tuple_args!r}"
    )
  del instantiate_const_outputs  # documented as doing nothing
  options = _Options(
    static=static,
    donate=donate,
    env=env,
    platform=platform,
    in_parts=in_parts,
    out_parts=out_parts,
    tuple_args=tuple_args,
    return_shape=return_shape,
    name=_function_name(fun),
  )

  def computation_maker(*args, **kwargs):
    return _computation(fun, options, args, kwargs)

  return _named_like(computation_maker, fun, options.name)
