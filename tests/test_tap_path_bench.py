"""The C++ micro-benchmark of the CPU tap path (tests/native/tap_path_bench.cc)
builds against the installed JAX's FFI headers, delivers every
record with its values, and keeps the errors of unusual call frames.

It links the engine's handlers.cc alone (no Python), with the jaxlib
headers that ``jax.ffi.include_dir()`` names; a run here is short: the
figures come from larger ``--calls`` by hand (see README.md's Speed
section).  It also checks the queue's consumer side: a take copied with the
lock released while the FIFO grows (under AddressSanitizer and
ThreadSanitizer where they run), and the pause of the device's taps that the
consumer hears once.  The take's slow path (records not ready yet, copied
with the lock held; ready words; large payloads and own blocks) runs under
both sanitizers too, and the ``lock_sleeps`` counter is checked against a
lock held on purpose.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

import _native_bench


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
  return _native_bench.build(
    tmp_path_factory, "tap_path_bench", ["handlers.cc"], ["-lpthread"]
  )


def test_every_tap_arrives_with_its_values_with_a_consumer_thread(bench):
  got = _native_bench.run(bench, "--calls", "20000", "--consumer=thread")
  assert got["records"] == 20000 and got["checked"] == 1


def test_a_slow_consumer_gets_every_tap_while_the_fifo_grows(bench):
  # The consumer copies the records it takes with the queue's lock
  # released; a producer that outruns it grows the record FIFO meanwhile
  # (past its first 1024 slots), which must keep the slots being read.
  got = _native_bench.run(
    bench, "--calls", "20000", "--consumer=thread", "--work-ns", "2000"
  )
  assert got["records"] == 20000 and got["checked"] == 1


def _sanitized_bench(tmp_path_factory, sanitizer: str, library: str) -> str:
  """tap_path_bench built with -fsanitize=``sanitizer``; skips where the
  compiler cannot build, or the machine cannot run, a program with it."""
  compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
  if compiler is None:
    pytest.skip("needs a C++ compiler (g++ or c++, or $CXX)")
  probe = tmp_path_factory.mktemp(f"{sanitizer}_probe")
  (probe / "p.cc").write_text("int main() { return 0; }\n")
  flag = f"-fsanitize={sanitizer}"
  res = subprocess.run(
    [compiler, flag, str(probe / "p.cc"), "-o", str(probe / "p")],
    capture_output=True,
    text=True,
    timeout=120,
  )
  if res.returncode == 0:
    res = subprocess.run(
      [str(probe / "p")], capture_output=True, text=True, timeout=60
    )
  if res.returncode != 0:
    pytest.skip(
      f"needs {library} that builds and runs here: {res.stderr.strip()[:200]}"
    )
  return _native_bench.build(
    tmp_path_factory,
    "tap_path_bench",
    ["handlers.cc"],
    ["-lpthread"],
    flags=("-O1", "-g", flag),
  )


# A ThreadSanitizer run stops at its first data race (exit 66): with a race
# on every float of a 1 MiB payload, going on takes minutes.
TSAN_ENV = {"TSAN_OPTIONS": "halt_on_error=1"}


@pytest.fixture(scope="module")
def tsan_bench(tmp_path_factory):
  return _sanitized_bench(tmp_path_factory, "thread", "ThreadSanitizer")


@pytest.fixture(scope="module")
def asan_bench(tmp_path_factory):
  return _sanitized_bench(tmp_path_factory, "address", "AddressSanitizer")


def test_records_taken_while_the_fifo_grows_come_out_right(bench):
  # The consumer copies what it took with the lock released; 3000 taps
  # queued right then grow the FIFO from 1024 slots to 4096.
  assert _native_bench.run(bench, "--grow-during-take") == {"grow_checked": 1}


def test_a_grow_during_a_take_keeps_the_slots_being_read(asan_bench):
  # AddressSanitizer fails the run on a read of the slots that the grow
  # left, had they been freed before the consumer's release.
  got = _native_bench.run(asan_bench, "--grow-during-take", timeout=300)
  assert got == {"grow_checked": 1}


def test_the_consumer_and_the_device_thread_share_no_data_unlocked(
  tsan_bench,
):
  # ThreadSanitizer fails the run (exit 66) on a data race: the consumer
  # reads the descriptors it took without the lock while the device thread
  # queues more (and grows the FIFO: the consumer is slow).
  got = _native_bench.run(
    tsan_bench,
    "--calls",
    "5000",
    "--consumer=thread",
    "--work-ns",
    "2000",
    timeout=300,
    env=TSAN_ENV,
  )
  assert got["records"] == 5000 and got["checked"] == 1


def test_the_consumer_hears_once_that_the_device_paused(bench):
  # Once per pause of the device's taps, the consumer lets the device's
  # thread have the GIL (module.cc's run_batch).
  got = _native_bench.run(bench, "--went-quiet")
  assert got == {"went_quiet_checked": 1}


def test_every_tap_arrives_with_its_values_drained_inline(bench):
  got = _native_bench.run(bench, "--calls", "20000", "--consumer=inline")
  assert got["records"] == 20000 and got["checked"] == 1


def test_unusual_call_frames_get_the_bindings_or_the_engines_errors(bench):
  # Another stage or attribute name goes to XLA FFI's binding; a dtype or
  # result that the engine refuses gets the engine's message; none queues.
  # A frame with an unknown extension is run by the binding (queued) and
  # counted as a fallback, with its reason; the errors are not counted.
  assert _native_bench.run(bench, "--errors") == {"errors_checked": 1}


def test_each_sleep_on_the_held_queue_lock_is_counted_once(bench):
  # The bench holds the queue's mutex past the spin bound, until
  # lock_sleeps says that the other thread slept on it: once a tapping
  # thread, once a taking one; each adds exactly 1.
  got = _native_bench.run(bench, "--lock-sleeps")
  assert got == {
    "producer_sleeps": 1,
    "consumer_sleeps": 1,
    "waited": 1,
    "checked": 1,
  }


def test_no_thread_sleeps_on_the_queue_lock_without_contention(bench):
  # One thread taps and drains: the lock is always free when it asks.
  got = _native_bench.run(bench, "--calls", "20000", "--consumer=inline")
  assert got["records"] == 20000 and got["lock_sleeps"] == 0


def test_records_committed_late_come_out_in_order_with_their_values(bench):
  # A second thread writes the payloads and makes the records ready, by
  # commits or (every other block of 8) by ready words, last of each
  # block first: the consumer's takes find unready records (taken with
  # the lock held) and must hold back the ready ones queued after them.
  got = _native_bench.run(
    bench, "--calls", "2000", "--consumer=late", "--floats", "2048"
  )
  assert got["records"] == 2000 and got["checked"] == 1
  assert got["by_word"] == 1000 and got["locked_takes"] >= 1


# The take's slow path under the sanitizers: records committed late
# (ring payloads of 8 KiB, and 1 MiB own blocks) and large payloads that
# the tapping thread copies with the lock released (8 KiB, 1 MiB).  Each:
# --calls, the records made ready by a word (every other block of 8,
# counted back from the last), the other arguments.
SLOW_PATHS = {
  "late_ring": ("2000", 1000, "--consumer=late", "--floats", "2048"),
  "late_own_blocks": ("100", 52, "--consumer=late", "--floats", "262144"),
  "large_ring": ("2000", 0, "--consumer=thread", "--floats", "2048"),
  "large_own_blocks": ("100", 0, "--consumer=thread", "--floats", "262144"),
}


def _slow_path_run(bench: str, which: str, env: dict[str, str]) -> None:
  calls, by_word, *args = SLOW_PATHS[which]
  got = _native_bench.run(
    bench, "--calls", calls, *args, "--work-ns", "2000", timeout=300, env=env
  )
  assert got["records"] == int(calls) and got["checked"] == 1
  assert got["by_word"] == by_word
  if by_word:
    assert got["locked_takes"] >= 1


@pytest.mark.parametrize("which", sorted(SLOW_PATHS))
def test_the_takes_slow_path_shares_no_data_unlocked(tsan_bench, which):
  # ThreadSanitizer fails the run (exit 66) on a data race: a payload read
  # before the write that made its record ready (commit or ready word).
  _slow_path_run(tsan_bench, which, TSAN_ENV)


@pytest.mark.parametrize("which", sorted(SLOW_PATHS))
def test_the_takes_slow_path_reads_only_live_memory(asan_bench, which):
  # AddressSanitizer fails the run on a read or write outside a live
  # payload (its own block included) or FIFO slot.
  _slow_path_run(asan_bench, which, {})
