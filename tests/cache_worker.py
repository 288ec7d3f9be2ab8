"""One process of tests/test_compilation_cache.py.

``python cache_worker.py CACHE_DIR first|second``: turns JAX's persistent
compilation cache on in ``CACHE_DIR``, runs one small program per hostcb
entry point (partitioned or not), and prints one JSON line: per program,
the calls its host functions got (sorted) and the calls they should have
got; and the names of the modules that JAX found in the cache (the
program ``name`` compiles as ``jit_name``).  ``second`` first
stages and runs other tapped programs, so that this process registers
other host functions before the programs under test.
"""

from __future__ import annotations

import io
import json
import logging
import sys
import threading

import jax

jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import hostcb  # noqa: E402

try:
  from hostcb import progress

  progress._require_supported_jax()
except ImportError as e:  # UnsupportedJax: jax 0.8 drops its taps
  progress, _NO_PROGRESS = None, str(e)

N = jax.device_count()
MESH = Mesh(np.array(jax.devices()), ("d",))
_lock = threading.Lock()
_program = [""]  # the name of the program that runs
_hits: list = []  # the names of the modules JAX found in the cache


class _Hits(logging.Handler):
  """JAX logs each persistent cache hit, with the module's name."""

  def emit(self, record: logging.LogRecord) -> None:
    message = record.getMessage()
    if message.startswith("Persistent compilation cache hit for '"):
      _hits.append(message.split("'")[1])


_logger = logging.getLogger("jax._src.compiler")
_logger.addHandler(_Hits(logging.DEBUG))
_logger.setLevel(logging.DEBUG)


def _jit(fn):
  """``jax.jit`` of ``fn`` renamed for the running program: its module is
  ``jit_<program>``."""
  fn.__name__ = fn.__qualname__ = _program[0]
  return jax.jit(fn)


def _rows(offset: int = 0):
  x = np.arange(2 * N * 3, dtype=np.float32).reshape(2 * N, 3) + offset
  return jax.device_put(x, NamedSharding(MESH, P("d")))


def _shards(x) -> list:
  """[device id, values] of each shard of ``x``, sorted."""
  return sorted(
    [s.device.id, np.asarray(s.data).tolist()] for s in x.addressable_shards
  )


class Calls:
  """A host function's calls, as [device id or -1, values as lists]."""

  def __init__(self):
    self.got = []

  def add(self, device, *values) -> None:
    with _lock:
      self.got.append(
        [
          -1 if device is None else device.id,
          [np.asarray(v).tolist() for v in values],
        ]
      )

  def add_result(self, out) -> None:
    self.got.append([-2, [np.asarray(out).tolist()]])

  def sorted(self) -> list:
    return sorted(self.got, key=json.dumps)


def _whole(values) -> list:
  return [[-1, [np.asarray(v).tolist() for v in values]]]


# ------------------------------------------------------------- programs
# Each returns (what its host functions got, what they should have got);
# a result of the program is one more entry, device -2.
def tap_partitioned():
  c = Calls()
  x = _rows()

  def f(a, transforms, *, device, index):
    c.add(device, a)

  _jit(
    lambda v: hostcb.id_tap(f, v * 2, partitioned=True, tap_with_device=True)
  )(x)
  hostcb.barrier_wait()
  return c, [[d, [v]] for d, v in _shards(x * 2)]


def tap_gathered():
  c = Calls()
  x = _rows()
  _jit(lambda v: hostcb.id_tap(lambda a, t: c.add(None, a), v + 1))(x)
  hostcb.barrier_wait()
  return c, _whole([x + 1])


def tap_one_device():
  c = Calls()
  _jit(lambda v: hostcb.id_tap(lambda a, t: c.add(None, a), v * 3))(
    jnp.arange(4.0)
  )
  hostcb.barrier_wait()
  return c, _whole([jnp.arange(4.0) * 3])


def tap_shard_map():
  c = Calls()
  x = _rows()

  def f(a, transforms, *, device):
    c.add(device, a)

  _jit(
    jax.shard_map(
      lambda v: hostcb.id_tap(f, v - 1, tap_with_device=True),
      mesh=MESH,
      in_specs=P("d"),
      out_specs=P("d"),
    )
  )(x)
  hostcb.barrier_wait()
  return c, [[d, [v]] for d, v in _shards(x - 1)]


class _Stream:
  def __init__(self):
    self.lines = []

  def write(self, text: str) -> None:
    with _lock:
      self.lines.extend(t for t in text.splitlines() if t)


def print_partitioned():
  s = _Stream()
  x = _rows()
  _jit(
    lambda v: hostcb.id_print(
      v[:, 0], partitioned=True, output_stream=s, what="p"
    )
  )(x)
  hostcb.barrier_wait()
  got = sorted(s.lines)
  want = sorted(
    line
    for d, v in _shards(x[:, 0])
    for line in ("what: p", str(np.asarray(v, np.float32)))
  )
  return got, want


def print_one_device():
  s = _Stream()
  _jit(lambda v: hostcb.id_print(v + 1, output_stream=s))(jnp.arange(3))
  hostcb.barrier_wait()
  return s.lines, ["[1 2 3]"]


def jax_debug_callback_installed():
  """``jax.debug.callback(partitioned=True)`` under ``install(
  jax_callbacks=True)``: hostcb's."""
  c = Calls()
  x = _rows()
  want = [[-1, [v]] for _, v in _shards(x - 3)]  # (before the uninstall)
  hostcb.install(jax_callbacks=True)
  try:
    _jit(
      lambda v: jax.debug.callback(
        lambda a: c.add(None, a), v - 3, partitioned=True
      )
    )(x)
    jax.effects_barrier()
  finally:
    hostcb.uninstall()
  return c, want


def call_one_device():
  c = Calls()

  def host(a):
    c.add(None, a)
    return a * 10

  out = _jit(
    lambda v: hostcb.call(
      host, v, result_shape=jax.ShapeDtypeStruct((4,), jnp.float32)
    )
  )(jnp.arange(4.0))
  c.add_result(out)
  return c, _whole([jnp.arange(4.0)]) + [[-2, [[0.0, 10.0, 20.0, 30.0]]]]


def call_sharded():
  c = Calls()
  x = _rows()

  def host(a):
    c.add(None, a)
    return a + 0.5

  out = _jit(
    lambda v: hostcb.call(
      host, v, result_shape=jax.ShapeDtypeStruct(x.shape, jnp.float32)
    )
  )(x)
  c.add_result(out)
  return c, _whole([x]) + [[-2, [(np.asarray(x) + 0.5).tolist()]]]


def debug_callback_partitioned():
  c = Calls()
  x = _rows()
  _jit(
    lambda v: hostcb.debug.callback(
      lambda a: c.add(None, a), v + 7, partitioned=True
    )
  )(x)
  jax.effects_barrier()
  return c, sorted(([-1, [v]] for _, v in _shards(x + 7)), key=json.dumps)


def debug_callback():
  c = Calls()
  _jit(lambda v: hostcb.debug.callback(lambda a: c.add(None, a), v / 2))(
    jnp.arange(4.0)
  )
  jax.effects_barrier()
  return c, _whole([jnp.arange(4.0) / 2])


def debug_print_partitioned():
  x = _rows()
  out = io.StringIO()
  saved, sys.stdout = sys.stdout, out
  try:
    _jit(lambda v: hostcb.debug.print("row0={}", v[:, 0], partitioned=True))(x)
    jax.effects_barrier()
  finally:
    sys.stdout = saved
  want = sorted(
    f"row0={np.asarray(v, np.float32)}" for _, v in _shards(x[:, 0])
  )
  return sorted(out.getvalue().splitlines()), want


def debug_print():
  out = io.StringIO()
  saved, sys.stdout = sys.stdout, out
  try:
    _jit(lambda v: hostcb.debug.print("v={v}", v=v))(jnp.arange(3))
    jax.effects_barrier()
  finally:
    sys.stdout = saved
  return out.getvalue().splitlines(), ["v=[0 1 2]"]


def io_callback():
  c = Calls()

  def host(a):
    c.add(None, a)
    return np.asarray(a) + 1

  out = _jit(
    lambda v: hostcb.io_callback(host, jax.ShapeDtypeStruct((3,), jnp.int32), v)
  )(jnp.arange(3))
  c.add_result(out)
  return c, _whole([jnp.arange(3)]) + [[-2, [[1, 2, 3]]]]


def pure_callback():
  c = Calls()

  def host(a):
    c.add(None, a)
    return np.asarray(a) * 2

  out = _jit(
    lambda v: hostcb.pure_callback(
      host, jax.ShapeDtypeStruct((3,), jnp.int32), v
    )
  )(jnp.arange(3))
  c.add_result(out)
  return c, _whole([jnp.arange(3)]) + [[-2, [[0, 2, 4]]]]


class Bar:
  """A tqdm stand-in: records the bar's count when it closes."""

  closed: list = []

  def __init__(self, *args, total=None, **kwargs):
    self.n = 0
    self.total = total

  def update(self, k) -> None:
    self.n += k

  def refresh(self) -> None:
    pass

  def close(self) -> None:
    with _lock:
      Bar.closed.append([self.total, self.n])


def progress_scan():
  Bar.closed = []
  final, _ = _jit(
    lambda: progress.scan(
      lambda c, x: (c + x, None), 0, jnp.arange(10), tqdm_class=Bar
    )
  )()
  hostcb.barrier_wait()
  return list(Bar.closed) + [int(final)], [[10, 10], 45]


PROGRAMS = [
  tap_partitioned,
  tap_gathered,
  tap_one_device,
  tap_shard_map,
  print_partitioned,
  print_one_device,
  call_one_device,
  call_sharded,
  debug_callback_partitioned,
  debug_callback,
  debug_print_partitioned,
  debug_print,
  io_callback,
  pure_callback,
  progress_scan,
  # Last: its uninstall() clears JAX's caches, after which this process
  # would compile its small helpers again and find them in the cache.
  jax_debug_callback_installed,
]


def _other_programs() -> None:
  """Tapped programs that register other functions first."""
  x = _rows(1000)
  seen = []
  _jit(
    lambda v: hostcb.id_tap(
      lambda a, t: seen.append(1), v * 5, partitioned=True
    )
  )(x)
  _jit(
    lambda v: hostcb.debug.callback(
      lambda a: seen.append(2), v, partitioned=True
    )
  )(x)
  _jit(lambda v: hostcb.id_tap(lambda a, t: seen.append(3), v - 5))(
    jnp.arange(5.0)
  )
  _jit(lambda v: hostcb.call(lambda a: a, v, result_shape=v))(jnp.arange(5.0))
  hostcb.barrier_wait()
  assert seen, "the staged programs tapped nothing"


def main() -> None:
  if sys.argv[2] == "second":
    _program[0] = "other_programs"
    _other_programs()
  report = {}
  programs = PROGRAMS
  if progress is None:
    programs = [p for p in PROGRAMS if p is not progress_scan]
    report["skipped"] = {"progress_scan": _NO_PROGRESS}
  for program in programs:
    _program[0] = program.__name__
    got, want = program()
    if isinstance(got, Calls):
      got = got.got
    if program is not progress_scan:  # the others: devices in any order
      got, want = (sorted(v, key=json.dumps) for v in (got, want))
    report[program.__name__] = {"got": got, "want": want}
  report["hits"] = sorted(set(_hits))
  print("REPORT " + json.dumps(report))


if __name__ == "__main__":
  main()
