"""``hostcb demo``: a short tour of hostcb on 4 CPU devices."""

from __future__ import annotations

import argparse
import logging
import sys

_DEVICES = 4


def _section(title: str) -> None:
  print(f"\n== {title}", flush=True)


def run_demo() -> None:
  """Prints the tour: id_print under transformations, progress bars, call,
  barrier_wait."""
  import jax

  try:  # must happen before JAX starts its CPU backend
    jax.config.update("jax_num_cpu_devices", _DEVICES)
  except Exception:  # noqa: BLE001  (backend already started: use what is)
    pass
  import jax.numpy as jnp
  import numpy as np

  import hostcb

  def power3(x):
    y = x * x
    hostcb.id_print((x, y), what="x,x^2")
    return y * x

  _section("id_print under jit: the device does not wait for the print")
  print("result:", jax.jit(power3)(3.0))
  hostcb.barrier_wait()

  _section("under vmap the tap sees the batch and the transforms")
  jax.vmap(power3)(jnp.array([2.0, 3.0]))
  hostcb.barrier_wait()

  _section("under jvp and grad: one tap, with the primal values")
  jax.jvp(power3, (3.0,), (0.1,))
  hostcb.barrier_wait()
  print("grad:", jax.grad(power3)(3.0))
  hostcb.barrier_wait()

  n = jax.local_device_count()
  kind = jax.local_devices()[0].platform.upper()
  _section(
    f"under pmap on {n} {kind} devices: one tap per device, with device="
  )
  xs = jnp.arange(1.0, n + 1.0)
  jax.pmap(
    lambda x: hostcb.id_print(x * 2, where="pmap", tap_with_device=True)
  )(xs)
  hostcb.barrier_wait()

  _progress_section(n)

  _section("hostcb.call: NumPy's eigvals from inside jit")

  def device_eigvals(m):
    return hostcb.call(
      np.linalg.eigvals,
      m,
      result_shape=jax.ShapeDtypeStruct(m.shape[:-1], jnp.complex64),
    )

  rotation = jnp.array([[0.0, -1.0], [1.0, 0.0]], dtype=jnp.complex64)
  eigvals = np.asarray(jax.jit(device_eigvals)(rotation)).round(6)
  print("eigenvalues of a 90° rotation:", eigvals)

  _section("barrier_wait reports a tap function's exception")

  def picky(x, transforms):
    if x > 1:
      raise ValueError(f"tapped value {x} is too large")

  logging.getLogger("hostcb").setLevel(logging.CRITICAL)  # keep it short
  out = jax.jit(lambda x: hostcb.id_tap(picky, x) * 10)(5.0)
  print("the computation went on and returned", out)
  try:
    hostcb.barrier_wait()
  except hostcb.CallbackException as e:
    last_line = str(e).strip().splitlines()[-1]
    print("barrier_wait raised CallbackException:", last_line)
  print("\nDone. See README.md for the API and the migration guide.")


def _progress_section(n: int) -> None:
  """hostcb.progress: one bar for a vmap of a scan, one for a pmap."""
  import jax
  import jax.numpy as jnp

  import hostcb

  _section(
    "hostcb.progress: a tqdm bar for a jitted scan, under vmap (one "
    f"bar for the batch) and pmap (one bar for the {n} devices)"
  )
  try:
    from hostcb import progress

    progress._require_supported_jax()  # (asked at the first loop)
  except ImportError as e:  # tqdm missing, or progress.UnsupportedJax
    print(e)
    return

  def orbit(c, desc):
    return progress.scan(
      lambda c, _: (jnp.sin(c) + 0.5, None),
      c,
      None,
      length=200_000,
      desc=desc,
      tqdm_kwargs={"file": sys.stdout, "ascii": True},
    )[0]

  jax.jit(jax.vmap(lambda c: orbit(c, "vmap of scan")))(jnp.arange(3.0))
  hostcb.barrier_wait()
  jax.pmap(lambda c: orbit(c, "pmap of scan"))(jnp.arange(float(n)))
  hostcb.barrier_wait()


def _main(args: argparse.Namespace) -> int:
  del args
  run_demo()
  return 0


def add_parser(subparsers) -> None:
  """Adds ``hostcb demo`` to the command line."""
  p = subparsers.add_parser(
    "demo", help="a short tour of hostcb", description=run_demo.__doc__
  )
  p.set_defaults(func=_main)


if __name__ == "__main__":
  sys.exit(_main(argparse.Namespace()))
