"""Starts one runner per implementation and collects their records.

:func:`run_suites` runs ``runner.py`` in a fresh interpreter per
implementation, all of them in this environment (its JAX, 0.10.2), with
``HOSTCB_TEST_DEVICES`` CPU devices (default 4).  If an interpreter dies (a
crash) or makes no progress for :data:`SCENARIO_TIMEOUT` seconds in one
scenario (a hang), that scenario is recorded as ``CRASHED``/``HUNG`` and a
new interpreter goes on after it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
SRC = os.path.join(os.path.dirname(TESTS), "src")
if TESTS not in sys.path:  # run as a script: python tests/jax_diff/harness.py
  sys.path.insert(0, TESTS)

import _diff_runs  # noqa: E402

#: Seconds one interpreter may spend on one scenario before it counts as hung.
SCENARIO_TIMEOUT = 60
#: Seconds the whole run may take (each wait has a deadline).
SUITE_TIMEOUT = 420


def devices() -> int:
  """The number of CPU devices the runners get."""
  return int(os.environ.get("HOSTCB_TEST_DEVICES", "4"))


def hostcb_root() -> str:
  """Where the runners import hostcb from: where this interpreter finds
  it (under ``make test``, the installed hostcb, with its native engine:
  the runners must test the engine that users get), else ``src`` (hostcb's
  Python back end alone, without the engine)."""
  spec = importlib.util.find_spec("hostcb")
  if spec is None or spec.origin is None:
    return SRC
  return os.path.dirname(os.path.dirname(spec.origin))


def env() -> dict:
  """A runner's environment: CPU devices, hostcb as :func:`hostcb_root`
  finds it, no hooks."""
  e = dict(os.environ)
  flags = [
    f
    for f in e.get("XLA_FLAGS", "").split()
    if not f.startswith("--xla_force_host_platform_device_count")
  ]
  e["XLA_FLAGS"] = " ".join(
    flags + [f"--xla_force_host_platform_device_count={devices()}"]
  )
  e["JAX_PLATFORMS"] = "cpu"
  e["HOSTCB_NO_IMPORT_HOOK"] = "1"
  e["PYTHONPATH"] = hostcb_root()
  return e


#: The implementation that is hostcb called directly on its Python back end
#: alone (the engine off: ``HOSTCB_DISABLE_NATIVE``), which serves GPUs and
#: what the native engine cannot carry.
PYTHON_BACK_END = "hostcb-python"


def _start(
  impl: str, out: str, start_after: str | None, only: str | None
) -> subprocess.Popen:
  e = env()
  if impl == PYTHON_BACK_END:
    impl = "hostcb"
    e["HOSTCB_DISABLE_NATIVE"] = "1"
  cmd = [sys.executable, os.path.join(HERE, "runner.py"), impl, out]
  if start_after:
    cmd += ["--start-after", start_after]
  if only:
    cmd += ["--only", only]
  with open(out + ".stderr", "a") as err:
    return subprocess.Popen(cmd, env=e, stdout=subprocess.DEVNULL, stderr=err)


def run_suites(impls: list[str], only: str | None = None) -> list[dict]:
  """Runs the scenarios under each implementation, concurrently; returns
  one ``{name: output}`` per implementation.  A scenario whose interpreter
  died reads ``CRASHED (...)``, one that hung ``HUNG``."""
  tmp = tempfile.mkdtemp(prefix="hostcb-jax-diff-")
  outs = [os.path.join(tmp, f"{impl}.jsonl") for impl in impls]
  return _diff_runs.supervise(
    lambda i, start_after: _start(impls[i], outs[i], start_after, only),
    outs,
    impls,
    SCENARIO_TIMEOUT,
    SUITE_TIMEOUT,
  )


def main(argv: list[str]) -> int:
  """``python harness.py [IMPLS] [NAMES]``: runs the scenarios (all, or
  the comma-separated ``NAMES``) under ``IMPLS`` (default
  ``jax,hostcb``) and prints every scenario whose outputs differ."""
  import difflib
  from jax_diff import registry

  impls = (argv[0] if argv else "jax,hostcb").split(",")
  only = argv[1] if len(argv) > 1 else None
  results = run_suites(impls, only)
  for m in os.environ.get(
    "HOSTCB_JAX_DIFF_MODULES", ",".join(registry.MODULES)
  ).split(","):
    __import__(f"jax_diff.{m}")
  theirs = results[0]
  same = 0
  for name, text in theirs.items():
    sc = registry.SCENARIOS[name]
    for impl, res in zip(impls[1:], results[1:]):
      ours = res.get(name, "MISSING")
      want = sc.expect if sc.differs is not None else text
      if registry.view(ours, sc.unordered) == registry.view(want, sc.unordered):
        same += 1
        continue
      print(f"==== {name} ({impl}){' [documented]' if sc.differs else ''}")
      print(
        "\n".join(
          difflib.unified_diff(
            want.splitlines(), ours.splitlines(), "expected", impl, lineterm=""
          )
        )
      )
      if sc.differs is not None:
        print("---- jax's own output:\n" + text)
  print(f"{same} of {len(theirs) * (len(impls) - 1)} match")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
