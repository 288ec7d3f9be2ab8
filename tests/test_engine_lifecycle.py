"""hostcb.engine.lifecycle: nothing is lost at interpreter exit.

A program that dispatches tapping ``pmap`` and ``jit`` computations and
ends at once (no ``barrier_wait``) must still see every tap: the exit
handler waits for the dispatched computations and then for their taps, in
every mode and with either back end.  Each trial is a fresh interpreter,
bounded in time.
"""

from __future__ import annotations

import pytest

from _helpers import run_python

_PROGRAM = """
import sys, time, jax, jax.numpy as jnp
from jax import lax
import hostcb

def bar(a, transforms, device=None):
    time.sleep(0.002)  # a progress bar's update: slower than the device
    sys.stdout.write(f"{device.id}:{int(a)}\\n")

def chain(x):
    def step(c, _):
        hostcb.id_tap(bar, c, tap_with_device=True)
        return c + 1, None
    return lax.scan(step, x, None, length=50)[0]

n = jax.local_device_count()
jax.pmap(chain)(jnp.zeros((n,), jnp.int32))  # one chain per device
jax.jit(chain)(jnp.int32(100))               # and one more on device 0
"""


def _trial(env):
  proc = run_python(_PROGRAM, env_extra=env, timeout=120)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  return lines


@pytest.mark.multidevice
@pytest.mark.parametrize(
  "env",
  [{}, {"HOSTCB_STRICT_BARRIER": "1"}, {"HOSTCB_DISABLE_NATIVE": "1"}],
  ids=["default", "strict-barrier", "python-callbacks"],
)
def test_a_program_that_exits_right_after_dispatching_loses_no_tap(env):
  import jax

  n = jax.local_device_count()
  expected = sorted(
    [f"{d}:{i}" for d in range(n) for i in range(50)]
    + [f"0:{100 + i}" for i in range(50)]
  )
  for _ in range(4):
    assert sorted(_trial(env)) == expected


def test_a_failure_while_waiting_at_exit_is_logged_with_its_traceback():
  # Fault injection: the exit handler's wait raises.  It must not kill the
  # exit, nor pass in silence.
  proc = run_python("""
import jax, hostcb
from hostcb.engine import barrier
def broken(timeout=None):
    raise OSError("injected failure")
barrier.wait_for_taps = broken
jax.jit(lambda x: hostcb.id_tap(lambda a, t: None, x))(1)
print("done")
""")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "done\n"
  assert "hostcb: at exit, waiting for the taps failed" in proc.stderr
  assert "Traceback (most recent call last)" in proc.stderr
  assert "OSError: injected failure" in proc.stderr
