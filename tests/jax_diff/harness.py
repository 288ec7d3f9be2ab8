"""Starts one runner per implementation and collects their records.

:func:`run_suites` runs ``runner.py`` in a fresh interpreter per
implementation, all of them in this environment (its JAX, 0.10.2), with
``HOSTCB_TEST_DEVICES`` CPU devices (default 4).  If an interpreter dies (a
crash) or makes no progress for :data:`SCENARIO_TIMEOUT` seconds in one
scenario (a hang), that scenario is recorded as ``CRASHED``/``HUNG`` and a
new interpreter goes on after it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
SRC = os.path.join(os.path.dirname(TESTS), "src")

#: Seconds one interpreter may spend on one scenario before it counts as hung.
SCENARIO_TIMEOUT = 60
#: Seconds the whole run may take (each wait has a deadline).
SUITE_TIMEOUT = 280


def devices() -> int:
  """The number of CPU devices the runners get."""
  return int(os.environ.get("HOSTCB_TEST_DEVICES", "4"))


def env() -> dict:
  """A runner's environment: CPU devices, hostcb from ``src``, no hooks."""
  e = dict(os.environ)
  flags = [f for f in e.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  e["XLA_FLAGS"] = " ".join(
      flags + [f"--xla_force_host_platform_device_count={devices()}"])
  e["JAX_PLATFORMS"] = "cpu"
  e["HOSTCB_NO_IMPORT_HOOK"] = "1"
  e["PYTHONPATH"] = SRC
  return e


def _start(impl: str, out: str, start_after: str | None,
           only: str | None) -> subprocess.Popen:
  cmd = [sys.executable, os.path.join(HERE, "runner.py"), impl, out]
  if start_after:
    cmd += ["--start-after", start_after]
  if only:
    cmd += ["--only", only]
  with open(out + ".stderr", "a") as err:
    return subprocess.Popen(cmd, env=env(), stdout=subprocess.DEVNULL,
                            stderr=err)


def _read(out: str):
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


def run_suites(impls: list[str], only: str | None = None) -> list[dict]:
  """Runs the scenarios under each implementation, concurrently; returns
  one ``{name: output}`` per implementation.  A scenario whose interpreter
  died reads ``CRASHED (...)``, one that hung ``HUNG``."""
  tmp = tempfile.mkdtemp(prefix="hostcb-jax-diff-")
  outs = [os.path.join(tmp, f"{impl}.jsonl") for impl in impls]
  procs = [_start(impl, out, None, only) for impl, out in zip(impls, outs)]
  results: list[dict] = [{} for _ in impls]
  progress = [(None, time.monotonic()) for _ in impls]
  deadline = time.monotonic() + SUITE_TIMEOUT
  while any(p is not None for p in procs):
    if time.monotonic() > deadline:
      for p in procs:
        if p is not None:
          p.kill()
          p.wait()
      raise TimeoutError(f"the runners took over {SUITE_TIMEOUT}s: {outs}")
    time.sleep(0.05)  # polling the runners' files, not synchronization
    for i, p in enumerate(procs):
      if p is None:
        continue
      records, started = _read(outs[i])
      if started != progress[i][0]:
        progress[i] = (started, time.monotonic())
      rc = p.poll()
      hung = (started is not None
              and time.monotonic() - progress[i][1] > SCENARIO_TIMEOUT)
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
        raise RuntimeError(f"runner {impls[i]} failed (rc={rc}):\n{err}")
      results[i][started] = ("HUNG" if hung else
                             f"CRASHED (rc={rc})\n" + err[-2000:])
      os.remove(outs[i])
      procs[i] = _start(impls[i], outs[i], started, only)
      progress[i] = (None, time.monotonic())
  return results


def main(argv: list[str]) -> int:
  """``python harness.py [IMPLS] [NAMES]``: runs the scenarios (all, or
  the comma-separated ``NAMES``) under ``IMPLS`` (default
  ``jax,hostcb``) and prints every scenario whose outputs differ."""
  import difflib
  sys.path.insert(0, TESTS)
  from jax_diff import registry
  impls = (argv[0] if argv else "jax,hostcb").split(",")
  only = argv[1] if len(argv) > 1 else None
  results = run_suites(impls, only)
  for m in os.environ.get("HOSTCB_JAX_DIFF_MODULES",
                          ",".join(registry.MODULES)).split(","):
    __import__(f"jax_diff.{m}")
  theirs = results[0]
  same = 0
  for name, text in theirs.items():
    sc = registry.SCENARIOS[name]
    for impl, res in zip(impls[1:], results[1:]):
      ours = res.get(name, "MISSING")
      want = sc.expect if sc.differs is not None else text
      if registry.view(ours, sc.unordered) == registry.view(want,
                                                            sc.unordered):
        same += 1
        continue
      print(f"==== {name} ({impl}){' [documented]' if sc.differs else ''}")
      print("\n".join(difflib.unified_diff(
          want.splitlines(), ours.splitlines(), "expected", impl,
          lineterm="")))
      if sc.differs is not None:
        print("---- jax's own output:\n" + text)
  print(f"{same} of {len(theirs) * (len(impls) - 1)} match")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
