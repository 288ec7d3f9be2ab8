"""What a program writes after dispatching a computation comes after that
computation's prints, as under JAX (``hostcb._engine.output_order``):
``print("result:", f(x))`` shows ``f``'s ``jax.debug.print`` lines first.

The differential tests run one script under JAX's own callbacks and under
hostcb's (``install(jax_callbacks=True)``, and ``hostcb.debug.print``
called directly), several times each, and compare the output byte for
byte.
"""

from __future__ import annotations

import builtins
import contextlib
import ast
import io
import logging
import os
import pathlib
import re
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import pytest

import hostcb
from _helpers import hostcb_root, run_python
from hostcb import _engine as engine
from hostcb._engine.output_order import writes
from hostcb._jax_internals import printing_computations as printing

DEADLINE = 60.0  # seconds: every wait of these tests ends by then
RUNS = 3  # runs of each side of the differential test

_CASES = r"""
import contextlib, io, sys
import jax, jax.numpy as jnp
MODE = sys.argv[1]
if MODE == "install":
  import hostcb
  hostcb.install(jax_callbacks=True)
if MODE == "hostcb.debug":
  import hostcb
  dprint = hostcb.debug.print
else:
  dprint = lambda *a, **k: jax.debug.print(*a, **k)

@jax.jit
def f(x):
  dprint("x = {x}", x=x)
  return x * 2

@jax.jit
def heavy(x, m):
  dprint("before = {x}", x=x)
  for _ in range(3):
    m = jnp.tanh(m @ m)
  dprint("after = {x}", x=x)
  return x * 2 + m[0, :3]

@jax.jit
def loop(x):
  def body(c, _):
    dprint("c = {c}", c=c)
    return c + 1, None
  return jax.lax.scan(body, x, None, length=4)[0]

x = jnp.arange(3.)
m = jnp.ones((600, 600)) / 600
saved = sys.stdout  # taken before the first print
print("result:", f(x))
print("a", f(x), sep=" | ")
sys.stdout.write("step 7: "); print(f(x))
print("heavy:", heavy(x, m))
y = heavy(x, m); print("dispatched, not read"); print(y)
y = f(x); print("to stderr", file=sys.stderr); print(y, file=sys.stderr)
print("loop:", loop(1))
y = f(x); print("to a stream taken before", file=saved); print(y)
for i in range(3):
  print("i", i, f(x + i), end=";\n")
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
  print("redirected:", f(x))
  y = heavy(x, m); print("redirected, not read")
  print(y)
print(buf.getvalue(), end="")
print(f"f-string {f(x)}")
jax.effects_barrier()
"""


def _outputs(mode: str) -> list[str]:
  """The merged stdout and stderr (unbuffered) of RUNS runs of _CASES."""
  env = dict(os.environ)
  env.pop("PYTHONPATH", None)
  env.update(
    {
      "PYTHONPATH": hostcb_root(),
      "JAX_PLATFORMS": "cpu",
      "PYTHONUNBUFFERED": "1",
    }
  )
  runs = []
  for _ in range(RUNS):
    proc = subprocess.run(
      [sys.executable, "-c", _CASES, mode],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      timeout=DEADLINE * 4,
    )
    assert proc.returncode == 0, proc.stdout
    runs.append(proc.stdout)
  return runs


@pytest.fixture(scope="module")
def jax_output() -> str:
  runs = _outputs("jax")
  assert len(set(runs)) == 1, runs  # JAX's own order is the same each run
  return runs[0]


def test_the_cases_print_in_jax_order_under_jax_itself(jax_output):
  # What "JAX's order" is, for the record: each label after the lines of
  # the computation dispatched before it.
  assert jax_output.startswith("x = [0. 1. 2.]\nresult: [0. 2. 4.]\n")
  assert "after = [0. 1. 2.]\ndispatched, not read\n" in jax_output


@pytest.mark.parametrize("mode", ["install", "hostcb.debug"])
def test_output_is_jax_output_byte_for_byte_over_repeated_runs(
  mode, jax_output
):
  for out in _outputs(mode):
    assert out == jax_output


# ------------------------------------------------------------ in process
def _f():
  return jax.jit(lambda x: (hostcb.debug.print("x = {}", x), x * 2)[1])


def test_a_label_printed_with_a_result_follows_the_prints(capsys):
  f = _f()
  for i in range(5):
    print("result:", f(jnp.float32(i)))
    print("b", f(jnp.float32(i)), sep=" | ")
  assert capsys.readouterr().out == "".join(
    f"x = {float(i)}\nresult: {float(2 * i)}\n"
    f"x = {float(i)}\nb | {float(2 * i)}\n"
    for i in range(5)
  )


def test_a_stream_assigned_after_the_first_print_is_ordered_too():
  f = _f()
  f(jnp.float32(0)).block_until_ready()  # a print is staged
  buf = io.StringIO()
  with contextlib.redirect_stdout(buf):
    print("result:", f(jnp.float32(1)))
  assert buf.getvalue() == "x = 1.0\nresult: 2.0\n"


def test_a_stream_assigned_to_stdout_first_gets_the_prints_before_it():
  # As under JAX, whose computation printed while its caller waited: the
  # block of redirect_stdout ends without a barrier or a write.
  def body(c, i):
    hostcb.debug.print("{}", i)
    return c + i, None

  f = jax.jit(lambda x: jax.lax.scan(body, x, jnp.arange(300))[0])
  f(0).block_until_ready()  # a print is staged
  jax.effects_barrier()
  buf = io.StringIO()
  with contextlib.redirect_stdout(buf):
    f(0)
  assert buf.getvalue() == "".join(f"{i}\n" for i in range(300))


def test_an_assignment_from_a_tap_function_does_not_wait_for_itself(
  monkeypatch, caplog
):
  # A consumer that assigns sys.stdout while a print is queued behind it
  # would wait for that print, which only it can run, until the deadline.
  monkeypatch.setattr(writes, "_warned", [False])
  buf = io.StringIO()

  def tap(x, transforms):
    sys.stdout = buf  # on the consumer thread: no wait for itself

  def f(x):
    hostcb.id_tap(tap, x)
    hostcb.debug.print("after the assignment {}", x)

  stdout = sys.stdout
  try:
    with caplog.at_level(logging.WARNING, logger="hostcb"):
      jax.jit(f)(jnp.float32(5))
      assert engine.wait_for_taps(DEADLINE)
  finally:
    sys.stdout = stdout
  assert buf.getvalue() == "after the assignment 5.0\n"
  assert "waited" not in caplog.text


def test_id_tap_of_print_is_ordered_and_captured_as_a_print():
  f = jax.jit(lambda x: hostcb.id_tap(print, x * 2))
  for i in range(3):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
      f(jnp.int32(i))
    assert buf.getvalue() == f"{2 * i} ()\n"
  buf = io.StringIO()
  with contextlib.redirect_stdout(buf):
    print("result", f(jnp.int32(5)))
  assert buf.getvalue() == "10 ()\nresult 10\n"


def test_writes_wait_only_for_the_prints_of_a_deadline(monkeypatch, caplog):
  # A print whose stream blocks: a write waits at most WAIT_SECONDS for
  # it, then goes on, with a warning naming why.
  release = threading.Event()

  class Blocking:
    def write(self, s):
      release.wait(DEADLINE)

  f = jax.jit(lambda x: hostcb.id_print(x, output_stream=Blocking()))
  monkeypatch.setattr(writes, "WAIT_SECONDS", 0.2)
  monkeypatch.setattr(writes, "_warned", [False])
  buf = io.StringIO()
  try:
    with caplog.at_level(logging.WARNING, logger="hostcb"):
      f(jnp.float32(1))
      with contextlib.redirect_stdout(buf):
        print("goes on")
    assert buf.getvalue() == "goes on\n"
    assert not release.is_set()
    assert "waited 0.2 s for the computation before it" in caplog.text
  finally:
    release.set()
  assert engine.wait_for_taps(DEADLINE)


def test_a_host_function_that_prints_does_not_wait_for_its_computation(capsys):
  # The function runs in the middle of its computation (in the dispatching
  # thread, or XLA's): its write must not wait for that computation.
  _f()(jnp.float32(0)).block_until_ready()  # a print is staged
  capsys.readouterr()

  def host(x):
    print("in the host function")
    return x

  g = jax.jit(
    lambda x: (
      hostcb.pure_callback(host, jax.ShapeDtypeStruct((), jnp.float32), x) + 1
    )
  )
  assert float(g(jnp.float32(1))) == 2.0
  h = jax.jit(
    lambda x: (jax.debug.callback(lambda v: print("jax's", v), x), x)[1]
  )
  assert float(h(jnp.float32(3))) == 3.0
  jax.effects_barrier()
  assert capsys.readouterr().out == "in the host function\njax's 3.0\n"


@pytest.mark.skipif(
  tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 10),
  reason="on jax 0.8 the write does not see this thread's running "
  "computation (checked on 0.10.2 and 0.12.0.1; a known gap of 0.8)",
)
def test_a_write_waits_for_a_blocked_computation_only_until_the_deadline(
  monkeypatch, caplog
):
  # Fault injection: the computation that prints, dispatched before the
  # write, never finishes (its host function waits): the write waits
  # WAIT_SECONDS for it, then goes on, with the warning; the computation
  # is left alone.
  _f()(jnp.float32(0)).block_until_ready()  # a print is staged
  monkeypatch.setattr(writes, "WAIT_SECONDS", 0.2)
  monkeypatch.setattr(writes, "_warned", [False])
  release = threading.Event()

  def host(x):
    release.wait(DEADLINE)
    return x

  def g(x, m):
    y = (
      hostcb.pure_callback(host, jax.ShapeDtypeStruct((), jnp.float32), x)
      + jnp.tanh(m @ m)[0, 0] * 0
    )  # big enough to run asynchronously
    hostcb.debug.print("g {}", y)  # after the host function returned
    return y

  g = jax.jit(g)
  buf = io.StringIO()
  try:
    with caplog.at_level(logging.WARNING, logger="hostcb"):
      y = g(jnp.float32(2), jnp.ones((600, 600)))
      with contextlib.redirect_stdout(buf):
        print("goes on")
    assert buf.getvalue() == "goes on\n"
    assert not release.is_set()
    assert "waited 0.2 s for the computation before it" in caplog.text
  finally:
    release.set()
  assert float(y) == 2.0


def test_a_write_from_a_tap_function_does_not_wait_for_itself():
  out = []
  done = threading.Event()

  def tap(x, transforms):
    sys.stdout.write("")  # on the consumer thread: no wait for itself
    out.append(float(x))
    done.set()

  _f()(jnp.float32(0)).block_until_ready()  # a print is staged
  jax.jit(lambda x: hostcb.id_tap(tap, x))(jnp.float32(5))
  assert done.wait(DEADLINE)
  assert out == [5.0]


_INSTALL_SCRIPT = """
import builtins, contextlib, io, logging, sys, types
import jax, jax.numpy as jnp, hostcb
from hostcb._engine import output_order
originals = (
  builtins.print, logging.Handler.handle,
  contextlib.redirect_stdout.__enter__, contextlib.redirect_stdout.__exit__,
)
streams = (sys.stdout, sys.stderr)
assert not output_order.installed()
f = jax.jit(lambda x: (hostcb.debug.print("x = {}", x), x * 2)[1])
f(jnp.float32(1)).block_until_ready()  # staged: installed
assert output_order.installed() and builtins.print is not originals[0]
assert (sys.stdout, sys.stderr) == streams and type(sys) is types.ModuleType
hostcb.uninstall()
assert not output_order.installed()
assert originals == (
  builtins.print, logging.Handler.handle,
  contextlib.redirect_stdout.__enter__, contextlib.redirect_stdout.__exit__,
)
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
  assert sys.stdout is buf
print("ok")
"""


def test_the_hook_is_installed_by_the_first_print_and_removed_by_uninstall():
  proc = run_python(_INSTALL_SCRIPT)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "x = 1.0\nok\n"


def test_importing_hostcb_leaves_sys_alone():
  proc = run_python(
    "import sys, types, hostcb\n"
    "print(type(sys) is types.ModuleType, "
    "type(sys.stdout).__name__)"
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "True TextIOWrapper\n"


def test_functions_that_print_and_return_arrays_keep_jits_fast_path():
  # A function that prints and returns an array dispatches on jit's fast
  # path (one of its outputs is what the next write waits for); one that
  # prints and returns nothing keeps its runtime token.
  from hostcb import _jax_internals as ji

  x = jnp.float32(1)
  tapping = jax.jit(lambda x: hostcb.id_tap(lambda a, t: None, x) + 1)
  calling = jax.jit(
    lambda x: (hostcb.debug.callback(lambda v: None, x), x + 1)[1]
  )
  printing = jax.jit(lambda x: (hostcb.debug.print("{}", x), x + 1)[1])
  id_printing = jax.jit(
    lambda x: hostcb.id_print(x, output_stream=io.StringIO())
  )
  printing_nothing_back = jax.jit(lambda x: hostcb.debug.print("{}", x))
  assert ji.declares_no_effect(tapping, x)
  assert ji.declares_no_effect(calling, x)
  assert ji.declares_no_effect(printing, x)
  assert ji.declares_no_effect(id_printing, x)
  assert not ji.declares_no_effect(printing_nothing_back, x)


_WAITS_SCRIPT = r"""
import contextlib, io, sys
import jax, jax.numpy as jnp, hostcb

@jax.jit
def f(x, m):
  y = x * 2 + jnp.tanh(m @ m)[0, 0] * 0  # big enough to run asynchronously
  hostcb.debug.print("f {}", y[0])
  return y

@jax.jit
def g(x):  # prints, returns nothing: keeps its runtime token
  hostcb.debug.print("g {}", x[0])

@jax.jit
def two(x, m):  # prints, returns two arrays
  y = x * 2 + jnp.tanh(m @ m)[0, 0] * 0
  hostcb.debug.print("two {}", y[0])
  return y, y[0]

h = jax.jit(lambda s: s + 1, donate_argnums=0)  # no print

x = jnp.arange(3.)
m = jnp.ones((300, 300)) / 300
f(x, m).block_until_ready()  # compiled, and a print is staged
two(x, m)[1].block_until_ready()
h(jnp.arange(3.)).block_until_ready()
compiled = jax.jit(f).lower(x, m).compile()
for i in range(20):
  buf = io.StringIO()
  with contextlib.redirect_stdout(buf):
    y = f(x + i, m)  # jit's fast path
    print("after f")
    z = compiled(x + i, m)  # AOT: JAX's Python path
    print("after compiled")
    g(x + i)
    print("after g")
    f(x + i, m)  # its result dropped at once
    print("after dropped")
    s, loss = two(x + i, m)
    s = h(s)  # its first output donated to a computation without prints
    print("after donated")
  assert buf.getvalue() == (
    f"f {2. * i}\nafter f\nf {2. * i}\nafter compiled\n"
    f"g {float(i)}\nafter g\nf {2. * i}\nafter dropped\n"
    f"two {2. * i}\nafter donated\n"
  ), buf.getvalue()
print("ok")
"""


def test_a_write_waits_for_fast_aot_token_and_dropped_computations():
  # Each way a computation that prints is dispatched (jit's fast path,
  # an AOT-compiled call, the runtime token of one that returns nothing, a
  # result dropped at once, an output donated to a later computation): the
  # write after it comes after its print.
  r = run_python(_WAITS_SCRIPT)
  assert r.stdout == "f 0.0\ntwo 0.0\nok\n", r.stdout + r.stderr


_PATCHED_WRITE_SCRIPT = """
import sys, jax, jax.numpy as jnp, hostcb
f = jax.jit(lambda x: (hostcb.debug.print("x = {}", x), x * 2)[1])
f(jnp.float32(1)).block_until_ready()  # staged: installed
seen = []
class Capture:  # a library's stream in front of sys.stdout (W&B's console)
  def __init__(self, stream):
    self.stream = stream
  def write(self, s):
    seen.append(s)
    return self.stream.write(s)
  def flush(self):
    self.stream.flush()
sys.stdout = Capture(sys.stdout)
print("result:", f(jnp.float32(2)))
hostcb.uninstall()
print("after uninstall")
sys.stderr.write(repr(seen) + "\\n")
"""


def test_a_library_stream_assigned_to_stdout_composes_with_the_hook():
  r = run_python(_PATCHED_WRITE_SCRIPT)
  assert r.returncode == 0, r.stderr
  assert r.stdout == "x = 1.0\nx = 2.0\nresult: 4.0\nafter uninstall\n"
  assert r.stderr.strip().splitlines()[-1] == repr(
    ["x = 2.0\n", "result:", " ", "4.0", "\n", "after uninstall", "\n"]
  )


# The note of each fast-path dispatch of a function that prints
# (_jax_internals.printing_computations, _PrintOutputs): the native engine's C function,
# and its Python twin for a process without the engine.
def _notes() -> list:
  notes = [pytest.param(printing._unflatten_print_outputs, id="python")]
  if engine.available():
    native = engine.native.module().print_outputs_unflatten(
      printing._print_outputs
    )
    notes.append(pytest.param(native, id="native"))
  return notes


def test_the_fast_path_note_is_the_native_function_with_the_engine():
  if not engine.available():
    pytest.skip(f"no native engine here: {engine.unavailable_reason()}")
  note = printing._note_and_unflatten()
  assert type(note).__name__ == "builtin_function_or_method"
  assert note.__self__ is printing._print_outputs


@pytest.mark.parametrize("note", _notes())
def test_the_note_of_one_array_returns_it_and_notes_the_outputs(note):
  children = (jnp.float32(1),)
  try:
    assert note(None, children) is children[0]
    assert printing._print_outputs[threading.get_ident()] is children
  finally:
    printing._print_outputs.pop(threading.get_ident(), None)


@pytest.mark.parametrize("note", _notes())
def test_the_note_of_a_tree_returns_the_tree_and_notes_the_outputs(note):
  tree = jax.tree_util.tree_structure((0, {"a": 0}))
  children = (jnp.float32(1), jnp.float32(2))
  try:
    out = note(tree, children)
    assert out == (children[0], {"a": children[1]})
    assert out[0] is children[0] and out[1]["a"] is children[1]
    assert printing._print_outputs[threading.get_ident()] is children
  finally:
    printing._print_outputs.pop(threading.get_ident(), None)


@pytest.mark.parametrize("note", _notes())
def test_the_note_is_kept_per_thread(note):
  children = (jnp.float32(1),)
  idents = []

  def dispatching_thread():
    idents.append(threading.get_ident())
    note(None, children)

  t = threading.Thread(target=dispatching_thread)
  t.start()
  t.join(DEADLINE)
  assert not t.is_alive()
  try:
    assert threading.get_ident() not in printing._print_outputs
    assert printing._print_outputs[idents[0]] is children
  finally:
    printing._print_outputs.pop(idents[0], None)


def test_the_native_note_takes_a_dict_and_two_arguments():
  if not engine.available():
    pytest.skip(f"no native engine here: {engine.unavailable_reason()}")
  module = engine.native.module()
  with pytest.raises(TypeError, match="takes a dict"):
    module.print_outputs_unflatten([])
  note = module.print_outputs_unflatten({})
  with pytest.raises(TypeError, match="takes 2 arguments"):
    note(None)


# The print that waits first (output_order): the native engine's C
# function, and its Python twin for a process without the engine.
def _prints() -> list:
  prints = [pytest.param(writes._python_print, id="python")]
  if engine.available():
    module = engine.native.module()
    prints.append(
      pytest.param(
        lambda p, o, t, w: module.ordered_print(p, o, t, w), id="native"
      )
    )
  return prints


def _make_print(make, outputs: dict, tokens: dict, wait):
  if make is writes._python_print:  # its dicts are the module's own
    outputs, tokens = writes._outputs, writes._tokens
    return outputs, tokens, make(builtins.print)
  return outputs, tokens, make(builtins.print, outputs, tokens, wait)


@pytest.mark.parametrize("make", _prints())
def test_the_print_passes_its_arguments_as_given(make):
  waits = []
  _, _, p = _make_print(make, {}, {}, lambda: waits.append(1))
  buf = io.StringIO()
  assert p("a", 1, sep="-", end="!\n", file=buf) is None
  p(file=buf)
  assert buf.getvalue() == "a-1!\n\n" and waits == []


def test_the_native_print_waits_first_where_the_thread_has_a_note():
  if not engine.available():
    pytest.skip(f"no native engine here: {engine.unavailable_reason()}")
  events = []

  class Stream:
    def write(self, s):
      events.append(s)

  module = engine.native.module()
  for outputs, tokens in (
    ({threading.get_ident(): 0}, {}),
    ({}, {threading.get_ident(): 0}),
  ):
    events.clear()
    p = module.ordered_print(
      builtins.print, outputs, tokens, lambda: events.append("wait")
    )
    p("x", file=Stream())
    assert events == ["wait", "x", "\n"]
  events.clear()
  other = {threading.get_ident() + 1: 0}  # another thread's note
  p = module.ordered_print(builtins.print, other, {}, lambda: events.append(1))
  p("x", file=Stream())
  assert events == ["x", "\n"]


def test_the_native_print_takes_print_two_dicts_and_a_callable():
  if not engine.available():
    pytest.skip(f"no native engine here: {engine.unavailable_reason()}")
  module = engine.native.module()
  with pytest.raises(TypeError):
    module.ordered_print(builtins.print, [], {}, print)
  with pytest.raises(TypeError, match="takes print, two dicts"):
    module.ordered_print(builtins.print, {}, {}, None)


_PYTHON_NOTE_SCRIPT = """
import jax, jax.numpy as jnp, hostcb
from hostcb._jax_internals import printing_computations as printing
f = jax.jit(lambda x: (hostcb.debug.print("x = {}", x), x * 2)[1])
g = jax.jit(lambda x: (hostcb.debug.print("y = {}", x), (x, {"b": x + 1}))[1])
f(jnp.float32(0)).block_until_ready()
assert printing._note_and_unflatten() is printing._unflatten_print_outputs
assert hostcb._jax_internals.declares_no_effect(f, jnp.float32(1))
for i in range(3):
  print("result:", f(jnp.float32(i)))
  print("tree:", g(jnp.float32(i))[1]["b"])
"""


def test_without_the_engine_a_write_follows_the_fast_path_prints():
  r = run_python(_PYTHON_NOTE_SCRIPT, env_extra={"HOSTCB_DISABLE_NATIVE": "1"})
  assert r.returncode == 0, r.stderr
  assert r.stdout == "x = 0.0\n" + "".join(
    f"x = {i}.0\nresult: {2 * i}.0\ny = {i}.0\ntree: {i + 1}.0\n"
    for i in range(3)
  )


_OTHER_SYS_CLASS_SCRIPT = """
import io, sys, types
import jax, jax.numpy as jnp, hostcb
buf = io.StringIO()
class OtherSys(types.ModuleType):  # another tool's class of sys
  @property
  def stdout(self):
    return buf
sys.__class__ = OtherSys
f = jax.jit(lambda x: (hostcb.debug.print("x = {}", x), x * 2)[1])
y = f(jnp.float32(1))
hostcb.barrier_wait()
sys.__class__ = types.ModuleType
print(repr(buf.getvalue()), y)
"""


def test_a_print_goes_to_the_stdout_of_another_class_of_sys():
  # A consumer's print writes to sys.stdout as sys gives it, under any
  # class of sys.
  r = run_python(_OTHER_SYS_CLASS_SCRIPT)
  assert r.returncode == 0, r.stderr
  assert r.stdout == "'x = 1.0\\n' 2.0\n"


# --------------------------------------- process-level, JAX as the oracle
# Each script runs under JAX's own callbacks ("jax") and under hostcb's
# ("install": hostcb.install(jax_callbacks=True)), in its own process.
_MODE = """
import sys
import jax, jax.numpy as jnp
if sys.argv[1] == "install":
  import hostcb
  hostcb.install(jax_callbacks=True)
"""


def _modes(script: str, **popen) -> dict:
  """``{mode: CompletedProcess}`` of ``script`` under each mode."""
  env = dict(os.environ)
  env.pop("PYTHONPATH", None)
  env.update({"PYTHONPATH": hostcb_root(), "JAX_PLATFORMS": "cpu"})
  return {
    mode: subprocess.run(
      [sys.executable, "-c", _MODE + script, mode],
      env=env,
      capture_output=True,
      text=True,
      timeout=DEADLINE * 4,
    )
    for mode in ("jax", "install")
  }


_SLOW_CALLBACK_SCRIPT = r"""
import threading
DEADLINE = 60.0
started, release, printed = (threading.Event() for _ in range(3))

def slow(x):
  started.set()
  release.wait(DEADLINE)  # until the other thread has printed

@jax.jit
def f(x):
  jax.debug.callback(slow, x)
  jax.debug.print("after the slow callback {}", x)
  return x + 1

def other():
  print("from a thread that dispatched nothing")
  printed.set()

dispatching = threading.Thread(target=lambda: f(jnp.float32(1)))
dispatching.start()
assert started.wait(DEADLINE)
threading.Thread(target=other).start()
on_time = printed.wait(5.0)  # a print takes microseconds (hostcb waited 10 s)
release.set()
dispatching.join(DEADLINE)
jax.effects_barrier()
print("printed while the callback waited:", on_time)
"""


def test_a_slow_callback_does_not_hold_up_another_threads_print():
  runs = _modes(_SLOW_CALLBACK_SCRIPT)
  for r in runs.values():
    assert r.returncode == 0, r.stderr
  assert runs["jax"].stdout == (
    "from a thread that dispatched nothing\n"
    "after the slow callback 1.0\n"
    "printed while the callback waited: True\n"
  )
  assert runs["install"].stdout == runs["jax"].stdout


_LOGGING_SCRIPT = r"""
import logging
# Set up before the first print: the handler keeps this very stream.
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="LOG %(message)s")

@jax.jit
def step(x):
  jax.debug.print("value {}", x)
  return x + 1

x = jnp.int32(0)
for i in range(4):
  x = step(x)
  logging.info("step %d", i)
jax.effects_barrier()
"""


def test_a_log_handler_set_up_before_the_first_print_writes_in_order():
  runs = _modes(_LOGGING_SCRIPT)
  for r in runs.values():
    assert r.returncode == 0, r.stderr
  assert runs["jax"].stdout == "".join(
    f"value {i}\nLOG step {i}\n" for i in range(4)
  )
  assert runs["install"].stdout == runs["jax"].stdout


_STREAM_TYPES_SCRIPT = r"""
import io, types
f = jax.jit(lambda x: (jax.debug.print("x = {}", x), x * 2)[1])
print("result:", f(jnp.float32(1)))
print(
  type(sys) is types.ModuleType,
  type(sys.stdout).__name__, type(sys.stderr).__name__,
  isinstance(sys.stdout, io.TextIOBase), isinstance(sys.stderr, io.TextIOBase),
)
jax.effects_barrier()
with sys.stdout as out:  # TypeError where sys.stdout is no stream
  out.write("with sys.stdout: ok\n")
"""


def test_sys_and_its_streams_keep_their_types_after_a_print():
  runs = _modes(_STREAM_TYPES_SCRIPT)
  for r in runs.values():
    assert r.returncode == 0, r.stderr
  assert runs["jax"].stdout == (
    "x = 1.0\nresult: 2.0\n"
    "True TextIOWrapper TextIOWrapper True True\n"
    "with sys.stdout: ok\n"
  )
  assert runs["install"].stdout == runs["jax"].stdout


_CLOSED_PIPE_SCRIPT = r"""
@jax.jit
def f(x):
  jax.debug.print("x = {x} " + "." * 200, x=x)  # more than a pipe holds
  return x + 1

x = jnp.float32(0)
for i in range(2000):
  x = f(x)
jax.effects_barrier()
print("end")
"""


def _closed_pipe(
  mode: str, stderr_path: str, script: str = _CLOSED_PIPE_SCRIPT
) -> tuple[int, str]:
  """``prog.py | head -2``: the exit status and stderr of the script when
  its stdout is closed after two lines."""
  env = dict(os.environ)
  env.pop("PYTHONPATH", None)
  env.update({"PYTHONPATH": hostcb_root(), "JAX_PLATFORMS": "cpu"})
  with open(stderr_path, "w+") as err:
    proc = subprocess.Popen(
      [sys.executable, "-c", _MODE + script, mode],
      env=env,
      stdout=subprocess.PIPE,
      stderr=err,
      text=True,
    )
    try:
      lines = [proc.stdout.readline() for _ in range(2)]
      proc.stdout.close()
      status = proc.wait(DEADLINE * 4)
    finally:
      proc.kill()
    err.seek(0)
    assert [line[:8] for line in lines] in (
      ["x = 0.0 ", "x = 1.0 "],
      ["what: x.", "0.\n"],  # id_print
    )
    return status, err.read()


def _tracebacks(err: str) -> int:
  return err.splitlines().count("Traceback (most recent call last):")


def test_a_closed_pipe_gives_as_many_tracebacks_as_under_jax(tmp_path):
  # JAX: the failed print's log, then the program's own traceback (its
  # dispatch raised); hostcb did the first for each print left (1,989).
  runs = {
    mode: _closed_pipe(mode, str(tmp_path / mode))
    for mode in ("jax", "install")
  }
  status, err = runs["jax"]
  assert (status, _tracebacks(err)) == (1, 2), err
  assert err.count("jax.debug.callback failed") == 1, err
  status, err = runs["install"]
  assert (status, _tracebacks(err)) == (1, 2), err[:3000]
  assert err.count("jax.debug.callback failed") == 1, err[:3000]


_CLOSED_PIPE_ID_PRINT_SCRIPT = r"""
import hostcb

@jax.jit
def f(x):
  return hostcb.id_print(x, what="x" + "." * 200) + 1  # more than a pipe holds

x = jnp.float32(0)
for i in range(2000):
  x = f(x)
hostcb.barrier_wait()
"""


def test_id_print_to_a_closed_pipe_logs_one_failure_and_raises_at_the_barrier(
  tmp_path,
):
  # Legacy logged the first failed print and raised it from the dispatch;
  # hostcb keeps its barrier's CallbackException (one traceback, chained).
  status, err = _closed_pipe(
    "hostcb", str(tmp_path / "err"), _CLOSED_PIPE_ID_PRINT_SCRIPT
  )
  assert status == 1
  assert err.count("hostcb: a tap function raised an exception") == 1, err
  assert err.count("BrokenPipeError") == 3, err  # the log, the cause, the text
  assert "hostcb._engine.errors.CallbackException" in err, err


# What takes part in output ordering, by the names through which it does:
# each module of hostcb that uses one of them is named in the map, the
# docstring of hostcb._engine.output_order.
_ORDERING_NAMES = {
  "awaited_tap_staged",
  "mark_awaited",
  "note_awaited_lowered",
  "lowered_printing",
  "prints_module",
  "marked_keepalive",
  "this_threads_notes",
  "note_print_outputs",
  "forget_print_outputs",
  "forget_this_threads_print_outputs",
  "wait_for_this_threads_computation",
  "wait_after_next_dispatch",
  "after_host_reads",
  "block_without_hook",
  "consumer_stdout",
  "wait_for_own_prints",
  "wait_for_earlier_prints",
  "wait_for_awaited",
  "wait_for_awaited_everywhere",
  "awaited_run_everywhere",
  "mark_awaited_target",
  "ordered_print",
  "print_outputs_unflatten",
}
_ORDERING_NATIVE_NAMES = re.compile(
  r"\b(g_awaited_targets|IsPrintTarget|NotePrintLocked|EarlierPrintsRun|"
  r"OrderedPrint|UnflattenPrintOutputs)\b"
)


def _modules_taking_part() -> list[str]:
  """The paths, relative to the package, of hostcb's modules (and C++
  files) that use a name of output ordering."""
  package = pathlib.Path(hostcb.__file__).resolve().parent
  source = pathlib.Path(__file__).resolve().parent.parent / "src" / "hostcb"
  root = source if source.is_dir() else package
  found = []
  for path in sorted(root.rglob("*.py")):
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.FunctionDef):
        used.add(node.name)
      elif isinstance(node, ast.Attribute):
        used.add(node.attr)
      elif isinstance(node, ast.Name):
        used.add(node.id)
      elif isinstance(node, ast.ImportFrom):
        used.update(a.name for a in node.names)
    if used & _ORDERING_NAMES:
      found.append(path.relative_to(root).with_suffix("").as_posix())
  for path in sorted((root / "_native").glob("*.[ch]*")):
    if _ORDERING_NATIVE_NAMES.search(path.read_text()):
      found.append(path.relative_to(root).as_posix())
  return found


_HOME = "_engine/output_order"


def _named_in(text: str, module: str) -> bool:
  """Whether ``text`` names ``module`` (``_core/lowering``, a package by
  its ``__init__``, a C++ file as ``_native/queue.h``) by its path or its
  dotted name."""
  module = module.removesuffix("/__init__")
  forms = [module, f"hostcb/{module}"]
  if module.startswith(_HOME + "/"):  # the map's own: ``.reads``
    forms.append(module.replace(_HOME + "/", "."))
  if "." not in module:  # a Python module: its dotted name too
    forms += [module.replace("/", "."), "hostcb." + module.replace("/", ".")]
  return any(
    re.search(rf"(?<![\w/.]){re.escape(form)}(?!\w)", text)
    or form.startswith(".")
    and re.search(rf"`{re.escape(form)}(?!\w)", text)
    for form in forms
  )


def test_the_map_of_output_ordering_names_every_module_that_takes_part():
  from hostcb._engine import output_order

  missing = [
    m
    for m in _modules_taking_part()
    if m not in ("__init__", f"{_HOME}/__init__")
    and not _named_in(output_order.__doc__, m)
  ]
  assert missing == []
