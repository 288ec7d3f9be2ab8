"""The package's layout rules: no import cycles among hostcb's modules, and
``jax._src`` used only inside ``hostcb._jax_internals``.

Imports are read from the source (module level and inside functions
alike), so a cycle hidden in a function-level import counts too.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

_SRC = pathlib.Path(__file__).resolve().parent.parent / "src"


def _modules() -> dict[str, pathlib.Path]:
  mods = {}
  for path in sorted(_SRC.rglob("*.py")):
    parts = list(path.relative_to(_SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts = parts[:-1]
    mods[".".join(parts)] = path
  return mods


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
  """The modules of ``known`` that module ``name`` imports."""
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names if a.name in known)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        up = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
      for a in node.names:
        full = f"{base}.{a.name}"
        if full in known:
          found.add(full)  # a submodule
        elif base in known:
          found.add(base)  # a name defined in the module
  found.discard(name)
  return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  state: dict[str, int] = {}
  stack: list[str] = []

  def visit(n):
    state[n] = 1
    stack.append(n)
    for m in sorted(graph[n]):
      if state.get(m) == 1:
        return stack[stack.index(m) :] + [m]
      if m not in state:
        found = visit(m)
        if found:
          return found
    stack.pop()
    state[n] = 2
    return None

  for n in sorted(graph):
    if n not in state:
      found = visit(n)
      if found:
        return found
  return None


def test_hostcb_has_no_import_cycles():
  mods = _modules()
  graph = {n: _imports(n, p, set(mods)) for n, p in mods.items()}
  assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_library_never_imports_the_tools():
  # hostcb.tools (the `hostcb` command) sits on top of the library;
  # `hostcb.__main__` is the command's entry point.
  mods = _modules()
  users = sorted(
    n
    for n, p in mods.items()
    if not n.startswith("hostcb.tools")
    and n != "hostcb.__main__"
    and any(m.startswith("hostcb.tools") for m in _imports(n, p, set(mods)))
  )
  assert users == []


def test_the_cycle_finder_finds_a_cycle():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


def _private_jax_uses(path: pathlib.Path) -> list[str]:
  """``import jax._src...``, ``from jax._src... import``,
  ``importlib.import_module("jax._src...")`` and ``jax._src`` attribute
  chains in a module's code (docstrings, comments and logger names such as
  ``logging.getLogger("jax._src.callback")`` are not uses)."""
  uses = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      uses += [a.name for a in node.names if a.name.startswith("jax._src")]
    elif isinstance(node, ast.ImportFrom):
      if (node.module or "").startswith("jax._src") or (
        node.module == "jax" and any(a.name == "_src" for a in node.names)
      ):
        uses.append(f"from {node.module} import ...")
    elif isinstance(node, ast.Attribute) and node.attr == "_src":
      if isinstance(node.value, ast.Name) and node.value.id == "jax":
        uses.append("jax._src")
    elif (
      isinstance(node, ast.Call)
      and node.args
      and isinstance(node.args[0], ast.Constant)
      and isinstance(node.args[0].value, str)
      and node.args[0].value.startswith("jax._src")
      and getattr(node.func, "attr", getattr(node.func, "id", ""))
      in ("import_module", "__import__")
    ):
      uses.append(node.args[0].value)
  return uses


def test_the_private_use_finder_finds_each_kind_of_use(tmp_path):
  f = tmp_path / "m.py"
  f.write_text(
    '"""jax._src in a docstring"""\n'
    "import jax._src.core\n"
    "from jax._src import dispatch\n"
    "import jax\n"
    "x = jax._src.api\n"
    "import importlib\n"
    "importlib.import_module('jax._src.pjit')\n"
    "import logging\n"
    "logging.getLogger('jax._src.callback')\n"
  )
  assert sorted(_private_jax_uses(f)) == sorted(
    ["jax._src.core", "from jax._src import ...", "jax._src", "jax._src.pjit"]
  )


@pytest.mark.parametrize(
  "name",
  sorted(n for n in _modules() if not n.startswith("hostcb._jax_internals")),
)
def test_only_jax_internals_imports_jax_private_modules(name):
  assert _private_jax_uses(_modules()[name]) == [], name


def test_importing_hostcb_imports_neither_progress_nor_tqdm():
  # hostcb.progress sits on top of the library, beside hostcb.tools: the
  # package exposes it as a lazy attribute, and tqdm is an optional
  # dependency (hostcb[progress]).
  from _helpers import run_python

  r = run_python(
    "import sys, hostcb\n"
    "print(sorted(m for m in ('tqdm', 'hostcb.progress')\n"
    "             if m in sys.modules))"
  )
  assert (r.returncode, r.stdout) == (0, "[]\n"), r.stderr


def test_the_library_never_imports_progress():
  mods = _modules()
  users = sorted(
    n
    for n, p in mods.items()
    if not n.startswith(("hostcb.tools", "hostcb.progress"))
    and "hostcb.progress" in _imports(n, p, set(mods))
  )
  assert users == []


# ------------------------------------------- C++ functions under 100 lines
# Every function of the engine's C++ (src/hostcb/_native) and of its test
# build and benchmarks (tests/native) is at most this many lines long,
# from the first line of its signature to its closing brace.
_MAX_CXX_FUNCTION_LINES = 100
_CXX_DIRS = (_SRC / "hostcb" / "_native", _SRC.parent / "tests" / "native")
# (file, function) over the limit until the branch that splits it lands.
_LONG_CXX_FUNCTIONS_ALLOWED: set = set()
# What holds no code: comments, string and character literals, and
# preprocessor lines (with their continuations).
_CXX_NOT_CODE = re.compile(
  r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'"
  r"|^[ \t]*#(?:[^\n]*\\\n)*[^\n]*",
  re.DOTALL | re.MULTILINE,
)


def _cxx_code(text: str) -> str:
  """``text`` with what holds no code blanked (its newlines kept, so that
  line numbers stay)."""
  return _CXX_NOT_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def _cxx_block_kind(header: str) -> str:
  """What the brace after ``header`` (the code since the previous ``;``,
  ``{`` or ``}``) opens at namespace or class scope: "scope" (a namespace,
  class, struct or union, whose members are looked into), "function", or
  "other" (an initializer, an enum)."""
  flat = " ".join(header.split())
  while True:  # each parenthesized group emptied, innermost first
    emptied = re.sub(r"\([^()]*\)", "()", flat)
    if emptied == flat:
      break
    flat = emptied
  before_call = flat.split("(")[0]
  if re.match(r"(inline )?namespace\b|extern\b", flat):
    return "scope"
  if re.search(r"\benum\b", before_call):
    return "other"
  if re.search(r"\b(class|struct|union)\b", before_call):
    return "scope"
  if "()" in flat and "=" not in re.sub(r"operator\W+", "", flat):
    return "function"
  return "other"


def cxx_functions(text: str) -> list[tuple[str, int, int]]:
  """(name, first line, last line) of each function that ``text`` (C++)
  defines at namespace or class scope; a lambda or a local class is part
  of its function."""
  code = _cxx_code(text)
  found = []
  open_blocks = []  # (kind, first line, name) per open brace
  header_start = 0
  for m in re.finditer(r"[;{}]", code):
    if m.group() == "{":
      header = code[header_start : m.start()]
      nested = any(kind != "scope" for kind, _, _ in open_blocks)
      kind = "other" if nested else _cxx_block_kind(header)
      first = header_start + len(header) - len(header.lstrip())
      name = re.search(r"([~\w:]+)\s*\(", header)
      open_blocks.append(
        (kind, code.count("\n", 0, first) + 1, name and name.group(1))
      )
    elif m.group() == "}" and open_blocks:
      kind, first_line, name = open_blocks.pop()
      if kind == "function":
        found.append((name, first_line, code.count("\n", 0, m.start()) + 1))
    header_start = m.end()
  return found


def _long_cxx_functions() -> list[str]:
  long = []
  for folder in _CXX_DIRS:
    for path in sorted([*folder.glob("*.cc"), *folder.glob("*.h")]):
      for name, first, last in cxx_functions(path.read_text()):
        lines = last - first + 1
        if (
          lines > _MAX_CXX_FUNCTION_LINES
          and (path.name, name) not in _LONG_CXX_FUNCTIONS_ALLOWED
        ):
          long.append(f"{path.name}:{first} {name}: {lines} lines")
  return long


def test_no_cxx_function_is_over_100_lines():
  assert _long_cxx_functions() == []


_CXX_SAMPLE = """\
#include <x.h>  // {
#define OPEN {
namespace a {
namespace {
const char* kText = "} {";  // }
int Table[] = {1, 2};
enum class E { kA, kB };
}  // namespace

struct S : Base {
  int Method(int x) const {
    auto f = [&] { return '}'; };
    return f();
  }
};

/* { */ template <typename T>
T Free(T t,
       int n = 2) {
  if (t) {
    return t;
  }
  return n;
}
}  // namespace a
"""


def test_the_cxx_scanner_finds_each_function_and_its_lines():
  assert cxx_functions(_CXX_SAMPLE) == [("Method", 11, 14), ("Free", 17, 24)]


# The layers of hostcb, bottom to top: a module may import from a lower
# layer, or sideways within its own group (a package, or a front end's
# module), and from another group of its layer only where listed below.
_LAYERS = (
  ("hostcb._native", "hostcb.config"),
  ("hostcb._jax_internals",),
  ("hostcb._engine",),
  ("hostcb._core",),
  (  # the front ends
    "hostcb.named",
    "hostcb.host_callback",
    "hostcb.jax_callbacks",
    "hostcb.debug",
    "hostcb._debugger",
    "hostcb.buffer_callback",
    "hostcb.xla_computation",
    "hostcb.metrics",
    "hostcb.progress",
    "hostcb.engine",
  ),
  ("hostcb._import_hook",),
  ("hostcb.tools", "hostcb.__main__", "hostcb"),
)

# (importer, imported): the imports between groups of one layer, each
# without a cycle (test_hostcb_has_no_import_cycles).
_SIDEWAYS = {
  ("hostcb.config", "hostcb._native"),  # the engine's built-in defaults
  ("hostcb.debug", "hostcb.jax_callbacks"),  # JAX's rules and x64
  ("hostcb.debug", "hostcb._debugger"),  # debug.breakpoint
  ("hostcb.metrics", "hostcb.host_callback"),  # metrics tap with id_tap
  ("hostcb.progress", "hostcb.host_callback"),  # bars tap with id_tap
  ("hostcb.__main__", "hostcb.tools"),  # the command's entry point
  ("hostcb.tools", "hostcb"),  # the command shows the library
}


def _group(name: str) -> tuple[int, str] | None:
  """(layer, group) of module ``name``: its longest group prefix."""
  best = None
  for layer, groups in enumerate(_LAYERS):
    for g in groups:
      if (name == g or name.startswith(g + ".")) and (
        best is None or len(g) > len(best[1])
      ):
        best = (layer, g)
  return best


def _layer_breaks(graph: dict[str, set[str]]) -> list[str]:
  """Each import of ``graph`` (module -> modules it imports) that goes up
  a layer, or sideways to another group not in :data:`_SIDEWAYS`."""
  breaks = []
  for name in sorted(graph):
    here = _group(name)
    for m in sorted(graph[name]):
      there = _group(m)
      if here is None or there is None:
        continue  # test_every_module_sits_in_a_layer says which
      if there[0] < here[0] or there[1] == here[1]:
        continue
      if there[0] == here[0] and (here[1], there[1]) in _SIDEWAYS:
        continue
      breaks.append(f"{name} -> {m}")
  return breaks


def test_every_module_sits_in_a_layer():
  mods = [n for n in _modules() if n.split(".")[0] == "hostcb"]
  assert [n for n in mods if _group(n) is None] == []


def test_imports_go_down_the_layers_or_sideways_as_listed():
  mods = _modules()
  graph = {n: _imports(n, p, set(mods)) for n, p in mods.items()}
  assert _layer_breaks(graph) == []


def test_the_layer_check_finds_an_import_that_goes_up():
  graph = {
    "hostcb._core.lowering": {"hostcb.named", "hostcb._engine"},
    "hostcb.named": {"hostcb._core.lowering"},
    "hostcb._engine": set(),
  }
  assert _layer_breaks(graph) == ["hostcb._core.lowering -> hostcb.named"]


# ------------------------------------------------- no function over 100 lines
_MAX_FUNCTION_LINES = 100


def _long_functions(path: pathlib.Path) -> list[str]:
  """``name:line (n lines)`` of each function or method of ``path`` (nested
  ones too) longer than :data:`_MAX_FUNCTION_LINES`, its decorators not
  counted, in source order."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      lines = node.end_lineno - node.lineno + 1
      if lines > _MAX_FUNCTION_LINES:
        found.append(
          (node.lineno, f"{node.name}:{node.lineno} ({lines} lines)")
        )
  return [text for _, text in sorted(found)]


def _def(header: str, lines: int, indent: str = "") -> str:
  """A definition of ``lines`` lines in all: ``header``, then statements."""
  body = "".join(f"{indent}  x{i} = {i}\n" for i in range(lines - 1))
  return f"{indent}{header}\n{body}"


def test_the_long_function_finder_counts_every_line_of_each_def(tmp_path):
  f = tmp_path / "m.py"
  f.write_text(
    _def("def fits():", 100)  # lines 1-100
    + "class C:\n"  # line 101
    + _def("async def method(self):", 101, "  ")  # lines 102-202
    + "def outer():\n"  # line 203
    + _def("def inner():", 101, "  ")  # lines 204-304
    + "  return inner\n"
  )
  assert _long_functions(f) == [
    "method:102 (101 lines)",
    "outer:203 (103 lines)",
    "inner:204 (101 lines)",
  ]


def test_no_function_in_src_is_over_100_lines():
  long = {
    str(p.relative_to(_SRC)): _long_functions(p)
    for p in sorted(_SRC.rglob("*.py"))
  }
  assert {p: f for p, f in long.items() if f} == {}


# ---------------------------------------------- no issue numbers in the code
_ISSUE_NUMBER = r"\bissues? ?#?\d+"  # case-insensitive
_CODE_DIRS = ("src", "tests", "benchmarks", "scripts")


def _issue_numbers(path: pathlib.Path) -> list[str]:
  """``line: text`` of each line of ``path`` that names an issue by number."""
  import re

  lines = path.read_text(encoding="utf-8").splitlines()
  return [
    f"{n}: {line.strip()}"
    for n, line in enumerate(lines, 1)
    if re.search(_ISSUE_NUMBER, line, re.IGNORECASE)
  ]


def test_the_issue_number_finder_finds_each_spelling(tmp_path):
  word = "issue"  # (this file names no issue itself)
  named = [f"# {word} 38", f"# {word.title()} #4", f"# {word}s 8", f"# {word}8"]
  unnamed = [f"# the {word}'s example", f"# t{word} 3", "# return value #0"]
  f = tmp_path / "m.py"
  f.write_text("\n".join(named + unnamed) + "\n")
  assert _issue_numbers(f) == [f"{n}: {t}" for n, t in enumerate(named, 1)]


def test_no_python_file_names_an_issue_by_number():
  # The CHANGELOG keeps the history; the code says what is.
  root = _SRC.parent
  found = {
    str(p.relative_to(root)): _issue_numbers(p)
    for d in _CODE_DIRS
    for p in sorted((root / d).rglob("*.py"))
  }
  assert {p: lines for p, lines in found.items() if lines} == {}


def test_no_docs_page_or_native_source_names_an_issue_by_number():
  # The site and the C++ say what is, as the Python does; JAX's and
  # Flax's own tracker references (jax#16637) are not ours.
  root = _SRC.parent
  pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
  native = sorted((root / "src" / "hostcb" / "_native").glob("*.[ch]*"))
  found = {
    str(p.relative_to(root)): [
      line for line in _issue_numbers(p) if "jax#" not in line
    ]
    for p in pages + native
  }
  assert {p: lines for p, lines in found.items() if lines} == {}
