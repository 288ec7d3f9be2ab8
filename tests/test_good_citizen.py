"""hostcb in a process that does not tap: importing it changes none of JAX's
objects and none of Python's hooks; tap-free programs compile to the same
HLO and dispatch through no hostcb code; the first tap installs what it
needs (listed by ``hostcb._jax_internals.patches``), ``hostcb.uninstall()``
puts every original back; a private structure of JAX that changed its
shape stops hostcb with an error naming the JAX version and the symbol
(fault injection).

Each test runs in a fresh interpreter: the point is what a process holds
before and after hostcb."""

from __future__ import annotations

import functools
import os
import re
import socket

import jax
import pytest

from _helpers import run_python
from hostcb._jax_internals.versions import jax_at_least

# The objects hostcb may change, read without hostcb (identity compared).
_SNAPSHOT = r"""
import atexit, builtins, contextlib, logging, sys
import jax
from jax._src import array as _array, dispatch as _dispatch, pjit as _pjit
from jax._src import ad_checkpoint as _checkpoint
from jax._src import custom_derivatives as _custom
from jax._src.interpreters import mlir as _mlir, pxla as _pxla
from jax._src.interpreters import partial_eval as _pe
from jax._src.lax.control_flow import conditionals as _conditionals
from jax._src.lax.control_flow import loops as _loops
from jax._src.lib import xla_client as _xc

# The exit handlers registered from now on (atexit cannot list them, and
# its count does not go down when one is unregistered).
_exit_handlers = []
_register, _unregister = atexit.register, atexit.unregister


def _spy_register(f, *args, **kwargs):
  _exit_handlers.append(f)
  return _register(f, *args, **kwargs)


def _spy_unregister(f):
  _exit_handlers[:] = [g for g in _exit_handlers if g != f]
  return _unregister(f)


atexit.register, atexit.unregister = _spy_register, _spy_unregister

# The C++ runtime's terminate handler (the engine's exit guard), where
# libstdc++ can be asked for it.
try:
  import ctypes

  _get_terminate = ctypes.CDLL("libstdc++.so.6")._ZSt13get_terminatev
  _get_terminate.restype = ctypes.c_void_p
except (OSError, AttributeError):
  _get_terminate = lambda: None


def snapshot():
  own = lambda cls, name: vars(cls).get(name)
  return {
      "jax.effects_barrier": jax.effects_barrier,
      "pxla._cached_lowering_to_hlo": _pxla._cached_lowering_to_hlo,
      "pjit._get_fastpath_data": _pjit._get_fastpath_data,
      "ExecuteReplicated.__call__":
          own(_pxla.ExecuteReplicated, "__call__"),
      "MeshExecutable.create_cpp_call":
          own(_pxla.MeshExecutable, "create_cpp_call"),
      "RuntimeTokenSet.get_token_input":
          own(_dispatch.RuntimeTokenSet, "get_token_input"),
      "RuntimeTokenSet.set_token_result":
          own(_dispatch.RuntimeTokenSet, "set_token_result"),
      "mlir._lowerings[while_p]": _mlir._lowerings.get(_loops.while_p),
      "loops._scan_known_hoisting": _loops._scan_known_hoisting,
      "pe._partial_eval_jaxpr_nounits": _pe._partial_eval_jaxpr_nounits,
      "pe.partial_eval_jaxpr_custom_rules[scan_p]":
          _pe.partial_eval_jaxpr_custom_rules.get(_loops.scan_p),
      "pe.custom_partial_eval_rules[cond_p]":
          _pe.custom_partial_eval_rules.get(_conditionals.cond_p),
      "pe.custom_partial_eval_rules[while_p]":
          _pe.custom_partial_eval_rules.get(_loops.while_p),
      "pe.custom_partial_eval_rules[remat_p]":
          _pe.custom_partial_eval_rules.get(_checkpoint.remat_p),
      "CustomJVPCallPrimitive.get_bind_params":
          own(type(_custom.custom_jvp_call_p), "get_bind_params"),
      "CustomVJPCallPrimitive.get_bind_params":
          own(type(_custom.custom_vjp_call_p), "get_bind_params"),
      "JaxprTrace.process_custom_jvp_call":
          own(_pe.JaxprTrace, "process_custom_jvp_call"),
      "JaxprTrace.process_custom_vjp_call":
          own(_pe.JaxprTrace, "process_custom_vjp_call"),
      "ArrayImpl._value": own(_array.ArrayImpl, "_value"),
      "ArrayImpl.block_until_ready": own(_array.ArrayImpl,
                                         "block_until_ready"),
      "ArrayImpl.item": own(_array.ArrayImpl, "item"),
      "xla_client.batched_block_until_ready": _xc.batched_block_until_ready,
      "sys.excepthook": sys.excepthook,
      "sys.stdout": sys.stdout,
      "sys.stderr": sys.stderr,
      "type(sys)": type(sys),
      "builtins.print": builtins.print,
      "logging.Handler.handle": own(logging.Handler, "handle"),
      "redirect_stdout.__enter__":
          own(contextlib._RedirectStream, "__enter__"),
      "redirect_stdout.__exit__": own(contextlib._RedirectStream, "__exit__"),
      "std::terminate handler": _get_terminate(),
      # hostcb's jax.config options and state, all defined at import, are
      # checked by test_import_defines_legacy_options_and_the_tap_threads_
      # state_only.
      # Other libraries register theirs as they go (tqdm, weakref).
      "atexit handlers": tuple(
          f for f in _exit_handlers
          if str(getattr(f, "__module__", "")).startswith("hostcb")),
  }


def changed(before, after):
  return sorted(k for k in before
                if before[k] is not after[k] and before[k] != after[k])
"""

_IMPORT_ALL = r"""
import importlib, pkgutil
import hostcb
for m in pkgutil.walk_packages(hostcb.__path__, "hostcb."):
  if m.name == "hostcb.__main__":
    continue  # runs the command
  try:
    importlib.import_module(m.name)
  except ImportError as e:  # hostcb.progress without tqdm
    assert "tqdm" in str(e), (m.name, e)
"""


def _libstdcxx_terminate() -> bool:
  try:
    import ctypes

    ctypes.CDLL("libstdc++.so.6")._ZSt13get_terminatev
  except (OSError, AttributeError):
    return False
  return True


# Whether the snapshot can see the terminate handler.
TERMINATE = _libstdcxx_terminate()


def _run(code: str, **env) -> str:
  proc = run_python(code, env_extra=env or None)
  assert proc.returncode == 0, proc.stderr
  return proc.stdout


def test_importing_every_module_changes_no_jax_object_and_no_hook():
  out = _run(
    _SNAPSHOT
    + "before = snapshot()\n"
    + _IMPORT_ALL
    + "print(changed(before, snapshot()))\n"
    "from hostcb import _jax_internals as ji\n"
    "print(ji.installed())\n"
  )
  assert out == "[]\n[]\n"


# The threads of this process, native ones included (Linux: one entry per
# thread in /proc/self/task; elsewhere Python's own).
_THREADS = r"""
import os, threading


def threads():
  if os.path.isdir("/proc/self/task"):
    return len(os.listdir("/proc/self/task"))
  return threading.active_count()
"""


def test_importing_every_module_initializes_no_jax_backend():
  out = _run(
    _IMPORT_ALL + "from jax._src import xla_bridge\n"
    "print(xla_bridge.backends_are_initialized())\n"
  )
  assert out == "False\n"


def test_importing_every_module_starts_no_thread():
  out = _run(
    _THREADS + "import jax, numpy\n"
    "try:\n"
    "  import tqdm.auto  # its own import, not hostcb's\n"
    "except ImportError:\n"
    "  pass\n"
    "before = threads()\n" + _IMPORT_ALL + "print(threads() - before)\n"
  )
  assert out == "0\n"


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_jax_distributed_initialize_runs_after_importing_every_module():
  out = _run(
    _IMPORT_ALL + "import jax\n"
    "jax.distributed.initialize(\n"
    f"  coordinator_address='127.0.0.1:{_free_port()}',\n"
    "  num_processes=1, process_id=0)\n"
    "print(jax.process_count(), int(jax.jit(lambda x: x * 2)(21)))\n"
    "jax.distributed.shutdown()\n"
  )
  assert out == "1 42\n"


def test_jax_num_cpu_devices_can_be_set_after_importing_every_module():
  out = _run(
    _IMPORT_ALL + "import jax\n"
    "jax.config.update('jax_num_cpu_devices', 2)\n"
    "print(len(jax.devices('cpu')))\n"
  )
  assert out == "2\n"


_TAPS = r"""
import numpy as np
import jax.numpy as jnp
from jax import lax

def f(x):
  x = hostcb.id_print(x, what="x")
  return lax.while_loop(lambda c: c < 3, lambda c: c + 1, x)

print(float(jax.jit(f)(np.float32(1))))
jax.effects_barrier()
"""


def test_import_defines_legacy_options_and_the_tap_threads_state_only():
  # The state is in the jit key: defined later, it would change the key of
  # every function compiled before it (tap_threads.py).
  out = _run(
    "import jax\n"
    "before = set(jax.config._value_holders)\n"
    "import hostcb\n"
    "print(sorted(n for n in set(jax.config._value_holders) - before\n"
    "             if n.startswith(('hostcb', 'jax_host_callback'))))\n"
  )
  assert out == (
    "['hostcb_in_tap_function', 'jax_host_callback_inline', "
    "'jax_host_callback_max_queue_byte_size']\n"
  )


def test_the_first_tap_retraces_no_function_compiled_before_it():
  out = _run(
    "import jax, hostcb\n"
    "traces = {'plain': 0, 'tapped': 0}\n"
    "def plain(x):\n"
    "  traces['plain'] += 1\n"
    "  return x * 3\n"
    "def tapped(x):\n"
    "  traces['tapped'] += 1\n"
    "  return hostcb.id_tap(lambda *a: None, x) + 1\n"
    "p, t = jax.jit(plain), jax.jit(tapped)\n"
    "p(1.0)\n"
    "for _ in range(3):\n"
    "  t(1.0)\n"
    "p(1.0)\n"
    "hostcb.barrier_wait()\n"
    "print(traces)\n"
  )
  assert out == "{'plain': 1, 'tapped': 1}\n"


def test_first_tap_installs_the_patches_and_uninstall_restores_them():
  out = _run(
    _SNAPSHOT + "before = snapshot()\n"
    "import hostcb\n" + _TAPS + "from hostcb import _jax_internals as ji\n"
    "print(sorted(p.name for p in ji.installed()))\n"
    "print(changed(before, snapshot()))\n"
    "hostcb.uninstall()\n"
    "print(ji.installed(), changed(before, snapshot()))\n"
  )
  lines = out.splitlines()
  # The print comes before the result read on the host (the read hook).
  assert lines[:3] == ["what: x", "1.", "3.0"]
  assert lines[3] == str(
    sorted(
      [
        "token chain",
        "token chain (results)",
        "fast dispatch",
        "compiled-call guard",
        "while lowering",
        "weak cache keys",
        "engine: at exit",
        "exit guard",
        "effects barrier",
        "host reads",
        "host reads (block_until_ready)",
        "host reads (item)",
        "host reads (several arrays)",
        "output order (print)",
        "output order (logging)",
        "output order (redirect_stdout.__enter__)",
        "output order (redirect_stdout.__exit__)",
        "print outputs (fast path)",
        "print outputs (Python path)",
        "taps stay in loops",
        "taps stay in loops (splits)",
        "taps stay in loops (checkpoint of scan)",
        "taps stay in loops (cond)",
        "taps stay in loops (while)",
        "taps stay in loops (checkpoint)",
        "taps stay in loops (custom_jvp)",
        "taps stay in loops (custom_jvp, inline)",
        "taps stay in loops (custom_vjp)",
        "taps stay in loops (custom_vjp, inline)",
      ]
    )
  )
  assert lines[4] == str(
    sorted(
      [
        "jax.effects_barrier",
        "pxla._cached_lowering_to_hlo",
        "pjit._get_fastpath_data",
        "ExecuteReplicated.__call__",
        "MeshExecutable.create_cpp_call",
        "RuntimeTokenSet.get_token_input",
        "RuntimeTokenSet.set_token_result",
        "mlir._lowerings[while_p]",
        "loops._scan_known_hoisting",
        "pe._partial_eval_jaxpr_nounits",
        "pe.partial_eval_jaxpr_custom_rules[scan_p]",
        "pe.custom_partial_eval_rules[cond_p]",
        "pe.custom_partial_eval_rules[while_p]",
        "pe.custom_partial_eval_rules[remat_p]",
        "CustomJVPCallPrimitive.get_bind_params",
        "CustomVJPCallPrimitive.get_bind_params",
        "JaxprTrace.process_custom_jvp_call",
        "JaxprTrace.process_custom_vjp_call",
        "ArrayImpl._value",
        "ArrayImpl.block_until_ready",
        "ArrayImpl.item",
        "xla_client.batched_block_until_ready",
        "atexit handlers",
        "builtins.print",
        "logging.Handler.handle",
        "redirect_stdout.__enter__",
        "redirect_stdout.__exit__",
        *(["std::terminate handler"] if TERMINATE else []),
      ]
    )
  )
  assert lines[5:] == ["[] []"]


def test_a_progress_loop_installs_its_excepthook_and_uninstall_removes_it():
  pytest.importorskip(
    "tqdm", reason="tqdm is not installed (pip install hostcb[progress])"
  )
  try:
    import hostcb.progress

    hostcb.progress._require_supported_jax()  # whether this JAX has it
  except ImportError as e:  # hostcb.progress.UnsupportedJax (jax 0.8)
    if "custom_vmap" not in str(e):
      raise
    pytest.skip(str(e))
  out = _run(
    "import io, tqdm, tqdm.auto, numpy as np\n"
    + _SNAPSHOT
    + "before = snapshot()\n"
    "import hostcb, hostcb.progress\n"
    "print(changed(before, snapshot()))\n"
    "bar = lambda **kw: tqdm.tqdm(file=io.StringIO(), **kw)\n"
    "f = jax.jit(lambda x: hostcb.progress.scan(\n"
    "    lambda c, y: (c + y, None), x, np.ones(4, np.float32),\n"
    "    tqdm_class=bar)[0])\n"
    "print(float(f(np.float32(0))))\n"
    "hostcb.barrier_wait()\n"
    "print('sys.excepthook' in changed(before, snapshot()))\n"
    "hostcb.uninstall()\n"
    "print(changed(before, snapshot()))\n"
  )
  assert out == "[]\n4.0\nTrue\n[]\n"


def test_a_tap_after_uninstall_installs_again_and_runs():
  out = _run(
    "import jax, numpy as np, hostcb\n"
    "from hostcb import _jax_internals as ji\n"
    "f = lambda x: hostcb.id_tap(lambda a, t: print('tap', a), x)\n"
    "jax.jit(f)(np.int32(1)); hostcb.barrier_wait()\n"
    "hostcb.uninstall()\n"
    "print(ji.installed())\n"
    "jax.jit(lambda x: f(x) + 1)(np.int32(2)); hostcb.barrier_wait()\n"
    "print(ji.is_installed('fast dispatch'))\n"
  )
  assert out == "tap 1\n[]\ntap 2\nTrue\n"


def test_a_program_compiled_before_uninstall_still_taps():
  # A compiled function and a jitted one (one device, the default mode: no
  # runtime token), called before and after uninstall.
  out = _run(
    "import jax, numpy as np, hostcb\n"
    "f = lambda x: hostcb.id_tap(lambda a, t: print('tap', a), x)\n"
    "g = jax.jit(f).lower(np.int32(0)).compile()\n"
    "j = jax.jit(lambda x: f(x) * 2)\n"
    "def run(h, x):\n"
    "  r = int(h(np.int32(x)))\n"
    "  hostcb.barrier_wait()\n"
    "  print(r)\n"
    "run(g, 1); run(j, 2)\n"
    "hostcb.uninstall()\n"
    "run(g, 3); run(j, 4)\n"
  )
  assert out == "tap 1\n1\ntap 2\n4\ntap 3\n3\ntap 4\n8\n"


def test_a_strict_compiled_function_first_called_after_uninstall_taps():
  # It keeps a runtime token, which JAX's C++ call path for compiled
  # functions would not pass ("Execution supplied 1 arguments but compiled
  # program expected 2"): uninstall gives it JAX's Python call path first.
  out = _run(
    "import jax, numpy as np, hostcb\n"
    "hostcb.config.update('hostcb_strict_barrier', True)\n"
    "f = lambda x: hostcb.id_tap(lambda a, t: print('tap', a), x)\n"
    "g = jax.jit(f).lower(np.int32(0)).compile()\n"
    "hostcb.uninstall()\n"
    "for i in range(3):\n"
    "  r = int(g(np.int32(i)))\n"
    "  hostcb.barrier_wait()\n"
    "  print(r)\n"
  )
  assert out == "tap 0\n0\ntap 1\n1\ntap 2\n2\n"


def test_uninstall_reads_no_class_of_other_libraries_objects():
  # Settling compiled functions looks through every live object; one whose
  # __class__ warns (as torch.distributed.reduce_op's deprecation does) is
  # passed over without its __class__ being read.
  out = _run(
    "import warnings, jax, numpy as np, hostcb\n"
    "warnings.simplefilter('error')\n"
    "class Lazy:\n"
    "  @property\n"
    "  def __class__(self):\n"
    "    warnings.warn('read', FutureWarning)\n"
    "    return Lazy\n"
    "kept = [Lazy()]\n"
    "hostcb.config.update('hostcb_strict_barrier', True)\n"
    "f = lambda x: hostcb.id_tap(lambda a, t: print('tap', a), x)\n"
    "g = jax.jit(f).lower(np.int32(0)).compile()\n"
    "hostcb.uninstall()\n"
    "r = int(g(np.int32(5)))\n"
    "hostcb.barrier_wait()\n"
    "print(r)\n"
  )
  assert out == "tap 5\n5\n"


def test_a_program_lowered_before_uninstall_and_compiled_after_taps():
  out = _run(
    "import jax, numpy as np, hostcb\n"
    "f = lambda x: hostcb.id_tap(lambda a, t: print('tap', a), x) + 1\n"
    "traced = jax.jit(f).trace(np.int32(0))\n"
    "lowered = traced.lower()\n"
    "hostcb.uninstall()\n"
    "for make in (traced.lower, lambda: lowered):\n"
    "  g = make().compile()\n"
    "  for i in range(2):\n"
    "    r = int(g(np.int32(i)))\n"
    "    hostcb.barrier_wait()\n"
    "    print(r)\n"
  )
  assert out == "tap 0\n1\ntap 1\n2\n" * 2


# ------------------------------------------------- tap-free programs
_PROGRAMS = r"""
import numpy as np
import jax.numpy as jnp
from jax import lax

def loop(x):
  return lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 2),
                        (0, x))[1]

def scanned(x):
  return lax.scan(lambda c, y: (c + y, c * y), 0.0, x)

def branch(x):
  return lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x)

x = np.arange(8, dtype=np.float32)
programs = [(jnp.dot, (x.reshape(2, 4), x.reshape(4, 2))), (loop, (x,)),
            (scanned, (x,)), (branch, (x,)),
            (jax.vmap(loop), (x.reshape(2, 4),)),
            (jax.grad(lambda x: jnp.sum(jnp.tanh(x) ** 2)), (x,))]
"""

_HLO = (
  _PROGRAMS
  + r"""
import re
for f, args in programs:
  text = jax.jit(f).lower(*args).compile().as_text()
  # Metadata aside: source lines and op names name the calling frames.
  print(re.sub(r", metadata=\{[^}]*\}", "", text))
"""
)


def test_tap_free_programs_compile_to_the_same_hlo_with_hostcb_imported():
  # The same line numbers in both programs: one line imports hostcb.
  without = _run("import jax\n" + _HLO)
  with_hostcb = _run(f"import jax; exec({_IMPORT_ALL!r})\n" + _HLO)
  assert with_hostcb == without
  assert without.count("HloModule") == 6


def test_dispatch_of_tap_free_programs_runs_no_hostcb_code():
  # Tracing, lowering, compiling and calling: no frame of hostcb's on the
  # way (before the first tap, hostcb has wrapped nothing).
  out = _run(
    "import jax, os, sys, hostcb\n"
    + _IMPORT_ALL
    + _PROGRAMS
    + "root = os.path.dirname(hostcb.__file__) + os.sep\n"
    "seen = set()\n"
    "def profile(frame, event, arg):\n"
    "  if frame.f_code.co_filename.startswith(root):\n"
    "    seen.add(frame.f_code.co_name)\n"
    "sys.setprofile(profile)\n"
    "for f, args in programs:\n"
    "  g = jax.jit(f)\n"
    "  for _ in range(3):\n"
    "    jax.block_until_ready(g(*args))\n"
    "  str(g(*args))\n"
    "sys.setprofile(None)\n"
    "print(sorted(seen))\n"
  )
  assert out == "[]\n"


def test_after_a_tap_calls_of_tap_free_programs_run_no_hostcb_code():
  # Once hostcb's patches are in place, lowering a tap-free program passes
  # through the lowering wrapper (once per program); its calls do not.
  out = _run(
    "import jax, os, sys, numpy as np, hostcb\n"
    + _PROGRAMS
    + "jax.jit(lambda x: hostcb.id_tap(lambda *a: None, x))(np.int32(1))\n"
    "hostcb.barrier_wait()\n"
    "root = os.path.dirname(hostcb.__file__) + os.sep\n"
    "compiled = [(jax.jit(f), args) for f, args in programs]\n"
    "for g, args in compiled:\n"
    "  jax.block_until_ready(g(*args))\n"
    "seen = set()\n"
    "def profile(frame, event, arg):\n"
    "  if frame.f_code.co_filename.startswith(root):\n"
    "    seen.add(frame.f_code.co_name)\n"
    "sys.setprofile(profile)\n"
    "for g, args in compiled:\n"
    "  for _ in range(3):\n"
    "    jax.block_until_ready(g(*args))\n"
    "sys.setprofile(None)\n"
    "print(sorted(seen))\n"
  )
  assert out == "[]\n"


# ------------------------------------------------- two libraries compose
def test_while_lowering_calls_the_rule_it_replaced():
  # Another library overrides the while_loop lowering before hostcb's first
  # tap: its rule still lowers every while loop hostcb does not handle,
  # and uninstall gives it back its place.
  out = _run(
    "import jax, numpy as np, hostcb\n"
    "from jax import lax\n"
    "from jax._src.interpreters import mlir\n"
    "from jax._src.lax.control_flow import loops\n"
    "calls = []\n"
    "jax_rule = mlir._lowerings[loops.while_p].rule\n"
    "def other(ctx, *args, **params):\n"
    "  calls.append(1)\n"
    "  return jax_rule(ctx, *args, **params)\n"
    "mlir.register_lowering(loops.while_p, other)\n"
    "mine = mlir._lowerings[loops.while_p]\n"
    "hostcb.id_tap(lambda *a: None, np.int32(0)); hostcb.barrier_wait()\n"
    "print(mlir._lowerings[loops.while_p] is mine)\n"
    "w = lambda x: lax.while_loop(lambda c: c < 9, lambda c: c + 2, x)\n"
    "print(int(jax.jit(w)(np.int32(0))), len(calls))\n"
    "hostcb.uninstall()\n"
    "print(mlir._lowerings[loops.while_p] is mine)\n"
  )
  assert out == "False\n10 1\nTrue\n"


def test_uninstall_leaves_a_wrapper_another_library_put_over_hostcbs():
  # Another library wraps jax.effects_barrier and the while_loop lowering
  # after hostcb did: uninstall leaves both (their wrappers call hostcb's,
  # which still work), with a warning each.
  proc = run_python(
    "import jax, numpy as np, hostcb\n"
    "from jax._src.interpreters import mlir\n"
    "from jax._src.lax.control_flow import loops\n"
    "hostcb.id_tap(lambda *a: None, np.int32(0)); hostcb.barrier_wait()\n"
    "hostcbs = jax.effects_barrier\n"
    "def theirs(): hostcbs()\n"
    "jax.effects_barrier = theirs\n"
    "rule = mlir._lowerings[loops.while_p].rule\n"
    "mlir.register_lowering(loops.while_p, lambda *a, **k: rule(*a, **k))\n"
    "their_rule = mlir._lowerings[loops.while_p]\n"
    "hostcb.uninstall()\n"
    "print(jax.effects_barrier is theirs,\n"
    "      mlir._lowerings[loops.while_p] is their_rule)\n"
    "jax.effects_barrier()\n"
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "True True\n"
  assert proc.stderr.count("left as it is") == 2, proc.stderr


# ------------------------------------------------- guarded internals
_VERSION_TAIL = (
  "hostcb was checked against jax 0.8.0 to 0.12.0.1; install a jax in "
  "that range or a hostcb release that supports jax {v}."
)


def _first_tap_error(inject: str) -> str:
  return _run(
    inject + "\nimport jax, numpy as np, hostcb\n"
    "try:\n"
    "  jax.jit(lambda x: hostcb.id_tap(lambda *a: None, x))(np.int32(1))\n"
    "except ImportError as e:\n"
    "  print(type(e).__name__ + ': ' + str(e))\n"
  )


def test_a_reshaped_lowering_tuple_fails_naming_jax_and_the_symbol():
  out = _first_tap_error(
    "from jax._src.interpreters import pxla\n"
    "real = pxla._cached_lowering_to_hlo\n"
    "pxla._cached_lowering_to_hlo = lambda *a, **k: real(*a, **k)[:6]\n"
  )
  v = jax.__version__
  assert out == (
    f"JaxInternalChanged: hostcb: in jax {v}, the result of "
    "jax._src.interpreters.pxla._cached_lowering_to_hlo is not what "
    "hostcb reads to lower one-device tapping executables for jit's fast "
    "dispatch path: expected length 7 or 8, found tuple of length 6. "
    + _VERSION_TAIL.format(v=v)
    + "\n"
  )


def test_a_lowering_registry_that_is_no_dict_fails_naming_the_symbol():
  out = _first_tap_error(
    "from jax._src.interpreters import mlir\n"
    "import collections\n"
    "class Registry(collections.UserDict): pass\n"
    "mlir._lowerings = Registry(mlir._lowerings)\n"
  )
  v = jax.__version__
  assert out == (
    f"JaxInternalChanged: hostcb: in jax {v}, "
    "jax._src.interpreters.mlir._lowerings is not what hostcb reads to "
    "tap in the cond_fun of a batched while_loop: expected dict, found "
    "Registry. " + _VERSION_TAIL.format(v=v) + "\n"
  )


def test_a_token_without_its_buffer_fails_naming_the_symbol():
  from hostcb._jax_internals import core

  with pytest.raises(
    ImportError,
    match=re.escape(
      f"hostcb: in jax {jax.__version__}, jax._src.core.Token._buf is not "
      "what hostcb reads to tell whether a tapping computation finished: "
      "expected a field 'is_ready', found NoneType without it."
    ),
  ):
    core._token_buffer(object())


def test_a_missing_symbol_fails_at_the_first_tap_not_at_import():
  out = _first_tap_error(
    "from jax._src import dispatch\n"
    "del dispatch.RuntimeTokenSet.get_token_input\n"
  )
  v = jax.__version__
  assert out == (
    f"MissingJaxInternal: hostcb: jax {v} has no "
    "jax._src.dispatch.RuntimeTokenSet.get_token_input, which hostcb "
    "patches to order tapping computations and let barrier_wait see "
    "every thread's. " + _VERSION_TAIL.format(v=v) + "\n"
  )


class _Seen:
  """A JAX module as one of hostcb's modules sees it, with some of its
  functions replaced (the fault injected); JAX's own code keeps the
  module's real functions."""

  def __init__(self, module, **replaced):
    self._module, self._replaced = module, replaced

  def __getattr__(self, name):
    if name in self._replaced:
      return self._replaced[name]
    return getattr(self._module, name)


def _changed(symbol: str, expected: str, found: str, what: str) -> str:
  return re.escape(
    f"hostcb: in jax {jax.__version__}, {symbol} is not what hostcb reads "
    f"{what}: expected {expected}, found {found}. "
    + _VERSION_TAIL.format(v=jax.__version__)
  )


_NEEDS_PMAP_STAGING = pytest.mark.skipif(
  not jax_at_least(0, 10),
  reason="pmap inside xla_computation per replica needs jax >= 0.10 (a pmap "
  f"that is a jit of a shard_map); this is jax {jax.__version__}",
)


def _pmap_sum(x):
  return jax.pmap(lambda a: jax.lax.psum(a, "i"), "i")(x)


@_NEEDS_PMAP_STAGING
def test_a_subcomputation_result_of_another_length_fails_naming_it(
  monkeypatch,
):
  import jax.numpy as jnp

  import hostcb
  from hostcb._jax_internals import JaxInternalChanged, replicas

  real = replicas._mlir.jaxpr_subcomp

  @functools.wraps(real)  # its signature, which hostcb reads
  def subcomp(*args, **kwargs):
    return (*real(*args, **kwargs), None)

  monkeypatch.setattr(
    replicas, "_mlir", _Seen(replicas._mlir, jaxpr_subcomp=subcomp)
  )
  with pytest.raises(
    JaxInternalChanged,
    match=_changed(
      "the result of jax._src.interpreters.mlir.jaxpr_subcomp",
      "length 2",
      "tuple of length 3",
      "to lower a pmap inside xla_computation per replica",
    ),
  ):
    hostcb.xla_computation(_pmap_sum)(jnp.arange(6.0))


@_NEEDS_PMAP_STAGING
def test_pmap_devices_passed_elsewhere_fail_naming_the_function(monkeypatch):
  import jax.numpy as jnp

  import hostcb
  from hostcb._jax_internals import JaxInternalChanged, replicas

  replicas._install_pmap_staging()
  pmap = replicas._pmap_impl
  hostcbs = pmap._cached_shard_map
  # A JAX that passes the mesh devices last (swapped with the axis name).
  monkeypatch.setattr(
    pmap, "_cached_shard_map", lambda *a: hostcbs(*a[:6], a[7], a[6])
  )
  with pytest.raises(
    JaxInternalChanged,
    match=_changed(
      "the arguments of jax._src.pmap._cached_shard_map",
      "8 positional arguments, the mesh devices at position 6",
      "8 positional arguments and keywords [], the mesh devices at [7]",
      "to lower a pmap inside xla_computation per replica",
    ),
  ):
    hostcb.xla_computation(_pmap_sum)(jnp.arange(5.0))


def test_a_lowering_result_without_its_module_fails_naming_it(monkeypatch):
  import types

  import hostcb
  from hostcb._jax_internals import JaxInternalChanged, replicas

  real = replicas._mlir.lower_jaxpr_to_module

  @functools.wraps(real)  # its signature, which hostcb reads
  def lower(*args, **kwargs):
    return types.SimpleNamespace(mlir_module=real(*args, **kwargs).module)

  monkeypatch.setattr(
    replicas, "_mlir", _Seen(replicas._mlir, lower_jaxpr_to_module=lower)
  )
  with pytest.raises(
    JaxInternalChanged,
    match=_changed(
      "the result of jax._src.interpreters.mlir.lower_jaxpr_to_module",
      "a field 'module'",
      "SimpleNamespace without it",
      "to lower xla_computation per replica of an axis_env",
    ),
  ):
    hostcb.xla_computation(lambda x: x + 1)(1.0)


def test_a_device_set_of_another_type_fails_naming_it(monkeypatch):
  from jax._src import dispatch

  from hostcb import _jax_internals as ji

  prim = ji.new_primitive("hostcb_test_devices")
  monkeypatch.setattr(
    dispatch,
    "prim_requires_devices_during_lowering",
    frozenset(dispatch.prim_requires_devices_during_lowering),
  )
  with pytest.raises(
    ji.JaxInternalChanged,
    match=_changed(
      "jax._src.dispatch.prim_requires_devices_during_lowering",
      "set",
      "frozenset",
      "to tell jit which primitives lower with their devices",
    ),
  ):
    ji.lowers_without_devices(prim)


def test_a_missing_aval_check_fails_naming_it(monkeypatch):
  from jax._src import ffi

  from hostcb._jax_internals import MissingJaxInternal, buffers

  monkeypatch.delattr(ffi, "_check_compatible_avals")
  aval = jax.core.ShapedArray((2,), jax.numpy.float32)
  with pytest.raises(
    MissingJaxInternal,
    match=re.escape(
      f"hostcb: jax {jax.__version__} has no jax._src.ffi."
      "_check_compatible_avals, which hostcb uses to lower buffer_callback."
    ),
  ):
    buffers.same_shape_and_dtype(aval, aval)


def test_a_python_callback_lowering_of_another_length_fails_naming_it():
  from hostcb._jax_internals import JaxInternalChanged, custom_calls

  with pytest.raises(
    JaxInternalChanged,
    match=_changed(
      "the result of jax._src.callback.emit_python_callback",
      "length 3",
      "tuple of length 2",
      "to lower a callback on platforms without XLA's FFI callbacks",
    ),
  ):
    custom_calls._checked_python_callback(([], None))


def test_a_primitive_without_a_rematerialization_rule_fails_naming_it():
  from jax.extend.core import Primitive

  from hostcb._jax_internals import JaxInternalChanged, own_callbacks

  prim = Primitive("hostcb_test_no_rule")
  with pytest.raises(
    JaxInternalChanged,
    match=_changed(
      "jax._src.interpreters.partial_eval.partial_eval_jaxpr_custom_rules"
      "[hostcb_test_no_rule]",
      "a rule (hostcb's primitive registered as an effectful identity)",
      "None",
      "to rematerialize its debug prints as JAX's under checkpoint",
    ),
  ):
    own_callbacks.rematerialize_as_jax_debug(prim, lambda params: True)


# ------------------------------------------------- small truths
def test_hasattr_progress_is_false_without_tqdm():
  out = _run(
    "import sys; sys.modules['tqdm'] = None\n"
    "import hostcb\n"
    "print(hasattr(hostcb, 'progress'))\n"
    "try:\n"
    "  hostcb.progress\n"
    "except AttributeError as e:\n"
    "  print(e)\n"
  )
  assert out == (
    "False\nmodule 'hostcb' has no attribute 'progress': hostcb.progress "
    "needs tqdm, which is not installed: pip install hostcb[progress]  "
    "(or: pip install tqdm)\n"
  )


def test_the_version_is_kept_once():
  import tomllib
  from importlib import metadata

  import hostcb
  from _helpers import REPO

  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    project = tomllib.load(f)["project"]
  assert "version" not in project and project["dynamic"] == ["version"]
  assert metadata.version("hostcb") == hostcb.__version__
