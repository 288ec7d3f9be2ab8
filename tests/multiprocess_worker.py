"""One process of the multi-process tests (started by test_multiprocess.py).

Usage: ``python multiprocess_worker.py PROCESS_ID NUM_PROCESSES PORT OUTDIR``
with ``XLA_FLAGS=--xla_force_host_platform_device_count=2``.  The worker
joins the others through ``jax.distributed.initialize`` on 127.0.0.1:PORT,
runs every scenario below in order and, after each, rewrites
``OUTDIR/result_<PROCESS_ID>.json``: ``{scenario: {"value": ...}}`` or
``{scenario: {"error": "..."}}``.  Devices are reported by their index in
``jax.devices()`` (global), so results do not depend on device ids.

``PROCESS_ID`` ``die`` makes it exit at once with status 3 (to test that the
launcher cleans up after a failed process).
"""

from __future__ import annotations

import io
import json
import os
import sys
import traceback
import warnings

if sys.argv[1] == "die":
  sys.exit(3)

import jax

from _cluster import join

PID, NPROC, OUTDIR = join()

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import hostcb  # noqa: E402
import hostcb._engine.distributed  # noqa: E402

hostcb.set_barrier_timeout(60)
GLOBAL = list(jax.devices())
_taps: list = []


def _index(device) -> int:
  return GLOBAL.index(device)


def record(arg, transforms, device=None):
  """A tap function: remembers what it got, and where."""
  _taps.append(
    {
      "value": np.asarray(arg).tolist(),
      "device": None if device is None else _index(device),
      "process": None if device is None else device.process_index,
    }
  )


def taps_seen() -> list:
  """The taps of this process since the last call, in device order."""
  hostcb.barrier_wait()
  seen = sorted(_taps, key=lambda t: (t["device"], str(t["value"])))
  _taps.clear()
  return seen


def global_vector(devices) -> jax.Array:
  """arange(8.) split over ``devices``, each process giving its shards."""
  sharding = NamedSharding(Mesh(np.array(devices), ("x",)), P("x"))
  whole = np.arange(8.0, dtype=np.float32)
  return jax.make_array_from_callback(
    whole.shape, sharding, lambda idx: whole[idx]
  )


def _tap_jit(devices, **kw):
  x = global_vector(devices)
  f = jax.jit(
    lambda v: hostcb.id_tap(record, v * 2, tap_with_device=True, **kw),
    out_shardings=x.sharding,
  )
  f(x).block_until_ready()
  return taps_seen()


def jit_tap():
  return _tap_jit(GLOBAL)


def jit_tap_device_index():
  return _tap_jit(GLOBAL, device_index=3)


def jit_tap_mesh_order():
  # Device 0 of this mesh is the last global device, owned by process 1.
  return _tap_jit(GLOBAL[::-1])


def pjit_print():
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", DeprecationWarning)
      from jax.experimental.pjit import pjit
  except ImportError:  # removed in some later JAX: pjit is jit
    pjit = jax.jit
  mesh = Mesh(np.array(GLOBAL).reshape(2, 2), ("a", "b"))
  whole = np.arange(16.0, dtype=np.float32).reshape(4, 4)
  x = jax.make_array_from_callback(
    whole.shape, NamedSharding(mesh, P("a", "b")), lambda idx: whole[idx]
  )
  out = io.StringIO()
  f = pjit(
    lambda v: hostcb.id_print(v.sum(0), what="column sums", output_stream=out),
    out_shardings=NamedSharding(mesh, P()),
  )
  y = f(x)
  y.block_until_ready()
  hostcb.barrier_wait()
  return {
    "printed": out.getvalue(),
    "result": np.asarray(y.addressable_shards[0].data).tolist(),
  }


def barrier_after_dispatch():
  # barrier_wait() right after dispatching a global computation, without
  # waiting for its result: the taps must have run when it returns.
  x = global_vector(GLOBAL)
  f = jax.jit(
    lambda v: hostcb.id_tap(record, v.sum()),
    out_shardings=NamedSharding(x.sharding.mesh, P()),
  )
  seen_at_barrier = []
  for _ in range(20):
    y = f(x)
    hostcb.barrier_wait()
    seen_at_barrier.append(len(_taps))
    y.block_until_ready()
  taps_seen()
  return seen_at_barrier


def jit_call():
  calls = []

  def plus_100(a):
    calls.append(np.asarray(a).tolist())
    return a + 100

  x = global_vector(GLOBAL)
  f = jax.jit(
    lambda v: hostcb.call(
      plus_100, v, result_shape=jax.ShapeDtypeStruct(v.shape, v.dtype)
    ),
    out_shardings=x.sharding,
  )
  y = f(x)
  shards = {
    str(_index(s.device)): np.asarray(s.data).tolist()
    for s in y.addressable_shards
  }
  return {"calls": calls, "shards": shards}


def pmap_tap():
  local = np.arange(2.0, dtype=np.float32) + 10 * PID
  y = jax.pmap(lambda v: hostcb.id_tap(record, v + 1, tap_with_device=True))(
    local
  )
  y.block_until_ready()
  return taps_seen()


def partitioned_tap():
  # Each process taps only the shards of its own devices, with their index
  # in the global array; the compiled program gathers nothing.
  got = []

  def shard(arg, transforms, device, index):
    got.append(
      {
        "value": np.asarray(arg).tolist(),
        "device": _index(device),
        "process": device.process_index,
        "index": [index[0].start, index[0].stop],
      }
    )

  x = global_vector(GLOBAL)
  f = jax.jit(
    lambda v: hostcb.id_tap(
      shard, v * 2, partitioned=True, tap_with_device=True
    ),
    out_shardings=x.sharding,
  )
  text = f.lower(x).compile().as_text()
  f(x).block_until_ready()
  hostcb.barrier_wait()
  printed = []
  jax.jit(
    lambda v: hostcb.debug.callback(
      lambda a: printed.append(np.asarray(a).tolist()), v, partitioned=True
    )
  )(x)
  jax.effects_barrier()
  return {
    "taps": sorted(got, key=lambda t: t["device"]),
    "debug": sorted(printed),
    "gathers": "all-gather" in text or "all-reduce" in text,
  }


def all_processes_barrier():
  # Each process's tap writes a file; after the global barrier every
  # process must see the files of all processes.
  def touch(arg, transforms, device):
    path = os.path.join(
      OUTDIR, f"tapped_{device.process_index}_{_index(device)}"
    )
    with open(path, "w") as f:
      f.write(str(np.asarray(arg).tolist()))

  y = jax.pmap(lambda v: hostcb.id_tap(touch, v, tap_with_device=True))(
    np.arange(2.0, dtype=np.float32) + 10 * PID
  )
  y.block_until_ready()
  hostcb.barrier_wait("all", all_processes=True)
  return sorted(n for n in os.listdir(OUTDIR) if n.startswith("tapped_"))


def tap_exception():
  def fails_on_process_1(arg, transforms, device):
    if device.process_index == 1:
      raise ValueError(f"tap failed on device {_index(device)}")

  y = jax.pmap(
    lambda v: hostcb.id_tap(fails_on_process_1, v, tap_with_device=True)
  )(np.zeros(2, np.float32))
  y.block_until_ready()
  try:
    hostcb.barrier_wait("exc", all_processes=True)
  except hostcb.CallbackException as e:
    return {
      "raised": type(e).__name__,
      "cause": f"{type(e.__cause__).__name__}: {e.__cause__}",
    }
  return {"raised": None}


def after_exception():
  # Both processes go on after a tap failed in one of them.
  return jit_tap()


def progress_bars():
  # hostcb.progress under pmap: each process shows the bars of its own
  # devices (one combined bar, or one per device), or only process 0.
  import tqdm

  try:
    from hostcb import progress

    progress._require_supported_jax()
  except ImportError as e:  # hostcb.progress.UnsupportedJax (jax 0.8)
    return {"unsupported": str(e)}
  made = []

  class Bars(tqdm.tqdm):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, file=io.StringIO(), **kwargs)
      made.append(self)

  out = {}
  for name, kw in [
    ("combined", {}),
    ("each", {"devices": "each"}),
    ("first", {"processes": "first"}),
  ]:
    made.clear()
    jax.pmap(
      lambda c: progress.scan(
        lambda c, x: (c + x, None),
        c,
        np.arange(50.0, dtype=np.float32),
        tqdm_class=Bars,
        **kw,
      )[0]
    )(np.zeros(2, np.float32)).block_until_ready()
    hostcb.barrier_wait()
    out[name] = sorted([b.n, b.total, b.disable] for b in made)
    if name == "combined":
      out["combined_desc"] = [b.desc for b in made]
  return out


def barrier_timeout():
  # Last scenario: process 0 waits alone (process 1 never arrives), so the
  # barrier counts of the processes differ afterwards.
  if PID != 0:
    return {"skipped": True}
  try:
    hostcb._engine.distributed.wait_for_all_processes("alone", timeout_s=1)
  except TimeoutError as e:
    return {"raised": "TimeoutError", "message": str(e)}
  return {"raised": None}


SCENARIOS = [
  jit_tap,
  jit_tap_device_index,
  jit_tap_mesh_order,
  pjit_print,
  barrier_after_dispatch,
  jit_call,
  pmap_tap,
  partitioned_tap,
  all_processes_barrier,
  tap_exception,
  after_exception,
  progress_bars,
  barrier_timeout,
]


def main() -> None:
  results = {}
  path = os.path.join(OUTDIR, f"result_{PID}.json")
  for scenario in SCENARIOS:
    try:
      results[scenario.__name__] = {"value": scenario()}
    except Exception:  # noqa: BLE001  (reported to the test)
      results[scenario.__name__] = {"error": traceback.format_exc()}
    with open(path + ".tmp", "w") as f:
      json.dump(results, f)
    os.replace(path + ".tmp", path)
  print(f"worker {PID}: done", flush=True)


if __name__ == "__main__":
  main()
