"""hostcb.metrics across 2 processes x 2 CPU devices (``jax.distributed``
on a free loopback port, gloo collectives): one record per step for all
the devices of both processes, written by process 0 only unless a sink is
added with ``processes="each"``.

The workers (``metrics_worker.py``) write two JsonLines files each; every
wait is bounded and the processes are killed whatever happens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_multiprocess import free_port, worker_env

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "metrics_worker.py")
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """{file name: [(step, values)], or None where no file was made} of
  both workers' sinks."""
  outdir = tmp_path_factory.mktemp("metrics_multiprocess")
  port = str(free_port())
  procs = [
    subprocess.Popen(
      [sys.executable, WORKER, str(i), "2", port, str(outdir)],
      env=worker_env(),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]
  outputs = []
  try:
    for p in procs:
      try:
        outputs.append(p.communicate(timeout=TIMEOUT_S))
      except subprocess.TimeoutExpired:
        outputs.append(("", "timed out"))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait(30)
  for i, (p, (_, err)) in enumerate(zip(procs, outputs)):
    assert p.returncode == 0, f"process {i} (rc {p.returncode}):\n{err[-3000:]}"
  found = {}
  for name in ("first_0", "first_1", "each_0", "each_1"):
    path = outdir / f"{name}.jsonl"
    if not path.exists():  # a sink that wrote nothing made no file
      found[name] = None
      continue
    rows = []
    for line in path.read_text().splitlines():
      d = json.loads(line)
      d.pop("wall_time")
      rows.append((d.pop("step"), d))
    found[name] = rows
  return found


PMAP = [
  (0, {"x": 1.5}),
  (1, {"x": 11.5}),
  (2, {"x": 21.5}),
  (
    3,
    {
      "x/device_0": 0.0,
      "x/device_1": 1.0,
      "x/device_2": 2.0,
      "x/device_3": 3.0,
    },
  ),
]
SHARDED = [(4, {"mean": 3.5})]


def test_process_0_writes_one_record_per_step_for_all_devices(files):
  assert files["first_0"] == PMAP + SHARDED + [(5, {"process": 0})]


def test_process_1_writes_nothing_by_default(files):
  assert files["first_1"] is None  # not even an empty file


def test_processes_each_writes_each_process_records(files):
  # The records of computations over both processes are made once, on the
  # mesh's first device (process 0's); process 1 has only its own.
  assert files["each_0"] == PMAP + SHARDED + [(5, {"process": 0})]
  assert files["each_1"] == [(5, {"process": 1})]
