"""hostcb inside the programs that users have: combinations of what
tests/test_feature_matrix.py, tests/test_real_programs.py,
tests/test_compilation_cache.py and tests/test_export.py check one by one.

Each program runs in a fresh interpreter (tests/user_program_worker.py)
and prints what it computed and what its callbacks printed; the test
compares that with the same program without a tap or with JAX's own
callbacks, line for line, and checks that nothing was written to stderr.
Every run is bounded (``TIMEOUT``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcb
from _helpers import REPO, hostcb_root, run_python
from hostcb._jax_internals.versions import jax_at_least

WORKER = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "user_program_worker.py"
)
TIMEOUT = 240  # seconds, for one run of one program


def _run(*args: str, devices: int = 1, cache: str = "") -> tuple[list, str]:
  """(stdout lines, stderr) of ``user_program_worker.py ARGS``."""
  env = dict(os.environ)
  env["PYTHONPATH"] = hostcb_root() + os.pathsep + os.path.dirname(WORKER)
  env["JAX_PLATFORMS"] = "cpu"
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env["HOSTCB_USER_CACHE"] = cache
  env.pop("HOSTCB_STRICT_BARRIER", None)
  proc = subprocess.run(
    [sys.executable, WORKER, *args],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=TIMEOUT,
  )
  assert proc.returncode == 0, (args, proc.stdout[-3000:], proc.stderr[-3000:])
  return proc.stdout.splitlines(), proc.stderr


# ------------------------------------------------------------ uninstall
@pytest.mark.parametrize(
  "entry, text",
  [
    ("jax.debug.print", "{}.0"),  # as JAX's prints a float32 scalar
    ("hostcb.id_print", "{}."),  # as legacy's (NumPy's str of the array)
  ],
)
def test_prints_dispatched_before_uninstall_all_appear_at_exit(entry, text):
  """``install``, twenty prints dispatched, ``uninstall()``, exit: no
  barrier anywhere; every print appears, in order."""
  lines, err = _run("uninstall_then_exit", entry)
  assert lines == ["x=" + text.format(i) for i in range(20)]
  assert err == ""


def test_a_function_traced_while_installed_prints_with_jax_after_uninstall():
  """A jitted function traced under ``install(jax_callbacks=True)`` and
  called after ``uninstall()`` is traced again: JAX's own print, which
  ``jax.effects_barrier()`` (JAX's again) waits for."""
  lines, err = _run("retrace_after_uninstall")
  assert lines == [
    "x=1.0",
    "installed True",
    "x=2.0",
    "after barrier",
    "installed False",
    "x=3.0",
    "after barrier",
    "traces 2",
  ]
  assert err == ""


def test_a_jitted_tap_called_after_uninstall_prints_at_exit():
  """The jitted function keeps its tap after ``uninstall()``, whose first
  record installs the exit handler again: its print appears although the
  program ends without a barrier."""
  lines, err = _run("call_after_uninstall_then_exit")
  assert lines == ["x=1.", "x=2."]
  assert err == ""


def test_a_compiled_tap_called_after_uninstall_prints_at_exit():
  """A compiled object keeps its taps after ``uninstall()``; its first tap
  after it installs the exit handler again: every print appears although
  the program ends without a barrier."""
  lines, err = _run("aot_after_uninstall_then_exit")
  assert lines == [f"x={i}." for i in range(20)]
  assert err == ""


def test_a_failing_hook_on_a_devices_first_record_still_starts_its_consumer():
  """Fault injection: the hook that installs the exit handler at a
  device's first record raises; it is logged with its traceback, and the
  device's taps run all the same."""
  proc = run_python(
    "import jax, hostcb\n"
    "from hostcb._engine import native\n"
    "def broken():\n"
    "  raise OSError('injected failure')\n"
    "native.on_first_record.insert(0, broken)\n"
    "jax.jit(lambda x: hostcb.id_print(x))(1)\n"
    "hostcb.barrier_wait()\n"
    "print('done')\n",
    env_extra={"XLA_FLAGS": "--xla_force_host_platform_device_count=1"},
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == "1\ndone\n"
  assert "hostcb: a hook on the first record of a device failed" in (
    proc.stderr
  )
  assert "OSError: injected failure" in proc.stderr


# ------------------------------------------------------- export
def test_an_exported_training_loop_runs_in_a_fresh_process_and_prints_all(
  tmp_path,
):
  """A donated Adam loop that taps by name and prints, exported; a fresh
  process runs the artifact three times, the last without a barrier
  before it ends: every tap and print of the three runs appears, with the
  exporting process's values."""
  pytest.importorskip(
    "flatbuffers", reason="flatbuffers is not installed (hostcb[export])"
  )
  path = str(tmp_path / "train.jax")
  here, err = _run("export_training", path)
  assert err == ""
  steps = here[:-1]  # taps and prints of the 4 steps, then the losses
  assert len(steps) == 8 and here[-1].startswith("losses ")
  there, err = _run("run_exported", path)
  assert err == ""
  losses = here[-1][len("losses ") :]
  # Within a run, the two host functions' lines interleave as their
  # consumer runs them: in step order.
  assert (
    there
    == steps
    + [f"losses {losses} donated True"]
    + steps
    + [f"losses {losses} donated True"]
    + steps
  )


def test_a_serialized_training_loop_prints_all_in_a_fresh_process(tmp_path):
  """The donated loop, compiled and serialized; a fresh process loads it,
  runs it twice and ends without a barrier: every tap and print of both
  runs appears, with the compiling process's values."""
  path = str(tmp_path / "train.pkl")
  here, err = _run("serialize_training", path)
  assert err == ""
  steps = here[:-1]
  assert len(steps) == 8 and here[-1].startswith("losses ")
  there, err = _run("run_serialized", path)
  assert err == ""
  assert there == steps + steps


# ------------------------------------------- AOT, mesh and the cache
DEVICES = int(os.environ.get("HOSTCB_TEST_DEVICES", "4"))
_HIT = "cache: Persistent compilation cache hit for 'jit_train'"
_NOT_WRITTEN = "cache: Not writing persistent cache entry for 'jit_train'"
_reference: dict[int, list] = {}


def _untapped(devices: int) -> list:
  """The loop's own output, without a tap (once per device count)."""
  if devices not in _reference:
    _reference[devices], err = _run("aot_training", "none", devices=devices)
    assert err == ""
  return [line for line in _reference[devices] if not line.startswith("cache")]


def _expected_taps(tap: str, results: list, devices: int) -> list:
  """What the tap prints for the losses of ``results`` (sorted)."""
  lines = []
  losses = [
    float(v)
    for line in results
    if line.startswith("losses ")
    for v in line.split("[")[1].split("]")[0].split(", ")
  ]
  for k, loss in enumerate(losses):
    text = f"step {float(k + 1)} loss {np.float32(loss):.6f}"
    if tap == "debug.print":
      lines.append("print " + text)
    elif tap == "id_tap":
      lines.append("tap " + text)
    else:
      lines += [f"tap {text} device {d}" for d in range(devices)]
  return sorted(lines)


def _cache_rows():
  for tap in ("id_tap", "debug.print"):
    yield pytest.param(tap, 1, id=f"{tap}-1-device")
  for tap in ("id_tap_partitioned", "debug.print"):
    yield pytest.param(
      tap, DEVICES, marks=pytest.mark.multidevice, id=f"{tap}-mesh"
    )


@pytest.mark.parametrize("tap, devices", list(_cache_rows()))
def test_an_aot_training_loop_taps_alike_from_the_persistent_cache(
  tap, devices, tmp_path
):
  """An Adam loop over a mesh, state donated, metrics tapped in its scan,
  compiled ahead of time (``cost_analysis``, ``as_text``) and called
  twice, in two fresh processes sharing JAX's persistent cache: the
  second loads the executable where JAX writes it; in both, the values
  are those without a tap, every step is tapped once (per device for a
  per-shard tap) with its loss, and stderr stays empty."""
  want = _untapped(devices)
  for run in ("compiles", "from the cache"):
    lines, err = _run("aot_training", tap, devices=devices, cache=str(tmp_path))
    assert err == "", run
    cache = [line for line in lines if line.startswith("cache")]
    results = [line for line in lines if line.startswith(("losses ", "w "))]
    taps = sorted(line for line in lines if line.startswith(("tap ", "print ")))
    assert results == want, run
    assert all(line.endswith("donated True") for line in results[:2])
    assert len(cache) + len(results) + len(taps) == len(lines), lines
    assert taps == _expected_taps(tap, results, devices), run
    # JAX before 0.11 writes no program over several devices with XLA's
    # Python callbacks: a gathered print's (docs/partitioned.md).
    gathered = devices > 1 and tap == "debug.print"
    if gathered and not jax_at_least(0, 11):
      assert cache == [_NOT_WRITTEN], run
    elif run == "compiles":
      assert cache == [], run
    else:
      assert cache == [_HIT], run


# ------------------------------------------------- vmap and donation
def _seeded_step(tap, seen):
  """A step of a batch of independent walkers (one seed each): a noisy
  update of the state, ``tap`` reporting each walker's loss."""

  def step(state, seed):
    noise = jax.random.normal(jax.random.key(seed), state.shape)
    new = state - 0.1 * noise
    loss = jnp.sum(new**2)
    if tap == "id_tap":
      hostcb.id_tap(lambda a, t: seen.append(np.asarray(a).tolist()), loss)
    elif tap == "debug.callback":
      hostcb.debug.callback(lambda a: seen.append(float(a)), loss)
    elif tap == "io_callback":
      loss = hostcb.io_callback(
        lambda a: (seen.append(float(a)), a)[1],
        jax.ShapeDtypeStruct((), jnp.float32),
        loss,
      )
    return new, loss

  return step


def _walk(tap: str, sharded: bool):
  """Two donated steps of 8 walkers; per step (losses, donated state
  deleted), and what the tap saw."""
  seen: list = []
  f = jax.jit(jax.vmap(_seeded_step(tap, seen)), donate_argnums=0)
  state = jnp.arange(24, dtype=jnp.float32).reshape(8, 3)
  seeds = jnp.arange(8)
  if sharded:
    rows = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), P("d"))
    state, seeds = jax.device_put(state, rows), jax.device_put(seeds, rows)
  got = []
  for i in range(2):
    old = state
    state, loss = f(state, seeds + i)
    got.append((np.asarray(loss).tolist(), old.is_deleted()))
  hostcb.barrier_wait()
  return got, seen


def _vmap_rows():
  for tap in ("id_tap", "debug.callback", "io_callback"):
    yield pytest.param(tap, False, id=f"{tap}-one-device")
    yield pytest.param(
      tap, True, marks=pytest.mark.multidevice, id=f"{tap}-sharded"
    )


@pytest.mark.parametrize("tap, sharded", list(_vmap_rows()))
def test_a_vmapped_tapped_step_donates_and_computes_as_untapped(tap, sharded):
  want, _ = _walk("none", sharded)
  assert [deleted for _, deleted in want] == [True, True]
  got, seen = _walk(tap, sharded)
  assert got == want
  losses = [loss for step, _ in want for loss in step]
  if tap == "id_tap":  # one tap of the batch per step
    assert seen == [step for step, _ in want]
  else:  # JAX's callbacks under vmap: one call per walker
    assert sorted(seen) == sorted(losses)


# ------------------------------------------------------ exit and waits
def _step_lines(entry: str, k: int) -> list:
  total = float(sum(range(8)) + 8 * k)
  if entry == "id_print":
    return [f"what: step {k}", f"{total:.0f}."]
  return [f"step {k} sum {total}"]


@pytest.mark.multidevice
@pytest.mark.parametrize("entry", ["id_print", "jax.debug.print"])
@pytest.mark.parametrize(
  "wait", ["none", "jax.block_until_ready", "jax.effects_barrier"]
)
def test_prints_of_a_sharded_jit_in_a_context_mesh_all_appear(entry, wait):
  """Five steps of a sharded ``jit`` under ``jax.set_mesh``, each printing
  (``jax.debug.print`` through ``install(jax_callbacks=True)``); the
  program ends with no barrier.  After ``jax.block_until_ready`` or
  ``jax.effects_barrier``, a step's print comes before the program's next
  line; with no wait at all, every print still appears once."""
  lines, err = _run("mesh_prints", entry, wait, devices=DEVICES)
  assert err == ""
  want = [
    line
    for k in range(5)
    for line in _step_lines(entry, k) + [f"dispatched {k}"]
  ]
  if wait == "none":
    assert sorted(lines) == sorted(want)
    assert [x for x in lines if x.startswith("dispatched")] == [
      f"dispatched {k}" for k in range(5)
    ]
  else:
    assert lines == want
