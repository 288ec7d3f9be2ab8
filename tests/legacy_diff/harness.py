"""Starts the runner under one environment and collects its records.

:func:`run_suite` runs ``runner.py`` in a fresh interpreter with 2 CPU
devices.  If the interpreter dies (a crash) or stops answering (a hang) in a
scenario, that scenario is recorded as ``CRASHED``/``HUNG`` and a new
interpreter goes on after it, so one bad scenario costs one restart, not the
suite.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SRC = os.path.join(REPO, "src")
#: The oracle's interpreter; ``HOSTCB_LEGACY_PYTHON`` points elsewhere.
LEGACY_PYTHON = os.environ.get(
    "HOSTCB_LEGACY_PYTHON", os.path.join(REPO, ".venv-legacy", "bin", "python"))

#: Seconds one interpreter may spend on one scenario before it counts as hung.
SCENARIO_TIMEOUT = 60


def env_for(impl: str) -> dict:
  """The environment of a runner: 2 CPU devices, hostcb from ``src``."""
  env = dict(os.environ)
  env.pop("PYTHONPATH", None)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if not f.startswith("--xla_force_host_platform_device_count")]
  env["XLA_FLAGS"] = " ".join(
      flags + ["--xla_force_host_platform_device_count=2"])
  env["JAX_PLATFORMS"] = "cpu"
  env["HOSTCB_NO_IMPORT_HOOK"] = "1"
  if impl.startswith("hostcb"):
    env["PYTHONPATH"] = SRC
  return env


def legacy_problem() -> str | None:
  """Why the legacy oracle cannot run here, or None when it can."""
  if not os.path.exists(LEGACY_PYTHON):
    return (f"legacy JAX oracle missing: {LEGACY_PYTHON} does not exist "
            "(`make .venv-legacy` creates it; it needs python3.11 and "
            "jax==0.4.30, jaxlib==0.4.30, numpy<2 from PyPI)")
  probe = subprocess.run(
      [LEGACY_PYTHON, "-c",
       "import jax; from jax.experimental import host_callback; "
       "print(jax.__version__)"],
      capture_output=True, text=True, env=env_for("legacy"), timeout=120)
  if probe.returncode != 0 or probe.stdout.strip() != "0.4.30":
    return ("legacy JAX oracle unusable: " + LEGACY_PYTHON +
            " cannot import jax 0.4.30 with jax.experimental.host_callback: "
            + (probe.stderr.strip().splitlines() or [probe.stdout])[-1])
  return None


def start(python: str, impl: str, cases: str | None, out: str,
          start_after: str | None = None) -> subprocess.Popen:
  """Starts one runner interpreter writing JSON lines to ``out``."""
  cmd = [python, os.path.join(HERE, "runner.py"), impl, out]
  if cases:
    cmd += ["--cases", cases]
  if start_after:
    cmd += ["--start-after", start_after]
  with open(out + ".stderr", "w") as err:
    return subprocess.Popen(cmd, env=env_for(impl), stdout=subprocess.DEVNULL,
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


def run_suites(jobs: list[tuple[str, str]], cases: str | None) -> list[dict]:
  """Runs each ``(python, impl)`` concurrently; returns name -> output dicts.

  A scenario whose interpreter died reads ``CRASHED (...)``, one that hung
  ``HUNG``; the next interpreter starts after it.
  """
  tmp = tempfile.mkdtemp(prefix="hostcb-diff-")
  outs = [os.path.join(tmp, f"{i}-{impl}.jsonl")
          for i, (_, impl) in enumerate(jobs)]
  procs = [start(py, impl, cases, out) for (py, impl), out in zip(jobs, outs)]
  results: list[dict] = [{} for _ in jobs]
  progress = [(None, time.monotonic()) for _ in jobs]
  while any(p is not None for p in procs):
    time.sleep(0.05)
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
        raise RuntimeError(f"runner {jobs[i][1]} failed (rc={rc}):\n{err}")
      results[i][started] = ("HUNG" if hung else
                             f"CRASHED (rc={rc})\n" + err[-2000:])
      os.remove(outs[i])
      procs[i] = start(jobs[i][0], jobs[i][1], cases, outs[i],
                       start_after=started)
      progress[i] = (None, time.monotonic())
  return results
