"""hostcb._jax_internals: a JAX that lacks a symbol hostcb patches stops the
first tap with a message naming the JAX version and the symbol (fault
injection: the symbol is deleted before hostcb is imported; importing
hostcb still works, since it patches nothing); the range of JAX versions
it names is the one CI checks and the docs name."""

import os
import re

import threading

import jax
import pytest

from _helpers import REPO, run_python

_IMPORT = """
try:
    import hostcb
except ImportError as e:
    print(type(e).__name__ + ": " + str(e))
else:
    print("imported")
"""

_FIRST_TAP = """
import hostcb
print("imported")
try:
    hostcb.id_tap(lambda *a: None, 1.0)
except ImportError as e:
    print(type(e).__name__ + ": " + str(e))
else:
    print("tapped")
"""


@pytest.mark.parametrize(
  "delete, symbol, purpose",
  [
    (
      "from jax._src import dispatch\n"
      "del dispatch.RuntimeTokenSet.get_token_input",
      "jax._src.dispatch.RuntimeTokenSet.get_token_input",
      "to order tapping computations and let barrier_wait see every thread's",
    ),
    (
      "from jax._src.interpreters import pxla\n"
      "del pxla._cached_lowering_to_hlo",
      "jax._src.interpreters.pxla._cached_lowering_to_hlo",
      "to lower one-device tapping executables for jit's fast dispatch path",
    ),
  ],
)
def test_first_tap_fails_naming_the_jax_version_and_the_missing_symbol(
  delete, symbol, purpose
):
  proc = run_python(delete + _FIRST_TAP)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "imported\n" + (
    f"MissingJaxInternal: hostcb: jax {jax.__version__} has no {symbol}, "
    f"which hostcb patches {purpose}. "
    "hostcb was checked against jax 0.8.0 "
    "to 0.12.0.1; install a jax in that range or a hostcb release that "
    f"supports jax {jax.__version__}.\n"
  )


def test_import_succeeds_with_every_symbol_present():
  proc = run_python(_IMPORT)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "imported\n"


def test_io_callback_fails_naming_the_jax_version_and_the_missing_effect():
  # A JAX without the effect of its io_callback: hostcb imports, and its
  # io_callback stops when it is traced, naming what is missing.
  proc = run_python(
    "from jax._src import callback\n"
    "del callback._IOEffect\n"
    "import jax, numpy as np, hostcb\n"
    "f = jax.jit(lambda x: hostcb.io_callback(\n"
    "    lambda x: x, jax.ShapeDtypeStruct((), np.float32), x))\n"
    "try:\n"
    "    f(np.float32(1))\n"
    "except ImportError as e:\n"
    "    print(type(e).__name__ + ': ' + str(e))\n"
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == (
    f"MissingJaxInternal: hostcb: jax {jax.__version__} has no "
    "jax._src.callback._IOEffect, which hostcb uses to give hostcb's "
    "io_callback the effect of JAX's io_callback. hostcb was checked "
    "against jax 0.8.0 to 0.12.0.1; install a jax in that range or a "
    f"hostcb release that supports jax {jax.__version__}.\n"
  )


def _xla_client_name() -> str:
  from jax._src.lib import xla_client  # the module JAX calls it from

  return xla_client.__name__


_XLA_CLIENT = _xla_client_name()


def test_a_staged_print_fails_naming_the_jax_version_and_the_missing_symbol():
  # A JAX without the batched wait of jax.block_until_ready: hostcb
  # imports, and the first print it stages stops, naming what is missing
  # (hostcb would otherwise show results before the prints).
  proc = run_python(
    "from jax._src.lib import xla_client\n"
    "del xla_client.batched_block_until_ready\n"
    "import jax, numpy as np, hostcb\n"
    "try:\n"
    "    jax.jit(lambda x: hostcb.debug.print('{}', x))(np.float32(1))\n"
    "except ImportError as e:\n"
    "    print(type(e).__name__ + ': ' + str(e))\n"
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == (
    f"MissingJaxInternal: hostcb: jax {jax.__version__} has no "
    f"{_XLA_CLIENT}.batched_block_until_ready, which hostcb "
    "patches to show hostcb's prints before the results they come with. "
    "hostcb was checked against jax 0.8.0 to 0.12.0.1; install a jax in "
    "that range or a hostcb release that supports jax "
    f"{jax.__version__}.\n"
  )


# ----------------------------------------------- the jax.config options
def test_a_changed_jax_config_constructor_stops_the_import():
  # Fault injection: a JAX whose option constructors take other arguments.
  # jax.config.update("jax_host_callback_*") must not silently stop working.
  proc = run_python(
    "from jax._src import config\n"
    "def bool_state(name, default, help_text):\n"
    "    raise AssertionError('not reached')\n"
    "config.bool_state = bool_state\n"
    "import hostcb\n"
  )
  assert proc.returncode != 0
  assert (
    "TypeError: bool_state() got an unexpected keyword argument 'help'"
    in proc.stderr
  ), proc.stderr


def test_an_option_that_jax_defines_itself_stops_the_import():
  proc = run_python(
    "from jax._src import config\n"
    "config.bool_state('jax_host_callback_inline', False, 'JAX own')\n"
    "import hostcb\n"
  )
  assert proc.returncode != 0
  assert (
    f"RuntimeError: hostcb: jax {jax.__version__} defines the option "
    "jax_host_callback_inline itself" in proc.stderr
  ), proc.stderr


def test_registering_the_options_again_keeps_hostcbs_own():
  proc = run_python(
    "import jax, hostcb\n"
    "from hostcb import _jax_internals as ji\n"
    "seen = []\n"
    "ji.register_config_options(lambda n, v: seen.append((n, v)), False,\n"
    "                           int(256e6))\n"
    "jax.config.update('jax_host_callback_inline', True)\n"
    "print(hostcb.config.read('jax_host_callback_inline'), seen)\n"
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "True []\n"


def _repo_file(name: str) -> str:
  with open(os.path.join(REPO, name), encoding="utf-8") as f:
    return f.read()


def test_the_checked_range_is_the_one_ci_checks_and_the_docs_name():
  from hostcb._jax_internals import versions

  assert versions.CHECKED_RANGE == (
    f"jax {versions.OLDEST} to {versions.NEWEST}"
  )
  # The oldest: pyproject.toml's lower bound, and what check-oldest installs.
  assert re.search(
    r'dependencies = \["jax>=(\S+?)"', _repo_file("pyproject.toml")
  ).group(1) == ".".join(versions.OLDEST.split(".")[:2])
  assert "JAX_OLDEST=${JAX_OLDEST:-%s}" % versions.OLDEST in _repo_file(
    "scripts/check_oldest_jax.sh"
  )
  # The development JAX: what `make test` installs.
  assert (
    re.search(r"^JAX_VERSION \?= (\S+)$", _repo_file("Makefile"), re.M).group(1)
    == versions.DEVELOPMENT
  )
  # The README's supported range, and CI running all three checks.
  assert f"Supported: jax {versions.OLDEST} to {versions.NEWEST}" in _repo_file(
    "README.md"
  )
  ci = _repo_file(".ci/run")
  assert all(
    f"\nmake {target}\n" in ci
    for target in ("test", "check-oldest", "check-newest")
  )


def test_a_barrier_on_a_jax_without_the_mesh_states_names_them():
  # Fault injection: a JAX whose set_mesh takes only a mesh (jax 0.8) and
  # that lacks the states hostcb then sets: the barrier stops, naming what
  # is missing, instead of running inside the caller's context mesh.
  proc = run_python(
    "import jax, hostcb\n"
    "from jax._src import config\n"
    "def set_mesh(mesh):\n"
    "    raise ValueError('Expected mesh of type `jax.sharding.Mesh`.')\n"
    "jax.set_mesh = set_mesh\n"
    "if hasattr(config, 'abstract_mesh_context_manager'):  # not on 0.12\n"
    "    del config.abstract_mesh_context_manager\n"
    "from hostcb._jax_internals.mesh_context import outside_context_mesh\n"
    "try:\n"
    "    outside_context_mesh().__enter__()\n"
    "except ImportError as e:\n"
    "    print(type(e).__name__ + ': ' + str(e).split('. hostcb was')[0])\n"
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == (
    f"MissingJaxInternal: hostcb: jax {jax.__version__} has no "
    "jax._src.config.abstract_mesh_context_manager, which hostcb uses to "
    "run hostcb's "
    "barrier outside the caller's context mesh\n"
  )


# ------------------------------------------ jax.Arrays from host arrays
def _aligned(n: int):
  """A float32[n] whose memory is its own base's and 64-byte aligned, as
  the engine allocates arrays of 1 KiB and more."""
  import numpy as np

  raw = np.empty(4 * n + 64, np.uint8)
  start = (-raw.ctypes.data) % 64
  return raw[start : start + 4 * n].view(np.float32)


def test_cpu_arrays_take_aligned_engine_memory_without_a_copy():
  import numpy as np
  from hostcb import _jax_internals as ji

  a = _aligned(1024)
  a[:] = np.arange(1024)
  (out,) = ji.cpu_arrays([a])
  assert out.unsafe_buffer_pointer() == a.ctypes.data
  assert out.committed and not out.weak_type
  assert out.devices() == {jax.devices("cpu")[0]}
  np.testing.assert_array_equal(out, np.arange(1024, dtype=np.float32))


def test_cpu_arrays_copy_memory_hostcb_does_not_own():
  # A buffer someone else owns may change later: its value is copied.
  import numpy as np
  from hostcb import _jax_internals as ji

  data = bytearray(np.arange(1024, dtype=np.float32).tobytes())
  a = np.frombuffer(data, np.float32)
  (out,) = ji.cpu_arrays([a])
  data[:4] = np.float32(7).tobytes()
  assert float(out[0]) == 0.0
  assert out.unsafe_buffer_pointer() != a.ctypes.data


def test_cpu_arrays_copy_large_memory_hostcb_does_not_own_before_returning():
  # 4 MiB: jaxlib is asked for a copy made during the call
  # (IMMUTABLE_ONLY_DURING_CALL), so the memory may change afterwards.
  import numpy as np
  from hostcb import _jax_internals as ji

  data = bytearray(np.zeros(1 << 20, np.float32).tobytes())
  a = np.frombuffer(data, np.float32)
  (out,) = ji.cpu_arrays([a])
  a_writer = np.frombuffer(data, np.float32)
  a_writer[:] = 7.0
  assert float(out.sum()) == 0.0
  assert out.unsafe_buffer_pointer() != a.ctypes.data


def test_bound_cpu_array_takes_aligned_engine_memory_without_a_copy():
  import numpy as np
  from hostcb import _jax_internals as ji

  a = _aligned(1024)
  a[:] = np.arange(1024)
  out = ji.bound_cpu_array()(a)
  assert out.unsafe_buffer_pointer() == a.ctypes.data
  assert out.committed and not out.weak_type
  assert out.devices() == {jax.devices("cpu")[0]}
  np.testing.assert_array_equal(out, np.arange(1024, dtype=np.float32))


def test_bound_cpu_array_copies_memory_hostcb_does_not_own():
  import numpy as np
  from hostcb import _jax_internals as ji

  data = bytearray(np.arange(1024, dtype=np.float32).tobytes())
  out = ji.bound_cpu_array()(np.frombuffer(data, np.float32))
  data[:4] = np.float32(7).tobytes()
  assert float(out[0]) == 0.0


def test_bound_cpu_array_follows_each_change_of_shape_and_dtype():
  # It keeps the aval of the last shape and dtype: a new one replaces it.
  import numpy as np
  from hostcb import _jax_internals as ji

  bound = ji.bound_cpu_array()
  values = [
    np.arange(4, dtype=np.float32),
    np.arange(3, dtype=np.float32),
    np.arange(3, dtype=np.int32),
    np.arange(6, dtype=np.float64).reshape(2, 3),
    np.float32(2.5) * np.ones((), np.float32),
    np.arange(4, dtype=np.float32) + 1,
  ]
  for v in values:
    out = bound(v)
    assert (out.dtype, out.shape) == (v.dtype, v.shape)
    np.testing.assert_array_equal(np.asarray(out), v)


def test_a_cpu_array_keeps_its_memory_alive():
  import gc
  import numpy as np
  from hostcb import _jax_internals as ji

  a = _aligned(1024)
  a[:] = 5.0
  (out,) = ji.cpu_arrays([a])
  del a
  gc.collect()
  for _ in range(50):  # memory freed too early would be reused here
    np.full(1024 + 16, 1.0, np.float32)
  assert float(out.sum()) == 5.0 * 1024


def test_a_cpu_array_keeps_a_64_bit_dtype_on_a_thread_without_x64():
  # hostcb's consumer thread has x64 off even where the program's thread
  # had it on (jax.enable_x64 is per thread): the float64 data stays
  # float64, buffer and aval alike, and JAX can compute with it.
  import numpy as np
  from hostcb import _jax_internals as ji

  got = []

  def make():
    (out,) = ji.cpu_arrays([np.arange(3, dtype=np.float64) + 0.5])
    got.append((str(out.dtype), float(jax.numpy.sum(out))))

  thread = threading.Thread(target=make)
  thread.start()
  thread.join(timeout=60)
  assert got == [("float64", 4.5)]


def test_jax_array_arguments_fail_without_batched_device_puts_enable_x64():
  # Fault injection: a jaxlib whose batched_device_put has no enable_x64
  # parameter (64-bit values would be narrowed on a thread without x64).
  proc = run_python(
    "import jax, numpy as np, hostcb\n"
    "from jax._src.lib import xla_client\n"
    "def put(aval, sharding, xs, devices, committed=True):\n"
    "    raise AssertionError('not to be called')\n"
    "xla_client.batched_device_put = put\n"
    "try:\n"
    "    jax.jit(lambda x: hostcb.debug.callback(print, x))(1.)\n"
    "except ImportError as e:\n"
    "    print(type(e).__name__ + ': ' + str(e))\n"
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == (
    f"MissingJaxInternal: hostcb: jax {jax.__version__}'s "
    "xla_client.batched_device_put has no enable_x64 parameter, which "
    "hostcb uses to hand callbacks jax.Arrays made from the host values "
    "(its 64-bit values unnarrowed). hostcb was checked against jax 0.8.0 "
    "to 0.12.0.1.\n"
  )


@pytest.mark.parametrize(
  "dtype", ["float32", "bool", "int8", "complex64", "bfloat16", "int4"]
)
def test_host_array_is_np_asarray_of_a_cpu_array(dtype):
  import numpy as np
  from hostcb import _jax_internals as ji

  ji.prepare_cpu_arrays()
  x = jax.numpy.arange(6).reshape(2, 3).astype(dtype)
  got, want = ji.host_array(x), np.asarray(x)
  assert type(got) is np.ndarray
  assert (got.dtype, got.shape) == (want.dtype, want.shape)
  assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", ["float32", "bool", "bfloat16", "int4"])
def test_host_array_of_a_dtype_is_np_asarray_of_its_arrays(dtype):
  import numpy as np
  from hostcb import _jax_internals as ji

  ji.prepare_cpu_arrays()
  x = jax.numpy.arange(4).astype(dtype)
  got, want = ji.host_array_of(x.dtype)(x), np.asarray(x)
  assert (got.dtype, got.shape) == (want.dtype, want.shape)
  assert got.tobytes() == want.tobytes()


def test_host_array_of_a_tracer_fails_as_np_asarray():
  from hostcb import _jax_internals as ji

  with pytest.raises(jax.errors.TracerArrayConversionError):
    jax.jit(ji.host_array)(jax.numpy.ones(2, jax.numpy.bfloat16))


@pytest.mark.parametrize(
  "symbol",
  ["HostBufferSemantics", "batched_device_put"],
)
def test_jax_array_arguments_fail_naming_the_missing_jaxlib_symbol(symbol):
  # Fault injection: a jaxlib without one of the symbols that hostcb uses
  # to make jax.Arrays of the host values.  The callback stops when it is
  # traced, not later on the engine's thread.
  proc = run_python(
    "import jax, numpy as np, hostcb\n"
    "from jax._src.lib import xla_client\n"
    f"del xla_client.{symbol}\n"
    "try:\n"
    "    jax.jit(lambda x: hostcb.debug.callback(print, x))(1.)\n"
    "except ImportError as e:\n"
    "    print(type(e).__name__ + ': ' + str(e))\n"
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == (
    f"MissingJaxInternal: hostcb: jax {jax.__version__} has no "
    f"{_XLA_CLIENT}.{symbol}, which hostcb uses to hand "
    "callbacks jax.Arrays made from the host values. hostcb was checked "
    "against jax 0.8.0 to 0.12.0.1; install a jax in that range or a "
    f"hostcb release that supports jax {jax.__version__}.\n"
  )


@pytest.mark.parametrize(
  "version, release, at_least_0_10",
  [
    ("0.8.0", (0, 8, 0), False),
    ("0.10.2", (0, 10, 2), True),
    ("0.12.0.1", (0, 12, 0, 1), True),
    ("0.11.0.dev20260101", (0, 11, 0), True),
    ("0.9.2rc1", (0, 9), False),
  ],
)
def test_jax_versions_are_compared_by_their_leading_numbers(
  version, release, at_least_0_10, monkeypatch
):
  # (This file imports hostcb in the processes it starts, not at its top.)
  from hostcb._jax_internals import versions

  monkeypatch.setattr(jax, "__version__", version)
  assert versions.jax_release() == release
  assert versions.jax_at_least(0, 10) is at_least_0_10
