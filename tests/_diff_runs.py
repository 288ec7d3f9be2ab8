"""Supervises the runner interpreters of the differential harnesses
(``legacy_diff``, ``jax_diff``).

A runner writes one JSON line ``{"start": name}`` before a scenario and one
``{"name": ..., "output": ...}`` after it.  :func:`supervise` polls the
runners' files: a runner that died (a crash) or made no progress for
``scenario_timeout`` seconds in one scenario (a hang) gets that scenario
recorded as ``CRASHED``/``HUNG``, and a new interpreter goes on after it, so
one bad scenario costs one restart, not the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Callable

# start(i, start_after): starts runner i again, after scenario start_after
# (None: from the first), writing to its output file.
Starter = Callable[[int, "str | None"], subprocess.Popen]


def read_records(out: str) -> tuple[dict, str | None]:
  """The finished scenarios of a runner's file (``{name: output}``), and
  the scenario it started and has not finished, if any."""
  records, started = {}, None
  if not os.path.exists(out):
    return records, started
  with open(out) as f:
    for line in f:
      if not line.endswith("\n"):  # being written
        break
      rec = json.loads(line)
      if "start" in rec:
        started = rec["start"]
      else:
        records[rec["name"]] = rec["output"]
        started = None
  return records, started


def supervise(
  start: Starter,
  outs: list[str],
  names: list[str],
  scenario_timeout: float,
  suite_timeout: float,
) -> list[dict]:
  """Runs runner ``i`` (``names[i]``, writing to ``outs[i]``) to the end of
  its scenarios, all concurrently; returns one ``{name: output}`` per
  runner.  Raises ``TimeoutError`` past ``suite_timeout`` seconds (killing
  the runners), and ``RuntimeError`` if a runner dies outside any
  scenario."""
  procs = [start(i, None) for i in range(len(outs))]
  results: list[dict] = [{} for _ in outs]
  progress = [(None, time.monotonic()) for _ in outs]
  deadline = time.monotonic() + suite_timeout
  while any(p is not None for p in procs):
    if time.monotonic() > deadline:
      for p in procs:
        if p is not None:
          p.kill()
          p.wait()
      raise TimeoutError(f"the runners took over {suite_timeout}s: {outs}")
    time.sleep(0.05)  # polling the runners' files, not synchronization
    for i, p in enumerate(procs):
      if p is None:
        continue
      records, started = read_records(outs[i])
      if started != progress[i][0]:
        progress[i] = (started, time.monotonic())
      rc = p.poll()
      hung = (
        started is not None
        and time.monotonic() - progress[i][1] > scenario_timeout
      )
      if rc is None and not hung:
        continue
      if hung:
        p.kill()
        p.wait()
      with open(outs[i] + ".stderr") as f:
        err = f.read()
      results[i].update(records)
      if started is None and rc == 0:
        procs[i] = None
        continue
      if started is None:  # died outside any scenario
        raise RuntimeError(f"runner {names[i]} failed (rc={rc}):\n{err}")
      results[i][started] = (
        "HUNG" if hung else f"CRASHED (rc={rc})\n" + err[-2000:]
      )
      os.remove(outs[i])
      procs[i] = start(i, started)
      progress[i] = (None, time.monotonic())
  return results
