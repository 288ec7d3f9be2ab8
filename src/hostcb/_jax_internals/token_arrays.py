"""Runtime tokens of multi-device executables as ``bool[0]`` arrays.

Part of :mod:`hostcb._jax_internals`, the only place that imports
``jax._src``; checked against jax 0.8.0 and 0.10.2, and for 0.12.0.1 by
CI's ``make check-newest`` (Python >= 3.12; not on this machine) (the layout
of the lowered ``main`` that ``mlir.lower_jaxpr_to_fun`` makes: shape
variables, then one token per ordered effect, then the arrays; its
results: one token per ordered effect, then the arrays).

A computation over several devices with hostcb's ordered effect
(``shard_map``, ``pmap``, a sharded ``jit`` with a per-shard tap) keeps
JAX's runtime token (:mod:`.dispatch`): its ``main`` takes and returns a
``!stablehlo.token``.  jaxlib cannot serialize such an executable: the
persistent compilation cache's write (``compilation_cache.
put_executable_and_time``, which calls the executable's ``serialize``)
dies with SIGSEGV in ``xla::Layout::ToProto``, called from
``PjRtExecutable::CommonMetadata::Serialize`` for the entry's parameter
and result layouts, which a token parameter of an SPMD executable does
not have (its ``get_parameter_layouts`` says "doesn't support token
parameters"; seen on jax 0.10.2; a one-device executable with a token
serializes).  JAX's own callbacks never meet this: JAX refuses its ordered
effects on several devices, and an executable with XLA's Python callbacks
is never written to the cache.

The runtime already hands the token to the executable as a ``bool[0]``
array (``dispatch.RuntimeTokenSet``) and gets one back.  So
:func:`tokens_as_arrays` gives ``main`` exactly that: a ``tensor<0xi1>``
argument and result in place of each token.  Inside, ``main`` makes the
effect's token (``stablehlo.create_token``), which chains the taps in
program order as before.  What the token ordered between computations
is unchanged: an executable starts only once its arguments are ready
(the previous computation's token array among them), and its results,
the new token array among them, are ready once it has run, taps and
calls included.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax._src.lib.mlir import ir as _ir
from jax._src.lib.mlir.dialects import func as _func
from jax._src.lib.mlir.dialects import hlo as _hlo

from hostcb._jax_internals.versions import require

__all__ = ["tokens_as_arrays"]

_WHAT = (
  "to pass the runtime token of a computation over several devices "
  "that taps as a bool[0] array (serializable executables)"
)


def _main(module: Any) -> Any:
  return next(
    op
    for op in module.body.operations
    if isinstance(op, _func.FuncOp) and op.sym_name.value == "main"
  )


def tokens_as_arrays(module: Any, num_dim_vars: int) -> int:
  """Turns the leading token arguments and results of ``module``'s
  ``main`` (after its ``num_dim_vars`` shape variables) into
  ``tensor<0xi1>``; returns how many it turned (0 when there are none, as
  for a module that was turned already: JAX's lowering cache returns the
  same module again)."""
  main = _main(module)
  ftype = _ir.FunctionType(main.attributes["function_type"].value)
  inputs, results = list(ftype.inputs), list(ftype.results)
  n = 0
  while num_dim_vars + n < len(inputs) and _hlo.TokenType.isinstance(
    inputs[num_dim_vars + n]
  ):
    n += 1
  if n == 0:
    return 0
  if len(results) < n or not all(
    _hlo.TokenType.isinstance(t) for t in results[:n]
  ):
    raise AssertionError(
      f"hostcb: main takes {n} tokens but does not return them first"
    )
  block = main.regions[0].blocks[0]
  with module.context, _ir.Location.unknown(module.context):
    array_type = _ir.RankedTensorType.get([0], _ir.IntegerType.get_signless(1))
    with _ir.InsertionPoint.at_block_begin(block):
      for i in range(n):
        arg = block.arguments[num_dim_vars + i]
        arg.replace_all_uses_with(_hlo.create_token())
        require(type(arg), "set_type", _WHAT, verb="uses")(arg, array_type)
    ret = list(block.operations)[-1]
    with _ir.InsertionPoint(ret):
      empty = _hlo.constant(
        _ir.DenseElementsAttr.get(np.zeros((0,), np.bool_), type=array_type)
      )
      operands = [empty] * n + list(ret.operands)[n:]
      _func.ReturnOp(operands)
    ret.erase()
    for i in range(n):
      inputs[num_dim_vars + i] = array_type
      results[i] = array_type
    main.attributes["function_type"] = _ir.TypeAttr.get(
      _ir.FunctionType.get(inputs, results)
    )
    # The tokens' attributes (``jax.token``) go with them.
    for name, first in (("arg_attrs", num_dim_vars), ("res_attrs", 0)):
      if name in main.attributes:
        attrs = list(main.attributes[name])
        for i in range(first, first + n):
          attrs[i] = _ir.DictAttr.get({})
        main.attributes[name] = _ir.ArrayAttr.get(attrs)
  return n
