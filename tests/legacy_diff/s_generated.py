"""Scenarios built from the generated cases (``generate.py``).

The runner gets the JSON file of cases through ``HOSTCB_DIFF_CASES``; each
case becomes one scenario, ``gen_pytree_NN`` or ``gen_program_NN``.  A
program runs twice, with its taps and with every tap removed, and says
whether both results are identical: taps must never change a value.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import host_callback as hcb

import registry


def build_tree(t):
  """The pytree of a JSON case (see ``generate.py``)."""
  if "tuple" in t:
    return tuple(build_tree(c) for c in t["tuple"])
  if "list" in t:
    return [build_tree(c) for c in t["list"]]
  if "dict" in t:
    return {k: build_tree(v) for k, v in t["dict"]}
  if "none" in t:
    return None
  if "py" in t:
    return {"int": int, "float": float, "bool": bool}[t["py"]](t["v"])
  return np.array(t["v"], dtype=jnp.dtype(t["dtype"])).reshape(t["shape"])


def _pytree_scenario(case):
  def run(ctx):
    tree = build_tree(case["tree"])
    kw = {} if case["what"] is None else {"what": case["what"]}
    leaves, treedef = jax.tree_util.tree_flatten(tree)

    def f(*leaves):
      return hcb.id_print(
        treedef.unflatten(leaves), threshold=case["threshold"], **kw
      )

    return (jax.jit(f) if case["jit"] else f)(*leaves)

  return run


def build_program(ops, ctx, taps: bool):
  """The function ``x -> ...`` of a list of operations."""

  def apply(ops, x):
    for op in ops:
      kind = op[0]
      if kind == "sin":
        x = jnp.sin(x)
      elif kind == "mul":
        x = x * op[1]
      elif kind == "add":
        x = x + op[1]
      elif kind == "tap":
        x = hcb.id_tap(ctx.tap, x) if taps else x
      elif kind == "print":
        x = hcb.id_print(x, what="p", output_stream=ctx) if taps else x
      elif kind == "scan":
        x = lax.scan(
          lambda c, _, b=op[2]: (apply(b, c), None), x, None, length=op[1]
        )[0]
      elif kind == "fori":
        x = lax.fori_loop(0, op[1], lambda i, c, b=op[2]: apply(b, c), x)
      elif kind == "cond":
        x = lax.cond(
          jnp.sum(x) > 0,
          lambda v, b=op[1]: apply(b, v),
          lambda v, b=op[2]: apply(b, v),
          x,
        )
    return x

  return lambda x: apply(ops, x)


def _wrap(f, wrap):
  def total(x):
    return jnp.sum(f(x))

  return {
    "eager": f,
    "jit": jax.jit(f),
    "vmap": jax.vmap(f),
    "jit_vmap": jax.jit(jax.vmap(f)),
    "grad": jax.grad(total),
    "jvp": lambda x: jax.jvp(f, (x,), (jnp.ones_like(x),)),
    "vmap_grad": jax.vmap(jax.grad(f)),
  }[wrap]


def _program_scenario(case):
  def run(ctx):
    x = np.array(case["x"], np.float32)
    with_taps = _wrap(build_program(case["ops"], ctx, True), case["wrap"])(x)
    hcb.barrier_wait()
    ctx.show("result", with_taps)
    without = _wrap(build_program(case["ops"], ctx, False), case["wrap"])(x)
    same = jax.tree_util.tree_all(
      jax.tree_util.tree_map(
        lambda a, b: np.array_equal(
          np.asarray(a), np.asarray(b), equal_nan=True
        ),
        with_taps,
        without,
      )
    )
    ctx.log("same without taps:", same)

  return run


def register(cases: dict) -> None:
  """Registers one scenario per generated case."""
  for i, case in enumerate(cases["pytrees"]):
    registry.add(f"gen_pytree_{i:02d}", _pytree_scenario(case), __name__)
  for i, case in enumerate(cases["programs"]):
    registry.add(f"gen_program_{i:02d}", _program_scenario(case), __name__)


if os.environ.get("HOSTCB_DIFF_CASES"):
  with open(os.environ["HOSTCB_DIFF_CASES"]) as _f:
    register(json.load(_f))
