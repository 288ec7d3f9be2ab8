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
    f.startswith("hostcb/") for f in files
  )


needs_pth_hook = pytest.mark.skipif(
  not _installed_non_editable(),
  reason="hostcb is not pip-installed (non-editable) in this interpreter, "
  "so its .pth import hook is absent",
)


@needs_pth_hook
def test_installed_package_hooks_legacy_import_without_install_call():
  proc = run_python(
    """
from jax.experimental import host_callback as hcb
import hostcb
assert hcb.id_tap is hostcb.id_tap
print(hcb.__name__)
""",
    use_src=False,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "hostcb.host_callback\n"


@needs_pth_hook
def test_hostcb_no_import_hook_disables_the_pth_hook():
  proc = run_python(
    """
try:
    from jax.experimental import host_callback
    print("imported")
except ImportError:
    print("no module")
""",
    use_src=False,
    env_extra={"HOSTCB_NO_IMPORT_HOOK": "1"},
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "no module\n"


@needs_pth_hook
def test_interpreter_start_imports_neither_jax_nor_hostcb():
  proc = run_python(
    """
import sys
print("jax" in sys.modules, "hostcb" in sys.modules)
""",
    use_src=False,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "False False\n"


@needs_pth_hook
def test_program_sets_jax_environment_before_importing_jax():
  # JAX reads JAX_* variables when it is imported: the .pth file must not
  # import it first.
  proc = run_python(
    """
import os
os.environ["JAX_ENABLE_X64"] = "1"
import jax
from jax.experimental import host_callback as hcb
print(jax.config.jax_enable_x64, jax.numpy.zeros(1).dtype)
""",
    use_src=False,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "True float64\n"


# --------------------------------------- install(jax_callbacks=True)
# The snapshot that these scripts compare: every attribute of every loaded
# module (hostcb's excepted) holding one of JAX's four callback functions
# or hostcb's, and the legacy names that install() sets.
_SNAPSHOT = """
import sys, types
import jax, jax.experimental
import hostcb

# JAX's own functions, from the modules that define them (before install).
JAX = {"debug_callback": sys.modules["jax._src.debugging"].debug_callback,
       "debug_print": sys.modules["jax._src.debugging"].debug_print,
       "io_callback": sys.modules["jax._src.callback"].io_callback,
       "pure_callback": sys.modules["jax._src.callback"].pure_callback}
assert all(f.__module__.startswith("jax._src.") for f in JAX.values())
OURS = {"debug_callback": hostcb.debug.jax_callback,
        "debug_print": hostcb.debug.jax_print,
        "io_callback": hostcb.io_callback,
        "pure_callback": hostcb.pure_callback}
PLACES = {("jax.debug", "callback"): "debug_callback",
          ("jax.debug", "print"): "debug_print",
          ("jax.experimental", "io_callback"): "io_callback",
          ("jax", "pure_callback"): "pure_callback",
          ("jax._src.debugging", "debug_callback"): "debug_callback",
          ("jax._src.debugging", "debug_print"): "debug_print",
          ("jax._src.callback", "io_callback"): "io_callback",
          ("jax._src.callback", "pure_callback"): "pure_callback"}
MISSING = "<missing>"

def holders():
  ids = {id(f): ("jax", k) for k, f in JAX.items()}
  ids.update({id(f): ("hostcb", k) for k, f in OURS.items()})
  found = {}
  for name, module in list(sys.modules.items()):
    if (not isinstance(module, types.ModuleType)
        or name.split(".")[0] == "hostcb"):
      continue
    for attr, value in list(vars(module).items()):
      if id(value) in ids:
        found[(name, attr)] = ids[id(value)]
  return found

def legacy():
  return (sys.modules.get("jax.experimental.host_callback", MISSING),
          getattr(jax.experimental, "host_callback", MISSING),
          getattr(jax, "xla_computation", MISSING))

def snapshot():
  return holders(), legacy()

def assert_hostcb_everywhere():
  for (module, attr), key in PLACES.items():
    assert getattr(sys.modules[module], attr) is OURS[key], (module, attr)
  assert all(v[0] == "hostcb" for v in holders().values()), holders()
  assert hostcb.jax_callbacks_installed()
"""


def test_install_jax_callbacks_rebinds_and_uninstall_restores_exactly():
  proc = run_python(
    _SNAPSHOT
    + """
before = snapshot()
assert not hostcb.jax_callbacks_installed()
assert set(PLACES) <= set(before[0])
hostcb.install(jax_callbacks=True)
assert_hostcb_everywhere()
assert jax.debug.print is hostcb.debug.jax_print
assert jax.debug.callback is hostcb.debug.jax_callback
assert jax.experimental.io_callback is hostcb.io_callback
assert jax.pure_callback is hostcb.pure_callback
assert jax.experimental.host_callback is hostcb.host_callback
hostcb.uninstall()
after = snapshot()
assert after == before, (after, before)
for (module, attr), key in PLACES.items():
  assert getattr(sys.modules[module], attr) is JAX[key], (module, attr)
assert not hostcb.jax_callbacks_installed()
print("ok")
"""
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "ok\n"


def test_install_without_jax_callbacks_leaves_them_alone():
  proc = run_python(
    _SNAPSHOT
    + """
before = holders()
hostcb.install()
assert holders() == before
assert jax.debug.print is JAX["debug_print"]
assert not hostcb.jax_callbacks_installed()
hostcb.uninstall()
print("ok")
"""
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "ok\n"


def test_install_jax_callbacks_twice_is_harmless():
  proc = run_python(
    _SNAPSHOT
    + """
before = snapshot()
hostcb.install(jax_callbacks=True)
once = snapshot()
hostcb.install(jax_callbacks=True)
hostcb.install()
assert snapshot() == once
assert_hostcb_everywhere()
hostcb.uninstall()
assert snapshot() == before
hostcb.uninstall()
assert snapshot() == before
print("ok")
"""
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "ok\n"


_USER_LIB = """
from jax import pure_callback
from jax.debug import callback as debug_callback, print as debug_print
from jax.experimental import io_callback
"""


def test_install_rebinds_names_a_module_imported_before(tmp_path):
  (tmp_path / "userlib.py").write_text(_USER_LIB)
  proc = run_python(
    _SNAPSHOT
    + f"""
sys.path.insert(0, {str(tmp_path)!r})
import userlib
assert userlib.io_callback is JAX["io_callback"]
hostcb.install(jax_callbacks=True)
assert userlib.io_callback is hostcb.io_callback
assert userlib.pure_callback is hostcb.pure_callback
assert userlib.debug_callback is hostcb.debug.jax_callback
assert userlib.debug_print is hostcb.debug.jax_print
f32 = jax.ShapeDtypeStruct((), jax.numpy.float32)

@jax.jit
def f(x):
  userlib.debug_print("x={{}}", x)
  y = userlib.io_callback(lambda a: a + 1, f32, x)
  return userlib.pure_callback(lambda a: a * 2, f32, y)

staged = str(jax.make_jaxpr(f)(1.)).count("hostcb_")
out = float(f(1.))
jax.effects_barrier()
print(staged, out)
hostcb.uninstall()
assert userlib.io_callback is JAX["io_callback"]
assert userlib.debug_print is JAX["debug_print"]
"""
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "x=1.0\n3 4.0\n"


def test_module_imported_after_install_gets_hostcb(tmp_path):
  (tmp_path / "userlib.py").write_text(_USER_LIB)
  proc = run_python(
    _SNAPSHOT
    + f"""
hostcb.install(jax_callbacks=True)
sys.path.insert(0, {str(tmp_path)!r})
import userlib
assert userlib.io_callback is hostcb.io_callback
assert userlib.debug_print is hostcb.debug.jax_print
print("ok")
"""
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "ok\n"


def test_function_traced_before_install_keeps_jax_callbacks():
  proc = run_python(
    _SNAPSHOT
    + """
import numpy as np
import threading
kinds = []
# hostcb's callback runs on hostcb's consumer thread, JAX's elsewhere.
def seen(a):
  kinds.append(threading.current_thread().name.startswith("hostcb-engine"))
f = jax.jit(lambda x: (jax.debug.callback(seen, x), x + 1)[1])
f(1.)
hostcb.install(jax_callbacks=True)
f(2.)  # traced before: JAX's callback
g = jax.jit(lambda x: (jax.debug.callback(seen, x), x + 1)[1])
g(3.)  # traced after: hostcb's
jax.effects_barrier()
print(kinds)
"""
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "[False, False, True]\n"


@needs_pth_hook
def test_hostcb_no_import_hook_false_keeps_the_pth_hook():
  # Before the one parser of switches, "false" disabled the hook.
  proc = run_python(
    """
from jax.experimental import host_callback
print(host_callback.__name__)
""",
    use_src=False,
    env_extra={"HOSTCB_NO_IMPORT_HOOK": "false"},
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "hostcb.host_callback\n"


@needs_pth_hook
def test_hostcb_no_import_hook_with_no_boolean_is_reported_at_start():
  proc = run_python(
    "print('ran')", use_src=False, env_extra={"HOSTCB_NO_IMPORT_HOOK": "maybe"}
  )
  assert proc.stdout == "ran\n"
  assert (
    "environment variable HOSTCB_NO_IMPORT_HOOK must be a boolean such "
    "as '1', 'true', '0' or 'false'; got 'maybe'" in proc.stderr
  )
