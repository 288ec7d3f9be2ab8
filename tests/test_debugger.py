"""``hostcb.debug.breakpoint`` and ``breakpoint_if``: debugger sessions
driven by a scripted stdin, each in its own interpreter.

Each program (``_PROGRAM``, one case per run) is run with JAX's own
``jax.debug.breakpoint`` and with hostcb's in its place
(``hostcb.install(jax_callbacks=True)``): where JAX's works, the two
print the same text; where JAX's fails, the test shows JAX's failure and
hostcb's exact session.  Every run is bounded (``TIMEOUT``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import hostcb
from _helpers import REPO, hostcb_root

TIMEOUT = 120  # seconds, for one run of one program

_PROGRAM = """\
import os, sys
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
if os.environ["BREAKPOINT"] == "hostcb":
  import hostcb
  hostcb.install(jax_callbacks=True)
  assert jax.debug.breakpoint is hostcb.debug.breakpoint
case = sys.argv[1]
x = jnp.arange(3.0)


def f(x):
  y = jnp.sin(x)
  jax.debug.breakpoint()
  return y * 2


def body(c, x):
  c = c + x
  jax.debug.breakpoint()
  return c, c


def step(c, x):
  c = c / x
  hostcb.debug.breakpoint_if(~jnp.isfinite(c).all())
  return c, c


def big(x):
  y = x * 2
  hostcb.debug.breakpoint_if(y > 3)
  return y


def keyed(k, x):
  y = x + jax.random.uniform(k)
  jax.debug.breakpoint()
  return y


if case == "jit":
  print(jax.jit(f)(x))
elif case == "eager":
  print(f(x))
elif case == "vmap":
  print(jax.vmap(jax.vmap(f))(jnp.arange(6.0).reshape(2, 3)))
elif case == "jit_vmap":
  print(jax.jit(jax.vmap(jax.vmap(f)))(jnp.arange(6.0).reshape(2, 3)))
elif case == "scan":
  print(jax.jit(lambda xs: jax.lax.scan(body, 0.0, xs))(x))
elif case == "while":
  loop = lambda c: (c[0] + 1, f(c[1]))
  print(jax.jit(lambda x: jax.lax.while_loop(lambda c: c[0] < 2, loop, (0, x)))(x))
elif case == "cond":
  print(jax.jit(lambda x: jax.lax.cond(x.sum() > 0, f, jnp.cos, x))(x))
elif case == "grad":
  print(jax.jit(jax.grad(lambda x: f(x).sum()))(x))
elif case == "eval_shape":
  jf = jax.jit(f)
  def g(x):
    z = x + 1
    return jf(z)
  print(jax.eval_shape(g, x))
  print(jf(x))
elif case == "key_reuse":
  jax.config.update("jax_debug_key_reuse", True)
  keys = jax.random.split(jax.random.key(0), 2)
  print(jax.jit(jax.vmap(keyed))(keys, jnp.arange(2.0)))
elif case == "key":
  print(jax.jit(keyed)(jax.random.key(0), jnp.arange(2.0)))
elif case == "nan":
  xs = jnp.array([[1.0, 2.0], [4.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
  print(jax.jit(lambda xs: jax.lax.scan(step, jnp.ones(2), xs))(xs)[0])
elif case == "if_vmap":
  print(jax.jit(jax.vmap(big))(jnp.arange(4.0)))
  print(jax.jit(jax.vmap(big))(jnp.arange(2.0)))
elif case == "pmap":
  out = jax.pmap(f)(jnp.arange(2.0))
  out.block_until_ready()
  print("ready", out)
elif case == "shard_map":
  mesh = jax.make_mesh((2,), ("i",))
  xs = jax.device_put(jnp.arange(4.0), NamedSharding(mesh, P("i")))
  fn = jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
  out = jax.jit(fn)(xs)
  out.block_until_ready()
  print("ready", out)
elif case == "exact":
  def work(x, stop):
    y = jnp.exp(jnp.sin(x) * 3.7) / (1.0 + x * x)
    z = jnp.cumsum(y) @ jnp.cos(y)
    if stop:
      hostcb.debug.breakpoint()
    return jnp.tanh(z * y), jax.grad(lambda x: jnp.sum(jnp.log1p(x * y)))(x)
  xs = jnp.linspace(-3.0, 5.0, 1000)
  for a, b in zip(jax.jit(work, static_argnums=1)(xs, True),
                  jax.jit(work, static_argnums=1)(xs, False)):
    print(a.dtype, a.shape, a.tobytes() == b.tobytes())
elif case == "never":
  xs = jnp.array([[1.0, 2.0], [4.0, 1.0]])
  print(jax.jit(lambda xs: jax.lax.scan(step, jnp.ones(2), xs))(xs)[0])
  print(jax.jit(jax.vmap(big))(jnp.arange(2.0)))
"""


def _run(tmp_path, breakpoint: str, case: str, commands: str, devices=1):
  """``(returncode, stdout, stderr)`` of the program's ``case`` with
  ``breakpoint`` ("jax" or "hostcb") and ``commands`` on its stdin."""
  program = tmp_path / "program.py"
  program.write_text(_PROGRAM)
  env = dict(os.environ)
  env["PYTHONPATH"] = hostcb_root()
  env["JAX_PLATFORMS"] = "cpu"
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env["BREAKPOINT"] = breakpoint
  proc = subprocess.run(
    [sys.executable, str(program), case],
    input=commands,
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=TIMEOUT,
  )
  return proc.returncode, proc.stdout, proc.stderr


def _same_as_jax(tmp_path, case: str, commands: str, devices=1) -> str:
  """hostcb's stdout, after checking that it is JAX's, both runs exiting
  with 0."""
  jax_rc, jax_out, jax_err = _run(tmp_path, "jax", case, commands, devices)
  rc, out, err = _run(tmp_path, "hostcb", case, commands, devices)
  assert (jax_rc, rc) == (0, 0), (jax_err[-2000:], err[-2000:])
  assert out == jax_out
  return out


def _hostcb(tmp_path, case: str, commands: str, devices=1) -> str:
  rc, out, err = _run(tmp_path, "hostcb", case, commands, devices)
  assert rc == 0, err[-3000:]
  return out


def _line(text: str) -> int:
  """The number of the program's first line that holds ``text``."""
  lines = _PROGRAM.splitlines()
  return next(i for i, line in enumerate(lines, 1) if text in line)


def _jax_fails(tmp_path, case: str, commands: str, error: str) -> None:
  rc, _, err = _run(tmp_path, "jax", case, commands)
  assert rc != 0 and error in err, err[-3000:]


def _stop(*shown: str) -> str:
  """The text of one stop: the intro, each command's output after its
  prompt, and the prompt that reads ``c``."""
  return (
    "Entering jdb:\n" + "".join(f"(jdb) {line}\n" for line in shown) + "(jdb) "
  )


# ----------------------------------------- JAX's session, where JAX's works
def test_session_prints_what_jax_cli_debugger_prints(tmp_path):
  commands = "p x\npp y\nu\nu\nd\nd\nl\nll\nw\nh\nhelp\n1 +\nc\n"
  out = _same_as_jax(tmp_path, "jit", commands)
  program = tmp_path / "program.py"
  at, call = _line("jax.debug.breakpoint()"), _line("print(jax.jit(f)(x))")
  assert out.startswith(
    _stop(
      "Array([0., 1., 2.], dtype=float32)",
      "Array([0.        , 0.84147096, 0.9092974 ], dtype=float32)",
      f"> {program}({call})",
    ).removesuffix("(jdb) ")
  )
  assert "(jdb) *** NameError: name 'll' is not defined\n" in out
  assert "(jdb) At topmost frame.\n" in out
  assert "(jdb) At bottommost frame.\n" in out
  assert (
    f'(jdb) Traceback:\n  File "{program}", line {call}\n'
    f"    print(jax.jit(f)(x))\n"
    f'  File "{program}", line {at}\n    jax.debug.breakpoint()\n'
  ) in out
  assert "Documented commands (type help <topic>):" in out
  assert out.endswith("(jdb) [0.        1.6829419 1.8185948]\n")


def test_quit_ends_the_session_and_fails_the_computation(tmp_path):
  jax_rc, jax_out, _ = _run(tmp_path, "jax", "jit", "p x\nq\n")
  rc, out, _ = _run(tmp_path, "hostcb", "jit", "p x\nq\n")
  assert out == jax_out == _stop("Array([0., 1., 2.], dtype=float32)")
  assert rc != 0 and jax_rc != 0


def test_outside_jit_the_session_runs_at_once_as_jax(tmp_path):
  out = _same_as_jax(tmp_path, "eager", "p y\nc\n")
  assert out == (
    _stop("Array([0.        , 0.84147096, 0.9092974 ], dtype=float32)")
    + "[0.        1.6829419 1.8185948]\n"
  )


def test_vmap_stops_once_per_element_in_jax_order(tmp_path):
  # JAX's order outside jit: the inner vmap's index varies slowest.
  out = _same_as_jax(tmp_path, "vmap", "p x\nc\n" * 6)
  assert out == (
    "".join(_stop(f"Array({v}., dtype=float32)") for v in (0, 3, 1, 4, 2, 5))
    + "[[ 0.         1.6829419  1.8185948]\n"
    " [ 0.28224   -1.513605  -1.9178486]]\n"
  )


@pytest.mark.parametrize(
  "case, stops",
  [("scan", 3), ("while", 2), ("cond", 1), ("grad", 1)],
)
def test_stops_under_control_flow_and_grad_as_jax(tmp_path, case, stops):
  out = _same_as_jax(tmp_path, case, "p x\nc\n" * stops)
  assert out.count("Entering jdb:") == stops


# ------------------------------------------------ where JAX's fails
def test_jit_vmap_stops_in_jax_order_not_xla_schedule(tmp_path):
  # JAX's stops under jit come in the order XLA schedules them (0, 5, 2,
  # 4, 1, 3 here): hostcb's come in the order of vmap outside jit.
  out = _hostcb(tmp_path, "jit_vmap", "p x\nc\n" * 6)
  assert out == (
    "".join(_stop(f"Array({v}., dtype=float32)") for v in (0, 3, 1, 4, 2, 5))
    + "[[ 0.         1.6829419  1.8185948]\n"
    " [ 0.28224   -1.513605  -1.9178486]]\n"
  )


def test_after_eval_shape_of_a_caller_no_tracer_leaks(tmp_path):
  commands = "p y\nu\np z\nc\n"
  _jax_fails(tmp_path, "eval_shape", commands, "UnexpectedTracerError")
  out = _hostcb(tmp_path, "eval_shape", commands)
  program = tmp_path / "program.py"
  # The stop shows the stack of the trace (eval_shape's): g's local was
  # traced by eval_shape, not by this jit.
  assert out == (
    "ShapeDtypeStruct(shape=(3,), dtype=float32)\n"
    + _stop(
      "Array([0.        , 0.84147096, 0.9092974 ], dtype=float32)",
      f"> {program}({_line('return jf(z)')})\n"
      "      def g(x):\n"
      "        z = x + 1\n"
      "->      return jf(z)\n"
      "    ",
      "<traced outside this computation: float32[3]>",
    )
    + "[0.        1.6829419 1.8185948]\n"
  )


def test_key_reuse_checker_on_under_vmap(tmp_path):
  commands = "p x\np k\nc\np x\np k\nc\n"
  _jax_fails(tmp_path, "key_reuse", commands, "KeyReuseError")
  out = _hostcb(tmp_path, "key_reuse", commands)
  assert out == (
    _stop(
      "Array(0., dtype=float32)",
      "Array((), dtype=key<fry>) overlaying:\n[1797259609 2579123966]",
    )
    + _stop(
      "Array(1., dtype=float32)",
      "Array((), dtype=key<fry>) overlaying:\n[ 928981903 3453687069]",
    )
    + "[0.8423141 1.0072938]\n"
  )


def test_key_typed_locals_are_shown_as_keys(tmp_path):
  # JAX's shows the key's data, Array([0, 0], dtype=uint32).
  out = _hostcb(tmp_path, "key", "p k\np y\nc\n")
  assert out == (
    _stop(
      "Array((), dtype=key<fry>) overlaying:\n[0 0]",
      "Array([0.947667, 1.947667], dtype=float32)",
    )
    + "[0.947667 1.947667]\n"
  )


@pytest.mark.parametrize("case", ["pmap", "shard_map"])
def test_devices_stop_one_after_another_and_the_program_waits(tmp_path, case):
  out = _hostcb(tmp_path, case, "p x\nc\np x\nc\n", devices=2)
  shards = ("0.", "1.") if case == "pmap" else ("[0., 1.]", "[2., 3.]")
  stops = [_stop(f"Array({v}, dtype=float32)") for v in shards]
  result = (
    "ready [0.        1.6829419]\n"
    if case == "pmap"
    else "ready [0.        1.6829419 1.8185948 0.28224  ]\n"
  )
  # The devices' order is the order in which they reach the stop.
  assert out in (stops[0] + stops[1] + result, stops[1] + stops[0] + result)


# ------------------------------------------------------------ breakpoint_if
def test_breakpoint_if_stops_only_for_the_elements_where_pred_holds(tmp_path):
  out = _hostcb(tmp_path, "if_vmap", "p x\np y\nc\np x\nc\n")
  assert out == (
    _stop("Array(2., dtype=float32)", "Array(4., dtype=float32)")
    + _stop("Array(3., dtype=float32)")
    + "[0. 2. 4. 6.]\n[0. 2.]\n"
  )


def test_breakpoint_if_finds_where_a_nan_first_appears(tmp_path):
  out = _hostcb(tmp_path, "nan", "p x\np c\nc\np x\np c\nc\n")
  assert out == (
    _stop("Array([0., 1.], dtype=float32)", "Array([inf, 0.5], dtype=float32)")
    + _stop(
      "Array([0., 0.], dtype=float32)", "Array([inf, inf], dtype=float32)"
    )
    + "[inf inf]\n"
  )


def test_breakpoint_if_that_never_holds_opens_no_session(tmp_path):
  # Nothing on stdin: a session would end the program at once (EOF).
  assert _hostcb(tmp_path, "never", "") == "[0.25 0.5 ]\n[0. 2.]\n"


def test_breakpoint_if_calls_the_host_only_inside_a_cond_on_pred():
  def g(x):
    hostcb.debug.breakpoint_if(x.sum() > 0)
    return x

  for fn in (g, jax.vmap(g)):
    jaxpr = jax.make_jaxpr(fn)(jnp.ones((2, 2))).jaxpr
    calls = [e for e in jaxpr.eqns if e.primitive.name == "hostcb_call"]
    conds = [e for e in jaxpr.eqns if e.primitive.name == "cond"]
    assert calls == [] and len(conds) == 1
    (empty, stop) = conds[0].params["branches"]
    assert empty.jaxpr.eqns == []
    assert [e.primitive.name for e in stop.jaxpr.eqns] == ["hostcb_call"]


def test_breakpoint_if_wants_a_scalar_pred():
  with pytest.raises(ValueError, match="scalar boolean, got shape \\(2,\\)"):
    hostcb.debug.breakpoint_if(jnp.ones(2) > 0)


# ---------------------------------------------------------- what it changes
def test_a_stop_changes_nothing_the_program_computes(tmp_path):
  out = _hostcb(tmp_path, "exact", "c\n")
  assert out == _stop() + "float32 (1000,) True\nfloat32 (1000,) True\n"


def test_token_is_returned_unchanged():
  x = jnp.arange(3.0)
  assert hostcb.debug.breakpoint(token=x, stdin=_Commands("c\n")) is x


class _Commands:
  """A stdin for an in-process session (``cmd.Cmd`` reads lines)."""

  def __init__(self, text: str):
    self.lines = text.splitlines(keepends=True)

  def readline(self) -> str:
    return self.lines.pop(0) if self.lines else ""


def test_install_puts_it_in_place_of_jax_breakpoint_and_uninstall_undoes_it():
  jax_own = jax.debug.breakpoint
  assert jax_own is not hostcb.debug.breakpoint
  hostcb.install_jax_callbacks()
  try:
    assert jax.debug.breakpoint is hostcb.debug.breakpoint
  finally:
    hostcb.uninstall_jax_callbacks()
  assert jax.debug.breakpoint is jax_own
