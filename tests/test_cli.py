"""The `hostcb` command: `demo` and `run` (the `hlo` command has its own file)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import jax

from _helpers import hostcb_root

REPO = pathlib.Path(__file__).resolve().parent.parent


def _hostcb(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
  env = dict(os.environ)
  env["PYTHONPATH"] = hostcb_root() + os.pathsep + env.get("PYTHONPATH", "")
  env.pop("XLA_FLAGS", None)
  return subprocess.run(
    [sys.executable, "-m", "hostcb", *args],
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=REPO,
  )


def test_run_executes_a_legacy_script_unchanged():
  res = _hostcb("run", "examples/legacy_script.py", "3")
  assert res.returncode == 0, res.stderr
  assert res.stdout == (
    "what: step,acc\n( 0 1. )\n"
    "what: step,acc\n( 1 2. )\n"
    "what: step,acc\n( 2 4. )\n"
    "total 8.0 doubled on the host 16.0\n"
  )


def test_run_passes_the_exit_status_of_the_script(tmp_path):
  script = tmp_path / "exits.py"
  script.write_text("import sys\nsys.exit(3)\n")
  assert _hostcb("run", str(script)).returncode == 3


def test_run_reports_a_missing_script():
  res = _hostcb("run", "no/such/script.py")
  assert res.returncode == 2
  assert "no such script" in res.stderr


def test_run_shows_the_traceback_of_a_missing_file_inside_the_script(tmp_path):
  # Only the script itself missing is exit status 2 without a traceback; a
  # FileNotFoundError raised by the script is the script's own failure.
  script = tmp_path / "opens.py"
  script.write_text("open('no/such/data.txt')\n")
  res = _hostcb("run", str(script))
  assert res.returncode == 1
  assert "Traceback (most recent call last)" in res.stderr, res.stderr
  assert (
    "FileNotFoundError: [Errno 2] No such file or directory: 'no/such/data.txt'"
  ) in res.stderr
  assert "no such script" not in res.stderr


def test_run_restores_jax_xla_computation(tmp_path):
  script = tmp_path / "uses_xla_computation.py"
  script.write_text(
    "import jax\nimport hostcb\n"
    "print(jax.xla_computation is hostcb.xla_computation)\n"
  )
  res = _hostcb("run", str(script))
  assert res.returncode == 0, res.stderr
  assert res.stdout == "True\n"


def test_demo_shows_every_part_of_the_tour():
  res = _hostcb("demo")
  assert res.returncode == 0, res.stderr
  out = res.stdout
  # The computation's print, then the caller's label: JAX's order.
  assert "what: x,x^2\n( 3. 9. )\nresult: 27.0\n" in out
  assert (
    "transforms: [('batch', {'batch_dims': (0, 0)})] what: x,x^2\n"
    "( [2. 3.] [4. 9.] )\n"
  ) in out
  # One tap per device, in any order; devices print as the running JAX
  # names them.
  pmap_taps = re.findall(r"device: (\S+) where: pmap\n(\d+)\.\n", out)
  # The demo runs on 4 CPU devices whatever this process has: name them
  # after this JAX's name for device 0 ("cpu:0", or "TFRT_CPU_0" on JAX 0.8).
  first = str(jax.devices("cpu")[0])
  names = [first[:-1] + str(i) for i in range(4)]
  assert sorted(pmap_taps) == sorted(zip(names, ["2", "4", "6", "8"]))
  # The bars of hostcb.progress end at their totals (tqdm is a test
  # dependency), or the demo says why this JAX or environment has none.
  if "hostcb.progress needs a JAX whose" in out:
    assert jax.__version__ == "0.8.0", out
  elif importlib.util.find_spec("tqdm") is None:
    assert (
      "hostcb.progress needs tqdm, which is not installed: pip install "
      "hostcb[progress]  (or: pip install tqdm)\n" in out
    )
  else:
    assert re.search(r"vmap of scan: 100%\|#+\| 200000/200000 ", out), out
    assert re.search(
      r"pmap of scan \[4 devices\]: 100%\|#+\| 200000/200000 ", out
    ), out
  assert "eigenvalues of a 90° rotation: [0.+1.j 0.-1.j]" in out
  assert (
    "barrier_wait raised CallbackException: ValueError: tapped value "
    "5.0 is too large"
  ) in out


# ------------------------------------------------- run --jax-callbacks
_JAX_CALLBACKS_SCRIPT = """
import sys
import jax
import jax.numpy as jnp
from jax.experimental import io_callback
import hostcb

print("installed", jax.debug.print is hostcb.debug.jax_print,
      io_callback is hostcb.io_callback, sys.argv[1:])
sys.stdout.flush()
seen = []


@jax.jit
def f(x):
  def body(c, i):
    jax.debug.print("step {i}: {c}", i=i, c=c)
    jax.debug.callback(lambda a: seen.append(int(a)), i)
    c = io_callback(lambda a: a * 2, jax.ShapeDtypeStruct((), jnp.float32), c)
    return jax.pure_callback(lambda a: a + 1,
                             jax.ShapeDtypeStruct((), jnp.float32), c), None
  return jax.lax.scan(body, x, jnp.arange(3))[0]


f(1.0)
# No barrier: the runner's barrier at the end delivers the last prints.
"""


def test_run_jax_callbacks_routes_jax_callbacks_through_hostcb(tmp_path):
  script = tmp_path / "uses_jax_callbacks.py"
  script.write_text(_JAX_CALLBACKS_SCRIPT)
  res = _hostcb("run", "--jax-callbacks", str(script), "a", "--b")
  assert res.returncode == 0, res.stderr
  assert res.stdout == (
    "installed True True ['a', '--b']\nstep 0: 1.0\nstep 1: 3.0\nstep 2: 7.0\n"
  )


def test_run_jax_callbacks_prints_a_labelled_result_after_its_prints(tmp_path):
  script = tmp_path / "labelled.py"
  script.write_text(
    "import jax, jax.numpy as jnp\n"
    "f = jax.jit(lambda x: (jax.debug.print('x = {x}', x=x), x * 2)[1])\n"
    "print('result:', f(jnp.arange(3.)))\n"
  )
  res = _hostcb("run", "--jax-callbacks", str(script))
  assert res.returncode == 0, res.stderr
  assert res.stdout == "x = [0. 1. 2.]\nresult: [0. 2. 4.]\n"


def test_run_without_jax_callbacks_leaves_jax_callbacks_alone(tmp_path):
  script = tmp_path / "uses_jax_callbacks.py"
  script.write_text(_JAX_CALLBACKS_SCRIPT)
  res = _hostcb("run", str(script), "--jax-callbacks")
  assert res.returncode == 0, res.stderr
  # The flag after the script is the script's; JAX's own callbacks print
  # while the scan runs.
  assert res.stdout == (
    "installed False False ['--jax-callbacks']\n"
    "step 0: 1.0\nstep 1: 3.0\nstep 2: 7.0\n"
  )


def test_run_jax_callbacks_logs_a_failed_callback(tmp_path):
  script = tmp_path / "fails.py"
  script.write_text(
    "import jax\n"
    "def check(x):\n"
    "  raise ValueError(f'bad value {x}')\n"
    "jax.jit(lambda x: jax.debug.callback(check, x))(2.0)\n"
    "print('script done')\n"
  )
  res = _hostcb("run", "--jax-callbacks", str(script))
  # Logged where JAX logs it, with its traceback; no read of the script
  # raised it, so the final barrier does (docs/jax_callbacks.md, "When a
  # callback fails"), and the script exits with status 1 as under JAX.
  assert res.returncode == 1, res.stderr
  assert res.stdout == "script done\n"
  assert "jax.debug.callback failed\nTraceback" in res.stderr
  assert "ValueError: bad value 2.0\n" in res.stderr
  assert (
    "hostcb run: JaxRuntimeError: INTERNAL: CpuCallback error calling "
    "callback: " in res.stderr
  )


def test_run_jax_callbacks_keeps_the_legacy_names(tmp_path):
  script = tmp_path / "legacy_and_new.py"
  script.write_text(
    "import jax\nimport hostcb\n"
    "from jax.experimental import host_callback as hcb\n"
    "print(hcb.id_tap is hostcb.id_tap,\n"
    "      jax.xla_computation is hostcb.xla_computation,\n"
    "      jax.pure_callback is hostcb.pure_callback)\n"
  )
  res = _hostcb("run", "--jax-callbacks", str(script))
  assert res.returncode == 0, res.stderr
  assert res.stdout == "True True True\n"


def test_the_console_script_names_the_command_line_entry_point():
  import importlib
  import tomllib
  from hostcb.tools import cli

  scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
    "scripts"
  ]
  module, _, name = scripts["hostcb"].partition(":")
  assert getattr(importlib.import_module(module), name) is cli.main
