"""The GPU back end's host side (``src/hostcb/_native/cuda.cc``), on a CPU.

These tests replace the CUDA driver by the simulated one of
``tests/native/cuda_fake.cc``, which only the test build of the extension
has (``_native_testing``), for this whole test process: a simulated stream
is a host thread that runs its copies and host functions in order, and can
be paused as a busy GPU would hold them back.  They call the CUDA handlers'
bodies with NumPy arrays standing for GPU buffers, and check what the real
handler relies on: one copy per operand and one host function on the
stream and nothing else, records published only once the stream has copied
them, the barrier behind unpublished records, the queue bound, pinning,
calls, and every failure of the driver.  The tests of taps run both ways
a stream can publish a record: by writing its ready word (the default where
the driver has ``cuStreamWriteValue64``) and by a host function.  On a real
GPU, ``tests/test_gpu.py`` checks the same through JAX.

The source arrays stay referenced until their stream has run: a paused
stream copies them later, as a GPU would copy a buffer that XLA keeps.
"""

from __future__ import annotations

import ctypes
import glob
import itertools
import os
import shutil
import subprocess
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcb
from hostcb import _engine as engine, config
from hostcb._engine import entries, gpu, host_functions, native
import _native_testing
from _helpers import run_python


def _jax_sees_a_gpu() -> bool:
  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


pytestmark = [
  pytest.mark.skipif(
    not engine.available(),
    reason=f"the native engine is not built here: "
    f"{engine.unavailable_reason()}",
  ),
  pytest.mark.skipif(
    _jax_sees_a_gpu(),
    reason="JAX uses a real GPU in this process, whose driver the "
    "simulated one would replace: run with JAX_PLATFORMS=cpu",
  ),
]

_ids = iter(range(10**9))


@pytest.fixture(scope="module")
def fake():
  """The extension module (the test build), its GPU back end on the
  simulated driver."""
  module = _native_testing.module()
  module._use_fake_cuda()
  return module


class Stream:
  """A simulated stream; keeps the "device buffers" of what it was given."""

  def __init__(self, module):
    self.module = module
    self.handle = module._fake_stream()
    self.kept = []

  def pause(self, paused=True):
    self.module._fake_pause(self.handle, paused)

  def pending(self):
    return self.module._fake_pending(self.handle)

  def sync(self):
    self.module._fake_sync(self.handle)

  def tap(self, ordinal, tid, arrays):
    self.kept.append(arrays)
    self.module._cuda_test_tap(self.handle, ordinal, tid, arrays)

  def call(self, ordinal, cid, arrays, outs, one_array=False):
    self.kept.append((arrays, outs))
    self.module._cuda_test_call(
      self.handle, ordinal, cid, arrays, outs, one_array
    )


# CUDA_ERROR_NOT_SUPPORTED, as a driver without stream memory operations
# answers: the stream publishes taps by host functions then.
_NOT_SUPPORTED = 801
PUBLICATIONS = ["ready word", "host function"]


def _stream(fake, publication):
  fake._gpu_words_refused(0 if publication == "ready word" else _NOT_SUPPORTED)
  s = Stream(fake)
  yield s
  s.pause(False)
  s.sync()
  fake._gpu_words_refused(0)


@pytest.fixture(params=PUBLICATIONS)
def stream(fake, request):
  yield from _stream(fake, request.param)


@pytest.fixture
def host_function_stream(fake):
  yield from _stream(fake, "host function")


@pytest.fixture
def word_stream(fake):
  yield from _stream(fake, "ready word")


# The leases of the entries these tests make: kept for the process, as no
# executable keeps them.
_leases = []


def _recording_tap():
  """(target id, list of (arrays, device)) of a fresh tap entry."""
  seen = []
  lease = host_functions.tap_id(
    ("test_engine_gpu", next(_ids)),
    lambda: entries.ArraysTap(
      lambda arrays, device: seen.append((arrays, device))
    ),
  )
  _leases.append(lease)
  return lease.tid, seen


def _call(run):
  """The target id of a call whose runner is ``run(arrays, ordinal)``."""
  lease = host_functions.call_id(
    ("test_engine_gpu", next(_ids)),
    lambda: entries.CallEntry(entries.CallRunner(run), lambda r: r),
  )
  _leases.append(lease)
  return lease.tid


def _wait_until(predicate, what, timeout=30.0):
  deadline = time.monotonic() + timeout
  while not predicate():
    if time.monotonic() > deadline:
      raise AssertionError(f"timed out waiting for {what}")
    time.sleep(0.001)


# ------------------------------------------------------------- the build
def _has_cuda_driver() -> bool:
  try:
    ctypes.CDLL("libcuda.so.1")
  except OSError:
    return False
  return True


def test_the_driver_is_loaded_at_run_time_or_the_reason_is_given():
  # The extension is built without CUDA: where there is no driver, the GPU
  # back end names the missing library instead of failing to import.
  out = run_python(
    "from hostcb._native import _engine; print(_engine.load_cuda())"
  ).stdout
  if _has_cuda_driver():
    assert out.strip() == "None"
  else:
    assert out.strip().startswith(
      "the CUDA driver libcuda.so.1 cannot be loaded (libcuda.so.1: "
    )


def _cuda_header_dir() -> str | None:
  """The include folder of a CUDA toolkit with cuda.h, if this machine has
  one (CUDA_HOME, CUDA_PATH, /usr/local/cuda*)."""
  roots = [
    os.environ.get("CUDA_HOME"),
    os.environ.get("CUDA_PATH"),
    "/usr/local/cuda",
    *sorted(glob.glob("/usr/local/cuda-*")),
  ]
  for root in filter(None, roots):
    if os.path.exists(os.path.join(root, "include", "cuda.h")):
      return os.path.join(root, "include")
  return None


def test_the_hand_written_driver_api_has_the_drivers_abi():
  # cuda_api.h declares the driver's functions without cuda.h; a compiler
  # checks them against cuda.h wherever a CUDA toolkit is installed.
  include = _cuda_header_dir()
  compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
  if include is None or compiler is None:
    pytest.skip(
      "needs the CUDA toolkit's cuda.h (CUDA_HOME or "
      "/usr/local/cuda*) and a C++ compiler"
    )
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  res = subprocess.run(
    [
      compiler,
      "-std=c++17",
      "-fsyntax-only",
      "-I",
      os.path.join(root, "src", "hostcb", "_native"),
      "-isystem",
      include,
      os.path.join(root, "tests", "native", "cuda_abi_check.cc"),
    ],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert res.returncode == 0, res.stderr


def test_gpu_queue_keys_do_not_meet_cpu_device_ids():
  cpu = jax.local_devices(backend="cpu")[0]
  assert native.key_of_device(cpu) == cpu.id
  assert gpu.key_of(0) == gpu.GPU_KEY_BASE == native.module().GPU_KEY_BASE
  assert native.device_of_ordinal(cpu.id) is cpu


# ------------------------------------------------------------------ taps
def test_a_tap_puts_one_copy_per_operand_and_one_host_function_on_the_stream(
  stream,
):
  tid, seen = _recording_tap()
  stream.pause()
  stream.tap(0, tid, [np.arange(4, dtype=np.float32), np.array(7, np.int32)])
  assert stream.pending() == 3
  stream.pause(False)
  assert engine.wait_for_taps(timeout=30)
  ((arrays, device),) = seen
  np.testing.assert_array_equal(arrays[0], np.arange(4, dtype=np.float32))
  assert arrays[0].dtype == np.float32 and arrays[1].dtype == np.int32
  assert arrays[1].shape == () and arrays[1] == 7
  assert device == native.device_of_ordinal(gpu.key_of(0))


def test_a_tap_copies_its_operand_when_the_stream_reaches_it(stream):
  tid, seen = _recording_tap()
  x = np.zeros(3, np.float32)
  stream.pause()
  stream.tap(0, tid, [x])
  x[:] = 5  # what the device computes before the stream reaches the tap
  stream.pause(False)
  assert engine.wait_for_taps(timeout=30)
  np.testing.assert_array_equal(seen[0][0][0], [5.0, 5.0, 5.0])


def test_the_barrier_waits_for_taps_the_stream_has_not_published(stream):
  tid, seen = _recording_tap()
  stream.pause()
  stream.tap(0, tid, [np.ones(2, np.float32)])
  assert not engine.wait_for_taps(timeout=0.2)
  assert seen == []
  stream.pause(False)
  assert engine.wait_for_taps(timeout=30)
  assert len(seen) == 1


def test_taps_of_a_gpu_arrive_in_stream_order(stream):
  tid, seen = _recording_tap()
  for i in range(500):
    stream.tap(1, tid, [np.full((i % 7,), i, np.int64)])
  assert engine.wait_for_taps(timeout=30)
  assert [
    int(a[0].sum()) // max(len(a[0]), 1) if len(a[0]) else i
    for i, (a, _) in enumerate(seen)
  ] == list(range(500))
  assert [a[0].shape for a, _ in seen] == [(i % 7,) for i in range(500)]


def test_taps_of_two_gpus_go_to_their_own_devices(fake):
  tid, seen = _recording_tap()
  s0, s1 = Stream(fake), Stream(fake)
  s0.tap(2, tid, [np.array(2)])
  s1.tap(3, tid, [np.array(3)])
  s0.sync()
  s1.sync()
  assert engine.wait_for_taps(timeout=30)
  assert sorted((int(a[0]), d) for a, d in seen) == [
    (2, native.device_of_ordinal(gpu.key_of(2))),
    (3, native.device_of_ordinal(gpu.key_of(3))),
  ]


def test_the_ring_pins_its_pages_in_chunks_once(stream, fake):
  tid, _ = _recording_tap()
  stream.tap(4, tid, [np.ones(16, np.float32)])
  before = fake._fake_counters()["registrations"]
  pinned = gpu.pinned_bytes(4)
  for _ in range(10):
    stream.tap(4, tid, [np.ones(16, np.float32)])
  assert engine.wait_for_taps(timeout=30)
  assert pinned == 2 << 20  # one chunk: the taps reuse the ring's start
  assert gpu.pinned_bytes(4) == pinned
  assert fake._fake_counters()["registrations"] == before
  assert gpu.pin_refusal(4) is None


def test_an_operand_across_two_pinned_chunks_is_copied_in_two_pieces(
  stream, fake
):
  tid, seen = _recording_tap()
  big = np.arange(3 << 18, dtype=np.float32)  # 3 MiB from the ring's start
  before = fake._fake_counters()["copies"]
  stream.tap(9, tid, [big])
  assert fake._fake_counters()["copies"] - before == 2
  assert engine.wait_for_taps(timeout=30)
  np.testing.assert_array_equal(seen[0][0][0], big)
  assert gpu.pinned_bytes(9) == 4 << 20


_growths = itertools.count(1)


def test_growing_the_queue_unpins_the_old_ring(stream, fake):
  tid, seen = _recording_tap()
  stream.tap(10, tid, [np.ones(4, np.float32)])
  assert engine.wait_for_taps(timeout=30)
  assert gpu.pinned_bytes(10) == 2 << 20
  before = fake._fake_counters()["unregistrations"]
  bound = config.read(config.MAX_QUEUE_BYTE_SIZE)
  # A ring larger than any mapped before (each run of this test grows
  # it more): the old one goes.
  native.set_capacity(bound + (next(_growths) << 20))
  try:
    assert gpu.pinned_bytes(10) == 0
    assert fake._fake_counters()["unregistrations"] > before
    stream.tap(10, tid, [np.full(4, 2, np.float32)])  # pins the new ring
    assert engine.wait_for_taps(timeout=30)
    assert gpu.pinned_bytes(10) == 2 << 20
  finally:
    native.set_capacity(bound)
  np.testing.assert_array_equal(seen[1][0][0], [2.0, 2.0, 2.0, 2.0])


def test_a_full_ring_makes_the_producer_wait_and_drops_nothing(stream):
  tid, seen = _recording_tap()
  ordinal = 5
  stream.tap(ordinal, tid, [np.zeros(1, np.uint8)])  # creates the queue
  assert engine.wait_for_taps(timeout=30)
  native.set_capacity(4096)
  try:
    stream.pause()
    payload = np.arange(2000, dtype=np.uint8)
    stream.tap(ordinal, tid, [payload])  # fits
    second = threading.Thread(
      target=stream.tap, args=(ordinal, tid, [payload + 1]), daemon=True
    )
    second.start()
    key = gpu.key_of(ordinal)
    _wait_until(
      lambda: native.counters(key)["space_waiters"] == 1,
      "the second tap to wait for space",
    )
    assert native.counters(key)["bytes_held"] <= 4096
    stream.pause(False)
    second.join(timeout=30)
    assert not second.is_alive()
    assert engine.wait_for_taps(timeout=30)
  finally:
    native.set_capacity(config.read(config.MAX_QUEUE_BYTE_SIZE))
  assert [a[0][0] for a, _ in seen[1:]] == [0, 1]


def _tap_with_a_refused_pin(stream, fake, ordinal):
  """(target id, list of (arrays, device)) of a fresh recording tap, once
  it has tapped ``[0, 1, 2]`` (int16) on device ``ordinal`` while the
  driver refused to pin (CUDA_ERROR_OUT_OF_MEMORY) the ring's chunk."""
  tid, seen = _recording_tap()
  fake._fake_fail("register", 1, 2)
  try:
    stream.tap(ordinal, tid, [np.arange(3, dtype=np.int16)])
  finally:
    fake._fake_fail("register", 0, 0)
  return tid, seen


def test_a_refused_pin_still_delivers_the_tap(stream, fake):
  _, seen = _tap_with_a_refused_pin(stream, fake, 6)
  assert engine.wait_for_taps(timeout=30)
  np.testing.assert_array_equal(seen[0][0][0], [0, 1, 2])
  assert gpu.pinned_bytes(6) == 0
  assert gpu.pin_refusal(6) == "CUDA_ERROR_OUT_OF_MEMORY"


def test_a_tap_in_a_refused_chunk_asks_the_driver_to_pin_it_no_more(
  stream, fake
):
  tid, seen = _tap_with_a_refused_pin(stream, fake, 11)
  before = fake._fake_counters()["registrations"]
  stream.tap(11, tid, [np.arange(4, dtype=np.int16)])
  assert engine.wait_for_taps(timeout=30)
  assert fake._fake_counters()["registrations"] == before
  assert [a[0].tolist() for a, _ in seen] == [[0, 1, 2], [0, 1, 2, 3]]


def test_a_reused_ring_slot_does_not_publish_a_tap_before_its_copy(stream):
  # The second tap reuses the first one's ring bytes (the queue emptied in
  # between), ready word included: that word is cleared for it.
  tid, seen = _recording_tap()
  stream.tap(12, tid, [np.full(4, 1, np.float32)])
  assert engine.wait_for_taps(timeout=30)
  stream.pause()
  stream.tap(12, tid, [np.full(4, 2, np.float32)])
  assert not engine.wait_for_taps(timeout=0.2)
  assert len(seen) == 1
  stream.pause(False)
  assert engine.wait_for_taps(timeout=30)
  assert [a[0].tolist() for a, _ in seen] == [[1.0] * 4, [2.0] * 4]


def _a_failed_tap_is_reported_and_the_queue_goes_on(stream, fake, op):
  tid, seen = _recording_tap()
  fake._fake_fail(op, 1, 2)
  with pytest.raises(RuntimeError, match="CUDA_ERROR_OUT_OF_MEMORY"):
    stream.tap(7, tid, [np.ones(2, np.float32)])
  stream.tap(7, tid, [np.full(2, 3, np.float32)])  # the queue goes on
  with pytest.raises(hostcb.CallbackException) as info:
    hostcb.barrier_wait()
  assert "a tap was lost" in str(info.value.__cause__)
  assert len(seen) == 1
  np.testing.assert_array_equal(seen[0][0][0], [3.0, 3.0])


def test_a_failed_copy_fails_the_tap_and_the_barrier_reports_it(stream, fake):
  _a_failed_tap_is_reported_and_the_queue_goes_on(stream, fake, "copy")


def test_a_failed_host_function_fails_the_tap_and_the_barrier_reports_it(
  host_function_stream, fake
):
  _a_failed_tap_is_reported_and_the_queue_goes_on(
    host_function_stream, fake, "host_function"
  )


def test_a_tap_published_by_its_ready_word_needs_no_host_function(
  word_stream, fake
):
  s = word_stream
  tid, seen = _recording_tap()
  before = fake._fake_counters()
  s.tap(8, tid, [np.arange(5, dtype=np.int32)])
  assert engine.wait_for_taps(timeout=30)
  after = fake._fake_counters()
  assert after["host_functions"] == before["host_functions"]
  assert after["word_writes"] == before["word_writes"] + 1
  np.testing.assert_array_equal(seen[0][0][0], np.arange(5))
  assert fake.gpu_publication() is None


def test_a_refused_ready_word_falls_back_to_host_functions_and_says_why(
  word_stream, fake
):
  s = word_stream
  tid, seen = _recording_tap()
  fake._fake_fail("write_value", 1, 2)
  try:
    s.tap(9, tid, [np.arange(3, dtype=np.float32)])
    before = fake._fake_counters()
    s.tap(9, tid, [np.arange(4, dtype=np.float32)])
    assert engine.wait_for_taps(timeout=30)
    after = fake._fake_counters()
    assert fake.gpu_publication() == (
      "the CUDA driver refused cuStreamWriteValue64 (CUDA_ERROR_OUT_OF_MEMORY)"
    )
  finally:
    fake._fake_fail("write_value", 0, 0)
    fake._gpu_words_refused(0)
  # Both delivered; the second one without trying a word again.
  assert [a[0].tolist() for a, _ in seen] == [[0, 1, 2], [0, 1, 2, 3]]
  assert after["word_writes"] == before["word_writes"]
  assert after["host_functions"] == before["host_functions"] + 1


def test_a_refused_ready_word_on_a_pinned_chunk_goes_by_a_host_function(
  word_stream, fake
):
  # The ring's chunk is pinned already, so the second tap's ready word is
  # set up with its reservation; the stream then refuses to write it.
  s = word_stream
  tid, seen = _recording_tap()
  s.tap(13, tid, [np.arange(2, dtype=np.int32)])
  assert engine.wait_for_taps(timeout=30)
  fake._fake_fail("write_value", 1, 2)
  try:
    before = fake._fake_counters()
    s.tap(13, tid, [np.arange(5, dtype=np.int32)])
    assert engine.wait_for_taps(timeout=30)
    after = fake._fake_counters()
  finally:
    fake._fake_fail("write_value", 0, 0)
    fake._gpu_words_refused(0)
  assert [a[0].tolist() for a, _ in seen] == [[0, 1], [0, 1, 2, 3, 4]]
  assert after["registrations"] == before["registrations"]
  assert after["host_functions"] == before["host_functions"] + 1


# ----------------------------------------------------------------- calls
def test_a_call_returns_its_results_through_the_stream(stream):
  cid = _call(
    lambda arrays, ordinal: (arrays[0] * 2, np.asarray(arrays[1] + 1))
  )
  outs = [np.zeros(3, np.float32), np.zeros((), np.int32)]
  stream.call(
    0, cid, [np.arange(3, dtype=np.float32), np.array(4, np.int32)], outs
  )
  stream.sync()
  np.testing.assert_array_equal(outs[0], [0.0, 2.0, 4.0])
  assert outs[1] == 5


def test_a_calls_staging_comes_back_by_its_done_word_and_is_reused(
  word_stream, fake
):
  cid = _call(lambda arrays, ordinal: (arrays[0] + 1,))
  outs = [np.zeros(4, np.float32)]
  word_stream.call(0, cid, [np.zeros(4, np.float32)], outs)
  word_stream.sync()
  # The handler watches the done word for 2 ms, then synchronizes with the
  # stream instead (still correct); on a loaded machine the simulated
  # stream's thread can miss that window, so the three calls are tried
  # again, at most 5 times, until none of them needed the fallback.
  for _ in range(5):
    before = fake._fake_counters()
    for i in range(3):
      word_stream.call(0, cid, [np.full(4, i, np.float32)], outs)
      word_stream.sync()
      np.testing.assert_array_equal(outs[0], np.full(4, i + 1, np.float32))
    after = fake._fake_counters()
    # No host function, two words per call (its operands are here; its
    # results are copied out), and the one staging buffer serves every call.
    assert after["host_functions"] == before["host_functions"]
    assert after["word_writes"] == before["word_writes"] + 6
    assert after["pinned_allocations"] == before["pinned_allocations"]
    if after["synchronizations"] == before["synchronizations"] + 3:
      break
  # No wait for the whole stream: the test's own stream.sync() is the only
  # synchronization.
  assert after["synchronizations"] == before["synchronizations"] + 3


def test_a_call_runs_after_the_taps_before_it(stream):
  tid, seen = _recording_tap()
  stream.tap(0, tid, [np.array(1.0)])
  seen_by_call = []
  cid = _call(
    lambda arrays, ordinal: (seen_by_call.append(len(seen)) or arrays[0],)
  )
  out = np.zeros((), np.float64)
  stream.call(0, cid, [np.array(2.0)], [out])
  stream.sync()
  assert seen_by_call == [1] and out == 2.0


def test_a_call_gets_its_gpu_as_the_device(stream):
  got = []
  cid = _call(lambda arrays, ordinal: (got.append(ordinal) or arrays[0],))
  stream.call(3, cid, [np.array(1, np.int8)], [np.zeros((), np.int8)])
  assert got == [gpu.key_of(3)]


def test_a_call_with_one_array_result_is_checked_in_the_handler(stream):
  cid = _call(lambda arrays, ordinal: np.full(2, 9, np.int32))
  out = np.zeros(2, np.int32)
  stream.call(0, cid, [np.zeros(1, np.int32)], [out], one_array=True)
  stream.sync()
  np.testing.assert_array_equal(out, [9, 9])


def test_a_failing_call_fails_with_the_callback_error_text(stream):
  def run(arrays, ordinal):
    raise ValueError("no such thing")

  cid = _call(run)
  out = np.zeros(1, np.float32)
  with pytest.raises(RuntimeError, match="ValueError: no such thing"):
    stream.call(0, cid, [np.zeros(1, np.float32)], [out])
  assert out[0] == 0


def test_a_call_whose_staging_cannot_be_allocated_fails(stream, fake):
  cid = _call(lambda arrays, ordinal: (arrays[0],))
  fake._fake_fail("alloc", 1, 2)
  try:
    with pytest.raises(
      RuntimeError, match="pinned memory.*CUDA_ERROR_OUT_OF_MEMORY"
    ):
      # Larger than any staging buffer kept so far: a new one is needed.
      big = np.zeros(1 << 22, np.uint8)
      stream.call(0, cid, [big], [np.zeros_like(big)])
  finally:
    fake._fake_fail("alloc", 0, 0)


# -------------------------------------------------------------- lowering
def test_gpu_taps_lower_to_the_cuda_handler_unless_the_option_is_off(
  fake, monkeypatch
):
  # As in a process with a GPU (the simulated driver stands for its own).
  monkeypatch.setattr(gpu, "has_local_gpu", lambda: True)
  f = jax.jit(lambda x: hostcb.id_tap(lambda *a: None, x * 2))

  def custom_calls():
    text = f.trace(jnp.ones(3)).lower(lowering_platforms=("cuda",)).as_text()
    return {
      line.split("@")[1].split("(")[0]
      for line in text.splitlines()
      if "stablehlo.custom_call @" in line
    }

  assert custom_calls() == {"hostcb_tap"}  # the default
  config.update(config.GPU_ENGINE, False)
  try:
    assert custom_calls() == {"xla_ffi_python_gpu_callback"}
  finally:
    config.update(config.GPU_ENGINE, True)


def test_whether_the_process_has_a_gpu_is_asked_of_jax_once(monkeypatch):
  asked = []
  local_devices = jax.local_devices

  def counting(*args, **kwargs):
    asked.append(kwargs.get("backend"))
    return local_devices(*args, **kwargs)

  monkeypatch.setattr(gpu, "_local_gpu", None)  # as in a fresh process
  monkeypatch.setattr(jax, "local_devices", counting)
  for n in range(1, 4):  # three shapes: three lowerings
    f = jax.jit(lambda x: hostcb.id_tap(lambda *a: None, x * 2))
    f.trace(jnp.ones(n)).lower(lowering_platforms=("cuda",))
  assert engine.serves("cuda") is False
  assert asked.count("cuda") == 1
  assert gpu.has_local_gpu() is False
