"""Property-based cases for the harness, generated once per pytest run.

:func:`cases` draws pytrees for ``id_print`` and small programs with taps
from hypothesis strategies, derandomized (a fixed seed, no example
database), so every run and both runners see the same cases: the pytest
process writes them to one JSON file (:func:`write`) and hands that file to
the legacy and the hostcb runner, which rebuild the values and programs in
``s_generated.py``.

JSON forms.  A pytree is ``{"tuple": [...]}``, ``{"list": [...]}``,
``{"dict": [[key, tree], ...]}``, ``{"none": 1}``, ``{"py": "int"|"float"|
"bool", "v": v}`` or an array ``{"dtype": d, "shape": [...], "v": [...]}``
(flat values).  A program is a list of operations on a float32 value:
``["sin"]``, ``["mul", k]``, ``["add", k]``, ``["tap"]``, ``["print"]``,
``["scan", n, ops]``, ``["fori", n, ops]``, ``["cond", ops, ops]``.
"""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

N_PYTREES = 30
N_PROGRAMS = 24

DTYPES = [
  "bool",
  "int8",
  "int32",
  "uint8",
  "uint32",
  "float16",
  "float32",
  "complex64",
]


@st.composite
def arrays(draw):
  dtype = draw(st.sampled_from(DTYPES))
  if draw(st.integers(0, 9)) == 0:
    shape = [draw(st.integers(8, 40))]  # long enough to wrap
  else:
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
  n = math.prod(shape)
  if dtype == "bool":
    vals = draw(st.lists(st.booleans(), min_size=n, max_size=n))
  elif dtype.startswith(("uint",)):
    vals = draw(st.lists(st.integers(0, 250), min_size=n, max_size=n))
  elif dtype.startswith("int"):
    vals = draw(st.lists(st.integers(-100, 100), min_size=n, max_size=n))
  else:  # quarters are exact in every float type
    vals = [
      q / 4
      for q in draw(st.lists(st.integers(-400, 400), min_size=n, max_size=n))
    ]
  return {"dtype": dtype, "shape": shape, "v": vals}


scalars = st.one_of(
  st.integers(-5, 5).map(lambda v: {"py": "int", "v": v}),
  st.integers(-20, 20).map(lambda v: {"py": "float", "v": v / 4}),
  st.booleans().map(lambda v: {"py": "bool", "v": v}),
)

pytrees = st.recursive(
  st.one_of(arrays(), scalars, st.just({"none": 1})),
  lambda children: st.one_of(
    st.lists(children, max_size=4).map(lambda c: {"tuple": c}),
    st.lists(children, max_size=4).map(lambda c: {"list": c}),
    st.dictionaries(st.sampled_from("abcdefgh"), children, max_size=4).map(
      lambda d: {"dict": sorted(d.items())}
    ),
  ),
  max_leaves=8,
)

pytree_cases = st.fixed_dictionaries(
  {
    "tree": pytrees,
    "jit": st.booleans(),
    "threshold": st.one_of(st.none(), st.integers(1, 12)),
    "what": st.one_of(st.none(), st.sampled_from(["w", "a value"])),
  }
)

_leaf_ops = st.one_of(
  st.just(["sin"]),
  st.just(["tap"]),
  st.just(["print"]),
  st.integers(-3, 3).map(lambda k: ["mul", k / 2]),
  st.integers(-3, 3).map(lambda k: ["add", k / 2]),
)

ops = st.recursive(
  st.lists(_leaf_ops, min_size=1, max_size=4),
  lambda inner: st.lists(
    st.one_of(
      _leaf_ops,
      st.tuples(st.just("scan"), st.integers(1, 3), inner).map(list),
      st.tuples(st.just("fori"), st.integers(0, 3), inner).map(list),
      st.tuples(st.just("cond"), inner, inner).map(list),
    ),
    min_size=1,
    max_size=4,
  ),
  max_leaves=10,
)

program_cases = st.fixed_dictionaries(
  {
    "ops": ops,
    "wrap": st.sampled_from(
      ["eager", "jit", "vmap", "jit_vmap", "grad", "jvp", "vmap_grad"]
    ),
    "x": st.lists(
      st.integers(-8, 8).map(lambda v: v / 4), min_size=1, max_size=3
    ),
  }
)


def _draw(strategy, n: int) -> list:
  """The first ``n`` distinct examples of ``strategy`` (fixed seed)."""
  out: list = []
  seen: set = set()

  @settings(
    derandomize=True,
    database=None,
    max_examples=4 * n,
    phases=[Phase.generate],
    deadline=None,
    suppress_health_check=list(HealthCheck),
  )
  @given(strategy)
  def collect(case):
    key = json.dumps(case, sort_keys=True)
    if key not in seen:
      seen.add(key)
      out.append(case)

  collect()
  return out[:n]


def cases() -> dict:
  """``{"pytrees": [...], "programs": [...]}``, the same on every run."""
  return {
    "pytrees": _draw(pytree_cases, N_PYTREES),
    "programs": _draw(program_cases, N_PROGRAMS),
  }


def write(path: str, data: dict) -> None:
  """Writes the cases for the runners."""
  with open(path, "w") as f:
    json.dump(data, f)
