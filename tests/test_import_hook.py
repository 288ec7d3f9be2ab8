"""The legacy import path: from jax.experimental import host_callback."""
import importlib.metadata

import pytest

from _helpers import run_python


def test_install_makes_legacy_import_resolve_to_hostcb():
  proc = run_python("""
import hostcb
hostcb.install()
from jax.experimental import host_callback as hcb
import jax
assert hcb.id_tap is hostcb.id_tap and hcb.call is hostcb.call
assert hcb.CallbackException is hostcb.CallbackException
out = jax.jit(lambda x: hcb.id_print(x, what="legacy"))(2)
hcb.barrier_wait()
""")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "what: legacy\n2\n"


def test_legacy_module_exports_the_public_names():
  proc = run_python("""
import hostcb
hostcb.install()
import jax.experimental.host_callback as hcb
names = ["id_tap", "id_print", "call", "barrier_wait", "stop_outfeed_receiver",
         "CallbackException", "TapFunctionException", "CallbackFlavor"]
print(all(hasattr(hcb, n) for n in names))
""")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "True\n"


def test_hook_acts_only_on_host_callback():
  proc = run_python("""
import hostcb
hostcb.install()
try:
    import jax.experimental.no_such_module_xyz
except ModuleNotFoundError:
    print("ok")
""")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "ok\n"


def _installed_non_editable() -> bool:
  try:
    dist = importlib.metadata.distribution("hostcb")
  except importlib.metadata.PackageNotFoundError:
    return False
  files = [str(f) for f in (dist.files or [])]
  return any(f.endswith("hostcb-legacy-import.pth") for f in files) and any(
      f.startswith("hostcb/") for f in files)


needs_pth_hook = pytest.mark.skipif(
    not _installed_non_editable(),
    reason="hostcb is not pip-installed (non-editable) in this interpreter, "
           "so its .pth import hook is absent")


@needs_pth_hook
def test_installed_package_hooks_legacy_import_without_install_call():
  proc = run_python("""
from jax.experimental import host_callback as hcb
import hostcb
assert hcb.id_tap is hostcb.id_tap
print(hcb.__name__)
""", use_src=False)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "hostcb.host_callback\n"


@needs_pth_hook
def test_hostcb_no_import_hook_disables_the_pth_hook():
  proc = run_python("""
try:
    from jax.experimental import host_callback
    print("imported")
except ImportError:
    print("no module")
""", use_src=False, env_extra={"HOSTCB_NO_IMPORT_HOOK": "1"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "no module\n"


@needs_pth_hook
def test_interpreter_start_imports_neither_jax_nor_hostcb():
  proc = run_python("""
import sys
print("jax" in sys.modules, "hostcb" in sys.modules)
""", use_src=False)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "False False\n"


@needs_pth_hook
def test_program_sets_jax_environment_before_importing_jax():
  # JAX reads JAX_* variables when it is imported: the .pth file must not
  # import it first.
  proc = run_python("""
import os
os.environ["JAX_ENABLE_X64"] = "1"
import jax
from jax.experimental import host_callback as hcb
print(jax.config.jax_enable_x64, jax.numpy.zeros(1).dtype)
""", use_src=False)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "True float64\n"
