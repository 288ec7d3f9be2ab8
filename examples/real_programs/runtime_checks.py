"""Runtime checks that raise from a host callback, and where the error
reaches the program.

A jitted function hands its operand to a host-side check that raises
``ValueError`` on a non-finite value.  For each way of calling the host,
the program runs the function on a good operand, a bad one, a good one
again, and waits at the barrier after each, printing what it got::

    python examples/real_programs/runtime_checks.py           # JAX's
    hostcb run --jax-callbacks examples/real_programs/runtime_checks.py
    python examples/real_programs/runtime_checks.py --hostcb  # hostcb's

(``--hostcb`` also checks with ``hostcb.call`` and ``hostcb.id_tap``).

tests/test_real_programs.py compares the reports with JAX's and with what
hostcb's documentation says (README "barrier_wait and errors",
docs/jax_callbacks.md): ``io_callback``, ``pure_callback`` and ``call`` fail
the computation; ``debug.callback`` and ``id_tap`` do not: for
``debug.callback`` the first host read of a result on its device, or else
the next barrier, raises JAX's ``JaxRuntimeError`` (``np.asarray`` of an
array on the CPU is no such read), and for ``id_tap`` the next barrier
raises ``hostcb.CallbackException``.
"""

from __future__ import annotations

import argparse

import jax
import jax.experimental
import jax.numpy as jnp
import numpy as np

MESSAGE = "x has 1 non-finite value(s)"


def check_finite(x):
  bad = int(np.sum(~np.isfinite(np.asarray(x))))
  if bad:
    raise ValueError(f"x has {bad} non-finite value(s)")


def checked(x):
  """The check for callbacks with a result: ``x`` itself."""
  check_finite(x)
  return np.asarray(x)


def describe(e: BaseException) -> str:
  text = str(e)
  where = (
    f"ValueError: {MESSAGE}"
    if f"ValueError: {MESSAGE}" in text
    else text.splitlines()[0]
    if text
    else ""
  )
  line = f"raised {type(e).__name__} carrying {where!r}"
  if e.__cause__ is not None:
    line += f", caused by {type(e.__cause__).__name__}: {e.__cause__}"
  return line


def mechanisms(use_hostcb: bool) -> dict:
  """name -> a function of ``x`` that checks it on the host."""
  if use_hostcb:
    import hostcb

    io_callback, pure_callback = hostcb.io_callback, hostcb.pure_callback
    debug_callback = hostcb.debug.callback
  else:
    io_callback = jax.experimental.io_callback
    pure_callback, debug_callback = jax.pure_callback, jax.debug.callback

  def shape(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)

  found = {
    "io_callback": lambda x: io_callback(checked, shape(x), x),
    "pure_callback": lambda x: pure_callback(checked, shape(x), x),
    "debug.callback": lambda x: (debug_callback(check_finite, x), x)[1],
  }
  if use_hostcb:
    found["call"] = lambda x: hostcb.call(checked, x, result_shape=shape(x))
    found["id_tap"] = lambda x: hostcb.id_tap(
      lambda a, transforms: check_finite(a), x
    )
  return found


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument(
    "--hostcb",
    action="store_true",
    help="hostcb's functions, and call and id_tap",
  )
  args = parser.parse_args()
  if args.hostcb:
    # jax.effects_barrier() (looked up when called) waits for hostcb's
    # callbacks too once a program has traced one of them.
    import hostcb
  checks = mechanisms(args.hostcb)
  print(
    "# io_callback from",
    (
      hostcb.io_callback if args.hostcb else jax.experimental.io_callback
    ).__module__,
  )

  def barrier(name: str) -> None:
    if name == "hostcb.barrier_wait":
      hostcb.barrier_wait()
    else:
      jax.effects_barrier()

  good = jnp.array([1.0, 2.0])
  bad = jnp.array([1.0, jnp.inf])
  for name, check in checks.items():
    f = jax.jit(lambda x, check=check: check(x) * 2)
    barrier_name = (
      "hostcb.barrier_wait"
      if name in ("call", "id_tap")
      else "jax.effects_barrier"
    )
    for label, x in (("good", good), ("bad", bad), ("good again", good)):
      try:
        print(f"{name} {label}: returned {np.asarray(f(x)).tolist()}")
      except Exception as e:  # noqa: BLE001  (what the program sees)
        print(f"{name} {label}: {describe(e)}")
      try:
        barrier(barrier_name)
        print(f"{name} {label}: {barrier_name} returned")
      except Exception as e:  # noqa: BLE001
        print(f"{name} {label}: {barrier_name} {describe(e)}")


if __name__ == "__main__":
  main()
