"""Test setup: the number of CPU devices, chosen before JAX starts.

``HOSTCB_TEST_DEVICES`` (default 4) sets
``--xla_force_host_platform_device_count``; the Makefile runs the suite with
4 devices and the tests marked ``multidevice`` again with 2.
"""

import os

_N = int(os.environ.get("HOSTCB_TEST_DEVICES", "4"))
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "")
  + f" --xla_force_host_platform_device_count={_N}"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402  (after the environment above)


@pytest.fixture(autouse=True)
def _clean_barrier():
  """Each hostcb test starts with no pending taps and no recorded exception
  (nor a failed ``debug.callback`` that no read raised: the barrier raises
  it as ``JaxRuntimeError``).

  Only where the test module imported hostcb: other tests (subprocess ones)
  do not start JAX here for nothing.
  """
  import sys

  hostcb = sys.modules.get("hostcb")
  if hostcb is not None:
    import jax

    try:
      hostcb.barrier_wait()
    except (hostcb.CallbackException, jax.errors.JaxRuntimeError):
      pass
  yield


@pytest.fixture(scope="session", autouse=True)
def _nothing_recorded_at_exit():
  """The session leaves no tap failure for the exit handler, which would
  log it."""
  yield
  import sys

  hostcb = sys.modules.get("hostcb")
  if hostcb is not None:
    import jax

    try:
      hostcb.barrier_wait()
    except (hostcb.CallbackException, jax.errors.JaxRuntimeError):
      pass
