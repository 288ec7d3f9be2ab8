"""hostcb across processes on JAX's own multi-controller runtime.

One launch of 2 processes x 2 CPU devices (``jax.distributed`` on a free
loopback port, CPU collectives through gloo) runs every scenario of
``multiprocess_worker.py``; each test below checks one scenario's results
in both processes.  Every wait is bounded and the processes are killed
whatever happens.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time

import pytest

import hostcb
import hostcb._engine.distributed
from hostcb import _jax_internals as jax_internals
from _helpers import hostcb_root

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "multiprocess_worker.py")
NUM_PROCESSES = 2
LAUNCH_TIMEOUT_S = 100


def free_port() -> int:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def worker_env() -> dict:
  env = dict(os.environ)
  env.update(
    XLA_FLAGS="--xla_force_host_platform_device_count=2",
    JAX_PLATFORMS="cpu",
    TF_CPP_MIN_LOG_LEVEL="2",
    PYTHONPATH=os.pathsep.join(
      p for p in (hostcb_root(), os.environ.get("PYTHONPATH")) if p
    ),
  )
  env.pop("HOSTCB_BARRIER_TIMEOUT_S", None)
  return env


def launch(argvs: list[list[str]], timeout: float) -> list[dict]:
  """Runs one worker per argv; returns each one's rc, stdout and stderr.

  If a worker exits with an error, or the timeout passes, the others are
  killed at once (a process waiting for a dead peer would otherwise wait
  for its own, longer timeouts).  No process outlives this call.
  """
  procs = [
    subprocess.Popen(
      [sys.executable, WORKER, *argv],
      env=worker_env(),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for argv in argvs
  ]
  outputs: list = [None] * len(procs)
  done: queue.Queue = queue.Queue()

  def reap(i: int) -> None:
    outputs[i] = procs[i].communicate()
    done.put(i)

  threads = [
    threading.Thread(target=reap, args=(i,), daemon=True)
    for i in range(len(procs))
  ]
  for t in threads:
    t.start()
  deadline = time.monotonic() + timeout
  try:
    for _ in procs:
      i = done.get(timeout=max(0.0, deadline - time.monotonic()))
      if procs[i].returncode != 0:
        break
  except queue.Empty:
    pass
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    for t in threads:
      t.join(timeout=30)
  return [
    {
      "rc": p.returncode,
      "stdout": (o or ("", ""))[0],
      "stderr": (o or ("", ""))[1],
    }
    for p, o in zip(procs, outputs)
  ]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  """{process id: {scenario: {"value": ...} or {"error": ...}}}."""
  outdir = tmp_path_factory.mktemp("multiprocess")
  port = str(free_port())
  runs = launch(
    [
      [str(i), str(NUM_PROCESSES), port, str(outdir)]
      for i in range(NUM_PROCESSES)
    ],
    LAUNCH_TIMEOUT_S,
  )
  found = {}
  for i, _run in enumerate(runs):
    path = outdir / f"result_{i}.json"
    if path.exists():
      found[i] = json.loads(path.read_text())
  failed = [(i, run) for i, run in enumerate(runs) if run["rc"] != 0]
  return found, failed


def scenario(results, name: str) -> dict:
  """Each process's value for scenario ``name``; fails with the details."""
  found, failed = results
  values = {}
  for i in range(NUM_PROCESSES):
    entry = found.get(i, {}).get(name)
    if entry is None or "error" in entry:
      detail = entry["error"] if entry else "no result"
      logs = "\n".join(
        f"--- process {j} (rc {run['rc']}):\n{run['stderr'][-3000:]}"
        for j, run in failed
      )
      pytest.fail(f"scenario {name} in process {i}: {detail}\n{logs}")
    values[i] = entry["value"]
  return values


EVEN = [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]


def test_workers_exit_cleanly(results):
  _, failed = results
  assert not failed, "\n".join(
    f"process {i} rc {run['rc']}:\n{run['stderr'][-3000:]}" for i, run in failed
  )


def test_jit_tap_runs_once_in_the_process_of_device_0(results):
  assert scenario(results, "jit_tap") == {
    0: [{"value": EVEN, "device": 0, "process": 0}],
    1: [],
  }


def test_jit_tap_device_index_picks_the_process(results):
  assert scenario(results, "jit_tap_device_index") == {
    0: [],
    1: [{"value": EVEN, "device": 3, "process": 1}],
  }


def test_jit_tap_follows_the_mesh_device_order(results):
  # The mesh lists the global devices backwards: its device 0 is global
  # device 3, in process 1.
  assert scenario(results, "jit_tap_mesh_order") == {
    0: [],
    1: [{"value": EVEN, "device": 3, "process": 1}],
  }


def test_pjit_id_print_prints_once_with_the_whole_operand(results):
  sums = [24.0, 28.0, 32.0, 36.0]
  assert scenario(results, "pjit_print") == {
    0: {"printed": "what: column sums\n[24. 28. 32. 36.]\n", "result": sums},
    1: {"printed": "", "result": sums},
  }


def test_barrier_waits_for_a_dispatched_global_computation(results):
  assert scenario(results, "barrier_after_dispatch") == {
    0: list(range(1, 21)),
    1: [0] * 20,
  }


def test_jit_call_runs_once_and_every_process_gets_its_shards(results):
  assert scenario(results, "jit_call") == {
    0: {
      "calls": [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]],
      "shards": {"0": [100.0, 101.0], "1": [102.0, 103.0]},
    },
    1: {"calls": [], "shards": {"2": [104.0, 105.0], "3": [106.0, 107.0]}},
  }


def test_pmap_taps_run_in_each_process_for_its_local_devices(results):
  assert scenario(results, "pmap_tap") == {
    0: [
      {"value": 1.0, "device": 0, "process": 0},
      {"value": 2.0, "device": 1, "process": 0},
    ],
    1: [
      {"value": 11.0, "device": 2, "process": 1},
      {"value": 12.0, "device": 3, "process": 1},
    ],
  }


def test_partitioned_tap_runs_in_each_process_for_its_own_shards(results):
  def taps(devices):
    return [
      {
        "value": [4.0 * d, 4.0 * d + 2],
        "device": d,
        "process": d // 2,
        "index": [2 * d, 2 * d + 2],
      }
      for d in devices
    ]

  assert scenario(results, "partitioned_tap") == {
    0: {
      "taps": taps([0, 1]),
      "debug": [[0.0, 1.0], [2.0, 3.0]],
      "gathers": False,
    },
    1: {
      "taps": taps([2, 3]),
      "debug": [[4.0, 5.0], [6.0, 7.0]],
      "gathers": False,
    },
  }


def test_barrier_all_processes_waits_for_every_process_taps(results):
  every = ["tapped_0_0", "tapped_0_1", "tapped_1_2", "tapped_1_3"]
  assert scenario(results, "all_processes_barrier") == {0: every, 1: every}


def test_tap_exception_is_reported_only_by_its_process(results):
  values = scenario(results, "tap_exception")
  assert values[0] == {"raised": None}
  assert values[1]["raised"] == "CallbackException"
  assert values[1]["cause"] in (
    "ValueError: tap failed on device 2",
    "ValueError: tap failed on device 3",
  )


def test_processes_go_on_after_a_tap_exception(results):
  assert scenario(results, "after_exception") == {
    0: [{"value": EVEN, "device": 0, "process": 0}],
    1: [],
  }


def test_progress_bars_of_each_process_follow_its_own_devices(results):
  if importlib.util.find_spec("tqdm") is None:
    pytest.skip(
      "tqdm is not installed (pip install hostcb[progress]; "
      "`make install` installs it)"
    )
  done = [50, 50, True]
  found = scenario(results, "progress_bars")
  if "unsupported" in found[0]:
    pytest.skip(found[0]["unsupported"])
  assert found == {
    p: {
      "combined": [done],
      "combined_desc": ["[2 devices]"],
      "each": [done, done],
      "first": [done] if p == 0 else [],
    }
    for p in range(NUM_PROCESSES)
  }


def test_barrier_all_processes_times_out_when_a_process_never_comes(results):
  values = scenario(results, "barrier_timeout")
  assert values[1] == {"skipped": True}
  assert values[0]["raised"] == "TimeoutError"
  message = values[0]["message"]
  assert message.startswith(
    "barrier_wait('alone', all_processes=True) waited 1 s for the other "
    "processes and not all came (process 0 of 2, call number 3 of "
  )


def test_a_failed_worker_gets_the_others_killed_quickly():
  start = time.monotonic()
  runs = launch(
    [["0", "2", str(free_port()), "/nonexistent"], ["die"]],
    timeout=LAUNCH_TIMEOUT_S,
  )
  assert time.monotonic() - start < 30
  assert runs[1]["rc"] == 3
  assert runs[0]["rc"] != 0  # killed while waiting for its peer


def test_example_runs_as_two_local_processes():
  example = os.path.join(os.path.dirname(HERE), "examples", "multiprocess.py")
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # the example sets its own device count
  proc = subprocess.run(
    [sys.executable, example, "--timeout", "90"],
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  lines = {0: [], 1: []}
  for line in proc.stdout.splitlines():
    for i in lines:
      if line.startswith(f"[process {i}] "):
        lines[i].append(line[len(f"[process {i}] ") :])
  assert "what: global sum (id_print in jit)" in lines[0]
  assert "28." in lines[0]
  assert (
    "process 0: call got the whole operand [0. 1. 2. 3. 4. 5. 6. 7.]"
    in lines[0]
  )
  for i in (0, 1):
    assert f"process {i}: every process is past its barrier" in lines[i]
    assert sum(line.endswith("what: pmap") for line in lines[i]) == 2
  assert not any(
    "global sum" in line or "call got" in line for line in lines[1]
  )


# ------------------------------------------------- single process (no launch)
def test_all_processes_barrier_in_a_single_process_waits_for_its_taps():
  import jax

  seen = []
  tap = lambda x, transforms: seen.append(int(x))
  f = jax.jit(lambda x: hostcb.id_tap(tap, x))
  f(1)
  hostcb.barrier_wait(all_processes=True)
  assert seen == [1]
  f(2)
  hostcb.barrier_wait("named", all_processes=True)
  assert seen == [1, 2]


def test_all_processes_barrier_without_jax_distributed_is_an_error(monkeypatch):
  import jax

  monkeypatch.setattr(jax, "process_count", lambda: 2)
  with pytest.raises(
    RuntimeError,
    match=(
      r"this program has 2 processes but jax.distributed.initialize\(\) was "
      r"not called"
    ),
  ):
    hostcb._engine.distributed.wait_for_all_processes("x")


def test_process_barrier_needs_jax_distributed():
  assert jax_internals.wait_at_process_barrier("unused", 1000) is False


@pytest.mark.parametrize("bad", [0, -1, float("inf"), "soon", None])
def test_barrier_timeout_must_be_positive(bad):
  with pytest.raises(ValueError, match="must be a positive, finite number"):
    hostcb.set_barrier_timeout(bad)


def test_barrier_timeout_can_be_changed():
  old = hostcb.get_barrier_timeout()
  try:
    hostcb.set_barrier_timeout(12.5)
    assert hostcb.get_barrier_timeout() == 12.5
  finally:
    hostcb.set_barrier_timeout(old)


def test_example_uses_the_installed_hostcb_not_the_checkouts_unbuilt_src():
  # Run from a clone, the example's workers import the hostcb this Python
  # has installed (with its engine): no "install a C++ compiler" warning.
  example = os.path.join(os.path.dirname(HERE), "examples", "multiprocess.py")
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env.pop("PYTHONPATH", None)
  proc = subprocess.run(
    [sys.executable, example, "--timeout", "90"],
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
    cwd=os.path.dirname(HERE),
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "native engine is not available" not in proc.stdout + proc.stderr
