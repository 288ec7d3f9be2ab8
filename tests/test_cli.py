"""The `hostcb` command: `demo` and `run` (the `hlo` command has its own file)."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

from _helpers import hostcb_root

REPO = pathlib.Path(__file__).resolve().parent.parent


def _hostcb(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
  env = dict(os.environ)
  env["PYTHONPATH"] = hostcb_root() + os.pathsep + env.get("PYTHONPATH", "")
  env.pop("XLA_FLAGS", None)
  return subprocess.run([sys.executable, "-m", "hostcb", *args], env=env,
                        capture_output=True, text=True, timeout=timeout,
                        cwd=REPO)


def test_run_executes_a_legacy_script_unchanged():
  res = _hostcb("run", "examples/legacy_script.py", "3")
  assert res.returncode == 0, res.stderr
  assert res.stdout == (
      "what: step,acc\n( 0 1. )\n"
      "what: step,acc\n( 1 2. )\n"
      "what: step,acc\n( 2 4. )\n"
      "total 8.0 doubled on the host 16.0\n")


def test_run_passes_the_exit_status_of_the_script(tmp_path):
  script = tmp_path / "exits.py"
  script.write_text("import sys\nsys.exit(3)\n")
  assert _hostcb("run", str(script)).returncode == 3


def test_run_reports_a_missing_script():
  res = _hostcb("run", "no/such/script.py")
  assert res.returncode == 2
  assert "no such script" in res.stderr


def test_run_restores_jax_xla_computation(tmp_path):
  script = tmp_path / "uses_xla_computation.py"
  script.write_text("import jax\nimport hostcb\n"
                    "print(jax.xla_computation is hostcb.xla_computation)\n")
  res = _hostcb("run", str(script))
  assert res.returncode == 0, res.stderr
  assert res.stdout == "True\n"


def test_demo_shows_every_part_of_the_tour():
  res = _hostcb("demo")
  assert res.returncode == 0, res.stderr
  out = res.stdout
  assert "what: x,x^2\n( 3. 9. )\n" in out
  assert ("transforms: [('batch', {'batch_dims': (0, 0)})] what: x,x^2\n"
          "( [2. 3.] [4. 9.] )\n") in out
  # One tap per device, in any order; devices print as the running JAX
  # names them.
  pmap_taps = re.findall(r"device: (\S+) where: pmap\n(\d+)\.\n", out)
  assert sorted(pmap_taps) == [("cpu:0", "2"), ("cpu:1", "4"),
                               ("cpu:2", "6"), ("cpu:3", "8")]
  assert "eigenvalues of a 90° rotation: [0.+1.j 0.-1.j]" in out
  assert ("barrier_wait raised CallbackException: ValueError: tapped value "
          "5.0 is too large") in out
