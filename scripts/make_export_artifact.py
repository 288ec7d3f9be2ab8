"""Makes tests/data/export_jax_<version>.bin: a program with host functions
by name, exported (jax.export) by the JAX this runs on, and the JSON of
what running it gives (its input, output and the records of its tap).

tests/test_export.py loads the artifact of the oldest supported JAX
(0.8.0) on the JAX it runs on, registering the same names.  Made once,
in the environment of scripts/check_oldest_jax.sh (.venv-oldest, which
installs flatbuffers, hostcb's `export` extra):
  python3 -m venv .venv-oldest
  .venv-oldest/bin/pip install jax==0.8.0 jaxlib==0.8.0 numpy flatbuffers \
      "setuptools>=77" wheel
  .venv-oldest/bin/pip install --no-deps --no-build-isolation .
  JAX_PLATFORMS=cpu .venv-oldest/bin/python scripts/make_export_artifact.py
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

import hostcb

_DATA = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data"
)


def main() -> None:
  records = []
  log = hostcb.register(
    "artifact.log",
    lambda x, t: records.append([np.asarray(x).tolist(), repr(t)]),
  )
  affine = hostcb.register(
    "artifact.affine", lambda x: np.asarray(2 * x + 1, np.float32)
  )

  def program(x):
    x = jax.vmap(lambda row: hostcb.id_tap(log, row))(x)
    y = hostcb.call(
      affine, x, result_shape=jax.ShapeDtypeStruct(x.shape, x.dtype)
    )
    hostcb.id_tap(log, jnp.sum(y))
    return y * 3

  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  exported = jax.export.export(
    jax.jit(program), disabled_checks=hostcb.export_checks()
  )(x)
  out = exported.call(x)
  hostcb.barrier_wait()
  name = f"export_jax_{jax.__version__}"
  with open(os.path.join(_DATA, name + ".bin"), "wb") as f:
    f.write(exported.serialize())
  with open(os.path.join(_DATA, name + ".json"), "w") as f:
    json.dump(
      {
        "jax": jax.__version__,
        "hostcb": hostcb.__version__,
        "input": x.tolist(),
        "output": np.asarray(out).tolist(),
        "records": records,
      },
      f,
      indent=1,
    )
    f.write("\n")


if __name__ == "__main__":
  main()
