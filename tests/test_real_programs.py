"""Real programs on hostcb, run as their users run them.

Each program of ``examples/real_programs/`` is run in its own interpreter
three ways: as written, with JAX's own callbacks (the reference); with
``hostcb run --jax-callbacks`` (``hostcb.install(jax_callbacks=True)``: the
same code on hostcb's callbacks); and with ``--hostcb``, where it calls
hostcb's functions itself.  Everything it prints must be the same (the
values are printed in full precision: a callback never changes them),
except the first lines, starting with ``#``, which say whose callbacks ran.

``runtime_checks.py`` raises from its callbacks; there, what reaches the
program is compared with JAX's and with what hostcb's documentation says.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from _helpers import REPO, hostcb_root

PROGRAMS = os.path.join(REPO, "examples", "real_programs")
TIMEOUT = 240  # seconds, for one run of one program

# How a variant runs a script: the command line before its arguments.
VARIANTS = {
  "jax": lambda script: [sys.executable, script],
  "installed": lambda script: [
    sys.executable,
    "-m",
    "hostcb",
    "run",
    "--jax-callbacks",
    script,
  ],
  "hostcb": lambda script: [sys.executable, script, "--hostcb"],
}
MODES = {"default": "", "strict": "1"}  # HOSTCB_STRICT_BARRIER

_runs: dict[tuple[str, str, str], str] = {}


def run(program: str, variant: str, mode: str = "default") -> str:
  """What ``program`` printed in ``variant`` (once per process)."""
  key = (program, variant, mode)
  if key not in _runs:
    env = dict(os.environ)
    env["PYTHONPATH"] = hostcb_root()
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.pop("HOSTCB_FAST_DISPATCH", None)
    env["HOSTCB_STRICT_BARRIER"] = MODES[mode]
    script = os.path.join(PROGRAMS, program + ".py")
    proc = subprocess.run(
      VARIANTS[variant](script),
      env=env,
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=TIMEOUT,
    )
    assert proc.returncode == 0, (
      f"{program} ({variant}, {mode}) exited with {proc.returncode}:\n"
      f"{proc.stdout}\n{proc.stderr[-3000:]}"
    )
    _runs[key] = proc.stdout
  return _runs[key]


def split(output: str) -> tuple[list[str], list[str]]:
  """(the ``#`` lines, the other lines)."""
  lines = output.splitlines()
  return (
    [line for line in lines if line.startswith("#")],
    [line for line in lines if not line.startswith("#")],
  )


# ------------------------------------------------------ the four programs
# program -> (marks of its default-mode rows, of its multi-device rows)
PROGRAM_ROWS = {
  # a jitted training step that donates its state (params, velocity,
  # step) and jax.debug.prints the loss of every step
  "training_loop": [],
  # a lax.scan under vmap reporting every step to a progress bar
  "progress_bar": [],
  # a random-walk Metropolis sampler: pmap over the devices, vmap over
  # chains, a monitor called by every device every step
  "sampler": [pytest.mark.multidevice],
  # RK4 in a fori_loop, an ordered io_callback meter in a lax.cond
  "ode": [],
}


def _program_rows():
  for program, marks in PROGRAM_ROWS.items():
    for variant in ("installed", "hostcb"):
      for mode in ("default", "strict"):
        if mode == "strict" and program != "training_loop":
          continue  # the strict mode is the matrix's
        yield pytest.param(
          program, variant, mode, marks=marks, id=f"{program}-{variant}-{mode}"
        )


@pytest.mark.parametrize("program, variant, mode", list(_program_rows()))
def test_program_prints_what_it_prints_with_jax_callbacks(
  program, variant, mode
):
  theirs_header, theirs = split(run(program, "jax"))
  ours_header, ours = split(run(program, variant, mode))
  assert all("jax._src" in line for line in theirs_header), theirs_header
  assert ours_header and all("hostcb" in line for line in ours_header), (
    ours_header
  )
  assert len(theirs) >= 4
  assert ours == theirs


def test_the_training_loop_donates_and_learns():
  """The reference itself: JAX deletes the donated state, the loss falls,
  and every step printed its loss once, in order."""
  _, lines = split(run("training_loop", "jax"))
  steps = [line for line in lines if line.startswith("step ")]
  assert [line.split()[1] for line in steps] == [str(i) for i in range(25)]
  assert float(steps[-1].split()[-1]) < float(steps[0].split()[-1]) / 5
  assert "donated state deleted: True" in lines


def test_the_progress_bar_advances_once_per_step():
  """The reference: the step index is not batched, so JAX's callback runs
  once per step whatever the number of walkers."""
  _, lines = split(run("progress_bar", "jax"))
  assert lines[:2] == ["[#.........] 50/500", "[##........] 100/500"]
  assert lines[9] == "[##########] 500/500"
  assert "steps reported: 500" in lines


@pytest.mark.multidevice
def test_the_sampler_monitor_hears_every_device_every_step():
  import jax

  _, lines = split(run("sampler", "jax"))
  n = jax.device_count()
  assert lines[0] == f"monitor reports: {200 * n} for {n} devices"


# --------------------------------------------------------- runtime checks
_MESSAGE = "'ValueError: x has 1 non-finite value(s)'"
_RAISED_AT_BARRIER = (
  f"raised CallbackException carrying {_MESSAGE}, "
  "caused by ValueError: x has 1 non-finite value(s)"
)


def _blocks(output: str) -> dict[str, list[str]]:
  """The report of each mechanism: its lines, without its name."""
  found: dict[str, list[str]] = {}
  for line in split(output)[1]:
    name, rest = line.split(" ", 1)
    found.setdefault(name, []).append(rest)
  return found


def _documented(mechanism: str, jax_report: dict, mode: str) -> list[str]:
  """What hostcb's documentation says the program sees."""
  # docs/jax_callbacks.md: in the default mode a computation that fails on
  # jit's C++ fast path raises the ValueError that JAX's fast path raises
  # (JAX's pure_callback too), where JAX's io_callback, which never takes
  # that path, raises JaxRuntimeError; same message.
  fast_type = "ValueError" if mode == "default" else "JaxRuntimeError"
  if mechanism == "pure_callback":
    return jax_report[mechanism]
  if mechanism == "io_callback":
    # "a failing callback fails its computation ... and
    # jax.effects_barrier() does not raise it again"
    return [
      line.replace("raised JaxRuntimeError", f"raised {fast_type}")
      for line in jax_report[mechanism]
    ]
  good = ["good: returned [2.0, 4.0]"]
  again = ["good again: returned [2.0, 4.0]"]
  if mechanism == "debug.callback":
    # "The first host read of a result on that device after it ... or else
    # the first barrier ... raises it as jax.errors.JaxRuntimeError with
    # JAX's words": np.asarray of an array on the CPU is no such read (it
    # "does not raise it"), so the barrier does.
    return (
      good
      + [
        "good: jax.effects_barrier returned",
        "bad: returned [2.0, inf]",
        f"bad: jax.effects_barrier raised JaxRuntimeError carrying {_MESSAGE}",
      ]
      + again
      + ["good again: jax.effects_barrier returned"]
    )
  if mechanism == "call":
    # "Python exception (jax.errors.JaxRuntimeError under jit, carrying
    # hostcb's message), also raised by barrier_wait; next computation
    # works"
    return (
      good
      + [
        "good: hostcb.barrier_wait returned",
        f"bad: raised {fast_type} carrying {_MESSAGE}",
        f"bad: hostcb.barrier_wait {_RAISED_AT_BARRIER}",
      ]
      + again
      + ["good again: hostcb.barrier_wait returned"]
    )
  assert mechanism == "id_tap"
  # "tap exception: logged, computation goes on, raised by barrier_wait"
  return (
    good
    + [
      "good: hostcb.barrier_wait returned",
      "bad: returned [2.0, inf]",
      f"bad: hostcb.barrier_wait {_RAISED_AT_BARRIER}",
    ]
    + again
    + ["good again: hostcb.barrier_wait returned"]
  )


def _check_rows():
  for variant, mechanisms in (
    ("installed", ("io_callback", "pure_callback", "debug.callback")),
    (
      "hostcb",
      ("io_callback", "pure_callback", "debug.callback", "call", "id_tap"),
    ),
  ):
    for mode in MODES:
      for mechanism in mechanisms:
        yield pytest.param(
          variant, mode, mechanism, id=f"{variant}-{mode}-{mechanism}"
        )


def test_jax_reports_a_failed_check_at_the_call_site():
  """The reference: JAX's three callbacks fail the computation (the call
  raises); the next one works and no barrier raises."""
  report = _blocks(run("runtime_checks", "jax"))
  assert set(report) == {"io_callback", "pure_callback", "debug.callback"}
  for lines in report.values():
    assert lines[0] == "good: returned [2.0, 4.0]"
    assert lines[2].startswith("bad: raised ") and _MESSAGE in lines[2]
    assert lines[4] == "good again: returned [2.0, 4.0]"
    assert all(
      line.endswith("jax.effects_barrier returned") for line in lines[1::2]
    )


@pytest.mark.parametrize("variant, mode, mechanism", list(_check_rows()))
def test_a_failed_check_reaches_the_program_as_documented(
  variant, mode, mechanism
):
  jax_report = _blocks(run("runtime_checks", "jax"))
  ours = _blocks(run("runtime_checks", variant, mode))
  assert ours[mechanism] == _documented(mechanism, jax_report, mode)
