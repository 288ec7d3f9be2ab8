"""hostcb._engine.lifecycle: nothing is lost at interpreter exit.

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


_AFTER_UNINSTALL = """
import jax, hostcb
def body(c, _):
  hostcb.id_tap(lambda a, t: print(int(a)), c)
  return c + 1, None
f = jax.jit(lambda x: jax.lax.scan(body, x, None, length=300)[0])
f(0)
hostcb.barrier_wait()
hostcb.uninstall()
f(1000)  # compiled before uninstall(); the program ends without a barrier
"""


@pytest.mark.parametrize(
  "env",
  [{}, {"HOSTCB_DISABLE_NATIVE": "1"}],
  ids=["native", "python-callbacks"],
)
def test_a_program_compiled_before_uninstall_loses_no_tap_at_exit(env):
  # The first record after uninstall() installs the exit handler again, in
  # both back ends (the Python back end lost 140-300 of these 300 taps).
  expected = [str(i) for i in range(300)] + [str(i) for i in range(1000, 1300)]
  for _ in range(3):
    proc = run_python(_AFTER_UNINSTALL, env_extra=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == expected


def test_a_failure_while_waiting_at_exit_is_logged_with_its_traceback():
  # Fault injection: the exit handler's wait raises.  It must not kill the
  # exit, nor pass in silence.
  proc = run_python("""
import jax, hostcb
from hostcb._engine import barrier
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


# ------------------------------------- a failed callback, as under JAX
# The same program with JAX's own jax.debug.callback (the oracle, without
# hostcb) and with hostcb's drop-in, each in its own interpreter: the
# failure is raised where JAX raises it (JAX at the call, hostcb at the
# first read of a result or barrier after it), the exit handlers that the
# program registered before hostcb all run, and the exit status is JAX's.
_CALLBACKS = {
  "jax": "API = jax.debug.callback\n",
  "hostcb.debug": "import hostcb\nAPI = hostcb.debug.callback\n",
  "install": (
    "import hostcb\nhostcb.install(jax_callbacks=True)\n"
    "API = jax.debug.callback\n"
  ),
}

_FAILING = """
import atexit, jax
atexit.register(lambda: print("program's exit handler ran"))
{api}
def bad(x):
  raise ValueError("boom")
f = jax.jit(lambda x: (API(bad, x), x * 2)[1])
"""


def _under_each(body: str, env: dict | None = None) -> dict:
  """``{callbacks: (returncode, stdout, stderr)}`` of ``body`` after
  :data:`_FAILING`, for each entry of :data:`_CALLBACKS`."""
  out = {}
  for name, api in _CALLBACKS.items():
    proc = run_python(
      _FAILING.format(api=api) + body, env_extra=env, timeout=120
    )
    out[name] = (proc.returncode, proc.stdout, proc.stderr)
  return out


def _as_jax(runs: dict, returncode: int, stdout: str) -> None:
  for name, (rc, out, err) in runs.items():
    assert (rc, out) == (returncode, stdout), (name, err)


@pytest.mark.parametrize(
  "env",
  [{}, {"HOSTCB_DISABLE_NATIVE": "1"}],
  ids=["native", "python-callbacks"],
)
def test_a_caught_failure_runs_the_exit_handlers_and_exits_0(env):
  runs = _under_each(
    "try:\n"
    "  print(float(f(2.0)))\n"
    "except Exception as e:\n"
    "  print('caught', type(e).__name__)\n",
    env,
  )
  _as_jax(runs, 0, "caught JaxRuntimeError\nprogram's exit handler ran\n")


def test_an_uncaught_failure_exits_1_with_jaxs_error_after_the_handlers():
  runs = _under_each("print(float(f(2.0)))\nprint('not reached')\n")
  _as_jax(runs, 1, "program's exit handler ran\n")
  for name, (_, _, err) in runs.items():
    assert (
      "jax.errors.JaxRuntimeError: INTERNAL: CpuCallback error calling "
      "callback: Traceback (most recent call last):\n" in err
    ), name
    assert "ValueError: boom" in err, name


@pytest.mark.parametrize(
  "read", ["print(y)", "y.block_until_ready()", "y.item()"]
)
def test_the_first_read_of_a_result_raises_the_failure(read):
  runs = _under_each(
    "try:\n"
    "  y = f(2.0)\n"
    f"  {read}\n"
    "  print('no failure')\n"
    "except Exception as e:\n"
    "  print('caught', type(e).__name__)\n"
    "print('went on')\n"
  )
  _as_jax(
    runs, 0, "caught JaxRuntimeError\nwent on\nprogram's exit handler ran\n"
  )


def test_a_barrier_raises_a_failure_that_no_read_raised():
  runs = _under_each(
    "try:\n"
    "  y = f(2.0)\n"
    "  jax.effects_barrier()\n"
    "  print('no failure')\n"
    "except Exception as e:\n"
    "  print('caught', type(e).__name__)\n"
    "jax.effects_barrier()\n"
    "print('went on')\n"
  )
  _as_jax(
    runs, 0, "caught JaxRuntimeError\nwent on\nprogram's exit handler ran\n"
  )


def test_hostcbs_error_has_jaxs_words_then_where_hostcb_raised_it():
  proc = run_python(
    _FAILING.format(api=_CALLBACKS["hostcb.debug"]) + "y = f(2.0)\n"
    "try:\n"
    "  hostcb.barrier_wait()\n"
    "except jax.errors.JaxRuntimeError as e:\n"
    "  print(e)\n",
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr
  head, frames = proc.stdout.split("\n", 1)
  assert head == (
    "INTERNAL: CpuCallback error calling callback: "
    "Traceback (most recent call last):"
  )
  # The callback's frames, as JAX shows them (no lines of code), then the
  # exception, then hostcb's words.
  assert frames.endswith(
    ", in bad\nValueError: boom\n\n"
    "hostcb: raised at the first barrier after the callback failed "
    "(hostcb's device does not wait for jax.debug.callback: the "
    "computation that ran it returned first)\n"
    "program's exit handler ran\n"
  ), frames


def test_a_failure_that_nothing_raised_is_logged_at_exit_and_the_status_kept():
  # JAX raises it from the call itself; hostcb's device did not wait for
  # the callback, and no read or barrier came after it: the exit handler
  # logs it, and the program's own handlers run, with its exit status.
  proc = run_python(
    _FAILING.format(api=_CALLBACKS["hostcb.debug"])
    + "f(2.0)\nprint('end of program')\n",
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "end of program\nprogram's exit handler ran\n"
  assert (
    "hostcb: at exit, a jax.debug.callback had failed, and no read of a "
    "result on its device nor any barrier came after it to raise it:\n"
    "INTERNAL: CpuCallback error calling callback: Traceback" in proc.stderr
  )


def test_a_failure_is_raised_once():
  proc = run_python(
    _FAILING.format(api=_CALLBACKS["hostcb.debug"]) + "y = f(2.0)\n"
    "for _ in range(2):\n"
    "  try:\n"
    "    print(float(y))\n"
    "  except jax.errors.JaxRuntimeError:\n"
    "    print('caught')\n"
    "jax.effects_barrier()\n",
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "caught\n4.0\nprogram's exit handler ran\n"
