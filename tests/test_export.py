"""Host functions by name (``hostcb.register``): programs that are exported,
cached or serialized in one process and run in another (docs/export.md).

The processes are tests/export_worker.py; each writes what it computed,
the records its host functions received and the lines it printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcb
from hostcb import _engine as engine, named
from hostcb._core import by_name
from _helpers import hostcb_root

# Functions by name are the native engine's handlers (docs/export.md).
pytestmark = pytest.mark.skipif(
  not engine.available(),
  reason=f"the native engine is not built here: {engine.unavailable_reason()}",
)

_WORKER = os.path.join(
  os.path.dirname(os.path.abspath(__file__)), "export_worker.py"
)
_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")

try:
  import flatbuffers  # noqa: F401  (jax.export's serialization needs it)
except ImportError:
  _FLATBUFFERS = False
else:
  _FLATBUFFERS = True
needs_flatbuffers = pytest.mark.skipif(
  not _FLATBUFFERS,
  reason="flatbuffers is not installed (pip install "
  "hostcb[export]): jax.export cannot serialize",
)


def _worker(mode: str, directory, *args: str) -> tuple[dict, list[str]]:
  """Runs the worker in a fresh process; its JSON and printed lines."""
  env = dict(os.environ)
  env["PYTHONPATH"] = hostcb_root() + os.pathsep + os.path.dirname(_WORKER)
  env.setdefault("JAX_PLATFORMS", "cpu")
  env.pop("XLA_FLAGS", None)  # one device, as the exporting process
  proc = subprocess.run(
    [sys.executable, _WORKER, mode, str(directory), *args],
    env=env,
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.split("--- lines\n", 1)[1].splitlines()
  with open(os.path.join(directory, mode + ".json")) as f:
    return json.load(f), lines


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """The worker's programs, run and exported in a process of their own."""
  if not _FLATBUFFERS:
    pytest.skip("flatbuffers is not installed (pip install hostcb[export])")
  directory = tmp_path_factory.mktemp("export")
  return directory, *_worker("export", directory)


# ------------------------------------------------- in-process lowering
def _text(fn, *args, **kw) -> str:
  return jax.jit(fn, **kw).lower(*args).as_text()


def test_registered_tap_lowers_by_name_with_no_process_local_id():
  def logged(x, transforms):
    pass

  hostcb.register("test_export.by_name", logged)
  text = _text(lambda x: hostcb.id_tap(logged, x), jnp.ones(3))
  assert "hostcb_tap_v1" in text and 'name = "test_export.by_name"' in text
  assert "target_id" not in text


def test_unregistered_tap_keeps_its_id_lowering():
  text = _text(lambda x: hostcb.id_tap(lambda a, t: None, x), jnp.ones(3))
  assert "@hostcb_tap(" in text and "target_id" in text
  assert "hostcb_tap_v1" not in text


def test_every_entry_point_lowers_a_registered_function_by_name():
  S = jax.ShapeDtypeStruct((3,), jnp.float32)
  f = hostcb.register(
    "test_export.every", lambda *a, **k: np.ones(3, np.float32)
  )

  def program(x):
    x = hostcb.id_tap(f, x)
    x = hostcb.call(f, x, result_shape=S)
    hostcb.debug.callback(f, x)
    x = hostcb.io_callback(f, S, x)
    x = hostcb.pure_callback(f, S, x)
    return hostcb.id_print(x)

  text = _text(program, jnp.ones(3))
  assert text.count("@hostcb_tap_v1(") == 3  # id_tap, debug.callback, id_print
  assert text.count("@hostcb_call_v1(") == 3  # call, io_ and pure_callback
  assert text.count('name = "test_export.every"') == 5
  assert text.count('name = ""') == 1  # id_print needs no registration
  assert "target_id" not in text


def test_register_works_as_a_decorator_and_returns_the_function():
  @hostcb.register("test_export.decorated")
  def fn(x):
    return x

  assert named.registered()["test_export.decorated"] is fn
  assert hostcb.register("test_export.plain", fn) is fn


def test_a_function_under_several_names_lowers_under_the_name_registered_last():
  def logged(x, transforms):
    pass

  for name in ("test_export.a", "test_export.b", "test_export.a"):
    hostcb.register(name, logged)
  text = _text(lambda x: hostcb.id_tap(logged, x), jnp.ones(3))
  assert 'name = "test_export.a"' in text
  assert 'name = "test_export.b"' not in text


def test_register_refuses_a_name_that_is_not_a_string():
  with pytest.raises(TypeError, match="non-empty str"):
    hostcb.register(3, print)
  with pytest.raises(TypeError, match="must be callable"):
    hostcb.register("test_export.not_callable", 3)


def test_registering_a_name_again_rebinds_it_for_compiled_programs():
  seen = []
  first = hostcb.register("test_export.rebound", lambda x: np.float32(x + 1))
  f = jax.jit(lambda x: hostcb.call(first, x, result_shape=x))
  assert float(f(np.float32(1))) == 2.0
  hostcb.register(
    "test_export.rebound", lambda x: seen.append(1) or np.float32(x + 100)
  )
  assert float(f(np.float32(1))) == 101.0  # the same executable, rebound
  assert seen == [1]


def test_registering_a_tap_name_again_sends_later_taps_to_the_new_function():
  first, second = [], []
  tap = hostcb.register(
    "test_export.rebound_tap", lambda x, t: first.append(float(x))
  )
  f = jax.jit(lambda x: hostcb.id_tap(tap, x))
  jax.block_until_ready(f(np.float32(1)))
  hostcb.barrier_wait()
  hostcb.register(
    "test_export.rebound_tap", lambda x, t: second.append(float(x))
  )
  jax.block_until_ready(f(np.float32(2)))
  hostcb.barrier_wait()
  assert (first, second) == ([1.0], [2.0])


def test_values_and_records_by_name_equal_those_by_id():
  by_id, by_name = [], []

  def make(records):
    return lambda x, t: records.append((np.asarray(x).tolist(), t))

  tap_by_id, tap_by_name = make(by_id), make(by_name)
  hostcb.register("test_export.same", tap_by_name)

  def program(tap):
    return lambda x: jnp.sum(hostcb.id_tap(tap, x * 2) ** 2)

  x = jnp.arange(4.0)
  a = jax.jit(jax.vmap(jax.grad(program(tap_by_id))))(x[None])
  b = jax.jit(jax.vmap(jax.grad(program(tap_by_name))))(x[None])
  hostcb.barrier_wait()
  np.testing.assert_array_equal(a, b)
  assert by_id == by_name and by_id


def test_a_pytree_node_that_json_cannot_hold_is_lowered_by_id_with_a_warning():
  import collections

  Pair = collections.namedtuple("Pair", "a b")
  fn = hostcb.register("test_export.namedtuple", lambda p, t: None)
  with pytest.warns(
    named.NotExportableWarning,
    match="'test_export.namedtuple' is lowered by a "
    "process-local id, not by its name, here: it needs a "
    "pytree node of type Pair",
  ):
    text = _text(lambda x: hostcb.id_tap(fn, Pair(x, x)), jnp.ones(2))
  assert "hostcb_tap_v1" not in text and "@hostcb_tap(" in text


def test_an_object_argument_of_a_registered_debug_callback_warns():
  fn = hostcb.register("test_export.object_arg", lambda x, o: None)
  with pytest.warns(
    named.NotExportableWarning,
    match="'test_export.object_arg' .* host-side arguments "
    "that are not str, numbers, bool or None",
  ):
    text = _text(lambda x: hostcb.debug.callback(fn, x, object()), jnp.ones(2))
  assert "hostcb_tap_v1" not in text


@pytest.mark.multidevice
def test_a_registered_per_shard_tap_is_lowered_by_id_with_a_warning():
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  if jax.device_count() < 2:
    pytest.skip("needs 2 or more devices (HOSTCB_TEST_DEVICES)")
  fn = hostcb.register("test_export.shard", lambda x, t: None)
  mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
  x = jax.device_put(jnp.ones(4), NamedSharding(mesh, P("d")))
  with pytest.warns(
    named.NotExportableWarning,
    match="a tap per shard in a jit over several devices",
  ):
    text = _text(lambda x: hostcb.id_tap(fn, x, partitioned=True), x)
  assert "hostcb_tap_v1" not in text


@pytest.mark.multidevice
def test_a_registered_call_in_a_jit_over_several_devices_warns():
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  if jax.device_count() < 2:
    pytest.skip("needs 2 or more devices (HOSTCB_TEST_DEVICES)")
  fn = hostcb.register("test_export.gathered", lambda x: x)
  mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
  x = jax.device_put(jnp.ones(4), NamedSharding(mesh, P("d")))
  with pytest.warns(
    named.NotExportableWarning,
    match="'test_export.gathered' .* a callback in a jit over several devices",
  ):
    text = _text(lambda x: hostcb.call(fn, x, result_shape=x), x)
  assert "hostcb_call_v1" not in text


def test_a_registered_partitioned_tap_on_one_device_goes_by_name():
  seen = []
  fn = hostcb.register(
    "test_export.one_shard",
    lambda x, t, **kw: seen.append((np.asarray(x).tolist(), kw["index"])),
  )
  f = lambda x: hostcb.id_tap(fn, x, partitioned=True, tap_with_device=True)
  assert "hostcb_tap_v1" in _text(f, jnp.ones(2))
  jax.block_until_ready(jax.jit(f)(jnp.ones(2)))
  hostcb.barrier_wait()
  assert seen == [([1.0, 1.0], (slice(None),))]


def test_tree_json_round_trips_containers():
  tree = jax.tree_util.tree_structure(
    ((1, [2, None]), {"b": 3, "a": (4,)}, [], ())
  )
  assert by_name.tree_from_json(by_name.tree_to_json(tree)) == tree


def test_export_checks_name_the_versioned_targets():
  assert {str(c) for c in hostcb.export_checks()} == {
    "custom_call:hostcb_tap_v1",
    "custom_call:hostcb_call_v1",
  }


def test_export_refuses_a_tap_by_id():
  # The program keeps its function's entry alive (JAX's keep-alive list),
  # which JAX refuses to export, as it refuses its own callbacks.
  with pytest.raises(
    NotImplementedError, match="serialization of host_callbacks"
  ):
    jax.export.export(
      jax.jit(lambda x: hostcb.id_tap(lambda a, t: None, x)),
      disabled_checks=hostcb.export_checks(),
    )(jnp.ones(2))


def _export_symbolic(fn):
  """``fn`` exported for a float32 vector of symbolic length ``n``."""
  spec = jax.ShapeDtypeStruct(jax.export.symbolic_shape("n"), jnp.float32)
  return jax.export.export(jax.jit(fn), disabled_checks=hostcb.export_checks())(
    spec
  )


def test_exporting_a_call_with_symbolic_result_shapes_fails_naming_the_limit():
  def echo(x):
    return x

  hostcb.register("test_export.echo", echo)
  with pytest.raises(NotImplementedError) as e:
    _export_symbolic(
      lambda x: hostcb.call(
        echo, x, result_shape=jax.ShapeDtypeStruct(x.shape, x.dtype)
      )
    )
  assert str(e.value) == (
    "hostcb: the results of a host call must have constant shapes; the "
    f"call of {echo!r} has results (float32[n]) with symbolic dimensions "
    "(jax.export's shape polymorphism), which hostcb does not resolve when "
    "the program runs. Give the results constant shapes (the operands may "
    "keep symbolic ones), or export with constant input shapes."
  )


def test_exporting_a_pure_callback_with_symbolic_result_shapes_fails():
  f = hostcb.register("test_export.echo_pure", lambda x: x)
  with pytest.raises(NotImplementedError, match=r"results \(float32\[n\]\)"):
    _export_symbolic(
      lambda x: hostcb.pure_callback(
        f, jax.ShapeDtypeStruct(x.shape, x.dtype), x
      )
    )


@needs_flatbuffers
def test_a_call_with_symbolic_operands_and_constant_results_exports_and_runs():
  f = hostcb.register("test_export.total", lambda x: np.float32(np.sum(x)))
  exported = _export_symbolic(
    lambda x: hostcb.pure_callback(f, jax.ShapeDtypeStruct((), jnp.float32), x)
  )
  call = jax.export.deserialize(exported.serialize()).call
  assert [float(call(jnp.arange(k, dtype=jnp.float32))) for k in (3, 5)] == [
    3.0,
    10.0,
  ]


def test_an_unregistered_call_with_symbolic_operands_gets_jaxs_export_error():
  with pytest.raises(
    NotImplementedError, match="serialization of host_callbacks"
  ):
    _export_symbolic(
      lambda x: hostcb.pure_callback(
        lambda x: np.float32(np.sum(x)),
        jax.ShapeDtypeStruct((), jnp.float32),
        x,
      )
    )


def test_an_unbound_name_fails_the_computation_naming_it():
  # A program by name whose name is not bound here (as in a process that
  # loads a program and forgot one registration).
  text = by_name.dumps(
    {
      "v": 1,
      "op": "tap",
      "fn": {"kind": "function"},
      "tree": "*",
      "with_device": False,
      "prints": False,
      "partitioned": False,
      "transforms": [],
    }
  )
  with pytest.raises(named.UnboundNameError, match="'test_export.nobody'"):
    by_name.resolve("test_export.nobody", text)


def test_multi_platform_export_lowers_both_cpu_and_cuda():
  # hostcb has both handlers; the CUDA side can only be lowered here (this
  # machine has no GPU to compile or run it).
  fn = hostcb.register("test_export.both", lambda x, t: None)
  exp = jax.export.export(
    jax.jit(lambda x: hostcb.id_tap(fn, x) * 2),
    platforms=("cpu", "cuda"),
    disabled_checks=hostcb.export_checks(),
  )(jnp.ones(3))
  assert exp.platforms == ("cpu", "cuda")
  text = exp.mlir_module()
  assert "hostcb_tap_v1" in text and 'name = "test_export.both"' in text


@pytest.mark.multidevice
@needs_flatbuffers
def test_shard_map_program_with_a_tap_by_name_round_trips_its_effect():
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  try:
    from jax import shard_map
  except ImportError:  # an older jax
    from jax.experimental.shard_map import shard_map
  if jax.device_count() < 2:
    pytest.skip("needs 2 or more devices (HOSTCB_TEST_DEVICES)")
  seen = []
  fn = hostcb.register(
    "test_export.shards", lambda x, t: seen.append(np.asarray(x).tolist())
  )
  mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
  program = shard_map(
    lambda x: hostcb.id_tap(fn, x) * 2,
    mesh=mesh,
    in_specs=P("d"),
    out_specs=P("d"),
  )
  exp = jax.export.export(
    jax.jit(program), disabled_checks=hostcb.export_checks()
  )(jnp.arange(4.0))
  assert [str(e) for e in exp.ordered_effects] == ["HostCallback"]
  again = jax.export.deserialize(exp.serialize())
  assert again.ordered_effects == exp.ordered_effects
  x = jax.device_put(jnp.arange(4.0), NamedSharding(mesh, P("d")))
  np.testing.assert_array_equal(jax.jit(again.call)(x), [0.0, 2.0, 4.0, 6.0])
  hostcb.barrier_wait()
  assert sorted(seen) == [[0.0, 1.0], [2.0, 3.0]]


# ---------------------------------------------- separate processes
@needs_flatbuffers
def test_exported_programs_run_in_a_fresh_process_with_the_same_values(
  exported, tmp_path
):
  directory, here, _ = exported
  there, _ = _worker("run", directory)
  for program in ("step", "grad", "vmap"):
    assert there[program] == here[program], program


@needs_flatbuffers
def test_exported_programs_give_the_same_records_in_a_fresh_process(exported):
  directory, here, _ = exported
  there, _ = _worker("run", directory)
  assert there["records"] == here["records"]
  kinds = {r[0] for r in here["records"]}
  assert kinds == {"log", "log_pair", "debug_cb", "io_fn"}
  # vmap applied before export: the tap saw the batch and its transforms.
  assert [
    "log",
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]],
    "(('batch', {'batch_dims': (0,)}),)",
  ] in there["records"]


@needs_flatbuffers
def test_exported_programs_print_the_same_lines_in_a_fresh_process(exported):
  directory, _, lines_here = exported
  _, lines_there = _worker("run", directory)
  assert lines_there == lines_here
  assert lines_here[:3] == [
    "y=[1. 4. 9.] sum=14.0",
    "what: w",
    "[-0.9999902  0.9906074  0.1498772]",
  ]


@needs_flatbuffers
def test_an_exported_program_with_an_unbound_name_raises_naming_it(exported):
  directory, _, _ = exported
  there, _ = _worker("unbound", directory)
  for program in ("step", "grad", "vmap"):
    assert there[program]["message"].endswith(
      "hostcb: no host function is registered under the name 'log' in "
      "this process; call hostcb.register('log', fn) before running a "
      "program that names it"
    ), there[program]
  assert there["records"] == []


def test_persistent_cache_entries_serve_any_registration_order(tmp_path):
  names = ["log", "log_pair", "square", "stats", "debug_cb", "io_fn", "pure_fn"]
  first, _ = _worker("cache", tmp_path, ",".join(names))
  entries = sorted(os.listdir(tmp_path / "cache"))
  second, _ = _worker("cache", tmp_path, ",".join(reversed(names)))
  # The second process found the first one's entry (no new one) and ran
  # it with its own functions.
  assert sorted(os.listdir(tmp_path / "cache")) == entries
  assert any(e.startswith("jit_step-") for e in entries)
  assert second == first


def test_serialized_executable_loads_and_runs_in_another_process(tmp_path):
  here, lines_here = _worker("serialize", tmp_path)
  there, lines_there = _worker("deserialize", tmp_path)
  assert there == here
  assert lines_there == lines_here


@needs_flatbuffers
def test_an_artifact_of_the_oldest_jax_runs_on_this_one():
  # Made once with jax 0.8.0 by scripts/make_export_artifact.py.
  path = os.path.join(_DATA, "export_jax_0.8.0.bin")
  with open(os.path.join(_DATA, "export_jax_0.8.0.json")) as f:
    expected = json.load(f)
  records = []
  hostcb.register(
    "artifact.log",
    lambda x, t: records.append([np.asarray(x).tolist(), repr(t)]),
  )
  hostcb.register(
    "artifact.affine", lambda x: np.asarray(2 * x + 1, np.float32)
  )
  # JAX keeps its own window of 6 months for what it deserializes: a newer
  # JAX (0.12) refuses an artifact of JAX 0.8.0 as expired unless asked
  # (an option older JAX lack), whatever the program holds.
  expired = "jax_export_deserialize_expired_versions"
  before = getattr(jax.config, expired, None)
  if before is not None:
    jax.config.update(expired, True)
  try:
    with open(path, "rb") as f:
      exp = jax.export.deserialize(bytearray(f.read()))
  finally:
    if before is not None:
      jax.config.update(expired, before)
  out = exp.call(np.asarray(expected["input"], np.float32))
  hostcb.barrier_wait()
  assert np.asarray(out).tolist() == expected["output"]
  assert records == expected["records"]


# ------------------------------------- the handlers by name, directly
def _tap_v1(name: str, spec: str):
  """A program of one ``hostcb_tap_v1`` call with these attributes, as a
  program made elsewhere (by another process or another hostcb) holds."""
  return jax.jit(
    lambda x: jax.ffi.ffi_call("hostcb_tap_v1", (), has_side_effect=True)(
      x, name=name, spec=spec
    )
  )


_SPEC = by_name.dumps(
  {
    "v": 1,
    "op": "tap",
    "fn": {"kind": "function"},
    "tree": "*",
    "with_device": False,
    "prints": False,
    "partitioned": False,
    "transforms": [],
  }
)


def test_a_run_that_failed_on_an_unbound_name_succeeds_once_it_is_bound():
  f = _tap_v1("test_export.later", _SPEC)
  with pytest.raises(
    jax.errors.JaxRuntimeError,
    match="no host function is registered under the name 'test_export.later'",
  ):
    jax.block_until_ready(f(jnp.arange(2.0)))
  seen = []
  hostcb.register(
    "test_export.later", lambda x, t: seen.append(np.asarray(x).tolist())
  )
  jax.block_until_ready(f(jnp.arange(2.0)))
  hostcb.barrier_wait()
  assert seen == [[0.0, 1.0]]


def test_a_spec_of_an_unknown_version_fails_the_run_naming_it():
  hostcb.register("test_export.future", lambda x, t: None)
  spec = _SPEC.replace('"v":1', '"v":9')
  with pytest.raises(
    jax.errors.JaxRuntimeError,
    match="spec of version 9; this hostcb reads version 1",
  ):
    jax.block_until_ready(_tap_v1("test_export.future", spec)(jnp.ones(2)))


def test_a_spec_of_an_unknown_kind_fails_the_run_naming_it():
  hostcb.register("test_export.kind", lambda x, t: None)
  spec = _SPEC.replace('"kind":"function"', '"kind":"teleport"')
  with pytest.raises(
    jax.errors.JaxRuntimeError,
    match="of kind 'teleport', which this hostcb does not know",
  ):
    jax.block_until_ready(_tap_v1("test_export.kind", spec)(jnp.ones(2)))


def test_a_spec_that_is_not_json_fails_the_run():
  hostcb.register("test_export.garbled", lambda x, t: None)
  with pytest.raises(
    jax.errors.JaxRuntimeError,
    match="'test_export.garbled' with a spec that is not JSON",
  ):
    jax.block_until_ready(_tap_v1("test_export.garbled", "{")(jnp.ones(2)))


def test_a_spec_with_missing_fields_fails_the_run_naming_it():
  hostcb.register("test_export.partial", lambda x, t: None)
  spec = by_name.dumps({"v": 1, "op": "tap", "fn": {"kind": "function"}})
  with pytest.raises(
    jax.errors.JaxRuntimeError,
    match="'test_export.partial' with a spec that this "
    "hostcb cannot read \\(KeyError: 'tree'\\)",
  ):
    jax.block_until_ready(_tap_v1("test_export.partial", spec)(jnp.ones(2)))
