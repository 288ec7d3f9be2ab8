"""hostcb.progress: tqdm bars for scan, fori_loop and while_loop, under
jit, vmap, grad, nesting, pmap, shard_map and sharded jit.

Bars are inspected through ``tqdm_class`` (a tqdm that writes to a
StringIO and remembers its instances): their final count, total,
description and whether they were closed; never terminal escapes.  The
loops' values are compared with lax's.
"""

from __future__ import annotations

import io
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcb
from _helpers import run_python

tqdm = pytest.importorskip(
  "tqdm",
  reason="tqdm is not installed (pip install hostcb[progress]; "
  "`make install` installs it)",
)
try:
  from hostcb import progress

  progress._require_supported_jax()
except ImportError as _e:  # hostcb.progress.UnsupportedJax (jax 0.8)
  if "custom_vmap" not in str(_e):
    raise
  pytest.skip(str(_e), allow_module_level=True)

try:
  from jax import shard_map as _shard_map
except ImportError:  # older JAX
  from jax.experimental.shard_map import shard_map as _shard_map

N = jax.device_count()


class Bars(tqdm.tqdm):
  """A tqdm that writes to a StringIO and records its instances and the
  number of its updates."""

  made: list = []
  _lock = threading.Lock()

  def __init__(self, *args, **kwargs):
    kwargs.setdefault("file", io.StringIO())
    self.updates = 0
    self.kwargs = dict(kwargs)
    super().__init__(*args, **kwargs)
    with Bars._lock:
      Bars.made.append(self)

  def update(self, n=1):
    self.updates += 1
    out = super().update(n)
    self.peak = max(getattr(self, "peak", 0), self.n)
    return out

  @property
  def closed(self) -> bool:
    return self.disable  # tqdm.close() sets it


@pytest.fixture(autouse=True)
def _bars():
  Bars.made = []
  yield
  progress.close_all()


def bars():
  """The bars made so far, once every tap has run: (desc, n, total,
  closed) each, sorted."""
  hostcb.barrier_wait()
  return sorted((b.desc, b.n, b.total, b.closed) for b in Bars.made)


OPTS = dict(tqdm_class=Bars)


def body(c, x):
  return c * 0.5 + x, c * 2.0


def assert_trees_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for u, v in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))


# ----------------------------------------------------------------- scan
def test_scan_values_equal_lax_scan():
  xs = jnp.arange(300.0)
  assert_trees_equal(
    progress.scan(body, 1.0, xs, **OPTS), lax.scan(body, 1.0, xs)
  )


def test_scan_bar_reaches_the_length_and_closes():
  progress.scan(body, 1.0, jnp.arange(300.0), desc="s", **OPTS)
  assert bars() == [("s", 300, 300, True)]


def test_scan_with_length_and_no_xs():
  out = progress.scan(lambda c, _: (c + 1, None), 0, None, length=77, **OPTS)
  assert int(out[0]) == 77
  assert bars() == [("", 77, 77, True)]


def test_scan_reverse_and_pytree_carry_values_equal_lax():
  def f(c, x):
    a, b = c
    return (a + x, b * 2), a - b

  xs = jnp.arange(20.0)
  assert_trees_equal(
    progress.scan(f, (0.0, 1.0), xs, reverse=True, unroll=3, **OPTS),
    lax.scan(f, (0.0, 1.0), xs, reverse=True, unroll=3),
  )


def test_jitted_scan_shows_one_bar_per_run():
  f = jax.jit(lambda xs: progress.scan(body, 1.0, xs, **OPTS))
  f(jnp.arange(50.0))
  f(jnp.arange(50.0))
  assert bars() == [("", 50, 50, True)] * 2


def test_default_rate_taps_at_most_updates_times():
  progress.scan(
    lambda c, _: (c, None), 0, None, length=10000, updates=50, **OPTS
  )
  (bar,) = Bars.made
  hostcb.barrier_wait()
  assert bar.n == 10000 and bar.closed
  assert bar.updates == 50  # every 200 steps; the end adds nothing


def test_every_sets_the_period():
  progress.scan(lambda c, _: (c, None), 0, None, length=105, every=10, **OPTS)
  hostcb.barrier_wait()
  (bar,) = Bars.made
  assert bar.updates == 11  # steps 10, 20... 100, then the end at 105
  assert (bar.n, bar.closed) == (105, True)


def test_grad_of_scan_equals_lax_and_bar_follows_the_forward_loop():
  def loss(scan, c):
    return scan(lambda c, x: (jnp.sin(c) + x, c), c, jnp.arange(40.0))[0]

  g = jax.grad(lambda c: loss(lambda *a: progress.scan(*a, **OPTS), c))(0.3)
  assert float(g) == float(jax.grad(lambda c: loss(lax.scan, c))(0.3))
  assert bars() == [("", 40, 40, True)]


def test_nested_loops_give_nested_bars():
  def outer(c, x):
    c, _ = progress.scan(body, c, jnp.arange(7.0), desc="inner", **OPTS)
    return c, None

  out = progress.scan(outer, 1.0, jnp.arange(3.0), desc="outer", **OPTS)
  want = lax.scan(
    lambda c, x: (lax.scan(body, c, jnp.arange(7.0))[0], None),
    1.0,
    jnp.arange(3.0),
  )
  assert_trees_equal(out, want)
  assert bars() == [("inner", 7, 7, True)] * 3 + [("outer", 3, 3, True)]
  leave = {b.desc: b.leave for b in Bars.made}
  assert leave == {"outer": True, "inner": False}


# ------------------------------------------------------------ fori_loop
def test_fori_loop_values_equal_lax_and_bar_counts_the_steps():
  f = lambda i, c: c * 1.5 + i
  assert float(progress.fori_loop(3, 40, f, 1.0, **OPTS)) == float(
    lax.fori_loop(3, 40, f, 1.0)
  )
  assert bars() == [("", 37, 37, True)]


def test_fori_loop_with_traced_bounds():
  f = jax.jit(lambda n: progress.fori_loop(2, n, lambda i, c: c + i, 0, **OPTS))
  assert int(f(59)) == sum(range(2, 59))
  assert bars() == [("", 57, 57, True)]


def test_fori_loop_with_empty_range():
  assert int(progress.fori_loop(5, 2, lambda i, c: c + i, 0, **OPTS)) == 0
  assert bars() == [("", 0, 0, True)]


# ----------------------------------------------------------- while_loop
def _grow(n, total=None, **kw):
  return progress.while_loop(
    lambda c: c[0] < n,
    lambda c: (c[0] + 1, c[1] * 1.01),
    (0, 1.0),
    total=total,
    **OPTS,
    **kw,
  )


def test_while_loop_values_equal_lax():
  assert_trees_equal(
    _grow(123),
    lax.while_loop(
      lambda c: c[0] < 123, lambda c: (c[0] + 1, c[1] * 1.01), (0, 1.0)
    ),
  )


def test_while_loop_with_total():
  _grow(300, total=300, desc="w")
  assert bars() == [("w", 300, 300, True)]


def test_while_loop_ending_before_its_total_stays_at_its_count():
  _grow(120, total=300)
  assert bars() == [("", 120, 300, True)]


def test_while_loop_with_traced_total():
  jax.jit(_grow)(90, 90)
  assert bars() == [("", 90, 90, True)]


def test_while_loop_with_traced_total_taps_at_the_rate_from_that_total():
  jax.jit(lambda n, t: _grow(n, total=t, updates=10))(1000, 1000)
  hostcb.barrier_wait()
  (bar,) = Bars.made
  assert (bar.n, bar.total, bar.closed) == (1000, 1000, True)
  assert bar.updates == 10  # every 100 steps, decided on the device


def _geometric_taps(n: int) -> int:
  """Steps 1..n that tap without a total (hostcb.progress._geometric)."""
  count = 0
  for s in range(1, n + 1):
    k = max(1, (1 << (s.bit_length() - 1)) >> 4)
    count += s % k == 0
  return count


def test_while_loop_without_total_taps_geometrically_and_ends_at_its_count():
  _grow(1000)
  hostcb.barrier_wait()
  (bar,) = Bars.made
  assert (bar.n, bar.total, bar.closed) == (1000, 1000, True)
  # The last tap in the loop is at step 992 (every 32 steps from 512): the
  # end moves the bar to 1000.
  assert bar.updates == _geometric_taps(1000) + 1


# ----------------------------------------------------------------- vmap
def test_vmap_of_scan_shows_one_bar_for_the_batch():
  f = lambda c: progress.scan(body, c, jnp.arange(60.0), **OPTS)
  assert_trees_equal(
    jax.vmap(f)(jnp.arange(5.0)),
    jax.vmap(lambda c: lax.scan(body, c, jnp.arange(60.0)))(jnp.arange(5.0)),
  )
  assert bars() == [("", 60, 60, True)]


def test_vmap_of_scan_batch_each_shows_one_bar_per_element():
  jax.vmap(
    lambda c: progress.scan(body, c, jnp.arange(60.0), batch="each", **OPTS)
  )(jnp.arange(3.0))
  assert bars() == [(f"[#{i}]", 60, 60, True) for i in range(3)]


def test_vmap_of_while_loop_with_batched_predicate_counts_the_iterations():
  ns = jnp.array([30, 200, 7])
  assert_trees_equal(
    jax.vmap(_grow)(ns),
    jax.vmap(
      lambda n: lax.while_loop(
        lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 1.01), (0, 1.0)
      )
    )(ns),
  )
  assert bars() == [("", 200, 200, True)]


def test_vmap_of_while_loop_batch_each_counts_each_element():
  jax.vmap(lambda n: _grow(n, total=n, batch="each"))(jnp.array([30, 200, 7]))
  assert bars() == [
    ("[#0]", 30, 30, True),
    ("[#1]", 200, 200, True),
    ("[#2]", 7, 7, True),
  ]


def test_vmap_of_fori_loop_with_batched_bounds():
  f = lambda n: progress.fori_loop(0, n, lambda i, c: c + i, 0, **OPTS)
  np.testing.assert_array_equal(jax.vmap(f)(jnp.array([10, 57])), [45, 1596])
  assert bars() == [("", 57, 57, True)]


def test_nested_vmap_shows_one_bar():
  f = lambda n: _grow(n, total=n)
  jax.vmap(jax.vmap(f))(jnp.array([[3, 40], [17, 5]]))
  assert bars() == [("", 40, 40, True)]


def test_nested_vmap_batch_each_shows_one_bar_per_element():
  f = lambda n: _grow(n, total=n, batch="each")
  jax.vmap(jax.vmap(f))(jnp.array([[3, 40], [17, 5]]))
  assert bars() == [
    ("[#0]", 3, 3, True),
    ("[#1]", 40, 40, True),
    ("[#2]", 17, 17, True),
    ("[#3]", 5, 5, True),
  ]


def test_the_issue_example_shows_one_bar_per_element_at_its_own_count():
  def count(n):
    return progress.while_loop(
      lambda c: c[0] < n,
      lambda c: (c[0] + 1, c[1] + 1.0),
      (0, 0.0),
      batch="each",
      **OPTS,
    )

  out = jax.jit(jax.vmap(count))(jnp.array([10, 20, 30]))
  assert_trees_equal(
    out, (np.array([10, 20, 30]), np.array([10.0, 20.0, 30.0]))
  )
  assert bars() == [
    ("[#0]", 10, 10, True),
    ("[#1]", 20, 20, True),
    ("[#2]", 30, 30, True),
  ]
  # No bar went past its element's count while the loop ran.
  assert [b.peak for b in sorted(Bars.made, key=lambda b: b.desc)] == [
    10,
    20,
    30,
  ]


def test_scan_batched_only_through_a_closure_shows_one_bar_per_element():
  def f(a):
    return progress.scan(
      lambda c, x: (c + a * x, c), 0.0, jnp.arange(50.0), batch="each", **OPTS
    )

  assert_trees_equal(
    jax.jit(jax.vmap(f))(jnp.arange(3.0)),
    jax.vmap(
      lambda a: lax.scan(lambda c, x: (c + a * x, c), 0.0, jnp.arange(50.0))
    )(jnp.arange(3.0)),
  )
  assert bars() == [(f"[#{i}]", 50, 50, True) for i in range(3)]


# Every combination of docs/progress.md's "What each transformation
# shows" for vmap: each loop, batched through its operands (carry, bounds,
# predicate) or only through a closure, with batch="combined" (one bar:
# the longest element) and batch="each" (one bar per element, each at its
# own count, never past it).
_NS = [5, 40, 17]


class _Lax:
  """lax's loops, taking (and dropping) the bars' options."""

  @staticmethod
  def scan(f, init, xs, **kw):
    return lax.scan(f, init, xs)

  @staticmethod
  def fori_loop(lo, hi, f, init, **kw):
    return lax.fori_loop(lo, hi, f, init)

  @staticmethod
  def while_loop(cond, f, init, total=None, **kw):
    return lax.while_loop(cond, f, init)


# name: (loop(n, p, **options) with p progress or _Lax, each element's count)
_LOOPS = {
  "scan, batched carry": (
    lambda n, p, **kw: p.scan(body, n * 1.0, jnp.arange(40.0), **kw),
    [40, 40, 40],
  ),
  "scan, batched through a closure": (
    lambda n, p, **kw: p.scan(
      lambda c, x: (c + n * x, c), 0.0, jnp.arange(40.0), **kw
    ),
    [40, 40, 40],
  ),
  "fori_loop, batched bounds": (
    lambda n, p, **kw: p.fori_loop(0, n, lambda i, c: c + i, 0, **kw),
    _NS,
  ),
  "fori_loop, batched through a closure": (
    lambda n, p, **kw: p.fori_loop(0, 40, lambda i, c: c + n, 0, **kw),
    [40, 40, 40],
  ),
  "while_loop, batched predicate": (
    lambda n, p, **kw: p.while_loop(lambda c: c < n, lambda c: c + 1, 0, **kw),
    _NS,
  ),
  "while_loop, batched predicate, total=": (
    lambda n, p, **kw: p.while_loop(
      lambda c: c < n, lambda c: c + 1, 0, total=n, **kw
    ),
    _NS,
  ),
  "while_loop, batched through a closure in the body": (
    lambda n, p, **kw: p.while_loop(
      lambda c: c[0] < 40, lambda c: (c[0] + 1, c[1] + n), (0, 0), **kw
    ),
    [40, 40, 40],
  ),
}


@pytest.mark.parametrize("name", list(_LOOPS))
def test_vmap_batch_combined_shows_one_bar_at_the_longest_count(name):
  loop, counts = _LOOPS[name]
  jax.jit(jax.vmap(lambda n: loop(n, progress, **OPTS)))(jnp.array(_NS))
  longest = max(counts)
  assert bars() == [("", longest, longest, True)]


@pytest.mark.parametrize("name", list(_LOOPS))
def test_vmap_batch_each_shows_one_bar_per_element_at_its_count(name):
  loop, counts = _LOOPS[name]
  jax.jit(jax.vmap(lambda n: loop(n, progress, batch="each", **OPTS)))(
    jnp.array(_NS)
  )
  assert bars() == [(f"[#{i}]", c, c, True) for i, c in enumerate(counts)]
  assert all(b.peak <= b.total for b in Bars.made)


@pytest.mark.parametrize("name", list(_LOOPS))
@pytest.mark.parametrize("batch", ["combined", "each"])
def test_vmap_values_equal_lax(name, batch):
  loop, _ = _LOOPS[name]
  ns = jnp.array(_NS)
  assert_trees_equal(
    jax.jit(jax.vmap(lambda n: loop(n, progress, batch=batch, **OPTS)))(ns),
    jax.jit(jax.vmap(lambda n: loop(n, _Lax)))(ns),
  )


def test_batch_each_outside_vmap_shows_one_bar():
  progress.scan(body, 1.0, jnp.arange(30.0), batch="each", **OPTS)
  assert bars() == [("[#0]", 30, 30, True)]


def test_a_batch_each_loop_run_twice_shows_a_fresh_bar_per_element_each_run():
  f = jax.jit(
    jax.vmap(
      lambda n: progress.scan(
        lambda c, x: (c + n * x, c), 0.0, jnp.arange(20.0), batch="each", **OPTS
      )
    )
  )
  f(jnp.arange(2.0))
  f(jnp.arange(2.0))
  assert bars() == [("[#0]", 20, 20, True)] * 2 + [("[#1]", 20, 20, True)] * 2


# ---------------------------------------------------------- the end
def test_close_all_closes_open_bars_where_they_stand():
  opts = progress._options(
    None, None, 10, "combined", "combined", "each", Bars, {}
  )
  site = progress._Site(opts, 1, 0)
  site.on_start((np.int32(0), np.int32(10)), (), device=None)
  site.on_update((np.int32(4), np.int32(10)), (), device=None)
  progress.close_all()
  assert (Bars.made[-1].n, Bars.made[-1].closed) == (4, True)
  site.on_update((np.int32(6), np.int32(10)), (), device=None)  # ignored
  assert Bars.made[-1].n == 4


def test_a_run_that_raised_leaves_its_bar_closed_when_the_loop_runs_again():
  def check(step):
    if int(step) == 30:
      raise ValueError("step 30 fails")
    return step

  def f(fail):
    def b(c, _):
      step = hostcb.call(check, c * fail, result_shape=c)
      return c + 1, step

    return progress.scan(b, jnp.int32(1), None, length=50, every=10, **OPTS)

  f = jax.jit(f)
  with pytest.raises(Exception, match="step 30 fails"):
    jax.block_until_ready(f(1))
  with pytest.raises(hostcb.CallbackException, match="step 30 fails"):
    hostcb.barrier_wait()
  assert [b.closed for b in Bars.made] == [False]
  f(0)
  got = bars()
  assert got[1] == ("", 50, 50, True)
  desc, n, total, closed = got[0]
  assert (desc, total, closed) == ("", 50, True) and n < 30


_SCRIPT_HEAD = """
import jax, jax.numpy as jnp
from hostcb import progress
"""


def test_bar_reaches_its_total_when_the_script_ends_right_after_the_loop():
  code = _SCRIPT_HEAD + textwrap.dedent("""
      f = jax.jit(lambda c: progress.scan(
          lambda c, _: (jnp.sin(c), None), c, None, length=20000,
          desc="end"))
      f(jnp.ones(64))
      """)
  r = run_python(code)
  assert r.returncode == 0, r.stderr
  last = r.stderr.replace("\r", "\n").strip().splitlines()[-1]
  assert last.startswith("end: 100%") and "20000/20000" in last, r.stderr


def test_an_uncaught_exception_starts_its_traceback_on_a_line_of_its_own():
  code = _SCRIPT_HEAD + textwrap.dedent("""
      import hostcb
      def check(step):
        if int(step) == 3000:
          raise ValueError("step 3000 fails")
        return step
      def b(c, _):
        return c + 1, hostcb.call(check, c, result_shape=c)
      f = jax.jit(lambda c: progress.scan(b, c, None, length=20000,
                                          desc="boom", every=100))
      jax.block_until_ready(f(jnp.int32(1)))
      """)
  r = run_python(code)
  assert r.returncode == 1
  before, sep, _ = r.stderr.partition("Traceback (most recent call last)")
  assert sep and "boom:" in before, r.stderr
  assert before.endswith("\n"), repr(before[-200:])
  assert "step 3000 fails" in r.stderr


def test_import_without_tqdm_names_the_extra():
  r = run_python(
    "import sys; sys.modules['tqdm'] = None\nimport hostcb.progress"
  )
  assert r.returncode == 1
  assert (
    "ImportError: hostcb.progress needs tqdm, which is not installed: "
    "pip install hostcb[progress]"
  ) in r.stderr, r.stderr


def test_progress_is_an_attribute_of_hostcb():
  assert hostcb.progress is progress


# --------------------------------------------------------------- options
@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(devices="all"), "devices must be 'combined' or 'each'; got 'all'"),
    (dict(batch=1), "batch must be 'combined' or 'each'; got 1"),
    (dict(processes="zero"), "processes must be 'each' or 'first'"),
    (dict(every=0), "every must be a positive int or None; got 0"),
    (dict(updates=0), "updates must be a positive int; got 0"),
    (dict(tqdm_kwargs={"total": 3}), "tqdm_kwargs may not set 'total'"),
  ],
)
def test_bad_options_raise_naming_what_was_expected(kwargs, match):
  with pytest.raises(ValueError, match=match):
    progress.scan(body, 1.0, jnp.arange(3.0), **kwargs)


def test_tqdm_kwargs_reach_the_bar():
  progress.scan(
    body, 1.0, jnp.arange(3.0), tqdm_kwargs={"unit": "step"}, **OPTS
  )
  hostcb.barrier_wait()
  assert Bars.made[0].unit == "step"


def test_processes_first_shows_bars_on_process_zero():
  progress.scan(body, 1.0, jnp.arange(3.0), processes="first", **OPTS)
  assert bars() == [("", 3, 3, True)]


# ---------------------------------------------------- several devices
def _mesh():
  return Mesh(np.array(jax.devices()), ("d",))


def shard_map(f):
  try:
    return _shard_map(f, mesh=_mesh(), in_specs=P("d"), out_specs=P("d"))
  except TypeError:
    return _shard_map(f, _mesh(), in_specs=P("d"), out_specs=P("d"))


def _per_device(n):
  """A scan of n steps per device (over its shard's first value)."""
  return lambda c: progress.scan(body, c, jnp.arange(n, dtype=c.dtype), **OPTS)[
    0
  ]


def _all(desc: str = "") -> str:
  """The description of a bar that combines the N devices."""
  return f"{desc} [{N} devices]".strip() if N > 1 else desc


def _device_names():
  return [f"[cpu:{d.id}]" for d in jax.devices()]


@pytest.mark.multidevice
def test_pmap_shows_one_bar_for_all_devices():
  out = jax.pmap(_per_device(80))(jnp.arange(N * 1.0))
  want = jax.pmap(lambda c: lax.scan(body, c, jnp.arange(80.0))[0])(
    jnp.arange(N * 1.0)
  )
  assert_trees_equal(out, want)
  assert bars() == [(_all(), 80, 80, True)]


@pytest.mark.multidevice
def test_pmap_devices_each_shows_one_bar_per_device():
  jax.pmap(
    lambda c: progress.scan(
      body, c, jnp.arange(80.0), desc="p", devices="each", **OPTS
    )[0]
  )(jnp.arange(N * 1.0))
  assert bars() == sorted((f"p {d}", 80, 80, True) for d in _device_names())


@pytest.mark.multidevice
def test_pmap_combined_bar_of_while_loops_of_different_lengths():
  jax.pmap(lambda n: _grow(n, total=100)[0])(jnp.arange(N) * 10 + 40)
  assert bars() == [(_all(), 40 + 10 * (N - 1), 100, True)]


@pytest.mark.multidevice
def test_shard_map_shows_one_bar_for_all_devices():
  x = jax.device_put(jnp.arange(2.0 * N), NamedSharding(_mesh(), P("d")))
  out = jax.jit(shard_map(_per_device(64)))(x)
  want = jax.jit(shard_map(lambda c: lax.scan(body, c, jnp.arange(64.0))[0]))(x)
  assert_trees_equal(out, want)
  assert bars() == [(_all(), 64, 64, True)]


@pytest.mark.multidevice
def test_shard_map_devices_each_shows_one_bar_per_device():
  x = jax.device_put(jnp.arange(2.0 * N), NamedSharding(_mesh(), P("d")))
  jax.jit(
    shard_map(
      lambda c: progress.scan(
        body, c, jnp.arange(64.0), devices="each", **OPTS
      )[0]
    )
  )(x)
  assert bars() == sorted((d, 64, 64, True) for d in _device_names())


@pytest.mark.multidevice
def test_shard_map_of_vmap_shows_one_bar():
  x = jax.device_put(jnp.arange(2 * N) + 5, NamedSharding(_mesh(), P("d")))
  jax.jit(shard_map(jax.vmap(lambda n: _grow(n, total=n)[0])))(x)
  assert bars() == [(_all(), 2 * N + 4, 2 * N + 4, True)]


@pytest.mark.multidevice
def test_sharded_jit_runs_one_loop_and_shows_one_bar():
  x = jax.device_put(jnp.arange(4.0 * N), NamedSharding(_mesh(), P("d")))
  out = jax.jit(lambda x: progress.scan(body, x, jnp.arange(33.0), **OPTS))(x)
  assert_trees_equal(
    out, jax.jit(lambda x: lax.scan(body, x, jnp.arange(33.0)))(x)
  )
  assert bars() == [("", 33, 33, True)]


@pytest.mark.multidevice
def test_nested_loops_under_pmap_give_nested_bars_per_run():
  def outer(c, x):
    return progress.scan(body, c, jnp.arange(5.0), desc="in", **OPTS)[0], None

  jax.pmap(
    lambda c: progress.scan(outer, c, jnp.arange(4.0), desc="out", **OPTS)[0]
  )(jnp.arange(N * 1.0))
  assert bars() == (
    [(_all("in"), 5, 5, True)] * 4 + [(_all("out"), 4, 4, True)]
  )


def test_expected_device_count_is_one_outside_per_device_code():
  assert progress._tapping_devices() == 1


def _count_to(n, **kw):
  return progress.while_loop(lambda c: c < n, lambda c: c + 1, 0, **OPTS, **kw)


@pytest.mark.multidevice
def test_pmap_of_vmap_batch_each_shows_one_combined_bar_per_element():
  ns = jnp.tile(jnp.array([5, 12]), (N, 1))  # the same elements everywhere
  out = jax.pmap(jax.vmap(lambda n: _count_to(n, batch="each")))(ns)
  np.testing.assert_array_equal(out, ns)
  where = f"{N} devices, " if N > 1 else ""
  assert bars() == [
    (f"[{where}#0]", 5, 5, True),
    (f"[{where}#1]", 12, 12, True),
  ]


@pytest.mark.multidevice
def test_pmap_of_vmap_devices_each_batch_each_shows_a_bar_per_both():
  ns = jnp.tile(jnp.array([5, 12]), (N, 1))
  jax.pmap(jax.vmap(lambda n: _count_to(n, batch="each", devices="each")))(ns)
  assert bars() == sorted(
    (f"{d[:-1]}, #{i}]", c, c, True)
    for d in _device_names()
    for i, c in enumerate([5, 12])
  )
