"""`hostcb info`: the facts a bug report needs, and why the engine is not
built (`hostcb._native.build_failure`)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

import hostcb
from _helpers import hostcb_root, run_python
from hostcb import _native, engine
from hostcb.tools import info

STRICT = "strict barrier (runtime tokens; legacy's cross-thread barrier)"
FAST = "fast dispatch (default)"
# Environment variables that change what `hostcb info` says.
_OPTIONS = (
  "HOSTCB_DISABLE_NATIVE",
  "HOSTCB_STRICT_BARRIER",
  "HOSTCB_FAST_DISPATCH",
  "JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE",
)


def _cpu_count() -> int:
  return len(jax.devices("cpu"))


def _info(*, root: str | None = None, **env_extra: str) -> dict[str, str]:
  """Runs `python -m hostcb info` on the CPU, with as many CPU devices as
  this process has; returns its lines as {key: value}, in order."""
  env = {k: v for k, v in os.environ.items() if k not in _OPTIONS}
  env["PYTHONPATH"] = root or hostcb_root()
  env["JAX_PLATFORMS"] = "cpu"
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={_cpu_count()}"
  env.update(env_extra)
  res = subprocess.run(
    [sys.executable, "-m", "hostcb", "info"],
    env=env,
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert res.returncode == 0, res.stderr
  lines = res.stdout.splitlines()
  assert all(": " in line for line in lines), res.stdout
  pairs = [line.split(": ", 1) for line in lines]
  keys = [k for k, _ in pairs]
  assert len(set(keys)) == len(keys), res.stdout
  return dict(pairs)


def test_info_prints_the_facts_in_order_without_the_engine():
  out = _info(HOSTCB_DISABLE_NATIVE="1")
  expected = [
    "hostcb",
    "hostcb location",
    "jax",
    "jaxlib",
    "numpy",
    "python",
    "platform",
    "backend",
    "devices",
    "native engine",
    "native engine unavailable",
  ]
  if _native.build_failure() is not None:
    expected.append("native engine build failure")
  assert list(out) == [
    *expected,
    "GPU engine",
    "dispatch",
    "queue bound",
    "changed by hostcb",
    "kept by JAX",
  ]


def test_info_says_the_gpu_engine_is_on_by_default_and_idle_without_a_gpu():
  # The suite runs with JAX_PLATFORMS=cpu: JAX has no GPU here.
  assert _info()["GPU engine"] == (
    "on (default); no NVIDIA GPU in this process"
  )


def test_info_says_the_gpu_engine_is_off_when_turned_off():
  assert _info(HOSTCB_GPU_ENGINE="0")["GPU engine"] == (
    "off (HOSTCB_GPU_ENGINE=0; XLA's Python callbacks on GPUs)"
  )


def test_info_names_the_versions_that_run():
  from jaxlib import version as jaxlib_version

  out = _info()
  assert out["hostcb"] == hostcb.__version__
  assert out["jax"] == jax.__version__
  assert out["jaxlib"] == jaxlib_version.__version__
  assert out["numpy"] == np.__version__
  assert out["python"] == (
    f"{platform.python_version()} "
    f"({platform.python_implementation()}, "
    f"{sys.executable})"
  )


def test_info_names_the_hostcb_it_imported():
  assert _info()["hostcb location"] == os.path.join(hostcb_root(), "hostcb")


def test_info_names_the_platform():
  assert _info()["platform"] == platform.platform()


def test_info_names_the_backend_and_each_device_as_jax_does():
  out = _info()
  assert out["backend"] == "cpu"
  assert out["devices"] == ", ".join(str(d) for d in jax.devices("cpu"))


def test_info_says_why_the_native_engine_is_not_used():
  out = _info(HOSTCB_DISABLE_NATIVE="1")
  assert out["native engine"] == "no"
  assert out["native engine unavailable"] == "disabled by HOSTCB_DISABLE_NATIVE"


def test_info_says_the_native_engine_is_used():
  if not engine.available():
    pytest.skip(f"no native engine here: {engine.unavailable_reason()}")
  out = _info()
  assert out["native engine"] == "yes"
  assert "native engine unavailable" not in out
  assert "native engine build failure" not in out


def test_info_names_the_strict_barrier_when_it_is_on():
  assert (
    _info(HOSTCB_STRICT_BARRIER="1", HOSTCB_FAST_DISPATCH="0")["dispatch"]
    == STRICT
  )


def test_info_names_fast_dispatch_when_it_is_on():
  assert (
    _info(HOSTCB_STRICT_BARRIER="0", HOSTCB_FAST_DISPATCH="1")["dispatch"]
    == FAST
  )


def test_info_names_fast_dispatch_by_default():
  try:
    hostcb.config.read("hostcb_strict_barrier")
  except KeyError:
    pytest.skip("this hostcb has no hostcb_strict_barrier option yet")
  assert _info()["dispatch"] == FAST


def test_info_names_the_queue_bound():
  out = _info(JAX_HOST_CALLBACK_MAX_QUEUE_BYTE_SIZE="32000000")
  assert out["queue bound"] == "32000000 bytes per device"


def test_info_says_the_command_changed_nothing():
  # Importing hostcb changes none of JAX's objects and none of Python's
  # hooks; the command traces no program.
  assert _info()["changed by hostcb"] == "nothing in this process"


def test_report_in_process_lists_what_a_traced_tap_changed():
  proc = run_python(
    "import jax, numpy as np, hostcb\n"
    "from hostcb.tools import info\n"
    "jax.jit(lambda x: hostcb.id_tap(lambda *a: None, x))(np.float32(1))\n"
    "hostcb.barrier_wait()\n"
    "line = [l for l in info.report().splitlines()\n"
    "        if l.startswith('changed by hostcb: ')][0]\n"
    "print('jax.effects_barrier (effects barrier)' in line)\n"
    "hostcb.uninstall()\n"
    "print([l for l in info.report().splitlines()\n"
    "       if l.startswith('changed by hostcb: ')])\n"
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == (
    "True\n['changed by hostcb: nothing in this process']\n"
  )


def test_report_in_process_starts_with_hostcb_and_ends_each_line():
  text = info.report()
  assert text.startswith(f"hostcb: {hostcb.__version__}\n")
  assert text.endswith("\n")
  assert f"\njax: {jax.__version__}\n" in text


# ------------------------------------------------- the recorded build failure
def _package_copy(tmp_path, failure: str | None) -> str:
  """A copy of the tested hostcb (the package and its import hook's modules)
  without its extension, with `failure` as the install's recorded build
  failure; returns its root."""
  root = tmp_path / "site"
  shutil.copytree(
    os.path.join(hostcb_root(), "hostcb"),
    root / "hostcb",
    ignore=shutil.ignore_patterns(
      "*.so", "*.pyd", "_build_failure.txt", "__pycache__"
    ),
  )
  for hook in ("_hostcb_startup_finder.py", "_hostcb_env.py"):
    shutil.copy(os.path.join(hostcb_root(), hook), root)
  if failure is not None:
    (root / "hostcb" / "_native" / "_build_failure.txt").write_text(failure)
  return str(root)


def _build_failure_of(root: str) -> subprocess.CompletedProcess:
  """`build_failure()` of `hostcb/_native/__init__.py` under `root`, loaded
  on its own (not through hostcb, which imports JAX) by a fresh
  interpreter that checks it imported no JAX for it."""
  path = os.path.join(root, "hostcb", "_native", "__init__.py")
  code = (
    "import importlib.util, sys\n"
    f"spec = importlib.util.spec_from_file_location('native', {path!r})\n"
    "native = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(native)\n"
    "print(repr(native.build_failure()))\n"
    "assert 'jax' not in sys.modules, 'build_failure imported jax'\n"
  )
  return subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
  )


def test_build_failure_reads_the_line_the_install_wrote(tmp_path):
  root = _package_copy(
    tmp_path, "compiling hostcb._native._engine failed: g++: not found\n"
  )
  res = _build_failure_of(root)
  assert res.returncode == 0, res.stderr
  assert res.stdout == (
    "'compiling hostcb._native._engine failed: g++: not found'\n"
  )


def test_build_failure_is_none_without_a_recorded_failure(tmp_path):
  res = _build_failure_of(_package_copy(tmp_path, None))
  assert res.returncode == 0, res.stderr
  assert res.stdout == "None\n"


def test_build_failure_is_none_for_an_empty_file(tmp_path):
  res = _build_failure_of(_package_copy(tmp_path, ""))
  assert res.returncode == 0, res.stderr
  assert res.stdout == "None\n"


def test_info_shows_the_recorded_build_failure(tmp_path):
  root = _package_copy(
    tmp_path, "cannot find the headers to build against: no jaxlib\n"
  )
  out = _info(root=root)
  assert out["native engine"] == "no"
  assert out["native engine build failure"] == (
    "cannot find the headers to build against: no jaxlib"
  )
