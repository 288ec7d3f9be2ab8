"""The check that an installed hostcb taps and calls through its native engine.

Run by ``scripts/check_wheels.sh`` in each environment it makes (a wheel
under the oldest and the newest JAX, the source installs) and by the
release workflow's cibuildwheel test step.  Run it from outside a clone
(the installed hostcb must be the one imported)::

    python scripts/wheel_smoke.py

It checks, and exits non-zero with the reason when one fails:

* hostcb is imported from the running environment, not from a clone;
* ``hostcb info`` reports ``native engine: yes`` (the report a user reads);
* a jitted ``id_tap`` and a jitted ``call`` lower to the engine's handlers
  (``hostcb_tap``, ``hostcb_call``), not to XLA's Python callbacks;
* both run: the tap receives the values the program computed, the call
  returns what the host function returned, and neither changes the
  program's result;
* the tap took the handler's own decoding of XLA's call frame (the fast
  path), not XLA FFI's generic one (``hostcb.engine.tap_fallbacks()``);
* the engine is the production build: it has none of the functions of the
  test build (setup.py's ``HOSTCB_TEST_BUILD``: the simulated CUDA driver
  and the fault injections), and the installed package carries no C++
  sources.

The last line it prints sums up what passed (the check's summary shows it).
"""

import os
import subprocess
import sys

# Before JAX's import, which reads it: the check needs no accelerator.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np

import hostcb


# The functions that only the test build of the engine has
# (tests/native/engine_testing.cc's table; tests/test_wheel_scripts.py
# keeps the two lists the same).
TEST_BUILD_FUNCTIONS = (
  "_fail_next_allocations",
  "_note_tap_fallback",
  "_gpu_words_refused",
  "_use_fake_cuda",
  "_fake_stream",
  "_fake_pause",
  "_fake_pending",
  "_fake_sync",
  "_fake_counters",
  "_fake_fail",
  "_cuda_test_tap",
  "_cuda_test_call",
)
SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".h", ".hpp")


def _fail(message: str) -> None:
  sys.exit(f"wheel_smoke: {message}")


def test_build_functions(module) -> list[str]:
  """The test build's functions that ``module`` has."""
  return [name for name in TEST_BUILD_FUNCTIONS if hasattr(module, name)]


def sources_in(folder: str) -> list[str]:
  """The C/C++ sources and headers under ``folder``, relative to it."""
  return sorted(
    os.path.relpath(os.path.join(root, name), folder)
    for root, _, names in os.walk(folder)
    for name in names
    if name.endswith(SOURCE_SUFFIXES)
  )


def check_location() -> None:
  """hostcb comes from this environment (sys.prefix), not from a clone."""
  where = os.path.realpath(os.path.dirname(hostcb.__file__))
  if not where.startswith(os.path.realpath(sys.prefix) + os.sep):
    _fail(
      f"hostcb imported from {where}, not from the environment {sys.prefix}"
    )


def check_info() -> None:
  """``hostcb info`` of this environment says the native engine is used."""
  done = subprocess.run(
    [sys.executable, "-m", "hostcb", "info"],
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  if done.returncode != 0:
    _fail(f"`hostcb info` failed ({done.returncode}): {done.stderr}")
  if "native engine: yes\n" not in done.stdout:
    _fail("`hostcb info` does not report the native engine:\n" + done.stdout)


def check_tap_and_call() -> None:
  """A jitted id_tap and call go through the engine and keep the values."""
  received = []

  def tap(value, transforms):
    del transforms
    received.append(np.asarray(value))

  def host_square(value):
    return np.asarray(value) ** 2

  def f(x):
    y = hostcb.id_tap(tap, x * 2) + 1
    return hostcb.call(
      host_square, y, result_shape=jax.ShapeDtypeStruct(y.shape, y.dtype)
    )

  x = jnp.arange(4.0)
  hlo = jax.jit(f).lower(x).as_text()
  for target in ("hostcb_tap", "hostcb_call"):
    if f"@{target}" not in hlo and f'"{target}' not in hlo:
      _fail(
        f"the jitted function is not lowered to the engine's {target} "
        f"handler:\n{hlo}"
      )
  if "xla_python" in hlo:
    _fail(f"the jitted function uses XLA's Python callbacks:\n{hlo}")
  out = jax.jit(f)(x)
  hostcb.barrier_wait()
  np.testing.assert_array_equal(np.asarray(out), [1.0, 9.0, 25.0, 49.0])
  if len(received) != 1:
    _fail(f"{len(received)} taps received, expected 1")
  np.testing.assert_array_equal(received[0], [0.0, 2.0, 4.0, 6.0])
  # The engine's tap handler decoded XLA's call frame itself, the fast path
  # (a wheel is built against the oldest jaxlib's FFI headers).
  fallbacks = hostcb.engine.tap_fallbacks()
  if fallbacks != (0, None):
    _fail(
      "the tap took XLA FFI's generic decoding, not the handler's own "
      f"(taps, reason): {fallbacks}"
    )


def check_production_build() -> None:
  """The engine has no function of the test build, and the package no C++
  source."""
  from hostcb._native import _engine  # noqa: PLC0415  (check_info: built)

  found = test_build_functions(_engine)
  if found:
    _fail(
      f"the native engine {_engine.__file__} is a test build "
      f"(HOSTCB_TEST_BUILD): it has {', '.join(found)}"
    )
  found = sources_in(os.path.dirname(hostcb.__file__))
  if found:
    _fail(f"the installed hostcb carries C++ sources: {', '.join(found)}")


def main() -> None:
  check_location()
  check_info()
  check_tap_and_call()
  check_production_build()
  print(
    f"python {sys.version.split()[0]}, jax {jax.__version__}: hostcb "
    f"{hostcb.__version__} taps and calls through the native engine "
    "(a production build)"
  )


if __name__ == "__main__":
  main()
