"""Prints before the results they come with
(``hostcb._engine.output_order.reads``): a result read on the host never
shows before the lines that the computation producing it printed through
hostcb, as with JAX's own callbacks, which print while the computation
runs."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcb
from _helpers import run_python
from hostcb import _engine as engine

DEADLINE = 60.0  # seconds: every wait of these tests ends by then
STEPS = 20


def test_printed_results_follow_the_debug_prints_of_their_computation(capsys):
  f = jax.jit(lambda x: (hostcb.debug.print("x = {}", x), x * 2)[1])
  for i in range(STEPS):
    print(f(jnp.float32(i)))
  assert capsys.readouterr().out == "".join(
    f"x = {float(i)}\n{float(2 * i)}\n" for i in range(STEPS)
  )


def test_printed_results_follow_the_id_prints_of_their_computation(capsys):
  f = jax.jit(lambda x: hostcb.id_print(x, what="x") * 2)
  for i in range(STEPS):
    print(f(jnp.float32(i)))
  assert capsys.readouterr().out == "".join(
    f"what: x\n{i}.\n{float(2 * i)}\n" for i in range(STEPS)
  )


@pytest.mark.parametrize(
  "read",
  {
    "item": lambda a: a.item(),
    "float": float,
    "tolist": lambda a: a.tolist(),
    "str": str,
    "block_until_ready": lambda a: a.block_until_ready(),
    "jax.block_until_ready of several": lambda a: jax.block_until_ready(
      (a, a + 1)
    ),
    "jax.device_get": jax.device_get,
  }.items(),
  ids=lambda r: r[0] if isinstance(r, tuple) else r,
)
def test_a_host_read_returns_after_the_callbacks_of_its_computation(read):
  seen = []
  f = jax.jit(lambda x: (hostcb.debug.callback(seen.append, x), x + 1)[1])
  for i in range(STEPS):
    read[1](f(jnp.float32(i)))
    assert len(seen) == i + 1, read[0]


def test_a_tap_function_that_reads_an_array_does_not_wait_for_itself():
  done = threading.Event()

  def tap(x, transforms):
    np.asarray(jnp.asarray(x) + 1)  # a host read on the consumer thread
    done.set()

  hostcb.debug.print("staged")  # host reads wait for prints from now on
  jax.jit(lambda x: hostcb.id_tap(tap, x))(jnp.float32(1.0))
  assert done.wait(DEADLINE)
  assert engine.wait_for_taps(DEADLINE)


def test_a_print_line_is_one_write(capsys):
  writes = []

  class Recorder:
    def write(self, s):
      writes.append(s)

    def flush(self):
      pass

  import sys

  real = sys.stdout
  sys.stdout = Recorder()
  try:
    jax.jit(lambda x: hostcb.id_print(x, what="x"))(jnp.float32(2.0))
    hostcb.barrier_wait()
  finally:
    sys.stdout = real
  assert writes == ["what: x\n2.\n"]


def test_a_host_read_does_not_wait_for_a_blocked_tap_function_after_the_prints():
  # The print, then a tap function that blocks, in one computation: the
  # read waits for the print, not for the blocked function after it (nor
  # does the device: the computation's result is ready).
  release = threading.Event()
  f = jax.jit(
    lambda x: hostcb.id_tap(
      lambda a, t: release.wait(DEADLINE), hostcb.debug.print("x={}", x) or x
    )
  )
  try:
    y = f(jnp.float32(1.0))
    assert float(y) == 1.0
    assert y.block_until_ready() is y
    assert not release.is_set()
  finally:
    release.set()
  assert engine.wait_for_taps(DEADLINE)


_ORDER_SCRIPT = """
import jax, jax.numpy as jnp, hostcb
f = jax.jit(lambda x: (hostcb.debug.print("x = {}", x), x * 2)[1])
for i in range(10):
  print(f(jnp.float32(i)))
"""


def test_printed_results_follow_the_prints_on_the_python_callback_path():
  proc = run_python(
    _ORDER_SCRIPT,
    env_extra={"HOSTCB_DISABLE_NATIVE": "1", "HOSTCB_NO_ENGINE_WARNING": "1"},
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "".join(
    f"x = {float(i)}\n{float(2 * i)}\n" for i in range(10)
  )


@pytest.mark.parametrize(
  "kind", ["io_callback", "pure_callback"], ids=lambda k: k
)
@pytest.mark.parametrize(
  "jax_arrays", [True, False], ids=["jax_arrays", "numpy"]
)
def test_a_host_read_in_a_callback_host_function_does_not_wait_for_prints(
  kind, jax_arrays, capsys
):
  # A print is pending on device 0 (its consumer is blocked in the tap
  # before it); the host function of a call on device 1 reads an array of
  # device 0.  Its computation waits for it, so the read must not wait for
  # that print: it returns while the tap is still blocked.
  devices = jax.devices()
  if len(devices) < 2:
    pytest.skip("needs 2 devices (HOSTCB_TEST_DEVICES=2 or more)")
  release, tap_done = threading.Event(), threading.Event()

  def block(a, transforms):
    release.wait(DEADLINE)
    tap_done.set()

  held = jax.device_put(jnp.float32(1.0), devices[0])
  seen = []

  def host(a):
    seen.append(float(held))  # a host read, the print still pending
    seen.append(tap_done.is_set())
    return np.asarray(a) + 1

  before = hostcb.config.read("hostcb_callback_jax_arrays")
  hostcb.config.update("hostcb_callback_jax_arrays", jax_arrays)
  try:
    printer = jax.jit(
      lambda x: hostcb.debug.print("x={}", hostcb.id_tap(block, x))
    )
    call = getattr(hostcb, kind)
    f = jax.jit(lambda x: call(host, jax.ShapeDtypeStruct((), jnp.float32), x))
    printer(held)
    y = f(jax.device_put(jnp.float32(2.0), devices[1]))
    assert float(y) == 3.0
    assert seen == [1.0, False]
  finally:
    release.set()
    hostcb.config.update("hostcb_callback_jax_arrays", before)
  assert engine.wait_for_taps(DEADLINE)
  assert capsys.readouterr().out == "x=1.0\n"
