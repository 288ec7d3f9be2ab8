"""JAX's persistent compilation cache, shared by two processes.

Both processes run ``tests/cache_worker.py`` with one cache directory:
one small program per entry point (``id_tap``, ``id_print``, ``call``,
``hostcb.debug.callback``/``print``, ``io_callback``, ``pure_callback``,
``hostcb.progress``; partitioned or not, sharded, ``shard_map`` and one
device).  The second process first stages other tapped programs, so that
it registers other host functions before these.  In both, every host
function must get exactly its calls (its shards, for a per-shard tap),
and the second must find in the cache every program that JAX writes to
it.  Marked ``multidevice``: it runs with 4 devices and again with 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hostcb._jax_internals.versions import jax_at_least

pytestmark = pytest.mark.multidevice

WORKER = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "cache_worker.py"
)


# JAX before 0.11 writes no cache entry for a program with XLA's Python
# callbacks: hostcb's taps and calls of the whole value in a jit over
# several devices (their placement needs JAX's callback custom call).
# jax 0.11.0, 0.11.2 (found on the GPU machine's suite) and 0.12.0.1 write
# and find them (and each function still gets exactly its calls: the
# tests above).
NOT_WRITTEN = (
  {"tap_gathered", "call_sharded"} if not jax_at_least(0, 11) else set()
)


def _run(cache_dir: str, mode: str) -> dict:
  env = dict(os.environ)
  env.setdefault("JAX_PLATFORMS", "cpu")
  proc = subprocess.run(
    [sys.executable, WORKER, cache_dir, mode],
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, (mode, proc.returncode, proc.stderr[-4000:])
  lines = [
    line for line in proc.stdout.splitlines() if line.startswith("REPORT ")
  ]
  assert len(lines) == 1, proc.stdout[-4000:]
  return json.loads(lines[0][len("REPORT ") :])


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
  cache_dir = str(tmp_path_factory.mktemp("jax_cache"))
  first = _run(cache_dir, "first")
  entries = os.listdir(cache_dir)
  second = _run(cache_dir, "second")
  return first, entries, second


def _programs(report: dict) -> list:
  """The programs that ran (``skipped``: hostcb.progress where this JAX
  cannot run it, with the reason)."""
  return sorted(k for k in report if k not in ("hits", "skipped"))


def test_each_function_gets_exactly_its_calls_in_the_first_process(reports):
  first, _, _ = reports
  for name in _programs(first):
    assert first[name]["got"] == first[name]["want"], name


def test_each_function_gets_exactly_its_calls_from_the_cache(reports):
  _, _, second = reports
  assert _programs(second) == _programs(reports[0])
  for name in _programs(second):
    assert second[name]["got"] == second[name]["want"], name


def test_the_first_process_writes_the_programs_to_the_cache(reports):
  first, entries, _ = reports
  assert first["hits"] == []  # an empty cache
  written = {e.split("-")[0] for e in entries}
  assert {f"jit_{p}" for p in _programs(first)} - written == {
    f"jit_{p}" for p in NOT_WRITTEN
  }


def test_the_second_process_finds_them_although_it_registered_others(reports):
  _, _, second = reports
  hits = set(second["hits"])
  assert {f"jit_{p}" for p in _programs(second)} - hits == {
    f"jit_{p}" for p in NOT_WRITTEN
  }


_IDS = """
import sys
from hostcb._engine import host_functions
leases = []  # (a lowering keeps its lease with the executable)
for k in range(int(sys.argv[1])):
  leases.append(host_functions.tap_id(("another", k), lambda: None))
first = host_functions.tap_id(("the key", 1), lambda: None)
again = host_functions.tap_id(("the key", 1), lambda: None)
class Same:
  def __repr__(self):
    return "same text"
a, b = Same(), Same()
la, lb = host_functions.tap_id(a, lambda: None), host_functions.tap_id(b, lambda: None)
print(first.tid, again.tid, la.tid, lb.tid)
"""


def _ids(registered_before: int) -> list:
  proc = subprocess.run(
    [sys.executable, "-c", _IDS, str(registered_before)],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  return [int(t) for t in proc.stdout.split()]


def test_a_target_id_does_not_count_earlier_registrations():
  first, again, _, _ = _ids(0)
  assert again == first
  assert _ids(50)[0] == first


def test_keys_of_the_same_text_get_ids_of_their_own():
  _, _, a, b = _ids(0)
  assert a != b
