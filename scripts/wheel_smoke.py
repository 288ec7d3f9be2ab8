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
  path), not XLA FFI's generic one (``hostcb.engine.tap_fallbacks()``).

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


def _fail(message: str) -> None:
  sys.exit(f"wheel_smoke: {message}")


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


def main() -> None:
  check_location()
  check_info()
  check_tap_and_call()
  print(
    f"python {sys.version.split()[0]}, jax {jax.__version__}: hostcb "
    f"{hostcb.__version__} taps and calls through the native engine"
  )


if __name__ == "__main__":
  main()
