"""One process of tests/test_export.py: exports, or loads and runs, programs
with host functions by name, and writes what it saw as JSON.

  python export_worker.py export DIR   # run in-process, export to DIR
  python export_worker.py run DIR      # register the names, run DIR's
  python export_worker.py unbound DIR  # run DIR's without registering
  python export_worker.py cache DIR ORDER   # persistent cache, see below
  python export_worker.py serialize DIR     # serialize_executable
  python export_worker.py deserialize DIR   # ... and load it here

Every function's records go to ``RECORDS``; printed lines to stdout, after
the line ``--- lines``.  The result JSON goes to DIR/<mode>.json.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np

import hostcb

RECORDS: list = []
_lock = threading.Lock()


def _note(name, *values):
  with _lock:
    RECORDS.append(
      [
        name,
        *[
          np.asarray(v).tolist() if not isinstance(v, (str, tuple)) else repr(v)
          for v in values
        ],
      ]
    )


# The host functions, by name; the "run" process binds the same names to
# the same code (a fresh definition: the same behaviour, another object).
def log(x, transforms):
  _note("log", x, transforms)


def log_pair(arg, transforms, device=None):
  _note("log_pair", arg["a"], arg["b"][0], transforms, str(device.platform))


def square(x):
  return np.asarray(x * x, dtype=np.float32)


def stats(x):
  return {"sum": np.float32(np.sum(x)), "max": np.float32(np.max(x))}


def debug_cb(x, label, *, scale):
  _note("debug_cb", x * scale, label)


def io_fn(x):
  _note("io_fn", x)
  return np.asarray(x + 10, dtype=np.float32)


def pure_fn(x):
  return np.asarray(np.sin(x), dtype=np.float32)


def register_all() -> None:
  hostcb.register("log", log)
  hostcb.register("log_pair", log_pair)
  hostcb.register("square", square)
  hostcb.register("stats", stats)
  hostcb.register("debug_cb", debug_cb)
  hostcb.register("io_fn", io_fn)
  hostcb.register("pure_fn", pure_fn)


S3 = jax.ShapeDtypeStruct((3,), jnp.float32)
S = jax.ShapeDtypeStruct((), jnp.float32)


def step(x):
  """A logging step: a tap, a call, a debug callback and print, io and
  pure callbacks, an id_print."""
  x = hostcb.id_tap(log, x)
  hostcb.id_tap(log_pair, {"a": x, "b": (x[0],)}, tap_with_device=True)
  y = hostcb.call(square, x, result_shape=S3)
  st = hostcb.call(stats, y, result_shape={"sum": S, "max": S})
  hostcb.debug.callback(debug_cb, y, "after square", scale=2.0)
  hostcb.debug.print("y={y} sum={s}", y=y, s=st["sum"])
  z = hostcb.io_callback(io_fn, S3, y)
  w = hostcb.pure_callback(pure_fn, S3, z)
  hostcb.id_print(w, what="w")
  return w + st["max"]


def loss(x):
  """Under grad: taps of primals, and of cotangents (transpose)."""
  y = hostcb.id_tap(log, jnp.sin(x))
  return jnp.sum(y * y)


def batched(x):
  """Under vmap: batched taps and a sequential pure callback."""
  x = hostcb.id_tap(log, x)
  hostcb.debug.callback(debug_cb, x, "batched", scale=1.0)
  return hostcb.pure_callback(pure_fn, S3, x, vmap_method="sequential")


X = np.arange(3, dtype=np.float32) + 1
XB = np.arange(6, dtype=np.float32).reshape(2, 3)
PROGRAMS = {
  "step": (jax.jit(step), (X,)),
  "grad": (jax.jit(jax.grad(loss)), (X,)),
  "vmap": (jax.jit(jax.vmap(batched)), (XB,)),
}


def _flush() -> None:
  hostcb.barrier_wait()
  sys.stdout.flush()


def _run(fn, args) -> list:
  out = fn(*args)
  _flush()
  return jax.tree_util.tree_map(lambda a: np.asarray(a).tolist(), out)


def _write(directory: str, mode: str, result: dict) -> None:
  result["records"] = RECORDS
  with open(os.path.join(directory, mode + ".json"), "w") as f:
    json.dump(result, f)


def main(mode: str, directory: str, *rest: str) -> None:
  result: dict = {}
  print("--- lines", flush=True)
  if mode == "export":
    register_all()
    for name, (fn, args) in PROGRAMS.items():
      result[name] = _run(fn, args)
      exported = jax.export.export(fn, disabled_checks=hostcb.export_checks())(
        *args
      )
      with open(os.path.join(directory, name + ".bin"), "wb") as f:
        f.write(exported.serialize())
  elif mode in ("run", "unbound"):
    if mode == "run":
      register_all()
    for name, (_, args) in PROGRAMS.items():
      with open(os.path.join(directory, name + ".bin"), "rb") as f:
        exported = jax.export.deserialize(bytearray(f.read()))
      try:
        result[name] = _run(exported.call, args)
      except Exception as e:  # noqa: BLE001  (the test reads the error)
        result[name] = {"error": type(e).__name__, "message": str(e)}
  elif mode == "cache":
    # Binds the names in the ORDER given, then runs "step" with the
    # persistent compilation cache in DIR/cache: the second process must
    # hit the first one's entry and still call its own functions.
    order = rest[0].split(",")
    functions = dict(
      log=log,
      log_pair=log_pair,
      square=square,
      stats=stats,
      debug_cb=debug_cb,
      io_fn=io_fn,
      pure_fn=pure_fn,
    )
    for name in order:
      hostcb.register(name, functions[name])
    jax.config.update(
      "jax_compilation_cache_dir", os.path.join(directory, "cache")
    )
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    fn, args = PROGRAMS["step"]
    result["step"] = _run(fn, args)
  elif mode == "serialize":
    from jax.experimental import serialize_executable

    register_all()
    fn, args = PROGRAMS["step"]
    compiled = fn.lower(*args).compile()
    result["step"] = _run(compiled, args)
    payload = serialize_executable.serialize(compiled)
    with open(os.path.join(directory, "step.exe"), "wb") as f:
      pickle.dump(payload, f)
  elif mode == "deserialize":
    from jax.experimental import serialize_executable

    register_all()
    with open(os.path.join(directory, "step.exe"), "rb") as f:
      payload = pickle.load(f)
    compiled = serialize_executable.deserialize_and_load(*payload)
    result["step"] = _run(compiled, PROGRAMS["step"][1])
  else:
    raise SystemExit(f"unknown mode {mode!r}")
  _write(directory, mode, result)


if __name__ == "__main__":
  main(*sys.argv[1:])
