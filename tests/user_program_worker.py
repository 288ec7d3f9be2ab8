"""One program of tests/test_user_programs.py, in a fresh interpreter.

``python user_program_worker.py PROGRAM [ARGS]``: runs ``PROGRAM`` (one
function below) and prints what it computed and what its callbacks
printed, one line each.  The environment sets the devices
(``XLA_FLAGS``) and, in ``HOSTCB_USER_CACHE``, JAX's persistent
compilation cache directory (none if empty).
"""

from __future__ import annotations

import os
import sys

import jax

if os.environ.get("HOSTCB_USER_CACHE"):
  jax.config.update(
    "jax_compilation_cache_dir", os.environ["HOSTCB_USER_CACHE"]
  )
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import numpy as np

import hostcb


def out(*parts) -> None:
  print(*parts, flush=True)


# ------------------------------------------------------------ uninstall
def uninstall_then_exit(entry: str) -> None:
  """Twenty prints dispatched, then ``uninstall()``, then exit."""
  if entry == "jax.debug.print":
    hostcb.install(jax_callbacks=True)

    def body(x):
      jax.debug.print("x={}", x)
      return x
  else:
    assert entry == "hostcb.id_print", entry

    def body(x):
      return hostcb.id_print(x, output_stream=_Prefixed("x="))

  f = jax.jit(body)
  for i in range(20):
    f(np.float32(i))
  hostcb.uninstall()


class _Prefixed:
  """An ``output_stream`` that writes each line of ``id_print`` to stdout
  after ``prefix``."""

  def __init__(self, prefix: str):
    self.prefix = prefix

  def write(self, text: str) -> None:
    for line in text.splitlines():
      out(self.prefix + line)


_traces = [0]


def _print_x(x):
  _traces[0] += 1
  jax.debug.print("x={}", x)
  return x


def retrace_after_uninstall() -> None:
  hostcb.install(jax_callbacks=True)
  f = jax.jit(_print_x)
  f(np.float32(1))
  jax.effects_barrier()
  out("installed", hostcb.jax_callbacks_installed())
  f(np.float32(2))
  jax.effects_barrier()
  out("after barrier")
  hostcb.uninstall()
  out("installed", hostcb.jax_callbacks_installed())
  f(np.float32(3))
  jax.effects_barrier()
  out("after barrier")
  out("traces", _traces[0])


def call_after_uninstall_then_exit() -> None:
  """A jitted ``id_print`` called once, ``uninstall()``, called again,
  exit: no barrier."""
  f = jax.jit(lambda x: hostcb.id_print(x, output_stream=_Prefixed("x=")))
  f(np.float32(1))
  hostcb.uninstall()
  f(np.float32(2))


PROGRAMS = {
  f.__name__: f
  for f in (
    uninstall_then_exit,
    retrace_after_uninstall,
    call_after_uninstall_then_exit,
  )
}

if __name__ == "__main__":
  PROGRAMS[sys.argv[1]](*sys.argv[2:])
