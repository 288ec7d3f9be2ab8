"""hostcb.metrics: log() under every transformation, the sinks, flush,
exit, bounded memory, TensorBoard's files read by TensorBoard's reader,
W&B in offline mode.

Records are inspected through a recording sink (a plain function), after
``metrics.flush(timeout)``; values are compared exactly (float32 values
as computed), and every loop's results with the same loop without
``log``.
"""

from __future__ import annotations

import csv
import glob
import json
import logging
import math
import signal
import struct
import textwrap
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcb
from hostcb import metrics
from hostcb.metrics import tensorboard as tb_module
from _helpers import run_python

try:
  from jax import shard_map as _shard_map
except ImportError:  # older JAX
  from jax.experimental.shard_map import shard_map as _shard_map

N = jax.device_count()
WAIT_S = 60  # every flush and wait of these tests is bounded by this


class Recorder:
  """A sink function that remembers ``(step, values)``, thread-safely."""

  def __init__(self):
    self.got = []
    self._lock = threading.Lock()

  def __call__(self, step, values):
    with self._lock:
      self.got.append((step, dict(values)))


@pytest.fixture
def rec():
  r = Recorder()
  metrics.add_sink(r)
  yield r
  metrics.remove_sink(r, timeout=WAIT_S)


def records(r: Recorder) -> list:
  metrics.flush(WAIT_S)
  return r.got


def f32(x) -> float:
  return float(np.float32(x))


# ------------------------------------------------------- the front end
def test_eager_log_writes_one_record(rec):
  metrics.log({"loss": 0.25, "count": 3}, step=7)
  assert records(rec) == [(7, {"loss": 0.25, "count": 3})]


def _typed(got: list) -> list:
  """The records with each value's type: ``True == 1`` in Python."""
  return [(s, {k: (type(v).__name__, v) for k, v in d.items()}) for s, d in got]


def test_eager_values_keep_int_and_bool_kinds(rec):
  metrics.log(
    {"n": jnp.int8(-3), "ok": True, "u": jnp.uint32(2**32 - 1)}, step=0
  )
  assert _typed(records(rec)) == [
    (0, {"n": ("int", -3), "ok": ("bool", True), "u": ("int", 2**32 - 1)})
  ]


@pytest.mark.parametrize(
  "values",
  [
    lambda x: {"ok": x > 1.0, "loss": x},  # packed with other scalars
    lambda x: {"ok": x > 1.0},  # alone
  ],
  ids=["beside-a-scalar", "alone"],
)
def test_a_bool_metric_arrives_as_bool(rec, values):
  f = jax.jit(lambda x, i: metrics.log(values(x), step=i))
  f(2.0, 0)
  f(0.5, 1)
  assert [_typed(records(rec))[i][1]["ok"] for i in (0, 1)] == [
    ("bool", True),
    ("bool", False),
  ]


@pytest.mark.parametrize(
  "reduce, want", [("first", True), ("max", True), ("min", False)]
)
def test_a_bool_metric_under_vmap_stays_bool(rec, reduce, want):
  f = jax.vmap(lambda x: metrics.log({"ok": x > 1.0, "x": x}, 0, reduce=reduce))
  jax.jit(f)(jnp.array([2.0, 0.5]))
  assert _typed(records(rec))[0][1]["ok"] == ("bool", want)


def test_the_sum_of_bool_metrics_under_vmap_counts_them(rec):
  # As jnp.sum: how many are true, whether packed or beside an array.
  def log(x):
    metrics.log({"ok": x > 1.0, "x": x}, 0, reduce="sum")
    metrics.log({"ok": x > 1.0, "w": jnp.stack([x, x])}, 1, reduce="sum")

  jax.jit(jax.vmap(log))(jnp.array([2.0, 3.0, 0.5]))
  assert [values["ok"] for _, values in _typed(records(rec))] == [
    ("int", 2),
    ("int", 2),
  ]


def test_a_bool_metric_is_written_as_a_bool_by_the_file_sinks(tmp_path):
  jsonl, table = tmp_path / "m.jsonl", tmp_path / "m.csv"
  sinks = [
    metrics.add_sink(metrics.JsonLines(jsonl)),
    metrics.add_sink(metrics.CSV(table)),
  ]
  f = jax.jit(lambda x, i: metrics.log({"ok": x > 1.0, "x": x}, step=i))
  f(2.0, 0)
  f(0.5, 1)
  for s in sinks:
    metrics.remove_sink(s, timeout=WAIT_S)
  rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
  assert [(type(r["ok"]).__name__, r["ok"]) for r in rows] == [
    ("bool", True),
    ("bool", False),
  ]
  cells = [row["ok"] for row in csv.DictReader(table.open())]
  assert cells == ["True", "False"]


def test_eager_log_comes_after_the_taps_of_computations_before_it(rec):
  f = jax.jit(lambda x: (metrics.log({"loss": x}, step=0), x + 1)[1])
  for _ in range(3):
    y = f(1.0)
    metrics.log({"lr": 0.5, "loss_plus_one": y}, step=1)
  assert (
    records(rec)
    == [(0, {"loss": 1.0}), (1, {"lr": 0.5, "loss_plus_one": 2.0})] * 3
  )


def test_jit_log_writes_the_step_value(rec):
  f = jax.jit(lambda x, i: (metrics.log({"x": x * 2}, step=i), x)[1])
  f(1.5, 4)
  f(2.5, 5)
  assert records(rec) == [(4, {"x": 3.0}), (5, {"x": 5.0})]


def _loop(x, log):
  def body(carry, _):
    i, x = carry
    x = jnp.sin(x) + 0.5
    if log:
      metrics.log({"x": x, "neg": -x}, step=i)
    return (i + 1, x), x

  return lax.scan(body, (jnp.int32(0), x), None, length=6)


def test_scan_logs_every_step_with_the_step_of_the_carry(rec):
  (_, final), ys = jax.jit(lambda x: _loop(x, True))(0.3)
  (_, want_final), want_ys = jax.jit(lambda x: _loop(x, False))(0.3)
  assert final == want_final and np.array_equal(ys, want_ys)
  assert records(rec) == [
    (i, {"x": float(y), "neg": float(-y)}) for i, y in enumerate(np.asarray(ys))
  ]


def test_fori_loop_logs_its_index(rec):
  def body(i, x):
    metrics.log({"x": x}, step=i)
    return x * 2

  assert jax.jit(lambda x: lax.fori_loop(3, 6, body, x))(1.0) == 8.0
  assert records(rec) == [(3, {"x": 1.0}), (4, {"x": 2.0}), (5, {"x": 4.0})]


def test_while_loop_logs_until_it_stops(rec):
  def body(c):
    i, x = c
    metrics.log({"x": x}, step=i)
    return i + 1, x / 2

  out = jax.jit(lambda x: lax.while_loop(lambda c: c[1] > 1, body, (0, x)))(
    10.0
  )
  assert (int(out[0]), float(out[1])) == (4, 0.625)
  assert records(rec) == [
    (0, {"x": 10.0}),
    (1, {"x": 5.0}),
    (2, {"x": 2.5}),
    (3, {"x": 1.25}),
  ]


def test_cond_logs_in_the_branch_taken_only(rec):
  def f(x, i):
    return lax.cond(
      x > 0,
      lambda: (metrics.log({"pos": x}, step=i), x)[1],
      lambda: (metrics.log({"neg": x}, step=i), -x)[1],
    )

  g = jax.jit(f)
  assert (g(2.0, 1), g(-3.0, 2)) == (2.0, 3.0)
  assert records(rec) == [(1, {"pos": 2.0}), (2, {"neg": -3.0})]


def test_nested_dicts_give_slash_joined_names(rec):
  metrics.log({"train": {"loss": 1.0, "acc": {"top1": 0.5}}}, step=0)
  assert records(rec) == [(0, {"train/loss": 1.0, "train/acc/top1": 0.5})]


def test_array_metrics_reach_the_sinks_as_arrays(rec):
  jax.jit(lambda w: metrics.log({"w": w, "mean": w.mean()}, step=1))(
    jnp.arange(4.0)
  )
  [(step, values)] = records(rec)
  assert step == 1 and values["mean"] == 1.5
  assert values["w"].dtype == np.float32
  assert values["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_log_under_grad_logs_the_primal_values(rec):
  def loss(w):
    value = jnp.sum(w**2)
    metrics.log({"loss": value}, step=0)
    return value

  assert jax.grad(loss)(jnp.float32(3.0)) == 6.0
  assert records(rec) == [(0, {"loss": 9.0})]


def test_64_bit_values_and_steps_keep_their_precision():
  r = run_python(
    textwrap.dedent("""
      import jax
      jax.config.update("jax_enable_x64", True)
      from hostcb import metrics
      got = []
      metrics.add_sink(lambda step, values: got.append((step, values)))
      jax.jit(lambda x, i: metrics.log({"x": x}, step=i))(1 / 3, 2**40)
      metrics.flush(60)
      print(got)
      """)
  )
  assert r.stdout == f"[({2**40}, {{'x': {1 / 3!r}}})]\n", r.stderr


@pytest.mark.parametrize(
  "values, step, error, match",
  [
    ([1.0], 0, TypeError, "values must be a dict"),
    ({}, 0, ValueError, "no metric to log"),
    ({"step": 1.0}, 0, ValueError, "'step' cannot name a metric"),
    ({1: 1.0}, 0, TypeError, "metric names must be str"),
    ({"z": 1j}, 0, TypeError, "is complex"),
    ({"x": 1.0}, 1.5, TypeError, "step must be an integer scalar"),
    ({"x": 1.0}, jnp.arange(2), TypeError, "step must be an integer scalar"),
  ],
)
def test_bad_arguments_raise_when_logging(values, step, error, match):
  with pytest.raises(error, match=match):
    metrics.log(values, step=step)


def test_unknown_reduction_raises():
  with pytest.raises(ValueError, match="reduce must be one of 'mean'"):
    metrics.log({"x": 1.0}, step=0, reduce="median")


# --------------------------------------------------------------- vmap
def _vmapped(reduce):
  return jax.jit(
    jax.vmap(
      lambda x: metrics.log({"x": x, "sq": x * x}, step=3, reduce=reduce)
    )
  )


@pytest.mark.parametrize(
  "reduce, x, sq",
  [
    ("mean", 1.5, 3.5),
    ("sum", 6.0, 14.0),
    ("max", 3.0, 9.0),
    ("min", 0.0, 0.0),
    ("first", 0.0, 0.0),
  ],
)
def test_vmap_makes_one_record_reduced_over_the_batch(rec, reduce, x, sq):
  _vmapped(reduce)(jnp.arange(4.0))
  assert records(rec) == [(3, {"x": x, "sq": sq})]


def test_vmap_each_names_every_element(rec):
  _vmapped("each")(jnp.arange(3.0))
  assert records(rec) == [
    (
      3,
      {
        "x/batch_0": 0.0,
        "sq/batch_0": 0.0,
        "x/batch_1": 1.0,
        "sq/batch_1": 1.0,
        "x/batch_2": 2.0,
        "sq/batch_2": 4.0,
      },
    )
  ]


def test_nested_vmap_reduces_over_both_batches(rec):
  def nested(reduce):
    # the outer vmap maps the columns (j), the inner one the rows (i)
    return jax.vmap(
      jax.vmap(lambda x: metrics.log({"x": x}, step=0, reduce=reduce)),
      in_axes=1,
    )

  nested("mean")(jnp.arange(6.0).reshape(2, 3))
  nested("each")(jnp.arange(6.0).reshape(2, 3))
  got = records(rec)
  assert got[0] == (0, {"x": 2.5})
  # the outer index first: x[i, j] is element (j, i)
  assert got[1] == (
    0,
    {f"x/batch_{j}_{i}": float(3 * i + j) for j in range(3) for i in range(2)},
  )


def test_vmap_of_a_batched_step_with_each_gives_a_record_per_step(rec):
  jax.vmap(lambda x, i: metrics.log({"x": x}, step=i, reduce="each"))(
    jnp.array([5.0, 6.0]), jnp.array([1, 2])
  )
  assert records(rec) == [(1, {"x/batch_0": 5.0}), (2, {"x/batch_1": 6.0})]


def test_vmap_of_a_batched_step_that_differs_fails_flush(rec):
  jax.vmap(lambda x, i: metrics.log({"x": x}, step=i))(
    jnp.array([5.0, 6.0]), jnp.array([1, 2])
  )
  with pytest.raises(
    metrics.MetricsError, match="the step differs across the batch"
  ):
    metrics.flush(WAIT_S)
  assert rec.got == []


def test_vmap_with_an_array_metric_takes_the_general_path(rec):
  jax.vmap(lambda w: metrics.log({"w": w}, step=0))(
    jnp.arange(6.0).reshape(2, 3)
  )
  [(step, values)] = records(rec)
  assert step == 0 and values["w"].tolist() == [1.5, 2.5, 3.5]


# ---------------------------------------------------- several devices
def _mesh():
  return Mesh(np.array(jax.devices()), ("d",))


def shard_map(f):
  try:
    return _shard_map(f, mesh=_mesh(), in_specs=P("d"), out_specs=P("d"))
  except TypeError:
    return _shard_map(f, _mesh(), in_specs=P("d"), out_specs=P("d"))


def _per_device_log(reduce="mean"):
  def f(x):
    metrics.log({"x": x.sum(), "one": 1}, step=9, reduce=reduce)
    return x + 1

  return f


@pytest.mark.multidevice
@pytest.mark.parametrize(
  "reduce, x, one",
  [
    ("mean", (N - 1) / 2, 1.0),
    ("sum", N * (N - 1) / 2, N),
    ("max", N - 1.0, 1),
    ("min", 0.0, 1),
    ("first", 0.0, 1),
  ],
)
def test_pmap_makes_one_record_per_step(rec, reduce, x, one):
  out = jax.pmap(_per_device_log(reduce))(jnp.arange(float(N)))
  assert out.tolist() == [float(i + 1) for i in range(N)]
  assert records(rec) == [(9, {"x": x, "one": one})]


@pytest.mark.multidevice
def test_pmap_of_constants_only_makes_one_record(rec):
  jax.pmap(lambda x: (metrics.log({"c": 2.5}, step=4), x)[1])(
    jnp.arange(float(N))
  )
  assert records(rec) == [(4, {"c": 2.5})]


@pytest.mark.multidevice
def test_pmap_each_names_every_device(rec):
  jax.pmap(_per_device_log("each"))(jnp.arange(float(N)))
  want = {f"x/device_{i}": float(i) for i in range(N)}
  want.update({f"one/device_{i}": 1 for i in range(N)})
  assert records(rec) == [(9, want)]


@pytest.mark.multidevice
def test_shard_map_makes_one_record_with_the_mean(rec):
  x = jax.device_put(jnp.arange(2.0 * N), NamedSharding(_mesh(), P("d")))
  out = jax.jit(shard_map(_per_device_log()))(x)
  assert out.tolist() == [float(i + 1) for i in range(2 * N)]
  # each device sums its two values: 4i + 1 for device i; their mean
  assert records(rec) == [(9, {"x": 2.0 * N - 1, "one": 1.0})]


@pytest.mark.multidevice
@pytest.mark.parametrize(
  "reduce, want",
  [
    ("mean", {"x": (N - 1) / 2}),
    ("each", {f"x/device_{i}": float(i) for i in range(N)}),
  ],
)
def test_shard_map_over_two_mesh_axes_reduces_over_both(rec, reduce, want):
  mesh = Mesh(np.array(jax.devices()).reshape(2, N // 2), ("a", "b"))
  spec = P(("a", "b"))
  f = _shard_map(
    lambda x: (metrics.log({"x": x.sum()}, step=1, reduce=reduce), x)[1],
    mesh=mesh,
    in_specs=spec,
    out_specs=spec,
  )
  jax.jit(f)(jax.device_put(jnp.arange(float(N)), NamedSharding(mesh, spec)))
  assert records(rec) == [(1, want)]


@pytest.mark.multidevice
def test_scan_in_shard_map_logs_every_step_once(rec):
  def per_device(x):
    def body(c, _):
      i, v = c
      metrics.log({"v": v.sum()}, step=i)
      return (i + 1, v * 2), None

    return lax.scan(body, (0, x), None, length=3)[0][1]

  x = jax.device_put(jnp.ones(N), NamedSharding(_mesh(), P("d")))
  assert jax.jit(shard_map(per_device))(x).tolist() == [8.0] * N
  assert records(rec) == [(0, {"v": 1.0}), (1, {"v": 2.0}), (2, {"v": 4.0})]


@pytest.mark.multidevice
def test_sharded_jit_logs_the_global_value_once(rec):
  x = jax.device_put(jnp.arange(4.0 * N), NamedSharding(_mesh(), P("d")))
  jax.jit(lambda v: metrics.log({"mean": v.mean()}, step=0))(x)
  assert records(rec) == [(0, {"mean": (4.0 * N - 1) / 2})]


# ------------------------------------------- the device never waits
def test_the_device_goes_on_while_a_sink_is_blocked():
  entered, release = threading.Event(), threading.Event()
  seen = []

  def slow(step, values):
    entered.set()
    assert release.wait(WAIT_S)
    seen.append(step)

  metrics.add_sink(slow)
  try:
    f = jax.jit(lambda x, i: (metrics.log({"x": x}, step=i), x + 1)[1])
    f(0.0, 0)
    flusher = threading.Thread(target=metrics.flush, args=(WAIT_S,))
    flusher.start()
    assert entered.wait(WAIT_S)  # the writer is inside the sink
    x = 1.0
    for i in range(1, 50):  # the steps run and their results are read
      x = float(f(x, i))
    assert x == 50.0 and seen == []
    release.set()
    flusher.join(WAIT_S)
    metrics.flush(WAIT_S)
    assert seen == list(range(50))
  finally:
    release.set()
    metrics.remove_sink(slow, timeout=WAIT_S)


# -------------------------------------------- the writer's batches
@pytest.fixture
def one_batch():
  """The writer wakes only at a flush (or once 8,192 taps wait): what is
  logged before the flush reaches it as one batch."""
  metrics.flush(WAIT_S)
  metrics.configure(interval=1e5)
  yield
  metrics.configure(interval=1.0)


def _interleaved(x):
  # Per step: two packed sites, a site of an array (unpacked), and the
  # first site's names again under vmap (a site equal to the first, with
  # transforms).
  def body(i, x):
    metrics.log({"a": x}, step=i)
    metrics.log({"b": 2 * x, "c": i > 1}, step=i)
    metrics.log({"w": jnp.full(2, x)}, step=i)
    jax.vmap(lambda v: metrics.log({"a": v}, step=i))(jnp.stack([x, x + 2]))
    return x + 1.0

  return lax.fori_loop(0, 3, body, x)


def test_taps_of_many_sites_in_one_batch_arrive_in_the_order_logged(
  rec, one_batch
):
  jax.jit(_interleaved)(0.5)
  got = [
    (step, {k: getattr(v, "tolist", lambda v=v: v)() for k, v in d.items()})
    for step, d in records(rec)
  ]
  want = []
  for i in range(3):
    x = 0.5 + i
    want += [
      (i, {"a": x}),
      (i, {"b": 2 * x, "c": i > 1}),
      (i, {"w": [x, x]}),
      (i, {"a": x + 1.0}),  # the mean over the vmap batch
    ]
  assert got == want
  assert [type(d["c"]) for _, d in got[1::4]] == [bool] * 3


def test_records_that_cannot_be_made_lose_only_their_run_of_the_batch(
  rec, one_batch, monkeypatch
):
  # Fault injection: making the records of one site fails; the records of
  # the sites before and after it in the same batch arrive, in order, and
  # flush raises the failure.
  from hostcb.metrics import _records

  columns = _records.Site.columns

  def failing(site, items):
    if site.names == ("bad",):
      raise RuntimeError("no columns today")
    return columns(site, items)

  monkeypatch.setattr(_records.Site, "columns", failing)

  @jax.jit
  def step(i):
    metrics.log({"good": i}, step=i)
    metrics.log({"bad": i}, step=i)
    metrics.log({"after": i}, step=i)

  for i in range(2):
    step(i)
  with pytest.raises(metrics.MetricsError, match="no columns today"):
    metrics.flush(WAIT_S)
  assert rec.got == [
    (0, {"good": 0}),
    (0, {"after": 0}),
    (1, {"good": 1}),
    (1, {"after": 1}),
  ]


# ------------------------------------------------- flush and the sinks
def test_flush_raises_a_sink_failure_and_the_other_sinks_still_write(rec):
  def broken(step, values):
    raise ValueError(f"sink broke at step {step}")

  metrics.add_sink(broken)
  try:
    metrics.log({"x": 1.0}, step=1)
    with pytest.raises(
      metrics.MetricsError, match="ValueError: sink broke at step 1"
    ) as info:
      metrics.flush(WAIT_S)
    assert isinstance(info.value.__cause__, ValueError)
    assert rec.got == [(1, {"x": 1.0})]
  finally:
    metrics.remove_sink(broken, timeout=WAIT_S)
  metrics.log({"x": 2.0}, step=2)
  assert records(rec)[-1] == (2, {"x": 2.0})  # the next flush is clean


def test_flush_from_a_sink_raises_instead_of_waiting_for_itself(rec):
  def flushing(step, values):
    metrics.flush(WAIT_S)

  metrics.add_sink(flushing)
  try:
    metrics.log({"x": 1.0}, step=1)
    with pytest.raises(
      metrics.MetricsError, match="flush\\(\\) was called from a sink"
    ):
      metrics.flush(WAIT_S)
  finally:
    metrics.remove_sink(flushing, timeout=WAIT_S)
  assert rec.got == [(1, {"x": 1.0})]


def test_remove_sink_writes_what_was_logged_then_closes_it():
  class Sink(metrics.Sink):
    def __init__(self):
      self.steps, self.closed = [], False

    def write(self, records):
      self.steps += [r.step for r in records]

    def close(self):
      self.closed = True

  s = metrics.add_sink(Sink())
  metrics.log({"x": 1.0}, step=5)
  metrics.remove_sink(s, timeout=WAIT_S)
  assert (s.steps, s.closed) == ([5], True)
  assert s not in metrics.sinks()


def test_remove_sink_of_an_unknown_sink_raises():
  with pytest.raises(ValueError, match="was not added"):
    metrics.remove_sink(print)


def test_add_sink_rejects_an_unknown_processes_option():
  with pytest.raises(ValueError, match="processes must be 'first' or"):
    metrics.add_sink(print, processes="all")


def test_records_logged_without_a_sink_are_counted_and_warned(caplog):
  before = metrics.stats()["no_sink"]
  metrics.log({"x": 1.0}, step=0)
  with caplog.at_level(logging.WARNING, logger="hostcb"):
    metrics.flush(WAIT_S)
  assert metrics.stats()["no_sink"] == before + 1
  assert (
    "1 record(s) logged while no sink was added were not written" in caplog.text
  )


# ------------------------------------------------------ bounded memory
@pytest.fixture
def blocked_sink():
  """A sink whose first write blocks until released, entered through a
  flush in another thread; the FIFO bounded to 3 taps."""
  entered, release = threading.Event(), threading.Event()
  seen = []

  def sink(step, values):
    entered.set()
    assert release.wait(WAIT_S)
    seen.append(step)

  metrics.add_sink(sink)
  metrics.log({"x": 0.0}, step=0)
  flusher = threading.Thread(target=metrics.flush, args=(WAIT_S,))
  flusher.start()
  assert entered.wait(WAIT_S)
  metrics.configure(max_pending=3)
  yield seen, release
  release.set()
  flusher.join(WAIT_S)
  metrics.configure(max_pending=100_000, overflow="block")
  metrics.remove_sink(sink, timeout=WAIT_S)


def test_drop_policy_drops_and_counts_taps_beyond_the_bound(
  blocked_sink, caplog
):
  seen, release = blocked_sink
  metrics.configure(overflow="drop")
  before = metrics.stats()["dropped"]
  for i in range(1, 11):
    metrics.log({"x": float(i)}, step=i)
  hostcb.barrier_wait()  # every tap ran: 3 queued, 7 dropped
  assert metrics.stats()["dropped"] - before == 7
  assert metrics.stats()["pending"] == 3
  release.set()
  with caplog.at_level(logging.WARNING, logger="hostcb"):
    metrics.flush(WAIT_S)
  assert seen == [0, 1, 2, 3]
  assert "7 tap(s) dropped" in caplog.text


def test_block_policy_holds_the_taps_and_loses_nothing(blocked_sink):
  seen, release = blocked_sink
  for i in range(1, 11):
    metrics.log({"x": float(i)}, step=i)
  deadline = time.monotonic() + WAIT_S
  while metrics.stats()["pending"] < 3:  # the consumer waits at the bound
    assert time.monotonic() < deadline
    threading.Event().wait(0.01)
  assert metrics.stats()["pending"] == 3 and seen == []
  release.set()
  metrics.flush(WAIT_S)
  assert seen == list(range(11))


def test_flush_raises_timeout_error_when_a_sink_does_not_finish(blocked_sink):
  seen, release = blocked_sink
  metrics.log({"x": 1.0}, step=1)
  with pytest.raises(
    TimeoutError, match="the sinks did not finish writing within 0.2 s"
  ):
    metrics.flush(0.2)
  release.set()
  metrics.flush(WAIT_S)
  assert seen == [0, 1]


def test_configure_rejects_bad_settings():
  with pytest.raises(ValueError, match="max_pending must be a positive"):
    metrics.configure(max_pending=0)
  with pytest.raises(ValueError, match="overflow must be 'block' or 'drop'"):
    metrics.configure(overflow="spill")
  with pytest.raises(ValueError, match="interval must be a positive"):
    metrics.configure(interval=-1)


# ----------------------------------------------------------- at exit
_EXIT_SCRIPT = """
import jax, jax.numpy as jnp
from jax import lax
from hostcb import metrics
metrics.add_sink(metrics.JsonLines({path!r}))

def body(c, _):
  i, x = c
  metrics.log({{"x": x}}, step=i)
  return (i + 1, x + 1.0), None

out = jax.jit(lambda x: lax.scan(body, (0, x), None, length=500)[0])(0.0)
{end}
"""


@pytest.mark.parametrize(
  "end, rc",
  [
    ("", 0),
    ("raise RuntimeError('boom')", 1),
    ("raise KeyboardInterrupt", -signal.SIGINT),
  ],
  ids=["end", "exception", "ctrl-c"],
)
def test_records_are_written_at_exit_also_after_an_exception(tmp_path, end, rc):
  path = str(tmp_path / "m.jsonl")
  r = run_python(_EXIT_SCRIPT.format(path=path, end=end), timeout=240)
  assert r.returncode == rc, r.stderr
  lines = [json.loads(line) for line in open(path)]
  assert [(d["step"], d["x"]) for d in lines] == [
    (i, float(i)) for i in range(500)
  ]


def test_records_logged_before_uninstall_are_written(tmp_path):
  path = str(tmp_path / "m.jsonl")
  r = run_python(
    _EXIT_SCRIPT.format(
      path=path,
      end="import hostcb\n"
      "hostcb.uninstall()\n"
      "print(metrics.stats()['records'], metrics.stats()['pending'])\n",
    ),
    timeout=240,
  )
  assert (r.returncode, r.stdout) == (0, "500 0\n"), r.stderr
  lines = [json.loads(line) for line in open(path)]
  assert [(d["step"], d["x"]) for d in lines] == [
    (i, float(i)) for i in range(500)
  ]


def test_records_logged_after_uninstall_by_a_compiled_step_are_written(
  tmp_path,
):
  path = str(tmp_path / "m.jsonl")
  r = run_python(
    textwrap.dedent(f"""
      import jax, hostcb
      from hostcb import metrics
      metrics.add_sink(metrics.JsonLines({path!r}))
      step = jax.jit(lambda i: metrics.log({{"i": i}}, step=i))
      step(0)
      hostcb.uninstall()
      for i in range(1, 5):
        step(i)
      """),
    timeout=240,
  )
  assert r.returncode == 0, r.stderr
  assert [json.loads(line)["i"] for line in open(path)] == [0, 1, 2, 3, 4]


_FAILING_STEP = """
import jax, json
{api}
from hostcb import metrics
metrics.add_sink(metrics.JsonLines({path!r}))
def check(i):
  if i == 50:
    raise ValueError("bad step")
@jax.jit
def step(i, x):
  metrics.log({{"x": x}}, step=i)
  API(check, i)
  return x + 1.0
x = 0.0
for i in range(100):
  x = step(i, x)
  print(float(x))
"""


def test_a_failed_callback_keeps_the_records_logged_before_it(tmp_path):
  # As under JAX's own jax.debug.callback (the oracle): the failure ends
  # the loop at step 50, uncaught (the same output, the same status), and
  # every record logged before it is written at exit.  JAX's failed step
  # 50 stops before its metrics tap runs; hostcb's device does not stop
  # for the callback, so step 50's record, logged before it, is kept.
  runs = {}
  for name, api in [
    ("jax", "API = jax.debug.callback"),
    ("hostcb", "import hostcb\nAPI = hostcb.debug.callback"),
  ]:
    path = str(tmp_path / f"{name}.jsonl")
    r = run_python(_FAILING_STEP.format(api=api, path=path), timeout=240)
    steps = [json.loads(line)["step"] for line in open(path)]
    runs[name] = (r.returncode, r.stdout, steps)
    assert "ValueError: bad step" in r.stderr, name
  printed = "".join(f"{float(i)}\n" for i in range(1, 51))
  assert runs["jax"] == (1, printed, list(range(50)))
  assert runs["hostcb"] == (1, printed, list(range(51)))


# ----------------------------------------------------- the file sinks
def test_json_lines_writes_one_object_per_record(tmp_path):
  path = tmp_path / "m.jsonl"
  sink = metrics.add_sink(metrics.JsonLines(path))
  metrics.log({"loss": 0.5, "n": 2}, step=1)
  metrics.log({"w": jnp.array([1.0, 2.0]), "bad": jnp.nan}, step=2)
  metrics.remove_sink(sink, timeout=WAIT_S)
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  for row in rows:
    assert isinstance(row.pop("wall_time"), float)
  assert rows[0] == {"step": 1, "loss": 0.5, "n": 2}
  assert rows[1]["step"] == 2 and rows[1]["w"] == [1.0, 2.0]
  assert math.isnan(rows[1]["bad"])


def test_csv_widens_its_header_for_a_new_metric(tmp_path):
  path = tmp_path / "m.csv"
  sink = metrics.add_sink(metrics.CSV(path))
  metrics.log({"loss": 0.5}, step=1)
  metrics.flush(WAIT_S)
  metrics.log({"loss": 0.25, "acc": 0.75}, step=2)
  metrics.log({"acc": jnp.inf}, step=3)
  metrics.remove_sink(sink, timeout=WAIT_S)
  rows = list(csv.reader(path.open()))
  assert rows[0] == ["step", "wall_time", "loss", "acc"]
  assert [[r[0], r[2], r[3]] for r in rows[1:]] == [
    ["1", "0.5", ""],
    ["2", "0.25", "0.75"],
    ["3", "", "inf"],
  ]
  assert all(float(r[1]) > 0 for r in rows[1:])


# -------------------------------------------------------- TensorBoard
_NO_TENSORBOARD = (
  "tensorboard is not installed (pip install "
  "hostcb[tensorboard]; `make install` installs it)"
)


@pytest.fixture
def tensorboard():
  return pytest.importorskip("tensorboard", reason=_NO_TENSORBOARD)


def _read_tensorboard(logdir):
  from tensorboard.backend.event_processing import event_accumulator

  acc = event_accumulator.EventAccumulator(
    str(logdir),
    size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0},
  )
  acc.Reload()
  return acc


def test_tensorboard_event_file_is_read_by_tensorboard(
  tensorboard, tmp_path, rec
):
  sink = metrics.add_sink(metrics.TensorBoard(tmp_path))
  (_, _), ys = jax.jit(lambda x: _loop(x, True))(0.3)
  metrics.log({"x": 1.0}, step=200)  # a step of two bytes
  metrics.remove_sink(sink, timeout=WAIT_S)
  acc = _read_tensorboard(tmp_path)
  assert sorted(acc.Tags()["scalars"]) == ["neg", "x"]
  xs = [(e.step, e.value) for e in acc.Scalars("x")]
  assert xs == [(i, float(y)) for i, y in enumerate(np.asarray(ys))] + [
    (200, 1.0)
  ]
  assert [e.value for e in acc.Scalars("neg")] == [float(-y) for y in ys]
  assert len(glob.glob(str(tmp_path / "events.out.tfevents.*"))) == 1


def test_file_sinks_that_write_nothing_make_no_file(tensorboard, tmp_path):
  sinks = [
    metrics.add_sink(metrics.TensorBoard(tmp_path / "tb")),
    metrics.add_sink(metrics.JsonLines(tmp_path / "m.jsonl")),
    metrics.add_sink(metrics.CSV(tmp_path / "m.csv")),
  ]
  metrics.flush(WAIT_S)
  for sink in sinks:
    metrics.remove_sink(sink, timeout=WAIT_S)
  assert list(tmp_path.iterdir()) == []


def test_tensorboard_writes_arrays_as_histograms(tensorboard, tmp_path):
  sink = metrics.add_sink(metrics.TensorBoard(tmp_path))
  metrics.log({"w": jnp.arange(10.0), "loss": 0.5}, step=3)
  metrics.remove_sink(sink, timeout=WAIT_S)
  acc = _read_tensorboard(tmp_path)
  assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(3, 0.5)]
  [event] = acc.Tensors("w")
  from tensorboard.util import tensor_util

  buckets = tensor_util.make_ndarray(event.tensor_proto)  # left, right, count
  assert event.step == 3 and buckets[:, 2].sum() == 10.0
  assert (buckets[0, 0], buckets[-1, 1]) == (0.0, 9.0)


@pytest.mark.parametrize("step", [0, 1, 127, 128, 300, 2**31 - 1, -5])
def test_bulk_encoding_equals_the_protocol_buffer_library(tensorboard, step):
  from tensorboard.compat.proto import event_pb2, summary_pb2

  names = ("loss", "grad/norm", "é")
  values = [0.25, -3.5, np.float32(1e-7)]
  event = event_pb2.Event(
    wall_time=1.7e9 + 0.125,
    step=step,
    summary=summary_pb2.Summary(
      value=[
        summary_pb2.Summary.Value(tag=n, simple_value=v)
        for n, v in zip(names, values)
      ]
    ),
  )
  data = event.SerializeToString()
  framed = tb_module.encode_scalar_events(
    names, [step], [1.7e9 + 0.125], [values]
  )
  length = struct.pack("<Q", len(data))
  assert framed[:8] == length and framed[12:-4] == data


def test_bulk_frames_equal_tensorboards_own_record_writer(tensorboard):
  # Every byte of every frame, the checksums included, for events of
  # several layouts: steps of every varint length (none for step 0, ten
  # for a negative one), tags of one- and two-byte lengths.
  import io

  from tensorboard.compat.proto import event_pb2, summary_pb2
  from tensorboard.summary.writer.record_writer import RecordWriter

  names = ("loss", "grad/norm", "é", "t" * 200)
  steps = [0, 1, 127, 128, 300, 2**21, 2**31 - 1, 2**40, -5, 7]
  rng = np.random.default_rng(0)
  walls = 1.7e9 + rng.random(len(steps)) * 1e3
  values = rng.standard_normal((len(steps), len(names))).astype(np.float32)
  values[0] = [0.0, -0.0, np.inf, 1e-45]
  want = io.BytesIO()
  writer = RecordWriter(want)
  for step, wall, row in zip(steps, walls, values):
    summary = summary_pb2.Summary(
      value=[
        summary_pb2.Summary.Value(tag=n, simple_value=v)
        for n, v in zip(names, row)
      ]
    )
    event = event_pb2.Event(wall_time=wall, step=step, summary=summary)
    writer.write(event.SerializeToString())
  got = tb_module.encode_scalar_events(names, steps, walls, values)
  assert got == want.getvalue()


def test_crc32c_matches_the_standard_check_value():
  rows = np.frombuffer(b"123456789", np.uint8)[None, :]
  assert int(tb_module.crc32c(rows)[0]) == 0xE3069283


def test_missing_tensorboard_says_how_to_install_it():
  r = run_python(
    textwrap.dedent("""
      import sys
      sys.modules["tensorboard"] = None
      from hostcb import metrics
      try:
        metrics.TensorBoard("unused")
      except ImportError as e:
        print(e)
      """)
  )
  assert r.stdout == (
    "hostcb.metrics.TensorBoard needs the tensorboard "
    "package, which is not installed: pip install "
    "hostcb[tensorboard]  (or: pip install tensorboard)\n"
  ), r.stderr


def test_missing_wandb_says_how_to_install_it():
  r = run_python(
    textwrap.dedent("""
      import sys
      sys.modules["wandb"] = None
      from hostcb import metrics
      try:
        metrics.WandB(mode="offline")
      except ImportError as e:
        print(e)
      """)
  )
  assert r.stdout == (
    "hostcb.metrics.WandB needs the wandb package, which "
    "is not installed: pip install hostcb[wandb]  (or: "
    "pip install wandb)\n"
  ), r.stderr


# ---------------------------------------------------------------- W&B
def _wandb_history(path: str) -> list | None:
  """The history rows of a W&B offline run file (``run-*.wandb``: a
  LevelDB-style log of ``Record`` protocol buffers after a 7-byte
  header); None until W&B's service has written the run's ``exit``
  record, its last."""
  from wandb.proto import wandb_internal_pb2

  data = open(path, "rb").read()
  assert data[:4] == b":W&B"
  block, pos, chunk, rows, ended = 32768, 7, b"", [], False
  while pos + 7 <= len(data):
    left = block - pos % block
    if left < 7:  # the block's tail is padding
      pos += left
      continue
    length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
    chunk += data[pos + 7 : pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):  # FULL, LAST
      record = wandb_internal_pb2.Record()
      record.ParseFromString(chunk)
      chunk = b""
      ended = ended or record.WhichOneof("record_type") == "exit"
      if record.WhichOneof("record_type") == "history":
        row = {"_step": 0}  # W&B leaves out a step of 0
        row.update(
          {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in record.history.item
          }
        )
        rows.append(row)
    elif kind == 0:
      break
  return rows if ended else None


def test_wandb_offline_run_gets_every_record(tmp_path, monkeypatch):
  pytest.importorskip(
    "wandb",
    reason="wandb is not installed (pip install "
    "hostcb[wandb]; `make install` installs it)",
  )
  monkeypatch.setenv("WANDB_SILENT", "true")
  sink = metrics.add_sink(
    metrics.WandB(mode="offline", dir=str(tmp_path), project="hostcb-test")
  )
  (_, _), ys = jax.jit(lambda x: _loop(x, True))(0.3)
  metrics.remove_sink(sink, timeout=WAIT_S)  # finishes the run
  [path] = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "*.wandb"))
  # finish() returns before W&B's service process has written all of the
  # file: wait (bounded) for its last record.
  deadline = time.monotonic() + WAIT_S
  while (history := _wandb_history(path)) is None:
    assert time.monotonic() < deadline, "W&B never finished its run file"
    threading.Event().wait(0.05)
  rows = [(r["_step"], r["x"], r["neg"]) for r in history]
  assert rows == [(i, f32(y), f32(-y)) for i, y in enumerate(np.asarray(ys))]


# ------------------------------------------------- with progress bars
def test_log_and_progress_bars_share_a_loop(rec):
  tqdm = pytest.importorskip("tqdm", reason="tqdm is not installed")
  try:
    from hostcb import progress

    progress._require_supported_jax()
  except ImportError as e:  # hostcb.progress.UnsupportedJax (jax 0.8)
    pytest.skip(str(e))
  import io

  bars = []

  class Bar(tqdm.tqdm):
    def __init__(self, *a, **k):
      super().__init__(*a, file=io.StringIO(), **k)
      bars.append(self)

  def body(c, x):
    i, total = c
    metrics.log({"total": total}, step=i)
    return (i + 1, total + x), None

  (_, total), _ = jax.jit(
    lambda xs: progress.scan(body, (0, 0.0), xs, tqdm_class=Bar)
  )(jnp.arange(5.0))
  assert float(total) == 10.0
  assert records(rec) == [
    (i, {"total": float(i * (i - 1) // 2)}) for i in range(5)
  ]
  hostcb.barrier_wait()
  assert [(b.n, b.total) for b in bars] == [(5, 5)]


def test_importing_hostcb_does_not_import_metrics():
  r = run_python("import sys, hostcb\nprint('hostcb.metrics' in sys.modules)")
  assert (r.returncode, r.stdout) == (0, "False\n"), r.stderr
