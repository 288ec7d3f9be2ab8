"""Starts the runner under one environment and collects its records.

:func:`run_suite` runs ``runner.py`` in a fresh interpreter with 2 CPU
devices.  If the interpreter dies (a crash) or stops answering (a hang) in a
scenario, that scenario is recorded as ``CRASHED``/``HUNG`` and a new
interpreter goes on after it, so one bad scenario costs one restart, not the
suite.
"""

from __future__ import annotations

import os
import subprocess
import tempfile

import _diff_runs

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SRC = os.path.join(REPO, "src")
#: The oracle's interpreter; ``HOSTCB_LEGACY_PYTHON`` points elsewhere.
LEGACY_PYTHON = os.environ.get(
  "HOSTCB_LEGACY_PYTHON", os.path.join(REPO, ".venv-legacy", "bin", "python")
)

#: Seconds one interpreter may spend on one scenario before it counts as hung.
SCENARIO_TIMEOUT = 60


def env_for(impl: str) -> dict:
  """The environment of a runner: 2 CPU devices, hostcb from ``src``."""
  env = dict(os.environ)
  env.pop("PYTHONPATH", None)
  flags = [
    f
    for f in env.get("XLA_FLAGS", "").split()
    if not f.startswith("--xla_force_host_platform_device_count")
  ]
  env["XLA_FLAGS"] = " ".join(
    flags + ["--xla_force_host_platform_device_count=2"]
  )
  env["JAX_PLATFORMS"] = "cpu"
  env["HOSTCB_NO_IMPORT_HOOK"] = "1"
  if impl.startswith("hostcb"):
    env["PYTHONPATH"] = SRC
  return env


def legacy_problem() -> str | None:
  """Why the legacy oracle cannot run here, or None when it can."""
  if not os.path.exists(LEGACY_PYTHON):
    return (
      f"legacy JAX oracle missing: {LEGACY_PYTHON} does not exist "
      "(`make .venv-legacy` creates it; it needs python3.11 and "
      "jax==0.4.30, jaxlib==0.4.30, numpy<2 from PyPI)"
    )
  probe = subprocess.run(
    [
      LEGACY_PYTHON,
      "-c",
      "import jax; from jax.experimental import host_callback; "
      "print(jax.__version__)",
    ],
    capture_output=True,
    text=True,
    env=env_for("legacy"),
    timeout=120,
  )
  if probe.returncode != 0 or probe.stdout.strip() != "0.4.30":
    return (
      "legacy JAX oracle unusable: "
      + LEGACY_PYTHON
      + " cannot import jax 0.4.30 with jax.experimental.host_callback: "
      + (probe.stderr.strip().splitlines() or [probe.stdout])[-1]
    )
  return None


def start(
  python: str,
  impl: str,
  cases: str | None,
  out: str,
  start_after: str | None = None,
) -> subprocess.Popen:
  """Starts one runner interpreter writing JSON lines to ``out``."""
  cmd = [python, os.path.join(HERE, "runner.py"), impl, out]
  if cases:
    cmd += ["--cases", cases]
  if start_after:
    cmd += ["--start-after", start_after]
  with open(out + ".stderr", "w") as err:
    return subprocess.Popen(
      cmd, env=env_for(impl), stdout=subprocess.DEVNULL, stderr=err
    )


#: Seconds the whole run may take (each wait has a deadline).
SUITE_TIMEOUT = 900


def run_suites(jobs: list[tuple[str, str]], cases: str | None) -> list[dict]:
  """Runs each ``(python, impl)`` concurrently; returns name -> output dicts.

  A scenario whose interpreter died reads ``CRASHED (...)``, one that hung
  ``HUNG``; the next interpreter starts after it.
  """
  tmp = tempfile.mkdtemp(prefix="hostcb-diff-")
  outs = [
    os.path.join(tmp, f"{i}-{impl}.jsonl") for i, (_, impl) in enumerate(jobs)
  ]
  return _diff_runs.supervise(
    lambda i, start_after: start(
      jobs[i][0], jobs[i][1], cases, outs[i], start_after=start_after
    ),
    outs,
    [impl for _, impl in jobs],
    SCENARIO_TIMEOUT,
    SUITE_TIMEOUT,
  )
