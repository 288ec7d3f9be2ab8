"""A logging training step, exported with its callbacks and run in a fresh
process (docs/export.md).

    python examples/export_training_step.py

exports the step to ``train_step.jax`` (in a temporary directory), then
starts ``python examples/export_training_step.py --run train_step.jax``,
which registers the same names and runs it.  Both print the same lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

import hostcb


# The host functions, by name.  The process that runs the exported step
# registers the same names (here: the same code; it may be other code).
@hostcb.register("train.log_loss")
def log_loss(loss, transforms):
  print(f"loss {float(loss):.4f}", flush=True)


@hostcb.register("train.clip")
def clip(g):
  return np.clip(g, -1.0, 1.0).astype(g.dtype)


def loss_fn(w, x, y):
  return jnp.mean((x @ w - y) ** 2)


def train_step(w, x, y):
  loss, g = jax.value_and_grad(loss_fn)(w, x, y)
  hostcb.id_tap(log_loss, loss)  # asynchronous tap
  g = hostcb.call(clip, g, result_shape=g)  # host call, waits
  hostcb.debug.print("grad norm {n:.3f}", n=jnp.linalg.norm(g))
  return w - 0.1 * g


def data():
  x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
  return np.zeros(3, np.float32), x, x @ np.array([1, -2, 3], np.float32)


def export(path: str) -> None:
  w, x, y = data()
  exported = jax.export.export(
    jax.jit(train_step), disabled_checks=hostcb.export_checks()
  )(w, x, y)
  with open(path, "wb") as f:
    f.write(exported.serialize())  # needs flatbuffers: hostcb[export]
  print("in the exporting process:", flush=True)
  for _ in range(2):
    w = train_step(w, x, y)
  hostcb.barrier_wait()


def run(path: str) -> None:
  with open(path, "rb") as f:
    step = jax.export.deserialize(bytearray(f.read()))
  w, x, y = data()
  print("in a fresh process:", flush=True)
  for _ in range(2):
    w = step.call(w, x, y)
  hostcb.barrier_wait()


if __name__ == "__main__":
  if sys.argv[1:2] == ["--run"]:
    run(sys.argv[2])
  else:
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "train_step.jax")
      export(path)
      subprocess.run(
        [sys.executable, __file__, "--run", path], check=True, timeout=300
      )
